/*
 * test_many.c — many frontends on one patd with two executors (issue 36, "Many frontends, one
 * GPU"), on the cpu backend: each frontend is a session of its own connection stepping in its own
 * thread (libpat connections are independent; each is used by one thread, as test_multi does).
 *   - test_sixteen: 16 sessions step at once for about 5 s, three sequences each (a system
 *     prompt shared by all, then a question of their own; started over every 48 tokens), every
 *     output row of every layer checked against float64. Session 0's first step is slow, as a
 *     real frontend's first step is (allocator and cuBLAS warm-up): it waits 1 s before handing
 *     layer 0 over and 1 s before layer 2. Required: no step of any session is cut or fails (no
 *     -ETIMEDOUT, -ECANCELED or row off float64 by 1e-2; patd_steps_failed_total stays 0), and
 *     all 16 are mid-step at once: once the slow step is over, every session stops before
 *     handing over layer 1 of its next step (layer 0's O back, so the daemon has begun it) until
 *     all 16 got there; the daemon must then count 16 steps in flight, and every one of them
 *     must finish checked. A daemon that kept a step on an executor for its whole life would
 *     begin only 2 of them, the others would never get layer 0 back (or the held ones would be
 *     cut by limits.stall_cut_ms): the test says how many arrived within 20 s. The cpu backend
 *     parks a step whose client is slow (patd_step.c), the cuda backend's lanes hold it without
 *     a thread (patd_lanes.c: tests/gpu/test_frontend.py's `many` is this on a GPU, with
 *     frontend processes). Printed beside it: the most steps in flight seen by polling STATUS
 *     every 20 ms before the hold, and the most sessions mid-step at once by the clients' own
 *     clocks outside the hold (both depend on the machine: a client is mid-step while it checks
 *     a layer, so most of the time).
 *   - test_stalled_costs_little: three bystander sessions (tl_bystander_t, every row checked)
 *     step as fast as they can; their summed step rate is measured in 0.5 s windows, alone and
 *     while one other session is stalled mid-step: it hands layer 0 over, then holds layer 1
 *     until the window ends (0.5 s and more: 5x limits.stall_cut_ms, an eighth of
 *     limits.step_timeout_ms), finishes the step and stalls the next one in the next such
 *     window. Windows alternate, alone / stalled / alone ... (16 stalled), each stalled one
 *     compared with the mean of the two alone around it: a load that drifts over seconds (CI's
 *     two cores, other jobs) moves both sides of a ratio alike, and the median of the 16 ratios
 *     leaves out windows a burst of other work hit. Required: that median >= 0.75 (the issue's
 *     "a stalled session still costs the others <= 25 % of their rate"), every bystander step
 *     checked, and the staller's own slow steps not cut (it stalls below the step timeout, and
 *     one stalled step is not "every lane taken"). On the cpu backend the bystanders' rate is
 *     bound by CPU, not by executors (one executor gives them what two do), so this measures
 *     what a stalled step costs the others in CPU and in the backend: 25 % catches a stall that
 *     blocks the backend or the executors' queue, or that burns most of a core; one thread
 *     spinning through every stall costs them less than that among the test's runnable threads
 *     on two cores. That a stalled step holds no executor is test_sixteen's hold.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"

/* the daemon's default model (4 layers, 8 q heads, 2 kv heads, head_dim 64, f16) */
static const pat_model_t MODEL = {4, 8, 2, 64, PAT_F16, 16, 0};
static tl_daemon_t D;

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static pat_conn_t *session_open(const char *label, uint32_t max_batch_tokens, char *why,
                                size_t why_len, int *ret_rc)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = max_batch_tokens,
                            .max_seqs = 4,
                            .timeout_ms = 30000, /* a client never gives up before the daemon */
                            .socket = D.sock,
                            .label = label,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    *ret_rc = pat_connect(&o, &c, why, why_len);
    return c;
}

