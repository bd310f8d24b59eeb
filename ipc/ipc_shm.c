/*
 * ipc_shm.c — POSIX shm staging buffers and futex signal words (ipc_shm.h).
 *
 * Futexes are used without FUTEX_PRIVATE_FLAG: the words live in a MAP_SHARED mapping that two
 * processes see at different addresses, and the kernel keys shared futexes by the page.
 */
#include "ipc_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ipc_proto.h"
#include "pat_base.h"

static uint64_t align_up(uint64_t x)
{
    return (x + IPC_ALIGN - 1) / IPC_ALIGN * IPC_ALIGN;
}

int ipc_layout_compute(uint32_t max_tokens, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim,
                       uint32_t elt_bytes, ipc_layout_t *ret)
{
    if (max_tokens == 0 || max_tokens > IPC_MAX_TOKENS || q_heads == 0 || q_heads > 4096 ||
        kv_heads == 0 || kv_heads > 4096 || head_dim == 0 || head_dim > 4096 || elt_bytes == 0 ||
        elt_bytes > 8)
        return -E2BIG;
    ipc_layout_t l;
    l.q_row = (uint64_t)q_heads * head_dim * elt_bytes;
    l.kv_row = (uint64_t)kv_heads * head_dim * elt_bytes;
    l.sig_off = 0;
    l.q_off = IPC_ALIGN;
    l.k_off = align_up(l.q_off + l.q_row * max_tokens);
    l.v_off = align_up(l.k_off + l.kv_row * max_tokens);
    l.o_off = align_up(l.v_off + l.kv_row * max_tokens);
    l.bytes = align_up(l.o_off + l.q_row * max_tokens);
    *ret = l;
    return 0;
}

/* ------------------------------------------------------------------ the SIGBUS guard */

#define GUARD_SLOTS 8192 /* > limits.max_conns (4096) + the GPU arena */

/* A slot: the range is written (len last) and cleared (len first) by the thread holding
 * guard_mu; the handler reads it lock-free. */
static struct {
    _Atomic uintptr_t base;
    _Atomic size_t len;
    _Atomic int hit;
} guard[GUARD_SLOTS];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int guard_on;
static size_t guard_page;

static void guard_sigbus(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    const uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        const size_t len = atomic_load(&guard[i].len);
        const uintptr_t b = atomic_load(&guard[i].base);
        if (len == 0 || a < b || a - b >= len)
            continue;
        void *page = (void *)(a & ~(uintptr_t)(guard_page - 1));
        /* a raw system call: the page is the daemon's alone from now on, zero-filled */
        if (mmap(page, guard_page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0) == MAP_FAILED)
            break;
        atomic_store(&guard[i].hit, 1);
        return; /* the access runs again, on the private page */
    }
    signal(sig, SIG_DFL); /* not a guarded buffer: the fault is real */
}

int ipc_shm_guard_install(void)
{
    guard_page = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = guard_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL) < 0)
        return -errno;
    atomic_store(&guard_on, 1);
    return 0;
}

static int guard_add(ipc_shm_t *s)
{
    if (!atomic_load(&guard_on))
        return 0;
    pthread_mutex_lock(&guard_mu);
    int i;
    for (i = 0; i < GUARD_SLOTS && atomic_load(&guard[i].len); i++)
        ;
    if (i < GUARD_SLOTS) {
        atomic_store(&guard[i].hit, 0);
        atomic_store(&guard[i].base, (uintptr_t)s->base);
        atomic_store(&guard[i].len, s->bytes);
        s->guard = i + 1;
    }
    pthread_mutex_unlock(&guard_mu);
    return i < GUARD_SLOTS ? 0 : -ENOSPC;
}

static void guard_remove(ipc_shm_t *s)
{
    if (!s->guard)
        return;
    pthread_mutex_lock(&guard_mu);
    atomic_store(&guard[s->guard - 1].len, 0);
    atomic_store(&guard[s->guard - 1].base, 0);
    pthread_mutex_unlock(&guard_mu);
    s->guard = 0;
}

