#!/usr/bin/env bash
# GPU test and benchmark driver, run on the GPU machine from the repository root:
#   tests/gpu/run.sh [--no-bench | --quick-bench | --attn | --attn-bench | --smoke | --frontend |
#                     --sanitize | --replay [quick] | --frontends [full|quick|modes] | --persist |
#                     --flake [N]]
# builds the CUDA parts, runs every GPU test, compute-sanitizer memcheck and racecheck on a
# reduced set, the tile solver, and the attention benchmark (bench_attn --trees all: the PAT
# paper's 20 trees and ten of our own, + PAT's kernel on the same GPU when .peers/ holds it
# (../shared/peers/pat/README.md), joined by tests/bench/compare_pat.py, + PyTorch SDPA;
# --quick-bench: a few trees, --no-bench: none; --attn: the GPU tests, sanitizers, solver and the
# attention benchmark with PAT, nothing cross-process; --attn-bench: the tile solver and the
# attention benchmark with PAT; --smoke: test_cuda_attn --quick and
# bench_attn --quick, a few minutes; --sanitize: test_cuda_attn --quick, memcheck and racecheck
# on it, the tile solver); then test_vmm_share without MPS and under it (a session's staging as
# its own allocation passed by descriptor, issue 17), and under MPS the cross-process tests (a real patd on
# the cuda backend and PyTorch frontends: tests/gpu/test_frontend.py, and a transformers model
# through patd.transformers: tests/gpu/test_hf.py) and, unless --no-bench, the
# hand-off and frontend benchmarks. --frontend: test_cuda_xpack (cross-session packing below
# the daemon, memcheck on it, its --bench unless --no-bench) and the cross-process part.
# --launch: test_cuda_attn --quick; a build whose forwards skip the wait for the append
# (KCUDA_NO_DEP_WAIT) must fail test_cuda_attn --dep; bench_mcast (issue 15: a 2-CTA cluster
# multicasting KV tiles); test_vmm_share as in every cross-process mode; under MPS
# bench_handoff with gpu.dependent_launch 1 and 0, and test_frontend. --e2e: only tests/bench/bench_e2e.py under MPS (a Llama-3-8B-shaped decode step through patd,
# in-process FlashInfer from .whl/, and a dense in-process cache). --replay: only patload under MPS (tests/gpu/replay.sh: the CI replay tests on the cuda backend,
# then trace replays with a Llama-3-8B-shaped model; "quick": the tests and one short replay).
# --persist: only tests/gpu/test_persist.py under MPS (issue 37: the KV cache survives patd's
# kill -9 and its upgrade, a transformers model as the frontend; builds patd, patctl, patd-keep
# and libpat; the other modes that run test_hf run it too).
# --invariant [CHUNKS [cuts]]: test_cuda_attn --invariant and --tree-quick, bench_attn --invariant
# CHUNKS (default 256,1024; cuts: and every cut rule forced) on the PAT paper's trees with PAT
# beside, compare_invariant.py.
# --fp8 [KV [TREES]]: bench_attn --kv KV (default fp8_e4m3) on TREES (default paper) at 32/32 and
# 32/8 beside FlashInfer's decode and cascade over fp16 and KV pools (bench_flashinfer_trees.py,
# FlashInfer from .whl/: carry .whl), joined by compare_fp8.py with issue 40's fp8 targets.
# FlashInfer builds each kernel it has not built before on first use (minutes): its --warm run
# does that while patd builds.
# --flake [N]: test_cuda_attn --quick, then every TREE world of its --tree (fixed seed) run N
# more times (default 200), bitwise equal to the first, then racecheck, initcheck and memcheck
# on --tree-quick.
# FRONTEND_ONLY=LIST with --frontends: test_frontend.py's tests of LIST before the benchmark.
# --frontends [full|quick|modes]: only tests/bench/bench_frontends.py under MPS (issue 36: N
# frontend processes through one patd vs one frontend with the union batch vs N in-process
# FlashInfer frontends; builds patd and libpat only, skips test_units and test_vmm_share): full
# is its default matrix, quick its --quick (N = 1,4,16, shared prompt), modes its churn and
# slow-frontend runs (--no-matrix --churn --slow; run times: its docstring); FRONTENDS_ARGS adds
# arguments, FRONTENDS_BUDGET (default 540) is the seconds since this script started after
# which the benchmark starts no new run (the device tool's limit is 600).
# Results (logs, JSON, tables) go to $OUT when it is set (the device tool), else
# build/gpu-results. Ends with "N passed, N failed" over the GPU programs and sanitizer runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-results}
mkdir -p "$out"
export CUDA_MODULE_LOADING=EAGER # lazy loading can hang a first launch behind a GPU-side wait
export PATH=/usr/local/cuda/bin:$PATH
bench=1 # --no-bench: tests only; --quick-bench: 4 trees x 1 head config
attn_only=0
case "${1:-}" in
--no-bench) bench=0 ;;
--quick-bench) bench=2 ;;
--frontend) bench=3 ;;
--replay) bench=4 ;;
--attn) bench=5 ;;
--attn-bench) bench=5 attn_only=1 ;;
--smoke) bench=6 ;;
--e2e) bench=7 ;;
--sanitize) bench=8 ;;
--launch) bench=9 ;;
--units) bench=10 ;;
--frontends) bench=11 ;;
--persist) bench=12 ;;
--flake) bench=13 ;;
--invariant) bench=14 ;;
--fp8) bench=15 ;;
esac

