//! Fused linear losses: a linear head `logits = x·Wᵀ + b` followed by a loss over the
//! vocabulary, computed chunk by chunk of rows so that the `[rows, vocab]` logits never exist
//! at once: [`fused_linear_cross_entropy`] (every option of [`CrossEntropyOptions`]) and the
//! distillation losses [`fused_linear_distillation`] with the shorthands
//! [`fused_linear_jsd`], [`fused_linear_kl`], [`fused_linear_tvd`] and [`fused_linear_cosine`]
//! (a student head trained
//! against a frozen teacher head, plus an optional hard-label cross-entropy term).
//!
//! Shapes: `x` is `[..., hidden]` (leading axes flatten to `rows`), `W` is `[vocab, hidden]`,
//! the bias `[vocab]`; targets / labels are I32 of `x`'s leading shape. Storage F32, F16 or
//! BF16 for `x`, `W` and the bias; the products accumulate in FP32 and every logit, loss and
//! gradient is F32.
//!
//! How it runs: rows are cut into chunks of `chunk_rows` ([`ChunkPlan`]). For each chunk the
//! matmul family's `gemm` writes the chunk's F32 logits, the loss family's kernels take them
//! (per-row statistics go straight into one `[rows, …]` matrix for the whole batch, at the
//! chunk's row offset), and the chunk's logit gradient goes back through two more products:
//! `dx[chunk] = dlogits·W` (written at the chunk's rows) and `dW += dlogitsᵀ·x[chunk]`
//! (`gemm` with `accumulate`, chunk after chunk, into one F32 buffer); the bias gradient is
//! the column sums of `dlogits`, added in chunk order. Every sum has a fixed order, so reruns
//! are bit-identical; results with different chunk sizes agree to FP32 rounding.
//!
//! Scratch is `O(chunk_rows × vocab)` plus `O(rows)`: about 8 bytes per logit of a chunk for
//! the cross-entropy (logits and their gradient) and 20 for the distillation losses, and 32
//! bytes per row for the per-row statistics. The chunk size is the largest that fits the
//! memory budget (by default the engine's workspace bound), balanced so that chunks are of
//! equal size; see [`plan_cross_entropy`], [`fused_linear_cross_entropy_workspace_bytes`] and
//! their distillation counterparts.
//!
//! # Gradients in the head's dtypes
//!
//! The F32 weight gradient summed chunk by chunk is the largest buffer of a call (2 GB at
//! V 128,256, H 4,096). With [`Chunking::head_dtype_gradients`] the cross-entropy heads return
//! `dx` and `dW` in the input's and weight's dtypes, each value an FP32 sum over the whole
//! batch rounded once: the row chunks compute the losses, the statistics and `dx[chunk]` (one
//! product over the vocabulary), then blocks of vocabulary columns recompute their logits for
//! every row and take `dW[block] = dzᵀ·x` in one product over the rows (and `db[block]`). No
//! F32 `[vocab, hidden]` buffer exists; the price is one more logits-sized product. Logit
//! gradients are written over their logits where the rows allow it, and the tensor-core
//! products' F16 copies stay within what the budget leaves
//! ([`fused_linear_cross_entropy_blocked_workspace_bytes`]).
//!
//! # Forward / backward split
//!
//! For a scalar loss (reductions sum and mean, and every distillation loss) the forward
//! computes the gradients too, as if the cotangent were 1, and saves them; the backward then
//! only multiplies them by the cotangent — on the GPU, since the cotangent is a one-element
//! tensor — or returns them as they are when no cotangent is given. This needs one product
//! less than recomputing and is what a training step wants. Mean reductions need the number
//! of counted rows (or the target-weight sum) before any chunk's gradient can be scaled: a
//! counting pass over the targets computes the scale on the GPU first, no readback.
//!
//! With reduction `none` the cotangent is one value per row and is unknown at forward time:
//! the forward computes only the losses (one product per chunk) and saves the per-row
//! statistics; the backward recomputes each chunk's logits and takes the gradients from there
//! (three products per chunk). Setting `gradients_in_forward: false` gives scalar reductions
//! the same recomputing backward (useful when a forward may not be followed by a backward).
//! The same holds for an entropy cotangent (the forward's gradients cover the loss only) and
//! for the distillation losses with `DistillationReduction::None` (per-row losses, one
//! cotangent per row, each row's logit gradient multiplied by its cotangent).
//!
//! # Temperature and entropy (scaled fused linear cross-entropy)
//!
//! `FusedLinearCrossEntropyOptions::temperature` T divides the logits,
//! `z = (x·Wᵀ + b)/T`, before every cross-entropy option (the softcap acts on `z`); the
//! product takes `1/T` as its scale and the bias is divided once per call, so no extra pass
//! over the logits runs. `return_entropy` adds the per-row entropy `H = −Σ_c p_c·log p_c`,
//! `p = softmax(z)` (0 on rows the loss does not count), computed from the chunk's logits and
//! the row statistics of the loss kernels. Its cotangent enters through
//! [`fused_linear_cross_entropy_backward_with_entropy`]: `∂H/∂z_c = −p_c·(log p_c + H)`,
//! added in place to the chunk's loss gradient, then (through the softcap) times `1/T` in the
//! two products and the bias sums.

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, COMMON_SOFTCAP, Kernel};
use crate::loss::{
    self, CeBlock, CeGradInputs, CeSettings, CrossEntropyOptions, CrossEntropyOutput, DivReduction,
    DivSettings, Reduction,
};
use crate::matmul::{
    Gemm, GemmOperand, OperandMaxima, gemm_within, gemm_workspace_bytes, tensor_core_maxima,
    tensor_core_maxima_of,
};
use crate::reduce::{sum_columns, sum_columns_workspace_bytes};
use crate::{DType, Engine, Error, Result, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Partial maxima of blocks of a head's weight rows, by `(first row, rows)`.
type BlockMaxima = HashMap<(usize, usize), Option<OperandMaxima>>;

/// `wgsl/fused_linear.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "fused_linear",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        COMMON_SOFTCAP,
        include_str!("../wgsl/fused_linear.wgsl"),
    ],
};

const WG: u64 = 256;
const F_Y: u32 = 1;
const F_SCALE: u32 = 2;
const F_ROW_SCALE: u32 = 4;

#[derive(encase::ShaderType, Default)]
struct Params {
    n: u32,
    flags: u32,
    a: f32,
    b: f32,
    cols: u32,
    row0: u32,
    cap: f32,
    pad: u32,
}

/// The scale of [`combine`]'s output.
#[derive(Clone, Copy)]
enum Scale<'a> {
    /// 1.
    One,
    /// A one-element F32 tensor (a scalar cotangent on the GPU).
    Scalar(&'a Tensor),
    /// One F32 value per row of the whole batch: `x` holds rows `row0..` of width `cols`.
    Rows {
        values: &'a Tensor,
        row0: usize,
        cols: usize,
    },
}

/// `(a·x + b·y)·s` elementwise into a fresh F32 tensor of `x`'s shape; `y` optional, `s` a
/// one-element F32 tensor or 1.
fn combine(
    x: &Tensor,
    a: f32,
    y: Option<(&Tensor, f32)>,
    scale: Option<&Tensor>,
) -> Result<Tensor> {
    combine_scaled(x, a, y, scale.map_or(Scale::One, Scale::Scalar))
}

/// `(a·x + b·y)·s` with any [`Scale`].
fn combine_scaled(x: &Tensor, a: f32, y: Option<(&Tensor, f32)>, scale: Scale) -> Result<Tensor> {
    let engine = x.engine();
    let out = Tensor::empty(engine, x.shape(), DType::F32, "fused_linear combine")?;
    let mut params = Params {
        n: x.len() as u32,
        a,
        ..Params::default()
    };
    if y.is_some() {
        params.flags |= F_Y;
    }
    let (yt, b) = y.unwrap_or((x, 0.0));
    params.b = b;
    let s = match scale {
        Scale::One => x,
        Scale::Scalar(s) => {
            params.flags |= F_SCALE;
            s
        }
        Scale::Rows { values, row0, cols } => {
            params.flags |= F_ROW_SCALE;
            params.row0 = row0 as u32;
            params.cols = cols as u32;
            values
        }
    };
    engine.launch(
        &KERNEL,
        "combine",
        &vec![
            ("XT", f64::from(x.dtype().code())),
            ("YT", f64::from(yt.dtype().code())),
        ],
        &params,
        &[x.buffer(), yt.buffer(), s.buffer(), out.buffer()],
        (x.len() as u64).div_ceil(WG),
    )?;
    Ok(out)
}

/// Column `column` of the per-row matrix `mat` (`[rows, width]` F32) as an F32 tensor of
/// shape `lead` (`rows` elements).
fn take_column(mat: &Tensor, column: usize, lead: &[usize]) -> Result<Tensor> {
    let engine = mat.engine();
    let rows = mat.shape()[0];
    let out = Tensor::empty(engine, lead, DType::F32, "fused_linear per-row losses")?;
    engine.launch(
        &KERNEL,
        "take_column",
        &vec![("XT", 0.0), ("YT", 0.0)],
        &Params {
            n: rows as u32,
            cols: mat.shape()[1] as u32,
            row0: column as u32,
            ..Params::default()
        },
        &[out.buffer(), mat.buffer()],
        (rows as u64).div_ceil(WG),
    )?;
    Ok(out)
}

// ---- shared pieces ----------------------------------------------------------------------------

/// One linear head: `logits = input·weightᵀ + bias`.
#[derive(Debug, Clone, Copy)]
pub struct LinearHead<'a> {
    /// `[..., hidden]`, F32/F16/BF16.
    pub input: &'a Tensor,
    /// `[vocab, hidden]`, F32/F16/BF16.
    pub weight: &'a Tensor,
    /// `[vocab]`, F32/F16/BF16 (optional).
    pub bias: Option<&'a Tensor>,
}

/// How rows are cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Chunking {
    /// Rows per chunk; `None` (default) picks the largest that fits the budget (then evens
    /// out the chunks). An explicit value is checked against the engine's workspace bound.
    pub chunk_rows: Option<usize>,
    /// Bytes of scratch the call may use; `None` (default) means the engine's workspace bound,
    /// which is also the ceiling.
    pub memory_budget: Option<u64>,
    /// Opt-in: each chunk's logits product `x·Wᵀ` on tensor cores where the head's input and
    /// weight are both 16-bit, F16 or BF16 ([`crate::matmul::Gemm::tensor_cores`]: BF16
    /// scaled by a power of two into F16, exact products, FP32 accumulation in the hardware's
    /// order, [`crate::matmul::tensor_core_tolerance`]; needs [`crate::matmul::tensor_cores`],
    /// else `MissingFeature`). F32 heads ignore it.
    pub tensor_cores: bool,
    /// Opt-in: each chunk's two gradient products (`dx = G·W`, `dW += Gᵀ·x`) on tensor cores
    /// too, any head dtype: the F32 logit gradient `G` (and an F32 head's operand) rounded to
    /// F16 after a power-of-two scale of its tensor (11 significant bits, TF32's precision;
    /// [`crate::matmul::Gemm::round_f32_operands`], compared under
    /// [`crate::matmul::tensor_core_rounded_tolerance`]). The accumulation across chunks stays
    /// FP32. A reduced-precision mode, hence its own switch; needs
    /// [`crate::matmul::tensor_cores`], else `MissingFeature`.
    pub tensor_core_gradients: bool,
    /// Opt-in (the cross-entropy heads: [`fused_linear_cross_entropy`] and the GRPO and
    /// preference losses built on it; the distillation losses refuse it): the input and weight
    /// gradients in the head's own dtypes — `dx` in the input's, `dW` in the weight's (the bias
    /// gradient stays F32) — each value an FP32 sum over the whole batch rounded once to
    /// nearest-even, and no F32 `[vocab, hidden]` buffer: the weight gradient is computed
    /// vocabulary block by block after the row chunks, recomputing each block's logits for
    /// every row (one more logits product), so a BF16 head's extra memory is its BF16
    /// gradients plus one chunk or block.
    /// Each logit gradient is written over its logits where the rows allow it (see
    /// [`fused_linear_cross_entropy_blocked_workspace_bytes`]). A 16-bit head needs an even
    /// hidden size (`InvalidValue`).
    pub head_dtype_gradients: bool,
    /// With `head_dtype_gradients`: vocabulary columns per block of the weight-gradient pass;
    /// `None` (default) picks the largest that fits the budget (a multiple of 8, evened out
    /// over the blocks: the block's F32 logit gradient is then a tensor-core operand for
    /// [`Chunking::tensor_core_gradients`], whose rows must be whole 32-byte chunks). An
    /// explicit value is checked against the engine's workspace bound.
    pub vocab_block: Option<usize>,
    /// Opt-in, with `head_dtype_gradients` (cross-entropy heads only): no row chunks at all.
    /// The loss statistics are taken block by block of vocabulary columns too — a first pass
    /// of logits products over the blocks folds each row's running maximum, sum of
    /// exponentials, argmax, smoothing sums and target logit into a per-row state — and the
    /// gradient pass over the blocks then adds `dx += dz·W[block]` as well (an F32
    /// `[rows, hidden]` sum, rounded once to the input's dtype at the end). So every product
    /// spans all rows (`M` = rows) however small the budget, at the cost of that F32 `dx`
    /// (`4·rows·hidden` bytes of scratch for a 16-bit input); the number of products is the
    /// same as with row chunks (two logits products, `dx` and `dW`). On an H200 it was the
    /// faster order at every budget measured where it fits (README, FLCE table). With
    /// `return_entropy` the state also folds the entropy's `Σ exp(z − m)·(z − m)`. Refused
    /// (`InvalidValue`) without `head_dtype_gradients`; at most 2^24 classes (`OutOfBounds`).
    pub block_statistics: bool,
}

