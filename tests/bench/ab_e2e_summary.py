#!/usr/bin/env python3
"""tests/gpu/ab_e2e.sh's verdict: a daemon change end to end from two bench_e2e.py runs of the
same cases, the new build started first in one (--patd NEW --patd-b BASE) and the base started
first in the other (--patd BASE --patd-b NEW).

Of two daemons beside each other, the one started first ran 2.3-3.6 % slower whatever it was (the
same build under both names, H200: tests/bench/log/2026-11-28-start-hops.md), so each run's
patd / patd_b holds that factor f: the first run's is q1 = new/base * f, the second's
q2 = base/new * f. Hence new/base = sqrt(q1 / q2) and f = sqrt(q1 * q2).

usage: ab_e2e_summary.py NEW_FIRST.jsonl BASE_FIRST.jsonl
Prints per case: new / base, the first-started factor, each build's best graph step (ms) over both
runs, each one's mean start (us: STEP_BEGIN received to layer 0 enqueued) and FlashInfer's step.
"""
import json
import math
import sys


def cases(path):
    with open(path) as f:
        return {(r["batch"], r["shared_prompt"]): r
                for r in (json.loads(line) for line in f if line.strip())}


def verdict(r1, r2):
    """(new/base, first-started factor, new ms, base ms, new start us, base start us, fi ms) or
    None when either run skipped a daemon"""
    key = "patd_over_patd_b_graph"
    if key not in r1 or key not in r2:
        return None
    q1, q2 = r1[key], r2[key]
    start = lambda r, w: r[w + "_start"]["start_us"]
    fi = [r["fi_graph_step_ms"] for r in (r1, r2) if r.get("fi_graph_step_ms")]
    return (math.sqrt(q1 / q2), math.sqrt(q1 * q2),
            min(r1["patd_graph_step_ms"], r2["patd_b_graph_step_ms"]),
            min(r1["patd_b_graph_step_ms"], r2["patd_graph_step_ms"]),
            (start(r1, "patd") + start(r2, "patd_b")) / 2,
            (start(r1, "patd_b") + start(r2, "patd")) / 2, min(fi) if fi else None)


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("usage: ")[1].split("\n")[0], file=sys.stderr)
        return 2
    new_first, base_first = cases(argv[1]), cases(argv[2])
    ratios = []
    for key in sorted(set(base_first) - set(new_first)):
        print("%4d %s  no verdict: missing from the new-first run"
              % (key[0], "shared" if key[1] else "unshared"))
    for key in sorted(new_first):
        name = "%4d %s" % (key[0], "shared" if key[1] else "unshared")
        r1, r2 = new_first[key], base_first.get(key)
        v = verdict(r1, r2) if r2 else None
        if v is None:
            why = [r.get(w + "_skipped") for r in (r1, r2 or {}) for w in ("patd", "patd_b")]
            print("%s  no verdict: %s" % (name, "; ".join(str(w) for w in why if w) or
                                         "missing from the base-first run"))
            continue
        ratios.append(v[0])
        print("%s  new/base %.3f (first-started x%.3f)  new %.2f ms (start %.0f us)  "
              "base %.2f ms (start %.0f us)%s" % (
                  name, v[0], v[1], v[2], v[4], v[3], v[5],
                  "  FlashInfer %.2f ms" % v[6] if v[6] else ""))
    if ratios:
        print("geomean new/base %.3f over %d cases" %
              (math.exp(sum(map(math.log, ratios)) / len(ratios)), len(ratios)))
    return 0 if ratios else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
