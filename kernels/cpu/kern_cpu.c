/*
 * kern_cpu.c — the cpu backend: executes a plan on host threads with the exact semantics the
 * cuda backend must match (sched_plan_fmt.h). It is the oracle of the GPU tests, what CI runs,
 * and the default on a machine without a GPU.
 *
 * A work item is one CTA x one KV head. Like a GPU CTA it loads each KV tile once (converted to
 * fp32 into per-thread scratch) and applies it to every row of the pack, so a shared prefix is
 * read once per pack here too. Softmax is online per tile of KERN_CPU_TILE tokens: running max,
 * running sum and fp32 accumulator per row; partials are (o normalized, lse natural-log). The
 * merge combines partials with log-sum-exp weights; fully masked rows give 0, never NaN.
 *
 * Threads: a fixed pool created with the backend; a call hands out items through an atomic
 * counter and the calling thread works too. Nothing is allocated after create.
 */
#include "kern_int.h"

#include "kern_dtype.h"
#include "kern_softmax.h"
#include "pat_base.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KERN_CPU_TILE 64u /* KV tokens per tile: K and V of a tile fit in L1/L2 at d = 256 */

typedef struct cpu_scratch {
    float *kf, *vf; /* [TILE][d] */
    float *q, *acc; /* [max_cta_rows][d] */
    float *s;       /* [TILE] */
    float *mx, *l;  /* [max_cta_rows] */
    uint32_t *lim;  /* [max_cta_rows] */
} cpu_scratch_t;

typedef struct kern_cpu kern_cpu_t;
typedef void (*cpu_job_fn)(kern_cpu_t *c, cpu_scratch_t *w, uint32_t item);

struct kern_cpu {
    kern_backend_t base;
    uint8_t *pool;
    int pool_fd; /* kern_config_t.pool_keep: the memfd mapped at pool; else -1 */
    uint64_t pool_bytes;
    float *part_o;   /* [slots * kv_heads * group][d] */
    float *part_lse; /* [slots * kv_heads * group] */
    uint8_t *check;  /* kern__plan_check's scratch */

    uint32_t n_workers; /* threads started (the caller is one more) */
    pthread_t *th;
    cpu_scratch_t *scr; /* n_scr = workers wanted + 1: the caller uses the last */
    uint32_t n_scr;
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen;
    uint32_t running;
    int stop;
    cpu_job_fn job;
    uint32_t n_items;
    atomic_uint next;

    /* arguments of the job in flight */
    const sched_plan_hdr_t *plan;
    uint32_t layer;
    const void *q;
    void *o;
    kern_attn_params_t prm;
};

/* ------------------------------------------------------------------ thread pool */

static void work_loop(kern_cpu_t *c, cpu_scratch_t *w)
{
    for (;;) {
        uint32_t i = atomic_fetch_add(&c->next, 1);
        if (i >= c->n_items)
            return;
        c->job(c, w, i);
    }
}

typedef struct worker_start {
    kern_cpu_t *c;
    cpu_scratch_t *w;
} worker_start_t;

static void *worker_main(void *arg)
{
    worker_start_t st = *(worker_start_t *)arg;
    free(arg);
    pthread_setname_np(pthread_self(), "patd-kcpu");
    kern_cpu_t *c = st.c;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->stop && c->gen == seen)
            pthread_cond_wait(&c->cv_go, &c->mu);
        seen = c->gen;
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            return NULL;
        work_loop(c, st.w);
        pthread_mutex_lock(&c->mu);
        if (--c->running == 0)
            pthread_cond_signal(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
    }
}

static void pool_run(kern_cpu_t *c, cpu_job_fn fn, uint32_t n_items)
{
    if (n_items == 0)
        return;
    c->job = fn;
    c->n_items = n_items;
    atomic_store(&c->next, 0);
    if (c->n_workers) {
        pthread_mutex_lock(&c->mu);
        c->gen++;
        c->running = c->n_workers;
        pthread_cond_broadcast(&c->cv_go);
        pthread_mutex_unlock(&c->mu);
    }
    work_loop(c, &c->scr[c->n_scr - 1]);
    if (c->n_workers) {
        pthread_mutex_lock(&c->mu);
        while (c->running)
            pthread_cond_wait(&c->cv_done, &c->mu);
        pthread_mutex_unlock(&c->mu);
    }
}

/* ------------------------------------------------------------------ attention */

