/*
 * patd_lanes.c — GPU steps on lanes, driven by one thread (patd_lanes.h says what and why).
 *
 * A step on a lane, in the lane thread's passes:
 *   begin   plan and slots uploaded (kern_lane_begin), the step RUNNING (or EMPTY: handshakes
 *           only) and posted, so the loop answers STEP_BEGIN;
 *   run     layers enqueued while fewer than gpu.enqueue_depth are ahead of the lane's progress;
 *           hand-overs counted from the client's ready words; every `every` layers and the last
 *           one report progress;
 *   end     the last layer's progress seen: the consumed words reset and the step given back; or
 *   cut     its waits released from the CPU (ready[l] = epoch), the lane drained over the next
 *           passes, then done[l] = epoch for every layer, a new epoch and ABORTED on the signal
 *           page, the step given back with the cause in st->why.
 * A step that is cut before it got a lane has nothing enqueued: only its words are released.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "patd_int.h"
#include "patd_lanes.h"
#include "patd_log.h"
#include "pat_base.h"

uint32_t patd_lanes_auto(const kern_config_t *kc, uint64_t mem_total)
{
    uint32_t n = PATD_LANES_AUTO_MAX;
    const char *e = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    long conns = e ? strtol(e, NULL, 10) : 8; /* CUDA's default */
    if (conns >= 3 && conns - 2 < (long)n)
        n = (uint32_t)(conns - 2);
    else if (conns < 3)
        n = 1;
    const uint64_t each = kern_lane_bytes(kc);
    if (each && mem_total) {
        uint64_t fit = mem_total / PATD_LANES_MEM_SHARE / each;
        if (fit < n)
            n = fit ? (uint32_t)fit : 1;
    }
    return n;
}

