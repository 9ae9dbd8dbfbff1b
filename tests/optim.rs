//! Optimizers (AdamW with and without AMSGrad, SGD with momentum, dampening, Nesterov and
//! weight decay, both minimizing and maximizing), gradient clipping and the global gradient
//! norm against the f64 references of `wgrad::reference::optim`: several steps, bias
//! correction, weight decay, AMSGrad's running maximum where the second moment shrinks,
//! clipping active and inactive, learning-rate changes, F32 parameters updated in place and 16-bit
//! parameters rewritten from their FP32 masters (bit for bit the rounded master), gradients
//! in every float dtype, ragged gradient lists for the norm, bit-identical reruns and every
//! documented bad input.
//!
//! An optimizer step and a norm are not vector-Jacobian products of a forward, so finite
//! differences do not apply: the f64 references are the formulas themselves.

mod common;

use common::{Rng, assert_close, engine, f32_bits, stored, tensor_from_f64};
use wgrad::gradcheck::{Tolerance, compare};
use wgrad::optim::{
    AdamW, AdamWOptions, Clip, NORM_BLOCK, Sgd, SgdOptions, grad_norm, grad_norm_workspace_bytes,
};
use wgrad::reference::optim as reference;
use wgrad::{DType, Error, Tensor};

const F32: Tolerance = Tolerance::for_dtype(DType::F32);

/// Parameter shapes of the step tests: odd lengths, a matrix, a single element.
const SHAPES: [&[usize]; 4] = [&[7], &[13, 21], &[1], &[1000]];

fn len(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Parameters of `dtype` (values in [-1, 1)) and the values they hold.
fn make_params(seed: u64, dtype: DType) -> (Vec<Tensor>, Vec<Vec<f64>>) {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let v = stored(&Rng::new(seed + k as u64).vec(len(s), -1.0, 1.0), dtype);
            (tensor_from_f64(engine(), &v, s, dtype), v)
        })
        .unzip()
}

/// Gradients of step `step`, dtype `dtype`, with their stored values.
fn make_grads(seed: u64, step: usize, dtype: DType, range: f64) -> (Vec<Tensor>, Vec<Vec<f64>>) {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let r = Rng::new(seed * 1000 + step as u64 * 10 + k as u64).vec(len(s), -range, range);
            let v = stored(&r, dtype);
            (tensor_from_f64(engine(), &v, s, dtype), v)
        })
        .unzip()
}

/// Each 16-bit model copy holds its master rounded to nearest even, bit for bit.
fn assert_copies_are_rounded_masters(masters: &[Tensor], copies: &[Option<Tensor>], dtype: DType) {
    for (m, c) in masters.iter().zip(copies) {
        let c = c.as_ref().expect("16-bit parameters have model copies");
        assert_eq!(c.dtype(), dtype);
        let m = m.to_vec::<f32>().unwrap();
        let (got, want): (Vec<u16>, Vec<u16>) = match dtype {
            DType::BF16 => (
                c.to_vec::<half::bf16>()
                    .unwrap()
                    .iter()
                    .map(|h| h.to_bits())
                    .collect(),
                m.iter()
                    .map(|&x| half::bf16::from_f32(x).to_bits())
                    .collect(),
            ),
            _ => (
                c.to_vec::<half::f16>()
                    .unwrap()
                    .iter()
                    .map(|h| h.to_bits())
                    .collect(),
                m.iter()
                    .map(|&x| half::f16::from_f32(x).to_bits())
                    .collect(),
            ),
        };
        assert_eq!(got, want, "model copy is not the rounded master");
    }
}

/// AdamW over `steps` steps against the reference: masters and both moments after each step,
/// optionally clipped by `max_norm` (the norm computed on the GPU by `grad_norm`).
fn check_adamw(
    label: &str,
    param_dtype: DType,
    grad_dtype: DType,
    options: AdamWOptions,
    max_norm: Option<f32>,
    steps: usize,
) {
    check_adamw_ranges(
        label,
        param_dtype,
        grad_dtype,
        options,
        max_norm,
        &vec![1.0; steps],
    );
}

