//! Gated delta recurrences: Gated DeltaNet (one decay per value head) and the Kimi Delta
//! Attention core (one decay per key channel), forward and checkpointed backward.
//!
//! Per token and value head, with `a = exp(log_decay)`:
//!
//! ```text
//! D = diag(a)·S_prev      e = v − Dᵀk      S = D + β·k·eᵀ      o = scale·Sᵀq
//! ```
//!
//! Layouts: `q`, `k` `[B, T, Hk, K]`; `v` `[B, T, Hv, V]`; `beta` `[B, T, Hv]`; `log_decay`
//! `[B, T, Hv]` (scalar decay) or `[B, T, Hv, K]` (per channel); states `[B, Hv, K, V]`; output
//! `[B, T, Hv, V]`. **Head broadcast**: `Hv` is a multiple of `Hk` and value head `h` reads key
//! head `h / (Hv / Hk)`. **Views**: q, k and v may be strided views ([`SeqView::strided`]) into a
//! larger buffer, such as a fused projection `[B, T, W]`, read in place.
//!
//! Storage: q, k, v F32, F16 or BF16 (all three the same); beta, log_decay, the initial state
//! and the cotangents F32; the state is FP32 throughout; the output has v's dtype (computed in
//! F32, narrowed with [`crate::cast::cast`]); gradients are F32. Bounds: K and V in 16..=256,
//! T ≥ 1, B, Hk ≥ 1.
//!
//! **Forward**: one workgroup per (batch, value head, slice of 32 value columns); each column's
//! K state rows are split over 8 lanes that keep them in registers and walk the tokens in
//! order, their dot products combined in lane order. It saves the state every
//! `C` tokens (the checkpoints, `[B, Hv, ⌈T/C⌉, K, V]` F32, held by [`GatedDeltaSaved`]);
//! `C = ⌈√T⌉` by default, so the saved states are O(√T·K·V) per sequence-head;
//! [`GatedDeltaOptions::save_states`] keeps every state (`C = 1`).
//!
//! **Backward**: segments are walked last to first, each recomputed in two levels from its
//! checkpoint: every `c2 = ⌈√C⌉`-th state first, then each sub-segment's states (so a workgroup
//! keeps `⌈C/c2⌉ + c2` states in the workspace, [`gated_delta_workspace_bytes`]), whose tokens
//! are walked in reverse. Without head broadcast one workgroup per (batch, head) walks all
//! segments in one launch. With head broadcast (Hv > Hk) each segment is one launch over all
//! (batch, value head) workgroups writing per-value-head dq/dk partials, then a launch adding
//! each key head's partials in value-head order: no atomics, reruns are bit-identical. Within a
//! workgroup the column work (error, dv, dβ) and the row work (dq, dk, dlog_decay, dS_prev)
//! are each split over all 256 lanes, partial sums combined in lane order. `dS`, the running
//! state gradient, lives in the `initial_state` gradient's buffer.
//!
//! **Chunked** ([`DeltaAlgorithm::Chunked`], scalar decay; what the default
//! [`DeltaAlgorithm::Auto`] takes for a scalar decay without `save_states`): the recurrence
//! unrolled over chunks of [`CHUNK`] tokens (the WY form). With `γ` the running sum of the log decay within a
//! chunk and `S` the state before it: `A = β(KKᵀ ⊙ e^{γ_r − γ_s})` (strictly lower),
//! `w = (I + A)⁻¹ diag(βe^γ)K`, `u = (I + A)⁻¹ diag(β)V`, `P = QKᵀ ⊙ e^{γ_t − γ_s}` (lower,
//! diagonal included); then `U = u − wS`, `O = scale·(diag(e^γ)QS + PU)` and
//! `S ← e^{γ_last}S + (diag(e^{γ_last − γ})K)ᵀU`. Every chunk's w, u, P and γ at once (a
//! workgroup a chunk: its key products in 4 × 4 blocks a lane, the solves by forward
//! substitution a column a lane), then the chunks in order a workgroup a (head, 16 value
//! columns) with the state in registers (16 lanes a column, each holding every 16th group of
//! four rows), each round of 8 tokens' rows fetched a round ahead and staged in workgroup
//! memory as 16-byte groups, and each token's 16 partial dots summed as one fixed pairwise tree
//! (subgroup shuffles within runs of up to 16 lanes where the adapter has subgroups, workgroup
//! memory otherwise: the same bits, [`KERNEL_SUBGROUP`]). The forward saves only the initial
//! state; the chunked backward
//! forms the chunk states again, walks the state gradient from the last chunk
//! (`dU = (diag(e^{γ_last − γ})K)dS' + scale·PᵀdO`, `dS = e^{γ_last}dS' + scale·(diag(e^γ)Q)ᵀdO −
//! wᵀdU`; the `PᵀdO` term formed for every chunk at once first), then every chunk's gradients at
//! once (register-blocked tile products, the transposed solves), with per-value-head dq/dk
//! summed per key head in head order. Every sum has a fixed order.
//!
//! The backward entry point binds 14 storage buffers: an adapter with fewer
//! (`max_storage_buffers_per_shader_stage`) gets `Error::InsufficientLimit`.

use crate::kernel::{
    COMMON_DTYPE, COMMON_LAUNCH, COMMON_XOR, COMMON_XOR_SUBGROUP, Constants, Kernel,
};
use crate::{DType, Error, Result, Tensor, cast};

/// `wgsl/gated_delta.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "gated_delta",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_XOR,
        include_str!("../wgsl/gated_delta.wgsl"),
    ],
};

/// [`KERNEL`] whose `chunk_states` sums its parts' dots by subgroup shuffles where the adapter
/// has `SUBGROUP` (the same bits as [`KERNEL`]'s, which sums them through workgroup memory; see
/// the crate-internal `states_kernel`).
pub static KERNEL_SUBGROUP: Kernel = Kernel {
    name: "gated_delta_subgroup",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_XOR_SUBGROUP,
        include_str!("../wgsl/gated_delta.wgsl"),
    ],
};

/// Value columns per forward workgroup.
const FWD_COLS: usize = 32;
/// Value columns per `chunk_states` / `chunk_dstate` workgroup (`CS_COLS` of the WGSL).
const CHUNK_COLS: usize = 16;
/// Smallest and largest K and V.
pub const MIN_HEAD_DIM: usize = 16;
/// Largest K and V.
pub const MAX_HEAD_DIM: usize = 256;
/// Storage buffers the backward entry point binds.
const STORAGE_BUFFERS: u32 = 14;

