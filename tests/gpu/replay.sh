#!/usr/bin/env bash
# patload trace replays on the GPU machine (run by tests/gpu/run.sh --replay, under MPS): patd on
# the cuda backend with a Llama-3-8B-shaped model (32 layers, 32 query / 8 KV heads of 128, bf16)
# and patload standing in for the model's GEMMs with cuBLAS on its own stream.
#   tests/gpu/replay.sh OUT [full|mooncake|synthetic|quick]
# full: a 300-request slice of the Mooncake conversation trace at its recorded rate, the whole
# synthetic multi-turn trace and the whole synthetic default trace as fast as possible (mooncake,
# synthetic: one part; each fits the device tool's 10-minute call); quick:
# 128 requests of the multi-turn trace. Writes <name>.json / .csv / .steps.csv / .log into OUT
# (plots: patload --replot elsewhere). Ends with "N passed, N failed".
set -uo pipefail
out=$1
mode=${2:-full}
B=build/gpu
T=${PATD_TRACES:-.devtraces}  # the full traces (carried to the GPU machine), else ../shared
[ -d "$T" ] || T=../shared/traces
dir=$(mktemp -d /tmp/patd-replay.XXXXXX)
sock=$dir/patd.sock
passed=0 failed=0

start_patd() { # blocks
    "$B/bin/patd" --runtime-dir="$dir" --metrics-port=0 --backend=cuda --layers=32 --q-heads=32 \
        --kv-heads=8 --head-dim=128 --dtype=bf16 --blocks="$1" --max-seq-len=131072 \
        --conn-max-batch-tokens=4096 --step-timeout-ms=120000 2>"$out/patd-$2.log" &
    pid=$!
    for _ in $(seq 600); do
        "$B/bin/patctl" --socket "$sock" --timeout 500 status 2>/dev/null | grep -q '^state serving' &&
            return 0
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    echo "patd did not start:"
    tail -20 "$out/patd-$2.log"
    return 1
}
stop_patd() {
    kill -TERM $pid
    wait $pid
    local rc=$?
    [ $rc -eq 0 ] || echo "patd exited $rc"
    return $rc
}

replay() { # name, trace, patload args...
    local name=$1 trace=$2
    shift 2
    echo "== replay $name: $trace $*"
    if ! start_patd "${BLOCKS:-28000}" "$name"; then
        failed=$((failed + 1))
        return
    fi
    timeout 560 "$B/bin/patload" --socket "$sock" --progress 15 --json "$out/$name.json" \
        --csv "$out/$name.csv" --steps-csv "$out/$name.steps.csv" "$trace" "$@" \
        2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    "$B/bin/patctl" --socket "$sock" status | grep -E 'blocks_|sequences|connections|pool_check' |
        tee -a "$out/$name.log"
    stop_patd || rc=1
    if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else
        failed=$((failed + 1))
        echo "== replay $name: FAILED ($rc)"
    fi
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
case $mode in
quick)
    BLOCKS=8000 replay multiturn_quick "$T/synthetic_gsp_multiturn_g16x8x4_b16.jsonl.xz" \
        --limit 128 --speed 0 --concurrency 64
    ;;
mooncake | full)
    replay mooncake_conv "$T/mooncake_fast25_conversation_trace.jsonl.xz" --skip 5000 \
        --limit 300 --speed 1 --spread --concurrency 32 --max-batch-tokens 4096 --chunk 2048
    ;;&
synthetic | full)
    replay gsp_multiturn "$T/synthetic_gsp_multiturn_g16x8x4_b16.jsonl.xz" --speed 0 \
        --concurrency 128 --max-batch-tokens 4096 --chunk 2048
    replay gsp_default "$T/synthetic_gsp_default_b16.jsonl.xz" --speed 0 --concurrency 128 \
        --max-batch-tokens 4096 --chunk 2048
    ;;
esac
rm -rf "$dir"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
