/*
 * kern_cuda_fwd_ws.cuh — the warp-specialized Hopper forward, fwd_pair (sm_90a, head_dim <= 128,
 * KERN_FWD_AUTO, KERN_FWD_TMA). Included by kern_cuda_fwd.cuh after the shared pieces (loads,
 * softmax, outputs, merge); one kernel per (dtype, head_dim) like fwd_layer.
 *
 * Persistent: at most one block per SM (its shared memory fills one), each running work items
 * until none is left. An item is a CTA for one KV head (big mode) or two (small mode), numbered
 * without gaps (ws_ref); the producer takes them in order (big mode's CTAs, then small mode's, each
 * longest first) from a counter per launch (FwdArgs.work, which the last block out sets back to 0),
 * so the next item's Q and first tiles load while the consumers finish the current one and write
 * its outputs, instead of every CTA paying its own fill and drain (6.4 us an item against 2.0 a
 * tile, tile solver, H100: tests/bench/log/2026-11-25-ws-persistent.md).
 *
 * A KV tile is four chunks, each a page (KERN_BLOCK_SIZE tokens) of one of the CTA's segments:
 * plan_upload lists every CTA's tiles (WsTile), packing its short segments together, so a TREE
 * CTA's 32-token leaves take half a tile each instead of a whole one, and the kernel walks no
 * segment: a tile's record names its blocks, their positions, their valid rows and readers.
 *
 * A block is three warpgroups and a ring of shared-memory slots. Warpgroup 0 is the producer: it
 * gives most of its registers away (setmaxnreg) and, item after item, gathers the item's Q into
 * one slot by 16-byte cp.async and then every KV tile into the next ones: by 16-byte cp.async,
 * rows outside a chunk's range zero-filled, or (KERN_FWD_TMA) by the tensor memory accelerator
 * (one box per chunk, K and V, 64 columns each, issued by thread 0, the slot's barrier counting
 * their bytes; a chunk's rows outside its range are masked, and finite: the pool is zeroed at
 * create and appends store NaN and infinity as 0; the rows of no chunk are zero-filled). TMA
 * measured 1-3 % slower than cp.async against PAT in the same call on the H100 and the H200
 * (tests/bench/log/2026-11-25-tile-skip-cpasync.md). A full mbarrier per slot tells the consumers
 * it is in (cp.async.mbarrier.arrive: no thread waits for its own copies; the producer's thread 0
 * also arrives, a release of the words it wrote beside the slot: an item's id and tile count beside
 * its Q, a tile's chunks beside its K and V). Warpgroups 1 and 2 are the consumers: each owns 64
 * rows, takes its Q rows into registers and frees the Q slot at once (so an item of any length
 * streams through the ring), then issues only wgmma (Q.K^T with Q from registers, P.V) and the
 * softmax; when done with a slot its threads arrive on the slot's empty mbarrier, on which the
 * producer waits before refilling.
 *
 * Two modes, by the CTA's rows:
 *   big   (more than KCUDA_SMALL_M rows): KV head j; consumer c has rows 64c..64c+63; one KV tile
 *         per stage, one slot read by both;
 *   small (up to KCUDA_SMALL_M rows): KV heads 2j and 2j + 1, consumer c the CTA's rows for head
 *         2j + c (where 2j + 1 == kv_heads consumer 1 runs masked rows and writes nothing); a
 *         stage is two consecutive slots, the tile of each head.
 *
 * Each consumer overlaps its softmax with the tensor cores: while O += P_j.V_j runs, S_{j+1} =
 * Q.K_{j+1}^T has already been issued before it and its softmax runs under P_j.V_j; O is rescaled
 * once P_j.V_j is done (FlashAttention-3's intra-warpgroup pipelining). Every consumer waits for
 * every stage to fill before it releases it, also when its rows read none of the tile (band
 * skip), so no arrival can count toward a later phase of an empty barrier.
 */
#ifndef KERN_CUDA_FWD_WS_CUH
#define KERN_CUDA_FWD_WS_CUH

#include "kern_cuda_page.cuh"    /* kv_chunk */
#include "kern_cuda_softmax.cuh" /* RowSoftmax */

