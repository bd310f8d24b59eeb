/*
 * kern.h — patd's execution backends behind one plain-C interface: `cpu` (host threads; the
 * reference semantics, CI and the no-GPU default) and `cuda` (kernels/cuda). A backend owns the
 * KV pool memory and the partials workspace; it executes the scheduler's plan
 * (scheduler/sched_plan_fmt.h) one layer at a time and knows nothing of the forest or sockets.
 *
 * Memory layout (kern_layout_t, computed once per backend and used by every address computation
 * of both): per layer and block, K then V, each [kv_heads][block_size][head_dim] of the pool's
 * dtype (kern_kv_dtype: the model's, or fp8): [layer][block][K|V][kv_head][block_size][head_dim]. A
 * slot is block * block_size + offset. Q and O of a step are [token][q_head][head_dim]; new K and V
 * are [token][kv_head][head_dim]. Pointers are in the backend's address space (host for cpu, device
 * for cuda).
 *
 * Supported set (closed, checked by kern_supported before anything runs, -ENOTSUP otherwise):
 * head_dim one of KERN_HEAD_DIMS (64, 128, 256); q_heads / kv_heads (the GQA group) 1..16;
 * block_size 16; dtype fp16, bf16 or fp32; kv_dtype the dtype or, under fp16 or bf16, fp8 e4m3 or
 * e5m2 (cuda: where its kernels run sm_89 code or newer, any forward but KERN_FWD_MMA; else
 * -ENOTSUP at create). Every call returns 0 or a negative errno; nothing aborts, nothing allocates
 * after create.
 */
#ifndef KERN_H
#define KERN_H

#include <stdint.h>

#include "sched_plan_fmt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kern_dtype {
    KERN_F16 = 1,
    KERN_BF16 = 2,
    KERN_F32 = 3,
    /* the KV pool's only (kern_model_t.kv_dtype): one byte an element, daemon/base/pat_fp8.h */
    KERN_FP8_E4M3 = 4,
    KERN_FP8_E5M2 = 5,
} kern_dtype_t;

/* The head dims patd serves, written once. The support check (kern_supported), the cuda
 * backend's forward (the Makefile generates one translation unit per entry), its dispatch and the
 * KV append's, the config's error text and the Python binding's list (a test compares) all come
 * from this line; the Makefile reads it as written: keep it on one line. */
#define KERN_HEAD_DIMS(X)     X(64) X(128) X(256)
#define KERN_HEAD_DIM_TEXT(d) " " #d /* "(one of" KERN_HEAD_DIMS(KERN_HEAD_DIM_TEXT) ")" */

#define KERN_MAX_GROUP            16u
#define KERN_BLOCK_SIZE           16u
#define KERN_DEFAULT_MAX_CTA_ROWS 128u
#define KERN_MAX_CTA_ROWS         1024u /* bounds per-thread scratch: rows x head_dim floats */
#define KERN_MAX_THREADS          1024u
#define KERN_DEFAULT_PLAN_BYTES   (8u << 20)

typedef struct kern_model {
    uint32_t n_layers;
    uint32_t q_heads, kv_heads, head_dim;
    uint32_t block_size; /* tokens per KV block */
    kern_dtype_t dtype;  /* of Q, K, V and O as clients hand them over */
    /* of the KV pool: 0 = dtype; fp8 (with an fp16 or bf16 dtype) stores each element of K and
     * V as its value / kv_scale, rounded to nearest even and saturated at the format's largest
     * finite (kern_append_kv); attention reads it back times kv_scale (kern_kv_scale) */
    kern_dtype_t kv_dtype;
    float kv_scale; /* fp8 KV only: > 0, finite; 0 = 1 */
} kern_model_t;

/* the pool's element type and the factor its fp8 elements are read with (1 otherwise) */
static inline kern_dtype_t kern_kv_dtype(const kern_model_t *m)
{
    return m->kv_dtype ? m->kv_dtype : m->dtype;
}
static inline int kern_kv_fp8(const kern_model_t *m)
{
    return kern_kv_dtype(m) == KERN_FP8_E4M3 || kern_kv_dtype(m) == KERN_FP8_E5M2;
}
static inline float kern_kv_scale(const kern_model_t *m)
{
    return kern_kv_fp8(m) && m->kv_scale > 0.0f ? m->kv_scale : 1.0f;
}
/* whether the pool's element type goes with the clients': the same, or fp8 under fp16 or bf16
 * (kern_supported's rule, which the daemon's config check names apart) */
