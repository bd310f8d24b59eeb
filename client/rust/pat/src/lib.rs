//! Safe Rust client of patd, over libpat (the `pat-sys` crate).
//!
//! A frontend connects a [`Session`] with its model signature, opens [`Seq`]uences with their
//! prompts (learning how much the prefix cache already holds), and runs steps: [`Session::step`]
//! names the sequences and their new tokens and returns a [`Step`] guard; per layer the frontend
//! writes Q, K and V of the new tokens into the staging buffers ([`Step::qkv`]), calls
//! [`Step::attend`], and reads O ([`Step::o`]). [`Step::finish`] commits the step's KV; a guard
//! dropped unfinished (an early return, a panic) aborts the step, and so does a failed attend
//! (the guard refuses every later call).
//!
//! ```no_run
//! use pat::{Dtype, Model, Options, Session};
//! let mut s = Session::connect(&Options::new(Model::new(4, 8, 2, 64, Dtype::F16), 256))?;
//! let prompt: Vec<u32> = (1000..1040).collect();
//! let (seq, cached) = s.seq_open(&prompt)?;
//! let new = &prompt[cached as usize..];
//! let mut step = s.step(&[&seq], &[new.len() as u32], new)?;
//! for layer in 0..4 {
//!     let (q, k, v) = step.qkv::<u16>()?; // f16 words: pat::f32_to_f16
//!     q.fill(0); k.fill(0); v.fill(0);
//!     step.attend(layer)?;
//!     let _o: &[u16] = step.o()?;
//! }
//! step.finish()?;
//! s.seq_close(seq)?;
//! # Ok::<(), pat::Error>(())
//! ```
//!
//! Threads: a [`Session`] is `Send` but not `Sync` (pat.h: a connection is used by one thread at
//! a time; different connections are independent). A [`Seq`] is `Send` and `Sync`: it owns one
//! open sequence of its session (dropped, it is closed by that session's next call; another
//! session refuses it).
//! Errors: [`Error::Pat`] carries libpat's errno (positive, as `sys::ENOENT`) and its detail.
//! Host sessions only for the staging slices; a GPU session (a daemon on the cuda backend) gets
//! the raw device pointers ([`Session::raw_buffers`]) and [`Step::attend_async`].

/// client/rust/README.md's examples, compiled by `cargo test` (a README a test does not tie
/// drifts from the API).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

mod elem;
mod error;
mod session;
mod step;

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use pat_sys as sys;

pub use elem::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, Element};
pub use error::{Error, Result};
pub use session::{BufferInfo, BufferKind, Dtype, Model, Options, PackPolicy, Seq, Session, Stats};
pub use step::{Step, StepInfo};

