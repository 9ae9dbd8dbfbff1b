//! Checks of the GRPO token loss (`crate::grpo`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "grpo_loss",
            kernels: &["grpo"],
            run: check_grpo,
        },
        OperatorCheck {
            name: "fused_linear_grpo_loss",
            kernels: &["grpo", "fused_linear", "matmul", "loss"],
            run: check_fused_grpo,
        },
    ]
}

/// The GRPO loss on a fused head (`fused_linear_grpo_loss`) against the reference on the
/// materialized logits in every storage dtype of the head: B 2, L 4, H 10, V 33, T 0.8,
/// β 0.05, old and reference log-probabilities, a mask, GRPO normalization, chunks of 3 rows;
/// loss, per-token losses, dx, dW, dbias.
fn check_fused_grpo(engine: &Engine) -> Result<Vec<Case>> {
    use crate::fused_linear::{Chunking, LinearHead};
    use crate::grpo::{
        GrpoLossType, GrpoOptions, GrpoTokens, fused_linear_grpo_loss,
        fused_linear_grpo_loss_backward,
    };
    use crate::reference::fused_linear::{linear, linear_backward};
    use crate::{Tensor, reference::grpo as r};
    let (b, l, h, v, temp) = (2usize, 4usize, 10usize, 33usize, 0.8);
    let s = r::Sizes {
        batch: b,
        seq: l,
        positions: l,
        vocab: v,
    };
    let mut rng = Rng::new(10);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (x, xs) = tensor_from_f64(engine, &rng.vec(b * l * h, -1.0, 1.0), &[b, l, h], dtype)?;
        let (w, ws) = tensor_from_f64(engine, &rng.vec(v * h, -0.8, 0.8), &[v, h], dtype)?;
        let (bias, bs) = tensor_from_f64(engine, &rng.vec(v, -0.3, 0.3), &[v], dtype)?;
        let logits = linear(&xs, &ws, Some(&bs), b * l, h, v);
        let ids: Vec<i32> = (0..b * l)
            .map(|_| (rng.next_f64() * v as f64) as i32)
            .collect();
        let mask: Vec<bool> = (0..b * l).map(|i| i % 4 != 2).collect();
        let (adv, adv_s) = tensor_from_f64(engine, &rng.vec(b, -1.5, 1.5), &[b], DType::F32)?;
        let near = |rng: &mut Rng| rng.vec(b * l, -4.0, -2.5);
        let (old, old_s) = tensor_from_f64(engine, &near(&mut rng), &[b, l], DType::F32)?;
        let (refp, ref_s) = tensor_from_f64(engine, &near(&mut rng), &[b, l], DType::F32)?;
        let ids_t = Tensor::from_slice(engine, &ids, &[b, l])?;
        let mask_words: Vec<u32> = mask.iter().map(|&m| u32::from(m)).collect();
        let mask_t = Tensor::from_slice(engine, &mask_words, &[b, l])?;
        let options = GrpoOptions {
            temperature: temp,
            beta: 0.05,
            loss_type: GrpoLossType::Grpo,
            ..GrpoOptions::default()
        };
        let head = LinearHead {
            input: &x,
            weight: &w,
            bias: Some(&bias),
        };
        let tokens = GrpoTokens {
            completion_ids: &ids_t,
            advantages: &adv,
            old_logp: Some(&old),
            ref_logp: Some(&refp),
            mask: Some(&mask_t),
        };
        let chunking = Chunking {
            chunk_rows: Some(3),
            memory_budget: None,
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        };
        let (out, saved) = fused_linear_grpo_loss(head, &tokens, &options, chunking)?;
        let g = fused_linear_grpo_loss_backward(&saved, None)?;
        let tok = r::Tokens {
            ids: &ids,
            advantages: &adv_s,
            old_logp: Some(&old_s),
            ref_logp: Some(&ref_s),
            mask: Some(&mask),
        };
        let set = r::Settings {
            temperature: temp,
            beta: 0.05,
            eps_low: options.eps_low,
            eps_high: options.eps_high,
            norm: r::Norm::Grpo,
        };
        let want = r::forward(&logits, s, &tok, &set);
        let dlogits = r::backward(&logits, s, &tok, &set, 1.0);
        let want_grads = linear_backward(&xs, &ws, &dlogits, b * l, h, v);
        let (dx, dw, db) = (want_grads.input, want_grads.weight, want_grads.bias);
        let tol = Tolerance::for_dtype(DType::F32);
        let label = |what: &str| format!("{what} {dtype} fused head");
        let gb = g
            .bias
            .as_ref()
            .map(|t| t.to_f64())
            .transpose()?
            .unwrap_or_default();
        cases.push(case(label("loss"), &out.loss.to_f64()?, &[want.loss], tol));
        cases.push(case(
            label("per_token"),
            &out.per_token.to_f64()?,
            &want.per_token,
            tol,
        ));
        cases.push(case(label("dx"), &g.input.to_f64()?, &dx, tol));
        cases.push(case(label("dW"), &g.weight.to_f64()?, &dw, tol));
        cases.push(case(label("dbias"), &gb, &db, tol));
    }
    Ok(cases)
}

