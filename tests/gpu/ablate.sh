#!/usr/bin/env bash
# Timing ablations of the Hopper forward (fwd_pair's WsAblate, kern_cuda_fwd_ws.cuh), run on the
# GPU machine from the repository root: builds the tile solver five times (the shipped kernel, then
# without its products, without its KV loads (TMA or cp.async), without its Q gather, and the
# variant on trial: the next item's id fetched during short items), in parallel, and prints each
# one's rates. Build i > 0 compiles with -DKCUDA_ABLATE=i, which makes
# the backend register fwd_pair<T, D, WsAblate(i)> (kern_cuda_fwd_ablate.cuh); build 0 is the
# shipped one. What each part costs is the difference to the kernel; the ablated kernels' outputs
# are wrong by design, so only their times mean anything. Results go to $OUT/ablate.log when set.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-results}
mkdir -p "$out"
export CUDA_MODULE_LOADING=EAGER PATH=/usr/local/cuda/bin:$PATH
. tests/gpu/devdeps.sh
names=("kernel" "no products" "no KV loads" "no Q gather" "early fetch (variant)")
for i in 0 1 2 3 4; do
    nvcc="nvcc"
    [ "$i" -gt 0 ] && nvcc="nvcc -DKCUDA_ABLATE=$i"
    make -j4 B=build/ablate$i CUDA=1 CUDA_ARCHS=90a NVCC="$nvcc" \
        build/ablate$i/bin/patd-tile-solver >"$out/ablate_build$i.log" 2>&1 &
done
wait
for i in 0 1 2 3 4; do
    echo "== ablation $i: ${names[$i]}"
    if ! [ -x build/ablate$i/bin/patd-tile-solver ]; then
        tail -5 "$out/ablate_build$i.log"
        continue
    fi
    build/ablate$i/bin/patd-tile-solver 2>&1 | grep -E 'tensor rate|tile chain|fixed cost'
done 2>&1 | tee "$out/ablate.log"
