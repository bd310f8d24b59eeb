/*
 * patd_metrics.c — what an operator watches (steps and their latency, packs and their reuse, the
 * plans' KV bytes against query-centric, KV blocks and prefix-cache hits, lanes, sessions, memory,
 * CPU time by thread role) in Prometheus text format, served on
 * http://127.0.0.1:<metrics_port>/metrics by libmicrohttpd on a thread of its own (the endpoint's
 * defences against hostile local clients are described at its code, below) and returned by the
 * STATS admin request (`patctl stats`).
 *
 * Counters are atomics bumped where things happen; pool figures are read under pool_mu; the
 * rendering allocates (open_memstream) and never blocks the loop for long. Names and values follow
 * Prometheus's conventions, base units included (times in seconds, sizes in bytes, a ratio 0..1),
 * so that `promtool check metrics` passes (client/python/tests/test_metrics.py runs it); the
 * prefix-cache, usage and sharing figures sit beside those vLLM exports, under patd's names.
 * jemalloc's own statistics (allocated, active, resident, mapped) come from mallctl when patd is
 * linked with it (the sanitizer build is not: ASan brings its own allocator). The daemon's CPU
 * time, whole (process_cpu_seconds_total) and by thread role (patd_cpu_seconds_total), is read
 * from /proc at each scrape (below, "CPU time by thread role").
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef PATD_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "patd_int.h"
#include "patd_log.h"
#include "pat.h"
#include "pat_base.h"

void patd_metrics_error(patd_t *d, int code)
{
    uint32_t e = (uint32_t)-code;
    if (e < PAT_ARRAY_SIZE(d->m.errors))
        atomic_fetch_add(&d->m.errors[e], 1);
}

#define LD(x) ((unsigned long long)atomic_load(&(x)))

static void metric(FILE *f, const char *name, const char *type, const char *help,
                   unsigned long long v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, v);
}

/* A sample's value kept in nanoseconds, written in seconds (Prometheus's base unit, which promtool
 * checks) as an exact decimal: whole seconds, a point, nine digits; then the line's end */
static void seconds_value(FILE *f, uint64_t ns)
{
    fprintf(f, "%llu.%09llu\n", (unsigned long long)(ns / 1000000000u),
            (unsigned long long)(ns % 1000000000u));
}

static void metric_seconds(FILE *f, const char *name, const char *type, const char *help,
                           uint64_t ns)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s ", name, help, name, type, name);
    seconds_value(f, ns);
}

