#!/usr/bin/env bash
# `make demo`: starts patd (the cpu backend whatever the build carries, built-in defaults
# otherwise, a private runtime directory), waits until it answers, runs the client demo against
# it (client processes sharing prompts, every output checked in float64), shows `patctl status`,
# then stops patd with SIGTERM and checks that it drained and exited cleanly. Exit status 0 only
# if all of that held. test_demo.sh runs it in the test suite and checks README.md's sample.
set -u
B=${1:-${PATD_DEMO_BUILD:-build}}
shift || true
# shellcheck source=tests/demo/patd_lib.sh
. "$(dirname "$0")/patd_lib.sh"
patd_start --backend=cpu || exit 1
echo "--- client demo"
"$B/bin/patd-client-demo" --socket "$sock" "$@"
rc=$?
echo "--- patctl status"
"$B/bin/patctl" --socket "$sock" status | sed 's/^/  /'
echo "--- patd log tail"
patd_stop 5 || rc=1
tail -n 4 "$log" | sed 's/^<[0-9]>/  /'
exit $rc
