/*
 * pat_session.c — libpat's sessions: pat_connect (the HELLO, the staging buffers mapped or
 * imported, the control connection bound), pat_close, what a session reports of itself, and its
 * sequences.
 *
 * GPU sessions (a daemon on the cuda backend): the staging rows are device memory and the
 * hand-off is enqueued on the caller's CUDA stream (pat_gpu.c). A watcher thread (poll on the
 * daemon's pidfd) releases every handshake the caller's stream may wait on when the daemon dies,
 * so the frontend's GPU work never hangs on a daemon that is gone; libpat calls report
 * -ECONNRESET from then on.
 */
#include "pat_int.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "pat_base.h"

/* Releases every handshake word a stream of ours may wait on (the daemon is gone). */
static void release_waits(pat_conn_t *c)
{
    uint64_t e = atomic_load(&conn_sig(c)->epoch);
    uint64_t mine = __atomic_load_n(&c->epoch, __ATOMIC_RELAXED);
    if ((int64_t)(mine - e) > 0)
        e = mine;
    for (uint32_t l = 0; l < c->model.n_layers; l++)
        __atomic_store_n(&c->gdone[l], e, __ATOMIC_RELEASE);
}

static void *watch_main(void *arg)
{
    pat_conn_t *c = arg;
    /* the control connection's hang-up too: a daemon that ended this session (a drain, an
     * upgrade's handover) closes it, and may live on a while (its exit); the words are released
     * at once (POLLRDHUP: replies arriving on it do not wake this thread; the next call reads
     * why, as without this thread) */
    struct pollfd p[3] = {
        {c->watch_efd, POLLIN, 0}, {c->sock, POLLRDHUP, 0}, {c->daemon_pidfd, POLLIN, 0}};
    const nfds_t n = c->daemon_pidfd >= 0 ? 3 : 2;
    int dead = 0;
    for (;;) {
        /* after the daemon died the words are stored again every 50 ms: a graph replayed later
         * resets them as it goes */
        int r = poll(p, dead ? 1 : n, dead || n == 2 ? 50 : -1);
        if (r > 0 && (p[0].revents & POLLIN))
            return NULL;
        if (!dead && ((n == 3 && (p[2].revents & POLLIN)) ||
                      (n == 2 && kill(c->daemon_pid, 0) < 0 && errno == ESRCH))) {
            dead = 1;
            atomic_store(&c->lost_async, 1);
        } else if (!dead && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            dead = 1; /* the session ended; what the daemon said is read by the next call */
        }
        if (dead)
            release_waits(c);
    }
}

static int watcher_start(pat_conn_t *c)
{
    c->watch_efd = eventfd(0, EFD_CLOEXEC);
    if (c->watch_efd < 0)
        return -errno;
    int rc = pthread_create(&c->watcher, NULL, watch_main, c);
    if (rc) {
        close(c->watch_efd);
        c->watch_efd = -1;
        return -rc;
    }
    return 0;
}

static void watcher_stop(pat_conn_t *c)
{
    if (c->watch_efd < 0)
        return;
    uint64_t one = 1;
    if (write(c->watch_efd, &one, sizeof(one)) < 0) {
        /* an eventfd write cannot fail here; the join below would then block */
    }
    pthread_join(c->watcher, NULL);
    close(c->watch_efd);
    c->watch_efd = -1;
}

/* The session's buffers from the HELLO's reply (c->hello) and the fds beside it: the layout
 * checked equal to this library's, then a cpu session's staging memfd mapped or a GPU session's
 * signal slice and staging allocation imported (pat_gpu.c). The fds are closed either way. 0, or
 * a negative errno with its cause in why. */
