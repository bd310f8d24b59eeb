/*
 * patd_exec.c — step executors: the threads that run a session's step from KV reservation to
 * its last layer, so that the loop thread never waits on a client or computes attention.
 *
 * One step on an executor:
 *   1. under pool_mu: reserve slots for every sequence (all or nothing: -ENOSPC, -EDQUOT and
 *      -E2BIG roll back what was reserved), note each new token's pool slot, and bring the
 *      session's forest up to date (sequences not in this step leave, the others grow or join);
 *   2. build the plan (pack reused when the forest's structure did not change);
 *   3. post BEGUN (the loop replies to STEP_BEGIN), then per layer: wait for the client's ready
 *      word, append K/V and attend under be_mu, write O, post the done word.
 * Waits are sliced (50 ms) so an abort from the loop (client died, STEP_END early, drain) or
 * the step timeout ends a step promptly; every slice also bumps the executor's heartbeat, which
 * the systemd watchdog reads. Completions go back to the loop through a list and a uv_async.
 *
 * GPU sessions (cuda backend) run the same phases 1 and 2, then the executor answers STEP_BEGIN
 * at once and enqueues the step's layers on its own lane, at most gpu.enqueue_depth ahead of the
 * lane's progress (read from host memory: no CUDA call while it waits). The handshakes are GPU-
 * side (ipc_shm.h): this thread never sees a layer's ready word, only the lane's progress. A step
 * that failed to start still runs its n_layers handshakes without compute, so the client's stream
 * (or its captured graph) goes through and the words stay paired. A client that dies, or makes
 * no progress for limits.step_timeout_ms, has its waits released from the CPU (gpu_cut).
 */
#include <errno.h>
#include <math.h>
#include <sys/prctl.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

#define WAIT_SLICE_NS 50000000ull

typedef struct exec_arg {
    patd_t *d;
    uint32_t id;
} exec_arg_t;

void patd_exec_submit(patd_t *d, patd_conn_t *c)
{
    pthread_mutex_lock(&d->q_mu);
    pat_grow((void **)&d->q, &d->q_cap, d->q_len + 1, sizeof(*d->q));
    /* the ring is kept compact: head always 0 after a grow */
    if (d->q_head + d->q_len >= d->q_cap) {
        memmove(d->q, d->q + d->q_head, d->q_len * sizeof(*d->q));
        d->q_head = 0;
    }
    d->q[d->q_head + d->q_len++] = c;
    pthread_cond_signal(&d->q_cv);
    pthread_mutex_unlock(&d->q_mu);
}

/* Queues c for the loop. The final post also marks the step FINISHED inside the same critical
 * section: once the loop sees FINISHED, the last entry naming c is already in the list, so a
 * reap can purge every entry and no pointer to a freed session is left behind. */
static void post_done(patd_t *d, patd_conn_t *c, int final)
{
    pthread_mutex_lock(&d->done_mu);
    if (final)
        atomic_store(&c->step.phase, STEP_FINISHED);
    pat_grow((void **)&d->done, &d->cap_done, d->n_done + 1, sizeof(*d->done));
    d->done[d->n_done++] = c;
    pthread_mutex_unlock(&d->done_mu);
    uv_async_send(&d->wake);
}

void patd_exec_forget(patd_t *d, patd_conn_t *c)
{
    pthread_mutex_lock(&d->done_mu);
    uint32_t k = 0;
    for (uint32_t i = 0; i < d->n_done; i++)
        if (d->done[i] != c)
            d->done[k++] = d->done[i];
    d->n_done = k;
    pthread_mutex_unlock(&d->done_mu);
}

patd_conn_t *patd_exec_take_done(patd_t *d)
{
    patd_conn_t *c = NULL;
    pthread_mutex_lock(&d->done_mu);
    if (d->n_done) {
        c = d->done[0];
        memmove(d->done, d->done + 1, (d->n_done - 1) * sizeof(*d->done));
        d->n_done--;
    }
    pthread_mutex_unlock(&d->done_mu);
    return c;
}

