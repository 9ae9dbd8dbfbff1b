//! Reference fused linear losses in f64: the logits are materialized in full (`x·Wᵀ + b`),
//! then the loss references of [`crate::reference::loss`] apply, and the gradients go back
//! through the product. Row-major throughout: `x` is `[rows, hidden]`, `w` is
//! `[vocab, hidden]`, logits `[rows, vocab]`.

use crate::reference::loss::{
    self as loss, CrossEntropyConfig, CrossEntropyResult, Divergence, log_softmax, softmax_backward,
};

/// `logits[r, v] = Σ_h x[r, h]·w[v, h] + bias[v]`.
pub fn linear(
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    rows: usize,
    hidden: usize,
    vocab: usize,
) -> Vec<f64> {
    let mut logits = vec![0.0; rows * vocab];
    for r in 0..rows {
        let xr = &x[r * hidden..(r + 1) * hidden];
        for v in 0..vocab {
            let wv = &w[v * hidden..(v + 1) * hidden];
            let dot: f64 = xr.iter().zip(wv).map(|(a, b)| a * b).sum();
            logits[r * vocab + v] = dot + bias.map_or(0.0, |b| b[v]);
        }
    }
    logits
}

/// Gradients of a fused linear loss with respect to the input, the weight and the bias.
#[derive(Debug, Clone)]
pub struct LinearGradients {
    /// `[rows, hidden]`.
    pub input: Vec<f64>,
    /// `[vocab, hidden]`.
    pub weight: Vec<f64>,
    /// `[vocab]`.
    pub bias: Vec<f64>,
}

/// Back through [`linear`]: `dx = dlogits·W`, `dW = dlogitsᵀ·x`, `db = Σ_r dlogits[r, ·]`.
pub fn linear_backward(
    x: &[f64],
    w: &[f64],
    dlogits: &[f64],
    rows: usize,
    hidden: usize,
    vocab: usize,
) -> LinearGradients {
    let mut dx = vec![0.0; rows * hidden];
    let mut dw = vec![0.0; vocab * hidden];
    let mut db = vec![0.0; vocab];
    for r in 0..rows {
        for v in 0..vocab {
            let g = dlogits[r * vocab + v];
            db[v] += g;
            for h in 0..hidden {
                dx[r * hidden + h] += g * w[v * hidden + h];
                dw[v * hidden + h] += g * x[r * hidden + h];
            }
        }
    }
    LinearGradients {
        input: dx,
        weight: dw,
        bias: db,
    }
}

/// One linear head: input `[rows, hidden]`, weight `[vocab, hidden]`, optional bias.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// `[rows, hidden]`.
    pub x: &'a [f64],
    /// `[vocab, hidden]`.
    pub w: &'a [f64],
    /// `[vocab]`.
    pub bias: Option<&'a [f64]>,
    /// Hidden size.
    pub hidden: usize,
}

impl Head<'_> {
    fn logits(&self, rows: usize, vocab: usize) -> Vec<f64> {
        linear(self.x, self.w, self.bias, rows, self.hidden, vocab)
    }
}

/// Cross-entropy of `x·Wᵀ + b` against `targets` (every option of [`CrossEntropyConfig`]).
pub fn fused_linear_cross_entropy(
    head: Head,
    targets: &[i32],
    rows: usize,
    vocab: usize,
    cfg: &CrossEntropyConfig,
) -> CrossEntropyResult {
    let logits = head.logits(rows, vocab);
    loss::cross_entropy(&logits, targets, rows, vocab, cfg)
}

/// Gradients of [`fused_linear_cross_entropy`] for `cotangent` (one value for sum/mean, one
/// per row for none).
pub fn fused_linear_cross_entropy_backward(
    head: Head,
    targets: &[i32],
    rows: usize,
    vocab: usize,
    cfg: &CrossEntropyConfig,
    cotangent: &[f64],
) -> LinearGradients {
    let logits = head.logits(rows, vocab);
    let dlogits = loss::cross_entropy_backward(&logits, targets, rows, vocab, cfg, cotangent);
    linear_backward(head.x, head.w, &dlogits, rows, head.hidden, vocab)
}

