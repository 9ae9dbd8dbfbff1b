//! GRPO token loss: the clipped policy-gradient objective of group relative policy optimization
//! on policy logits, with an optional KL penalty to a reference policy and the loss
//! normalizations of GRPO, BNPO, DAPO and Dr. GRPO; forward and backward.
//!
//! # Contract
//!
//! Inputs ([`GrpoInputs`]): policy `logits [B, P, V]` (F32, F16 or BF16) with `P = L` or
//! `P = L + 1` (the last position, which predicts past the completion, is then unused and gets
//! a zero gradient); `completion_ids [B, L]` (I32); `advantages [B]` (F32); optionally
//! `old_logp` and `ref_logp [B, L]` (F32) and a `mask [B, L]` (I32 or U32, nonzero = counted).
//! For token `(b, t)` with `z = logits[b, t, :] / T`:
//!
//! * `logp = z[id] − logsumexp(z)`;
//! * `c1 = exp(logp − old)` (`old = old_logp[b, t]`, or `logp` itself held constant when no old
//!   log-probabilities are given: `c1 = 1`, `d c1 / d logp = 1`);
//! * `c2 = clamp(c1, 1 − eps_low, 1 + eps_high)`;
//! * `loss_t = −min(c1·A_b, c2·A_b) + β·kl_t`, `kl_t = exp(ref − logp) − (ref − logp) − 1` (the
//!   k3 estimator; only with `ref_logp`, which `β > 0` requires);
//! * `clipped_t = 1` when the clipped term is the strictly smaller one.
//!
//! Masked tokens have `loss_t = kl_t = clipped_t = 0` and no gradient. The loss
//! ([`GrpoLossType`]) with `m` the mask:
//! * `Grpo`: `(1/B) Σ_b (Σ_t m·loss_t) / max(Σ_t m, 1)`;
//! * `Bnpo` and `Dapo` (on one device the same): `Σ m·loss_t / max(Σ m, 1)`;
//! * `DrGrpo`: `Σ m·loss_t / (B · max_completion_length)`.
//!
//! Backward ([`grpo_loss_backward`]): `d logits[b, t, j] = d_loss · w_t · (d loss_t / d logp) ·
//! (1[j = id] − softmax(z)_j) / T`, `d loss_t / d logp = −A_b·c1` when `c1·A_b ≤ c2·A_b` (else
//! 0, the clipped term being constant) `+ β·(1 − exp(ref − logp))`, with `w_t` the token's
//! weight in the loss above. Exactly zero for masked tokens (and for every token when the
//! factor is 0). Advantages, old and reference log-probabilities are constants (no gradient).
//!
//! # How it runs
//!
//! One workgroup of 256 lanes per token computes the row's maximum and log-sum in one read of
//! the row (a running maximum and rescaled sum per lane, merged in a fixed-order tree; rows of
//! whole 16-byte chunks, `V` a multiple of 4 for F32 logits or of 8 for 16-bit ones, are read
//! 16 bytes a lane, other rows element by element), the token's terms and its loss
//! derivative; one workgroup then forms the loss and every token's weight in a fixed order
//! (per sequence, then sequences in order for GRPO); the backward recomputes each row's
//! probabilities from the saved statistics. No atomics: reruns are bit-identical. Saved state
//! is `32·B·L + 4·B·L` bytes besides the inputs. All math is FP32; the loss and per-token
//! outputs are F32, the gradient F32 (or F16/BF16 through [`grpo_loss_backward_as`], stored
//! directly for 16-bit logits in rows of whole chunks).
//!
//! # On a fused linear head
//!
//! [`fused_linear_grpo_loss`] takes the hidden states `x [B, L, H]` and the head `W [V, H]`
//! (and bias) instead of the logits: the per-token log-probabilities come from
//! the head's cross-entropy (reduction none, the temperature, rows in chunks), so `[B·L, V]`
//! logits never exist; the token terms and the loss are the same kernels' (the
//! log-probability read from `−ce`). The gradients are formed in the forward, three head
//! products a chunk: a token's weight in the loss depends on the mask alone, and
//! `d loss_t / d logp` on its own log-probability, so the cotangent of each token's
//! cross-entropy (`−weight · d loss_t / d logp` for a unit `d_loss`) exists as soon as its
//! chunk's statistics do, and the chunk's logit gradient takes it at once into `dx`, `dW`,
//! `dbias` (F32, accumulated over chunks in order). [`fused_linear_grpo_loss_backward`]
//! multiplies them by `d_loss`. The saved context holds those gradients (`dW` is `4·V·H`
//! bytes) between the two calls.
//!
//! # Out-of-range ids
//!
//! With [`GrpoOptions::check_ids`] (the default) the forward reads the ids back and rejects one
//! outside `[0, V)` (**this synchronizes**); without the check such a token counts as masked.

