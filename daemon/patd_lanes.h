/*
 * patd_lanes.h — GPU steps without a thread each (cuda backend): the daemon's lanes and the one
 * thread that drives every step on them.
 *
 * A lane (kern.h) is a stream with its own plan buffers and partials. An executor prepares a GPU
 * session's step (reserve KV, update the forest, pack) and hands it here; the step then holds a
 * lane, not a thread, until its last layer ran or it was cut. The lane thread:
 *   - gives free lanes to waiting steps in arrival order and begins them (plan upload, the
 *     STEP_BEGIN answer);
 *   - enqueues each step's layers at most gpu.enqueue_depth ahead of its lane's progress, each
 *     waiting on the GPU for its client's hand-over (gpu.enqueue = ahead), or each once its
 *     hand-over shows in host memory (on_ready: the CPU knows, per layer, which sessions are
 *     ready, as packing several sessions' layers into one forward needs);
 *   - watches, from host memory only, every lane's progress and every step's hand-overs (its
 *     client's ready words), and gives a step back to the loop once its last layer ran;
 *   - cuts a step (releases its waits from the CPU, drains its lane, new epoch) when its client
 *     hands nothing over for limits.step_timeout_ms, when the loop asks (client died, drain),
 *     or — only while every lane is taken and other steps wait for one — when its client is the
 *     one the step waits for and has handed nothing over for limits.stall_cut_ms (a session's
 *     first step: limits.first_step_grace_ms, for its frontend's warm-up).
 * It polls at PATD_LANES_POLL_NS while a step is in flight (no CPU call can wait for a stream
 * write to host memory without a thread). When none is, it spins on a futex word for up to
 * PATD_LANES_SPIN_NS after its last move (a frontend's next step comes that soon: a wake-up from
 * sleep would cost the step's start tens of microseconds), then sleeps on it. With steps always
 * in flight (many frontends) it never spins; with one frontend it spins at most once per step.
 *
 * How many lanes (gpu.lanes = auto): as many as the device's hardware queues keep apart
 * (CUDA_DEVICE_MAX_CONNECTIONS, which patd sets to 32 where it is unset, less the backend's own
 * two streams), and no more than 1/PATD_LANES_MEM_SHARE of the GPU's memory holds
 * (kern_lane_bytes): more lanes than queues would let one lane's wait on its client hold up
 * another lane's work.
 *
 * Thread context: start/stop on the main thread; submit on an executor or the loop; kick on the
 * loop; everything else on the lane thread, which owns each lane and each step from submit to
 * its give-back (patd_step.h's states).
 */
#ifndef PATD_LANES_H
#define PATD_LANES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kern.h"
#include "sched_plan.h"

typedef struct patd patd_t;
typedef struct patd_conn patd_conn_t;

#define PATD_LANES_MAX       64u
#define PATD_LANES_AUTO_MAX  30u          /* 32 hardware queues less the backend's two streams */
#define PATD_LANES_MEM_SHARE 16u          /* auto: lanes' memory <= 1/16 of the GPU's */
#define PATD_LANES_POLL_NS   20000ull     /* the lane thread's nap while steps are in flight */
#define PATD_LANES_IDLE_NS   100000000ull /* its heartbeat period when no step is in flight */
#define PATD_LANES_SPIN_NS   1000000ull   /* it spins this long after its last move, then sleeps */

typedef enum patd_lane_phase {
    LANE_FREE,  /* no step */
    LANE_RUN,   /* its step's layers are enqueued and run */
    LANE_DRAIN, /* cut: its waits are released, the lane drains what was enqueued */
} patd_lane_phase_t;

/* What a busy lane does (cross-session packing, gpu.cross_pack): */
typedef enum patd_lane_role {
    ROLE_SOLO,   /* its step's layers run on it */
    ROLE_MEMBER, /* its step's layers run on a pack's lane; it runs the rest if the step leaves */
    ROLE_PACK, /* runs the layers of its members' steps as one forward each (no step of its own) */
} patd_lane_role_t;

