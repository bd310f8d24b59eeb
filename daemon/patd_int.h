/*
 * patd_int.h — the daemon's shared state, for its own translation units only.
 *
 * Threads and what they own:
 *   loop thread   libuv: the control, event and admin sockets, every request, sessions and their
 *                 sequence tables, pidfd watches, timers, signals, sd_notify;
 *   executors     (cfg.executors) run steps: reserve KV, update the session's forest, pack (a
 *                 small GPU step: the loop itself, patd_step.c's step_gpu_inline);
 *                 a cpu step's layers then run there (wait for the client's ready word, append +
 *                 attend, post done; parked while its client is slow), a GPU step goes to
 *   lane thread   (cuda) which begins GPU steps on free lanes, enqueues their layers and watches
 *                 every lane's progress from host memory, cutting stalled steps (patd_lanes.h);
 *   metrics       one thread runs libmicrohttpd (patd_metrics.c) and renders the metrics text;
 *   reload        one short-lived thread per reload reads and checks the file (patd_reload_t).
 * Locks (never nested except pool_mu -> nothing, be_mu -> nothing):
 *   pool_mu  the kv pool and every session's blocks_held
 *   be_mu    the backend (the cpu backend runs one call at a time)
 *   the executor pool's own two (patd_exec.h)
 * A session's step is owned by the executor (or the loop, while it prepares a small GPU step) from
 * dispatch until its last move (patd_step.h); the loop only sets step.abort and wakes the ready
 * word meanwhile.
 *
 * With the cuda backend (patd_gpu.c) every session is a GPU session: its staging rows are a device
 * allocation of its own and its signal words a host allocation of its own, each exported to its
 * one client by fd; an executor (or the loop) prepares its steps and the lane thread runs them on
 * kern lanes (patd_lanes.h).
 */
#ifndef PATD_INT_H
#define PATD_INT_H

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "ipc_proto.h"
#include "ipc_shm.h"
#include "kern.h"
#include "kv_pool.h"
#include "pat_map.h"
#include "patd_config.h"
#include "patd_exec.h"
#include "patd_lanes.h"
#include "patd_log.h"
#include "patd_notify.h"
#include "patd_persist.h"
#include "patd_step.h"
#include "sched_plan.h"

/* Partial slots of one plan (the backend's workspace per lane and the scheduler's bound): two per
 * staging row; a plan that would need more falls back to splitting only its outliers. A
 * batch-invariant plan cuts every token at each chunk boundary and cannot fall back: four. */
#define PATD_MAX_PARTIALS(cfg) (((cfg)->invariant ? 4u : 2u) * (cfg)->conn_max_batch_tokens)

typedef struct patd_seq {
    uint32_t kv;        /* kv sequence id; KV_NONE when the slot is free */
    uint32_t in_step;   /* part of the step in flight */
    uint32_t forest_kv; /* kv id joined in the session's forest at this slot, KV_NONE if none */
    /* the quota's view of its block table: the entries counted in the session's blk_refs, as they
     * were when counted (patd_seq_set_blocks diffs the table against them) */
    uint32_t blocks;  /* entries counted */
    uint32_t version; /* the table's kv version when counted */
    uint32_t *counted;
    uint32_t counted_cap;
} patd_seq_t;

/* The prefix cache's scope of a user's sessions (pool.prefix_scope = uid): the chain root of
 * their blocks, and whose events a subscriber sees (patd_wire.c). 0 is the shared scope. */
#define PATD_SCOPE_UID(uid) (0x7573657200000000ull | (uint64_t)(uid))

typedef struct patd_wire patd_wire_t;
/* A process's sockets close as it exits, a moment before its pidfd says so (the kernel closes
 * files just before it reports the exit): a session whose control connection closed waits this
 * long for that word (then "client died"), else ends as let go. */
#define PATD_WIRE_LOST_MS 20u

/* admin socket: connections served at once, and from one uid (a member of the socket group who
 * holds idle connections takes no HELLO slot from another user) */
#define PATD_ADMIN_MAX_CONNS 64u
#define PATD_ADMIN_PER_UID   4u
/* Connections past those wait, accepted and unread, for a slot, in arrival order: at most
 * PATD_ADMIN_MAX_WAITING, of which PATD_ADMIN_WAIT_PER_UID of one uid (a burst of 64 frontends of
 * one user, the shipped max_conns, as a daemon restart's reconnect storm makes, waits whole; four
 * users' bursts at once do). Past those, or after PATD_ADMIN_WAIT_MS waiting, a connection gets
 * an -EBUSY error frame (libpat tries its HELLO again, backing off). */
