/*
 * patd_log.c — stderr logging with syslog priority prefixes (patd_log.h).
 */
#include "patd_log.h"

#include <stdarg.h>
#include <stdio.h>

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
