/*
 * patd_persist.h — the KV pool and the prefix cache's index outlive the daemon (pool.persist): a
 * restart, a crash or an upgrade adopts every block published before it.
 *
 * The pool is memory a descriptor names (kern_config_t.pool_keep: a memfd on the cpu backend, an
 * allocation of the driver's virtual memory management on the cuda backend),
 * and so is the index (kvcache/kv_index.h: one checked entry per block, written as blocks are
 * published and evicted, crash-consistent). At start patd hands both to the service manager's
 * descriptor store (FDSTORE=1, FDNAME=patd-pool / patd-index; systemd keeps them while the unit
 * lives, FileDescriptorStoreMax=), which passes them back at the next start (LISTEN_FDS). A start
 * that gets them back:
 *   - fences first: it takes <runtime_dir>/<name>.lock (flock), which the previous daemon held
 *     until it died; while another holds it, this start keeps nothing and adopts nothing;
 *   - checks the index against this run's identity (model shape, dtype and id, block size, pool
 *     geometry, device, layout version; kv_index_check), maps the pool's memory as it is, and
 *     adopts every valid entry (kv_pool_adopt: chains only as prefixes);
 *   - starts cold on any doubt (another identity, a torn header, a size that does not match, a
 *     descriptor missing), with one log line saying why, and replaces the stored descriptors.
 * Sessions never survive (clients reconnect and learn of the restart by ESTALE); their committed
 * blocks do, so a reconnecting frontend's open of the same prompt is served from the cache.
 *
 * Thread context: begin and adopt on the main thread at start; event under pool_mu (the pool's
 * event hook); end at exit.
 */
#ifndef PATD_PERSIST_H
#define PATD_PERSIST_H

#include <stdint.h>

#include "kern.h"
#include "kv_index.h"
#include "kv_pool.h"

typedef struct patd patd_t;

#define PATD_FDNAME_POOL    "patd-pool"
#define PATD_FDNAME_INDEX   "patd-index"
#define PATD_FDNAME_UPGRADE "patd-upgrade"

typedef struct patd_persist {
    int on;         /* this run's pool and index are kept (handed to the manager) */
    int adopt;      /* the index given back checked against this run: its blocks are adopted */
    int given;      /* descriptors were given back at start */
    int given_pool; /* the pool's descriptor given back (-1: none); the backend dups it */
    int index_fd;   /* the index's memfd, given back or new (-1: none) */
    void *index;    /* mapped, index_bytes long */
    uint64_t index_bytes;
    int lock_fd; /* the fence */
    kv_index_id_t id;
    uint32_t adopted, rejected, torn;
    uint64_t adopt_ns;
    int upgrade_fd;   /* a successor: its socket to the daemon it takes over from (-1: none) */
    int successor;    /* an upgrading daemon: the successor's pid (0: none) */
    int successor_fd; /* ... and the socket to it (-1: none) */
} patd_persist_t;

/* Before the backend is made (pr: its probe, whose device and driver are a part of the identity):
 * takes the descriptors given back, decides whether this run keeps its pool, and sets
 * kc->pool_keep / kc->pool_fd. Never fails the start: a doubt starts cold (logged). */
void patd_persist_begin(patd_t *d, const kern_probe_t *pr, kern_config_t *kc);
/* The backend refused kc as patd_persist_begin set it: 1 when kc was changed to try again (an
 * empty pool that is kept; then one that is not), 0 when there is nothing left to change. */
int patd_persist_fallback(patd_t *d, kern_config_t *kc);
/* After the backend and the pool exist: adopts the index's blocks, hands the pool's and the
 * index's descriptors to the manager. */
void patd_persist_adopt(patd_t *d);
/* The pool's events (pool_mu held): the index follows the prefix cache. */
void patd_persist_event(patd_t *d, kv_event_type_t type, uint32_t block, uint64_t hash,
                        uint64_t scope, uint32_t parent);
void patd_persist_end(patd_t *d);
/* An upgrade (SIGUSR2, patctl upgrade) starts the binary at d->exe with d->argv as a successor
 * while this daemon serves on: fork and exec, the pool's and the index's descriptors (this run
 * keeps them) and one end of a socket pair from descriptor 3 on, named by LISTEN_FDS and
 * LISTEN_FDNAMES (patd-pool, patd-index, patd-upgrade: the service manager's protocol), and
 * $NOTIFY_SOCKET as patd was given it. The successor creates its backend (CUDA's context, the
 * pool imported and mapped, the kernels loaded) and sends 'R' when ready; this daemon then
 * drains, closes its sockets, waits for its GPU work, and calls patd_persist_release, which
 * unmaps the index, releases the fence and sends 'G'; the successor takes the fence, adopts the
 * index, opens the sockets and serves. Its end of file before 'R' is a failed upgrade (this one
 * serves on). Returns the successor's pid, -EALREADY (one is under way), or -errno. */
int patd_persist_spawn(patd_t *d);
/* The successor is gone or abandoned: its socket closed, none under way. */
void patd_persist_spawn_end(patd_t *d);
/* A successor, once its backend exists (no-op unless started by an upgrade): 'R', then waits
 * for 'G' (or the predecessor's end) at most drain_timeout_ms + 30 s, then takes the fence.
 * 0, or -errno (logged: the start fails). */
int patd_persist_takeover(patd_t *d);
/* The predecessor, drained, its sockets closed and its GPU work done: lets the successor in. */
void patd_persist_release(patd_t *d);

#endif
