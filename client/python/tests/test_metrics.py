"""patd's /metrics page, scraped over HTTP from a real patd (cpu backend) after real steps: clean
by `promtool check metrics` (Prometheus's own linter: base units, counter suffixes, the text
format), its prefix-cache and KV figures exactly what the requests imply, and its CPU time (the
process's and by thread role) growing while a client steps.

promtool comes from Debian's prometheus package (`make deps` installs it); without it the test
fails rather than skips, so the check cannot quietly stop running.

Run: PATD_BIN=build/bin/patd PATD_LIBPAT=build/lib/libpat.so.1 python3 -m unittest
     discover -s client/python/tests -p test_metrics.py   (test_python.sh runs every file here)
"""

import os
import shutil
import subprocess
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import patd  # noqa: E402
from daemon_fixture import start_daemon, stop_daemon  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tests", "lib"))
from tl_port import free_port  # noqa: E402

MODEL = patd.Model(n_layers=2, q_heads=4, kv_heads=2, head_dim=64, dtype=patd.F16)
BLOCK_BYTES = MODEL.n_layers * 2 * MODEL.kv_heads * 16 * MODEL.head_dim * 2  # K+V, f16, 16 tokens


class MetricsCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        start_daemon(cls, "patd-metrics.", ["--layers=2", "--q-heads=4", "--kv-heads=2"],
                     metrics_port=cls.port)

    @classmethod
    def tearDownClass(cls):
        stop_daemon(cls)

    def scrape(self, labelled=None):
        """The page as served on http://127.0.0.1:<port>/metrics, and its unlabelled samples by
        name (prometheus_client's parser: the text must be valid exposition). With labelled (a
        sample name), also that sample's values by their one label's value."""
        from prometheus_client.parser import text_string_to_metric_families
        url = "http://127.0.0.1:%d/metrics" % self.port
        with urllib.request.urlopen(url, timeout=5) as r:
            self.assertEqual(r.status, 200)
            text = r.read().decode()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        val = {s.name: s.value for s in samples if not s.labels}
        if labelled is None:
            return text, val
        by = {next(iter(s.labels.values())): s.value for s in samples
              if s.name == labelled and len(s.labels) == 1}
        return text, val, by

    def thread_names(self):
        """The daemon's threads' names (comm), as /proc shows them."""
        task = "/proc/%d/task" % self.proc.pid
        names = []
        for tid in os.listdir(task):
            try:
                with open(os.path.join(task, tid, "comm")) as f:
                    names.append(f.read().strip())
            except OSError:
                pass  # it exited meanwhile
        return names

    def test_cpu_seconds_by_thread(self):
        """process_cpu_seconds_total and patd_cpu_seconds_total{thread=loop|executor|lanes|other}
        are on the page (promtool checks them in the test above), grow while a client steps,
        never go down, and the roles add up to the process's figure. A role whose threads are
        named (patd-exec*, patd-lanes*) grows when they work; the loop, the main thread, always
        serves the requests. (Lanes are the cuda backend's: none here.)"""
        roles = ("loop", "executor", "lanes", "other")
        _, v0, c0 = self.scrape("patd_cpu_seconds_total")
        self.assertEqual(sorted(c0), sorted(roles))
        self.assertIn("process_cpu_seconds_total", v0)
        self.assertIn("patd-metrics", self.thread_names())
        prompt = list(range(1000, 1039))  # shares no block with the other test's prompt
        deadline = time.monotonic() + 20
        with patd.Conn(MODEL, max_batch_tokens=64, socket=self.sock) as c:
            a, _ = c.seq_open(prompt)
            c.step_begin([a], [len(prompt)], prompt)
            for layer in range(MODEL.n_layers):
                c.attend(layer)
            c.step_end()
            steps, last = 0, c0
            # step until the daemon has used 0.3 s of CPU more (a second or two here; ticks are
            # 10 ms), scraping now and then: no figure may go down between scrapes
            while time.monotonic() < deadline:
                for _ in range(50):
                    c.step_begin([a], [1], [7])
                    for layer in range(MODEL.n_layers):
                        c.attend(layer)
                    c.step_end()
                    steps += 1
                _, v1, c1 = self.scrape("patd_cpu_seconds_total")
                for r in roles:
                    self.assertGreaterEqual(c1[r], last[r], "%s went down" % r)
                last = c1
                if v1["process_cpu_seconds_total"] - v0["process_cpu_seconds_total"] >= 0.3:
                    break
            names = self.thread_names()
        grew = v1["process_cpu_seconds_total"] - v0["process_cpu_seconds_total"]
        print("  %d steps: the daemon used %.2f s of CPU; by role %s; threads %s"
              % (steps, grew, {r: round(c1[r] - c0[r], 2) for r in roles}, sorted(set(names))))
        self.assertGreaterEqual(grew, 0.3, "no CPU time counted in 20 s of steps")
        self.assertGreater(sum(c1.values()), sum(c0.values()))
        self.assertGreater(c1["loop"], 0)
        # the roles are the process's time split: equal but for each figure's own clamp
        self.assertAlmostEqual(sum(c1.values()), v1["process_cpu_seconds_total"], delta=0.05)
        if any(n.startswith("patd-exec") for n in names):  # the cpu backend's steps run there
            self.assertGreater(c1["executor"], c0["executor"], "the executors ran the steps")

    def test_scrape_promtool_and_figures(self):
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "no promtool: install Debian's prometheus (make deps)")
        _, v0 = self.scrape()
        prompt = list(range(1, 51))  # 50 tokens: 3 full blocks of 16 and 2 tokens
        with patd.Conn(MODEL, max_batch_tokens=128, socket=self.sock) as c:
            a, cached_a = c.seq_open(prompt)
            self.assertEqual(cached_a, 0)
            c.step_begin([a], [len(prompt)], prompt)
            for layer in range(MODEL.n_layers):
                c.attend(layer)
            c.step_end()  # publishes a's 3 full blocks
            b, cached_b = c.seq_open(prompt)
            self.assertEqual(cached_b, 48)  # its 3 full blocks, from a
            c.step_begin([b], [len(prompt) - cached_b], prompt[cached_b:])
            time.sleep(0.25)  # layer 0 handed over late: the step's start counts the wait
            for layer in range(MODEL.n_layers):
                c.attend(layer)
            c.step_end()
            text, v = self.scrape()  # both sequences open

        # Prometheus's linter on the page as served: exit 0 and nothing to say
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                              text=True, timeout=30)
        self.assertEqual((lint.returncode, lint.stdout + lint.stderr), (0, ""))
        self.assertNotIn("nanoseconds", text)

        # prefix cache in tokens, as vLLM's prefix_cache_queries / _hits count them
        d = {k: v[k] - v0[k] for k in ("patd_prefix_query_tokens_total",
                                       "patd_prefix_hit_tokens_total",
                                       "patd_prefix_hit_blocks_total", "patd_steps_total")}
        self.assertEqual(d["patd_prefix_query_tokens_total"], 2 * len(prompt))
        self.assertEqual(d["patd_prefix_hit_tokens_total"], cached_a + cached_b)
        self.assertEqual(d["patd_prefix_hit_blocks_total"], 3)
        self.assertEqual(d["patd_steps_total"], 2)

        # STEP_BEGIN to the first layer begun: two steps, one of them 0.25 s late with layer 0
        self.assertEqual(v["patd_step_starts_total"] - v0["patd_step_starts_total"], 2)
        start = v["patd_step_start_seconds_total"] - v0["patd_step_start_seconds_total"]
        self.assertGreaterEqual(start, 0.25)
        self.assertLess(start, 10)
        # its stages are a GPU step's (tests/gpu/test_frontend.py checks they add up): all five
        # on the page, none counted for these cpu steps
        _, _, stages = self.scrape("patd_step_stage_seconds_total")
        self.assertEqual(sorted(stages), sorted(["queue", "prepare", "lane_wait", "upload",
                                                 "enqueue"]))
        self.assertEqual(sum(stages.values()), 0)
        # nor prepared on the loop: that is for GPU steps only
        self.assertEqual(v["patd_steps_prepared_on_loop_total"], 0)

        # KV in use, 0..1: a holds 4 blocks, b a's 3 full ones and its own last
        self.assertEqual(v["patd_kv_blocks_used"], 5)
        self.assertEqual(v["patd_kv_usage_ratio"], v["patd_kv_blocks_used"] / v["patd_kv_blocks"])
        self.assertEqual(v["patd_kv_usage_ratio"], 5 / 4096)

        # what sharing saves now: b's block table names 4 blocks, 3 of them a's
        self.assertEqual(v["patd_kv_blocks_logical"], 8)
        self.assertEqual(v["patd_kv_blocks_saved_by_sharing"], 3)
        self.assertEqual(v["patd_kv_saved_by_sharing_bytes"], 3 * BLOCK_BYTES)

        # times in seconds: two steps of two layers ran, planned on the CPU
        self.assertGreater(v["patd_pack_seconds_total"], 0)
        self.assertGreater(v["patd_layer_seconds_total"], 0)
        self.assertLess(v["patd_layer_seconds_total"], 60)
        self.assertIn("patd_reclaim_seconds_max", v)

        _, v2 = self.scrape()  # closed: nothing in use, nothing shared
        self.assertEqual(v2["patd_kv_usage_ratio"], 0)
        self.assertEqual(v2["patd_kv_saved_by_sharing_bytes"], 0)


if __name__ == "__main__":
    unittest.main()
