"""Hugging Face transformers causal LMs whose attention runs in patd.

    import torch, transformers, patd.transformers as pt
    model = transformers.LlamaForCausalLM(config).eval()      # or from_pretrained(...)
    eng = pt.Engine(model, socket="/run/patd/patd.sock")       # checks the model, connects
    out = eng.generate([prompt_a, prompt_b], max_new_tokens=32)   # greedy: lists of token ids

The model keeps no KV cache: patd owns it. Its prefix cache hands back what earlier requests
computed (a shared system prompt is prefilled once), and its decode reads a prefix that several
requests share once per step. Each step the engine packs every request's new tokens into one
row (batch 1, each token at its own request's position, so RoPE is right), runs the model with
use_cache=False, and the attention of every layer goes through transformers' attention
interface, registered here as "patd": Q, K and V after RoPE are written into the session's
staging buffers, patd appends K and V to the request's sequence and returns O.

A session's staging (the Q, K, V and O rows patd makes for it, counted against the daemon's
limits.staging_mb) is sized by the most query tokens one step may carry, so the engine asks for
what its steps use, not a large constant: a prefill chunk (prefill_chunk, default 512 tokens: a
longer prompt is fed over several steps) plus one decode token for each other sequence it may
hold (max_seqs), i.e. max_batch_tokens = prefill_chunk + max_seqs - 1. Without max_seqs it asks
for prefill_chunk alone: when more requests decode at once than that, they take turns. Passing
max_batch_tokens sets the budget itself, and then the chunk is the whole budget unless
prefill_chunk says otherwise.

Lower level, for a serving loop (requests join and leave between steps):

    r = eng.add(prompt_ids)           # a Request: one patd sequence; r.cached_len from the cache
    logits = eng.step()               # {request: next-token logits} for those fully fed
    eng.append(r, token)              # the sampled token is r's next input
    kids = eng.fork(r, 3)             # parallel sampling: copies that share r's KV in patd
    eng.release(r)

What it serves: decoder-only causal LMs whose attention is plain causal softmax attention with
RoPE applied before it (Llama, Qwen2, Qwen3, Mistral without sliding window, ...), head_dim 64,
128 or 256, float16 / bfloat16 / float32, with the daemon's model matching (layers, heads,
head_dim, dtype, softmax scale, no soft cap). Engine() refuses anything else before it connects,
naming the feature: sliding-window attention, attention sinks, ALiBi, logit soft-capping, a
softmax scale other than the daemon's, encoder-decoder or latent (MLA) attention, other head
sizes and dtypes. Tested with transformers 4.48 and 4.49 (TESTED); older versions lack the
attention interface and are refused, newer ones are used with a warning.
"""

import inspect
import warnings

import torch
import transformers as _hf

import patd

__all__ = ["Engine", "Request", "UnsupportedModel", "check_model", "register", "TESTED"]

TESTED = ((4, 48), (4, 49))  # the transformers releases (major, minor) the tests ran on
NAME = "patd"                # the attn_implementation name registered with transformers
PREFILL_CHUNK = 512          # tokens of a prompt one step feeds, unless Engine() is told
HEAD_DIMS = (64, 128, 256)  # KERN_HEAD_DIMS of kernels/kern.h (tests/test_patd.py compares)
_DTYPES = {torch.float16: patd.F16, torch.bfloat16: patd.BF16, torch.float32: patd.F32}


class UnsupportedModel(ValueError):
    """The model uses an attention feature patd does not serve (the message names it)."""


