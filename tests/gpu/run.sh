#!/usr/bin/env bash
# GPU test and benchmark driver, run on the GPU machine from the repository root:
#   tests/gpu/run.sh            build the CUDA parts, run every GPU test, a compute-sanitizer
#                               memcheck pass on a reduced set, and the GPU benchmarks
# Results (logs) go to $OUT when it is set (the device tool), else to build/gpu-results.
# Ends with "N passed, N failed" over the GPU test programs and sanitizer runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-results}
mkdir -p "$out"
export CUDA_MODULE_LOADING=EAGER # lazy loading can hang a first launch behind a GPU-side wait
export PATH=/usr/local/cuda/bin:$PATH

{
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    nvcc --version | tail -1
    echo "== build"
} | tee "$out/gpu.log"
if ! make -j"$(nproc)" CUDA=1 CUDA_ARCHS=90 build/libpatcuda.a build/tests/gpu/test_cuda_merge \
    >>"$out/gpu.log" 2>&1; then
    tail -30 "$out/gpu.log"
    echo "0 passed, 1 failed"
    exit 1
fi

passed=0 failed=0
run() { # name, command...
    local name=$1
    shift
    echo "== $name" | tee -a "$out/gpu.log"
    if timeout 300 "$@" 2>&1 | tee -a "$out/gpu.log"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "== $name: FAILED" | tee -a "$out/gpu.log"
    fi
}
run test_cuda_merge build/tests/gpu/test_cuda_merge
if command -v compute-sanitizer >/dev/null; then
    run memcheck_merge compute-sanitizer --tool memcheck --error-exitcode 3 \
        build/tests/gpu/test_cuda_merge --quick
    run racecheck_merge compute-sanitizer --tool racecheck --error-exitcode 3 \
        build/tests/gpu/test_cuda_merge --quick
else
    echo "compute-sanitizer not found" | tee -a "$out/gpu.log"
    failed=$((failed + 1))
fi
echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
[ "$failed" -eq 0 ]
