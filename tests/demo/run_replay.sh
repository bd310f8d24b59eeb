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
# shellcheck source=tests/demo/patd_lib.sh
. "$(dirname "$0")/patd_lib.sh"
patd_start || exit 1
echo "--- patload $args $trace"
# shellcheck disable=SC2086 # REPLAY_ARGS is a list of options
"$B/bin/patload" --socket "$sock" $args --json "$out/summary.json" --csv "$out/requests.csv" \
    --steps-csv "$out/steps.csv" --plot "$out/replay.png" "$trace"
rc=$?
echo "--- outputs: $out/summary.json requests.csv steps.csv replay.png"
echo "--- patctl status"
"$B/bin/patctl" --socket "$sock" status | sed 's/^/  /'
patd_stop 10 || rc=1
exit $rc