/// Options of [`gated_delta_forward`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GatedDeltaOptions {
    /// Output scale; default (`None`) `1/√K`. Must be finite.
    pub scale: Option<f64>,
    /// Tokens per checkpoint segment; default (`None`) `⌈√T⌉`. Must be ≥ 1 (values above T act
    /// as T).
    pub checkpoint_interval: Option<usize>,
    /// Keep every state for the backward (checkpoint interval 1; memory O(T·K·V) per
    /// sequence-head, no recomputation). Default false. Not with [`DeltaAlgorithm::Chunked`]
    /// (with [`DeltaAlgorithm::Auto`] it selects the recurrence).
    pub save_states: bool,
    /// The form of the forward and its backward; default [`DeltaAlgorithm::Auto`].
    pub algorithm: DeltaAlgorithm,
}

/// How the forward and, from its saved context, the backward run. Both forms give the
/// recurrence's output, final state and gradients within the FP32 budget, each bit-identical
/// on reruns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeltaAlgorithm {
    /// [`DeltaAlgorithm::Chunked`] for a scalar decay without `save_states`, else
    /// [`DeltaAlgorithm::Recurrent`] ([`GatedDeltaShape::algorithm`] tells which). On an H100
    /// the chunked forward+backward measured 8.2–9.0× faster than the recurrent one, its
    /// forward 1.0–1.6× (README, gated delta timings).
    #[default]
    Auto,
    /// Token by token (any decay), checkpoints every `checkpoint_interval` tokens.
    Recurrent,
    /// The chunked (WY) form over chunks of [`CHUNK`] tokens, scalar decay only (a per-channel
    /// decay or `save_states` is `InvalidValue`): every chunk's triangular solve at once, then
    /// the chunks in order with the state in registers. The forward saves the initial state
    /// alone (interval T; `checkpoint_interval` is not used) and the backward forms the chunk
    /// states again. Workspaces: [`gated_delta_forward_workspace_bytes`],
    /// [`gated_delta_workspace_bytes`] (fewer heads a launch under a smaller bound, the same
    /// bits).
    Chunked,
}

/// Tokens per chunk of [`DeltaAlgorithm::Chunked`] (`CH` of `wgsl/gated_delta.wgsl`).
pub const CHUNK: usize = 64;

/// Sizes of one call (for the memory queries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedDeltaShape {
    /// B.
    pub batch: usize,
    /// T.
    pub time: usize,
    /// Hk.
    pub key_heads: usize,
    /// Hv.
    pub value_heads: usize,
    /// K.
    pub key_dim: usize,
    /// V.
    pub value_dim: usize,
    /// The decay is per key channel (`log_decay [B, T, Hv, K]`, KDA) rather than per head.
    pub per_channel: bool,
}

impl GatedDeltaShape {
    /// The form `options` run for this shape: [`DeltaAlgorithm::Auto`] resolved (never `Auto`).
    pub fn algorithm(&self, options: &GatedDeltaOptions) -> DeltaAlgorithm {
        match options.algorithm {
            DeltaAlgorithm::Auto if self.per_channel || options.save_states => {
                DeltaAlgorithm::Recurrent
            }
            DeltaAlgorithm::Auto => DeltaAlgorithm::Chunked,
            a => a,
        }
    }

    fn chunked(&self, options: &GatedDeltaOptions) -> bool {
        self.algorithm(options) == DeltaAlgorithm::Chunked
    }

    /// The checkpoint interval `options` give for this shape.
    pub fn interval(&self, options: &GatedDeltaOptions) -> usize {
        let t = self.time.max(1);
        if options.save_states {
            1
        } else {
            let c = options
                .checkpoint_interval
                .unwrap_or_else(|| (t as f64).sqrt().ceil() as usize)
                .clamp(1, t);
            if self.chunked(options) { t } else { c }
        }
    }

    /// Bytes of one value head's chunk workspace (w, u, P and γ of every chunk, F32).
    fn chunk_head_bytes(&self) -> u64 {
        let rows = (self.time.div_ceil(CHUNK) * CHUNK) as u64;
        rows * (self.key_dim + self.value_dim + CHUNK + 1) as u64 * 4
    }

    fn state_elems(&self) -> u64 {
        (self.key_dim * self.value_dim) as u64
    }
}

/// Bytes of the checkpoints a forward saves for its backward (`[B, Hv, ⌈T/C⌉, K, V]` F32).
pub fn gated_delta_saved_bytes(shape: &GatedDeltaShape, options: &GatedDeltaOptions) -> u64 {
    let c = shape.interval(options);
    (shape.batch * shape.value_heads * shape.time.div_ceil(c)) as u64 * shape.state_elems() * 4
}

/// How the backward runs for a shape and checkpoint interval `C`: sub-segments of `c2 = ⌈√C⌉`
/// tokens; per workgroup `⌈C/c2⌉ + c2` scratch states; with head broadcast (Hv > Hk) one launch
/// per segment over all B·Hv value heads plus per-value-head dq/dk partials `[B, C, Hv, K]`
/// (×2), else launches over the B·Hk units walking all segments.
#[derive(Debug, Clone, Copy)]
struct Plan {
    sub_interval: usize,
    subs: usize,
    per_unit: u64,
    partial_elems: u64,
    per_segment: bool,
    total_units: usize,
}

impl Plan {
    fn new(shape: &GatedDeltaShape, interval: usize) -> Plan {
        let sub_interval = ((interval as f64).sqrt().ceil() as usize).clamp(1, interval.max(1));
        let subs = interval.div_ceil(sub_interval);
        let per_segment = shape.value_heads > shape.key_heads;
        Plan {
            sub_interval,
            subs,
            per_unit: (subs + sub_interval) as u64 * shape.state_elems() * 4,
            partial_elems: if per_segment {
                (shape.batch * interval * shape.value_heads * shape.key_dim) as u64
            } else {
                0
            },
            per_segment,
            total_units: shape.batch
                * if per_segment {
                    shape.value_heads
                } else {
                    shape.key_heads
                },
        }
    }

    fn partial_bytes(&self) -> u64 {
        2 * self.partial_elems * 4
    }

    /// Workgroups per launch under `bound`: all units when they fit, else equal launches of
    /// as many as fit (at least one).
    fn launch_units(&self, bound: u64) -> usize {
        let room = bound.saturating_sub(self.partial_bytes());
        let fit = ((room / self.per_unit) as usize).clamp(1, self.total_units.max(1));
        self.total_units.div_ceil(self.total_units.div_ceil(fit))
    }