namespace kcuda
{

/* What a timing ablation of fwd_pair leaves out. The kernel is WS_FULL; only tests/gpu/ablate.sh's
 * builds instantiate the others (kern_cuda_fwd_ablate.cuh), whose results are wrong by design. */
enum WsAblate : int {
    WS_FULL = 0,
    /* the consumers compute and write nothing: every tile only waited for and released (the load
     * pipeline alone) */
    WS_NO_PRODUCTS = 1,
    WS_NO_KV =
        2, /* the producer loads no KV tiles (the products alone, on whatever the ring holds) */
    WS_NO_Q = 3, /* the producer gathers no Q */
    /* the consumers take no exponentials: p is the exponent itself (what the SFU's 2^x costs) */
    WS_NO_EXP = 4,
};
/* an item of at most this many tiles has its producer fetch the next item's id at once
 * (ws_produce) */
constexpr int WS_EARLY_TILES = 8;

/* The words beside a ring slot, written by the producer's thread 0 before its arrival on the
 * slot's full barrier (a release: the consumers read them once the slot is in). */
struct WsQWords {                  /* beside an item's Q */
    uint32_t item;                 /* the item id; WS_END ends the consumers' loop */
    uint32_t n_tiles;              /* the CTA's tiles */
    uint32_t row_begin, row_count; /* the CTA's (the consumers' first global read saved) */
    uint32_t live0;                /* the first tile's live bits */
};
struct WsTileWords { /* beside a KV tile's, from its WsTile */
    uint32_t pos[4], rng[4], whole, next;
};
union WsWords {
    WsQWords q;
    WsTileWords t;
    uint32_t pad[16];
};

/* fwd_pair's shared memory after the ring */
struct WsMeta {
    /* slot s's full mbarrier bar[s], its empty one bar[SLOTS + s] and (an fp8 pool) its raw one
     * bar[2 SLOTS + s]: the producer's copies of an fp8 tile landed, to be decoded */
    uint64_t bar[24];
    WsWords words[8];  /* beside slot s */
    MergeList list[2]; /* fwd_arrive_merge's, one per consumer */
    uint32_t bcast;    /* the producer's thread 0's fetch of the next item, to its other threads */
    uint32_t pad[3];
};
static_assert(sizeof(WsWords) == 64 && offsetof(WsMeta, words) == 24 * 8 &&
                  offsetof(WsMeta, list) == 24 * 8 + 8 * 64 &&
                  offsetof(WsMeta, bcast) == 24 * 8 + 8 * 64 + 2 * 4 * (KCUDA_MAX_M + 1) &&
                  sizeof(WsMeta) == offsetof(WsMeta, bcast) + 16,
              "fwd_pair's byte layout, on which its slot count and shared memory size depend");

/* fwd_pair's sizes: the ring (an item's Q fills a slot, as a tile's K and V do) as many slots as
 * fit beside WsMeta, at most 8 */
template <int D> struct WsGeom {
    static constexpr int N = KCUDA_TILE_N;
    static constexpr int CPR = D / 8;
    static constexpr int Q_BYTES = KCUDA_BIG_M * D * 2;
    static constexpr int KV_BYTES = N * D * 2; /* K or V of one tile */
    static constexpr int SLOT_BYTES = 2 * KV_BYTES;
    static constexpr int MAX_SMEM = 232448; /* sm_90 opt-in shared memory per block */
    static constexpr int META_BYTES = sizeof(WsMeta);
    static constexpr int FIT = (MAX_SMEM - META_BYTES) / SLOT_BYTES;
    static constexpr int SLOTS = FIT > 8 ? 8 : FIT;
    static constexpr int META = SLOTS * SLOT_BYTES; /* offset of WsMeta */
    static constexpr int SMEM = META + META_BYTES;
    static constexpr int LPT = N * CPR / KCUDA_THREADS; /* 16-byte K (and V) loads per thread */
    static_assert(SLOTS >= 5, "a Q slot and two small-mode stages");
    static_assert(Q_BYTES == SLOT_BYTES, "an item's Q fills one slot");
    static_assert(SMEM <= MAX_SMEM, "sm_90 opt-in shared memory per block (227 KB)");
    static_assert((N * CPR) % KCUDA_THREADS == 0, "loads divide evenly");
    static_assert(32 % CPR == 0 && KCUDA_BIG_M == KCUDA_THREADS,
                  "a warp's Q copies cover 32 rows, one per lane");
};

/* fwd_pair's shared memory (WsMap's addresses) */
template <int D> struct WsSmem {
    using G = WsGeom<D>;
    struct Slot {
        uint8_t k[G::KV_BYTES], v[G::KV_BYTES]; /* a KV tile's (wswz layout), or an item's Q */
    };
    Slot slot[G::SLOTS];
    WsMeta meta;
};

template <int D> __host__ __device__ constexpr int pair_smem()
{
    static_assert(sizeof(WsSmem<D>) == WsGeom<D>::SMEM &&
                      offsetof(WsSmem<D>, meta) == WsGeom<D>::META,
                  "fwd_pair's layout: the ring's slots, then WsMeta");
    return WsGeom<D>::SMEM;
}

/* registers per thread after the producer gives its away. The consumers' increase waits until
 * the block's pool (its threads x the kernel's registers, 168 by ptxas) holds theirs, so
 * 128 x (WS_REGS_PRODUCER + 2 x WS_REGS_CONSUMER) must fit in it (at 128 the consumers would wait
 * for ever); fwd_prepare refuses the kernel where it does not. */
#define WS_REGS_PRODUCER 120
#define WS_REGS_CONSUMER 192
#if KCUDA_WGMMA
__device__ __forceinline__ void ws_regs_producer()
{
    setmaxnreg_dec<WS_REGS_PRODUCER>();
}
__device__ __forceinline__ void ws_regs_consumer()
{
    setmaxnreg_inc<WS_REGS_CONSUMER>();
}
#ifndef KCUDA_WS_PINGPONG
#define KCUDA_WS_PINGPONG 1 /* consumers take turns issuing (BAR_TURN_C0 and BAR_TURN_C1) */
#endif
/* consumer c waits for its turn to issue, and passes the turn to the other consumer */
__device__ __forceinline__ void ws_turn_take(int c)
{
    bar_sync(BAR_TURN_C0 + c, 2 * KCUDA_THREADS);
}
__device__ __forceinline__ void ws_turn_pass(int c)
{
    bar_arrive(BAR_TURN_C1 - c, 2 * KCUDA_THREADS);
}

/* A position in the ring: its slot and the parity of that slot's current use. */
template <int SLOTS> struct RingPos {
    int s = 0;
    uint32_t ph = 0;
    __device__ __forceinline__ void step(int n) /* n <= SLOTS */
    {
        s += n;
        if (s >= SLOTS) {
            s -= SLOTS;
            ph ^= 1;
        }
    }
    __device__ __forceinline__ void skip(uint32_t n) /* any n */
    {
        n += (uint32_t)s;
        s = (int)(n % SLOTS);
        ph ^= (n / SLOTS) & 1;
    }
    __device__ __forceinline__ RingPos plus(int n) const
    {
        RingPos p = *this;
        p.step(n);
        return p;
    }
};

/* The block's shared-memory map (WsGeom's sizes). */
template <int D> struct WsMap {
    using G = WsGeom<D>;
    uint8_t *base;
    __device__ __forceinline__ uint32_t slot(int s) const
    {
        return smem_u32(base) + s * G::SLOT_BYTES;
    }
    /* the mbarriers of slot s (WsMeta.bar) */
    __device__ __forceinline__ uint32_t full(int s) const
    {
        return smem_u32(base) + G::META + (int)offsetof(WsMeta, bar) + 8 * s;
    }
    __device__ __forceinline__ uint32_t empty(int s) const
    {
        return smem_u32(base) + G::META + (int)offsetof(WsMeta, bar) + 8 * (G::SLOTS + s);
    }
    __device__ __forceinline__ uint32_t raw(int s) const
    {
        return smem_u32(base) + G::META + (int)offsetof(WsMeta, bar) + 8 * (2 * G::SLOTS + s);
    }
    /* WsMeta's fields (byte offsets added in int, like every other shared-memory address) */
    __device__ __forceinline__ volatile WsWords *words(int s) const
    {
        return reinterpret_cast<volatile WsWords *>(base + G::META + (int)offsetof(WsMeta, words) +
                                                    s * (int)sizeof(WsWords));
    }
    __device__ __forceinline__ volatile uint32_t *bcast() const
    {
        return reinterpret_cast<volatile uint32_t *>(base + G::META + (int)offsetof(WsMeta, bcast));
    }
    __device__ __forceinline__ MergeList &list(int c) const /* merge list c */
    {
        return *reinterpret_cast<MergeList *>(base + G::META + (int)offsetof(WsMeta, list) +
                                              c * (int)sizeof(MergeList));
    }
};

/* A work item: a device CTA for KV head j (more than KCUDA_SMALL_M rows: big mode) or for KV heads
 * 2j and 2j + 1 (small mode). kcuda_pack_prepare puts the n_big CTAs of big mode first, then the
 * others, each run in plan order, so that the items are numbered without gaps: a CTA's items are
 * consecutive, big mode's before small mode's (with the CTAs in plan order a small CTA's items
 * past its last pair of heads would be empty, each one a block fetched costing it a round trip of
 * the counter and the CTA record). ws_ref gives the CTA's index, ws_item reads its record. */
struct WsItem {
    kcuda_cta_t cta;
    uint32_t j, n_heads;
    bool small;
};
__device__ __forceinline__ uint32_t ws_ref(const FwdArgs &a, uint32_t b, WsItem &it)
{
    const uint32_t nb = a.n_big * a.kv_heads;
    it.small = b >= nb;
    if (!it.small) {
        it.j = b % a.kv_heads;
        it.n_heads = 1;
        return b / a.kv_heads;
    }
    const uint32_t hk = ws_small_items(a);
    b -= nb;
    it.j = b % hk;
    it.n_heads = min(2u, a.kv_heads - 2 * it.j);
    return a.n_big + b / hk;
}
__device__ __forceinline__ void ws_item(const FwdArgs &a, uint32_t b, WsItem &it)
{
    it.cta = a.ctas[ws_ref(a, b, it)];
}
/* A tile's record (WsTile) as the producer reads it, in four 16-byte loads: v[0] blk[4], v[1]
 * pos[4], v[2] rng[4], v[3] whole, live, next, pad */
struct WsTileRec {
    uint4 v[4];
    __device__ __forceinline__ void load(const uint4 *r, int i) /* the record at r[i..i + 3] */
    {
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = r[i + k];
    }
    __device__ __forceinline__ const uint4 &blk() const
    {
        return v[0];
    }
    __device__ __forceinline__ const uint4 &pos() const
    {
        return v[1];
    }
    __device__ __forceinline__ const uint4 &rng() const
    {
        return v[2];
    }
    __device__ __forceinline__ uint32_t whole() const
    {
        return v[3].x;
    }
    __device__ __forceinline__ uint32_t live() const
    {
        return v[3].y;
    }
    __device__ __forceinline__ uint32_t next() const
    {
        return v[3].z;
    }
};
static_assert(sizeof(WsTileRec) == sizeof(WsTile) && offsetof(WsTile, pos) == 16 &&
                  offsetof(WsTile, rng) == 32 && offsetof(WsTile, whole) == 48 &&
                  offsetof(WsTile, live) == 52 && offsetof(WsTile, next) == 56,
              "WsTileRec reads WsTile's fields");

/* the CTA's tile count, counted on the host when the plan was lowered (walking a TREE CTA's
 * segments here would cost one round trip per segment, each read waiting for the last) */
__device__ __forceinline__ int ws_tiles(const kcuda_cta_t &cta)
{
    return (int)cta.n_tiles;
}

/* The producer's Q copies into the slot at sq: tile row r of q_rows, a warp's copies covering
 * 32 rows, each row's index in Q ([token][q head]; WS_NO_TOKEN: none, zero-filled) taken from
 * the lane that computed it (my_q) by a shuffle */
constexpr uint32_t WS_NO_TOKEN = 0xffffffffu;
template <typename T, int D, WsAblate AB>
__device__ __forceinline__ void ws_copy_q(const FwdArgs &a, uint32_t my_q, int q_rows, uint32_t sq,
                                          int tid)
{
    using G = WsGeom<D>;
    constexpr int RPW = 32 / G::CPR; /* rows a warp */
    const int lane = tid & 31;
    const T *q = static_cast<const T *>(a.q);
    const int passes = q_rows * G::CPR / KCUDA_THREADS; /* the same in every lane */
    const int ch = tid % G::CPR;                        /* the same in every pass */
    for (int e = 0; e < passes; e++) {
        const int r = (tid + e * KCUDA_THREADS) / G::CPR;
        const uint32_t qr = __shfl_sync(0xffffffffu, my_q, e * RPW + lane / G::CPR);
        const T *src = q;
        uint32_t bytes = 0;
        if (qr != WS_NO_TOKEN) {
            src = q + (uint64_t)qr * D + ch * 8;
            bytes = 16;
        }
        if (AB != WS_NO_Q)
            cp_async16(sq + wswz<KCUDA_BIG_M>(r, ch), src, bytes);
    }
}

/* The words beside a KV tile's slot from its record (rng already unpacked) */
__device__ __forceinline__ void ws_tile_words(volatile WsTileWords &wd, const WsTileRec &x,
                                              const uint32_t (&rng)[4])
{
    wd.pos[0] = x.pos().x;
    wd.pos[1] = x.pos().y;
    wd.pos[2] = x.pos().z;
    wd.pos[3] = x.pos().w;
#pragma unroll
    for (int k = 0; k < 4; k++)
        wd.rng[k] = rng[k];
    wd.whole = x.whole();
    wd.next = x.next();
}

/* A KV tile of KV head `head` into the slot at sk (K, then V KV_BYTES further), chunk k (block
 * blk[k]) into tile rows 16k..16k+15. A thread's copy e is of tile row r = tid / CPR + e * RPP,
 * of chunk e * RPP / 16. The rows of a chunk's block outside its range [lo, hi) come too where
 * TMA brings the whole page (masked, and finite: the pool never holds NaN or infinity, kern.h)
 * and are zero-filled by cp.async; the rows of no chunk are zero-filled (no global read): masked
 * as well, they must not hold what the slot held before (an item's Q, which a client wrote). */
template <int D> struct WsCopies {
    static constexpr int RPP = KCUDA_THREADS / WsGeom<D>::CPR;
    static_assert(KERN_BLOCK_SIZE % RPP == 0, "a copy's chunk is known at compile time");
};

/* by TMA: a box per chunk, K and V, 64 columns each, thread 0 issuing them all and the slot's
 * full barrier bar counting their bytes; the rows of no chunk zero-filled by cp.async */
template <int D>
__device__ __forceinline__ void ws_load_tile_tma(const FwdArgs &a, const uint32_t (&blk)[4],
                                                 uint32_t head, uint32_t sk, uint32_t bar, int tid)
{
    using G = WsGeom<D>;
    constexpr int N = G::N, RPP = WsCopies<D>::RPP;
    if (tid == 0) {
        uint32_t n_boxes = 0;
#pragma unroll
        for (int k = 0; k < 4; k++)
            n_boxes += blk[k] != WS_NO_BLOCK;
        if (n_boxes)
            mb_expect_tx(bar, n_boxes * (2 * G::KV_BYTES / 4));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (blk[k] == WS_NO_BLOCK)
                continue;
            const int bi = (int)(a.tma_block0 + blk[k]);
#pragma unroll
            for (int cb = 0; cb < D / 64; cb++) {
                const uint32_t off = cb * (N * 128) + k * KERN_BLOCK_SIZE * 128;
                tma_load5(sk + off, &a.kv_map, bar, cb * 64, 0, (int)head, 0, bi);
                tma_load5(sk + G::KV_BYTES + off, &a.kv_map, bar, cb * 64, 0, (int)head, 1, bi);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < G::LPT; e++) {
        const int c = tid + e * KCUDA_THREADS, r = c / G::CPR, ch = c % G::CPR;
        if (blk[e * RPP / KERN_BLOCK_SIZE] == WS_NO_BLOCK) {
            cp_async16(sk + wswz<N>(r, ch), a.kv, 0);
            cp_async16(sk + G::KV_BYTES + wswz<N>(r, ch), a.kv, 0);
        }
    }
}

/* whether row pr of a tile's chunk is read: the chunk has a block (bk) and pr is in its range
 * [lo, hi) (rg, a WsTile rng word); else the row is zero-filled */
__device__ __forceinline__ bool ws_row_read(uint32_t bk, uint32_t rg, int pr)
{
    return bk != WS_NO_BLOCK && (uint32_t)pr >= (rg & 0xffu) && (uint32_t)pr < ((rg >> 8) & 0xffu);
}

/* by 16-byte cp.async, each thread its copies: a row is read where ws_row_read says, else
 * zero-filled */
template <typename T, int D>
__device__ __forceinline__ void ws_load_tile_cp(const FwdArgs &a, const uint32_t (&blk)[4],
                                                const uint32_t (&rng)[4], uint32_t head,
                                                uint32_t sk, int tid)
{
    using G = WsGeom<D>;
    constexpr int N = G::N, RPP = WsCopies<D>::RPP;
    const uint32_t sv = sk + G::KV_BYTES;
    const T *kbase = static_cast<const T *>(a.kv) + (uint64_t)head * a.head_stride;
#pragma unroll
    for (int e = 0; e < G::LPT; e++) {
        const int c = tid + e * KCUDA_THREADS, r = c / G::CPR, ch = c % G::CPR;
        const int k = e * RPP / KERN_BLOCK_SIZE, pr = r % KERN_BLOCK_SIZE;
        const T *ks = kbase, *vs = kbase;
        uint32_t bytes = 0;
        if (ws_row_read(blk[k], rng[k], pr)) {
            ks = kv_chunk<T, D>(a, kbase, blk[k], pr, ch);
            vs = ks + a.v_offset;
            bytes = 16;
        }
        cp_async16(sk + wswz<N>(r, ch), ks, bytes);
        cp_async16(sv + wswz<N>(r, ch), vs, bytes);
    }
}

/* An fp8 pool's tile (KV: its format): by 16-byte cp.async, each copy 16 elements of a row placed
 * where Raw8 says (kern_cuda_fwd.cuh); kv8_decode turns them into T once they have landed. */
template <int D>
__device__ __forceinline__ void ws_load_tile_cp8(const FwdArgs &a, const uint32_t (&blk)[4],
                                                 const uint32_t (&rng)[4], uint32_t head,
                                                 uint32_t sk, int tid)
{
    using G = WsGeom<D>;
    constexpr int N = G::N;
    const uint32_t sv = sk + G::KV_BYTES;
    const uint8_t *kbase = static_cast<const uint8_t *>(a.kv) + (uint64_t)head * a.head_stride;
#pragma unroll
    for (int e = 0; e < Raw8<D>::PER; e++) {
        const Raw8<D> w(tid, e);
        const int k = w.r / KERN_BLOCK_SIZE, pr = w.r % KERN_BLOCK_SIZE;
        /* blk[k] and rng[k] without a local array index */
        const uint32_t bk = k == 0 ? blk[0] : k == 1 ? blk[1] : k == 2 ? blk[2] : blk[3];
        const uint32_t rg = k == 0 ? rng[0] : k == 1 ? rng[1] : k == 2 ? rng[2] : rng[3];
        const uint8_t *ks = kbase, *vs = kbase;
        uint32_t bytes = 0;
        if (ws_row_read(bk, rg, pr)) {
            ks = kv_chunk<uint8_t, D>(a, kbase, bk, pr, 2 * w.i); /* 16 bytes from 16 i */
            vs = ks + a.v_offset;
            bytes = 16;
        }
        cp_async16(sk + wswz<N>(w.r, w.at()), ks, bytes);
        cp_async16(sv + wswz<N>(w.r, w.at()), vs, bytes);
    }
}
/* an fp8 producer's tiles waiting for their copies to land, at most (the next waits for the
 * oldest) */
constexpr int WS_FP8_PENDING = 5;

constexpr uint32_t WS_END = 0xffffffffu; /* the item id that ends the consumers' loop */

/* The producer: fetches items from the launch's counter (in plan order) until none is left; for
 * each, Q of the CTA's rows into a slot (with the item id and tile count beside it), then every
 * tile into the next ones; at the end a slot whose item id is WS_END. */
template <typename T, int D, WsAblate AB, int KV>
__device__ __forceinline__ void ws_produce(const FwdArgs &a, const WsMap<D> &mp)
{
    using G = WsGeom<D>;
    const int tid = threadIdx.x; /* 0..127 */
    const uint32_t group = a.group, n_items = ws_items(a);
    volatile uint32_t *bcast = mp.bcast(); /* thread 0's fetch, to the producer's threads */
    RingPos<G::SLOTS> pos;
    /* An fp8 pool (KV): a KV tile's slot is filled once decoded (kv8_decode), after every copy
     * of it has landed (the slot's raw barrier, which each thread's copies arrive on). The
     * producer decodes the tiles in the order it took them, each as soon as it has landed: after
     * every slot's copies and while it waits for a slot to free (the ring full), never blocking
     * on memory then, so that the loads of every free slot stay in flight; at most
     * WS_FP8_PENDING tiles wait, the next waits for the oldest to land. Bit j of pend (raw: to
     * decode; bare: a slot of no copies, only to mark filled) is the slot taken j slots before
     * the last; bit s of rph the parity of slot s's raw barrier's next phase. */
    uint32_t pend_raw = 0, pend_bare = 0, rph = 0;
    auto decode_oldest = [&](bool block) {
        const uint32_t pend = pend_raw | pend_bare;
        const int j = 31 - __clz((int)pend);
        const int s = (pos.s - 1 - j + 2 * G::SLOTS) % G::SLOTS;
        if constexpr (KV != 0) {
            if ((pend_raw >> j) & 1u) {
                const uint32_t ph = (rph >> s) & 1u;
                if (block)
                    mb_wait(mp.raw(s), ph);
                else if (!mb_poll<false>(mp.raw(s), ph))
                    return false;
                rph ^= 1u << s;
                kv8_decode<T, D, KV, true>(mp.slot(s), tid);
                wg_proxy_fence(); /* the decoded chunks reach the consumers' wgmma */
            }
        }
        mb_arrive(mp.full(s));
        pend_raw &= ~(1u << j);
        pend_bare &= ~(1u << j);
        return true;
    };
    auto decode_landed = [&]() {
        while ((pend_raw | pend_bare) && decode_oldest(false)) {
        }
    };
    /* slot s's copies are out: its full barrier completes once they land (16-bit), or once
     * decoded (tile: an fp8 tile's slot, raw: it has copies) */
    auto filled = [&](int s, bool tile = false, bool raw = false) {
        if (KV) {
            pend_raw <<= 1;
            pend_bare <<= 1;
        }
        if (KV && tile) {
            if (raw)
                mb_arrive_cp(mp.raw(s));
            pend_raw |= raw ? 1u : 0u;
            pend_bare |= raw ? 0u : 1u;
            if (tid == 0)
                mb_arrive(mp.full(s)); /* the words written before it */
            decode_landed();
            while (__popc(pend_raw | pend_bare) > WS_FP8_PENDING)
                decode_oldest(true);
            return;
        }
        mb_arrive_cp(mp.full(s)); /* once this thread's copies have landed */
        if (tid == 0)
            mb_arrive(mp.full(s)); /* the words written before it */
        if (KV)
            decode_landed();
    };
    uint32_t taken = 0;
    auto take = [&]() {
        if (taken >= (uint32_t)G::SLOTS) {
            if (KV) /* the consumers may wait for a tile still to decode */
                while (!mb_poll<true>(mp.empty(pos.s), pos.ph ^ 1))
                    decode_landed();
            else
                mb_wait(mp.empty(pos.s), pos.ph ^ 1);
        }
        const int s = pos.s;
        taken++;
        pos.step(1);
        return s;
    };

    bool early = false; /* thread 0 holds the next item's id in `next` (a short item's) */
    uint32_t next = 0;
    for (;;) {
        uint32_t b;
        WsItem it;
        /* the next item, or the end. After a long item it is taken only once this block's
         * producer has issued every load of its current item: a fetch made earlier (a prefetch
         * of the id) reserves the item while other blocks may be idle, and measured twice the
         * time on TREE plans whose long CTAs fill one wave (tests/bench/log/
         * 2026-11-25-ws-persistent.md). After a short item (at most WS_EARLY_TILES tiles) it
         * was fetched as that item was taken, `early` below: fwd_pair's fixed cost per item
         * fell from 5.09 to 4.55 us and the 80 cases of bench_attn took 0.994 of their time
         * (tests/bench/log/2026-11-28-early-fetch.md) */
        if (tid == 0)
            *bcast = early ? next : atomicAdd(a.work, 1u);
        bar_sync(BAR_PRODUCER, KCUDA_THREADS);
        b = *bcast;
        bar_sync(BAR_PRODUCER, KCUDA_THREADS); /* read by all before thread 0 writes again */
        if (b >= n_items) {
            /* no item left: once every block is here, the merge's blocks are placed as this
             * grid's leave their SMs. Triggered at the start instead, they were placed beside
             * running blocks and measured up to 1.2x slower calls (tests/bench/log/
             * 2026-11-28-merge-pdl.md) */
            dep_launch_dependents();
            const int qs = take();
            if (tid == 0)
                mp.words(qs)->q.item = WS_END;
            filled(qs);
            while (pend_raw | pend_bare)
                decode_oldest(true);
            break;
        }
        ws_item(a, b, it);
        const int n_tiles = ws_tiles(it.cta);
        /* a short item: the next id now, kept in a register until the loop's top, so that
         * nothing waits for it before this item's copies are out (the same in every thread: a
         * block's last fetch is still the one past the end, before its count below) */
        early = n_tiles <= WS_EARLY_TILES;
        if (early && tid == 0)
            next = atomicAdd(a.work, 1u);
        const sched_plan_row_t *rows = a.rows + it.cta.row_begin;
        const uint32_t n_rows = it.cta.row_count * group, j = it.j;
        const bool small = it.small;

        /* Every read the item's first copies wait for goes out before anything waits: the Q rows'
         * tokens and the first two tiles' records; then the Q slot (a wait on the ring) and the
         * copies. Read after the Q copies (asm statements that clobber memory), each read would
         * be one more round trip an item after the tokens'.
         *
         * Q: tile row r is CTA row r of head j (big), or CTA row r % 64 of head 2j + r / 64.
         * The copies of a warp cover 32 rows: each lane reads one of those rows' tokens and
         * computes its row index in Q ([token][q head]) once, and every copy takes its row's from
         * that lane (a shuffle): per copy, the division by the group cost 30 % of the producer's
         * time on one-tile items (ncu, H200: tests/bench/log/2026-11-26-producer-issue-bound.md).
         * Reads between copies each wait for their own round trip: that gather cost 3.8 of
         * fwd_pair's 8.5 us per one-tile item (tile solver, H200:
         * tests/bench/log/2026-11-26-q-gather.md); unrolled reads spill the producer's registers,
         * and tokens through shared memory cost a barrier that made 1-row items slower. */
        const int q_rows = small ? 64 * (int)it.n_heads : KCUDA_BIG_M;
        constexpr int RPW = 32 / G::CPR, RPI = KCUDA_THREADS / G::CPR; /* rows a warp, a pass */
        const int lane = tid & 31, w = tid >> 5;
        uint32_t my_q = WS_NO_TOKEN;
        const int my_r = w * RPW + lane % RPW + lane / RPW * RPI;
        const uint32_t my_rr = small ? my_r % 64 : my_r;
        const bool my_live = my_r < q_rows && my_rr < n_rows;
        const uint32_t my_tok = my_live ? rows[my_rr / group].q_tok : WS_NO_TOKEN;

        /* the item's tiles (plan_upload's list), each read two tiles ahead of its copies: the
         * producer has nothing to compute while a read is in flight, so one tile ahead would put
         * that read's latency into every tile */
        const uint4 *tl = reinterpret_cast<const uint4 *>(a.tiles + it.cta.first_tile);
        WsTileRec ta, tb; /* tiles t and t + 1 */
        auto fetch_tile = [&](int t, WsTileRec &x) { x.load(tl, 4 * t); };
        if (n_tiles) {
            fetch_tile(0, ta);
            if (n_tiles > 1)
                fetch_tile(1, tb);
        }

        const int qs = take();
        if (tid == 0) {
            volatile WsQWords &wd = mp.words(qs)->q;
            wd.item = b;
            wd.n_tiles = (uint32_t)n_tiles;
            wd.row_begin = it.cta.row_begin;
            wd.row_count = it.cta.row_count;
        }
        if (my_live) {
            const uint32_t head = small ? 2 * j + my_r / 64 : j;
            my_q = my_tok * a.q_heads + head * group + my_rr % group;
        }
        ws_copy_q<T, D, AB>(a, my_q, q_rows, mp.slot(qs), tid);
        if (tid == 0) /* after the copies: the record's read had the tokens' time to land */
            mp.words(qs)->q.live0 = n_tiles ? ta.live() : 0;
        filled(qs);

        /* tile t from its record x: a slot per head (small), filled by ws_load_tile_* */
        auto produce = [&](int t, WsTileRec &x) {
            const uint32_t blk[4] = {x.blk().x, x.blk().y, x.blk().z, x.blk().w};
            const uint32_t rng[4] = {x.rng().x, x.rng().y, x.rng().z, x.rng().w};
            for (uint32_t h = 0; h < (small ? 2u : 1u); h++) {
                const int s = take();
                const uint32_t head = small ? 2 * j + h : j;
                const uint32_t sk = mp.slot(s);
                if (tid == 0)
                    ws_tile_words(mp.words(s)->t, x, rng);
                const bool copies = AB != WS_NO_KV && h < it.n_heads;
                if (!copies) { /* a small item of one head leaves its second slot */
                } else if (KV) {
                    ws_load_tile_cp8<D>(a, blk, rng, head, sk, tid);
                } else if (a.tma) {
                    ws_load_tile_tma<D>(a, blk, head, sk, mp.full(s), tid);
                } else {
                    ws_load_tile_cp<T, D>(a, blk, rng, head, sk, tid);
                }
                filled(s, true, copies);
            }
            if (t + 2 < n_tiles)
                fetch_tile(t + 2, x);
        };
        for (int t = 0; t < n_tiles; t += 2) {
            produce(t, ta);
            if (t + 1 < n_tiles)
                produce(t + 1, tb);
        }
    }
    cp_async_wait<0>();
    /* the last block out leaves the counter at 0 for the next launch: every block's last fetch
     * (the one past the end) is ordered before its count below */
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(a.work + 1, 1u) == gridDim.x - 1) {
            a.work[0] = 0;
            a.work[1] = 0;
            __threadfence();
        }
    }
}

