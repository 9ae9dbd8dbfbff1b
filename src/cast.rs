//! Casts between floating storage dtypes: F32 ↔ F16 ↔ BF16.
//!
//! Narrowing rounds to nearest, ties to even, exactly as `half::f16::from_f32` and
//! `half::bf16::from_f32` do (NaN stays NaN, overflow gives infinity, f16 subnormals are kept);
//! widening is exact. Any element count, odd ones included: each invocation owns whole output
//! words, so no two invocations write one word. No gradient (a cast's derivative is the
//! identity; rounding is not differentiated).

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, Kernel};
use crate::tensor::row_windows;
use crate::{DType, Error, Result, Tensor};

/// `wgsl/cast.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "cast",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        include_str!("../wgsl/cast.wgsl"),
    ],
};

const WG: u64 = 256;

#[derive(encase::ShaderType)]
struct Params {
    count: u32,
    pairs: u32,
}

/// Convert `x` to the floating dtype `to` (a new tensor; the same handle when `to` is
/// already `x`'s dtype). Tensors past one storage binding are converted in windows of it.
/// Errors: a non-float source or target dtype.
pub fn cast(x: &Tensor, to: DType) -> Result<Tensor> {
    if !x.dtype().is_float() {
        return Err(Error::dtype("cast: source", x.dtype(), &DType::FLOATS));
    }
    if !to.is_float() {
        return Err(Error::dtype("cast: target", to, &DType::FLOATS));
    }
    if to == x.dtype() {
        return Ok(x.clone());
    }
    let engine = x.engine();
    let out = Tensor::empty(engine, x.shape(), to, "cast")?;
    let count = x.len();
    let pairs = count.div_ceil(2);
    let consts = vec![
        ("SRC", f64::from(x.dtype().code())),
        ("DST", f64::from(to.code())),
    ];
    // Pairs of values as rows, in windows when a tensor exceeds one binding.
    let pair_bytes = [2 * x.dtype().size() as u64, 2 * to.size() as u64];
    for w in row_windows(engine, "cast", pairs, &pair_bytes)? {
        let n = (2 * w.end).min(count) - 2 * w.start;
        engine.launch_bound(
            &KERNEL,
            "convert",
            &consts,
            &Params {
                count: n as u32,
                pairs: n.div_ceil(2) as u32,
            },
            &[x.bind_rows(&w, 2), out.bind_rows(&w, 2)],
            (n.div_ceil(2) as u64).div_ceil(WG),
        )?;
    }
    Ok(out)
}
