//! Checks of the optimizer family (`crate::optim`): AdamW (plain, and AMSGrad maximizing) and
//! SGD (minimizing and maximizing) steps against their f64 references (several steps,
//! clipping on the GPU), 16-bit model copies against the rounded masters, and the global
//! gradient norm.

use super::*;
use crate::Tensor;
use crate::optim::{AdamW, AdamWOptions, Clip, Sgd, SgdOptions, grad_norm};
use reference::optim as r;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "adamw",
            kernels: &["optim"],
            run: check_adamw,
        },
        OperatorCheck {
            name: "adamw_amsgrad_maximize",
            kernels: &["optim"],
            run: check_adamw_amsgrad_maximize,
        },
        OperatorCheck {
            name: "sgd",
            kernels: &["optim"],
            run: check_sgd,
        },
        OperatorCheck {
            name: "sgd_maximize",
            kernels: &["optim"],
            run: check_sgd_maximize,
        },
        OperatorCheck {
            name: "grad_norm",
            kernels: &["optim"],
            run: check_grad_norm,
        },
    ]
}

/// Parameter shapes: odd lengths and a matrix.
const SHAPES: [&[usize]; 3] = [&[7], &[1], &[31, 33]];
const STEPS: usize = 3;

/// Parameters of `dtype` and their stored values.
fn params(engine: &Engine, rng: &mut Rng, dtype: DType) -> Result<(Vec<Tensor>, Vec<Vec<f64>>)> {
    scaled(engine, rng, dtype, 1.0)
}

/// Tensors of `dtype` with values in `[-range, range)`, and their stored values.
fn scaled(
    engine: &Engine,
    rng: &mut Rng,
    dtype: DType,
    range: f64,
) -> Result<(Vec<Tensor>, Vec<Vec<f64>>)> {
    let mut tensors = Vec::new();
    let mut values = Vec::new();
    for s in SHAPES {
        let n = s.iter().product();
        let (t, v) = tensor_from_f64(engine, &rng.vec(n, -range, range), s, dtype)?;
        tensors.push(t);
        values.push(v);
    }
    Ok((tensors, values))
}

/// The cases of one parameter after the steps: each `(name, tensor, reference)` of its state,
/// the master first (FP32 tolerance), then the 16-bit model copy, if any, against the master
/// rounded to the copy's dtype (exact).
fn parameter_cases(
    cases: &mut Vec<Case>,
    label: &str,
    states: &[(&str, &Tensor, &[f64])],
    copy: Option<&Tensor>,
) -> Result<()> {
    for (name, got, want) in states {
        cases.push(case(
            format!("{label} {name}"),
            &got.to_f64()?,
            want,
            Tolerance::for_dtype(DType::F32),
        ));
    }
    if let Some(c) = copy {
        let want = stored_values(&states[0].1.to_f64()?, c.dtype());
        cases.push(case(
            format!("{label} model copy"),
            &c.to_f64()?,
            &want,
            Tolerance::EXACT,
        ));
    }
    Ok(())
}

/// AdamW, 3 steps with clipping at max_norm 2 (active: the norms are near 18), for F32,
/// F16 and BF16 parameters (the 16-bit ones through FP32 masters) and gradients of the same
/// dtype: masters, both moments and model copies.
fn check_adamw(engine: &Engine) -> Result<Vec<Case>> {
    let mut rng = Rng::new(70);
    let options = AdamWOptions {
        lr: 0.01,
        ..AdamWOptions::default()
    };
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (p, values) = params(engine, &mut rng, dtype)?;
        let mut opt = AdamW::new(&p, options)?;
        let mut want: Vec<r::AdamWState> = values.iter().map(|v| r::AdamWState::new(v)).collect();
        for step in 1..=STEPS {
            let (grads, gv) = params(engine, &mut rng, dtype)?;
            let clip = Clip::from_grads(&grads, 2.0)?;
            opt.step(&grads, Some(&clip))?;
            let slices: Vec<&[f64]> = gv.iter().map(Vec::as_slice).collect();
            let scale = r::clip_scale(r::grad_norm(&slices), 2.0);
            for (s, g) in want.iter_mut().zip(&gv) {
                r::adamw_step(s, g, scale, step as u64, &options);
            }
        }
        for (k, s) in want.iter().enumerate() {
            let label = format!("{dtype} {:?} after {STEPS} clipped steps", SHAPES[k]);
            let states: [(&str, &Tensor, &[f64]); 3] = [
                ("master", &opt.params()[k], &s.param),
                ("m", &opt.first_moments()[k], &s.m),
                ("v", &opt.second_moments()[k], &s.v),
            ];
            parameter_cases(&mut cases, &label, &states, opt.model_copies()[k].as_ref())?;
        }
    }
    Ok(cases)
}

