/*
 * patd_exec.h — a pool of executor threads that run jobs off the loop thread, and a list that
 * carries their results back to it. It knows nothing of steps or sessions: a job is a function
 * and an argument; a post is an argument the loop takes back (patd_exec_take_done) after the
 * pool's wake handle fired.
 *
 * A job that must wait for something outside (a client's next layer) parks instead of holding
 * its executor. The pool's watcher thread sleeps in one futex_waitv(2) on every parked job's
 * futex word (the word whose change or wake-up may make it ready) and on a word of its own,
 * checks the jobs' ready functions whenever one moves (and every PATD_EXEC_WATCH_NS at the
 * latest, for deadlines), and submits those that may run again. No CPU is spent on a stalled
 * client; a kernel without futex_waitv gets polling at 1 ms instead.
 *
 * Each executor has a heartbeat that moves while the thread is alive and not stuck: the pool
 * bumps it while idle (every 100 ms), jobs bump it while they wait (patd_exec_beat); the systemd
 * watchdog reads it (patd_exec_beats).
 */
#ifndef PATD_EXEC_H
#define PATD_EXEC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#define PATD_EXEC_MAX 64u /* executors at most (daemon.executors' bound; PATD_WD_MAX too) */

#define PATD_EXEC_IDLE_NS  100000000ull /* an idle executor's heartbeat period */
#define PATD_EXEC_WATCH_NS 20000000ull  /* the watcher's longest sleep: deadlines' resolution */

typedef void patd_job_fn(void *arg, uint32_t exec_id);
/* Whether a parked job may run again: reads shared state only (atomics), never blocks. */
typedef int patd_ready_fn(void *arg);

typedef struct patd_job {
    patd_job_fn *fn;
    void *arg;
    patd_ready_fn *ready;   /* parked jobs: may it run again? */
    _Atomic uint32_t *word; /* parked jobs: a shared futex word that moves when it may */
} patd_job_t;

typedef struct patd_exec {
    pthread_mutex_t q_mu, done_mu; /* never nested; park_mu -> q_mu */
    pthread_cond_t q_cv;
    patd_job_t *q; /* FIFO: [q_head, q_head + q_len) */
    uint32_t q_head, q_len, q_cap;
    void **done; /* posts, oldest first */
    uint32_t n_done, cap_done;
    pthread_t *threads;
    uint32_t n;           /* executors running */
    _Atomic int stopping; /* written under q_mu; read without it by the watchdog */
    uv_async_t *wake;     /* fired after every post (any thread) */
    pthread_mutex_t park_mu;
    pthread_cond_t park_cv;
    patd_job_t *parked;
    uint32_t n_parked, cap_parked;
    pthread_t watcher;
    int watcher_on, watch_stopping; /* under park_mu */
    _Atomic uint32_t park_seq;      /* the watcher's own futex word: bumped on park and stop */
    _Atomic uint64_t beat[PATD_EXEC_MAX];
} patd_exec_t;

/* Starts n executors (n <= PATD_EXEC_MAX). 0 or a negative errno; on failure the executors
 * started so far run until patd_exec_stop. Main thread. */
int patd_exec_start(patd_exec_t *x, uint32_t n, uv_async_t *wake);
/* Lets the queued jobs finish, then joins the executors. Main thread. */
void patd_exec_stop(patd_exec_t *x);
/* Queues a job for the first free executor (any thread; never blocks on a job). */
void patd_exec_submit(patd_exec_t *x, patd_job_fn *fn, void *arg);
/* Parks a job until ready(arg) returns nonzero, then queues it like patd_exec_submit. word: a
 * 32-bit futex word (in memory shared with other processes or not) that is changed or woken
 * (FUTEX_WAKE, not private) when the job may have become ready. Any thread; the caller must not
 * touch arg's job state afterwards (it may already run again). */
void patd_exec_park(patd_exec_t *x, patd_job_fn *fn, void *arg, patd_ready_fn *ready,
                    _Atomic uint32_t *word);
/* Posts arg back to the loop. When word is not NULL, *word = value is stored under the same
 * lock that appends the post: a loop that sees the value also finds the post in the list (so a
 * patd_exec_forget then purges every post naming arg). Any thread. */
void patd_exec_post(patd_exec_t *x, void *arg, _Atomic int *word, int value);
/* The oldest post, or NULL. Loop thread. */
void *patd_exec_take_done(patd_exec_t *x);
/* Drops every post naming arg (loop thread, before arg is freed). */
void patd_exec_forget(patd_exec_t *x, void *arg);

static inline void patd_exec_beat(patd_exec_t *x, uint32_t exec_id)
{
    atomic_fetch_add_explicit(&x->beat[exec_id], 1, memory_order_relaxed);
}

#endif
