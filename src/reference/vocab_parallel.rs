//! Vocabulary-parallel cross-entropy in f64: the shards' logits joined back into whole rows,
//! then the plain cross-entropy of [`super::loss`] (ignored rows, reductions), and its
//! gradient split back into the shards. The contract: sharding changes nothing but rounding.

use super::loss::{self, CrossEntropyConfig};
use crate::loss::Reduction;

/// The shards (`[rows, width_k]` each, in vocabulary order) joined into `[rows, Σ width_k]`.
pub fn join(shards: &[&[f64]], widths: &[usize], rows: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for r in 0..rows {
        for (s, &w) in shards.iter().zip(widths) {
            out.extend_from_slice(&s[r * w..(r + 1) * w]);
        }
    }
    out
}

fn config(ignore_index: i32, reduction: Reduction) -> CrossEntropyConfig {
    CrossEntropyConfig {
        ignore_index,
        reduction,
        ..Default::default()
    }
}

/// The loss: one value per row (`Reduction::None`) or one.
pub fn forward(
    shards: &[&[f64]],
    widths: &[usize],
    targets: &[i32],
    ignore_index: i32,
    reduction: Reduction,
) -> Vec<f64> {
    let rows = targets.len();
    let x = join(shards, widths, rows);
    let vocab = widths.iter().sum();
    loss::cross_entropy(&x, targets, rows, vocab, &config(ignore_index, reduction)).loss
}

/// Each shard's logit gradient for the loss cotangent `dloss`.
pub fn backward(
    shards: &[&[f64]],
    widths: &[usize],
    targets: &[i32],
    ignore_index: i32,
    reduction: Reduction,
    dloss: &[f64],
) -> Vec<Vec<f64>> {
    let rows = targets.len();
    let x = join(shards, widths, rows);
    let vocab: usize = widths.iter().sum();
    let cfg = config(ignore_index, reduction);
    let g = loss::cross_entropy_backward(&x, targets, rows, vocab, &cfg, dloss);
    let mut out: Vec<Vec<f64>> = widths
        .iter()
        .map(|w| Vec::with_capacity(rows * w))
        .collect();
    for r in 0..rows {
        let mut at = r * vocab;
        for (o, &w) in out.iter_mut().zip(widths) {
            o.extend_from_slice(&g[at..at + w]);
            at += w;
        }
    }
    out
}
