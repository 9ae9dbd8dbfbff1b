//! The GRPO token loss (`wgrad::grpo`) against the f64 reference of `wgrad::reference::grpo`:
//! loss, per-token losses, KL estimates, clip flags and d logits for F32, F16 and BF16 logits,
//! every loss normalization, with and without old / reference log-probabilities and a mask,
//! logits with L and L + 1 positions, clipping active on both sides; finite differences of the
//! reference backward; an explicit cotangent; masked and shifted positions get exact zeros;
//! bit-identical reruns; 16-bit gradients; empty batches; every documented bad input.

mod common;

use common::{Rng, assert_close, engine, f32_bits, stored, tensor_from_f64};
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::grpo::{
    GrpoInputs, GrpoLossType, GrpoOptions, grpo_loss, grpo_loss_backward, grpo_loss_backward_as,
};
use wgrad::reference::grpo::{self as reference, Norm, Settings, Sizes, Tokens};
use wgrad::{DType, Error, Tensor};

/// Host data of one case.
struct Case {
    s: Sizes,
    logits: Vec<f64>,
    ids: Vec<i32>,
    advantages: Vec<f64>,
    old: Vec<f64>,
    reference: Vec<f64>,
    mask: Vec<bool>,
}

/// Logits in [-3, 3), ids, advantages of both signs, and old / reference log-probabilities
/// 0.6 around the tokens' own (so ratios leave [0.8, 1.2] on both sides), every third token
/// masked.
fn case(seed: u64, s: Sizes, dtype: DType, temperature: f64) -> Case {
    let mut rng = Rng::new(seed);
    let logits = stored(&rng.vec(s.batch * s.positions * s.vocab, -3.0, 3.0), dtype);
    let ids: Vec<i32> = (0..s.batch * s.seq)
        .map(|_| (rng.next_f64() * s.vocab as f64) as i32)
        .collect();
    let advantages = rng.vec(s.batch, -1.5, 1.5);
    let mut c = Case {
        s,
        logits,
        ids,
        advantages: stored(&advantages, DType::F32),
        old: Vec::new(),
        reference: Vec::new(),
        mask: (0..s.batch * s.seq).map(|r| r % 3 != 1).collect(),
    };
    for lp in own_logp(&c, temperature) {
        c.old
            .push(stored(&[lp + rng.uniform(-0.6, 0.6)], DType::F32)[0]);
        c.reference
            .push(stored(&[lp + rng.uniform(-0.6, 0.6)], DType::F32)[0]);
    }
    c
}

/// Which optional inputs a run uses.
#[derive(Clone, Copy, Debug)]
struct Uses {
    old: bool,
    reference: bool,
    mask: bool,
}

struct Uploaded {
    logits: Tensor,
    ids: Tensor,
    advantages: Tensor,
    old: Tensor,
    reference: Tensor,
    mask: Tensor,
}

fn upload(c: &Case, dtype: DType) -> Uploaded {
    let e = engine();
    let s = c.s;
    let mask: Vec<i32> = c.mask.iter().map(|&m| i32::from(m)).collect();
    Uploaded {
        logits: tensor_from_f64(e, &c.logits, &[s.batch, s.positions, s.vocab], dtype),
        ids: Tensor::from_slice(e, &c.ids, &[s.batch, s.seq]).unwrap(),
        advantages: tensor_from_f64(e, &c.advantages, &[s.batch], DType::F32),
        old: tensor_from_f64(e, &c.old, &[s.batch, s.seq], DType::F32),
        reference: tensor_from_f64(e, &c.reference, &[s.batch, s.seq], DType::F32),
        mask: Tensor::from_slice(e, &mask, &[s.batch, s.seq]).unwrap(),
    }
}

fn inputs<'a>(u: &'a Uploaded, uses: Uses) -> GrpoInputs<'a> {
    GrpoInputs {
        logits: &u.logits,
        completion_ids: &u.ids,
        advantages: &u.advantages,
        old_logp: uses.old.then_some(&u.old),
        ref_logp: uses.reference.then_some(&u.reference),
        mask: uses.mask.then_some(&u.mask),
    }
}

