/*
 * patd_step.h — the life of one session's step, owned by patd_step.c from STEP_BEGIN to the
 * STEP_END reply (or the reclaim that ends it).
 *
 * A session has at most one step. Its state is one enum; every change goes through one
 * transition function that checks the move against a table (patd_step_state_legal) and asserts
 * it. Who moves it:
 *
 *   IDLE ──BEGIN accepted (loop)──> QUEUED ──executor takes it (or the loop: below)──> PREPARING
 *   IDLE ──BEGIN refused, GPU session (loop)──> REFUSED ──executor takes it──> EMPTY
 *   PREPARING ──reserved and packed (cpu: executor; GPU: the lane thread, once a lane is free)──>
 *       RUNNING ──layers done/stopped──> BACK
 *   PREPARING ──did not start, GPU session (lane thread)──> EMPTY ──handshakes done──> UNSTARTED
 *   PREPARING ──did not start, cpu session (executor)──> UNSTARTED
 *
 * A GPU session's step is the executor's while it reserves and packs, then the lane thread's
 * (patd_lanes.h) until its give-back: it waits for a free lane in PREPARING (or EMPTY, refused),
 * holding no thread. A small GPU step whose sequences only grow in the forest (bounded below:
 * PATD_STEP_INLINE_*) is reserved and packed by the loop itself, which then hands it to the lane
 * thread the same way: the executor's wake-up is the largest part of a step's start.
 *   BACK, UNSTARTED ──STEP_END answered, or the session reclaimed (loop)──> IDLE
 *
 * A GPU session's client stream hands over every layer without waiting for the BEGIN answer, so
 * a GPU step that does not start still runs its n_layers handshakes without compute (EMPTY) and
 * ends with STEP_END like any other; a cpu session's unstarted step ends with its BEGIN answer.
 * The replies a step owes (its BEGIN and END requests) are data, not state: the loop answers
 * BEGIN when it first sees RUNNING/EMPTY/BACK/UNSTARTED, and END once the step is back.
 */
#ifndef PATD_STEP_H
#define PATD_STEP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc_proto.h"
#include "sched_plan.h"

typedef struct patd patd_t;
typedef struct patd_conn patd_conn_t;

/* A request whose reply may come later: from a control connection (wire: patd_wire.c answers it
 * there, once), or from the admin socket (reply_fn set: the reply goes there). */
typedef struct patd_req {
    uint64_t wire; /* the control connection that waits for the answer (patd_wire.c); 0: none
                      pending (answered, or an admin request: reply_fn) */
    ipc_hdr_t hdr;
    void (*reply_fn)(void *ud, const void *frame, size_t len);
    void *reply_ud;
} patd_req_t;

/* A GPU step of at most this many tokens, all of its sequences already in the session's forest,
 * is prepared on the loop (no executor hop) while the session's last preparation and its last one
 * that rebuilt the packs (that plan alone) each took at most PATD_STEP_INLINE_NS (the plan's cost
 * grows with the KV the sequences hold, which a client chooses), and while the loop spent less
 * than PATD_STEP_INLINE_BUDGET_NS on such steps in the current PATD_STEP_INLINE_WINDOW_NS (a fixed
 * window), over all sessions; others on an executor */
#define PATD_STEP_INLINE_TOKENS    64u
#define PATD_STEP_INLINE_NS        100000ull
#define PATD_STEP_INLINE_WINDOW_NS 1000000ull
#define PATD_STEP_INLINE_BUDGET_NS 250000ull

#define PATD_STEP_STATES(X)                                                                        \
    X(IDLE)      /* no step: the next STEP_BEGIN may start one */                                  \
    X(QUEUED)    /* accepted, waiting for an executor (or prepared by the loop); BEGIN owed */     \
    X(REFUSED)   /* GPU: BEGIN answered with an error; queued to run handshakes only */            \
    X(PREPARING) /* an executor reserves KV, updates the forest, packs; GPU: then awaits a lane */ \
    X(RUNNING)   /* reserved and packed: the layers run (cpu) or are enqueued (GPU) */             \
    X(EMPTY)     /* GPU: did not start; its layers' handshakes run without compute */              \
    X(BACK)      /* ran (all layers or some): the executor gave it back; reservations to settle */ \
    X(UNSTARTED) /* did not start (nothing reserved): the executor gave it back */

