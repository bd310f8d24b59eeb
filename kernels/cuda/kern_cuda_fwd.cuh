/*
 * kern_cuda_fwd.cuh — the forward kernel: one launch runs every CTA of a plan for every KV head,
 * and the merge of split tokens happens inside it. Included by one translation
 * unit per head_dim (kern_cuda_fwd_d{64,128,256}.cu).
 *
 * Work items: block b runs plan CTA b / kv_heads for KV head b % kv_heads; the plan lists its CTAs
 * longest first, so the long ones start in the first wave. Each CTA picks the smallest m of the
 * shape set (kern_cuda_shapes.h) that holds its rows; every shape runs with the same 4 warps and
 * shared memory sized for the largest, so one kernel serves them all.
 *
 * Rows: the CTA's query tokens x the GQA group, gathered without padding (row i = token i / group,
 * q head h * group + i % group); rows >= row_count * group are zero and never written.
 *
 * Warps: WM = M / 16 warps own 16 rows each; the WN = 4 / WM warps of a row band split every KV
 * tile's N columns between them (each keeps its own online softmax state), so a 16-row tile still
 * has four warps issuing tensor-core work and all threads load. The WN states are combined once at
 * the end through shared memory.
 *
 * Memory path: K and V of a tile (N tokens, possibly spanning N / 16 pages and unaligned to a
 * page) arrive by 16-byte cp.async into a 2- or 3-stage ring, rows XOR-swizzled by 16-byte chunk
 * so ldmatrix is bank-conflict free; the next tiles' loads are in flight while the current one is
 * computed, and page ids are read one tile before their loads are issued. Tokens past the CTA's
 * range are zero-filled (src-size 0), never read.
 *
 * Math: S = Q.K^T and O += P.V with mma.sync m16n8k16 (fp16 or bf16 in, fp32 accumulate), or,
 * in the KERN_FWD_AUTO kernel on sm_90a, wgmma for CTAs of 33-64 rows and several segments
 * (kern_cuda_wgmma.cuh: one warpgroup, the same loads, softmax and outputs) -- KERN_FWD_LAYER;
 * KERN_FWD_AUTO (the default) runs every CTA on fwd_pair instead where sm_90a code runs at
 * head_dim <= 128, the warp-specialized kernel of kern_cuda_fwd_ws.cuh (a producer warpgroup and
 * two wgmma consumers: CTAs of up to 128 rows, smaller ones two KV heads a block);
 * softmax online in the log2 domain (kern_cuda_softmax.cuh); fully masked rows keep max = -inf
 * and give o = 0 and lse = -inf, never NaN (kern_softmax.h). Output: the final row (dtype) when the
 * row is DIRECT, else an fp32 partial (o normalized, natural-log lse).
 *
 * Merge, two ways (kern_config_t.merge). Inside (TRT-LLM XQA's last-CTA pattern): after writing
 * its partials a CTA adds one arrival per partial row to a counter per (merge entry, KV head),
 * with release/acquire semantics; the CTA that brings a counter to the entry's part_count merges
 * that token's group of q heads (log-sum-exp weights over the parts, read through L2) and resets
 * the counter, so counters are 0 again when the launch ends. Launch: merge_layer, one block per
 * (merge entry, KV head), after the forward. Both run the same merge_elem.
 */
#ifndef KERN_CUDA_FWD_CUH
#define KERN_CUDA_FWD_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>
#include <type_traits>

#include "kern_cuda_int.h"
#include "kern_cuda_fp8.cuh"
#include "kern_cuda_page.cuh"
#include "kern_cuda_ptx.cuh"
#include "kern_cuda_softmax.cuh"
#include "kern_cuda_wgmma.cuh"
#include "kern_softmax.h"

