/*
 * kern_cuda_fp8.cuh — the cuda backend's fp8 KV elements (kern_model_t.kv_dtype e4m3 or e5m2):
 * the append's encoding (value / kv_scale, nearest even, saturated at the largest finite: the same
 * bytes as the cpu backend's daemon/base/pat_fp8.h) and the forward's decoding of 16 elements into
 * the model's 16-bit dtype, exactly (every e4m3 and e5m2 value is an fp16 and a bf16 value). The
 * factor is not applied here: the forward folds it into the softmax scale (K) and O's (V).
 *
 * Decoding, per pair of elements:
 *   fp16: one cvt.rn.f16x2.e4m3x2 (or e5m2x2), sm_89 and up;
 *   bf16: the byte's exponent and mantissa placed into a bf16's low exponent and high mantissa
 *         bits (sign to sign), which is the value times 2^-(127 - bias): e4m3 2^-120, e5m2 2^-112
 *         (subnormals too: a zero exponent field stays zero on both sides), then one bf16x2
 *         multiply by 2^120 (2^112), exact (a power of two, the product normal).
 */
#ifndef KERN_CUDA_FP8_CUH
#define KERN_CUDA_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdint.h>
#include <type_traits>

#include "kern.h"

/* How the forward decodes (a timing experiment's builds set it: nvcc -DKCUDA_FP8_DECODE=n):
 * 1 as above; 2 fp16 by the bf16 way too (bits placed, times 2^8: no conversion instruction);
 * 0 not at all (the tiles stay raw bytes: outputs wrong, times only) */
#ifndef KCUDA_FP8_DECODE
#define KCUDA_FP8_DECODE 1
#endif

namespace kcuda
{

/* Two floats as two fp8 bytes (x in the low byte): nearest even, saturated at the format's
 * largest finite (satfinite); the caller gives finite values. */
template <int KV> __device__ __forceinline__ uint16_t fp8x2_from(float x, float y)
{
    static_assert(KV == KERN_FP8_E4M3 || KV == KERN_FP8_E5M2, "an fp8 KV dtype");
    uint16_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (KV == KERN_FP8_E4M3)
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(x), "f"(y));
    else
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(r) : "f"(x), "f"(y));
#else
    r = 0;
    __trap(); /* never run: the backend serves an fp8 pool with sm_89 code or newer only */
#endif
    return r;
}

/* Four fp8 bytes of w (memory order: byte 0 first) as two pairs of T, lo = bytes 0 and 1. */
template <typename T, int KV>
__device__ __forceinline__ void fp8x4_to(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    static_assert(KV == KERN_FP8_E4M3 || KV == KERN_FP8_E5M2, "an fp8 KV dtype");
    if constexpr (std::is_same<T, __half>::value && KCUDA_FP8_DECODE == 2) {
        /* fp16 bits: exponent and mantissa at 7 (e4m3: the value x 2^-8) or 8 (e5m2: exact) */
        constexpr int SH = KV == KERN_FP8_E4M3 ? 7 : 8;
        const uint32_t a = __byte_perm(w, 0u, 0x4140u), b = __byte_perm(w, 0u, 0x4342u);
        const uint32_t ma = ((a & 0x007f007fu) << SH) | ((a & 0x00800080u) << 8);
        const uint32_t mb = ((b & 0x007f007fu) << SH) | ((b & 0x00800080u) << 8);
        if constexpr (KV == KERN_FP8_E4M3) {
            const __half2 up = __halves2half2(__ushort_as_half(0x5c00), __ushort_as_half(0x5c00));
            const __half2 ra = __hmul2(*reinterpret_cast<const __half2 *>(&ma), up);
            const __half2 rb = __hmul2(*reinterpret_cast<const __half2 *>(&mb), up);
            lo = *reinterpret_cast<const uint32_t *>(&ra);
            hi = *reinterpret_cast<const uint32_t *>(&rb);
        } else {
            lo = ma;
            hi = mb;
        }
    } else if constexpr (std::is_same<T, __half>::value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        if constexpr (KV == KERN_FP8_E4M3)
            asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\n"
                "cvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
                : "=r"(lo), "=r"(hi)
                : "r"(w));
        else
            asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\n"
                "cvt.rn.f16x2.e5m2x2 %0, l;\ncvt.rn.f16x2.e5m2x2 %1, h;\n}"
                : "=r"(lo), "=r"(hi)
                : "r"(w));
#else
        lo = hi = 0;
        __trap();
#endif
    } else {
        constexpr int SH = KV == KERN_FP8_E4M3 ? 4 : 5;        /* mantissa 3 or 2 bits */
        constexpr uint32_t UP = KV == KERN_FP8_E4M3 ? 0x7b80u  /* bf16 2^120 */
                                                    : 0x7780u; /* bf16 2^112 */
        const uint32_t a = __byte_perm(w, 0u, 0x4140u);        /* bytes 0, 1 in each half */
        const uint32_t b = __byte_perm(w, 0u, 0x4342u);        /* bytes 2, 3 */
        const uint32_t ma = ((a & 0x007f007fu) << SH) | ((a & 0x00800080u) << 8);
        const uint32_t mb = ((b & 0x007f007fu) << SH) | ((b & 0x00800080u) << 8);
        const __nv_bfloat162 up = __halves2bfloat162(__ushort_as_bfloat16((unsigned short)UP),
                                                     __ushort_as_bfloat16((unsigned short)UP));
        const __nv_bfloat162 ra = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&ma), up);
        const __nv_bfloat162 rb = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&mb), up);
        lo = *reinterpret_cast<const uint32_t *>(&ra);
        hi = *reinterpret_cast<const uint32_t *>(&rb);
    }
}

/* 16 fp8 elements (x, memory order) as 16 of T: a holds elements 0-7, b 8-15. */
template <typename T, int KV>
__device__ __forceinline__ void fp8x16_to(const uint4 &x, uint4 &a, uint4 &b)
{
    fp8x4_to<T, KV>(x.x, a.x, a.y);
    fp8x4_to<T, KV>(x.y, a.z, a.w);
    fp8x4_to<T, KV>(x.z, b.x, b.y);
    fp8x4_to<T, KV>(x.w, b.z, b.w);
}

} // namespace kcuda

#endif