#define PATD_ADMIN_MAX_WAITING  256u
#define PATD_ADMIN_WAIT_PER_UID 64u
#define PATD_ADMIN_WAIT_MS      10000u

/* What patd refuses at the door, each cause's log lines rate-limited apart (patd_refused):
 * id, what was refused, the limit that refused it. */
#define PATD_REFUSALS(X)                                                                           \
    X(MAX_CONNS, "a HELLO", "limits.max_conns")                                                    \
    X(PER_UID, "a HELLO", "limits.conns_per_uid")                                                  \
    X(STAGING, "a HELLO", "limits.staging_mb")                                                     \
    X(MEMORY, "a HELLO", "cgroup memory")                                                          \
    X(ADMIN_BUSY, "an admin connection", "admin socket busy")
typedef enum patd_refusal {
#define PATD_REFUSAL_ID(id, what, limit) PATD_REFUSED_##id,
    PATD_REFUSALS(PATD_REFUSAL_ID)
#undef PATD_REFUSAL_ID
        PATD_REFUSED_N
} patd_refusal_t;

struct patd_conn {
    patd_t *d;
    uint64_t session;      /* instance's top 32 bits | 32 random bits */
    uint64_t key;          /* 64 random bits: a request acts on the session only with it */
    uint64_t serial;       /* sessions opened before this one + 1 (orders GPU epochs) */
    uint32_t idx;          /* in d->conns */
    pid_t pid;             /* the kernel's word at HELLO (SO_PEERCRED), watched */
    int attached;          /* bound to its peer (always, once HELLO returns): steps allowed */
    uid_t uid;             /* the kernel's word at HELLO (limits.conns_per_uid) */
    uint64_t wire;         /* its control connection (patd_wire.c), 0 until its first request */
    uint64_t wire_lost_ns; /* when that connection closed (0: it did not); the session ends
                              PATD_WIRE_LOST_MS later (patd_conn_wire_lost) */
    int pidfd;             /* -1: lease mode, or not attached yet */
    uv_poll_t pid_poll;
    int pid_poll_on;
    uint64_t lease_ns, last_seen_ns, opened_ns;
    char label[IPC_NAME_LEN];
    uint32_t max_seqs, max_batch_tokens, max_blocks;
    patd_seq_t *seqs;
    pat_map_t seq_map; /* kv id -> slot */
    uint32_t n_open;
    /* the block quota (max_blocks) counts distinct blocks: a block the session's sequences share
     * (a prompt they all reuse, a fork's full blocks) counts once. Under pool_mu */
    uint32_t blocks_held; /* blocks with blk_refs[b] > 0 */
    uint32_t *blk_refs;   /* per pool block: entries of the session's tables naming it */
    ipc_shm_t shm;        /* cpu backend: signal page + staging rows */
    ipc_layout_t lay;
    /* GPU sessions: the signal slice and the staging allocation, each the session's own */
    int gpu;
    kern_share_t gsig_share; /* the slice: host memory the device and the CPU reach at .dev; its
                                fd until HELLO's reply */
    void *gsig;              /* = gsig_share.dev (ipc_shm.h's slice layout) */
    kern_share_t share;      /* the session's own staging allocation; its fd until HELLO's reply */
    uint8_t *dev_base;       /* = share.dev: lay offsets apply */
    sched_t *sched;
    uint32_t pack_policy; /* sched_policy_t + 1 of the last pack built (step info) */
    uint64_t prep_ns;     /* the last step's reserve and plan, wherever it ran */
    uint64_t repack_ns;   /* the plan of the last step that rebuilt the packs; the loop prepares
                             a step only while both are at most PATD_STEP_INLINE_NS (patd_step.c) */
    uint32_t next_tick;
    uint64_t next_step;
    patd_step_t step;
    int closing;              /* reclaim pending: waiting for the executor to give the step back */
    const char *close_reason; /* for the log and the event */
    patd_req_t bye_req;       /* BYE answered once reclaimed */
    uint64_t last_corr;       /* idempotent replay of the last reply (REQ resends) ... */
    uint32_t last_op;         /* ... of the same request: correlation id and opcode */
    void *last_reply;
    size_t last_reply_len;
};

/* A reload (SIGHUP, `patctl reload`), one at a time: the file is read and checked on a thread of
 * its own (patd_config_reread: the file may block, on a hung mount), applied back on the loop
 * thread (patd_config_apply) once `done` fires. patd_main.c. */