static const uint8_t *kv_ptr(const kern_cpu_t *c, uint32_t layer, uint32_t block, int is_v,
                             uint32_t head, uint32_t off)
{
    const kern_layout_t *l = &c->base.layout;
    return c->pool + kern_layout_at(l, layer, block, (uint32_t)is_v, head, off) * l->elt;
}

/* One KV tile [t0, t1) of a segment for the CTA rows [lo, hi) (q-head rows) of KV head `head`:
 * K and V to fp32, then each row's online softmax step up to its causal limit. */
static void tile_job(kern_cpu_t *c, cpu_scratch_t *w, uint32_t head, const uint32_t *pages,
                     uint32_t page0, uint32_t t0, uint32_t t1, uint32_t lo, uint32_t hi)
{
    const kern_model_t *m = &c->base.cfg.model;
    uint32_t d = m->head_dim, bs = c->plan->block_size;
    float cap = c->prm.softcap;
    const kern_dtype_t kvt = kern_kv_dtype(m);
    const float ks = kern_kv_scale(m); /* 1 unless fp8: exact */
    for (uint32_t t = t0; t < t1; t++) {
        uint32_t blk = pages[t / bs - page0];
        const uint8_t *kp = kv_ptr(c, c->layer, blk, 0, head, t % bs);
        const uint8_t *vp = kv_ptr(c, c->layer, blk, 1, head, t % bs);
        for (uint32_t k = 0; k < d; k++) {
            w->kf[(uint64_t)(t - t0) * d + k] = kern_load(kvt, kp, k) * ks;
            w->vf[(uint64_t)(t - t0) * d + k] = kern_load(kvt, vp, k) * ks;
        }
    }
    for (uint32_t i = lo; i < hi; i++) {
        uint32_t end = PAT_MIN(t1, w->lim[i]);
        if (end <= t0)
            continue;
        uint32_t n = end - t0;
        const float *qi = w->q + (uint64_t)i * d;
        float tmax = -INFINITY;
        for (uint32_t k = 0; k < n; k++) {
            const float *kk = w->kf + (uint64_t)k * d;
            float s = 0.0f;
            for (uint32_t x = 0; x < d; x++)
                s += qi[x] * kk[x];
            if (cap > 0.0f)
                s = cap * tanhf(s / cap);
            w->s[k] = s;
            tmax = s > tmax ? s : tmax;
        }
        float mnew = tmax > w->mx[i] ? tmax : w->mx[i];
        float base = kern_sm_base(mnew);
        float corr = expf(w->mx[i] - base); /* exp(-inf) = 0 on the first tile */
        float *acc = w->acc + (uint64_t)i * d;
        float sum = w->l[i] * corr;
        for (uint32_t x = 0; x < d; x++)
            acc[x] *= corr;
        for (uint32_t k = 0; k < n; k++) {
            float p = expf(w->s[k] - base);
            sum += p;
            const float *vv = w->vf + (uint64_t)k * d;
            for (uint32_t x = 0; x < d; x++)
                acc[x] += p * vv[x];
        }
        w->l[i] = sum;
        w->mx[i] = mnew;
    }
}

