//! f64 reference of the GRPO token loss (`crate::grpo`): forward and analytic backward, every
//! formula spelled out as in the module documentation.

/// Sizes: `batch` sequences of `seq` completion tokens, logits with `positions` (`seq` or
/// `seq + 1`) rows of `vocab` classes per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// B.
    pub batch: usize,
    /// L.
    pub seq: usize,
    /// Logits positions per sequence.
    pub positions: usize,
    /// V.
    pub vocab: usize,
}

/// Loss normalization, as [`crate::grpo::GrpoLossType`] (`Bnpo` also stands for DAPO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// Mean of per-sequence means.
    Grpo,
    /// Mean over counted tokens.
    Bnpo,
    /// Sum over `B · max_completion_length`.
    DrGrpo(usize),
}

/// Scalars of the loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Temperature.
    pub temperature: f64,
    /// KL coefficient.
    pub beta: f64,
    /// Lower clip.
    pub eps_low: f64,
    /// Upper clip.
    pub eps_high: f64,
    /// Normalization.
    pub norm: Norm,
}

/// Per-sequence and per-token inputs besides the logits.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    /// Completion ids `[B·L]`.
    pub ids: &'a [i32],
    /// Advantages `[B]`.
    pub advantages: &'a [f64],
    /// Old log-probabilities `[B·L]`.
    pub old_logp: Option<&'a [f64]>,
    /// Reference log-probabilities `[B·L]`.
    pub ref_logp: Option<&'a [f64]>,
    /// Counted tokens `[B·L]`.
    pub mask: Option<&'a [bool]>,
}

/// Forward results.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// The loss.
    pub loss: f64,
    /// `loss_t` per token (0 where masked).
    pub per_token: Vec<f64>,
    /// k3 KL estimate per token (0 without reference or where masked).
    pub kl: Vec<f64>,
    /// Whether the clipped term was the strictly smaller one.
    pub clipped: Vec<bool>,
}

/// `log softmax(row / T)`.
fn log_softmax(row: &[f64], temperature: f64) -> Vec<f64> {
    let z: Vec<f64> = row.iter().map(|x| x / temperature).collect();
    super::loss::log_softmax(&z, 1, z.len())
}

/// Per token: (counted, logp, loss_t, d loss_t / d logp, kl, clipped).
fn token_terms(
    logits: &[f64],
    s: Sizes,
    tok: &Tokens,
    set: &Settings,
) -> Vec<(bool, f64, f64, f64, f64, bool)> {
    let mut out = Vec::with_capacity(s.batch * s.seq);
    for b in 0..s.batch {
        for t in 0..s.seq {
            let r = b * s.seq + t;
            let counted = tok.mask.is_none_or(|m| m[r]);
            let start = (b * s.positions + t) * s.vocab;
            let logp_all = log_softmax(&logits[start..start + s.vocab], set.temperature);
            let logp = logp_all[tok.ids[r] as usize];
            if !counted {
                out.push((false, logp, 0.0, 0.0, 0.0, false));
                continue;
            }
            let a = tok.advantages[b];
            let old = tok.old_logp.map_or(logp, |o| o[r]);
            let c1 = (logp - old).exp();
            let c2 = c1.clamp(1.0 - set.eps_low, 1.0 + set.eps_high);
            let (l1, l2) = (c1 * a, c2 * a);
            let mut loss = -l1.min(l2);
            let mut d = if l1 <= l2 { -a * c1 } else { 0.0 };
            let mut kl = 0.0;
            if let Some(reference) = tok.ref_logp {
                let diff = reference[r] - logp;
                kl = diff.exp() - diff - 1.0;
                loss += set.beta * kl;
                d += set.beta * (1.0 - diff.exp());
            }
            out.push((true, logp, loss, d, kl, l2 < l1));
        }
    }
    out
}

/// Each token's weight `d loss / d loss_t`.
fn weights(terms: &[(bool, f64, f64, f64, f64, bool)], s: Sizes, norm: Norm) -> Vec<f64> {
    let m = |r: usize| if terms[r].0 { 1.0 } else { 0.0 };
    match norm {
        Norm::Grpo => (0..s.batch * s.seq)
            .map(|r| {
                let b = r / s.seq;
                let count: f64 = (0..s.seq).map(|t| m(b * s.seq + t)).sum();
                m(r) / (s.batch as f64 * count.max(1.0))
            })
            .collect(),
        Norm::Bnpo => {
            let count: f64 = (0..terms.len()).map(m).sum();
            (0..terms.len()).map(|r| m(r) / count.max(1.0)).collect()
        }
        Norm::DrGrpo(max_len) => (0..terms.len())
            .map(|r| m(r) / (s.batch * max_len) as f64)
            .collect(),
    }
}

/// The loss, per-token losses, KL estimates and clip flags.
pub fn forward(logits: &[f64], s: Sizes, tok: &Tokens, set: &Settings) -> Forward {
    let terms = token_terms(logits, s, tok, set);
    let w = weights(&terms, s, set.norm);
    Forward {
        loss: terms.iter().zip(&w).map(|(t, w)| t.2 * w).sum(),
        per_token: terms.iter().map(|t| t.2).collect(),
        kl: terms.iter().map(|t| t.4).collect(),
        clipped: terms.iter().map(|t| t.5).collect(),
    }
}

/// `d logits` (the logits' layout) for the loss cotangent `d_loss`.
pub fn backward(logits: &[f64], s: Sizes, tok: &Tokens, set: &Settings, d_loss: f64) -> Vec<f64> {
    let terms = token_terms(logits, s, tok, set);
    let w = weights(&terms, s, set.norm);
    let mut grad = vec![0.0; logits.len()];
    for b in 0..s.batch {
        for t in 0..s.seq {
            let r = b * s.seq + t;
            if !terms[r].0 {
                continue;
            }
            let g = d_loss * w[r] * terms[r].3 / set.temperature;
            let start = (b * s.positions + t) * s.vocab;
            let logp = log_softmax(&logits[start..start + s.vocab], set.temperature);
            for (j, lp) in logp.iter().enumerate() {
                let onehot = if j == tok.ids[r] as usize { 1.0 } else { 0.0 };
                grad[start + j] = g * (onehot - lp.exp());
            }
        }
    }
    grad
}
