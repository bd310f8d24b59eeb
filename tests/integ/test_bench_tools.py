#!/usr/bin/env python3
"""The benchmark's own tools, walked without a GPU: what tests/gpu/run.sh and ab.sh run after
bench_attn on the device.

- tests/bench/compare_pat.py on bench_attn and PAT rows written here: the per-set summaries
  (paper, own), issue 39's targets each met or missed as the numbers say, and the time model's
  pick against the best forced policy (judged only on auto's own timing, never on an
  ablation's --field). Each target is also driven to a miss by changing one number, so that a
  verdict that never moves fails.
- bench_attn's tree sets (tests/bench/bench_attn.cu): the paper's 20 and our ten are trees PAT's
  bench can run (counts divide, every level a multiple of its 32-token page), none repeated.
- tests/bench/ab_e2e_summary.py (tests/gpu/ab_e2e.sh's verdict) on two bench_e2e runs written
  here with a known change and a known first-started factor: it recovers both, inverts when the
  runs are given the other way round, and names a case a daemon skipped.
- bench_attn refuses a malformed tree before it touches the GPU (exit status 2, the spec named),
  where BENCH_ATTN names the built program (make test sets it when the CUDA tools were built).

Prints "N passed, N failed".
"""

import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(ROOT, "tests", "bench", "compare_pat.py")
BENCH_SRC = os.path.join(ROOT, "tests", "bench", "bench_attn.cu")
AB_E2E = os.path.join(ROOT, "tests", "bench", "ab_e2e_summary.py")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print("%-66s %s%s" % (name, "ok" if ok else "FAILED", "" if ok else "  " + detail))
    passed, failed = passed + bool(ok), failed + (not ok)


def row(tree, hq, hkv, pat_us, peer_us, floor_us, queries, set_name, merge=0.02, forced=None):
    """one bench_attn row and its PAT row: patd pat_us, PAT peer_us"""
    f = forced or {}
    r = {"tree": tree, "q_heads": hq, "kv_heads": hkv, "queries": queries, "kv_len": 1024,
         "pat_us": pat_us, "floor_us": floor_us, "tbs": 2.0, "tflops": 100.0, "reread": 1.1,
         "merge_frac": merge, "distinct_bytes": floor_us * 3e12 / 1e6, "read_bw": 3e12,
         "qc_us": f.get("qc", pat_us * 2), "tree_us": f.get("tree", pat_us * 1.5),
         "bytes_us": f.get("bytes", pat_us), "paper_us": f.get("paper", pat_us * 1.2),
         "policy": "bytes", "set": set_name}
    return r, {"tree": tree, "hq": hq, "hkv": hkv, "pat_us": peer_us}


def world():
    """rows on which every issue 39 target is met"""
    rows = []
    for i in range(8):  # paper, shared: 1.8x PAT, 1.2x the floor, >= 64 queries
        rows.append(row("1,%d_1024,32" % (64 * (i + 1)), 32, 8, 12.0, 21.6, 10.0, 64 * (i + 1),
                        "paper"))
    # unshared: 1.02x the bytes floor (distinct bytes / read bandwidth = floor_us here)
    rows.append(row("256_1024", 32, 8, 10.2, 11.0, 10.0, 256, "paper"))
    for i in range(3):  # own: faster than PAT
        rows.append(row("2,%d_2048,64" % (8 * (i + 1)), 32, 8, 30.0, 33.0, 25.0, 8, "own"))
    return rows


def run_compare(rows, *args, script=COMPARE):
    """script (compare_pat.py unless named) on bench_attn rows and their PAT rows"""
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "patd.jsonl"), os.path.join(d, "pat.jsonl")
        with open(a, "w") as fa, open(b, "w") as fb:
            for r, p in rows:
                fa.write(json.dumps(r) + "\n")
                fb.write(json.dumps(p) + "\n")
        res = subprocess.run([sys.executable, script, a, b, *args], capture_output=True,
                             text=True, timeout=60)
        return res.returncode, res.stdout + res.stderr


def verdicts(text):
    m = re.search(r"^targets \(step 3\): (.*)$", text, re.M)
    if not m:
        return {}
    return dict(part.rsplit(": ", 1) for part in m.group(1).split("; "))