namespace kcuda
{

/* acc += w * x and acc *= s, four lanes at a time (the epilogue and the merge) */
__device__ __forceinline__ void axpy4(float4 &acc, float w, const float4 &x)
{
    acc.x += w * x.x;
    acc.y += w * x.y;
    acc.z += w * x.z;
    acc.w += w * x.w;
}
__device__ __forceinline__ void scale4(float4 &acc, float s)
{
    acc.x *= s;
    acc.y *= s;
    acc.z *= s;
    acc.w *= s;
}

/* ---------------------------------------------------------------- tile geometry */

template <int D, int M> struct Geom {
    static constexpr int N = KCUDA_TILE_N;
    static constexpr int W = KCUDA_THREADS / 32; /* warps */
    static constexpr int T = KCUDA_THREADS;
    static constexpr int WM = M / 16; /* row bands */
    static constexpr int WN = W / WM; /* warps per band, splitting N */
    static constexpr int NW = N / WN; /* KV columns per warp per tile */
    static constexpr int CPR = D / 8; /* 16-byte chunks per row */
    static constexpr int Q_BYTES = M * D * 2;
    static constexpr int KV_BYTES = N * D * 2;       /* K or V of one tile */
    static constexpr int STAGE_BYTES = 2 * KV_BYTES; /* K and V */
    /* 3 stages (two tiles in flight while one is computed) when that still leaves room for two
     * CTAs per SM: a CTA alone on its SM (few, long CTAs) is latency-bound; else 2 */
    static constexpr int STAGES = Q_BYTES + 3 * STAGE_BYTES <= 116 * 1024 ? 3 : 2;
    static constexpr int ERS = D + 8;                        /* epilogue row stride (floats) */
    static constexpr int EPI_BYTES = WN * M * (ERS + 2) * 4; /* acc rows + m + l */
    static constexpr int RING_BYTES = STAGES * STAGE_BYTES;
    static constexpr int SMEM = Q_BYTES + (RING_BYTES > EPI_BYTES ? RING_BYTES : EPI_BYTES);
    /* MMA shape rules: rows in 16-row bands, every warp's column slice a multiple of 16 (one
     * k-step of P.V), head_dim a multiple of 16 and of the 8-chunk swizzle period. */
    static_assert(M % 16 == 0 && WM >= 1 && WM <= W && W % WM == 0, "tile m: 16-row bands");
    static_assert(NW % 16 == 0 && NW >= 16, "each warp owns 16-column slices");
    static_assert(D % 64 == 0, "head_dim: 16-wide k-steps and an 8-chunk swizzle");
    static_assert((N * CPR) % T == 0 && (M * CPR) % T == 0, "loads divide evenly");
    static_assert(M <= KCUDA_MAX_M, "KCUDA_MAX_M bounds the merge list");
};

/* fwd_cta's shared memory for tile m = M (Geom's sizes): the Q tile, then the ring of K and V
 * stages; the epilogue's per-warp rows take the ring's place once the last tile is computed. */
template <int D, int M> struct FwdSmem {
    using G = Geom<D, M>;
    struct Stage {
        uint8_t k[G::KV_BYTES], v[G::KV_BYTES]; /* one tile's K and V (swz or wswz layout) */
    };
    /* the epilogue: row e = w * M + r holds warp column slice w's state of tile row r, its
     * accumulator row unnormalized (ERS floats apart, padded against bank conflicts) */
    struct Epi {
        float acc[G::WN * M][G::ERS];
        float m[G::WN * M], l[G::WN * M];
    };
    uint8_t q[G::Q_BYTES]; /* the Q tile (swz or wswz layout); fwd_arrive_merge's list after */
    union {
        Stage ring[G::STAGES];
        Epi epi;
    };
    /* fwd_cta addresses the ring and the epilogue from ring[0].k by int offsets: stage i's K is
     * STAGE * i bytes after it, its V V_OFF bytes after its K; the epilogue's acc row e is e *
     * ERS floats after it, its m and l EPI_M and EPI_L floats */
    static constexpr int STAGE = (int)sizeof(Stage), V_OFF = (int)offsetof(Stage, v);
    static constexpr int EPI_M = (int)(offsetof(Epi, m) / 4), EPI_L = (int)(offsetof(Epi, l) / 4);
};

/* the shared memory one launch needs: the largest shape's */
template <int D> __host__ __device__ constexpr int fwd_smem()
{
    int s = 0;
#define KCUDA_SMEM(m) s = Geom<D, m>::SMEM > s ? Geom<D, m>::SMEM : s;
    KCUDA_TILE_MS(KCUDA_SMEM)
#undef KCUDA_SMEM
    return s;
}

/* The named barriers (bar.sync / bar.arrive ids, 16 a block) the forwards use, with who syncs on
 * each and how many threads it counts. */
enum Bar : int {
    /* __syncthreads: every thread of the block (fwd_layer's 128, fwd_pair's 384 once after the
     * mbarriers' init); fwd_layer's merge team */
    BAR_BLOCK = 0,
    /* fwd_pair, small item: consumer 0's merge (fwd_arrive_merge), its warpgroup's 128 threads;
     * consumer c's is BAR_MERGE_C0 + c */
    BAR_MERGE_C0 = 1,
    BAR_MERGE_C1 = 2,  /* fwd_pair, small item: consumer 1's merge, its 128 threads */
    BAR_MERGE_BIG = 3, /* fwd_pair, big item: the merge of both consumers, 256 threads */
    /* fwd_pair's issue turns (KCUDA_WS_PINGPONG), 256 threads each: consumer 0 syncs on
     * BAR_TURN_C0 before it issues and consumer 1 arrives once its own issue is done; BAR_TURN_C1
     * the other way round (consumer c takes BAR_TURN_C0 + c and passes BAR_TURN_C1 - c) */
    BAR_TURN_C0 = 4,
    BAR_TURN_C1 = 5,
    /* fwd_pair's producer warpgroup, 128 threads: around thread 0's broadcast of the next item */
    BAR_PRODUCER = 6,
};

/* A barrier of the nth threads that run one CTA: the whole block (team BAR_BLOCK) or the consumer
 * warpgroups of fwd_pair (named barrier `team`: BAR_MERGE_*). */
__device__ __forceinline__ void team_sync(int team, uint32_t nth)
{
    if (team == BAR_BLOCK)
        __syncthreads();
    else
        bar_sync(team, (int)nth);
}

/* byte offset of 16-byte chunk c of row r in a swizzled [rows][D] tile */
template <int D> __device__ __forceinline__ uint32_t swz(int r, int c)
{
    return static_cast<uint32_t>((r * (D / 8) + (c ^ (r & 7))) * 16);
}

/* Row r's output from the accumulators of the thread holding it (half e of each o[j]: 0 for row
 * g of the band, 2 for row g + 8), written as the final row or as a partial. */
template <typename T, int D>
__device__ __forceinline__ void fwd_rows_out(const FwdArgs &a, const sched_plan_row_t *rows,
                                             uint32_t head, int r, uint32_t n_rows, float m,
                                             float l, const float (&o)[D / 8][4], int e, int tq)
{
    if ((uint32_t)r >= n_rows)
        return;
    const float inv = kern_sm_inv(l) * a.v_scale; /* an fp8 pool's V factor rides here */
    const sched_plan_row_t row = rows[r / a.group];
    const uint32_t j = r % a.group;
    if (row.merge == SCHED_ROW_DIRECT) {
        T *dst = static_cast<T *>(a.o) + ((uint64_t)row.q_tok * a.q_heads + head * a.group + j) * D;
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            *reinterpret_cast<uint32_t *>(dst + i * 8 + 2 * tq) =
                Mma<T>::pack(o[i][e] * inv, o[i][e + 1] * inv);
    } else {
        const uint64_t slot = ((uint64_t)row.dst * a.kv_heads + head) * a.group + j;
        float *dst = a.part_o + slot * D;
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            *reinterpret_cast<float2 *>(dst + i * 8 + 2 * tq) =
                make_float2(o[i][e] * inv, o[i][e + 1] * inv);
        if (tq == 0)
            a.part_lse[slot] = kern_sm_lse(m, l, KERN_LN2);
    }
}

/* ---------------------------------------------------------------- the kernel's stages */

/* where chunk c of row r of an R-row tile of fwd_cta goes: wgmma's swizzle (WG) or swz */
template <int D, int R, bool WG> __device__ __forceinline__ uint32_t fwd_off(int r, int c)
{
    return WG ? wswz<R>(r, c) : swz<D>(r, c);
}

/* An fp8 pool's tiles (kern_model_t.kv_dtype; KV: the format) reach shared memory as raw bytes and
 * are decoded there into T, in place, by the threads that copied them. A copy is 16 elements of a
 * row (row r, elements 16i..16i+15: the tile's chunks 2i and 2i + 1 once decoded), placed where
 * one of those two chunks goes (at): no copy lands where another thread's decoded chunks go, so
 * a thread decodes its own copies once they have landed with no barrier between it and the
 * others. at() is chunk 2i + 1 for every other run of four copies of a row: the eight copies of a
 * 128-byte stretch then fall in the eight 16-byte columns of either swizzle (no bank conflicts,
 * for the copies and the decode's first stores). */
template <int D> struct Raw8 {
    static constexpr int PPR = D / 16;                             /* copies a row */
    static constexpr int PER = KCUDA_TILE_N * PPR / KCUDA_THREADS; /* a thread's, K (and V) */
    static_assert(KCUDA_TILE_N * PPR % KCUDA_THREADS == 0, "copies divide evenly");
    int r, i;
    __device__ __forceinline__ Raw8(int tid, int e)
    {
        const int c = tid + e * KCUDA_THREADS;
        r = c / PPR;
        i = c % PPR;
    }
    __device__ __forceinline__ int at() const /* the chunk where the copy lands */
    {
        return 2 * i + ((i >> 2) & 1);
    }
    __device__ __forceinline__ int other() const
    {
        return 2 * i + 1 - ((i >> 2) & 1);
    }
};

/* A thread's copies of one KV tile (N rows, K at base, V KV_BYTES further; the wgmma swizzle
 * where WG, else swz), decoded into T (kern_cuda_fp8.cuh) and written as their two chunks: the
 * one where the copy lay first, then the other. The caller has waited for its copies. */
template <typename T, int D, int KV, bool WG>
__device__ __forceinline__ void kv8_decode(uint32_t base, int tid)
{
    constexpr int N = KCUDA_TILE_N, LPT8 = Raw8<D>::PER;
    constexpr uint32_t KVB = N * D * 2;
#pragma unroll
    for (int h = 0; h < (KCUDA_FP8_DECODE ? 2 : 0); h++) { /* K, then V */
        const uint32_t b = base + h * KVB;
        uint4 x[LPT8];
#pragma unroll
        for (int e = 0; e < LPT8; e++) {
            const Raw8<D> w(tid, e);
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(x[e].x), "=r"(x[e].y), "=r"(x[e].z), "=r"(x[e].w)
                         : "r"(b + fwd_off<D, N, WG>(w.r, w.at()))
                         : "memory");
        }
#pragma unroll
        for (int e = 0; e < LPT8; e++) {
            const Raw8<D> w(tid, e);
            uint4 lo, hi; /* chunks 2i and 2i + 1 */
            fp8x16_to<T, KV>(x[e], lo, hi);
            const bool odd = w.at() & 1;
            const uint4 first = odd ? hi : lo, second = odd ? lo : hi;
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                             b + fwd_off<D, N, WG>(w.r, w.at())),
                         "r"(first.x), "r"(first.y), "r"(first.z), "r"(first.w)
                         : "memory");
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                             b + fwd_off<D, N, WG>(w.r, w.other())),
                         "r"(second.x), "r"(second.y), "r"(second.z), "r"(second.w)
                         : "memory");
        }
    }
}