    fn workspace(&self, units: usize) -> u64 {
        self.partial_bytes() + units as u64 * self.per_unit
    }
}

/// Scratch bytes [`gated_delta_backward`] allocates beyond its outputs when every workgroup
/// runs at once: per workgroup `⌈C/c2⌉ + c2` recomputed states (`c2 = ⌈√C⌉`, `C` the checkpoint
/// interval) of `K·V` F32, for `B·Hk` workgroups, or with head broadcast (Hv > Hk) `B·Hv`
/// workgroups plus the per-value-head dq/dk partials of one segment (`2·B·C·Hv·K` F32). Under a
/// smaller workspace bound the backward launches fewer workgroups at a time (same results bit
/// for bit) and fails with `Error::WorkspaceExceeded` only when one workgroup does not fit.
///
/// With [`DeltaAlgorithm::Chunked`]: per value head the forward's chunk workspace again, U and
/// its gradient `[T, V]`, every chunk's first state and state gradient `[⌈T/64⌉, K, V]` and the
/// dq/dk partials `[T, K]`, F32, plus the scratch of at most 1,024 gradient workgroups
/// (`64·(4K + V + 256)` F32 each); under a smaller bound fewer key heads a launch (same bits).
pub fn gated_delta_workspace_bytes(shape: &GatedDeltaShape, options: &GatedDeltaOptions) -> u64 {
    if shape.chunked(options) {
        return chunk_backward_plan(shape, u64::MAX).2;
    }
    let plan = Plan::new(shape, shape.interval(options));
    plan.workspace(plan.total_units)
}

/// Scratch bytes [`gated_delta_forward`] allocates beyond its outputs and checkpoints: the F32
/// output before narrowing when v is F16/BF16, and for [`DeltaAlgorithm::Chunked`] the chunk
/// workspace of every value head (`⌈T/64⌉·64·(K + V + 65)` F32 a head; under a smaller bound
/// the forward takes fewer heads a launch, failing only when one head does not fit).
pub fn gated_delta_forward_workspace_bytes(
    shape: &GatedDeltaShape,
    options: &GatedDeltaOptions,
    dtype: DType,
) -> u64 {
    let narrowing = if dtype == DType::F32 {
        0
    } else {
        (shape.batch * shape.time * shape.value_heads * shape.value_dim) as u64 * 4
    };
    let chunks = if shape.chunked(options) {
        (shape.batch * shape.value_heads) as u64 * shape.chunk_head_bytes()
    } else {
        0
    };
    narrowing + chunks
}

/// q, k or v as read by the kernels: a dense `[B, T, H, D]` tensor, or a strided view into a
/// larger buffer where element `(b, t, h, i)` sits at `offset + (b·T + t)·row_stride + h·D + i`.
#[derive(Debug, Clone, Copy)]
pub struct SeqView<'a> {
    tensor: &'a Tensor,
    layout: Option<ViewLayout>,
}

/// Shape, offset and row stride (in elements) of a strided view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewLayout {
    /// `[B, T, H, D]`.
    pub shape: [usize; 4],
    /// Element offset of `(0, 0, 0, 0)`.
    pub offset: usize,
    /// Elements from one token row to the next (≥ H·D).
    pub row_stride: usize,
}

impl<'a> From<&'a Tensor> for SeqView<'a> {
    fn from(tensor: &'a Tensor) -> Self {
        SeqView {
            tensor,
            layout: None,
        }
    }
}

impl<'a> SeqView<'a> {
    /// A view of `tensor` (any shape; its elements are addressed flat) with logical shape
    /// `[B, T, H, D]`, element offset and row stride. Checked when the op runs: the stride is at
    /// least H·D and the last element lies inside the tensor.
    pub fn strided(
        tensor: &'a Tensor,
        shape: [usize; 4],
        offset: usize,
        row_stride: usize,
    ) -> Self {
        SeqView {
            tensor,
            layout: Some(ViewLayout {
                shape,
                offset,
                row_stride,
            }),
        }
    }

    fn resolve(&self, what: &str) -> Result<ViewLayout> {
        match self.layout {
            None => {
                let s = self.tensor.shape();
                if s.len() != 4 {
                    return Err(Error::shape(what, &[0, 0, 0, 0], s));
                }
                Ok(ViewLayout {
                    shape: [s[0], s[1], s[2], s[3]],
                    offset: 0,
                    row_stride: s[2] * s[3],
                })
            }
            Some(l) => {
                let row = l.shape[2] * l.shape[3];
                if l.row_stride < row {
                    return Err(Error::bounds(
                        format!("{what}: row stride"),
                        l.row_stride as u64,
                        row as u64,
                        u32::MAX as u64,
                    ));
                }
                let rows = l.shape[0] * l.shape[1];
                if rows > 0 && row > 0 {
                    let last =
                        l.offset as u64 + (rows as u64 - 1) * l.row_stride as u64 + row as u64;
                    if last > self.tensor.len() as u64 {
                        return Err(Error::bounds(
                            format!("{what}: view end (elements)"),
                            last,
                            0,
                            self.tensor.len() as u64,
                        ));
                    }
                }
                Ok(l)
            }
        }
    }
}

/// Output and final state of [`gated_delta_forward`].
#[derive(Debug, Clone)]
pub struct GatedDeltaOutput {
    /// `[B, T, Hv, V]`, v's dtype.
    pub output: Tensor,
    /// `[B, Hv, K, V]` F32.
    pub final_state: Tensor,
}

/// What the backward needs: the inputs (handles, not copies) and the checkpoints.
#[derive(Debug, Clone)]
pub struct GatedDeltaSaved {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_layout: ViewLayout,
    k_layout: ViewLayout,
    v_layout: ViewLayout,
    beta: Tensor,
    log_decay: Tensor,
    checkpoints: Tensor,
    shape: GatedDeltaShape,
    scale: f32,
    interval: usize,
    chunked: bool,
}

impl GatedDeltaSaved {
    /// Sizes of the call.
    pub fn shape(&self) -> GatedDeltaShape {
        self.shape
    }

    /// Tokens per checkpoint segment (T for [`DeltaAlgorithm::Chunked`]).
    pub fn checkpoint_interval(&self) -> usize {
        self.interval
    }

