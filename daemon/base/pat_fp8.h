/*
 * pat_fp8.h — fp8 <-> fp32 on the host, the two OCP 8-bit formats a KV cache stores:
 *   e4m3 (E4M3FN): bias 7, 3 mantissa bits, no infinities, largest finite 448, NaN 0x7f / 0xff;
 *   e5m2: bias 15, 2 mantissa bits, IEEE-like (infinities 0x7c / 0xfc, NaN above them; the
 *         encoder's is 0x7f), largest finite 57344.
 * The encoders round to nearest even and saturate: a finite value or an infinity beyond the
 * largest finite becomes it (the "satfinite" rule of the GPU's cvt.rn.satfinite, so host and
 * device agree), NaN stays NaN; subnormals are kept. The decoders are exact.
 *
 * libc only (a leaf, like the rest of daemon/base) and valid C++, like pat_half.h, whose bit
 * helpers it uses. Host code only.
 */
#ifndef PAT_FP8_H
#define PAT_FP8_H

#include <stdint.h>

#include "pat_half.h" /* pat__f32_bits, pat__bits_f32 */

/* one format: exponent bits, mantissa bits, bias, largest finite code (sign clear), NaN code */
typedef struct pat_fp8_fmt {
    uint32_t ebits, mbits, bias, max_code, nan_code;
} pat_fp8_fmt_t;

static inline pat_fp8_fmt_t pat__fp8_e4m3(void)
{
    const pat_fp8_fmt_t f = {4, 3, 7, 0x7eu, 0x7fu};
    return f;
}
static inline pat_fp8_fmt_t pat__fp8_e5m2(void)
{
    const pat_fp8_fmt_t f = {5, 2, 15, 0x7bu, 0x7fu};
    return f;
}

static inline float pat__fp8_to_f32(pat_fp8_fmt_t fm, uint8_t c)
{
    const uint32_t sign = (uint32_t)(c & 0x80u) << 24, mag = c & 0x7fu;
    const uint32_t exp = mag >> fm.mbits, man = mag & ((1u << fm.mbits) - 1u);
    if (mag > fm.max_code) { /* e4m3: only NaN; e5m2: infinity (mantissa 0) or NaN */
        if (fm.ebits == 5 && man == 0)
            return pat__bits_f32(sign | 0x7f800000u);
        return pat__bits_f32(sign | 0x7fc00000u);
    }
    if (exp == 0) { /* zero or subnormal: man x 2^(1 - bias - mbits), exact in fp32 */
        const float unit = pat__bits_f32((127u + 1u - fm.bias - fm.mbits) << 23);
        const float v = (float)man * unit;
        return sign ? -v : v;
    }
    return pat__bits_f32(sign | ((exp + 127u - fm.bias) << 23) | (man << (23 - fm.mbits)));
}

static inline uint8_t pat__f32_to_fp8(pat_fp8_fmt_t fm, float f)
{
    const uint32_t u = pat__f32_bits(f), sign = (u >> 24) & 0x80u, abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint8_t)(sign | fm.nan_code);
    /* the smallest normal, 2^(1 - bias), as fp32 bits */
    const uint32_t min_normal = (127u + 1u - fm.bias) << 23;
    uint32_t mag;
    if (abs < min_normal) {
        /* subnormal (or zero): abs / 2^(1 - bias - mbits) rounded to nearest even; the scaling
         * by a power of two is exact, and 2^mbits (rounded up) is the smallest normal's code */
        const float v = pat__bits_f32(abs) * pat__bits_f32((127u - 1u + fm.bias + fm.mbits) << 23);
        uint32_t i = (uint32_t)v;
        const float rem = v - (float)i;
        if (rem > 0.5f || (rem == 0.5f && (i & 1u)))
            i++;
        mag = i;
    } else {
        /* normal: round the fp32 mantissa to mbits (nearest even; a carry moves into the
         * exponent), then rebias; infinity lands past max_code and saturates below */
        const uint32_t shift = 23 - fm.mbits;
        const uint32_t r = abs + ((1u << (shift - 1)) - 1u) + ((abs >> shift) & 1u);
        mag = (r >> shift) - ((127u - fm.bias) << fm.mbits);
    }
    if (mag > fm.max_code)
        mag = fm.max_code;
    return (uint8_t)(sign | mag);
}

static inline float pat_e4m3_to_f32(uint8_t c)
{
    return pat__fp8_to_f32(pat__fp8_e4m3(), c);
}
static inline uint8_t pat_f32_to_e4m3(float f)
{
    return pat__f32_to_fp8(pat__fp8_e4m3(), f);
}
static inline float pat_e5m2_to_f32(uint8_t c)
{
    return pat__fp8_to_f32(pat__fp8_e5m2(), c);
}
static inline uint8_t pat_f32_to_e5m2(float f)
{
    return pat__f32_to_fp8(pat__fp8_e5m2(), f);
}

#endif
