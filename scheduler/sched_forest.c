/*
 * sched_forest.c — the incremental prefix forest (see sched_forest.h for the model).
 *
 * Storage is sized once for max_queries: a compressed trie with q leaves has at most q - 1
 * internal nodes, plus the root, so 2q + 1 nodes; the child map keeps twice that many slots.
 * A join walks its path comparing block ids (O(path blocks)), a leave is O(depth), a decode
 * grow is O(1): tuned for 256-1024 queries of up to a few thousand blocks each per step.
 */
#include "sched_forest_int.h"

#include "pat_base.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ child map */

static uint64_t child_key(uint32_t parent, uint32_t block)
{
    return ((uint64_t)parent << 32) | block; /* parent < 2^25: never PAT_MAP_EMPTY */
}

static uint32_t map_find(const sched_forest_t *f, uint32_t parent, uint32_t block)
{
    return pat_map_get(&f->map, child_key(parent, block));
}

/* ------------------------------------------------------------------ nodes */

/* Block id at block index idx of node n's range (via its representative query). */
static uint32_t node_block(const sched_forest_t *f, const sched__node_t *n, uint32_t idx)
{
    return f->q[n->rep].blocks[idx];
}

/* Full blocks of a node from its start: internal nodes are all full; a leaf's are its query's. */
static uint32_t node_full(const sched_forest_t *f, const sched__node_t *n)
{
    return sched__is_leaf(n) ? f->q[n->query].nfull - n->start : n->nblocks;
}

static void node_key(sched_forest_t *f, uint32_t id)
{
    sched__node_t *n = &f->node[id];
    n->keyed = node_full(f, n) > 0;
    if (n->keyed)
        pat_map_put(&f->map, child_key(n->parent, node_block(f, n, n->start)), id);
}

static void node_unkey(sched_forest_t *f, uint32_t id)
{
    sched__node_t *n = &f->node[id];
    if (n->keyed)
        pat_map_del(&f->map, child_key(n->parent, node_block(f, n, n->start)));
    n->keyed = 0;
}

static uint32_t node_new(sched_forest_t *f)
{
    uint32_t id = f->node_free[--f->n_node_free];
    sched__node_t *n = &f->node[id];
    memset(n, 0, sizeof(*n));
    n->parent = n->first_child = n->next_sib = n->prev_sib = SCHED_NONE;
    n->query = n->rep = SCHED_NONE;
    n->live = 1;
    f->n_live++;
    return id;
}

static void node_del(sched_forest_t *f, uint32_t id)
{
    f->node[id].live = 0;
    f->node_free[f->n_node_free++] = id;
    f->n_live--;
}

static void link_child(sched_forest_t *f, uint32_t parent, uint32_t id)
{
    sched__node_t *p = &f->node[parent], *n = &f->node[id];
    n->parent = parent;
    n->prev_sib = SCHED_NONE;
    n->next_sib = p->first_child;
    if (p->first_child != SCHED_NONE)
        f->node[p->first_child].prev_sib = id;
    p->first_child = id;
}

static void unlink_child(sched_forest_t *f, uint32_t id)
{
    sched__node_t *n = &f->node[id];
    if (n->prev_sib != SCHED_NONE)
        f->node[n->prev_sib].next_sib = n->next_sib;
    else
        f->node[n->parent].first_child = n->next_sib;
    if (n->next_sib != SCHED_NONE)
        f->node[n->next_sib].prev_sib = n->prev_sib;
    n->prev_sib = n->next_sib = SCHED_NONE;
}

/* ------------------------------------------------------------------ create */

int sched_forest_create(uint32_t max_queries, uint32_t block_size, sched_forest_t **ret)
{
    if (max_queries == 0 || block_size == 0 || max_queries > (1u << 24) || !ret)
        return -EINVAL;
    sched_forest_t *f = pat_xcalloc(1, sizeof(*f));
    f->bs = block_size;
    f->max_q = max_queries;
    f->n_node_cap = 2 * max_queries + 1;
    f->node = pat_xcalloc(f->n_node_cap, sizeof(sched__node_t));
    f->node_free = pat_xmalloc((size_t)f->n_node_cap * sizeof(uint32_t));
    f->q = pat_xcalloc(max_queries, sizeof(sched__query_t));
    f->in_list = pat_xmalloc((size_t)max_queries * sizeof(uint32_t));
    f->in_pos = pat_xmalloc((size_t)max_queries * sizeof(uint32_t));
    pat_map_init(&f->map, f->n_node_cap);
    sched_forest_clear(f);
    *ret = f;
    return 0;
}

