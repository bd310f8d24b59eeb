# Sourced by the demo scripts (run_demo.sh, run_replay.sh): start a patd on a private runtime
# directory and stop it again, checking that it drained. Expects $B (the build directory).
#   patd_start [--key=value ...]   sets dir, log, sock, pid; returns 1 if patd did not answer
#   patd_stop SECONDS              SIGTERM, wait; returns 1 unless it exited 0 in time
dir=$(mktemp -d /tmp/patd-demo.XXXXXX)
log=$dir/patd.log
sock=$dir/patd.sock
pid=
patd_cleanup() { [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap patd_cleanup EXIT

patd_start() {
    "$B/bin/patd" --runtime-dir="$dir" --metrics-port=0 "$@" 2>"$log" &
    pid=$!
    for _ in $(seq 100); do
        "$B/bin/patctl" --socket "$sock" --timeout 200 status >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || { echo "patd exited at start:"; cat "$log"; return 1; }
        sleep 0.1
    done
    echo "--- patd started (pid $pid):"
    sed 's/^<[0-9]>/  /' "$log"
}

patd_stop() {
    local rc=0 prc
    kill -TERM "$pid"
    for _ in $(seq $(($1 * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "patd did not exit within $1 s of SIGTERM"; rc=1; fi
    wait "$pid"
    prc=$?
    pid=
    [ $prc -eq 0 ] || { echo "patd exited with status $prc"; rc=1; }
    return $rc
}
