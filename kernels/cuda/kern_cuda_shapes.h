/*
 * kern_cuda_shapes.h — the closed tile-shape set of the cuda forward kernel, written once. Plain
 * C: the kernel's dispatch (kern_cuda_fwd.cuh), the tile table it hands the scheduler
 * (kern_cuda_tiles.c) and the tools derive everything from these lines.
 *
 * Every shape runs with KCUDA_THREADS threads (4 warps) and KCUDA_TILE_N KV tokens per tile, so
 * one launch can run a plan's CTAs of every shape: each CTA picks the smallest m that holds its
 * rows. m is a multiple of 16 (mma.sync m16n8k16 row bands); with 4 warps and n = 64 every
 * warp's KV slice is a multiple of 16 (one k-step of P.V). The set has no m = 128 and no
 * n = 128, as measured: m = 128 CTAs on four mma.sync warps were neither byte- nor compute-bound
 * (71 TFLOP/s, 9 % of the tensor rate, on the H200), and the GQA-8 packs they made were slower
 * than query-centric plans on seven 64/8 trees (0.84-0.99 on the H100); n = 64 won or tied every
 * KV length (tests/bench/log/2026-11-21-pat-trees-h200.md and
 * tests/bench/log/2026-11-21-pat-trees-h100.md). m = 128 runs on Hopper only, as eight warps, two
 * wgmma warpgroups (KCUDA_BIG_M).
 */
#ifndef KERN_CUDA_SHAPES_H
#define KERN_CUDA_SHAPES_H

#define KCUDA_TILE_MS(X) X(16) X(32) X(64)
#define KCUDA_TILE_N     64
#define KCUDA_THREADS    128
#define KCUDA_SMALL_M    64 /* the largest m of KCUDA_TILE_MS */
/* sm_90a, head_dim <= 128: the pair kernel (kern_cuda_fwd_ws.cuh) runs CTAs of up to KCUDA_BIG_M
 * rows on two consumer warpgroups that share every KV tile, and the smaller ones two KV heads at a
 * time; a third warpgroup loads */
#define KCUDA_BIG_M 128
/* fwd_pair's threads: a producer and two consumer warpgroups */
#define KCUDA_PAIR_THREADS (3 * KCUDA_THREADS)
/* plans whose CTAs have at most this many rows run on the 4-warp kernels where fwd_pair runs */
#define KCUDA_WS_MIN_ROWS 16
#define KCUDA_MAX_M       KCUDA_BIG_M /* bounds a CTA's rows wherever they are listed */

#endif