# PAT's reference kernel (../shared/peers/pat): built in the background while patd builds and
# tests, unless a built extension came along (.peers/PAT/prefix_attn/_prefix_attn*.so)
pat_pid=
if [ -x .peers/tools/run.sh ] && [ "$bench" != 0 ] && [ "$bench" -lt 3 -o "$bench" = 5 -o "$bench" = 14 ]; then
    if ! ls .peers/PAT/prefix_attn/_prefix_attn*.so >/dev/null 2>&1; then
        (MAX_JOBS=8 .peers/tools/run.sh build >"$out/pat_build.log" 2>&1) &
        pat_pid=$!
    fi
fi

. tests/gpu/devdeps.sh # C dependencies the GPU host lacks, as .deb files

{
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    nvcc --version | tail -1
    echo "== build"
} | tee "$out/gpu.log"
B=build/gpu
targets="$B/tests/gpu/test_cuda_attn $B/tests/gpu/test_vmm_share $B/tests/gpu/test_cuda_xpack
    $B/bin/patd-tile-solver
    $B/bench/bench_attn $B/bin/patd $B/lib/libpat.so.1 $B/bench/bench_handoff $B/bench/bench_mcast
    $B/bin/patload $B/bin/patctl $B/bin/patd-keep"
[ $bench = 10 ] && targets="$B/bin/patd $B/bin/patctl"
[ $bench = 12 ] && targets="$B/bin/patd $B/bin/patctl $B/bin/patd-keep $B/lib/libpat.so.1"
[ $bench = 11 ] && targets="$B/bin/patd $B/lib/libpat.so.1"
[ $bench = 13 ] && targets="$B/tests/gpu/test_cuda_attn"
[ $bench = 14 ] && targets="$B/tests/gpu/test_cuda_attn $B/bench/bench_attn"
[ $bench = 15 ] && targets="$B/bench/bench_attn"
warm_pid=
if [ $bench = 15 ]; then # FlashInfer from the carried wheel; its JIT builds run beside patd's
    if ! python3 -c 'import flashinfer' 2>/dev/null && ls .whl/flashinfer_python-*.whl >/dev/null 2>&1; then
        python3 -m pip install --quiet --no-deps --no-index .whl/*.whl >>"$out/gpu.log" 2>&1
    fi
    python3 tests/bench/bench_flashinfer_trees.py --warm --kv "${2:-fp8_e4m3}" >"$out/flashinfer_warm.log" 2>&1 &
    warm_pid=$!
fi
# shellcheck disable=SC2086 # a list of targets
if ! make -j"$(nproc)" B=$B CUDA=1 CUDA_ARCHS=90a $targets >>"$out/gpu.log" 2>&1; then
    tail -30 "$out/gpu.log"
    echo "0 passed, 1 failed"
    exit 1
fi

passed=0 failed=0
run() { # name, command...
    local name=$1
    shift
    echo "== $name ($(date +%T))" | tee -a "$out/gpu.log"
    if timeout 900 "$@" 2>&1 | tee "$out/$name.log" >>"$out/gpu.log"; then
        passed=$((passed + 1))
        tail -2 "$out/$name.log"
    else
        failed=$((failed + 1))
        tail -40 "$out/$name.log"
        echo "== $name: FAILED" | tee -a "$out/gpu.log"
    fi
}
# the shipped units and config started as systemd starts them: the cuda backend on this GPU
# (tests/integ/test_units.py; two patd@ instances share the one GPU); not before --frontends,
# whose time is the benchmark's
[ $bench = 11 ] || [ $bench = 12 ] || [ $bench = 13 ] || [ $bench -ge 14 ] || run test_units env PATD_BIN=$B/bin/patd PATCTL_BIN=$B/bin/patctl \
    python3 tests/integ/test_units.py --expect cuda
if [ $bench = 10 ]; then # --units: only that
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 15 ]; then # --fp8 [KV [TREES]]: patd over fp8 beside FlashInfer over fp8 (issue 40)
    kv=${2:-fp8_e4m3}
    echo "== flashinfer_warm ($(date +%T)): waiting for FlashInfer's builds" | tee -a "$out/gpu.log"
    wait "$warm_pid" || true
    cat "$out/flashinfer_warm.log" >>"$out/gpu.log"
    run bench_fp8 $B/bench/bench_attn --kv "$kv" --trees "${3:-paper}" --heads 32/32,32/8 \
        --json "$out/bench_fp8.jsonl"
    run flashinfer_fp8 python3 tests/bench/bench_flashinfer_trees.py --kv "$kv" \
        --trees "${3:-paper}" --heads 32/32,32/8 --json "$out/flashinfer_fp8.jsonl"
    run compare_fp8 python3 tests/bench/compare_fp8.py "$out/bench_fp8.jsonl" \
        "$out/flashinfer_fp8.jsonl" --md "$out/compare_fp8.md"
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    (cd "$out" && tar -cJf logs.tar.xz ./*.log && find . -maxdepth 1 -name '*.log' ! -name gpu.log -delete)
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 14 ]; then # --invariant [CHUNKS]: batch invariance (issue 40)
    run test_invariant $B/tests/gpu/test_cuda_attn --invariant
    run test_tree_quick $B/tests/gpu/test_cuda_attn --tree-quick
    run bench_invariant $B/bench/bench_attn --invariant "${2:-256,1024}" ${3:+--invariant-cuts} \
        --trees paper --json "$out/bench_inv.jsonl"
    if [ -x .peers/tools/run.sh ]; then
        [ -n "$pat_pid" ] && { wait $pat_pid || tail -20 "$out/pat_build.log"; }
        run pat_bench tests/gpu/pat_bench.sh "$out/bench_inv.jsonl" "$out/pat.jsonl"
        run compare_invariant python3 tests/bench/compare_invariant.py "$out/bench_inv.jsonl" \
            "$out/pat.jsonl" --md "$out/compare_invariant.md"
        so=$(ls .peers/PAT/prefix_attn/_prefix_attn*.so 2>/dev/null | head -1)
        [ -n "$pat_pid" ] && [ -n "$so" ] &&
            tar -C .peers/PAT/prefix_attn -cJf "$out/pat_so.tar.xz" "$(basename "$so")"
    fi
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    # eight files come back from the device tool: the logs travel as one
    (cd "$out" && tar -cJf logs.tar.xz ./*.log && find . -maxdepth 1 -name '*.log' ! -name gpu.log -delete)
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 6 ]; then # --smoke [TREES [HEADS]]: bench_attn --quick, or those cases
    run test_cuda_attn $B/tests/gpu/test_cuda_attn --quick
    run bench_attn $B/bench/bench_attn $([ -n "${2:-}" ] && echo --trees "$2" || echo --quick) \
        $([ -n "${3:-}" ] && echo --heads "$3") --json "$out/bench_attn.jsonl"
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 9 ]; then # --launch: the forward as the append's programmatic dependent
    (make -j8 B=build/nodep CUDA=1 CUDA_ARCHS=90a NVCC="nvcc -DKCUDA_NO_DEP_WAIT" \
        build/nodep/tests/gpu/test_cuda_attn >"$out/nodep_build.log" 2>&1) &
    nodep_pid=$!
    run test_cuda_attn $B/tests/gpu/test_cuda_attn --quick
    run bench_mcast $B/bench/bench_mcast
    wait $nodep_pid
    # passes when the test catches the wrong build (exit status 1 from its failed verdicts)
    run nodep_caught bash -c "build/nodep/tests/gpu/test_cuda_attn --dep; [ \$? = 1 ]"
fi
if [ $bench = 13 ]; then # --flake [N]: the TREE tests looped, then three sanitizers on them
    run test_cuda_attn $B/tests/gpu/test_cuda_attn --quick
    run tree_loop $B/tests/gpu/test_cuda_attn --tree-loop "${2:-200}"
    for tool in racecheck initcheck memcheck; do
        run ${tool}_tree compute-sanitizer --tool $tool --error-exitcode 3 \
            $B/tests/gpu/test_cuda_attn --tree-quick
    done
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 8 ]; then # --sanitize: the quick GPU tests, both sanitizers on them, the tile solver
    run test_cuda_attn $B/tests/gpu/test_cuda_attn --quick
    run memcheck_attn compute-sanitizer --tool memcheck --error-exitcode 3 \
        $B/tests/gpu/test_cuda_attn --quick
    run racecheck_attn compute-sanitizer --tool racecheck --error-exitcode 3 \
        $B/tests/gpu/test_cuda_attn --quick
    run tile_solver $B/bin/patd-tile-solver
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    (cd "$out" && tar -cJf logs.tar.xz --remove-files $(ls *.log | grep -v '^gpu.log$'))
    [ "$failed" -eq 0 ]
    exit
fi
if { [ $bench -lt 3 ] || [ $bench = 5 ]; } && [ $attn_only = 0 ]; then
run test_cuda_attn $B/tests/gpu/test_cuda_attn
if command -v compute-sanitizer >/dev/null; then
    run memcheck_attn compute-sanitizer --tool memcheck --error-exitcode 3 \
        $B/tests/gpu/test_cuda_attn --quick
    run racecheck_attn compute-sanitizer --tool racecheck --error-exitcode 3 \
        $B/tests/gpu/test_cuda_attn --quick
else
    echo "compute-sanitizer not found" | tee -a "$out/gpu.log"
    failed=$((failed + 1))
fi
fi
if [ $bench -lt 3 ] || [ $bench = 5 ]; then
if [ $bench != 0 ]; then
    run tile_solver $B/bin/patd-tile-solver
    run bench_attn $B/bench/bench_attn $([ $bench = 2 ] && echo --quick || echo --trees all) --json "$out/bench_attn.jsonl"
    if [ -x .peers/tools/run.sh ]; then
        [ -n "$pat_pid" ] && { wait $pat_pid || tail -20 "$out/pat_build.log"; }
        run pat_bench tests/gpu/pat_bench.sh "$out/bench_attn.jsonl" "$out/pat.jsonl"
        run compare_pat python3 tests/bench/compare_pat.py "$out/bench_attn.jsonl" "$out/pat.jsonl" \
            --md "$out/compare_pat.md"
        run compare_mma python3 tests/bench/compare_pat.py "$out/bench_attn.jsonl" \
            "$out/pat.jsonl" --field mma_us --md "$out/compare_mma.md"
        for f in tma layer wide128 tree16 tree32 inside; do
            run compare_$f python3 tests/bench/compare_pat.py "$out/bench_attn.jsonl" \
                "$out/pat.jsonl" --field ${f}_us --md "$out/compare_$f.md"
        done
        if [ -n "$pat_pid" ]; then # bring the built extension back for the next session to carry
            so=$(ls .peers/PAT/prefix_attn/_prefix_attn*.so 2>/dev/null | head -1)
            [ -n "$so" ] && tar -C .peers/PAT/prefix_attn -cJf "$out/pat_so.tar.xz" "$(basename "$so")"
        fi
    fi
    [ $bench = 5 ] || run bench_sdpa python3 tests/bench/bench_sdpa.py "$out/bench_attn.jsonl" \
        --out "$out/bench_table.md"
fi
fi
if [ $bench = 5 ]; then
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    # the device tool brings back at most 8 files: the per-program logs travel as one archive
    (cd "$out" && tar -cJf logs.tar.xz --remove-files $(ls *.log compare_*.md 2>/dev/null |
        grep -v '^gpu.log$\|^compare_pat.md$') 2>/dev/null)
    [ "$failed" -eq 0 ]
    exit
fi

# cross-session packing below the daemon (kern_lane_pack_*: float64 checks), its memcheck, and
# unless --no-bench its attention time per layer against lanes of their own
if [ $bench -lt 4 ] || [ $bench = 5 ]; then
    run test_cuda_xpack $B/tests/gpu/test_cuda_xpack
    command -v compute-sanitizer >/dev/null &&
        run memcheck_xpack compute-sanitizer --tool memcheck --error-exitcode 3 \
            $B/tests/gpu/test_cuda_xpack
    if [ $bench != 0 ]; then
        run bench_xpack $B/tests/gpu/test_cuda_xpack --bench
        run bench_xpack16 $B/tests/gpu/test_cuda_xpack --bench 16 8 2048 32 32 10
    fi
fi

# ---- cross-process: patd on the cuda backend + frontends in other processes, under MPS
export CUDA_MPS_PIPE_DIRECTORY=/tmp/patd-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/patd-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
export PATD_LIBPAT=$PWD/$B/lib/libpat.so.1
mps_stop() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
if [ $bench != 0 ] && [ $bench != 4 ] && [ $bench != 7 ] && [ $bench != 9 ] && [ $bench != 11 ] && [ $bench != 12 ]; then # the floor and patd's round trip without MPS first
    run handoff_nomps $B/bench/bench_handoff --patd $B/bin/patd --label no-MPS \
        --json "$out/handoff.jsonl"
fi
# per-session GPU staging by descriptor (issue 17): does the driver share a VMM allocation with
# one other process, without MPS and under it
[ $bench = 11 ] || [ $bench = 12 ] || run vmm_share_nomps $B/tests/gpu/test_vmm_share
nvidia-cuda-mps-control -d && sleep 1
[ $bench = 11 ] || [ $bench = 12 ] || run vmm_share_mps $B/tests/gpu/test_vmm_share
flashinfer_whl() { # FlashInfer from the carried wheel (.whl/) where the host's python lacks it
    if ! python3 -c 'import flashinfer' 2>/dev/null && ls .whl/flashinfer_python-*.whl >/dev/null 2>&1; then
        python3 -m pip install --quiet --no-deps --no-index .whl/*.whl >>"$out/gpu.log" 2>&1
    fi
}
if [ $bench = 9 ]; then # --launch, under MPS: the hand-off with the dependent launch on and off
    for d in 1 0 1 0 1 0; do
        run handoff_dep$d $B/bench/bench_handoff --patd $B/bin/patd --label "MPS dep$d" \
            --patd-opt --dependent-launch=$d --json "$out/handoff.jsonl"
    done
    run test_frontend python3 tests/gpu/test_frontend.py --patd $B/bin/patd
    mps_stop
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 11 ]; then # --frontends [full|quick|modes]: tests/bench/bench_frontends.py
    flashinfer_whl
    case "${2:-full}" in
    quick) fargs=--quick ;;
    modes) fargs="--no-matrix --churn --slow" ;;
    *) fargs= ;;
    esac
    # FRONTEND_ONLY: test_frontend.py's tests of that list first (e.g. pack,kill)
    [ -n "${FRONTEND_ONLY:-}" ] &&
        run test_frontend python3 tests/gpu/test_frontend.py --patd $B/bin/patd --only "$FRONTEND_ONLY"
    left=$((${FRONTENDS_BUDGET:-540} - SECONDS)) # what the build and MPS left of the budget
    [ $left -lt 1 ] && left=1
    # FRONTENDS_ARGS: more arguments (e.g. --n 4 --batch 16 --prompts shared, --patd-arg K=V)
    # shellcheck disable=SC2086 # lists of arguments
    run bench_frontends python3 tests/bench/bench_frontends.py --patd $B/bin/patd $fargs \
        --json "$out/frontends.json" --daemon-log "$out/frontends_patd.log" \
        --deadline $left ${FRONTENDS_ARGS:-}
    mps_stop
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 7 ]; then # --e2e: tests/bench/bench_e2e.py (patd vs in-process FlashInfer)
    flashinfer_whl
    # E2E_ARGS: more arguments (e.g. --ways patd,flashinfer --batches 16 --timeline 16)
    run bench_e2e python3 tests/bench/bench_e2e.py --patd $B/bin/patd --json "$out/e2e.jsonl" \
        ${E2E_ARGS:-}
    mps_stop
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    [ "$failed" -eq 0 ]
    exit
fi
if [ $bench = 4 ]; then
    export PATD_BIN=$B/bin/patd PATLOAD_BIN=$B/bin/patload PATCTL_BIN=$B/bin/patctl \
        PATLOAD_NO_GNUPLOT_OK=1
    [ "${2:-full}" = mooncake ] || run test_patload python3 tests/integ/test_patload.py
    run replay bash tests/gpu/replay.sh "$out" "${2:-full}"
    mps_stop
    echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
    [ "$failed" -eq 0 ]
    exit
fi
[ $bench = 12 ] || run test_frontend python3 tests/gpu/test_frontend.py --patd $B/bin/patd
# a transformers Llama-3-8B-shaped model generating through patd.transformers vs its own sdpa
# (needs transformers in the GPU host's python; .whl/ may bring a wheel: installed if missing)
if ! python3 -c 'import transformers' 2>/dev/null && ls .whl/transformers-*.whl >/dev/null 2>&1; then
    python3 -m pip install --quiet --no-index --find-links .whl transformers >/dev/null 2>&1
fi
[ $bench = 12 ] || run test_hf python3 tests/gpu/test_hf.py --patd $B/bin/patd
# the cache survives patd's kill -9 and its upgrade, with that model as the frontend (issue 37)
run test_persist python3 tests/gpu/test_persist.py --bindir $B/bin
if [ $bench != 0 ] && [ $bench != 12 ]; then
    run handoff_mps $B/bench/bench_handoff --patd $B/bin/patd --label MPS \
        --json "$out/handoff.jsonl"
    run bench_frontend python3 tests/bench/bench_frontend.py --patd $B/bin/patd \
        --json "$out/frontend.jsonl"
fi
mps_stop
echo "$passed passed, $failed failed" | tee -a "$out/gpu.log"
[ "$failed" -eq 0 ]
