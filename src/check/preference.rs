//! Checks of the paired preference losses (`crate::preference`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "preference_loss",
            kernels: &["preference", "fused_linear", "matmul", "loss"],
            run: check_preference,
        },
        OperatorCheck {
            name: "kto_loss",
            kernels: &["preference", "fused_linear", "matmul", "loss"],
            run: check_kto,
        },
    ]
}

/// KTO on a fused head against the f64 reference in every storage dtype: 5 sequences (3
/// desirable) of 6 tokens (a fifth ignored), H 10, V 23, reference log-probabilities and a
/// reference point 0.3, β 0.5; loss, π, dx, dW.
fn check_kto(engine: &Engine) -> Result<Vec<Case>> {
    use crate::fused_linear::LinearHead;
    use crate::preference::{
        PreferenceLoss, PreferenceOptions, kto_loss, preference_loss_backward,
    };
    use crate::{Tensor, reference::preference as r};
    let n = 5usize;
    let s = r::Sizes {
        pairs: 0,
        tokens: 6,
        h: 10,
        v: 23,
    };
    let desirable = [true, false, true, true, false];
    let labels: Vec<u32> = desirable.iter().map(|&d| u32::from(d)).collect();
    let mut rng = Rng::new(14);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (x, xs) = tensor_from_f64(
            engine,
            &rng.vec(n * s.tokens * s.h, -1.0, 1.0),
            &[n, s.tokens, s.h],
            dtype,
        )?;
        let (w, ws) = tensor_from_f64(engine, &rng.vec(s.v * s.h, -0.5, 0.5), &[s.v, s.h], dtype)?;
        let targets: Vec<i32> = (0..n * s.tokens)
            .map(|i| {
                if i % 5 == 3 {
                    -100
                } else {
                    (rng.next_f64() * s.v as f64) as i32
                }
            })
            .collect();
        let t = Tensor::from_slice(engine, &targets, &[n, s.tokens])?;
        let lt = Tensor::from_slice(engine, &labels, &[n])?;
        let (refs, refs_s) = tensor_from_f64(engine, &rng.vec(n, -20.0, -14.0), &[n], DType::F32)?;
        let z = Tensor::from_slice(engine, &[0.3f32], &[1])?;
        let mut o = PreferenceOptions::new(PreferenceLoss::Kto);
        o.beta = 0.5;
        let head = LinearHead {
            input: &x,
            weight: &w,
            bias: None,
        };
        let (out, saved) = kto_loss(head, &t, &lt, Some(&refs), Some(&z), &o)?;
        let g = preference_loss_backward(&saved, None)?;
        let inputs = r::Inputs {
            x: &xs,
            w: &ws,
            bias: None,
            targets: &targets,
            reference: None,
        };
        let set = r::Settings {
            margin: r::Margin::Cpo,
            beta: 0.5,
            smoothing: 0.0,
            alpha: 0.0,
            average: false,
            ignore_index: -100,
        };
        let z0 = f64::from(0.3f32);
        let (loss, logps) = r::kto_forward(s, n, &inputs, &set, &desirable, Some(&refs_s), z0);
        let (dx, dw, _) = r::kto_backward(s, n, &inputs, &set, &desirable, Some(&refs_s), z0, 1.0);
        let tol = Tolerance::for_dtype(DType::F32);
        let label = |what: &str| format!("{what} {dtype} kto");
        cases.push(case(label("loss"), &out.loss.to_f64()?, &[loss], tol));
        cases.push(case(label("logps"), &out.logps.to_f64()?, &logps, tol));
        cases.push(case(label("dx"), &g.input.to_f64()?, &dx, tol));
        cases.push(case(label("dW"), &g.weight.to_f64()?, &dw, tol));
    }
    Ok(cases)
}

