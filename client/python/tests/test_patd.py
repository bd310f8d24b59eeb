"""Tests of the Python binding against a real patd (started here, cpu backend).

Run: PATD_BIN=build/bin/patd PATD_LIBPAT=build/lib/libpat.so.1 python3 -m unittest
     discover -s client/python/tests   (make test does this)
"""

import errno
import os
import re
import subprocess
import sys
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import patd  # noqa: E402
from daemon_fixture import start_daemon, stop_daemon  # noqa: E402



def _has_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False

MODEL = patd.Model(n_layers=2, q_heads=4, kv_heads=2, head_dim=64, dtype=patd.F16)


def reference(q, K, V, n_ctx, scale):
    """float64 attention of one query row over the first n_ctx positions."""
    s = (K[:n_ctx].astype(np.float64) @ q.astype(np.float64)) * scale
    p = np.exp(s - s.max())
    return (p / p.sum()) @ V[:n_ctx].astype(np.float64)


class DaemonCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # a staging budget of 4 MiB: the tests' sessions of 128 tokens (192 KiB each) fit many
        # times over, one of 4096 tokens (6 MiB) not at all
        start_daemon(cls, "patd-py.", ["--layers=2", "--q-heads=4", "--kv-heads=2",
                                       "--conn-max-seqs=8", "--staging-mb=4"])

    @classmethod
    def tearDownClass(cls):
        stop_daemon(cls)

    def conn(self, **kw):
        return patd.Conn(MODEL, max_batch_tokens=kw.pop("max_batch_tokens", 128),
                         socket=self.sock, **kw)

    def status(self, key):
        if key == "pool_check":  # its own admin request: "pool_check ok (0.1 ms)"
            return patd.admin("check", socket=self.sock).split()[1]
        return str(patd.status(socket=self.sock)[key])

    def test_version_and_errors(self):
        self.assertEqual(patd.library_version()[0], 1)
        with self.conn(kv_dtype="f16") as c:  # this daemon's pool: model.dtype's
            self.assertEqual((c.kv_dtype, c.kv_scale), ("f16", 1.0))
        bad = patd.Model(2, 4, 2, 128)
        with self.assertRaises(patd.PatError) as cm:
            patd.Conn(bad, max_batch_tokens=16, socket=self.sock)
        self.assertEqual(cm.exception.errno, errno.EMEDIUMTYPE)
        self.assertIn("model signature mismatch", cm.exception.detail)
        with self.assertRaises(patd.PatError) as cm:
            patd.Conn(MODEL, max_batch_tokens=16, socket=self.dir + "/nope.sock")
        self.assertEqual(cm.exception.errno, errno.ENOENT)

    def test_staging_refusal_says_staging(self):
        """A HELLO past limits.staging_mb is refused with ENOBUFS, and what the frontend is told
        names the staging budget and the numbers, never the KV pool."""
        with self.assertRaises(patd.PatError) as cm:
            patd.Conn(MODEL, max_batch_tokens=4096, socket=self.sock)
        e = cm.exception
        self.assertEqual(e.errno, errno.ENOBUFS)
        self.assertIn("staging budget exhausted", e.name)
        self.assertIn("limits.staging_mb", e.detail)
        self.assertIn("4194304", e.detail)  # the budget, in bytes
        self.assertIn("staging", str(e))
        self.assertNotIn("out of blocks", str(e))
        with self.conn() as c:  # the daemon serves on
            c.ping()

    def test_prefill_decode_checked(self):
        rng = np.random.default_rng(5)
        scale = 1.0 / np.sqrt(MODEL.head_dim)
        with self.conn() as c:
            self.assertEqual(c.q.shape, (128, 4, 64))
            self.assertEqual(c.q.dtype, np.float16)
            # random K/V stand for a model's: prompts sharing a full block would share its KV
            # in patd (the prefix cache's premise: the same tokens have the same KV)
            prompts = [list(range(100, 140)), list(range(300, 330)) + [7, 8, 9]]
            seqs = [c.seq_open(p)[0] for p in prompts]
            # logical KV per sequence, per layer, per KV head: what the daemon must attend over
            kv = [[{"k": [], "v": []} for _ in range(MODEL.n_layers)] for _ in seqs]
            lens = [0, 0]
            new = [list(p) for p in prompts]
            for step in range(4):
                n_new = [len(x) for x in new]
                rows = sum(n_new)
                c.step_begin(seqs, n_new, [t for x in new for t in x])
                for layer in range(MODEL.n_layers):
                    q = rng.uniform(-1, 1, (rows, 4, 64)).astype(np.float16)
                    k = rng.uniform(-1, 1, (rows, 2, 64)).astype(np.float16)
                    v = rng.uniform(-1, 1, (rows, 2, 64)).astype(np.float16)
                    c.q[:rows], c.k[:rows], c.v[:rows] = q, k, v
                    c.o[:rows] = np.nan
                    c.attend(layer)
                    out = c.o[:rows].astype(np.float64)
                    r0 = 0
                    for i, n in enumerate(n_new):
                        kv[i][layer]["k"].extend(k[r0:r0 + n])
                        kv[i][layer]["v"].extend(v[r0:r0 + n])
                        K = np.array(kv[i][layer]["k"])
                        V = np.array(kv[i][layer]["v"])
                        for t in range(n):
                            for h in range(4):
                                ref = reference(q[r0 + t, h], K[:, h // 2], V[:, h // 2],
                                                lens[i] + t + 1, scale)
                                got = out[r0 + t, h]
                                err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
                                self.assertLess(err, 1e-2, (step, layer, i, t, h))
                        r0 += n
                info = c.step_end()
                self.assertEqual(info["committed"], 1)
                self.assertEqual(info["layers_done"], MODEL.n_layers)
                lens = [a + b for a, b in zip(lens, n_new)]
                new = [[500 + step], [600 + step]]
            st = c.stats()
            self.assertEqual(st["steps"], 4)
            # fork shares the committed KV; truncate rolls back
            child = c.seq_fork(seqs[0])
            c.seq_truncate(child, 10)
            with self.assertRaises(patd.PatError) as cm:
                c.seq_truncate(child, 11)
            self.assertEqual(cm.exception.errno, errno.ERANGE)
            for s in seqs + [child]:
                c.seq_close(s)
        self.assertEqual(self.status("sequences"), "0")
        self.assertEqual(self.status("pool_check"), "ok")

    def test_prefix_cache_across_connections(self):
        prompt = list(range(9000, 9048))  # 3 full blocks
        with self.conn() as a:
            s, cached = a.seq_open(prompt)
            self.assertEqual(cached, 0)
            a.step_begin([s], [48], prompt)
            for layer in range(MODEL.n_layers):
                a.attend(layer)
            a.step_end()
        with self.conn() as b:
            s2, cached = b.seq_open(prompt)
            self.assertEqual(cached, 47 // 16 * 16)  # at least one token is left to compute
            b.seq_close(s2)

    def test_pending_twins(self):
        prompt = list(range(7000, 7040))  # 2 full blocks, both eligible
        with self.conn() as a, self.conn() as b:
            s, cached, pending = a.seq_open_pending(prompt)
            self.assertEqual((cached, pending), (0, 0))
            t, cached, pending = b.seq_open_pending(prompt)  # a twin in another session
            self.assertEqual((cached, pending), (0, 32))
            b.seq_close(t)
            a.step_begin([s], [40], prompt)
            for layer in range(MODEL.n_layers):
                a.attend(layer)
            a.step_end()
            t, cached, pending = b.seq_open_pending(prompt)  # written: cached now
            self.assertEqual((cached, pending), (32, 0))
            b.seq_close(t)
            a.seq_close(s)

    def test_unknown_sequence_and_abort(self):
        with self.conn() as c:
            with self.assertRaises(patd.PatError) as cm:
                c.seq_close(123456)
            self.assertEqual(cm.exception.errno, errno.ENOENT)
            s, _ = c.seq_open([1, 2, 3])
            c.step_begin([s], [3], [1, 2, 3])
            c.attend(0)
            info = c.step_end(abort=True)
            self.assertEqual(info["committed"], 0)
            c.seq_close(s)

    def test_killed_python_client_is_reclaimed(self):
        code = ("import sys, os, time; sys.path.insert(0, %r); import patd;"
                "c = patd.Conn(patd.Model(2, 4, 2, 64), 64, socket=%r);"
                "s, _ = c.seq_open(list(range(50)));"
                "c.step_begin([s], [50], list(range(50))); c.attend(0);"
                "print('ready', flush=True); time.sleep(60)"
                % (os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), self.sock))
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        self.assertEqual(p.stdout.readline().strip(), b"ready")
        before = int(self.status("connections"))
        p.kill()
        p.wait()
        p.stdout.close()
        t0 = time.monotonic()
        while int(self.status("connections")) != before - 1:
            self.assertLess(time.monotonic() - t0, 1.0, "not reclaimed within 1 s")
            time.sleep(0.005)
        self.assertEqual(self.status("steps_in_flight"), "0")
        self.assertEqual(self.status("pool_check"), "ok")

    def test_admin(self):
        self.assertIn("patd_steps_total", patd.admin("stats", socket=self.sock))
        self.assertIn("# session", patd.admin("seqs", socket=self.sock))
        st = patd.status(socket=self.sock)
        self.assertEqual(st["model"]["head_dim"], MODEL.head_dim)
        self.assertEqual(st["backend"], "cpu")
        self.assertEqual(st["version"] >> 16, patd.library_version()[0])
        self.assertFalse(st["draining"])
        # since 1.6: the softmax scale and soft cap the daemon applies (defaults here)
        self.assertAlmostEqual(st["scale"], MODEL.head_dim ** -0.5, places=6)
        self.assertEqual(st["softcap"], 0.0)
        self.assertIn("scale 0.125\n", patd.admin("status", socket=self.sock))

    def test_pack_policy(self):
        """A session chooses its pack policy (else the daemon's daemon.pack_policy, auto here);
        the step reports the one that built its pack, the metrics count it."""
        def one_step(c):
            a, _ = c.seq_open([5, 6, 7, 8] * 9)
            b, _ = c.seq_open([5, 6, 7, 8] * 9)
            c.step_begin([a, b], [36, 36], [5, 6, 7, 8] * 18)
            for layer in range(MODEL.n_layers):
                c.attend(layer)
            return c.step_end()["pack_policy"]

        def query_packs():
            text = patd.admin("stats", socket=self.sock)
            line = [x for x in text.splitlines()
                    if x.startswith('patd_pack_policy_total{policy="query"}')]
            return int(line[0].split()[1])

        before = query_packs()
        with self.conn(pack_policy="query") as c:
            self.assertEqual(one_step(c), "query")
        self.assertEqual(query_packs(), before + 1)
        for name in ("tree", "paper", "bytes"):
            with self.conn(pack_policy=name) as c:
                self.assertEqual(one_step(c), name)
        with self.conn() as c:  # auto picks one of the four
            self.assertIn(one_step(c), ("bytes", "paper", "query", "tree"))
        with self.assertRaises(ValueError):
            self.conn(pack_policy="fastest")

    def test_instance(self):
        """A session names its daemon instance, the one pat_status reports."""
        with self.conn() as c:
            inst, start = c.instance
            self.assertEqual(inst, patd.status(socket=self.sock)["instance"])
            self.assertLessEqual(start, time.time())
            self.assertGreater(start, time.time() - 3600)

    def test_metrics_parse(self):
        """/metrics (here through STATS, the same text) is valid Prometheus exposition by
        prometheus_client's parser, with the sharing figures: two sequences over one cached
        prompt hold fewer blocks than their block tables name."""
        from prometheus_client.parser import text_string_to_metric_families
        with self.conn() as c:
            prompt = list(range(1, 50))  # 3 full blocks + 1 token
            a, _ = c.seq_open(prompt)
            c.step_begin([a], [len(prompt)], prompt)
            for layer in range(MODEL.n_layers):
                c.attend(layer)
            c.step_end()
            b, cached = c.seq_open(prompt)
            self.assertEqual(cached, 48)
            c.seq_fork(a)
            text = patd.admin("stats", socket=self.sock)
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        val = {f.name: f.samples[0].value for f in fams.values() if len(f.samples) == 1}
        info = fams["patd_build_info"].samples[0].labels
        self.assertEqual(info["version"], "%d.%d.%d" % patd.library_version())
        self.assertEqual(info["backend"], "cpu")
        self.assertEqual(fams["patd_kv_pool_info"].samples[0].labels,
                         {"dtype": "f16", "scale": "1"})
        self.assertEqual(sorted(s.labels["reason"] for s in fams["patd_reclaims"].samples
                                if s.name == "patd_reclaims_total"),
                         ["client_died", "lease_expired"])
        # a: 4 blocks, b: the 3 cached ones, the fork: a's 3 full ones + a copy of the 4th
        self.assertGreaterEqual(val["patd_kv_blocks_logical"], 4 + 3 + 4)
        self.assertGreaterEqual(val["patd_kv_blocks_saved_by_sharing"], 6)
        self.assertIn("patd_kv_duplicate_blocks", fams)
        pol = {s.labels["policy"]: s.value for s in fams["patd_pack_policy"].samples
               if s.name == "patd_pack_policy_total"}
        self.assertEqual(sorted(pol), ["bytes", "paper", "query", "tree"])
        self.assertGreater(sum(pol.values()), 0)
        self.assertGreater(val["patd_plan_ctas"], 0)

    def test_main_prints_versions(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
        out = subprocess.run([sys.executable, "-m", "patd", "--version", "--socket", self.sock],
                             check=True, capture_output=True, text=True, env=env).stdout
        self.assertIn("patd binding %s" % patd.__version__, out)
        self.assertIn("libpat %d.%d.%d" % patd.library_version(), out)
        # the protocol version is written once, in ipc/ipc_proto.h
        proto = os.path.join(os.path.dirname(__file__), "..", "..", "..", "ipc", "ipc_proto.h")
        with open(proto) as f:
            version = re.search(r"#define IPC_VERSION\s*\\?\s*(\d+)u", f.read()).group(1)
        self.assertIn("wire protocol %s," % version, out)
        self.assertIn("cpu backend", out)
        r = subprocess.run([sys.executable, "-m", "patd", "--socket", self.dir + "/nope.sock"],
                           capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("nothing listens there", r.stdout)

    @unittest.skipUnless(_has_torch(), "torch is not installed")
    def test_torch_host_arrays(self):
        import torch
        with self.conn(arrays="torch") as c:
            self.assertEqual(c.q.dtype, torch.float16)
            self.assertEqual(tuple(c.q.shape), (128, 4, 64))
            c.q[0, 0, 0] = 2.5  # the same memory as the numpy view would be
            self.assertEqual(float(c.q[0, 0, 0]), 2.5)


def e4m3(x):
    """x rounded to the nearest fp8 e4m3 value (ties to even, saturated at 448), in float64: an
    independent statement of what daemon/base/pat_fp8.h does."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    step = 2.0 ** (np.maximum(e, -6) - 3)  # 3 mantissa bits; below 2^-6 the subnormals' step
    return np.clip(np.round(x / step) * step, -448.0, 448.0)


class Fp8DaemonCase(unittest.TestCase):
    """A daemon whose pool stores K and V in fp8 e4m3 (model.kv_dtype, issue 40): it says so,
    and its outputs are attention over the values its pool holds, value / kv_scale rounded to
    e4m3, times kv_scale: nearer to that than to attention over the clients' fp16 values."""

    SCALE = 0.125

    @classmethod
    def setUpClass(cls):
        start_daemon(cls, "patd-py8.", ["--layers=2", "--q-heads=4", "--kv-heads=2",
                                        "--kv-dtype=fp8_e4m3", "--kv-scale=%g" % cls.SCALE])

    @classmethod
    def tearDownClass(cls):
        stop_daemon(cls)

    def test_client_asks_and_is_told(self):
        with patd.Conn(MODEL, max_batch_tokens=16, socket=self.sock) as c:
            self.assertEqual((c.kv_dtype, c.kv_scale), ("fp8_e4m3", self.SCALE))
        with patd.Conn(MODEL, max_batch_tokens=16, socket=self.sock, kv_dtype="fp8_e4m3") as c:
            self.assertEqual(c.kv_dtype, "fp8_e4m3")
        with self.assertRaises(patd.PatError) as cm:
            patd.Conn(MODEL, max_batch_tokens=16, socket=self.sock, kv_dtype="f16")
        self.assertEqual(cm.exception.errno, errno.EMEDIUMTYPE)
        self.assertIn("needs a KV pool of f16; this daemon's holds fp8_e4m3", cm.exception.detail)
        with self.assertRaises(ValueError):
            patd.Conn(MODEL, max_batch_tokens=16, socket=self.sock, kv_dtype="fp4")

    def test_prefix_cache_and_fork_share_fp8_blocks(self):
        """Blocks of an fp8 pool are shared as 16-bit ones are: a second sequence of the same
        prompt gets its full blocks from the cache, and its decode over them gives the very
        bits the first one's gives; so does a fork's."""
        rng = np.random.default_rng(9)
        prompt = list(range(2000, 2040))  # 2 full blocks + 8 tokens
        with patd.Conn(MODEL, max_batch_tokens=64, socket=self.sock) as c:
            a, cached = c.seq_open(prompt)
            self.assertEqual(cached, 0)
            c.step_begin([a], [len(prompt)], prompt)
            for layer in range(MODEL.n_layers):
                c.q[:40] = rng.uniform(-1, 1, (40, 4, 64)).astype(np.float16)
                c.k[:40] = rng.uniform(-2, 2, (40, 2, 64)).astype(np.float16)
                c.v[:40] = rng.uniform(-2, 2, (40, 2, 64)).astype(np.float16)
                c.attend(layer)
            self.assertEqual(c.step_end()["committed"], 1)
            b, cached = c.seq_open(prompt[:32] + [1, 2, 3, 4, 5, 6, 7, 8])
            self.assertEqual(cached, 32)
            f = c.seq_fork(a)
            c.seq_truncate(f, 32)
            c.seq_truncate(a, 32)
            tail = [1, 2, 3, 4, 5, 6, 7, 8]
            outs = []
            for s in (a, b, f):
                c.step_begin([s], [8], tail)
                o = []
                for layer in range(MODEL.n_layers):
                    r = np.random.default_rng(100 + layer)  # the same new tokens for each
                    c.q[:8] = r.uniform(-1, 1, (8, 4, 64)).astype(np.float16)
                    c.k[:8] = r.uniform(-2, 2, (8, 2, 64)).astype(np.float16)
                    c.v[:8] = r.uniform(-2, 2, (8, 2, 64)).astype(np.float16)
                    c.attend(layer)
                    o.append(c.o[:8].copy())
                self.assertEqual(c.step_end()["committed"], 1)
                outs.append(o)
            for o in outs[1:]:
                for x, y in zip(outs[0], o):
                    self.assertTrue(np.array_equal(x.view(np.uint16), y.view(np.uint16)))
            for s in (a, b, f):
                c.seq_close(s)
        self.assertEqual(patd.admin("check", socket=self.sock).split()[1], "ok")

    def test_status_names_the_pool(self):
        st = patd.status(socket=self.sock)
        self.assertEqual(st["kv_dtype"], "fp8_e4m3")
        self.assertEqual(st["kv_scale"], self.SCALE)
        text = patd.admin("status", socket=self.sock)
        self.assertIn("kv_dtype fp8_e4m3\n", text)
        self.assertIn('patd_kv_pool_info{dtype="fp8_e4m3",scale="0.125"} 1',
                      patd.admin("stats", socket=self.sock))

    def test_outputs_over_fp8_values(self):
        rng = np.random.default_rng(8)
        scale = 1.0 / np.sqrt(MODEL.head_dim)
        s = self.SCALE
        worst_q, worst_u = 0.0, 0.0
        with patd.Conn(MODEL, max_batch_tokens=64, socket=self.sock) as c:
            n = 40
            seq, cached = c.seq_open(list(range(900, 900 + n)))
            self.assertEqual(cached, 0)
            c.step_begin([seq], [n], list(range(900, 900 + n)))
            for layer in range(MODEL.n_layers):
                q = rng.uniform(-2, 2, (n, 4, 64)).astype(np.float16)
                k = rng.uniform(-3, 3, (n, 2, 64)).astype(np.float16)
                v = rng.uniform(-3, 3, (n, 2, 64)).astype(np.float16)
                c.q[:n], c.k[:n], c.v[:n] = q, k, v
                c.o[:n] = np.nan
                c.attend(layer)
                out = c.o[:n].astype(np.float64)
                kq = e4m3(k.astype(np.float64) / s) * s
                vq = e4m3(v.astype(np.float64) / s) * s
                for t in range(n):
                    for h in range(4):
                        got = out[t, h]
                        ref_q = reference(q[t, h], kq[:, h // 2], vq[:, h // 2], t + 1, scale)
                        ref_u = reference(q[t, h], k[:, h // 2], v[:, h // 2], t + 1, scale)
                        worst_q = max(worst_q, np.linalg.norm(got - ref_q) / np.linalg.norm(ref_q))
                        worst_u = max(worst_u, np.linalg.norm(got - ref_u) / np.linalg.norm(ref_u))
            self.assertEqual(c.step_end()["committed"], 1)
            c.seq_close(seq)
        print("fp8 e4m3 pool: worst relative error %.2e against attention over its values, %.2e "
              "against the clients' fp16 ones" % (worst_q, worst_u), file=sys.stderr)
        self.assertLess(worst_q, 2e-3)  # fp16 output rounding of the pool's own values
        self.assertGreater(worst_u, 4 * worst_q)  # the pool did not keep fp16


class InvariantDaemonCase(unittest.TestCase):
    """daemon.invariant = 1 (issue 40): a token's output is bitwise the same whatever else its
    step holds. One probe decode token (a fork of a 300-token prompt, the same new Q, K and V),
    its O at every layer, over 20 steps of different company: forks of the prompt cut anywhere
    (so that the prefix tree around the probe changes), prefilling 1-5 tokens each, the probe
    anywhere in the step."""

    @classmethod
    def setUpClass(cls):
        start_daemon(cls, "patd-pyinv.", ["--layers=2", "--q-heads=4", "--kv-heads=2",
                                          "--invariant=1", "--invariant-chunk=128",
                                          "--conn-max-seqs=32"])

    @classmethod
    def tearDownClass(cls):
        stop_daemon(cls)

    def test_status_says_invariant(self):
        self.assertIn("\ninvariant_chunk 128\n", patd.admin("status", socket=self.sock))

    def test_probe_bits_across_steps(self):
        rng = np.random.default_rng(12)
        prompt = [3000 + i for i in range(300)]
        mine = [[rng.uniform(-1, 1, shape).astype(np.float16) for shape in
                 ((4, 64), (2, 64), (2, 64))] for _ in range(MODEL.n_layers)]
        with patd.Conn(MODEL, max_batch_tokens=512, socket=self.sock, max_seqs=32) as c:
            p, _ = c.seq_open(prompt)
            c.step_begin([p], [300], prompt)
            for layer in range(MODEL.n_layers):
                c.q[:300] = rng.uniform(-1, 1, (300, 4, 64)).astype(np.float16)
                c.k[:300] = rng.uniform(-2, 2, (300, 2, 64)).astype(np.float16)
                c.v[:300] = rng.uniform(-2, 2, (300, 2, 64)).astype(np.float16)
                c.attend(layer)
            self.assertEqual(c.step_end()["committed"], 1)
            first, company = None, 0
            for step in range(20):
                probe = c.seq_fork(p)
                others = []
                for _ in range(int(rng.integers(0, 9))):
                    o = c.seq_fork(p)
                    c.seq_truncate(o, int(rng.integers(0, 301)))
                    others.append((o, int(rng.integers(1, 6))))
                company += len(others)
                at = int(rng.integers(0, len(others) + 1))
                order = others[:at] + [(probe, 1)] + others[at:]
                row = sum(n for _, n in order[:at])
                total = sum(n for _, n in order)
                c.step_begin([s for s, _ in order], [n for _, n in order], [7] * total)
                outs = []
                for layer in range(MODEL.n_layers):
                    c.q[:total] = rng.uniform(-1, 1, (total, 4, 64)).astype(np.float16)
                    c.k[:total] = rng.uniform(-2, 2, (total, 2, 64)).astype(np.float16)
                    c.v[:total] = rng.uniform(-2, 2, (total, 2, 64)).astype(np.float16)
                    c.q[row], c.k[row], c.v[row] = mine[layer]
                    c.attend(layer)
                    outs.append(c.o[row].copy().view(np.uint16))
                self.assertEqual(c.step_end()["committed"], 1)
                if first is None:
                    first = outs
                for layer in range(MODEL.n_layers):
                    self.assertTrue(np.array_equal(first[layer], outs[layer]), (step, layer))
                for s, _ in order:
                    c.seq_close(s)
            self.assertGreater(company, 40)
            c.seq_close(p)
        self.assertEqual(patd.admin("check", socket=self.sock).split()[1], "ok")


class OfflineCase(unittest.TestCase):
    """What needs no daemon: the version rule and the bf16 conversions."""

    def test_version_rule(self):
        major, minor, _ = (int(x) for x in patd.__version__.split("."))
        patd._check_version((major, minor, 0))
        patd._check_version((major, minor + 3, 7))  # a newer minor serves an older binding
        for bad in ((major + 1, 0, 0), (major - 1, 99, 0), (major, minor - 1, 9)):
            with self.assertRaises(ImportError) as cm:
                patd._check_version(bad)
            self.assertIn("cannot serve this binding", str(cm.exception))

    def test_constants_match_pat_h(self):
        """The binding's dtype codes and admin operations are pat.h's (the C side checks
        pat.h against the wire's opcodes at compile time)."""
        header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pat.h")
        with open(header) as f:
            text = f.read()
        dtypes = {m.group(1): int(m.group(2))
                  for m in re.finditer(r"#define PAT_(F16|BF16|F32)\s+(\d+)u", text)}
        self.assertEqual(dtypes, {"F16": patd.F16, "BF16": patd.BF16, "F32": patd.F32})
        kv = {int(m.group(2)): m.group(1).lower()
              for m in re.finditer(r"#define PAT_(F16|BF16|F32|FP8_E4M3|FP8_E5M2)\s+(\d+)u", text)}
        self.assertEqual(kv, patd._DTYPE_NAMES)
        admin = {m.group(1).lower(): int(m.group(2))
                 for m in re.finditer(r"PAT_ADMIN_([A-Z]+)\s*=\s*(\d+)", text)}
        self.assertEqual(admin, patd._ADMIN)

    def test_head_dims_match_kern_h(self):
        """patd.transformers refuses the head dims the daemon cannot serve: its list is
        KERN_HEAD_DIMS of kernels/kern.h (read as text: importing patd.transformers needs torch)."""
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "..", "..", "..", "kernels", "kern.h")) as f:
            line = re.search(r"#define KERN_HEAD_DIMS\(X\)(.*)", f.read()).group(1)
        with open(os.path.join(here, "..", "patd", "transformers.py")) as f:
            mine = re.search(r"^HEAD_DIMS = \(([0-9, ]+)\)", f.read(), re.M).group(1)
        self.assertEqual([int(d) for d in re.findall(r"X\((\d+)\)", line)],
                         [int(d) for d in mine.split(",") if d.strip()])

    def test_bf16_conversions(self):
        self.assertEqual(int(patd.float32_to_bf16(np.float32(1.0))), 0x3F80)
        self.assertEqual(int(patd.float32_to_bf16(np.float32(-2.0))), 0xC000)
        # ties round to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
        self.assertEqual(int(patd.float32_to_bf16(np.float32(1 + 2 ** -8))), 0x3F80)
        self.assertEqual(int(patd.float32_to_bf16(np.float32(1 + 3 * 2 ** -8))), 0x3F82)
        self.assertTrue(np.isnan(patd.bf16_to_float32(patd.float32_to_bf16(np.float32("nan")))))
        x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
        back = patd.bf16_to_float32(patd.float32_to_bf16(x))
        self.assertLess(float(np.max(np.abs(back - x) / np.maximum(np.abs(x), 1e-30))), 2 ** -8)
        self.assertEqual(patd.bf16_to_float32(np.array([0x3F80, 0x4049], np.uint16)).tolist(),
                         [1.0, 3.140625])

    def test_arrays_argument_checked(self):
        with self.assertRaises(ValueError):
            patd.Conn(MODEL, max_batch_tokens=16, socket="/nonexistent", arrays="lists")


if __name__ == "__main__":
    unittest.main()
