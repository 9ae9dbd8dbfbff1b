//! Attention residuals (`wgrad::attn_res`): the output and the gradients of the blocks,
//! w_query and w_norm against the f64 reference in every dtype (1–64 blocks, widths 7–513, odd
//! 16-bit widths through F32, leading token axes), the reference against finite differences,
//! bit-identical reruns, 16-bit gradients bit for bit the F32 ones cast, empty token sets, and
//! every documented bad input's typed error.

mod common;

use common::{Rng, assert_close, engine, expect_err, value_bits};
use wgrad::attn_res::{
    AttnResOptions, MAX_BLOCKS, attn_res, attn_res_backward, attn_res_backward_as,
};
use wgrad::gradcheck::{Tolerance, check_vjp, tensor_from_f64};
use wgrad::reference::attn_res::{self as reference, AttnResConfig};
use wgrad::{DType, Engine, Error, Tensor};

/// (blocks, leading token axes, width).
const SHAPES: [(usize, &[usize], usize); 6] = [
    (1, &[3], 7),
    (4, &[2, 8], 123),
    (3, &[5], 300),
    (2, &[1], 513),
    (8, &[3], 64),
    (MAX_BLOCKS, &[2], 16),
];

struct Data {
    v: Vec<f64>,
    q: Vec<f64>,
    w: Vec<f64>,
    dh: Vec<f64>,
}

fn data(n: usize, tokens: usize, d: usize, seed: u64) -> Data {
    let mut rng = Rng::new(seed);
    Data {
        v: rng.vec(n * tokens * d, -2.0, 2.0),
        q: rng.vec(d, -0.5, 0.5),
        w: rng.vec(d, 0.5, 1.5),
        dh: rng.vec(tokens * d, -1.0, 1.0),
    }
}

#[test]
fn outputs_and_gradients_match_the_reference_in_every_dtype() {
    for (k, &(n, lead, d)) in SHAPES.iter().enumerate() {
        let tokens: usize = lead.iter().product();
        let mut shape = vec![n];
        shape.extend(lead);
        shape.push(d);
        let out_shape = &shape[1..];
        for dtype in DType::FLOATS {
            let what = format!("N {n} tokens {lead:?} D {d} {dtype:?}");
            let x = data(n, tokens, d, k as u64);
            let up = |v: &[f64], s: &[usize]| tensor_from_f64(engine(), v, s, dtype).unwrap();
            let ((vt, vs), (qt, qs), (wt, ws), (gt, gs)) = (
                up(&x.v, &shape),
                up(&x.q, &[d]),
                up(&x.w, &[d]),
                up(&x.dh, out_shape),
            );
            let (h, saved) = attn_res(&vt, &qt, &wt, &AttnResOptions::default()).unwrap();
            assert_eq!((h.shape(), h.dtype()), (out_shape, dtype), "{what}");
            let c = AttnResConfig {
                n,
                tokens,
                d,
                eps: f64::from(1e-6f32),
                dtype,
            };
            let want = reference::forward(&vs, &qs, &ws, &c);
            let tol = Tolerance::for_dtype(dtype).scaled(2.0);
            assert_close(&format!("{what}: h"), &h.to_f64().unwrap(), &want, tol);
            let g = attn_res_backward(&saved, &gt).unwrap();
            let (dv, dq, dw) = reference::backward(&vs, &qs, &ws, &gs, &c);
            let tol = Tolerance::for_dtype(DType::F32).scaled(10.0);
            assert_eq!(g.blocks.shape(), shape.as_slice(), "{what}");
            assert_close(
                &format!("{what}: d blocks"),
                &g.blocks.to_f64().unwrap(),
                &dv,
                tol,
            );
            assert_close(
                &format!("{what}: d w_query"),
                &g.query.to_f64().unwrap(),
                &dq,
                tol,
            );
            assert_close(
                &format!("{what}: d w_norm"),
                &g.norm.to_f64().unwrap(),
                &dw,
                tol,
            );
            // 16-bit gradients: bit for bit the F32 ones cast (even D in 16 bits by the kernel).
            for out in [DType::F16, DType::BF16] {
                let g16 = attn_res_backward_as(&saved, &gt, out).unwrap();
                common::assert_cast_of(
                    &what,
                    &[
                        ("d blocks", &g16.blocks, &g.blocks),
                        ("d w_query", &g16.query, &g.query),
                        ("d w_norm", &g16.norm, &g.norm),
                    ],
                    out,
                );
            }
            let (h2, saved2) = attn_res(&vt, &qt, &wt, &AttnResOptions::default()).unwrap();
            assert!(value_bits(&h) == value_bits(&h2), "{what}: forward rerun");
            let g2 = attn_res_backward(&saved2, &gt).unwrap();
            for (a, b) in [
                (&g.blocks, &g2.blocks),
                (&g.query, &g2.query),
                (&g.norm, &g2.norm),
            ] {
                assert!(value_bits(a) == value_bits(b), "{what}: backward rerun");
            }
        }
    }
}

#[test]
fn reference_gradients_match_finite_differences() {
    for (k, &(n, lead, d)) in SHAPES.iter().take(5).enumerate() {
        let tokens: usize = lead.iter().product::<usize>().min(3);
        let d = d.min(33);
        let x = data(n, tokens, d, 50 + k as u64);
        let c = AttnResConfig {
            n,
            tokens,
            d,
            eps: 1e-6,
            dtype: DType::F32,
        };
        let (dv, dq, dw) = reference::backward(&x.v, &x.q, &x.w, &x.dh, &c);
        let cmp = check_vjp(|v| reference::forward(v, &x.q, &x.w, &c), &x.v, &x.dh, &dv);
        assert!(cmp.passed, "{c:?}: d blocks {cmp}");
        let cmp = check_vjp(|q| reference::forward(&x.v, q, &x.w, &c), &x.q, &x.dh, &dq);
        assert!(cmp.passed, "{c:?}: d w_query {cmp}");
        let cmp = check_vjp(|w| reference::forward(&x.v, &x.q, w, &c), &x.w, &x.dh, &dw);
        assert!(cmp.passed, "{c:?}: d w_norm {cmp}");
    }
}