fn tokens<'a>(c: &'a Case, uses: Uses) -> Tokens<'a> {
    Tokens {
        ids: &c.ids,
        advantages: &c.advantages,
        old_logp: uses.old.then_some(c.old.as_slice()),
        ref_logp: uses.reference.then_some(c.reference.as_slice()),
        mask: uses.mask.then_some(c.mask.as_slice()),
    }
}

fn settings(o: &GrpoOptions) -> Settings {
    Settings {
        temperature: o.temperature,
        beta: o.beta,
        eps_low: o.eps_low,
        eps_high: o.eps_high,
        norm: match o.loss_type {
            GrpoLossType::Grpo => Norm::Grpo,
            GrpoLossType::Bnpo | GrpoLossType::Dapo => Norm::Bnpo,
            GrpoLossType::DrGrpo {
                max_completion_length,
            } => Norm::DrGrpo(max_completion_length),
        },
    }
}

/// Run forward and backward and compare every output with the reference.
fn check(what: &str, c: &Case, dtype: DType, uses: Uses, o: &GrpoOptions) {
    let u = upload(c, dtype);
    let (out, saved) = grpo_loss(&inputs(&u, uses), o).unwrap();
    let set = settings(o);
    let tok = tokens(c, uses);
    let want = reference::forward(&c.logits, c.s, &tok, &set);
    let tol = Tolerance::for_dtype(DType::F32);
    let what = format!("{what} {dtype} {uses:?} {:?}", o.loss_type);
    assert_close(
        &format!("{what} loss"),
        &out.loss.to_f64().unwrap(),
        &[want.loss],
        tol,
    );
    assert_close(
        &format!("{what} per_token"),
        &out.per_token.to_f64().unwrap(),
        &want.per_token,
        tol,
    );
    assert_close(
        &format!("{what} kl"),
        &out.kl.to_f64().unwrap(),
        &want.kl,
        tol,
    );
    let clipped: Vec<bool> = out
        .clipped
        .to_vec::<u32>()
        .unwrap()
        .iter()
        .map(|&v| v != 0)
        .collect();
    assert_eq!(clipped, want.clipped, "{what} clipped");
    let grad = grpo_loss_backward(&saved, None).unwrap();
    assert_eq!((grad.shape(), grad.dtype()), (u.logits.shape(), DType::F32));
    let want_grad = reference::backward(&c.logits, c.s, &tok, &set, 1.0);
    assert_close(
        &format!("{what} d_logits"),
        &grad.to_f64().unwrap(),
        &want_grad,
        tol,
    );
}

const ALL: Uses = Uses {
    old: true,
    reference: true,
    mask: true,
};

/// Every dtype and loss type against the reference, with rows of 300 logits (whole 16-byte
/// chunks for F32 only: the chunked passes for F32, the element passes for 16 bits) and of 296
/// (whole chunks for every dtype).
#[test]
fn every_dtype_and_loss_type_matches_the_reference() {
    for vocab in [300, 296] {
        every_dtype_and_loss_type(vocab);
    }
}

fn every_dtype_and_loss_type(vocab: usize) {
    let s = Sizes {
        batch: 3,
        seq: 5,
        positions: 6,
        vocab,
    };
    let loss_types = [
        GrpoLossType::Grpo,
        GrpoLossType::Bnpo,
        GrpoLossType::Dapo,
        GrpoLossType::DrGrpo {
            max_completion_length: 8,
        },
    ];
    for dtype in DType::FLOATS {
        for (n, loss_type) in loss_types.into_iter().enumerate() {
            let o = GrpoOptions {
                temperature: 0.7,
                beta: 0.04,
                eps_low: 0.2,
                eps_high: 0.28,
                loss_type,
                check_ids: true,
            };
            let c = case(10 + n as u64, s, dtype, o.temperature);
            check("all inputs", &c, dtype, ALL, &o);
        }
    }
}

