/*
 * kern_dtype.h — elements of a kern_dtype_t array as fp32 on the host (kern_load, kern_store),
 * over the fp16 and bf16 conversions of pat_half.h (round to nearest even, NaN and infinity
 * preserved, subnormals handled) and the fp8 ones of pat_fp8.h (round to nearest even, saturated
 * at the largest finite: an fp8 element is stored unscaled here, kern_model_t.kv_scale is the
 * caller's). Used by the cpu backend and by tests that prepare inputs.
 */
#ifndef KERN_DTYPE_H
#define KERN_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "kern.h"
#include "pat_fp8.h"
#include "pat_half.h"

/* The conversions themselves live in daemon/base/pat_half.h (one definition, shared with
 * client/); the kernels' names for them: */
#define kern_f16_to_f32  pat_f16_to_f32
#define kern_f32_to_f16  pat_f32_to_f16
#define kern_bf16_to_f32 pat_bf16_to_f32
#define kern_f32_to_bf16 pat_f32_to_bf16

/* Element i of an array of dtype d, as fp32. */
static inline float kern_load(kern_dtype_t d, const void *p, uint64_t i)
{
    switch (d) {
    case KERN_F16:
        return kern_f16_to_f32(((const uint16_t *)p)[i]);
    case KERN_BF16:
        return kern_bf16_to_f32(((const uint16_t *)p)[i]);
    case KERN_FP8_E4M3:
        return pat_e4m3_to_f32(((const uint8_t *)p)[i]);
    case KERN_FP8_E5M2:
        return pat_e5m2_to_f32(((const uint8_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

static inline void kern_store(kern_dtype_t d, void *p, uint64_t i, float v)
{
    switch (d) {
    case KERN_F16:
        ((uint16_t *)p)[i] = kern_f32_to_f16(v);
        break;
    case KERN_BF16:
        ((uint16_t *)p)[i] = kern_f32_to_bf16(v);
        break;
    case KERN_FP8_E4M3:
        ((uint8_t *)p)[i] = pat_f32_to_e4m3(v);
        break;
    case KERN_FP8_E5M2:
        ((uint8_t *)p)[i] = pat_f32_to_e5m2(v);
        break;
    default:
        ((float *)p)[i] = v;
    }
}

/* Zeroes every NaN and infinity of n elements of dtype d in place (kern_append_kv's rule: a
 * pool slot never holds one, so a masked score's P = 0 never meets NaN in V); returns how many. */
static inline uint64_t kern_finite(kern_dtype_t d, void *p, uint64_t n)
{
    uint64_t fixed = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (d == KERN_F16 || d == KERN_BF16) {
            uint16_t *x = (uint16_t *)p + i;
            const uint16_t e = d == KERN_F16 ? 0x7c00u : 0x7f80u;
            if ((*x & e) == e) {
                *x = 0;
                fixed++;
            }
        } else {
            uint32_t x;
            memcpy(&x, (uint8_t *)p + 4 * i, 4);
            if ((x & 0x7f800000u) == 0x7f800000u) {
                memset((uint8_t *)p + 4 * i, 0, 4);
                fixed++;
            }
        }
    }
    return fixed;
}

#endif
