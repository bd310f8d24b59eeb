#!/usr/bin/env bash
# The Go binding (client/go) with Debian's go (golang-go 1.19; GOPROXY=off: the binding needs
# nothing beyond the standard library): gofmt and go vet clean; its tests against a real patd
# (cpu backend, a private runtime directory, PATD_SOCKET) under GODEBUG=cgocheck=2, which checks
# cgo's pointer rules on every call; the goroutine and step tests again under the race
# detector; the example frontend (cmd/patexample) checking O against its float64 reference,
# and failing when its softmax scale is not the daemon's. PATD_BIN (patctl beside it) and
# PATD_LIBPAT point at the build (make test sets them; the binding links the libpat beside
# PATD_LIBPAT), GO at the go command. Go's cache and outputs go to build/go: the source tree
# stays clean.
# shellcheck disable=SC2317 # the checks are functions that check() calls
set -u
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
PATD_BIN=${PATD_BIN:-build/bin/patd}
PATD_LIBPAT=${PATD_LIBPAT:-build/lib/libpat.so.1}
GO=${GO:-/usr/bin/go}
out=$root/build/go
libdir=$(cd "$(dirname "$PATD_LIBPAT")" && pwd)
export GOPROXY=off GOFLAGS=-buildvcs=false GO111MODULE=on GOENV=off CGO_ENABLED=1 \
    GOCACHE=$out/cache GOPATH=$out/path CGO_LDFLAGS="-L$libdir -Wl,-rpath,$libdir"
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
patd_start --backend=cpu --layers=2 --q-heads=4 --kv-heads=2 --conn-max-seqs=8 \
    --staging-mb=4 >"$out/patd_start.log" || {
    cat "$out/patd_start.log"
    failed=$((failed + 1))
    summary
}
export PATD_SOCKET=$sock

check go_test_cgocheck2 env GODEBUG=cgocheck=2 "$GO" test -count=1 -v ./...
echo "     $(grep -c '^--- PASS' "$out/go_test_cgocheck2.log") go tests passed," \
    "$(grep -c '^--- SKIP' "$out/go_test_cgocheck2.log") skipped"
check go_test_race "$GO" test -race -count=1 -run 'TestGoroutines|TestStepAbort|TestArguments' .

# the example: its versions (pat.h's through cgo, and the loaded libpat's), a checked run, a
# run whose reference uses another softmax scale (must fail), and no daemon (an errno)
want=$(sed -n 's/^#define PAT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' client/pat.h |
    paste -sd.)
model=(-layers 2 -q-heads 4 -kv-heads 2 -head-dim 64 -dtype f16)
example() { # expected status, then patexample's arguments; prints its output
    local want_rc=$1 rc=0
    shift
    "$out/patexample" "$@" >"$out/example.out" 2>&1 || rc=$?
    cat "$out/example.out"
    [ "$rc" -eq "$want_rc" ] || { echo "exit status $rc, want $want_rc"; return 1; }
}
example_version() {
    example 0 -version && grep -qx "pat binding $want (pat.h), libpat $want (loaded)" "$out/example.out"
}
example_checked() {
    example 0 "${model[@]}" -seqs 4 -prompt 100 -decode 3 && grep -q ': ok$' "$out/example.out"
}
example_wrong_scale() {
    example 1 "${model[@]}" -scale 0.2 && grep -q ': MISMATCH$' "$out/example.out"
}
example_no_daemon() {
    example 2 -socket "$dir/nope.sock" && grep -q 'errno 2 (no such file or directory)' "$out/example.out"
}
check example_version example_version
check example_checked example_checked
check example_wrong_scale_fails example_wrong_scale
check example_no_daemon example_no_daemon
grep -h '^patexample: [0-9]' "$out/example_checked.log"

# the daemon drains and exits 0 after the binding's sessions
if patd_stop 5; then
    echo "ok   patd_stop"
    passed=$((passed + 1))
else
    echo "FAIL patd_stop:"
    sed 's/^/    /' "$log"
    failed=$((failed + 1))
fi
summary
