//! The fused linear family (`wgrad::fused_linear`) against the f64 references of
//! `wgrad::reference::fused_linear` (materialized logits, then the loss references):
//! fused linear cross-entropy with every cross-entropy option alone and together (up to half
//! of the targets ignored), every reduction, explicit cotangents, with and without a bias, in
//! every storage dtype, on Liger's test shapes scaled for a software adapter; distillation
//! with JSD (β = 0, 0.5, 1), KL and TVD soft terms, temperatures, labels and a hard-label
//! term; several chunk sizes agreeing with each other, bit-identical reruns at a fixed chunk
//! size, the peak memory staying at the chunk bound, empty batches, and every documented bad
//! input's error; `Chunking::tensor_cores` (F32 heads unchanged, F16 heads refused without
//! tensor cores, and against the reference or the FP32 path where the engine has them). The
//! reference backwards are checked by finite differences.
//!
//! Tolerance: `Tolerance::for_dtype(F32)` for every loss and gradient (all F32; references use
//! the stored 16-bit values); distillation loss values, row sums of `vocab` divergence terms,
//! take the loss family's divergence budget `abs = 1e-5·(1 + vocab/256)`.

mod common;

use common::cross_entropy::{as_stored, assert_ce_outputs, options_for};
use common::{Rng, assert_close, engine, tensor_from_f64};
use wgrad::fused_linear::{
    self as fl, Chunking, DistillationOptions, DistillationReduction,
    FusedLinearCrossEntropyOptions, FusedLinearGradients, LinearHead, SoftLoss,
    fused_linear_cross_entropy, fused_linear_cross_entropy_backward, fused_linear_distillation,
    fused_linear_distillation_backward,
};
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::loss::{CrossEntropyOptions, Reduction};
use wgrad::reference::fused_linear::{self as reference, DistillationConfig, Head, SoftTerm};
use wgrad::reference::loss::CrossEntropyConfig;
use wgrad::{DType, Engine, Error, Tensor};

const F32: Tolerance = Tolerance::for_dtype(DType::F32);

/// Gradients of the weight and the input (sums of `rows` or `vocab` products each) pass the
/// plain F32 policy at these sizes.
fn grad_tol() -> Tolerance {
    F32
}

/// The bits of any float tensor, widened to f64.
fn wide_bits(t: &Tensor) -> Vec<u64> {
    t.to_f64().unwrap().into_iter().map(f64::to_bits).collect()
}

/// Two runs' gradients hold the same bits (any dtypes).
fn assert_same_gradient_bits(what: &str, a: &FusedLinearGradients, b: &FusedLinearGradients) {
    let pairs = [
        ("d input", Some(&a.input), Some(&b.input)),
        ("d weight", Some(&a.weight), Some(&b.weight)),
        ("d bias", a.bias.as_ref(), b.bias.as_ref()),
    ];
    for (name, x, y) in pairs {
        assert_eq!(x.map(wide_bits), y.map(wide_bits), "{what}: {name} rerun");
    }
}

fn data(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    Rng::new(seed).vec(n, lo, hi)
}

fn bits(t: &Tensor) -> Vec<u32> {
    common::f32_bits(t)
}

/// A head on the GPU and the values it holds.
struct HeadData {
    x: Tensor,
    w: Tensor,
    b: Option<Tensor>,
    xs: Vec<f64>,
    ws: Vec<f64>,
    bs: Option<Vec<f64>>,
    hidden: usize,
}

impl HeadData {
    #[allow(clippy::too_many_arguments)]
    fn new(
        e: &Engine,
        seed: u64,
        lead: &[usize],
        hidden: usize,
        vocab: usize,
        bias: bool,
        dtype: DType,
        scale: f64,
    ) -> HeadData {
        let rows: usize = lead.iter().product();
        let mut shape = lead.to_vec();
        shape.push(hidden);
        let xv = data(seed, rows * hidden, -1.0, 1.0);
        let wv = data(seed + 1, vocab * hidden, -scale, scale);
        let x = tensor_from_f64(e, &xv, &shape, dtype);
        let w = tensor_from_f64(e, &wv, &[vocab, hidden], dtype);
        let (b, bs) = if bias {
            let bv = data(seed + 2, vocab, -0.5, 0.5);
            (
                Some(tensor_from_f64(e, &bv, &[vocab], dtype)),
                Some(common::stored(&bv, dtype)),
            )
        } else {
            (None, None)
        };
        HeadData {
            x,
            w,
            b,
            xs: common::stored(&xv, dtype),
            ws: common::stored(&wv, dtype),
            bs,
            hidden,
        }
    }

    fn gpu(&self) -> LinearHead<'_> {
        LinearHead {
            input: &self.x,
            weight: &self.w,
            bias: self.b.as_ref(),
        }
    }

    fn reference(&self) -> Head<'_> {
        Head {
            x: &self.xs,
            w: &self.ws,
            bias: self.bs.as_deref(),
            hidden: self.hidden,
        }
    }
}

/// Targets in [0, vocab) with every `ignored_every`-th row (and some random ones) set to
/// `ignore_index`; `ignored_every = 2` ignores at least half.
fn targets_for(
    seed: u64,
    rows: usize,
    vocab: usize,
    ignore_index: i32,
    ignored_every: usize,
) -> Vec<i32> {
    let mut rng = Rng::new(seed);
    (0..rows)
        .map(|r| {
            if ignored_every > 0 && r % ignored_every == 0 {
                ignore_index
            } else {
                (rng.next_u32() as usize % vocab) as i32
            }
        })
        .collect()
}

fn flce_options(
    cfg: &CrossEntropyConfig,
    chunk_rows: Option<usize>,
) -> FusedLinearCrossEntropyOptions {
    FusedLinearCrossEntropyOptions {
        cross_entropy: options_for(cfg),
        chunking: Chunking {
            chunk_rows,
            memory_budget: None,
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        gradients_in_forward: true,
        ..FusedLinearCrossEntropyOptions::default()
    }
}

fn check_gradients(
    what: &str,
    got: &FusedLinearGradients,
    want: &reference::LinearGradients,
    head: &HeadData,
) {
    check_gradients_within(what, got, want, head, None);
}

/// [`check_gradients`] with d input and d weight under `tol` instead of the F32 policy (when
/// given).
fn check_gradients_within(
    what: &str,
    got: &FusedLinearGradients,
    want: &reference::LinearGradients,
    head: &HeadData,
    tol: Option<Tolerance>,
) {
    let product_tol = tol.unwrap_or_else(grad_tol);
    assert_eq!(got.input.shape(), head.x.shape(), "{what}");
    // F32, or with `Chunking::head_dtype_gradients` the head's dtypes: FP32 sums rounded
    // once (twice with an explicit cotangent on gradients computed in the forward).
    for (name, t, want, stored) in [
        ("d input", &got.input, &want.input, head.x.dtype()),
        ("d weight", &got.weight, &want.weight, head.w.dtype()),
    ] {
        let what = format!("{what} {name}");
        if t.dtype() == DType::F32 {
            assert_close(&what, &t.to_f64().unwrap(), want, product_tol);
        } else {
            assert_eq!(t.dtype(), stored, "{what}: dtype");
            let rounded = common::stored(want, stored);
            assert_close(
                &what,
                &t.to_f64().unwrap(),
                &rounded,
                common::rounded_tolerance(stored, 2.0),
            );
        }
    }
    match (&got.bias, &head.b) {
        (Some(db), Some(_)) => {
            assert_close(
                &format!("{what} d bias"),
                &db.to_f64().unwrap(),
                &want.bias,
                grad_tol(),
            );
        }
        (None, None) => {}
        _ => panic!("{what}: bias gradient presence"),
    }
}

/// Runs the fused linear cross-entropy with `cfg` and compares every output and every
/// gradient (unit and explicit cotangents) with the reference; then a rerun must give the
/// same bits.
#[allow(clippy::too_many_arguments)]
fn flce_case(
    what: &str,
    lead: &[usize],
    hidden: usize,
    vocab: usize,
    bias: bool,
    dtype: DType,
    cfg: &CrossEntropyConfig,
    targets: &[i32],
    chunk_rows: Option<usize>,
    seed: u64,
) {
    let rows: usize = lead.iter().product();
    let what = format!(
        "{what} {dtype} lead {lead:?} H{hidden} V{vocab} bias={bias} {:?} chunk {chunk_rows:?}",
        cfg.reduction
    );
    let head = HeadData::new(engine(), seed, lead, hidden, vocab, bias, dtype, 0.5);
    let t = Tensor::from_slice(engine(), targets, lead).unwrap();
    let cfg = as_stored(cfg);
    let options = flce_options(&cfg, chunk_rows);
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
    let want = reference::fused_linear_cross_entropy(head.reference(), targets, rows, vocab, &cfg);
    let scalar = cfg.reduction != Reduction::None;
    let loss_shape: &[usize] = if scalar { &[] } else { lead };
    assert_eq!(out.loss.shape(), loss_shape, "{what}");
    assert_ce_outputs(&what, &out, &want, F32);
    // Argmax ties are improbable with random data; rounding can still flip a near tie, so
    // allow a few rows to differ where the top two logits are within rounding.
    let predicted = out.predicted.as_ref().unwrap().to_vec::<i32>().unwrap();
    let differing = predicted
        .iter()
        .zip(&want.predicted)
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        differing <= rows / 50,
        "{what}: {differing} predictions differ"
    );
    // Unit cotangent.
    let ones = vec![1.0; if scalar { 1 } else { rows }];
    let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
    let want_g = reference::fused_linear_cross_entropy_backward(
        head.reference(),
        targets,
        rows,
        vocab,
        &cfg,
        &ones,
    );
    check_gradients(&format!("{what} (unit)"), &g, &want_g, &head);
    // Explicit cotangent of the loss's shape.
    let c = data(seed + 9, ones.len(), -2.0, 2.0);
    let cs = common::stored(&c, DType::F32);
    let ct = tensor_from_f64(engine(), &c, loss_shape, DType::F32);
    let g2 = fused_linear_cross_entropy_backward(&saved, Some(&ct)).unwrap();
    let want_g2 = reference::fused_linear_cross_entropy_backward(
        head.reference(),
        targets,
        rows,
        vocab,
        &cfg,
        &cs,
    );
    check_gradients(&format!("{what} (cotangent)"), &g2, &want_g2, &head);
    // Reruns are bit-identical.
    let (out2, saved2) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
    assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
    let g3 = fused_linear_cross_entropy_backward(&saved2, Some(&ct)).unwrap();
    assert_eq!(bits(&g2.input), bits(&g3.input), "{what}: d input rerun");
    assert_eq!(bits(&g2.weight), bits(&g3.weight), "{what}: d weight rerun");
}

fn all_options(vocab: usize) -> CrossEntropyConfig {
    CrossEntropyConfig {
        ignore_index: 7,
        label_smoothing: 0.1,
        z_loss: 1e-3,
        softcap: Some(3.0),
        weight: Some(data(77, vocab, 0.2, 1.5)),
        reduction: Reduction::Mean,
    }
}

// ---- references --------------------------------------------------------------------------

#[test]
fn reference_backwards_match_finite_differences() {
    let (rows, hidden, vocab) = (4, 3, 5);
    let x = data(1, rows * hidden, -1.0, 1.0);
    let w = data(2, vocab * hidden, -1.0, 1.0);
    let b = data(3, vocab, -0.5, 0.5);
    let targets = [1, -100, 4, 0];
    let cfg = CrossEntropyConfig {
        label_smoothing: 0.1,
        z_loss: 0.01,
        softcap: Some(2.0),
        weight: Some(data(4, vocab, 0.5, 1.5)),
        ..CrossEntropyConfig::default()
    };
    // Parameters packed as [x, w, b]; the gradient of each piece by central differences.
    let n = x.len() + w.len() + b.len();
    let unpack = |p: &[f64]| {
        (
            p[..x.len()].to_vec(),
            p[x.len()..x.len() + w.len()].to_vec(),
            p[x.len() + w.len()..].to_vec(),
        )
    };
    let packed: Vec<f64> = x.iter().chain(&w).chain(&b).copied().collect();
    assert_eq!(packed.len(), n);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let cfg = CrossEntropyConfig {
            reduction,
            ..cfg.clone()
        };
        let outputs = if reduction == Reduction::None {
            rows
        } else {
            1
        };
        let cot = data(5, outputs, -1.0, 1.0);
        let f = |p: &[f64]| {
            let (x, w, b) = unpack(p);
            let head = Head {
                x: &x,
                w: &w,
                bias: Some(&b),
                hidden,
            };
            reference::fused_linear_cross_entropy(head, &targets, rows, vocab, &cfg).loss
        };
        let head = Head {
            x: &x,
            w: &w,
            bias: Some(&b),
            hidden,
        };
        let g =
            reference::fused_linear_cross_entropy_backward(head, &targets, rows, vocab, &cfg, &cot);
        let analytic: Vec<f64> = g
            .input
            .iter()
            .chain(&g.weight)
            .chain(&g.bias)
            .copied()
            .collect();
        let c = check_vjp(f, &packed, &cot, &analytic);
        assert!(c.passed, "{reduction:?}: {c}");
    }
    // Distillation, every soft term, with a hard term and a temperature.
    let xt = data(6, rows * 2, -1.0, 1.0);
    let wt = data(7, vocab * 2, -1.0, 1.0);
    let labels = [2, -100, 0, 3];
    for soft in [
        SoftTerm::Jsd { beta: 0.0 },
        SoftTerm::Jsd { beta: 0.3 },
        SoftTerm::Jsd { beta: 1.0 },
        SoftTerm::Kl,
        SoftTerm::Tvd,
    ] {
        for batch_mean in [true, false] {
            let cfg = DistillationConfig {
                soft,
                temperature: 1.7,
                weight_hard: 0.4,
                weight_soft: 0.9,
                ignore_index: -100,
                batch_mean,
            };
            let teacher = Head {
                x: &xt,
                w: &wt,
                bias: None,
                hidden: 2,
            };
            let f = |p: &[f64]| {
                let (x, w, b) = unpack(p);
                let student = Head {
                    x: &x,
                    w: &w,
                    bias: Some(&b),
                    hidden,
                };
                vec![
                    reference::fused_linear_distillation(
                        student,
                        teacher,
                        Some(&labels),
                        rows,
                        vocab,
                        &cfg,
                    )
                    .loss,
                ]
            };
            let student = Head {
                x: &x,
                w: &w,
                bias: Some(&b),
                hidden,
            };
            let g = reference::fused_linear_distillation_backward(
                student,
                teacher,
                Some(&labels),
                rows,
                vocab,
                &cfg,
                0.7,
            );
            let analytic: Vec<f64> = g
                .input
                .iter()
                .chain(&g.weight)
                .chain(&g.bias)
                .copied()
                .collect();
            let c = check_vjp(f, &packed, &[0.7], &analytic);
            assert!(c.passed, "{soft:?} batch_mean={batch_mean}: {c}");
        }
    }
}

