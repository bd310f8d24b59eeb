/*
 * patd_log.h — one line per event on stderr, with a syslog priority prefix ("<6>") that
 * journald turns into the record's priority. Thread-safe (one fprintf per line).
 */
#ifndef PATD_LOG_H
#define PATD_LOG_H

#include <stdatomic.h>
#include <stdint.h>

#define PATD_LOG_ERR     3
#define PATD_LOG_WARNING 4
#define PATD_LOG_NOTICE  5
#define PATD_LOG_INFO    6
#define PATD_LOG_DEBUG   7

extern _Atomic int patd_log_level;

void patd_log(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One kind of event logged at most once per PATD_LOG_LIMIT_NS: a flood of refusals is a line a
 * second and a count, not a line each (the flood's sender cannot bury other lines). Zeroed
 * storage is ready; one per kind, used from one thread. */
#define PATD_LOG_LIMIT_NS 1000000000ull
typedef struct patd_log_limit {
    uint64_t last_ns;    /* CLOCK_MONOTONIC (pat_now_ns) of the last line logged; 0: none yet */
    uint32_t suppressed; /* events since that line that were not logged */
} patd_log_limit_t;

/* Logs the line, with "; N more since the last such line" when N were held back, unless the
 * last one of its kind went out less than PATD_LOG_LIMIT_NS ago: then only counts it. */
void patd_log_limited(patd_log_limit_t *lim, int prio, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define patd_err(...)    patd_log(PATD_LOG_ERR, __VA_ARGS__)
#define patd_warn(...)   patd_log(PATD_LOG_WARNING, __VA_ARGS__)
#define patd_notice(...) patd_log(PATD_LOG_NOTICE, __VA_ARGS__)
#define patd_info(...)   patd_log(PATD_LOG_INFO, __VA_ARGS__)
#define patd_debug(...)  patd_log(PATD_LOG_DEBUG, __VA_ARGS__)

#endif
