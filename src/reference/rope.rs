//! f64 references of RoPE (see [`crate::rope`]): the per-row rotation and its transpose,
//! plus the bookkeeping that maps multi-head rows to table rows (positions, mRoPE sections)
//! and sums per-row table gradients back into shared tables.

/// Columns of frequency pair `i`.
pub fn pair(i: usize, half: usize, interleaved: bool) -> (usize, usize) {
    if interleaved {
        (2 * i, 2 * i + 1)
    } else {
        (i, i + half)
    }
}

/// Forward with per-row tables: `values[rows, dim]`, `cos`, `sin` `[rows, rot/2]`.
pub fn forward(
    values: &[f64],
    dim: usize,
    cos: &[f64],
    sin: &[f64],
    rot: usize,
    interleaved: bool,
) -> Vec<f64> {
    let half = rot / 2;
    let mut out = values.to_vec();
    for (r, row) in values.chunks(dim.max(1)).enumerate() {
        for i in 0..half {
            let (a, b) = pair(i, half, interleaved);
            let (c, s) = (cos[r * half + i], sin[r * half + i]);
            out[r * dim + a] = row[a] * c - row[b] * s;
            out[r * dim + b] = row[b] * c + row[a] * s;
        }
    }
    out
}

/// Backward with per-row tables: `(dvalues, dcos, dsin)`; the transpose of the rotation as
/// given (no unit-norm assumption).
pub fn backward(
    values: &[f64],
    dy: &[f64],
    dim: usize,
    cos: &[f64],
    sin: &[f64],
    rot: usize,
    interleaved: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let half = rot / 2;
    let mut dv = dy.to_vec();
    let mut dcos = vec![0.0; cos.len()];
    let mut dsin = vec![0.0; sin.len()];
    for r in 0..values.len() / dim.max(1) {
        for i in 0..half {
            let (a, b) = pair(i, half, interleaved);
            let (x1, x2) = (values[r * dim + a], values[r * dim + b]);
            let (g1, g2) = (dy[r * dim + a], dy[r * dim + b]);
            let (c, s) = (cos[r * half + i], sin[r * half + i]);
            dv[r * dim + a] = g1 * c + g2 * s;
            dv[r * dim + b] = -g1 * s + g2 * c;
            dcos[r * half + i] = g1 * x1 + g2 * x2;
            dsin[r * half + i] = g2 * x1 - g1 * x2;
        }
    }
    (dv, dcos, dsin)
}

/// Shape of multi-head values: `[batch, seq, heads, dim]`, or `[batch, heads, seq, dim]` when
/// `bhsd`.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Batch size.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Heads.
    pub heads: usize,
    /// Whether the layout is `[batch, heads, seq, dim]`.
    pub bhsd: bool,
}

impl Heads {
    /// Rows (`batch·seq·heads`).
    pub fn rows(&self) -> usize {
        self.batch * self.seq * self.heads
    }

    /// (batch, seq) of value row `r`.
    pub fn token(&self, r: usize) -> (usize, usize) {
        if self.bhsd {
            (r / (self.heads * self.seq), r % self.seq)
        } else {
            let t = r / self.heads;
            (t / self.seq, t % self.seq)
        }
    }
}

/// Expand a shared table `[table_rows, half]` to per-row tables `[rows, half]`, row `r`'s
/// frequency `i` taking table row `position(b, s, i)`.
pub fn expand(
    table: &[f64],
    half: usize,
    heads: &Heads,
    position: impl Fn(usize, usize, usize) -> usize,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(heads.rows() * half);
    for r in 0..heads.rows() {
        let (b, s) = heads.token(r);
        for i in 0..half {
            out.push(table[position(b, s, i) * half + i]);
        }
    }
    out
}

/// Sum per-row table gradients `[rows, half]` into the shared table `[table_rows, half]`
/// (the transpose of [`expand`]).
pub fn reduce(
    per_row: &[f64],
    half: usize,
    heads: &Heads,
    table_rows: usize,
    position: impl Fn(usize, usize, usize) -> usize,
) -> Vec<f64> {
    let mut out = vec![0.0; table_rows * half];
    for r in 0..heads.rows() {
        let (b, s) = heads.token(r);
        for i in 0..half {
            out[position(b, s, i) * half + i] += per_row[r * half + i];
        }
    }
    out
}

/// Qwen2-VL mRoPE: the position axis of frequency `i` for sections `[t, h, w]`.
pub fn mrope_axis(i: usize, section: [usize; 3]) -> usize {
    if i < section[0] {
        0
    } else if i < section[0] + section[1] {
        1
    } else {
        2
    }
}

/// Split Llama 4's complex table `[rows, half, 2]` into (cos, sin) `[rows, half]`.
pub fn split_complex(freqs: &[f64]) -> (Vec<f64>, Vec<f64>) {
    (
        freqs.iter().step_by(2).copied().collect(),
        freqs.iter().skip(1).step_by(2).copied().collect(),
    )
}

/// Join (cos, sin) `[rows, half]` into the complex layout `[rows, half, 2]`.
pub fn join_complex(cos: &[f64], sin: &[f64]) -> Vec<f64> {
    cos.iter().zip(sin).flat_map(|(&c, &s)| [c, s]).collect()
}

/// Inverse frequencies `base^(−2i/rotary_dim)`, `i < rotary_dim/2`.
pub fn inverse_frequencies(rotary_dim: usize, base: f64) -> Vec<f64> {
    (0..rotary_dim / 2)
        .map(|i| base.powf(-2.0 * i as f64 / rotary_dim as f64))
        .collect()
}
