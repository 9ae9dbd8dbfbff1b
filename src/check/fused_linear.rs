//! Checks of the fused linear family (`crate::fused_linear`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "fused_linear_cross_entropy",
            kernels: &["fused_linear", "loss", "reduce"],
            run: check_fused_linear_cross_entropy,
        },
        OperatorCheck {
            name: "fused_linear_cross_entropy_scaled",
            kernels: &["fused_linear", "loss", "reduce"],
            run: check_fused_linear_cross_entropy_scaled,
        },
        OperatorCheck {
            name: "fused_linear_distillation",
            kernels: &["fused_linear", "loss", "reduce"],
            run: check_fused_linear_distillation,
        },
        OperatorCheck {
            name: "fused_linear_distillation_none",
            kernels: &["fused_linear", "loss", "reduce"],
            run: check_fused_linear_distillation_none,
        },
    ]
}

/// A linear head on the GPU and the values it holds.
struct HeadData {
    x: crate::Tensor,
    w: crate::Tensor,
    b: Option<crate::Tensor>,
    xs: Vec<f64>,
    ws: Vec<f64>,
    bs: Option<Vec<f64>>,
    hidden: usize,
}

impl HeadData {
    #[allow(clippy::too_many_arguments)]
    fn new(
        engine: &Engine,
        rng: &mut Rng,
        rows: usize,
        hidden: usize,
        vocab: usize,
        bias: bool,
        dtype: DType,
    ) -> Result<HeadData> {
        let (x, xs) = tensor_from_f64(
            engine,
            &rng.vec(rows * hidden, -1.0, 1.0),
            &[rows, hidden],
            dtype,
        )?;
        let (w, ws) = tensor_from_f64(
            engine,
            &rng.vec(vocab * hidden, -0.5, 0.5),
            &[vocab, hidden],
            dtype,
        )?;
        let (b, bs) = if bias {
            let (b, bs) = tensor_from_f64(engine, &rng.vec(vocab, -0.5, 0.5), &[vocab], dtype)?;
            (Some(b), Some(bs))
        } else {
            (None, None)
        };
        Ok(HeadData {
            x,
            w,
            b,
            xs,
            ws,
            bs,
            hidden,
        })
    }

    fn gpu(&self) -> crate::fused_linear::LinearHead<'_> {
        crate::fused_linear::LinearHead {
            input: &self.x,
            weight: &self.w,
            bias: self.b.as_ref(),
        }
    }

    fn reference(&self) -> reference::fused_linear::Head<'_> {
        reference::fused_linear::Head {
            x: &self.xs,
            w: &self.ws,
            bias: self.bs.as_deref(),
            hidden: self.hidden,
        }
    }
}

fn gradient_cases(
    cases: &mut Vec<Case>,
    label: &str,
    got: &crate::fused_linear::FusedLinearGradients,
    want: &reference::fused_linear::LinearGradients,
) -> Result<()> {
    let tol = Tolerance::for_dtype(DType::F32);
    // F32, or (`Chunking::head_dtype_gradients`) an FP32 sum rounded once to the head's
    // 16-bit dtype: one unit in the last place of the reference rounded the same way.
    let rounded = |t: &crate::Tensor, want: &[f64]| -> Result<(Vec<f64>, Vec<f64>, Tolerance)> {
        let got = t.to_f64()?;
        Ok(match t.dtype() {
            DType::F32 => (got, want.to_vec(), tol),
            dtype => {
                let rel = if dtype == DType::BF16 {
                    2f64.powi(-7)
                } else {
                    2f64.powi(-10)
                };
                let unit = Tolerance {
                    rel,
                    rel_l2: rel,
                    ..tol
                };
                (got, crate::gradcheck::stored_values(want, dtype), unit)
            }
        })
    };
    for (name, t, want) in [
        ("d input", &got.input, &want.input),
        ("d weight", &got.weight, &want.weight),
    ] {
        let (got, want, tol) = rounded(t, want)?;
        cases.push(case(format!("{label} {name}"), &got, &want, tol));
    }
    if let Some(db) = &got.bias {
        cases.push(case(
            format!("{label} d bias"),
            &db.to_f64()?,
            &want.bias,
            tol,
        ));
    }
    Ok(())
}

