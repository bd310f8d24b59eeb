/*
 * ipc_proto.h — the patd wire protocol (IPC_VERSION): frames on patd's Unix stream sockets.
 *
 * Every frame is a 40-byte header followed by a fixed-layout little-endian body. Request bodies
 * are one fixed struct per opcode, optionally followed by arrays whose counts the struct gives;
 * a body whose length is not exactly what its counts imply is refused (-EMSGSIZE). A reply
 * carries the request's opcode and correlation id with IPC_F_REPLY set; an error reply has
 * IPC_F_ERROR set and an ipc_err_body_t (a negative errno from IPC_ERRORS plus a text).
 *
 * Who uses it: the daemon (decode requests, encode replies) and libpat (the reverse). Neither
 * trusts the other's lengths: ipc_frame_check() and the body decoders validate every field.
 *
 * Sockets: requests of a session go on the control socket (<name>.sock), on a connection bound
 * to that session; HELLO and the admin requests go on the admin socket (<name>.admin), one frame
 * each way per connection, where the kernel names the caller (SO_PEERCRED): the session is bound
 * to that process (its pid is the one watched, its uid counts toward limits.conns_per_uid; the pid
 * the HELLO carries is only logged). DRAIN, RELOAD, CHECK and UPGRADE are served on the admin
 * socket only (-EPERM on the control socket), to the daemon's user, root and daemon.admin_group.
 *
 * Buffers: HELLO names the buffer kind, and the session's buffers reach its client alone, as
 * descriptors beside the HELLO reply (SCM_RIGHTS). Host memory (cpu backend): one sealed memfd
 * with no name holds the signal page and the staging rows. Device memory (cuda backend): the
 * staging rows are a device allocation of the session's own and its per-layer 64-bit handshake
 * words a pinned host allocation of its own (ipc_shm.h, "GPU sessions").
 *
 * A peer of another version is refused with -EPROTONOSUPPORT. An opcode a daemon does not serve
 * is refused with -EOPNOTSUPP. Error codes (IPC_ERRORS) are an open set within a version: the
 * error body's layout is what the version fixes; a peer that does not know a code still reads it
 * and the daemon's text beside it, so a new code needs no new version.
 */
#ifndef IPC_PROTO_H
#define IPC_PROTO_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little-endian and is read in place; port ipc_codec.c first"
#endif

#define IPC_MAGIC   0x44544150u /* "PATD" read as a little-endian u32 */
#define IPC_VERSION 8u

/* Upper bounds of the protocol itself (configs may be lower): they bound what a decoder will
 * even look at before the connection's own limits apply. */
#define IPC_MAX_FRAME     (64u << 20) /* bytes of one frame, header included */
#define IPC_MAX_TOKENS    (1u << 22)  /* token ids in one frame */
#define IPC_MAX_SEQS_STEP 65536u      /* sequences in one step */
#define IPC_NAME_LEN      64u         /* shm names, client labels (NUL-terminated) */
#define IPC_ERRMSG_LEN    184u

/* Opcodes: name, value, admin (usable without a session). One table; ipc_codec.c sizes each
 * body from it. */
#define IPC_OPCODES(X)                                                                             \
    X(HELLO, 1, 2)        /* admin socket only: open a session bound to the caller (SO_PEERCRED):  \
                             model signature, sizes -> layout, key, buffer fd (SCM_RIGHTS) */      \
    X(BYE, 2, 0)          /* close the session; everything it holds is reclaimed */                \
    X(PING, 3, 0)         /* renew the lease */                                                    \
    X(SEQ_OPEN, 4, 0)     /* prompt token ids -> sequence id, cached_len */                        \
    X(SEQ_FORK, 5, 0)     /* share all full blocks, copy the partial one */                        \
    X(SEQ_TRUNCATE, 6, 0) /* roll back to a length */                                              \
    X(SEQ_CLOSE, 7, 0)                                                                             \
    X(STEP_BEGIN, 8, 0)        /* sequences, new-token counts and ids -> step id */                \
    X(STEP_END, 9, 0)          /* commit the step's KV, or abort it */                             \
    X(STATUS, 16, 1)           /* admin: text, one "key value" per line */                         \
    X(STATS, 17, 1)            /* admin: counters, one "name value" per line */                    \
    X(SEQS, 18, 1)             /* admin: open sequences, one per line */                           \
    X(DRAIN, 19, 1)            /* admin: refuse new work, finish in-flight steps, exit */          \
    X(RELOAD, 20, 1)           /* admin: re-read the config file (as SIGHUP) */                    \
    X(INFO, 21, 1)             /* admin: the daemon's figures as one ipc_info_rep_t */             \
    X(CHECK, 22, 1)            /* admin: the KV pool's invariant check (O(blocks)), text */        \
    X(ATTACH, 23, 2)           /* retired (HELLO binds the session): -EOPNOTSUPP */                \
    X(SEQ_OPEN_PENDING, 24, 0) /* since 1.7: SEQ_OPEN's body -> ipc_seq_open_rep_t (+ pending) */  \
    X(UPGRADE, 25, 1)          /* admin, since 1.10: start the binary as a successor (SIGUSR2) */