/// A libpat release, as `PAT_VERSION` encodes it (major << 16 | minor << 8 | patch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn from_code(v: u32) -> Version {
        Version {
            major: v >> 16,
            minor: (v >> 8) & 0xff,
            patch: v & 0xff,
        }
    }

    pub const fn code(self) -> u32 {
        self.major << 16 | self.minor << 8 | self.patch
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The pat.h this binding was generated from (pat-sys's `PAT_VERSION`).
pub const BINDING_VERSION: Version = Version::from_code(sys::PAT_VERSION);

/// The libpat actually loaded (`pat_version()`).
pub fn library_version() -> Version {
    Version::from_code(unsafe { sys::pat_version() })
}

/// The loaded libpat's version if it can serve this binding (the same major, a minor at least
/// the binding's), else [`Error::Version`]. [`Session::connect`] checks it first.
pub fn check_library() -> Result<Version> {
    let lib = library_version();
    if lib.major != BINDING_VERSION.major || lib.minor < BINDING_VERSION.minor {
        return Err(Error::Version {
            library: lib,
            binding: BINDING_VERSION,
        });
    }
    Ok(lib)
}

/// libpat's name for an errno (either sign), or for one of patd's codes.
pub fn strerror(errno: i32) -> String {
    cstr_lossy(unsafe { sys::pat_strerror(errno) })
}

/// The control socket a session uses when [`Options::socket`] is `None`: `$PATD_SOCKET`, else
/// the per-user or system default (pat.h names them).
pub fn default_socket() -> PathBuf {
    PathBuf::from(cstr_lossy(unsafe { sys::pat_default_socket() }))
}

/// An operator request to the daemon (no session): `patctl`'s verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminOp {
    /// "key value" lines for people (programs: [`status`])
    Status,
    /// Prometheus text format
    Stats,
    /// one line per open sequence
    Seqs,
    /// refuse new work, finish the steps in flight, exit
    Drain,
    /// re-read the config file
    Reload,
    /// the KV pool's invariant check: "pool_check ok ..."
    Check,
    /// start the daemon's binary as its successor
    Upgrade,
}

impl AdminOp {
    fn code(self) -> sys::pat_admin_op_t {
        match self {
            AdminOp::Status => sys::PAT_ADMIN_STATUS,
            AdminOp::Stats => sys::PAT_ADMIN_STATS,
            AdminOp::Seqs => sys::PAT_ADMIN_SEQS,
            AdminOp::Drain => sys::PAT_ADMIN_DRAIN,
            AdminOp::Reload => sys::PAT_ADMIN_RELOAD,
            AdminOp::Check => sys::PAT_ADMIN_CHECK,
            AdminOp::Upgrade => sys::PAT_ADMIN_UPGRADE,
        }
    }
}

/// Sends `op` to the daemon at `socket` (`None`: [`default_socket`]) and returns its answer.
/// On a failure the error's detail is the daemon's text, or the socket no daemon answers at.
pub fn admin(socket: Option<&Path>, op: AdminOp, timeout_ms: u32) -> Result<String> {
    let sock = path_cstring(socket)?;
    let mut text: *mut c_char = std::ptr::null_mut();
    let rc = unsafe {
        sys::pat_admin(
            sock.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            op.code(),
            timeout_ms,
            &mut text,
        )
    };
    let body = if text.is_null() {
        String::new()
    } else {
        cstr_lossy(text)
    };
    unsafe { sys::pat_free(text.cast()) };
    if rc < 0 {
        return Err(Error::from_rc(rc, body));
    }
    Ok(body)
}

/// What a daemon reports about itself ([`status`]); fields a daemon does not report read 0.
#[derive(Clone, Debug)]
pub struct Status {
    /// the daemon's wire protocol version
    pub protocol: u32,
    /// the daemon's release
    pub version: Version,
    pub pid: u32,
    /// random per daemon start
    pub instance: u64,
    pub uptime_ms: u64,
    pub draining: bool,
    pub max_seq_len: u32,
    /// "cpu" or "cuda"
    pub backend: String,
    /// the daemon's model signature; `None` for a dtype this binding does not know
    pub model: Option<Model>,
    /// the KV pool now, in blocks
    pub blocks_total: u32,
    pub blocks_free: u32,
    pub blocks_used: u32,
    pub blocks_cached: u32,
    pub sequences: u32,
    pub connections: u32,
    pub steps_in_flight: u32,
    /// the softmax scale the daemon applies
    pub scale: f32,
    /// its logit soft cap (0: off)
    pub softcap: f32,
    /// the KV pool's element type (the model's dtype where an older daemon says 0)
    pub kv_dtype: Option<Dtype>,
    /// fp8 KV: stored = value / kv_scale
    pub kv_scale: f32,
    /// everything pat_status() returned, the limits included
    pub raw: sys::pat_status_t,
}

/// The daemon's figures, typed (`pat_status`; no session).
pub fn status(socket: Option<&Path>, timeout_ms: u32) -> Result<Status> {
    let sock = path_cstring(socket)?;
    // a C struct of integers, floats and a char array: all zeroes is a valid value
    let mut st: sys::pat_status_t = unsafe { std::mem::zeroed() };
    st.size = std::mem::size_of::<sys::pat_status_t>() as u32;
    let rc = unsafe {
        sys::pat_status(
            sock.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            timeout_ms,
            &mut st,
        )
    };
    if rc < 0 {
        return Err(Error::from_rc(rc, String::new()));
    }
    let backend: Vec<u8> = st
        .backend
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let model = Model::from_sys(&st.model);
    Ok(Status {
        protocol: st.protocol,
        version: Version::from_code(st.version),
        pid: st.pid,
        instance: st.instance,
        uptime_ms: st.uptime_ms,
        draining: st.draining != 0,
        max_seq_len: st.max_seq_len,
        backend: String::from_utf8_lossy(&backend).into_owned(),
        model,
        blocks_total: st.blocks_total,
        blocks_free: st.blocks_free,
        blocks_used: st.blocks_used,
        blocks_cached: st.blocks_cached,
        sequences: st.sequences,
        connections: st.connections,
        steps_in_flight: st.steps_in_flight,
        scale: st.scale,
        softcap: st.softcap,
        kv_dtype: if st.kv_dtype == 0 {
            model.map(|m| m.dtype)
        } else {
            Dtype::from_code(st.kv_dtype)
        },
        kv_scale: if st.kv_scale > 0.0 { st.kv_scale } else { 1.0 },
        raw: st,
    })
}

/// A C string libpat owns, copied (NULL reads as empty).
pub(crate) fn cstr_lossy(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A socket path for libpat (None stays None: libpat's default).
pub(crate) fn path_cstring(p: Option<&Path>) -> Result<Option<CString>> {
    match p {
        None => Ok(None),
        Some(p) => CString::new(p.as_os_str().as_bytes())
            .map(Some)
            .map_err(|_| Error::Invalid(format!("socket path {:?} holds a NUL byte", p))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_pat_h_and_the_library() {
        assert_eq!(env!("CARGO_PKG_VERSION"), BINDING_VERSION.to_string());
        assert_eq!(BINDING_VERSION.code(), sys::PAT_VERSION);
        assert_eq!(
            (
                BINDING_VERSION.major,
                BINDING_VERSION.minor,
                BINDING_VERSION.patch
            ),
            (
                sys::PAT_VERSION_MAJOR,
                sys::PAT_VERSION_MINOR,
                sys::PAT_VERSION_PATCH
            )
        );
        // built against this tree's libpat: exactly pat.h's release, and usable
        assert_eq!(library_version(), BINDING_VERSION);
        assert_eq!(check_library().unwrap(), BINDING_VERSION);
    }

    #[test]
    fn strerror_names_errnos() {
        assert_eq!(strerror(0), "success");
        assert_eq!(
            strerror(-(sys::ENOENT as i32)),
            strerror(sys::ENOENT as i32)
        );
        assert!(!strerror(-(sys::ENOSPC as i32)).is_empty());
    }

    #[test]
    fn nul_in_socket_path_is_invalid() {
        let e = status(Some(Path::new("/tmp/a\0b")), 100).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{:?}", e);
        assert_eq!(e.errno(), Some(sys::EINVAL as i32));
    }
}
