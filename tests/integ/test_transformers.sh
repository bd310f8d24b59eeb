#!/usr/bin/env bash
# The transformers integration (client/python/tests/test_transformers.py: Llama- and
# Mistral-shaped models with random weights generating through a real patd on the cpu backend,
# tokens and logits against transformers' own attention) with the Python of build/hf-venv, which
# `make deps` makes (Debian's python3 and python3-torch, transformers from PyPI). There a skip is
# a failure (PATD_REQUIRE_TRANSFORMERS=1). Without that venv (make deps could not reach PyPI, its
# reason in build/hf-venv.log) this says it skipped and why.
set -eu
export PATD_BIN=${PATD_BIN:-build/bin/patd} PATD_LIBPAT=${PATD_LIBPAT:-build/lib/libpat.so.1}
PY=${HF_PYTHON:-build/hf-venv/bin/python}
if ! [ -x "$PY" ]; then
    echo "test_transformers: SKIPPED: no $PY ($(cat build/hf-venv.log 2>/dev/null | tail -1))"
    echo "0 passed, 0 failed (skipped: run make deps with PyPI reachable)"
    exit 0
fi
"$PY" -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__)'
PATD_REQUIRE_TRANSFORMERS=1 "$PY" -W error::ResourceWarning -m unittest -v \
    client/python/tests/test_transformers.py
