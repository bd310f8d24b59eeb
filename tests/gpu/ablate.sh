#!/usr/bin/env bash
# Timing ablations of the Hopper forward (fwd_pair's WsAblate, kern_cuda_fwd_ws.cuh), run on the
# GPU machine from the repository root:
#   tests/gpu/ablate.sh [BUILD ...]   (default: 0 to 4)
# builds the tile solver once per BUILD, in parallel, and prints each one's rates. Build 0 is the
# shipped kernel; build i > 0 compiles with -DKCUDA_ABLATE=i, which makes the backend register
# fwd_pair<T, D, WsAblate(i)> (kern_cuda_fwd_ablate.cuh): 1 without its products, 2 without its
# KV loads (TMA or cp.async), 3 without its Q gather, 4 without its exponentials. What each part
# costs is the difference to the kernel; the ablated kernels' outputs are wrong by design, so only
# their times mean anything. Results go to $OUT/ablate.log when set.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
out=${OUT:-build/gpu-results}
mkdir -p "$out"
export CUDA_MODULE_LOADING=EAGER PATH=/usr/local/cuda/bin:$PATH
. tests/gpu/devdeps.sh
names=("kernel" "no products" "no KV loads" "no Q gather" "no exponentials")
builds=()
for i in "${@:-0 1 2 3 4}"; do
    for j in $i; do
        case "$j" in
        [0-4]) ;;
        *)
            echo "ablate.sh: no build '$j' (0 to 4)" >&2
            exit 2
            ;;
        esac
        # each once (two makes into one directory would race)
        [[ " ${builds[*]} " == *" $j "* ]] || builds+=("$j")
    done
done
declare -A pid
for i in "${builds[@]}"; do
    nvcc="nvcc"
    [ "$i" -gt 0 ] && nvcc="nvcc -DKCUDA_ABLATE=$i"
    # a binary left by an earlier call (another numbering) must not be timed as this build
    rm -f build/ablate"$i"/bin/patd-tile-solver
    make -j4 B=build/ablate"$i" CUDA=1 CUDA_ARCHS=90a NVCC="$nvcc" \
        build/ablate"$i"/bin/patd-tile-solver >"$out/ablate_build$i.log" 2>&1 &
    pid[$i]=$!
done
failed=0
for i in "${builds[@]}"; do
    wait "${pid[$i]}" || failed=1
done
for i in "${builds[@]}"; do
    echo "== ablation $i: ${names[$i]}"
    if ! [ -x build/ablate"$i"/bin/patd-tile-solver ]; then
        echo "build $i FAILED:"
        tail -5 "$out/ablate_build$i.log"
        continue
    fi
    build/ablate"$i"/bin/patd-tile-solver 2>&1 | grep -E 'tensor rate|tile chain|fixed cost'
done 2>&1 | tee "$out/ablate.log"
exit "$failed"
