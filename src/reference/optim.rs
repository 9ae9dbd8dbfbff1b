//! f64 references of the optimizers and the gradient norm (see [`crate::optim`]): the same
//! formulas, one element at a time, in f64 throughout (hyperparameters widened from their f32
//! values).

use crate::optim::{AdamWOptions, SgdOptions};

/// The global L2 norm `sqrt(Σ_i Σ_j g_ij²)`.
pub fn grad_norm(grads: &[&[f64]]) -> f64 {
    grads
        .iter()
        .flat_map(|g| g.iter())
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
}

/// The clipping factor `min(1, max_norm / (norm + 1e-6))`.
pub fn clip_scale(norm: f64, max_norm: f64) -> f64 {
    (max_norm / (norm + 1e-6)).min(1.0)
}

/// AdamW state of one parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWState {
    /// Weights.
    pub param: Vec<f64>,
    /// First moment.
    pub m: Vec<f64>,
    /// Second moment.
    pub v: Vec<f64>,
    /// Running maximum of the second moment (AMSGrad; stays zero without it).
    pub v_max: Vec<f64>,
}

impl AdamWState {
    /// Weights `param` with zero moments (and a zero running maximum).
    pub fn new(param: &[f64]) -> AdamWState {
        AdamWState {
            param: param.to_vec(),
            m: vec![0.0; param.len()],
            v: vec![0.0; param.len()],
            v_max: vec![0.0; param.len()],
        }
    }
}

/// One AdamW step `t` (from 1) with gradient `g = ±grad · scale` (negated with `maximize`):
/// `p ← p(1 − lr·λ) − lr/(1 − β1ᵗ) · m / (√(u/(1 − β2ᵗ)) + ε)` after the moment updates,
/// where `u` is `v`, or with AMSGrad the running maximum `v_max ← max(v_max, v)`.
pub fn adamw_step(state: &mut AdamWState, grad: &[f64], scale: f64, t: u64, o: &AdamWOptions) {
    let (lr, b1, b2) = (f64::from(o.lr), f64::from(o.beta1), f64::from(o.beta2));
    let (eps, wd) = (f64::from(o.eps), f64::from(o.weight_decay));
    let sign = if o.maximize { -1.0 } else { 1.0 };
    let bc1 = 1.0 - b1.powi(t as i32);
    let bc2 = 1.0 - b2.powi(t as i32);
    for (i, &raw) in grad.iter().enumerate() {
        let g = sign * raw * scale;
        state.m[i] = b1 * state.m[i] + (1.0 - b1) * g;
        state.v[i] = b2 * state.v[i] + (1.0 - b2) * g * g;
        let m_hat = state.m[i] / bc1;
        let u = if o.amsgrad {
            state.v_max[i] = state.v_max[i].max(state.v[i]);
            state.v_max[i]
        } else {
            state.v[i]
        };
        let v_hat = u / bc2;
        state.param[i] = state.param[i] * (1.0 - lr * wd) - lr * m_hat / (v_hat.sqrt() + eps);
    }
}

/// SGD state of one parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct SgdState {
    /// Weights.
    pub param: Vec<f64>,
    /// Momentum buffer (`None` before the first step or without momentum).
    pub buffer: Option<Vec<f64>>,
}

/// One SGD step with gradient `±grad · scale` (negated with `maximize`): weight decay,
/// momentum (the buffer starts as the first gradient), dampening, Nesterov, then
/// `p ← p − lr·d`.
pub fn sgd_step(state: &mut SgdState, grad: &[f64], scale: f64, o: &SgdOptions) {
    let (lr, mu) = (f64::from(o.lr), f64::from(o.momentum));
    let (tau, wd) = (f64::from(o.dampening), f64::from(o.weight_decay));
    let sign = if o.maximize { -1.0 } else { 1.0 };
    let g: Vec<f64> = grad
        .iter()
        .zip(&state.param)
        .map(|(g, p)| sign * g * scale + wd * p)
        .collect();
    let d = if mu > 0.0 {
        let b: Vec<f64> = match &state.buffer {
            None => g.clone(),
            Some(b) => b
                .iter()
                .zip(&g)
                .map(|(b, g)| mu * b + (1.0 - tau) * g)
                .collect(),
        };
        let d = if o.nesterov {
            g.iter().zip(&b).map(|(g, b)| g + mu * b).collect()
        } else {
            b.clone()
        };
        state.buffer = Some(b);
        d
    } else {
        g
    };
    for (p, d) in state.param.iter_mut().zip(d) {
        *p -= lr * d;
    }
}