static void lanes_wake(patd_lanes_t *L)
{
    atomic_fetch_add(&L->kick, 1);
    syscall(SYS_futex, &L->kick, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void patd_lanes_kick(patd_t *d)
{
    if (d->lanes.started)
        lanes_wake(&d->lanes);
}

void patd_lanes_submit(patd_t *d, patd_conn_t *c)
{
    patd_lanes_t *L = &d->lanes;
    c->step.t_lane_ns = pat_now_ns();
    pthread_mutex_lock(&L->mu);
    pat_grow((void **)&L->wait, &L->cap_wait, L->n_wait + 1, sizeof(*L->wait));
    L->wait[L->n_wait++] = c;
    atomic_store(&L->waiting, L->n_wait);
    pthread_mutex_unlock(&L->mu);
    lanes_wake(L);
}

/* ------------------------------------------------------------------ one step */

/* The words of a step that did not run to its end, once nothing of it is queued on a lane: the
 * client's stream passes every wait it may still have (done[l] = epoch), later values of this
 * epoch satisfy nothing (epoch + 1), and the client reads why on its signal page. */
static void words_release(patd_t *d, patd_conn_t *c, uint64_t epoch, int why)
{
    ipc_sig_t *g = patd_conn_sig(c);
    ipc_gsig_release(c->gsig, d->model.n_layers, epoch);
    atomic_store(&g->err, why);
    atomic_store(&g->epoch, epoch + 1);
    atomic_store(&g->state, IPC_STATE_ABORTED);
}

/* A step that waited for a lane and was asked to stop there (client died, drain): nothing was
 * enqueued; its reservations are undone and it is given back as not started. */
static void give_back_unstarted(patd_t *d, patd_conn_t *c, int why)
{
    patd_step_t *st = &c->step;
    if (st->err == 0) {
        patd_step_rollback(c);
        st->err = why;
    }
    words_release(d, c, atomic_load(&patd_conn_sig(c)->epoch), why);
    st->t_begun_ns = st->t_done_ns = pat_now_ns();
    if (atomic_load(&st->state) == STEP_PREPARING)
        patd_step_move(st, STEP_EMPTY);
    patd_step_give_back(d, c);
}

/* Whether layer l of nl reports the lane's progress: every few layers and the last, so that any
 * `depth` consecutive layers hold a reported one (the window always drains) and it refills while
 * half of it is queued. */
static int reports(uint32_t l, uint32_t nl, uint32_t depth)
{
    const uint32_t every = PAT_MAX(1u, PAT_MIN(8u, depth / 2));
    return (l + 1) % every == 0 || l + 1 == nl;
}

static int lane_enqueue(patd_t *d, patd_lane_t *ln)
{
    patd_conn_t *c = ln->c;
    const uint32_t nl = d->model.n_layers, depth = d->cfg.enqueue_depth;
    uint64_t *ready = ipc_gsig_ready(c->gsig), *done = ipc_gsig_done(c->gsig, nl);
    kern_lane_layer_t ly = {
        .compute = ln->begun,
        .q = c->dev_base + c->lay.q_off,
        .k = c->dev_base + c->lay.k_off,
        .v = c->dev_base + c->lay.v_off,
        .o = c->dev_base + c->lay.o_off,
        .params = {.scale = patd_softmax_scale(d), .softcap = d->cfg.softcap},
        .wait_value = ln->epoch,
        .post_value = ln->epoch,
    };
    while (ln->next < nl && kern_lane_enqueued(ln->lane) - kern_lane_progress(ln->lane) < depth) {
        const uint32_t l = ln->next;
        if (d->lanes.on_ready && l >= ln->handed)
            break; /* not handed over yet (count_handed ran this pass) */
        ly.layer = l;
        ly.report = reports(l, nl, depth);
        ly.wait_word = ready + l;
        ly.post_word = done + l;
        int rc = kern_lane_layer(ln->lane, &ly);
        if (rc < 0) {
            patd_gpu_check_fatal(d, rc);
            patd_err("session %016llx: enqueueing layer %u failed: %s",
                     (unsigned long long)c->session, l, strerror(-rc));
            return rc;
        }
        if (l == 0 && ln->begun)
            patd_step_started(d, &c->step, pat_now_ns());
        ln->next = l + 1;
    }
    return 0;
}

/* Gives c's step the lane ln and answers its STEP_BEGIN (the post): rc is the step's error so far
 * (0: its layers compute), epoch its handshake value (read before anything was enqueued for it).
 */
static void lane_take(patd_t *d, patd_lane_t *ln, patd_conn_t *c, int rc, uint64_t epoch,
                      uint64_t now)
{
    patd_lanes_t *L = &d->lanes;
    patd_step_t *st = &c->step;
    ipc_sig_t *g = patd_conn_sig(c);
    atomic_fetch_add(&L->wait_ns_sum, now - st->t_lane_ns);
    atomic_fetch_add(&L->steps, 1);
    *ln = (patd_lane_t){.lane = ln->lane,
                        .phase = LANE_RUN,
                        .role = ROLE_SOLO,
                        .c = c,
                        .base = kern_lane_enqueued(ln->lane),
                        .epoch = epoch,
                        .seen = kern_lane_progress(ln->lane),
                        .t_moved = now,
                        .begun = rc == 0};
    st->tick_base = (uint32_t)epoch;
    st->err = rc;
    st->t_begun_ns = now;
    if (!atomic_load(&st->abort)) { /* a closing session's page keeps what the loop stored */
        atomic_store(&g->err, 0);
        atomic_store(&g->state, IPC_STATE_OPEN);
    }
    if (atomic_load(&st->state) == STEP_PREPARING)
        patd_step_move(st, rc == 0 ? STEP_RUNNING : STEP_EMPTY);
    patd_exec_post(&d->exec, c, NULL, 0); /* the loop answers STEP_BEGIN now (unless it did) */
}

/* Begins the step on a free lane: uploads its plan, posts it (the loop answers STEP_BEGIN),
 * and the same pass's lane_drive enqueues its first layers. */
static void lane_begin(patd_t *d, patd_lane_t *ln, patd_conn_t *c, uint64_t now)
{
    patd_step_t *st = &c->step;
    const uint64_t epoch = atomic_load(&patd_conn_sig(c)->epoch);
    int rc = st->err; /* set for a step that was refused or did not prepare */
    if (rc == 0 && atomic_load(&st->abort)) {
        patd_step_rollback(c);
        rc = -ECANCELED;
    }
    if (rc == 0 && (rc = kern_lane_begin(ln->lane, st->plan, st->kvslot, st->n_tokens)) < 0) {
        patd_gpu_check_fatal(d, rc);
        patd_err("session %016llx: the lane refused the plan: %s", (unsigned long long)c->session,
                 strerror(-rc));
        patd_step_rollback(c);
    }
    st->t_uploaded_ns = pat_now_ns();
    lane_take(d, ln, c, rc, epoch, now);
}

/* Every wait the lane may hold for its step's client passes: each ready word = the epoch. */
static void release_waits(patd_t *d, patd_lane_t *ln)
{
    uint64_t *ready = ipc_gsig_ready(ln->c->gsig);
    for (uint32_t l = 0; l < d->model.n_layers; l++)
        __atomic_store_n(&ready[l], ln->epoch, __ATOMIC_RELEASE);
}

/* Starts a cut: every wait the lane holds for this step is released from the CPU; the lane
 * drains over the next passes (lane_drive's LANE_DRAIN). */
static void lane_cut(patd_t *d, patd_lane_t *ln, int why, uint64_t now)
{
    /* a member's layers are on its pack's lane: from the next packed layer on the pack neither
     * waits for nor serves it, and what the pack enqueued so far drains there */
    patd_lane_t *pl = ln->role == ROLE_MEMBER ? &d->lanes.lane[ln->pack] : NULL;
    kern_lane_t *on = pl ? pl->lane : ln->lane;
    if (pl) {
        kern_lane_pack_exclude(pl->lane, ln->member);
        pl->live--;
    }
    /* an empty layer that reports progress, so that layers enqueued since the last report count */
    const kern_lane_layer_t flush = {.report = 1};
    int fr = kern_lane_layer(on, &flush);
    if (fr < 0)
        patd_gpu_check_fatal(d, fr);
    release_waits(d, ln);
    ln->phase = LANE_DRAIN;
    ln->drain = on;
    ln->target = kern_lane_enqueued(on);
    ln->why = why;
    ln->t_cut = now;
}

/* Layers of ln's step that ran, its own lane's progress being p (a pack member's: those its
 * client handed over, which its pack ran or will drain). */
static uint32_t lane_ran(const patd_t *d, const patd_lane_t *ln, uint64_t p)
{
    if (ln->role == ROLE_MEMBER)
        return ln->handed;
    return (uint32_t)PAT_MIN((uint64_t)d->model.n_layers, p - ln->base);
}

/* The step leaves its lane: counts its layers, resets or releases its words, gives it back. */
static void lane_end(patd_t *d, patd_lane_t *ln, uint64_t now)
{
    patd_lanes_t *L = &d->lanes;
    patd_conn_t *c = ln->c;
    patd_step_t *st = &c->step;
    const uint32_t nl = d->model.n_layers;
    const uint32_t ran = lane_ran(d, ln, kern_lane_progress(ln->lane));
    if (ln->phase == LANE_RUN) {
        /* Every layer ran: the lane consumed every ready word, and the client every done word but
         * the last (it wrote ready[l + 1] after its wait for done[l] on its stream; it resets
         * done[nl - 1] itself). Reset them here, off both streams, before STEP_END is answered,
         * so the same values serve the next step (ipc_shm.h). */
        uint64_t *ready = ipc_gsig_ready(c->gsig), *done = ipc_gsig_done(c->gsig, nl);
        for (uint32_t l = 0; l < nl; l++) {
            __atomic_store_n(&ready[l], 0, __ATOMIC_RELEASE);
            if (l + 1 < nl)
                __atomic_store_n(&done[l], 0, __ATOMIC_RELEASE);
        }
    } else {
        words_release(d, c, ln->epoch, ln->why);
        if (st->err == 0)
            st->err = ln->why;
    }
    if (ln->begun) {
        st->layers_done = ln->phase == LANE_RUN ? nl : ran;
        atomic_fetch_add(&d->m.layers, st->layers_done);
        atomic_fetch_add(&d->m.layer_ns_sum, now - st->t_begun_ns);
        atomic_fetch_add(&d->m.kv_bytes, st->kv_bytes * st->layers_done);
        atomic_fetch_add(&d->m.qc_bytes, st->qc_bytes * st->layers_done);
    }
    st->t_done_ns = now;
    kern_lane_trim(ln->lane); /* nothing of it is in flight now */
    ln->phase = LANE_FREE;
    ln->role = ROLE_SOLO;
    ln->c = NULL;
    atomic_fetch_sub(&L->busy, 1);
    patd_step_give_back(d, c);
}

/* How many layers the client has handed over (its ready words set to this epoch), from the last
 * count on; moves t_moved when it grew. */
static void count_handed(patd_t *d, patd_lane_t *ln, uint64_t now)
{
    const uint32_t nl = d->model.n_layers;
    const uint64_t *ready = ipc_gsig_ready(ln->c->gsig);
    uint32_t h = ln->handed;
    while (h < nl && __atomic_load_n(&ready[h], __ATOMIC_ACQUIRE) >= ln->epoch)
        h++;
    if (h != ln->handed) {
        ln->handed = h;
        ln->t_moved = now;
    }
}

/* Whether the step waits for its client (not for the GPU): every layer it handed over has its
 * output posted, and it has not handed over the next. */
static int waits_for_client(patd_t *d, const patd_lane_t *ln)
{
    const uint32_t nl = d->model.n_layers;
    if (ln->handed >= nl)
        return 0;
    const uint32_t next =
        ln->role == ROLE_MEMBER ? d->lanes.lane[ln->pack].next : ln->next; /* enqueued */
    if (!d->lanes.on_ready && ln->handed >= next)
        return 0; /* the window holds only handed-over layers: the lane waits for the GPU */
    if (ln->handed == 0)
        return 1;
    const uint64_t *done = ipc_gsig_done(ln->c->gsig, nl);
    return __atomic_load_n(&done[ln->handed - 1], __ATOMIC_ACQUIRE) >= ln->epoch;
}

/* One pass over a running lane. Returns 1 when something moved. */
static int lane_drive(patd_t *d, patd_lane_t *ln, uint64_t now)
{
    patd_step_t *st = &ln->c->step;
    const uint32_t nl = d->model.n_layers;
    const uint64_t p = kern_lane_progress(ln->phase == LANE_DRAIN ? ln->drain : ln->lane);
    int moved = 0;
    if (ln->phase == LANE_DRAIN) {
        if (p >= ln->target) {
            lane_end(d, ln, now);
            return 1;
        }
        /* the released words are stored again: a client stream that was mid-write may have
         * overwritten one (it writes the same value, but a new epoch's zero may race) */
        release_waits(d, ln);
        if (now - ln->t_cut > 1000000000ull) { /* released words that do not move: the GPU */
            patd_gpu_check_fatal(d, -EIO);     /* exits if the context is lost */
            ln->t_cut = now;
            patd_warn("session %016llx: lane still draining after its waits were released",
                      (unsigned long long)ln->c->session);
        }
        return 0;
    }
    if (p != ln->seen && ln->role != ROLE_MEMBER) {
        ln->seen = p;
        ln->t_moved = now;
        moved = 1;
    }
    uint32_t h = ln->handed;
    count_handed(d, ln, now);
    moved |= h != ln->handed;
    /* the stall clock runs only while the lane waits for its client, not for the GPU */
    if (!waits_for_client(d, ln))
        ln->t_client = 0;
    else if (!ln->t_client)
        ln->t_client = now;
    if (ln->role == ROLE_SOLO && ln->next == nl && p >= kern_lane_enqueued(ln->lane)) {
        lane_end(d, ln, now);
        return 1;
    }
    if (atomic_load(&st->abort)) {
        snprintf(st->why, sizeof(st->why), "aborted (the session is closing or patd drains)");
        atomic_fetch_add(&d->lanes.cut_abort, 1);
        lane_cut(d, ln, -ECANCELED, now);
        return 1;
    }
    const uint64_t limit = (uint64_t)d->cfg.step_timeout_ms * 1000000ull;
    if (now - ln->t_moved > limit) {
        const uint32_t ran = lane_ran(d, ln, p);
        snprintf(st->why, sizeof(st->why),
                 "cut: no layer handed over for %u ms (after %u of %u layers; "
                 "limits.step_timeout_ms)",
                 d->cfg.step_timeout_ms, ran, nl);
        patd_notice("session %016llx: step %llu %s", (unsigned long long)ln->c->session,
                    (unsigned long long)st->id, st->why);
        atomic_fetch_add(&d->lanes.cut_timeout, 1);
        lane_cut(d, ln, -ETIMEDOUT, now);
        return 1;
    }
    if (ln->role == ROLE_MEMBER) /* its pack enqueues its layers and ends it (pack_drive) */
        return moved;
    if (lane_enqueue(d, ln) < 0) {
        snprintf(st->why, sizeof(st->why), "enqueueing a layer failed (the daemon's log says why)");
        lane_cut(d, ln, -EIO, now);
        return 1;
    }
    return moved;
}

/* Every lane is taken and `waiting` steps wait for one: the running step whose client has kept
 * its lane waiting longest, past limits.stall_cut_ms (a session's first step: past
 * limits.first_step_grace_ms), is cut so that a waiting step gets the lane. One per pass, and
 * only while more steps wait than lanes already drain from a cut (each of those is free soon).
 * Returns 1 when it cut one. */
static int cut_stalled(patd_t *d, uint32_t waiting, uint64_t now)
{
    patd_lanes_t *L = &d->lanes;
    const uint64_t cut = (uint64_t)d->cfg.stall_cut_ms * 1000000ull;
    const uint64_t grace = (uint64_t)d->cfg.first_step_grace_ms * 1000000ull;
    if (cut == 0)
        return 0;
    uint32_t draining = 0;
    for (uint32_t i = 0; i < L->n; i++)
        draining += L->lane[i].phase == LANE_DRAIN;
    if (waiting <= draining)
        return 0;
    patd_lane_t *worst = NULL;
    uint64_t worst_idle = 0;
    for (uint32_t i = 0; i < L->n; i++) {
        patd_lane_t *ln = &L->lane[i];
        if (ln->phase != LANE_RUN || !ln->t_client)
            continue;
        const uint64_t idle = now - ln->t_client;
        const uint64_t bound = ln->c->step.id <= 1 ? PAT_MAX(cut, grace) : cut;
        if (idle > bound && idle > worst_idle) {
            worst = ln;
            worst_idle = idle;
        }
    }
    if (!worst)
        return 0;
    patd_step_t *st = &worst->c->step;
    const uint32_t nl = d->model.n_layers;
    snprintf(st->why, sizeof(st->why),
             "cut: no layer handed over for %llu ms (after %u of %u) while %u steps waited for a "
             "lane (limits.stall_cut_ms = %u, gpu.lanes = %u)",
             (unsigned long long)(worst_idle / 1000000ull), worst->handed, nl, waiting,
             d->cfg.stall_cut_ms, L->n);
    patd_notice("session %016llx: step %llu %s", (unsigned long long)worst->c->session,
                (unsigned long long)st->id, st->why);
    atomic_fetch_add(&L->cut_stall, 1);
    lane_cut(d, worst, -ETIMEDOUT, now);
    return 1;
}

/* ------------------------------------------------------------------ cross-session packing */

/* The union plan of a pack's steps (L->xs, rebuilt once per packed step; each member's own
 * forest stays incremental) and its rows' pool slots in L->xslots. Takes pool_mu: the members'
 * block tables are read as their steps reserved them. 0 or a negative errno (sched_build's). */
static int pack_plan(patd_t *d, patd_conn_t **m, uint32_t k, const sched_plan_hdr_t **ret)
{
    patd_lanes_t *L = &d->lanes;
    int rc = 0;
    if (!L->xs) {
        const patd_config_t *cfg = &d->cfg;
        sched_config_t sc =
            patd_sched_config(d, KERN_PACK_MAX * cfg->conn_max_seqs, cfg->conn_max_batch_tokens,
                              (sched_policy_t)sched_policy_parse(cfg->pack_policy));
        if ((rc = sched_create(&sc, &L->xs)) < 0)
            return rc;
        L->xslots = pat_xcalloc(cfg->conn_max_batch_tokens, sizeof(uint32_t));
    }
    sched_forest_t *f = sched_forest(L->xs);
    sched_forest_clear(f);
    uint32_t row = 0, qid = 0;
    pthread_mutex_lock(&d->pool_mu);
    for (uint32_t j = 0; j < k && rc == 0; j++) {
        const patd_step_t *st = &m[j]->step;
        uint32_t tok = 0;
        for (uint32_t i = 0; i < st->n_seqs && rc == 0; i++) {
            kv_seq_info_t info;
            if ((rc = kv_seq_info(d->pool, st->kv[i], &info)) < 0)
                break;
            sched_query_t q = {info.blocks,  info.n_blocks, info.len + st->n_new[i],
                               st->n_new[i], row + tok,     info.version};
            rc = sched_forest_join(f, qid++, &q);
            tok += st->n_new[i];
        }
        memcpy(L->xslots + row, st->kvslot, st->n_tokens * sizeof(uint32_t));
        row += st->n_tokens;
    }
    if (rc == 0)
        rc = sched_build(L->xs, ret);
    pthread_mutex_unlock(&d->pool_mu);
    return rc;
}

/* Begins the steps m[0..k) as one pack on lane `pi`, each member holding lanes[j] for the layers
 * it may have to run alone; where the pack cannot begin, each begins alone. */
static void pack_begin(patd_t *d, uint32_t pi, const uint32_t *lanes, patd_conn_t **m, uint32_t k,
                       uint64_t now)
{
    patd_lanes_t *L = &d->lanes;
    patd_lane_t *pl = &L->lane[pi];
    const uint32_t nl = d->model.n_layers;
    kern_pack_member_t km[KERN_PACK_MAX];
    uint64_t epoch[KERN_PACK_MAX];
    const sched_plan_hdr_t *plan = NULL;
    int rc = pack_plan(d, m, k, &plan);
    uint32_t row = 0;
    for (uint32_t j = 0; j < k; j++) {
        patd_conn_t *c = m[j];
        epoch[j] = atomic_load(&patd_conn_sig(c)->epoch);
        km[j] = (kern_pack_member_t){.q = c->dev_base + c->lay.q_off,
                                     .k = c->dev_base + c->lay.k_off,
                                     .v = c->dev_base + c->lay.v_off,
                                     .o = c->dev_base + c->lay.o_off,
                                     .ready = ipc_gsig_ready(c->gsig),
                                     .done = ipc_gsig_done(c->gsig, nl),
                                     .epoch = epoch[j],
                                     .row_off = row,
                                     .n_tokens = c->step.n_tokens};
        row += c->step.n_tokens;
    }
    if (rc == 0)
        rc = kern_lane_pack_begin(pl->lane, plan, L->xslots, row, km, k,
                                  d->cfg.cross_pack_window_us);
    const uint64_t t_uploaded = pat_now_ns();
    if (rc < 0) {
        patd_gpu_check_fatal(d, rc);
        patd_notice("cross_pack: %u steps of %u rows run alone: %s", k, row, strerror(-rc));
        atomic_fetch_add(&L->pack_fallbacks, 1);
        atomic_fetch_sub(&L->busy, 1); /* the pack's lane stays free */
        for (uint32_t j = 0; j < k; j++)
            lane_begin(d, &L->lane[lanes[j]], m[j], now);
        return;
    }
    *pl = (patd_lane_t){.lane = pl->lane,
                        .phase = LANE_RUN,
                        .role = ROLE_PACK,
                        .base = kern_lane_enqueued(pl->lane),
                        .seen = kern_lane_progress(pl->lane),
                        .t_moved = now,
                        .n_members = k,
                        .live = k};
    for (uint32_t j = 0; j < k; j++) {
        patd_lane_t *ln = &L->lane[lanes[j]];
        m[j]->step.t_uploaded_ns = t_uploaded;
        lane_take(d, ln, m[j], 0, epoch[j], now);
        ln->role = ROLE_MEMBER;
        ln->pack = pi;
        ln->member = j;
        pl->members[j] = lanes[j];
        pl->serials[j] = m[j]->serial;
    }
    atomic_fetch_add(&L->packs, 1);
    atomic_fetch_add(&L->pack_steps, k);
}

/* ln (still a member of pl) did not hand layer `from` over in the pack's window: it runs its
 * layers from there alone on its own lane. */
static void member_leaves(patd_t *d, patd_lane_t *pl, patd_lane_t *ln, uint32_t from, uint64_t now)
{
    patd_step_t *st = &ln->c->step;
    pl->live--;
    atomic_fetch_add(&d->lanes.pack_leaves, 1);
    ln->role = ROLE_SOLO;
    ln->base = kern_lane_enqueued(ln->lane) - from; /* the layers the pack ran count as run */
    ln->seen = kern_lane_progress(ln->lane);
    ln->next = from;
    ln->t_moved = now;
    const int rc = kern_lane_begin(ln->lane, st->plan, st->kvslot, st->n_tokens);
    if (rc < 0) {
        patd_gpu_check_fatal(d, rc);
        snprintf(st->why, sizeof(st->why), "its plan could not be uploaded when it left a pack: %s",
                 strerror(-rc));
        lane_cut(d, ln, -EIO, now);
    }
}

/* The lane of member j of pack pi's lane pl while it is still that member (not reused for another
 * session's step) and its step runs in the pack, else NULL. */
static patd_lane_t *running_member(patd_lanes_t *L, const patd_lane_t *pl, uint32_t pi, uint32_t j)
{
    patd_lane_t *ln = &L->lane[pl->members[j]];
    return ln->phase == LANE_RUN && ln->role == ROLE_MEMBER && ln->pack == pi && ln->member == j &&
                   ln->c && ln->c->serial == pl->serials[j]
               ? ln
               : NULL;
}

/* One pass over a pack's lane: members that left go alone, packed layers are enqueued, and once
 * the last has run the members still in are given back. Returns 1 when something moved. */
static int pack_drive(patd_t *d, uint32_t pi, uint64_t now)
{
    patd_lanes_t *L = &d->lanes;
    patd_lane_t *pl = &L->lane[pi];
    const uint32_t nl = d->model.n_layers, depth = d->cfg.enqueue_depth;
    const uint64_t p = kern_lane_progress(pl->lane); /* first: out[] is written before it */
    int moved = p != pl->seen;
    pl->seen = p;
    const volatile uint32_t *out = kern_lane_pack_out(pl->lane);
    for (uint32_t j = 0; j < pl->n_members; j++) {
        patd_lane_t *ln = running_member(L, pl, pi, j);
        if (!ln)
            continue;
        const uint32_t o = __atomic_load_n(&out[j], __ATOMIC_ACQUIRE);
        if (o) {
            member_leaves(d, pl, ln, o - 1, now);
            moved = 1;
        }
    }
    if ((pl->next == nl || pl->live == 0) && p >= kern_lane_enqueued(pl->lane)) {
        for (uint32_t j = 0; j < pl->n_members; j++) {
            patd_lane_t *ln = running_member(L, pl, pi, j);
            if (ln)
                lane_end(d, ln, now);
        }
        kern_lane_trim(pl->lane);
        pl->phase = LANE_FREE;
        pl->role = ROLE_SOLO;
        atomic_fetch_sub(&L->busy, 1);
        return 1;
    }
    const kern_attn_params_t prm = {.scale = patd_softmax_scale(d), .softcap = d->cfg.softcap};
    while (pl->live && pl->next < nl && kern_lane_enqueued(pl->lane) - p < depth) {
        const uint32_t l = pl->next;
        int rc = kern_lane_pack_layer(pl->lane, l, &prm, reports(l, nl, depth));
        if (rc < 0) {
            patd_gpu_check_fatal(d, rc);
            patd_err("cross_pack: enqueueing packed layer %u failed: %s", l, strerror(-rc));
            for (uint32_t j = 0; j < pl->n_members; j++) {
                patd_lane_t *ln = running_member(L, pl, pi, j);
                if (ln) {
                    snprintf(ln->c->step.why, sizeof(ln->c->step.why),
                             "enqueueing a packed layer failed (the daemon's log says why)");
                    lane_cut(d, ln, -EIO, now);
                }
            }
            return 1;
        }
        if (l == 0) { /* the members' first layers are in this one */
            /* the clock read now, not the pass's: pack_begin may have run in this pass, after it */
            const uint64_t t_enq = pat_now_ns();
            for (uint32_t j = 0; j < pl->n_members; j++) {
                const patd_lane_t *ln = running_member(L, pl, pi, j);
                if (ln)
                    patd_step_started(d, &ln->c->step, t_enq);
            }
        }
        pl->next = l + 1;
        atomic_fetch_add(&L->pack_layers, 1);
        moved = 1;
    }
    return moved;
}

/* The sessions of uid that stepped on lanes in the last PATD_LANES_RECENT_NS. */
static uint32_t recent_peers(const patd_lanes_t *L, uint32_t uid, uint64_t now)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < PATD_LANES_RECENT; i++)
        n += L->recent[i].serial && L->recent[i].uid == uid &&
             now - L->recent[i].t_ns < PATD_LANES_RECENT_NS;
    return n;
}

