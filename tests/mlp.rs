//! The gated MLP against the f64 reference of `wgrad::reference::mlp` in every storage dtype,
//! both activations, saved and recomputed products; finite differences of the reference
//! backward; ragged, tiny and empty shapes; row tiles (a tiled MLP) with their memory bound;
//! bit-identical reruns; bad inputs.

mod common;

use common::{Rng, assert_close, engine, f32_bits, stored, tensor_from_f64};
use wgrad::activation::Activation;
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::mlp::{MlpOptions, intermediate_bytes, mlp, mlp_backward};
use wgrad::reference::mlp::{self as reference, Extents};
use wgrad::{DType, Error, Tensor};

struct Case {
    x: Vec<f64>,
    gate: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
    dy: Vec<f64>,
    e: Extents,
}

fn case(seed: u64, e: Extents, dtype: DType) -> Case {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (e.h.max(1) as f64).sqrt();
    let down_scale = 1.0 / (e.i.max(1) as f64).sqrt();
    Case {
        x: stored(&rng.vec(e.t * e.h, -1.0, 1.0), dtype),
        gate: stored(&rng.vec(e.i * e.h, -2.0 * scale, 2.0 * scale), dtype),
        up: stored(&rng.vec(e.i * e.h, -scale, scale), dtype),
        down: stored(&rng.vec(e.h * e.i, -down_scale, down_scale), dtype),
        dy: stored(&rng.vec(e.t * e.h, -1.0, 1.0), dtype),
        e,
    }
}

struct Uploaded {
    x: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    dy: Tensor,
}

fn upload(c: &Case, dtype: DType, lead: &[usize]) -> Uploaded {
    let e = engine();
    let mut x_shape = lead.to_vec();
    x_shape.push(c.e.h);
    Uploaded {
        x: tensor_from_f64(e, &c.x, &x_shape, dtype),
        gate: tensor_from_f64(e, &c.gate, &[c.e.i, c.e.h], dtype),
        up: tensor_from_f64(e, &c.up, &[c.e.i, c.e.h], dtype),
        down: tensor_from_f64(e, &c.down, &[c.e.h, c.e.i], dtype),
        dy: tensor_from_f64(e, &c.dy, &x_shape, dtype),
    }
}

