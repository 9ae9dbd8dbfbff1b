//! Paired preference losses (`wgrad::preference`: DPO, CPO, SimPO, ORPO) against the f64
//! reference of `wgrad::reference::preference` (materialized logits): loss, NLL, sequence
//! log-probabilities and dx, dW, dbias for F32, F16 and BF16 heads, summed and averaged
//! log-probabilities, label smoothing, an NLL term, reference log-probabilities, ignored
//! tokens; finite differences of the reference backward; chunk sizes; reruns; an explicit
//! cotangent; empty batches; bad inputs.

mod common;

use common::{Rng, assert_close, engine, f32_bits, stored, tensor_from_f64};
use wgrad::fused_linear::{Chunking, LinearHead};
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::preference::{
    PreferenceLoss, PreferenceOptions, PreferenceReference, preference_loss,
    preference_loss_backward,
};
use wgrad::reference::preference::{self as reference, Inputs, Margin, Settings, Sizes};
use wgrad::{DType, Error, Tensor};

struct Case {
    s: Sizes,
    x: Vec<f64>,
    w: Vec<f64>,
    bias: Vec<f64>,
    targets: Vec<i32>,
    ref_c: Vec<f64>,
    ref_r: Vec<f64>,
}

/// Random head and targets, about a quarter of the tokens ignored (−100), reference
/// log-probabilities near the policy's.
fn case(seed: u64, s: Sizes, dtype: DType) -> Case {
    let mut rng = Rng::new(seed);
    let rows = 2 * s.pairs * s.tokens;
    let targets = (0..rows)
        .map(|_| {
            if rng.next_f64() < 0.25 {
                -100
            } else {
                (rng.next_f64() * s.v as f64) as i32
            }
        })
        .collect();
    Case {
        s,
        x: stored(&rng.vec(rows * s.h, -1.0, 1.0), dtype),
        w: stored(&rng.vec(s.v * s.h, -0.5, 0.5), dtype),
        bias: stored(&rng.vec(s.v, -0.2, 0.2), dtype),
        targets,
        ref_c: stored(&rng.vec(s.pairs, -12.0, -8.0), DType::F32),
        ref_r: stored(&rng.vec(s.pairs, -12.0, -8.0), DType::F32),
    }
}

fn inputs<'a>(c: &'a Case, with_ref: bool) -> Inputs<'a> {
    Inputs {
        x: &c.x,
        w: &c.w,
        bias: Some(&c.bias),
        targets: &c.targets,
        reference: with_ref.then_some((c.ref_c.as_slice(), c.ref_r.as_slice())),
    }
}

fn settings(o: &PreferenceOptions) -> Settings {
    Settings {
        margin: match o.loss {
            PreferenceLoss::Dpo => Margin::Dpo,
            PreferenceLoss::Cpo => Margin::Cpo,
            PreferenceLoss::SimPo { gamma } => Margin::SimPo(f64::from(gamma)),
            PreferenceLoss::Orpo => Margin::Orpo,
            // (KTO has no pair margin; its reference functions ignore this.)
            PreferenceLoss::Kto => Margin::Cpo,
        },
        beta: f64::from(o.beta),
        smoothing: f64::from(o.label_smoothing),
        alpha: f64::from(o.nll_weight),
        average: o.average_log_prob,
        ignore_index: o.ignore_index,
    }
}

struct Uploaded {
    x: Tensor,
    w: Tensor,
    bias: Tensor,
    targets: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
}

fn upload(c: &Case, dtype: DType) -> Uploaded {
    let e = engine();
    let s = c.s;
    Uploaded {
        x: tensor_from_f64(e, &c.x, &[2 * s.pairs, s.tokens, s.h], dtype),
        w: tensor_from_f64(e, &c.w, &[s.v, s.h], dtype),
        bias: tensor_from_f64(e, &c.bias, &[s.v], dtype),
        targets: Tensor::from_slice(e, &c.targets, &[2 * s.pairs, s.tokens]).unwrap(),
        ref_c: tensor_from_f64(e, &c.ref_c, &[s.pairs], DType::F32),
        ref_r: tensor_from_f64(e, &c.ref_r, &[s.pairs], DType::F32),
    }
}

fn log_probs(u: &Uploaded) -> PreferenceReference<'_> {
    PreferenceReference::LogProbs {
        chosen: &u.ref_c,
        rejected: &u.ref_r,
    }
}

