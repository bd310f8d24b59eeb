#!/bin/sh
# Generates src/bindings.rs from client/pat.h (through wrapper.h, which adds errno.h's E*
# values) with Debian's bindgen 0.60 and rustfmt 1.63: the output depends on both tools'
# versions, so these two are the ones. tests/integ/test_rust.sh runs it into a scratch file and
# fails when the result differs from the committed one.
#   bindgen.sh [OUT]     OUT defaults to src/bindings.rs beside this script
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/src/bindings.rs}
BINDGEN=${BINDGEN:-/usr/bin/bindgen}
RUSTFMT=${RUSTFMT:-/usr/bin/rustfmt}
export RUSTFMT
for tool in "$BINDGEN" "$RUSTFMT"; do
    [ -x "$tool" ] || {
        echo "$0: no $tool (make deps installs Debian's bindgen and rustfmt)" >&2
        exit 1
    }
done
# rustfmt reads a rustfmt.toml from the directory it runs in: always this one
cd "$here"
"$BINDGEN" --size_t-is-usize --no-prepend-enum-name \
    --allowlist-function 'pat_.*' --allowlist-type 'pat_.*' \
    --allowlist-var 'PAT_.*' --allowlist-var 'E[A-Z0-9]+' \
    --output "$out" wrapper.h -- -I"$here/../.."