static void recent_note(patd_lanes_t *L, const patd_conn_t *c, uint64_t now)
{
    uint32_t at = 0;
    for (uint32_t i = 0; i < PATD_LANES_RECENT; i++) {
        if (L->recent[i].serial == c->serial) {
            at = i;
            break;
        }
        if (L->recent[i].t_ns < L->recent[at].t_ns)
            at = i;
    }
    L->recent[at] = (patd_lanes_recent_t){c->serial, now, (uint32_t)c->uid};
}

/* A waiting step that could be packed (cross_pack): prepared, with rows, not asked to stop. */
static int pack_eligible(const patd_t *d, const patd_conn_t *c)
{
    const patd_step_t *st = &c->step;
    return d->cfg.cross_pack && !d->lanes.on_ready && !atomic_load(&st->abort) && st->err == 0 &&
           st->n_tokens > 0;
}

/* Under L->mu: the waiting steps taken into packs this pass (marked), as long as free lanes last
 * (a pack takes one per member and its own). A uid's eligible steps are packed once as many wait
 * as its sessions stepped in the last PATD_LANES_RECENT_NS (2 at least), or once the oldest has
 * waited gpu.cross_pack_wait_us. Returns the lanes used; *ret_n the packs. */
static uint32_t packs_select(patd_t *d, uint32_t n_free, uint64_t now, uint32_t *ret_n)
{
    patd_lanes_t *L = &d->lanes;
    const uint32_t max_rows = d->cfg.conn_max_batch_tokens;
    const uint64_t wait_ns = (uint64_t)d->cfg.cross_pack_wait_us * 1000ull;
    uint32_t used = 0, np = 0;
    for (uint32_t i = 0; i < L->n_wait; i++) {
        patd_conn_t *c = L->wait[i];
        if (L->mark[i] || !pack_eligible(d, c))
            continue;
        patd_conn_t **g = L->pk_conn + (uint64_t)np * KERN_PACK_MAX;
        /* as many as stepped lately (its uid's sessions), 2 at least */
        uint32_t k = 0, rows = 0,
                 want = PAT_MAX(2u, PAT_MIN(KERN_PACK_MAX, recent_peers(L, (uint32_t)c->uid, now)));
        uint32_t idx[KERN_PACK_MAX];
        for (uint32_t j = i; j < L->n_wait && k < KERN_PACK_MAX; j++) {
            patd_conn_t *x = L->wait[j];
            if (L->mark[j] || x->uid != c->uid || !pack_eligible(d, x) ||
                rows + x->step.n_tokens > max_rows)
                continue;
            idx[k] = j;
            g[k++] = x;
            rows += x->step.n_tokens;
        }
        if (k < 2 || n_free - used < k + 1)
            continue;
        if (k < want && now - c->step.t_lane_ns < wait_ns)
            continue; /* more of its pack may come */
        for (uint32_t j = 0; j < k; j++)
            L->mark[idx[j]] = 1;
        L->pk_n[np++] = k;
        used += k + 1;
    }
    *ret_n = np;
    return used;
}