static inline int kern_kv_dtype_ok(const kern_model_t *m)
{
    return kern_kv_dtype(m) == m->dtype ||
           (kern_kv_fp8(m) && (m->dtype == KERN_F16 || m->dtype == KERN_BF16));
}

/* The KV layout as one value: element strides of [layer][block][K|V][kv_head][block_size]
 * [head_dim] (kern_layout). Every backend computes it once at create (kern_backend_t.layout) and
 * every address into the pool, host or device, is kern_layout_at of it. */
typedef struct kern_layout {
    uint64_t token; /* one token of one head: head_dim */
    uint64_t head;  /* one KV head of a block: block_size * head_dim */
    uint64_t kv;    /* K to V of a block: kv_heads * head */
    uint64_t block; /* one block of one layer, K and V: 2 * kv */
    uint64_t layer; /* one layer of every block: n_blocks * block */
    uint32_t elt;   /* bytes of one element */
    uint32_t n_layers;
} kern_layout_t;

#ifdef __CUDACC__
#define KERN_HOST_DEVICE __host__ __device__
#else
#define KERN_HOST_DEVICE
#endif

/* The element of (layer, block, K (0) or V (1), KV head, token offset in the block). */
KERN_HOST_DEVICE static inline uint64_t kern_layout_at(const kern_layout_t *l, uint32_t layer,
                                                       uint32_t block, uint32_t is_v, uint32_t head,
                                                       uint32_t off)
{
    return layer * l->layer + block * l->block + is_v * l->kv + head * l->head + off * l->token;
}

/* Bytes of the whole pool. */
static inline uint64_t kern_layout_pool_bytes(const kern_layout_t *l)
{
    return l->layer * l->n_layers * l->elt;
}

/* Where the cuda backend merges split tokens (kern_config_t.merge). */
typedef enum kern_merge {
    KERN_MERGE_LAUNCH = 0, /* a merge launch of its own after the forward (one block per token and
                              KV head): measured faster on an H100, merging inside took 1.39x
                              (tests/bench/log/2026-11-24-one-launch-per-layer.md) and 1.17x
                              (tests/bench/log/2026-11-24-tree-plans.md) its time */
    KERN_MERGE_INSIDE = 1, /* the last CTA of a split token merges inside the forward launch */
} kern_merge_t;

/* Which matrix instructions the cuda forward uses (kern_config_t.fwd). */
typedef enum kern_fwd {
    KERN_FWD_AUTO = 0,    /* on a device running the build's sm_90a code at head_dim <= 128: the
                             warp-specialized kernel for every CTA of a plan with a CTA of more
                             than 16 rows (a loading warpgroup, two wgmma warpgroups; the tile
                             table offers CTAs of up to 128 rows; KV tiles by 16-byte cp.async),
                             measured faster than LAYER against PAT; plans of smaller CTAs only
                             (unshared decode), and every plan elsewhere, as LAYER
                             (tests/bench/log/2026-11-25-ws-forward.md) */
    KERN_FWD_MMA = 1,     /* the 4-warp kernel on mma.sync for every CTA */
    KERN_FWD_LAYER = 2,   /* the 4-warp kernels, CTAs of up to 64 rows: wgmma for those of 33-64
                             rows and several segments (TREE plans) where sm_90a code runs at
                             head_dim <= 128, mma.sync elsewhere; kept as an option because
                             it measured faster than AUTO's kernel on some memory-bound plans of
                             small CTAs (tests/bench/log/2026-11-25-ws-forward.md) */
    KERN_FWD_CPASYNC = 3, /* as AUTO (its explicit name) */
    KERN_FWD_TMA = 4,     /* as AUTO, but the warp-specialized kernel loads KV pages by the tensor
                             memory accelerator; not the default: cp.async measured faster in the
                             same call on the H100 and the H200
                             (tests/bench/log/2026-11-25-tile-skip-cpasync.md) */
} kern_fwd_t;

