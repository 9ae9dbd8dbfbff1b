//! Reference dual chunk attention in f64, materializing each row's scores (small shapes only).
//! Layout `[batch, heads, sequence, head_dim]`; query heads `h` read key/value head
//! `h / (q_heads / kv_heads)`. Query `i` sits at position `p = i + k_len − q_len`; key `j ≤ p`
//! is scored by the intra-chunk query when `j / chunk_len = p / chunk_len`, by the
//! successive-chunk query when `j / chunk_len = p / chunk_len − 1`, and by the inter-chunk
//! query otherwise; one softmax over all of them.

use super::attention::{Dims, Forward};

/// The branch (0 intra, 1 successive, 2 inter) scoring key `j` for the query at position `p`,
/// `None` for a key after it.
pub fn branch(p: usize, j: usize, chunk_len: usize) -> Option<usize> {
    if j > p {
        return None;
    }
    Some(match p / chunk_len - j / chunk_len {
        0 => 0,
        1 => 1,
        _ => 2,
    })
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One row's probabilities over the keys (0 for hidden ones), with its raw maximum and log
/// denominator, and the branch of each key.
struct Row {
    p: Vec<f64>,
    branches: Vec<Option<usize>>,
    max: f64,
    log_den: f64,
}

/// Offsets of query row `i` of (b, h) and of the first key of its key/value head.
fn offsets(dims: &Dims, b: usize, h: usize, i: usize) -> (usize, usize) {
    let d = dims.head_dim;
    let kvh = h / (dims.q_heads / dims.kv_heads);
    (
        ((b * dims.q_heads + h) * dims.q_len + i) * d,
        (b * dims.kv_heads + kvh) * dims.k_len * d,
    )
}

#[allow(clippy::too_many_arguments)]
fn row(
    q: [&[f64]; 3],
    k: &[f64],
    dims: &Dims,
    chunk_len: usize,
    scale: f64,
    b: usize,
    h: usize,
    i: usize,
) -> Row {
    let d = dims.head_dim;
    let (q_off, k_off) = offsets(dims, b, h, i);
    let pos = i + dims.k_len - dims.q_len;
    let branches: Vec<Option<usize>> = (0..dims.k_len).map(|j| branch(pos, j, chunk_len)).collect();
    let scores: Vec<Option<f64>> = branches
        .iter()
        .enumerate()
        .map(|(j, br)| {
            br.map(|br| {
                dot(
                    &q[br][q_off..q_off + d],
                    &k[k_off + j * d..k_off + (j + 1) * d],
                )
            })
        })
        .collect();
    let max = scores
        .iter()
        .flatten()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let mut p = vec![0.0; dims.k_len];
    if max == f64::NEG_INFINITY {
        return Row {
            p,
            branches,
            max,
            log_den: max,
        };
    }
    let l: f64 = scores
        .iter()
        .flatten()
        .map(|s| (scale * (s - max)).exp())
        .sum();
    for (j, s) in scores.iter().enumerate() {
        if let Some(s) = s {
            p[j] = (scale * (s - max)).exp() / l;
        }
    }
    Row {
        p,
        branches,
        max,
        log_den: l.ln(),
    }
}

/// Forward: the output, raw row maxima and log denominators of the one softmax.
pub fn forward(
    q: [&[f64]; 3],
    k: &[f64],
    v: &[f64],
    dims: &Dims,
    chunk_len: usize,
    scale: f64,
) -> Forward {
    let d = dims.head_dim;
    let mut output = vec![0.0; q[0].len()];
    let mut row_max = Vec::new();
    let mut log_denominator = Vec::new();
    for b in 0..dims.batch {
        for h in 0..dims.q_heads {
            for i in 0..dims.q_len {
                let r = row(q, k, dims, chunk_len, scale, b, h, i);
                let (o_off, v_off) = offsets(dims, b, h, i);
                for (j, pj) in r.p.iter().enumerate() {
                    for c in 0..d {
                        output[o_off + c] += pj * v[v_off + j * d + c];
                    }
                }
                row_max.push(r.max);
                log_denominator.push(r.log_den);
            }
        }
    }
    Forward {
        output,
        row_max,
        log_denominator,
    }
}

/// Analytic backward for the cotangent `d_output`: the three query gradients, then the key
/// and value gradients. With `P` the probabilities, `dP_ij = dO_i·v_j`,
/// `dS_ij = P_ij (dP_ij − Σ_j P_ij dP_ij)`; branch `b`'s query gradient
/// `scale · Σ_{j scored by b} dS_ij k_j`, `dK_j = scale · Σ_i dS_ij q_{b(i,j)}`,
/// `dV_j = Σ_i P_ij dO_i`, summed over the query heads sharing a key/value head.
pub fn backward(
    q: [&[f64]; 3],
    k: &[f64],
    v: &[f64],
    d_output: &[f64],
    dims: &Dims,
    chunk_len: usize,
    scale: f64,
) -> ([Vec<f64>; 3], Vec<f64>, Vec<f64>) {
    let d = dims.head_dim;
    let mut dq = [0, 1, 2].map(|_| vec![0.0; q[0].len()]);
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    for b in 0..dims.batch {
        for h in 0..dims.q_heads {
            for i in 0..dims.q_len {
                let r = row(q, k, dims, chunk_len, scale, b, h, i);
                let (q_off, k_off) = offsets(dims, b, h, i);
                let go = &d_output[q_off..q_off + d];
                let dp: Vec<f64> = (0..dims.k_len)
                    .map(|j| dot(go, &v[k_off + j * d..k_off + (j + 1) * d]))
                    .collect();
                let delta = dot(&r.p, &dp);
                for j in 0..dims.k_len {
                    let Some(br) = r.branches[j] else { continue };
                    let ds = r.p[j] * (dp[j] - delta);
                    for c in 0..d {
                        dv[k_off + j * d + c] += r.p[j] * go[c];
                        dq[br][q_off + c] += scale * ds * k[k_off + j * d + c];
                        dk[k_off + j * d + c] += scale * ds * q[br][q_off + c];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}
