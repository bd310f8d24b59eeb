#!/usr/bin/env python3
"""patload against a real patd (cpu backend): every bundled trace sample replays with zero
errors and a summary whose counts match the trace (computed here, independently of patload's
C code); a patload killed mid-replay leaves the daemon's block accounting clean and a restarted
one replays in full; bad traces and a missing daemon get their documented exit codes.

The serving figures in vLLM's terms (goodput, pooled ITL, mean / median / std / percentiles,
failed requests, peak concurrency and output rate, token throughput) are checked three ways:
against values worked out by hand for a five-request run (--report-from, no daemon), against
this file's own re-computation from the per-request arrays of every live replay
(--save-detailed), and by --report-from reproducing a live run's figures exactly. Synthetic
arrivals (--request-rate, --burstiness), the generated-shared-prefix workload (--gsp) and the
BurstGPT reader are checked on what they would replay (--dry-run --dump), then replayed.
What no live run reaches (error codes the reports do not name, a start time beyond any
1-second bucket) is checked by a small C driver compiled here with patload's report sources
(tests/integ/data/patload/patload_unit.c; UBSan where the compiler has it).

Standard library only. PATD_BIN, PATLOAD_BIN, PATCTL_BIN point at the build (make test sets
them); the samples are tests/traces (README there) and tests/integ/data/patload (README there).
"""

import json
import lzma
import math
import os
import re
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
DATA = os.path.join(ROOT, "tests", "integ", "data", "patload")
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


# ---------------------------------------------------------------- the figures, recomputed here

def pctl(sorted_values, p):
    """numpy.percentile's default (linear between closest ranks), as vLLM reports; 0 if empty."""
    v = sorted_values
    if not v:
        return 0.0
    h = (len(v) - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (h - lo) * (v[hi] - v[lo])


def stats(values, pcts):
    v = sorted(values)
    mean = sum(v) / len(v) if v else 0.0
    out = {"mean": mean, "median": pctl(v, 50),
           "std": math.sqrt(sum((x - mean) ** 2 for x in v) / len(v)) if v else 0.0}
    out.update({p: pctl(v, p) for p in pcts})
    return out


def pword(p):
    return str(int(p)) if int(p) == p else str(p)


def figures(d, slo=None, pcts=(90, 99)):
    """vLLM's calculate_metrics over a --save-detailed summary d, written from its definitions:
    dict of field name -> value. A request failed when its "errors" entry is not "" or when it
    has no output and a latency of 0 (what vLLM saves for any failure, even without a reason)."""
    n = len(d["start_times"])
    errs = d["errors"] if isinstance(d.get("errors"), list) else [""] * n
    ok = [not e and not (d["output_lens"][i] == 0 and d["latencies"][i] == 0)
          for i, e in enumerate(errs)]
    idx = [i for i in range(len(ok)) if ok[i]]
    out = {"completed": len(idx), "failed": len(ok) - len(idx),
           "total_input_tokens": sum(d["input_lens"][i] for i in idx),
           "total_output_tokens": sum(d["output_lens"][i] for i in idx)}
    dur = d["duration"]
    out["request_throughput"] = out["completed"] / dur
    out["output_throughput"] = out["total_output_tokens"] / dur
    out["total_token_throughput"] = (out["total_input_tokens"] + out["total_output_tokens"]) / dur
    ttft = [d["ttfts"][i] for i in idx]
    e2el = [d["latencies"][i] for i in idx]
    tpot_all = [(d["latencies"][i] - d["ttfts"][i]) / (d["output_lens"][i] - 1)
                if d["output_lens"][i] > 1 else 0.0 for i in idx]
    tpot = [t for t, i in zip(tpot_all, idx) if d["output_lens"][i] > 1]
    itl = [g for i in idx for g in d["itls"][i]]
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        st = stats([x * 1000 for x in vals], pcts)
        for k in ("mean", "median", "std"):
            out["%s_%s_ms" % (k, name)] = st[k]
        for p in pcts:
            out["p%s_%s_ms" % (pword(p), name)] = st[p]
    if slo:
        good = sum(1 for a, b, c in zip(ttft, tpot_all, e2el)
                   if all(slo[k] / 1000 >= v for k, v in (("ttft", a), ("tpot", b), ("e2el", c))
                          if k in slo))
        out["good_requests"] = good
        out["request_goodput"] = good / dur
    else:
        out["request_goodput"] = None
    # peak concurrency: a sweep over [start, start + latency), departures first at equal times
    ev = sorted([(d["start_times"][i], 1) for i in idx]
                + [(d["start_times"][i] + d["latencies"][i], -1) for i in idx])
    cur = peak = 0
    for _, delta in ev:
        cur += delta
        peak = max(peak, cur)
    out["max_concurrent_requests"] = peak
    # peak output tokens in a 1-s bucket from the earliest start
    if idx:
        t0 = min(d["start_times"][i] for i in idx)
        t1 = max(d["start_times"][i] + d["latencies"][i] for i in idx)
        n = math.ceil(t1 - t0) + 1
        buckets = [0] * n
        for i in idx:
            t = d["start_times"][i] + d["ttfts"][i]
            times = [t]
            for g in d["itls"][i]:
                t += g
                times.append(t)
            for t in times:
                b = int(t - t0)
                if 0 <= b < n:
                    buckets[b] += 1
        out["max_output_tokens_per_s"] = float(max(buckets))
    return out


def readme_fields():
    """the JSON field names README.md's patload table shows (its first column's `names`)"""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    head = "| JSON field (vLLM's name)"
    if head not in text:
        return []
    table = text[text.index(head):].split("\n\n")[0].splitlines()[2:]
    return [n for row in table for n in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])]


def run(args, timeout=120):
    return subprocess.run([PATLOAD] + args, capture_output=True, text=True, timeout=timeout,
                          check=False)


