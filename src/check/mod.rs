//! The gradient-check report: one check per operator wgrad ships, each running the GPU op on
//! this machine's adapter against its f64 reference (forward and every gradient) for every
//! storage dtype. The `check` example prints it; a test makes sure every registered kernel is
//! covered by some check.

mod attention;
mod attn_res;
mod embedding;
mod expr;
mod fused_linear;
mod gated_delta;
mod grpo;
mod loss;
mod matmul;
mod mhc;
mod mlp;
mod model;
mod moe;
mod mta;
mod norm;
mod optim;
mod pointwise;
mod preference;
mod vocab_parallel;

use crate::gradcheck::{Comparison, Rng, Tolerance, compare, stored_values, tensor_from_f64};
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
            name: "binding_windows",
            kernels: &["loss", "activation", "cast"],
            run: check_binding_windows,
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
            name: "subgroup_rows",
            kernels: &[
                "norm_subgroup",
                "norm_mid_subgroup",
                "norm_wide_subgroup",
                "loss_subgroup",
                "loss_rows_subgroup",
            ],
            run: check_subgroup_rows,
        },
        OperatorCheck {
            name: "tree_rows",
            kernels: &["norm", "norm_mid", "norm_wide", "loss", "loss_rows"],
            run: check_tree_rows,
        },
    ]
    .into_iter()
    .chain(norm::operators())
    .chain(pointwise::operators())
    .chain(loss::operators())
    .chain(grpo::operators())
    .chain(gated_delta::operators())
    .chain(attention::operators())
    .chain(matmul::operators())
    .chain(mlp::operators())
    .chain(fused_linear::operators())
    .chain(preference::operators())
    .chain(embedding::operators())
    .chain(optim::operators())
    .chain(model::operators())
    .chain(expr::operators())
    .chain(mta::operators())
    .chain(attn_res::operators())
    .chain(mhc::operators())
    .chain(vocab_parallel::operators())
    .chain(moe::operators())
    .collect()
}

fn case(label: String, got: &[f64], want: &[f64], tol: Tolerance) -> Case {
    Case {
        label,
        comparison: compare(got, want, tol),
    }
}

/// The plain cross-entropy configuration, then the "all options" one (label smoothing 0.1,
/// `ignore_index`, z-loss, softcap and class weights in [0.2, 1.5) drawn from `rng`), each
/// with every reduction, as (name, configuration) pairs.
fn ce_configs(
    rng: &mut Rng,
    classes: usize,
    ignore_index: i32,
    z_loss: f32,
    softcap: f64,
) -> Vec<(&'static str, reference::loss::CrossEntropyConfig)> {
    use crate::loss::Reduction;
    use reference::loss::CrossEntropyConfig;
    let all_options = CrossEntropyConfig {
        ignore_index,
        label_smoothing: f64::from(0.1f32),
        z_loss: f64::from(z_loss),
        softcap: Some(softcap),
        weight: Some(stored_values(&rng.vec(classes, 0.2, 1.5), DType::F32)),
        reduction: Reduction::Mean,
    };
    let mut configs = Vec::new();
    for (name, cfg) in [
        ("plain", CrossEntropyConfig::default()),
        ("all options", all_options),
    ] {
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            configs.push((
                name,
                CrossEntropyConfig {
                    reduction,
                    ..cfg.clone()
                },
            ));
        }
    }
    configs
}

/// Hard cross-entropy targets in [0, classes), drawn from `rng`, with every fourth row
/// (index 1 mod 4) set to `ignore_index`.
fn ce_targets(rng: &mut Rng, rows: usize, classes: usize, ignore_index: i32) -> Vec<i32> {
    (0..rows)
        .map(|i| {
            if i % 4 == 1 {
                ignore_index
            } else {
                (rng.next_u32() as usize % classes) as i32
            }
        })
        .collect()
}

