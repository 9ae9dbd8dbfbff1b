//! Gradient and result checking: compare GPU outputs with f64 references under a documented
//! per-dtype tolerance policy, and check f64 reference backwards against finite differences.
//! Public so users can check their own kernels the same way.
//!
//! # Tolerance policy
//!
//! A GPU result passes against its f64 reference when **every** element satisfies
//! `|got − want| ≤ abs + rel·|want|` **and** the relative L2 error
//! `‖got − want‖₂ / max(‖want‖₂, tiny)` is at most `rel_l2`. The references are computed from
//! the values actually stored (16-bit inputs are widened exactly), so the budget covers FP32
//! arithmetic and the rounding of the compared output to its storage dtype:
//!
//! | output dtype | abs | rel | rel_l2 |
//! |---|---|---|---|
//! | F32 (and every gradient) | 1e-5 | 1e-4 | 1e-5 |
//! | F16 | 1e-3 | 2e-3 | 1e-3 |
//! | BF16 | 8e-3 | 1.6e-2 | 8e-3 |
//!
//! Operators with long reductions scale the policy with [`Tolerance::scaled`] and say so.
//! Finite differences of the f64 references use central differences with step 1e-6 and
//! [`Tolerance::FINITE_DIFFERENCE`] (abs 1e-6, rel 1e-5, rel_l2 1e-6).

use crate::{DType, Engine, Result, Tensor};

/// Error budget of a comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Absolute part of the elementwise bound.
    pub abs: f64,
    /// Relative part of the elementwise bound.
    pub rel: f64,
    /// Bound on the relative L2 error of the whole tensor.
    pub rel_l2: f64,
}

impl Tolerance {
    /// Finite differences of f64 references (central, step 1e-6).
    pub const FINITE_DIFFERENCE: Tolerance = Tolerance {
        abs: 1e-6,
        rel: 1e-5,
        rel_l2: 1e-6,
    };

    /// The policy for an output stored in `dtype` (see the module table). Integer dtypes
    /// must match exactly.
    pub const fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                abs: 1e-5,
                rel: 1e-4,
                rel_l2: 1e-5,
            },
            DType::F16 => Tolerance {
                abs: 1e-3,
                rel: 2e-3,
                rel_l2: 1e-3,
            },
            DType::BF16 => Tolerance {
                abs: 8e-3,
                rel: 1.6e-2,
                rel_l2: 8e-3,
            },
            DType::I32 | DType::U32 => Tolerance::EXACT,
        }
    }

    /// Bit-for-bit equality (NaN matches NaN).
    pub const EXACT: Tolerance = Tolerance {
        abs: 0.0,
        rel: 0.0,
        rel_l2: 0.0,
    };

    /// The same policy with every bound multiplied by `factor`.
    pub fn scaled(self, factor: f64) -> Tolerance {
        Tolerance {
            abs: self.abs * factor,
            rel: self.rel * factor,
            rel_l2: self.rel_l2 * factor,
        }
    }
}

/// Measured differences between a result and its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// Elements compared.
    pub len: usize,
    /// Largest `|got − want|`.
    pub max_abs: f64,
    /// Largest `|got − want| / |want|` over elements with `want ≠ 0`.
    pub max_rel: f64,
    /// `‖got − want‖₂ / ‖want‖₂` (the plain L2 norm of the difference when `want` is zero).
    pub rel_l2: f64,
    /// Index of the element furthest outside the elementwise bound (or of `max_abs`).
    pub worst: usize,
    /// Elements outside `|got − want| ≤ abs + rel·|want|` for the tolerance given.
    pub violations: usize,
    /// Elements where one side is NaN/±∞ and the other is not the same non-finite value.
    pub nonfinite_mismatches: usize,
    /// Whether the comparison is within the tolerance.
    pub passed: bool,
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max_abs {:.2e} max_rel {:.2e} rel_l2 {:.2e} (n={}, worst #{}, {} outside, {} non-finite)",
            self.max_abs,
            self.max_rel,
            self.rel_l2,
            self.len,
            self.worst,
            self.violations,
            self.nonfinite_mismatches
        )
    }
}

