# shellcheck shell=bash
# Sourced by the shell tests that count checks (test_pip.sh, test_rust.sh): check runs one and
# prints ok/FAILED, finish prints "N passed, N failed" and exits 1 unless all passed, logged
# keeps a command's output in a file and shows its last LOGGED_TAIL (40) lines when it fails,
# stop ends the script's patd ($pid, its log $tmp/patd.log) with SIGTERM and wants status 0,
# scratch NAME makes the script's private directory $tmp, removed at exit with $pid killed.
passed=0 failed=0
check() { # check WHAT COMMAND...: runs COMMAND, counts and prints the result
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
        passed=$((passed + 1))
    else
        echo "FAILED: $what"
        failed=$((failed + 1))
    fi
}
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
    exit
}
logged() { # logged LOG COMMAND...: runs COMMAND into LOG, shown when it fails
    local log=$1
    shift
    "$@" >"$log" 2>&1 || {
        tail -n "${LOGGED_TAIL:-40}" "$log"
        return 1
    }
}
stop() { # SIGTERM drains the daemon: exit status 0
    kill -TERM "$pid" && wait "$pid"
    local rc=$?
    pid=
    [ "$rc" -eq 0 ] || tail -n 20 "${tmp:?}/patd.log"
    return "$rc"
}
scratch() { # scratch NAME: $tmp, a private directory; at exit the daemon $pid killed, $tmp gone
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    pid=
    trap 'cleanup' EXIT
    trap 'exit 1' INT TERM
}
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$tmp"
}
