/*
 * patd_step.c — a session's step from STEP_BEGIN to the STEP_END reply: the loop's side
 * (accept or refuse, answer BEGIN when the executor has reserved and packed, settle the
 * reservations and answer END) and the executor's side (reserve, pack, run or enqueue the
 * layers), over the one state enum of patd_step.h.
 *
 * One step on an executor:
 *   1. under pool_mu: reserve slots for every sequence (all or nothing: -ENOSPC, -EDQUOT and
 *      -E2BIG roll back what was reserved), note each new token's pool slot, and bring the
 *      session's forest up to date (sequences not in this step leave, the others grow or join);
 *   2. build the plan (pack reused when the forest's structure did not change);
 *   3. move to RUNNING and post (the loop replies to STEP_BEGIN), then per layer: wait for the
 *      client's ready word, append K/V and attend under be_mu, write O, post the done word.
 * An executor waits at most PARK_AFTER_NS for a client's layer; then the step is parked with the
 * pool's watcher, which submits it again once the layer is handed over, the loop asks it to stop
 * (client died, STEP_END early, drain) or limits.step_timeout_ms passed without a hand-over, so
 * a stalled client holds no executor and costs the others nothing.
 *
 * GPU sessions (cuda backend) run the same phases 1 and 2 on the executor (a small step whose
 * sequences only grow: on the loop, step_gpu_inline), which then hands the step to the
 * lane thread (patd_lanes.c) and is free: the step holds a lane, not a thread, while
 * its layers run. The lane thread begins it once a lane is free (the loop answers STEP_BEGIN
 * then), enqueues its layers, watches the lane's progress and the client's hand-overs from host
 * memory, and gives it back. A step that failed to start still runs its n_layers handshakes
 * without compute (EMPTY), so the client's stream (or its captured graph) goes through and the
 * words stay paired. A client that dies, or makes no progress for limits.step_timeout_ms, has
 * its waits released from the CPU (patd_lanes.c's cut).
 *
 * Threads: patd_step_begin/end/complete/cancel on the loop thread; step_job on an executor. The
 * executor (a GPU step: then the lane thread) owns the step from QUEUED/REFUSED until its final
 * move (to BACK or UNSTARTED, stored under the post list's lock); meanwhile the loop only sets
 * `abort` and wakes the ready word (or the lane thread). A step the loop prepares itself
 * (step_gpu_inline) is the loop's while QUEUED and the lane thread's from its submit on.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

/* A cpu step's executor waits this long for its client's next layer before parking the step
 * (a frontend that keeps up hands over within microseconds; one that stalls costs others at
 * most this, once, per parking) */
#define PARK_AFTER_NS 200000ull

/* ------------------------------------------------------------------ states */
#define B(s) (1u << STEP_##s)
static const uint16_t legal_to[STEP_N_STATES] = {
    [STEP_IDLE] = B(QUEUED) | B(REFUSED),
    [STEP_QUEUED] = B(PREPARING),
    [STEP_REFUSED] = B(EMPTY),
    [STEP_PREPARING] = B(RUNNING) | B(EMPTY) | B(UNSTARTED),
    [STEP_RUNNING] = B(BACK),
    [STEP_EMPTY] = B(UNSTARTED),
    [STEP_BACK] = B(IDLE),
    [STEP_UNSTARTED] = B(IDLE),
};
#undef B

static const char *const state_names[STEP_N_STATES] = {
#define PATD_STEP_NAME(s) #s,
    PATD_STEP_STATES(PATD_STEP_NAME)
#undef PATD_STEP_NAME
};

int patd_step_state_legal(patd_step_state_t from, patd_step_state_t to)
{
    if ((unsigned)from >= STEP_N_STATES || (unsigned)to >= STEP_N_STATES)
        return 0;
    return (legal_to[from] >> to) & 1u;
}

const char *patd_step_state_name(int state)
{
    return (unsigned)state < STEP_N_STATES ? state_names[state] : "?";
}

/* The one place a step changes state. An illegal move is a daemon bug: it aborts in debug and
 * sanitizer builds and is logged (and still made) in release builds. */
static void step_check(const patd_step_t *st, patd_step_state_t to)
{
    int from = atomic_load(&st->state);
    if (!patd_step_state_legal((patd_step_state_t)from, to)) {
        patd_err("step %llu: illegal move %s -> %s", (unsigned long long)st->id,
                 patd_step_state_name(from), patd_step_state_name((int)to));
        assert(!"illegal step state move");
    }
}

