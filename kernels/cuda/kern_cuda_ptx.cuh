/*
 * kern_cuda_ptx.cuh — the inline-PTX wrappers of the cuda backend's kernels and of the benchmarks
 * that mirror them, each defined once: shared-memory addresses, the dependent-launch wait,
 * cp.async, mbarriers, the tensor memory accelerator, ldmatrix and mma.sync, named barriers,
 * register reallocation, the wgmma fences, the global timer and the thread-block cluster pieces
 * bench_mcast uses. The wgmma instructions themselves and their descriptors are in
 * kern_cuda_wgmma.cuh.
 *
 * Every wrapper is __forceinline__ and emits exactly the instruction it names: callers rely on
 * `asm volatile` keeping issue order and on the "memory" clobbers ordering shared-memory accesses
 * around the barriers. Wrappers of instructions a target lacks are declared only where it has
 * them (KCUDA_WGMMA, KCUDA_SM90), so a use elsewhere fails to compile instead of to assemble.
 */
#ifndef KERN_CUDA_PTX_CUH
#define KERN_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

/* KCUDA_WGMMA: this compilation pass targets sm_90a (wgmma, setmaxnreg, the TMA and mbarrier
 * forms the pair kernel uses); 0 in the host pass and for every other target. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KCUDA_WGMMA 1
#else
#define KCUDA_WGMMA 0
#endif

/* KCUDA_SM90: the host pass or an sm_90 device pass (clusters, mapa, 2-d TMA: bench_mcast) */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define KCUDA_SM90 1
#else
#define KCUDA_SM90 0
#endif

namespace kcuda
{

/* ---------------------------------------------------------------- addresses, dependent launch */

/* the shared-state-space address of a generic pointer into shared memory */
__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* Waits (sm_90) until the grid this one was launched as a programmatic dependent of has
 * completed and its stores are visible; returns at once for a launch that is not one. The
 * forwards and the merge call it before their first global access (FwdVariant.dep).
 * KCUDA_NO_DEP_WAIT leaves it out: a wrong build that test_cuda_attn's dependent-launch test must
 * catch. */
__device__ __forceinline__ void dep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(KCUDA_NO_DEP_WAIT)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Lets (sm_90) the grid launched as this one's programmatic dependent start its blocks now; they
 * wait for this grid's completion and stores (dep_wait) before their first global access. The
 * KV append calls it first thing, so the layer's forward is placed while the append runs;
 * fwd_pair's producer calls it when no item is left, so the merge is placed as its blocks leave,
 * and fwd_layer at its start. */
__device__ __forceinline__ void dep_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* ---------------------------------------------------------------- cp.async */

/* 16-byte async copy; src_bytes 0 zero-fills the destination without reading src. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, uint32_t src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ---------------------------------------------------------------- mbarrier */

/* Shared-memory barriers (mbarrier, sm_80+): init with an expected arrival count; arrive_cp
 * arrives once this thread's cp.async copies issued so far have landed (without adding to the
 * expected count); wait spins until the phase of the given parity has completed. */
__device__ __forceinline__ void mb_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_arrive_cp(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint32_t bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}
__device__ __forceinline__ void mb_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nW:\n"
                 "mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n"
                 "@!p bra W;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* whether the phase of the given parity has completed: without waiting (test), or waiting at
 * most the hardware's time limit for it (try: a suspended thread, no spin) */
template <bool TRY> __device__ __forceinline__ bool mb_poll(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    if constexpr (TRY)
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    else
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    return done != 0;
}

/* ---------------------------------------------------------------- ldmatrix, mma.sync */

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                        uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                          uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* mma.sync m16n8k16 (c += a . b, fp32 accumulate) of the 16-bit type T, and two floats packed
 * into one 32-bit register of T (an A fragment element pair) */
template <typename T> struct Mma;
#define KCUDA_MMA(T, TY, T2, CVT2)                                                                 \
    template <> struct Mma<T> {                                                                    \
        __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4],          \
                                                   uint32_t b0, uint32_t b1)                       \
        {                                                                                          \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 "                \
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                 \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                          \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));          \
        }                                                                                          \
        __device__ __forceinline__ static uint32_t pack(float x, float y)                          \
        {                                                                                          \
            T2 h = CVT2(x, y);                                                                     \
            return *reinterpret_cast<uint32_t *>(&h);                                              \
        }                                                                                          \
    };
KCUDA_MMA(__half, "f16", __half2, __floats2half2_rn)
KCUDA_MMA(__nv_bfloat16, "bf16", __nv_bfloat162, __floats2bfloat162_rn)
#undef KCUDA_MMA

/* ---------------------------------------------------------------- named barriers, atomics */

/* bar.sync: waits until n threads (a multiple of 32) have arrived at barrier id, this one
 * included; bar.arrive: counts this thread toward the n without waiting. The ids the forwards
 * use are kern_cuda_fwd.cuh's Bar. */
__device__ __forceinline__ void bar_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* atomically adds 1 with release and acquire semantics at GPU scope; returns the old value */
__device__ __forceinline__ uint32_t atom_add1_acq_rel(uint32_t *p)
{
    uint32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
    return old;
}

/* 2^x on the special-function unit, subnormal results flushed to 0 */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* the global nanosecond timer */
__device__ __forceinline__ uint64_t globaltimer()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* ---------------------------------------------------------------- wgmma register pins */

/* Keep the compiler from moving accumulator (float) or fragment (uint32_t) registers across an
 * asynchronous wgmma: an empty asm that reads and writes each one. */
template <int K> __device__ __forceinline__ void wg_hold(float (&d)[K])
{
#pragma unroll
    for (int i = 0; i < K; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
template <int K> __device__ __forceinline__ void wg_hold_u(uint32_t (&d)[K][4])
{
#pragma unroll
    for (int i = 0; i < K; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(d[i][e])::"memory");
}

#if KCUDA_WGMMA
/* ---------------------------------------------------------------- sm_90a */

/* setmaxnreg: this warpgroup's registers per thread lowered (dec) or raised (inc) to R */
template <int R> __device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

/* wgmma's fences: before the first wgmma reading registers written since (fence), the end of a
 * group of issued wgmmas (commit), waiting until at most N groups are in flight (wait), and
 * shared memory written through the generic proxy (cp.async, st.shared) made visible to wgmma
 * (proxy_fence) */
__device__ __forceinline__ void wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wg_proxy_fence()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* n more arrivals on barrier bar at once */
__device__ __forceinline__ void mb_arrive_n(uint32_t bar, uint32_t n)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
                 "r"(n)
                 : "memory");
}

/* The tensor memory accelerator: the next phase of barrier `bar` also waits for `bytes` more
 * bytes of asynchronous copies (no arrival), and one box of the 5-d map `map` at coordinates
 * c0..c4 (innermost first) into shared memory at `dst` (1024-byte aligned for the 128-byte
 * swizzle), counted on `bar` */
__device__ __forceinline__ void mb_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void tma_load5(uint32_t dst, const void *map, uint32_t bar, int c0,
                                          int c1, int c2, int c3, int c4)
{
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "r"(c4)
                 : "memory");
}
#endif /* KCUDA_WGMMA */

