//! Reference losses and normalizers in f64 (`x` is row-major `[rows, cols]`), forward and
//! analytic backward, for the `loss` family.

use crate::loss::{DivReduction, Reduction};

fn row(x: &[f64], r: usize, cols: usize) -> &[f64] {
    &x[r * cols..(r + 1) * cols]
}

/// `(max, log Σ exp(x − max))` of one row.
pub fn row_stats(v: &[f64]) -> (f64, f64) {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = v.iter().map(|&a| (a - m).exp()).sum();
    (m, s.ln())
}

/// Softmax of each row.
pub fn softmax(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let v = row(x, r, cols);
        let (m, l) = row_stats(v);
        out.extend(v.iter().map(|&a| ((a - m) - l).exp()));
    }
    out
}

/// Log-softmax of each row: `(x − max) − log Σ exp(x − max)`.
pub fn log_softmax(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let v = row(x, r, cols);
        let (m, l) = row_stats(v);
        out.extend(v.iter().map(|&a| (a - m) - l));
    }
    out
}

/// Gradient of softmax (`log = false`) or log-softmax (`log = true`) at `x` for cotangent `dy`.
pub fn softmax_backward(x: &[f64], dy: &[f64], rows: usize, cols: usize, log: bool) -> Vec<f64> {
    let p = softmax(x, rows, cols);
    let mut dx = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let (p, g) = (row(&p, r, cols), row(dy, r, cols));
        if log {
            let s: f64 = g.iter().sum();
            dx.extend(p.iter().zip(g).map(|(p, g)| g - p * s));
        } else {
            let s: f64 = p.iter().zip(g).map(|(p, g)| p * g).sum();
            dx.extend(p.iter().zip(g).map(|(p, g)| p * (g - s)));
        }
    }
    dx
}

/// Gradient of softmax (`log = false`) or log-softmax (`log = true`) from the forward's output
/// `y` for cotangent `dy`: the probabilities are `y` (softmax) or `exp(y)` (log-softmax);
/// softmax `dx = y (dy − Σ dy·y)`, log-softmax `dx = dy − exp(y) Σ dy`.
pub fn softmax_backward_from_output(
    y: &[f64],
    dy: &[f64],
    rows: usize,
    cols: usize,
    log: bool,
) -> Vec<f64> {
    let mut dx = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let (y, g) = (row(y, r, cols), row(dy, r, cols));
        if log {
            let s: f64 = g.iter().sum();
            dx.extend(y.iter().zip(g).map(|(y, g)| g - y.exp() * s));
        } else {
            let s: f64 = y.iter().zip(g).map(|(y, g)| y * g).sum();
            dx.extend(y.iter().zip(g).map(|(y, g)| y * (g - s)));
        }
    }
    dx
}

/// The sparsemax threshold τ of one row: sort descending, take the largest `k` with
/// `1 + k·z_k > Σ_{j ≤ k} z_j`, then `τ = (Σ_{j ≤ k} z_j − 1) / k`.
pub fn sparsemax_threshold(v: &[f64]) -> f64 {
    let mut z = v.to_vec();
    z.sort_by(|a, b| b.total_cmp(a));
    let (mut k, mut sum_k, mut cum) = (0, 0.0, 0.0);
    for (j, &zj) in z.iter().enumerate() {
        cum += zj;
        if 1.0 + (j + 1) as f64 * zj > cum {
            k = j + 1;
            sum_k = cum;
        }
    }
    (sum_k - 1.0) / k as f64
}

/// Sparsemax of each row: `max(x − τ, 0)`.
pub fn sparsemax(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let v = row(x, r, cols);
        let tau = sparsemax_threshold(v);
        out.extend(v.iter().map(|&a| (a - tau).max(0.0)));
    }
    out
}

/// Gradient of sparsemax: on the support `{x > τ}`, `dy − mean_support(dy)`; 0 elsewhere.
pub fn sparsemax_backward(x: &[f64], dy: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut dx = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let (v, g) = (row(x, r, cols), row(dy, r, cols));
        let tau = sparsemax_threshold(v);
        let support: Vec<bool> = v.iter().map(|&a| a > tau).collect();
        let k = support.iter().filter(|&&s| s).count();
        let mean = if k > 0 {
            g.iter()
                .zip(&support)
                .filter(|(_, s)| **s)
                .map(|(g, _)| g)
                .sum::<f64>()
                / k as f64
        } else {
            0.0
        };
        dx.extend(
            g.iter()
                .zip(&support)
                .map(|(g, &s)| if s { g - mean } else { 0.0 }),
        );
    }
    dx
}

