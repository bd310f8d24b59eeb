#!/usr/bin/env bash
# The Go binding (client/go) with Debian's go (golang-go 1.19; GOPROXY=off: the binding needs
# nothing beyond the standard library): gofmt and go vet clean; its tests against a real patd
# (cpu backend, a private runtime directory, PATD_SOCKET) under GODEBUG=cgocheck=2, which checks
# cgo's pointer rules on every call; the goroutine and step tests again under the race
# detector; the example frontend (cmd/patexample) checking O against its float64 reference,
# with token ids of its own, and failing when its reference is not the daemon's (softmax scale,
# soft cap, a prompt another frontend wrote); then against a second patd with another model,
# scale and soft cap, which the example reads from its status, at sizes whose followers
# prefill their whole prompt. PATD_BIN (patctl beside it) and PATD_LIBPAT point at the build
# (make test sets them; the binding links the libpat beside PATD_LIBPAT), GO at the go command.
# Go's cache and outputs go to build/go: the source tree stays clean.
# shellcheck disable=SC2317 # the checks are functions that check() calls
set -u
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
PATD_BIN=${PATD_BIN:-build/bin/patd}
PATD_LIBPAT=${PATD_LIBPAT:-build/lib/libpat.so.1}
GO=${GO:-/usr/bin/go}
out=$root/build/go
libdir=$(cd "$(dirname "$PATD_LIBPAT")" && pwd)
# Go's build cache does not see C headers outside the package: pat.h's hash in CGO_CFLAGS (part
# of the cache key) rebuilds the binding whenever the header changes
pat_h_sum=$(sha256sum client/pat.h | cut -c1-16)
export GOPROXY=off GOFLAGS=-buildvcs=false GO111MODULE=on GOENV=off CGO_ENABLED=1 \
    GOCACHE=$out/cache GOPATH=$out/path CGO_CFLAGS="-g -O2 -DPAT_H_SUM=$pat_h_sum" \
    CGO_LDFLAGS="-L$libdir -Wl,-rpath,$libdir"
mkdir -p "$out"

passed=0 failed=0
# check NAME COMMAND...: runs it (in client/go), shows its output when it fails
check() {
    local name=$1 log=$out/$1.log
    shift
    if (cd client/go && "$@") >"$log" 2>&1; then
        echo "ok   $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name:"
        tail -n 40 "$log" | sed 's/^/    /'
        failed=$((failed + 1))
    fi
}
summary() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
    exit
}

if ! "$GO" version >/dev/null 2>&1; then
    echo "FAIL no go command at $GO (Debian: apt-get install golang-go; make deps installs it)"
    failed=1
    summary
fi
echo "--- $("$GO" version), libpat from $libdir"
gofmt=$(dirname "$(readlink -f "$GO")")/gofmt

gofmt_clean() {
    local bad
    bad=$("$gofmt" -l .) || return 1
    if [ -n "$bad" ]; then
        echo "not gofmt'ed: $bad"
        return 1
    fi
}
check gofmt gofmt_clean
check go_vet "$GO" vet ./...
check build_example "$GO" build -o "$out/patexample" ./cmd/patexample

B=$(dirname "$(dirname "$PATD_BIN")") # patd_lib.sh runs $B/bin/patd and $B/bin/patctl
# shellcheck source=tests/demo/patd_lib.sh
. tests/demo/patd_lib.sh
# start_patd NAME OPTIONS...: a patd on the private runtime directory, which must answer
# `patctl status` (patd_start also returns 0 when it never did); the summary if not
start_patd() {
    local name=$1
    shift
    if patd_start --backend=cpu "$@" >"$out/$name.log" 2>&1 &&
        "$B/bin/patctl" --socket "$sock" --timeout 2000 status >>"$out/$name.log" 2>&1; then
        echo "ok   $name"
        passed=$((passed + 1))
        return
    fi
    echo "FAIL $name: patd did not answer at $sock:"
    sed 's/^/    /' "$out/$name.log" "$log"
    failed=$((failed + 1))
    summary
}
# stop_patd NAME: the daemon drains and exits 0 after the binding's sessions
stop_patd() {
    if patd_stop 5 >"$out/$1.log" 2>&1; then
        echo "ok   $1"
        passed=$((passed + 1))
    else
        echo "FAIL $1:"
        sed 's/^/    /' "$out/$1.log" "$log"
        failed=$((failed + 1))
    fi
}