/// AdamW with AMSGrad and `maximize` (β2 0.9, weight decay 0.1), clipped at max_norm 2,
/// over gradients in ±4, then ±0.05 twice, then ±3 (v shrinks below its running maximum,
/// then passes it on some elements), every parameter dtype with gradients of the same
/// dtype: masters, both moments, the running maxima and model copies.
fn check_adamw_amsgrad_maximize(engine: &Engine) -> Result<Vec<Case>> {
    const RANGES: [f64; 4] = [4.0, 0.05, 0.05, 3.0];
    let mut rng = Rng::new(73);
    let options = AdamWOptions {
        lr: 0.05,
        beta2: 0.9,
        weight_decay: 0.1,
        amsgrad: true,
        maximize: true,
        ..AdamWOptions::default()
    };
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (p, values) = params(engine, &mut rng, dtype)?;
        let mut opt = AdamW::new(&p, options)?;
        let mut want: Vec<r::AdamWState> = values.iter().map(|v| r::AdamWState::new(v)).collect();
        for (step, range) in (1u64..).zip(RANGES) {
            let (grads, gv) = scaled(engine, &mut rng, dtype, range)?;
            let clip = Clip::from_grads(&grads, 2.0)?;
            opt.step(&grads, Some(&clip))?;
            let slices: Vec<&[f64]> = gv.iter().map(Vec::as_slice).collect();
            let scale = r::clip_scale(r::grad_norm(&slices), 2.0);
            for (s, g) in want.iter_mut().zip(&gv) {
                r::adamw_step(s, g, scale, step, &options);
            }
        }
        for (k, s) in want.iter().enumerate() {
            let label = format!(
                "{dtype} {:?} after {} clipped steps",
                SHAPES[k],
                RANGES.len()
            );
            let states: [(&str, &Tensor, &[f64]); 4] = [
                ("master", &opt.params()[k], &s.param),
                ("m", &opt.first_moments()[k], &s.m),
                ("v", &opt.second_moments()[k], &s.v),
                ("v_max", &opt.max_second_moments()[k], &s.v_max),
            ];
            parameter_cases(&mut cases, &label, &states, opt.model_copies()[k].as_ref())?;
        }
    }
    Ok(cases)
}

/// SGD with momentum 0.9, Nesterov and weight decay 0.01, 3 steps, every parameter dtype
/// (F32 gradients): masters, momentum buffers and model copies.
fn check_sgd(engine: &Engine) -> Result<Vec<Case>> {
    let options = SgdOptions {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.01,
        ..SgdOptions::default()
    };
    sgd_cases(engine, &mut Rng::new(71), options)
}

/// As the SGD check, maximizing, with momentum 0.8, dampening 0.3 and weight decay 0.05.
fn check_sgd_maximize(engine: &Engine) -> Result<Vec<Case>> {
    let options = SgdOptions {
        lr: 0.1,
        momentum: 0.8,
        dampening: 0.3,
        weight_decay: 0.05,
        maximize: true,
        ..SgdOptions::default()
    };
    sgd_cases(engine, &mut Rng::new(74), options)
}

/// SGD with `options`, 3 steps, every parameter dtype (F32 gradients).
fn sgd_cases(engine: &Engine, rng: &mut Rng, options: SgdOptions) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (p, values) = params(engine, rng, dtype)?;
        let mut opt = Sgd::new(&p, options)?;
        let mut want: Vec<r::SgdState> = values
            .iter()
            .map(|v| r::SgdState {
                param: v.clone(),
                buffer: None,
            })
            .collect();
        for _ in 0..STEPS {
            let (grads, gv) = params(engine, rng, DType::F32)?;
            opt.step(&grads, None)?;
            for (s, g) in want.iter_mut().zip(&gv) {
                r::sgd_step(s, g, 1.0, &options);
            }
        }
        for (k, s) in want.iter().enumerate() {
            let label = format!("{dtype} {:?} after {STEPS} steps", SHAPES[k]);
            let states: [(&str, &Tensor, &[f64]); 2] = [
                ("master", &opt.params()[k], &s.param),
                (
                    "momentum",
                    &opt.momentum_buffers()[k],
                    s.buffer.as_deref().unwrap_or_default(),
                ),
            ];
            parameter_cases(&mut cases, &label, &states, opt.model_copies()[k].as_ref())?;
        }
    }
    Ok(cases)
}

/// Global norm of gradients of 1, 7, 1,000 and 100,003 elements, each float dtype.
fn check_grad_norm(engine: &Engine) -> Result<Vec<Case>> {
    let mut rng = Rng::new(72);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let mut tensors = Vec::new();
        let mut values = Vec::new();
        for n in [1usize, 7, 1000, 100_003] {
            let (t, v) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[n], dtype)?;
            tensors.push(t);
            values.push(v);
        }
        let slices: Vec<&[f64]> = values.iter().map(Vec::as_slice).collect();
        let got = grad_norm(&tensors)?.to_f64()?;
        cases.push(case(
            format!("[1, 7, 1000, 100003] {dtype}"),
            &got,
            &[r::grad_norm(&slices)],
            Tolerance::for_dtype(DType::F32),
        ));
    }
    Ok(cases)
}
