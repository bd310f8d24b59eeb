#!/usr/bin/env python3
"""Soak: patload replays a bundled trace again and again (--loop, fresh tokens every pass) against
one patd (cpu backend, a pool small enough that the prefix cache evicts and steps preempt) for
SOAK_SECONDS (default 120), while this script samples the daemon every second. Passes when:

  - patload finished every request it started (no failure, exit 0) over at least 2 passes;
  - the daemon's RSS and jemalloc's allocated bytes are flat: their peak over the last third
    of the run exceeds the peak over the first third (the warm-up: the cpu backend touches the
    whole KV pool at start, so what grows there is caches and the trace's working set) by at
    most RSS_BOUND_MIB (default 4 MiB) and ALLOC_BOUND_MIB (default 1 MiB);
  - blocks in use are flat: the peak over the last third is at most 10 % (+16 blocks) above
    the peak over the first half, and free + used + cached == the pool at every sample;
  - afterwards no connection, sequence or block is held and the pool's own check passes.

Prints one sample line every 10 s, then a verdict line per bound and "N passed, N failed".
PATD_BIN, PATLOAD_BIN, PATCTL_BIN point at the build (make soak sets them).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BUILD = os.environ.get("PATD_DEMO_BUILD", os.path.join(ROOT, "build"))
PATD = os.environ.get("PATD_BIN", os.path.join(BUILD, "bin", "patd"))
PATLOAD = os.environ.get("PATLOAD_BIN", os.path.join(BUILD, "bin", "patload"))
PATCTL = os.environ.get("PATCTL_BIN", os.path.join(BUILD, "bin", "patctl"))
SECONDS = float(os.environ.get("SOAK_SECONDS", "120"))
RSS_BOUND = float(os.environ.get("RSS_BOUND_MIB", "4")) * 2**20
ALLOC_BOUND = float(os.environ.get("ALLOC_BOUND_MIB", "1")) * 2**20
TRACE = os.path.join(ROOT, "tests", "traces", "gsp_multiturn_sample.jsonl.xz")
POOL_BLOCKS = 1024  # 16K tokens: the sample's working set overflows it, so blocks churn


def admin(sock, what):
    p = subprocess.run([PATCTL, "--socket", sock, "--timeout", "5000", what],
                       capture_output=True, text=True, check=False)
    return p.stdout if p.returncode == 0 else ""


def status(sock, check=False):
    out = {}
    for line in admin(sock, "status").splitlines():
        k, _, v = line.partition(" ")
        out[k] = v
    if check:  # the pool invariant check, O(blocks) under the pool lock: not on every sample
        words = admin(sock, "check").split()  # "pool_check ok (0.1 ms)"
        out["pool_check"] = words[1] if len(words) > 1 else "FAILED"
    return out


def metric(sock, name):
    for line in admin(sock, "stats").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return -1.0


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def main():
    d = tempfile.mkdtemp(prefix="patd-soak.")
    sock = os.path.join(d, "patd.sock")
    log = open(os.path.join(d, "patd.log"), "w")
    daemon = subprocess.Popen([PATD, "--runtime-dir=" + d, "--metrics-port=0",
                               "--blocks=%d" % POOL_BLOCKS], stderr=log)
    results = []

    def check(name, ok, detail):
        results.append(ok)
        print("%s %-44s %s" % ("ok  " if ok else "FAIL", name, detail), flush=True)

    try:
        for _ in range(400):
            if status(sock).get("state") == "serving":
                break
            time.sleep(0.05)
        summary = os.path.join(d, "summary.json")
        load = subprocess.Popen(
            [PATLOAD, "--socket", sock, "--quiet", "--loop", "--duration", str(SECONDS),
             "--scale", "0.25", "--speed", "0", "--concurrency", "32", "--json", summary, TRACE],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        samples = []  # (t, rss, allocated, used, cached, free, total)
        t0 = time.time()
        while load.poll() is None:
            t = time.time() - t0
            st = status(sock)
            if st:
                samples.append((t, rss_bytes(daemon.pid),
                                metric(sock, 'patd_jemalloc_bytes{stat="allocated"}'),
                                int(st["blocks_used"]), int(st["blocks_cached"]),
                                int(st["blocks_free"]), int(st["blocks_total"])))
                if len(samples) % 10 == 1:
                    s = samples[-1]
                    print("  t=%5.1f s  rss %6.1f MiB  allocated %6.2f MiB  blocks used %4d "
                          "cached %4d free %4d" % (s[0], s[1] / 2**20, s[2] / 2**20, s[3], s[4],
                                                   s[5]), flush=True)
            time.sleep(1.0)
        out = load.stdout.read()
        rc = load.wait()
        print(out.rstrip())
        check("patload exit status 0", rc == 0, "exit %d" % rc)
        with open(summary) as f:
            s = json.load(f)
        check("no request failed, >= 2 passes", s["failed"] == 0 and s["config"]["passes"] >= 2
              and s["done"] > 0, "%d done, %d failed, %d passes, %d preemptions" % (
                  s["done"], s["failed"], s["config"]["passes"], s["preemptions"]))

        n = len(samples)
        first_q = samples[: max(1, n // 3)]  # warm-up
        first_h = samples[: max(1, n // 2)]
        last_q = samples[n - max(1, n // 3):]
        peak = lambda rows, k: max(r[k] for r in rows)  # noqa: E731
        grow = peak(last_q, 1) - peak(first_q, 1)
        check("daemon RSS flat (<= %.0f MiB growth)" % (RSS_BOUND / 2**20), grow <= RSS_BOUND,
              "warm-up peak %.1f MiB, last-third peak %.1f MiB (%+.2f MiB)" % (
                  peak(first_q, 1) / 2**20, peak(last_q, 1) / 2**20, grow / 2**20))
        agrow = peak(last_q, 2) - peak(first_q, 2)
        check("jemalloc allocated flat (<= %.0f MiB growth)" % (ALLOC_BOUND / 2**20),
              agrow <= ALLOC_BOUND, "warm-up peak %.2f MiB, last-third peak %.2f MiB" % (
                  peak(first_q, 2) / 2**20, peak(last_q, 2) / 2**20))
        bound = peak(first_h, 3) * 1.1 + 16
        check("blocks in use flat", peak(last_q, 3) <= bound,
              "first-half peak %d, last-third peak %d (bound %.0f)" % (
                  peak(first_h, 3), peak(last_q, 3), bound))
        bad = [r for r in samples if r[3] + r[4] + r[5] != r[6]]
        check("free + used + cached == pool at every sample", not bad and n > 0,
              "%d samples, %d inconsistent" % (n, len(bad)))
        time.sleep(0.5)
        st = status(sock, check=True)
        check("nothing held afterwards, pool check ok",
              st.get("connections") == "0" and st.get("sequences") == "0"
              and st.get("blocks_used") == "0" and st.get("pool_check") == "ok",
              "connections %s sequences %s blocks_used %s pool_check %s" % (
                  st.get("connections"), st.get("sequences"), st.get("blocks_used"),
                  st.get("pool_check")))
    finally:
        daemon.send_signal(signal.SIGTERM)
        drc = daemon.wait(timeout=30)
        log.close()
    results.append(drc == 0)
    print("%s patd drained and exited %d" % ("ok  " if drc == 0 else "FAIL", drc))
    passed = sum(results)
    print("\n%d passed, %d failed" % (passed, len(results) - passed))
    if passed == len(results):
        subprocess.run(["rm", "-rf", d], check=False)
    else:
        print("patd log kept in %s" % d)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
