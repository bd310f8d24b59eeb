/*
 * pat.h — libpat, the client library of patd: the public C ABI for serving frontends.
 *
 * A frontend connects once with its model signature and batch size, opens sequences with their
 * prompt token ids (getting back how much of the prompt the prefix cache already holds), and
 * then runs steps: pat_step_begin() names the sequences and their new tokens, and for every
 * layer the frontend writes Q, K and V of the new tokens into the staging buffers and calls
 * pat_attend(layer), which returns once O of that layer is in the O buffer. pat_step_end()
 * commits the step's KV (or aborts it).
 *
 * Contract:
 *   - every call returns 0 (or a count) on success and a negative errno on failure;
 *     pat_strerror() names it and pat_last_error() holds the daemon's detail for the last
 *     failure of a connection;
 *   - handles are opaque; structs that cross the ABI start with a size field or end with
 *     reserved fields; integers are fixed-width;
 *   - a connection is used by one thread at a time (calls are not reentrant per connection);
 *     different connections are independent;
 *   - if the daemon goes away, calls return -ECONNRESET from then on: pat_close() the
 *     connection and pat_connect() again (sequences do not survive; the prefix cache of a
 *     restarted daemon starts empty).
 *
 * Staging rows are [max_batch_tokens][heads][head_dim] elements of the model dtype; the rows
 * of a step are its sequences' new tokens in the order given to pat_step_begin(). A NaN or an
 * infinity in K or V is stored in the KV cache as 0 (the cache never holds one, so it cannot
 * reach another session's attention through a reused block).
 *
 * GPU sessions (a daemon on the cuda backend; pat_buffers().on_gpu = 1): the staging buffers are
 * device memory of the daemon's GPU, the session's own allocation mapped into this process from
 * the descriptor HELLO brought (CUDA virtual memory); the process needs the
 * CUDA driver and must see that GPU. Per layer the frontend writes Q, K, V on its stream and
 * calls pat_attend_async(layer, stream): the hand-off is enqueued on the stream and the call
 * returns at once; work enqueued after it sees O. Nothing waits on the CPU until pat_step_end(),
 * which returns once the daemon ran every layer. Every layer of a step must be handed over
 * (pat_step_end() hands over the ones left). The hand-offs can be captured in a CUDA graph
 * (outside a step): per replay call pat_step_begin(), replay, pat_step_replayed(),
 * pat_step_end(). A captured graph holds the session's epoch (pat_gpu_epoch()); it changes only
 * when the daemon had to cut a step (a stall past its step timeout): re-capture then. Run patd and
 * the frontends under MPS (README), or every hand-off waits for a GPU context switch.
 */
#ifndef PAT_H
#define PAT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PAT_VERSION_MAJOR 1
#define PAT_VERSION_MINOR 11
#define PAT_VERSION_PATCH 0
#define PAT_VERSION       ((PAT_VERSION_MAJOR << 16) | (PAT_VERSION_MINOR << 8) | PAT_VERSION_PATCH)

#if defined(__GNUC__)
#define PAT_API __attribute__((visibility("default")))
#else
#define PAT_API
#endif

/* Element types of Q, K, V and O (same values as the daemon's model.dtype). */
#define PAT_F16  1u
#define PAT_BF16 2u
#define PAT_F32  3u
/* The KV pool's fp8 element types (pat_status_t.kv_dtype, since 1.11): a daemon stores K and V
 * so when its model.kv_dtype says; clients always hand over K and V in their dtype */
#define PAT_FP8_E4M3 4u
#define PAT_FP8_E5M2 5u

typedef struct pat_conn pat_conn_t;

/* Where the staging buffers live (pat_connect_opts_t.buffer). */
#define PAT_BUFFER_AUTO 0u
#define PAT_BUFFER_HOST 1u /* POSIX shm: a daemon on the cpu backend */
#define PAT_BUFFER_GPU  2u /* device memory (by descriptor): a daemon on the cuda backend */

typedef struct pat_model {
    uint32_t n_layers, q_heads, kv_heads, head_dim;
    uint32_t dtype;      /* PAT_F16, PAT_BF16, PAT_F32 */
    uint32_t block_size; /* tokens per KV block (16) */
    uint64_t model_id;   /* must equal the daemon's model.model_id */
} pat_model_t;