fn head(u: &Uploaded) -> LinearHead<'_> {
    LinearHead {
        input: &u.x,
        weight: &u.w,
        bias: Some(&u.bias),
    }
}

/// Forward and backward on the GPU against the reference.
fn check(what: &str, c: &Case, dtype: DType, with_ref: bool, o: &PreferenceOptions) {
    let u = upload(c, dtype);
    let refs = with_ref.then_some(log_probs(&u));
    let (out, saved) = preference_loss(head(&u), &u.targets, refs, o).unwrap();
    let set = settings(o);
    let inp = inputs(c, with_ref);
    let want = reference::forward(c.s, &inp, &set);
    let tol = Tolerance::for_dtype(DType::F32);
    let what = format!("{what} {dtype} {:?} average {}", o.loss, o.average_log_prob);
    assert_close(
        &format!("{what} loss"),
        &out.loss.to_f64().unwrap(),
        &[want.loss],
        tol,
    );
    assert_close(
        &format!("{what} nll"),
        &out.nll.to_f64().unwrap(),
        &[want.nll],
        tol,
    );
    assert_eq!(out.logps.shape(), &[2, c.s.pairs]);
    assert_close(
        &format!("{what} logps"),
        &out.logps.to_f64().unwrap(),
        &want.logps,
        tol,
    );
    let g = preference_loss_backward(&saved, None).unwrap();
    let (dx, dw, db) = reference::backward(c.s, &inp, &set, 1.0);
    assert_eq!(g.input.shape(), u.x.shape());
    assert_close(&format!("{what} dx"), &g.input.to_f64().unwrap(), &dx, tol);
    assert_close(&format!("{what} dW"), &g.weight.to_f64().unwrap(), &dw, tol);
    let gb = g.bias.expect("bias gradient").to_f64().unwrap();
    assert_close(&format!("{what} dbias"), &gb, &db, tol);
}

const SIZES: Sizes = Sizes {
    pairs: 3,
    tokens: 7,
    h: 16,
    v: 37,
};

fn losses() -> Vec<(PreferenceOptions, bool)> {
    let mut cpo = PreferenceOptions::new(PreferenceLoss::Cpo);
    cpo.label_smoothing = 0.1;
    cpo.nll_weight = 0.5;
    let mut dpo_avg = PreferenceOptions::new(PreferenceLoss::Dpo);
    dpo_avg.average_log_prob = true;
    dpo_avg.beta = 0.5;
    vec![
        (PreferenceOptions::new(PreferenceLoss::Dpo), true),
        (PreferenceOptions::new(PreferenceLoss::Dpo), false),
        (dpo_avg, true),
        (cpo, false),
        (
            PreferenceOptions::new(PreferenceLoss::SimPo { gamma: 0.5 }),
            false,
        ),
        (PreferenceOptions::new(PreferenceLoss::Orpo), false),
    ]
}

