/*
 * kv_pool.c — the block pool of patd's KV cache: free list, refcounts, the prefix cache (chained
 * xxh3 hash of full blocks -> block id) and LRU eviction of unreferenced cached blocks, leaves
 * first. Sequences live in kv_seq.c.
 *
 * Workload: one daemon, tens of thousands to millions of blocks of 16 tokens, a few hundred
 * block operations per step. Every operation here is O(1) or O(log n) (the LRU heap); the map is
 * sized at twice the block count so probes stay short. kv_pool_check() is O(n) and meant for
 * tests and for an operator's consistency check, not for the step path.
 */
#include "kv_pool_int.h"

#include "pat_base.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

uint64_t kv__chain_hash(const kv_pool_t *p, uint64_t parent, const uint32_t *tokens)
{
    /* input: parent hash, then the block's token ids; model id as the seed */
    uint64_t buf[1 + KV_MAX_BLOCK_SIZE / 2];
    uint32_t bs = p->cfg.block_size;
    buf[0] = parent;
    memcpy(&buf[1], tokens, (size_t)bs * sizeof(uint32_t));
    uint64_t h = XXH3_64bits_withSeed(buf, 8 + (size_t)bs * 4, p->cfg.model_id);
    /* 0 means "no parent" in the chain, UINT64_MAX an empty map slot: neither is a block hash */
    return h == 0 ? 1 : h == PAT_MAP_EMPTY ? h - 1 : h;
}

uint32_t kv__map_find(const kv_pool_t *p, uint64_t key)
{
    return pat_map_get(&p->map, key);
}

/* ------------------------------------------------------------------ LRU heap */

static int heap_less(const kv_pool_t *p, uint32_t a, uint32_t b)
{
    return p->blk[a].last_use < p->blk[b].last_use;
}

static void heap_set(kv_pool_t *p, uint32_t i, uint32_t b)
{
    p->heap[i] = b;
    p->blk[b].heap_pos = i;
}

static void heap_sift_up(kv_pool_t *p, uint32_t i)
{
    uint32_t b = p->heap[i];
    while (i > 0) {
        uint32_t up = (i - 1) / 2;
        if (!heap_less(p, b, p->heap[up]))
            break;
        heap_set(p, i, p->heap[up]);
        i = up;
    }
    heap_set(p, i, b);
}

static void heap_sift_down(kv_pool_t *p, uint32_t i)
{
    uint32_t b = p->heap[i];
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        uint32_t mb = b;
        if (l < p->heap_len && heap_less(p, p->heap[l], mb))
            m = l, mb = p->heap[l];
        if (r < p->heap_len && heap_less(p, p->heap[r], mb))
            m = r, mb = p->heap[r];
        if (m == i)
            break;
        heap_set(p, i, mb);
        i = m;
    }
    heap_set(p, i, b);
}

static void heap_push(kv_pool_t *p, uint32_t b)
{
    heap_set(p, p->heap_len++, b);
    heap_sift_up(p, p->heap_len - 1);
}

static void heap_remove(kv_pool_t *p, uint32_t b)
{
    uint32_t i = p->blk[b].heap_pos;
    p->blk[b].heap_pos = KV_NONE;
    uint32_t last = p->heap[--p->heap_len];
    if (i == p->heap_len)
        return;
    heap_set(p, i, last);
    heap_sift_up(p, i);
    heap_sift_down(p, p->blk[last].heap_pos);
}

/* ------------------------------------------------------------------ block states */

static void emit(kv_pool_t *p, kv_event_type_t t, uint32_t b, uint64_t h, uint32_t parent)
{
    if (p->cfg.on_event)
        p->cfg.on_event(p->cfg.event_ud, t, b, h, p->blk[b].scope, parent);
}

/* Removes a CACHED leaf from the prefix cache and puts it on the free list. */
static void evict_one(kv_pool_t *p)
{
    uint32_t b = p->heap[0];
    kv__block_t *k = &p->blk[b];
    heap_remove(p, b);
    pat_map_del(&p->map, k->hash);
    const uint64_t h = k->hash;
    const uint32_t parent = k->parent;
    if (k->parent != KV_NONE) {
        kv__block_t *par = &p->blk[k->parent];
        if (--par->nchild == 0 && par->state == KV__CACHED)
            heap_push(p, k->parent); /* the parent is a leaf now */
    }
    k->hash = 0;
    k->published = 0;
    k->parent = KV_NONE;
    k->state = KV__FREE;
    p->n_cached--;
    p->free_stack[p->n_free++] = b;
    p->st.evictions++;
    emit(p, KV_EVENT_EVICTED, b, h, parent);
}

