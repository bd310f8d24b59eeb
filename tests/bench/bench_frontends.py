"""Many frontends, one GPU (issue 36): N frontend processes of a Llama-shaped model decoding at
once through one patd, against the same sequences as ONE frontend with the union batch and
against N frontends that each run their own attention in process (FlashInfer's paged decode, as
tests/bench/bench_e2e.py uses it), all under MPS on the same GPU in the same run.

The model: client/python/examples/llama_patd.py's Llama with Llama-3-8B's attention shape (32
query heads, 8 KV heads, head_dim 128, bf16) and, so that 16 copies fit beside the KV caches, a
few layers (--layers, default 4), FFN 4096 and a vocabulary of 8,192 (tests/gpu/test_frontend.py's
model): 0.44 G parameters, 0.87 GB of weights per frontend. Every frontend holds its own copy
(the same seed: the same weights); sharing them would save memory but not bandwidth, since each
frontend's GEMMs read them every step anyway, which the floors below count.

The workload, per configuration (N frontends x batch B): frontend i's B sequences are, with the
shared prompt, one --prompt-tokens system prompt (the same in every frontend: patd's prefix cache
holds it once, for every session of this user) + --user-tokens tokens of their own; without it,
--prompt-tokens + --user-tokens tokens all their own (the same context length, nothing shared).
Each frontend prefills (patd: chunks of --max-batch-tokens; frontend 0 first, so that the others
find the system prompt cached), takes 2 steps to warm up, and waits at a barrier; then all step
together, --warmup seconds before the window and --seconds in it (steps that end inside the
window count). Every sequence decodes greedily and is truncated back to its prompt after
--decode-len tokens, so that the context stays within [prompt, prompt + decode-len) however fast
a configuration steps. The union frontend is one process with the N x B sequences of the N
frontends. A step is CUDA-synchronised wall time: tensors in, step begin, the forward with its
hand-offs, step end, the argmax read back.

Every way (patd, union, in-process) starts from a clean slate. The frontend processes are a pool
that lives through the whole run (a process takes ~10 s to start: interpreter, CUDA, weights), so
before each way every one of them releases what the ways before it left: its patd session is
closed when its run ends (staging unmapped), its objects are dropped and collected (reference
cycles too), and the caching allocator's free blocks and cuBLAS's workspaces go back to the
driver. A frontend whose PyTorch allocations still exceed those it had with its weights alone by
more than LEAK_GIB (a leak release cannot undo) is replaced by a fresh process, and the log says
so. The daemon is stopped before the in-process way of a configuration (its KV pool is GPU
memory the in-process frontends would otherwise not have) and started again for the next patd
way, so every configuration's patd runs start on a fresh daemon (an empty prefix cache). Each
way's start prints the GPU's free memory then (the daemon running or stopped) and the
frontends' PyTorch allocations; the table has it as "free G".

Reported per configuration: aggregate tokens/s (tokens of the steps in the window / window),
against the union frontend and against the in-process frontends; p50 and p99 step time (all
frontends' steps pooled, and the worst frontend's p99; per frontend in the JSON); attention time
per layer two ways: the frontend's (CUDA events around each attend call on the frontend's stream:
for patd the whole hand-off, waiting for the daemon included; for FlashInfer the KV scatter and
the decode) and the daemon's (its metrics over the window: --attn-metric / --attn-count-metric,
by default patd_layer_seconds_total / patd_layers_total, whose HELP text the log prints; on the
cuda backend this counter runs over each GPU step from its start to its end, so it holds the
frontend's work between hand-offs too, and the frontend's events are the closer measure of
attention alone; every counter's delta is in the JSON, a better metric the daemon grows
included); KV bytes the daemon's plans read per layer; daemon CPU cores
(utime + stime of /proc/<patd pid>/stat over the window / the window; idle before the first
run; "-" while it is stopped for the in-process way); the most steps in flight at once (patd's
status, polled every 0.2 s); and healthy frontends cut (step errors in the window, prefill and
warm-up steps cut (each taken again, up to 3 times, so that the window still has N frontends),
refused sessions; must be 0: the exit status is 1 otherwise; an in-process frontend's failure
is shown but is no daemon's cut). A run in which fewer frontends stepped through the window
than its configuration has (one refused, e.g. for CUDA out-of-memory, lost, or given up after
GIVE_UP_AFTER errors in a row) is incomplete: its tokens/s is that of fewer frontends, so no
ratio is taken with it ("-" in xunion / xinpr) and a target that only it measured is reported
as invalid, not met or missed. The
floors, per round of one step of every frontend: weight bytes (N copies; once for the union) +
distinct KV bytes over the read bandwidth, and GEMM FLOPs over the bf16 tensor-core rate (both
measured as bench_frontend.floors() does), and the tokens/s ceiling they give. The CPU phases
of each step, every frontend's median ("step phases": the inputs and the step's begin; the
forward's enqueue but its attend calls; the attend calls (patd: the hand-offs' enqueue); its end (patd: waiting for STEP_END's answer, given once the daemon ran the
last layer; FlashInfer: its bookkeeping); the argmax read back, which waits for the GPU),
averaged over the frontends: where a step's time goes on the CPU side.

If `patd --help` lists an option named cross_pack (cross-session packing, issue 36), every patd
run of N frontends is made with cross_pack=0 and with cross_pack=1 (a daemon of each, restarted
between them in ABBA order over the configurations), and attention per layer is compared;
otherwise one daemon configuration, and the log says so. --patd-arg K=V (repeatable) passes
--K=V to every daemon, after this script's own options (the last one wins).

--churn: N = the largest of --n, shared prompt, patd only: half the frontends (rounded up) step
through the whole --churn-seconds window; the other half are fresh processes that join (cold:
interpreter, CUDA context, weights, session, prefill), step --churn-life seconds and leave,
alternately by closing their session and by SIGKILLing themselves in the middle of a step; a
new one takes each leaver's place until the window ends. Reported: joins, leaves, first-step
times, the steady frontends' step times, and every step error (the target is 0).
--slow: at every N >= 2 of --n, one run with one daemon and one set of frontends whose window
is --slow-pairs pairs of --slow-window s windows (default 8 of 1.5 s; the order within a pair
alternates: on-off, off-on, ...): in one window of each pair frontend 0 sleeps 300 ms before
handing layer layers/2 over on every 10th step, in the other it does not (the pool's shared flag,
which the parent sets at each window's start; nothing restarts). The other frontends' step rate
is counted in each window after its first SLOW_GUARD_S s (a sleep begun in the window before has
ended by then), and each pair gives the ratio with / without; reported: the ratios' median,
quartiles and range, and how many sleeps each pair had (and that none overlapped the counted
part of a window without them). The target (the others at most 5 % slower): the median's
verdict, "not shown" where the quartiles are further apart than the 5 % itself. The slow
frontend's own cuts are reported apart (it is slow, not stalled: patd should keep its lane, but
may cut it while others wait).

    python3 tests/bench/bench_frontends.py --patd build/gpu/bin/patd [--n 1,2,4,8,16]
        [--batch 8] [--prompt-tokens 2048] [--seconds 5] [--layers 4] [--prompts both]
        [--patd-arg K=V ...] [--churn] [--slow] [--slow-pairs 8] [--slow-window 1.5]
        [--no-matrix] [--quick] [--json FILE] [--daemon-log FILE] [--deadline S]
    python3 tests/bench/bench_frontends.py --device cpu --patd build/bin/patd   # smoke

Issue 36's "4 frontends x batch 16" targets: --n 4 --batch 16 --prompts shared (--batch takes a
comma list). The default run is estimated at 5-7 minutes on an H100 (28 runs of about 8 s, 38
with cross_pack's two daemons, and a daemon start per configuration), --quick (N = 1, 4, 16,
shared prompt only) at 2-3; --slow adds one run of 1 + 24 s of stepping (default pairs and
windows) per N >= 2, --churn one of --churn-seconds. --device cpu: the same code path on the cpu
backend with a tiny model (host sessions, attention in process by DenseAttention instead of
FlashInfer; no floors; --slow: 4 pairs of 1 s windows): a smoke test of the orchestration.
--deadline S: no run starts S seconds after the script did (the rest are listed as skipped).
tests/gpu/run.sh --frontends [quick|modes] runs it on the GPU host under MPS.
"""

import argparse
import gc
import importlib.util
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "examples"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))

import torch  # noqa: E402

import patd  # noqa: E402
from llama_patd import Config, DenseAttention, Llama, PatdAttention  # noqa: E402
import test_frontend as tf  # noqa: E402

SLOW_S = 0.3        # --slow: the sleep inside a layer (issue 36's slow frontend) ...
SLOW_EVERY = 10     # ... on every 10th step
# --slow: the first seconds of every window that are not counted: a sleep begun just before the
# flag changed has ended by then (SLOW_S + 50 ms for the rest of that step)
SLOW_GUARD_S = SLOW_S + 0.05
SLOW_TARGET = 0.05  # issue 36: the others' step rate at most 5 % lower beside the slow one
# a frontend whose PyTorch allocations, after it released a way, exceed those it had with its
# weights alone by more than this is replaced by a fresh process (a leak release cannot undo;
# 0.25 GiB: above cuBLAS workspaces and small caches, below one in-process KV cache)
LEAK_GIB = 0.25
GIVE_UP_AFTER = 5   # consecutive step errors after which a frontend stops for this run
SETUP_STEPS = 2     # warm-up steps of each frontend before the barrier (cuBLAS, plans)
STATUS_EVERY_S = 0.2  # how often the parent polls patd's status for steps in flight
# the model and sizes where --device does not say otherwise: tests/gpu/test_frontend.py's
# model; the cpu smoke's are tiny so that 2 host cores step it
SIZES = {"cuda": dict(layers=4, q_heads=32, kv_heads=8, head_dim=128, ffn=4096, vocab=8192,
                      n="1,2,4,8,16", batch="8", prompt_tokens=2048, user_tokens=32,
                      seconds=5.0, warmup=1.0, decode_len=128, max_batch_tokens=2048,
                      churn_seconds=20.0, churn_life="2,5", slow_pairs=8, slow_window=1.5),
         "cpu": dict(layers=2, q_heads=4, kv_heads=2, head_dim=64, ffn=256, vocab=512,
                     n="1,2", batch="2", prompt_tokens=64, user_tokens=8, seconds=1.5,
                     warmup=0.5, decode_len=16, max_batch_tokens=256, churn_seconds=15.0,
                     churn_life="1,2", slow_pairs=4, slow_window=1.0)}