void patd_step_move(patd_step_t *st, patd_step_state_t to)
{
    step_check(st, to);
    atomic_store(&st->state, (int)to);
}

void patd_step_started(patd_t *d, const patd_step_t *st, uint64_t now)
{
    atomic_fetch_add(&d->m.start_ns_sum, now - st->t_recv_ns);
    atomic_fetch_add(&d->m.starts, 1);
    if (!st->t_exec_ns)
        return; /* a cpu step: no stages */
    /* a GPU step's stages, in their order: each a difference of two of its clocks. A clock read
     * before the one ahead of it (the lane thread's pass begins at a time read before it takes
     * the steps handed to it meanwhile) counts as that one, so that no stage is negative and the
     * stages add up to the start. */
    uint64_t at[PATD_STAGES + 1] = {st->t_recv_ns,  st->t_exec_ns,     st->t_lane_ns,
                                    st->t_begun_ns, st->t_uploaded_ns, now};
    for (int k = 0; k < PATD_STAGES; k++) {
        at[k + 1] = PAT_MAX(at[k + 1], at[k]);
        atomic_fetch_add(&d->m.stage_ns_sum[k], at[k + 1] - at[k]);
    }
}

/* The executor's last move: stored under the post list's lock (patd_exec_post), so a loop that
 * sees BACK/UNSTARTED also finds the post, and a reap can purge every post naming c. */
void patd_step_give_back(patd_t *d, patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    patd_step_state_t to = atomic_load(&st->state) == STEP_RUNNING ? STEP_BACK : STEP_UNSTARTED;
    step_check(st, to);
    patd_exec_post(&d->exec, c, &st->state, (int)to);
}

static void step_job(void *arg, uint32_t exec_id);
static void step_unreserve(patd_conn_t *c, uint32_t n);
static int step_prepare(patd_conn_t *c, int on_loop);

/* ------------------------------------------------------------------ loop side */
static void step_reset(patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    for (uint32_t i = 0; i < st->n_seqs; i++)
        c->seqs[st->slot[i]].in_step = 0;
    st->n_seqs = st->n_tokens = 0;
    st->err = 0;
    st->layers_done = 0;
    st->end_flags = 0;
    st->why[0] = 0;
    atomic_store(&st->abort, 0);
    if (atomic_load(&st->state) != STEP_IDLE)
        patd_step_move(st, STEP_IDLE);
}

/* Refuses a STEP_BEGIN. A GPU session's stream (or captured graph) hands over every layer
 * without waiting for this answer, so its refused step still runs as a handshake-only step on an
 * executor and ends with STEP_END like any other; a cpu session's step just ends. */
static void step_refuse(patd_t *d, patd_conn_t *c, patd_req_t *rq, int code, const char *msg)
{
    patd_step_t *st = &c->step; /* IDLE: patd_step_begin answered -EBUSY otherwise */
    patd_reply_error(d, rq, code, "%s", msg);
    for (uint32_t j = 0; j < st->n_seqs; j++)
        c->seqs[st->slot[j]].in_step = 0;
    st->n_seqs = st->n_tokens = 0;
    if (!c->gpu)
        return;
    st->err = code;
    st->id = ++c->next_step;
    st->t_recv_ns = pat_now_ns();
    patd_step_move(st, STEP_REFUSED);
    patd_exec_submit(&d->exec, step_job, c);
}

/* A GPU step of at most PATD_STEP_INLINE_TOKENS tokens whose every sequence only grows in the
 * session's forest is prepared here on the loop and handed straight to the lane thread: the
 * executor's wake-up (the largest stage of a GPU step's start) is skipped. Returns 1 when it was
 * (the step is the lane thread's now), 0 when nothing was done and it goes to an executor. The
 * loop's share is bounded three ways:
 *   - reserve and grow cost the new tokens: a sequence that would join (a walk of its whole
 *     block table) sends the step to an executor (step_grows_only), as does pool_mu held;
 *   - the plan's cost grows with the KV the sequences hold, which the client chooses: it runs
 *     here only while the session's last preparation and its last one that rebuilt the packs
 *     (the dearer kind, which a client can bring about every other step by changing a
 *     sequence's tokens) each stayed under PATD_STEP_INLINE_NS, so a session's plans grow past
 *     the bound at most once per kind before its steps go to executors;
 *   - over all sessions, no preparation starts here once PATD_STEP_INLINE_BUDGET_NS were spent
 *     in the current PATD_STEP_INLINE_WINDOW_NS (a fixed window: up to twice the budget in any
 *     span of its length, plus the one that crossed it).
 */
