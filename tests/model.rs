//! The transformer of `wgrad::model` against its f64 reference (`wgrad::reference::model`):
//! one step's loss and every parameter gradient; the reference backward against finite
//! differences; convergence of a few AdamW steps on a repetitive corpus with bit-identical
//! reruns; bad configs and batches.

mod common;

use common::{Rng, engine};
use wgrad::gradcheck::{Tolerance, compare, numerical_gradient};
use wgrad::model::{
    AdamWSettings, Batch, Model, ModelAdamW, ModelConfig, Vocabulary, sample_windows,
};
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
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as i32)
        .collect()
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

#[test]
fn a_second_step_gives_identical_bits() {
    let config = tiny();
    let model = upload(&config, &parameters(&config, 21));
    let (batch, seq) = (2, 5);
    let tokens = ids(6, batch * seq, config.vocab);
    let targets = ids(7, batch * seq, config.vocab);
    let run = || {
        let b = Batch::new(engine(), &tokens, &targets, batch, seq, config.vocab).unwrap();
        let (loss, tape) = model.forward(&b).unwrap();
        let grads = model.backward(&tape).unwrap();
        let mut bits = common::f32_bits(&loss);
        for g in &grads {
            bits.extend(common::f32_bits(g));
        }
        bits
    };
    assert_eq!(run(), run());
}

#[test]
fn shorter_sequences_and_logits_match_the_reference() {
    // seq 1 and a ragged seq below seq_len; logits of the inference path.
    let config = tiny();
    let host = parameters(&config, 31);
    let model = upload(&config, &host);
    let p64 = widen(&host);
    for (batch, seq) in [(1, 1), (3, 5)] {
        let tokens = ids(8 + seq as u64, batch * seq, config.vocab);
        let targets = ids(9 + seq as u64, batch * seq, config.vocab);
        let fwd = reference::forward(&config, &p64, &tokens, &targets, batch).unwrap();
        let logits = model.logits(&tokens, batch).unwrap();
        assert_eq!(logits.shape(), [batch * seq, config.vocab]);
        let c = compare(
            &logits.to_f64().unwrap(),
            &fwd.logits,
            Tolerance::for_dtype(DType::F32),
        );
        assert!(c.passed, "logits batch {batch} seq {seq}: {c}");
        let b = Batch::new(engine(), &tokens, &targets, batch, seq, config.vocab).unwrap();
        let (loss, tape) = model.forward(&b).unwrap();
        let c = compare(
            &loss.to_f64().unwrap(),
            &[fwd.loss],
            Tolerance::for_dtype(DType::F32),
        );
        assert!(c.passed, "loss batch {batch} seq {seq}: {c}");
        let want = reference::backward(&config, &p64, &fwd).unwrap();
        for ((g, w), (name, _)) in model
            .backward(&tape)
            .unwrap()
            .iter()
            .zip(&want)
            .zip(config.parameter_shapes())
        {
            let c = compare(&g.to_f64().unwrap(), w, Tolerance::for_dtype(DType::F32));
            assert!(c.passed, "{name} batch {batch} seq {seq}: {c}");
        }
    }
}

#[test]
fn ignored_targets_count_nowhere() {
    // Targets of −100 drop out of the mean and of every gradient.
    let config = tiny();
    let host = parameters(&config, 41);
    let model = upload(&config, &host);
    let (batch, seq) = (2, 4);
    let tokens = ids(10, batch * seq, config.vocab);
    let mut targets = ids(11, batch * seq, config.vocab);
    targets[1] = -100;
    targets[6] = -100;
    let b = Batch::new(engine(), &tokens, &targets, batch, seq, config.vocab).unwrap();
    let (loss, tape) = model.forward(&b).unwrap();
    let p64 = widen(&host);
    let fwd = reference::forward(&config, &p64, &tokens, &targets, batch).unwrap();
    let want = reference::backward(&config, &p64, &fwd).unwrap();
    let tol = Tolerance::for_dtype(DType::F32);
    assert!(compare(&loss.to_f64().unwrap(), &[fwd.loss], tol).passed);
    for (g, w) in model.backward(&tape).unwrap().iter().zip(&want) {
        let c = compare(&g.to_f64().unwrap(), w, tol);
        assert!(c.passed, "{c}");
    }
}

