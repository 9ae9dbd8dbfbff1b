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
            name: "gated_delta",
            kernels: &["gated_delta"],
            run: check_gated_delta,
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

/// `gated_delta_forward` / `gated_delta_backward` against the f64 reference: output, final
/// state and all six gradients, for q/k/v stored as F32, F16 and BF16, scalar and per-channel
/// decay, two value heads sharing one key head, T spanning a partial checkpoint segment.
fn check_gated_delta(engine: &Engine) -> Result<Vec<Case>> {
    use crate::gated_delta::{GatedDeltaOptions, gated_delta_backward, gated_delta_forward};
    use crate::reference::gated_delta::{Dims, backward, forward};
    let (b, t, hk, hv, kd, vd) = (1, 7, 1, 2, 32, 16);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        for per_channel in [false, true] {
            let mut rng = Rng::new(40 + u64::from(dtype.code()));
            let d = Dims {
                batch: b,
                time: t,
                key_heads: hk,
                value_heads: hv,
                key_dim: kd,
                value_dim: vd,
                per_channel,
                scale: 1.0 / (kd as f64).sqrt(),
            };
            let q = rng.vec(b * t * hk * kd, -1.0, 1.0);
            // Unit-norm keys keep the recurrence contractive.
            let mut k = rng.vec(b * t * hk * kd, -1.0, 1.0);
            for row in k.chunks_mut(kd) {
                let n = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                row.iter_mut().for_each(|x| *x /= n);
            }
            let v = rng.vec(b * t * hv * vd, -1.0, 1.0);
            let beta = rng.vec(b * t * hv, 0.05, 1.0);
            let gate_shape: Vec<usize> = if per_channel {
                vec![b, t, hv, kd]
            } else {
                vec![b, t, hv]
            };
            let g = rng.vec(gate_shape.iter().product(), -0.7, 0.0);
            let s0 = rng.vec(b * hv * kd * vd, -0.5, 0.5);
            let dout = rng.vec(b * t * hv * vd, -1.0, 1.0);
            let dfin = rng.vec(b * hv * kd * vd, -1.0, 1.0);
            let (qt, qs) = tensor_from_f64(engine, &q, &[b, t, hk, kd], dtype)?;
            let (kt, ks) = tensor_from_f64(engine, &k, &[b, t, hk, kd], dtype)?;
            let (vt, vs) = tensor_from_f64(engine, &v, &[b, t, hv, vd], dtype)?;
            let f32t = |x: &[f64], shape: &[usize]| tensor_from_f64(engine, x, shape, DType::F32);
            let (bt, bs) = f32t(&beta, &[b, t, hv])?;
            let (gt, gs) = f32t(&g, &gate_shape)?;
            let (st, ss) = f32t(&s0, &[b, hv, kd, vd])?;
            let (dot, dos) = f32t(&dout, &[b, t, hv, vd])?;
            let (dft, dfs) = f32t(&dfin, &[b, hv, kd, vd])?;
            let options = GatedDeltaOptions {
                checkpoint_interval: Some(3),
                ..GatedDeltaOptions::default()
            };
            let (out, saved) = gated_delta_forward(&qt, &kt, &vt, &bt, &gt, Some(&st), &options)?;
            let grads = gated_delta_backward(&saved, Some(&dot), Some(&dft))?;
            let want = forward(&d, &qs, &ks, &vs, &bs, &gs, Some(&ss));
            let wg = backward(
                &d,
                &qs,
                &ks,
                &vs,
                &bs,
                &gs,
                Some(&ss),
                Some(&dos),
                Some(&dfs),
            );
            let decay = if per_channel { "per-channel" } else { "scalar" };
            let label =
                |what: &str| format!("{dtype} {decay} B{b} T{t} Hk{hk} Hv{hv} K{kd} V{vd} {what}");
            let f32tol = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                label("output"),
                &out.output.to_f64()?,
                &stored_values(&want.output, dtype),
                Tolerance::for_dtype(dtype),
            ));
            cases.push(case(
                label("final_state"),
                &out.final_state.to_f64()?,
                &want.final_state,
                f32tol,
            ));
            for (name, got, w) in [
                ("d_query", &grads.query, &wg.query),
                ("d_key", &grads.key, &wg.key),
                ("d_value", &grads.value, &wg.value),
                ("d_beta", &grads.beta, &wg.beta),
                ("d_log_decay", &grads.log_decay, &wg.log_decay),
                ("d_initial_state", &grads.initial_state, &wg.initial_state),
            ] {
                cases.push(case(label(name), &got.to_f64()?, w, f32tol));
            }
        }
    }
    Ok(cases)
}
