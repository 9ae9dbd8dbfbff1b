//! The loss family (`wgrad::loss`) against the f64 references of `wgrad::reference::loss`:
//! softmax, log-softmax, sparsemax, cross-entropy (every option alone and all together, every
//! reduction, explicit cotangents), soft-target cross-entropy, KL, JSD and TVD, in every
//! storage dtype, on ragged, tiny and empty shapes; the reference backwards against finite
//! differences; bit-identical reruns; a 262,144-class row; Liger's CE shape scaled down;
//! large common logit shifts; and every documented bad input's error.
//!
//! Tolerance: `Tolerance::for_dtype` of the compared output (gradients and losses are F32).
//! References are computed from the values actually stored, so the budget covers FP32 math.

mod common;

use common::cross_entropy::{as_stored, assert_ce_outputs, options_for};
use common::{Rng, assert_close, engine, tensor_from_f64};
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::loss::{
    self, CrossEntropyOptions, CrossEntropyOutput, DivReduction, Reduction, cross_entropy,
    cross_entropy_backward,
};
use wgrad::reference::loss as reference;
use wgrad::reference::loss::{CrossEntropyConfig, Divergence};
use wgrad::{DType, Error, Tensor};

const F32: Tolerance = Tolerance::for_dtype(DType::F32);

fn data(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    Rng::new(seed).vec(n, lo, hi)
}

fn upload(data: &[f64], shape: &[usize], dtype: DType) -> (Tensor, Vec<f64>) {
    let t = tensor_from_f64(engine(), data, shape, dtype);
    let stored = common::stored(data, dtype);
    (t, stored)
}

/// The softmax (`log` false) or log-softmax of `x` and its saved context.
fn softmax_of(x: &Tensor, log: bool) -> (Tensor, loss::SoftmaxSaved) {
    if log {
        loss::log_softmax(x).unwrap()
    } else {
        loss::softmax(x).unwrap()
    }
}

/// The f64 reference of [`softmax_of`].
fn softmax_reference(xs: &[f64], rows: usize, cols: usize, log: bool) -> Vec<f64> {
    if log {
        reference::log_softmax(xs, rows, cols)
    } else {
        reference::softmax(xs, rows, cols)
    }
}

fn f32_tensor(data: &[f64], shape: &[usize]) -> Tensor {
    tensor_from_f64(engine(), data, shape, DType::F32)
}

fn i32_tensor(data: &[i32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(engine(), data, shape).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    common::f32_bits(t)
}

const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (3, 7),
    (5, 300),
    (2, 513),
    (4, 1000),
    (1, 2),
    (9, 64),
];

// ---- softmax / log-softmax ----------------------------------------------------------------

#[test]
fn softmax_and_log_softmax_match_the_reference() {
    for log in [false, true] {
        for dtype in DType::FLOATS {
            for (k, &(rows, cols)) in SHAPES.iter().enumerate() {
                let what = format!("log={log} {dtype} [{rows}, {cols}]");
                let (x, xs) = upload(
                    &data(k as u64, rows * cols, -4.0, 4.0),
                    &[rows, cols],
                    dtype,
                );
                let (y, saved) = softmax_of(&x, log);
                assert_eq!((y.shape(), y.dtype()), (x.shape(), dtype), "{what}");
                let want = softmax_reference(&xs, rows, cols, log);
                assert_close(
                    &what,
                    &y.to_f64().unwrap(),
                    &want,
                    Tolerance::for_dtype(dtype),
                );
                // Statistics: max and log denominator, separately.
                let stats = saved.stats().to_f64().unwrap();
                for r in 0..rows {
                    let (m, l) = reference::row_stats(&xs[r * cols..(r + 1) * cols]);
                    assert_eq!(stats[2 * r], m, "{what}: max of row {r}");
                    assert!(
                        (stats[2 * r + 1] - l).abs() <= 1e-6,
                        "{what}: log denominator"
                    );
                }
                for dy_dtype in [DType::F32, dtype] {
                    let (dy, dys) = upload(
                        &data(k as u64 + 50, rows * cols, -1.0, 1.0),
                        &[rows, cols],
                        dy_dtype,
                    );
                    let dx = loss::softmax_backward(&saved, &dy).unwrap();
                    assert_eq!(dx.dtype(), DType::F32);
                    let want = reference::softmax_backward(&xs, &dys, rows, cols, log);
                    assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want, F32);
                    // Reruns are bit-identical.
                    let again = loss::softmax_backward(&saved, &dy).unwrap();
                    assert_eq!(bits(&dx), bits(&again), "{what}: rerun of the backward");
                }
                let (y2, _) = softmax_of(&x, log);
                assert_eq!(y.to_f64().unwrap(), y2.to_f64().unwrap(), "{what}: rerun");
            }
        }
    }
}

#[test]
fn softmax_reference_backwards_match_finite_differences() {
    let (rows, cols) = (3, 5);
    let x = data(1, rows * cols, -2.0, 2.0);
    let g = data(2, rows * cols, -1.0, 1.0);
    for log in [false, true] {
        let f = |p: &[f64]| {
            if log {
                reference::log_softmax(p, rows, cols)
            } else {
                reference::softmax(p, rows, cols)
            }
        };
        let analytic = reference::softmax_backward(&x, &g, rows, cols, log);
        let c = check_vjp(f, &x, &g, &analytic);
        assert!(c.passed, "log={log}: {c}");
    }
}

/// The gradient from the output `y` (as stored) against the f64 reference of that output, in
/// F32 and in `y`'s dtype, a rerun bit-identical; returns the F32 gradient.
fn from_output_case(what: &str, y: &Tensor, dy: &Tensor, log: bool) -> Tensor {
    let (rows, cols) = (y.len() / y.shape()[1], y.shape()[1]);
    let want = reference::softmax_backward_from_output(
        &y.to_f64().unwrap(),
        &dy.to_f64().unwrap(),
        rows,
        cols,
        log,
    );
    let dx = loss::softmax_backward_from_output(y, dy, log, DType::F32).unwrap();
    assert_eq!((dx.shape(), dx.dtype()), (y.shape(), DType::F32), "{what}");
    assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want, F32);
    let again = loss::softmax_backward_from_output(y, dy, log, DType::F32).unwrap();
    assert_eq!(bits(&dx), bits(&again), "{what}: rerun");
    let out = y.dtype();
    let dx16 = loss::softmax_backward_from_output(y, dy, log, out).unwrap();
    assert_close(
        &format!("{what} dx {out}"),
        &dx16.to_f64().unwrap(),
        &wgrad::gradcheck::stored_values(&want, out),
        Tolerance::for_dtype(out),
    );
    dx
}