/* ------------------------------------------------------------------ sixteen at once */
#define N_SESS     16
#define N_SEQS     3
#define SYS_TOK    32   /* the system prompt every session's sequences start with: 2 blocks */
#define OWN_TOK    16   /* then a question of their own */
#define RESTART_AT 96   /* sequences start over past this many tokens: a step's cost stays flat */
#define SLOW_MS    1000 /* session 0's first step waits this long before layers 0 and 2 */
#define RUN_NS     5000000000ull  /* stepping, all told */
#define GATHER_NS  20000000000ull /* the most the hold waits for all 16 */
#define MAX_STEPS  8192           /* step times a session records */

typedef struct sess {
    uint32_t id;
    int rc;
    char err[256];
    _Atomic uint64_t steps; /* steps done, every row checked */
    uint64_t rows;
    double worst;
    int slow_now;     /* session 0's first step */
    uint64_t slow_ns; /* how long that step took */
    int held;         /* this session's step was held mid-step */
    uint32_t held_step;
    uint64_t *t0, *t1; /* each step's begin and end (client clock) */
} sess_t;

/* Where the sessions meet mid-step: each arrives from inside a step (before layer 1) and waits
 * until the test opens the gate. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int wanted; /* 1: the next session to reach layer 1 of a step stops there */
    uint32_t arrived;   /* sessions held */
    uint32_t gone;      /* sessions that ended without arriving */
    int open;
} G;
static _Atomic int stop_all;
static pthread_barrier_t ready_all;

static void sixteen_hook(void *arg, uint32_t layer)
{
    sess_t *s = arg;
    if (s->slow_now && (layer == 0 || layer == 2))
        sleep_ms(SLOW_MS);
    if (layer == 1 && !s->held && atomic_load(&G.wanted)) {
        pthread_mutex_lock(&G.mu);
        s->held = 1;
        s->held_step = (uint32_t)atomic_load(&s->steps);
        G.arrived++;
        pthread_cond_broadcast(&G.cv);
        while (!G.open)
            pthread_cond_wait(&G.cv, &G.mu);
        pthread_mutex_unlock(&G.mu);
    }
}

/* A sequence of session s: the shared system prompt, then OWN_TOK tokens of its own. */
static int sixteen_open_seq(pat_conn_t *c, const sess_t *s, tl_seq_t *q, tl_rng_t *rng)
{
    tl_seq_init(q);
    for (uint32_t t = 0; t < SYS_TOK; t++)
        tl_seq_push(q, 50000 + t);
    for (uint32_t t = 0; t < OWN_TOK; t++)
        tl_seq_push(q, 200000 + s->id * 100000 + (uint32_t)tl_rng_below(rng, 100000));
    return tl_seq_open(c, q);
}

static void *sixteen_main(void *arg)
{
    sess_t *s = arg;
    tl_rng_t rng;
    tl_rng_seed(&rng, 4242 + s->id);
    tl_seq_t q[N_SEQS], *pq[N_SEQS];
    uint32_t n = 0;
    pat_conn_t *c = session_open("many", 256, s->err, sizeof(s->err), &s->rc);
    for (; s->rc == 0 && n < N_SEQS; n++) {
        pq[n] = &q[n];
        s->rc = sixteen_open_seq(c, s, &q[n], &rng);
    }
    pthread_barrier_wait(&ready_all); /* all connected and opened: they start at once */
    for (uint32_t k = 0; s->rc == 0 && !atomic_load(&stop_all); k++) {
        if (k > 0 && q[0].n_tok >= RESTART_AT) /* start over: the system prompt is cached */
            for (uint32_t i = 0; i < N_SEQS && s->rc == 0; i++) {
                s->rc = pat_seq_close(c, q[i].seq);
                tl_seq_done(&q[i]);
                if (s->rc == 0)
                    s->rc = sixteen_open_seq(c, s, &q[i], &rng);
            }
        if (s->rc < 0)
            break;
        if (k > 0 || q[0].len > 0) /* the first step prefills the prompts */
            for (uint32_t i = 0; i < N_SEQS; i++)
                tl_seq_push(&q[i], 60000 + (uint32_t)tl_rng_below(&rng, 30000));
        s->slow_now = s->id == 0 && k == 0;
        tl_step_result_t r;
        uint64_t t0 = pat_now_ns();
        s->rc = tl_client_step_hooked(c, &MODEL, pq, N_SEQS, &rng, 1, &r, sixteen_hook, s);
        uint64_t t1 = pat_now_ns();
        if (s->slow_now)
            s->slow_ns = t1 - t0;
        s->slow_now = 0;
        s->worst = PAT_MAX(s->worst, r.worst);
        if (s->rc < 0)
            break;
        s->rows += r.rows;
        if (k < MAX_STEPS) {
            s->t0[k] = t0;
            s->t1[k] = t1;
        }
        atomic_fetch_add(&s->steps, 1);
    }
    if (s->rc < 0 && c && !s->err[0])
        snprintf(s->err, sizeof(s->err), "%s", pat_last_error(c));
    pthread_mutex_lock(&G.mu);
    if (!s->held)
        G.gone++;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
    for (uint32_t i = 0; i < n; i++)
        tl_seq_done(&q[i]);
    pat_close(c);
    return NULL;
}

