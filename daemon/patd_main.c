/*
 * patd_main.c — the patd process: configuration, the pool and backend, the sockets on a libuv
 * loop, request dispatch, signals, systemd notification and the drain on exit.
 *
 * Requests arrive on the control socket (patd_wire.c) and the admin socket (patd_admin.c); a
 * reply may be sent later from the loop: STEP_BEGIN is answered once an executor has reserved and
 * packed, STEP_END once the executor has given the step back, without blocking other clients.
 * Every frame is validated (ipc_frame_check, ipc_body_check) before it is looked at; every
 * refusal is an error reply with a specific code and changes nothing. The last reply of each
 * session is kept so that a resent request (the same correlation id and opcode) gets the same
 * answer instead of being applied twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat.h"
#include "pat_base.h"

/* the config's and the wire's dtype codes are pat.h's, and the backends take them as they are */
_Static_assert(PAT_F16 == (unsigned)KERN_F16 && PAT_BF16 == (unsigned)KERN_BF16 &&
                   PAT_F32 == (unsigned)KERN_F32 && PAT_FP8_E4M3 == (unsigned)KERN_FP8_E4M3 &&
                   PAT_FP8_E5M2 == (unsigned)KERN_FP8_E5M2,
               "kern_dtype_t follows pat.h's dtype codes");

#define TICK_MS         100u
#define UPGRADE_TICK_MS 5u     /* the tick while an upgrade drains */
#define UPGRADE_READY_S 120ull /* a successor not ready by then is stopped: this one serves on */

static void on_kv_event(void *ud, kv_event_type_t type, uint32_t block, uint64_t hash,
                        uint64_t scope, uint32_t parent)
{
    patd_persist_event(ud, type, block, hash, scope, parent); /* pool_mu is held */
    patd_wire_event(ud, scope, "%s %u %016llx", type == KV_EVENT_STORED ? "stored" : "evicted",
                    block, (unsigned long long)hash);
}

/* ------------------------------------------------------------------ steps */
/* An executor posted: a step began or came back. */
static void on_wake(uv_async_t *h)
{
    patd_t *d = h->data;
    patd_conn_t *c;
    while ((c = patd_exec_take_done(&d->exec)))
        if (patd_step_complete(c))
            patd_conn_reap(c);
}

/* ------------------------------------------------------------------ admin */
static void start_drain(patd_t *d, const char *why);

static void reply_text(patd_t *d, patd_req_t *rq, const char *text, size_t len)
{
    patd_reply_ok(d, NULL, rq, text, len);
}

/* SIGHUP and `patctl reload` (patd_reload_t): the file is read and checked on a thread of its
 * own, so that no file (a hung mount included) can stall the loop; what is reloadable is applied
 * here on the loop thread, systemd told, and patctl answered: "reloaded", or the cause that left
 * the running configuration untouched. The thread is detached, not libuv's worker pool: a reader
 * stuck for good must not hold patd's exit (libuv joins its workers as the process ends). */
static void *reload_main(void *arg)
{
    patd_t *d = arg;
    patd_reload_t *r = &d->reload;
    /* named here, not by its creator: it is detached, and may be gone by then. Its CPU time is
     * "other" in patd_cpu_seconds_total (patd_metrics.c) */
    pthread_setname_np(pthread_self(), "patd-reload");
    r->rc = patd_config_reread(&d->cfg, d->argc, d->argv, &r->next);
    uv_async_send(&r->done); /* orders the writes above before the loop's reads */
    return NULL;
}

static void reload_done(uv_async_t *h)
{
    patd_t *d = h->data;
    patd_reload_t *r = &d->reload;
    if (!r->busy)
        return;
    r->busy = 0;
    if (r->rc < 0) {
        patd_err("%s: %s; keeping the running configuration", r->who,
                 r->next.error[0] ? r->next.error : "invalid");
        if (r->rq.reply_fn)
            patd_reply_error(d, &r->rq, -EINVAL, "%s; nothing changed",
                             r->next.error[0] ? r->next.error : "invalid (see the log)");
    } else {
        int kept = patd_config_apply(&d->cfg, &r->next);
        patd_notice("%s: reloaded %s in %.1f ms%s", r->who, d->cfg.path,
                    (pat_now_ns() - r->start_ns) / 1e6,
                    kept ? " (changes kept back: see above)" : "");
        char msg[96];
        int n = kept ? snprintf(msg, sizeof(msg), "reloaded; %d changes kept back (see the log)\n",
                                kept)
                     : snprintf(msg, sizeof(msg), "reloaded\n");
        if (r->rq.reply_fn)
            reply_text(d, &r->rq, msg, (size_t)n);
    }
    r->rq.reply_fn = NULL;
    patd_notify_state(&d->notify, "READY=1");
}

/* Starts a reload for who; rq: patctl's request (answered once done), NULL for SIGHUP. */
static void reload_start(patd_t *d, const char *who, patd_req_t *rq)
{
    patd_reload_t *r = &d->reload;
    if (!d->cfg.path[0]) {
        patd_notice("%s: no config file; nothing to re-read", who);
        if (rq)
            reply_text(d, rq, "reloaded\n", 9);
        return;
    }
    if (r->busy) {
        double s = (pat_now_ns() - r->start_ns) / 1e9;
        patd_notice("%s: a reload (%s) is still reading %s after %.1f s; this one is refused", who,
                    r->who, d->cfg.path, s);
        if (rq)
            patd_reply_error(d, rq, -EBUSY, "a reload (%s) is still reading %s after %.1f s",
                             r->who, d->cfg.path, s);
        return;
    }
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    r->busy = 1;
    r->who = who;
    r->start_ns = pat_now_ns();
    r->rq.reply_fn = NULL;
    patd_notify_state(&d->notify, "RELOADING=1");
    patd_notice("%s: reloading %s", who, d->cfg.path);
    int rc = -pthread_create(&t, &attr, reload_main, d);
    pthread_attr_destroy(&attr);
    if (rc < 0) {
        r->busy = 0;
        patd_err("%s: cannot start a reload: %s", who, strerror(-rc));
        if (rq)
            patd_reply_error(d, rq, rc, "cannot start a reload: %s", strerror(-rc));
        patd_notify_state(&d->notify, "READY=1");
        return;
    }
    if (rq)
        patd_admin_defer(rq, &r->rq);
}