/// The chunking of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Rows of the batch.
    pub rows: usize,
    /// Rows per chunk (the last chunk may be shorter; ≥ 1 even for an empty batch).
    pub chunk_rows: usize,
    /// Number of chunks (`rows / chunk_rows` rounded up).
    pub chunks: usize,
    /// Scratch bytes of the call at this chunk size (the `*_workspace_bytes` figure).
    pub workspace_bytes: u64,
    /// Vocabulary columns per block of the weight-gradient pass
    /// ([`Chunking::head_dtype_gradients`]); `None` when the weight gradient is summed chunk by
    /// chunk.
    pub vocab_block: Option<usize>,
    /// [`Chunking::block_statistics`]: no row chunks (`chunks` is 0), only vocabulary blocks.
    pub block_statistics: bool,
}

impl ChunkPlan {
    /// `(first row, rows)` of each chunk, in order (none with block statistics).
    pub fn ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.chunks).map(move |j| {
            let r0 = j * self.chunk_rows;
            (r0, self.chunk_rows.min(self.rows - r0))
        })
    }

    /// Whether this plan's logit gradients are written over their logits (a vocabulary block,
    /// [`gradient_over_logits`]; not with an entropy cotangent, which needs both).
    fn gradient_over_logits(&self, vocab: usize) -> bool {
        self.vocab_block
            .is_some_and(|b| gradient_over_logits(vocab, b))
    }
}

/// Gradients of a fused linear loss, FP32-accumulated: all F32, or with
/// [`Chunking::head_dtype_gradients`] d input and d weight in the input's and weight's dtypes
/// (each value rounded once from its FP32 sum) and d bias F32.
#[derive(Debug, Clone)]
pub struct FusedLinearGradients {
    /// d input, the input's shape.
    pub input: Tensor,
    /// d weight, `[vocab, hidden]`.
    pub weight: Tensor,
    /// d bias, `[vocab]` (when the head has a bias).
    pub bias: Option<Tensor>,
}

/// A head's tensors, kept for the backward.
#[derive(Debug, Clone)]
struct Head {
    input: Tensor,
    weight: Tensor,
    bias: Option<Tensor>,
    rows: usize,
    hidden: usize,
    vocab: usize,
    /// `1/T`: the logits are `(x·Wᵀ)·scale + bias·scale` (1 without a temperature).
    scale: f32,
    /// The bias the logits add: `bias·scale` (F32) when `scale ≠ 1`, else the bias itself.
    logit_bias: Option<Tensor>,
    /// The logits product on tensor cores ([`Chunking::tensor_cores`] and a 16-bit head).
    tensor_cores: bool,
    /// The gradient products on tensor cores ([`Chunking::tensor_core_gradients`]).
    tensor_core_gradients: bool,
    /// The tensor-core products' F16 copies at most this many bytes
    /// ([`crate::matmul::Gemm::copy_bytes`]; with [`Chunking::head_dtype_gradients`], what the
    /// budget leaves beside the plan's scratch).
    copy_bytes: Option<u64>,
    /// The products' split-K scratch at most this many bytes (`None`: the engine's workspace
    /// bound; with [`Chunking::block_statistics`], part of what the budget leaves beside the
    /// plan's scratch).
    split_bytes: Option<u64>,
    /// The weight's and the input's partial maxima for the tensor-core products that read
    /// them whole (every chunk reads the whole weight, every block the whole input), taken at
    /// the first such product ([`crate::matmul::Gemm::maxima`]): one scan instead of one a
    /// product. A recomputing backward reuses the forward's (the head's tensors must not
    /// change in between, as for the statistics the forward saved).
    weight_maxima: OnceLock<Option<OperandMaxima>>,
    /// The weight's partial maxima over blocks of its rows (vocabulary blocks), by
    /// `(first row, rows)`, each taken the first time a product reads that block.
    block_maxima: Arc<Mutex<BlockMaxima>>,
    input_maxima: OnceLock<Option<OperandMaxima>>,
}

impl Head {
    fn of(h: &LinearHead) -> Head {
        let hidden = h.input.shape().last().copied().unwrap_or(0);
        Head {
            input: h.input.clone(),
            weight: h.weight.clone(),
            bias: h.bias.cloned(),
            rows: h.input.len().checked_div(hidden).unwrap_or(0),
            hidden,
            vocab: h.weight.shape().first().copied().unwrap_or(0),
            scale: 1.0,
            logit_bias: h.bias.cloned(),
            tensor_cores: false,
            tensor_core_gradients: false,
            copy_bytes: None,
            split_bytes: None,
            weight_maxima: OnceLock::new(),
            block_maxima: Arc::default(),
            input_maxima: OnceLock::new(),
        }
    }

    /// The weight's partial maxima for a tensor-core product (`tc`) that reads all of it
    /// (`whole`); `None` otherwise, or for an F16 weight.
    fn weight_maxima(&self, tc: bool, whole: bool) -> Result<Option<&OperandMaxima>> {
        maxima_of(&self.weight_maxima, &self.weight, tc && whole)
    }

    /// The weight's partial maxima over its rows `v0..v0 + rows` for a tensor-core product
    /// (`tc`) that reads exactly them (the whole weight's when that is the block).
    fn block_weight_maxima(
        &self,
        tc: bool,
        (v0, rows): (usize, usize),
    ) -> Result<Option<OperandMaxima>> {
        if !tc {
            return Ok(None);
        }
        if v0 == 0 && rows == self.vocab {
            return Ok(self.weight_maxima(tc, true)?.cloned());
        }
        let mut cache = self.block_maxima.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cache.get(&(v0, rows)) {
            return Ok(m.clone());
        }
        let h = self.hidden;
        let m = tensor_core_maxima_of(&self.weight, v0 * h, rows * h)?;
        cache.insert((v0, rows), m.clone());
        Ok(m)
    }

    /// The input's, likewise.
    fn input_maxima(&self, tc: bool, whole: bool) -> Result<Option<&OperandMaxima>> {
        maxima_of(&self.input_maxima, &self.input, tc && whole)
    }

    /// One of the head's products, its split-K scratch within `split_bytes`.
    fn gemm(&self, call: &Gemm) -> Result<()> {
        gemm_within(call, self.split_bytes.unwrap_or(u64::MAX))
    }

    /// The same head with its logits product on tensor cores when `chunking` asks for them
    /// and its input and weight are 16-bit, and its gradient products when it asks for those;
    /// `MissingFeature` (before anything is recorded) when the engine cannot run them.
    fn with_chunking(mut self, chunking: &Chunking) -> Result<Head> {
        self.tensor_cores = chunking.tensor_cores
            && self.input.dtype() != DType::F32
            && self.weight.dtype() != DType::F32;
        self.tensor_core_gradients = chunking.tensor_core_gradients;
        if (self.tensor_cores || self.tensor_core_gradients)
            && !crate::matmul::tensor_cores(self.input.engine())
        {
            return Err(Error::MissingFeature {
                features: "tensor cores (matmul::tensor_cores) for Chunking::tensor_cores".into(),
            });
        }
        Ok(self)
    }

    /// The same head with its logits divided by `temperature` (the bias divided once, here).
    fn tempered(mut self, temperature: f32) -> Result<Head> {
        if temperature != 1.0 {
            self.scale = 1.0 / temperature;
            self.logit_bias = self
                .bias
                .as_ref()
                .map(|b| combine(b, self.scale, None, None))
                .transpose()?;
        }
        Ok(self)
    }

    fn lead(&self) -> &[usize] {
        &self.input.shape()[..self.input.shape().len() - 1]
    }

    /// F32 `[rows, vocab]` logits of rows `r0..r0 + rows`.
    fn logits(&self, r0: usize, rows: usize) -> Result<Tensor> {
        self.logits_of((r0, rows), (0, self.vocab), self.logit_bias.as_ref())
    }

    /// F32 `[rows, cols]` logits of rows `r0..r0 + rows` and vocabulary columns
    /// `v0..v0 + cols`, `bias` the logit bias of those columns (`[cols]`).
    fn logits_of(
        &self,
        (r0, rows): (usize, usize),
        (v0, cols): (usize, usize),
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let engine = self.input.engine();
        let out = Tensor::empty(engine, &[rows, cols], DType::F32, "fused_linear logits")?;
        let tc = self.tensor_cores;
        let weight_maxima = self.block_weight_maxima(tc, (v0, cols))?;
        self.gemm(&Gemm {
            bias,
            alpha: self.scale,
            tensor_cores: tc,
            copy_bytes: self.copy_bytes,
            maxima: [
                self.input_maxima(tc, r0 == 0 && rows == self.rows)?,
                weight_maxima.as_ref(),
            ],
            ..Gemm::plain(
                GemmOperand {
                    offset: r0 * self.hidden,
                    ..GemmOperand::whole(&self.input, false)
                },
                GemmOperand {
                    offset: v0 * self.hidden,
                    ..GemmOperand::whole(&self.weight, true)
                },
                &out,
                (rows, cols, self.hidden),
                false,
            )
        })?;
        Ok(out)
    }
}

/// `t`'s partial maxima, taken into `cell` the first time they are `wanted`.
fn maxima_of<'c>(
    cell: &'c OnceLock<Option<OperandMaxima>>,
    t: &Tensor,
    wanted: bool,
) -> Result<Option<&'c OperandMaxima>> {
    if !wanted {
        return Ok(None);
    }
    if cell.get().is_none() {
        let _ = cell.set(tensor_core_maxima(t)?);
    }
    Ok(cell.get().and_then(Option::as_ref))
}

fn float_tensor(what: &str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, t.dtype(), &DType::FLOATS))
    }
}

/// Validate one head on `engine`: float tensors, `input [..., hidden]` with hidden ≥ 1,
/// `weight [vocab, hidden]` with vocab ≥ 1, `bias [vocab]`.
fn check_head(what: &str, engine: &Engine, h: &LinearHead) -> Result<Head> {
    h.input.check_engine(engine, &format!("{what}: input"))?;
    h.weight.check_engine(engine, &format!("{what}: weight"))?;
    float_tensor(&format!("{what}: input"), h.input)?;
    float_tensor(&format!("{what}: weight"), h.weight)?;
    let Some(&hidden) = h.input.shape().last() else {
        return Err(Error::shape(
            format!("{what}: input (needs a hidden axis)"),
            &[0],
            h.input.shape(),
        ));
    };
    if hidden == 0 {
        return Err(Error::bounds(
            format!("{what}: hidden size"),
            0,
            1,
            u64::from(u32::MAX),
        ));
    }
    let ws = h.weight.shape();
    if ws.len() != 2 || ws[1] != hidden {
        let vocab = ws.first().copied().unwrap_or(0);
        return Err(Error::shape(
            format!("{what}: weight (vocab × hidden)"),
            &[vocab, hidden],
            ws,
        ));
    }
    if ws[0] == 0 {
        return Err(Error::bounds(
            format!("{what}: vocabulary size"),
            0,
            1,
            u64::from(u32::MAX),
        ));
    }
    // The products index every operand with 32-bit element offsets.
    for (t, name) in [(h.input, "input"), (h.weight, "weight")] {
        if t.len() as u64 > u64::from(u32::MAX) {
            return Err(Error::bounds(
                format!("{what}: {name} elements"),
                t.len() as u64,
                0,
                u64::from(u32::MAX),
            ));
        }
    }
    if let Some(b) = h.bias {
        b.check_engine(engine, &format!("{what}: bias"))?;
        float_tensor(&format!("{what}: bias"), b)?;
        if b.shape() != [ws[0]] {
            return Err(Error::shape(format!("{what}: bias"), &[ws[0]], b.shape()));
        }
    }
    Ok(Head::of(h))
}

