//! A small decoder-only transformer trained with wgrad's kernels: the end-to-end use of the
//! operators, forward and backward, with an explicit tape instead of an autograd graph.
//!
//! # Architecture
//!
//! With `N = batch·seq` token rows, `D = d_model`, `P = heads·head_dim`, `F = ffn`,
//! `V = vocab`:
//!
//! ```text
//! h  = embedding[tokens]                                   [N, D]  residual stream
//! n  = RMSNorm(h + 0) · w_attn[0]                          [N, D]  (add_rms_norm, zero residual)
//! per block l:
//!   q, k, v = n·Wqᵀ, n·Wkᵀ, n·Wvᵀ                          [N, P] = [batch, seq, heads, head_dim]
//!   q, k    = RoPE(q), RoPE(k)                             split-half, positions 0..seq
//!   o       = causal softmax(q·kᵀ/√head_dim)·v             [batch, seq, heads, head_dim] = [N, P]
//!   a       = o·Woᵀ                                        [N, D]
//!   n, h    = RMSNorm(h + a)·w_mlp[l], h + a               add_rms_norm
//!   m       = (silu(n·W_gateᵀ) ∘ n·W_upᵀ)·W_downᵀ          [N, F] → [N, D]
//!   n, h    = RMSNorm(h + m)·w_next, h + m                 w_next = w_attn[l+1] or the final norm
//! logits = n·W_headᵀ                                       [N, V]
//! loss   = mean cross-entropy(logits, targets)             []
//! ```
//!
//! Every residual add is fused with the RMSNorm that follows it ([`norm::add_rms_norm`]), so
//! the model needs no separate elementwise add; the first norm adds a zero residual so that
//! its backward also sums the residual stream's gradient into the embedding's.
//! The LM head and the loss run as one chunked
//! [`fused_linear::fused_linear_cross_entropy`]: the `[N, V]` logits never exist whole
//! ([`Model::logits`], for sampling, does materialize them).
//!
//! # Parameters
//!
//! All F32, in a fixed order ([`ModelConfig::parameter_shapes`], [`Model::parameters`]):
//! `embedding [V, D]`, then per block `attention_norm [D]`, `query [P, D]`, `key [P, D]`,
//! `value [P, D]`, `output [D, P]`, `mlp_norm [D]`, `gate [F, D]`, `up [F, D]`,
//! `down [D, F]`, then `final_norm [D]` and `lm_head [V, D]`. Projections are stored
//! `[out, in]` and applied as `x·Wᵀ`. [`Model::backward`] returns one F32 gradient per
//! parameter in the same order.
//!
//! # A training step
//!
//! ```no_run
//! use wgrad::model::{AdamWSettings, Batch, Model, ModelAdamW, ModelConfig};
//! let engine = wgrad::Engine::new()?;
//! let config = ModelConfig { vocab: 32, ..ModelConfig::default() };
//! let model = Model::new(&engine, config)?;
//! let mut optimizer = ModelAdamW::new(&model, AdamWSettings::default())?;
//! let (tokens, targets) = (vec![1i32; 2 * 16], vec![2i32; 2 * 16]);
//! let batch = Batch::new(&engine, &tokens, &targets, 2, 16, config.vocab)?;
//! let (loss, tape) = model.forward(&batch)?;
//! let grads = model.backward(&tape)?;
//! optimizer.step(&grads)?; // rewrites the model's parameters in place, after the backward
//! println!("loss {}", loss.to_vec::<f32>()?[0]); // the only read-back of the step
//! # Ok::<(), wgrad::Error>(())
//! ```
//!
//! # Numerics
//!
//! Activations and parameters are F32; every kernel accumulates in F32 with a fixed order, so
//! two runs of the same step give identical bits. The f64 reference of the whole model is
//! [`crate::reference::model`].

use crate::attention::{self, AttentionLayout, AttentionOptions, AttentionSaved};
use crate::embedding::{self, EmbeddingOptions, EmbeddingSaved};
use crate::fused_linear::{
    self, FusedLinearCrossEntropyOptions, FusedLinearCrossEntropySaved, LinearHead,
};
use crate::gradcheck::Rng;
use crate::loss::CrossEntropyOptions;
use crate::matmul::{self, Gemm, GemmOperand, MatmulOptions};
use crate::mlp::{self, MlpOptions, MlpSaved};
use crate::norm::{self, RmsNormOptions};
use crate::optim::{AdamW, AdamWOptions, Clip};
use crate::rope::{self, RopeLayout, RopeQkOptions, RopeSaved};
use crate::{DType, Engine, Error, Result, Tensor};

/// Parameters per block (see the module documentation for their order).
pub const BLOCK_PARAMETERS: usize = 9;

/// Names of one block's parameters, in order.
pub const BLOCK_PARAMETER_NAMES: [&str; BLOCK_PARAMETERS] = [
    "attention_norm",
    "query",
    "key",
    "value",
    "output",
    "mlp_norm",
    "gate",
    "up",
    "down",
];

