/*
 * test_cuda_merge.cu — the GPU merge stage against a float64 merge on the host, for every dtype
 * and head_dim, with empty (-inf) partials and fully masked tokens; outputs poisoned first and
 * checked fully written. Then a timing of one large merge with CUDA events (median of 50 after
 * warm-up) beside its memory floor: bytes moved / the read bandwidth measured in the same run.
 * Ends with "N passed, N failed".
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "kern_cuda.h"
#include "kern_cuda_tool.h"
#include "kern_dtype.h"

static int passed, failed;

static uint64_t rng = 0x1234567;
static double urand()
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

struct Case {
    uint32_t n_tokens, q_heads, kv_heads, d;
    kern_dtype_t dt;
};

static void run_case(const Case &c)
{
    const uint32_t group = c.q_heads / c.kv_heads;
    std::vector<sched_plan_merge_t> merges;
    uint32_t slots = 0;
    for (uint32_t t = 0; t < c.n_tokens; t++) {
        uint32_t parts = 2 + (uint32_t)(urand() * 6);
        merges.push_back({t, slots, parts, 0});
        slots += parts;
    }
    const uint64_t rows = (uint64_t)slots * c.kv_heads * group;
    std::vector<float> po(rows * c.d), plse(rows);
    for (uint64_t r = 0; r < rows; r++) {
        double u = urand();
        plse[r] = u < 0.15 ? -INFINITY : (float)(20.0 * urand() - 10.0);
        for (uint32_t x = 0; x < c.d; x++)
            po[r * c.d + x] = (float)(2.0 * urand() - 1.0);
    }
    /* token 0: every part empty -> output must be exactly 0 */
    for (uint32_t k = 0; k < merges[0].part_count; k++)
        for (uint32_t h = 0; h < c.q_heads; h++)
            plse[(uint64_t)(merges[0].part_begin + k) * c.q_heads + h] = -INFINITY;

    const uint32_t esz = c.dt == KERN_F32 ? 4 : 2;
    const uint64_t out_elems = (uint64_t)c.n_tokens * c.q_heads * c.d;
    sched_plan_merge_t *dm;
    float *dpo, *dpl;
    void *dout;
    CK(cudaMalloc(&dm, merges.size() * sizeof(sched_plan_merge_t)));
    CK(cudaMalloc(&dpo, po.size() * sizeof(float)));
    CK(cudaMalloc(&dpl, plse.size() * sizeof(float)));
    CK(cudaMalloc(&dout, out_elems * esz));
    CK(cudaMemcpy(dm, merges.data(), merges.size() * sizeof(sched_plan_merge_t),
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpo, po.data(), po.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpl, plse.data(), plse.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xff, out_elems * esz)); /* poison: NaN in every dtype */

    kern_cuda_merge_params_t p = {
        dm, (uint32_t)merges.size(), dpo, dpl, dout, c.q_heads, c.kv_heads, c.d, c.dt, nullptr};
    int rc = kern_cuda_merge_launch(&p);
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> out(out_elems * esz);
    CK(cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost));

    double worst = 0.0;
    int all_finite = 1, zero_ok = 1;
    for (uint32_t t = 0; t < c.n_tokens; t++) {
        const sched_plan_merge_t &m = merges[t];
        double num = 0, den = 0;
        for (uint32_t qh = 0; qh < c.q_heads; qh++) {
            double mx = -INFINITY;
            for (uint32_t k = 0; k < m.part_count; k++)
                mx = std::max(mx, (double)plse[(uint64_t)(m.part_begin + k) * c.q_heads + qh]);
            for (uint32_t x = 0; x < c.d; x++) {
                double acc = 0, ws = 0;
                if (mx > -INFINITY)
                    for (uint32_t k = 0; k < m.part_count; k++) {
                        uint64_t slot = (uint64_t)(m.part_begin + k) * c.q_heads + qh;
                        double w = exp((double)plse[slot] - mx);
                        ws += w;
                        acc += w * po[slot * c.d + x];
                    }
                double ref = ws > 0 ? acc / ws : 0.0;
                double got = kern_load(c.dt, out.data(), ((uint64_t)t * c.q_heads + qh) * c.d + x);
                all_finite &= isfinite(got) ? 1 : 0;
                if (t == 0 && got != 0.0)
                    zero_ok = 0;
                num += (got - ref) * (got - ref);
                den += ref * ref;
            }
        }
        if (den > 0)
            worst = std::max(worst, sqrt(num / den));
    }
    double tol = c.dt == KERN_F32 ? 1e-5 : 1e-2;
    int ok = rc == 0 && all_finite && zero_ok && worst < tol;
    printf("%s merge tokens %u heads %u/%u d %u dtype %d: rel err %.2e (bound %.0e)%s%s\n",
           ok ? "ok  " : "FAIL", c.n_tokens, c.q_heads, c.kv_heads, c.d, (int)c.dt, worst, tol,
           all_finite ? "" : " NON-FINITE OUTPUT", zero_ok ? "" : " MASKED TOKEN NOT ZERO");
    ok ? passed++ : failed++;
    CK(cudaFree(dm));
    CK(cudaFree(dpo));
    CK(cudaFree(dpl));
    CK(cudaFree(dout));
}

