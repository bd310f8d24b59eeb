/*
 * patd_conn.c — sessions: HELLO (model signature, quotas, staging buffer, liveness watch), the
 * session's sequence table, and reclaim when a client says BYE, dies (its pidfd becomes
 * readable) or lets its lease expire.
 *
 * Reclaim is all-or-nothing and never waits on the client: if the session's step is with an
 * executor, the step is told to abort (its wait on the ready word is woken) and the reclaim
 * finishes when the executor gives the step back (patd_step_complete), typically within one
 * wait slice (50 ms). Everything the session held goes: sequences (their block references),
 * the forest and plan arena, the staging buffer, the pidfd watch. A session is bound to its
 * process at HELLO, which only the admin socket serves (conn_attach), not by the HELLO's
 * claimed pid. HELLO is where patd's limits are enforced: limits.max_conns and a uid's
 * limits.conns_per_uid (-EMFILE), the per-session quotas (-EDQUOT), the staging budget
 * (limits.staging_mb, every backend: -ENOBUFS, its own code, so a frontend is never told that
 * the KV pool is full when staging is) and, under a cgroup memory limit, the memory left below
 * it (patd_memcg.c: -ENOMEM). Every refusal's text names the option that refused it and the
 * numbers; the refusals of a shared limit are logged, at most a line a second per cause
 * (patd_refused).
 *
 * Thread context: the loop thread.
 */
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

patd_conn_t *patd_conn_find(patd_t *d, uint64_t session)
{
    for (uint32_t i = 0; i < d->n_conns; i++)
        if (d->conns[i]->session == session)
            return d->conns[i];
    return NULL;
}

static void client_died(patd_conn_t *c)
{
    patd_notice("session %016llx: client pid %d exited", (unsigned long long)c->session,
                (int)c->pid);
    atomic_fetch_add(&c->d->m.reclaims_dead, 1);
    patd_conn_close(c, "client died");
}

static void on_pidfd(uv_poll_t *h, int status, int events)
{
    client_died(h->data);
}

void patd_conn_wire_lost(patd_conn_t *c)
{
    if (c->closing)
        return;
    struct pollfd p = {c->pidfd, POLLIN, 0};
    if (c->pidfd >= 0 && poll(&p, 1, 0) == 1)
        client_died(c); /* its exit, which the loop had not read yet */
    else
        patd_conn_close(c, "its control connection closed");
}

static const struct {
    const char *what, *limit;
} refusals[] = {
#define PATD_REFUSAL_ROW(id, what, limit) {what, limit},
    PATD_REFUSALS(PATD_REFUSAL_ROW)
#undef PATD_REFUSAL_ROW
};