/// Sizes and hyper-parameters of a [`Model`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size `V` (≥ 1).
    pub vocab: usize,
    /// Number of blocks (≥ 1).
    pub layers: usize,
    /// Width of the residual stream `D` (1..=1,048,576).
    pub d_model: usize,
    /// Attention heads (≥ 1).
    pub heads: usize,
    /// Width of one head: a multiple of 8 in 8..=256 (the attention kernel's bound).
    pub head_dim: usize,
    /// Hidden width of the SwiGLU MLP `F` (≥ 1).
    pub ffn: usize,
    /// Longest sequence (rows of the RoPE tables, ≥ 1).
    pub seq_len: usize,
    /// RoPE base (finite, > 1).
    pub rope_base: f64,
    /// RMSNorm ε (finite, > 0).
    pub eps: f32,
    /// Seed of the parameter initialization.
    pub seed: u64,
}

impl Default for ModelConfig {
    /// A small character-level model: V 256, 2 layers, D 64, 4 heads of 16, F 128, seq 64,
    /// RoPE base 10,000, ε 1e-5, seed 0.
    fn default() -> Self {
        ModelConfig {
            vocab: 256,
            layers: 2,
            d_model: 64,
            heads: 4,
            head_dim: 16,
            ffn: 128,
            seq_len: 64,
            rope_base: 10_000.0,
            eps: 1e-5,
            seed: 0,
        }
    }
}

fn at_least(what: &str, got: usize, min: usize, max: usize) -> Result<()> {
    if got < min || got > max {
        return Err(Error::bounds(
            format!("model config: {what}"),
            got as u64,
            min as u64,
            max as u64,
        ));
    }
    Ok(())
}

impl ModelConfig {
    /// Check every size and scalar (typed errors: `OutOfBounds` for sizes, `InvalidValue` for
    /// a head dim that is not a multiple of 8, the RoPE base and ε).
    pub fn validate(&self) -> Result<()> {
        let big = i32::MAX as usize;
        at_least("vocab", self.vocab, 1, big)?;
        at_least("layers", self.layers, 1, 4096)?;
        at_least("d_model", self.d_model, 1, norm::MAX_COLUMNS)?;
        at_least("heads", self.heads, 1, 4096)?;
        at_least("head_dim", self.head_dim, 8, attention::MAX_HEAD_DIM)?;
        if !self.head_dim.is_multiple_of(8) {
            return Err(Error::InvalidValue {
                what: "model config: head_dim".into(),
                got: self.head_dim as f64,
                rule: "must be a multiple of 8".into(),
            });
        }
        at_least("ffn", self.ffn, 1, big)?;
        at_least("seq_len", self.seq_len, 1, attention::MAX_LEN)?;
        if !self.rope_base.is_finite() || self.rope_base <= 1.0 {
            return Err(Error::InvalidValue {
                what: "model config: rope_base".into(),
                got: self.rope_base,
                rule: "must be finite and > 1".into(),
            });
        }
        if !self.eps.is_finite() || self.eps <= 0.0 {
            return Err(Error::InvalidValue {
                what: "model config: eps".into(),
                got: f64::from(self.eps),
                rule: "must be finite and > 0".into(),
            });
        }
        Ok(())
    }

    /// Width of the attention projections, `heads·head_dim`.
    pub fn projected(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Names and shapes of the parameters in the fixed order.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (v, d, p, f) = (self.vocab, self.d_model, self.projected(), self.ffn);
        let mut out = vec![("embedding".to_string(), vec![v, d])];
        for l in 0..self.layers {
            let shapes = [
                vec![d],
                vec![p, d],
                vec![p, d],
                vec![p, d],
                vec![d, p],
                vec![d],
                vec![f, d],
                vec![f, d],
                vec![d, f],
            ];
            for (name, shape) in BLOCK_PARAMETER_NAMES.iter().zip(shapes) {
                out.push((format!("blocks.{l}.{name}"), shape));
            }
        }
        out.push(("final_norm".to_string(), vec![d]));
        out.push(("lm_head".to_string(), vec![v, d]));
        out
    }

    /// Total number of parameters.
    pub fn parameter_count(&self) -> usize {
        self.parameter_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// The deterministic initialization, in the fixed order: norm weights 1; every other
    /// matrix uniform in `±1/√fan_in` (`fan_in` = its last axis; the embedding uses
    /// `±1`), drawn parameter after parameter, row-major, from [`Rng`] seeded with `seed`.
    pub fn initial_parameters(&self) -> Vec<Vec<f32>> {
        let mut rng = Rng::new(self.seed);
        self.parameter_shapes()
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                if shape.len() == 1 {
                    vec![1.0; n]
                } else {
                    let bound = if name == "embedding" {
                        1.0
                    } else {
                        1.0 / (shape[1] as f64).sqrt()
                    };
                    (0..n).map(|_| rng.uniform(-bound, bound) as f32).collect()
                }
            })
            .collect()
    }
}