/// Liger's ragged FLCE shape (B·T = 4·47 rows, H 31, V 123) in chunks of 50 rows, every
/// storage dtype, plain and with every option (a quarter of the targets ignored), each
/// reduction: loss, z-loss, accuracy and the gradients of x, W and the bias; then BF16 and
/// F16 heads (H 32, V 124) with `Chunking::head_dtype_gradients` in blocks of 40 columns, then
/// F32 and BF16 heads with `Chunking::block_statistics` too (V 123 and 124). Where the engine
/// runs tensor cores, the same for an F16 head of 192 rows, H 32, V 128 with
/// `Chunking::tensor_cores` (the loss values within `matmul::tensor_core_tolerance`).
fn check_fused_linear_cross_entropy(engine: &Engine) -> Result<Vec<Case>> {
    let (rows, hidden, vocab) = (4 * 47, 31, 123);
    let mut rng = Rng::new(60);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let head = HeadData::new(engine, &mut rng, rows, hidden, vocab, true, dtype)?;
        let plain = (50, false, Tolerance::for_dtype(DType::F32), None);
        flce_config_cases(
            engine,
            &mut rng,
            &head,
            (rows, vocab),
            plain,
            &dtype.to_string(),
            &mut cases,
        )?;
    }
    // Gradients in the head's dtypes (an even hidden size for 16-bit heads; a vocabulary of
    // whole 4-column groups, so the logit gradients are written over the logits), blocks of 40
    // columns; then with block statistics (no row chunks, every logits product over all rows;
    // F32 with a ragged last block of 3 columns).
    let heads = [
        (DType::BF16, 32, 124, false),
        (DType::F16, 32, 124, false),
        (DType::F32, 31, 123, true),
        (DType::BF16, 32, 124, true),
    ];
    for (dtype, hidden, vocab, block_statistics) in heads {
        let head = HeadData::new(engine, &mut rng, rows, hidden, vocab, true, dtype)?;
        let f32_tol = Tolerance::for_dtype(DType::F32);
        let blocked = (50, false, f32_tol, Some((40, block_statistics)));
        let label = if block_statistics {
            "block statistics"
        } else {
            "head-dtype gradients"
        };
        flce_config_cases(
            engine,
            &mut rng,
            &head,
            (rows, vocab),
            blocked,
            &format!("{dtype} {label}"),
            &mut cases,
        )?;
    }
    if crate::matmul::tensor_cores(engine) {
        // F16 head with the logits products on tensor cores (rows, hidden and vocab of whole
        // 16-byte rows), every option, in chunks of 48 rows.
        let (rows, hidden, vocab) = (4 * 48, 32, 128);
        let head = HeadData::new(engine, &mut rng, rows, hidden, vocab, true, DType::F16)?;
        let tc = (48, true, crate::matmul::tensor_core_tolerance(hidden), None);
        flce_config_cases(
            engine,
            &mut rng,
            &head,
            (rows, vocab),
            tc,
            "f16 tensor cores",
            &mut cases,
        )?;
    }
    Ok(cases)
}

