/*
 * kern_cuda_xpack.cu — cross-session packing (kern.h's kern_lane_pack_*): a lane that runs one
 * layer of several sessions' steps as one forward over the union of their queries.
 *
 * A packed layer is four launches on the lane's one stream:
 *   pack_gate     one warp, a lane per member: spins on the members' ready words (host memory)
 *                 until every member still in has handed the layer over, or the window has passed
 *                 since the first did; the late ones leave the pack (in_mask, and out[] for the
 *                 caller, who runs the rest of their step alone), the ready ones are this layer's
 *                 `served` set;
 *   pack_gather   the served members' Q rows into the lane's union rows, their new K and V into
 *                 their pool slots (NaN and infinity stored as 0, as append_kernel does);
 *   the forward   attend_on over the union plan (and its merge launch);
 *   pack_scatter  the served members' O rows back to their staging; the last block to finish,
 *                 once every block's rows are visible, posts each served member's done word.
 * The gate waits on no member beyond the window once another is ready, and never on an excluded
 * one (kern_lane_pack_exclude: the CPU's word, read at every spin), so a stalled or dead member
 * costs the others at most one window, once per step.
 */
#include "kern_cuda_int.h"
#include "kern_cuda_ptx.cuh"

#include <errno.h>
#include <string.h>