/// One block's parameters (F32; shapes in the module documentation).
#[derive(Debug, Clone)]
pub struct Block {
    /// RMSNorm weight before attention `[D]`.
    pub attention_norm: Tensor,
    /// Query projection `[P, D]`.
    pub query: Tensor,
    /// Key projection `[P, D]`.
    pub key: Tensor,
    /// Value projection `[P, D]`.
    pub value: Tensor,
    /// Output projection `[D, P]`.
    pub output: Tensor,
    /// RMSNorm weight before the MLP `[D]`.
    pub mlp_norm: Tensor,
    /// Gate projection `[F, D]`.
    pub gate: Tensor,
    /// Up projection `[F, D]`.
    pub up: Tensor,
    /// Down projection `[D, F]`.
    pub down: Tensor,
}

impl Block {
    fn parameters(&self) -> [&Tensor; BLOCK_PARAMETERS] {
        [
            &self.attention_norm,
            &self.query,
            &self.key,
            &self.value,
            &self.output,
            &self.mlp_norm,
            &self.gate,
            &self.up,
            &self.down,
        ]
    }
}

/// One training (or evaluation) batch: token ids and next-token targets, both
/// `[batch, seq]` I32, validated on the host before upload.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Input token ids `[batch, seq]`.
    pub tokens: Tensor,
    /// Target ids `[batch, seq]` (`−100` = ignored).
    pub targets: Tensor,
    /// The input ids on the host.
    pub host_tokens: Vec<i32>,
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
}

impl Batch {
    /// Upload `tokens` and `targets` (`batch·seq` each, row-major). Errors: `batch` or `seq`
    /// of 0 (`OutOfBounds`), a slice of another length (`LengthMismatch`), a token outside
    /// `0..vocab` or a target outside `0..vocab` other than −100 (`OutOfBounds`).
    pub fn new(
        engine: &Engine,
        tokens: &[i32],
        targets: &[i32],
        batch: usize,
        seq: usize,
        vocab: usize,
    ) -> Result<Batch> {
        at_least("batch", batch, 1, i32::MAX as usize)?;
        at_least("seq", seq, 1, attention::MAX_LEN)?;
        for (what, ids) in [("batch tokens", tokens), ("batch targets", targets)] {
            if ids.len() != batch * seq {
                return Err(Error::LengthMismatch {
                    what: what.into(),
                    shape: vec![batch, seq],
                    expected: batch * seq,
                    got: ids.len(),
                });
            }
        }
        let check = |what: &str, id: i32, ignore: bool| -> Result<()> {
            if (ignore && id == -100) || (id >= 0 && (id as usize) < vocab) {
                Ok(())
            } else {
                Err(Error::bounds(
                    what,
                    i64::from(id).unsigned_abs(),
                    0,
                    vocab as u64 - 1,
                ))
            }
        };
        for &t in tokens {
            check("batch: token id", t, false)?;
        }
        for &t in targets {
            check("batch: target id", t, true)?;
        }
        Ok(Batch {
            tokens: Tensor::from_slice(engine, tokens, &[batch, seq])?,
            targets: Tensor::from_slice(engine, targets, &[batch, seq])?,
            host_tokens: tokens.to_vec(),
            batch,
            seq,
        })
    }
}

// ---- projections ----------------------------------------------------------------------------

/// What `linear` keeps: its input and weight (handles; tensors are immutable).
#[derive(Debug, Clone)]
pub struct LinearSaved {
    /// `x` `[rows, in]`.
    pub input: Tensor,
    /// `W` `[out, in]`.
    pub weight: Tensor,
}

/// `y = x·Wᵀ`, `x` `[rows, in]`, `W` `[out, in]` → `[rows, out]` F32 ([`matmul::matmul`]
/// with a transposed right operand).
fn linear(x: &Tensor, w: &Tensor) -> Result<(Tensor, LinearSaved)> {
    let options = MatmulOptions {
        transpose_b: true,
        ..MatmulOptions::default()
    };
    let (y, _) = matmul::matmul(x, w, None, &options)?;
    Ok((
        y,
        LinearSaved {
            input: x.clone(),
            weight: w.clone(),
        },
    ))
}

/// Backward of several [`linear`] calls that share their input `x` `[rows, in]`:
/// `(dx = Σ_i dy_i·W_i, [dW_i = dy_iᵀ·x])`, all F32. The sum over the projections is
/// accumulated in place by [`matmul::gemm`] in the order given (no separate add).
fn linear_backward(saved: &[&LinearSaved], dys: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
    let x = &saved[0].input;
    let engine = x.engine();
    let (rows, inputs) = (x.shape()[0], x.shape()[1]);
    let operand = GemmOperand::whole;
    let dx = Tensor::empty(engine, &[rows, inputs], DType::F32, "linear input gradient")?;
    let mut dws = Vec::with_capacity(saved.len());
    for (i, (s, dy)) in saved.iter().zip(dys).enumerate() {
        let outputs = s.weight.shape()[0];
        // dx (+)= dy·W: [rows, out] @ [out, in].
        matmul::gemm(&Gemm::plain(
            operand(dy, false),
            operand(&s.weight, false),
            &dx,
            (rows, inputs, outputs),
            i > 0,
        ))?;
        // dW = dyᵀ·x: dy stored [rows, out] read transposed, @ x [rows, in].
        let dw = Tensor::empty(
            engine,
            &[outputs, inputs],
            DType::F32,
            "linear weight gradient",
        )?;
        matmul::gemm(&Gemm::plain(
            operand(dy, true),
            operand(x, false),
            &dw,
            (outputs, inputs, rows),
            false,
        ))?;
        dws.push(dw);
    }
    Ok((dx, dws))
}

