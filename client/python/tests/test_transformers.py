"""transformers models generating through patd (patd.transformers), against the same model with
transformers' own attention, on a real patd (cpu backend, started here).

Skipped when torch or transformers cannot be imported, unless PATD_REQUIRE_TRANSFORMERS=1
(tests/integ/test_transformers.sh sets it: there a skip is a failure).
Run: PATD_BIN=build/bin/patd PATD_LIBPAT=build/lib/libpat.so.1 python3 -m unittest
     client/python/tests/test_transformers.py
"""

import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import patd  # noqa: E402
from daemon_fixture import start_daemon, stop_daemon  # noqa: E402

try:
    import torch
    import transformers
    import patd.transformers as pt
    from hf_drive import greedy_plan
    WHY_NOT = None
except ImportError as e:  # noqa: F841
    WHY_NOT = "torch / transformers not importable: %s" % e

if WHY_NOT and os.environ.get("PATD_REQUIRE_TRANSFORMERS") == "1":
    raise SystemExit("PATD_REQUIRE_TRANSFORMERS=1 but " + WHY_NOT)

LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2, 4, 2, 64, 512


def tiny_llama(seed=7, dtype="float32", **over):
    """A Llama-shaped model with random weights (large enough that greedy choices are not
    near-ties), in eval mode, attention "eager" (transformers' own)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM, intermediate_size=512,
              num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
              head_dim=HEAD_DIM, max_position_embeddings=1024, initializer_range=0.08,
              rope_theta=10000.0, attn_implementation="eager")
    kw.update(over)
    cfg = transformers.LlamaConfig(**kw)
    return transformers.LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()


def reference_logits(model, tokens, n_new):
    """transformers' own attention over the whole sequence: the next-token logits after each
    of the last n_new + 1 prefixes (teacher-forced with tokens)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False).logits[0].float()
    return out[len(tokens) - n_new - 1:]