typedef struct edge {
    uint64_t t;
    int d; /* +1 a step began, -1 one ended */
} edge_t;

static int edge_cmp(const void *a, const void *b)
{
    const edge_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->d - y->d; /* an end before a begin at the same instant */
}

/* The most sessions mid-step at once by the clients' clocks, leaving out the held steps. */
static uint32_t most_at_once(const sess_t *s)
{
    size_t n = 0;
    for (uint32_t i = 0; i < N_SESS; i++)
        n += 2 * PAT_MIN(atomic_load(&s[i].steps), (uint64_t)MAX_STEPS);
    edge_t *e = pat_xmalloc((n + 1) * sizeof(*e));
    n = 0;
    for (uint32_t i = 0; i < N_SESS; i++)
        for (uint64_t k = 0; k < PAT_MIN(atomic_load(&s[i].steps), (uint64_t)MAX_STEPS); k++) {
            if (s[i].held && k == s[i].held_step)
                continue;
            e[n++] = (edge_t){s[i].t0[k], +1};
            e[n++] = (edge_t){s[i].t1[k], -1};
        }
    qsort(e, n, sizeof(*e), edge_cmp);
    int cur = 0, most = 0;
    for (size_t k = 0; k < n; k++) {
        cur += e[k].d;
        most = PAT_MAX(most, cur);
    }
    free(e);
    return (uint32_t)most;
}

