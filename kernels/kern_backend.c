/*
 * kern_backend.c — the backend registry, the supported set, and the checks every backend runs
 * before touching memory. Backends are chosen by name at create and reached through their ops.
 */
#include "kern_int.h"

#include <errno.h>
#include <float.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const kern_ops_t *const backends[] = {
    &kern__cpu_ops,
#ifdef PATD_HAVE_CUDA_BACKEND
    &kern__cuda_ops,
#endif
};

uint32_t kern_dtype_size(kern_dtype_t d)
{
    switch (d) {
    case KERN_F16:
    case KERN_BF16:
        return 2;
    case KERN_F32:
        return 4;
    case KERN_FP8_E4M3:
    case KERN_FP8_E5M2:
        return 1;
    }
    return 0;
}

int kern_supported(const kern_model_t *m)
{
    /* the closed set of kern.h; the cuda backend instantiates exactly these */
    if (!m || m->n_layers == 0 || m->kv_heads == 0 || m->q_heads % m->kv_heads != 0)
        return -ENOTSUP;
    bool dim = false;
#define KERN_DIM_IS(d) dim = dim || m->head_dim == d;
    KERN_HEAD_DIMS(KERN_DIM_IS)
#undef KERN_DIM_IS
    if (!dim)
        return -ENOTSUP;
    uint32_t group = m->q_heads / m->kv_heads;
    if (group < 1 || group > KERN_MAX_GROUP || m->block_size != KERN_BLOCK_SIZE)
        return -ENOTSUP;
    if (m->dtype != KERN_F16 && m->dtype != KERN_BF16 && m->dtype != KERN_F32)
        return -ENOTSUP;
    if (!kern_kv_dtype_ok(m))
        return -ENOTSUP; /* the pool holds the clients' dtype, or fp8 under a 16-bit one */
    if (!(m->kv_scale >= 0.0f && m->kv_scale <= FLT_MAX))
        return -ENOTSUP; /* NaN, negative or infinite */
    return 0;
}

kern_layout_t kern_layout(const kern_model_t *m, uint32_t n_blocks)
{
    kern_layout_t l;
    l.token = m->head_dim;
    l.head = (uint64_t)m->block_size * l.token;
    l.kv = m->kv_heads * l.head;
    l.block = 2 * l.kv;
    l.layer = (uint64_t)n_blocks * l.block;
    l.elt = kern_dtype_size(kern_kv_dtype(m));
    l.n_layers = m->n_layers;
    return l;
}

uint64_t kern_block_bytes(const kern_model_t *m)
{
    const kern_layout_t l = kern_layout(m, 1);
    return l.layer * l.n_layers * l.elt;
}

const char *kern_backend_list(void)
{
    static char list[64]; /* the table's names; the same every call */
    size_t at = 0;
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]) && at < sizeof(list); i++)
        at +=
            (size_t)snprintf(list + at, sizeof(list) - at, "%s%s", i ? " " : "", backends[i]->name);
    return list;
}

int kern_backend_probe(const char *name, int device, kern_probe_t *ret)
{
    memset(ret, 0, sizeof(*ret));
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
        if (!strcmp(backends[i]->name, name))
            return backends[i]->probe(device, ret);
    snprintf(ret->why, sizeof(ret->why),
             "this build has no %s backend (it carries: %s; a build with nvcc on the PATH has "
             "cuda)",
             name, kern_backend_list());
    return -ENOENT;
}

int kern_backend_create(const char *name, const kern_config_t *cfg, kern_backend_t **ret)
{
    if (!name || !cfg || !ret || cfg->n_blocks == 0 || cfg->max_tokens == 0 ||
        cfg->max_cta_rows > KERN_MAX_CTA_ROWS || cfg->n_threads > KERN_MAX_THREADS ||
        (cfg->merge != KERN_MERGE_LAUNCH && cfg->merge != KERN_MERGE_INSIDE) ||
        (cfg->fwd != KERN_FWD_AUTO && cfg->fwd != KERN_FWD_MMA && cfg->fwd != KERN_FWD_LAYER &&
         cfg->fwd != KERN_FWD_CPASYNC && cfg->fwd != KERN_FWD_TMA))
        return -EINVAL;
    int r = kern_supported(&cfg->model);
    if (r < 0)
        return r;
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
        if (strcmp(backends[i]->name, name) != 0)
            continue;
        if (cfg->pool_keep && !backends[i]->pool_fd)
            return -ENOTSUP;
        kern_config_t c = *cfg;
        if (c.max_cta_rows == 0)
            c.max_cta_rows = KERN_DEFAULT_MAX_CTA_ROWS;
        if (c.max_plan_bytes == 0)
            c.max_plan_bytes = KERN_DEFAULT_PLAN_BYTES;
        kern_backend_t *b = NULL;
        r = backends[i]->create(&c, &b);
        if (r < 0)
            return r;
        b->ops = backends[i];
        b->cfg = c;
        *ret = b;
        return 0;
    }
    return -ENOTSUP; /* unknown, or not built into this binary */
}

