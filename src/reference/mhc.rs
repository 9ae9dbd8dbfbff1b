//! Manifold-constrained hyper-connections in f64: the coefficients (RMS-scaled projection,
//! sigmoids, Sinkhorn–Knopp), the pre-aggregation and the post + residual mix, forward and
//! analytic backward (the Sinkhorn backward walks the kept iterations back). Tokens are rows of
//! `x [tokens, n, c]`; see `wgrad::mhc` for the formulas.

/// A problem's extents and settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MhcConfig {
    /// Tokens N.
    pub tokens: usize,
    /// Streams n (HC).
    pub n: usize,
    /// Width C of a stream.
    pub c: usize,
    /// Column normalizations of the Sinkhorn–Knopp projection.
    pub tmax: usize,
    /// ε of the RMS scale.
    pub rms_eps: f64,
    /// Added to h_pre.
    pub pre_eps: f64,
    /// ε of the Sinkhorn–Knopp steps.
    pub sinkhorn_eps: f64,
    /// Scale of h_post.
    pub post_mult: f64,
}

impl MhcConfig {
    /// `n² + 2n`: the columns of phi.
    pub fn m(&self) -> usize {
        self.n * self.n + 2 * self.n
    }

    /// `n·c`: a token's row length.
    pub fn k(&self) -> usize {
        self.n * self.c
    }
}

/// The coefficients: h_pre `[tokens, n]`, h_post `[tokens, n]`, h_res `[tokens, n, n]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Coefficients {
    /// `[tokens, n]`.
    pub h_pre: Vec<f64>,
    /// `[tokens, n]`.
    pub h_post: Vec<f64>,
    /// `[tokens, n, n]`.
    pub h_res: Vec<f64>,
}

impl Coefficients {
    /// h_pre, h_post and h_res one after the other.
    pub fn concatenated(&self) -> Vec<f64> {
        [&self.h_pre[..], &self.h_post, &self.h_res].concat()
    }
}

/// The gradients of the coefficients' inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct CoefficientGradients {
    /// d x, `[tokens, n, c]`.
    pub x: Vec<f64>,
    /// d phi, `[n·c, m]`.
    pub phi: Vec<f64>,
    /// d b, `[m]`.
    pub b: Vec<f64>,
    /// d α_pre, d α_post, d α_res.
    pub alphas: [f64; 3],
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// A token's RMS scale r and `mix = (x_mat · phi) · r`.
fn mix_of(x: &[f64], phi: &[f64], t: usize, cfg: &MhcConfig) -> (f64, Vec<f64>) {
    let (k, m) = (cfg.k(), cfg.m());
    let row = &x[t * k..(t + 1) * k];
    let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / k as f64 + cfg.rms_eps).sqrt();
    let mix = (0..m)
        .map(|j| (0..k).map(|i| row[i] * phi[i * m + j]).sum::<f64>() * r)
        .collect();
    (r, mix)
}

/// One Sinkhorn step kept for the backward: the matrix it normalized by columns (P for the
/// first step, else R), and its row and column denominators.
struct Step {
    r: Vec<f64>,
    rows: Vec<f64>,
    cols: Vec<f64>,
}

/// Column sums of `a` (`n × n`) plus ε.
fn col_denominators(a: &[f64], n: usize, eps: f64) -> Vec<f64> {
    (0..n)
        .map(|j| (0..n).map(|i| a[i * n + j]).sum::<f64>() + eps)
        .collect()
}

/// Sinkhorn–Knopp of the logits `l` (`n × n`): the result and every step.
fn sinkhorn(l: &[f64], cfg: &MhcConfig) -> (Vec<f64>, Vec<Step>) {
    let (n, eps) = (cfg.n, cfg.sinkhorn_eps);
    let mut p = vec![0.0; n * n];
    for i in 0..n {
        let row = &l[i * n..(i + 1) * n];
        let top = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row.iter().map(|v| (v - top).exp()).sum();
        for j in 0..n {
            p[i * n + j] = (row[j] - top).exp() / total;
        }
    }
    let shifted: Vec<f64> = p.iter().map(|v| v + eps).collect();
    let cols = col_denominators(&shifted, n, eps);
    let mut y: Vec<f64> = (0..n * n).map(|e| shifted[e] / cols[e % n]).collect();
    let mut steps = vec![Step {
        r: p,
        rows: vec![0.0; n],
        cols,
    }];
    for _ in 1..cfg.tmax {
        let rows: Vec<f64> = (0..n)
            .map(|i| y[i * n..(i + 1) * n].iter().sum::<f64>() + eps)
            .collect();
        let r: Vec<f64> = (0..n * n).map(|e| y[e] / rows[e / n]).collect();
        let cols = col_denominators(&r, n, eps);
        y = (0..n * n).map(|e| r[e] / cols[e % n]).collect();
        steps.push(Step { r, rows, cols });
    }
    (y, steps)
}

