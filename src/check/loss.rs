//! Checks of the loss family (`crate::loss`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "softmax",
            kernels: &["loss", "loss_rows"],
            run: |e| check_softmax(e, false),
        },
        OperatorCheck {
            name: "log_softmax",
            kernels: &["loss", "loss_rows"],
            run: |e| check_softmax(e, true),
        },
        OperatorCheck {
            name: "softmax_backward_as",
            kernels: &["loss", "loss_rows", "cast"],
            run: check_softmax_backward_as,
        },
        OperatorCheck {
            name: "softmax_backward_from_output",
            kernels: &["loss", "loss_rows", "cast"],
            run: check_softmax_backward_from_output,
        },
        OperatorCheck {
            name: "sparsemax",
            kernels: &["loss"],
            run: check_sparsemax,
        },
        OperatorCheck {
            name: "cross_entropy",
            kernels: &["loss", "reduce"],
            run: check_cross_entropy,
        },
        OperatorCheck {
            name: "cross_entropy_in_place",
            kernels: &["loss", "loss_rows", "reduce"],
            run: check_cross_entropy_in_place,
        },
        OperatorCheck {
            name: "cross_entropy_backward_as",
            kernels: &["loss", "reduce", "cast"],
            run: check_cross_entropy_backward_as,
        },
        OperatorCheck {
            name: "cross_entropy_soft",
            kernels: &["loss", "reduce"],
            run: check_cross_entropy_soft,
        },
        OperatorCheck {
            name: "kl_div",
            kernels: &["loss", "reduce"],
            run: |e| check_divergence(e, LossDivergence::Kl),
        },
        OperatorCheck {
            name: "jsd",
            kernels: &["loss", "reduce"],
            run: |e| check_divergence(e, LossDivergence::Jsd),
        },
        OperatorCheck {
            name: "tvd",
            kernels: &["loss", "reduce"],
            run: |e| check_divergence(e, LossDivergence::Tvd),
        },
        OperatorCheck {
            name: "divergence_backward_as",
            kernels: &["loss", "reduce", "cast"],
            run: check_divergence_backward_as,
        },
    ]
}

// ---- loss family ----------------------------------------------------------------------------

/// Rows × columns the loss checks run on: tiny, ragged (odd widths take the F32-then-narrow
/// path for 16-bit outputs), more columns than lanes, and whole vec4 chunks in every dtype.
const LOSS_SHAPES: [(usize, usize); 4] = [(1, 1), (5, 37), (3, 700), (2, 64)];

pub(super) fn check_softmax(engine: &Engine, log: bool) -> Result<Vec<Case>> {
    let mut rng = Rng::new(40);
    let mut cases = Vec::new();
    for (rows, cols) in LOSS_SHAPES {
        for dtype in DType::FLOATS {
            softmax_cases(
                engine,
                &mut rng,
                log,
                (rows, cols),
                (dtype, DType::F32),
                "",
                &mut cases,
            )?;
        }
    }
    // Rows held in registers, dy in x's dtype: F32 3,000 chunks (`softmax_fwd_r`), BF16 1,500
    // chunks (`softmax_fwd_c`, 8 chunks a lane).
    for dtype in [DType::F32, DType::BF16] {
        let shape = (2, 12_000);
        softmax_cases(
            engine,
            &mut rng,
            log,
            shape,
            (dtype, dtype),
            " (registers)",
            &mut cases,
        )?;
    }
    // A 16-bit backward held by half chunks (`softmax_bwd_h`): BF16 2,050 chunks.
    softmax_cases(
        engine,
        &mut rng,
        log,
        (2, 16_400),
        (DType::BF16, DType::BF16),
        " (registers, half chunks)",
        &mut cases,
    )?;
    Ok(cases)
}