void sched_forest_free(sched_forest_t *f)
{
    if (!f)
        return;
    for (uint32_t i = 0; i < f->max_q; i++)
        free(f->q[i].blocks);
    free(f->q);
    free(f->in_list);
    free(f->in_pos);
    free(f->node);
    free(f->node_free);
    pat_map_done(&f->map);
    free(f);
}

void sched_forest_clear(sched_forest_t *f)
{
    for (uint32_t i = 0; i < f->max_q; i++)
        f->q[i].in = 0;
    f->n_in = 0;
    pat_map_clear(&f->map);
    f->n_node_free = 0;
    for (uint32_t i = f->n_node_cap; i-- > 1;) {
        f->node[i].live = 0;
        f->node_free[f->n_node_free++] = i;
    }
    f->n_live = 0;
    sched__node_t *root = &f->node[SCHED__ROOT];
    memset(root, 0, sizeof(*root));
    root->parent = root->first_child = root->next_sib = root->prev_sib = SCHED_NONE;
    root->query = root->rep = SCHED_NONE;
    root->live = 1;
    f->version++;
}

/* ------------------------------------------------------------------ queries */

static int query_load(sched_forest_t *f, sched__query_t *s, const sched_query_t *q)
{
    if (!q || !q->blocks || q->kv_len == 0 || q->n_new == 0 || q->n_new > q->kv_len)
        return -EINVAL;
    uint32_t nb = PAT_DIV_UP(q->kv_len, f->bs);
    if (q->n_blocks < nb)
        return -EINVAL;
    pat_grow((void **)&s->blocks, &s->blk_cap, nb, sizeof(uint32_t));
    return (int)nb;
}

static void attach_leaf(sched_forest_t *f, uint32_t qid, uint32_t parent)
{
    sched__query_t *s = &f->q[qid];
    uint32_t l = node_new(f);
    sched__node_t *n = &f->node[l];
    n->start = parent == SCHED__ROOT ? 0 : sched__node_end(&f->node[parent]);
    n->query = qid;
    n->rep = qid;
    n->size = 1;
    s->leaf = l;
    link_child(f, parent, l);
    node_key(f, l);
    for (uint32_t a = parent; a != SCHED_NONE; a = f->node[a].parent) {
        f->node[a].size++;
        if (f->node[a].rep == SCHED_NONE)
            f->node[a].rep = qid;
    }
}

/* Splits child c of u after k of its full blocks: a new internal node takes c's place. */
static uint32_t split_node(sched_forest_t *f, uint32_t u, uint32_t c, uint32_t k)
{
    sched__node_t *cn = &f->node[c];
    uint32_t nid = node_new(f);
    cn = &f->node[c];
    sched__node_t *nn = &f->node[nid];
    node_unkey(f, c);
    unlink_child(f, c);
    nn->start = cn->start;
    nn->nblocks = k;
    nn->rep = cn->rep;
    nn->size = cn->size;
    link_child(f, u, nid);
    node_key(f, nid);
    cn->start += k;
    if (!sched__is_leaf(cn))
        cn->nblocks -= k;
    link_child(f, nid, c);
    node_key(f, c);
    return nid;
}