use crate::fused_linear::{
    self, Chunking, FusedLinearCrossEntropyOptions, FusedLinearCrossEntropySaved,
    FusedLinearGradients, LinearHead,
};
use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::loss::{CrossEntropyOptions, Reduction};
use crate::{DType, Error, Result, Tensor};

/// `wgsl/grpo.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "grpo",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        "const WG: u32 = 256u;",
        include_str!("../wgsl/grpo.wgsl"),
    ],
};

/// How the per-token losses are normalized (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpoLossType {
    /// Mean over sequences of each sequence's mean over its counted tokens.
    Grpo,
    /// Mean over every counted token of the batch.
    Bnpo,
    /// Mean over every counted token (DAPO normalizes by the tokens of the whole global batch;
    /// on one device that is `Bnpo`).
    Dapo,
    /// Sum over counted tokens divided by `B · max_completion_length`.
    DrGrpo {
        /// The normalizing completion length (≥ 1).
        max_completion_length: usize,
    },
}

/// Options of [`grpo_loss`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrpoOptions {
    /// Sampling temperature `T` the logits are divided by (finite, > 0; default 1).
    pub temperature: f64,
    /// KL coefficient `β` (finite, ≥ 0; default 0; > 0 needs `ref_logp`).
    pub beta: f64,
    /// Lower clip `eps_low` (in [0, 1); default 0.2).
    pub eps_low: f64,
    /// Upper clip `eps_high` (finite, ≥ 0; default 0.2).
    pub eps_high: f64,
    /// Loss normalization (default [`GrpoLossType::Dapo`]).
    pub loss_type: GrpoLossType,
    /// Read the ids back and reject out-of-range ones (default true; synchronizes).
    pub check_ids: bool,
}

impl Default for GrpoOptions {
    fn default() -> Self {
        GrpoOptions {
            temperature: 1.0,
            beta: 0.0,
            eps_low: 0.2,
            eps_high: 0.2,
            loss_type: GrpoLossType::Dapo,
            check_ids: true,
        }
    }
}

/// The tensors of [`grpo_loss`] (shapes in the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct GrpoInputs<'a> {
    /// Policy logits `[B, L, V]` or `[B, L + 1, V]`.
    pub logits: &'a Tensor,
    /// Completion token ids `[B, L]`, I32.
    pub completion_ids: &'a Tensor,
    /// One advantage per sequence `[B]`, F32.
    pub advantages: &'a Tensor,
    /// Log-probabilities of the policy that sampled the completions `[B, L]`, F32.
    pub old_logp: Option<&'a Tensor>,
    /// Log-probabilities of the reference policy `[B, L]`, F32.
    pub ref_logp: Option<&'a Tensor>,
    /// Completion mask `[B, L]`, I32 or U32, nonzero = counted.
    pub mask: Option<&'a Tensor>,
}

