//! Preference losses on a fused linear head: DPO, CPO, SimPO and ORPO (paired) and KTO
//! ([`kto_loss`], unpaired), chunked through
//! [`crate::fused_linear`] so the `[rows, V]` logits never exist; forward and backward.
//!
//! # Contract
//!
//! `x [2B, T, H]` holds the chosen completions (sequences `0..B`) then the rejected ones
//! (`B..2B`), `W [V, H]`, optional bias `[V]`, `targets [2B, T]` (I32; `ignore_index` marks
//! tokens that do not count). With `logp_t = log softmax(x_t·Wᵀ + b)[target_t]`, a sequence's
//! log-probability is `π = Σ_t logp_t` over its counted tokens, or their mean with
//! [`PreferenceOptions::average_log_prob`] (`Σ / max(n, 1)`). For pair `i` (chosen `c`,
//! rejected `r`) the margin `u_i` is ([`PreferenceLoss`]):
//! * DPO: `β·((π_c − ref_c) − (π_r − ref_r))` with the reference policy's sequence
//!   log-probabilities `ref_c`, `ref_r` ([`PreferenceReference`]: given as `[B]` F32 each, or
//!   computed from a reference head on its own hidden states with the same targets and
//!   averaging, no gradient; zeros when absent);
//! * CPO: `β·(π_c − π_r)`;
//! * SimPO: `β·(π_c − π_r) − γ`;
//! * ORPO: `(π_c − π_r) − (log(1 − e^π_c) − log(1 − e^π_r))` (the log odds ratio).
//!
//! `loss = w·(1/B)·Σ_i −[(1 − ls)·log σ(u_i) + ls·log σ(−u_i)] + α·NLL`, with `w = β` for ORPO
//! (1 otherwise), label smoothing `ls`, and `NLL = Σ_{chosen counted} −logp / max(N_c, 1)`
//! (`N_c` the chosen counted tokens) weighted by `α` ([`PreferenceOptions::nll_weight`]).
//! Outputs: the loss `[1]`, the NLL term `[1]`, and the sequence log-probabilities `[2, B]`
//! (row 0 chosen, row 1 rejected).
//!
//! # How it runs and the gradient
//!
//! The forward is [`crate::fused_linear::fused_linear_cross_entropy`] with reduction none
//! (per-token cross-entropies `−logp`, chunked within its budget), then one workgroup forms
//! every sequence's `π` (fixed-order trees, sequences in order), the loss and `d loss / d π`.
//! The backward turns those into a cotangent per token, `d_loss·(−d loss/d π_i·(1 or 1/n_i) +
//! α/N_c on chosen tokens)`, and takes it through the head with
//! [`crate::fused_linear::fused_linear_cross_entropy_backward`] (each chunk's logits
//! recomputed): `dx`, `dW`, `dbias` F32. No atomics; reruns are bit-identical. The reference
//! log-probabilities and the targets get no gradient.

use crate::fused_linear::{
    self, Chunking, FusedLinearCrossEntropyOptions, FusedLinearCrossEntropySaved,
    FusedLinearGradients, LinearHead,
};
use crate::kernel::{COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::loss::{CrossEntropyOptions, Reduction};
use crate::{DType, Error, Result, Tensor};

/// `wgsl/preference.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "preference",
    parts: &[
        COMMON_LAUNCH,
        COMMON_REDUCE,
        "const WG: u32 = 256u;",
        include_str!("../wgsl/preference.wgsl"),
    ],
};

/// Which paired preference loss (see the module documentation for the margins).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PreferenceLoss {
    /// Direct preference optimization, against optional reference log-probabilities.
    Dpo,
    /// Contrastive preference optimization (no reference).
    Cpo,
    /// Simple preference optimization with target margin `gamma`.
    SimPo {
        /// The target reward margin γ (finite).
        gamma: f32,
    },
    /// Odds ratio preference optimization (β weights the odds-ratio term).
    Orpo,
    /// Kahneman–Tversky optimization: unpaired sequences with desirable / undesirable labels,
    /// through [`kto_loss`] only.
    Kto,
}