/// As [`check_adamw`], one step per entry of `ranges`, with gradients in
/// `[-range, range)`; with AMSGrad the running maxima are compared too, else there are none.
fn check_adamw_ranges(
    label: &str,
    param_dtype: DType,
    grad_dtype: DType,
    options: AdamWOptions,
    max_norm: Option<f32>,
    ranges: &[f64],
) {
    let (params, values) = make_params(1, param_dtype);
    let mut opt = AdamW::new(&params, options).unwrap();
    let mut want: Vec<reference::AdamWState> = values
        .iter()
        .map(|v| reference::AdamWState::new(v))
        .collect();
    for (step, &range) in (1..).zip(ranges) {
        let (grads, gv) = make_grads(2, step, grad_dtype, range);
        let clip = max_norm.map(|m| Clip::from_grads(&grads, m).unwrap());
        let scale = max_norm.map_or(1.0, |m| {
            let slices: Vec<&[f64]> = gv.iter().map(Vec::as_slice).collect();
            reference::clip_scale(reference::grad_norm(&slices), f64::from(m))
        });
        opt.step(&grads, clip.as_ref()).unwrap();
        for (s, g) in want.iter_mut().zip(&gv) {
            reference::adamw_step(s, g, scale, step as u64, &options);
        }
        assert_eq!(opt.step_count(), step as u64);
        for (k, s) in want.iter().enumerate() {
            let what = format!("{label} step {step} param {k}");
            assert_close(
                &format!("{what} master"),
                &opt.params()[k].to_f64().unwrap(),
                &s.param,
                F32,
            );
            assert_close(
                &format!("{what} m"),
                &opt.first_moments()[k].to_f64().unwrap(),
                &s.m,
                F32,
            );
            assert_close(
                &format!("{what} v"),
                &opt.second_moments()[k].to_f64().unwrap(),
                &s.v,
                F32,
            );
            if options.amsgrad {
                assert_close(
                    &format!("{what} v_max"),
                    &opt.max_second_moments()[k].to_f64().unwrap(),
                    &s.v_max,
                    F32,
                );
            }
        }
    }
    assert_eq!(opt.max_second_moments().is_empty(), !options.amsgrad);
    if param_dtype == DType::F32 {
        // Updated in place: the caller's tensors are the masters.
        for (p, m) in params.iter().zip(opt.params()) {
            assert_eq!(f32_bits(p), f32_bits(m));
        }
        assert!(opt.model_copies().iter().all(Option::is_none));
    } else {
        assert_copies_are_rounded_masters(opt.params(), opt.model_copies(), param_dtype);
        // The caller's 16-bit tensors are the model copies.
        for (p, c) in params.iter().zip(opt.model_copies()) {
            assert_eq!(p.to_f64().unwrap(), c.as_ref().unwrap().to_f64().unwrap());
        }
    }
}

#[test]
fn adamw_matches_reference_over_several_steps_in_every_dtype() {
    let options = AdamWOptions {
        lr: 0.01,
        ..AdamWOptions::default()
    };
    for param_dtype in DType::FLOATS {
        for grad_dtype in DType::FLOATS {
            check_adamw(
                &format!("adamw p {param_dtype} g {grad_dtype}"),
                param_dtype,
                grad_dtype,
                options,
                None,
                4,
            );
        }
    }
}

#[test]
fn adamw_weight_decay_and_other_betas() {
    let options = AdamWOptions {
        lr: 0.02,
        beta1: 0.5,
        beta2: 0.9,
        eps: 1e-6,
        weight_decay: 0.3,
        ..AdamWOptions::default()
    };
    check_adamw("adamw decay", DType::F32, DType::F32, options, None, 5);
    let options = AdamWOptions {
        beta1: 0.0,
        weight_decay: 0.0,
        ..options
    };
    check_adamw("adamw beta1 0", DType::BF16, DType::F16, options, None, 3);
}

#[test]
fn adamw_first_step_is_bias_corrected() {
    // Step 1 from zero moments: m̂ = g and v̂ = g², so with no decay the update is
    // lr·g/(|g| + ε) ≈ lr·sign(g), whatever β1 and β2.
    let e = engine();
    let lr = 0.01f32;
    let g = [0.5f64, -0.25, 2.0, -1e-3];
    let p = Tensor::from_slice(e, &[1.0f32; 4], &[4]).unwrap();
    let mut opt = AdamW::new(
        std::slice::from_ref(&p),
        AdamWOptions {
            lr,
            weight_decay: 0.0,
            ..AdamWOptions::default()
        },
    )
    .unwrap();
    opt.step(&[tensor_from_f64(e, &g, &[4], DType::F32)], None)
        .unwrap();
    let got = p.to_f64().unwrap();
    for (x, g) in got.iter().zip(g) {
        let want = 1.0 - f64::from(lr) * g / (g.abs() + 1e-8);
        assert!((x - want).abs() < 2e-7, "{x} vs {want}");
    }
    // Without bias correction the first update would be (1 − β1)/√(1 − β2) ≈ 3.2 times
    // larger: far outside the tolerance, so the comparison above is sensitive to it.
    assert!((0.1f64 / 0.001f64.sqrt() - 1.0).abs() > 1.0);
}

#[test]
fn adamw_zero_gradients_only_decay() {
    // g = 0: m = v = 0, the update term is 0/(0 + ε) = 0 and p becomes p·(1 − lr·λ) exactly
    // as f32 computes it.
    let e = engine();
    let values = [1.5f32, -2.0, 0.25, 3.0, -0.125];
    let p = Tensor::from_slice(e, &values, &[5]).unwrap();
    let options = AdamWOptions {
        lr: 0.1,
        weight_decay: 0.5,
        ..AdamWOptions::default()
    };
    let mut opt = AdamW::new(std::slice::from_ref(&p), options).unwrap();
    let zero = Tensor::zeros(e, &[5], DType::BF16).unwrap();
    opt.step(&[&zero], None).unwrap();
    opt.step(&[&zero], None).unwrap();
    let decay = (1.0 - 0.1f64 * 0.5) as f32;
    let want: Vec<f32> = values.iter().map(|v| v * decay * decay).collect();
    assert_eq!(p.to_vec::<f32>().unwrap(), want);
}