/// Gradient buffers filled chunk by chunk (F32), or with
/// [`Chunking::head_dtype_gradients`] `dx` chunk by chunk and `dW`, `db` block by block of
/// vocabulary columns (`dx`, `dW` in the head's dtypes, `db` F32).
struct Accumulator {
    dx: Tensor,
    dw: Tensor,
    bias: bool,
    db: Option<Tensor>,
    first: bool,
    /// The head's logit scale `1/T`: the chunk gradients are with respect to the scaled
    /// logits, so each product (and the bias sums) takes this factor.
    scale: f32,
    /// Columns per block of the weight-gradient pass ([`Accumulator::add_blocks`]); `None`:
    /// the chunks sum `dW` and `db` themselves.
    vocab_block: Option<usize>,
    /// [`Chunking::block_statistics`]: the blocks sum `dx` too, into `dx` as F32 (rounded to
    /// the input's dtype after the last block).
    dx_blocks: bool,
}

impl Accumulator {
    /// Output buffers for `plan` (allocated before anything is launched), F32 or, with a
    /// vocabulary block, `dx` and `dW` in the input's and weight's dtypes (`dx` summed in F32
    /// first with block statistics).
    fn new(head: &Head, plan: &ChunkPlan) -> Result<Accumulator> {
        let engine = head.input.engine();
        let vocab_block = plan.vocab_block;
        let dx_blocks = plan.block_statistics && head.rows > 0;
        let (dx_dtype, dw_dtype) = match vocab_block {
            Some(_) if dx_blocks => (DType::F32, head.weight.dtype()),
            Some(_) => (head.input.dtype(), head.weight.dtype()),
            None => (DType::F32, DType::F32),
        };
        let dx = Tensor::empty(engine, head.input.shape(), dx_dtype, "d input")?;
        let dw = if head.rows == 0 {
            Tensor::zeros(engine, &[head.vocab, head.hidden], dw_dtype)?
        } else {
            Tensor::empty(engine, &[head.vocab, head.hidden], dw_dtype, "d weight")?
        };
        let bias = head.bias.is_some();
        let db = if bias && (head.rows == 0 || vocab_block.is_some()) {
            Some(Tensor::zeros(engine, &[head.vocab], DType::F32)?)
        } else {
            None
        };
        Ok(Accumulator {
            dx,
            dw,
            bias,
            db,
            first: true,
            scale: head.scale,
            vocab_block,
            dx_blocks,
        })
    }

    /// The weight-gradient pass of [`Chunking::head_dtype_gradients`] (nothing without a
    /// vocabulary block, or without rows): for each block of columns `v0..v0 + w`, the
    /// logits of every row `z = x·W[v0..]ᵀ/T + b[v0..]/T` (recomputed), their gradient
    /// `dz = grad(z, block)` (which may write over `z`), then
    /// `dW[v0..] = s·dzᵀ·x` (one product over all rows, FP32 sums, rounded once to the
    /// weight's dtype) and `db[v0..] = s·Σ_r dz`; with block statistics also
    /// `dx += s·dz·W[v0..]` (F32, block after block), rounded to the input's dtype at the end.
    fn add_blocks(
        &mut self,
        head: &Head,
        grad: &mut dyn FnMut(&Tensor, CeBlock) -> Result<Tensor>,
    ) -> Result<()> {
        let Some(block) = self.vocab_block else {
            return Ok(());
        };
        let engine = head.input.engine();
        let s = self.scale;
        let tc = head.tensor_core_gradients;
        for_blocks(head, block, &mut |v0, z| {
            let w = z.shape()[1];
            let dz = grad(z, CeBlock { row0: 0, col0: v0 })?;
            // Both products read all of dz: one scan for its tensor-core factor.
            let dz_maxima = match (tc, self.dx_blocks) {
                (true, true) => tensor_core_maxima(&dz)?,
                _ => None,
            };
            if self.dx_blocks {
                head.gemm(&Gemm {
                    alpha: s,
                    tensor_cores: tc,
                    round_f32_operands: tc,
                    copy_bytes: head.copy_bytes,
                    maxima: [
                        dz_maxima.as_ref(),
                        head.block_weight_maxima(tc, (v0, w))?.as_ref(),
                    ],
                    ..Gemm::plain(
                        GemmOperand::whole(&dz, false),
                        GemmOperand {
                            offset: v0 * head.hidden,
                            ..GemmOperand::whole(&head.weight, false)
                        },
                        &self.dx,
                        (head.rows, head.hidden, w),
                        v0 > 0,
                    )
                })?;
            }
            head.gemm(&Gemm {
                out_offset: v0 * head.hidden,
                alpha: s,
                tensor_cores: tc,
                round_f32_operands: tc,
                copy_bytes: head.copy_bytes,
                maxima: [dz_maxima.as_ref(), head.input_maxima(tc, true)?],
                ..Gemm::plain(
                    GemmOperand::whole(&dz, true),
                    GemmOperand::whole(&head.input, false),
                    &self.dw,
                    (w, head.hidden, head.rows),
                    false,
                )
            })?;
            if let Some(db) = &self.db {
                let sums = sum_columns(&dz)?;
                let sums = if s == 1.0 {
                    sums
                } else {
                    combine(&sums, s, None, None)?
                };
                engine.record(|enc| {
                    enc.copy_buffer_to_buffer(
                        sums.buffer(),
                        0,
                        db.buffer(),
                        4 * v0 as u64,
                        4 * w as u64,
                    )
                });
            }
            Ok(())
        })?;
        if self.dx_blocks {
            self.dx = crate::cast::cast(&self.dx, head.input.dtype())?;
        }
        Ok(())
    }

    /// Take the logit gradient `dlogits` (`[rows, vocab]` F32) of rows `r0..` back through
    /// the head: `dx[r0..] = s·dlogits·W`, `dW (+)= s·dlogitsᵀ·x[r0..]`,
    /// `db (+)= s·Σ_r dlogits`, `s` the head's logit scale (with a vocabulary block, `dx`
    /// only: [`Accumulator::add_blocks`] does the rest).
    fn add_chunk(&mut self, head: &Head, r0: usize, dlogits: &Tensor) -> Result<()> {
        let rows = dlogits.shape()[0];
        let s = self.scale;
        let tc = head.tensor_core_gradients;
        head.gemm(&Gemm {
            out_offset: r0 * head.hidden,
            alpha: s,
            tensor_cores: tc,
            round_f32_operands: tc,
            copy_bytes: head.copy_bytes,
            maxima: [None, head.weight_maxima(tc, true)?],
            ..Gemm::plain(
                GemmOperand::whole(dlogits, false),
                GemmOperand::whole(&head.weight, false),
                &self.dx,
                (rows, head.hidden, head.vocab),
                false,
            )
        })?;
        if self.vocab_block.is_some() {
            return Ok(());
        }
        head.gemm(&Gemm {
            alpha: s,
            tensor_cores: tc,
            round_f32_operands: tc,
            maxima: [None, head.input_maxima(tc, rows == head.rows)?],
            ..Gemm::plain(
                GemmOperand::whole(dlogits, true),
                GemmOperand {
                    offset: r0 * head.hidden,
                    ..GemmOperand::whole(&head.input, false)
                },
                &self.dw,
                (head.vocab, head.hidden, rows),
                !self.first,
            )
        })?;
        if self.bias {
            let sums = sum_columns(dlogits)?;
            self.db = Some(match &self.db {
                None if s == 1.0 => sums,
                None => combine(&sums, s, None, None)?,
                Some(db) => combine(db, 1.0, Some((&sums, s)), None)?,
            });
        }
        self.first = false;
        Ok(())
    }

    fn finish(self) -> FusedLinearGradients {
        FusedLinearGradients {
            input: self.dx,
            weight: self.dw,
            bias: self.db,
        }
    }
}

/// For each block of `block` vocabulary columns `v0..v0 + w` of `head` (none without rows),
/// in order: `f(v0, z)` with `z` the F32 logits `[rows, w]` of every row,
/// `x·W[v0..]ᵀ/T + b[v0..]/T`.
fn for_blocks(
    head: &Head,
    block: usize,
    f: &mut dyn FnMut(usize, &Tensor) -> Result<()>,
) -> Result<()> {
    if head.rows == 0 {
        return Ok(());
    }
    // The logit bias in F32, sliced block by block.
    let bias = match &head.logit_bias {
        Some(b) if b.dtype() == DType::F32 => Some(b.clone()),
        Some(b) => Some(combine(b, 1.0, None, None)?),
        None => None,
    };
    for v0 in (0..head.vocab).step_by(block) {
        let w = block.min(head.vocab - v0);
        let block_bias = bias
            .as_ref()
            .map(|b| b.f32_range(v0, &[w], "fused_linear block bias"))
            .transpose()?;
        let z = head.logits_of((0, head.rows), (v0, w), block_bias.as_ref())?;
        drop(block_bias);
        f(v0, &z)?;
    }
    Ok(())
}

/// [`Chunking::block_statistics`]' first pass: every block's logits folded into a per-row
/// state ([`loss::ce_stats_block`]), then the per-row matrix `mat` and the predictions from it.
fn block_statistics(
    head: &Head,
    block: usize,
    targets: &Tensor,
    settings: &CeSettings,
    mat: &Tensor,
    (predicted, entropy): (Option<&Tensor>, Option<&Tensor>),
) -> Result<()> {
    if head.rows == 0 {
        return Ok(());
    }
    let engine = head.input.engine();
    let state = Tensor::empty(
        engine,
        &[head.rows, loss::CE_BLOCK_STATE],
        DType::F32,
        "fused_linear block state",
    )?;
    let with_entropy = entropy.is_some();
    for_blocks(head, block, &mut |v0, z| {
        loss::ce_stats_block(z, targets, settings, v0, &state, with_entropy)
    })?;
    loss::ce_stats_finish(
        &state, targets, settings, head.vocab, mat, predicted, entropy,
    )
}

/// Scratch of the chunk work beyond the `n_logits` F32 `[chunk_rows, vocab]` buffers: the
/// bias gradient's column-sum partials and two `[vocab]` sums.
fn bias_scratch(chunk_rows: usize, vocab: usize, bias: bool) -> u64 {
    if bias {
        sum_columns_workspace_bytes(chunk_rows, vocab) + 8 * vocab as u64
    } else {
        0
    }
}

/// The largest split-K scratch ([`gemm_workspace_bytes`]) of the products a call issues for a
/// chunk of `chunk_rows` rows (and for its last, shorter chunk): `products(r)` lists the
/// `(m, n, k)` of each product of an `r`-row chunk. The products run one at a time, so the
/// largest one counts.
fn products_scratch(
    rows: usize,
    chunk_rows: usize,
    products: impl Fn(usize) -> Vec<(usize, usize, usize)>,
) -> u64 {
    let c = chunk_rows.min(rows.max(1));
    let last = match rows % c {
        0 => c,
        r => r,
    };
    [c, last]
        .into_iter()
        .flat_map(&products)
        .map(|(m, n, k)| gemm_workspace_bytes(m, n, k, 1))
        .max()
        .unwrap_or(0)
}

/// The scratch budget of a call: `Chunking::memory_budget`, at most the engine's workspace
/// bound (which is also the default).
fn budget_of(engine: &Engine, chunking: &Chunking) -> u64 {
    let bound = engine.workspace_bound();
    chunking.memory_budget.unwrap_or(bound).min(bound)
}

/// Why [`piece_size`] found no size.
enum PieceError {
    /// An explicit size of 0, or one whose F32 block would not fit one binding.
    Err(Error),
    /// Not even the smallest piece fits.
    OneTooLarge,
}

/// The size of the pieces `items` are cut into (rows into chunks, vocabulary columns into
/// blocks): `explicit` (at most `items`; 0 is `OutOfBounds`), checked against the binding
/// limit (`bytes(size)` of its F32 block); or else the largest multiple of `granule` (or
/// `items` itself) whose block fits the binding and for which `fits` holds, evened out over
/// the pieces. `fits` need not be monotone (the products' split-K scratch is not): the
/// evened-out size is checked again, and the smallest piece is known to fit.
fn piece_size(
    what: &str,
    explicit: Option<usize>,
    items: usize,
    granule: usize,
    bytes: impl Fn(usize) -> u64,
    binding: u64,
    fits: impl Fn(usize) -> bool,
) -> std::result::Result<usize, PieceError> {
    let most = items.max(1);
    if let Some(size) = explicit {
        if size == 0 {
            return Err(PieceError::Err(Error::bounds(what, 0, 1, u64::MAX)));
        }
        let size = size.min(most);
        if bytes(size) > binding {
            return Err(PieceError::Err(Error::LimitExceeded {
                what: format!("{what}: F32 block of {size}"),
                bytes: bytes(size),
                limit: binding,
                limit_name: "max_storage_buffer_binding_size",
            }));
        }
        return Ok(size);
    }
    let size_of = |units: usize| (units * granule).min(most);
    let ok = |size: usize| bytes(size) <= binding && fits(size);
    if !ok(size_of(1)) {
        return Err(PieceError::OneTooLarge);
    }
    // The largest number of granules in [1, units] that fits.
    let (mut lo, mut hi) = (1, most.div_ceil(granule));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if ok(size_of(mid)) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    // Evened out over the pieces (a multiple of the granule), checked again. Since `fits`
    // need not be monotone (a short last piece may take a split-K scratch that even pieces
    // do not), fewer pieces of even size are tried first, up to SCAN_PIECES of them.
    const SCAN_PIECES: usize = 4096;
    let evened = |pieces: usize| size_of(most.div_ceil(pieces).div_ceil(granule));
    let mut pieces = most.div_ceil(size_of(lo));
    if pieces <= SCAN_PIECES {
        if let Some(fewer) = (1..pieces).find(|&p| ok(evened(p))) {
            return Ok(evened(fewer));
        }
    }
    while !ok(evened(pieces)) {
        pieces += 1;
    }
    Ok(evened(pieces))
}

