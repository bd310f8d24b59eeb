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

/* pages of a segment: fwd_pair's chunks (none for an empty one) */
static uint32_t seg_chunks(const sched_plan_seg_t &g)
{
    return g.kv_end > g.kv_begin ? (g.kv_end - 1) / KERN_BLOCK_SIZE - g.kv_begin / KERN_BLOCK_SIZE + 1
                                 : 0;
}

/* fwd_pair's chunk class of a segment of a CTA: 0 read by both consumers' rows (or the CTA is
 * small: one consumer per KV head reads all), 1 by consumer 0's only (q-head rows 0..63), 2 by
 * consumer 1's only */
static int seg_class(const sched_plan_seg_t &g, bool small, uint32_t group)
{
    if (small)
        return 0;
    if (g.row_hi * group <= KCUDA_SMALL_M)
        return 1;
    return g.row_lo * group >= KCUDA_SMALL_M ? 2 : 0;
}

/* Prepares the device copy dst of h (same layout; its CTAs already copied) and returns how many
 * of its CTAs have more than KCUDA_SMALL_M rows:
 *  - those CTAs first, then the others, each run in plan order (longest first): fwd_pair numbers
 *    its work items without gaps from that order (ws_ref: a big CTA is an item per KV head, a
 *    small one an item per two). Nothing else names a CTA by its index: rows, segments and merges
 *    are reached through the CTA's own fields. Putting the plan's first CTA's mode first instead
 *    measured 1.7 % slower on the PAT trees (H100, 2026-11-26);
 *  - fwd_pair's tiles of each CTA: its tile count in `reserved`, the index of its first tile in
 *    `pack` (fill_tiles writes them); *n_tiles = the plan's total. The plan's meaning does not
 *    depend on the order of its CTAs (sched_plan_fmt.h). */
static uint32_t prepare_copy(const sched_plan_hdr_t *h, sched_plan_hdr_t *dst, uint64_t *n_tiles)
{
    const sched_plan_cta_t *ct = sched_plan_ctas(h);
    const sched_plan_seg_t *src = sched_plan_segs(h);
    sched_plan_cta_t *cout =
        reinterpret_cast<sched_plan_cta_t *>(reinterpret_cast<uint8_t *>(dst) + h->off_ctas);
    auto small = [&](uint32_t i) { return ct[i].row_count * h->group <= KCUDA_SMALL_M; };
    uint32_t n_big = 0, at = 0;
    uint64_t tiles = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < h->n_ctas; i++) {
            if (small(i) != (pass == 1))
                continue;
            n_big += !small(i);
            sched_plan_cta_t &d = cout[at++];
            d = ct[i];
            uint64_t n[3] = {0, 0, 0};
            for (uint32_t k = 0; k < d.seg_count; k++) {
                const sched_plan_seg_t &g = src[d.seg_begin + k];
                n[seg_class(g, small(i), h->group)] += seg_chunks(g);
            }
            const uint64_t t = (n[0] + 3) / 4 + (n[1] + 3) / 4 + (n[2] + 3) / 4;
            d.reserved = (uint32_t)(t > UINT32_MAX ? UINT32_MAX : t);
            d.pack = (uint32_t)(tiles > UINT32_MAX ? UINT32_MAX : tiles);
            tiles += t;
        }
    *n_tiles = tiles;
    return n_big;
}

/* Writes the tiles of the device copy dst's CTAs (prepare_copy counted them) to out: each class
 * of chunks (seg_class) packed four to a tile in segment order, the chunks read by both consumers
 * first, then the tiles of consumer 0's and consumer 1's alternating, so that the two compute
 * their own rows' leaves at the same time (a prefix tree's DFS order lists every leaf of the
 * first half before the second's, and a consumer skips the tiles none of its rows reads). */
