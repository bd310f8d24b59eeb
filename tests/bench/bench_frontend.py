"""Step timeline of the example frontend (client/python/examples/llama_patd.py): time per decode
step with attention through patd (another process, under MPS) vs the same model with in-process
attention (a dense per-slot KV cache padded to the longest context, fp32 softmax; PyTorch SDPA
with a length mask and enable_gqa was 2.4x slower on an H200), for batch 64 and 256 over a shared-prefix
tree (2 system prompts x 2 task preambles, 1,024 + 256 shared tokens, 16-48 user tokens).

Reported per batch: median decode step (CUDA-synchronised wall time, 24 steps after 4 warm-ups)
both ways, the difference per layer, the daemon's pack time per step (its metrics) and the part
of the step before the first layer's hand-off (the frontend's embedding, norm and QKV
projection, which the pack overlaps), the KV bytes the plans read vs query-centric, and the
floors: distinct KV bytes / read bandwidth and the model's GEMM FLOPs / bf16 tensor-core rate.

    python3 tests/bench/bench_frontend.py --patd build/bin/patd [--json FILE]
"""

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "examples"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))

import torch  # noqa: E402

import patd  # noqa: E402
from llama_patd import Config, DenseAttention, Llama, PatdAttention, shared_prompts  # noqa: E402
import test_frontend as tf  # noqa: E402


def floors():
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    a, b = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(6):
        a.record()
        x.view(torch.float32).sum()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    bw = n / (sorted(ts[1:])[2] * 1e-3)
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ts = []
    for _ in range(6):
        a.record()
        m @ m
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    tc = 2 * 8192 ** 3 / (sorted(ts[1:])[2] * 1e-3)
    return bw, tc


def prefill(conn, model, attn, seqs, lens, pend):
    """Prefills what is pending in chunks of <= 4096 tokens."""
    while any(pend):
        ids, n_new, flat, pos, take = [], [], [], [], 4096
        for i, t in enumerate(pend):
            if t and take > 0:
                k = min(len(t), take)
                ids.append(seqs[i])
                n_new.append(k)
                flat += t[:k]
                pos += [lens[i] + j for j in range(k)]
                lens[i] += k
                pend[i] = t[k:]
                take -= k
        conn.step_begin(ids, n_new, flat)
        model.forward(torch.tensor(flat, device="cuda"), torch.tensor(pos, device="cuda"), attn)
        conn.step_end()