static int step_gpu_inline(patd_t *d, patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    const uint64_t t = pat_now_ns();
    if (t - d->inline_t0 >= PATD_STEP_INLINE_WINDOW_NS) {
        d->inline_t0 = t;
        d->inline_ns = 0;
    }
    if (st->n_tokens > PATD_STEP_INLINE_TOKENS || c->prep_ns > PATD_STEP_INLINE_NS ||
        c->repack_ns > PATD_STEP_INLINE_NS || d->inline_ns >= PATD_STEP_INLINE_BUDGET_NS)
        return 0;
    int rc = step_prepare(c, 1);
    if (rc == -EAGAIN)
        return 0;
    d->inline_ns += pat_now_ns() - t;
    atomic_fetch_add(&d->m.steps_on_loop, 1);
    patd_step_move(st, STEP_PREPARING);
    st->t_exec_ns = t;
    st->err = rc;
    patd_lanes_submit(d, c);
    return 1;
}

void patd_step_begin(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    ipc_step_begin_req_t r;
    memcpy(&r, body, sizeof(r));
    patd_step_t *st = &c->step;
    char msg[160];
    if (patd_step_busy(st)) {
        patd_reply_error(d, rq, -EBUSY, "step %llu is still in flight (%s)",
                         (unsigned long long)st->id, patd_step_state_name(atomic_load(&st->state)));
        return;
    }
    st->n_seqs = 0;
    if (d->draining) {
        step_refuse(d, c, rq, -ESHUTDOWN, "draining: no new steps");
        return;
    }
    if (ipc_shm_guard_hit(&c->shm)) {
        step_refuse(d, c, rq, -EFAULT,
                    "the staging buffer shrank under the daemon (truncated): close the session");
        return;
    }
    if (r.n_seqs > c->max_seqs) {
        snprintf(msg, sizeof(msg), "%u sequences in a step; session holds at most %u", r.n_seqs,
                 c->max_seqs);
        step_refuse(d, c, rq, -E2BIG, msg);
        return;
    }
    if (r.n_tokens > c->max_batch_tokens) {
        snprintf(msg, sizeof(msg), "%u tokens in a step exceed the session's max_batch_tokens %u",
                 r.n_tokens, c->max_batch_tokens);
        step_refuse(d, c, rq, -E2BIG, msg);
        return;
    }
    const uint8_t *p = body + sizeof(r);
    pat_grow((void **)&st->slot, &st->cap_seqs, r.n_seqs, sizeof(uint32_t));
    st->kv = pat_xrealloc(st->kv, st->cap_seqs * sizeof(uint32_t));
    st->n_new = pat_xrealloc(st->n_new, st->cap_seqs * sizeof(uint32_t));
    pat_grow((void **)&st->tokens, &st->cap_tokens, r.n_tokens, sizeof(uint32_t));
    st->kvslot = pat_xrealloc(st->kvslot, st->cap_tokens * sizeof(uint32_t));
    for (uint32_t i = 0; i < r.n_seqs; i++) {
        ipc_step_seq_t s;
        memcpy(&s, p + 8ull * i, sizeof(s));
        int slot = patd_seq_slot(c, s.seq);
        const char *why = NULL;
        int code = 0;
        if (slot < 0)
            code = -ENOENT, why = "is not open in this session";
        else if (c->seqs[slot].in_step)
            code = -EINVAL, why = "appears twice in the step";
        if (code) {
            snprintf(msg, sizeof(msg), "step sequence #%u (id %u) %s", i, s.seq, why);
            step_refuse(d, c, rq, code, msg);
            return;
        }
        c->seqs[slot].in_step = 1;
        st->slot[i] = (uint32_t)slot;
        st->kv[i] = s.seq;
        st->n_new[i] = s.n_new;
        st->n_seqs = i + 1; /* step_refuse clears in_step of these */
    }
    memcpy(st->tokens, p + 8ull * r.n_seqs, (size_t)r.n_tokens * 4);
    st->n_seqs = r.n_seqs;
    st->n_tokens = r.n_tokens;
    st->id = ++c->next_step;
    st->tick_base = c->next_tick;
    c->next_tick += d->model.n_layers;
    st->t_recv_ns = pat_now_ns();
    st->begin_req = *rq;
    rq->wire = 0; /* the reply is owed by the step */
    /* err, layers_done, abort are clear: IDLE means step_reset ran */
    patd_step_move(st, STEP_QUEUED);
    if (c->gpu && step_gpu_inline(d, c))
        return;
    patd_exec_submit(&d->exec, step_job, c);
}

