//! A session with patd (one libpat connection) and the sequences it opens.
//!
//! The session owns the `pat_conn_t` (closed on drop: the daemon reclaims every sequence and
//! block it held). A [`Seq`] owns one open sequence: [`Session::seq_close`] consumes it, and a
//! `Seq` dropped instead is queued and closed by its session's next call (a drop cannot reach
//! the session, which a step may be holding). Calls that talk to the daemon take `&mut self`:
//! libpat's calls are not reentrant per connection. A step whose end got no answer (libpat
//! keeps it open) is remembered here and aborted before the next one begins.
use std::ffi::CString;
use std::os::raw::c_char;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::step::Step;
use crate::{check_library, cstr_lossy, path_cstring, sys};

/// Element types: the model's (Q, K, V, O: `F16`, `Bf16`, `F32`) and the KV pool's (those, or
/// the two fp8 formats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    F16,
    Bf16,
    F32,
    Fp8E4m3,
    Fp8E5m2,
}

impl Dtype {
    pub fn code(self) -> u32 {
        match self {
            Dtype::F16 => sys::PAT_F16,
            Dtype::Bf16 => sys::PAT_BF16,
            Dtype::F32 => sys::PAT_F32,
            Dtype::Fp8E4m3 => sys::PAT_FP8_E4M3,
            Dtype::Fp8E5m2 => sys::PAT_FP8_E5M2,
        }
    }

    pub fn from_code(code: u32) -> Option<Dtype> {
        [
            Dtype::F16,
            Dtype::Bf16,
            Dtype::F32,
            Dtype::Fp8E4m3,
            Dtype::Fp8E5m2,
        ]
        .into_iter()
        .find(|d| d.code() == code)
    }

    /// bytes per element
    pub fn size(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::Fp8E4m3 | Dtype::Fp8E5m2 => 1,
        }
    }
}

/// The model signature the daemon must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    pub n_layers: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// F16, Bf16 or F32
    pub dtype: Dtype,
    /// tokens per KV block
    pub block_size: u32,
    /// must equal the daemon's model.model_id
    pub model_id: u64,
}

impl Model {
    /// A model with patd's block size (16 tokens) and model_id 0.
    pub fn new(n_layers: u32, q_heads: u32, kv_heads: u32, head_dim: u32, dtype: Dtype) -> Model {
        Model {
            n_layers,
            q_heads,
            kv_heads,
            head_dim,
            dtype,
            block_size: 16,
            model_id: 0,
        }
    }

    pub(crate) fn to_sys(self) -> sys::pat_model_t {
        sys::pat_model_t {
            n_layers: self.n_layers,
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            dtype: self.dtype.code(),
            block_size: self.block_size,
            model_id: self.model_id,
        }
    }

    /// `None` for a dtype this binding does not know.
    pub(crate) fn from_sys(m: &sys::pat_model_t) -> Option<Model> {
        Some(Model {
            n_layers: m.n_layers,
            q_heads: m.q_heads,
            kv_heads: m.kv_heads,
            head_dim: m.head_dim,
            dtype: Dtype::from_code(m.dtype)?,
            block_size: m.block_size,
            model_id: m.model_id,
        })
    }
}

/// Where the staging buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// what the daemon's backend uses
    Auto,
    /// POSIX shared memory: a daemon on the cpu backend
    Host,
    /// device memory: a daemon on the cuda backend
    Gpu,
}

/// How the daemon packs the session's queries into CTAs (`PAT_PACK_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackPolicy {
    /// the daemon's daemon.pack_policy
    Default,
    Auto,
    Bytes,
    Paper,
    Query,
    Tree,
}

