/*
 * kern_int.h — what a backend implements (one ops table each) and the checks they share.
 */
#ifndef KERN_INT_H
#define KERN_INT_H

#include "kern.h"

typedef struct kern_ops {
    const char *name;
    int (*probe)(int device, kern_probe_t *ret); /* kern_backend_probe; ret zeroed */
    int (*create)(const kern_config_t *cfg, kern_backend_t **ret);
    void (*destroy)(kern_backend_t *b);
    int (*append_kv)(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                     const uint32_t *slots, uint32_t n);
    int (*copy_blocks)(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n);
    int (*attend)(kern_backend_t *b, uint32_t layer, const sched_plan_hdr_t *plan, const void *q,
                  void *o, const kern_attn_params_t *params);
    int (*sync)(kern_backend_t *b);                             /* NULL: nothing asynchronous */
    void (*tiles)(const kern_backend_t *b, sched_tiles_t *ret); /* NULL: the scheduler default */
    /* the GPU data path (kern.h); NULL in a backend without it */
    int (*lane_create)(kern_backend_t *b, kern_lane_t **ret);
    void (*lane_free)(kern_lane_t *l);
    int (*lane_begin)(kern_lane_t *l, const sched_plan_hdr_t *plan, const uint32_t *slots,
                      uint32_t n);
    int (*lane_layer)(kern_lane_t *l, const kern_lane_layer_t *ly);
    int (*share_alloc)(kern_backend_t *b, uint64_t bytes, unsigned flags, kern_share_t *ret);
    void (*share_free)(kern_backend_t *b, kern_share_t *s); /* device side; the fd is closed */
    int (*device_info)(kern_backend_t *b, int *ret_mps, uint8_t ret_uuid[16]);
    int (*fatal)(kern_backend_t *b, char *why, uint32_t why_len);
    /* cross-session packing (kern.h); NULL in a backend without it */
    int (*pack_begin)(kern_lane_t *l, const sched_plan_hdr_t *plan, const uint32_t *slots,
                      uint32_t n, const kern_pack_member_t *m, uint32_t n_members,
                      uint32_t window_us);
    int (*pack_layer)(kern_lane_t *l, uint32_t layer, const kern_attn_params_t *params, int report);
    void (*lane_trim)(kern_lane_t *l);       /* NULL: nothing grows */
    int (*pool_fd)(const kern_backend_t *b); /* NULL: kern_config_t.pool_keep is refused */
} kern_ops_t;

/* Every lane starts with this header: the progress counters are read without a CUDA call. */
struct kern_lane {
    kern_backend_t *b;
    volatile uint64_t *progress; /* host-mapped; the lane's stream adds 1 per layer */
    uint64_t enqueued;
    /* cross-session packing (kern_lane_pack_*): host-mapped, KERN_PACK_MAX words each; NULL until
     * the lane's first packed step */
    volatile uint32_t *pack_out;  /* the stream writes: 1 + the layer a member left at */
    volatile uint32_t *pack_excl; /* the CPU writes: 1 = excluded */
    uint32_t pack_members;        /* members of the packed step last begun */
};

/* Every backend's handle starts with this header. */
struct kern_backend {
    const kern_ops_t *ops;
    kern_config_t cfg;
    kern_layout_t layout; /* kern_layout(cfg.model, cfg.n_blocks), set by the backend's create */
};

extern const kern_ops_t kern__cpu_ops;
#ifdef PATD_HAVE_CUDA_BACKEND
extern const kern_ops_t kern__cuda_ops;
#endif

/* Host-side plan validation shared by the backends: header, counts against the config, every
 * row's token and every page id in range, groups and CTAs consistent, every merge named by
 * exactly its part_count rows. scratch: kern__plan_scratch_bytes(cfg) bytes the backend
 * allocated at create (checks never allocate). 0 or a negative errno. */
uint64_t kern__plan_scratch_bytes(const kern_config_t *cfg);
int kern__plan_check(const kern_config_t *cfg, const sched_plan_hdr_t *plan, uint8_t *scratch);

#endif
