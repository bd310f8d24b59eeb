/*
 * patd_exec.c — the executor pool (patd_exec.h): threads that take jobs from one FIFO, and the
 * list of posts back to the loop thread, woken through a uv_async.
 *
 * Tuned for a handful of executors (daemon.executors, default 2) and jobs that last a step (tens
 * of microseconds to seconds): one mutex per list is plenty; an idle executor wakes every 100 ms
 * only to move its heartbeat. Parked jobs cost nothing while they wait: the watcher sleeps in
 * the kernel on their words.
 */
#include "patd_exec.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "pat_base.h"

typedef struct exec_arg {
    patd_exec_t *x;
    uint32_t id;
} exec_arg_t;

void patd_exec_submit(patd_exec_t *x, patd_job_fn *fn, void *arg)
{
    pthread_mutex_lock(&x->q_mu);
    pat_grow((void **)&x->q, &x->q_cap, x->q_len + 1, sizeof(*x->q));
    /* the ring is kept compact: head always 0 after a grow */
    if (x->q_head + x->q_len >= x->q_cap) {
        memmove(x->q, x->q + x->q_head, x->q_len * sizeof(*x->q));
        x->q_head = 0;
    }
    x->q[x->q_head + x->q_len++] = (patd_job_t){fn, arg, NULL, NULL};
    pthread_cond_signal(&x->q_cv);
    pthread_mutex_unlock(&x->q_mu);
}

static void wake_watcher(patd_exec_t *x)
{
    atomic_fetch_add(&x->park_seq, 1);
    syscall(SYS_futex, (uint32_t *)&x->park_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void patd_exec_park(patd_exec_t *x, patd_job_fn *fn, void *arg, patd_ready_fn *ready,
                    _Atomic uint32_t *word)
{
    pthread_mutex_lock(&x->park_mu);
    pat_grow((void **)&x->parked, &x->cap_parked, x->n_parked + 1, sizeof(*x->parked));
    x->parked[x->n_parked++] = (patd_job_t){fn, arg, ready, word};
    pthread_cond_signal(&x->park_cv);
    pthread_mutex_unlock(&x->park_mu);
    wake_watcher(x);
}

/* Sleeps until a word differs from the value given or is woken, or for timeout_ns.
 * -ENOSYS when the kernel has no futex_waitv. */
static int wait_words(struct futex_waitv *w, uint32_t n, uint64_t timeout_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    if (syscall(SYS_futex_waitv, w, n, 0, &ts, CLOCK_MONOTONIC) < 0 && errno == ENOSYS)
        return -ENOSYS;
    return 0;
}

/* Checks the parked jobs and submits those that may run; between checks sleeps on their words
 * (futex_waitv), or on the condition variable while none is parked. At stop, submits whatever is
 * still parked (the executors run the queue dry before they exit). */
static void *watcher_main(void *p)
{
    patd_exec_t *x = p;
    struct futex_waitv w[FUTEX_WAITV_MAX];
    int have_waitv = 1;
    pthread_setname_np(pthread_self(), "patd-exec-watch"); /* patd_cpu_seconds_total's executor */
    pthread_mutex_lock(&x->park_mu);
    for (;;) {
        while (!x->n_parked && !x->watch_stopping)
            pthread_cond_wait(&x->park_cv, &x->park_mu);
        /* the watcher's word first: a park after this read is seen as a changed value */
        uint32_t n = 0;
        w[n++] = (struct futex_waitv){.val = atomic_load(&x->park_seq),
                                      .uaddr = (uintptr_t)&x->park_seq,
                                      .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG};
        uint32_t k = 0;
        for (uint32_t i = 0; i < x->n_parked; i++) {
            patd_job_t j = x->parked[i];
            /* the word's value before the check: a change after it ends the sleep below */
            uint32_t v = j.word ? atomic_load(j.word) : 0;
            if (x->watch_stopping || j.ready(j.arg)) {
                patd_exec_submit(x, j.fn, j.arg);
                continue;
            }
            x->parked[k++] = j;
            if (j.word && n < FUTEX_WAITV_MAX)
                w[n++] =
                    (struct futex_waitv){.val = v, .uaddr = (uintptr_t)j.word, .flags = FUTEX_32};
        }
        int polled = k + 1 > n; /* some job is not on a word: poll */
        x->n_parked = k;
        if (x->watch_stopping && !k)
            break;
        pthread_mutex_unlock(&x->park_mu);
        uint64_t sleep_ns = polled || !have_waitv ? 1000000ull : PATD_EXEC_WATCH_NS;
        if (!have_waitv || wait_words(w, n, sleep_ns) == -ENOSYS) {
            have_waitv = 0;
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&x->park_mu);
    }
    pthread_mutex_unlock(&x->park_mu);
    return NULL;
}

void patd_exec_post(patd_exec_t *x, void *arg, _Atomic int *word, int value)
{
    pthread_mutex_lock(&x->done_mu);
    if (word)
        atomic_store(word, value);
    pat_grow((void **)&x->done, &x->cap_done, x->n_done + 1, sizeof(*x->done));
    x->done[x->n_done++] = arg;
    pthread_mutex_unlock(&x->done_mu);
    uv_async_send(x->wake);
}

void patd_exec_forget(patd_exec_t *x, void *arg)
{
    pthread_mutex_lock(&x->done_mu);
    uint32_t k = 0;
    for (uint32_t i = 0; i < x->n_done; i++)
        if (x->done[i] != arg)
            x->done[k++] = x->done[i];
    x->n_done = k;
    pthread_mutex_unlock(&x->done_mu);
}

void *patd_exec_take_done(patd_exec_t *x)
{
    void *arg = NULL;
    pthread_mutex_lock(&x->done_mu);
    if (x->n_done) {
        arg = x->done[0];
        memmove(x->done, x->done + 1, (x->n_done - 1) * sizeof(*x->done));
        x->n_done--;
    }
    pthread_mutex_unlock(&x->done_mu);
    return arg;
}

static void *exec_main(void *p)
{
    exec_arg_t *a = p;
    patd_exec_t *x = a->x;
    uint32_t id = a->id;
    free(a);
    char name[16];
    snprintf(name, sizeof(name), "patd-exec-%u", id % 1000u);
    pthread_setname_np(pthread_self(), name); /* patd_cpu_seconds_total's executor */
    for (;;) {
        pthread_mutex_lock(&x->q_mu);
        while (!x->q_len && !x->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)PATD_EXEC_IDLE_NS;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&x->q_cv, &x->q_mu, &ts);
            patd_exec_beat(x, id);
        }
        if (x->stopping && !x->q_len) {
            pthread_mutex_unlock(&x->q_mu);
            return NULL;
        }
        patd_job_t job = x->q[x->q_head++];
        x->q_len--;
        if (!x->q_len)
            x->q_head = 0;
        pthread_mutex_unlock(&x->q_mu);
        job.fn(job.arg, id);
        patd_exec_beat(x, id);
    }
}