// ---- fused linear cross-entropy ---------------------------------------------------------

#[test]
fn flce_each_option_alone_and_all_together() {
    // Liger's ragged shape (B, T, H, V) = (4, 47, 31, 123), as is.
    let (lead, hidden, vocab) = ([4usize, 47], 31, 123);
    let rows = 4 * 47;
    let base = CrossEntropyConfig::default();
    let all = all_options(vocab);
    let cases: Vec<(&str, CrossEntropyConfig, usize)> = vec![
        ("plain", base.clone(), 0),
        (
            "ignore_index, half ignored",
            CrossEntropyConfig {
                ignore_index: 7,
                ..base.clone()
            },
            2,
        ),
        (
            "smoothing",
            CrossEntropyConfig {
                label_smoothing: 0.1,
                ..base.clone()
            },
            5,
        ),
        (
            "z-loss",
            CrossEntropyConfig {
                z_loss: 1e-3,
                ..base.clone()
            },
            5,
        ),
        (
            "softcap",
            CrossEntropyConfig {
                softcap: Some(3.0),
                ..base.clone()
            },
            5,
        ),
        (
            "class weights",
            CrossEntropyConfig {
                weight: Some(data(78, vocab, 0.2, 1.5)),
                ..base.clone()
            },
            3,
        ),
        ("all", all.clone(), 2),
    ];
    for (k, (what, cfg, ignored_every)) in cases.iter().enumerate() {
        let targets = targets_for(k as u64, rows, vocab, cfg.ignore_index, *ignored_every);
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let cfg = CrossEntropyConfig {
                reduction,
                ..cfg.clone()
            };
            flce_case(
                what,
                &lead,
                hidden,
                vocab,
                k % 2 == 0,
                DType::F32,
                &cfg,
                &targets,
                Some(50),
                10 + k as u64,
            );
        }
    }
}

#[test]
fn flce_every_storage_dtype() {
    // An odd hidden size and chunk: 16-bit rows of x start inside a 32-bit word.
    let (lead, hidden, vocab) = ([3usize, 21], 33, 96);
    let rows = 63;
    let cfg = all_options(vocab);
    let targets = targets_for(3, rows, vocab, cfg.ignore_index, 3);
    for dtype in DType::FLOATS {
        for bias in [false, true] {
            flce_case(
                "all options",
                &lead,
                hidden,
                vocab,
                bias,
                dtype,
                &cfg,
                &targets,
                Some(5),
                40,
            );
        }
    }
}

#[test]
fn flce_liger_large_shape_scaled_down() {
    // Liger's (8, 128, 1024, 4096) reduced for a software adapter: (2, 32, 128, 1024), with
    // the default chunking (the budget fits it in one chunk here) and four chunks.
    let (lead, hidden, vocab) = ([2usize, 32], 128, 1024);
    let cfg = CrossEntropyConfig {
        ignore_index: -100,
        ..CrossEntropyConfig::default()
    };
    let targets = targets_for(5, 64, vocab, -100, 4);
    for chunk in [None, Some(16)] {
        flce_case(
            "liger scaled",
            &lead,
            hidden,
            vocab,
            true,
            DType::BF16,
            &cfg,
            &targets,
            chunk,
            50,
        );
    }
}

#[test]
fn flce_chunk_sizes_agree_and_reruns_are_bit_identical() {
    let (rows, hidden, vocab) = (37, 24, 80);
    let head = HeadData::new(engine(), 60, &[rows], hidden, vocab, true, DType::F32, 0.5);
    let cfg = as_stored(&all_options(vocab));
    let targets = targets_for(61, rows, vocab, cfg.ignore_index, 3);
    let t = Tensor::from_slice(engine(), &targets, &[rows]).unwrap();
    let run = |chunk: Option<usize>| {
        let (out, saved) =
            fused_linear_cross_entropy(head.gpu(), &t, &flce_options(&cfg, chunk)).unwrap();
        let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
        (saved.plan(), out, g)
    };
    let (plan, out_ref, g_ref) = run(None);
    assert_eq!(
        (plan.chunks, plan.chunk_rows),
        (1, rows),
        "default plan fits one chunk"
    );
    for chunk in [1, 2, 7, 16, 36, 37, 100] {
        let (plan, out, g) = run(Some(chunk));
        assert_eq!(plan.chunks, rows.div_ceil(chunk.min(rows)), "chunk {chunk}");
        let what = format!("chunk {chunk}");
        assert_close(
            &format!("{what} loss"),
            &out.loss.to_f64().unwrap(),
            &out_ref.loss.to_f64().unwrap(),
            F32,
        );
        assert_eq!(
            out.predicted.as_ref().unwrap().to_vec::<i32>().unwrap(),
            out_ref.predicted.as_ref().unwrap().to_vec::<i32>().unwrap(),
            "{what}: predictions"
        );
        for (name, a, b) in [
            ("d input", &g.input, &g_ref.input),
            ("d weight", &g.weight, &g_ref.weight),
            (
                "d bias",
                g.bias.as_ref().unwrap(),
                g_ref.bias.as_ref().unwrap(),
            ),
        ] {
            assert_close(
                &format!("{what} {name}"),
                &a.to_f64().unwrap(),
                &b.to_f64().unwrap(),
                grad_tol(),
            );
        }
        // A fixed chunk size reruns to the same bits.
        let (_, out2, g2) = run(Some(chunk));
        assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
        assert_eq!(bits(&g.weight), bits(&g2.weight), "{what}: d weight rerun");
        assert_eq!(
            bits(g.bias.as_ref().unwrap()),
            bits(g2.bias.as_ref().unwrap()),
            "{what}: d bias rerun"
        );
        assert_eq!(bits(&g.input), bits(&g2.input), "{what}: d input rerun");
    }
    // Without predictions (`CrossEntropyOptions::predicted` false): none returned, the loss
    // and the gradients the same bits.
    let mut options = flce_options(&cfg, Some(7));
    options.cross_entropy.predicted = false;
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
    let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
    let (_, want, g_want) = run(Some(7));
    assert!(out.predicted.is_none(), "predictions returned");
    assert_eq!(bits(&out.loss), bits(&want.loss), "no predictions: loss");
    assert_same_gradient_bits("no predictions", &g, &g_want);
}

#[test]
fn flce_recomputing_backward_matches_the_eager_one() {
    let (rows, hidden, vocab) = (30, 16, 64);
    let head = HeadData::new(engine(), 70, &[rows], hidden, vocab, true, DType::F16, 0.5);
    let cfg = as_stored(&all_options(vocab));
    let targets = targets_for(71, rows, vocab, cfg.ignore_index, 4);
    let t = Tensor::from_slice(engine(), &targets, &[rows]).unwrap();
    for reduction in [Reduction::Mean, Reduction::Sum] {
        let cfg = CrossEntropyConfig {
            reduction,
            ..cfg.clone()
        };
        let eager = flce_options(&cfg, Some(8));
        let lazy = FusedLinearCrossEntropyOptions {
            gradients_in_forward: false,
            ..eager.clone()
        };
        let (out_e, saved_e) = fused_linear_cross_entropy(head.gpu(), &t, &eager).unwrap();
        let (out_l, saved_l) = fused_linear_cross_entropy(head.gpu(), &t, &lazy).unwrap();
        assert_eq!(bits(&out_e.loss), bits(&out_l.loss), "{reduction:?}: loss");
        // Unit cotangent: the same kernels on the same values, so the same bits.
        let ge = fused_linear_cross_entropy_backward(&saved_e, None).unwrap();
        let gl = fused_linear_cross_entropy_backward(&saved_l, None).unwrap();
        assert_eq!(
            bits(&ge.weight),
            bits(&gl.weight),
            "{reduction:?}: d weight"
        );
        assert_eq!(bits(&ge.input), bits(&gl.input), "{reduction:?}: d input");
        // An explicit cotangent: scaled after (eager) or inside (recomputed); rounding differs.
        let c = tensor_from_f64(engine(), &[-1.75], &[], DType::F32);
        let ge = fused_linear_cross_entropy_backward(&saved_e, Some(&c)).unwrap();
        let gl = fused_linear_cross_entropy_backward(&saved_l, Some(&c)).unwrap();
        assert_close(
            &format!("{reduction:?} d weight"),
            &ge.weight.to_f64().unwrap(),
            &gl.weight.to_f64().unwrap(),
            F32,
        );
        let want = reference::fused_linear_cross_entropy_backward(
            head.reference(),
            &targets,
            rows,
            vocab,
            &cfg,
            &[-1.75],
        );
        check_gradients(&format!("{reduction:?} recomputed"), &gl, &want, &head);
    }
}

#[test]
fn flce_all_ignored_and_empty_batches() {
    let (rows, hidden, vocab) = (6, 8, 16);
    let head = HeadData::new(engine(), 80, &[rows], hidden, vocab, true, DType::F32, 0.5);
    let t = Tensor::from_slice(engine(), &[-100i32; 6], &[rows]).unwrap();
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let cfg = CrossEntropyConfig {
            reduction,
            ..CrossEntropyConfig::default()
        };
        let (out, saved) =
            fused_linear_cross_entropy(head.gpu(), &t, &flce_options(&cfg, Some(4))).unwrap();
        assert!(out.loss.to_f64().unwrap().iter().all(|&v| v == 0.0));
        let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
        assert!(g.input.to_f64().unwrap().iter().all(|&v| v == 0.0));
        assert!(g.weight.to_f64().unwrap().iter().all(|&v| v == 0.0));
        assert!(g.bias.unwrap().to_f64().unwrap().iter().all(|&v| v == 0.0));
    }
    // With a temperature and the entropy: zero entropies, and an entropy cotangent gives
    // zero gradients too.
    let o = FusedLinearCrossEntropyOptions {
        temperature: 0.5,
        return_entropy: true,
        ..flce_options(&CrossEntropyConfig::default(), Some(4))
    };
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &o).unwrap();
    assert_eq!(out.entropy.unwrap().to_f64().unwrap(), vec![0.0; rows]);
    let ec = tensor_from_f64(engine(), &[1.0; 6], &[rows], DType::F32);
    let g = fl::fused_linear_cross_entropy_backward_with_entropy(&saved, None, Some(&ec)).unwrap();
    assert!(g.weight.to_f64().unwrap().iter().all(|&v| v == 0.0));
    assert!(g.input.to_f64().unwrap().iter().all(|&v| v == 0.0));
    // No rows at all: zero losses, empty d input, zero d weight and d bias.
    let empty = HeadData::new(engine(), 81, &[0], hidden, vocab, true, DType::BF16, 0.5);
    let t = Tensor::from_slice(engine(), &[0i32; 0], &[0]).unwrap();
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let cfg = CrossEntropyConfig {
            reduction,
            ..CrossEntropyConfig::default()
        };
        let options = FusedLinearCrossEntropyOptions {
            temperature: 2.0,
            return_entropy: true,
            ..flce_options(&cfg, None)
        };
        let (out, saved) = fused_linear_cross_entropy(empty.gpu(), &t, &options).unwrap();
        assert_eq!(out.entropy.as_ref().unwrap().shape(), &[0]);
        let want_len = if reduction == Reduction::None { 0 } else { 1 };
        let loss = out.loss.to_f64().unwrap();
        assert_eq!(loss.len(), want_len);
        assert!(loss.iter().all(|&v| v == 0.0));
        let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
        assert_eq!(g.input.shape(), &[0, hidden]);
        assert_eq!(g.weight.shape(), &[vocab, hidden]);
        assert!(g.weight.to_f64().unwrap().iter().all(|&v| v == 0.0));
        assert!(g.bias.unwrap().to_f64().unwrap().iter().all(|&v| v == 0.0));
    }
}

/// A private engine (the memory statistics are engine-wide) with a head of `rows` rows and a
/// bias, and targets (a fifth ignored), all uploaded.
fn memory_case(
    seed: u64,
    (rows, hidden, vocab): (usize, usize, usize),
    dtype: DType,
) -> (Engine, HeadData, Tensor) {
    let e = common::private_engine();
    let head = HeadData::new(&e, seed, &[rows], hidden, vocab, true, dtype, 0.3);
    let targets = targets_for(seed + 1, rows, vocab, -100, 5);
    let t = Tensor::from_slice(&e, &targets, &[rows]).unwrap();
    e.synchronize().unwrap();
    (e, head, t)
}