impl PackPolicy {
    fn code(self) -> u32 {
        match self {
            PackPolicy::Default => sys::PAT_PACK_DEFAULT,
            PackPolicy::Auto => sys::PAT_PACK_AUTO,
            PackPolicy::Bytes => sys::PAT_PACK_BYTES,
            PackPolicy::Paper => sys::PAT_PACK_PAPER,
            PackPolicy::Query => sys::PAT_PACK_QUERY,
            PackPolicy::Tree => sys::PAT_PACK_TREE,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<PackPolicy> {
        use PackPolicy::*;
        [Default, Auto, Bytes, Paper, Query, Tree]
            .into_iter()
            .find(|p| p.code() == code)
    }
}

/// What [`Session::connect`] asks for (`pat_connect_opts_t`).
#[derive(Clone, Debug)]
pub struct Options {
    pub model: Model,
    /// staging rows: the most new tokens in one step
    pub max_batch_tokens: u32,
    /// open sequences wanted; 0: the daemon's per-connection quota
    pub max_seqs: u32,
    /// per request and per layer wait, ms; 0: 30000
    pub timeout_ms: u32,
    /// ms; 0: the daemon's default
    pub lease_ms: u32,
    pub buffer: BufferKind,
    /// the control socket; `None`: [`crate::default_socket`]
    pub socket: Option<PathBuf>,
    /// shown by `patctl seqs`
    pub label: Option<String>,
    pub pack_policy: PackPolicy,
    /// the KV pool this client needs (a daemon whose pool holds another refuses with
    /// EMEDIUMTYPE); `None`: whatever the daemon's holds ([`BufferInfo::kv_dtype`] says)
    pub kv_dtype: Option<Dtype>,
}

impl Options {
    /// Defaults for everything but the model and the staging rows; label "rust".
    pub fn new(model: Model, max_batch_tokens: u32) -> Options {
        Options {
            model,
            max_batch_tokens,
            max_seqs: 0,
            timeout_ms: 0,
            lease_ms: 0,
            buffer: BufferKind::Auto,
            socket: None,
            label: Some("rust".to_string()),
            pack_policy: PackPolicy::Default,
            kv_dtype: None,
        }
    }
}

/// What the daemon granted the session (`pat_buffers`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BufferInfo {
    /// one token's Q (and O), bytes
    pub q_row_bytes: u64,
    /// one token's K (and V), bytes
    pub kv_row_bytes: u64,
    pub max_batch_tokens: u32,
    pub max_seqs: u32,
    /// the daemon's block quota for this session
    pub max_blocks: u32,
    pub lease_ms: u32,
    /// the staging buffers are device memory
    pub on_gpu: bool,
    /// GPU sessions: the daemon's contexts are MPS clients
    pub mps: bool,
    /// the daemon's KV pool (the model's dtype where an older daemon says 0)
    pub kv_dtype: Dtype,
    /// fp8 KV: stored = value / kv_scale (1 otherwise)
    pub kv_scale: f32,
}

/// A session's counters (`pat_stats`), summed over its committed steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    pub steps: u64,
    pub tokens: u64,
    /// K+V bytes the daemon's plans read, over steps and layers
    pub kv_bytes: u64,
    /// ... and what query-centric attention would have read
    pub qc_bytes: u64,
    /// prompt tokens given to seq_open
    pub prompt_tokens: u64,
    /// ... of which the prefix cache already held
    pub cached_tokens: u64,
}

/// Sequence ids whose `Seq` was dropped, shared by a session and its sequences; its address
/// also tells which session a `Seq` belongs to.
type Dropped = Arc<Mutex<Vec<u32>>>;

/// One open sequence of a [`Session`]. Dropping it closes the sequence at the session's next
/// call; [`Session::seq_close`] closes it now and reports the daemon's answer.
#[must_use = "a dropped Seq is closed (at its session's next call)"]
#[derive(Debug)]
pub struct Seq {
    id: u32,
    owner: Dropped,
    live: bool,
}

impl Seq {
    /// patd's sequence id (what `patctl seqs` lists)
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The id, leaving the sequence open and no longer owned (the session still closes it
    /// when it ends).
    pub fn into_raw(mut self) -> u32 {
        self.live = false;
        self.id
    }

    fn disown(&mut self) {
        self.live = false;
    }
}

impl Drop for Seq {
    fn drop(&mut self) {
        if self.live {
            self.owner
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.id);
        }
    }
}

/// A session with patd: `Send` (it may move to another thread) but not `Sync` (one thread at a
/// time), as pat.h allows. Sharing one between threads does not compile:
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<pat::Session>();
/// ```
///
/// (rustdoc 1.63 checks only that it fails to compile, not the error code; the same lines with
/// a `Sync` type do compile, so the failure is the session's:)
///
/// ```
/// fn shared<T: Sync>() {}
/// shared::<pat::Seq>();
/// ```
pub struct Session {
    c: NonNull<sys::pat_conn_t>,
    model: Model,
    bufs: sys::pat_buffers_t,
    dropped: Dropped,
    /// a pat_step_end failed: libpat may hold the step open (its EBUSY to the next begin)
    step_left_open: bool,
}