/// The per-token inputs of [`fused_linear_grpo_loss`] (those of [`GrpoInputs`] without the
/// logits).
#[derive(Debug, Clone, Copy)]
pub struct GrpoTokens<'a> {
    /// Completion token ids `[B, L]`, I32.
    pub completion_ids: &'a Tensor,
    /// One advantage per sequence `[B]`, F32.
    pub advantages: &'a Tensor,
    /// Log-probabilities of the policy that sampled the completions `[B, L]`, F32.
    pub old_logp: Option<&'a Tensor>,
    /// Log-probabilities of the reference policy `[B, L]`, F32.
    pub ref_logp: Option<&'a Tensor>,
    /// Completion mask `[B, L]`, I32 or U32, nonzero = counted.
    pub mask: Option<&'a Tensor>,
}

impl<'a> GrpoInputs<'a> {
    /// The per-token inputs.
    pub fn tokens(&self) -> GrpoTokens<'a> {
        GrpoTokens {
            completion_ids: self.completion_ids,
            advantages: self.advantages,
            old_logp: self.old_logp,
            ref_logp: self.ref_logp,
            mask: self.mask,
        }
    }
}

/// Outputs of [`grpo_loss`], all F32 except `clipped`.
#[derive(Debug, Clone)]
pub struct GrpoOutput {
    /// The loss, `[1]`.
    pub loss: Tensor,
    /// `loss_t` per token `[B, L]` (0 where masked).
    pub per_token: Tensor,
    /// The KL estimate per token `[B, L]` (0 without `ref_logp` or where masked).
    pub kl: Tensor,
    /// 1 where the clipped term was the active one, U32 `[B, L]`.
    pub clipped: Tensor,
}

/// What [`grpo_loss_backward`] needs: the logits, ids, per-token statistics and weights.
#[derive(Debug, Clone)]
pub struct GrpoSaved {
    logits: Tensor,
    ids: Tensor,
    stats: Tensor,
    weights: Tensor,
    params: Params,
}

#[derive(encase::ShaderType, Debug, Clone, Copy)]
struct Params {
    rows: u32,
    seq: u32,
    batch: u32,
    positions: u32,
    vocab: u32,
    temperature: f32,
    beta: f32,
    eps_low: f32,
    eps_high: f32,
    has_old: u32,
    has_ref: u32,
    has_mask: u32,
    loss_type: u32,
    max_len: u32,
    row0: u32,
    row_count: u32,
}

fn invalid(what: &str, got: f64, rule: &str) -> Error {
    Error::InvalidValue {
        what: format!("grpo_loss: {what}"),
        got,
        rule: rule.to_string(),
    }
}

