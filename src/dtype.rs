//! Storage dtypes and the host element types that map onto them.
//!
//! Storage layout in a buffer is always little-endian and dense: F32, I32 and U32 take four
//! bytes per element, F16 (IEEE binary16) and BF16 (the upper half of an f32) two bytes, so
//! two 16-bit elements share one 32-bit word, element `2i` in the low half. Buffers are padded
//! to whole words; the padding half of an odd-length 16-bit tensor is zero. Kernels address
//! 16-bit storage as `u32` words and convert with the shared routines in `wgsl/common/`, which
//! round to nearest even exactly as `half` does; the storage format does not depend on the
//! adapter having `SHADER_F16`.

/// The storage type of a tensor's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
}

impl DType {
    /// The floating-point storage dtypes.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
        }
    }

    /// Whether this is a floating-point dtype.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// `Ok` for a float dtype, else `UnsupportedDType` naming `what` (e.g. a `*_backward_as`
    /// gradient dtype).
    pub(crate) fn require_float(self, what: impl Into<String>) -> crate::Result<()> {
        if self.is_float() {
            Ok(())
        } else {
            Err(crate::Error::dtype(what, self, &DType::FLOATS))
        }
    }

    /// Bytes a dense buffer of `len` elements occupies, padded to whole 32-bit words.
    pub const fn buffer_bytes(self, len: usize) -> usize {
        // Saturating: a length past what memory can hold gives a size every allocation refuses
        // (`LimitExceeded`), not one that wrapped around to a small buffer.
        len.saturating_mul(self.size())
            .div_ceil(4)
            .saturating_mul(4)
    }

    /// The code kernels receive for this dtype (the `DT_*` constants of `wgsl/common/dtype.wgsl`).
    pub const fn code(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::I32 => 3,
            DType::U32 => 4,
        }
    }

    /// snake_case name, as used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A host element type that has a storage dtype: `f32`, `half::f16`, `half::bf16`, `i32`, `u32`.
pub trait Element: bytemuck::Pod + sealed::Sealed + Send + Sync + 'static {
    /// The storage dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
        }
    };
}
element!(f32, DType::F32);
element!(half::f16, DType::F16);
element!(half::bf16, DType::BF16);
element!(i32, DType::I32);
element!(u32, DType::U32);
