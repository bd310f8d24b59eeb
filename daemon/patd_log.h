/*
 * patd_log.h — one line per event on stderr, with a syslog priority prefix ("<6>") that
 * journald turns into the record's priority. Thread-safe (one fprintf per line).
 */
#ifndef PATD_LOG_H
#define PATD_LOG_H

#include <stdatomic.h>

#define PATD_LOG_ERR     3
#define PATD_LOG_WARNING 4
#define PATD_LOG_NOTICE  5
#define PATD_LOG_INFO    6
#define PATD_LOG_DEBUG   7

extern _Atomic int patd_log_level;

void patd_log(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define patd_err(...)    patd_log(PATD_LOG_ERR, __VA_ARGS__)
#define patd_warn(...)   patd_log(PATD_LOG_WARNING, __VA_ARGS__)
#define patd_notice(...) patd_log(PATD_LOG_NOTICE, __VA_ARGS__)
#define patd_info(...)   patd_log(PATD_LOG_INFO, __VA_ARGS__)
#define patd_debug(...)  patd_log(PATD_LOG_DEBUG, __VA_ARGS__)

#endif