/* ------------------------------------------------------------------ the thread */

static void nap(patd_lanes_t *L, uint32_t seen, uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, &L->kick, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
}

/* n more lanes taken (the lane thread's only writer of busy_max) */
static void busy_add(patd_lanes_t *L, uint32_t n)
{
    const uint32_t b = atomic_fetch_add(&L->busy, n) + n;
    if (b > atomic_load(&L->busy_max))
        atomic_store(&L->busy_max, b);
}

static void *lanes_main(void *arg)
{
    patd_t *d = arg;
    patd_lanes_t *L = &d->lanes;
    pthread_setname_np(pthread_self(), "patd-lanes");
    /* naps of tens of microseconds: the default 50 us timer slack would triple them */
    prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
    uint64_t t_last_move = pat_now_ns();
    for (;;) {
        const uint32_t seen = atomic_load(&L->kick);
        atomic_fetch_add(&L->beat, 1);
        atomic_fetch_add(&L->polls, 1);
        uint64_t now = pat_now_ns();
        int moved = 0;

        /* waiting steps: the aborted ones leave, the first ones take the free lanes (taken off
         * the queue under its lock, begun outside it: the plan upload is CUDA calls) */
        uint32_t n_free = 0, n_take = 0, n_gone = 0;
        for (uint32_t i = 0; i < L->n; i++)
            if (L->lane[i].phase == LANE_FREE)
                L->free_idx[n_free++] = i;
        pthread_mutex_lock(&L->mu);
        const int stop = L->stop;
        pat_grow((void **)&L->gone, &L->cap_gone, L->n_wait, sizeof(*L->gone));
        pat_grow((void **)&L->mark, &L->cap_mark, L->n_wait, sizeof(*L->mark));
        memset(L->mark, 0, L->n_wait);
        uint32_t n_packs = 0;
        uint32_t used = d->cfg.cross_pack ? packs_select(d, n_free, now, &n_packs) : 0;
        uint32_t keep = 0, holding = 0;
        const uint64_t wait_ns = (uint64_t)d->cfg.cross_pack_wait_us * 1000ull;
        for (uint32_t i = 0; i < L->n_wait; i++) {
            patd_conn_t *c = L->wait[i];
            if (L->mark[i])
                continue; /* in a pack */
            if (atomic_load(&c->step.abort))
                L->gone[n_gone++] = c;
            else if (pack_eligible(d, c) && now - c->step.t_lane_ns < wait_ns &&
                     recent_peers(L, (uint32_t)c->uid, now) >= 2) {
                L->wait[keep++] = c; /* a pack may form with its uid's next steps */
                holding = 1;
            } else if (used < n_free) {
                L->take[n_take++] = c;
                used++;
            } else
                L->wait[keep++] = c;
        }
        L->n_wait = keep;
        const uint32_t waiting = keep;
        atomic_store(&L->waiting, waiting);
        pthread_mutex_unlock(&L->mu);
        for (uint32_t i = 0; i < n_gone; i++)
            give_back_unstarted(d, L->gone[i], -ECANCELED);
        uint32_t fi = 0;
        for (uint32_t p = 0; p < n_packs; p++) {
            const uint32_t k = L->pk_n[p];
            patd_conn_t **m = L->pk_conn + (uint64_t)p * KERN_PACK_MAX;
            busy_add(L, k + 1);
            const uint32_t pi = L->free_idx[fi++];
            for (uint32_t j = 0; j < k; j++) {
                L->pk_lane[j] = L->free_idx[fi++];
                recent_note(L, m[j], now);
            }
            pack_begin(d, pi, L->pk_lane, m, k, now);
        }
        for (uint32_t i = 0; i < n_take; i++) {
            busy_add(L, 1);
            if (d->cfg.cross_pack)
                recent_note(L, L->take[i], now);
            lane_begin(d, &L->lane[L->free_idx[fi++]], L->take[i], now);
        }
        moved |= n_gone || n_take || n_packs;

        uint32_t running = 0;
        for (uint32_t i = 0; i < L->n; i++)
            if (L->lane[i].phase != LANE_FREE) {
                moved |= L->lane[i].role == ROLE_PACK ? pack_drive(d, i, now)
                                                      : lane_drive(d, &L->lane[i], now);
                running += L->lane[i].phase != LANE_FREE;
            }
        if (waiting && running == L->n)
            moved |= cut_stalled(d, waiting, now); /* the short nap: a lane frees soon */
        if (stop && running == 0)
            break;

        if (moved)
            t_last_move = now;
        if (running == 0 && waiting == 0) {
            /* the next step of a frontend that just ended one comes within a millisecond or so:
             * the wake-up from a futex sleep would cost it tens of microseconds of its start */
            if (now - t_last_move < PATD_LANES_SPIN_NS &&
                pat_spin_while_eq(&L->kick, seen, t_last_move + PATD_LANES_SPIN_NS))
                continue;
            nap(L, seen, PATD_LANES_IDLE_NS);
        } else if (holding && !moved)
            nap(L, seen, PATD_LANES_POLL_NS); /* a held step's wait ends soon */
        else if (!moved)
            /* poll at PATD_LANES_POLL_NS while anything moved in the last 10 ms, then at 1 ms */
            nap(L, seen, now - t_last_move < 10000000ull ? PATD_LANES_POLL_NS : 1000000ull);
    }
    return NULL;
}