/// A large chunk (evened out over the chunks) whose workspace fits `budget`, or the
/// explicit chunk size checked against the bound.
fn plan(
    what: &str,
    engine: &Engine,
    rows: usize,
    vocab: usize,
    chunking: &Chunking,
    workspace: impl Fn(usize) -> u64,
) -> Result<ChunkPlan> {
    let budget = budget_of(engine, chunking);
    let binding = engine.max_binding_bytes();
    let chunk_rows = piece_size(
        &format!("{what}: chunk_rows"),
        chunking.chunk_rows,
        rows,
        1,
        |c| (c as u64) * (vocab as u64) * 4,
        binding,
        |c| workspace(c) <= budget,
    )
    .map_err(|e| match e {
        PieceError::Err(e) => e,
        PieceError::OneTooLarge => Error::WorkspaceExceeded {
            what: format!("{what} (one row per chunk)"),
            needed: workspace(1),
            bound: budget,
        },
    })?;
    let needed = workspace(chunk_rows);
    engine.check_workspace(what, needed)?;
    Ok(ChunkPlan {
        rows,
        chunk_rows,
        chunks: rows.div_ceil(chunk_rows),
        workspace_bytes: needed,
        vocab_block: None,
        block_statistics: false,
    })
}

/// Check a scalar-loss cotangent (`[]` or `[1]` F32) or make a unit one.
fn scalar_cotangent(what: &str, engine: &Engine, c: Option<&Tensor>) -> Result<Tensor> {
    let (t, _) = loss::ce_cotangent(what, engine, c, Reduction::Sum, &[])?;
    Ok(t)
}

/// The saved gradients times a GPU-side cotangent (or as they are without one), each in its
/// own dtype (a 16-bit gradient's products rounded once more).
fn scaled(g: &FusedLinearGradients, cot: Option<&Tensor>) -> Result<FusedLinearGradients> {
    let Some(c) = cot else {
        return Ok(g.clone());
    };
    let times = |t: &Tensor| {
        if t.dtype() == DType::F32 {
            combine(t, 1.0, None, Some(c))
        } else {
            scale_words(t, c)
        }
    };
    Ok(FusedLinearGradients {
        input: times(&g.input)?,
        weight: times(&g.weight)?,
        bias: g.bias.as_ref().map(times).transpose()?,
    })
}

/// A 16-bit tensor times the one-element F32 tensor `c`, in its dtype: each product
/// rounded once to nearest-even.
fn scale_words(t: &Tensor, c: &Tensor) -> Result<Tensor> {
    let engine = t.engine();
    let out = Tensor::empty(engine, t.shape(), t.dtype(), "fused_linear scaled gradient")?;
    engine.launch(
        &KERNEL,
        "scale_words",
        &vec![("XT", f64::from(t.dtype().code())), ("YT", 0.0)],
        &Params {
            n: t.len() as u32,
            ..Params::default()
        },
        &[t.buffer(), c.buffer(), out.buffer()],
        (t.len().div_ceil(2) as u64).div_ceil(WG),
    )?;
    Ok(out)
}

/// An F32 `[8]` finish vector with unit scales (sum and none reductions need no count).
fn unit_ce_scales(engine: &Engine) -> Result<Tensor> {
    Tensor::from_slice(engine, &[0.0f32, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0], &[8])
}

// ---- fused linear cross-entropy ------------------------------------------------------------

/// Options of [`fused_linear_cross_entropy`].
#[derive(Debug, Clone)]
pub struct FusedLinearCrossEntropyOptions {
    /// The cross-entropy options, with their meanings and defaults (ignore_index −100, label
    /// smoothing, z-loss, softcap, class weights, reduction mean, target check).
    pub cross_entropy: CrossEntropyOptions,
    /// Chunk size or memory budget (default: from the engine's workspace bound).
    pub chunking: Chunking,
    /// Sum / mean: compute the gradients in the forward (default true; see the module docs).
    /// Ignored for reduction none, whose backward always recomputes.
    pub gradients_in_forward: bool,
    /// Temperature T > 0 (default 1): the loss is taken on `z = (x·Wᵀ + b)/T`, every
    /// cross-entropy option (softcap included, applied to `z`) and the entropy then acting on
    /// these logits. The gradients include the `1/T` of the chain rule.
    pub temperature: f32,
    /// Also return the per-row entropy `H = −Σ_c p_c·log p_c` of `p = softmax(z)`
    /// (`CrossEntropyOutput::entropy`, F32 of `x`'s leading shape; 0 on rows the loss does
    /// not count), whose cotangent [`fused_linear_cross_entropy_backward_with_entropy`]
    /// takes (default false).
    pub return_entropy: bool,
}

impl Default for FusedLinearCrossEntropyOptions {
    fn default() -> Self {
        FusedLinearCrossEntropyOptions {
            cross_entropy: CrossEntropyOptions::default(),
            chunking: Chunking::default(),
            gradients_in_forward: true,
            temperature: 1.0,
            return_entropy: false,
        }
    }
}

/// What [`fused_linear_cross_entropy`] keeps for its backward.
#[derive(Debug, Clone)]
pub struct FusedLinearCrossEntropySaved {
    head: Head,
    targets: Tensor,
    settings: CeSettings,
    rows_matrix: Tensor,
    finish: Tensor,
    plan: ChunkPlan,
    gradients: Option<FusedLinearGradients>,
    /// The entropy output (with `return_entropy`) and the softcap (0 = off).
    entropy: Option<Tensor>,
    cap: f32,
}

impl FusedLinearCrossEntropySaved {
    /// The chunking used (the backward uses it again when it recomputes).
    pub fn plan(&self) -> ChunkPlan {
        self.plan
    }

    /// Per-row statistics `[rows, 8]` F32, as `CrossEntropySaved::rows_matrix`.
    pub fn rows_matrix(&self) -> &Tensor {
        &self.rows_matrix
    }
}

/// Scratch bytes of [`fused_linear_cross_entropy`] (forward and backward) for `rows` rows, a
/// vocabulary of `vocab`, `chunk_rows` rows per chunk and a bias or not: the per-row matrix
/// of the cross-entropy and its column sums, two finish vectors, and per chunk the F32
/// logits and logit gradient (`8·chunk_rows·vocab` bytes) plus, with a bias, its column-sum
/// partials and the bias divided by the temperature (`4·vocab`), plus the largest split-K
/// scratch of the chunk's products (`matmul::gemm_workspace_bytes` of the logits
/// `(chunk, vocab, hidden)`, `dx` `(chunk, hidden, vocab)` and `dW` `(vocab, hidden, chunk)`,
/// at the chunk size and the last chunk's; e.g. 8 slices of `[256, 4096]` at hidden 4096 and
/// a vocabulary of 128,256: 32 MiB).
pub fn fused_linear_cross_entropy_workspace_bytes(
    rows: usize,
    hidden: usize,
    vocab: usize,
    chunk_rows: usize,
    bias: bool,
) -> u64 {
    let c = chunk_rows.min(rows.max(1));
    let products = products_scratch(rows, c, |r| {
        vec![(r, vocab, hidden), (r, hidden, vocab), (vocab, hidden, r)]
    });
    let tempered_bias = if bias { 4 * vocab as u64 } else { 0 };
    loss::cross_entropy_workspace_bytes(rows)
        + 32
        + 16
        + 8 * (c as u64) * (vocab as u64)
        + bias_scratch(c, vocab, bias)
        + tempered_bias
        + products
}

/// Scratch bytes of [`fused_linear_cross_entropy`] with [`Chunking::head_dtype_gradients`]
/// (forward and backward; `entropy_cotangent`: a backward given an entropy cotangent), for
/// `rows` rows, chunks of `chunk_rows` rows and blocks of `vocab_block` vocabulary columns:
/// the per-row matrix and its sums as in [`fused_linear_cross_entropy_workspace_bytes`], with a
/// bias its F32 copy divided by the temperature (`4·vocab`), and the larger of
/// * a chunk: its F32 logits `[chunk_rows, vocab]`, plus the largest split-K scratch of its
///   logits and `dx` products;
/// * a block: its F32 logits `[rows, vocab_block]`, with a bias their column-sum partials and
///   `12·vocab_block` bytes, plus the largest split-K scratch of its logits and `dW`
///   products.
///
/// Each logit gradient is written over its logits when the vocabulary and the block are
/// multiples of 4 (and no entropy cotangent needs both); otherwise it takes another F32
/// buffer of the logits' size, so chunk and block count 8 bytes a logit. The tensor-core
/// products' F16 operand copies take only what the budget leaves beside this figure
/// ([`crate::matmul::Gemm::copy_bytes`]).
pub fn fused_linear_cross_entropy_blocked_workspace_bytes(
    rows: usize,
    hidden: usize,
    vocab: usize,
    chunk_rows: usize,
    vocab_block: usize,
    bias: bool,
    entropy_cotangent: bool,
) -> u64 {
    let c = chunk_rows.min(rows.max(1));
    let b = vocab_block.min(vocab.max(1));
    let over = gradient_over_logits(vocab, b) && !entropy_cotangent;
    let per_logit: u64 = if over { 4 } else { 8 };
    let chunk = per_logit * (c as u64) * (vocab as u64)
        + products_scratch(rows, c, |r| vec![(r, vocab, hidden), (r, hidden, vocab)]);
    let block_bias = if bias {
        sum_columns_workspace_bytes(rows, b) + 12 * b as u64
    } else {
        0
    };
    let block = per_logit * (rows as u64) * (b as u64)
        + block_bias
        + products_scratch(vocab, b, |w| vec![(rows, w, hidden), (w, hidden, rows)]);
    let f32_bias = if bias { 4 * vocab as u64 } else { 0 };
    loss::cross_entropy_workspace_bytes(rows) + 32 + 16 + f32_bias + chunk.max(block)
}

/// Scratch bytes of [`fused_linear_cross_entropy`] with [`Chunking::block_statistics`]
/// (forward and backward; `entropy_cotangent`: a backward given an entropy cotangent) for
/// `rows` rows and blocks of `vocab_block` vocabulary columns: the per-row matrix and its sums
/// as in [`fused_linear_cross_entropy_workspace_bytes`], the blocks' per-row state
/// (`36·rows`), with a bias its F32 copy divided by the temperature (`4·vocab`), the F32 `dx`
/// sum `[rows, hidden]` unless the input is F32 (`input_f32`; then it is the output itself),
/// and a block: its F32 logits `[rows, vocab_block]` (8 bytes a logit when its gradient cannot
/// be written over them, or with an entropy cotangent, which needs both, see
/// [`fused_linear_cross_entropy_blocked_workspace_bytes`]), with a bias their column-sum
/// partials and `12·vocab_block` bytes. The products' split-K scratch
/// ([`fused_linear_cross_entropy_block_split_bytes`]) and the tensor-core F16 copies are not in this figure: they take
/// only what the budget leaves beside it (the split first), so a tight budget gives longer
/// blocks whose products split less.
pub fn fused_linear_cross_entropy_block_statistics_workspace_bytes(
    rows: usize,
    hidden: usize,
    vocab: usize,
    vocab_block: usize,
    bias: bool,
    input_f32: bool,
    entropy_cotangent: bool,
) -> u64 {
    let b = vocab_block.min(vocab.max(1));
    let over = gradient_over_logits(vocab, b) && !entropy_cotangent;
    let per_logit: u64 = if over { 4 } else { 8 };
    let block_bias = if bias {
        sum_columns_workspace_bytes(rows, b) + 12 * b as u64
    } else {
        0
    };
    let block = per_logit * (rows as u64) * (b as u64) + block_bias;
    let f32_bias = if bias { 4 * vocab as u64 } else { 0 };
    let dx_sum = if input_f32 {
        0
    } else {
        4 * (rows as u64) * (hidden as u64)
    };
    loss::cross_entropy_workspace_bytes(rows)
        + 32
        + 16
        + 4 * (loss::CE_BLOCK_STATE * rows) as u64
        + f32_bias
        + dx_sum
        + block
}

