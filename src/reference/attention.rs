//! Reference softmax attention in f64, materializing each head's score matrix (small shapes
//! only). Layout `[batch, heads, sequence, head_dim]`, row-major; query heads `h` read
//! key/value head `h / (q_heads / kv_heads)`. Visibility as `crate::attention` documents it:
//! with `rel = j − i − offset`, key `j` is visible to query `i` when `rel ≤ 0` (causal),
//! `−window_left ≤ rel ≤ window_right` (window), `rel` a multiple of `dilation` and
//! `mask[i, j]` hold.

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Batch.
    pub batch: usize,
    /// Query heads (a multiple of `kv_heads`).
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query length.
    pub q_len: usize,
    /// Key length.
    pub k_len: usize,
    /// Head dim.
    pub head_dim: usize,
}

/// Which keys each query sees, and the scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Visibility {
    /// Hide keys right of the diagonal.
    pub causal: bool,
    /// The diagonal: query `i` is aligned with key `i + offset`.
    pub offset: i64,
    /// Hide keys more than this many positions left of the diagonal.
    pub window_left: Option<usize>,
    /// Hide keys more than this many positions right of the diagonal.
    pub window_right: Option<usize>,
    /// Hide keys whose distance from the diagonal is not a multiple of this (1: none).
    pub dilation: usize,
    /// Mask `[mask_batch, mask_heads, q_len, k_len]` (true = visible), broadcast along axes of
    /// size 1.
    pub mask: Option<(Vec<bool>, usize, usize)>,
    /// Score scale.
    pub scale: f64,
}

impl Visibility {
    /// Full attention with scale `1/sqrt(head_dim)` and the default offset.
    pub fn full(dims: &Dims) -> Visibility {
        Visibility {
            causal: false,
            offset: dims.k_len as i64 - dims.q_len as i64,
            window_left: None,
            window_right: None,
            dilation: 1,
            mask: None,
            scale: 1.0 / (dims.head_dim as f64).sqrt(),
        }
    }

    /// Whether query `i` of (batch `b`, query head `h`) sees key `j`.
    pub fn sees(&self, dims: &Dims, b: usize, h: usize, i: usize, j: usize) -> bool {
        let rel = j as i64 - i as i64 - self.offset;
        if self.causal && rel > 0 {
            return false;
        }
        if self.window_left.is_some_and(|w| rel < -(w as i64)) {
            return false;
        }
        if self.window_right.is_some_and(|w| rel > w as i64) {
            return false;
        }
        if rel % self.dilation as i64 != 0 {
            return false;
        }
        match &self.mask {
            Some((m, mb, mh)) => {
                let bb = if *mb == 1 { 0 } else { b };
                let hh = if *mh == 1 { 0 } else { h };
                m[((bb * mh + hh) * dims.q_len + i) * dims.k_len + j]
            }
            None => true,
        }
    }
}

/// The forward's results.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// `[batch, q_heads, q_len, head_dim]`.
    pub output: Vec<f64>,
    /// Raw maximum score per query row (−∞ when nothing is visible).
    pub row_max: Vec<f64>,
    /// `log Σ exp(scale·(s − row_max))` per query row (−∞ when nothing is visible).
    pub log_denominator: Vec<f64>,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Softmax probabilities `[q_len, k_len]` of one (batch, query head), with the row statistics.
fn probabilities(
    q: &[f64],
    k: &[f64],
    dims: &Dims,
    vis: &Visibility,
    b: usize,
    h: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = dims.head_dim;
    let kvh = h / (dims.q_heads / dims.kv_heads);
    let q_off = (b * dims.q_heads + h) * dims.q_len * d;
    let k_off = (b * dims.kv_heads + kvh) * dims.k_len * d;
    let mut p = vec![0.0; dims.q_len * dims.k_len];
    let mut maxes = vec![f64::NEG_INFINITY; dims.q_len];
    let mut logs = vec![f64::NEG_INFINITY; dims.q_len];
    for i in 0..dims.q_len {
        let qi = &q[q_off + i * d..q_off + (i + 1) * d];
        let scores: Vec<Option<f64>> = (0..dims.k_len)
            .map(|j| {
                vis.sees(dims, b, h, i, j)
                    .then(|| dot(qi, &k[k_off + j * d..k_off + (j + 1) * d]))
            })
            .collect();
        let m = scores
            .iter()
            .flatten()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let l: f64 = scores
            .iter()
            .flatten()
            .map(|s| (vis.scale * (s - m)).exp())
            .sum();
        for (j, s) in scores.iter().enumerate() {
            if let Some(s) = s {
                p[i * dims.k_len + j] = (vis.scale * (s - m)).exp() / l;
            }
        }
        maxes[i] = m;
        logs[i] = l.ln();
    }
    (p, maxes, logs)
}

/// Forward attention.
pub fn forward(q: &[f64], k: &[f64], v: &[f64], dims: &Dims, vis: &Visibility) -> Forward {
    let d = dims.head_dim;
    let mut output = vec![0.0; dims.batch * dims.q_heads * dims.q_len * d];
    let mut row_max = Vec::new();
    let mut log_denominator = Vec::new();
    for b in 0..dims.batch {
        for h in 0..dims.q_heads {
            let (p, m, l) = probabilities(q, k, dims, vis, b, h);
            let kvh = h / (dims.q_heads / dims.kv_heads);
            let v_off = (b * dims.kv_heads + kvh) * dims.k_len * d;
            let o_off = (b * dims.q_heads + h) * dims.q_len * d;
            for i in 0..dims.q_len {
                for j in 0..dims.k_len {
                    let pij = p[i * dims.k_len + j];
                    for c in 0..d {
                        output[o_off + i * d + c] += pij * v[v_off + j * d + c];
                    }
                }
            }
            row_max.extend(m);
            log_denominator.extend(l);
        }
    }
    Forward {
        output,
        row_max,
        log_denominator,
    }
}

/// Analytic backward: `(d_query, d_key, d_value)` for the cotangent `d_output`. With
/// `P` the probabilities: `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP − rowsum(P ∘ dP))`,
/// `dQ = scale · dS K`, `dK = scale · dSᵀ Q`; key/value gradients summed over the query heads
/// that share them.
pub fn backward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_output: &[f64],
    dims: &Dims,
    vis: &Visibility,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = dims.head_dim;
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    for b in 0..dims.batch {
        for h in 0..dims.q_heads {
            let (p, _, _) = probabilities(q, k, dims, vis, b, h);
            let kvh = h / (dims.q_heads / dims.kv_heads);
            let k_off = (b * dims.kv_heads + kvh) * dims.k_len * d;
            let q_off = (b * dims.q_heads + h) * dims.q_len * d;
            for i in 0..dims.q_len {
                let go = &d_output[q_off + i * d..q_off + (i + 1) * d];
                let dp: Vec<f64> = (0..dims.k_len)
                    .map(|j| dot(go, &v[k_off + j * d..k_off + (j + 1) * d]))
                    .collect();
                let pr = &p[i * dims.k_len..(i + 1) * dims.k_len];
                let delta = dot(pr, &dp);
                for j in 0..dims.k_len {
                    let ds = pr[j] * (dp[j] - delta);
                    for c in 0..d {
                        dv[k_off + j * d + c] += pr[j] * go[c];
                        dq[q_off + i * d + c] += vis.scale * ds * k[k_off + j * d + c];
                        dk[k_off + j * d + c] += vis.scale * ds * q[q_off + i * d + c];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}