    /// The saved checkpoints `[B, Hv, ⌈T/C⌉, K, V]` F32 (checkpoint c = state before token c·C).
    pub fn checkpoints(&self) -> &Tensor {
        &self.checkpoints
    }
}

/// Gradients of [`gated_delta_backward`], all F32 and dense.
#[derive(Debug, Clone)]
pub struct GatedDeltaGradients {
    /// `[B, T, Hk, K]`, summed over the value heads sharing each key head.
    pub query: Tensor,
    /// `[B, T, Hk, K]`, summed likewise.
    pub key: Tensor,
    /// `[B, T, Hv, V]`.
    pub value: Tensor,
    /// `[B, T, Hv]`.
    pub beta: Tensor,
    /// log_decay's shape.
    pub log_decay: Tensor,
    /// `[B, Hv, K, V]` (the gradient of the initial state, zeros taken when none was given).
    pub initial_state: Tensor,
}

#[derive(encase::ShaderType)]
struct Params {
    batch: u32,
    time: u32,
    key_heads: u32,
    value_heads: u32,
    vdim: u32,
    group: u32,
    interval: u32,
    checkpoints: u32,
    q_off: u32,
    q_stride: u32,
    k_off: u32,
    k_stride: u32,
    v_off: u32,
    v_stride: u32,
    scale: f32,
    flags: u32,
    sub: u32,
    units: u32,
    slices: u32,
    unit_base: u32,
    seg: u32,
    sub_interval: u32,
    subs: u32,
    mode: u32,
    chunks: u32,
}

fn to_u32(what: &str, x: u64) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::bounds(what, x, 0, u64::from(u32::MAX)))
}

fn expect_shape(what: &str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.shape() != want {
        return Err(Error::shape(what, want, t.shape()));
    }
    Ok(())
}

fn expect_f32(what: &str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::dtype(what, t.dtype(), &[DType::F32]));
    }
    Ok(())
}

/// The module and override constants of a `chunk_states` (`dstate` false) or `chunk_dstate`
/// launch. The parts of a column are summed by shuffles within runs of `CS_SG` = min(subgroup
/// width, 16) lanes where the adapter has subgroups (`reduce::force_subgroup_rows` overrides,
/// as for the row reductions), the rest through workgroup memory. `CS_R` tokens a round: 8
/// (measured on an H100 against 16: 5% slower at B1 T8192 Hv48, 6% faster at B4 T2048 H16,
/// whose 512 workgroups the 78 registers of 16 tokens do not keep resident at once), 4 where a
/// round's staged groups would not fit 12 KiB (`chunk_dstate` with K > 184).
fn states_kernel(
    engine: &crate::Engine,
    dtype: DType,
    key_dim: usize,
    dstate: bool,
) -> (&'static Kernel, Constants) {
    const PARTS: usize = 16;
    const STAGE_GROUPS: usize = 768;
    let sg =
        crate::reduce::rows_subgroup_width(engine, true).map_or(1, |w| (w as usize).min(PARTS));
    let kq = key_dim.div_ceil(4);
    // The largest round's groups: the rows and P's rows (chunk_states), or q's and w's rows
    // and dO (chunk_dstate).
    let staged = |round: usize| {
        if dstate {
            round * (2 * kq + CHUNK_COLS / 4)
        } else {
            round * (kq + CHUNK / 4)
        }
    };
    let parts = |round: usize| round * (PARTS / sg) * CHUNK_COLS / 4;
    let round = if staged(8).max(parts(8)) <= STAGE_GROUPS {
        8
    } else {
        4
    };
    let mut c = constants(dtype, key_dim, false);
    c.push(("CS_SG", sg as f64));
    c.push(("CS_R", round as f64));
    c.push(("CS_STAGE", staged(round).max(parts(round)) as f64));
    c.push(("CS_LOADS", staged(round).div_ceil(256) as f64));
    let kernel = if sg > 1 { &KERNEL_SUBGROUP } else { &KERNEL };
    (kernel, c)
}

fn constants(dtype: DType, key_dim: usize, per_channel: bool) -> Constants {
    vec![
        ("DT", f64::from(dtype.code())),
        ("KD", key_dim as f64),
        ("PER_CHANNEL", if per_channel { 1.0 } else { 0.0 }),
    ]
}