/// Cross-entropy configuration (the f64 mirror of `loss::CrossEntropyOptions`).
#[derive(Debug, Clone)]
pub struct CrossEntropyConfig {
    /// Skipped target value.
    pub ignore_index: i32,
    /// Label smoothing ε.
    pub label_smoothing: f64,
    /// z-loss coefficient.
    pub z_loss: f64,
    /// Softcap (`None` = off).
    pub softcap: Option<f64>,
    /// Class weights.
    pub weight: Option<Vec<f64>>,
    /// Reduction.
    pub reduction: Reduction,
}

impl Default for CrossEntropyConfig {
    fn default() -> Self {
        CrossEntropyConfig {
            ignore_index: -100,
            label_smoothing: 0.0,
            z_loss: 0.0,
            softcap: None,
            weight: None,
            reduction: Reduction::Mean,
        }
    }
}

/// Reference cross-entropy results.
#[derive(Debug, Clone)]
pub struct CrossEntropyResult {
    /// Loss: one value (sum/mean) or one per row (none).
    pub loss: Vec<f64>,
    /// z-loss term, reduced like the loss.
    pub z_loss: Vec<f64>,
    /// Correct / counted rows (0 when none counts).
    pub accuracy: f64,
    /// Argmax of the raw logits (lowest index on ties), −1 on ignored rows.
    pub predicted: Vec<i32>,
}

fn capped(v: f64, cap: Option<f64>) -> f64 {
    match cap {
        Some(c) => c * (v / c).tanh(),
        None => v,
    }
}

fn counted(t: i32, cfg: &CrossEntropyConfig, cols: usize) -> bool {
    t != cfg.ignore_index && t >= 0 && (t as usize) < cols
}

struct CeRow {
    ce: f64,
    z: f64,
    wy: f64,
}

fn ce_row(x: &[f64], t: usize, cfg: &CrossEntropyConfig) -> CeRow {
    let cols = x.len();
    let z: Vec<f64> = x.iter().map(|&v| capped(v, cfg.softcap)).collect();
    let (m, l) = row_stats(&z);
    let w = |c: usize| cfg.weight.as_ref().map_or(1.0, |w| w[c]);
    let eps = cfg.label_smoothing;
    let nll = |c: usize| (m - z[c]) + l;
    let mut ce = (1.0 - eps) * w(t) * nll(t);
    if eps > 0.0 {
        ce += eps / cols as f64 * (0..cols).map(|c| w(c) * nll(c)).sum::<f64>();
    }
    let lse = m + l;
    CeRow {
        ce,
        z: cfg.z_loss * lse * lse,
        wy: w(t),
    }
}

/// The mean denominators `(cross-entropy part, z-loss part)` (0 when nothing counts).
fn ce_denominators(
    x: &[f64],
    targets: &[i32],
    cols: usize,
    cfg: &CrossEntropyConfig,
) -> (f64, f64) {
    let mut n = 0.0;
    let mut wsum = 0.0;
    for (r, &t) in targets.iter().enumerate() {
        if counted(t, cfg, cols) {
            n += 1.0;
            wsum += ce_row(row(x, r, cols), t as usize, cfg).wy;
        }
    }
    (if cfg.weight.is_some() { wsum } else { n }, n)
}