#[test]
fn clipping_active_and_inactive() {
    let options = AdamWOptions {
        lr: 0.01,
        ..AdamWOptions::default()
    };
    // Gradients in [-1, 1) over 1,294 elements have a norm near 20: 0.5 clips hard.
    check_adamw(
        "adamw clip 0.5",
        DType::F32,
        DType::F32,
        options,
        Some(0.5),
        3,
    );
    check_adamw(
        "adamw clip bf16",
        DType::BF16,
        DType::BF16,
        options,
        Some(2.0),
        2,
    );
    // A max_norm above the norm leaves the step bit-identical to an unclipped one.
    let e = engine();
    let (grads, _) = make_grads(3, 1, DType::F32, 1.0);
    let (a, _) = make_params(4, DType::F32);
    let (b, _) = make_params(4, DType::F32);
    let mut oa = AdamW::new(&a, options).unwrap();
    let mut ob = AdamW::new(&b, options).unwrap();
    let clip = Clip::from_grads(&grads, 1e6).unwrap();
    oa.step(&grads, Some(&clip)).unwrap();
    ob.step(&grads, None).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(f32_bits(x), f32_bits(y));
    }
    // SGD clipped: the direction is the scaled gradient.
    let p = Tensor::from_slice(e, &[0.0f32, 0.0], &[2]).unwrap();
    let g = Tensor::from_slice(e, &[3.0f32, 4.0], &[2]).unwrap();
    let mut sgd = Sgd::new(
        std::slice::from_ref(&p),
        SgdOptions {
            lr: 1.0,
            ..SgdOptions::default()
        },
    )
    .unwrap();
    let clip = Clip::from_grads(&[&g], 1.0).unwrap();
    assert_eq!(clip.norm.to_vec::<f32>().unwrap(), [5.0]);
    sgd.step(&[&g], Some(&clip)).unwrap();
    let s = 1.0f32 / (5.0 + 1e-6);
    assert_eq!(p.to_vec::<f32>().unwrap(), [-3.0 * s, -4.0 * s]);
}

#[test]
fn learning_rate_changes_between_steps() {
    let options = AdamWOptions::default();
    let (params, values) = make_params(5, DType::F32);
    let mut opt = AdamW::new(&params, options).unwrap();
    let mut want: Vec<reference::AdamWState> = values
        .iter()
        .map(|v| reference::AdamWState::new(v))
        .collect();
    for (step, lr) in [(1usize, 0.05f32), (2, 0.01), (3, 0.0), (4, 0.002)] {
        opt.set_lr(lr).unwrap();
        assert_eq!(opt.options().lr, lr);
        let (grads, gv) = make_grads(6, step, DType::F32, 1.0);
        opt.step(&grads, None).unwrap();
        let o = AdamWOptions { lr, ..options };
        for (s, g) in want.iter_mut().zip(&gv) {
            reference::adamw_step(s, g, 1.0, step as u64, &o);
        }
    }
    for (k, s) in want.iter().enumerate() {
        assert_close(
            &format!("set_lr param {k}"),
            &opt.params()[k].to_f64().unwrap(),
            &s.param,
            F32,
        );
    }
}

fn check_sgd(label: &str, param_dtype: DType, grad_dtype: DType, options: SgdOptions) {
    let (params, values) = make_params(7, param_dtype);
    let mut opt = Sgd::new(&params, options).unwrap();
    let mut want: Vec<reference::SgdState> = values
        .iter()
        .map(|v| reference::SgdState {
            param: v.clone(),
            buffer: None,
        })
        .collect();
    for step in 1..=4 {
        if step == 3 {
            opt.set_lr(options.lr * 0.5).unwrap();
        }
        let o = *opt.options();
        let (grads, gv) = make_grads(8, step, grad_dtype, 1.0);
        opt.step(&grads, None).unwrap();
        for (s, g) in want.iter_mut().zip(&gv) {
            reference::sgd_step(s, g, 1.0, &o);
        }
        for (k, s) in want.iter().enumerate() {
            let what = format!("{label} step {step} param {k}");
            assert_close(
                &format!("{what} master"),
                &opt.params()[k].to_f64().unwrap(),
                &s.param,
                F32,
            );
            if let Some(b) = &s.buffer {
                assert_close(
                    &format!("{what} momentum"),
                    &opt.momentum_buffers()[k].to_f64().unwrap(),
                    b,
                    F32,
                );
            }
        }
    }
    assert_eq!(opt.momentum_buffers().is_empty(), options.momentum == 0.0);
    if param_dtype != DType::F32 {
        assert_copies_are_rounded_masters(opt.params(), opt.model_copies(), param_dtype);
    }
}

