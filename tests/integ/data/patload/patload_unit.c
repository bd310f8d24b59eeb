/*
 * patload_unit.c — checks of patload's report code that a live replay cannot reach, compiled by
 * tests/integ/test_patload.py (test_report_units) with patload's own sources and, where the
 * compiler has it, UBSan with float-cast-overflow (not part of -fsanitize=undefined in GCC).
 *
 *   patload_unit errnames OUT.json  a report of four requests, two failed with codes the reports
 *                                   do not name (E133, E131), one ENOSPC, one completed, written
 *                                   with --save-detailed's arrays: each keeps its own name
 *   patload_unit peaks              the figures of two completed requests that started 1e19 s
 *                                   apart (out of any 1-s bucket's int64 range): prints
 *                                   "peaks CONCURRENT TOKENS"
 * Exit 0, or 1 with a message.
 */
#include "patload_metrics.h"
#include "patload_report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int errnames(const char *out)
{
    static double itl[2] = {0.01, 0.02};
    /* arrivals, admissions and finishes in s; err 0: completed with three tokens */
    static const int errs[4] = {-133, -131, 0, -ENOSPC};
    pl_rec_t rec[4];
    for (int i = 0; i < 4; i++)
        rec[i] = (pl_rec_t){.line = (uint32_t)i + 1,
                            .in_len = 10,
                            .out_len = 3,
                            .err = errs[i],
                            .t_arrive = 0.1 * i,
                            .t_admit = 0.1 * i,
                            .t_first = errs[i] ? -1 : 0.5,
                            .t_done = errs[i] ? -1 : 0.53,
                            .t_last = errs[i] ? -1 : 0.53,
                            .generated = errs[i] ? 0 : 3,
                            .itl = errs[i] ? NULL : itl,
                            .n_itl = errs[i] ? 0 : 2};
    pl_report_t r = {.trace = "unit",
                     .format = "unit",
                     .compute = "none",
                     .device = "",
                     .backend = "cpu",
                     .kv_pool = "f16",
                     .trace_requests = 4,
                     .passes = 1,
                     .speed = 1,
                     .scale = 1,
                     .request_rate = NAN,
                     .burstiness = NAN,
                     .save_detailed = 1,
                     .rec = rec,
                     .n_rec = 4,
                     .wall_s = 1,
                     .kv_blocks_total = -1,
                     .kv_blocks_peak = -1};
    pl_metrics_cfg_init(&r.metrics);
    int rc = pl_report_json(&r, out);
    if (rc < 0) {
        fprintf(stderr, "pl_report_json %s: %s\n", out, strerror(-rc));
        return 1;
    }
    return 0;
}

static int peaks(void)
{
    static const double itl[1] = {0.1};
    pl_timing_t t[2] = {
        {.start_s = 0,
         .ttft_s = 0.5,
         .latency_s = 0.6,
         .itl_s = itl,
         .n_itl = 1,
         .output_len = 2,
         .input_len = 4,
         .ok = 1},
        /* its last token a day later: its first falls below the last bucket's end (the 1 s
         * added to the span is lost at 1e19) */
        {.start_s = 1e19,
         .ttft_s = 0.5,
         .latency_s = 86400,
         .itl_s = itl,
         .n_itl = 1,
         .output_len = 2,
         .input_len = 4,
         .ok = 1},
    };
    pl_metrics_cfg_t cfg;
    pl_metrics_cfg_init(&cfg);
    pl_metrics_t m;
    pl_metrics_compute(t, 2, 10, &cfg, &m);
    printf("peaks %u %.0f\n", m.max_concurrent_requests, m.max_output_tokens_per_s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "errnames"))
        return errnames(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "peaks"))
        return peaks();
    fprintf(stderr, "usage: patload_unit errnames OUT.json | peaks\n");
    return 2;
}
