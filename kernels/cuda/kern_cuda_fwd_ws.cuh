/*
 * kern_cuda_fwd_ws.cuh — the warp-specialized Hopper forward, fwd_pair (sm_90a, head_dim <= 128,
 * KERN_FWD_AUTO). Included by kern_cuda_fwd.cuh after the shared pieces (loads, softmax, outputs,
 * merge); one kernel per (dtype, head_dim) like fwd_layer.
 *
 * A block is three warpgroups. Warpgroup 0 is the producer: it gives most of its registers away
 * (setmaxnreg), gathers Q and then every KV tile of the CTA by 16-byte cp.async into a ring of
 * shared-memory slots, and tells the consumers a stage is in through a full mbarrier per stage
 * (cp.async.mbarrier.arrive: no thread waits for its own copies). Warpgroups 1 and 2 are the
 * consumers: each owns 64 rows and issues only wgmma and softmax; when done with a stage each of
 * its threads arrives on the stage's empty mbarrier, on which the producer waits before refilling.
 *
 * Two modes, by the CTA's rows (block b: plan CTA b / kv_heads, j = b % kv_heads):
 *   big   (more than KCUDA_SMALL_M rows): KV head j; consumer c has rows 64c..64c+63; one KV tile
 *         per stage, read by both (the ring's slots are the stages);
 *   small (up to KCUDA_SMALL_M rows): KV heads 2j and 2j + 1, consumer c the CTA's rows for head
 *         2j + c (a block with 2j >= kv_heads leaves at once, one with 2j + 1 == kv_heads runs one
 *         consumer); a stage is two slots, the tile of each head.
 *
 * Each consumer overlaps its softmax with the tensor cores: while O += P_j.V_j runs, S_{j+1} =
 * Q.K_{j+1}^T has already been issued before it and its softmax runs under P_j.V_j; O is rescaled
 * once P_j.V_j is done (FlashAttention-3's intra-warpgroup pipelining). Every consumer waits for
 * every stage to fill before it releases it, also when its rows read none of the tile (band
 * skip), so no arrival can count toward a later phase of an empty barrier.
 */
#ifndef KERN_CUDA_FWD_WS_CUH
#define KERN_CUDA_FWD_WS_CUH

