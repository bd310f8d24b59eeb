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
        /* freed with the lane: cudaFreeHost waits for the whole device, and this runs on the
         * thread that releases other lanes' waits (patd_lanes.c) */
        L->retired[L->n_retired++] = host;
        return -ENOMEM;
    }
    KC_TRY(cudaFreeAsync(pb->tl_dev, L->main), "tile buffer");
    L->retired[L->n_retired++] = pb->tl_host;
    pb->tl_host = host;
    pb->tl_dev = dev;
    pb->tl_cap = (uint32_t)cap;
    return 0;
}

/* Room for n partials on the lane: a plan that splits more tokens than any before on this lane
 * doubles its partials, stream-ordered (the old ones are freed after the work queued before,
 * the new ones serve what is queued after), so no call waits for the device. */
static int partials_reserve(Lane *L, uint32_t n)
{
    if (n <= L->part_cap)
        return 0;
    const kern_config_t *cfg = &L->c->base.cfg;
    const uint32_t max_part = cfg->max_partials ? cfg->max_partials : 1;
    if (n > max_part)
        return -E2BIG;
    uint64_t cap = 2ull * L->part_cap;
    while (cap < n)
        cap *= 2;
    if (cap > max_part)
        cap = max_part;
    const uint64_t slots = cap * cfg->model.q_heads;
    float *po, *pl;
    if (cudaMallocAsync(&po, slots * cfg->model.head_dim * sizeof(float), L->main) != cudaSuccess) {
        cudaGetLastError();
        return -ENOMEM;
    }
    if (cudaMallocAsync(&pl, slots * sizeof(float), L->main) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeAsync(po, L->main);
        return -ENOMEM;
    }
    KC_TRY(cudaFreeAsync(L->part_o, L->main), "partials");
    KC_TRY(cudaFreeAsync(L->part_lse, L->main), "partials");
    L->part_o = po;
    L->part_lse = pl;
    L->part_cap = (uint32_t)cap;
    return 0;
}

/* kern_lane_trim: partials back to LANE_PARTIALS_START (stream-ordered, as partials_reserve);
 * the next upload is a full one, so that partials_reserve sees its plan again. Errors leave the
 * lane as it was. */