/* A gauge that is not a count: %.17g, which reads back as the same double */
static void metric_real(FILE *f, const char *name, const char *help, double v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

/* The HELP and TYPE lines of a family whose samples carry labels (written by the caller): the
 * family name alone, never a label set (the text format's grammar; a TYPE line with labels
 * makes Prometheus reject the whole scrape) */
static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* ------------------------------------------------------------------ CPU time by thread role */
/* Where the daemon's CPU goes, read when a scrape asks: utime + stime of every thread from
 * /proc/self/task/<tid>/stat, of the whole process (threads that exited included) from
 * /proc/self/stat; clock ticks of 1/sysconf(_SC_CLK_TCK) s (10 ms on Linux), which is fine for a
 * counter scraped every few seconds. A thread's role comes from its name (comm, set with
 * pthread_setname_np where the thread is made; a thread inherits its creator's name until then):
 * the first row of cpu_roles that matches. The main thread, which runs the loop, goes by its id
 * (tid == pid): renaming it would rename the process for ps, pidof and the service manager.
 *
 * A counter never goes down, yet threads come and go. So every thread seen is remembered (its id
 * and start time, which tell a reused id apart) with its last reading; one that is gone leaves
 * that reading in its role for good. "other" is the process's total less the other roles: it
 * holds what no scrape saw (a thread that lived and died between two, as a reload's does) and
 * what a thread spent between its last reading and its exit. Each figure shown is at least the
 * last one shown (a thread renamed after a scrape moves its earlier time to its new role).
 * The state is the file's own: /proc/self is the process's, as is the one daemon in it; scrapes
 * come from the metrics thread and the loop (STATS), hence the lock. */
typedef enum cpu_role { CPU_LOOP, CPU_EXEC, CPU_LANES, CPU_OTHER, CPU_ROLES } cpu_role_t;

static const struct {
    const char *label;  /* patd_cpu_seconds_total{thread="..."} */
    const char *prefix; /* of the thread names it takes; NULL: the main thread, by its id */
} cpu_roles[CPU_ROLES] = {
    [CPU_LOOP] = {"loop", NULL},
    [CPU_EXEC] = {"executor", "patd-exec"}, /* the executors (patd_exec.c) */
    [CPU_LANES] = {"lanes", "patd-lanes"},  /* the GPU lanes' threads */
    [CPU_OTHER] = {"other", ""},            /* the rest: metrics, reload, backend workers ... */
};

typedef struct cpu_thread {
    pid_t tid;
    unsigned long long start; /* its start, in ticks after boot: a reused tid is another thread */
    uint64_t ticks;           /* utime + stime at its last reading */
    cpu_role_t role;
    uint32_t seen; /* the sample that read it last */
} cpu_thread_t;

static struct {
    pthread_mutex_t mu;
    cpu_thread_t *t; /* the threads seen alive by the last sample */
    uint32_t n, cap;
    uint32_t sample;
    uint64_t gone[CPU_ROLES];  /* ticks of the threads gone, by role, as last read */
    uint64_t shown[CPU_ROLES]; /* the figures last shown, by role */
} cpu_acct = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* One /proc/.../stat file: its name (comm, if ret_comm), utime + stime and start time (ticks).
 * 0, or a negative errno (a thread that exited meanwhile: -ENOENT or -ESRCH). */
static int stat_read(const char *path, char ret_comm[16], uint64_t *ret_ticks,
                     unsigned long long *ret_start)
{
    char buf[1024]; /* a stat line is ~300 bytes; the name at most 15 */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t k = read(fd, buf, sizeof(buf) - 1);
    int rc = k < 0 ? -errno : 0;
    close(fd);
    if (k <= 0)
        return k < 0 ? rc : -EIO;
    buf[k] = 0;
    /* "tid (comm) state ...": the name may hold spaces and parentheses, so it ends at the last
     * ')'. Fields from 3 on (man 5 proc): utime is 14, stime 15, starttime 22 */
    const char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    unsigned long long ut, st, start;
    if (!l || !r || r < l ||
        sscanf(
            r + 1,
            " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu",
            &ut, &st, &start) != 3)
        return -EIO;
    if (ret_comm) {
        size_t n = PAT_MIN((size_t)(r - l - 1), (size_t)15);
        memcpy(ret_comm, l + 1, n);
        ret_comm[n] = 0;
    }
    *ret_ticks = ut + st;
    *ret_start = start;
    return 0;
}

static cpu_role_t cpu_role_of(pid_t tid, const char *comm)
{
    for (int r = 0; r < CPU_ROLES; r++)
        if (cpu_roles[r].prefix ? !strncmp(comm, cpu_roles[r].prefix, strlen(cpu_roles[r].prefix))
                                : tid == getpid())
            return (cpu_role_t)r;
    return CPU_OTHER;
}

/* One reading: the process's ticks and each role's (ret_role), as the comment above says. 0, or a
 * negative errno where /proc/self/stat cannot be read (nothing written then). */
static int cpu_sample(uint64_t *ret_process, uint64_t ret_role[CPU_ROLES])
{
    pthread_mutex_lock(&cpu_acct.mu);
    const uint32_t now = ++cpu_acct.sample;
    DIR *dir = opendir("/proc/self/task");
    for (struct dirent *e; dir && (e = readdir(dir));) {
        char *end, path[64], comm[16];
        long tid = strtol(e->d_name, &end, 10);
        uint64_t ticks;
        unsigned long long start;
        if (end == e->d_name || *end || tid <= 0)
            continue; /* "." and ".." */
        snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
        if (stat_read(path, comm, &ticks, &start) < 0)
            continue; /* it exited meanwhile: the next sample finds it gone */
        cpu_thread_t *t = NULL;
        for (uint32_t i = 0; i < cpu_acct.n && !t; i++)
            if (cpu_acct.t[i].tid == (pid_t)tid)
                t = &cpu_acct.t[i];
        if (t && t->start != start) { /* the id of a thread gone, taken by a new one */
            cpu_acct.gone[t->role] += t->ticks;
            t->ticks = 0;
        } else if (!t) {
            pat_grow((void **)&cpu_acct.t, &cpu_acct.cap, cpu_acct.n + 1, sizeof(*cpu_acct.t));
            t = &cpu_acct.t[cpu_acct.n++];
        }
        *t = (cpu_thread_t){(pid_t)tid, start, ticks, cpu_role_of((pid_t)tid, comm), now};
    }
    if (dir)
        closedir(dir);
    uint64_t role[CPU_ROLES] = {0};
    for (uint32_t i = 0; i < cpu_acct.n;) {
        cpu_thread_t *t = &cpu_acct.t[i];
        if (t->seen == now) {
            role[t->role] += t->ticks;
            i++;
            continue;
        }
        cpu_acct.gone[t->role] += t->ticks; /* exited: its last reading stays in its role */
        *t = cpu_acct.t[--cpu_acct.n];
    }
    uint64_t process;
    unsigned long long start;
    int rc = stat_read("/proc/self/stat", NULL, &process, &start);
    if (rc == 0) {
        uint64_t named = 0;
        for (int r = 0; r < CPU_OTHER; r++) {
            role[r] += cpu_acct.gone[r];
            named += role[r];
        }
        role[CPU_OTHER] = process > named ? process - named : 0;
        for (int r = 0; r < CPU_ROLES; r++)
            ret_role[r] = cpu_acct.shown[r] = PAT_MAX(cpu_acct.shown[r], role[r]);
        *ret_process = process;
    }
    pthread_mutex_unlock(&cpu_acct.mu);
    return rc;
}

/* Clock ticks as seconds, an exact decimal (nine digits: a tick is 1/100 s on Linux) */
static void ticks_seconds(FILE *f, uint64_t ticks)
{
    static long hz;
    if (!hz)
        hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
    const uint64_t ns = ticks % (uint64_t)hz * 1000000000u / (uint64_t)hz;
    seconds_value(f, ticks / (uint64_t)hz * 1000000000u + ns);
}

static void cpu_metrics(FILE *f)
{
    uint64_t process = 0, role[CPU_ROLES];
    if (cpu_sample(&process, role) < 0)
        return; /* no /proc: the page goes without them */
    family(f, "process_cpu_seconds_total", "counter",
           "Total user and system CPU time spent in seconds.");
    fprintf(f, "process_cpu_seconds_total ");
    ticks_seconds(f, process);
    family(f, "patd_cpu_seconds_total", "counter",
           "user + system CPU time of the daemon's threads by role: loop (the main thread), "
           "executor (threads named patd-exec*), lanes (patd-lanes*), other (the rest, and time "
           "no reading saw); they add up to process_cpu_seconds_total");
    for (int r = 0; r < CPU_ROLES; r++) {
        fprintf(f, "patd_cpu_seconds_total{thread=\"%s\"} ", cpu_roles[r].label);
        ticks_seconds(f, role[r]);
    }
}

char *patd_metrics_text(patd_t *d, size_t *ret_len)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    patd_metrics_t *m = &d->m;
    kv_stats_t ks;
    pthread_mutex_lock(&d->pool_mu);
    kv_pool_stats(d->pool, &ks);
    pthread_mutex_unlock(&d->pool_mu);

    family(f, "patd_build_info", "gauge", "the daemon's release, protocol and backend (value 1)");
    fprintf(f, "patd_build_info{version=\"%u.%u.%u\",protocol=\"%u\",backend=\"%s\"} 1\n",
            PAT_VERSION_MAJOR, PAT_VERSION_MINOR, PAT_VERSION_PATCH, (unsigned)IPC_VERSION,
            kern_backend_name(d->be));
    metric(f, "patd_start_time_seconds", "gauge", "when the daemon started (Unix time)",
           (unsigned long long)d->t_start_unix);
    metric(f, "patd_up_seconds", "gauge", "seconds since start",
           (unsigned long long)((pat_now_ns() - d->t_start_ns) / 1000000000ull));
    cpu_metrics(f);
    metric(f, "patd_steps_total", "counter", "steps committed", LD(m->steps));
    metric(f, "patd_steps_failed_total", "counter", "steps that failed (timeout, backend)",
           LD(m->steps_failed));
    metric(f, "patd_steps_aborted_total", "counter", "steps aborted by their client",
           LD(m->steps_aborted));
    metric(f, "patd_step_tokens_total", "counter", "query tokens of committed steps",
           LD(m->tokens));
    fprintf(f, "# HELP patd_step_seconds step latency, STEP_BEGIN received to last layer done\n"
               "# TYPE patd_step_seconds histogram\n");
    unsigned long long cum = 0;
    double lim = 100e-6;
    for (int b = 0; b < 11; b++, lim *= 2) {
        cum += LD(m->step_ns_bucket[b]);
        fprintf(f, "patd_step_seconds_bucket{le=\"%g\"} %llu\n", lim, cum);
    }
    cum += LD(m->step_ns_bucket[11]);
    fprintf(f, "patd_step_seconds_bucket{le=\"+Inf\"} %llu\n", cum);
    fprintf(f, "patd_step_seconds_sum %.9f\npatd_step_seconds_count %llu\n",
            LD(m->step_ns_sum) / 1e9, cum);
    metric(f, "patd_pack_total", "counter", "plans built", LD(m->packs));
    metric(f, "patd_pack_reused_total", "counter", "plans that reused the previous pack (lazy)",
           LD(m->pack_reuses));
    family(f, "patd_pack_policy_total", "counter",
           "packs built, by the policy that made them (auto picks one per step)");
    for (int k = 1; k < 5; k++)
        fprintf(f, "patd_pack_policy_total{policy=\"%s\"} %llu\n",
                sched_policy_name((sched_policy_t)k), LD(m->packs_policy[k]));
    metric(f, "patd_plan_ctas_total", "counter", "CTAs of the plans built (one layer each)",
           LD(m->plan_ctas));
    metric(f, "patd_plan_merges_total", "counter",
           "query tokens whose output merges partials of split CTAs, over the plans built",
           LD(m->plan_merges));
    metric(f, "patd_plan_partials_total", "counter",
           "partial-output slots of split CTAs, over the plans built", LD(m->plan_partials));
    metric_seconds(f, "patd_pack_seconds_total", "counter", "CPU time building plans",
                   LD(m->pack_ns_sum));
    metric_seconds(f, "patd_layer_seconds_total", "counter",
                   "KV append + attention time, all layers", LD(m->layer_ns_sum));
    metric(f, "patd_layers_total", "counter", "layers executed", LD(m->layers));
    metric_seconds(f, "patd_step_start_seconds_total", "counter",
                   "STEP_BEGIN received to the step's first layer begun (cpu: computing, once its "
                   "client handed the layer over; cuda: enqueued on its lane), summed",
                   LD(m->start_ns_sum));
    metric(f, "patd_step_starts_total", "counter", "steps whose first layer began", LD(m->starts));
    char help[200];
    snprintf(help, sizeof(help),
             "GPU steps the event loop reserved and planned itself, or tried to (at most %u "
             "tokens, every sequence only growing, the session's last plans under %llu us); the "
             "others on an executor",
             PATD_STEP_INLINE_TOKENS, (unsigned long long)(PATD_STEP_INLINE_NS / 1000));
    metric(f, "patd_steps_prepared_on_loop_total", "counter", help, LD(m->steps_on_loop));
    family(f, "patd_step_stage_seconds_total", "counter",
           "a GPU step's start by stage, summed (the stages add up to "
           "patd_step_start_seconds_total): queue (STEP_BEGIN received to an executor taking "
           "it; about 0 for one the loop prepares), prepare (reserve and plan), lane_wait (to the "
           "lane thread's pass), upload (the "
           "plan to the GPU), enqueue (to layer 0 enqueued; BEGIN's answer is posted in this "
           "stage)");
    static const char *const stage_names[PATD_STAGES] = {"queue", "prepare", "lane_wait", "upload",
                                                         "enqueue"};
    for (int k = 0; k < PATD_STAGES; k++) {
        fprintf(f, "patd_step_stage_seconds_total{stage=\"%s\"} ", stage_names[k]);
        seconds_value(f, atomic_load(&m->stage_ns_sum[k]));
    }
    metric(f, "patd_kv_read_bytes_total", "counter", "K+V bytes the plans read", LD(m->kv_bytes));
    metric(f, "patd_kv_query_centric_bytes_total", "counter",
           "K+V bytes query-centric execution would have read", LD(m->qc_bytes));
    family(f, "patd_kv_pool_info", "gauge",
           "the KV pool's element type and fp8's factor (stored = value / scale; value 1)");
    fprintf(f, "patd_kv_pool_info{dtype=\"%s\",scale=\"%g\"} 1\n",
            patd_dtype_name((uint32_t)kern_kv_dtype(&d->model)), (double)kern_kv_scale(&d->model));
    metric(
        f, "patd_invariant_chunk_tokens", "gauge",
        "daemon.invariant = 1: the chunk each token's KV is cut at (0: plans depend on the batch)",
        d->cfg.invariant ? d->cfg.invariant_chunk : 0);
    metric(f, "patd_kv_blocks", "gauge", "KV pool capacity in blocks", ks.n_blocks);
    metric(f, "patd_kv_blocks_free", "gauge", "blocks on the free list", ks.n_free);
    metric(f, "patd_kv_blocks_used", "gauge", "blocks referenced by sequences", ks.n_used);
    metric(f, "patd_kv_blocks_cached", "gauge", "unreferenced blocks kept in the prefix cache",
           ks.n_cached);
    metric_real(f, "patd_kv_usage_ratio",
                "blocks referenced by sequences over capacity, 0 to 1 (vLLM's kv_cache_usage_perc)",
                (double)ks.n_used / ks.n_blocks);
    metric(f, "patd_kv_blocks_logical", "gauge",
           "block-table entries of the open sequences: the blocks they would hold unshared",
           ks.n_logical);
    const uint64_t saved = ks.n_logical > ks.n_used ? ks.n_logical - ks.n_used : 0;
    metric(f, "patd_kv_blocks_saved_by_sharing", "gauge",
           "blocks prefix sharing and fork save now (logical minus used)", saved);
    metric(f, "patd_kv_saved_by_sharing_bytes", "gauge",
           "KV bytes prefix sharing and fork save now (blocks saved x bytes per block, all layers)",
           saved * kern_block_bytes(&d->model));
    metric(f, "patd_kv_published_blocks_total", "counter", "blocks stored in the prefix cache",
           ks.published);
    metric(
        f, "patd_kv_duplicate_blocks_total", "counter",
        "full blocks a twin had published first: shared at commit, the sequence's own copy freed",
        ks.duplicates);
    metric(f, "patd_sequences", "gauge", "open sequences", ks.n_seqs);
    metric(f, "patd_prefix_hit_blocks_total", "counter", "prompt blocks found in the cache",
           ks.hit_blocks);
    metric(f, "patd_prefix_miss_blocks_total", "counter", "full prompt blocks not cached",
           ks.miss_blocks);
    metric(f, "patd_prefix_query_tokens_total", "counter",
           "prompt tokens looked up in the prefix cache at open (vLLM's prefix_cache_queries)",
           ks.query_tokens);
    metric(f, "patd_prefix_hit_tokens_total", "counter",
           "prompt tokens whose KV the cache held at open (vLLM's prefix_cache_hits)",
           ks.hit_blocks * kv_pool_block_size(d->pool));
    metric(f, "patd_kv_evictions_total", "counter", "cached blocks reclaimed", ks.evictions);
    if (d->gpu) { /* GPU steps on lanes (patd_lanes.h) */
        const patd_lanes_t *L = &d->lanes;
        metric(f, "patd_lanes", "gauge",
               "lanes: GPU steps that can be in flight at once (gpu.lanes)", L->n);
        metric(f, "patd_lanes_busy", "gauge", "lanes holding a step now", LD(L->busy));
        metric(f, "patd_lanes_busy_max", "gauge", "most lanes held at once since start",
               LD(L->busy_max));
        metric(f, "patd_lane_waiting_steps", "gauge", "prepared steps waiting for a free lane now",
               LD(L->waiting));
        metric(f, "patd_lane_steps_total", "counter", "GPU steps that got a lane", LD(L->steps));
        metric_seconds(f, "patd_lane_wait_seconds_total", "counter",
                       "time GPU steps waited for a lane after they were prepared, summed",
                       LD(L->wait_ns_sum));
        family(f, "patd_lane_cuts_total", "counter", "GPU steps cut on their lane, by why");
        fprintf(f, "patd_lane_cuts_total{reason=\"stall_cut\"} %llu\n", LD(L->cut_stall));
        fprintf(f, "patd_lane_cuts_total{reason=\"step_timeout\"} %llu\n", LD(L->cut_timeout));
        fprintf(f, "patd_lane_cuts_total{reason=\"aborted\"} %llu\n", LD(L->cut_abort));
        metric(f, "patd_lane_polls_total", "counter",
               "passes of the lane thread over the lanes (its CPU cost is per pass)", LD(L->polls));
        metric(f, "patd_cross_packs_total", "counter",
               "cross-session packs begun (gpu.cross_pack): one lane ran their steps' layers",
               LD(L->packs));
        metric(f, "patd_cross_pack_steps_total", "counter", "GPU steps that began in a pack",
               LD(L->pack_steps));
        metric(f, "patd_cross_pack_layers_total", "counter",
               "packed layers enqueued (each one forward for every member still in its pack)",
               LD(L->pack_layers));
        metric(f, "patd_cross_pack_leaves_total", "counter",
               "steps that left their pack (a layer not handed over within "
               "gpu.cross_pack_window_us of the first member's) and ran on alone",
               LD(L->pack_leaves));
        metric(f, "patd_cross_pack_fallbacks_total", "counter",
               "packs that could not begin (their union plan or rows did not fit): each step ran "
               "alone",
               LD(L->pack_fallbacks));
    }
    metric(f, "patd_connections", "gauge", "sessions open",
           LD(m->conns_opened) - LD(m->conns_closed));
    metric(f, "patd_connections_opened_total", "counter", "sessions opened", LD(m->conns_opened));
    family(f, "patd_reclaims_total", "counter", "sessions reclaimed, by why");
    fprintf(f, "patd_reclaims_total{reason=\"client_died\"} %llu\n", LD(m->reclaims_dead));
    fprintf(f, "patd_reclaims_total{reason=\"lease_expired\"} %llu\n", LD(m->reclaims_lease));
    metric_seconds(f, "patd_reclaim_seconds_max", "gauge", "longest reclaim of a session",
                   LD(m->reclaim_ns_max));
    fprintf(f, "# HELP patd_requests_total requests by opcode\n# TYPE patd_requests_total "
               "counter\n");
    for (uint32_t op = 0; op < IPC_OP_MAX; op++)
        if (ipc_op_is_admin(op) >= 0)
            fprintf(f, "patd_requests_total{op=\"%s\"} %llu\n", ipc_op_name(op), LD(m->frames[op]));
    fprintf(f, "# HELP patd_errors_total refusals by code\n# TYPE patd_errors_total counter\n");
    for (uint32_t e = 1; e < PAT_ARRAY_SIZE(m->errors); e++)
        if (ipc_err_name(-(int)e))
            fprintf(f, "patd_errors_total{code=\"%s\"} %llu\n", ipc_err_name(-(int)e),
                    LD(m->errors[e]));
#ifdef PATD_HAVE_JEMALLOC
    uint64_t epoch = 1;
    size_t sz = sizeof(epoch);
    mallctl("epoch", &epoch, &sz, &epoch, sz);
    const char *names[] = {"stats.allocated", "stats.active", "stats.resident", "stats.mapped"};
    metric(f, "patd_jemalloc_enabled", "gauge", "1 when jemalloc is the allocator", 1);
    family(f, "patd_jemalloc_bytes", "gauge", "jemalloc's statistics (stats.<stat>)");
    for (size_t i = 0; i < PAT_ARRAY_SIZE(names); i++) {
        size_t v = 0;
        sz = sizeof(v);
        if (mallctl(names[i], &v, &sz, NULL, 0) == 0)
            fprintf(f, "patd_jemalloc_bytes{stat=\"%s\"} %zu\n", names[i] + 6, v);
    }
#else
    metric(f, "patd_jemalloc_enabled", "gauge", "1 when jemalloc is the allocator", 0);
#endif
    fclose(f);
    *ret_len = len;
    return out;
}