uint32_t kv__block_take(kv_pool_t *p)
{
    if (p->n_free == 0)
        evict_one(p); /* caller checked kv_pool_available(): a leaf exists */
    uint32_t b = p->free_stack[--p->n_free];
    kv__block_t *k = &p->blk[b];
    k->state = KV__USED;
    k->refcnt = 1;
    p->n_used++;
    return b;
}

void kv__block_ref(kv_pool_t *p, uint32_t b)
{
    assert(b < p->cfg.n_blocks);
    kv__block_t *k = &p->blk[b];
    assert(k->state != KV__FREE); /* a free block is taken with kv__block_alloc, not ref'd */
    if (k->state == KV__CACHED) {
        if (k->heap_pos != KV_NONE)
            heap_remove(p, b);
        k->state = KV__USED;
        p->n_cached--;
        p->n_used++;
    }
    k->refcnt++;
}

void kv__block_unref(kv_pool_t *p, uint32_t b)
{
    assert(b < p->cfg.n_blocks);
    kv__block_t *k = &p->blk[b];
    assert(k->state == KV__USED && k->refcnt > 0);
    if (--k->refcnt > 0)
        return;
    p->n_used--;
    if (k->published) {
        k->state = KV__CACHED;
        k->last_use = ++p->tick;
        p->n_cached++;
        if (k->nchild == 0)
            heap_push(p, b);
    } else {
        k->state = KV__FREE;
        p->free_stack[p->n_free++] = b;
    }
}

int kv__publish(kv_pool_t *p, uint32_t b, uint64_t h, uint32_t parent, uint64_t scope)
{
    assert(b < p->cfg.n_blocks && !p->blk[b].published);
    if (kv__map_find(p, h) != KV_NONE) {
        p->st.duplicates++;
        return 0;
    }
    kv__block_t *k = &p->blk[b];
    pat_map_put(&p->map, h, b);
    k->hash = h;
    k->scope = scope;
    k->published = 1;
    k->parent = parent;
    if (parent != KV_NONE)
        p->blk[parent].nchild++; /* the parent is USED by the same sequence: not in the heap */
    p->st.published++;
    emit(p, KV_EVENT_STORED, b, h, parent);
    return 1;
}

/* ------------------------------------------------------------------ pool */

int kv_pool_create(const kv_pool_config_t *cfg, kv_pool_t **ret_pool)
{
    if (!cfg || !ret_pool || cfg->n_blocks == 0 || cfg->n_blocks > KV_MAX_BLOCKS ||
        cfg->block_size == 0 || cfg->block_size > KV_MAX_BLOCK_SIZE || cfg->max_seqs == 0 ||
        cfg->max_seqs > KV_MAX_SEQS || cfg->max_seq_len == 0)
        return -EINVAL;

    kv_pool_t *p = pat_xcalloc(1, sizeof(*p));
    p->cfg = *cfg;
    uint32_t n = cfg->n_blocks;
    p->blk = pat_xcalloc(n, sizeof(*p->blk));
    p->free_stack = pat_xmalloc((size_t)n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        p->blk[i].parent = KV_NONE;
        p->blk[i].heap_pos = KV_NONE;
        p->free_stack[i] = n - 1 - i; /* pop order 0, 1, 2, ... */
    }
    p->n_free = n;

    pat_map_init(&p->map, n);
    pat_map_init(&p->intent, n);
    p->heap = pat_xmalloc((size_t)n * sizeof(uint32_t));

    p->seq = pat_xcalloc(cfg->max_seqs, sizeof(kv__seq_t));
    p->seq_free = pat_xmalloc((size_t)cfg->max_seqs * sizeof(uint32_t));
    for (uint32_t i = 0; i < cfg->max_seqs; i++)
        p->seq_free[i] = cfg->max_seqs - 1 - i;
    p->n_seq_free = cfg->max_seqs;
    *ret_pool = p;
    return 0;
}