static void fill_tiles(const sched_plan_hdr_t *h, const sched_plan_hdr_t *dst, WsTile *out)
{
    const sched_plan_cta_t *cd = sched_plan_ctas(dst);
    const sched_plan_seg_t *src = sched_plan_segs(h);
    const uint32_t *pages = sched_plan_pages(h);
    const uint32_t group = h->group, bs = KERN_BLOCK_SIZE;
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        const sched_plan_cta_t &c = cd[i];
        const bool small = c.row_count * h->group <= KCUDA_SMALL_M;
        WsTile *t = out + c.pack;
        for (uint32_t k = 0; k < c.reserved; k++) {
            memset(&t[k], 0, sizeof(t[k]));
            for (int e = 0; e < 4; e++)
                t[k].blk[e] = WS_NO_BLOCK;
        }
        uint32_t n[3] = {0, 0, 0};
        for (uint32_t k = 0; k < c.seg_count; k++) {
            const sched_plan_seg_t &g = src[c.seg_begin + k];
            n[seg_class(g, small, h->group)] += seg_chunks(g);
        }
        const uint32_t tb = (n[0] + 3) / 4, t0 = (n[1] + 3) / 4, t1 = (n[2] + 3) / 4;
        uint32_t j[3] = {0, 0, 0};
        for (uint32_t k = 0; k < c.seg_count; k++) {
            const sched_plan_seg_t &g = src[c.seg_begin + k];
            const int cl = seg_class(g, small, h->group);
            const uint32_t p0 = g.kv_begin / bs, nc = seg_chunks(g);
            for (uint32_t q = 0; q < nc; q++, j[cl]++) {
                const uint32_t x = j[cl] / 4;
                const uint32_t ti = cl == 0   ? x
                                    : cl == 1 ? tb + x + (x < t1 ? x : t1)
                                              : tb + (x + 1 < t0 ? x + 1 : t0) + x;
                const uint32_t pos = (p0 + q) * bs;
                const uint32_t lo = (g.kv_begin > pos ? g.kv_begin : pos) - pos;
                const uint32_t hi = (g.kv_end < pos + bs ? g.kv_end : pos + bs) - pos;
                const int e = (int)(j[cl] % 4);
                t[ti].blk[e] = pages[g.page_begin + q];
                t[ti].pos[e] = pos;
                t[ti].rng[e] = lo | hi << 8 | (uint32_t)g.row_lo << 16 | (uint32_t)g.row_hi << 24;
            }
        }
        for (uint32_t k = 0; k < c.reserved; k++) {
            bool whole = true;
            for (int e = 0; e < 4; e++) {
                const uint32_t rg = t[k].rng[e], lo = rg & 0xffu, hi = (rg >> 8) & 0xffu;
                const uint32_t rlo = (rg >> 16) & 0xffu, rhi = rg >> 24;
                whole = whole && lo == 0 && hi == bs && rg >> 16 == t[k].rng[0] >> 16;
                if (hi > lo)
                    for (uint32_t half = 0; half < 2; half++)
                        if (rlo * group < KCUDA_SMALL_M * (half + 1) &&
                            rhi * group > KCUDA_SMALL_M * half)
                            t[k].live |= 1u << half;
                if (hi > lo && t[k].pos[e] + bs > t[k].whole)
                    t[k].whole = t[k].pos[e] + bs;
            }
            if (!whole)
                t[k].whole = 0;
            if (k)
                t[k - 1].next = t[k].live;
        }
    }
}

/* Grows pb's tile buffers to hold n tiles, never waiting for the device: a launch may still read
 * the device buffer (freed in stream order) and an upload the pinned one (kept until the lane
 * ends: a free of pinned memory waits for the whole device, every other client's queued work
 * included). Lanes start with room for WS_TILES_START tiles; past it a buffer doubles, which
 * happens when a plan needs more tiles than any before it. */
static int tiles_reserve(Lane *L, PlanBuf *pb, uint64_t n)
{
    if (n <= pb->tl_cap)
        return 0;
    /* a plan's chunks are its segments' pages; bounded by the plan's size as the pages are (a
     * plan may name the same pages from several segments, but not without bound) */
    if (n > L->c->base.cfg.max_plan_bytes / 4 || L->n_retired == WS_RETIRED_MAX)
        return -E2BIG;
    uint64_t cap = 2 * (uint64_t)pb->tl_cap;
    while (cap < n)
        cap *= 2;
    WsTile *host, *dev;
    if (cudaMallocHost(&host, cap * sizeof(WsTile)) != cudaSuccess) {
        cudaGetLastError();
        return -ENOMEM;
    }
    if (cudaMallocAsync(&dev, cap * sizeof(WsTile), L->main) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeHost(host);
        return -ENOMEM;
    }
    KC_TRY(cudaFreeAsync(pb->tl_dev, L->main), "tile buffer");
    L->retired[L->n_retired++] = pb->tl_host;
    pb->tl_host = host;
    pb->tl_dev = dev;
    pb->tl_cap = (uint32_t)cap;
    return 0;
}

/* the launch attend_on makes for h runs fwd_pair (which reads the tiles) */
static bool runs_pair(const Cuda *c, const sched_plan_hdr_t *h)
{
    return c->fwd.pair_fn && h->max_cta_rows > KCUDA_WS_MIN_ROWS;
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
    sched_plan_hdr_t *dst = reinterpret_cast<sched_plan_hdr_t *>(pb->host);
    uint64_t n_tiles;
    pb->n_big = prepare_copy(h, dst, &n_tiles);
    const bool pair = runs_pair(c, h);
    r = pair ? tiles_reserve(L, pb, n_tiles) : 0;
    if (r < 0)
        return r;
    if (pair && n_tiles) {
        fill_tiles(h, dst, pb->tl_host);
        KC_TRY(cudaMemcpyAsync(pb->tl_dev, pb->tl_host, n_tiles * sizeof(WsTile),
                               cudaMemcpyHostToDevice, L->main),
               "tile upload");
    }
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
    a.tiles = L->plan[L->cur].tl_dev;
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
    if (runs_pair(c, h)) { /* every plan with a CTA of more than KCUDA_SMALL_M rows (max_m) */
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