/* fwd_cta's Q rows into the Q tile sq, gathered: row i = token i / group, q head
 * h * group + i % group; rows >= n_rows zero-filled. Every row's token is read before the first
 * copy is issued: a copy is an asm statement that clobbers memory, so a read after it waits for
 * its own round trip, one per chunk */
template <typename T, int D, int M, bool WG>
__device__ __forceinline__ void fwd_load_q(const FwdArgs &a, const sched_plan_row_t *rows,
                                           uint32_t n_rows, uint32_t head, uint8_t *sq, int tid)
{
    using G = Geom<D, M>;
    const uint32_t group = a.group;
    const T *q = static_cast<const T *>(a.q);
    constexpr int QPT = M * G::CPR / G::T;
    static_assert(M * G::CPR % G::T == 0, "Q chunks divide evenly");
    uint32_t qtok[QPT];
#pragma unroll
    for (int e = 0; e < QPT; e++) {
        const uint32_t r = (uint32_t)(tid + e * G::T) / G::CPR;
        qtok[e] = r < n_rows ? rows[r / group].q_tok : 0u;
    }
#pragma unroll
    for (int e = 0; e < QPT; e++) {
        const int c = tid + e * G::T, r = c / G::CPR, ch = c % G::CPR;
        const T *src = q;
        uint32_t bytes = 0;
        if ((uint32_t)r < n_rows) {
            const uint32_t qh = head * group + r % group;
            src = q + ((uint64_t)qtok[e] * a.q_heads + qh) * D + ch * 8;
            bytes = 16;
        }
        cp_async16(smem_u32(sq + fwd_off<D, M, WG>(r, ch)), src, bytes);
    }
}

/* fwd_cta's compute cursor: the segment whose tiles are computed (ck, its tokens from ct0 to
 * cend), the effective limits of this thread's two rows in it (0 for a row the segment is not
 * read by), and whether the rows that compute together (a warp's band, or a warpgroup's 64 rows)
 * read it at all: a band none of whose rows reads the segment skips its tiles (tensor-core work,
 * softmax), loading only */
struct SegRows {
    uint32_t ck = 0, ct0 = 0, cend = 0, lim0 = 0, lim1 = 0;
    bool band = false;
    template <bool WG>
    __device__ __forceinline__ void enter(const sched_plan_seg_t *segs, uint32_t group, int r0,
                                          int r1, uint32_t row_lim0, uint32_t row_lim1, int wm,
                                          uint32_t n_rows)
    {
        const sched_plan_seg_t sg = segs[ck];
        const uint32_t lo = sg.row_lo * group, hi = sg.row_hi * group;
        ct0 = sg.kv_begin;
        cend = sg.kv_end;
        lim0 = (uint32_t)r0 >= lo && (uint32_t)r0 < hi ? min(row_lim0, cend) : 0;
        lim1 = (uint32_t)r1 >= lo && (uint32_t)r1 < hi ? min(row_lim1, cend) : 0;
        const uint32_t b0 = WG ? 0 : wm * 16, b1 = b0 + (WG ? 64 : 16);
        band = lo < b1 && hi > b0 && b0 < n_rows;
    }
};