static void test_sixteen(void **state)
{
    static const char *const args[] = {"--executors=2", NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    memset(&G, 0, sizeof(G));
    pthread_mutex_init(&G.mu, NULL);
    pthread_cond_init(&G.cv, NULL);
    atomic_store(&stop_all, 0);
    pthread_barrier_init(&ready_all, NULL, N_SESS);
    static sess_t s[N_SESS];
    pthread_t th[N_SESS];
    for (uint32_t i = 0; i < N_SESS; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        s[i].id = i;
        s[i].t0 = pat_xmalloc(MAX_STEPS * sizeof(uint64_t));
        s[i].t1 = pat_xmalloc(MAX_STEPS * sizeof(uint64_t));
        assert_int_equal(pthread_create(&th[i], NULL, sixteen_main, &s[i]), 0);
    }
    uint64_t t_start = pat_now_ns();
    /* free stepping until session 0's slow first step is over (and one more of its steps) */
    int64_t most_polled = 0;
    uint64_t others_during_slow = 0;
    while (atomic_load(&s[0].steps) < 2 && s[0].rc == 0 && pat_now_ns() - t_start < GATHER_NS) {
        most_polled = PAT_MAX(most_polled, tl_daemon_status(&D, "steps_in_flight"));
        if (atomic_load(&s[0].steps) == 0) {
            others_during_slow = 0;
            for (uint32_t i = 1; i < N_SESS; i++)
                others_during_slow += atomic_load(&s[i].steps);
        }
        sleep_ms(20);
    }
    /* the hold: every session stops before layer 1 of its next step */
    pthread_mutex_lock(&G.mu);
    atomic_store(&G.wanted, 1);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += GATHER_NS / 1000000000ull;
    while (G.arrived + G.gone < N_SESS && pthread_cond_timedwait(&G.cv, &G.mu, &dl) == 0) {
    }
    uint32_t arrived = G.arrived;
    pthread_mutex_unlock(&G.mu);
    int64_t in_flight = tl_daemon_status(&D, "steps_in_flight");
    pthread_mutex_lock(&G.mu);
    G.open = 1;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
    uint64_t t_held = pat_now_ns();
    /* free stepping again, to RUN_NS all told (1 s at least) */
    while (pat_now_ns() - t_start < RUN_NS || pat_now_ns() - t_held < 1000000000ull)
        sleep_ms(20);
    atomic_store(&stop_all, 1);
    for (uint32_t i = 0; i < N_SESS; i++)
        pthread_join(th[i], NULL);
    double secs = (pat_now_ns() - t_start) / 1e9;

    uint64_t total = 0, rows = 0, fewest = UINT64_MAX;
    double worst = 0;
    for (uint32_t i = 0; i < N_SESS; i++) {
        total += atomic_load(&s[i].steps);
        fewest = PAT_MIN(fewest, (uint64_t)atomic_load(&s[i].steps));
        rows += s[i].rows;
        worst = PAT_MAX(worst, s[i].worst);
    }
    printf("16 sessions, 2 executors, %.1f s: %llu steps (fewest %llu, session 0 %llu), %llu rows "
           "checked, worst %.2e\n",
           secs, (unsigned long long)total, (unsigned long long)fewest,
           (unsigned long long)s[0].steps, (unsigned long long)rows, worst);
    printf("session 0's first step: %.0f ms (two %u ms waits); the other 15 did %llu steps "
           "meanwhile\n",
           s[0].slow_ns / 1e6, SLOW_MS, (unsigned long long)others_during_slow);
    printf("held mid-step: %u of 16 arrived, daemon counted %lld steps in flight; free-running: "
           "at most %lld in flight by STATUS polls (before the hold), %u mid-step at once by the "
           "clients' clocks (held steps left out)\n",
           arrived, (long long)in_flight, (long long)most_polled, most_at_once(s));
    for (uint32_t i = 0; i < N_SESS; i++) {
        if (s[i].rc < 0)
            fail_msg("session %u (step %llu): %s: %s", i,
                     (unsigned long long)atomic_load(&s[i].steps), pat_strerror(s[i].rc), s[i].err);
        assert_true(s[i].worst < 1e-2);
        assert_true(atomic_load(&s[i].steps) >= 3);
    }
    if (arrived != N_SESS)
        fail_msg("only %u of 16 sessions got layer 0 of a step back while the others held theirs "
                 "(waited %.0f s)",
                 arrived, GATHER_NS / 1e9);
    if (in_flight != N_SESS)
        fail_msg("16 sessions held mid-step, the daemon counted %lld steps in flight",
                 (long long)in_flight);
    assert_true(s[0].slow_ns >= 2ull * SLOW_MS * 1000000ull); /* the slow step was slow, and ran */
    assert_int_equal(tl_daemon_metric(&D, "patd_steps_failed_total"), 0);
    assert_int_equal(tl_daemon_metric(&D, "patd_steps_aborted_total"), 0);
    for (uint32_t i = 0; i < N_SESS; i++) {
        free(s[i].t0);
        free(s[i].t1);
    }
    pthread_barrier_destroy(&ready_all);
    assert_int_equal(tl_daemon_status(&D, "connections"), 0);
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&D, SIGTERM, 5000), 0);
    tl_daemon_stop(&D);
}

/* ------------------------------------------------------------------ a stalled session */
#define N_BY       3
#define STR_(x)    #x
#define STR(x)     STR_(x)
#define STALL_CUT  100  /* limits.stall_cut_ms */
#define STEP_LIMIT 4000 /* limits.step_timeout_ms */
/* a measurement window (100-300 bystander steps here, 10-20 under ASan), and the least a stall
 * lasts: 5x the cut, an eighth of the limit */
#define WINDOW_MS  500
#define PAIRS      16 /* windows with the staller, each between two alone */
#define BY_RESTART 32 /* bystander steps before its sequences start over (flat step cost) */

typedef struct by {
    uint32_t id;
    int rc;
    char err[256];
    _Atomic uint64_t steps;
} by_t;

