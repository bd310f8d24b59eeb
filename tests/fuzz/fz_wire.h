/*
 * fz_wire.h — the transport-level fuzzer's wire side (fuzz_sockets.c): which sockets of a live
 * patd it feeds, how one fuzz input becomes a connection (connect, a prefix, the input's bytes in
 * one or more sends with SCM_RIGHTS descriptors attached or not, then close, half-close, wait or
 * reset), and the outcome of that connection as a signature the mutator is steered by.
 *
 * An input is bytes: [mode] [param] [payload ...] (a missing mode or param reads 0).
 *   mode bits 0-2  the prefix slot of the target's table (fz_target_t.prefix)
 *   mode bits 3-4  how the connection ends (fz_end_t)
 *   mode bits 5-6  descriptors attached (fz_fds_t)
 *   mode bit  7    the payload goes in three sends (split where param says) instead of one
 *   param          the prefix's argument (a nanomsg message type, an opcode) and the split points
 * Every blocking call has a deadline; nothing here waits longer than the options say.
 */
#ifndef FZ_WIRE_H
#define FZ_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define FZ_MODE_PREFIX(m) ((m)&7u)
#define FZ_MODE_END(m)    (((m) >> 3) & 3u)
#define FZ_MODE_FDS(m)    (((m) >> 5) & 3u)
#define FZ_MODE_CHUNKED   0x80u
/* the mode a seed file of raw wire bytes runs with: no prefix, wait for the reply, no fds */
#define FZ_MODE_SEED  (2u << 3)
#define FZ_FDS_MANY   8 /* descriptors in one SCM_RIGHTS message of FZ_FDS_MANY modes */
#define FZ_PREFIX_MAX 160

typedef enum fz_end {
    FZ_END_CLOSE = 0,     /* close right after the last send */
    FZ_END_HALF_WAIT = 1, /* shutdown(SHUT_WR), then wait for the reply or the peer's close */
    FZ_END_WAIT = 2,      /* wait for the reply or the peer's close, then close */
    FZ_END_WAIT_RST = 3,  /* wait, then close with SO_LINGER 0 (a TCP reset) */
} fz_end_t;

typedef enum fz_fds {
    FZ_FDS_NONE = 0,
    FZ_FDS_ONE = 1,       /* one descriptor with the first send */
    FZ_FDS_MANY_ONCE = 2, /* FZ_FDS_MANY with the first send */
    FZ_FDS_MANY_EACH = 3, /* FZ_FDS_MANY with every send */
} fz_fds_t;

/* What a prefix slot puts before the payload. */
typedef enum fz_prefix {
    FZ_PFX_NONE,
    FZ_PFX_SP,           /* nanomsg's SP header for the target's expected peer protocol */
    FZ_PFX_SP_WRONG,     /* an SP header of a protocol the socket does not pair with */
    FZ_PFX_SP_BADMAGIC,  /* "\0SQ\0" and the peer protocol */
    FZ_PFX_SP_MSG,       /* SP header, then one ipc-transport message (type 1, length) around the
                            payload (with a REQ request id first where the peer is REQ) */
    FZ_PFX_SP_MSGTYPE,   /* as FZ_PFX_SP_MSG with the message type byte = param */
    FZ_PFX_FRAME,        /* patd's 40-byte frame header, opcode = param, body = the payload */
    FZ_PFX_FRAME_SESS,   /* as FZ_PFX_FRAME with a session id and key that name nothing */
    FZ_PFX_HTTP_GET,     /* an unfinished GET /metrics request: the payload adds header lines */
    FZ_PFX_HTTP_REQ,     /* a whole GET /metrics request, then the payload (pipelined) */
    FZ_PFX_HTTP_POST,    /* POST with Content-Length = the payload's length */
    FZ_PFX_HTTP_CHUNKED, /* POST with Transfer-Encoding: chunked, the payload as the chunks */
    FZ_PFX_HTTP_PATH,    /* "GET /": the payload is the rest of the request line */
} fz_prefix_t;