void kern_backend_free(kern_backend_t *b)
{
    if (b)
        b->ops->destroy(b);
}

const char *kern_backend_name(const kern_backend_t *b)
{
    return b->ops->name;
}

int kern_append_kv(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                   const uint32_t *slots, uint32_t n)
{
    if (layer >= b->cfg.model.n_layers || (n && (!k || !v || !slots)))
        return -EINVAL;
    return b->ops->append_kv(b, layer, k, v, slots, n);
}

int kern_copy_blocks(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n)
{
    if (n && (!src || !dst))
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (src[i] >= b->cfg.n_blocks || dst[i] >= b->cfg.n_blocks)
            return -EINVAL;
    return b->ops->copy_blocks(b, src, dst, n);
}

int kern_attend(kern_backend_t *b, uint32_t layer, const sched_plan_hdr_t *plan, const void *q,
                void *o, const kern_attn_params_t *p)
{
    if (layer >= b->cfg.model.n_layers || !plan || !q || !o || !p || !(p->scale > 0.0f) ||
        !(p->softcap >= 0.0f))
        return -EINVAL;
    return b->ops->attend(b, layer, plan, q, o, p);
}

int kern_sync(kern_backend_t *b)
{
    return b->ops->sync ? b->ops->sync(b) : 0;
}

static const sched_tiles_t generic_tiles = SCHED_TILES_DEFAULT;

int kern_tiles(const kern_backend_t *b, sched_tiles_t *ret)
{
    if (b->ops->tiles)
        b->ops->tiles(b, ret);
    else
        *ret = generic_tiles;
    return 0;
}

uint64_t kern__plan_scratch_bytes(const kern_config_t *cfg)
{
    return (uint64_t)cfg->max_partials / 8 + 1;
}