def read_dump(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f]


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

    def assert_figures(self, s, slo, pcts=(90, 99)):
        """The summary's serving figures equal this file's recomputation from its own
        per-request arrays, and --report-from recomputes the same figures from the file (and
        exits 1 when it holds failed requests)."""
        want = figures(s, slo, pcts)
        for k, v in want.items():
            if isinstance(v, float):
                self.assertAlmostEqual(s[k], v, delta=1e-9 * max(1.0, abs(v)), msg=k)
            else:
                self.assertEqual(s[k], v, k)
        n = len(s["start_times"])
        for i in range(n):  # one gap per token after the first; they add up to finish - first
            if s["errors"][i]:
                continue
            self.assertEqual(len(s["itls"][i]), s["output_lens"][i] - 1)
            self.assertAlmostEqual(sum(s["itls"][i]), s["latencies"][i] - s["ttfts"][i],
                                   delta=1e-9)
            self.assertLessEqual(s["ttfts"][i], s["latencies"][i])
        saved = os.path.join(self.dir, "detailed.json")
        again = os.path.join(self.dir, "again.json")
        with open(saved, "w") as f:
            json.dump(s, f)
        words = ",".join("%s:%g" % kv for kv in slo.items())
        p = run(["--report-from", saved, "--json", again, "--percentiles",
                 ",".join(str(x) for x in pcts)] + (["--goodput", words] if slo else []))
        self.assertEqual(p.returncode, 1 if want["failed"] else 0, p.stderr)
        with open(again) as f:
            r = json.load(f)
        for k in want:
            self.assertEqual(r[k], s[k], k)

    def replay_sample(self, name, args):
        path = os.path.join(TRACES, name)
        if LIGHT:
            args = args + ["--limit", str(LIGHT)]
        n, prompt, output = expected(path, args)
        slo = {"ttft": 3000, "tpot": 40}
        p, s = self.patload(path, args + ["--save-detailed", "--goodput"]
                            + ["%s:%g" % kv for kv in slo.items()])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIsNotNone(s)
        self.assertEqual(s["requests"], n)
        self.assertEqual(s["done"], n)
        self.assertEqual(s["failed"], 0)
        self.assertEqual(s["not_started"], 0)
        self.assertEqual(s["errors_by_code"], {})
        self.assertEqual(s["errors"], [""] * n)
        self.assertNotIn("request_errors", s)
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
        # the same counts under vLLM's names, and every figure as recomputed here
        self.assertEqual((s["completed"], s["failed"]), (n, 0))
        self.assertEqual((s["total_input_tokens"], s["total_output_tokens"]), (prompt, output))
        # the admission limit asked for (this daemon's caps are higher: 256 sequences, a
        # 2048-token batch)
        self.assertEqual(s["max_concurrency"],
                         int(dict(zip(args, args[1:])).get("--concurrency", 64)))
        self.assertRegex(s["date"], r"^\d{8}-\d{6}$")
        self.assertEqual((s["request_rate"], s["burstiness"]), (None, None))  # the trace's times
        self.assert_figures(s, slo)
        self.assertLessEqual(s["good_requests"], n)
        self.assertIn("goodput", p.stdout)
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

    def test_failed_request(self):
        # a prompt longer than the daemon's max_seq_len (32768 by default) fails with E2BIG
        # before it is opened; the others complete. The failure is in every output: the exit
        # status, the summary's counts, errors_by_code, the per-request errors list (vLLM's), the
        # CSV's error column; --report-from of the saved run agrees and exits 1 too
        trace = os.path.join(self.dir, "e2big.jsonl")
        with open(trace, "w") as f:
            for n_in in (24, 40000, 40):
                f.write(json.dumps({"timestamp": 0, "input_length": n_in, "output_length": 3})
                        + "\n")
        csv = os.path.join(self.dir, "e2big.csv")
        p, s = self.patload(trace, ["--speed", "0", "--save-detailed", "--csv", csv])
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertEqual((s["completed"], s["failed"], s["done"], s["not_started"]), (2, 1, 2, 0))
        self.assertEqual(s["errors_by_code"], {"E2BIG": 1})
        self.assertEqual(s["errors"], ["", "E2BIG", ""])
        self.assertEqual((s["output_lens"][1], s["latencies"][1], s["itls"][1]), (0, 0, []))
        self.assertEqual(s["total_input_tokens"], 24 + 40)
        self.assertIn("errors       E2BIG 1 (failed requests by code)", p.stdout)
        with open(csv) as f:
            rows = [r.split(",") for r in f.read().splitlines()[1:]]
        self.assertEqual([r[-1] for r in rows], ["", "E2BIG", ""])
        self.assert_figures(s, {})
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

    def test_burstgpt_replay(self):
        # the BurstGPT sample: 16 rows, 2 of them failed requests (0 response tokens) left out
        path = os.path.join(DATA, "burstgpt_sample.csv")
        rows = burst_rows(path)
        args = ["--scale", "0.125", "--speed", "20"]
        if LIGHT:
            args += ["--limit", str(LIGHT)]
            rows = rows[:LIGHT]
        p, s = self.patload(path, args)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual((s["completed"], s["failed"]), (len(rows), 0))
        self.assertEqual(s["config"]["format"], "burstgpt-csv")
        self.assertEqual(s["config"]["trace_dropped"], 2)
        self.assertEqual(s["total_input_tokens"], sum(max(1, rnd(a * 0.125)) for a, _ in rows))
        self.assertEqual(s["total_output_tokens"], sum(max(1, rnd(b * 0.125)) for _, b in rows))
        self.assert_clean()

    def test_gsp_replay_at_rate(self):
        # 4 groups x 4 prompts sharing 64-token system prompts, arriving at 25 req/s in gamma
        # gaps of burstiness 0.5: the replay's arrivals are the ones --dump shows, later
        # members of a group find their system prompt in the prefix cache
        gsp = ["--gsp", "--gsp-num-groups", "4", "--gsp-prompts-per-group", "4",
               "--gsp-system-prompt-len", "64", "--gsp-question-len", "16",
               "--gsp-output-len", "8", "--request-rate", "25", "--burstiness", "0.5",
               "--seed", "3"]
        dump = os.path.join(self.dir, "gsp_dump.jsonl")
        p = run(gsp + ["--dry-run", "--dump", dump])
        self.assertEqual(p.returncode, 0, p.stderr)
        planned = read_dump(dump)
        out = os.path.join(self.dir, "gsp.json")
        p = run(gsp + ["--socket", self.sock, "--quiet", "--json", out, "--save-detailed",
                       "--goodput", "e2el:1000"], timeout=240)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        with open(out) as f:
            s = json.load(f)
        self.assertEqual((s["completed"], s["failed"], s["num_prompts"]), (16, 0, 16))
        # every field README.md's table names is in a --save-detailed summary
        names = readme_fields()
        self.assertGreater(len(names), 25, "README.md's patload JSON table not found")
        self.assertEqual([n for n in names if n not in s], [])
        self.assertEqual((s["request_rate"], s["burstiness"]), (25, 0.5))
        self.assertEqual(s["config"]["arrivals"], "25 req/s, gamma gaps of burstiness 0.5")
        self.assertEqual(s["total_input_tokens"], 16 * 80)
        self.assertEqual(s["total_output_tokens"], 16 * 8)
        # requests arrive in the planned order at the planned times (the dump has µs digits)
        for got, want in zip(sorted(s["start_times"]), [r["timestamp"] / 1e3 for r in planned]):
            self.assertAlmostEqual(got, want, delta=2e-6)
        self.assertAlmostEqual(planned[-1]["timestamp"], 16 / 25 * 1e3, delta=1e-3)
        self.assertGreaterEqual(s["cached_tokens"], 64)
        self.assert_figures(s, {"e2el": 1000})
        # --gsp without --request-rate arrives all at once: vLLM's default set-up fields
        p = run(gsp[:-6] + ["--seed", "3", "--socket", self.sock, "--quiet", "--json", out],
                timeout=240)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        with open(out) as f:
            s = json.load(f)
        self.assertEqual((s["request_rate"], s["burstiness"], s["config"]["arrivals"]),
                         ("inf", 1.0, "all at once"))
        self.assertNotIn("errors", s)  # the per-request list only with --save-detailed
        self.assertEqual(s["errors_by_code"], {})
        self.assert_clean()