def test_compare():
    rc, text = run_compare(world())
    check("compare_pat: exits 0", rc == 0, text[-400:])
    check("compare_pat: paper set summarised",
          re.search(r"^paper shared-prefix cases: 8; patd faster than PAT on 8; geometric mean "
                    r"PAT / patd 1\.800", text, re.M) is not None, text[-600:])
    check("compare_pat: own set summarised apart",
          re.search(r"^own shared-prefix cases: 3; patd faster than PAT on 3; geometric mean "
                    r"PAT / patd 1\.100", text, re.M) is not None, text[-600:])
    v = verdicts(text)
    check("compare_pat: eight targets, all met", len(v) == 8 and set(v.values()) == {"met"},
          str(v))
    rc, text = run_compare([x for x in world() if x[0]["set"] != "own"])
    check("compare_pat: no own trees -> their target not run",
          verdicts(text).get("own trees: none slower than PAT") == "not run", str(verdicts(text)))
    rc, text = run_compare([x for x in world() if not x[0]["tree"].startswith("256_")])
    check("compare_pat: no unshared trees -> their target not run",
          verdicts(text).get("unshared <= 1.05x bytes floor") == "not run", str(verdicts(text)))
    rc, text = run_compare(world())
    check("compare_pat: the model's pick line", "pick within 3 % of the best of "
          "bytes/paper/query/tree on 12 of 12 cases" in text, text[-600:])

    slow = world()  # an ablation's column 2x slower than auto: its table, never a pick verdict
    for r, _ in slow:
        r["mma_us"] = 2 * r["pat_us"]
    rc, text = run_compare(slow, "--field", "mma_us")
    v = verdicts(text)
    check("compare_pat --field: no pick or merge verdict on an ablation's timing",
          rc == 0 and "patd timing: mma_us" in text and "pick within" not in text and
          "time model's pick within 3 % of the best forced policy" not in v and
          "merge <= 10 % of every call" not in v and
          v.get("every paper case >= 1.0x PAT") == "MISSED", text[-600:])

    # one number changed each time: its target, and only it, is missed
    def missed(name, mutate):
        rows = world()
        mutate(rows)
        rc, text = run_compare(rows)
        v = verdicts(text)
        bad = sorted(k for k, x in v.items() if x != "met")
        check("compare_pat: %s -> missed" % name, rc == 0 and bad == [name], str(bad))

    def slow_paper(rows):  # one paper case slower than PAT
        rows[0][0].update(pat_us=21.7, bytes_us=21.7, paper_us=26.0, qc_us=43.4, tree_us=32.6)

    missed("every paper case >= 1.0x PAT", slow_paper)

    def slow_own(rows):
        rows[-1][0].update(pat_us=34.0, bytes_us=34.0, paper_us=40.8, qc_us=68.0, tree_us=51.0)

    missed("own trees: none slower than PAT", slow_own)

    def merges(rows):
        rows[2][0]["merge_frac"] = 0.11

    missed("merge <= 10 % of every call", merges)

    def unshared(rows):
        rows[8][0].update(pat_us=10.6, bytes_us=10.6, paper_us=12.7, qc_us=21.2, tree_us=15.9)

    missed("unshared <= 1.05x bytes floor", unshared)

    def pick(rows):  # forced tree 4 % faster than the pick
        rows[1][0]["tree_us"] = 12.0 / 1.04

    missed("time model's pick within 3 % of the best forced policy", pick)

    def far(rows):  # most of the >= 64-query trees 1.35x the floor (geo stays under 1.4)
        for r, _ in rows[:5]:
            r["floor_us"] = 12.0 / 1.35

    missed("trees of >= 64 queries <= 1.3x the floor on half", far)


def bench_trees():
    src = open(BENCH_SRC).read()
    out = {}
    for name in ("kTrees", "kOwnTrees"):
        m = re.search(r"static const char \*const %s\[\] = \{(.*?)\n\};" % name, src, re.S)
        out[name] = re.findall(r'"([0-9,_]+)"', m.group(1)) if m else []
    return out


def pat_can_run(spec):
    b, l = spec.split("_")
    counts, lens = [int(x) for x in b.split(",")], [int(x) for x in l.split(",")]
    return (len(counts) == len(lens) and all(counts) and
            all(counts[i + 1] % counts[i] == 0 for i in range(len(counts) - 1)) and
            all(x > 0 and x % 32 == 0 for x in lens))


