#!/usr/bin/env bash
# Runs each test program with a time limit, shows its own (cmocka) report, and ends with one
# summary line "N passed, N failed". Exit status 1 if any program failed or none ran.
#
#   tests/run.sh [-k NAME]... PROGRAM...
#
# -k NAME (repeatable) or PATD_TESTS=NAME,NAME runs only the programs of those names (the file
# name, with or without its extension: test_kv, test_python, test_patload.py); a NAME that
# matches no program is an error. `make run-tests T=test_kv,test_ops` sets PATD_TESTS.
# Time limits come from the table below; PATD_TEST_TIMEOUT=seconds overrides it for every test.
set -u

# Seconds a test may run: the first row whose pattern (a shell glob on the name) matches.
# Unit tests (one process, no daemon) finish in seconds, ASan builds included, and so does
# test_stale (two short-lived daemons; its tools must answer at once), test_bench_tools (scripts
# over rows it writes) and test_metrics_http (one daemon, seconds of hostile HTTP clients);
# test_many runs fixed windows (about 25 s, ASan included) and a hold that gives up after 20 s;
# test_cpu's float64 references take about 50 s of CPU, over 300 s under ASan on CI's two cores;
# test_patload.py replays every bundled trace and, under ASan with 16 requests a replay, took
# 418 s alone on this VM's two cores and 784 s beside a make check (2026-11-29): 900 s;
# the rest start daemons and clients and replay traces.
LIMITS=(
    'test_base test_kv test_forest test_pack test_cuda_pack test_ipc test_daemon test_stale test_metrics_http.py test_bench_tools.py 120'
    'test_many 180'
    'test_cpu 480'
    'test_patload.py 900'
    '* 600'
)

limit_for() { # name -> seconds
    local row pat
    if [ -n "${PATD_TEST_TIMEOUT:-}" ]; then
        echo "$PATD_TEST_TIMEOUT"
        return
    fi
    for row in "${LIMITS[@]}"; do
        read -ra f <<<"$row"
        for pat in "${f[@]:0:${#f[@]}-1}"; do
            # shellcheck disable=SC2053 # the pattern is a glob on purpose
            if [[ $1 == $pat ]]; then
                echo "${f[-1]}"
                return
            fi
        done
    done
}

want=()
[ -n "${PATD_TESTS:-}" ] && IFS=',' read -ra want <<<"$PATD_TESTS"
while getopts 'k:' opt; do
    case $opt in
    k) want+=("$OPTARG") ;;
    *)
        echo "usage: $0 [-k NAME]... PROGRAM..." >&2
        exit 2
        ;;
    esac
done
shift $((OPTIND - 1))

selected() { # name -> 0 when it is to run
    local w
    [ ${#want[@]} -eq 0 ] && return 0
    for w in "${want[@]}"; do
        [ "$1" = "$w" ] || [ "${1%.*}" = "$w" ] && return 0
    done
    return 1
}

passed=0 failed=0 failed_names=()
for w in "${want[@]}"; do
    found=0
    for t in "$@"; do
        n=$(basename "$t")
        [ "$n" = "$w" ] || [ "${n%.*}" = "$w" ] && found=1
    done
    if [ $found -eq 0 ]; then
        echo "=== $w: no such test (have: $(for t in "$@"; do basename "$t"; done | tr '\n' ' '))"
        failed=$((failed + 1))
        failed_names+=("$w")
    fi
done
for t in "$@"; do
    name=$(basename "$t")
    selected "$name" || continue
    limit=$(limit_for "$name")
    echo "=== $name (limit ${limit}s)"
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