typedef enum fz_family {
    FZ_UNIX, /* a Unix stream socket <runtime_dir>/<name><suffix> */
    FZ_TCP,  /* 127.0.0.1:<metrics port> */
} fz_family_t;

/* One socket the fuzzer feeds: a row of fz_targets[]. */
typedef struct fz_target {
    const char *name;   /* sock, events, admin, metrics: --target and file names use it */
    const char *suffix; /* FZ_UNIX: after <runtime_dir>/<name> */
    fz_family_t family;
    uint16_t sp_peer;  /* nanomsg protocol id of the peer the socket expects (REQ 0x30, SUB 0x21) */
    uint16_t sp_wrong; /* one it does not pair with (the socket's own: REP to REP) */
    fz_prefix_t prefix[8];
    /* the reply bytes that make an outcome's signature (offset, length; length 0 ends the
     * list): those that tell paths apart, not those that echo the input or count time */
    struct {
        uint8_t off, len;
    } sig[3];
    int sig_http; /* 1: the reply's first line instead */
} fz_target_t;

extern const fz_target_t fz_targets[];
extern const size_t fz_n_targets;
const fz_target_t *fz_target_find(const char *name);

/* Where one daemon's sockets are. */
typedef struct fz_endpoint {
    char dir[160]; /* runtime directory; Unix sockets are <dir>/patd<suffix> */
    uint16_t port; /* metrics port */
} fz_endpoint_t;

typedef struct fz_wire_opts {
    uint32_t connect_ms; /* a Unix backlog that stays full, a TCP handshake */
    uint32_t send_ms;    /* all sends of one input together */
    uint32_t wait_ms;    /* FZ_END_*WAIT*: for the reply or the close */
    int fd;              /* the descriptor SCM_RIGHTS attaches (a memfd), -1: none */
} fz_wire_opts_t;

typedef enum fz_conn_class {
    FZ_C_OK,
    FZ_C_REFUSED, /* ECONNREFUSED, ENOENT: nothing listens */
    FZ_C_BUSY,    /* the backlog stayed full for connect_ms */
    FZ_C_TIMEOUT, /* TCP handshake */
    FZ_C_ERROR,
} fz_conn_class_t;

typedef enum fz_end_class {
    FZ_E_NONE,    /* no wait asked for */
    FZ_E_EOF,     /* the peer closed */
    FZ_E_RESET,   /* ECONNRESET / EPIPE */
    FZ_E_TIMEOUT, /* still open after wait_ms */
} fz_end_class_t;

typedef struct fz_outcome {
    fz_conn_class_t conn;
    uint32_t sends; /* sends completed */
    int send_err;   /* 0, or the errno that stopped the sends (EAGAIN: send_ms ran out) */
    fz_end_class_t end;
    uint32_t reply_len; /* bytes received */
    uint8_t reply[64];  /* the first of them */
    uint32_t rewritten; /* 1: the guard changed the input (an opcode that ends the daemon) */
} fz_outcome_t;

/* Runs one input against the target's socket at ep. Returns 0 (the outcome in *ret, whatever the
 * daemon did) or a negative errno for a failure of the harness itself (socket() failed). */
int fz_wire_run(const fz_target_t *t, const fz_endpoint_t *ep, const uint8_t *in, size_t len,
                const fz_wire_opts_t *o, fz_outcome_t *ret);

/* The outcome's signature: target, mode, how the connection went, the reply's length class and
 * its significant bytes. Two inputs with one signature took, as far as the outside can tell,
 * one path through the daemon. */
uint32_t fz_outcome_sig(const fz_target_t *t, uint8_t mode, const fz_outcome_t *o);

/* The bytes prefix slot p puts before a payload of len bytes (out holds FZ_PREFIX_MAX).
 * Returns their count. */
size_t fz_prefix_build(const fz_target_t *t, fz_prefix_t p, uint8_t param, size_t len,
                       uint8_t *out);
const char *fz_prefix_name(fz_prefix_t p);
/* A short description of an input's mode for reports ("prefix sp-msgtype(0x00), wait, 8 fds"). */
void fz_mode_describe(const fz_target_t *t, const uint8_t *in, size_t len, char *out,
                      size_t out_len);

#endif