/* ------------------------------------------------------------------ requests */
/* Every handler answers rq (now, or later by keeping rq->ctl) and returns nothing. c is the
 * session for session requests, NULL for admin ones and HELLO. */
typedef void op_handler_fn(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body);

static void op_stats(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    size_t len = 0;
    char *out = patd_metrics_text(d, &len);
    reply_text(d, rq, out, len);
    free(out);
}

/* The figures STATUS prints and INFO carries, from one place. Loop thread. */
static void fill_info(patd_t *d, ipc_info_rep_t *r)
{
    kv_stats_t ks;
    pthread_mutex_lock(&d->pool_mu);
    kv_pool_stats(d->pool, &ks);
    pthread_mutex_unlock(&d->pool_mu);
    const patd_config_t *cfg = &d->cfg;
    memset(r, 0, sizeof(*r));
    r->size = sizeof(*r);
    r->protocol = IPC_VERSION;
    r->version = PAT_VERSION;
    r->pid = (uint32_t)getpid();
    r->instance = d->instance;
    r->uptime_ms = (pat_now_ns() - d->t_start_ns) / 1000000ull;
    r->state = d->draining ? IPC_STATE_DRAINING : IPC_STATE_SERVING;
    r->max_seq_len = cfg->max_seq_len;
    snprintf(r->backend, sizeof(r->backend), "%s", kern_backend_name(d->be));
    r->model = (ipc_model_sig_t){d->model.n_layers, d->model.q_heads,         d->model.kv_heads,
                                 d->model.head_dim, (uint32_t)d->model.dtype, d->model.block_size,
                                 cfg->model_id};
    r->max_conns = cfg->max_conns;
    r->conn_max_seqs = cfg->conn_max_seqs;
    r->conn_max_blocks = cfg->conn_max_blocks ? cfg->conn_max_blocks : cfg->blocks;
    r->conn_max_batch_tokens = cfg->conn_max_batch_tokens;
    r->conn_max_staging_mb = cfg->conn_max_staging_mb;
    r->lease_ms = cfg->lease_ms;
    r->step_timeout_ms = cfg->step_timeout_ms;
    r->blocks_total = ks.n_blocks;
    r->blocks_free = ks.n_free;
    r->blocks_used = ks.n_used;
    r->blocks_cached = ks.n_cached;
    r->sequences = ks.n_seqs;
    r->connections = d->n_conns;
    r->scale = patd_softmax_scale(d);
    r->softcap = cfg->softcap;
    r->kv_dtype = (uint32_t)kern_kv_dtype(&d->model);
    r->kv_scale = kern_kv_scale(&d->model);
    for (uint32_t i = 0; i < d->n_conns; i++)
        r->steps_in_flight += (uint32_t)patd_step_busy(&d->conns[i]->step);
}

/* For people (patctl status); programs use INFO. */
static void op_status(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    char *out = NULL;
    size_t len = 0;
    ipc_info_rep_t r;
    fill_info(d, &r);
    FILE *f = open_memstream(&out, &len);
    fprintf(f, "pid %u\ninstance %016llx\nuptime_s %.1f\nstate %s\nbackend %s\ndevice %s\n", r.pid,
            (unsigned long long)r.instance, r.uptime_ms / 1e3,
            r.state == IPC_STATE_DRAINING ? "draining" : "serving", r.backend, d->device);
    fprintf(f, "version %u.%u.%u\nprotocol %u\n", r.version >> 16, (r.version >> 8) & 0xff,
            r.version & 0xff, r.protocol);
    fprintf(f, "model layers=%u q_heads=%u kv_heads=%u head_dim=%u dtype=%u block=%u id=%llu\n",
            r.model.n_layers, r.model.q_heads, r.model.kv_heads, r.model.head_dim, r.model.dtype,
            r.model.block_size, (unsigned long long)r.model.model_id);
    fprintf(f, "scale %g\nsoftcap %g\nkv_dtype %s\nkv_scale %g\n", (double)r.scale,
            (double)r.softcap, patd_dtype_name(r.kv_dtype), (double)r.kv_scale);
    fprintf(f, "invariant_chunk %u\n", d->cfg.invariant ? d->cfg.invariant_chunk : 0);
    fprintf(f, "max_seq_len %u\nsocket %s\nevents %s\n", r.max_seq_len, d->sock_path, d->ev_path);
    fprintf(f, "blocks_total %u\nblocks_free %u\nblocks_used %u\nblocks_cached %u\n",
            r.blocks_total, r.blocks_free, r.blocks_used, r.blocks_cached);
    fprintf(f, "sequences %u\nconnections %u\nsteps_in_flight %u\n", r.sequences, r.connections,
            r.steps_in_flight);
    if (d->gpu) /* GPU steps on lanes (patd_lanes.h): in use, most at once, waiting for one */
        fprintf(f, "lanes %u\nlanes_busy %u\nlanes_busy_max %u\nsteps_waiting_for_lane %u\n",
                d->lanes.n, atomic_load(&d->lanes.busy), atomic_load(&d->lanes.busy_max),
                atomic_load(&d->lanes.waiting));
    fprintf(f, "persist %s\npersist_adopted %u\n", d->persist.on ? "on" : "off",
            d->persist.adopted);
    if (d->upgrade)
        fprintf(f, "upgrade %s\nupgrade_pid %d\n", d->upgrade == 1 ? "starting" : "handing_over",
                d->persist.successor);
    if (d->gpu && d->cfg.cross_pack)
        fprintf(f,
                "cross_packs %llu\ncross_pack_steps %llu\ncross_pack_layers %llu\n"
                "cross_pack_leaves %llu\n",
                (unsigned long long)atomic_load(&d->lanes.packs),
                (unsigned long long)atomic_load(&d->lanes.pack_steps),
                (unsigned long long)atomic_load(&d->lanes.pack_layers),
                (unsigned long long)atomic_load(&d->lanes.pack_leaves));
    fclose(f);
    reply_text(d, rq, out, len);
    free(out);
}

