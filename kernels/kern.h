/*
 * kern.h — patd's execution backends behind one plain-C interface: `cpu` (host threads; the
 * reference semantics, CI and the no-GPU default) and `cuda` (kernels/cuda). A backend owns the
 * KV pool memory and the partials workspace; it executes the scheduler's plan
 * (scheduler/sched_plan_fmt.h) one layer at a time and knows nothing of the forest or sockets.
 *
 * Memory layout (DESIGN.md §3): per layer and block, K then V, each [kv_heads][block_size]
 * [head_dim] of the model dtype: [layer][block][K|V][kv_head][block_size][head_dim]. A slot is
 * block * block_size + offset. Q and O of a step are [token][q_head][head_dim]; new K and V are
 * [token][kv_head][head_dim]. Pointers are in the backend's address space (host for cpu,
 * device for cuda).
 *
 * Supported set (closed, checked by kern_supported before anything runs, -ENOTSUP otherwise):
 * head_dim 64, 128, 256; q_heads / kv_heads (the GQA group) 1..16; block_size 16; dtype fp16,
 * bf16 or fp32. Every call returns 0 or a negative errno; nothing aborts, nothing allocates after
 * create.
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
} kern_dtype_t;

#define KERN_MAX_GROUP            16u
#define KERN_BLOCK_SIZE           16u
#define KERN_DEFAULT_MAX_CTA_ROWS 128u
#define KERN_MAX_CTA_ROWS         1024u /* bounds per-thread scratch: rows x head_dim floats */
#define KERN_MAX_THREADS          1024u
#define KERN_MAX_STREAMS          8u
#define KERN_DEFAULT_STREAMS      4u
#define KERN_DEFAULT_PLAN_BYTES   (8u << 20)

typedef struct kern_model {
    uint32_t n_layers;
    uint32_t q_heads, kv_heads, head_dim;
    uint32_t block_size; /* tokens per KV block */
    kern_dtype_t dtype;  /* of Q, K, V and O */
} kern_model_t;

typedef struct kern_config {
    kern_model_t model;
    uint32_t n_blocks;       /* KV pool capacity in blocks */
    uint32_t max_tokens;     /* query tokens per step */
    uint32_t max_partials;   /* partial slots a plan may use (the scheduler's bound) */
    uint32_t max_cta_rows;   /* largest tile m the plans use, <= KERN_MAX_CTA_ROWS;
                                0 = KERN_DEFAULT_MAX_CTA_ROWS */
    uint32_t n_threads;      /* cpu: worker threads <= KERN_MAX_THREADS, 0 = one per online CPU */
    int device;              /* cuda: device ordinal */
    uint32_t streams;        /* cuda: concurrent streams for a plan's tile-shape groups, <= 8;
                                0 = KERN_DEFAULT_STREAMS, 1 = serial (one stream) */
    uint32_t max_plan_bytes; /* cuda: largest plan accepted (pinned staging, device copy);
                                0 = KERN_DEFAULT_PLAN_BYTES */
} kern_config_t;

typedef struct kern_attn_params {
    float scale;   /* softmax scale applied to q . k, > 0 (typically 1/sqrt(head_dim)) */
    float softcap; /* logits -> softcap * tanh(logits / softcap); 0 disables */
} kern_attn_params_t;

typedef struct kern_backend kern_backend_t;

/* 0 if the model is in the supported set, else -ENOTSUP. */
int kern_supported(const kern_model_t *m);
/* Bytes of one element of the dtype (0 for an unknown dtype). */
uint32_t kern_dtype_size(kern_dtype_t d);
/* Bytes one KV block occupies across all layers. */
uint64_t kern_block_bytes(const kern_model_t *m);

/* Creates the named backend ("cpu" or "cuda") and allocates its pool and workspaces.
 * Returns 0, -EINVAL (bad config), -ENOTSUP (model outside the set, or a backend this build does
 * not have), -ENOMEM (pool memory). */
int kern_backend_create(const char *name, const kern_config_t *cfg, kern_backend_t **ret);
void kern_backend_free(kern_backend_t *b); /* accepts NULL */
const char *kern_backend_name(const kern_backend_t *b);

/* Writes n new tokens' K and V of one layer into their slots. Returns 0, -EINVAL (layer or a slot
 * out of range). */
int kern_append_kv(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                   const uint32_t *slots, uint32_t n);

/* Copies whole blocks (every layer) src[i] -> dst[i], for copy-on-write. Returns 0 or -EINVAL. */
int kern_copy_blocks(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n);

/* Runs one layer of a plan: every CTA for every KV head, then the merge. Writes O rows of every
 * token the plan covers. cpu: done on return. cuda: enqueued on the backend's stream (tile-shape
 * groups fanned out over its side streams and joined before the merge); kern_sync waits. The
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

#ifdef __cplusplus
}
#endif

#endif
