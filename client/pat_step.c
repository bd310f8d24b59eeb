/*
 * pat_step.c — libpat's steps: begin, the per-layer hand-off, end.
 *
 * pat_step_begin() sends and returns; the answer is collected before anything else is sent
 * (usually by the first pat_attend, while the frontend has computed its first layer meanwhile).
 * A cpu session hands each layer over through the futex signal words of its staging buffer's
 * signal page: a short spin, then futex slices of 20 ms between which the daemon's life is
 * checked. A GPU session's hand-off is enqueued on the caller's CUDA stream (pat_gpu.c); nothing
 * in its step waits on the CPU until pat_step_end.
 */
#include "pat_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pat_base.h"

#define SPIN_ITERS 4000 /* ~20-40 us of polling before sleeping on the futex */

/* The answer to an outstanding STEP_BEGIN, if any. */
int pat__collect_pending(pat_conn_t *c)
{
    if (c->step_state != ST_SENT)
        return 0;
    void *msg;
    size_t n;
    int rc = pat__recv_reply(c, c->sock, c->pend_corr, c->timeout_ms, &msg, &n);
    if (rc == 0) {
        const void *rb;
        size_t rl;
        rc = pat__parse_reply(c, msg, n, &rb, &rl);
        if (rc == 0 && rl != sizeof(c->begin_rep))
            rc = -EBADMSG;
        if (rc == 0)
            memcpy(&c->begin_rep, rb, sizeof(c->begin_rep));
        free(msg);
    } else if (rc == -ETIMEDOUT) {
        pat__set_err(c, "no answer to STEP_BEGIN within %u ms", c->timeout_ms);
        /* a host step the daemon has queued behind busy executors: it begins later, and its
         * answer is still owed. The step stays pending, so that pat_step_end() collects the
         * answer and ends the step the daemon holds (else the session's next STEP_BEGIN met
         * EBUSY until the daemon's step timeout) */
        if (!c->gpu)
            return rc;
    }
    if (rc < 0) {
        c->step_state = ST_FAILED;
        c->step_err = rc;
        return rc;
    }
    c->step_state = ST_BEGUN;
    c->step_id = c->begin_rep.step;
    c->tick_base = c->begin_rep.tick_base;
    c->next_layer = 0;
    return 0;
}

int pat_step_begin(pat_conn_t *c, const uint32_t *seqs, const uint32_t *n_new, uint32_t n_seqs,
                   const uint32_t *tokens)
{
    if (!c || !seqs || !n_new || !tokens || n_seqs == 0)
        return -EINVAL;
    if (pat__daemon_gone(c))
        return c->lost_rc;
    if (c->gone)
        return -ENOTCONN;
    if (c->step_state != ST_IDLE) {
        pat__set_err(c, "a step is open; end it first");
        return -EBUSY;
    }
    if (n_seqs > c->hello.max_seqs) {
        pat__set_err(c, "%u sequences > max_seqs %u", n_seqs, c->hello.max_seqs);
        return -E2BIG;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        if (n_new[i] == 0) {
            pat__set_err(c, "sequence #%u has 0 new tokens", i);
            return -EINVAL;
        }
        total += n_new[i];
    }
    if (total > c->hello.max_batch_tokens) {
        pat__set_err(c, "%llu new tokens > max_batch_tokens %u", (unsigned long long)total,
                     c->hello.max_batch_tokens);
        return -E2BIG;
    }
    ipc_step_begin_req_t r = {.n_seqs = n_seqs, .n_tokens = (uint32_t)total};
    ipc_frame_start(&c->tx, IPC_OP_STEP_BEGIN, 0, ++c->corr, c->session);
    ipc_frame_set_key(&c->tx, c->hello.key);
    ipc_frame_put(&c->tx, &r, sizeof(r));
    for (uint32_t i = 0; i < n_seqs; i++) {
        ipc_step_seq_t s = {seqs[i], n_new[i]};
        ipc_frame_put(&c->tx, &s, sizeof(s));
    }
    ipc_frame_put(&c->tx, tokens, total * 4);
    ipc_frame_finish(&c->tx);
    int rc = pat__send_frame(c, c->sock, &c->tx, c->timeout_ms);
    if (rc < 0)
        return pat__daemon_gone(c) ? c->lost_rc : rc;
    c->pend_corr = c->corr;
    c->step_state = ST_SENT;
    c->n_tokens = (uint32_t)total;
    if (c->gpu) { /* the hand-offs do not wait for the answer: it is collected at the end */
        c->next_layer = 0;
        c->last_stream = NULL;
        c->epoch = atomic_load(&conn_sig(c)->epoch);
    }
    return 0;
}

