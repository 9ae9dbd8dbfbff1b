//! Reference gated delta recurrence in f64 (Gated DeltaNet with a scalar decay per head, the
//! Kimi Delta Attention core with a decay per key channel).
//!
//! Dense row-major layouts: `q`, `k` `[B, T, Hk, K]`; `v` `[B, T, Hv, V]`; `beta` `[B, T, Hv]`;
//! `log_decay` `[B, T, Hv]` (scalar) or `[B, T, Hv, K]` (per channel); states `[B, Hv, K, V]`;
//! output `[B, T, Hv, V]`. Value head `h` reads key head `h / (Hv / Hk)`.
//!
//! Per token, with `a = exp(log_decay)` (broadcast over the key channels when scalar):
//!
//! ```text
//! D = diag(a)·S_prev          e = v − Dᵀk          S = D + β·k·eᵀ          o = scale·Sᵀq
//! ```

/// Sizes of one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    /// B.
    pub batch: usize,
    /// T.
    pub time: usize,
    /// Hk (query and key heads).
    pub key_heads: usize,
    /// Hv (value heads), a multiple of `key_heads`.
    pub value_heads: usize,
    /// K.
    pub key_dim: usize,
    /// V.
    pub value_dim: usize,
    /// Decay per key channel (`[B, T, Hv, K]`) instead of one per head (`[B, T, Hv]`).
    pub per_channel: bool,
    /// Output scale.
    pub scale: f64,
}

impl Dims {
    fn decay(&self, g: &[f64], b: usize, t: usize, h: usize, i: usize) -> f64 {
        let row = (b * self.time + t) * self.value_heads + h;
        if self.per_channel {
            g[row * self.key_dim + i].exp()
        } else {
            g[row].exp()
        }
    }

    fn key_head(&self, h: usize) -> usize {
        h / (self.value_heads / self.key_heads)
    }

    fn qk(&self, b: usize, t: usize, h: usize, i: usize) -> usize {
        ((b * self.time + t) * self.key_heads + self.key_head(h)) * self.key_dim + i
    }

    fn vo(&self, b: usize, t: usize, h: usize, j: usize) -> usize {
        ((b * self.time + t) * self.value_heads + h) * self.value_dim + j
    }

    fn state_len(&self) -> usize {
        self.batch * self.value_heads * self.key_dim * self.value_dim
    }
}

/// Output and final state of [`forward`].
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// `[B, T, Hv, V]`.
    pub output: Vec<f64>,
    /// `[B, Hv, K, V]`.
    pub final_state: Vec<f64>,
}

/// Every state: `states[t]` is the state before token `t` (`states[0]` the initial state),
/// `states[T]` the final one; each `[B, Hv, K, V]`.
fn all_states(
    d: &Dims,
    k: &[f64],
    v: &[f64],
    beta: &[f64],
    g: &[f64],
    initial: Option<&[f64]>,
) -> Vec<Vec<f64>> {
    let (kd, vd) = (d.key_dim, d.value_dim);
    let mut states = vec![initial.map_or_else(|| vec![0.0; d.state_len()], <[f64]>::to_vec)];
    for t in 0..d.time {
        let mut s = states[t].clone();
        for b in 0..d.batch {
            for h in 0..d.value_heads {
                let base = (b * d.value_heads + h) * kd * vd;
                let bt = beta[(b * d.time + t) * d.value_heads + h];
                for i in 0..kd {
                    let a = d.decay(g, b, t, h, i);
                    for j in 0..vd {
                        s[base + i * vd + j] *= a;
                    }
                }
                for j in 0..vd {
                    let predicted: f64 = (0..kd)
                        .map(|i| s[base + i * vd + j] * k[d.qk(b, t, h, i)])
                        .sum();
                    let error = v[d.vo(b, t, h, j)] - predicted;
                    for i in 0..kd {
                        s[base + i * vd + j] += bt * k[d.qk(b, t, h, i)] * error;
                    }
                }
            }
        }
        states.push(s);
    }
    states
}

/// The recurrence over all tokens; `initial` absent = zeros.
pub fn forward(
    d: &Dims,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    beta: &[f64],
    log_decay: &[f64],
    initial: Option<&[f64]>,
) -> Forward {
    let states = all_states(d, k, v, beta, log_decay, initial);
    let (kd, vd) = (d.key_dim, d.value_dim);
    let mut output = vec![0.0; d.batch * d.time * d.value_heads * vd];
    for b in 0..d.batch {
        for t in 0..d.time {
            for h in 0..d.value_heads {
                let base = (b * d.value_heads + h) * kd * vd;
                for j in 0..vd {
                    output[d.vo(b, t, h, j)] = d.scale
                        * (0..kd)
                            .map(|i| states[t + 1][base + i * vd + j] * q[d.qk(b, t, h, i)])
                            .sum::<f64>();
                }
            }
        }
    }
    Forward {
        output,
        final_state: states.last().cloned().unwrap_or_default(),
    }
}