static void insert_path(sched_forest_t *f, uint32_t qid)
{
    const sched__query_t *s = &f->q[qid];
    uint32_t u = SCHED__ROOT;
    for (;;) {
        uint32_t pos = u == SCHED__ROOT ? 0 : sched__node_end(&f->node[u]);
        if (pos >= s->nfull)
            break;
        uint32_t c = map_find(f, u, s->blocks[pos]);
        if (c == SCHED_NONE)
            break;
        const sched__node_t *cn = &f->node[c];
        uint32_t cfull = node_full(f, cn), lim = PAT_MIN(cfull, s->nfull - pos), k;
        const uint32_t *cb = f->q[cn->rep].blocks;
        /* the common case is a whole shared run: compare it at memcmp speed first */
        if (memcmp(cb + pos, s->blocks + pos, (size_t)lim * sizeof(uint32_t)) == 0) {
            k = lim;
        } else {
            k = 1;
            while (cb[pos + k] == s->blocks[pos + k])
                k++;
        }
        if (!sched__is_leaf(cn) && k == cn->nblocks) {
            u = c;
            continue;
        }
        u = split_node(f, u, c, k);
        break;
    }
    attach_leaf(f, qid, u);
}

int sched_forest_join(sched_forest_t *f, uint32_t qid, const sched_query_t *q)
{
    if (qid >= f->max_q)
        return -EINVAL;
    sched__query_t *s = &f->q[qid];
    if (s->in)
        return -EEXIST;
    int nb = query_load(f, s, q);
    if (nb < 0)
        return nb;
    memcpy(s->blocks, q->blocks, (size_t)nb * sizeof(uint32_t));
    s->n_blocks = (uint32_t)nb;
    s->nfull = q->kv_len / f->bs;
    s->kv_len = q->kv_len;
    s->n_new = q->n_new;
    s->tok_off = q->tok_off;
    s->table_version = q->table_version;
    s->in = 1;
    f->in_pos[qid] = f->n_in;
    f->in_list[f->n_in++] = qid;
    insert_path(f, qid);
    f->version++;
    return 0;
}

/* After c's only sibling left: parent u (not the root) and c become one node. */
static void merge_into_child(sched_forest_t *f, uint32_t u, uint32_t c)
{
    sched__node_t *un = &f->node[u], *cn = &f->node[c];
    uint32_t gp = un->parent;
    node_unkey(f, c);
    node_unkey(f, u);
    unlink_child(f, c);
    unlink_child(f, u);
    cn->start = un->start;
    if (!sched__is_leaf(cn))
        cn->nblocks += un->nblocks;
    link_child(f, gp, c);
    node_key(f, c);
    node_del(f, u);
}

static void remove_path(sched_forest_t *f, uint32_t qid)
{
    sched__query_t *s = &f->q[qid];
    uint32_t l = s->leaf, u = f->node[l].parent;
    node_unkey(f, l);
    unlink_child(f, l);
    node_del(f, l);
    for (uint32_t a = u; a != SCHED_NONE; a = f->node[a].parent) {
        sched__node_t *an = &f->node[a];
        an->size--;
        if (an->rep == qid)
            an->rep = an->first_child != SCHED_NONE ? f->node[an->first_child].rep : SCHED_NONE;
    }
    sched__node_t *un = &f->node[u];
    if (u != SCHED__ROOT && un->first_child != SCHED_NONE &&
        f->node[un->first_child].next_sib == SCHED_NONE)
        merge_into_child(f, u, un->first_child);
}

int sched_forest_leave(sched_forest_t *f, uint32_t qid)
{
    if (qid >= f->max_q)
        return -EINVAL;
    sched__query_t *s = &f->q[qid];
    if (!s->in)
        return -ENOENT;
    remove_path(f, qid);
    s->in = 0;
    uint32_t pos = f->in_pos[qid], last = f->in_list[--f->n_in];
    f->in_list[pos] = last;
    f->in_pos[last] = pos;
    f->version++;
    return 0;
}

/* Why grow would refuse qid's q before looking at its fields: 0, -EINVAL or -ENOENT. */
static int grow_refusal(const sched_forest_t *f, uint32_t qid, const sched_query_t *q)
{
    if (qid >= f->max_q)
        return -EINVAL;
    const sched__query_t *s = &f->q[qid];
    if (!s->in)
        return -ENOENT;
    if (!q || q->kv_len < s->kv_len || q->table_version != s->table_version)
        return -EINVAL;
    if (s->nfull > 0 && (q->n_blocks < s->nfull || !q->blocks ||
                         q->blocks[s->nfull - 1] != s->blocks[s->nfull - 1]))
        return -EINVAL;
    return 0;
}

