#!/usr/bin/env python3
"""FlashInfer's decode on the PAT paper's trees, over a 16-bit and an fp8 KV pool: the peer that
bench_attn --kv's fp8 numbers stand beside (tests/bench/compare_fp8.py joins the two).

Trees in bench_attn's notation B_L (nodes per level, then tokens per level; the last level is each
query's own tokens); every node owns distinct pages of 16 tokens, a query's page table is its
root-to-leaf path, one decode token per query, head_dim 128, fp16 queries. Ways, each timed over
the same pool:
  decode   BatchDecodeWithPagedKVCacheWrapper (tensor cores), every query over its whole path
  cascade  MultiLevelCascadeAttentionWrapper, one level per tree level: each node's pages read
           once by the queries below it, the levels' states merged (FlashInfer's shared-prefix
           answer). Where its default backend refuses to build (FA3 on sm90 has no GMMA for
           fp16 queries over fp8 KV in 0.5.2), its levels run on FlashInfer's FA2 prefill
           (BatchPrefillWithPagedKVCacheWrapper backend="fa2"), recorded as cascade_*_backend
each with the pool in fp16 and in fp8 (e4m3 or e5m2, scales 1: the pool holds the fp16 values
rounded to fp8). A way FlashInfer refuses is recorded with its error instead of a time, and
not tried again for later cases (a refused JIT build costs a minute each time); the lines of a
build's output that name an error go to stderr once.

--warm runs each way once on the first tree and heads, untimed and unchecked, to leave
FlashInfer's JIT builds in its cache (run.sh --fp8 does that while patd builds).

Timing as bench_attn's: each call after a 256 MiB L2 flush, CUDA events, 5 warm-ups, the median
of 30. Each output is checked against a float32 reference over the same pool's values (a sample
of queries); a way whose error exceeds 2e-2 fails the run.

usage: bench_flashinfer_trees.py [--trees 'B_L;B_L;paper'] [--heads 32/8,...]
                                 [--kv fp8_e4m3|fp8_e5m2] [--json OUT] [--warm]
"""
import argparse
import json
import sys

PAGE = 16
D = 128
PAPER = ["1,10_4096,416", "1,256_256,32", "1,1024_2048,32", "1,2,64_1024,256,256",
         "1,4,256_32,256,32", "1,8,512_32,512,256", "1,8,512_32,2048,256",
         "1,8,512_512,512,256", "1,4,8,256_32,256,256,32", "1,4,16,512_1024,256,128,32",
         "1,4,16,64,256,1024_256,32,256,64,32,256", "1,16,32,64,128,1024_256,128,64,32,32,32",
         "1,16,32,64,256,1024_256,128,64,32,32,32",
         "1,8,16,32,64,128,1024_256,128,64,32,32,32,32",
         "1,8,16,32,64,256,1024_256,128,64,32,32,32,32", "2,8,16,256_256,256,32,32",
         "4,16,256,512_512,32,128,32", "8,16,32,256_512,512,256,32", "256_1024", "256_4096"]
HEADS = [(32, 32), (32, 8)]  # bench_attn --kv's fp8 table (each FlashInfer kernel is a JIT build)


def parse_tree(spec):
    """(nodes per level, tokens per level), or ValueError: every level but the last a whole
    number of pages, each level's node count a multiple of the one above"""
    try:
        a, b = spec.split("_")
        nodes, toks = [int(x) for x in a.split(",")], [int(x) for x in b.split(",")]
    except ValueError:
        raise ValueError("tree '%s': not B_L (e.g. 1,10_4096,416)" % spec) from None
    if len(nodes) != len(toks) or min(nodes + toks) < 1:
        raise ValueError("tree '%s': as many positive node counts as token counts" % spec)
    for i in range(1, len(nodes)):
        if nodes[i] % nodes[i - 1]:
            raise ValueError("tree '%s': level %d's nodes not a multiple of level %d's"
                             % (spec, i, i - 1))
    for i, t in enumerate(toks[:-1]):
        if t % PAGE:
            raise ValueError("tree '%s': level %d's %d tokens are not whole pages of %d"
                             % (spec, i, t, PAGE))
    return nodes, toks


