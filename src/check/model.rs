//! Check of the transformer of `crate::model`: one training step of a tiny 2-layer model (loss
//! and the gradient of every parameter) against `crate::reference::model`.

use super::*;
use crate::model::{Batch, Model, ModelConfig};

/// This module's checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "transformer_step",
        kernels: &["matmul", "norm", "rope", "attention", "activation", "loss"],
        run: check_transformer_step,
    }]
}

/// A 2-layer model (d_model 16, 2 heads of 8, ffn 32, vocab 32) with its norm weights drawn
/// in [0.5, 1.5), batch 2 × seq 8: loss and every parameter gradient against the f64
/// reference under the F32 policy.
fn check_transformer_step(engine: &Engine) -> Result<Vec<Case>> {
    let config = ModelConfig {
        vocab: 32,
        layers: 2,
        d_model: 16,
        heads: 2,
        head_dim: 8,
        ffn: 32,
        seq_len: 8,
        seed: 5,
        ..ModelConfig::default()
    };
    let mut rng = Rng::new(6);
    let host: Vec<Vec<f32>> = config
        .initial_parameters()
        .into_iter()
        .zip(config.parameter_shapes())
        .map(|(p, (_, shape))| {
            if shape.len() == 1 {
                p.iter().map(|_| rng.uniform(0.5, 1.5) as f32).collect()
            } else {
                p
            }
        })
        .collect();
    let tensors = host
        .iter()
        .zip(config.parameter_shapes())
        .map(|(p, (_, shape))| crate::Tensor::from_slice(engine, p, &shape))
        .collect::<Result<Vec<_>>>()?;
    let model = Model::from_parameters(engine, config, tensors)?;
    let (batch, seq) = (2, 8);
    let mut ids = |n: usize| -> Vec<i32> {
        (0..n)
            .map(|_| (rng.next_u64() % config.vocab as u64) as i32)
            .collect()
    };
    let tokens = ids(batch * seq);
    let targets = ids(batch * seq);
    let b = Batch::new(engine, &tokens, &targets, batch, seq, config.vocab)?;
    let (loss, tape) = model.forward(&b)?;
    let grads = model.backward(&tape)?;

    let p64: Vec<Vec<f64>> = host
        .iter()
        .map(|p| p.iter().map(|&v| f64::from(v)).collect())
        .collect();
    let fwd = reference::model::forward(&config, &p64, &tokens, &targets, batch)?;
    let want = reference::model::backward(&config, &p64, &fwd)?;
    let tol = Tolerance::for_dtype(DType::F32);
    let mut cases = vec![case(
        format!("loss 2 layers d16 batch {batch} seq {seq}"),
        &loss.to_f64()?,
        &[fwd.loss],
        tol,
    )];
    for ((g, w), (name, _)) in grads.iter().zip(&want).zip(config.parameter_shapes()) {
        cases.push(case(format!("d {name}"), &g.to_f64()?, w, tol));
    }
    Ok(cases)
}