typedef struct patd_lane {
    kern_lane_t *lane;
    patd_lane_phase_t phase;
    patd_lane_role_t role;
    patd_conn_t *c;     /* the step's session (phase != FREE) */
    uint64_t base;      /* kern_lane_enqueued when the step began */
    uint64_t target;    /* LANE_DRAIN: enqueued layers to drain */
    uint64_t epoch;     /* the step's handshake value */
    uint64_t seen;      /* progress last seen */
    uint64_t t_moved;   /* last hand-over, progress or start (ns) */
    uint64_t t_cut;     /* when the drain began */
    uint64_t t_client;  /* since when the lane waits for its client (waits_for_client), or 0 */
    uint32_t next;      /* next layer to enqueue */
    uint32_t handed;    /* layers whose ready word the client set */
    int begun;          /* layers compute (else handshakes only) */
    int why;            /* LANE_DRAIN: the cut's errno */
    kern_lane_t *drain; /* LANE_DRAIN: the lane whose progress must reach target (a member's:
                           its pack's) */
    /* ROLE_MEMBER: its pack's lane and its index there */
    uint32_t pack, member;
    /* ROLE_PACK: its members' lanes, and how many are still served by it */
    uint32_t n_members, live;
    uint32_t members[KERN_PACK_MAX];
    uint64_t serials[KERN_PACK_MAX]; /* their sessions (a member lane may be reused) */
} patd_lane_t;

/* The lane thread's memory of which sessions stepped lately, by uid (cross_pack's hold rule). */
#define PATD_LANES_RECENT    64u
#define PATD_LANES_RECENT_NS 1000000000ull
typedef struct patd_lanes_recent {
    uint64_t serial, t_ns;
    uint32_t uid;
} patd_lanes_recent_t;

typedef struct patd_lanes {
    patd_lane_t *lane; /* [n] */
    uint32_t n;
    int on_ready; /* gpu.enqueue = on_ready: a layer is enqueued once its hand-over is seen */
    pthread_t thread;
    int started;
    pthread_mutex_t mu; /* the waiting queue and stop */
    patd_conn_t **wait; /* steps waiting for a lane, oldest first */
    uint32_t n_wait, cap_wait;
    int stop;
    /* the lane thread's own: a pass's free lanes, the steps it takes, the aborted ones */
    uint32_t *free_idx;
    patd_conn_t **take, **gone;
    uint32_t cap_gone;
    uint8_t *mark; /* a pass's waiting steps taken into packs */
    uint32_t cap_mark;
    _Atomic uint32_t kick; /* futex word: bumped on submit, cancel and stop */
    _Atomic uint64_t beat; /* the lane thread's heartbeat (the watchdog's) */
    /* for metrics and STATUS (any thread reads) */
    _Atomic uint32_t busy, waiting, busy_max;
    _Atomic uint64_t steps, wait_ns_sum, cut_stall, cut_timeout, cut_abort, polls;
    /* cross-session packing: packs begun, the steps they held, packed layers enqueued, steps that
     * left a pack (late by more than the window), packs that fell back to steps alone */
    _Atomic uint64_t packs, pack_steps, pack_layers, pack_leaves, pack_fallbacks;
    /* the lane thread's own (cross_pack) */
    sched_t *xs;           /* the union plans' scheduler */
    uint32_t *xslots;      /* union slots */
    uint32_t *pk_lane;     /* a pass's packs: lanes ... */
    patd_conn_t **pk_conn; /* ... and members, KERN_PACK_MAX per pack */
    uint32_t *pk_n;
    patd_lanes_recent_t recent[PATD_LANES_RECENT];
} patd_lanes_t;

/* gpu.lanes = auto's count for this device and configuration (see above); never 0. */
uint32_t patd_lanes_auto(const kern_config_t *kc, uint64_t mem_total);
/* Creates n lanes (fewer, with a warning, where the device's memory runs out after the first)
 * and starts the lane thread. 0 or a negative errno (logged). */
int patd_lanes_start(patd_t *d, uint32_t n);
/* Stops the lane thread (no step may be in flight) and frees the lanes. */
void patd_lanes_stop(patd_t *d);
/* Executor: a GPU session's step, prepared (st->err set where it did not start: the step runs
 * its handshakes only), is the lane thread's from now on. */
void patd_lanes_submit(patd_t *d, patd_conn_t *c);
/* Any thread: the lane thread looks again now (a step's abort was set). */
void patd_lanes_kick(patd_t *d);

#endif