typedef struct kern_config {
    kern_model_t model;
    uint32_t n_blocks;       /* KV pool capacity in blocks */
    uint32_t max_tokens;     /* query tokens per step */
    uint32_t max_partials;   /* partial slots a plan may use (the scheduler's bound) */
    uint32_t max_cta_rows;   /* largest tile m the plans use, <= KERN_MAX_CTA_ROWS;
                                0 = KERN_DEFAULT_MAX_CTA_ROWS */
    uint32_t n_threads;      /* cpu: worker threads <= KERN_MAX_THREADS, 0 = one per online CPU */
    int device;              /* cuda: device ordinal */
    uint32_t max_plan_bytes; /* cuda: largest plan accepted (pinned staging, device copy);
                                0 = KERN_DEFAULT_PLAN_BYTES */
    kern_merge_t merge;      /* cuda: where split tokens are merged */
    kern_fwd_t fwd;          /* cuda: matrix instructions of the forward */
    uint32_t pair_blocks;    /* cuda: blocks of the persistent Hopper forward at most; 0 = one
                                per SM (tests set a few, so that each block runs many items) */
    uint32_t serial_launch;  /* cuda: 1 = a layer's forward starts after its KV append; 0 = (where
                                the kernels run sm_90 code) launched as a programmatic dependent
                                of it, its blocks waiting on the GPU (griddepcontrol) */
    uint32_t pool_keep;      /* 1: the pool is memory a descriptor names (kern_pool_fd), which
                                another process may keep past this one and a later backend map
                                again (pool_fd); cpu: a memfd; cuda: an allocation of the
                                driver's virtual memory management with a POSIX-descriptor
                                handle (-ENOTSUP where the device or driver has none) */
    int pool_fd;             /* with pool_keep: -1 = new memory (zeroed); else the descriptor of
                                an earlier pool of this exact size, mapped as it is (the backend
                                takes a duplicate; the caller keeps its own) */
} kern_config_t;

typedef struct kern_attn_params {
    float scale;   /* softmax scale applied to q . k, > 0 (typically 1/sqrt(head_dim)) */
    float softcap; /* logits -> softcap * tanh(logits / softcap); 0 disables */
} kern_attn_params_t;

typedef struct kern_backend kern_backend_t;

/* 0 if the model is in the supported set (a KV dtype fp8 only under fp16 or bf16, its kv_scale
 * 0 or positive and finite), else -ENOTSUP. */
int kern_supported(const kern_model_t *m);
/* Bytes of one element of the dtype (0 for an unknown dtype). */
uint32_t kern_dtype_size(kern_dtype_t d);
/* Bytes one KV block occupies across all layers (in the KV dtype). */
uint64_t kern_block_bytes(const kern_model_t *m);
/* The layout of a pool of n_blocks blocks of model m (a supported one). */
kern_layout_t kern_layout(const kern_model_t *m, uint32_t n_blocks);

/* What a backend can serve on this host, asked before anything is allocated (kern_backend_probe).
 * The one place that decides whether a backend and its device are usable: the daemon picks
 * `backend = auto` from it at run time and sizes an automatic pool from its memory figures. */
typedef struct kern_probe {
    uint64_t mem_total; /* bytes: the device's memory (cuda), the host's MemTotal (cpu) */
    uint64_t mem_free;  /* bytes free now: cudaMemGetInfo (cuda), MemAvailable (cpu) */
    int driver_present; /* cuda: 1 when an NVIDIA driver answers (a GPU host, even where no
                           device is visible to this process); cpu: 0 */
    char device[96];    /* what serves, for people: "NVIDIA H100 80GB HBM3 (cuda:0, sm_90)" */
    uint8_t uuid[16];   /* cuda: the GPU's UUID; cpu: zeros */
    uint32_t driver;    /* cuda: the driver's CUDA version (cudaDriverGetVersion); cpu: 0 */
    char why[256];      /* when the probe fails: why, for people (names the cause and the fix) */
} kern_probe_t;