#[test]
fn softmax_backward_from_output_matches_the_reference() {
    // PyTorch's rule: the probabilities are the stored output (softmax y, log-softmax exp(y)).
    // Every dtype and shape, dy in F32 and in y's dtype; for F32 outputs the gradient is
    // within F32 rounding of the one recomputed from x.
    for log in [false, true] {
        for dtype in DType::FLOATS {
            for (k, &(rows, cols)) in SHAPES.iter().enumerate() {
                let what = format!("from output log={log} {dtype} [{rows}, {cols}]");
                let (x, _) = upload(
                    &data(k as u64 + 300, rows * cols, -4.0, 4.0),
                    &[rows, cols],
                    dtype,
                );
                let (y, saved) = softmax_of(&x, log);
                for dy_dtype in [DType::F32, dtype] {
                    let (dy, _) = upload(
                        &data(k as u64 + 350, rows * cols, -1.0, 1.0),
                        &[rows, cols],
                        dy_dtype,
                    );
                    let dx = from_output_case(&what, &y, &dy, log);
                    if dtype == DType::F32 {
                        let from_x = loss::softmax_backward(&saved, &dy).unwrap();
                        assert_close(
                            &format!("{what}: against the gradient from x"),
                            &dx.to_f64().unwrap(),
                            &from_x.to_f64().unwrap(),
                            F32,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn softmax_backward_from_output_wide_rows_and_masks() {
    // The register paths (16-bit half chunks at 32,000 and 16,392 columns, F32 rows at 32,000),
    // the two-pass entries past them (65,544 16-bit, 32,772 F32), and masked positions (−∞
    // logits: softmax y = 0 gives dx = 0, log-softmax y = −∞ gives dx = dy).
    for (dtype, cols, log) in [
        (DType::BF16, 32_000, false),
        (DType::F16, 32_000, true),
        (DType::BF16, 16_392, true),
        (DType::BF16, 65_544, false),
        (DType::F32, 32_000, true),
        (DType::F32, 32_772, false),
    ] {
        let rows = 2;
        let what = format!("from output {dtype} [{rows}, {cols}] log={log}");
        let mut v = data(360 + cols as u64, rows * cols, -6.0, 6.0);
        for c in (0..cols).step_by(7) {
            v[cols + c] = f64::NEG_INFINITY;
        }
        let (x, _) = upload(&v, &[rows, cols], dtype);
        let (dy, dys) = upload(&data(361, rows * cols, -1.0, 1.0), &[rows, cols], dtype);
        let (y, _) = softmax_of(&x, log);
        let dx = from_output_case(&what, &y, &dy, log).to_f64().unwrap();
        for c in (0..cols).step_by(7) {
            let want = if log { dys[cols + c] } else { 0.0 };
            assert_eq!(dx[cols + c], want, "{what}: masked column {c}");
        }
    }
}

#[test]
fn softmax_reference_from_output_is_the_gradient_at_x() {
    // In f64 the output's rule and the recomputing rule are the same gradient (the latter is
    // checked against finite differences above).
    let (rows, cols) = (4, 9);
    let x = data(5, rows * cols, -3.0, 3.0);
    let g = data(6, rows * cols, -1.0, 1.0);
    for log in [false, true] {
        let y = softmax_reference(&x, rows, cols, log);
        let from_y = reference::softmax_backward_from_output(&y, &g, rows, cols, log);
        let from_x = reference::softmax_backward(&x, &g, rows, cols, log);
        for (a, b) in from_y.iter().zip(&from_x) {
            assert!((a - b).abs() <= 1e-12, "log={log}: {a} against {b}");
        }
    }
}

#[test]
fn softmax_keeps_leading_axes_and_empty_shapes() {
    let (x, xs) = upload(&data(3, 2 * 3 * 10, -1.0, 1.0), &[2, 3, 10], DType::F32);
    let (y, _) = loss::softmax(&x).unwrap();
    assert_eq!(y.shape(), &[2, 3, 10]);
    assert_close(
        "[2,3,10]",
        &y.to_f64().unwrap(),
        &reference::softmax(&xs, 6, 10),
        F32,
    );
    for dtype in DType::FLOATS {
        for shape in [[0usize, 5], [3, 0], [0, 0]] {
            let x = Tensor::zeros(engine(), &shape, dtype).unwrap();
            let (y, saved) = loss::log_softmax(&x).unwrap();
            assert_eq!(y.shape(), &shape);
            assert_eq!(y.len(), 0);
            let dy = Tensor::zeros(engine(), &shape, DType::F32).unwrap();
            let dx = loss::softmax_backward(&saved, &dy).unwrap();
            assert_eq!(dx.shape(), &shape);
            let same = Tensor::zeros(engine(), &shape, dtype).unwrap();
            for out in DType::FLOATS {
                let dx = loss::softmax_backward_as(&saved, &same, out).unwrap();
                assert_eq!((dx.shape(), dx.dtype()), (&shape[..], out));
                let dx = loss::softmax_backward_from_output(&y, &same, true, out).unwrap();
                assert_eq!((dx.shape(), dx.dtype()), (&shape[..], out));
            }
        }
    }
}

#[test]
fn log_softmax_survives_a_large_common_shift() {
    // Shifted by 1e4, f32 logits keep their differences exactly (Sterbenz), and so does the
    // result: max and log denominator are kept apart.
    let (rows, cols) = (4, 100);
    let base = data(4, rows * cols, -3.0, 3.0);
    let shifted: Vec<f64> = base.iter().map(|v| v + 1e4).collect();
    let (x, xs) = upload(&shifted, &[rows, cols], DType::F32);
    let (y, _) = loss::log_softmax(&x).unwrap();
    assert_close(
        "log_softmax +1e4",
        &y.to_f64().unwrap(),
        &reference::log_softmax(&xs, rows, cols),
        F32,
    );
}

// ---- sparsemax ------------------------------------------------------------------------------

#[test]
fn sparsemax_matches_the_reference() {
    for dtype in DType::FLOATS {
        for (k, &(rows, cols)) in SHAPES.iter().enumerate() {
            let what = format!("{dtype} [{rows}, {cols}]");
            let (x, xs) = upload(
                &data(k as u64 + 9, rows * cols, -2.0, 2.0),
                &[rows, cols],
                dtype,
            );
            let (y, saved) = loss::sparsemax(&x).unwrap();
            assert_eq!((y.shape(), y.dtype()), (x.shape(), dtype));
            let want = reference::sparsemax(&xs, rows, cols);
            assert_close(
                &what,
                &y.to_f64().unwrap(),
                &want,
                Tolerance::for_dtype(dtype),
            );
            let (dy, dys) = upload(
                &data(k as u64 + 90, rows * cols, -1.0, 1.0),
                &[rows, cols],
                DType::F32,
            );
            let dx = loss::sparsemax_backward(&saved, &dy).unwrap();
            let want = reference::sparsemax_backward(&xs, &dys, rows, cols);
            assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want, F32);
            let again = loss::sparsemax_backward(&saved, &dy).unwrap();
            assert_eq!(bits(&dx), bits(&again), "{what}: rerun");
        }
    }
}

#[test]
fn sparsemax_ties() {
    // Tied maxima share the mass; an element exactly at the threshold is outside the support
    // (output 0, gradient 0); an all-equal row is uniform.
    let rows: Vec<Vec<f64>> = vec![
        vec![2.0, 2.0, 0.0, -1.0],
        vec![1.0, 0.0, -3.0, -3.0],
        vec![0.5, 0.5, 0.5, 0.5],
        vec![3.0, 1.0, 3.0, 1.0],
        vec![0.25, 0.0, -0.25, 0.25],
    ];
    let cols = 4;
    let flat: Vec<f64> = rows.concat();
    let (x, xs) = upload(&flat, &[rows.len(), cols], DType::F32);
    let (y, saved) = loss::sparsemax(&x).unwrap();
    let got = y.to_f64().unwrap();
    let want = reference::sparsemax(&xs, rows.len(), cols);
    assert_close("ties", &got, &want, F32);
    assert_eq!(&got[0..4], &[0.5, 0.5, 0.0, 0.0]);
    assert_eq!(&got[4..8], &[1.0, 0.0, 0.0, 0.0]);
    assert_eq!(&got[8..12], &[0.25; 4]);
    assert_eq!(&got[12..16], &[0.5, 0.0, 0.5, 0.0]);
    let dys = data(11, flat.len(), -1.0, 1.0);
    let dy = f32_tensor(&dys, &[rows.len(), cols]);
    let dx = loss::sparsemax_backward(&saved, &dy)
        .unwrap()
        .to_f64()
        .unwrap();
    let want =
        reference::sparsemax_backward(&xs, &common::stored(&dys, DType::F32), rows.len(), cols);
    assert_close("ties dx", &dx, &want, F32);
    assert_eq!(
        &dx[4..8],
        &[0.0; 4],
        "the single-element support has zero gradient"
    );
}

#[test]
fn sparsemax_reference_backward_matches_finite_differences() {
    let (rows, cols) = (3, 6);
    let x = data(12, rows * cols, -1.0, 1.0);
    let g = data(13, rows * cols, -1.0, 1.0);
    let analytic = reference::sparsemax_backward(&x, &g, rows, cols);
    let c = check_vjp(|p| reference::sparsemax(p, rows, cols), &x, &g, &analytic);
    assert!(c.passed, "{c}");
}

// ---- cross-entropy -----------------------------------------------------------------------

fn targets_for(
    seed: u64,
    rows: usize,
    cols: usize,
    ignore_index: i32,
    ignored_every: usize,
) -> Vec<i32> {
    let mut rng = Rng::new(seed);
    (0..rows)
        .map(|r| {
            if ignored_every > 0 && r % ignored_every == 1 {
                ignore_index
            } else {
                (rng.next_u32() as usize % cols) as i32
            }
        })
        .collect()
}

/// Runs the GPU cross-entropy with `cfg` and compares every output and the gradient (unit and
/// explicit cotangents) with the reference. Weights and ε are stored as f32 on both sides.
#[allow(clippy::too_many_arguments)]
fn ce_case(
    what: &str,
    rows: usize,
    cols: usize,
    dtype: DType,
    cfg: &CrossEntropyConfig,
    targets: &[i32],
    seed: u64,
    spread: f64,
) {
    let cfg = as_stored(cfg);
    let what = format!("{what} {dtype} [{rows}, {cols}] {:?}", cfg.reduction);
    let (x, xs) = upload(
        &data(seed, rows * cols, -spread, spread),
        &[rows, cols],
        dtype,
    );
    let t = i32_tensor(targets, &[rows]);
    let (out, saved) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
    let want = reference::cross_entropy(&xs, targets, rows, cols, &cfg);
    let scalar = cfg.reduction != Reduction::None;
    let expect_shape: &[usize] = if scalar { &[] } else { &[rows] };
    assert_eq!(out.loss.shape(), expect_shape, "{what}");
    assert_eq!(out.z_loss.shape(), expect_shape, "{what}");
    assert_ce_outputs(&what, &out, &want, F32);
    let predicted = out.predicted.as_ref().unwrap();
    assert_eq!(
        predicted.to_vec::<i32>().unwrap(),
        want.predicted,
        "{what} predicted"
    );
    // Unit cotangent.
    let ones = vec![1.0; if scalar { 1 } else { rows }];
    let dx = cross_entropy_backward(&saved, None).unwrap();
    assert_eq!((dx.shape(), dx.dtype()), (x.shape(), DType::F32));
    let want_dx = reference::cross_entropy_backward(&xs, targets, rows, cols, &cfg, &ones);
    assert_close(
        &format!("{what} dx (unit)"),
        &dx.to_f64().unwrap(),
        &want_dx,
        F32,
    );
    // Explicit cotangent of the loss's shape.
    let g = data(seed + 1, ones.len(), -2.0, 2.0);
    let gs = common::stored(&g, DType::F32);
    let gt = f32_tensor(&g, expect_shape);
    let dx2 = cross_entropy_backward(&saved, Some(&gt)).unwrap();
    let want_dx2 = reference::cross_entropy_backward(&xs, targets, rows, cols, &cfg, &gs);
    assert_close(
        &format!("{what} dx (cotangent)"),
        &dx2.to_f64().unwrap(),
        &want_dx2,
        F32,
    );
    // Reruns are bit-identical.
    let (out2, saved2) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
    assert_eq!(bits(&out.loss), bits(&out2.loss), "{what}: loss rerun");
    assert_eq!(
        bits(&dx2),
        bits(&cross_entropy_backward(&saved2, Some(&gt)).unwrap()),
        "{what}: gradient rerun"
    );
}

fn all_options(classes: usize) -> CrossEntropyConfig {
    CrossEntropyConfig {
        ignore_index: 42,
        label_smoothing: 0.1,
        z_loss: 1e-4,
        softcap: Some(30.0),
        weight: Some(data(77, classes, 0.2, 1.5)),
        reduction: Reduction::Mean,
    }
}

#[test]
fn cross_entropy_each_option_alone_and_all_together() {
    let (rows, cols) = (13, 100);
    let base = CrossEntropyConfig::default();
    let options: Vec<(&str, CrossEntropyConfig)> = vec![
        ("plain", base.clone()),
        (
            "ignore_index 42",
            CrossEntropyConfig {
                ignore_index: 42,
                ..base.clone()
            },
        ),
        (
            "smoothing 0.1",
            CrossEntropyConfig {
                label_smoothing: 0.1,
                ..base.clone()
            },
        ),
        (
            "z-loss 1e-4",
            CrossEntropyConfig {
                z_loss: 1e-4,
                ..base.clone()
            },
        ),
        (
            "softcap 3",
            CrossEntropyConfig {
                softcap: Some(3.0),
                ..base.clone()
            },
        ),
        (
            "weights",
            CrossEntropyConfig {
                weight: Some(data(5, cols, 0.1, 2.0)),
                ..base.clone()
            },
        ),
        ("all options", all_options(cols)),
    ];
    for (name, cfg) in &options {
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let cfg = CrossEntropyConfig {
                reduction,
                ..cfg.clone()
            };
            for dtype in DType::FLOATS {
                let targets = targets_for(3, rows, cols, cfg.ignore_index, 4);
                ce_case(name, rows, cols, dtype, &cfg, &targets, 21, 6.0);
            }
        }
    }
}

#[test]
fn cross_entropy_ragged_and_wide_rows() {
    let cfg = all_options(1000);
    for &(rows, cols) in &[(1usize, 1usize), (2, 3), (5, 257), (3, 1000)] {
        let mut cfg = cfg.clone();
        cfg.weight = Some(data(8, cols, 0.2, 1.5));
        let targets = targets_for(rows as u64, rows, cols, 42, 0);
        for dtype in DType::FLOATS {
            ce_case("ragged", rows, cols, dtype, &cfg, &targets, 31, 10.0);
            ce_case(
                "ragged plain",
                rows,
                cols,
                dtype,
                &CrossEntropyConfig::default(),
                &targets,
                32,
                10.0,
            );
        }
    }
}

#[test]
fn cross_entropy_all_ignored_is_zero_with_zero_gradient() {
    let (rows, cols) = (6, 50);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for weighted in [false, true] {
            let cfg = CrossEntropyConfig {
                reduction,
                z_loss: 1e-3,
                label_smoothing: 0.2,
                weight: weighted.then(|| vec![1.0; cols]),
                ..Default::default()
            };
            let targets = vec![-100; rows];
            let x = f32_tensor(&data(40, rows * cols, -5.0, 5.0), &[rows, cols]);
            let t = i32_tensor(&targets, &[rows]);
            let (out, saved) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
            assert!(
                out.loss.to_f64().unwrap().iter().all(|&v| v == 0.0),
                "{reduction:?}"
            );
            assert!(out.z_loss.to_f64().unwrap().iter().all(|&v| v == 0.0));
            assert_eq!(out.accuracy.to_f64().unwrap(), vec![0.0]);
            assert_eq!(
                out.predicted.unwrap().to_vec::<i32>().unwrap(),
                vec![-1; rows]
            );
            let dx = cross_entropy_backward(&saved, None)
                .unwrap()
                .to_f64()
                .unwrap();
            assert!(dx.iter().all(|&v| v == 0.0), "{reduction:?}: gradient");
        }
    }
}

#[test]
fn cross_entropy_zero_rows() {
    let x = Tensor::zeros(engine(), &[0, 7], DType::BF16).unwrap();
    let t = i32_tensor(&[], &[0]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let opts = CrossEntropyOptions {
            reduction,
            ..Default::default()
        };
        let (out, saved) = cross_entropy(&x, &t, &opts).unwrap();
        let loss = out.loss.to_f64().unwrap();
        if reduction == Reduction::None {
            assert!(loss.is_empty());
        } else {
            assert_eq!(loss, vec![0.0]);
        }
        let dx = cross_entropy_backward(&saved, None).unwrap();
        assert_eq!(dx.shape(), &[0, 7]);
    }
}

#[test]
fn cross_entropy_predicted_ties_go_to_the_lowest_index() {
    let x = f32_tensor(
        &[
            1.0, 3.0, 3.0, 0.0, 5.0, 5.0, 5.0, 5.0, -1.0, -2.0, -1.0, -3.0,
        ],
        &[3, 4],
    );
    let t = i32_tensor(&[2, 0, 0], &[3]);
    let (out, _) = cross_entropy(&x, &t, &CrossEntropyOptions::default()).unwrap();
    assert_eq!(
        out.predicted.unwrap().to_vec::<i32>().unwrap(),
        vec![1, 0, 0]
    );
    let acc = out.accuracy.to_f64().unwrap()[0];
    assert!((acc - 2.0 / 3.0).abs() < 1e-7);
    // Whole-chunk rows of 10,000 classes (four chunks loaded per step, then a remainder):
    // ties across lanes and steps, inside one chunk, and at the last column.
    let cols = 10_000;
    for dtype in [DType::F32, DType::BF16] {
        let mut v = data(190, 3 * cols, -1.0, 1.0);
        for c in [4321, 1029, 9999] {
            v[c] = 7.0;
        }
        for c in [2043, 2042, 6000] {
            v[cols + c] = 7.0;
        }
        v[2 * cols + 9999] = 7.0;
        let (x, _) = upload(&v, &[3, cols], dtype);
        let t = i32_tensor(&[1029, 0, 9999], &[3]);
        let (out, _) = cross_entropy(&x, &t, &CrossEntropyOptions::default()).unwrap();
        assert_eq!(
            out.predicted.unwrap().to_vec::<i32>().unwrap(),
            vec![1029, 2042, 9999],
            "{dtype}"
        );
    }
}

#[test]
fn cross_entropy_16bit_rows_by_groups_of_four_chunks() {
    // 16-bit whole-chunk rows without a softcap or label smoothing take each step of four
    // chunks as one group (maximum first, one rescale, then the sum of exponentials): 32,000
    // classes (4,000 chunks: lanes 0–159 take four groups, the others three groups and three
    // single chunks), 8,200 (1,025 chunks: one group a lane, lane 0 one more chunk) and 64
    // (single chunks only). Class weights, z-loss and ignored rows are independent of the
    // grouping, so they ride along.
    for dtype in [DType::BF16, DType::F16] {
        for cols in [32_000usize, 8_200, 64] {
            let rows = 5;
            let cfg = CrossEntropyConfig {
                ignore_index: -100,
                z_loss: 1e-3,
                weight: Some(data(240, cols, 0.2, 1.5)),
                reduction: Reduction::None,
                ..Default::default()
            };
            let targets = targets_for(241 + cols as u64, rows, cols, -100, 3);
            ce_case("groups", rows, cols, dtype, &cfg, &targets, 242, 8.0);
        }
    }
    // Rows of 32,000: plain; masked (a seventh of the values, a whole chunk and the last one
    // −∞); shifted by 1e4; ties of the maximum inside one lane's group (chunks 261 and 773 of
    // lane 5, twice inside chunk 261) and in another lane's later group; a row of −∞ but for
    // one value in the third chunk of a group.
    let (rows, cols) = (5, 32_000);
    for dtype in [DType::BF16, DType::F16] {
        let mut v = data(243, rows * cols, -6.0, 6.0);
        for c in (0..cols).step_by(7).chain(8..16).chain([cols - 1]) {
            v[cols + c] = f64::NEG_INFINITY;
        }
        for (a, b) in v[2 * cols..3 * cols]
            .iter_mut()
            .zip(data(244, cols, -200.0, 8.0))
        {
            *a = b + 1e4;
        }
        for c in [261 * 8 + 3, 261 * 8 + 5, 773 * 8 + 1, 1029 * 8 + 7] {
            v[3 * cols + c] = 9.0;
        }
        v[4 * cols..].fill(f64::NEG_INFINITY);
        v[4 * cols + 517 * 8 + 6] = 2.5;
        let what = format!("groups {dtype} special rows");
        let (x, xs) = upload(&v, &[rows, cols], dtype);
        let targets = [3, 9, 31_999, 2093, 517 * 8 + 6];
        let t = i32_tensor(&targets, &[rows]);
        let cfg = CrossEntropyConfig {
            reduction: Reduction::None,
            z_loss: 1e-4,
            ..Default::default()
        };
        let (out, saved) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
        let want = reference::cross_entropy(&xs, &targets, rows, cols, &cfg);
        assert_ce_outputs(&what, &out, &want, F32);
        let predicted = out.predicted.as_ref().unwrap().to_vec::<i32>().unwrap();
        assert_eq!(predicted, want.predicted, "{what}: predicted");
        assert_eq!(predicted[3], 261 * 8 + 3, "{what}: first of the ties");
        assert_eq!(predicted[4], 517 * 8 + 6, "{what}: the one finite value");
        let dx = cross_entropy_backward(&saved, None).unwrap();
        let want_dx = reference::cross_entropy_backward(&xs, &targets, rows, cols, &cfg, &[1.0; 5]);
        assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want_dx, F32);
        let (again, saved2) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
        assert_eq!(bits(&out.loss), bits(&again.loss), "{what}: rerun");
        assert_eq!(
            bits(saved.rows_matrix()),
            bits(saved2.rows_matrix()),
            "{what}: rerun statistics"
        );
    }
}

#[test]
fn cross_entropy_keeps_small_loss_differences_under_a_1e4_shift() {
    // Two rows differ only in one logit by 1/64; shifted by 1e4 (exactly representable
    // differences in f32), the loss of each row and their difference must stay f32-accurate:
    // recombining max and log denominator before subtracting would lose ~1e-3.
    let cols = 200;
    let mut base = data(50, cols, -2.0, 2.0);
    for v in base.iter_mut() {
        *v = (*v * 64.0).round() / 64.0;
    }
    let mut second = base.clone();
    second[7] += 1.0 / 64.0;
    for shift in [0.0, 1e4, -1e4] {
        let flat: Vec<f64> = base.iter().chain(&second).map(|v| v + shift).collect();
        let (x, xs) = upload(&flat, &[2, cols], DType::F32);
        assert_eq!(xs, flat, "the shifted logits are exact in f32");
        let cfg = CrossEntropyConfig {
            reduction: Reduction::None,
            ..Default::default()
        };
        let targets = [7, 7];
        let t = i32_tensor(&targets, &[2]);
        let (out, saved) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
        let got = out.loss.to_f64().unwrap();
        let want = reference::cross_entropy(&xs, &targets, 2, cols, &cfg).loss;
        assert_close(&format!("shift {shift}"), &got, &want, F32);
        let d = got[0] - got[1];
        assert!(
            ((want[0] - want[1]) - d).abs() < 2e-6,
            "shift {shift}: difference {d} vs {}",
            want[0] - want[1]
        );
        let dx = cross_entropy_backward(&saved, None)
            .unwrap()
            .to_f64()
            .unwrap();
        let want_dx = reference::cross_entropy_backward(&xs, &targets, 2, cols, &cfg, &[1.0, 1.0]);
        assert_close(&format!("shift {shift} dx"), &dx, &want_dx, F32);
    }
}

#[test]
fn cross_entropy_reference_backward_matches_finite_differences() {
    let (rows, cols) = (4, 6);
    let x = data(60, rows * cols, -2.0, 2.0);
    let targets = [1, 42, 5, 0];
    let mut cfg = all_options(cols);
    cfg.softcap = Some(2.5);
    cfg.z_loss = 0.05;
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        cfg.reduction = reduction;
        let g = data(
            61,
            if reduction == Reduction::None {
                rows
            } else {
                1
            },
            -1.0,
            1.0,
        );
        let analytic = reference::cross_entropy_backward(&x, &targets, rows, cols, &cfg, &g);
        let c = check_vjp(
            |p| reference::cross_entropy(p, &targets, rows, cols, &cfg).loss,
            &x,
            &g,
            &analytic,
        );
        assert!(c.passed, "{reduction:?}: {c}");
    }
}

#[test]
fn cross_entropy_with_262144_classes() {
    let (rows, cols) = (2, 262_144);
    let targets = [5, 262_143];
    for cfg in [CrossEntropyConfig::default(), {
        let mut c = all_options(cols);
        c.ignore_index = -100;
        c
    }] {
        ce_case(
            "262144 classes",
            rows,
            cols,
            DType::F32,
            &cfg,
            &targets,
            70,
            8.0,
        );
    }
    let (x, xs) = upload(&data(71, cols, -8.0, 8.0), &[1, cols], DType::BF16);
    let (y, saved) = loss::softmax(&x).unwrap();
    assert_close(
        "softmax 262144",
        &y.to_f64().unwrap(),
        &reference::softmax(&xs, 1, cols),
        Tolerance::for_dtype(DType::BF16),
    );
    let dys = data(72, cols, -1.0, 1.0);
    let dx = loss::softmax_backward(&saved, &f32_tensor(&dys, &[1, cols])).unwrap();
    assert_close(
        "softmax 262144 dx",
        &dx.to_f64().unwrap(),
        &reference::softmax_backward(&xs, &common::stored(&dys, DType::F32), 1, cols, false),
        F32,
    );
}

#[test]
fn cross_entropy_liger_shape_scaled_down() {
    // Liger tests (3, 423, 32000); scaled for a CPU adapter: 3·47 rows of 32,000 classes,
    // about a fifth of the targets ignored, bf16 logits, all options.
    let (rows, cols) = (3 * 47, 32_000);
    let mut cfg = all_options(cols);
    cfg.weight = Some(data(80, cols, 0.2, 1.5));
    let targets = targets_for(81, rows, cols, 42, 5);
    ce_case(
        "liger shape",
        rows,
        cols,
        DType::BF16,
        &cfg,
        &targets,
        82,
        10.0,
    );
}

#[test]
fn cross_entropy_bad_targets() {
    let x = f32_tensor(&data(90, 3 * 5, -1.0, 1.0), &[3, 5]);
    for (bad, row) in [(5, 1usize), (100, 2)] {
        let mut t = vec![0, 1, 2];
        t[row] = bad;
        match cross_entropy(&x, &i32_tensor(&t, &[3]), &CrossEntropyOptions::default()) {
            Err(Error::OutOfBounds {
                got,
                min,
                max,
                what,
            }) => {
                assert_eq!((got, min, max), (bad as u64, 0, 4));
                assert!(what.contains(&format!("targets[{row}]")), "{what}");
            }
            other => panic!("expected OutOfBounds, got {other:?}"),
        }
    }
    match cross_entropy(
        &x,
        &i32_tensor(&[0, -3, 1], &[3]),
        &CrossEntropyOptions::default(),
    ) {
        Err(Error::InvalidValue { got, .. }) => assert_eq!(got, -3.0),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    // ignore_index is allowed whatever its value.
    let opts = CrossEntropyOptions {
        ignore_index: 9,
        ..Default::default()
    };
    assert!(cross_entropy(&x, &i32_tensor(&[9, 0, 9], &[3]), &opts).is_ok());
    // Without the check, out-of-range rows count as ignored.
    let opts = CrossEntropyOptions {
        check_targets: false,
        reduction: Reduction::None,
        ..Default::default()
    };
    let (out, saved) = cross_entropy(&x, &i32_tensor(&[7, 1, -4], &[3]), &opts).unwrap();
    let loss = out.loss.to_f64().unwrap();
    assert_eq!((loss[0], loss[2]), (0.0, 0.0));
    assert!(loss[1] > 0.0);
    let dx = cross_entropy_backward(&saved, None)
        .unwrap()
        .to_f64()
        .unwrap();
    assert!(dx[..5].iter().chain(&dx[10..]).all(|&v| v == 0.0));
}

#[test]
fn cross_entropy_bad_inputs() {
    let e = engine();
    let x = f32_tensor(&data(91, 4 * 6, -1.0, 1.0), &[4, 6]);
    let t = i32_tensor(&[0, 1, 2, 3], &[4]);
    let d = CrossEntropyOptions::default();
    let xi = Tensor::from_slice(e, &[1i32; 24], &[4, 6]).unwrap();
    assert!(matches!(
        cross_entropy(&xi, &t, &d),
        Err(Error::UnsupportedDType {
            got: DType::I32,
            ..
        })
    ));
    let tf = f32_tensor(&[0.0; 4], &[4]);
    assert!(matches!(
        cross_entropy(&x, &tf, &d),
        Err(Error::UnsupportedDType {
            got: DType::F32,
            ..
        })
    ));
    match cross_entropy(&x, &i32_tensor(&[0, 1, 2], &[3]), &d) {
        Err(Error::ShapeMismatch { expected, got, .. }) => {
            assert_eq!((expected, got), (vec![4], vec![3]))
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let z = Tensor::zeros(e, &[4, 0], DType::F32).unwrap();
    assert!(matches!(
        cross_entropy(&z, &t, &d),
        Err(Error::OutOfBounds { got: 0, min: 1, .. })
    ));
    for (eps, z_loss, cap) in [
        (-0.1, 0.0, None),
        (1.5, 0.0, None),
        (f32::NAN, 0.0, None),
        (0.0, -1.0, None),
        (0.0, f32::INFINITY, None),
        (0.0, 0.0, Some(0.0)),
        (0.0, 0.0, Some(-2.0)),
    ] {
        let o = CrossEntropyOptions {
            label_smoothing: eps,
            z_loss,
            softcap: cap,
            ..Default::default()
        };
        assert!(
            matches!(cross_entropy(&x, &t, &o), Err(Error::InvalidValue { .. })),
            "{eps} {z_loss} {cap:?}"
        );
    }
    let o = CrossEntropyOptions {
        weight: Some(f32_tensor(&[1.0; 5], &[5])),
        ..Default::default()
    };
    match cross_entropy(&x, &t, &o) {
        Err(Error::ShapeMismatch { expected, got, .. }) => {
            assert_eq!((expected, got), (vec![6], vec![5]))
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let o = CrossEntropyOptions {
        weight: Some(tensor_from_f64(e, &[1.0; 6], &[6], DType::BF16)),
        ..Default::default()
    };
    assert!(matches!(
        cross_entropy(&x, &t, &o),
        Err(Error::UnsupportedDType {
            got: DType::BF16,
            ..
        })
    ));
    // Cotangents of the wrong shape or dtype.
    let (_, saved) = cross_entropy(&x, &t, &d).unwrap();
    assert!(matches!(
        cross_entropy_backward(&saved, Some(&f32_tensor(&[1.0; 4], &[4]))),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        cross_entropy_backward(&saved, Some(&tensor_from_f64(e, &[1.0], &[], DType::F16))),
        Err(Error::UnsupportedDType { .. })
    ));
    assert!(cross_entropy_backward(&saved, Some(&f32_tensor(&[1.0], &[1]))).is_ok());
    let o = CrossEntropyOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let (_, saved) = cross_entropy(&x, &t, &o).unwrap();
    assert!(matches!(
        cross_entropy_backward(&saved, Some(&f32_tensor(&[1.0], &[]))),
        Err(Error::ShapeMismatch { .. })
    ));
    // Another engine's tensor.
    let other = common::private_engine();
    let t_other = Tensor::from_slice(&other, &[0i32, 1, 2, 3], &[4]).unwrap();
    assert!(matches!(
        cross_entropy(&x, &t_other, &d),
        Err(Error::EngineMismatch { .. })
    ));
}

#[test]
fn cross_entropy_respects_the_workspace_bound() {
    let engine = common::private_engine();
    let rows = 300;
    let needed = loss::cross_entropy_workspace_bytes(rows);
    let x = tensor_from_f64(&engine, &vec![0.5; rows * 3], &[rows, 3], DType::F32);
    let t = Tensor::from_slice(&engine, &vec![1i32; rows], &[rows]).unwrap();
    engine.set_workspace_bound(needed - 1);
    match cross_entropy(&x, &t, &CrossEntropyOptions::default()) {
        Err(Error::WorkspaceExceeded {
            needed: n, bound, ..
        }) => assert_eq!((n, bound), (needed, needed - 1)),
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
    engine.set_workspace_bound(needed);
    let (out, _) = cross_entropy(&x, &t, &CrossEntropyOptions::default()).unwrap();
    let l = out.loss.to_vec::<f32>().unwrap()[0];
    assert!((f64::from(l) - 3f64.ln()).abs() < 1e-6);
}

// ---- soft-target cross-entropy ----------------------------------------------------------

#[test]
fn cross_entropy_soft_matches_the_reference() {
    for dtype in DType::FLOATS {
        for &(rows, cols) in &[(1usize, 1usize), (3, 7), (6, 300)] {
            let raw = data(100 + cols as u64, rows * cols, 0.0, 1.0);
            let mut tdata = raw.clone();
            for r in 0..rows {
                let s: f64 = raw[r * cols..(r + 1) * cols].iter().sum();
                for c in 0..cols {
                    tdata[r * cols + c] /= s;
                }
            }
            let (x, xs) = upload(&data(101, rows * cols, -5.0, 5.0), &[rows, cols], dtype);
            let (t, ts) = upload(&tdata, &[rows, cols], dtype);
            for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
                let what = format!("{dtype} [{rows}, {cols}] {reduction:?}");
                let (out, saved) = loss::cross_entropy_soft(&x, &t, reduction).unwrap();
                let want = reference::cross_entropy_soft(&xs, &ts, rows, cols, reduction);
                assert_close(&what, &out.loss.to_f64().unwrap(), &want, F32);
                assert!(out.predicted.is_none());
                let g = data(102, want.len(), -2.0, 2.0);
                let shape: &[usize] = if reduction == Reduction::None {
                    &[rows]
                } else {
                    &[]
                };
                let dx = cross_entropy_backward(&saved, Some(&f32_tensor(&g, shape))).unwrap();
                let want_dx = reference::cross_entropy_soft_backward(
                    &xs,
                    &ts,
                    rows,
                    cols,
                    reduction,
                    &common::stored(&g, DType::F32),
                );
                assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want_dx, F32);
                let dx1 = cross_entropy_backward(&saved, None).unwrap();
                let ones = vec![1.0; want.len()];
                let want_dx1 =
                    reference::cross_entropy_soft_backward(&xs, &ts, rows, cols, reduction, &ones);
                assert_close(
                    &format!("{what} dx unit"),
                    &dx1.to_f64().unwrap(),
                    &want_dx1,
                    F32,
                );
            }
        }
    }
    // Finite differences of the reference.
    let (rows, cols) = (2, 5);
    let x = data(103, rows * cols, -1.0, 1.0);
    let t = data(104, rows * cols, 0.0, 0.4);
    for reduction in [Reduction::Mean, Reduction::None] {
        let g = data(
            105,
            if reduction == Reduction::None {
                rows
            } else {
                1
            },
            -1.0,
            1.0,
        );
        let analytic = reference::cross_entropy_soft_backward(&x, &t, rows, cols, reduction, &g);
        let c = check_vjp(
            |p| reference::cross_entropy_soft(p, &t, rows, cols, reduction),
            &x,
            &g,
            &analytic,
        );
        assert!(c.passed, "{c}");
    }
    // Shape and dtype errors.
    let x = f32_tensor(&[0.0; 6], &[2, 3]);
    assert!(matches!(
        loss::cross_entropy_soft(&x, &f32_tensor(&[0.0; 3], &[1, 3]), Reduction::Mean),
        Err(Error::ShapeMismatch { .. })
    ));
    let ti = Tensor::from_slice(engine(), &[0i32; 6], &[2, 3]).unwrap();
    assert!(matches!(
        loss::cross_entropy_soft(&x, &ti, Reduction::Mean),
        Err(Error::UnsupportedDType { .. })
    ));
}

// ---- divergences --------------------------------------------------------------------------

/// Log-probabilities of random rows (what KL's input and JSD's inputs are).
fn log_probs(seed: u64, rows: usize, cols: usize) -> Vec<f64> {
    reference::log_softmax(&data(seed, rows * cols, -3.0, 3.0), rows, cols)
}

#[allow(clippy::too_many_arguments)]
fn divergence_case(
    what: &str,
    kind: Divergence,
    x: &[f64],
    t: &[f64],
    rows: usize,
    cols: usize,
    labels: Option<&[i32]>,
    reduction: DivReduction,
    dtype: DType,
) {
    let what = format!("{what} {dtype} [{rows}, {cols}] {reduction:?}");
    let (xt, xs) = upload(x, &[rows, cols], dtype);
    let (tt, ts) = upload(t, &[rows, cols], dtype);
    let lt = labels.map(|l| i32_tensor(l, &[rows]));
    let run = || match kind {
        Divergence::Kl { log_target } => loss::kl_div(&xt, &tt, log_target, reduction),
        Divergence::Jsd { beta } => loss::jsd(&xt, &tt, beta as f32, lt.as_ref(), -100),
        Divergence::Tvd => loss::tvd(&xt, &tt, reduction, lt.as_ref(), -100),
    };
    let (l, saved) = run().unwrap();
    let want = reference::divergence(kind, &xs, &ts, rows, cols, labels, -100, reduction);
    let shape: Vec<usize> = if reduction == DivReduction::None {
        vec![rows, cols]
    } else {
        vec![]
    };
    assert_eq!(l.shape(), &shape[..], "{what}");
    // Sums of `cols` elementwise terms per row: FP32 accumulation, scale the absolute budget
    // with the row length.
    let tol = Tolerance {
        abs: 1e-5 * (1.0 + cols as f64 / 256.0),
        ..F32
    };
    assert_close(&format!("{what} loss"), &l.to_f64().unwrap(), &want, tol);
    let g = data(200, want.len(), -2.0, 2.0);
    let dx = loss::divergence_backward(&saved, Some(&f32_tensor(&g, &shape))).unwrap();
    let want_dx = reference::divergence_backward(
        kind,
        &xs,
        &ts,
        rows,
        cols,
        labels,
        -100,
        reduction,
        &common::stored(&g, DType::F32),
    );
    assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want_dx, F32);
    let dx1 = loss::divergence_backward(&saved, None).unwrap();
    let ones = vec![1.0; want.len()];
    let want_dx1 =
        reference::divergence_backward(kind, &xs, &ts, rows, cols, labels, -100, reduction, &ones);
    assert_close(
        &format!("{what} dx unit"),
        &dx1.to_f64().unwrap(),
        &want_dx1,
        F32,
    );
    let (l2, _) = run().unwrap();
    assert_eq!(bits(&l), bits(&l2), "{what}: rerun");
}

const DIV_REDUCTIONS: [DivReduction; 4] = [
    DivReduction::None,
    DivReduction::Sum,
    DivReduction::Mean,
    DivReduction::BatchMean,
];

#[test]
fn kl_div_matches_the_reference() {
    for &(rows, cols) in &[(1usize, 1usize), (3, 7), (5, 300), (4, 64)] {
        let x = log_probs(300, rows, cols);
        let lp = log_probs(301, rows, cols);
        let p: Vec<f64> = lp.iter().map(|v| v.exp()).collect();
        for dtype in DType::FLOATS {
            for reduction in DIV_REDUCTIONS {
                divergence_case(
                    "kl",
                    Divergence::Kl { log_target: false },
                    &x,
                    &p,
                    rows,
                    cols,
                    None,
                    reduction,
                    dtype,
                );
                divergence_case(
                    "kl log_target",
                    Divergence::Kl { log_target: true },
                    &x,
                    &lp,
                    rows,
                    cols,
                    None,
                    reduction,
                    dtype,
                );
            }
        }
    }
    // A zero target contributes nothing (xlogy).
    let x = f32_tensor(&[-1.0, -2.0], &[1, 2]);
    let t = f32_tensor(&[0.0, 1.0], &[1, 2]);
    let (l, _) = loss::kl_div(&x, &t, false, DivReduction::Sum).unwrap();
    assert_eq!(l.to_f64().unwrap(), vec![2.0]);
}

#[test]
fn jsd_matches_the_reference_for_beta_0_half_and_1() {
    // 128 columns: whole vec4 chunks in every dtype; 129: element by element.
    for cols in [128, 129] {
        jsd_case(cols);
    }
}

fn jsd_case(cols: usize) {
    let rows = 6;
    let x = log_probs(310, rows, cols);
    let t = log_probs(311, rows, cols);
    let labels = [3, -100, 0, 5, -100, 1];
    for beta in [0.0, 0.5, 1.0, 0.2] {
        for dtype in DType::FLOATS {
            divergence_case(
                "jsd",
                Divergence::Jsd { beta },
                &x,
                &t,
                rows,
                cols,
                None,
                DivReduction::BatchMean,
                dtype,
            );
            divergence_case(
                "jsd labels",
                Divergence::Jsd { beta },
                &x,
                &t,
                rows,
                cols,
                Some(&labels),
                DivReduction::BatchMean,
                dtype,
            );
        }
    }
    // β = 0 is the forward KL(P‖Q) with P the teacher, β = 1 the reverse KL(Q‖P).
    let xs = common::stored(&x, DType::F32);
    let ts = common::stored(&t, DType::F32);
    let xt = f32_tensor(&x, &[rows, cols]);
    let tt = f32_tensor(&t, &[rows, cols]);
    let (l0, _) = loss::jsd(&xt, &tt, 0.0, None, -100).unwrap();
    let (k0, _) = loss::kl_div(&xt, &tt, true, DivReduction::BatchMean).unwrap();
    assert_close(
        "β=0 is KL(P‖Q)",
        &l0.to_f64().unwrap(),
        &k0.to_f64().unwrap(),
        F32,
    );
    let (l1, _) = loss::jsd(&xt, &tt, 1.0, None, -100).unwrap();
    let (k1, _) = loss::kl_div(&tt, &xt, true, DivReduction::BatchMean).unwrap();
    assert_close(
        "β=1 is KL(Q‖P)",
        &l1.to_f64().unwrap(),
        &k1.to_f64().unwrap(),
        F32,
    );
    let _ = (xs, ts);
    // All rows ignored: zero loss and zero gradient.
    let all = [-100; 6];
    let lt = i32_tensor(&all, &[rows]);
    let (l, saved) = loss::jsd(&xt, &tt, 0.5, Some(&lt), -100).unwrap();
    assert_eq!(l.to_f64().unwrap(), vec![0.0]);
    assert!(
        loss::divergence_backward(&saved, None)
            .unwrap()
            .to_f64()
            .unwrap()
            .iter()
            .all(|&v| v == 0.0)
    );
}

#[test]
fn tvd_matches_the_reference() {
    for cols in [77, 80] {
        tvd_case(cols);
    }
}

fn tvd_case(cols: usize) {
    let rows = 5;
    let p: Vec<f64> = reference::softmax(&data(320, rows * cols, -2.0, 2.0), rows, cols);
    let mut q: Vec<f64> = reference::softmax(&data(321, rows * cols, -2.0, 2.0), rows, cols);
    q[3] = p[3]; // a tie: zero gradient there
    let labels = [0, -100, 2, 2, -100];
    for dtype in DType::FLOATS {
        for reduction in DIV_REDUCTIONS {
            divergence_case(
                "tvd",
                Divergence::Tvd,
                &p,
                &q,
                rows,
                cols,
                None,
                reduction,
                dtype,
            );
            divergence_case(
                "tvd labels",
                Divergence::Tvd,
                &p,
                &q,
                rows,
                cols,
                Some(&labels),
                reduction,
                dtype,
            );
        }
    }
}

#[test]
fn divergence_reference_backwards_match_finite_differences() {
    let (rows, cols) = (3, 5);
    let x = log_probs(330, rows, cols);
    let lt = log_probs(331, rows, cols);
    let p: Vec<f64> = lt.iter().map(|v| v.exp()).collect();
    let labels = [1, -100, 2];
    let kinds: [(Divergence, &[f64]); 5] = [
        (Divergence::Kl { log_target: false }, &p),
        (Divergence::Kl { log_target: true }, &lt),
        (Divergence::Jsd { beta: 0.0 }, &lt),
        (Divergence::Jsd { beta: 0.5 }, &lt),
        (Divergence::Jsd { beta: 1.0 }, &lt),
    ];
    for (kind, t) in kinds {
        for reduction in DIV_REDUCTIONS {
            let n = if reduction == DivReduction::None {
                rows * cols
            } else {
                1
            };
            let g = data(332, n, -1.0, 1.0);
            let analytic = reference::divergence_backward(
                kind,
                &x,
                t,
                rows,
                cols,
                Some(&labels),
                -100,
                reduction,
                &g,
            );
            let c = check_vjp(
                |q| reference::divergence(kind, q, t, rows, cols, Some(&labels), -100, reduction),
                &x,
                &g,
                &analytic,
            );
            assert!(c.passed, "{kind:?} {reduction:?}: {c}");
        }
    }
    // TVD away from ties (|x − t| > step).
    let q: Vec<f64> = p.iter().map(|v| v + 0.01).collect();
    let g = [0.7];
    let analytic = reference::divergence_backward(
        Divergence::Tvd,
        &p,
        &q,
        rows,
        cols,
        None,
        -100,
        DivReduction::BatchMean,
        &g,
    );
    let c = check_vjp(
        |v| {
            reference::divergence(
                Divergence::Tvd,
                v,
                &q,
                rows,
                cols,
                None,
                -100,
                DivReduction::BatchMean,
            )
        },
        &p,
        &g,
        &analytic,
    );
    assert!(c.passed, "tvd: {c}");
}

#[test]
fn divergence_bad_inputs() {
    let e = engine();
    let x = f32_tensor(&[0.1; 6], &[2, 3]);
    assert!(matches!(
        loss::kl_div(&x, &f32_tensor(&[0.1; 3], &[3]), false, DivReduction::Sum),
        Err(Error::ShapeMismatch { .. })
    ));
    let xi = Tensor::from_slice(e, &[1u32; 6], &[2, 3]).unwrap();
    assert!(matches!(
        loss::kl_div(&xi, &x, false, DivReduction::Sum),
        Err(Error::UnsupportedDType {
            got: DType::U32,
            ..
        })
    ));
    assert!(matches!(
        loss::tvd(&x, &xi, DivReduction::Sum, None, -100),
        Err(Error::UnsupportedDType { .. })
    ));
    for beta in [-0.1f32, 1.01, f32::NAN] {
        assert!(
            matches!(
                loss::jsd(&x, &x, beta, None, -100),
                Err(Error::InvalidValue { .. })
            ),
            "{beta}"
        );
    }
    let bad_labels = i32_tensor(&[1, 2, 3], &[3]);
    assert!(matches!(
        loss::jsd(&x, &x, 0.5, Some(&bad_labels), -100),
        Err(Error::ShapeMismatch { .. })
    ));
    let f_labels = f32_tensor(&[1.0, 2.0], &[2]);
    assert!(matches!(
        loss::tvd(&x, &x, DivReduction::Sum, Some(&f_labels), -100),
        Err(Error::UnsupportedDType { .. })
    ));
    let (_, saved) = loss::tvd(&x, &x, DivReduction::None, None, -100).unwrap();
    assert!(matches!(
        loss::divergence_backward(&saved, Some(&f32_tensor(&[1.0], &[]))),
        Err(Error::ShapeMismatch { .. })
    ));
    let (_, saved) = loss::kl_div(&x, &x, true, DivReduction::Mean).unwrap();
    assert!(matches!(
        loss::divergence_backward(&saved, Some(&f32_tensor(&[1.0; 6], &[2, 3]))),
        Err(Error::ShapeMismatch { .. })
    ));
    // Workspace bound.
    let engine = common::private_engine();
    let rows = 100;
    let needed = loss::divergence_workspace_bytes(rows);
    let xp = tensor_from_f64(&engine, &vec![0.5; rows * 2], &[rows, 2], DType::F32);
    engine.set_workspace_bound(needed - 1);
    assert!(matches!(
        loss::tvd(&xp, &xp, DivReduction::Sum, None, -100),
        Err(Error::WorkspaceExceeded { .. })
    ));
    engine.set_workspace_bound(needed);
    assert!(loss::tvd(&xp, &xp, DivReduction::Sum, None, -100).is_ok());
}

#[test]
fn softmax_and_sparsemax_bad_inputs() {
    let e = engine();
    let xi = Tensor::from_slice(e, &[1i32; 6], &[2, 3]).unwrap();
    assert!(matches!(
        loss::softmax(&xi),
        Err(Error::UnsupportedDType { .. })
    ));
    assert!(matches!(
        loss::sparsemax(&xi),
        Err(Error::UnsupportedDType { .. })
    ));
    let x = f32_tensor(&[0.1; 6], &[2, 3]);
    let (_, saved) = loss::softmax(&x).unwrap();
    assert!(matches!(
        loss::softmax_backward(&saved, &f32_tensor(&[0.1; 6], &[3, 2])),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        loss::softmax_backward(&saved, &xi),
        Err(Error::UnsupportedDType { .. })
    ));
    let (y, _) = loss::softmax(&x).unwrap();
    for (y, dy, out) in [
        (&xi, &x, DType::F32),
        (&y, &xi, DType::F32),
        (&y, &x, DType::I32),
    ] {
        assert!(matches!(
            loss::softmax_backward_from_output(y, dy, false, out),
            Err(Error::UnsupportedDType { .. })
        ));
    }
    assert!(matches!(
        loss::softmax_backward_from_output(&y, &f32_tensor(&[0.1; 6], &[3, 2]), true, DType::F32),
        Err(Error::ShapeMismatch { .. })
    ));
    let (_, saved) = loss::sparsemax(&x).unwrap();
    assert!(matches!(
        loss::sparsemax_backward(&saved, &f32_tensor(&[0.1; 3], &[1, 3])),
        Err(Error::ShapeMismatch { .. })
    ));
    let z = Tensor::zeros(e, &[2, 0], DType::F32).unwrap();
    assert!(matches!(
        loss::sparsemax(&z),
        Err(Error::OutOfBounds { .. })
    ));
}

#[test]
fn cross_entropy_softcap_is_accurate_for_small_logits() {
    // tanh near 0 must keep its relative precision (the z-loss of tiny logits depends on it).
    let cfg = CrossEntropyConfig {
        softcap: Some(30.0),
        z_loss: 1e-4,
        ..Default::default()
    };
    for (rows, cols) in [(64, 1), (4, 3)] {
        let targets = targets_for(7, rows, cols, -100, 0);
        for reduction in [Reduction::Mean, Reduction::None] {
            let cfg = CrossEntropyConfig {
                reduction,
                ..cfg.clone()
            };
            ce_case(
                "softcap small",
                rows,
                cols,
                DType::F32,
                &cfg,
                &targets,
                120,
                0.1,
            );
        }
    }
}

#[test]
fn more_than_65535_rows_fold_the_launch() {
    // One workgroup per row: past 65,535 rows the launch folds into two dimensions. (Kept to
    // one forward and one backward: lavapipe runs 65k workgroups slowly.)
    let (rows, cols) = (65_537, 3);
    let targets = targets_for(130, rows, cols, -100, 7);
    let cfg = CrossEntropyConfig {
        z_loss: 1e-3,
        ..Default::default()
    };
    let (x, xs) = upload(
        &data(131, rows * cols, -3.0, 3.0),
        &[rows, cols],
        DType::F32,
    );
    let t = i32_tensor(&targets, &[rows]);
    let (out, saved) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
    let want = reference::cross_entropy(&xs, &targets, rows, cols, &cfg);
    assert_close(
        "many rows loss",
        &out.loss.to_f64().unwrap(),
        &want.loss,
        F32,
    );
    assert_eq!(
        out.predicted.unwrap().to_vec::<i32>().unwrap(),
        want.predicted
    );
    let dx = cross_entropy_backward(&saved, None)
        .unwrap()
        .to_f64()
        .unwrap();
    let want_dx = reference::cross_entropy_backward(&xs, &targets, rows, cols, &cfg, &[1.0]);
    assert_close("many rows dx", &dx, &want_dx, F32);
}

#[test]
fn a_gradient_past_the_binding_limit_runs_in_windows() {
    // BF16 logits that fit one binding whose F32 gradient does not: the backward writes the
    // gradient in windows of rows. Sized from this device's limit (128 MiB on lavapipe); on
    // devices with a much larger limit the case would need gigabytes, so it runs where it is
    // cheap (the small-limit engine of the next test covers every device).
    let e = engine();
    let limit = e.max_binding_bytes();
    if limit > 512 << 20 {
        eprintln!("binding limit {limit} bytes: the case would need too much memory, skipped");
        return;
    }
    let cols = 65_536;
    let rows = (limit / 4 / cols as u64 + 1) as usize;
    let x = Tensor::zeros(e, &[rows, cols], DType::BF16).unwrap();
    let t = i32_tensor(&vec![0; rows], &[rows]);
    let (out, saved) = cross_entropy(&x, &t, &CrossEntropyOptions::default()).unwrap();
    let l = out.loss.to_f64().unwrap()[0];
    assert!(
        (l - (cols as f64).ln()).abs() < 1e-4,
        "uniform logits: loss {l}"
    );
    let dx = cross_entropy_backward(&saved, None).unwrap();
    assert!(
        dx.byte_len() > limit,
        "the gradient must exceed one binding"
    );
    // Mean over the rows of uniform logits with target 0: (1/cols − [c = 0]) / rows.
    let got = dx.to_vec::<f32>().unwrap();
    for (i, &g) in got.iter().enumerate() {
        let p = 1.0 / cols as f64 - if i % cols == 0 { 1.0 } else { 0.0 };
        let want = p / rows as f64;
        assert!(
            (f64::from(g) - want).abs() <= 1e-6 * want.abs(),
            "dx[{}][{}] = {g}, want {want}",
            i / cols,
            i % cols
        );
    }
}

/// Every output and gradient of the cross-entropy entries on `e` for the given data, as bit
/// patterns ([`common::value_bits`]; predicted classes as they are): loss, z-loss, accuracy, predicted, the F32
/// gradient, the gradient in the logits' dtype and the logits after `cross_entropy_in_place`.
fn ce_everything(
    e: &wgrad::Engine,
    xs: &[f64],
    targets: &[i32],
    shape: [usize; 2],
    dtype: DType,
    reduction: Reduction,
) -> Vec<Vec<u64>> {
    let [rows, cols] = shape;
    let x = tensor_from_f64(e, xs, &shape, dtype);
    let t = Tensor::from_slice(e, targets, &[rows]).unwrap();
    let weights: Vec<f32> = (0..cols).map(|c| 0.5 + (c % 5) as f32 * 0.25).collect();
    let opts = CrossEntropyOptions {
        ignore_index: 3,
        label_smoothing: 0.1,
        z_loss: 1e-4,
        softcap: Some(30.0),
        weight: Some(Tensor::from_slice(e, &weights, &[cols]).unwrap()),
        reduction,
        ..Default::default()
    };
    let cot = (reduction == Reduction::None).then(|| {
        let c: Vec<f32> = (0..rows).map(|r| 1.0 - (r % 7) as f32 * 0.3).collect();
        Tensor::from_slice(e, &c, &[rows]).unwrap()
    });
    let (out, saved) = cross_entropy(&x, &t, &opts).unwrap();
    let dx = cross_entropy_backward(&saved, cot.as_ref()).unwrap();
    let dx_as = loss::cross_entropy_backward_as(&saved, cot.as_ref(), dtype).unwrap();
    let over = tensor_from_f64(e, xs, &shape, dtype);
    loss::cross_entropy_in_place(&over, &t, &opts).unwrap();
    let predicted = out.predicted.as_ref().unwrap().to_vec::<i32>().unwrap();
    let bits = common::value_bits;
    vec![
        bits(&out.loss),
        bits(&out.z_loss),
        bits(&out.accuracy),
        predicted.iter().map(|&p| p as u64).collect(),
        bits(&dx),
        bits(&dx_as),
        bits(&over),
    ]
}

#[test]
fn cross_entropy_past_the_binding_limit_runs_in_windows_with_the_same_bits() {
    // An engine that binds at most 64 KiB: every case's logits span several windows of rows
    // (16-byte chunked rows and element-by-element ones, row counts that leave a short last
    // window; the per-row tensors, bound whole, still fit), and every output and gradient is
    // the one-binding run's, bit for bit, with every option on, for a mean and per-row
    // cotangents.
    let limit = 64 << 10;
    let small = common::capped_engine(limit);
    assert_eq!(
        small.max_binding_bytes(),
        limit.min(engine().max_binding_bytes())
    );
    let cases = [
        (DType::F32, 1000, 70),
        (DType::BF16, 1024, 90),
        (DType::F16, 77, 701),
        (DType::F32, 21, 1501),
    ];
    for (i, (dtype, cols, rows)) in cases.into_iter().enumerate() {
        assert!(
            (rows * cols * dtype.size()) as u64 > limit,
            "case {i} must need windows"
        );
        let xs = data(700 + i as u64, rows * cols, -6.0, 6.0);
        let mut rng = Rng::new(800 + i as u64);
        let targets: Vec<i32> = (0..rows)
            .map(|r| {
                if r % 9 == 4 {
                    3
                } else {
                    (rng.uniform(0.0, cols as f64) as i32).min(cols as i32 - 1)
                }
            })
            .collect();
        for reduction in [Reduction::Mean, Reduction::None] {
            let one = ce_everything(engine(), &xs, &targets, [rows, cols], dtype, reduction);
            let windows = ce_everything(&small, &xs, &targets, [rows, cols], dtype, reduction);
            for (k, (a, b)) in one.iter().zip(&windows).enumerate() {
                assert!(
                    a == b,
                    "case {i} ({dtype:?} {rows}x{cols}, {reduction:?}): output {k} differs"
                );
            }
        }
    }
}

/// Every output of the row-wise loss entries on `e` for input data `xs` and target data `ts`
/// (`[rows, cols]`, `dtype`), as bit patterns: softmax and log-softmax (forward, backward,
/// 16-bit backward, from the output), sparsemax, soft-target cross-entropy, KL (sum, none with
/// a per-element cotangent), JSD with labels and TVD (mean), each with its gradient in F32 and
/// in `dtype`.
fn row_losses_everything(
    e: &wgrad::Engine,
    xs: &[f64],
    ts: &[f64],
    shape: [usize; 2],
    dtype: DType,
) -> Vec<Vec<u64>> {
    let [rows, _] = shape;
    let x = tensor_from_f64(e, xs, &shape, dtype);
    let t = tensor_from_f64(e, ts, &shape, dtype);
    let dy = tensor_from_f64(e, ts, &shape, DType::F32);
    let labels: Vec<i32> = (0..rows as i32)
        .map(|r| if r % 5 == 2 { -100 } else { r })
        .collect();
    let labels = Tensor::from_slice(e, &labels, &[rows]).unwrap();
    let mut outs: Vec<Tensor> = Vec::new();
    for log in [false, true] {
        let (y, saved) = if log {
            loss::log_softmax(&x).unwrap()
        } else {
            loss::softmax(&x).unwrap()
        };
        outs.push(loss::softmax_backward(&saved, &dy).unwrap());
        outs.push(loss::softmax_backward_as(&saved, &t, dtype).unwrap());
        outs.push(loss::softmax_backward_from_output(&y, &t, log, dtype).unwrap());
        outs.push(y);
    }
    let (y, saved) = loss::sparsemax(&x).unwrap();
    outs.push(loss::sparsemax_backward(&saved, &dy).unwrap());
    outs.push(y);
    let (out, saved) = loss::cross_entropy_soft(&x, &t, Reduction::Mean).unwrap();
    outs.push(cross_entropy_backward(&saved, None).unwrap());
    outs.push(out.loss);
    let divergences = [
        loss::kl_div(&x, &t, true, DivReduction::Sum).unwrap(),
        loss::kl_div(&x, &t, true, DivReduction::None).unwrap(),
        loss::jsd(&x, &t, 0.5, Some(&labels), -100).unwrap(),
        loss::tvd(&x, &t, DivReduction::Mean, Some(&labels), -100).unwrap(),
    ];
    for (k, (value, saved)) in divergences.into_iter().enumerate() {
        let cot = (k == 1).then_some(&dy);
        outs.push(loss::divergence_backward(&saved, cot).unwrap());
        outs.push(loss::divergence_backward_as(&saved, cot, dtype).unwrap());
        outs.push(value);
    }
    outs.iter().map(common::value_bits).collect()
}

#[test]
fn row_losses_past_the_binding_limit_run_in_windows_with_the_same_bits() {
    // The softmax family, sparsemax, soft-target cross-entropy and the divergences on an
    // engine binding at most 64 KiB (inputs, targets and gradients many windows long; chunked
    // rows and element-by-element ones) give the one-binding run's bits.
    let limit = 64 << 10;
    let small = common::capped_engine(limit);
    for (i, (dtype, cols, rows)) in [
        (DType::F32, 1000, 70),
        (DType::BF16, 1024, 90),
        (DType::F16, 77, 701),
        (DType::F32, 21, 1501),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(
            (rows * cols * 4) as u64 > limit,
            "case {i} must need windows"
        );
        let xs = data(900 + i as u64, rows * cols, -5.0, 1.0);
        let ts: Vec<f64> = data(950 + i as u64, rows * cols, 0.0, 1.0)
            .iter()
            .map(|v| v / cols as f64 * 2.0)
            .collect();
        let one = row_losses_everything(engine(), &xs, &ts, [rows, cols], dtype);
        let windows = row_losses_everything(&small, &xs, &ts, [rows, cols], dtype);
        assert_eq!(one.len(), windows.len());
        for (k, (a, b)) in one.iter().zip(&windows).enumerate() {
            assert!(
                a == b,
                "case {i} ({dtype:?} {rows}x{cols}): output {k} differs"
            );
        }
    }
}

#[test]
fn ops_that_bind_whole_tensors_refuse_ones_past_the_binding_limit() {
    // Tensors may exceed one binding; an op that does not run in windows returns
    // LimitExceeded naming its binding (nothing panics), and a cross-entropy row wider than
    // one binding can hold is refused the same way.
    let limit = 4 << 10;
    let small = common::capped_engine(limit);
    let x = Tensor::zeros(&small, &[64, 100], DType::F32).unwrap();
    assert!(x.byte_len() > limit);
    match wgrad::reduce::sum_rows(&x) {
        Err(Error::LimitExceeded {
            bytes, limit: l, ..
        }) => {
            assert_eq!((bytes, l), (x.byte_len(), limit));
        }
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    let wide = Tensor::zeros(&small, &[2, 2000], DType::F32).unwrap();
    let t = Tensor::from_slice(&small, &[0i32, 1], &[2]).unwrap();
    match cross_entropy(&wide, &t, &CrossEntropyOptions::default()) {
        Err(Error::LimitExceeded {
            bytes, limit: l, ..
        }) => {
            assert_eq!(l, limit);
            assert!(bytes >= 8000, "{bytes}");
        }
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
}

#[test]
fn masked_minus_infinity_logits_get_zero_probability() {
    // −∞ entries (masked classes) contribute nothing and get zero gradient, in both the
    // element-by-element (7 columns) and the chunked (8 columns) entries.
    for cols in [7usize, 8] {
        let rows = 3;
        let mut v = data(140, rows * cols, -2.0, 2.0);
        for r in 0..rows {
            v[r * cols + 2] = f64::NEG_INFINITY;
            v[r * cols + cols - 1] = f64::NEG_INFINITY;
        }
        let (x, xs) = upload(&v, &[rows, cols], DType::F32);
        let (y, saved) = loss::softmax(&x).unwrap();
        let got = y.to_f64().unwrap();
        assert_close(
            "masked softmax",
            &got,
            &reference::softmax(&xs, rows, cols),
            F32,
        );
        assert_eq!(got[2], 0.0);
        let dys = data(141, rows * cols, -1.0, 1.0);
        let dx = loss::softmax_backward(&saved, &f32_tensor(&dys, &[rows, cols])).unwrap();
        let want =
            reference::softmax_backward(&xs, &common::stored(&dys, DType::F32), rows, cols, false);
        assert_close("masked softmax dx", &dx.to_f64().unwrap(), &want, F32);
        let (ly, _) = loss::log_softmax(&x).unwrap();
        assert_eq!(ly.to_f64().unwrap()[2], f64::NEG_INFINITY);
        let targets = [0, 1, 3];
        let cfg = CrossEntropyConfig {
            reduction: Reduction::None,
            z_loss: 1e-3,
            ..Default::default()
        };
        let t = i32_tensor(&targets, &[rows]);
        let (out, saved) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
        let want = reference::cross_entropy(&xs, &targets, rows, cols, &cfg);
        assert_close("masked ce", &out.loss.to_f64().unwrap(), &want.loss, F32);
        let dx = cross_entropy_backward(&saved, None)
            .unwrap()
            .to_f64()
            .unwrap();
        let want = reference::cross_entropy_backward(&xs, &targets, rows, cols, &cfg, &[1.0; 3]);
        assert_close("masked ce dx", &dx, &want, F32);
    }
}

#[test]
fn register_resident_softmax_rows() {
    // Rows of more than 2,048 and at most 8,192 vec4 chunks (4 F32 or 8 16-bit columns) are
    // read once into registers, forward and backward (dy in x's dtype): 1024 lanes with 8
    // chunks a lane at most where the adapter allows it, else 256 lanes (16-bit forwards of
    // up to 4,096 chunks take `softmax_fwd_c` instead, see
    // `softmax_16bit_rows_held_in_registers`). Widths: 32,000 (the benchmark width), 2,049
    // chunks (just inside), 8,192 chunks (the largest) and 8,193 (just outside: the two-pass
    // entries). Each dtype, mode and chunk count is one large pipeline that lavapipe compiles
    // slowly, so the cases are few.
    for (dtype, cols, log) in [
        (DType::F32, 32_000, false),
        (DType::F32, 8_196, true),
        (DType::F32, 32_768, false),
        (DType::F32, 32_772, true),
        (DType::BF16, 32_000, true),
        (DType::BF16, 16_392, false),
        (DType::F16, 65_536, false),
        (DType::BF16, 65_544, false),
    ] {
        let rows = 2;
        {
            let what = format!("{dtype} [{rows}, {cols}] log={log}");
            let mut v = data(150 + cols as u64, rows * cols, -6.0, 6.0);
            v[cols + 17] = f64::NEG_INFINITY;
            let (x, xs) = upload(&v, &[rows, cols], dtype);
            let (y, saved) = softmax_of(&x, log);
            let want = softmax_reference(&xs, rows, cols, log);
            assert_close(
                &what,
                &y.to_f64().unwrap(),
                &want,
                Tolerance::for_dtype(dtype),
            );
            let stats = saved.stats().to_f64().unwrap();
            for r in 0..rows {
                let (m, l) = reference::row_stats(&xs[r * cols..(r + 1) * cols]);
                assert_eq!(stats[2 * r], m, "{what}: max");
                assert!(
                    (stats[2 * r + 1] - l).abs() <= 1e-5,
                    "{what}: log denominator"
                );
            }
            let (y2, _) = softmax_of(&x, log);
            assert_eq!(y.to_f64().unwrap(), y2.to_f64().unwrap(), "{what}: rerun");
            // Backward with dy in x's dtype, register-resident for the same widths.
            let (dy, dys) = upload(&data(160, rows * cols, -1.0, 1.0), &[rows, cols], dtype);
            let dx = loss::softmax_backward(&saved, &dy).unwrap();
            let want = reference::softmax_backward(&xs, &dys, rows, cols, log);
            assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want, F32);
            let dx2 = loss::softmax_backward(&saved, &dy).unwrap();
            assert_eq!(bits(&dx), bits(&dx2), "{what}: backward rerun");
        }
    }
}

/// The stored bits of a 16-bit tensor.
fn half_bits(t: &Tensor) -> Vec<u16> {
    match t.dtype() {
        DType::BF16 => t
            .to_vec::<half::bf16>()
            .unwrap()
            .into_iter()
            .map(half::bf16::to_bits)
            .collect(),
        DType::F16 => t
            .to_vec::<half::f16>()
            .unwrap()
            .into_iter()
            .map(half::f16::to_bits)
            .collect(),
        other => panic!("not a 16-bit tensor: {other}"),
    }
}

/// (Log-)softmax of the 16-bit `[rows, cols]` matrix `v` against the reference: outputs within
/// the dtype's tolerance (NaN where the reference has NaN), each row's maximum exact and its log
/// denominator within 1e-5 (a row of −∞: −∞ and −∞; a row with +∞ or NaN: NaN), and a rerun
/// bit-identical in the outputs and the statistics.
fn held_rows_case(what: &str, v: &[f64], (rows, cols): (usize, usize), dtype: DType, log: bool) {
    let what = format!("{what}: {dtype} [{rows}, {cols}] log={log}");
    let (x, xs) = upload(v, &[rows, cols], dtype);
    let run = || softmax_of(&x, log);
    let (y, saved) = run();
    let want = softmax_reference(&xs, rows, cols, log);
    assert_close(
        &what,
        &y.to_f64().unwrap(),
        &want,
        Tolerance::for_dtype(dtype),
    );
    let stats = saved.stats().to_f64().unwrap();
    for r in 0..rows {
        let row = &xs[r * cols..(r + 1) * cols];
        let (m, l) = reference::row_stats(row);
        let (gm, gl) = (stats[2 * r], stats[2 * r + 1]);
        if row.iter().all(|&a| a == f64::NEG_INFINITY) {
            assert_eq!((gm, gl), (m, f64::NEG_INFINITY), "{what}: row {r} of −∞");
        } else if row.iter().any(|a| a.is_nan() || *a == f64::INFINITY) {
            assert!(gl.is_nan(), "{what}: row {r} with NaN or +∞: {gl}");
        } else {
            assert_eq!(gm, m, "{what}: max of row {r}");
            assert!((gl - l).abs() <= 1e-5, "{what}: log denominator of row {r}");
        }
    }
    let (y2, saved2) = run();
    assert_eq!(half_bits(&y), half_bits(&y2), "{what}: rerun");
    assert_eq!(
        bits(saved.stats()),
        bits(saved2.stats()),
        "{what}: rerun statistics"
    );
}

#[test]
fn softmax_16bit_rows_held_in_registers() {
    // 16-bit rows of whole chunks (8 columns) of at most 4,096 chunks take `softmax_fwd_c`:
    // 256 lanes, each holding CHUNKS chunks (the smallest power of two that covers the row). Widths:
    // 4,000 chunks (32,000 columns, the benchmark's: lanes 0–159 hold 16 chunks, the others
    // 15), 4,008 (lanes 0–167 hold 16), 4,096 (every register of every lane), 2,100 (CHUNKS 16,
    // lanes holding 8 or 9) and 3 chunks (CHUNKS 1, three lanes). Row 1 of each is masked: a
    // seventh of its values, a whole chunk and its last value are −∞. Each dtype, mode and
    // CHUNKS is one large pipeline that lavapipe compiles slowly, so the cases share them.
    let cases = [
        (DType::BF16, 32_000, false),
        (DType::BF16, 32_064, true),
        (DType::F16, 32_000, true),
        (DType::F16, 32_768, false),
        (DType::BF16, 16_800, true),
        (DType::BF16, 24, false),
        (DType::F16, 24, true),
    ];
    for (dtype, cols, log) in cases {
        let rows = 3;
        let mut v = data(170 + cols as u64, rows * cols, -6.0, 6.0);
        for c in (0..cols).step_by(7).chain(8..16).chain([cols - 1]) {
            v[cols + c.min(cols - 1)] = f64::NEG_INFINITY;
        }
        held_rows_case("registers", &v, (rows, cols), dtype, log);
    }
    // A common shift of 1e4 (16-bit values there are 8 (F16) or 64 (BF16) apart): the maximum
    // and the log denominator are kept apart, so the differences survive.
    for (dtype, log) in [(DType::F16, true), (DType::BF16, false)] {
        let (rows, cols) = (2, 32_000);
        let v: Vec<f64> = data(180, rows * cols, -200.0, 8.0)
            .iter()
            .map(|a| a + 1e4)
            .collect();
        held_rows_case("+1e4", &v, (rows, cols), dtype, log);
    }
    // Rows whose outputs are all NaN take the full BF16 narrowing: a row of −∞, a row with one
    // +∞, a row with one NaN; then an ordinary row.
    for log in [false, true] {
        let (rows, cols) = (4, 32_000);
        let mut v = data(190, rows * cols, -6.0, 6.0);
        v[..cols].fill(f64::NEG_INFINITY);
        v[cols + 1234] = f64::INFINITY;
        v[2 * cols + 31_999] = f64::NAN;
        held_rows_case("degenerate rows", &v, (rows, cols), DType::BF16, log);
    }
}

/// The softmax or log-softmax backward of the 16-bit `[rows, cols]` matrix `v` with dy `g` (both
/// in `dtype`) against the reference (F32 tolerance, NaN where the reference has NaN), and a
/// rerun bit-identical.
fn held_backward_case(
    what: &str,
    v: &[f64],
    g: &[f64],
    (rows, cols): (usize, usize),
    dtype: DType,
    log: bool,
) {
    let what = format!("{what}: {dtype} [{rows}, {cols}] log={log}");
    let (x, xs) = upload(v, &[rows, cols], dtype);
    let (dy, dys) = upload(g, &[rows, cols], dtype);
    let (_, saved) = softmax_of(&x, log);
    let dx = loss::softmax_backward(&saved, &dy).unwrap();
    let want = reference::softmax_backward(&xs, &dys, rows, cols, log);
    assert_close(&what, &dx.to_f64().unwrap(), &want, F32);
    let dx2 = loss::softmax_backward(&saved, &dy).unwrap();
    assert_eq!(bits(&dx), bits(&dx2), "{what}: rerun");
}

#[test]
fn softmax_16bit_backward_held_by_half_chunks() {
    // 16-bit backwards with dy in x's dtype, rows of 2,049–8,192 chunks, take `softmax_bwd_h`:
    // 1024 lanes, each holding HB half chunks (4 columns) of x and dy. Widths: 32,000 (the
    // benchmark's, 8,000 half chunks: HB 8, lanes 0–831 hold 8, the others 7), 16,392 (2,049
    // chunks, just inside: HB 8, lanes 0–1 hold 5, the others 4), 65,536 (every register,
    // HB 16) and 65,544 (8,193 chunks, just outside: the two-pass entry). Row 1 of each is
    // masked: a seventh of its values, a whole chunk and its last value are −∞.
    let cases = [
        (DType::BF16, 32_000, false),
        (DType::F16, 32_000, true),
        (DType::BF16, 16_392, true),
        (DType::F16, 16_392, false),
        (DType::BF16, 65_536, false),
        (DType::BF16, 65_544, true),
    ];
    for (dtype, cols, log) in cases {
        let rows = 3;
        let mut v = data(230 + cols as u64, rows * cols, -6.0, 6.0);
        for c in (0..cols).step_by(7).chain(8..16).chain([cols - 1]) {
            v[cols + c.min(cols - 1)] = f64::NEG_INFINITY;
        }
        let g = data(231 + cols as u64, rows * cols, -1.0, 1.0);
        held_backward_case("half chunks", &v, &g, (rows, cols), dtype, log);
    }
    // A common shift of 1e4 on the logits: the saved maximum and log denominator keep the
    // probabilities accurate.
    for (dtype, log) in [(DType::F16, true), (DType::BF16, false)] {
        let (rows, cols) = (2, 32_000);
        let v: Vec<f64> = data(232, rows * cols, -200.0, 8.0)
            .iter()
            .map(|a| a + 1e4)
            .collect();
        let g = data(233, rows * cols, -1.0, 1.0);
        held_backward_case("+1e4", &v, &g, (rows, cols), dtype, log);
    }
    // Degenerate rows give NaN as the reference does: a row of −∞, a row with one +∞, a row
    // with one NaN; then an ordinary row; and a NaN in dy spreads to its row only.
    for log in [false, true] {
        let (rows, cols) = (5, 32_000);
        let mut v = data(234, rows * cols, -6.0, 6.0);
        v[..cols].fill(f64::NEG_INFINITY);
        v[cols + 1234] = f64::INFINITY;
        v[2 * cols + 31_999] = f64::NAN;
        let mut g = data(235, rows * cols, -1.0, 1.0);
        g[4 * cols + 77] = f64::NAN;
        held_backward_case("degenerate rows", &v, &g, (rows, cols), DType::BF16, log);
    }
}

/// Every output of two cross-entropy calls bit for bit: loss, z-loss, accuracy, predicted.
fn assert_same_ce_outputs(what: &str, got: &CrossEntropyOutput, want: &CrossEntropyOutput) {
    assert_eq!(bits(&got.loss), bits(&want.loss), "{what}: loss");
    assert_eq!(bits(&got.z_loss), bits(&want.z_loss), "{what}: z-loss");
    assert_eq!(
        bits(&got.accuracy),
        bits(&want.accuracy),
        "{what}: accuracy"
    );
    let predicted =
        |o: &CrossEntropyOutput| o.predicted.as_ref().map(|p| p.to_vec::<i32>().unwrap());
    assert_eq!(predicted(got), predicted(want), "{what}: predicted");
}

#[test]
fn cross_entropy_in_place_gives_the_forward_and_the_gradient() {
    // Whole-chunk rows run the forward, then the gradient over the logits one chunk an
    // invocation over a flat grid (one workgroup or many, workgroups spanning rows): bit for
    // bit the backward's gradient (cast to the logits' dtype). Ragged widths (7, 1,002) run the forward and the backward and store the
    // gradient.
    let cases: [(usize, usize, bool); 7] = [
        (3, 8, true),
        (6, 1000, true),
        (2, 3000, false),
        (2, 40_000, false),
        (2, 28_000, false),
        (3, 7, true),
        (4, 1002, false),
    ];
    for (rows, cols, every_reduction) in cases {
        let reductions: &[Reduction] = if every_reduction {
            &[Reduction::None, Reduction::Sum, Reduction::Mean]
        } else {
            &[Reduction::Mean]
        };
        for dtype in DType::FLOATS {
            for &reduction in reductions {
                for all in [false, true] {
                    let (cfg, t, v) = ce_setup(200, (rows, cols), all, reduction, 3);
                    let what = format!("in place {dtype} [{rows}, {cols}] {reduction:?} all={all}");
                    let (x, _) = upload(&v, &[rows, cols], dtype);
                    let opts = options_for(&cfg);
                    let (want, saved) = cross_entropy(&x, &t, &opts).unwrap();
                    let dx = cross_entropy_backward(&saved, None).unwrap();
                    let want_dx = if dtype == DType::F32 {
                        dx.to_f64().unwrap()
                    } else {
                        wgrad::cast::cast(&dx, dtype).unwrap().to_f64().unwrap()
                    };
                    let (y, _) = upload(&v, &[rows, cols], dtype);
                    let got = loss::cross_entropy_in_place(&y, &t, &opts).unwrap();
                    assert_same_ce_outputs(&what, &got, &want);
                    assert_eq!(y.dtype(), dtype);
                    let grad = y.to_f64().unwrap();
                    assert!(
                        grad.iter()
                            .zip(&want_dx)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: gradient"
                    );
                    // Rerun on the same values: the same bits.
                    let (z, _) = upload(&v, &[rows, cols], dtype);
                    let again = loss::cross_entropy_in_place(&z, &t, &opts).unwrap();
                    assert_eq!(bits(&again.loss), bits(&got.loss), "{what}: rerun");
                    assert_eq!(z.to_f64().unwrap(), grad, "{what}: gradient rerun");
                }
            }
        }
    }
}

#[test]
fn cross_entropy_in_place_takes_rows_a_block_at_a_time() {
    // Blocks of 64 and 128 rows (forced) over 229 rows: the blocks' column partials are the
    // whole batch's, so every output and the gradient are the bits of `cross_entropy` and its
    // backward, every dtype, reduction and option (with ignored rows).
    let (rows, cols) = (229, 16);
    for block in [64, 128] {
        loss::force_in_place_rows(Some(block));
        for dtype in DType::FLOATS {
            for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
                for all in [false, true] {
                    let (cfg, t, v) = ce_setup(240, (rows, cols), all, reduction, 40);
                    let what = format!("blocks of {block} {dtype} {reduction:?} all={all}");
                    let (x, _) = upload(&v, &[rows, cols], dtype);
                    let opts = options_for(&cfg);
                    let (want, saved) = cross_entropy(&x, &t, &opts).unwrap();
                    let dx = loss::cross_entropy_backward_as(&saved, None, dtype).unwrap();
                    let (y, _) = upload(&v, &[rows, cols], dtype);
                    let got = loss::cross_entropy_in_place(&y, &t, &opts).unwrap();
                    assert_same_ce_outputs(&what, &got, &want);
                    common::assert_same_bits(&format!("{what}: gradient"), &y, &dx);
                }
            }
        }
    }
    loss::force_in_place_rows(None);
    // Scratch: one block's statistics (4,096 rows), not the batch's: the peak grows by the
    // query's bytes and, when asked for, `predicted`'s 4 bytes a row, below the 32 bytes a row
    // a whole-batch matrix takes.
    let private = common::private_engine();
    let (rows, cols) = (10_000, 8);
    let v = data(241, rows * cols, -4.0, 4.0);
    let targets: Vec<i32> = (0..rows).map(|r| (r % cols) as i32).collect();
    let t = Tensor::from_slice(&private, &targets, &[rows]).unwrap();
    let query = loss::cross_entropy_in_place_workspace_bytes(rows);
    let mut grown = Vec::new();
    for predicted in [true, false] {
        let x = tensor_from_f64(&private, &v, &[rows, cols], DType::BF16);
        private.synchronize().unwrap();
        let before = private.memory().live_bytes;
        private.reset_peak();
        let opts = CrossEntropyOptions {
            predicted,
            ..Default::default()
        };
        let out = loss::cross_entropy_in_place(&x, &t, &opts).unwrap();
        private.synchronize().unwrap();
        let g = private.memory().peak_bytes - before;
        let bound = (query + u64::from(predicted) * 4 * rows as u64) * 5 / 4 + 4096;
        assert!(
            g <= bound && g < 32 * rows as u64,
            "predicted {predicted}: peak grew {g} bytes (query {query}, bound {bound})"
        );
        assert_eq!(out.predicted.is_some(), predicted);
        grown.push(g);
    }
    assert!(
        grown[0] >= grown[1] + 4 * rows as u64,
        "predictions off saved {} bytes of {}",
        grown[0] - grown[1],
        4 * rows
    );
    let opts = CrossEntropyOptions::default();
    // The query is the bound's: one byte less is a typed error, the logits untouched.
    let y = tensor_from_f64(&private, &v, &[rows, cols], DType::BF16);
    private.set_workspace_bound(query - 1);
    match loss::cross_entropy_in_place(&y, &t, &opts) {
        Err(Error::WorkspaceExceeded { .. }) => {}
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
    assert_eq!(y.to_f64().unwrap(), common::stored(&v, DType::BF16));
}

#[test]
fn cross_entropy_without_predictions_keeps_every_other_output() {
    // `predicted: false`: no predictions, and the loss, z-loss, accuracy and gradient are the
    // bits of the call with them: `cross_entropy` (reductions none and mean, every option,
    // ignored rows) and its in-place form in one block and in blocks of 64, every dtype.
    let (rows, cols) = (229, 16);
    for dtype in DType::FLOATS {
        for reduction in [Reduction::None, Reduction::Mean] {
            let (cfg, t, v) = ce_setup(243, (rows, cols), true, reduction, 40);
            let what = format!("{dtype} {reduction:?}");
            let with = options_for(&cfg);
            let without = CrossEntropyOptions {
                predicted: false,
                ..with.clone()
            };
            let (x, _) = upload(&v, &[rows, cols], dtype);
            let (want, saved) = cross_entropy(&x, &t, &with).unwrap();
            let dx = loss::cross_entropy_backward_as(&saved, None, dtype).unwrap();
            let (got, saved) = cross_entropy(&x, &t, &without).unwrap();
            assert!(got.predicted.is_none(), "{what}: predictions returned");
            let no_predictions = CrossEntropyOutput {
                predicted: None,
                ..want.clone()
            };
            assert_same_ce_outputs(&what, &got, &no_predictions);
            let dx_without = loss::cross_entropy_backward_as(&saved, None, dtype).unwrap();
            common::assert_same_bits(&format!("{what}: gradient"), &dx_without, &dx);
            for block in [None, Some(64)] {
                loss::force_in_place_rows(block);
                let (y, _) = upload(&v, &[rows, cols], dtype);
                let got = loss::cross_entropy_in_place(&y, &t, &without).unwrap();
                let what = format!("{what} in place, blocks {block:?}");
                assert!(got.predicted.is_none(), "{what}: predictions returned");
                assert_same_ce_outputs(&what, &got, &no_predictions);
                common::assert_same_bits(&format!("{what}: gradient"), &y, &dx);
            }
            loss::force_in_place_rows(None);
        }
    }
}

#[test]
fn cross_entropy_in_place_bad_inputs_leave_the_logits() {
    let v = data(210, 3 * 8, -1.0, 1.0);
    let x = f32_tensor(&v, &[3, 8]);
    let before = bits(&x);
    let opts = CrossEntropyOptions::default();
    match loss::cross_entropy_in_place(&x, &i32_tensor(&[0, 8, 1], &[3]), &opts) {
        Err(Error::OutOfBounds { .. }) => {}
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
    let wrong = f32_tensor(&[0.0, 1.0, 2.0], &[3]);
    match loss::cross_entropy_in_place(&x, &wrong, &opts) {
        Err(Error::UnsupportedDType { .. }) => {}
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
    match loss::cross_entropy_in_place(&x, &i32_tensor(&[0, 1], &[2]), &opts) {
        Err(Error::ShapeMismatch { .. }) => {}
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let bad = CrossEntropyOptions {
        label_smoothing: 1.5,
        ..Default::default()
    };
    match loss::cross_entropy_in_place(&x, &i32_tensor(&[0, 1, 2], &[3]), &bad) {
        Err(Error::InvalidValue { .. }) => {}
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    assert_eq!(bits(&x), before);
}

#[test]
fn register_rows_on_every_lane_count() {
    // The register-resident softmax rows forced to 256 and 1,024 lanes (and the 16-bit
    // forwards off `softmax_fwd_c`): softmax and log-softmax forward and backward against the
    // reference, and each 16-bit gradient the F32 one rounded once under the same lanes.
    let e = engine();
    for lanes in [256u64, 1024] {
        loss::force_row_lanes(Some(lanes));
        for (dtype, cols) in [
            (DType::F32, 12_000),
            (DType::BF16, 32_000),
            (DType::F16, 20_000),
        ] {
            let rows = 2;
            let what = format!("{lanes} lanes {dtype} [{rows}, {cols}]");
            let v = data(230, rows * cols, -6.0, 6.0);
            let x = tensor_from_f64(e, &v, &[rows, cols], dtype);
            let xs = common::stored(&v, dtype);
            let g = data(231, rows * cols, -1.0, 1.0);
            let dy = tensor_from_f64(e, &g, &[rows, cols], dtype);
            let gs = common::stored(&g, dtype);
            for log in [false, true] {
                let (y, saved) = softmax_of(&x, log);
                let want = softmax_reference(&xs, rows, cols, log);
                assert_close(
                    &format!("{what} log {log}"),
                    &y.to_f64().unwrap(),
                    &want,
                    Tolerance::for_dtype(dtype),
                );
                let dx = loss::softmax_backward(&saved, &dy).unwrap();
                let want = reference::softmax_backward(&xs, &gs, rows, cols, log);
                assert_close(
                    &format!("{what} log {log} dx"),
                    &dx.to_f64().unwrap(),
                    &want,
                    F32,
                );
                if dtype != DType::F32 {
                    let narrow = loss::softmax_backward_as(&saved, &dy, dtype).unwrap();
                    assert_eq!(
                        common::value_bits(&narrow),
                        common::value_bits(&wgrad::cast::cast(&dx, dtype).unwrap()),
                        "{what} log {log}: 16-bit gradient"
                    );
                }
            }
        }
    }
    loss::force_row_lanes(None);
}

#[test]
fn register_rows_and_in_place_on_a_256_lane_adapter() {
    // An app device with WebGPU's default limits (256 invocations a workgroup): the register
    // rows and the in-place cross-entropy run the 256-lane module (F32 32,000 columns: 32
    // chunks a lane forward, the two-pass backward; BF16: 16 chunks a lane both ways).
    let e = common::webgpu_default_engine();
    assert_eq!(e.info().limits.max_compute_invocations_per_workgroup, 256);
    let (rows, cols) = (2, 32_000);
    for dtype in [DType::F32, DType::BF16] {
        let what = format!("256 lanes {dtype}");
        let v = data(220, rows * cols, -6.0, 6.0);
        let x = tensor_from_f64(&e, &v, &[rows, cols], dtype);
        let xs = common::stored(&v, dtype);
        let (y, saved) = loss::softmax(&x).unwrap();
        assert_close(
            &what,
            &y.to_f64().unwrap(),
            &reference::softmax(&xs, rows, cols),
            Tolerance::for_dtype(dtype),
        );
        let g = data(221, rows * cols, -1.0, 1.0);
        let dy = tensor_from_f64(&e, &g, &[rows, cols], dtype);
        let dx = loss::softmax_backward(&saved, &dy).unwrap();
        let want = reference::softmax_backward(&xs, &common::stored(&g, dtype), rows, cols, false);
        assert_close(&format!("{what} dx"), &dx.to_f64().unwrap(), &want, F32);
    }
    let (rows, cols) = (3, 2000);
    let v = data(222, rows * cols, -4.0, 4.0);
    let targets = [3, 1999, 0];
    let x = tensor_from_f64(&e, &v, &[rows, cols], DType::F32);
    let t = Tensor::from_slice(&e, &targets, &[rows]).unwrap();
    let opts = CrossEntropyOptions::default();
    let (want, saved) = cross_entropy(&x, &t, &opts).unwrap();
    let dx = cross_entropy_backward(&saved, None).unwrap();
    let y = tensor_from_f64(&e, &v, &[rows, cols], DType::F32);
    let got = loss::cross_entropy_in_place(&y, &t, &opts).unwrap();
    assert_eq!(
        bits(&got.loss),
        bits(&want.loss),
        "256 lanes: in-place loss"
    );
    assert_eq!(bits(&y), bits(&dx), "256 lanes: in-place gradient");
}

#[test]
fn cross_entropy_backward_as_is_the_f32_gradient_rounded_once() {
    // Every logits dtype into every gradient dtype: bit for bit the F32 gradient cast; whole
    // 16-bit chunks of the logits' own dtype take `ce_bwd_n` (8, 1000 and 40,000 columns),
    // ragged widths (7, 1,002 in 16 bits) and other dtypes the F32 gradient narrowed.
    let cases: [(usize, usize); 5] = [(3, 8), (6, 1000), (2, 40_000), (3, 7), (4, 1002)];
    for (rows, cols) in cases {
        for dtype in DType::FLOATS {
            for out in DType::FLOATS {
                for (all, reduction) in [(false, Reduction::Mean), (true, Reduction::None)] {
                    let (cfg, t, v) = ce_setup(300, (rows, cols), all, reduction, 2);
                    let what = format!("{dtype} -> {out} [{rows}, {cols}] all={all}");
                    let (x, _) = upload(&v, &[rows, cols], dtype);
                    let before = common::value_bits(&x);
                    let (_, saved) = cross_entropy(&x, &t, &options_for(&cfg)).unwrap();
                    // Reduction none: a per-row cotangent (one row's zero included).
                    let cot = (reduction == Reduction::None).then(|| {
                        let mut g = data(302, rows, -2.0, 2.0);
                        g[0] = 0.0;
                        f32_tensor(&g, &[rows])
                    });
                    let dx = cross_entropy_backward(&saved, cot.as_ref()).unwrap();
                    let want = if out == DType::F32 {
                        dx
                    } else {
                        wgrad::cast::cast(&dx, out).unwrap()
                    };
                    let got = loss::cross_entropy_backward_as(&saved, cot.as_ref(), out).unwrap();
                    assert_eq!(got.dtype(), out, "{what}");
                    assert_eq!(got.shape(), x.shape(), "{what}");
                    assert_eq!(
                        common::value_bits(&got),
                        common::value_bits(&want),
                        "{what}: gradient"
                    );
                    let again = loss::cross_entropy_backward_as(&saved, cot.as_ref(), out).unwrap();
                    assert_eq!(
                        common::value_bits(&again),
                        common::value_bits(&got),
                        "{what}: rerun"
                    );
                    assert_eq!(common::value_bits(&x), before, "{what}: logits untouched");
                }
            }
        }
    }
    // Soft targets: the F32 gradient narrowed.
    let v = data(303, 2 * 16, -3.0, 3.0);
    let x = f32_tensor(&v, &[2, 16]);
    let p = f32_tensor(&data(304, 2 * 16, 0.0, 0.125), &[2, 16]);
    let (_, saved) = loss::cross_entropy_soft(&x, &p, Reduction::Sum).unwrap();
    let want =
        wgrad::cast::cast(&cross_entropy_backward(&saved, None).unwrap(), DType::BF16).unwrap();
    let got = loss::cross_entropy_backward_as(&saved, None, DType::BF16).unwrap();
    assert_eq!(
        common::value_bits(&got),
        common::value_bits(&want),
        "soft targets"
    );
    // A dtype that is not a float dtype.
    match loss::cross_entropy_backward_as(&saved, None, DType::I32) {
        Err(Error::UnsupportedDType { .. }) => {}
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
}

/// A cross-entropy case: the options (`all`: every option, with `ignored` targets ignored) at
/// `reduction`, I32 targets and the logits' values.
fn ce_setup(
    seed: u64,
    (rows, cols): (usize, usize),
    all: bool,
    reduction: Reduction,
    ignored: usize,
) -> (CrossEntropyConfig, Tensor, Vec<f64>) {
    let mut cfg = if all {
        all_options(cols)
    } else {
        CrossEntropyConfig::default()
    };
    cfg.reduction = reduction;
    let cfg = as_stored(&cfg);
    let ignored = if all { ignored } else { 0 };
    let targets = targets_for(seed + cols as u64, rows, cols, cfg.ignore_index, ignored);
    let t = i32_tensor(&targets, &[rows]);
    let v = data(seed + 1 + rows as u64, rows * cols, -8.0, 8.0);
    (cfg, t, v)
}

/// `softmax_backward_as` stores the gradient as the F32 gradient rounded once: bit for bit
/// `cast::cast` of [`loss::softmax_backward`]'s (a NaN as any NaN), softmax and log-softmax, every input dtype
/// into every gradient dtype. 16-bit rows of whole chunks are written directly: in the register
/// range (16,392 and 32,000 columns) by `softmax_bwd_h`, shorter (8, 1,000) and longer
/// (65,544) rows by `softmax_bwd_v`; ragged rows (7), F32 inputs and a cotangent of another
/// dtype narrow the F32 gradient. The register rows again with whole chunks a lane
/// (`softmax_bwd_r`, the measurement switch). The cotangent holds a NaN and both infinities.
#[test]
fn softmax_backward_as_is_the_f32_gradient_rounded_once() {
    let narrowed = |t: &Tensor, d: DType| {
        if d == DType::F32 {
            t.clone()
        } else {
            wgrad::cast::cast(t, d).unwrap()
        }
    };
    let cotangent = |seed: u64, n: usize| {
        let mut v = data(seed, n, -1.0, 1.0);
        for (slot, s) in v
            .iter_mut()
            .step_by(7)
            .zip([f64::NAN, f64::INFINITY, f64::NEG_INFINITY])
        {
            *slot = s;
        }
        v
    };
    for (rows, cols, whole) in [
        (2usize, 8usize, None),
        (3, 1000, None),
        (2, 16_392, None),
        (2, 32_000, None),
        (1, 65_544, None),
        (3, 7, None),
        (2, 16_392, Some(true)),
        (2, 32_000, Some(true)),
    ] {
        loss::force_whole_chunk_backward(whole);
        for dtype in DType::FLOATS {
            for out in DType::FLOATS {
                for log in [false, true] {
                    let what = format!("log={log} {dtype} -> {out} [{rows}, {cols}]");
                    let (x, _) = upload(&data(310, rows * cols, -8.0, 8.0), &[rows, cols], dtype);
                    let (dy, _) = upload(&cotangent(311, rows * cols), &[rows, cols], dtype);
                    let (_, saved) = softmax_of(&x, log);
                    let want = narrowed(&loss::softmax_backward(&saved, &dy).unwrap(), out);
                    let got = loss::softmax_backward_as(&saved, &dy, out).unwrap();
                    assert_eq!(got.dtype(), out, "{what}");
                    assert_eq!(got.shape(), x.shape(), "{what}");
                    common::assert_same_bits(&what, &got, &want);
                    let again = loss::softmax_backward_as(&saved, &dy, out).unwrap();
                    assert_eq!(
                        common::value_bits(&again),
                        common::value_bits(&got),
                        "{what}: rerun"
                    );
                }
            }
        }
    }
    // The whole-chunk rows against the f64 reference.
    loss::force_whole_chunk_backward(Some(true));
    let (rows, cols) = (2, 32_000);
    let (v, g) = (
        data(314, rows * cols, -8.0, 8.0),
        data(315, rows * cols, -1.0, 1.0),
    );
    for dtype in [DType::F16, DType::BF16] {
        for log in [false, true] {
            held_backward_case("whole chunks", &v, &g, (rows, cols), dtype, log);
        }
    }
    loss::force_whole_chunk_backward(None);
    // A cotangent of another dtype than x (narrowed F32 gradient).
    let (x, _) = upload(&data(312, 2 * 16_392, -8.0, 8.0), &[2, 16_392], DType::BF16);
    let (dy, _) = upload(&cotangent(313, 2 * 16_392), &[2, 16_392], DType::F16);
    let (_, saved) = loss::softmax(&x).unwrap();
    let want = narrowed(&loss::softmax_backward(&saved, &dy).unwrap(), DType::BF16);
    let got = loss::softmax_backward_as(&saved, &dy, DType::BF16).unwrap();
    common::assert_same_bits("bf16 x, f16 dy", &got, &want);
    // The direct paths allocate no F32 gradient: the peak grows by the BF16 gradient only
    // (32,000 columns: `softmax_bwd_h`; 4,000: `softmax_bwd_v`).
    let private = common::private_engine();
    for (rows, cols) in [(4, 32_000), (32, 4_000)] {
        let v = data(314, rows * cols, -8.0, 8.0);
        let x = wgrad::gradcheck::tensor_from_f64(&private, &v, &[rows, cols], DType::BF16)
            .unwrap()
            .0;
        let (_, saved) = loss::softmax(&x).unwrap();
        private.synchronize().unwrap();
        let before = private.memory().live_bytes;
        private.reset_peak();
        let got = loss::softmax_backward_as(&saved, &x, DType::BF16).unwrap();
        private.synchronize().unwrap();
        let grown = private.memory().peak_bytes - before;
        let direct = (rows * cols * 2) as u64;
        assert!(
            grown <= direct * 9 / 8 + 4096,
            "{cols} columns: peak grew {grown} bytes for a {direct}-byte BF16 gradient"
        );
        drop(got);
    }
    // A dtype that is not a float dtype.
    match loss::softmax_backward_as(&saved, &dy, DType::I32) {
        Err(Error::UnsupportedDType { .. }) => {}
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
}

/// `divergence_backward_as` stores the input gradient as the F32 gradient rounded once: bit for
/// bit `cast::cast` of [`loss::divergence_backward`]'s (a NaN as any NaN), for KL (log target,
/// batch mean), JSD (β 0.5, labels with an ignored row) and TVD (reduction none, a per-element
/// cotangent), every input dtype into every gradient dtype. 16-bit inputs and targets in whole
/// chunks (8, 1,000 columns) are written directly by `div_bwd_v`; ragged rows (7) and F32
/// inputs narrow the F32 gradient.
#[test]
fn divergence_backward_as_is_the_f32_gradient_rounded_once() {
    use wgrad::loss::DivReduction;
    let narrowed = |t: &Tensor, d: DType| {
        if d == DType::F32 {
            t.clone()
        } else {
            wgrad::cast::cast(t, d).unwrap()
        }
    };
    for (rows, cols) in [(3usize, 8usize), (4, 1000), (3, 7)] {
        for dtype in DType::FLOATS {
            let (lx, _) = loss::log_softmax(
                &upload(&data(320, rows * cols, -4.0, 4.0), &[rows, cols], dtype).0,
            )
            .unwrap();
            let (lt, _) = loss::log_softmax(
                &upload(&data(321, rows * cols, -4.0, 4.0), &[rows, cols], dtype).0,
            )
            .unwrap();
            let (px, _) = loss::softmax(&lx).unwrap();
            let (pt, _) = loss::softmax(&lt).unwrap();
            let labels = i32_tensor(
                &(0..rows as i32)
                    .map(|r| if r == 1 { -100 } else { r })
                    .collect::<Vec<_>>(),
                &[rows],
            );
            let cot = f32_tensor(&data(322, rows * cols, -1.0, 1.0), &[rows, cols]);
            let cases = [
                (
                    "kl",
                    loss::kl_div(&lx, &lt, true, DivReduction::BatchMean)
                        .unwrap()
                        .1,
                    None,
                ),
                (
                    "jsd",
                    loss::jsd(&lx, &lt, 0.5, Some(&labels), -100).unwrap().1,
                    None,
                ),
                (
                    "tvd",
                    loss::tvd(&px, &pt, DivReduction::None, None, -100)
                        .unwrap()
                        .1,
                    Some(&cot),
                ),
            ];
            for (name, saved, c) in cases {
                let want = loss::divergence_backward(&saved, c).unwrap();
                for out in DType::FLOATS {
                    let what = format!("{name} {dtype} -> {out} [{rows}, {cols}]");
                    let got = loss::divergence_backward_as(&saved, c, out).unwrap();
                    assert_eq!(got.dtype(), out, "{what}");
                    common::assert_same_bits(&what, &got, &narrowed(&want, out));
                }
            }
        }
    }
    // The direct path allocates no F32 gradient.
    let private = common::private_engine();
    let (rows, cols) = (16, 4000);
    let up = |seed| {
        wgrad::gradcheck::tensor_from_f64(
            &private,
            &data(seed, rows * cols, -4.0, 0.0),
            &[rows, cols],
            DType::BF16,
        )
        .unwrap()
        .0
    };
    let (x, t) = (up(323), up(324));
    let (_, saved) = loss::kl_div(&x, &t, true, DivReduction::Sum).unwrap();
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let got = loss::divergence_backward_as(&saved, None, DType::BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let direct = (rows * cols * 2) as u64;
    assert!(
        grown <= direct * 9 / 8 + 4096,
        "peak grew {grown} bytes for a {direct}-byte gradient"
    );
    drop(got);
    match loss::divergence_backward_as(&saved, None, DType::U32) {
        Err(Error::UnsupportedDType { .. }) => {}
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
}