/* Settles the reservations (commit, or give back what was reserved), counts the step, answers
 * STEP_END and returns to IDLE. State BACK or UNSTARTED, END owed, BEGIN answered. */
static void step_finalize(patd_t *d, patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    assert(atomic_load(&st->state) == STEP_BACK || atomic_load(&st->state) == STEP_UNSTARTED);
    assert(!st->begin_req.wire);
    int full = atomic_load(&st->state) == STEP_BACK && st->err == 0 &&
               st->layers_done == d->model.n_layers;
    int commit = full && !(st->end_flags & IPC_STEP_END_ABORT);
    pthread_mutex_lock(&d->pool_mu);
    if (commit) {
        for (uint32_t i = 0, off = 0; i < st->n_seqs; off += st->n_new[i], i++) {
            kv_seq_commit(d->pool, st->kv[i], st->tokens + off, st->n_new[i]);
            patd_seq_set_blocks(c, st->slot[i]);
        }
    } else {
        step_unreserve(c, st->n_seqs);
    }
    pthread_mutex_unlock(&d->pool_mu);
    uint64_t ns = st->t_done_ns - st->t_recv_ns;
    if (commit) {
        atomic_fetch_add(&d->m.steps, 1);
        atomic_fetch_add(&d->m.tokens, st->n_tokens);
        atomic_fetch_add(&d->m.step_ns_sum, ns);
        uint32_t b = 0;
        for (uint64_t lim = 100000; b < 11 && ns > lim; lim *= 2)
            b++;
        atomic_fetch_add(&d->m.step_ns_bucket[b], 1);
    } else if (st->err && st->err != -ECANCELED) {
        atomic_fetch_add(&d->m.steps_failed, 1);
    } else {
        atomic_fetch_add(&d->m.steps_aborted, 1);
    }
    patd_req_t rq = st->end_req;
    st->end_req.wire = 0;
    if (!commit && !(st->end_flags & IPC_STEP_END_ABORT)) {
        int code = st->err ? st->err : -ECANCELED;
        patd_reply_error(d, &rq, code, "step %llu: %u of %u layers ran (%s); nothing committed",
                         (unsigned long long)st->id, st->layers_done, d->model.n_layers,
                         st->why[0] ? st->why : strerror(-code));
    } else {
        ipc_step_end_rep_t rep = {st->layers_done, (uint32_t)commit, ns};
        patd_reply_ok(d, c, &rq, &rep, sizeof(rep));
    }
    step_reset(c);
}

void patd_step_end(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    ipc_step_end_req_t r;
    memcpy(&r, body, sizeof(r));
    patd_step_t *st = &c->step;
    int s = atomic_load(&st->state);
    if (s == STEP_IDLE || (r.step != st->id && !(c->gpu && r.step == 0))) {
        patd_reply_error(d, rq, -ESRCH, "step %llu is not in flight", (unsigned long long)r.step);
        return;
    }
    st->end_req = *rq; /* one request at a time per connection: none was pending */
    rq->wire = 0;
    st->end_flags = r.flags;
    if (s == STEP_BACK || s == STEP_UNSTARTED) {
        /* back; unless its post (which answers BEGIN first) is still queued for the loop */
        if (!st->begin_req.wire)
            step_finalize(d, c);
        return;
    }
    /* still with an executor: ask it to stop unless every layer already ran. A GPU session's
     * layers are still queued on its stream when STEP_END arrives: the step finishes by itself
     * (or by the step timeout), and this answer waits for it. */
    if (!c->gpu && st->layers_done < d->model.n_layers) {
        atomic_store(&st->abort, 1);
        ipc_sig_wake(&ipc_shm_sig(&c->shm)->ready);
    }
}