void patd_refused(patd_t *d, patd_refusal_t cause, const char *fmt, ...)
{
    char detail[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    patd_log_limited(&d->refused_log[cause], PATD_LOG_WARNING, "refused %s (%s): %s",
                     refusals[cause].what, refusals[cause].limit, detail);
}

/* The sessions uid holds against limits.conns_per_uid. */
static uint32_t uid_sessions(const patd_t *d, uid_t uid)
{
    uint32_t held = 0;
    for (uint32_t i = 0; i < d->n_conns; i++)
        held += d->conns[i]->attached && !d->conns[i]->closing && d->conns[i]->uid == uid;
    return held;
}

/* Whether `bytes` more staging fit limits.staging_mb and, for the host memory (`host` bytes) a
 * HELLO commits, under the cgroup's memory limit with limits.memory_headroom_mb to spare: 0,
 * -ENOBUFS (the staging budget) or -ENOMEM (the cgroup's memory) with the numbers, and the
 * refusal logged. */
static int staging_admit(patd_t *d, const struct ucred *who, uint64_t bytes, uint64_t host,
                         char *why, size_t why_len)
{
    const patd_config_t *cfg = &d->cfg;
    const uint64_t budget = (uint64_t)cfg->staging_mb << 20;
    if (bytes > budget || d->staging_used > budget - bytes) {
        snprintf(why, why_len,
                 "staging of %llu bytes does not fit limits.staging_mb (%u MiB = %llu bytes): "
                 "%llu in use by %u sessions",
                 (unsigned long long)bytes, cfg->staging_mb, (unsigned long long)budget,
                 (unsigned long long)d->staging_used, d->n_conns);
        patd_refused(d, PATD_REFUSED_STAGING, "%s; uid %u pid %d", why, (unsigned)who->uid,
                     (int)who->pid);
        return -ENOBUFS;
    }
    patd_memcg_t mc;
    const uint64_t headroom = (uint64_t)cfg->memory_headroom_mb << 20;
    if (patd_memcg_room(&mc) == 0 && (mc.room < headroom || mc.room - headroom < host)) {
        snprintf(why, why_len,
                 "staging of %llu bytes does not fit the memory cgroup's limit less "
                 "limits.memory_headroom_mb (%u MiB): %llu of %llu bytes in use (%s)",
                 (unsigned long long)host, cfg->memory_headroom_mb, (unsigned long long)mc.used,
                 (unsigned long long)mc.limit, mc.path);
        patd_refused(d, PATD_REFUSED_MEMORY, "%s; uid %u pid %d", why, (unsigned)who->uid,
                     (int)who->pid);
        return -ENOMEM;
    }
    return 0;
}

/* What a HELLO from cr asks for, checked against the daemon's state, its limits, its model and
 * the quotas: 0 with the session's staging layout and sequence quota, or a negative errno with
 * why. No resource is taken. */
static int hello_validate(patd_t *d, const ipc_hello_req_t *r, const struct ucred *cr,
                          ipc_layout_t *ret_lay, uint32_t *ret_max_seqs, char *why, size_t why_len)
{
    const patd_config_t *cfg = &d->cfg;
    const kern_model_t *m = &d->model;
#define WHY(...) snprintf(why, why_len, __VA_ARGS__)
    if (d->draining) {
        WHY("daemon is draining; no new sessions");
        return -ESHUTDOWN;
    }
    if (d->n_conns >= cfg->max_conns) {
        WHY("%u sessions open (limits.max_conns %u)", d->n_conns, cfg->max_conns);
        patd_refused(d, PATD_REFUSED_MAX_CONNS, "%s; uid %u pid %d", why, (unsigned)cr->uid,
                     (int)cr->pid);
        return -EMFILE;
    }
    const uint32_t held = cfg->conns_per_uid ? uid_sessions(d, cr->uid) : 0;
    if (cfg->conns_per_uid && held >= cfg->conns_per_uid) {
        WHY("uid %u holds %u sessions (limits.conns_per_uid %u)", (unsigned)cr->uid, held,
            cfg->conns_per_uid);
        patd_refused(d, PATD_REFUSED_PER_UID, "%s; pid %d", why, (int)cr->pid);
        return -EMFILE;
    }
    const ipc_model_sig_t *s = &r->model;
    if (s->n_layers != m->n_layers || s->q_heads != m->q_heads || s->kv_heads != m->kv_heads ||
        s->head_dim != m->head_dim || s->dtype != (uint32_t)m->dtype ||
        s->block_size != m->block_size || s->model_id != cfg->model_id) {
        WHY("model signature mismatch: client layers=%u q_heads=%u kv_heads=%u head_dim=%u "
            "dtype=%u block=%u id=%llu; daemon layers=%u q_heads=%u kv_heads=%u head_dim=%u "
            "dtype=%u block=%u id=%llu",
            s->n_layers, s->q_heads, s->kv_heads, s->head_dim, s->dtype, s->block_size,
            (unsigned long long)s->model_id, m->n_layers, m->q_heads, m->kv_heads, m->head_dim,
            (unsigned)m->dtype, m->block_size, (unsigned long long)cfg->model_id);
        return -EMEDIUMTYPE;
    }
    const uint32_t kv_want = (r->flags & IPC_HELLO_KV_MASK) >> IPC_HELLO_KV_SHIFT;
    if (kv_want && kv_want != (uint32_t)kern_kv_dtype(m)) {
        WHY("the client needs a KV pool of %s; this daemon's holds %s (model.kv_dtype)",
            patd_dtype_name(kv_want), patd_dtype_name((uint32_t)kern_kv_dtype(m)));
        return -EMEDIUMTYPE;
    }
    if (r->buffer_kind == IPC_BUF_CUDA && !d->gpu) {
        WHY("buffer kind cuda needs the cuda backend; this daemon runs %s",
            kern_backend_name(d->be));
        return -EINVAL;
    }
    if (r->buffer_kind == IPC_BUF_SHM && d->gpu) {
        WHY("buffer kind shm needs the cpu backend; this daemon serves GPU sessions (cuda): "
            "connect from a process with CUDA");
        return -EINVAL;
    }
    if (r->buffer_kind > IPC_BUF_CUDA) {
        WHY("unknown buffer kind %u", r->buffer_kind);
        return -EINVAL;
    }
    uint32_t max_seqs = r->max_seqs ? r->max_seqs : cfg->conn_max_seqs;
    if (max_seqs > cfg->conn_max_seqs) {
        WHY("max_seqs %u exceeds the per-session quota limits.conn_max_seqs (%u)", r->max_seqs,
            cfg->conn_max_seqs);
        return -EDQUOT;
    }
    if (r->max_batch_tokens > cfg->conn_max_batch_tokens) {
        WHY("max_batch_tokens %u exceeds the per-session quota limits.conn_max_batch_tokens (%u)",
            r->max_batch_tokens, cfg->conn_max_batch_tokens);
        return -EDQUOT;
    }
    ipc_layout_t lay;
    if (ipc_layout_compute(r->max_batch_tokens, m->q_heads, m->kv_heads, m->head_dim,
                           kern_dtype_size(m->dtype), &lay) < 0 ||
        lay.bytes > ((uint64_t)cfg->conn_max_staging_mb << 20)) {
        WHY("staging buffers of %u tokens need %llu bytes; the per-session quota "
            "limits.conn_max_staging_mb is %u MiB",
            r->max_batch_tokens, (unsigned long long)lay.bytes, cfg->conn_max_staging_mb);
        return -EDQUOT;
    }
    if (r->pid == 0 || r->pid > (uint32_t)INT32_MAX) {
        WHY("pid %u is not a process id", r->pid);
        return -EINVAL;
    }
    /* the host memory the HELLO commits: a cpu session's whole buffer; a GPU session's signal
     * slice (its rows are device memory) */
    int rc = staging_admit(d, cr, lay.bytes, d->gpu ? ipc_gsig_bytes(m->n_layers) : lay.bytes, why,
                           why_len);
    if (rc < 0)
        return rc;
    *ret_lay = lay;
    *ret_max_seqs = max_seqs;
    return 0;
}

sched_config_t patd_sched_config(const patd_t *d, uint32_t max_queries, uint32_t max_tokens,
                                 sched_policy_t policy)
{
    const kern_model_t *m = &d->model;
    return (sched_config_t){.max_queries = max_queries,
                            .max_tokens = max_tokens,
                            .block_size = m->block_size,
                            .q_heads = m->q_heads,
                            .kv_heads = m->kv_heads,
                            .head_dim = m->head_dim,
                            .kv_elt_bytes = kern_dtype_size(kern_kv_dtype(m)),
                            .q_elt_bytes = kern_dtype_size(m->dtype),
                            .split_min_kv = 256,
                            .max_partials = PATD_MAX_PARTIALS(&d->cfg),
                            .invariant_chunk = d->cfg.invariant ? d->cfg.invariant_chunk : 0,
                            .tiles = &d->tiles,
                            .policy = policy};
}

/* Builds the session: liveness watch, sequence table, scheduler, staging buffer (cpu) or signal
 * slice and staging range (GPU), and enters it in the table. 0 with the session and its buffer's
 * name, or a negative errno with why and nothing left behind. */
static int conn_create(patd_t *d, const ipc_hello_req_t *r, const ipc_layout_t *lay,
                       uint32_t max_seqs, patd_conn_t **ret_c, char name[IPC_NAME_LEN], char *why,
                       size_t why_len)
{
    const patd_config_t *cfg = &d->cfg;
    const kern_model_t *m = &d->model;
    /* the pid in the HELLO is the client's word: it is only logged. The pid watched is the one
     * the kernel names on the admin socket (conn_attach, right after) */

    patd_conn_t *c = pat_xcalloc(1, sizeof(*c));
    c->d = d;
    /* the instance in the top half (a restart is told apart), 32 random bits below: ids are not
     * a counter one session could count its neighbours' from */
    c->serial = ++d->next_session;
    do {
        uint32_t low = 0;
        if (getrandom(&low, sizeof(low), 0) != sizeof(low))
            low = (uint32_t)(pat_now_ns() * 0x9e3779b97f4a7c15ull >> 32);
        c->session = (d->instance & 0xffffffff00000000ull) | low;
    } while ((uint32_t)c->session == 0 || patd_conn_find(d, c->session));
    while (c->key == 0) /* the capability: never logged, listed or published */
        if (getrandom(&c->key, sizeof(c->key), 0) != sizeof(c->key))
            c->key = pat_now_ns() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)c;
    c->pid = (pid_t)r->pid;
    c->pidfd = -1;
    uint32_t lease_ms = r->lease_ms ? r->lease_ms : cfg->lease_ms;
    lease_ms = PAT_MIN(PAT_MAX(lease_ms, 100u), cfg->max_lease_ms); /* a lease has bounds */
    c->lease_ns = (uint64_t)lease_ms * 1000000;
    c->last_seen_ns = c->opened_ns = pat_now_ns();
    memcpy(c->label, r->label, sizeof(c->label));
    c->max_seqs = max_seqs;
    c->max_batch_tokens = r->max_batch_tokens;
    c->max_blocks = cfg->conn_max_blocks ? cfg->conn_max_blocks : cfg->blocks;
    c->lay = *lay;
    c->seqs = pat_xcalloc(max_seqs, sizeof(patd_seq_t));
    for (uint32_t i = 0; i < max_seqs; i++) {
        c->seqs[i].kv = KV_NONE;
        c->seqs[i].forest_kv = KV_NONE;
    }
    c->blk_refs = pat_xcalloc(cfg->blocks, sizeof(uint32_t)); /* 4 bytes per pool block */
    pat_map_init(&c->seq_map, max_seqs);
    c->next_tick = 1;

    int rc;
    sched_config_t sc = patd_sched_config(
        d, max_seqs, r->max_batch_tokens,
        (r->flags & IPC_HELLO_PACK_MASK) ? (sched_policy_t)((r->flags & IPC_HELLO_PACK_MASK) - 1)
                                         : (sched_policy_t)sched_policy_parse(cfg->pack_policy));
    if ((rc = sched_create(&sc, &c->sched)) < 0) {
        WHY("scheduler: %s", strerror(-rc));
        goto fail;
    }
    if (d->gpu) {
        name[0] = 0; /* the signal slice's and the staging's fds come beside the HELLO reply */
        if ((rc = patd_gpu_conn_open(d, c, lay->bytes)) < 0) {
            if (rc == -ENOSPC) { /* the rounded-up allocation is what counts */
                WHY("staging rows of %u tokens (%llu bytes, more at the driver's granularity) "
                    "do not fit limits.staging_mb (%u MiB): %llu bytes in use by %u sessions",
                    r->max_batch_tokens, (unsigned long long)lay->bytes, cfg->staging_mb,
                    (unsigned long long)d->staging_used, d->n_conns);
                patd_refused(d, PATD_REFUSED_STAGING, "%s", why);
                rc = -ENOBUFS; /* the staging budget's own code, as staging_admit's */
            } else if (rc == -ENOMEM)
                WHY("staging rows of %u tokens (%llu bytes) or the signal slice: no free memory "
                    "left on the GPU or the host",
                    r->max_batch_tokens, (unsigned long long)lay->bytes);
            else
                WHY("staging allocation: %s", strerror(-rc));
            goto fail;
        }
    } else {
        /* a sealed memfd, no name: it reaches its one client by fd beside the HELLO reply */
        name[0] = 0;
        if ((rc = ipc_shm_create_memfd(&c->shm, lay->bytes, m->n_layers)) < 0) {
            WHY("staging buffer (%llu bytes): %s", (unsigned long long)lay->bytes, strerror(-rc));
            rc = -ENOMEM;
            goto fail;
        }
        d->staging_used += c->shm.bytes; /* given back in patd_conn_reap */
    }

    pat_grow((void **)&d->conns, &d->cap_conns, d->n_conns + 1, sizeof(*d->conns));
    c->idx = d->n_conns;
    d->conns[d->n_conns++] = c;
    atomic_fetch_add(&d->m.conns_opened, 1);
    *ret_c = c;
    return 0;
fail:
    sched_free(c->sched);
    pat_map_done(&c->seq_map);
    patd_seq_free_all(c);
    free(c);
    return rc;
#undef WHY
}