/// The gradient of the logits from the gradient `g` of Sinkhorn's result.
fn sinkhorn_backward(steps: &[Step], g: &[f64], cfg: &MhcConfig) -> Vec<f64> {
    let (n, eps) = (cfg.n, cfg.sinkhorn_eps);
    // Back through a column normalization Y = A / d (A given): g_A.
    let through_cols = |g: &[f64], a: &[f64], d: &[f64]| -> Vec<f64> {
        let dots: Vec<f64> = (0..n)
            .map(|j| (0..n).map(|i| g[i * n + j] * a[i * n + j] / d[j]).sum())
            .collect();
        (0..n * n)
            .map(|e| (g[e] - dots[e % n]) / d[e % n])
            .collect()
    };
    let mut g = g.to_vec();
    for s in steps[1..].iter().rev() {
        let gr = through_cols(&g, &s.r, &s.cols);
        // Back through the row normalization R = Y / d.
        let dots: Vec<f64> = (0..n)
            .map(|i| (0..n).map(|j| gr[i * n + j] * s.r[i * n + j]).sum())
            .collect();
        g = (0..n * n)
            .map(|e| (gr[e] - dots[e / n]) / s.rows[e / n])
            .collect();
    }
    let first = &steps[0];
    let shifted: Vec<f64> = first.r.iter().map(|v| v + eps).collect();
    let gp = through_cols(&g, &shifted, &first.cols);
    // The row softmax.
    let p = &first.r;
    let dots: Vec<f64> = (0..n)
        .map(|i| (0..n).map(|j| gp[i * n + j] * p[i * n + j]).sum())
        .collect();
    (0..n * n).map(|e| p[e] * (gp[e] - dots[e / n])).collect()
}

/// The logits of a token: `α·mix + b` per segment (pre, post, res).
fn logits(mix: &[f64], b: &[f64], alphas: [f64; 3], n: usize) -> Vec<f64> {
    mix.iter()
        .zip(b)
        .enumerate()
        .map(|(j, (m, b))| alphas[segment(j, n)] * m + b)
        .collect()
}

/// Which α scales column `j` of mix: 0 pre, 1 post, 2 res.
fn segment(j: usize, n: usize) -> usize {
    (j / n).min(2)
}

/// The coefficients of every token of `x [tokens, n, c]` with `phi [n·c, m]`, `b [m]` and the
/// gains `alphas` (pre, post, res).
pub fn coefficients(
    x: &[f64],
    phi: &[f64],
    b: &[f64],
    alphas: [f64; 3],
    cfg: &MhcConfig,
) -> Coefficients {
    let n = cfg.n;
    let mut out = Coefficients {
        h_pre: Vec::new(),
        h_post: Vec::new(),
        h_res: Vec::new(),
    };
    for t in 0..cfg.tokens {
        let (_, mix) = mix_of(x, phi, t, cfg);
        let l = logits(&mix, b, alphas, n);
        out.h_pre
            .extend(l[..n].iter().map(|&z| sigmoid(z) + cfg.pre_eps));
        out.h_post
            .extend(l[n..2 * n].iter().map(|&z| cfg.post_mult * sigmoid(z)));
        out.h_res.extend(sinkhorn(&l[2 * n..], cfg).0);
    }
    out
}