// ---- the model ------------------------------------------------------------------------------

/// The transformer: F32 parameters on one engine, plus its RoPE tables.
#[derive(Debug, Clone)]
pub struct Model {
    config: ModelConfig,
    engine: Engine,
    /// Token embedding `[V, D]`.
    pub embedding: Tensor,
    /// The blocks, in order.
    pub blocks: Vec<Block>,
    /// Final RMSNorm weight `[D]`.
    pub final_norm: Tensor,
    /// LM head `[V, D]`.
    pub lm_head: Tensor,
    cos: Tensor,
    sin: Tensor,
}

/// What the attention half of a block keeps for the backward.
#[derive(Debug, Clone)]
pub struct AttentionTape {
    /// Query, key and value projections of the normalized input.
    pub query: LinearSaved,
    /// See `query`.
    pub key: LinearSaved,
    /// See `query`.
    pub value: LinearSaved,
    /// RoPE of q and k.
    pub rope: RopeSaved,
    /// The attention call.
    pub attention: AttentionSaved,
    /// The output projection.
    pub output: LinearSaved,
    /// `[batch, seq, heads, head_dim]` of q, k, v and the attention output.
    pub heads_shape: [usize; 4],
}

/// One block's saved contexts, in forward order.
#[derive(Debug, Clone)]
pub struct BlockTape {
    /// The attention half.
    pub attention: AttentionTape,
    /// `h + a` fused with the MLP's RMSNorm.
    pub attention_residual: norm::Saved,
    /// The SwiGLU MLP half ([`mlp::mlp`]: gate/up projections, `silu(gate)·up`, down
    /// projection; the F32 gate and up products are saved).
    pub mlp: MlpSaved,
    /// `h + m` fused with the next RMSNorm (the next block's or the final one).
    pub mlp_residual: norm::Saved,
}

/// Everything a forward keeps for [`Model::backward`], in forward order.
#[derive(Debug, Clone)]
pub struct Tape {
    /// The embedding lookup.
    pub embedding: EmbeddingSaved,
    /// The first RMSNorm (of the embedded tokens plus a zero residual).
    pub first_norm: norm::Saved,
    /// One entry per block.
    pub blocks: Vec<BlockTape>,
    /// The LM head and the loss, fused (the logits are never materialized whole).
    pub head: FusedLinearCrossEntropySaved,
}

impl Model {
    /// A model with the deterministic initialization of
    /// [`ModelConfig::initial_parameters`]. Errors: an invalid config (see
    /// [`ModelConfig::validate`]), device errors.
    pub fn new(engine: &Engine, config: ModelConfig) -> Result<Model> {
        config.validate()?;
        let host = config.initial_parameters();
        let shapes = config.parameter_shapes();
        let tensors = host
            .iter()
            .zip(&shapes)
            .map(|(v, (_, shape))| Tensor::from_slice(engine, v, shape))
            .collect::<Result<Vec<_>>>()?;
        Model::from_parameters(engine, config, tensors)
    }