static void op_info(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    ipc_info_rep_t r;
    fill_info(d, &r);
    patd_reply_ok(d, NULL, rq, &r, sizeof(r));
}

/* The pool's invariant check and every session's quota recount, O(blocks x sessions + table
 * entries) under pool_mu: an admin's explicit request, never on a path that clients or monitors
 * poll. */
static void op_check(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    uint64_t t0 = pat_now_ns();
    pthread_mutex_lock(&d->pool_mu);
    int rc = kv_pool_check(d->pool);
    for (uint32_t i = 0; i < d->n_conns && rc == 0; i++)
        rc = patd_seq_check(d->conns[i]); /* each session's quota count */
    pthread_mutex_unlock(&d->pool_mu);
    char msg[128];
    int n = snprintf(msg, sizeof(msg), "pool_check %s (%.1f ms)\n", rc == 0 ? "ok" : "FAILED",
                     (pat_now_ns() - t0) / 1e6);
    if (rc < 0) {
        patd_err("pool check failed: %s (details above)", strerror(-rc));
        patd_reply_error(d, rq, rc, "KV pool invariant check failed (see the daemon's log)");
        return;
    }
    reply_text(d, rq, msg, (size_t)n);
}

static void op_seqs(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    /* sessions by their place in the table, not their ids: an id names a session to the
     * daemon, and anyone may ask for this list */
    fprintf(f, "# session pid label seq len blocks in_step\n");
    pthread_mutex_lock(&d->pool_mu);
    for (uint32_t i = 0; i < d->n_conns; i++) {
        patd_conn_t *s = d->conns[i];
        for (uint32_t k = 0; k < s->max_seqs; k++) {
            kv_seq_info_t info;
            if (s->seqs[k].kv == KV_NONE || kv_seq_info(d->pool, s->seqs[k].kv, &info) < 0)
                continue;
            fprintf(f, "s%u %d %s %u %u %u %u\n", s->idx, (int)s->pid, s->label[0] ? s->label : "-",
                    s->seqs[k].kv, info.len, info.n_blocks, s->seqs[k].in_step);
        }
    }
    pthread_mutex_unlock(&d->pool_mu);
    fclose(f);
    reply_text(d, rq, out, len);
    free(out);
}

static void op_drain(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    reply_text(d, rq, "draining\n", 9);
    start_drain(d, "patctl drain");
}

static void op_reload(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    reload_start(d, "patctl reload", rq);
}

static int upgrade_start(patd_t *d, const char *by, char *why, size_t why_len);
static void op_upgrade(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    char why[600];
    int rc = upgrade_start(d, "patctl upgrade", why, sizeof(why));
    if (rc < 0)
        patd_reply_error(d, rq, rc, "%s", why);
    else
        reply_text(d, rq, why, strlen(why));
}

static void op_ping(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    patd_reply_ok(d, c, rq, NULL, 0);
}

static void op_bye(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    c->bye_req = *rq; /* answered once reclaimed */
    rq->wire = 0;
    patd_conn_close(c, "client said bye");
}

/* The opcodes patd serves and who handles them; admin rows answer without a session (their
 * frames carry session 0), session rows need an open session of this instance. */
static const struct {
    op_handler_fn *fn;
    int session;
} op_table[IPC_OP_MAX] = {
    [IPC_OP_BYE] = {op_bye, 1},
    [IPC_OP_PING] = {op_ping, 1},
    [IPC_OP_SEQ_OPEN] = {patd_seq_request, 1},
    [IPC_OP_SEQ_OPEN_PENDING] = {patd_seq_request, 1},
    [IPC_OP_SEQ_FORK] = {patd_seq_request, 1},
    [IPC_OP_SEQ_TRUNCATE] = {patd_seq_request, 1},
    [IPC_OP_SEQ_CLOSE] = {patd_seq_request, 1},
    [IPC_OP_STEP_BEGIN] = {patd_step_begin, 1},
    [IPC_OP_STEP_END] = {patd_step_end, 1},
    [IPC_OP_STATUS] = {op_status, 0},
    [IPC_OP_STATS] = {op_stats, 0},
    [IPC_OP_SEQS] = {op_seqs, 0},
    [IPC_OP_DRAIN] = {op_drain, 0},
    [IPC_OP_RELOAD] = {op_reload, 0},
    [IPC_OP_INFO] = {op_info, 0},
    [IPC_OP_CHECK] = {op_check, 0},
    [IPC_OP_UPGRADE] = {op_upgrade, 0},
};

