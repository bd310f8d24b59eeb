//! A step in flight: the guard [`Session::step`] returns. It borrows the session mutably, so
//! nothing else talks to the daemon while it is open, and the staging slices it hands out live
//! no longer than the borrow of the guard they came from: none is alive across
//! [`Step::attend`]. The daemon reads Q, K, V and writes O while an attend waits, and after a
//! failed one (ETIMEDOUT: libpat gave up, the daemon did not) until the step ends: so a failed
//! attend ends the step at once with `pat_step_end(abort = 1)`, whose answer comes only once
//! the daemon's executor stopped, and the guard refuses every later call (Invalid). Where even
//! that abort got no answer the step stays open: the session remembers it and its next
//! [`Session::step`] tries the abort again first ([`Session::abort_open_step`]).
//! Dropping the guard without [`Step::finish`] ends the step with `pat_step_end(abort = 1)`:
//! its KV is dropped.
use std::os::raw::c_void;

use crate::elem::Element;
use crate::error::{Error, Result};
use crate::session::{PackPolicy, Session};
use crate::sys;

/// What the daemon reports for an ended step (`pat_step_info_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepInfo {
    pub step: u64,
    pub n_tokens: u32,
    /// the daemon reused the previous step's pack (forest shape unchanged)
    pub pack_reused: bool,
    /// K+V bytes the plan reads per layer
    pub kv_bytes: u64,
    /// ... and what query-centric attention would read
    pub qc_bytes: u64,
    pub layers_done: u32,
    /// the tokens are now part of their sequences
    pub committed: bool,
    /// daemon: STEP_BEGIN received to last layer done, ns
    pub step_ns: u64,
    /// the policy that built the step's pack (`None` from an older daemon)
    pub pack_policy: Option<PackPolicy>,
}

#[must_use = "a dropped Step is aborted: finish() commits it"]
pub struct Step<'s> {
    s: &'s mut Session,
    rows: usize,
    next_layer: u32,
    state: State,
}

enum State {
    /// begun: drop aborts it
    Open,
    /// pat_step_end was called (a failure is the session's to retry): nothing left for drop
    Ended,
    /// an attend failed and the step was aborted: what every later call returns
    Failed(Error),
}

enum Buf {
    Q,
    K,
    V,
    O,
}

impl<'s> Step<'s> {
    pub(crate) fn new(s: &'s mut Session, rows: usize) -> Step<'s> {
        Step {
            s,
            rows,
            next_layer: 0,
            state: State::Open,
        }
    }

    /// Ok while the step is open; the refusal once a failed attend aborted it.
    fn usable(&self) -> Result<()> {
        match &self.state {
            State::Open => Ok(()),
            State::Failed(e) => Err(e.clone()),
            State::Ended => Err(Error::Invalid("the step has ended".into())),
        }
    }

    /// An attend of `layer` returned `rc`: ends the step now (the daemon may still be reading Q,
    /// K, V and writing O) and refuses the guard's later calls. Returns the attend's error.
    fn attend_failed(&mut self, layer: u32, rc: i32) -> Error {
        let e = self.s.err(rc); // before the abort replaces the connection's detail
        let end = unsafe { sys::pat_step_end(self.s.raw(), 1, std::ptr::null_mut()) };
        self.s.step_ended(end);
        self.state = State::Failed(Error::Invalid(format!(
            "the step was aborted after attend({}) failed ({})",
            layer, e
        )));
        e
    }

    /// The step's staging rows: its new tokens, in the order given to [`Session::step`].
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The layer the next [`Step::attend`] hands over.
    pub fn next_layer(&self) -> u32 {
        self.next_layer
    }

    /// Where buffer `b`'s rows of this step are, and how many elements of type T they hold:
    /// [rows][heads][head_dim]. Host sessions only, and T must be what the model's dtype is.
    fn span<T: Element>(&self, b: Buf) -> Result<(*mut T, usize)> {
        self.usable()?;
        let m = self.s.model();
        let raw = self.s.raw_buffers();
        if raw.on_gpu != 0 {
            return Err(Error::Invalid(
                "a GPU session's staging buffers are device memory (raw_buffers, attend_async)"
                    .into(),
            ));
        }
        if !T::holds(m.dtype) || std::mem::size_of::<T>() != m.dtype.size() {
            return Err(Error::Invalid(format!(
                "a {:?} model's staging buffers do not hold {}",
                m.dtype,
                std::any::type_name::<T>()
            )));
        }
        let (p, heads) = match b {
            Buf::Q => (raw.q, m.q_heads),
            Buf::K => (raw.k, m.kv_heads),
            Buf::V => (raw.v, m.kv_heads),
            Buf::O => (raw.o, m.q_heads),
        };
        let p = p as *mut T;
        assert!(!p.is_null() && p as usize % std::mem::align_of::<T>() == 0);
        Ok((p, self.rows * heads as usize * m.head_dim as usize))
    }

    /// Q, K and V of this step's rows, to write before each [`Step::attend`].
    pub fn qkv<T: Element>(&mut self) -> Result<(&mut [T], &mut [T], &mut [T])> {
        let (q, nq) = self.span::<T>(Buf::Q)?;
        let (k, nk) = self.span::<T>(Buf::K)?;
        let (v, nv) = self.span::<T>(Buf::V)?;
        // three disjoint mappings of the session (each buffer its own), within their
        // max_batch_tokens rows (pat_step_begin refused more), borrowed from &mut self
        unsafe {
            Ok((
                std::slice::from_raw_parts_mut(q, nq),
                std::slice::from_raw_parts_mut(k, nk),
                std::slice::from_raw_parts_mut(v, nv),
            ))
        }
    }

    /// O of this step's rows: the last attended layer's output.
    pub fn o<T: Element>(&self) -> Result<&[T]> {
        let (o, n) = self.span::<T>(Buf::O)?;
        Ok(unsafe { std::slice::from_raw_parts(o, n) })
    }

    /// O, writable (to poison it before a layer, say).
    pub fn o_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        let (o, n) = self.span::<T>(Buf::O)?;
        Ok(unsafe { std::slice::from_raw_parts_mut(o, n) })
    }

