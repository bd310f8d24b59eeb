#!/usr/bin/env bash
# `make demo`: starts patd (cpu backend, built-in defaults, a private runtime directory), waits
# until it answers, runs the client demo against it (client processes sharing prompts, every
# output checked in float64), shows `patctl status`, then stops patd with SIGTERM and checks
# that it drained and exited cleanly. Exit status 0 only if all of that held.
set -u
B=${1:-${PATD_DEMO_BUILD:-build}}
shift || true
dir=$(mktemp -d /tmp/patd-demo.XXXXXX)
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
echo "--- client demo"
"$B/bin/patd-client-demo" --socket "$sock" "$@"
rc=$?
echo "--- patctl status"
"$B/bin/patctl" --socket "$sock" status | sed 's/^/  /'
kill -TERM $pid
for _ in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null; then echo "patd did not exit within 5 s of SIGTERM"; rc=1; fi
wait $pid; prc=$?
pid=
echo "--- patd log tail"
tail -n 4 "$log" | sed 's/^<[0-9]>/  /'
[ $prc -eq 0 ] || { echo "patd exited with status $prc"; rc=1; }
exit $rc
