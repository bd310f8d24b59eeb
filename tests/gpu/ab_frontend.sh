#!/usr/bin/env bash
# A/B of a daemon change in one device call, as frontends see it: the working tree's patd against
# a base revision's, both built here and run one after the other under MPS by
# tests/bench/bench_frontend.py (base, new, base, new), with the in-process model beside each.
#   tests/gpu/ab.sh --pack [REV]   here, before the call (writes .ab/base.tar; carry .ab)
#   tests/gpu/ab_frontend.sh [ARGS...]  on the GPU machine; ARGS go to bench_frontend.py
# Results go to $OUT (the device tool) or build/gpu-results.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/ab_base.sh
ab_build ab_frontend.sh build/gpu/bin/patd build/gpu/lib/libpat.so.1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/patd-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/patd-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && sleep 1
for i in 1 2; do
    for v in base new; do
        d=$([ $v = base ] && echo $base || echo .)
        echo "== $v $i" | tee -a "$out/ab_frontend.log"
        (cd $d && PATD_LIBPAT=$PWD/build/gpu/lib/libpat.so.1 python3 tests/bench/bench_frontend.py --patd build/gpu/bin/patd \
            --json "$out/frontend_$v$i.jsonl" "$@") 2>&1 | grep -E '^batch' | tee -a "$out/ab_frontend.log"
    done
done
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
echo "ab_frontend.sh: done"
