//! Multi-token attention (`wgrad::mta`): the output and the gradients of the scores, weight and
//! bias against the f64 reference in every dtype (softmax and sparsemax; kernels 1×1 to 5×3,
//! stride 2, dilation 2, padding, groups, with and without bias; Liger's test shape), the
//! reference's backward against finite differences, the output's and the gradients' future
//! exactly zero, bit-identical reruns, the row windows bit for bit the single taps, 16-bit
//! gradients bit for bit the F32 ones cast, and every documented bad input's typed error.

mod common;

use common::{Rng, assert_close, engine, expect_err, value_bits};
use wgrad::gradcheck::{Tolerance, check_vjp, tensor_from_f64};
use wgrad::mta::{MtaOptions, multi_token_attention, multi_token_attention_backward};
use wgrad::reference::mta::{self as reference, MtaConfig};
use wgrad::{DType, Engine, Error, Tensor};

fn config(
    [batch, c_in, c_out, side]: [usize; 4],
    kernel: [usize; 2],
    stride: usize,
    padding: [usize; 2],
    dilation: usize,
    groups: usize,
    sparse: bool,
) -> MtaConfig {
    MtaConfig {
        batch,
        c_in,
        c_out,
        side,
        kernel,
        stride: [stride; 2],
        padding,
        dilation: [dilation; 2],
        groups,
        sparse,
    }
}

fn configs() -> Vec<(MtaConfig, bool)> {
    vec![
        // Liger's test shape: B 2, C 4 → 4, L 16, K 3, padding K / 2.
        (config([2, 4, 4, 16], [3, 3], 1, [1, 1], 1, 1, false), true),
        (config([1, 4, 2, 13], [5, 3], 1, [2, 1], 1, 2, false), false),
        (config([1, 2, 4, 9], [3, 3], 2, [1, 1], 1, 1, false), true),
        (config([2, 2, 2, 11], [3, 3], 1, [2, 2], 2, 2, true), true),
        (config([1, 3, 3, 7], [1, 1], 1, [0, 0], 1, 3, true), false),
        (config([1, 1, 1, 1], [1, 1], 1, [0, 0], 1, 1, false), true),
    ]
}

fn options(c: &MtaConfig) -> MtaOptions {
    MtaOptions {
        stride: c.stride,
        padding: c.padding,
        dilation: c.dilation,
        groups: c.groups,
        sparse: c.sparse,
    }
}

fn weight_shape(c: &MtaConfig) -> [usize; 4] {
    [c.c_out, c.c_in / c.groups, c.kernel[0], c.kernel[1]]
}

struct Data {
    scores: Vec<f64>,
    weight: Vec<f64>,
    bias: Vec<f64>,
    dy: Vec<f64>,
}

fn data(c: &MtaConfig, seed: u64) -> Data {
    let mut rng = Rng::new(seed);
    let so = c.out_side(0);
    Data {
        scores: rng.vec(c.batch * c.c_in * c.side * c.side, -3.0, 3.0),
        weight: rng.vec(weight_shape(c).iter().product(), -1.0, 1.0),
        bias: rng.vec(c.c_out, -1.0, 1.0),
        dy: rng.vec(c.batch * c.c_out * so * so, -1.0, 1.0),
    }
}

fn upload(v: &[f64], shape: &[usize], dtype: DType) -> (Tensor, Vec<f64>) {
    tensor_from_f64(engine(), v, shape, dtype).unwrap()
}