/* Validates a frame, finds its session, replays the answer to a resent request, and hands it
 * to its handler; anything refused on the way gets its specific error. */
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
        patd_reply_error(d, rq, rc, "frame refused: %s (%zu bytes)", ipc_err_text(rc), len);
        return;
    }
    rq->hdr = h;
    atomic_fetch_add(&d->m.frames[h.opcode], 1); /* < IPC_OP_MAX: ipc_frame_check */
    const uint8_t *body = buf + sizeof(h);
    if ((rc = ipc_body_check(h.opcode, body, h.body_len)) < 0) {
        patd_reply_error(d, rq, rc, "%s body refused: %s", ipc_op_name(h.opcode), ipc_err_text(rc));
        return;
    }
    if (h.opcode == IPC_OP_HELLO) {
        /* every session is opened where the kernel names the caller and its fds can pass */
        patd_reply_error(d, rq, -EPERM, "HELLO is served on the admin socket %s only",
                         d->admin_path);
        return;
    }
    if (!op_table[h.opcode].fn) {
        patd_reply_error(d, rq, -EOPNOTSUPP, "opcode %u", h.opcode);
        return;
    }
    if (!op_table[h.opcode].session) {
        if (h.session != 0)
            patd_reply_error(d, rq, -EINVAL, "%s carries session 0", ipc_op_name(h.opcode));
        else if (ipc_op_changes_state(h.opcode))
            /* changes the daemon: for its user, root and admin_group, whom the admin socket
             * checks (patctl uses it) */
            patd_reply_error(d, rq, -EPERM, "%s is served on the admin socket %s only",
                             ipc_op_name(h.opcode), d->admin_path);
        else
            op_table[h.opcode].fn(d, NULL, rq, body);
        return;
    }
    patd_conn_t *c = patd_conn_find(d, h.session);
    if (!c || c->closing || h.key != c->key) { /* a wrong key: as if there were no such session */
        patd_reply_error(d, rq, -ENOTCONN, "session %016llx unknown%s",
                         (unsigned long long)h.session,
                         (h.session >> 32) != (d->instance >> 32)
                             ? " (issued by another daemon instance: patd restarted)"
                             : " (closed or expired)");
        return;
    }
    c->last_seen_ns = pat_now_ns();
    if (h.corr == c->last_corr && h.opcode == c->last_op && c->last_reply) {
        /* a resend: the same answer, applied once */
        patd_send(d, rq, c->last_reply, c->last_reply_len);
        return;
    }
    op_table[h.opcode].fn(d, c, rq, body);
}

/* A request from the admin socket, checked and authorized there (patd_admin.c). */
static void admin_dispatch(patd_t *d, patd_req_t *rq, const ipc_hdr_t *h)
{
    if (h->opcode < IPC_OP_MAX)
        atomic_fetch_add(&d->m.frames[h->opcode], 1);
    if (h->opcode >= IPC_OP_MAX || !op_table[h->opcode].fn || op_table[h->opcode].session)
        patd_reply_error(d, rq, -EOPNOTSUPP, "opcode %u", h->opcode);
    else
        op_table[h->opcode].fn(d, NULL, rq, NULL);
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
    patd_notify_state(&d->notify, "STOPPING=1\nSTATUS=draining in-flight steps");
}

static void upgrade_abandon(patd_t *d, const char *why)
{
    const int pid = d->persist.successor;
    uv_poll_stop(&d->upgrade_poll);
    patd_persist_spawn_end(d);
    d->upgrade = 0;
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, WNOHANG) != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    patd_err("upgrade failed: %s; pid %d serves on", why, (int)getpid());
    patd_notify_state(&d->notify, "READY=1\nSTATUS=serving on %s (an upgrade failed: %s)",
                      d->sock_path, why);
}