/// Validates the token inputs and options for `batch` sequences of `seq` tokens, logits rows
/// of `vocab` classes (`positions` per sequence); the launch parameters.
fn plan(
    engine: &crate::Engine,
    tokens: &GrpoTokens,
    (batch, seq, positions, vocab): (usize, usize, usize, usize),
    options: &GrpoOptions,
) -> Result<Params> {
    let rows = [batch, seq];
    let check = |t: &Tensor, what: &str, shape: &[usize], dtypes: &[DType]| {
        t.check(engine, &format!("grpo_loss: {what}"), shape, dtypes)
    };
    check(
        tokens.completion_ids,
        "completion_ids",
        &rows,
        &[DType::I32],
    )?;
    check(tokens.advantages, "advantages", &[batch], &[DType::F32])?;
    for (t, what) in [(tokens.old_logp, "old_logp"), (tokens.ref_logp, "ref_logp")] {
        if let Some(t) = t {
            check(t, what, &rows, &[DType::F32])?;
        }
    }
    if let Some(m) = tokens.mask {
        check(m, "mask", &rows, &[DType::I32, DType::U32])?;
    }
    if positions != seq && positions != seq + 1 {
        return Err(Error::shape(
            "grpo_loss: logits positions (L or L + 1)",
            &[batch, seq, vocab],
            &[batch, positions, vocab],
        ));
    }
    let o = options;
    if !(o.temperature.is_finite() && o.temperature > 0.0) {
        return Err(invalid("temperature", o.temperature, "finite and > 0"));
    }
    if !(o.beta.is_finite() && o.beta >= 0.0) {
        return Err(invalid("beta", o.beta, "finite and ≥ 0"));
    }
    if o.beta > 0.0 && tokens.ref_logp.is_none() {
        return Err(invalid("beta", o.beta, "β > 0 needs ref_logp"));
    }
    if !(0.0..1.0).contains(&o.eps_low) {
        return Err(invalid("eps_low", o.eps_low, "in [0, 1)"));
    }
    if !(o.eps_high.is_finite() && o.eps_high >= 0.0) {
        return Err(invalid("eps_high", o.eps_high, "finite and ≥ 0"));
    }
    let (loss_type, max_len) = match o.loss_type {
        GrpoLossType::Grpo => (0, 0),
        GrpoLossType::Bnpo | GrpoLossType::Dapo => (1, 0),
        GrpoLossType::DrGrpo {
            max_completion_length: 0,
        } => return Err(invalid("max_completion_length", 0.0, "at least 1")),
        GrpoLossType::DrGrpo {
            max_completion_length,
        } => (2, max_completion_length),
    };
    if o.check_ids && !tokens.completion_ids.is_empty() {
        let ids = tokens.completion_ids.to_vec::<i32>()?;
        if let Some((i, &v)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &v)| v < 0 || v as usize >= vocab)
        {
            let what = format!("grpo_loss: completion_ids[{i}]");
            if v < 0 {
                return Err(Error::InvalidValue {
                    what,
                    got: f64::from(v),
                    rule: format!("must be in [0, {vocab})"),
                });
            }
            return Err(Error::OutOfBounds {
                what,
                got: v as u64,
                min: 0,
                max: vocab.saturating_sub(1) as u64,
            });
        }
    }
    let u = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| Error::OutOfBounds {
            what: format!("grpo_loss: {what}"),
            got: v as u64,
            min: 0,
            max: u64::from(u32::MAX),
        })
    };
    Ok(Params {
        rows: u(batch * seq, "B·L")?,
        seq: u(seq, "L")?,
        batch: u(batch, "B")?,
        positions: u(positions, "positions")?,
        vocab: u(vocab, "V")?,
        temperature: o.temperature as f32,
        beta: if tokens.ref_logp.is_some() {
            o.beta as f32
        } else {
            0.0
        },
        eps_low: o.eps_low as f32,
        eps_high: o.eps_high as f32,
        has_old: u32::from(tokens.old_logp.is_some()),
        has_ref: u32::from(tokens.ref_logp.is_some()),
        has_mask: u32::from(tokens.mask.is_some()),
        loss_type,
        max_len: u(max_len, "max_completion_length")?,
        row0: 0,
        row_count: 0,
    })
}

/// The loss and per-token outputs from the token statistics (one workgroup), and the weights.
fn reduce(stats: &Tensor, params: &Params) -> Result<(GrpoOutput, Tensor)> {
    let engine = stats.engine();
    let (batch, seq) = (params.batch as usize, params.seq as usize);
    let loss = Tensor::empty(engine, &[1], DType::F32, "grpo loss")?;
    let weights = Tensor::empty(engine, &[(batch * seq).max(1)], DType::F32, "grpo weights")?;
    let per_token = Tensor::empty(engine, &[batch, seq], DType::F32, "grpo per-token loss")?;
    let kl = Tensor::empty(engine, &[batch, seq], DType::F32, "grpo kl")?;
    let clipped = Tensor::empty(engine, &[batch, seq], DType::U32, "grpo clipped")?;
    engine.launch(
        &KERNEL,
        "grpo_reduce",
        &vec![("DT", 0.0)],
        params,
        &[
            stats.buffer(),
            loss.buffer(),
            weights.buffer(),
            per_token.buffer(),
            kl.buffer(),
            clipped.buffer(),
        ],
        1,
    )?;
    let out = GrpoOutput {
        loss,
        per_token,
        kl,
        clipped,
    };
    Ok((out, weights))
}