static void cta_job(kern_cpu_t *c, cpu_scratch_t *w, uint32_t item)
{
    const kern_model_t *m = &c->base.cfg.model;
    const sched_plan_hdr_t *h = c->plan;
    uint32_t kvh = m->kv_heads, group = h->group, d = m->head_dim, bs = h->block_size;
    uint32_t head = item % kvh;
    const sched_plan_cta_t *cta = &sched_plan_ctas(h)[item / kvh];
    const sched_plan_row_t *rows = sched_plan_rows(h) + cta->row_begin;
    const sched_plan_seg_t *segs = sched_plan_segs(h) + cta->seg_begin;
    float scale = c->prm.scale;

    for (uint32_t r = 0; r < cta->row_count; r++) {
        for (uint32_t j = 0; j < group; j++) {
            uint32_t i = r * group + j;
            uint64_t qoff = ((uint64_t)rows[r].q_tok * m->q_heads + head * group + j) * d;
            for (uint32_t k = 0; k < d; k++)
                w->q[(uint64_t)i * d + k] = kern_load(m->dtype, c->q, qoff + k) * scale;
            memset(w->acc + (uint64_t)i * d, 0, d * sizeof(float));
            w->mx[i] = -INFINITY;
            w->l[i] = 0.0f;
            w->lim[i] = rows[r].limit;
        }
    }
    for (uint32_t sg = 0; sg < cta->seg_count; sg++) {
        const sched_plan_seg_t *x = &segs[sg];
        const uint32_t *pages = sched_plan_pages(h) + x->page_begin;
        uint32_t page0 = x->kv_begin / bs;
        for (uint32_t t0 = x->kv_begin; t0 < x->kv_end; t0 += KERN_CPU_TILE) {
            uint32_t t1 = PAT_MIN(x->kv_end, t0 + KERN_CPU_TILE);
            tile_job(c, w, head, pages, page0, t0, t1, x->row_lo * group, x->row_hi * group);
        }
    }
    for (uint32_t r = 0; r < cta->row_count; r++) {
        for (uint32_t j = 0; j < group; j++) {
            uint32_t i = r * group + j;
            float *acc = w->acc + (uint64_t)i * d;
            float inv = kern_sm_inv(w->l[i]);
            if (rows[r].merge == SCHED_ROW_DIRECT) {
                uint64_t ooff = ((uint64_t)rows[r].q_tok * m->q_heads + head * group + j) * d;
                for (uint32_t x = 0; x < d; x++)
                    kern_store(m->dtype, c->o, ooff + x, acc[x] * inv);
            } else {
                uint64_t slot = ((uint64_t)rows[r].dst * kvh + head) * group + j;
                float *po = c->part_o + slot * d;
                for (uint32_t x = 0; x < d; x++)
                    po[x] = acc[x] * inv;
                c->part_lse[slot] = kern_sm_lse(w->mx[i], w->l[i], 1.0f);
            }
        }
    }
}

static void merge_job(kern_cpu_t *c, cpu_scratch_t *w, uint32_t item)
{
    const kern_model_t *m = &c->base.cfg.model;
    const sched_plan_hdr_t *h = c->plan;
    const sched_plan_merge_t *mg = &sched_plan_merges(h)[item];
    uint32_t kvh = m->kv_heads, group = h->group, d = m->head_dim;
    float *acc = w->acc;
    for (uint32_t qh = 0; qh < m->q_heads; qh++) {
        uint32_t head = qh / group, j = qh % group;
        float mx = -INFINITY;
        for (uint32_t k = 0; k < mg->part_count; k++) {
            float lse = c->part_lse[((uint64_t)(mg->part_begin + k) * kvh + head) * group + j];
            mx = lse > mx ? lse : mx;
        }
        memset(acc, 0, d * sizeof(float));
        float wsum = 0.0f;
        if (mx > -INFINITY) {
            for (uint32_t k = 0; k < mg->part_count; k++) {
                uint64_t slot = ((uint64_t)(mg->part_begin + k) * kvh + head) * group + j;
                float wt = kern_sm_weight(c->part_lse[slot], mx);
                wsum += wt;
                const float *po = c->part_o + slot * d;
                for (uint32_t x = 0; x < d; x++)
                    acc[x] += wt * po[x];
            }
        }
        float inv = kern_sm_inv(wsum);
        uint64_t ooff = ((uint64_t)mg->q_tok * m->q_heads + qh) * d;
        for (uint32_t x = 0; x < d; x++)
            kern_store(m->dtype, c->o, ooff + x, acc[x] * inv);
    }
}

static int cpu_attend(kern_backend_t *b, uint32_t layer, const sched_plan_hdr_t *plan,
                      const void *q, void *o, const kern_attn_params_t *p)
{
    kern_cpu_t *c = (kern_cpu_t *)b;
    int r = kern__plan_check(&b->cfg, plan, c->check);
    if (r < 0)
        return r;
    c->plan = plan;
    c->layer = layer;
    c->q = q;
    c->o = o;
    c->prm = *p;
    pool_run(c, cta_job, plan->n_ctas * b->cfg.model.kv_heads);
    pool_run(c, merge_job, plan->n_merges);
    return 0;
}

/* ------------------------------------------------------------------ KV memory */

