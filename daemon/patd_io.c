/*
 * patd_io.c — what the daemon sends: replies on the raw REP socket (routed by the request's
 * control header, so a reply may leave long after its request, from the loop thread), the
 * kept copy of a session's last reply for resent requests, and event lines on the PUB socket;
 * and who owns the socket files (their mode and group).
 *
 * Thread context: the loop thread (nanomsg sockets are used from it alone).
 */
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

void patd_send(patd_t *d, patd_req_t *to, const void *frame, size_t len)
{
    if (to->reply_fn) { /* the admin socket */
        to->reply_fn(to->reply_ud, frame, len);
        to->reply_fn = NULL;
        return;
    }
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
        c->last_op = to->hdr.opcode;
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

void patd_reply_ok(patd_t *d, patd_conn_t *c, patd_req_t *to, const void *body, size_t len)
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

int patd_group(const char *name, const char *key, gid_t *ret_gid)
{
    *ret_gid = (gid_t)-1;
    if (!name[0])
        return 0;
    struct group *g = getgrnam(name);
    if (!g) {
        patd_err("%s '%s' does not exist", key, name);
        return -EINVAL;
    }
    *ret_gid = g->gr_gid;
    return 0;
}

int patd_socket_own(const patd_t *d, const char *path)
{
    if (chmod(path, (mode_t)d->cfg.socket_mode) < 0 ||
        (d->gid != (gid_t)-1 && chown(path, (uid_t)-1, d->gid) < 0))
        return -errno;
    return 0;
}