/// Forward: the loss, per-token losses, KL estimates and clip flags, and what the backward
/// needs.
///
/// Errors: logits not float or not rank 3, ids not I32 `[B, L]` with `P ∈ {L, L + 1}`,
/// advantages not F32 `[B]`, old/ref log-probabilities not F32 `[B, L]`, a mask not I32/U32
/// `[B, L]` (`UnsupportedDType` / `ShapeMismatch`); tensors of other engines
/// (`EngineMismatch`); a temperature that is not finite and positive, `β` negative or not
/// finite, `β > 0` without `ref_logp`, `eps_low` outside [0, 1), `eps_high` negative or not
/// finite, a `max_completion_length` of 0 (`InvalidValue`); with `check_ids`, an id outside
/// `[0, V)` (`OutOfBounds`, negative: `InvalidValue`).
pub fn grpo_loss(inputs: &GrpoInputs, options: &GrpoOptions) -> Result<(GrpoOutput, GrpoSaved)> {
    let logits = inputs.logits;
    let engine = logits.engine();
    if !logits.dtype().is_float() {
        return Err(Error::dtype(
            "grpo_loss: logits",
            logits.dtype(),
            &DType::FLOATS,
        ));
    }
    let &[batch, positions, vocab] = logits.shape() else {
        return Err(Error::shape(
            "grpo_loss: logits [B, L or L + 1, V]",
            &[0, 0, 0],
            logits.shape(),
        ));
    };
    let seq = inputs.completion_ids.shape().get(1).copied().unwrap_or(0);
    let tokens = inputs.tokens();
    let params = plan(engine, &tokens, (batch, seq, positions, vocab), options)?;
    let rows = batch * seq;
    let constants = vec![("DT", f64::from(logits.dtype().code()))];
    let stats = Tensor::empty(engine, &[rows.max(1), 8], DType::F32, "grpo stats")?;
    let per_token = token_buffers(&tokens, &stats);
    if chunked(logits.dtype(), vocab) {
        let mut buffers = per_token.to_vec();
        buffers.push(logits.buffer());
        engine.launch(
            &KERNEL,
            "grpo_rows_v",
            &constants,
            &params,
            &buffers,
            rows as u64,
        )?;
    } else {
        let mut buffers = vec![logits.buffer()];
        buffers.extend(per_token);
        engine.launch(
            &KERNEL,
            "grpo_rows",
            &constants,
            &params,
            &buffers,
            rows as u64,
        )?;
    }
    let (output, weights) = reduce(&stats, &params)?;
    let saved = GrpoSaved {
        logits: logits.clone(),
        ids: inputs.completion_ids.clone(),
        stats,
        weights,
        params,
    };
    Ok((output, saved))
}

/// What [`fused_linear_grpo_loss_backward`] needs: the head's saved context with the
/// gradients its forward computed for a unit cotangent.
#[derive(Debug, Clone)]
pub struct FusedGrpoSaved {
    head: FusedLinearCrossEntropySaved,
}

