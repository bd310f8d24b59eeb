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

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* the layout checks hold for C and for the CUDA C++ that reads plans */
#ifdef __cplusplus
#define SCHED_STATIC_ASSERT static_assert
#else
#define SCHED_STATIC_ASSERT _Static_assert
#endif

#define SCHED_PLAN_MAGIC   0x4e4c5054u /* "TPLN" */
#define SCHED_PLAN_VERSION 4u
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
    uint32_t flags; /* SCHED_PLAN_* below */
    uint32_t reserved;
} sched_plan_hdr_t;
SCHED_STATIC_ASSERT(sizeof(sched_plan_hdr_t) == 88, "plan header layout is part of the contract");

/* flags: a batch-invariant plan (sched_config_t.invariant_chunk; scheduler/README.md). Every
 * segment lies inside one window [64w, 64w + 64) of absolute positions and a CTA lists its
 * segments in window order; a row's partials are its chunks in order. A backend executes it so
 * that a row's bits depend only on its own KV: every CTA on one kernel whatever its rows, a
 * row's window read in one KV tile step with its blocks in position order (other rows' blocks
 * beside them add exact zeros), and a token's partials merged in slot order. */
#define SCHED_PLAN_INVARIANT   1u
#define SCHED_INVARIANT_WINDOW 64u /* tokens: the window, one KV tile of every backend */

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
    uint32_t pack;      /* pack it came from (diagnostics; the parts of a split CTA share it) */
    uint32_t reserved;  /* 0 */
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
 * (sched_cost.c): t = max(bytes / bandwidth share, FLOPs / tensor-rate share, tiles x tile_us) +
 * the item's fixed cost, where a share is the device rate divided by `slots` and by the slots
 * the item holds, and tiles counts the KV tiles it walks (sched_item_t, from the backend's rule).
 * All zero: no model; plans are scored on bytes (the cpu backend). Measured per GPU by
 * kernels/cuda/tile_solver.cu. */
typedef struct sched_cost {
    float read_gbs;   /* device read bandwidth, GB/s (16-byte loads, measured) */
    float mma_tflops; /* the forward kernel's sustained rate on compute-bound CTAs, whole device */
    float cta_us;     /* fixed time of one work item of kind 0: Q load, pipeline fill, epilogue,
                         scheduling */
    uint32_t slots;   /* work items resident at once: SMs x CTAs per SM */
    float tile_us;    /* the shortest time one KV tile costs its CTA: the chain wait for the
                         tile, products, softmax, barrier that nothing inside the CTA overlaps;
                         it bounds CTAs of many short segments (0: not modelled) */
    float kind1_cta_us; /* fixed time of an item of kind 1 (sched_item_t.kind: the backend runs
                           it on another kernel), per item (0: cta_us) */
    float merge_us;     /* fixed time a layer with split tokens pays once for merging them after
                           the forward (the merge launch's gap, fill and drain), beyond the
                           partials' bytes; 0: not modelled */
} sched_cost_t;

/* A KV range of a CTA as a backend's item rule reads it: the first four words of each of the
 * records it is handed (the scheduler's own segments start the same way). */
typedef struct sched_span {
    uint32_t kv_begin, kv_end; /* absolute positions [kv_begin, kv_end) */
    uint32_t row_lo, row_hi;   /* its readers: the CTA's rows [row_lo, row_hi), in query tokens */
} sched_span_t;

/* One work item (a CTA for one KV head) as the backend will run it. */
typedef struct sched_item {
    uint64_t tiles; /* KV tiles it walks (one after another: where a backend walks some side by
                       side, the tile steps of its longest chain) */
    uint32_t units; /* resident slots it holds at once (>= 1) */
    uint32_t kind;  /* 0, or 1: its fixed cost is cost.kind1_cta_us */
} sched_item_t;

/* A backend's rule for the item a CTA becomes: an m-row tile (group rows per query token) over
 * n spans (span i at (const char *)spans + i * stride, read with memcpy), KV tiles of tile_n
 * tokens, in a plan of these flags (SCHED_PLAN_INVARIANT). The scheduler's time model asks it
 * for every CTA it prices; the backend lays out the plan's CTAs with the same rule, so the two
 * agree by construction (tests/unit/test_cuda_pack.c checks it on random plans). */
typedef void (*sched_item_fn)(uint32_t m, uint32_t group, uint32_t tile_n, uint32_t flags,
                              const void *spans, size_t stride, uint32_t n, sched_item_t *ret);

/* The KV tiles of n spans (as sched_item_fn hands them) when every span starts ceil(length /
 * tile_n) tiles of its own: the rule of an item without a backend rule, and of the cuda backend's
 * 4-warp items. */
static inline uint64_t sched_span_tiles(const void *spans, size_t stride, uint32_t n,
                                        uint32_t tile_n)
{
    uint64_t tiles = 0;
    for (uint32_t i = 0; i < n; i++) {
        sched_span_t sp;
        memcpy(&sp, (const char *)spans + i * stride, sizeof(sp));
        tiles += (sp.kv_end - sp.kv_begin + (uint64_t)tile_n - 1) / tile_n;
    }
    return tiles;
}

/* The compiled tile shapes of a backend on one GPU and the rule that picks n: the backend
 * publishes it (kern_tiles), the scheduler plans with it. */
typedef struct sched_tiles {
    uint32_t n_m;
    uint16_t m[SCHED_MAX_TILE_M]; /* ascending query-row tile sizes */
    uint32_t n_n;
    uint16_t n[SCHED_MAX_TILE_N];      /* KV tile sizes */
    uint32_t n_upto[SCHED_MAX_TILE_N]; /* choose n[i] for the first i with kv_len <= n_upto[i];
                                          the last entry should be UINT32_MAX */
    uint32_t min_ctas;  /* when a plan has fewer CTA x KV-head work items than this, its CTAs are
                           split (down to split_min_kv tokens) until it has about this many: a GPU
                           with few, long CTAs idles in its last wave; 0 = never. With a cost model
                           the split is kept only when the model says it is faster */
    sched_item_fn item; /* the backend's item rule; NULL: one slot, kind 0, every span starts
                           ceil(length / n) tiles of its own */
    sched_cost_t cost;
} sched_tiles_t;

/* The tile table of a backend without its own (the cpu backend) and the scheduler's default: m
 * powers of two >= 16 (the MMA row rule), n by KV length (a partly filled last tile is wasted
 * work; long KV wants long tiles). The PAT paper's shapes. */
#define SCHED_TILES_DEFAULT                                                                        \
    {                                                                                              \
        .n_m = 4, .m = {16, 32, 64, 128}, .n_n = 3, .n = {32, 64, 128},                            \
        .n_upto = {256, 2048, UINT32_MAX},                                                         \
    }

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