int patd_lanes_start(patd_t *d, uint32_t n)
{
    patd_lanes_t *L = &d->lanes;
    L->lane = pat_xcalloc(n, sizeof(*L->lane));
    for (uint32_t i = 0; i < n; i++) {
        int rc = kern_lane_create(d->be, &L->lane[i].lane);
        if (rc == -ENOMEM && i > 0) {
            patd_warn("cuda: %u lanes of the %u asked for (gpu.lanes): no device memory for more",
                      i, n);
            break;
        }
        if (rc < 0) {
            patd_err("cuda: lane %u: %s%s", i, strerror(-rc),
                     rc == -ENOTSUP ? " (the device has no 64-bit stream memory operations)" : "");
            return rc;
        }
        L->n = i + 1;
    }
    L->on_ready = !strcmp(d->cfg.enqueue, "on_ready");
    L->free_idx = pat_xcalloc(L->n, sizeof(*L->free_idx));
    L->take = pat_xcalloc(L->n, sizeof(*L->take));
    L->pk_lane = pat_xcalloc(KERN_PACK_MAX, sizeof(*L->pk_lane));
    L->pk_conn = pat_xcalloc((uint64_t)L->n * KERN_PACK_MAX, sizeof(*L->pk_conn));
    L->pk_n = pat_xcalloc(L->n, sizeof(*L->pk_n));
    if (d->cfg.cross_pack && L->on_ready)
        patd_warn("gpu.cross_pack needs gpu.enqueue = ahead: every step runs alone");
    pthread_mutex_init(&L->mu, NULL);
    int rc = pthread_create(&L->thread, NULL, lanes_main, d);
    if (rc) {
        patd_err("lane thread: %s", strerror(rc));
        return -rc;
    }
    L->started = 1;
    return 0;
}

void patd_lanes_stop(patd_t *d)
{
    patd_lanes_t *L = &d->lanes;
    if (L->started) {
        pthread_mutex_lock(&L->mu);
        L->stop = 1;
        pthread_mutex_unlock(&L->mu);
        lanes_wake(L);
        pthread_join(L->thread, NULL);
        pthread_mutex_destroy(&L->mu);
        L->started = 0;
    }
    for (uint32_t i = 0; i < L->n; i++)
        kern_lane_free(L->lane[i].lane);
    free(L->lane);
    free(L->wait);
    free(L->gone);
    free(L->take);
    free(L->free_idx);
    free(L->mark);
    free(L->pk_lane);
    free(L->pk_conn);
    free(L->pk_n);
    free(L->xslots);
    sched_free(L->xs);
    memset(L, 0, sizeof(*L));
}
