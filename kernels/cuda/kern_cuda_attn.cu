/*
 * kern_cuda_attn.cu — a plan on the GPU: its upload (checked, double-buffered, skipped when the
 * plan is unchanged) and one launch per layer of the forward kernel over every CTA and KV head,
 * followed by a merge launch when the plan splits tokens (or, KERN_MERGE_INSIDE, the merge inside
 * the forward: kern_cuda_fwd.cuh). No side streams: every tile shape runs in the one launch.
 */
#include "kern_cuda_int.h"

#include <errno.h>
#include <string.h>

namespace kcuda
{

/* KV tiles the pair kernel runs for a segment (one for an empty one) */
static uint32_t seg_tiles(const sched_plan_seg_t &g)
{
    const uint32_t len = g.kv_end - g.kv_begin;
    return len ? (len + KCUDA_TILE_N - 1) / KCUDA_TILE_N : 1;
}

/* Prepares the device copy dst of h (same layout) and returns how many of its CTAs have more than
 * KCUDA_SMALL_M rows:
 *  - those CTAs first, then the others, each run in plan order (longest first): fwd_pair numbers
 *    its work items without gaps from that order (ws_ref: a big CTA is an item per KV head, a
 *    small one an item per two). Nothing else names a CTA by its index: rows, segments and merges
 *    are reached through the CTA's own fields. Putting the plan's first CTA's mode first instead
 *    measured 1.7 % slower on the PAT trees (H100, 2026-11-26);
 *  - each CTA's tile count in its `reserved` word (fwd_pair's producer reads it there instead of
 *    walking the segments);
 *  - the segments in the order the pair kernel runs best: in a CTA of more than KCUDA_SMALL_M rows
 *    each consumer warpgroup owns 64 rows and skips the tiles none of its rows reads
 *    (kern_cuda_fwd_ws.cuh), so the segments both halves read come first, then those of one half
 *    only, alternating between the halves by tiles so far: the two consumers then compute their
 *    own leaves at the same time instead of one after the other (a prefix tree's DFS order lists
 *    every leaf of the first half before the second's). The plan's meaning does not depend on the
 *    order of its CTAs or of a CTA's segments (sched_plan_fmt.h). */
static uint32_t prepare_copy(const sched_plan_hdr_t *h, sched_plan_hdr_t *dst)
{
    const sched_plan_cta_t *ct = sched_plan_ctas(h);
    const sched_plan_seg_t *src = sched_plan_segs(h);
    sched_plan_seg_t *out =
        reinterpret_cast<sched_plan_seg_t *>(reinterpret_cast<uint8_t *>(dst) + h->off_segs);
    sched_plan_cta_t *cout =
        reinterpret_cast<sched_plan_cta_t *>(reinterpret_cast<uint8_t *>(dst) + h->off_ctas);
    const uint32_t half = KCUDA_SMALL_M / h->group; /* rows (query tokens) of consumer 0 */
    auto small = [&](uint32_t i) { return ct[i].row_count * h->group <= KCUDA_SMALL_M; };
    uint32_t n_big = 0, at = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < h->n_ctas; i++) {
            if (small(i) != (pass == 1))
                continue;
            n_big += !small(i);
            sched_plan_cta_t &d = cout[at++];
            d = ct[i];
            d.reserved = 0;
            for (uint32_t k = 0; k < d.seg_count; k++)
                d.reserved += seg_tiles(src[d.seg_begin + k]);
        }
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        const sched_plan_cta_t &c = ct[i];
        if (small(i) || c.seg_count < 3)
            continue;
        const sched_plan_seg_t *sg = src + c.seg_begin;
        sched_plan_seg_t *o = out + c.seg_begin;
        uint32_t n = 0;
        for (uint32_t k = 0; k < c.seg_count; k++)
            if (sg[k].row_lo < half && sg[k].row_hi > half)
                o[n++] = sg[k];
        uint32_t k0 = 0, k1 = 0, tiles0 = 0, tiles1 = 0;
        for (;;) {
            while (k0 < c.seg_count && sg[k0].row_hi > half)
                k0++; /* the next segment of half 0 only */
            while (k1 < c.seg_count && sg[k1].row_lo < half)
                k1++; /* of half 1 only */
            if (k0 == c.seg_count && k1 == c.seg_count)
                break;
            if (k1 == c.seg_count || (k0 < c.seg_count && tiles0 <= tiles1)) {
                tiles0 += seg_tiles(sg[k0]);
                o[n++] = sg[k0++];
            } else {
                tiles1 += seg_tiles(sg[k1]);
                o[n++] = sg[k1++];
            }
        }
    }
    return n_big;
}

/* Checks the plan (kern__plan_check, then what only this backend needs: rows per CTA within the
 * largest compiled m) and uploads it when it changed. Called by the lane's owner only. */