typedef enum patd_step_state {
#define PATD_STEP_ENUM(s) STEP_##s,
    PATD_STEP_STATES(PATD_STEP_ENUM)
#undef PATD_STEP_ENUM
        STEP_N_STATES
} patd_step_state_t;

typedef struct patd_step {
    uint64_t id;
    uint32_t n_seqs, n_tokens;
    uint32_t *slot;   /* [n_seqs] session sequence slot */
    uint32_t *kv;     /* [n_seqs] kv sequence id */
    uint32_t *n_new;  /* [n_seqs] */
    uint32_t *tokens; /* [n_tokens] token ids, in row order */
    uint32_t *kvslot; /* [n_tokens] pool slot (block * block_size + offset) of each new token */
    uint32_t cap_seqs, cap_tokens;
    uint32_t tick_base;
    const sched_plan_hdr_t *plan;
    _Atomic int state; /* patd_step_state_t; moved only by step_move (patd_step.c) */
    _Atomic int abort; /* loop -> executor or lane thread: stop waiting, give the step back */
    int err;           /* first error (negative errno); set before the move that reports it */
    uint32_t layers_done;
    uint32_t next_layer;    /* cpu: the layer the executor waits for or runs next */
    uint32_t wait_tick;     /* cpu: the ready value that hands next_layer over */
    uint64_t wait_since_ns; /* cpu: when the wait for next_layer began (step_timeout_ms) */
    uint64_t t_recv_ns, t_begun_ns, t_done_ns;
    uint64_t t_lane_ns; /* GPU: when it was handed to the lane thread (patd_lanes.c) */
    /* GPU: an executor took it (step_job) and the lane thread uploaded its plan (lane_begin,
     * pack_begin): with t_recv_ns, t_lane_ns and t_begun_ns the stages of
     * patd_step_stage_seconds_total */
    uint64_t t_exec_ns, t_uploaded_ns;
    char why[160]; /* GPU: why it was cut (the STEP_END error's text); "" when it was not */
    uint64_t kv_bytes, qc_bytes;
    int pack_reused;
    uint32_t pack_policy;          /* sched_policy_t + 1 of the pack this step's plan used */
    patd_req_t begin_req, end_req; /* replies owed: ctl != NULL */
    uint32_t end_flags;
} patd_step_t;

/* 1 when `from -> to` is a legal move (the table behind the diagram above), else 0. */
int patd_step_state_legal(patd_step_state_t from, patd_step_state_t to);
const char *patd_step_state_name(int state);

/* Loop thread: the session's STEP_BEGIN / STEP_END (frame and body already validated). */
void patd_step_begin(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body);
void patd_step_end(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body);
/* Loop thread: the executor posted c (its step began or came back). Answers what is owed and
 * finishes the step when it can. Returns 1 when the session is closing and its step is back
 * (the caller reaps it), else 0. */
int patd_step_complete(patd_conn_t *c);
/* Loop thread, on a session's close: asks an executor holding the step to give it back.
 * Returns 1 when the step is with an executor (the reap waits for patd_step_complete), 0 when
 * the session may be reaped now (its step, if any, is reset). */
int patd_step_cancel(patd_conn_t *c);
/* Frees the step's arrays and its owed requests (the session is being freed). */
void patd_step_done(patd_step_t *st);
/* For the GPU side of a step (patd_lanes.c), which owns it from patd_lanes_submit on: */
void patd_step_move(patd_step_t *st, patd_step_state_t to);
/* Undoes what step preparation reserved and joined (takes pool_mu). */
void patd_step_rollback(patd_conn_t *c);
/* The owner's last move (BACK from RUNNING, else UNSTARTED), posted to the loop. */
void patd_step_give_back(patd_t *d, patd_conn_t *c);
/* Counts the time from the step's STEP_BEGIN to `now`, when its first layer's work began (cpu: the
 * layer starts computing; cuda: it is enqueued on the lane). */
void patd_step_started(patd_t *d, const patd_step_t *st, uint64_t now);

/* A step in flight (any state but IDLE): the lease waits, a drain waits. */
static inline int patd_step_busy(const patd_step_t *st)
{
    return atomic_load(&st->state) != STEP_IDLE;
}

#endif