/// Whether row `r`'s target counts (not `ignore_index`, inside `[0, vocab)`).
fn counted(target: i32, cfg: &CrossEntropyConfig, vocab: usize) -> bool {
    target != cfg.ignore_index && target >= 0 && (target as usize) < vocab
}

/// The logits the scaled loss sees: `(x·Wᵀ + b)/T`.
fn tempered_logits(head: Head, rows: usize, vocab: usize, temperature: f64) -> Vec<f64> {
    head.logits(rows, vocab)
        .into_iter()
        .map(|v| v / temperature)
        .collect()
}

/// `p = softmax(cap(z))` of each row of `z` (softcap `cap·tanh(z/cap)` when set).
fn capped_softmax(z: &[f64], rows: usize, vocab: usize, cap: Option<f64>) -> Vec<f64> {
    let capped: Vec<f64> = z
        .iter()
        .map(|&v| cap.map_or(v, |c| c * (v / c).tanh()))
        .collect();
    loss::softmax(&capped, rows, vocab)
}

/// Scaled fused linear cross-entropy: the loss of [`fused_linear_cross_entropy`] on the
/// logits `z = (x·Wᵀ + b)/T`, and the per-row entropy `H_r = −Σ_c p_c·log p_c` of
/// `p = softmax(z)` (softcapped when the configuration says so), 0 on rows that do not count.
pub fn fused_linear_cross_entropy_scaled(
    head: Head,
    targets: &[i32],
    rows: usize,
    vocab: usize,
    cfg: &CrossEntropyConfig,
    temperature: f64,
) -> (CrossEntropyResult, Vec<f64>) {
    let z = tempered_logits(head, rows, vocab, temperature);
    let result = loss::cross_entropy(&z, targets, rows, vocab, cfg);
    let p = capped_softmax(&z, rows, vocab, cfg.softcap);
    let entropy = (0..rows)
        .map(|r| {
            if !counted(targets[r], cfg, vocab) {
                return 0.0;
            }
            -p[r * vocab..(r + 1) * vocab]
                .iter()
                .map(|&q| if q > 0.0 { q * q.ln() } else { 0.0 })
                .sum::<f64>()
        })
        .collect();
    (result, entropy)
}

/// Gradients of [`fused_linear_cross_entropy_scaled`] for the loss cotangent `cotangent` (one
/// value for sum/mean, one per row for none) and the per-row entropy cotangent (optional):
/// `dz = dloss/dz + ĝ_r·(−p_c·(log p_c + H_r))·(1 − tanh²(z/cap))`, then `dz/T` back through
/// the product.
#[allow(clippy::too_many_arguments)]
pub fn fused_linear_cross_entropy_scaled_backward(
    head: Head,
    targets: &[i32],
    rows: usize,
    vocab: usize,
    cfg: &CrossEntropyConfig,
    temperature: f64,
    cotangent: &[f64],
    entropy_cotangent: Option<&[f64]>,
) -> LinearGradients {
    let z = tempered_logits(head, rows, vocab, temperature);
    let mut dz = loss::cross_entropy_backward(&z, targets, rows, vocab, cfg, cotangent);
    if let Some(ge) = entropy_cotangent {
        let p = capped_softmax(&z, rows, vocab, cfg.softcap);
        let (_, entropy) =
            fused_linear_cross_entropy_scaled(head, targets, rows, vocab, cfg, temperature);
        for r in 0..rows {
            if !counted(targets[r], cfg, vocab) {
                continue;
            }
            for c in 0..vocab {
                let i = r * vocab + c;
                let pc = p[i];
                let log_p = if pc > 0.0 { pc.ln() } else { 0.0 };
                let mut d = -ge[r] * pc * (log_p + entropy[r]);
                if let Some(cap) = cfg.softcap {
                    let th = (z[i] / cap).tanh();
                    d *= 1.0 - th * th;
                }
                dz[i] += d;
            }
        }
    }
    let dlogits: Vec<f64> = dz.iter().map(|d| d / temperature).collect();
    linear_backward(head.x, head.w, &dlogits, rows, head.hidden, vocab)
}

