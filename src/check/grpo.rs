//! Checks of the GRPO token loss (`crate::grpo`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "grpo_loss",
        kernels: &["grpo"],
        run: check_grpo,
    }]
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
                let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = z.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
                z[ids[row] as usize] - lse
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