#[test]
fn outputs_and_gradients_match_the_reference_in_every_dtype() {
    // Rows longer than a block of the parameter partials (256 columns: two segments a row).
    let long = (config([1, 2, 2, 300], [3, 3], 1, [1, 1], 1, 1, false), true);
    for (k, (c, bias)) in configs().into_iter().chain([long]).enumerate() {
        for dtype in DType::FLOATS {
            let what = format!("{c:?} bias {bias} {dtype:?}");
            let d = data(&c, k as u64);
            let so = c.out_side(0);
            let (s, ss) = upload(&d.scores, &[c.batch, c.c_in, c.side, c.side], dtype);
            let (w, ws) = upload(&d.weight, &weight_shape(&c), dtype);
            let (b, bs) = upload(&d.bias, &[c.c_out], dtype);
            let (g, gs) = upload(&d.dy, &[c.batch, c.c_out, so, so], dtype);
            let b_opt = bias.then_some(&b);
            let (y, saved) = multi_token_attention(&s, &w, b_opt, &options(&c)).unwrap();
            assert_eq!(y.dtype(), dtype);
            assert_eq!(y.shape(), &[c.batch, c.c_out, so, so]);
            let want = reference::forward(&ss, &ws, bias.then_some(bs.as_slice()), &c);
            let tol = Tolerance::for_dtype(dtype).scaled(2.0);
            let got = y.to_f64().unwrap();
            assert_close(&format!("{what}: output"), &got, &want, tol);
            for (o, v) in got.iter().enumerate() {
                if o % so > (o / so) % so {
                    assert_eq!(v.to_bits(), 0, "{what}: the output's future is +0");
                }
            }
            let probs = saved.probabilities().to_f64().unwrap();
            let want_p = reference::probabilities(&ss, &c);
            assert_close(
                &format!("{what}: probabilities"),
                &probs,
                &want_p,
                Tolerance::for_dtype(DType::F32),
            );
            let grads = multi_token_attention_backward(&saved, &g).unwrap();
            let (ds, dw, db) = reference::backward(&ss, &ws, &gs, &c);
            let tol = Tolerance::for_dtype(DType::F32).scaled(10.0);
            let got_ds = grads.scores.to_f64().unwrap();
            assert_close(&format!("{what}: d scores"), &got_ds, &ds, tol);
            for (e, v) in got_ds.iter().enumerate() {
                if e % c.side > (e / c.side) % c.side {
                    assert_eq!(*v, 0.0, "{what}: the scores' future has no gradient");
                }
            }
            assert_close(
                &format!("{what}: d weight"),
                &grads.weight.to_f64().unwrap(),
                &dw,
                tol,
            );
            assert_eq!(grads.bias.is_some(), bias, "{what}");
            if let Some(gb) = &grads.bias {
                assert_close(&format!("{what}: d bias"), &gb.to_f64().unwrap(), &db, tol);
            }
            // 16-bit gradients: bit for bit the F32 ones cast.
            for out in [DType::F16, DType::BF16] {
                let g16 = wgrad::mta::multi_token_attention_backward_as(&saved, &g, out).unwrap();
                assert_eq!(g16.bias.is_some(), grads.bias.is_some(), "{what}");
                let mut pairs = vec![
                    ("d scores", &g16.scores, &grads.scores),
                    ("d weight", &g16.weight, &grads.weight),
                ];
                if let (Some(n), Some(w)) = (&g16.bias, &grads.bias) {
                    pairs.push(("d bias", n, w));
                }
                common::assert_cast_of(&what, &pairs, out);
            }
            // Reruns: the same bits.
            let (y2, saved2) = multi_token_attention(&s, &w, b_opt, &options(&c)).unwrap();
            assert!(value_bits(&y) == value_bits(&y2), "{what}: forward rerun");
            let again = multi_token_attention_backward(&saved2, &g).unwrap();
            assert!(
                value_bits(&grads.scores) == value_bits(&again.scores),
                "{what}"
            );
            assert!(
                value_bits(&grads.weight) == value_bits(&again.weight),
                "{what}"
            );
        }
    }
}

#[test]
fn reference_gradients_match_finite_differences() {
    for (k, (c, _)) in configs().into_iter().enumerate() {
        let d = data(&c, 40 + k as u64);
        let (ds, dw, db) = reference::backward(&d.scores, &d.weight, &d.dy, &c);
        let cmp = check_vjp(
            |s| reference::forward(s, &d.weight, Some(&d.bias), &c),
            &d.scores,
            &d.dy,
            &ds,
        );
        assert!(cmp.passed, "{c:?}: d scores {cmp}");
        let cmp = check_vjp(
            |w| reference::forward(&d.scores, w, Some(&d.bias), &c),
            &d.weight,
            &d.dy,
            &dw,
        );
        assert!(cmp.passed, "{c:?}: d weight {cmp}");
        let cmp = check_vjp(
            |b| reference::forward(&d.scores, &d.weight, Some(b), &c),
            &d.bias,
            &d.dy,
            &db,
        );
        assert!(cmp.passed, "{c:?}: d bias {cmp}");
    }
}

/// The row windows (stride and dilation 1 along the rows, at most 8 taps a row: four outputs
/// a row window) against the same launches one output at a time: the same bits for the
/// output and every gradient, across kernel widths 1–9 (9 takes the single taps either way),
/// paddings, sides that are and are not multiples of four, groups and dtypes.
#[test]
fn row_windows_match_single_taps_bit_for_bit() {
    let mut cases = Vec::new();
    for k in 1..=9usize {
        for p in [0, k / 2, k - 1, k + 1] {
            for side in [5usize, 6, 11, 12] {
                if k <= side + 2 * p {
                    cases.push(config(
                        [1, 2, 2, side],
                        [k, k],
                        1,
                        [p, p],
                        1,
                        1 + k % 2,
                        false,
                    ));
                }
            }
        }
    }
    // Rows by windows, columns by a stride or dilation of 2; a window beside a wider kh.
    cases.push(config([2, 2, 2, 10], [3, 3], 1, [1, 1], 1, 1, true));
    cases.push(config([1, 2, 2, 9], [5, 3], 1, [2, 1], 1, 1, false));
    cases.push(config([1, 2, 2, 300], [3, 3], 1, [1, 1], 1, 1, false));
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    for (k, c) in cases.into_iter().enumerate() {
        let dtype = dtypes[k % 3];
        let what = format!("{c:?} {dtype:?}");
        let d = data(&c, 500 + k as u64);
        let so = c.out_side(0);
        let (s, _) = upload(&d.scores, &[c.batch, c.c_in, c.side, c.side], dtype);
        let (w, _) = upload(&d.weight, &weight_shape(&c), dtype);
        let (b, _) = upload(&d.bias, &[c.c_out], DType::F32);
        let (g, _) = upload(&d.dy, &[c.batch, c.c_out, so, so], dtype);
        let run = |single: bool| {
            wgrad::mta::force_single_taps(single);
            let (y, saved) = multi_token_attention(&s, &w, Some(&b), &options(&c)).unwrap();
            let grads = multi_token_attention_backward(&saved, &g).unwrap();
            wgrad::mta::force_single_taps(false);
            [
                value_bits(&y),
                value_bits(&grads.scores),
                value_bits(&grads.weight),
                value_bits(grads.bias.as_ref().unwrap()),
            ]
        };
        let (windows, single) = (run(false), run(true));
        for (name, (a, b)) in ["output", "d scores", "d weight", "d bias"]
            .iter()
            .zip(windows.iter().zip(&single))
        {
            assert!(
                a == b,
                "{what}: {name} by row windows differs from single taps"
            );
        }
    }
}

