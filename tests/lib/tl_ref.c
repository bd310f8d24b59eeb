/* tl_ref.c — see tl_ref.h. */
#include "tl_ref.h"

#include <math.h>
#include <stdlib.h>

void tl_ref_attend(const double *q, const double *k, const double *v, uint32_t n, uint32_t d,
                   double scale, double softcap, double *out)
{
    for (uint32_t x = 0; x < d; x++)
        out[x] = 0.0;
    if (n == 0)
        return;
    double *s = malloc(n * sizeof(double)), mx = -INFINITY, sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        double dot = 0.0;
        for (uint32_t x = 0; x < d; x++)
            dot += q[x] * k[(uint64_t)i * d + x];
        dot *= scale;
        if (softcap > 0.0)
            dot = softcap * tanh(dot / softcap);
        s[i] = dot;
        mx = dot > mx ? dot : mx;
    }
    for (uint32_t i = 0; i < n; i++) {
        double p = exp(s[i] - mx);
        sum += p;
        for (uint32_t x = 0; x < d; x++)
            out[x] += p * v[(uint64_t)i * d + x];
    }
    for (uint32_t x = 0; x < d; x++)
        out[x] /= sum;
    free(s);
}

double tl_kv_value(uint64_t seed, uint32_t block, uint32_t off, uint32_t head, uint32_t x, int is_v)
{
    uint64_t z = seed ^ ((uint64_t)block << 32 | (uint64_t)off << 20 | (uint64_t)head << 10 | x);
    z ^= (uint64_t)is_v * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

double tl_rel_err(const double *a, const double *b, uint64_t n)
{
    double num = 0.0, den = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    if (den == 0.0)
        return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}