int sched_forest_grows(const sched_forest_t *f, uint32_t qid, const sched_query_t *q)
{
    return grow_refusal(f, qid, q) == 0;
}

int sched_forest_grow(sched_forest_t *f, uint32_t qid, const sched_query_t *q)
{
    int rc = grow_refusal(f, qid, q);
    if (rc < 0)
        return rc;
    sched__query_t *s = &f->q[qid];
    uint32_t old_nfull = s->nfull;
    int nb = query_load(f, s, q);
    if (nb < 0)
        return nb;
    /* blocks before the old last full one are unchanged by contract: copy the tail only */
    memcpy(s->blocks + old_nfull, q->blocks + old_nfull, (size_t)(nb - old_nfull) * 4);
    s->n_blocks = (uint32_t)nb;
    s->nfull = q->kv_len / f->bs;
    s->kv_len = q->kv_len;
    s->tok_off = q->tok_off;
    if (q->n_new != s->n_new) {
        s->n_new = q->n_new;
        f->version++; /* rows changed: the pack's byte model changes */
    }
    sched__node_t *l = &f->node[s->leaf];
    if (s->nfull > old_nfull && !l->keyed) {
        /* the leaf gets its first private full block: it may now match a sibling's */
        if (map_find(f, l->parent, s->blocks[l->start]) != SCHED_NONE) {
            remove_path(f, qid);
            insert_path(f, qid);
            f->version++;
        } else {
            node_key(f, s->leaf);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ queries of the forest */

uint64_t sched_forest_version(const sched_forest_t *f)
{
    return f->version;
}

uint32_t sched_forest_n_queries(const sched_forest_t *f)
{
    return f->n_in;
}

uint32_t sched_forest_n_nodes(const sched_forest_t *f)
{
    return f->n_live;
}

uint32_t sched_forest_depth(const sched_forest_t *f)
{
    uint32_t best = 0;
    for (uint32_t i = 0; i < f->n_in; i++) {
        uint32_t d = 0;
        for (uint32_t a = f->q[f->in_list[i]].leaf; a != SCHED__ROOT; a = f->node[a].parent)
            d++;
        best = PAT_MAX(best, d);
    }
    return best;
}

/* Smallest query id below each live node: a canonical name for comparing two forests. */
static uint32_t *min_query_ids(const sched_forest_t *f)
{
    uint32_t *mq = pat_xmalloc((size_t)f->n_node_cap * sizeof(uint32_t));
    for (uint32_t i = 0; i < f->n_node_cap; i++)
        mq[i] = SCHED_NONE;
    for (uint32_t i = 0; i < f->n_in; i++) {
        uint32_t qid = f->in_list[i];
        for (uint32_t a = f->q[qid].leaf; a != SCHED_NONE; a = f->node[a].parent)
            if (qid < mq[a])
                mq[a] = qid;
    }
    return mq;
}

int sched_forest_equal(const sched_forest_t *a, const sched_forest_t *b)
{
    int eq = 1;
    if (a->n_in != b->n_in || a->n_live != b->n_live || a->bs != b->bs) {
        fprintf(stderr, "forest: %u/%u queries, %u/%u nodes\n", a->n_in, b->n_in, a->n_live,
                b->n_live);
        return 0;
    }
    uint32_t *ma = min_query_ids(a), *mb = min_query_ids(b);
    for (uint32_t i = 0; i < a->n_in && eq; i++) {
        uint32_t qid = a->in_list[i];
        if (qid >= b->max_q || !b->q[qid].in) {
            fprintf(stderr, "forest: query %u missing\n", qid);
            eq = 0;
            break;
        }
        uint32_t x = a->q[qid].leaf, y = b->q[qid].leaf;
        while (eq && x != SCHED_NONE && y != SCHED_NONE) {
            const sched__node_t *nx = &a->node[x], *ny = &b->node[y];
            uint32_t ex = sched__is_leaf(nx) ? 0 : nx->nblocks;
            uint32_t ey = sched__is_leaf(ny) ? 0 : ny->nblocks;
            if (nx->start != ny->start || ex != ey || nx->size != ny->size || ma[x] != mb[y] ||
                sched__is_leaf(nx) != sched__is_leaf(ny)) {
                fprintf(stderr,
                        "forest: query %u path differs: start %u/%u blocks %u/%u size %u/%u "
                        "min-query %u/%u\n",
                        qid, nx->start, ny->start, ex, ey, nx->size, ny->size, ma[x], mb[y]);
                eq = 0;
            }
            x = nx->parent;
            y = ny->parent;
        }
        if (eq && (x != SCHED_NONE || y != SCHED_NONE)) {
            fprintf(stderr, "forest: query %u path depth differs\n", qid);
            eq = 0;
        }
    }
    free(ma);
    free(mb);
    return eq;
}

#define FCHECK(...) PAT_CHECK("sched_forest_check", __VA_ARGS__)

int sched_forest_check(const sched_forest_t *f)
{
    int r = 0;
    uint32_t *size = pat_xcalloc(f->n_node_cap, sizeof(uint32_t));
    uint32_t live = 0;
    for (uint32_t i = 0; i < f->n_in; i++) {
        uint32_t qid = f->in_list[i];
        const sched__query_t *s = &f->q[qid];
        FCHECK(s->in && f->in_pos[qid] == i, "query %u: membership list broken", qid);
        const sched__node_t *l = &f->node[s->leaf];
        FCHECK(l->live && l->query == qid, "query %u: leaf %u does not name it", qid, s->leaf);
        for (uint32_t a = s->leaf; a != SCHED_NONE; a = f->node[a].parent) {
            size[a]++;
            const sched__node_t *n = &f->node[a];
            if (a == SCHED__ROOT || sched__is_leaf(n))
                continue;
            /* the node's blocks are this query's blocks, and they are full for it */
            FCHECK(sched__node_end(n) <= s->nfull, "node %u: not full for query %u", a, qid);
            for (uint32_t k = n->start; k < sched__node_end(n); k++)
                FCHECK(s->blocks[k] == node_block(f, n, k),
                       "node %u: block %u differs for query %u", a, k, qid);
        }
    }
    for (uint32_t id = 0; id < f->n_node_cap; id++) {
        const sched__node_t *n = &f->node[id];
        if (!n->live)
            continue;
        if (id != SCHED__ROOT)
            live++;
        FCHECK(n->size == size[id], "node %u: size %u but %u queries below", id, n->size, size[id]);
        uint32_t nchild = 0;
        for (uint32_t c = n->first_child; c != SCHED_NONE; c = f->node[c].next_sib) {
            FCHECK(f->node[c].parent == id, "node %u: child %u has parent %u", id, c,
                   f->node[c].parent);
            uint32_t end = id == SCHED__ROOT ? 0 : sched__node_end(n);
            FCHECK(f->node[c].start == end, "node %u: child %u starts at %u, not %u", id, c,
                   f->node[c].start, end);
            nchild++;
        }
        if (id == SCHED__ROOT)
            continue;
        FCHECK(n->rep != SCHED_NONE && f->q[n->rep].in, "node %u: no representative", id);
        if (sched__is_leaf(n)) {
            FCHECK(nchild == 0, "leaf %u has children", id);
        } else {
            FCHECK(nchild >= 2, "internal node %u has %u children", id, nchild);
            FCHECK(n->nblocks >= 1, "internal node %u is empty", id);
        }
        int want_key = node_full(f, n) > 0;
        FCHECK(n->keyed == want_key, "node %u: keyed %u, full blocks %u", id, n->keyed,
               node_full(f, n));
        if (want_key)
            FCHECK(map_find(f, n->parent, node_block(f, n, n->start)) == id,
                   "node %u: missing from the child map", id);
    }
    FCHECK(live == f->n_live, "live nodes %u vs counter %u", live, f->n_live);
out:
    free(size);
    return r;
}