static int cpu_append_kv(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                         const uint32_t *slots, uint32_t n)
{
    kern_cpu_t *c = (kern_cpu_t *)b;
    const kern_model_t *m = &b->cfg.model;
    uint64_t limit = (uint64_t)b->cfg.n_blocks * m->block_size;
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] >= limit)
            return -EINVAL; /* checked before any write: nothing changes */
    uint64_t row = (uint64_t)m->head_dim * kern_dtype_size(m->dtype);
    const int fp8 = kern_kv_fp8(m);
    const kern_dtype_t kvt = kern_kv_dtype(m);
    const float ks = kern_kv_scale(m);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t blk = slots[i] / m->block_size, off = slots[i] % m->block_size;
        for (uint32_t h = 0; h < m->kv_heads; h++) {
            const uint64_t e0 = ((uint64_t)i * m->kv_heads + h) * m->head_dim; /* its element */
            const uint64_t src = e0 * kern_dtype_size(m->dtype);
            void *dk = (void *)kv_ptr(c, layer, blk, 0, h, off);
            void *dv = (void *)kv_ptr(c, layer, blk, 1, h, off);
            if (fp8) { /* value / kv_scale, nearest even, saturated; NaN and infinity as 0 */
                for (uint32_t x = 0; x < m->head_dim; x++) {
                    const float kx = kern_load(m->dtype, k, e0 + x);
                    const float vx = kern_load(m->dtype, v, e0 + x);
                    kern_store(kvt, dk, x, isfinite(kx) ? kx / ks : 0.0f);
                    kern_store(kvt, dv, x, isfinite(vx) ? vx / ks : 0.0f);
                }
                continue;
            }
            memcpy(dk, (const uint8_t *)k + src, row);
            memcpy(dv, (const uint8_t *)v + src, row);
            kern_finite(m->dtype, dk, m->head_dim); /* NaN and infinity stored as 0 (kern.h) */
            kern_finite(m->dtype, dv, m->head_dim);
        }
    }
    return 0;
}

static int cpu_copy_blocks(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n)
{
    kern_cpu_t *c = (kern_cpu_t *)b;
    const kern_layout_t *lo = &b->layout;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < lo->n_layers; l++)
            memmove(c->pool + kern_layout_at(lo, l, dst[i], 0, 0, 0) * lo->elt,
                    c->pool + kern_layout_at(lo, l, src[i], 0, 0, 0) * lo->elt,
                    lo->block * lo->elt);
    return 0;
}

/* ------------------------------------------------------------------ lifetime */

static void cpu_destroy(kern_backend_t *b)
{
    kern_cpu_t *c = (kern_cpu_t *)b;
    if (c->th) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv_go);
        pthread_mutex_unlock(&c->mu);
        for (uint32_t i = 0; i < c->n_workers; i++)
            pthread_join(c->th[i], NULL);
        free(c->th);
    }
    if (c->scr) {
        for (uint32_t i = 0; i < c->n_scr; i++) {
            cpu_scratch_t *w = &c->scr[i];
            free(w->kf);
            free(w->vf);
            free(w->q);
            free(w->acc);
            free(w->s);
            free(w->mx);
            free(w->l);
            free(w->lim);
        }
        free(c->scr);
    }
    pthread_cond_destroy(&c->cv_go);
    pthread_cond_destroy(&c->cv_done);
    pthread_mutex_destroy(&c->mu);
    free(c->part_o);
    free(c->part_lse);
    free(c->check);
    if (c->pool_fd >= 0) {
        munmap(c->pool, c->pool_bytes);
        close(c->pool_fd);
    } else
        free(c->pool);
    free(c);
}

/* kern_config_t.pool_keep: the pool as a memfd (new: sized, sealed against resizing, its pages
 * committed now; given: checked for this exact size and mapped as it is, nothing written). */
static int pool_map(kern_cpu_t *c, int given, uint64_t bytes)
{
    int fd;
    if (given < 0) {
        if ((fd = pat_memfd_new("patd-pool", bytes, F_SEAL_SHRINK | F_SEAL_GROW)) < 0)
            return -ENOMEM; /* pool memory (kern.h), whatever stopped it */
    } else {
        struct stat st;
        if (fstat(given, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != bytes)
            return -EINVAL;
        if ((fd = fcntl(given, F_DUPFD_CLOEXEC, 3)) < 0)
            return -errno;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return -ENOMEM;
    }
    c->pool = p;
    c->pool_fd = fd;
    c->pool_bytes = bytes;
    return 0;
}

static int cpu_pool_fd(const kern_backend_t *b)
{
    return ((const kern_cpu_t *)b)->pool_fd;
}

static void touch_pages(void *p, uint64_t bytes)
{
    long page = sysconf(_SC_PAGESIZE);
    volatile uint8_t *b = p;
    for (uint64_t o = 0; o < bytes; o += (uint64_t)(page > 0 ? page : 4096))
        b[o] = 0;
}

/* The host's memory from /proc/meminfo: MemTotal and MemAvailable (what can be allocated without
 * swapping), in bytes. The cpu backend serves wherever it runs. */
static int cpu_probe(int device, kern_probe_t *p)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb;
    while (f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            p->mem_total = kb * 1024ull;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            p->mem_free = kb * 1024ull;
    }
    if (f)
        fclose(f);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(p->device, sizeof(p->device), "host CPUs (%ld online)", online > 0 ? online : 1);
    return 0;
}

