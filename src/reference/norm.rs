//! Reference normalizations in f64 (`x` row-major `[rows, cols]`; parameters per column).
//!
//! Forwards model the operators' roundings (the casting modes of RMSNorm round the normalized
//! value to the source dtype); backwards differentiate the real-valued formulas, as the GPU
//! backward does.

use crate::DType;
use crate::norm::CastingMode;

fn round(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::from(half::f16::from_f64(v)),
        DType::BF16 => f64::from(half::bf16::from_f64(v)),
        _ => v,
    }
}

fn factor(weight: Option<&[f64]>, offset: f64, c: usize) -> f64 {
    weight.map_or(1.0, |w| offset + w[c])
}

/// Per-row `1/sqrt(mean(x²) + eps)`.
pub fn inverse_rms(x: &[f64], rows: usize, cols: usize, eps: f64) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            let row = &x[r * cols..(r + 1) * cols];
            let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
            1.0 / (ms + eps).sqrt()
        })
        .collect()
}

/// Per-row mean and `1/sqrt(mean((x − mean)²) + eps)` (population variance of the centered
/// row).
pub fn mean_inverse_std(x: &[f64], rows: usize, cols: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    (0..rows)
        .map(|r| {
            let row = &x[r * cols..(r + 1) * cols];
            let mean = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            (mean, 1.0 / (var + eps).sqrt())
        })
        .unzip()
}

/// RMSNorm forward: `y = x · inv · (offset + w)` with the casting mode's roundings for a
/// source stored as `dtype` (Llama: `n = x·inv` rounded before the multiply; None: `n` and
/// `offset + w` rounded; Gemma: no intermediate rounding). The output is not rounded.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    x: &[f64],
    rows: usize,
    cols: usize,
    weight: Option<&[f64]>,
    offset: f64,
    eps: f64,
    casting: CastingMode,
    dtype: DType,
) -> Vec<f64> {
    let inv = inverse_rms(x, rows, cols, eps);
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let n = x[r * cols + c] * inv[r];
            let f = factor(weight, offset, c);
            y[r * cols + c] = match casting {
                CastingMode::Llama => round(n, dtype) * f,
                CastingMode::None => round(n, dtype) * round(f, dtype),
                CastingMode::Gemma => n * f,
            };
        }
    }
    y
}

/// Gradients of the row normalizations: source, weight, bias (or shift), scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    /// dL/dx.
    pub source: Vec<f64>,
    /// dL/dw (`[cols]`).
    pub weight: Vec<f64>,
    /// dL/db, or dL/dshift `[batches, cols]` for the modulated norm.
    pub bias: Vec<f64>,
    /// dL/dscale `[batches, cols]` (modulated norm only, else empty).
    pub scale: Vec<f64>,
}

/// Shared backward: `y = (1 + scale[b]) · n · g + shift[b]` with `n = (x − mean)·inv`,
/// `g = offset + w`; `centered` selects LayerNorm's mean, `modulation` (scale, batches) the
/// AdaLN factor. dx = inv · (dn − mean(dn) − n · mean(dn · n)) (the mean(dn) term only when
/// centered), dn = dy · g · (1 + scale).
#[allow(clippy::too_many_arguments)]
fn backward(
    x: &[f64],
    rows: usize,
    cols: usize,
    weight: Option<&[f64]>,
    offset: f64,
    eps: f64,
    centered: bool,
    modulation: Option<(&[f64], usize)>,
    dy: &[f64],
) -> Gradients {
    let (mean, inv) = if centered {
        mean_inverse_std(x, rows, cols, eps)
    } else {
        (vec![0.0; rows], inverse_rms(x, rows, cols, eps))
    };
    let batches = modulation.map_or(1, |m| m.1);
    let per_batch = rows / batches;
    let mut g = Gradients {
        source: vec![0.0; rows * cols],
        weight: vec![0.0; cols],
        bias: vec![0.0; batches * cols],
        scale: vec![
            0.0;
            if modulation.is_some() {
                batches * cols
            } else {
                0
            }
        ],
    };
    for r in 0..rows {
        let b = r / per_batch;
        let sc = |c: usize| modulation.map_or(1.0, |(s, _)| 1.0 + s[b * cols + c]);
        let n: Vec<f64> = (0..cols)
            .map(|c| (x[r * cols + c] - mean[r]) * inv[r])
            .collect();
        let dn: Vec<f64> = (0..cols)
            .map(|c| dy[r * cols + c] * factor(weight, offset, c) * sc(c))
            .collect();
        let c1 = if centered {
            dn.iter().sum::<f64>() / cols as f64
        } else {
            0.0
        };
        let c2 = dn.iter().zip(&n).map(|(d, n)| d * n).sum::<f64>() / cols as f64;
        for c in 0..cols {
            let i = r * cols + c;
            g.source[i] = inv[r] * (dn[c] - c1 - n[c] * c2);
            g.weight[c] += dy[i] * sc(c) * n[c];
            g.bias[b * cols + c] += dy[i];
            if modulation.is_some() {
                g.scale[b * cols + c] += dy[i] * n[c] * factor(weight, offset, c);
            }
        }
    }
    g
}

