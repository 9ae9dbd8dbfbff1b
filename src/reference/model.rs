//! The decoder-only transformer of [`crate::model`] in f64 on the CPU: forward and analytic
//! backward, assembled from the other references of this module (embedding, matmul, norm,
//! RoPE, attention, gated MLP, cross-entropy). Written to be read; small shapes only
//! (attention materializes every score matrix).
//!
//! Parameters are `Vec<f64>` in the model's fixed order ([`ModelConfig::parameter_shapes`]);
//! activations are row-major with one row per token, `N = batch·seq` rows.

use crate::activation::Activation;
use crate::model::{BLOCK_PARAMETERS, ModelConfig};
use crate::norm::CastingMode;
use crate::reference::{attention, embedding, loss, matmul, mlp, norm, rope};
use crate::{DType, Result};

/// One block's parameters, borrowed from the flat list (shapes as in
/// [`ModelConfig::parameter_shapes`]).
#[derive(Debug, Clone, Copy)]
pub struct BlockParameters<'a> {
    /// RMSNorm weight before attention, `[d_model]`.
    pub attention_norm: &'a [f64],
    /// Query projection `[heads·head_dim, d_model]`.
    pub query: &'a [f64],
    /// Key projection `[heads·head_dim, d_model]`.
    pub key: &'a [f64],
    /// Value projection `[heads·head_dim, d_model]`.
    pub value: &'a [f64],
    /// Output projection `[d_model, heads·head_dim]`.
    pub output: &'a [f64],
    /// RMSNorm weight before the MLP, `[d_model]`.
    pub mlp_norm: &'a [f64],
    /// Gate projection `[ffn, d_model]`.
    pub gate: &'a [f64],
    /// Up projection `[ffn, d_model]`.
    pub up: &'a [f64],
    /// Down projection `[d_model, ffn]`.
    pub down: &'a [f64],
}

/// The model's parameters, borrowed from the flat list in the fixed order.
#[derive(Debug, Clone)]
pub struct Parameters<'a> {
    /// Token embedding `[vocab, d_model]`.
    pub embedding: &'a [f64],
    /// The blocks, in order.
    pub blocks: Vec<BlockParameters<'a>>,
    /// Final RMSNorm weight `[d_model]`.
    pub final_norm: &'a [f64],
    /// LM head `[vocab, d_model]`.
    pub lm_head: &'a [f64],
}

