/*
 * kern_cuda_kv.cu — KV memory of the cuda backend: the append of a step's new K and V into their
 * pool slots (one kernel per layer, 16-byte copies, NaN and infinity stored as 0; into an fp8
 * pool each element as its value / kv_scale in fp8, kern_cuda_fp8.cuh) and the copy-on-write
 * block copies. The slot list of a step is checked against the pool and uploaded
 * once per step (slots_upload), then every layer's append reads it.
 */
#include "kern_cuda_fp8.cuh"
#include "kern_cuda_int.h"
#include "kern_cuda_ptx.cuh"

#include <errno.h>
#include <string.h>

#include <type_traits>

namespace kcuda
{

/* Item e of an append (8 elements of one token's K and V for one head): the pool's element
 * offsets of its K and V (the layer's), and its first element in the clients' K and V */
template <int D> struct AppendItem {
    uint64_t dk, dv, src;
    __device__ __forceinline__ AppendItem(uint64_t e, const uint32_t *slots, uint32_t kv_heads,
                                          const kern_layout_t &lo)
    {
        constexpr uint32_t CPR = D / 8;
        const uint32_t ch = e % CPR, h = (e / CPR) % kv_heads, i = e / ((uint64_t)CPR * kv_heads);
        const uint32_t slot = slots[i], blk = slot / KERN_BLOCK_SIZE, off = slot % KERN_BLOCK_SIZE;
        dk = kern_layout_at(&lo, 0, blk, 0, h, off) + ch * 8;
        dv = kern_layout_at(&lo, 0, blk, 1, h, off) + ch * 8;
        src = ((uint64_t)i * kv_heads + h) * D + ch * 8;
    }
};

template <typename T, int D>
__global__ void append_kernel(const T *__restrict__ k, const T *__restrict__ v,
                              const uint32_t *__restrict__ slots, uint32_t n, T *__restrict__ kv,
                              uint32_t kv_heads, kern_layout_t lo)
{
    constexpr uint32_t CPR = D / 8;
    dep_launch_dependents(); /* the layer's forward may place its blocks now */
    const uint64_t total = (uint64_t)n * kv_heads * CPR;
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < total;
         e += (uint64_t)gridDim.x * blockDim.x) {
        const AppendItem<D> x(e, slots, kv_heads, lo);
        constexpr uint32_t E = std::is_same<T, __half>::value ? 0x7c00u : 0x7f80u;
        *reinterpret_cast<uint4 *>(kv + x.dk) =
            finite8<E>(*reinterpret_cast<const uint4 *>(k + x.src));
        *reinterpret_cast<uint4 *>(kv + x.dv) =
            finite8<E>(*reinterpret_cast<const uint4 *>(v + x.src));
    }
}

/* The same into an fp8 pool (KV: its format): eight elements of T in, eight bytes out, each
 * value / ks (IEEE division, as the cpu backend's) rounded to nearest even and saturated; NaN and
 * infinity stored as 0. */
template <typename T, int D, int KV>
__global__ void
append8_kernel(const T *__restrict__ k, const T *__restrict__ v, const uint32_t *__restrict__ slots,
               uint32_t n, uint8_t *__restrict__ kv, uint32_t kv_heads, kern_layout_t lo, float ks)
{
    constexpr uint32_t CPR = D / 8;
    dep_launch_dependents();
    const uint64_t total = (uint64_t)n * kv_heads * CPR;
    auto enc = [ks](uint4 x) {
        const T *e = reinterpret_cast<const T *>(&x);
        uint32_t w[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float f[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float x = (float)e[4 * i + j];
                f[j] = isfinite(x) ? __fdiv_rn(x, ks) : 0.0f;
            }
            w[i] = (uint32_t)fp8x2_from<KV>(f[0], f[1]) | (uint32_t)fp8x2_from<KV>(f[2], f[3])
                                                              << 16;
        }
        return make_uint2(w[0], w[1]);
    };
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < total;
         e += (uint64_t)gridDim.x * blockDim.x) {
        const AppendItem<D> x(e, slots, kv_heads, lo);
        *reinterpret_cast<uint2 *>(kv + x.dk) = enc(*reinterpret_cast<const uint4 *>(k + x.src));
        *reinterpret_cast<uint2 *>(kv + x.dv) = enc(*reinterpret_cast<const uint4 *>(v + x.src));
    }
}