enum { ST_IDLE, ST_STEPPING, ST_STALLED }; /* the staller's state */
static struct {
    _Atomic int on;    /* 1: the staller steps (and stalls); 0: it idles between steps */
    _Atomic int state; /* ST_* */
    int rc;
    char err[256];
    uint32_t steps;
    double worst;
    uint64_t shortest_stall_ns, longest_stall_ns;
} S;

static void *by_main(void *arg)
{
    by_t *b = arg;
    tl_bystander_t t;
    if ((b->rc = tl_by_open(&t, D.sock, &MODEL, 3000 + 1000 * b->id, b->err, sizeof(b->err))) == 0)
        for (uint32_t k = 1; !atomic_load(&stop_all); k++) {
            if ((b->rc = tl_by_step(&t, b->err, sizeof(b->err))) < 0)
                break;
            atomic_fetch_add(&b->steps, 1);
            if (k % BY_RESTART == 0 && (b->rc = tl_by_restart(&t, b->err, sizeof(b->err))) < 0)
                break;
        }
    tl_by_close(&t);
    return NULL;
}

static void stall_hook(void *arg, uint32_t layer)
{
    (void)arg;
    if (layer == 1) { /* layer 0 handed over and back: the step is the daemon's now */
        uint64_t t0 = pat_now_ns();
        atomic_store(&S.state, ST_STALLED);
        while (atomic_load(&S.on) && !atomic_load(&stop_all)) /* to the window's end */
            sleep_ms(1);
        uint64_t dt = pat_now_ns() - t0;
        S.shortest_stall_ns = S.shortest_stall_ns ? PAT_MIN(S.shortest_stall_ns, dt) : dt;
        S.longest_stall_ns = PAT_MAX(S.longest_stall_ns, dt);
        atomic_store(&S.state, ST_STEPPING);
    }
}

static void *staller_main(void *arg)
{
    (void)arg;
    tl_rng_t rng;
    tl_rng_seed(&rng, 777);
    pat_conn_t *c = session_open("staller", 256, S.err, sizeof(S.err), &S.rc);
    tl_seq_t q, *pq[1] = {&q};
    tl_seq_init(&q);
    for (uint32_t t = 0; t < 40; t++)
        tl_seq_push(&q, 8000 + t);
    if (S.rc == 0)
        S.rc = tl_seq_open(c, &q);
    while (S.rc == 0 && !atomic_load(&stop_all)) {
        if (!atomic_load(&S.on)) {
            atomic_store(&S.state, ST_IDLE);
            sleep_ms(5);
            continue;
        }
        atomic_store(&S.state, ST_STEPPING);
        tl_step_result_t r;
        S.rc = tl_client_step_hooked(c, &MODEL, pq, 1, &rng, 1, &r, stall_hook, NULL);
        S.worst = PAT_MAX(S.worst, r.worst);
        if (S.rc < 0)
            break;
        S.steps++;
        tl_seq_push(&q, 9000 + q.n_tok);
    }
    if (S.rc < 0 && c && !S.err[0])
        snprintf(S.err, sizeof(S.err), "%s", pat_last_error(c));
    atomic_store(&S.state, ST_IDLE);
    tl_seq_done(&q);
    pat_close(c);
    return NULL;
}

static uint64_t by_steps(by_t *b)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < N_BY; i++)
        n += atomic_load(&b[i].steps);
    return n;
}

/* The bystanders' summed steps/s over one window. */
static double by_window(by_t *b)
{
    uint64_t n0 = by_steps(b), t0 = pat_now_ns();
    sleep_ms(WINDOW_MS);
    uint64_t n1 = by_steps(b), t1 = pat_now_ns();
    return (double)(n1 - n0) / ((t1 - t0) / 1e9);
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, uint32_t n)
{
    double *c = pat_xmalloc(n * sizeof(*c));
    memcpy(c, v, n * sizeof(*c));
    qsort(c, n, sizeof(*c), dbl_cmp);
    double m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    free(c);
    return m;
}

/* Waits (up to 5 s) for the staller to reach state st. */
static void staller_wait(int st)
{
    for (uint64_t t0 = pat_now_ns(); atomic_load(&S.state) != st; sleep_ms(1))
        if (pat_now_ns() - t0 > 5000000000ull || S.rc < 0)
            fail_msg("the staller did not get to state %d: %s: %s", st, pat_strerror(S.rc), S.err);
}