fn inv(d: f64) -> f64 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// Reference cross-entropy with integer targets.
pub fn cross_entropy(
    x: &[f64],
    targets: &[i32],
    rows: usize,
    cols: usize,
    cfg: &CrossEntropyConfig,
) -> CrossEntropyResult {
    let mut ce_rows = vec![0.0; rows];
    let mut z_rows = vec![0.0; rows];
    let mut predicted = vec![-1; rows];
    let (mut n, mut correct) = (0.0, 0.0);
    for r in 0..rows {
        let v = row(x, r, cols);
        let t = targets[r];
        if !counted(t, cfg, cols) {
            continue;
        }
        let res = ce_row(v, t as usize, cfg);
        ce_rows[r] = res.ce;
        z_rows[r] = res.z;
        let mut arg = 0;
        for c in 1..cols {
            if v[c] > v[arg] {
                arg = c;
            }
        }
        predicted[r] = arg as i32;
        n += 1.0;
        if arg == t as usize {
            correct += 1.0;
        }
    }
    let accuracy = if n > 0.0 { correct / n } else { 0.0 };
    let (loss, z_loss) = match cfg.reduction {
        Reduction::None => (
            ce_rows.iter().zip(&z_rows).map(|(a, b)| a + b).collect(),
            z_rows,
        ),
        Reduction::Sum => {
            let (c, z): (f64, f64) = (ce_rows.iter().sum(), z_rows.iter().sum());
            (vec![c + z], vec![z])
        }
        Reduction::Mean => {
            let (dc, dz) = ce_denominators(x, targets, cols, cfg);
            let (c, z): (f64, f64) = (ce_rows.iter().sum(), z_rows.iter().sum());
            let (c, z) = (c * inv(dc), z * inv(dz));
            (vec![c + z], vec![z])
        }
    };
    CrossEntropyResult {
        loss,
        z_loss,
        accuracy,
        predicted,
    }
}

/// Gradient of [`cross_entropy`]'s loss with respect to `x` for `cotangent` (one value for
/// sum/mean, one per row for none).
pub fn cross_entropy_backward(
    x: &[f64],
    targets: &[i32],
    rows: usize,
    cols: usize,
    cfg: &CrossEntropyConfig,
    cotangent: &[f64],
) -> Vec<f64> {
    let (dc, dz) = match cfg.reduction {
        Reduction::Mean => {
            let (a, b) = ce_denominators(x, targets, cols, cfg);
            (inv(a), inv(b))
        }
        _ => (1.0, 1.0),
    };
    let eps = cfg.label_smoothing;
    let w = |c: usize| cfg.weight.as_ref().map_or(1.0, |w| w[c]);
    let wsum: f64 = (0..cols).map(w).sum();
    let mut dx = vec![0.0; rows * cols];
    for r in 0..rows {
        let t = targets[r];
        if !counted(t, cfg, cols) {
            continue;
        }
        let t = t as usize;
        let g = if cfg.reduction == Reduction::None {
            cotangent[r]
        } else {
            cotangent[0]
        };
        let z: Vec<f64> = row(x, r, cols)
            .iter()
            .map(|&v| capped(v, cfg.softcap))
            .collect();
        let (m, l) = row_stats(&z);
        let lse = m + l;
        for c in 0..cols {
            let p = ((z[c] - m) - l).exp();
            let onehot = if c == t { 1.0 } else { 0.0 };
            let d_ce = (1.0 - eps) * w(t) * (p - onehot) + eps / cols as f64 * (wsum * p - w(c));
            let d_z = 2.0 * cfg.z_loss * lse * p;
            let mut d = g * (d_ce * dc + d_z * dz);
            if let Some(cap) = cfg.softcap {
                let th = z[c] / cap;
                d *= 1.0 - th * th;
            }
            dx[r * cols + c] = d;
        }
    }
    dx
}

/// Reference soft-target cross-entropy: `Σ_c t_c (lse − x_c)` per row, reduced (mean over rows).
pub fn cross_entropy_soft(
    x: &[f64],
    t: &[f64],
    rows: usize,
    cols: usize,
    reduction: Reduction,
) -> Vec<f64> {
    let per_row: Vec<f64> = (0..rows)
        .map(|r| {
            let (v, tt) = (row(x, r, cols), row(t, r, cols));
            let (m, l) = row_stats(v);
            v.iter().zip(tt).map(|(v, t)| t * ((m - v) + l)).sum()
        })
        .collect();
    match reduction {
        Reduction::None => per_row,
        Reduction::Sum => vec![per_row.iter().sum()],
        Reduction::Mean => vec![per_row.iter().sum::<f64>() * inv(rows as f64)],
    }
}

/// Gradient of [`cross_entropy_soft`]: `g·((Σ t)·p − t)` (scaled by 1/rows for mean).
pub fn cross_entropy_soft_backward(
    x: &[f64],
    t: &[f64],
    rows: usize,
    cols: usize,
    reduction: Reduction,
    cotangent: &[f64],
) -> Vec<f64> {
    let p = softmax(x, rows, cols);
    let mut dx = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let (g, scale) = match reduction {
            Reduction::None => (cotangent[r], 1.0),
            Reduction::Sum => (cotangent[0], 1.0),
            Reduction::Mean => (cotangent[0], inv(rows as f64)),
        };
        let (pr, tr) = (row(&p, r, cols), row(t, r, cols));
        let ts: f64 = tr.iter().sum();
        dx.extend(pr.iter().zip(tr).map(|(p, t)| g * scale * (ts * p - t)));
    }
    dx
}