typedef struct pat_connect_opts {
    uint32_t size;             /* sizeof(pat_connect_opts_t) */
    uint32_t max_batch_tokens; /* staging rows: the most new tokens in one step */
    uint32_t max_seqs;         /* open sequences wanted; 0 = the daemon's per-connection quota */
    uint32_t timeout_ms;       /* per request and per layer wait; 0 = 30000 */
    uint32_t lease_ms;         /* 0 = the daemon's default (used when it cannot watch our pid) */
    uint32_t buffer;           /* PAT_BUFFER_AUTO (what the daemon's backend uses), _HOST, _GPU */
    const char *socket;        /* control socket path; NULL = $PATD_SOCKET, else the default */
    const char *label;         /* shown by `patctl seqs`; may be NULL */
    pat_model_t model;
    uint32_t pack_policy; /* since 1.6: PAT_PACK_*; 0 = the daemon's daemon.pack_policy */
    /* since 1.11: the KV pool's element type this client needs (PAT_F16 ... PAT_FP8_E5M2): a
     * daemon whose pool holds another refuses it (-EMEDIUMTYPE; a daemon older than 1.11
     * refuses any value but 0, -EBADMSG); 0: whatever the daemon's holds (pat_buffers says).
     * It was reserved0 before: zero the whole struct (= {...} or memset) as every version asks,
     * and check pat_version() >= 1.11 before relying on it (an older libpat ignores it) */
    uint32_t kv_dtype;
    uint64_t reserved[7];
} pat_connect_opts_t;

/* How the daemon packs a session's queries into CTAs (pat_connect_opts_t.pack_policy, and the
 * one that built a step's pack in pat_step_info_t.pack_policy). Since 1.6. */
#define PAT_PACK_DEFAULT 0u /* the daemon's daemon.pack_policy */
#define PAT_PACK_AUTO    1u /* per step, the least modelled time of the four below */
#define PAT_PACK_BYTES   2u /* exact bytes per decision, GQA rows and tile overflow */
#define PAT_PACK_PAPER   3u /* PAT's TreeHeuristic */
#define PAT_PACK_QUERY   4u /* one pack per query over its whole KV (query-centric baseline) */
#define PAT_PACK_TREE    5u /* queries in prefix-tree order, up to a tile's rows per CTA */

typedef struct pat_buffers {
    void *q, *k, *v, *o;   /* staging buffers, valid until pat_close() */
    uint64_t q_row_bytes;  /* one token's Q (and O): q_heads * head_dim * element size */
    uint64_t kv_row_bytes; /* one token's K (and V) */
    uint32_t max_batch_tokens;
    uint32_t max_seqs;
    uint32_t max_blocks; /* the daemon's block quota for this connection */
    uint32_t lease_ms;
    uint32_t on_gpu; /* 1: q/k/v/o are device pointers (a GPU session) */
    uint32_t mps;    /* GPU sessions: 1 when the daemon's GPU contexts are MPS clients */
    /* since 1.11: the daemon's KV pool (its model.kv_dtype, kv_scale; 0 and 0 from an older
     * daemon, whose pool holds model.dtype) */
    uint32_t kv_dtype;
    float kv_scale;
    uint64_t reserved[6];
} pat_buffers_t;

typedef struct pat_step_info {
    uint64_t step;
    uint32_t n_tokens;
    uint32_t pack_reused; /* the daemon reused the previous pack (forest shape unchanged) */
    uint64_t kv_bytes;    /* K+V bytes the plan reads per layer */
    uint64_t qc_bytes;    /* ... and what query-centric attention would read */
    uint32_t layers_done;
    uint32_t committed;   /* 1: the tokens are now part of their sequences */
    uint64_t step_ns;     /* daemon: STEP_BEGIN received -> last layer done */
    uint32_t pack_policy; /* since 1.6: the PAT_PACK_* that built this step's pack (0: older) */
    uint32_t reserved0;
    uint64_t reserved[3];
} pat_step_info_t;

typedef struct pat_conn_stats {
    uint64_t steps, tokens;
    uint64_t kv_bytes, qc_bytes; /* summed over steps and layers */
    uint64_t prompt_tokens;      /* given to pat_seq_open */
    uint64_t cached_tokens;      /* ... of which the prefix cache already held */
    uint64_t reserved[8];
} pat_conn_stats_t;

typedef enum pat_admin_op {
    PAT_ADMIN_STATUS = 16,  /* text for people: "key value" lines (programs: pat_status) */
    PAT_ADMIN_STATS = 17,   /* Prometheus text format */
    PAT_ADMIN_SEQS = 18,    /* one line per open sequence */
    PAT_ADMIN_DRAIN = 19,   /* refuse new work, finish steps in flight, exit */
    PAT_ADMIN_RELOAD = 20,  /* re-read the config file */
    PAT_ADMIN_CHECK = 22,   /* run the KV pool's invariant check: "pool_check ok ..." (since 1.2) */
    PAT_ADMIN_UPGRADE = 25, /* start the daemon's binary as its successor, which takes over the
                               cache and the sockets once ready: "upgrading: pid N ..." (1.10) */
} pat_admin_op_t;