#[test]
fn flce_peak_memory_stays_at_the_chunk_bound() {
    let (rows, hidden, vocab) = (512, 16, 1024);
    let (e, head, t) = memory_case(90, (rows, hidden, vocab), DType::F32);
    let logits_bytes = (rows * vocab * 4) as u64;
    // A budget for chunks of about 32 rows: a sixteenth of the logits.
    let per_chunk = fl::fused_linear_cross_entropy_workspace_bytes(rows, hidden, vocab, 32, true);
    let options = FusedLinearCrossEntropyOptions {
        chunking: Chunking {
            chunk_rows: None,
            memory_budget: Some(per_chunk),
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        ..FusedLinearCrossEntropyOptions::default()
    };
    let plan = fl::plan_cross_entropy(&e, rows, hidden, vocab, true, DType::F32, &options.chunking)
        .unwrap();
    assert_eq!((plan.chunk_rows, plan.chunks), (32, 16));
    assert!(plan.workspace_bytes <= per_chunk);
    let before = e.memory().live_bytes;
    e.reset_peak();
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
    let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
    e.synchronize().unwrap();
    let peak = e.memory().peak_bytes - before;
    // Outputs: d input, d weight, d bias, the predictions and a few scalars.
    let outputs = ((rows * hidden + vocab * hidden + vocab + rows) * 4) as u64 + 4096;
    // The pool rounds each buffer up by at most 12.5%.
    let bound = (outputs + plan.workspace_bytes) * 9 / 8;
    assert!(
        peak <= bound,
        "peak {peak} bytes above outputs + workspace {bound}"
    );
    assert!(
        peak < logits_bytes / 2,
        "peak {peak} bytes: the [rows, vocab] logits ({logits_bytes} bytes) must never exist"
    );
    drop((out, saved, g));
    // The engine's bound below one row per chunk: a typed error, nothing launched.
    e.set_workspace_bound(
        fl::fused_linear_cross_entropy_workspace_bytes(rows, hidden, vocab, 1, true) - 1,
    );
    assert!(matches!(
        fused_linear_cross_entropy(head.gpu(), &t, &FusedLinearCrossEntropyOptions::default()),
        Err(Error::WorkspaceExceeded { .. })
    ));
}

#[test]
fn flce_bad_inputs() {
    let e = engine();
    let head = HeadData::new(e, 100, &[4], 6, 10, true, DType::F32, 0.5);
    let t = Tensor::from_slice(e, &[0i32, 1, 2, 3], &[4]).unwrap();
    let d = FusedLinearCrossEntropyOptions::default();
    let run = |h: LinearHead, t: &Tensor, o: &FusedLinearCrossEntropyOptions| {
        fused_linear_cross_entropy(h, t, o).map(|_| ())
    };
    let f32t = |v: &[f64], shape: &[usize]| tensor_from_f64(e, v, shape, DType::F32);
    // Dtypes.
    let xi = Tensor::from_slice(e, &[1i32; 24], &[4, 6]).unwrap();
    assert!(matches!(
        run(
            LinearHead {
                input: &xi,
                ..head.gpu()
            },
            &t,
            &d
        ),
        Err(Error::UnsupportedDType {
            got: DType::I32,
            ..
        })
    ));
    let wi = Tensor::from_slice(e, &[1i32; 60], &[10, 6]).unwrap();
    assert!(matches!(
        run(
            LinearHead {
                weight: &wi,
                ..head.gpu()
            },
            &t,
            &d
        ),
        Err(Error::UnsupportedDType {
            got: DType::I32,
            ..
        })
    ));
    let bi = Tensor::from_slice(e, &[1i32; 10], &[10]).unwrap();
    assert!(matches!(
        run(
            LinearHead {
                bias: Some(&bi),
                ..head.gpu()
            },
            &t,
            &d
        ),
        Err(Error::UnsupportedDType {
            got: DType::I32,
            ..
        })
    ));
    assert!(matches!(
        run(head.gpu(), &f32t(&[0.0; 4], &[4]), &d),
        Err(Error::UnsupportedDType {
            got: DType::F32,
            ..
        })
    ));
    // Shapes.
    let w_bad = f32t(&[0.0; 50], &[10, 5]);
    match run(
        LinearHead {
            weight: &w_bad,
            ..head.gpu()
        },
        &t,
        &d,
    ) {
        Err(Error::ShapeMismatch { expected, got, .. }) => {
            assert_eq!((expected, got), (vec![10, 6], vec![10, 5]))
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let w_flat = f32t(&[0.0; 60], &[60]);
    assert!(matches!(
        run(
            LinearHead {
                weight: &w_flat,
                ..head.gpu()
            },
            &t,
            &d
        ),
        Err(Error::ShapeMismatch { .. })
    ));
    let b_bad = f32t(&[0.0; 9], &[9]);
    assert!(matches!(
        run(
            LinearHead {
                bias: Some(&b_bad),
                ..head.gpu()
            },
            &t,
            &d
        ),
        Err(Error::ShapeMismatch { .. })
    ));
    match run(
        head.gpu(),
        &Tensor::from_slice(e, &[0i32; 3], &[3]).unwrap(),
        &d,
    ) {
        Err(Error::ShapeMismatch { expected, got, .. }) => {
            assert_eq!((expected, got), (vec![4], vec![3]))
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let x0 = f32t(&[], &[4, 0]);
    let w0 = f32t(&[], &[10, 0]);
    assert!(matches!(
        run(
            LinearHead {
                input: &x0,
                weight: &w0,
                bias: None
            },
            &t,
            &d
        ),
        Err(Error::OutOfBounds { got: 0, min: 1, .. })
    ));
    let wv0 = f32t(&[], &[0, 6]);
    assert!(matches!(
        run(
            LinearHead {
                weight: &wv0,
                bias: None,
                ..head.gpu()
            },
            &t,
            &d
        ),
        Err(Error::OutOfBounds { got: 0, min: 1, .. })
    ));
    // Options.
    let o = FusedLinearCrossEntropyOptions {
        chunking: Chunking {
            chunk_rows: Some(0),
            memory_budget: None,
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        ..d.clone()
    };
    assert!(matches!(
        run(head.gpu(), &t, &o),
        Err(Error::OutOfBounds { got: 0, .. })
    ));
    let o = FusedLinearCrossEntropyOptions {
        chunking: Chunking {
            chunk_rows: None,
            memory_budget: Some(100),
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        ..d.clone()
    };
    assert!(matches!(
        run(head.gpu(), &t, &o),
        Err(Error::WorkspaceExceeded { .. })
    ));
    for (eps, z_loss, cap) in [(1.5, 0.0, None), (0.0, -1.0, None), (0.0, 0.0, Some(0.0))] {
        let o = FusedLinearCrossEntropyOptions {
            cross_entropy: CrossEntropyOptions {
                label_smoothing: eps,
                z_loss,
                softcap: cap,
                ..Default::default()
            },
            ..d.clone()
        };
        assert!(
            matches!(run(head.gpu(), &t, &o), Err(Error::InvalidValue { .. })),
            "{eps} {z_loss} {cap:?}"
        );
    }
    let o = FusedLinearCrossEntropyOptions {
        cross_entropy: CrossEntropyOptions {
            weight: Some(f32t(&[1.0; 9], &[9])),
            ..Default::default()
        },
        ..d.clone()
    };
    assert!(matches!(
        run(head.gpu(), &t, &o),
        Err(Error::ShapeMismatch { .. })
    ));
    // Targets out of range.
    match run(
        head.gpu(),
        &Tensor::from_slice(e, &[0i32, 10, 2, 3], &[4]).unwrap(),
        &d,
    ) {
        Err(Error::OutOfBounds {
            got: 10,
            max: 9,
            what,
            ..
        }) => {
            assert!(what.contains("targets[1]"), "{what}")
        }
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
    assert!(matches!(
        run(
            head.gpu(),
            &Tensor::from_slice(e, &[0i32, 1, -5, 3], &[4]).unwrap(),
            &d
        ),
        Err(Error::InvalidValue { .. })
    ));
    // Cotangents.
    let (_, saved) = fused_linear_cross_entropy(head.gpu(), &t, &d).unwrap();
    assert!(matches!(
        fused_linear_cross_entropy_backward(&saved, Some(&f32t(&[1.0; 4], &[4]))),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        fused_linear_cross_entropy_backward(
            &saved,
            Some(&tensor_from_f64(e, &[1.0], &[], DType::BF16))
        ),
        Err(Error::UnsupportedDType { .. })
    ));
    let none = FusedLinearCrossEntropyOptions {
        cross_entropy: CrossEntropyOptions {
            reduction: Reduction::None,
            ..Default::default()
        },
        ..d.clone()
    };
    let (_, saved) = fused_linear_cross_entropy(head.gpu(), &t, &none).unwrap();
    assert!(matches!(
        fused_linear_cross_entropy_backward(&saved, Some(&f32t(&[1.0], &[]))),
        Err(Error::ShapeMismatch { .. })
    ));
    // Another engine's tensor.
    let other = common::private_engine();
    let t_other = Tensor::from_slice(&other, &[0i32, 1, 2, 3], &[4]).unwrap();
    assert!(matches!(
        run(head.gpu(), &t_other, &d),
        Err(Error::EngineMismatch { .. })
    ));
}

// ---- distillation -------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn distill_case(
    what: &str,
    rows: usize,
    hidden: (usize, usize),
    vocab: usize,
    dtype: DType,
    labels: Option<&[i32]>,
    options: &DistillationOptions,
    seed: u64,
) {
    let what = format!(
        "{what} {dtype} rows {rows} H{hidden:?} V{vocab} {:?}",
        options.soft
    );
    let student = HeadData::new(engine(), seed, &[rows], hidden.0, vocab, true, dtype, 0.6);
    let teacher = HeadData::new(
        engine(),
        seed + 5,
        &[rows],
        hidden.1,
        vocab,
        false,
        dtype,
        0.9,
    );
    let lt = labels.map(|l| Tensor::from_slice(engine(), l, &[rows]).unwrap());
    let (out, saved) =
        fused_linear_distillation(student.gpu(), teacher.gpu(), lt.as_ref(), options).unwrap();
    let cfg = DistillationConfig::of(options);
    let want = reference::fused_linear_distillation(
        student.reference(),
        teacher.reference(),
        labels,
        rows,
        vocab,
        &cfg,
    );
    // Divergences are row sums of `vocab` terms (the loss family's divergence tolerance).
    let div_tol = Tolerance {
        abs: 1e-5 * (1.0 + vocab as f64 / 256.0),
        ..F32
    };
    for (name, t, w) in [
        ("loss", &out.loss, want.loss),
        ("hard", &out.hard_loss, want.hard),
        ("soft", &out.soft_loss, want.soft),
    ] {
        assert_eq!(t.shape(), &[] as &[usize], "{what} {name}");
        assert_close(
            &format!("{what} {name}"),
            &t.to_f64().unwrap(),
            &[w],
            div_tol,
        );
    }
    let want_g = reference::fused_linear_distillation_backward(
        student.reference(),
        teacher.reference(),
        labels,
        rows,
        vocab,
        &cfg,
        1.0,
    );
    let g = fused_linear_distillation_backward(&saved, None).unwrap();
    check_gradients(&format!("{what} (unit)"), &g, &want_g, &student);
    let c = tensor_from_f64(engine(), &[0.625], &[1], DType::F32);
    let g2 = fused_linear_distillation_backward(&saved, Some(&c)).unwrap();
    let want_g2 = reference::fused_linear_distillation_backward(
        student.reference(),
        teacher.reference(),
        labels,
        rows,
        vocab,
        &cfg,
        0.625,
    );
    check_gradients(&format!("{what} (cotangent)"), &g2, &want_g2, &student);
    // Rerun: same bits.
    let (out2, saved2) =
        fused_linear_distillation(student.gpu(), teacher.gpu(), lt.as_ref(), options).unwrap();
    assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
    let g3 = fused_linear_distillation_backward(&saved2, None).unwrap();
    assert_eq!(bits(&g.weight), bits(&g3.weight), "{what}: d weight rerun");
    assert_eq!(bits(&g.input), bits(&g3.input), "{what}: d input rerun");
}

fn distill_options(soft: SoftLoss, chunk_rows: usize) -> DistillationOptions {
    DistillationOptions {
        soft,
        chunking: Chunking {
            chunk_rows: Some(chunk_rows),
            memory_budget: None,
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        ..DistillationOptions::default()
    }
}

#[test]
fn distillation_soft_terms_match_the_reference() {
    let (rows, vocab) = (45, 72);
    let labels = targets_for(110, rows, vocab, -100, 3);
    for (k, soft) in [
        SoftLoss::Jsd { beta: 0.0 },
        SoftLoss::Jsd { beta: 0.5 },
        SoftLoss::Jsd { beta: 1.0 },
        SoftLoss::Kl,
        SoftLoss::Tvd,
        SoftLoss::Cosine { beta: 0.5 },
        SoftLoss::Cosine { beta: 1.0 },
    ]
    .into_iter()
    .enumerate()
    {
        // Soft term alone, without labels, at T = 1.
        distill_case(
            "soft only",
            rows,
            (24, 40),
            vocab,
            DType::F32,
            None,
            &distill_options(soft, 16),
            120 + k as u64,
        );
        // With labels (a third ignored), a temperature and a hard term, summed.
        let options = DistillationOptions {
            temperature: 2.5,
            weight_hard: 0.3,
            weight_soft: 0.7,
            reduction: if k % 2 == 0 {
                DistillationReduction::BatchMean
            } else {
                DistillationReduction::Sum
            },
            ..distill_options(soft, 10)
        };
        distill_case(
            "hard + soft",
            rows,
            (24, 40),
            vocab,
            DType::F32,
            Some(&labels),
            &options,
            130 + k as u64,
        );
    }
}

#[test]
fn distillation_every_storage_dtype_and_shorthands() {
    let (rows, vocab) = (20, 64);
    let labels = targets_for(140, rows, vocab, -100, 4);
    for dtype in [DType::F16, DType::BF16] {
        let options = DistillationOptions {
            temperature: 2.0,
            weight_hard: 0.5,
            weight_soft: 0.5,
            ..distill_options(SoftLoss::Tvd, 7)
        };
        distill_case(
            "CE + TVD",
            rows,
            (32, 16),
            vocab,
            dtype,
            Some(&labels),
            &options,
            150,
        );
        distill_case(
            "JSD",
            rows,
            (32, 16),
            vocab,
            dtype,
            Some(&labels),
            &distill_options(SoftLoss::Jsd { beta: 0.5 }, 64),
            151,
        );
        distill_case(
            "cosine",
            rows,
            (32, 16),
            vocab,
            dtype,
            Some(&labels),
            &DistillationOptions {
                weight_hard: 0.5,
                weight_soft: 0.5,
                ..distill_options(SoftLoss::Cosine { beta: 0.5 }, 6)
            },
            152,
        );
    }
    // The shorthands set the soft term and nothing else.
    let s = HeadData::new(engine(), 160, &[rows], 8, vocab, false, DType::F32, 0.5);
    let t = HeadData::new(engine(), 161, &[rows], 8, vocab, false, DType::F32, 0.5);
    let base = DistillationOptions {
        soft: SoftLoss::Tvd,
        ..distill_options(SoftLoss::Tvd, 5)
    };
    let loss_of = |r: wgrad::Result<(fl::DistillationOutput, fl::DistillationSaved)>| {
        bits(&r.unwrap().0.loss)
    };
    let full = |soft| {
        loss_of(fused_linear_distillation(
            s.gpu(),
            t.gpu(),
            None,
            &DistillationOptions {
                soft,
                ..base.clone()
            },
        ))
    };
    assert_eq!(
        loss_of(fl::fused_linear_jsd(s.gpu(), t.gpu(), None, 0.25, &base)),
        full(SoftLoss::Jsd { beta: 0.25 })
    );
    assert_eq!(
        loss_of(fl::fused_linear_kl(s.gpu(), t.gpu(), None, &base)),
        full(SoftLoss::Kl)
    );
    assert_eq!(
        loss_of(fl::fused_linear_cosine(s.gpu(), t.gpu(), None, 0.4, &base)),
        full(SoftLoss::Cosine { beta: 0.4 })
    );
    let jsd_base = DistillationOptions {
        soft: SoftLoss::Kl,
        ..base.clone()
    };
    assert_eq!(
        loss_of(fl::fused_linear_tvd(s.gpu(), t.gpu(), None, &jsd_base)),
        full(SoftLoss::Tvd)
    );
}

#[test]
fn distillation_chunk_sizes_agree_and_recompute_matches() {
    let (rows, vocab) = (33, 48);
    let labels = targets_for(170, rows, vocab, -100, 2);
    let lt = Tensor::from_slice(engine(), &labels, &[rows]).unwrap();
    let s = HeadData::new(engine(), 171, &[rows], 12, vocab, true, DType::F32, 0.5);
    let t = HeadData::new(engine(), 172, &[rows], 20, vocab, true, DType::F32, 0.5);
    let base = DistillationOptions {
        soft: SoftLoss::Jsd { beta: 0.3 },
        temperature: 1.5,
        weight_hard: 0.25,
        ..DistillationOptions::default()
    };
    let run = |options: &DistillationOptions| {
        let (out, saved) = fused_linear_distillation(s.gpu(), t.gpu(), Some(&lt), options).unwrap();
        let g = fused_linear_distillation_backward(&saved, None).unwrap();
        (out, g)
    };
    let (out_ref, g_ref) = run(&base);
    for chunk in [1, 5, 32, 33] {
        let options = DistillationOptions {
            chunking: Chunking {
                chunk_rows: Some(chunk),
                memory_budget: None,
                tensor_cores: false,
                tensor_core_gradients: false,
                ..Chunking::default()
            },
            ..base.clone()
        };
        let (out, g) = run(&options);
        let what = format!("chunk {chunk}");
        assert_close(
            &format!("{what} loss"),
            &out.loss.to_f64().unwrap(),
            &out_ref.loss.to_f64().unwrap(),
            F32,
        );
        assert_close(
            &format!("{what} d weight"),
            &g.weight.to_f64().unwrap(),
            &g_ref.weight.to_f64().unwrap(),
            grad_tol(),
        );
        assert_close(
            &format!("{what} d input"),
            &g.input.to_f64().unwrap(),
            &g_ref.input.to_f64().unwrap(),
            grad_tol(),
        );
        // Recomputing in the backward: the same kernels, the same bits.
        let lazy = DistillationOptions {
            gradients_in_forward: false,
            ..options.clone()
        };
        let (out_l, g_l) = run(&lazy);
        assert_eq!(bits(&out.loss), bits(&out_l.loss), "{what}: lazy loss");
        assert_eq!(bits(&g.weight), bits(&g_l.weight), "{what}: lazy d weight");
        assert_eq!(
            bits(g.bias.as_ref().unwrap()),
            bits(g_l.bias.as_ref().unwrap()),
            "{what}: lazy d bias"
        );
    }
}

#[test]
fn distillation_peak_memory_stays_at_the_chunk_bound() {
    let e = common::private_engine();
    let (rows, vocab) = (256, 1024);
    let s = HeadData::new(&e, 180, &[rows], 16, vocab, false, DType::F32, 0.3);
    let t = HeadData::new(&e, 181, &[rows], 16, vocab, false, DType::F32, 0.3);
    let labels = targets_for(182, rows, vocab, -100, 4);
    let lt = Tensor::from_slice(&e, &labels, &[rows]).unwrap();
    e.synchronize().unwrap();
    let budget =
        fl::fused_linear_distillation_workspace_bytes(rows, 16, 16, vocab, 16, true, false);
    let options = DistillationOptions {
        soft: SoftLoss::Kl,
        temperature: 2.0,
        weight_hard: 0.5,
        chunking: Chunking {
            chunk_rows: None,
            memory_budget: Some(budget),
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        ..DistillationOptions::default()
    };
    let before = e.memory().live_bytes;
    e.reset_peak();
    let (out, saved) = fused_linear_distillation(s.gpu(), t.gpu(), Some(&lt), &options).unwrap();
    assert_eq!(saved.plan().chunk_rows, 16);
    let g = fused_linear_distillation_backward(&saved, None).unwrap();
    e.synchronize().unwrap();
    let peak = e.memory().peak_bytes - before;
    let outputs = ((rows * 16 + vocab * 16) * 4) as u64 + 4096;
    let bound = (outputs + saved.plan().workspace_bytes) * 9 / 8;
    assert!(peak <= bound, "peak {peak} above {bound}");
    assert!(peak < (rows * vocab * 4) as u64 / 2, "peak {peak}");
    drop((out, g));
}

#[test]
fn distillation_empty_batch_and_all_ignored() {
    let vocab = 16;
    let s = HeadData::new(engine(), 190, &[0], 4, vocab, true, DType::F32, 0.5);
    let t = HeadData::new(engine(), 191, &[0], 6, vocab, false, DType::F32, 0.5);
    let (out, saved) =
        fused_linear_distillation(s.gpu(), t.gpu(), None, &DistillationOptions::default()).unwrap();
    assert_eq!(out.loss.to_f64().unwrap(), vec![0.0]);
    let g = fused_linear_distillation_backward(&saved, None).unwrap();
    assert_eq!(g.input.shape(), &[0, 4]);
    assert!(g.weight.to_f64().unwrap().iter().all(|&v| v == 0.0));
    let rows = 5;
    let s = HeadData::new(engine(), 192, &[rows], 4, vocab, true, DType::F32, 0.5);
    let t = HeadData::new(engine(), 193, &[rows], 6, vocab, false, DType::F32, 0.5);
    let lt = Tensor::from_slice(engine(), &[-100i32; 5], &[rows]).unwrap();
    let options = DistillationOptions {
        weight_hard: 1.0,
        ..DistillationOptions::default()
    };
    let (out, saved) = fused_linear_distillation(s.gpu(), t.gpu(), Some(&lt), &options).unwrap();
    assert_eq!(out.loss.to_f64().unwrap(), vec![0.0]);
    let g = fused_linear_distillation_backward(&saved, None).unwrap();
    assert!(g.input.to_f64().unwrap().iter().all(|&v| v == 0.0));
    assert!(g.bias.unwrap().to_f64().unwrap().iter().all(|&v| v == 0.0));
    // Reduction none: per-row zeros; an empty batch gives empty losses and zero gradients.
    let none = DistillationOptions {
        reduction: DistillationReduction::None,
        ..options
    };
    let (out, saved) = fused_linear_distillation(s.gpu(), t.gpu(), Some(&lt), &none).unwrap();
    assert_eq!(out.loss.to_f64().unwrap(), vec![0.0; rows]);
    assert_eq!(out.hard_loss.to_f64().unwrap(), vec![0.0; rows]);
    let g = fused_linear_distillation_backward(&saved, None).unwrap();
    assert!(g.weight.to_f64().unwrap().iter().all(|&v| v == 0.0));
    let s0 = HeadData::new(engine(), 194, &[0], 4, vocab, true, DType::F32, 0.5);
    let t0 = HeadData::new(engine(), 195, &[0], 6, vocab, false, DType::F32, 0.5);
    let l0 = Tensor::from_slice(engine(), &[] as &[i32], &[0]).unwrap();
    let (out, saved) = fused_linear_distillation(s0.gpu(), t0.gpu(), Some(&l0), &none).unwrap();
    assert_eq!(out.loss.shape(), &[0]);
    let g = fused_linear_distillation_backward(&saved, None).unwrap();
    assert_eq!(g.input.shape(), &[0, 4]);
    assert!(g.weight.to_f64().unwrap().iter().all(|&v| v == 0.0));
    assert!(g.bias.unwrap().to_f64().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn distillation_bad_inputs() {
    let e = engine();
    let (rows, vocab) = (4, 10);
    let s = HeadData::new(e, 200, &[rows], 6, vocab, false, DType::F32, 0.5);
    let t = HeadData::new(e, 201, &[rows], 3, vocab, false, DType::F32, 0.5);
    let lt = Tensor::from_slice(e, &[0i32, 1, 2, 3], &[rows]).unwrap();
    let d = DistillationOptions::default();
    let run = |s: LinearHead, t: LinearHead, l: Option<&Tensor>, o: &DistillationOptions| {
        fused_linear_distillation(s, t, l, o).map(|_| ())
    };
    // Teacher rows or vocabulary differ.
    let t_rows = HeadData::new(e, 202, &[5], 3, vocab, false, DType::F32, 0.5);
    assert!(matches!(
        run(s.gpu(), t_rows.gpu(), None, &d),
        Err(Error::ShapeMismatch { .. })
    ));
    let t_vocab = HeadData::new(e, 203, &[rows], 3, vocab + 1, false, DType::F32, 0.5);
    assert!(matches!(
        run(s.gpu(), t_vocab.gpu(), None, &d),
        Err(Error::ShapeMismatch { .. })
    ));
    // Scalars.
    for o in [
        DistillationOptions {
            temperature: 0.0,
            ..d.clone()
        },
        DistillationOptions {
            temperature: f32::NAN,
            ..d.clone()
        },
        DistillationOptions {
            soft: SoftLoss::Jsd { beta: 1.5 },
            ..d.clone()
        },
        DistillationOptions {
            soft: SoftLoss::Cosine { beta: -0.5 },
            ..d.clone()
        },
        DistillationOptions {
            weight_soft: f32::INFINITY,
            ..d.clone()
        },
        DistillationOptions {
            weight_hard: 0.5,
            ..d.clone()
        }, // a hard term without labels
    ] {
        assert!(
            matches!(
                run(s.gpu(), t.gpu(), None, &o),
                Err(Error::InvalidValue { .. })
            ),
            "{o:?}"
        );
    }
    // Labels: dtype, shape, range (with a hard term).
    let lf = tensor_from_f64(e, &[0.0; 4], &[4], DType::F32);
    assert!(matches!(
        run(s.gpu(), t.gpu(), Some(&lf), &d),
        Err(Error::UnsupportedDType { .. })
    ));
    let l3 = Tensor::from_slice(e, &[0i32; 3], &[3]).unwrap();
    assert!(matches!(
        run(s.gpu(), t.gpu(), Some(&l3), &d),
        Err(Error::ShapeMismatch { .. })
    ));
    let hard = DistillationOptions {
        weight_hard: 0.5,
        ..d.clone()
    };
    let l_bad = Tensor::from_slice(e, &[0i32, 10, 2, 3], &[4]).unwrap();
    assert!(matches!(
        run(s.gpu(), t.gpu(), Some(&l_bad), &hard),
        Err(Error::OutOfBounds { got: 10, .. })
    ));
    assert!(run(s.gpu(), t.gpu(), Some(&lt), &hard).is_ok());
    // Bad cotangent.
    let (_, saved) = fused_linear_distillation(s.gpu(), t.gpu(), Some(&lt), &hard).unwrap();
    assert!(matches!(
        fused_linear_distillation_backward(
            &saved,
            Some(&tensor_from_f64(e, &[1.0; 2], &[2], DType::F32))
        ),
        Err(Error::ShapeMismatch { .. })
    ));
    // Budget too small.
    let o = DistillationOptions {
        chunking: Chunking {
            chunk_rows: None,
            memory_budget: Some(64),
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        ..d.clone()
    };
    assert!(matches!(
        run(s.gpu(), t.gpu(), None, &o),
        Err(Error::WorkspaceExceeded { .. })
    ));
}

// ---- scaled fused linear cross-entropy: temperature and entropy ---------------------------

fn packed_gradients(g: &reference::LinearGradients) -> Vec<f64> {
    g.input
        .iter()
        .chain(&g.weight)
        .chain(&g.bias)
        .copied()
        .collect()
}

#[test]
fn reference_scaled_and_per_row_backwards_match_finite_differences() {
    let (rows, hidden, vocab) = (4, 3, 5);
    let x = data(301, rows * hidden, -1.0, 1.0);
    let w = data(302, vocab * hidden, -1.0, 1.0);
    let b = data(303, vocab, -0.5, 0.5);
    let packed: Vec<f64> = x.iter().chain(&w).chain(&b).copied().collect();
    let unpack = |p: &[f64]| {
        (
            p[..x.len()].to_vec(),
            p[x.len()..x.len() + w.len()].to_vec(),
            p[x.len() + w.len()..].to_vec(),
        )
    };
    let targets = [1, -100, 4, 0];
    // Loss and entropy together: outputs [loss.., entropy..], cotangents for both.
    for (softcap, reduction) in [
        (None, Reduction::Mean),
        (Some(2.0), Reduction::Sum),
        (Some(1.5), Reduction::None),
    ] {
        let cfg = CrossEntropyConfig {
            label_smoothing: 0.1,
            z_loss: 0.01,
            softcap,
            reduction,
            ..CrossEntropyConfig::default()
        };
        let t = 0.7;
        let n_loss = if reduction == Reduction::None {
            rows
        } else {
            1
        };
        let cot = data(304, n_loss, -1.0, 1.0);
        let ecot = data(305, rows, -1.0, 1.0);
        let f = |p: &[f64]| {
            let (x, w, b) = unpack(p);
            let head = Head {
                x: &x,
                w: &w,
                bias: Some(&b),
                hidden,
            };
            let (r, h) =
                reference::fused_linear_cross_entropy_scaled(head, &targets, rows, vocab, &cfg, t);
            r.loss.into_iter().chain(h).collect::<Vec<f64>>()
        };
        let head = Head {
            x: &x,
            w: &w,
            bias: Some(&b),
            hidden,
        };
        let g = reference::fused_linear_cross_entropy_scaled_backward(
            head,
            &targets,
            rows,
            vocab,
            &cfg,
            t,
            &cot,
            Some(&ecot),
        );
        let all_cot: Vec<f64> = cot.iter().chain(&ecot).copied().collect();
        let c = check_vjp(f, &packed, &all_cot, &packed_gradients(&g));
        assert!(c.passed, "scaled {softcap:?} {reduction:?}: {c}");
    }
    // Distillation per row: one cotangent per row.
    let xt = data(306, rows * 2, -1.0, 1.0);
    let wt = data(307, vocab * 2, -1.0, 1.0);
    let teacher = Head {
        x: &xt,
        w: &wt,
        bias: None,
        hidden: 2,
    };
    let labels = [2, -100, 0, 3];
    let cot = data(308, rows, -1.0, 1.0);
    for soft in [
        SoftTerm::Jsd { beta: 0.3 },
        SoftTerm::Kl,
        SoftTerm::Tvd,
        SoftTerm::Cosine { beta: 0.6 },
    ] {
        let cfg = DistillationConfig {
            soft,
            temperature: 1.7,
            weight_hard: 0.4,
            weight_soft: 0.9,
            ignore_index: -100,
            batch_mean: false,
        };
        let f = |p: &[f64]| {
            let (x, w, b) = unpack(p);
            let student = Head {
                x: &x,
                w: &w,
                bias: Some(&b),
                hidden,
            };
            reference::fused_linear_distillation_rows(
                student,
                teacher,
                Some(&labels),
                rows,
                vocab,
                &cfg,
            )
            .iter()
            .map(|r| r.loss)
            .collect::<Vec<f64>>()
        };
        let student = Head {
            x: &x,
            w: &w,
            bias: Some(&b),
            hidden,
        };
        let g = reference::fused_linear_distillation_rows_backward(
            student,
            teacher,
            Some(&labels),
            rows,
            vocab,
            &cfg,
            &cot,
        );
        let c = check_vjp(f, &packed, &cot, &packed_gradients(&g));
        assert!(c.passed, "distillation rows {soft:?}: {c}");
    }
}

/// The scaled FLCE (temperature `t`, entropy returned) against the reference: loss, z-loss,
/// accuracy, entropy; gradients with a loss cotangent alone (the eager path for sum/mean),
/// with both cotangents, and with the entropy cotangent alone (a zero loss cotangent); a
/// rerun gives the same bits.
#[allow(clippy::too_many_arguments)]
fn scaled_case(
    what: &str,
    lead: &[usize],
    hidden: usize,
    vocab: usize,
    bias: bool,
    dtype: DType,
    cfg: &CrossEntropyConfig,
    t: f32,
    (chunk_rows, vocab_block, block_statistics): (Option<usize>, Option<usize>, bool),
    seed: u64,
) {
    let rows: usize = lead.iter().product();
    let what = format!(
        "{what} {dtype} T{t} lead {lead:?} H{hidden} V{vocab} bias={bias} {:?} block \
         {vocab_block:?} block statistics {block_statistics}",
        cfg.reduction
    );
    let head = HeadData::new(engine(), seed, lead, hidden, vocab, bias, dtype, 0.7);
    let targets = targets_for(seed + 1, rows, vocab, cfg.ignore_index, 3);
    let tt = Tensor::from_slice(engine(), &targets, lead).unwrap();
    let cfg = as_stored(cfg);
    let mut options = FusedLinearCrossEntropyOptions {
        temperature: t,
        return_entropy: true,
        ..flce_options(&cfg, chunk_rows)
    };
    options.chunking.head_dtype_gradients = vocab_block.is_some();
    options.chunking.vocab_block = vocab_block;
    options.chunking.block_statistics = block_statistics;
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &tt, &options).unwrap();
    let tf = f64::from(t);
    let (want, want_h) = reference::fused_linear_cross_entropy_scaled(
        head.reference(),
        &targets,
        rows,
        vocab,
        &cfg,
        tf,
    );
    assert_ce_outputs(&what, &out, &want, F32);
    let h = out.entropy.as_ref().expect("entropy requested");
    assert_eq!(h.shape(), lead, "{what}: entropy shape");
    assert_close(
        &format!("{what} entropy"),
        &h.to_f64().unwrap(),
        &want_h,
        F32,
    );
    let scalar = cfg.reduction != Reduction::None;
    let loss_shape: &[usize] = if scalar { &[] } else { lead };
    let n_loss = if scalar { 1 } else { rows };
    let c = common::stored(&data(seed + 2, n_loss, -2.0, 2.0), DType::F32);
    let ec = common::stored(&data(seed + 3, rows, -2.0, 2.0), DType::F32);
    let ct = tensor_from_f64(engine(), &c, loss_shape, DType::F32);
    let ect = tensor_from_f64(engine(), &ec, lead, DType::F32);
    let want_g = |cot: &[f64], ecot: Option<&[f64]>| {
        reference::fused_linear_cross_entropy_scaled_backward(
            head.reference(),
            &targets,
            rows,
            vocab,
            &cfg,
            tf,
            cot,
            ecot,
        )
    };
    // Loss cotangent only.
    let g = fused_linear_cross_entropy_backward(&saved, Some(&ct)).unwrap();
    check_gradients(&format!("{what} (loss)"), &g, &want_g(&c, None), &head);
    // Both cotangents.
    let g = fl::fused_linear_cross_entropy_backward_with_entropy(&saved, Some(&ct), Some(&ect))
        .unwrap();
    check_gradients(&format!("{what} (both)"), &g, &want_g(&c, Some(&ec)), &head);
    // The entropy alone (zero loss cotangent).
    let zeros = vec![0.0; n_loss];
    let zt = tensor_from_f64(engine(), &zeros, loss_shape, DType::F32);
    let g0 = fl::fused_linear_cross_entropy_backward_with_entropy(&saved, Some(&zt), Some(&ect))
        .unwrap();
    check_gradients(
        &format!("{what} (entropy)"),
        &g0,
        &want_g(&zeros, Some(&ec)),
        &head,
    );
    // Rerun: same bits.
    let (out2, saved2) = fused_linear_cross_entropy(head.gpu(), &tt, &options).unwrap();
    assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
    assert_eq!(
        bits(h),
        bits(out2.entropy.as_ref().unwrap()),
        "{what}: entropy rerun"
    );
    let g2 = fl::fused_linear_cross_entropy_backward_with_entropy(&saved2, Some(&ct), Some(&ect))
        .unwrap();
    assert_same_gradient_bits(&what, &g, &g2);
}

#[test]
fn flce_temperature_and_entropy_match_the_reference() {
    let (lead, hidden, vocab) = ([3usize, 13], 17, 45);
    let base = CrossEntropyConfig::default();
    for (k, (what, cfg, t)) in [
        ("plain", base.clone(), 1.0),
        ("plain", base.clone(), 0.6),
        ("all options", all_options(vocab), 1.7),
    ]
    .into_iter()
    .enumerate()
    {
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let cfg = CrossEntropyConfig {
                reduction,
                ..cfg.clone()
            };
            scaled_case(
                what,
                &lead,
                hidden,
                vocab,
                k != 1,
                DType::F32,
                &cfg,
                t,
                (Some(7), None, false),
                400 + 10 * k as u64,
            );
        }
    }
}

#[test]
fn flce_temperature_and_entropy_every_storage_dtype() {
    let (lead, hidden, vocab) = ([19usize], 21, 40);
    let cfg = all_options(vocab);
    for dtype in DType::FLOATS {
        scaled_case(
            "all options",
            &lead,
            hidden,
            vocab,
            true,
            dtype,
            &cfg,
            2.5,
            (Some(6), None, false),
            450,
        );
    }
}

#[test]
fn flce_temperature_chunk_sizes_agree() {
    let (rows, hidden, vocab) = (23, 12, 50);
    let head = HeadData::new(engine(), 460, &[rows], hidden, vocab, true, DType::F32, 0.7);
    let cfg = as_stored(&all_options(vocab));
    let targets = targets_for(461, rows, vocab, cfg.ignore_index, 4);
    let t = Tensor::from_slice(engine(), &targets, &[rows]).unwrap();
    let ec = tensor_from_f64(engine(), &data(462, rows, -1.0, 1.0), &[rows], DType::F32);
    let run = |chunk: Option<usize>| {
        let options = FusedLinearCrossEntropyOptions {
            temperature: 0.8,
            return_entropy: true,
            ..flce_options(&cfg, chunk)
        };
        let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
        let g =
            fl::fused_linear_cross_entropy_backward_with_entropy(&saved, None, Some(&ec)).unwrap();
        (out, g)
    };
    let (out_ref, g_ref) = run(None);
    for chunk in [1, 5, 23] {
        let (out, g) = run(Some(chunk));
        let what = format!("chunk {chunk}");
        for (name, a, b) in [
            ("loss", &out.loss, &out_ref.loss),
            (
                "entropy",
                out.entropy.as_ref().unwrap(),
                out_ref.entropy.as_ref().unwrap(),
            ),
            ("d input", &g.input, &g_ref.input),
            ("d weight", &g.weight, &g_ref.weight),
            (
                "d bias",
                g.bias.as_ref().unwrap(),
                g_ref.bias.as_ref().unwrap(),
            ),
        ] {
            assert_close(
                &format!("{what} {name}"),
                &a.to_f64().unwrap(),
                &b.to_f64().unwrap(),
                F32,
            );
        }
    }
}

#[test]
fn flce_temperature_and_entropy_bad_inputs() {
    let e = engine();
    let head = HeadData::new(e, 470, &[4], 6, 10, true, DType::F32, 0.5);
    let t = Tensor::from_slice(e, &[0i32, 1, 2, 3], &[4]).unwrap();
    for temperature in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let o = FusedLinearCrossEntropyOptions {
            temperature,
            ..FusedLinearCrossEntropyOptions::default()
        };
        assert!(
            matches!(
                fused_linear_cross_entropy(head.gpu(), &t, &o),
                Err(Error::InvalidValue { .. })
            ),
            "temperature {temperature}"
        );
    }
    // An entropy cotangent without the entropy output.
    let (_, saved) =
        fused_linear_cross_entropy(head.gpu(), &t, &FusedLinearCrossEntropyOptions::default())
            .unwrap();
    let ec = tensor_from_f64(e, &[1.0; 4], &[4], DType::F32);
    assert!(matches!(
        fl::fused_linear_cross_entropy_backward_with_entropy(&saved, None, Some(&ec)),
        Err(Error::InvalidValue { .. })
    ));
    let o = FusedLinearCrossEntropyOptions {
        return_entropy: true,
        ..FusedLinearCrossEntropyOptions::default()
    };
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &o).unwrap();
    assert!(out.entropy.is_some());
    // Wrong shape, wrong dtype.
    let bad_shape = tensor_from_f64(e, &[1.0; 3], &[3], DType::F32);
    assert!(matches!(
        fl::fused_linear_cross_entropy_backward_with_entropy(&saved, None, Some(&bad_shape)),
        Err(Error::ShapeMismatch { .. })
    ));
    let bad_dtype = tensor_from_f64(e, &[1.0; 4], &[4], DType::F16);
    assert!(matches!(
        fl::fused_linear_cross_entropy_backward_with_entropy(&saved, None, Some(&bad_dtype)),
        Err(Error::UnsupportedDType { .. })
    ));
    // Without return_entropy there is no entropy output.
    let (out, _) =
        fused_linear_cross_entropy(head.gpu(), &t, &FusedLinearCrossEntropyOptions::default())
            .unwrap();
    assert!(out.entropy.is_none());
}

// ---- distillation, reduction none ---------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn distill_rows_case(
    what: &str,
    lead: &[usize],
    hidden: (usize, usize),
    vocab: usize,
    dtype: DType,
    labels: Option<&[i32]>,
    options: &DistillationOptions,
    seed: u64,
) {
    let rows: usize = lead.iter().product();
    let what = format!(
        "{what} {dtype} lead {lead:?} H{hidden:?} V{vocab} {:?} none",
        options.soft
    );
    let student = HeadData::new(engine(), seed, lead, hidden.0, vocab, true, dtype, 0.6);
    let teacher = HeadData::new(engine(), seed + 5, lead, hidden.1, vocab, false, dtype, 0.9);
    let lt = labels.map(|l| Tensor::from_slice(engine(), l, lead).unwrap());
    let options = DistillationOptions {
        reduction: DistillationReduction::None,
        ..options.clone()
    };
    let (out, saved) =
        fused_linear_distillation(student.gpu(), teacher.gpu(), lt.as_ref(), &options).unwrap();
    let cfg = DistillationConfig::of(&options);
    let want = reference::fused_linear_distillation_rows(
        student.reference(),
        teacher.reference(),
        labels,
        rows,
        vocab,
        &cfg,
    );
    let div_tol = Tolerance {
        abs: 1e-5 * (1.0 + vocab as f64 / 256.0),
        ..F32
    };
    type Pick = fn(&reference::DistillationResult) -> f64;
    let picks: [(&str, &Tensor, Pick); 3] = [
        ("loss", &out.loss, |r| r.loss),
        ("hard", &out.hard_loss, |r| r.hard),
        ("soft", &out.soft_loss, |r| r.soft),
    ];
    for (name, t, pick) in picks {
        assert_eq!(t.shape(), lead, "{what} {name}");
        let w: Vec<f64> = want.iter().map(pick).collect();
        assert_close(&format!("{what} {name}"), &t.to_f64().unwrap(), &w, div_tol);
    }
    // Unit cotangents (None) and explicit per-row ones.
    let ones = vec![1.0; rows];
    let g = fused_linear_distillation_backward(&saved, None).unwrap();
    let want_g = |cot: &[f64]| {
        reference::fused_linear_distillation_rows_backward(
            student.reference(),
            teacher.reference(),
            labels,
            rows,
            vocab,
            &cfg,
            cot,
        )
    };
    check_gradients(&format!("{what} (unit)"), &g, &want_g(&ones), &student);
    let c = common::stored(&data(seed + 7, rows, -2.0, 2.0), DType::F32);
    let ct = tensor_from_f64(engine(), &c, lead, DType::F32);
    let g2 = fused_linear_distillation_backward(&saved, Some(&ct)).unwrap();
    check_gradients(&format!("{what} (cotangent)"), &g2, &want_g(&c), &student);
    // Rerun: same bits.
    let (out2, saved2) =
        fused_linear_distillation(student.gpu(), teacher.gpu(), lt.as_ref(), &options).unwrap();
    assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
    let g3 = fused_linear_distillation_backward(&saved2, Some(&ct)).unwrap();
    assert_eq!(bits(&g2.weight), bits(&g3.weight), "{what}: d weight rerun");
    assert_eq!(bits(&g2.input), bits(&g3.input), "{what}: d input rerun");
    // A scalar cotangent is the wrong shape for per-row losses.
    let scalar = tensor_from_f64(engine(), &[1.0], &[], DType::F32);
    assert!(matches!(
        fused_linear_distillation_backward(&saved, Some(&scalar)),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[test]
fn distillation_reduction_none_matches_the_reference() {
    let (lead, vocab) = ([2usize, 11], 37);
    let rows = 22;
    let labels: Vec<i32> = (0..rows)
        .map(|r| {
            if r % 4 == 1 {
                -100
            } else {
                (r * 5 % vocab) as i32
            }
        })
        .collect();
    for (k, soft) in [
        SoftLoss::Jsd { beta: 0.3 },
        SoftLoss::Kl,
        SoftLoss::Tvd,
        SoftLoss::Cosine { beta: 0.7 },
    ]
    .into_iter()
    .enumerate()
    {
        let options = DistillationOptions {
            temperature: 1.5,
            weight_hard: 0.3,
            weight_soft: 0.8,
            ..distill_options(soft, 6)
        };
        distill_rows_case(
            "hard + soft",
            &lead,
            (9, 14),
            vocab,
            DType::F32,
            Some(&labels),
            &options,
            500 + k as u64,
        );
    }
    // Without labels (every row counts), one storage dtype each.
    for (k, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        distill_rows_case(
            "soft only",
            &lead,
            (9, 14),
            vocab,
            dtype,
            None,
            &distill_options(SoftLoss::Jsd { beta: 0.5 }, 5),
            520 + k as u64,
        );
    }
}

#[test]
fn flce_with_a_split_k_input_gradient_matches_the_reference() {
    // dx = dlogits·W has K = vocab: with 4,096 classes and a handful of rows the product has
    // one tile and splits K in two (matmul::gemm_split), in every dtype and chunking.
    let (rows, hidden, vocab) = (8, 32, 4096);
    for chunk in [3, 8] {
        assert_eq!(wgrad::matmul::gemm_split(chunk, hidden, vocab, 1), 2);
    }
    let cfg = all_options(vocab);
    let targets = targets_for(310, rows, vocab, cfg.ignore_index, 3);
    for (i, dtype) in DType::FLOATS.into_iter().enumerate() {
        let chunk = if i == 1 { Some(3) } else { None };
        flce_case(
            "split-K dx",
            &[rows],
            hidden,
            vocab,
            i != 2,
            dtype,
            &cfg,
            &targets,
            chunk,
            311,
        );
    }
}

#[test]
fn flce_with_a_split_k_input_gradient_stays_within_its_workspace() {
    let e = common::private_engine();
    let (rows, hidden, vocab) = (8, 32, 4096);
    let split = wgrad::matmul::gemm_workspace_bytes(rows, hidden, vocab, 1);
    assert!(split > 0);
    // The figure counts the split scratch of the dx product.
    let counted = fl::fused_linear_cross_entropy_workspace_bytes(rows, hidden, vocab, rows, true);
    assert!(counted >= split + 8 * (rows * vocab) as u64, "{counted}");
    let head = HeadData::new(&e, 320, &[rows], hidden, vocab, true, DType::F32, 0.3);
    let targets = targets_for(321, rows, vocab, -100, 4);
    let t = Tensor::from_slice(&e, &targets, &[rows]).unwrap();
    e.synchronize().unwrap();
    let options = FusedLinearCrossEntropyOptions::default();
    let plan = fl::plan_cross_entropy(&e, rows, hidden, vocab, true, DType::F32, &options.chunking)
        .unwrap();
    assert_eq!((plan.chunk_rows, plan.workspace_bytes), (rows, counted));
    let before = e.memory().live_bytes;
    e.reset_peak();
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
    let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
    e.synchronize().unwrap();
    let peak = e.memory().peak_bytes - before;
    let outputs = ((rows * hidden + vocab * hidden + vocab + rows) * 4) as u64 + 4096;
    let bound = (outputs + plan.workspace_bytes) * 9 / 8;
    assert!(
        peak <= bound,
        "peak {peak} above outputs + workspace {bound}"
    );
    drop((out, saved, g));
    // A budget without room for the split takes smaller chunks (here: still splitting, the
    // figure counting it) and the call stays within it.
    let budget = counted - 1;
    let chunking = Chunking {
        chunk_rows: None,
        memory_budget: Some(budget),
        tensor_cores: false,
        tensor_core_gradients: false,
        ..Chunking::default()
    };
    let plan =
        fl::plan_cross_entropy(&e, rows, hidden, vocab, true, DType::F32, &chunking).unwrap();
    assert!(
        plan.chunk_rows < rows && plan.workspace_bytes <= budget,
        "{plan:?}"
    );
    assert_eq!(
        plan.workspace_bytes,
        fl::fused_linear_cross_entropy_workspace_bytes(rows, hidden, vocab, plan.chunk_rows, true)
    );
}

/// `Chunking::tensor_cores`: an F32 head ignores it (the same bits on any engine); a 16-bit
/// head, or `Chunking::tensor_core_gradients` with any head, is refused with `MissingFeature`
/// where the engine cannot run tensor cores. Where it can, for F16 and BF16 heads (the logits'
/// products on tensor cores) and with the gradient products on tensor cores too (BF16 and F32
/// heads, the logit gradient rounded to F16), the loss (every option, a fifth of the targets
/// ignored, bias) and the gradients with unit and explicit cotangents match the f64 reference
/// (the loss within the tensor-core budget over `hidden` products; the gradients under the F32
/// policy, or the rounded budget when their products round), chunks of 48 rows and one chunk
/// agree within those budgets, and reruns are bit-identical.
#[test]
fn flce_tensor_cores_match_reference_or_are_refused() {
    let (lead, hidden, vocab) = ([3usize, 40], 64, 200);
    let rows = 120;
    let cfg = as_stored(&all_options(vocab));
    let targets = targets_for(5, rows, vocab, cfg.ignore_index, 5);
    let t = Tensor::from_slice(engine(), &targets, &lead).unwrap();
    let options = |tensor_cores: bool, grads: bool, chunk_rows: Option<usize>| {
        FusedLinearCrossEntropyOptions {
            chunking: Chunking {
                tensor_cores,
                tensor_core_gradients: grads,
                ..flce_options(&cfg, chunk_rows).chunking
            },
            ..flce_options(&cfg, chunk_rows)
        }
    };
    let head32 = HeadData::new(engine(), 60, &lead, hidden, vocab, true, DType::F32, 0.5);
    let run = |head: &HeadData, o: &FusedLinearCrossEntropyOptions| {
        let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, o).unwrap();
        let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
        (out, g)
    };
    let (plain, gp) = run(&head32, &options(false, false, Some(48)));
    let (asked, ga) = run(&head32, &options(true, false, Some(48)));
    assert_eq!(bits(&plain.loss), bits(&asked.loss), "F32 head: loss");
    assert_eq!(bits(&gp.weight), bits(&ga.weight), "F32 head: d weight");
    if !wgrad::matmul::tensor_cores(engine()) {
        for (dt, grads) in [
            (DType::F16, false),
            (DType::BF16, false),
            (DType::F32, true),
        ] {
            let head = HeadData::new(engine(), 61, &lead, hidden, vocab, true, dt, 0.5);
            assert!(
                matches!(
                    fused_linear_cross_entropy(head.gpu(), &t, &options(true, grads, Some(48))),
                    Err(Error::MissingFeature { .. })
                ),
                "{dt:?} head, gradient products {grads}: refused"
            );
        }
        return;
    }
    for (dt, grads) in [
        (DType::F16, false),
        (DType::BF16, false),
        (DType::BF16, true),
        (DType::F32, true),
    ] {
        let head = HeadData::new(engine(), 61, &lead, hidden, vocab, true, dt, 0.5);
        let want =
            reference::fused_linear_cross_entropy(head.reference(), &targets, rows, vocab, &cfg);
        let tol = wgrad::matmul::tensor_core_tolerance(hidden);
        let grad_tol = grads.then(|| wgrad::matmul::tensor_core_rounded_tolerance(vocab));
        for chunk_rows in [Some(48), None] {
            let what =
                format!("tensor cores {dt:?} gradient products {grads} chunk {chunk_rows:?}");
            let o = options(true, grads, chunk_rows);
            let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &o).unwrap();
            assert_ce_outputs(&what, &out, &want, tol);
            let ones = [1.0];
            let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
            let want_g = reference::fused_linear_cross_entropy_backward(
                head.reference(),
                &targets,
                rows,
                vocab,
                &cfg,
                &ones,
            );
            check_gradients_within(&format!("{what} (unit)"), &g, &want_g, &head, grad_tol);
            let ct = tensor_from_f64(engine(), &[-1.5], &[], DType::F32);
            let g2 = fused_linear_cross_entropy_backward(&saved, Some(&ct)).unwrap();
            let want_g2 = reference::fused_linear_cross_entropy_backward(
                head.reference(),
                &targets,
                rows,
                vocab,
                &cfg,
                &[-1.5],
            );
            let label = format!("{what} (cotangent)");
            check_gradients_within(&label, &g2, &want_g2, &head, grad_tol);
            let (out2, saved2) = fused_linear_cross_entropy(head.gpu(), &t, &o).unwrap();
            let g3 = fused_linear_cross_entropy_backward(&saved2, None).unwrap();
            assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
            assert_eq!(bits(&g.input), bits(&g3.input), "{what}: d input rerun");
            assert_eq!(bits(&g.weight), bits(&g3.weight), "{what}: d weight rerun");
        }
    }
}

/// `Chunking::tensor_cores` in distillation: F32 heads ignore it (the same bits), F16 heads are
/// refused with `MissingFeature` where the engine cannot run tensor cores; where it can, an
/// F16 student and teacher (JSD β 0.5, temperature 2, a hard term) match the FP32 path's run
/// of the same heads (the loss within the tensor-core budget over `hidden` products, the
/// gradients under the F32 policy).
#[test]
fn distillation_tensor_cores_match_reference_or_are_refused() {
    let (rows, hidden, vocab) = (48usize, 32usize, 64usize);
    let labels: Vec<i32> = targets_for(9, rows, vocab, -100, 4);
    let lt = Tensor::from_slice(engine(), &labels, &[rows]).unwrap();
    let options = |tensor_cores: bool| DistillationOptions {
        temperature: 2.0,
        weight_hard: 0.25,
        chunking: Chunking {
            tensor_cores,
            ..distill_options(SoftLoss::Jsd { beta: 0.5 }, 16).chunking
        },
        ..distill_options(SoftLoss::Jsd { beta: 0.5 }, 16)
    };
    let s32 = HeadData::new(engine(), 300, &[rows], hidden, vocab, true, DType::F32, 0.5);
    let t32 = HeadData::new(
        engine(),
        301,
        &[rows],
        hidden,
        vocab,
        false,
        DType::F32,
        0.5,
    );
    let run = |s: &HeadData, t: &HeadData, o: &DistillationOptions| {
        let (out, saved) = fused_linear_distillation(s.gpu(), t.gpu(), Some(&lt), o).unwrap();
        (
            out,
            fused_linear_distillation_backward(&saved, None).unwrap(),
        )
    };
    let (plain, gp) = run(&s32, &t32, &options(false));
    let (asked, ga) = run(&s32, &t32, &options(true));
    assert_eq!(bits(&plain.loss), bits(&asked.loss), "F32 heads: loss");
    assert_eq!(bits(&gp.input), bits(&ga.input), "F32 heads: d input");
    let s = HeadData::new(engine(), 302, &[rows], hidden, vocab, true, DType::F16, 0.5);
    let t = HeadData::new(
        engine(),
        303,
        &[rows],
        hidden,
        vocab,
        false,
        DType::F16,
        0.5,
    );
    if !wgrad::matmul::tensor_cores(engine()) {
        assert!(matches!(
            fused_linear_distillation(s.gpu(), t.gpu(), Some(&lt), &options(true)),
            Err(Error::MissingFeature { .. })
        ));
        return;
    }
    // The F32 path's run of the same F16 heads is the comparison (its own agreement with the
    // reference is `distillation_every_storage_dtype_and_shorthands`).
    let (want, gw) = run(&s, &t, &options(false));
    let (got, g) = run(&s, &t, &options(true));
    let tol = wgrad::matmul::tensor_core_tolerance(hidden);
    assert_close(
        "tensor-core distillation loss",
        &got.loss.to_f64().unwrap(),
        &want.loss.to_f64().unwrap(),
        tol,
    );
    for (what, a, b) in [
        ("d input", &g.input, &gw.input),
        ("d weight", &g.weight, &gw.weight),
    ] {
        assert_close(
            &format!("tensor-core distillation {what}"),
            &a.to_f64().unwrap(),
            &b.to_f64().unwrap(),
            F32,
        );
    }
}

// ---- gradients in the head's dtypes (`Chunking::head_dtype_gradients`) -----------------------

fn blocked(chunk_rows: Option<usize>, vocab_block: Option<usize>) -> Chunking {
    Chunking {
        chunk_rows,
        vocab_block,
        head_dtype_gradients: true,
        ..Chunking::default()
    }
}

/// The fused linear cross-entropy with its gradients in the head's dtypes against the
/// reference: every output, then the gradients with a unit cotangent (one rounding: one unit
/// in the last place of the reference rounded to the dtype) and an explicit one, in their
/// dtypes (`dx` the input's, `dW` the weight's, `db` F32), and a rerun's bits.
#[allow(clippy::too_many_arguments)]
fn blocked_case(
    what: &str,
    lead: &[usize],
    (hidden, vocab): (usize, usize),
    bias: bool,
    dtype: DType,
    cfg: &CrossEntropyConfig,
    chunking: Chunking,
    seed: u64,
) {
    let rows: usize = lead.iter().product();
    let (chunk_rows, vocab_block) = (chunking.chunk_rows, chunking.vocab_block);
    let what = format!(
        "{what} {dtype} lead {lead:?} H{hidden} V{vocab} bias={bias} {:?} chunk {chunk_rows:?} \
         block {vocab_block:?} block statistics {}",
        cfg.reduction, chunking.block_statistics
    );
    let head = HeadData::new(engine(), seed, lead, hidden, vocab, bias, dtype, 0.5);
    let targets = targets_for(seed + 1, rows, vocab, cfg.ignore_index, 3);
    let t = Tensor::from_slice(engine(), &targets, lead).unwrap();
    let cfg = as_stored(cfg);
    let options = FusedLinearCrossEntropyOptions {
        chunking,
        ..flce_options(&cfg, None)
    };
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
    let plan = saved.plan();
    assert!(plan.vocab_block.is_some(), "{what}: plan {plan:?}");
    assert_eq!(plan.block_statistics, chunking.block_statistics, "{what}");
    if chunking.block_statistics {
        assert_eq!(plan.ranges().count(), 0, "{what}: no row chunks");
    }
    if let Some(b) = vocab_block {
        assert_eq!(plan.vocab_block, Some(b.min(vocab)), "{what}");
    }
    let want = reference::fused_linear_cross_entropy(head.reference(), &targets, rows, vocab, &cfg);
    assert_ce_outputs(&what, &out, &want, F32);
    let scalar = cfg.reduction != Reduction::None;
    let n_loss = if scalar { 1 } else { rows };
    let loss_shape: &[usize] = if scalar { &[] } else { lead };
    let want_g = |cot: &[f64]| {
        reference::fused_linear_cross_entropy_backward(
            head.reference(),
            &targets,
            rows,
            vocab,
            &cfg,
            cot,
        )
    };
    // Unit cotangent: each value rounded once from its FP32 sum.
    let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
    let want_unit = want_g(&vec![1.0; n_loss]);
    assert_eq!(g.input.dtype(), dtype, "{what}: d input dtype");
    assert_eq!(g.weight.dtype(), dtype, "{what}: d weight dtype");
    for (name, got, want) in [
        ("d input", &g.input, &want_unit.input),
        ("d weight", &g.weight, &want_unit.weight),
    ] {
        let (want, tol) = if dtype == DType::F32 {
            (want.clone(), grad_tol())
        } else {
            (
                common::stored(want, dtype),
                common::rounded_tolerance(dtype, 1.0),
            )
        };
        assert_close(
            &format!("{what} {name} (unit)"),
            &got.to_f64().unwrap(),
            &want,
            tol,
        );
    }
    if let Some(db) = &g.bias {
        assert_eq!(db.dtype(), DType::F32, "{what}: d bias dtype");
    }
    check_gradients(&format!("{what} (unit)"), &g, &want_unit, &head);
    // Explicit cotangent.
    let c = common::stored(&data(seed + 9, n_loss, -2.0, 2.0), DType::F32);
    let ct = tensor_from_f64(engine(), &c, loss_shape, DType::F32);
    let g2 = fused_linear_cross_entropy_backward(&saved, Some(&ct)).unwrap();
    check_gradients(&format!("{what} (cotangent)"), &g2, &want_g(&c), &head);
    // Reruns are bit-identical.
    let (out2, saved2) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
    assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
    let g3 = fused_linear_cross_entropy_backward(&saved2, Some(&ct)).unwrap();
    assert_same_gradient_bits(&what, &g2, &g3);
}

/// [`blocked_case`] with every option and each reduction in every dtype, for each
/// `(vocab, block)` of `shapes` (51 rows, H 24, a bias but on the third), chunked by
/// `chunking(block)`.
fn all_options_blocked_cases(
    shapes: &[(usize, Option<usize>)],
    chunking: impl Fn(Option<usize>) -> Chunking,
    seed: u64,
) {
    for (k, &(vocab, block)) in shapes.iter().enumerate() {
        for dtype in DType::FLOATS {
            for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
                let cfg = CrossEntropyConfig {
                    reduction,
                    ..all_options(vocab)
                };
                blocked_case(
                    "all options",
                    &[3, 17],
                    (24, vocab),
                    k != 2,
                    dtype,
                    &cfg,
                    chunking(block),
                    seed + 10 * k as u64,
                );
            }
        }
    }
}

#[test]
fn flce_head_dtype_gradients_match_the_reference() {
    // A vocabulary of whole 4-column groups (gradients written over the logits, a ragged
    // last block of 4) and one of 37 (separate gradient buffers, a last block of 5).
    let shapes = [(100, Some(12)), (37, Some(8)), (64, None)];
    all_options_blocked_cases(&shapes, |b| blocked(Some(16), b), 600);
    // Plain options, one chunk and one block.
    blocked_case(
        "plain",
        &[9],
        (6, 20),
        true,
        DType::BF16,
        &CrossEntropyConfig::default(),
        blocked(None, None),
        640,
    );
}

#[test]
fn flce_head_dtype_gradients_with_temperature_and_entropy() {
    // Row chunks, then block statistics (the entropy folded block by block into the row
    // state; the last block of 4 columns).
    for (dtype, block_statistics) in DType::FLOATS
        .into_iter()
        .flat_map(|d| [(d, false), (d, true)])
    {
        for reduction in [Reduction::Mean, Reduction::None] {
            let cfg = CrossEntropyConfig {
                reduction,
                ..all_options(40)
            };
            scaled_case(
                "all options",
                &[19],
                20,
                40,
                true,
                dtype,
                &cfg,
                1.8,
                (Some(6), Some(12), block_statistics),
                650,
            );
        }
    }
}

#[test]
fn flce_orders_agree() {
    // The same sums in other orders: the gradients of the head's dtypes by row chunks and by
    // block statistics agree with the default F32 ones (F32 heads to FP32 rounding, BF16 ones
    // within one unit of them rounded), and the two head-dtype orders give the same loss
    // values and per-row statistics to FP32 rounding and the same predictions.
    let (rows, hidden, vocab) = (40, 32, 96);
    for dtype in [DType::F32, DType::BF16] {
        let head = HeadData::new(engine(), 660, &[rows], hidden, vocab, true, dtype, 0.6);
        let targets = targets_for(661, rows, vocab, -100, 4);
        let t = Tensor::from_slice(engine(), &targets, &[rows]).unwrap();
        let run = |chunking: Chunking| {
            let options = FusedLinearCrossEntropyOptions {
                chunking,
                cross_entropy: CrossEntropyOptions {
                    predicted: true,
                    label_smoothing: 0.1,
                    z_loss: 1e-3,
                    ..CrossEntropyOptions::default()
                },
                ..FusedLinearCrossEntropyOptions::default()
            };
            let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
            let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
            (out, saved.rows_matrix().to_f64().unwrap(), g)
        };
        let (_, _, f32s) = run(Chunking {
            chunk_rows: Some(16),
            ..Chunking::default()
        });
        let (rows_out, rows_mat, rows_g) = run(blocked(Some(16), Some(32)));
        let (ours, mat, g) = run(block_stats(Some(32)));
        assert_gradients_agree(&format!("{dtype} row chunks"), &rows_g, &f32s);
        assert_gradients_agree(&format!("{dtype} block statistics"), &g, &f32s);
        let preds = |o: &wgrad::loss::CrossEntropyOutput| {
            o.predicted.as_ref().unwrap().to_vec::<i32>().unwrap()
        };
        assert_eq!(preds(&ours), preds(&rows_out), "{dtype} predictions");
        for (name, got, want) in [
            (
                "loss",
                ours.loss.to_f64().unwrap(),
                rows_out.loss.to_f64().unwrap(),
            ),
            (
                "z-loss",
                ours.z_loss.to_f64().unwrap(),
                rows_out.z_loss.to_f64().unwrap(),
            ),
            ("rows matrix", mat, rows_mat),
        ] {
            assert_close(&format!("{dtype} {name}"), &got, &want, F32);
        }
    }
}

/// `got`'s gradients against `want`'s, the same sums in another order: F32 ones to FP32
/// rounding, 16-bit ones within one unit of `want`'s rounded to their dtype.
fn assert_gradients_agree(what: &str, got: &FusedLinearGradients, want: &FusedLinearGradients) {
    for (name, got, want) in [
        ("d input", &got.input, &want.input),
        ("d weight", &got.weight, &want.weight),
        (
            "d bias",
            got.bias.as_ref().unwrap(),
            want.bias.as_ref().unwrap(),
        ),
    ] {
        let want = want.to_f64().unwrap();
        let (want, tol) = if got.dtype() == DType::F32 {
            (want, F32)
        } else {
            (
                common::stored(&want, got.dtype()),
                common::rounded_tolerance(got.dtype(), 1.0),
            )
        };
        assert_close(
            &format!("{what} {name}"),
            &got.to_f64().unwrap(),
            &want,
            tol,
        );
    }
}

/// Forward and backward of a 16-bit `head` with a bias and `chunking` on its private engine
/// `e`: the gradients, the peak bytes above what was live before, and the bytes of the
/// outputs (16-bit d input and d weight, F32 d bias, the predictions and a few scalars).
fn head_dtype_peak(
    e: &Engine,
    head: &HeadData,
    t: &Tensor,
    chunking: Chunking,
) -> (FusedLinearGradients, u64, u64) {
    let (rows, vocab) = (head.x.len() / head.hidden, head.w.shape()[0]);
    let options = FusedLinearCrossEntropyOptions {
        chunking,
        ..FusedLinearCrossEntropyOptions::default()
    };
    let before = e.memory().live_bytes;
    e.reset_peak();
    let (out, saved) = fused_linear_cross_entropy(head.gpu(), t, &options).unwrap();
    let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
    e.synchronize().unwrap();
    let peak = e.memory().peak_bytes - before;
    drop((out, saved));
    let outputs = ((rows * head.hidden + vocab * head.hidden) * 2 + (vocab + rows) * 4) as u64;
    (g, peak, outputs + 4096)
}

#[test]
fn flce_head_dtype_gradients_peak_memory() {
    let (rows, hidden, vocab) = (256, 64, 1024);
    let (e, head, t) = memory_case(670, (rows, hidden, vocab), DType::BF16);
    // A budget for chunks of 16 rows and blocks of 64 columns.
    let budget = fl::fused_linear_cross_entropy_blocked_workspace_bytes(
        rows, hidden, vocab, 16, 64, true, false,
    );
    let chunking = Chunking {
        memory_budget: Some(budget),
        ..blocked(None, None)
    };
    let plan =
        fl::plan_cross_entropy(&e, rows, hidden, vocab, true, DType::F32, &chunking).unwrap();
    assert!(plan.workspace_bytes <= budget, "{plan:?} over {budget}");
    assert_eq!(plan.chunk_rows, 16, "{plan:?}");
    let block = plan.vocab_block.unwrap();
    assert!(block >= 64 && block.is_multiple_of(8), "{plan:?}");
    let (g, peak, outputs) = head_dtype_peak(&e, &head, &t, chunking);
    let bound = (outputs + plan.workspace_bytes) * 9 / 8;
    assert!(
        peak <= bound,
        "peak {peak} bytes above outputs + workspace {bound}"
    );
    let f32_weight_gradient = (vocab * hidden * 4) as u64;
    assert!(
        peak < f32_weight_gradient,
        "peak {peak} bytes: no F32 [vocab, hidden] buffer ({f32_weight_gradient} bytes) may exist"
    );
    assert_eq!(g.weight.dtype(), DType::BF16);
    drop(g);
}

#[test]
fn flce_head_dtype_gradients_bad_inputs() {
    let e = engine();
    let t = Tensor::from_slice(e, &[0i32, 1, 2, 3], &[4]).unwrap();
    let options = |chunking: Chunking| FusedLinearCrossEntropyOptions {
        chunking,
        ..FusedLinearCrossEntropyOptions::default()
    };
    let head = HeadData::new(e, 680, &[4], 6, 10, true, DType::BF16, 0.5);
    // A block of no columns.
    assert!(matches!(
        fused_linear_cross_entropy(head.gpu(), &t, &options(blocked(None, Some(0)))),
        Err(Error::OutOfBounds { .. })
    ));
    // A budget below one row per chunk and eight columns per block.
    let tiny = Chunking {
        memory_budget: Some(64),
        ..blocked(None, None)
    };
    assert!(matches!(
        fused_linear_cross_entropy(head.gpu(), &t, &options(tiny)),
        Err(Error::WorkspaceExceeded { .. })
    ));
    // A 16-bit head with an odd hidden size.
    let odd = HeadData::new(e, 681, &[4], 7, 10, false, DType::BF16, 0.5);
    match fused_linear_cross_entropy(odd.gpu(), &t, &options(blocked(None, None))) {
        Err(Error::InvalidValue { got, .. }) => assert_eq!(got, 7.0),
        other => panic!("odd hidden size: {other:?}"),
    }
    // An F32 head with an odd hidden size is fine.
    let odd32 = HeadData::new(e, 682, &[4], 7, 10, false, DType::F32, 0.5);
    assert!(fused_linear_cross_entropy(odd32.gpu(), &t, &options(blocked(None, None))).is_ok());
    // The distillation losses do not take it.
    let d = DistillationOptions {
        chunking: blocked(None, None),
        ..DistillationOptions::default()
    };
    let teacher = HeadData::new(e, 683, &[4], 6, 10, false, DType::BF16, 0.5);
    assert!(matches!(
        fused_linear_distillation(head.gpu(), teacher.gpu(), None, &d),
        Err(Error::InvalidValue { .. })
    ));
}

// ---- block statistics (`Chunking::block_statistics`): no row chunks ----------------------------

fn block_stats(vocab_block: Option<usize>) -> Chunking {
    Chunking {
        block_statistics: true,
        ..blocked(None, vocab_block)
    }
}

#[test]
fn flce_block_statistics_match_the_reference() {
    // Ragged last blocks (100 in blocks of 12: a last block of 4; 37 in blocks of 8: of 5,
    // with separate gradient buffers), one block of the whole vocabulary, and a block of 8
    // columns over 201 (26 blocks folded into the row state).
    let shapes = [(100, Some(12)), (37, Some(8)), (64, None), (201, Some(8))];
    all_options_blocked_cases(&shapes, block_stats, 700);
    for (name, cfg) in [
        ("plain", CrossEntropyConfig::default()),
        (
            "smoothing only",
            CrossEntropyConfig {
                label_smoothing: 0.2,
                reduction: Reduction::Sum,
                ..CrossEntropyConfig::default()
            },
        ),
        (
            "half the targets ignored",
            CrossEntropyConfig {
                ignore_index: -100,
                ..CrossEntropyConfig::default()
            },
        ),
    ] {
        blocked_case(
            name,
            &[9],
            (6, 20),
            true,
            DType::BF16,
            &cfg,
            block_stats(Some(8)),
            750,
        );
    }
}

#[test]
fn flce_block_statistics_argmax_ties_go_to_the_lowest_class() {
    // Classes 3, 21 and 45 (blocks 0, 2 and 5 of 8 columns) have the same weight row, larger
    // than any other, and the input is positive: their logits are equal and the largest in
    // every row, so every prediction is class 3, as with whole rows.
    let (rows, hidden, vocab) = (12, 8, 48);
    let xs = data(770, rows * hidden, 0.1, 1.0);
    let mut ws = data(771, vocab * hidden, -0.2, 0.2);
    for class in [3, 21, 45] {
        for j in 0..hidden {
            ws[class * hidden + j] = 0.5 + 0.05 * j as f64;
        }
    }
    let x = tensor_from_f64(engine(), &xs, &[rows, hidden], DType::F32);
    let w = tensor_from_f64(engine(), &ws, &[vocab, hidden], DType::F32);
    let targets: Vec<i32> = (0..rows as i32)
        .map(|r| if r == 5 { -100 } else { r })
        .collect();
    let t = Tensor::from_slice(engine(), &targets, &[rows]).unwrap();
    let head = LinearHead {
        input: &x,
        weight: &w,
        bias: None,
    };
    for chunking in [blocked(Some(5), Some(8)), block_stats(Some(8))] {
        let options = FusedLinearCrossEntropyOptions {
            chunking,
            cross_entropy: CrossEntropyOptions {
                predicted: true,
                ..CrossEntropyOptions::default()
            },
            ..FusedLinearCrossEntropyOptions::default()
        };
        let (out, _) = fused_linear_cross_entropy(head, &t, &options).unwrap();
        let want: Vec<i32> = (0..rows).map(|r| if r == 5 { -1 } else { 3 }).collect();
        assert_eq!(
            out.predicted.unwrap().to_vec::<i32>().unwrap(),
            want,
            "block statistics {}",
            chunking.block_statistics
        );
        // Target 3 (row 3) is predicted; no other counted row's is.
        assert_close(
            &format!("accuracy, block statistics {}", chunking.block_statistics),
            &out.accuracy.to_f64().unwrap(),
            &[1.0 / 11.0],
            F32,
        );
    }
}

#[test]
fn flce_block_statistics_peak_memory() {
    let (rows, hidden, vocab) = (256, 64, 1024);
    let (e, head, t) = memory_case(780, (rows, hidden, vocab), DType::BF16);
    // A budget for blocks of 64 columns; the F32 dx sum counts.
    let budget = fl::fused_linear_cross_entropy_block_statistics_workspace_bytes(
        rows, hidden, vocab, 64, true, false, false,
    );
    let dx_sum = (rows * hidden * 4) as u64;
    assert!(budget > dx_sum + (rows * 64 * 4) as u64, "{budget}");
    let chunking = Chunking {
        memory_budget: Some(budget),
        ..block_stats(None)
    };
    let plan =
        fl::plan_cross_entropy(&e, rows, hidden, vocab, true, DType::BF16, &chunking).unwrap();
    assert_eq!((plan.chunks, plan.vocab_block), (0, Some(64)), "{plan:?}");
    assert_eq!(plan.workspace_bytes, budget);
    let (g, peak, outputs) = head_dtype_peak(&e, &head, &t, chunking);
    let bound = (outputs + plan.workspace_bytes) * 9 / 8;
    assert!(
        peak <= bound,
        "peak {peak} bytes above outputs + workspace {bound}"
    );
    assert_eq!(g.input.dtype(), DType::BF16);
    assert_eq!(g.weight.dtype(), DType::BF16);
    drop(g);
}

#[test]
fn flce_block_statistics_split_within_the_budget() {
    // Hidden 4,096: each block's logits product (128 × 64 outputs, K 4,096) splits K in two
    // when the budget leaves room for its scratch beside the plan's figure, and runs unsplit
    // when it leaves half of it; the peak stays within outputs + budget either way, and the
    // two agree to FP32 rounding.
    let (rows, hidden, vocab, block) = (128, 4096, 256, 64);
    let (e, head, t) = memory_case(785, (rows, hidden, vocab), DType::BF16);
    let ws = fl::fused_linear_cross_entropy_block_statistics_workspace_bytes(
        rows, hidden, vocab, block, true, false, false,
    );
    let split = fl::fused_linear_cross_entropy_block_split_bytes(rows, hidden, vocab, block);
    assert!(split >= (2 * rows * block * 4) as u64, "{split}");
    let mut grads = Vec::new();
    for budget in [ws + split, ws + split / 2] {
        let chunking = Chunking {
            memory_budget: Some(budget),
            ..block_stats(Some(block))
        };
        let (g, peak, outputs) = head_dtype_peak(&e, &head, &t, chunking);
        assert!(
            peak <= outputs + budget,
            "budget {budget}: peak {peak} above outputs {outputs} + budget"
        );
        grads.push(g);
    }
    assert_gradients_agree("split / unsplit", &grads[0], &grads[1]);
}

#[test]
fn flce_block_statistics_all_ignored_and_empty_batches() {
    let (hidden, vocab) = (8, 20);
    for (rows, dtype) in [(6, DType::F32), (0, DType::BF16)] {
        let head = HeadData::new(engine(), 795, &[rows], hidden, vocab, true, dtype, 0.5);
        let t = Tensor::from_slice(engine(), &vec![-100i32; rows], &[rows]).unwrap();
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let cfg = CrossEntropyConfig {
                reduction,
                ..CrossEntropyConfig::default()
            };
            let options = FusedLinearCrossEntropyOptions {
                chunking: block_stats(Some(8)),
                ..flce_options(&cfg, None)
            };
            let what = format!("{rows} rows {reduction:?}");
            let (out, saved) = fused_linear_cross_entropy(head.gpu(), &t, &options).unwrap();
            assert!(
                out.loss.to_f64().unwrap().iter().all(|&v| v == 0.0),
                "{what}"
            );
            let g = fused_linear_cross_entropy_backward(&saved, None).unwrap();
            assert_eq!(g.input.shape(), &[rows, hidden], "{what}");
            assert_eq!(
                (g.input.dtype(), g.weight.dtype()),
                (dtype, dtype),
                "{what}"
            );
            for (name, t) in [("dx", &g.input), ("dW", &g.weight)] {
                assert!(
                    t.to_f64().unwrap().iter().all(|&v| v == 0.0),
                    "{what} {name}"
                );
            }
            assert!(g.bias.unwrap().to_f64().unwrap().iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn flce_block_statistics_bad_inputs() {
    let e = engine();
    let t = Tensor::from_slice(e, &[0i32, 1, 2, 3], &[4]).unwrap();
    let head = HeadData::new(e, 790, &[4], 6, 10, true, DType::BF16, 0.5);
    let run = |chunking: Chunking, entropy: bool| {
        let options = FusedLinearCrossEntropyOptions {
            chunking,
            return_entropy: entropy,
            ..FusedLinearCrossEntropyOptions::default()
        };
        fused_linear_cross_entropy(head.gpu(), &t, &options).map(|_| ())
    };
    // Without gradients in the head's dtypes.
    let alone = Chunking {
        block_statistics: true,
        ..Chunking::default()
    };
    assert!(
        matches!(run(alone, false), Err(Error::InvalidValue { ref what, .. }) if what.contains("block_statistics")),
        "{:?}",
        run(alone, false)
    );
    // The entropy output is taken (its values: `flce_head_dtype_gradients_with_temperature_and_entropy`).
    assert!(run(block_stats(None), true).is_ok());
    // A budget below eight columns per block beside the F32 dx sum.
    let tiny = Chunking {
        memory_budget: Some(256),
        ..block_stats(None)
    };
    assert!(matches!(
        run(tiny, false),
        Err(Error::WorkspaceExceeded { .. })
    ));
    // More classes than the row state's F32 argmax holds exactly (planned, nothing allocated).
    match fl::plan_cross_entropy(
        e,
        4,
        8,
        (1 << 24) + 1,
        false,
        DType::BF16,
        &block_stats(None),
    ) {
        Err(Error::OutOfBounds { got, max, .. }) => {
            assert_eq!((got, max), ((1 << 24) + 1, 1 << 24));
        }
        other => panic!("2^24 + 1 classes: {other:?}"),
    }
    // The distillation losses do not take it.
    let d = DistillationOptions {
        chunking: alone,
        ..DistillationOptions::default()
    };
    let teacher = HeadData::new(e, 791, &[4], 6, 10, false, DType::BF16, 0.5);
    assert!(matches!(
        fused_linear_distillation(head.gpu(), teacher.gpu(), None, &d),
        Err(Error::InvalidValue { .. })
    ));
    // Without anything wrong it runs.
    assert!(run(block_stats(None), false).is_ok());
}

#[test]
fn a_weight_past_the_binding_limit_is_a_typed_error() {
    // The dense products bind whole operands: a head whose weight exceeds one binding (a
    // tensor may, up to `max_tensor_bytes`) is refused with LimitExceeded, nothing panics.
    let small = common::capped_engine(64 << 10);
    let (rows, hidden, vocab) = (8, 256, 100);
    let x = Tensor::zeros(&small, &[rows, hidden], DType::F32).unwrap();
    let w = Tensor::zeros(&small, &[vocab, hidden], DType::F32).unwrap();
    assert!(w.byte_len() > small.max_binding_bytes());
    let t = Tensor::from_slice(&small, &vec![1i32; rows], &[rows]).unwrap();
    let head = LinearHead {
        input: &x,
        weight: &w,
        bias: None,
    };
    match fused_linear_cross_entropy(head, &t, &FusedLinearCrossEntropyOptions::default()) {
        Err(Error::LimitExceeded { bytes, limit, .. }) => {
            assert_eq!(limit, small.max_binding_bytes());
            assert!(bytes > limit, "{bytes}");
        }
        other => panic!("expected LimitExceeded, got {:?}", other.map(|_| ())),
    }
}
