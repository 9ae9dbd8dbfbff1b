//! The transformer of `wgrad::model` against its f64 reference (`wgrad::reference::model`):
//! one step's loss and every parameter gradient; the reference backward against finite
//! differences; convergence of a few AdamW steps on a repetitive corpus with bit-identical
//! reruns; bad configs and batches.

mod common;

use common::{Rng, engine};
use wgrad::gradcheck::{Tolerance, compare, numerical_gradient};
use wgrad::model::{Batch, Model, ModelConfig, Vocabulary, sample_windows};
use wgrad::reference::model as reference;
use wgrad::{DType, Error, Tensor};

/// 2 layers, d_model 16, 2 heads of 8, ffn 32, seq 8, vocab 32.
fn tiny() -> ModelConfig {
    ModelConfig {
        vocab: 32,
        layers: 2,
        d_model: 16,
        heads: 2,
        head_dim: 8,
        ffn: 32,
        seq_len: 8,
        rope_base: 10_000.0,
        eps: 1e-5,
        seed: 7,
    }
}

/// The initialization with the norm weights moved off 1 (so their gradients are exercised
/// away from the identity), as host f32 values.
fn parameters(config: &ModelConfig, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    config
        .initial_parameters()
        .into_iter()
        .map(|p| {
            if p.iter().all(|&v| v == 1.0) {
                p.iter().map(|_| rng.uniform(0.5, 1.5) as f32).collect()
            } else {
                p
            }
        })
        .collect()
}

fn upload(config: &ModelConfig, host: &[Vec<f32>]) -> Model {
    let e = engine();
    let tensors = host
        .iter()
        .zip(config.parameter_shapes())
        .map(|(v, (_, shape))| Tensor::from_slice(e, v, &shape).unwrap())
        .collect();
    Model::from_parameters(e, *config, tensors).unwrap()
}

fn ids(seed: u64, n: usize, vocab: usize) -> Vec<i32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.next_u64() % vocab as u64) as i32).collect()
}

fn widen(host: &[Vec<f32>]) -> Vec<Vec<f64>> {
    host.iter()
        .map(|p| p.iter().map(|&v| f64::from(v)).collect())
        .collect()
}

#[test]
fn one_step_matches_the_f64_reference() {
    let config = tiny();
    let host = parameters(&config, 11);
    let model = upload(&config, &host);
    let (batch, seq) = (2, 8);
    let tokens = ids(1, batch * seq, config.vocab);
    let targets = ids(2, batch * seq, config.vocab);
    let b = Batch::new(engine(), &tokens, &targets, batch, seq, config.vocab).unwrap();
    let (loss, tape) = model.forward(&b).unwrap();
    let grads = model.backward(&tape).unwrap();

    let p64 = widen(&host);
    let fwd = reference::forward(&config, &p64, &tokens, &targets, batch).unwrap();
    let want = reference::backward(&config, &p64, &fwd).unwrap();
    // The plain F32 policy, for the loss and every gradient.
    let tol = Tolerance::for_dtype(DType::F32);
    let c = compare(&loss.to_f64().unwrap(), &[fwd.loss], tol);
    assert!(c.passed, "loss: {c}");
    assert_eq!(grads.len(), want.len());
    for ((g, w), (name, shape)) in grads.iter().zip(&want).zip(config.parameter_shapes()) {
        assert_eq!(g.shape(), shape.as_slice(), "{name}");
        let c = compare(&g.to_f64().unwrap(), w, tol);
        assert!(c.passed, "{name}: {c}");
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    // Smaller still: every parameter of a 1-layer model perturbed through the whole loss.
    let config = ModelConfig {
        vocab: 8,
        layers: 1,
        d_model: 4,
        heads: 1,
        head_dim: 8,
        ffn: 6,
        seq_len: 4,
        ..tiny()
    };
    let p64 = widen(&parameters(&config, 3));
    let (batch, seq) = (2, 3);
    let tokens = ids(4, batch * seq, config.vocab);
    let targets = ids(5, batch * seq, config.vocab);
    let fwd = reference::forward(&config, &p64, &tokens, &targets, batch).unwrap();
    let analytic = reference::backward(&config, &p64, &fwd).unwrap();
    for (i, (name, _)) in config.parameter_shapes().iter().enumerate() {
        let loss = |x: &[f64]| {
            let mut p = p64.clone();
            p[i] = x.to_vec();
            reference::forward(&config, &p, &tokens, &targets, batch)
                .unwrap()
                .loss
        };
        let numeric = numerical_gradient(loss, &p64[i], 1e-6);
        let c = compare(&analytic[i], &numeric, Tolerance::FINITE_DIFFERENCE);
        assert!(c.passed, "{name}: {c}");
    }
}