/* ------------------------------------------------------------------ the HTTP endpoint */
/* Anyone on the host can reach the port, so the server is shaped for hostile clients:
 *  - epoll (libmicrohttpd's MHD_USE_EPOLL), never select(): patd holds thousands of descriptors
 *    (sessions' connections, pidfds, staging buffers) and select() cannot watch one numbered
 *    1,024 or more;
 *  - one request per connection (every answer says Connection: close), and a connection has
 *    METRICS_REQUEST_MS from its accept to be answered and gone: past it, it is shut down whatever
 *    it is doing. A client that trickles its request a byte at a time is never idle, so an idle
 *    timeout never closes it; this deadline does. So PATD_METRICS_MAX_CONNS hostile connections
 *    hold the slots for METRICS_REQUEST_MS at most, and a scrape waiting in the listen backlog is
 *    accepted within that (after whatever was queued ahead of it: a local user who keeps
 *    thousands of connects queued can still delay it, by METRICS_REQUEST_MS per
 *    PATD_METRICS_MAX_CONNS of them);
 *  - a request's line and headers must fit METRICS_HEADER_BYTES (libmicrohttpd's per-connection
 *    memory; more is refused: 431, or closed unanswered near the bound): that times
 *    PATD_METRICS_MAX_CONNS is what clients can make the endpoint hold.
 * One thread of patd's drives libmicrohttpd (MHD_run) from an epoll set of its own (libmicrohttpd's
 * epoll descriptor and an eventfd that stops it), and between runs shuts down the connections past
 * their deadline: on the thread that closes them, so a descriptor is never shut down after
 * libmicrohttpd closed it and the number went to another file. */