/* Asks the named backend whether it can serve `device` here (cuda: the driver, the device
 * ordinal, its compute capability; cpu: always). Fills *ret (always: why on failure). Returns 0,
 * -ENOENT (no backend of that name in this build: why says so), -ENODEV (no such device, or no
 * driver), -EPROTO (the driver is older than this build's CUDA runtime), -ENOTSUP (a device
 * below what the backend needs). Initialises the device's context on success (cuda). */
int kern_backend_probe(const char *name, int device, kern_probe_t *ret);
/* The names of the backends this build carries, space-separated ("cpu cuda"). */
const char *kern_backend_list(void);

/* The descriptor of the pool's memory (kern_config_t.pool_keep), the backend's own (dup it to
 * keep it past kern_backend_free); -1 when the pool is not such memory. */
int kern_pool_fd(const kern_backend_t *b);

/* Creates the named backend ("cpu" or "cuda") and allocates its pool and workspaces.
 * Returns 0, -EINVAL (bad config; pool_fd not a pool of this size), -ENOTSUP (model outside the
 * set, a backend this build does not have, pool_keep where the backend cannot), -ENOMEM (pool
 * memory). */
int kern_backend_create(const char *name, const kern_config_t *cfg, kern_backend_t **ret);
void kern_backend_free(kern_backend_t *b); /* accepts NULL */
const char *kern_backend_name(const kern_backend_t *b);

/* Writes n new tokens' K and V of one layer into their slots; a NaN or an infinity is stored as 0,
 * so no slot ever holds one (the cuda forward loads whole pages, the tails of partial blocks too,
 * and a masked score's zero weight times a NaN of V would still be NaN: one client's non-finite
 * values must not reach another's attention through a reused block). Returns 0, -EINVAL (layer
 * or a slot out of range). */
int kern_append_kv(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                   const uint32_t *slots, uint32_t n);

/* Copies whole blocks (every layer) src[i] -> dst[i], for copy-on-write. Returns 0 or -EINVAL. */
int kern_copy_blocks(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n);

/* Runs one layer of a plan: every CTA for every KV head, then the merge. Writes O rows of every
 * token the plan covers. cpu: done on return. cuda: enqueued on the backend's stream (one forward
 * launch for every tile shape, then the merge: kern_config_t.merge); kern_sync waits. The
 * plan may be freed or rebuilt on return (the backend keeps its own copy). Returns 0, -EINVAL
 * (layer, bad plan, page or row out of range, bad params), -E2BIG (plan rows/tokens beyond the
 * config), -ENOSPC (more partials than configured). */
int kern_attend(kern_backend_t *b, uint32_t layer, const sched_plan_hdr_t *plan, const void *q,
                void *o, const kern_attn_params_t *params);

/* Waits until everything the backend enqueued has finished (cuda: its streams; cpu: nothing to
 * wait for). Returns 0 or -EIO (a CUDA error, printed). */
int kern_sync(kern_backend_t *b);

/* The tile shapes this backend compiled for its device and the rule that picks n: what the
 * scheduler must plan with (sched_config_t.tiles). Returns 0. */
int kern_tiles(const kern_backend_t *b, sched_tiles_t *ret_tiles);

/* ------------------------------------------------------------------ GPU data path (cuda only)
 *
 * What patd needs to serve clients in other processes without a CPU round trip per layer
 * (each layer's hand-off is a GPU-side wait and write on the two processes' streams, so a
 * frontend's forward never waits on a CPU and can be captured in a CUDA graph; ipc/README.md
 * gives the words). The cpu backend has none of it: every call returns -ENOTSUP there.
 *
 * A lane is one in-flight step's private set of streams, events, plan and slot buffers and
 * partials: a step enqueued on one lane never queues behind a wait of another lane's client. The
 * handshake words are 64-bit words in host memory that the device and the CPU reach at one address
 * (a session's signal slice: kern_share_alloc with KERN_SHARE_HOST), so the CPU can always store to
 * them: a wait enqueued for a dead or stalled client is released from the CPU without going
 * through any stream. */
typedef struct kern_lane kern_lane_t;