def tree_pages(nodes, toks):
    """per level, each node's pages (ids from 0, distinct); per query its path's pages"""
    nq, nxt, level_pages = nodes[-1], 0, []
    for n, t in zip(nodes, toks):
        per = (t + PAGE - 1) // PAGE
        level_pages.append([list(range(nxt + i * per, nxt + (i + 1) * per)) for i in range(n)])
        nxt += n * per
    paths = [[p for lv, n in enumerate(nodes) for p in level_pages[lv][q * n // nq]]
             for q in range(nq)]
    return level_pages, paths, nxt


def parse_heads(text):
    out = []
    for h in text.split(","):
        q, k = (int(x) for x in h.split("/"))
        if q < 1 or k < 1 or q % k:
            raise ValueError("heads '%s': q/kv with q a multiple of kv" % h)
        out.append((q, k))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default="paper", help="B_L specs and 'paper', ';'-separated")
    ap.add_argument("--heads", default=",".join("%d/%d" % h for h in HEADS))
    ap.add_argument("--kv", default="fp8_e4m3", choices=["fp8_e4m3", "fp8_e5m2"])
    ap.add_argument("--json", help="one JSON object per case here")
    ap.add_argument("--warm", action="store_true",
                    help="only build FlashInfer's kernels: each way once on the first tree")
    a = ap.parse_args()
    try:
        specs = [t for s in a.trees.split(";") for t in (PAPER if s == "paper" else [s])]
        trees = [(s, parse_tree(s)) for s in specs]
        heads = parse_heads(a.heads)
    except ValueError as e:
        print("bench_flashinfer_trees: %s" % e, file=sys.stderr)
        return 2

    try:
        import torch
        import flashinfer
    except ImportError as e:
        print("bench_flashinfer_trees: needs torch and flashinfer on a GPU host (%s)" % e,
              file=sys.stderr)
        return 2

    f8 = torch.float8_e4m3fn if a.kv == "fp8_e4m3" else torch.float8_e5m2
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def timed(fn):
        for _ in range(5):
            fn()
        ts = []
        for _ in range(30):
            flush.zero_()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        return sorted(ts)[len(ts) // 2]

    if a.warm:
        trees, heads = trees[:1], heads[:1]
    js = open(a.json, "w") if a.json else None
    cases = failed = 0
    refused = {}  # way key -> the error of its first refusal
    fa2 = {}  # cascade way key -> the default backend's refusal, where FA2's prefill stands in

    def cascade(levels, key):
        """FlashInfer's cascade, its levels on the FA2 prefill where the default (FA3 on sm90)
        refused to build: that has no GMMA for fp16 queries over fp8 KV in 0.5.2"""
        w = flashinfer.MultiLevelCascadeAttentionWrapper(levels, ws, "NHD")
        if key in fa2:
            w._batch_prefill_wrappers = [
                flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
                for _ in range(levels)]
        return w
    print("%-46s %6s %5s %9s %9s %9s %9s" % ("tree", "heads", "q", "dec f16", "dec fp8",
                                            "casc f16", "casc fp8"))
    for spec, (nodes, toks) in trees:
        level_pages, paths, n_pages = tree_pages(nodes, toks)
        nq, kv_len = nodes[-1], sum(toks)
        for qh, kvh in heads:
            torch.manual_seed(1)
            kv16 = (torch.randn(n_pages, 2, PAGE, kvh, D, device="cuda") * 0.5).half()
            kv8 = kv16.to(f8)
            pools = {"f16": kv16, "fp8": kv8}
            q = torch.randn(nq, qh, D, device="cuda").half()
            i32 = dict(dtype=torch.int32, device="cuda")
            # decode: each query's path
            ends = [0]
            for p in paths:
                ends.append(ends[-1] + len(p))
            indptr = torch.tensor(ends, **i32)
            indices = torch.tensor([p for path in paths for p in path], **i32)
            last = torch.tensor([kv_len - (len(p) - 1) * PAGE for p in paths], **i32)
            # cascade: per level, each node's pages for the queries below it
            lv_qo, lv_ip, lv_ix, lv_last = [], [], [], []
            for lv, n in enumerate(nodes):
                per_node = nq // n
                lv_qo.append(torch.tensor([i * per_node for i in range(n + 1)], **i32))
                pg = level_pages[lv]
                lv_ip.append(torch.tensor([len(pg[0]) * i for i in range(n + 1)], **i32))
                lv_ix.append(torch.tensor([p for node in pg for p in node], **i32))
                lv_last.append(torch.full((n,), toks[lv] - (len(pg[0]) - 1) * PAGE, **i32))
            row = {"tree": spec, "q_heads": qh, "kv_heads": kvh, "queries": nq,
                   "kv": a.kv, "page": PAGE}
            cases += 1
            wrong = False
            # reference (float32 over the pool's values) for a sample of queries
            sample = sorted(set([0, nq // 2, nq - 1]))
            ref = {}
            for name, pool in pools.items():
                full = pool.float()
                outs = []
                for qi in sample:
                    k = full[paths[qi], 0].reshape(-1, kvh, D)[:kv_len]
                    v = full[paths[qi], 1].reshape(-1, kvh, D)[:kv_len]
                    g = qh // kvh
                    s = torch.einsum("hd,thd->ht", q[qi].float(),
                                     k.repeat_interleave(g, dim=1)) / D ** 0.5
                    outs.append(torch.einsum("ht,thd->hd", s.softmax(-1),
                                             v.repeat_interleave(g, dim=1)))
                ref[name] = torch.stack(outs)
            for name, pool in pools.items():
                for way in ("decode", "cascade"):
                    key = "%s_%s" % (way, name)
                    if key in refused:
                        row[key + "_error"] = refused[key]
                        continue
                    fn = None
                    for _ in range(2):  # a cascade the default backend refuses: again on FA2
                        try:
                            if way == "decode":
                                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                                    ws, "NHD", use_tensor_cores=True)
                                w.plan(indptr, indices, last, qh, kvh, D, PAGE,
                                       q_data_type=torch.float16, kv_data_type=pool.dtype)
                            else:
                                w = cascade(len(nodes), key)
                                w.plan(lv_qo, lv_ip, lv_ix, lv_last, qh, kvh, D, PAGE,
                                       q_data_type=torch.float16, kv_data_type=pool.dtype)
                            fn = (lambda w=w, pool=pool: w.run(q, pool))
                            o = fn()
                        except Exception as e:  # a way FlashInfer refuses: recorded, not a failure
                            fn = None
                            lines = str(e).splitlines()
                            first = lines[0][:200] if lines else repr(e)
                            print("%s %d/%d %s%s refused: %s" % (spec, qh, kvh, key,
                                  " (fa2)" if key in fa2 else "", first), file=sys.stderr)
                            for ln in [ln for ln in lines[1:] if "error" in ln.lower()][:6]:
                                print("  " + ln.strip()[:300], file=sys.stderr)
                            if way == "cascade" and key not in fa2:
                                fa2[key] = first
                                continue
                            refused[key] = row[key + "_error"] = first
                        break
                    torch.cuda.synchronize()
                    if fn is None:
                        continue
                    if key in fa2:
                        row[key + "_backend"] = "fa2"
                        row[key + "_auto_error"] = fa2[key]
                    if a.warm:
                        print("warm: %s built%s" % (key, " (fa2)" if key in fa2 else ""),
                              flush=True)
                        continue
                    err = ((o[sample].float() - ref[name]).abs().max() /
                           ref[name].abs().max()).item()
                    row[key + "_rel_err"] = err
                    if err > 2e-2:
                        wrong = True
                        print("%s %d/%d %s: error %.2e vs float32" % (spec, qh, kvh, key, err),
                              file=sys.stderr)
                    row[key + "_us"] = timed(fn)
                    torch.cuda.synchronize()
            if a.warm:
                continue
            cols = ["%9.1f" % row[k + "_us"] if k + "_us" in row else "%9s" % "refused"
                    for k in ("decode_f16", "decode_fp8", "cascade_f16", "cascade_fp8")]
            print("%-46s %2d/%-3d %5d %s" % (spec, qh, kvh, nq, " ".join(cols)), flush=True)
            failed += wrong
            if js:
                js.write(json.dumps(row) + "\n")
                js.flush()
    if a.warm:
        print("warm: %d ways refused" % len(refused))
        return 0
    print("%d passed, %d failed" % (cases - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