#define METRICS_REQUEST_MS   1000u /* a scrape takes milliseconds on loopback, even under ASan */
#define METRICS_HEADER_BYTES 8192u /* a scrape's request is ~300 bytes */

/* One connection, from libmicrohttpd's STARTED notice to its CLOSED one (socket_context). */
typedef struct http_conn {
    struct http_conn *prev, *next; /* on the deadline list, while listed */
    uint64_t deadline_ns;          /* accepted + METRICS_REQUEST_MS */
    int fd;                        /* the connection's socket (libmicrohttpd's) */
    int listed;                    /* 0 once cut */
} http_conn_t;

typedef struct patd_http patd_http_t;
struct patd_http {
    patd_t *d;
    struct MHD_Daemon *mhd;
    pthread_t thread;
    int thread_on;
    int ep;                   /* epoll: libmicrohttpd's epoll descriptor, stop_fd */
    int stop_fd;              /* eventfd: patd_metrics_stop wakes the thread to return */
    http_conn_t *head, *tail; /* not yet cut, oldest first: in deadline order */
    int reaped; /* a connection closed in the last run: run again at once, as libmicrohttpd
                   watches its listening socket again (a slot came free) only as a run starts */
};

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_len, void **state)
{
    patd_t *d = cls;
    struct MHD_Response *r;
    unsigned status = MHD_HTTP_OK;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        static const char msg[] = "only GET\n";
        r = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else if (strcmp(url, "/metrics")) {
        static const char msg[] = "patd: metrics are at /metrics\n";
        r = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_NOT_FOUND;
    } else {
        size_t len;
        char *text = patd_metrics_text(d, &len);
        r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close"); /* one request each */
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static void unlist(patd_http_t *h, http_conn_t *hc)
{
    if (!hc->listed)
        return;
    *(hc->prev ? &hc->prev->next : &h->head) = hc->next;
    *(hc->next ? &hc->next->prev : &h->tail) = hc->prev;
    hc->listed = 0;
}

/* libmicrohttpd's notices, on the server's thread: a connection accepted is stamped and listed
 * last (every deadline is its accept + the same span, so the list stays in deadline order); one
 * closed (its socket not yet closed) is forgotten. */
static void on_conn(void *cls, struct MHD_Connection *conn, void **ctx,
                    enum MHD_ConnectionNotificationCode what)
{
    patd_http_t *h = cls;
    http_conn_t *hc = *ctx;
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        hc = pat_xcalloc(1, sizeof(*hc));
        hc->fd = ci ? ci->connect_fd : -1;
        hc->deadline_ns = pat_now_ns() + METRICS_REQUEST_MS * 1000000ull;
        hc->prev = h->tail;
        *(h->tail ? &h->tail->next : &h->head) = hc;
        h->tail = hc;
        hc->listed = 1;
        *ctx = hc;
        return;
    }
    if (!hc)
        return;
    unlist(h, hc);
    free(hc);
    *ctx = NULL;
    h->reaped = 1;
}

/* Shuts down the connections past their deadline; libmicrohttpd sees the hang-up on its next run
 * and closes them (its CLOSED notice frees them). */
static void cut_late(patd_http_t *h, uint64_t now)
{
    while (h->head && h->head->deadline_ns <= now) {
        http_conn_t *hc = h->head;
        unlist(h, hc);
        if (hc->fd >= 0)
            shutdown(hc->fd, SHUT_RDWR);
    }
}

/* The server's thread: wait for libmicrohttpd's sockets, the next deadline or the stop; run. */
static void *http_main(void *arg)
{
    patd_http_t *h = arg;
    for (;;) {
        uint64_t now = pat_now_ns();
        int ms = -1;
        if (h->reaped)
            ms = 0;
        else if (h->head)
            ms = h->head->deadline_ns <= now
                     ? 0
                     : (int)((h->head->deadline_ns - now + 999999u) / 1000000u);
        MHD_UNSIGNED_LONG_LONG mhd_ms;
        if (MHD_get_timeout(h->mhd, &mhd_ms) == MHD_YES && (ms < 0 || mhd_ms < (unsigned)ms))
            ms = (int)PAT_MIN(mhd_ms, (MHD_UNSIGNED_LONG_LONG)INT_MAX);
        h->reaped = 0;
        struct epoll_event ev[2];
        int n = epoll_wait(h->ep, ev, 2, ms);
        if (n < 0 && errno != EINTR) {
            patd_err("metrics: epoll_wait: %s; the endpoint stops", strerror(errno));
            return NULL;
        }
        for (int i = 0; i < n; i++)
            if (ev[i].data.fd == h->stop_fd)
                return NULL;
        MHD_run(h->mhd);
        cut_late(h, pat_now_ns());
    }
}

/* libmicrohttpd's messages are mostly about a client (a header too large, a reset), which any
 * local user can cause at will: the debug level, never a flood at the default one. What operators
 * need (the endpoint not listening, its thread failing) patd logs itself. */
static void http_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = 0;
    patd_debug("metrics: %s", line);
}