/* One layer of a step on a lane, enqueued in this order on the lane's stream:
 *   wait until *wait_word >= wait_value (nothing is reset on the stream: the daemon resets the
 *   consumed words from its CPU once the step has finished, ipc_shm.h);
 *   if compute: append K/V of the step's tokens, attend (one launch);
 *   *post_word = post_value (after every write of the layer is visible);
 *   if report: the lane's progress counter = layers enqueued so far (kern_lane_progress).
 * Each of these is a write to host memory that costs the stream ~1-2 us, so the caller reports
 * progress only as often as it needs it (every few layers and a step's last).
 * Word pointers are addresses in a KERN_SHARE_HOST allocation; NULL skips that wait or post. */
typedef struct kern_lane_layer {
    uint32_t layer;
    int compute;           /* 0: the handshake only (a step that failed still pairs every wait) */
    int report;            /* 1: write the progress counter after this layer */
    const void *q, *k, *v; /* device: this step's rows (staging) */
    void *o;
    kern_attn_params_t params;
    uint64_t *wait_word;
    uint64_t wait_value;
    uint64_t *post_word;
    uint64_t post_value;
} kern_lane_layer_t;

/* Creates a lane (streams, events, double-buffered plan, slot buffer, partials of
 * cfg.max_partials). Returns 0, -ENOTSUP (backend without lanes, or a device without 64-bit
 * stream memory operations), -ENOMEM, -EIO. */
int kern_lane_create(kern_backend_t *b, kern_lane_t **ret);
/* Device memory one lane of a backend made with cfg takes when created (its first partials, merge
 * counters, plan and slot buffers; pinned host memory besides). A lane that runs a plan splitting
 * more tokens than its partials hold doubles them (up to cfg.max_partials) until its step ends
 * (kern_lane_trim), so lanes running large prefills at once hold more meanwhile. Any backend's
 * config; no device call. */
uint64_t kern_lane_bytes(const kern_config_t *cfg);
/* Gives back what the lane grew past its start (partials, union rows) once nothing of it is in
 * flight (its last step has finished): a lane that ran a large prefill does not keep its
 * partials for the decodes after it. The next plan that needs more grows them again. */
void kern_lane_trim(kern_lane_t *l);
/* Waits for the lane to drain (release its waits first) and frees it; NULL ok. */
void kern_lane_free(kern_lane_t *l);
/* Uploads a step's plan (when it changed) and its new tokens' pool slots, once for all layers.
 * Returns 0, -EINVAL/-E2BIG/-ENOSPC as kern_attend and kern_append_kv, -EIO. */
int kern_lane_begin(kern_lane_t *l, const sched_plan_hdr_t *plan, const uint32_t *slots,
                    uint32_t n);
/* Enqueues one layer (see kern_lane_layer_t) of the step last begun. Never blocks on the GPU.
 * Returns 0, -EINVAL (layer out of range), -EIO (a CUDA error: see kern_fatal). */
int kern_lane_layer(kern_lane_t *l, const kern_lane_layer_t *ly);
/* Layers the lane has finished since it was created, as of the last finished layer enqueued with
 * `report` (read from host memory the GPU writes; no CUDA call). The caller bounds its enqueue
 * depth with it. */
uint64_t kern_lane_progress(const kern_lane_t *l);
/* Layers enqueued since the lane was created. */
uint64_t kern_lane_enqueued(const kern_lane_t *l);

/* Cross-session packing: one lane runs a layer of several sessions' steps (its members) as one
 * forward over the union of their queries, so KV their sequences share is read once for all of
 * them. The union plan's rows are the members' rows one after another (member i's token t is
 * union row row_off + t). A packed layer, on the lane's stream:
 *   gate: waits until every member still in the pack has handed the layer over (its ready word
 *         >= its epoch), but once one has, at most window_us more: a member that has not by then
 *         leaves the pack for the rest of the step (kern_lane_pack_out tells the caller, who runs
 *         its remaining layers alone); no member ever waits on another beyond the window;
 *   the members served: their Q rows gathered into the lane's union rows and their new K/V
 *         written to their pool slots; one forward (and merge) over the union plan; their O
 *         rows scattered back; then each served member's done word = its epoch, after every O
 *         row is visible.
 * Rows of members not served this layer are computed from stale rows and dropped: the plan is
 * the step's, only the members change. */