def test_trees():
    t = bench_trees()
    check("bench_attn: the paper's 20 trees", len(t["kTrees"]) == 20, str(len(t["kTrees"])))
    check("bench_attn: ten trees of our own", len(t["kOwnTrees"]) == 10, str(len(t["kOwnTrees"])))
    every = t["kTrees"] + t["kOwnTrees"]
    check("bench_attn: no tree twice", len(set(every)) == len(every))
    bad = [s for s in every if not pat_can_run(s)]
    check("bench_attn: every tree one PAT's bench runs", not bad, str(bad))
    # the shapes the issue names: a long prompt with >= 128 leaves, a forest, a deep tree
    own = [(s.split("_")[0].split(","), s.split("_")[1].split(",")) for s in t["kOwnTrees"]]
    check("bench_attn: own trees hold a forest, a 6+ level tree, a 4K+ prompt over 128+ leaves",
          any(int(c[0]) > 1 for c, _ in own) and any(len(c) >= 6 for c, _ in own) and
          any(int(l[0]) >= 4096 and int(c[-1]) >= 128 for c, l in own))


def test_bench_refuses():
    exe = os.environ.get("BENCH_ATTN")
    if not exe:
        print("bench_attn: BENCH_ATTN not set (built without the CUDA tools): its check skipped")
        return
    for spec, why in (("1,4_64", "2 counts, 1 length"), ("2,3_64,32", "2 does not divide 3"),
                      ("1,4_64,0", "a level of 0 tokens"), ("1,x_64,32", "not a number")):
        res = subprocess.run([exe, "--trees", "own;" + spec], capture_output=True, text=True,
                             timeout=60)
        check("bench_attn: refuses %s (%s)" % (spec, why),
              res.returncode == 2 and ("bad tree '%s'" % spec) in res.stderr,
              "rc %d: %s" % (res.returncode, res.stderr[-200:]))


def e2e_case(batch, shared, first, second, fi_ms=10.0, skipped=None):
    """one bench_e2e case: way patd (started first) and patd_b, each (graph step ms, start us),
    and FlashInfer's step"""
    r = {"batch": batch, "shared_prompt": shared, "fi_graph_step_ms": fi_ms}
    if skipped:
        r["patd_b_skipped"] = skipped
    else:
        r.update(patd_graph_step_ms=first[0], patd_b_graph_step_ms=second[0],
                 patd_over_patd_b_graph=first[0] / second[0],
                 patd_start={"start_us": first[1]}, patd_b_start={"start_us": second[1]})
    return r


def run_ab_e2e(new_first, base_first):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, rows in (("new_first", new_first), ("base_first", base_first)):
            paths.append(os.path.join(d, name + ".jsonl"))
            with open(paths[-1], "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        res = subprocess.run([sys.executable, AB_E2E, *paths], capture_output=True, text=True,
                             timeout=60)
        return res.returncode, res.stdout + res.stderr


