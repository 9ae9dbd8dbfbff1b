//! f64 reference of the gated MLP: `y = (act(x·W_gᵀ) ⊙ (x·W_uᵀ)) · W_dᵀ`.
//!
//! Row-major: `x [t, h]`, `W_g`, `W_u [i, h]`, `W_d [h, i]`, `y [t, h]`.

use super::activation;
use super::matmul::{self, Problem};
use crate::activation::Activation;

/// `op(a)·op(b)` through the matmul reference: `[m, n]`, `a` stored `[m, k]` (or `[k, m]`
/// when `ta`), `b` stored `[k, n]` (or `[n, k]` when `tb`).
fn product(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize), ta: bool, tb: bool) -> Vec<f64> {
    let problem = Problem {
        transpose_a: ta,
        transpose_b: tb,
        ..Problem::new(m, n, k)
    };
    matmul::forward(&problem, a, b, None)
}

/// `a·bᵀ` for `a [m, k]`, `b [n, k]`.
fn times_transposed(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    product(a, b, (m, n, k), false, true)
}

/// `aᵀ·b` for `a [k, m]`, `b [k, n]`.
fn transposed_times(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    product(a, b, (m, n, k), true, false)
}

/// `a·b` for `a [m, k]`, `b [k, n]`.
fn times(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    product(a, b, (m, n, k), false, false)
}

/// The extents of one MLP call: `t` rows, hidden `h`, intermediate `i`.
#[derive(Debug, Clone, Copy)]
pub struct Extents {
    pub t: usize,
    pub h: usize,
    pub i: usize,
}

/// Forward: `y [t, h]`.
pub fn forward(
    kind: Activation,
    x: &[f64],
    gate: &[f64],
    up: &[f64],
    down: &[f64],
    e: Extents,
) -> Vec<f64> {
    let g = times_transposed(x, gate, e.t, e.i, e.h);
    let u = times_transposed(x, up, e.t, e.i, e.h);
    let hidden = activation::forward(kind, &g, Some(&u), 1.0, 1.0);
    times_transposed(&hidden, down, e.t, e.h, e.i)
}

/// Gradients of [`forward`] for `dy [t, h]`.
#[derive(Debug, Clone)]
pub struct Gradients {
    pub x: Vec<f64>,
    pub gate: Vec<f64>,
    pub up: Vec<f64>,
    pub down: Vec<f64>,
}

/// Backward: `dh = dy·W_d`, `dW_d = dyᵀ·h`, `(dg, du)` through the gated activation,
/// `dx = dg·W_g + du·W_u`, `dW_g = dgᵀ·x`, `dW_u = duᵀ·x`.
pub fn backward(
    kind: Activation,
    x: &[f64],
    gate: &[f64],
    up: &[f64],
    down: &[f64],
    dy: &[f64],
    e: Extents,
) -> Gradients {
    let g = times_transposed(x, gate, e.t, e.i, e.h);
    let u = times_transposed(x, up, e.t, e.i, e.h);
    let hidden = activation::forward(kind, &g, Some(&u), 1.0, 1.0);
    let dh = times(dy, down, e.t, e.i, e.h);
    let d_down = transposed_times(dy, &hidden, e.h, e.i, e.t);
    let (dg, du) = activation::backward(kind, &g, Some(&u), &dh, 1.0, 1.0);
    let du = du.expect("gated backward returns the up gradient");
    let dx_g = times(&dg, gate, e.t, e.h, e.i);
    let dx_u = times(&du, up, e.t, e.h, e.i);
    Gradients {
        x: dx_g.iter().zip(&dx_u).map(|(a, b)| a + b).collect(),
        gate: transposed_times(&dg, x, e.i, e.h, e.t),
        up: transposed_times(&du, x, e.i, e.h, e.t),
        down: d_down,
    }
}