typedef enum ipc_op {
#define IPC_OP_ENUM(name, val, admin) IPC_OP_##name = val,
    IPC_OPCODES(IPC_OP_ENUM)
#undef IPC_OP_ENUM
        IPC_OP_MAX = 26
} ipc_op_t;

/* Error codes on the wire and from every libpat call: a negative errno with a patd meaning.
 * name, errno value, text. libpat's pat_strerror() and the daemon's metrics use this table. */
#define IPC_ERRORS(X)                                                                              \
    X(BAD_MAGIC, EBADMSG, "malformed frame (bad magic, reserved field or layout)")                 \
    X(VERSION, EPROTONOSUPPORT, "protocol version not supported")                                  \
    X(OPCODE, EOPNOTSUPP, "unknown opcode")                                                        \
    X(LENGTH, EMSGSIZE, "body length does not match the header or its counts")                     \
    X(TOO_BIG, E2BIG, "a count exceeds the connection's limits")                                   \
    X(INVAL, EINVAL, "invalid field value")                                                        \
    X(NO_SEQ, ENOENT, "unknown sequence id for this session")                                      \
    X(RANGE, ERANGE, "offset or length outside the buffers this session owns")                     \
    X(QUOTA, EDQUOT, "per-connection quota exceeded")                                              \
    X(NOSPC, ENOSPC, "KV pool out of blocks (preempt and retry)")                                  \
    X(MODEL, EMEDIUMTYPE, "model signature does not match the daemon's")                           \
    X(SESSION, ENOTCONN, "unknown session (expired, closed, or the daemon restarted)")             \
    X(BUSY, EBUSY,                                                                                 \
      "busy: a step holds the sequence or is running, a reload is in progress, or (HELLO) the "    \
      "admin socket is busy: try again")                                                           \
    X(NO_STEP, ESRCH, "no such step in flight")                                                    \
    X(SHUTDOWN, ESHUTDOWN, "daemon is draining or shutting down")                                  \
    X(TOO_MANY, EMFILE, "too many connections or sequences")                                       \
    X(TIMEDOUT, ETIMEDOUT, "timed out waiting for the peer")                                       \
    X(CANCELED, ECANCELED, "step aborted before every layer ran")                                  \
    X(LOST, ECONNRESET, "patd went away (crashed, restarted or stopped); reconnect")               \
    X(NOMEM, ENOMEM,                                                                               \
      "daemon could not allocate the session's buffers (no memory left, or not with "              \
      "limits.memory_headroom_mb to spare below its cgroup's memory limit)")                       \
    X(STAGING, ENOBUFS,                                                                            \
      "staging budget exhausted (limits.staging_mb): the open sessions' staging leaves no room "   \
      "for this one's max_batch_tokens; retry once one closes, or ask for fewer tokens")           \
    X(PERM, EPERM, "operation not permitted")                                                      \
    X(ATTACHED, EALREADY, "the session is attached already")

/* ------------------------------------------------------------------ header */
#define IPC_F_REPLY 0x1u /* set on every reply */
#define IPC_F_ERROR 0x2u /* reply body is ipc_err_body_t */
#define IPC_F_KNOWN (IPC_F_REPLY | IPC_F_ERROR)