/// The gradients of `⟨dh_pre, h_pre⟩ + ⟨dh_post, h_post⟩ + ⟨dh_res, h_res⟩` (zeros for an
/// absent cotangent).
#[allow(clippy::too_many_arguments)]
pub fn coefficients_backward(
    x: &[f64],
    phi: &[f64],
    b: &[f64],
    alphas: [f64; 3],
    dh_pre: &[f64],
    dh_post: &[f64],
    dh_res: &[f64],
    cfg: &MhcConfig,
) -> CoefficientGradients {
    let (n, k, m) = (cfg.n, cfg.k(), cfg.m());
    let mut grads = CoefficientGradients {
        x: vec![0.0; x.len()],
        phi: vec![0.0; phi.len()],
        b: vec![0.0; m],
        alphas: [0.0; 3],
    };
    for t in 0..cfg.tokens {
        let (r, mix) = mix_of(x, phi, t, cfg);
        let l = logits(&mix, b, alphas, n);
        // The logits' gradient g.
        let mut g = vec![0.0; m];
        for i in 0..n {
            let s = sigmoid(l[i]);
            g[i] = dh_pre[t * n + i] * s * (1.0 - s);
            let s = sigmoid(l[n + i]);
            g[n + i] = dh_post[t * n + i] * cfg.post_mult * s * (1.0 - s);
        }
        let (_, steps) = sinkhorn(&l[2 * n..], cfg);
        let gres = sinkhorn_backward(&steps, &dh_res[t * n * n..(t + 1) * n * n], cfg);
        g[2 * n..].copy_from_slice(&gres);
        // mix = (x_mat · phi) · r.
        let gmix: Vec<f64> = (0..m).map(|j| alphas[segment(j, n)] * g[j]).collect();
        for j in 0..m {
            grads.b[j] += g[j];
            grads.alphas[segment(j, n)] += g[j] * mix[j];
        }
        let row = &x[t * k..(t + 1) * k];
        // ∂r/∂x_i = −r³ x_i / k; Σ_j gmix_j (x_mat · phi)_j = Σ_j gmix_j mix_j / r.
        let through_r: f64 = (0..m).map(|j| gmix[j] * mix[j]).sum::<f64>() / r;
        for i in 0..k {
            let direct: f64 = (0..m).map(|j| gmix[j] * r * phi[i * m + j]).sum();
            grads.x[t * k + i] = direct - through_r * r * r * r * row[i] / k as f64;
            let dphi = &mut grads.phi[i * m..(i + 1) * m];
            for (d, gm) in dphi.iter_mut().zip(&gmix) {
                *d += row[i] * r * gm;
            }
        }
    }
    grads
}

/// `out[t, c] = Σ_i h_pre[t, i] x[t, i, c]`, `[tokens, c]`.
pub fn pre(x: &[f64], h_pre: &[f64], cfg: &MhcConfig) -> Vec<f64> {
    let (n, c) = (cfg.n, cfg.c);
    let mut out = vec![0.0; cfg.tokens * c];
    for t in 0..cfg.tokens {
        for i in 0..n {
            for col in 0..c {
                out[t * c + col] += h_pre[t * n + i] * x[(t * n + i) * c + col];
            }
        }
    }
    out
}

/// (d x, d h_pre) of `⟨g, pre(x, h_pre)⟩`.
pub fn pre_backward(x: &[f64], h_pre: &[f64], g: &[f64], cfg: &MhcConfig) -> (Vec<f64>, Vec<f64>) {
    let (n, c) = (cfg.n, cfg.c);
    let mut dx = vec![0.0; x.len()];
    let mut dh = vec![0.0; h_pre.len()];
    for t in 0..cfg.tokens {
        for i in 0..n {
            for col in 0..c {
                let at = (t * n + i) * c + col;
                dx[at] = h_pre[t * n + i] * g[t * c + col];
                dh[t * n + i] += g[t * c + col] * x[at];
            }
        }
    }
    (dx, dh)
}

/// `out[t, o, c] = Σ_i h_res[t, o, i] x[t, i, c] + h_post[t, o] f[t, c]`, `[tokens, n, c]`.
pub fn post_res(x: &[f64], f: &[f64], h_post: &[f64], h_res: &[f64], cfg: &MhcConfig) -> Vec<f64> {
    let (n, c) = (cfg.n, cfg.c);
    let mut out = vec![0.0; x.len()];
    for t in 0..cfg.tokens {
        for o in 0..n {
            for col in 0..c {
                let mixed: f64 = (0..n)
                    .map(|i| h_res[(t * n + o) * n + i] * x[(t * n + i) * c + col])
                    .sum();
                out[(t * n + o) * c + col] = mixed + h_post[t * n + o] * f[t * c + col];
            }
        }
    }
    out
}

/// (d x, d f, d h_post, d h_res) of `⟨g, post_res(x, f, h_post, h_res)⟩`.
pub fn post_res_backward(
    x: &[f64],
    f: &[f64],
    h_post: &[f64],
    h_res: &[f64],
    g: &[f64],
    cfg: &MhcConfig,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, c) = (cfg.n, cfg.c);
    let mut dx = vec![0.0; x.len()];
    let mut df = vec![0.0; f.len()];
    let mut dpost = vec![0.0; h_post.len()];
    let mut dres = vec![0.0; h_res.len()];
    for t in 0..cfg.tokens {
        for o in 0..n {
            for col in 0..c {
                let go = g[(t * n + o) * c + col];
                df[t * c + col] += h_post[t * n + o] * go;
                dpost[t * n + o] += go * f[t * c + col];
                for i in 0..n {
                    let at = (t * n + i) * c + col;
                    dx[at] += h_res[(t * n + o) * n + i] * go;
                    dres[(t * n + o) * n + i] += go * x[at];
                }
            }
        }
    }
    (dx, df, dpost, dres)
}
