//! The gradient-check report: one check per operator wgrad ships, each running the GPU op on
//! this machine's adapter against its f64 reference (forward and every gradient) for every
//! storage dtype. The `check` example prints it; a test makes sure every registered kernel is
//! covered by some check.

use crate::gradcheck::{Comparison, Rng, Tolerance, compare, stored_values, tensor_from_f64};
use crate::{DType, Engine, Result, bench, cast, reduce, reference};

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
        OperatorCheck {
            name: "silu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Silu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "sigmoid",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Sigmoid,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "gelu_tanh",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::GeluTanh,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "gelu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Gelu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "quick_gelu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::QuickGelu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "relu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Relu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "relu_squared",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::ReluSquared,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "tanh",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Tanh,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "swiglu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Silu,
                    ActivationCheck::Multipliers,
                )
            },
        },
        OperatorCheck {
            name: "geglu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::GeluTanh,
                    ActivationCheck::Multipliers,
                )
            },
        },
        OperatorCheck {
            name: "swiglu_packed",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Silu,
                    ActivationCheck::Packed,
                )
            },
        },
        OperatorCheck {
            name: "geglu_packed",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::GeluTanh,
                    ActivationCheck::Packed,
                )
            },
        },
        OperatorCheck {
            name: "erf",
            kernels: &["activation"],
            run: check_erf,
        },
    ]
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

/// Which form of an activation a check runs.
#[derive(Clone, Copy)]
enum ActivationCheck {
    /// Unary and gated (separate tensors), default multipliers.
    UnaryAndGated,
    /// Gated with gate multiplier 0.5 and down multiplier 2 (Liger's SiLU-multiply variant).
    Multipliers,
    /// Packed `[gate ‖ up]` layout, odd width.
    Packed,
}

fn check_activation(
    engine: &Engine,
    kind: crate::activation::Activation,
    which: ActivationCheck,
) -> Result<Vec<Case>> {
    use crate::activation::{self as act, ActivationOptions};
    use reference::activation as r;
    let mut rng = Rng::new(40 + u64::from(kind.code()));
    let mut cases = Vec::new();
    let f32_tol = Tolerance::for_dtype(DType::F32);
    let n = 1001;
    for dtype in DType::FLOATS {
        let tol = Tolerance::for_dtype(dtype);
        match which {
            ActivationCheck::UnaryAndGated | ActivationCheck::Multipliers => {
                let opts = match which {
                    ActivationCheck::Multipliers => ActivationOptions {
                        gate_multiplier: 0.5,
                        down_multiplier: 2.0,
                    },
                    _ => ActivationOptions::default(),
                };
                let (gm, dm) = (
                    f64::from(opts.gate_multiplier),
                    f64::from(opts.down_multiplier),
                );
                let (g, gs) = tensor_from_f64(engine, &rng.vec(n, -6.0, 6.0), &[n], dtype)?;
                let (u, us) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[n], dtype)?;
                let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[n], dtype)?;
                if matches!(which, ActivationCheck::UnaryAndGated) {
                    let (y, saved) = act::forward(kind, &g, None, &opts)?;
                    let want = stored_values(&r::forward(kind, &gs, None, gm, dm), dtype);
                    cases.push(case(
                        format!("unary n={n} {dtype} y"),
                        &y.to_f64()?,
                        &want,
                        tol,
                    ));
                    let grads = act::backward(&saved, &dy)?;
                    let (dg, _) = r::backward(kind, &gs, None, &dys, gm, dm);
                    cases.push(case(
                        format!("unary n={n} {dtype} dx"),
                        &grads.dgate.to_f64()?,
                        &dg,
                        f32_tol,
                    ));
                }
                let (y, saved) = act::forward(kind, &g, Some(&u), &opts)?;
                let want = stored_values(&r::forward(kind, &gs, Some(&us), gm, dm), dtype);
                cases.push(case(
                    format!("gated n={n} {dtype} y"),
                    &y.to_f64()?,
                    &want,
                    tol,
                ));
                let grads = act::backward(&saved, &dy)?;
                let (dg, du) = r::backward(kind, &gs, Some(&us), &dys, gm, dm);
                cases.push(case(
                    format!("gated n={n} {dtype} dgate"),
                    &grads.dgate.to_f64()?,
                    &dg,
                    f32_tol,
                ));
                if let (Some(got), Some(want)) = (grads.dup, du) {
                    cases.push(case(
                        format!("gated n={n} {dtype} dup"),
                        &got.to_f64()?,
                        &want,
                        f32_tol,
                    ));
                }
            }
            ActivationCheck::Packed => {
                let (rows, width) = (13, 37);
                let (x, xs) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * 2 * width, -6.0, 6.0),
                    &[rows, 2 * width],
                    dtype,
                )?;
                let (dy, dys) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * width, -1.0, 1.0),
                    &[rows, width],
                    dtype,
                )?;
                let (y, saved) = act::packed_forward(kind, &x, &ActivationOptions::default())?;
                let want = stored_values(&r::packed_forward(kind, &xs, width, 1.0, 1.0), dtype);
                cases.push(case(
                    format!("{rows}x{} {dtype} y", 2 * width),
                    &y.to_f64()?,
                    &want,
                    tol,
                ));
                let grads = act::backward(&saved, &dy)?;
                let want = r::packed_backward(kind, &xs, width, &dys, 1.0, 1.0);
                cases.push(case(
                    format!("{rows}x{} {dtype} dx", 2 * width),
                    &grads.dgate.to_f64()?,
                    &want,
                    f32_tol,
                ));
            }
        }
    }
    Ok(cases)
}

fn check_erf(engine: &Engine) -> Result<Vec<Case>> {
    let data = Rng::new(49).vec(4001, -8.0, 8.0);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (x, xs) = tensor_from_f64(engine, &data, &[data.len()], dtype)?;
        let got = crate::activation::erf(&x)?.to_f64()?;
        let want: Vec<f64> = xs.iter().map(|&v| reference::activation::erf(v)).collect();
        // A few f32 ulps (tests/activation.rs checks three ulps element by element).
        let tol = Tolerance {
            abs: 2e-7,
            rel: 4e-7,
            rel_l2: 2e-7,
        };
        cases.push(case(format!("n={} {dtype}", data.len()), &got, &want, tol));
    }
    Ok(cases)
}
