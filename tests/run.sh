#!/usr/bin/env bash
# Runs each test program with a time limit, shows its own (cmocka) report, and ends with one
# summary line "N passed, N failed". Exit status 1 if any program failed or none ran.
set -u
limit=${PATD_TEST_TIMEOUT:-600}
passed=0 failed=0 failed_names=()
for t in "$@"; do
    name=$(basename "$t")
    echo "=== $name"
    start=$(date +%s%N)
    timeout --kill-after=10 "$limit" "$t"
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        printf '=== %s: ok (%d.%03ds)\n' "$name" $((ms / 1000)) $((ms % 1000))
    else
        failed=$((failed + 1))
        failed_names+=("$name")
        [ $rc -eq 124 ] && echo "=== $name: TIMED OUT after ${limit}s" || echo "=== $name: FAILED (exit $rc)"
    fi
done
echo
[ $failed -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