def make_cfg(o):
    return Config(layers=o["layers"], q_heads=o["q_heads"], kv_heads=o["kv_heads"],
                  head_dim=o["head_dim"], ffn=o["ffn"], vocab=o["vocab"])


def prompts_for(o, shared, frontend, batch):
    """Frontend `frontend`'s `batch` prompts (deterministic in every process): the system prompt
    + own tokens, or as many tokens all their own."""
    P, U, V = o["prompt_tokens"], o["user_tokens"], o["vocab"]
    system = random.Random("system").choices(range(V), k=P)
    out = []
    for j in range(batch):
        r = random.Random("%s/%d/%d" % ("shared" if shared else "own", frontend, j))
        out.append(system + r.choices(range(V), k=U) if shared else r.choices(range(V), k=P + U))
    return out


def pct(v, q):
    """The q-quantile of v (nearest rank); None for an empty v."""
    if not v:
        return None
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


# ------------------------------------------------------------------------------------------
# frontend processes


class Hook:
    """Wraps a frontend's attention back-end: times every attend call (CUDA events on the
    frontend's stream, or the host clock on cpu), and before layer `mid`'s hand-off sleeps
    (slow) or SIGKILLs its own process mid-step (kill: churn's crash)."""

    def __init__(self, layers, dev):
        self.inner, self.dev, self.mid = None, dev, layers // 2
        self.slow = self.kill = False
        if dev == "cuda":
            self.a = [torch.cuda.Event(enable_timing=True) for _ in range(layers)]
            self.b = [torch.cuda.Event(enable_timing=True) for _ in range(layers)]
        self.host_s = [0.0] * layers

    def buffers(self, n):
        return self.inner.buffers(n)

    def attend(self, layer, q, k, v):
        if layer == self.mid:
            if self.slow:
                time.sleep(SLOW_S)
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
        if self.dev == "cuda":
            t = time.perf_counter()
            self.a[layer].record()
            o = self.inner.attend(layer, q, k, v)
            self.b[layer].record()
            self.host_s[layer] = time.perf_counter() - t  # its CPU time (step phases)
            return o
        t = time.perf_counter()
        o = self.inner.attend(layer, q, k, v)
        self.host_s[layer] = time.perf_counter() - t
        return o

    def attn_ms(self):
        """The attend calls of the step just finished (its result read back: synchronised)."""
        if self.dev == "cuda":
            return sum(a.elapsed_time(b) for a, b in zip(self.a, self.b))
        return 1e3 * sum(self.host_s)


