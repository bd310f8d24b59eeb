#!/usr/bin/env bash
# A/B of a daemon change end to end, in one device call: the working tree's patd against a base
# revision's, both built here, driven by tests/bench/bench_e2e.py under MPS (the same
# Llama-3-8B-shaped model, graph-replayed steps; the two daemons alternate --rounds times per
# case) with in-process FlashInfer beside them, twice: each build started first in one run.
#   tests/gpu/ab.sh --pack [REV]      here, before the call (writes .ab/base.tar; carry .ab and
#                                     .whl with .devdeps)
#   tests/gpu/ab_e2e.sh [ARGS...]     on the GPU machine; ARGS go to bench_e2e.py (default:
#                                     --batches 1,16,64 --rounds 2 --timeline '')
# Prints per case new / base (two runs: each daemon is started first in one), the first-started
# daemon's bias, both step times and FlashInfer's. Results go to $OUT (the device tool) or
# build/gpu-results.
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
# Two runs, each daemon started first in one of them: the first-started of two daemons runs
# slower whatever it is (tests/bench/ab_e2e_summary.py says how much and how it is cancelled).
NEW=build/gpu/bin/patd BASE=$base/build/gpu/bin/patd
rc=0
for order in new_first base_first; do
    if [ $order = new_first ]; then a=$NEW b=$BASE; else a=$BASE b=$NEW; fi
    PATD_LIBPAT=$PWD/build/gpu/lib/libpat.so.1 python3 tests/bench/bench_e2e.py \
        --patd $a --patd-b $b --ways patd,flashinfer \
        --json "$out/ab_e2e_$order.jsonl" "$@" >"$out/ab_e2e_bench_$order.log" 2>&1 ||
        { rc=$?; tail -n 30 "$out/ab_e2e_bench_$order.log"; break; }
done
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
[ $rc -eq 0 ] || exit $rc
python3 tests/bench/ab_e2e_summary.py "$out/ab_e2e_new_first.jsonl" "$out/ab_e2e_base_first.jsonl" |
    tee "$out/ab_e2e.log"
echo "ab_e2e.sh: done"