#[test]
fn bad_inputs_give_typed_errors() {
    let e = engine();
    let t = |shape: &[usize]| Tensor::zeros(e, shape, DType::F32).unwrap();
    let s = t(&[1, 2, 5, 5]);
    let w = t(&[2, 2, 3, 3]);
    let pad = MtaOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let shape = |e: &Error| matches!(e, Error::ShapeMismatch { .. });
    expect_err(
        "3-D scores",
        multi_token_attention(&t(&[2, 5, 5]), &w, None, &pad),
        shape,
    );
    expect_err(
        "planes not square",
        multi_token_attention(&t(&[1, 2, 5, 4]), &w, None, &pad),
        shape,
    );
    expect_err(
        "weight channels",
        multi_token_attention(&s, &t(&[2, 1, 3, 3]), None, &pad),
        shape,
    );
    expect_err(
        "bias length",
        multi_token_attention(&s, &w, Some(&t(&[3])), &pad),
        shape,
    );
    let groups = MtaOptions { groups: 3, ..pad };
    expect_err(
        "groups",
        multi_token_attention(&s, &w, None, &groups),
        |e| matches!(e, Error::InvalidValue { .. }),
    );
    let stride = MtaOptions {
        stride: [0, 1],
        ..pad
    };
    expect_err(
        "stride 0",
        multi_token_attention(&s, &w, None, &stride),
        |e| matches!(e, Error::OutOfBounds { got: 0, .. }),
    );
    expect_err(
        "kernel past the side",
        multi_token_attention(&s, &t(&[2, 2, 9, 9]), None, &pad),
        |e| matches!(e, Error::InvalidValue { .. }),
    );
    let uneven = MtaOptions {
        padding: [1, 0],
        ..Default::default()
    };
    expect_err(
        "output not square",
        multi_token_attention(&s, &w, None, &uneven),
        shape,
    );
    let (y, saved) = multi_token_attention(&s, &w, None, &pad).unwrap();
    expect_err(
        "integer gradient dtype",
        wgrad::mta::multi_token_attention_backward_as(&saved, &y, DType::U32),
        |e| {
            matches!(
                e,
                Error::UnsupportedDType {
                    got: DType::U32,
                    ..
                }
            )
        },
    );
    let ints = Tensor::from_slice(e, &[0i32; 50], &[1, 2, 5, 5]).unwrap();
    expect_err(
        "integer scores",
        multi_token_attention(&ints, &w, None, &pad),
        |e| {
            matches!(
                e,
                Error::UnsupportedDType {
                    got: DType::I32,
                    ..
                }
            )
        },
    );
    if let Ok(other) = Engine::builder().build() {
        let ow = Tensor::zeros(&other, &[2, 2, 3, 3], DType::F32).unwrap();
        expect_err(
            "another engine",
            multi_token_attention(&s, &ow, None, &pad),
            |e| matches!(e, Error::EngineMismatch { .. }),
        );
    }
    let (_, saved) = multi_token_attention(&s, &w, None, &pad).unwrap();
    expect_err(
        "dy shape",
        multi_token_attention_backward(&saved, &t(&[1, 2, 4, 4])),
        shape,
    );
    let small = Engine::builder().workspace_bound(64).build().unwrap();
    let ss = Tensor::zeros(&small, &[1, 2, 5, 5], DType::F32).unwrap();
    let sw = Tensor::zeros(&small, &[2, 2, 3, 3], DType::F32).unwrap();
    expect_err(
        "workspace",
        multi_token_attention(&ss, &sw, None, &pad),
        |e| matches!(e, Error::WorkspaceExceeded { bound: 64, .. }),
    );
}
