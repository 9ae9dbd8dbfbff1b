//! Attention residuals in f64: per token, the softmax over N blocks of
//! `w_query · (round(v_i / rms(v_i)) ⊙ w_norm)` and the blocks' weighted sum; the analytic
//! backward with the rounding passed straight through to the blocks (the parameter gradients
//! use the rounded keys, as the forward does).

use crate::DType;

/// A problem's shapes and settings: `blocks` values `[n, tokens, d]`; `dtype` the blocks'
/// storage dtype (the normalized values are rounded to it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnResConfig {
    /// Blocks N.
    pub n: usize,
    /// Tokens.
    pub tokens: usize,
    /// Width D.
    pub d: usize,
    /// ε of the RMS normalization.
    pub eps: f64,
    /// The blocks' storage dtype.
    pub dtype: DType,
}

fn round(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::from(half::f16::from_f32(x as f32)),
        DType::BF16 => f64::from(half::bf16::from_f32(x as f32)),
        _ => x,
    }
}

/// Per token: each block's inverse RMS r_i and weight α_i.
struct Token {
    r: Vec<f64>,
    alpha: Vec<f64>,
}

fn token(v: &[f64], t: usize, q: &[f64], w: &[f64], c: &AttnResConfig) -> Token {
    let row = |i: usize| &v[(i * c.tokens + t) * c.d..(i * c.tokens + t + 1) * c.d];
    let r: Vec<f64> = (0..c.n)
        .map(|i| 1.0 / (row(i).iter().map(|x| x * x).sum::<f64>() / c.d as f64 + c.eps).sqrt())
        .collect();
    let s: Vec<f64> = (0..c.n)
        .map(|i| {
            (0..c.d)
                .map(|k| q[k] * round(row(i)[k] * r[i], c.dtype) * w[k])
                .sum()
        })
        .collect();
    let top = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - top).exp()).collect();
    let total: f64 = e.iter().sum();
    Token {
        r,
        alpha: e.iter().map(|x| x / total).collect(),
    }
}

/// `h`, `[tokens, d]`.
pub fn forward(v: &[f64], q: &[f64], w: &[f64], c: &AttnResConfig) -> Vec<f64> {
    let mut h = vec![0.0; c.tokens * c.d];
    for t in 0..c.tokens {
        let tk = token(v, t, q, w, c);
        for i in 0..c.n {
            for k in 0..c.d {
                h[t * c.d + k] += tk.alpha[i] * v[(i * c.tokens + t) * c.d + k];
            }
        }
    }
    h
}

/// (d blocks `[n, tokens, d]`, d w_query, d w_norm) of `⟨dh, h⟩`.
pub fn backward(
    v: &[f64],
    q: &[f64],
    w: &[f64],
    dh: &[f64],
    c: &AttnResConfig,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (d, n) = (c.d, c.n);
    let mut dv = vec![0.0; v.len()];
    let mut dq = vec![0.0; d];
    let mut dw = vec![0.0; d];
    for t in 0..c.tokens {
        let tk = token(v, t, q, w, c);
        let g = &dh[t * d..(t + 1) * d];
        let at = |i: usize, k: usize| (i * c.tokens + t) * d + k;
        let da: Vec<f64> = (0..n)
            .map(|i| (0..d).map(|k| g[k] * v[at(i, k)]).sum())
            .collect();
        let mix: f64 = (0..n).map(|i| tk.alpha[i] * da[i]).sum();
        for i in 0..n {
            let ds = tk.alpha[i] * (da[i] - mix);
            let r = tk.r[i];
            // RMSNorm's backward of dk = ds · q ⊙ w: r·dk − r³ (Σ dk·v / d) v.
            let c_sum: f64 = (0..d).map(|k| ds * q[k] * w[k] * v[at(i, k)]).sum::<f64>() / d as f64;
            for k in 0..d {
                let x = v[at(i, k)];
                dv[at(i, k)] = tk.alpha[i] * g[k] + r * ds * q[k] * w[k] - r * r * r * c_sum * x;
                let nr = round(x * r, c.dtype);
                dq[k] += ds * nr * w[k];
                dw[k] += ds * q[k] * nr;
            }
        }
    }
    (dv, dq, dw)
}