/// Run the recurrence over all tokens.
///
/// Errors (before anything is launched): a q/k/v that is not 4-D or whose view does not fit
/// (`ShapeMismatch`, `OutOfBounds`); B, T or Hk zero, K or V outside 16..=256, Hv not a
/// multiple of Hk (`OutOfBounds`); k's or v's leading sizes or beta/log_decay/initial-state
/// shapes not matching q's and v's (`ShapeMismatch`); q/k/v not all one float dtype, or
/// beta/log_decay/initial state not F32 (`UnsupportedDType`); a non-finite scale or a zero
/// checkpoint interval (`InvalidValue`); tensors of another engine (`EngineMismatch`); an
/// index past `u32` (`OutOfBounds`); too few storage buffers per stage (`InsufficientLimit`);
/// scratch past the workspace bound (`WorkspaceExceeded`); a tensor past one binding
/// (`LimitExceeded`).
pub fn gated_delta_forward<'a>(
    q: impl Into<SeqView<'a>>,
    k: impl Into<SeqView<'a>>,
    v: impl Into<SeqView<'a>>,
    beta: &Tensor,
    log_decay: &Tensor,
    initial_state: Option<&Tensor>,
    options: &GatedDeltaOptions,
) -> Result<(GatedDeltaOutput, GatedDeltaSaved)> {
    let (q, k, v) = (q.into(), k.into(), v.into());
    let engine = q.tensor.engine().clone();
    for (what, t) in [
        ("gated_delta_forward: k", k.tensor),
        ("gated_delta_forward: v", v.tensor),
        ("gated_delta_forward: beta", beta),
        ("gated_delta_forward: log_decay", log_decay),
    ] {
        t.check_engine(&engine, what)?;
    }
    if let Some(s) = initial_state {
        s.check_engine(&engine, "gated_delta_forward: initial_state")?;
    }
    let ql = q.resolve("gated_delta_forward: q")?;
    let kl = k.resolve("gated_delta_forward: k")?;
    let vl = v.resolve("gated_delta_forward: v")?;
    let [bsz, time, hk, kd] = ql.shape;
    let [_, _, hv, vd] = vl.shape;
    let what = |s: &str| format!("gated_delta_forward: {s}");
    if bsz == 0 {
        return Err(Error::bounds(what("batch"), 0, 1, u64::from(u32::MAX)));
    }
    if time == 0 {
        return Err(Error::bounds(what("time"), 0, 1, u64::from(u32::MAX)));
    }
    if hk == 0 {
        return Err(Error::bounds(what("key heads"), 0, 1, u64::from(u32::MAX)));
    }
    for (name, d) in [("key dim", kd), ("value dim", vd)] {
        if !(MIN_HEAD_DIM..=MAX_HEAD_DIM).contains(&d) {
            return Err(Error::bounds(
                what(name),
                d as u64,
                MIN_HEAD_DIM as u64,
                MAX_HEAD_DIM as u64,
            ));
        }
    }
    if kl.shape != ql.shape {
        return Err(Error::shape(what("k"), &ql.shape, &kl.shape));
    }
    if vl.shape[0] != bsz || vl.shape[1] != time || hv == 0 || !hv.is_multiple_of(hk) {
        let want_h = if hv == 0 { hk } else { hv.div_ceil(hk) * hk };
        return Err(Error::shape(what("v"), &[bsz, time, want_h, vd], &vl.shape));
    }
    let dtype = q.tensor.dtype();
    if !dtype.is_float() {
        return Err(Error::dtype(what("q"), dtype, &DType::FLOATS));
    }
    for (name, t) in [("k", k.tensor), ("v", v.tensor)] {
        if t.dtype() != dtype {
            return Err(Error::dtype(what(name), t.dtype(), &[dtype]));
        }
    }
    expect_f32(&what("beta"), beta)?;
    expect_f32(&what("log_decay"), log_decay)?;
    expect_shape(&what("beta"), beta, &[bsz, time, hv])?;
    let per_channel = log_decay.shape().len() == 4;
    if per_channel {
        expect_shape(&what("log_decay"), log_decay, &[bsz, time, hv, kd])?;
    } else {
        expect_shape(&what("log_decay"), log_decay, &[bsz, time, hv])?;
    }
    if let Some(s) = initial_state {
        expect_f32(&what("initial_state"), s)?;
        expect_shape(&what("initial_state"), s, &[bsz, hv, kd, vd])?;
    }
    let scale = options.scale.unwrap_or(1.0 / (kd as f64).sqrt());
    if !scale.is_finite() || !(scale as f32).is_finite() {
        return Err(Error::InvalidValue {
            what: what("scale"),
            got: scale,
            rule: "must be finite (in f32)".into(),
        });
    }
    if options.checkpoint_interval == Some(0) {
        return Err(Error::InvalidValue {
            what: what("checkpoint_interval"),
            got: 0.0,
            rule: "must be at least 1".into(),
        });
    }
    if options.algorithm == DeltaAlgorithm::Chunked && (per_channel || options.save_states) {
        return Err(Error::InvalidValue {
            what: what("algorithm"),
            got: if per_channel { 1.0 } else { 2.0 },
            rule: "the chunked form takes a scalar decay (1: log_decay per channel) and no \
                   save_states (2)"
                .into(),
        });
    }
    engine.require_storage_buffers(STORAGE_BUFFERS)?;
    let shape = GatedDeltaShape {
        batch: bsz,
        time,
        key_heads: hk,
        value_heads: hv,
        key_dim: kd,
        value_dim: vd,
        per_channel,
    };
    let chunked = shape.chunked(options);
    let interval = shape.interval(options);
    let checkpoints_n = time.div_ceil(interval);
    // Every index the kernels form must fit u32 (elements of each buffer).
    let ckpt_elems = (bsz * hv * checkpoints_n) as u64 * shape.state_elems();
    to_u32(&what("checkpoint elements"), ckpt_elems)?;
    to_u32(&what("output elements"), (bsz * time * hv * vd) as u64)?;
    for (name, l, t) in [
        ("q", &ql, q.tensor),
        ("k", &kl, k.tensor),
        ("v", &vl, v.tensor),
    ] {
        to_u32(&what(name), t.len() as u64)?;
        to_u32(&what(name), l.row_stride as u64)?;
    }
    to_u32(&what("log_decay"), log_decay.len() as u64)?;
    // Heads a chunked launch takes: all, or as many as the bound leaves room for.
    let narrowing = gated_delta_forward_workspace_bytes(
        &shape,
        &GatedDeltaOptions {
            algorithm: DeltaAlgorithm::Recurrent,
            ..*options
        },
        dtype,
    );
    let heads = bsz * hv;
    let launch_heads = if chunked {
        let room = engine.workspace_bound().saturating_sub(narrowing);
        let fit = (room / shape.chunk_head_bytes()) as usize;
        heads.div_ceil(heads.div_ceil(fit.clamp(1, heads)))
    } else {
        0
    };
    engine.check_workspace(
        "gated_delta_forward",
        narrowing + launch_heads as u64 * shape.chunk_head_bytes(),
    )?;
    if chunked {
        to_u32(
            &what("chunk workspace elements"),
            launch_heads as u64 * shape.chunk_head_bytes() / 4,
        )?;
    }

    let out32 = Tensor::empty(
        &engine,
        &[bsz, time, hv, vd],
        DType::F32,
        "gated_delta output",
    )?;
    let final_state = Tensor::empty(
        &engine,
        &[bsz, hv, kd, vd],
        DType::F32,
        "gated_delta final state",
    )?;
    let checkpoints = Tensor::empty(
        &engine,
        &[bsz, hv, checkpoints_n, kd, vd],
        DType::F32,
        "gated_delta checkpoints",
    )?;
    let slices = vd.div_ceil(FWD_COLS);
    let units = bsz * hv * slices;
    let params = Params {
        batch: bsz as u32,
        time: time as u32,
        key_heads: hk as u32,
        value_heads: hv as u32,
        vdim: vd as u32,
        group: (hv / hk) as u32,
        interval: interval as u32,
        checkpoints: checkpoints_n as u32,
        q_off: to_u32(&what("q offset"), ql.offset as u64)?,
        q_stride: ql.row_stride as u32,
        k_off: to_u32(&what("k offset"), kl.offset as u64)?,
        k_stride: kl.row_stride as u32,
        v_off: to_u32(&what("v offset"), vl.offset as u64)?,
        v_stride: vl.row_stride as u32,
        scale: scale as f32,
        flags: u32::from(initial_state.is_some()),
        sub: 0,
        units: to_u32(&what("workgroups"), units as u64)?,
        slices: slices as u32,
        unit_base: 0,
        seg: 0,
        sub_interval: 1,
        subs: 1,
        mode: 0,
        chunks: 0,
    };
    // An absent initial state binds beta (never read: flag off).
    let init = initial_state.unwrap_or(beta);
    if chunked {
        let chunks = time.div_ceil(CHUNK);
        let slices = vd.div_ceil(CHUNK_COLS);
        let ws = Tensor::empty(
            &engine,
            &[launch_heads * shape.chunk_head_bytes() as usize / 4],
            DType::F32,
            "gated_delta chunk workspace",
        )?;
        // Bound where the backward's workspace goes; the forward's mode never reads it.
        let unused = Tensor::zeros(&engine, &[1], DType::F32)?;
        for first in (0..heads).step_by(launch_heads) {
            let n = launch_heads.min(heads - first);
            let p = |units: usize| Params {
                unit_base: first as u32,
                units: units as u32,
                slices: slices as u32,
                chunks: chunks as u32,
                ..params
            };
            let prepare = n * chunks;
            to_u32(&what("chunk workgroups"), prepare as u64)?;
            engine.launch(
                &KERNEL,
                "chunk_prepare",
                &constants(dtype, kd, false),
                &p(prepare),
                &[
                    q.tensor.buffer(),
                    k.tensor.buffer(),
                    v.tensor.buffer(),
                    beta.buffer(),
                    log_decay.buffer(),
                    ws.buffer(),
                ],
                prepare as u64,
            )?;
            let (states, states_constants) = states_kernel(&engine, dtype, kd, false);
            engine.launch(
                states,
                "chunk_states",
                &states_constants,
                &p(n * slices),
                &[
                    q.tensor.buffer(),
                    k.tensor.buffer(),
                    init.buffer(),
                    out32.buffer(),
                    final_state.buffer(),
                    checkpoints.buffer(),
                    ws.buffer(),
                    unused.buffer(),
                ],
                (n * slices) as u64,
            )?;
        }
    } else {
        engine.launch(
            &KERNEL,
            "forward",
            &constants(dtype, kd, per_channel),
            &params,
            &[
                q.tensor.buffer(),
                k.tensor.buffer(),
                v.tensor.buffer(),
                beta.buffer(),
                log_decay.buffer(),
                init.buffer(),
                out32.buffer(),
                final_state.buffer(),
                checkpoints.buffer(),
            ],
            units as u64,
        )?;
    }
    let output = cast::cast(&out32, dtype)?;
    drop(out32);
    Ok((
        GatedDeltaOutput {
            output,
            final_state,
        },
        GatedDeltaSaved {
            q: q.tensor.clone(),
            k: k.tensor.clone(),
            v: v.tensor.clone(),
            q_layout: ql,
            k_layout: kl,
            v_layout: vl,
            beta: beta.clone(),
            log_decay: log_decay.clone(),
            checkpoints,
            shape,
            scale: scale as f32,
            interval,
            chunked,
        },
    ))
}