int patd_step_complete(patd_conn_t *c)
{
    patd_t *d = c->d;
    patd_step_t *st = &c->step;
    int s = atomic_load(&st->state);
    if (c->closing) {
        if (s == STEP_BACK || s == STEP_UNSTARTED || s == STEP_IDLE) {
            step_reset(c);
            return 1;
        }
        return 0;
    }
    int reported = s == STEP_RUNNING || s == STEP_EMPTY || s == STEP_BACK || s == STEP_UNSTARTED;
    if (st->begin_req.wire && reported) {
        patd_req_t rq = st->begin_req;
        st->begin_req.wire = 0;
        if (s == STEP_RUNNING || s == STEP_BACK) {
            ipc_step_begin_rep_t rep = {.step = st->id,
                                        .tick_base = st->tick_base,
                                        .n_tokens = st->n_tokens,
                                        .kv_bytes = st->kv_bytes,
                                        .qc_bytes = st->qc_bytes,
                                        .pack_reused = (uint32_t)st->pack_reused,
                                        .pack_policy = st->pack_policy};
            patd_reply_ok(d, c, &rq, &rep, sizeof(rep));
        } else {
            const char *why = st->err == -ENOSPC   ? "KV pool out of blocks"
                              : st->err == -EDQUOT ? "session block quota exceeded"
                              : st->err == -E2BIG  ? "a sequence would exceed max_seq_len"
                              : st->err == -EOVERFLOW
                                  ? "its plan needs more partial slots than the daemon holds "
                                    "(fewer tokens per step; with daemon.invariant = 1 a larger "
                                    "invariant_chunk)"
                                  : strerror(-st->err);
            patd_reply_error(d, &rq, st->err, "step not started: %s", why);
            /* a cpu step that did not start ends with this answer (nothing was reserved); a GPU
             * step runs its handshakes and ends with STEP_END */
            if (!c->gpu && !st->end_req.wire) {
                step_reset(c);
                return 0;
            }
        }
    }
    if ((s == STEP_BACK || s == STEP_UNSTARTED) && st->end_req.wire)
        step_finalize(d, c);
    return 0;
}

int patd_step_cancel(patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    int s = atomic_load(&st->state);
    if (s == STEP_QUEUED || s == STEP_REFUSED || s == STEP_PREPARING || s == STEP_RUNNING ||
        s == STEP_EMPTY) {
        atomic_store(&st->abort, 1);
        ipc_sig_wake(&patd_conn_sig(c)->ready);
        if (c->gpu)
            patd_lanes_kick(c->d);
        return 1; /* patd_step_complete reports it back */
    }
    step_reset(c);
    return 0;
}

void patd_step_done(patd_step_t *st)
{
    /* a request still owed here is answered -ENOTCONN by the session's end
     * (patd_wire_session_gone) */
    st->begin_req.wire = st->end_req.wire = 0;
    free(st->slot);
    free(st->kv);
    free(st->n_new);
    free(st->tokens);
    free(st->kvslot);
}

/* ------------------------------------------------------------------ executor side */
static void step_unreserve(patd_conn_t *c, uint32_t n)
{
    patd_step_t *st = &c->step;
    for (uint32_t i = 0; i < n; i++) {
        kv_seq_info_t info;
        kv_copy_t cp;
        if (kv_seq_info(c->d->pool, st->kv[i], &info) == 0)
            kv_seq_truncate(c->d->pool, st->kv[i], info.len, &cp); /* same length: no copy */
        patd_seq_set_blocks(c, st->slot[i]);
    }
}

/* Undoes phase 1 (pool_mu held): the forest may hold half of the step, so it starts over next
 * time, and every reservation of the step is released. */
static void step_rollback(patd_conn_t *c)
{
    sched_forest_clear(sched_forest(c->sched));
    for (uint32_t s = 0; s < c->max_seqs; s++)
        c->seqs[s].forest_kv = KV_NONE;
    step_unreserve(c, c->step.n_seqs);
}

void patd_step_rollback(patd_conn_t *c)
{
    pthread_mutex_lock(&c->d->pool_mu);
    step_rollback(c);
    pthread_mutex_unlock(&c->d->pool_mu);
}

/* pool_mu held: 1 when every sequence of the step only grows in the session's forest (it was
 * in the last step under the same kv id, and its table was neither cut nor changed before its
 * end), so that phase 1 joins nothing: its cost is bounded by the step's new tokens, not by the
 * sequences' lengths. */
static int step_grows_only(patd_conn_t *c)
{
    const patd_step_t *st = &c->step;
    const sched_forest_t *f = sched_forest(c->sched);
    for (uint32_t i = 0; i < st->n_seqs; i++) {
        kv_seq_info_t info;
        if (c->seqs[st->slot[i]].forest_kv != st->kv[i] ||
            kv_seq_info(c->d->pool, st->kv[i], &info) < 0)
            return 0;
        sched_query_t q = {info.blocks, info.n_blocks, info.len + st->n_new[i], st->n_new[i],
                           0,           info.version};
        if (!sched_forest_grows(f, st->slot[i], &q))
            return 0;
    }
    return 1;
}