/// SGD option sets over `base`: plain, weight decay, momentum, momentum with dampening and
/// decay, Nesterov with decay.
fn sgd_variants(base: SgdOptions) -> [(&'static str, SgdOptions); 5] {
    [
        ("plain", base),
        (
            "weight decay",
            SgdOptions {
                weight_decay: 0.2,
                ..base
            },
        ),
        (
            "momentum",
            SgdOptions {
                momentum: 0.9,
                ..base
            },
        ),
        (
            "momentum dampening decay",
            SgdOptions {
                momentum: 0.8,
                dampening: 0.5,
                weight_decay: 0.1,
                ..base
            },
        ),
        (
            "nesterov",
            SgdOptions {
                momentum: 0.9,
                nesterov: true,
                weight_decay: 0.05,
                ..base
            },
        ),
    ]
}

#[test]
fn sgd_variants_match_reference() {
    let base = SgdOptions {
        lr: 0.1,
        ..SgdOptions::default()
    };
    let variants = sgd_variants(base);
    for (k, (name, options)) in variants.into_iter().enumerate() {
        let param_dtype = DType::FLOATS[k % 3];
        let grad_dtype = DType::FLOATS[(k + 1) % 3];
        check_sgd(
            &format!("sgd {name} p {param_dtype} g {grad_dtype}"),
            param_dtype,
            grad_dtype,
            options,
        );
    }
    check_sgd(
        "sgd momentum bf16",
        DType::BF16,
        DType::BF16,
        SgdOptions {
            momentum: 0.9,
            ..base
        },
    );
}

#[test]
fn grad_norm_matches_reference_over_ragged_lists() {
    let e = engine();
    let sizes = [1usize, 7, 1000, 100_003];
    for (k, dtypes) in [
        [DType::F32; 4],
        [DType::F16; 4],
        [DType::BF16; 4],
        [DType::F32, DType::BF16, DType::F16, DType::F32],
    ]
    .iter()
    .enumerate()
    {
        let mut tensors = Vec::new();
        let mut values = Vec::new();
        for (i, (&n, &dtype)) in sizes.iter().zip(dtypes).enumerate() {
            let v = stored(&Rng::new(90 + (k * 10 + i) as u64).vec(n, -2.0, 2.0), dtype);
            tensors.push(tensor_from_f64(e, &v, &[n], dtype));
            values.push(v);
        }
        let norm = grad_norm(&tensors).unwrap();
        assert_eq!((norm.shape(), norm.dtype()), (&[1usize][..], DType::F32));
        let slices: Vec<&[f64]> = values.iter().map(Vec::as_slice).collect();
        let want = reference::grad_norm(&slices);
        // FP32 sums of 101,011 squares: relative error far below 1e-5.
        let tol = Tolerance {
            abs: 0.0,
            rel: 1e-5,
            rel_l2: 1e-5,
        };
        assert_close(
            &format!("norm {dtypes:?}"),
            &norm.to_f64().unwrap(),
            &[want],
            tol,
        );
        // Sub-lists, each tensor alone, and reruns.
        for i in 0..sizes.len() {
            let one = grad_norm(&tensors[i..=i]).unwrap().to_f64().unwrap();
            assert_close(
                &format!("norm of tensor {i}"),
                &one,
                &[reference::grad_norm(&slices[i..=i])],
                tol,
            );
        }
        assert_eq!(f32_bits(&norm), f32_bits(&grad_norm(&tensors).unwrap()));
    }
    // Exact small cases; empty tensors contribute nothing.
    let a = Tensor::from_slice(e, &[3.0f32], &[1]).unwrap();
    let b = Tensor::from_slice(e, &[half::bf16::from_f32(4.0)], &[1]).unwrap();
    let empty = Tensor::zeros(e, &[0], DType::F16).unwrap();
    assert_eq!(
        grad_norm(&[&a, &empty, &b])
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        [5.0]
    );
    assert_eq!(
        grad_norm(&[&empty]).unwrap().to_vec::<f32>().unwrap(),
        [0.0]
    );
    let b = NORM_BLOCK;
    assert_eq!(grad_norm_workspace_bytes(&[1, b, b + 1, 0, 3 * b]), 4 * 7);
}

#[test]
fn reruns_are_bit_identical() {
    let run = || {
        let (params, _) = make_params(11, DType::BF16);
        let mut adam = AdamW::new(&params, AdamWOptions::default()).unwrap();
        let (sp, _) = make_params(12, DType::F32);
        let mut sgd = Sgd::new(
            &sp,
            SgdOptions {
                momentum: 0.9,
                nesterov: true,
                ..SgdOptions::default()
            },
        )
        .unwrap();
        for step in 1..=3 {
            let (grads, _) = make_grads(13, step, DType::F32, 3.0);
            let clip = Clip::from_grads(&grads, 1.0).unwrap();
            adam.step(&grads, Some(&clip)).unwrap();
            sgd.step(&grads, Some(&clip)).unwrap();
        }
        let mut bits = Vec::new();
        for t in adam
            .params()
            .iter()
            .chain(adam.first_moments())
            .chain(adam.second_moments())
            .chain(sgd.params())
            .chain(sgd.momentum_buffers())
        {
            bits.push(f32_bits(t));
        }
        bits
    };
    assert_eq!(run(), run());
}

#[test]
fn empty_parameters_and_lists() {
    let e = engine();
    let mut opt = AdamW::new(&[], AdamWOptions::default()).unwrap();
    opt.step::<Tensor>(&[], None).unwrap();
    assert_eq!(opt.step_count(), 1);
    let p = Tensor::zeros(e, &[0, 3], DType::BF16).unwrap();
    let mut opt = Sgd::new(std::slice::from_ref(&p), SgdOptions::default()).unwrap();
    opt.step(&[Tensor::zeros(e, &[0, 3], DType::F32).unwrap()], None)
        .unwrap();
    assert_eq!(opt.params()[0].shape(), &[0, 3]);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let p = Tensor::zeros(e, &[2, 3], DType::F32).unwrap();
    let q = Tensor::zeros(e, &[4], DType::BF16).unwrap();
    let params = [p.clone(), q.clone()];
    let d = AdamWOptions::default();
    // Options.
    for (options, what) in [
        (AdamWOptions { lr: -1e-3, ..d }, "adamw: lr"),
        (AdamWOptions { lr: f32::NAN, ..d }, "adamw: lr"),
        (AdamWOptions { eps: -1e-8, ..d }, "adamw: eps"),
        (AdamWOptions { beta1: 1.0, ..d }, "adamw: beta1"),
        (AdamWOptions { beta1: -0.1, ..d }, "adamw: beta1"),
        (AdamWOptions { beta2: 1.5, ..d }, "adamw: beta2"),
        (
            AdamWOptions {
                weight_decay: -0.1,
                ..d
            },
            "adamw: weight_decay",
        ),
    ] {
        match AdamW::new(&params, options) {
            Err(Error::InvalidValue { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{what}: {other:?}"),
        }
    }
    let s = SgdOptions::default();
    for (options, what) in [
        (SgdOptions { lr: -0.1, ..s }, "sgd: lr"),
        (
            SgdOptions {
                momentum: -0.9,
                ..s
            },
            "sgd: momentum",
        ),
        (
            SgdOptions {
                dampening: 1.5,
                ..s
            },
            "sgd: dampening",
        ),
        (
            SgdOptions {
                weight_decay: f32::INFINITY,
                ..s
            },
            "sgd: weight_decay",
        ),
        (
            SgdOptions {
                nesterov: true,
                ..s
            },
            "sgd: momentum",
        ),
        (
            SgdOptions {
                nesterov: true,
                momentum: 0.9,
                dampening: 0.1,
                ..s
            },
            "sgd: dampening",
        ),
    ] {
        match Sgd::new(&params, options) {
            Err(Error::InvalidValue { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{what}: {other:?}"),
        }
    }
    // Parameters: integer dtype, the same buffer twice.
    let ints = Tensor::zeros(e, &[3], DType::I32).unwrap();
    assert!(matches!(
        AdamW::new(std::slice::from_ref(&ints), d),
        Err(Error::UnsupportedDType { .. })
    ));
    assert_eq!(
        AdamW::new(&[p.clone(), p.reshape(&[6]).unwrap()], d).unwrap_err(),
        Error::Aliased {
            what: "adamw: params[1]".into(),
            other: "adamw: params[0]".into()
        }
    );
    let mut opt = AdamW::new(&params, d).unwrap();
    let g0 = Tensor::zeros(e, &[2, 3], DType::F32).unwrap();
    let g1 = Tensor::zeros(e, &[4], DType::F16).unwrap();
    // Gradient count, shape, dtype.
    assert_eq!(
        opt.step(&[&g0], None).unwrap_err(),
        Error::ShapeMismatch {
            what: "adamw: grads (count)".into(),
            expected: vec![2],
            got: vec![1]
        }
    );
    let wrong = Tensor::zeros(e, &[3, 2], DType::F32).unwrap();
    assert_eq!(
        opt.step(&[&wrong, &g1], None).unwrap_err(),
        Error::ShapeMismatch {
            what: "adamw: grads[0]".into(),
            expected: vec![2, 3],
            got: vec![3, 2]
        }
    );
    let int_grad = Tensor::zeros(e, &[4], DType::U32).unwrap();
    assert!(matches!(
        opt.step(&[&g0, &int_grad], None),
        Err(Error::UnsupportedDType { .. })
    ));
    // A gradient that is a parameter (or a master weight).
    assert_eq!(
        opt.step(&[&g0, &q], None).unwrap_err(),
        Error::Aliased {
            what: "adamw: grads[1]".into(),
            other: "adamw: params[1]".into()
        }
    );
    assert!(matches!(
        opt.step(&[&p, &g1], None),
        Err(Error::Aliased { .. })
    ));
    // Clip: bad max_norm, norm of the wrong dtype or shape, a norm that is a parameter.
    let norm = grad_norm(&[&g0, &g1]).unwrap();
    for max_norm in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let clip = Clip {
            max_norm,
            norm: norm.clone(),
        };
        assert!(matches!(
            opt.step(&[&g0, &g1], Some(&clip)),
            Err(Error::InvalidValue { .. })
        ));
    }
    let clip = Clip {
        max_norm: 1.0,
        norm: Tensor::zeros(e, &[2], DType::F32).unwrap(),
    };
    assert!(matches!(
        opt.step(&[&g0, &g1], Some(&clip)),
        Err(Error::ShapeMismatch { .. })
    ));
    let clip = Clip {
        max_norm: 1.0,
        norm: Tensor::zeros(e, &[1], DType::BF16).unwrap(),
    };
    assert!(matches!(
        opt.step(&[&g0, &g1], Some(&clip)),
        Err(Error::UnsupportedDType { .. })
    ));
    // Nothing was recorded by the failed calls.
    assert_eq!(opt.step_count(), 0);
    assert!(matches!(opt.set_lr(-1.0), Err(Error::InvalidValue { .. })));
    // Norm: empty list, integer tensor.
    assert!(matches!(
        grad_norm::<Tensor>(&[]),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        grad_norm(&[&g0, &ints]),
        Err(Error::UnsupportedDType { .. })
    ));
    // Another engine.
    let other = common::private_engine();
    let og = Tensor::zeros(&other, &[4], DType::F32).unwrap();
    assert!(matches!(
        opt.step(&[&g0, &og], None),
        Err(Error::EngineMismatch { .. })
    ));
    assert!(matches!(
        AdamW::new(&[p.clone(), og.clone()], d),
        Err(Error::EngineMismatch { .. })
    ));
    assert!(matches!(
        grad_norm(&[&g0, &og]),
        Err(Error::EngineMismatch { .. })
    ));
    // The workspace bound applies to the norm's partials.
    let e2 = common::private_engine();
    let big = Tensor::zeros(&e2, &[2 * NORM_BLOCK + 1], DType::F32).unwrap();
    e2.set_workspace_bound(11);
    assert_eq!(
        grad_norm(&[&big]).unwrap_err(),
        Error::WorkspaceExceeded {
            what: "grad_norm".into(),
            needed: 12,
            bound: 11
        }
    );
}

/// Gradient ranges of the AMSGrad tests: a large step, then small ones (v shrinks on every
/// element, the running maximum holds), then a larger one (v passes its maximum on some
/// elements only), then a small one.
const SHRINKING: [f64; 5] = [4.0, 0.05, 0.05, 3.0, 0.5];

/// The reference AdamW states after the steps of [`check_adamw_ranges`] (unclipped).
fn reference_adamw(grad_dtype: DType, options: &AdamWOptions) -> Vec<reference::AdamWState> {
    let (_, values) = make_params(1, DType::F32);
    let mut states: Vec<reference::AdamWState> = values
        .iter()
        .map(|v| reference::AdamWState::new(v))
        .collect();
    for (step, &range) in (1..).zip(&SHRINKING) {
        let (_, gv) = make_grads(2, step, grad_dtype, range);
        for (s, g) in states.iter_mut().zip(&gv) {
            reference::adamw_step(s, g, 1.0, step as u64, options);
        }
    }
    states
}

#[test]
fn adamw_amsgrad_matches_reference_where_the_second_moment_shrinks() {
    let options = AdamWOptions {
        lr: 0.05,
        beta2: 0.9,
        weight_decay: 0.1,
        amsgrad: true,
        ..AdamWOptions::default()
    };
    // The running maximum matters: plain Adam on the same gradients ends outside the
    // tolerance the GPU is held to, and the maximum exceeds v on most elements.
    let ams = reference_adamw(DType::F32, &options);
    let plain = reference_adamw(
        DType::F32,
        &AdamWOptions {
            amsgrad: false,
            ..options
        },
    );
    for (a, p) in ams.iter().zip(&plain) {
        assert_eq!(a.v, p.v);
        assert!(!compare(&a.param, &p.param, F32).passed);
    }
    let (held, total) = ams.iter().fold((0, 0), |(h, n), s| {
        let h = h + s.v_max.iter().zip(&s.v).filter(|(m, v)| m > v).count();
        (h, n + s.v.len())
    });
    assert!(held * 2 > total, "v_max > v on {held} of {total}");
    for (p, g) in [
        (DType::F32, DType::F32),
        (DType::BF16, DType::F16),
        (DType::F16, DType::BF16),
    ] {
        check_adamw_ranges(
            &format!("amsgrad p {p} g {g}"),
            p,
            g,
            options,
            None,
            &SHRINKING,
        );
    }
    // PyTorch's default betas, and clipped (every step's norm is far past 1).
    let options = AdamWOptions {
        lr: 0.01,
        amsgrad: true,
        ..AdamWOptions::default()
    };
    check_adamw_ranges(
        "amsgrad default",
        DType::F32,
        DType::F32,
        options,
        None,
        &SHRINKING,
    );
    check_adamw_ranges(
        "amsgrad clipped",
        DType::BF16,
        DType::BF16,
        options,
        Some(1.0),
        &SHRINKING,
    );
}

#[test]
fn adamw_amsgrad_with_growing_gradients_is_adam() {
    // |g| doubling every step keeps v growing, so v_max = v and the step is plain Adam's,
    // bit for bit (the same bias correction of the same values).
    let e = engine();
    let n = 301;
    let base = stored(&Rng::new(40).vec(n, -1.0, 1.0), DType::F32);
    let run = |amsgrad: bool| {
        let p = tensor_from_f64(e, &Rng::new(41).vec(n, -1.0, 1.0), &[n], DType::F32);
        let options = AdamWOptions {
            lr: 0.01,
            amsgrad,
            ..AdamWOptions::default()
        };
        let mut opt = AdamW::new(std::slice::from_ref(&p), options).unwrap();
        for step in 0..4 {
            let g: Vec<f64> = base.iter().map(|x| x * f64::from(1 << step)).collect();
            opt.step(&[tensor_from_f64(e, &g, &[n], DType::F32)], None)
                .unwrap();
        }
        let max = opt.max_second_moments().first().map(f32_bits);
        (
            f32_bits(&p),
            f32_bits(&opt.first_moments()[0]),
            f32_bits(&opt.second_moments()[0]),
            max,
        )
    };
    let (p, m, v, max) = run(true);
    let (plain_p, plain_m, plain_v, plain_max) = run(false);
    assert_eq!((p, m, &v), (plain_p, plain_m, &plain_v));
    assert_eq!(plain_max, None);
    assert_eq!(max.as_ref(), Some(&v));
}

#[test]
fn maximize_matches_reference() {
    let options = AdamWOptions {
        lr: 0.01,
        weight_decay: 0.2,
        maximize: true,
        ..AdamWOptions::default()
    };
    check_adamw("adamw maximize", DType::F32, DType::F32, options, None, 4);
    check_adamw(
        "adamw maximize clipped f16",
        DType::F16,
        DType::BF16,
        options,
        Some(0.5),
        3,
    );
    let both = AdamWOptions {
        lr: 0.05,
        beta2: 0.9,
        amsgrad: true,
        ..options
    };
    check_adamw_ranges(
        "adamw maximize amsgrad",
        DType::F32,
        DType::F32,
        both,
        None,
        &SHRINKING,
    );
    check_adamw_ranges(
        "adamw maximize amsgrad clipped bf16",
        DType::BF16,
        DType::F32,
        both,
        Some(2.0),
        &SHRINKING,
    );
    let base = SgdOptions {
        lr: 0.1,
        maximize: true,
        ..SgdOptions::default()
    };
    let variants = sgd_variants(base);
    for (k, (name, options)) in variants.into_iter().enumerate() {
        let param_dtype = DType::FLOATS[(k + 1) % 3];
        let grad_dtype = DType::FLOATS[k % 3];
        check_sgd(
            &format!("sgd maximize {name} p {param_dtype} g {grad_dtype}"),
            param_dtype,
            grad_dtype,
            options,
        );
    }
}

#[test]
fn maximize_is_minimizing_the_negated_gradient() {
    // −g is exact and the kernel's sign flip is exact, so maximizing along g and minimizing
    // along −g give the same bits, with weight decay, clipping (the norm of −g is the norm
    // of g, bit for bit) and 16-bit model copies.
    let e = engine();
    for dtype in [DType::F32, DType::BF16] {
        let adam = AdamWOptions {
            lr: 0.02,
            weight_decay: 0.1,
            amsgrad: true,
            ..AdamWOptions::default()
        };
        let sgd = SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.05,
            ..SgdOptions::default()
        };
        let run = |maximize: bool| {
            let (pa, _) = make_params(20, dtype);
            let (ps, _) = make_params(21, dtype);
            let mut a = AdamW::new(&pa, AdamWOptions { maximize, ..adam }).unwrap();
            let mut s = Sgd::new(&ps, SgdOptions { maximize, ..sgd }).unwrap();
            for step in 1..=3 {
                let (_, gv) = make_grads(22, step, DType::F32, 2.0);
                let sign = if maximize { 1.0 } else { -1.0 };
                let grads: Vec<Tensor> = gv
                    .iter()
                    .zip(SHAPES)
                    .map(|(g, shape)| {
                        let g: Vec<f64> = g.iter().map(|x| sign * x).collect();
                        tensor_from_f64(e, &g, shape, DType::F32)
                    })
                    .collect();
                let clip = Clip::from_grads(&grads, 3.0).unwrap();
                a.step(&grads, Some(&clip)).unwrap();
                s.step(&grads, Some(&clip)).unwrap();
            }
            let tensors = a
                .params()
                .iter()
                .chain(a.first_moments())
                .chain(a.second_moments())
                .chain(a.max_second_moments())
                .chain(s.params())
                .chain(s.momentum_buffers())
                .chain(pa.iter().chain(&ps).filter(|t| t.dtype() != DType::F32));
            tensors
                .map(|t| t.to_f64().unwrap().iter().map(|x| x.to_bits()).collect())
                .collect::<Vec<Vec<u64>>>()
        };
        assert_eq!(run(true), run(false), "{dtype}");
    }
}

#[test]
fn new_options_reruns_are_bit_identical() {
    let run = || {
        let (params, _) = make_params(30, DType::F16);
        let mut adam = AdamW::new(
            &params,
            AdamWOptions {
                amsgrad: true,
                maximize: true,
                ..AdamWOptions::default()
            },
        )
        .unwrap();
        let (sp, _) = make_params(31, DType::BF16);
        let mut sgd = Sgd::new(
            &sp,
            SgdOptions {
                momentum: 0.9,
                dampening: 0.1,
                weight_decay: 0.01,
                maximize: true,
                ..SgdOptions::default()
            },
        )
        .unwrap();
        for (step, &range) in (1..).zip(&SHRINKING) {
            let (grads, _) = make_grads(32, step, DType::BF16, range);
            let clip = Clip::from_grads(&grads, 1.0).unwrap();
            adam.step(&grads, Some(&clip)).unwrap();
            sgd.step(&grads, None).unwrap();
        }
        let mut bits = Vec::new();
        for t in adam
            .params()
            .iter()
            .chain(adam.first_moments())
            .chain(adam.second_moments())
            .chain(adam.max_second_moments())
            .chain(sgd.params())
            .chain(sgd.momentum_buffers())
        {
            bits.push(f32_bits(t));
        }
        for t in params.iter().chain(&sp) {
            bits.push(
                t.to_f64()
                    .unwrap()
                    .iter()
                    .map(|x| *x as f32)
                    .map(f32::to_bits)
                    .collect(),
            );
        }
        bits
    };
    assert_eq!(run(), run());
}

#[test]
fn amsgrad_state_shapes_and_options() {
    let e = engine();
    let p = Tensor::zeros(e, &[2, 3], DType::F32).unwrap();
    let q = Tensor::zeros(e, &[5], DType::BF16).unwrap();
    let empty = Tensor::zeros(e, &[0, 4], DType::F16).unwrap();
    let params = [p.clone(), q.clone(), empty.clone()];
    let ams = AdamWOptions {
        amsgrad: true,
        maximize: true,
        ..AdamWOptions::default()
    };
    let mut opt = AdamW::new(&params, ams).unwrap();
    assert_eq!(opt.max_second_moments().len(), 3);
    for (m, p) in opt.max_second_moments().iter().zip(&params) {
        assert_eq!((m.shape(), m.dtype()), (p.shape(), DType::F32));
        assert!(m.to_f64().unwrap().iter().all(|&x| x == 0.0));
    }
    // The options (amsgrad and maximize kept across set_lr).
    opt.set_lr(0.5).unwrap();
    assert_eq!(*opt.options(), AdamWOptions { lr: 0.5, ..ams });
    // Without AMSGrad there is no third state.
    let plain = AdamW::new(&params, AdamWOptions::default()).unwrap();
    assert!(plain.max_second_moments().is_empty());
    assert_eq!(plain.second_moments().len(), 3);
    // An empty list and an empty parameter step without error.
    let mut none = AdamW::new(&[], ams).unwrap();
    none.step::<Tensor>(&[], None).unwrap();
    assert!(none.max_second_moments().is_empty());
    let g = [
        Tensor::zeros(e, &[2, 3], DType::F32).unwrap(),
        Tensor::zeros(e, &[5], DType::F32).unwrap(),
        Tensor::zeros(e, &[0, 4], DType::F32).unwrap(),
    ];
    opt.step(&g, None).unwrap();
    assert_eq!(opt.step_count(), 1);
    // The running maximum is optimizer state: a gradient aliasing it is refused.
    let vmax = opt.max_second_moments()[1].clone();
    assert_eq!(
        opt.step(&[&g[0], &vmax, &g[2]], None).unwrap_err(),
        Error::Aliased {
            what: "adamw: grads[1]".into(),
            other: "adamw: optimizer state".into()
        }
    );
    // The new options leave the validation of the others as it was.
    for (options, what) in [
        (AdamWOptions { lr: -1.0, ..ams }, "adamw: lr"),
        (AdamWOptions { beta2: 1.0, ..ams }, "adamw: beta2"),
        (
            AdamWOptions {
                eps: f32::NAN,
                ..ams
            },
            "adamw: eps",
        ),
    ] {
        match AdamW::new(&params, options) {
            Err(Error::InvalidValue { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{what}: {other:?}"),
        }
    }
    let s = SgdOptions {
        maximize: true,
        ..SgdOptions::default()
    };
    for (options, what) in [
        (SgdOptions { lr: f32::NAN, ..s }, "sgd: lr"),
        (
            SgdOptions {
                nesterov: true,
                ..s
            },
            "sgd: momentum",
        ),
    ] {
        match Sgd::new(&params, options) {
            Err(Error::InvalidValue { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{what}: {other:?}"),
        }
    }
    let sgd = Sgd::new(&params, SgdOptions { momentum: 0.5, ..s }).unwrap();
    assert_eq!(sgd.momentum_buffers().len(), 3);
    assert!(Sgd::new(&params, s).unwrap().momentum_buffers().is_empty());
}
