/*
 * kv_seq.c — sequences of patd's KV cache: open (with prefix-cache lookup and the blocks other
 * sequences are about to write), reserve, commit
 * (publishing completed blocks), fork (copy-on-write of the partial last block), truncate and
 * close. Block states and the prefix cache are kv_pool.c's.
 *
 * Every operation first checks everything that can fail (ids, bounds, blocks available), and
 * only then changes state, so a failing call leaves the pool exactly as it was.
 */
#include "kv_pool_int.h"

#include "pat_base.h"

#include <errno.h>
#include <string.h>

kv__seq_t *kv__seq_get(const kv_pool_t *p, uint32_t id)
{
    uint32_t slot = id & (KV_MAX_SEQS - 1);
    if (slot >= p->cfg.max_seqs)
        return NULL;
    kv__seq_t *q = &p->seq[slot];
    if (!q->open || q->gen != (id >> KV_SEQ_SLOT_BITS))
        return NULL;
    return q;
}

static uint32_t seq_id(const kv_pool_t *p, const kv__seq_t *q)
{
    return (q->gen << KV_SEQ_SLOT_BITS) | (uint32_t)(q - p->seq);
}

static void seq_fit_blocks(kv__seq_t *q, uint32_t need)
{
    if (need <= q->blk_cap)
        return;
    uint32_t cap = q->blk_cap;
    pat_grow((void **)&q->blocks, &cap, need, sizeof(uint32_t));
    q->hashes = pat_xrealloc(q->hashes, (size_t)cap * sizeof(uint64_t));
    q->blk_cap = cap;
}

static void seq_fit_tokens(kv__seq_t *q, uint32_t need)
{
    pat_grow((void **)&q->tokens, &q->tok_cap, need, sizeof(uint32_t));
}

/* Counts one more sequence about to write the block of chain hash h; 0 where the intent map
 * is full (a new hash beyond n_blocks of them). */
static int intent_add(kv_pool_t *p, uint64_t h)
{
    uint32_t c = pat_map_get(&p->intent, h);
    if (c == PAT_MAP_NONE) {
        if (p->intent.count >= p->cfg.n_blocks)
            return 0;
        c = 0;
    }
    pat_map_put(&p->intent, h, c + 1);
    return 1;
}

/* Releases q's outstanding intents for blocks before `upto` (UINT32_MAX: all of them). */
static void intents_release(kv_pool_t *p, kv__seq_t *q, uint32_t upto)
{
    for (; q->intent_done < q->n_intent && q->intent_first + q->intent_done < upto;
         q->intent_done++) {
        uint64_t h = q->intent[q->intent_done];
        uint32_t c = pat_map_get(&p->intent, h);
        if (c <= 1)
            pat_map_del(&p->intent, h);
        else
            pat_map_put(&p->intent, h, c - 1);
    }
}

static kv__seq_t *seq_alloc(kv_pool_t *p)
{
    if (p->n_seq_free == 0)
        return NULL;
    kv__seq_t *q = &p->seq[p->seq_free[--p->n_seq_free]];
    q->gen = (q->gen + 1) & ((1u << (32 - KV_SEQ_SLOT_BITS)) - 1);
    q->open = 1;
    q->len = 0;
    q->n_blocks = 0;
    q->version = 0;
    q->n_intent = q->intent_done = q->intent_first = 0;
    return q;
}

int kv_seq_open(kv_pool_t *p, const uint32_t *tokens, uint32_t n, uint32_t *ret_seq,
                uint32_t *ret_cached_len)
{
    return kv_seq_open_scoped(p, 0, tokens, n, ret_seq, ret_cached_len);
}

int kv_seq_open_scoped(kv_pool_t *p, uint64_t scope, const uint32_t *tokens, uint32_t n,
                       uint32_t *ret_seq, uint32_t *ret_cached_len)
{
    return kv_seq_open_pending(p, scope, tokens, n, ret_seq, ret_cached_len, NULL);
}