#[test]
fn bad_configs_batches_and_parameters_are_typed_errors() {
    let e = engine();
    let bad = |c: ModelConfig| Model::new(e, c).unwrap_err();
    let t = tiny();
    for c in [
        ModelConfig { vocab: 0, ..t },
        ModelConfig { layers: 0, ..t },
        ModelConfig { d_model: 0, ..t },
        ModelConfig { heads: 0, ..t },
        ModelConfig { head_dim: 4, ..t },
        ModelConfig { head_dim: 264, ..t },
        ModelConfig { ffn: 0, ..t },
        ModelConfig { seq_len: 0, ..t },
    ] {
        assert!(matches!(bad(c), Error::OutOfBounds { .. }), "{c:?}");
    }
    for c in [
        ModelConfig { head_dim: 12, ..t },
        ModelConfig {
            rope_base: 1.0,
            ..t
        },
        ModelConfig {
            rope_base: f64::NAN,
            ..t
        },
        ModelConfig { eps: 0.0, ..t },
        ModelConfig {
            eps: f32::INFINITY,
            ..t
        },
    ] {
        assert!(matches!(bad(c), Error::InvalidValue { .. }), "{c:?}");
    }

    let v = t.vocab;
    let ok = ids(1, 8, v);
    assert!(matches!(
        Batch::new(e, &ok, &ok, 0, 8, v).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        Batch::new(e, &ok, &ok, 2, 3, v).unwrap_err(),
        Error::LengthMismatch { .. }
    ));
    let mut high = ok.clone();
    high[3] = v as i32;
    assert!(matches!(
        Batch::new(e, &high, &ok, 1, 8, v).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        Batch::new(e, &ok, &high, 1, 8, v).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    let mut negative = ok.clone();
    negative[0] = -100; // ignored as a target, not a token
    assert!(Batch::new(e, &ok, &negative, 1, 8, v).is_ok());
    assert!(matches!(
        Batch::new(e, &negative, &ok, 1, 8, v).unwrap_err(),
        Error::OutOfBounds { .. }
    ));

    let model = Model::new(e, t).unwrap();
    // Longer than seq_len.
    let long = ids(2, 9, v);
    let b = Batch::new(e, &long, &long, 1, 9, v).unwrap();
    assert!(matches!(
        model.forward(&b).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        model.logits(&long, 1).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    // A batch built for a larger vocabulary.
    let wide = ids(3, 8, 2 * v);
    let b = Batch::new(e, &wide, &wide, 1, 8, 2 * v).unwrap();
    assert!(matches!(
        model.forward(&b).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        model.logits(&ok, 3).unwrap_err(),
        Error::LengthMismatch { .. }
    ));

    // Parameters: count, shape, dtype, engine.
    let params: Vec<Tensor> = model.parameters().into_iter().cloned().collect();
    let mut fewer = params.clone();
    fewer.pop();
    assert!(matches!(
        Model::from_parameters(e, t, fewer).unwrap_err(),
        Error::LengthMismatch { .. }
    ));
    let mut reshaped = params.clone();
    reshaped[7] = reshaped[7].reshape(&[t.d_model, t.ffn]).unwrap(); // gate is [ffn, d_model]
    assert!(matches!(
        Model::from_parameters(e, t, reshaped).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    let mut half = params.clone();
    half[1] = wgrad::cast::cast(&half[1], DType::BF16).unwrap();
    assert!(matches!(
        Model::from_parameters(e, t, half).unwrap_err(),
        Error::UnsupportedDType { .. }
    ));
    // Optimizer: settings and gradient lists.
    assert!(matches!(
        ModelAdamW::new(
            &model,
            AdamWSettings {
                lr: -1.0,
                ..AdamWSettings::default()
            }
        )
        .unwrap_err(),
        Error::InvalidValue { .. }
    ));
    assert!(matches!(
        ModelAdamW::new(
            &model,
            AdamWSettings {
                clip: Some(0.0),
                ..AdamWSettings::default()
            }
        )
        .unwrap_err(),
        Error::InvalidValue { .. }
    ));
    let mut optimizer = ModelAdamW::new(&model, AdamWSettings::default()).unwrap();
    let zeros: Vec<Tensor> = params
        .iter()
        .map(|p| Tensor::zeros(e, p.shape(), DType::F32).unwrap())
        .collect();
    assert!(matches!(
        optimizer.step(&zeros[1..]).unwrap_err(),
        Error::LengthMismatch { .. }
    ));
    let mut swapped = zeros.clone();
    swapped.swap(1, 2); // a [D] gradient where a [P, D] one belongs
    assert!(matches!(
        optimizer.step(&swapped).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    let other = common::private_engine();
    let mut foreign = params;
    foreign[0] = Tensor::zeros(&other, &[t.vocab, t.d_model], DType::F32).unwrap();
    assert!(matches!(
        Model::from_parameters(e, t, foreign).unwrap_err(),
        Error::EngineMismatch { .. }
    ));
}

#[test]
fn vocabulary_and_windows() {
    let text = b"abracadabra";
    let vocab = Vocabulary::from_text(text);
    assert_eq!(vocab.len(), 5);
    let ids = vocab.encode(text).unwrap();
    assert_eq!(ids[..4], [0, 1, 4, 0]);
    assert_eq!(vocab.decode(&ids), text);
    assert!(matches!(
        vocab.encode(b"z").unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    let (x, y) = sample_windows(&ids, 3, 4, &mut Rng::new(1)).unwrap();
    assert_eq!((x.len(), y.len()), (12, 12));
    for r in 0..3 {
        // Targets are the inputs shifted by one inside the stream.
        assert_eq!(x[r * 4 + 1..r * 4 + 4], y[r * 4..r * 4 + 3]);
    }
    assert!(matches!(
        sample_windows(&ids, 1, 11, &mut Rng::new(1)).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
}

/// Loss of each of `steps` AdamW steps (constant learning rate) on windows of a repeated
/// sentence, from a fresh model with `seed`.
fn train_curve(seed: u64, steps: usize, amsgrad: bool) -> Vec<f32> {
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(12);
    let vocab = Vocabulary::from_text(text.as_bytes());
    let stream = vocab.encode(text.as_bytes()).unwrap();
    let config = ModelConfig {
        vocab: vocab.len(),
        layers: 2,
        d_model: 32,
        heads: 2,
        head_dim: 16,
        ffn: 64,
        seq_len: 16,
        seed,
        ..ModelConfig::default()
    };
    let e = engine();
    let model = Model::new(e, config).unwrap();
    let settings = AdamWSettings {
        lr: 1e-2,
        amsgrad,
        ..AdamWSettings::default()
    };
    let mut optimizer = ModelAdamW::new(&model, settings).unwrap();
    let mut rng = Rng::new(seed + 1);
    let (batch, seq) = (4, 16);
    (0..steps)
        .map(|_| {
            let (x, y) = sample_windows(&stream, batch, seq, &mut rng).unwrap();
            let b = Batch::new(e, &x, &y, batch, seq, config.vocab).unwrap();
            let (loss, tape) = model.forward(&b).unwrap();
            let grads = model.backward(&tape).unwrap();
            optimizer.step(&grads).unwrap();
            loss.to_vec::<f32>().unwrap()[0]
        })
        .collect()
}

#[test]
fn adamw_steps_lower_the_loss_and_reruns_match_bit_for_bit() {
    let steps = 30;
    let curve = train_curve(3, steps, false);
    let start = curve[0];
    let end = curve[steps - 5..].iter().sum::<f32>() / 5.0;
    assert!(
        end < 0.3 * start,
        "loss {start} -> {end} (mean of the last 5 steps): not below 30% of the start; {curve:?}"
    );
    let again = train_curve(3, steps, false);
    let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&curve), bits(&again), "two runs with one seed");
}

#[test]
fn amsgrad_steps_lower_the_loss_and_differ_from_adamw() {
    let steps = 30;
    let curve = train_curve(3, steps, true);
    let start = curve[0];
    let end = curve[steps - 5..].iter().sum::<f32>() / 5.0;
    assert!(
        end < 0.3 * start,
        "AMSGrad loss {start} -> {end} (mean of the last 5 steps): not below 30% of the start"
    );
    // The running maximum changes the steps once a second moment shrinks.
    let plain = train_curve(3, steps, false);
    assert_ne!(curve, plain, "AMSGrad gave the plain AdamW curve");
}