#if KCUDA_SM90
/* ---------------------------------------------------------------- sm_90 clusters (bench_mcast) */

/* waits for the phase of parity ph of a barrier of this CTA, with acquire semantics at cluster
 * scope (arrivals of the cluster's other CTAs' threads included) */
__device__ __forceinline__ void mb_wait_cluster(uint32_t bar, uint32_t ph)
{
    asm volatile("{\n.reg .pred p;\nW:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra W;\n}\n" ::"r"(bar),
                 "r"(ph)
                 : "memory");
}
/* one arrival that also makes the phase wait for `bytes` bytes of asynchronous copies */
__device__ __forceinline__ void mb_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* one arrival with release semantics at CTA scope */
__device__ __forceinline__ void mb_arrive_release(uint32_t bar)
{
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* an arrival on the barrier at the same offset in cluster CTA `rank` */
__device__ __forceinline__ void mb_arrive_rank(uint32_t bar, uint32_t rank)
{
    asm volatile("{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, %0, %1;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];\n}\n" ::"r"(bar),
                 "r"(rank)
                 : "memory");
}
/* one box of the 2-d map at (c0, c1) into dst, counted on bar; _mc: into the CTAs of `mask` */
__device__ __forceinline__ void tma_load2(uint32_t dst, const void *map, uint32_t bar, int c0,
                                          int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void tma_load2_mc(uint32_t dst, const void *map, uint32_t bar, int c0,
                                             int c1, uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
                 : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
/* every thread of the cluster's CTAs arrives (release) and waits (acquire) */
__device__ __forceinline__ void cluster_sync()
{
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
            : "memory");
}
/* barrier inits made visible to the cluster's other CTAs */
__device__ __forceinline__ void fence_mbarrier_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
#endif /* KCUDA_SM90 */

} // namespace kcuda

#endif
