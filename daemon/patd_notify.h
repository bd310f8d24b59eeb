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
    char env[112];     /* $NOTIFY_SOCKET as it was (an exec of an upgrade sets it again) */
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

/* Hands n_fds (1..PATD_FDS_MAX) descriptors to the service manager's descriptor store under
 * `name` ("FDSTORE=1", "FDNAME=name", the descriptors by SCM_RIGHTS): systemd keeps them while
 * the unit lives (FileDescriptorStoreMax=) and passes them back at its next start (LISTEN_FDS,
 * patd_listen_fds). Returns 0, -ENOTCONN (no service manager), -EINVAL (a bad name or count),
 * -EAGAIN (its queue is full), -errno. */
#define PATD_FDS_MAX 8
int patd_notify_fds(patd_notify_t *n, const char *name, const int *fds, uint32_t n_fds);

/* A descriptor the service manager passed at start, with its name (LISTEN_FDNAMES; "unknown"
 * where it gave none). */
typedef struct patd_listen_fd {
    int fd;
    char name[64];
} patd_listen_fd_t;
/* The descriptors passed at start as systemd does (LISTEN_PID = this process, LISTEN_FDS of them
 * from descriptor 3 on, LISTEN_FDNAMES colon-separated), up to cap of them into out, each made
 * close-on-exec; unsets the three variables (children never see them). Returns how many (0
 * when none were passed to this process); passed descriptors past cap are closed. */
uint32_t patd_listen_fds(patd_listen_fd_t *out, uint32_t cap);

/* The watchdog's judgement of the executors' heartbeats (each a counter an executor bumps: every
 * idle_ns while idle, on every wait slice and layer while busy), made by a check every tick_ns:
 * an executor is stuck when its counter has not moved for stuck_ns = max(half the watchdog
 * period, three idle beats and two ticks). The floor keeps the beat's and the check's own
 * periods from looking like a stall: between two checks that see a counter move, up to
 * idle_ns + tick_ns pass with nothing wrong, plus either side's lateness. */
#define PATD_WD_MAX 65 /* the executors and the lane thread */
typedef struct patd_watchdog {
    uint64_t stuck_ns;
    uint64_t seen[PATD_WD_MAX], moved_ns[PATD_WD_MAX];
} patd_watchdog_t;

void patd_watchdog_init(patd_watchdog_t *w, uint64_t period_ns, uint64_t idle_ns, uint64_t tick_ns);
/* One check at `now` of n <= PATD_WD_MAX counters: how many executors are stuck (0 while
 * `stopping`: executors that ended are not stalls). */
uint32_t patd_watchdog_check(patd_watchdog_t *w, const uint64_t *beats, uint32_t n, uint64_t now,
                             int stopping);

#endif
