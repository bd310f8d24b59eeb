#!/usr/bin/env python3
"""patload against a real patd (cpu backend): every bundled trace sample replays with zero
errors and a summary whose counts match the trace (computed here, independently of patload's
C code); a patload killed mid-replay leaves the daemon's block accounting clean and a restarted
one replays in full; bad traces and a missing daemon get their documented exit codes.

Standard library only. PATD_BIN, PATLOAD_BIN, PATCTL_BIN point at the build (make test sets
them); the samples are tests/traces (README there).
"""

import json
import lzma
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BUILD = os.environ.get("PATD_DEMO_BUILD", os.path.join(ROOT, "build"))
PATD = os.environ.get("PATD_BIN", os.path.join(BUILD, "bin", "patd"))
PATLOAD = os.environ.get("PATLOAD_BIN", os.path.join(BUILD, "bin", "patload"))
PATCTL = os.environ.get("PATCTL_BIN", os.path.join(BUILD, "bin", "patctl"))
TRACES = os.path.join(ROOT, "tests", "traces")
# the sanitizer pass (make test-asan: an -O0 daemon) replays the first 24 requests of each sample
LIGHT = int(os.environ.get("PATLOAD_TEST_LIMIT", "0"))

# sample, patload arguments (lengths scaled so a 2-core CI machine replays each in seconds)
SAMPLES = [
    ("mooncake_conversation_sample.jsonl", ["--scale", "0.015625", "--speed", "8", "--spread"]),
    ("gsp_default_sample.jsonl.xz", ["--scale", "0.25", "--speed", "0", "--concurrency", "16"]),
    ("gsp_multiturn_sample.jsonl.xz", ["--scale", "0.25", "--speed", "0"]),
    ("azure_conv_sample.csv", ["--scale", "0.25", "--speed", "8", "--shared-prefix", "64"]),
    ("azure_code_sample.csv", ["--scale", "0.125", "--speed", "40"]),
]