/// Options of [`preference_loss`].
#[derive(Debug, Clone)]
pub struct PreferenceOptions {
    /// The loss.
    pub loss: PreferenceLoss,
    /// β (finite, > 0; default 0.1).
    pub beta: f32,
    /// Label smoothing `ls` in [0, 0.5] (default 0; ORPO: must be 0).
    pub label_smoothing: f32,
    /// Weight α of the chosen sequences' NLL (finite, ≥ 0; default 0).
    pub nll_weight: f32,
    /// π is the mean of the counted tokens' log-probabilities instead of their sum.
    pub average_log_prob: bool,
    /// Targets equal to this do not count (default −100).
    pub ignore_index: i32,
    /// Read the targets back and reject out-of-range ones (default true; synchronizes).
    pub check_targets: bool,
    /// Chunks of rows of the fused head (default: from the engine's workspace bound).
    pub chunking: Chunking,
}

impl PreferenceOptions {
    /// The defaults of each loss: DPO and CPO with summed log-probabilities, SimPO (γ 0.5)
    /// and ORPO (NLL weight 1) with averaged ones; β 0.1, no smoothing.
    pub fn new(loss: PreferenceLoss) -> PreferenceOptions {
        let averaged = matches!(loss, PreferenceLoss::SimPo { .. } | PreferenceLoss::Orpo);
        // (KTO sums, as DPO.)
        PreferenceOptions {
            loss,
            beta: 0.1,
            label_smoothing: 0.0,
            nll_weight: if loss == PreferenceLoss::Orpo {
                1.0
            } else {
                0.0
            },
            average_log_prob: averaged,
            ignore_index: -100,
            check_targets: true,
            chunking: Chunking::default(),
        }
    }
}

/// Outputs of [`preference_loss`], F32.
#[derive(Debug, Clone)]
pub struct PreferenceOutput {
    /// The loss, `[1]`.
    pub loss: Tensor,
    /// The chosen sequences' NLL term (before α), `[1]`.
    pub nll: Tensor,
    /// Sequence log-probabilities π, `[2, B]`: row 0 chosen, row 1 rejected (KTO: `[N]`).
    pub logps: Tensor,
}

/// What [`preference_loss_backward`] needs.
#[derive(Debug, Clone)]
pub struct PreferenceSaved {
    head: FusedLinearCrossEntropySaved,
    targets: Tensor,
    seq_stats: Tensor,
    params: Params,
}

#[derive(encase::ShaderType, Debug, Clone, Copy)]
struct Params {
    seqs: u32,
    tokens: u32,
    ignore_index: i32,
    kind: u32,
    average: u32,
    has_ref: u32,
    beta: f32,
    gamma: f32,
    smoothing: f32,
    alpha: f32,
    has_point: u32,
    ref_packed: u32,
}

fn invalid(what: &str, got: f64, rule: &str) -> Error {
    Error::InvalidValue {
        what: format!("preference_loss: {what}"),
        got,
        rule: rule.to_string(),
    }
}

/// The head's per-token cross-entropies (reduction none), flattened, and its saved context.
fn head_cross_entropy(
    head: LinearHead,
    targets: &Tensor,
    o: &PreferenceOptions,
) -> Result<(Tensor, FusedLinearCrossEntropySaved)> {
    let fl_options = FusedLinearCrossEntropyOptions {
        cross_entropy: CrossEntropyOptions {
            ignore_index: o.ignore_index,
            reduction: Reduction::None,
            check_targets: o.check_targets,
            predicted: false,
            ..CrossEntropyOptions::default()
        },
        chunking: o.chunking,
        gradients_in_forward: false,
        ..FusedLinearCrossEntropyOptions::default()
    };
    let (ce, saved) = fused_linear::fused_linear_cross_entropy(head, targets, &fl_options)?;
    let flat = ce.loss.reshape(&[ce.loss.len()])?;
    Ok((flat, saved))
}