typedef struct __attribute__((packed)) ipc_hdr {
    uint32_t magic;    /* IPC_MAGIC */
    uint16_t version;  /* IPC_VERSION */
    uint16_t opcode;   /* ipc_op_t */
    uint32_t flags;    /* IPC_F_* ; unknown bits refused */
    uint32_t body_len; /* bytes after the header */
    uint64_t corr;     /* correlation id chosen by the requester, echoed in the reply */
    uint64_t session;  /* from the HELLO reply; 0 for HELLO and admin opcodes */
    uint64_t key;      /* the session's key from the HELLO reply (0 with session 0): the id alone
                          names a session, id and key together let a request act on it */
} ipc_hdr_t;
_Static_assert(sizeof(ipc_hdr_t) == 40, "wire header is 40 bytes");

typedef struct ipc_err_body {
    int32_t code; /* negative errno from IPC_ERRORS */
    uint32_t reserved;
    char msg[IPC_ERRMSG_LEN]; /* NUL-terminated detail for humans */
    /* who answered, so a client tells a daemon that restarted between two of its calls from
     * one that refused the call */
    uint64_t instance;      /* the answering daemon's instance (as in the HELLO reply) */
    uint64_t start_unix_ms; /* when it started */
} ipc_err_body_t;
_Static_assert(sizeof(ipc_err_body_t) == 208, "error body layout");

/* ------------------------------------------------------------------ bodies */
/* The model a client was built for; the daemon refuses any difference (-EMEDIUMTYPE). */
typedef struct ipc_model_sig {
    uint32_t n_layers, q_heads, kv_heads, head_dim;
    uint32_t dtype; /* kern_dtype_t */
    uint32_t block_size;
    uint64_t model_id;
} ipc_model_sig_t;
_Static_assert(sizeof(ipc_model_sig_t) == 32, "model signature layout");

#define IPC_BUF_SHM  1u /* POSIX shm, host memory (cpu backend) */
#define IPC_BUF_CUDA 2u /* device memory of the session's own, by fd (cuda backend) */

typedef struct ipc_hello_req {
    ipc_model_sig_t model;
    uint32_t pid;              /* the client's pid, watched with a pidfd */
    uint32_t max_batch_tokens; /* staging rows wanted; <= the quota */
    uint32_t max_seqs;         /* open sequences wanted; 0 = the quota */
    uint32_t buffer_kind;      /* IPC_BUF_*, 0 = what the backend uses */
    uint32_t lease_ms;         /* 0 = the daemon's default; bounded by its min/max */
    uint32_t flags;            /* IPC_HELLO_PACK and IPC_HELLO_KV bits; every other bit 0 */
    char label[IPC_NAME_LEN];  /* printable ASCII for logs and `patctl seqs` (else -EINVAL) */
} ipc_hello_req_t;
_Static_assert(sizeof(ipc_hello_req_t) == 120, "hello layout");
/* HELLO flags bits 0-2: the session's pack policy, sched_policy_t + 1 (1 auto,
 * 2 bytes, 3 paper, 4 query, 5 tree); 0: the daemon's daemon.pack_policy */
#define IPC_HELLO_PACK_MASK 0x7u
/* HELLO flags bits 3-5 (since 1.11): the KV pool's element type the client needs, a
 * kern_dtype_t; the daemon refuses a session whose pool holds another (-EMEDIUMTYPE); 0: any */
#define IPC_HELLO_KV_SHIFT 3u
#define IPC_HELLO_KV_MASK  (0x7u << IPC_HELLO_KV_SHIFT)

/* Signal words: see ipc_shm.h. IPC_BUF_SHM: offsets are from the start of the staging buffer,
 * of buf_bytes, whose fd comes beside the HELLO reply (shm_name is empty: the buffer has no name).
 * IPC_BUF_CUDA: two fds come beside the reply, in this order, each a CUDA virtual-memory
 * allocation's POSIX descriptor that names the session's memory and nothing else: its signal
 * slice (host memory: import it, map sig_bytes of it and grant the device and the CPU access;
 * the slice starts there, sig_off is 0) and its staging allocation (device memory: import it, map
 * dev_map_bytes of it; q/k/v/o offsets are from its start, the layout's dev_bytes). shm_name is
 * empty. */
