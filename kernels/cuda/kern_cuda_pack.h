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

/* A CTA of the device plan: the scheduler's CTA lowered for this backend. The device copy of a
 * plan holds these where the plan holds its CTAs (same size, same offset), every other array as
 * the plan has it. */
typedef struct kcuda_cta {
    uint32_t row_begin, row_count; /* as sched_plan_cta_t */
    uint32_t seg_begin, seg_count;
    uint32_t kv_tokens;
    uint32_t first_tile; /* fwd_pair: index of its first tile in the plan's tile list */
    uint32_t n_tiles;    /* fwd_pair: its tiles (kcuda_pack_fill writes them) */
    uint32_t pad;
} kcuda_cta_t;

/* Lowers h's CTAs into out (h->n_ctas records): those of more than KCUDA_SMALL_M rows first,
 * then the others, each run in plan order (longest first), so that fwd_pair numbers its work
 * items without gaps (ws_ref: a big CTA is an item per KV head, a small one an item per two;
 * the plan's first CTA's mode first instead measured slower on the PAT trees, H100: 1.011x the
 * time, up to 1.017x by head config, tests/bench/log/2026-11-26-work-items-staging.md); each
 * with its tiles counted by kcuda_pack_item's rule and placed. Nothing else names a CTA by its
 * index, and the plan's meaning does not depend on their order (sched_plan_fmt.h). Returns the
 * number of the first kind; *n_tiles = the plan's tiles. */
uint32_t kcuda_pack_prepare(const sched_plan_hdr_t *h, kcuda_cta_t *out, uint64_t *n_tiles);

/* Writes the tiles of the lowered CTAs cd (kcuda_pack_prepare counted them: *n_tiles of room)
 * to out. */
void kcuda_pack_fill(const sched_plan_hdr_t *h, const kcuda_cta_t *cd, kcuda_tile_t *out);

/* The pair kernel's item rule (sched_item_fn), the one kcuda_pack_prepare lays CTAs out with:
 * an m-row CTA runs on fwd_pair (kind 1) from KCUDA_WS_MIN_ROWS rows up, holds two slots above
 * KCUDA_SMALL_M rows, and walks its segments' blocks four to a tile in three classes (read by
 * both consumers' rows, by the first's only, by the second's only); at most KCUDA_WS_MIN_ROWS
 * rows it is a 4-warp kernel's item (kind 0): one slot, each segment its own tile_n tiles. In a
 * batch-invariant plan (flags SCHED_PLAN_INVARIANT) every CTA runs on fwd_pair, its segments
 * (each one window's blocks) packed window by window, whole segments to a tile, and its tiles
 * are priced as its longer consumer chain: per window the tiles both consumers read, the larger
 * of the two consumers' own and a quarter of the smaller. */
void kcuda_pack_item(uint32_t m, uint32_t group, uint32_t tile_n, uint32_t flags, const void *spans,
                     size_t stride, uint32_t n, sched_item_t *ret);

#ifdef __cplusplus
}
#endif

#endif