int ipc_shm_guard_hit(const ipc_shm_t *s)
{
    return s->guard ? atomic_load(&guard[s->guard - 1].hit) : 0;
}

/* ------------------------------------------------------------------ buffers */

int ipc_shm_create_memfd(ipc_shm_t *s, size_t bytes, uint32_t n_layers)
{
    memset(s, 0, sizeof(*s));
    if (bytes < IPC_ALIGN)
        return -EINVAL;
    /* every page now: never a SIGBUS */
    int fd = pat_memfd_new("patd-staging", bytes, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    if (fd < 0)
        return fd;
    int r = 0;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        r = -errno;
        goto fail;
    }
    s->base = p;
    s->bytes = bytes;
    if ((r = guard_add(s)) < 0) { /* sealed, yet guarded: defence in depth */
        munmap(p, bytes);
        memset(s, 0, sizeof(*s));
        goto fail;
    }
    s->fd1 = fd + 1;
    ipc_sig_t *g = ipc_shm_sig(s);
    g->magic = IPC_SIG_MAGIC;
    g->version = IPC_VERSION;
    g->n_layers = n_layers;
    return 0;
fail:
    close(fd);
    return r;
}

int ipc_shm_fd(const ipc_shm_t *s)
{
    return s->fd1 - 1;
}

void ipc_shm_drop_fd(ipc_shm_t *s)
{
    if (s->fd1)
        close(s->fd1 - 1);
    s->fd1 = 0;
}

int ipc_shm_map_fd(ipc_shm_t *s, int fd, size_t bytes)
{
    memset(s, 0, sizeof(*s));
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    int seals = fcntl(fd, F_GET_SEALS);
    if ((uint64_t)st.st_size != bytes || bytes < IPC_ALIGN || seals < 0 ||
        (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return -EBADMSG;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    s->base = p;
    s->bytes = bytes;
    if (ipc_shm_sig(s)->magic != IPC_SIG_MAGIC) {
        ipc_shm_close(s);
        return -EBADMSG;
    }
    return 0;
}

uint64_t ipc_gsig_bytes(uint32_t n_layers)
{
    if (n_layers == 0 || n_layers > 65536)
        return 0;
    return IPC_ALIGN + 2 * align_up((uint64_t)n_layers * 8);
}

void ipc_gsig_init(void *slice, uint32_t n_layers, uint64_t epoch)
{
    memset(slice, 0, ipc_gsig_bytes(n_layers));
    ipc_sig_t *g = slice;
    g->magic = IPC_SIG_MAGIC;
    g->version = IPC_VERSION;
    g->n_layers = n_layers;
    atomic_store(&g->epoch, epoch);
}

void ipc_shm_close(ipc_shm_t *s)
{
    guard_remove(s);
    if (s->base)
        munmap(s->base, s->bytes);
    ipc_shm_drop_fd(s);
    memset(s, 0, sizeof(*s));
}

int ipc_shm_sweep(const char *prefix)
{
    /* shm names are "/x" <-> /dev/shm/x */
    const char *p = prefix[0] == '/' ? prefix + 1 : prefix;
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, p, strlen(p)) != 0)
            continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (shm_unlink(name) == 0)
            n++;
    }
    closedir(d);
    return n;
}

int ipc_pidfd_open(int pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    return fd < 0 ? -errno : fd;
#else
    return -ENOSYS;
#endif
}

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

void ipc_sig_post(_Atomic uint32_t *word, uint32_t v)
{
    atomic_store_explicit(word, v, memory_order_release);
    futex(word, FUTEX_WAKE, INT_MAX, NULL);
}

void ipc_sig_wake(_Atomic uint32_t *word)
{
    futex(word, FUTEX_WAKE, INT_MAX, NULL);
}

int ipc_sig_wait(_Atomic uint32_t *word, uint32_t seen, uint64_t timeout_ns)
{
    if (atomic_load_explicit(word, memory_order_acquire) != seen)
        return 0;
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    if (futex(word, FUTEX_WAIT, seen, &ts) < 0 && errno == ETIMEDOUT)
        return -ETIMEDOUT;
    return 0;
}
