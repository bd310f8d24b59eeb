/*
 * patd_persist.h — the KV pool and the prefix cache's index outlive the daemon (issue 37,
 * pool.persist): a restart, a crash or an upgrade adopts every block published before it.
 *
 * The pool is memory a descriptor names (kern_config_t.pool_keep: a memfd on the cpu backend),
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

#define PATD_FDNAME_POOL  "patd-pool"
#define PATD_FDNAME_INDEX "patd-index"

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
    int keep[2]; /* patd_persist_handoff: the pool's and the index's (-1: none) */
} patd_persist_t;

/* Before the backend is made (backend: its name): takes the descriptors given back, decides
 * whether this run keeps its pool, and sets kc->pool_keep / kc->pool_fd. Never fails the start:
 * a doubt starts cold (logged). */
void patd_persist_begin(patd_t *d, const char *backend, kern_config_t *kc);
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
/* An upgrade (SIGUSR2), after the drain and before the backend is freed: keeps duplicates of the
 * pool's and the index's descriptors for patd_persist_exec. */
void patd_persist_handoff(patd_t *d);
/* Execs d->exe with d->argv in this process, the kept descriptors at 3 and 4 as LISTEN_FDS (the
 * same protocol as the service manager's), the fence released by the exec. Returns only when
 * the exec failed (logged). */
void patd_persist_exec(patd_t *d);

#endif
