#!/usr/bin/env bash
# The demo as a test (make test's list): run_demo.sh against the build under test (its argument,
# else $PATD_DEMO_BUILD, else build/), then the client demo's report compared with README.md's
# demo sample by readme_sample.py. Exit status 0 only if the demo passed and the sample matched.
set -u
here=$(dirname "$0")
out=$(mktemp /tmp/patd-demo-out.XXXXXX)
trap 'rm -f "$out"' EXIT
"$here/run_demo.sh" "$@" | tee "$out"
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
python3 "$here/readme_sample.py" "$here/../../README.md" "$out"
