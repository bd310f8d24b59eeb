/*
 * test_kv.c — kvcache: unit tests of each operation and its error codes, and a randomized test of
 * long operation sequences checked against a simple model after every step.
 *
 * The model tracks, per physical block, the token each slot was written with (as a backend
 * would hold KV); after every operation each open sequence's logical view through its block
 * table must equal the tokens the model says it committed. A wrongly shared, leaked or reused
 * block shows up as a changed view or as a kv_pool_check() violation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_index.h"
#include "kv_pool.h"
#include "tl_rng.h"

#define BS 16u

static kv_pool_t *mk_pool(uint32_t n_blocks, uint32_t max_seqs)
{
    kv_pool_config_t c = {.n_blocks = n_blocks,
                          .block_size = BS,
                          .max_seqs = max_seqs,
                          .max_seq_len = 1u << 16,
                          .model_id = 42};
    kv_pool_t *p = NULL;
    assert_int_equal(kv_pool_create(&c, &p), 0);
    return p;
}

static void fill_tokens(uint32_t *t, uint32_t n, uint32_t base)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = base * 100003u + i;
}

/* open + reserve + commit the whole prompt; returns the seq id */
static uint32_t prefill(kv_pool_t *p, const uint32_t *tok, uint32_t n, uint32_t *ret_cached)
{
    uint32_t s, cached;
    assert_int_equal(kv_seq_open(p, tok, n, &s, &cached), 0);
    assert_int_equal(kv_seq_reserve(p, s, n - cached), 0);
    assert_int_equal(kv_seq_commit(p, s, tok + cached, n - cached), 0);
    if (ret_cached)
        *ret_cached = cached;
    return s;
}

/* Scopes: a prompt committed in scope 1 is found in scope 1 (and by a fork's continuation, which
 * keeps its parent's scope), never in scope 2 or by kv_seq_open (scope 0); two twins of
 * different scopes keep their own copies at commit. */
