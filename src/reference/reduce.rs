//! Reference reductions in f64 (`x` is row-major `[rows, cols]`).

/// `out[r] = Σ_c x[r, c]`.
pub fn sum_rows(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows)
        .map(|r| x[r * cols..(r + 1) * cols].iter().sum())
        .collect()
}

/// `out[r] = max_c x[r, c]` (−∞ for an empty row).
pub fn max_rows(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            x[r * cols..(r + 1) * cols]
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect()
}

/// `out[c] = Σ_r x[r, c]`.
pub fn sum_columns(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..cols)
        .map(|c| (0..rows).map(|r| x[r * cols + c]).sum())
        .collect()
}
