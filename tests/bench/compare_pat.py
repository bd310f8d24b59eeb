#!/usr/bin/env python3
"""patd beside PAT on the same GPU: bench_attn's JSON lines and PAT's (../shared/peers/pat,
pat_bench.py --json) from the same device call, joined per (tree, heads).

Prints one row per case: patd and PAT latency, the roofline floor max(distinct bytes / read
bandwidth, FLOPs / tensor rate) that bench_attn measured, patd / PAT, each one's multiple of the
floor, patd's achieved TB/s and TFLOP/s, KV re-read factor and the merge's share of the call;
then the geometric mean of PAT / patd over the shared-prefix cases, the worst ten, and the issue
targets with a pass or a miss.

usage: compare_pat.py PATD.jsonl PAT.jsonl [--field pat_us|tma_us|mma_us|layer_us|wide128_us|tree16_us|tree32_us|inside_us] [--md OUT.md]
(--field: which of bench_attn's patd timings to compare; pat_us is the default backend's)
"""
import argparse
import json
import math
import sys


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("patd")
    ap.add_argument("pat")
    ap.add_argument("--md", help="also write the table as Markdown here")
    ap.add_argument("--field", default="pat_us", help="bench_attn timing to compare")
    a = ap.parse_args()
    pat = {(r["tree"], r["hq"], r["hkv"]): r for r in load(a.pat)}
    rows = []
    for r in load(a.patd):
        key = (r["tree"], r["q_heads"], r["kv_heads"])
        if key not in pat:
            print("no PAT row for %s %d/%d" % key, file=sys.stderr)
            continue
        p = pat[key]
        if a.field not in r:
            print("compare_pat: no %s in %s" % (a.field, a.patd), file=sys.stderr)
            return 1
        if a.field != "pat_us":  # the ratios below are of this timing
            scale = r[a.field] / r["pat_us"]
            r = dict(r, pat_us=r[a.field], tbs=r["tbs"] / scale, tflops=r["tflops"] / scale)
            if a.field == "wide128_us":  # its own plan's KV re-read
                r["reread"] = r["wide128_reread"]
        rows.append(dict(r, peer_us=p["pat_us"], peer_err=p.get("rel_err", float("nan")),
                         unwritten=p.get("unwritten_rows", 0)))
    if not rows:
        print("compare_pat: no common cases", file=sys.stderr)
        return 1
    head = ("| tree | heads | q | floor µs | patd µs | PAT µs | PAT ÷ patd | patd ÷ floor | "
            "PAT ÷ floor | TB/s | TFLOP/s | re-read | merge % |")
    lines = ["patd timing: %s" % a.field, "", head, "|" + "---|" * 13]
    for r in rows:
        lines.append("| `%s` | %d/%d | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.0f | "
                     "%.2f | %.1f |" % (
                         r["tree"], r["q_heads"], r["kv_heads"], r["queries"], r["floor_us"],
                         r["pat_us"], r["peer_us"], r["peer_us"] / r["pat_us"],
                         r["pat_us"] / r["floor_us"], r["peer_us"] / r["floor_us"], r["tbs"],
                         r["tflops"], r["reread"], 100 * r["merge_frac"]))
    shared = [r for r in rows if not r["tree"].startswith("256_")]
    unshared = [r for r in rows if r["tree"].startswith("256_")]
    speed = [r["peer_us"] / r["pat_us"] for r in shared]
    out = ["", "shared-prefix cases: %d; patd faster than PAT on %d; geometric mean PAT / patd "
           "%.3f (patd %.2fx the floor, PAT %.2fx)" % (
               len(shared), sum(s > 1 for s in speed), geo(speed),
               geo([r["pat_us"] / r["floor_us"] for r in shared]),
               geo([r["peer_us"] / r["floor_us"] for r in shared]))]
    for hc in sorted({(r["q_heads"], r["kv_heads"]) for r in shared}, reverse=True):
        sel = [r["peer_us"] / r["pat_us"] for r in shared if (r["q_heads"], r["kv_heads"]) == hc]
        out.append("  %d/%d: PAT / patd %.3f over %d cases" % (hc[0], hc[1], geo(sel), len(sel)))
    worst = sorted(shared, key=lambda r: r["peer_us"] / r["pat_us"])[:10]
    out.append("worst ten (PAT / patd): " + ", ".join(
        "%s %d/%d %.2f" % (r["tree"], r["q_heads"], r["kv_heads"], r["peer_us"] / r["pat_us"])
        for r in worst))
    t_geo = geo(speed) >= 1.15 if shared else False
    t_each = all(s >= 1 / 1.05 for s in speed)
    t_un = all(r["pat_us"] / (r["distinct_bytes"] / (r["read_bw"]) * 1e6) <= 1.10 for r in unshared)
    t_merge = all(r["merge_frac"] <= 0.05 for r in rows)
    out.append("targets (step 1): geo >= 1.15x PAT: %s; no case > 5 %% slower than PAT: %s; "
               "unshared <= 1.10x bytes floor: %s; merge <= 5 %% of every call: %s" % (
                   "met" if t_geo else "MISSED", "met" if t_each else "MISSED",
                   "met" if t_un else "MISSED", "met" if t_merge else "MISSED"))
    if unshared:
        out.append("unshared: " + ", ".join(
            "%s %d/%d %.2fx bytes floor" % (r["tree"], r["q_heads"], r["kv_heads"],
                                             r["pat_us"] / (r["distinct_bytes"] / r["read_bw"] * 1e6))
            for r in unshared))
    text = "\n".join(lines + out)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