/// The largest split-K scratch ([`gemm_workspace_bytes`]) of the products of a
/// [`Chunking::block_statistics`] block of `vocab_block` columns (and of the last, shorter
/// one): the logits `[rows, block]`, `dx [rows, hidden]` (K = block) and
/// `dW [block, hidden]` (K = rows).
pub fn fused_linear_cross_entropy_block_split_bytes(
    rows: usize,
    hidden: usize,
    vocab: usize,
    vocab_block: usize,
) -> u64 {
    products_scratch(vocab, vocab_block, |w| {
        vec![(rows, w, hidden), (rows, hidden, w), (w, hidden, rows)]
    })
}

/// Whether the logit gradients of [`Chunking::head_dtype_gradients`] are written over their
/// logits: every row of a chunk (`vocab` wide) and of a block (`vocab_block` wide, the last
/// one too) whole 16-byte chunks.
fn gradient_over_logits(vocab: usize, vocab_block: usize) -> bool {
    vocab.is_multiple_of(4) && vocab_block.is_multiple_of(4)
}

/// The vocabulary blocks' size is a multiple of this (see [`Chunking::vocab_block`]).
const BLOCK_GRANULE: usize = 8;

/// [`plan_cross_entropy`] with [`Chunking::head_dtype_gradients`]: the chunk and the block are
/// live one after the other, so each is sized against the budget with the other at its
/// smallest.
fn plan_blocked(
    engine: &Engine,
    (rows, hidden, vocab): (usize, usize, usize),
    bias: bool,
    input_f32: bool,
    chunking: &Chunking,
) -> Result<ChunkPlan> {
    const WHAT: &str = "fused_linear_cross_entropy";
    let budget = budget_of(engine, chunking);
    let binding = engine.max_binding_bytes();
    let smallest_block = BLOCK_GRANULE.min(vocab);
    let too_large = |what: &str, needed: u64| Error::WorkspaceExceeded {
        what: format!("{WHAT} ({what})"),
        needed,
        bound: budget,
    };
    // The largest vocabulary block whose workspace `ws(block)` fits the budget.
    let block_size = |ws: &dyn Fn(usize) -> u64| {
        piece_size(
            &format!("{WHAT}: vocab_block"),
            chunking.vocab_block,
            vocab,
            BLOCK_GRANULE,
            |b| (rows.max(1) as u64) * (b as u64) * 4,
            binding,
            |b| ws(b) <= budget,
        )
        .map_err(|e| match e {
            PieceError::Err(e) => e,
            PieceError::OneTooLarge => too_large("eight columns per block", ws(smallest_block)),
        })
    };
    if chunking.block_statistics {
        let ws = |b: usize| {
            fused_linear_cross_entropy_block_statistics_workspace_bytes(
                rows, hidden, vocab, b, bias, input_f32, false,
            )
        };
        let vocab_block = block_size(&ws)?;
        let needed = ws(vocab_block);
        engine.check_workspace(WHAT, needed)?;
        return Ok(ChunkPlan {
            rows,
            chunk_rows: rows.max(1),
            chunks: 0,
            workspace_bytes: needed,
            vocab_block: Some(vocab_block),
            block_statistics: true,
        });
    }
    let ws = |c: usize, b: usize| {
        fused_linear_cross_entropy_blocked_workspace_bytes(rows, hidden, vocab, c, b, bias, false)
    };
    let chunk_rows = piece_size(
        &format!("{WHAT}: chunk_rows"),
        chunking.chunk_rows,
        rows,
        1,
        |c| (c as u64) * (vocab as u64) * 4,
        binding,
        |c| ws(c, smallest_block) <= budget,
    )
    .map_err(|e| match e {
        PieceError::Err(e) => e,
        PieceError::OneTooLarge => too_large("one row per chunk", ws(1, smallest_block)),
    })?;
    let vocab_block = block_size(&|b| ws(1, b))?;
    let needed = ws(chunk_rows, vocab_block);
    engine.check_workspace(WHAT, needed)?;
    Ok(ChunkPlan {
        rows,
        chunk_rows,
        chunks: rows.div_ceil(chunk_rows),
        workspace_bytes: needed,
        vocab_block: Some(vocab_block),
        block_statistics: false,
    })
}

/// The chunking [`fused_linear_cross_entropy`] would use for these shapes and options (with
/// [`Chunking::head_dtype_gradients`] also the vocabulary block), for a head whose input has
/// dtype `input` (with [`Chunking::block_statistics`], a 16-bit input's `dx` is summed in an
/// F32 scratch buffer).
/// Errors: `WorkspaceExceeded` when not even one row per chunk (or eight columns per block)
/// fits the budget, or explicit sizes exceed the engine's bound; `LimitExceeded` when a
/// chunk's or a block's F32 logits would not fit one binding; `OutOfBounds` for
/// `chunk_rows = Some(0)` or `vocab_block = Some(0)`, and for block statistics over more
/// than 2^24 classes; `InvalidValue` for block statistics without `head_dtype_gradients`.
pub fn plan_cross_entropy(
    engine: &Engine,
    rows: usize,
    hidden: usize,
    vocab: usize,
    bias: bool,
    input: DType,
    chunking: &Chunking,
) -> Result<ChunkPlan> {
    const WHAT: &str = "fused_linear_cross_entropy";
    if chunking.block_statistics {
        if !chunking.head_dtype_gradients {
            return Err(Error::InvalidValue {
                what: format!("{WHAT}: Chunking::block_statistics"),
                got: 1.0,
                rule: "needs Chunking::head_dtype_gradients".into(),
            });
        }
        if vocab > loss::CE_BLOCK_MAX_CLASSES {
            return Err(Error::bounds(
                format!("{WHAT}: vocabulary with Chunking::block_statistics"),
                vocab as u64,
                1,
                loss::CE_BLOCK_MAX_CLASSES as u64,
            ));
        }
    }
    if chunking.head_dtype_gradients {
        let input_f32 = input == DType::F32;
        return plan_blocked(engine, (rows, hidden, vocab), bias, input_f32, chunking);
    }
    plan(
        "fused_linear_cross_entropy",
        engine,
        rows,
        vocab,
        chunking,
        |c| fused_linear_cross_entropy_workspace_bytes(rows, hidden, vocab, c, bias),
    )
}

/// Cross-entropy of the logits `x·Wᵀ + b` against integer `targets`, computed chunk by chunk
/// without materializing the logits: the same loss, options and outputs as
/// `loss::cross_entropy` on the full logits (`predicted` included):
///
/// `loss_r = (1 − ε)·w_y·(lse − z_y) + ε/V·Σ_c w_c·(lse − z_c) + coef·lse²`, `z` the
/// (softcapped) logits `(x·Wᵀ + b)/T` of row r (T the temperature, default 1), reduced as the
/// options say.
///
/// With `return_entropy`, `entropy_r = −Σ_c p_c·log p_c`, `p = softmax(z)`, for every counted
/// row (0 for a row whose target is `ignore_index` or, unchecked, out of range); its
/// derivative `∂H/∂z_c = −p_c·(log p_c + H)` enters the backward through
/// [`fused_linear_cross_entropy_backward_with_entropy`] (then times the softcap's derivative
/// `1 − (z/cap)²` and `1/T`). This is the scaled fused linear cross-entropy with an entropy
/// output (temperature plus entropy, as in RL policy losses).
///
/// The backward is [`fused_linear_cross_entropy_backward`]; for sum and mean the gradients
/// are computed here already (see the module docs). Errors, all before anything is launched:
/// non-float `x`, `W` or bias and non-I32 targets (`UnsupportedDType`); `W` not
/// `[vocab, hidden]`, a bias not `[vocab]`, targets not of `x`'s leading shape
/// (`ShapeMismatch`); zero hidden size or vocabulary, `chunk_rows = Some(0)`
/// (`OutOfBounds`); every cross-entropy option error of `loss::cross_entropy` (the target
/// check synchronizes); a temperature that is not finite and > 0, `Chunking::block_statistics`
/// without `head_dtype_gradients` (`InvalidValue`); block statistics over more than 2^24
/// classes (`OutOfBounds`); scratch over the budget or the workspace bound
/// (`WorkspaceExceeded`); outputs or chunks past the binding limit (`LimitExceeded`);
/// tensors of another engine (`EngineMismatch`).
pub fn fused_linear_cross_entropy(
    head: LinearHead,
    targets: &Tensor,
    options: &FusedLinearCrossEntropyOptions,
) -> Result<(CrossEntropyOutput, FusedLinearCrossEntropySaved)> {
    cross_entropy_forward(head, targets, options, None)
}

impl FusedLinearCrossEntropySaved {
    /// The engine of the head.
    pub(crate) fn engine(&self) -> &Engine {
        self.rows_matrix.engine()
    }
}

/// Per-row cotangents that a caller forms between each chunk's row statistics and its
/// gradient (`fused_linear_cross_entropy_rows`).
pub(crate) struct RowCotangents<'a> {
    /// F32, one value per row of the batch: rows `r0..r0 + rows` hold the chunk's after
    /// `fill(r0, rows, rows_matrix)` (the head's per-row matrix `[rows, 8]`, the chunk's rows
    /// written, column 0 the row's cross-entropy).
    pub cotangent: &'a Tensor,
    pub fill: &'a mut dyn FnMut(usize, usize, &Tensor) -> Result<()>,
}

/// [`fused_linear_cross_entropy`] with reduction none whose gradients are computed in the
/// forward for per-row cotangents formed chunk by chunk (`rows`): each chunk's logit gradient
/// takes its rows' cotangents right after its statistics, so the head's products run once
/// (three per chunk). The backward is [`scaled_gradients`].
pub(crate) fn fused_linear_cross_entropy_rows(
    head: LinearHead,
    targets: &Tensor,
    options: &FusedLinearCrossEntropyOptions,
    rows: RowCotangents<'_>,
) -> Result<(CrossEntropyOutput, FusedLinearCrossEntropySaved)> {
    cross_entropy_forward(head, targets, options, Some(rows))
}

/// The gradients a forward of [`fused_linear_cross_entropy_rows`] computed, times the scalar
/// cotangent `d` (`[1]` F32; `None`: the saved tensors themselves, shared, no copy).
pub(crate) fn scaled_gradients(
    saved: &FusedLinearCrossEntropySaved,
    d: Option<&Tensor>,
) -> Result<FusedLinearGradients> {
    match &saved.gradients {
        Some(g) => scaled(g, d),
        None => Err(Error::InvalidValue {
            what: "fused linear head: gradients of the forward".into(),
            got: 0.0,
            rule: "the forward computed none".into(),
        }),
    }
}

/// A cross-entropy logit gradient of a block, written over its logits or not
/// ([`gradient_over_logits`]).
struct CeGrad<'a> {
    inputs: CeGradInputs<'a>,
    over: bool,
}

impl CeGrad<'_> {
    /// The F32 logit gradient of the block `logits` at `at`: the logits' own tensor when
    /// written over them, else a fresh one.
    fn of(&self, logits: &Tensor, at: CeBlock) -> Result<Tensor> {
        if self.over {
            loss::ce_grad_block_over(logits, at, &self.inputs)?;
            Ok(logits.clone())
        } else {
            loss::ce_grad_block(logits, at, &self.inputs)
        }
    }
}