def test_ab_e2e():
    # batch 1: new is 0.98x base, the first-started daemon 1.03x slower; starts: new's 140 and
    # 160 us in the two runs, base's 240 and 260. Batch 64: new 0.95x, first-started 1.05x, both
    # starting in 300 us on average. The geomean of the two: sqrt(0.98 * 0.95) = 0.965.
    one = [e2e_case(1, 0, (9.8 * 1.03, 140), (10.0, 260)),
           e2e_case(64, 2048, (19.0 * 1.05, 310), (20.0, 290)),
           e2e_case(16, 0, 0, 0, skipped="session block quota")]
    other = [e2e_case(1, 0, (10.0 * 1.03, 240), (9.8, 160)),
             e2e_case(64, 2048, (20.0 * 1.05, 310), (19.0, 290)),
             e2e_case(16, 0, 0, 0, skipped="session block quota")]
    rc, out = run_ab_e2e(one, other)
    lines = {l.strip().split("  ")[0]: l for l in out.splitlines() if "  " in l.strip()}
    for case, want in (("1 unshared", ("0.980", "1.030", "9.80", "150", "10.00", "250")),
                       ("64 shared", ("0.950", "1.050", "19.00", "300", "20.00", "300"))):
        l = lines.get(case, "")
        check("ab_e2e_summary: %s: new/base %s, first-started x%s" % (case, *want[:2]),
              "new/base %s (first-started x%s)" % want[:2] in l, out)
        check("ab_e2e_summary: %s: best steps %s / %s ms, starts %s / %s us"
              % (case, want[2], want[4], want[3], want[5]),
              "new %s ms (start %s us)" % want[2:4] in l and
              "base %s ms (start %s us)" % want[4:6] in l, l)
    check("ab_e2e_summary: a skipped case has no verdict and says why",
          "no verdict: session block quota" in lines.get("16 unshared", ""), out)
    check("ab_e2e_summary: geomean and exit 0", rc == 0 and "geomean new/base 0.965 over 2" in out,
          out)
    rc, out = run_ab_e2e(other, one)  # the runs the other way round: the inverse change
    check("ab_e2e_summary: runs swapped, the change inverts (1/0.98 = 1.020)",
          "new/base 1.020 (first-started x1.030)" in out, out)
    rc, out = run_ab_e2e(one[:1], other)
    check("ab_e2e_summary: a case only in the base-first run is named",
          "64 shared  no verdict: missing from the new-first run" in out, out)
    rc, out = run_ab_e2e(one[2:], other[2:])
    check("ab_e2e_summary: no case with a verdict: exit 1", rc == 1, "rc %d: %s" % (rc, out))


INV = os.path.join(ROOT, "tests", "bench", "compare_invariant.py")


def run_inv(rows):
    """compare_invariant.py on bench_attn --invariant rows (r) and PAT rows (p)"""
    return run_compare(rows, script=INV)


def inv_row(tree, default_us, inv256, inv1024, peer_us, set_name="paper"):
    r = {"tree": tree, "q_heads": 32, "kv_heads": 8, "queries": 10, "pat_us": default_us,
         "floor_us": 5.0, "distinct_bytes": 1.5e7, "read_bw": 3e12, "set": set_name,
         "inv256_us": inv256, "inv256_reread": 1.0, "inv256_rel_err": 1e-3,
         "inv1024_us": inv1024, "inv1024_reread": 1.0, "inv1024_rel_err": 1e-3}
    return r, {"tree": tree, "hq": 32, "hkv": 8, "pat_us": peer_us}


def test_compare_invariant():
    rows = [inv_row("1,8_1024,32", 10.0, 11.0, 13.0, 12.0),   # 1.1x, 1.3x; PAT 12
            inv_row("1,4_2048,64", 20.0, 22.0, 26.0, 30.0),   # 1.1x, 1.3x; PAT 30
            inv_row("256_1024", 10.0, 40.0, 40.0, 11.0),      # unshared: not in the geomean
            inv_row("2,8_512,32", 5.0, 50.0, 50.0, 6.0, "own")]  # own set: not in it either
    rc, text = run_inv(rows)
    check("compare_invariant: exits 0", rc == 0, text[-400:])
    check("compare_invariant: paper shared cases only",
          "paper shared-prefix cases: 2;" in text, text[-600:])
    check("compare_invariant: chunk 256 at 1.100x the default, met",
          "invariant chunk 256: 1.100x the default" in text and
          "target: chunk 256: invariant <= 1.15x the default (geo): met" in text, text[-800:])
    check("compare_invariant: chunk 1024 at 1.300x, missed",
          "target: chunk 1024: invariant <= 1.15x the default (geo): missed" in text, text[-800:])
    check("compare_invariant: PAT / invariant (chunk 256) geomean over both",
          "PAT / invariant %.3f" % math.sqrt(12.0 / 11.0 * 30.0 / 22.0) in text, text[-800:])
    # every cut rule timed (bench_attn --invariant-cuts): the best per case beside the pick
    cut = [(dict(r, inv1024_cut=2, inv1024_cut1_us=r["inv1024_us"] * 0.9,
                 inv1024_cut2_us=r["inv1024_us"]), p) for r, p in rows]
    rc, text = run_inv(cut)
    check("compare_invariant: cut fields are not chunks", rc == 0 and
          "inv 1 µs" not in text and "invariant chunk 256:" in text, text[-800:])
    check("compare_invariant: best cut rule per case beside the model's pick",
          "chunk 1024, every cut rule timed: the best rule per case 1.170x the default (geo), "
          "the model's pick 1.300x" in text, text[-800:])
    rc, text = run_inv([(dict(r, **{}), {"tree": "other", "hq": 1, "hkv": 1, "pat_us": 1.0})
                        for r, _ in rows])
    check("compare_invariant: no common case: exit 1", rc == 1, text[-300:])