/* Phase 1 and 2. Returns 0 or a negative errno with nothing reserved; notes how long it took in
 * c->prep_ns (and the plan's own time in c->repack_ns when the packs were rebuilt). on_loop (the
 * loop thread prepares it, step_gpu_inline): -EAGAIN, having done nothing, when pool_mu is taken or
 * a sequence would join the forest (step_grows_only), so that the loop never waits for an
 * executor's lock nor walks a whole block table. */
static int step_prepare(patd_conn_t *c, int on_loop)
{
    patd_t *d = c->d;
    patd_step_t *st = &c->step;
    sched_forest_t *f = sched_forest(c->sched);
    uint32_t bs = d->model.block_size;
    int rc = 0;
    if (!on_loop) {
        pthread_mutex_lock(&d->pool_mu);
    } else if (pthread_mutex_trylock(&d->pool_mu)) {
        return -EAGAIN;
    } else if (!step_grows_only(c)) {
        pthread_mutex_unlock(&d->pool_mu);
        return -EAGAIN;
    }
    const uint64_t t0 = pat_now_ns(); /* the work, not the wait for the lock */
    uint32_t i;
    for (i = 0; i < st->n_seqs; i++) {
        kv_seq_info_t info;
        if ((rc = kv_seq_info(d->pool, st->kv[i], &info)) < 0)
            break;
        if ((uint64_t)info.len + st->n_new[i] > d->cfg.max_seq_len) {
            rc = -E2BIG;
            break;
        }
        if ((rc = kv_seq_reserve(d->pool, st->kv[i], st->n_new[i])) < 0)
            break;
        patd_seq_set_blocks(c, st->slot[i]);
        if (c->blocks_held > c->max_blocks) {
            i++; /* this one reserved too */
            rc = -EDQUOT;
            break;
        }
    }
    if (rc < 0) {
        step_unreserve(c, i);
        pthread_mutex_unlock(&d->pool_mu);
        return rc;
    }
    /* sequences of the last step that are not in this one leave the forest */
    for (uint32_t s = 0; s < c->max_seqs; s++)
        if (c->seqs[s].forest_kv != KV_NONE && !c->seqs[s].in_step) {
            sched_forest_leave(f, s);
            c->seqs[s].forest_kv = KV_NONE;
        }
    uint32_t tok = 0;
    for (i = 0; i < st->n_seqs && rc == 0; i++) {
        kv_seq_info_t info;
        kv_seq_info(d->pool, st->kv[i], &info);
        for (uint32_t k = 0; k < st->n_new[i]; k++) {
            uint32_t pos = info.len + k;
            st->kvslot[tok + k] = info.blocks[pos / bs] * bs + pos % bs;
        }
        sched_query_t q = {info.blocks,  info.n_blocks, info.len + st->n_new[i],
                           st->n_new[i], tok,           info.version};
        patd_seq_t *s = &c->seqs[st->slot[i]];
        if (s->forest_kv == st->kv[i]) {
            rc = sched_forest_grow(f, st->slot[i], &q);
            if (rc == -EINVAL) {  /* shrank or changed (truncate, copy-on-write, a twin's copy) */
                assert(!on_loop); /* step_grows_only: the loop joins nothing */
                sched_forest_leave(f, st->slot[i]);
                rc = sched_forest_join(f, st->slot[i], &q);
            }
        } else {
            if (s->forest_kv != KV_NONE)
                sched_forest_leave(f, st->slot[i]);
            rc = sched_forest_join(f, st->slot[i], &q);
        }
        s->forest_kv = rc == 0 ? st->kv[i] : KV_NONE;
        tok += st->n_new[i];
    }
    if (rc == 0) {
        sched_stats_t before;
        sched_get_stats(c->sched, &before);
        rc = sched_build(c->sched, &st->plan);
        if (rc == -ENOSPC)
            rc = -EOVERFLOW; /* partial slots, not blocks (the answer's reason tells apart) */
        if (rc == 0) {
            sched_stats_t after;
            sched_get_stats(c->sched, &after);
            st->pack_reused = after.pack_reuses != before.pack_reuses;
            if (!st->pack_reused) /* the plan alone: what the loop would repeat */
                c->repack_ns = after.last_plan_ns;
            atomic_fetch_add(&d->m.packs, 1);
            atomic_fetch_add(&d->m.pack_ns_sum, after.last_plan_ns);
            if (st->pack_reused)
                atomic_fetch_add(&d->m.pack_reuses, 1);
            for (int k = 0; k < 5; k++)
                if (after.chosen[k] != before.chosen[k]) {
                    atomic_fetch_add(&d->m.packs_policy[k], after.chosen[k] - before.chosen[k]);
                    c->pack_policy = (uint32_t)k + 1; /* a reused pack keeps the last one */
                }
            st->pack_policy = c->pack_policy;
            atomic_fetch_add(&d->m.plan_ctas, st->plan->n_ctas);
            atomic_fetch_add(&d->m.plan_merges, st->plan->n_merges);
            atomic_fetch_add(&d->m.plan_partials, st->plan->n_partials);
            sched_traffic_t pt, qt;
            sched_plan_traffic(st->plan, d->model.q_heads, d->model.kv_heads, d->model.head_dim,
                               kern_dtype_size(kern_kv_dtype(&d->model)),
                               kern_dtype_size(d->model.dtype), &pt);
            sched_query_centric_traffic(c->sched, &qt);
            st->kv_bytes = pt.kv;
            st->qc_bytes = qt.kv;
        }
    }
    if (rc < 0)
        step_rollback(c);
    pthread_mutex_unlock(&d->pool_mu);
    c->prep_ns = pat_now_ns() - t0;
    return rc;
}

