#!/usr/bin/env bash
# A/B of a kernel change in one device call: the working tree against a base revision, both
# built and benchmarked on the same GPU one after the other, with PAT beside them.
#   tests/gpu/ab.sh --pack [REV]   here, before the call: writes .ab/base.tar, REV's version
#                                  (default HEAD) of every tracked file that differs from the
#                                  working tree (carry .ab with .devdeps and .peers)
#   tests/gpu/ab.sh [TREES [HEADS]] on the GPU machine: builds bench_attn and the tile solver
#                                  twice (the tree as it came, and with .ab/base.tar unpacked
#                                  over a copy of it), runs base, new, base, new, PAT once, and
#                                  prints PAT / patd for each run and new / base per case
# Results go to $OUT (the device tool) or build/gpu-results.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --pack ]; then
    rev=${2:-HEAD}
    mkdir -p .ab
    files=$(git diff --name-only "$rev" -- . | while read -r f; do
        git cat-file -e "$rev:$f" 2>/dev/null && echo "$f"; done)
    [ -n "$files" ] || { echo "ab.sh: nothing differs from $rev" >&2; exit 1; }
    # shellcheck disable=SC2086
    git archive -o .ab/base.tar "$rev" -- $files
    echo "ab.sh: .ab/base.tar holds $rev's" $files
    exit 0
fi
. tests/gpu/ab_base.sh
# PAT's extension builds beside patd's two trees unless a built one came along
pat_pid=
if [ -x .peers/tools/run.sh ] && ! ls .peers/PAT/prefix_attn/_prefix_attn*.so >/dev/null 2>&1; then
    mkdir -p "${OUT:-build/gpu-results}"
    (MAX_JOBS=8 .peers/tools/run.sh build >"${OUT:-build/gpu-results}/pat_build.log" 2>&1) &
    pat_pid=$!
fi
ab_build ab.sh build/gpu/bench/bench_attn build/gpu/bin/patd-tile-solver
args=$([ -n "${1:-}" ] && echo --trees "$1")
heads=$([ -n "${2:-}" ] && echo --heads "$2")
for i in 1 2; do
    # shellcheck disable=SC2086
    $base/build/gpu/bench/bench_attn $args $heads --json "$out/base$i.jsonl" >"$out/base$i.log" 2>&1
    # shellcheck disable=SC2086
    build/gpu/bench/bench_attn $args $heads --json "$out/new$i.jsonl" >"$out/new$i.log" 2>&1
done
for d in base new; do
    echo "== tile solver, $d"
    if [ $d = base ]; then $base/build/gpu/bin/patd-tile-solver; else build/gpu/bin/patd-tile-solver; fi 2>&1 |
        grep -E 'tensor rate|fixed cost|tile chain|merge launch|read bandwidth|^\{"'
done | tee "$out/ab_solver.log"
[ -z "$pat_pid" ] || wait "$pat_pid" 2>/dev/null || true # ab_build may have waited for it
if [ -x .peers/tools/run.sh ]; then
    tests/gpu/pat_bench.sh "$out/new1.jsonl" "$out/pat.jsonl" >"$out/pat_bench.log" 2>&1
    for r in base1 new1 base2 new2; do
        echo "== $r: $(python3 tests/bench/compare_pat.py "$out/$r.jsonl" "$out/pat.jsonl" \
            --md "$out/compare_$r.md" | grep 'geometric mean')"
    done | tee "$out/ab.log"
fi
python3 - "$out" <<'EOF' | tee -a "$out/ab.log"
import json, math, sys
d = sys.argv[1]
def load(n):
    return {(r["tree"], r["q_heads"], r["kv_heads"]): r["pat_us"] for r in map(json.loads, open("%s/%s.jsonl" % (d, n)))}
b1, b2, n1, n2 = (load(n) for n in ("base1", "base2", "new1", "new2"))
ratios = {k: min(n1[k], n2[k]) / min(b1[k], b2[k]) for k in n1 if k in b1 and k in b2}
noise = [b2[k] / b1[k] for k in b1 if k in b2]
g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
print("new / base, best of two each: geomean %.3f over %d cases (base run 2 / run 1: %.3f)" % (g(list(ratios.values())), len(ratios), g(noise)))
by = {}
for (t, hq, hk), r in ratios.items():
    by.setdefault("%d/%d" % (hq, hk), []).append(r)
print("by heads: " + ", ".join("%s %.3f" % (h, g(v)) for h, v in by.items()))
for k, r in sorted(ratios.items(), key=lambda kv: kv[1])[:5] + sorted(ratios.items(), key=lambda kv: kv[1])[-5:]:
    print("  %-45s %d/%d  %.3f" % (k[0], k[1], k[2], r))
EOF
(cd "$out" && tar -cJf ab_logs.tar.xz --remove-files ./*.log ./*.md ./*.jsonl 2>/dev/null)
echo "ab.sh: done"
