//! f64 reference of the dense matmul family (see [`crate::matmul`]): forward
//! `Y = act(A·B + bias)` with batches, transposed operands and a shared operand, and the
//! analytic backward `G = dY ⊙ act'(pre)`, `dA = G·Bᵀ`, `dB = Aᵀ·G`, `dbias = Σ_rows G`.

use crate::activation::Activation;
use crate::reference::activation::{act, act_grad};

/// The extents and layout of one [`forward`]: `batch` products of `[m, k] @ [k, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Problem {
    /// Number of batches (the product of the batch dimensions; 1 without any).
    pub batch: usize,
    /// Rows of each product.
    pub m: usize,
    /// Columns of each product.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// `A` has one matrix per batch (else one matrix shared by every batch).
    pub a_batched: bool,
    /// `B` has one matrix per batch (else one shared).
    pub b_batched: bool,
    /// `A` is stored `[k, m]`.
    pub transpose_a: bool,
    /// `B` is stored `[n, k]`.
    pub transpose_b: bool,
    /// Epilogue.
    pub activation: Option<Activation>,
}

impl Problem {
    /// A single `[m, k] @ [k, n]` product without transposes or activation.
    pub fn new(m: usize, n: usize, k: usize) -> Problem {
        Problem {
            batch: 1,
            m,
            n,
            k,
            a_batched: false,
            b_batched: false,
            transpose_a: false,
            transpose_b: false,
            activation: None,
        }
    }

    /// Elements of `A` (every batch it stores).
    pub fn a_len(&self) -> usize {
        self.m * self.k * if self.a_batched { self.batch } else { 1 }
    }

    /// Elements of `B`.
    pub fn b_len(&self) -> usize {
        self.k * self.n * if self.b_batched { self.batch } else { 1 }
    }

    /// Elements of the output.
    pub fn out_len(&self) -> usize {
        self.batch * self.m * self.n
    }

    /// Storage index of `A_b(i, l)`.
    pub fn a_index(&self, b: usize, i: usize, l: usize) -> usize {
        let base = if self.a_batched {
            b * self.m * self.k
        } else {
            0
        };
        base + if self.transpose_a {
            l * self.m + i
        } else {
            i * self.k + l
        }
    }

    /// Storage index of `B_b(l, j)`.
    pub fn b_index(&self, b: usize, l: usize, j: usize) -> usize {
        let base = if self.b_batched {
            b * self.k * self.n
        } else {
            0
        };
        base + if self.transpose_b {
            j * self.k + l
        } else {
            l * self.n + j
        }
    }

    /// Index of output element `(b, i, j)`.
    pub fn out_index(&self, b: usize, i: usize, j: usize) -> usize {
        (b * self.m + i) * self.n + j
    }
}

/// The pre-activation `A·B + bias` (f64).
pub fn pre_activation(p: &Problem, a: &[f64], b: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    let mut pre = vec![0.0; p.out_len()];
    for bi in 0..p.batch {
        for i in 0..p.m {
            for j in 0..p.n {
                let mut sum = 0.0;
                for l in 0..p.k {
                    sum += a[p.a_index(bi, i, l)] * b[p.b_index(bi, l, j)];
                }
                pre[p.out_index(bi, i, j)] = sum + bias.map_or(0.0, |c| c[j]);
            }
        }
    }
    pre
}

/// Forward: `act(A·B + bias)` (the pre-activation itself without an activation).
pub fn forward(p: &Problem, a: &[f64], b: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    let pre = pre_activation(p, a, b, bias);
    match p.activation {
        Some(kind) => pre.iter().map(|&v| act(kind, v)).collect(),
        None => pre,
    }
}

/// Gradients of [`forward`]: `(dA, dB, dbias)`, each in its operand's storage layout
/// (`dbias` only when a bias is given).
pub fn backward(
    p: &Problem,
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
    dy: &[f64],
) -> (Vec<f64>, Vec<f64>, Option<Vec<f64>>) {
    // G = dY ⊙ act'(pre).
    let g: Vec<f64> = match p.activation {
        Some(kind) => pre_activation(p, a, b, bias)
            .iter()
            .zip(dy)
            .map(|(&v, &d)| d * act_grad(kind, v))
            .collect(),
        None => dy.to_vec(),
    };
    let mut da = vec![0.0; p.a_len()];
    let mut db = vec![0.0; p.b_len()];
    let mut dbias = vec![0.0; p.n];
    for bi in 0..p.batch {
        for i in 0..p.m {
            for j in 0..p.n {
                let gij = g[p.out_index(bi, i, j)];
                dbias[j] += gij;
                for l in 0..p.k {
                    // y(i, j) += A(i, l)·B(l, j)
                    da[p.a_index(bi, i, l)] += gij * b[p.b_index(bi, l, j)];
                    db[p.b_index(bi, l, j)] += a[p.a_index(bi, i, l)] * gij;
                }
            }
        }
    }
    (da, db, bias.map(|_| dbias))
}
