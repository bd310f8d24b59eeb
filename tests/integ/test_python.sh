#!/usr/bin/env bash
# The Python binding's tests (client/python/tests) against a real patd, with Debian's python3
# (numpy from python3-numpy). PATD_BIN and PATD_LIBPAT point at the build (make test sets them).
set -eu
export PATD_BIN=${PATD_BIN:-build/bin/patd} PATD_LIBPAT=${PATD_LIBPAT:-build/lib/libpat.so.1}
PY=${PYTHON:-/usr/bin/python3}
exec "$PY" -W error::ResourceWarning -m unittest discover -s client/python/tests -v
