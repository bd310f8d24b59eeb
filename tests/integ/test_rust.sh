#!/usr/bin/env bash
# The Rust client (client/rust) with Debian's toolchain only (/usr/bin/cargo 1.65, rustc 1.63,
# offline: the crates have no dependencies): pat-sys's bindings.rs regenerated from client/pat.h
# and compared with the committed one; the workspace built into build/rust (warnings are errors,
# the source tree gains no file) and its formatting checked; then, against a patd started here on
# the cpu backend, `cargo test` (unit tests, bindgen's layout tests, the README's snippet,
# pat/tests/daemon.rs) and the example frontend run as a user would (no LD_LIBRARY_PATH: its rpath
# finds libpat), which checks every output row against float64: after another client cached KV
# of its own under the Go example's prompt ids (1000, ...), which the example's per-run token
# base keeps it off (pinned to 1000, its check fails), and with a wrong softmax scale (its check
# fails: the negative control). Last, the daemon's pool check, no sequence left open, and a clean
# exit on SIGTERM. PATD_BIN, PATCTL_BIN and PATD_LIBPAT point at the build (make run-tests sets
# them). Prints each check and ends with "N passed, N failed"; exit status 1 when one failed.
# shellcheck disable=SC2317 # the checks are functions that check() calls
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
PATD_BIN=$(realpath "${PATD_BIN:-$root/build/bin/patd}")
PATCTL_BIN=$(realpath "${PATCTL_BIN:-$root/build/bin/patctl}")
PATD_LIBPAT=$(realpath "${PATD_LIBPAT:-$root/build/lib/libpat.so.1}")
# Debian's toolchain whatever else PATH holds (CI has nothing else)
cargo=/usr/bin/cargo
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTFLAGS="-D warnings"
export CARGO_TARGET_DIR=$root/build/rust
export CARGO_HOME=$CARGO_TARGET_DIR/cargo-home # no ~/.cargo config or registry
export CARGO_NET_OFFLINE=true
PAT_LIB_DIR=$(dirname "$PATD_LIBPAT")
export PAT_LIB_DIR
unset LD_LIBRARY_PATH
ws=$root/client/rust

# shellcheck source=tests/integ/checks.sh
. "$root/tests/integ/checks.sh"
scratch patd-rust
sock=$tmp/run/patd.sock

LOGGED_TAIL=60

tools() {
    local t missing=
    for t in "$cargo" "$RUSTC" "$RUSTDOC" /usr/bin/bindgen /usr/bin/rustfmt; do
        [ -x "$t" ] || missing="$missing $t"
    done
    [ -z "$missing" ] || echo "missing:$missing (make deps installs rustc, cargo, bindgen, rustfmt)"
    [ -z "$missing" ] && [ -e "$PAT_LIB_DIR/libpat.so" ]
}
check "Debian's cargo, rustc, bindgen and rustfmt; libpat.so in $PAT_LIB_DIR" tools
[ "$failed" -eq 0 ] || finish

bindings() { # what bindgen.sh makes of pat.h now is the committed bindings.rs
    logged "$tmp/bindgen.log" "$ws/pat-sys/bindgen.sh" "$tmp/bindings.rs" || return 1
    diff -u "$ws/pat-sys/src/bindings.rs" "$tmp/bindings.rs" >"$tmp/bindings.diff" && return 0
    head -n 40 "$tmp/bindings.diff"
    echo "client/pat.h and client/rust/pat-sys/src/bindings.rs differ: run" \
        "client/rust/pat-sys/bindgen.sh and commit its output"
    return 1
}
check "pat-sys/src/bindings.rs is what bindgen makes of client/pat.h" bindings

tree() { find "$ws" -type f | sort; }
tree >"$tmp/tree.before"
check "cargo build --workspace --all-targets (offline, --locked, -D warnings)" \
    logged "$tmp/build.log" "$cargo" build --manifest-path "$ws/Cargo.toml" --workspace \
    --all-targets --offline --locked
check "the build left no file in client/rust" diff -u "$tmp/tree.before" <(tree)
fmt() {
    /usr/bin/rustfmt --edition 2021 --check "$ws"/pat-sys/build.rs "$ws"/pat-sys/src/lib.rs \
        "$ws"/pat/build.rs "$ws"/pat/src/lib.rs "$ws"/pat/examples/*.rs "$ws"/pat/tests/*.rs
}
check "rustfmt --check (Debian's rustfmt, its defaults)" logged "$tmp/fmt.log" fmt
[ "$failed" -eq 0 ] || finish

mkdir -p "$tmp/run"
"$PATD_BIN" --backend=cpu --runtime-dir="$tmp/run" --metrics-port=0 2>"$tmp/patd.log" &
pid=$!
started() {
    for _ in $(seq 100); do
        "$PATCTL_BIN" --socket "$sock" --timeout 200 status >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    tail -n 20 "$tmp/patd.log"
    return 1
}
check "patd on the cpu backend (its default model: f16)" started
[ "$failed" -eq 0 ] || finish

tests() {
    PAT_TEST_SOCKET=$sock logged "$tmp/test.log" "$cargo" test \
        --manifest-path "$ws/Cargo.toml" --workspace --offline --locked
    local rc=$?
    grep -E '^(test result|     Running|   Doc-tests)' "$tmp/test.log" | sed 's/^ */  /'
    return "$rc"
}
check "cargo test: unit, layout, README and daemon tests" tests

foreign() { # pat/tests/daemon.rs's ignored test: blocks of token ids 1000.. with other KV
    PAT_TEST_SOCKET=$sock logged "$tmp/foreign.log" "$cargo" test \
        --manifest-path "$ws/Cargo.toml" --offline --locked -p pat --test daemon -- \
        --ignored --exact foreign_prompt_in_the_cache &&
        grep -q '^test result: ok. 1 passed' "$tmp/foreign.log"
}
check "another client's KV cached under token ids 1000.. (the Go example's prompt)" foreign

example() { # example RC ARGS...: run from elsewhere, as a user would (the rpath finds libpat)
    local want=$1 out rc
    shift
    out=$(cd "$tmp" && "$CARGO_TARGET_DIR/debug/examples/shared_prompt" --socket "$sock" "$@" 2>&1)
    rc=$?
    echo "$out" | sed 's/^/  /'
    case $want in
    0) [ "$rc" -eq 0 ] && grep -q '^shared_prompt: OK ' <<<"$out" ;;
    *) [ "$rc" -eq "$want" ] && grep -q '^shared_prompt: FAILED ' <<<"$out" ;;
    esac
}
check "example shared_prompt: O of every row and layer within its float64 bound" \
    example 0 --clients 2 --seqs 4 --decode 4
check "example shared_prompt --token-base 1000 (the other client's blocks): its check fails" \
    example 1 --clients 1 --seqs 2 --decode 1 --token-base 1000
check "example shared_prompt --scale 0.2 (not the daemon's): its check fails" \
    example 1 --clients 1 --seqs 2 --decode 1 --scale 0.2

daemon_clean() { # everything the tests and the example opened was closed; the pool consistent
    local st chk
    st=$("$PATCTL_BIN" --socket "$sock" status) && chk=$("$PATCTL_BIN" --socket "$sock" check) ||
        return 1
    echo "  $chk; $(grep -E '^(sequences|connections) ' <<<"$st" | tr '\n' ' ')"
    grep -qx 'sequences 0' <<<"$st" && grep -q '^pool_check ok' <<<"$chk"
}
check "patd: pool check ok, no sequence left open" daemon_clean

check "patd stopped cleanly" stop
finish