/* S = Q.K^T of this warp's band (mma.sync: its columns from cb) or of the warpgroup's 64 rows
 * (WG: wgmma, 128-byte rows inside each 64-column block) */
template <typename T, int D, int M, bool WG, int NT>
__device__ __forceinline__ void fwd_qk(float (&s)[NT][4], const uint8_t *sq, const uint8_t *sk,
                                       int wm, int cb, int lane)
{
#pragma unroll
    for (int j = 0; j < NT; j++)
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#if KCUDA_WGMMA
    if constexpr (WG) {
        constexpr int N = Geom<D, M>::N;
        float(&sw)[4 * NT] = *reinterpret_cast<float(*)[4 * NT]>(&s[0][0]);
        const uint32_t qa = smem_u32(sq), ka = smem_u32(sk);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++)
            Wg<T>::ss64(sw, wg_desc(qa + (ks >> 2) * (M * 128) + (ks & 3) * 32, 16, 1024),
                        wg_desc(ka + (ks >> 2) * (N * 128) + (ks & 3) * 32, 16, 1024), ks);
        wg_commit();
        wg_wait<0>();
        wg_hold(sw);
    } else
#endif
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t af[4];
            ldsm_x4(smem_u32(sq + swz<D>(wm * 16 + (lane & 15), 2 * ks + (lane >> 4))), af[0],
                    af[1], af[2], af[3]);
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                uint32_t b0, b1, b2, b3;
                const int kr = cb + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                ldsm_x4(smem_u32(sk + swz<D>(kr, 2 * ks + ((lane >> 3) & 1))), b0, b1, b2, b3);
                Mma<T>::run(s[j], af, b0, b1);
                Mma<T>::run(s[j + 1], af, b2, b3);
            }
        }
}

/* Scale, softcap and mask (token t0 + j is this thread's column j of the tile; limits lim0 and
 * lim1, none where the whole slice of NW columns is below both), log2 domain; then the online
 * softmax: O rescaled, probabilities in s (RowSoftmax: fwd_cta's exp2f form) */
template <int NW, int NT, int DT>
__device__ __forceinline__ void fwd_softmax(float (&s)[NT][4], float (&o)[DT][4], RowSoftmax &rs,
                                            const FwdArgs &a, float sl2, uint32_t t0, uint32_t lim0,
                                            uint32_t lim1, int tq)
{
    const bool full = t0 + NW <= lim0 && t0 + NW <= lim1;
    float tm0 = -INFINITY, tm1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = s[j][e];
            if (a.softcap > 0.f)
                v = a.softcap * 1.4426950408889634f * tanhf(v * a.scale / a.softcap);
            else
                v *= sl2;
            if (!full) {
                const uint32_t t = t0 + j * 8 + 2 * tq + (e & 1);
                if (t >= (e < 2 ? lim0 : lim1))
                    v = -INFINITY;
            }
            s[j][e] = v;
        }
        tm0 = fmaxf(tm0, fmaxf(s[j][0], s[j][1]));
        tm1 = fmaxf(tm1, fmaxf(s[j][2], s[j][3]));
    }
    float b0, b1, c0, c1;
    rs.rebase<Exp2f>(tm0, tm1, 1.f, b0, b1, c0, c1);
    rs.scale_sums(c0, c1);
    rescale_rows(o, c0, c1);
    rs.add_exp2f(s, b0, b1);
}

/* O += P.V: P straight from the S accumulators (the C layout of two n8 tiles is the A layout of
 * one k16 step); mma.sync over this warp's columns from cb, or wgmma (WG) */
template <typename T, int D, int M, bool WG, int NT, int DT>
__device__ __forceinline__ void fwd_pv(float (&o)[DT][4], const float (&s)[NT][4],
                                       const uint8_t *sv, int cb, int lane)
{
    using G = Geom<D, M>;
#if KCUDA_WGMMA
    if constexpr (WG) {
        constexpr int N = G::N;
        float(&ow)[4 * DT] = *reinterpret_cast<float(*)[4 * DT]>(&o[0][0]);
        const uint32_t va = smem_u32(sv);
        uint32_t pf[N / 16][4]; /* every A fragment before the fence: none moves after */
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++)
            pack_p<T>(pf[kk], s[2 * kk], s[2 * kk + 1]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++) {
            /* 16 tokens = two 8-row groups (1024 bytes apart); 64-wide D blocks are a whole tile
             * (N rows of 128 bytes) apart */
            const uint64_t vd = wg_desc(va + kk * 16 * 128, N * 128, 1024);
            if constexpr (D == 64)
                Wg<T>::rs64(ow, pf[kk], vd);
            else
                Wg<T>::rs128(ow, pf[kk], vd);
        }
        wg_commit();
        wg_wait<0>();
        wg_hold(ow);
    } else
#endif
#pragma unroll
        for (int kk = 0; kk < G::NW / 16; kk++) {
            uint32_t pf[4];
            pack_p<T>(pf, s[2 * kk], s[2 * kk + 1]);
            const int vr = cb + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
            for (int dn = 0; dn < D / 16; dn++) {
                uint32_t v0, v1, v2, v3;
                ldsm_x4_t(smem_u32(sv + swz<D>(vr, 2 * dn + (lane >> 4))), v0, v1, v2, v3);
                Mma<T>::run(o[2 * dn], pf, v0, v1);
                Mma<T>::run(o[2 * dn + 1], pf, v2, v3);
            }
        }
}

/* fwd_cta's epilogue on mma.sync: each warp's (m, l, acc) of its column slice into shared memory
 * (FwdSmem::Epi in the ring's place), then every row combined over the WN slices and written as
 * the final row or a partial */
