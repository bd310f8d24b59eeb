/*
 * test_forest.c — the incremental prefix forest equals one rebuilt from scratch after every
 * join, leave and grow of long random sequences; its invariants hold throughout; and its error
 * codes and version counter behave as documented.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sched_forest.h"
#include "tl_rng.h"
#include "tl_world.h"

#define BS 16u

static sched_query_t view(const tl_query_t *q)
{
    return (sched_query_t){.blocks = q->blocks,
                           .n_blocks = q->n_blocks,
                           .kv_len = q->kv_len,
                           .n_new = q->n_new,
                           .tok_off = q->tok_off};
}

static void test_errors(void **state)
{
    sched_forest_t *f;
    assert_int_equal(sched_forest_create(0, BS, &f), -EINVAL);
    assert_int_equal(sched_forest_create(4, 0, &f), -EINVAL);
    assert_int_equal(sched_forest_create(4, BS, &f), 0);
    uint32_t blocks[3] = {1, 2, 3};
    sched_query_t q = {.blocks = blocks, .n_blocks = 3, .kv_len = 40, .n_new = 1};
    assert_int_equal(sched_forest_join(f, 4, &q), -EINVAL);
    q.kv_len = 49; /* needs 4 blocks */
    assert_int_equal(sched_forest_join(f, 0, &q), -EINVAL);
    q.kv_len = 40;
    q.n_new = 0;
    assert_int_equal(sched_forest_join(f, 0, &q), -EINVAL);
    q.n_new = 41;
    assert_int_equal(sched_forest_join(f, 0, &q), -EINVAL);
    q.n_new = 1;
    assert_int_equal(sched_forest_join(f, 0, &q), 0);
    assert_int_equal(sched_forest_join(f, 0, &q), -EEXIST);
    assert_int_equal(sched_forest_leave(f, 1), -ENOENT);
    assert_int_equal(sched_forest_grows(f, 1, &q), 0);
    assert_int_equal(sched_forest_grow(f, 1, &q), -ENOENT);
    q.kv_len = 39;
    assert_int_equal(sched_forest_grows(f, 0, &q), 0);
    assert_int_equal(sched_forest_grow(f, 0, &q), -EINVAL); /* shrank */
    q.kv_len = 41;
    blocks[1] = 99; /* last full block changed: not a growth */
    assert_int_equal(sched_forest_grows(f, 0, &q), 0);
    assert_int_equal(sched_forest_grow(f, 0, &q), -EINVAL);
    blocks[1] = 2;
    blocks[0] = 77; /* an earlier entry changed (a twin's copy): the table version says so */
    q.table_version = 1;
    assert_int_equal(sched_forest_grows(f, 0, &q), 0);
    assert_int_equal(sched_forest_grow(f, 0, &q), -EINVAL);
    blocks[0] = 1;
    q.table_version = 0;
    assert_int_equal(sched_forest_grows(f, 0, &q), 1);
    assert_int_equal(sched_forest_grow(f, 0, &q), 0); /* unchanged: a growth */
    assert_int_equal(sched_forest_check(f), 0);
    sched_forest_free(f);
}

/* Two queries sharing two blocks, then a third sharing one: node boundaries as expected. */
static void test_shape_and_version(void **state)
{
    sched_forest_t *f;
    assert_int_equal(sched_forest_create(8, BS, &f), 0);
    uint32_t a[4] = {10, 11, 12, 13}, b[4] = {10, 11, 22, 23}, c[4] = {10, 31, 32, 33};
    sched_query_t qa = {.blocks = a, .n_blocks = 4, .kv_len = 60, .n_new = 1};
    sched_query_t qb = qa, qc = qa;
    qb.blocks = b;
    qc.blocks = c;
    sched_forest_join(f, 0, &qa);
    sched_forest_join(f, 1, &qb);
    assert_int_equal(sched_forest_n_nodes(f), 3); /* [10 11] + 2 leaves */
    sched_forest_join(f, 2, &qc);
    assert_int_equal(sched_forest_n_nodes(f), 5); /* [10] -> ([11] -> a, b), c */
    assert_int_equal(sched_forest_depth(f), 3);
    assert_int_equal(sched_forest_check(f), 0);

    /* decode growth inside the partial block keeps the version (lazy update applies) */
    uint64_t v = sched_forest_version(f);
    qa.kv_len = 61;
    qa.tok_off = 5;
    assert_int_equal(sched_forest_grow(f, 0, &qa), 0);
    assert_int_equal(sched_forest_version(f), v);
    /* a different number of new tokens changes rows: version moves */
    qa.kv_len = 63;
    qa.n_new = 2;
    assert_int_equal(sched_forest_grow(f, 0, &qa), 0);
    assert_true(sched_forest_version(f) != v);

    sched_forest_leave(f, 2);
    assert_int_equal(sched_forest_n_nodes(f), 3);
    sched_forest_leave(f, 1);
    assert_int_equal(sched_forest_n_nodes(f), 1);
    assert_int_equal(sched_forest_check(f), 0);
    sched_forest_free(f);
}