/// One head's cases of [`check_fused_linear_cross_entropy`]: each configuration of
/// `ce_configs` in chunks of `chunk.0` rows (`chunk.1`: `Chunking::tensor_cores`), the loss
/// values within `chunk.2`, the gradients under the F32 policy (`chunk.3`: a vocabulary block,
/// `Chunking::head_dtype_gradients`, 16-bit gradients within one unit of the reference, and
/// whether `Chunking::block_statistics`).
fn flce_config_cases(
    engine: &Engine,
    rng: &mut Rng,
    head: &HeadData,
    (rows, vocab): (usize, usize),
    chunk: (usize, bool, Tolerance, Option<(usize, bool)>),
    suffix: &str,
    cases: &mut Vec<Case>,
) -> Result<()> {
    use crate::Tensor;
    use crate::fused_linear::{
        Chunking, FusedLinearCrossEntropyOptions, fused_linear_cross_entropy,
        fused_linear_cross_entropy_backward,
    };
    use crate::loss::Reduction;
    let hidden = head.hidden;
    for (name, cfg) in ce_configs(rng, vocab, 5, 1e-3, 3.0) {
        let reduction = cfg.reduction;
        let targets = ce_targets(rng, rows, vocab, cfg.ignore_index);
        let t = Tensor::from_slice(engine, &targets, &[rows])?;
        let options = FusedLinearCrossEntropyOptions {
            cross_entropy: ce_options(engine, &cfg)?,
            chunking: Chunking {
                chunk_rows: Some(chunk.0),
                memory_budget: None,
                tensor_cores: chunk.1,
                tensor_core_gradients: false,
                head_dtype_gradients: chunk.3.is_some(),
                vocab_block: chunk.3.map(|b| b.0),
                block_statistics: chunk.3.is_some_and(|b| b.1),
            },
            gradients_in_forward: true,
            ..FusedLinearCrossEntropyOptions::default()
        };
        let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options)?;
        let want = reference::fused_linear::fused_linear_cross_entropy(
            head.reference(),
            &targets,
            rows,
            vocab,
            &cfg,
        );
        let label = format!("{name} {reduction:?} {rows}x{hidden}->{vocab} {suffix}");
        ce_output_cases(cases, &label, &out, &want, chunk.2)?;
        let ones = vec![
            1.0;
            if reduction == Reduction::None {
                rows
            } else {
                1
            }
        ];
        let got = fused_linear_cross_entropy_backward(&saved, None)?;
        let want = reference::fused_linear::fused_linear_cross_entropy_backward(
            head.reference(),
            &targets,
            rows,
            vocab,
            &cfg,
            &ones,
        );
        gradient_cases(cases, &label, &got, &want)?;
    }
    Ok(())
}

/// Distillation with each soft term (JSD β = 0.5, KL, TVD, cosine β = 0.5) at temperature 2, with labels (a
/// quarter ignored) and a hard-label term of weight 0.25, every storage dtype: the three loss
/// values and the student's gradients.
fn check_fused_linear_distillation(engine: &Engine) -> Result<Vec<Case>> {
    use crate::Tensor;
    use crate::fused_linear::{
        Chunking, DistillationOptions, SoftLoss, fused_linear_distillation,
        fused_linear_distillation_backward,
    };
    use reference::fused_linear::DistillationConfig;
    let (rows, vocab) = (37, 96);
    let mut rng = Rng::new(61);
    let mut cases = Vec::new();
    // Row sums of `vocab` terms: the divergence tolerance of the loss family.
    let loss_tol = Tolerance {
        abs: 1e-5 * (1.0 + vocab as f64 / 256.0),
        ..Tolerance::for_dtype(DType::F32)
    };
    for dtype in DType::FLOATS {
        let student = HeadData::new(engine, &mut rng, rows, 24, vocab, true, dtype)?;
        let teacher = HeadData::new(engine, &mut rng, rows, 40, vocab, false, dtype)?;
        let labels: Vec<i32> = (0..rows)
            .map(|i| {
                if i % 4 == 2 {
                    -100
                } else {
                    (rng.next_u32() as usize % vocab) as i32
                }
            })
            .collect();
        let lt = Tensor::from_slice(engine, &labels, &[rows])?;
        for soft in [
            SoftLoss::Jsd { beta: 0.5 },
            SoftLoss::Kl,
            SoftLoss::Tvd,
            SoftLoss::Cosine { beta: 0.5 },
        ] {
            let options = DistillationOptions {
                soft,
                temperature: 2.0,
                weight_hard: 0.25,
                weight_soft: 0.75,
                chunking: Chunking {
                    chunk_rows: Some(16),
                    memory_budget: None,
                    tensor_cores: false,
                    tensor_core_gradients: false,
                    ..Chunking::default()
                },
                ..DistillationOptions::default()
            };
            let cfg = DistillationConfig::of(&options);
            let (out, saved) =
                fused_linear_distillation(student.gpu(), teacher.gpu(), Some(&lt), &options)?;
            let want = reference::fused_linear::fused_linear_distillation(
                student.reference(),
                teacher.reference(),
                Some(&labels),
                rows,
                vocab,
                &cfg,
            );
            let label = format!("{soft:?} T2 hard 0.25 {rows}x24->{vocab} {dtype}");
            for (what, got, want) in [
                ("loss", &out.loss, want.loss),
                ("hard", &out.hard_loss, want.hard),
                ("soft", &out.soft_loss, want.soft),
            ] {
                cases.push(case(
                    format!("{label} {what}"),
                    &got.to_f64()?,
                    &[want],
                    loss_tol,
                ));
            }
            let got = fused_linear_distillation_backward(&saved, None)?;
            let want = reference::fused_linear::fused_linear_distillation_backward(
                student.reference(),
                teacher.reference(),
                Some(&labels),
                rows,
                vocab,
                &cfg,
                1.0,
            );
            gradient_cases(&mut cases, &label, &got, &want)?;
        }
    }
    Ok(cases)
}