/* A cpu step waiting for its client's next layer: ready (0), -ECANCELED (abort), -ETIMEDOUT (no
 * hand-over for limits.step_timeout_ms), or -EAGAIN: not yet after PARK_AFTER_NS, the step is to
 * be parked so that this executor serves others. */
static int wait_ready(patd_t *d, patd_conn_t *c, uint32_t exec_id)
{
    patd_step_t *st = &c->step;
    ipc_sig_t *g = patd_conn_sig(c);
    const uint64_t limit = (uint64_t)d->cfg.step_timeout_ms * 1000000ull;
    const uint64_t t0 = pat_now_ns();
    for (;;) {
        uint32_t v = atomic_load_explicit(&g->ready, memory_order_acquire);
        if ((int32_t)(v - st->wait_tick) >= 0)
            return 0;
        if (atomic_load(&st->abort))
            return -ECANCELED;
        uint64_t now = pat_now_ns();
        if (now - st->wait_since_ns > limit)
            return -ETIMEDOUT;
        if (now - t0 >= PARK_AFTER_NS)
            return -EAGAIN;
        ipc_sig_wait(&g->ready, v, PARK_AFTER_NS - (now - t0));
        patd_exec_beat(&d->exec, exec_id);
    }
}

/* The pool's watcher asks this of a parked cpu step (any thread; reads atomics only): run it
 * again once its client handed the layer over, the loop asked it to stop, or it timed out. */
static int step_unpark(void *arg)
{
    patd_conn_t *c = arg;
    const patd_step_t *st = &c->step;
    uint32_t v = atomic_load_explicit(&patd_conn_sig(c)->ready, memory_order_acquire);
    return (int32_t)(v - st->wait_tick) >= 0 || atomic_load(&st->abort) ||
           pat_now_ns() - st->wait_since_ns > (uint64_t)c->d->cfg.step_timeout_ms * 1000000ull;
}

/* Starts a cpu step: reserve and pack, answer BEGIN. 0, or a negative errno (nothing reserved). */
static int step_start_cpu(patd_t *d, patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    ipc_sig_t *g = patd_conn_sig(c);
    if (atomic_load(&st->abort))
        return -ECANCELED;
    int rc = step_prepare(c, 0);
    if (rc < 0)
        return rc;
    st->t_begun_ns = pat_now_ns();
    st->next_layer = 0;
    st->wait_tick = st->tick_base + 1;
    st->wait_since_ns = st->t_begun_ns;
    atomic_store(&g->err, 0);
    atomic_store(&g->state, IPC_STATE_OPEN);
    patd_step_move(st, STEP_RUNNING);
    patd_exec_post(&d->exec, c, NULL, 0); /* the loop replies to STEP_BEGIN; the step stays ours */
    return 0;
}

/* Runs a cpu step's layers from next_layer on as long as its client hands them over. 0 when
 * every layer ran or the step ended (err set), -EAGAIN when it was parked waiting for its
 * client: an executor never waits long on one client (no head-of-line blocking). */