// pat.h: "a connection is used by one thread at a time (calls are not reentrant per
// connection); different connections are independent". Nothing in it is tied to the thread
// that connected, so it may move; shared references are not handed to other threads (no Sync).
unsafe impl Send for Session {}

impl Session {
    /// Connects and maps the staging buffers (`pat_connect`). On a refusal the error's detail
    /// is the daemon's, naming the option and the numbers; with no daemon at the socket,
    /// ENOENT or ECONNREFUSED at once.
    pub fn connect(o: &Options) -> Result<Session> {
        check_library()?;
        let socket = path_cstring(o.socket.as_deref())?;
        let label = match &o.label {
            None => None,
            Some(l) => Some(
                CString::new(l.as_bytes())
                    .map_err(|_| Error::Invalid(format!("label {:?} holds a NUL byte", l)))?,
            ),
        };
        let buffer = match o.buffer {
            BufferKind::Auto => sys::PAT_BUFFER_AUTO,
            BufferKind::Host => sys::PAT_BUFFER_HOST,
            BufferKind::Gpu => sys::PAT_BUFFER_GPU,
        };
        let opts = sys::pat_connect_opts_t {
            size: std::mem::size_of::<sys::pat_connect_opts_t>() as u32,
            max_batch_tokens: o.max_batch_tokens,
            max_seqs: o.max_seqs,
            timeout_ms: o.timeout_ms,
            lease_ms: o.lease_ms,
            buffer,
            socket: socket.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            label: label.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            model: o.model.to_sys(),
            pack_policy: o.pack_policy.code(),
            kv_dtype: o.kv_dtype.map_or(0, Dtype::code),
            reserved: [0; 7],
        };
        let mut c: *mut sys::pat_conn_t = std::ptr::null_mut();
        let mut why = [0 as c_char; 512];
        let rc = unsafe { sys::pat_connect(&opts, &mut c, why.as_mut_ptr(), why.len()) };
        if rc < 0 {
            return Err(Error::from_rc(rc, cstr_lossy(why.as_ptr())));
        }
        let c = NonNull::new(c).expect("pat_connect returned 0 and a handle");
        let mut s = Session {
            c,
            model: o.model,
            // integers and pointers: all zeroes is a valid value
            bufs: unsafe { std::mem::zeroed() },
            dropped: Arc::new(Mutex::new(Vec::new())),
            step_left_open: false,
        };
        let rc = unsafe { sys::pat_buffers(s.c.as_ptr(), &mut s.bufs) };
        if rc < 0 {
            return Err(s.err(rc)); // s's drop closes the connection
        }
        Ok(s)
    }

    /// The error for libpat's `rc`, with the connection's last detail.
    pub(crate) fn err(&self, rc: i32) -> Error {
        Error::from_rc(rc, self.last_error())
    }