void patd_step_unreserve(patd_conn_t *c, uint32_t n)
{
    patd_step_t *st = &c->step;
    for (uint32_t i = 0; i < n; i++) {
        kv_seq_info_t info;
        kv_copy_t cp;
        if (kv_seq_info(c->d->pool, st->kv[i], &info) == 0)
            kv_seq_truncate(c->d->pool, st->kv[i], info.len, &cp); /* same length: no copy */
        patd_conn_set_blocks(c, st->slot[i]);
    }
}

/* Undoes phase 1 (pool_mu held): the forest may hold half of the step, so it starts over next
 * time, and every reservation of the step is released. */
static void step_rollback(patd_conn_t *c)
{
    sched_forest_clear(sched_forest(c->sched));
    for (uint32_t s = 0; s < c->max_seqs; s++)
        c->seqs[s].forest_kv = KV_NONE;
    patd_step_unreserve(c, c->step.n_seqs);
}

/* Phase 1 and 2. Returns 0 or a negative errno with nothing reserved. */
static int step_prepare(patd_conn_t *c)
{
    patd_t *d = c->d;
    patd_step_t *st = &c->step;
    sched_forest_t *f = sched_forest(c->sched);
    uint32_t bs = d->model.block_size;
    int rc = 0;
    pthread_mutex_lock(&d->pool_mu);
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
        patd_conn_set_blocks(c, st->slot[i]);
        if (c->blocks_held > c->max_blocks) {
            i++; /* this one reserved too */
            rc = -EDQUOT;
            break;
        }
    }
    if (rc < 0) {
        patd_step_unreserve(c, i);
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
        sched_query_t q = {info.blocks, info.n_blocks, info.len + st->n_new[i], st->n_new[i], tok};
        patd_seq_t *s = &c->seqs[st->slot[i]];
        if (s->forest_kv == st->kv[i]) {
            rc = sched_forest_grow(f, st->slot[i], &q);
            if (rc == -EINVAL) { /* shrank or changed (truncate, copy-on-write) */
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
        if (rc == 0) {
            sched_stats_t after;
            sched_get_stats(c->sched, &after);
            st->pack_reused = after.pack_reuses != before.pack_reuses;
            atomic_fetch_add(&d->m.packs, 1);
            atomic_fetch_add(&d->m.pack_ns_sum, after.last_plan_ns);
            if (st->pack_reused)
                atomic_fetch_add(&d->m.pack_reuses, 1);
            sched_traffic_t pt, qt;
            sched_plan_traffic(st->plan, d->model.q_heads, d->model.kv_heads, d->model.head_dim,
                               kern_dtype_size(d->model.dtype), &pt);
            sched_query_centric_traffic(c->sched, &qt);
            st->kv_bytes = pt.kv;
            st->qc_bytes = qt.kv;
        }
    }
    if (rc < 0)
        step_rollback(c);
    pthread_mutex_unlock(&d->pool_mu);
    return rc;
}

/* Waits for the client's layer tick. 0, -ECANCELED (abort), -ETIMEDOUT (step timeout). */
static int wait_ready(patd_t *d, patd_conn_t *c, uint32_t tick, uint32_t exec_id)
{
    ipc_sig_t *g = patd_conn_sig(c);
    uint64_t limit = (uint64_t)d->cfg.step_timeout_ms * 1000000ull;
    uint64_t t0 = pat_now_ns();
    for (;;) {
        uint32_t v = atomic_load_explicit(&g->ready, memory_order_acquire);
        if ((int32_t)(v - tick) >= 0)
            return 0;
        if (atomic_load(&c->step.abort))
            return -ECANCELED;
        if (pat_now_ns() - t0 > limit)
            return -ETIMEDOUT;
        ipc_sig_wait(&g->ready, v, WAIT_SLICE_NS);
        atomic_fetch_add_explicit(&d->m.exec_beat[exec_id], 1, memory_order_relaxed);
    }
}

static void step_run(patd_t *d, patd_conn_t *c, uint32_t exec_id)
{
    patd_step_t *st = &c->step;
    ipc_sig_t *g = patd_conn_sig(c);
    uint8_t *base = c->shm.base;
    kern_attn_params_t ap = {.scale = d->cfg.scale > 0 ? d->cfg.scale
                                                       : 1.0f / sqrtf((float)d->model.head_dim),
                             .softcap = d->cfg.softcap};
    if (atomic_load(&st->abort)) {
        st->err = -ECANCELED;
        return;
    }
    int rc = step_prepare(c);
    if (rc < 0) {
        st->err = rc;
        return;
    }
    st->begun = 1;
    st->t_begun_ns = pat_now_ns();
    atomic_store(&g->err, 0);
    atomic_store(&g->state, IPC_STATE_OPEN);
    post_done(d, c, 0); /* BEGUN: the loop replies to STEP_BEGIN; the step stays ours */
    for (uint32_t l = 0; l < d->model.n_layers; l++) {
        uint32_t tick = st->tick_base + l + 1;
        if ((rc = wait_ready(d, c, tick, exec_id)) < 0)
            break;
        uint64_t t0 = pat_now_ns();
        pthread_mutex_lock(&d->be_mu);
        rc = kern_append_kv(d->be, l, base + c->lay.k_off, base + c->lay.v_off, st->kvslot,
                            st->n_tokens);
        if (rc == 0)
            rc = kern_attend(d->be, l, st->plan, base + c->lay.q_off, base + c->lay.o_off, &ap);
        pthread_mutex_unlock(&d->be_mu);
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
        ipc_sig_post(&g->done, tick);
        atomic_fetch_add_explicit(&d->m.exec_beat[exec_id], 1, memory_order_relaxed);
    }
    st->t_done_ns = pat_now_ns();
    if (rc < 0) {
        st->err = rc;
        atomic_store(&g->err, rc);
        ipc_sig_post(&g->state, IPC_STATE_ABORTED);
        ipc_sig_wake(&g->done);
    }
}

/* ------------------------------------------------------------------ GPU sessions */

static void pause_us(uint32_t us)
{
    struct timespec ts = {0, (long)us * 1000};
    nanosleep(&ts, NULL);
}

/* Waits until the lane has finished `target` layers. 0, -ECANCELED (abort from the loop),
 * -ETIMEDOUT (no progress for step_timeout_ms: the client stalled). Polls host memory: spins
 * for 50 us after progress moved (the next layer usually follows within a hand-off), then naps
 * 10 us, and 100 us after a millisecond without progress. */
static int lane_wait(patd_t *d, patd_conn_t *c, kern_lane_t *lane, uint64_t target,
                     uint32_t exec_id)
{
    const uint64_t limit = (uint64_t)d->cfg.step_timeout_ms * 1000000ull;
    uint64_t seen = kern_lane_progress(lane), t_moved = pat_now_ns();
    for (uint32_t spins = 0;; spins++) {
        uint64_t p = kern_lane_progress(lane);
        if (p >= target)
            return 0;
        uint64_t now = pat_now_ns();
        if (p != seen) {
            seen = p;
            t_moved = now;
        }
        if (atomic_load(&c->step.abort))
            return -ECANCELED;
        if (now - t_moved > limit)
            return -ETIMEDOUT;
        if (now - t_moved < 50000ull)
            __builtin_ia32_pause();
        else
            pause_us(now - t_moved < 1000000ull ? 10 : 100);
        if ((spins & 255) == 0)
            atomic_fetch_add_explicit(&d->m.exec_beat[exec_id], 1, memory_order_relaxed);
    }
}

/* Releases every wait the lane holds for this session from the CPU, drains the lane, releases
 * whatever of the step the client's stream may still wait for, and starts a new epoch: values of
 * the cut step satisfy no later wait. The client learns it from the STEP_END reply and the
 * signal page (state ABORTED, err, epoch). */
static void gpu_cut(patd_t *d, patd_conn_t *c, kern_lane_t *lane, uint64_t epoch, int why,
                    uint32_t exec_id)
{
    const uint32_t nl = d->model.n_layers;
    ipc_sig_t *g = patd_conn_sig(c);
    uint64_t *ready = ipc_gsig_ready(c->gsig), *done = ipc_gsig_done(c->gsig, nl);
    /* an empty layer that reports progress, so that layers enqueued since the last report count */
    const kern_lane_layer_t flush = {.report = 1};
    int fr = kern_lane_layer(lane, &flush);
    if (fr < 0)
        patd_gpu_check_fatal(d, fr);
    const uint64_t target = kern_lane_enqueued(lane);
    uint64_t t0 = pat_now_ns();
    while (kern_lane_progress(lane) < target) {
        for (uint32_t l = 0; l < nl; l++)
            __atomic_store_n(&ready[l], epoch, __ATOMIC_RELEASE);
        pause_us(50);
        atomic_fetch_add_explicit(&d->m.exec_beat[exec_id], 1, memory_order_relaxed);
        if (pat_now_ns() - t0 > 1000000000ull) { /* released words that do not move: the GPU */
            patd_gpu_check_fatal(d, -EIO);       /* exits if the context is lost */
            t0 = pat_now_ns();
            patd_warn("session %016llx: lane still draining after its waits were released",
                      (unsigned long long)c->session);
        }
    }
    for (uint32_t l = 0; l < nl; l++) {
        __atomic_store_n(&done[l], epoch, __ATOMIC_RELEASE);
        __atomic_store_n(&ready[l], 0, __ATOMIC_RELEASE);
    }
    atomic_store(&g->err, why);
    atomic_store(&g->epoch, epoch + 1);
    atomic_store(&g->state, IPC_STATE_ABORTED);
}

static void step_run_gpu(patd_t *d, patd_conn_t *c, uint32_t exec_id)
{
    patd_step_t *st = &c->step;
    kern_lane_t *lane = d->lanes[exec_id];
    ipc_sig_t *g = patd_conn_sig(c);
    const uint32_t nl = d->model.n_layers, depth = d->cfg.enqueue_depth;
    /* progress is reported every `every` layers and on the last: any `depth` consecutive layers
     * of a step hold a reported one, so a wait for the window below always ends, and the window
     * refills while half of it is still queued */
    const uint32_t every = PAT_MAX(1u, PAT_MIN(8u, depth / 2));
    const uint64_t epoch = atomic_load(&g->epoch);
    int rc = st->err; /* set by the loop for a step it refused (a handshake-only step) */
    if (rc == 0 && atomic_load(&st->abort))
        rc = -ECANCELED;
    if (rc == 0 && (rc = step_prepare(c)) == 0 &&
        (rc = kern_lane_begin(lane, st->plan, st->kvslot, st->n_tokens)) < 0) {
        patd_gpu_check_fatal(d, rc);
        patd_err("session %016llx: the lane refused the plan: %s", (unsigned long long)c->session,
                 strerror(-rc));
        pthread_mutex_lock(&d->pool_mu); /* the lane refused the plan: undo phase 1 */
        step_rollback(c);
        pthread_mutex_unlock(&d->pool_mu);
    }
    st->tick_base = (uint32_t)epoch;
    st->begun = rc == 0;
    st->err = rc;
    st->t_begun_ns = pat_now_ns();
    atomic_store(&g->err, 0);
    atomic_store(&g->state, IPC_STATE_OPEN);
    post_done(d, c, 0); /* the loop answers STEP_BEGIN now (unless it already did) */

    kern_lane_layer_t ly = {
        .compute = st->begun,
        .q = c->dev_base + c->lay.q_off,
        .k = c->dev_base + c->lay.k_off,
        .v = c->dev_base + c->lay.v_off,
        .o = c->dev_base + c->lay.o_off,
        .params = {.scale =
                       d->cfg.scale > 0 ? d->cfg.scale : 1.0f / sqrtf((float)d->model.head_dim),
                   .softcap = d->cfg.softcap},
        .wait_value = epoch,
        .post_value = epoch,
    };
    uint64_t *ready_dev = ipc_gsig_ready(c->gsig_dev), *done_dev = ipc_gsig_done(c->gsig_dev, nl);
    const uint64_t base = kern_lane_enqueued(lane);
    int wr = 0;
    for (uint32_t l = 0; l < nl && wr == 0; l++) {
        uint64_t enq = kern_lane_enqueued(lane);
        if (enq - kern_lane_progress(lane) >= depth)
            wr = lane_wait(d, c, lane, enq - depth + 1, exec_id);
        if (wr < 0)
            break;
        ly.layer = l;
        ly.report = (l + 1) % every == 0 || l + 1 == nl;
        ly.wait_word = ready_dev + l;
        ly.post_word = done_dev + l;
        if ((wr = kern_lane_layer(lane, &ly)) < 0) {
            patd_gpu_check_fatal(d, wr);
            patd_err("session %016llx: enqueueing layer %u failed: %s",
                     (unsigned long long)c->session, l, strerror(-wr));
        }
    }
    if (wr == 0)
        wr = lane_wait(d, c, lane, kern_lane_enqueued(lane), exec_id);
    const uint32_t ran = (uint32_t)(kern_lane_progress(lane) - base);
    if (wr == 0) {
        /* Every layer ran: the lane consumed every ready word, and the client every done word
         * but the last (it wrote ready[l + 1] after its wait for done[l] on its stream; it resets
         * done[nl - 1] itself). Reset them here, off both streams, before STEP_END is answered,
         * so the same values serve the next step (ipc_shm.h). */
        uint64_t *ready = ipc_gsig_ready(c->gsig), *done = ipc_gsig_done(c->gsig, nl);
        for (uint32_t l = 0; l < nl; l++) {
            __atomic_store_n(&ready[l], 0, __ATOMIC_RELEASE);
            if (l + 1 < nl)
                __atomic_store_n(&done[l], 0, __ATOMIC_RELEASE);
        }
    }
    if (wr < 0) {
        if (wr == -ETIMEDOUT)
            patd_notice("session %016llx: no layer handed over for %u ms (after %u of %u); "
                        "releasing the step's waits",
                        (unsigned long long)c->session, d->cfg.step_timeout_ms, ran, nl);
        gpu_cut(d, c, lane, epoch, wr, exec_id);
        if (st->err == 0)
            st->err = wr;
    }
    if (st->begun) {
        st->layers_done = wr == 0 ? nl : ran;
        atomic_fetch_add(&d->m.layers, st->layers_done);
        atomic_fetch_add(&d->m.layer_ns_sum, pat_now_ns() - st->t_begun_ns);
        atomic_fetch_add(&d->m.kv_bytes, st->kv_bytes * st->layers_done);
        atomic_fetch_add(&d->m.qc_bytes, st->qc_bytes * st->layers_done);
    }
    st->t_done_ns = pat_now_ns();
}

static void *exec_main(void *arg)
{
    exec_arg_t *a = arg;
    patd_t *d = a->d;
    uint32_t id = a->id;
    free(a);
    prctl(PR_SET_TIMERSLACK, 1000UL); /* GPU sessions poll progress with 10 us naps */
    for (;;) {
        pthread_mutex_lock(&d->q_mu);
        while (!d->q_len && !d->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&d->q_cv, &d->q_mu, &ts);
            atomic_fetch_add_explicit(&d->m.exec_beat[id], 1, memory_order_relaxed);
        }
        if (d->stopping && !d->q_len) {
            pthread_mutex_unlock(&d->q_mu);
            return NULL;
        }
        patd_conn_t *c = d->q[d->q_head++];
        d->q_len--;
        if (!d->q_len)
            d->q_head = 0;
        pthread_mutex_unlock(&d->q_mu);
        atomic_store(&c->step.phase, STEP_RUNNING);
        if (c->gpu)
            step_run_gpu(d, c, id);
        else
            step_run(d, c, id);
        post_done(d, c, 1);
        atomic_fetch_add_explicit(&d->m.exec_beat[id], 1, memory_order_relaxed);
    }
}

int patd_exec_start(patd_t *d)
{
    d->n_exec = PAT_MIN(d->cfg.executors, 64u);
    d->exec = pat_xcalloc(d->n_exec, sizeof(pthread_t));
    for (uint32_t i = 0; i < d->n_exec; i++) {
        exec_arg_t *a = pat_xmalloc(sizeof(*a));
        a->d = d;
        a->id = i;
        int rc = pthread_create(&d->exec[i], NULL, exec_main, a);
        if (rc) {
            free(a);
            d->n_exec = i;
            return -rc;
        }
    }
    return 0;
}

void patd_exec_stop(patd_t *d)
{
    pthread_mutex_lock(&d->q_mu);
    d->stopping = 1;
    pthread_cond_broadcast(&d->q_cv);
    pthread_mutex_unlock(&d->q_mu);
    for (uint32_t i = 0; i < d->n_exec; i++)
        pthread_join(d->exec[i], NULL);
    free(d->exec);
    d->exec = NULL;
    d->n_exec = 0;
}