typedef struct patd_reload {
    uv_async_t done;   /* the reader is through: rc and next are written */
    int busy;          /* a reader runs; another reload is refused meanwhile */
    int rc;            /* patd_config_reread's */
    const char *who;   /* "SIGHUP" or "patctl reload", for the log */
    uint64_t start_ns; /* when it began */
    patd_req_t rq;     /* patctl's request, answered once applied; reply_fn NULL: none owed */
    patd_config_t next;
} patd_reload_t;

/* A GPU step's start in stages (patd_step_stage_seconds_total{stage=...}): STEP_BEGIN received
 * -> an executor takes it -> reserved and planned, handed to the lane thread -> the lane thread's
 * pass that begins it -> plan uploaded -> layer 0 enqueued (BEGIN's answer posted meanwhile). */
#define PATD_STAGES 5

typedef struct patd_metrics {
    _Atomic uint64_t frames[IPC_OP_MAX];
    _Atomic uint64_t errors[160]; /* by errno value */
    _Atomic uint64_t steps, steps_failed, steps_aborted, tokens;
    _Atomic uint64_t step_ns_sum, step_ns_bucket[12]; /* begin -> last layer */
    _Atomic uint64_t pack_ns_sum, packs, pack_reuses;
    _Atomic uint64_t packs_policy[5]; /* packs built, by sched_policy_t used */
    _Atomic uint64_t plan_ctas, plan_merges, plan_partials; /* summed over the plans built */
    _Atomic uint64_t layer_ns_sum, layers;                  /* append + attend per layer */
    _Atomic uint64_t start_ns_sum, starts;      /* STEP_BEGIN received -> first layer begun */
    _Atomic uint64_t stage_ns_sum[PATD_STAGES]; /* a GPU step's start, by stage (patd_metrics.c) */
    _Atomic uint64_t steps_on_loop;             /* GPU steps the loop prepared (step_gpu_inline) */
    _Atomic uint64_t kv_bytes, qc_bytes;        /* per layer, summed */
    _Atomic uint64_t conns_opened, conns_closed, reclaims_dead, reclaims_lease;
    _Atomic uint64_t reclaim_ns_max, reclaim_ns_last;
} patd_metrics_t;

struct patd {
    patd_config_t cfg;
    int argc;
    char **argv;
    uint64_t instance;
    uint64_t t_start_ns;
    uint64_t t_start_unix; /* CLOCK_REALTIME seconds at start (patd_start_time_seconds) */
    uv_loop_t loop;
    patd_wire_t *wire; /* the control and event sockets (patd_wire.c) */
    void (*wire_dispatch)(patd_t *d, const uint8_t *frame, size_t len, patd_req_t *rq);
    uv_timer_t tick; /* leases, watchdog, drain */
    uv_signal_t sig_term, sig_int, sig_hup, sig_usr2;
    /* an upgrade (SIGUSR2, patctl upgrade; patd_persist.h): 1 while the successor starts, 2 once
     * it is ready and this daemon drains to hand over, 3 once handed over (winding down) */
    int upgrade;
    uint64_t upgrade_deadline_ns; /* the successor's start must end by then */
    uint64_t upgrade_ready_ns;    /* when it said it was ready */
    int upgrade_pid;              /* ... its pid (upgrade >= 2) */
    uv_poll_t upgrade_poll;       /* on persist.successor_fd */
    char exe[512];   /* the binary as named at start (its path: an upgraded file there runs) */
    uv_async_t wake; /* executor completions */
    /* the loop's time preparing GPU steps (step_gpu_inline) in the window begun at inline_t0:
     * none starts once PATD_STEP_INLINE_BUDGET_NS were spent in it, over all sessions */
    uint64_t inline_t0, inline_ns;
    char sock_path[400], ev_path[400], admin_path[400];
    /* the admin socket (patd_admin.c) */
    uv_pipe_t admin;
    int admin_on;
    uint32_t n_admin; /* its connections now, served and waiting */
    /* the uid of each served admin connection's peer, by slot (admin_used); patd_admin.c */
    uid_t admin_uid[PATD_ADMIN_MAX_CONNS];
    uint8_t admin_used[PATD_ADMIN_MAX_CONNS];
    /* connections waiting for a slot, oldest first (patd_admin.c) */
    struct patd_admin_conn *admin_wait, *admin_wait_tail;
    uint32_t n_admin_wait;
    gid_t admin_gid;                              /* daemon.admin_group; (gid_t)-1 when none */
    patd_log_limit_t refused_log[PATD_REFUSED_N]; /* patd_refused's lines, by cause */
    void (*admin_dispatch)(patd_t *d, patd_req_t *rq, const ipc_hdr_t *h);
    gid_t gid;