void kv_pool_free(kv_pool_t *p)
{
    if (!p)
        return;
    if (p->seq) {
        for (uint32_t i = 0; i < p->cfg.max_seqs; i++) {
            free(p->seq[i].blocks);
            free(p->seq[i].hashes);
            free(p->seq[i].tokens);
            free(p->seq[i].intent);
        }
    }
    free(p->seq);
    free(p->seq_free);
    free(p->heap);
    pat_map_done(&p->map);
    pat_map_done(&p->intent);
    free(p->free_stack);
    free(p->blk);
    free(p);
}

uint32_t kv_pool_block_size(const kv_pool_t *p)
{
    return p->cfg.block_size;
}

uint32_t kv_pool_available(const kv_pool_t *p)
{
    return p->n_free + p->n_cached;
}

uint32_t kv_pool_evict(kv_pool_t *p, uint32_t n)
{
    uint32_t done = 0;
    while (done < n && p->heap_len > 0) {
        evict_one(p);
        done++;
    }
    return done;
}

void kv_pool_stats(const kv_pool_t *p, kv_stats_t *ret)
{
    *ret = p->st;
    ret->n_blocks = p->cfg.n_blocks;
    ret->n_free = p->n_free;
    ret->n_used = p->n_used;
    ret->n_cached = p->n_cached;
    ret->n_evictable = p->heap_len;
    ret->n_seqs = p->cfg.max_seqs - p->n_seq_free;
    ret->n_logical = p->n_logical;
}

/* ------------------------------------------------------------------ adoption */

enum { ADOPT_NEW = 0, ADOPT_WALK = 1, ADOPT_OK = 2, ADOPT_NO = 3 };

/* Adopts entry i (its parent adopted, or a root): the block is CACHED and published. */
static void adopt_one(kv_pool_t *p, const kv_adopt_t *e)
{
    kv__block_t *k = &p->blk[e->block];
    pat_map_put(&p->map, e->hash, e->block);
    k->hash = e->hash;
    k->scope = e->scope;
    k->published = 1;
    k->parent = e->parent;
    k->state = KV__CACHED;
    k->last_use = ++p->tick;
    if (e->parent != KV_NONE)
        p->blk[e->parent].nchild++;
    p->n_cached++;
}