template <typename T, int D, int M, int DT>
__device__ __forceinline__ void
fwd_combine(const FwdArgs &a, const sched_plan_row_t *rows, uint32_t head, uint32_t group,
            uint32_t n_rows, uint8_t *ring, const float (&o)[DT][4], const RowSoftmax &rs, int wn,
            int r0, int r1, int tq, int tid)
{
    using G = Geom<D, M>;
    using Smem = FwdSmem<D, M>;
    float *ea = reinterpret_cast<float *>(ring), *em = ea + Smem::EPI_M, *el = ea + Smem::EPI_L;
    {
        const int e0 = wn * M + r0, e1 = wn * M + r1;
#pragma unroll
        for (int i = 0; i < DT; i++) {
            *reinterpret_cast<float2 *>(ea + e0 * G::ERS + i * 8 + 2 * tq) =
                make_float2(o[i][0], o[i][1]);
            *reinterpret_cast<float2 *>(ea + e1 * G::ERS + i * 8 + 2 * tq) =
                make_float2(o[i][2], o[i][3]);
        }
        if (tq == 0) {
            em[e0] = rs.m0;
            el[e0] = rs.l0;
            em[e1] = rs.m1;
            el[e1] = rs.l1;
        }
    }
    __syncthreads();

    constexpr int V4 = D / 4;
    for (int e = tid; e < (int)n_rows * V4; e += G::T) {
        const int r = e / V4, v = e % V4;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < G::WN; w++)
            mx = fmaxf(mx, em[w * M + r]);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float lsum = 0.f;
        if (mx > -INFINITY) {
#pragma unroll
            for (int w = 0; w < G::WN; w++) {
                const float wt = exp2f(em[w * M + r] - mx);
                const float4 p =
                    *reinterpret_cast<const float4 *>(ea + (w * M + r) * G::ERS + 4 * v);
                lsum += wt * el[w * M + r];
                axpy4(acc, wt, p);
            }
        }
        scale4(acc, kern_sm_inv(lsum) * a.v_scale);
        const sched_plan_row_t row = rows[r / group];
        const uint32_t j = r % group;
        if (row.merge == SCHED_ROW_DIRECT) {
            store4(static_cast<T *>(a.o) +
                       ((uint64_t)row.q_tok * a.q_heads + head * group + j) * D + 4 * v,
                   acc);
        } else {
            const uint64_t slot = ((uint64_t)row.dst * a.kv_heads + head) * group + j;
            reinterpret_cast<float4 *>(a.part_o + slot * D)[v] = acc;
            if (v == 0)
                a.part_lse[slot] = kern_sm_lse(mx, lsum, KERN_LN2);
        }
    }
}

/* ---------------------------------------------------------------- the kernel */

/* One plan CTA for one KV head with tile m = M: attention over its segments, then the direct
 * outputs and partials. Every thread of the block calls it. SEGS: several segments (the band
 * skip and the segment cursor); a CTA of one segment runs the loop without them (its row range
 * still masks). WG: the four warps are one warpgroup of 64 rows and the matrix products are
 * wgmma (kern_cuda_wgmma.cuh; head_dim <= 128, sm_90a); the tiles use wgmma's swizzle and the
 * rows are written straight from the accumulators. */