    pub(crate) fn check(&self, rc: i32) -> Result<u32> {
        if rc < 0 {
            Err(self.err(rc))
        } else {
            Ok(rc as u32)
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::pat_conn_t {
        self.c.as_ptr()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// What the daemon granted.
    pub fn buffers(&self) -> BufferInfo {
        let b = &self.bufs;
        BufferInfo {
            q_row_bytes: b.q_row_bytes,
            kv_row_bytes: b.kv_row_bytes,
            max_batch_tokens: b.max_batch_tokens,
            max_seqs: b.max_seqs,
            max_blocks: b.max_blocks,
            lease_ms: b.lease_ms,
            on_gpu: b.on_gpu != 0,
            mps: b.mps != 0,
            kv_dtype: Dtype::from_code(b.kv_dtype).unwrap_or(self.model.dtype),
            kv_scale: if b.kv_scale > 0.0 { b.kv_scale } else { 1.0 },
        }
    }

    /// libpat's `pat_buffers_t`, staging pointers included: a GPU session's device memory for
    /// the frontend's kernels (host sessions: [`Step::qkv`] and [`Step::o`]).
    pub fn raw_buffers(&self) -> sys::pat_buffers_t {
        self.bufs
    }

    /// The raw connection, for pat-sys calls this crate does not wrap. It stays owned by the
    /// session: do not `pat_close` it.
    pub fn as_raw(&self) -> *mut sys::pat_conn_t {
        self.c.as_ptr()
    }

    /// The daemon's detail for this session's last failure.
    pub fn last_error(&self) -> String {
        cstr_lossy(unsafe { sys::pat_last_error(self.c.as_ptr()) })
    }

    /// The daemon instance this session talks to (random per daemon start) and when it started
    /// (unix seconds).
    pub fn instance(&self) -> (u64, u64) {
        let mut start = 0u64;
        let id = unsafe { sys::pat_instance(self.c.as_ptr(), &mut start) };
        (id, start)
    }

    /// GPU sessions: the epoch a captured graph's hand-offs carry (0 for host sessions).
    pub fn gpu_epoch(&self) -> u64 {
        unsafe { sys::pat_gpu_epoch(self.c.as_ptr()) }
    }

    pub fn stats(&self) -> Result<Stats> {
        let mut st: sys::pat_conn_stats_t = unsafe { std::mem::zeroed() };
        self.check(unsafe { sys::pat_stats(self.c.as_ptr(), &mut st) })?;
        Ok(Stats {
            steps: st.steps,
            tokens: st.tokens,
            kv_bytes: st.kv_bytes,
            qc_bytes: st.qc_bytes,
            prompt_tokens: st.prompt_tokens,
            cached_tokens: st.cached_tokens,
        })
    }

    pub fn ping(&mut self) -> Result<()> {
        self.reap();
        self.check(unsafe { sys::pat_ping(self.c.as_ptr()) })
            .map(drop)
    }

    /// Closes the sequences whose `Seq` was dropped since the last call. Their errors are not
    /// reported (a sequence the daemon dropped already; a lost daemon, which the caller's own
    /// call reports next).
    fn reap(&mut self) {
        let ids = std::mem::take(&mut *self.dropped.lock().unwrap_or_else(|e| e.into_inner()));
        for id in ids {
            unsafe { sys::pat_seq_close(self.c.as_ptr(), id) };
        }
    }

    /// A step's `pat_step_end` returned `rc`. After a failure libpat may keep the step open
    /// (no answer came: a timeout, a broken pipe) or not (the daemon's refusal): either way the
    /// next [`Session::step`] aborts it first, which costs nothing where it is not open (ESRCH,
    /// from libpat itself).
    pub(crate) fn step_ended(&mut self, rc: i32) {
        self.step_left_open = rc < 0 && rc != -(sys::ESRCH as i32);
    }

    /// Whether a step's end failed and the step may still be open (the next [`Session::step`]
    /// aborts it first).
    pub fn step_left_open(&self) -> bool {
        self.step_left_open
    }

    /// Aborts a step whose end failed ([`Session::step_left_open`]); [`Session::step`] does it
    /// first. Ok where none is open, or once the daemon answered the abort: its executor is done
    /// with the staging buffers. Errors as `pat_step_end`'s (ETIMEDOUT, EPIPE: still open, try
    /// again; ECONNRESET, ESTALE: the daemon is gone).
    pub fn abort_open_step(&mut self) -> Result<()> {
        if !self.step_left_open {
            return Ok(());
        }
        let rc = unsafe { sys::pat_step_end(self.c.as_ptr(), 1, std::ptr::null_mut()) };
        if rc < 0 && rc != -(sys::ESRCH as i32) {
            return Err(self.err(rc));
        }
        self.step_left_open = false;
        Ok(())
    }

    fn seq(&self, id: u32) -> Seq {
        Seq {
            id,
            owner: Arc::clone(&self.dropped),
            live: true,
        }
    }

    /// `Err(Invalid)` unless `seq` was opened by this session.
    pub(crate) fn owns(&self, seq: &Seq) -> Result<()> {
        if Arc::ptr_eq(&seq.owner, &self.dropped) {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "sequence {} belongs to another session",
                seq.id
            )))
        }
    }

    /// Opens a sequence with its prompt; returns it and how many prompt tokens the prefix cache
    /// already holds (whole blocks, at least one token left to compute).
    pub fn seq_open(&mut self, prompt: &[u32]) -> Result<(Seq, u32)> {
        self.reap();
        let n = len_u32(prompt.len(), "prompt")?;
        let (mut id, mut cached) = (0u32, 0u32);
        self.check(unsafe {
            sys::pat_seq_open(self.c.as_ptr(), prompt.as_ptr(), n, &mut id, &mut cached)
        })?;
        Ok((self.seq(id), cached))
    }