/// Softmax and log-softmax gradients stored in x's dtype (`softmax_backward_as`): 16-bit rows
/// of 2,050 chunks take `softmax_bwd_h`'s direct 16-bit stores, 104 columns `softmax_bwd_v`'s,
/// 100 columns the F32 gradient narrowed; against the reference at the dtype's tolerance.
pub(super) fn check_softmax_backward_as(engine: &Engine) -> Result<Vec<Case>> {
    use crate::loss;
    use crate::reference::loss as r;
    let mut rng = Rng::new(46);
    let mut cases = Vec::new();
    for (rows, cols) in [(2, 16_400), (3, 104), (3, 100)] {
        for dtype in DType::FLOATS {
            for log in [false, true] {
                let n = rows * cols;
                let (x, xs) =
                    tensor_from_f64(engine, &rng.vec(n, -4.0, 4.0), &[rows, cols], dtype)?;
                let (dy, dys) =
                    tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
                let (_, saved) = if log {
                    loss::log_softmax(&x)?
                } else {
                    loss::softmax(&x)?
                };
                let dx = loss::softmax_backward_as(&saved, &dy, dtype)?;
                let want = r::softmax_backward(&xs, &dys, rows, cols, log);
                cases.push(case(
                    format!("{rows}x{cols} {dtype} log={log} dx"),
                    &dx.to_f64()?,
                    &crate::gradcheck::stored_values(&want, dtype),
                    Tolerance::for_dtype(dtype),
                ));
            }
        }
    }
    Ok(cases)
}

/// Softmax and log-softmax gradients from the forward's output
/// (`softmax_backward_from_output`), stored in F32 and in the output's dtype: 16-bit rows of
/// 2,050 chunks take `softmax_bwd_h`, F32 ones `softmax_bwd_r`, 104 columns `softmax_bwd_v`,
/// 16-bit rows of 100 columns `softmax_bwd`; against the reference of the stored output.
fn check_softmax_backward_from_output(engine: &Engine) -> Result<Vec<Case>> {
    use crate::loss;
    use crate::reference::loss as r;
    let mut rng = Rng::new(47);
    let mut cases = Vec::new();
    for (rows, cols) in [(2, 16_400), (3, 104), (3, 100)] {
        for dtype in DType::FLOATS {
            for log in [false, true] {
                let n = rows * cols;
                let (x, _) = tensor_from_f64(engine, &rng.vec(n, -4.0, 4.0), &[rows, cols], dtype)?;
                let (dy, dys) =
                    tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
                let (y, _) = if log {
                    loss::log_softmax(&x)?
                } else {
                    loss::softmax(&x)?
                };
                let want = r::softmax_backward_from_output(&y.to_f64()?, &dys, rows, cols, log);
                for out in [DType::F32, dtype] {
                    let dx = loss::softmax_backward_from_output(&y, &dy, log, out)?;
                    cases.push(case(
                        format!("{rows}x{cols} {dtype} log={log} dx {out}"),
                        &dx.to_f64()?,
                        &crate::gradcheck::stored_values(&want, out),
                        Tolerance::for_dtype(out),
                    ));
                }
            }
        }
    }
    Ok(cases)
}

/// The (log-)softmax output and input gradient of one random `rows × cols` case, x in
/// `dtypes.0` and dy in `dtypes.1`, against the f64 reference.
fn softmax_cases(
    engine: &Engine,
    rng: &mut Rng,
    log: bool,
    (rows, cols): (usize, usize),
    (dtype, dy_dtype): (DType, DType),
    tag: &str,
    cases: &mut Vec<Case>,
) -> Result<()> {
    use crate::loss;
    use crate::reference::loss as r;
    let (x, xs) = tensor_from_f64(
        engine,
        &rng.vec(rows * cols, -4.0, 4.0),
        &[rows, cols],
        dtype,
    )?;
    let (dy, dys) = tensor_from_f64(
        engine,
        &rng.vec(rows * cols, -1.0, 1.0),
        &[rows, cols],
        dy_dtype,
    )?;
    let (y, saved) = if log {
        loss::log_softmax(&x)?
    } else {
        loss::softmax(&x)?
    };
    let want = if log {
        r::log_softmax(&xs, rows, cols)
    } else {
        r::softmax(&xs, rows, cols)
    };
    cases.push(case(
        format!("{rows}x{cols} {dtype} y{tag}"),
        &y.to_f64()?,
        &want,
        Tolerance::for_dtype(dtype),
    ));
    let dx = loss::softmax_backward(&saved, &dy)?;
    let want = r::softmax_backward(&xs, &dys, rows, cols, log);
    cases.push(case(
        format!("{rows}x{cols} {dtype} dx{tag}"),
        &dx.to_f64()?,
        &want,
        Tolerance::for_dtype(DType::F32),
    ));
    Ok(())
}