/// The soft (teacher-matching) term of a distillation loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SoftTerm {
    /// Generalized JSD with weight β on log-softmax outputs (see [`Divergence::Jsd`]).
    Jsd {
        /// β in [0, 1].
        beta: f64,
    },
    /// Forward KL `Σ p·(log p − log q)` (teacher p, student q).
    Kl,
    /// Total variation `½·Σ |q − p|` on softmax outputs.
    Tvd,
    /// `β·(1 − cos(student, teacher))` of the rows' logits (divided by T, which the cosine
    /// does not see).
    Cosine {
        /// β.
        beta: f64,
    },
}

/// Distillation configuration (the f64 mirror of `fused_linear::DistillationOptions`).
#[derive(Debug, Clone)]
pub struct DistillationConfig {
    /// The soft term.
    pub soft: SoftTerm,
    /// Temperature T > 0 of the soft term (both heads' logits are divided by it).
    pub temperature: f64,
    /// Weight of the hard-label cross-entropy term.
    pub weight_hard: f64,
    /// Weight of the soft term.
    pub weight_soft: f64,
    /// Rows whose label equals this are skipped by both terms.
    pub ignore_index: i32,
    /// Divide both terms by the counted rows (`true`) or sum them (`false`).
    pub batch_mean: bool,
}

impl DistillationConfig {
    /// The f64 mirror of `options` (`batch_mean` for the batch-mean reduction; the per-row
    /// reference takes `none` as unscaled rows).
    pub fn of(options: &crate::fused_linear::DistillationOptions) -> Self {
        use crate::fused_linear::{DistillationReduction, SoftLoss};
        Self {
            soft: match options.soft {
                SoftLoss::Jsd { beta } => SoftTerm::Jsd {
                    beta: f64::from(beta),
                },
                SoftLoss::Kl => SoftTerm::Kl,
                SoftLoss::Tvd => SoftTerm::Tvd,
                SoftLoss::Cosine { beta } => SoftTerm::Cosine {
                    beta: f64::from(beta),
                },
            },
            temperature: f64::from(options.temperature),
            weight_hard: f64::from(options.weight_hard),
            weight_soft: f64::from(options.weight_soft),
            ignore_index: options.ignore_index,
            batch_mean: options.reduction == DistillationReduction::BatchMean,
        }
    }
}

/// Distillation losses: `loss = w_hard·hard + w_soft·soft`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DistillationResult {
    /// The weighted total.
    pub loss: f64,
    /// Cross-entropy of the raw student logits against the labels (0 without labels).
    pub hard: f64,
    /// The soft term between `student/T` and `teacher/T`.
    pub soft: f64,
}

fn divergence_of(term: SoftTerm) -> Divergence {
    match term {
        SoftTerm::Jsd { beta } => Divergence::Jsd { beta },
        SoftTerm::Kl => Divergence::Kl { log_target: true },
        SoftTerm::Tvd | SoftTerm::Cosine { .. } => Divergence::Tvd,
    }
}

/// Whether row `r` counts (its label is not `ignore_index`; every row without labels).
fn row_counted(labels: Option<&[i32]>, ignore_index: i32, r: usize) -> bool {
    labels.is_none_or(|l| l[r] != ignore_index)
}

/// The cosine soft term: `β·(1 − s·t/(|s||t|))` summed over counted rows (divided by their
/// number for batch mean) of the student's and teacher's logits `s`, `t` divided by T, and with
/// `cotangent` its gradient with respect to the student's logits / T:
/// `−β·(t/(|s||t|) − cos·s/|s|²)` per counted row, times the scale.
#[allow(clippy::too_many_arguments)]
fn cosine_term(
    beta: f64,
    s: &[f64],
    t: &[f64],
    rows: usize,
    vocab: usize,
    labels: Option<&[i32]>,
    cfg: &DistillationConfig,
    cotangent: f64,
) -> (f64, Vec<f64>) {
    let n = (0..rows)
        .filter(|&r| row_counted(labels, cfg.ignore_index, r))
        .count();
    let scale = if cfg.batch_mean {
        if n == 0 { 0.0 } else { 1.0 / n as f64 }
    } else {
        1.0
    };
    let (s, t) = (
        s.iter().map(|v| v / cfg.temperature).collect::<Vec<f64>>(),
        t.iter().map(|v| v / cfg.temperature).collect::<Vec<f64>>(),
    );
    let mut loss = 0.0;
    let mut grad = vec![0.0; rows * vocab];
    for r in (0..rows).filter(|&r| row_counted(labels, cfg.ignore_index, r)) {
        let (sr, tr) = (
            &s[r * vocab..(r + 1) * vocab],
            &t[r * vocab..(r + 1) * vocab],
        );
        let dot: f64 = sr.iter().zip(tr).map(|(a, b)| a * b).sum();
        let ns = sr.iter().map(|a| a * a).sum::<f64>().sqrt();
        let nt = tr.iter().map(|b| b * b).sum::<f64>().sqrt();
        let cos = dot / (ns * nt);
        loss += beta * (1.0 - cos);
        for c in 0..vocab {
            grad[r * vocab + c] =
                -cotangent * scale * beta * (tr[c] / (ns * nt) - cos * sr[c] / (ns * ns));
        }
    }
    (loss * scale, grad)
}