typedef struct ipc_hello_rep {
    uint64_t session;
    uint32_t daemon_pid;
    uint32_t lease_ms;
    uint32_t max_seqs, max_batch_tokens, max_blocks, buffer_kind;
    uint64_t buf_bytes;
    uint64_t sig_off, q_off, k_off, v_off, o_off; /* rows: [max_batch_tokens][heads][head_dim] */
    uint64_t instance; /* random per daemon start: tells a restart apart */
    char shm_name[IPC_NAME_LEN];
    uint64_t dev_map_bytes; /* IPC_BUF_CUDA: the staging allocation's size */
    uint32_t kv_dtype;      /* since 1.11: the KV pool's elements (kern_dtype_t); 0: older */
    float kv_scale;         /* since 1.11: fp8's factor (stored = value / kv_scale), else 1 */
    uint8_t reserved[56];   /* 0 */
    uint64_t dev_bytes;     /* IPC_BUF_CUDA: the layout's bytes, <= dev_map_bytes */
    uint64_t sig_bytes;     /* IPC_BUF_CUDA: the signal slice's allocation, >= ipc_gsig_bytes */
    uint8_t dev_uuid[16];   /* IPC_BUF_CUDA: the GPU (cudaDeviceProp.uuid) */
    uint32_t mps;           /* 1: the daemon's GPU contexts are MPS clients */
    uint32_t start_unix_s;  /* when the daemon started */
    uint64_t key; /* 64 random bits, never published: every request of the session carries it */
} ipc_hello_rep_t;
_Static_assert(sizeof(ipc_hello_rep_t) == 272, "hello reply layout");

typedef struct ipc_seq_open_req {
    uint32_t n_tokens; /* followed by uint32_t tokens[n_tokens] (the prompt) */
    uint32_t reserved;
} ipc_seq_open_req_t;

typedef struct ipc_seq_rep {
    uint32_t seq;
    uint32_t len; /* cached_len for open; the length after the op otherwise */
} ipc_seq_rep_t;

/* SEQ_OPEN_PENDING's reply: SEQ_OPEN's, and the prompt tokens past cached_len that other open
 * sequences of the session's prefix scope are about to write (kv_seq_open_pending) */
typedef struct ipc_seq_open_rep {
    uint32_t seq;
    uint32_t len; /* cached_len */
    uint32_t pending;
    uint32_t reserved;
} ipc_seq_open_rep_t;
_Static_assert(sizeof(ipc_seq_open_rep_t) == 16, "open reply layout");
_Static_assert(offsetof(ipc_seq_open_rep_t, len) == offsetof(ipc_seq_rep_t, len),
               "SEQ_OPEN's reply is the first 8 bytes of SEQ_OPEN_PENDING's");

typedef struct ipc_seq_req {
    uint32_t seq;
    uint32_t arg; /* new_len for truncate; 0 otherwise */
} ipc_seq_req_t;

typedef struct ipc_step_seq {
    uint32_t seq;
    uint32_t n_new; /* new tokens this step, >= 1 */
} ipc_step_seq_t;

#define IPC_STEP_F_NONE 0u
typedef struct ipc_step_begin_req {
    uint32_t n_seqs;   /* followed by ipc_step_seq_t seqs[n_seqs] */
    uint32_t n_tokens; /* ... then uint32_t tokens[n_tokens]; n_tokens = sum of n_new */
    uint32_t flags;    /* must be 0 */
    uint32_t reserved;
} ipc_step_begin_req_t;

typedef struct ipc_step_begin_rep {
    uint64_t step;      /* id for STEP_END */
    uint32_t tick_base; /* cpu sessions: layer L is handed over with signal value
                           tick_base + L + 1; GPU sessions: the handshake epoch (ipc_shm.h) */
    uint32_t n_tokens;  /* rows of Q/K/V/O this step, in the order of the request */
    uint64_t kv_bytes;  /* K+V bytes the plan reads per layer */
    uint64_t qc_bytes;  /* ... and what query-centric execution would read */
    uint32_t pack_reused;
    uint32_t pack_policy; /* the policy that built the step's pack: sched_policy_t + 1 */
} ipc_step_begin_rep_t;

#define IPC_STEP_END_ABORT 1u
typedef struct ipc_step_end_req {
    uint64_t step;  /* GPU sessions may send 0: the step in flight (a refused step's id) */
    uint32_t flags; /* IPC_STEP_END_ABORT: drop the step's KV (commit nothing) */
    uint32_t reserved;
} ipc_step_end_req_t;

typedef struct ipc_step_end_rep {
    uint32_t layers_done; /* layers whose attention ran */
    uint32_t committed;   /* 1 if the step's tokens are now part of the sequences */
    uint64_t step_ns;     /* from begin received to the last layer done */
} ipc_step_end_rep_t;