/// RMSNorm backward (the real-valued formula): dx and dw (`weight` slot, zeros when there is
/// no weight); `bias` is Σ dy, unused.
pub fn rms_norm_backward(
    x: &[f64],
    rows: usize,
    cols: usize,
    weight: Option<&[f64]>,
    offset: f64,
    eps: f64,
    dy: &[f64],
) -> Gradients {
    backward(x, rows, cols, weight, offset, eps, false, None, dy)
}

/// LayerNorm forward: `y = (x − mean) · inv · w + b`.
pub fn layer_norm(
    x: &[f64],
    rows: usize,
    cols: usize,
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
    eps: f64,
) -> Vec<f64> {
    let (mean, inv) = mean_inverse_std(x, rows, cols, eps);
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let n = (x[r * cols + c] - mean[r]) * inv[r];
            y[r * cols + c] = n * factor(weight, 0.0, c) + bias.map_or(0.0, |b| b[c]);
        }
    }
    y
}

/// LayerNorm backward: dx, dw, db.
pub fn layer_norm_backward(
    x: &[f64],
    rows: usize,
    cols: usize,
    weight: Option<&[f64]>,
    eps: f64,
    dy: &[f64],
) -> Gradients {
    backward(x, rows, cols, weight, 0.0, eps, true, None, dy)
}

/// Fused add+RMSNorm forward: returns (`y = RMSNorm(x + r)`, the unrounded sum `x + r`).
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    x: &[f64],
    residual: &[f64],
    rows: usize,
    cols: usize,
    weight: Option<&[f64]>,
    offset: f64,
    eps: f64,
    casting: CastingMode,
    dtype: DType,
) -> (Vec<f64>, Vec<f64>) {
    let s: Vec<f64> = x.iter().zip(residual).map(|(a, b)| a + b).collect();
    let y = rms_norm(&s, rows, cols, weight, offset, eps, casting, dtype);
    (y, s)
}

/// Fused add+RMSNorm backward: the RMSNorm gradient of the sum plus the residual-sum cotangent
/// `dsum` (zero when absent); dx = dresidual = that `source` gradient.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_backward(
    x: &[f64],
    residual: &[f64],
    rows: usize,
    cols: usize,
    weight: Option<&[f64]>,
    offset: f64,
    eps: f64,
    dy: &[f64],
    dsum: Option<&[f64]>,
) -> Gradients {
    let s: Vec<f64> = x.iter().zip(residual).map(|(a, b)| a + b).collect();
    let mut g = backward(&s, rows, cols, weight, offset, eps, false, None, dy);
    if let Some(d) = dsum {
        for (v, d) in g.source.iter_mut().zip(d) {
            *v += d;
        }
    }
    g
}