fn check_sparsemax(engine: &Engine) -> Result<Vec<Case>> {
    use crate::loss;
    use crate::reference::loss as r;
    let mut rng = Rng::new(41);
    let mut cases = Vec::new();
    for (rows, cols) in LOSS_SHAPES {
        for dtype in DType::FLOATS {
            let (x, xs) = tensor_from_f64(
                engine,
                &rng.vec(rows * cols, -2.0, 2.0),
                &[rows, cols],
                dtype,
            )?;
            let (dy, dys) = tensor_from_f64(
                engine,
                &rng.vec(rows * cols, -1.0, 1.0),
                &[rows, cols],
                DType::F32,
            )?;
            let (y, saved) = loss::sparsemax(&x)?;
            cases.push(case(
                format!("{rows}x{cols} {dtype} y"),
                &y.to_f64()?,
                &r::sparsemax(&xs, rows, cols),
                Tolerance::for_dtype(dtype),
            ));
            let dx = loss::sparsemax_backward(&saved, &dy)?;
            let want = r::sparsemax_backward(&xs, &dys, rows, cols);
            cases.push(case(
                format!("{rows}x{cols} {dtype} dx"),
                &dx.to_f64()?,
                &want,
                Tolerance::for_dtype(DType::F32),
            ));
        }
    }
    Ok(cases)
}

fn check_cross_entropy(engine: &Engine) -> Result<Vec<Case>> {
    use crate::Tensor;
    use crate::loss::{self, Reduction};
    use crate::reference::loss as r;
    let mut rng = Rng::new(42);
    let f32_tol = Tolerance::for_dtype(DType::F32);
    let mut cases = Vec::new();
    // 2×8,200 BF16: the plain case takes four chunks a lane at a time (`ce_lane_group`).
    let shapes: [(usize, usize, &[DType]); 4] = [
        (1, 1, &DType::FLOATS),
        (7, 100, &DType::FLOATS),
        (3, 700, &DType::FLOATS),
        (2, 8_200, &[DType::BF16]),
    ];
    for (rows, cols, dtypes) in shapes {
        for &dtype in dtypes {
            // Liger's "all options" case, plus the plain one; a quarter of the rows ignored.
            for (name, cfg) in ce_configs(&mut rng, cols, 42, 1e-4, 30.0) {
                let reduction = cfg.reduction;
                let targets = ce_targets(&mut rng, rows, cols, cfg.ignore_index);
                let (x, xs) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * cols, -6.0, 6.0),
                    &[rows, cols],
                    dtype,
                )?;
                let t = Tensor::from_slice(engine, &targets, &[rows])?;
                let options = ce_options(engine, &cfg)?;
                let (out, saved) = loss::cross_entropy(&x, &t, &options)?;
                let want = r::cross_entropy(&xs, &targets, rows, cols, &cfg);
                let label = format!("{name} {reduction:?} {rows}x{cols} {dtype}");
                ce_output_cases(&mut cases, &label, &out, &want, f32_tol)?;
                if let Some(p) = &out.predicted {
                    let got: Vec<f64> = p.to_vec::<i32>()?.into_iter().map(f64::from).collect();
                    let want: Vec<f64> = want.predicted.iter().map(|&v| f64::from(v)).collect();
                    cases.push(case(
                        format!("{label} predicted"),
                        &got,
                        &want,
                        Tolerance::EXACT,
                    ));
                }
                let n = if reduction == Reduction::None {
                    rows
                } else {
                    1
                };
                let g = stored_values(&rng.vec(n, -2.0, 2.0), DType::F32);
                let shape: &[usize] = if reduction == Reduction::None {
                    &[rows]
                } else {
                    &[]
                };
                let (gt, _) = tensor_from_f64(engine, &g, shape, DType::F32)?;
                let dx = loss::cross_entropy_backward(&saved, Some(&gt))?;
                let want = r::cross_entropy_backward(&xs, &targets, rows, cols, &cfg, &g);
                cases.push(case(format!("{label} dx"), &dx.to_f64()?, &want, f32_tol));
            }
        }
    }
    Ok(cases)
}

