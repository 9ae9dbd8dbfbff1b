//! Multi-token attention in f64: the future masked to −1e9, the softmax (or sparsemax) of each
//! row, PyTorch's `conv2d`, the output's future zeroed; and the analytic backward.

use super::loss;

/// Shapes and settings of one problem (as [`crate::mta::MtaOptions`] and the tensors' shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtaConfig {
    /// Batch.
    pub batch: usize,
    /// Input channels (heads).
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// L, the side of the score planes.
    pub side: usize,
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Stride per axis.
    pub stride: [usize; 2],
    /// Padding per axis.
    pub padding: [usize; 2],
    /// Dilation per axis.
    pub dilation: [usize; 2],
    /// Groups.
    pub groups: usize,
    /// Sparsemax instead of softmax.
    pub sparse: bool,
}

impl MtaConfig {
    /// The output's side along axis `a`.
    pub fn out_side(&self, a: usize) -> usize {
        (self.side + 2 * self.padding[a] - self.dilation[a] * (self.kernel[a] - 1) - 1)
            / self.stride[a]
            + 1
    }

    /// The input position along axis `a` that output position `o` reads through tap `k`, if
    /// inside the plane.
    fn source(&self, a: usize, o: usize, k: usize) -> Option<usize> {
        let t = (o * self.stride[a] + k * self.dilation[a]).checked_sub(self.padding[a])?;
        (t < self.side).then_some(t)
    }
}

/// The scores with the future (column > row) set to −1e9.
fn masked(scores: &[f64], c: &MtaConfig) -> Vec<f64> {
    let l = c.side;
    (0..scores.len())
        .map(|e| if e % l > (e / l) % l { -1e9 } else { scores[e] })
        .collect()
}

/// The probabilities `act(mask₋∞(scores))`, `[batch, c_in, L, L]`.
pub fn probabilities(scores: &[f64], c: &MtaConfig) -> Vec<f64> {
    let rows = c.batch * c.c_in * c.side;
    let m = masked(scores, c);
    if c.sparse {
        loss::sparsemax(&m, rows, c.side)
    } else {
        loss::softmax(&m, rows, c.side)
    }
}

/// Every output element outside the future (column ≤ row) with its output channel.
fn past_outputs(c: &MtaConfig) -> impl Iterator<Item = (usize, usize)> {
    let so = c.out_side(0);
    (0..c.batch * c.c_out * so * so)
        .filter(move |o| o % so <= (o / so) % so)
        .map(move |o| (o, (o / (so * so)) % c.c_out))
}

/// Visit every (output element, weight element, input element) triple of the convolution
/// outside the output's future: `f(out_index, weight_index, in_index)`.
fn each_tap(c: &MtaConfig, mut f: impl FnMut(usize, usize, usize)) {
    let (so, l) = (c.out_side(0), c.side);
    let cin_g = c.c_in / c.groups;
    let cout_g = c.c_out / c.groups;
    for n in 0..c.batch {
        for co in 0..c.c_out {
            for y in 0..so {
                for x in 0..so {
                    let out = ((n * c.c_out + co) * so + y) * so + x;
                    if x > y {
                        continue; // the output's future is zeroed
                    }
                    for ci in 0..cin_g {
                        let plane = n * c.c_in + (co / cout_g) * cin_g + ci;
                        for ky in 0..c.kernel[0] {
                            for kx in 0..c.kernel[1] {
                                let (Some(iy), Some(ix)) = (c.source(0, y, ky), c.source(1, x, kx))
                                else {
                                    continue;
                                };
                                let w = ((co * cin_g + ci) * c.kernel[0] + ky) * c.kernel[1] + kx;
                                f(out, w, (plane * l + iy) * l + ix);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The output `[batch, c_out, L', L']`.
pub fn forward(scores: &[f64], weight: &[f64], bias: Option<&[f64]>, c: &MtaConfig) -> Vec<f64> {
    let p = probabilities(scores, c);
    let so = c.out_side(0);
    let mut out = vec![0.0; c.batch * c.c_out * so * so];
    for (o, co) in past_outputs(c) {
        out[o] = bias.map_or(0.0, |b| b[co]);
    }
    each_tap(c, |o, w, i| out[o] += weight[w] * p[i]);
    out
}

/// The gradients of `⟨dy, y⟩`: (d scores, d weight, d bias).
pub fn backward(
    scores: &[f64],
    weight: &[f64],
    dy: &[f64],
    c: &MtaConfig,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let p = probabilities(scores, c);
    let mut dp = vec![0.0; p.len()];
    let mut dw = vec![0.0; weight.len()];
    let mut db = vec![0.0; c.c_out];
    for (o, co) in past_outputs(c) {
        db[co] += dy[o];
    }
    each_tap(c, |o, w, i| {
        dp[i] += weight[w] * dy[o];
        dw[w] += dy[o] * p[i];
    });
    let rows = c.batch * c.c_in * c.side;
    let ds = if c.sparse {
        loss::sparsemax_backward(&masked(scores, c), &dp, rows, c.side)
    } else {
        loss::softmax_backward_from_output(&p, &dp, rows, c.side, false)
    };
    (ds, dw, db)
}