/// Modulated RMSNorm forward: `y = (1 + scale[b]) · x · inv · (offset + w) + shift[b]`, row
/// `r` in batch `r / (rows / batches)`.
#[allow(clippy::too_many_arguments)]
pub fn modulated_rms_norm(
    x: &[f64],
    rows: usize,
    cols: usize,
    batches: usize,
    weight: Option<&[f64]>,
    offset: f64,
    scale: &[f64],
    shift: &[f64],
    eps: f64,
) -> Vec<f64> {
    let inv = inverse_rms(x, rows, cols, eps);
    let per_batch = rows / batches;
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        let b = r / per_batch;
        for c in 0..cols {
            let n = x[r * cols + c] * inv[r];
            y[r * cols + c] =
                (1.0 + scale[b * cols + c]) * n * factor(weight, offset, c) + shift[b * cols + c];
        }
    }
    y
}

/// Modulated RMSNorm backward: dx, dw, dshift (`bias` slot), dscale.
#[allow(clippy::too_many_arguments)]
pub fn modulated_rms_norm_backward(
    x: &[f64],
    rows: usize,
    cols: usize,
    batches: usize,
    weight: Option<&[f64]>,
    offset: f64,
    scale: &[f64],
    eps: f64,
    dy: &[f64],
) -> Gradients {
    backward(
        x,
        rows,
        cols,
        weight,
        offset,
        eps,
        false,
        Some((scale, batches)),
        dy,
    )
}

/// DyT forward: `y = γ · tanh(α x) + β`.
pub fn dyt(
    x: &[f64],
    rows: usize,
    cols: usize,
    alpha: f64,
    gamma: &[f64],
    beta: Option<&[f64]>,
) -> Vec<f64> {
    (0..rows * cols)
        .map(|i| {
            let c = i % cols;
            gamma[c] * (alpha * x[i]).tanh() + beta.map_or(0.0, |b| b[c])
        })
        .collect()
}

/// DyT gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct DytGradients {
    /// dL/dx.
    pub source: Vec<f64>,
    /// dL/dα.
    pub alpha: f64,
    /// dL/dγ.
    pub gamma: Vec<f64>,
    /// dL/dβ.
    pub beta: Vec<f64>,
}

/// DyT backward: with `t = tanh(α x)`, dx = dy·γ·α·(1 − t²), dα = Σ dy·γ·x·(1 − t²),
/// dγ = Σ_rows dy·t, dβ = Σ_rows dy.
pub fn dyt_backward(
    x: &[f64],
    rows: usize,
    cols: usize,
    alpha: f64,
    gamma: &[f64],
    dy: &[f64],
) -> DytGradients {
    let mut g = DytGradients {
        source: vec![0.0; rows * cols],
        alpha: 0.0,
        gamma: vec![0.0; cols],
        beta: vec![0.0; cols],
    };
    for i in 0..rows * cols {
        let c = i % cols;
        let t = (alpha * x[i]).tanh();
        let slope = dy[i] * gamma[c] * (1.0 - t * t);
        g.source[i] = slope * alpha;
        g.alpha += slope * x[i];
        g.gamma[c] += dy[i] * t;
        g.beta[c] += dy[i];
    }
    g
}

/// PolyNorm forward: `y = w0·n(x³) + w1·n(x²) + w2·n(x) + b`, `n(u) = u/sqrt(mean(u²) + ε)`
/// per row.
pub fn poly_norm(
    x: &[f64],
    rows: usize,
    cols: usize,
    weight: &[f64],
    bias: Option<f64>,
    eps: f64,
) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let inv = poly_inverses(row, eps);
        for c in 0..cols {
            let v = row[c];
            y[r * cols + c] = (0..3)
                .map(|k| weight[k] * v.powi(3 - k as i32) * inv[k])
                .sum::<f64>()
                + bias.unwrap_or(0.0);
        }
    }
    y
}

/// Inverse RMS of `x³`, `x²`, `x` over one row.
pub fn poly_inverses(row: &[f64], eps: f64) -> [f64; 3] {
    let n = row.len() as f64;
    [3, 2, 1].map(|p| {
        let ms = row.iter().map(|v| v.powi(2 * p)).sum::<f64>() / n;
        1.0 / (ms + eps).sqrt()
    })
}

