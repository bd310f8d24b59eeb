/*
 * pat_base.h — the few helpers every module of patd shares: the host-OOM policy and a clock.
 *
 * Host bookkeeping (block tables, forest nodes, plan arenas) may abort on host out-of-memory
 * through the one wrapper below: such an allocation failing means the machine is already lost. KV
 * blocks and device memory are different: they run out as a matter of course and are reported as
 * -ENOSPC / -ENOMEM to a caller that handles it; they never come through here.
 *
 * Lives under daemon/base because the top-level layout is fixed; it knows nothing of the daemon.
 * daemon/base is a leaf (libc only): these headers and pat_base.c (the OOM handler, memfds), built
 * into libpatbase.a for the daemon's side and into libpat for the client's.
 */
#ifndef PAT_BASE_H
#define PAT_BASE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define PAT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define PAT_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define PAT_MAX(a, b)     ((a) > (b) ? (a) : (b))
#define PAT_DIV_UP(a, b)  (((a) + (b)-1) / (b))

/* Reports a failed host allocation of `bytes` bytes (SIZE_MAX: the size itself overflowed). It
 * is meant not to return: it may print, log or longjmp out; if it returns, pat_oom aborts. */
typedef void (*pat_oom_handler_t)(size_t bytes);

/* Sets the handler pat_oom() calls, for this copy of daemon/base: the daemon's, libpat's (its own,
 * hidden in libpat.so), a test's. NULL restores the default, which prints "<2>PROG: host out of
 * memory allocating N bytes" to stderr, PROG being the program's short name (patd for the
 * daemon). Returns the previous handler (never NULL). Any thread; meant for start-up. */
pat_oom_handler_t pat_set_oom_handler(pat_oom_handler_t h);

/* A host allocation of n bytes failed: calls the handler, then aborts. */
__attribute__((noreturn)) void pat_oom(size_t n);

/* Allocates or aborts; n == 0 yields a valid unique pointer. */
static inline void *pat_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        pat_oom(n);
    return p;
}

static inline void *pat_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    size_t n;
    if (!p)
        pat_oom(__builtin_mul_overflow(count, size, &n) ? SIZE_MAX : n);
    return p;
}

static inline void *pat_xrealloc(void *old, size_t n)
{
    void *p = realloc(old, n ? n : 1);
    if (!p)
        pat_oom(n);
    return p;
}

/* Grows *arr (of elements of size elt) so that it holds at least need elements; doubles. */
static inline void pat_grow(void **arr, uint32_t *cap, uint32_t need, size_t elt)
{
    if (need <= *cap)
        return;
    uint32_t c = *cap ? *cap : 8;
    while (c < need)
        c *= 2;
    *arr = pat_xrealloc(*arr, (size_t)c * elt);
    *cap = c;
}

/* For invariant checkers: on a false condition print the message, set r = -EUCLEAN and jump to
 * the checker's `out` label. */
#define PAT_CHECK(who, cond, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, who ": " __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                                   \
            r = -EUCLEAN;                                                                          \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Monotonic nanoseconds. */
static inline uint64_t pat_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Spins while *w == v and the monotonic clock is before until_ns (pat_now_ns's clock), pausing
 * the core between reads. Returns 1 when *w changed (acquire), 0 when the time ran out: for a
 * thread that expects a futex word to move within microseconds and would pay a wake-up (tens of
 * microseconds under load) if it slept on it instead. */
static inline int pat_spin_while_eq(_Atomic uint32_t *w, uint32_t v, uint64_t until_ns)
{
    for (uint32_t i = 1;; i++) {
        if (atomic_load_explicit(w, memory_order_acquire) != v)
            return 1;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
        if (i % 64 == 0 && pat_now_ns() >= until_ns)
            return 0;
    }
}

/* A memfd of `bytes` named `name`, close-on-exec, its pages allocated now (a later touch never
 * faults for want of memory: no SIGBUS) and sealed with `seals` (F_SEAL_*; sealing allowed).
 * Returns the descriptor, or a negative errno with nothing left behind. pat_base.c. */
int pat_memfd_new(const char *name, uint64_t bytes, int seals);

#endif