template <typename T, int D, int M, bool SEGS, bool WG = false, int KV = 0>
__device__ __forceinline__ void fwd_cta(const FwdArgs &a, const kcuda_cta_t &cta, uint32_t head,
                                        uint8_t *smem)
{
    using G = Geom<D, M>;
    constexpr int N = G::N;
    static_assert(!WG || (KCUDA_WGMMA && M == 64 && D <= 128 && N == 64),
                  "the wgmma path: a warpgroup of 64 rows, 64-token tiles");
    using Smem = FwdSmem<D, M>;
    static_assert(sizeof(Smem) == G::SMEM && offsetof(Smem, ring) == G::Q_BYTES &&
                      Smem::STAGE == G::STAGE_BYTES && Smem::V_OFF == G::KV_BYTES &&
                      sizeof(Smem::ring) == G::RING_BYTES &&
                      sizeof(typename Smem::Epi) == G::EPI_BYTES &&
                      Smem::EPI_M == G::WN * M * G::ERS && Smem::EPI_L == Smem::EPI_M + G::WN * M,
                  "fwd_cta's layout: Q tile, then the ring or the epilogue");
    Smem &sm = *reinterpret_cast<Smem *>(smem);
    uint8_t *sq = sm.q;
    uint8_t *ring = sm.ring[0].k;
    if (WG && (smem_u32(smem) & 1023u))
        __trap(); /* the swizzle needs 1024-byte aligned tiles: a layout bug, never data */

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wm = warp % G::WM, wn = warp / G::WM;
    const sched_plan_row_t *rows = a.rows + cta.row_begin;
    const uint32_t group = a.group, n_rows = cta.row_count * group;
    const sched_plan_seg_t *segs = a.segs + cta.seg_begin;
    const uint32_t n_segs = cta.seg_count;
    const T *kbase = static_cast<const T *>(a.kv) + (uint64_t)head * a.head_stride;

    fwd_load_q<T, D, M, WG>(a, rows, n_rows, head, sq, tid);
    const int n_tiles = seg_tiles<N>(segs, n_segs);

    /* The page cursor. Page ids are fetched one tile before the tile's loads are issued, so the
     * dependent pages[] read never stalls the issue of the copies. Fetches run in tile order over
     * the segments; each leaves, per load, block * KERN_BLOCK_SIZE + offset (PAGE_NONE past the
     * end). The segment being fetched (fk) keeps its end, pages and first page in registers.
     * Lambdas over fwd_cta's locals: as a struct of its own the cursor compiled to branches around
     * the stores to pg. A load's address is kv_chunk's (kern_cuda_page.cuh), spelled out: through
     * kv_chunk or copy_kv_chunk, fwd_layer took more registers (d128: 229 -> 233) or spilled
     * more (d256). */
    /* 16-byte K (and V) loads per thread per tile: each a chunk of a row, or (an fp8 pool, KV)
     * two (Raw8) */
    constexpr int PPR = KV ? Raw8<D>::PPR : G::CPR; /* loads a row */
    constexpr int LPT = N * PPR / G::T;
    static_assert(N * PPR % G::T == 0, "loads divide evenly");
    uint32_t pg[LPT];
    uint32_t fk = 0, ft0 = 0, fend = 0, fpage0 = 0;
    const uint32_t *fpages = a.pages;
    auto fetch_seg = [&]() {
        const sched_plan_seg_t sg = segs[fk];
        ft0 = sg.kv_begin;
        fend = sg.kv_end;
        fpage0 = sg.kv_begin / KERN_BLOCK_SIZE;
        fpages = a.pages + sg.page_begin;
    };
    if (n_segs)
        fetch_seg();
    auto fetch_pages = [&]() {
#pragma unroll
        for (int k = 0; k < LPT; k++) {
            const uint32_t t = ft0 + (tid + k * G::T) / PPR;
            pg[k] = t < fend ? fpages[t / KERN_BLOCK_SIZE - fpage0] * KERN_BLOCK_SIZE +
                                   t % KERN_BLOCK_SIZE
                             : PAGE_NONE;
        }
        ft0 += N;
        if (ft0 >= fend && ++fk < n_segs)
            fetch_seg();
    };
    auto load_tile = [&](int it) {
        uint8_t *sk = ring + (it % G::STAGES) * Smem::STAGE, *sv = sk + Smem::V_OFF;
        if constexpr (KV != 0) {
            const uint8_t *kb8 =
                static_cast<const uint8_t *>(a.kv) + (uint64_t)head * a.head_stride;
#pragma unroll
            for (int k = 0; k < LPT; k++) {
                const Raw8<D> w(tid, k);
                const uint8_t *ks = kb8, *vs = kb8;
                uint32_t bytes = 0;
                if (pg[k] != PAGE_NONE) {
                    ks = kb8 + (uint64_t)(pg[k] / KERN_BLOCK_SIZE) * a.block_stride +
                         (pg[k] % KERN_BLOCK_SIZE) * D + w.i * 16;
                    vs = ks + a.v_offset;
                    bytes = 16;
                }
                cp_async16(smem_u32(sk + fwd_off<D, N, WG>(w.r, w.at())), ks, bytes);
                cp_async16(smem_u32(sv + fwd_off<D, N, WG>(w.r, w.at())), vs, bytes);
            }
        } else {
#pragma unroll
            for (int k = 0; k < LPT; k++) {
                const int c = tid + k * G::T, r = c / G::CPR, ch = c % G::CPR;
                const T *ks = kbase, *vs = kbase;
                uint32_t bytes = 0;
                if (pg[k] != PAGE_NONE) {
                    ks = kbase + (uint64_t)(pg[k] / KERN_BLOCK_SIZE) * a.block_stride +
                         (pg[k] % KERN_BLOCK_SIZE) * D + ch * 8;
                    vs = ks + a.v_offset;
                    bytes = 16;
                }
                cp_async16(smem_u32(sk + fwd_off<D, N, WG>(r, ch)), ks, bytes);
                cp_async16(smem_u32(sv + fwd_off<D, N, WG>(r, ch)), vs, bytes);
            }
        }
    };

#pragma unroll
    for (int st = 0; st < G::STAGES - 1; st++) {
        if (st < n_tiles) {
            fetch_pages();
            load_tile(st);
        }
        cp_async_commit(); /* group 0 also holds Q */
    }
    if (G::STAGES - 1 < n_tiles)
        fetch_pages();

    /* this thread's two rows of its band and their causal limits */
    const int g = lane >> 2, tq = lane & 3;
    const int r0 = wm * 16 + g, r1 = r0 + 8;
    const uint32_t row_lim0 = (uint32_t)r0 < n_rows ? rows[r0 / group].limit : 0;
    const uint32_t row_lim1 = (uint32_t)r1 < n_rows ? rows[r1 / group].limit : 0;
    SegRows cur;
    if (n_tiles)
        cur.enter<WG>(segs, group, r0, r1, row_lim0, row_lim1, wm, n_rows);

    constexpr int NT = G::NW / 8; /* n8 tiles of S per warp */
    constexpr int DT = D / 8;     /* n8 tiles of O */
    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    RowSoftmax rs;
    const float sl2 = a.scale * 1.4426950408889634f;

    /* The pipelined loop: tile it computed while tiles it + 1 .. it + STAGES - 1 load */
    for (int it = 0; it < n_tiles; it++) {
        const int nx = it + G::STAGES - 1;
        if (nx < n_tiles)
            load_tile(nx); /* into the slot computed in iteration it - 1 */
        cp_async_commit();
        if (it + G::STAGES < n_tiles)
            fetch_pages();
        /* one warpgroup computes every band: its row limits mask */
        const bool work = !SEGS || WG || cur.band;
        cp_async_wait<G::STAGES - 1>();
        if constexpr (KV != 0) /* this thread's copies of the tile, decoded (kv8_decode) */
            kv8_decode<T, D, KV, WG>(smem_u32(ring + (it % G::STAGES) * Smem::STAGE), tid);
#if KCUDA_WGMMA
        if constexpr (WG)
            wg_proxy_fence(); /* this thread's copies become visible to wgmma's reads */
#endif
        __syncthreads();
        if (work) {
            const uint8_t *sk = ring + (it % G::STAGES) * Smem::STAGE, *sv = sk + Smem::V_OFF;
            const int cb = wn * G::NW; /* first column of this warp in the tile */
            float s[NT][4];
            fwd_qk<T, D, M, WG>(s, sq, sk, wm, cb, lane);
            fwd_softmax<G::NW>(s, o, rs, a, sl2, cur.ct0 + cb, cur.lim0, cur.lim1, tq);
            fwd_pv<T, D, M, WG>(o, s, sv, cb, lane);
        }
        __syncthreads(); /* the stage is refilled by the next iteration's loads */
        cur.ct0 += N;
        if (SEGS && cur.ct0 >= cur.cend && ++cur.ck < n_segs)
            cur.enter<WG>(segs, group, r0, r1, row_lim0, row_lim1, wm, n_rows);
    }
    cp_async_wait<0>();
    __syncthreads();

    rs.finish();
    if constexpr (WG) {
        /* one warp holds whole rows: straight from the accumulators */
        fwd_rows_out<T, D>(a, rows, head, r0, n_rows, rs.m0, rs.l0, o, 0, tq);
        fwd_rows_out<T, D>(a, rows, head, r1, n_rows, rs.m1, rs.l1, o, 2, tq);
        return;
    }
    fwd_combine<T, D, M>(a, rows, head, group, n_rows, ring, o, rs, wn, r0, r1, tq, tid);
}

/* One float4 of one merged row: element e < group x D/4 of token mg for KV head `head`
 * (log-sum-exp weights over the parts, read through L2: other CTAs wrote them). */
