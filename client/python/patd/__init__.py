"""Python binding of libpat, the client library of patd (ctypes over libpat.so.1).

    import patd
    conn = patd.Conn(socket="/run/patd/patd.sock", model=patd.Model(4, 8, 2, 64),
                     max_batch_tokens=512)
    seq, cached = conn.seq_open(prompt_ids)
    conn.step_begin([seq], [len(prompt_ids) - cached], prompt_ids[cached:])
    for layer in range(4):
        conn.q[:n], conn.k[:n], conn.v[:n] = ...   # numpy views of the staging buffers
        conn.attend(layer)
        out = conn.o[:n]
    info = conn.step_end()

Every libpat error is raised as patd.PatError with .errno (a positive errno value), the
library's name for it and the daemon's detail. The staging buffers are numpy arrays over the
shared memory itself: writing them is handing Q/K/V to the daemon (no copies). A bf16 model's
are uint16 words (numpy has no bf16: patd.bf16_to_float32 / float32_to_bf16 convert), or, with
Conn(..., arrays="torch"), torch.bfloat16 tensors over the same memory.

libpat is found through PATD_LIBPAT, else the copy a pip-installed package carries (setup.py
compiles it into the wheel), else the dynamic linker's search (an installed patd), else a built
source tree's build/lib; its version must match this binding's major and be at least its minor
(`python3 -m patd --version` shows both, and the daemon's).

GPU sessions (a daemon on the cuda backend): conn.q/k/v/o are torch tensors over the daemon's
device memory (CUDA IPC, no copies), and attend(layer, stream) enqueues the hand-off on a torch
stream and returns at once:

    conn = patd.Conn(model=..., max_batch_tokens=4096)      # conn.on_gpu is True
    conn.step_begin(seqs, n_new, tokens)
    for layer in range(n_layers):
        torch.matmul(x, wq, out=conn.q[:n].view(n, -1))       # ... k, v likewise
        conn.attend(layer)                                    # current torch stream
        x = conn.o[:n].view(n, -1) @ wo
    info = conn.step_end()                                    # waits for the daemon

The hand-offs can be captured in a torch.cuda.CUDAGraph (outside a step); per replay:
step_begin(), graph.replay(), replayed(), step_end(). A graph holds conn.epoch: re-capture
when it changes (the daemon had to cut a stalled step).
"""

import ctypes
import ctypes.util
import errno as _errno
import os

import numpy as np

# The libpat release this binding was written for (client/pat.h's PAT_VERSION, through
# _version.py): a libpat of another major version, or an older minor one, is refused at import.
from ._version import __version__

__all__ = ["Model", "Conn", "PatError", "admin", "default_socket", "library_version",
           "library_path", "bf16_to_float32", "float32_to_bf16", "F16", "BF16", "F32"]

# the soname of the libpat this binding loads
_SONAME = "libpat.so.%s" % __version__.split(".")[0]

F16, BF16, F32 = 1, 2, 3
_ADMIN = {"status": 16, "stats": 17, "seqs": 18, "drain": 19, "reload": 20, "check": 22,
          "upgrade": 25}


def _candidates():
    """Where libpat is looked for, in order: PATD_LIBPAT (an override), the copy beside this
    file (what pip installed: setup.py builds it into the package), the dynamic linker's search
    (LD_LIBRARY_PATH, /etc/ld.so.cache: an installed libpat), a source tree's build/lib when
    this package runs from client/python of a built checkout."""
    if os.environ.get("PATD_LIBPAT"):
        return [os.environ["PATD_LIBPAT"]]
    here = os.path.dirname(os.path.abspath(__file__))
    names = []
    bundled = os.path.join(here, _SONAME)
    if os.path.exists(bundled):
        names.append(bundled)
    names.append(_SONAME)
    found = ctypes.util.find_library("pat")
    if found:
        names.append(found)
    tree = os.path.join(here, "..", "..", "..", "build", "lib", _SONAME)
    if os.path.exists(tree):
        names.append(os.path.normpath(tree))
    return names


def _load():
    tried = []
    for n in _candidates():
        try:
            return ctypes.CDLL(n), n
        except OSError as e:
            tried.append(str(e))
    raise OSError("%s not found: pip install client/python of a patd checkout (the package then "
                  "carries it), install patd (make install puts it in /usr/local/lib) or set "
                  "PATD_LIBPAT to its path; tried: %s" % (_SONAME, "; ".join(tried)))