static void print_rates(const char *what, const double *v, uint32_t n)
{
    printf("%s:", what);
    for (uint32_t k = 0; k < n; k++)
        printf(" %.0f", v[k]);
    printf("\n");
}

static void test_stalled_costs_little(void **state)
{
    static const char *const args[] = {"--executors=2", "--stall-cut-ms=" STR(STALL_CUT),
                                       "--step-timeout-ms=" STR(STEP_LIMIT), NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    memset(&S, 0, sizeof(S));
    atomic_store(&stop_all, 0);
    static by_t b[N_BY];
    pthread_t th[N_BY], sth;
    for (uint32_t i = 0; i < N_BY; i++) {
        memset(&b[i], 0, sizeof(b[i]));
        b[i].id = i;
        assert_int_equal(pthread_create(&th[i], NULL, by_main, &b[i]), 0);
    }
    assert_int_equal(pthread_create(&sth, NULL, staller_main, NULL), 0);
    sleep_ms(500); /* connected, prefilled, stepping */
    /* alone, with, alone, with, ..., alone: each window with the staller is compared with the
     * mean of the two alone around it, so a load that drifts over seconds (CI's two cores) moves
     * both sides of a ratio alike; the median of the ratios leaves out a window that a burst of
     * other work hit */
    double alone[PAIRS + 1], with[PAIRS], ratio[PAIRS];
    for (uint32_t k = 0; k <= PAIRS; k++) {
        atomic_store(&S.on, 0);
        staller_wait(ST_IDLE);
        alone[k] = by_window(b);
        if (k == PAIRS)
            break;
        atomic_store(&S.on, 1);
        staller_wait(ST_STALLED);
        with[k] = by_window(b);
    }
    atomic_store(&stop_all, 1);
    pthread_join(sth, NULL);
    for (uint32_t i = 0; i < N_BY; i++)
        pthread_join(th[i], NULL);

    for (uint32_t k = 0; k < PAIRS; k++)
        ratio[k] = with[k] / ((alone[k] + alone[k + 1]) / 2);
    print_rates("bystanders' steps/s alone", alone, PAIRS + 1);
    print_rates("... with the staller stalled", with, PAIRS);
    printf("... with / alone around it (%%):");
    for (uint32_t k = 0; k < PAIRS; k++)
        printf(" %.0f", 100 * ratio[k]);
    double mr = median(ratio, PAIRS);
    printf("\n%u bystanders: median %.0f steps/s alone, %.0f beside a stalled session; median "
           "ratio %.0f%% (required >= 75%%); the staller: %u steps, stalls of %.0f-%.0f ms after "
           "layer 0 (limits.stall_cut_ms %u, step_timeout_ms %u), worst %.2e\n",
           N_BY, median(alone, PAIRS + 1), median(with, PAIRS), 100 * mr, S.steps,
           S.shortest_stall_ns / 1e6, S.longest_stall_ns / 1e6, STALL_CUT, STEP_LIMIT, S.worst);
    for (uint32_t i = 0; i < N_BY; i++)
        if (b[i].rc < 0)
            fail_msg("bystander %u: %s: %s", i, pat_strerror(b[i].rc), b[i].err);
    if (S.rc < 0)
        fail_msg("the staller's step (%u done before) failed: %s: %s", S.steps, pat_strerror(S.rc),
                 S.err);
    assert_true(S.worst < 1e-2);
    assert_true(S.steps >= PAIRS); /* a stall over every window with it */
    assert_true(S.shortest_stall_ns >= 5ull * STALL_CUT * 1000000ull);
    if (!(mr >= 0.75))
        fail_msg("a stalled session cost the bystanders %.0f%% of their rate (at most 25%%)",
                 100.0 * (1 - mr));
    assert_int_equal(tl_daemon_metric(&D, "patd_steps_failed_total"), 0);
    assert_int_equal(tl_daemon_status(&D, "connections"), 0);
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&D, SIGTERM, 5000), 0);
    tl_daemon_stop(&D);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sixteen),
        cmocka_unit_test(test_stalled_costs_little),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
