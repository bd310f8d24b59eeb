/*
 * test_cuda_xpack.cu — cross-session packing on the cuda backend (kern.h's kern_lane_pack_*),
 * below the daemon: N "sessions" of B decoding sequences each, every sequence over one prompt
 * they all share (the same pool blocks) and a private tail, each session's rows, new K/V and
 * handshake words its own, as patd gives them.
 *
 * Checked (default):
 *   - a packed layer (every member hands it over) writes every member's O as the float64
 *     reference says (relative error < 1e-2) and posts every done word; the new K/V land in the
 *     pool (the next layer's reference reads them);
 *   - a member that does not hand a layer over within the window leaves the pack: out[] names the
 *     layer, its O and done word are untouched while the others are served; its own lane then
 *     runs that layer from its own plan and gets the reference's O;
 *   - an excluded member (kern_lane_pack_exclude) is not waited for: the others' layer runs
 *     although its ready word is never set.
 * --bench [N B PROMPT OWN LAYERS REPS]: attention time per layer (a layer's append + forward +
 * merge and the hand-off words) of the N sessions on N lanes of their own (as patd runs them
 * without packing), against one packed lane (gate, gather, the union forward, scatter); every
 * layer's KV is its own, LAYERS of them in turn, so the shared prompt is read from memory, not
 * L2, except where lanes running at once share it. Printed beside them: the floors (bytes of the
 * plans over the measured read bandwidth). Default 4 16 2048 32 32 20 (issue 36's 4 x 16
 * frontends sharing a 2K prompt).
 * Ends with "N passed, N failed"; exit status 1 if any failed.
 */
#include <cuda_runtime.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <vector>

extern "C" {
#include "kern.h"
#include "kern_dtype.h"
#include "sched_plan.h"
#include "tl_ref.h"
}
#include "kern_cuda.h"
#include "kern_cuda_tool.h"

static int passed, failed;

static void check(bool ok, const char *what)
{
    printf("%-72s %s\n", what, ok ? "ok" : "FAILED");
    ok ? passed++ : failed++;
}

static const uint32_t QH = 32, KVH = 8, D = 128, BS = KERN_BLOCK_SIZE;
static const kern_dtype_t DT = KERN_BF16;

static double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double rt(double v)
{
    uint16_t b;
    kern_store(DT, &b, 0, (float)v);
    return kern_load(DT, &b, 0);
}

/* The rig: sessions, their sequences' block tables, plans, rows and words. */
struct Sess {
    sched_t *s;
    const sched_plan_hdr_t *plan;
    std::vector<std::vector<uint32_t>> blocks; /* per sequence */
    std::vector<uint32_t> slots;               /* the new token's slot per sequence */
    void *q, *k, *v, *o;                       /* device rows */
    kern_share_t words;                        /* ready[L] then done[L] */
    uint64_t *ready, *done;
    kern_lane_t *lane;
};

struct Rig {
    uint32_t n, b, prompt, own, layers;
    kern_backend_t *be;
    sched_tiles_t tiles;
    std::vector<Sess> s;
    sched_t *us;
    const sched_plan_hdr_t *uplan;
    std::vector<uint32_t> uslots;
    kern_lane_t *pack;
    uint32_t kv_len; /* every sequence's, the new token included */
    uint64_t seed;
};

static sched_config_t sched_cfg(Rig &g, uint32_t queries, uint32_t tokens)
{
    sched_config_t sc = {};
    sc.max_queries = queries;
    sc.max_tokens = tokens;
    sc.block_size = BS;
    sc.q_heads = QH;
    sc.kv_heads = KVH;
    sc.head_dim = D;
    sc.kv_elt_bytes = 2;
    sc.split_min_kv = 256;
    sc.max_partials = 2 * tokens;
    sc.tiles = &g.tiles;
    return sc;
}

