/*
 * kern_cuda_int.h — what the translation units of the cuda backend share: the forward kernel's
 * POD argument block and its compiled variants, the backend and lane structures, and the one
 * family of error helpers (KC_TRY for runtime calls, KC_TRY_CU for driver calls: both print
 * "<3>kern_cuda: what: error" and return -EIO). CUDA C++ only; nothing here crosses into C.
 *
 * Files: kern_cuda.cu (backend life, device queries, IPC and host mapping), kern_cuda_attn.cu
 * (plan upload, the per-layer launch), kern_cuda_lane.cu (lanes and their stream handshakes),
 * kern_cuda_kv.cu (KV append and copy-on-write), kern_cuda_fwd*.cu (the forward kernel).
 * kern_cuda_tools.cu holds what only the tools link (bandwidth probe, variant report).
 */
#ifndef KERN_CUDA_INT_H
#define KERN_CUDA_INT_H

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdint.h>

#include "kern_cuda.h"
#include "kern_cuda_shapes.h"

extern "C" {
#include "kern_int.h"
}
#include "kern_cuda_pack.h"

namespace kcuda
{

/* fwd_pair's KV tiles (kern_cuda_pack.h) */
using WsTile = kcuda_tile_t;
constexpr uint32_t WS_NO_BLOCK = KCUDA_NO_BLOCK;
constexpr uint32_t WS_TILES_START = 4096; /* a lane's tile buffers at first (256 KiB each) */
constexpr uint32_t WS_RETIRED_MAX = 32;   /* doublings of a lane's tile buffers */
/* a lane's partials at first (kern_lane_bytes counts these): decode plans split few tokens; a
 * prefill that splits more grows them (partials_reserve) up to cfg.max_partials */
constexpr uint32_t LANE_PARTIALS_START = 256;
static_assert(KCUDA_TILE_N == 4 * KERN_BLOCK_SIZE, "a tile is four pages");
static_assert(KCUDA_MAX_M < 256, "a CTA's rows fit a chunk's 8-bit row range");

/* Arguments of one forward launch: every CTA of a plan for every KV head, one layer. */
struct FwdArgs {
    /* fwd_pair's KV loads (tma != 0): the whole pool as a 5-d tensor [layer x block][K|V][kv
     * head][token of the block][D], boxes of 64 x 16 elements in the 128-byte swizzle (one page
     * of one head, 64 columns); a kernel parameter (__grid_constant__), so first and aligned */
    CUtensorMap kv_map;
    uint32_t tma;            /* 1: fwd_pair loads KV pages with kv_map (where aligned) */
    uint32_t tma_block0;     /* kv_map's block coordinate of this layer's block 0 */
    const kcuda_cta_t *ctas; /* the device plan (kcuda_pack_prepare); the other arrays as the
                                plan has them */
    const sched_plan_seg_t *segs;
    const sched_plan_row_t *rows;
    const uint32_t *pages;
    const sched_plan_merge_t *merges;
    const WsTile *tiles;   /* fwd_pair: the tiles of the device copy's CTAs (kcuda_pack_fill) */
    const void *q;         /* [token][q_head][D] */
    void *o;               /* [token][q_head][D] */
    const void *kv;        /* this layer's first block */
    uint64_t block_stride; /* elements from one block to the next (K and V, every head) */
    uint64_t head_stride;  /* elements from one KV head to the next: block_size * D */
    uint64_t v_offset;     /* elements from K to V of a block: kv_heads * head_stride */
    float *part_o;         /* [slot][D] fp32 */
    float *part_lse;       /* [slot] */
    uint32_t *arrivals;    /* [merge][kv_head]: parts written so far; 0 between launches */
    uint32_t *work;        /* fwd_pair: [0] items taken, [1] blocks done; 0 between launches */
    uint32_t n_ctas;
    uint32_t n_big; /* the device plan's CTAs of more than KCUDA_SMALL_M rows, first in ctas */
    uint32_t q_heads, kv_heads, group;
    float scale;   /* the model's softmax scale, times kv_scale where the pool is fp8 */
    float v_scale; /* what O is multiplied by: kv_scale where the pool is fp8, else 1 */
    float softcap;
    uint32_t merge_inside; /* 1: the last CTA of a split token merges (KERN_MERGE_INSIDE) */
    uint32_t invariant;    /* 1: a batch-invariant plan (SCHED_PLAN_INVARIANT): fwd_layer runs
                              every CTA on its one 64-row, several-segment kernel */
};

/* fwd_pair's work items, numbered without gaps (ws_ref): one per KV head of each of the first
 * n_big CTAs (more than KCUDA_SMALL_M rows), then one per pair of KV heads of each other CTA */
__host__ __device__ __forceinline__ uint32_t ws_small_items(const FwdArgs &a) /* per CTA */
{
    return (a.kv_heads + 1) / 2;
}
__host__ __device__ __forceinline__ uint32_t ws_items(const FwdArgs &a)
{
    return a.n_big * a.kv_heads + (a.n_ctas - a.n_big) * ws_small_items(a);
}

/* The forward of one (dtype, head_dim): one kernel for every tile shape. */
struct FwdVariant {
    const void *fn;       /* __global__ void (*)(FwdArgs): fwd_layer, mma.sync */
    const void *wg_fn;    /* fwd_layer with wgmma where it wins (KERN_FWD_AUTO) */
    const void *merge_fn; /* merge_layer, for KERN_MERGE_LAUNCH */
    int smem;             /* dynamic shared memory: the largest shape's */
    const void *pair_fn;  /* fwd_pair (CTAs up to KCUDA_BIG_M rows); NULL where not sm_90a */
    int pair_smem;
    /* over an fp8 pool, [0] e4m3 and [1] e5m2 (the same shared memory as their 16-bit twins):
     * fwd_layer with wgmma where it wins (wg_fn's twin; NULL where the code that runs is below
     * sm_89, which has no fp8 conversions) and fwd_pair (NULL where pair_fn is) */
    const void *wg8_fn[2];
    const void *pair8_fn[2];
    bool dep; /* the kernels run sm_90 code: each waits for the kernel before it (griddepcontrol)
                 before its first global access, so it may be launched as its dependent */
};

/* registered per head_dim translation unit (generated by the Makefile, one per KERN_HEAD_DIMS
 * entry): v[0] fp16, v[1] bf16; 0 or a negative errno */
#define KCUDA_FWD_REGISTER_DECL(d) int fwd_register_d##d(FwdVariant(&v)[2]);
KERN_HEAD_DIMS(KCUDA_FWD_REGISTER_DECL)
#undef KCUDA_FWD_REGISTER_DECL
int fwd_register(uint32_t head_dim, FwdVariant (&v)[2]);

/* Prints "<3>kern_cuda: what: error" to stderr and returns -EIO. */
int kern_cuda_fail(const char *what, cudaError_t e);
int kern_cuda_fail_cu(const char *what, CUresult e);
/* *fn = the driver's entry point `name` (CUDA 12 ABI), or false (the error cleared): the backend
 * reaches the driver API this way instead of linking libcuda */
bool driver_entry(const char *name, void **fn);

#define KC_TRY(call, what)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return ::kcuda::kern_cuda_fail(what, e_);                                              \
    } while (0)

