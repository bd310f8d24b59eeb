/*
 * patd_notify.h — the service manager's notification socket ($NOTIFY_SOCKET, sd_notify(3)'s
 * protocol), spoken so that the loop thread never blocks on it.
 *
 * libsystemd's sd_notify() sends on a blocking datagram socket: when the receiver does not read
 * (a slow or stopped manager, or a test holding the socket) and its queue is full
 * (net.unix.max_dgram_qlen, 10 by default), the sender sleeps, and here the sender is the loop
 * that serves every client. This sender never waits: a periodic message (WATCHDOG=1, STATUS=)
 * that finds the queue full is dropped, the next one takes its place; a state change (READY=1,
 * RELOADING=1, STOPPING=1) is kept and resent on every tick until it goes out.
 *
 * Thread context: the loop thread.
 */
#ifndef PATD_NOTIFY_H
#define PATD_NOTIFY_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

typedef struct patd_notify {
    int fd; /* -1: no service manager to tell */
    struct sockaddr_un addr;
    socklen_t addr_len;
    char pending[256]; /* a state change still to deliver ("" when none) */
    uint64_t dropped;  /* periodic messages dropped on a full queue */
} patd_notify_t;

/* Reads $NOTIFY_SOCKET (a path, or @name for the abstract namespace) and unsets it, so that
 * children do not inherit it. 0, or a negative errno for a malformed variable (logged; notifying
 * is then off). */
int patd_notify_open(patd_notify_t *n);
void patd_notify_close(patd_notify_t *n);
/* A periodic message: sent now or dropped. 0 sent (or nobody to tell), -EAGAIN dropped. */
int patd_notify_ping(patd_notify_t *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A state change: sent now or kept (replacing an older undelivered one) for patd_notify_flush. */
void patd_notify_state(patd_notify_t *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Resends a kept state change (each tick). */
void patd_notify_flush(patd_notify_t *n);

#endif
