"""patd's /metrics page, scraped over HTTP from a real patd (cpu backend) after real steps: clean
by `promtool check metrics` (Prometheus's own linter: base units, counter suffixes, the text
format), and its prefix-cache and KV figures exactly what the requests imply.

promtool comes from Debian's prometheus package (`make deps` installs it); without it the test
fails rather than skips, so the check cannot quietly stop running.

Run: PATD_BIN=build/bin/patd PATD_LIBPAT=build/lib/libpat.so.1 python3 -m unittest
     discover -s client/python/tests -p test_metrics.py   (test_python.sh runs every file here)
"""

import os
import shutil
import socket
import subprocess
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import patd  # noqa: E402
from daemon_fixture import start_daemon, stop_daemon  # noqa: E402

MODEL = patd.Model(n_layers=2, q_heads=4, kv_heads=2, head_dim=64, dtype=patd.F16)
BLOCK_BYTES = MODEL.n_layers * 2 * MODEL.kv_heads * 16 * MODEL.head_dim * 2  # K+V, f16, 16 tokens


def free_port():
    """A loopback TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MetricsCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        start_daemon(cls, "patd-metrics.", ["--layers=2", "--q-heads=4", "--kv-heads=2"],
                     metrics_port=cls.port)

    @classmethod
    def tearDownClass(cls):
        stop_daemon(cls)

    def scrape(self):
        """The page as served on http://127.0.0.1:<port>/metrics, and its unlabelled samples by
        name (prometheus_client's parser: the text must be valid exposition)."""
        from prometheus_client.parser import text_string_to_metric_families
        url = "http://127.0.0.1:%d/metrics" % self.port
        with urllib.request.urlopen(url, timeout=5) as r:
            self.assertEqual(r.status, 200)
            text = r.read().decode()
        val = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
               if not s.labels}
        return text, val

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