template <typename T, int D>
int append_launch(Cuda *c, cudaStream_t st, const uint32_t *slot_dev, uint32_t layer, const void *k,
                  const void *v, uint32_t n)
{
    const kern_model_t &m = c->base.cfg.model;
    const kern_layout_t &lo = c->base.layout;
    const uint64_t total = (uint64_t)n * m.kv_heads * (D / 8);
    const uint32_t threads = 256;
    const uint64_t want = (total + threads - 1) / threads;
    const uint32_t blocks = (uint32_t)(want < 4096 ? want : 4096);
    const T *kt = static_cast<const T *>(k), *vt = static_cast<const T *>(v);
    uint8_t *kv8 =
        static_cast<uint8_t *>(c->pool) + kern_layout_at(&lo, layer, 0, 0, 0, 0) * lo.elt;
    if (c->kv8 == KERN_FP8_E4M3)
        append8_kernel<T, D, KERN_FP8_E4M3><<<blocks, threads, 0, st>>>(
            kt, vt, slot_dev, n, kv8, m.kv_heads, lo, kern_kv_scale(&m));
    else if (c->kv8 == KERN_FP8_E5M2)
        append8_kernel<T, D, KERN_FP8_E5M2><<<blocks, threads, 0, st>>>(
            kt, vt, slot_dev, n, kv8, m.kv_heads, lo, kern_kv_scale(&m));
    else
        append_kernel<T, D><<<blocks, threads, 0, st>>>(kt, vt, slot_dev, n,
                                                        reinterpret_cast<T *>(kv8), m.kv_heads, lo);
    KC_TRY(cudaGetLastError(), "append launch");
    return 0;
}

/* One dispatch point over the closed set: dtype {fp16, bf16} x KERN_HEAD_DIMS. */
template <typename T>
int append_dim(Cuda *c, cudaStream_t st, const uint32_t *slot_dev, uint32_t layer, const void *k,
               const void *v, uint32_t n)
{
    switch (c->base.cfg.model.head_dim) { /* the closed set, KERN_HEAD_DIMS */
#define KCUDA_APPEND_CASE(d)                                                                       \
    case d:                                                                                        \
        return append_launch<T, d>(c, st, slot_dev, layer, k, v, n);
        KERN_HEAD_DIMS(KCUDA_APPEND_CASE)
#undef KCUDA_APPEND_CASE
    }
    return -ENOTSUP;
}

int append_on(Lane *L, uint32_t layer, const void *k, const void *v, uint32_t n)
{
    if (n == 0)
        return 0;
    return L->c->dt == 0 ? append_dim<__half>(L->c, L->main, L->slot_dev, layer, k, v, n)
                         : append_dim<__nv_bfloat16>(L->c, L->main, L->slot_dev, layer, k, v, n);
}

/* Checks the slots against the pool and copies them to the lane's device buffer (on its
 * stream). */
int slots_upload(Lane *L, const uint32_t *slots, uint32_t n)
{
    const kern_config_t &cfg = L->c->base.cfg;
    const uint64_t limit = (uint64_t)cfg.n_blocks * cfg.model.block_size;
    if (n > cfg.max_tokens)
        return -E2BIG;
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] >= limit)
            return -EINVAL; /* checked before anything is enqueued: nothing changes */
    L->n_slots = n;
    if (n == 0)
        return 0;
    if (L->slot_used)
        KC_TRY(cudaEventSynchronize(L->slot_copied), "append: slot buffer");
    memcpy(L->slot_host, slots, n * sizeof(uint32_t));
    KC_TRY(cudaMemcpyAsync(L->slot_dev, L->slot_host, n * sizeof(uint32_t), cudaMemcpyHostToDevice,
                           L->main),
           "append: slot upload");
    KC_TRY(cudaEventRecord(L->slot_copied, L->main), "append: event");
    L->slot_used = true;
    return 0;
}

int cuda_append_kv(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                   const uint32_t *slots, uint32_t n)
{
    Cuda *c = as_cuda(b);
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    int r = slots_upload(&c->lane0, slots, n);
    return r < 0 ? r : append_on(&c->lane0, layer, k, v, n);
}

int cuda_copy_blocks(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n)
{
    Cuda *c = as_cuda(b);
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    const kern_layout_t &lo = c->base.layout;
    uint8_t *pool = static_cast<uint8_t *>(c->pool);
    cudaError_t ce = cudaSuccess;
    for (uint32_t i = 0; i < n && ce == cudaSuccess; i++)
        for (uint32_t l = 0; l < lo.n_layers && ce == cudaSuccess; l++)
            ce = cudaMemcpyAsync(pool + kern_layout_at(&lo, l, dst[i], 0, 0, 0) * lo.elt,
                                 pool + kern_layout_at(&lo, l, src[i], 0, 0, 0) * lo.elt,
                                 lo.block * lo.elt, cudaMemcpyDeviceToDevice, c->lane0.main);
    /* steps begun on other lanes from now on start after these copies (also after a failed one:
     * those queued before it) */
    pthread_mutex_lock(&c->cow_mu);
    cudaError_t e = cudaEventRecord(c->cow_done, c->lane0.main);
    c->cow_gen += e == cudaSuccess;
    pthread_mutex_unlock(&c->cow_mu);
    KC_TRY(ce, "copy_blocks");
    KC_TRY(e, "copy_blocks event");
    return 0;
}

} // namespace kcuda