#define KC_TRY_CU(call, what)                                                                      \
    do {                                                                                           \
        CUresult e_ = (call);                                                                      \
        if (e_ != CUDA_SUCCESS)                                                                    \
            return ::kcuda::kern_cuda_fail_cu(what, e_);                                           \
    } while (0)

struct PlanBuf {
    uint8_t *host; /* pinned */
    uint8_t *dev;
    cudaEvent_t copied; /* the H2D copy from host has completed */
    uint32_t n_big;  /* CTAs of more than KCUDA_SMALL_M rows, first in dev (kcuda_pack_prepare) */
    WsTile *tl_host; /* pinned: fwd_pair's tiles of the plan in dev */
    WsTile *tl_dev;
    uint32_t tl_cap; /* tiles both hold (grown by plan_upload) */
    bool used;
};

/* the driver's virtual memory management (kern_share_alloc), by entry point: the backend does
 * not link libcuda */
struct VmmApi {
    CUresult (*gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*exp)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                    unsigned long long);
    CUresult (*imp)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    size_t granularity;      /* 0: no virtual memory management (kern_share_alloc: -ENOTSUP) */
    size_t host_granularity; /* the same for host memory (KERN_SHARE_HOST) */
    int numa;                /* the host NUMA node nearest the device (0: no NUMA) */
};

