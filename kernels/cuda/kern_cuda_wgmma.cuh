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
/* ss64: d (64 x 64 fp32) = (acc 0) or += A (64 x 16, K-major, desc da) . B (16 x 64, K-major,
 * desc db). rsN: d (64 x N fp32) += A (64 x 16, registers) . B (16 x N, N-major, desc db). */
#define KCUDA_WG_SS64(TY)                                                                          \
    __device__ __forceinline__ static void ss64(float(&d)[32], uint64_t da, uint64_t db, int acc)  \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                   \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20," \
                     "%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "                              \
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"                                               \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),     \
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),   \
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),            \
                       "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),            \
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]),            \
                       "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])             \
                     : "l"(da), "l"(db), "r"(acc)                                                  \
                     : "memory");                                                                  \
    }

#define KCUDA_WG_RS64(TY)                                                                          \
    __device__ __forceinline__ static void rs64(float(&d)[32], const uint32_t(&a)[4], uint64_t db) \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                   \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                     \
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "          \
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"                                    \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),     \
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),   \
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),            \
                       "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),            \
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]),            \
                       "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)                         \
                     : "memory");                                                                  \
    }

/* rsk64: d (64 x 64 fp32) = (acc 0) or += A (64 x 16, registers) . B (16 x 64, K-major) */
#define KCUDA_WG_RSK64(TY)                                                                         \
    __device__ __forceinline__ static void rsk64(float(&d)[32], const uint32_t(&a)[4],             \
                                                 uint64_t db, int acc)                             \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                   \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                     \
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "          \
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"                                    \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),     \
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),   \
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),            \
                       "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),            \
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]),            \
                       "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)               \
                     : "memory");                                                                  \
    }

#define KCUDA_WG_RS128(TY)                                                                         \
    __device__ __forceinline__ static void rs128(float(&d)[64], const uint32_t(&a)[4],             \
                                                 uint64_t db)                                      \
    {                                                                                              \
        asm volatile(                                                                              \
            "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                             \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                           \
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                              \
            "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                     \
            "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                     \
            "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "                   \
            "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"                                             \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),  \
              "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),           \
              "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),        \
              "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
              "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),        \
              "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),        \
              "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),        \
              "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),        \
              "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),        \
              "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),        \
              "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)                                  \
            : "memory");                                                                           \
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
#endif /* KCUDA_WGMMA */

} // namespace kcuda

#endif
