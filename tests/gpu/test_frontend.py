"""GPU end-to-end tests of the cross-process data path: a real patd on the cuda backend, real
PyTorch frontends in other processes (client/python/examples/llama_patd.py), under MPS.

  e2e        logits through patd vs the same model with in-process attention (relative error
             < 1e-2 at every step) over a prefill and 64 decode steps of prompts with two-level
             shared prefixes; sequences join (prefilled in the same step as the decodes) and
             leave between steps
  kill       a second frontend runs steps at the same time and is SIGKILLed mid-step: the first
             finishes correctly, the daemon reclaims everything (no sequence left, pool check
             clean) and a fresh client still gets steps through (no lane left blocked)
  graph      a decode step captured in a CUDA graph (hand-offs included) and replayed gives the
             same logits as the eager step, bit for bit
  conns      limits.staging_mb bounds the sessions' staging allocations together (ENOBUFS past it,
             admitted once one closes); sessions' rows are apart, and a closed session's do
             not show in the next one's; a reload lowers and raises max_conns
  stall      two sessions begin a step and hand no layer over, on a daemon of two lanes: a third
             client's checked steps go on, and a stalled step is cut after limits.stall_cut_ms
             (its STEP_END says -ETIMEDOUT and names the option), not after step_timeout_ms
  many       16 frontend processes step at once on a daemon of two executors, one of them with a
             first step that waits 1 s inside a layer: no step is cut, every step's logits
             match the in-process reference, and all 16 steps were on lanes at once
             (STATUS lanes_busy_max)
  pack       cross-session packing (gpu.cross_pack): 4 frontend processes of one uid, prompts
             shared across them, step the same fed tokens on a daemon with packing off, then on:
             packs formed and packed layers ran (STATUS, metrics), every step's logits match the
             in-process reference and the unpacked run's (relative error < 1e-2); then again
             packed while one frontend is SIGKILLed inside a layer (after handing its Q over):
             the others' steps all succeed and match, the dead session is reclaimed and the
             pool check is clean

Run by tests/gpu/run.sh (which starts MPS). Prints "N passed, N failed"; exit 1 on any failure.
"""

import argparse
import os
import random
import signal
import errno
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "examples"))

import torch  # noqa: E402

import patd  # noqa: E402
from llama_patd import Config, DenseAttention, Llama, PatdAttention, shared_prompts  # noqa: E402

CFG = Config(layers=4, q_heads=32, kv_heads=8, head_dim=128, ffn=4096, vocab=8192)


def start_daemon(bin_path, rundir, extra=()):
    args = [bin_path, "--backend=cuda", "--runtime-dir=" + rundir, "--name=t", "--metrics-port=0",
            "--blocks=16384", "--conn-max-batch-tokens=16384", "--staging-mb=2048",
            "--conn-max-staging-mb=512",
            "--step-timeout-ms=5000", "--executors=4", "--log-level=info"] + CFG.patd_args()
    args += list(extra)
    log = open(os.path.join(rundir, "patd.log"), "w")
    p = subprocess.Popen(args, stderr=log, stdout=log)
    name = [a for a in args if a.startswith("--name=")][-1][len("--name="):]
    sock = os.path.join(rundir, name + ".sock")
    for _ in range(600):
        if os.path.exists(sock):
            try:
                patd.admin("status", socket=sock, timeout_ms=1000)
                return p, sock
            except patd.PatError:
                pass
        if p.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("patd did not come up:\n" + open(os.path.join(rundir, "patd.log")).read())


def status(sock):
    """The typed figures, plus the pool's invariant check (an admin request, O(blocks))."""
    out = patd.status(socket=sock)
    out["pool_check"] = patd.admin("check", socket=sock).split()[1]
    return out


def stats(sock):
    """The daemon's metrics page (the admin socket's stats) as {sample, labels included: value}."""
    out = {}
    for line in patd.admin("stats", socket=sock).splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


STAGES = ("queue", "prepare", "lane_wait", "upload", "enqueue")


def step_stages(m1, m0=None):
    """Steps started between two stats reads (m0 None: since the daemon started), their start
    (STEP_BEGIN to layer 0 begun) and its stages (patd_step_stage_seconds_total), summed:
    (starts, start seconds, {stage: seconds})."""
    def d(k):
        return m1[k] - (m0[k] if m0 else 0)
    return (d("patd_step_starts_total"), d("patd_step_start_seconds_total"),
            {k: d('patd_step_stage_seconds_total{stage="%s"}' % k) for k in STAGES})