namespace kcuda
{

struct PackMember {
    const uint8_t *q, *k, *v;
    uint8_t *o;
    uint64_t *ready, *done;
    uint64_t epoch;
    uint32_t row_off, n_tokens;
};

/* The packed step's device state: uploaded at begin, then the gate's and scatter's own words. */
struct PackDev {
    PackMember m[KERN_PACK_MAX];
    uint32_t n;
    uint32_t in_mask;     /* members still in the pack */
    uint32_t served;      /* this layer's (written by pack_gate) */
    uint32_t blocks_done; /* pack_scatter's arrivals; 0 between launches */
    uint64_t window_ns;
};

struct PackState {
    PackDev *dev;
    PackDev *host;         /* pinned: the upload's source */
    uint32_t *words_host;  /* mapped: out[KERN_PACK_MAX] then excl[KERN_PACK_MAX] */
    uint32_t *words_dev;   /* the same, as the device sees it */
    uint8_t *uq, *uo;      /* union rows: [row][q_head][head_dim] */
    uint64_t rows_cap;     /* rows uq and uo hold */
    uint32_t n_tokens;     /* of the packed step last begun */
    const uint32_t *slots; /* = the lane's slot buffer */
};

void pack_done(Lane *L)
{
    PackState *ps = L->pack;
    if (!ps)
        return;
    cudaFree(ps->dev);
    cudaFreeHost(ps->host);
    cudaFreeHost(ps->words_host);
    cudaFree(ps->uq);
    cudaFree(ps->uo);
    free(ps);
    L->pack = nullptr;
}

static int pack_init(Lane *L)
{
    PackState *ps = static_cast<PackState *>(calloc(1, sizeof(PackState)));
    if (!ps)
        return -ENOMEM;
    L->pack = ps;
    if (cudaMalloc(&ps->dev, sizeof(PackDev)) != cudaSuccess ||
        cudaMallocHost(&ps->host, sizeof(PackDev)) != cudaSuccess ||
        cudaHostAlloc(&ps->words_host, 2 * KERN_PACK_MAX * sizeof(uint32_t), cudaHostAllocMapped) !=
            cudaSuccess ||
        cudaHostGetDevicePointer(&ps->words_dev, ps->words_host, 0) != cudaSuccess) {
        cudaGetLastError();
        pack_done(L);
        return -ENOMEM;
    }
    memset(ps->words_host, 0, 2 * KERN_PACK_MAX * sizeof(uint32_t));
    L->base.pack_out = ps->words_host;
    L->base.pack_excl = ps->words_host + KERN_PACK_MAX;
    return 0;
}

/* Union rows for n tokens, grown stream-ordered (as partials_reserve). */
static int rows_reserve(Lane *L, uint64_t n)
{
    PackState *ps = L->pack;
    if (n <= ps->rows_cap)
        return 0;
    const kern_model_t &m = L->c->base.cfg.model;
    uint64_t cap = ps->rows_cap ? 2 * ps->rows_cap : 64;
    while (cap < n)
        cap *= 2;
    if (cap > L->c->base.cfg.max_tokens)
        cap = L->c->base.cfg.max_tokens;
    const uint64_t bytes = cap * m.q_heads * m.head_dim * kern_dtype_size(m.dtype); /* Q's */
    uint8_t *q, *o;
    if (cudaMallocAsync(&q, bytes, L->main) != cudaSuccess) {
        cudaGetLastError();
        return -ENOMEM;
    }
    if (cudaMallocAsync(&o, bytes, L->main) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeAsync(q, L->main);
        return -ENOMEM;
    }
    if (ps->uq)
        KC_TRY(cudaFreeAsync(ps->uq, L->main), "union rows");
    if (ps->uo)
        KC_TRY(cudaFreeAsync(ps->uo, L->main), "union rows");
    ps->uq = q;
    ps->uo = o;
    ps->rows_cap = cap;
    return 0;
}

/* kern_lane_trim: union rows past a decode's few go back */
void pack_trim(Lane *L)
{
    PackState *ps = L->pack;
    if (!ps || ps->rows_cap <= 256)
        return;
    cudaFreeAsync(ps->uq, L->main);
    cudaFreeAsync(ps->uo, L->main);
    ps->uq = ps->uo = nullptr;
    ps->rows_cap = 0;
}

static Lane *as_lane(kern_lane_t *l)
{
    return reinterpret_cast<Lane *>(l);
}

int cuda_pack_begin(kern_lane_t *l, const sched_plan_hdr_t *h, const uint32_t *slots, uint32_t n,
                    const kern_pack_member_t *m, uint32_t n_members, uint32_t window_us)
{
    Lane *L = as_lane(l);
    Cuda *c = L->c;
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    int r;
    if (!L->pack && (r = pack_init(L)) < 0)
        return r;
    PackState *ps = L->pack;
    if (n > c->base.cfg.max_tokens)
        return -E2BIG;
    if ((r = rows_reserve(L, n)) < 0 || (r = plan_upload(L, h)) < 0 ||
        (r = slots_upload(L, slots, n)) < 0)
        return r;
    /* the lane is free (its last step's work has finished): the host copy and the words are not
     * read by anything in flight */
    PackDev *pd = ps->host;
    memset(pd, 0, sizeof(*pd));
    for (uint32_t i = 0; i < n_members; i++)
        pd->m[i] = PackMember{static_cast<const uint8_t *>(m[i].q),
                              static_cast<const uint8_t *>(m[i].k),
                              static_cast<const uint8_t *>(m[i].v),
                              static_cast<uint8_t *>(m[i].o),
                              m[i].ready,
                              m[i].done,
                              m[i].epoch,
                              m[i].row_off,
                              m[i].n_tokens};
    pd->n = n_members;
    pd->in_mask = n_members == 32 ? ~0u : (1u << n_members) - 1;
    pd->window_ns = (uint64_t)window_us * 1000u;
    for (uint32_t i = 0; i < 2 * KERN_PACK_MAX; i++)
        __atomic_store_n(&ps->words_host[i], 0u, __ATOMIC_RELEASE);
    KC_TRY(cudaMemcpyAsync(ps->dev, pd, sizeof(*pd), cudaMemcpyHostToDevice, L->main),
           "pack upload");
    if ((r = cow_wait(L)) < 0)
        return r;
    ps->n_tokens = n;
    ps->slots = L->slot_dev;
    L->base.pack_members = n_members;
    return 0;
}

/* One warp; lane t watches member t. */
__global__ void pack_gate(PackDev *pd, uint32_t layer, uint32_t *out, const uint32_t *excl)
{
    const uint32_t t = threadIdx.x, n = pd->n;
    const bool in = t < n && ((pd->in_mask >> t) & 1u);
    const volatile uint64_t *rw = in ? pd->m[t].ready + layer : nullptr;
    const uint64_t epoch = in ? pd->m[t].epoch : 0, window = pd->window_ns;
    const volatile uint32_t *ex = excl + t;
    uint64_t t0 = 0;
    uint32_t act_mask, ready_mask;
    for (;;) {
        const bool act = in && *ex == 0;
        const bool rdy = act && *rw >= epoch;
        act_mask = __ballot_sync(0xffffffffu, act);
        ready_mask = __ballot_sync(0xffffffffu, rdy);
        if (ready_mask == act_mask)
            break;
        if (ready_mask) {
            const uint64_t now = globaltimer();
            if (!t0)
                t0 = now;
            else if (now - t0 >= window)
                break;
        }
        __nanosleep(64);
    }
    const uint32_t late = act_mask & ~ready_mask;
    if (t < n && ((late >> t) & 1u))
        *(volatile uint32_t *)(out + t) = layer + 1;
    const uint32_t gone = __ballot_sync(0xffffffffu, in && *ex != 0);
    if (t == 0) {
        pd->served = ready_mask;
        pd->in_mask &= ~(late | gone);
    }
    __threadfence_system();
}

__device__ __forceinline__ int member_of(const PackDev *pd, uint32_t row)
{
    for (uint32_t i = 0; i < pd->n; i++)
        if (row - pd->m[i].row_off < pd->m[i].n_tokens)
            return (int)i;
    return -1;
}

/* Every 16-byte chunk of the served rows: Q into the union rows, K and V into the pool. */
template <uint32_t E>
__global__ void pack_gather(const PackDev *__restrict__ pd, const uint32_t *__restrict__ slots,
                            uint32_t n_tok, uint8_t *__restrict__ uq, uint8_t *__restrict__ kv,
                            uint32_t q_chunks, uint32_t kv_heads, uint32_t d_chunks,
                            kern_layout_t lo)
{
    const uint32_t served = pd->served;
    const uint32_t kv_chunks = kv_heads * d_chunks, per_tok = q_chunks + 2 * kv_chunks;
    const uint64_t total = (uint64_t)n_tok * per_tok;
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < total;
         e += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(e / per_tok), ch = (uint32_t)(e % per_tok);
        const int mi = member_of(pd, t);
        if (mi < 0 || !((served >> mi) & 1u))
            continue;
        const PackMember &m = pd->m[mi];
        const uint32_t lt = t - m.row_off;
        if (ch < q_chunks) {
            *reinterpret_cast<uint4 *>(uq + ((uint64_t)t * q_chunks + ch) * 16) =
                *reinterpret_cast<const uint4 *>(m.q + ((uint64_t)lt * q_chunks + ch) * 16);
            continue;
        }
        const uint32_t c = ch - q_chunks, which = c / kv_chunks, h = (c / d_chunks) % kv_heads,
                       dc = c % d_chunks;
        const uint8_t *src =
            (which ? m.v : m.k) + (((uint64_t)lt * kv_heads + h) * d_chunks + dc) * 16;
        const uint32_t slot = slots[t], blk = slot / KERN_BLOCK_SIZE, off = slot % KERN_BLOCK_SIZE;
        uint8_t *dst = kv + kern_layout_at(&lo, 0, blk, which, h, off) * lo.elt + dc * 16u;
        *reinterpret_cast<uint4 *>(dst) = finite8<E>(*reinterpret_cast<const uint4 *>(src));
    }
}