int plan_upload(Lane *L, const sched_plan_hdr_t *h)
{
    Cuda *c = L->c;
    if (L->last_len == h->total_bytes && memcmp(L->last, h, h->total_bytes) == 0)
        return 0;
    if (h->total_bytes > c->base.cfg.max_plan_bytes)
        return -E2BIG;
    if (h->max_cta_rows > c->max_m)
        return -E2BIG;
    int r = kern__plan_check(&c->base.cfg, h, L->check);
    if (r < 0)
        return r;
    const sched_plan_cta_t *ct = sched_plan_ctas(h);
    for (uint32_t i = 0; i < h->n_ctas; i++)
        if (ct[i].row_count * h->group > c->max_m)
            return -E2BIG;
    if ((uint64_t)h->n_ctas * c->base.cfg.model.kv_heads > INT32_MAX)
        return -E2BIG; /* grid.x */
    const int next = L->cur ^ 1;
    PlanBuf *pb = &L->plan[next];
    if (pb->used)
        KC_TRY(cudaEventSynchronize(pb->copied), "plan buffer");
    memcpy(pb->host, h, h->total_bytes);
    pb->n_big = prepare_copy(h, reinterpret_cast<sched_plan_hdr_t *>(pb->host));
    KC_TRY(cudaMemcpyAsync(pb->dev, pb->host, h->total_bytes, cudaMemcpyHostToDevice, L->main),
           "plan upload");
    KC_TRY(cudaEventRecord(pb->copied, L->main), "plan event");
    pb->used = true;
    L->cur = next;
    memcpy(L->last, h, h->total_bytes);
    L->last_len = h->total_bytes;
    return 0;
}

/* Enqueues one layer of the plan last uploaded to L: one launch. */
int attend_on(Lane *L, uint32_t layer, const sched_plan_hdr_t *h, const void *q, void *o,
              const kern_attn_params_t *p)
{
    Cuda *c = L->c;
    const kern_model_t &m = c->base.cfg.model;
    if (h->n_ctas == 0)
        return 0;
    const uint8_t *dp = L->plan[L->cur].dev;
    FwdArgs a;
    memcpy(&a.kv_map, c->kv_map, sizeof(a.kv_map));
    a.tma = c->tma;
    a.tma_block0 = layer * c->base.cfg.n_blocks;
    a.ctas = reinterpret_cast<const sched_plan_cta_t *>(dp + h->off_ctas);
    a.rows = reinterpret_cast<const sched_plan_row_t *>(dp + h->off_rows);
    a.pages = reinterpret_cast<const uint32_t *>(dp + h->off_pages);
    a.segs = reinterpret_cast<const sched_plan_seg_t *>(dp + h->off_segs);
    a.merges = reinterpret_cast<const sched_plan_merge_t *>(dp + h->off_merges);
    a.q = q;
    a.o = o;
    a.kv = static_cast<const uint8_t *>(c->pool) + layer * c->layer_elems * c->elt;
    a.block_stride = c->block_elems;
    a.head_stride = (uint64_t)m.block_size * m.head_dim;
    a.v_offset = a.head_stride * m.kv_heads;
    a.part_o = L->part_o;
    a.part_lse = L->part_lse;
    a.arrivals = L->arrivals;
    a.work = L->work;
    a.n_ctas = h->n_ctas;
    a.n_big = L->plan[L->cur].n_big;
    a.q_heads = m.q_heads;
    a.kv_heads = m.kv_heads;
    a.group = h->group;
    a.scale = p->scale;
    a.softcap = p->softcap;
    a.merge_inside = c->base.cfg.merge == KERN_MERGE_INSIDE;
    void *args[] = {&a};
    /* KERN_FWD_AUTO on sm_90a: the warp-specialized kernel, but for plans whose CTAs are all of
     * at most KCUDA_WS_MIN_ROWS rows (unshared decode): its 64-row products would be mostly
     * padding, and the 4-warp kernels measured faster there (RESULTS.md, 2026-11-25) */
    if (h->max_cta_rows > KCUDA_SMALL_M ||
        (c->fwd.pair_fn && h->max_cta_rows > KCUDA_WS_MIN_ROWS)) {
        const uint32_t items = ws_items(a);
        KC_TRY(cudaLaunchKernel(c->fwd.pair_fn, dim3(items < c->n_sms ? items : c->n_sms),
                                dim3(KCUDA_PAIR_THREADS), args, (size_t)c->fwd.pair_smem, L->main),
               "forward launch (pair)");
    } else
        KC_TRY(cudaLaunchKernel(c->fwd.fn, dim3(h->n_ctas * m.kv_heads), dim3(KCUDA_THREADS), args,
                                (size_t)c->fwd.smem, L->main),
               "forward launch");
    if (!a.merge_inside && h->n_merges)
        KC_TRY(cudaLaunchKernel(c->fwd.merge_fn, dim3(h->n_merges * m.kv_heads), dim3(128), args, 0,
                                L->main),
               "merge launch");
    return 0;
}

int cuda_attend(kern_backend_t *b, uint32_t layer, const sched_plan_hdr_t *h, const void *q,
                void *o, const kern_attn_params_t *p)
{
    Cuda *c = as_cuda(b);
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    int r = plan_upload(&c->lane0, h);
    return r < 0 ? r : attend_on(&c->lane0, layer, h, q, o, p);
}

int cuda_sync(kern_backend_t *b)
{
    Cuda *c = as_cuda(b);
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    KC_TRY(cudaStreamSynchronize(c->lane0.main), "sync");
    return 0;
}

} // namespace kcuda