/// [`gated_delta_backward`] with every gradient in `dtype` (F32, F16 or BF16): the F32
/// gradients cast ([`crate::cast::cast`]; the kernels accumulate them in F32).
///
/// Errors: those of [`gated_delta_backward`]; a `dtype` that is not a float.
pub fn gated_delta_backward_as(
    saved: &GatedDeltaSaved,
    d_output: Option<&Tensor>,
    d_final_state: Option<&Tensor>,
    dtype: DType,
) -> Result<GatedDeltaGradients> {
    dtype.require_float("gated_delta_backward_as: dtype")?;
    let g = gated_delta_backward(saved, d_output, d_final_state)?;
    Ok(GatedDeltaGradients {
        query: cast::cast(&g.query, dtype)?,
        key: cast::cast(&g.key, dtype)?,
        value: cast::cast(&g.value, dtype)?,
        beta: cast::cast(&g.beta, dtype)?,
        log_decay: cast::cast(&g.log_decay, dtype)?,
        initial_state: cast::cast(&g.initial_state, dtype)?,
    })
}

/// Gradients of every input from the output cotangent `[B, T, Hv, V]` and the final-state
/// cotangent `[B, Hv, K, V]` (both F32; either may be absent = zero).
///
/// Errors: a cotangent of the wrong shape (`ShapeMismatch`) or dtype (`UnsupportedDType`) or
/// engine (`EngineMismatch`); one workgroup's scratch (`C·K·V·4` bytes; after a chunked
/// forward one key head's workspace and the gradient workgroups' scratch) past the workspace
/// bound (`WorkspaceExceeded`; a bound below the full [`gated_delta_workspace_bytes`] only
/// makes the launches smaller); a buffer past one binding (`LimitExceeded`).
pub fn gated_delta_backward(
    saved: &GatedDeltaSaved,
    d_output: Option<&Tensor>,
    d_final_state: Option<&Tensor>,
) -> Result<GatedDeltaGradients> {
    let engine = saved.q.engine().clone();
    let s = saved.shape;
    let (bsz, time, hk, hv, kd, vd) = (
        s.batch,
        s.time,
        s.key_heads,
        s.value_heads,
        s.key_dim,
        s.value_dim,
    );
    if let Some(g) = d_output {
        g.check_engine(&engine, "gated_delta_backward: d_output")?;
        expect_f32("gated_delta_backward: d_output", g)?;
        expect_shape("gated_delta_backward: d_output", g, &[bsz, time, hv, vd])?;
    }
    if let Some(g) = d_final_state {
        g.check_engine(&engine, "gated_delta_backward: d_final_state")?;
        expect_f32("gated_delta_backward: d_final_state", g)?;
        expect_shape("gated_delta_backward: d_final_state", g, &[bsz, hv, kd, vd])?;
    }
    if saved.chunked {
        return chunked_backward(saved, d_output, d_final_state);
    }
    let plan = Plan::new(&s, saved.interval);
    let launch_units = plan.launch_units(engine.workspace_bound());
    let workspace = plan.workspace(launch_units);
    engine.check_workspace("gated_delta_backward", workspace)?;
    to_u32("gated_delta_backward: workspace elements", workspace / 4)?;

    let f32t = |shape: &[usize], what: &str| Tensor::empty(&engine, shape, DType::F32, what);
    let grads_out = gradient_tensors(saved, d_final_state)?;
    let GatedDeltaGradients {
        query: dq,
        key: dk,
        value: dv,
        beta: dbeta,
        log_decay: dg,
        initial_state: dstate,
    } = &grads_out;
    let states_elems = (launch_units as u64 * plan.per_unit / 4) as usize;
    let states = f32t(&[states_elems], "gated_delta backward states")?;
    let partial_len = (plan.partial_elems as usize).max(1);
    let (pdq, pdk) = if plan.per_segment {
        (
            Some(f32t(&[partial_len], "gated_delta dq partials")?),
            Some(f32t(&[partial_len], "gated_delta dk partials")?),
        )
    } else {
        (None, None)
    };
    let group = hv / hk;
    let checkpoints = time.div_ceil(saved.interval);
    // An absent output cotangent binds beta (never read: flag off).
    let dout = d_output.unwrap_or(&saved.beta);
    let constants = constants(saved.q.dtype(), kd, saved.shape.per_channel);
    let params = |sub: usize, seg: usize, unit_base: usize, units: usize, mode: u32| Params {
        sub: sub as u32,
        units: units as u32,
        unit_base: unit_base as u32,
        seg: seg as u32,
        sub_interval: plan.sub_interval as u32,
        subs: plan.subs as u32,
        mode,
        ..saved_params(saved, d_output.is_some())
    };
    let total = plan.total_units;
    let chunks = || {
        (0..total)
            .step_by(launch_units)
            .map(move |base| (base, launch_units.min(total - base)))
    };
    let backward = |p: &Params, dq_target: &Tensor, dk_target: &Tensor, units: usize| {
        engine.launch(
            &KERNEL,
            "backward",
            &constants,
            p,
            &[
                saved.q.buffer(),
                saved.k.buffer(),
                saved.v.buffer(),
                saved.beta.buffer(),
                saved.log_decay.buffer(),
                saved.checkpoints.buffer(),
                dout.buffer(),
                states.buffer(),
                dstate.buffer(),
                dq_target.buffer(),
                dk_target.buffer(),
                dv.buffer(),
                dbeta.buffer(),
                dg.buffer(),
            ],
            units as u64,
        )
    };
    match (&pdq, &pdk) {
        (Some(pdq), Some(pdk)) => {
            for seg in (0..checkpoints).rev() {
                for (base, units) in chunks() {
                    backward(&params(0, seg, base, units, 1), pdq, pdk, units)?;
                }
                let len = saved.interval.min(time - seg * saved.interval);
                let threads = bsz * len * hk * kd;
                engine.launch(
                    &KERNEL,
                    "sum_heads",
                    &constants,
                    &params(0, seg, 0, threads, 1),
                    &[dq.buffer(), dk.buffer(), pdq.buffer(), pdk.buffer()],
                    (threads as u64).div_ceil(256),
                )?;
            }
        }
        _ => {
            for sub in 0..group {
                for (base, units) in chunks() {
                    backward(&params(sub, 0, base, units, 0), dq, dk, units)?;
                }
            }
        }
    }
    Ok(grads_out)
}