    kv_pool_t *pool;
    kern_backend_t *be;
    char device[96]; /* what serves, for people (kern_probe_t.device): STATUS's device line */
    kern_model_t model;
    sched_tiles_t tiles; /* the backend's tile shapes, for every session's scheduler */
    pthread_mutex_t pool_mu, be_mu;

    patd_conn_t **conns;
    uint32_t n_conns, cap_conns;
    uint64_t next_session;

    patd_exec_t exec; /* executors: a session's step is their job, posted back when done */

    int draining;
    uint64_t drain_deadline_ns;
    uint64_t drain_start_ns;
    int exit_code;
    patd_notify_t notify; /* the service manager (sd_notify's protocol, never blocking) */
    int watchdog, watchdog_warned;
    uint64_t watchdog_usec;
    patd_watchdog_t wd; /* the executors' heartbeats as the watchdog last saw them */
    uint64_t last_ping_ns, last_status_ns;
    patd_reload_t reload;
    struct patd_http *http; /* the metrics endpoint (patd_metrics.c); NULL when off */
    patd_metrics_t m;

    /* cuda backend (patd_gpu.c); gpu == 0 with the cpu backend */
    int gpu;
    int mps; /* the device's contexts are MPS clients */
    uint8_t dev_uuid[16];
    uint64_t staging_used;  /* what the open sessions' staging holds against limits.staging_mb
                               (bytes: a cpu session's memfd, a GPU session's map_bytes) */
    uint32_t lanes_want;    /* gpu.lanes, or what auto chose at start (patd_lanes_auto) */
    patd_lanes_t lanes;     /* the lanes and the thread that drives GPU steps (patd_lanes.c) */
    patd_persist_t persist; /* the pool and its index kept across restarts (patd_persist.c) */
};

/* The softmax scale applied now: model.scale, or 1/sqrt(head_dim) where it is 0 */
/* The scheduler's config for steps of this daemon's model: up to max_queries sequences and
 * max_tokens rows, with the backend's tiles and partials (a session's, patd_conn.c; a
 * cross-session pack's union, patd_lanes.c). */
sched_config_t patd_sched_config(const patd_t *d, uint32_t max_queries, uint32_t max_tokens,
                                 sched_policy_t policy);

static inline float patd_softmax_scale(const patd_t *d)
{
    return d->cfg.scale > 0 ? d->cfg.scale : 1.0f / sqrtf((float)d->model.head_dim);
}

/* The session's signal page (the shm's first page, or the GPU signal slice's). */
static inline ipc_sig_t *patd_conn_sig(patd_conn_t *c)
{
    return c->gpu ? (ipc_sig_t *)c->gsig : ipc_shm_sig(&c->shm);
}

/* patd_conn.c: sessions (loop thread) */
struct ucred;
/* HELLO from the peer the kernel names on the admin socket (cr): the session opened, bound to
 * that process (its pid watched, its uid counted against limits.conns_per_uid), and rep filled;
 * or a negative errno with why, nothing left behind, and the refusals of a limit (max_conns,
 * conns_per_uid, the staging budget, the cgroup's memory) logged through patd_refused. */
int patd_conn_hello(patd_t *d, const ipc_hello_req_t *r, const struct ucred *cr,
                    ipc_hello_rep_t *rep, char *why, size_t why_len);
patd_conn_t *patd_conn_find(patd_t *d, uint64_t session);
void patd_conn_close(patd_conn_t *c, const char *reason); /* reclaim now or once the step ends */
void patd_conn_reap(patd_conn_t *c);                      /* after the step came back */
/* Its control connection closed PATD_WIRE_LOST_MS ago: "client died" if its pid has exited
 * (counted so), else "its control connection closed". */
void patd_conn_wire_lost(patd_conn_t *c);
void patd_conns_tick(patd_t *d, uint64_t now); /* lease expiries */
/* Logs "refused <what> (<limit>): <detail>", at most one line a second per cause, with a count
 * of the ones held back. */