#define KERN_PACK_MAX 16u
typedef struct kern_pack_member {
    const void *q, *k, *v; /* device: the member's staging rows ([token][head][head_dim]) */
    void *o;
    uint64_t *ready, *done;     /* its handshake words, [n_layers] each (KERN_SHARE_HOST) */
    uint64_t epoch;             /* the value that hands a layer over and that is posted */
    uint32_t row_off, n_tokens; /* its rows in the union plan */
} kern_pack_member_t;

/* Begins a packed step on a lane: the union plan and its rows' pool slots (union order), and the
 * members (1..KERN_PACK_MAX, rows contiguous and ascending). Returns 0, -EINVAL (bad members),
 * -E2BIG/-ENOSPC as kern_lane_begin, -ENOMEM (the union rows), -ENOTSUP (cpu), -EIO. */
int kern_lane_pack_begin(kern_lane_t *l, const sched_plan_hdr_t *plan, const uint32_t *slots,
                         uint32_t n, const kern_pack_member_t *m, uint32_t n_members,
                         uint32_t window_us);
/* Enqueues one packed layer of the step last begun with kern_lane_pack_begin (report: as
 * kern_lane_layer's). Returns 0, -EINVAL, -EIO. */
int kern_lane_pack_layer(kern_lane_t *l, uint32_t layer, const kern_attn_params_t *params,
                         int report);
/* Host memory the lane's stream writes: for each member of the packed step, 0 while it is in the
 * pack, else 1 + the layer at which it left (it did not hand that layer over within the window;
 * that layer and every later one are the caller's to run). */
const volatile uint32_t *kern_lane_pack_out(const kern_lane_t *l);
/* From the next gate on, the member is neither waited for nor served (its session is cut or
 * gone); a gate already passed may still serve it: the caller waits for the lane's progress to
 * cover every layer enqueued so far before its memory may go. */
void kern_lane_pack_exclude(kern_lane_t *l, uint32_t member);

/* Memory shared with one other process: an allocation of its own, mapped here at dev and exported
 * as a file descriptor that maps this allocation and nothing else (a CUDA virtual memory
 * allocation with a POSIX descriptor handle). The importer maps map_bytes. Device memory, or
 * (KERN_SHARE_HOST) pinned host memory that the device and this process's CPU both reach at dev
 * (the importer grants its CPU the same). */
typedef struct kern_share {
    void *dev;          /* mapped here (read-write for the device, and the CPU if host), map_bytes
                           long */
    uint64_t map_bytes; /* the bytes asked for, rounded up to the allocation granularity */
    int fd;             /* the export, the caller's to send and close (-1 once closed) */
    uint64_t handle;    /* the backend's */
} kern_share_t;
#define KERN_SHARE_HOST 1u /* kern_share_alloc: host memory (zeroed) instead of device memory */
/* Allocates and maps at least `bytes`, and exports it. Makes no stream call and waits for no
 * work on the device (tests/gpu/test_vmm_share.cu times it beside a running kernel). Returns 0,
 * -ENOMEM (no room), -ENOTSUP (no such memory: cpu, or a driver without it), -EIO, with nothing
 * left behind on error. flags: 0 or KERN_SHARE_HOST. */
int kern_share_alloc(kern_backend_t *b, uint64_t bytes, unsigned flags, kern_share_t *ret);
/* Unmaps and releases it here and closes fd if still open. The memory lives on while the
 * importer maps it (its own process's memory from then on). The device must have finished every
 * kernel that reads or writes it. */
void kern_share_free(kern_backend_t *b, kern_share_t *s);

/* What the device says about sharing: *ret_mps 1 when contexts on it are MPS clients, 0 when
 * processes are time-sliced; ret_uuid (16 bytes) names the GPU for clients that must open the
 * same one. Returns 0, -ENOTSUP (cpu), -EIO. */
int kern_device_info(kern_backend_t *b, int *ret_mps, uint8_t ret_uuid[16]);

/* 0 while the backend can go on; -EIO when its context holds a sticky error (every later call
 * would fail: the process must exit and be restarted). The text names the error. */
int kern_fatal(kern_backend_t *b, char *why, uint32_t why_len);

#ifdef __cplusplus
}
#endif

#endif