class Frontend:
    """One frontend's batch of sequences through one attention way: patd (a session), flashinfer
    (bench_e2e.FlashInferAttention's paged KV and batch decode) or dense (llama_patd's
    DenseAttention). open() prefills, step() decodes one token of every sequence, reset() takes
    every sequence back to its prompt, close() frees everything."""

    def __init__(self, model, cfg, o, way, prompts, label):
        self.model, self.cfg, self.o, self.way, self.prompts = model, cfg, o, way, prompts
        self.dev, self.label = o["device"], label
        self.plens = [len(p) for p in prompts]
        self.lens = list(self.plens)
        self.toks = [1 + i % 50 for i in range(len(prompts))]  # bench_e2e.first_tokens
        self.since_reset = 0
        self.hook = Hook(cfg.layers, self.dev)
        self.conn = self.fi = self.ref = None
        self.in_step = False
        self.setup_errors = []  # step errors of the prefill and warm-up (each retried)

    def t(self, values):
        return torch.tensor(values, device=self.dev)

    def open(self, shared):
        getattr(self, "_open_" + self.way)(shared)

    def _open_patd(self, shared):
        o = self.o
        self.conn = patd.Conn(model=self.cfg.patd_model(), max_batch_tokens=o["max_batch_tokens"],
                              socket=o["sock"], label=self.label, arrays="torch")
        self.mps = self.conn.mps
        attn = PatdAttention(self.conn)
        self.hook.inner = attn
        self.seqs, lens, pend = [], [], []
        self.cached = 0
        # the first alone: the others (here and in the other frontends) find its prefix cached
        for group in (self.prompts[:1], self.prompts[1:]):
            for p in group:
                s, c = self.conn.seq_open(p)
                self.seqs.append(s)
                lens.append(c)
                pend.append(p[c:])
                self.cached += c
            while any(pend):  # prefill in chunks of at most max_batch_tokens
                ids, n_new, flat, pos, take = [], [], [], [], self.conn.max_batch_tokens
                for i, rest in enumerate(pend):
                    if rest and take > 0:
                        k = min(len(rest), take)
                        ids.append(self.seqs[i])
                        n_new.append(k)
                        flat += rest[:k]
                        pos += [lens[i] + j for j in range(k)]
                        take -= k

                def chunk():
                    self.conn.step_begin(ids, n_new, flat)
                    self.in_step = True
                    self.model.forward(self.t(flat), self.t(pos), attn)
                    self.in_step = False
                    self.conn.step_end()
                self.retrying(chunk)
                for i, k in zip([self.seqs.index(x) for x in ids], n_new):
                    lens[i] += k
                    pend[i] = pend[i][k:]

    def retrying(self, fn, tries=3):
        """fn() (a prefill or warm-up step); a step error is recorded (self.setup_errors: a cut
        like any other) and the step taken again, up to `tries` times."""
        for t in range(tries):
            try:
                return fn()
            except patd.PatError as e:
                self.abort()
                self.setup_errors.append("%s: %s" % (type(e).__name__, e))
                if t == tries - 1:
                    raise

    def _open_flashinfer(self, shared):
        from bench_e2e import PAGE, FlashInferAttention
        P, d = self.o["prompt_tokens"], self.o["decode_len"]
        # pages as if nothing were shared (an upper bound), and as many page-table entries
        need = sum((n + d + 2 + PAGE - 1) // PAGE for n in self.plens) + 8
        fi = FlashInferAttention(self.cfg, need, len(self.prompts), need)
        self.fi, self.hook.inner = fi, fi
        self.reqs = []
        for i, p in enumerate(self.prompts):
            r = fi.new_request(prefix_of=0, prefix_len=P) if shared and i else fi.new_request()
            c0 = fi.lens[r]
            fi.begin_prefill(r, len(p) - c0)
            self.model.forward(self.t(p[c0:]), torch.arange(c0, len(p), device=self.dev), fi)
            fi.end_step(r, len(p) - c0)
            self.reqs.append(r)

    def _open_dense(self, shared):
        self.ref = DenseAttention(self.cfg, len(self.prompts),
                                  max(self.plens) + self.o["decode_len"] + 2, device=self.dev)
        self.hook.inner = self.ref
        for i, p in enumerate(self.prompts):
            self.ref.begin([i], [0], [len(p)])
            self.model.forward(self.t(p), torch.arange(len(p), device=self.dev), self.ref)

    def step(self):
        """One decode step of every sequence; returns the step's attention ms (Hook)."""
        if self.since_reset >= self.o["decode_len"]:
            self.reset()
        t0 = time.monotonic()
        tt, pp = self.t(self.toks), self.t(self.lens)
        b = len(self.prompts)
        if self.way == "patd":
            self.conn.step_begin(self.seqs, [1] * b, self.toks)
            self.in_step = True
        elif self.way == "flashinfer":
            self.fi.begin_decode(self.reqs)
        else:
            self.ref.begin(list(range(b)), self.lens, [1] * b)
        t1 = time.monotonic()
        logits = self.model.forward(tt, pp, self.hook)
        t2 = time.monotonic()
        if self.way == "patd":
            self.in_step = False
            self.conn.step_end()
        elif self.way == "flashinfer":
            self.fi.end_step(self.reqs)
        t3 = time.monotonic()
        self.toks = logits.argmax(-1).tolist()
        # CPU phases of the step (ms): inputs and begin, the forward's enqueue, the step's end
        # (patd: STEP_END's answer, once the daemon ran the last layer), the argmax read back
        att = 1e3 * sum(self.hook.host_s)
        self.phases = [1e3 * (t1 - t0), 1e3 * (t2 - t1) - att, att, 1e3 * (t3 - t2),
                       1e3 * (time.monotonic() - t3)]
        self.lens = [x + 1 for x in self.lens]
        self.since_reset += 1
        return self.hook.attn_ms()

    def abort(self):
        """After a failed step: ends it on the daemon's side if it is still open."""
        if self.way == "patd" and self.in_step:
            self.in_step = False
            try:
                self.conn.step_end(abort=True)
            except patd.PatError:
                pass

    def reset(self):
        if self.way == "patd":
            for s, n in zip(self.seqs, self.plens):
                self.conn.seq_truncate(s, n)
        elif self.way == "flashinfer":
            for r, n in zip(self.reqs, self.plens):
                self.fi.lens[r] = n
        self.lens = list(self.plens)
        self.since_reset = 0

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = self.fi = self.ref = self.hook.inner = None
        if self.dev == "cuda":
            torch.cuda.empty_cache()


def step_loop(fe, t_go, t0, t1, slow, pipe=None, life_s=None, kill=False, info=()):
    """Steps fe from t_go until t1 (time.monotonic, the same clock in every process). slow: None,
    or the pool's shared flag: while it is set, every SLOW_EVERY-th step sleeps (Hook). Returns
    {"steps": [[end, seconds, attention ms, process cpu s, slept], ...], "errors": [...], ...}.
    Churn (life_s): leaves after life_s seconds past the first step, or when the parent says
    stop; kill: by SIGKILLing this process mid-step (its records sent first)."""
    while time.monotonic() < t_go:
        time.sleep(min(0.01, max(0.0, t_go - time.monotonic())))
    recs, errors, consecutive, k, first = [], [], 0, 0, None
    out = dict(info, steps=recs, errors=errors, gave_up=False, left=None)
    while time.monotonic() < t1:
        if pipe is not None and pipe.poll():
            pipe.recv()  # stop
            out["left"] = "stopped"
            break
        if life_s is not None and first is not None and time.monotonic() - first >= life_s:
            out["left"] = "killed" if kill else "closed"
            if kill:
                pipe.send({"op": "records", **out})
                fe.hook.kill = True  # the next step dies before layer layers/2's hand-off
            else:
                break
        fe.hook.slow = slow is not None and slow.value != 0 and k % SLOW_EVERY == 0
        ts = time.monotonic()
        try:
            ms = fe.step()
        except (patd.PatError, RuntimeError) as e:
            fe.abort()
            errors.append({"t": time.monotonic(), "step": k, "error": "%s: %s" % (
                type(e).__name__, e), "errno": getattr(e, "errno", None), "slow": fe.hook.slow})
            consecutive += 1
            k += 1
            if consecutive >= GIVE_UP_AFTER:
                out["gave_up"] = True
                break
            continue
        te = time.monotonic()
        if first is None:
            first = te
            out["first_step_s"] = te - ts
        consecutive = 0
        recs.append([te, te - ts, ms, time.process_time(), int(fe.hook.slow),
                     getattr(fe, "phases", None)])
        k += 1
    if out["left"] is None:
        out["left"] = "gave up" if out["gave_up"] else "window over"
    return out


def child_init(o):
    torch.set_num_threads(1)  # the frontends' host work is launches; 16 of them share the cores
    if o["device"] == "cuda":
        torch.cuda.init()
    cfg = make_cfg(o)
    model = Llama(cfg, seed=1, device=o["device"], draw_on=o["device"])
    return cfg, model


def memory(dev):
    """This process's memory and the GPU's: free and total GiB on the device (every process's
    use counted), PyTorch's allocated and reserved GiB here; on cpu the resident set only."""
    if dev != "cuda":
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {"free_gib": None, "total_gib": None, "allocated_gib": None,
                "reserved_gib": None, "rss_gib": rss / 2**30}
    free, total = torch.cuda.mem_get_info()
    return {"free_gib": free / 2**30, "total_gib": total / 2**30,
            "allocated_gib": torch.cuda.memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30, "rss_gib": None}


def release(dev):
    """Gives back what the way before left: objects in reference cycles (a FlashInfer wrapper,
    a step's traceback) collected, the caching allocator's free blocks and cuBLAS's workspaces
    returned to the driver. A patd session is closed by Frontend.close already (its staging
    unmapped)."""
    gc.collect()
    if dev == "cuda":
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear:
            clear()
        torch.cuda.empty_cache()


def pool_main(idx, pipe, o, flag):
    """A pool frontend: builds the model once, then serves the parent's runs (JSON-able dicts
    over a multiprocessing pipe): floors, release (memory figures back), run (setup, ready, go,
    done), exit. flag: the pool's shared slow flag (--slow), read by a run told it is slow."""
    try:
        cfg, model = child_init(o)
        release(o["device"])
        pipe.send(dict(memory(o["device"]), up=True, pid=os.getpid()))
    except Exception as e:  # noqa: BLE001 (reported to the parent)
        pipe.send({"up": False, "error": "%s: %s" % (type(e).__name__, e)})
        return
    while True:
        try:
            msg = pipe.recv()
        except EOFError:
            return
        if msg["op"] == "exit":
            return
        if msg["op"] == "release":
            release(o["device"])
            pipe.send(memory(o["device"]))
            continue
        if msg["op"] == "floors":
            import bench_frontend
            bw, tc = bench_frontend.floors()
            release(o["device"])
            pipe.send({"bw": bw, "tc": tc, "gpu": torch.cuda.get_device_name()})
            continue
        ro = dict(o, **msg)
        prompts = [p for f in msg["prompt_frontends"]
                   for p in prompts_for(ro, msg["shared"], f, msg["batch"])]
        fe = Frontend(model, cfg, ro, msg["way"], prompts, msg["label"])
        t = time.monotonic()
        try:
            fe.open(msg["shared"])
            if o["device"] == "cuda":
                # the prefill's activations back to the driver before the window (the others
                # may still be prefilling); the warm-up steps take what decode needs
                torch.cuda.empty_cache()
            for _ in range(SETUP_STEPS):
                fe.retrying(fe.step)
        except Exception as e:  # noqa: BLE001 (a refused session is a result)
            fe.abort()
            fe.close()
            pipe.send({"ready": False, "error": "%s: %s" % (type(e).__name__, e),
                       "errno": getattr(e, "errno", None), "setup_errors": fe.setup_errors})
            fe = None
            continue
        pipe.send({"ready": True, "setup_s": time.monotonic() - t, "setup_errors": fe.setup_errors,
                   "cached_tokens": getattr(fe, "cached", None), "mps": getattr(fe, "mps", None)})
        go = pipe.recv()
        if go["op"] != "go":
            fe.close()
            fe = None
            continue
        res = step_loop(fe, go["t_go"], go["t0"], go["t1"], flag if msg.get("slow") else None)
        fe.close()
        fe = None  # nothing of this way left referenced here: the next release frees it all
        pipe.send(dict(res, done=True))


def churn_main(idx, pipe, o):
    """A churning frontend: a fresh process that joins at once (cold), steps life_s seconds past
    its first step and leaves (closes, or SIGKILLs itself mid-step). Sends records as it goes;
    startup_s runs from the parent's spawn (interpreter, imports, CUDA, weights, session,
    prefill) to the session's first step."""
    try:
        cfg, model = child_init(o)
        fe = Frontend(model, cfg, o, "patd", prompts_for(o, True, o["frontend"], o["batch"]),
                      "churn%d" % o["frontend"])
        fe.open(True)
    except Exception as e:  # noqa: BLE001 (its session refused, or its prefill, the first step,
        pipe.send({"op": "records", "refused": "%s: %s" % (type(e).__name__, e),  # failed)
                   "errno": getattr(e, "errno", None), "steps": [], "errors": [],
                   "setup_errors": fe.setup_errors if "fe" in locals() else []})
        return
    res = step_loop(fe, 0.0, 0.0, o["t1"], None, pipe=pipe, life_s=o["life_s"], kill=o["kill"],
                    info={"startup_s": time.monotonic() - o["t_spawn"],
                          "setup_errors": fe.setup_errors})
    fe.close()
    pipe.send(dict(res, op="records"))


# ------------------------------------------------------------------------------------------
# the parent


def proc_cpu_s(pid):
    """utime + stime of every thread of pid, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def metrics(sock):
    """Every sample of the daemon's stats (Prometheus text): name{labels} -> value; HELP text."""
    vals, helps = {}, {}
    for line in patd.admin("stats", socket=sock).splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            helps[name] = text
        elif line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                vals[k] = float(v)
            except ValueError:
                pass
    return vals, helps


class Daemon:
    """The patd this script starts (tests/gpu/test_frontend.start_daemon: cuda backend, 4
    executors; cpu with --device cpu), restarted when a run needs another variant (cross_pack)
    and stopped while the in-process frontends run (their memory is the GPU's, not what the
    daemon's pool leaves); its log is appended to --daemon-log."""

    def __init__(self, a, o, extra):
        self.a, self.o, self.extra = a, o, extra
        self.p = self.sock = self.variant = self.rundir = None
        self.idle = {}
        self.log_pos = 0

    def ensure(self, variant):
        if self.p is not None and self.variant == variant and self.p.poll() is None:
            return
        self.stop()
        self.rundir = tempfile.mkdtemp(prefix="patd-frontends-")
        args = self.extra + ["--%s=%s" % kv for kv in sorted(variant.items())]
        self.p, self.sock = tf.start_daemon(self.a.patd, self.rundir, extra=args)
        self.variant, self.log_pos = dict(variant), 0
        key = vname(variant)
        if key not in self.idle:  # the idle daemon's CPU, once per variant
            c0, t0 = proc_cpu_s(self.p.pid), time.monotonic()
            time.sleep(1.0)
            self.idle[key] = (proc_cpu_s(self.p.pid) - c0) / (time.monotonic() - t0)
        print("patd %s (pid %d) on %s, %s" % (key, self.p.pid, self.sock,
                                                " ".join(args)), flush=True)

    @property
    def running(self):
        return self.p is not None

    def new_log(self):
        """The log lines since the last call ("" while stopped)."""
        if self.p is None:
            return ""
        path = os.path.join(self.rundir, "patd.log")
        with open(path, errors="replace") as f:
            f.seek(self.log_pos)
            text = f.read()
            self.log_pos = f.tell()
        return text

    def stop(self):
        if self.p is None:
            return
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        if self.a.daemon_log:
            with open(self.a.daemon_log, "a") as out, \
                    open(os.path.join(self.rundir, "patd.log"), errors="replace") as f:
                out.write("==== patd %s (pid %d)\n" % (vname(self.variant), self.p.pid))
                shutil.copyfileobj(f, out)
        shutil.rmtree(self.rundir, ignore_errors=True)
        self.p = self.sock = self.rundir = None


def vname(variant):
    return ",".join("%s=%s" % kv for kv in sorted(variant.items())) or "defaults"


def vlabel(variant):
    return " " + vname(variant) if variant else ""


class Pool:
    """Frontend processes (multiprocessing, spawn), each with the model built once, and the one
    shared flag that makes a run's slow frontend sleep (--slow; 0: not now)."""

    def __init__(self, ctx, o, n):
        self.ctx, self.o = ctx, o
        self.flag = ctx.RawValue("b", 0)
        self.procs, self.pipes, self.up = [None] * n, [None] * n, [None] * n
        for i in range(n):
            self.start(i)
        for i in range(n):
            self.wait_up(i)

    def start(self, i):
        mine, theirs = self.ctx.Pipe()
        p = self.ctx.Process(target=pool_main, args=(i, theirs, self.o, self.flag), daemon=True)
        p.start()
        theirs.close()
        self.procs[i], self.pipes[i] = p, mine

    def wait_up(self, i):
        """Frontend i's first message: its memory with the weights alone (memory())."""
        m = self.recv(i, 300)
        if not m or not m.get("up"):
            raise RuntimeError("frontend %d did not start: %s" % (i, m))
        self.up[i] = m

    def end(self, i):
        try:
            self.pipes[i].send({"op": "exit"})
        except (OSError, ValueError):
            pass
        self.procs[i].join(20)
        if self.procs[i].is_alive():
            self.procs[i].kill()
            self.procs[i].join()

    def shrink(self, n):
        """Ends the frontends past the first n (fewer CUDA contexts beside churn's fresh ones)."""
        for i in range(n, len(self.procs)):
            self.end(i)
        del self.procs[n:], self.pipes[n:], self.up[n:]

    def renew(self, idx):
        """Fresh processes for the frontends idx (started together: ~10 s, not 10 s each)."""
        for i in idx:
            self.end(i)
        for i in idx:
            self.start(i)
        for i in idx:
            self.wait_up(i)

    def release(self, idx=None):
        """Every frontend (or idx) gives back what the way before left (release()); returns
        {frontend: its memory() after, or None where it did not answer}."""
        idx = range(len(self.procs)) if idx is None else idx
        for i in idx:
            try:
                self.pipes[i].send({"op": "release"})
            except (OSError, ValueError):
                pass
        return {i: self.recv(i, 120) for i in idx}

    def recv(self, i, timeout):
        """The next message of frontend i, or None when it died or said nothing in time."""
        try:
            if self.pipes[i].poll(timeout):
                return self.pipes[i].recv()
        except (EOFError, OSError):
            pass
        return None

    def replace(self, i):
        """A fresh process for frontend i (it died or hung)."""
        if self.procs[i].is_alive():
            self.procs[i].kill()
        self.procs[i].join(10)
        self.start(i)
        self.wait_up(i)

    def close(self):
        self.flag.value = 0
        for i, p in enumerate(self.procs):
            try:
                self.pipes[i].send({"op": "exit"})
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(20)
            if p.is_alive():
                p.kill()


def clean_slate(pool, daemon, label):
    """Before a way: every pool frontend releases what earlier ways left; one whose PyTorch
    allocations still exceed its weights' by LEAK_GIB is replaced by a fresh process. Prints and
    returns the GPU's free memory then (frontend 0's view, after all released; the daemon up
    for a patd way, stopped for an in-process one) and the frontends' own figures."""
    ms = pool.release()
    held = {i: m["allocated_gib"] - pool.up[i]["allocated_gib"] for i, m in ms.items()
            if m and m.get("allocated_gib") is not None and
            pool.up[i].get("allocated_gib") is not None}
    why = {i: "did not answer" for i, m in ms.items() if m is None}
    why.update({i: "held %.2f GiB more tensors than its weights after releasing" % x
                for i, x in held.items() if x > LEAK_GIB})
    renew = sorted(why)
    if renew:
        print("    before %s: %s; fresh processes for them" % (label, "; ".join(
            "frontend %d %s" % (i, why[i]) for i in renew)), flush=True)
        pool.renew(renew)
        ms = pool.release()
    m0 = pool.release([0])[0] or {}
    got = [m for m in ms.values() if m]

    def span(k):
        v = [m[k] for m in got if m.get(k) is not None]
        return (min(v), max(v)) if v else None

    res = {"gpu_free_gib_start": m0.get("free_gib"), "gpu_total_gib": m0.get("total_gib"),
           "fe_allocated_gib_start": span("allocated_gib"),
           "fe_reserved_gib_start": span("reserved_gib"), "fe_rss_gib_start": span("rss_gib"),
           "fresh_frontends": renew, "patd_running": daemon.running}
    state = "patd running" if daemon.running else "patd stopped"

    def spans(k):
        return "-" if res[k] is None else "%.2f-%.2f" % res[k]

    if res["gpu_total_gib"] is not None:
        print("    %s starts: %s of %.1f GiB of GPU memory free (%s); the frontends' PyTorch "
              "allocations %s GiB, reserved %s GiB"
              % (label, fmt(res["gpu_free_gib_start"], "%.1f"), res["gpu_total_gib"], state,
                 spans("fe_allocated_gib_start"), spans("fe_reserved_gib_start")), flush=True)
    else:
        print("    %s starts: %s; the frontends' resident memory %s GiB (no GPU figures: %s)"
              % (label, state, spans("fe_rss_gib_start"),
                 "cpu" if pool.o["device"] == "cpu" else "frontend 0 did not answer"),
              flush=True)
    return res


def poll_window(daemon, t0, t1, patd_way, flag=None, toggles=()):
    """Sleeps through the window [t0, t1], sampling the daemon at both ends (its metrics and
    CPU time; nothing while it is stopped) and, for patd runs, its steps in flight every
    STATUS_EVERY_S. toggles: [(time, value)] written to flag at those times (--slow's windows;
    the flag is 0 again at the end); the times they were written are returned."""
    todo, done = sorted(toggles), []

    def apply():
        while todo and todo[0][0] <= time.monotonic():
            flag.value = todo.pop(0)[1]
            done.append([time.monotonic(), flag.value])

    try:
        while time.monotonic() < t0:
            time.sleep(min(0.05, max(0.0, t0 - time.monotonic())))
        apply()
        up = daemon.running
        if up:
            m0, helps = metrics(daemon.sock)
            c0, w0 = proc_cpu_s(daemon.p.pid), time.monotonic()
        inflight, next_poll = [], time.monotonic()
        while time.monotonic() < t1:
            apply()
            if patd_way and up and time.monotonic() >= next_poll:
                try:
                    inflight.append(patd.status(socket=daemon.sock)["steps_in_flight"])
                except patd.PatError:
                    pass
                next_poll = time.monotonic() + STATUS_EVERY_S
            wake = [t1]
            if todo:
                wake.append(todo[0][0])
            if patd_way and up:
                wake.append(next_poll)
            time.sleep(min(STATUS_EVERY_S, max(0.0, min(wake) - time.monotonic())))
    finally:
        if flag is not None:
            flag.value = 0
    out = {"inflight_max": max(inflight) if inflight else None,
           "inflight_mean": sum(inflight) / len(inflight) if inflight else None,
           "toggles": done}
    if not up:
        return dict(out, daemon_cpu_cores=None, daemon_delta={}), {}
    c1, w1 = proc_cpu_s(daemon.p.pid), time.monotonic()
    m1, _ = metrics(daemon.sock)
    delta = {k: m1[k] - m0.get(k, 0.0) for k in m1
             if "_total" in k or k.endswith("_sum") or k.endswith("_count")}
    return dict(out, daemon_cpu_cores=(c1 - c0) / (w1 - w0), daemon_delta=delta), helps


CUT_RE = re.compile(r"\bcut|releasing the step|stall_cut_ms")


def run(pool, daemon, a, o, way, n, batch, shared, label, union=False, slow=None):
    """One configuration: N frontends (or the union frontend) set up from a clean slate,
    released together, stepped through the window; returns its numbers. slow: None, or
    {"pairs", "window"}: the window is that many pairs of windows in which frontend 0 sleeps
    (the shared flag set) or not, in alternating order, and res["slow_pairs"] compares them."""
    P = o["prompt_tokens"]
    idx = [0] if union else list(range(n))
    res = {"way": way, "label": label, "n": n, "batch": batch, "union": union,
           "slow": slow is not None, "shared_prompt": P if shared else 0, "frontends": len(idx),
           "seqs_per_frontend": n * batch if union else batch,
           "variant": vname(daemon.variant) if way == "patd" else None}
    res.update(clean_slate(pool, daemon, label))
    msgs = []
    for j, i in enumerate(idx):
        msgs.append({"op": "run", "way": way, "shared": shared, "sock": daemon.sock,
                     "batch": batch, "prompt_frontends": list(range(n)) if union else [i],
                     "label": "%s%d" % (label, i), "slow": slow is not None and j == 0})
    daemon.new_log()
    ready, refused, setup_errors = {}, [], []
    # frontend 0 first: the system prompt in patd's prefix cache (and FlashInfer's JIT cache)
    # before the others open
    for group in (idx[:1], idx[1:]):
        for i in group:
            pool.pipes[i].send(msgs[idx.index(i)])
        for i in group:
            m = pool.recv(i, 600)
            if m is None:
                refused.append({"frontend": i, "error": "no answer: frontend process lost"})
                pool.replace(i)
            elif not m.get("ready"):
                refused.append({"frontend": i, "error": m.get("error"), "errno": m.get("errno")})
            else:
                ready[i] = m
            if m:
                setup_errors += [{"frontend": i, "error": x} for x in m.get("setup_errors", [])]
    seconds = 2 * slow["pairs"] * slow["window"] if slow else o["seconds"]
    t_go = time.monotonic() + 0.3
    t0, t1 = t_go + o["warmup"], t_go + o["warmup"] + seconds
    windows = []  # --slow: [start, end, frontend 0 sleeps]; pair k: on, off or off, on
    for k in range(slow["pairs"] if slow else 0):
        for on in ((True, False) if k % 2 == 0 else (False, True)):
            w0 = t0 + len(windows) * slow["window"]
            windows.append([w0, w0 + slow["window"], on])
    for i in ready:
        pool.pipes[i].send({"op": "go", "t_go": t_go, "t0": t0, "t1": t1})
    try:
        win, helps = poll_window(daemon, t0, t1, way == "patd", flag=pool.flag,
                                 toggles=[(w[0], int(w[2])) for w in windows])
    except (OSError, patd.PatError) as e:  # patd died: the frontends' errors tell the rest
        win, helps = {"daemon_error": "%s: %s (patd exit status %s)" % (
            type(e).__name__, e, daemon.p.poll()), "daemon_delta": {}}, {}
    res.update(win)
    per = []
    for j, i in enumerate(idx):
        if i not in ready:
            continue
        m = pool.recv(i, seconds + o["warmup"] + 120)
        if m is None:
            per.append({"frontend": i, "lost": True, "steps": [], "errors": [
                {"error": "frontend process lost or hung during the window"}]})
            pool.replace(i)
            continue
        m["frontend"], m["slow"] = i, slow is not None and j == 0
        m["setup_s"] = ready[i]["setup_s"]
        per.append(m)
    summarize(res, per, t0, t1, res["seqs_per_frontend"], o["layers"])
    if slow:
        res["slow_pairs"] = slow_pairs(per, windows, t0)
    res["refused"] = refused
    # fewer frontends stepped through the window than the configuration has: its tokens/s is
    # that of fewer, so no ratio with it is valid (a refusal, a frontend lost or given up)
    short = ["%d of %d refused" % (len(refused), len(idx))] if refused else []
    gone = [f["frontend"] for f in res["per_frontend"] if f.get("gave_up")] + \
        [m["frontend"] for m in per if m.get("lost")]
    if gone:
        short.append("frontends %s stopped stepping" % ",".join(map(str, sorted(gone))))
    res["incomplete"] = "; ".join(short) or None
    # prefill and warm-up steps cut (each retried, up to 3 times): cuts all the same
    res["setup_errors"] = setup_errors
    res["step_errors"] += len(setup_errors)
    res["setup_s_max"] = max([m["setup_s"] for m in ready.values()], default=None)
    res["mps"] = next((m["mps"] for m in ready.values() if m.get("mps") is not None), None)
    log = daemon.new_log()
    res["daemon_cut_lines"] = [x for x in log.splitlines() if CUT_RE.search(x)][:8]
    res["daemon_cut_count"] = sum(1 for x in log.splitlines() if CUT_RE.search(x))
    d = res.get("daemon_delta", {})
    lay = d.get(a.attn_count_metric, 0.0)
    res["daemon_attn_layer_us"] = d.get(a.attn_metric, 0.0) / lay * 1e6 if lay else None
    res["daemon_kv_layer_mb"] = d.get("patd_kv_read_bytes_total", 0.0) / lay / 1e6 if lay else None
    res["attn_metric_help"] = helps.get(a.attn_metric)
    return res


def summarize(res, per, t0, t1, batch, layers):
    """Per-frontend and pooled numbers of the steps that ended inside [t0, t1]; every step
    error counts, the warm-up's included."""
    S = t1 - t0
    durs, attn, fronts = [], [], []
    steps = errors = cut_frontends = slow_errors = 0
    for m in per:
        inwin = [r for r in m["steps"] if t0 <= r[0] <= t1]
        d = [r[1] for r in inwin]
        errs = m["errors"]
        healthy_errs = [] if m.get("slow") else errs
        f = {"frontend": m["frontend"], "steps": len(inwin), "steps_per_s": len(inwin) / S,
             "p50_ms": 1e3 * pct(d, 0.5) if d else None,
             "p99_ms": 1e3 * pct(d, 0.99) if d else None,
             "attn_ms_p50": pct([r[2] for r in inwin], 0.5), "errors": len(errs),
             "slow": m.get("slow", False), "gave_up": m.get("gave_up", False),
             "first_errors": [e["error"] for e in errs[:3]]}
        if len(inwin) >= 2:
            f["cpu_cores"] = (inwin[-1][3] - inwin[0][3]) / max(1e-9, inwin[-1][0] - inwin[0][0])
        ph = [r[5] for r in inwin if len(r) > 5 and r[5]]
        if ph:
            f["phases_ms_p50"] = {k: pct([x[i] for x in ph], 0.5) for i, k in
                                  enumerate(("begin", "forward", "attend", "end",
                                             "readback"))}
        fronts.append(f)
        if m.get("slow"):
            slow_errors += len(errs)
            continue
        steps += len(inwin)
        durs += d
        attn += [r[2] for r in inwin]
        errors += len(healthy_errs)
        cut_frontends += 1 if healthy_errs else 0
    slow_steps = sum(f["steps"] for f in fronts if f["slow"])
    res["per_frontend"] = fronts
    res["tok_s"] = (steps + slow_steps) * batch / S
    res["step_p50_ms"] = 1e3 * pct(durs, 0.5) if durs else None
    res["step_p99_ms"] = 1e3 * pct(durs, 0.99) if durs else None
    res["worst_p99_ms"] = max((f["p99_ms"] for f in fronts if f["p99_ms"] and not f["slow"]),
                              default=None)
    # the healthy frontends' mean step rate (the slow one's apart)
    healthy = [f for f in fronts if not f["slow"]]
    res["healthy_steps_per_s"] = (sum(f["steps_per_s"] for f in healthy) / len(healthy)
                                  if healthy else None)
    res["attn_layer_us_frontend"] = 1e3 * pct(attn, 0.5) / layers if attn else None
    res["step_errors"] = errors
    res["cut_frontends"] = cut_frontends
    res["slow_frontend_errors"] = slow_errors
    res["fe_cpu_cores_mean"] = (sum(f.get("cpu_cores", 0.0) for f in fronts) / len(fronts)
                                if fronts else None)
    phs = [f["phases_ms_p50"] for f in fronts if f.get("phases_ms_p50")]
    if phs:  # the frontends' medians of each CPU phase of a step, averaged over them
        res["phases_ms"] = {k: sum(p[k] for p in phs) / len(phs) for k in phs[0]}


def slow_pairs(per, windows, t0):
    """--slow: in each window, the other frontends' mean step rate over the steps that ended
    after its first SLOW_GUARD_S seconds (a sleep begun in the window before has ended), and
    the slow frontend's sleeps there; for each pair of adjacent windows (one with the slow
    frontend sleeping, one without) the ratio of the others' rates, and their median, quartiles
    and range."""
    others = [m for m in per if not m.get("slow")]
    slow = [m for m in per if m.get("slow")]
    ws = []
    for w0, w1, on in windows:
        a = w0 + SLOW_GUARD_S
        steps = sum(1 for m in others for r in m["steps"] if a <= r[0] <= w1)
        # the slow frontend's slept steps: begun in this window (the flag is read as a step
        # begins), and overlapping the counted part (in a window without it, 0: the guard
        # outlasted the last sleep of the window before)
        slept = [r for m in slow for r in m["steps"] if r[4]]
        ws.append({"start_s": w0 - t0, "slow": on, "counted_s": w1 - a,
                   "sleeps": sum(1 for r in slept if w0 <= r[0] - r[1] < w1),
                   "sleeps_counted": sum(1 for r in slept if r[0] > a and r[0] - r[1] < w1),
                   "others_steps_per_s": steps / (w1 - a) / len(others) if others else None})
    pairs = []
    for k in range(0, len(ws) - 1, 2):
        on, off = (ws[k], ws[k + 1]) if ws[k]["slow"] else (ws[k + 1], ws[k])
        ratio = (on["others_steps_per_s"] / off["others_steps_per_s"]
                 if on["others_steps_per_s"] is not None and off["others_steps_per_s"] else None)
        pairs.append({"slow_first": ws[k]["slow"], "with": on["others_steps_per_s"],
                      "without": off["others_steps_per_s"], "ratio": ratio,
                      "sleeps": on["sleeps"]})
    rs = sorted(p["ratio"] for p in pairs if p["ratio"] is not None)
    out = {"windows": ws, "pairs": pairs, "guard_s": SLOW_GUARD_S, "ratios": rs}
    if len(rs) >= 2:
        q1, _, q3 = statistics.quantiles(rs, n=4, method="inclusive")
        med = statistics.median(rs)
        out.update(ratio_median=med, ratio_q1=q1, ratio_q3=q3, ratio_min=rs[0],
                   ratio_max=rs[-1], cost_median=1.0 - med, iqr=q3 - q1)
        # the verdict: the median's, unless the pairs spread more than the target itself
        out["verdict"] = ("not shown" if q3 - q1 > SLOW_TARGET else
                          "met" if 1.0 - med <= SLOW_TARGET else "missed")
    return out


def floors(o, fl, n, batch, shared):
    """The floors of one round (every frontend one step) and of the union's step: (bytes read /
    bandwidth) vs (GEMM FLOPs / tensor-core rate), and the tokens/s ceilings they give. Attention
    FLOPs and activations are left out (small at decode)."""
    if not fl:
        return None
    cfg = make_cfg(o)
    H, F, V, L = cfg.hidden, cfg.ffn, cfg.vocab, cfg.layers
    kvh = cfg.kv_heads * cfg.head_dim
    per_layer = 2 * H * H + 2 * H * kvh + 3 * H * F
    wbytes = 2 * (L * per_layer + H * V)

    def flops(b):
        return 2 * b * (L * per_layer + H * V)

    P, U, half = o["prompt_tokens"], o["user_tokens"], o["decode_len"] / 2
    seqs = n * batch
    distinct = P + seqs * (U + half) if shared else seqs * (P + U + half)
    kv = distinct * 2 * kvh * 2 * L  # K and V, bf16, every layer
    bw, tc = fl["bw"], fl["tc"]
    many = max((n * wbytes + kv) / bw, n * flops(batch) / tc)
    one = max((wbytes + kv) / bw, flops(seqs) / tc)
    return {"weights_ms": n * wbytes / bw * 1e3, "kv_ms": kv / bw * 1e3,
            "gemm_ms": n * flops(batch) / tc * 1e3, "round_ms": many * 1e3,
            "ceiling_tok_s": seqs / many, "union_weights_ms": wbytes / bw * 1e3,
            "union_gemm_ms": flops(seqs) / tc * 1e3, "union_round_ms": one * 1e3,
            "union_ceiling_tok_s": seqs / one, "kv_layer_mb": kv / L / 1e6}


def fmt(x, spec="%.2f"):
    return "-" if x is None else spec % x


HEAD = ("%-26s %9s %7s %6s %8s %8s %8s %9s %9s %8s %6s %9s %6s %4s"
        % ("way", "tok/s", "xunion", "xinpr", "p50 ms", "p99 ms", "worstp99", "attn fe",
           "attn d", "KV MB/l", "dCPU", "inflight", "free G", "cut"))


def row(r):
    name = r["label"]
    return ("%-26s %9s %7s %6s %8s %8s %8s %9s %9s %8s %6s %9s %6s %4s"
            % (name[:26], fmt(r.get("tok_s"), "%.0f"), fmt(r.get("x_union"), "%.2f"),
               fmt(r.get("x_inproc"), "%.2f"), fmt(r.get("step_p50_ms")),
               fmt(r.get("step_p99_ms")), fmt(r.get("worst_p99_ms")),
               fmt(r.get("attn_layer_us_frontend"), "%.1f"),
               fmt(r.get("daemon_attn_layer_us"), "%.1f"), fmt(r.get("daemon_kv_layer_mb")),
               fmt(r.get("daemon_cpu_cores")),
               "-" if r.get("inflight_max") is None else "%d/%.1f" % (r["inflight_max"],
                                                                      r["inflight_mean"]),
               fmt(r.get("gpu_free_gib_start"), "%.1f"),
               r.get("step_errors", 0) + len(r.get("refused", []))))


class Out:
    """The JSON document (rewritten after every run, so a cut-short run keeps what it had)."""

    def __init__(self, path, meta):
        self.path, self.doc = path, {"meta": meta, "runs": [], "skipped": [], "churn": [],
                                     "slow": [], "targets": []}

    def save(self):
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f, indent=1)
            os.replace(tmp, self.path)


