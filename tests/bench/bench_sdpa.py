#!/usr/bin/env python3
"""bench_sdpa.py — PyTorch SDPA on dense per-query KV for the rows of bench_attn --json, and the
table of the whole attention benchmark (as in tests/bench/log/2026-11-21-pat-trees-h200.md).

For each (tree, heads) row: every query's KV materialized densely ([queries, kv_heads, kv_len,
128] fp16, GQA through enable_gqa), one decode token per query, torch.nn.functional
.scaled_dot_product_attention timed with CUDA events (median of 50 after 5 warm-ups). Rows whose
dense KV would exceed --max-gib are skipped (reported as '-'). Prints a markdown table with the
latencies, both floors, the effective bandwidth and every ratio, then the geometric means.

usage: bench_sdpa.py IN.jsonl [--out TABLE.md] [--max-gib 24]
"""
import argparse
import json
import math
import sys


def sdpa_us(torch, q_heads, kv_heads, queries, kv_len, max_gib):
    dense = queries * kv_heads * kv_len * 128 * 2 * 2
    if dense > max_gib * 2**30:
        return None
    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.rand(queries, q_heads, 1, 128, device="cuda", dtype=torch.float16, generator=g) - 0.5
    k = torch.rand(queries, kv_heads, kv_len, 128, device="cuda", dtype=torch.float16,
                   generator=g) - 0.5
    v = torch.rand_like(k) - 0.5
    gqa = q_heads != kv_heads
    for _ in range(5):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    del q, k, v
    torch.cuda.empty_cache()
    times.sort()
    return times[len(times) // 2]


def geo(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("--out")
    ap.add_argument("--max-gib", type=float, default=24.0)
    args = ap.parse_args()
    rows = [json.loads(l) for l in open(args.inp) if l.strip()]
    try:
        import torch
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    lines = ["| tree | heads | q | kv | pat µs | bw floor µs | tc floor µs | eff. BW | qc µs | "
             "fixed µs | no-merge µs | SDPA µs | qc/pat | fixed/pat | merge % | SDPA/pat | "
             "pack µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = None
        if have_torch:
            s = sdpa_us(torch, r["q_heads"], r["kv_heads"], r["queries"], r["kv_len"],
                        args.max_gib)
        r["sdpa_us"] = s
        lines.append(
            "| `{tree}` | {q_heads}/{kv_heads} | {queries} | {kv_len} | {pat_us:.1f} | "
            "{floor_bw_us:.1f} | {floor_tc_us:.1f} | {eff:.0f} % | {qc_us:.1f} | {fixed_us:.1f} | "
            "{nomerge_us:.1f} | {sdpa} | {a:.2f} | {b:.2f} | {c:.2f} | {d} | {pack_us:.0f} |".format(
                eff=100 * r["eff_bw_frac"], sdpa="-" if s is None else "%.1f" % s,
                a=r["qc_us"] / r["pat_us"], b=r["fixed_us"] / r["pat_us"],
                c=100 * r["merge_frac"],
                d="-" if s is None else "%.2f" % (s / r["pat_us"]), **r))
    shared = [r for r in rows if not r["tree"].startswith("256_")]
    unshared = [r for r in rows if r["tree"].startswith("256_")]
    lines.append("")
    lines.append("geometric means over the shared-prefix trees: qc/pat %.2f, fixed/pat %.2f, "
                 "largest merge share %.1f %%, SDPA/pat %.2f" % (
                     geo([r["qc_us"] / r["pat_us"] for r in shared]),
                     geo([r["fixed_us"] / r["pat_us"] for r in shared]),
                     100 * max(r["merge_frac"] for r in shared),
                     geo([r["sdpa_us"] / r["pat_us"] for r in shared if r["sdpa_us"]])))
    if unshared:
        lines.append("no-sharing trees: qc/pat " + ", ".join(
            "%s %s/%s %.2f" % (r["tree"], r["q_heads"], r["kv_heads"], r["qc_us"] / r["pat_us"])
            for r in unshared))
    big = [r for r in rows if r["queries"] >= 64 and r["kv_len"] >= 1024]
    if big:
        lines.append("effective bandwidth on >= 64 queries x >= 1K KV: min %.0f %%, median %.0f %% "
                     "of measured read bandwidth (%d rows)" % (
                         100 * min(r["eff_bw_frac"] for r in big),
                         100 * sorted(r["eff_bw_frac"] for r in big)[len(big) // 2], len(big)))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        open(args.out, "w").write(text)


if __name__ == "__main__":
    main()