def read_rows(path):
    """The trace's requests: dicts with input_length, output_length, hash_ids (maybe None)."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    if lines[0].startswith("{"):
        return [json.loads(ln) for ln in lines]
    assert lines[0] == "TIMESTAMP,ContextTokens,GeneratedTokens"
    rows = []
    for ln in lines[1:]:
        _, ctx, gen = ln.split(",")
        rows.append({"input_length": int(ctx), "output_length": int(gen), "hash_ids": None})
    return rows


def rnd(x):
    return math.floor(x + 0.5)


def expected(path, args):
    """Replayed prompt and output tokens, from the documented shaping rules."""
    opt, i = {}, 0
    while i < len(args):  # options with a value, and the flag --spread
        if args[i] == "--spread":
            i += 1
            continue
        opt[args[i]] = args[i + 1]
        i += 2
    scale = float(opt.get("--scale", 1))
    shared = int(opt.get("--shared-prefix", 0))
    rows = read_rows(path)
    if "--limit" in opt:
        rows = rows[: int(opt["--limit"])]
    hashed = rows[0].get("hash_ids") is not None
    if hashed:
        # the block size: the power of two with ceil(input / block) == len(hash_ids) everywhere
        block = next(b for b in (512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
                     if all(-(-r["input_length"] // b) == len(r["hash_ids"]) for r in rows))
        br = max(1, rnd(block * scale))
    prompt = output = 0
    for r in rows:
        if hashed:
            n = len(r["hash_ids"])
            rem = r["input_length"] - (n - 1) * block
            prompt += (n - 1) * br + max(1, -(-rem * br // block))
        else:
            prompt += max(1, rnd(r["input_length"] * scale)) + shared
        output += max(1, rnd(r["output_length"] * scale))
    return len(rows), prompt, output


class PatloadCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="patload-test.")
        cls.sock = os.path.join(cls.dir, "patd.sock")
        cls.log = open(os.path.join(cls.dir, "patd.log"), "w")
        cls.proc = subprocess.Popen([PATD, "--runtime-dir=" + cls.dir, "--metrics-port=0",
                                     "--blocks=8192"], stderr=cls.log)
        deadline = time.time() + 20
        while time.time() < deadline:
            if cls.status_of(cls.sock).get("state") == "serving":
                return
            time.sleep(0.05)
        raise RuntimeError("patd did not start (log: %s)" % cls.log.name)

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        rc = cls.proc.wait(timeout=15)
        cls.log.close()
        if rc == 0:
            subprocess.run(["rm", "-rf", cls.dir], check=False)
        assert rc == 0, "patd exited %d (log in %s)" % (rc, cls.dir)

    @staticmethod
    def status_of(sock, check=False):
        p = subprocess.run([PATCTL, "--socket", sock, "--timeout", "2000", "status"],
                           capture_output=True, text=True, check=False)
        out = {}
        for line in p.stdout.splitlines():
            k, _, v = line.partition(" ")
            out[k] = v
        if check:  # the pool invariant check, O(blocks) under the pool lock: not while polling
            c = subprocess.run([PATCTL, "--socket", sock, "--timeout", "2000", "check"],
                               capture_output=True, text=True, check=False)
            words = c.stdout.split()  # "pool_check ok (0.1 ms)"
            out["pool_check"] = words[1] if c.returncode == 0 and len(words) > 1 else "FAILED"
        return out

    def status(self, check=False):
        return self.status_of(self.sock, check)

    def patload(self, trace, args, timeout=240):
        out = os.path.join(self.dir, "summary.json")
        cmd = [PATLOAD, "--socket", self.sock, "--quiet", "--json", out, trace] + args
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        summary = None
        if os.path.exists(out):
            with open(out) as f:
                summary = json.load(f)
            os.unlink(out)
        return p, summary

    def assert_clean(self, wait_s=10):
        """No connection, sequence or block left in use, and the pool's own check passes."""
        deadline = time.time() + wait_s
        while True:
            st = self.status()
            clean = (st.get("connections") == "0" and st.get("sequences") == "0"
                     and st.get("blocks_used") == "0")
            if clean or time.time() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(st.get("connections"), "0", st)
        self.assertEqual(st.get("sequences"), "0", st)
        self.assertEqual(st.get("blocks_used"), "0", st)
        self.assertEqual(self.status(check=True).get("pool_check"), "ok", st)

    def replay_sample(self, name, args):
        path = os.path.join(TRACES, name)
        if LIGHT:
            args = args + ["--limit", str(LIGHT)]
        n, prompt, output = expected(path, args)
        p, s = self.patload(path, args)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIsNotNone(s)
        self.assertEqual(s["requests"], n)
        self.assertEqual(s["done"], n)
        self.assertEqual(s["failed"], 0)
        self.assertEqual(s["not_started"], 0)
        self.assertEqual(s["errors"], {})
        self.assertEqual(s["prompt_tokens"], prompt)
        self.assertEqual(s["output_tokens"], output)
        # every prompt token was either found in the prefix cache or computed (preemptions
        # recompute, hence >=); every step carried the decode tokens of its sequences
        self.assertGreaterEqual(s["cached_tokens"] + s["prefill_tokens"], prompt)
        self.assertEqual(s["ttft_ms"]["n"], n)
        self.assertEqual(s["e2e_ms"]["n"], n)
        self.assertGreater(s["steps"], 0)
        self.assertGreater(s["qc_bytes"], 0)
        self.assertLessEqual(s["kv_bytes"], s["qc_bytes"])
        self.assertIn("TTFT", p.stdout)
        self.assert_clean()
        return s

    def test_samples(self):
        for name, args in SAMPLES:
            with self.subTest(trace=name):
                t = time.time()
                s = self.replay_sample(name, args)
                print("  %-38s %3d done in %5.1f s, prefix hit %.1f %%, KV %.2fx less" % (
                    name, s["done"], time.time() - t, 100 * s["prefix_hit"],
                    s["qc_bytes"] / max(1, s["kv_bytes"])), file=sys.stderr)

    def test_multiturn_reuses_replies(self):
        # A later turn finds the earlier turn's prompt *and its reply* in the prefix cache.
        # One request at a time (concurrently admitted twins of a prefix stay private copies,
        # see the README's patload notes). Scale 1/8: 16-token trace blocks -> 2 tokens, the
        # 256-token reply -> 32, the new 128-token question -> 16; patd caches whole 16-token
        # blocks, so a turn recomputes its question plus the reply's partial last block: 32
        # tokens (48 if the reply were not reused).
        path = os.path.join(TRACES, "gsp_multiturn_sample.jsonl.xz")
        csv = os.path.join(self.dir, "turns.csv")
        args = ["--scale", "0.125", "--speed", "0", "--seed", "77", "--concurrency", "1",
                "--csv", csv]
        p, s = self.patload(path, args)
        self.assertEqual(p.returncode, 0, p.stderr)
        turn_of = {}
        opener = lzma.open
        with opener(path, "rt") as f:
            for lineno, ln in enumerate(f, 1):
                turn_of[lineno] = json.loads(ln)["turn"]
        with open(csv) as f:
            rows = [r.split(",") for r in f.read().splitlines()[1:]]
        later = [r for r in rows if turn_of[int(r[0])] > 1]
        self.assertEqual(len(later), 48)
        for r in later:
            uncached = int(r[6]) - int(r[8])
            self.assertLessEqual(uncached, 33, "line %s: %s" % (r[0], r))

    def test_kill_and_restart(self):
        path = os.path.join(TRACES, "gsp_multiturn_sample.jsonl.xz")
        args = ["--scale", "0.25", "--speed", "0", "--seed", "5"]
        proc = subprocess.Popen([PATLOAD, "--socket", self.sock, "--quiet", path] + args,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:  # kill it mid-replay: sequences open, blocks held
            st = self.status()
            if int(st.get("sequences", 0)) >= 4 and int(st.get("blocks_used", 0)) > 0:
                break
            time.sleep(0.02)
        else:
            self.fail("patload never had sequences open: %s" % st)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self.assert_clean()
        self.replay_sample("gsp_multiturn_sample.jsonl.xz", args)

    def test_interrupt_prints_partial_summary(self):
        path = os.path.join(TRACES, "gsp_default_sample.jsonl.xz")
        proc = subprocess.Popen([PATLOAD, "--socket", self.sock, "--quiet", path, "--scale",
                                 "0.25", "--speed", "0", "--seed", "9"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("(interrupted)", out)
        self.assert_clean()

    def own_patd_replay(self, patd_args, trace, args):
        """A fresh patd of its own (an empty prefix cache; patd_args added), one patload replay
        against it (--json summary); returns (summary, the daemon's final status with the pool
        check). The daemon must stop cleanly."""
        d = tempfile.mkdtemp(prefix="patload-own.")
        sock = os.path.join(d, "patd.sock")
        with open(os.path.join(d, "patd.log"), "w") as log:
            proc = subprocess.Popen([PATD, "--runtime-dir=" + d, "--metrics-port=0"] + patd_args,
                                    stderr=log)
        try:
            deadline = time.time() + 20
            while self.status_of(sock).get("state") != "serving":
                self.assertLess(time.time(), deadline, "own patd did not start")
                time.sleep(0.05)
            out = os.path.join(d, "s.json")
            p = subprocess.run([PATLOAD, "--socket", sock, "--quiet", "--json", out,
                                os.path.join(TRACES, trace)] + args,
                               capture_output=True, text=True, timeout=240, check=False)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as f:
                return json.load(f), self.status_of(sock, check=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=15), 0)
            subprocess.run(["rm", "-rf", d], check=False)

    def assert_drained(self, st):
        self.assertEqual((st.get("sequences"), st.get("blocks_used"), st.get("pool_check")),
                         ("0", "0", "ok"))

    def test_pool_pressure_preempts_and_finishes(self):
        # a pool far smaller than the burst's working set: admission waits for room, refused
        # steps preempt, and every request still finishes (no livelock, nothing leaked). At scale
        # 0.125 the burst holds up to ~224 distinct blocks; 150 blocks preempted 10 times in 4 s
        # (-O2). The earlier 0.25 scale on 200 blocks preempted 42 times and took minutes under
        # ASan on CI's two cores
        s, st = self.own_patd_replay(["--blocks=150"], "gsp_multiturn_sample.jsonl.xz",
                                     ["--scale", "0.125", "--speed", "0", "--concurrency", "64"])
        self.assertEqual((s["done"], s["failed"]), (64, 0))
        self.assertGreater(s["preemptions"], 0)
        self.assertLessEqual(s["kv_blocks_peak"], 150)
        self.assert_drained(st)

    def test_wait_twins(self):
        # a burst of 16 requests over 4 shared prompts, all at once, on an empty cache: opened
        # together, twins find nothing published and each prefills the prompt again (the summary
        # counts those in-flight tokens); with --wait-twins patload admits a twin once the first
        # has written the shared blocks, and the cache gives them (measured: 0 % -> 70.6 % of the
        # prompts cached, 4352 -> 1280 tokens prefilled)
        args = ["--scale", "0.125", "--speed", "0", "--limit", "16"]
        plain, st = self.own_patd_replay([], "gsp_default_sample.jsonl.xz", args)
        self.assert_drained(st)
        wait, st = self.own_patd_replay([], "gsp_default_sample.jsonl.xz", args + ["--wait-twins"])
        self.assert_drained(st)
        for s in (plain, wait):
            self.assertEqual((s["done"], s["failed"]), (16, 0))
        self.assertEqual(plain["twin_waits"], 0)
        self.assertGreater(plain["inflight_tokens"], 0)
        self.assertGreater(wait["twin_waits"], 0)
        self.assertEqual(wait["inflight_tokens"], 0)
        # what the plain run could have had from its twins, the waiting run had from the cache
        self.assertGreaterEqual(wait["cached_tokens"],
                                plain["cached_tokens"] + plain["inflight_tokens"])
        self.assertLess(wait["prefill_tokens"], plain["prefill_tokens"])

    def test_bad_traces(self):
        cases = [
            ("bad1.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"ts": 1}\n',
             "line 2"),
            ("bad2.jsonl", '{"timestamp": 0, "input_length": 100, "output_length": 2, '
                           '"hash_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, '
                           '18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, '
                           '36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, '
                           '54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, '
                           '72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, '
                           '90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101]}\n',
             "hash_ids"),
            ("bad3.jsonl", '{"timestamp": 0, "input_length": 0, "output_length": 2}\n',
             "input_length"),
            ("bad4.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,12\n",
             "line 2"),
            ("bad5.txt", "hello\n", "neither"),
            ("bad6.jsonl", "", "no requests"),
            ("bad7.jsonl", '{"timestamp": 0, "input_length": 3, "output_length": 1}\n[1]\n',
             "line 2: not a JSON object"),
            ("bad8.jsonl.xz", "not xz at all", "xz"),
            ("bad9.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, '
                           '"session_id": 3}\n', "turn"),
        ]
        for name, text, needle in cases:
            with self.subTest(trace=name):
                path = os.path.join(self.dir, name)
                with open(path, "w") as f:
                    f.write(text)
                p = subprocess.run([PATLOAD, "--socket", self.sock, path], capture_output=True,
                                   text=True, timeout=30, check=False)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(needle, p.stderr)
        p = subprocess.run([PATLOAD, "--socket", self.sock, os.path.join(self.dir, "nope.jsonl")],
                           capture_output=True, text=True, timeout=30, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("No such file", p.stderr)
        p = subprocess.run([PATLOAD, "--speed", "-1", "x"], capture_output=True, text=True,
                           check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--speed", p.stderr)
        self.assert_clean()

    def test_no_daemon(self):
        p = subprocess.run([PATLOAD, "--socket", os.path.join(self.dir, "none.sock"),
                            os.path.join(TRACES, "azure_conv_sample.csv")],
                           capture_output=True, text=True, timeout=30, check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("no patd", p.stderr)

    def test_kv_dtype(self):
        """--kv-dtype asks for the pool the run needs: this daemon's (f16) serves and the
        summary names it; another is refused by the daemon with its reason (exit 3), a bad name
        by patload itself (exit 2). Against a daemon with an fp8 pool the summary says so, with
        its factor."""
        trace = os.path.join(TRACES, "azure_conv_sample.csv")
        p, s = self.patload(trace, ["--limit", "4", "--kv-dtype", "f16"])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(s["config"]["kv_pool"], "f16")
        p, _ = self.patload(trace, ["--limit", "4", "--kv-dtype", "fp8_e4m3"])
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("needs a KV pool of fp8_e4m3; this daemon's holds f16", p.stderr)
        p, _ = self.patload(trace, ["--limit", "4", "--kv-dtype", "fp4"])
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("--kv-dtype fp4", p.stderr)
        self.assert_clean()
        d = tempfile.mkdtemp(prefix="patload-fp8.")
        sock = os.path.join(d, "patd.sock")
        with open(os.path.join(d, "patd.log"), "w") as log:
            proc = subprocess.Popen([PATD, "--runtime-dir=" + d, "--metrics-port=0",
                                     "--blocks=8192", "--kv-dtype=fp8_e4m3", "--kv-scale=0.25"],
                                    stderr=log)
            try:
                deadline = time.time() + 20
                while self.status_of(sock).get("state") != "serving":
                    self.assertLess(time.time(), deadline, "patd did not start")
                    time.sleep(0.05)
                out = os.path.join(d, "summary.json")
                p = subprocess.run([PATLOAD, "--socket", sock, "--json", out, "--limit", "4",
                                    "--kv-dtype", "fp8_e4m3", trace],
                                   capture_output=True, text=True, timeout=120, check=False)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                self.assertIn("KV pool fp8_e4m3 x 0.25", p.stdout)
                with open(out) as f:
                    self.assertEqual(json.load(f)["config"]["kv_pool"], "fp8_e4m3 x 0.25")
            finally:
                proc.send_signal(signal.SIGTERM)
                self.assertEqual(proc.wait(timeout=15), 0)
        subprocess.run(["rm", "-rf", d], check=False)

    def test_csv_and_plot(self):
        # gnuplot is one of make's Debian packages; the GPU machine has none (plots from its
        # CSV files are drawn elsewhere with --replot)
        if not shutil.which("gnuplot") and os.environ.get("PATLOAD_NO_GNUPLOT_OK") == "1":
            self.skipTest("no gnuplot here")
        png = os.path.join(self.dir, "replay.png")
        csv = os.path.join(self.dir, "requests.csv")
        path = os.path.join(TRACES, "azure_conv_sample.csv")
        args = ["--scale", "0.125", "--speed", "0", "--csv", csv, "--plot", png]
        p, s = self.patload(path, args)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(csv) as f:
            rows = f.read().splitlines()
        self.assertEqual(rows[0].split(",")[0:3], ["line", "pass", "arrive_s"])
        self.assertEqual(len(rows) - 1, s["done"])
        self.assertTrue(all(r.endswith(",") for r in rows[1:]))  # no error column set
        with open(png + ".steps.csv") as f:
            self.assertEqual(len(f.read().splitlines()) - 1, s["steps"])
        with open(png, "rb") as f:
            head = f.read()
        self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(head), 20000)


if __name__ == "__main__":
    unittest.main(verbosity=2)
