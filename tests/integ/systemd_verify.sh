#!/usr/bin/env bash
# systemd-analyze verify on the unit files. verify insists that every ExecStart binary exists:
# patd is pointed at this build; binaries this machine lacks (the NVIDIA MPS control daemon on
# a CI host without a driver) are pointed at /bin/true, and the script says so.
set -eu
B=${1:-build}
command -v systemd-analyze >/dev/null || { echo "systemd-verify: systemd-analyze missing"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
patd=$(readlink -f "$B/bin/patd")
for u in systemd/*.service; do
    sed "s|/usr/local/bin/patd|$patd|g" "$u" > "$tmp/$(basename "$u")"
done
for exe in /usr/bin/nvidia-cuda-mps-control; do
    if [ ! -x "$exe" ]; then
        echo "systemd-verify: $exe not on this machine; verified with /bin/true in its place"
        sed -i "s|$exe|/bin/true|g" "$tmp"/*.service
    fi
done
# a template is verified through an instance
cp "$tmp/patd@.service" "$tmp/patd@0.service"
out=$(cd "$tmp" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no \
      patd.service patd@0.service patd-mps.service 2>&1) || { echo "$out"; exit 1; }
# verify exits 0 on some warnings too: any line about our units fails the check
if echo "$out" | grep -E 'patd(@0|-mps)?\.service' ; then exit 1; fi
# patd@N: with CUDA_VISIBLE_DEVICES=N the process sees GPU N as ordinal 0, so the command line
# must ask for device 0 (it asked for N: a device that does not exist for N >= 1)
inst=$(sed 's/%i/3/g' systemd/patd@.service)
grep -q '^Environment=CUDA_VISIBLE_DEVICES=3$' <<<"$inst" || {
    echo "systemd-verify: patd@3 does not set CUDA_VISIBLE_DEVICES=3"; exit 1; }
dev=$(grep '^ExecStart=' <<<"$inst" | grep -o -- '--device=[0-9]*' || true)
[ "$dev" = "--device=0" ] || {
    echo "systemd-verify: patd@3 runs with '$dev' beside CUDA_VISIBLE_DEVICES=3 (want --device=0)"
    exit 1; }
# a device that was asked for and is not there is fatal, not a quiet cpu fallback
mkdir -p "$tmp/rt"
if out=$(CUDA_VISIBLE_DEVICES= timeout 20 "$patd" --runtime-dir="$tmp/rt" --metrics-port=0 \
         --device=7 2>&1); then
    echo "systemd-verify: patd --device=7 with no GPU visible started (and exited 0): $out"
    exit 1
fi
grep -q "gpu.device = 7 was asked for" <<<"$out" || {
    echo "systemd-verify: patd --device=7 with no GPU visible: $out"; exit 1; }
# the example config names socket_group = patd (systemd/patd.sysusers creates it); where the
# group does not exist, --check-config must say so, and the rest is checked without it
conf=systemd/patd.conf
if ! getent group patd >/dev/null; then
    if "$patd" --config "$conf" --check-config --runtime-dir=/tmp 2>/dev/null; then
        echo "systemd-verify: --check-config accepted socket_group 'patd', which does not exist"
        exit 1
    fi
    echo "systemd-verify: no group 'patd' here (refused, as it should be); checking the rest"
    sed '/^socket_group/d' systemd/patd.conf > "$tmp/patd.conf"
    conf=$tmp/patd.conf
fi
"$patd" --config "$conf" --check-config --runtime-dir=/tmp
echo "systemd-verify: patd.service patd@.service patd-mps.service verified"
