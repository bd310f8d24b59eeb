/*
 * kern_cuda_pack.h — the KV tiles of the pair kernel (fwd_pair, kern_cuda_fwd_ws.cuh), built on
 * the host from a plan at upload. Plain C: the cuda backend calls it, and a unit test that needs
 * no GPU checks it against the plan's meaning.
 *
 * A tile is four chunks, each one block (KERN_BLOCK_SIZE tokens) of one of a CTA's segments, in
 * tile rows 16k..16k+15 for chunk k. A CTA's tiles are listed once for every KV head (a block
 * holds every head). Short segments share a tile instead of each starting one, so a TREE CTA's
 * 32-token leaves cost half a tile each. In a CTA of more than KCUDA_SMALL_M rows (two consumer
 * warpgroups of 64 q-head rows each) the chunks fall in three classes, packed apart: read by
 * both consumers' rows, by consumer 0's only, by consumer 1's only; the first class's tiles come
 * first, then the other two's alternating, so that the two consumers compute their own rows'
 * leaves at the same time (a consumer skips the tiles none of its rows reads).
 */
#ifndef KERN_CUDA_PACK_H
#define KERN_CUDA_PACK_H

#include <stdint.h>

#include "sched_plan_fmt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KCUDA_NO_BLOCK 0xffffffffu /* kcuda_tile_t.blk: no chunk there (its rows zero-filled) */

typedef struct kcuda_tile {
    uint32_t blk[4]; /* the chunk's block id, or KCUDA_NO_BLOCK */
    uint32_t pos[4]; /* absolute position of the block's first token */
    uint32_t rng[4]; /* the chunk's block rows [lo, hi) and its readers, the CTA's rows (query
                        tokens) [row_lo, row_hi): lo | hi << 8 | row_lo << 16 | row_hi << 24;
                        0 where there is no chunk */
    uint32_t whole;  /* where the four chunks are whole blocks read by the same rows, one past
                        their last position (a reader of a larger limit needs no mask), else 0 */
    uint32_t live;   /* bit c: q-head rows 64c..64c+63 of the CTA read one of its chunks */
    uint32_t next;   /* the next tile's `live` (0 after the CTA's last) */
    uint32_t pad;
} kcuda_tile_t;

/* Copies h's CTAs into the device copy dst (same layout, every other array already copied):
 * those of more than KCUDA_SMALL_M rows first, then the others, each run in plan order (longest
 * first), so that fwd_pair numbers its work items without gaps (ws_ref: a big CTA is an item per
 * KV head, a small one an item per two; the plan's first CTA's mode first instead measured 1.7 %
 * slower on the PAT trees, H100, 2026-11-26); each with its tile count in `reserved` and its
 * first tile's index in `pack`. Nothing else names a CTA by its index, and the plan's meaning
 * does not depend on their order (sched_plan_fmt.h). Returns the number of the first kind;
 * *n_tiles = the plan's tiles. */
uint32_t kcuda_pack_prepare(const sched_plan_hdr_t *h, sched_plan_hdr_t *dst, uint64_t *n_tiles);

/* Writes the tiles of dst's CTAs (kcuda_pack_prepare counted them: *n_tiles of room) to out. */
void kcuda_pack_fill(const sched_plan_hdr_t *h, const sched_plan_hdr_t *dst, kcuda_tile_t *out);

#ifdef __cplusplus
}
#endif

#endif