/* Q's A fragments of every k-step, row r of the Q slot at qs (wgmma's swizzle) */
template <int KS>
__device__ __forceinline__ void ws_load_qf(uint32_t (&qf)[KS][4], uint32_t qs, int r, int lane)
{
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
        ldsm_x4(qs + wswz<KCUDA_BIG_M>(r, 2 * ks + (lane >> 4)), qf[ks][0], qf[ks][1], qf[ks][2],
                qf[ks][3]);
}

/* S (64 x N) = Q.K^T: one group of wgmma, K from descriptor k0, Q's fragments from registers;
 * the registers pinned around the issue (nothing may copy them while the products run) */
template <typename T, int D>
__device__ __forceinline__ void ws_issue_qk(float (&sw)[4 * (KCUDA_TILE_N / 8)],
                                            uint32_t (&qf)[D / 16][4], uint64_t k0)
{
    constexpr int N = KCUDA_TILE_N;
    wg_hold(sw);
    wg_hold_u(qf);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++)
        Wg<T>::rsk64(sw, qf[ks], k0 + (((ks >> 2) * (N * 128) + (ks & 3) * 32) >> 4), ks);
    wg_commit();
    wg_hold(sw);
    wg_hold_u(qf);
}
/* O += P.V: one group of wgmma, V from descriptor v0, P's fragments from registers */
template <typename T, int D>
__device__ __forceinline__ void ws_issue_pv(float (&ow)[4 * (D / 8)],
                                            uint32_t (&pf)[KCUDA_TILE_N / 16][4], uint64_t v0)
{
    wg_hold(ow);
    wg_hold_u(pf);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KCUDA_TILE_N / 16; kk++) {
        if constexpr (D == 64)
            Wg<T>::rs64(ow, pf[kk], v0 + ((kk * 16 * 128) >> 4));
        else
            Wg<T>::rs128(ow, pf[kk], v0 + ((kk * 16 * 128) >> 4));
    }
    wg_commit();
    wg_hold(ow);
    wg_hold_u(pf);
}

