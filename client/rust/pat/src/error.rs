//! The binding's error: libpat's negative errno turned into a value that carries the errno, its
//! name and the daemon's detail, beside the two failures the binding finds itself.
use std::fmt;
use std::os::raw::c_int;

use crate::{strerror, sys, Version};

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A libpat call returned `-errno`. `errno` is positive (compare with `sys::ENOENT as i32`
    /// and the other `sys::E*`); `name` is libpat's text for it (`pat_strerror`: patd's meaning
    /// where it has one); `detail` is what the daemon or libpat said about this failure
    /// (`pat_last_error`, `pat_connect`'s `why`, `pat_admin`'s text), possibly empty.
    Pat {
        errno: i32,
        name: String,
        detail: String,
    },
    /// The loaded libpat cannot serve this binding: another major, or an older minor.
    Version { library: Version, binding: Version },
    /// An argument refused before it reached libpat (libpat's `-EINVAL` case): a sequence of
    /// another session, lengths that do not add up, a step of no sequences, an element type
    /// the model's dtype is not, a NUL byte in a path or label; or a call on a step a failed
    /// attend aborted (the text names the attend's error).
    Invalid(String),
}

impl Error {
    /// `-rc` with libpat's name for it and `detail`.
    pub(crate) fn from_rc(rc: c_int, detail: String) -> Error {
        Error::Pat {
            errno: -rc,
            name: strerror(rc),
            detail,
        }
    }

    /// The errno (positive): libpat's for [`Error::Pat`], `EINVAL` for [`Error::Invalid`], none
    /// for [`Error::Version`].
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Pat { errno, .. } => Some(*errno),
            Error::Invalid(_) => Some(sys::EINVAL as i32),
            Error::Version { .. } => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Pat { name, detail, .. } if detail.is_empty() => f.write_str(name),
            Error::Pat { name, detail, .. } => write!(f, "{}: {}", name, detail),
            Error::Version { library, binding } => write!(
                f,
                "libpat {} cannot serve this binding, written for libpat {}.{}: install the \
                 matching patd release",
                library, binding.major, binding.minor
            ),
            Error::Invalid(what) => write!(f, "invalid argument: {}", what),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = match &e {
            Error::Pat { errno, .. } => std::io::Error::from_raw_os_error(*errno).kind(),
            Error::Invalid(_) => std::io::ErrorKind::InvalidInput,
            Error::Version { .. } => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}
