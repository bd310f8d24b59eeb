/*
 * kern_cuda_page.cuh — paged KV for the forwards: the address of a token's K (and V) chunk in a
 * block of the pool (both forwards), its zero-filling copy, and fwd_cta's tile count of a CTA's
 * segments (fwd_cta's page cursor walks them tile by tile).
 *
 * fwd_pair walks no segment: plan_upload lists its tiles (WsTile: each of its four chunks a block
 * of a segment, short segments packed together) and counts them on the host (kcuda_cta_t.n_tiles,
 * kcuda_pack_item's rule), so its tile count and cursor are not fwd_cta's. What the two share is
 * the address of a token's K and V rows and their zero-filled copy.
 */
#ifndef KERN_CUDA_PAGE_CUH
#define KERN_CUDA_PAGE_CUH

#include <stdint.h>

#include "kern_cuda_int.h"
#include "kern_cuda_ptx.cuh"

namespace kcuda
{

/* the K row chunk ch of row `row` of KV block `blk` (the KV head's elements start at kbase); its V
 * is a.v_offset elements further. R: the caller's row type (its index arithmetic is kept). */
template <typename T, int D, typename R>
__device__ __forceinline__ const T *kv_chunk(const FwdArgs &a, const T *kbase, uint32_t blk, R row,
                                             int ch)
{
    return kbase + (uint64_t)blk * a.block_stride + row * D + ch * 8;
}

/* K and V of one 16-byte chunk ch of row `row` of KV block `blk` (the KV head's elements start at
 * kbase) by cp.async into shared dk and dv; where !valid both are zero-filled and nothing is
 * read (fwd_cta's loads). The address is kv_chunk's, written out: calling kv_chunk here changed
 * fwd_layer's register allocation (d128: 229 -> 233 registers). fwd_pair's producer spells its
 * copies itself around kv_chunk: through this function it took 32 more instructions. */
template <typename T, int D, typename R>
__device__ __forceinline__ void copy_kv_chunk(const FwdArgs &a, const T *kbase, bool valid,
                                              uint32_t blk, R row, int ch, uint32_t dk, uint32_t dv)
{
    const T *ks = kbase, *vs = kbase;
    uint32_t bytes = 0;
    if (valid) {
        ks = kbase + (uint64_t)blk * a.block_stride + row * D + ch * 8; /* kv_chunk's */
        vs = ks + a.v_offset;
        bytes = 16;
    }
    cp_async16(dk, ks, bytes);
    cp_async16(dv, vs, bytes);
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