static int cpu_create(const kern_config_t *cfg, kern_backend_t **ret)
{
    const kern_model_t *m = &cfg->model;
    const uint32_t d = m->head_dim;
    kern_cpu_t *c = pat_xcalloc(1, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_go, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    c->base.cfg = *cfg;
    c->base.layout = kern_layout(m, cfg->n_blocks);
    /* the pool is KV memory: it may legitimately not fit, which is -ENOMEM, not an abort */
    c->pool_fd = -1;
    const uint64_t pool_bytes = kern_layout_pool_bytes(&c->base.layout);
    int pr = cfg->pool_keep ? pool_map(c, cfg->pool_fd, pool_bytes) : 0;
    if (!cfg->pool_keep)
        c->pool = malloc(pool_bytes);
    uint64_t slots = (uint64_t)cfg->max_partials * m->q_heads;
    c->part_o = malloc((slots ? slots : 1) * d * sizeof(float));
    c->part_lse = malloc((slots ? slots : 1) * sizeof(float));
    if (pr < 0 || !c->pool || !c->part_o || !c->part_lse) {
        cpu_destroy(&c->base);
        return pr < 0 ? pr : -ENOMEM;
    }
    /* touched now, a write per page: the pages are committed at start, not by the first steps
     * that reach them, so a step never pays their faults and the daemon's RSS is flat from the
     * first request on (a memset of zero after malloc may be turned into calloc, which touches
     * nothing) */
    if (c->pool_fd < 0) /* (a memfd's pages are committed by fallocate; an adopted one's hold KV) */
        touch_pages(c->pool, pool_bytes);
    touch_pages(c->part_o, (slots ? slots : 1) * d * sizeof(float));
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t threads = cfg->n_threads ? cfg->n_threads : (uint32_t)(online > 0 ? online : 1);
    threads = PAT_MIN(threads, KERN_MAX_THREADS);
    c->n_scr = threads;
    c->scr = pat_xcalloc(c->n_scr, sizeof(cpu_scratch_t));
    c->check = pat_xmalloc(kern__plan_scratch_bytes(cfg));
    uint32_t rows = cfg->max_cta_rows;
    for (uint32_t i = 0; i < c->n_scr; i++) {
        cpu_scratch_t *w = &c->scr[i];
        w->kf = pat_xmalloc((size_t)KERN_CPU_TILE * d * sizeof(float));
        w->vf = pat_xmalloc((size_t)KERN_CPU_TILE * d * sizeof(float));
        w->q = pat_xmalloc((size_t)rows * d * sizeof(float));
        w->acc = pat_xmalloc((size_t)PAT_MAX(rows, 1u) * d * sizeof(float));
        w->s = pat_xmalloc(KERN_CPU_TILE * sizeof(float));
        w->mx = pat_xmalloc(rows * sizeof(float));
        w->l = pat_xmalloc(rows * sizeof(float));
        w->lim = pat_xmalloc(rows * sizeof(uint32_t));
    }
    c->th = pat_xcalloc(threads, sizeof(pthread_t));
    for (uint32_t i = 0; i + 1 < threads; i++) {
        worker_start_t *s = pat_xmalloc(sizeof(*s));
        s->c = c;
        s->w = &c->scr[i];
        if (pthread_create(&c->th[i], NULL, worker_main, s) != 0) {
            free(s);
            cpu_destroy(&c->base); /* joins the ones that started */
            return -EAGAIN;
        }
        c->n_workers = i + 1;
    }
    *ret = &c->base;
    return 0;
}

const kern_ops_t kern__cpu_ops = {
    .name = "cpu",
    .probe = cpu_probe,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .append_kv = cpu_append_kv,
    .copy_blocks = cpu_copy_blocks,
    .attend = cpu_attend,
    .pool_fd = cpu_pool_fd,
};