/* The successor's socket: 'R' (ready: drain and hand over) or its end (it failed). */
static void on_upgrade(uv_poll_t *h, int status, int events)
{
    patd_t *d = h->data;
    char b = 0;
    ssize_t k = read(d->persist.successor_fd, &b, 1);
    if (k < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (k != 1 || b != 'R') {
        char why[96];
        int st = 0;
        const int pid = d->persist.successor;
        if (pid > 0 && waitpid(pid, &st, 0) == pid) {
            snprintf(why, sizeof(why), "the successor (pid %d) %s %d before it was ready", pid,
                     WIFEXITED(st) ? "exited with status" : "was killed by signal",
                     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            d->persist.successor = 0;
        } else
            snprintf(why, sizeof(why), "the successor (pid %d) closed its socket", pid);
        upgrade_abandon(d, why);
        return;
    }
    uv_poll_stop(h);
    d->upgrade = 2;
    d->upgrade_ready_ns = pat_now_ns();
    d->upgrade_pid = d->persist.successor;
    patd_notice("upgrade: the successor (pid %d) is ready: draining, then handing over",
                d->persist.successor);
    /* the service's main process from now (systemd: NotifyAccess=main then hears it) */
    patd_notify_state(&d->notify, "MAINPID=%d\nSTATUS=handing over to pid %d", d->persist.successor,
                      d->persist.successor);
    /* the drain is checked each tick: every 5 ms while it lasts, the gap clients see */
    uv_timer_set_repeat(&d->tick, UPGRADE_TICK_MS);
    uv_timer_again(&d->tick);
    start_drain(d, "upgrade");
}

/* The drain of an upgrade is done (no session left, so no step, no pool or index write), or a
 * second signal cut it short and everything has stopped: the listening sockets and the metrics
 * port go (each stop may run twice), the GPU's last work passes, and the successor is let in
 * (patd_persist_release), before this daemon's backend winds down. */
static void upgrade_hand_over(patd_t *d, uint64_t now)
{
    patd_metrics_stop(d);
    patd_admin_stop(d);
    patd_wire_unlisten(d);
    if (d->be && kern_sync(d->be) < 0)
        patd_warn("upgrade: the GPU's last work failed; the successor takes over all the same");
    patd_persist_release(d);
    d->upgrade = 3;
    patd_notice("upgrade: handed over to pid %d, %.1f ms after it was ready (the drain %.1f ms, "
                "letting go %.1f ms)",
                d->upgrade_pid, (pat_now_ns() - d->upgrade_ready_ns) / 1e6,
                (now - d->upgrade_ready_ns) / 1e6, (pat_now_ns() - now) / 1e6);
}

/* SIGUSR2 or patctl upgrade: the successor is started; 0 or -errno (why: for the reply). */
static int upgrade_start(patd_t *d, const char *by, char *why, size_t why_len)
{
    if (d->upgrade || d->draining) {
        snprintf(why, why_len, "%s", d->upgrade ? "an upgrade is under way" : "draining");
        return d->upgrade ? -EALREADY : -ESHUTDOWN;
    }
    if (!d->persist.on)
        patd_warn("%s: an upgrade without pool.persist (this run keeps no pool): the new binary "
                  "starts with an empty cache",
                  by);
    int pid = patd_persist_spawn(d);
    if (pid < 0) {
        snprintf(why, why_len, "starting %s: %s", d->exe, strerror(-pid));
        patd_err("%s: upgrade: %s", by, why);
        return pid;
    }
    uv_poll_init(&d->loop, &d->upgrade_poll, d->persist.successor_fd);
    d->upgrade_poll.data = d;
    uv_poll_start(&d->upgrade_poll, UV_READABLE | UV_DISCONNECT, on_upgrade);
    d->upgrade = 1;
    d->upgrade_deadline_ns = pat_now_ns() + UPGRADE_READY_S * 1000000000ull;
    patd_notice("%s: upgrade: started %s as pid %d; serving until it is ready", by, d->exe, pid);
    struct timespec mono;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    patd_notify_state(
        &d->notify, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=upgrading: pid %d starts %s",
        (unsigned long long)mono.tv_sec * 1000000ull + (unsigned long long)mono.tv_nsec / 1000ull,
        pid, d->exe);
    snprintf(why, why_len, "upgrading: pid %d started %s; it takes over once ready\n", pid, d->exe);
    return pid;
}

static void on_signal(uv_signal_t *s, int signum)
{
    patd_t *d = s->data;
    if (signum == SIGHUP) {
        reload_start(d, "SIGHUP", NULL);
        return;
    }
    if (signum == SIGUSR2) {
        char why[160];
        upgrade_start(d, "SIGUSR2", why, sizeof(why));
        return;
    }
    if (d->upgrade == 1) /* the successor has not taken anything yet */
        upgrade_abandon(d, "stopped by a signal");
    if (d->draining) {
        patd_notice("second %s: exiting now", strsignal(signum));
        d->drain_deadline_ns = 0;
        return;
    }
    start_drain(d, strsignal(signum));
}

/* systemd's watchdog: WATCHDOG=1 every quarter of WatchdogSec while every executor (and the lane
 * thread, cuda) moves; one
 * the watchdog judges stuck (patd_notify.h: its heartbeat still for half of WatchdogSec, and for
 * at least three idle beats and two ticks, so that the beat's and this check's own 100 ms
 * periods never look like a stall, as they did at start and at drain with WatchdogSec=200ms)
 * means no ping (systemd restarts patd once the period passes) and one warning per episode.
 * Executors that have stopped (the end of a drain) are not stalls. */
_Static_assert(PATD_EXEC_MAX + 1 <= PATD_WD_MAX, "the watchdog sees every executor");
static void watchdog_tick(patd_t *d, uint64_t now)
{
    const uint64_t period_ns = d->watchdog_usec * 1000ull;
    uint64_t beats[PATD_WD_MAX];
    uint32_t n = d->exec.n;
    for (uint32_t i = 0; i < n; i++)
        beats[i] = atomic_load(&d->exec.beat[i]);
    if (d->lanes.started) /* the lane thread beats like an executor */
        beats[n++] = atomic_load(&d->lanes.beat);
    uint32_t stuck = patd_watchdog_check(&d->wd, beats, n, now, d->exec.stopping);
    if (stuck) {
        if (!d->watchdog_warned)
            patd_warn("watchdog: %u executor(s) or the lane thread have not moved for %llu ms; "
                      "not pinging",
                      stuck, (unsigned long long)(d->wd.stuck_ns / 1000000ull));
        d->watchdog_warned = 1;
        return;
    }
    d->watchdog_warned = 0;
    if (now - d->last_ping_ns >= period_ns / 4) {
        d->last_ping_ns = now;
        patd_notify_ping(&d->notify, "WATCHDOG=1");
    }
}

static void on_tick(uv_timer_t *t)
{
    patd_t *d = t->data;
    uint64_t now = pat_now_ns();
    patd_conns_tick(d, now);
    patd_notify_flush(&d->notify);
    if (d->watchdog)
        watchdog_tick(d, now);
    if (now - d->last_status_ns > 5000000000ull) {
        d->last_status_ns = now;
        patd_notify_ping(&d->notify, "STATUS=%s: %u sessions, %llu steps, backend %s",
                         d->draining ? "draining" : "serving", d->n_conns,
                         (unsigned long long)atomic_load(&d->m.steps), kern_backend_name(d->be));
    }
    if (d->upgrade == 1 && now >= d->upgrade_deadline_ns)
        upgrade_abandon(d, "the successor was not ready within 120 s");
    if (d->draining) {
        uint32_t busy = 0;
        for (uint32_t i = 0; i < d->n_conns; i++)
            busy += patd_step_busy(&d->conns[i]->step);
        if (busy == 0 || now >= d->drain_deadline_ns) {
            if (busy)
                patd_warn("drain timeout: aborting %u steps in flight", busy);
            close_all(d, d->upgrade == 2 ? "patd upgraded: the successor serves"
                                         : "daemon shutting down");
            if (d->upgrade == 2 && d->n_conns == 0)
                upgrade_hand_over(d, now);
            /* not before two ticks: the reply to `patctl drain` was queued just now, and the
             * loop writes it (a lost reply failed test_ops under ASan on a loaded machine) */
            if (d->n_conns == 0 &&
                (d->upgrade || now - d->drain_start_ns >= 2ull * TICK_MS * 1000000ull))
                uv_stop(&d->loop); /* an upgrade owes no reply: it goes at once */
        }
    }
}

/* The runtime directory: created 0755 if missing; an existing one must be a real directory
 * (not a symlink) owned by the daemon's user and writable by nobody else, or anyone who could
 * write there could put their own socket where clients look for patd's. */
static int runtime_dir(const char *path)
{
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
        int rc = -errno;
        patd_err("runtime directory %s: %s", path, strerror(-rc));
        return rc;
    }
    struct stat st;
    if (lstat(path, &st) < 0) {
        int rc = -errno;
        patd_err("runtime directory %s: %s", path, strerror(-rc));
        return rc;
    }
    if (!S_ISDIR(st.st_mode)) {
        patd_err("runtime directory %s is not a directory (a symlink?); refusing it", path);
        return -ENOTDIR;
    }
    if (st.st_uid != geteuid()) {
        patd_err("runtime directory %s belongs to uid %u, not to patd's uid %u; refusing it "
                 "(another user could have put a socket there)",
                 path, (unsigned)st.st_uid, (unsigned)geteuid());
        return -EPERM;
    }
    if (st.st_mode & 0022) {
        patd_err("runtime directory %s is writable by group or others (mode %04o); refusing it",
                 path, (unsigned)(st.st_mode & 07777));
        return -EPERM;
    }
    return 0;
}

static int open_sockets(patd_t *d)
{
    const patd_config_t *cfg = &d->cfg;
    int rc = runtime_dir(cfg->runtime_dir);
    if (rc < 0)
        return rc;
    snprintf(d->sock_path, sizeof(d->sock_path), "%.255s/%.63s.sock", cfg->runtime_dir, cfg->name);
    snprintf(d->ev_path, sizeof(d->ev_path), "%.255s/%.63s.events", cfg->runtime_dir, cfg->name);
    if ((rc = patd_group(cfg->socket_group, "socket_group", &d->gid)) < 0)
        return rc;
    return patd_wire_start(d);
}

/* Descriptors: every connection (session or not), pidfd, staging buffer and metrics client
 * costs one. The soft limit is raised to the hard one (systemd's default soft limit is 1024),
 * and a limit too low for max_conns sessions is said once at start, with the numbers, instead of
 * being found by clients that hang. */
static void raise_nofile(const patd_config_t *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            rl.rlim_cur = was;
    }
    /* per session: its connection, pidfd and staging buffer; the metrics endpoint's connections;
     * 64 for the daemon itself */
    uint64_t need = 3ull * cfg->max_conns + (cfg->metrics_port ? PATD_METRICS_MAX_CONNS : 0) + 64;
    if (rl.rlim_cur < need)
        patd_warn("open-file limit %llu is below the %llu that limits.max_conns %u sessions "
                  "need; raise LimitNOFILE= or lower max_conns",
                  (unsigned long long)rl.rlim_cur, (unsigned long long)need, cfg->max_conns);
    else
        patd_info("open-file limit %llu", (unsigned long long)rl.rlim_cur);
}

