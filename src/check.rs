//! The gradient-check report: one check per operator wgrad ships, each running the GPU op on
//! this machine's adapter against its f64 reference (forward and every gradient) for every
//! storage dtype. The `check` example prints it; a test makes sure every registered kernel is
//! covered by some check.

use crate::gradcheck::{Comparison, Tolerance, compare};
use crate::{DType, Engine, Result, Tensor, bench, cast, reduce, reference};

/// One operator's check.
pub struct OperatorCheck {
    /// snake_case API name (`rms_norm`, `cross_entropy`, ...).
    pub name: &'static str,
    /// Names of the registered kernels it exercises.
    pub kernels: &'static [&'static str],
    /// Runs every case and returns their comparisons.
    pub run: fn(&Engine) -> Result<Vec<Case>>,
}

/// One compared output of one case.
#[derive(Debug, Clone)]
pub struct Case {
    /// What was compared (shape, dtype, output).
    pub label: String,
    /// The measured differences.
    pub comparison: Comparison,
}

/// Every operator check, in report order.
pub fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "cast",
            kernels: &["cast"],
            run: check_cast,
        },
        OperatorCheck {
            name: "sum_rows",
            kernels: &["reduce"],
            run: |e| check_reduction(e, Reduction::SumRows),
        },
        OperatorCheck {
            name: "max_rows",
            kernels: &["reduce"],
            run: |e| check_reduction(e, Reduction::MaxRows),
        },
        OperatorCheck {
            name: "sum_columns",
            kernels: &["reduce"],
            run: |e| check_reduction(e, Reduction::SumColumns),
        },
        OperatorCheck {
            name: "copy",
            kernels: &["copy"],
            run: check_copy,
        },
    ]
}

/// A small deterministic generator (SplitMix64) for reproducible test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Upload f64 values as `dtype` (rounded through f32, as GPU casts do) and return the tensor
/// with the values it actually holds, widened back to f64.
pub fn tensor_from_f64(
    engine: &Engine,
    data: &[f64],
    shape: &[usize],
    dtype: DType,
) -> Result<(Tensor, Vec<f64>)> {
    let t = match dtype {
        DType::F32 => {
            let v: Vec<f32> = data.iter().map(|&x| x as f32).collect();
            Tensor::from_slice(engine, &v, shape)?
        }
        DType::F16 => {
            let v: Vec<half::f16> = data
                .iter()
                .map(|&x| half::f16::from_f32(x as f32))
                .collect();
            Tensor::from_slice(engine, &v, shape)?
        }
        DType::BF16 => {
            let v: Vec<half::bf16> = data
                .iter()
                .map(|&x| half::bf16::from_f32(x as f32))
                .collect();
            Tensor::from_slice(engine, &v, shape)?
        }
        other => {
            return Err(crate::Error::dtype(
                "tensor_from_f64",
                other,
                &DType::FLOATS,
            ));
        }
    };
    let stored = stored_values(data, dtype);
    Ok((t, stored))
}

/// The values `data` takes once stored as `dtype` (through f32), widened back to f64.
pub fn stored_values(data: &[f64], dtype: DType) -> Vec<f64> {
    data.iter()
        .map(|&x| match dtype {
            DType::F16 => f64::from(half::f16::from_f32(x as f32)),
            DType::BF16 => f64::from(half::bf16::from_f32(x as f32)),
            _ => f64::from(x as f32),
        })
        .collect()
}

fn case(label: String, got: &[f64], want: &[f64], tol: Tolerance) -> Case {
    Case {
        label,
        comparison: compare(got, want, tol),
    }
}

fn check_cast(engine: &Engine) -> Result<Vec<Case>> {
    let mut rng = Rng::new(1);
    let mut data = rng.vec(1001, -70000.0, 70000.0);
    data.extend(rng.vec(200, -1e-6, 1e-6));
    data.extend([
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        65504.0,
        65520.0,
        1e-8,
    ]);
    let mut cases = Vec::new();
    for from in DType::FLOATS {
        for to in DType::FLOATS {
            if from == to {
                continue;
            }
            let (x, stored) = tensor_from_f64(engine, &data, &[data.len()], from)?;
            let got = cast::cast(&x, to)?.to_f64()?;
            let want = stored_values(&stored, to);
            cases.push(case(
                format!("{from}->{to} n={}", data.len()),
                &got,
                &want,
                Tolerance::EXACT,
            ));
        }
    }
    Ok(cases)
}

enum Reduction {
    SumRows,
    MaxRows,
    SumColumns,
}

fn check_reduction(engine: &Engine, which: Reduction) -> Result<Vec<Case>> {
    let mut rng = Rng::new(2);
    let mut cases = Vec::new();
    for (rows, cols) in [(1, 1), (37, 300), (130, 5), (3, 1000)] {
        for dtype in DType::FLOATS {
            let data = rng.vec(rows * cols, -1.0, 1.0);
            let (x, stored) = tensor_from_f64(engine, &data, &[rows, cols], dtype)?;
            let (got, want, length) = match which {
                Reduction::SumRows => (
                    reduce::sum_rows(&x)?,
                    reference::reduce::sum_rows(&stored, rows, cols),
                    cols,
                ),
                Reduction::MaxRows => (
                    reduce::max_rows(&x)?,
                    reference::reduce::max_rows(&stored, rows, cols),
                    1,
                ),
                Reduction::SumColumns => (
                    reduce::sum_columns(&x)?,
                    reference::reduce::sum_columns(&stored, rows, cols),
                    rows,
                ),
            };
            // FP32 accumulation of `length` terms of magnitude ≤ 1: error grows with the
            // number of terms, so the absolute budget does too.
            let tol = Tolerance {
                abs: 1e-7 * length as f64 + 1e-7,
                ..Tolerance::for_dtype(DType::F32)
            };
            cases.push(case(
                format!("{rows}x{cols} {dtype}"),
                &got.to_f64()?,
                &want,
                tol,
            ));
        }
    }
    Ok(cases)
}

fn check_copy(engine: &Engine) -> Result<Vec<Case>> {
    let data = Rng::new(3).vec(4 * 1000, -1.0, 1.0);
    let (x, stored) = tensor_from_f64(engine, &data, &[data.len()], DType::F32)?;
    let got = bench::copy(&x)?.to_f64()?;
    Ok(vec![case(
        "4000 f32".into(),
        &got,
        &stored,
        Tolerance::EXACT,
    )])
}