    /// As [`Session::seq_open`], and how many prompt tokens past the cached ones other open
    /// sequences of this user are about to write (twins: patd does not wait for them; a caller
    /// that does prefills that many less).
    pub fn seq_open_pending(&mut self, prompt: &[u32]) -> Result<(Seq, u32, u32)> {
        self.reap();
        let n = len_u32(prompt.len(), "prompt")?;
        let (mut id, mut cached, mut pending) = (0u32, 0u32, 0u32);
        self.check(unsafe {
            sys::pat_seq_open_pending(
                self.c.as_ptr(),
                prompt.as_ptr(),
                n,
                &mut id,
                &mut cached,
                &mut pending,
            )
        })?;
        Ok((self.seq(id), cached, pending))
    }

    /// A new sequence sharing `seq`'s committed KV.
    pub fn seq_fork(&mut self, seq: &Seq) -> Result<Seq> {
        self.owns(seq)?;
        self.reap();
        let mut child = 0u32;
        self.check(unsafe { sys::pat_seq_fork(self.c.as_ptr(), seq.id, &mut child) })?;
        Ok(self.seq(child))
    }

    /// Rolls `seq` back to its first `new_len` tokens (ERANGE past its length).
    pub fn seq_truncate(&mut self, seq: &Seq, new_len: u32) -> Result<()> {
        self.owns(seq)?;
        self.reap();
        self.check(unsafe { sys::pat_seq_truncate(self.c.as_ptr(), seq.id, new_len) })
            .map(drop)
    }

    /// Closes `seq`. It is gone whatever the answer (an error is the daemon's word on it, e.g.
    /// ENOENT for an id it does not know). A `Seq` of another session is refused (Invalid) and
    /// dropped: its own session closes it.
    pub fn seq_close(&mut self, mut seq: Seq) -> Result<()> {
        self.owns(&seq)?;
        seq.disown();
        self.reap();
        self.check(unsafe { sys::pat_seq_close(self.c.as_ptr(), seq.id) })
            .map(drop)
    }

    /// Takes ownership of a sequence id of this session known otherwise (pat-sys calls,
    /// [`Seq::into_raw`]); the daemon answers ENOENT for one it does not know. No other `Seq`
    /// may own the id: two would close it twice (the second time, maybe a new sequence that
    /// reused the id).
    pub fn seq_adopt(&mut self, id: u32) -> Seq {
        self.seq(id)
    }

    /// Begins a step: `seqs[i]` brings `n_new[i]` new tokens, whose ids are `tokens` in order
    /// (the staging rows of the step, in the same order). Returns the step's guard, which holds
    /// the session until it is finished or dropped (aborted). The daemon's answer to the step
    /// (ENOSPC, ENOENT for an unknown sequence, ...) comes from the first [`Step::attend`].
    /// A previous step left open is aborted first ([`Session::abort_open_step`]: its error is
    /// returned where that fails). No sequences: Invalid.
    pub fn step(&mut self, seqs: &[&Seq], n_new: &[u32], tokens: &[u32]) -> Result<Step<'_>> {
        if seqs.is_empty() {
            return Err(Error::Invalid("a step of no sequences".into()));
        }
        if seqs.len() != n_new.len() {
            return Err(Error::Invalid(format!(
                "{} sequences, {} counts of new tokens",
                seqs.len(),
                n_new.len()
            )));
        }
        let total: u64 = n_new.iter().map(|&n| n as u64).sum();
        if total != tokens.len() as u64 {
            return Err(Error::Invalid(format!(
                "the counts of new tokens add up to {}, {} token ids given",
                total,
                tokens.len()
            )));
        }
        let mut ids = Vec::with_capacity(seqs.len());
        for s in seqs {
            self.owns(s)?;
            ids.push(s.id);
        }
        let n = len_u32(ids.len(), "sequences")?;
        self.abort_open_step()?;
        self.reap();
        self.check(unsafe {
            sys::pat_step_begin(
                self.c.as_ptr(),
                ids.as_ptr(),
                n_new.as_ptr(),
                n,
                tokens.as_ptr(),
            )
        })?;
        Ok(Step::new(self, tokens.len()))
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model)
            .field("buffers", &self.buffers())
            .field("step_left_open", &self.step_left_open)
            .finish_non_exhaustive()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        unsafe { sys::pat_close(self.c.as_ptr()) };
    }
}

fn len_u32(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Invalid(format!("{} {} long", what, n)))
}
