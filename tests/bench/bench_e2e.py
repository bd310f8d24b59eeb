"""End-to-end decode steps of a Llama-3-8B-shaped model (bf16, random weights, 32 layers, 32/8
heads, d 128, FFN 14336, vocabulary 128256; client/python/examples/llama_patd.py's model code)
four ways, on the same GPU in the same run:

  patd        attention in patd across processes (under MPS: tests/gpu/run.sh starts it), the
              projections written straight into the session's staging tensors
  flashinfer  in-process FlashInfer paged decode (BatchDecodeWithPagedKVCacheWrapper, tensor
              cores on, pages of 16 tokens; requests that share a system prompt share its pages
              in their page tables, read once per request: the decode kernel is not
              prefix-aware)
  sdpa        transformers' own sdpa attention function (sdpa_attention_forward) over a dense
              per-request cache padded to the longest context, padding masked: what a
              transformers model with attn_implementation="sdpa" and a static cache runs, in
              this file's model code so that only the attention differs (SdpaAttention; first
              run on a GPU: tests/bench/log/2026-11-26-e2e-sdpa.md)
  dense       the same dense cache with llama_patd.DenseAttention's einsum attention (what the
              example frontend compares with)

Batches 1, 16, 64 and 256, each with and without a shared 2,048-token system prompt (with: every
request is the system prompt + 32 own tokens; without: 512 own tokens). patd and FlashInfer run
each case twice: eagerly, then with the model's forward captured in one CUDA graph and replayed
(patd's hand-offs inside the graph, pat_attend_async; FlashInfer's planned for graphs); the
eager steps are bound by the model's Python and launches, the replayed ones by the GPU. Per
case: the median decode step of each (CUDA-synchronised wall time, 16 steps after 4 warm-ups;
the replayed step includes the CPU's step_begin / plan and step_end), the attention share (CUDA
events around every layer's attention call, hand-off included for patd), tokens/s, and patd /
flashinfer. (The daemon's layer-time metric runs from the layer's start, so it counts the wait
for the client's Q too: it cannot split out the hand-off, and the first GPU run's attempt
gave negative hand-offs.) patd_start: the daemon's mean time per replayed step from
STEP_BEGIN received to layer 0 enqueued on its lane (start_us: patd_step_start_seconds_total
over patd_step_starts_total), its share of layer 0's longer attention call, and its stages from
patd_step_stage_seconds_total (queue, prepare, lane_wait, upload, enqueue; pack_us: the plan,
part of prepare). A case whose
caches do not fit the GPU beside the model is reported as skipped, with its size.

    python3 tests/bench/bench_e2e.py --patd build/gpu/bin/patd [--json FILE] [--layers 32]
      [--batches 1,16,64,256] [--ways patd,flashinfer,dense] [--prompts both|unshared|shared]
      [--timeline 16] [--patd-opt=--OPTION=VALUE ...] [--patd-b PATD] [--rounds N]

--patd-b starts a second daemon (a base revision's build: tests/gpu/ab_e2e.sh) beside the first;
way patd_b runs it as way patd runs the first, in the same process over the same model, and
--rounds alternates the two that many times per case, each going first in every other round: an
A/B of a daemon change with FlashInfer in the same run.

--timeline names the batches whose patd and FlashInfer steps are also replayed from a graph with
CUDA events around every layer's attention call (Stamped): one step's GPU time split into the
attention calls (for patd the whole hand-off) and the rest of the model.

A case patd refuses is reported as skipped with the daemon's error (the first GPU run's batch
256 over the shared prompt was, by a block quota that counted shared blocks once per sequence;
it counts distinct blocks since).
"""

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "examples"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))

import torch  # noqa: E402

import bench_frontend  # noqa: E402
import patd  # noqa: E402
from llama_patd import Config, DenseAttention, Llama, PatdAttention  # noqa: E402

PAGE = 16
SYS_LEN, OWN_SHARED, OWN_UNSHARED = 2048, 32, 512
STEPS = 20  # decode steps of each loop (4 warm-up + 16 timed): eager, then replayed from a graph
DECODE = 2 * STEPS