/* INFO's reply: what STATUS prints, typed. `size` is the daemon's sizeof: fields are only ever
 * appended, so a reader takes min(size, its own sizeof) bytes and zero-fills the rest. */
#define IPC_STATE_SERVING  0u
#define IPC_STATE_DRAINING 1u
typedef struct ipc_info_rep {
    uint32_t size;     /* sizeof(ipc_info_rep_t) as the daemon was built */
    uint32_t protocol; /* IPC_VERSION */
    uint32_t version;  /* the daemon's release: major << 16 | minor << 8 | patch */
    uint32_t pid;
    uint64_t instance;  /* as in the HELLO reply */
    uint64_t uptime_ms; /* since the daemon started */
    uint32_t state;     /* IPC_STATE_SERVING / IPC_STATE_DRAINING */
    uint32_t max_seq_len;
    char backend[16]; /* "cpu" | "cuda", NUL-terminated */
    ipc_model_sig_t model;
    /* limits (the live values) */
    uint32_t max_conns, conn_max_seqs, conn_max_blocks, conn_max_batch_tokens;
    uint32_t conn_max_staging_mb, lease_ms, step_timeout_ms, reserved0;
    /* the pool and the daemon now */
    uint32_t blocks_total, blocks_free, blocks_used, blocks_cached;
    uint32_t sequences, connections, steps_in_flight, reserved1;
    /* appended later than the fields above: a shorter reply reads them as 0 */
    float scale;       /* the softmax scale applied now (model.scale, or 1/sqrt(head_dim)) */
    float softcap;     /* the logit soft cap applied now (0: off) */
    uint32_t kv_dtype; /* the KV pool's elements (kern_dtype_t: model.dtype's, or fp8 4 / 5) */
    float kv_scale;    /* fp8 KV: an element is stored as value / kv_scale; else 1 */
} ipc_info_rep_t;
_Static_assert(sizeof(ipc_info_rep_t) == 168, "info reply layout");

/* ------------------------------------------------------------------ codec (ipc_codec.c) */
typedef struct ipc_buf {
    uint8_t *data;
    size_t len, cap;
} ipc_buf_t;

const char *ipc_op_name(uint32_t opcode); /* "?" if unknown */
int ipc_op_is_admin(uint32_t opcode);     /* 1 admin, 0 session, -1 unknown */
/* 1 for the admin requests that change the daemon (DRAIN, RELOAD, CHECK): the admin socket
 * serves them, to patd's user, root and daemon.admin_group only. */
int ipc_op_changes_state(uint32_t opcode);
const char *ipc_err_name(int code); /* "BAD_MAGIC"...; NULL if not in the table */
const char *ipc_err_text(int code); /* table text; NULL if not in the table */

/* Validates a received frame's header against its length. Returns 0 and *ret_hdr (copied), or
 * -EBADMSG (short, magic, reserved, flags), -EPROTONOSUPPORT, -EOPNOTSUPP, -EMSGSIZE (body
 * length differs from what arrived). want_reply: 1 to demand IPC_F_REPLY, 0 to refuse it. */
int ipc_frame_check(const void *frame, size_t len, int want_reply, ipc_hdr_t *ret_hdr);

/* Validates a request body for its opcode: exact length for its counts, counts within the
 * protocol bounds, reserved fields zero. Returns 0 or -EMSGSIZE / -E2BIG / -EBADMSG / -EINVAL.
 * Semantic limits (quotas, known ids) are the daemon's. */
int ipc_body_check(uint32_t opcode, const void *body, size_t len);

/* Frame building into a growable buffer (host OOM aborts). */
void ipc_buf_init(ipc_buf_t *b);
void ipc_buf_done(ipc_buf_t *b);
void ipc_frame_start(ipc_buf_t *b, uint32_t opcode, uint32_t flags, uint64_t corr,
                     uint64_t session);
/* after ipc_frame_start: the session's key into the header */
void ipc_frame_set_key(ipc_buf_t *b, uint64_t key);
void ipc_frame_put(ipc_buf_t *b, const void *data, size_t len);
void ipc_frame_finish(ipc_buf_t *b); /* writes body_len */
/* The daemon, once at start: the instance and start time every error reply carries. */
void ipc_set_origin(uint64_t instance, uint64_t start_unix_ms);
/* An error reply frame for a request header (or a zeroed one for an undecodable frame). */
void ipc_frame_error(ipc_buf_t *b, const ipc_hdr_t *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