static int step_layers_cpu(patd_t *d, patd_conn_t *c, uint32_t exec_id)
{
    patd_step_t *st = &c->step;
    ipc_sig_t *g = patd_conn_sig(c);
    uint8_t *base = c->shm.base;
    kern_attn_params_t ap = {.scale = patd_softmax_scale(d), .softcap = d->cfg.softcap};
    int rc = 0;
    while (st->next_layer < d->model.n_layers) {
        const uint32_t l = st->next_layer;
        st->wait_tick = st->tick_base + l + 1;
        if (ipc_shm_guard_hit(&c->shm)) { /* its signal words may be ours alone now */
            rc = -EFAULT;
            break;
        }
        if ((rc = wait_ready(d, c, exec_id)) == -EAGAIN) {
            patd_exec_park(&d->exec, step_job, c, step_unpark, &g->ready);
            return -EAGAIN;
        }
        if (rc < 0)
            break;
        uint64_t t0 = pat_now_ns();
        if (l == 0)
            patd_step_started(d, st, t0);
        pthread_mutex_lock(&d->be_mu);
        rc = kern_append_kv(d->be, l, base + c->lay.k_off, base + c->lay.v_off, st->kvslot,
                            st->n_tokens);
        if (rc == 0)
            rc = kern_attend(d->be, l, st->plan, base + c->lay.q_off, base + c->lay.o_off, &ap);
        pthread_mutex_unlock(&d->be_mu);
        if (rc == 0 && ipc_shm_guard_hit(&c->shm))
            rc = -EFAULT; /* read zeros, wrote where the client cannot see */
        if (rc == -EFAULT) {
            patd_err("session %016llx: its staging buffer shrank under the daemon (the client "
                     "truncated it) at layer %u: step failed; the session gets no more steps",
                     (unsigned long long)c->session, l);
            break;
        }
        if (rc < 0) {
            patd_err("session %016llx: backend failed on layer %u: %s",
                     (unsigned long long)c->session, l, strerror(-rc));
            break;
        }
        atomic_fetch_add(&d->m.layer_ns_sum, pat_now_ns() - t0);
        atomic_fetch_add(&d->m.layers, 1);
        atomic_fetch_add(&d->m.kv_bytes, st->kv_bytes);
        atomic_fetch_add(&d->m.qc_bytes, st->qc_bytes);
        st->layers_done = l + 1;
        st->next_layer = l + 1;
        st->wait_since_ns = pat_now_ns();
        ipc_sig_post(&g->done, st->wait_tick);
        patd_exec_beat(&d->exec, exec_id);
    }
    st->t_done_ns = pat_now_ns();
    if (rc == -ETIMEDOUT)
        patd_notice("session %016llx: step %llu cut: no hand-over of layer %u for %u ms",
                    (unsigned long long)c->session, (unsigned long long)st->id, st->next_layer,
                    d->cfg.step_timeout_ms);
    if (rc < 0) {
        st->err = rc;
        atomic_store(&g->err, rc);
        ipc_sig_post(&g->state, IPC_STATE_ABORTED);
        ipc_sig_wake(&g->done);
    }
    return 0;
}

/* The executor's job: the session's step, then its last move. A GPU step is prepared here and
 * handed to the lane thread (patd_lanes.c), which runs it to its end without this thread; a cpu
 * step runs its layers while its
 * client keeps up and is parked (this job runs again later, on any executor) while it does not. */
static void step_job(void *arg, uint32_t exec_id)
{
    patd_conn_t *c = arg;
    patd_t *d = c->d;
    patd_step_t *st = &c->step;
    int s = atomic_load(&st->state);
    if (s == STEP_QUEUED || s == STEP_REFUSED) {
        patd_step_move(st, s == STEP_REFUSED ? STEP_EMPTY : STEP_PREPARING);
        if (c->gpu) {
            /* reserve and pack here; the lane thread begins it once a lane is free */
            st->t_exec_ns = pat_now_ns();
            if (st->err == 0 && atomic_load(&st->abort))
                st->err = -ECANCELED;
            else if (st->err == 0)
                st->err = step_prepare(c, 0);
            patd_lanes_submit(d, c);
            return;
        }
        int rc = step_start_cpu(d, c);
        if (rc < 0) {
            st->err = rc;
            st->t_done_ns = pat_now_ns();
            patd_step_give_back(d, c);
            return;
        }
    }
    assert(atomic_load(&st->state) == STEP_RUNNING && !c->gpu);
    if (step_layers_cpu(d, c, exec_id) == -EAGAIN)
        return; /* parked: the pool's watcher submits it again */
    patd_step_give_back(d, c);
}