typedef CUresult (*WaitValue64Fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*WriteValue64Fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

struct Cuda;
struct PackState;

/* One step's private execution context (kern.h): a stream, the plan and slot buffers, the
 * partials and arrival counters, and a host-mapped progress word. */
struct Lane {
    kern_lane_t base; /* progress -> progress_host */
    Cuda *c;
    uint64_t *progress_host; /* pinned, mapped; written by the stream */
    uint64_t *progress_dev;
    float *part_o, *part_lse; /* stream-ordered allocations of part_cap partials (x q_heads) */
    uint32_t part_cap;        /* grows (doubling) to the largest plan's n_partials */
    uint32_t *arrivals;       /* max_tokens x kv_heads, zeroed once; kernels leave them 0 */
    uint32_t *work;           /* 2 words after the arrivals, likewise (FwdArgs.work) */
    uint8_t *check;           /* kern__plan_check's scratch */
    PlanBuf plan[2];
    int cur;                         /* plan[cur] holds the last uploaded plan */
    WsTile *retired[WS_RETIRED_MAX]; /* pinned tile buffers outgrown, freed with the lane */
    uint32_t n_retired;
    uint8_t *last;     /* host copy of it, for the unchanged test */
    uint32_t last_len; /* 0: none */
    uint32_t *slot_host, *slot_dev;
    uint32_t n_slots;  /* slots of the step last begun */
    uint64_t cow_seen; /* the Cuda's cow_gen this lane's stream last waited for (cow_mu) */
    cudaEvent_t slot_copied;
    bool slot_used;
    cudaStream_t main;
    PackState *pack; /* cross-session packing (kern_cuda_xpack.cu); NULL until first used */
};

struct Cuda {
    kern_backend_t base;
    int device;
    void *pool;
    /* kern_config_t.pool_keep: the pool is one allocation of the driver's virtual memory
     * management, named by a POSIX descriptor (pool_fd, the backend's own), mapped pool_map
     * bytes at pool; else pool_fd is -1 and the pool is cudaMalloc's */
    int pool_fd;
    CUmemGenericAllocationHandle pool_h;
    size_t pool_map;
    FwdVariant fwd;       /* the model's dtype and head_dim */
    uint64_t kv_map[16];  /* FwdArgs.kv_map's bytes (valid where tma; calloc: 16-byte aligned) */
    bool tma;             /* fwd_pair loads KV by TMA (KERN_FWD_AUTO, the map encoded) */
    uint32_t max_m;       /* rows a plan's CTA may have: KCUDA_BIG_M with fwd.pair_fn, else 64 */
    int dt;               /* 0 fp16, 1 bf16 */
    int kv8;              /* the pool's fp8 format (KERN_FP8_E4M3 or _E5M2), 0: the dtype's */
    uint32_t n_sms;       /* fwd_pair's blocks at most: one per SM (or kern_config_t's cap) */
    bool pdl;             /* forwards launched as programmatic dependents (fwd.dep, not
                             kern_config_t.serial_launch) */
    Lane lane0;           /* kern_append_kv, kern_attend, kern_copy_blocks */
    WaitValue64Fn wait64; /* NULL: the device has no 64-bit stream memory operations */
    WriteValue64Fn write64;
    VmmApi vmm;
    pthread_mutex_t cow_mu; /* orders cow_done's record (lane 0) and the lanes' waits on it */
    cudaEvent_t cow_done;   /* recorded after each copy-on-write batch */
    uint64_t cow_gen;       /* cow_done's records so far (cow_mu) */
};

inline Cuda *as_cuda(kern_backend_t *b)
{
    return reinterpret_cast<Cuda *>(b);
}

/* kern_cuda_kv.cu */
int slots_upload(Lane *L, const uint32_t *slots, uint32_t n);
int append_on(Lane *L, uint32_t layer, const void *k, const void *v, uint32_t n);
int cuda_append_kv(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                   const uint32_t *slots, uint32_t n);
int cuda_copy_blocks(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n);

/* kern_cuda_attn.cu */
int plan_upload(Lane *L, const sched_plan_hdr_t *h);
int attend_on(Lane *L, uint32_t layer, const sched_plan_hdr_t *h, const void *q, void *o,
              const kern_attn_params_t *p);
int cuda_attend(kern_backend_t *b, uint32_t layer, const sched_plan_hdr_t *h, const void *q,
                void *o, const kern_attn_params_t *p);
int cuda_sync(kern_backend_t *b);

/* kern_cuda_lane.cu */
int lane_init(Cuda *c, Lane *L);
void lane_done(Lane *L);
/* The lane's stream waits for the last copy-on-write batch (cow_done), unless it already waited
 * for that one: a step begun after a copy reads the copied blocks. 0 or -EIO. */
int cow_wait(Lane *L);
int load_memops(Cuda *c);
int cuda_lane_create(kern_backend_t *b, kern_lane_t **ret);
void cuda_lane_free(kern_lane_t *l);
int cuda_lane_begin(kern_lane_t *l, const sched_plan_hdr_t *h, const uint32_t *slots, uint32_t n);
int cuda_lane_layer(kern_lane_t *l, const kern_lane_layer_t *ly);

void cuda_lane_trim(kern_lane_t *l);

/* kern_cuda_xpack.cu */
void pack_done(Lane *L);
void pack_trim(Lane *L);
int cuda_pack_begin(kern_lane_t *l, const sched_plan_hdr_t *h, const uint32_t *slots, uint32_t n,
                    const kern_pack_member_t *m, uint32_t n_members, uint32_t window_us);
int cuda_pack_layer(kern_lane_t *l, uint32_t layer, const kern_attn_params_t *p, int report);

/* Eight 16-bit elements with every NaN and infinity (exponent all ones: E) set to 0 (kern.h:
 * no pool slot holds one). */
template <uint32_t E> __device__ __forceinline__ uint4 finite8(uint4 x)
{
    uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = (w[i] & E) == E ? 0u : 0xffffu;
        const uint32_t hi = ((w[i] >> 16) & E) == E ? 0u : 0xffff0000u;
        w[i] &= lo | hi;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
constexpr uint32_t F16_EXP = 0x7c00u, BF16_EXP = 0x7f80u; /* finite8's E per dtype */

template <typename T> __device__ inline void store4(T *dst, float4 v);
template <> __device__ inline void store4<float>(float *dst, float4 v)
{
    *reinterpret_cast<float4 *>(dst) = v;
}
template <> __device__ inline void store4<__half>(__half *dst, float4 v)
{
    __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&a);
    u.y = *reinterpret_cast<uint32_t *>(&b);
    *reinterpret_cast<uint2 *>(dst) = u;
}
template <> __device__ inline void store4<__nv_bfloat16>(__nv_bfloat16 *dst, float4 v)
{
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&a);
    u.y = *reinterpret_cast<uint32_t *>(&b);
    *reinterpret_cast<uint2 *>(dst) = u;
}

} // namespace kcuda

#endif