def _check_version(lib_version, want=None):
    """Raises ImportError unless libpat lib_version (major, minor, patch) can serve this
    binding: the same major, a minor at least the binding's."""
    want = want or tuple(int(x) for x in __version__.split("."))
    if lib_version[0] != want[0] or lib_version[1] < want[1]:
        raise ImportError("libpat %d.%d.%d (%s) cannot serve this binding, written for libpat "
                          "%d.%d: install the matching patd release or point PATD_LIBPAT at it"
                          % (lib_version + (_lib_path,) + want[:2]))


_lib, _lib_path = _load()
_u32, _u64, _p = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p


class _Model(ctypes.Structure):
    _fields_ = [("n_layers", _u32), ("q_heads", _u32), ("kv_heads", _u32), ("head_dim", _u32),
                ("dtype", _u32), ("block_size", _u32), ("model_id", _u64)]


class _ConnectOpts(ctypes.Structure):
    _fields_ = [("size", _u32), ("max_batch_tokens", _u32), ("max_seqs", _u32),
                ("timeout_ms", _u32), ("lease_ms", _u32), ("buffer", _u32),
                ("socket", ctypes.c_char_p), ("label", ctypes.c_char_p), ("model", _Model),
                ("pack_policy", _u32), ("kv_dtype", _u32), ("reserved", _u64 * 7)]


class _Buffers(ctypes.Structure):
    _fields_ = [("q", _p), ("k", _p), ("v", _p), ("o", _p), ("q_row_bytes", _u64),
                ("kv_row_bytes", _u64), ("max_batch_tokens", _u32), ("max_seqs", _u32),
                ("max_blocks", _u32), ("lease_ms", _u32), ("on_gpu", _u32), ("mps", _u32),
                ("kv_dtype", _u32), ("kv_scale", ctypes.c_float), ("reserved", _u64 * 6)]


class _StepInfo(ctypes.Structure):
    _fields_ = [("step", _u64), ("n_tokens", _u32), ("pack_reused", _u32), ("kv_bytes", _u64),
                ("qc_bytes", _u64), ("layers_done", _u32), ("committed", _u32),
                ("step_ns", _u64), ("pack_policy", _u32), ("reserved0", _u32),
                ("reserved", _u64 * 3)]


class _ConnStats(ctypes.Structure):
    _fields_ = [("steps", _u64), ("tokens", _u64), ("kv_bytes", _u64), ("qc_bytes", _u64),
                ("prompt_tokens", _u64), ("cached_tokens", _u64), ("reserved", _u64 * 8)]


class _Status(ctypes.Structure):
    _fields_ = [("size", _u32), ("protocol", _u32), ("version", _u32), ("pid", _u32),
                ("instance", _u64), ("uptime_ms", _u64), ("draining", _u32),
                ("max_seq_len", _u32), ("backend", ctypes.c_char * 16), ("model", _Model),
                ("max_conns", _u32), ("conn_max_seqs", _u32), ("conn_max_blocks", _u32),
                ("conn_max_batch_tokens", _u32), ("conn_max_staging_mb", _u32),
                ("lease_ms", _u32), ("step_timeout_ms", _u32), ("blocks_total", _u32),
                ("blocks_free", _u32), ("blocks_used", _u32), ("blocks_cached", _u32),
                ("sequences", _u32), ("connections", _u32), ("steps_in_flight", _u32),
                ("scale", ctypes.c_float), ("softcap", ctypes.c_float), ("kv_dtype", _u32),
                ("kv_scale", ctypes.c_float), ("reserved", _u64 * 4)]