/// Compare `got` with `want` under `tol`. Lengths must match (a length mismatch fails with
/// `len` = the shorter length and every missing element counted as a violation).
pub fn compare(got: &[f64], want: &[f64], tol: Tolerance) -> Comparison {
    let len = got.len().min(want.len());
    let mut c = Comparison {
        len,
        max_abs: 0.0,
        max_rel: 0.0,
        rel_l2: 0.0,
        worst: 0,
        violations: got.len().max(want.len()) - len,
        nonfinite_mismatches: 0,
        passed: false,
    };
    let (mut diff2, mut want2) = (0.0f64, 0.0f64);
    let mut worst_excess = f64::NEG_INFINITY;
    for i in 0..len {
        let (g, w) = (got[i], want[i]);
        if !g.is_finite() || !w.is_finite() {
            let same = (g.is_nan() && w.is_nan()) || g == w;
            if !same {
                c.nonfinite_mismatches += 1;
                c.violations += 1;
                c.worst = i;
                worst_excess = f64::INFINITY;
            }
            continue;
        }
        let d = (g - w).abs();
        diff2 += d * d;
        want2 += w * w;
        if d > c.max_abs {
            c.max_abs = d;
        }
        if w != 0.0 {
            c.max_rel = c.max_rel.max(d / w.abs());
        }
        let bound = tol.abs + tol.rel * w.abs();
        let excess = d - bound;
        if excess > 0.0 {
            c.violations += 1;
        }
        if excess > worst_excess {
            worst_excess = excess;
            c.worst = i;
        }
    }
    c.rel_l2 = if want2 > 0.0 {
        (diff2 / want2).sqrt()
    } else {
        diff2.sqrt()
    };
    c.passed = c.violations == 0 && c.rel_l2 <= tol.rel_l2;
    c
}

/// Central-difference gradient of `loss` at `x` with step `eps` (f64 throughout).
pub fn numerical_gradient(loss: impl Fn(&[f64]) -> f64, x: &[f64], eps: f64) -> Vec<f64> {
    let mut probe = x.to_vec();
    (0..x.len())
        .map(|i| {
            let keep = probe[i];
            probe[i] = keep + eps;
            let up = loss(&probe);
            probe[i] = keep - eps;
            let down = loss(&probe);
            probe[i] = keep;
            (up - down) / (2.0 * eps)
        })
        .collect()
}

/// Check an analytic vector-Jacobian product: `analytic` must equal the gradient of
/// `⟨cotangent, forward(x)⟩` with respect to `x`, by central differences (step 1e-6,
/// [`Tolerance::FINITE_DIFFERENCE`]).
pub fn check_vjp(
    forward: impl Fn(&[f64]) -> Vec<f64>,
    x: &[f64],
    cotangent: &[f64],
    analytic: &[f64],
) -> Comparison {
    let loss = |p: &[f64]| -> f64 { forward(p).iter().zip(cotangent).map(|(y, g)| y * g).sum() };
    let numeric = numerical_gradient(loss, x, 1e-6);
    compare(analytic, &numeric, Tolerance::FINITE_DIFFERENCE)
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

    /// Next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_measures_and_judges() {
        let c = compare(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0], Tolerance::EXACT);
        assert!(c.passed && c.max_abs == 0.0 && c.violations == 0);
        let c = compare(
            &[1.0, 2.1, 3.0],
            &[1.0, 2.0, 3.0],
            Tolerance::for_dtype(DType::F32),
        );
        assert!(!c.passed);
        assert_eq!((c.worst, c.violations), (1, 1));
        assert!((c.max_abs - 0.1).abs() < 1e-12 && (c.max_rel - 0.05).abs() < 1e-12);
        // Within the elementwise bound but over the L2 bound.
        let tol = Tolerance {
            abs: 1.0,
            rel: 0.0,
            rel_l2: 1e-3,
        };
        assert!(!compare(&[1.5], &[1.0], tol).passed);
        // Non-finite values must match exactly; NaN matches NaN.
        assert!(
            compare(
                &[f64::NAN, f64::INFINITY],
                &[f64::NAN, f64::INFINITY],
                Tolerance::EXACT
            )
            .passed
        );
        let c = compare(&[f64::NAN], &[1.0], Tolerance::for_dtype(DType::BF16));
        assert!(!c.passed && c.nonfinite_mismatches == 1);
        // A length mismatch fails.
        assert!(!compare(&[1.0], &[1.0, 2.0], Tolerance::for_dtype(DType::F32)).passed);
    }

    #[test]
    fn finite_differences_accept_right_and_reject_wrong_vjps() {
        let forward = |x: &[f64]| x.iter().map(|v| v * v * v).collect::<Vec<_>>();
        let x = [0.3, -1.2, 2.0];
        let g = [1.0, -0.5, 0.25];
        let right: Vec<f64> = x.iter().zip(&g).map(|(x, g)| 3.0 * x * x * g).collect();
        assert!(check_vjp(forward, &x, &g, &right).passed);
        let wrong: Vec<f64> = x.iter().zip(&g).map(|(x, g)| 2.0 * x * g).collect();
        assert!(!check_vjp(forward, &x, &g, &wrong).passed);
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let a = Rng::new(7).vec(100, -2.0, 3.0);
        assert_eq!(a, Rng::new(7).vec(100, -2.0, 3.0));
        assert!(a.iter().all(|v| (-2.0..3.0).contains(v)));
        assert_ne!(a, Rng::new(8).vec(100, -2.0, 3.0));
    }

    #[test]
    fn stored_values_round_like_half() {
        let x = [1.0 + 1.0 / 4096.0, 70000.0, 1e-9];
        assert_eq!(stored_values(&x, DType::F16), vec![1.0, f64::INFINITY, 0.0]);
        assert_eq!(stored_values(&x[..1], DType::BF16), vec![1.0]);
    }
}
