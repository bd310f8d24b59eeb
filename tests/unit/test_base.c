/*
 * test_base.c — daemon/base, the leaf every module shares: the allocation wrappers and the OOM
 * handler they report through (a test handler that records the size and jumps back; the default
 * handler in a child process that must abort), pat_grow, the macros, the clock, and pat_map
 * (linear probing with backward-shift deletion) against a plain array under random churn in a
 * table small enough that probes collide and wrap around its end; the fp8 conversions of
 * pat_fp8.h against an independent reference (every code decoded by its formula, every value
 * encoded as the nearest code found by search over all of them).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pat_base.h"
#include "pat_fp8.h"
#include "pat_map.h"

#if defined(__SANITIZE_ADDRESS__)
/* The OOM tests ask for allocations no allocator can satisfy; ASan's allocator would report
 * them as errors instead of returning NULL as malloc does. */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

/* ---------------------------------------------------------------- OOM handler */

static jmp_buf oom_jump;
static size_t oom_bytes;
static int oom_calls;

static void oom_record(size_t bytes)
{
    oom_bytes = bytes;
    oom_calls++;
    longjmp(oom_jump, 1);
}

/* Runs an allocation expected to fail; returns the size the handler saw (or 0 if the
 * allocation did not fail). */
#define EXPECT_OOM(expr)                                                                           \
    do {                                                                                           \
        oom_bytes = 0;                                                                             \
        if (setjmp(oom_jump) == 0) {                                                               \
            void *volatile leak_ = (expr);                                                         \
            free(leak_);                                                                           \
            fail_msg("%s did not fail", #expr);                                                    \
        }                                                                                          \
    } while (0)

static void test_oom_handler(void **state)
{
    pat_oom_handler_t prev = pat_set_oom_handler(oom_record);
    assert_non_null(prev); /* the default */
    oom_calls = 0;

    /* pat_oom itself hands the handler the size */
    if (setjmp(oom_jump) == 0)
        pat_oom(12345);
    assert_int_equal(oom_calls, 1);
    assert_int_equal(oom_bytes, 12345);

    /* the wrappers report the size they asked for (sizes no allocator can give: volatile, so
     * the compiler cannot see them) */
    volatile size_t huge = SIZE_MAX / 2 + 1, half = SIZE_MAX / 4;
    EXPECT_OOM(pat_xmalloc(huge));
    assert_int_equal(oom_bytes, SIZE_MAX / 2 + 1);
    void *small = pat_xmalloc(16);
    EXPECT_OOM(pat_xrealloc(small, huge - 1));
    assert_int_equal(oom_bytes, SIZE_MAX / 2);
    free(small); /* realloc failing leaves the block alone */
    EXPECT_OOM(pat_xcalloc(2, half));
    assert_int_equal(oom_bytes, 2 * (SIZE_MAX / 4));
    /* count * size overflowing is reported as SIZE_MAX, not as the wrapped product */
    EXPECT_OOM(pat_xcalloc(half, 16));
    assert_int_equal(oom_bytes, SIZE_MAX);
    assert_int_equal(oom_calls, 5);

    /* NULL restores the default, and setting returns what was set before */
    assert_ptr_equal(pat_set_oom_handler(NULL), oom_record);
    assert_ptr_equal(pat_set_oom_handler(oom_record), prev);
    assert_ptr_equal(pat_set_oom_handler(prev), oom_record);
}

static void oom_returns(size_t bytes)
{
    fprintf(stderr, "test handler: %zu bytes\n", bytes);
}

/* In a child with stderr on a pipe: pat_oom(n) after installing h (NULL: the default). Returns
 * what the child wrote, and checks that it died of SIGABRT. */
static void oom_in_child(pat_oom_handler_t h, size_t n, char *out, size_t out_len)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        signal(SIGABRT, SIG_DFL);
        pat_set_oom_handler(h);
        pat_oom(n);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < out_len && (r = read(fd[0], out + got, out_len - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = 0;
    close(fd[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
}

static void test_oom_default_aborts(void **state)
{
    char out[4096];
    /* the default names the program: "patd" in the daemon, this test's name here */
    oom_in_child(NULL, 77, out, sizeof(out));
    assert_non_null(strstr(out, "<2>test_base: host out of memory allocating 77 bytes\n"));
    /* a handler that returns does not keep the process alive */
    oom_in_child(oom_returns, 78, out, sizeof(out));
    assert_non_null(strstr(out, "test handler: 78 bytes\n"));
    assert_null(strstr(out, "host out of memory"));
}

/* ---------------------------------------------------------------- helpers */

static void test_alloc_and_grow(void **state)
{
    /* n == 0 yields distinct valid pointers */
    void *a = pat_xmalloc(0), *b = pat_xmalloc(0), *c = pat_xcalloc(0, 8);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_ptr_not_equal(a, b);
    free(a);
    free(b);
    free(c);
    uint8_t *z = pat_xcalloc(100, 3);
    for (int i = 0; i < 300; i++)
        assert_int_equal(z[i], 0);
    memset(z, 0xab, 300);
    z = pat_xrealloc(z, 4000);
    for (int i = 0; i < 300; i++)
        assert_int_equal(z[i], 0xab);
    free(z);

    /* pat_grow: 8 to start, doubling, never shrinking, contents kept */
    uint32_t *arr = NULL, cap = 0;
    pat_grow((void **)&arr, &cap, 1, sizeof(*arr));
    assert_int_equal(cap, 8);
    for (uint32_t i = 0; i < 8; i++)
        arr[i] = i * 7;
    pat_grow((void **)&arr, &cap, 9, sizeof(*arr));
    assert_int_equal(cap, 16);
    pat_grow((void **)&arr, &cap, 100, sizeof(*arr));
    assert_int_equal(cap, 128);
    pat_grow((void **)&arr, &cap, 3, sizeof(*arr));
    assert_int_equal(cap, 128);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(arr[i], i * 7);
    free(arr);
}

static int check_positive(int v)
{
    int r = 0;
    PAT_CHECK("test_base", v > 0, "value %d is not positive", v);
out:
    return r;
}

static void test_macros_and_clock(void **state)
{
    int five[5];
    assert_int_equal(PAT_ARRAY_SIZE(five), 5);
    assert_int_equal(PAT_MIN(3, -2), -2);
    assert_int_equal(PAT_MAX(3, -2), 3);
    assert_int_equal(PAT_DIV_UP(0, 16), 0);
    assert_int_equal(PAT_DIV_UP(1, 16), 1);
    assert_int_equal(PAT_DIV_UP(16, 16), 1);
    assert_int_equal(PAT_DIV_UP(17, 16), 2);
    assert_int_equal(check_positive(1), 0);
    assert_int_equal(check_positive(-1), -EUCLEAN);

    uint64_t t0 = pat_now_ns();
    struct timespec ms2 = {0, 2000000};
    nanosleep(&ms2, NULL);
    uint64_t t1 = pat_now_ns();
    assert_true(t1 >= t0 + 2000000ull);
    assert_true(t1 - t0 < 5000000000ull); /* nanoseconds, not something coarser or finer */
}

/* pat_spin_while_eq: a word another thread changes ends the spin, a word nobody changes lets
 * it run out at its deadline, a word that already differs returns at once */
static _Atomic uint32_t spin_word;

static void *spin_bump(void *arg)
{
    (void)arg;
    struct timespec ms2 = {0, 2000000};
    nanosleep(&ms2, NULL);
    atomic_fetch_add(&spin_word, 1);
    return NULL;
}

static void test_spin_while_eq(void **state)
{
    atomic_store(&spin_word, 7);
    uint64_t t0 = pat_now_ns();
    assert_int_equal(pat_spin_while_eq(&spin_word, 7, t0 + 1000000ull), 0);
    uint64_t t1 = pat_now_ns();
    assert_true(t1 >= t0 + 1000000ull);
    assert_int_equal(atomic_load(&spin_word), 7);

    assert_int_equal(pat_spin_while_eq(&spin_word, 6, t1 + 5000000000ull), 1);
    assert_true(pat_now_ns() - t1 < 1000000000ull);

    pthread_t th;
    t0 = pat_now_ns(); /* before the thread: its bump comes 2 ms after this at the earliest */
    assert_int_equal(pthread_create(&th, NULL, spin_bump, NULL), 0);
    assert_int_equal(pat_spin_while_eq(&spin_word, 7, t0 + 5000000000ull), 1);
    t1 = pat_now_ns();
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(atomic_load(&spin_word), 8);
    assert_true(t1 - t0 >= 2000000ull); /* it waited for the bump, not for nothing */
    assert_true(t1 - t0 < 4000000000ull);
}

/* ---------------------------------------------------------------- pat_fp8 */

/* A format as the reference sees it: what a code means, by the OCP formula, in double. */
typedef struct fp8_ref {
    int mbits, bias, ieee; /* ieee: e5m2's infinities and NaNs; else e4m3's one NaN */
    float (*dec)(uint8_t);
    uint8_t (*enc)(float);
} fp8_ref_t;

static const fp8_ref_t fp8_e4m3 = {3, 7, 0, pat_e4m3_to_f32, pat_f32_to_e4m3};
static const fp8_ref_t fp8_e5m2 = {2, 15, 1, pat_e5m2_to_f32, pat_f32_to_e5m2};

/* the value of code c (sign clear): NAN for a NaN code, INFINITY for e5m2's infinity */
static double fp8_value(const fp8_ref_t *f, uint32_t c)
{
    const uint32_t e = c >> f->mbits, m = c & ((1u << f->mbits) - 1u);
    const uint32_t emax = (1u << (7 - f->mbits)) - 1u;
    if (f->ieee ? e == emax : c == 0x7fu)
        return f->ieee && m == 0 ? INFINITY : NAN;
    if (e == 0)
        return ldexp((double)m, 1 - f->bias - f->mbits);
    return ldexp(1.0 + (double)m / (double)(1u << f->mbits), (int)e - f->bias);
}

/* the nearest finite code to |x| (ties to the even code, beyond the largest: the largest),
 * with x's sign, by search over every code */
static uint8_t fp8_nearest(const fp8_ref_t *f, float x)
{
    const double a = fabs((double)x);
    uint32_t best = 0;
    double best_d = INFINITY;
    for (uint32_t c = 0; c < 0x80u; c++) {
        const double v = fp8_value(f, c);
        if (!isfinite(v))
            continue;
        const double d = fabs(a - v);
        if (d < best_d || (d == best_d && !(c & 1u))) {
            best = c;
            best_d = d;
        }
    }
    return (uint8_t)((signbit(x) ? 0x80u : 0) | best);
}

static void fp8_check_format(const fp8_ref_t *f)
{
    /* every code decodes to its formula's value, and every finite one encodes back to itself */
    double max = 0;
    for (uint32_t c = 0; c < 0x100u; c++) {
        const double v = fp8_value(f, c & 0x7fu);
        const float got = f->dec((uint8_t)c);
        if (isnan(v)) {
            assert_true(isnan(got));
            assert_int_equal(f->enc(got) & 0x7fu, 0x7fu); /* NaN stays NaN */
            continue;
        }
        const double want = (c & 0x80u) ? -v : v;
        assert_true((double)got == want);
        assert_int_equal(!!signbit(got), !!(c & 0x80u));
        if (isfinite(v)) {
            assert_int_equal(f->enc(got), c);
            if (v > max)
                max = v;
        }
    }
    /* the midpoint of every two neighbouring codes, a quarter past it and a quarter before it,
     * both signs: nearest (ties to even) as the search finds it */
    for (uint32_t c = 0; c + 1 < 0x80u; c++) {
        const double lo = fp8_value(f, c), hi = fp8_value(f, c + 1);
        if (!isfinite(lo) || !isfinite(hi))
            continue;
        const double pts[3] = {(lo + hi) / 2, lo + (hi - lo) / 4, hi - (hi - lo) / 4};
        for (int i = 0; i < 3; i++)
            for (int sg = 0; sg < 2; sg++) {
                const float x = (float)(sg ? -pts[i] : pts[i]);
                assert_true((double)fabsf(x) == pts[i]); /* exact in fp32 */
                assert_int_equal(f->enc(x), fp8_nearest(f, x));
            }
    }
    /* random values over every binade the format reaches and past it: 2^-30 .. 2^20 */
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200000; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const float x =
            (float)ldexp(1.0 + (double)(r >> 11) / 9007199254740992.0, (int)(r % 51) - 30) *
            ((r >> 10) & 1u ? -1.f : 1.f);
        assert_int_equal(f->enc(x), fp8_nearest(f, x));
    }
    /* saturation: past the largest finite, infinities too, become it */
    const uint8_t top = fp8_nearest(f, (float)max);
    assert_int_equal(f->enc((float)(max * 1.5)), top);
    assert_int_equal(f->enc(INFINITY), top);
    assert_int_equal(f->enc(-INFINITY), top | 0x80u);
    assert_int_equal(f->enc(FLT_MAX), top);
}

static void test_fp8_conversions(void **state)
{
    (void)state;
    fp8_check_format(&fp8_e4m3);
    fp8_check_format(&fp8_e5m2);
    /* the formats' landmarks */
    assert_int_equal(pat_f32_to_e4m3(1.0f), 0x38);
    assert_int_equal(pat_f32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(pat_f32_to_e4m3(464.0f), 0x7e);   /* would round to 480, which e4m3 lacks */
    assert_int_equal(pat_f32_to_e4m3(0x1p-9f), 0x01);  /* the smallest subnormal */
    assert_int_equal(pat_f32_to_e4m3(0x1p-10f), 0x00); /* a tie between 0 and it: even */
    assert_int_equal(pat_f32_to_e4m3(-0x1p-12f), 0x80);
    assert_true(pat_e4m3_to_f32(0x7e) == 448.0f);
    assert_int_equal(pat_f32_to_e5m2(1.0f), 0x3c);
    assert_int_equal(pat_f32_to_e5m2(57344.0f), 0x7b);
    assert_int_equal(pat_f32_to_e5m2(0x1p-16f), 0x01);
    assert_true(isinf(pat_e5m2_to_f32(0x7c)) && pat_e5m2_to_f32(0xfc) < 0);
    assert_true(isnan(pat_e5m2_to_f32(0x7d)) && isnan(pat_e4m3_to_f32(0xff)));
    assert_int_equal(pat_f32_to_e5m2(NAN), 0x7f);
}

/* ---------------------------------------------------------------- pat_map */

static void test_map_basics(void **state)
{
    pat_map_t m;
    pat_map_init(&m, 0);
    assert_int_equal(m.mask + 1, 16); /* the smallest table */
    pat_map_done(&m);
    pat_map_init(&m, 1000);
    assert_int_equal(m.mask + 1, 2048); /* a power of two >= 2 x the bound */
    assert_int_equal(m.count, 0);
    assert_int_equal(pat_map_get(&m, 42), PAT_MAP_NONE);
    pat_map_put(&m, 42, 7);
    pat_map_put(&m, 0, 8); /* key 0 is an ordinary key */
    assert_int_equal(m.count, 2);
    assert_int_equal(pat_map_get(&m, 42), 7);
    assert_int_equal(pat_map_get(&m, 0), 8);
    pat_map_put(&m, 42, 9); /* overwrite: no new entry */
    assert_int_equal(m.count, 2);
    assert_int_equal(pat_map_get(&m, 42), 9);
    pat_map_del(&m, 42);
    assert_int_equal(m.count, 1);
    assert_int_equal(pat_map_get(&m, 42), PAT_MAP_NONE);
    pat_map_clear(&m);
    assert_int_equal(m.count, 0);
    assert_int_equal(pat_map_get(&m, 0), PAT_MAP_NONE);
    pat_map_done(&m);
    assert_null(m.key);
}

/* Keys that all start probing at `home` in a table of mask+1 slots. */
static uint32_t keys_at(uint32_t home, uint32_t mask, uint64_t *out, uint32_t n)
{
    uint32_t got = 0;
    for (uint64_t k = 1; got < n; k++)
        if (pat_map__home(k, mask) == home)
            out[got++] = k;
    return got;
}

static void test_map_collisions_wrap(void **state)
{
    pat_map_t m;
    pat_map_init(&m, 8); /* 16 slots */
    const uint32_t mask = m.mask;
    /* five keys homed at the last slot fill it and wrap to slots 0..3; two homed at slot 1 sit
     * after them; deleting from the head of the run must shift the wrapped ones back */
    uint64_t last[5], one[2];
    keys_at(mask, mask, last, 5);
    keys_at(1, mask, one, 2);
    for (uint32_t i = 0; i < 5; i++)
        pat_map_put(&m, last[i], 100 + i);
    for (uint32_t i = 0; i < 2; i++)
        pat_map_put(&m, one[i], 200 + i);
    assert_int_equal(m.count, 7);
    pat_map_del(&m, last[0]);
    pat_map_del(&m, last[2]);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(pat_map_get(&m, last[i]), i == 0 || i == 2 ? PAT_MAP_NONE : 100 + i);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(pat_map_get(&m, one[i]), 200 + i);
    /* no tombstones: the run is now contiguous from the last slot, 5 entries long */
    uint32_t run = 0;
    for (uint32_t i = mask;; i = (i + 1) & mask, run++)
        if (m.key[i] == PAT_MAP_EMPTY)
            break;
    assert_int_equal(run, 5);
    /* a key homed at slot 0 that sits in slot 0, behind a hole at the last slot, must stay */
    pat_map_clear(&m);
    uint64_t zero[1];
    keys_at(0, mask, zero, 1);
    pat_map_put(&m, last[0], 1);
    pat_map_put(&m, zero[0], 2);
    pat_map_del(&m, last[0]);
    assert_int_equal(pat_map_get(&m, zero[0]), 2);
    assert_int_equal(m.key[0], zero[0]);
    pat_map_done(&m);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_map_random_churn(void **state)
{
    enum { MAX = 14, UNIVERSE = 64, OPS = 200000 };
    pat_map_t m;
    pat_map_init(&m, MAX);  /* 32 slots, at most 14 keys: long runs, some across the end */
    uint32_t ref[UNIVERSE]; /* value per key index, PAT_MAP_NONE when absent */
    uint64_t key[UNIVERSE], s = 0x1234567ull;
    for (uint32_t i = 0; i < UNIVERSE; i++) {
        ref[i] = PAT_MAP_NONE;
        key[i] = rng_next(&s);
    }
    uint32_t n = 0;
    for (uint32_t op = 0; op < OPS; op++) {
        uint32_t i = (uint32_t)(rng_next(&s) % UNIVERSE);
        if (ref[i] != PAT_MAP_NONE && (rng_next(&s) & 1)) {
            pat_map_del(&m, key[i]);
            ref[i] = PAT_MAP_NONE;
            n--;
        } else if (ref[i] != PAT_MAP_NONE || n < MAX) {
            uint32_t v = (uint32_t)(rng_next(&s) & 0xffff);
            n += ref[i] == PAT_MAP_NONE;
            pat_map_put(&m, key[i], v);
            ref[i] = v;
        }
        assert_int_equal(m.count, n);
        if (op % 97 == 0)
            for (uint32_t j = 0; j < UNIVERSE; j++)
                assert_int_equal(pat_map_get(&m, key[j]), ref[j]);
    }
    pat_map_done(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_handler),      cmocka_unit_test(test_oom_default_aborts),
        cmocka_unit_test(test_alloc_and_grow),   cmocka_unit_test(test_macros_and_clock),
        cmocka_unit_test(test_spin_while_eq),    cmocka_unit_test(test_fp8_conversions),
        cmocka_unit_test(test_map_basics),       cmocka_unit_test(test_map_collisions_wrap),
        cmocka_unit_test(test_map_random_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