/// DPO (with reference log-probabilities), CPO (label smoothing and an NLL term), SimPO and
/// ORPO on a fused head against the f64 reference (materialized logits) in every storage
/// dtype: B 2 pairs of 5 tokens (a quarter ignored), H 12, V 29, a bias; loss, NLL, sequence
/// log-probabilities, dx, dW, dbias.
fn check_preference(engine: &Engine) -> Result<Vec<Case>> {
    use crate::fused_linear::LinearHead;
    use crate::preference::{
        PreferenceLoss, PreferenceOptions, PreferenceReference, preference_loss,
        preference_loss_backward,
    };
    use crate::{Tensor, reference::preference as r};
    let s = r::Sizes {
        pairs: 2,
        tokens: 5,
        h: 12,
        v: 29,
    };
    let rows = 2 * s.pairs * s.tokens;
    let mut rng = Rng::new(13);
    let mut cases = Vec::new();
    let mut cpo = PreferenceOptions::new(PreferenceLoss::Cpo);
    cpo.label_smoothing = 0.1;
    cpo.nll_weight = 0.5;
    let losses = [
        (PreferenceOptions::new(PreferenceLoss::Dpo), r::Margin::Dpo),
        (cpo, r::Margin::Cpo),
        (
            PreferenceOptions::new(PreferenceLoss::SimPo { gamma: 0.5 }),
            r::Margin::SimPo(0.5),
        ),
        (
            PreferenceOptions::new(PreferenceLoss::Orpo),
            r::Margin::Orpo,
        ),
    ];
    for dtype in DType::FLOATS {
        let (x, xs) = tensor_from_f64(
            engine,
            &rng.vec(rows * s.h, -1.0, 1.0),
            &[2 * s.pairs, s.tokens, s.h],
            dtype,
        )?;
        let (w, ws) = tensor_from_f64(engine, &rng.vec(s.v * s.h, -0.5, 0.5), &[s.v, s.h], dtype)?;
        let (b, bs) = tensor_from_f64(engine, &rng.vec(s.v, -0.2, 0.2), &[s.v], dtype)?;
        let targets: Vec<i32> = (0..rows)
            .map(|_| {
                if rng.next_f64() < 0.25 {
                    -100
                } else {
                    (rng.next_f64() * s.v as f64) as i32
                }
            })
            .collect();
        let t = Tensor::from_slice(engine, &targets, &[2 * s.pairs, s.tokens])?;
        let (rc, rcs) = tensor_from_f64(
            engine,
            &rng.vec(s.pairs, -12.0, -8.0),
            &[s.pairs],
            DType::F32,
        )?;
        let (rr, rrs) = tensor_from_f64(
            engine,
            &rng.vec(s.pairs, -12.0, -8.0),
            &[s.pairs],
            DType::F32,
        )?;
        for (o, margin) in &losses {
            let is_dpo = o.loss == PreferenceLoss::Dpo;
            let head = LinearHead {
                input: &x,
                weight: &w,
                bias: Some(&b),
            };
            let (out, saved) = preference_loss(
                head,
                &t,
                is_dpo.then_some(PreferenceReference::LogProbs {
                    chosen: &rc,
                    rejected: &rr,
                }),
                o,
            )?;
            let g = preference_loss_backward(&saved, None)?;
            let inputs = r::Inputs {
                x: &xs,
                w: &ws,
                bias: Some(&bs),
                targets: &targets,
                reference: is_dpo.then_some((rcs.as_slice(), rrs.as_slice())),
            };
            let set = r::Settings {
                margin: *margin,
                beta: f64::from(o.beta),
                smoothing: f64::from(o.label_smoothing),
                alpha: f64::from(o.nll_weight),
                average: o.average_log_prob,
                ignore_index: o.ignore_index,
            };
            let want = r::forward(s, &inputs, &set);
            let (dx, dw, db) = r::backward(s, &inputs, &set, 1.0);
            let tol = Tolerance::for_dtype(DType::F32);
            let label = |what: &str| format!("{what} {dtype} {:?}", o.loss);
            let bias_grad = g
                .bias
                .as_ref()
                .map(|t| t.to_f64())
                .transpose()?
                .unwrap_or_default();
            cases.push(case(label("loss"), &out.loss.to_f64()?, &[want.loss], tol));
            cases.push(case(label("nll"), &out.nll.to_f64()?, &[want.nll], tol));
            cases.push(case(label("logps"), &out.logps.to_f64()?, &want.logps, tol));
            cases.push(case(label("dx"), &g.input.to_f64()?, &dx, tol));
            cases.push(case(label("dW"), &g.weight.to_f64()?, &dw, tol));
            cases.push(case(label("dbias"), &bias_grad, &db, tol));
        }
    }
    Ok(cases)
}