/// The scaled fused linear cross-entropy: temperature 1.7, the entropy output, plain and with
/// every option (a quarter of the targets ignored), each reduction, every storage dtype
/// (B·T = 60 rows, H 19, V 70, chunks of 16): loss, z-loss, accuracy, entropy, and the
/// gradients of x, W and the bias for a loss cotangent and an entropy cotangent together.
fn check_fused_linear_cross_entropy_scaled(engine: &Engine) -> Result<Vec<Case>> {
    use crate::Tensor;
    use crate::fused_linear::{
        Chunking, FusedLinearCrossEntropyOptions, fused_linear_cross_entropy,
        fused_linear_cross_entropy_backward_with_entropy,
    };
    use crate::loss::Reduction;
    let (rows, hidden, vocab) = (60, 19, 70);
    let temperature = 1.7f32;
    let mut rng = Rng::new(62);
    let f32_tol = Tolerance::for_dtype(DType::F32);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let head = HeadData::new(engine, &mut rng, rows, hidden, vocab, true, dtype)?;
        for (name, cfg) in ce_configs(&mut rng, vocab, 5, 1e-3, 3.0) {
            let reduction = cfg.reduction;
            let targets = ce_targets(&mut rng, rows, vocab, cfg.ignore_index);
            let t = Tensor::from_slice(engine, &targets, &[rows])?;
            let options = FusedLinearCrossEntropyOptions {
                cross_entropy: ce_options(engine, &cfg)?,
                chunking: Chunking {
                    chunk_rows: Some(16),
                    memory_budget: None,
                    tensor_cores: false,
                    tensor_core_gradients: false,
                    ..Chunking::default()
                },
                temperature,
                return_entropy: true,
                ..FusedLinearCrossEntropyOptions::default()
            };
            let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options)?;
            let (want, want_h) = reference::fused_linear::fused_linear_cross_entropy_scaled(
                head.reference(),
                &targets,
                rows,
                vocab,
                &cfg,
                f64::from(temperature),
            );
            let label = format!("{name} {reduction:?} T1.7 {rows}x{hidden}->{vocab} {dtype}");
            ce_output_cases(&mut cases, &label, &out, &want, f32_tol)?;
            if let Some(h) = &out.entropy {
                cases.push(case(
                    format!("{label} entropy"),
                    &h.to_f64()?,
                    &want_h,
                    f32_tol,
                ));
            }
            let n_loss = if reduction == Reduction::None {
                rows
            } else {
                1
            };
            let loss_shape: &[usize] = if reduction == Reduction::None {
                &[rows]
            } else {
                &[]
            };
            let (ct, cs) =
                tensor_from_f64(engine, &rng.vec(n_loss, -1.0, 1.0), loss_shape, DType::F32)?;
            let (et, es) = tensor_from_f64(engine, &rng.vec(rows, -1.0, 1.0), &[rows], DType::F32)?;
            let got =
                fused_linear_cross_entropy_backward_with_entropy(&saved, Some(&ct), Some(&et))?;
            let want = reference::fused_linear::fused_linear_cross_entropy_scaled_backward(
                head.reference(),
                &targets,
                rows,
                vocab,
                &cfg,
                f64::from(temperature),
                &cs,
                Some(&es),
            );
            gradient_cases(&mut cases, &label, &got, &want)?;
        }
    }
    Ok(cases)
}