/// The sequence pass (`preference_sequences`) on per-token cross-entropies `ce`: the
/// per-sequence statistics, the loss, the NLL term and π `[2, B]`.
fn sequence_pass(
    ce: &Tensor,
    targets: &Tensor,
    refs: Option<(&Tensor, &Tensor)>,
    params: &Params,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let engine = ce.engine();
    let seqs = params.seqs as usize;
    let seq_stats = Tensor::empty(engine, &[seqs + 1, 4], DType::F32, "preference stats")?;
    let loss = Tensor::empty(engine, &[1], DType::F32, "preference loss")?;
    let nll = Tensor::empty(engine, &[1], DType::F32, "preference nll")?;
    let logps = Tensor::empty(engine, &[2, seqs / 2], DType::F32, "preference logps")?;
    let (rc, rr) = refs.unwrap_or((ce, ce));
    engine.launch(
        &KERNEL,
        "preference_sequences",
        &Vec::new(),
        params,
        &[
            ce.buffer(),
            targets.buffer(),
            rc.buffer(),
            rr.buffer(),
            seq_stats.buffer(),
            loss.buffer(),
            nll.buffer(),
            logps.buffer(),
        ],
        1,
    )?;
    Ok((seq_stats, loss, nll, logps))
}

/// The reference policy of DPO: its sequence log-probabilities, or its head (whose
/// log-probabilities the call computes, with the same targets and averaging; no gradient).
#[derive(Debug, Clone, Copy)]
pub enum PreferenceReference<'a> {
    /// Sequence log-probabilities `[B]` F32 of the chosen and of the rejected completions.
    LogProbs {
        /// Chosen.
        chosen: &'a Tensor,
        /// Rejected.
        rejected: &'a Tensor,
    },
    /// The reference model's head on its own hidden states `[2B, T, H_ref]`.
    Head(LinearHead<'a>),
}