def _sig(name, res, *args):
    f = getattr(_lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


_P32 = ctypes.POINTER(_u32)
_version = _sig("pat_version", _u32)
_strerror = _sig("pat_strerror", ctypes.c_char_p, ctypes.c_int)
_default_socket = _sig("pat_default_socket", ctypes.c_char_p)
_connect = _sig("pat_connect", ctypes.c_int, ctypes.POINTER(_ConnectOpts), ctypes.POINTER(_p),
                ctypes.c_char_p, ctypes.c_size_t)
_close = _sig("pat_close", None, _p)
_buffers = _sig("pat_buffers", ctypes.c_int, _p, ctypes.POINTER(_Buffers))
_last_error = _sig("pat_last_error", ctypes.c_char_p, _p)
_ping = _sig("pat_ping", ctypes.c_int, _p)
_seq_open = _sig("pat_seq_open", ctypes.c_int, _p, _P32, _u32, _P32, _P32)
_seq_open_pending = _sig("pat_seq_open_pending", ctypes.c_int, _p, _P32, _u32, _P32, _P32, _P32)
_seq_fork = _sig("pat_seq_fork", ctypes.c_int, _p, _u32, _P32)
_seq_truncate = _sig("pat_seq_truncate", ctypes.c_int, _p, _u32, _u32)
_seq_close = _sig("pat_seq_close", ctypes.c_int, _p, _u32)
_step_begin = _sig("pat_step_begin", ctypes.c_int, _p, _P32, _P32, _u32, _P32)
_attend = _sig("pat_attend", ctypes.c_int, _p, _u32)
_attend_async = _sig("pat_attend_async", ctypes.c_int, _p, _u32, _p)
_step_replayed = _sig("pat_step_replayed", ctypes.c_int, _p, _p)
_gpu_epoch = _sig("pat_gpu_epoch", _u64, _p)
_instance = _sig("pat_instance", _u64, _p, ctypes.POINTER(_u64))
_step_end = _sig("pat_step_end", ctypes.c_int, _p, ctypes.c_int, ctypes.POINTER(_StepInfo))
_stats = _sig("pat_stats", ctypes.c_int, _p, ctypes.POINTER(_ConnStats))
_status = _sig("pat_status", ctypes.c_int, ctypes.c_char_p, _u32, ctypes.POINTER(_Status))
_admin = _sig("pat_admin", ctypes.c_int, ctypes.c_char_p, ctypes.c_int, _u32,
              ctypes.POINTER(ctypes.c_void_p))
_free = _sig("pat_free", None, _p)


class PatError(OSError):
    """A libpat call failed: .errno is the positive errno, .name libpat's text, .detail the
    daemon's explanation when it gave one."""

    def __init__(self, rc, detail=""):
        self.name = _strerror(rc).decode()
        self.detail = detail
        super().__init__(-rc, "%s%s" % (self.name, ": " + detail if detail else ""))


def library_version():
    v = _version()
    return (v >> 16, (v >> 8) & 0xff, v & 0xff)


def library_path():
    """The libpat this binding loaded (the name it was found under)."""
    return _lib_path


_check_version(library_version())


def bf16_to_float32(a):
    """A numpy array of bf16 words (uint16, as host staging buffers of a bf16 model hold them)
    as float32."""
    w = np.asarray(a, dtype=np.uint16).astype(np.uint32)
    return np.asarray(w << np.uint32(16), dtype=np.uint32).view(np.float32)


def float32_to_bf16(x):
    """float32 values as bf16 words (uint16), rounded to nearest even; NaN stays NaN."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    s16, one = np.uint64(16), np.uint64(1)
    r = ((u + np.uint64(0x7fff) + ((u >> s16) & one)) >> s16).astype(np.uint16)
    return np.where(np.isnan(f), ((u >> s16) | np.uint64(0x40)).astype(np.uint16), r)


def default_socket():
    return _default_socket().decode()


class Model:
    """The model signature the daemon must match."""

    def __init__(self, n_layers, q_heads, kv_heads, head_dim, dtype=F16, block_size=16,
                 model_id=0):
        self.n_layers, self.q_heads, self.kv_heads = n_layers, q_heads, kv_heads
        self.head_dim, self.dtype, self.block_size, self.model_id = (head_dim, dtype,
                                                                     block_size, model_id)

    def _c(self):
        return _Model(self.n_layers, self.q_heads, self.kv_heads, self.head_dim, self.dtype,
                      self.block_size, self.model_id)

    @property
    def np_dtype(self):
        # bf16 has no numpy type: its buffers are exposed as raw uint16 words
        return {F16: np.float16, BF16: np.uint16, F32: np.float32}[self.dtype]


def _arr(values):
    a = (_u32 * len(values))(*[int(v) for v in values])
    return a


class Conn:
    """One session with patd. Not for concurrent use by several threads."""

    _BUFFERS = {"auto": 0, "host": 1, "gpu": 2}
    PACK_POLICIES = ("default", "auto", "bytes", "paper", "query", "tree")  # PAT_PACK_* order

    def __init__(self, model, max_batch_tokens, socket=None, max_seqs=0, timeout_ms=0,
                 label="python", buffer="auto", arrays="numpy", pack_policy="default",
                 kv_dtype=None):
        """arrays: what conn.q/k/v/o of a host session are: "numpy" (bf16 as uint16 words:
        bf16_to_float32 / float32_to_bf16 convert) or "torch" (CPU tensors of the model's
        dtype, torch.bfloat16 included). GPU sessions always give torch CUDA tensors.
        kv_dtype: the KV pool this client needs ("f16", "bf16", "f32", "fp8_e4m3", "fp8_e5m2"),
        refused with EMEDIUMTYPE by a daemon whose pool holds another; None: any. conn.kv_dtype
        and conn.kv_scale say what the daemon's holds."""
        if arrays not in ("numpy", "torch"):
            raise ValueError("arrays must be 'numpy' or 'torch'")
        if pack_policy not in self.PACK_POLICIES:
            raise ValueError("pack_policy must be one of %s" % ", ".join(self.PACK_POLICIES))
        self.model = model
        self._h = None
        o = _ConnectOpts()
        o.size = ctypes.sizeof(_ConnectOpts)
        o.max_batch_tokens = max_batch_tokens
        o.max_seqs = max_seqs
        o.timeout_ms = timeout_ms
        o.socket = socket.encode() if socket else None
        o.label = label.encode() if label else None
        o.model = model._c()
        o.buffer = self._BUFFERS[buffer]
        o.pack_policy = self.PACK_POLICIES.index(pack_policy)
        if kv_dtype is not None:
            codes = {v: k for k, v in _DTYPE_NAMES.items()}
            if kv_dtype not in codes:
                raise ValueError("kv_dtype must be one of %s" % ", ".join(sorted(codes)))
            o.kv_dtype = codes[kv_dtype]
        h = _p()
        why = ctypes.create_string_buffer(256)
        rc = _connect(ctypes.byref(o), ctypes.byref(h), why, len(why))
        if rc < 0:
            raise PatError(rc, why.value.decode(errors="replace"))
        self._h = h
        b = _Buffers()
        _buffers(h, ctypes.byref(b))
        self.max_batch_tokens, self.max_seqs, self.max_blocks = (b.max_batch_tokens, b.max_seqs,
                                                                 b.max_blocks)
        self.on_gpu, self.mps = bool(b.on_gpu), bool(b.mps)
        self.kv_dtype = _DTYPE_NAMES.get(b.kv_dtype or model.dtype, "?")
        self.kv_scale = b.kv_scale or 1.0
        qshape = (b.max_batch_tokens, model.q_heads, model.head_dim)
        kvshape = (b.max_batch_tokens, model.kv_heads, model.head_dim)
        if self.on_gpu:
            view, dt = self._tensor, model.dtype
        elif arrays == "torch":
            view, dt = self._host_tensor, model.dtype
        else:
            view, dt = self._view, model.np_dtype
        self.q = view(b.q, dt, qshape)
        self.k = view(b.k, dt, kvshape)
        self.v = view(b.v, dt, kvshape)
        self.o = view(b.o, dt, qshape)

    @staticmethod
    def _view(ptr, dt, shape):
        n = int(np.prod(shape))
        raw = (ctypes.c_char * (n * np.dtype(dt).itemsize)).from_address(ptr)
        return np.frombuffer(raw, dtype=dt, count=n).reshape(shape)

    @staticmethod
    def _host_tensor(ptr, dtype, shape):
        """A torch CPU tensor over the host staging buffer at ptr (no copy), of the model's
        dtype (bf16 included, which numpy lacks)."""
        import torch
        n = 1
        for x in shape:
            n *= x
        tdt = {F16: torch.float16, BF16: torch.bfloat16, F32: torch.float32}[dtype]
        size = torch.empty((), dtype=tdt).element_size()  # dtype.itemsize: torch >= 2.1 only
        raw = (ctypes.c_char * (n * size)).from_address(ptr)
        return torch.frombuffer(raw, dtype=tdt, count=n).view(shape)

    @staticmethod
    def _tensor(ptr, dtype, shape):
        """A torch tensor over device memory at ptr (no copy): __cuda_array_interface__ in,
        reinterpreted as bf16 where needed (the interface has no bf16 type string)."""
        import torch

        class _Dev:
            pass

        d = _Dev()
        d.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": {F16: "<f2", BF16: "<i2", F32: "<f4"}[dtype],
            "data": (int(ptr), False), "version": 3, "strides": None, "stream": None}
        t = torch.as_tensor(d, device="cuda")
        return t.view(torch.bfloat16) if dtype == BF16 else t

    @staticmethod
    def _stream_handle(stream):
        import torch
        s = stream if stream is not None else torch.cuda.current_stream()
        return _p(s.cuda_stream)

    def _check(self, rc):
        if rc < 0:
            raise PatError(rc, _last_error(self._h).decode(errors="replace"))
        return rc

    def close(self):
        """Ends the session; the staging arrays must not be used afterwards."""
        if self._h:
            self.q = self.k = self.v = self.o = None
            _close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()

    def ping(self):
        self._check(_ping(self._h))

    def seq_open(self, tokens):
        """Opens a sequence with its prompt; returns (seq id, cached_len)."""
        seq, cached = _u32(), _u32()
        self._check(_seq_open(self._h, _arr(tokens), len(tokens), ctypes.byref(seq),
                              ctypes.byref(cached)))
        return seq.value, cached.value

    def seq_open_pending(self, tokens):
        """Opens a sequence with its prompt; returns (seq id, cached_len, pending_len):
        pending_len prompt tokens past the cached ones are about to be written by other open
        sequences of this user (twins). patd does not wait for them; a caller that does (closes
        this sequence and opens it again once they are written) prefills that much less."""
        seq, cached, pending = _u32(), _u32(), _u32()
        self._check(_seq_open_pending(self._h, _arr(tokens), len(tokens), ctypes.byref(seq),
                                      ctypes.byref(cached), ctypes.byref(pending)))
        return seq.value, cached.value, pending.value

    def seq_fork(self, seq):
        child = _u32()
        self._check(_seq_fork(self._h, seq, ctypes.byref(child)))
        return child.value

    def seq_truncate(self, seq, new_len):
        self._check(_seq_truncate(self._h, seq, new_len))

    def seq_close(self, seq):
        self._check(_seq_close(self._h, seq))

    def step_begin(self, seqs, n_new, tokens):
        if len(seqs) != len(n_new) or sum(n_new) != len(tokens):
            raise ValueError("seqs and n_new must pair up and n_new must sum to len(tokens)")
        self._check(_step_begin(self._h, _arr(seqs), _arr(n_new), len(seqs), _arr(tokens)))

    def attend(self, layer, stream=None):
        """Hands over one layer. Host sessions: returns when O is in conn.o. GPU sessions:
        enqueues the hand-off on `stream` (default: torch's current stream) and returns at
        once; later work on the stream sees O."""
        if self.on_gpu:
            self._check(_attend_async(self._h, layer, self._stream_handle(stream)))
        else:
            self._check(_attend(self._h, layer))

    def replayed(self, stream=None):
        """GPU sessions: a captured graph handed over every layer of this step."""
        self._check(_step_replayed(self._h, self._stream_handle(stream)))

    @property
    def instance(self):
        """(instance, start time in Unix seconds) of the daemon this session is with: a new
        session with another instance talks to a restarted daemon. Every call of a session
        whose daemon restarted raises PatError with errno ESTALE."""
        start = _u64()
        return _instance(self._h, ctypes.byref(start)), start.value

    @property
    def epoch(self):
        """GPU sessions: the value captured graphs carry (re-capture when it changes)."""
        return _gpu_epoch(self._h)

    def step_end(self, abort=False):
        info = _StepInfo()
        self._check(_step_end(self._h, 1 if abort else 0, ctypes.byref(info)))
        out = {f: getattr(info, f) for f, _ in _StepInfo._fields_ if not f.startswith("reserved")}
        out["pack_policy"] = (self.PACK_POLICIES[info.pack_policy]
                              if info.pack_policy < len(self.PACK_POLICIES) else info.pack_policy)
        return out

    def stats(self):
        s = _ConnStats()
        self._check(_stats(self._h, ctypes.byref(s)))
        return {f: getattr(s, f) for f, _ in _ConnStats._fields_ if f != "reserved"}