def _hf_version():
    parts = []
    for x in _hf.__version__.split(".")[:2]:
        digits = "".join(ch for ch in x if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


_engine = None  # the Engine whose step is running (the attention function's context)


def _attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
               sliding_window=None, softcap=None, **kwargs):
    """transformers' attention interface: query (1, H, T, D), key and value (1, KVH, T, D) of
    the step's packed tokens; returns O as (1, T, H, D) and no weights. The mask is not used:
    patd knows each token's sequence and position (causal within the step's new tokens)."""
    eng = _engine
    if eng is None:
        raise RuntimeError("patd attention ran outside patd.transformers.Engine.step(): this "
                           "model's attention is served by patd, run it through an Engine")
    if sliding_window is not None:
        raise UnsupportedModel("sliding-window attention (window %s) reached patd's attention"
                               % (sliding_window,))
    if softcap:
        raise UnsupportedModel("attention logit soft-capping (%s) reached patd's attention"
                               % (softcap,))
    if dropout:
        raise UnsupportedModel("attention dropout (%s): run the model in eval mode" % dropout)
    b, h, t, d = query.shape
    if b != 1 or t != eng._n_tokens:
        raise RuntimeError("patd attention got a batch of %d x %d tokens, the step packed 1 x %d"
                           % (b, t, eng._n_tokens))
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise RuntimeError("patd attention: the attention module has no layer_idx")
    if scaling is not None and abs(scaling - eng.scale) > 1e-6 * eng.scale:
        raise UnsupportedModel("softmax scale %g, the daemon's is %g" % (scaling, eng.scale))
    c = eng.conn
    c.q[:t].copy_(query[0].transpose(0, 1))
    c.k[:t].copy_(key[0].transpose(0, 1))
    c.v[:t].copy_(value[0].transpose(0, 1))
    c.attend(layer)
    out = c.o[:t].to(device=query.device, dtype=query.dtype, copy=True)
    return out.unsqueeze(0), None


def register():
    """Registers "patd" with transformers' attention interface (idempotent): a model loaded
    with attn_implementation="patd", or given to Engine, runs its attention through it."""
    v = _hf_version()
    if v < TESTED[0]:
        raise ImportError("patd.transformers needs transformers >= %d.%d (its attention "
                          "interface), found %s" % (TESTED[0] + (_hf.__version__,)))
    try:
        from transformers import AttentionInterface  # 4.50 and later
        AttentionInterface.register(NAME, _attention)
    except ImportError:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        ALL_ATTENTION_FUNCTIONS[NAME] = _attention


def _attention_modules(model):
    return [m for m in model.modules()
            if hasattr(m, "layer_idx") and hasattr(m, "scaling") and hasattr(m, "head_dim")]


def check_model(model, scale=None):
    """Returns the patd.Model the daemon must serve for this transformers model, or raises
    UnsupportedModel naming the first feature patd does not serve. scale: the daemon's softmax
    scale (None: 1/sqrt(head_dim), patd's default)."""
    cfg = model.config
    kind = "%s (model_type %r)" % (type(model).__name__, getattr(cfg, "model_type", "?"))

    def no(feature):
        raise UnsupportedModel("%s: patd does not serve %s" % (kind, feature))

    if getattr(cfg, "is_encoder_decoder", False):
        no("encoder-decoder (cross) attention")
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True):
        no("sliding-window attention (config.sliding_window=%s)" % window)
    types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        no("layer types other than full attention (config.layer_types has %r)"
           % sorted(set(t for t in types if t != "full_attention")))
    attn_config = getattr(cfg, "attn_config", None)
    if (getattr(cfg, "alibi", False) or getattr(cfg, "position_embedding_type", None) == "alibi"
            or getattr(attn_config, "alibi", False)
            or (isinstance(attn_config, dict) and attn_config.get("alibi"))
            or getattr(cfg, "model_type", "") in ("bloom", "mpt")):
        no("ALiBi position biases")
    for key in ("attn_logit_softcapping", "attention_logit_softcapping"):
        if getattr(cfg, key, None):
            no("attention logit soft-capping (config.%s=%s)" % (key, getattr(cfg, key)))
    if getattr(cfg, "kv_lora_rank", None) or getattr(cfg, "q_lora_rank", None):
        no("multi-head latent attention (config.kv_lora_rank)")
    if getattr(cfg, "rope_theta", None) is None and not any(
            "rotary" in type(m).__name__.lower() for m in model.modules()):
        no("attention without rotary position embeddings (RoPE)")
    mods = _attention_modules(model)
    if not mods:
        no("an attention that does not go through transformers' attention interface")
    for m in mods:
        if getattr(m, "sinks", None) is not None:
            no("attention sinks (layer %d)" % m.layer_idx)
        if getattr(m, "is_causal", True) is False:
            no("non-causal attention (layer %d)" % m.layer_idx)

    n_layers = cfg.num_hidden_layers
    q_heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or q_heads
    head_dim = mods[0].head_dim
    if head_dim not in HEAD_DIMS:
        no("head_dim %d (patd serves %s)" % (head_dim, ", ".join(map(str, HEAD_DIMS))))
    if q_heads % kv_heads or q_heads // kv_heads > 16:
        no("%d query heads over %d KV heads (a whole GQA group of at most 16)"
           % (q_heads, kv_heads))
    want = scale if scale else head_dim ** -0.5
    for m in mods:
        if abs(m.scaling - want) > 1e-6 * want:
            no("a softmax scale of %g at layer %d (the daemon's is %g: model.scale)"
               % (m.scaling, m.layer_idx, want))
    if len(mods) != n_layers or sorted(m.layer_idx for m in mods) != list(range(n_layers)):
        no("attention layers other than one per layer, 0..%d" % (n_layers - 1))
    dtype = next(model.parameters()).dtype
    if dtype not in _DTYPES:
        no("parameters of dtype %s (patd serves float16, bfloat16, float32)" % dtype)
    return patd.Model(n_layers, q_heads, kv_heads, head_dim, dtype=_DTYPES[dtype])