static void http_free(patd_http_t *h)
{
    if (!h)
        return;
    if (h->thread_on) {
        uint64_t one = 1;
        if (write(h->stop_fd, &one, sizeof(one)) != sizeof(one))
            abort(); /* an eventfd below its maximum always takes 1 */
        pthread_join(h->thread, NULL);
    }
    if (h->mhd)
        MHD_stop_daemon(h->mhd); /* closes what is open; its CLOSED notices free them */
    if (h->ep >= 0)
        close(h->ep);
    if (h->stop_fd >= 0)
        close(h->stop_fd);
    free(h);
}

int patd_metrics_start(patd_t *d)
{
    if (!d->cfg.metrics_port)
        return 0;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)d->cfg.metrics_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    patd_http_t *h = pat_xcalloc(1, sizeof(*h));
    h->d = d;
    h->ep = h->stop_fd = -1;
    h->mhd =
        MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, (uint16_t)d->cfg.metrics_port, NULL,
                         NULL, on_http, d, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_LIMIT,
                         PATD_METRICS_MAX_CONNS, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                         (size_t)METRICS_HEADER_BYTES, MHD_OPTION_NOTIFY_CONNECTION, on_conn, h,
                         MHD_OPTION_EXTERNAL_LOGGER, http_log, NULL, MHD_OPTION_END);
    if (!h->mhd) {
        patd_err("metrics: cannot listen on 127.0.0.1:%u (in use? set metrics_port=0 to "
                 "disable)",
                 d->cfg.metrics_port);
        http_free(h);
        return -EADDRINUSE;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    h->ep = epoll_create1(EPOLL_CLOEXEC);
    h->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev_mhd = {.events = EPOLLIN, .data.fd = di ? di->epoll_fd : -1};
    struct epoll_event ev_stop = {.events = EPOLLIN, .data.fd = h->stop_fd};
    int rc = 0;
    if (!di || h->ep < 0 || h->stop_fd < 0 ||
        epoll_ctl(h->ep, EPOLL_CTL_ADD, ev_mhd.data.fd, &ev_mhd) < 0 ||
        epoll_ctl(h->ep, EPOLL_CTL_ADD, h->stop_fd, &ev_stop) < 0)
        rc = -(errno ? errno : EIO);
    else if ((rc = -pthread_create(&h->thread, NULL, http_main, h)) == 0)
        h->thread_on = 1;
    if (rc < 0) {
        patd_err("metrics: cannot start the endpoint's thread: %s", strerror(-rc));
        http_free(h);
        return rc;
    }
    pthread_setname_np(h->thread, "patd-metrics");
    d->http = h;
    return 0;
}

void patd_metrics_stop(patd_t *d)
{
    http_free(d->http);
    d->http = NULL;
}
