//! f64 reference of the embedding lookup (see [`crate::embedding`]). The table is row-major
//! `[rows, dim]`; indices are given as `i64` so that I32 and U32 values (and out-of-range
//! ones) are all representable.

/// Whether position index `index` selects a row of a `rows`-row table.
fn in_range(index: i64, rows: usize) -> bool {
    index >= 0 && (index as u64) < rows as u64
}

/// `out[p, c] = table[indices[p], c]`; a position whose index is outside `[0, rows)` gives a
/// row of zeros. The padding row is gathered like any other.
pub fn forward(table: &[f64], rows: usize, dim: usize, indices: &[i64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(indices.len() * dim);
    for &index in indices {
        if in_range(index, rows) {
            let row = index as usize;
            out.extend_from_slice(&table[row * dim..(row + 1) * dim]);
        } else {
            out.extend(std::iter::repeat_n(0.0, dim));
        }
    }
    out
}

/// `dtable[v, c] = Σ_{p : indices[p] = v} dy[p, c]`, positions in ascending order; the
/// padding row and out-of-range positions receive and give nothing.
pub fn backward(
    dy: &[f64],
    rows: usize,
    dim: usize,
    indices: &[i64],
    padding_index: Option<usize>,
) -> Vec<f64> {
    let mut dtable = vec![0.0; rows * dim];
    for (p, &index) in indices.iter().enumerate() {
        if !in_range(index, rows) || padding_index == Some(index as usize) {
            continue;
        }
        let row = index as usize;
        for c in 0..dim {
            dtable[row * dim + c] += dy[p * dim + c];
        }
    }
    dtable
}

/// The p-norm of a row: `(Σ|w_c|^p)^(1/p)` for p > 0, `max |w_c|` for p = ∞.
pub fn p_norm(row: &[f64], p: f64) -> f64 {
    if p.is_infinite() {
        row.iter().fold(0.0, |m, v| m.max(v.abs()))
    } else {
        row.iter()
            .map(|v| v.abs().powf(p))
            .sum::<f64>()
            .powf(1.0 / p)
    }
}

/// The renormalization factor of a row under `max_norm` with the p-norm `norm_type`:
/// `max_norm/(‖row‖_p + 1e-7)` when the norm exceeds `max_norm`, else 1.
pub fn max_norm_scale(row: &[f64], max_norm: f64, norm_type: f64) -> f64 {
    let norm = p_norm(row, norm_type);
    if norm > max_norm {
        max_norm / (norm + 1e-7)
    } else {
        1.0
    }
}

/// The forward with `max_norm`: each gathered row times its [`max_norm_scale`] (out-of-range
/// positions give zeros).
pub fn forward_max_norm(
    table: &[f64],
    rows: usize,
    dim: usize,
    indices: &[i64],
    max_norm: f64,
    norm_type: f64,
) -> Vec<f64> {
    let mut out = forward(table, rows, dim, indices);
    for (p, &index) in indices.iter().enumerate() {
        if in_range(index, rows) {
            let v = index as usize;
            let s = max_norm_scale(&table[v * dim..(v + 1) * dim], max_norm, norm_type);
            for x in &mut out[p * dim..(p + 1) * dim] {
                *x *= s;
            }
        }
    }
    out
}

/// The table after PyTorch's in-place renormalization: every row referenced by an in-range
/// index scaled by its [`max_norm_scale`], the others unchanged.
pub fn renorm(
    table: &[f64],
    rows: usize,
    dim: usize,
    indices: &[i64],
    max_norm: f64,
    norm_type: f64,
) -> Vec<f64> {
    let mut out = table.to_vec();
    let mut referenced = vec![false; rows];
    for &index in indices {
        if in_range(index, rows) {
            referenced[index as usize] = true;
        }
    }
    for (v, _) in referenced.iter().enumerate().filter(|(_, r)| **r) {
        let s = max_norm_scale(&table[v * dim..(v + 1) * dim], max_norm, norm_type);
        for x in &mut out[v * dim..(v + 1) * dim] {
            *x *= s;
        }
    }
    out
}

/// [`backward`] with `scale_grad_by_freq`: row v's sum divided by the number of positions
/// whose index is v.
pub fn backward_scaled_by_freq(
    dy: &[f64],
    rows: usize,
    dim: usize,
    indices: &[i64],
    padding_index: Option<usize>,
) -> Vec<f64> {
    let mut dtable = backward(dy, rows, dim, indices, padding_index);
    let mut counts = vec![0usize; rows];
    for &index in indices {
        if in_range(index, rows) {
            counts[index as usize] += 1;
        }
    }
    for (v, &n) in counts.iter().enumerate() {
        if n > 0 {
            for x in &mut dtable[v * dim..(v + 1) * dim] {
                *x /= n as f64;
            }
        }
    }
    dtable
}
