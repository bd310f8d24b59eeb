"""A schedule of requests driven greedily through a patd.transformers Engine (the CPU test
test_transformers.py and the GPU test tests/gpu/test_hf.py)."""

import torch


def greedy_plan(eng, plan, on_add=None, after_step=None, max_steps=200):
    """plan: (prompt, step it joins at, tokens it generates) per request. Each request is added
    at its step, takes the argmax of its logits until it has its tokens, and is released.
    on_add(i, request) runs as request i joins, after_step() after every step. Returns
    [(i, tokens, logits as float32 CPU tensors)] in the order the requests finished."""
    live, done, step = {}, [], 0
    while step < max_steps and (live or any(j >= step for _, j, _ in plan)):
        for i, (p, j, _) in enumerate(plan):
            if j == step:
                r = eng.add(p)
                live[r] = (i, [], [])
                if on_add:
                    on_add(i, r)
        for r, lg in eng.step().items():
            i, toks, lgs = live[r]
            tok = int(torch.argmax(lg))
            toks.append(tok)
            lgs.append(lg.float().cpu())
            if len(toks) == plan[i][2]:
                eng.release(r)
                done.append((i, toks, lgs))
                del live[r]
            else:
                eng.append(r, tok)
        if after_step:
            after_step()
        step += 1
    return done