impl<'a> Parameters<'a> {
    /// View a flat parameter list (the order of [`ModelConfig::parameter_shapes`]).
    ///
    /// # Panics
    /// When the list does not have the config's parameter count and sizes (a test helper's
    /// contract, not a user input).
    pub fn new(config: &ModelConfig, flat: &'a [Vec<f64>]) -> Parameters<'a> {
        let shapes = config.parameter_shapes();
        assert_eq!(flat.len(), shapes.len(), "parameter count");
        for ((name, shape), p) in shapes.iter().zip(flat) {
            assert_eq!(p.len(), shape.iter().product::<usize>(), "size of {name}");
        }
        let blocks = (0..config.layers)
            .map(|l| {
                let b = &flat[1 + l * BLOCK_PARAMETERS..1 + (l + 1) * BLOCK_PARAMETERS];
                BlockParameters {
                    attention_norm: &b[0],
                    query: &b[1],
                    key: &b[2],
                    value: &b[3],
                    output: &b[4],
                    mlp_norm: &b[5],
                    gate: &b[6],
                    up: &b[7],
                    down: &b[8],
                }
            })
            .collect();
        let tail = 1 + config.layers * BLOCK_PARAMETERS;
        Parameters {
            embedding: &flat[0],
            blocks,
            final_norm: &flat[tail],
            lm_head: &flat[tail + 1],
        }
    }
}

/// The RoPE tables the model uses, `(cos, sin)` `[seq_len, head_dim/2]`, as the GPU model
/// stores them (computed in f64 and rounded once to f32).
pub fn rope_tables(config: &ModelConfig) -> Result<(Vec<f64>, Vec<f64>)> {
    let (rates, _) =
        crate::rope::frequencies(config.head_dim, config.rope_base, &Default::default())?;
    let mut cos = Vec::with_capacity(config.seq_len * rates.len());
    let mut sin = Vec::with_capacity(config.seq_len * rates.len());
    for p in 0..config.seq_len {
        for &rate in &rates {
            cos.push(f64::from((p as f64 * rate).cos() as f32));
            sin.push(f64::from((p as f64 * rate).sin() as f32));
        }
    }
    Ok((cos, sin))
}

/// The product `x · Wᵀ` as a [`matmul::Problem`]: `x` `[rows, inputs]`, `W` stored
/// `[outputs, inputs]` (transposed operand).
fn projection(rows: usize, inputs: usize, outputs: usize) -> matmul::Problem {
    matmul::Problem {
        transpose_b: true,
        ..matmul::Problem::new(rows, outputs, inputs)
    }
}

/// `y = x · Wᵀ`: `x` `[rows, inputs]`, `w` `[outputs, inputs]` → `[rows, outputs]`.
pub fn linear(x: &[f64], w: &[f64], rows: usize, inputs: usize, outputs: usize) -> Vec<f64> {
    matmul::forward(&projection(rows, inputs, outputs), x, w, None)
}

/// Backward of [`linear`]: `(dx = dy · W, dW = dyᵀ · x)`.
pub fn linear_backward(
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    rows: usize,
    inputs: usize,
    outputs: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (dx, dw, _) = matmul::backward(&projection(rows, inputs, outputs), x, w, None, dy);
    (dx, dw)
}

/// Embedding lookup: row `r` of the result is row `tokens[r]` of `table` `[vocab, width]`
/// ([`embedding::forward`]).
pub fn embedding(table: &[f64], tokens: &[i32], width: usize) -> Vec<f64> {
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    embedding::forward(table, table.len() / width.max(1), width, &ids)
}

/// Backward of [`embedding()`]: `dtable[t] = Σ_{r: tokens[r] = t} dy[r]`
/// ([`embedding::backward`]).
pub fn embedding_backward(dy: &[f64], tokens: &[i32], vocab: usize, width: usize) -> Vec<f64> {
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    embedding::backward(dy, vocab, width, &ids, None)
}

/// Shapes of one forward.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    batch: usize,
    seq: usize,
    rows: usize,
    d: usize,
    heads: usize,
    head_dim: usize,
    ffn: usize,
}

impl Sizes {
    fn projected(&self) -> usize {
        self.heads * self.head_dim
    }

    fn heads(&self) -> rope::Heads {
        rope::Heads {
            batch: self.batch,
            seq: self.seq,
            heads: self.heads,
            bhsd: false,
        }
    }

    fn dims(&self) -> attention::Dims {
        attention::Dims {
            batch: self.batch,
            q_heads: self.heads,
            kv_heads: self.heads,
            q_len: self.seq,
            k_len: self.seq,
            head_dim: self.head_dim,
        }
    }

    fn visibility(&self) -> attention::Visibility {
        attention::Visibility {
            causal: true,
            ..attention::Visibility::full(&self.dims())
        }
    }

    /// `[batch, seq, heads, head_dim]` → `[batch, heads, seq, head_dim]` (the reference
    /// attention's layout), or back with `back`.
    fn transpose(&self, x: &[f64], back: bool) -> Vec<f64> {
        let (s, h, d) = (self.seq, self.heads, self.head_dim);
        let mut out = vec![0.0; x.len()];
        for b in 0..self.batch {
            for t in 0..s {
                for hh in 0..h {
                    for c in 0..d {
                        let bshd = ((b * s + t) * h + hh) * d + c;
                        let bhsd = ((b * h + hh) * s + t) * d + c;
                        if back {
                            out[bshd] = x[bhsd];
                        } else {
                            out[bhsd] = x[bshd];
                        }
                    }
                }
            }
        }
        out
    }
}

/// What one block's attention half keeps for the backward.
#[derive(Debug, Clone)]
struct AttentionCache {
    input: Vec<f64>,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    q_rotated: Vec<f64>,
    k_rotated: Vec<f64>,
    mixed: Vec<f64>,
}