template <typename T, int D>
__device__ __forceinline__ void merge_elem(const FwdArgs &a, const sched_plan_merge_t &mg,
                                           uint32_t head, uint32_t e)
{
    constexpr uint32_t V4 = D / 4;
    const uint32_t group = a.group, v = e % V4, j = e / V4;
    const uint64_t slot0 = ((uint64_t)mg.part_begin * a.kv_heads + head) * group + j;
    const uint64_t step = (uint64_t)a.kv_heads * group; /* slot p+1 of the same row */
    float mx = -INFINITY;
    for (uint32_t p = 0; p < mg.part_count; p++)
        mx = fmaxf(mx, __ldcg(a.part_lse + slot0 + p * step));
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
    for (uint32_t p = 0; p < mg.part_count; p++) {
        const uint64_t slot = slot0 + p * step;
        const float w = kern_sm_weight(__ldcg(a.part_lse + slot), mx);
        const float4 x = __ldcg(reinterpret_cast<const float4 *>(a.part_o + slot * D) + v);
        wsum += w;
        axpy4(acc, w, x);
    }
    scale4(acc, kern_sm_inv(wsum));
    store4(static_cast<T *>(a.o) + ((uint64_t)mg.q_tok * a.q_heads + head * group + j) * D + 4 * v,
           acc);
}

/* fwd_arrive_merge's list: the merge entries whose last part this CTA's arrivals brought in, at
 * most one per token. In dynamic shared memory the caller lends (fwd_layer: the Q tile, whose
 * last use is behind the merge's first barrier; fwd_pair: one per consumer, WsMeta), never static
 * shared memory, so that the dynamic tiles start 1024-aligned. */
struct MergeList {
    uint32_t entry[KCUDA_MAX_M];
    uint32_t count;
};

/* The arrivals of a CTA's partial rows and, for every token whose last part this CTA wrote, the
 * merge of that token's group of q heads for this KV head (see the top of the file). The CTA's
 * team: nth threads from thread tid 0, barrier `team` (team_sync). */
template <typename T, int D>
__device__ __forceinline__ void fwd_arrive_merge(const FwdArgs &a, const kcuda_cta_t &cta,
                                                 uint32_t head, MergeList &ml, uint32_t tid,
                                                 uint32_t nth, int team)
{
    /* merge entries to run, at most one per token, in the Q tile's space (its last use is behind
     * the barrier below): no static shared memory, so the dynamic tiles start 1024-aligned */
    const sched_plan_row_t *rows = a.rows + cta.row_begin;
    if (tid == 0)
        ml.count = 0;
    /* every thread's partials are written (CTA scope); the arrival below is a release at GPU
     * scope, which by cumulativity publishes them all, and its acquire half orders the merge's
     * reads after the other CTAs' arrivals: one acq_rel atomic per arriving row instead of a
     * sequentially-consistent __threadfence in every thread */
    team_sync(team, nth);
    for (uint32_t r = tid; r < cta.row_count; r += nth) {
        const uint32_t mi = rows[r].merge;
        if (mi == SCHED_ROW_DIRECT)
            continue;
        uint32_t *ctr = a.arrivals + (uint64_t)mi * a.kv_heads + head;
        if (atom_add1_acq_rel(ctr) + 1 == a.merges[mi].part_count) {
            *ctr = 0; /* every part is in: ready for the next launch */
            ml.entry[atomicAdd(&ml.count, 1u)] = mi;
        }
    }
    team_sync(team, nth);
    const uint32_t n = ml.count;
    if (n == 0)
        return;
    constexpr uint32_t V4 = D / 4;
    for (uint32_t e = tid; e < n * a.group * V4; e += nth)
        merge_elem<T, D>(a, a.merges[ml.entry[e / (V4 * a.group)]], head, e % (V4 * a.group));
}

/* One plan CTA of at most KCUDA_SMALL_M rows for one KV head on the block's 4 warps (smem:
 * fwd_smem<D>() bytes). WGK (KERN_FWD_AUTO): CTAs of more than 32 rows and several segments
 * use wgmma where compiled for sm_90a at head_dim <= 128: measured 11 % faster on TREE plans and
 * 3 % slower on one-segment packs (tests/bench/log/2026-11-24-wgmma-tree.md). */
template <typename T, int D, bool WGK, int KV>
__device__ __forceinline__ void fwd_small(const FwdArgs &a, const kcuda_cta_t &cta, uint32_t head,
                                          uint8_t *smem)
{
    const uint32_t rows = cta.row_count * a.group, tid = threadIdx.x;
    if (a.invariant) { /* one kernel for every CTA: each warp a band of 16 rows, all 64 columns */
        fwd_cta<T, D, 64, true, false, KV>(a, cta, head, smem);
        if (a.merge_inside)
            fwd_arrive_merge<T, D>(a, cta, head, *reinterpret_cast<MergeList *>(smem), tid,
                                   KCUDA_THREADS, BAR_BLOCK);
        return;
    }
#if KCUDA_WGMMA
    if constexpr (WGK && D <= 128) {
        if (rows > 32 && cta.seg_count > 1) {
            fwd_cta<T, D, 64, true, true, KV>(a, cta, head, smem);
            if (a.merge_inside)
                fwd_arrive_merge<T, D>(a, cta, head, *reinterpret_cast<MergeList *>(smem), tid,
                                       KCUDA_THREADS, BAR_BLOCK);
            return;
        }
    }
#endif
    /* the smallest m that holds the rows (the plan's check bounds them) */
#define KCUDA_CASE(m)                                                                              \
    if (rows <= (m)) {                                                                             \
        if (cta.seg_count > 1)                                                                     \
            fwd_cta<T, D, m, true, false, KV>(a, cta, head, smem);                                 \
        else                                                                                       \
            fwd_cta<T, D, m, false, false, KV>(a, cta, head, smem);                                \
        if (a.merge_inside)                                                                        \
            fwd_arrive_merge<T, D>(a, cta, head, *reinterpret_cast<MergeList *>(smem), tid,        \
                                   KCUDA_THREADS, BAR_BLOCK);                                      \
        return;                                                                                    \
    }
    KCUDA_TILE_MS(KCUDA_CASE)
#undef KCUDA_CASE
}

/* One layer of a plan whose CTAs have at most KCUDA_SMALL_M rows: grid = n_ctas x kv_heads blocks
 * of KCUDA_THREADS, dynamic shared memory fwd_smem<D>(). A kernel per WGK, so that the mma.sync
 * kernel's registers stay its own. */
