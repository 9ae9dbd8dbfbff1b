//! f64 references of the activations (see [`crate::activation`]), forward and analytic
//! backward, plus the f64 `erf`/`erfc` they need (Rust's std has none).

use crate::activation::Activation;

const FRAC_2_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// The error function. `|x| < 2.5`: its Maclaurin series `2/√π Σ (−1)ⁿ x^(2n+1)/(n!(2n+1))`
/// summed until the terms vanish (cancellation costs about 1e-15 absolute at |x| = 2.5);
/// otherwise `1 − erfc(|x|)` with the sign of `x`.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x.abs() < 2.5 {
        let s = x * x;
        let mut power = x; // x^(2n+1) / n!, with sign
        let mut sum = x;
        for n in 1..200 {
            power *= -s / n as f64;
            let term = power / (2 * n + 1) as f64;
            sum += term;
            if term.abs() < 1e-18 * sum.abs() {
                break;
            }
        }
        return FRAC_2_SQRT_PI * sum;
    }
    x.signum() * (1.0 - erfc(x.abs()))
}

/// The complementary error function `1 − erf(x)`, with relative accuracy for large `x`:
/// for `x ≥ 2.5` the continued fraction `erfc(x) = e^(−x²)/√π · 1/(x + ½/(x + 1/(x + (3/2)/(x +
/// …))))`, evaluated bottom-up from depth 300; below, `1 − erf(x)`.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 2.5 {
        return 1.0 - erf(x);
    }
    let mut f = x;
    for k in (1..=300).rev() {
        f = x + (k as f64 / 2.0) / f;
    }
    (-x * x).exp() / (std::f64::consts::PI.sqrt() * f)
}

/// The standard normal CDF `Φ(x) = ½·erfc(−x/√2)`.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044715;

/// `act(x)`.
pub fn act(kind: Activation, x: f64) -> f64 {
    match kind {
        Activation::Silu => x * sigmoid(x),
        Activation::Sigmoid => sigmoid(x),
        Activation::GeluTanh => {
            0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh())
        }
        Activation::Gelu => x * normal_cdf(x),
        Activation::QuickGelu => x * sigmoid(1.702 * x),
        Activation::Relu => x.max(0.0),
        Activation::ReluSquared => x.max(0.0).powi(2),
        Activation::Tanh => x.tanh(),
    }
}

/// `act'(x)` (ReLU and ReLU²: 0 at 0).
pub fn act_grad(kind: Activation, x: f64) -> f64 {
    match kind {
        Activation::Silu => {
            let s = sigmoid(x);
            s * (1.0 + x * (1.0 - s))
        }
        Activation::Sigmoid => {
            let s = sigmoid(x);
            s * (1.0 - s)
        }
        Activation::GeluTanh => {
            let t = (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh();
            0.5 * (1.0 + t)
                + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x)
        }
        Activation::Gelu => {
            normal_cdf(x) + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
        }
        Activation::QuickGelu => {
            let s = sigmoid(1.702 * x);
            s + 1.702 * x * s * (1.0 - s)
        }
        Activation::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::ReluSquared => 2.0 * x.max(0.0),
        Activation::Tanh => 1.0 - x.tanh().powi(2),
    }
}

/// Forward: `m_d·act(m_g·gate)`, times `up` when given.
pub fn forward(kind: Activation, gate: &[f64], up: Option<&[f64]>, gm: f64, dm: f64) -> Vec<f64> {
    gate.iter()
        .enumerate()
        .map(|(i, &g)| dm * act(kind, gm * g) * up.map_or(1.0, |u| u[i]))
        .collect()
}

/// Backward of [`forward`]: `(dgate, dup)`; `dup` is `None` for the unary form.
pub fn backward(
    kind: Activation,
    gate: &[f64],
    up: Option<&[f64]>,
    dy: &[f64],
    gm: f64,
    dm: f64,
) -> (Vec<f64>, Option<Vec<f64>>) {
    let dgate = gate
        .iter()
        .enumerate()
        .map(|(i, &g)| dy[i] * dm * up.map_or(1.0, |u| u[i]) * act_grad(kind, gm * g) * gm)
        .collect();
    let dup = up.map(|_| {
        gate.iter()
            .enumerate()
            .map(|(i, &g)| dy[i] * dm * act(kind, gm * g))
            .collect()
    });
    (dgate, dup)
}

/// Split a packed `[rows, 2·width]` input into (gate, up), each `[rows, width]`.
pub fn unpack(x: &[f64], width: usize) -> (Vec<f64>, Vec<f64>) {
    let mut gate = Vec::with_capacity(x.len() / 2);
    let mut up = Vec::with_capacity(x.len() / 2);
    for row in x.chunks(2 * width.max(1)) {
        gate.extend_from_slice(&row[..width]);
        up.extend_from_slice(&row[width..]);
    }
    (gate, up)
}

/// Join (gate, up) rows of `width` into the packed `[rows, 2·width]` layout.
pub fn pack(gate: &[f64], up: &[f64], width: usize) -> Vec<f64> {
    let mut x = Vec::with_capacity(gate.len() * 2);
    for (g, u) in gate.chunks(width.max(1)).zip(up.chunks(width.max(1))) {
        x.extend_from_slice(g);
        x.extend_from_slice(u);
    }
    x
}

/// Packed forward: `x` is `[rows, 2·width]`, output `[rows, width]`.
pub fn packed_forward(kind: Activation, x: &[f64], width: usize, gm: f64, dm: f64) -> Vec<f64> {
    let (g, u) = unpack(x, width);
    forward(kind, &g, Some(&u), gm, dm)
}

/// Packed backward: the gradient of `x` in its `[rows, 2·width]` layout.
pub fn packed_backward(
    kind: Activation,
    x: &[f64],
    width: usize,
    dy: &[f64],
    gm: f64,
    dm: f64,
) -> Vec<f64> {
    let (g, u) = unpack(x, width);
    let (dg, du) = backward(kind, &g, Some(&u), dy, gm, dm);
    pack(&dg, &du.expect("gated"), width)
}