/// Forward: the loss, the NLL term and the sequence log-probabilities.
///
/// Errors: those of [`fused_linear::fused_linear_cross_entropy`] for the head and targets;
/// `x` not `[2B, T, H]` with an even first extent, or targets not `[2B, T]`
/// (`ShapeMismatch`); reference log-probabilities that are not F32 `[B]`
/// (`UnsupportedDType` / `ShapeMismatch`), given for another loss than DPO, or only one of
/// the two (`InvalidValue`); β not finite and > 0, label smoothing outside [0, 0.5] (or not 0
/// for ORPO), a negative or non-finite NLL weight, a non-finite γ (`InvalidValue`).
pub fn preference_loss(
    head: LinearHead,
    targets: &Tensor,
    reference: Option<PreferenceReference>,
    options: &PreferenceOptions,
) -> Result<(PreferenceOutput, PreferenceSaved)> {
    let x = head.input;
    let engine = x.engine();
    let &[seqs, tokens, _] = x.shape() else {
        return Err(Error::shape(
            "preference_loss: x [2B, T, H]",
            &[0, 0, 0],
            x.shape(),
        ));
    };
    if seqs % 2 == 1 {
        return Err(Error::shape(
            "preference_loss: x [2B, T, H] (chosen then rejected)",
            &[seqs + 1, tokens, x.shape()[2]],
            x.shape(),
        ));
    }
    let pairs = seqs / 2;
    let o = options;
    if !(o.beta.is_finite() && o.beta > 0.0) {
        return Err(invalid("beta", f64::from(o.beta), "finite and > 0"));
    }
    let ls = o.label_smoothing;
    if !(0.0..=0.5).contains(&ls) || (o.loss == PreferenceLoss::Orpo && ls != 0.0) {
        return Err(invalid(
            "label_smoothing",
            f64::from(ls),
            "in [0, 0.5] (0 for ORPO)",
        ));
    }
    if !(o.nll_weight.is_finite() && o.nll_weight >= 0.0) {
        return Err(invalid(
            "nll_weight",
            f64::from(o.nll_weight),
            "finite and ≥ 0",
        ));
    }
    let (kind, gamma) = match o.loss {
        PreferenceLoss::Dpo => (0, 0.0),
        PreferenceLoss::Cpo => (1, 0.0),
        PreferenceLoss::SimPo { gamma } if !gamma.is_finite() => {
            return Err(invalid("gamma", f64::from(gamma), "finite"));
        }
        PreferenceLoss::SimPo { gamma } => (2, gamma),
        PreferenceLoss::Orpo => (3, 0.0),
        PreferenceLoss::Kto => {
            return Err(invalid("loss", 4.0, "KTO is unpaired: use kto_loss"));
        }
    };
    if reference.is_some() && o.loss != PreferenceLoss::Dpo {
        return Err(invalid("reference", 1.0, "a reference policy is DPO's"));
    }
    if let Some(PreferenceReference::LogProbs { chosen, rejected }) = reference {
        for (t, what) in [(chosen, "ref_chosen"), (rejected, "ref_rejected")] {
            let what = format!("preference_loss: {what}");
            t.check(engine, &what, &[pairs], &[DType::F32])?;
        }
    }
    let mut params = Params {
        seqs: seqs as u32,
        tokens: tokens as u32,
        ignore_index: o.ignore_index,
        kind,
        average: u32::from(o.average_log_prob),
        has_ref: 0,
        beta: o.beta,
        gamma,
        smoothing: ls,
        alpha: o.nll_weight,
        has_point: 0,
        ref_packed: 0,
    };
    // The policy head (which checks the targets, when asked), then a reference head's sequence
    // log-probabilities by the same sequence pass (its head checks its shapes against the same
    // targets; their values are not read back twice).
    let (ce, head_saved) = head_cross_entropy(head, targets, o)?;
    let ref_logps = match reference {
        Some(PreferenceReference::Head(ref_head)) => {
            let unchecked = PreferenceOptions {
                check_targets: false,
                ..o.clone()
            };
            let (ref_ce, _) = head_cross_entropy(ref_head, targets, &unchecked)?;
            Some(sequence_pass(&ref_ce, targets, None, &params)?.3)
        }
        _ => None,
    };
    let refs = match (&reference, &ref_logps) {
        (Some(PreferenceReference::LogProbs { chosen, rejected }), _) => Some((*chosen, *rejected)),
        (_, Some(packed)) => {
            params.ref_packed = 1;
            Some((packed, packed))
        }
        _ => None,
    };
    params.has_ref = u32::from(refs.is_some());
    let (seq_stats, loss, nll, logps) = sequence_pass(&ce, targets, refs, &params)?;
    let saved = PreferenceSaved {
        head: head_saved,
        targets: targets.clone(),
        seq_stats,
        params,
    };
    Ok((PreferenceOutput { loss, nll, logps }, saved))
}