def check_stages(m1, what, m0=None):
    """step_stages, checked: every stage counted, and they add up to the start."""
    starts, start, stages = step_stages(m1, m0)
    assert starts > 0, "%s: no step start counted" % what
    assert all(v > 0 for v in stages.values()), "%s: a stage counted nothing: %s" % (what, stages)
    assert abs(sum(stages.values()) - start) < 1e-6 * starts, \
        "%s: stages %s add up to %g s, the start to %g s" % (what, stages, sum(stages.values()),
                                                           start)
    return starts, start, stages


class Frontend:
    """One batch of sequences through patd, with the in-process reference beside it."""

    def __init__(self, model, sock, max_batch_tokens=16384, slots=64, max_len=1024):
        self.model = model
        self.conn = patd.Conn(model=CFG.patd_model(), max_batch_tokens=max_batch_tokens,
                              socket=sock, label="test_frontend")
        assert self.conn.on_gpu, "the daemon must serve GPU sessions"
        self.attn = PatdAttention(self.conn)
        self.ref = DenseAttention(CFG, slots, max_len)
        self.free_slots = list(range(slots))
        self.seqs = []  # dicts: id, slot, len (tokens in KV), next (tokens to feed)
        self.worst = 0.0

    def join(self, prompt):
        sid, cached = self.conn.seq_open(prompt)
        self.seqs.append({"id": sid, "slot": self.free_slots.pop(0), "len": 0, "cached": cached,
                          "prompt": prompt, "next": None})

    def leave(self, i):
        s = self.seqs.pop(i)
        self.conn.seq_close(s["id"])
        self.free_slots.append(s["slot"])

    def step(self, check=True):
        """One step: new sequences prefill (their uncached part), the others decode."""
        feed = []  # (seq, patd tokens, ref ctx, ref tokens)
        for s in self.seqs:
            if s["next"] is None:  # joining: patd skips what its prefix cache holds
                feed.append((s, s["prompt"][s["cached"]:], s["cached"], 0, s["prompt"]))
            else:
                feed.append((s, [s["next"]], s["len"], s["len"], [s["next"]]))
        flat = [t for f in feed for t in f[1]]
        pos = [f[2] + j for f in feed for j in range(len(f[1]))]
        n_new = [len(f[1]) for f in feed]
        self.conn.step_begin([f[0]["id"] for f in feed], n_new, flat)
        logits = self.model.forward(torch.tensor(flat, device="cuda"),
                                    torch.tensor(pos, device="cuda"), self.attn)
        self.conn.step_end()
        ends = torch.tensor([sum(n_new[:i + 1]) - 1 for i in range(len(n_new))], device="cuda")
        mine = logits[ends]
        if check:
            rtoks = [f[4] for f in feed]
            self.ref.begin([f[0]["slot"] for f in feed], [f[3] for f in feed],
                           [len(t) for t in rtoks])
            rl = self.model.forward(torch.tensor([t for r in rtoks for t in r], device="cuda"),
                                    torch.tensor([f[3] + j for f in feed for j in range(len(f[4]))],
                                                 device="cuda"), self.ref)
            rends = torch.tensor([sum(len(r) for r in rtoks[:i + 1]) - 1
                                  for i in range(len(rtoks))], device="cuda")
            ref = rl[rends]
            err = ((mine - ref).norm() / ref.norm()).item()
            self.worst = max(self.worst, err)
        nxt = mine.argmax(-1).tolist()
        for f, t in zip(feed, nxt):
            f[0]["len"] = f[2] + len(f[1])
            f[0]["next"] = t
        return mine

    def close(self):
        while self.seqs:
            self.leave(0)
        self.conn.close()


