#!/usr/bin/env python3
"""patd beside PAT on the same GPU: bench_attn's JSON lines and PAT's (../shared/peers/pat,
pat_bench.py --json) from the same device call, joined per (tree, heads).

Prints one row per case: patd and PAT latency, the roofline floor max(distinct bytes / read
bandwidth, FLOPs / tensor rate) that bench_attn measured, patd / PAT, each one's multiple of the
floor, patd's achieved TB/s and TFLOP/s, KV re-read factor and the merge's share of the call;
then, per set of trees (bench_attn's "paper": the PAT paper's 20; "own": its ten of our own), the
geometric mean of PAT / patd over the shared-prefix cases and the worst ten; the time model's pick
against the best of the four policies forced; and issue 39's targets with a pass or a miss.

usage: compare_pat.py PATD.jsonl PAT.jsonl [--field pat_us|tma_us|mma_us|layer_us|wide128_us|tree16_us|tree32_us|inside_us] [--md OUT.md]
(--field: which of bench_attn's patd timings to compare; pat_us is the default backend's; with
another, the time model's pick and the merge target are left out: both judge auto's plan)
"""
import argparse
import json
import math
import sys


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def emit(lines, out, md=None, marks=()):
    """Prints the table (lines), the summary (out) and one line per (target, verdict) of marks
    (None: not run), and writes the same to md where given."""
    if marks:
        out = out + [""] + ["target: %s: %s" % (name, "not run" if ok is None else
                                                "met" if ok else "missed") for name, ok in marks]
    text = "\n".join(lines + out)
    print(text)
    if md:
        with open(md, "w") as f:
            f.write(text + "\n")


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def bytes_floor_x(r):
    """patd's latency over the bytes floor (distinct KV bytes / read bandwidth)"""
    return r["pat_us"] / (r["distinct_bytes"] / r["read_bw"] * 1e6)


def pick_x(r):
    """the time model's pick (auto) over the fastest of the four policies it picks among, each
    forced on the same backend in the same run"""
    return r["pat_us"] / min(r["bytes_us"], r["paper_us"], r["qc_us"], r["tree_us"])


def summary(name, rows):
    """the geometric mean of PAT / patd over a set of cases, per head config, the worst ten"""
    speed = [r["peer_us"] / r["pat_us"] for r in rows]
    out = ["", "%s shared-prefix cases: %d; patd faster than PAT on %d; geometric mean PAT / patd "
           "%.3f (patd %.2fx the floor, PAT %.2fx)" % (
               name, len(rows), sum(x > 1 for x in speed), geo(speed),
               geo([r["pat_us"] / r["floor_us"] for r in rows]),
               geo([r["peer_us"] / r["floor_us"] for r in rows]))]
    for hc in sorted({(r["q_heads"], r["kv_heads"]) for r in rows}, reverse=True):
        sel = [r["peer_us"] / r["pat_us"] for r in rows if (r["q_heads"], r["kv_heads"]) == hc]
        out.append("  %d/%d: PAT / patd %.3f over %d cases" % (hc[0], hc[1], geo(sel), len(sel)))
    worst = sorted(rows, key=lambda r: r["peer_us"] / r["pat_us"])[:10]
    out.append("worst ten (PAT / patd): " + ", ".join(
        "%s %d/%d %.2f" % (r["tree"], r["q_heads"], r["kv_heads"], r["peer_us"] / r["pat_us"])
        for r in worst))
    return out


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
    out = []
    for r in rows:  # runs before the sets were recorded timed the paper's trees only
        r.setdefault("set", "paper")
    unshared, sets = [], {}
    for r in rows:  # the paper's two one-level trees share nothing
        if r["set"] == "paper" and r["tree"].startswith("256_"):
            unshared.append(r)
        else:
            sets.setdefault(r["set"], []).append(r)
    for name in sorted(sets, key=lambda n: (n != "paper", n)):
        out += summary(name, sets[name])
    paper, own = sets.get("paper", []), sets.get("own", [])
    speed = [r["peer_us"] / r["pat_us"] for r in paper]
    big = [r["pat_us"] / r["floor_us"] for r in paper if r["queries"] >= 64]
    marks = [  # None: no case of the kind was run
        ("paper trees: geo >= 1.6x PAT", geo(speed) >= 1.6 if paper else None),
        ("every paper case >= 1.0x PAT", all(x >= 1 for x in speed) if paper else None),
        ("patd <= 1.4x the floor (geo)",
         geo([r["pat_us"] / r["floor_us"] for r in paper]) <= 1.4 if paper else None),
        ("trees of >= 64 queries <= 1.3x the floor on half",
         2 * sum(x <= 1.3 for x in big) >= len(big) if big else None),
        ("own trees: none slower than PAT",
         all(r["peer_us"] >= r["pat_us"] for r in own) if own else None),
        ("unshared <= 1.05x bytes floor",
         all(bytes_floor_x(r) <= 1.05 for r in unshared) if unshared else None),
    ]
    if a.field == "pat_us":  # merge_frac is of auto's plan, as is the model's pick below
        marks.append(("merge <= 10 % of every call", all(r["merge_frac"] <= 0.10 for r in rows)))
    # with another --field the rows hold an ablation's timing in auto's place: the pick line
    # would judge that instead
    forced = [r for r in rows if "bytes_us" in r] if a.field == "pat_us" else []
    if forced:
        marks.append(("time model's pick within 3 % of the best forced policy",
                      all(pick_x(r) <= 1.03 for r in forced)))
    out.append("targets (step 3): " + "; ".join(
        "%s: %s" % (m, "not run" if ok is None else "met" if ok else "MISSED") for m, ok in marks))
    if forced:
        worst = sorted(forced, key=pick_x, reverse=True)
        out.append("time model: pick within 3 %% of the best of bytes/paper/query/tree on %d of %d "
                   "cases; worst: %s" % (
                       sum(pick_x(r) <= 1.03 for r in forced), len(forced), ", ".join(
                           "%s %d/%d %.3f (picked %s)" % (r["tree"], r["q_heads"], r["kv_heads"],
                                                          pick_x(r), r["policy"])
                           for r in worst[:5])))
    if unshared:
        out.append("unshared: " + ", ".join(
            "%s %d/%d %.2fx bytes floor" % (r["tree"], r["q_heads"], r["kv_heads"],
                                             bytes_floor_x(r))
            for r in unshared))
    emit(lines, out, a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
