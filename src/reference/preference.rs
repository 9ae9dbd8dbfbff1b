//! f64 reference of the paired preference losses (`crate::preference`): the logits
//! materialized, every formula as in the module documentation; forward and analytic backward.

/// Sizes: `pairs` (B) chosen and as many rejected sequences of `tokens` (T), hidden `h`,
/// vocabulary `v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// B.
    pub pairs: usize,
    /// T.
    pub tokens: usize,
    /// H.
    pub h: usize,
    /// V.
    pub v: usize,
}

/// The margin of a pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Margin {
    /// β·((π_c − ref_c) − (π_r − ref_r)).
    Dpo,
    /// β·(π_c − π_r).
    Cpo,
    /// β·(π_c − π_r) − γ.
    SimPo(f64),
    /// The log odds ratio, weighted by β.
    Orpo,
}

/// The loss settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Which margin.
    pub margin: Margin,
    /// β.
    pub beta: f64,
    /// Label smoothing.
    pub smoothing: f64,
    /// Weight of the chosen NLL.
    pub alpha: f64,
    /// π averaged over counted tokens (else summed).
    pub average: bool,
    /// Targets that do not count.
    pub ignore_index: i32,
}

/// The head and targets: `x [2B·T·H]`, `w [V·H]`, `bias [V]`, `targets [2B·T]`, and the
/// reference sequence log-probabilities `(chosen [B], rejected [B])`.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Hidden states.
    pub x: &'a [f64],
    /// Head weight.
    pub w: &'a [f64],
    /// Head bias.
    pub bias: Option<&'a [f64]>,
    /// Targets.
    pub targets: &'a [i32],
    /// Reference log-probabilities (DPO).
    pub reference: Option<(&'a [f64], &'a [f64])>,
}

/// Forward results.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// The loss.
    pub loss: f64,
    /// The chosen NLL (before α).
    pub nll: f64,
    /// π of the chosen then the rejected sequences.
    pub logps: Vec<f64>,
}

/// Log-softmax of every token's logits row, `[seqs·T, V]`.
fn log_probs(s: Sizes, seqs: usize, i: &Inputs) -> Vec<f64> {
    let rows = seqs * s.tokens;
    let logits = super::fused_linear::linear(i.x, i.w, i.bias, rows, s.h, s.v);
    super::loss::log_softmax(&logits, rows, s.v)
}