/* The HELLO answer: the session, its quotas and where its buffers are. */
static void hello_reply(const patd_t *d, const patd_conn_t *c, const char *name,
                        ipc_hello_rep_t *rep)
{
    memset(rep, 0, sizeof(*rep));
    rep->session = c->session;
    rep->daemon_pid = (uint32_t)getpid();
    rep->lease_ms = (uint32_t)(c->lease_ns / 1000000);
    rep->max_seqs = c->max_seqs;
    rep->max_batch_tokens = c->max_batch_tokens;
    rep->max_blocks = c->max_blocks;
    rep->buffer_kind = d->gpu ? IPC_BUF_CUDA : IPC_BUF_SHM;
    rep->buf_bytes = c->lay.bytes;
    if (d->gpu) {
        rep->buf_bytes = c->gsig_share.map_bytes;
        rep->dev_map_bytes = c->share.map_bytes;
        rep->dev_bytes = c->lay.bytes;
        rep->sig_bytes = c->gsig_share.map_bytes;
        memcpy(rep->dev_uuid, d->dev_uuid, sizeof(rep->dev_uuid));
        rep->mps = (uint32_t)d->mps;
    }
    rep->kv_dtype = (uint32_t)kern_kv_dtype(&d->model);
    rep->kv_scale = kern_kv_scale(&d->model);
    rep->sig_off = d->gpu ? 0 : c->lay.sig_off;
    rep->q_off = c->lay.q_off;
    rep->k_off = c->lay.k_off;
    rep->v_off = c->lay.v_off;
    rep->o_off = c->lay.o_off;
    rep->instance = d->instance;
    rep->start_unix_s = (uint32_t)d->t_start_unix;
    rep->key = c->key;
    snprintf(rep->shm_name, sizeof(rep->shm_name), "%s", name);
}

