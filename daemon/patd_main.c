/*
 * patd_main.c — the patd process: configuration, the pool and backend, the nanomsg sockets on a
 * libuv loop, request dispatch, signals, systemd notification and the drain on exit.
 *
 * Requests arrive on a raw REP socket (AF_SP_RAW), so a reply can be sent later from the loop
 * with the request's routing header: STEP_BEGIN is answered once an executor has reserved and
 * packed, STEP_END once the executor has given the step back, without blocking other clients.
 * Every frame is validated (ipc_frame_check, ipc_body_check) before it is looked at; every
 * refusal is an error reply with a specific code and changes nothing. The last reply of each
 * session is kept so that a resent request (REQ retries, same correlation id) gets the same
 * answer instead of being applied twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/pubsub.h>
#include <nanomsg/reqrep.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

#define TICK_MS 100u

/* ------------------------------------------------------------------ sending */
void patd_send(patd_t *d, patd_req_t *to, const void *frame, size_t len)
{
    if (!to->ctl)
        return;
    void *msg = nn_allocmsg(len, 0);
    if (!msg) {
        nn_freemsg(to->ctl);
        to->ctl = NULL;
        return;
    }
    memcpy(msg, frame, len);
    struct nn_iovec iov = {&msg, NN_MSG};
    struct nn_msghdr mh = {&iov, 1, &to->ctl, NN_MSG};
    if (nn_sendmsg(d->rep, &mh, NN_DONTWAIT) < 0) {
        patd_warn("reply to %s dropped: %s", ipc_op_name(to->hdr.opcode), nn_strerror(nn_errno()));
        nn_freemsg(msg);
        nn_freemsg(to->ctl);
    }
    to->ctl = NULL;
}

/* Sends and, for a session's request, keeps the frame for a resent request. */
static void reply_frame(patd_t *d, patd_conn_t *c, patd_req_t *to, ipc_buf_t *b)
{
    if (c && !c->closing) {
        free(c->last_reply);
        c->last_reply = pat_xmalloc(b->len);
        memcpy(c->last_reply, b->data, b->len);
        c->last_reply_len = b->len;
        c->last_corr = to->hdr.corr;
    }
    patd_send(d, to, b->data, b->len);
}

