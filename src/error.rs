//! The one error type of wgrad. Every bad input a caller can pass comes back as one of these
//! variants, carrying the numbers that were wrong; nothing a caller passes may panic.

use crate::DType;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in wgrad, with the values that were wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A tensor or argument had the wrong shape.
    #[error("{what}: shape mismatch, expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// Which argument.
        what: String,
        /// The shape that was required.
        expected: Vec<usize>,
        /// The shape that was passed.
        got: Vec<usize>,
    },
    /// Host data length does not match the product of the shape.
    #[error("{what}: {got} elements given for shape {shape:?} ({expected} elements)")]
    LengthMismatch {
        /// Which argument.
        what: String,
        /// The shape that was asked for.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A dtype that the operation does not accept.
    #[error("{what}: dtype {got:?} not supported (accepted: {accepted:?})")]
    UnsupportedDType {
        /// Which argument.
        what: String,
        /// The dtype that was passed.
        got: DType,
        /// The dtypes that would have been accepted.
        accepted: Vec<DType>,
    },
    /// A size, count or scalar outside the documented bounds.
    #[error("{what}: {got} is out of bounds (allowed {min}..={max})")]
    OutOfBounds {
        /// Which quantity.
        what: String,
        /// The value that was passed or derived.
        got: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// A floating-point argument that is not allowed (non-finite, not positive, ...).
    #[error("{what}: invalid value {got} ({rule})")]
    InvalidValue {
        /// Which argument.
        what: String,
        /// The value that was passed.
        got: f64,
        /// The rule it broke.
        rule: String,
    },
    /// A buffer binding would exceed the device's limit.
    #[error("{what}: {bytes} bytes exceed the device limit {limit} ({limit_name})")]
    LimitExceeded {
        /// Which buffer.
        what: String,
        /// Bytes the binding needs.
        bytes: u64,
        /// The limit in bytes.
        limit: u64,
        /// Name of the wgpu limit.
        limit_name: &'static str,
    },
    /// A call would need more scratch memory than its workspace bound allows.
    #[error("{what}: workspace of {needed} bytes exceeds the bound of {bound} bytes")]
    WorkspaceExceeded {
        /// Which operation.
        what: String,
        /// Bytes the call needs.
        needed: u64,
        /// The bound in force.
        bound: u64,
    },
    /// Tensors from two different engines were mixed in one call.
    #[error("{what}: tensor belongs to another engine")]
    EngineMismatch {
        /// Which argument.
        what: String,
    },
    /// A device feature the call or the engine needs is missing.
    #[error("missing device feature(s): {features}")]
    MissingFeature {
        /// The features, as wgpu names them.
        features: String,
    },
    /// A device limit is lower than wgrad needs.
    #[error("device limit {name} is {got}, wgrad needs at least {needed}")]
    InsufficientLimit {
        /// The wgpu limit's name.
        name: &'static str,
        /// The device's value.
        got: u64,
        /// The least wgrad can work with.
        needed: u64,
    },
    /// No adapter matched the request.
    #[error("no GPU adapter found: {0}")]
    NoAdapter(String),
    /// A kernel failed to translate or compile (a bug in wgrad or the driver).
    #[error("kernel {kernel}: {message}")]
    Kernel {
        /// Kernel name.
        kernel: String,
        /// What the compiler said.
        message: String,
    },
    /// A tensor shares its buffer with another that the same call writes (an optimizer's
    /// parameters, state and gradients must be distinct buffers).
    #[error("{what} shares its buffer with {other}")]
    Aliased {
        /// Which argument.
        what: String,
        /// What it shares the buffer with.
        other: String,
    },
    /// `Engine::time` was called while another timed section was open on the engine.
    #[error("a timed section is already open on this engine")]
    TimingInProgress,
    /// The device reported an error (out of memory, lost device, validation).
    #[error("device error: {0}")]
    Device(String),
}

impl Error {
    pub(crate) fn shape(what: impl Into<String>, expected: &[usize], got: &[usize]) -> Self {
        Error::ShapeMismatch {
            what: what.into(),
            expected: expected.to_vec(),
            got: got.to_vec(),
        }
    }

    pub(crate) fn dtype(what: impl Into<String>, got: DType, accepted: &[DType]) -> Self {
        Error::UnsupportedDType {
            what: what.into(),
            got,
            accepted: accepted.to_vec(),
        }
    }

    pub(crate) fn bounds(what: impl Into<String>, got: u64, min: u64, max: u64) -> Self {
        Error::OutOfBounds {
            what: what.into(),
            got,
            min,
            max,
        }
    }
}