int pat_attend_async(pat_conn_t *c, uint32_t layer, void *stream)
{
    if (!c)
        return -EINVAL;
    if (!c->gpu) {
        pat__set_err(c, "a host-memory (cpu backend) session: use pat_attend");
        return -ENOTSUP;
    }
    if (pat__daemon_gone(c))
        return c->lost_rc;
    if (layer >= c->model.n_layers) {
        pat__set_err(c, "layer %u of %u", layer, c->model.n_layers);
        return -EINVAL;
    }
    int cap = pat__gpu_capturing(c->gpu, stream);
    if (cap < 0) {
        pat__set_err(c, "%s", pat__gpu_error(c->gpu));
        return cap;
    }
    uint64_t e = c->epoch;
    if (cap) {
        /* recorded into a graph, not run: no step needed; a replay hands over with these
         * values for as long as the epoch lasts (pat_gpu_epoch) */
        e = atomic_load(&conn_sig(c)->epoch);
    } else {
        if (c->step_state == ST_IDLE) {
            pat__set_err(c, "no step open");
            return -ESRCH;
        }
        if (layer != c->next_layer) {
            pat__set_err(c, "layer %u out of order (next is %u of %u)", layer, c->next_layer,
                         c->model.n_layers);
            return -EINVAL;
        }
    }
    int rc = pat__gpu_handoff(c->gpu, stream, &c->gready[layer], &c->gdone[layer], e,
                              layer + 1 == c->model.n_layers);
    if (rc < 0) {
        /* the wait may be enqueued already: release it so that our stream never hangs */
        __atomic_store_n(&c->gdone[layer], e, __ATOMIC_RELEASE);
        pat__set_err(c, "%s", pat__gpu_error(c->gpu));
        return rc;
    }
    if (!cap) {
        c->next_layer++;
        c->last_stream = stream;
    }
    return 0;
}

int pat_step_replayed(pat_conn_t *c, void *stream)
{
    if (!c || !c->gpu)
        return -EINVAL;
    if (c->step_state == ST_IDLE) {
        pat__set_err(c, "no step open");
        return -ESRCH;
    }
    if (c->next_layer != 0) {
        pat__set_err(c, "layers were already handed over in this step");
        return -EINVAL;
    }
    c->next_layer = c->model.n_layers;
    c->last_stream = stream;
    return 0;
}

uint64_t pat_gpu_epoch(const pat_conn_t *c)
{
    return c && c->gpu ? atomic_load(&conn_sig((pat_conn_t *)c)->epoch) : 0;
}

int pat_attend(pat_conn_t *c, uint32_t layer)
{
    if (!c)
        return -EINVAL;
    if (c->gpu) { /* on the legacy default stream, and wait for it */
        int rc = pat_attend_async(c, layer, NULL);
        if (rc == 0 && (rc = pat__gpu_sync(c->gpu, NULL)) < 0)
            pat__set_err(c, "%s", pat__gpu_error(c->gpu));
        if (rc == 0 && pat__daemon_gone(c))
            rc = c->lost_rc;
        return rc;
    }
    if (pat__daemon_gone(c))
        return c->lost_rc;
    int rc = pat__collect_pending(c);
    if (rc < 0)
        return rc;
    if (c->step_state == ST_FAILED)
        return c->step_err;
    if (c->step_state != ST_BEGUN) {
        pat__set_err(c, "no step open");
        return -ESRCH;
    }
    if (layer != c->next_layer || layer >= c->model.n_layers) {
        pat__set_err(c, "layer %u out of order (next is %u of %u)", layer, c->next_layer,
                     c->model.n_layers);
        return -EINVAL;
    }
    ipc_sig_t *g = ipc_shm_sig(&c->shm);
    uint32_t tick = c->tick_base + layer + 1;
    ipc_sig_post(&g->ready, tick); /* release: our Q/K/V stores happen-before */
    uint64_t deadline = pat_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    for (uint32_t spin = 0;; spin++) {
        uint32_t d = atomic_load_explicit(&g->done, memory_order_acquire);
        if ((int32_t)(d - tick) >= 0) {
            c->next_layer++;
            return 0;
        }
        uint32_t st = atomic_load_explicit(&g->state, memory_order_acquire);
        if (st != IPC_STATE_OPEN) {
            int e = atomic_load(&g->err);
            pat__set_err(c, "daemon %s the step at layer %u: %s",
                         st == IPC_STATE_CLOSED ? "closed the session during" : "aborted", layer,
                         pat_strerror(e ? e : -ECANCELED));
            return e ? e : -ECANCELED;
        }
        if (spin < SPIN_ITERS) {
            __builtin_ia32_pause();
            continue;
        }
        if (pat__daemon_gone(c))
            return c->lost_rc;
        if (pat_now_ns() > deadline) {
            pat__set_err(c, "layer %u: no answer within %u ms", layer, c->timeout_ms);
            return -ETIMEDOUT;
        }
        ipc_sig_wait(&g->done, d, 20000000ull);
    }
}