namespace kcuda
{

/* shared memory of fwd_pair: Q (128 rows), the ring, a full and an empty barrier per slot */
template <int D> struct WsGeom {
    static constexpr int N = KCUDA_TILE_N;
    static constexpr int CPR = D / 8;
    static constexpr int Q_BYTES = KCUDA_BIG_M * D * 2;
    static constexpr int KV_BYTES = N * D * 2; /* K or V of one tile */
    static constexpr int SLOT_BYTES = 2 * KV_BYTES;
    static constexpr int MAX_SMEM = 232448; /* sm_90 opt-in shared memory per block */
    static constexpr int FIT = (MAX_SMEM - Q_BYTES - 256) / SLOT_BYTES;
    static constexpr int SLOTS = (FIT > 8 ? 8 : FIT) & ~1; /* even: two per small-mode stage */
    static constexpr int BAR_BYTES = 2 * SLOTS * 8;
    static constexpr int SMEM = Q_BYTES + SLOTS * SLOT_BYTES + BAR_BYTES;
    static constexpr int LPT = N * CPR / KCUDA_THREADS; /* 16-byte K (and V) loads per thread */
    static_assert(SLOTS >= 4, "a ring of at least two small-mode stages");
    static_assert(SMEM <= MAX_SMEM, "sm_90 opt-in shared memory per block (227 KB)");
    static_assert((N * CPR) % KCUDA_THREADS == 0, "loads divide evenly");
};

template <int D> __host__ __device__ constexpr int pair_smem()
{
    return WsGeom<D>::SMEM;
}

#if KCUDA_WGMMA
/* registers per thread after the producer gives its away: 128 x (56 + 2 x 224) <= 65536 */
__device__ __forceinline__ void ws_regs_producer()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 104;\n" ::);
}
__device__ __forceinline__ void ws_regs_consumer()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 192;\n" ::);
}
template <int K> __device__ __forceinline__ void wg_hold_u(uint32_t (&d)[K][4])
{
#pragma unroll
    for (int i = 0; i < K; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(d[i][e])::"memory");
}
#ifndef KCUDA_WS_PINGPONG
#define KCUDA_WS_PINGPONG 1 /* consumers take turns issuing (named barriers 4 and 5) */
#endif
__device__ __forceinline__ void bar_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_wait(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* 2^x on the special-function unit, subnormal results flushed to 0 (a probability below 2^-126
 * adds nothing to a row sum of at least 1) */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* The producer: Q of the CTA's rows (both heads in small mode), then every tile into the ring. */
template <typename T, int D>
__device__ __forceinline__ void ws_produce(const FwdArgs &a, const sched_plan_cta_t &cta,
                                           uint32_t j, bool small, uint32_t n_heads, uint8_t *smem,
                                           int n_tiles)
{
    using G = WsGeom<D>;
    constexpr int N = G::N;
    constexpr uint32_t NO_TOKEN = 0xffffffffu;
    const int tid = threadIdx.x; /* 0..127 */
    const sched_plan_row_t *rows = a.rows + cta.row_begin;
    const uint32_t group = a.group, n_rows = cta.row_count * group;
    const sched_plan_seg_t *segs = a.segs + cta.seg_begin;
    const uint32_t n_segs = cta.seg_count;
    const T *q = static_cast<const T *>(a.q);
    uint8_t *sq = smem, *ring = smem + G::Q_BYTES;
    const uint32_t full = smem_u32(smem) + G::SMEM - G::BAR_BYTES, empty = full + 8 * G::SLOTS;
    const int stages = small ? G::SLOTS / 2 : G::SLOTS;

    /* Q: tile row r is CTA row r of head j (big), or CTA row r % 64 of head 2j + r / 64 */
    const int q_rows = small ? 64 * (int)n_heads : KCUDA_BIG_M;
    for (int c = tid; c < q_rows * G::CPR; c += KCUDA_THREADS) {
        const int r = c / G::CPR, ch = c % G::CPR;
        const uint32_t rr = small ? r % 64 : r, head = small ? 2 * j + r / 64 : j;
        const T *src = q;
        uint32_t bytes = 0;
        if (rr < n_rows) {
            src = q +
                  ((uint64_t)rows[rr / group].q_tok * a.q_heads + head * group + rr % group) * D +
                  ch * 8;
            bytes = 16;
        }
        cp_async16(smem_u32(sq + wswz<KCUDA_BIG_M>(r, ch)), src, bytes);
    }

    /* page ids two tiles ahead of the loads (fwd_cta's cursor): the producer has nothing to
     * compute while a page-id read is in flight, so one tile ahead would put that read's latency
     * into every tile */
    uint32_t pa[G::LPT], pb[G::LPT];
    uint32_t fk = 0, ft0 = 0, fend = 0, fpage0 = 0;
    const uint32_t *fpages = a.pages;
    auto fetch_seg = [&]() {
        const sched_plan_seg_t sg = segs[fk];
        ft0 = sg.kv_begin;
        fend = sg.kv_end;
        fpage0 = sg.kv_begin / KERN_BLOCK_SIZE;
        fpages = a.pages + sg.page_begin;
    };
    auto fetch_pages = [&](uint32_t(&pg)[G::LPT]) {
#pragma unroll
        for (int k = 0; k < G::LPT; k++) {
            const uint32_t t = ft0 + (tid + k * KCUDA_THREADS) / G::CPR;
            pg[k] = t < fend ? fpages[t / KERN_BLOCK_SIZE - fpage0] * KERN_BLOCK_SIZE +
                                   t % KERN_BLOCK_SIZE
                             : NO_TOKEN;
        }
        ft0 += N;
        if (ft0 >= fend && ++fk < n_segs)
            fetch_seg();
    };
    int st = 0, eph = 0; /* the stage of the next tile, the parity of its empty barrier */
    auto produce = [&](int t, uint32_t(&pg)[G::LPT]) {
        if (t >= stages)
            mb_wait(empty + 8 * st, eph);
        for (uint32_t h = 0; h < n_heads; h++) {
            uint8_t *sk = ring + (small ? 2 * st + (int)h : st) * G::SLOT_BYTES,
                    *sv = sk + G::KV_BYTES;
            const T *kbase =
                static_cast<const T *>(a.kv) + (uint64_t)(small ? 2 * j + h : j) * a.head_stride;
#pragma unroll
            for (int k = 0; k < G::LPT; k++) {
                const int c = tid + k * KCUDA_THREADS, r = c / G::CPR, ch = c % G::CPR;
                const T *ks = kbase, *vs = kbase;
                uint32_t bytes = 0;
                if (pg[k] != NO_TOKEN) {
                    ks = kbase + (uint64_t)(pg[k] / KERN_BLOCK_SIZE) * a.block_stride +
                         (pg[k] % KERN_BLOCK_SIZE) * D + ch * 8;
                    vs = ks + a.v_offset;
                    bytes = 16;
                }
                cp_async16(smem_u32(sk + wswz<N>(r, ch)), ks, bytes);
                cp_async16(smem_u32(sv + wswz<N>(r, ch)), vs, bytes);
            }
        }
        mb_arrive_cp(full + 8 * st); /* tile 0's also covers Q */
        if (t + 2 < n_tiles)
            fetch_pages(pg); /* tile t + 2 */
        if (++st == stages) {
            st = 0;
            eph ^= (t >= stages); /* the first round waits for nothing */
        }
    };
    if (n_tiles) {
        fetch_seg();
        fetch_pages(pa);
        if (n_tiles > 1)
            fetch_pages(pb);
    }
    for (int t = 0; t < n_tiles; t += 2) {
        produce(t, pa);
        if (t + 1 < n_tiles)
            produce(t + 1, pb);
    }
    cp_async_wait<0>();
}

/* One consumer warpgroup: its 64 rows of the CTA for KV head `head` (consumer c, warp-uniform);
 * then its outputs. */
template <typename T, int D>
__device__ __forceinline__ void ws_consume(const FwdArgs &a, const sched_plan_cta_t &cta,
                                           uint32_t head, bool small, int c, uint8_t *smem,
                                           int n_tiles, bool pp)
{
    using G = WsGeom<D>;
    constexpr int N = G::N, NT = N / 8, DT = D / 8;
    const int tid = threadIdx.x % KCUDA_THREADS, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const sched_plan_row_t *rows = a.rows + cta.row_begin;
    const uint32_t group = a.group, n_rows = cta.row_count * group;
    const sched_plan_seg_t *segs = a.segs + cta.seg_begin;
    const uint32_t n_segs = cta.seg_count;
    const uint32_t full = smem_u32(smem) + G::SMEM - G::BAR_BYTES, empty = full + 8 * G::SLOTS;
    const int stages = small ? G::SLOTS / 2 : G::SLOTS;
    const int rb = small ? 0 : 64 * c; /* first CTA row of this warpgroup */

    const int r0 = rb + warp * 16 + g, r1 = r0 + 8;
    const uint32_t row_lim0 = (uint32_t)r0 < n_rows ? rows[r0 / group].limit : 0;
    const uint32_t row_lim1 = (uint32_t)r1 < n_rows ? rows[r1 / group].limit : 0;
    /* the cursor: the tile whose scores are masked next, its segment's limits */
    uint32_t ck = 0, ct0 = 0, cend = 0, lim0 = 0, lim1 = 0;
    auto enter_seg = [&]() {
        const sched_plan_seg_t sg = segs[ck];
        const uint32_t lo = sg.row_lo * group, hi = sg.row_hi * group;
        ct0 = sg.kv_begin;
        cend = sg.kv_end;
        lim0 = (uint32_t)r0 >= lo && (uint32_t)r0 < hi ? min(row_lim0, cend) : 0;
        lim1 = (uint32_t)r1 >= lo && (uint32_t)r1 < hi ? min(row_lim1, cend) : 0;
    };
    auto advance = [&]() {
        ct0 += N;
        if (ct0 >= cend && ++ck < n_segs)
            enter_seg();
    };

    /* Descriptors once: a product's operand is one of these plus a constant offset (16-byte
     * units in the start-address field, which no tile address overflows). Q rows 64c.. of the
     * Q tile; K and V of ring slot 0, a slot SLOT_BYTES further. */
    const uint32_t ring = smem_u32(smem) + G::Q_BYTES;
    const uint64_t qd = wg_desc(smem_u32(smem) + 64 * c * 128, 16, 1024),
                   kd = wg_desc(ring, 16, 1024), vd = wg_desc(ring + G::KV_BYTES, N * 128, 1024);
    /* stage and full-barrier parity of the next tile to compute S for, and of the tile whose
     * P.V runs (released after it) */
    int nst = 0, nph = 0, cst = 0;
    auto slot = [&](int st) {
        return (uint64_t)((small ? 2 * st + c : st) * (G::SLOT_BYTES >> 4));
    };

    float o[DT][4], s[NT][4];
    uint32_t pf[N / 16][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const float sl2 = a.scale * 1.4426950408889634f;
    float(&sw)[4 * NT] = *reinterpret_cast<float(*)[4 * NT]>(&s[0][0]);
    float(&ow)[4 * DT] = *reinterpret_cast<float(*)[4 * DT]>(&o[0][0]);

    auto wait_full = [&]() {
        mb_wait(full + 8 * nst, nph);
        wg_proxy_fence(); /* the producer's copies (made visible by the barrier) reach wgmma */
    };
    /* S = Q.K^T of stage nst (filled: wait_full), one group */
    auto issue_qk = [&]() {
        const uint64_t k0 = kd + slot(nst);
        if (++nst == stages) {
            nst = 0;
            nph ^= 1;
        }
        wg_hold(sw);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++)
            Wg<T>::ss64(sw, qd + (((ks >> 2) * (KCUDA_BIG_M * 128) + (ks & 3) * 32) >> 4),
                        k0 + (((ks >> 2) * (N * 128) + (ks & 3) * 32) >> 4), ks);
        wg_commit();
        wg_hold(sw); /* pinned: nothing may copy them while the products run */
    };
    /* O += P.V of stage cst, one group */
    auto issue_pv = [&]() {
        const uint64_t v0 = vd + slot(cst);
        wg_hold(ow);
        wg_hold_u(pf);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++) {
            if constexpr (D == 64)
                Wg<T>::rs64(ow, pf[kk], v0 + ((kk * 16 * 128) >> 4));
            else
                Wg<T>::rs128(ow, pf[kk], v0 + ((kk * 16 * 128) >> 4));
        }
        wg_commit();
        wg_hold(ow);
        wg_hold_u(pf);
    };
    auto release = [&]() {
        mb_arrive(empty + 8 * cst);
        cst = cst + 1 == stages ? 0 : cst + 1;
    };
    /* scale, softcap, mask (the cursor's tile, which it advances) and the online softmax of s in
     * place: exps in s, l updated; returns O's correction factors for rows r0 and r1. Without a
     * softcap (and with a positive scale) the scale rides in the exponent's FMA: the maximum of
     * the raw scores is taken first, p = 2^(s * scale * log2 e - base), one FFMA and one MUFU per
     * score. The mask is a branch of its own, taken by a warp only where one of its rows ends
     * inside the tile (else the compiler selects every score). */
    const bool plain = !(a.softcap > 0.f) && sl2 > 0.f;
    auto softmax = [&](float &c0, float &c1) {
        if (!plain) {
#pragma unroll
            for (int jn = 0; jn < NT; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[jn][e] = a.softcap > 0.f ? a.softcap * 1.4426950408889634f *
                                                     tanhf(s[jn][e] * a.scale / a.softcap)
                                               : s[jn][e] * sl2;
        }
        if (__any_sync(0xffffffffu, ct0 + N > lim0 || ct0 + N > lim1)) {
#pragma unroll
            for (int jn = 0; jn < NT; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (ct0 + jn * 8 + 2 * tq + (e & 1) >= (e < 2 ? lim0 : lim1))
                        s[jn][e] = -INFINITY;
        }
        advance();
        float tm0 = -INFINITY, tm1 = -INFINITY;
#pragma unroll
        for (int jn = 0; jn < NT; jn++) {
            tm0 = fmaxf(tm0, fmaxf(s[jn][0], s[jn][1]));
            tm1 = fmaxf(tm1, fmaxf(s[jn][2], s[jn][3]));
        }
        tm0 = quad_max(tm0);
        tm1 = quad_max(tm1);
        const float k = plain ? sl2 : 1.f; /* scores still to be scaled by k */
        const float n0 = fmaxf(m0, tm0 * k), n1 = fmaxf(m1, tm1 * k);
        const float b0 = kern_sm_base(n0), b1 = kern_sm_base(n1);
        c0 = ex2(m0 - b0);
        c1 = ex2(m1 - b1);
        m0 = n0;
        m1 = n1;
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int jn = 0; jn < NT; jn++) {
            s[jn][0] = ex2(fmaf(s[jn][0], k, -b0));
            s[jn][1] = ex2(fmaf(s[jn][1], k, -b0));
            s[jn][2] = ex2(fmaf(s[jn][2], k, -b1));
            s[jn][3] = ex2(fmaf(s[jn][3], k, -b1));
            s0 += s[jn][0] + s[jn][1];
            s1 += s[jn][2] + s[jn][3];
        }
        l0 = l0 * c0 + s0;
        l1 = l1 * c1 + s1;
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

    /* Straight-line issue and waits (no wgmma or wait under a condition that differs between
     * tiles: ptxas then cannot tell which group a wait completes and serializes them all), so
     * every tile is computed, also where none of this warpgroup's rows reads it: the limits mask
     * those rows (P = 0). Tile t: S of tile t + 1 is issued before P.V of tile t, and its
     * softmax runs while P.V does (FlashAttention-3's intra-warpgroup overlap); with pp the two
     * consumers take turns to issue, so that one's softmax runs under the other's products. A
     * single tile per step: two (S of 64 x 128, the producer padding to an even count) measured
     * 25 % slower on the tile solver's dense plan (RESULTS.md, 2026-11-25). */
    if (n_tiles == 0)
        goto out;
    enter_seg();
    {
        wait_full();
        issue_qk();
        wg_wait<0>();
        wg_hold(sw);
        float c0, c1;
        softmax(c0, c1);
        rescale_pack(c0, c1); /* O is 0 */
    }
    if (pp && c == 1)
        bar_arrive(4, 2 * KCUDA_THREADS);
    for (int t = 0; t + 1 < n_tiles; t++) {
        wait_full();
        if (pp)
            bar_wait(4 + c, 2 * KCUDA_THREADS);
        issue_qk();
        issue_pv();
        if (pp)
            bar_arrive(5 - c, 2 * KCUDA_THREADS);
        wg_wait<1>(); /* S of tile t + 1; P.V of tile t may still run */
        wg_hold(sw);
        float c0, c1;
        softmax(c0, c1);
        wg_wait<0>();
        wg_hold(ow);
        wg_hold_u(pf);
        release();
        rescale_pack(c0, c1);
    }
    if (pp)
        bar_wait(4 + c, 2 * KCUDA_THREADS);
    issue_pv();
    if (pp)
        bar_arrive(5 - c, 2 * KCUDA_THREADS);
    wg_wait<0>();
    wg_hold(ow);
    release();
out:
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    fwd_rows_out<T, D>(a, rows, head, r0, n_rows, m0, l0, o, 0, tq);
    fwd_rows_out<T, D>(a, rows, head, r1, n_rows, m1, l1, o, 2, tq);
}
#endif /* KCUDA_WGMMA */

/* One layer of a plan with CTAs of up to KCUDA_BIG_M rows (sm_90a, head_dim <= 128,
 * KERN_FWD_AUTO): grid = n_ctas x kv_heads blocks of KCUDA_PAIR_THREADS, dynamic shared memory
 * pair_smem<D>() (see the top of the file). */
template <typename T, int D>
__global__ void __launch_bounds__(KCUDA_PAIR_THREADS, 1) fwd_pair(const FwdArgs a)
{
    extern __shared__ __align__(1024) uint8_t smem[];
#if KCUDA_WGMMA
    if constexpr (D <= 128) {
        using G = WsGeom<D>;
        const uint32_t j = blockIdx.x % a.kv_heads;
        const sched_plan_cta_t cta = a.ctas[blockIdx.x / a.kv_heads];
        const bool small = cta.row_count * a.group <= KCUDA_SMALL_M;
        if (small && 2 * j >= a.kv_heads)
            return;
        const uint32_t n_heads = small ? min(2u, a.kv_heads - 2 * j) : 1;
        const int n_cons = small ? (int)n_heads : 2;
        if (smem_u32(smem) & 1023u)
            __trap(); /* the swizzle needs 1024-byte aligned tiles: a layout bug, never data */
        int n_tiles = 0;
        for (uint32_t k = 0; k < cta.seg_count; k++) {
            const uint32_t len =
                a.segs[cta.seg_begin + k].kv_end - a.segs[cta.seg_begin + k].kv_begin;
            n_tiles += len ? (int)((len + G::N - 1) / G::N) : 1;
        }
        const uint32_t full = smem_u32(smem) + G::SMEM - G::BAR_BYTES, empty = full + 8 * G::SLOTS;
        if (threadIdx.x < G::SLOTS) {
            mb_init(full + 8 * threadIdx.x, KCUDA_THREADS);
            mb_init(empty + 8 * threadIdx.x, n_cons * KCUDA_THREADS);
        }
        __syncthreads(); /* the barriers exist before anyone arrives */
        /* broadcast from lane 0: the compiler then knows it is warp-uniform (descriptors and
         * slot offsets stay in uniform registers) */
        const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / KCUDA_THREADS), 0);
        if (wg == 0) {
            ws_regs_producer();
            ws_produce<T, D>(a, cta, j, small, n_heads, smem, n_tiles);
            return;
        }
        ws_regs_consumer();
        const int c = wg - 1;
        if (c >= n_cons)
            return;
        const uint32_t head = small ? 2 * j + c : j;
        const bool pp = KCUDA_WS_PINGPONG && n_cons == 2;
        ws_consume<T, D>(a, cta, head, small, c, smem, n_tiles, pp);
        if (a.merge_inside) {
            /* the merge list in this warpgroup's own Q rows (64c..: no other reads them) */
            if (small)
                fwd_arrive_merge<T, D>(a, cta, head, smem + c * 8192, threadIdx.x % KCUDA_THREADS,
                                       KCUDA_THREADS, 1 + c);
            else
                fwd_arrive_merge<T, D>(a, cta, head, smem, threadIdx.x - KCUDA_THREADS,
                                       2 * KCUDA_THREADS, 3);
        }
        return;
    }
#endif
    __trap(); /* never launched: the backend uses it only where compiled for sm_90a */
}

} // namespace kcuda

#endif
