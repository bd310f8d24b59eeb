/*
 * patd_io.c — what the daemon sends: replies, to the control connection that waits for them
 * (patd_wire.c; a reply may leave long after its request, from the loop thread) or the admin
 * connection, the kept copy of a session's last reply; and who owns the socket files (their
 * mode and group).
 *
 * Thread context: the loop thread.
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
    if (to->wire)
        patd_wire_send(d, to->wire, frame, len);
    to->wire = 0;
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