_DTYPE_NAMES = {1: "f16", 2: "bf16", 3: "f32", 4: "fp8_e4m3", 5: "fp8_e5m2"}  # pat.h's codes


def status(socket=None, timeout_ms=10000):
    """The daemon's figures (pat_status) as a dict: versions, model, limits, pool, sessions."""
    st = _Status(size=ctypes.sizeof(_Status))
    rc = _status(socket.encode() if socket else None, timeout_ms, ctypes.byref(st))
    if rc < 0:
        raise PatError(rc, "status")
    out = {f: getattr(st, f) for f, _ in _Status._fields_
           if f not in ("size", "reserved", "model", "backend")}
    out["backend"] = st.backend.decode()
    out["model"] = {f: getattr(st.model, f) for f, _ in _Model._fields_}
    # the KV pool's element type by its config name (an older daemon's pool holds model.dtype)
    out["kv_dtype"] = _DTYPE_NAMES.get(st.kv_dtype or st.model.dtype, "?")
    return out


def admin(op, socket=None, timeout_ms=10000):
    """Operator request ('status', 'stats', 'seqs', 'drain', 'reload', 'check'); returns its
    text."""
    text = ctypes.c_void_p()
    rc = _admin(socket.encode() if socket else None, _ADMIN[op], timeout_ms, ctypes.byref(text))
    s = ctypes.cast(text, ctypes.c_char_p).value.decode() if text.value else ""
    _free(text)
    if rc < 0:
        raise PatError(rc, s)
    return s