static void rig_up(Rig &g, uint32_t n, uint32_t b, uint32_t prompt, uint32_t own, uint32_t layers,
                   bool fill)
{
    g.n = n, g.b = b, g.prompt = prompt, g.own = own, g.layers = layers, g.seed = 0x5eed;
    g.kv_len = prompt + own + 1;
    const uint32_t pblocks = prompt / BS, per_seq = (g.kv_len - pblocks * BS + BS - 1) / BS;
    kern_config_t kc = {};
    kc.model = {layers, QH, KVH, D, BS, DT, DT, 0.f};
    kc.n_blocks = pblocks + n * b * per_seq + 1;
    kc.max_tokens = 4096;
    kc.max_partials = 8192;
    REQ(kern_backend_create("cuda", &kc, &g.be));
    REQ(kern_tiles(g.be, &g.tiles));
    uint64_t block_elems;
    void *pool = kern_cuda_pool(g.be, 0, &block_elems);
    CK(cudaMemset(pool, 0, block_elems * 2 * kc.n_blocks * layers)); /* no NaN in the bench */
    /* the pool: every block's KV of every layer from tl_kv_value (the float64 side reads it) */
    if (fill) {
        const uint32_t row = KVH * D;
        std::vector<uint16_t> hk((uint64_t)kc.n_blocks * BS * row), hv(hk.size());
        std::vector<uint32_t> slots(kc.n_blocks * BS);
        for (uint32_t blk = 0; blk < kc.n_blocks; blk++)
            for (uint32_t off = 0; off < BS; off++) {
                const uint32_t t = blk * BS + off;
                slots[t] = t;
                for (uint32_t h = 0; h < KVH; h++)
                    for (uint32_t x = 0; x < D; x++) {
                        const uint64_t e = (uint64_t)t * row + h * D + x;
                        kern_store(DT, hk.data(), e, (float)tl_kv_value(g.seed, blk, off, h, x, 0));
                        kern_store(DT, hv.data(), e, (float)tl_kv_value(g.seed, blk, off, h, x, 1));
                    }
            }
        void *dk, *dv;
        CK(cudaMalloc(&dk, hk.size() * 2));
        CK(cudaMalloc(&dv, hv.size() * 2));
        CK(cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
        for (uint32_t l = 0; l < layers; l++)
            REQ(kern_append_kv(g.be, l, dk, dv, slots.data(), (uint32_t)slots.size()));
        REQ(kern_sync(g.be));
        CK(cudaFree(dk));
        CK(cudaFree(dv));
    }
    /* sessions: sequence j of session i = the prompt's blocks, then blocks of its own */
    uint32_t next_blk = pblocks;
    g.s.resize(n);
    sched_config_t usc = sched_cfg(g, n * b, n * b);
    REQ(sched_create(&usc, &g.us));
    uint32_t uq = 0;
    for (uint32_t i = 0; i < n; i++) {
        Sess &S = g.s[i];
        sched_config_t sc = sched_cfg(g, b, b);
        REQ(sched_create(&sc, &S.s));
        S.blocks.resize(b);
        for (uint32_t j = 0; j < b; j++) {
            for (uint32_t p = 0; p < pblocks; p++)
                S.blocks[j].push_back(p);
            for (uint32_t p = 0; p < per_seq; p++)
                S.blocks[j].push_back(next_blk++);
            const uint32_t pos = g.kv_len - 1;
            S.slots.push_back(S.blocks[j][pos / BS] * BS + pos % BS);
            sched_query_t q = {S.blocks[j].data(), (uint32_t)S.blocks[j].size(), g.kv_len, 1, j, 0};
            REQ(sched_forest_join(sched_forest(S.s), j, &q));
            q.tok_off = i * b + j;
            REQ(sched_forest_join(sched_forest(g.us), uq++, &q));
            g.uslots.push_back(S.slots.back());
        }
        REQ(sched_build(S.s, &S.plan));
        const uint64_t qb = (uint64_t)b * QH * D * 2, kb = (uint64_t)b * KVH * D * 2;
        CK(cudaMalloc(&S.q, qb));
        CK(cudaMalloc(&S.o, qb));
        CK(cudaMalloc(&S.k, kb));
        CK(cudaMalloc(&S.v, kb));
        REQ(kern_share_alloc(g.be, 2 * layers * sizeof(uint64_t), KERN_SHARE_HOST, &S.words));
        S.ready = (uint64_t *)S.words.dev;
        S.done = S.ready + layers;
        REQ(kern_lane_create(g.be, &S.lane));
    }
    REQ(sched_build(g.us, &g.uplan));
    REQ(kern_lane_create(g.be, &g.pack));
}

static void rig_down(Rig &g)
{
    for (Sess &S : g.s) {
        kern_lane_free(S.lane);
        kern_share_free(g.be, &S.words);
        cudaFree(S.q);
        cudaFree(S.k);
        cudaFree(S.v);
        cudaFree(S.o);
        sched_free(S.s);
    }
    kern_lane_free(g.pack);
    sched_free(g.us);
    kern_backend_free(g.be);
    g = Rig();
}

/* Random Q and new K/V of layer `layer` for every session (host copies for the reference). */
struct Rows {
    std::vector<uint16_t> q, k, v;
};
static std::vector<Rows> rows_fill(Rig &g, uint32_t layer)
{
    std::vector<Rows> out(g.n);
    uint64_t st = 0x9e3779b97f4a7c15ull ^ (layer * 131ull + 7);
    auto rnd = [&]() {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        return (double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    };
    for (uint32_t i = 0; i < g.n; i++) {
        Rows &r = out[i];
        r.q.resize((uint64_t)g.b * QH * D);
        r.k.resize((uint64_t)g.b * KVH * D);
        r.v.resize(r.k.size());
        for (uint64_t e = 0; e < r.q.size(); e++)
            kern_store(DT, r.q.data(), e, (float)rnd());
        for (uint64_t e = 0; e < r.k.size(); e++) {
            kern_store(DT, r.k.data(), e, (float)rnd());
            kern_store(DT, r.v.data(), e, (float)rnd());
        }
        CK(cudaMemcpy(g.s[i].q, r.q.data(), r.q.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(g.s[i].k, r.k.data(), r.k.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(g.s[i].v, r.v.data(), r.v.size() * 2, cudaMemcpyHostToDevice));
    }
    return out;
}

/* Session i's O of that layer against the float64 reference (the new token's K/V from rows). */
static double ref_err(Rig &g, uint32_t i, uint32_t layer, const Rows &r)
{
    Sess &S = g.s[i];
    const uint32_t grp = QH / KVH, n = g.kv_len;
    std::vector<uint16_t> o((uint64_t)g.b * QH * D);
    CK(cudaMemcpy(o.data(), S.o, o.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<double> K((uint64_t)n * D), V(K.size()), q(D), out(D), got, want;
    for (uint32_t j = 0; j < g.b; j++)
        for (uint32_t h = 0; h < KVH; h++) {
            for (uint32_t t = 0; t < n; t++) {
                const uint32_t blk = S.blocks[j][t / BS], off = t % BS;
                for (uint32_t x = 0; x < D; x++) {
                    if (t + 1 == n) { /* this layer's new token, from the rows */
                        K[(uint64_t)t * D + x] =
                            kern_load(DT, r.k.data(), ((uint64_t)j * KVH + h) * D + x);
                        V[(uint64_t)t * D + x] =
                            kern_load(DT, r.v.data(), ((uint64_t)j * KVH + h) * D + x);
                    } else {
                        K[(uint64_t)t * D + x] = rt(tl_kv_value(g.seed, blk, off, h, x, 0));
                        V[(uint64_t)t * D + x] = rt(tl_kv_value(g.seed, blk, off, h, x, 1));
                    }
                }
            }
            for (uint32_t a = 0; a < grp; a++) {
                const uint32_t qh = h * grp + a;
                for (uint32_t x = 0; x < D; x++)
                    q[x] = kern_load(DT, r.q.data(), ((uint64_t)j * QH + qh) * D + x);
                tl_ref_attend(q.data(), K.data(), V.data(), n, D, 1.0 / sqrt((double)D), 0,
                              out.data());
                for (uint32_t x = 0; x < D; x++) {
                    want.push_back(out[x]);
                    got.push_back(kern_load(DT, o.data(), ((uint64_t)j * QH + qh) * D + x));
                }
            }
        }
    (void)layer;
    return tl_rel_err(got.data(), want.data(), got.size());
}

static void members(Rig &g, std::vector<kern_pack_member_t> &m, uint64_t epoch)
{
    m.resize(g.n);
    for (uint32_t i = 0; i < g.n; i++)
        m[i] = {g.s[i].q,    g.s[i].k, g.s[i].v, g.s[i].o, g.s[i].ready,
                g.s[i].done, epoch,    i * g.b,  g.b};
}

static void set_word(uint64_t *w, uint64_t v)
{
    __atomic_store_n(w, v, __ATOMIC_RELEASE);
}
static uint64_t get_word(const uint64_t *w)
{
    return __atomic_load_n(w, __ATOMIC_ACQUIRE);
}

static void test_pack()
{
    Rig g;
    rig_up(g, 3, 4, 256, 20, 3, true);
    const kern_attn_params_t prm = {1.0f / sqrtf((float)D), 0};
    std::vector<kern_pack_member_t> m;
    members(g, m, 1);
    REQ(kern_lane_pack_begin(g.pack, g.uplan, g.uslots.data(), g.n * g.b, m.data(), g.n, 2000));

    /* layer 0: everyone hands over */
    std::vector<Rows> r0 = rows_fill(g, 0);
    REQ(kern_lane_pack_layer(g.pack, 0, &prm, 1));
    for (uint32_t i = 0; i < g.n; i++)
        set_word(&g.s[i].ready[0], 1);
    CK(cudaDeviceSynchronize());
    double worst = 0;
    bool posted = true;
    for (uint32_t i = 0; i < g.n; i++) {
        worst = fmax(worst, ref_err(g, i, 0, r0[i]));
        posted &= get_word(&g.s[i].done[0]) == 1;
    }
    printf("packed layer, 3 members: worst error vs float64 %.2e\n", worst);
    check(worst < 1e-2 && posted, "a packed layer serves every member (O, done words)");
    check(kern_lane_progress(g.pack) == 1, "the pack's progress counts the layer");

    /* layer 1: member 2 is late; the others are served after the window */
    std::vector<Rows> r1 = rows_fill(g, 1);
    CK(cudaMemset(g.s[2].o, 0x7f, (uint64_t)g.b * QH * D * 2));
    REQ(kern_lane_pack_layer(g.pack, 1, &prm, 1));
    const double t0 = now_s();
    set_word(&g.s[0].ready[1], 1);
    set_word(&g.s[1].ready[1], 1);
    while (get_word(&g.s[1].done[1]) != 1 && now_s() - t0 < 5)
        ;
    const double waited = now_s() - t0;
    CK(cudaDeviceSynchronize());
    const volatile uint32_t *out = kern_lane_pack_out(g.pack);
    worst = fmax(ref_err(g, 0, 1, r1[0]), ref_err(g, 1, 1, r1[1]));
    std::vector<uint16_t> o2((uint64_t)g.b * QH * D);
    CK(cudaMemcpy(o2.data(), g.s[2].o, o2.size() * 2, cudaMemcpyDeviceToHost));
    bool untouched = get_word(&g.s[2].done[1]) == 0;
    for (uint16_t x : o2)
        untouched &= x == 0x7f7f;
    printf("layer 1 with member 2 late: served after %.2f ms (window 2 ms), out = %u %u %u, "
           "worst error %.2e\n",
           waited * 1e3, out[0], out[1], out[2], worst);
    check(out[0] == 0 && out[1] == 0 && out[2] == 2, "the late member left at that layer");
    check(worst < 1e-2, "the others were served");
    check(untouched, "the late member's O and done word untouched");
    check(waited < 1.0, "the others waited about the window, not for the late one");
    /* member 2 runs layer 1 alone, on its own lane */
    kern_lane_layer_t ly = {};
    ly.layer = 1;
    ly.compute = 1;
    ly.report = 1;
    ly.q = g.s[2].q, ly.k = g.s[2].k, ly.v = g.s[2].v, ly.o = g.s[2].o;
    ly.params = prm;
    ly.wait_word = &g.s[2].ready[1], ly.wait_value = 1;
    ly.post_word = &g.s[2].done[1], ly.post_value = 1;
    REQ(kern_lane_begin(g.s[2].lane, g.s[2].plan, g.s[2].slots.data(), g.b));
    REQ(kern_lane_layer(g.s[2].lane, &ly));
    set_word(&g.s[2].ready[1], 1);
    CK(cudaDeviceSynchronize());
    const double e2 = ref_err(g, 2, 1, r1[2]);
    check(e2 < 1e-2 && get_word(&g.s[2].done[1]) == 1, "it then runs that layer on its own lane");

    /* layer 2: member 2 is out of the pack: served neither way by it; member 1 excluded */
    std::vector<Rows> r2 = rows_fill(g, 2);
    kern_lane_pack_exclude(g.pack, 1);
    REQ(kern_lane_pack_layer(g.pack, 2, &prm, 1));
    set_word(&g.s[0].ready[2], 1);
    const double t1 = now_s();
    while (get_word(&g.s[0].done[2]) != 1 && now_s() - t1 < 5)
        ;
    const double served_after = now_s() - t1;
    CK(cudaDeviceSynchronize());
    const double e0 = ref_err(g, 0, 2, r2[0]);
    printf("layer 2, member 1 excluded, 2 out: member 0 served after %.3f ms, error %.2e\n",
           served_after * 1e3, e0);
    check(e0 < 1e-2 && get_word(&g.s[1].done[2]) == 0 && get_word(&g.s[2].done[2]) == 0,
          "an excluded member is not waited for; only the member in is served");
    check(served_after < 1.0e-3, "... without waiting out the window (2 ms)");
    check(kern_lane_progress(g.pack) == 3, "every packed layer ran");
    rig_down(g);
}

/* Times `reps` passes over every layer: solo (each session on its lane) or packed. */
static double time_layers(Rig &g, bool packed, uint32_t reps, uint64_t epoch0)
{
    const kern_attn_params_t prm = {1.0f / sqrtf((float)D), 0};
    kern_share_t go;
    REQ(kern_share_alloc(g.be, 64, KERN_SHARE_HOST, &go));
    uint64_t *gw = (uint64_t *)go.dev;
    double t = 0;
    for (uint32_t rep = 0; rep < reps + 1; rep++) { /* the first pass warms up */
        const uint64_t ep = epoch0 + rep;
        for (uint32_t i = 0; i < g.n; i++)
            for (uint32_t l = 0; l < g.layers; l++)
                set_word(&g.s[i].ready[l], ep); /* handed over already: the GPU never waits */
        set_word(gw, 0);
        kern_lane_layer_t hold = {};
        hold.wait_word = gw, hold.wait_value = 1;
        if (packed) {
            std::vector<kern_pack_member_t> m;
            members(g, m, ep);
            REQ(kern_lane_pack_begin(g.pack, g.uplan, g.uslots.data(), g.n * g.b, m.data(), g.n,
                                     1000));
            REQ(kern_lane_layer(g.pack, &hold));
            for (uint32_t l = 0; l < g.layers; l++)
                REQ(kern_lane_pack_layer(g.pack, l, &prm, l + 1 == g.layers));
        } else
            for (uint32_t i = 0; i < g.n; i++) {
                Sess &S = g.s[i];
                REQ(kern_lane_begin(S.lane, S.plan, S.slots.data(), g.b));
                REQ(kern_lane_layer(S.lane, &hold));
                for (uint32_t l = 0; l < g.layers; l++) {
                    kern_lane_layer_t ly = {};
                    ly.layer = l, ly.compute = 1, ly.report = l + 1 == g.layers;
                    ly.q = S.q, ly.k = S.k, ly.v = S.v, ly.o = S.o, ly.params = prm;
                    ly.wait_word = &S.ready[l], ly.wait_value = ep;
                    ly.post_word = &S.done[l], ly.post_value = ep;
                    REQ(kern_lane_layer(S.lane, &ly));
                }
            }
        usleep(20000); /* everything is queued behind the hold */
        const double t0 = now_s();
        set_word(gw, 1);
        CK(cudaDeviceSynchronize());
        if (rep)
            t += now_s() - t0;
    }
    kern_share_free(g.be, &go);
    return t / reps / g.layers;
}

static void bench(uint32_t n, uint32_t b, uint32_t prompt, uint32_t own, uint32_t layers,
                  uint32_t reps)
{
    Rig g;
    rig_up(g, n, b, prompt, own, layers, false);
    const double bw = kern_cuda_read_bandwidth(1ull << 30, 5);
    sched_traffic_t ut, st, one;
    memset(&st, 0, sizeof(st));
    sched_plan_traffic(g.uplan, QH, KVH, D, 2, 2, &ut);
    for (uint32_t i = 0; i < n; i++) {
        sched_plan_traffic(g.s[i].plan, QH, KVH, D, 2, 2, &one);
        st.total += one.total;
    }
    /* ABBA over two rounds: solo, packed, packed, solo */
    double solo = 0, pk = 0;
    uint64_t ep = 1;
    for (int r = 0; r < 2; r++) {
        const bool first_packed = r == 1;
        double a = time_layers(g, first_packed, reps, ep);
        ep += reps + 1;
        double c = time_layers(g, !first_packed, reps, ep);
        ep += reps + 1;
        (first_packed ? pk : solo) += a / 2;
        (first_packed ? solo : pk) += c / 2;
    }
    printf("bench: %u sessions x %u decoding sequences, a shared %u-token prompt + %u own tokens, "
           "%u layers, %u passes, bf16 32/8 heads d=128\n",
           n, b, prompt, own, layers, reps);
    printf("  read bandwidth %.0f GB/s\n", bw / 1e9);
    printf("  per layer: %u lanes of their own %.1f us (floor %.1f us: %.2f MB)  |  one packed "
           "lane %.1f us (floor %.1f us: %.2f MB)  |  packed / own lanes %.2f\n",
           n, solo * 1e6, st.total / bw * 1e6, st.total / 1e6, pk * 1e6, ut.total / bw * 1e6,
           ut.total / 1e6, pk / solo);
    check(pk > 0 && solo > 0, "bench ran");
    rig_down(g);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        uint32_t a[6] = {4, 16, 2048, 32, 32, 20};
        for (int i = 2; i < argc && i < 8; i++)
            a[i - 2] = (uint32_t)strtoul(argv[i], NULL, 10);
        bench(a[0], a[1], a[2], a[3], a[4], a[5]);
    } else
        test_pack();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