/* A partial block shared by two queries becomes shared structure once it is full for both. */
static void test_grow_creates_sharing(void **state)
{
    sched_forest_t *f, *g;
    sched_forest_create(4, BS, &f);
    sched_forest_create(4, BS, &g);
    uint32_t a[3] = {1, 2, 3}, b[3] = {1, 2, 4};
    sched_query_t qa = {.blocks = a, .n_blocks = 2, .kv_len = 20, .n_new = 1};
    sched_query_t qb = {.blocks = b, .n_blocks = 2, .kv_len = 32, .n_new = 1};
    sched_forest_join(f, 0, &qa);
    sched_forest_join(f, 1, &qb);
    assert_int_equal(sched_forest_n_nodes(f), 3); /* [1] -> a (2 partial), b (2 full) */
    qa.kv_len = 33;
    qa.n_blocks = 3;
    uint64_t v = sched_forest_version(f);
    assert_int_equal(sched_forest_grow(f, 0, &qa), 0);
    assert_true(sched_forest_version(f) != v);
    assert_int_equal(sched_forest_check(f), 0);
    sched_forest_join(g, 0, &qa);
    sched_forest_join(g, 1, &qb);
    assert_true(sched_forest_equal(f, g));
    assert_int_equal(sched_forest_n_nodes(f), 3); /* [1 2] -> a, b */
    sched_forest_free(f);
    sched_forest_free(g);
}

static void rebuild_and_compare(const tl_world_t *w, const uint8_t *in, sched_forest_t *inc,
                                sched_forest_t *fresh)
{
    assert_int_equal(sched_forest_check(inc), 0);
    sched_forest_clear(fresh);
    for (uint32_t i = 0; i < w->n_q; i++) {
        if (!in[i])
            continue;
        sched_query_t q = view(&w->q[i]);
        assert_int_equal(sched_forest_join(fresh, i, &q), 0);
    }
    assert_int_equal(sched_forest_check(fresh), 0);
    assert_true(sched_forest_equal(inc, fresh));
}

static void test_incremental_equals_rebuilt(void **state)
{
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0xf0e5));
    uint64_t total_ops = 0;
    for (int round = 0; round < 1000; round++) { /* 1,000 random op sequences */
        tl_world_params_t p = {.bs = BS,
                               .trees = tl_rng_range(&r, 1, 3),
                               .depth_lo = 0,
                               .depth_hi = 5,
                               .fanout_lo = 1,
                               .fanout_hi = tl_rng_range(&r, 2, 6),
                               .level_tok_lo = 1,
                               .level_tok_hi = 64,
                               .leaf_tok_lo = 1,
                               .leaf_tok_hi = 40,
                               .new_lo = 1,
                               .new_hi = 1,
                               .max_queries = 32,
                               .spare_blocks = 8};
        tl_world_t w;
        tl_world_gen(&w, &r, &p);
        /* clones: queries that share another's blocks, partial last block included, so that
         * growth later turns a shared partial block into shared structure */
        uint32_t n_orig = w.n_q;
        for (uint32_t k = 0; k < n_orig / 4 && w.n_q < p.max_queries; k++) {
            const tl_query_t *src = &w.q[tl_rng_below(&r, n_orig)];
            tl_query_t *q = &w.q[w.n_q++];
            *q = *src;
            q->cap_blocks = src->n_blocks + 8;
            q->blocks = malloc(q->cap_blocks * sizeof(uint32_t));
            memcpy(q->blocks, src->blocks, src->n_blocks * sizeof(uint32_t));
        }
        sched_forest_t *f, *fresh;
        assert_int_equal(sched_forest_create(w.n_q, BS, &f), 0);
        assert_int_equal(sched_forest_create(w.n_q, BS, &fresh), 0);
        uint8_t *in = calloc(w.n_q, 1);
        for (int op = 0; op < 60; op++) {
            uint32_t i = tl_rng_below(&r, w.n_q), what = tl_rng_below(&r, 10);
            if (!in[i]) {
                sched_query_t q = view(&w.q[i]);
                assert_int_equal(sched_forest_join(f, i, &q), 0);
                in[i] = 1;
            } else if (what < 6) {
                /* decode or extend; a clone grows into its source's next block sometimes */
                uint32_t n = tl_rng_range(&r, 1, what < 4 ? 1 : 2 * BS);
                tl_world_grow(&w, i, n);
                sched_query_t q = view(&w.q[i]);
                assert_int_equal(sched_forest_grows(f, i, &q), 1);
                assert_int_equal(sched_forest_grow(f, i, &q), 0);
            } else {
                assert_int_equal(sched_forest_leave(f, i), 0);
                in[i] = 0;
            }
            rebuild_and_compare(&w, in, f, fresh);
            total_ops++;
        }
        free(in);
        sched_forest_free(f);
        sched_forest_free(fresh);
        tl_world_free(&w);
    }
    assert_true(total_ops == 60000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_shape_and_version),
        cmocka_unit_test(test_grow_creates_sharing),
        cmocka_unit_test(test_incremental_equals_rebuilt),
    };
    return cmocka_run_group_tests_name("forest", tests, NULL, NULL);
}