static int session_buffers(pat_conn_t *c, const pat_connect_opts_t *o, const int fds[2], char *why,
                           size_t why_len)
{
    int rc = 0;
    uint32_t elt = o->model.dtype == PAT_F32 ? 4 : 2;
    const ipc_layout_t *l = &c->lay;
    const int on_gpu = c->hello.buffer_kind == IPC_BUF_CUDA;
    const int sfd = fds[0], gfd = fds[1];
    if (ipc_layout_compute(c->hello.max_batch_tokens, o->model.q_heads, o->model.kv_heads,
                           o->model.head_dim, elt, &c->lay) < 0 ||
        (on_gpu ? l->bytes != c->hello.dev_bytes || l->bytes > c->hello.dev_map_bytes
                : l->bytes != c->hello.buf_bytes) ||
        l->q_off != c->hello.q_off || l->k_off != c->hello.k_off || l->v_off != c->hello.v_off ||
        l->o_off != c->hello.o_off || (c->hello.buffer_kind != IPC_BUF_SHM && !on_gpu) ||
        (on_gpu &&
         (c->hello.sig_bytes < ipc_gsig_bytes(o->model.n_layers) || c->hello.sig_off != 0))) {
        snprintf(why, why_len, "daemon's buffer layout does not match this library's");
        rc = -EPROTO;
    } else if (sfd < 0 || (on_gpu && gfd < 0) || (!on_gpu && gfd >= 0)) {
        snprintf(why, why_len, "HELLO: the daemon sent %s buffer fds than a %s session has",
                 sfd < 0 || gfd < 0 ? "fewer" : "more", on_gpu ? "GPU" : "cpu");
        rc = -EPROTO;
    } else if (on_gpu) {
        rc = pat__gpu_open(c->hello.dev_uuid, gfd, c->hello.dev_map_bytes, sfd, c->hello.sig_bytes,
                           &c->gpu, why, why_len);
        const ipc_sig_t *g = rc == 0 ? pat__gpu_sig(c->gpu) : NULL;
        if (g && (g->magic != IPC_SIG_MAGIC || g->n_layers != o->model.n_layers)) {
            snprintf(why, why_len, "the daemon's signal slice does not match this library's");
            rc = -EPROTO;
        }
    } else {
        rc = ipc_shm_map_fd(&c->shm, sfd, c->hello.buf_bytes);
        if (rc < 0)
            snprintf(why, why_len, "mapping the staging buffer: %s", strerror(-rc));
    }
    /* the mappings (and the GPU import) hold what the descriptors named */
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

int pat_connect(const pat_connect_opts_t *o, pat_conn_t **ret, char *why, size_t why_len)
{
    char tmp[8];
    if (!why) {
        why = tmp;
        why_len = sizeof(tmp);
    }
    if (why_len)
        why[0] = 0;
    if (!o || !ret || o->size < offsetof(pat_connect_opts_t, reserved)) {
        snprintf(why, why_len, "opts missing or opts.size not set");
        return -EINVAL;
    }
    if (o->max_batch_tokens == 0 || o->max_batch_tokens > IPC_MAX_TOKENS) {
        snprintf(why, why_len, "max_batch_tokens must be 1..%u", IPC_MAX_TOKENS);
        return -EINVAL;
    }
    /* the options checked before anything is opened (a refusal holds no socket) */
    if (o->buffer > PAT_BUFFER_GPU) {
        snprintf(why, why_len, "opts.buffer must be PAT_BUFFER_AUTO, _HOST or _GPU");
        return -EINVAL;
    }
    if (o->pack_policy > PAT_PACK_TREE) {
        snprintf(why, why_len, "opts.pack_policy %u is not a PAT_PACK_* value", o->pack_policy);
        return -EINVAL;
    }
    if (o->kv_dtype > PAT_FP8_E5M2) {
        snprintf(why, why_len, "opts.kv_dtype %u is not a PAT_F16 ... PAT_FP8_E5M2 value",
                 o->kv_dtype);
        return -EINVAL;
    }
    const char *path = o->socket ? o->socket : pat_default_socket();
    pat_conn_t *c = pat_xcalloc(1, sizeof(*c));
    c->daemon_pidfd = -1;
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : 30000;
    c->model = o->model;
    ipc_buf_init(&c->tx);
    snprintf(c->path, sizeof(c->path), "%s", path);
    int rc = pat__open_socket(path, c->timeout_ms, &c->sock);
    if (rc < 0) {
        snprintf(why, why_len, "cannot reach patd at %s: %s", path,
                 rc == -ECONNREFUSED ? pat_strerror(rc) : strerror(-rc));
        free(c);
        return rc;
    }
    c->watch_efd = -1;
    ipc_hello_req_t r = {.pid = (uint32_t)getpid(),
                         .max_batch_tokens = o->max_batch_tokens,
                         .max_seqs = o->max_seqs,
                         .buffer_kind = o->buffer == PAT_BUFFER_HOST  ? IPC_BUF_SHM
                                        : o->buffer == PAT_BUFFER_GPU ? IPC_BUF_CUDA
                                                                      : 0,
                         .lease_ms = o->lease_ms};
    r.flags = (o->pack_policy & IPC_HELLO_PACK_MASK) | o->kv_dtype << IPC_HELLO_KV_SHIFT;
    r.model = (ipc_model_sig_t){o->model.n_layers, o->model.q_heads, o->model.kv_heads,
                                o->model.head_dim, o->model.dtype,   o->model.block_size,
                                o->model.model_id};
    if (o->label)
        snprintf(r.label, sizeof(r.label), "%s", o->label);
    int fds[2];
    rc = pat__hello(c, path, &r, fds);
    if (rc < 0) {
        snprintf(why, why_len, "HELLO: %s", c->err[0] ? c->err : pat_strerror(rc));
        goto fail;
    }
    c->session = c->hello.session;
    c->instance = c->hello.instance;
    c->daemon_pid = (pid_t)c->hello.daemon_pid;
    c->daemon_pidfd = ipc_pidfd_open(c->daemon_pid); /* < 0: kill(pid, 0) is the fallback */
    c->hello.shm_name[sizeof(c->hello.shm_name) - 1] = 0;
    const int on_gpu = c->hello.buffer_kind == IPC_BUF_CUDA;
    if ((rc = session_buffers(c, o, fds, why, why_len)) < 0)
        goto fail_session;
    if (on_gpu) {
        void *slice = pat__gpu_sig(c->gpu);
        c->gready = ipc_gsig_ready(slice);
        c->gdone = ipc_gsig_done(slice, o->model.n_layers);
        c->epoch = atomic_load(&conn_sig(c)->epoch);
        if ((rc = watcher_start(c)) < 0) {
            snprintf(why, why_len, "watcher thread: %s", strerror(-rc));
            goto fail_session;
        }
    }
    /* the first request binds the control connection to the session (the daemon closes one
     * that stays without a session for a few seconds) */
    if ((rc = pat__call(c, IPC_OP_PING, NULL, 0, NULL, 0, NULL, 0)) < 0) {
        snprintf(why, why_len, "binding the control connection: %s",
                 c->err[0] ? c->err : pat_strerror(rc));
        goto fail_session;
    }
    *ret = c;
    return 0;
fail_session:
    pat__gpu_close(c->gpu);
    ipc_shm_close(&c->shm);
    pat__call(c, IPC_OP_BYE, NULL, 0, NULL, 0, NULL, 0);
fail:
    if (c->daemon_pidfd >= 0)
        close(c->daemon_pidfd);
    close(c->sock);
    ipc_buf_done(&c->tx);
    free(c);
    return rc;
}

void pat_close(pat_conn_t *c)
{
    if (!c)
        return;
    if (!c->lost && c->session) {
        uint32_t t = c->timeout_ms;
        c->timeout_ms = PAT_MIN(t, 5000u);
        pat__call(c, IPC_OP_BYE, NULL, 0, NULL, 0, NULL, 0);
    }
    watcher_stop(c);
    if (c->gpu) /* the session is over: no wait of ours may outlive it (pat__gpu_close syncs) */
        release_waits(c);
    pat__gpu_close(c->gpu);
    ipc_shm_close(&c->shm);
    if (c->daemon_pidfd >= 0)
        close(c->daemon_pidfd);
    close(c->sock);
    ipc_buf_done(&c->tx);
    free(c);
}

int pat_buffers(const pat_conn_t *c, pat_buffers_t *ret)
{
    if (!c || !ret)
        return -EINVAL;
    memset(ret, 0, sizeof(*ret));
    uint8_t *b = c->gpu ? pat__gpu_staging(c->gpu) : (uint8_t *)c->shm.base;
    ret->on_gpu = c->gpu != NULL;
    ret->mps = c->hello.mps;
    ret->kv_dtype = c->hello.kv_dtype;
    ret->kv_scale = c->hello.kv_scale;
    ret->q = b + c->lay.q_off;
    ret->k = b + c->lay.k_off;
    ret->v = b + c->lay.v_off;
    ret->o = b + c->lay.o_off;
    ret->q_row_bytes = c->lay.q_row;
    ret->kv_row_bytes = c->lay.kv_row;
    ret->max_batch_tokens = c->hello.max_batch_tokens;
    ret->max_seqs = c->hello.max_seqs;
    ret->max_blocks = c->hello.max_blocks;
    ret->lease_ms = c->hello.lease_ms;
    return 0;
}

uint64_t pat_instance(const pat_conn_t *c, uint64_t *ret_start_unix_s)
{
    if (ret_start_unix_s)
        *ret_start_unix_s = c ? c->hello.start_unix_s : 0;
    return c ? c->instance : 0;
}

const char *pat_last_error(const pat_conn_t *c)
{
    return c ? c->err : "";
}

int pat_stats(const pat_conn_t *c, pat_conn_stats_t *ret)
{
    if (!c || !ret)
        return -EINVAL;
    *ret = c->stats;
    return 0;
}

int pat_ping(pat_conn_t *c)
{
    return c ? pat__call(c, IPC_OP_PING, NULL, 0, NULL, 0, NULL, 0) : -EINVAL;
}

int pat_seq_open(pat_conn_t *c, const uint32_t *tokens, uint32_t n, uint32_t *ret_seq,
                 uint32_t *ret_cached_len)
{
    if (!c || !tokens || !n || !ret_seq)
        return -EINVAL;
    ipc_seq_open_req_t r = {.n_tokens = n};
    ipc_seq_rep_t rep;
    int rc = pat__call(c, IPC_OP_SEQ_OPEN, &r, sizeof(r), tokens, (size_t)n * 4, &rep, sizeof(rep));
    if (rc < 0)
        return rc;
    *ret_seq = rep.seq;
    if (ret_cached_len)
        *ret_cached_len = rep.len;
    c->stats.prompt_tokens += n;
    c->stats.cached_tokens += rep.len;
    return 0;
}

int pat_seq_open_pending(pat_conn_t *c, const uint32_t *tokens, uint32_t n, uint32_t *ret_seq,
                         uint32_t *ret_cached_len, uint32_t *ret_pending_len)
{
    if (!c || !tokens || !n || !ret_seq)
        return -EINVAL;
    ipc_seq_open_req_t r = {.n_tokens = n};
    ipc_seq_open_rep_t rep;
    int rc = c->old_daemon ? -EOPNOTSUPP
                           : pat__call(c, IPC_OP_SEQ_OPEN_PENDING, &r, sizeof(r), tokens,
                                       (size_t)n * 4, &rep, sizeof(rep));
    if (rc == -EOPNOTSUPP) { /* a daemon older than 1.7: asked once per session */
        c->old_daemon = 1;
        c->err[0] = 0;
        rep.pending = 0;
        rc = pat_seq_open(c, tokens, n, &rep.seq, &rep.len);
        if (rc < 0)
            return rc;
    } else if (rc < 0) {
        return rc;
    } else {
        c->stats.prompt_tokens += n;
        c->stats.cached_tokens += rep.len;
    }
    *ret_seq = rep.seq;
    if (ret_cached_len)
        *ret_cached_len = rep.len;
    if (ret_pending_len)
        *ret_pending_len = rep.pending;
    return 0;
}

static int seq_op(pat_conn_t *c, uint32_t op, uint32_t seq, uint32_t arg, uint32_t *ret_seq)
{
    if (!c)
        return -EINVAL;
    ipc_seq_req_t r = {seq, arg};
    ipc_seq_rep_t rep;
    int rc = pat__call(c, op, &r, sizeof(r), NULL, 0, &rep, sizeof(rep));
    if (rc == 0 && ret_seq)
        *ret_seq = rep.seq;
    return rc;
}

int pat_seq_fork(pat_conn_t *c, uint32_t seq, uint32_t *ret_child)
{
    return ret_child ? seq_op(c, IPC_OP_SEQ_FORK, seq, 0, ret_child) : -EINVAL;
}

int pat_seq_truncate(pat_conn_t *c, uint32_t seq, uint32_t new_len)
{
    return seq_op(c, IPC_OP_SEQ_TRUNCATE, seq, new_len, NULL);
}

int pat_seq_close(pat_conn_t *c, uint32_t seq)
{
    return seq_op(c, IPC_OP_SEQ_CLOSE, seq, 0, NULL);
}
