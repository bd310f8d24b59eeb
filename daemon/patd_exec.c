/*
 * patd_exec.c — the executor pool (patd_exec.h): threads that take jobs from one FIFO, and the
 * list of posts back to the loop thread, woken through a uv_async.
 *
 * Tuned for a handful of executors (daemon.executors, default 2) and jobs that last a step (tens
 * of microseconds to seconds): one mutex per list is plenty; an idle executor wakes every 100 ms
 * only to move its heartbeat.
 */
#include "patd_exec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

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
    x->q[x->q_head + x->q_len++] = (patd_job_t){fn, arg};
    pthread_cond_signal(&x->q_cv);
    pthread_mutex_unlock(&x->q_mu);
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
    prctl(PR_SET_TIMERSLACK, 1000UL); /* GPU sessions poll progress with 10 us naps */
    for (;;) {
        pthread_mutex_lock(&x->q_mu);
        while (!x->q_len && !x->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000;
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
    x->wake = wake;
    x->n = 0;
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
    if (!x->threads)
        return;
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
    x->q = NULL;
    x->done = NULL;
    x->q_len = x->q_cap = x->n_done = x->cap_done = 0;
}
