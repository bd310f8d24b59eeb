/*
 * kern_cuda_page.cuh — paged KV for the forwards: the address of a token's K (and V) chunk in a
 * block of the pool, and fwd_cta's tile count of a CTA's segments (fwd_cta's page cursor walks
 * them tile by tile).
 *
 * fwd_pair walks no segment: plan_upload lists its tiles (WsTile: each of its four chunks a block
 * of a segment, short segments packed together) and counts them on the host (kcuda_cta_t.n_tiles,
 * kcuda_pack_item's rule), so its tile count and cursor are not fwd_cta's. What the two share is
 * the address of a token's K and V rows and the zero-filled 16-byte copy around it (cp_async16
 * with src-size 0 where a row is not read).
 */
#ifndef KERN_CUDA_PAGE_CUH
#define KERN_CUDA_PAGE_CUH

#include <stdint.h>

#include "kern_cuda_int.h"
#include "kern_cuda_ptx.cuh"

namespace kcuda
{

/* the K row chunk ch of row `row` of KV block `blk` (the KV head's elements start at kbase); its V
 * is a.v_offset elements further (an fp8 pool: T uint8_t, a chunk 8 bytes). R: the caller's row
 * type (its index arithmetic is kept).
 * fwd_pair's producer takes its addresses here; fwd_cta's loads spell the same expression out
 * (see its page cursor). */
template <typename T, int D, typename R>
__device__ __forceinline__ const T *kv_chunk(const FwdArgs &a, const T *kbase, uint32_t blk, R row,
                                             int ch)
{
    return kbase + (uint64_t)blk * a.block_stride + row * D + ch * 8;
}

/* fwd_cta's tiles of a CTA's segments: each segment's range from its kv_begin in steps of N,
 * segments end to end; an empty segment is one masked tile, as fwd_cta's page and compute
 * cursors walk it */
template <int N>
__device__ __forceinline__ int seg_tiles(const sched_plan_seg_t *segs, uint32_t n_segs)
{
    int n_tiles = 0;
    for (uint32_t k = 0; k < n_segs; k++) {
        const uint32_t len = segs[k].kv_end - segs[k].kv_begin;
        n_tiles += len ? (int)((len + N - 1) / N) : 1;
    }
    return n_tiles;
}

constexpr uint32_t PAGE_NONE = 0xffffffffu; /* fwd_cta's page cursor: past the segment's end */

} // namespace kcuda

#endif