/// The GRPO token loss on a fused linear head: `x [B, L, H]` (the hidden states of the
/// completion tokens' predicting positions), `W [V, H]`, optional bias, so the policy logits
/// `(x·Wᵀ + b)/T` never exist as `[B·L, V]`: the per-token log-probabilities come from
/// [`fused_linear::fused_linear_cross_entropy`] with reduction none and the temperature
/// (chunked by `chunking`), then the same token terms and normalization as [`grpo_loss`].
/// Outputs as [`grpo_loss`]. The head's gradients are computed here too (three products a
/// chunk; see the module documentation), so the forward costs what a forward and backward
/// cost, and the saved context holds `dx`, `dW`, `dbias` (F32) until the backward.
///
/// Errors: those of [`grpo_loss`] for the tokens and options; `x` not of rank 3 `[B, L, H]`
/// with ids `[B, L]` (`ShapeMismatch`); those of the fused head.
pub fn fused_linear_grpo_loss(
    head: LinearHead,
    tokens: &GrpoTokens,
    options: &GrpoOptions,
    chunking: Chunking,
) -> Result<(GrpoOutput, FusedGrpoSaved)> {
    let x = head.input;
    let engine = x.engine();
    let &[batch, seq, _] = x.shape() else {
        return Err(Error::shape(
            "fused_linear_grpo_loss: x [B, L, H]",
            &[0, 0, 0],
            x.shape(),
        ));
    };
    let vocab = head.weight.shape().first().copied().unwrap_or(0);
    let params = plan(engine, tokens, (batch, seq, seq, vocab), options)?;
    let head_options = FusedLinearCrossEntropyOptions {
        cross_entropy: CrossEntropyOptions {
            // Every id counts in the head (the mask applies in the token terms); ids out of
            // range (unchecked) give 0 there and count as masked here.
            ignore_index: i32::MIN,
            reduction: Reduction::None,
            check_targets: false,
            // The head's predictions are not used.
            predicted: false,
            ..CrossEntropyOptions::default()
        },
        chunking,
        gradients_in_forward: false,
        temperature: options.temperature as f32,
        ..FusedLinearCrossEntropyOptions::default()
    };
    let rows = batch * seq;
    let stats = Tensor::empty(engine, &[rows.max(1), 8], DType::F32, "grpo stats")?;
    let per_token = token_buffers(tokens, &stats);
    // The weights depend on the counted flags alone: they exist before the head runs.
    engine.launch(
        &KERNEL,
        "grpo_counted",
        &vec![("DT", 0.0)],
        &params,
        &[per_token[0], per_token[4], stats.buffer()],
        (rows as u64).div_ceil(256),
    )?;
    let (_, weights) = reduce(&stats, &params)?;
    let cotangent = Tensor::empty(engine, &[rows.max(1)], DType::F32, "grpo head cotangent")?;
    let mut fill = |r0: usize, count: usize, head_rows: &Tensor| -> Result<()> {
        let chunk = Params {
            row0: r0 as u32,
            row_count: count as u32,
            ..params
        };
        let mut terms = per_token.to_vec();
        terms.push(head_rows.buffer());
        let cotangents = [stats.buffer(), weights.buffer(), cotangent.buffer()];
        for (entry, buffers) in [("grpo_chunk", &terms[..]), ("grpo_cotangent", &cotangents)] {
            engine.launch(
                &KERNEL,
                entry,
                &vec![("DT", 0.0)],
                &chunk,
                buffers,
                (count as u64).div_ceil(256),
            )?;
        }
        Ok(())
    };
    let (_, head_saved) = fused_linear::fused_linear_cross_entropy_rows(
        head,
        tokens.completion_ids,
        &head_options,
        fused_linear::RowCotangents {
            cotangent: &cotangent,
            fill: &mut fill,
        },
    )?;
    let (output, _) = reduce(&stats, &params)?;
    let saved = FusedGrpoSaved { head: head_saved };
    Ok((output, saved))
}

/// Backward of [`fused_linear_grpo_loss`]: `dx`, `dW`, `dbias` (F32) from the loss cotangent
/// `d_loss` (`[1]` F32; `None`: 1): the gradients the forward computed for a unit cotangent,
/// times `d_loss`. With `None` the saved gradients themselves are returned (tensors shared
/// with the context, no copy and no new memory, as the fused cross-entropy's backward does);
/// with a cotangent, fresh scaled tensors.
///
/// Errors: `d_loss` not F32 `[1]` or of another engine.
pub fn fused_linear_grpo_loss_backward(
    saved: &FusedGrpoSaved,
    d_loss: Option<&Tensor>,
) -> Result<FusedLinearGradients> {
    let engine = saved.head.engine();
    let what = "fused_linear_grpo_loss_backward: d_loss";
    let d_loss = d_loss
        .map(|d| Tensor::scalar_cotangent(engine, Some(d), what))
        .transpose()?;
    fused_linear::scaled_gradients(&saved.head, d_loss.as_ref())
}