@unittest.skipIf(WHY_NOT is not None, WHY_NOT or "")
class TransformersCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start_daemon(cls, "patd-hf.", [
            "--backend=cpu", "--layers=%d" % LAYERS, "--q-heads=%d" % HEADS,
            "--kv-heads=%d" % KV_HEADS, "--head-dim=%d" % HEAD_DIM, "--dtype=f32",
            "--blocks=2048", "--threads=2"])

    @classmethod
    def tearDownClass(cls):
        stop_daemon(cls)

    def engine(self, model, **kw):
        return pt.Engine(model, socket=self.sock, **kw)

    def pool_check(self):
        self.assertEqual(patd.admin("check", socket=self.sock).split()[1], "ok")

    def check_against_reference(self, ref_model, prompt, new, logits, tol):
        """patd's tokens are what transformers' attention picks greedily, and its logits agree
        within tol (max abs, relative to the logits' scale) at every step."""
        ref = reference_logits(ref_model, prompt + new[:-1], len(new) - 1)
        got = torch.stack(logits)
        self.assertEqual(ref.shape, got.shape)
        err = float((ref - got).abs().max() / ref.abs().max())
        self.assertLess(err, tol, "logits differ from transformers' attention by %.2e" % err)
        return err

    def test_requests_share_prefix_join_and_leave(self):
        """Greedy generation for requests sharing a system prompt, joining and leaving
        mid-run, a prompt longer than one step's budget (chunked prefill), beside one that
        shares nothing: tokens identical to transformers' own attention, logits within fp32
        tolerance, the prefix cache used, the pool consistent after every step."""
        model = tiny_llama()
        g = torch.Generator().manual_seed(1)
        system = torch.randint(0, VOCAB, (48,), generator=g).tolist()
        tails = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 9, 3, 7)]
        other = torch.randint(0, VOCAB, (21,), generator=g).tolist()
        longp = torch.randint(0, VOCAB, (150,), generator=g).tolist()
        # (prompt, step it joins at, tokens it generates)
        plan = [(system + tails[0], 0, 6), (system + tails[1], 0, 14), (system + tails[2], 3, 8),
                (other, 5, 5), (longp, 2, 4), (system + tails[3], 9, 5)]
        def on_add(i, r):
            if i == 2:  # the system prompt's full blocks are in the cache by now
                self.assertEqual(r.cached_len, 48, "shared system prompt reused")

        with self.engine(model, max_batch_tokens=96) as eng:
            done = greedy_plan(eng, plan, on_add, self.pool_check)
            self.assertEqual(sorted(i for i, _, _ in done), list(range(len(plan))))
            self.assertGreater(eng.conn.stats()["cached_tokens"], 0)
        model.config._attn_implementation = "eager"
        worst = 0.0
        for i, toks, lgs in done:
            worst = max(worst, self.check_against_reference(model, plan[i][0], toks, lgs, 1e-4))
        print("  6 requests, %d tokens: identical to transformers' eager attention, max logit "
              "error %.1e" % (sum(len(t) for _, t, _ in done), worst))

    def test_staging_sized_from_use(self):
        """The engine asks patd for the staging its steps use: by default a prefill chunk of
        PREFILL_CHUNK tokens (512, where the old default asked for 2048); with max_seqs, the chunk
        plus one decode token for each other sequence. Prompts longer than the chunk are fed in
        chunks, no step carries more than the budget, and the tokens are transformers' own."""
        model = tiny_llama(seed=5)
        with self.engine(model) as eng:
            self.assertEqual((eng.max_batch_tokens, eng.prefill_chunk), (pt.PREFILL_CHUNK,) * 2)
            self.assertEqual(pt.PREFILL_CHUNK, 512)
            self.assertEqual(eng.conn.q.shape[0], 512)  # the staging rows patd made
        with self.engine(model, max_batch_tokens=96) as eng:  # a budget given: chunk = budget
            self.assertEqual((eng.max_batch_tokens, eng.prefill_chunk), (96, 96))
        with self.assertRaises(ValueError):
            self.engine(model, max_batch_tokens=32, prefill_chunk=64)

        g = torch.Generator().manual_seed(4)
        system = torch.randint(0, VOCAB, (32,), generator=g).tolist()
        plan = [(system + torch.randint(0, VOCAB, (5,), generator=g).tolist(), 0, 6),
                (torch.randint(0, VOCAB, (150,), generator=g).tolist(), 1, 4),
                (system + torch.randint(0, VOCAB, (9,), generator=g).tolist(), 2, 5)]
        with self.engine(model, max_seqs=4, prefill_chunk=40) as eng:
            self.assertEqual((eng.max_batch_tokens, eng.prefill_chunk), (43, 40))
            self.assertEqual(eng.conn.q.shape[0], 43)
            steps = []
            begin = eng.conn.step_begin

            def record(seqs, n_new, toks):
                steps.append(list(n_new))
                return begin(seqs, n_new, toks)
            eng.conn.step_begin = record
            done = greedy_plan(eng, plan, None, self.pool_check)
        self.assertEqual(sorted(i for i, _, _ in done), [0, 1, 2])
        self.assertLessEqual(max(sum(n) for n in steps), 43)
        self.assertEqual(max(max(n) for n in steps), 40)  # the long prompt, a chunk at a time
        model.config._attn_implementation = "eager"
        for i, toks, lgs in done:
            self.check_against_reference(model, plan[i][0], toks, lgs, 1e-4)

    def test_generate_and_fork_sampling(self):
        """generate(): greedy for two prompts; then n = 3 samples per prompt through fork (the
        children share the prompt's KV): each sample's logits match transformers' attention over
        that sample's own tokens, and patd holds nothing afterwards."""
        model = tiny_llama(seed=11)
        g = torch.Generator().manual_seed(2)
        prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (40, 17)]
        with self.engine(model) as eng:
            greedy = eng.generate(prompts, max_new_tokens=10)
            samples = eng.generate(prompts, max_new_tokens=6, n=3, temperature=1.5,
                                   generator=torch.Generator().manual_seed(3))
            self.assertEqual(eng.requests, [])
        self.assertEqual(patd.status(socket=self.sock)["sequences"], 0)
        model.config._attn_implementation = "eager"
        for p, (toks,) in zip(prompts, greedy):
            # greedy with transformers' attention alone (model.generate() cannot run on Debian
            # 12's torch 1.13 under Python 3.11: its torch.distributed import fails)
            ref = list(p)
            with torch.no_grad():
                for _ in range(10):
                    lg = model(input_ids=torch.tensor([ref]), use_cache=False).logits[0, -1]
                    ref.append(int(torch.argmax(lg)))
            self.assertEqual(toks, ref[len(p):], "greedy tokens equal transformers' own")
        for p, group in zip(prompts, samples):
            self.assertEqual(len(group), 3)
            self.assertTrue(all(len(s) == 6 for s in group))
            self.assertGreater(len(set(map(tuple, group))), 1, "samples differ")
            for s in group:  # every sample's tokens are probable under the reference
                ref = reference_logits(model, p + s[:-1], len(s) - 1)
                prob = torch.softmax(ref / 1.5, dim=-1)
                for k, tok in enumerate(s):
                    self.assertGreater(float(prob[k, tok]), 1e-6, "sampled token %d" % k)

    def test_bf16_model(self):
        """A bf16 model on a f32 daemon is refused (the dtype is part of the model signature),
        with the daemon's reason."""
        model = tiny_llama(dtype="bfloat16")
        with self.assertRaises(patd.PatError) as cm:
            self.engine(model)
        self.assertIn("dtype", str(cm.exception).lower() + cm.exception.detail.lower())

    def test_refused_features(self):
        """What patd does not serve is refused before connecting, naming the feature."""
        cases = [
            (tiny_llama(head_dim=32, hidden_size=HEADS * 32), "head_dim 32"),
            (tiny_llama(num_key_value_heads=3, num_attention_heads=6, hidden_size=6 * 64),
             None),  # a valid shape the daemon does not serve: connect refuses it
            (transformers.MistralForCausalLM(transformers.MistralConfig(
                vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                sliding_window=4096)), "sliding-window"),
            (transformers.BloomForCausalLM(transformers.BloomConfig(
                vocab_size=64, hidden_size=128, n_layer=1, n_head=2)), "ALiBi"),
            (transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
                vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64)), "sliding-window"),
            (transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
                vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                sliding_window=None)), "soft-capping"),
        ]
        rescaled = tiny_llama()
        for m in rescaled.modules():
            if hasattr(m, "scaling") and hasattr(m, "layer_idx"):
                m.scaling = 0.2  # a scale the daemon (1/sqrt(64) = 0.125) does not apply
        cases.append((rescaled, "softmax scale of 0.2"))
        for model, feature in cases:
            if feature is None:
                with self.assertRaises(patd.PatError) as cm:
                    self.engine(model)
                self.assertEqual(cm.exception.errno, __import__("errno").EMEDIUMTYPE)
                continue
            with self.assertRaises(pt.UnsupportedModel) as cm:
                self.engine(model)
            self.assertIn(feature, str(cm.exception))
        # a Mistral without sliding window is served
        m = transformers.MistralForCausalLM(transformers.MistralConfig(
            vocab_size=64, hidden_size=HEADS * HEAD_DIM, intermediate_size=128,
            num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
            head_dim=HEAD_DIM, sliding_window=None)).eval()
        with self.engine(m) as eng:
            (toks,), = eng.generate([[1, 2, 3, 4, 5]], max_new_tokens=3)
            self.assertEqual(len(toks), 3)

    def test_attention_outside_engine_refused(self):
        """A model switched to patd's attention but run outside an Engine says so."""
        model = tiny_llama()
        pt.register()
        model.config._attn_implementation = "patd"
        with self.assertRaises(RuntimeError) as cm:
            with torch.no_grad():
                model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=False)
        self.assertIn("outside", str(cm.exception))