FP8 = os.path.join(ROOT, "tests", "bench", "compare_fp8.py")
FI_TREES = os.path.join(ROOT, "tests", "bench", "bench_flashinfer_trees.py")


def fp8_row(tree, f16, fp8, floor8, fi):
    """a bench_attn --kv row and its bench_flashinfer_trees row (fi: way -> us, None: refused)"""
    r = {"tree": tree, "q_heads": 32, "kv_heads": 8, "queries": 10, "kv": "fp8_e4m3",
         "f16_us": f16, "fp8_us": fp8, "fp8_qc_us": fp8, "fp8_layer_us": fp8,
         "floor16_us": 2 * floor8, "floor8_us": floor8, "set": "paper"}
    p = {"tree": tree, "q_heads": 32, "kv_heads": 8, "queries": 10, "kv": "fp8_e4m3"}
    for way, v in fi.items():
        if v is None:
            p[way + "_error"] = "not supported"
        else:
            p[way + "_us"] = v
    return r, p


def test_compare_fp8():
    full = {"decode_f16": 30.0, "decode_fp8": 20.0, "cascade_f16": 25.0, "cascade_fp8": 18.0}
    rows = [fp8_row("1,8_1024,32", 40.0, 20.0, 10.0, full),             # 2x over fp16
            fp8_row("1,4_2048,64", 40.0, 25.0, 10.0, dict(full, cascade_fp8=None)),
            fp8_row("256_1024", 100.0, 52.0, 50.0, full)]               # unshared: 1.04x floor
    rc, text = run_compare(rows, script=FP8)
    check("compare_fp8: exits 0", rc == 0, text[-400:])
    check("compare_fp8: shared and unshared cases told apart",
          "cases: 2 shared, 1 unshared" in text, text[-600:])
    check("compare_fp8: unshared at 1.04x the floor, met",
          "at most 1.04x its fp8 bytes floor" in text and
          "target: unshared decode <= 1.05x the fp8 floor: met" in text, text[-800:])
    check("compare_fp8: fp16 / fp8 geomean",
          "patd fp16 / fp8 %.3f" % math.sqrt(2.0 * 1.6) in text, text[-800:])
    check("compare_fp8: one tree slower than FlashInfer decode fp8: missed",
          "faster than FlashInfer decode fp8 on 0 of 2" in text and
          "target: shared: faster than FlashInfer decode fp8 on every tree: missed" in text,
          text[-800:])
    check("compare_fp8: a way FlashInfer refused is named, not counted",
          "faster than FlashInfer cascade fp8 on 0 of 1 (1 refused by FlashInfer)" in text,
          text[-800:])
    check("compare_fp8: refused shows in the table", "| refused |" in text, text[-800:])
    rc, text = run_compare([(r, dict(p, tree="x")) for r, p in rows], script=FP8)
    check("compare_fp8: no common case: exit 1", rc == 1, text[-300:])
    for bad, why in (("1,10_4096,41x", "not B_L"), ("1,10_4090,416", "not whole pages"),
                     ("2,3_32,32", "not a multiple")):
        res = subprocess.run([sys.executable, FI_TREES, "--trees", bad], capture_output=True,
                             text=True, timeout=60)
        check("bench_flashinfer_trees: refuses tree %s" % bad,
              res.returncode == 2 and why in res.stderr, res.stderr[-300:])
    res = subprocess.run([sys.executable, FI_TREES, "--heads", "32/7"], capture_output=True,
                         text=True, timeout=60)
    check("bench_flashinfer_trees: refuses heads 32/7", res.returncode == 2 and
          "q a multiple of kv" in res.stderr, res.stderr[-300:])


def main():
    test_compare()
    test_compare_invariant()
    test_compare_fp8()
    test_ab_e2e()
    test_trees()
    test_bench_refuses()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
