#!/usr/bin/env python3
"""patd's batch-invariant plans beside its default plans and beside PAT on the same GPU:
bench_attn --invariant's JSON lines and PAT's (tests/gpu/pat_bench.sh) from the same device call,
joined per (tree, heads).

Prints one row per case: the default plan's latency, each invariant chunk's, PAT's; then, over the
PAT paper's shared-prefix cases (its 20 trees but the two one-level ones, per head config), for
each chunk the geometric mean of invariant / default and of PAT / invariant, and issue 40's two
invariant targets with a pass or a miss: invariant <= 1.15x the default (geometric mean) and still
faster than PAT (geometric mean). Where the rows carry every cut rule's time (bench_attn
--invariant-cuts), also the geometric mean of the best rule per case beside the time model's pick.

usage: compare_invariant.py PATD.jsonl PAT.jsonl [--md OUT.md]
"""
import argparse
import re
import sys

from compare_pat import emit, geo, load  # this directory's: the same rows, mean and report


def chunks_of(row):
    return sorted(int(m.group(1)) for m in (re.fullmatch(r"inv(\d+)_us", k) for k in row) if m)


def cut_times(row, c):
    """each forced cut rule's time of chunk c (bench_attn --invariant-cuts), or []"""
    found = {int(m.group(1)): v for k, v in row.items()
             for m in [re.fullmatch(r"inv%d_cut(\d+)_us" % c, k)] if m}
    return [found[k] for k in sorted(found)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("patd")
    ap.add_argument("pat")
    ap.add_argument("--md", help="also write the table as Markdown here")
    a = ap.parse_args()
    pat = {(r["tree"], r["hq"], r["hkv"]): r for r in load(a.pat)}
    rows = []
    for r in load(a.patd):
        key = (r["tree"], r["q_heads"], r["kv_heads"])
        if key not in pat:
            print("no PAT row for %s %d/%d" % key, file=sys.stderr)
            continue
        rows.append(dict(r, peer_us=pat[key]["pat_us"]))
    if not rows or not chunks_of(rows[0]):
        print("compare_invariant: no common cases with invariant timings", file=sys.stderr)
        return 1
    chunks = chunks_of(rows[0])
    head = "| tree | heads | q | floor µs | default µs | " + " | ".join(
        "inv %d µs | ÷ default" % c for c in chunks) + " | PAT µs |"
    lines = [head, "|" + "---|" * (6 + 2 * len(chunks))]
    for r in rows:
        lines.append("| `%s` | %d/%d | %d | %.1f | %.1f | %s | %.1f |" % (
            r["tree"], r["q_heads"], r["kv_heads"], r["queries"], r["floor_us"], r["pat_us"],
            " | ".join("%.1f | %.2f" % (r["inv%d_us" % c], r["inv%d_us" % c] / r["pat_us"])
                       for c in chunks), r["peer_us"]))
    paper = [r for r in rows if r.get("set", "paper") == "paper" and not r["tree"].startswith("256_")]
    out = ["", "paper shared-prefix cases: %d; default plan: PAT / patd %.3f" % (
        len(paper), geo([r["peer_us"] / r["pat_us"] for r in paper]))]
    marks = []
    for c in chunks:
        slow = geo([r["inv%d_us" % c] / r["pat_us"] for r in paper])
        vs_pat = geo([r["peer_us"] / r["inv%d_us" % c] for r in paper])
        worst = max(paper, key=lambda r: r["inv%d_us" % c] / r["pat_us"]) if paper else None
        out.append("invariant chunk %d: %.3fx the default (geo), PAT / invariant %.3f, faster than "
                   "PAT on %d; worst %s %d/%d at %.2fx the default" % (
                       c, slow, vs_pat, sum(r["peer_us"] > r["inv%d_us" % c] for r in paper),
                       worst["tree"], worst["q_heads"], worst["kv_heads"],
                       worst["inv%d_us" % c] / worst["pat_us"]) if paper else "")
        if paper and all(cut_times(r, c) for r in paper):
            out.append("  chunk %d, every cut rule timed: the best rule per case %.3fx the default "
                       "(geo), the model's pick %.3fx" % (
                           c, geo([min(cut_times(r, c)) / r["pat_us"] for r in paper]), slow))
        marks.append(("chunk %d: invariant <= 1.15x the default (geo)" % c,
                      slow <= 1.15 if paper else None))
        marks.append(("chunk %d: invariant faster than PAT (geo)" % c,
                      vs_pat > 1.0 if paper else None))
    emit(lines, out, a.md, marks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