/* What a daemon reports about itself (pat_status, since 1.2). */
typedef struct pat_status {
    uint32_t size;     /* set by the caller: sizeof(pat_status_t) */
    uint32_t protocol; /* the daemon's wire protocol version */
    uint32_t version;  /* the daemon's release, encoded as PAT_VERSION */
    uint32_t pid;
    uint64_t instance; /* random per daemon start (a changed value: the daemon restarted) */
    uint64_t uptime_ms;
    uint32_t draining; /* 1: refusing new work, finishing steps in flight */
    uint32_t max_seq_len;
    char backend[16]; /* "cpu" | "cuda" */
    pat_model_t model;
    uint32_t max_conns, conn_max_seqs, conn_max_blocks, conn_max_batch_tokens;
    uint32_t conn_max_staging_mb, lease_ms, step_timeout_ms;
    uint32_t blocks_total, blocks_free, blocks_used, blocks_cached; /* the KV pool now */
    uint32_t sequences, connections, steps_in_flight;
    float scale;   /* since 1.6: the softmax scale the daemon applies (0: an older daemon) */
    float softcap; /* since 1.6: its logit soft cap (0: off, or an older daemon) */
    /* since 1.11: the KV pool's element type, PAT_F16 / PAT_BF16 / PAT_F32 or PAT_FP8_E4M3 /
     * PAT_FP8_E5M2 (0: an older daemon, whose pool holds model.dtype), and fp8's factor (stored =
     * value / kv_scale) */
    uint32_t kv_dtype;
    float kv_scale;
    uint64_t reserved[4];
} pat_status_t;

PAT_API uint32_t pat_version(void); /* PAT_VERSION of the library actually loaded */
PAT_API const char *pat_strerror(int err);
/* The default control socket: $PATD_SOCKET, else /run/patd/patd.sock as root, else
 * $XDG_RUNTIME_DIR/patd/patd.sock, else /tmp/patd-<uid>/patd.sock. */
PAT_API const char *pat_default_socket(void);

/* Connects and maps the staging buffers. Returns 0 and *ret, or -ENOENT (no daemon: no socket
 * at the path), -ECONNREFUSED (no daemon: a stale socket file nothing listens on, as a crashed
 * patd leaves; both at once, without waiting for the timeout), -ETIMEDOUT, -EMEDIUMTYPE (model
 * mismatch), -EDQUOT (a per-session quota), -EMFILE (limits.max_conns, limits.conns_per_uid),
 * -ENOBUFS (the daemon's staging budget, limits.staging_mb, is taken by the open sessions; an
 * older daemon answered -ENOMEM), -ENOMEM (the daemon's memory, or its cgroup's), -ESHUTDOWN,
 * -EINVAL. A refusal is not tried again. A HELLO the daemon closes or resets before replying, or
 * answers -EBUSY, is tried again with backoff within timeout_ms (-ECONNRESET, -EPIPE or -EBUSY
 * when no try got through). On failure *ret is untouched and why (if not NULL, why_len bytes)
 * holds the detail: for a refusal, the daemon's, naming the option and the numbers. */
PAT_API int pat_connect(const pat_connect_opts_t *opts, pat_conn_t **ret, char *why,
                        size_t why_len);
/* Ends the session (the daemon reclaims everything it held) and frees the handle; NULL ok. */
PAT_API void pat_close(pat_conn_t *c);
PAT_API int pat_buffers(const pat_conn_t *c, pat_buffers_t *ret);
PAT_API const char *pat_last_error(const pat_conn_t *c);
PAT_API int pat_ping(pat_conn_t *c);
/* Since 1.6: the daemon instance this session is with (random per daemon start, as
 * pat_status().instance) and, if ret_start_unix_s is not NULL, when it started. A client that
 * reconnects compares it with the old session's to learn whether it talks to the same daemon.
 * Every call of a session whose daemon restarted returns -ESTALE (another instance answers at
 * the socket: this session's sequences and KV are gone; reconnect), one whose daemon went away
 * with nothing answering -ECONNRESET; both stay so. */
PAT_API uint64_t pat_instance(const pat_conn_t *c, uint64_t *ret_start_unix_s);

PAT_API int pat_seq_open(pat_conn_t *c, const uint32_t *tokens, uint32_t n, uint32_t *ret_seq,
                         uint32_t *ret_cached_len);
/* Since 1.7: pat_seq_open, and in *ret_pending_len the prompt tokens past *ret_cached_len (whole
 * blocks) that other open sequences of this user's prefix scope, in any session, are about to
 * write: they were opened with the same prompt blocks and have not yet committed them (twins;
 * the same new prompt sent twice in a burst). patd never waits for them; a frontend that does
 * (closes this sequence and opens it again once they are written, e.g. after its twin's next
 * step) prefills that many tokens less. 0 from a daemon older than 1.7 (-EOPNOTSUPP there:
 * this call then opens with SEQ_OPEN). ret_cached_len and ret_pending_len may be NULL. */
