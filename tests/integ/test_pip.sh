#!/usr/bin/env bash
# The Python binding as a user installs it: a fresh virtualenv over Debian's python3 (numpy from
# python3-numpy, setuptools and wheel from python3-setuptools and python3-wheel, so no network),
# the README's `pip install --no-build-isolation <tree>/client/python` run from outside the tree
# with neither PATD_LIBPAT nor LD_LIBRARY_PATH set: the only libpat the binding can find is the
# one the package carries, compiled from this tree by client/python/setup.py. Checks the versions
# `python -m patd --version` prints (client/pat.h's, a libpat inside the venv, the daemon's), that
# `pip wheel` holds patd/libpat.so.1, and one prefill step over every layer of a real cpu patd
# against a float64 reference. PATD_BIN is the daemon (make run-tests sets it). Prints each check
# and ends with "N passed, N failed"; exit status 1 when one failed.
# shellcheck disable=SC2317 # the checks are functions that check() calls
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
PATD_BIN=$(realpath "${PATD_BIN:-$root/build/bin/patd}")
# what the user's shell would not have: make run-tests points PATD_LIBPAT at build/lib
unset PATD_LIBPAT LD_LIBRARY_PATH PYTHONPATH
pat_h() { awk -v n="PAT_VERSION_$1" '$2 == n { print $3 }' "$root/client/pat.h"; }
want=$(pat_h MAJOR).$(pat_h MINOR).$(pat_h PATCH)

# shellcheck source=tests/integ/checks.sh
. "$root/tests/integ/checks.sh"
scratch patd-pip
py=$tmp/venv/bin/python
sock=$tmp/run/patd.sock
cd "$tmp" || exit 1


check "a venv over /usr/bin/python3" logged "$tmp/venv.log" \
    /usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
check "pip install --no-build-isolation $root/client/python (from $tmp)" logged "$tmp/pip.log" \
    "$tmp/venv/bin/pip" install --disable-pip-version-check --no-build-isolation "$root/client/python"
[ "$failed" -eq 0 ] || finish

out=$("$py" -m patd --version --socket "$tmp/none.sock")
echo "$out"
has() { [[ $out == *"$1"* ]]; }
check "python -m patd --version: binding $want (client/pat.h)" has "patd binding $want"$'\n'
check "python -m patd --version: libpat $want from the venv" has "libpat $want ($tmp/venv/"
check "python -m patd --version: the bundled libpat" has "/site-packages/patd/libpat.so.1)"

whl() { # the one wheel pip wheel wrote holds the library and pat.h's version
    local w=("$tmp"/wheels/patd-"$want"-*.whl)
    [ ${#w[@]} -eq 1 ] && [ -f "${w[0]}" ] && echo "${w[0]##*/}" &&
        "$py" -c 'import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(0 if "patd/libpat.so.1" in names else "no patd/libpat.so.1 in %s" % names)' "${w[0]}"
}
check "pip wheel --no-deps --no-build-isolation" logged "$tmp/wheel.log" \
    "$tmp/venv/bin/pip" wheel --disable-pip-version-check --no-build-isolation --no-deps \
    -w "$tmp/wheels" "$root/client/python"
check "the wheel is patd-$want and holds patd/libpat.so.1" whl

mkdir -p "$tmp/run"
"$PATD_BIN" --backend=cpu --runtime-dir="$tmp/run" --metrics-port=0 --layers=3 --q-heads=4 \
    --kv-heads=2 --head-dim=64 --dtype=f16 --blocks=64 2>"$tmp/patd.log" &
pid=$!

session() { # one prefill step of a 37-token prompt over all 3 layers, O against float64
    "$py" - "$sock" "$tmp/venv/" <<'EOF'
import sys, time
import numpy as np
import patd

sock, venv = sys.argv[1:]
assert patd.__file__.startswith(venv), patd.__file__
assert patd.library_path().startswith(venv), patd.library_path()
for _ in range(400):  # 10 s for the daemon to answer
    try:
        patd.status(socket=sock, timeout_ms=200)
        break
    except patd.PatError:
        time.sleep(0.025)
model = patd.Model(n_layers=3, q_heads=4, kv_heads=2, head_dim=64, dtype=patd.F16)
scale = 1.0 / np.sqrt(model.head_dim)
rng = np.random.default_rng(7)
prompt = list(range(1000, 1037))
n = len(prompt)
worst = 0.0
with patd.Conn(model, max_batch_tokens=64, socket=sock) as c:
    seq, cached = c.seq_open(prompt)
    assert cached == 0, cached
    c.step_begin([seq], [n], prompt)
    for layer in range(model.n_layers):
        q = rng.uniform(-1, 1, (n, 4, 64)).astype(np.float16)
        k = rng.uniform(-1, 1, (n, 2, 64)).astype(np.float16)
        v = rng.uniform(-1, 1, (n, 2, 64)).astype(np.float16)
        c.q[:n], c.k[:n], c.v[:n] = q, k, v
        c.o[:n] = np.nan
        c.attend(layer)
        out = c.o[:n].astype(np.float64)
        for t in range(n):  # causal: row t attends over positions 0..t
            for h in range(4):
                K = k[:t + 1, h // 2].astype(np.float64)
                V = v[:t + 1, h // 2].astype(np.float64)
                s = K @ q[t, h].astype(np.float64) * scale
                p = np.exp(s - s.max())
                ref = (p / p.sum()) @ V
                err = np.linalg.norm(out[t, h] - ref) / np.linalg.norm(ref)
                assert err < 1e-2, (layer, t, h, err)
                worst = max(worst, err)
    info = c.step_end()
    assert info["committed"] == 1 and info["layers_done"] == 3, info
    c.seq_close(seq)
print("%d tokens x 3 layers x 4 heads, worst relative error %.2e" % (n, worst))
EOF
}
check "a session on the daemon: one prefill step, O against float64" session

out=$("$py" -m patd --version --socket "$sock")
echo "$out"
check "python -m patd --version: the daemon's $want" has "daemon $want, wire protocol"

check "patd stopped cleanly" stop
finish