/// Which divergence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Divergence {
    /// KL with `input` as log-probabilities; `log_target` says how the target is given.
    Kl {
        /// Target as log-probabilities.
        log_target: bool,
    },
    /// Generalized JSD with weight β (inputs are log-probabilities).
    Jsd {
        /// β in [0, 1].
        beta: f64,
    },
    /// Total variation distance (inputs are probabilities).
    Tvd,
}

/// `(loss, d loss / d x)` of one element.
pub fn divergence_element(kind: Divergence, x: f64, t: f64) -> (f64, f64) {
    match kind {
        Divergence::Kl { log_target: true } => {
            let p = t.exp();
            (p * (t - x), -p)
        }
        Divergence::Kl { log_target: false } => {
            let xlogx = if t == 0.0 { 0.0 } else { t * t.ln() };
            (xlogx - t * x, -t)
        }
        Divergence::Jsd { beta: 0.0 } => {
            let p = t.exp();
            (p * (t - x), -p)
        }
        Divergence::Jsd { beta: 1.0 } => {
            let q = x.exp();
            (q * (x - t), q * (x - t) + q)
        }
        Divergence::Jsd { beta } => {
            let (q, p) = (x.exp(), t.exp());
            let log_m = (beta * p + (1.0 - beta) * q).ln();
            (
                beta * p * (t - log_m) + (1.0 - beta) * q * (x - log_m),
                (1.0 - beta) * q * (x - log_m),
            )
        }
        Divergence::Tvd => {
            let d = x - t;
            let s = if d > 0.0 {
                0.5
            } else if d < 0.0 {
                -0.5
            } else {
                0.0
            };
            (0.5 * d.abs(), s)
        }
    }
}

fn div_counted(labels: Option<&[i32]>, ignore_index: i32, r: usize) -> bool {
    labels.is_none_or(|l| l[r] != ignore_index)
}

fn div_denominator(reduction: DivReduction, n: f64, cols: usize) -> f64 {
    match reduction {
        DivReduction::None | DivReduction::Sum => 1.0,
        DivReduction::Mean => n * cols as f64,
        DivReduction::BatchMean => n,
    }
}

/// Reference divergence loss: elementwise (none) or one reduced value.
#[allow(clippy::too_many_arguments)]
pub fn divergence(
    kind: Divergence,
    x: &[f64],
    t: &[f64],
    rows: usize,
    cols: usize,
    labels: Option<&[i32]>,
    ignore_index: i32,
    reduction: DivReduction,
) -> Vec<f64> {
    let mut elems = vec![0.0; rows * cols];
    let mut n = 0.0;
    for r in 0..rows {
        if !div_counted(labels, ignore_index, r) {
            continue;
        }
        n += 1.0;
        for c in 0..cols {
            let i = r * cols + c;
            elems[i] = divergence_element(kind, x[i], t[i]).0;
        }
    }
    if reduction == DivReduction::None {
        return elems;
    }
    let total: f64 = elems.iter().sum();
    vec![total * inv(div_denominator(reduction, n, cols))]
}

/// Gradient of [`divergence`] with respect to `x` (the target is frozen).
#[allow(clippy::too_many_arguments)]
pub fn divergence_backward(
    kind: Divergence,
    x: &[f64],
    t: &[f64],
    rows: usize,
    cols: usize,
    labels: Option<&[i32]>,
    ignore_index: i32,
    reduction: DivReduction,
    cotangent: &[f64],
) -> Vec<f64> {
    let n = (0..rows)
        .filter(|&r| div_counted(labels, ignore_index, r))
        .count() as f64;
    let scale = inv(div_denominator(reduction, n, cols));
    let mut dx = vec![0.0; rows * cols];
    for r in 0..rows {
        if !div_counted(labels, ignore_index, r) {
            continue;
        }
        for c in 0..cols {
            let i = r * cols + c;
            let g = if reduction == DivReduction::None {
                cotangent[i]
            } else {
                cotangent[0]
            };
            dx[i] = divergence_element(kind, x[i], t[i]).1 * g * scale;
        }
    }
    dx
}