/// KTO on a fused linear head: `x [N, T, H]` (any `N` sequences), targets `[N, T]`,
/// `desirable [N]` (I32/U32, nonzero = desirable), optional reference sequence
/// log-probabilities `[N]` (F32) and reference point `z0` (`[1]` F32, e.g. a detached KL
/// estimate; 0 when absent). With `r_i = π_i − ref_i`, `loss = (1/N)·Σ_i (1 − σ(β·(r_i − z0)))`
/// over desirable and `(1 − σ(β·(z0 − r_i)))` over undesirable sequences. Options: β, the
/// averaging of π, ignore_index, the target check and chunking of `options` (its `loss` must
/// be [`PreferenceLoss::Kto`]; no smoothing, no NLL term). Outputs: the loss, `nll` 0, and π
/// `[N]`; the backward is [`preference_loss_backward`].
///
/// Errors: those of [`preference_loss`] for the head and scalars; `options.loss` not KTO,
/// smoothing or an NLL weight (`InvalidValue`); labels not I32/U32 `[N]`, a reference not F32
/// `[N]`, a reference point not F32 `[1]` (`UnsupportedDType` / `ShapeMismatch`).
pub fn kto_loss(
    head: LinearHead,
    targets: &Tensor,
    desirable: &Tensor,
    reference: Option<&Tensor>,
    reference_point: Option<&Tensor>,
    options: &PreferenceOptions,
) -> Result<(PreferenceOutput, PreferenceSaved)> {
    let x = head.input;
    let engine = x.engine();
    let &[seqs, tokens, _] = x.shape() else {
        return Err(Error::shape("kto_loss: x [N, T, H]", &[0, 0, 0], x.shape()));
    };
    let o = options;
    if o.loss != PreferenceLoss::Kto {
        return Err(invalid("loss", 0.0, "kto_loss needs PreferenceLoss::Kto"));
    }
    if !(o.beta.is_finite() && o.beta > 0.0) {
        return Err(invalid("beta", f64::from(o.beta), "finite and > 0"));
    }
    if o.label_smoothing != 0.0 || o.nll_weight != 0.0 {
        return Err(invalid(
            "label_smoothing / nll_weight",
            f64::from(o.label_smoothing + o.nll_weight),
            "0 for KTO",
        ));
    }
    let check = |t: &Tensor, what: &str, shape: &[usize], dtypes: &[DType]| {
        t.check(engine, &format!("kto_loss: {what}"), shape, dtypes)
    };
    check(desirable, "desirable", &[seqs], &[DType::I32, DType::U32])?;
    if let Some(r) = reference {
        check(r, "reference", &[seqs], &[DType::F32])?;
    }
    if let Some(z) = reference_point {
        check(z, "reference_point", &[1], &[DType::F32])?;
    }
    let (ce, head_saved) = head_cross_entropy(head, targets, o)?;
    let params = Params {
        seqs: seqs as u32,
        tokens: tokens as u32,
        ignore_index: o.ignore_index,
        kind: 4,
        average: u32::from(o.average_log_prob),
        has_ref: u32::from(reference.is_some()),
        beta: o.beta,
        gamma: 0.0,
        smoothing: 0.0,
        alpha: 0.0,
        has_point: u32::from(reference_point.is_some()),
        ref_packed: 0,
    };
    let seq_stats = Tensor::empty(engine, &[seqs + 1, 4], DType::F32, "kto stats")?;
    let loss = Tensor::empty(engine, &[1], DType::F32, "kto loss")?;
    let logps = Tensor::empty(engine, &[seqs], DType::F32, "kto logps")?;
    engine.launch(
        &KERNEL,
        "kto_sequences",
        &Vec::new(),
        &params,
        &[
            ce.buffer(),
            targets.buffer(),
            reference.unwrap_or(&ce).buffer(),
            seq_stats.buffer(),
            loss.buffer(),
            logps.buffer(),
            desirable.buffer(),
            reference_point.unwrap_or(&ce).buffer(),
        ],
        1,
    )?;
    let nll = Tensor::zeros(engine, &[1], DType::F32)?;
    let saved = PreferenceSaved {
        head: head_saved,
        targets: targets.clone(),
        seq_stats,
        params,
    };
    Ok((PreferenceOutput { loss, nll, logps }, saved))
}

/// Backward: `dx`, `dW`, `dbias` (F32) from the loss cotangent `d_loss` (`[1]` F32; `None`: 1).
///
/// Errors: `d_loss` not F32 `[1]` (`UnsupportedDType` / `ShapeMismatch`) or of another
/// engine; those of [`fused_linear::fused_linear_cross_entropy_backward`].
pub fn preference_loss_backward(
    saved: &PreferenceSaved,
    d_loss: Option<&Tensor>,
) -> Result<FusedLinearGradients> {
    let engine = saved.targets.engine();
    let d_loss = Tensor::scalar_cotangent(engine, d_loss, "preference_loss_backward: d_loss")?;
    let p = &saved.params;
    let rows = p.seqs as usize * p.tokens as usize;
    let cotangent = Tensor::empty(
        engine,
        saved.targets.shape(),
        DType::F32,
        "preference cotangent",
    )?;
    engine.launch(
        &KERNEL,
        "preference_tokens",
        &Vec::new(),
        p,
        &[
            saved.targets.buffer(),
            saved.seq_stats.buffer(),
            d_loss.buffer(),
            cotangent.buffer(),
        ],
        (rows as u64).div_ceil(256),
    )?;
    fused_linear::fused_linear_cross_entropy_backward(&saved.head, Some(&cotangent))
}