/// The loss outputs, and the gradient the logits hold afterwards (unit cotangent, in the logits'
/// dtype): whole-chunk rows (the fused entry) and ragged ones (forward, backward, store).
fn check_cross_entropy_in_place(engine: &Engine) -> Result<Vec<Case>> {
    ce_gradient_checks(engine, 44, "gradient in the logits", |x, t, options| {
        let out = crate::loss::cross_entropy_in_place(x, t, options)?;
        Ok((Some(out), x.clone()))
    })
}

/// The gradient stored in the logits' dtype: 1,000 columns take `ce_bwd_n` in 16 bits, 100
/// the F32 gradient narrowed.
fn check_cross_entropy_backward_as(engine: &Engine) -> Result<Vec<Case>> {
    use crate::loss;
    ce_gradient_checks(
        engine,
        45,
        "gradient in the logits' dtype",
        |x, t, options| {
            let (_, saved) = loss::cross_entropy(x, t, options)?;
            Ok((
                None,
                loss::cross_entropy_backward_as(&saved, None, x.dtype())?,
            ))
        },
    )
}

/// Cases of a cross-entropy whose gradient (for a unit cotangent) comes back in the logits'
/// dtype: `run` gives the outputs (checked when present) and the gradient tensor, which is
/// checked against the reference at the logits' dtype's tolerance. Every dtype and option set.
fn ce_gradient_checks(
    engine: &Engine,
    seed: u64,
    what: &str,
    run: impl Fn(
        &crate::Tensor,
        &crate::Tensor,
        &crate::loss::CrossEntropyOptions,
    ) -> Result<(Option<crate::loss::CrossEntropyOutput>, crate::Tensor)>,
) -> Result<Vec<Case>> {
    use crate::Tensor;
    use crate::loss::Reduction;
    use crate::reference::loss as r;
    let mut rng = Rng::new(seed);
    let f32_tol = Tolerance::for_dtype(DType::F32);
    let mut cases = Vec::new();
    for (rows, cols) in [(7, 100), (4, 1000)] {
        for dtype in DType::FLOATS {
            for (name, cfg) in ce_configs(&mut rng, cols, 42, 1e-4, 30.0) {
                let reduction = cfg.reduction;
                let targets = ce_targets(&mut rng, rows, cols, cfg.ignore_index);
                let (x, xs) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * cols, -6.0, 6.0),
                    &[rows, cols],
                    dtype,
                )?;
                let t = Tensor::from_slice(engine, &targets, &[rows])?;
                let (out, dx) = run(&x, &t, &ce_options(engine, &cfg)?)?;
                let label = format!("{name} {reduction:?} {rows}x{cols} {dtype}");
                if let Some(out) = out {
                    let want = r::cross_entropy(&xs, &targets, rows, cols, &cfg);
                    ce_output_cases(&mut cases, &label, &out, &want, f32_tol)?;
                }
                let n = if reduction == Reduction::None {
                    rows
                } else {
                    1
                };
                let want =
                    r::cross_entropy_backward(&xs, &targets, rows, cols, &cfg, &vec![1.0; n]);
                cases.push(case(
                    format!("{label} {what}"),
                    &dx.to_f64()?,
                    &want,
                    Tolerance::for_dtype(dtype),
                ));
            }
        }
    }
    Ok(cases)
}

fn check_cross_entropy_soft(engine: &Engine) -> Result<Vec<Case>> {
    use crate::loss::{self, Reduction};
    use crate::reference::loss as r;
    let mut rng = Rng::new(43);
    let f32_tol = Tolerance::for_dtype(DType::F32);
    let mut cases = Vec::new();
    for (rows, cols) in LOSS_SHAPES {
        for dtype in DType::FLOATS {
            let (x, xs) = tensor_from_f64(
                engine,
                &rng.vec(rows * cols, -5.0, 5.0),
                &[rows, cols],
                dtype,
            )?;
            let probs = r::softmax(&rng.vec(rows * cols, -2.0, 2.0), rows, cols);
            let (t, ts) = tensor_from_f64(engine, &probs, &[rows, cols], dtype)?;
            for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
                let (out, saved) = loss::cross_entropy_soft(&x, &t, reduction)?;
                let want = r::cross_entropy_soft(&xs, &ts, rows, cols, reduction);
                let label = format!("{reduction:?} {rows}x{cols} {dtype}");
                cases.push(case(
                    format!("{label} loss"),
                    &out.loss.to_f64()?,
                    &want,
                    f32_tol,
                ));
                let dx = loss::cross_entropy_backward(&saved, None)?;
                let want = r::cross_entropy_soft_backward(
                    &xs,
                    &ts,
                    rows,
                    cols,
                    reduction,
                    &vec![1.0; want.len()],
                );
                cases.push(case(format!("{label} dx"), &dx.to_f64()?, &want, f32_tol));
            }
        }
    }
    Ok(cases)
}