/// The soft term's input and target: log-softmax (JSD, KL) or softmax (TVD) of logits / T.
fn soft_inputs(term: SoftTerm, logits: &[f64], rows: usize, vocab: usize, t: f64) -> Vec<f64> {
    let scaled: Vec<f64> = logits.iter().map(|v| v / t).collect();
    match term {
        SoftTerm::Tvd => loss::softmax(&scaled, rows, vocab),
        _ => log_softmax(&scaled, rows, vocab),
    }
}

fn reductions(cfg: &DistillationConfig) -> (crate::loss::Reduction, crate::loss::DivReduction) {
    if cfg.batch_mean {
        (
            crate::loss::Reduction::Mean,
            crate::loss::DivReduction::BatchMean,
        )
    } else {
        (crate::loss::Reduction::Sum, crate::loss::DivReduction::Sum)
    }
}

fn hard_config(cfg: &DistillationConfig) -> CrossEntropyConfig {
    CrossEntropyConfig {
        ignore_index: cfg.ignore_index,
        reduction: reductions(cfg).0,
        ..CrossEntropyConfig::default()
    }
}

/// Reference distillation loss: hard term `CE(student, labels)` (needs labels), soft term
/// `D(softmax(student/T), softmax(teacher/T))` over the rows whose label is not
/// `ignore_index` (all rows without labels).
pub fn fused_linear_distillation(
    student: Head,
    teacher: Head,
    labels: Option<&[i32]>,
    rows: usize,
    vocab: usize,
    cfg: &DistillationConfig,
) -> DistillationResult {
    let s = student.logits(rows, vocab);
    let t = teacher.logits(rows, vocab);
    let hard = match labels {
        Some(l) if cfg.weight_hard != 0.0 => {
            loss::cross_entropy(&s, l, rows, vocab, &hard_config(cfg)).loss[0]
        }
        _ => 0.0,
    };
    if let SoftTerm::Cosine { beta } = cfg.soft {
        let soft = cosine_term(beta, &s, &t, rows, vocab, labels, cfg, 0.0).0;
        return DistillationResult {
            loss: cfg.weight_hard * hard + cfg.weight_soft * soft,
            hard,
            soft,
        };
    }
    let qs = soft_inputs(cfg.soft, &s, rows, vocab, cfg.temperature);
    let pt = soft_inputs(cfg.soft, &t, rows, vocab, cfg.temperature);
    let soft = loss::divergence(
        divergence_of(cfg.soft),
        &qs,
        &pt,
        rows,
        vocab,
        labels,
        cfg.ignore_index,
        reductions(cfg).1,
    )[0];
    DistillationResult {
        loss: cfg.weight_hard * hard + cfg.weight_soft * soft,
        hard,
        soft,
    }
}

/// Head restricted to row `r`.
fn row_head<'a>(h: Head<'a>, r: usize) -> Head<'a> {
    Head {
        x: &h.x[r * h.hidden..(r + 1) * h.hidden],
        ..h
    }
}