template <typename T, int D, bool WGK, int KV = 0>
__global__ void __launch_bounds__(KCUDA_THREADS) fwd_layer(const FwdArgs a)
{
    extern __shared__ __align__(1024) uint8_t smem[];
    dep_wait();
    /* the merge's blocks are placed once this grid's last wave has started, beside its blocks
     * (small ones: measured faster, unlike fwd_pair's; tests/bench/log/2026-11-28-merge-pdl.md) */
    dep_launch_dependents();
    fwd_small<T, D, WGK, KV>(a, a.ctas[blockIdx.x / a.kv_heads], blockIdx.x % a.kv_heads, smem);
}

} // namespace kcuda

#include "kern_cuda_fwd_ws.cuh" /* fwd_pair: it uses the pieces above */

/* The pair kernel fwd_prepare registers: fwd_pair<T, D> (WS_FULL), or in tests/gpu/ablate.sh's
 * timing builds (nvcc -DKCUDA_ABLATE=i) fwd_pair<T, D, WsAblate(i)> (kern_cuda_fwd_ablate.cuh) */
#ifdef KCUDA_ABLATE
#include "kern_cuda_fwd_ablate.cuh"
#else
namespace kcuda
{
template <typename T, int D, int KV> constexpr auto pair_kernel()
{
    return fwd_pair<T, D, WS_FULL, KV>;
}
} // namespace kcuda
#endif

namespace kcuda
{

/* The merge as a launch of its own (KERN_MERGE_LAUNCH): grid = n_merges x kv_heads blocks, each
 * one token's group of q heads for one KV head, after the forward on the same stream (on sm_90
 * its programmatic dependent: placed while the forward runs, waiting for it in dep_wait). */
template <typename T, int D> __global__ void __launch_bounds__(128) merge_layer(const FwdArgs a)
{
    dep_wait(); /* the forward's partials (a programmatic dependent of it, launch_dep) */
    const sched_plan_merge_t mg = a.merges[blockIdx.x / a.kv_heads];
    const uint32_t head = blockIdx.x % a.kv_heads;
    for (uint32_t e = threadIdx.x; e < a.group * (D / 4); e += blockDim.x)
        merge_elem<T, D>(a, mg, head, e);
}

/* Sets the kernel's shared-memory opt-in once and fills its record. */
template <typename T, int D> int fwd_prepare(FwdVariant *v)
{
    constexpr int smem = fwd_smem<D>();
    static_assert(smem <= 232448, "sm_80/sm_90 opt-in shared memory per block (227 KB)");
    auto fn = fwd_layer<T, D, false>, wg = fwd_layer<T, D, true>;
    KC_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
           "cudaFuncSetAttribute(fwd)");
    KC_TRY(cudaFuncSetAttribute(wg, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
           "cudaFuncSetAttribute(fwd, wgmma)");
    v->fn = reinterpret_cast<const void *>(fn);
    {
        cudaFuncAttributes fa;
        KC_TRY(cudaFuncGetAttributes(&fa, fn), "cudaFuncGetAttributes(fwd)");
        v->dep = fa.binaryVersion >= 90; /* dep_wait is in the code that runs */
    }
    v->wg_fn = reinterpret_cast<const void *>(wg);
    {
        /* over an fp8 pool: the KERN_FWD_AUTO / _LAYER 4-warp kernel, where the code that runs
         * has the fp8 conversions (sm_89 and up) */
        auto w4 = fwd_layer<T, D, true, KERN_FP8_E4M3>, w5 = fwd_layer<T, D, true, KERN_FP8_E5M2>;
        cudaFuncAttributes fa;
        KC_TRY(cudaFuncGetAttributes(&fa, w4), "cudaFuncGetAttributes(fwd, fp8)");
        KC_TRY(cudaFuncSetAttribute(w4, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(fwd, fp8)");
        KC_TRY(cudaFuncSetAttribute(w5, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(fwd, fp8)");
        const bool f8 = fa.binaryVersion >= 89;
        v->wg8_fn[0] = f8 ? reinterpret_cast<const void *>(w4) : nullptr;
        v->wg8_fn[1] = f8 ? reinterpret_cast<const void *>(w5) : nullptr;
    }
    v->merge_fn = reinterpret_cast<const void *>(merge_layer<T, D>);
    v->smem = smem;
    v->pair_fn = v->pair8_fn[0] = v->pair8_fn[1] = nullptr;
    v->pair_smem = 0;
    if constexpr (D <= 128) {
        constexpr int ps = pair_smem<D>();
        static_assert(ps <= 232448, "sm_90 opt-in shared memory per block (227 KB)");
        const void *pf[3] = {reinterpret_cast<const void *>(pair_kernel<T, D, 0>()),
                             reinterpret_cast<const void *>(pair_kernel<T, D, KERN_FP8_E4M3>()),
                             reinterpret_cast<const void *>(pair_kernel<T, D, KERN_FP8_E5M2>())};
        const void **slot[3] = {&v->pair_fn, &v->pair8_fn[0], &v->pair8_fn[1]};
        for (int i = 0; i < 3; i++) {
            cudaFuncAttributes fa;
            KC_TRY(cudaFuncGetAttributes(&fa, pf[i]), "cudaFuncGetAttributes(fwd, pair)");
            /* the sm_90a code runs (the wgmma path is there), and its block's registers hold
             * what its warpgroups take after setmaxnreg (kern_cuda_fwd_ws.cuh), else it would
             * hang */
            if (fa.binaryVersion == 90 &&
                fa.numRegs * KCUDA_PAIR_THREADS >=
                    KCUDA_THREADS * (WS_REGS_PRODUCER + 2 * WS_REGS_CONSUMER)) {
                KC_TRY(cudaFuncSetAttribute(pf[i], cudaFuncAttributeMaxDynamicSharedMemorySize, ps),
                       "cudaFuncSetAttribute(fwd, pair)");
                *slot[i] = pf[i];
                v->pair_smem = ps;
            }
        }
    }
    return 0;
}

/* Fills v[0] (fp16) and v[1] (bf16) for head_dim D. */
template <int D> int fwd_register_dim(FwdVariant (&v)[2])
{
    int r = fwd_prepare<__half, D>(&v[0]);
    return r < 0 ? r : fwd_prepare<__nv_bfloat16, D>(&v[1]);
}

} // namespace kcuda

#endif