static double median_ms(cudaEvent_t, cudaEvent_t, std::vector<float> &v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void bench()
{
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* the floor: plain read bandwidth over 4 GiB, 16-byte loads */
    const double bw = kern_cuda_read_bandwidth(4ull << 30, 20);
    if (!(bw > 0)) {
        fprintf(stderr, "read bandwidth: %g\n", bw);
        exit(2);
    }
    printf("device: %s, %d SMs; measured read bandwidth %.0f GB/s (median of 20)\n", prop.name,
           prop.multiProcessorCount, bw / 1e9);

    /* 8192 tokens x 4 parts, Llama-3-8B heads (32 q / 8 kv, d 128), bf16 out */
    const uint32_t T = 8192, P = 4, QH = 32, KVH = 8, D = 128;
    std::vector<sched_plan_merge_t> m(T);
    for (uint32_t i = 0; i < T; i++)
        m[i] = {i, i * P, P, 0};
    uint64_t rows = (uint64_t)T * P * QH;
    sched_plan_merge_t *dm;
    float *po, *pl;
    void *o;
    CK(cudaMalloc(&dm, T * sizeof(sched_plan_merge_t)));
    CK(cudaMalloc(&po, rows * D * sizeof(float)));
    CK(cudaMalloc(&pl, rows * sizeof(float)));
    CK(cudaMalloc(&o, (uint64_t)T * QH * D * 2));
    CK(cudaMemcpy(dm, m.data(), T * sizeof(sched_plan_merge_t), cudaMemcpyHostToDevice));
    CK(cudaMemset(po, 0, rows * D * sizeof(float)));
    CK(cudaMemset(pl, 0, rows * sizeof(float)));
    kern_cuda_merge_params_t p = {dm, T, po, pl, o, QH, KVH, D, KERN_BF16, nullptr};
    std::vector<float> t;
    for (int i = 0; i < 60; i++) {
        CK(cudaEventRecord(e0));
        if (kern_cuda_merge_launch(&p) != 0)
            exit(2);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 10)
            t.push_back(ms);
    }
    double med = median_ms(e0, e1, t);
    double bytes = rows * (D + 1) * 4.0 + (double)T * QH * D * 2;
    printf("bench merge 8192 tokens x 4 parts, 32/8 heads, d 128, bf16: median %.1f us; "
           "floor %.1f us (%.1f MB / %.0f GB/s) -> %.0f%% of read bandwidth\n",
           med * 1e3, bytes / bw * 1e6, bytes / 1e6, bw / 1e9, 100.0 * bytes / bw / (med * 1e-3));
    CK(cudaFree(dm));
    CK(cudaFree(po));
    CK(cudaFree(pl));
    CK(cudaFree(o));
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "--quick"); /* no benchmark (sanitizer runs) */
    const Case cases[] = {
        {700, 8, 8, 64, KERN_F16},   {500, 32, 8, 128, KERN_BF16}, {300, 16, 1, 256, KERN_F32},
        {400, 12, 4, 128, KERN_F16}, {200, 14, 2, 256, KERN_BF16}, {600, 6, 6, 64, KERN_F32},
    };
    for (const Case &c : cases)
        run_case(c);
    /* the interface refuses what it cannot do */
    kern_cuda_merge_params_t bad = {};
    int r1 = kern_cuda_merge_launch(&bad);
    float dummy;
    kern_cuda_merge_params_t bad2 = {nullptr, 0, &dummy, &dummy,   &dummy,
                                     8,       8, 96,     KERN_F16, nullptr};
    sched_plan_merge_t *one;
    CK(cudaMalloc(&one, sizeof(*one)));
    bad2.merges = one;
    bad2.n_merges = 1;
    int r2 = kern_cuda_merge_launch(&bad2);
    CK(cudaFree(one));
    int ok = r1 == -EINVAL && r2 == -ENOTSUP;
    printf("%s error codes: NULL -> %d (want %d), head_dim 96 -> %d (want %d)\n",
           ok ? "ok  " : "FAIL", r1, -EINVAL, r2, -ENOTSUP);
    ok ? passed++ : failed++;
    if (!quick)
        bench();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