/// PolyNorm gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct PolyGradients {
    /// dL/dx.
    pub source: Vec<f64>,
    /// dL/dw (`[3]`).
    pub weight: Vec<f64>,
    /// dL/db.
    pub bias: f64,
}

/// PolyNorm backward: for each power `p` (weight `w_k`, `u = x^p`, `n = u·inv`):
/// du = inv·(dn − n·mean(dn·n)) with dn = dy·w_k, and dx = Σ_p du·p·x^(p−1);
/// dw_k = Σ dy·n, db = Σ dy.
pub fn poly_norm_backward(
    x: &[f64],
    rows: usize,
    cols: usize,
    weight: &[f64],
    eps: f64,
    dy: &[f64],
) -> PolyGradients {
    let mut g = PolyGradients {
        source: vec![0.0; rows * cols],
        weight: vec![0.0; 3],
        bias: 0.0,
    };
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let d = &dy[r * cols..(r + 1) * cols];
        let inv = poly_inverses(row, eps);
        for (k, p) in [3, 2, 1].into_iter().enumerate() {
            let n: Vec<f64> = row.iter().map(|v| v.powi(p) * inv[k]).collect();
            let m = (0..cols).map(|c| d[c] * weight[k] * n[c]).sum::<f64>() / cols as f64;
            for c in 0..cols {
                let du = inv[k] * (d[c] * weight[k] - n[c] * m);
                g.source[r * cols + c] += du * f64::from(p) * row[c].powi(p - 1);
                g.weight[k] += d[c] * n[c];
            }
        }
        g.bias += d.iter().sum::<f64>();
    }
    g
}

/// GroupNorm forward over `x` = `[samples, channels, spatial]`: each (sample, group) run of
/// `channels / groups` channels is centered and scaled by its population variance, then
/// `y = n · w[ch] + b[ch]`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm(
    x: &[f64],
    samples: usize,
    channels: usize,
    spatial: usize,
    groups: usize,
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
    eps: f64,
) -> Vec<f64> {
    let width = channels / groups * spatial;
    let (mean, inv) = mean_inverse_std(x, samples * groups, width, eps);
    (0..x.len())
        .map(|i| {
            let ch = (i / spatial) % channels;
            let row = i / width;
            (x[i] - mean[row]) * inv[row] * factor(weight, 0.0, ch) + bias.map_or(0.0, |b| b[ch])
        })
        .collect()
}

/// GroupNorm backward: per (sample, group) row, dn = dy·w\[ch\],
/// dx = inv·(dn − mean(dn) − n·mean(dn·n)); dw\[ch\] = Σ dy·n and db\[ch\] = Σ dy over samples
/// and positions (`weight` and `bias` slots; `scale` empty).
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward(
    x: &[f64],
    samples: usize,
    channels: usize,
    spatial: usize,
    groups: usize,
    weight: Option<&[f64]>,
    eps: f64,
    dy: &[f64],
) -> Gradients {
    let width = channels / groups * spatial;
    let rows = samples * groups;
    let (mean, inv) = mean_inverse_std(x, rows, width, eps);
    let mut g = Gradients {
        source: vec![0.0; x.len()],
        weight: vec![0.0; channels],
        bias: vec![0.0; channels],
        scale: Vec::new(),
    };
    for r in 0..rows {
        let range = r * width..(r + 1) * width;
        let ch = |i: usize| (i / spatial) % channels;
        let n: Vec<f64> = range.clone().map(|i| (x[i] - mean[r]) * inv[r]).collect();
        let dn: Vec<f64> = range
            .clone()
            .map(|i| dy[i] * factor(weight, 0.0, ch(i)))
            .collect();
        let c1 = dn.iter().sum::<f64>() / width as f64;
        let c2 = dn.iter().zip(&n).map(|(d, n)| d * n).sum::<f64>() / width as f64;
        for (k, i) in range.enumerate() {
            g.source[i] = inv[r] * (dn[k] - c1 - n[k] * c2);
            g.weight[ch(i)] += dy[i] * n[k];
            g.bias[ch(i)] += dy[i];
        }
    }
    g
}
