#!/usr/bin/env bash
# The Python binding's tests (client/python/tests) against a real patd, with Debian's python3
# (numpy from python3-numpy). PATD_BIN and PATD_LIBPAT point at the build, PATD_ABI_LAYOUT at the
# program test_abi.py compares the ctypes structs with (make test sets all three). Then the
# package is installed with pip (offline, into a scratch directory) and imported from there, away
# from the source tree: `python3 -m patd --version` names the binding and the libpat it loaded.
set -eu
export PATD_BIN=${PATD_BIN:-build/bin/patd} PATD_LIBPAT=${PATD_LIBPAT:-build/lib/libpat.so.1}
export PATD_ABI_LAYOUT=${PATD_ABI_LAYOUT:-build/tests/pat_abi_layout}
PATD_LIBPAT=$(realpath "$PATD_LIBPAT")
PY=${PYTHON:-/usr/bin/python3}
"$PY" -W error::ResourceWarning -m unittest discover -s client/python/tests -v

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip install --quiet --root-user-action=ignore --no-build-isolation --no-deps --no-index \
    --target "$tmp/site" \
    client/python
cd "$tmp"
out=$(PYTHONPATH="$tmp/site" "$PY" -m patd --version --socket "$tmp/none.sock" || true)
echo "$out"
where=$(PYTHONPATH="$tmp/site" "$PY" -c 'import patd; print(patd.__file__)')
case "$where" in
"$tmp/site/"*) ;;
*) echo "pip install: patd imported from $where, not the installed copy"; exit 1 ;;
esac
grep -q "^patd binding [0-9]" <<<"$out" && grep -q "^libpat [0-9.]* ($PATD_LIBPAT)" <<<"$out" || {
    echo "pip install: python3 -m patd --version said: $out"
    exit 1
}
echo "pip install: ok ($where)"