class Request:
    """One generation: a patd sequence, its tokens (prompt, then what was appended) and how many
    of them patd holds the KV of (n_in; the rest are fed by the next steps)."""

    def __init__(self, seq, tokens, n_in, cached_len, parent=None):
        self.seq, self.tokens, self.n_in = seq, list(tokens), n_in
        self.cached_len, self.parent = cached_len, parent
        self.open = True

    @property
    def pending(self):
        return len(self.tokens) - self.n_in

    def __repr__(self):
        return "Request(seq=%d, tokens=%d, in patd=%d)" % (self.seq, len(self.tokens), self.n_in)


class Engine:
    """Runs a transformers causal LM with its attention in patd (see the module's docstring).
    Not for concurrent use by several threads."""

    def __init__(self, model, socket=None, max_batch_tokens=None, max_seqs=0,
                 label="transformers", timeout_ms=0, prefill_chunk=None):
        """max_batch_tokens: query tokens one step may carry, which sizes the session's staging
        in patd; None: prefill_chunk + max_seqs - 1 (see the module's docstring). prefill_chunk:
        the most tokens of one prompt a step feeds (default PREFILL_CHUNK, or the whole
        max_batch_tokens when that is given)."""
        if max_batch_tokens is None:
            prefill_chunk = prefill_chunk or PREFILL_CHUNK
            max_batch_tokens = prefill_chunk + max(max_seqs, 1) - 1
        prefill_chunk = prefill_chunk or max_batch_tokens
        if not 0 < prefill_chunk <= max_batch_tokens:
            raise ValueError("prefill_chunk %d must be 1..max_batch_tokens (%d)"
                             % (prefill_chunk, max_batch_tokens))
        register()
        if _hf_version() > TESTED[-1]:
            warnings.warn("patd.transformers was tested with transformers %s, this is %s"
                          % (", ".join("%d.%d" % v for v in TESTED), _hf.__version__))
        pm = check_model(model)  # before connecting: nothing to undo
        st = patd.status(socket=socket)
        self.scale = st.get("scale") or pm.head_dim ** -0.5
        if st.get("softcap"):
            raise UnsupportedModel("the daemon applies a logit soft cap (%g) this model does "
                                   "not have" % st["softcap"])
        pm = check_model(model, self.scale)
        self.model = model
        self.device = next(model.parameters()).device
        self.conn = patd.Conn(pm, max_batch_tokens=max_batch_tokens, socket=socket,
                              max_seqs=max_seqs, label=label, timeout_ms=timeout_ms,
                              arrays="torch")
        self.max_batch_tokens = self.conn.max_batch_tokens
        self.prefill_chunk = min(prefill_chunk, self.max_batch_tokens)
        if hasattr(model, "set_attn_implementation"):  # newer transformers (untested here)
            model.set_attn_implementation(NAME)
        else:
            model.config._attn_implementation = NAME
        params = inspect.signature(model.forward).parameters
        self._keep = "logits_to_keep" if "logits_to_keep" in params else None
        self._reqs = []
        self._n_tokens = 0
        self.steps = 0

    def close(self):
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def requests(self):
        return list(self._reqs)

    def add(self, prompt):
        """Opens a request for a prompt (token ids). Its cached_len tokens of KV came from the
        prefix cache; the rest are fed by the next steps."""
        prompt = [int(x) for x in prompt]
        seq, cached = self.conn.seq_open(prompt)
        r = Request(seq, prompt, cached, cached)
        self._reqs.append(r)
        return r

    def fork(self, r, n=1):
        """n copies of request r sharing its KV in patd (parallel sampling: fork once r's
        prompt is in, then append a different token to each)."""
        kids = []
        for _ in range(n):
            k = Request(self.conn.seq_fork(r.seq), r.tokens, r.n_in, r.cached_len, parent=r)
            self._reqs.append(k)
            kids.append(k)
        return kids

    def append(self, r, token):
        """A token for request r (the one sampled from its logits): its next input."""
        r.tokens.append(int(token))

    def release(self, r):
        """Ends request r: patd frees its KV (full blocks stay in the prefix cache)."""
        if r.open:
            self.conn.seq_close(r.seq)
            r.open = False
            self._reqs.remove(r)

    def step(self):
        """One forward over every request with tokens to feed, at most max_batch_tokens in all
        (prompts are fed in chunks of at most prefill_chunk). Returns {request: logits (vocab,)}
        for each request all of whose tokens are now in patd: the next-token distribution."""
        batch, n = [], 0
        for r in self._reqs:
            take = min(r.pending, self.prefill_chunk, self.max_batch_tokens - n)
            if take > 0:
                batch.append((r, take))
                n += take
        if not batch:
            return {}
        toks, pos, last = [], [], []
        for r, take in batch:
            toks += r.tokens[r.n_in:r.n_in + take]
            pos += range(r.n_in, r.n_in + take)
            last.append(len(toks) - 1)
        global _engine
        self.conn.step_begin([r.seq for r, _ in batch], [t for _, t in batch], toks)
        self._n_tokens = n
        _engine = self
        try:
            with torch.no_grad():
                logits = self._forward(toks, pos, last)
        except BaseException:
            _engine = None
            try:
                self.conn.step_end(abort=True)
            except patd.PatError:
                pass
            raise
        _engine = None
        self.conn.step_end()
        self.steps += 1
        out = {}
        for i, (r, take) in enumerate(batch):
            r.n_in += take
            if r.pending == 0:
                out[r] = logits[i]
        return out

    def _forward(self, toks, pos, last):
        ids = torch.tensor([toks], dtype=torch.long, device=self.device)
        positions = torch.tensor([pos], dtype=torch.long, device=self.device)
        kw = {"input_ids": ids, "position_ids": positions, "use_cache": False}
        idx = torch.tensor(last, dtype=torch.long, device=self.device)
        if self._keep:
            kw[self._keep] = idx
            return self.model(**kw).logits[0].float()
        return self.model(**kw).logits[0, idx].float()

    def generate(self, prompts, max_new_tokens, n=1, temperature=0.0, generator=None,
                 eos_token_id=None):
        """Generates for every prompt: greedy at temperature 0, else sampled (n samples per
        prompt through fork, sharing the prompt's KV). Returns, per prompt, n lists of new
        token ids. The requests are released at the end."""
        if n > 1 and temperature <= 0:
            raise ValueError("n > 1 samples need a temperature > 0 (greedy ones are equal)")
        roots = [self.add(p) for p in prompts]
        slot = {r: (i, 0) for i, r in enumerate(roots)}
        result = [[[] for _ in range(n)] for _ in prompts]
        try:
            while self._reqs and any(r in slot for r in self._reqs):
                for r, lg in self.step().items():
                    group = [r]
                    if n > 1 and r in roots and not result[slot[r][0]][0]:
                        kids = self.fork(r, n - 1)
                        for j, k in enumerate(kids):
                            slot[k] = (slot[r][0], j + 1)
                        group += kids
                    for g in group:
                        tok = self._sample(lg, temperature, generator)
                        i, j = slot[g]
                        result[i][j].append(tok)
                        if len(result[i][j]) >= max_new_tokens or tok == eos_token_id:
                            self.release(g)
                        else:
                            self.append(g, tok)
        finally:
            for r in list(self._reqs):
                if r in slot:
                    self.release(r)
        return result

    @staticmethod
    def _sample(logits, temperature, generator):
        if temperature <= 0:
            return int(torch.argmax(logits))
        p = torch.softmax(logits / temperature, dim=-1)
        return int(torch.multinomial(p.cpu(), 1, generator=generator))
