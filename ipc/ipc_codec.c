/*
 * ipc_codec.c — frame validation and building for the patd wire protocol (ipc_proto.h).
 *
 * Every byte that arrives from a peer passes ipc_frame_check() (header) and ipc_body_check()
 * (the opcode's fixed struct and the arrays its counts announce) before anything reads a field.
 * The checks are pure functions of the bytes: no state, no allocation, so the fuzz target
 * (tests/fuzz/fuzz_frame.c) drives them directly. Semantic limits — quotas, ids the session
 * owns — are applied by the daemon on top.
 */
#include "ipc_proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "pat_base.h"

static const struct {
    const char *name;
    int admin;
} op_table[IPC_OP_MAX] = {
#define IPC_OP_ROW(n, val, adm) [val] = {#n, adm},
    IPC_OPCODES(IPC_OP_ROW)
#undef IPC_OP_ROW
};

static const struct {
    int code;
    const char *name, *text;
} err_table[] = {
#define IPC_ERR_ROW(n, e, t) {-(e), #n, t},
    IPC_ERRORS(IPC_ERR_ROW)
#undef IPC_ERR_ROW
};

const char *ipc_op_name(uint32_t opcode)
{
    return opcode < IPC_OP_MAX && op_table[opcode].name ? op_table[opcode].name : "?";
}

int ipc_op_is_admin(uint32_t opcode)
{
    if (opcode >= IPC_OP_MAX || !op_table[opcode].name)
        return -1;
    return op_table[opcode].admin;
}

int ipc_op_changes_state(uint32_t opcode)
{
    return opcode == IPC_OP_DRAIN || opcode == IPC_OP_RELOAD || opcode == IPC_OP_CHECK ||
           opcode == IPC_OP_UPGRADE;
}

const char *ipc_err_name(int code)
{
    for (size_t i = 0; i < PAT_ARRAY_SIZE(err_table); i++)
        if (err_table[i].code == code)
            return err_table[i].name;
    return NULL;
}

const char *ipc_err_text(int code)
{
    for (size_t i = 0; i < PAT_ARRAY_SIZE(err_table); i++)
        if (err_table[i].code == code)
            return err_table[i].text;
    return NULL;
}

int ipc_frame_check(const void *frame, size_t len, int want_reply, ipc_hdr_t *ret_hdr)
{
    ipc_hdr_t h;
    if (len < sizeof(h))
        return -EBADMSG;
    memcpy(&h, frame, sizeof(h));
    if (h.magic != IPC_MAGIC || (h.session == 0 && h.key != 0) || (h.flags & ~IPC_F_KNOWN))
        return -EBADMSG;
    if (!!(h.flags & IPC_F_REPLY) != !!want_reply)
        return -EBADMSG;
    if (h.version != IPC_VERSION)
        return -EPROTONOSUPPORT;
    /* an error reply echoes whatever opcode the refused request carried */
    if (ipc_op_is_admin(h.opcode) < 0 && !(want_reply && (h.flags & IPC_F_ERROR)))
        return -EOPNOTSUPP;
    if (len > IPC_MAX_FRAME || (size_t)h.body_len != len - sizeof(h))
        return -EMSGSIZE;
    *ret_hdr = h;
    return 0;
}

/* Exactly `fixed` bytes, or fixed + the arrays announced (computed in 64 bits: no overflow). */
static int need_len(size_t len, uint64_t want)
{
    return (uint64_t)len == want ? 0 : -EMSGSIZE;
}

static int check_hello(const ipc_hello_req_t *r)
{
    if ((r->flags & ~(IPC_HELLO_PACK_MASK | IPC_HELLO_KV_MASK)) ||
        (r->flags & IPC_HELLO_PACK_MASK) > 5 || (r->flags >> IPC_HELLO_KV_SHIFT & 0x7u) > 5 ||
        memchr(r->label, 0, sizeof(r->label)) == NULL)
        return -EBADMSG;
    for (const char *p = r->label; *p; p++) /* it goes into logs and SEQS lines verbatim */
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
            return -EINVAL;
    if (r->max_batch_tokens == 0 || r->max_batch_tokens > IPC_MAX_TOKENS)
        return -E2BIG;
    if (r->buffer_kind > IPC_BUF_CUDA)
        return -EINVAL;
    return 0;
}