class Timed:
    """Wraps an attention back-end: CUDA events around every attend() call."""

    def __init__(self, inner):
        self.inner = inner
        self.events = []
        self.on = False

    def buffers(self, n):
        return self.inner.buffers(n)

    def attend(self, layer, q, k, v):
        if not self.on:
            return self.inner.attend(layer, q, k, v)
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        o = self.inner.attend(layer, q, k, v)
        b.record()
        self.events.append((a, b))
        return o

    def take_ms(self):
        torch.cuda.synchronize()
        t = sum(a.elapsed_time(b) for a, b in self.events)
        self.events = []
        return t


class FlashInferAttention:
    """In-process paged KV (pages of PAGE tokens) and FlashInfer's batch decode. Prefill (not
    timed) attends over the request's gathered pages in PyTorch; decode appends the step's K/V
    to each request's page and runs the wrapper planned for the step."""

    def __init__(self, cfg, n_pages, batch, max_indices):
        import flashinfer
        self.cfg = cfg
        shape = (cfg.layers, n_pages, PAGE, cfg.kv_heads, cfg.head_dim)
        self.K = torch.zeros(shape, dtype=cfg.dtype, device="cuda")
        self.V = torch.zeros(shape, dtype=cfg.dtype, device="cuda")
        self.free = list(range(n_pages - 1, -1, -1))
        self.ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
        self.w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.ws, "NHD",
                                                               use_tensor_cores=True)
        # the same decode for CUDA graphs: fixed batch, page tables in buffers the plan fills,
        # the step's KV slots in tensors updated in place (graph_on)
        i32 = dict(dtype=torch.int32, device="cuda")
        self.ws_g = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
        self.wg = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.ws_g, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(batch + 1, **i32),
            paged_kv_indices_buffer=torch.zeros(max_indices, **i32),
            paged_kv_last_page_len_buffer=torch.zeros(batch, **i32))
        self.pg_g = torch.zeros(batch, dtype=torch.long, device="cuda")
        self.sl_g = torch.zeros(batch, dtype=torch.long, device="cuda")
        self.graph_on = False
        self.tables, self.lens = [], []
        self.mode = None

    def new_request(self, prefix_of=None, prefix_len=0):
        """A request whose page table starts with another's first prefix_len tokens (whole
        pages), or empty."""
        t = list(self.tables[prefix_of][:prefix_len // PAGE]) if prefix_of is not None else []
        self.tables.append(t)
        self.lens.append(len(t) * PAGE)
        return len(self.tables) - 1

    def _grow(self, r, new_len):
        while len(self.tables[r]) * PAGE < new_len:
            self.tables[r].append(self.free.pop())

    def buffers(self, n):
        c = self.cfg
        return (torch.empty(n, c.q_heads, c.head_dim, device="cuda", dtype=c.dtype),
                torch.empty(n, c.kv_heads, c.head_dim, device="cuda", dtype=c.dtype),
                torch.empty(n, c.kv_heads, c.head_dim, device="cuda", dtype=c.dtype))

    def _slots(self, r, start, n):
        pos = torch.arange(start, start + n, device="cuda")
        pages = torch.tensor(self.tables[r], device="cuda", dtype=torch.long)[pos // PAGE]
        return pages, pos % PAGE

    def begin_prefill(self, r, n):
        self.mode = ("prefill", r, self.lens[r], n)
        self._grow(r, self.lens[r] + n)

    def begin_decode(self, reqs):
        for r in reqs:
            self._grow(r, self.lens[r] + 1)
        indptr, indices, last = [0], [], []
        for r in reqs:
            n = self.lens[r] + 1
            pages = self.tables[r][:(n + PAGE - 1) // PAGE]
            indices += pages
            indptr.append(len(indices))
            last.append(n - (len(pages) - 1) * PAGE)
        c = self.cfg
        i32 = dict(dtype=torch.int32, device="cuda")
        w = self.wg if self.graph_on else self.w
        w.plan(torch.tensor(indptr, **i32), torch.tensor(indices, **i32),
               torch.tensor(last, **i32), c.q_heads, c.kv_heads, c.head_dim, PAGE,
               q_data_type=c.dtype, kv_data_type=c.dtype)
        pg, sl = [], []
        for r in reqs:
            pos = self.lens[r]
            pg.append(self.tables[r][pos // PAGE])
            sl.append(pos % PAGE)
        if self.graph_on:
            self.pg_g.copy_(torch.tensor(pg))
            self.sl_g.copy_(torch.tensor(sl))
            self.mode = ("decode", self.pg_g, self.sl_g)
        else:
            self.mode = ("decode", torch.tensor(pg, device="cuda"),
                         torch.tensor(sl, device="cuda"))

    def end_step(self, reqs_or_r, n=1):
        for r in (reqs_or_r if isinstance(reqs_or_r, list) else [reqs_or_r]):
            self.lens[r] += n

    def attend(self, layer, q, k, v):
        c = self.cfg
        if self.mode[0] == "decode":
            _, pg, sl = self.mode
            self.K[layer, pg, sl] = k
            self.V[layer, pg, sl] = v
            return (self.wg if self.graph_on else self.w).run(q, (self.K[layer], self.V[layer]))
        _, r, c0, n = self.mode
        pg, sl = self._slots(r, c0, n)
        self.K[layer, pg, sl] = k
        self.V[layer, pg, sl] = v
        apg, asl = self._slots(r, 0, c0 + n)
        K = self.K[layer, apg, asl].transpose(0, 1)  # [kvh, L, d]
        V = self.V[layer, apg, asl].transpose(0, 1)
        g = c.q_heads // c.kv_heads
        K = K.repeat_interleave(g, 0)
        V = V.repeat_interleave(g, 0)
        i = torch.arange(n, device="cuda")[:, None]
        j = torch.arange(c0 + n, device="cuda")[None, :]
        mask = j <= c0 + i
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), K, V, attn_mask=mask)  # [h, n, d]
        return o.transpose(0, 1).contiguous()


class SdpaAttention(DenseAttention):
    """DenseAttention whose decode steps attend through transformers' own sdpa attention function
    (transformers.integrations.sdpa_attention.sdpa_attention_forward: GQA by repeat_kv, then
    torch's scaled_dot_product_attention), over the same dense cache padded to the longest
    context, with the padding masked: the attention a transformers model with its "sdpa"
    implementation and a static cache runs, inside this file's model code (prefill, not timed,
    stays DenseAttention's)."""

    def __init__(self, cfg, slots, max_len):
        super().__init__(cfg, slots, max_len)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        self.sdpa = sdpa_attention_forward
        self.module = torch.nn.Module()
        self.module.num_key_value_groups = cfg.q_heads // cfg.kv_heads
        self.module.is_causal = True

    def attend(self, layer, q, k, v):
        if not self.batched:
            return super().attend(layer, q, k, v)
        c = self.cfg
        B = len(self.step[0])
        rows = torch.arange(B, device=q.device)
        self.K[rows, layer, self.len_t - 1] = k
        self.V[rows, layer, self.len_t - 1] = v
        key = self.K[:B, layer, :self.lmax].transpose(1, 2)  # [B, kvh, L, d]
        value = self.V[:B, layer, :self.lmax].transpose(1, 2)
        query = q.view(B, 1, c.q_heads, c.head_dim).transpose(1, 2)  # [B, qh, 1, d]
        o, _ = self.sdpa(self.module, query, key, value, self.mask[:, None, None, :],
                         scaling=1.0 / math.sqrt(c.head_dim), is_causal=False)
        return o.reshape(B, c.q_heads, c.head_dim)


class Stamped:
    """Wraps an attention back-end for one more captured graph: CUDA events recorded as graph
    nodes (external events) before and after every layer's attention call and at both ends of
    the forward, so that a replay shows where one step's GPU time goes. For patd the attention
    call is the hand-off (ready written, the daemon's append and forward, done seen); for
    FlashInfer the KV scatter and the decode kernel. Its own graph, not the timed one: the 66
    event nodes would add to the step's time."""

    def __init__(self, inner, layers):
        def ev():
            return torch.cuda.Event(enable_timing=True, external=True)
        self.inner = inner
        self.a = [ev() for _ in range(layers)]
        self.b = [ev() for _ in range(layers)]
        self.start, self.end = ev(), ev()

    def buffers(self, n):
        return self.inner.buffers(n)

    def attend(self, layer, q, k, v):
        self.a[layer].record()
        o = self.inner.attend(layer, q, k, v)
        self.b[layer].record()
        return o

    def split_ms(self):
        """one replay (synchronised): step, attention (sum and per layer), the rest"""
        attn = [x.elapsed_time(y) for x, y in zip(self.a, self.b)]
        total = self.start.elapsed_time(self.end)
        return {"step_ms": total, "attn_ms": sum(attn), "rest_ms": total - sum(attn),
                "attn_layer_us": [1e3 * x for x in attn]}


def timeline(model, inner, layers, tok, pos, begin, end, abort, toks):
    """Captures the forward once more with Stamped around inner and replays it 8 times; the
    medians of step, attention and rest, and the median attention call of each layer (us)."""
    st = Stamped(inner, layers)
    begin(toks)
    abort()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        st.start.record()
        model.forward(tok, pos, st)
        st.end.record()
    runs = []
    for _ in range(8):
        begin(toks)
        g.replay()
        end()
        torch.cuda.synchronize()
        runs.append(st.split_ms())
    del g
    out = {k: median([r[k] for r in runs]) for k in ("step_ms", "attn_ms", "rest_ms")}
    per = sorted(x for r in runs for x in r["attn_layer_us"])
    out["attn_call_us_median"] = per[len(per) // 2]
    out["attn_call_us_p90"] = per[int(len(per) * 0.9)]
    out["attn_call_us_by_layer"] = [round(median([r["attn_layer_us"][i] for r in runs]), 1)
                                    for i in range(layers)]
    return out


def prompts_for(batch, shared, vocab, rng):
    if shared:
        system = [rng.randrange(vocab) for _ in range(SYS_LEN)]
        return [system + [rng.randrange(vocab) for _ in range(OWN_SHARED)] for _ in range(batch)]
    return [[rng.randrange(vocab) for _ in range(OWN_UNSHARED)] for _ in range(batch)]


def median(v):
    return sorted(v)[len(v) // 2]


def first_tokens(batch):
    """The tokens every way's first decode step feeds."""
    return [1 + i % 50 for i in range(batch)]


def timed_steps(batch, lens0, load, run, after=lambda: None):
    """STEPS decode steps from first_tokens: load(toks, lens) before the clock, then
    run(toks, loaded, timed) -> logits (loaded: what load returned; timed for the last 16),
    CUDA-synchronised; after() once a timed step is done. Returns the timed steps' wall times."""
    toks = first_tokens(batch)
    lens = list(lens0)
    times = []
    for step in range(STEPS):
        loaded = load(toks, lens)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = run(toks, loaded, step >= 4)
        torch.cuda.synchronize()
        if step >= 4:
            times.append(time.perf_counter() - t0)
            after()
        toks = logits.argmax(-1).tolist()
        lens = [x + 1 for x in lens]
    return times


def decode_loop(model, attn, begin, end, batch, lens0):
    """4 warm-up + 16 timed decode steps; returns (median step s, median attention ms)."""
    att = []

    def run(toks, loaded, timed):
        attn.on = timed
        begin(toks)
        logits = model.forward(loaded[0], loaded[1], attn)
        end()
        return logits

    times = timed_steps(batch, lens0,
                        lambda toks, lens: (torch.tensor(toks, device="cuda"),
                                            torch.tensor(lens, device="cuda")),
                        run, lambda: att.append(attn.take_ms()))
    return median(times), median(att)


def graph_loop(model, attn, begin, end, abort, batch, lens0, stamp=False):
    """STEPS decode steps replayed from one CUDA graph of the model's forward (hand-offs and
    attention included; captured once, after a warm-up step that commits nothing); the median of
    the last 16 (CUDA-synchronised wall time, the CPU's per-step begin and end included). With
    stamp, then the timeline of a step (timeline()): returns (median, timeline or None)."""
    tok = torch.zeros(batch, dtype=torch.long, device="cuda")
    pos = torch.zeros(batch, dtype=torch.long, device="cuda")

    def load(toks, lens):
        tok.copy_(torch.tensor(toks))
        pos.copy_(torch.tensor(lens))

    toks = first_tokens(batch)
    load(toks, lens0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # allocations before the capture
        begin(toks)
        model.forward(tok, pos, attn)
        abort()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    begin(toks)  # a plan for the capture to read (FlashInfer); patd captures outside a step
    abort()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = model.forward(tok, pos, attn)

    def run(toks, loaded, timed):
        begin(toks)
        g.replay()
        end()
        return out

    times = timed_steps(batch, lens0, load, run)
    del g
    tl = None
    if stamp:
        tl = timeline(model, attn, len(model.layers), tok, pos, begin, end, abort,
                      first_tokens(batch))
    return median(times), tl


def run_patd(cfg, model, sock, prompts, stamp=False):
    conn = patd.Conn(model=cfg.patd_model(), max_batch_tokens=4096, socket=sock, label="e2e")
    attn = Timed(PatdAttention(conn))
    seqs, lens, pend = [], [], []
    for phase in (prompts[:1], prompts[1:]):  # the first alone: the others find its prefix
        for p in phase:
            s, c = conn.seq_open(p)
            seqs.append(s)
            lens.append(c)
            pend.append(p[c:])
        bench_frontend.prefill(conn, model, attn, seqs, lens, pend)
    b = len(seqs)
    step, att = decode_loop(model, attn, lambda toks: conn.step_begin(seqs, [1] * b, toks),
                            lambda: conn.step_end(), b, lens)
    lens = [x + STEPS for x in lens]
    in_step = [False]

    def begin(toks):
        conn.step_begin(seqs, [1] * b, toks)
        in_step[0] = True

    def abort():
        if in_step[0]:
            conn.step_end(abort=True)
        in_step[0] = False

    def end():
        conn.replayed()
        conn.step_end()
        in_step[0] = False

    m0 = bench_frontend.tf.stats(sock)
    gstep, tl = graph_loop(model, PatdAttention(conn), begin, end, abort, b, lens, stamp)
    m1 = bench_frontend.tf.stats(sock)
    # the daemon's share of the layer-0 gap over the replayed steps: STEP_BEGIN received to
    # layer 0 enqueued on the lane, its stages and, within prepare, the plan (pack); per step
    starts, secs, stages = bench_frontend.tf.step_stages(m1, m0)
    n = max(1, starts)
    start = {"start_us": secs / n * 1e6, **{k + "_us": v / n * 1e6 for k, v in stages.items()}}
    packs = m1["patd_pack_total"] - m0["patd_pack_total"]
    start["pack_us"] = (m1["patd_pack_seconds_total"] - m0["patd_pack_seconds_total"]) \
        / max(1, packs) * 1e6
    for s in seqs:
        conn.seq_close(s)
    conn.close()
    return step, att, gstep, tl, start


def run_flashinfer(cfg, model, prompts, shared, stamp=False):
    need = sum((len(p) + DECODE + 24 + PAGE - 1) // PAGE for p in prompts)
    if shared:
        need = (SYS_LEN // PAGE) + len(prompts) * ((OWN_SHARED + DECODE + 24) // PAGE + 2)
    # the graph plan's page list names a shared page once per request
    logical = sum((len(p) + DECODE + 24 + PAGE - 1) // PAGE for p in prompts)
    fi = FlashInferAttention(cfg, need + 8, len(prompts), logical + 8)
    attn = Timed(fi)
    reqs = []
    for i, p in enumerate(prompts):
        if shared and i > 0:
            r = fi.new_request(prefix_of=0, prefix_len=SYS_LEN)
        else:
            r = fi.new_request()
        c0 = fi.lens[r]
        rest = p[c0:]
        fi.begin_prefill(r, len(rest))
        model.forward(torch.tensor(rest, device="cuda"),
                      torch.arange(c0, len(p), device="cuda"), attn)
        fi.end_step(r, len(rest))
        reqs.append(r)
    lens = [fi.lens[r] for r in reqs]
    step, att = decode_loop(model, attn, lambda toks: fi.begin_decode(reqs),
                            lambda: fi.end_step(reqs), len(reqs), lens)
    fi.graph_on = True
    gstep, tl = graph_loop(model, fi, lambda toks: fi.begin_decode(reqs),
                           lambda: fi.end_step(reqs), lambda: None, len(reqs),
                           [fi.lens[r] for r in reqs], stamp)
    del fi
    torch.cuda.empty_cache()
    return step, att, gstep, tl


def run_dense(cfg, model, prompts, cls=DenseAttention):
    b, L = len(prompts), max(map(len, prompts)) + DECODE + 8
    bytes_ = 2 * b * cfg.layers * L * cfg.kv_heads * cfg.head_dim * 2
    free, _ = torch.cuda.mem_get_info()
    if bytes_ > free - (4 << 30):
        return None, "dense cache of %.1f GB does not fit beside the model" % (bytes_ / 1e9)
    ref = Timed(cls(cfg, b, L))
    for i, p in enumerate(prompts):
        ref.inner.begin([i], [0], [len(p)])
        model.forward(torch.tensor(p, device="cuda"), torch.arange(len(p), device="cuda"), ref)
    lens = [len(p) for p in prompts]
    st = {"lens": list(lens)}

    def begin(toks):
        ref.inner.begin(list(range(b)), st["lens"], [1] * b)

    def end():
        st["lens"] = [x + 1 for x in st["lens"]]

    step, att = decode_loop(model, ref, begin, end, b, lens)
    del ref
    torch.cuda.empty_cache()
    return (step, att), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patd", required=True)
    ap.add_argument("--json")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--ways", default="patd,flashinfer,sdpa,dense")
    ap.add_argument("--prompts", default="both", choices=("both", "unshared", "shared"),
                    help="the cases without the shared system prompt, with it, or both")
    ap.add_argument("--timeline", default="16",
                    help="batches whose patd and FlashInfer steps also get a timeline "
                    "(Stamped: attention calls against the rest of the step); '' for none")
    ap.add_argument("--patd-opt", action="append", default=[],
                    help="one more daemon option (repeatable), e.g. --patd-opt=--dependent-launch=0")
    ap.add_argument("--patd-b",
                    help="a second patd (e.g. a base revision's build), started beside the first "
                    "under its own name: way patd_b runs it as way patd runs the first")
    ap.add_argument("--rounds", type=int, default=1,
                    help="each case's patd ways run this many times, alternating (an A/B with "
                    "--patd-b); <way>_graph_step_ms is the best round, <way>_graph_rounds_ms all")
    a = ap.parse_args()
    stamp_batches = {int(x) for x in a.timeline.split(",") if x}
    import test_frontend as tf
    cfg = Config(layers=a.layers, q_heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
                 rope_theta=500000.0)
    tf.CFG = cfg
    ways = a.ways.split(",")
    rundir = tempfile.mkdtemp(prefix="patd-e2e-")
    daemon, sock = tf.start_daemon(a.patd, rundir, extra=["--step-timeout-ms=60000",
                                                          "--blocks=12288"] + a.patd_opt)
    daemons = {"patd": (daemon, sock)}
    if a.patd_b:
        rundir_b = tempfile.mkdtemp(prefix="patd-e2e-b-")
        daemons["patd_b"] = tf.start_daemon(a.patd_b, rundir_b,
                                            extra=["--step-timeout-ms=60000", "--blocks=12288",
                                                   "--name=tb"] + a.patd_opt)
        ways.append("patd_b")
    print("device %s; model %d layers, 32/8 heads, d 128, FFN 14336, vocab 128256, bf16"
          % (torch.cuda.get_device_name(), cfg.layers), flush=True)
    model = Llama(cfg, seed=1, draw_on="cuda")  # 8B parameters: drawn on the GPU
    js = open(a.json, "a") if a.json else None
    try:
        for shared in {"both": (False, True), "unshared": (False,),
                       "shared": (True,)}[a.prompts]:
            for batch in [int(x) for x in a.batches.split(",")]:
                prompts = prompts_for(batch, shared, cfg.vocab, random.Random(batch))
                res = {"batch": batch, "shared_prompt": SYS_LEN if shared else 0,
                       "layers": cfg.layers, "device": torch.cuda.get_device_name()}
                stamp = batch in stamp_batches
                for rnd in range(a.rounds):
                    # the daemons take turns going first (the start order of the two daemons
                    # biases a pair, not the order here: tests/gpu/ab_e2e.sh runs both start
                    # orders, tests/bench/ab_e2e_summary.py)
                    for w in ("patd", "patd_b") if rnd % 2 == 0 else ("patd_b", "patd"):
                        if w not in ways or w + "_skipped" in res:
                            continue
                        try:
                            s, att, gs, tl, st = run_patd(cfg, model, daemons[w][1], prompts,
                                                          stamp and rnd == 0)
                        except patd.PatError as e:  # e.g. the session's block quota
                            res[w + "_skipped"] = str(e)
                            continue
                        rounds = res.get(w + "_graph_rounds_ms", []) + [gs * 1e3]
                        best = min(rounds)
                        res.update({w + "_step_ms": s * 1e3, w + "_attn_ms": att,
                                    w + "_tok_s": batch / s, w + "_graph_step_ms": best,
                                    w + "_graph_tok_s": batch / best * 1e3,
                                    w + "_graph_rounds_ms": rounds, w + "_start": st})
                        if tl:
                            res[w + "_timeline"] = tl
                if "patd_graph_step_ms" in res and "patd_b_graph_step_ms" in res:
                    res["patd_over_patd_b_graph"] = \
                        res["patd_graph_step_ms"] / res["patd_b_graph_step_ms"]
                if "flashinfer" in ways:
                    s, att, gs, tl = run_flashinfer(cfg, model, prompts, shared, stamp)
                    res.update(fi_step_ms=s * 1e3, fi_attn_ms=att, fi_tok_s=batch / s,
                               fi_graph_step_ms=gs * 1e3, fi_graph_tok_s=batch / gs)
                    if tl:
                        res["fi_timeline"] = tl
                for way, cls in (("dense", DenseAttention), ("sdpa", SdpaAttention)):
                    if way not in ways:
                        continue
                    try:
                        r, why = run_dense(cfg, model, prompts, cls)
                    except Exception as e:  # noqa: BLE001 (reported, the other ways go on)
                        r, why = None, "%s: %s" % (type(e).__name__, e)
                    if r:
                        res.update({way + "_step_ms": r[0] * 1e3, way + "_attn_ms": r[1],
                                    way + "_tok_s": batch / r[0]})
                    else:
                        res[way + "_skipped"] = why
                    torch.cuda.empty_cache()
                if "patd_step_ms" in res and "fi_step_ms" in res:
                    res["patd_over_fi"] = res["patd_step_ms"] / res["fi_step_ms"]
                    res["patd_over_fi_graph"] = res["patd_graph_step_ms"] / res["fi_graph_step_ms"]
                print(json.dumps(res), flush=True)
                if js:
                    js.write(json.dumps(res) + "\n")
    finally:
        for p, _ in daemons.values():
            p.terminate()
            p.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