/// Per-row distillation losses (reduction none): row r's loss is the sum-reduced loss of row
/// r alone (0 for a row whose label is `ignore_index`). `cfg.batch_mean` is ignored.
pub fn fused_linear_distillation_rows(
    student: Head,
    teacher: Head,
    labels: Option<&[i32]>,
    rows: usize,
    vocab: usize,
    cfg: &DistillationConfig,
) -> Vec<DistillationResult> {
    let cfg = DistillationConfig {
        batch_mean: false,
        ..cfg.clone()
    };
    (0..rows)
        .map(|r| {
            fused_linear_distillation(
                row_head(student, r),
                row_head(teacher, r),
                labels.map(|l| &l[r..r + 1]),
                1,
                vocab,
                &cfg,
            )
        })
        .collect()
}

/// Student gradients of [`fused_linear_distillation_rows`] for one cotangent per row: the
/// rows' gradients of the sum-reduced loss, each times its cotangent (the input gradient of
/// row r is row r's; the weight and bias gradients add up over the rows).
#[allow(clippy::too_many_arguments)]
pub fn fused_linear_distillation_rows_backward(
    student: Head,
    teacher: Head,
    labels: Option<&[i32]>,
    rows: usize,
    vocab: usize,
    cfg: &DistillationConfig,
    cotangent: &[f64],
) -> LinearGradients {
    let cfg = DistillationConfig {
        batch_mean: false,
        ..cfg.clone()
    };
    let hidden = student.hidden;
    let mut out = LinearGradients {
        input: vec![0.0; rows * hidden],
        weight: vec![0.0; student.w.len()],
        bias: vec![0.0; vocab],
    };
    for r in 0..rows {
        let g = fused_linear_distillation_backward(
            row_head(student, r),
            row_head(teacher, r),
            labels.map(|l| &l[r..r + 1]),
            1,
            vocab,
            &cfg,
            cotangent[r],
        );
        out.input[r * hidden..(r + 1) * hidden].copy_from_slice(&g.input);
        for (a, b) in out.weight.iter_mut().zip(&g.weight) {
            *a += b;
        }
        for (a, b) in out.bias.iter_mut().zip(&g.bias) {
            *a += b;
        }
    }
    out
}

/// Student gradients of [`fused_linear_distillation`]'s total loss times `cotangent` (the
/// teacher is frozen).
pub fn fused_linear_distillation_backward(
    student: Head,
    teacher: Head,
    labels: Option<&[i32]>,
    rows: usize,
    vocab: usize,
    cfg: &DistillationConfig,
    cotangent: f64,
) -> LinearGradients {
    let s = student.logits(rows, vocab);
    let t = teacher.logits(rows, vocab);
    let mut dlogits = vec![0.0; rows * vocab];
    if let (Some(l), true) = (labels, cfg.weight_hard != 0.0) {
        let g = [cotangent * cfg.weight_hard];
        dlogits = loss::cross_entropy_backward(&s, l, rows, vocab, &hard_config(cfg), &g);
    }
    if let SoftTerm::Cosine { beta } = cfg.soft {
        let (_, d) = cosine_term(
            beta,
            &s,
            &t,
            rows,
            vocab,
            labels,
            cfg,
            cotangent * cfg.weight_soft,
        );
        for (a, g) in dlogits.iter_mut().zip(&d) {
            *a += g / cfg.temperature;
        }
        return linear_backward(student.x, student.w, &dlogits, rows, student.hidden, vocab);
    }
    // d soft / d (soft input), then back through (log-)softmax and the division by T.
    let qs = soft_inputs(cfg.soft, &s, rows, vocab, cfg.temperature);
    let pt = soft_inputs(cfg.soft, &t, rows, vocab, cfg.temperature);
    let d_input = loss::divergence_backward(
        divergence_of(cfg.soft),
        &qs,
        &pt,
        rows,
        vocab,
        labels,
        cfg.ignore_index,
        reductions(cfg).1,
        &[cotangent * cfg.weight_soft],
    );
    let scaled: Vec<f64> = s.iter().map(|v| v / cfg.temperature).collect();
    let log = cfg.soft != SoftTerm::Tvd;
    let d_scaled = softmax_backward(&scaled, &d_input, rows, vocab, log);
    for (d, g) in dlogits.iter_mut().zip(&d_scaled) {
        *d += g / cfg.temperature;
    }
    linear_backward(student.x, student.w, &dlogits, rows, student.hidden, vocab)
}