@unittest.skipIf(WHY_NOT is not None, WHY_NOT or "")
class Fp8TransformersCase(unittest.TestCase):
    """A bf16 Llama-shaped model generating 128 tokens a request through a daemon whose pool is
    fp8 e4m3 (model.kv_dtype, issue 40) and through one whose pool is bf16: what fp8 costs."""

    @classmethod
    def setUpClass(cls):
        args = ["--backend=cpu", "--layers=%d" % LAYERS, "--q-heads=%d" % HEADS,
                "--kv-heads=%d" % KV_HEADS, "--head-dim=%d" % HEAD_DIM, "--dtype=bf16",
                "--blocks=2048", "--threads=2"]
        cls.b16, cls.f8 = types.SimpleNamespace(), types.SimpleNamespace()
        start_daemon(cls.b16, "patd-hf16.", args)
        start_daemon(cls.f8, "patd-hf8.", args + ["--kv-dtype=fp8_e4m3"])

    @classmethod
    def tearDownClass(cls):
        stop_daemon(cls.b16)
        stop_daemon(cls.f8)

    def test_generate_through_fp8_pool(self):
        """Per pool: the logits' largest error against transformers' eager attention over the
        same tokens (teacher-forced on the pool's own greedy tokens), and how often the pool's
        greedy token is eager attention's argmax; between the pools: the tokens generated. A
        model of random weights in bf16 has near-ties (a median gap of about 7 % between its two
        best logits), so free-running generations part early whatever perturbs them; the
        teacher-forced figures are the measure, the agreement is reported."""
        model = tiny_llama(seed=7, dtype="bfloat16")
        g = torch.Generator().manual_seed(7)
        plan = [(torch.randint(0, VOCAB, (n,), generator=g).tolist(), 0, 128) for n in (32, 20)]
        runs = {}
        for name, d in (("bf16", self.b16), ("fp8_e4m3", self.f8)):
            model.config._attn_implementation = "eager"
            with pt.Engine(model, socket=d.sock) as eng:
                self.assertEqual(eng.conn.kv_dtype, name)
                runs[name] = sorted(greedy_plan(eng, plan))
        model.config._attn_implementation = "eager"
        figs = {}
        for name, done in runs.items():
            err, hit, n = 0.0, 0, 0
            for i, toks, lgs in done:
                ref = reference_logits(model, plan[i][0] + toks[:-1], len(toks) - 1)
                got = torch.stack(lgs)
                err = max(err, float((ref - got).abs().max() / ref.abs().max()))
                hit += int((ref.argmax(dim=-1) == torch.tensor(toks)).sum())
                n += len(toks)
            figs[name] = (err, hit / n)
        same = sum(a == b for (_, x, _), (_, y, _) in zip(runs["bf16"], runs["fp8_e4m3"])
                   for a, b in zip(x, y))
        first = [next((k for k, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                 for (_, x, _), (_, y, _) in zip(runs["bf16"], runs["fp8_e4m3"])]
        print("  fp8 e4m3 pool: logits within %.3f of eager attention (bf16 pool %.3f), greedy "
              "token = eager argmax on %.0f %% of 256 positions (bf16 pool %.0f %%); the two "
              "pools' generations: %d of 256 tokens equal, first difference at %s"
              % (figs["fp8_e4m3"][0], figs["bf16"][0], 100 * figs["fp8_e4m3"][1],
                 100 * figs["bf16"][1], same, first))
        self.assertLess(figs["bf16"][0], 0.05)
        self.assertLess(figs["fp8_e4m3"][0], 0.25)  # a wrong factor or layout gives ~1
        self.assertGreater(figs["fp8_e4m3"][1], 0.6)


if __name__ == "__main__":
    unittest.main()