int kv_seq_open_pending(kv_pool_t *p, uint64_t scope, const uint32_t *tokens, uint32_t n,
                        uint32_t *ret_seq, uint32_t *ret_cached_len, uint32_t *ret_pending_len)
{
    if (!tokens || n == 0 || n > p->cfg.max_seq_len || !ret_seq)
        return -EINVAL;
    kv__seq_t *q = seq_alloc(p);
    if (!q)
        return -EMFILE;

    uint32_t bs = p->cfg.block_size;
    uint32_t eligible = (n - 1) / bs; /* full blocks that still leave one token to compute */
    uint32_t matched = 0;
    uint64_t h = scope; /* the chain's root: a block's hash covers its scope */
    q->scope = scope;
    seq_fit_blocks(q, eligible);
    for (; matched < eligible; matched++) {
        uint64_t nh = kv__chain_hash(p, h, tokens + (size_t)matched * bs);
        uint32_t b = kv__map_find(p, nh);
        if (b == KV_NONE)
            break;
        kv__block_ref(p, b);
        q->blocks[matched] = b;
        q->hashes[matched] = nh;
        h = nh;
    }
    /* past the cached prefix: the blocks other open sequences of the scope are about to write
     * (counted while contiguous and eligible), then this one's own intents for every full
     * prompt block it will write */
    uint32_t full = n / bs, pending = 0;
    int counting = 1;
    if (full > matched)
        pat_grow((void **)&q->intent, &q->intent_cap, full - matched, sizeof(uint64_t));
    q->intent_first = matched;
    uint64_t ih = h;
    for (uint32_t i = matched; i < full; i++) {
        uint64_t nh = kv__chain_hash(p, ih, tokens + (size_t)i * bs);
        counting = counting && i < eligible && pat_map_get(&p->intent, nh) != PAT_MAP_NONE;
        pending += (uint32_t)counting;
        if (!intent_add(p, nh))
            break;
        q->intent[q->n_intent++] = nh;
        ih = nh;
    }
    q->n_blocks = matched;
    p->n_logical += matched;
    q->len = matched * bs;
    seq_fit_tokens(q, q->len);
    if (q->len)
        memcpy(q->tokens, tokens, (size_t)q->len * sizeof(uint32_t));
    p->st.hit_blocks += matched;
    p->st.miss_blocks += n / bs - matched;
    p->st.query_tokens += n;
    *ret_seq = seq_id(p, q);
    if (ret_cached_len)
        *ret_cached_len = q->len;
    if (ret_pending_len)
        *ret_pending_len = pending * bs;
    return 0;
}

int kv_seq_reserve(kv_pool_t *p, uint32_t id, uint32_t n_new)
{
    kv__seq_t *q = kv__seq_get(p, id);
    if (!q)
        return -ENOENT;
    if ((uint64_t)q->len + n_new > p->cfg.max_seq_len)
        return -EINVAL;
    uint32_t need = PAT_DIV_UP(q->len + n_new, p->cfg.block_size);
    if (need <= q->n_blocks)
        return 0;
    if (need - q->n_blocks > kv_pool_available(p))
        return -ENOSPC;
    seq_fit_blocks(q, need);
    p->n_logical += need - q->n_blocks;
    while (q->n_blocks < need)
        q->blocks[q->n_blocks++] = kv__block_take(p);
    return 0;
}

int kv_seq_commit(kv_pool_t *p, uint32_t id, const uint32_t *tokens, uint32_t n)
{
    kv__seq_t *q = kv__seq_get(p, id);
    if (!q)
        return -ENOENT;
    uint32_t bs = p->cfg.block_size;
    if (!tokens || n == 0 || (uint64_t)q->len + n > (uint64_t)q->n_blocks * bs)
        return -EINVAL;
    uint32_t old_full = q->len / bs;
    seq_fit_tokens(q, q->len + n);
    memcpy(q->tokens + q->len, tokens, (size_t)n * sizeof(uint32_t));
    q->len += n;
    uint32_t new_full = q->len / bs;
    intents_release(p, q, new_full); /* written: no longer about to be */
    for (uint32_t i = old_full; i < new_full; i++) {
        uint64_t parent_h = i ? q->hashes[i - 1] : q->scope;
        q->hashes[i] = kv__chain_hash(p, parent_h, q->tokens + (size_t)i * bs);
        /* publish only as a prefix: a private predecessor keeps the rest of the chain private */
        int prev_pub = i == 0 || p->blk[q->blocks[i - 1]].published;
        if (!prev_pub)
            continue;
        /* a twin (another sequence that computed the same chain, opened before either had
         * committed it) published this block first: share its copy and free ours, so the chain
         * stays published and this sequence's continuation is cached under it too. Only frees:
         * nothing here can run out of blocks. */
        uint32_t other = kv__map_find(p, q->hashes[i]);
        if (other != KV_NONE && other != q->blocks[i]) {
            kv__block_ref(p, other);
            kv__block_unref(p, q->blocks[i]);
            q->blocks[i] = other;
            q->version++;
            p->st.duplicates++;
            continue;
        }
        kv__publish(p, q->blocks[i], q->hashes[i], i ? q->blocks[i - 1] : KV_NONE, q->scope);
    }
    return 0;
}