def burst_rows(path):
    """(request, response) tokens of the rows a replay keeps, read here with the csv module."""
    import csv
    with open(path, newline="") as f:
        return [(int(r["Request tokens"]), int(r["Response tokens"])) for r in csv.DictReader(f)
                if int(r["Request tokens"]) > 0 and int(r["Response tokens"]) > 0]


# ---------------------------------------------------------------- without a daemon

# Five requests (seconds) for the hand-worked figures below: A, B, C, E completed, D failed
SMALL = {
    "duration": 10.0,
    "start_times": [0.0, 1.0, 1.1, 3.0, 0.9],
    "ttfts": [0.5, 0.25, 2.0, 0.0, 1.0],
    "latencies": [1.1, 0.3, 2.0, 0.0, 2.6],
    "itls": [[0.1, 0.2, 0.3], [0.05], [], [], [0.4, 0.4, 0.4, 0.4]],
    "input_lens": [100, 50, 200, 80, 10],
    "output_lens": [4, 2, 1, 0, 5],
}

# worked out by hand (ms unless named):
#   completed A B C E = 4, failed D = 1; input 100+50+200+10 = 360; output 4+2+1+5 = 12
#   per second over 10 s: 0.4 requests, 1.2 output tokens, 37.2 input + output tokens
#   TTFT 250 500 1000 2000: mean 3750/4 = 937.5, median (500+1000)/2 = 750,
#     std sqrt((687.5^2 + 437.5^2 + 62.5^2 + 1062.5^2)/4) = sqrt(449218.75),
#     p99.9 at rank 3 x .999 = 2.997: 1000 + .997 x 1000 = 1997, p100 2000
#   TPOT (E2EL - TTFT)/(out - 1), outputs of 2+ only: A 600/3 = 200, B 50/1 = 50, E 1600/4 = 400:
#     mean 650/3, median 200, std sqrt(((650/3-50)^2 + (650/3-200)^2 + (650/3-400)^2)/3),
#     p99.9 at rank 1.998: 200 + .998 x 200 = 399.6
#   ITL pooled 50 100 200 300 400 400 400 400: mean 2250/8 = 281.25, median (300+400)/2 = 350,
#     std sqrt((231.25^2 + 181.25^2 + 81.25^2 + 18.75^2 + 4 x 118.75^2)/8) = sqrt(18710.9375)
#   E2EL 300 1100 2000 2600: mean 1500, median 1550, std sqrt((1200^2+400^2+500^2+1100^2)/4)
#     = sqrt(765000), p99.9 at rank 2.997: 2000 + .997 x 600 = 2598.2
#   goodput ttft <= 1000 and tpot <= 250: A, B (E's TTFT of exactly 1000 meets it, its TPOT
#     does not; C misses TTFT) = 2 -> 0.2/s; e2el <= 2000: A B C (C exactly) = 3;
#     tpot <= 10: only C, whose single token counts as TPOT 0
#   peak concurrency: A [0, 1.1) E [0.9, 3.5) B [1.0, 1.3) C [1.1, 3.1): 3 (A leaves at 1.1
#     before C arrives at 1.1; D failed and does not count)
#   peak output tokens per second from t = 0: [0,1) A's first three; [1,2) A's last, B's two,
#     E's first = 4; [2,3) E 2; [3,4) C 1 + E 2 = 3 -> 4
HAND = {
    "duration": 10.0, "completed": 4, "failed": 1, "total_input_tokens": 360,
    "total_output_tokens": 12, "request_throughput": 0.4, "output_throughput": 1.2,
    "total_token_throughput": 37.2, "request_goodput": 0.2, "good_requests": 2,
    "max_concurrent_requests": 3, "max_output_tokens_per_s": 4.0,
    "mean_ttft_ms": 937.5, "median_ttft_ms": 750.0, "std_ttft_ms": math.sqrt(449218.75),
    "p50_ttft_ms": 750.0, "p99.9_ttft_ms": 1997.0, "p100_ttft_ms": 2000.0,
    "mean_tpot_ms": 650 / 3, "median_tpot_ms": 200.0,
    "std_tpot_ms": math.sqrt(((650 / 3 - 50) ** 2 + (650 / 3 - 200) ** 2
                              + (650 / 3 - 400) ** 2) / 3),
    "p50_tpot_ms": 200.0, "p99.9_tpot_ms": 399.6, "p100_tpot_ms": 400.0,
    "mean_itl_ms": 281.25, "median_itl_ms": 350.0, "std_itl_ms": math.sqrt(18710.9375),
    "p50_itl_ms": 350.0, "p99.9_itl_ms": 400.0, "p100_itl_ms": 400.0,
    "mean_e2el_ms": 1500.0, "median_e2el_ms": 1550.0, "std_e2el_ms": math.sqrt(765000),
    "p50_e2el_ms": 1550.0, "p99.9_e2el_ms": 2598.2, "p100_e2el_ms": 2600.0,
}


class NoDaemonCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="patload-nd.")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def write_json(self, name, obj):
        with open(self.path(name), "w") as f:
            json.dump(obj, f)
        return self.path(name)

    def report(self, saved, args, rc=1):
        """--report-from saved --json: (the process, the JSON). rc: the exit status expected
        (1 while the saved run has a failed request, as SMALL has)."""
        out = self.path("report.json")
        if os.path.exists(out):
            os.unlink(out)
        p = run(["--report-from", saved, "--json", out] + args)
        self.assertEqual(p.returncode, rc, p.stderr)
        with open(out) as f:
            return p, json.load(f)

    def test_hand_computed_figures(self):
        small = self.write_json("small.json", dict(SMALL, errors=["", "", "", "ETIMEDOUT", ""]))
        p, r = self.report(small, ["--goodput", "ttft:1000", "tpot:250",
                                   "--percentiles", "50,99.9,100"])
        for k, v in HAND.items():
            self.assertAlmostEqual(r[k], v, delta=1e-9 * max(1.0, abs(v)), msg=k)
        self.assertEqual(r["goodput_slo_ms"], {"ttft": 1000, "tpot": 250})
        self.assertEqual(r["percentiles"], [50, 99.9, 100])
        self.assertEqual(r["report_from"], small)
        self.assertNotIn("p99_ttft_ms", r)  # only the percentiles asked for
        self.assertIn("p99.9", p.stdout)
        self.assertRegex(p.stdout, r"4 completed, 1 failed in 10\.00 s: 0\.40 req/s; at most 3")
        self.assertRegex(p.stdout, r"goodput +0\.20 req/s: 2 of 4 completed met ttft <= 1000 ms"
                                   r" and tpot <= 250 ms")
        self.assertRegex(p.stdout, r"ITL +281\.25 +350\.00 +136\.79 +350\.00 +400\.00 +400\.00 +8")
        # the same figures this file computes from the definitions (a check of figures() too)
        want = figures(dict(SMALL, errors=["", "", "", "x", ""]),
                       {"ttft": 1000, "tpot": 250}, (50, 99.9, 100))
        for k, v in want.items():
            self.assertAlmostEqual(r[k], v, delta=1e-9 * max(1.0, abs(v)), msg=k)

    def test_goodput_bounds(self):
        small = self.write_json("small2.json", dict(SMALL, errors=["", "", "", "EIO", ""]))
        _, r = self.report(small, ["--goodput", "e2el:2000"])
        self.assertEqual((r["good_requests"], r["request_goodput"]), (3, 0.3))
        _, r = self.report(small, ["--goodput=tpot:10"])
        self.assertEqual((r["good_requests"], r["request_goodput"]), (1, 0.1))
        _, r = self.report(small, ["--goodput", "ttft:2000,tpot:400,e2el:2600"])
        self.assertEqual(r["good_requests"], 4)
        _, r = self.report(small, [])  # no SLO: vLLM's null, default percentiles 90 and 99
        self.assertIsNone(r["request_goodput"])
        self.assertIsNone(r["good_requests"])
        self.assertAlmostEqual(r["p90_ttft_ms"], 1700.0)  # rank 2.7: 1000 + .7 x 1000
        self.assertAlmostEqual(r["p99_e2el_ms"], 2582.0)  # rank 2.97: 2000 + .97 x 600

    def test_vllm_saved_result(self):
        # vLLM's --save-result --save-detailed names failures in "errors" (a list; "" = ok) and
        # records its set-up; both are read, and the set-up is passed through
        v = dict(SMALL, errors=["", "", "", "Timeout", ""], generated_texts=[""] * 5,
                 request_rate="inf", burstiness=1.0, max_concurrency=None, num_prompts=5,
                 date="20260101-000000", backend="vllm")
        _, r = self.report(self.write_json("vllm.json", v),
                           ["--goodput", "ttft:1000", "tpot:250", "--percentiles", "50,99.9,100"])
        for k, val in HAND.items():
            self.assertAlmostEqual(r[k], val, delta=1e-9 * max(1.0, abs(val)), msg=k)
        self.assertEqual((r["request_rate"], r["burstiness"], r["max_concurrency"],
                          r["num_prompts"]), ("inf", 1.0, None, 5))
        # vLLM saves a non-200 reply's reason, "" when it has none, and not its success flag:
        # a request with no output and a latency of 0 (what vLLM saves for every failure) failed
        # whatever its error string; so does one whose string names an error
        for name, obj in (("empty", dict(v, errors=[""] * 5)),
                          ("nolist", SMALL),
                          ("bycode", dict(SMALL, errors={"ETIMEDOUT": 1}))):
            with self.subTest(errors=name):
                _, r = self.report(self.write_json(name + ".json", obj),
                                   ["--goodput", "ttft:1000", "tpot:250",
                                    "--percentiles", "50,99.9,100"])
                for k, val in HAND.items():
                    self.assertAlmostEqual(r[k], val, delta=1e-9 * max(1.0, abs(val)), msg=k)
        _, r = self.report(self.write_json("named.json", dict(v, errors=["", "x", "", "", ""])), [])
        self.assertEqual((r["completed"], r["failed"], r["total_output_tokens"]), (3, 2, 10))
        # no output but a latency: a completed request (an empty reply); nothing failed: exit 0
        ok = dict(v, errors=[""] * 5, latencies=[1.1, 0.3, 2.0, 0.2, 2.6])
        p, r = self.report(self.write_json("allok.json", ok), [], rc=0)
        self.assertEqual((r["completed"], r["failed"], r["total_input_tokens"]), (5, 0, 440))
        self.assertIn("5 completed, 0 failed", p.stdout)

    def test_report_from_refusals(self):
        bad = [
            ({k: v for k, v in SMALL.items() if k != "itls"}, "\"itls\""),
            (dict(SMALL, ttfts=[0.5]), "\"ttfts\" has 1 entries"),
            (dict(SMALL, duration=0), "duration"),
            (dict(SMALL, output_lens=[4, 2, 1, 0, -5]), "output_lens[4]"),
            (dict(SMALL, itls=[[0.1], [], [], [], "x"]), "itls[4]"),
            (dict(SMALL, errors=["", ""]), "\"errors\" has 2 entries"),
            # hostile numbers: each would overflow a figure or a cast, or is no time at all
            (dict(SMALL, start_times=[0, 1e19, 1.1, 3.0, 0.9]), "start_times[1] = 1e+19"),
            (dict(SMALL, duration=5e-324), "duration = 4.94066e-324"),
            (dict(SMALL, duration=1e-7), "duration = 1e-07"),
            (dict(SMALL, duration=float("inf")), "duration = inf"),
            (dict(SMALL, duration=float("nan")), "duration = nan"),
            (dict(SMALL, ttfts=[0.5, -0.25, 2.0, 0.0, 1.0]), "ttfts[1] = -0.25"),
            (dict(SMALL, latencies=[1.1, 0.3, 2e9, 0.0, 2.6]), "latencies[2] = 2e+09"),
            (dict(SMALL, start_times=[0.0, float("-inf"), 1.1, 3.0, 0.9]), "start_times[1] = -inf"),
            (dict(SMALL, itls=[[0.1], [], [], [], [0.4, float("nan")]]), "itls[4][1] = nan"),
            (dict(SMALL, input_lens=[100, 50, 2 ** 32, 80, 10]), "input_lens[2] = 4.29497e+09"),
            (dict(SMALL, output_lens=[4, 2, 1.5, 0, 5]), "output_lens[2] = 1.5"),
            (dict(SMALL, ttfts=[0.5, None, 2.0, 0.0, 1.0]), "ttfts[1] is not a number"),
        ]
        for i, (obj, needle) in enumerate(bad):
            with self.subTest(needle=needle):
                p = run(["--report-from", self.write_json("bad%d.json" % i, obj)])
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(needle, p.stderr)
        # at the bounds every figure is finite: the JSON has no NaN or Infinity (Python's
        # parser takes them unless told not to)
        edge = dict(SMALL, duration=1e-6, start_times=[0, 1e9, 1e9, 0, 5e8],
                    latencies=[1e9, 0.3, 0.0, 0.0, 1e9], ttfts=[1e9, 0.0, 0.0, 0.0, 1e9],
                    input_lens=[2 ** 32 - 1] * 5, output_lens=[2 ** 32 - 1, 2, 0, 0, 5],
                    itls=[[1e9, 0.0], [0.0], [], [], [1e9] * 4])
        out = self.path("edge_report.json")
        p = run(["--report-from", self.write_json("edge.json", edge), "--json", out,
                 "--goodput", "ttft:1e15", "--percentiles", "0,100"])
        self.assertEqual(p.returncode, 1, p.stderr)  # C and D: no output, latency 0: failed

        def no_constant(word):
            raise ValueError("non-finite number %s in the JSON" % word)
        with open(out) as f:
            r = json.loads(f.read(), parse_constant=no_constant)
        self.assertEqual((r["completed"], r["failed"]), (3, 2))
        self.assertAlmostEqual(r["request_throughput"], 3e6)
        self.assertAlmostEqual(r["total_token_throughput"], ((2 ** 32 - 1) * 4 + 7) / 1e-6,
                               delta=1e3)
        with open(self.path("notjson.json"), "w") as f:
            f.write("{nope")
        p = run(["--report-from", self.path("notjson.json")])
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a JSON file", p.stderr)

    def test_option_refusals(self):
        t = os.path.join(TRACES, "azure_conv_sample.csv")
        small = self.write_json("ok.json", SMALL)
        cases = [
            (["--report-from", small, t], "no TRACE"),
            (["--report-from", small, "--speed", "2"], "--speed does not apply to --report-from"),
            (["--report-from", small, "--goodput", "itl:5"], "not an SLO"),
            (["--report-from", small, "--goodput", "ttft:-1"], "ms >= 0"),
            (["--report-from", small, "--goodput", "ttft:1", "ttft:2"], "ttft given twice"),
            (["--report-from", small, "--goodput", "ttft"], "KEY:MS"),
            (["--report-from", small, "--goodput", ""], "--goodput '': expected KEY:MS"),
            (["--report-from", small, "--goodput=ttft:5,"], "--goodput 'ttft:5,': expected"),
            (["--report-from", small, "--goodput", "ttft:5,,tpot:3"], "expected KEY:MS"),
            (["--report-from", small, "--goodput", "ttft:5", "tpot:3,"], "'tpot:3,'"),
            # the = form takes its one word; an SLO word after it is named, not taken as a trace
            (["--report-from", small, "--goodput=ttft:5", "tpot:3"],
             "--goodput=ttft:5 takes that one word: --goodput=ttft:5,tpot:3 or --goodput ttft:5 "
             "tpot:3"),
            # a following word that is no ttft:/tpot:/e2el: NUMBER is not an SLO: here a TRACE
            (["--report-from", small, "--goodput", "ttft:5", "trace:x.jsonl"], "no TRACE"),
            (["--report-from", small, "--goodput", "ttft:5", "tpot:x.jsonl"], "no TRACE"),
            (["--report-from", small, "--percentiles", "50,101"], "[0, 100]"),
            (["--report-from", small, "--percentiles", "50,,90"], "[0, 100]"),
            (["--dry-run", t, "--burstiness", "2"], "give both"),
            (["--dry-run", t, "--request-rate", "0"], "--request-rate 0"),
            (["--dry-run", t, "--request-rate", "-inf"], "--request-rate -inf"),
            (["--dry-run", t, "--request-rate", "5", "--burstiness", "0"], "--burstiness 0"),
            (["--dry-run", t, "--request-rate", "5", "--speed", "2"], "--speed and --spread"),
            (["--dry-run", t, "--request-rate", "5", "--spread"], "--speed and --spread"),
            (["--dry-run", t, "--speed", "inf"], "--speed inf"),
            (["--dry-run", "--gsp", t], "no TRACE"),
            (["--dry-run", t, "--gsp-num-groups", "4"], "--gsp-num-groups needs --gsp"),
            (["--dry-run", "--gsp", "--gsp-num-groups", "0"], "--gsp-num-groups 0"),
            (["--dry-run", "--gsp", "--gsp-range-ratio", "1.5"], "--gsp-range-ratio 1.5"),
            (["--dry-run", "--gsp", "--shared-prefix", "8"], "not --gsp"),
            (["--dry-run", "--gsp", "--skip", "1024"], "no requests after skipping 1024"),
            (["--dry-run", t, "--save-detailed"], "give --json"),
        ]
        for args, needle in cases:
            with self.subTest(args=" ".join(args)):
                p = run(args)
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertIn(needle, p.stderr)

    def test_goodput_words(self):
        # what --goodput takes: following words only while they are ttft:/tpot:/e2el: and a
        # number, so a trace path such as trace:x.csv or tpot:x.csv stays the trace
        small = self.write_json("gp.json", SMALL)
        for args, want in (
                (["--goodput", "ttft:1000", "tpot:250"], {"ttft": 1000, "tpot": 250}),
                (["--goodput=ttft:1000,tpot:250"], {"ttft": 1000, "tpot": 250}),
                (["--goodput", "e2el:2000,ttft:1e3", "tpot:250"],
                 {"e2el": 2000, "ttft": 1000, "tpot": 250})):
            with self.subTest(args=" ".join(args)):
                _, r = self.report(small, args)
                self.assertEqual(r["goodput_slo_ms"], want)
        for name in ("trace:x.csv", "tpot:x.csv"):
            with self.subTest(trace=name):
                shutil.copy(os.path.join(TRACES, "azure_conv_sample.csv"), self.path(name))
                p = subprocess.run([os.path.abspath(PATLOAD), "--dry-run", "--goodput", "ttft:5",
                                    name],
                                   capture_output=True, text=True, cwd=self.dir, timeout=60,
                                   check=False)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("format azure-csv\nrequests 64\n", p.stdout)

    def test_report_units(self):
        # what no live run reaches, through patload's own sources compiled with a small driver
        # (tests/integ/data/patload/patload_unit.c): two failures with codes the reports do not
        # name keep their own names in errors (they once shared one buffer), and a start time of
        # 1e19 s does not reach an out-of-range cast in the per-second output peak (UBSan's
        # float-cast-overflow, where the compiler has it, aborts on one)
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler")
        exe = self.path("patload_unit")
        srcs = [os.path.join(DATA, "patload_unit.c")] + [
            os.path.join(ROOT, f) for f in (
                "client/patload/patload_report.c", "client/patload/patload_metrics.c",
                "client/patload/patload_trace.c", "daemon/base/pat_base.c")]
        base = [cc, "-std=c11", "-D_GNU_SOURCE", "-O1", "-g",
                "-I" + os.path.join(ROOT, "client", "patload"),
                "-I" + os.path.join(ROOT, "daemon", "base")]
        libs = ["-ljson-c", "-llzma", "-lxxhash", "-lm"]
        ubsan = ["-fsanitize=undefined,float-cast-overflow", "-fno-sanitize-recover=all"]
        p = subprocess.run(base + ubsan + srcs + ["-o", exe] + libs, capture_output=True,
                           text=True, timeout=300, check=False)
        if p.returncode != 0:  # no libubsan: the checks of the values still hold
            print("  (patload_unit without UBSan: %s)" % p.stderr.strip()[-200:], file=sys.stderr)
            p = subprocess.run(base + srcs + ["-o", exe] + libs, capture_output=True, text=True,
                               timeout=300, check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = self.path("unit_errnames.json")
        p = subprocess.run([exe, "errnames", out], capture_output=True, text=True, timeout=60,
                           check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            r = json.load(f)
        self.assertEqual(r["errors"], ["E133", "E131", "", "ENOSPC"])
        self.assertEqual(r["errors_by_code"], {"E133": 1, "E131": 1, "ENOSPC": 1})
        self.assertEqual((r["completed"], r["failed"]), (1, 3))
        p = subprocess.run([exe, "peaks"], capture_output=True, text=True, timeout=60,
                           check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        # one at a time; the far request's tokens lie beyond any bucket: the near one's 2
        self.assertEqual(p.stdout, "peaks 1 2\n")

    def test_help_names_every_option(self):
        p = run(["--help"])
        self.assertEqual(p.returncode, 0)
        for opt in ("--request-rate R", "--burstiness B", "--goodput KEY:MS...",
                    "--percentiles P,P...", "--save-detailed", "--report-from FILE",
                    "--dump FILE", "--gsp ", "--gsp-num-groups N", "--gsp-prompts-per-group N",
                    "--gsp-system-prompt-len N", "--gsp-question-len N", "--gsp-output-len N",
                    "--gsp-range-ratio F", "--gsp-ordered", "BurstGPT",
                    # the report mode's usage names every option it takes
                    "patload --report-from FILE [--goodput KEY:MS...] [--percentiles P,P...]\n"
                    "               [--json FILE] [--quiet]\n",
                    # what it returns, what the arrays hold, what the summary's fields mean
                    "(--report-from: the saved run has failed requests",
                    "output_lens (tokens), start_times, ttfts, itls, latencies (seconds",
                    "--goodput=ttft:500,tpot:50 takes that one word", "num_prompts counts one pass",
                    "null when a trace's own times are replayed", "errors_by_code"):
            self.assertIn(opt, " ".join(p.stdout.split(" ")) if "\n" in opt
                          else " ".join(p.stdout.split()))

    def dump(self, args, name="dump.jsonl"):
        out = self.path(name)
        p = run(["--dry-run", "--dump", out] + args)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout, read_dump(out)

    def test_request_rate_arrivals(self):
        # 4000 requests at 50 req/s: the last one arrives at N/R = 80 s (vLLM rescales the
        # gamma draws to that), so the mean gap is 1/R; gaps of a gamma distribution with
        # shape B have a coefficient of variation 1/sqrt(B)
        n, rate = 4000, 50.0
        gsp = ["--gsp", "--gsp-num-groups", "40", "--gsp-prompts-per-group", "100",
               "--gsp-system-prompt-len", "4", "--gsp-question-len", "2", "--gsp-output-len", "2",
               "--request-rate", str(rate)]
        for b in (0.25, 1.0, 4.0):
            with self.subTest(burstiness=b):
                out, rows = self.dump(gsp + ["--burstiness", str(b), "--seed", "11"])
                t = [r["timestamp"] / 1e3 for r in rows]
                self.assertEqual(len(t), n)
                self.assertAlmostEqual(t[-1], n / rate, delta=1e-6)
                gaps = [t[0]] + [y - x for x, y in zip(t, t[1:])]
                self.assertTrue(all(g >= 0 for g in gaps))
                mean = sum(gaps) / n
                cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / n) / mean
                self.assertAlmostEqual(cv, 1 / math.sqrt(b), delta=0.1 / math.sqrt(b))
                self.assertIn("last_arrival_s 80.000000", out)
        out, rows = self.dump(gsp + ["--burstiness", "inf"])
        gaps = [rows[0]["timestamp"]] + [y["timestamp"] - x["timestamp"]
                                         for x, y in zip(rows, rows[1:])]
        self.assertTrue(all(abs(g - 20.0) < 1e-5 for g in gaps), gaps[:5])  # 1/R = 20 ms
        self.assertIn("arrivals 50 req/s, evenly spaced", out)
        out, rows = self.dump(gsp[:-2] + ["--request-rate", "inf"])
        self.assertTrue(all(r["timestamp"] == 0 for r in rows))
        self.assertIn("arrivals all at once", out)
        # a seed gives the same arrivals, another seed others
        _, a = self.dump(gsp + ["--seed", "5"], "a.jsonl")
        _, b = self.dump(gsp + ["--seed", "5"], "b.jsonl")
        _, c = self.dump(gsp + ["--seed", "6"], "c.jsonl")
        self.assertEqual(a, b)
        self.assertNotEqual([r["timestamp"] for r in a], [r["timestamp"] for r in c])
        # a trace's requests keep their order; only their times are replaced
        t = os.path.join(TRACES, "azure_conv_sample.csv")
        _, plain = self.dump([t], "plain.jsonl")
        _, rated = self.dump([t, "--request-rate", "4"], "rated.jsonl")
        self.assertEqual([r["line"] for r in plain], [r["line"] for r in rated])
        self.assertAlmostEqual(rated[-1]["timestamp"], 64 / 4 * 1e3, delta=1e-3)

    def test_gsp_generator(self):
        small = ["--gsp", "--gsp-num-groups", "4", "--gsp-prompts-per-group", "3",
                 "--gsp-system-prompt-len", "40", "--gsp-question-len", "10",
                 "--gsp-output-len", "5"]
        out, rows = self.dump(small)
        self.assertIn("format gsp\nrequests 12\n", out)
        self.assertIn("groups 4\n", out)
        self.assertEqual(sorted(r["line"] for r in rows), list(range(1, 13)))
        self.assertNotEqual([r["line"] for r in rows], list(range(1, 13)))  # shuffled
        groups = {}
        for r in rows:
            self.assertEqual((r["input_length"], r["output_length"], r["prefix_length"]),
                             (50, 5, 40))
            self.assertEqual(len(r["tokens"]), 50)
            self.assertEqual(r["timestamp"], 0)
            groups.setdefault(r["group"], []).append(r["tokens"])
        self.assertEqual(sorted(groups), [0, 1, 2, 3])

        def common(a, b):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n
        for g, toks in groups.items():
            self.assertEqual(len(toks), 3)
            for a in toks:  # the system prompt is shared exactly, the question is not
                for b in toks:
                    if a is not b:
                        self.assertEqual(common(a, b), 40, "group %d" % g)
        firsts = {toks[0][0] for toks in groups.values()}
        self.assertEqual(len(firsts), 4)  # every group its own system prompt
        # --gsp-ordered: request g x 3 + p is group g's
        _, rows = self.dump(small + ["--gsp-ordered"], "ordered.jsonl")
        self.assertEqual([r["line"] for r in rows], list(range(1, 13)))
        self.assertEqual([r["group"] for r in rows], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
        # lengths drawn in [max(1, floor(len x ratio)), len]; a group's prompt one length
        _, rows = self.dump(small + ["--gsp-range-ratio", "0.5", "--gsp-num-groups", "50"],
                            "ratio.jsonl")
        sys_len = {}
        for r in rows:
            sys_len.setdefault(r["group"], set()).add(r["prefix_length"])
            self.assertTrue(20 <= r["prefix_length"] <= 40)
            self.assertTrue(5 <= r["input_length"] - r["prefix_length"] <= 10)
            self.assertTrue(2 <= r["output_length"] <= 5)
        self.assertTrue(all(len(v) == 1 for v in sys_len.values()))
        self.assertGreater(len({next(iter(v)) for v in sys_len.values()}), 5)
        # SGLang's defaults: 64 x 16 requests of 2048 + 128 tokens and 256 outputs; --scale
        # scales the system prompt and the question apart
        p = run(["--dry-run", "--gsp"])
        self.assertEqual(p.returncode, 0, p.stderr)
        for line in ("requests 1024", "groups 64", "input_tokens %d" % (1024 * 2176),
                     "output_tokens %d" % (1024 * 256), "arrivals all at once"):
            self.assertIn(line + "\n", p.stdout)
        _, rows = self.dump(small + ["--scale", "0.25", "--limit", "5", "--skip", "2"],
                            "scaled.jsonl")
        self.assertEqual(len(rows), 5)
        self.assertTrue(all((r["prefix_length"], r["input_length"], r["output_length"])
                            == (10, 13, 1) for r in rows))  # 40/4, 10/4 = 2.5 -> 3, 5/4 -> 1

    def test_burstgpt_reader(self):
        path = os.path.join(DATA, "burstgpt_sample.csv")
        rows = burst_rows(path)
        self.assertEqual(len(rows), 14)
        out, dumped = self.dump([path])
        for line in ("format burstgpt-csv", "requests 14", "dropped_rows 2", "span_s 53.000",
                     "trace_input_tokens %d" % sum(a for a, _ in rows),
                     "trace_output_tokens %d" % sum(b for _, b in rows)):
            self.assertIn(line + "\n", out)
        self.assertEqual([(r["input_length"], r["output_length"]) for r in dumped], rows)
        self.assertEqual(dumped[0]["timestamp"], 0)
        self.assertEqual(dumped[-1]["timestamp"], 53000)
        # --skip and --limit count the rows replayed, not the dropped ones
        out, dumped = self.dump([path, "--skip", "1", "--limit", "3"], "skip.jsonl")
        self.assertEqual([(r["input_length"], r["output_length"]) for r in dumped], rows[1:4])
        # the later release's columns (Session ID, Elapsed time) are found by name
        later = self.path("burst3.csv")
        with open(later, "w") as f:
            f.write("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                    "Total tokens,Log Type\n"
                    "10.5,a1b2,1.2,GPT-4,100,20,120,Conversation log\n"
                    "11.25,a1b2,0.8,GPT-4,0,20,20,Conversation log\n"
                    "14,c3d4,2.0,ChatGPT,300,40,340,API log\n")
        out, dumped = self.dump([later], "later.jsonl")
        self.assertIn("requests 2\ndropped_rows 1\n", out)
        self.assertEqual([(r["timestamp"], r["input_length"], r["output_length"])
                          for r in dumped], [(0, 100, 20), (3500, 300, 40)])
        # columns in any order and case, an unnamed column kept as one, a UTF-8 byte order
        # mark (spreadsheet programs write one) skipped
        moved = self.path("burst_moved.csv")
        with open(moved, "wb") as f:
            f.write(b"\xef\xbb\xbfModel,response tokens,,REQUEST TOKENS,timestamp,Log Type\n"
                    b"GPT-4,20,x,100,10.5,Conversation log\n"
                    b"GPT-4,7,,0,11,Conversation log\n"
                    b"ChatGPT,40,,300,14,API log\n")
        out, dumped = self.dump([moved], "moved.jsonl")
        self.assertIn("format burstgpt-csv\nrequests 2\ndropped_rows 1\n", out)
        self.assertEqual([(r["timestamp"], r["input_length"], r["output_length"])
                          for r in dumped], [(0, 100, 20), (3500, 300, 40)])
        head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        bad = [
            ("Timestamp,Request tokens,Response tokens,request tokens\n1,2,3,4\n",
             "names Request tokens twice (columns 2 and 4)"),
            ("Model,Request tokens,Response tokens\nx,1,2\n", "BurstGPT header"),
            ("Model,Total tokens\nx,1\n", "neither a JSON object"),
            (head + "5,ChatGPT,472,18,490,Conversation log\nx,ChatGPT,1,2,3,API log\n",
             "line 3: Timestamp"),
            (head + "5,ChatGPT,472,18,490\n", "line 2: 5 columns, the header names 6"),
            (head + "5,ChatGPT,47.5,18,490,API log\n", "line 2: Request tokens"),
            (head + "5,ChatGPT,47,-1,490,API log\n", "line 2: Response tokens"),
            ("Timestamp,Model,Request tokens,Total tokens\n5,GPT-4,1,2\n", "BurstGPT header"),
            (head + "5,ChatGPT,0,18,18,API log\n", "no requests"),
        ]
        for i, (text, needle) in enumerate(bad):
            with self.subTest(needle=needle):
                p = self.path("bad%d.csv" % i)
                with open(p, "w") as f:
                    f.write(text)
                r = run(["--dry-run", p])
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(needle, r.stderr)


if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    res = prog.result
    bad = len(res.failures) + len(res.errors)
    print("%d passed, %d failed" % (res.testsRun - bad, bad))
    sys.exit(1 if bad else 0)
