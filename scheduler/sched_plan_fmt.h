/*
 * sched_plan_fmt.h — the plan: the flat, self-describing work list of one step that every backend
 * executes. Types only; both the scheduler (which writes it) and the kernels (which read it)
 * include this header, and nothing else of each other.
 *
 * Layout: one contiguous buffer, little-endian, position-independent (every reference is an
 * index or a byte offset from the start of the header), so it can be copied to a device in one
 * transfer and read there as is. Arrays start at 16-byte aligned offsets.
 *
 *   sched_plan_hdr_t                       at offset 0
 *   sched_plan_group_t  groups[n_groups]   the tile shapes (m, n) the plan uses, ascending
 *   sched_plan_cta_t    ctas[n_ctas]       rows x KV segments, run once per KV head; in launch
 *                                          order: longest modelled time first
 *   sched_plan_seg_t    segs[n_segs]       KV ranges of the CTAs, each read by a run of its rows
 *   sched_plan_row_t    rows[n_rows]       query tokens of the CTAs (each = `group` q-head rows)
 *   uint32_t            pages[n_pages]     physical block ids, per segment from segs[].page_begin
 *   sched_plan_merge_t  merges[n_merges]   query tokens whose output combines several partials
 *
 * Semantics of a CTA c for KV head h (rows r = rows[c.row_begin + i], i < c.row_count; heads
 * j < group; segments s = segs[c.seg_begin + k], k < c.seg_count):
 *   q   = Q[r.q_tok][h * group + j][:]                      (Q rows of the step, [tok][q_head][d])
 *   kv  = the union over the segments s with s.row_lo <= i < s.row_hi of the absolute positions
 *         t in [s.kv_begin, min(s.kv_end, r.limit)), K/V of t at block
 *         pages[s.page_begin + t / bs - s.kv_begin / bs], offset t % bs. A CTA's segments are
 *         disjoint stretches of its rows' sequences (nodes of one prefix tree, rows in its DFS
 *         order, so every node's readers are a run of rows): a pack of queries that share a
 *         prefix reads it once and their private suffixes in the same CTA, block-diagonally.
 *   out = softmax(scale * q . K[kv]) . V[kv]  (with optional softcap on the logits)
 *   if r.merge == SCHED_ROW_DIRECT: written to O[r.q_tok][h * group + j] (this CTA is the only
 *         one that reads KV for it)
 *   else: partial (o normalized, lse natural-log) to slot (r.dst * kv_heads + h) * group + j
 *         (an empty range writes lse = -inf and o = 0), and r.merge names the token's entry in
 *         merges[].
 * A merge m combines slots part_begin .. part_begin + part_count - 1 of token m.q_tok into O
 * (log-sum-exp weights; all -inf gives 0, never NaN). Exactly part_count rows name m, each in a
 * different CTA: a backend may count arrivals per (merge, KV head) and let the last CTA to
 * finish its partial do the merge (kernels/cuda does), so the count is part of the contract.
 */
#ifndef SCHED_PLAN_FMT_H
#define SCHED_PLAN_FMT_H

#include <stdint.h>

/* the layout checks hold for C and for the CUDA C++ that reads plans */
#ifdef __cplusplus
#define SCHED_STATIC_ASSERT static_assert
#else
#define SCHED_STATIC_ASSERT _Static_assert
#endif

#define SCHED_PLAN_MAGIC   0x4e4c5054u /* "TPLN" */
#define SCHED_PLAN_VERSION 3u
#define SCHED_ROW_DIRECT   0xffffffffu /* rows[].merge: the CTA writes the output, no partial */

typedef struct sched_plan_hdr {
    uint32_t magic;
    uint32_t version;
    uint32_t total_bytes; /* whole plan, header included */
    uint32_t block_size;  /* tokens per KV block */
    uint32_t group;       /* q heads per KV head (rows per query token) */
    uint32_t n_tokens;    /* query tokens of the step (rows of Q and O) */
    uint32_t n_groups, n_ctas, n_rows, n_pages, n_merges;
    uint32_t n_partials; /* partial slots (per KV head and q head of the group) */
    uint32_t off_groups, off_ctas, off_rows, off_pages, off_merges;
    uint32_t max_cta_rows; /* largest row_count * group: the biggest m any CTA needs */
    uint32_t n_segs, off_segs;
    uint32_t reserved[2];
} sched_plan_hdr_t;
SCHED_STATIC_ASSERT(sizeof(sched_plan_hdr_t) == 88, "plan header layout is part of the contract");

typedef struct sched_plan_group {
    uint16_t m;         /* tile rows (query rows per CTA) */
    uint16_t n;         /* tile KV tokens per iteration */
    uint32_t cta_count; /* CTAs of this shape (anywhere in ctas[]) */
    uint32_t reserved[2];
} sched_plan_group_t;
SCHED_STATIC_ASSERT(sizeof(sched_plan_group_t) == 16, "group layout");

typedef struct sched_plan_cta {
    uint32_t row_begin; /* first row in rows[] */
    uint32_t row_count; /* query tokens in this CTA (rows = row_count * group <= m) */
    uint32_t seg_begin; /* first segment in segs[] */
    uint32_t seg_count; /* 0: its rows read nothing (o = 0, lse = -inf) */
    uint32_t kv_tokens; /* sum of its segments' lengths (the KV it reads per KV head) */
    uint32_t group;     /* index in groups[] (its tile shape) */
    uint32_t pack;      /* pack it came from (diagnostics, split parts share it; the cuda
                           backend's device copy keeps the CTA's first tile there) */
    uint32_t reserved;  /* 0 here; the cuda backend's device copy keeps the CTA's tile count */
} sched_plan_cta_t;
SCHED_STATIC_ASSERT(sizeof(sched_plan_cta_t) == 32, "cta layout");

