"""GPU version of the transformers integration test (client/python/tests/test_transformers.py):
a Llama-3-8B-shaped transformers model (bf16, random weights, 32 layers, 32/8 heads, d 128)
generates greedily through patd.transformers against a real patd on the cuda backend (in another
process, under MPS), beside the same model with transformers' own "sdpa" attention.

Requests share a 512-token system prompt, join at different steps and leave after different
numbers of tokens. Checks, per request and step (teacher-forced on patd's tokens), against the
same weights in float32: patd's logits are as close (L2, relative; within 1.5x or 1e-2) as
transformers' own bf16 sdpa's, and patd's token is float32's argmax wherever its top-two margin
exceeds four times that step's largest absolute error (a closer call is a bf16 tie either way,
counted, not failed).

Run by tests/gpu/run.sh (MPS started there). Prints "N passed, N failed"; exit 1 on failure.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))

import torch  # noqa: E402
import transformers  # noqa: E402

import patd  # noqa: E402
import patd.transformers as pt  # noqa: E402
from hf_drive import greedy_plan  # noqa: E402
from hf_model import llama, patd_args  # noqa: E402

def start_daemon(bin_path, rundir, layers, backend):
    args = [bin_path, "--runtime-dir=" + rundir, "--name=hf", "--metrics-port=0"] + \
        patd_args(layers, backend)
    log = open(os.path.join(rundir, "patd.log"), "w")
    p = subprocess.Popen(args, stderr=log, stdout=log)
    sock = os.path.join(rundir, "hf.sock")
    for _ in range(600):
        if p.poll() is not None:
            break
        try:
            patd.admin("status", socket=sock, timeout_ms=1000)
            return p, sock
        except (patd.PatError, OSError):
            time.sleep(0.1)
    raise RuntimeError("patd did not come up:\n" + open(os.path.join(rundir, "patd.log")).read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patd", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--cpu", action="store_true",
                    help="a smoke run without a GPU: cpu backend, model on the CPU with the "
                         "attention's shape but a small hidden size, FFN and vocabulary, eager "
                         "attention as the reference")
    args = ap.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    print("transformers", transformers.__version__, "torch", torch.__version__)
    rundir = tempfile.mkdtemp(prefix="patd-hf-gpu.")
    proc, sock = start_daemon(args.patd, rundir, args.layers, "cpu" if args.cpu else "cuda")
    passed = failed = 0
    try:
        model = llama(args.layers, args.cpu)
        cfg = model.config
        g = torch.Generator().manual_seed(1)
        system = torch.randint(0, cfg.vocab_size, (512,), generator=g).tolist()
        plan = []  # (prompt, join step, tokens to generate)
        for i in range(8):
            tail = torch.randint(0, cfg.vocab_size, (16 + 9 * i,), generator=g).tolist()
            plan.append((system + tail, 0 if i < 5 else 3 + i, 6 + 2 * i))
        t0 = time.time()
        eng = pt.Engine(model, socket=sock, max_batch_tokens=8192)
        done = greedy_plan(eng, plan)
        print("patd: %d requests, %d steps in %.1f s; cached tokens %d"
              % (len(done), eng.steps, time.time() - t0, eng.conn.stats()["cached_tokens"]))
        eng.close()
        ref_impl = "eager" if args.cpu else "sdpa"
        model.config._attn_implementation = ref_impl
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(ref_impl)

        def logits_of(m):  # teacher-forced on patd's tokens: the logits of every step
            out = []
            for i, toks, _ in sorted(done):
                seq = plan[i][0] + toks[:-1]
                with torch.no_grad():
                    lg = m(input_ids=torch.tensor([seq], device=dev),
                           use_cache=False).logits[0, len(plan[i][0]) - 1:]
                out.append(lg.float().cpu())
            return out

        ref16 = logits_of(model)       # transformers' own attention, the same bf16 model
        model = model.float()           # and the float32 reference (the same weights, widened)
        ref32 = logits_of(model)
        err_p = err_r = worst_abs = 0.0
        ties, wrong = 0, []
        for (i, toks, lgs), r16, r32 in zip(sorted(done), ref16, ref32):
            for k, (tok, lg) in enumerate(zip(toks, lgs)):
                n32 = r32[k].norm()
                err_p = max(err_p, float((lg - r32[k]).norm() / n32))
                err_r = max(err_r, float((r16[k] - r32[k]).norm() / n32))
                d = float((lg - r32[k]).abs().max())
                worst_abs = max(worst_abs, d)
                top = torch.topk(r32[k], 2)
                margin = float(top.values[0] - top.values[1])
                if tok != int(top.indices[0]):
                    if margin > 4 * d:
                        wrong.append((i, k, tok, int(top.indices[0]), margin))
                    else:
                        ties += 1
        n_tok = sum(len(t) for _, t, _ in done)
        print("vs float32: %d tokens; worst relative logit error (L2) patd %.2e, transformers' "
              "bf16 %s %.2e; largest absolute %.3f; %d bf16 ties, %d clear mismatches"
              % (n_tok, err_p, ref_impl, err_r, worst_abs, ties, len(wrong)))
        # patd's bf16 logits are as close to float32 as transformers' own bf16 attention's
        ok = len(done) == len(plan) and err_p <= max(1.5 * err_r, 1e-2) and not wrong
        for w in wrong[:10]:
            print("  request %d token %d: patd %d, float32 %d (margin %.3f)" % w)
        passed += ok
        failed += not ok
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", rundir], check=False)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