int pat_step_end(pat_conn_t *c, int abort, pat_step_info_t *ret)
{
    if (!c)
        return -EINVAL;
    if (pat__daemon_gone(c))
        return c->lost_rc;
    if (c->gpu && c->step_state != ST_IDLE) {
        /* every layer must be handed over for the daemon's stream to go through: the rest go on
         * the stream of the last one (their O is not used) */
        for (uint32_t l = c->next_layer; l < c->model.n_layers; l++) {
            int hr = pat__gpu_handoff(c->gpu, c->last_stream, &c->gready[l], &c->gdone[l], c->epoch,
                                      l + 1 == c->model.n_layers);
            if (hr < 0) {
                pat__set_err(c, "%s", pat__gpu_error(c->gpu));
                return hr;
            }
            c->next_layer = l + 1;
        }
    }
    int rc = pat__collect_pending(c);
    int begin_err = 0;
    if (c->step_state == ST_FAILED) {
        if (!c->gpu || rc == -ECONNRESET || c->transport) {
            c->step_state = ST_IDLE; /* the daemon never started it: nothing to end */
            return c->step_err;
        }
        begin_err = c->step_err; /* a GPU session's refused step still ends with STEP_END */
        rc = 0;
    }
    if (rc < 0)
        return rc;
    if (c->step_state != ST_BEGUN && !begin_err) {
        pat__set_err(c, "no step open");
        return -ESRCH;
    }
    char begin_why[sizeof(c->err)];
    memcpy(begin_why, c->err, sizeof(begin_why));
    /* step 0: the step in flight (a refused step's id never reached us) */
    ipc_step_end_req_t r = {.step = begin_err ? 0 : c->step_id,
                            .flags = abort ? IPC_STEP_END_ABORT : 0};
    ipc_step_end_rep_t rep;
    rc = pat__call(c, IPC_OP_STEP_END, &r, sizeof(r), NULL, 0, &rep, sizeof(rep));
    if (rc < 0 && c->transport)
        return rc; /* no answer: the step stays open; the caller may retry or reconnect */
    c->step_state = ST_IDLE;
    if (begin_err) {
        memcpy(c->err, begin_why, sizeof(begin_why));
        return begin_err;
    }
    if (rc < 0)
        return rc;
    if (rep.committed) {
        c->stats.steps++;
        c->stats.tokens += c->n_tokens;
        c->stats.kv_bytes += c->begin_rep.kv_bytes * c->model.n_layers;
        c->stats.qc_bytes += c->begin_rep.qc_bytes * c->model.n_layers;
    }
    if (ret) {
        memset(ret, 0, sizeof(*ret));
        ret->step = c->step_id;
        ret->n_tokens = c->begin_rep.n_tokens;
        ret->pack_reused = c->begin_rep.pack_reused;
        ret->pack_policy = c->begin_rep.pack_policy;
        ret->kv_bytes = c->begin_rep.kv_bytes;
        ret->qc_bytes = c->begin_rep.qc_bytes;
        ret->layers_done = rep.layers_done;
        ret->committed = rep.committed;
        ret->step_ns = rep.step_ns;
    }
    return 0;
}