typedef struct sched_plan_seg {
    uint32_t kv_begin;       /* first absolute KV position */
    uint32_t kv_end;         /* one past the last (clamped to its readers' largest limit) */
    uint32_t page_begin;     /* pages[] index of the block holding kv_begin */
    uint16_t row_lo, row_hi; /* its readers: the CTA's rows [row_lo, row_hi), in query tokens */
} sched_plan_seg_t;
SCHED_STATIC_ASSERT(sizeof(sched_plan_seg_t) == 16, "segment layout");

typedef struct sched_plan_row {
    uint32_t q_tok; /* row of Q/O in the step */
    uint32_t limit; /* causal limit: attends to absolute positions < limit */
    uint32_t dst;   /* partial slot, or q_tok again when merge == SCHED_ROW_DIRECT */
    uint32_t merge; /* index in merges[] of this token, or SCHED_ROW_DIRECT */
} sched_plan_row_t;
SCHED_STATIC_ASSERT(sizeof(sched_plan_row_t) == 16, "row layout");

typedef struct sched_plan_merge {
    uint32_t q_tok;
    uint32_t part_begin; /* first partial slot */
    uint32_t part_count; /* >= 2 */
    uint32_t reserved;
} sched_plan_merge_t;
SCHED_STATIC_ASSERT(sizeof(sched_plan_merge_t) == 16, "merge layout");

#define SCHED_MAX_TILE_M 8
#define SCHED_MAX_TILE_N 8

/* What one work item (a CTA for one KV head) costs on the device, for the scheduler's time model
 * (sched_plan.c): t = max(bytes / bandwidth share, FLOPs / tensor-rate share, tiles x tile_us) +
 * cta_us, where a share is the device rate divided by `slots` and tiles counts the KV tiles the
 * CTA walks (every segment starts one, or tile_pages blocks make one). All zero: no model; plans
 * are scored on bytes (the cpu backend). Measured per GPU by kernels/cuda/tile_solver.cu. */
typedef struct sched_cost {
    float read_gbs;   /* device read bandwidth, GB/s (16-byte loads, measured) */
    float mma_tflops; /* the forward kernel's sustained rate on compute-bound CTAs, whole device */
    float cta_us;     /* fixed time of one work item: Q load, pipeline fill, epilogue, scheduling */
    uint32_t slots;   /* work items resident at once: SMs x CTAs per SM */
    float tile_us;    /* the shortest time one KV tile costs its CTA: the chain wait for the
                         tile, products, softmax, barrier that nothing inside the CTA overlaps;
                         it bounds CTAs of many short segments (0: not modelled) */
    float pair_cta_us; /* cta_us of an item the pair kernel runs (sched_tiles_t.pair_from_m), per
                          item and block (0: cta_us) */
} sched_cost_t;

/* The compiled tile shapes of a backend on one GPU and the rule that picks n: the backend
 * publishes it (kern_tiles), the scheduler plans with it. */
typedef struct sched_tiles {
    uint32_t n_m;
    uint16_t m[SCHED_MAX_TILE_M]; /* ascending query-row tile sizes */
    uint32_t n_n;
    uint16_t n[SCHED_MAX_TILE_N];      /* KV tile sizes */
    uint32_t n_upto[SCHED_MAX_TILE_N]; /* choose n[i] for the first i with kv_len <= n_upto[i];
                                          the last entry should be UINT32_MAX */
    uint32_t min_ctas;    /* when a plan has fewer CTA x KV-head work items than this, its CTAs are
                             split (down to split_min_kv tokens) until it has about this many: a GPU
                             with few, long CTAs idles in its last wave; 0 = never. With a cost model
                             the split is kept only when the model says it is faster */
    uint32_t pair_m;      /* a CTA of more than pair_m rows holds two slots (the cuda pair kernel:
                             one block of two warpgroups per SM runs it); 0 = every CTA one slot */
    uint32_t pair_from_m; /* items with an m-row tile of at least this run on the pair kernel
                             and cost cost.pair_cta_us; 0 = none (a plan whose CTAs all have
                             fewer rows runs on the 4-warp kernels) */
    uint32_t tile_pages;  /* a KV tile holds this many blocks of any of a CTA's segments (the
                             backend packs short segments together: the cuda pair kernel); 0 =
                             every segment starts a tile of its own */
    sched_cost_t cost;
} sched_tiles_t;

/* Typed views of a plan buffer (no copies). */
static inline const sched_plan_group_t *sched_plan_groups(const sched_plan_hdr_t *h)
{
    return (const sched_plan_group_t *)((const char *)h + h->off_groups);
}
static inline const sched_plan_cta_t *sched_plan_ctas(const sched_plan_hdr_t *h)
{
    return (const sched_plan_cta_t *)((const char *)h + h->off_ctas);
}
static inline const sched_plan_seg_t *sched_plan_segs(const sched_plan_hdr_t *h)
{
    return (const sched_plan_seg_t *)((const char *)h + h->off_segs);
}
static inline const sched_plan_row_t *sched_plan_rows(const sched_plan_hdr_t *h)
{
    return (const sched_plan_row_t *)((const char *)h + h->off_rows);
}
static inline const uint32_t *sched_plan_pages(const sched_plan_hdr_t *h)
{
    return (const uint32_t *)((const char *)h + h->off_pages);
}
static inline const sched_plan_merge_t *sched_plan_merges(const sched_plan_hdr_t *h)
{
    return (const sched_plan_merge_t *)((const char *)h + h->off_merges);
}

#endif
