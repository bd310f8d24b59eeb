/* tl_world.c — see tl_world.h. */
#include "tl_world.h"

#include "pat_base.h"

#include <string.h>

typedef struct gen {
    tl_world_t *w;
    tl_rng_t *r;
    const tl_world_params_t *p;
    uint32_t depth;
} gen_t;

static void push_blocks(tl_world_t *w, uint32_t *path, uint32_t *n, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++)
        path[(*n)++] = w->next_block++;
}

static void add_query(gen_t *g, const uint32_t *path, uint32_t n_path)
{
    tl_world_t *w = g->w;
    const tl_world_params_t *p = g->p;
    uint32_t priv = tl_rng_range(g->r, p->leaf_tok_lo, p->leaf_tok_hi);
    uint32_t kv = n_path * w->bs + priv;
    uint32_t nb = PAT_DIV_UP(kv, w->bs);
    tl_query_t *q = &w->q[w->n_q++];
    q->cap_blocks = nb + p->spare_blocks;
    q->blocks = pat_xmalloc((size_t)q->cap_blocks * sizeof(uint32_t));
    memcpy(q->blocks, path, (size_t)n_path * sizeof(uint32_t));
    for (uint32_t i = n_path; i < nb; i++)
        q->blocks[i] = w->next_block++;
    q->n_blocks = nb;
    q->kv_len = kv;
    uint32_t hi = PAT_MIN(p->new_hi, kv);
    q->n_new = tl_rng_range(g->r, PAT_MIN(p->new_lo, hi), hi);
}

static void gen_level(gen_t *g, uint32_t level, uint32_t *path, uint32_t n_path)
{
    const tl_world_params_t *p = g->p;
    if (g->w->n_q >= p->max_queries)
        return;
    if (level == g->depth) {
        add_query(g, path, n_path);
        return;
    }
    uint32_t fan = tl_rng_range(g->r, p->fanout_lo, p->fanout_hi);
    for (uint32_t c = 0; c < fan && g->w->n_q < p->max_queries; c++) {
        uint32_t tok = tl_rng_range(g->r, p->level_tok_lo, p->level_tok_hi);
        uint32_t n = n_path;
        push_blocks(g->w, path, &n, PAT_DIV_UP(tok, g->w->bs));
        gen_level(g, level + 1, path, n);
    }
}

void tl_world_layout(tl_world_t *w)
{
    uint32_t off = 0;
    for (uint32_t i = 0; i < w->n_q; i++) {
        w->q[i].tok_off = off;
        off += w->q[i].n_new;
    }
    w->n_tokens = off;
}

void tl_world_gen(tl_world_t *w, tl_rng_t *r, const tl_world_params_t *p)
{
    memset(w, 0, sizeof(*w));
    w->bs = p->bs;
    w->q = pat_xcalloc(p->max_queries, sizeof(tl_query_t));
    uint32_t max_path = p->depth_hi * PAT_DIV_UP(p->level_tok_hi, p->bs) + 1;
    uint32_t *path = pat_xmalloc((size_t)max_path * sizeof(uint32_t));
    for (uint32_t t = 0; t < p->trees && w->n_q < p->max_queries; t++) {
        gen_t g = {.w = w, .r = r, .p = p, .depth = tl_rng_range(r, p->depth_lo, p->depth_hi)};
        gen_level(&g, 0, path, 0);
    }
    free(path);
    tl_world_layout(w);
}

void tl_world_free(tl_world_t *w)
{
    for (uint32_t i = 0; i < w->n_q; i++)
        free(w->q[i].blocks);
    free(w->q);
    memset(w, 0, sizeof(*w));
}

void tl_world_grow(tl_world_t *w, uint32_t i, uint32_t n)
{
    tl_query_t *q = &w->q[i];
    q->kv_len += n;
    uint32_t nb = PAT_DIV_UP(q->kv_len, w->bs);
    if (nb > q->cap_blocks) {
        q->cap_blocks = nb * 2;
        q->blocks = pat_xrealloc(q->blocks, (size_t)q->cap_blocks * sizeof(uint32_t));
    }
    while (q->n_blocks < nb)
        q->blocks[q->n_blocks++] = w->next_block++;
    q->n_new = n;
}

uint32_t tl_world_probe(tl_world_t *w, tl_rng_t *r, uint32_t bs, uint32_t probe_len,
                        uint32_t probe_new, uint32_t max_others, uint32_t other_tok_hi,
                        uint32_t other_new_hi, uint32_t first_block)
{
    memset(w, 0, sizeof(*w));
    w->bs = bs;
    const uint32_t others = tl_rng_range(r, 0, max_others), at = tl_rng_range(r, 0, others);
    w->q = pat_xcalloc(others + 1, sizeof(tl_query_t));
    w->next_block = first_block;
    for (uint32_t i = 0; i <= others; i++) {
        tl_query_t *q = &w->q[i];
        if (i == at) {
            q->n_blocks = q->cap_blocks = PAT_DIV_UP(probe_len, bs);
            q->blocks = pat_xmalloc((size_t)q->n_blocks * sizeof(uint32_t));
            for (uint32_t b = 0; b < q->n_blocks; b++)
                q->blocks[b] = b;
            q->kv_len = probe_len;
            q->n_new = probe_new;
            continue;
        }
        /* the probe, or an earlier query of this batch, whose full blocks it starts with */
        const uint32_t from = i > 0 && tl_rng_below(r, 3) == 0 ? tl_rng_below(r, i) : at;
        const uint32_t shared =
            tl_rng_range(r, 0, (from == at ? probe_len : w->q[from].kv_len) / bs);
        q->kv_len = shared * bs + tl_rng_range(r, 1, other_tok_hi);
        q->n_blocks = q->cap_blocks = PAT_DIV_UP(q->kv_len, bs);
        q->blocks = pat_xmalloc((size_t)q->n_blocks * sizeof(uint32_t));
        for (uint32_t b = 0; b < q->n_blocks; b++)
            q->blocks[b] = b < shared ? (from == at ? b : w->q[from].blocks[b]) : w->next_block++;
        q->n_new = tl_rng_range(r, 1, PAT_MIN(other_new_hi, q->kv_len));
    }
    w->n_q = others + 1;
    tl_world_layout(w);
    return at;
}