/// The GPU cross-entropy options of a reference configuration (class weights uploaded as
/// F32, targets checked).
fn ce_options(
    engine: &Engine,
    cfg: &reference::loss::CrossEntropyConfig,
) -> Result<crate::loss::CrossEntropyOptions> {
    Ok(crate::loss::CrossEntropyOptions {
        ignore_index: cfg.ignore_index,
        label_smoothing: cfg.label_smoothing as f32,
        z_loss: cfg.z_loss as f32,
        softcap: cfg.softcap.map(|c| c as f32),
        weight: match &cfg.weight {
            Some(w) => Some(tensor_from_f64(engine, w, &[w.len()], DType::F32)?.0),
            None => None,
        },
        reduction: cfg.reduction,
        ..Default::default()
    })
}

/// The loss, z-loss and accuracy cases of a cross-entropy output against its reference.
fn ce_output_cases(
    cases: &mut Vec<Case>,
    label: &str,
    out: &crate::loss::CrossEntropyOutput,
    want: &reference::loss::CrossEntropyResult,
    tol: Tolerance,
) -> Result<()> {
    cases.push(case(
        format!("{label} loss"),
        &out.loss.to_f64()?,
        &want.loss,
        tol,
    ));
    cases.push(case(
        format!("{label} z_loss"),
        &out.z_loss.to_f64()?,
        &want.z_loss,
        tol,
    ));
    cases.push(case(
        format!("{label} accuracy"),
        &out.accuracy.to_f64()?,
        &[want.accuracy],
        tol,
    ));
    Ok(())
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

/// Tensors past one storage binding: the ops that run in windows of rows (cross-entropy with
/// every option, also in place, softmax, KL, packed SwiGLU, cast) on an engine of the same
/// device whose bindings are capped at 64 KiB, against this engine's one-binding results: the
/// same bits. Windows start at multiples of the binding alignment, so a launch windowing 4-byte
/// rows (targets) beside F32 rows of 1,024 values needs bindings of `alignment · 1,024` bytes:
/// on devices whose alignment asks for more than 64 KiB (WebGPU's default, 256 bytes) the cap
/// is that, and the rows as many more.
fn check_binding_windows(engine: &Engine) -> Result<Vec<Case>> {
    use crate::activation;
    use crate::loss::{self, CrossEntropyOptions, DivReduction, Reduction};
    let cols = 1024;
    let cap = (64u64 << 10).max(engine.binding_alignment() * cols as u64);
    let capped = engine.with_binding_limit(cap)?;
    let rows = 90 * (cap >> 16) as usize;
    let mut rng = Rng::new(31);
    let xs = rng.vec(rows * cols, -6.0, 6.0);
    let ts = rng.vec(rows * cols, 0.0, 2.0 / cols as f64);
    let targets: Vec<i32> = (0..rows)
        .map(|r| {
            if r % 7 == 3 {
                -100
            } else {
                ((r * 389) % cols) as i32
            }
        })
        .collect();
    let weights: Vec<f32> = (0..cols).map(|c| 0.5 + (c % 4) as f32 * 0.25).collect();
    // Every output of every op on `e`, by name.
    let run = |e: &Engine| -> Result<Vec<(String, Vec<f64>)>> {
        let dt = DType::BF16;
        let x = tensor_from_f64(e, &xs, &[rows, cols], dt)?.0;
        let t = tensor_from_f64(e, &ts, &[rows, cols], dt)?.0;
        let y = crate::Tensor::from_slice(e, &targets, &[rows])?;
        let opts = CrossEntropyOptions {
            label_smoothing: 0.1,
            z_loss: 1e-4,
            softcap: Some(30.0),
            weight: Some(crate::Tensor::from_slice(e, &weights, &[cols])?),
            reduction: Reduction::Mean,
            ..Default::default()
        };
        let (ce, saved) = loss::cross_entropy(&x, &y, &opts)?;
        let (sm, sm_saved) = loss::softmax(&x)?;
        let (kl, kl_saved) = loss::kl_div(&x, &t, true, DivReduction::BatchMean)?;
        let (sw, sw_saved) = activation::swiglu_packed(&x)?;
        let over = tensor_from_f64(e, &xs, &[rows, cols], dt)?.0;
        let in_place = loss::cross_entropy_in_place(&over, &y, &opts)?;
        // The output doubles as the SwiGLU cotangent.
        let sw_dy = sw.clone();
        let outputs = [
            ("cross_entropy loss", ce.loss),
            (
                "cross_entropy dx",
                loss::cross_entropy_backward(&saved, None)?,
            ),
            (
                "cross_entropy dx bf16",
                loss::cross_entropy_backward_as(&saved, None, dt)?,
            ),
            ("cross_entropy_in_place loss", in_place.loss),
            ("cross_entropy_in_place gradient", over),
            ("softmax y", sm),
            ("softmax dx", loss::softmax_backward(&sm_saved, &t)?),
            ("kl_div", kl),
            ("kl_div dx", loss::divergence_backward(&kl_saved, None)?),
            ("swiglu_packed y", sw),
            (
                "swiglu_packed dx",
                activation::backward(&sw_saved, &sw_dy)?.dgate,
            ),
            ("cast f32", cast::cast(&x, DType::F32)?),
        ];
        outputs
            .into_iter()
            .map(|(name, v)| Ok((name.to_string(), v.to_f64()?)))
            .collect()
    };
    let want = run(engine)?;
    let got = run(&capped)?;
    Ok(want
        .iter()
        .zip(&got)
        .map(|((name, w), (_, g))| {
            case(
                format!("{name} {rows}x{cols} bf16, {} KiB bindings", cap >> 10),
                g,
                w,
                Tolerance::EXACT,
            )
        })
        .collect())
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

/// A check's run function.
type CheckFn = fn(&Engine) -> Result<Vec<Case>>;

/// The register-resident norm and softmax rows with every reduction by subgroup shuffles
/// (`reduce::force_subgroup_rows(Some(true))`): the RMSNorm, LayerNorm, add+RMSNorm, softmax
/// and log-softmax checks (16-bit gradients included) run again that way. Without `SUBGROUP`
/// on the adapter the cases are those of the trees.
fn check_subgroup_rows(engine: &Engine) -> Result<Vec<Case>> {
    let tag = match reduce::subgroup_width(engine) {
        Some(w) => format!("subgroups of {w}"),
        None => "no subgroups: trees".to_string(),
    };
    check_row_reductions(engine, true, &tag)
}

/// The same checks with every reduction of the register rows by the fan-in-8 workgroup trees
/// (`reduce::force_subgroup_rows(Some(false))`): the path of adapters without `SUBGROUP`, and
/// of the launches that prefer the trees.
fn check_tree_rows(engine: &Engine) -> Result<Vec<Case>> {
    check_row_reductions(engine, false, "trees")
}

/// The register-row checks with the subgroup switch forced to `subgroups`, labels tagged.
fn check_row_reductions(engine: &Engine, subgroups: bool, tag: &str) -> Result<Vec<Case>> {
    reduce::force_subgroup_rows(Some(subgroups));
    let runs: [CheckFn; 7] = [
        norm::check_rms_norm,
        norm::check_layer_norm,
        norm::check_add_rms_norm,
        norm::check_norm_backward_as,
        |e| loss::check_softmax(e, false),
        |e| loss::check_softmax(e, true),
        loss::check_softmax_backward_as,
    ];
    let outcome: Result<Vec<Vec<Case>>> = runs.iter().map(|run| run(engine)).collect();
    reduce::force_subgroup_rows(None);
    let mut cases = outcome?.concat();
    for c in &mut cases {
        c.label = format!("{tag}: {}", c.label);
    }
    Ok(cases)
}