static void conn_attach(patd_t *d, patd_conn_t *c, const struct ucred *cr);

int patd_conn_hello(patd_t *d, const ipc_hello_req_t *r, const struct ucred *cr,
                    ipc_hello_rep_t *rep, char *why, size_t why_len)
{
    ipc_layout_t lay;
    uint32_t max_seqs;
    patd_conn_t *c;
    char name[IPC_NAME_LEN];
    int rc = hello_validate(d, r, cr, &lay, &max_seqs, why, why_len);
    if (rc == 0)
        rc = conn_create(d, r, &lay, max_seqs, &c, name, why, why_len);
    if (rc < 0)
        return rc;
    conn_attach(d, c, cr);
    hello_reply(d, c, name, rep);
    patd_info("session %016llx: up, pid %u (claimed) '%s', %u seqs, %u batch tokens",
              (unsigned long long)c->session, r->pid, c->label, max_seqs, r->max_batch_tokens);
    return 0;
}

static void free_conn(patd_conn_t *c)
{
    patd_step_done(&c->step);
    free(c->last_reply);
    free(c);
}

static void on_poll_closed(uv_handle_t *h)
{
    free_conn(h->data);
}

void patd_conn_reap(patd_conn_t *c)
{
    patd_t *d = c->d;
    uint64_t t0 = pat_now_ns();
    assert(!patd_step_busy(&c->step)); /* back and reset: no post may outlive c */
    patd_exec_forget(&d->exec, c);
    uint32_t closed;
    patd_seq_close_all(d, c, &closed);
    sched_free(c->sched);
    pat_map_done(&c->seq_map);
    patd_seq_free_all(c);
    d->staging_used -= c->shm.bytes; /* a cpu session's (0 on a GPU session) */
    ipc_shm_close(&c->shm);
    patd_gpu_conn_close(d, c);
    /* out of the table: swap with the last */
    d->conns[c->idx] = d->conns[d->n_conns - 1];
    d->conns[c->idx]->idx = c->idx;
    d->n_conns--;
    atomic_fetch_add(&d->m.conns_closed, 1);
    uint64_t dt = pat_now_ns() - c->opened_ns;
    patd_info("session %016llx: down (%s) after %.1f s; reclaimed %u sequences",
              (unsigned long long)c->session, c->close_reason, dt / 1e9, closed);
    patd_wire_event(d, PATD_SCOPE_UID(c->uid), "conn down %016llx reason=%s",
                    (unsigned long long)c->session, c->close_reason);
    if (c->bye_req.wire) {
        ipc_buf_t b;
        ipc_buf_init(&b);
        ipc_frame_start(&b, IPC_OP_BYE, IPC_F_REPLY, c->bye_req.hdr.corr, c->session);
        ipc_frame_finish(&b);
        patd_send(d, &c->bye_req, b.data, b.len);
        ipc_buf_done(&b);
    }
    /* after BYE's answer: anything else its control connection still waits for is refused */
    patd_wire_session_gone(d, c, c->close_reason);
    uint64_t rt = pat_now_ns() - t0;
    atomic_store(&d->m.reclaim_ns_last, rt);
    if (rt > atomic_load(&d->m.reclaim_ns_max))
        atomic_store(&d->m.reclaim_ns_max, rt);
    if (c->pid_poll_on) {
        close(c->pidfd);
        uv_close((uv_handle_t *)&c->pid_poll, on_poll_closed);
    } else {
        free_conn(c);
    }
}

