/*
 * pat_half.h — fp16 and bf16 <-> fp32 on the host: round to nearest even, NaN and infinity
 * preserved, subnormals handled. The one definition of these conversions: the cpu backend and
 * the tests reach them through kernels/kern_dtype.h, client/ (patload's stand-in data) directly.
 *
 * libc only (a leaf, like the rest of daemon/base), and valid C++ so that nvcc's host compiler
 * can include it (kern_dtype.h is included by .cu tests). Host code only: device code uses
 * cuda_fp16.h / cuda_bf16.h.
 */
#ifndef PAT_HALF_H
#define PAT_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t pat__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float pat__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float pat_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)
        return pat__bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / nan */
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return pat__bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t pat_f32_to_f16(float f)
{
    uint32_t u = pat__f32_bits(f), sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {
        /* subnormal half (or zero): value / 2^-24, rounded to nearest even */
        float v = pat__bits_f32(abs) * 16777216.0f;
        uint32_t i = (uint32_t)v;
        float rem = v - (float)i;
        if (rem > 0.5f || (rem == 0.5f && (i & 1u)))
            i++;
        return (uint16_t)(sign | i);
    }
    uint32_t r = abs - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    return (uint16_t)(sign | (r >> 13));
}

static inline float pat_bf16_to_f32(uint16_t h)
{
    return pat__bits_f32((uint32_t)h << 16);
}

static inline uint16_t pat_f32_to_bf16(float f)
{
    uint32_t u = pat__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
