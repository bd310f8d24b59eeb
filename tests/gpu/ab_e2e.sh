#!/usr/bin/env bash
# A/B of a daemon change end to end, in one device call: the working tree's patd against a base
# revision's, both built here, driven by one tests/bench/bench_e2e.py process under MPS (the
# same Llama-3-8B-shaped model, graph-replayed steps; the two daemons alternate --rounds times
# per case) with in-process FlashInfer beside them.
#   tests/gpu/ab.sh --pack [REV]      here, before the call (writes .ab/base.tar; carry .ab and
#                                     .whl with .devdeps)
#   tests/gpu/ab_e2e.sh [ARGS...]     on the GPU machine; ARGS go to bench_e2e.py (default:
#                                     --batches 1,16,64 --rounds 2 --timeline '')
# Prints per case patd (new) / patd_b (base) and each against FlashInfer. Results go to $OUT (the
# device tool) or build/gpu-results.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/ab_base.sh
ab_build ab_e2e.sh build/gpu/bin/patd build/gpu/lib/libpat.so.1
if ! python3 -c 'import flashinfer' 2>/dev/null && ls .whl/flashinfer_python-*.whl >/dev/null 2>&1; then
    python3 -m pip install --quiet --no-deps --no-index .whl/*.whl >"$out/ab_e2e_pip.log" 2>&1
fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/patd-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/patd-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && sleep 1
[ $# -gt 0 ] || set -- --batches 1,16,64 --rounds 2 --timeline ''
PATD_LIBPAT=$PWD/build/gpu/lib/libpat.so.1 python3 tests/bench/bench_e2e.py \
    --patd build/gpu/bin/patd --patd-b $base/build/gpu/bin/patd --ways patd,flashinfer \
    --json "$out/ab_e2e.jsonl" "$@" >"$out/ab_e2e_bench.log" 2>&1
rc=$?
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
[ $rc -eq 0 ] || { tail -n 30 "$out/ab_e2e_bench.log"; exit $rc; }
python3 - "$out/ab_e2e.jsonl" <<'PY' | tee "$out/ab_e2e.log"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    name = "%4d %s" % (r["batch"], "shared" if r["shared_prompt"] else "unshared")
    if "patd_over_patd_b_graph" not in r:
        print(name, "skipped:", r.get("patd_skipped") or r.get("patd_b_skipped"))
        continue
    fi = r.get("fi_graph_step_ms")
    start = lambda w: r[w + "_start"]["start_us"]
    print("%s  new/base %.3f  new %s ms (start %.0f us)  base %s ms (start %.0f us)%s" % (
        name, r["patd_over_patd_b_graph"], r["patd_graph_rounds_ms"], start("patd"),
        r["patd_b_graph_rounds_ms"], start("patd_b"),
        "  FlashInfer %.2f ms: new %.3f, base %.3f" % (fi, r["patd_graph_step_ms"] / fi,
                                                      r["patd_b_graph_step_ms"] / fi)
        if fi else ""))
PY
echo "ab_e2e.sh: done"
