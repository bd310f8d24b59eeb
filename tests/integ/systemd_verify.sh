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
# patd@N: with CUDA_VISIBLE_DEVICES=N the process sees GPU N as its device 0, the default
# gpu.device; --instance=N gives it its own sockets, metrics port and drop-in. It must not name
# another device (--device=N asked for one that does not exist for N >= 1).
inst=$(sed 's/%i/3/g' systemd/patd@.service)
grep -q '^Environment=CUDA_VISIBLE_DEVICES=3$' <<<"$inst" || {
    echo "systemd-verify: patd@3 does not set CUDA_VISIBLE_DEVICES=3"; exit 1; }
for u in systemd/patd.service systemd/patd@.service; do
    grep -q '^Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID$' "$u" || {
        echo "systemd-verify: $u does not number GPUs as nvidia-smi does (CUDA_DEVICE_ORDER)"
        exit 1; }
done
exec3=$(grep '^ExecStart=' <<<"$inst")
grep -q -- '--instance=3' <<<"$exec3" || {
    echo "systemd-verify: patd@3 runs '$exec3' without --instance=3"; exit 1; }
if grep -q -- '--device=' <<<"$exec3" && ! grep -q -- '--device=0' <<<"$exec3"; then
    echo "systemd-verify: patd@3 runs '$exec3' beside CUDA_VISIBLE_DEVICES=3 (device 0 is GPU 3)"
    exit 1
fi
# The backends are the registry's, asked at run time: a build made with nvcc carries cuda, and
# --version says so (the daemon once decided on a macro only one object was compiled with, and
# served from the CPU on every GPU host).
backends=$("$patd" --version | sed -n 's/.*backends: \([a-z ]*\)).*/\1/p')
if [ -e "$B/libpatcuda.a" ] && ! grep -qw cuda <<<"$backends"; then
    echo "systemd-verify: this build compiled the cuda backend, patd --version says: $("$patd" --version)"
    exit 1
fi
# A device that was asked for and cannot be served is fatal, not a quiet cpu fallback, and the
# message names the cause: no cuda in this build, no NVIDIA driver, or no such device.
mkdir -p "$tmp/rt"
if out=$(CUDA_VISIBLE_DEVICES= timeout 20 "$patd" --runtime-dir="$tmp/rt" --metrics-port=0 \
         --device=7 2>&1); then
    echo "systemd-verify: patd --device=7 with no GPU visible started (and exited 0): $out"
    exit 1
fi
if grep -qw cuda <<<"$backends"; then
    want="gpu.device = 7 was asked for and cannot be served: (no NVIDIA driver|no CUDA device 7)"
else
    want="gpu.device = 7 was asked for and cannot be served: this build has no cuda backend"
fi
grep -qE "$want" <<<"$out" || {
    echo "systemd-verify: patd --device=7 with no GPU visible said: $out (want: $want)"; exit 1; }
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