start_patd patd_start --layers=2 --q-heads=4 --kv-heads=2 --conn-max-seqs=8 --staging-mb=4
export PATD_SOCKET=$sock

check go_test_cgocheck2 env GODEBUG=cgocheck=2 "$GO" test -count=1 -v ./...
echo "     $(grep -c '^--- PASS' "$out/go_test_cgocheck2.log") go tests passed," \
    "$(grep -c '^--- SKIP' "$out/go_test_cgocheck2.log") skipped"
check go_test_race "$GO" test -race -count=1 \
    -run 'TestGoroutines|TestStepAbort|TestArguments|TestStepLeftOpen|TestStepAbandoned' .

# the example (model, scale and soft cap from the daemon's status): its versions (pat.h's
# through cgo, and the loaded libpat's), checked runs, runs whose reference is not the daemon's
# (must fail), and no daemon (an errno)
want=$(sed -n 's/^#define PAT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' client/pat.h |
    paste -sd.)
example() { # expected status, then patexample's arguments; prints its output
    local want_rc=$1 rc=0
    shift
    "$out/patexample" "$@" >"$out/example.out" 2>&1 || rc=$?
    cat "$out/example.out"
    [ "$rc" -eq "$want_rc" ] || { echo "exit status $rc, want $want_rc"; return 1; }
}
token_base() { sed -n 's/.* prompt from token \([0-9]*\) .*/\1/p' "$out/example.out"; }
example_version() {
    example 0 -version && grep -qx "pat binding $want (pat.h), libpat $want (loaded)" "$out/example.out"
}
example_checked() {
    example 0 -seqs 4 -prompt 100 -decode 3 && grep -q ': ok$' "$out/example.out"
}
example_wrong_scale() {
    example 1 -scale 0.2 && grep -q ': MISMATCH$' "$out/example.out"
}
# TestForeignKV left another frontend's KV in the prefix cache for the prompt 1000, 1001, ...:
# a run over those ids fails; runs draw bases of their own, in [2e9, 3e9), and -token-base pins
# one (a second run with it finds its own KV cached)
example_foreign_prompt() {
    example 1 -token-base 1000 && grep -q ': MISMATCH$' "$out/example.out"
}
example_token_base() {
    local b1 b2
    example 0 -prompt 40 && b1=$(token_base) || return 1
    example 0 -prompt 40 && b2=$(token_base) || return 1
    echo "token bases $b1 $b2"
    [ -n "$b1" ] && [ -n "$b2" ] && [ "$b1" != "$b2" ] || return 1
    for b in "$b1" "$b2"; do [ "$b" -ge 2000000000 ] && [ "$b" -lt 3000000000 ] || return 1; done
    example 0 -prompt 40 -token-base 2500000000 && [ "$(token_base)" = 2500000000 ] || return 1
    example 0 -prompt 40 -token-base 2500000000 && grep -q ': ok$' "$out/example.out"
}
example_no_daemon() {
    example 2 -socket "$dir/nope.sock" && grep -q 'errno 2 (no such file or directory)' "$out/example.out"
}
check example_version example_version
check example_checked example_checked
check example_wrong_scale_fails example_wrong_scale
check example_foreign_prompt_fails example_foreign_prompt
check example_token_base example_token_base
check example_no_daemon example_no_daemon
grep -h '^patexample: [0-9]' "$out/example_checked.log"
stop_patd patd_stop

# a daemon with another model, softmax scale and logit soft cap: the example reads them from
# its status (a reference without the soft cap fails), and sizes its staging for followers that
# prefill their whole prompt (nothing cached under a block) and for many sequences
start_patd patd_start_softcap --layers=3 --q-heads=8 --kv-heads=2 --head-dim=128 --dtype=bf16 \
    --scale=0.2 --softcap=1.5
example_softcap() {
    example 0 && grep -q ': ok$' "$out/example.out"
}
example_softcap_off() {
    example 1 -softcap 0 && grep -q ': MISMATCH$' "$out/example.out"
}
example_sizes() {
    local args
    for args in "-prompt 10 -seqs 4" "-prompt 30 -seqs 8" "-prompt 1 -seqs 16"; do
        # shellcheck disable=SC2086 # the words of args
        example 0 $args && grep -q ': ok$' "$out/example.out" || return 1
    done
}
check example_softcap example_softcap
check example_softcap_off_fails example_softcap_off
check example_sizes example_sizes
grep -h '^patexample: [0-9]' "$out/example_softcap.log"
stop_patd patd_stop_softcap
summary