void cuda_lane_trim(kern_lane_t *l)
{
    Lane *L = reinterpret_cast<Lane *>(l);
    const kern_config_t *cfg = &L->c->base.cfg;
    if (cudaSetDevice(L->c->device) != cudaSuccess)
        return;
    pack_trim(L);
    if (L->part_cap <= LANE_PARTIALS_START)
        return;
    const uint64_t slots = (uint64_t)LANE_PARTIALS_START * cfg->model.q_heads;
    float *po, *pl;
    if (cudaMallocAsync(&po, slots * cfg->model.head_dim * sizeof(float), L->main) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (cudaMallocAsync(&pl, slots * sizeof(float), L->main) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeAsync(po, L->main);
        return;
    }
    cudaFreeAsync(L->part_o, L->main);
    cudaFreeAsync(L->part_lse, L->main);
    L->part_o = po;
    L->part_lse = pl;
    L->part_cap = LANE_PARTIALS_START;
    L->last_len = 0;
}

/* the launch attend_on makes for h runs fwd_pair (which reads the tiles); a batch-invariant plan
 * always where the pair kernel exists, whatever its CTAs' rows (a row's arithmetic is its
 * consumer's, the same in every CTA; in fwd_layer it depends on the tile m) */
static bool runs_pair(const Cuda *c, const sched_plan_hdr_t *h)
{
    return c->fwd.pair_fn &&
           (h->max_cta_rows > KCUDA_WS_MIN_ROWS || (h->flags & SCHED_PLAN_INVARIANT));
}

/* Checks the plan (kern__plan_check, then what only this backend needs: rows per CTA within the
 * largest compiled m) and uploads it when it changed. Called by the lane's owner only. */
int plan_upload(Lane *L, const sched_plan_hdr_t *h)
{
    Cuda *c = L->c;
    if (L->last_len == h->total_bytes && memcmp(L->last, h, h->total_bytes) == 0)
        return 0; /* its partials fit: they did for this plan */
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
    if ((r = partials_reserve(L, h->n_partials)) < 0)
        return r;
    const int next = L->cur ^ 1;
    PlanBuf *pb = &L->plan[next];
    if (pb->used)
        KC_TRY(cudaEventSynchronize(pb->copied), "plan buffer");
    /* the device plan: the plan with its CTAs lowered (kcuda_cta_t, the same size) */
    memcpy(pb->host, h, h->total_bytes);
    kcuda_cta_t *dcta = reinterpret_cast<kcuda_cta_t *>(pb->host + h->off_ctas);
    uint64_t n_tiles;
    pb->n_big = kcuda_pack_prepare(h, dcta, &n_tiles);
    const bool pair = runs_pair(c, h);
    r = pair ? tiles_reserve(L, pb, n_tiles) : 0;
    if (r < 0)
        return r;
    if (pair && n_tiles) {
        kcuda_pack_fill(h, dcta, pb->tl_host);
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

/* A forward or merge launch: where c->pdl, as a programmatic dependent of the kernel before it on
 * the stream (the forward's: the layer's KV append; the merge's: the forward), so that its blocks
 * are placed and set up while that kernel runs; each waits for it on the GPU before reading
 * anything (dep_wait). fwd_pair lets its dependent start once every block's producer has found
 * no item left (dep_launch_dependents): the merge's blocks are placed on each SM as the forward's
 * leave it, with no launch gap; fwd_layer lets it start at once (the merge's blocks then wait
 * beside its last wave). */
static cudaError_t launch_dep(const Cuda *c, const void *fn, uint32_t grid, uint32_t threads,
                              void **args, size_t smem, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    return cudaLaunchKernelExC(&cfg, fn, args);
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
    a.ctas = reinterpret_cast<const kcuda_cta_t *>(dp + h->off_ctas);
    a.rows = reinterpret_cast<const sched_plan_row_t *>(dp + h->off_rows);
    a.pages = reinterpret_cast<const uint32_t *>(dp + h->off_pages);
    a.segs = reinterpret_cast<const sched_plan_seg_t *>(dp + h->off_segs);
    a.merges = reinterpret_cast<const sched_plan_merge_t *>(dp + h->off_merges);
    a.tiles = L->plan[L->cur].tl_dev;
    a.q = q;
    a.o = o;
    const kern_layout_t &lo = c->base.layout;
    a.kv = static_cast<const uint8_t *>(c->pool) + kern_layout_at(&lo, layer, 0, 0, 0, 0) * lo.elt;
    a.block_stride = lo.block;
    a.head_stride = lo.head;
    a.v_offset = lo.kv;
    a.part_o = L->part_o;
    a.part_lse = L->part_lse;
    a.arrivals = L->arrivals;
    a.work = L->work;
    a.n_ctas = h->n_ctas;
    a.n_big = L->plan[L->cur].n_big;
    a.q_heads = m.q_heads;
    a.kv_heads = m.kv_heads;
    a.group = h->group;
    const float ks = kern_kv_scale(&m); /* 1 but for an fp8 pool: K's into S, V's into O */
    a.scale = p->scale * ks;
    a.v_scale = ks;
    a.softcap = p->softcap;
    a.merge_inside = c->base.cfg.merge == KERN_MERGE_INSIDE;
    a.invariant = (h->flags & SCHED_PLAN_INVARIANT) != 0;
    void *args[] = {&a};
    /* KERN_FWD_AUTO on sm_90a: the warp-specialized kernel for every plan with a CTA of more
     * than KCUDA_WS_MIN_ROWS rows (runs_pair); plans whose CTAs are all of at most that many
     * (unshared decode) run on the 4-warp kernels: the 64-row products would be mostly padding,
     * and the 4-warp kernels measured faster there (tests/bench/log/2026-11-25-ws-forward.md) */
    if (runs_pair(c, h)) {
        const uint32_t items = ws_items(a);
        KC_TRY(launch_dep(c, c->fwd.pair_fn, items < c->n_sms ? items : c->n_sms,
                          KCUDA_PAIR_THREADS, args, (size_t)c->fwd.pair_smem, L->main),
               "forward launch (pair)");
    } else
        KC_TRY(launch_dep(c, c->fwd.fn, h->n_ctas * m.kv_heads, KCUDA_THREADS, args,
                          (size_t)c->fwd.smem, L->main),
               "forward launch");
    if (!a.merge_inside && h->n_merges)
        KC_TRY(launch_dep(c, c->fwd.merge_fn, h->n_merges * m.kv_heads, 128, args, 0, L->main),
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