/// What one block keeps: its two halves and the two add+RMSNorm calls after them (inputs
/// `(branch output, residual stream before the add)`).
#[derive(Debug, Clone)]
struct BlockCache {
    attention: AttentionCache,
    attention_out: Vec<f64>,
    stream_before_attention: Vec<f64>,
    mlp_input: Vec<f64>,
    mlp_out: Vec<f64>,
    stream_before_mlp: Vec<f64>,
}

/// A forward's results: the loss, the logits and what the backward needs.
#[derive(Debug, Clone)]
pub struct Forward {
    /// Mean cross-entropy over the `batch·seq` tokens.
    pub loss: f64,
    /// Logits `[batch·seq, vocab]`.
    pub logits: Vec<f64>,
    sizes: Sizes,
    tokens: Vec<i32>,
    targets: Vec<i32>,
    embedded: Vec<f64>,
    blocks: Vec<BlockCache>,
    final_normed: Vec<f64>,
}

fn rms(x: &[f64], w: &[f64], rows: usize, cols: usize, eps: f64) -> Vec<f64> {
    norm::rms_norm(
        x,
        rows,
        cols,
        Some(w),
        0.0,
        eps,
        CastingMode::Llama,
        DType::F32,
    )
}

/// `(RMSNorm(x + residual)·w, x + residual)`.
fn add_rms(
    x: &[f64],
    residual: &[f64],
    w: &[f64],
    rows: usize,
    cols: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>) {
    norm::add_rms_norm(
        x,
        residual,
        rows,
        cols,
        Some(w),
        0.0,
        eps,
        CastingMode::Llama,
        DType::F32,
    )
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn add_into(acc: &mut [f64], b: &[f64]) {
    for (x, y) in acc.iter_mut().zip(b) {
        *x += y;
    }
}

/// The attention half: projections, RoPE on q and k, causal attention, output projection.
fn attention_half(
    x: &[f64],
    p: &BlockParameters,
    s: &Sizes,
    cos: &[f64],
    sin: &[f64],
) -> (Vec<f64>, AttentionCache) {
    let (n, d, hd) = (s.rows, s.d, s.projected());
    let q = linear(x, p.query, n, d, hd);
    let k = linear(x, p.key, n, d, hd);
    let v = linear(x, p.value, n, d, hd);
    let half = s.head_dim / 2;
    let cos_rows = rope::expand(cos, half, &s.heads(), |_, t, _| t);
    let sin_rows = rope::expand(sin, half, &s.heads(), |_, t, _| t);
    let rotate = |x: &[f64]| rope::forward(x, s.head_dim, &cos_rows, &sin_rows, s.head_dim, false);
    let (q_rotated, k_rotated) = (rotate(&q), rotate(&k));
    let out = attention::forward(
        &s.transpose(&q_rotated, false),
        &s.transpose(&k_rotated, false),
        &s.transpose(&v, false),
        &s.dims(),
        &s.visibility(),
    );
    let mixed = s.transpose(&out.output, true);
    let y = linear(&mixed, p.output, n, hd, d);
    let cache = AttentionCache {
        input: x.to_vec(),
        q,
        k,
        v,
        q_rotated,
        k_rotated,
        mixed,
    };
    (y, cache)
}

/// Sizes of the MLP half for [`mlp`].
fn mlp_extents(s: &Sizes) -> mlp::Extents {
    mlp::Extents {
        t: s.rows,
        h: s.d,
        i: s.ffn,
    }
}

/// Forward: embedding → blocks → final RMSNorm → LM head → mean cross-entropy.
///
/// `tokens` and `targets` are `[batch, seq]` row-major (`seq ≤ config.seq_len`, every id in
/// `0..vocab`); `parameters` in the fixed order. The residual stream `h` starts as the
/// embedded tokens; each block computes `h += attention(RMSNorm(h))`,
/// `h += mlp(RMSNorm(h))`, and the logits are `RMSNorm(h) · lm_headᵀ`.
///
/// # Panics
/// On inconsistent sizes (a test helper's contract).
pub fn forward(
    config: &ModelConfig,
    parameters: &[Vec<f64>],
    tokens: &[i32],
    targets: &[i32],
    batch: usize,
) -> Result<Forward> {
    let p = Parameters::new(config, parameters);
    let seq = tokens.len() / batch.max(1);
    assert_eq!(tokens.len(), batch * seq, "tokens: [batch, seq]");
    assert_eq!(targets.len(), tokens.len(), "targets: the tokens' shape");
    let s = Sizes {
        batch,
        seq,
        rows: batch * seq,
        d: config.d_model,
        heads: config.heads,
        head_dim: config.head_dim,
        ffn: config.ffn,
    };
    let eps = f64::from(config.eps);
    let (cos, sin) = rope_tables(config)?;

    let embedded = embedding(p.embedding, tokens, s.d);
    let mut stream = embedded.clone();
    let mut normed = rms(&stream, p.blocks[0].attention_norm, s.rows, s.d, eps);
    let mut blocks = Vec::with_capacity(config.layers);
    for (l, block) in p.blocks.iter().enumerate() {
        let (attention_out, attention) = attention_half(&normed, block, &s, &cos, &sin);
        let stream_before_attention = stream;
        (normed, stream) = add_rms(
            &attention_out,
            &stream_before_attention,
            block.mlp_norm,
            s.rows,
            s.d,
            eps,
        );
        // The MLP half: `down(silu(gate(x)) · up(x))`.
        let mlp_out = mlp::forward(
            Activation::Silu,
            &normed,
            block.gate,
            block.up,
            block.down,
            mlp_extents(&s),
        );
        let mlp_input = normed;
        let next_norm = p
            .blocks
            .get(l + 1)
            .map_or(p.final_norm, |b| b.attention_norm);
        let stream_before_mlp = stream;
        (normed, stream) = add_rms(&mlp_out, &stream_before_mlp, next_norm, s.rows, s.d, eps);
        blocks.push(BlockCache {
            attention,
            attention_out,
            stream_before_attention,
            mlp_input,
            mlp_out,
            stream_before_mlp,
        });
    }
    let logits = linear(&normed, p.lm_head, s.rows, s.d, config.vocab);
    let ce = loss::cross_entropy(
        &logits,
        targets,
        s.rows,
        config.vocab,
        &loss::CrossEntropyConfig::default(),
    );
    Ok(Forward {
        loss: ce.loss[0],
        logits,
        sizes: s,
        tokens: tokens.to_vec(),
        targets: targets.to_vec(),
        embedded,
        blocks,
        final_normed: normed,
    })
}

/// Backward of the attention half: `(d input, [dWq, dWk, dWv, dWo])`.
fn attention_half_backward(
    c: &AttentionCache,
    p: &BlockParameters,
    s: &Sizes,
    cos: &[f64],
    sin: &[f64],
    dy: &[f64],
) -> (Vec<f64>, [Vec<f64>; 4]) {
    let (n, d, hd) = (s.rows, s.d, s.projected());
    let (d_mixed, d_wo) = linear_backward(&c.mixed, p.output, dy, n, hd, d);
    let (dq_rot, dk_rot, dv) = attention::backward(
        &s.transpose(&c.q_rotated, false),
        &s.transpose(&c.k_rotated, false),
        &s.transpose(&c.v, false),
        &s.transpose(&d_mixed, false),
        &s.dims(),
        &s.visibility(),
    );
    let half = s.head_dim / 2;
    let cos_rows = rope::expand(cos, half, &s.heads(), |_, t, _| t);
    let sin_rows = rope::expand(sin, half, &s.heads(), |_, t, _| t);
    let unrotate = |x: &[f64], dy: &[f64]| {
        rope::backward(x, dy, s.head_dim, &cos_rows, &sin_rows, s.head_dim, false).0
    };
    let dq = unrotate(&c.q, &s.transpose(&dq_rot, true));
    let dk = unrotate(&c.k, &s.transpose(&dk_rot, true));
    let dv = s.transpose(&dv, true);
    let (mut dx, d_wq) = linear_backward(&c.input, p.query, &dq, n, d, hd);
    let (dx_k, d_wk) = linear_backward(&c.input, p.key, &dk, n, d, hd);
    let (dx_v, d_wv) = linear_backward(&c.input, p.value, &dv, n, d, hd);
    add_into(&mut dx, &dx_k);
    add_into(&mut dx, &dx_v);
    (dx, [d_wq, d_wk, d_wv, d_wo])
}

/// Analytic backward of [`forward`] for a unit cotangent of the loss: the gradient of every
/// parameter, in the fixed order.
pub fn backward(
    config: &ModelConfig,
    parameters: &[Vec<f64>],
    fwd: &Forward,
) -> Result<Vec<Vec<f64>>> {
    let p = Parameters::new(config, parameters);
    let s = &fwd.sizes;
    let eps = f64::from(config.eps);
    let (cos, sin) = rope_tables(config)?;
    let mut grads: Vec<Vec<f64>> = parameters.iter().map(|v| vec![0.0; v.len()]).collect();
    let tail = 1 + config.layers * BLOCK_PARAMETERS;

    // Loss and LM head.
    let d_logits = loss::cross_entropy_backward(
        &fwd.logits,
        &fwd.targets,
        s.rows,
        config.vocab,
        &loss::CrossEntropyConfig::default(),
        &[1.0],
    );
    let (mut d_normed, d_head) = linear_backward(
        &fwd.final_normed,
        p.lm_head,
        &d_logits,
        s.rows,
        s.d,
        config.vocab,
    );
    grads[tail + 1] = d_head;
    // The final residual stream itself is not used: its cotangent starts at zero.
    let mut d_stream = vec![0.0; s.rows * s.d];

    for l in (0..config.layers).rev() {
        let (block, c) = (&p.blocks[l], &fwd.blocks[l]);
        let base = 1 + l * BLOCK_PARAMETERS;
        // add+RMSNorm after the MLP (its weight: the next block's attention norm, or the
        // final norm). dx = dresidual = the gradient of the sum.
        let (next_norm, next_index) = match p.blocks.get(l + 1) {
            Some(b) => (b.attention_norm, base + BLOCK_PARAMETERS),
            None => (p.final_norm, tail),
        };
        let g = norm::add_rms_norm_backward(
            &c.mlp_out,
            &c.stream_before_mlp,
            s.rows,
            s.d,
            Some(next_norm),
            0.0,
            eps,
            &d_normed,
            Some(&d_stream),
        );
        grads[next_index] = g.weight;
        d_stream = g.source;
        let g_mlp = mlp::backward(
            Activation::Silu,
            &c.mlp_input,
            block.gate,
            block.up,
            block.down,
            &d_stream,
            mlp_extents(s),
        );
        let dx = g_mlp.x;
        grads[base + 6] = g_mlp.gate;
        grads[base + 7] = g_mlp.up;
        grads[base + 8] = g_mlp.down;
        // add+RMSNorm after attention (weight: this block's MLP norm).
        let g = norm::add_rms_norm_backward(
            &c.attention_out,
            &c.stream_before_attention,
            s.rows,
            s.d,
            Some(block.mlp_norm),
            0.0,
            eps,
            &dx,
            Some(&d_stream),
        );
        grads[base + 5] = g.weight;
        d_stream = g.source;
        let (dx, [dwq, dwk, dwv, dwo]) =
            attention_half_backward(&c.attention, block, s, &cos, &sin, &d_stream);
        grads[base + 1] = dwq;
        grads[base + 2] = dwk;
        grads[base + 3] = dwv;
        grads[base + 4] = dwo;
        d_normed = dx;
    }
    // The first RMSNorm (weight: block 0's attention norm) of the embedded tokens, which are
    // also the residual stream's start.
    let g = norm::rms_norm_backward(
        &fwd.embedded,
        s.rows,
        s.d,
        Some(p.blocks[0].attention_norm),
        0.0,
        eps,
        &d_normed,
    );
    grads[1] = g.weight;
    let d_embedded = add(&g.source, &d_stream);
    grads[0] = embedding_backward(&d_embedded, &fwd.tokens, config.vocab, s.d);
    Ok(grads)
}