def churn_run(pool, daemon, a, o, ctx, n, batch):
    """--churn: ceil(n/2) steady pool frontends through the window, the rest fresh processes
    that join, step a while and leave (alternately closing and SIGKILLed mid-step)."""
    steady = list(range(n - n // 2))
    slots = n // 2
    slate = clean_slate(pool, daemon, "churn")
    lo, hi = [float(x) for x in o["churn_life"].split(",")]
    rng = random.Random(36)
    for i in steady:
        pool.pipes[i].send({"op": "run", "way": "patd", "shared": True, "sock": daemon.sock,
                            "batch": batch, "prompt_frontends": [i], "label": "steady%d" % i})
    refused, ready, setup_errors = [], {}, []
    for i in steady:
        m = pool.recv(i, 600)
        if m is None or not m.get("ready"):
            refused.append({"frontend": i, "error": m and m.get("error")})
            if m is None:
                pool.replace(i)
        else:
            ready[i] = m
        setup_errors += [{"frontend": i, "error": x} for x in (m or {}).get("setup_errors", [])]
    t_go = time.monotonic() + 0.3
    t0, t1 = t_go + o["warmup"], t_go + o["warmup"] + o["churn_seconds"]
    for i in ready:
        pool.pipes[i].send({"op": "go", "t_go": t_go, "t0": t0, "t1": t1})
    joins, live, done = 0, {}, []

    def join(slot):
        nonlocal joins
        mine, theirs = ctx.Pipe()
        co = dict(o, sock=daemon.sock, batch=batch, frontend=1000 + joins, t1=t1,
                  life_s=rng.uniform(lo, hi), kill=joins % 2 == 1, t_spawn=time.monotonic())
        p = ctx.Process(target=churn_main, args=(slot, theirs, co), daemon=True)
        p.start()
        theirs.close()
        live[slot] = {"p": p, "pipe": mine, "kill": co["kill"], "frontend": co["frontend"],
                      "joined": time.monotonic(), "records": []}
        joins += 1

    def reap(slot, c):
        while True:  # every message it sent (a killed one sends its records before it dies)
            try:
                if not c["pipe"].poll(0):
                    break
                c["records"].append(c["pipe"].recv())
            except (EOFError, OSError):
                break
        steps, errors, extra = [], [], {}
        for r in c["records"]:
            steps += r.get("steps", [])
            errors += r.get("errors", [])
            for k in ("first_step_s", "startup_s", "left", "refused", "gave_up", "setup_errors"):
                if r.get(k) is not None:
                    extra[k] = r[k]
        done.append(dict(extra, frontend=c["frontend"], kill=c["kill"], steps=steps,
                         errors=errors, exitcode=c["p"].exitcode))

    while time.monotonic() < t_go:
        time.sleep(0.01)
    for s in range(slots):
        join(s)
    m0 = c0 = None
    inflight = []
    while time.monotonic() < t1:
        if m0 is None and time.monotonic() >= t0:
            m0, _ = metrics(daemon.sock)
            c0, w0 = proc_cpu_s(daemon.p.pid), time.monotonic()
        for s, c in list(live.items()):
            if not c["p"].is_alive():
                c["p"].join()
                reap(s, c)
                del live[s]
                # a fresh one only where it can still step: its startup as seen so far + the
                # shortest life before the window ends
                ups = [c["startup_s"] for c in done if c.get("startup_s")]
                if time.monotonic() < t1 - lo - (pct(ups, 0.5) if ups else 1.0):
                    join(s)
        try:
            if m0 is not None:
                inflight.append(patd.status(socket=daemon.sock)["steps_in_flight"])
        except patd.PatError:
            pass
        time.sleep(STATUS_EVERY_S)
    c1, w1 = proc_cpu_s(daemon.p.pid), time.monotonic()
    m1, _ = metrics(daemon.sock)
    for s, c in list(live.items()):  # the window is over: the last ones leave
        try:
            c["pipe"].send({"op": "stop"})
        except (OSError, ValueError):
            pass
    for s, c in list(live.items()):
        c["p"].join(60)
        if c["p"].is_alive():
            c["p"].kill()
            c["p"].join()
        reap(s, c)
    per = []
    for i in ready:
        m = pool.recv(i, 120)
        if m is None:
            per.append({"frontend": i, "steps": [], "errors": [{"error": "frontend lost"}]})
            pool.replace(i)
        else:
            per.append(dict(m, frontend=i))
    res = {"n": n, "batch": batch, "variant": vname(daemon.variant),
           "seconds": o["churn_seconds"], "steady": len(steady), "churn_slots": slots,
           "refused": refused}
    res.update(slate)
    summarize(res, per, t0, t1, batch, o["layers"])
    res["joins"] = joins
    res["left_closed"] = sum(1 for c in done if c.get("left") == "closed")
    res["left_killed"] = sum(1 for c in done if c.get("exitcode") == -signal.SIGKILL)
    res["churn_refused"] = [c["refused"] for c in done if c.get("refused")]
    res["churn_stepped"] = sum(1 for c in done if c["steps"])
    # fresh processes that ended without their records (an exception in this script, not a
    # refusal or a step error): the run did not test what it says
    res["churn_lost"] = sum(1 for c in done if c["exitcode"] not in (0, -signal.SIGKILL) or
                            c.get("left") is None and not c.get("refused"))
    # the fresh ones' step errors, their prefill's (the first step: retried) included
    res["churn_step_errors"] = sum(len(c["errors"]) + len(c.get("setup_errors", []))
                                   for c in done)
    res["setup_errors"] = setup_errors
    res["step_errors"] += len(setup_errors)
    res["churn_errors"] = ([x for c in done for x in c.get("setup_errors", [])] +
                           [e["error"] for c in done for e in c["errors"]])[:8]
    firsts = [c["first_step_s"] for c in done if c.get("first_step_s") is not None]
    res["first_step_s_p50"], res["first_step_s_max"] = pct(firsts, 0.5), max(firsts, default=None)
    res["startup_s_p50"] = pct([c["startup_s"] for c in done if c.get("startup_s")], 0.5)
    res["churn_frontends"] = [{k: v for k, v in c.items() if k != "steps"} for c in done]
    res["daemon_cpu_cores"] = (c1 - c0) / (w1 - w0)
    res["inflight_max"] = max(inflight) if inflight else None
    res["daemon_delta"] = {k: m1[k] - m0.get(k, 0.0) for k in m1 if "_total" in k}
    log = daemon.new_log()
    res["daemon_cut_lines"] = [x for x in log.splitlines() if CUT_RE.search(x)][:8]
    res["daemon_cut_count"] = sum(1 for x in log.splitlines() if CUT_RE.search(x))
    res["healthy_cut"] = (res["step_errors"] + res["churn_step_errors"] + len(refused)
                          + len(res["churn_refused"]))
    return res


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patd", default=os.path.join(ROOT, "build", "gpu", "bin", "patd"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a smoke test of the same code path on the cpu backend, tiny model")
    ap.add_argument("--n", help="frontend counts (default 1,2,4,8,16)")
    ap.add_argument("--batch", help="sequences per frontend, a comma list (default 8)")
    ap.add_argument("--prompt-tokens", type=int, help="shared system prompt (default 2048)")
    ap.add_argument("--user-tokens", type=int, help="each sequence's own tokens (default 32)")
    ap.add_argument("--prompts", choices=("both", "shared", "unshared"), default="both")
    ap.add_argument("--seconds", type=float, help="the timed window (default 5)")
    ap.add_argument("--warmup", type=float, help="stepping together before the window (1)")
    ap.add_argument("--decode-len", type=int, help="tokens decoded before a sequence is "
                    "truncated back to its prompt (default 128)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--max-batch-tokens", type=int, help="per session (prefill chunks)")
    ap.add_argument("--inproc", choices=("flashinfer", "dense", "none"),
                    help="the in-process frontends' attention (cuda: flashinfer; cpu: dense)")
    ap.add_argument("--patd-arg", action="append", default=[], metavar="K=V",
                    help="--K=V for every daemon started (repeatable)")
    ap.add_argument("--attn-metric", default="patd_layer_seconds_total")
    ap.add_argument("--attn-count-metric", default="patd_layers_total")
    ap.add_argument("--churn", action="store_true", help="also the churn run")
    ap.add_argument("--churn-seconds", type=float)
    ap.add_argument("--churn-life", help="a churning frontend's stepping time, LO,HI seconds")
    ap.add_argument("--slow", action="store_true", help="also the slow-frontend runs")
    ap.add_argument("--slow-pairs", type=int,
                    help="--slow: pairs of windows with and without the slow one (default 8)")
    ap.add_argument("--slow-window", type=float,
                    help="--slow: seconds of each window (default 1.5; the first %.2f not "
                    "counted)" % SLOW_GUARD_S)
    ap.add_argument("--no-matrix", action="store_true", help="only --churn / --slow")
    ap.add_argument("--quick", action="store_true", help="N = 1,4,16, shared prompt only")
    ap.add_argument("--json")
    ap.add_argument("--daemon-log", help="the daemons' logs, appended")
    ap.add_argument("--deadline", type=float, default=0,
                    help="no run starts this many seconds after the start (0: none)")
    a = ap.parse_args()
    o = dict(SIZES[a.device])
    for k in list(o):
        if getattr(a, k, None) is not None:
            o[k] = getattr(a, k)
    if o["slow_pairs"] < 2 or o["slow_window"] < SLOW_GUARD_S + 0.25:
        ap.error("--slow needs 2 pairs or more, and windows of %.2f s or more (the first %.2f s "
                 "of each are not counted)" % (SLOW_GUARD_S + 0.25, SLOW_GUARD_S))
    if a.quick:
        o["n"] = a.n or "1,4,16"
        a.prompts = "shared"
    o["device"] = a.device
    o["q_heads"], o["kv_heads"], o["head_dim"] = (SIZES[a.device]["q_heads"],
                                                  SIZES[a.device]["kv_heads"],
                                                  SIZES[a.device]["head_dim"])
    if a.inproc is None:
        a.inproc = "flashinfer" if a.device == "cuda" else "dense"
    if a.inproc == "flashinfer" and a.device == "cpu":
        ap.error("FlashInfer needs --device cuda")
    if a.inproc == "flashinfer" and importlib.util.find_spec("flashinfer") is None:
        # not imported here: the parent stays off the GPU (no CUDA context of its own)
        print("flashinfer is not installed: no in-process FlashInfer frontends (--inproc dense "
              "for the dense in-process attention instead)", flush=True)
        a.inproc = "none"
    return a, o


def variants_of(a):
    """cross_pack 0 and 1 where patd --help lists it (and --patd-arg does not set it), else the
    daemon as configured; and whether the option exists."""
    h = subprocess.run([a.patd, "--help"], capture_output=True, text=True, timeout=30)
    has = bool(re.search(r"^\s+cross_pack\b", h.stdout + h.stderr, re.M))
    if has and not any(re.match(r"-*cross[_-]pack=", x) for x in a.patd_arg):
        return [{"cross_pack": 0}, {"cross_pack": 1}], True
    return [{}], has


def main():
    a, o = parse_args()
    t_start = time.monotonic()
    ns = [int(x) for x in o["n"].split(",")]
    batches = [int(x) for x in str(o["batch"]).split(",")]
    prompts = {"both": (True, False), "shared": (True,), "unshared": (False,)}[a.prompts]
    variants, has_cp = variants_of(a)
    cfg = make_cfg(o)
    tf.CFG = cfg
    # the pool: the union frontend's sequences, or those of every frontend of the largest
    # configuration, each up to prompt + decode-len + the warm-up steps, plus half again for
    # what the prefix cache keeps of earlier runs (evicted under pressure)
    seqs = max(ns) * max(batches)
    per_seq = (o["prompt_tokens"] + o["user_tokens"] + o["decode_len"] + 2 * 16) // 16 + 1
    blocks = int(1.5 * seqs * per_seq) + 1024
    # test_frontend.start_daemon's options otherwise (4 executors, staging 2 GiB: 16 sessions of
    # 2,048 tokens take 0.7)
    extra = ["--step-timeout-ms=30000", "--blocks=%d" % blocks,
             "--conn-max-batch-tokens=%d" % max(16384, o["max_batch_tokens"])]
    if a.device == "cpu":
        extra += ["--backend=cpu"]
    extra += ["--" + x.lstrip("-") for x in a.patd_arg]
    version = subprocess.run([a.patd, "--version"], capture_output=True, text=True).stdout
    meta = {"argv": sys.argv, "options": o, "device": a.device, "host_cpus": os.cpu_count(),
            "patd_version": version.strip(), "patd_args": extra, "variants": variants,
            "cross_pack_option": has_cp, "inproc": a.inproc, "blocks": blocks,
            "model": {"layers": cfg.layers, "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads,
                      "head_dim": cfg.head_dim, "hidden": cfg.hidden, "ffn": cfg.ffn,
                      "vocab": cfg.vocab, "dtype": cfg.dtype_name}}
    out = Out(a.json, meta)
    print("model: %d layers, %d/%d heads, d %d, FFN %d, vocab %d, bf16; %s; frontends %s x "
          "batch %s; prompts: %s (%d shared + %d own tokens); window %.1f s after %.1f s"
          % (cfg.layers, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab, a.device,
             o["n"], o["batch"], a.prompts, o["prompt_tokens"], o["user_tokens"], o["seconds"],
             o["warmup"]), flush=True)
    if not has_cp:
        print("patd --help lists no cross_pack option: one daemon configuration; attention "
              "per layer with packing on and off is not compared", flush=True)
    elif len(variants) == 1:
        print("cross_pack as --patd-arg sets it: packing on and off not compared", flush=True)
    ctx = mp.get_context("spawn")
    daemon = Daemon(a, o, extra)
    pool = None
    failed_orchestration = False
    try:
        pool = Pool(ctx, o, max(ns))
        up = pool.release([0])[0] or {}
        meta["gpu_free_gib_after_pool"] = up.get("free_gib")
        meta["fe_allocated_gib_up"] = [m.get("allocated_gib") for m in pool.up]
        if up.get("free_gib") is not None:
            print("%d frontends up (no patd yet): %.1f of %.1f GiB of GPU memory free; a "
                  "frontend's PyTorch allocations %.2f GiB (its weights)"
                  % (max(ns), up["free_gib"], up["total_gib"], pool.up[0]["allocated_gib"]),
                  flush=True)
        fl = None
        if a.device == "cuda":
            pool.pipes[0].send({"op": "floors"})
            fl = pool.recv(0, 120)
            meta["gpu"] = fl and fl.get("gpu")
            if fl:
                print("%s: read bandwidth %.0f GB/s, bf16 GEMM %.0f TFLOP/s"
                      % (fl["gpu"], fl["bw"] / 1e9, fl["tc"] / 1e12), flush=True)
        meta["floors"] = fl

        def late():
            return a.deadline and time.monotonic() - t_start > a.deadline

        helps_shown = [False]
        head_due = [False]  # the table's head, printed after a daemon's start line

        def do(way, n, b, shared, variant, label, union=False, slow=None):
            if late():
                out.doc["skipped"].append(label + " (deadline)")
                print("skipped (deadline): " + label, flush=True)
                return None
            if way == "patd":
                daemon.ensure(variant if variant is not None else daemon.variant or variants[0])
            else:  # the in-process frontends get the GPU the daemon's pool would hold
                daemon.stop()
            if head_due[0]:
                print(HEAD, flush=True)
                head_due[0] = False
            r = run(pool, daemon, a, o, way, n, b, shared, label, union=union, slow=slow)
            r["layers"] = cfg.layers
            if not helps_shown[0] and r.get("attn_metric_help"):
                print("daemon attention per layer: %s / %s (%s)" % (
                    a.attn_metric, a.attn_count_metric, r["attn_metric_help"]), flush=True)
                helps_shown[0] = True
            out.doc["runs"].append(r)
            out.save()
            print(row(r), flush=True)
            if r.get("phases_ms"):
                print("    step phases, ms (frontends' medians): " + ", ".join(
                    "%s %.2f" % kv for kv in r["phases_ms"].items()), flush=True)
            for f in r["refused"]:
                print("    refused: frontend %s: %s" % (f["frontend"], f["error"]), flush=True)
            for f in r["setup_errors"][:3]:
                print("    prefill/warm-up step cut (retried): frontend %s: %s"
                      % (f["frontend"], f["error"]), flush=True)
            for f in r["per_frontend"]:
                if f["first_errors"]:
                    print("    frontend %s%s: %d step errors, first: %s" % (
                        f["frontend"], " (slow)" if f["slow"] else "", f["errors"],
                        f["first_errors"][0]), flush=True)
            for x in r["daemon_cut_lines"][:3]:
                print("    patd: " + x.strip(), flush=True)
            return r

        results = {}  # (way key, n, b, shared) -> run
        n_configs = [0]

        def config(n, b, shared, include_inproc=True, include_union=True):
            pname = "shared %d" % o["prompt_tokens"] if shared else "own %d" % (
                o["prompt_tokens"] + o["user_tokens"])
            f = floors(o, fl, n, b, shared)
            print("\n== N=%d x B=%d, %s%s" % (n, b, pname, "" if not f else
                  ": floors per round: weights %.2f ms + KV %.3f ms, GEMM %.2f ms -> ceiling "
                  "%.0f tok/s (union: %.2f ms -> %.0f tok/s)"
                  % (f["weights_ms"], f["kv_ms"], f["gemm_ms"], f["ceiling_tok_s"],
                     f["union_round_ms"], f["union_ceiling_tok_s"])), flush=True)
            head_due[0] = True
            # ABBA over configurations: one daemon restart each, and neither variant first always
            vs = variants if n_configs[0] % 2 == 0 else list(reversed(variants))
            n_configs[0] += 1
            rs = []
            for v in vs:
                r = do("patd", n, b, shared, v, "patd %d x %d%s" % (n, b, vlabel(v)))
                if r:
                    r["floors"] = f
                    results[("patd " + vname(v), n, b, shared)] = r
                    rs.append(r)
            un = None
            if include_union and n > 1:
                un = do("patd", n, b, shared, None, "union 1 x %d" % (n * b), union=True)
            elif include_union and rs:
                un = rs[0]
            inp = None
            if include_inproc and a.inproc != "none":
                inp = do(a.inproc, n, b, shared, None, "%s %d x %d" % (a.inproc, n, b))
            for r in rs:
                for key, peer, name in (("x_union", un, "the union frontend's tokens/s"),
                                        ("x_inproc", inp, "the %s frontends'" % a.inproc)):
                    if not peer:
                        continue
                    # a ratio with a run that had fewer frontends stepping is no comparison
                    pair = [r] if peer is r else [r, peer]  # N = 1: the union is r itself
                    bad = ["%s: %s" % (x["label"], x["incomplete"]) for x in pair
                           if x.get("incomplete")]
                    if bad:
                        r[key + "_invalid"] = "; ".join(bad)
                        print("    %s / %s: no ratio (%s)" % (r["label"], name, "; ".join(bad)),
                              flush=True)
                    elif peer.get("tok_s"):
                        r[key] = r["tok_s"] / peer["tok_s"]
                print("    %s: %s x the union frontend's tokens/s, %s x the %s frontends'"
                      % (r["label"], fmt(r.get("x_union")), fmt(r.get("x_inproc")), a.inproc),
                      flush=True)
            if len(rs) == 2 and rs[0].get("daemon_attn_layer_us") and \
                    rs[1].get("daemon_attn_layer_us"):
                on = next(r for r in rs if r["variant"].endswith("=1"))
                off = next(r for r in rs if r["variant"].endswith("=0"))
                on["attn_on_over_off_daemon"] = on["daemon_attn_layer_us"] / \
                    off["daemon_attn_layer_us"]
                if on.get("attn_layer_us_frontend") and off.get("attn_layer_us_frontend"):
                    on["attn_on_over_off_frontend"] = on["attn_layer_us_frontend"] / \
                        off["attn_layer_us_frontend"]
                print("    cross_pack=1 / cross_pack=0 attention per layer: daemon %.2f, "
                      "frontend %s" % (on["attn_on_over_off_daemon"],
                                       fmt(on.get("attn_on_over_off_frontend"))), flush=True)
            if un:
                results[("union", n, b, shared)] = un
            if inp:
                results[("inproc", n, b, shared)] = inp
            out.save()

        if not a.no_matrix:
            for b in batches:
                for shared in prompts:
                    for n in ns:
                        config(n, b, shared)
        if a.slow:
            sl = {"pairs": o["slow_pairs"], "window": o["slow_window"]}
            print("\n== slow frontend: frontend 0 sleeps %d ms before layer %d's hand-off every "
                  "%dth step, in one window of each of %d pairs of %.2f s windows (the order "
                  "alternating), the others' steps counted after each window's first %.2f s"
                  % (SLOW_S * 1e3, cfg.layers // 2, SLOW_EVERY, sl["pairs"], sl["window"],
                     SLOW_GUARD_S), flush=True)
            head_due[0] = True
            shared = prompts[0]
            for b in batches:
                for n in [x for x in ns if x >= 2]:
                    for v in variants:
                        r = do("patd", n, b, shared, v, "slow %d x %d%s" % (n, b, vlabel(v)),
                               slow=sl)
                        if not r:
                            continue
                        sp = r["slow_pairs"]
                        s = {"n": n, "batch": b, "shared": shared, "variant": vname(v),
                             "pairs": sl["pairs"], "window_s": sl["window"],
                             "slow_frontend_errors": r["slow_frontend_errors"],
                             "others_errors": r["step_errors"], "incomplete": r["incomplete"],
                             "run": len(out.doc["runs"]) - 1}
                        s.update({k: sp.get(k) for k in (
                            "ratio_median", "ratio_q1", "ratio_q3", "ratio_min", "ratio_max",
                            "cost_median", "iqr", "verdict", "ratios")})
                        if r["incomplete"]:
                            s["verdict"] = "invalid"
                        out.doc["slow"].append(s)
                        out.save()
                        print("    the others' step rate with / without the slow one, per pair: "
                              "%s; the slow one's sleeps per pair: %s; in the counted part of "
                              "the windows without it: %d" % (
                                  " ".join(fmt(p["ratio"], "%.3f") for p in sp["pairs"]),
                                  " ".join(str(p["sleeps"]) for p in sp["pairs"]),
                                  sum(w["sleeps_counted"] for w in sp["windows"]
                                      if not w["slow"])),
                              flush=True)
                        print("    median %s (cost %s), quartiles %s-%s, range %s-%s: %s; the "
                              "slow frontend's step errors %d%s"
                              % (fmt(s["ratio_median"], "%.3f"),
                                 fmt(s["cost_median"] and 100 * s["cost_median"], "%.1f %%"),
                                 fmt(s["ratio_q1"], "%.3f"), fmt(s["ratio_q3"], "%.3f"),
                                 fmt(s["ratio_min"], "%.3f"), fmt(s["ratio_max"], "%.3f"),
                                 s["verdict"] or "too few pairs", r["slow_frontend_errors"],
                                 "" if not r["incomplete"] else
                                 "; incomplete: " + r["incomplete"]), flush=True)
        if a.churn:
            n, b = max(ns), batches[0]
            pool.shrink(n - n // 2)  # the steady ones; the rest come fresh
            for v in variants:
                if late():
                    out.doc["skipped"].append("churn %s (deadline)" % vname(v))
                    continue
                daemon.ensure(v)
                print("\n== churn: N=%d x B=%d, shared prompt, %s, %.0f s: %d steady, %d "
                      "slots of fresh frontends" % (n, b, vname(v), o["churn_seconds"],
                                                    n - n // 2, n // 2), flush=True)
                r = churn_run(pool, daemon, a, o, ctx, n, b)
                out.doc["churn"].append(r)
                out.save()
                print("    %d joins (%d stepped), %d left by closing, %d SIGKILLed; first step "
                      "p50 %s s, max %s s (startup p50 %s s); steady: p50 %s ms, p99 %s ms; "
                      "steps in flight max %s; daemon CPU %.2f cores; healthy cut %d "
                      "(steady %d, fresh %d, refused %d)"
                      % (r["joins"], r["churn_stepped"], r["left_closed"], r["left_killed"],
                         fmt(r["first_step_s_p50"]), fmt(r["first_step_s_max"]),
                         fmt(r["startup_s_p50"], "%.1f"), fmt(r["step_p50_ms"]),
                         fmt(r["step_p99_ms"]), r["inflight_max"], r["daemon_cpu_cores"],
                         r["healthy_cut"], r["step_errors"], r["churn_step_errors"],
                         len(r["refused"]) + len(r["churn_refused"])), flush=True)
                if r["churn_lost"]:
                    print("    %d fresh frontends ended without their records (see the "
                          "tracebacks above): the churn run is invalid" % r["churn_lost"],
                          flush=True)
                for x in r["churn_errors"][:3] + r["daemon_cut_lines"][:3]:
                    print("    " + x.strip(), flush=True)
        meta["daemon_idle_cpu_cores"] = daemon.idle
        print("\n== all runs (tok/s: all frontends' tokens in the window / window; xunion, xinpr: "
              "against the union frontend and the %s frontends of the same N, B, prompts; p50, "
              "p99: every healthy frontend's steps pooled; worstp99: the worst frontend's; attn "
              "fe / attn d: us per layer from the frontends' CUDA events / the daemon's metrics; "
              "dCPU: patd's cores (-: stopped for the in-process way); inflight: most/mean steps "
              "in flight; free G: GiB of GPU memory free at the way's start; cut: step errors "
              "and refused sessions; xunion and xinpr are - where either run had fewer "
              "frontends stepping than its configuration)" % a.inproc)
        print("%-12s %s" % ("N x B prompt", HEAD))
        for r in out.doc["runs"]:
            print("%-12s %s" % ("%dx%d %s" % (r["n"], r["batch"], "sh" if r["shared_prompt"]
                                              else "own"), row(r)))
        targets(out)
    except Exception as e:  # noqa: BLE001 (the numbers so far are kept)
        import traceback
        traceback.print_exc()
        out.doc["error"] = "%s: %s" % (type(e).__name__, e)
        failed_orchestration = True
    finally:
        if pool:
            pool.close()
        daemon.stop()
        out.doc["meta"]["wall_s"] = time.monotonic() - t_start
        out.save()
    # patd's runs only: an in-process frontend that fails is no daemon's cut (shown in the rows)
    cut = sum(r.get("step_errors", 0) + len(r.get("refused", [])) for r in out.doc["runs"]
              if r["way"] == "patd")
    cut += sum(r.get("healthy_cut", 0) for r in out.doc["churn"])
    short = [r["label"] for r in out.doc["runs"] if r.get("incomplete")]
    print("\n%d runs in %.0f s, %d skipped; healthy frontends' step errors and refusals: %d; "
          "runs with fewer frontends stepping than configured (no ratio taken with them): %s"
          % (len(out.doc["runs"]), time.monotonic() - t_start, len(out.doc["skipped"]), cut,
             ", ".join(short) or "none"))
    if failed_orchestration or any(r.get("churn_lost") for r in out.doc["churn"]):
        return 2
    return 1 if cut else 0


def targets(out):
    """Issue 36's targets, as far as this run measured them (met, missed, not run; invalid where
    the only runs that measured one had fewer frontends stepping than their configuration; for
    the slow frontend, not shown where its paired windows spread wider than the target), per
    daemon variant where the daemon's options matter."""
    t = []

    def add(name, value, ok, why=None, verdict=None):
        if verdict is None:
            verdict = ("met" if ok else "missed") if value is not None else \
                ("invalid" if why else "not run")
        t.append({"target": name, "value": value, "verdict": verdict, "why": why})

    def ratio(rs, key):
        """The valid ratios of rs, and why those left out are invalid."""
        return ([r[key] for r in rs if r.get(key)],
                "; ".join(r[key + "_invalid"] for r in rs if r.get(key + "_invalid")) or None)

    runs = out.doc["runs"]
    vars_ = sorted({r["variant"] for r in runs if r["way"] == "patd" and not r["union"]}) or \
        ["defaults"]

    def patd_runs(v, n, b=None, shared=None):
        return [r for r in runs if r["way"] == "patd" and not r["union"] and not r["slow"] and
                r["variant"] == v and r["n"] == n and (b is None or r["batch"] == b) and
                (shared is None or bool(r["shared_prompt"]) == shared)]

    for v in vars_:
        tag = "" if len(vars_) == 1 else " [%s]" % v
        xs, why = ratio(patd_runs(v, 16, 8), "x_union")
        # the worst prompt case: a missing one (invalid) leaves the worst unknown unless a
        # valid one already misses
        add("16 frontends x batch 8: aggregate >= 0.9 x one frontend at batch 128 (worst prompt "
            "case)" + tag, min(xs) if xs else None, xs and min(xs) >= 0.9, why,
            "invalid" if why and xs and min(xs) >= 0.9 else None)
        xs, why = ratio(patd_runs(v, 4, 16, True), "x_inproc")
        add("4 x batch 16, shared 2K: end-to-end faster than 4 in-process FlashInfer frontends "
            "(x inproc > 1)" + tag, xs[0] if xs else None, xs and xs[0] > 1.0, why)
        xs = [r["daemon_cpu_cores"] for r in patd_runs(v, 16) if r.get("daemon_cpu_cores")]
        add("daemon CPU <= 1 core with 16 frontends (worst run)" + tag,
            max(xs) if xs else None, xs and max(xs) <= 1.0)
        xs = [r["inflight_max"] for r in patd_runs(v, 16) if r.get("inflight_max") is not None]
        add("16 frontends mid-step at once (most steps in flight seen)" + tag,
            max(xs) if xs else None, xs and max(xs) >= 16)
        sl = [x for x in out.doc["slow"] if x["variant"] == v]
        vs = [x["verdict"] for x in sl]
        costs = [x["cost_median"] for x in sl if x.get("cost_median") is not None]
        why = "; ".join("N=%d: %s" % (x["n"], "paired ratios' quartiles %.3f-%.3f (%.1f %% "
                                      "apart, the target is %.0f %%)" % (
                                          x["ratio_q1"], x["ratio_q3"], 100 * x["iqr"],
                                          100 * SLOW_TARGET)
                                      if x["verdict"] == "not shown" else
                                      "incomplete: %s" % x["incomplete"])
                        for x in sl if x["verdict"] in ("not shown", "invalid")) or None
        add("one slow frontend costs the others <= 5 % of their step rate (worst N's median of "
            "paired windows)" + tag, max(costs) if costs else None, None, why,
            None if not sl else "missed" if "missed" in vs else "invalid" if "invalid" in vs
            else "not shown" if "not shown" in vs or None in vs else "met")
        xs = [r["healthy_cut"] for r in out.doc["churn"] if r["variant"] == v]
        lost = sum(r["churn_lost"] + (r["joins"] > 0 and not r["churn_stepped"])
                   for r in out.doc["churn"] if r["variant"] == v)
        add("0 healthy frontends cut in the churn run" + tag, max(xs) if xs else None,
            xs and max(xs) == 0, "fresh frontends lost, or none stepped" if lost else None,
            "invalid" if lost else None)
    # the frontends' events: the daemon's layer counter runs over whole GPU steps (see above)
    on = [r for r in runs if r.get("attn_on_over_off_frontend") and r["n"] == 4 and
          r["batch"] == 16 and r["shared_prompt"]]
    add("4 x batch 16, shared 2K: attention per layer packed <= 0.6 x unpacked (frontends' "
        "events)", on[0]["attn_on_over_off_frontend"] if on else None,
        on and on[0]["attn_on_over_off_frontend"] <= 0.6)
    out.doc["targets"] = t
    print("\n== issue 36's targets")
    for x in t:
        print("  %-9s %-100s %s" % (x["verdict"], x["target"],
                                    "-" if x["value"] is None else "%.3g" % x["value"]))
        if x["why"] and x["verdict"] in ("invalid", "not shown"):
            print("            %s: %s" % ("comparison invalid" if x["verdict"] == "invalid"
                                          else "not shown", x["why"]))


if __name__ == "__main__":
    sys.exit(main())