fn cross_entropy_forward(
    head: LinearHead,
    targets: &Tensor,
    options: &FusedLinearCrossEntropyOptions,
    mut rows_cotangent: Option<RowCotangents<'_>>,
) -> Result<(CrossEntropyOutput, FusedLinearCrossEntropySaved)> {
    const WHAT: &str = "fused_linear_cross_entropy";
    let engine = head.input.engine();
    let h = check_head(WHAT, engine, &head)?.with_chunking(&options.chunking)?;
    loss::check_target_tensor(&format!("{WHAT}: targets"), engine, targets, h.lead())?;
    let narrow = h.input.dtype() != DType::F32 || h.weight.dtype() != DType::F32;
    if options.chunking.head_dtype_gradients && narrow && !h.hidden.is_multiple_of(2) {
        return Err(Error::InvalidValue {
            what: format!("{WHAT}: hidden size with head_dtype_gradients and a 16-bit head"),
            got: h.hidden as f64,
            rule: "must be even (16-bit gradients are written two values a word)".into(),
        });
    }
    let ce = &options.cross_entropy;
    let settings = loss::ce_settings(WHAT, engine, ce, h.vocab)?;
    let t = options.temperature;
    finite(
        &format!("{WHAT}: temperature"),
        t,
        "must be finite and > 0",
        t > 0.0,
    )?;
    let plan = plan_cross_entropy(
        engine,
        h.rows,
        h.hidden,
        h.vocab,
        h.bias.is_some(),
        h.input.dtype(),
        &options.chunking,
    )?;
    if ce.check_targets {
        loss::check_target_range(
            &format!("{WHAT}: targets"),
            targets,
            ce.ignore_index,
            h.vocab,
        )?;
    }
    let mut h = h.tempered(t)?;
    if let Some(block) = plan.vocab_block {
        let budget = budget_of(engine, &options.chunking);
        let mut left = budget.saturating_sub(plan.workspace_bytes);
        if plan.block_statistics {
            let split = left.min(fused_linear_cross_entropy_block_split_bytes(
                h.rows, h.hidden, h.vocab, block,
            ));
            h.split_bytes = Some(split);
            left -= split;
        }
        h.copy_bytes = Some(left);
    }
    let cap = ce.softcap.unwrap_or(0.0);
    let per_row = rows_cotangent.is_some();
    let over = plan.gradient_over_logits(h.vocab);
    if per_row && ce.reduction != Reduction::None {
        return Err(Error::InvalidValue {
            what: format!("{WHAT}: per-row cotangents"),
            got: 1.0,
            rule: "need reduction none".into(),
        });
    }
    let eager = (options.gradients_in_forward && ce.reduction != Reduction::None) || per_row;
    let mat = Tensor::empty(engine, &[h.rows, 8], DType::F32, "fused_linear rows")?;
    let predicted = ce
        .predicted
        .then(|| Tensor::empty(engine, h.lead(), DType::I32, "fused_linear predicted"))
        .transpose()?;
    let entropy = if options.return_entropy {
        Some(Tensor::empty(
            engine,
            h.lead(),
            DType::F32,
            "fused_linear entropy",
        )?)
    } else {
        None
    };
    let mut acc = if eager {
        Some(Accumulator::new(&h, &plan)?)
    } else {
        None
    };
    let grad = |logits: &Tensor, at: CeBlock, finish: &Tensor, cot: &Tensor| {
        CeGrad {
            inputs: CeGradInputs {
                targets,
                settings: &settings,
                mat: &mat,
                finish,
                cot,
                per_row,
            },
            over,
        }
        .of(logits, at)
    };
    let unit = Tensor::from_slice(engine, &[1.0f32], &[1])?;
    let scales = if eager && ce.reduction == Reduction::Mean {
        // Counting pass: the mean's scales before any chunk's gradient.
        loss::ce_count(targets, &settings, h.vocab, &mat)?;
        loss::ce_finish_values(engine, &mat, &settings)?
    } else {
        unit_ce_scales(engine)?
    };
    if let (true, Some(block)) = (plan.block_statistics, plan.vocab_block) {
        let outputs = (predicted.as_ref(), entropy.as_ref());
        block_statistics(&h, block, targets, &settings, &mat, outputs)?;
        if let Some(c) = rows_cotangent.as_mut() {
            (c.fill)(0, h.rows, &mat)?;
        }
    }
    for (r0, rows) in plan.ranges() {
        let logits = h.logits(r0, rows)?;
        loss::ce_rows_block(&logits, targets, &settings, r0, &mat, predicted.as_ref())?;
        if let Some(entropy) = &entropy {
            entropy_rows(&logits, &mat, entropy, r0, cap)?;
        }
        if let Some(acc) = acc.as_mut() {
            let cot = match rows_cotangent.as_mut() {
                Some(c) => {
                    (c.fill)(r0, rows, &mat)?;
                    c.cotangent
                }
                None => &unit,
            };
            let dlogits = grad(&logits, CeBlock { row0: r0, col0: 0 }, &scales, cot)?;
            drop(logits);
            acc.add_chunk(&h, r0, &dlogits)?;
        }
    }
    if let Some(acc) = acc.as_mut() {
        let cot = rows_cotangent.as_ref().map_or(&unit, |c| c.cotangent);
        acc.add_blocks(&h, &mut |z, at| grad(z, at, &scales, cot))?;
    }
    let finish = loss::ce_finish_values(engine, &mat, &settings)?;
    let output = loss::ce_outputs(engine, &mat, &finish, settings.reduction, h.lead())?;
    Ok((
        CrossEntropyOutput {
            predicted,
            entropy: entropy.clone(),
            ..output
        },
        FusedLinearCrossEntropySaved {
            head: h,
            targets: targets.clone(),
            settings,
            rows_matrix: mat,
            finish,
            plan,
            gradients: acc.map(Accumulator::finish),
            entropy,
            cap,
        },
    ))
}

/// Per-row entropy of a block of F32 logits (rows `r0..` of the batch) into `entropy`, from
/// the row statistics in `mat`.
fn entropy_rows(
    logits: &Tensor,
    mat: &Tensor,
    entropy: &Tensor,
    r0: usize,
    cap: f32,
) -> Result<()> {
    let (rows, cols) = (logits.shape()[0], logits.shape()[1]);
    logits.engine().launch(
        &KERNEL,
        "entropy_rows",
        &vec![("XT", 0.0), ("YT", 0.0)],
        &Params {
            n: rows as u32,
            cols: cols as u32,
            row0: r0 as u32,
            cap,
            ..Params::default()
        },
        &[logits.buffer(), entropy.buffer(), mat.buffer()],
        rows as u64,
    )
}

/// Add the entropy's logit gradient (cotangent `cot`, one value per row of the batch) to the
/// block's `dlogits`, in place.
fn entropy_grad(
    logits: &Tensor,
    dlogits: &Tensor,
    saved: &FusedLinearCrossEntropySaved,
    entropy: &Tensor,
    cot: &Tensor,
    r0: usize,
) -> Result<()> {
    let n = logits.len();
    logits.engine().launch(
        &KERNEL,
        "entropy_grad",
        &vec![("XT", 0.0), ("YT", 0.0)],
        &Params {
            n: n as u32,
            cols: logits.shape()[1] as u32,
            row0: r0 as u32,
            cap: saved.cap,
            ..Params::default()
        },
        &[
            logits.buffer(),
            cot.buffer(),
            dlogits.buffer(),
            saved.rows_matrix.buffer(),
            entropy.buffer(),
        ],
        (n as u64).div_ceil(WG),
    )
}

/// The cosine soft term of a block of rows `r0..` (student and teacher F32 logits / T) into
/// column 0 of the batch's `[rows, 2]` soft matrix, `β·(1 − cos)` on rows whose column 1 (the
/// counting pass's flag) is set, else 0.
fn cosine_rows(
    student: &Tensor,
    teacher: &Tensor,
    mat: &Tensor,
    r0: usize,
    beta: f32,
) -> Result<()> {
    let (rows, cols) = (student.shape()[0], student.shape()[1]);
    student.engine().launch(
        &KERNEL,
        "cosine_rows",
        &vec![("XT", 0.0), ("YT", 0.0)],
        &Params {
            n: rows as u32,
            a: beta,
            cols: cols as u32,
            row0: r0 as u32,
            ..Params::default()
        },
        &[student.buffer(), teacher.buffer(), mat.buffer()],
        rows as u64,
    )
}

/// d (cosine soft term) / d (student logits / T) of a block of rows `r0..`, times the
/// cotangent `cot` (`[1]`) and the finish's scale (`finish[1]`); 0 on uncounted rows.
#[allow(clippy::too_many_arguments)]
fn cosine_grad(
    student: &Tensor,
    teacher: &Tensor,
    mat: &Tensor,
    finish: &Tensor,
    cot: &Tensor,
    r0: usize,
    beta: f32,
) -> Result<Tensor> {
    let (rows, cols) = (student.shape()[0], student.shape()[1]);
    let engine = student.engine();
    let out = Tensor::empty(engine, &[rows, cols], DType::F32, "cosine gradient")?;
    engine.launch(
        &KERNEL,
        "cosine_grad",
        &vec![("XT", 0.0), ("YT", 0.0)],
        &Params {
            n: rows as u32,
            a: beta,
            cols: cols as u32,
            row0: r0 as u32,
            ..Params::default()
        },
        &[
            student.buffer(),
            teacher.buffer(),
            cot.buffer(),
            out.buffer(),
            mat.buffer(),
            finish.buffer(),
        ],
        rows as u64,
    )?;
    Ok(out)
}

/// Gradients of [`fused_linear_cross_entropy`] with respect to `x`, `W` and the bias (F32).
/// `cotangent`: `None` for a unit cotangent, or F32 of the loss's shape (`[]`/`[1]` for sum
/// and mean, `x`'s leading shape for none). Sum / mean with gradients computed in the
/// forward: the saved gradients times the cotangent (on the GPU); otherwise each chunk's
/// logits are recomputed (same chunks, same bits) and taken back through the head.
pub fn fused_linear_cross_entropy_backward(
    saved: &FusedLinearCrossEntropySaved,
    cotangent: Option<&Tensor>,
) -> Result<FusedLinearGradients> {
    fused_linear_cross_entropy_backward_with_entropy(saved, cotangent, None)
}

/// Gradients of [`fused_linear_cross_entropy`] for the cotangents of both of its
/// differentiable outputs: the loss (`cotangent`, as in
/// [`fused_linear_cross_entropy_backward`]) and the entropy (`entropy_cotangent`: `None` for
/// zero, or F32 of `x`'s leading shape; needs a forward with `return_entropy`). The logit
/// gradient of a row is
///
/// `dz_c = ḡ·∂loss_r/∂z_c + ĝ_r·(−p_c·(log p_c + H_r))`,
///
/// then through the softcap and `1/T` to `dx = dz·W/T`, `dW = dzᵀ·x/T`, `db = Σ_r dz/T`.
/// With an entropy cotangent every chunk is recomputed (the gradients computed in the
/// forward cover the loss only). Errors: those of [`fused_linear_cross_entropy_backward`];
/// an entropy cotangent that is not F32 (`UnsupportedDType`) or not of the leading shape
/// (`ShapeMismatch`), of another engine (`EngineMismatch`), or given for a forward without
/// `return_entropy` (`InvalidValue`).
pub fn fused_linear_cross_entropy_backward_with_entropy(
    saved: &FusedLinearCrossEntropySaved,
    cotangent: Option<&Tensor>,
    entropy_cotangent: Option<&Tensor>,
) -> Result<FusedLinearGradients> {
    const WHAT: &str = "fused_linear_cross_entropy_backward: cotangent";
    let h = &saved.head;
    let engine = h.input.engine();
    let (cot, per_row) =
        loss::ce_cotangent(WHAT, engine, cotangent, saved.settings.reduction, h.lead())?;
    let entropy = match entropy_cotangent {
        None => None,
        Some(c) => {
            let what = "fused_linear_cross_entropy_backward: entropy cotangent";
            let Some(entropy) = &saved.entropy else {
                return Err(Error::InvalidValue {
                    what: what.into(),
                    got: 0.0,
                    rule: "needs a forward with return_entropy".into(),
                });
            };
            loss::ce_cotangent(what, engine, Some(c), Reduction::None, h.lead())?;
            Some((entropy, c))
        }
    };
    if let (Some(g), None) = (&saved.gradients, entropy) {
        return scaled(g, cotangent.map(|_| &cot));
    }
    let plan = &saved.plan;
    let needed = match plan.vocab_block {
        // Both the logits and their gradient are needed for the entropy's term.
        Some(b) if entropy.is_some() && plan.block_statistics => {
            fused_linear_cross_entropy_block_statistics_workspace_bytes(
                h.rows,
                h.hidden,
                h.vocab,
                b,
                h.bias.is_some(),
                h.input.dtype() == DType::F32,
                true,
            )
        }
        Some(b) if entropy.is_some() => fused_linear_cross_entropy_blocked_workspace_bytes(
            h.rows,
            h.hidden,
            h.vocab,
            plan.chunk_rows,
            b,
            h.bias.is_some(),
            true,
        ),
        _ => plan.workspace_bytes,
    };
    engine.check_workspace("fused_linear_cross_entropy_backward", needed)?;
    let ce = CeGrad {
        inputs: CeGradInputs {
            targets: &saved.targets,
            settings: &saved.settings,
            mat: &saved.rows_matrix,
            finish: &saved.finish,
            cot: &cot,
            per_row,
        },
        over: entropy.is_none() && plan.gradient_over_logits(h.vocab),
    };
    let grad = |logits: &Tensor, at: CeBlock| {
        let dlogits = ce.of(logits, at)?;
        if let Some((entropy, ecot)) = entropy {
            entropy_grad(logits, &dlogits, saved, entropy, ecot, at.row0)?;
        }
        Ok(dlogits)
    };
    let mut acc = Accumulator::new(h, plan)?;
    for (r0, rows) in plan.ranges() {
        let logits = h.logits(r0, rows)?;
        let dlogits = grad(&logits, CeBlock { row0: r0, col0: 0 })?;
        drop(logits);
        acc.add_chunk(h, r0, &dlogits)?;
    }
    acc.add_blocks(h, &mut |z, at| grad(z, at))?;
    Ok(acc.finish())
}

// ---- distillation --------------------------------------------------------------------------