void patd_conn_close(patd_conn_t *c, const char *reason)
{
    if (c->closing)
        return;
    c->closing = 1;
    c->close_reason = reason;
    if (c->pid_poll_on)
        uv_poll_stop(&c->pid_poll);
    ipc_sig_t *g = patd_conn_sig(c);
    atomic_store(&g->err, -ESHUTDOWN);
    ipc_sig_post(&g->state, IPC_STATE_CLOSED);
    ipc_sig_wake(&g->done);
    if (patd_step_cancel(c))
        return; /* with an executor: reaped once patd_step_complete reports it back */
    patd_conn_reap(c);
}

/* Binds a new session to the connecting process, as the kernel names it on the admin socket
 * (cr), and watches that pid. */
static void conn_attach(patd_t *d, patd_conn_t *c, const struct ucred *cr)
{
    c->attached = 1;
    c->uid = cr->uid;
    c->pid = cr->pid;
    int pidfd = ipc_pidfd_open((int)cr->pid);
    if (pidfd >= 0 && !strcmp(d->cfg.liveness, "lease")) {
        close(pidfd);
        pidfd = -EPERM; /* the operator asked for leases only */
    }
    c->last_seen_ns = pat_now_ns();
    if (pidfd >= 0) {
        c->pidfd = pidfd;
        uv_poll_init(&d->loop, &c->pid_poll, c->pidfd);
        c->pid_poll.data = c;
        uv_poll_start(&c->pid_poll, UV_READABLE, on_pidfd);
        c->pid_poll_on = 1;
    } else {
        patd_notice("session %016llx: cannot watch pid %d (%s); lease of %llu ms applies",
                    (unsigned long long)c->session, (int)cr->pid, strerror(-pidfd),
                    (unsigned long long)(c->lease_ns / 1000000));
    }
    patd_info("session %016llx: attached by pid %d uid %u, %s liveness",
              (unsigned long long)c->session, (int)cr->pid, (unsigned)cr->uid,
              c->pidfd >= 0 ? "pidfd" : "lease");
    patd_wire_event(d, PATD_SCOPE_UID(c->uid), "conn up %016llx pid=%d label=%s",
                    (unsigned long long)c->session, (int)cr->pid, c->label);
}

void patd_conns_tick(patd_t *d, uint64_t now)
{
    for (uint32_t i = 0; i < d->n_conns; i++) {
        patd_conn_t *c = d->conns[i];
        if (c->closing)
            continue;
        if (c->pidfd >= 0)
            continue;
        /* a step in flight counts as activity: the executor watches it */
        if (patd_step_busy(&c->step))
            continue;
        if (now - c->last_seen_ns > c->lease_ns) {
            patd_notice("session %016llx: lease of %llu ms expired", (unsigned long long)c->session,
                        (unsigned long long)(c->lease_ns / 1000000));
            atomic_fetch_add(&d->m.reclaims_lease, 1);
            patd_conn_close(c, "lease expired");
            i = (uint32_t)-1; /* the table changed (reap swaps); rescan */
        }
    }
}