/// (label, kind, input, target, with labels, reduction) of one divergence check.
type DivergenceRun = (
    String,
    crate::reference::loss::Divergence,
    Vec<f64>,
    Vec<f64>,
    bool,
    crate::loss::DivReduction,
);

#[derive(Clone, Copy)]
enum LossDivergence {
    Kl,
    Jsd,
    Tvd,
}

/// KL (log target, batch mean), JSD (β 0.5, labels with ignored rows) and TVD (sum) input
/// gradients stored in the input's dtype (`divergence_backward_as`): 16-bit rows of whole
/// chunks (704 columns) take `div_bwd_v`'s direct 16-bit stores, 37 columns the F32 gradient
/// narrowed; against the reference at the dtype's tolerance.
fn check_divergence_backward_as(engine: &Engine) -> Result<Vec<Case>> {
    use crate::loss::{self, DivReduction};
    use crate::reference::loss::{self as r, Divergence};
    let mut rng = Rng::new(49);
    let mut cases = Vec::new();
    for (rows, cols) in [(3, 704), (5, 37)] {
        let labels: Vec<i32> = (0..rows)
            .map(|i| if i % 2 == 1 { -100 } else { 0 })
            .collect();
        let lab = crate::Tensor::from_slice(engine, &labels, &[rows])?;
        for dtype in DType::FLOATS {
            let lx = r::log_softmax(&rng.vec(rows * cols, -3.0, 3.0), rows, cols);
            let lt = r::log_softmax(&rng.vec(rows * cols, -3.0, 3.0), rows, cols);
            let exp = |v: &[f64]| v.iter().map(|x| x.exp()).collect::<Vec<f64>>();
            let runs = [
                (
                    Divergence::Kl { log_target: true },
                    lx.clone(),
                    lt.clone(),
                    false,
                    DivReduction::BatchMean,
                ),
                (
                    Divergence::Jsd { beta: 0.5 },
                    lx.clone(),
                    lt.clone(),
                    true,
                    DivReduction::BatchMean,
                ),
                (Divergence::Tvd, exp(&lx), exp(&lt), true, DivReduction::Sum),
            ];
            for (kind, xv, tv, use_labels, reduction) in runs {
                let (x, xs) = tensor_from_f64(engine, &xv, &[rows, cols], dtype)?;
                let (t, ts) = tensor_from_f64(engine, &tv, &[rows, cols], dtype)?;
                let l = use_labels.then_some(&lab);
                let (_, saved) = match kind {
                    Divergence::Kl { log_target } => loss::kl_div(&x, &t, log_target, reduction)?,
                    Divergence::Jsd { beta } => loss::jsd(&x, &t, beta as f32, l, -100)?,
                    Divergence::Tvd => loss::tvd(&x, &t, reduction, l, -100)?,
                };
                let dx = loss::divergence_backward_as(&saved, None, dtype)?;
                let lref = use_labels.then_some(&labels[..]);
                let want = r::divergence_backward(
                    kind,
                    &xs,
                    &ts,
                    rows,
                    cols,
                    lref,
                    -100,
                    reduction,
                    &[1.0],
                );
                cases.push(case(
                    format!("{kind:?} {rows}x{cols} {dtype} dx"),
                    &dx.to_f64()?,
                    &crate::gradcheck::stored_values(&want, dtype),
                    Tolerance::for_dtype(dtype),
                ));
            }
        }
    }
    Ok(cases)
}