/// Scratch floats of one `chunk_grads` workgroup (`sc_len` of the WGSL).
fn chunk_grads_scratch(key_dim: usize, value_dim: usize) -> u64 {
    (4 * CHUNK * key_dim + CHUNK * value_dim + 4 * CHUNK * CHUNK) as u64
}

/// Most `chunk_grads` workgroups a launch (each with its own scratch).
const GRAD_WORKGROUPS: usize = 1024;

/// Bytes of one value head's chunked-backward workspace: the forward's w, u, P and γ, then U,
/// dU, the chunks' first states and their state gradients, and the dq/dk partials.
fn chunk_backward_head_bytes(shape: &GatedDeltaShape) -> u64 {
    let chunks = shape.time.div_ceil(CHUNK) as u64;
    let (k, v) = (shape.key_dim as u64, shape.value_dim as u64);
    shape.chunk_head_bytes() + 8 * chunks * (CHUNK as u64 + k) * v + 8 * shape.time as u64 * k
}

/// The chunked backward's launch plan under `bound`: heads a launch (whole key heads), the
/// `chunk_grads` workgroups, and the bytes.
fn chunk_backward_plan(shape: &GatedDeltaShape, bound: u64) -> (usize, usize, u64) {
    let heads = shape.batch * shape.value_heads;
    let group = shape.value_heads / shape.key_heads;
    let units = heads * shape.time.div_ceil(CHUNK);
    let grads = units.min(GRAD_WORKGROUPS);
    let scratch = grads as u64 * chunk_grads_scratch(shape.key_dim, shape.value_dim) * 4;
    let per_group = group as u64 * chunk_backward_head_bytes(shape);
    let groups = heads / group;
    let fit = (bound.saturating_sub(scratch) / per_group) as usize;
    let launch = groups.div_ceil(groups.div_ceil(fit.clamp(1, groups))) * group;
    (
        launch,
        grads,
        scratch + launch as u64 / group as u64 * per_group,
    )
}