#[test]
fn optional_inputs_alone_and_l_positions() {
    let s = Sizes {
        batch: 2,
        seq: 7,
        positions: 7,
        vocab: 37,
    };
    let c = case(20, s, DType::F32, 1.0);
    for (old, reference, mask) in [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (false, false, true),
        (true, false, true),
    ] {
        let o = GrpoOptions {
            beta: if reference { 0.1 } else { 0.0 },
            loss_type: GrpoLossType::Grpo,
            ..GrpoOptions::default()
        };
        let uses = Uses {
            old,
            reference,
            mask,
        };
        check("optional inputs", &c, DType::F32, uses, &o);
    }
    // A reference without β: KL reported, not added.
    let u = upload(&c, DType::F32);
    let uses = Uses {
        old: true,
        reference: true,
        mask: false,
    };
    let (out, _) = grpo_loss(&inputs(&u, uses), &GrpoOptions::default()).unwrap();
    let (plain, _) = grpo_loss(
        &inputs(
            &u,
            Uses {
                reference: false,
                ..uses
            },
        ),
        &GrpoOptions::default(),
    )
    .unwrap();
    assert_eq!(f32_bits(&out.loss), f32_bits(&plain.loss));
    assert!(out.kl.to_f64().unwrap().iter().any(|&k| k > 0.0));
}

#[test]
fn clipping_happens_on_both_sides() {
    let s = Sizes {
        batch: 4,
        seq: 16,
        positions: 17,
        vocab: 64,
    };
    let c = case(30, s, DType::F32, 1.0);
    let set = settings(&GrpoOptions::default());
    let f = reference::forward(&c.logits, s, &tokens(&c, ALL), &set);
    // (advantage, clipped) of token r.
    let ratio = |r: usize| {
        let b = r / s.seq;
        (c.advantages[b], f.clipped[r])
    };
    let clipped_pos =
        (0..s.batch * s.seq).any(|r| ratio(r) == (ratio(r).0, true) && ratio(r).0 > 0.0);
    let clipped_neg = (0..s.batch * s.seq).any(|r| ratio(r).1 && ratio(r).0 < 0.0);
    assert!(clipped_pos && clipped_neg, "the case must clip both ways");
    check("clipping", &c, DType::F32, ALL, &GrpoOptions::default());
}

/// Each token's log-probability under temperature `t`.
fn own_logp(c: &Case, t: f64) -> Vec<f64> {
    let s = c.s;
    (0..s.batch * s.seq)
        .map(|r| {
            let start = (r / s.seq * s.positions + r % s.seq) * s.vocab;
            let row: Vec<f64> = c.logits[start..start + s.vocab]
                .iter()
                .map(|x| x / t)
                .collect();
            wgrad::reference::loss::log_softmax(&row, 1, s.vocab)[c.ids[r] as usize]
        })
        .collect()
}

#[test]
fn reference_backward_matches_finite_differences() {
    let s = Sizes {
        batch: 2,
        seq: 3,
        positions: 4,
        vocab: 5,
    };
    let c = case(40, s, DType::F32, 0.8);
    for loss_type in [Norm::Grpo, Norm::Bnpo, Norm::DrGrpo(4)] {
        let set = Settings {
            temperature: 0.8,
            beta: 0.3,
            eps_low: 0.2,
            eps_high: 0.3,
            norm: loss_type,
        };
        for uses in [
            ALL,
            Uses {
                old: false,
                reference: true,
                mask: false,
            },
        ] {
            let tok = tokens(&c, uses);
            let analytic = reference::backward(&c.logits, s, &tok, &set, 1.0);
            // Without old log-probabilities the ratio's denominator is the token's own
            // log-probability held constant: differentiate with it frozen at the base point.
            let frozen = own_logp(&c, 0.8);
            let fd_tok = Tokens {
                old_logp: Some(tok.old_logp.unwrap_or(&frozen)),
                ..tok
            };
            let check = check_vjp(
                |x| vec![reference::forward(x, s, &fd_tok, &set).loss],
                &c.logits,
                &[1.0],
                &analytic,
            );
            assert!(check.passed, "{loss_type:?} {uses:?}: {check}");
        }
    }
}