void patd_refused(patd_t *d, patd_refusal_t cause, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* patd_memcg.c: what the memory cgroup patd runs in lets it take */
typedef struct patd_memcg {
    uint64_t limit; /* bytes: the tightest limit of patd's cgroup and its ancestors */
    uint64_t used;  /* bytes charged there, less the inactive file cache reclaimed first */
    uint64_t room;  /* limit - used (0 when over) */
    char path[160]; /* the limit's file, for people */
} patd_memcg_t;
/* 0 and the tightest level's figures, or -ENOENT where no level has a memory limit (no memory
 * controller, or none set). Reads /proc/self/cgroup and the hierarchy's files each call (patd
 * may be moved); cgroup v2, or v1's memory hierarchy where v2 has no memory controller. */
int patd_memcg_room(patd_memcg_t *ret);

/* patd_seq.c: a session's sequence table */
int patd_seq_slot(patd_conn_t *c, uint32_t kv);          /* slot or -ENOENT */
void patd_seq_set_blocks(patd_conn_t *c, uint32_t slot); /* under pool_mu */
void patd_seq_free_all(patd_conn_t *c); /* the sequence table's memory (after close_all) */
/* Recounts the session's block quota from its sequences' tables: 0, or -EUCLEAN after logging
 * the first difference. Under pool_mu; O(pool blocks + table entries). */
int patd_seq_check(patd_conn_t *c);
void patd_seq_request(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body);
void patd_seq_close_all(patd_t *d, patd_conn_t *c, uint32_t *ret_closed);

/* patd_gpu.c (cuda backend) */
/* After the backend is up: MPS check and warning, probes of the per-session allocations, the
 * lanes and their thread (d->lanes_want). 0 or a negative errno (logged). A cpu backend: 0,
 * nothing done. */
int patd_gpu_start(patd_t *d);
void patd_gpu_stop(patd_t *d);
/* A session's signal slice and staging allocation: 0, -ENOSPC (its allocation, rounded up to the
 * driver's granularity, past limits.staging_mb), -ENOMEM (no memory left on the GPU or the host),
 * -EIO. */
int patd_gpu_conn_open(patd_t *d, patd_conn_t *c, uint64_t bytes);
void patd_gpu_conn_close(patd_t *d, patd_conn_t *c);
/* Ends the process when the backend reports a sticky CUDA error (after rc == -EIO). */
void patd_gpu_check_fatal(patd_t *d, int rc);

/* patd_admin.c: the admin socket (credentials from the kernel) */
int patd_admin_start(patd_t *d); /* after the control socket; 0 or a negative errno (logged) */
void patd_admin_stop(patd_t *d);
/* An admin request its handler answers later (RELOAD, read off the loop): moves *rq into *slot,
 * which stays the connection's reply. Answered through patd_reply_* on *slot while the connection
 * lasts; if it ends first (its idle timer answers -ETIMEDOUT, or the peer went away),
 * slot->reply_fn is set NULL and a later answer goes nowhere. The slot must outlive the
 * connection or be answered first. Loop thread. */
void patd_admin_defer(patd_req_t *rq, patd_req_t *slot);

/* patd_metrics.c */
/* HTTP connections the metrics endpoint holds at once, each one descriptor */
#define PATD_METRICS_MAX_CONNS 256u
int patd_metrics_start(patd_t *d);
void patd_metrics_stop(patd_t *d);
char *patd_metrics_text(patd_t *d, size_t *ret_len); /* malloc'd */
void patd_metrics_error(patd_t *d, int code);

/* patd_io.c: replies and events (loop thread) */
void patd_send(patd_t *d, patd_req_t *to, const void *frame, size_t len);

/* patd_wire.c: the control socket and the event socket (loop thread; events from any thread) */
int patd_wire_start(patd_t *d);
/* Stops listening: the control and event sockets closed and their paths removed (an upgrade's
 * successor binds them next); connections made stay. */
void patd_wire_unlisten(patd_t *d);
void patd_wire_stop(patd_t *d);
/* Writes a reply frame to control connection id, if it still waits for that very reply. */
void patd_wire_send(patd_t *d, uint64_t id, const void *frame, size_t len);
/* The session is reaped: a request of it still owed a reply gets -ENOTCONN (reason named). */
void patd_wire_session_gone(patd_t *d, patd_conn_t *c, const char *reason);
/* An event line (printf) for the subscribers that may see scope (0: every subscriber). */
void patd_wire_event(patd_t *d, uint64_t scope, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
uint32_t patd_wire_unbound(const patd_t *d);
uint32_t patd_wire_subscribers(const patd_t *d);
/* patd_admin.c: whether the peer may change the daemon: its user, root, daemon.admin_group */
int patd_may_administer(const patd_t *d, const struct ucred *cr);
/* Answers with a body and keeps the frame as c's last reply (c may be NULL: admin). */
void patd_reply_ok(patd_t *d, patd_conn_t *c, patd_req_t *to, const void *body, size_t len);
void patd_reply_error(patd_t *d, patd_req_t *to, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The group a config option (`key`) names: (gid_t)-1 for "", -EINVAL (logged) if none such. */
int patd_group(const char *name, const char *key, gid_t *ret_gid);
/* A socket file just bound: daemon.socket_mode and the socket group (d->gid). 0 or -errno. */
int patd_socket_own(const patd_t *d, const char *path);

#endif