#[test]
fn forward_and_gradients_match_reference_in_every_dtype() {
    let shapes = [
        (vec![1usize], 1usize, 1usize),
        (vec![7], 16, 24),
        (vec![3, 11], 33, 17),
        (vec![65], 8, 129),
    ];
    for kind in [Activation::Silu, Activation::GeluTanh] {
        for dtype in DType::FLOATS {
            for (n, (lead, h, i)) in shapes.iter().enumerate() {
                let t = lead.iter().product();
                let e = Extents { t, h: *h, i: *i };
                let c = case(100 + n as u64, e, dtype);
                let u = upload(&c, dtype, lead);
                let label = format!("{} {dtype} t={t} h={h} i={i}", kind.name());
                let want = reference::forward(kind, &c.x, &c.gate, &c.up, &c.down, e);
                let grads = reference::backward(kind, &c.x, &c.gate, &c.up, &c.down, &c.dy, e);
                for recompute in [false, true] {
                    let options = MlpOptions {
                        activation: kind,
                        recompute,
                        tile_rows: None,
                        tensor_cores: false,
                    };
                    let (y, saved) = mlp(&u.x, &u.gate, &u.up, &u.down, &options).unwrap();
                    assert_eq!(y.shape(), u.x.shape());
                    assert_eq!(y.dtype(), DType::F32);
                    let tol = Tolerance::for_dtype(DType::F32);
                    assert_close(&format!("{label} y"), &y.to_f64().unwrap(), &want, tol);
                    let g = mlp_backward(&saved, &u.dy).unwrap();
                    assert_eq!(g.x.shape(), u.x.shape());
                    assert_close(
                        &format!("{label} dx"),
                        &g.x.to_f64().unwrap(),
                        &grads.x,
                        tol,
                    );
                    assert_close(
                        &format!("{label} dWg"),
                        &g.gate.to_f64().unwrap(),
                        &grads.gate,
                        tol,
                    );
                    assert_close(
                        &format!("{label} dWu"),
                        &g.up.to_f64().unwrap(),
                        &grads.up,
                        tol,
                    );
                    assert_close(
                        &format!("{label} dWd"),
                        &g.down.to_f64().unwrap(),
                        &grads.down,
                        tol,
                    );
                }
            }
        }
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    let e = Extents { t: 3, h: 4, i: 5 };
    for kind in [Activation::Silu, Activation::GeluTanh] {
        let c = case(7, e, DType::F32);
        let g = reference::backward(kind, &c.x, &c.gate, &c.up, &c.down, &c.dy, e);
        let f = |x: &[f64], gate: &[f64], up: &[f64], down: &[f64]| {
            reference::forward(kind, x, gate, up, down, e)
        };
        let checks = [
            (
                "dx",
                check_vjp(|p| f(p, &c.gate, &c.up, &c.down), &c.x, &c.dy, &g.x),
            ),
            (
                "dWg",
                check_vjp(|p| f(&c.x, p, &c.up, &c.down), &c.gate, &c.dy, &g.gate),
            ),
            (
                "dWu",
                check_vjp(|p| f(&c.x, &c.gate, p, &c.down), &c.up, &c.dy, &g.up),
            ),
            (
                "dWd",
                check_vjp(|p| f(&c.x, &c.gate, &c.up, p), &c.down, &c.dy, &g.down),
            ),
        ];
        for (what, check) in checks {
            assert!(check.passed, "{} {what}: {check}", kind.name());
        }
    }
}

#[test]
fn reruns_and_recomputation_are_bit_identical() {
    let e = Extents {
        t: 37,
        h: 24,
        i: 40,
    };
    let c = case(3, e, DType::BF16);
    let u = upload(&c, DType::BF16, &[e.t]);
    let run = |recompute| {
        let options = MlpOptions {
            activation: Activation::Silu,
            recompute,
            tile_rows: None,
            tensor_cores: false,
        };
        let (y, saved) = mlp(&u.x, &u.gate, &u.up, &u.down, &options).unwrap();
        let g = mlp_backward(&saved, &u.dy).unwrap();
        [y, g.x, g.gate, g.up, g.down].map(|t| f32_bits(&t))
    };
    let first = run(false);
    assert_eq!(first, run(false));
    assert_eq!(first, run(true));
}

#[test]
fn empty_rows_give_empty_output_and_zero_weight_gradients() {
    let e = Extents { t: 0, h: 6, i: 10 };
    let c = case(5, e, DType::F32);
    let u = upload(&c, DType::F32, &[0]);
    let (y, saved) = mlp(&u.x, &u.gate, &u.up, &u.down, &MlpOptions::default()).unwrap();
    assert_eq!(y.shape(), &[0, 6]);
    let g = mlp_backward(&saved, &u.dy).unwrap();
    assert_eq!(g.x.shape(), &[0, 6]);
    for t in [&g.gate, &g.up, &g.down] {
        assert!(t.to_f64().unwrap().iter().all(|&v| v == 0.0));
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = Extents { t: 4, h: 6, i: 10 };
    let c = case(9, e, DType::F32);
    let u = upload(&c, DType::F32, &[e.t]);
    let opts = MlpOptions::default();
    let eng = engine();
    let wrong_gate = Tensor::zeros(eng, &[10, 5], DType::F32).unwrap();
    assert!(matches!(
        mlp(&u.x, &wrong_gate, &u.up, &u.down, &opts),
        Err(Error::ShapeMismatch { .. })
    ));
    let wrong_up = Tensor::zeros(eng, &[9, 6], DType::F32).unwrap();
    assert!(matches!(
        mlp(&u.x, &u.gate, &wrong_up, &u.down, &opts),
        Err(Error::ShapeMismatch { .. })
    ));
    let wrong_down = Tensor::zeros(eng, &[10, 6], DType::F32).unwrap();
    assert!(matches!(
        mlp(&u.x, &u.gate, &u.up, &wrong_down, &opts),
        Err(Error::ShapeMismatch { .. })
    ));
    let ints = Tensor::from_slice(eng, &[0i32; 24], &[4, 6]).unwrap();
    assert!(matches!(
        mlp(&ints, &u.gate, &u.up, &u.down, &opts),
        Err(Error::UnsupportedDType { .. })
    ));
    let (_, saved) = mlp(&u.x, &u.gate, &u.up, &u.down, &opts).unwrap();
    let wrong_dy = Tensor::zeros(eng, &[4, 7], DType::F32).unwrap();
    assert!(matches!(
        mlp_backward(&saved, &wrong_dy),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// A tiled MLP (`tile_rows`): tiles of 1 row, a tile that does not divide the rows, and one
/// tile larger than every row, against the reference in every dtype; leading dimensions; the
/// untiled call's output bit for bit (no product splits at these shapes); reruns bit-identical.
#[test]
fn row_tiles_match_reference_and_the_untiled_output() {
    let (lead, h, i) = (vec![3usize, 9], 20usize, 36usize);
    let t: usize = lead.iter().product();
    let e = Extents { t, h, i };
    for dtype in DType::FLOATS {
        for kind in [Activation::Silu, Activation::GeluTanh] {
            let c = case(40, e, dtype);
            let u = upload(&c, dtype, &lead);
            let want = reference::forward(kind, &c.x, &c.gate, &c.up, &c.down, e);
            let grads = reference::backward(kind, &c.x, &c.gate, &c.up, &c.down, &c.dy, e);
            let untiled = MlpOptions {
                activation: kind,
                ..MlpOptions::default()
            };
            let (y_untiled, _) = mlp(&u.x, &u.gate, &u.up, &u.down, &untiled).unwrap();
            for tile in [1usize, 4, 10, 64] {
                let options = MlpOptions {
                    tile_rows: Some(tile),
                    ..untiled
                };
                let label = format!("{} {dtype} tile {tile}", kind.name());
                let run = || {
                    let (y, saved) = mlp(&u.x, &u.gate, &u.up, &u.down, &options).unwrap();
                    let g = mlp_backward(&saved, &u.dy).unwrap();
                    (y, g)
                };
                let (y, g) = run();
                assert_eq!((y.shape(), g.x.shape()), (u.x.shape(), u.x.shape()));
                assert_eq!(f32_bits(&y), f32_bits(&y_untiled), "{label}: y vs untiled");
                let tol = Tolerance::for_dtype(DType::F32);
                for (what, got, want) in [
                    ("y", &y, &want),
                    ("dx", &g.x, &grads.x),
                    ("dWg", &g.gate, &grads.gate),
                    ("dWu", &g.up, &grads.up),
                    ("dWd", &g.down, &grads.down),
                ] {
                    assert_close(
                        &format!("{label} {what}"),
                        &got.to_f64().unwrap(),
                        want,
                        tol,
                    );
                }
                let (y2, g2) = run();
                assert_eq!(
                    [&y2, &g2.x, &g2.gate, &g2.up, &g2.down].map(f32_bits),
                    [&y, &g.x, &g.gate, &g.up, &g.down].map(f32_bits),
                    "{label}: rerun"
                );
            }
        }
    }
}

/// With row tiles the engine's peak over a forward and backward stays within the inputs'
/// outputs and gradients plus `intermediate_bytes` (one tile's intermediates), far below the
/// untiled call's; empty rows give zero weight gradients; a tile of 0 rows is a typed error.
#[test]
fn row_tiles_bound_the_peak_memory() {
    let (t, h, i, tile) = (512usize, 16usize, 256usize, 32usize);
    let e = Extents { t, h, i };
    let c = case(41, e, DType::F32);
    let private = common::private_engine();
    let up = |v: &[f64], shape: &[usize]| {
        wgrad::gradcheck::tensor_from_f64(&private, v, shape, DType::F32)
            .unwrap()
            .0
    };
    let (x, wg, wu, wd, dy) = (
        up(&c.x, &[t, h]),
        up(&c.gate, &[i, h]),
        up(&c.up, &[i, h]),
        up(&c.down, &[h, i]),
        up(&c.dy, &[t, h]),
    );
    let peak_of = |options: &MlpOptions| {
        private.synchronize().unwrap();
        let before = private.memory().live_bytes;
        private.reset_peak();
        let (y, saved) = mlp(&x, &wg, &wu, &wd, options).unwrap();
        let g = mlp_backward(&saved, &dy).unwrap();
        private.synchronize().unwrap();
        let grown = private.memory().peak_bytes - before;
        drop((y, saved, g));
        grown
    };
    let outputs = (4 * (2 * t * h + 3 * i * h)) as u64;
    let tiled = MlpOptions {
        tile_rows: Some(tile),
        ..MlpOptions::default()
    };
    let bound = outputs + intermediate_bytes(t, i, &tiled);
    let grown = peak_of(&tiled);
    assert!(grown <= bound, "tiled peak {grown} > {bound}");
    let untiled = peak_of(&MlpOptions::default());
    assert!(
        untiled >= outputs + intermediate_bytes(t, i, &MlpOptions::default()) * 3 / 4,
        "untiled peak {untiled}"
    );
    assert!(grown * 4 < untiled, "tiled {grown} vs untiled {untiled}");
    // No rows: zero weight gradients through the tiled path too.
    let empty = tensor_from_f64(engine(), &[], &[0, 6], DType::F32);
    let w = |shape: &[usize]| Tensor::zeros(engine(), shape, DType::F32).unwrap();
    let (wg0, wu0, wd0) = (w(&[10, 6]), w(&[10, 6]), w(&[6, 10]));
    let (y, saved) = mlp(&empty, &wg0, &wu0, &wd0, &tiled).unwrap();
    assert_eq!(y.shape(), &[0, 6]);
    let g = mlp_backward(&saved, &empty).unwrap();
    for t in [&g.gate, &g.up, &g.down] {
        assert!(t.to_f64().unwrap().iter().all(|&v| v == 0.0));
    }
    let zero = MlpOptions {
        tile_rows: Some(0),
        ..MlpOptions::default()
    };
    assert!(matches!(
        mlp(&empty, &wg0, &wu0, &wd0, &zero),
        Err(Error::InvalidValue { .. })
    ));
}

/// The tensor-core opt-in (`MlpOptions::tensor_cores`). F32 inputs: no product has two F16
/// operands, so the result is the FP32 path's, bit for bit, on any engine. F16 inputs: where
/// the engine cannot run tensor cores the call is `MissingFeature`; where it can, the forward
/// and every gradient (F16 and F32 cotangents, saved and recomputed products, row tiles)
/// match the f64 reference within the tensor-core budget of the products' lengths, and reruns
/// are bit-identical.
#[test]
fn tensor_cores_match_reference_or_are_refused() {
    let tc = MlpOptions {
        tensor_cores: true,
        ..MlpOptions::default()
    };
    let e = Extents {
        t: 37,
        h: 24,
        i: 40,
    };
    let c = case(31, e, DType::F32);
    let u = upload(&c, DType::F32, &[e.t]);
    let run = |u: &Uploaded, options: &MlpOptions, dy: &Tensor| {
        let (y, saved) = mlp(&u.x, &u.gate, &u.up, &u.down, options).unwrap();
        let g = mlp_backward(&saved, dy).unwrap();
        [y, g.x, g.gate, g.up, g.down]
    };
    let plain = run(&u, &MlpOptions::default(), &u.dy);
    let asked = run(&u, &tc, &u.dy);
    for (p, a) in plain.iter().zip(&asked) {
        assert_eq!(
            f32_bits(p),
            f32_bits(a),
            "F32 inputs with tensor_cores: the FP32 path"
        );
    }
    if !wgrad::matmul::tensor_cores(engine()) {
        let u16 = upload(&c, DType::F16, &[e.t]);
        assert!(matches!(
            mlp(&u16.x, &u16.gate, &u16.up, &u16.down, &tc),
            Err(Error::MissingFeature { .. })
        ));
        return;
    }
    for (n, (t, h, i)) in [(37usize, 24usize, 40usize), (136, 72, 200), (256, 128, 264)]
        .into_iter()
        .enumerate()
    {
        let e = Extents { t, h, i };
        let c = case(40 + n as u64, e, DType::F16);
        let u = upload(&c, DType::F16, &[t]);
        let dy32 = tensor_from_f64(engine(), &c.dy, &[t, h], DType::F32);
        let want = reference::forward(Activation::Silu, &c.x, &c.gate, &c.up, &c.down, e);
        let grads = reference::backward(Activation::Silu, &c.x, &c.gate, &c.up, &c.down, &c.dy, e);
        let tol = wgrad::matmul::tensor_core_tolerance(t + h + i);
        for (options, dy) in [
            (tc, &u.dy),
            (
                MlpOptions {
                    recompute: true,
                    ..tc
                },
                &u.dy,
            ),
            (
                MlpOptions {
                    tile_rows: Some(64),
                    ..tc
                },
                &u.dy,
            ),
            (tc, &dy32),
        ] {
            let label = format!(
                "tensor cores t {t} h {h} i {i} {options:?} dy {}",
                dy.dtype()
            );
            let got = run(&u, &options, dy);
            let wants = [&want, &grads.x, &grads.gate, &grads.up, &grads.down];
            for ((what, g), w) in ["y", "dx", "dWg", "dWu", "dWd"].iter().zip(&got).zip(wants) {
                assert_close(&format!("{label} {what}"), &g.to_f64().unwrap(), w, tol);
            }
            let again = run(&u, &options, dy);
            for (g, a) in got.iter().zip(&again) {
                assert_eq!(f32_bits(g), f32_bits(a), "{label}: rerun");
            }
        }
    }
}
