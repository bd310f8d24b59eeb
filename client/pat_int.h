/*
 * pat_int.h — libpat's shared state, for its own translation units only (prefix pat__): the
 * session (struct pat_conn) and what the pieces call of each other.
 *
 *   pat_client.c   what belongs to no session: error texts, default socket, version, OOM handler
 *   pat_conn.c     the control connection: sliced I/O, one request and its reply, the daemon's
 *                  life (gone: -ECONNRESET; restarted: -ESTALE)
 *   pat_admin.c    the admin socket: the HELLO that opens a session, pat_admin, pat_status
 *   pat_session.c  pat_connect, pat_close, the GPU watcher thread, sequences
 *   pat_step.c     steps: begin, the per-layer hand-off (host memory or GPU stream), end
 *   pat_gpu.c      the CUDA half of a GPU session (pat_gpu.h)
 */
#ifndef PAT_INT_H
#define PAT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ipc_proto.h"
#include "ipc_shm.h"
#include "pat.h"
#include "pat_gpu.h"

/* A step as the session sees it: ST_SENT from pat_step_begin until its answer is collected */
enum { ST_IDLE, ST_SENT, ST_BEGUN, ST_FAILED };

struct pat_conn {
    int sock;
    int lost;       /* the daemon went away: sticky lost_rc */
    int lost_rc;    /* -ESTALE: another patd instance answers at the socket; else -ECONNRESET */
    char path[256]; /* the control socket (to ask who answers there now) */
    int gone;       /* the daemon forgot the session (-ENOTCONN): sticky */
    int transport;  /* the last call failed locally (timeout, send), not by the daemon's answer */
    int old_daemon; /* SEQ_OPEN_PENDING refused (a daemon older than 1.7): SEQ_OPEN only */
    int daemon_pidfd;
    pid_t daemon_pid;
    uint32_t timeout_ms;
    uint64_t session, instance, corr;
    ipc_hello_rep_t hello;
    ipc_layout_t lay; /* of the staging buffer, checked equal to the daemon's at connect */
    pat_model_t model;
    ipc_shm_t shm;
    ipc_buf_t tx;
    char err[IPC_ERRMSG_LEN + 64];
    /* the step */
    int step_state;
    int step_err;
    uint64_t pend_corr; /* the STEP_BEGIN whose answer is still to be received */
    uint64_t step_id;
    uint32_t tick_base, next_layer, n_tokens;
    ipc_step_begin_rep_t begin_rep;
    pat_conn_stats_t stats;
    /* GPU sessions */
    pat_gpu_t *gpu;           /* NULL: a cpu (shm) session */
    uint64_t *gready, *gdone; /* the handshake words in the signal slice (CPU and device) */
    uint64_t epoch;           /* handshake value of the step (read at pat_step_begin) */
    void *last_stream;        /* where the step's last hand-off went: pat_step_end pads there */
    pthread_t watcher;
    int watch_efd;          /* eventfd: tells the watcher to exit; -1 when none runs */
    _Atomic int lost_async; /* the watcher saw the daemon die */
};

/* The session's signal page: the staging buffer's first page (cpu), or the signal slice's */
static inline ipc_sig_t *conn_sig(pat_conn_t *c)
{
    return c->gpu ? (ipc_sig_t *)pat__gpu_sig(c->gpu) : ipc_shm_sig(&c->shm);
}

/* pat_conn.c */
/* The session's error text (c may be NULL: nothing is written). */
void pat__set_err(pat_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int pat__daemon_gone(pat_conn_t *c);
int pat__open_socket(const char *path, uint32_t timeout_ms, int *ret_sock);
int pat__recv_reply(pat_conn_t *c, int sock, uint64_t corr, uint32_t timeout_ms, void **ret,
                    size_t *ret_len);
int pat__send_frame(pat_conn_t *c, int sock, const ipc_buf_t *b, uint32_t timeout_ms);
int pat__parse_reply(pat_conn_t *c, const void *msg, size_t len, const void **ret_body,
                     size_t *ret_body_len);
int pat__call(pat_conn_t *c, uint32_t op, const void *body, size_t len, const void *body2,
              size_t len2, void *out, size_t out_len);

/* pat_admin.c */
int pat__hello(pat_conn_t *c, const char *control, const ipc_hello_req_t *r, int ret_fds[2]);

/* pat_step.c */
int pat__collect_pending(pat_conn_t *c);

#endif