/* Which backend serves, decided once at start from the backend registry's probe (kern.h):
 *   cpu  - the cpu backend.
 *   cuda - the cuda backend on gpu.device, or patd stops saying why.
 *   auto - cuda when the probe says the device can be served. Otherwise the cpu backend with one
 *          notice where the host has no NVIDIA driver or the build has no cuda backend, and a
 *          stop where the operator asked for a device (gpu.device set) or the host is a GPU host
 *          (a driver answers): a GPU host that quietly serves from the CPU is a misconfiguration
 *          nobody notices (patd@N with GPU N gone, a driver older than the build).
 * Returns 0 with the backend's name in *ret_name and its probe in *pr, or -ENODEV. */
static int pick_backend(const patd_config_t *cfg, const char **ret_name, kern_probe_t *pr)
{
    const char *want = cfg->backend;
    if (!strcmp(want, "cpu")) {
        *ret_name = "cpu";
        return kern_backend_probe("cpu", 0, pr);
    }
    /* before the first CUDA call (the probe): with lazy module loading a kernel's first launch
     * behind a queued GPU-side stream wait can hang for ever, and more hardware queues keep a
     * lane blocked on its client's word from stalling another lane's stream */
    const char *ml = getenv("CUDA_MODULE_LOADING");
    if (ml && strcmp(ml, "EAGER"))
        patd_notice("CUDA_MODULE_LOADING=%s overridden with EAGER", ml);
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    int rc = kern_backend_probe("cuda", (int)cfg->device, pr);
    if (rc == 0) {
        *ret_name = "cuda";
        return 0;
    }
    int device_set = patd_config_was_set(cfg, "device");
    if (!strcmp(want, "cuda") || device_set || pr->driver_present) {
        patd_err("backend %s: gpu.device = %u%s cannot be served: %s; not falling back to the "
                 "cpu backend%s",
                 want, cfg->device, device_set ? " was asked for and" : "", pr->why,
                 strcmp(want, "cuda") ? " (backend = cpu serves from the CPU on purpose)" : "");
        return -ENODEV;
    }
    patd_notice("backend auto: %s; using the cpu backend", pr->why);
    *ret_name = "cpu";
    return kern_backend_probe("cpu", 0, pr);
}

/* pool.blocks = auto: as many blocks as the backend's share of memory holds (patd_config.c's
 * gpu.memory_fraction and pool.cpu_memory_mb), refused with the numbers when that is more than
 * is free now or fewer than 16 blocks. The cuda share covers the staging arena and the lanes
 * (kern_lane_bytes each) too, and a reserve for the context's own allocations (256 MiB keeps
 * them clear). */
