#!/usr/bin/env bash
# `make replay`: starts patd (built-in defaults: the cpu backend on a machine without a GPU; a
# private runtime directory), replays a bundled trace sample against it with patload and prints
# patload's summary, writes the plot and the JSON/CSV outputs to $REPLAY_OUT (build/replay), then
# stops patd with SIGTERM and checks that it drained. Exit status 0 only if every request of the
# replay finished and patd exited cleanly.
#   REPLAY_TRACE  the trace (default: the synthetic multi-turn sample)
#   REPLAY_ARGS   patload options (default: lengths at 1/4, as fast as possible)
set -u
B=${1:-${PATD_DEMO_BUILD:-build}}
trace=${REPLAY_TRACE:-tests/traces/gsp_multiturn_sample.jsonl.xz}
args=${REPLAY_ARGS:---scale 0.25 --speed 0}
out=${REPLAY_OUT:-$B/replay}
mkdir -p "$out"
dir=$(mktemp -d /tmp/patd-replay.XXXXXX)
log=$dir/patd.log
sock=$dir/patd.sock
cleanup() { [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

"$B/bin/patd" --runtime-dir="$dir" --metrics-port=0 2>"$log" &
pid=$!
for _ in $(seq 100); do
    "$B/bin/patctl" --socket "$sock" --timeout 200 status >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "patd exited at start:"; cat "$log"; exit 1; }
    sleep 0.1
done
echo "--- patd started (pid $pid):"
sed 's/^<[0-9]>/  /' "$log"
echo "--- patload $args $trace"
# shellcheck disable=SC2086 # REPLAY_ARGS is a list of options
"$B/bin/patload" --socket "$sock" $args --json "$out/summary.json" --csv "$out/requests.csv" \
    --steps-csv "$out/steps.csv" --plot "$out/replay.png" "$trace"
rc=$?
echo "--- outputs: $out/summary.json requests.csv steps.csv replay.png"
echo "--- patctl status"
"$B/bin/patctl" --socket "$sock" status | sed 's/^/  /'
kill -TERM $pid
for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null; then echo "patd did not exit within 10 s of SIGTERM"; rc=1; fi
wait $pid; prc=$?
pid=
[ $prc -eq 0 ] || { echo "patd exited with status $prc"; rc=1; }
exit $rc