/* A consumer thread's two rows r0 and r1 as the mask reads them: their causal limits and query
 * tokens (0xffffffff past the CTA's rows), and the thread's column pair in the quad (tq) */
struct WsRows {
    uint32_t lim0, lim1, qt0, qt1;
    int tq;
};

/* The mask of a tile (its words w) on S: row r reads chunk k's block rows [lo, b) with b the
 * smaller of hi and its limit, where r is one of the chunk's readers. A whole tile (every chunk a
 * whole page of the same readers) needs none for a reader whose limit is past its end; the rest is
 * a bit per score, four columns a chunk (2tq, 2tq + 1, 8 + 2tq, 9 + 2tq). A branch of its own,
 * taken by a warp only where one of its rows does not read the whole tile (else the compiler
 * selects every score). */
template <int NT>
__device__ __forceinline__ void ws_mask(float (&s)[NT][4], volatile WsTileWords &w,
                                        const WsRows &wr)
{
    const uint32_t qt0 = wr.qt0, qt1 = wr.qt1, row_lim0 = wr.lim0, row_lim1 = wr.lim1;
    const int tq = wr.tq;
    const uint32_t end = w.whole;
    bool plain0 = false, plain1 = false;
    if (end) {
        const uint32_t rg = w.rng[0], rlo = (rg >> 16) & 0xffu, rhi = rg >> 24;
        plain0 = qt0 >= rlo && qt0 < rhi && row_lim0 >= end;
        plain1 = qt1 >= rlo && qt1 < rhi && row_lim1 >= end;
    }
    if (__any_sync(0xffffffffu, !plain0 || !plain1)) {
        uint32_t bits0 = 0, bits1 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t pos = w.pos[k], rg = w.rng[k];
            const uint32_t lo = rg & 0xffu, hi = (rg >> 8) & 0xffu;
            const uint32_t rlo = (rg >> 16) & 0xffu, rhi = rg >> 24;
            auto cols = [&](uint32_t qt, uint32_t lim) {
                if (qt < rlo || qt >= rhi || lim <= pos + lo)
                    return 0u;
                const uint32_t b = min(hi, lim - pos);
                const uint32_t m = ((1u << b) - 1) & ~((1u << lo) - 1);
                return ((m >> (2 * tq)) & 3u) | ((m >> (8 + 2 * tq)) & 3u) << 2;
            };
            bits0 |= cols(qt0, row_lim0) << (4 * k);
            bits1 |= cols(qt1, row_lim1) << (4 * k);
        }
#pragma unroll
        for (int jn = 0; jn < NT; jn++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int bit = (jn >> 1) * 4 + (jn & 1) * 2 + (e & 1);
                if (!(((e < 2 ? bits0 : bits1) >> bit) & 1u))
                    s[jn][e] = -INFINITY;
            }
    }
}