/* The served rows' O back to their members; the last block posts the done words. */
__global__ void pack_scatter(PackDev *pd, const uint8_t *__restrict__ uo, uint32_t n_tok,
                             uint32_t q_chunks, uint32_t layer)
{
    __shared__ bool last;
    const uint32_t served = pd->served;
    const uint64_t total = (uint64_t)n_tok * q_chunks;
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < total;
         e += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(e / q_chunks), ch = (uint32_t)(e % q_chunks);
        const int mi = member_of(pd, t);
        if (mi < 0 || !((served >> mi) & 1u))
            continue;
        const PackMember &m = pd->m[mi];
        *reinterpret_cast<uint4 *>(m.o + ((uint64_t)(t - m.row_off) * q_chunks + ch) * 16) =
            *reinterpret_cast<const uint4 *>(uo + ((uint64_t)t * q_chunks + ch) * 16);
    }
    __threadfence(); /* this block's rows, before its arrival counts */
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&pd->blocks_done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence_system(); /* every block's rows, before any done word */
    const uint32_t i = threadIdx.x;
    if (i < pd->n && ((served >> i) & 1u))
        *(volatile uint64_t *)(pd->m[i].done + layer) = pd->m[i].epoch;
    if (i == 0)
        pd->blocks_done = 0;
}

