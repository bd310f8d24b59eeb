#!/usr/bin/env bash
# The Python binding's tests (client/python/tests) against a real patd, with Debian's python3
# (numpy from python3-numpy). PATD_BIN and PATD_LIBPAT point at the build, PATD_ABI_LAYOUT at the
# program test_abi.py compares the ctypes structs with (make test sets all three).
set -eu
export PATD_BIN=${PATD_BIN:-build/bin/patd} PATD_LIBPAT=${PATD_LIBPAT:-build/lib/libpat.so.1}
export PATD_ABI_LAYOUT=${PATD_ABI_LAYOUT:-build/tests/pat_abi_layout}
PY=${PYTHON:-/usr/bin/python3}
exec "$PY" -W error::ResourceWarning -m unittest discover -s client/python/tests -v