    /// A model from parameters in the fixed order. Errors: an invalid config, a wrong count
    /// (`LengthMismatch`), shape (`ShapeMismatch`), dtype (`UnsupportedDType`, F32 only) or
    /// engine (`EngineMismatch`).
    pub fn from_parameters(
        engine: &Engine,
        config: ModelConfig,
        parameters: Vec<Tensor>,
    ) -> Result<Model> {
        config.validate()?;
        check_parameters(engine, &config, &parameters, "model parameter")?;
        let (cos, sin) = rope::tables(
            engine,
            config.seq_len,
            config.head_dim,
            config.rope_base,
            &rope::RopeScaling::None,
            DType::F32,
        )?;
        let mut it = parameters.into_iter();
        let mut next = || it.next().expect("counted above");
        let embedding = next();
        let blocks = (0..config.layers)
            .map(|_| Block {
                attention_norm: next(),
                query: next(),
                key: next(),
                value: next(),
                output: next(),
                mlp_norm: next(),
                gate: next(),
                up: next(),
                down: next(),
            })
            .collect();
        let final_norm = next();
        let lm_head = next();
        Ok(Model {
            config,
            engine: engine.clone(),
            embedding,
            blocks,
            final_norm,
            lm_head,
            cos,
            sin,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The engine the parameters live on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Every parameter in the fixed order.
    pub fn parameters(&self) -> Vec<&Tensor> {
        let mut out = vec![&self.embedding];
        for b in &self.blocks {
            out.extend(b.parameters());
        }
        out.push(&self.final_norm);
        out.push(&self.lm_head);
        out
    }

    /// Replace every parameter (fixed order; same checks as [`Model::from_parameters`]).
    pub fn set_parameters(&mut self, parameters: Vec<Tensor>) -> Result<()> {
        *self = Model::from_parameters(&self.engine, self.config, parameters)?;
        Ok(())
    }

    /// The RMSNorm weight that follows block `l`'s MLP: the next block's attention norm, or
    /// the final norm after the last block.
    fn norm_after(&self, l: usize) -> &Tensor {
        self.blocks
            .get(l + 1)
            .map_or(&self.final_norm, |b| &b.attention_norm)
    }

    fn norm_options(&self) -> RmsNormOptions {
        RmsNormOptions {
            eps: self.config.eps,
            ..RmsNormOptions::default()
        }
    }

    /// The stack up to the final RMSNorm: `(normalized final stream [N, D], embedding saved,
    /// first norm saved, block tapes)`.
    fn trunk(
        &self,
        tokens: &Tensor,
        batch: usize,
        seq: usize,
    ) -> Result<(Tensor, EmbeddingSaved, norm::Saved, Vec<BlockTape>)> {
        let c = &self.config;
        if seq > c.seq_len {
            return Err(Error::bounds(
                "model: sequence length",
                seq as u64,
                1,
                c.seq_len as u64,
            ));
        }
        let rows = batch * seq;
        let opts = self.norm_options();
        // h = embedding[tokens]; n = RMSNorm(h + 0).
        // The ids were checked on the host (`Batch::new`, `logits`): no read-back here.
        let (mut stream, embedding) = embedding::embedding(
            &self.embedding,
            &tokens.reshape(&[rows])?,
            &EmbeddingOptions {
                check_indices: false,
                ..EmbeddingOptions::default()
            },
        )?;
        let zeros = Tensor::zeros(&self.engine, &[rows, c.d_model], DType::F32)?;
        let (mut normed, _, first_norm) =
            norm::add_rms_norm(&stream, &zeros, Some(&self.blocks[0].attention_norm), &opts)?;
        let mut tapes = Vec::with_capacity(c.layers);
        for (l, block) in self.blocks.iter().enumerate() {
            let (a, attention) = self.attention_half(block, &normed, batch, seq)?;
            let (n, s, attention_residual) =
                norm::add_rms_norm(&a, &stream, Some(&block.mlp_norm), &opts)?;
            let (m, mlp) = mlp::mlp(
                &n,
                &block.gate,
                &block.up,
                &block.down,
                &MlpOptions::default(),
            )?;
            let (n, s, mlp_residual) = norm::add_rms_norm(&m, &s, Some(self.norm_after(l)), &opts)?;
            (normed, stream) = (n, s);
            tapes.push(BlockTape {
                attention,
                attention_residual,
                mlp,
                mlp_residual,
            });
        }
        Ok((normed, embedding, first_norm, tapes))
    }

    /// The attention half of `block` on the normalized stream `x` `[N, D]` → `[N, D]`.
    fn attention_half(
        &self,
        block: &Block,
        x: &Tensor,
        batch: usize,
        seq: usize,
    ) -> Result<(Tensor, AttentionTape)> {
        let (h, hd) = (self.config.heads, self.config.head_dim);
        let heads_shape = [batch, seq, h, hd];
        let (q, query) = linear(x, &block.query)?;
        let (k, key) = linear(x, &block.key)?;
        let (v, value) = linear(x, &block.value)?;
        let ((q, k), rope) = rope::qk_forward(
            &q.reshape(&heads_shape)?,
            &k.reshape(&heads_shape)?,
            &self.cos,
            &self.sin,
            None,
            &RopeQkOptions {
                layout: RopeLayout::Bshd,
                check_positions: false,
                ..RopeQkOptions::default()
            },
        )?;
        let (o, attention) = attention::attention_forward(
            &q,
            &k,
            &v.reshape(&heads_shape)?,
            &AttentionOptions {
                causal: true,
                layout: AttentionLayout::BatchSeqHead,
                ..AttentionOptions::default()
            },
        )?;
        let (a, output) = linear(&o.reshape(&[batch * seq, h * hd])?, &block.output)?;
        Ok((
            a,
            AttentionTape {
                query,
                key,
                value,
                rope,
                attention,
                output,
                heads_shape,
            },
        ))
    }

    /// Loss and tape of one batch: shapes as in the module documentation; the loss is an F32
    /// scalar `[]` (mean over the counted targets), the LM head and the loss one chunked
    /// [`fused_linear::fused_linear_cross_entropy`] (which also computes the head's gradients
    /// for the backward). Nothing is read back. Errors: a batch longer than
    /// `seq_len` or with ids outside the vocabulary (`OutOfBounds`), a batch of another engine
    /// (`EngineMismatch`), and the errors of the operators.
    pub fn forward(&self, batch: &Batch) -> Result<(Tensor, Tape)> {
        self.check_batch(batch)?;
        let (normed, embedding, first_norm, blocks) =
            self.trunk(&batch.tokens, batch.batch, batch.seq)?;
        let rows = batch.batch * batch.seq;
        let (out, head) = fused_linear::fused_linear_cross_entropy(
            LinearHead {
                input: &normed,
                weight: &self.lm_head,
                bias: None,
            },
            &batch.targets.reshape(&[rows])?,
            &FusedLinearCrossEntropyOptions {
                cross_entropy: CrossEntropyOptions {
                    check_targets: false,
                    predicted: false,
                    ..CrossEntropyOptions::default()
                },
                ..FusedLinearCrossEntropyOptions::default()
            },
        )?;
        Ok((
            out.loss,
            Tape {
                embedding,
                first_norm,
                blocks,
                head,
            },
        ))
    }

    /// Logits `[batch·seq, V]` F32 of `tokens` (`[batch, seq]` row-major, `seq ≤ seq_len`)
    /// without keeping anything for a backward (sampling, evaluation). Errors: as
    /// [`Model::forward`], a length that is not `batch·seq` (`LengthMismatch`).
    pub fn logits(&self, tokens: &[i32], batch: usize) -> Result<Tensor> {
        at_least("batch", batch, 1, i32::MAX as usize)?;
        let seq = tokens.len() / batch;
        if seq == 0 || seq * batch != tokens.len() {
            return Err(Error::LengthMismatch {
                what: "model logits: tokens".into(),
                shape: vec![batch, seq.max(1)],
                expected: batch * seq.max(1),
                got: tokens.len(),
            });
        }
        for &t in tokens {
            if t < 0 || t as usize >= self.config.vocab {
                return Err(Error::bounds(
                    "model logits: token id",
                    i64::from(t).unsigned_abs(),
                    0,
                    self.config.vocab as u64 - 1,
                ));
            }
        }
        let ids = Tensor::from_slice(&self.engine, tokens, &[batch, seq])?;
        let (normed, ..) = self.trunk(&ids, batch, seq)?;
        Ok(linear(&normed, &self.lm_head)?.0)
    }

    fn check_batch(&self, batch: &Batch) -> Result<()> {
        batch
            .tokens
            .check_engine(&self.engine, "model: batch tokens")?;
        batch
            .targets
            .check_engine(&self.engine, "model: batch targets")?;
        for &t in &batch.host_tokens {
            if t < 0 || t as usize >= self.config.vocab {
                return Err(Error::bounds(
                    "model: token id",
                    i64::from(t).unsigned_abs(),
                    0,
                    self.config.vocab as u64 - 1,
                ));
            }
        }
        Ok(())
    }

    /// Gradients of the loss (unit cotangent) with respect to every parameter, F32, in the
    /// fixed order ([`Model::parameters`]). Runs the saved contexts of `tape` in reverse:
    /// loss → LM head → per block (last first) add+RMSNorm, MLP, add+RMSNorm, attention →
    /// first norm → embedding. The residual stream's gradient travels as the
    /// `residual_output_gradient` of each add+RMSNorm backward, so no separate add is run.
    pub fn backward(&self, tape: &Tape) -> Result<Vec<Tensor>> {
        let c = &self.config;
        let head = fused_linear::fused_linear_cross_entropy_backward(&tape.head, None)?;
        let mut d_normed = head.input;
        let mut d_stream: Option<Tensor> = None;
        // Gradients per block in parameter order, filled from the last block back.
        let mut block_grads: Vec<Vec<Tensor>> = Vec::with_capacity(c.layers);
        // The weight gradient of the norm after each block's MLP belongs to the next block's
        // attention norm (or the final norm).
        let mut norm_after_grads: Vec<Tensor> = Vec::with_capacity(c.layers);
        for t in tape.blocks.iter().rev() {
            let g = norm::norm_backward(&t.mlp_residual, &d_normed, d_stream.as_ref())?;
            norm_after_grads.push(weight_grad(g.weight, "norm after block")?);
            let dm = g.source;
            let g_mlp = mlp::mlp_backward(&t.mlp, &dm)?;
            let (dx_mlp, d_gate, d_up, d_down) = (g_mlp.x, g_mlp.gate, g_mlp.up, g_mlp.down);
            let g = norm::norm_backward(&t.attention_residual, &dx_mlp, Some(&dm))?;
            let d_mlp_norm = weight_grad(g.weight, "mlp norm")?;
            let da = g.source;
            let (dx_attention, [dq, dk, dv, d_out]) = self.attention_backward(&t.attention, &da)?;
            d_normed = dx_attention;
            d_stream = Some(da);
            block_grads.push(vec![dq, dk, dv, d_out, d_mlp_norm, d_gate, d_up, d_down]);
        }
        block_grads.reverse();
        norm_after_grads.reverse();
        let g = norm::norm_backward(&tape.first_norm, &d_normed, d_stream.as_ref())?;
        let d_first_norm = weight_grad(g.weight, "first norm")?;
        let d_embedding = embedding::embedding_backward(&tape.embedding, &g.source)?;

        let mut grads = Vec::with_capacity(1 + c.layers * BLOCK_PARAMETERS + 2);
        grads.push(d_embedding);
        let mut attention_norm = Some(d_first_norm);
        for (l, bg) in block_grads.into_iter().enumerate() {
            grads.push(attention_norm.take().expect("set for every block"));
            grads.extend(bg);
            attention_norm = Some(norm_after_grads[l].clone());
        }
        grads.push(attention_norm.expect("the final norm's gradient"));
        grads.push(head.weight);
        Ok(grads)
    }

    /// Backward of [`Model::attention_half`]: `(d input, [dWq, dWk, dWv, dWo])`.
    fn attention_backward(&self, t: &AttentionTape, da: &Tensor) -> Result<(Tensor, [Tensor; 4])> {
        let (d_mixed, mut dw_out) = linear_backward(&[&t.output], &[da])?;
        let q_shape = t.heads_shape;
        let g = attention::attention_backward(&t.attention, &d_mixed.reshape(&q_shape)?)?;
        let r = rope::qk_backward(&t.rope, &g.query, &g.key)?;
        let rows = q_shape[0] * q_shape[1];
        let width = q_shape[2] * q_shape[3];
        let (dq, dk, dv) = (
            r.dq.reshape(&[rows, width])?,
            r.dk.reshape(&[rows, width])?,
            g.value.reshape(&[rows, width])?,
        );
        let (dx, dws) = linear_backward(&[&t.query, &t.key, &t.value], &[&dq, &dk, &dv])?;
        let [dwq, dwk, dwv]: [Tensor; 3] = dws.try_into().expect("three projections");
        Ok((dx, [dwq, dwk, dwv, dw_out.remove(0)]))
    }
}

fn weight_grad(w: Option<Tensor>, what: &str) -> Result<Tensor> {
    w.ok_or_else(|| Error::Device(format!("model backward: no weight gradient for the {what}")))
}

/// Check a parameter list against the config: count, shapes, F32, engine.
pub fn check_parameters(
    engine: &Engine,
    config: &ModelConfig,
    parameters: &[Tensor],
    what: &str,
) -> Result<()> {
    let shapes = config.parameter_shapes();
    if parameters.len() != shapes.len() {
        return Err(Error::LengthMismatch {
            what: format!("{what}s"),
            shape: vec![shapes.len()],
            expected: shapes.len(),
            got: parameters.len(),
        });
    }
    for (p, (name, shape)) in parameters.iter().zip(&shapes) {
        p.check_engine(engine, &format!("{what} {name}"))?;
        if p.shape() != shape.as_slice() {
            return Err(Error::shape(format!("{what} {name}"), shape, p.shape()));
        }
        if p.dtype() != DType::F32 {
            return Err(Error::dtype(
                format!("{what} {name}"),
                p.dtype(),
                &[DType::F32],
            ));
        }
    }
    Ok(())
}

// ---- optimizer ------------------------------------------------------------------------------

/// Settings of [`ModelAdamW`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWSettings {
    /// Learning rate (default 1e-3); [`ModelAdamW::set_lr`] changes it between steps.
    pub lr: f32,
    /// First-moment decay β₁ (default 0.9).
    pub beta1: f32,
    /// Second-moment decay β₂ (default 0.95).
    pub beta2: f32,
    /// Denominator ε (default 1e-8).
    pub eps: f32,
    /// Decoupled weight decay of the matrices (default 0.1); norm weights get none.
    pub weight_decay: f32,
    /// Global gradient-norm clip (default 1.0; `None`: no clipping).
    pub clip: Option<f32>,
    /// AMSGrad (default false): each group keeps the running maximum of its second moments
    /// and divides by it ([`AdamWOptions::amsgrad`](crate::optim::AdamWOptions::amsgrad)).
    pub amsgrad: bool,
}

impl Default for AdamWSettings {
    fn default() -> Self {
        AdamWSettings {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            clip: Some(1.0),
            amsgrad: false,
        }
    }
}

/// [`optim::AdamW`](crate::optim::AdamW) over a model's parameters, updated in place on the
/// GPU: two groups (the matrices with weight decay, the norm weights without) sharing one
/// global-norm clip ([`Clip`]) computed on the GPU from all gradients. Nothing is read back.
#[derive(Debug)]
pub struct ModelAdamW {
    matrices: AdamW,
    vectors: AdamW,
    /// Shape of parameter `i` (fixed order); matrices have two axes.
    shapes: Vec<Vec<usize>>,
    clip: Option<f32>,
}

impl ModelAdamW {
    /// An optimizer holding `model`'s parameter handles (the model sees every update).
    /// Errors: settings outside their ranges (`InvalidValue`: those of `AdamW::new`, a clip
    /// that is not finite and > 0).
    pub fn new(model: &Model, settings: AdamWSettings) -> Result<ModelAdamW> {
        if let Some(c) = settings.clip.filter(|c| !c.is_finite() || *c <= 0.0) {
            return Err(Error::InvalidValue {
                what: "model optimizer: clip".into(),
                got: f64::from(c),
                rule: "must be finite and > 0".into(),
            });
        }
        let params = model.parameters();
        let group = |matrix: bool| -> Vec<Tensor> {
            params
                .iter()
                .filter(|p| (p.shape().len() > 1) == matrix)
                .map(|p| (*p).clone())
                .collect()
        };
        let options = |weight_decay| AdamWOptions {
            lr: settings.lr,
            beta1: settings.beta1,
            beta2: settings.beta2,
            eps: settings.eps,
            weight_decay,
            amsgrad: settings.amsgrad,
            ..AdamWOptions::default()
        };
        Ok(ModelAdamW {
            matrices: AdamW::new(&group(true), options(settings.weight_decay))?,
            vectors: AdamW::new(&group(false), options(0.0))?,
            shapes: params.iter().map(|p| p.shape().to_vec()).collect(),
            clip: settings.clip,
        })
    }

    /// Change the learning rate of both groups for the following steps.
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        self.matrices.set_lr(lr)?;
        self.vectors.set_lr(lr)
    }

    /// One step with `grads` in the model's parameter order (as [`Model::backward`] returns
    /// them). Returns the global gradient norm before clipping, a 1-element F32 tensor (not
    /// read back). Errors, before anything is recorded: a count (`LengthMismatch`) or shapes
    /// (`ShapeMismatch`) that do not match the parameters; then those of `AdamW::step`.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<Tensor> {
        // Every gradient is checked before either group steps: no half-applied step.
        if grads.len() != self.shapes.len() {
            return Err(Error::LengthMismatch {
                what: "model optimizer: gradients".into(),
                shape: vec![self.shapes.len()],
                expected: self.shapes.len(),
                got: grads.len(),
            });
        }
        for (g, shape) in grads.iter().zip(&self.shapes) {
            if g.shape() != shape.as_slice() {
                return Err(Error::shape("model optimizer: gradient", shape, g.shape()));
            }
        }
        let clip = Clip::from_grads(grads, self.clip.unwrap_or(f32::MAX))?;
        let group = |matrix: bool| -> Vec<&Tensor> {
            grads
                .iter()
                .zip(&self.shapes)
                .filter(|&(_, shape)| (shape.len() > 1) == matrix)
                .map(|(g, _)| g)
                .collect()
        };
        let (gm, gv) = (group(true), group(false));
        let clip_ref = self.clip.map(|_| &clip);
        self.matrices.step(&gm, clip_ref)?;
        self.vectors.step(&gv, clip_ref)?;
        Ok(clip.norm)
    }
}

