#!/usr/bin/env python3
"""patd's decode over an fp8 KV pool beside FlashInfer's over the same kind of pool, from the same
device call: bench_attn --kv's JSON lines (patd over fp16 and fp8, the floors) joined per (tree,
heads) with tests/bench/bench_flashinfer_trees.py's (FlashInfer decode and cascade, fp16 and fp8).

Prints one row per case and issue 40's fp8 targets with a pass or a miss: unshared decode <= 1.05x
the fp8 bytes floor; on the shared trees patd fp8 >= 1.6x faster than patd fp16 (geomean); patd
fp8 faster than FlashInfer's fp8 decode and its fp8 cascade on every shared tree (a way
FlashInfer refused does not count against patd and is named; a cascade that ran on FlashInfer's
FA2 prefill because its default backend refused is marked "(fa2)").

usage: compare_fp8.py PATD.jsonl FLASHINFER.jsonl [--md OUT.md]
"""
import argparse
import sys

from compare_pat import emit, geo, load  # this directory's: the same rows, mean and report


def shared(tree):
    """a tree whose queries share a prefix: more than one level and fewer roots than queries"""
    levels = tree.split("_")[0].split(",")
    return len(levels) > 1 and int(levels[0]) < int(levels[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("patd")
    ap.add_argument("flashinfer")
    ap.add_argument("--md", help="also write the table as Markdown here")
    a = ap.parse_args()
    fi = {(r["tree"], r["q_heads"], r["kv_heads"]): r for r in load(a.flashinfer)}
    rows = [dict(r, fi=fi[k]) for r in load(a.patd)
            for k in [(r["tree"], r["q_heads"], r["kv_heads"])] if k in fi]
    if not rows:
        print("compare_fp8: no common cases", file=sys.stderr)
        return 1

    def us(r, key):
        return r["fi"].get(key + "_us")

    def cell(x, r=None, key=None):
        fa2 = " (fa2)" if r is not None and r["fi"].get(key + "_backend") == "fa2" else ""
        return "%.1f%s" % (x, fa2) if x is not None else "refused"

    lines = ["| tree | heads | q | floor8 µs | patd f16 µs | patd fp8 µs | FI decode f16 | "
             "FI decode fp8 | FI cascade f16 | FI cascade fp8 |", "|" + "---|" * 10]
    for r in rows:
        lines.append("| `%s` | %d/%d | %d | %.1f | %.1f | %.1f | %s | %s | %s | %s |" % (
            r["tree"], r["q_heads"], r["kv_heads"], r["queries"], r["floor8_us"], r["f16_us"],
            r["fp8_us"], cell(us(r, "decode_f16")), cell(us(r, "decode_fp8")),
            cell(us(r, "cascade_f16")), cell(us(r, "cascade_fp8"), r, "cascade_fp8")))
    sh = [r for r in rows if shared(r["tree"])]
    un = [r for r in rows if not shared(r["tree"])]
    out = ["", "cases: %d shared, %d unshared" % (len(sh), len(un))]
    marks = []
    if un:
        worst = max(r["fp8_us"] / r["floor8_us"] for r in un)
        out.append("unshared: patd fp8 at most %.2fx its fp8 bytes floor" % worst)
        marks.append(("unshared decode <= 1.05x the fp8 floor", worst <= 1.05))
        ran = [r for r in un if us(r, "decode_fp8") is not None]
        if ran:
            out.append("unshared: FlashInfer decode fp8 / patd fp8 %.3f (geo), patd faster on %d "
                       "of %d" % (geo([us(r, "decode_fp8") / r["fp8_us"] for r in ran]),
                                  sum(r["fp8_us"] < us(r, "decode_fp8") for r in ran), len(ran)))
    if sh:
        speed = geo([r["f16_us"] / r["fp8_us"] for r in sh])
        out.append("shared: patd fp16 / fp8 %.3f (geo)" % speed)
        marks.append(("shared: fp8 >= 1.6x patd fp16 (geo)", speed >= 1.6))
        for way in ("decode_fp8", "cascade_fp8"):
            ran = [r for r in sh if us(r, way) is not None]
            refused = len(sh) - len(ran)
            wins = sum(r["fp8_us"] < us(r, way) for r in ran)
            out.append("shared: patd fp8 faster than FlashInfer %s on %d of %d%s" % (
                way.replace("_", " "), wins, len(ran),
                " (%d refused by FlashInfer)" % refused if refused else ""))
            if ran:
                out[-1] += ", FlashInfer / patd %.3f (geo)" % geo(
                    [us(r, way) / r["fp8_us"] for r in ran])
            marks.append(("shared: faster than FlashInfer %s on every tree" % way.replace("_", " "),
                          wins == len(ran) if ran else None))
    emit(lines, out, a.md, marks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
