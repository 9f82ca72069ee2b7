//! One error type for all of weft-core. Every variant names what was wrong, so a user can act on it.

use std::fmt;

/// Everything that can go wrong in weft-core.
// Fields are named for what they hold (the op, both shapes, the byte counts); each variant's doc
// and its Display say what they mean.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// Operands whose shapes do not fit together: names the op and both shapes.
    ShapeMismatch { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize> },
    /// A shape, axis or argument that does not make sense for the op.
    InvalidArgument { op: &'static str, msg: String },
    /// An op got a tensor of a dtype it does not take.
    DType { op: &'static str, expected: &'static str, got: crate::DType },
    /// Operands live on different devices.
    DeviceMismatch { op: &'static str, lhs: String, rhs: String },
    /// The op needs data but the tensor lives on the Meta device (shapes only).
    MetaData { op: &'static str },
    /// No GPU adapter could be opened.
    NoAdapter(String),
    /// A tensor would need a buffer larger than the adapter allows.
    TooLarge { bytes: u64, limit: u64, what: &'static str },
    /// The device ran out of memory.
    OutOfMemory { bytes: u64, device: String },
    /// The GPU reported an error (validation, device lost, mapping).
    Gpu(String),
    /// A collective operation failed (another rank errored, or sizes disagree).
    Collective(String),
    /// Anything else, with its message.
    Msg(String),
}

/// `Result` with weft's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::ShapeMismatch { op, lhs, rhs } => {
                write!(f, "{op}: shapes {lhs:?} and {rhs:?} do not match")
            }
            Error::InvalidArgument { op, msg } => write!(f, "{op}: {msg}"),
            Error::DType { op, expected, got } => {
                write!(f, "{op}: expected a tensor of dtype {expected}, got {got:?}")
            }
            Error::DeviceMismatch { op, lhs, rhs } => {
                write!(f, "{op}: operands are on different devices ({lhs} and {rhs})")
            }
            Error::MetaData { op } => write!(
                f,
                "{op}: the tensor is on the Meta device, which holds shapes only; create it on Cpu or Gpu to read data"
            ),
            Error::NoAdapter(msg) => write!(
                f,
                "no GPU adapter: {msg}. Install a GPU driver with Vulkan, Metal or DX12 support, \
                 or `apt-get install mesa-vulkan-drivers` for a software one (lavapipe)"
            ),
            Error::TooLarge { bytes, limit, what } => {
                write!(f, "a buffer of {bytes} bytes is larger than the adapter's {what} ({limit} bytes)")
            }
            Error::OutOfMemory { bytes, device } => {
                write!(f, "out of memory on {device} while allocating {bytes} bytes")
            }
            Error::Gpu(msg) => write!(f, "GPU error: {msg}"),
            Error::Collective(msg) => write!(f, "collective failed: {msg}"),
            Error::Msg(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument { op, msg: msg.into() }
    }
}

/// Return early with an [`Error::InvalidArgument`].
#[macro_export]
macro_rules! bail {
    ($op:expr, $($arg:tt)*) => {
        return Err($crate::Error::InvalidArgument { op: $op, msg: format!($($arg)*) })
    };
}
