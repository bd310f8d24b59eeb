/*
 * kern_cuda_wgmma.cuh — the Hopper warpgroup matrix instructions the forwards use and their
 * shared-memory descriptors (the instructions on sm_90a only: KCUDA_WGMMA is 0 elsewhere and they
 * are not compiled; wgmma's fences are with the other PTX wrappers in kern_cuda_ptx.cuh).
 * Operand tiles in shared memory use the 128-byte swizzle: column blocks of 64 16-bit elements
 * one after another, rows 128 bytes apart inside a block, 16-byte chunks XOR-swizzled by row % 8,
 * every tile 1024-byte aligned (wswz). The accumulator layout per warp of the warpgroup is
 * mma.sync's m16n8 C layout repeated over n: warp w holds rows 16w + lane / 4 and + 8, and for
 * each 8 columns j the pair 8j + 2 (lane % 4).
 */
#ifndef KERN_CUDA_WGMMA_CUH
#define KERN_CUDA_WGMMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kern_cuda_ptx.cuh" /* KCUDA_WGMMA; the fences wg_fence, wg_commit, wg_wait */

namespace kcuda
{

/* byte offset of 16-byte chunk c of row r in an R-row tile in the 128-byte swizzle layout */
template <int R> __device__ __forceinline__ uint32_t wswz(int r, int c)
{
    return static_cast<uint32_t>((c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* a shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte
 * units, 14 bits each), 128-byte swizzle */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) |
           static_cast<uint64_t>((lbo & 0x3ffffu) >> 4) << 16 |
           static_cast<uint64_t>((sbo & 0x3ffffu) >> 4) << 32 | static_cast<uint64_t>(1) << 62;
}

#if KCUDA_WGMMA
/* the asm output operands of 32 fp32 accumulators d[i] .. d[i + 31] */
#define KCUDA_WG_ACC8(d, i)                                                                        \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
/* their registers in the instruction, operands 0 .. 31 */
#define KCUDA_WG_D32                                                                               \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                      \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define KCUDA_WG_ACC32(d, i)                                                                       \
    KCUDA_WG_ACC8(d, i), KCUDA_WG_ACC8(d, i + 8), KCUDA_WG_ACC8(d, i + 16), KCUDA_WG_ACC8(d, i + 24)

/* ss64: d (64 x 64 fp32) = (acc 0) or += A (64 x 16, K-major, desc da) . B (16 x 64, K-major,
 * desc db). rsN: d (64 x N fp32) += A (64 x 16, registers) . B (16 x N, N-major, desc db). */
#define KCUDA_WG_SS64(TY)                                                                          \
    __device__ __forceinline__ static void ss64(float(&d)[32], uint64_t da, uint64_t db, int acc)  \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " KCUDA_WG_D32 ", " \
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"                                               \
                     : KCUDA_WG_ACC32(d, 0)                                                        \
                     : "l"(da), "l"(db), "r"(acc)                                                  \
                     : "memory");                                                                  \
    }

#define KCUDA_WG_RS64(TY)                                                                          \
    __device__ __forceinline__ static void rs64(float(&d)[32], const uint32_t(&a)[4], uint64_t db) \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " KCUDA_WG_D32 ", " \
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"                                    \
                     : KCUDA_WG_ACC32(d, 0)                                                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)                         \
                     : "memory");                                                                  \
    }

/* rsk64: d (64 x 64 fp32) = (acc 0) or += A (64 x 16, registers) . B (16 x 64, K-major) */
#define KCUDA_WG_RSK64(TY)                                                                         \
    __device__ __forceinline__ static void rsk64(float(&d)[32], const uint32_t(&a)[4],             \
                                                 uint64_t db, int acc)                             \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " KCUDA_WG_D32 ", " \
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"                                    \
                     : KCUDA_WG_ACC32(d, 0)                                                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)               \
                     : "memory");                                                                  \
    }

#define KCUDA_WG_RS128(TY)                                                                         \
    __device__ __forceinline__ static void rs128(float(&d)[64], const uint32_t(&a)[4],             \
                                                 uint64_t db)                                      \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                  \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                     \
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"            \
                     "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"            \
                     "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "          \
                     "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"                                    \
                     : KCUDA_WG_ACC32(d, 0), KCUDA_WG_ACC32(d, 32)                                 \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)                         \
                     : "memory");                                                                  \
    }

template <typename T> struct Wg;
template <> struct Wg<__half> {
    KCUDA_WG_SS64("f16")
    KCUDA_WG_RS64("f16")
    KCUDA_WG_RSK64("f16")
    KCUDA_WG_RS128("f16")
};
template <> struct Wg<__nv_bfloat16> {
    KCUDA_WG_SS64("bf16")
    KCUDA_WG_RS64("bf16")
    KCUDA_WG_RSK64("bf16")
    KCUDA_WG_RS128("bf16")
};
#undef KCUDA_WG_SS64
#undef KCUDA_WG_RS64
#undef KCUDA_WG_RSK64
#undef KCUDA_WG_RS128
#undef KCUDA_WG_ACC32
#undef KCUDA_WG_ACC8
#undef KCUDA_WG_D32
#endif /* KCUDA_WGMMA */

} // namespace kcuda

#endif