/// Loss, per-token losses, KL estimates and d logits against the f64 reference in every
/// storage dtype of the logits: B 3, L 5, logits with L + 1 positions, V 300, temperature
/// 0.7, β 0.04, old and reference log-probabilities 0.6 around the tokens' own (clipping both
/// ways), every third token masked; each loss normalization.
fn check_grpo(engine: &Engine) -> Result<Vec<Case>> {
    use crate::grpo::{GrpoInputs, GrpoLossType, GrpoOptions, grpo_loss, grpo_loss_backward};
    use crate::{Tensor, reference::grpo as r};
    let s = r::Sizes {
        batch: 3,
        seq: 5,
        positions: 6,
        vocab: 300,
    };
    let rows = s.batch * s.seq;
    let mut rng = Rng::new(9);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (logits, ls) = tensor_from_f64(
            engine,
            &rng.vec(s.batch * s.positions * s.vocab, -3.0, 3.0),
            &[s.batch, s.positions, s.vocab],
            dtype,
        )?;
        let ids: Vec<i32> = (0..rows)
            .map(|_| (rng.next_f64() * s.vocab as f64) as i32)
            .collect();
        let mask: Vec<bool> = (0..rows).map(|r| r % 3 != 1).collect();
        let (adv, adv_s) =
            tensor_from_f64(engine, &rng.vec(s.batch, -1.5, 1.5), &[s.batch], DType::F32)?;
        // Old and reference log-probabilities near the tokens' own (under T = 0.7).
        let own: Vec<f64> = (0..rows)
            .map(|row| {
                let start = (row / s.seq * s.positions + row % s.seq) * s.vocab;
                let z: Vec<f64> = ls[start..start + s.vocab].iter().map(|x| x / 0.7).collect();
                reference::loss::log_softmax(&z, 1, s.vocab)[ids[row] as usize]
            })
            .collect();
        let near = |rng: &mut Rng| -> Vec<f64> {
            own.iter().map(|lp| lp + rng.uniform(-0.6, 0.6)).collect()
        };
        let (old, old_s) = tensor_from_f64(engine, &near(&mut rng), &[s.batch, s.seq], DType::F32)?;
        let (refp, ref_s) =
            tensor_from_f64(engine, &near(&mut rng), &[s.batch, s.seq], DType::F32)?;
        let ids_t = Tensor::from_slice(engine, &ids, &[s.batch, s.seq])?;
        let mask_words: Vec<u32> = mask.iter().map(|&m| u32::from(m)).collect();
        let mask_t = Tensor::from_slice(engine, &mask_words, &[s.batch, s.seq])?;
        let inputs = GrpoInputs {
            logits: &logits,
            completion_ids: &ids_t,
            advantages: &adv,
            old_logp: Some(&old),
            ref_logp: Some(&refp),
            mask: Some(&mask_t),
        };
        let tokens = r::Tokens {
            ids: &ids,
            advantages: &adv_s,
            old_logp: Some(&old_s),
            ref_logp: Some(&ref_s),
            mask: Some(&mask),
        };
        for (loss_type, norm) in [
            (GrpoLossType::Grpo, r::Norm::Grpo),
            (GrpoLossType::Dapo, r::Norm::Bnpo),
            (
                GrpoLossType::DrGrpo {
                    max_completion_length: 8,
                },
                r::Norm::DrGrpo(8),
            ),
        ] {
            let options = GrpoOptions {
                temperature: 0.7,
                beta: 0.04,
                loss_type,
                ..GrpoOptions::default()
            };
            let set = r::Settings {
                temperature: 0.7,
                beta: 0.04,
                eps_low: options.eps_low,
                eps_high: options.eps_high,
                norm,
            };
            let (out, saved) = grpo_loss(&inputs, &options)?;
            let grad = grpo_loss_backward(&saved, None)?;
            let want = r::forward(&ls, s, &tokens, &set);
            let dwant = r::backward(&ls, s, &tokens, &set, 1.0);
            let tol = Tolerance::for_dtype(DType::F32);
            let label = |what: &str| format!("{what} {dtype} {loss_type:?}");
            cases.push(case(label("loss"), &out.loss.to_f64()?, &[want.loss], tol));
            cases.push(case(
                label("per_token"),
                &out.per_token.to_f64()?,
                &want.per_token,
                tol,
            ));
            cases.push(case(label("kl"), &out.kl.to_f64()?, &want.kl, tol));
            cases.push(case(label("d_logits"), &grad.to_f64()?, &dwant, tol));
        }
    }
    Ok(cases)
}