int kv_seq_fork(kv_pool_t *p, uint32_t id, uint32_t *ret_child, kv_copy_t *ret_copy)
{
    kv__seq_t *q = kv__seq_get(p, id);
    if (!q)
        return -ENOENT;
    if (!ret_child || !ret_copy)
        return -EINVAL;
    uint32_t bs = p->cfg.block_size;
    uint32_t full = q->len / bs, partial = q->len % bs != 0;
    if (p->n_seq_free == 0)
        return -EMFILE;
    if (partial && kv_pool_available(p) < 1)
        return -ENOSPC;
    kv__seq_t *c = seq_alloc(p);
    q = kv__seq_get(p, id); /* slots do not move, but keep the pointer honest */
    c->scope = q->scope;
    seq_fit_blocks(c, full + partial);
    for (uint32_t i = 0; i < full; i++) {
        kv__block_ref(p, q->blocks[i]);
        c->blocks[i] = q->blocks[i];
        c->hashes[i] = q->hashes[i];
    }
    ret_copy->src = KV_NONE;
    ret_copy->dst = KV_NONE;
    if (partial) {
        uint32_t b = kv__block_take(p);
        c->blocks[full] = b;
        ret_copy->src = q->blocks[full];
        ret_copy->dst = b;
    }
    c->n_blocks = full + partial;
    p->n_logical += c->n_blocks;
    c->len = q->len;
    seq_fit_tokens(c, c->len);
    if (c->len)
        memcpy(c->tokens, q->tokens, (size_t)c->len * sizeof(uint32_t));
    *ret_child = seq_id(p, c);
    return 0;
}

int kv_seq_truncate(kv_pool_t *p, uint32_t id, uint32_t new_len, kv_copy_t *ret_copy)
{
    kv__seq_t *q = kv__seq_get(p, id);
    if (!q)
        return -ENOENT;
    if (new_len > q->len || !ret_copy)
        return -EINVAL;
    uint32_t bs = p->cfg.block_size;
    uint32_t keep = PAT_DIV_UP(new_len, bs);
    uint32_t last = keep - 1; /* valid when new_len % bs != 0 */
    int cow = 0;
    if (new_len % bs != 0) {
        const kv__block_t *k = &p->blk[q->blocks[last]];
        cow = k->refcnt > 1 || k->published;
    }
    /* blocks released below come back only if unpublished; do not count on them */
    if (cow && kv_pool_available(p) < 1)
        return -ENOSPC;
    ret_copy->src = KV_NONE;
    ret_copy->dst = KV_NONE;
    if (cow) {
        uint32_t b = kv__block_take(p);
        ret_copy->src = q->blocks[last];
        ret_copy->dst = b;
        kv__block_unref(p, q->blocks[last]);
        q->blocks[last] = b;
    }
    /* release from the end so a chain's blocks enter the LRU leaves first */
    while (q->n_blocks > keep) {
        kv__block_unref(p, q->blocks[--q->n_blocks]);
        p->n_logical--;
    }
    /* rolled back below its length: what it writes next is no longer its prompt. At the same
     * length (the daemon giving back a failed or aborted step's reservation) it still is. */
    if (new_len < q->len)
        intents_release(p, q, UINT32_MAX);
    q->len = new_len;
    return 0;
}

int kv_seq_close(kv_pool_t *p, uint32_t id)
{
    kv__seq_t *q = kv__seq_get(p, id);
    if (!q)
        return -ENOENT;
    p->n_logical -= q->n_blocks;
    while (q->n_blocks > 0)
        kv__block_unref(p, q->blocks[--q->n_blocks]);
    intents_release(p, q, UINT32_MAX);
    q->open = 0;
    q->len = 0;
    p->seq_free[p->n_seq_free++] = (uint32_t)(q - p->seq);
    return 0;
}

int kv_seq_info(const kv_pool_t *p, uint32_t id, kv_seq_info_t *ret)
{
    const kv__seq_t *q = kv__seq_get(p, id);
    if (!q)
        return -ENOENT;
    ret->len = q->len;
    ret->n_blocks = q->n_blocks;
    ret->version = q->version;
    ret->capacity = q->n_blocks * p->cfg.block_size;
    ret->blocks = q->blocks;
    return 0;
}