static void test_scopes_separate_prefixes(void **state)
{
    kv_pool_t *p = mk_pool(64, 16);
    uint32_t tok[64], s, f, o2, o0, cached;
    fill_tokens(tok, 64, 5);
    assert_int_equal(kv_seq_open_scoped(p, 1, tok, 48, &s, &cached), 0);
    assert_int_equal(cached, 0);
    assert_int_equal(kv_seq_reserve(p, s, 48), 0);
    assert_int_equal(kv_seq_commit(p, s, tok, 48), 0);
    uint32_t again;
    assert_int_equal(kv_seq_open_scoped(p, 1, tok, 49, &again, &cached), 0);
    assert_int_equal(cached, 48);
    assert_int_equal(kv_seq_open_scoped(p, 2, tok, 49, &o2, &cached), 0);
    assert_int_equal(cached, 0);
    assert_int_equal(kv_seq_open(p, tok, 49, &o0, &cached), 0);
    assert_int_equal(cached, 0);
    /* a fork of s continues in scope 1: its next full block is found by scope 1 only */
    kv_copy_t cp;
    assert_int_equal(kv_seq_fork(p, s, &f, &cp), 0);
    assert_int_equal(kv_seq_reserve(p, f, 16), 0);
    assert_int_equal(kv_seq_commit(p, f, tok + 48, 16), 0);
    uint32_t x;
    assert_int_equal(kv_seq_open_scoped(p, 1, tok, 64, &x, &cached), 0);
    assert_int_equal(cached, 48); /* 64 tokens: the last block stays to compute */
    assert_int_equal(kv_seq_close(p, x), 0);
    /* twins: o2 (scope 2) and o0 (scope 0) commit the same tokens, each keeps its own blocks */
    kv_stats_t st0, st1;
    kv_pool_stats(p, &st0);
    assert_int_equal(kv_seq_reserve(p, o2, 49), 0);
    assert_int_equal(kv_seq_commit(p, o2, tok, 49), 0);
    assert_int_equal(kv_seq_reserve(p, o0, 49), 0);
    assert_int_equal(kv_seq_commit(p, o0, tok, 49), 0);
    kv_pool_stats(p, &st1);
    assert_int_equal(st1.duplicates, st0.duplicates);
    kv_seq_info_t a, b;
    assert_int_equal(kv_seq_info(p, o2, &a), 0);
    assert_int_equal(kv_seq_info(p, o0, &b), 0);
    for (uint32_t i = 0; i < 3; i++)
        assert_int_not_equal(a.blocks[i], b.blocks[i]);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

static void test_create_rejects_bad_config(void **state)
{
    kv_pool_config_t c = {.n_blocks = 8, .block_size = 0, .max_seqs = 4, .max_seq_len = 64};
    kv_pool_t *p = NULL;
    assert_int_equal(kv_pool_create(&c, &p), -EINVAL);
    c.block_size = KV_MAX_BLOCK_SIZE + 1;
    assert_int_equal(kv_pool_create(&c, &p), -EINVAL);
    c.block_size = 16;
    c.n_blocks = 0;
    assert_int_equal(kv_pool_create(&c, &p), -EINVAL);
    c.n_blocks = 8;
    c.max_seqs = 0;
    assert_int_equal(kv_pool_create(&c, &p), -EINVAL);
    assert_null(p);
    kv_pool_free(NULL);
}

static void test_prefix_reuse_and_counters(void **state)
{
    kv_pool_t *p = mk_pool(64, 8);
    uint32_t tok[80], cached;
    fill_tokens(tok, 80, 1);
    uint32_t a = prefill(p, tok, 80, &cached);
    assert_int_equal(cached, 0);
    kv_stats_t st;
    kv_pool_stats(p, &st);
    assert_int_equal(st.published, 5);
    assert_int_equal(st.n_used, 5);

    /* same prompt: 4 blocks reused (the 5th is capped so one token is left to compute) */
    uint32_t b = prefill(p, tok, 80, &cached);
    assert_int_equal(cached, 64);
    kv_pool_stats(p, &st);
    assert_int_equal(st.hit_blocks, 4);
    assert_int_equal(st.miss_blocks, 5 + 1);
    assert_int_equal(st.query_tokens, 80 + 80); /* every prompt token of both opens */
    assert_int_equal(st.duplicates, 1);         /* b's own 5th block has the same content as a's */
    kv_seq_info_t ia, ib;
    kv_seq_info(p, a, &ia);
    kv_seq_info(p, b, &ib);
    for (int i = 0; i < 5; i++) /* ... so b now shares a's copy: its own went back */
        assert_int_equal(ia.blocks[i], ib.blocks[i]);
    assert_int_equal(ib.version, 1);
    assert_int_equal(st.n_used, 5);

    /* a different 3rd block: only two blocks match */
    tok[40] ^= 7;
    uint32_t c = prefill(p, tok, 80, &cached);
    assert_int_equal(cached, 32);
    assert_int_equal(kv_pool_check(p), 0);

    /* close all: published blocks stay cached, reusable after */
    kv_seq_close(p, a);
    kv_seq_close(p, b);
    kv_seq_close(p, c);
    kv_pool_stats(p, &st);
    assert_int_equal(st.n_used, 0);
    assert_int_equal(st.n_free + st.n_cached, 64);
    assert_true(st.n_cached > 0);
    tok[40] ^= 7;
    uint32_t d = prefill(p, tok, 80, &cached);
    assert_int_equal(cached, 64);
    kv_seq_close(p, d);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

/* Twins: sequences that open the same new prompt before either commits it (both get cached_len
 * 0 and prefill all of it). Whichever commits second shares the first one's published blocks
 * and frees its own, so they end with the ideal blocks plus one partial block each; and the
 * second twin's continuation is published under the shared chain, so a follow-up over either
 * twin's reply finds all of it. 2 and 4 twins, simultaneous (all open before any commit) and
 * staggered (one opens while another's prefill is half committed). */
static void twins_case(uint32_t n_twins, int staggered)
{
    const uint32_t n = 1000, bs = 16, reply = 40;
    kv_pool_t *p = mk_pool(1024, 16);
    uint32_t *tok = calloc(n + reply * n_twins + 64, sizeof(uint32_t));
    fill_tokens(tok, n, 77);
    uint32_t seq[4], done[4], cached;
    for (uint32_t t = 0; t < n_twins; t++) {
        assert_int_equal(kv_seq_open(p, tok, n, &seq[t], &done[t]), 0);
        /* staggered: the later twins find the first one's committed half in the cache */
        assert_int_equal(done[t], staggered && t ? (n / 2 / bs) * bs : 0);
        assert_int_equal(kv_seq_reserve(p, seq[t], n - done[t]), 0);
        if (staggered && t == 0) { /* the first twin's prefill is half in when the others open */
            assert_int_equal(kv_seq_commit(p, seq[0], tok, n / 2), 0);
            done[0] = n / 2;
        }
    }
    for (uint32_t t = 0; t < n_twins; t++) {
        assert_int_equal(kv_seq_commit(p, seq[t], tok + done[t], n - done[t]), 0);
        assert_int_equal(kv_pool_check(p), 0);
    }
    kv_stats_t st;
    kv_pool_stats(p, &st);
    uint32_t ideal = (n + bs - 1) / bs;
    if (st.n_used > ideal + n_twins - 1)
        fail_msg("%u twins: %u blocks used, ideal %u + one partial per twin", n_twins, st.n_used,
                 ideal);
    /* each twin replies differently; a follow-up turn over any twin's reply finds it all */
    for (uint32_t t = 0; t < n_twins; t++) {
        uint32_t r[40];
        for (uint32_t k = 0; k < reply; k++)
            r[k] = 5000 + t * 100 + k;
        assert_int_equal(kv_seq_reserve(p, seq[t], reply), 0);
        assert_int_equal(kv_seq_commit(p, seq[t], r, reply), 0);
    }
    assert_int_equal(kv_pool_check(p), 0);
    for (uint32_t t = 0; t < n_twins; t++) {
        uint32_t len = n + reply, follow[1064], f;
        memcpy(follow, tok, n * sizeof(uint32_t));
        for (uint32_t k = 0; k < reply; k++)
            follow[n + k] = 5000 + t * 100 + k;
        follow[len] = 1; /* the next user turn */
        for (uint32_t k = 1; k < 24; k++)
            follow[len + k] = k;
        assert_int_equal(kv_seq_open(p, follow, len + 24, &f, &cached), 0);
        if (cached != (len / bs) * bs)
            fail_msg("%u twins%s: follow-up over twin %u's reply found %u of %u tokens", n_twins,
                     staggered ? " (staggered)" : "", t, cached, (len / bs) * bs);
        kv_seq_close(p, f);
    }
    printf("%u twins%s: %u blocks used (ideal %u), %llu shared at commit\n", n_twins,
           staggered ? " (staggered)" : "", st.n_used, ideal, (unsigned long long)st.duplicates);
    for (uint32_t t = 0; t < n_twins; t++)
        kv_seq_close(p, seq[t]);
    assert_int_equal(kv_pool_check(p), 0);
    free(tok);
    kv_pool_free(p);
}

static void test_twins_share(void **state)
{
    (void)state;
    twins_case(2, 0);
    twins_case(4, 0);
    twins_case(2, 1);
    twins_case(4, 1);
}

/* Pending: a prompt's full blocks that another open sequence of the scope is about to write
 * are reported to a later opener until written (then they are cached), truncated or closed;
 * another scope sees none; the intent counts stay consistent (kv_pool_check) throughout. */
static uint32_t open_pending(kv_pool_t *p, uint64_t scope, const uint32_t *tok, uint32_t n,
                             uint32_t want_cached, uint32_t want_pending)
{
    uint32_t s, cached = 99, pending = 99;
    assert_int_equal(kv_seq_open_pending(p, scope, tok, n, &s, &cached, &pending), 0);
    assert_int_equal(cached, want_cached);
    assert_int_equal(pending, want_pending);
    assert_int_equal(kv_pool_check(p), 0);
    return s;
}

static void test_pending_blocks(void **state)
{
    (void)state;
    kv_pool_t *p = mk_pool(64, 12);
    uint32_t tok[57], two[40];
    fill_tokens(tok, 57, 5); /* 3 full blocks, all eligible */
    fill_tokens(two, 40, 6);
    uint32_t a = open_pending(p, 0, tok, 57, 0, 0);
    uint32_t b = open_pending(p, 0, tok, 57, 0, 48);       /* a twin: all three about to be */
    uint32_t g = open_pending(p, 7, tok, 57, 0, 0);        /* another scope sees nothing */
    uint32_t shorter = open_pending(p, 0, tok, 40, 0, 32); /* eligible: (40 - 1) / 16 = 2 */
    assert_int_equal(kv_seq_reserve(p, a, 57), 0);
    assert_int_equal(kv_seq_commit(p, a, tok, 20), 0); /* block 0 written */
    assert_int_equal(kv_pool_check(p), 0);
    uint32_t c = open_pending(p, 0, tok, 57, 16, 32); /* block 0 cached, 1 and 2 still pending */
    assert_int_equal(kv_seq_close(p, b), 0);
    uint32_t d = open_pending(p, 0, tok, 57, 16, 32); /* a and c still intend them */
    assert_int_equal(kv_seq_commit(p, a, tok + 20, 37), 0);
    assert_int_equal(kv_pool_check(p), 0);
    uint32_t e = open_pending(p, 0, tok, 57, 48, 0); /* all written: cached, nothing pending */
    uint32_t ids[] = {a, c, d, e, g, shorter};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        assert_int_equal(kv_seq_close(p, ids[i]), 0);
    assert_int_equal(kv_pool_check(p), 0);
    /* a reservation given back at the same length (a failed or aborted step) keeps what it is
     * about to write; a fork's child intends nothing; truncating below its length (a rollback)
     * releases it */
    uint32_t h = open_pending(p, 0, two, 40, 0, 0);
    kv_copy_t cp;
    assert_int_equal(kv_seq_reserve(p, h, 40), 0);
    assert_int_equal(kv_seq_truncate(p, h, 0, &cp), 0);
    uint32_t i2 = open_pending(p, 0, two, 40, 0, 32);
    assert_int_equal(kv_seq_close(p, i2), 0);
    assert_int_equal(kv_seq_reserve(p, h, 40), 0);
    assert_int_equal(kv_seq_commit(p, h, two, 8), 0); /* half a block */
    uint32_t child;
    assert_int_equal(kv_seq_fork(p, h, &child, &cp), 0);
    assert_int_equal(kv_pool_check(p), 0);
    assert_int_equal(kv_seq_truncate(p, h, 4, &cp), 0);
    uint32_t j = open_pending(p, 0, two, 40, 0, 0);
    assert_int_equal(kv_seq_close(p, h), 0);
    assert_int_equal(kv_seq_close(p, child), 0);
    assert_int_equal(kv_seq_close(p, j), 0);
    assert_int_equal(kv_pool_check(p), 0);
    /* a prompt of exactly 3 blocks leaves its last token to compute: 2 eligible, 3 intended */
    uint32_t three[48];
    fill_tokens(three, 48, 8);
    uint32_t x = open_pending(p, 0, three, 48, 0, 0);
    uint32_t y = open_pending(p, 0, three, 48, 0, 32);
    assert_int_equal(kv_seq_close(p, x), 0);
    assert_int_equal(kv_seq_close(p, y), 0);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

static void test_model_id_separates_caches(void **state)
{
    uint32_t tok[40];
    fill_tokens(tok, 40, 3);
    kv_pool_config_t c = {.n_blocks = 32, .block_size = BS, .max_seqs = 4, .max_seq_len = 512};
    c.model_id = 1;
    kv_pool_t *p1 = NULL, *p2 = NULL;
    kv_pool_create(&c, &p1);
    c.model_id = 2;
    kv_pool_create(&c, &p2);
    uint32_t s1 = prefill(p1, tok, 40, NULL);
    kv_seq_close(p1, s1);
    uint32_t cached;
    assert_int_equal(kv_seq_open(p1, tok, 40, &s1, &cached), 0);
    assert_int_equal(cached, 32);
    prefill(p2, tok, 40, NULL);
    /* the hash includes the model id: a block published under model 1 is not found in model 2 */
    kv_stats_t st;
    kv_pool_stats(p2, &st);
    assert_int_equal(st.hit_blocks, 0);
    kv_pool_free(p1);
    kv_pool_free(p2);
}

static void test_enospc_changes_nothing(void **state)
{
    kv_pool_t *p = mk_pool(4, 4);
    uint32_t tok[64], s, cached;
    fill_tokens(tok, 64, 9);
    assert_int_equal(kv_seq_open(p, tok, 64, &s, &cached), 0);
    assert_int_equal(kv_seq_reserve(p, s, 48), 0); /* 3 blocks */
    kv_stats_t before, after;
    kv_pool_stats(p, &before);
    assert_int_equal(kv_seq_reserve(p, s, 80), -ENOSPC); /* 5 blocks > 4 */
    kv_pool_stats(p, &after);
    assert_memory_equal(&before, &after, sizeof(before));
    kv_seq_info_t info;
    kv_seq_info(p, s, &info);
    assert_int_equal(info.n_blocks, 3);
    assert_int_equal(kv_seq_reserve(p, s, 64), 0); /* exactly 4 fits */
    /* idempotent */
    assert_int_equal(kv_seq_reserve(p, s, 64), 0);
    kv_pool_stats(p, &after);
    assert_int_equal(after.n_free, 0);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

static void test_bad_ids_and_limits(void **state)
{
    kv_pool_t *p = mk_pool(16, 2);
    uint32_t tok[20], a, b, c, cached;
    kv_copy_t cp;
    fill_tokens(tok, 20, 5);
    assert_int_equal(kv_seq_open(p, tok, 0, &a, &cached), -EINVAL);
    assert_int_equal(kv_seq_open(p, NULL, 3, &a, &cached), -EINVAL);
    assert_int_equal(kv_seq_open(p, tok, 20, &a, &cached), 0);
    assert_int_equal(kv_seq_open(p, tok, 20, &b, &cached), 0);
    assert_int_equal(kv_seq_open(p, tok, 20, &c, &cached), -EMFILE);
    assert_int_equal(kv_seq_fork(p, a, &c, &cp), -EMFILE);
    assert_int_equal(kv_seq_close(p, a), 0);
    /* a stale id must not name the slot's next occupant */
    assert_int_equal(kv_seq_open(p, tok, 20, &c, &cached), 0);
    assert_int_equal(kv_seq_close(p, a), -ENOENT);
    assert_int_equal(kv_seq_reserve(p, a, 1), -ENOENT);
    assert_int_equal(kv_seq_commit(p, a, tok, 1), -ENOENT);
    assert_int_equal(kv_seq_truncate(p, a, 0, &cp), -ENOENT);
    assert_int_equal(kv_seq_reserve(p, 0xdeadbeef, 1), -ENOENT);
    /* commit beyond the reservation */
    assert_int_equal(kv_seq_commit(p, c, tok, 1), -EINVAL);
    assert_int_equal(kv_seq_reserve(p, c, 4), 0);
    assert_int_equal(kv_seq_commit(p, c, tok, 17), -EINVAL);
    assert_int_equal(kv_seq_commit(p, c, tok, 4), 0);
    assert_int_equal(kv_seq_truncate(p, c, 5, &cp), -EINVAL);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

static void test_fork_copies_partial_block(void **state)
{
    kv_pool_t *p = mk_pool(16, 4);
    uint32_t tok[40], child;
    kv_copy_t cp;
    fill_tokens(tok, 40, 11);
    uint32_t a = prefill(p, tok, 40, NULL); /* 2 full + 8 tokens */
    assert_int_equal(kv_seq_fork(p, a, &child, &cp), 0);
    kv_seq_info_t ia, ic;
    kv_seq_info(p, a, &ia);
    kv_seq_info(p, child, &ic);
    assert_int_equal(ic.len, 40);
    assert_int_equal(ic.blocks[0], ia.blocks[0]);
    assert_int_equal(ic.blocks[1], ia.blocks[1]);
    assert_int_equal(cp.src, ia.blocks[2]);
    assert_int_equal(cp.dst, ic.blocks[2]);
    assert_int_not_equal(cp.src, cp.dst);
    /* the parent's two full blocks are shared: 6 block-table entries over 4 blocks */
    kv_stats_t ks;
    kv_pool_stats(p, &ks);
    assert_int_equal(ks.n_logical, 6);
    assert_int_equal(ks.n_used, 4);
    /* block-aligned: nothing to copy */
    uint32_t c2, a2 = prefill(p, tok, 32, NULL);
    assert_int_equal(kv_seq_fork(p, a2, &c2, &cp), 0);
    assert_int_equal(cp.src, KV_NONE);
    assert_int_equal(kv_pool_check(p), 0); /* the counter against the block tables too */
    assert_int_equal(kv_seq_close(p, child), 0);
    kv_pool_stats(p, &ks);
    assert_int_equal(ks.n_logical, 3 + 2 + 2);
    kv_pool_free(p);
}

static void test_truncate_cow(void **state)
{
    kv_pool_t *p = mk_pool(16, 4);
    uint32_t tok[48], child;
    kv_copy_t cp;
    fill_tokens(tok, 48, 13);
    uint32_t a = prefill(p, tok, 48, NULL); /* 3 full published blocks */
    assert_int_equal(kv_seq_fork(p, a, &child, &cp), 0);
    kv_seq_info_t ia;
    kv_seq_info(p, a, &ia);
    uint32_t shared1 = ia.blocks[1];
    /* truncate into the middle of shared block 1: must get a private copy */
    assert_int_equal(kv_seq_truncate(p, a, 20, &cp), 0);
    kv_seq_info(p, a, &ia);
    assert_int_equal(cp.src, shared1);
    assert_int_equal(cp.dst, ia.blocks[1]);
    assert_int_equal(ia.n_blocks, 2);
    /* truncate to a block boundary: no copy */
    assert_int_equal(kv_seq_truncate(p, child, 32, &cp), 0);
    assert_int_equal(cp.src, KV_NONE);
    /* an unshared, unpublished partial block is written in place */
    assert_int_equal(kv_seq_reserve(p, a, 4), 0);
    assert_int_equal(kv_seq_commit(p, a, tok + 20, 4), 0);
    assert_int_equal(kv_seq_truncate(p, a, 22, &cp), 0);
    assert_int_equal(cp.src, KV_NONE);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

/* eviction order: least recently released leaves first; a parent only after its children */
static void test_lru_leaves_first(void **state)
{
    kv_pool_t *p = mk_pool(8, 4);
    uint32_t ta[49], tb[49];
    fill_tokens(ta, 49, 21);
    fill_tokens(tb, 49, 22);
    uint32_t a = prefill(p, ta, 49, NULL); /* 3 full + 1 partial: 4 blocks */
    kv_seq_info_t ia;
    kv_seq_info(p, a, &ia);
    uint32_t a_blocks[3] = {ia.blocks[0], ia.blocks[1], ia.blocks[2]};
    kv_seq_close(p, a); /* a's 3 published blocks cached, 1 free */
    uint32_t b = prefill(p, tb, 49, NULL);
    kv_seq_close(p, b); /* b's released later: more recent */
    kv_stats_t st;
    kv_pool_stats(p, &st);
    assert_int_equal(st.n_cached, 6);
    assert_int_equal(st.n_evictable, 2); /* one leaf per chain */
    assert_int_equal(kv_pool_evict(p, 1), 1);
    /* a's leaf (block 2 of a) went first; a's first two blocks still match */
    uint32_t s, cached;
    assert_int_equal(kv_seq_open(p, ta, 49, &s, &cached), 0);
    assert_int_equal(cached, 32);
    kv_seq_info(p, s, &ia);
    assert_int_equal(ia.blocks[0], a_blocks[0]);
    assert_int_equal(ia.blocks[1], a_blocks[1]);
    kv_seq_close(p, s);
    assert_int_equal(kv_pool_evict(p, 100), 5);
    kv_pool_stats(p, &st);
    assert_int_equal(st.n_free, 8);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

/* reserving into a full pool reclaims cached chains, cascading through parents */
static void test_reserve_reclaims_whole_chains(void **state)
{
    kv_pool_t *p = mk_pool(6, 4);
    uint32_t tok[96], s, cached;
    fill_tokens(tok, 96, 31);
    s = prefill(p, tok, 96, NULL); /* 6 blocks, all published */
    kv_seq_close(p, s);
    kv_stats_t st;
    kv_pool_stats(p, &st);
    assert_int_equal(st.n_cached, 6);
    assert_int_equal(st.n_evictable, 1);
    assert_int_equal(kv_pool_available(p), 6);
    fill_tokens(tok, 96, 32);
    assert_int_equal(kv_seq_open(p, tok, 96, &s, &cached), 0);
    assert_int_equal(kv_seq_reserve(p, s, 96), 0);
    kv_pool_stats(p, &st);
    assert_int_equal(st.evictions, 6);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_free(p);
}

typedef struct ev_log {
    int stored, evicted;
} ev_log_t;

static void on_ev(void *ud, kv_event_type_t t, uint32_t block, uint64_t hash, uint64_t scope,
                  uint32_t parent)
{
    (void)parent;
    ev_log_t *l = ud;
    assert_true(hash != 0);
    if (t == KV_EVENT_STORED)
        l->stored++;
    else
        l->evicted++;
}

static void test_events(void **state)
{
    ev_log_t log = {0, 0};
    kv_pool_config_t c = {.n_blocks = 8,
                          .block_size = BS,
                          .max_seqs = 4,
                          .max_seq_len = 512,
                          .on_event = on_ev,
                          .event_ud = &log};
    kv_pool_t *p = NULL;
    kv_pool_create(&c, &p);
    uint32_t tok[40];
    fill_tokens(tok, 40, 40);
    uint32_t s = prefill(p, tok, 40, NULL);
    assert_int_equal(log.stored, 2);
    kv_seq_close(p, s);
    kv_pool_evict(p, 8);
    assert_int_equal(log.evicted, 2);
    kv_pool_free(p);
}

/* ------------------------------------------------------------------ the index (issue 37) */

static void on_index(void *ud, kv_event_type_t t, uint32_t block, uint64_t hash, uint64_t scope,
                     uint32_t parent)
{
    if (t == KV_EVENT_STORED)
        kv_index_stored(ud, block, hash, scope, parent);
    else
        kv_index_evicted(ud, block);
}

static const kv_index_id_t IX_ID = {.model_id = 7,
                                    .block_bytes = 4096,
                                    .n_blocks = 64,
                                    .block_size = BS,
                                    .layout = KV_INDEX_LAYOUT};

static kv_pool_t *ix_pool(void *mem)
{
    kv_pool_config_t c = {.n_blocks = IX_ID.n_blocks,
                          .block_size = BS,
                          .max_seqs = 16,
                          .max_seq_len = 1024,
                          .model_id = IX_ID.model_id,
                          .on_event = mem ? on_index : NULL,
                          .event_ud = mem};
    kv_pool_t *p = NULL;
    assert_int_equal(kv_pool_create(&c, &p), 0);
    return p;
}

/* A fresh pool over the index's entries: returns it; *ret_adopted, *ret_rejected */
static kv_pool_t *ix_restart(void *mem, uint32_t *ret_adopted, uint32_t *ret_rejected,
                             uint32_t *ret_torn)
{
    char why[128];
    assert_int_equal(kv_index_check(mem, kv_index_bytes(IX_ID.n_blocks), &IX_ID, why, sizeof(why)),
                     0);
    kv_adopt_t e[64];
    uint32_t n = kv_index_entries(mem, e, ret_torn);
    kv_pool_t *q = ix_pool(mem);
    assert_int_equal(kv_pool_adopt(q, e, n, ret_adopted, ret_rejected), 0);
    assert_int_equal(kv_pool_check(q), 0);
    return q;
}

/* cached tokens of tok in p, by a probe sequence opened and closed again */
static uint32_t ix_cached(kv_pool_t *p, const uint32_t *tok, uint32_t n, uint32_t *ret_blocks)
{
    uint32_t s, cached;
    assert_int_equal(kv_seq_open(p, tok, n, &s, &cached), 0);
    kv_seq_info_t info;
    assert_int_equal(kv_seq_info(p, s, &info), 0);
    for (uint32_t i = 0; ret_blocks && i < cached / BS; i++)
        ret_blocks[i] = info.blocks[i];
    assert_int_equal(kv_seq_close(p, s), 0);
    return cached;
}

/* Chains published before a "kill" (the pool dropped, its index kept) are cache hits after it,
 * in the same blocks; the ones evicted before are not; a torn entry drops its chain below it. */
static void test_index_survives_restart(void **state)
{
    (void)state;
    void *mem = malloc(kv_index_bytes(IX_ID.n_blocks));
    kv_index_format(mem, &IX_ID);
    kv_pool_t *p = ix_pool(mem);
    uint32_t a[96], b[96], c[64];
    fill_tokens(a, 96, 1);
    memcpy(b, a, 48 * sizeof(uint32_t)); /* b shares a's first 3 blocks */
    fill_tokens(b + 48, 48, 2);
    fill_tokens(c, 64, 3);
    uint32_t sa = prefill(p, a, 96, NULL);
    prefill(p, b, 96, NULL); /* still open at the kill: its blocks survive, the session not */
    uint32_t sc = prefill(p, c, 64, NULL);
    kv_seq_close(p, sa);
    kv_seq_close(p, sc);
    assert_int_equal(kv_pool_evict(p, 2), 2); /* c's last two blocks (its chain's leaves first) */
    uint32_t ba[6], bb[6], bc[4], xa[6], xb[6], xc[4];
    const uint32_t ca = ix_cached(p, a, 96, ba), cb = ix_cached(p, b, 96, bb),
                   cc = ix_cached(p, c, 64, bc);
    kv_stats_t st;
    kv_pool_stats(p, &st);
    kv_pool_free(p); /* kill -9: nothing more is written */

    uint32_t adopted, rejected, torn;
    kv_pool_t *q = ix_restart(mem, &adopted, &rejected, &torn);
    assert_int_equal(torn, 0);
    assert_int_equal(rejected, 0);
    assert_int_equal(st.published, 6 + 3 + 4); /* b's first 3 blocks are a's */
    assert_int_equal(adopted, st.published - st.evictions);
    assert_int_equal(ix_cached(q, a, 96, xa), ca);
    assert_int_equal(ix_cached(q, b, 96, xb), cb);
    assert_int_equal(ix_cached(q, c, 64, xc), cc);
    assert_true(ca < 95 && cb == 95 / BS * BS); /* the evictions took a's leaves; b was open */
    assert_memory_equal(xa, ba, ca / BS * sizeof(uint32_t));
    assert_memory_equal(xb, bb, cb / BS * sizeof(uint32_t));
    assert_memory_equal(xc, bc, cc / BS * sizeof(uint32_t));
    /* the adopted pool serves: a new prompt evicts adopted leaves, never a chain's middle */
    uint32_t big[60 * BS];
    fill_tokens(big, 60 * BS, 9);
    uint32_t s;
    assert_int_equal(kv_seq_open(q, big, 60 * BS, &s, NULL), 0);
    assert_int_equal(kv_seq_reserve(q, s, 60 * BS), 0);
    assert_int_equal(kv_pool_check(q), 0);
    kv_pool_free(q);

    /* torn: a's block 2 (below it a's blocks 3-5; b shares blocks 0-2 too) */
    kv_index_format(mem, &IX_ID);
    p = ix_pool(mem);
    prefill(p, a, 96, NULL);
    prefill(p, b, 96, NULL);
    kv_pool_free(p);
    ((uint8_t *)mem)[kv_index_bytes(0) + 32 * ba[2]] ^= 0x40; /* its hash, mid-write */
    q = ix_restart(mem, &adopted, &rejected, &torn);
    assert_int_equal(torn, 1);
    assert_int_equal(adopted, 2);  /* blocks 0 and 1 of the shared prefix */
    assert_int_equal(rejected, 6); /* a's 3-5 and b's 3-5, below the torn one */
    assert_int_equal(ix_cached(q, a, 96, NULL), 2 * BS);
    assert_int_equal(ix_cached(q, b, 96, NULL), 2 * BS);
    kv_pool_free(q);
    free(mem);
}

/* A different identity, a foreign or torn header: refused, and why says which. */
static void test_index_identity(void **state)
{
    (void)state;
    const uint64_t bytes = kv_index_bytes(IX_ID.n_blocks);
    void *mem = malloc(bytes);
    char why[128];
    kv_index_format(mem, &IX_ID);
    kv_index_id_t id = IX_ID;
    assert_int_equal(kv_index_check(mem, bytes, &id, why, sizeof(why)), 0);
    id.block_size = 32;
    assert_int_equal(kv_index_check(mem, bytes, &id, why, sizeof(why)), -ESTALE);
    assert_non_null(strstr(why, "block size"));
    id = IX_ID;
    id.model_id = 8;
    assert_int_equal(kv_index_check(mem, bytes, &id, why, sizeof(why)), -ESTALE);
    assert_non_null(strstr(why, "model"));
    id = IX_ID;
    id.device[3] = 1;
    assert_int_equal(kv_index_check(mem, bytes, &id, why, sizeof(why)), -ESTALE);
    assert_non_null(strstr(why, "device"));
    id = IX_ID;
    id.driver = 13000;
    assert_int_equal(kv_index_check(mem, bytes, &id, why, sizeof(why)), -ESTALE);
    assert_non_null(strstr(why, "driver"));
    id = IX_ID;
    id.layout = KV_INDEX_LAYOUT + 1;
    assert_int_equal(kv_index_check(mem, bytes, &id, why, sizeof(why)), -ESTALE);
    assert_int_equal(kv_index_check(mem, bytes - 32, &IX_ID, why, sizeof(why)), -EPROTO);
    assert_non_null(strstr(why, "size"));
    ((uint8_t *)mem)[20] ^= 1; /* inside the identity: the header's checksum fails */
    assert_int_equal(kv_index_check(mem, bytes, &IX_ID, why, sizeof(why)), -EPROTO);
    assert_non_null(strstr(why, "checksum"));
    memset(mem, 0x5a, bytes);
    assert_int_equal(kv_index_check(mem, bytes, &IX_ID, why, sizeof(why)), -EPROTO);
    assert_non_null(strstr(why, "not a patd cache index"));
    free(mem);
}

/* Random opens, prefills, closes and evictions; after each, a copy of the index is what a kill
 * then would leave: adopted into a fresh pool it passes the pool check, rejects nothing, and
 * every prompt hits exactly as much of the cache as in the pool that wrote it. */
static void test_index_random_kills(void **state)
{
    (void)state;
    const uint64_t bytes = kv_index_bytes(IX_ID.n_blocks);
    void *mem = malloc(bytes), *snap = malloc(bytes);
    kv_index_format(mem, &IX_ID);
    kv_pool_t *p = ix_pool(mem);
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x1d3));
    uint32_t open_s[16], n_open = 0, prompts[8][128];
    for (uint32_t f = 0; f < 8; f++) {
        fill_tokens(prompts[f], 128, 50 + f / 2); /* pairs share a family's tokens ... */
        prompts[f][64 + (f % 2)] ^= 1;            /* ... up to their 5th block */
    }
    for (int it = 0; it < 200; it++) {
        const uint32_t op = tl_rng_below(&r, 4), f = tl_rng_below(&r, 8),
                       len = 16 + tl_rng_below(&r, 113);
        if (op <= 1 && n_open < 15 && kv_pool_available(p) >= 8) { /* one slot for probes */
            uint32_t s, cached;
            assert_int_equal(kv_seq_open(p, prompts[f], len, &s, &cached), 0);
            assert_int_equal(kv_seq_reserve(p, s, len - cached), 0);
            assert_int_equal(kv_seq_commit(p, s, prompts[f] + cached, len - cached), 0);
            open_s[n_open++] = s;
        } else if (op == 2 && n_open) {
            const uint32_t k = tl_rng_below(&r, n_open);
            assert_int_equal(kv_seq_close(p, open_s[k]), 0);
            open_s[k] = open_s[--n_open];
        } else
            kv_pool_evict(p, tl_rng_below(&r, 4));
        if (it % 10 != 9)
            continue;
        memcpy(snap, mem, bytes);
        uint32_t adopted, rejected, torn;
        kv_pool_t *q = ix_restart(snap, &adopted, &rejected, &torn);
        assert_int_equal(rejected + torn, 0);
        for (uint32_t g = 0; g < 8; g++)
            assert_int_equal(ix_cached(q, prompts[g], 128, NULL),
                             ix_cached(p, prompts[g], 128, NULL));
        kv_pool_free(q);
    }
    kv_pool_free(p);
    free(mem);
    free(snap);
}

/* ------------------------------------------------------------------ randomized model test */

#define R_BLOCKS 64u
#define R_SEQS   12u
#define R_MAXLEN 400u

typedef struct mseq {
    int open;
    uint32_t id;
    uint32_t len;
    uint32_t tok[R_MAXLEN];
} mseq_t;

typedef struct model {
    mseq_t s[R_SEQS];
    uint32_t content[R_BLOCKS][BS]; /* token written into each physical slot */
} model_t;

static void do_copy(model_t *m, kv_copy_t cp)
{
    if (cp.src != KV_NONE)
        memcpy(m->content[cp.dst], m->content[cp.src], sizeof(m->content[0]));
}

static void write_tokens(kv_pool_t *p, model_t *m, mseq_t *q, const uint32_t *t, uint32_t n)
{
    kv_seq_info_t info;
    assert_int_equal(kv_seq_info(p, q->id, &info), 0);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t pos = q->len + i;
        m->content[info.blocks[pos / BS]][pos % BS] = t[i];
        q->tok[pos] = t[i];
    }
    assert_int_equal(kv_seq_commit(p, q->id, t, n), 0);
    q->len += n;
}

static void verify_views(kv_pool_t *p, model_t *m)
{
    assert_int_equal(kv_pool_check(p), 0);
    for (uint32_t i = 0; i < R_SEQS; i++) {
        mseq_t *q = &m->s[i];
        if (!q->open)
            continue;
        kv_seq_info_t info;
        assert_int_equal(kv_seq_info(p, q->id, &info), 0);
        assert_int_equal(info.len, q->len);
        for (uint32_t pos = 0; pos < q->len; pos++)
            assert_int_equal(m->content[info.blocks[pos / BS]][pos % BS], q->tok[pos]);
    }
}

static void make_prompt(tl_rng_t *r, uint32_t *t, uint32_t n)
{
    /* a few families with long common prefixes, so the cache hits often */
    uint32_t fam = tl_rng_below(r, 3), div = tl_rng_range(r, 0, n);
    for (uint32_t i = 0; i < n; i++)
        t[i] = i < div ? fam * 1000 + i : (uint32_t)tl_rng_u64(r);
}

static void test_random_ops_against_model(void **state)
{
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x6b76));
    for (int round = 0; round < 6; round++) {
        kv_pool_t *p = mk_pool(R_BLOCKS, R_SEQS);
        model_t *m = calloc(1, sizeof(*m));
        uint32_t ops = 4000, enospc = 0, hits = 0, max_used = 0;
        for (uint32_t op = 0; op < ops; op++) {
            uint32_t k = tl_rng_below(&r, R_SEQS);
            mseq_t *q = &m->s[k];
            uint32_t what = tl_rng_below(&r, 100);
            kv_stats_t before, after;
            kv_pool_stats(p, &before);
            if (!q->open) {
                uint32_t n = tl_rng_range(&r, 1, 200), t[200], cached;
                make_prompt(&r, t, n);
                int rc = kv_seq_open(p, t, n, &q->id, &cached);
                assert_int_equal(rc, 0);
                /* a hit must be real: the cached blocks hold exactly these tokens */
                kv_seq_info_t info;
                kv_seq_info(p, q->id, &info);
                for (uint32_t pos = 0; pos < cached; pos++)
                    assert_int_equal(m->content[info.blocks[pos / BS]][pos % BS], t[pos]);
                hits += cached > 0;
                q->open = 1;
                memcpy(q->tok, t, cached * sizeof(uint32_t));
                q->len = cached;
                rc = kv_seq_reserve(p, q->id, n - cached);
                if (rc == -ENOSPC) {
                    enospc++;
                } else {
                    assert_int_equal(rc, 0);
                    write_tokens(p, m, q, t + cached, n - cached);
                }
            } else if (what < 55) { /* decode / extend */
                uint32_t n = tl_rng_range(&r, 1, 24), t[24];
                if (q->len + n > R_MAXLEN)
                    continue;
                for (uint32_t i = 0; i < n; i++)
                    t[i] = (uint32_t)tl_rng_u64(&r);
                int rc = kv_seq_reserve(p, q->id, n);
                if (rc == -ENOSPC) {
                    kv_pool_stats(p, &after);
                    assert_memory_equal(&before, &after, sizeof(before));
                    enospc++;
                    continue;
                }
                assert_int_equal(rc, 0);
                /* sometimes commit only part of the reservation */
                write_tokens(p, m, q, t, tl_rng_range(&r, 1, n));
            } else if (what < 65) { /* fork into a free model slot */
                uint32_t j = 0;
                while (j < R_SEQS && m->s[j].open)
                    j++;
                if (j == R_SEQS)
                    continue;
                kv_copy_t cp;
                int rc = kv_seq_fork(p, q->id, &m->s[j].id, &cp);
                if (rc == -ENOSPC) {
                    kv_pool_stats(p, &after);
                    assert_memory_equal(&before, &after, sizeof(before));
                    enospc++;
                    continue;
                }
                assert_int_equal(rc, 0);
                do_copy(m, cp);
                m->s[j].open = 1;
                m->s[j].len = q->len;
                memcpy(m->s[j].tok, q->tok, q->len * sizeof(uint32_t));
            } else if (what < 75) { /* truncate (speculative decoding rollback) */
                uint32_t nl = tl_rng_range(&r, 0, q->len);
                kv_copy_t cp;
                int rc = kv_seq_truncate(p, q->id, nl, &cp);
                if (rc == -ENOSPC) {
                    kv_pool_stats(p, &after);
                    assert_memory_equal(&before, &after, sizeof(before));
                    enospc++;
                    continue;
                }
                assert_int_equal(rc, 0);
                do_copy(m, cp);
                q->len = nl;
            } else if (what < 88) {
                assert_int_equal(kv_seq_close(p, q->id), 0);
                q->open = 0;
            } else {
                kv_pool_evict(p, tl_rng_range(&r, 1, 8));
            }
            verify_views(p, m);
            kv_pool_stats(p, &after);
            if (after.n_used > max_used)
                max_used = after.n_used;
        }
        for (uint32_t i = 0; i < R_SEQS; i++)
            if (m->s[i].open)
                assert_int_equal(kv_seq_close(p, m->s[i].id), 0);
        kv_stats_t st;
        kv_pool_stats(p, &st);
        assert_int_equal(st.n_used, 0);
        assert_int_equal(st.n_seqs, 0);
        assert_int_equal(kv_pool_evict(p, R_BLOCKS), st.n_cached);
        kv_pool_stats(p, &st);
        assert_int_equal(st.n_free, R_BLOCKS); /* nothing leaked */
        assert_int_equal(kv_pool_check(p), 0);
        assert_true(hits > 0);
        fprintf(stderr, "round %d: hits %u enospc %u max_used %u\n", round, hits, enospc, max_used);
        assert_true(enospc > 0); /* the pool is small enough that exhaustion was exercised */
        free(m);
        kv_pool_free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_rejects_bad_config),
        cmocka_unit_test(test_prefix_reuse_and_counters),
        cmocka_unit_test(test_model_id_separates_caches),
        cmocka_unit_test(test_scopes_separate_prefixes),
        cmocka_unit_test(test_twins_share),
        cmocka_unit_test(test_pending_blocks),
        cmocka_unit_test(test_enospc_changes_nothing),
        cmocka_unit_test(test_bad_ids_and_limits),
        cmocka_unit_test(test_fork_copies_partial_block),
        cmocka_unit_test(test_truncate_cow),
        cmocka_unit_test(test_lru_leaves_first),
        cmocka_unit_test(test_reserve_reclaims_whole_chains),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_index_survives_restart),
        cmocka_unit_test(test_index_identity),
        cmocka_unit_test(test_index_random_kills),
        cmocka_unit_test(test_random_ops_against_model),
    };
    return cmocka_run_group_tests_name("kvcache", tests, NULL, NULL);
}