#[test]
fn no_tokens_give_empty_outputs_and_zero_weight_gradients() {
    let e = engine();
    let v = Tensor::zeros(e, &[3, 0, 5], DType::BF16).unwrap();
    let w = Tensor::from_slice(e, &[1.0f32; 5], &[5]).unwrap();
    let (h, saved) = attn_res(&v, &w, &w, &AttnResOptions::default()).unwrap();
    assert_eq!(h.shape(), &[0, 5]);
    let dh = Tensor::zeros(e, &[0, 5], DType::F32).unwrap();
    let g = attn_res_backward(&saved, &dh).unwrap();
    assert_eq!(g.blocks.shape(), &[3, 0, 5]);
    assert_eq!(g.query.to_vec::<f32>().unwrap(), vec![0.0; 5]);
    assert_eq!(g.norm.to_vec::<f32>().unwrap(), vec![0.0; 5]);
    let g16 = attn_res_backward_as(&saved, &dh, DType::BF16).unwrap();
    assert_eq!(
        (g16.blocks.shape(), g16.blocks.dtype()),
        (&[3, 0, 5][..], DType::BF16)
    );
    assert!(g16.query.to_f64().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn bad_inputs_give_typed_errors() {
    let e = engine();
    let t = |shape: &[usize]| Tensor::zeros(e, shape, DType::F32).unwrap();
    let (v, w) = (t(&[3, 2, 4]), t(&[4]));
    let o = AttnResOptions::default();
    let bounds = |e: &Error| matches!(e, Error::OutOfBounds { .. });
    let shape = |e: &Error| matches!(e, Error::ShapeMismatch { .. });
    expect_err("no blocks", attn_res(&t(&[0, 2, 4]), &w, &w, &o), bounds);
    expect_err(
        "65 blocks",
        attn_res(&t(&[MAX_BLOCKS + 1, 1, 4]), &w, &w, &o),
        |e| {
            matches!(
                e,
                Error::OutOfBounds {
                    got: 65,
                    max: 64,
                    ..
                }
            )
        },
    );
    expect_err("one axis", attn_res(&t(&[4]), &w, &w, &o), shape);
    expect_err("w_query length", attn_res(&v, &t(&[5]), &w, &o), shape);
    expect_err("w_norm length", attn_res(&v, &w, &t(&[3]), &o), shape);
    for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        expect_err("eps", attn_res(&v, &w, &w, &AttnResOptions { eps }), |e| {
            matches!(e, Error::InvalidValue { .. })
        });
    }
    let ints = Tensor::from_slice(e, &[0i32; 24], &[3, 2, 4]).unwrap();
    expect_err("integer blocks", attn_res(&ints, &w, &w, &o), |e| {
        matches!(
            e,
            Error::UnsupportedDType {
                got: DType::I32,
                ..
            }
        )
    });
    if let Ok(other) = Engine::builder().build() {
        let ow = Tensor::zeros(&other, &[4], DType::F32).unwrap();
        expect_err("another engine", attn_res(&v, &ow, &w, &o), |e| {
            matches!(e, Error::EngineMismatch { .. })
        });
    }
    let (_, saved) = attn_res(&v, &w, &w, &o).unwrap();
    expect_err("dh shape", attn_res_backward(&saved, &t(&[2, 5])), shape);
    expect_err(
        "integer gradient dtype",
        attn_res_backward_as(&saved, &t(&[2, 4]), DType::I32),
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
    let small = Engine::builder().workspace_bound(16).build().unwrap();
    let sv = Tensor::zeros(&small, &[3, 2, 4], DType::F32).unwrap();
    let sw = Tensor::zeros(&small, &[4], DType::F32).unwrap();
    let (_, saved) = attn_res(&sv, &sw, &sw, &o).unwrap();
    let sg = Tensor::zeros(&small, &[2, 4], DType::F32).unwrap();
    expect_err("workspace", attn_res_backward(&saved, &sg), |e| {
        matches!(e, Error::WorkspaceExceeded { bound: 16, .. })
    });
}

/// `attn_res_backward_as` with an even D writes d blocks in 16 bits from the kernel: the call's
/// peak grows by the 16-bit gradient and the partial rows, not by an F32 d blocks (twice it).
#[test]
fn sixteen_bit_block_gradient_allocates_no_f32_copy() {
    let private = common::private_engine();
    let (n, tokens, d) = (8, 64, 512);
    let x = data(n, tokens, d, 9);
    let up = |v: &[f64], s: &[usize]| tensor_from_f64(&private, v, s, DType::BF16).unwrap().0;
    let (vt, qt, wt, gt) = (
        up(&x.v, &[n, tokens, d]),
        up(&x.q, &[d]),
        up(&x.w, &[d]),
        up(&x.dh, &[tokens, d]),
    );
    let (h, saved) = attn_res(&vt, &qt, &wt, &AttnResOptions::default()).unwrap();
    drop(h);
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let g = attn_res_backward_as(&saved, &gt, DType::BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let dv16 = (n * tokens * d * 2) as u64;
    assert!(
        grown < dv16 * 3 / 2,
        "peak grew {grown} bytes for a {dv16}-byte 16-bit d blocks"
    );
    assert_eq!(g.blocks.dtype(), DType::BF16);
}