fn log_sigmoid(x: f64) -> f64 {
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Per sequence: (π, counted tokens); and per token its log-probability.
fn sequences(s: Sizes, seqs: usize, i: &Inputs, set: &Settings, lp: &[f64]) -> Vec<(f64, f64)> {
    (0..seqs)
        .map(|q| {
            let mut sum = 0.0f64;
            let mut n = 0.0f64;
            for t in 0..s.tokens {
                let r = q * s.tokens + t;
                if i.targets[r] != set.ignore_index {
                    sum += lp[r * s.v + i.targets[r] as usize];
                    n += 1.0;
                }
            }
            (if set.average { sum / n.max(1.0) } else { sum }, n)
        })
        .collect()
}

/// Margin of a pair and its derivatives with respect to π_c and π_r.
fn margin(set: &Settings, pc: f64, pr: f64, refs: (f64, f64)) -> (f64, f64, f64) {
    let b = set.beta;
    match set.margin {
        Margin::Dpo => (b * ((pc - refs.0) - (pr - refs.1)), b, -b),
        Margin::Cpo => (b * (pc - pr), b, -b),
        Margin::SimPo(gamma) => (b * (pc - pr) - gamma, b, -b),
        Margin::Orpo => {
            let odds = |p: f64| p - (-p.exp()).ln_1p();
            (
                odds(pc) - odds(pr),
                1.0 / (1.0 - pc.exp()),
                -1.0 / (1.0 - pr.exp()),
            )
        }
    }
}

/// The pair weight `w/B`.
fn pair_weight(s: Sizes, set: &Settings) -> f64 {
    let w = if set.margin == Margin::Orpo {
        set.beta
    } else {
        1.0
    };
    w / s.pairs.max(1) as f64
}

/// The loss, NLL and sequence log-probabilities.
pub fn forward(s: Sizes, i: &Inputs, set: &Settings) -> Forward {
    let lp = log_probs(s, 2 * s.pairs, i);
    let seq = sequences(s, 2 * s.pairs, i, set, &lp);
    let refs = |p: usize| i.reference.map_or((0.0, 0.0), |(c, r)| (c[p], r[p]));
    let ls = set.smoothing;
    let pref: f64 = (0..s.pairs)
        .map(|p| {
            let (u, _, _) = margin(set, seq[p].0, seq[s.pairs + p].0, refs(p));
            -((1.0 - ls) * log_sigmoid(u) + ls * log_sigmoid(-u))
        })
        .sum();
    let chosen_tokens: f64 = (0..s.pairs).map(|p| seq[p].1).sum();
    let chosen_logp: f64 = (0..s.pairs)
        .map(|p| {
            if set.average {
                seq[p].0 * seq[p].1.max(1.0)
            } else {
                seq[p].0
            }
        })
        .sum();
    let nll = -chosen_logp / chosen_tokens.max(1.0);
    Forward {
        loss: pair_weight(s, set) * pref + set.alpha * nll,
        nll,
        logps: seq.iter().map(|q| q.0).collect(),
    }
}

/// `(dx, dW, dbias)` for the loss cotangent `d_loss`.
pub fn backward(
    s: Sizes,
    i: &Inputs,
    set: &Settings,
    d_loss: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let lp = log_probs(s, 2 * s.pairs, i);
    let seq = sequences(s, 2 * s.pairs, i, set, &lp);
    let refs = |p: usize| i.reference.map_or((0.0, 0.0), |(c, r)| (c[p], r[p]));
    let ls = set.smoothing;
    // d loss / d π per sequence.
    let mut d_pi = vec![0.0; 2 * s.pairs];
    for p in 0..s.pairs {
        let (u, dc, dr) = margin(set, seq[p].0, seq[s.pairs + p].0, refs(p));
        let du = pair_weight(s, set) * (-(1.0 - ls) * sigmoid(-u) + ls * sigmoid(u));
        d_pi[p] = du * dc;
        d_pi[s.pairs + p] = du * dr;
    }
    let chosen_tokens: f64 = (0..s.pairs).map(|p| seq[p].1).sum();
    let nll = |q: usize| {
        if q < s.pairs {
            set.alpha / chosen_tokens.max(1.0)
        } else {
            0.0
        }
    };
    through_head(s, i, set, &lp, &seq, &d_pi, nll, d_loss)
}

/// `(dx, dW, dbias)` from d loss / d π per sequence and the NLL term's per-token weight.
#[allow(clippy::too_many_arguments)]
fn through_head(
    s: Sizes,
    i: &Inputs,
    set: &Settings,
    lp: &[f64],
    seq: &[(f64, f64)],
    d_pi: &[f64],
    nll: impl Fn(usize) -> f64,
    d_loss: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dlogits = vec![0.0; lp.len()];
    for q in 0..seq.len() {
        for t in 0..s.tokens {
            let r = q * s.tokens + t;
            let target = i.targets[r];
            if target == set.ignore_index {
                continue;
            }
            // d loss / d logp of this token, then d logp / d z = onehot − softmax.
            let g = d_loss * (d_pi[q] / if set.average { seq[q].1.max(1.0) } else { 1.0 } - nll(q));
            for c in 0..s.v {
                let onehot = if c == target as usize { 1.0 } else { 0.0 };
                dlogits[r * s.v + c] = g * (onehot - lp[r * s.v + c].exp());
            }
        }
    }
    let rows = seq.len() * s.tokens;
    let g = super::fused_linear::linear_backward(i.x, i.w, &dlogits, rows, s.h, s.v);
    (g.input, g.weight, g.bias)
}

/// Log-softmax rows, (π, n) per sequence, (σ(u), sign) per sequence.
type KtoTerms = (Vec<f64>, Vec<(f64, f64)>, Vec<(f64, f64)>);

/// KTO's per-sequence terms: the log-probabilities, per-token log-softmax rows, and for each
/// sequence `(σ(u), sign)` with `u = β·sign·(π − ref − z0)`, `sign` +1 when desirable.
fn kto_terms(
    s: Sizes,
    seqs: usize,
    i: &Inputs,
    set: &Settings,
    desirable: &[bool],
    reference: Option<&[f64]>,
    z0: f64,
) -> KtoTerms {
    let lp = log_probs(s, seqs, i);
    let seq = sequences(s, seqs, i, set, &lp);
    let terms = (0..seqs)
        .map(|q| {
            let r = seq[q].0 - reference.map_or(0.0, |r| r[q]);
            let sign = if desirable[q] { 1.0 } else { -1.0 };
            (sigmoid(set.beta * sign * (r - z0)), sign)
        })
        .collect();
    (lp, seq, terms)
}

/// KTO over `seqs` sequences (`s.pairs` unused): `(loss, π per sequence)`, with the
/// desirable labels, the reference log-probabilities (`[seqs]` or zeros) and point `z0`:
/// `(1/N)·Σ (1 − σ(u))`.
pub fn kto_forward(
    s: Sizes,
    seqs: usize,
    i: &Inputs,
    set: &Settings,
    desirable: &[bool],
    reference: Option<&[f64]>,
    z0: f64,
) -> (f64, Vec<f64>) {
    let (_, seq, terms) = kto_terms(s, seqs, i, set, desirable, reference, z0);
    let loss = terms.iter().map(|(p, _)| 1.0 - p).sum::<f64>() / seqs.max(1) as f64;
    (loss, seq.iter().map(|q| q.0).collect())
}

/// `(dx, dW, dbias)` of [`kto_forward`] for the loss cotangent `d_loss`
/// (`d loss / d π = −σ(u)(1 − σ(u))·sign·β/N`).
#[allow(clippy::too_many_arguments)]
pub fn kto_backward(
    s: Sizes,
    seqs: usize,
    i: &Inputs,
    set: &Settings,
    desirable: &[bool],
    reference: Option<&[f64]>,
    z0: f64,
    d_loss: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (lp, seq, terms) = kto_terms(s, seqs, i, set, desirable, reference, z0);
    let d_pi: Vec<f64> = terms
        .iter()
        .map(|(p, sign)| -p * (1.0 - p) * sign * set.beta / seqs.max(1) as f64)
        .collect();
    through_head(s, i, set, &lp, &seq, &d_pi, |_| 0.0, d_loss)
}
