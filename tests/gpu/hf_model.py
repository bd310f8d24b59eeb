"""The Llama-3-8B-shaped transformers model that the GPU frontend tests drive through patd
(test_hf.py, test_persist.py), and the patd options that serve it."""

import torch
import transformers

SHAPE = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             max_position_embeddings=8192, rope_theta=500000.0)


def llama(layers, cpu):
    """The model with random weights (seed 0), bf16, layers deep; cpu: the smoke run's, on the
    CPU with the attention's shape and a small rest (hidden size, FFN, vocabulary)."""
    torch.manual_seed(0)
    shape = dict(SHAPE, num_hidden_layers=layers)
    if cpu:
        shape.update(hidden_size=512, intermediate_size=1024, vocab_size=4096)
    cfg = transformers.LlamaConfig(**shape)
    if cpu:
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.device("cuda"):
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def patd_args(layers, backend):
    """patd's options for that model: its attention shape, a pool of 4096 blocks, batches of
    8192 tokens (the cpu backend's steps may take minutes)."""
    return ["--backend=" + backend, "--layers=%d" % layers, "--q-heads=32", "--kv-heads=8",
            "--head-dim=128", "--dtype=bf16", "--blocks=4096", "--conn-max-batch-tokens=8192",
            "--staging-mb=2048", "--conn-max-staging-mb=1024",
            "--step-timeout-ms=%d" % (20000 if backend == "cuda" else 600000)]
