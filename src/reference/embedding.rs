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