#[test]
fn every_loss_and_dtype_matches_the_reference() {
    for dtype in DType::FLOATS {
        for (n, (o, with_ref)) in losses().into_iter().enumerate() {
            let c = case(100 + n as u64, SIZES, dtype);
            check("loss", &c, dtype, with_ref, &o);
        }
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    let s = Sizes {
        pairs: 2,
        tokens: 3,
        h: 4,
        v: 5,
    };
    let c = case(7, s, DType::F32);
    for (o, with_ref) in losses() {
        let set = settings(&o);
        let inp = inputs(&c, with_ref);
        let (dx, dw, db) = reference::backward(s, &inp, &set, 1.0);
        let loss_x = |p: &[f64]| vec![reference::forward(s, &Inputs { x: p, ..inp }, &set).loss];
        let loss_w = |p: &[f64]| vec![reference::forward(s, &Inputs { w: p, ..inp }, &set).loss];
        let loss_b = |p: &[f64]| {
            vec![
                reference::forward(
                    s,
                    &Inputs {
                        bias: Some(p),
                        ..inp
                    },
                    &set,
                )
                .loss,
            ]
        };
        for (name, check) in [
            ("dx", check_vjp(loss_x, &c.x, &[1.0], &dx)),
            ("dW", check_vjp(loss_w, &c.w, &[1.0], &dw)),
            ("dbias", check_vjp(loss_b, &c.bias, &[1.0], &db)),
        ] {
            assert!(check.passed, "{:?} {name}: {check}", o.loss);
        }
    }
}

#[test]
fn chunk_sizes_reruns_and_the_cotangent() {
    let c = case(30, SIZES, DType::F32);
    let u = upload(&c, DType::F32);
    let refs = Some(log_probs(&u));
    let run = |chunk: Option<usize>, d: Option<&Tensor>| {
        let o = PreferenceOptions {
            chunking: Chunking {
                chunk_rows: chunk,
                memory_budget: None,
                tensor_cores: false,
                tensor_core_gradients: false,
                ..Chunking::default()
            },
            ..PreferenceOptions::new(PreferenceLoss::Dpo)
        };
        let (out, saved) = preference_loss(head(&u), &u.targets, refs, &o).unwrap();
        let g = preference_loss_backward(&saved, d).unwrap();
        (out, g)
    };
    let (out, g) = run(None, None);
    let (out2, g2) = run(None, None);
    assert_eq!(f32_bits(&out.loss), f32_bits(&out2.loss));
    assert_eq!(f32_bits(&g.input), f32_bits(&g2.input));
    assert_eq!(f32_bits(&g.weight), f32_bits(&g2.weight));
    let tol = Tolerance::for_dtype(DType::F32);
    for chunk in [1, 5, 64] {
        let (o, gc) = run(Some(chunk), None);
        assert_close(
            "chunk loss",
            &o.loss.to_f64().unwrap(),
            &out.loss.to_f64().unwrap(),
            tol,
        );
        assert_close(
            "chunk dx",
            &gc.input.to_f64().unwrap(),
            &g.input.to_f64().unwrap(),
            tol,
        );
        assert_close(
            "chunk dW",
            &gc.weight.to_f64().unwrap(),
            &g.weight.to_f64().unwrap(),
            tol,
        );
    }
    let d = Tensor::from_slice(engine(), &[3.0f32], &[1]).unwrap();
    let (_, g3) = run(None, Some(&d));
    let want: Vec<f64> = g.weight.to_f64().unwrap().iter().map(|v| 3.0 * v).collect();
    assert_close("cotangent", &g3.weight.to_f64().unwrap(), &want, tol);
    // Ignored tokens get no input gradient.
    let dx = g.input.to_f64().unwrap();
    for (r, &t) in c.targets.iter().enumerate() {
        if t == -100 {
            assert!(dx[r * SIZES.h..(r + 1) * SIZES.h].iter().all(|&v| v == 0.0));
        }
    }
}

/// DPO with gradients in the head's dtypes (`Chunking::head_dtype_gradients`, chunks of 5
/// rows, blocks of 8 of the 37 columns; the backward recomputes with per-token cotangents),
/// and again with `Chunking::block_statistics` (no row chunks): d input and d weight the
/// reference's rounded once to the dtype (one unit), d bias F32.
#[test]
fn head_dtype_gradients_match_the_reference() {
    let tol = Tolerance::for_dtype(DType::F32);
    for (dtype, block_statistics) in DType::FLOATS
        .into_iter()
        .flat_map(|d| [(d, false), (d, true)])
    {
        let c = case(140, SIZES, dtype);
        let u = upload(&c, dtype);
        let o = PreferenceOptions {
            chunking: Chunking {
                chunk_rows: Some(5),
                vocab_block: Some(8),
                head_dtype_gradients: true,
                block_statistics,
                ..Chunking::default()
            },
            ..PreferenceOptions::new(PreferenceLoss::Dpo)
        };
        let (out, saved) = preference_loss(head(&u), &u.targets, Some(log_probs(&u)), &o).unwrap();
        let set = settings(&o);
        let inp = inputs(&c, true);
        let want = reference::forward(c.s, &inp, &set);
        assert_close(
            &format!("{dtype} (block statistics {block_statistics}) loss"),
            &out.loss.to_f64().unwrap(),
            &[want.loss],
            tol,
        );
        let g = preference_loss_backward(&saved, None).unwrap();
        let (dx, dw, db) = reference::backward(c.s, &inp, &set, 1.0);
        let rounded = common::rounded_tolerance(dtype, 1.0);
        for (name, got, want) in [("dx", &g.input, &dx), ("dW", &g.weight, &dw)] {
            assert_eq!(got.dtype(), dtype, "{dtype} {name} dtype");
            assert_close(
                &format!("{dtype} (block statistics {block_statistics}) {name}"),
                &got.to_f64().unwrap(),
                &stored(want, dtype),
                rounded,
            );
        }
        let gb = g.bias.expect("bias gradient");
        assert_eq!(gb.dtype(), DType::F32);
        assert_close(
            &format!("{dtype} (block statistics {block_statistics}) dbias"),
            &gb.to_f64().unwrap(),
            &db,
            tol,
        );
    }
}

#[test]
fn empty_batches() {
    let e = engine();
    let x = Tensor::zeros(e, &[0, 4, 8], DType::F32).unwrap();
    let w = Tensor::zeros(e, &[11, 8], DType::F32).unwrap();
    let t = Tensor::zeros(e, &[0, 4], DType::I32).unwrap();
    let o = PreferenceOptions::new(PreferenceLoss::Orpo);
    let head = LinearHead {
        input: &x,
        weight: &w,
        bias: None,
    };
    let (out, saved) = preference_loss(head, &t, None, &o).unwrap();
    assert_eq!(out.loss.to_f64().unwrap(), vec![0.0]);
    let g = preference_loss_backward(&saved, None).unwrap();
    assert_eq!(g.input.shape(), &[0, 4, 8]);
    assert!(g.weight.to_f64().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let c = case(40, SIZES, DType::F32);
    let u = upload(&c, DType::F32);
    let dpo = PreferenceOptions::new(PreferenceLoss::Dpo);
    let err = |h: LinearHead, refs: Option<PreferenceReference>, o: &PreferenceOptions| {
        preference_loss(h, &u.targets, refs, o).unwrap_err()
    };
    // An odd number of sequences, a 2-D input.
    let odd = Tensor::zeros(e, &[5, SIZES.tokens, SIZES.h], DType::F32).unwrap();
    let odd_head = LinearHead {
        input: &odd,
        ..head(&u)
    };
    assert!(matches!(
        err(odd_head, None, &dpo),
        Error::ShapeMismatch { .. }
    ));
    let flat = u.x.reshape(&[6 * SIZES.tokens, SIZES.h]).unwrap();
    let flat_head = LinearHead {
        input: &flat,
        ..head(&u)
    };
    assert!(matches!(
        err(flat_head, None, &dpo),
        Error::ShapeMismatch { .. }
    ));
    // Reference log-probabilities: wrong shape, dtype, loss.
    let short = Tensor::zeros(e, &[2], DType::F32).unwrap();
    assert!(matches!(
        err(
            head(&u),
            Some(PreferenceReference::LogProbs {
                chosen: &short,
                rejected: &u.ref_r
            }),
            &dpo
        ),
        Error::ShapeMismatch { .. }
    ));
    let half = Tensor::zeros(e, &[3], DType::BF16).unwrap();
    assert!(matches!(
        err(
            head(&u),
            Some(PreferenceReference::LogProbs {
                chosen: &u.ref_c,
                rejected: &half
            }),
            &dpo
        ),
        Error::UnsupportedDType { .. }
    ));
    let cpo = PreferenceOptions::new(PreferenceLoss::Cpo);
    assert!(matches!(
        err(head(&u), Some(log_probs(&u)), &cpo),
        Error::InvalidValue { .. }
    ));
    // Scalars.
    let bad = [
        PreferenceOptions {
            beta: 0.0,
            ..dpo.clone()
        },
        PreferenceOptions {
            beta: f32::NAN,
            ..dpo.clone()
        },
        PreferenceOptions {
            label_smoothing: 0.6,
            ..dpo.clone()
        },
        PreferenceOptions {
            label_smoothing: 0.1,
            ..PreferenceOptions::new(PreferenceLoss::Orpo)
        },
        PreferenceOptions {
            nll_weight: -1.0,
            ..dpo.clone()
        },
        PreferenceOptions::new(PreferenceLoss::SimPo {
            gamma: f32::INFINITY,
        }),
    ];
    for o in &bad {
        assert!(
            matches!(err(head(&u), None, o), Error::InvalidValue { .. }),
            "{o:?}"
        );
    }
    // Targets out of range (checked through the head).
    let mut t = c.targets.clone();
    t[3] = SIZES.v as i32;
    let far = Tensor::from_slice(e, &t, &[6, SIZES.tokens]).unwrap();
    assert!(matches!(
        preference_loss(head(&u), &far, None, &dpo),
        Err(Error::OutOfBounds { .. })
    ));
    // Cotangent shape.
    let (_, saved) = preference_loss(head(&u), &u.targets, None, &dpo).unwrap();
    let two = Tensor::zeros(e, &[2], DType::F32).unwrap();
    assert!(matches!(
        preference_loss_backward(&saved, Some(&two)),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// KTO (`kto_loss`) against the reference for every head dtype: an odd number of sequences
/// with mixed labels, with and without reference log-probabilities and a reference point,
/// summed and averaged π; finite differences of the reference backward; bad inputs.
#[test]
fn kto_matches_the_reference() {
    use wgrad::preference::kto_loss;
    let e = engine();
    let n = 5usize;
    let s = Sizes {
        pairs: 0,
        tokens: 6,
        h: 10,
        v: 23,
    };
    let desirable = [true, false, true, true, false];
    let labels: Vec<u32> = desirable.iter().map(|&d| u32::from(d)).collect();
    for dtype in DType::FLOATS {
        let mut rng = Rng::new(80);
        let x = stored(&rng.vec(n * s.tokens * s.h, -1.0, 1.0), dtype);
        let w = stored(&rng.vec(s.v * s.h, -0.5, 0.5), dtype);
        let targets: Vec<i32> = (0..n * s.tokens)
            .map(|r| {
                if r % 5 == 3 {
                    -100
                } else {
                    (rng.next_f64() * s.v as f64) as i32
                }
            })
            .collect();
        let refs = stored(&rng.vec(n, -20.0, -14.0), DType::F32);
        let (xt, wt) = (
            tensor_from_f64(e, &x, &[n, s.tokens, s.h], dtype),
            tensor_from_f64(e, &w, &[s.v, s.h], dtype),
        );
        let tt = Tensor::from_slice(e, &targets, &[n, s.tokens]).unwrap();
        let lt = Tensor::from_slice(e, &labels, &[n]).unwrap();
        let rt = tensor_from_f64(e, &refs, &[n], DType::F32);
        let zt = Tensor::from_slice(e, &[0.3f32], &[1]).unwrap();
        let head = LinearHead {
            input: &xt,
            weight: &wt,
            bias: None,
        };
        for (with_ref, average) in [(true, false), (false, true)] {
            let mut o = PreferenceOptions::new(PreferenceLoss::Kto);
            o.average_log_prob = average;
            o.beta = 0.5;
            let (reference, point) = if with_ref {
                (Some(&rt), Some(&zt))
            } else {
                (None, None)
            };
            let (out, saved) = kto_loss(head, &tt, &lt, reference, point, &o).unwrap();
            let g = preference_loss_backward(&saved, None).unwrap();
            let set = settings(&o);
            let inp = Inputs {
                x: &x,
                w: &w,
                bias: None,
                targets: &targets,
                reference: None,
            };
            let r = with_ref.then_some(refs.as_slice());
            let z0 = if with_ref { 0.3 } else { 0.0 };
            let (loss, logps) = reference::kto_forward(s, n, &inp, &set, &desirable, r, z0);
            let (dx, dw, _) = reference::kto_backward(s, n, &inp, &set, &desirable, r, z0, 1.0);
            let tol = Tolerance::for_dtype(DType::F32);
            let what = format!("kto {dtype} ref {with_ref} average {average}");
            assert_close(&what, &out.loss.to_f64().unwrap(), &[loss], tol);
            assert_close(&what, &out.logps.to_f64().unwrap(), &logps, tol);
            assert_close(&format!("{what} dx"), &g.input.to_f64().unwrap(), &dx, tol);
            assert_close(&format!("{what} dW"), &g.weight.to_f64().unwrap(), &dw, tol);
            // Finite differences of the reference (F32 case only: one is enough).
            if dtype == DType::F32 {
                let f = |p: &[f64]| {
                    vec![
                        reference::kto_forward(
                            s,
                            n,
                            &Inputs { w: p, ..inp },
                            &set,
                            &desirable,
                            r,
                            z0,
                        )
                        .0,
                    ]
                };
                let check = check_vjp(f, &w, &[1.0], &dw);
                assert!(check.passed, "{what}: {check}");
            }
        }
        // Bad inputs.
        let dpo = PreferenceOptions::new(PreferenceLoss::Dpo);
        assert!(matches!(
            kto_loss(head, &tt, &lt, None, None, &dpo),
            Err(Error::InvalidValue { .. })
        ));
        let kto = PreferenceOptions::new(PreferenceLoss::Kto);
        assert!(matches!(
            preference_loss(head, &tt, None, &kto),
            Err(Error::InvalidValue { .. }) | Err(Error::ShapeMismatch { .. })
        ));
        let short = Tensor::from_slice(e, &[1u32, 0], &[2]).unwrap();
        assert!(matches!(
            kto_loss(head, &tt, &short, None, None, &kto),
            Err(Error::ShapeMismatch { .. })
        ));
        let float_labels = Tensor::zeros(e, &[n], DType::F32).unwrap();
        assert!(matches!(
            kto_loss(head, &tt, &float_labels, None, None, &kto),
            Err(Error::UnsupportedDType { .. })
        ));
        let two = Tensor::zeros(e, &[2], DType::F32).unwrap();
        assert!(matches!(
            kto_loss(head, &tt, &lt, None, Some(&two), &kto),
            Err(Error::ShapeMismatch { .. })
        ));
        let smoothed = PreferenceOptions {
            label_smoothing: 0.1,
            ..kto.clone()
        };
        assert!(matches!(
            kto_loss(head, &tt, &lt, None, None, &smoothed),
            Err(Error::InvalidValue { .. })
        ));
    }
}

/// DPO against a reference head (`PreferenceReference::Head`, its own hidden size): the same
/// loss and gradients as the reference computed with that head's sequence log-probabilities;
/// summed and averaged π; a reference head of another shape is a typed error.
#[test]
fn dpo_with_a_reference_head() {
    let e = engine();
    let c = case(90, SIZES, DType::F32);
    let u = upload(&c, DType::F32);
    let mut rng = Rng::new(91);
    let h_ref = 9;
    let rows = 2 * SIZES.pairs * SIZES.tokens;
    let x_ref = rng.vec(rows * h_ref, -1.0, 1.0);
    let w_ref = rng.vec(SIZES.v * h_ref, -0.5, 0.5);
    let xr = tensor_from_f64(
        e,
        &x_ref,
        &[2 * SIZES.pairs, SIZES.tokens, h_ref],
        DType::F32,
    );
    let wr = tensor_from_f64(e, &w_ref, &[SIZES.v, h_ref], DType::F32);
    let ref_head = LinearHead {
        input: &xr,
        weight: &wr,
        bias: None,
    };
    for average in [false, true] {
        let mut o = PreferenceOptions::new(PreferenceLoss::Dpo);
        o.average_log_prob = average;
        let set = settings(&o);
        // The reference head's π, from the f64 reference.
        let ref_inputs = Inputs {
            x: &x_ref,
            w: &w_ref,
            bias: None,
            targets: &c.targets,
            reference: None,
        };
        let pi_ref = reference::forward(Sizes { h: h_ref, ..SIZES }, &ref_inputs, &set).logps;
        let (rc, rr) = pi_ref.split_at(SIZES.pairs);
        let inp = Inputs {
            reference: Some((rc, rr)),
            ..inputs(&c, false)
        };
        let want = reference::forward(SIZES, &inp, &set);
        let (dx, dw, db) = reference::backward(SIZES, &inp, &set, 1.0);
        let (out, saved) = preference_loss(
            head(&u),
            &u.targets,
            Some(PreferenceReference::Head(ref_head)),
            &o,
        )
        .unwrap();
        let g = preference_loss_backward(&saved, None).unwrap();
        let tol = Tolerance::for_dtype(DType::F32);
        let what = format!("reference head average {average}");
        assert_close(&what, &out.loss.to_f64().unwrap(), &[want.loss], tol);
        assert_close(&what, &out.logps.to_f64().unwrap(), &want.logps, tol);
        assert_close(&format!("{what} dx"), &g.input.to_f64().unwrap(), &dx, tol);
        assert_close(&format!("{what} dW"), &g.weight.to_f64().unwrap(), &dw, tol);
        let gb = g.bias.expect("bias gradient").to_f64().unwrap();
        assert_close(&format!("{what} dbias"), &gb, &db, tol);
    }
    // A reference head with other sequence extents; a reference for a loss other than DPO.
    let short = Tensor::zeros(e, &[2 * SIZES.pairs, SIZES.tokens - 1, h_ref], DType::F32).unwrap();
    let bad = LinearHead {
        input: &short,
        ..ref_head
    };
    assert!(matches!(
        preference_loss(
            head(&u),
            &u.targets,
            Some(PreferenceReference::Head(bad)),
            &PreferenceOptions::new(PreferenceLoss::Dpo),
        ),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        preference_loss(
            head(&u),
            &u.targets,
            Some(PreferenceReference::Head(ref_head)),
            &PreferenceOptions::new(PreferenceLoss::SimPo { gamma: 0.5 }),
        ),
        Err(Error::InvalidValue { .. })
    ));
}
