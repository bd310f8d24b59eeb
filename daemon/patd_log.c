/*
 * patd_log.c — stderr logging with syslog priority prefixes (patd_log.h).
 */
#include "patd_log.h"

#include <stdarg.h>
#include <stdio.h>

#include "pat_base.h"

_Atomic int patd_log_level = PATD_LOG_INFO;

void patd_log(int prio, const char *fmt, ...)
{
    if (prio > atomic_load_explicit(&patd_log_level, memory_order_relaxed))
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "<%d>%s\n", prio, line);
}

void patd_log_limited(patd_log_limit_t *lim, int prio, const char *fmt, ...)
{
    const uint64_t now = pat_now_ns();
    if (lim->last_ns && now - lim->last_ns < PATD_LOG_LIMIT_NS) {
        lim->suppressed++;
        return;
    }
    char line[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (lim->suppressed)
        patd_log(prio, "%s; %u more since the last such line", line, lim->suppressed);
    else
        patd_log(prio, "%s", line);
    lim->last_ns = now;
    lim->suppressed = 0;
}
