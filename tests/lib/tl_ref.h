/*
 * tl_ref.h — the float64 oracle: naive attention of one query row over its logical (unpaged) KV,
 * and the deterministic KV contents the tests write into a pool.
 */
#ifndef TL_REF_H
#define TL_REF_H

#include <stdint.h>

/* out[d] = softmax(scale * q . k[i] (softcapped if softcap > 0)) . v, over i < n; n == 0 gives 0.
 */
void tl_ref_attend(const double *q, const double *k, const double *v, uint32_t n, uint32_t d,
                   double scale, double softcap, double *out);

/* Deterministic pseudo-random value in [-1, 1) of a KV element: a function of where it lives
 * (block, offset), which head, which element and K or V — so shared blocks hold shared KV. */
double tl_kv_value(uint64_t seed, uint32_t block, uint32_t off, uint32_t head, uint32_t x,
                   int is_v);

/* ||a - b|| / ||b|| over n doubles (0 when both are 0). */
double tl_rel_err(const double *a, const double *b, uint64_t n);

#endif