#define PATD_GPU_RESERVE (256ull << 20)
static int size_pool(patd_config_t *cfg, const char *backend, const kern_probe_t *pr,
                     uint64_t block_bytes, uint64_t lanes_bytes)
{
    if (!cfg->blocks_auto)
        return 0;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    uint64_t budget;
    if (!strcmp(backend, "cuda")) {
        uint64_t share = (uint64_t)((double)cfg->memory_fraction * (double)pr->mem_total);
        uint64_t other = ((uint64_t)cfg->staging_mb << 20) + lanes_bytes + PATD_GPU_RESERVE;
        if (share > pr->mem_free) {
            patd_err("pool.blocks = auto: gpu.memory_fraction %.2f of %s's %.1f GiB is %.1f GiB, "
                     "but only %.1f GiB are free (other processes hold %.1f GiB); lower "
                     "gpu.memory_fraction or set pool.blocks",
                     (double)cfg->memory_fraction, pr->device, pr->mem_total / gib, share / gib,
                     pr->mem_free / gib, (pr->mem_total - pr->mem_free) / gib);
            return -ENOMEM;
        }
        budget = share > other ? share - other : 0;
    } else {
        budget = (uint64_t)cfg->cpu_memory_mb << 20;
        if (pr->mem_free && budget > pr->mem_free) {
            patd_err("pool.blocks = auto: pool.cpu_memory_mb %u is more than the %.1f GiB this "
                     "host has available; lower it or set pool.blocks",
                     cfg->cpu_memory_mb, pr->mem_free / gib);
            return -ENOMEM;
        }
    }
    uint64_t n = budget / block_bytes;
    if (n > (1ull << 31))
        n = 1ull << 31;
    if (n < 16) {
        patd_err("pool.blocks = auto: %.2f GiB holds %llu blocks of %llu bytes (16 at least)",
                 budget / gib, (unsigned long long)n, (unsigned long long)block_bytes);
        return -ENOMEM;
    }
    cfg->blocks = (uint32_t)n;
    if (cfg->conn_max_blocks > cfg->blocks) {
        patd_err("limits.conn_max_blocks %u exceeds the %u blocks pool.blocks = auto sized",
                 cfg->conn_max_blocks, cfg->blocks);
        return -EINVAL;
    }
    patd_info("pool.blocks = auto: %u blocks (%.2f GiB of %s)", cfg->blocks,
              n * (double)block_bytes / gib,
              !strcmp(backend, "cuda") ? "gpu.memory_fraction" : "pool.cpu_memory_mb");
    return 0;
}

static int create_pool(patd_t *d)
{
    patd_config_t *cfg = &d->cfg;
    d->model = patd_config_model(cfg);
    const char *backend = NULL;
    kern_probe_t pr;
    const uint64_t t0 = pat_now_ns();
    int rc = pick_backend(cfg, &backend, &pr);
    if (rc < 0)
        return rc;
    const uint64_t t_probe = pat_now_ns();
    snprintf(d->device, sizeof(d->device), "%s", pr.device);
    uint64_t lanes_bytes = 0;
    if (!strcmp(backend, "cuda")) {
        const kern_config_t lk = {.model = d->model,
                                  .max_tokens = cfg->conn_max_batch_tokens,
                                  .max_partials = PATD_MAX_PARTIALS(cfg)};
        d->lanes_want = cfg->lanes ? cfg->lanes : patd_lanes_auto(&lk, pr.mem_total);
        lanes_bytes = d->lanes_want * kern_lane_bytes(&lk);
    }
    if ((rc = size_pool(cfg, backend, &pr, kern_block_bytes(&d->model), lanes_bytes)) < 0)
        return rc;
    kv_pool_config_t pc = {.n_blocks = cfg->blocks,
                           .block_size = cfg->block_size,
                           .max_seqs = cfg->max_seqs,
                           .max_seq_len = cfg->max_seq_len,
                           .model_id = cfg->model_id,
                           .on_event = on_kv_event,
                           .event_ud = d};
    rc = kv_pool_create(&pc, &d->pool);
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
                        .fwd = !strcmp(cfg->forward, "mma")       ? KERN_FWD_MMA
                               : !strcmp(cfg->forward, "layer")   ? KERN_FWD_LAYER
                               : !strcmp(cfg->forward, "cpasync") ? KERN_FWD_CPASYNC
                               : !strcmp(cfg->forward, "tma")     ? KERN_FWD_TMA
                                                                  : KERN_FWD_AUTO,
                        .merge =
                            strcmp(cfg->merge, "inside") ? KERN_MERGE_LAUNCH : KERN_MERGE_INSIDE,
                        .serial_launch = !cfg->dependent_launch};
    patd_persist_begin(d, &pr, &kc);
    while ((rc = kern_backend_create(backend, &kc, &d->be)) < 0 && kc.pool_keep &&
           patd_persist_fallback(d, &kc))
        ;
    if (rc == -ENOTSUP && kern_kv_fp8(&d->model) && !strcmp(backend, "cuda")) {
        patd_err("model.kv_dtype %s: the cuda backend serves an fp8 KV pool with its Hopper "
                 "kernel only (an sm_90a build on an sm_90 GPU, model.head_dim <= 128, gpu.forward "
                 "auto, cpasync or tma); the cpu backend serves any (daemon.backend = cpu), or "
                 "set model.kv_dtype = auto",
                 patd_dtype_name(cfg->kv_dtype));
        return rc;
    }
    if (rc < 0) {
        patd_err("backend %s on %s: %s (pool of %u blocks x %llu bytes)", backend, pr.device,
                 strerror(-rc), cfg->blocks, (unsigned long long)kern_block_bytes(&d->model));
        return rc;
    }
    kern_tiles(d->be, &d->tiles);
    patd_info("start: %.1f ms to the backend's probe (the process, the config), the probe %.1f "
              "ms (cuda: the context), the backend %.1f ms (the pool, the kernels' warm-up)",
              (t0 - d->t_start_ns) / 1e6, (t_probe - t0) / 1e6, (pat_now_ns() - t_probe) / 1e6);
    patd_notice("backend %s on %s: %u blocks of %u tokens (%.1f MiB KV), model %u layers %u/%u "
                "heads d=%u%s",
                kern_backend_name(d->be), pr.device, cfg->blocks, cfg->block_size,
                cfg->blocks * (double)kern_block_bytes(&d->model) / 1048576.0, cfg->layers,
                cfg->q_heads, cfg->kv_heads, cfg->head_dim,
                cfg->path[0] ? "" : " (no config file: built-in defaults, a small pool)");
    return 0;
}