def run(batch, cfg, model, sock, js, bw, tc):
    rng = random.Random(batch)
    prompts = shared_prompts(batch, rng, sys_len=1024, task_len=256, user=(16, 48),
                             vocab=cfg.vocab)
    max_len = max(map(len, prompts)) + 40
    res = {"batch": batch, "layers": cfg.layers}
    # --- through patd
    conn = patd.Conn(model=cfg.patd_model(), max_batch_tokens=4096, socket=sock, label="bench")
    attn = PatdAttention(conn)
    seqs, lens, pend = [], [], []
    for phase in (prompts[:4], prompts[4:]):  # one per (system, task) pair first: the others
        for p in phase:                        # then find their shared prefix cached
            s, c = conn.seq_open(p)
            seqs.append(s)
            lens.append(c)
            pend.append(p[c:])
        prefill(conn, model, attn, seqs, lens, pend)
    toks = [1 + i % 50 for i in range(batch)]

    m0 = tf.stats(sock)
    t_p, t_first = [], []
    first = torch.cuda.Event(True)
    start = torch.cuda.Event(True)
    for step in range(28):
        tt = torch.tensor(toks, device="cuda")
        pp = torch.tensor(lens, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        conn.step_begin(seqs, [1] * batch, toks)
        start.record()
        # the frontend's work before layer 0's hand-off, timed on the GPU
        orig = attn.attend

        def attend(layer, q, k, v, orig=orig):
            if layer == 0:
                first.record()
            return orig(layer, q, k, v)

        attn.attend = attend
        logits = model.forward(tt, pp, attn)
        attn.attend = orig
        info = conn.step_end()
        torch.cuda.synchronize()
        if step >= 4:
            t_p.append(time.perf_counter() - t0)
            t_first.append(start.elapsed_time(first) * 1e-3)
        toks = logits.argmax(-1).tolist()
        lens = [x + 1 for x in lens]
    m1 = tf.stats(sock)
    packs = m1["patd_pack_total"] - m0["patd_pack_total"]
    res["pack_us"] = (m1["patd_pack_seconds_total"] - m0["patd_pack_seconds_total"]) / \
        max(1, packs) * 1e6
    starts, secs, _ = tf.step_stages(m1, m0)
    res["start_us"] = secs / max(1, starts) * 1e6
    res["kv_bytes_layer"] = info["kv_bytes"]
    res["qc_bytes_layer"] = info["qc_bytes"]
    for s in seqs:
        conn.seq_close(s)
    conn.close()
    # --- in-process attention, same prompts
    ref = DenseAttention(cfg, batch, max_len)
    for i, p in enumerate(prompts):  # prefill one by one (reference path)
        ref.begin([i], [0], [len(p)])
        model.forward(torch.tensor(p, device="cuda"), torch.arange(len(p), device="cuda"), ref)
    lens = [len(p) for p in prompts]
    toks = [1 + i % 50 for i in range(batch)]
    t_r = []
    for step in range(28):
        tt = torch.tensor(toks, device="cuda")
        pp = torch.tensor(lens, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ref.begin(list(range(batch)), lens, [1] * batch)
        logits = model.forward(tt, pp, ref)
        torch.cuda.synchronize()
        if step >= 4:
            t_r.append(time.perf_counter() - t0)
        toks = logits.argmax(-1).tolist()
        lens = [x + 1 for x in lens]
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    res["patd_step_ms"] = med(t_p) * 1e3
    res["inproc_step_ms"] = med(t_r) * 1e3
    res["before_layer0_us"] = med(t_first) * 1e6
    res["overhead_per_layer_us"] = (res["patd_step_ms"] - res["inproc_step_ms"]) * 1e3 / cfg.layers
    H, F, V = cfg.hidden, cfg.ffn, cfg.vocab
    kvh = cfg.kv_heads * cfg.head_dim
    flops = 2 * batch * (cfg.layers * (H * H * 2 + 2 * H * kvh + 3 * H * F) + H * V)
    wbytes = 2 * (cfg.layers * (2 * H * H + 2 * H * kvh + 3 * H * F) + H * V)
    res["floor_gemm_ms"] = flops / tc * 1e3
    res["floor_weights_ms"] = wbytes / bw * 1e3
    res["floor_kv_ms"] = res["kv_bytes_layer"] * cfg.layers / bw * 1e3
    print("batch %3d: step through patd %.2f ms, in-process %.2f ms (%+.1f us per layer); "
          "pack %.1f us/step vs %.1f us of frontend work before layer 0; STEP_BEGIN to layer 0 "
          "enqueued %.1f us (patd's mean); KV read per layer %.1f MB (query-centric %.1f MB); "
          "floors: weights %.2f ms, GEMM %.2f ms, KV %.3f ms"
          % (batch, res["patd_step_ms"], res["inproc_step_ms"], res["overhead_per_layer_us"],
             res["pack_us"], res["before_layer0_us"], res["start_us"], res["kv_bytes_layer"] / 1e6,
             res["qc_bytes_layer"] / 1e6, res["floor_weights_ms"], res["floor_gemm_ms"],
             res["floor_kv_ms"]), flush=True)
    if js:
        js.write(json.dumps(res) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--patd", required=True)
    ap.add_argument("--json")
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    import tempfile
    cfg = Config(layers=a.layers)
    tf.CFG = cfg
    rundir = tempfile.mkdtemp(prefix="patd-bench-")
    daemon, sock = tf.start_daemon(a.patd, rundir, extra=["--step-timeout-ms=30000",
                                                          "--blocks=32768"])
    bw, tc = floors()
    print("floors: read bandwidth %.0f GB/s, bf16 GEMM %.0f TFLOP/s" % (bw / 1e9, tc / 1e12))
    model = Llama(cfg, seed=1)
    js = open(a.json, "a") if a.json else None
    try:
        for b in (64, 256):
            run(b, cfg, model, sock, js, bw, tc)
    finally:
        daemon.terminate()
        daemon.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