#[test]
fn cotangent_masks_shift_reruns_and_16_bit_gradients() {
    let s = Sizes {
        batch: 2,
        seq: 6,
        positions: 7,
        vocab: 264,
    };
    let c = case(50, s, DType::BF16, 1.0);
    let u = upload(&c, DType::BF16);
    let o = GrpoOptions {
        beta: 0.05,
        ..GrpoOptions::default()
    };
    let (_, saved) = grpo_loss(&inputs(&u, ALL), &o).unwrap();
    let unit = grpo_loss_backward(&saved, None).unwrap();
    let again = grpo_loss_backward(&saved, None).unwrap();
    assert_eq!(f32_bits(&unit), f32_bits(&again), "rerun");
    let (_, saved2) = grpo_loss(&inputs(&u, ALL), &o).unwrap();
    let third = grpo_loss_backward(&saved2, None).unwrap();
    assert_eq!(f32_bits(&unit), f32_bits(&third), "forward rerun");
    // An explicit cotangent scales the gradient.
    let d = Tensor::from_slice(engine(), &[-2.5f32], &[1]).unwrap();
    let scaled = grpo_loss_backward(&saved, Some(&d)).unwrap();
    let want: Vec<f64> = unit.to_f64().unwrap().iter().map(|g| -2.5 * g).collect();
    assert_close(
        "cotangent",
        &scaled.to_f64().unwrap(),
        &want,
        Tolerance::for_dtype(DType::F32),
    );
    // Masked tokens and the position past the completion: exact zeros.
    let g = unit.to_f64().unwrap();
    for b in 0..s.batch {
        for p in 0..s.positions {
            let zero = p == s.seq || !c.mask[b * s.seq + p];
            let row = &g[(b * s.positions + p) * s.vocab..][..s.vocab];
            assert_eq!(row.iter().all(|&v| v == 0.0), zero, "b {b} position {p}");
        }
    }
    // 16-bit gradients: the F32 gradient (the element pass) rounded once, stored directly by
    // the chunked pass (rows of whole chunks).
    for dtype in [DType::F16, DType::BF16] {
        let h = grpo_loss_backward_as(&saved, None, dtype).unwrap();
        common::assert_same_bits(
            &format!("{dtype}"),
            &h,
            &wgrad::cast::cast(&unit, dtype).unwrap(),
        );
    }
    assert!(matches!(
        grpo_loss_backward_as(&saved, None, DType::I32),
        Err(Error::UnsupportedDType { .. })
    ));
}

