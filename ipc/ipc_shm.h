/*
 * ipc_shm.h — per-connection staging buffers and the signal words of the per-layer hand-off.
 *
 * One shared buffer per session, created by the daemon at HELLO and mapped by the client:
 *
 *   [ signal page | Q rows | K rows | V rows | O rows ]     each part 4 KiB aligned
 *
 * rows are [max_batch_tokens][heads][head_dim] elements of the model dtype, in the order of the
 * step's tokens. The cpu backend reads Q/K/V and writes O in place; a GPU build exports device
 * memory with the same layout, an allocation per session passed by descriptor (ipc_proto.h,
 * IPC_BUF_CUDA).
 *
 * The hand-off of layer L of a step with tick base T:
 *   client: write Q/K/V of layer L; ready = T+L+1 (release); wake ready
 *   daemon: wait ready == T+L+1; append K/V, attend; write O; done = T+L+1 (release); wake done
 *   client: wait done == T+L+1, read O
 * Words are futexes (shared, not private): waiting costs nothing and either side can wake the
 * other. `state` carries what is not a layer: the step aborted, the session or daemon closing.
 * Waits are sliced so a waiter also notices its peer's death (pidfd) and its own cancel flag.
 *
 * GPU sessions (cuda backend, IPC_BUF_CUDA): the staging rows are device memory and the
 * hand-off runs on the two processes' CUDA streams, never through their CPUs. The session's
 * signal slice (ipc_gsig_bytes) is pinned host memory of its own (a CUDA virtual-memory
 * allocation passed by descriptor) that both processes map for their device and
 * their CPU at one address:
 *
 *   [ ipc_sig_t page | ready[n_layers] (u64) | done[n_layers] (u64) ]   each part 4 KiB aligned
 *
 * Layer L of a step, with the session's epoch E (> 0, from ipc_sig_t.epoch):
 *   client stream: (Q/K/V of L written) write ready[L] = E; wait done[L] >= E;
 *                  and after the step's last layer only: write done[L] = 0
 *   daemon stream: wait ready[L] >= E; append, attend, merge;
 *                  write done[L] = E (ordered after every write of the layer)
 *   daemon CPU, once every layer of the step has run and before STEP_END is answered:
 *                  ready[*] = 0 and done[0 .. n_layers - 2] = 0
 * Nothing else is reset on either stream, so a layer costs each stream one write and one wait.
 * The CPU resets are safe because the client's stream writes ready[L + 1] only after its wait for
 * done[L] passed (layer L + 1's Q needs layer L's O: the hand-offs of a step are stream-ordered),
 * so when the daemon's stream has passed its last wait, the client has consumed every done word
 * but the last, which it resets itself; and the client enqueues the next step's writes only after
 * STEP_END is answered. The same values serve every step: a captured CUDA graph of the client's
 * forward replays with the handshakes in it. Every STEP_BEGIN, failed or
 * not, is answered with exactly n_layers handshakes (a failed step runs them without compute), so
 * the words stay paired. Only when the daemon had to release a wait from its CPU (a client that
 * stalled past the step timeout or died) can words be left unpaired: it then bumps the epoch, and
 * old values (< E) satisfy no wait of the new epoch; a client that captured a graph re-captures.
 */
#ifndef IPC_SHM_H
#define IPC_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define IPC_SIG_MAGIC 0x53474953u /* "SIGS" */
#define IPC_ALIGN     4096u

/* Values of ipc_sig_t.state (daemon -> client). */
#define IPC_STATE_OPEN    0u
#define IPC_STATE_ABORTED 1u /* the step in flight was aborted (error in err) */
#define IPC_STATE_CLOSED  2u /* the session is gone or the daemon is shutting down */

typedef struct ipc_sig {
    uint32_t magic, version;
    uint32_t n_layers, reserved;
    _Alignas(64) _Atomic uint32_t ready;       /* client -> daemon */
    _Alignas(64) _Atomic uint32_t done;        /* daemon -> client */
    _Alignas(64) _Atomic uint32_t state;       /* daemon -> client: IPC_STATE_* */
    _Atomic int32_t err;                       /* negative errno behind ABORTED/CLOSED */
    _Alignas(64) _Atomic uint64_t client_beat; /* client's last activity, CLOCK_MONOTONIC ns */
    _Alignas(64) _Atomic uint64_t epoch;       /* GPU sessions: the handshake value (see above) */
} ipc_sig_t;
_Static_assert(sizeof(ipc_sig_t) <= IPC_ALIGN, "signal page");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "futex words are 32-bit");

typedef struct ipc_layout {
    uint64_t sig_off, q_off, k_off, v_off, o_off, bytes;
    uint64_t q_row, kv_row; /* bytes of one token's Q (or O) and of one token's K (or V) */
} ipc_layout_t;

/* The layout for a session; 0 or -E2BIG when it would not fit in 64 bits or IPC limits. */
int ipc_layout_compute(uint32_t max_tokens, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim,
                       uint32_t elt_bytes, ipc_layout_t *ret);