int patd_exec_start(patd_exec_t *x, uint32_t n, uv_async_t *wake)
{
    pthread_mutex_init(&x->q_mu, NULL);
    pthread_mutex_init(&x->done_mu, NULL);
    pthread_cond_init(&x->q_cv, NULL);
    pthread_mutex_init(&x->park_mu, NULL);
    pthread_cond_init(&x->park_cv, NULL);
    x->wake = wake;
    x->n = 0;
    int wrc = pthread_create(&x->watcher, NULL, watcher_main, x);
    if (wrc)
        return -wrc;
    x->watcher_on = 1;
    x->threads = pat_xcalloc(PAT_MIN(n, PATD_EXEC_MAX), sizeof(pthread_t));
    for (uint32_t i = 0; i < PAT_MIN(n, PATD_EXEC_MAX); i++) {
        exec_arg_t *a = pat_xmalloc(sizeof(*a));
        a->x = x;
        a->id = i;
        int rc = pthread_create(&x->threads[i], NULL, exec_main, a);
        if (rc) {
            free(a);
            return -rc;
        }
        x->n = i + 1;
    }
    return 0;
}

void patd_exec_stop(patd_exec_t *x)
{
    if (!x->threads && !x->watcher_on)
        return;
    if (x->watcher_on) { /* first: it hands every parked job to the executors */
        pthread_mutex_lock(&x->park_mu);
        x->watch_stopping = 1;
        pthread_cond_broadcast(&x->park_cv);
        pthread_mutex_unlock(&x->park_mu);
        wake_watcher(x);
        pthread_join(x->watcher, NULL);
        x->watcher_on = 0;
    }
    pthread_mutex_lock(&x->q_mu);
    x->stopping = 1;
    pthread_cond_broadcast(&x->q_cv);
    pthread_mutex_unlock(&x->q_mu);
    for (uint32_t i = 0; i < x->n; i++)
        pthread_join(x->threads[i], NULL);
    free(x->threads);
    x->threads = NULL;
    x->n = 0;
    free(x->q);
    free(x->done);
    free(x->parked);
    x->q = NULL;
    x->done = NULL;
    x->parked = NULL;
    x->n_parked = x->cap_parked = 0;
    x->q_len = x->q_cap = x->n_done = x->cap_done = 0;
}
