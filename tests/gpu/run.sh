#!/usr/bin/env bash
# GPU test and benchmark driver, run on the GPU machine from the repository root:
#   tests/gpu/run.sh [--no-bench | --quick-bench]
# builds the CUDA parts, runs every GPU test, compute-sanitizer memcheck and racecheck on a
# reduced set, the tile solver, and the attention benchmark (bench_attn + PyTorch SDPA;
# --quick-bench: a few trees, --no-bench: none).
# Results (logs, JSON, tables) go to $OUT when it is set (the device tool), else
# build/gpu-results. Ends with "N passed, N failed" over the GPU programs and sanitizer runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-results}
mkdir -p "$out"
export CUDA_MODULE_LOADING=EAGER # lazy loading can hang a first launch behind a GPU-side wait
export PATH=/usr/local/cuda/bin:$PATH
bench=1 # --no-bench: tests only; --quick-bench: 4 trees x 1 head config
case "${1:-}" in
--no-bench) bench=0 ;;
--quick-bench) bench=2 ;;
esac

# C dependencies the GPU host lacks, brought as .deb files (../shared/gpu/README.md)
if [ -d .devdeps ] && ! [ -e /usr/include/xxhash.h ]; then
    P=/opt/patd-deps
    mkdir -p $P
    for f in .devdeps/*.deb; do dpkg -x "$f" $P; done
    export CPATH=$P/usr/include LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu \
        LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu
fi

{
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    nvcc --version | tail -1
    echo "== build"
} | tee "$out/gpu.log"
B=build/gpu
if ! make -j"$(nproc)" B=$B CUDA=1 CUDA_ARCHS=90 $B/tests/gpu/test_cuda_merge \
    $B/tests/gpu/test_cuda_attn $B/bin/patd-tile-solver $B/bench/bench_attn >>"$out/gpu.log" 2>&1; then
    tail -30 "$out/gpu.log"
    echo "0 passed, 1 failed"
    exit 1
fi

passed=0 failed=0
run() { # name, command...
    local name=$1
    shift
    echo "== $name" | tee -a "$out/gpu.log"
    if timeout 900 "$@" 2>&1 | tee "$out/$name.log" >>"$out/gpu.log"; then
        passed=$((passed + 1))
        tail -2 "$out/$name.log"
    else
        failed=$((failed + 1))
        tail -40 "$out/$name.log"
        echo "== $name: FAILED" | tee -a "$out/gpu.log"
    fi
}
run test_cuda_merge $B/tests/gpu/test_cuda_merge
run test_cuda_attn $B/tests/gpu/test_cuda_attn
if command -v compute-sanitizer >/dev/null; then
    run memcheck_merge compute-sanitizer --tool memcheck --error-exitcode 3 \
        $B/tests/gpu/test_cuda_merge --quick
    run memcheck_attn compute-sanitizer --tool memcheck --error-exitcode 3 \
        $B/tests/gpu/test_cuda_attn --quick
    run racecheck_attn compute-sanitizer --tool racecheck --error-exitcode 3 \
        $B/tests/gpu/test_cuda_attn --quick
else
    echo "compute-sanitizer not found" | tee -a "$out/gpu.log"
    failed=$((failed + 1))
fi
if [ $bench != 0 ]; then
    run tile_solver $B/bin/patd-tile-solver
    run bench_attn $B/bench/bench_attn $([ $bench = 2 ] && echo --quick) --json "$out/bench_attn.jsonl"
    run bench_sdpa python3 tests/bench/bench_sdpa.py "$out/bench_attn.jsonl" --out "$out/bench_table.md"
fi
echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
[ "$failed" -eq 0 ]
