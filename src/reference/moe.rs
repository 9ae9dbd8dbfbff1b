//! f64 reference of the fused mixture of experts: per token `t` and slot `k` with expert
//! `e = index[t, k]` (skipped when outside `0..E`),
//! `y_t += w[t, k] · down_e · (act(gate_e·x_t) ⊙ (up_e·x_t))`.
//!
//! Row-major: `x [t, h]`, `gate_up [e, 2i, h]` (gate rows then up rows), `down [e, h, i]`,
//! `index`, `weights [t, k]`, `y [t, h]`. Slot by slot, no sorting: the GPU's routing is an
//! implementation detail this reference does not share.

use super::activation::{act, act_grad};
use crate::activation::Activation;

/// The extents of one call: tokens `t`, hidden `h`, intermediate `i`, experts `e`, slots a
/// token `k`.
#[derive(Debug, Clone, Copy)]
pub struct Extents {
    pub t: usize,
    pub h: usize,
    pub i: usize,
    pub e: usize,
    pub k: usize,
}

/// One routed slot's intermediates: the gate and up products and `h = act(g) ⊙ u`.
struct Slot {
    expert: usize,
    g: Vec<f64>,
    u: Vec<f64>,
    h: Vec<f64>,
}

/// The expert of slot `(t, k)`, or `None` when it routes nowhere.
fn expert_of(index: &[i64], t: usize, k: usize, x: Extents) -> Option<usize> {
    let e = index[t * x.k + k];
    (e >= 0 && (e as usize) < x.e).then_some(e as usize)
}

fn slot(kind: Activation, x_t: &[f64], gate_up: &[f64], expert: usize, x: Extents) -> Slot {
    let weight = |row: usize, c: usize| gate_up[(expert * 2 * x.i + row) * x.h + c];
    let dot = |row: usize| (0..x.h).map(|c| weight(row, c) * x_t[c]).sum::<f64>();
    let g: Vec<f64> = (0..x.i).map(dot).collect();
    let u: Vec<f64> = (0..x.i).map(|j| dot(x.i + j)).collect();
    let h = g.iter().zip(&u).map(|(&g, &u)| act(kind, g) * u).collect();
    Slot { expert, g, u, h }
}

/// Forward: `y [t, h]`.
pub fn forward(
    kind: Activation,
    x: &[f64],
    gate_up: &[f64],
    down: &[f64],
    index: &[i64],
    weights: &[f64],
    ext: Extents,
) -> Vec<f64> {
    let mut y = vec![0.0; ext.t * ext.h];
    for t in 0..ext.t {
        let x_t = &x[t * ext.h..(t + 1) * ext.h];
        for k in 0..ext.k {
            let Some(e) = expert_of(index, t, k, ext) else {
                continue;
            };
            let s = slot(kind, x_t, gate_up, e, ext);
            let w = weights[t * ext.k + k];
            for c in 0..ext.h {
                let row = &down[(e * ext.h + c) * ext.i..(e * ext.h + c + 1) * ext.i];
                let out: f64 = row.iter().zip(&s.h).map(|(d, h)| d * h).sum();
                y[t * ext.h + c] += w * out;
            }
        }
    }
    y
}

/// Gradients of [`forward`] for `dy [t, h]`.
#[derive(Debug, Clone)]
pub struct Gradients {
    pub x: Vec<f64>,
    pub gate_up: Vec<f64>,
    pub down: Vec<f64>,
    pub weights: Vec<f64>,
}

/// Backward, slot by slot: `dhu = down_eᵀ·dy_t`, `dw = ⟨dhu, h⟩`, `dh = w·dhu`,
/// `dg = dh ⊙ u ⊙ act′(g)`, `du = dh ⊙ act(g)`, `dx_t += gate_eᵀ·dg + up_eᵀ·du`,
/// `d down_e += w·dy_t ⊗ h`, `d gate_e += dg ⊗ x_t`, `d up_e += du ⊗ x_t`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    kind: Activation,
    x: &[f64],
    gate_up: &[f64],
    down: &[f64],
    index: &[i64],
    weights: &[f64],
    dy: &[f64],
    ext: Extents,
) -> Gradients {
    let (h, i) = (ext.h, ext.i);
    let mut grads = Gradients {
        x: vec![0.0; ext.t * h],
        gate_up: vec![0.0; gate_up.len()],
        down: vec![0.0; down.len()],
        weights: vec![0.0; ext.t * ext.k],
    };
    for t in 0..ext.t {
        let x_t = &x[t * h..(t + 1) * h];
        let dy_t = &dy[t * h..(t + 1) * h];
        for k in 0..ext.k {
            let Some(e) = expert_of(index, t, k, ext) else {
                continue;
            };
            let s = slot(kind, x_t, gate_up, e, ext);
            let w = weights[t * ext.k + k];
            let down_at = |c: usize, j: usize| down[(s.expert * h + c) * i + j];
            let dhu: Vec<f64> = (0..i)
                .map(|j| (0..h).map(|c| down_at(c, j) * dy_t[c]).sum())
                .collect();
            grads.weights[t * ext.k + k] = dhu.iter().zip(&s.h).map(|(a, b)| a * b).sum();
            let dg: Vec<f64> = (0..i)
                .map(|j| w * dhu[j] * s.u[j] * act_grad(kind, s.g[j]))
                .collect();
            let du: Vec<f64> = (0..i).map(|j| w * dhu[j] * act(kind, s.g[j])).collect();
            for c in 0..h {
                for j in 0..i {
                    grads.down[(e * h + c) * i + j] += w * dy_t[c] * s.h[j];
                    let gate_at = (e * 2 * i + j) * h + c;
                    let up_at = (e * 2 * i + i + j) * h + c;
                    grads.x[t * h + c] += dg[j] * gate_up[gate_at] + du[j] * gate_up[up_at];
                    grads.gate_up[gate_at] += dg[j] * x_t[c];
                    grads.gate_up[up_at] += du[j] * x_t[c];
                }
            }
        }
    }
    grads
}

/// The index as [`forward`] sees it under a capacity of `capacity` slots an expert: each
/// expert keeps its first `capacity` slots in slot order (`t·K + k`), the later ones become
/// −1 (routing nowhere), as do slots already outside `0..E`.
pub fn with_capacity(index: &[i64], ext: Extents, capacity: usize) -> Vec<i64> {
    let mut taken = vec![0usize; ext.e];
    (0..ext.t * ext.k)
        .map(
            |f| match expert_of(index, f / ext.k.max(1), f % ext.k.max(1), ext) {
                Some(e) if taken[e] < capacity => {
                    taken[e] += 1;
                    e as i64
                }
                _ => -1,
            },
        )
        .collect()
}