int main(int argc, char **argv)
{
    static patd_t dd;
    patd_t *d = &dd;
    d->notify.fd = -1;
    d->argc = argc;
    d->argv = argv;
    int rc = patd_config_load(&d->cfg, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 1;
    setvbuf(stderr, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit below a staging buffer: EFBIG, refused HELLO */
    if ((rc = ipc_shm_guard_install()) < 0) { /* a client's ftruncate must not kill the daemon */
        fprintf(stderr, "patd: SIGBUS handler: %s\n", strerror(-rc));
        return 1;
    }
    if (d->cfg.path[0])
        patd_info("config %s%s%s", d->cfg.path, d->cfg.dropin_read ? " + " : "",
                  d->cfg.dropin_read ? d->cfg.dropin : "");
    raise_nofile(&d->cfg);
    { /* the binary's path as started: an upgrade execs what is at that path then */
        ssize_t k = readlink("/proc/self/exe", d->exe, sizeof(d->exe) - 1);
        d->exe[k > 0 ? k : 0] = 0;
        if (k <= 0)
            snprintf(d->exe, sizeof(d->exe), "%s", argv[0]);
    }
    d->t_start_ns = pat_now_ns();
    if (getrandom(&d->instance, sizeof(d->instance), 0) != sizeof(d->instance))
        d->instance = d->t_start_ns ^ ((uint64_t)getpid() << 40);
    d->instance |= 1ull << 63; /* never 0 */
    {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        d->t_start_unix = (uint64_t)now.tv_sec;
        ipc_set_origin(d->instance,
                       (uint64_t)now.tv_sec * 1000ull + (uint64_t)now.tv_nsec / 1000000ull);
    }
    pthread_mutex_init(&d->pool_mu, NULL);
    pthread_mutex_init(&d->be_mu, NULL);
    uv_loop_init(&d->loop);
    d->admin_dispatch = admin_dispatch;
    d->wire_dispatch = handle_frame;
    patd_notify_open(&d->notify); /* before the pool: it is handed to the manager (pool.persist) */
    /* the backend and its lanes first: a successor (an upgrade) makes them while its predecessor
     * serves, and takes over (the fence, the index, the sockets) only after that one let go */
    if ((rc = create_pool(d)) < 0)
        goto out;
    const uint64_t t_backend = pat_now_ns();
    if ((rc = patd_gpu_start(d)) < 0)
        goto out;
    if (d->persist.upgrade_fd >= 0)
        patd_notice("upgrade: ready %.1f ms after start (the backend %.1f ms, its lanes %.1f ms)",
                    (pat_now_ns() - d->t_start_ns) / 1e6, (t_backend - d->t_start_ns) / 1e6,
                    (pat_now_ns() - t_backend) / 1e6);
    if ((rc = patd_persist_takeover(d)) < 0)
        goto out;
    patd_persist_adopt(d);
    char prefix[IPC_NAME_LEN + 16];
    snprintf(prefix, sizeof(prefix), "/patd.%.40s.", d->cfg.name);
    int swept = ipc_shm_sweep(prefix);
    if (swept)
        patd_notice("removed %d stale staging buffers of a previous run", swept);
    if ((rc = open_sockets(d)) < 0 || (rc = patd_admin_start(d)) < 0)
        goto out;
    uv_async_init(&d->loop, &d->wake, on_wake);
    d->wake.data = d;
    uv_async_init(&d->loop, &d->reload.done, reload_done);
    d->reload.done.data = d;
    if ((rc = patd_exec_start(&d->exec, d->cfg.executors, &d->wake)) < 0) {
        patd_err("executor threads: %s", strerror(-rc));
        goto out;
    }
    if ((rc = patd_metrics_start(d)) < 0)
        goto out;
    uv_timer_init(&d->loop, &d->tick);
    d->tick.data = d;
    uv_timer_start(&d->tick, on_tick, TICK_MS, TICK_MS);
    uv_signal_t *sigs[4] = {&d->sig_term, &d->sig_int, &d->sig_hup, &d->sig_usr2};
    int signums[4] = {SIGTERM, SIGINT, SIGHUP, SIGUSR2};
    for (int i = 0; i < 4; i++) {
        uv_signal_init(&d->loop, sigs[i]);
        sigs[i]->data = d;
        uv_signal_start(sigs[i], on_signal, signums[i]);
    }
    d->watchdog = sd_watchdog_enabled(0, &d->watchdog_usec) > 0;
    patd_watchdog_init(&d->wd, d->watchdog_usec * 1000ull, PATD_EXEC_IDLE_NS, TICK_MS * 1000000ull);
    if (d->watchdog && d->watchdog_usec / 1000 < 2 * TICK_MS)
        patd_warn("WatchdogSec below %u ms is shorter than the check period", 2 * TICK_MS);
    patd_notice("ready: control %s, events %s, %u executors, metrics %s%u (%.1f ms after start)",
                d->sock_path, d->ev_path, d->exec.n, d->cfg.metrics_port ? "127.0.0.1:" : "off ",
                d->cfg.metrics_port, (pat_now_ns() - d->t_start_ns) / 1e6);
    patd_notify_state(&d->notify, "READY=1\nSTATUS=serving on %s (%s backend, %s)\nMAINPID=%d",
                      d->sock_path, kern_backend_name(d->be), d->device, getpid());
    uv_run(&d->loop, UV_RUN_DEFAULT);
    patd_notice("stopped: %llu steps served, %llu sessions", (unsigned long long)d->m.steps,
                (unsigned long long)d->m.conns_opened);
    rc = 0;
out:
    patd_metrics_stop(d);
    patd_exec_stop(&d->exec);
    patd_notify_close(&d->notify);
    patd_admin_stop(d);
    /* sessions still open (only after a start-up failure or a forced stop) */
    for (uint32_t i = 0; i < d->n_conns; i++)
        ipc_shm_close(&d->conns[i]->shm);
    patd_gpu_stop(d);
    patd_wire_stop(d);
    if (d->upgrade == 2) /* stopped before the drain ended (a second signal): let go now */
        upgrade_hand_over(d, pat_now_ns());
    else if (d->upgrade == 1) /* a start-up failure or a forced stop before it was ready */
        upgrade_abandon(d, "this daemon stopped first");
    kern_backend_free(d->be);
    kv_pool_free(d->pool);
    patd_persist_end(d);
    return rc < 0 ? 1 : 0;
}