int kv_pool_adopt(kv_pool_t *p, const kv_adopt_t *e, uint32_t n, uint32_t *ret_adopted,
                  uint32_t *ret_rejected)
{
    if (n && !e)
        return -EINVAL;
    if (p->n_free != p->cfg.n_blocks || p->n_seq_free != p->cfg.max_seqs || p->map.count)
        return -EBUSY;
    const uint32_t nb = p->cfg.n_blocks;
    uint32_t *at = pat_xmalloc((size_t)nb * sizeof(uint32_t)); /* block -> entry */
    uint8_t *st = pat_xcalloc(n ? n : 1, 1);
    uint32_t *path = pat_xmalloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    for (uint32_t b = 0; b < nb; b++)
        at[b] = KV_NONE;
    for (uint32_t i = 0; i < n; i++) {
        if (e[i].block >= nb || e[i].hash == 0)
            st[i] = ADOPT_NO;
        else if (at[e[i].block] != KV_NONE) /* named twice: neither is trusted */
            st[i] = st[at[e[i].block]] = ADOPT_NO;
        else
            at[e[i].block] = i;
    }
    uint32_t adopted = 0, rejected = 0;
    for (uint32_t i = 0; i < n; i++) {
        /* walk up to an adopted or rejected ancestor (or a root), then settle the path down */
        uint32_t len = 0, j = i;
        int verdict = ADOPT_OK;
        while (st[j] == ADOPT_NEW) {
            st[j] = ADOPT_WALK;
            path[len++] = j;
            const uint32_t par = e[j].parent;
            if (par == KV_NONE)
                break;
            if (par >= nb || at[par] == KV_NONE) {
                verdict = ADOPT_NO;
                break;
            }
            j = at[par];
        }
        if (verdict == ADOPT_OK && len && e[path[len - 1]].parent != KV_NONE)
            verdict = st[j] == ADOPT_OK ? ADOPT_OK : ADOPT_NO; /* WALK again: a cycle */
        if (len == 0)
            continue; /* settled before */
        for (uint32_t x = len; x-- > 0;) {
            const kv_adopt_t *a = &e[path[x]];
            if (verdict == ADOPT_OK && kv__map_find(p, a->hash) != KV_NONE)
                verdict = ADOPT_NO; /* the same chain twice: the first one stands */
            if (verdict == ADOPT_OK)
                adopt_one(p, a);
            st[path[x]] = (uint8_t)verdict;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        adopted += st[i] == ADOPT_OK;
        rejected += st[i] == ADOPT_NO;
    }
    /* the free stack holds what was not adopted (pop order ascending), the heap the leaves */
    p->n_free = 0;
    for (uint32_t b = nb; b-- > 0;)
        if (p->blk[b].state == KV__FREE)
            p->free_stack[p->n_free++] = b;
    for (uint32_t b = 0; b < nb; b++)
        if (p->blk[b].state == KV__CACHED && p->blk[b].nchild == 0)
            heap_push(p, b);
    free(at);
    free(st);
    free(path);
    if (ret_adopted)
        *ret_adopted = adopted;
    if (ret_rejected)
        *ret_rejected = rejected;
    return 0;
}

/* ------------------------------------------------------------------ invariants */

#define CHECK(...) PAT_CHECK("kv_pool_check", __VA_ARGS__)

int kv_pool_check(const kv_pool_t *p)
{
    int r = 0;
    uint32_t n = p->cfg.n_blocks, bs = p->cfg.block_size;
    uint32_t *refs = pat_xcalloc(n, sizeof(uint32_t));
    uint32_t *nchild = pat_xcalloc(n, sizeof(uint32_t));
    uint8_t *on_free = pat_xcalloc(n, 1);
    uint32_t cnt[3] = {0, 0, 0}, npub = 0, open = 0;
    uint64_t logical = 0;
    pat_map_t tally = {0}; /* the outstanding intents, hash by hash */

    /* references from block tables; chains published as prefixes */
    for (uint32_t s = 0; s < p->cfg.max_seqs; s++) {
        const kv__seq_t *q = &p->seq[s];
        if (!q->open)
            continue;
        open++;
        logical += q->n_blocks;
        CHECK(q->len <= q->n_blocks * bs, "seq slot %u: len %u beyond capacity %u", s, q->len,
              q->n_blocks * bs);
        CHECK(q->len <= p->cfg.max_seq_len, "seq slot %u: len %u over max_seq_len", s, q->len);
        int prev_pub = 1;
        for (uint32_t i = 0; i < q->n_blocks; i++) {
            uint32_t b = q->blocks[i];
            CHECK(b < n, "seq slot %u: block id %u out of range", s, b);
            refs[b]++;
            const kv__block_t *k = &p->blk[b];
            int full = (i + 1) * bs <= q->len;
            CHECK(!k->published || full, "seq slot %u: published block %u is not full", s, b);
            CHECK(!k->published || prev_pub, "seq slot %u: block %u published after a private one",
                  s, b);
            CHECK(!k->published || k->hash == q->hashes[i],
                  "seq slot %u: block %u hash differs from the chain", s, b);
            CHECK(!k->published || k->parent == (i ? q->blocks[i - 1] : KV_NONE),
                  "seq slot %u: block %u parent %u is not its predecessor", s, b, k->parent);
            prev_pub = k->published;
        }
    }
    /* the intent map counts, hash by hash, exactly the open sequences' outstanding intents */
    uint64_t outstanding = 0;
    for (uint32_t s = 0; s < p->cfg.max_seqs; s++) {
        const kv__seq_t *q = &p->seq[s];
        if (!q->open)
            continue;
        CHECK(q->intent_done <= q->n_intent, "seq slot %u: %u intents released of %u", s,
              q->intent_done, q->n_intent);
        outstanding += q->n_intent - q->intent_done;
    }
    CHECK(outstanding <= UINT32_MAX / 2, "intents: %llu outstanding",
          (unsigned long long)outstanding);
    pat_map_init(&tally, (uint32_t)outstanding + 1);
    for (uint32_t s = 0; s < p->cfg.max_seqs; s++) {
        const kv__seq_t *q = &p->seq[s];
        for (uint32_t i = q->intent_done; q->open && i < q->n_intent; i++) {
            uint32_t c = pat_map_get(&tally, q->intent[i]);
            pat_map_put(&tally, q->intent[i], c == PAT_MAP_NONE ? 1 : c + 1);
        }
    }
    CHECK(tally.count == p->intent.count, "intents: %u hashes outstanding but %u counted",
          tally.count, p->intent.count);
    for (uint32_t i = 0; i <= p->intent.mask; i++)
        if (p->intent.key[i] != PAT_MAP_EMPTY)
            CHECK(pat_map_get(&tally, p->intent.key[i]) == p->intent.val[i],
                  "intents: hash %016llx counted %u times, %u outstanding",
                  (unsigned long long)p->intent.key[i], p->intent.val[i],
                  pat_map_get(&tally, p->intent.key[i]));
    CHECK(logical == p->n_logical, "block-table entries %llu vs counter %llu",
          (unsigned long long)logical, (unsigned long long)p->n_logical);
    CHECK(open + p->n_seq_free == p->cfg.max_seqs, "open seqs %u + free slots %u != max_seqs %u",
          open, p->n_seq_free, p->cfg.max_seqs);

    for (uint32_t i = 0; i < p->n_free; i++) {
        uint32_t b = p->free_stack[i];
        CHECK(b < n && !on_free[b], "free list holds %u twice or out of range", b);
        on_free[b] = 1;
    }
    for (uint32_t b = 0; b < n; b++) {
        const kv__block_t *k = &p->blk[b];
        CHECK(k->state <= KV__CACHED, "block %u: bad state %u", b, k->state);
        cnt[k->state]++;
        CHECK(k->refcnt == refs[b], "block %u: refcount %u but %u references", b, k->refcnt,
              refs[b]);
        CHECK((k->state == KV__FREE) == on_free[b], "block %u: state %u but on free list %u", b,
              k->state, on_free[b]);
        CHECK((k->state == KV__USED) == (k->refcnt > 0), "block %u: state %u with refcount %u", b,
              k->state, k->refcnt);
        CHECK(k->state != KV__CACHED || k->published, "block %u: cached but not published", b);
        CHECK(k->state != KV__FREE || !k->published, "block %u: free but published", b);
        if (k->published) {
            npub++;
            CHECK(kv__map_find(p, k->hash) == b, "block %u: not found under its hash", b);
            if (k->parent != KV_NONE) {
                CHECK(k->parent < n && p->blk[k->parent].published,
                      "block %u: parent %u not published", b, k->parent);
                nchild[k->parent]++;
                CHECK(k->state != KV__USED || p->blk[k->parent].state == KV__USED,
                      "block %u: used but its parent %u is not", b, k->parent);
            }
        }
        int leaf = k->state == KV__CACHED && k->nchild == 0;
        CHECK((k->heap_pos != KV_NONE) == leaf, "block %u: heap membership %d, evictable leaf %d",
              b, k->heap_pos != KV_NONE, leaf);
        if (k->heap_pos != KV_NONE)
            CHECK(k->heap_pos < p->heap_len && p->heap[k->heap_pos] == b,
                  "block %u: heap position %u wrong", b, k->heap_pos);
    }
    for (uint32_t b = 0; b < n; b++)
        CHECK(p->blk[b].nchild == nchild[b], "block %u: nchild %u but %u children", b,
              p->blk[b].nchild, nchild[b]);
    CHECK(cnt[KV__FREE] == p->n_free && cnt[KV__USED] == p->n_used &&
              cnt[KV__CACHED] == p->n_cached,
          "state counts free %u used %u cached %u vs counters %u %u %u", cnt[0], cnt[1], cnt[2],
          p->n_free, p->n_used, p->n_cached);
    CHECK(p->n_free + p->n_used + p->n_cached == n, "free + used + cached != capacity");
    CHECK(npub == p->map.count, "published %u but map holds %u", npub, p->map.count);
    for (uint32_t i = 1; i < p->heap_len; i++)
        CHECK(!heap_less(p, p->heap[i], p->heap[(i - 1) / 2]), "heap order broken at %u", i);
out:
    pat_map_done(&tally);
    free(refs);
    free(nchild);
    free(on_free);
    return r;
}
