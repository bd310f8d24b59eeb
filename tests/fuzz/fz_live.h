/*
 * fz_live.h — the live patd a transport-level fuzz run talks to (fuzz_sockets.c): started from
 * PATD_BIN on the cpu backend in a private runtime directory with a free metrics port (through
 * tests/lib/tl_daemon), with a session opened at once that must outlive the fuzzing; and the
 * checks a fuzz run asks of it between inputs: alive, its descriptors back to what it held at
 * start, still answering, quiet when nobody talks to it. Each check is bounded in time.
 *
 * One daemon runs at a time; fz_live_cleanup() (for atexit) kills it and removes its directory.
 * Thread context: the fuzzer's main thread (children of a batch only read the fields).
 */
#ifndef FZ_LIVE_H
#define FZ_LIVE_H

#include <stddef.h>
#include <stdint.h>

#include "fz_wire.h"
#include "ipc_proto.h"
#include "pat.h"
#include "tl_daemon.h"

#define FZ_MAX_DARGS 16

typedef struct fz_live_opts {
    uint64_t answer_ms;        /* bound on each liveness answer (STATUS, PING, a new session) */
    uint64_t fd_slack;         /* descriptors above the start's count the daemon may hold, idle */
    uint64_t idle_cpu_pct;     /* a window above this share of one core counts as busy */
    char *dargs[FZ_MAX_DARGS]; /* more patd arguments */
    uint64_t n_dargs;
} fz_live_opts_t;

typedef struct fz_live {
    tl_daemon_t d;
    int up;
    int pidfd; /* readable once the daemon exits: children of a batch poll it */
    fz_endpoint_t ep;
    ipc_model_sig_t model;
    pat_conn_t *standing; /* the session opened before the fuzzing: it must outlive it */
    int baseline_fds, max_fds;
    int exit_status; /* waitpid's, once it died */
} fz_live_t;

uint64_t fz_now_ms(void);
void fz_sleep_ms(uint32_t ms);

/* Starts a daemon and opens the standing session. Returns 0, or a negative errno (and says why
 * on stderr) with nothing left running. */
int fz_live_start(fz_live_t *L, const fz_live_opts_t *o);
/* Closes the session, kills the daemon if it runs, removes its directory. NULL-safe on a stopped
 * one. */
void fz_live_stop(fz_live_t *L);
/* 1 when the daemon has exited (reaped; its status in exit_status), 0 while it runs. */
int fz_live_dead(fz_live_t *L);
/* The last lines of the daemon's log to stderr. */
void fz_live_log_tail(const fz_live_t *L, int lines);
/* Empties the daemon's log once it holds more than max_bytes (libmicrohttpd writes a line for
 * most malformed requests: a long run would fill the disk). */
void fz_live_log_trim(const fz_live_t *L, uint64_t max_bytes);
/* Kills the running daemon, if any: for atexit. */
void fz_live_cleanup(void);

/* Descriptors a process holds, or a negative errno. */
int fz_fd_count(pid_t pid);
/* "killed by signal 6 (Aborted)" / "exited with status 1" */
void fz_describe_status(int st, char *out, size_t n);

/* The checks: 0, or a negative errno with the reason in why. */
/* At most baseline + fd_slack descriptors, given settle_ms to drain to it. */
int fz_check_fds(fz_live_t *L, const fz_live_opts_t *o, uint32_t settle_ms, char *why, size_t wl);
/* STATUS, PING of the standing session, a new session opened, pinged and closed: each answered,
 * all within answer_ms. */
int fz_check_serving(fz_live_t *L, const fz_live_opts_t *o, char *why, size_t wl);
/* Quiet within 2 s of windows; returns the last window's share of a core (percent), -EBUSY
 * when it spins, -ESRCH when it is gone. */
int fz_check_idle_cpu(fz_live_t *L, const fz_live_opts_t *o, char *why, size_t wl);

#endif