/* Scale, softcap, mask (the tile's words w) and the online softmax of S in place: probabilities
 * in s, the sums updated; returns O's corrections c for rows r0 and r1. Without a softcap (and
 * with a positive scale: plain) the scale rides in the exponent's FMA: the maximum of the raw
 * scores is taken first, p = 2^(s * scale * log2 e - base) (RowSoftmax.add_ex2_fma). */
template <int NT, WsAblate AB>
__device__ __forceinline__ void ws_softmax(float (&s)[NT][4], RowSoftmax &sm, float &c0, float &c1,
                                           const FwdArgs &a, bool plain, float sl2,
                                           volatile WsTileWords &w, const WsRows &wr)
{
    if (!plain) {
#pragma unroll
        for (int jn = 0; jn < NT; jn++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[jn][e] = a.softcap > 0.f ? a.softcap * 1.4426950408889634f *
                                                 tanhf(s[jn][e] * a.scale / a.softcap)
                                           : s[jn][e] * sl2;
    }
    ws_mask(s, w, wr);
    float tm0 = -INFINITY, tm1 = -INFINITY;
#pragma unroll
    for (int jn = 0; jn < NT; jn++) {
        tm0 = fmaxf(tm0, fmaxf(s[jn][0], s[jn][1]));
        tm1 = fmaxf(tm1, fmaxf(s[jn][2], s[jn][3]));
    }
    const float k = plain ? sl2 : 1.f; /* scores still to be scaled by k */
    float b0, b1;
    sm.rebase<Exp2Ftz>(tm0, tm1, k, b0, b1, c0, c1);
    sm.add_ex2_fma<NT, AB != WS_NO_EXP>(s, k, b0, b1, c0, c1);
}

/* One consumer warpgroup's part of one item whose Q slot is at rp: its 64 rows of the CTA for
 * KV head `head`, Q into registers (the slot released), then the item's tiles from the next
 * slots (rp advanced past them); then its outputs. An idle consumer (a small item of one head,
 * c == 1) computes masked rows and writes nothing, so that both keep taking turns and releasing
 * the same stages. */
template <typename T, int D, WsAblate AB>
__device__ __forceinline__ void
ws_consume(const FwdArgs &a, const WsItem &it, int n_tiles, uint32_t live0, uint32_t head, int c,
           bool idle, const WsMap<D> &mp, RingPos<WsGeom<D>::SLOTS> &rp, bool pp)
{
    using G = WsGeom<D>;
    constexpr int N = G::N, NT = N / 8, DT = D / 8;
    const int tid = threadIdx.x % KCUDA_THREADS, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const kcuda_cta_t &cta = it.cta;
    const bool small = it.small;
    const sched_plan_row_t *rows = a.rows + cta.row_begin;
    const uint32_t group = a.group, n_rows = idle ? 0 : cta.row_count * group;
    const int rb = small ? 0 : 64 * c; /* first CTA row of this warpgroup */
    /* a stage: one slot read by both (big), or a slot per head, this consumer's at +c (small) */
    const int adv = small ? 2 : 1, off = small ? c : 0;
    const uint32_t rel = small ? 2 : 1; /* arrivals on the empty barrier: 2 x 128 per stage */

    /* Q: this warp's 16 rows of the warpgroup's 64 (Q slot rows 64c..), the A fragment of every
     * k-step; then the slot is free */
    uint32_t qf[D / 16][4];
    ws_load_qf(qf, mp.slot(rp.s), 64 * c + warp * 16 + (lane & 15), lane);
    mb_arrive(mp.empty(rp.s));
    rp.step(1);

    const int r0 = rb + warp * 16 + g, r1 = r0 + 8;
    const uint32_t row_lim0 = (uint32_t)r0 < n_rows ? rows[r0 / group].limit : 0;
    const uint32_t row_lim1 = (uint32_t)r1 < n_rows ? rows[r1 / group].limit : 0;
    const uint32_t qt0 = (uint32_t)r0 < n_rows ? r0 / group : 0xffffffffu; /* query tokens */
    const uint32_t qt1 = (uint32_t)r1 < n_rows ? r1 / group : 0xffffffffu;
    /* whether the tile at nx is read by one of this warpgroup's rows: its live bits come with the
     * tile before it (plan_upload's `next`; the first with the item's Q), so a run of tiles ends
     * without waiting for the tile after it */
    const uint32_t lbit = small ? 0 : (uint32_t)c;
    uint32_t lvb = live0;
    auto live = [&]() { return AB != WS_NO_PRODUCTS && !idle && ((lvb >> lbit) & 1u); };
    /* Descriptors once: a product's operand is one of these plus a constant offset (16-byte
     * units in the start-address field, which no tile address overflows): K and V of ring slot 0,
     * a slot SLOT_BYTES further. */
    const uint32_t ring = mp.slot(0);
    const uint64_t kd = wg_desc(ring, 16, 1024), vd = wg_desc(ring + G::KV_BYTES, N * 128, 1024);
    /* the stage of the next tile to compute S for, and of the tile whose P.V runs */
    RingPos<G::SLOTS> nx = rp.plus(off), cu = nx;
    auto slot = [&](int s) { return (uint64_t)(s * (G::SLOT_BYTES >> 4)); };

    float o[DT][4], s[NT][4];
    uint32_t pf[N / 16][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    RowSoftmax sm;
    const float sl2 = a.scale * 1.4426950408889634f;
    float(&sw)[4 * NT] = *reinterpret_cast<float(*)[4 * NT]>(&s[0][0]);
    float(&ow)[4 * DT] = *reinterpret_cast<float(*)[4 * DT]>(&o[0][0]);

    auto wait_full = [&]() {
        mb_wait(mp.full(nx.s), nx.ph);
        wg_proxy_fence(); /* the producer's copies (made visible by the barrier) reach wgmma */
    };
    /* S = Q.K^T of stage nx (filled: wait_full), one group; its softmax masks by slot ms */
    int ms = 0;
    auto issue_qk = [&]() {
        const uint64_t k0 = kd + slot(nx.s);
        ms = nx.s;
        lvb = mp.words(nx.s)->t.next;
        nx.step(adv);
        ws_issue_qk<T, D>(sw, qf, k0);
    };
    /* O += P.V of stage cu, one group */
    auto issue_pv = [&]() { ws_issue_pv<T, D>(ow, pf, vd + slot(cu.s)); };
    auto release = [&]() {
        mb_arrive_n(mp.empty(cu.s), rel);
        cu.step(adv);
    };
    const bool plain = !(a.softcap > 0.f) && sl2 > 0.f;
    const WsRows wr{row_lim0, row_lim1, qt0, qt1, tq};
    auto softmax = [&](float &c0, float &c1) {
        ws_softmax<NT, AB>(s, sm, c0, c1, a, plain, sl2, mp.words(ms)->t, wr);
    };
    /* O's correction, then P from the S accumulators (the C layout of two n8 tiles is the A
     * layout of one k16 step); once the rows' maxima settle most tiles leave them, and a warp
     * none of whose rows moved skips the rescale */
    auto rescale_pack = [&](float c0, float c1) {
        if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f))
            rescale_rows(o, c0, c1);
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++)
            pack_p<T>(pf[kk], s[2 * kk], s[2 * kk + 1]);
    };

    /* Runs of tiles. A tile none of this warpgroup's rows reads (a segment of the other
     * consumer's rows in big mode, every tile of an idle consumer) is only waited for and
     * released, its turn passed on, so the other consumer computes it alone: a TREE CTA's leaves
     * cost one consumer each, and the backend alternates the two halves' tiles (plan_upload)
     * so that both compute at once. Each run of tiles it reads is one straight line of issue and
     * waits (prologue, loop, epilogue: no wgmma or wait under a condition that differs between
     * tiles, else ptxas cannot tell which group a wait completes and serializes them all); rows of
     * the warpgroup that a tile of the run does not reach are masked by their limits (P = 0).
     * Tile t: S of tile t + 1 is issued before P.V of tile t, and its softmax runs while P.V does
     * (FlashAttention-3's intra-warpgroup overlap); with pp the two consumers take turns to issue,
     * so that one's softmax runs under the other's products (the turn passes on across items:
     * both take one per tile, a skipped one too). A single tile per step: two (S of 64 x 128, the
     * producer padding to an even count) measured slower on the tile solver's dense plan, 229 /
     * 259 -> 166 / 183 TFLOP/s (tests/bench/log/2026-11-25-ws-forward.md). The loop stays one
     * function with its steps as lambdas over ws_consume's registers (o, s, pf, qf, the ring
     * positions): held in a struct instead, they cost the descriptors their uniform registers. */
    int t = 0;
    while (t < n_tiles) {
        while (t < n_tiles && !live()) {
            mb_wait(mp.full(nx.s), nx.ph);
            lvb = mp.words(nx.s)->t.next;
            nx.step(adv);
            if (pp) {
                ws_turn_take(c);
                ws_turn_pass(c);
            }
            release();
            t++;
        }
        if (t == n_tiles)
            break;
        {
            wait_full();
            issue_qk();
            wg_wait<0>();
            wg_hold(sw);
            wg_hold_u(qf);
            float c0, c1;
            softmax(c0, c1);
            rescale_pack(c0, c1);
        }
        for (; t + 1 < n_tiles && live(); t++) {
            wait_full();
            if (pp)
                ws_turn_take(c);
            issue_qk();
            issue_pv();
            if (pp)
                ws_turn_pass(c);
            wg_wait<1>(); /* S of tile t + 1; P.V of tile t may still run */
            wg_hold(sw);
            wg_hold_u(qf);
            float c0, c1;
            softmax(c0, c1);
            wg_wait<0>();
            wg_hold(ow);
            wg_hold_u(pf);
            release();
            rescale_pack(c0, c1);
        }
        if (pp)
            ws_turn_take(c);
        issue_pv();
        if (pp)
            ws_turn_pass(c);
        wg_wait<0>();
        wg_hold(ow);
        release();
        t++;
    }
    rp.skip((uint32_t)(adv * n_tiles));
    if (idle || AB == WS_NO_PRODUCTS)
        return;
    sm.finish();
    fwd_rows_out<T, D>(a, rows, head, r0, n_rows, sm.m0, sm.l0, o, 0, tq);
    fwd_rows_out<T, D>(a, rows, head, r1, n_rows, sm.m1, sm.l1, o, 2, tq);
}
#endif /* KCUDA_WGMMA */