fn check_divergence(engine: &Engine, which: LossDivergence) -> Result<Vec<Case>> {
    use crate::Tensor;
    use crate::loss::{self, DivReduction};
    use crate::reference::loss::{self as r, Divergence};
    let mut rng = Rng::new(44);
    let mut cases = Vec::new();
    for (rows, cols) in LOSS_SHAPES {
        for dtype in DType::FLOATS {
            let lx = r::log_softmax(&rng.vec(rows * cols, -3.0, 3.0), rows, cols);
            let lt = r::log_softmax(&rng.vec(rows * cols, -3.0, 3.0), rows, cols);
            let labels: Vec<i32> = (0..rows)
                .map(|i| if i % 2 == 1 { -100 } else { 0 })
                .collect();
            let lab = Tensor::from_slice(engine, &labels, &[rows])?;
            let runs: Vec<DivergenceRun> = match which {
                LossDivergence::Kl => [
                    DivReduction::None,
                    DivReduction::Sum,
                    DivReduction::Mean,
                    DivReduction::BatchMean,
                ]
                .into_iter()
                .flat_map(|red| {
                    let p: Vec<f64> = lt.iter().map(|v| v.exp()).collect();
                    [
                        (
                            format!("{red:?}"),
                            Divergence::Kl { log_target: false },
                            lx.clone(),
                            p,
                            false,
                            red,
                        ),
                        (
                            format!("{red:?} log_target"),
                            Divergence::Kl { log_target: true },
                            lx.clone(),
                            lt.clone(),
                            false,
                            red,
                        ),
                    ]
                })
                .collect(),
                LossDivergence::Jsd => [0.0, 0.5, 1.0]
                    .into_iter()
                    .map(|beta| {
                        (
                            format!("beta {beta} labels"),
                            Divergence::Jsd { beta },
                            lx.clone(),
                            lt.clone(),
                            true,
                            DivReduction::BatchMean,
                        )
                    })
                    .collect(),
                LossDivergence::Tvd => {
                    let p: Vec<f64> = lx.iter().map(|v| v.exp()).collect();
                    let q: Vec<f64> = lt.iter().map(|v| v.exp()).collect();
                    [
                        DivReduction::None,
                        DivReduction::Sum,
                        DivReduction::Mean,
                        DivReduction::BatchMean,
                    ]
                    .into_iter()
                    .map(|red| {
                        (
                            format!("{red:?} labels"),
                            Divergence::Tvd,
                            p.clone(),
                            q.clone(),
                            true,
                            red,
                        )
                    })
                    .collect()
                }
            };
            for (name, kind, xv, tv, use_labels, reduction) in runs {
                let (x, xs) = tensor_from_f64(engine, &xv, &[rows, cols], dtype)?;
                let (t, ts) = tensor_from_f64(engine, &tv, &[rows, cols], dtype)?;
                let l = use_labels.then_some(&lab);
                let (loss_value, saved) = match kind {
                    Divergence::Kl { log_target } => loss::kl_div(&x, &t, log_target, reduction)?,
                    Divergence::Jsd { beta } => loss::jsd(&x, &t, beta as f32, l, -100)?,
                    Divergence::Tvd => loss::tvd(&x, &t, reduction, l, -100)?,
                };
                let lref = use_labels.then_some(&labels[..]);
                let want = r::divergence(kind, &xs, &ts, rows, cols, lref, -100, reduction);
                // Row sums of `cols` terms in FP32: the absolute budget grows with the row.
                let tol = Tolerance {
                    abs: 1e-5 * (1.0 + cols as f64 / 256.0),
                    ..Tolerance::for_dtype(DType::F32)
                };
                let label = format!("{name} {rows}x{cols} {dtype}");
                cases.push(case(
                    format!("{label} loss"),
                    &loss_value.to_f64()?,
                    &want,
                    tol,
                ));
                let dx = loss::divergence_backward(&saved, None)?;
                let want = r::divergence_backward(
                    kind,
                    &xs,
                    &ts,
                    rows,
                    cols,
                    lref,
                    -100,
                    reduction,
                    &vec![1.0; want.len()],
                );
                cases.push(case(
                    format!("{label} dx"),
                    &dx.to_f64()?,
                    &want,
                    Tolerance::for_dtype(DType::F32),
                ));
            }
        }
    }
    Ok(cases)
}