/// The soft term of a distillation loss, between the student's and the teacher's
/// distributions at temperature T (`q = softmax(student/T)`, `p = softmax(teacher/T)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SoftLoss {
    /// Generalized JSD as `loss::jsd` on `log q` (input) and `log p` (target):
    /// `β·Σ p·(log p − log m) + (1 − β)·Σ q·(log q − log m)`, `m = β·p + (1 − β)·q`;
    /// β = 0 is the forward KL `KL(p‖q)`, β = 1 the reverse KL `KL(q‖p)`.
    Jsd {
        /// β in [0, 1].
        beta: f32,
    },
    /// Forward KL `Σ p·(log p − log q)` (`loss::kl_div` with log targets).
    Kl,
    /// Total variation `½·Σ |q − p|` (`loss::tvd`).
    Tvd,
    /// Cosine distance of the logits, `β·(1 − s·t/(|s|·|t|))` with `s`, `t` the student's and
    /// the teacher's logits of the row (divided by T, which the cosine does not see; its
    /// gradient carries the `1/T`); a row whose logits are all zero gives NaN.
    Cosine {
        /// β (finite, ≥ 0).
        beta: f32,
    },
}

/// How the distillation terms are reduced over rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DistillationReduction {
    /// Per-row losses of `x`'s leading shape (0 on rows whose label is `ignore_index`); the
    /// backward takes one cotangent per row and always recomputes the chunks.
    None,
    /// Sums over the counted rows.
    Sum,
    /// Sums divided by the number of counted rows (default; 0 when none counts).
    #[default]
    BatchMean,
}

/// Options of [`fused_linear_distillation`].
#[derive(Debug, Clone)]
pub struct DistillationOptions {
    /// The soft term (default JSD with β = 0.5).
    pub soft: SoftLoss,
    /// Temperature T > 0 dividing both heads' logits in the soft term (default 1). The hard
    /// term uses the raw student logits.
    pub temperature: f32,
    /// Weight of the hard-label cross-entropy term (default 0; needs labels when nonzero).
    pub weight_hard: f32,
    /// Weight of the soft term (default 1).
    pub weight_soft: f32,
    /// Rows whose label equals this are skipped by both terms and not counted (default −100).
    pub ignore_index: i32,
    /// Reduction over rows (default batch mean).
    pub reduction: DistillationReduction,
    /// With a hard term: read the labels back (**synchronizes**) and reject any outside
    /// `[0, vocab)` other than `ignore_index` (default true). Unchecked out-of-range labels
    /// are skipped by the hard term but counted by the soft term.
    pub check_labels: bool,
    /// Chunk size or memory budget (default: from the engine's workspace bound).
    pub chunking: Chunking,
    /// Compute the student gradients in the forward (default true; see the module docs).
    /// Ignored for reduction none, whose backward always recomputes.
    pub gradients_in_forward: bool,
}

impl Default for DistillationOptions {
    fn default() -> Self {
        DistillationOptions {
            soft: SoftLoss::Jsd { beta: 0.5 },
            temperature: 1.0,
            weight_hard: 0.0,
            weight_soft: 1.0,
            ignore_index: -100,
            reduction: DistillationReduction::BatchMean,
            check_labels: true,
            chunking: Chunking::default(),
            gradients_in_forward: true,
        }
    }
}

/// Outputs of [`fused_linear_distillation`]: F32 scalars `[]`, or per-row losses of `x`'s
/// leading shape for reduction none.
#[derive(Debug, Clone)]
pub struct DistillationOutput {
    /// `weight_hard·hard_loss + weight_soft·soft_loss`.
    pub loss: Tensor,
    /// The hard-label cross-entropy of the raw student logits, reduced (0 without a hard
    /// term).
    pub hard_loss: Tensor,
    /// The soft term, reduced.
    pub soft_loss: Tensor,
}

/// The hard term's state: settings, per-row matrix `[rows, 8]`, predictions (forward only)
/// and the scales (`[8]`: the counting pass's, then the finished sums').
#[derive(Debug, Clone)]
struct HardTerm {
    settings: CeSettings,
    mat: Tensor,
    scales: Tensor,
}

/// The soft term's state: settings, per-row matrix `[rows, 2]`, scales (`[2]`).
#[derive(Debug, Clone)]
struct SoftTerm {
    settings: DivSettings,
    mat: Tensor,
    scales: Tensor,
}

/// What [`fused_linear_distillation`] keeps for its backward.
#[derive(Debug, Clone)]
pub struct DistillationSaved {
    student: Head,
    teacher: Head,
    labels: Option<Tensor>,
    options: DistillationOptions,
    hard: Option<HardTerm>,
    soft: SoftTerm,
    plan: ChunkPlan,
    gradients: Option<FusedLinearGradients>,
}

impl DistillationSaved {
    /// The chunking used.
    pub fn plan(&self) -> ChunkPlan {
        self.plan
    }
}

/// Logit buffers `[chunk_rows, vocab]` F32 a distillation chunk holds at most at once.
const DISTILL_LOGIT_BUFFERS: u64 = 5;

/// Scratch bytes of [`fused_linear_distillation`] (forward and backward): the per-row
/// matrices of the soft term (`[rows, 2]`) and, with a hard term, of the cross-entropy
/// (`[rows, 8]` and the predictions), their column sums and finish vectors, and per chunk up
/// to five F32 `[chunk_rows, vocab]` buffers at once (student logits or their tempered copy,
/// teacher distribution, student distribution, the soft-term gradient, the hard-term
/// gradient) with the softmax statistics, plus the bias-gradient partials when the student
/// has a bias, plus the largest split-K scratch of the chunk's products
/// (`matmul::gemm_workspace_bytes` of the student and teacher logits `(chunk, vocab,
/// hidden)`, `dx` `(chunk, hidden, vocab)` and `dW` `(vocab, hidden, chunk)`; `hidden` the
/// student's, `teacher_hidden` the teacher's).
pub fn fused_linear_distillation_workspace_bytes(
    rows: usize,
    hidden: usize,
    teacher_hidden: usize,
    vocab: usize,
    chunk_rows: usize,
    hard: bool,
    bias: bool,
) -> u64 {
    let products = products_scratch(rows, chunk_rows, |r| {
        vec![
            (r, vocab, hidden),
            (r, vocab, teacher_hidden),
            (r, hidden, vocab),
            (vocab, hidden, r),
        ]
    });
    let c = chunk_rows.min(rows.max(1)) as u64;
    let mut bytes = loss::divergence_workspace_bytes(rows) + 16 + 64;
    if hard {
        bytes += loss::cross_entropy_workspace_bytes(rows) + 32 + 4 * rows as u64;
    }
    bytes
        + DISTILL_LOGIT_BUFFERS * 4 * c * vocab as u64
        + 2 * 8 * c
        + bias_scratch(c as usize, vocab, bias)
        + products
}

/// The chunking [`fused_linear_distillation`] would use (errors as [`plan_cross_entropy`]).
#[allow(clippy::too_many_arguments)]
pub fn plan_distillation(
    engine: &Engine,
    rows: usize,
    hidden: usize,
    teacher_hidden: usize,
    vocab: usize,
    hard: bool,
    bias: bool,
    chunking: &Chunking,
) -> Result<ChunkPlan> {
    for (set, name) in [
        (chunking.head_dtype_gradients, "head_dtype_gradients"),
        (chunking.block_statistics, "block_statistics"),
    ] {
        if set {
            return Err(Error::InvalidValue {
                what: format!("fused_linear_distillation: Chunking::{name}"),
                got: 1.0,
                rule: "supported by the cross-entropy heads only".into(),
            });
        }
    }
    plan(
        "fused_linear_distillation",
        engine,
        rows,
        vocab,
        chunking,
        |c| {
            fused_linear_distillation_workspace_bytes(
                rows,
                hidden,
                teacher_hidden,
                vocab,
                c,
                hard,
                bias,
            )
        },
    )
}

fn finite(what: &str, v: f32, rule: &str, ok: bool) -> Result<()> {
    if ok && v.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidValue {
            what: what.into(),
            got: f64::from(v),
            rule: rule.into(),
        })
    }
}

impl DistillationSaved {
    /// One chunk of rows `r0..r0 + rows`: with `predicted`, the rows' loss terms go into the
    /// per-row matrices (the forward); with `cot`, the student's logit gradient (times the
    /// cotangent, with the terms' current scales) is returned. With `row_cot` (reduction
    /// none: one cotangent per row of the batch) `cot` is a unit scalar and each row of the
    /// gradient is multiplied by its row's cotangent at the end.
    fn chunk(
        &self,
        r0: usize,
        rows: usize,
        predicted: Option<&Tensor>,
        cot: Option<&Tensor>,
        row_cot: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        let o = &self.options;
        let t = o.temperature;
        let labels = self.labels.as_ref();
        let student = self.student.logits(r0, rows)?;
        // The hard term, on the raw student logits.
        let mut d_hard = None;
        if let (Some(h), Some(labels)) = (&self.hard, labels) {
            if let Some(predicted) = predicted {
                loss::ce_rows_block(&student, labels, &h.settings, r0, &h.mat, Some(predicted))?;
            }
            if let Some(cot) = cot {
                let inputs = loss::CeGradInputs {
                    targets: labels,
                    settings: &h.settings,
                    mat: &h.mat,
                    finish: &h.scales,
                    cot,
                    per_row: false,
                };
                d_hard = Some(loss::ce_grad_block(
                    &student,
                    CeBlock { row0: r0, col0: 0 },
                    &inputs,
                )?);
            }
        }
        // The soft term, on both heads' logits divided by T.
        let tempered = |x: Tensor| -> Result<Tensor> {
            if t == 1.0 {
                Ok(x)
            } else {
                combine(&x, 1.0 / t, None, None)
            }
        };
        let distribution = |x: &Tensor| {
            if o.soft == SoftLoss::Tvd {
                loss::softmax(x)
            } else {
                loss::log_softmax(x)
            }
        };
        let student = tempered(student)?;
        let soft = &self.soft;
        if let SoftLoss::Cosine { beta } = o.soft {
            let teacher = tempered(self.teacher.logits(r0, rows)?)?;
            if predicted.is_some() {
                cosine_rows(&student, &teacher, &soft.mat, r0, beta)?;
            }
            let Some(cot) = cot else {
                return Ok(None);
            };
            let d_soft = cosine_grad(&student, &teacher, &soft.mat, &soft.scales, cot, r0, beta)?;
            drop((student, teacher));
            return self
                .combine_terms(d_hard.as_ref(), &d_soft, r0, row_cot)
                .map(Some);
        }
        let (q, q_saved) = distribution(&student)?;
        drop(student);
        let teacher = tempered(self.teacher.logits(r0, rows)?)?;
        let (p, _) = distribution(&teacher)?;
        drop(teacher);
        if predicted.is_some() {
            loss::div_rows_block(&q, &p, labels, &soft.settings, r0, &soft.mat)?;
        }
        let Some(cot) = cot else {
            return Ok(None);
        };
        let g = loss::div_grad_block(
            &q,
            &p,
            labels,
            &soft.settings,
            r0,
            &soft.scales,
            cot,
            false,
            DType::F32,
        )?;
        drop((q, p));
        let d_soft = loss::softmax_backward(&q_saved, &g)?;
        drop((g, q_saved));
        self.combine_terms(d_hard.as_ref(), &d_soft, r0, row_cot)
            .map(Some)
    }

    /// d/d student = w_hard·d_hard + (w_soft / T)·d_soft (then the per-row cotangents).
    fn combine_terms(
        &self,
        d_hard: Option<&Tensor>,
        d_soft: &Tensor,
        r0: usize,
        row_cot: Option<&Tensor>,
    ) -> Result<Tensor> {
        let o = &self.options;
        let w_soft = o.weight_soft / o.temperature;
        let scale = match row_cot {
            Some(values) => Scale::Rows {
                values,
                row0: r0,
                cols: self.student.vocab,
            },
            None => Scale::One,
        };
        match d_hard {
            Some(dh) => combine_scaled(dh, o.weight_hard, Some((d_soft, w_soft)), scale),
            None => combine_scaled(d_soft, w_soft, None, scale),
        }
    }
}