/// Distillation with reduction none (per-row losses and cotangents): each soft term at
/// temperature 2 with a hard-label term of weight 0.25 and a quarter of the labels ignored,
/// every storage dtype: the three per-row loss vectors and the student's gradients for random
/// per-row cotangents.
fn check_fused_linear_distillation_none(engine: &Engine) -> Result<Vec<Case>> {
    use crate::Tensor;
    use crate::fused_linear::{
        Chunking, DistillationOptions, DistillationReduction, SoftLoss, fused_linear_distillation,
        fused_linear_distillation_backward,
    };
    use reference::fused_linear::DistillationConfig;
    let (rows, vocab) = (29, 64);
    let mut rng = Rng::new(63);
    let mut cases = Vec::new();
    let loss_tol = Tolerance {
        abs: 1e-5 * (1.0 + vocab as f64 / 256.0),
        ..Tolerance::for_dtype(DType::F32)
    };
    for dtype in DType::FLOATS {
        let student = HeadData::new(engine, &mut rng, rows, 24, vocab, true, dtype)?;
        let teacher = HeadData::new(engine, &mut rng, rows, 40, vocab, false, dtype)?;
        let labels = ce_targets(&mut rng, rows, vocab, -100);
        let lt = Tensor::from_slice(engine, &labels, &[rows])?;
        for soft in [
            SoftLoss::Jsd { beta: 0.5 },
            SoftLoss::Kl,
            SoftLoss::Tvd,
            SoftLoss::Cosine { beta: 0.5 },
        ] {
            let options = DistillationOptions {
                soft,
                temperature: 2.0,
                weight_hard: 0.25,
                weight_soft: 0.75,
                reduction: DistillationReduction::None,
                chunking: Chunking {
                    chunk_rows: Some(8),
                    memory_budget: None,
                    tensor_cores: false,
                    tensor_core_gradients: false,
                    ..Chunking::default()
                },
                ..DistillationOptions::default()
            };
            let cfg = DistillationConfig::of(&options);
            let (out, saved) =
                fused_linear_distillation(student.gpu(), teacher.gpu(), Some(&lt), &options)?;
            let want = reference::fused_linear::fused_linear_distillation_rows(
                student.reference(),
                teacher.reference(),
                Some(&labels),
                rows,
                vocab,
                &cfg,
            );
            let label = format!("{soft:?} none T2 hard 0.25 {rows}x24->{vocab} {dtype}");
            let loss: Vec<f64> = want.iter().map(|r| r.loss).collect();
            let hard: Vec<f64> = want.iter().map(|r| r.hard).collect();
            let soft_rows: Vec<f64> = want.iter().map(|r| r.soft).collect();
            for (what, got, want) in [
                ("loss", &out.loss, &loss),
                ("hard", &out.hard_loss, &hard),
                ("soft", &out.soft_loss, &soft_rows),
            ] {
                cases.push(case(
                    format!("{label} {what}"),
                    &got.to_f64()?,
                    want,
                    loss_tol,
                ));
            }
            let (ct, cs) = tensor_from_f64(engine, &rng.vec(rows, -1.0, 1.0), &[rows], DType::F32)?;
            let got = fused_linear_distillation_backward(&saved, Some(&ct))?;
            let want = reference::fused_linear::fused_linear_distillation_rows_backward(
                student.reference(),
                teacher.reference(),
                Some(&labels),
                rows,
                vocab,
                &cfg,
                &cs,
            );
            gradient_cases(&mut cases, &label, &got, &want)?;
        }
    }
    Ok(cases)
}