int kern__plan_check(const kern_config_t *cfg, const sched_plan_hdr_t *h, uint8_t *scratch)
{
    const kern_model_t *m = &cfg->model;
    if (h->magic != SCHED_PLAN_MAGIC || h->version != SCHED_PLAN_VERSION ||
        h->block_size != m->block_size || h->group != m->q_heads / m->kv_heads)
        return -EINVAL;
    if (h->n_tokens > cfg->max_tokens || h->max_cta_rows > cfg->max_cta_rows)
        return -E2BIG;
    if (h->n_partials > cfg->max_partials)
        return -ENOSPC;
    if (h->flags & ~SCHED_PLAN_INVARIANT)
        return -EINVAL;
    const int inv = (h->flags & SCHED_PLAN_INVARIANT) != 0;
    const sched_plan_group_t *g = sched_plan_groups(h);
    const sched_plan_cta_t *c = sched_plan_ctas(h);
    const sched_plan_seg_t *segs = sched_plan_segs(h);
    const sched_plan_row_t *rows = sched_plan_rows(h);
    const uint32_t *pages = sched_plan_pages(h);
    const sched_plan_merge_t *mg = sched_plan_merges(h);
    uint64_t counted = 0;
    for (uint32_t i = 0; i < h->n_groups; i++)
        counted += g[i].cta_count;
    if (counted != h->n_ctas)
        return -EINVAL;
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        const sched_plan_cta_t *x = &c[i];
        if ((uint64_t)x->row_begin + x->row_count > h->n_rows ||
            (uint64_t)x->seg_begin + x->seg_count > h->n_segs || x->group >= h->n_groups ||
            x->row_count * h->group > cfg->max_cta_rows || x->row_count * h->group > g[x->group].m)
            return -EINVAL;
        uint64_t kv = 0;
        for (uint32_t k = x->seg_begin; k < x->seg_begin + x->seg_count; k++) {
            const sched_plan_seg_t *sg = &segs[k];
            if (sg->kv_begin > sg->kv_end || sg->row_lo >= sg->row_hi || sg->row_hi > x->row_count)
                return -EINVAL;
            /* invariant: each segment inside one window, a CTA's windows in order (the backends
             * read a segment in one tile step) */
            if (inv && (sg->kv_end == sg->kv_begin ||
                        sg->kv_begin / SCHED_INVARIANT_WINDOW !=
                            (sg->kv_end - 1) / SCHED_INVARIANT_WINDOW ||
                        g[x->group].n != SCHED_INVARIANT_WINDOW ||
                        (k > x->seg_begin && sg->kv_begin < segs[k - 1].kv_begin)))
                return -EINVAL;
            if (sg->kv_end > sg->kv_begin) {
                uint64_t last = (uint64_t)sg->page_begin + (sg->kv_end - 1) / h->block_size -
                                sg->kv_begin / h->block_size;
                if (last >= h->n_pages)
                    return -EINVAL;
            }
            kv += sg->kv_end - sg->kv_begin;
        }
        if (kv != x->kv_tokens)
            return -EINVAL;
    }
    /* merges: disjoint slot ranges covering [0, n_partials) in order */
    uint64_t slot = 0;
    for (uint32_t i = 0; i < h->n_merges; i++) {
        if (mg[i].q_tok >= h->n_tokens || mg[i].part_count < 2 || mg[i].part_begin != slot)
            return -EINVAL;
        slot += mg[i].part_count;
    }
    if (slot != h->n_partials)
        return -EINVAL;
    /* rows: a partial row's slot lies in its merge's range and no two rows share a slot; with
     * the ranges covering every slot, each merge is named by exactly part_count rows (the
     * arrivals a backend may count before merging) */
    memset(scratch, 0, (size_t)h->n_partials / 8 + 1);
    uint64_t partial_rows = 0;
    for (uint32_t i = 0; i < h->n_rows; i++) {
        const sched_plan_row_t *r = &rows[i];
        if (r->q_tok >= h->n_tokens)
            return -EINVAL;
        if (r->merge == SCHED_ROW_DIRECT) {
            if (r->dst != r->q_tok)
                return -EINVAL;
            continue;
        }
        if (r->merge >= h->n_merges || mg[r->merge].q_tok != r->q_tok ||
            r->dst < mg[r->merge].part_begin ||
            r->dst - mg[r->merge].part_begin >= mg[r->merge].part_count ||
            (scratch[r->dst / 8] >> (r->dst % 8)) & 1)
            return -EINVAL;
        scratch[r->dst / 8] |= (uint8_t)(1u << (r->dst % 8));
        partial_rows++;
    }
    if (partial_rows != h->n_partials)
        return -EINVAL;
    for (uint32_t i = 0; i < h->n_pages; i++)
        if (pages[i] >= cfg->n_blocks)
            return -EINVAL;
    return 0;
}

/* ------------------------------------------------------------------ GPU data path */

int kern_lane_create(kern_backend_t *b, kern_lane_t **ret)
{
    return b->ops->lane_create ? b->ops->lane_create(b, ret) : -ENOTSUP;
}

void kern_lane_free(kern_lane_t *l)
{
    if (l)
        l->b->ops->lane_free(l);
}

int kern_lane_begin(kern_lane_t *l, const sched_plan_hdr_t *plan, const uint32_t *slots, uint32_t n)
{
    if (!plan || (n && !slots))
        return -EINVAL;
    return l->b->ops->lane_begin(l, plan, slots, n);
}

int kern_lane_layer(kern_lane_t *l, const kern_lane_layer_t *ly)
{
    if (ly->layer >= l->b->cfg.model.n_layers)
        return -EINVAL;
    if (ly->compute && (!ly->q || !ly->k || !ly->v || !ly->o || !(ly->params.scale > 0.0f) ||
                        ly->params.softcap < 0.0f))
        return -EINVAL;
    return l->b->ops->lane_layer(l, ly);
}