/* One layer of a plan with CTAs of up to KCUDA_BIG_M rows (sm_90a, head_dim <= 128,
 * KERN_FWD_AUTO), persistent: grid = at most one block of KCUDA_PAIR_THREADS per SM (dynamic
 * shared memory pair_smem<D>()), each running items until the launch's counter passes
 * ws_items(a) (see the top of the file). AB: WS_FULL; the others only in ablate.sh's builds. */
template <typename T, int D, WsAblate AB = WS_FULL, int KV = 0>
__global__ void __launch_bounds__(KCUDA_PAIR_THREADS, 1) fwd_pair(const __grid_constant__ FwdArgs a)
{
    extern __shared__ __align__(1024) uint8_t smem[];
#if KCUDA_WGMMA
    if constexpr (D <= 128) {
        using G = WsGeom<D>;
        const WsMap<D> mp{smem};
        if (smem_u32(smem) & 1023u)
            __trap(); /* the swizzle needs 1024-byte aligned tiles: a layout bug, never data */
        if (threadIdx.x < G::SLOTS) {
            mb_init(mp.full(threadIdx.x), KCUDA_THREADS + 1);
            mb_init(mp.empty(threadIdx.x), 2 * KCUDA_THREADS);
            mb_init(mp.raw(threadIdx.x), KCUDA_THREADS);
        }
        __syncthreads(); /* the barriers exist before anyone arrives */
        dep_wait();      /* every global access after it (the work counter's too) */
        /* broadcast from lane 0: the compiler then knows it is warp-uniform (descriptors and
         * slot offsets stay in uniform registers) */
        const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / KCUDA_THREADS), 0);
        if (wg == 0) {
            ws_regs_producer();
            ws_produce<T, D, AB, KV>(a, mp);
            return;
        }
        ws_regs_consumer();
        const int c = wg - 1;
        const bool pp = KCUDA_WS_PINGPONG;
        if (pp && c == 1)
            bar_arrive(BAR_TURN_C0, 2 * KCUDA_THREADS); /* consumer 0 issues first */
        RingPos<G::SLOTS> rp;
        for (;;) {
            mb_wait(mp.full(rp.s), rp.ph);
            volatile WsQWords &w = mp.words(rp.s)->q;
            const uint32_t b = w.item;
            if (b == WS_END)
                break;
            const int n_tiles = (int)w.n_tiles;
            WsItem it;
            ws_ref(a, b, it);
            it.cta.row_begin = w.row_begin;
            it.cta.row_count = w.row_count;
            const bool idle = it.small && (uint32_t)c >= it.n_heads;
            const uint32_t head = it.small ? 2 * it.j + c : it.j;
            ws_consume<T, D, AB>(a, it, n_tiles, w.live0, head, c, idle, mp, rp, pp);
            if (a.merge_inside && !idle) {
                if (it.small)
                    fwd_arrive_merge<T, D>(a, it.cta, head, mp.list(c), threadIdx.x % KCUDA_THREADS,
                                           KCUDA_THREADS, BAR_MERGE_C0 + c);
                else
                    fwd_arrive_merge<T, D>(a, it.cta, head, mp.list(0), threadIdx.x - KCUDA_THREADS,
                                           2 * KCUDA_THREADS, BAR_MERGE_BIG);
            }
        }
        return;
    }
#endif
    __trap(); /* never launched: the backend uses it only where compiled for sm_90a */
}

} // namespace kcuda

#endif