    /// Hands over `layer` (Q, K, V written) and waits for its O. Layers go 0, 1, ... in order.
    /// Errors: the daemon's answer to the step (ENOSPC, EDQUOT, ENOENT, ...), ETIMEDOUT,
    /// ECANCELED if the daemon aborted the step, ESHUTDOWN, ECONNRESET, EINVAL for a layer out
    /// of order. Any error ends the step (aborted): later calls of the guard return Invalid.
    pub fn attend(&mut self, layer: u32) -> Result<()> {
        self.usable()?;
        let rc = unsafe { sys::pat_attend(self.s.raw(), layer) };
        if rc < 0 {
            return Err(self.attend_failed(layer, rc));
        }
        self.next_layer = layer + 1;
        Ok(())
    }

    /// GPU sessions: enqueues the hand-off of `layer` on `stream` and returns at once (pat.h's
    /// `pat_attend_async`). An error ends the step, as [`Step::attend`]'s does.
    ///
    /// # Safety
    /// `stream` must be a CUDA stream of the daemon's GPU that outlives the work, or null (the
    /// legacy default stream).
    pub unsafe fn attend_async(&mut self, layer: u32, stream: *mut c_void) -> Result<()> {
        self.usable()?;
        let rc = sys::pat_attend_async(self.s.raw(), layer, stream);
        if rc < 0 {
            return Err(self.attend_failed(layer, rc));
        }
        self.next_layer = layer + 1;
        Ok(())
    }

    /// GPU sessions: a captured graph with every layer's hand-off was replayed on `stream`.
    ///
    /// # Safety
    /// As [`Step::attend_async`].
    pub unsafe fn replayed(&mut self, stream: *mut c_void) -> Result<()> {
        self.usable()?;
        self.s
            .check(sys::pat_step_replayed(self.s.raw(), stream))
            .map(drop)
    }

    fn end(mut self, abort: bool) -> Result<StepInfo> {
        self.usable()?;
        let mut info: sys::pat_step_info_t = unsafe { std::mem::zeroed() };
        let rc = unsafe { sys::pat_step_end(self.s.raw(), abort as i32, &mut info) };
        self.state = State::Ended;
        let r = self.s.check(rc);
        self.s.step_ended(rc);
        r?;
        Ok(StepInfo {
            step: info.step,
            n_tokens: info.n_tokens,
            pack_reused: info.pack_reused != 0,
            kv_bytes: info.kv_bytes,
            qc_bytes: info.qc_bytes,
            layers_done: info.layers_done,
            committed: info.committed != 0,
            step_ns: info.step_ns,
            pack_policy: PackPolicy::from_code(info.pack_policy)
                .filter(|&p| p != PackPolicy::Default),
        })
    }

    /// Ends the step: commits its KV when every layer ran (a step whose layers did not all run
    /// is dropped and reported as ECANCELED). Where no answer came (ETIMEDOUT, EPIPE) the step
    /// may still be open: the session's next [`Session::step`] aborts it first.
    pub fn finish(self) -> Result<StepInfo> {
        self.end(false)
    }

    /// Ends the step, dropping its KV. After a failed attend the step is aborted already:
    /// Invalid, as every call.
    pub fn abort(self) -> Result<StepInfo> {
        self.end(true)
    }
}

impl std::fmt::Debug for Step<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("rows", &self.rows)
            .field("next_layer", &self.next_layer)
            .field("aborted", &matches!(self.state, State::Failed(_)))
            .finish_non_exhaustive()
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        if let State::Open = self.state {
            let rc = unsafe { sys::pat_step_end(self.s.raw(), 1, std::ptr::null_mut()) };
            self.s.step_ended(rc);
        }
    }
}