static uint32_t grid_for(uint64_t items, uint32_t threads)
{
    const uint64_t want = (items + threads - 1) / threads;
    return (uint32_t)(want < 4096 ? (want ? want : 1) : 4096);
}

int cuda_pack_layer(kern_lane_t *l, uint32_t layer, const kern_attn_params_t *p, int report)
{
    Lane *L = as_lane(l);
    Cuda *c = L->c;
    PackState *ps = L->pack;
    const kern_model_t &m = c->base.cfg.model;
    if (!ps)
        return -EINVAL;
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    const kern_layout_t &lo = c->base.layout;
    /* Q and the clients' K and V rows are of the model's dtype (the pool's is lo.elt) */
    const uint32_t q_chunks = m.q_heads * m.head_dim * kern_dtype_size(m.dtype) / 16;
    const uint32_t d_chunks = m.head_dim * kern_dtype_size(m.dtype) / 16;
    const uint32_t n = ps->n_tokens;
    pack_gate<<<1, 32, 0, L->main>>>(ps->dev, layer, ps->words_dev, ps->words_dev + KERN_PACK_MAX);
    KC_TRY(cudaGetLastError(), "pack gate launch");
    uint8_t *kv = static_cast<uint8_t *>(c->pool) + kern_layout_at(&lo, layer, 0, 0, 0, 0) * lo.elt;
    const uint64_t items = (uint64_t)n * (q_chunks + 2 * m.kv_heads * d_chunks);
    if (c->dt == 0)
        pack_gather<F16_EXP><<<grid_for(items, 256), 256, 0, L->main>>>(
            ps->dev, ps->slots, n, ps->uq, kv, q_chunks, m.kv_heads, d_chunks, lo);
    else
        pack_gather<BF16_EXP><<<grid_for(items, 256), 256, 0, L->main>>>(
            ps->dev, ps->slots, n, ps->uq, kv, q_chunks, m.kv_heads, d_chunks, lo);
    KC_TRY(cudaGetLastError(), "pack gather launch");
    int r =
        attend_on(L, layer, reinterpret_cast<const sched_plan_hdr_t *>(L->last), ps->uq, ps->uo, p);
    if (r < 0)
        return r;
    /* the scatter's last block posts: at least KERN_PACK_MAX threads in it */
    pack_scatter<<<grid_for((uint64_t)n * q_chunks, 256), 256, 0, L->main>>>(ps->dev, ps->uo, n,
                                                                             q_chunks, layer);
    KC_TRY(cudaGetLastError(), "pack scatter launch");
    L->base.enqueued++;
    if (report)
        KC_TRY_CU(c->write64(reinterpret_cast<CUstream>(L->main),
                             reinterpret_cast<CUdeviceptr>(L->progress_dev), L->base.enqueued,
                             CU_STREAM_WRITE_VALUE_DEFAULT),
                  "progress");
    return 0;
}

} // namespace kcuda