/* A mapped shared buffer. */
typedef struct ipc_shm {
    void *base;
    size_t bytes;
    int guard; /* its slot in the SIGBUS guard + 1, 0: not guarded */
    int fd1;   /* ipc_shm_create_memfd: its fd + 1 until ipc_shm_drop_fd, 0: none */
} ipc_shm_t;

/* The SIGBUS guard (daemon side). A client that holds its buffer's fd can ftruncate it: the
 * daemon's next access past the new end would raise SIGBUS and kill the daemon. With the guard
 * installed, every buffer ipc_shm_create_memfd makes is registered; a SIGBUS inside one replaces
 * the faulting page of the daemon's mapping with a private zero page (the access completes, on data
 * that no longer reaches the client) and marks the buffer, which ipc_shm_guard_hit then reports.
 * A SIGBUS anywhere else keeps its default action. install: once, before any buffer is made;
 * 0 or -errno. */
int ipc_shm_guard_install(void);
/* 1 once a fault inside s was absorbed (the buffer is no longer shared with its client), else 0 */
int ipc_shm_guard_hit(const ipc_shm_t *s);

/* Daemon side: maps a zeroed buffer of `bytes`, every page allocated (no SIGBUS later for want
 * of memory), and initialises the signal page. An anonymous memfd, sealed against shrinking and
 * growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): no name another process could open, and its
 * one client, which receives the fd (beside the HELLO reply), can neither truncate nor grow what
 * the daemon maps. The fd stays in s (ipc_shm_fd) until ipc_shm_drop_fd or close. Returns 0, -errno
 * (ENOMEM, ENOSPC: the pages could not all be had), nothing left behind. */
int ipc_shm_create_memfd(ipc_shm_t *s, size_t bytes, uint32_t n_layers);
int ipc_shm_fd(const ipc_shm_t *s); /* -1: none */
void ipc_shm_drop_fd(ipc_shm_t *s);
/* Client side: maps the buffer behind fd (not taken: the caller closes it), which must be
 * exactly `bytes` long, sealed against shrinking and growing, and carry the signal magic.
 * Returns 0, -errno, or -EBADMSG (size, seals or magic wrong). */
int ipc_shm_map_fd(ipc_shm_t *s, int fd, size_t bytes);
/* Unmaps; closes the fd it still holds. Accepts a zeroed struct. */
void ipc_shm_close(ipc_shm_t *s);

/* Bytes of a GPU session's signal slice for n_layers (a multiple of IPC_ALIGN), 0 if too many. */
uint64_t ipc_gsig_bytes(uint32_t n_layers);
/* Initialises a slice (zeroes, magic, version, n_layers, the first epoch). patd starts a
 * session's epochs from its serial, so values of one session mean nothing in another. */
void ipc_gsig_init(void *slice, uint32_t n_layers, uint64_t epoch);
static inline uint64_t *ipc_gsig_ready(void *slice)
{
    return (uint64_t *)((uint8_t *)slice + IPC_ALIGN);
}
static inline uint64_t *ipc_gsig_done(void *slice, uint32_t n_layers)
{
    return (uint64_t *)((uint8_t *)slice + IPC_ALIGN +
                        ((uint64_t)n_layers * 8 + IPC_ALIGN - 1) / IPC_ALIGN * IPC_ALIGN);
}

/* The daemon gives up a slice's step (aborted, or the session ended): every done word becomes
 * value, so that the client's stream passes each wait it may hold (a wait is for done >= its
 * epoch), and every ready word 0, so that no later store of an old epoch counts. */
static inline void ipc_gsig_release(void *slice, uint32_t n_layers, uint64_t value)
{
    uint64_t *ready = ipc_gsig_ready(slice), *done = ipc_gsig_done(slice, n_layers);
    for (uint32_t l = 0; l < n_layers; l++) {
        __atomic_store_n(&done[l], value, __ATOMIC_RELEASE);
        __atomic_store_n(&ready[l], 0, __ATOMIC_RELEASE);
    }
}

/* Unlinks every /dev/shm entry whose name starts with prefix (named buffers an older release
 * left; patd makes none now). Returns how many. */
int ipc_shm_sweep(const char *prefix);

static inline ipc_sig_t *ipc_shm_sig(const ipc_shm_t *s)
{
    return (ipc_sig_t *)s->base;
}

/* A pidfd watching the peer process (readable once it exits): fd, or -errno (-ESRCH: no such
 * process; -ENOSYS: the kernel has none). Both ends of a session watch each other with it. */
int ipc_pidfd_open(int pid);

/* Stores v with release order and wakes every waiter of the word. */
void ipc_sig_post(_Atomic uint32_t *word, uint32_t v);
/* Wakes every waiter without changing the word (they re-check their conditions). */
void ipc_sig_wake(_Atomic uint32_t *word);
/* Waits up to timeout_ns for *word != seen (returns at once if it already differs). Returns 0
 * on a change or a wake-up (spurious ones included: callers loop), -ETIMEDOUT otherwise. */
int ipc_sig_wait(_Atomic uint32_t *word, uint32_t seen, uint64_t timeout_ns);

#endif