/// Knowledge distillation through two linear heads, chunk by chunk: with
/// `q = softmax(student/T)`, `p = softmax(teacher/T)` (T the temperature, student and
/// teacher the heads' logits `x·Wᵀ + b`),
///
/// `loss = w_hard·CE(student, labels) + w_soft·D(q, p)`,
///
/// D the soft term of [`SoftLoss`] summed over the vocabulary, both terms summed over the
/// counted rows (label ≠ `ignore_index`; every row without labels) and divided by their
/// number for batch mean; for reduction none, every output is per row:
/// `loss_r = w_hard·CE_r + w_soft·D_r` (0 on uncounted rows), with one cotangent per row in
/// the backward. The teacher is frozen: only the student gets gradients. Student and
/// teacher may have different hidden sizes and dtypes, not different rows or vocabularies.
/// `soft = Tvd` with labels and `weight_hard > 0` is the "CE + TVD" loss.
///
/// The gradients are computed here (see the module docs); the backward is
/// [`fused_linear_distillation_backward`]. Errors: those of
/// [`fused_linear_cross_entropy`] for each head and the labels, a teacher whose rows or
/// vocabulary differ (`ShapeMismatch`), a temperature not > 0, β outside [0, 1], non-finite
/// weights, `weight_hard ≠ 0` without labels (`InvalidValue`).
pub fn fused_linear_distillation(
    student: LinearHead,
    teacher: LinearHead,
    labels: Option<&Tensor>,
    options: &DistillationOptions,
) -> Result<(DistillationOutput, DistillationSaved)> {
    const WHAT: &str = "fused_linear_distillation";
    let engine = student.input.engine();
    let s = check_head(&format!("{WHAT}: student"), engine, &student)?
        .with_chunking(&options.chunking)?;
    let t = check_head(&format!("{WHAT}: teacher"), engine, &teacher)?
        .with_chunking(&options.chunking)?;
    if t.lead() != s.lead() {
        return Err(Error::shape(
            format!("{WHAT}: teacher input rows"),
            s.lead(),
            t.lead(),
        ));
    }
    if t.vocab != s.vocab {
        return Err(Error::shape(
            format!("{WHAT}: teacher weight (vocab × hidden)"),
            &[s.vocab, t.hidden],
            t.weight.shape(),
        ));
    }
    if let Some(l) = labels {
        loss::check_target_tensor(&format!("{WHAT}: labels"), engine, l, s.lead())?;
    }
    let o = options;
    finite(
        &format!("{WHAT}: temperature"),
        o.temperature,
        "must be finite and > 0",
        o.temperature > 0.0,
    )?;
    finite(
        &format!("{WHAT}: weight_hard"),
        o.weight_hard,
        "must be finite",
        true,
    )?;
    finite(
        &format!("{WHAT}: weight_soft"),
        o.weight_soft,
        "must be finite",
        true,
    )?;
    if let SoftLoss::Jsd { beta } = o.soft {
        finite(
            &format!("{WHAT}: beta"),
            beta,
            "must be in [0, 1]",
            (0.0..=1.0).contains(&beta),
        )?;
    }
    if let SoftLoss::Cosine { beta } = o.soft {
        finite(&format!("{WHAT}: beta"), beta, "must be ≥ 0", beta >= 0.0)?;
    }
    let with_hard = o.weight_hard != 0.0;
    if with_hard && labels.is_none() {
        return Err(Error::InvalidValue {
            what: format!("{WHAT}: weight_hard"),
            got: f64::from(o.weight_hard),
            rule: "a hard-label term needs labels (or weight_hard = 0)".into(),
        });
    }
    let plan = plan_distillation(
        engine,
        s.rows,
        s.hidden,
        t.hidden,
        s.vocab,
        with_hard,
        s.bias.is_some(),
        &o.chunking,
    )?;
    if let (true, true, Some(l)) = (with_hard, o.check_labels, labels) {
        loss::check_target_range(&format!("{WHAT}: labels"), l, o.ignore_index, s.vocab)?;
    }
    let batch_mean = o.reduction == DistillationReduction::BatchMean;
    let per_row = o.reduction == DistillationReduction::None;
    let (rows, vocab) = (s.rows, s.vocab);
    // Outputs and per-row state, all allocated before anything is launched.
    let hard = if with_hard {
        let options = CrossEntropyOptions {
            ignore_index: o.ignore_index,
            reduction: if batch_mean {
                Reduction::Mean
            } else {
                Reduction::Sum
            },
            check_targets: false,
            ..CrossEntropyOptions::default()
        };
        Some(HardTerm {
            settings: loss::ce_settings(WHAT, engine, &options, vocab)?,
            mat: Tensor::empty(engine, &[rows, 8], DType::F32, "distillation hard rows")?,
            scales: unit_ce_scales(engine)?,
        })
    } else {
        None
    };
    let predicted = Tensor::empty(engine, &[rows], DType::I32, "distillation predicted")?;
    let (mode, beta) = match o.soft {
        SoftLoss::Kl => (0, 0.0),
        SoftLoss::Jsd { beta } => (1, beta),
        SoftLoss::Tvd => (2, 0.0),
        // The cosine term has kernels of its own; the divergence settings serve its row
        // counting and finish (which do not depend on the mode).
        SoftLoss::Cosine { beta } => (2, beta),
    };
    let soft = SoftTerm {
        settings: DivSettings::new(
            mode,
            o.soft == SoftLoss::Kl,
            labels.is_some(),
            o.ignore_index,
            beta,
            if batch_mean {
                DivReduction::BatchMean
            } else {
                DivReduction::Sum
            },
        ),
        mat: Tensor::empty(engine, &[rows, 2], DType::F32, "distillation soft rows")?,
        scales: Tensor::from_slice(engine, &[0.0f32, 1.0], &[2])?,
    };
    let mut acc = if o.gradients_in_forward && !per_row {
        Some(Accumulator::new(&s, &plan)?)
    } else {
        None
    };
    let unit = Tensor::from_slice(engine, &[1.0f32], &[1])?;
    let lead = s.lead().to_vec();
    let mut saved = DistillationSaved {
        student: s,
        teacher: t,
        labels: labels.cloned(),
        options: o.clone(),
        hard,
        soft,
        plan,
        gradients: None,
    };
    // Counting passes: the batch-mean scales before any chunk's gradient.
    if acc.is_some() && batch_mean {
        if let (Some(h), Some(l)) = (saved.hard.as_mut(), labels) {
            loss::ce_count(l, &h.settings, vocab, &h.mat)?;
            h.scales = loss::ce_finish_values(engine, &h.mat, &h.settings)?;
        }
        let soft = &mut saved.soft;
        loss::div_count(engine, labels, rows, &soft.settings, &soft.mat)?;
        soft.scales = loss::div_finish_values(engine, &soft.mat, &soft.settings, vocab)?;
    }
    if matches!(o.soft, SoftLoss::Cosine { .. }) && !(acc.is_some() && batch_mean) {
        // The cosine kernels read each row's counting flag (column 1) from the matrix.
        loss::div_count(engine, labels, rows, &saved.soft.settings, &saved.soft.mat)?;
    }
    for (r0, n) in saved.plan.ranges() {
        let cot = acc.as_ref().map(|_| &unit);
        let dlogits = saved.chunk(r0, n, Some(&predicted), cot, None)?;
        if let (Some(acc), Some(d)) = (acc.as_mut(), dlogits) {
            acc.add_chunk(&saved.student, r0, &d)?;
        }
    }
    if per_row {
        // Per-row outputs; the unit scales of sum serve the backward.
        let soft_loss = take_column(&saved.soft.mat, 0, &lead)?;
        let hard_loss = match &saved.hard {
            Some(h) => loss::ce_outputs(engine, &h.mat, &h.scales, Reduction::None, &lead)?.loss,
            None => Tensor::zeros(engine, &lead, DType::F32)?,
        };
        let total = combine(
            &soft_loss,
            o.weight_soft,
            Some((&hard_loss, o.weight_hard)),
            None,
        )?;
        return Ok((
            DistillationOutput {
                loss: total,
                hard_loss,
                soft_loss,
            },
            saved,
        ));
    }
    // Finish both terms; their scales (the same values as the counts') serve the backward.
    let soft = &mut saved.soft;
    soft.scales = loss::div_finish_values(engine, &soft.mat, &soft.settings, vocab)?;
    let soft_loss = loss::slice_scalar(engine, &soft.scales, 0)?;
    let hard_loss = match saved.hard.as_mut() {
        Some(h) => {
            h.scales = loss::ce_finish_values(engine, &h.mat, &h.settings)?;
            loss::slice_scalar(engine, &h.scales, 0)?
        }
        None => Tensor::zeros(engine, &[], DType::F32)?,
    };
    let total = combine(
        &soft_loss,
        o.weight_soft,
        Some((&hard_loss, o.weight_hard)),
        None,
    )?;
    saved.gradients = acc.map(Accumulator::finish);
    Ok((
        DistillationOutput {
            loss: total,
            hard_loss,
            soft_loss,
        },
        saved,
    ))
}

/// Student gradients of [`fused_linear_distillation`] (F32) for `cotangent`: for sum and
/// batch mean a scalar (`[]`/`[1]` F32; `None` = 1), the saved gradients times the cotangent
/// (on the GPU), or, with `gradients_in_forward: false`, recomputed chunk by chunk; for
/// reduction none one value per row (F32 of `x`'s leading shape; `None` = all ones), each
/// chunk recomputed and each row's logit gradient multiplied by its cotangent. Errors: a
/// cotangent that is not F32 (`UnsupportedDType`), not of the loss's shape
/// (`ShapeMismatch`), of another engine (`EngineMismatch`); scratch over the workspace bound
/// (`WorkspaceExceeded`).
pub fn fused_linear_distillation_backward(
    saved: &DistillationSaved,
    cotangent: Option<&Tensor>,
) -> Result<FusedLinearGradients> {
    let engine = saved.student.input.engine();
    const WHAT: &str = "fused_linear_distillation_backward: cotangent";
    let per_row = saved.options.reduction == DistillationReduction::None;
    let (cot, row_cot) = if per_row {
        let unit = Tensor::from_slice(engine, &[1.0f32], &[1])?;
        let rows = match cotangent {
            Some(c) => {
                loss::ce_cotangent(WHAT, engine, Some(c), Reduction::None, saved.student.lead())?;
                c.clone()
            }
            None => Tensor::from_slice(
                engine,
                &vec![1.0f32; saved.student.rows],
                saved.student.lead(),
            )?,
        };
        (unit, Some(rows))
    } else {
        (scalar_cotangent(WHAT, engine, cotangent)?, None)
    };
    if let Some(g) = &saved.gradients {
        return scaled(g, cotangent.map(|_| &cot));
    }
    engine.check_workspace(
        "fused_linear_distillation_backward",
        saved.plan.workspace_bytes,
    )?;
    let mut acc = Accumulator::new(&saved.student, &saved.plan)?;
    for (r0, rows) in saved.plan.ranges() {
        let d = saved
            .chunk(r0, rows, None, Some(&cot), row_cot.as_ref())?
            .expect("gradients requested");
        acc.add_chunk(&saved.student, r0, &d)?;
    }
    Ok(acc.finish())
}

/// [`fused_linear_distillation`] with `options` but the soft term `soft`.
fn distillation_with(
    soft: SoftLoss,
    student: LinearHead,
    teacher: LinearHead,
    labels: Option<&Tensor>,
    options: &DistillationOptions,
) -> Result<(DistillationOutput, DistillationSaved)> {
    let options = DistillationOptions {
        soft,
        ..options.clone()
    };
    fused_linear_distillation(student, teacher, labels, &options)
}

/// [`fused_linear_distillation`] with the generalized JSD soft term of weight `beta` (Liger's
/// fused linear JSD when `weight_hard = 0`).
pub fn fused_linear_jsd(
    student: LinearHead,
    teacher: LinearHead,
    labels: Option<&Tensor>,
    beta: f32,
    options: &DistillationOptions,
) -> Result<(DistillationOutput, DistillationSaved)> {
    distillation_with(SoftLoss::Jsd { beta }, student, teacher, labels, options)
}

/// [`fused_linear_distillation`] with the cosine soft term `β·(1 − cos(student, teacher))`
/// of the logits (Liger's fused linear cosine-similarity loss).
pub fn fused_linear_cosine(
    student: LinearHead,
    teacher: LinearHead,
    labels: Option<&Tensor>,
    beta: f32,
    options: &DistillationOptions,
) -> Result<(DistillationOutput, DistillationSaved)> {
    distillation_with(SoftLoss::Cosine { beta }, student, teacher, labels, options)
}

/// [`fused_linear_distillation`] with the forward-KL soft term `KL(p_teacher ‖ q_student)`.
pub fn fused_linear_kl(
    student: LinearHead,
    teacher: LinearHead,
    labels: Option<&Tensor>,
    options: &DistillationOptions,
) -> Result<(DistillationOutput, DistillationSaved)> {
    distillation_with(SoftLoss::Kl, student, teacher, labels, options)
}

/// [`fused_linear_distillation`] with the total-variation soft term; with labels and
/// `weight_hard > 0` this is the fused CE + TVD distillation loss.
pub fn fused_linear_tvd(
    student: LinearHead,
    teacher: LinearHead,
    labels: Option<&Tensor>,
    options: &DistillationOptions,
) -> Result<(DistillationOutput, DistillationSaved)> {
    distillation_with(SoftLoss::Tvd, student, teacher, labels, options)
}