/// The per-token bindings of the token passes, in binding order: ids, advantages, old and
/// reference log-probabilities, mask (absent ones bound to the advantages), statistics.
fn token_buffers<'a>(tokens: &GrpoTokens<'a>, stats: &'a Tensor) -> [&'a wgpu::Buffer; 6] {
    let advantages = tokens.advantages.buffer();
    [
        tokens.completion_ids.buffer(),
        advantages,
        tokens.old_logp.map_or(advantages, |t| t.buffer()),
        tokens.ref_logp.map_or(advantages, |t| t.buffer()),
        tokens.mask.map_or(advantages, |t| t.buffer()),
        stats.buffer(),
    ]
}

/// Whether rows of `vocab` logits of `dtype` are whole 16-byte chunks (the chunked entries).
fn chunked(dtype: DType, vocab: usize) -> bool {
    vocab.is_multiple_of(if dtype == DType::F32 { 4 } else { 8 })
}

/// Backward: `d logits` (F32, the logits' shape) from the loss cotangent `d_loss` (`[1]` F32;
/// `None`: 1).
///
/// Errors: `d_loss` not F32 `[1]` (`UnsupportedDType` / `ShapeMismatch`) or of another engine.
pub fn grpo_loss_backward(saved: &GrpoSaved, d_loss: Option<&Tensor>) -> Result<Tensor> {
    grpo_loss_backward_as(saved, d_loss, DType::F32)
}

/// [`grpo_loss_backward`] with the gradient stored in `dtype`: F16/BF16 give the F32 gradient
/// rounded once to nearest-even (bit for bit `cast::cast` of it; a NaN stays a NaN), stored
/// directly by the chunked pass for 16-bit logits in rows of whole 8-value chunks (2 bytes an
/// element instead of 4), else narrowed after the F32 pass.
///
/// Errors: those of [`grpo_loss_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn grpo_loss_backward_as(
    saved: &GrpoSaved,
    d_loss: Option<&Tensor>,
    dtype: DType,
) -> Result<Tensor> {
    if !dtype.is_float() {
        return Err(Error::dtype(
            "grpo_loss_backward_as: dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    let engine = saved.logits.engine();
    let d_loss = Tensor::scalar_cotangent(engine, d_loss, "grpo_loss_backward: d_loss")?;
    let ldt = saved.logits.dtype();
    let p = &saved.params;
    // The chunked pass: F32 logits into F32, 16-bit logits into 16 bits. 16-bit logits into
    // F32 keep the element pass, whose lanes store contiguous F32 words.
    let vector = chunked(ldt, p.vocab as usize) && ((ldt == DType::F32) == (dtype == DType::F32));
    let out = if vector { dtype } else { DType::F32 };
    let d_logits = Tensor::empty(engine, saved.logits.shape(), out, "grpo d_logits")?;
    let mut constants = vec![("DT", f64::from(ldt.code()))];
    let groups = u64::from(p.batch) * u64::from(p.positions);
    if vector {
        constants.push(("ODT", f64::from(dtype.code())));
        engine.launch(
            &KERNEL,
            "grpo_backward_v",
            &constants,
            p,
            &[
                saved.ids.buffer(),
                saved.stats.buffer(),
                saved.weights.buffer(),
                d_loss.buffer(),
                saved.logits.buffer(),
                d_logits.buffer(),
            ],
            groups,
        )?;
    } else {
        engine.launch(
            &KERNEL,
            "grpo_backward",
            &constants,
            p,
            &[
                saved.logits.buffer(),
                saved.ids.buffer(),
                saved.stats.buffer(),
                saved.weights.buffer(),
                d_loss.buffer(),
                d_logits.buffer(),
            ],
            groups,
        )?;
    }
    if out == dtype {
        Ok(d_logits)
    } else {
        crate::cast::cast(&d_logits, dtype)
    }
}