// ---- text --------------------------------------------------------------------------------

/// A character (byte) vocabulary: the distinct bytes of a text, sorted; token id = index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    bytes: Vec<u8>,
}

impl Vocabulary {
    /// The distinct bytes of `text`, sorted.
    pub fn from_text(text: &[u8]) -> Vocabulary {
        let mut seen = [false; 256];
        for &b in text {
            seen[b as usize] = true;
        }
        Vocabulary {
            bytes: (0..=255u8).filter(|&b| seen[b as usize]).collect(),
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Token ids of `text`. Errors: a byte outside the vocabulary (`OutOfBounds`).
    pub fn encode(&self, text: &[u8]) -> Result<Vec<i32>> {
        text.iter()
            .map(|b| {
                self.bytes
                    .binary_search(b)
                    .map(|i| i as i32)
                    .map_err(|_| Error::bounds("vocabulary: byte", u64::from(*b), 0, 255))
            })
            .collect()
    }

    /// The bytes of token ids (ids outside the vocabulary are skipped).
    pub fn decode(&self, ids: &[i32]) -> Vec<u8> {
        ids.iter()
            .filter_map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.bytes.get(i))
                    .copied()
            })
            .collect()
    }
}

/// `batch` random windows of `seq + 1` consecutive tokens from `stream`: inputs are the first
/// `seq`, targets the last `seq` of each window (row-major `[batch, seq]` each). Windows start
/// uniformly in `0..=len − seq − 1`, drawn from `rng`. Errors: a stream shorter than
/// `seq + 1` (`OutOfBounds`).
pub fn sample_windows(
    stream: &[i32],
    batch: usize,
    seq: usize,
    rng: &mut Rng,
) -> Result<(Vec<i32>, Vec<i32>)> {
    if stream.len() < seq + 1 {
        return Err(Error::bounds(
            "sample_windows: stream length",
            stream.len() as u64,
            seq as u64 + 1,
            u64::MAX,
        ));
    }
    let starts = (stream.len() - seq) as u64;
    let mut inputs = Vec::with_capacity(batch * seq);
    let mut targets = Vec::with_capacity(batch * seq);
    for _ in 0..batch {
        let s = (rng.next_u64() % starts) as usize;
        inputs.extend_from_slice(&stream[s..s + seq]);
        targets.extend_from_slice(&stream[s + 1..s + seq + 1]);
    }
    Ok((inputs, targets))
}