int kern_lane_pack_begin(kern_lane_t *l, const sched_plan_hdr_t *plan, const uint32_t *slots,
                         uint32_t n, const kern_pack_member_t *m, uint32_t n_members,
                         uint32_t window_us)
{
    if (!l->b->ops->pack_begin)
        return -ENOTSUP;
    if (!plan || !slots || !n || !m || n_members == 0 || n_members > KERN_PACK_MAX)
        return -EINVAL;
    uint32_t row = 0;
    for (uint32_t i = 0; i < n_members; i++) {
        if (!m[i].q || !m[i].k || !m[i].v || !m[i].o || !m[i].ready || !m[i].done ||
            m[i].row_off != row || m[i].n_tokens == 0)
            return -EINVAL;
        row += m[i].n_tokens;
    }
    if (row != n || row != plan->n_tokens)
        return -EINVAL;
    return l->b->ops->pack_begin(l, plan, slots, n, m, n_members, window_us);
}

int kern_lane_pack_layer(kern_lane_t *l, uint32_t layer, const kern_attn_params_t *params,
                         int report)
{
    if (!l->b->ops->pack_layer)
        return -ENOTSUP;
    if (layer >= l->b->cfg.model.n_layers || !l->pack_members || !(params->scale > 0.0f) ||
        params->softcap < 0.0f)
        return -EINVAL;
    return l->b->ops->pack_layer(l, layer, params, report);
}

int kern_pool_fd(const kern_backend_t *b)
{
    return b->ops->pool_fd ? b->ops->pool_fd(b) : -1;
}

void kern_lane_trim(kern_lane_t *l)
{
    if (l->b->ops->lane_trim)
        l->b->ops->lane_trim(l);
}

const volatile uint32_t *kern_lane_pack_out(const kern_lane_t *l)
{
    return l->pack_out;
}

void kern_lane_pack_exclude(kern_lane_t *l, uint32_t member)
{
    if (l->pack_excl && member < KERN_PACK_MAX)
        __atomic_store_n(&l->pack_excl[member], 1u, __ATOMIC_RELEASE);
}

uint64_t kern_lane_progress(const kern_lane_t *l)
{
    return __atomic_load_n(l->progress, __ATOMIC_ACQUIRE);
}

uint64_t kern_lane_enqueued(const kern_lane_t *l)
{
    return l->enqueued;
}

int kern_share_alloc(kern_backend_t *b, uint64_t bytes, unsigned flags, kern_share_t *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->fd = -1;
    if (!bytes || (flags & ~KERN_SHARE_HOST))
        return -EINVAL;
    return b->ops->share_alloc ? b->ops->share_alloc(b, bytes, flags, ret) : -ENOTSUP;
}

void kern_share_free(kern_backend_t *b, kern_share_t *s)
{
    if (s->fd >= 0)
        close(s->fd);
    if (s->dev && b->ops->share_free)
        b->ops->share_free(b, s);
    memset(s, 0, sizeof(*s));
    s->fd = -1;
}

int kern_device_info(kern_backend_t *b, int *ret_mps, uint8_t ret_uuid[16])
{
    return b->ops->device_info ? b->ops->device_info(b, ret_mps, ret_uuid) : -ENOTSUP;
}

int kern_fatal(kern_backend_t *b, char *why, uint32_t why_len)
{
    if (why_len)
        why[0] = 0;
    return b->ops->fatal ? b->ops->fatal(b, why, why_len) : 0;
}

uint64_t kern_lane_bytes(const kern_config_t *cfg)
{
    const kern_model_t *m = &cfg->model;
    /* kern_cuda_int.h's LANE_PARTIALS_START: what a lane's partials are at first (a lane that
     * runs a plan splitting more grows them, up to max_partials) */
    const uint64_t start = 256;
    const uint64_t max_part = cfg->max_partials ? cfg->max_partials : 1;
    const uint64_t slots = (max_part < start ? max_part : start) * m->q_heads;
    const uint64_t plan = cfg->max_plan_bytes ? cfg->max_plan_bytes : KERN_DEFAULT_PLAN_BYTES;
    const uint64_t tiles = 2ull * (256u << 10); /* kern_cuda_lane.cu: two tile lists at first */
    return slots * m->head_dim * 4 + slots * 4  /* partial O and LSE */
           + ((uint64_t)cfg->max_tokens * m->kv_heads + 2) * 4 /* merge arrivals */
           + 2 * plan + tiles + (uint64_t)cfg->max_tokens * 4; /* plans, slots */
}