void patd_reply_error(patd_t *d, patd_req_t *to, int code, const char *fmt, ...)
{
    char msg[IPC_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_frame_error(&b, &to->hdr, code, "%s", msg);
    patd_metrics_error(d, code);
    patd_debug("%s refused: %s (%s)", ipc_op_name(to->hdr.opcode),
               ipc_err_name(code) ? ipc_err_name(code) : "?", msg);
    patd_send(d, to, b.data, b.len);
    ipc_buf_done(&b);
}

static void reply_ok(patd_t *d, patd_conn_t *c, patd_req_t *to, const void *body, size_t len)
{
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_frame_start(&b, to->hdr.opcode, IPC_F_REPLY, to->hdr.corr, to->hdr.session);
    ipc_frame_put(&b, body, len);
    ipc_frame_finish(&b);
    reply_frame(d, c, to, &b);
    ipc_buf_done(&b);
}

void patd_publish(patd_t *d, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (d->pub >= 0 && n > 0)
        nn_send(d->pub, line, (size_t)PAT_MIN(n, (int)sizeof(line) - 1), NN_DONTWAIT);
}

static void on_kv_event(void *ud, kv_event_type_t type, uint32_t block, uint64_t hash)
{
    patd_publish(ud, "%s %u %016llx", type == KV_EVENT_STORED ? "stored" : "evicted", block,
                 (unsigned long long)hash);
}

/* ------------------------------------------------------------------ sequences */
static int copy_blocks(patd_t *d, const kv_copy_t *cp)
{
    if (cp->src == KV_NONE)
        return 0;
    pthread_mutex_lock(&d->be_mu);
    int rc = kern_copy_blocks(d->be, &cp->src, &cp->dst, 1);
    pthread_mutex_unlock(&d->be_mu);
    return rc;
}

/* A free slot of the session. Its forest entry may still name a closed sequence: the executor
 * notices (forest_kv != kv) and leaves it before anything joins (patd_exec.c), so the loop never
 * reads forest_kv, which the executor owns. */
static int free_slot(patd_conn_t *c)
{
    for (uint32_t i = 0; i < c->max_seqs; i++)
        if (c->seqs[i].kv == KV_NONE)
            return (int)i;
    return -EMFILE;
}

static void seq_attach(patd_conn_t *c, uint32_t slot, uint32_t kv)
{
    c->seqs[slot].kv = kv; /* in_step is 0 on a free slot; blocks too (set_blocks below) */
    pat_map_put(&c->seq_map, kv, slot);
    c->n_open++;
    patd_conn_set_blocks(c, slot);
}

static void seq_detach(patd_conn_t *c, uint32_t slot)
{
    pat_map_del(&c->seq_map, c->seqs[slot].kv);
    c->seqs[slot].kv = KV_NONE;
    patd_conn_set_blocks(c, slot);
    c->n_open--;
}

static void handle_seq(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    uint32_t op = rq->hdr.opcode;
    ipc_seq_rep_t rep = {0};
    int rc = 0;
    if (op == IPC_OP_SEQ_OPEN) {
        ipc_seq_open_req_t r;
        memcpy(&r, body, sizeof(r));
        if (d->draining)
            return patd_reply_error(d, rq, -ESHUTDOWN, "draining: no new sequences");
        if (c->n_open >= c->max_seqs)
            return patd_reply_error(d, rq, -EDQUOT, "%u sequences open (session quota %u)",
                                    c->n_open, c->max_seqs);
        if (r.n_tokens > d->cfg.max_seq_len)
            return patd_reply_error(d, rq, -E2BIG, "prompt of %u tokens exceeds max_seq_len %u",
                                    r.n_tokens, d->cfg.max_seq_len);
        int slot = free_slot(c);
        if (slot < 0)
            return patd_reply_error(d, rq, -EDQUOT, "no free sequence slot");
        /* copied out: nanomsg gives no alignment guarantee for the body */
        uint32_t *tok = pat_xmalloc((size_t)r.n_tokens * 4);
        memcpy(tok, body + sizeof(r), (size_t)r.n_tokens * 4);
        pthread_mutex_lock(&d->pool_mu);
        uint32_t seq, cached;
        rc = kv_seq_open(d->pool, tok, r.n_tokens, &seq, &cached);
        if (rc == 0) {
            seq_attach(c, (uint32_t)slot, seq);
            rep.seq = seq;
            rep.len = cached;
        }
        pthread_mutex_unlock(&d->pool_mu);
        free(tok);
        if (rc == -EMFILE)
            return patd_reply_error(d, rq, -EMFILE, "pool.max_seqs sequences open daemon-wide");
        if (rc < 0)
            return patd_reply_error(d, rq, rc, "open: %s", strerror(-rc));
        return reply_ok(d, c, rq, &rep, sizeof(rep));
    }
    ipc_seq_req_t r;
    memcpy(&r, body, sizeof(r));
    int slot = patd_conn_seq_slot(c, r.seq);
    if (slot < 0)
        return patd_reply_error(d, rq, -ENOENT, "sequence %u is not open in this session", r.seq);
    if (c->seqs[slot].in_step)
        return patd_reply_error(d, rq, -EBUSY, "sequence %u is in the step in flight", r.seq);
    kv_copy_t cp = {KV_NONE, KV_NONE};
    pthread_mutex_lock(&d->pool_mu);
    kv_seq_info_t info;
    kv_seq_info(d->pool, r.seq, &info);
    rep.seq = r.seq;
    if (op == IPC_OP_SEQ_FORK) {
        uint32_t child;
        int cs = free_slot(c);
        if (d->draining)
            rc = -ESHUTDOWN;
        else if (c->n_open >= c->max_seqs || cs < 0)
            rc = -EDQUOT;
        else if (c->blocks_held + info.n_blocks > c->max_blocks)
            rc = -EDQUOT;
        else if ((rc = kv_seq_fork(d->pool, r.seq, &child, &cp)) == 0) {
            seq_attach(c, (uint32_t)cs, child);
            rep.seq = child;
            rep.len = info.len;
        }
    } else if (op == IPC_OP_SEQ_TRUNCATE) {
        if (r.arg > info.len)
            rc = -ERANGE;
        else if ((rc = kv_seq_truncate(d->pool, r.seq, r.arg, &cp)) == 0) {
            patd_conn_set_blocks(c, (uint32_t)slot);
            rep.len = r.arg;
        }
    } else { /* SEQ_CLOSE */
        rc = kv_seq_close(d->pool, r.seq);
        if (rc == 0)
            seq_detach(c, (uint32_t)slot);
    }
    pthread_mutex_unlock(&d->pool_mu);
    if (rc == 0)
        rc = copy_blocks(d, &cp);
    if (rc < 0)
        return patd_reply_error(d, rq, rc, "%s of sequence %u (length %u): %s", ipc_op_name(op),
                                r.seq, info.len,
                                rc == -ERANGE ? "beyond its length" : strerror(-rc));
    reply_ok(d, c, rq, &rep, sizeof(rep));
}

/* ------------------------------------------------------------------ steps */
static void step_reset(patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    for (uint32_t i = 0; i < st->n_seqs; i++)
        c->seqs[st->slot[i]].in_step = 0;
    st->n_seqs = st->n_tokens = 0;
    st->begun = 0;
    st->err = 0;
    st->layers_done = 0;
    st->end_flags = 0;
    atomic_store(&st->abort, 0);
    atomic_store(&st->phase, STEP_IDLE);
}

/* Refuses a STEP_BEGIN. A GPU session's stream (or captured graph) hands over every layer
 * without waiting for this answer, so its refused step still runs as a handshake-only step on an
 * executor (patd_exec.c) and ends with STEP_END like any other; a cpu session's step just ends. */
static void step_refuse(patd_t *d, patd_conn_t *c, patd_req_t *rq, int code, const char *msg)
{
    patd_step_t *st = &c->step; /* IDLE: handle_step_begin answered -EBUSY otherwise */
    patd_reply_error(d, rq, code, "%s", msg);
    for (uint32_t j = 0; j < st->n_seqs; j++)
        c->seqs[st->slot[j]].in_step = 0;
    st->n_seqs = st->n_tokens = 0;
    if (!c->gpu)
        return;
    st->err = code;
    st->id = ++c->next_step;
    st->t_recv_ns = pat_now_ns();
    atomic_store(&st->phase, STEP_QUEUED);
    patd_exec_submit(d, c);
}

static void handle_step_begin(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    ipc_step_begin_req_t r;
    memcpy(&r, body, sizeof(r));
    patd_step_t *st = &c->step;
    char msg[160];
    if (atomic_load(&st->phase) != STEP_IDLE)
        return patd_reply_error(d, rq, -EBUSY, "step %llu is still in flight",
                                (unsigned long long)st->id);
    st->n_seqs = 0;
    if (d->draining)
        return step_refuse(d, c, rq, -ESHUTDOWN, "draining: no new steps");
    if (r.n_seqs > c->max_seqs) {
        snprintf(msg, sizeof(msg), "%u sequences in a step; session holds at most %u", r.n_seqs,
                 c->max_seqs);
        return step_refuse(d, c, rq, -E2BIG, msg);
    }
    if (r.n_tokens > c->max_batch_tokens) {
        snprintf(msg, sizeof(msg), "%u tokens in a step exceed the session's max_batch_tokens %u",
                 r.n_tokens, c->max_batch_tokens);
        return step_refuse(d, c, rq, -E2BIG, msg);
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
        int slot = patd_conn_seq_slot(c, s.seq);
        const char *why = NULL;
        int code = 0;
        if (slot < 0)
            code = -ENOENT, why = "is not open in this session";
        else if (c->seqs[slot].in_step)
            code = -EINVAL, why = "appears twice in the step";
        if (code) {
            snprintf(msg, sizeof(msg), "step sequence #%u (id %u) %s", i, s.seq, why);
            return step_refuse(d, c, rq, code, msg);
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
    rq->ctl = NULL; /* the reply is owed by the step */
    /* begun, err, layers_done, abort are clear: phase IDLE means step_reset ran */
    atomic_store(&st->phase, STEP_QUEUED);
    patd_exec_submit(d, c);
}

static void step_finalize(patd_t *d, patd_conn_t *c)
{
    patd_step_t *st = &c->step;
    int full = st->err == 0 && st->layers_done == d->model.n_layers;
    int commit = full && !(st->end_flags & IPC_STEP_END_ABORT);
    pthread_mutex_lock(&d->pool_mu);
    if (commit) {
        for (uint32_t i = 0, off = 0; i < st->n_seqs; off += st->n_new[i], i++) {
            kv_seq_commit(d->pool, st->kv[i], st->tokens + off, st->n_new[i]);
            patd_conn_set_blocks(c, st->slot[i]);
        }
    } else {
        patd_step_unreserve(c, st->n_seqs);
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
    st->end_req.ctl = NULL;
    if (!commit && !(st->end_flags & IPC_STEP_END_ABORT)) {
        int code = st->err ? st->err : -ECANCELED;
        patd_reply_error(d, &rq, code, "step %llu: %u of %u layers ran (%s); nothing committed",
                         (unsigned long long)st->id, st->layers_done, d->model.n_layers,
                         strerror(-code));
    } else {
        ipc_step_end_rep_t rep = {st->layers_done, (uint32_t)commit, ns};
        reply_ok(d, c, &rq, &rep, sizeof(rep));
    }
    step_reset(c);
}

static void handle_step_end(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    ipc_step_end_req_t r;
    memcpy(&r, body, sizeof(r));
    patd_step_t *st = &c->step;
    int ph = atomic_load(&st->phase);
    if (ph == STEP_IDLE || (r.step != st->id && !(c->gpu && r.step == 0)))
        return patd_reply_error(d, rq, -ESRCH, "step %llu is not in flight",
                                (unsigned long long)r.step);
    if (st->end_req.ctl) /* a resend of the same end: answer the newest */
        nn_freemsg(st->end_req.ctl);
    st->end_req = *rq;
    rq->ctl = NULL;
    st->end_flags = r.flags;
    if (ph == STEP_FINISHED && (st->begun || st->err))
        return step_finalize(d, c);
    /* still with an executor: ask it to stop unless every layer already ran. A GPU session's
     * layers are still queued on its stream when STEP_END arrives: the step finishes by itself
     * (or by the step timeout), and this answer waits for it. */
    if (!c->gpu && st->layers_done < d->model.n_layers) {
        atomic_store(&st->abort, 1);
        ipc_sig_wake(&ipc_shm_sig(&c->shm)->ready);
    }
}

void patd_step_complete(patd_conn_t *c)
{
    patd_t *d = c->d;
    patd_step_t *st = &c->step;
    int ph = atomic_load(&st->phase);
    if (c->closing) {
        if (ph == STEP_FINISHED || ph == STEP_IDLE) {
            step_reset(c);
            patd_conn_reap(c);
        }
        return;
    }
    if (st->begin_req.ctl && (st->begun || (c->gpu && st->err) || ph == STEP_FINISHED)) {
        patd_req_t rq = st->begin_req;
        st->begin_req.ctl = NULL;
        if (st->begun) {
            ipc_step_begin_rep_t rep = {.step = st->id,
                                        .tick_base = st->tick_base,
                                        .n_tokens = st->n_tokens,
                                        .kv_bytes = st->kv_bytes,
                                        .qc_bytes = st->qc_bytes,
                                        .pack_reused = (uint32_t)st->pack_reused};
            reply_ok(d, c, &rq, &rep, sizeof(rep));
        } else {
            const char *why = st->err == -ENOSPC   ? "KV pool out of blocks"
                              : st->err == -EDQUOT ? "session block quota exceeded"
                              : st->err == -E2BIG  ? "a sequence would exceed max_seq_len"
                                                   : strerror(-st->err);
            patd_reply_error(d, &rq, st->err, "step not started: %s", why);
            if (!c->gpu) {
                step_reset(c); /* nothing was reserved */
                return;
            } /* a GPU step runs its handshakes and ends with STEP_END */
        }
    }
    if (ph == STEP_FINISHED && st->end_req.ctl)
        step_finalize(d, c);
}

static void on_wake(uv_async_t *h)
{
    patd_t *d = h->data;
    patd_conn_t *c;
    while ((c = patd_exec_take_done(d)))
        patd_step_complete(c);
}

/* ------------------------------------------------------------------ admin */
static void start_drain(patd_t *d, const char *why);

/* SIGHUP and `patctl reload`: re-read the file, apply what is reloadable, tell systemd. */
static int reload_config(patd_t *d, const char *who)
{
    sd_notify(0, "RELOADING=1");
    patd_notice("%s: reloading %s", who, d->cfg.path[0] ? d->cfg.path : "(no config file)");
    int rc = patd_config_reload(&d->cfg, d->argc, d->argv);
    atomic_store(&patd_log_level, (int)d->cfg.log_level);
    sd_notify(0, "READY=1");
    return rc;
}

static void reply_text(patd_t *d, patd_req_t *rq, const char *text, size_t len)
{
    reply_ok(d, NULL, rq, text, len);
}

static void handle_admin(patd_t *d, patd_req_t *rq)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f;
    switch (rq->hdr.opcode) {
    case IPC_OP_STATS:
        out = patd_metrics_text(d, &len);
        reply_text(d, rq, out, len);
        free(out);
        return;
    case IPC_OP_STATUS: {
        f = open_memstream(&out, &len);
        kv_stats_t ks;
        pthread_mutex_lock(&d->pool_mu);
        kv_pool_stats(d->pool, &ks);
        int check = kv_pool_check(d->pool);
        pthread_mutex_unlock(&d->pool_mu);
        uint32_t steps = 0;
        for (uint32_t i = 0; i < d->n_conns; i++)
            steps += atomic_load(&d->conns[i]->step.phase) != STEP_IDLE;
        fprintf(f, "pid %d\ninstance %016llx\nuptime_s %.1f\nstate %s\nbackend %s\n", getpid(),
                (unsigned long long)d->instance, (pat_now_ns() - d->t_start_ns) / 1e9,
                d->draining ? "draining" : "serving", kern_backend_name(d->be));
        fprintf(f, "model layers=%u q_heads=%u kv_heads=%u head_dim=%u dtype=%u block=%u id=%llu\n",
                d->model.n_layers, d->model.q_heads, d->model.kv_heads, d->model.head_dim,
                (unsigned)d->model.dtype, d->model.block_size, (unsigned long long)d->cfg.model_id);
        fprintf(f, "max_seq_len %u\nsocket %s\nevents %s\n", d->cfg.max_seq_len, d->sock_path,
                d->ev_path);
        fprintf(f, "blocks_total %u\nblocks_free %u\nblocks_used %u\nblocks_cached %u\n",
                ks.n_blocks, ks.n_free, ks.n_used, ks.n_cached);
        fprintf(f, "sequences %u\nconnections %u\nsteps_in_flight %u\npool_check %s\n", ks.n_seqs,
                d->n_conns, steps, check == 0 ? "ok" : "FAILED");
        fclose(f);
        break;
    }
    case IPC_OP_SEQS: {
        f = open_memstream(&out, &len);
        fprintf(f, "# session pid label seq len blocks in_step\n");
        pthread_mutex_lock(&d->pool_mu);
        for (uint32_t i = 0; i < d->n_conns; i++) {
            patd_conn_t *c = d->conns[i];
            for (uint32_t s = 0; s < c->max_seqs; s++) {
                kv_seq_info_t info;
                if (c->seqs[s].kv == KV_NONE || kv_seq_info(d->pool, c->seqs[s].kv, &info) < 0)
                    continue;
                fprintf(f, "%016llx %d %s %u %u %u %u\n", (unsigned long long)c->session,
                        (int)c->pid, c->label[0] ? c->label : "-", c->seqs[s].kv, info.len,
                        info.n_blocks, c->seqs[s].in_step);
            }
        }
        pthread_mutex_unlock(&d->pool_mu);
        fclose(f);
        break;
    }
    case IPC_OP_DRAIN:
        reply_text(d, rq, "draining\n", 9);
        start_drain(d, "patctl drain");
        return;
    case IPC_OP_RELOAD: {
        int rc = reload_config(d, "patctl reload");
        if (rc < 0)
            return patd_reply_error(d, rq, -EINVAL, "%s is invalid; nothing changed (see log)",
                                    d->cfg.path);
        reply_text(d, rq, "reloaded\n", 9);
        return;
    }
    default:
        return patd_reply_error(d, rq, -EOPNOTSUPP, "opcode %u", rq->hdr.opcode);
    }
    reply_text(d, rq, out, len);
    free(out);
}

/* ------------------------------------------------------------------ dispatch */
static void handle_frame(patd_t *d, const uint8_t *buf, size_t len, patd_req_t *rq)
{
    ipc_hdr_t h;
    int rc = ipc_frame_check(buf, len, 0, &h);
    if (rc < 0) {
        /* answer what can be answered: echo the correlation id if the header is complete */
        memset(&rq->hdr, 0, sizeof(rq->hdr));
        if (len >= sizeof(ipc_hdr_t))
            memcpy(&rq->hdr, buf, sizeof(ipc_hdr_t));
        rq->hdr.flags = 0;
        return patd_reply_error(d, rq, rc, "frame refused: %s (%zu bytes)", ipc_err_text(rc), len);
    }
    rq->hdr = h;
    if (h.opcode < IPC_OP_MAX)
        atomic_fetch_add(&d->m.frames[h.opcode], 1);
    const uint8_t *body = buf + sizeof(h);
    if ((rc = ipc_body_check(h.opcode, body, h.body_len)) < 0)
        return patd_reply_error(d, rq, rc, "%s body refused: %s", ipc_op_name(h.opcode),
                                ipc_err_text(rc));
    if (ipc_op_is_admin(h.opcode) == 1 && h.opcode != IPC_OP_HELLO) {
        if (h.session != 0)
            return patd_reply_error(d, rq, -EINVAL, "admin requests carry session 0");
        return handle_admin(d, rq);
    }
    if (h.opcode == IPC_OP_HELLO) {
        if (h.session != 0)
            return patd_reply_error(d, rq, -EINVAL, "HELLO carries session 0");
        ipc_hello_req_t r;
        ipc_hello_rep_t rep;
        char why[IPC_ERRMSG_LEN] = "";
        memcpy(&r, body, sizeof(r));
        if ((rc = patd_conn_hello(d, &h, &r, &rep, why, sizeof(why))) < 0)
            return patd_reply_error(d, rq, rc, "%s", why);
        rq->hdr.session = rep.session;
        patd_conn_t *c = patd_conn_find(d, rep.session);
        return reply_ok(d, c, rq, &rep, sizeof(rep));
    }
    patd_conn_t *c = patd_conn_find(d, h.session);
    if (!c || c->closing)
        return patd_reply_error(d, rq, -ENOTCONN, "session %016llx unknown%s",
                                (unsigned long long)h.session,
                                (h.session >> 32) != (d->instance >> 32)
                                    ? " (issued by another daemon instance: patd restarted)"
                                    : " (closed or expired)");
    c->last_seen_ns = pat_now_ns();
    if (h.corr == c->last_corr && c->last_reply) { /* a resend: same answer, applied once */
        patd_send(d, rq, c->last_reply, c->last_reply_len);
        return;
    }
    switch (h.opcode) {
    case IPC_OP_PING:
        return reply_ok(d, c, rq, NULL, 0);
    case IPC_OP_BYE:
        c->bye_req = *rq;
        rq->ctl = NULL;
        return patd_conn_close(c, "client said bye");
    case IPC_OP_SEQ_OPEN:
    case IPC_OP_SEQ_FORK:
    case IPC_OP_SEQ_TRUNCATE:
    case IPC_OP_SEQ_CLOSE:
        return handle_seq(d, c, rq, body);
    case IPC_OP_STEP_BEGIN:
        return handle_step_begin(d, c, rq, body);
    case IPC_OP_STEP_END:
        return handle_step_end(d, c, rq, body);
    default:
        return patd_reply_error(d, rq, -EOPNOTSUPP, "opcode %u", h.opcode);
    }
}

static void on_rep(uv_poll_t *ph, int status, int events)
{
    patd_t *d = ph->data;
    for (;;) {
        void *body = NULL;
        void *ctl = NULL;
        struct nn_iovec iov = {&body, NN_MSG};
        struct nn_msghdr mh = {&iov, 1, &ctl, NN_MSG};
        int n = nn_recvmsg(d->rep, &mh, NN_DONTWAIT);
        if (n < 0) {
            if (nn_errno() != EAGAIN)
                patd_warn("receive: %s", nn_strerror(nn_errno()));
            return;
        }
        patd_req_t rq = {.ctl = ctl};
        handle_frame(d, body, (size_t)n, &rq);
        if (rq.ctl) /* a handler that answers later took it; otherwise it was answered */
            nn_freemsg(rq.ctl);
        nn_freemsg(body);
    }
}

/* ------------------------------------------------------------------ lifecycle */
static void close_all(patd_t *d, const char *why)
{
    while (d->n_conns) {
        uint32_t before = d->n_conns;
        for (uint32_t i = 0; i < d->n_conns; i++)
            if (!d->conns[i]->closing) {
                patd_conn_close(d->conns[i], why);
                break;
            }
        if (d->n_conns == before) /* every remaining one waits for its executor */
            break;
    }
}

static void start_drain(patd_t *d, const char *why)
{
    if (d->draining)
        return;
    d->draining = 1;
    d->drain_start_ns = pat_now_ns();
    d->drain_deadline_ns = d->drain_start_ns + (uint64_t)d->cfg.drain_timeout_ms * 1000000ull;
    patd_notice("draining (%s): no new sessions, sequences or steps; %u sessions open", why,
                d->n_conns);
    sd_notify(0, "STOPPING=1\nSTATUS=draining in-flight steps");
}

static void on_signal(uv_signal_t *s, int signum)
{
    patd_t *d = s->data;
    if (signum == SIGHUP) {
        reload_config(d, "SIGHUP");
        return;
    }
    if (d->draining) {
        patd_notice("second %s: exiting now", strsignal(signum));
        d->drain_deadline_ns = 0;
        return;
    }
    start_drain(d, strsignal(signum));
}

static void on_tick(uv_timer_t *t)
{
    patd_t *d = t->data;
    uint64_t now = pat_now_ns();
    patd_conns_tick(d, now);
    if (d->watchdog) {
        int moving = 1;
        for (uint32_t i = 0; i < d->n_exec; i++) {
            uint64_t b = atomic_load(&d->m.exec_beat[i]);
            moving &= b != d->beat_seen[i];
            d->beat_seen[i] = b;
        }
        if (moving)
            sd_notify(0, "WATCHDOG=1");
        else
            patd_warn("watchdog: an executor has not moved for %u ms", TICK_MS);
    }
    static uint64_t last_status;
    if (now - last_status > 5000000000ull) {
        last_status = now;
        sd_notifyf(0, "STATUS=%s: %u sessions, %llu steps, backend %s",
                   d->draining ? "draining" : "serving", d->n_conns,
                   (unsigned long long)atomic_load(&d->m.steps), kern_backend_name(d->be));
    }
    if (d->draining) {
        uint32_t busy = 0;
        for (uint32_t i = 0; i < d->n_conns; i++)
            busy += atomic_load(&d->conns[i]->step.phase) != STEP_IDLE;
        if (busy == 0 || now >= d->drain_deadline_ns) {
            if (busy)
                patd_warn("drain timeout: aborting %u steps in flight", busy);
            close_all(d, "daemon shutting down");
            /* not before two ticks: nanomsg drops what its worker has not sent when the socket
             * closes, and the reply to `patctl drain` was queued just now (a lost reply failed
             * test_ops under ASan on a loaded machine) */
            if (d->n_conns == 0 && now - d->drain_start_ns >= 2ull * TICK_MS * 1000000ull)
                uv_stop(&d->loop);
        }
    }
}

static int make_dir(const char *path, mode_t mode)
{
    if (mkdir(path, mode) == 0 || errno == EEXIST)
        return 0;
    return -errno;
}

static int open_sockets(patd_t *d)
{
    const patd_config_t *cfg = &d->cfg;
    int rc = make_dir(cfg->runtime_dir, 0755);
    if (rc < 0) {
        patd_err("runtime directory %s: %s", cfg->runtime_dir, strerror(-rc));
        return rc;
    }
    snprintf(d->sock_path, sizeof(d->sock_path), "%.255s/%.63s.sock", cfg->runtime_dir, cfg->name);
    snprintf(d->ev_path, sizeof(d->ev_path), "%.255s/%.63s.events", cfg->runtime_dir, cfg->name);
    d->gid = (gid_t)-1;
    if (cfg->socket_group[0]) {
        struct group *g = getgrnam(cfg->socket_group);
        if (!g) {
            patd_err("socket_group '%s' does not exist", cfg->socket_group);
            return -EINVAL;
        }
        d->gid = g->gr_gid;
    }
    d->rep = nn_socket(AF_SP_RAW, NN_REP);
    d->pub = nn_socket(AF_SP, NN_PUB);
    if (d->rep < 0 || d->pub < 0) {
        patd_err("nanomsg socket: %s", nn_strerror(nn_errno()));
        return -EIO;
    }
    /* The largest valid request (a max_seq_len prompt, or a full step) plus 64 KiB, so that a
     * frame announcing too much is still read and answered -E2BIG; anything beyond this bound
     * is dropped by nanomsg unread (libpat never sends such frames). */
    uint64_t biggest = sizeof(ipc_hdr_t) + sizeof(ipc_step_begin_req_t) +
                       8ull * cfg->conn_max_seqs +
                       4ull * PAT_MAX(cfg->max_seq_len, cfg->conn_max_batch_tokens);
    int maxsz = (int)PAT_MIN((uint64_t)IPC_MAX_FRAME, biggest + 65536);
    nn_setsockopt(d->rep, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz, sizeof(maxsz));
    const char *paths[2] = {d->sock_path, d->ev_path};
    int socks[2] = {d->rep, d->pub};
    mode_t old = umask(0077); /* no window in which the socket is more open than asked */
    for (int i = 0; i < 2; i++) {
        char url[420];
        snprintf(url, sizeof(url), "ipc://%s", paths[i]);
        if (nn_bind(socks[i], url) < 0) {
            umask(old);
            patd_err("bind %s: %s", url, nn_strerror(nn_errno()));
            return -EADDRINUSE;
        }
        if (chmod(paths[i], (mode_t)cfg->socket_mode) < 0 ||
            (d->gid != (gid_t)-1 && chown(paths[i], (uid_t)-1, d->gid) < 0)) {
            umask(old);
            patd_err("set mode/group of %s: %s", paths[i], strerror(errno));
            return -errno;
        }
    }
    umask(old);
    int fd;
    size_t sz = sizeof(fd);
    if (nn_getsockopt(d->rep, NN_SOL_SOCKET, NN_RCVFD, &fd, &sz) < 0) {
        patd_err("NN_RCVFD: %s", nn_strerror(nn_errno()));
        return -EIO;
    }
    uv_poll_init(&d->loop, &d->rep_poll, fd);
    d->rep_poll.data = d;
    uv_poll_start(&d->rep_poll, UV_READABLE, on_rep);
    return 0;
}

static int create_pool(patd_t *d)
{
    const patd_config_t *cfg = &d->cfg;
    d->model = (kern_model_t){cfg->layers,   cfg->q_heads,    cfg->kv_heads,
                              cfg->head_dim, cfg->block_size, (kern_dtype_t)cfg->dtype};
    const char *backend = cfg->backend;
    if (!strcmp(backend, "auto")) {
#ifdef PATD_HAVE_CUDA_BACKEND
        backend = "cuda";
#else
        backend = "cpu";
        patd_notice("backend auto: this build has no cuda backend; using the cpu backend");
#endif
    }
    kv_pool_config_t pc = {.n_blocks = cfg->blocks,
                           .block_size = cfg->block_size,
                           .max_seqs = cfg->max_seqs,
                           .max_seq_len = cfg->max_seq_len,
                           .model_id = cfg->model_id,
                           .block_bytes = kern_block_bytes(&d->model),
                           .on_event = on_kv_event,
                           .event_ud = d};
    int rc = kv_pool_create(&pc, &d->pool);
    if (rc < 0) {
        patd_err("kv pool: %s", strerror(-rc));
        return rc;
    }
    kern_config_t kc = {.model = d->model,
                        .n_blocks = cfg->blocks,
                        .max_tokens = cfg->conn_max_batch_tokens,
                        .max_partials = PATD_MAX_PARTIALS(cfg),
                        .n_threads = cfg->threads,
                        .device = (int)cfg->device,
                        .fwd = !strcmp(cfg->forward, "mma")    ? KERN_FWD_MMA
                               : !strcmp(cfg->forward, "wide") ? KERN_FWD_WIDE
                                                               : KERN_FWD_AUTO};
    if (strcmp(backend, "cpu")) {
        /* before the first CUDA call: lazy module loading can hang a first launch behind a
         * queued stream wait (DESIGN.md §2), and more hardware queues keep a lane blocked on its
         * client's word from stalling another lane's stream */
        const char *ml = getenv("CUDA_MODULE_LOADING");
        if (ml && strcmp(ml, "EAGER"))
            patd_notice("CUDA_MODULE_LOADING=%s overridden with EAGER", ml);
        setenv("CUDA_MODULE_LOADING", "EAGER", 1);
        setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    }
    rc = kern_backend_create(backend, &kc, &d->be);
    if (rc == -ENODEV && !strcmp(cfg->backend, "auto")) {
        patd_notice("backend auto: no CUDA device %u here; using the cpu backend", cfg->device);
        backend = "cpu";
        rc = kern_backend_create(backend, &kc, &d->be);
    }
    if (rc < 0) {
        patd_err("backend %s: %s (pool of %u blocks x %llu bytes)", backend, strerror(-rc),
                 cfg->blocks, (unsigned long long)kern_block_bytes(&d->model));
        return rc;
    }
    kern_tiles(d->be, &d->tiles);
    patd_notice("backend %s: %u blocks of %u tokens (%.1f MiB KV), model %u layers %u/%u heads "
                "d=%u%s",
                kern_backend_name(d->be), cfg->blocks, cfg->block_size,
                cfg->blocks * (double)kern_block_bytes(&d->model) / 1048576.0, cfg->layers,
                cfg->q_heads, cfg->kv_heads, cfg->head_dim,
                cfg->path[0] ? "" : " (no config file: built-in defaults, a small pool)");
    return 0;
}

int main(int argc, char **argv)
{
    static patd_t dd;
    patd_t *d = &dd;
    d->rep = d->pub = -1;
    d->argc = argc;
    d->argv = argv;
    int rc = patd_config_load(&d->cfg, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 1;
    atomic_store(&patd_log_level, (int)d->cfg.log_level);
    setvbuf(stderr, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    d->t_start_ns = pat_now_ns();
    if (getrandom(&d->instance, sizeof(d->instance), 0) != sizeof(d->instance))
        d->instance = d->t_start_ns ^ ((uint64_t)getpid() << 40);
    d->instance |= 1ull << 63; /* never 0 */
    pthread_mutex_init(&d->pool_mu, NULL);
    pthread_mutex_init(&d->be_mu, NULL);
    pthread_mutex_init(&d->q_mu, NULL);
    pthread_mutex_init(&d->done_mu, NULL);
    pthread_cond_init(&d->q_cv, NULL);
    uv_loop_init(&d->loop);
    char prefix[IPC_NAME_LEN + 16];
    snprintf(prefix, sizeof(prefix), "/patd.%.40s.", d->cfg.name);
    int swept = ipc_shm_sweep(prefix);
    if (swept)
        patd_notice("removed %d stale staging buffers of a previous run", swept);

    if ((rc = create_pool(d)) < 0 || (rc = open_sockets(d)) < 0 ||
        (rc = patd_gpu_start(d, PAT_MIN(d->cfg.executors, 64u))) < 0)
        goto out;
    if ((rc = patd_exec_start(d)) < 0) {
        patd_err("executor threads: %s", strerror(-rc));
        goto out;
    }
    if ((rc = patd_metrics_start(d)) < 0)
        goto out;
    uv_async_init(&d->loop, &d->wake, on_wake);
    d->wake.data = d;
    uv_timer_init(&d->loop, &d->tick);
    d->tick.data = d;
    uv_timer_start(&d->tick, on_tick, TICK_MS, TICK_MS);
    uv_signal_t *sigs[3] = {&d->sig_term, &d->sig_int, &d->sig_hup};
    int signums[3] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(&d->loop, sigs[i]);
        sigs[i]->data = d;
        uv_signal_start(sigs[i], on_signal, signums[i]);
    }
    d->watchdog = sd_watchdog_enabled(0, &d->watchdog_usec) > 0;
    if (d->watchdog && d->watchdog_usec / 1000 < 2 * TICK_MS)
        patd_warn("WatchdogSec below %u ms is shorter than the check period", 2 * TICK_MS);
    patd_notice("ready: control ipc://%s, events ipc://%s, %u executors, metrics %s%u",
                d->sock_path, d->ev_path, d->n_exec, d->cfg.metrics_port ? "127.0.0.1:" : "off ",
                d->cfg.metrics_port);
    sd_notifyf(0, "READY=1\nSTATUS=serving on %s (%s backend)\nMAINPID=%d", d->sock_path,
               kern_backend_name(d->be), getpid());
    uv_run(&d->loop, UV_RUN_DEFAULT);
    patd_notice("stopped: %llu steps served, %llu sessions", (unsigned long long)d->m.steps,
                (unsigned long long)d->m.conns_opened);
    rc = 0;
out:
    patd_metrics_stop(d);
    if (d->n_exec)
        patd_exec_stop(d);
    /* sessions still open (only after a start-up failure or a forced stop) */
    for (uint32_t i = 0; i < d->n_conns; i++)
        ipc_shm_close(&d->conns[i]->shm);
    patd_gpu_stop(d);
    if (d->rep >= 0)
        nn_close(d->rep);
    if (d->pub >= 0)
        nn_close(d->pub);
    kern_backend_free(d->be);
    kv_pool_free(d->pool);
    return rc < 0 ? 1 : 0;
}