def run_e2e(model, sock, victim=None):
    rng = random.Random(11)
    prompts = shared_prompts(40, rng, vocab=CFG.vocab)
    fe = Frontend(model, sock)
    for p in prompts[:4]:  # one per (system, task) pair: their blocks enter the prefix cache
        fe.join(p)
    fe.step()
    for p in prompts[4:24]:  # these find their shared prefixes cached
        fe.join(p)
    killed = False
    for step in range(65):  # the prefills, then 64 decode steps
        if step in (16, 33):  # joins: prefilled in the same step as the decodes
            for p in prompts[24 + (step // 17) * 8: 32 + (step // 17) * 8]:
                fe.join(p)
        if step in (24, 41):  # leaves
            for i in (0, 3, 5):
                fe.leave(i)
        if victim is not None and step == 10 and not killed:
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            killed = True
        fe.step()
    worst = fe.worst
    cached = fe.conn.stats()["cached_tokens"]
    fe.close()
    print("e2e: 65 steps, %d sequences joined, worst relative error %.2e (bound 1e-2), "
          "%d prompt tokens from the prefix cache" % (40, worst, cached))
    assert worst < 1e-2, "logits error %.3e" % worst
    assert cached > 0, "the prefix cache served nothing"


def victim_main(sock):
    """The frontend that gets killed: steps in a loop until it dies."""
    model = Llama(CFG, seed=5)
    fe = Frontend(model, sock, slots=16)
    for i, p in enumerate(shared_prompts(12, random.Random(5), vocab=CFG.vocab)):
        fe.join(p)
        if i == 3:
            fe.step(check=False)
    print("stepping", flush=True)
    while True:
        fe.step(check=False)


def test_e2e(model, sock, bin_path):
    run_e2e(model, sock)


def test_kill(model, sock, bin_path):
    before = status(sock)
    v = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--victim", sock],
                         stdout=subprocess.PIPE, text=True)
    line = v.stdout.readline()
    assert line.strip() == "stepping", "victim did not start: %r" % line
    time.sleep(0.5)  # well inside its step loop
    run_e2e(model, sock, victim=v)
    for _ in range(100):  # reclaim runs on the daemon's loop after the pidfd fires
        st = status(sock)
        if st.get("connections") == before.get("connections"):
            break
        time.sleep(0.05)
    st = status(sock)
    print("kill: after SIGKILL connections=%s sequences=%s pool_check=%s blocks_used=%s" %
          (st.get("connections"), st.get("sequences"), st.get("pool_check"), st.get("blocks_used")))
    assert st.get("sequences") == 0, st
    assert st.get("pool_check") == "ok", st
    # a fresh client on every lane: nothing stayed blocked behind the dead client's waits
    fe = Frontend(model, sock, slots=8)
    for p in shared_prompts(4, random.Random(9), vocab=CFG.vocab):
        fe.join(p)
    for _ in range(8):
        fe.step()
    fe.close()
    assert fe.worst < 1e-2


def test_graph(model, sock, bin_path):
    rng = random.Random(21)
    fe = Frontend(model, sock, slots=8)
    for p in shared_prompts(8, rng, vocab=CFG.vocab):
        fe.join(p)
    fe.step(check=False)  # prefill, eager
    conn, B = fe.conn, len(fe.seqs)
    tok = torch.zeros(B, dtype=torch.long, device="cuda")
    pos = torch.zeros(B, dtype=torch.long, device="cuda")

    def load():
        tok.copy_(torch.tensor([s["next"] for s in fe.seqs]))
        pos.copy_(torch.tensor([s["len"] for s in fe.seqs]))

    ids = [s["id"] for s in fe.seqs]
    # warm-up on a side stream (allocations) as an aborted step, then capture outside a step
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        load()
        conn.step_begin(ids, [1] * B, [s["next"] for s in fe.seqs])
        fe.model.forward(tok, pos, fe.attn)
        conn.step_end(abort=True)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fe.model.forward(tok, pos, fe.attn)
    same = 0
    m0 = stats(sock)
    for step in range(8):
        # the eager step, aborted (nothing committed) ...
        load()
        flat = [s["next"] for s in fe.seqs]
        conn.step_begin(ids, [1] * B, flat)
        eager = fe.model.forward(tok, pos, fe.attn).clone()
        conn.step_end(abort=True)
        # ... and the same step replayed from the graph, committed
        load()
        conn.step_begin(ids, [1] * B, flat)
        g.replay()
        conn.replayed()
        info = conn.step_end()
        assert info["committed"] == 1
        diff = (out - eager).abs().max().item()
        same += diff == 0.0
        assert diff == 0.0, "step %d: graph replay differs from the eager step by %g" % (step, diff)
        nxt = out.argmax(-1).tolist()
        for s, t in zip(fe.seqs, nxt):
            s["len"] += 1
            s["next"] = t
    # the daemon's start of these 16 steps (STEP_BEGIN to layer 0 enqueued) in its stages: each
    # one counted, and they add up to the whole
    m1 = stats(sock)
    starts, start, stages = check_stages(m1, "graph", m0)
    assert starts == 16, "%d step starts counted for 16 steps" % starts
    # decode steps of 8 sequences that only grow (an aborted step's sequences stay as they were):
    # the loop prepares them itself, unless the last preparation took over 100 us (a thread
    # preempted there: the next step goes to an executor); a few such are allowed
    on_loop = m1["patd_steps_prepared_on_loop_total"] - m0["patd_steps_prepared_on_loop_total"]
    assert on_loop >= 12, "%d of 16 decode steps prepared on the loop" % on_loop
    print("graph: %d of 8 replayed decode steps bitwise equal to the eager step (epoch %d); %d of "
          "16 prepared on the loop; start %.1f us per step: %s"
          % (same, conn.epoch, on_loop, start / starts * 1e6,
             {k: round(v / starts * 1e6, 1) for k, v in stages.items()}))
    fe.close()


def test_conns(model, sock, bin_path):
    """A reload lowers and raises limits.max_conns (each session's signal slice is an allocation
    of its own since protocol 7: no arena sized at start caps it). limits.staging_mb bounds
    what the sessions' staging allocations add up to (protocol 6: each its own): a session past
    it is refused with ENOBUFS (its text says staging, not the KV pool), and admitted once
    another closes; what one session writes into its rows, the others' rows do not show, nor a
    closed session's in the next one's. 64 tokens of staging here are 1.3 MB, one 2 MiB
    allocation at the driver's granularity; 4 MiB hold two."""
    rundir = tempfile.mkdtemp(prefix="patd-conns-")
    conf = os.path.join(rundir, "patd.conf")

    def write(max_conns):
        with open(conf, "w") as f:
            f.write("[limits]\nmax_conns = %d\n" % max_conns)

    write(3)
    d, s2 = start_daemon(bin_path, rundir, ["--config", conf, "--name=conns", "--staging-mb=4"])
    sig = CFG.patd_model()

    def refused(err, what):
        try:
            patd.Conn(sig, max_batch_tokens=64, socket=s2)
        except patd.PatError as e:
            assert e.errno == err, e
            assert "out of blocks" not in str(e), e
            return
        raise AssertionError(what)
    conns = []
    try:
        conns = [patd.Conn(sig, max_batch_tokens=64, socket=s2) for _ in range(2)]
        refused(errno.ENOBUFS, "a third session's staging was admitted past limits.staging_mb")
        gone = conns.pop(0)
        for t in (gone.q, gone.k, gone.v, gone.o):
            t.fill_(7.0)
        torch.cuda.synchronize()
        gone.close()
        conns.append(patd.Conn(sig, max_batch_tokens=64, socket=s2))
        # the new session's allocation takes the closed one's place under limits.staging_mb: none
        # of the closed session's rows may show through it
        for name in ("q", "k", "v", "o"):
            t = getattr(conns[-1], name)
            assert not bool((t == 7.0).any()), \
                "a new session's %s shows a closed session's rows" % name
        for i, c in enumerate(conns):
            c.q.fill_(float(i + 1))
        torch.cuda.synchronize()
        for i, c in enumerate(conns):
            assert bool((c.q == float(i + 1)).all()), "session %d's staging changed" % i
        write(2)
        assert patd.admin("reload", socket=s2) == "reloaded\n"
        refused(errno.EMFILE, "a third session was admitted with max_conns 2")
        # each session's signal slice is its own allocation (protocol 7): nothing sized at
        # start caps a raise
        write(4)
        assert patd.admin("reload", socket=s2) == "reloaded\n"
        assert patd.status(socket=s2)["max_conns"] == 4
    finally:
        for c in conns:
            c.close()
        d.send_signal(signal.SIGTERM)
        d.wait(20)


def test_stall(model, sock, bin_path):
    rundir = tempfile.mkdtemp(prefix="patd-stall-")
    # the stallers' steps are their sessions' first: the grace is lowered to the cut here
    d, s2 = start_daemon(bin_path, rundir, ["--name=stall", "--executors=2", "--lanes=2",
                                            "--step-timeout-ms=30000", "--stall-cut-ms=200",
                                            "--first-step-grace-ms=200"])
    sig = CFG.patd_model()
    stallers = []
    fe = None
    try:
        fe = Frontend(model, s2, slots=4)  # joined and warmed up before anyone stalls
        for p in shared_prompts(2, random.Random(5), vocab=CFG.vocab):
            fe.join(p)
        fe.step()
        for i in range(2):
            c = patd.Conn(sig, max_batch_tokens=64, socket=s2, label="staller")
            prompt = [11, 12, 13, 14 + i]
            sid, _ = c.seq_open(prompt)
            c.step_begin([sid], [len(prompt)], prompt)  # and never a layer
            stallers.append(c)
        time.sleep(0.3)  # both stalled steps hold the two lanes by now
        t0 = time.time()
        for _ in range(4):
            fe.step()
        dt = time.time() - t0
        print("stall: 4 steps of a bystander beside 2 stalled sessions on 2 lanes: %.2f s"
              % dt)
        assert fe.worst < 1e-2
        # without the cut the first of them waits for step_timeout_ms (30 s)
        assert dt < 8.0, "the bystander waited %.1f s behind stalled steps" % dt
        log = open(os.path.join(rundir, "patd.log")).read()
        assert "limits.stall_cut_ms" in log, "no stalled step was cut"
        cut = 0
        for c in stallers:  # a cut step ends with ETIMEDOUT, one never cut is aborted here
            try:
                c.step_end()
            except patd.PatError as e:
                assert e.errno == errno.ETIMEDOUT, e
                assert "limits.stall_cut_ms" in str(e) and "waited for a lane" in str(e), e
                cut += 1
        print("stall: %d of 2 stalled steps cut" % cut)
        assert cut >= 1
    finally:
        if fe:
            fe.close()
        for c in stallers:
            c.close()
        d.send_signal(signal.SIGTERM)
        d.wait(20)


MANY = 16


def stop_all(kids, daemon):
    """Kills the frontend processes still running, then stops their daemon (SIGTERM: drains)."""
    for k in kids:
        if k.poll() is None:
            k.kill()
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(20)


def start_children(kids, argvs):
    """Starts this script once per argument list (appended to kids as they start), waits for
    every one's "ready" line, then tells them all to go at once."""
    for argv in argvs:
        kids.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for k in kids:
        line = k.stdout.readline()
        assert line.strip() == "ready", "a frontend did not start: %r" % line
    for k in kids:
        k.stdin.write("go\n")
        k.stdin.flush()


def many_child(sock, idx, steps):
    """One of test_many's frontends: joins, waits for the go line, steps; prints its result."""
    import json
    model = Llama(CFG, seed=1)
    fe = Frontend(model, sock, max_batch_tokens=4096, slots=8)
    if idx == 0:  # its first step waits 1 s before handing layer 1 over
        orig, calls = fe.attn.attend, [0]

        def slow(layer, q, k, v):
            calls[0] += 1
            if calls[0] == 2:
                time.sleep(1.0)
            return orig(layer, q, k, v)
        fe.attn.attend = slow
    for p in shared_prompts(2, random.Random(100 + idx), vocab=CFG.vocab):
        fe.join(p)
    print("ready", flush=True)
    sys.stdin.readline()
    err, t0 = None, time.time()
    try:
        for i in range(steps):
            fe.step()  # every step: the reference cache needs every token
    except patd.PatError as e:
        err = "%s (errno %d)" % (e, e.errno)
    print(json.dumps({"idx": idx, "worst": fe.worst, "err": err, "s": time.time() - t0}),
          flush=True)
    fe.close()
    return 0


def test_many(model, sock, bin_path):
    import json
    rundir = tempfile.mkdtemp(prefix="patd-many-")
    # the shipped step timeout (30 s): 16 first steps at once take seconds (cuBLAS, allocator)
    d, s2 = start_daemon(bin_path, rundir, ["--name=many", "--executors=2", "--staging-mb=4096",
                                            "--conn-max-batch-tokens=4096",
                                            "--step-timeout-ms=30000"])
    kids = []
    try:
        lanes = int(patd.admin("status", socket=s2).split("\nlanes ")[1].split()[0])
        assert lanes >= MANY, "gpu.lanes = auto gave %d lanes, fewer than %d" % (lanes, MANY)
        start_children(kids, [["--many-child", s2, "--idx", str(i)] for i in range(MANY)])
        res = []
        for k in kids:
            out = k.stdout.readline()
            k.wait(120)
            res.append(json.loads(out))
        st = patd.admin("status", socket=s2)
        busy_max = int(st.split("lanes_busy_max ")[1].split()[0])
        for r in res:
            print("many: frontend %2d: %.1f s, worst error %.2e%s" %
                  (r["idx"], r["s"], r["worst"], ", " + r["err"] if r["err"] else ""))
        worst = max(r["worst"] for r in res)
        errs = [r for r in res if r["err"]]
        print("many: %d frontends x 24 steps, 2 executors, %d lanes: at most %d steps on lanes at "
              "once, worst error %.2e, slow one %.1f s, others %.1f-%.1f s, %d failed" %
              (MANY, lanes, busy_max, worst, res[0]["s"], min(r["s"] for r in res[1:]),
               max(r["s"] for r in res[1:]), len(errs)))
        assert not errs, errs
        assert worst < 1e-2, worst
        log = open(os.path.join(rundir, "patd.log")).read()
        assert "cut:" not in log, [ln for ln in log.splitlines() if "cut:" in ln][:3]
        assert busy_max >= MANY, "only %d of %d steps were on lanes at once" % (busy_max, MANY)
    finally:
        stop_all(kids, d)


PACK = 4


def pack_child(sock, idx, steps, out, kill_at):
    """One of test_pack's frontends: the same prompts as its siblings (shared across sessions),
    fed tokens fixed by its index (not its argmax), so runs with packing off and on compare."""
    import json
    model = Llama(CFG, seed=1)
    fe = Frontend(model, sock, max_batch_tokens=4096, slots=8)
    if kill_at >= 0:
        orig, calls = fe.attn.attend, [0]

        def dying(layer, q, k, v):
            calls[0] += 1
            r = orig(layer, q, k, v)
            if calls[0] == kill_at:
                time.sleep(0.002)  # its Q is handed over (or about to be): die inside the layer
                os.kill(os.getpid(), signal.SIGKILL)
            return r
        fe.attn.attend = dying
    for p in shared_prompts(3, random.Random(7), vocab=CFG.vocab):
        fe.join(p)
    print("ready", flush=True)
    sys.stdin.readline()
    feed = random.Random(1000 + idx)
    err, logits = None, []
    try:
        for i in range(steps):
            logits.append(fe.step().float().cpu())
            for s in fe.seqs:
                s["next"] = feed.randrange(CFG.vocab)
    except patd.PatError as e:
        err = "%s (errno %d)" % (e, e.errno)
    torch.save(logits, out)
    print(json.dumps({"idx": idx, "worst": fe.worst, "err": err}), flush=True)
    fe.close()
    return 0


def pack_run(bin_path, tag, cross_pack, victim=None, steps=12):
    """PACK frontends through a daemon of their own; returns (results, logits, status, log)."""
    import json
    rundir = tempfile.mkdtemp(prefix="patd-pack-")
    # windows wide enough that Python's jitter between the frontends does not keep them apart
    d, s2 = start_daemon(bin_path, rundir, ["--name=pk" + tag, "--staging-mb=4096",
                                            "--conn-max-batch-tokens=4096",
                                            "--step-timeout-ms=30000",
                                            "--cross-pack=%d" % cross_pack,
                                            "--cross-pack-window-us=20000",
                                            "--cross-pack-wait-us=50000"])
    kids = []
    try:
        start_children(kids, [["--pack-child", s2, "--idx", str(i),
                               "--out", os.path.join(rundir, "logits%d.pt" % i),
                               "--kill-at", str(4 * 6 + 2 if i == victim else -1)]
                              for i in range(PACK)])
        res = []
        for i, k in enumerate(kids):
            out = k.stdout.readline()
            k.wait(180)
            if i == victim:
                assert k.returncode == -signal.SIGKILL, "the victim exited %s" % k.returncode
                continue
            res.append(json.loads(out))
        if victim is not None:  # its session is reclaimed (the daemon watches its pid)
            for _ in range(100):
                if patd.status(socket=s2)["connections"] == 0:
                    break
                time.sleep(0.1)
        st = status(s2)
        text = patd.admin("status", socket=s2)
        metrics = text  # STATUS's cross_pack lines
        check_stages(stats(s2), "pack_run %s" % tag)
        logits = {r["idx"]: torch.load(os.path.join(rundir, "logits%d.pt" % r["idx"]))
                  for r in res}
        return res, logits, st, text, metrics, open(os.path.join(rundir, "patd.log")).read()
    finally:
        stop_all(kids, d)


def metric_value(text, name):
    for ln in text.splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    raise AssertionError("STATUS has no " + name)


def test_pack(model, sock, bin_path):
    base, base_l, _, _, _, _ = pack_run(bin_path, "0", 0)
    res, got_l, st, text, metrics, log = pack_run(bin_path, "1", 1)
    packs = metric_value(metrics, "cross_packs")
    steps = metric_value(metrics, "cross_pack_steps")
    layers = metric_value(metrics, "cross_pack_layers")
    leaves = metric_value(metrics, "cross_pack_leaves")
    worst_vs_unpacked = 0.0
    for i, ls in got_l.items():
        assert len(ls) == len(base_l[i]), (i, len(ls), len(base_l[i]))
        for a, b in zip(ls, base_l[i]):
            worst_vs_unpacked = max(worst_vs_unpacked, ((a - b).norm() / b.norm()).item())
    worst = max(r["worst"] for r in res + base)
    print("pack: %d frontends x 12 steps: %d packs of %d steps, %d packed layers, %d left a "
          "pack; worst error vs reference %.2e, packed vs unpacked %.2e"
          % (PACK, packs, steps, layers, leaves, worst, worst_vs_unpacked))
    assert not [r for r in res + base if r["err"]], [r["err"] for r in res + base if r["err"]]
    # a quarter of the steps at least (the rest may begin alone: the frontends' own pace)
    assert steps >= PACK * 12 // 4 and layers >= CFG.layers, "too few steps ran packed"
    assert worst < 1e-2 and worst_vs_unpacked < 1e-2, (worst, worst_vs_unpacked)
    assert "cut:" not in log, [ln for ln in log.splitlines() if "cut:" in ln][:3]
    # a member dies inside a packed layer
    res, got_l, st, text, metrics, log = pack_run(bin_path, "k", 1, victim=PACK - 1)
    worst = max(r["worst"] for r in res)
    print("pack, one killed inside a layer: %d survivors, worst error %.2e, %d packs, %d left, "
          "connections after %d, pool check %s"
          % (len(res), worst, metric_value(metrics, "cross_packs"),
             metric_value(metrics, "cross_pack_leaves"), st["connections"],
             st["pool_check"]))
    assert not [r for r in res if r["err"]], [r["err"] for r in res if r["err"]]
    assert worst < 1e-2, worst
    assert st["connections"] == 0 and st["pool_check"] == "ok", st


TESTS = [("e2e", test_e2e), ("kill", test_kill), ("graph", test_graph), ("conns", test_conns),
         ("stall", test_stall), ("many", test_many), ("pack", test_pack)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--patd", default=os.path.join(ROOT, "build", "bin", "patd"))
    ap.add_argument("--victim", metavar="SOCKET")
    ap.add_argument("--only", default="")
    ap.add_argument("--many-child", metavar="SOCKET")
    ap.add_argument("--idx", type=int, default=0)
    ap.add_argument("--pack-child", metavar="SOCKET")
    ap.add_argument("--out")
    ap.add_argument("--kill-at", type=int, default=-1)
    a = ap.parse_args()
    if a.victim:
        return victim_main(a.victim)
    if a.many_child:
        return many_child(a.many_child, a.idx, 24)
    if a.pack_child:
        return pack_child(a.pack_child, a.idx, 12, a.out, a.kill_at)
    rundir = tempfile.mkdtemp(prefix="patd-gpu-")
    daemon, sock = start_daemon(a.patd, rundir)
    model = Llama(CFG, seed=1)
    passed = failed = 0
    try:
        for name, fn in TESTS:
            if a.only and name not in a.only.split(","):
                continue
            t0 = time.time()
            try:
                fn(model, sock, a.patd)
                passed += 1
                print("[ OK ] %s (%.1f s)" % (name, time.time() - t0), flush=True)
            except Exception as e:  # report and go on: every test runs
                failed += 1
                print("[FAIL] %s: %s: %s" % (name, type(e).__name__, e), flush=True)
        if daemon.poll() is not None:
            failed += 1
            print("[FAIL] patd exited with %s" % daemon.returncode)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        print(open(os.path.join(rundir, "patd.log")).read()[-3000:])
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
