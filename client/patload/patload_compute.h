/*
 * patload_compute.h — the model compute patload stands in for around each attention hand-off,
 * so that a replay loads patd the way a serving frontend does (the pack of a step overlaps the
 * frontend's work before layer 0; every layer's attention sits between the QKV projection and
 * the output projection + MLP).
 *
 *   cpu: a busy wait per layer of layer_us + tokens x FLOPs per token / tflops, split between
 *        the part before attention (QKV projection) and after it (O projection, MLP), and the
 *        Q/K/V rows written into host staging from a pool of random values;
 *   gpu: the real GEMMs of that model shape (cuBLAS, reached with dlopen) on patload's own
 *        stream, the QKV projection writing straight into the daemon's staging buffers, and the
 *        hand-off enqueued on the same stream (pat_attend_async);
 *   none: only the Q/K/V writes (what the daemon alone costs).
 */
#ifndef PATLOAD_COMPUTE_H
#define PATLOAD_COMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "pat.h"

typedef enum pl_compute_kind {
    PL_COMPUTE_NONE = 0,
    PL_COMPUTE_CPU = 1,
    PL_COMPUTE_GPU = 2
} pl_compute_kind_t;

typedef struct pl_compute_cfg {
    pl_compute_kind_t kind;
    uint32_t n_layers, q_heads, kv_heads, head_dim, dtype; /* the daemon's model */
    uint32_t hidden, ffn;                                  /* model width, MLP width */
    uint32_t max_tokens;                                   /* staging rows */
    double layer_us;                                       /* cpu: fixed cost per layer (µs) */
    double tflops; /* cpu: modelled GEMM rate (TFLOP/s) for the per-token cost */
} pl_compute_cfg_t;

typedef struct pl_compute pl_compute_t;

/* Sets up the stand-in over the session's staging buffers. gpu needs a GPU session and cuBLAS.
 * Returns 0 and *ret, or a negative errno with why. */
int pl_compute_create(const pl_compute_cfg_t *cfg, pat_conn_t *conn, pl_compute_t **ret, char *why,
                      size_t why_len);
void pl_compute_free(pl_compute_t *pc);
/* One step of n_tokens rows through every layer: compute, hand each layer over, compute.
 * Returns 0, or the first failing hand-off's negative errno (the step must then be ended with
 * abort; libpat hands over the layers left). */
int pl_compute_step(pl_compute_t *pc, uint32_t n_tokens);
const char *pl_compute_name(pl_compute_kind_t k);
/* Device name (gpu) or "" */
const char *pl_compute_device(const pl_compute_t *pc);

#endif