int ipc_body_check(uint32_t opcode, const void *body, size_t len)
{
    switch (opcode) {
    case IPC_OP_HELLO: {
        ipc_hello_req_t r;
        if (len != sizeof(r))
            return -EMSGSIZE;
        memcpy(&r, body, sizeof(r));
        return check_hello(&r);
    }
    case IPC_OP_SEQ_OPEN:
    case IPC_OP_SEQ_OPEN_PENDING: {
        ipc_seq_open_req_t r;
        if (len < sizeof(r))
            return -EMSGSIZE;
        memcpy(&r, body, sizeof(r));
        if (r.reserved != 0)
            return -EBADMSG;
        if (r.n_tokens == 0)
            return -EINVAL;
        if (r.n_tokens > IPC_MAX_TOKENS)
            return -E2BIG;
        return need_len(len, sizeof(r) + 4ull * r.n_tokens);
    }
    case IPC_OP_SEQ_FORK:
    case IPC_OP_SEQ_CLOSE: {
        ipc_seq_req_t r;
        if (len != sizeof(r))
            return -EMSGSIZE;
        memcpy(&r, body, sizeof(r));
        return r.arg == 0 ? 0 : -EBADMSG;
    }
    case IPC_OP_SEQ_TRUNCATE:
        return need_len(len, sizeof(ipc_seq_req_t));
    case IPC_OP_STEP_BEGIN: {
        ipc_step_begin_req_t r;
        if (len < sizeof(r))
            return -EMSGSIZE;
        memcpy(&r, body, sizeof(r));
        if (r.flags != 0 || r.reserved != 0)
            return -EBADMSG;
        if (r.n_seqs > IPC_MAX_SEQS_STEP || r.n_tokens > IPC_MAX_TOKENS)
            return -E2BIG;
        if (r.n_seqs == 0 || r.n_tokens < r.n_seqs)
            return -EINVAL;
        int rc = need_len(len, sizeof(r) + 8ull * r.n_seqs + 4ull * r.n_tokens);
        if (rc < 0)
            return rc;
        /* the counts must add up: n_new >= 1 each, sum = n_tokens */
        const uint8_t *p = (const uint8_t *)body + sizeof(r);
        uint64_t sum = 0;
        for (uint32_t i = 0; i < r.n_seqs; i++) {
            ipc_step_seq_t s;
            memcpy(&s, p + 8ull * i, sizeof(s));
            if (s.n_new == 0)
                return -EINVAL;
            sum += s.n_new;
        }
        return sum == r.n_tokens ? 0 : -EINVAL;
    }
    case IPC_OP_STEP_END: {
        ipc_step_end_req_t r;
        if (len != sizeof(r))
            return -EMSGSIZE;
        memcpy(&r, body, sizeof(r));
        if ((r.flags & ~IPC_STEP_END_ABORT) || r.reserved != 0)
            return -EBADMSG;
        return 0;
    }
    case IPC_OP_BYE:
    case IPC_OP_PING:
    case IPC_OP_STATUS:
    case IPC_OP_STATS:
    case IPC_OP_SEQS:
    case IPC_OP_DRAIN:
    case IPC_OP_RELOAD:
    case IPC_OP_INFO:
    case IPC_OP_CHECK:
    case IPC_OP_UPGRADE:
    case IPC_OP_ATTACH:
        return need_len(len, 0);
    default:
        return -EOPNOTSUPP;
    }
}

void ipc_buf_init(ipc_buf_t *b)
{
    memset(b, 0, sizeof(*b));
}

void ipc_buf_done(ipc_buf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

static void buf_reserve(ipc_buf_t *b, size_t need)
{
    if (need <= b->cap)
        return;
    size_t c = b->cap ? b->cap : 256;
    while (c < need)
        c *= 2;
    b->data = pat_xrealloc(b->data, c);
    b->cap = c;
}

void ipc_frame_start(ipc_buf_t *b, uint32_t opcode, uint32_t flags, uint64_t corr, uint64_t session)
{
    ipc_hdr_t h = {.magic = IPC_MAGIC,
                   .version = IPC_VERSION,
                   .opcode = (uint16_t)opcode,
                   .flags = flags,
                   .corr = corr,
                   .session = session};
    b->len = 0;
    buf_reserve(b, sizeof(h));
    memcpy(b->data, &h, sizeof(h));
    b->len = sizeof(h);
}

void ipc_frame_set_key(ipc_buf_t *b, uint64_t key)
{
    memcpy(b->data + offsetof(ipc_hdr_t, key), &key, sizeof(key));
}

void ipc_frame_put(ipc_buf_t *b, const void *data, size_t len)
{
    buf_reserve(b, b->len + len);
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
}

void ipc_frame_finish(ipc_buf_t *b)
{
    uint32_t body = (uint32_t)(b->len - sizeof(ipc_hdr_t));
    memcpy(b->data + offsetof(ipc_hdr_t, body_len), &body, sizeof(body));
}

static uint64_t origin_instance, origin_start_ms; /* set once by the daemon at start */

void ipc_set_origin(uint64_t instance, uint64_t start_unix_ms)
{
    origin_instance = instance;
    origin_start_ms = start_unix_ms;
}

void ipc_frame_error(ipc_buf_t *b, const ipc_hdr_t *req, int code, const char *fmt, ...)
{
    ipc_err_body_t e = {
        .code = code, .instance = origin_instance, .start_unix_ms = origin_start_ms};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
    va_end(ap);
    ipc_frame_start(b, req ? req->opcode : 0, IPC_F_REPLY | IPC_F_ERROR, req ? req->corr : 0,
                    req ? req->session : 0);
    ipc_frame_put(b, &e, sizeof(e));
    ipc_frame_finish(b);
}