/// The backward of [`DeltaAlgorithm::Chunked`] (scalar decay): per launch of whole key heads,
/// the chunk states again from the saved initial state, the state gradients walked from the
/// last chunk, every chunk's gradients at once, and each key head's dq/dk summed over its value
/// heads in head order.
fn chunked_backward(
    saved: &GatedDeltaSaved,
    d_output: Option<&Tensor>,
    d_final_state: Option<&Tensor>,
) -> Result<GatedDeltaGradients> {
    let engine = saved.q.engine().clone();
    let s = saved.shape;
    let (time, kd, vd) = (s.time, s.key_dim, s.value_dim);
    let (launch, grads, workspace) = chunk_backward_plan(&s, engine.workspace_bound());
    engine.check_workspace("gated_delta_backward", workspace)?;
    let what = "gated_delta_backward: chunk workspace elements";
    to_u32(what, launch as u64 * chunk_backward_head_bytes(&s) / 4)?;
    to_u32(what, grads as u64 * chunk_grads_scratch(kd, vd))?;
    let f32t = |shape: &[usize], what: &str| Tensor::empty(&engine, shape, DType::F32, what);
    let grads_out = gradient_tensors(saved, d_final_state)?;
    let GatedDeltaGradients {
        query: dq,
        key: dk,
        value: dv,
        beta: dbeta,
        log_decay: dg,
        initial_state: dstate,
    } = &grads_out;
    let chunks = time.div_ceil(CHUNK);
    let ws = f32t(
        &[launch * s.chunk_head_bytes() as usize / 4],
        "gated_delta chunk workspace",
    )?;
    let bws = f32t(
        &[launch * 2 * chunks * (CHUNK + kd) * vd],
        "gated_delta chunk backward workspace",
    )?;
    let sc = f32t(
        &[grads * chunk_grads_scratch(kd, vd) as usize],
        "gated_delta chunk gradient scratch",
    )?;
    let pdq = f32t(&[launch * time * kd], "gated_delta dq partials")?;
    let pdk = f32t(&[launch * time * kd], "gated_delta dk partials")?;
    let unused = Tensor::zeros(&engine, &[1], DType::F32)?;
    let dout = d_output.unwrap_or(&saved.beta);
    let constants = constants(saved.q.dtype(), kd, false);
    let (states, states_constants) = states_kernel(&engine, saved.q.dtype(), kd, false);
    let (dstate_kernel, dstate_constants) = states_kernel(&engine, saved.q.dtype(), kd, true);
    let slices = vd.div_ceil(CHUNK_COLS);
    let group = s.value_heads / s.key_heads;
    let heads = s.batch * s.value_heads;
    for first in (0..heads).step_by(launch) {
        let n = launch.min(heads - first);
        let params = |units: usize, slices: usize, flags: bool, mode: u32| Params {
            units: units as u32,
            slices: slices as u32,
            unit_base: first as u32,
            mode,
            chunks: chunks as u32,
            ..saved_params(saved, flags)
        };
        engine.launch(
            &KERNEL,
            "chunk_prepare",
            &constants,
            &params(n * chunks, 0, false, 0),
            &[
                saved.q.buffer(),
                saved.k.buffer(),
                saved.v.buffer(),
                saved.beta.buffer(),
                saved.log_decay.buffer(),
                ws.buffer(),
            ],
            (n * chunks) as u64,
        )?;
        engine.launch(
            states,
            "chunk_states",
            &states_constants,
            &params(n * slices, slices, true, 1),
            &[
                saved.q.buffer(),
                saved.k.buffer(),
                saved.checkpoints.buffer(),
                unused.buffer(),
                unused.buffer(),
                unused.buffer(),
                ws.buffer(),
                bws.buffer(),
            ],
            (n * slices) as u64,
        )?;
        if d_output.is_some() {
            engine.launch(
                &KERNEL,
                "chunk_pdo",
                &constants,
                &params(n * chunks, 0, true, 0),
                &[
                    saved.q.buffer(),
                    saved.k.buffer(),
                    dout.buffer(),
                    ws.buffer(),
                    bws.buffer(),
                    unused.buffer(),
                ],
                (n * chunks) as u64,
            )?;
        }
        engine.launch(
            dstate_kernel,
            "chunk_dstate",
            &dstate_constants,
            &params(n * slices, slices, d_output.is_some(), 0),
            &[
                saved.q.buffer(),
                saved.k.buffer(),
                dout.buffer(),
                dstate.buffer(),
                ws.buffer(),
                bws.buffer(),
            ],
            (n * slices) as u64,
        )?;
        let units = n * chunks;
        let workgroups = units.min(grads);
        engine.launch(
            &KERNEL,
            "chunk_grads",
            &constants,
            &params(units, workgroups, d_output.is_some(), 0),
            &[
                saved.q.buffer(),
                saved.k.buffer(),
                saved.v.buffer(),
                saved.beta.buffer(),
                dout.buffer(),
                dv.buffer(),
                dbeta.buffer(),
                dg.buffer(),
                ws.buffer(),
                bws.buffer(),
                sc.buffer(),
                pdq.buffer(),
                pdk.buffer(),
            ],
            workgroups as u64,
        )?;
        let threads = n / group * time * kd;
        engine.launch(
            &KERNEL,
            "chunk_sum_heads",
            &constants,
            &params(threads, 0, false, 0),
            &[dq.buffer(), dk.buffer(), pdq.buffer(), pdk.buffer()],
            threads.div_ceil(256) as u64,
        )?;
    }
    Ok(grads_out)
}

/// The six gradients, allocated; the initial state's holds `d_final_state` (or zeros), where
/// the backward walks the state gradient.
fn gradient_tensors(
    saved: &GatedDeltaSaved,
    d_final_state: Option<&Tensor>,
) -> Result<GatedDeltaGradients> {
    let engine = saved.q.engine();
    let s = saved.shape;
    let f32t = |shape: &[usize], what: &str| Tensor::empty(engine, shape, DType::F32, what);
    let qk = [s.batch, s.time, s.key_heads, s.key_dim];
    let state = f32t(
        &[s.batch, s.value_heads, s.key_dim, s.value_dim],
        "gated_delta dinitial_state",
    )?;
    match d_final_state {
        Some(g) => {
            let bytes = state.byte_len();
            engine.record(|enc| enc.copy_buffer_to_buffer(g.buffer(), 0, state.buffer(), 0, bytes));
        }
        None => engine.zero(state.buffer(), state.byte_len()),
    }
    Ok(GatedDeltaGradients {
        query: f32t(&qk, "gated_delta dq")?,
        key: f32t(&qk, "gated_delta dk")?,
        value: f32t(
            &[s.batch, s.time, s.value_heads, s.value_dim],
            "gated_delta dv",
        )?,
        beta: f32t(&[s.batch, s.time, s.value_heads], "gated_delta dbeta")?,
        log_decay: f32t(saved.log_decay.shape(), "gated_delta dlog_decay")?,
        initial_state: state,
    })
}

/// The launch parameters every backward launch shares (the rest zero or one).
fn saved_params(saved: &GatedDeltaSaved, flags: bool) -> Params {
    let s = saved.shape;
    Params {
        batch: s.batch as u32,
        time: s.time as u32,
        key_heads: s.key_heads as u32,
        value_heads: s.value_heads as u32,
        vdim: s.value_dim as u32,
        group: (s.value_heads / s.key_heads) as u32,
        interval: saved.interval as u32,
        checkpoints: s.time.div_ceil(saved.interval) as u32,
        q_off: saved.q_layout.offset as u32,
        q_stride: saved.q_layout.row_stride as u32,
        k_off: saved.k_layout.offset as u32,
        k_stride: saved.k_layout.row_stride as u32,
        v_off: saved.v_layout.offset as u32,
        v_stride: saved.v_layout.row_stride as u32,
        scale: saved.scale,
        flags: u32::from(flags),
        sub: 0,
        units: 0,
        slices: 0,
        unit_base: 0,
        seg: 0,
        sub_interval: 1,
        subs: 1,
        mode: 0,
        chunks: 0,
    }
}