PAT_API int pat_seq_open_pending(pat_conn_t *c, const uint32_t *tokens, uint32_t n,
                                 uint32_t *ret_seq, uint32_t *ret_cached_len,
                                 uint32_t *ret_pending_len);
PAT_API int pat_seq_fork(pat_conn_t *c, uint32_t seq, uint32_t *ret_child);
PAT_API int pat_seq_truncate(pat_conn_t *c, uint32_t seq, uint32_t new_len);
PAT_API int pat_seq_close(pat_conn_t *c, uint32_t seq);

/* Starts a step: n_seqs sequences, n_new[i] new tokens each, token ids of all new tokens in
 * order. Returns at once after sending (the daemon reserves and packs meanwhile); its answer is
 * collected by the first pat_attend (or pat_step_end). -EINVAL/-E2BIG for what can be checked
 * locally, -EBUSY if a step is already open. */
PAT_API int pat_step_begin(pat_conn_t *c, const uint32_t *seqs, const uint32_t *n_new,
                           uint32_t n_seqs, const uint32_t *tokens);
/* Hands over layer `layer` (Q, K, V written) and waits for its O. Layers go 0, 1, ... in order.
 * Errors: the daemon's answer to the step (-ENOSPC, -EDQUOT, -ENOENT, ...), -ETIMEDOUT,
 * -ECANCELED/-ETIMEDOUT if the daemon aborted the step, -ESHUTDOWN, -ECONNRESET. */
PAT_API int pat_attend(pat_conn_t *c, uint32_t layer);
/* GPU sessions: enqueues the hand-off of `layer` (Q, K, V written by earlier work on the stream)
 * on `stream` (a cudaStream_t / CUstream of the daemon's GPU; NULL = the legacy default stream)
 * and returns without waiting; later work on the stream sees O. Layers go 0, 1, ... in order,
 * and a layer's hand-off must run after the previous layer's on the GPU (the same stream, or one
 * that waits for it, as layer L + 1's Q needing layer L's O demands). On a capturing stream the
 * hand-off is recorded (no step needed). Returns 0, -EINVAL, -ESRCH (no step open), -ECONNRESET,
 * -EIO (a CUDA error; pat_last_error says which), -ENOTSUP for a host-memory session. The daemon's
 * answer to the step (-ENOSPC, ...) comes from pat_step_end. */
PAT_API int pat_attend_async(pat_conn_t *c, uint32_t layer, void *stream);
/* GPU sessions: a captured graph with every layer's hand-off was replayed on `stream` for this
 * step. Returns 0, -EINVAL, -ESRCH. */
PAT_API int pat_step_replayed(pat_conn_t *c, void *stream);
/* GPU sessions: the value a captured graph's hand-offs carry; 0 for host sessions. */
PAT_API uint64_t pat_gpu_epoch(const pat_conn_t *c);

/* Ends the step: commits its KV when every layer ran, or drops it when abort != 0 (a step
 * whose layers did not all run is always dropped and reported as -ECANCELED unless abort).
 * -ETIMEDOUT (no answer, to this or to the step's STEP_BEGIN, which a host session's daemon
 * gives once an executor takes the step): the step stays open, the call may be repeated; until
 * it ends, other requests of the session return -ETIMEDOUT without being sent. */
PAT_API int pat_step_end(pat_conn_t *c, int abort, pat_step_info_t *ret_info);
PAT_API int pat_stats(const pat_conn_t *c, pat_conn_stats_t *ret);

/* Operator requests (no session): *ret_text is malloc'd, NUL-terminated (the answer, or on a
 * failure its detail where there is one: the daemon's, or the socket no daemon answers at); free
 * with pat_free. Returns 0 or a negative errno: -ENOENT and -ECONNREFUSED (no daemon, as
 * pat_connect; at once), -ETIMEDOUT, ... DRAIN, RELOAD and CHECK go to the admin socket beside
 * `socket` (<name>.admin; since 1.2) and are refused with -EPERM unless the caller is patd's
 * user, root or in its daemon.admin_group. */
PAT_API int pat_admin(const char *socket, pat_admin_op_t op, uint32_t timeout_ms, char **ret_text);
PAT_API void pat_free(void *p);
/* The daemon's figures, typed (no session). ret->size must be set; fields a daemon does not
 * report read 0. Returns 0, -ENOENT or -ECONNREFUSED (no daemon, as pat_connect; at once),
 * -ETIMEDOUT, -EOPNOTSUPP (a daemon older than 1.2), -EINVAL (ret NULL or ret->size too small). */
PAT_API int pat_status(const char *socket, uint32_t timeout_ms, pat_status_t *ret);

#ifdef __cplusplus
}
#endif

#endif