/// Gradients of [`backward`], each shaped like its input.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    /// `[B, T, Hk, K]` (summed over the value heads sharing a key head).
    pub query: Vec<f64>,
    /// `[B, T, Hk, K]` (summed likewise).
    pub key: Vec<f64>,
    /// `[B, T, Hv, V]`.
    pub value: Vec<f64>,
    /// `[B, T, Hv]`.
    pub beta: Vec<f64>,
    /// `[B, T, Hv]` or `[B, T, Hv, K]`.
    pub log_decay: Vec<f64>,
    /// `[B, Hv, K, V]`.
    pub initial_state: Vec<f64>,
}

/// Analytic backward: walks the tokens in reverse with `dS`, the gradient of the state after
/// the token. Absent cotangents are zeros.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    d: &Dims,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    beta: &[f64],
    log_decay: &[f64],
    initial: Option<&[f64]>,
    d_output: Option<&[f64]>,
    d_final: Option<&[f64]>,
) -> Gradients {
    let states = all_states(d, k, v, beta, log_decay, initial);
    let (kd, vd) = (d.key_dim, d.value_dim);
    let qk_len = d.batch * d.time * d.key_heads * kd;
    let gate_len = d.batch * d.time * d.value_heads * if d.per_channel { kd } else { 1 };
    let mut grads = Gradients {
        query: vec![0.0; qk_len],
        key: vec![0.0; qk_len],
        value: vec![0.0; v.len()],
        beta: vec![0.0; beta.len()],
        log_decay: vec![0.0; gate_len],
        initial_state: d_final.map_or_else(|| vec![0.0; d.state_len()], <[f64]>::to_vec),
    };
    let ds = &mut grads.initial_state; // becomes dS_prev as the walk goes back
    for t in (0..d.time).rev() {
        let prev = &states[t];
        let next = &states[t + 1];
        for b in 0..d.batch {
            for h in 0..d.value_heads {
                let base = (b * d.value_heads + h) * kd * vd;
                let row = (b * d.time + t) * d.value_heads + h;
                let bt = beta[row];
                let a: Vec<f64> = (0..kd).map(|i| d.decay(log_decay, b, t, h, i)).collect();
                let kv: Vec<f64> = (0..kd).map(|i| k[d.qk(b, t, h, i)]).collect();
                let qv: Vec<f64> = (0..kd).map(|i| q[d.qk(b, t, h, i)]).collect();
                let at = |i: usize, j: usize| base + i * vd + j;
                // o = scale·Sᵀq
                let dout: Vec<f64> = (0..vd)
                    .map(|j| d_output.map_or(0.0, |g| g[d.vo(b, t, h, j)]))
                    .collect();
                for i in 0..kd {
                    let mut acc = 0.0;
                    for j in 0..vd {
                        ds[at(i, j)] += d.scale * qv[i] * dout[j];
                        acc += next[at(i, j)] * dout[j];
                    }
                    grads.query[d.qk(b, t, h, i)] += d.scale * acc;
                }
                // S = D + β·k·eᵀ, e = v − Dᵀk, D = diag(a)·S_prev
                let decayed = |i: usize, j: usize| a[i] * prev[at(i, j)];
                let error: Vec<f64> = (0..vd)
                    .map(|j| {
                        v[d.vo(b, t, h, j)] - (0..kd).map(|i| decayed(i, j) * kv[i]).sum::<f64>()
                    })
                    .collect();
                let kds: Vec<f64> = (0..vd)
                    .map(|j| (0..kd).map(|i| ds[at(i, j)] * kv[i]).sum())
                    .collect();
                grads.beta[row] = (0..vd).map(|j| kds[j] * error[j]).sum();
                let dp: Vec<f64> = (0..vd)
                    .map(|j| {
                        grads.value[d.vo(b, t, h, j)] = bt * kds[j];
                        -bt * kds[j]
                    })
                    .collect();
                let mut dg_scalar = 0.0;
                for i in 0..kd {
                    let mut dk = 0.0;
                    let mut dg = 0.0;
                    for j in 0..vd {
                        let dsij = ds[at(i, j)];
                        dk += bt * dsij * error[j] + decayed(i, j) * dp[j];
                        let dd = dsij + kv[i] * dp[j];
                        dg += dd * decayed(i, j);
                        ds[at(i, j)] = a[i] * dd;
                    }
                    grads.key[d.qk(b, t, h, i)] += dk;
                    if d.per_channel {
                        grads.log_decay[row * kd + i] = dg;
                    } else {
                        dg_scalar += dg;
                    }
                }
                if !d.per_channel {
                    grads.log_decay[row] = dg_scalar;
                }
            }
        }
    }
    grads
}