#[test]
fn empty_batches_and_completions() {
    let e = engine();
    for (batch, seq) in [(0usize, 4usize), (3, 0)] {
        let logits = Tensor::zeros(e, &[batch, seq + 1, 8], DType::F32).unwrap();
        let ids = Tensor::zeros(e, &[batch, seq], DType::I32).unwrap();
        let adv = Tensor::zeros(e, &[batch], DType::F32).unwrap();
        let loss_types = [
            GrpoLossType::Grpo,
            GrpoLossType::Dapo,
            GrpoLossType::DrGrpo {
                max_completion_length: 8,
            },
        ];
        for loss_type in loss_types {
            let o = GrpoOptions {
                loss_type,
                ..GrpoOptions::default()
            };
            let input = GrpoInputs {
                logits: &logits,
                completion_ids: &ids,
                advantages: &adv,
                old_logp: None,
                ref_logp: None,
                mask: None,
            };
            let (out, saved) = grpo_loss(&input, &o).unwrap();
            assert_eq!(out.loss.to_f64().unwrap(), vec![0.0]);
            assert_eq!(out.per_token.shape(), &[batch, seq]);
            let g = grpo_loss_backward(&saved, None).unwrap();
            assert_eq!(g.shape(), logits.shape());
            assert!(g.to_f64().unwrap().iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let s = Sizes {
        batch: 2,
        seq: 3,
        positions: 4,
        vocab: 5,
    };
    let c = case(60, s, DType::F32, 1.0);
    let u = upload(&c, DType::F32);
    let ok = inputs(&u, ALL);
    let o = GrpoOptions::default();
    let err = |i: &GrpoInputs, o: &GrpoOptions| grpo_loss(i, o).unwrap_err();
    let shape = |i: &GrpoInputs| matches!(err(i, &o), Error::ShapeMismatch { .. });
    let dtype = |i: &GrpoInputs| matches!(err(i, &o), Error::UnsupportedDType { .. });
    let invalid = |o: &GrpoOptions| matches!(err(&ok, o), Error::InvalidValue { .. });
    // Shapes: logits rank, positions, ids, advantages, old/ref, mask.
    let flat = u.logits.reshape(&[2 * 4, 5]).unwrap();
    assert!(shape(&GrpoInputs {
        logits: &flat,
        ..ok
    }));
    let long = Tensor::zeros(e, &[2, 6, 5], DType::F32).unwrap();
    assert!(shape(&GrpoInputs {
        logits: &long,
        ..ok
    }));
    let adv3 = Tensor::zeros(e, &[3], DType::F32).unwrap();
    assert!(shape(&GrpoInputs {
        advantages: &adv3,
        ..ok
    }));
    let wrong = Tensor::zeros(e, &[2, 4], DType::F32).unwrap();
    assert!(shape(&GrpoInputs {
        old_logp: Some(&wrong),
        ..ok
    }));
    assert!(shape(&GrpoInputs {
        ref_logp: Some(&wrong),
        ..ok
    }));
    let wrong_mask = Tensor::zeros(e, &[2, 4], DType::I32).unwrap();
    assert!(shape(&GrpoInputs {
        mask: Some(&wrong_mask),
        ..ok
    }));
    // Dtypes.
    let int_logits = Tensor::zeros(e, &[2, 4, 5], DType::I32).unwrap();
    assert!(dtype(&GrpoInputs {
        logits: &int_logits,
        ..ok
    }));
    let float_ids = Tensor::zeros(e, &[2, 3], DType::F32).unwrap();
    assert!(dtype(&GrpoInputs {
        completion_ids: &float_ids,
        ..ok
    }));
    let half_adv = Tensor::zeros(e, &[2], DType::BF16).unwrap();
    assert!(dtype(&GrpoInputs {
        advantages: &half_adv,
        ..ok
    }));
    let float_mask = Tensor::zeros(e, &[2, 3], DType::F32).unwrap();
    assert!(dtype(&GrpoInputs {
        mask: Some(&float_mask),
        ..ok
    }));
    // Scalars.
    for bad in [
        GrpoOptions {
            temperature: 0.0,
            ..o
        },
        GrpoOptions {
            temperature: f64::NAN,
            ..o
        },
        GrpoOptions { beta: -0.1, ..o },
        GrpoOptions { eps_low: 1.0, ..o },
        GrpoOptions {
            eps_high: f64::INFINITY,
            ..o
        },
        GrpoOptions {
            loss_type: GrpoLossType::DrGrpo {
                max_completion_length: 0,
            },
            ..o
        },
    ] {
        assert!(invalid(&bad), "{bad:?}");
    }
    let no_ref = GrpoInputs {
        ref_logp: None,
        ..ok
    };
    assert!(matches!(
        err(&no_ref, &GrpoOptions { beta: 0.1, ..o }),
        Error::InvalidValue { .. }
    ));
    // Ids out of range.
    for (v, want_bounds) in [(5, true), (-1, false)] {
        let mut ids = c.ids.clone();
        ids[4] = v;
        let bad_ids = Tensor::from_slice(e, &ids, &[2, 3]).unwrap();
        let got = err(
            &GrpoInputs {
                completion_ids: &bad_ids,
                ..ok
            },
            &o,
        );
        match (got, want_bounds) {
            (Error::OutOfBounds { got: 5, max: 4, .. }, true) => {}
            (Error::InvalidValue { .. }, false) => {}
            (other, _) => panic!("id {v}: {other:?}"),
        }
    }
    // Unchecked, an out-of-range id counts as masked (no out-of-bounds read).
    let mut ids = c.ids.clone();
    ids[4] = 1 << 30;
    let far = Tensor::from_slice(e, &ids, &[2, 3]).unwrap();
    let unchecked = GrpoOptions {
        check_ids: false,
        ..o
    };
    let (out, saved) = grpo_loss(
        &GrpoInputs {
            completion_ids: &far,
            ..ok
        },
        &unchecked,
    )
    .unwrap();
    assert_eq!(out.per_token.to_f64().unwrap()[4], 0.0);
    let g = grpo_loss_backward(&saved, None).unwrap().to_f64().unwrap();
    let row = (4 / s.seq * s.positions + 4 % s.seq) * s.vocab;
    assert!(g[row..row + s.vocab].iter().all(|&v| v == 0.0));
    // Cotangent.
    let (_, saved) = grpo_loss(&ok, &o).unwrap();
    let two = Tensor::zeros(e, &[2], DType::F32).unwrap();
    assert!(matches!(
        grpo_loss_backward(&saved, Some(&two)),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// `fused_linear_grpo_loss` on a head `x [B, L, H]`, `W [V, H]`, bias against the reference on
/// the materialized logits `x·Wᵀ + b` (then dx = dlogits·W, dW = dlogitsᵀ·x, dbias = Σ
/// dlogits): every dtype of the head, each normalization, temperature 0.7, β, a mask, chunks
/// of 1 row and of every row; reruns bit-identical; gradients in the head's dtypes.
#[test]
fn fused_linear_head_matches_the_reference() {
    use wgrad::fused_linear::{Chunking, LinearHead};
    use wgrad::grpo::{GrpoTokens, fused_linear_grpo_loss, fused_linear_grpo_loss_backward};
    use wgrad::reference::fused_linear::{linear, linear_backward};
    let (b, l, h, v) = (2usize, 5usize, 12usize, 41usize);
    let s = Sizes {
        batch: b,
        seq: l,
        positions: l,
        vocab: v,
    };
    let e = engine();
    for dtype in DType::FLOATS {
        let mut rng = Rng::new(70);
        let x = stored(&rng.vec(b * l * h, -1.0, 1.0), dtype);
        let w = stored(&rng.vec(v * h, -0.8, 0.8), dtype);
        let bias = stored(&rng.vec(v, -0.3, 0.3), dtype);
        let logits = linear(&x, &w, Some(&bias), b * l, h, v);
        let mut c = case(71, s, DType::F32, 0.7);
        c.logits = logits;
        // Old / reference log-probabilities near the head's own.
        for (r, lp) in own_logp(&c, 0.7).into_iter().enumerate() {
            c.old[r] = stored(&[lp + rng.uniform(-0.6, 0.6)], DType::F32)[0];
            c.reference[r] = stored(&[lp + rng.uniform(-0.6, 0.6)], DType::F32)[0];
        }
        let u = upload(&c, DType::F32);
        let (xt, wt, bt) = (
            tensor_from_f64(e, &x, &[b, l, h], dtype),
            tensor_from_f64(e, &w, &[v, h], dtype),
            tensor_from_f64(e, &bias, &[v], dtype),
        );
        let head = LinearHead {
            input: &xt,
            weight: &wt,
            bias: Some(&bt),
        };
        let gpu_tokens = GrpoTokens {
            completion_ids: &u.ids,
            advantages: &u.advantages,
            old_logp: Some(&u.old),
            ref_logp: Some(&u.reference),
            mask: Some(&u.mask),
        };
        for loss_type in [GrpoLossType::Grpo, GrpoLossType::Dapo] {
            let o = GrpoOptions {
                temperature: 0.7,
                beta: 0.1,
                loss_type,
                ..GrpoOptions::default()
            };
            let set = settings(&o);
            let tok = tokens(&c, ALL);
            let want = reference::forward(&c.logits, s, &tok, &set);
            let dlogits = reference::backward(&c.logits, s, &tok, &set, 1.0);
            let want_grads = linear_backward(&x, &w, &dlogits, b * l, h, v);
            let (dx, dw, db) = (want_grads.input, want_grads.weight, want_grads.bias);
            let tol = Tolerance::for_dtype(DType::F32);
            // Chunks of 1 and 3 rows (the last one shorter) and all rows.
            for chunk in [Some(1), Some(3), None] {
                let chunking = Chunking {
                    chunk_rows: chunk,
                    memory_budget: None,
                    tensor_cores: false,
                    tensor_core_gradients: false,
                    ..Chunking::default()
                };
                let (out, saved) = fused_linear_grpo_loss(head, &gpu_tokens, &o, chunking).unwrap();
                let g = fused_linear_grpo_loss_backward(&saved, None).unwrap();
                let what = format!("{dtype} {loss_type:?} chunk {chunk:?}");
                assert_close(&what, &out.loss.to_f64().unwrap(), &[want.loss], tol);
                assert_close(
                    &what,
                    &out.per_token.to_f64().unwrap(),
                    &want.per_token,
                    tol,
                );
                assert_close(&what, &out.kl.to_f64().unwrap(), &want.kl, tol);
                assert_close(&format!("{what} dx"), &g.input.to_f64().unwrap(), &dx, tol);
                assert_close(&format!("{what} dW"), &g.weight.to_f64().unwrap(), &dw, tol);
                let gb = g.bias.expect("bias gradient").to_f64().unwrap();
                assert_close(&format!("{what} dbias"), &gb, &db, tol);
                if chunk.is_none() {
                    let (_, again) =
                        fused_linear_grpo_loss(head, &gpu_tokens, &o, chunking).unwrap();
                    let g2 = fused_linear_grpo_loss_backward(&again, None).unwrap();
                    assert_eq!(f32_bits(&g.weight), f32_bits(&g2.weight), "{what} rerun");
                    // The forward's gradients times an explicit cotangent; a second backward
                    // of the same context gives the same bits.
                    let d = Tensor::from_slice(e, &[-2.5f32], &[1]).unwrap();
                    let scaled = fused_linear_grpo_loss_backward(&again, Some(&d)).unwrap();
                    let times = |t: &Tensor| -> Vec<f64> {
                        t.to_f64().unwrap().iter().map(|v| -2.5 * v).collect()
                    };
                    assert_close(
                        &format!("{what} dx, d_loss -2.5"),
                        &scaled.input.to_f64().unwrap(),
                        &times(&g.input),
                        tol,
                    );
                    assert_close(
                        &format!("{what} dW, d_loss -2.5"),
                        &scaled.weight.to_f64().unwrap(),
                        &times(&g.weight),
                        tol,
                    );
                    let g3 = fused_linear_grpo_loss_backward(&again, None).unwrap();
                    assert_eq!(
                        f32_bits(&g2.input),
                        f32_bits(&g3.input),
                        "{what} backward twice"
                    );
                }
            }
            // Gradients in the head's dtypes (`Chunking::head_dtype_gradients`, blocks of 8
            // of the 41 columns; then with `Chunking::block_statistics`, the per-token
            // cotangents formed once after the statistics pass): each value the reference's
            // rounded once to the dtype (one unit), the bias gradient F32.
            for block_statistics in [false, true] {
                let chunking = Chunking {
                    chunk_rows: Some(3),
                    vocab_block: Some(8),
                    head_dtype_gradients: true,
                    block_statistics,
                    ..Chunking::default()
                };
                let (out, saved) = fused_linear_grpo_loss(head, &gpu_tokens, &o, chunking).unwrap();
                let g = fused_linear_grpo_loss_backward(&saved, None).unwrap();
                let what = format!(
                    "{dtype} {loss_type:?} head dtypes, block statistics {block_statistics}"
                );
                assert_close(&what, &out.loss.to_f64().unwrap(), &[want.loss], tol);
                let rounded = common::rounded_tolerance(dtype, 1.0);
                for (name, got, want) in [("dx", &g.input, &dx), ("dW", &g.weight, &dw)] {
                    assert_eq!(got.dtype(), dtype, "{what} {name} dtype");
                    assert_close(
                        &format!("{what} {name}"),
                        &got.to_f64().unwrap(),
                        &stored(want, dtype),
                        rounded,
                    );
                }
                let gb = g.bias.expect("bias gradient");
                assert_eq!(gb.dtype(), DType::F32, "{what} dbias dtype");
                assert_close(&format!("{what} dbias"), &gb.to_f64().unwrap(), &db, tol);
            }
        }
    }
    // A head that is not [B, L, H].
    let flat = Tensor::zeros(e, &[10, 12], DType::F32).unwrap();
    let w = Tensor::zeros(e, &[41, 12], DType::F32).unwrap();
    let ids = Tensor::zeros(e, &[2, 5], DType::I32).unwrap();
    let adv = Tensor::zeros(e, &[2], DType::F32).unwrap();
    let tokens = GrpoTokens {
        completion_ids: &ids,
        advantages: &adv,
        old_logp: None,
        ref_logp: None,
        mask: None,
    };
    let head = LinearHead {
        input: &flat,
        weight: &w,
        bias: None,
    };
    assert!(matches!(
        fused_linear_grpo_loss(head, &tokens, &GrpoOptions::default(), Chunking::default()),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// The unit-cotangent backward of the fused head returns the gradients its forward formed (the
/// same buffers, no new memory); an explicit cotangent makes fresh scaled tensors.
#[test]
fn fused_linear_unit_backward_allocates_nothing() {
    use wgrad::fused_linear::{Chunking, LinearHead};
    use wgrad::grpo::{GrpoTokens, fused_linear_grpo_loss, fused_linear_grpo_loss_backward};
    let e = common::private_engine();
    let mut rng = Rng::new(90);
    let (b, l, h, v) = (2usize, 3usize, 8usize, 16usize);
    let x = tensor_from_f64(&e, &rng.vec(b * l * h, -1.0, 1.0), &[b, l, h], DType::F32);
    let w = tensor_from_f64(&e, &rng.vec(v * h, -1.0, 1.0), &[v, h], DType::F32);
    let ids = Tensor::from_slice(&e, &[1i32, 5, 7, 0, 15, 3], &[b, l]).unwrap();
    let adv = Tensor::from_slice(&e, &[0.5f32, -1.0], &[b]).unwrap();
    let head = LinearHead {
        input: &x,
        weight: &w,
        bias: None,
    };
    let tokens = GrpoTokens {
        completion_ids: &ids,
        advantages: &adv,
        old_logp: None,
        ref_logp: None,
        mask: None,
    };
    let (_, saved) =
        fused_linear_grpo_loss(head, &tokens, &GrpoOptions::default(), Chunking::default())
            .unwrap();
    e.reset_peak();
    let live = e.memory().live_bytes;
    let g = fused_linear_grpo_loss_backward(&saved, None).unwrap();
    assert_eq!(e.memory().peak_bytes, live, "unit backward allocated");
    let d = Tensor::from_slice(&e, &[2.0f32], &[1]).unwrap();
    let scaled = fused_linear_grpo_loss_backward(&saved, Some(&d)).unwrap();
    assert!(
        e.memory().peak_bytes > live,
        "a scaled backward makes new tensors"
    );
    let twice: Vec<u32> = f32_bits(&g.weight)
        .iter()
        .map(|&u| (f32::from_bits(u) * 2.0).to_bits())
        .collect();
    assert_eq!(f32_bits(&scaled.weight), twice, "times 2 is exact");
}
