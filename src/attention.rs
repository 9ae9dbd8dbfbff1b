//! Stable softmax attention: a tiled forward with online softmax and a deterministic,
//! atomic-free backward.
//!
//! `output[b, h, i] = Σ_j softmax_j(scale · q_i·k_j) · v_j` over the keys `j` that query `i`
//! sees, with grouped-query heads (query head `h` reads key/value head `h / (q_heads /
//! kv_heads)`).
//!
//! # Shapes and layouts
//!
//! [`AttentionLayout::BatchHeadSeq`] (the default): query `[batch, q_heads, q_len, head_dim]`,
//! key and value `[batch, kv_heads, k_len, head_dim]`. [`AttentionLayout::BatchSeqHead`]:
//! query `[batch, q_len, q_heads, head_dim]`, key and value `[batch, k_len, kv_heads,
//! head_dim]`, read in place through strides (no copy). The output, the saved F32 output and
//! the gradients have the shapes and layout of the tensors they belong to; the saved row
//! statistics are `[batch, q_heads, q_len]` in either layout.
//!
//! * `q_heads` a multiple of `kv_heads` (≥ 1); head dims every multiple of 8 from 8 to 256;
//!   query and key lengths independent, each at most 2²⁴ (zero allowed).
//! * Query, key and value share one storage dtype (F32, F16 or BF16); the cotangent may have
//!   any float dtype. The output has the query's dtype; the saved output and the statistics
//!   are F32, and so are the gradients unless [`attention_backward_as`] asks for F16/BF16.
//!
//! # Which keys a query sees
//!
//! Query `i` is aligned with key `i + offset`, where `offset` is
//! [`AttentionOptions::causal_offset`] (default `k_len − q_len`: the queries are the last
//! `q_len` positions of the key sequence, as with a cache; `0` is top-left alignment). With
//! `rel = j − i − offset`, key `j` is visible when all of these hold:
//! * `causal`: `rel ≤ 0`;
//! * sliding window: `rel ≥ −window_left` and `rel ≤ window_right` (each side optional);
//! * dilation `d`: `rel` a multiple of `d` (with a window, the dilated neighborhood of
//!   [`AttentionOptions::neighborhood`]: Liger's fused neighborhood attention);
//! * mask: `mask[i, j] ≠ 0` (boolean / u8 semantics, *not* an additive bias).
//!
//! A query with no visible key gets output 0, row maximum and log denominator −∞, and
//! contributes nothing to any gradient (its own gradients are 0).
//!
//! # Masks
//!
//! A mask is a U32 (or I32) tensor with **one 32-bit element per (query, key)**, nonzero =
//! visible, of shape `[q_len, k_len]` (broadcast over batch and heads) or
//! `[mb, mh, q_len, k_len]` with `mb` ∈ {1, batch} and `mh` ∈ {1, q_heads} (broadcast along
//! the axes of size 1). [`mask_from_bools`] and [`mask_from_u8`] build one from host data.
//!
//! # Numerics
//!
//! Scores stay raw (unscaled) in FP32; each row keeps its raw maximum `m` and
//! `l = Σ exp(scale·(s − m))`, subtracting the raw maximum before the scale is applied, and the
//! forward saves `m` and `log l` separately (so a large common score offset costs nothing).
//! Accumulation is FP32 and the saved output is the unrounded FP32 output. The backward uses
//! `P = exp(scale·(s − m) − log l)`, `D = rowsum(dO ∘ O)`, `dS = P ∘ (dO·Vᵀ − D)` and applies
//! the scale to dQ and dK once after accumulation. The scale defaults to `1/sqrt(head_dim)` and
//! must be finite and positive.
//!
//! # Schedule and determinism
//!
//! Every pass works on 64 × 64 tiles with 256 invocations, each computing a 4 × 4 block of
//! scores and 4 rows × `head_dim/16` columns of its accumulators (named registers); operands
//! are staged in workgroup memory in 16-column steps (rows padded, or swizzled in the forward
//! and the dQ pass over stored tiles, against bank conflicts; at most [`WORKGROUP_BYTES`] per
//! workgroup, or [`COMPACT_WORKGROUP_BYTES`] on a device with less: the tiles of probabilities
//! and score gradients then go through workgroup memory 32 columns at a time, the same bits).
//! A head's query blocks are launched from the last one (the longest under a causal mask).
//! Tiles the causal/window band hides entirely are skipped. Forward: one
//! workgroup per (batch, query head, 64-query block), online softmax over 64-key tiles.
//! Backward: a row pass (`D` next to the saved statistics); a pass with one workgroup per
//! (batch, key/value head, 64-key block) that owns those rows of dK and dV and sums over the
//! query heads of its group, then 64-query tiles, then rows, in that fixed order; a pass with
//! one workgroup per 64-query block that owns its rows of dQ and sums over 64-key tiles, then
//! keys, in order. No atomics: reruns are bit-identical.
//!
//! By default nothing quadratic is stored: the dQ pass recomputes each tile's scores and
//! `dO·Vᵀ` (seven score-sized products in the backward); saved state is the inputs, the F32
//! output and two `[batch, q_heads, q_len]` statistics, and the backward's scratch is
//! [`attention_workspace_bytes`] (16 bytes per query row), checked against the engine's
//! workspace bound. [`attention_backward_with`] and [`BackwardSchedule::StoredScores`] trade
//! memory for work: the dK/dV pass also writes each tile's `dS` (16 KiB F32) for a slice of
//! (batch, kv head) groups, and the dQ pass reads it back (five products), slice after slice
//! within a budget; the gradients are the same bits.

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, Constants, Kernel};
use crate::{DType, Engine, Error, Result, Tensor};

/// `wgsl/attention.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "attention",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        include_str!("../wgsl/attention.wgsl"),
    ],
};

/// Query rows and keys per tile (one workgroup owns a tile's rows).
pub const TILE: usize = 64;
/// Workgroup memory the attention kernels declare at most (bytes): a 64 × 64 probability tile
/// and the operand staging, padded against bank conflicts (the backward passes that recompute
/// scores; the forward and the dQ pass over stored score gradients swizzle the same layouts
/// instead, 24 KiB). A device with less takes the compact layout.
pub const WORKGROUP_BYTES: u64 = (1088 + 544) * 16;
/// Workgroup memory of the compact layout (bytes), WebGPU's default limit: every pass swizzled,
/// the tile held 32 columns at a time (the same products in the same order: the same bits).
/// Devices with less are refused (`LimitExceeded`) before anything is launched.
pub const COMPACT_WORKGROUP_BYTES: u64 = (512 + 512) * 16;
/// Largest head dim.
pub const MAX_HEAD_DIM: usize = 256;
/// Largest query or key length.
pub const MAX_LEN: usize = 1 << 24;
/// Window extents and offsets at or past this are unbounded.
const UNBOUNDED: i64 = 1 << 30;

/// Memory layout of query, key and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionLayout {
    /// `[batch, heads, sequence, head_dim]`.
    #[default]
    BatchHeadSeq,
    /// `[batch, sequence, heads, head_dim]`, read through strides.
    BatchSeqHead,
}

/// Options of [`attention_forward`]. `Default` is full (non-causal) attention, scale
/// `1/sqrt(head_dim)`, `[batch, heads, sequence, head_dim]`.
#[derive(Debug, Clone, Default)]
pub struct AttentionOptions {
    /// Key `j` is hidden from query `i` when `j > i + offset`.
    pub causal: bool,
    /// The diagonal used by `causal` and the window: query `i` is aligned with key
    /// `i + offset`. `None` (default) = `k_len − q_len`; `Some(0)` = top-left. At most 2²⁴ in
    /// magnitude.
    pub causal_offset: Option<i64>,
    /// Score scale; `None` (default) = `1/sqrt(head_dim)`. Finite and positive.
    pub scale: Option<f64>,
    /// Boolean mask, one U32/I32 element per (query, key), nonzero = visible; see the module
    /// documentation for the accepted shapes.
    pub mask: Option<Tensor>,
    /// Sliding window: keys more than this many positions left of the diagonal are hidden.
    pub window_left: Option<usize>,
    /// Sliding window: keys more than this many positions right of the diagonal are hidden.
    pub window_right: Option<usize>,
    /// Dilation: only keys a multiple of this many positions from the diagonal are visible.
    /// `None` (default) = 1; at least 1 and at most 2²⁴.
    pub dilation: Option<usize>,
    /// Layout of query, key and value (and of the output and gradients).
    pub layout: AttentionLayout,
}

impl AttentionOptions {
    /// Neighborhood attention (Liger's fused neighborhood attention): query `i` sees the keys
    /// `j` with `|rel| ≤ (kernel_size / 2)·dilation` and `rel` a multiple of `dilation`
    /// (`rel = j − i − offset`; at the sequence's ends the neighborhood is cut, not shifted).
    /// Errors: an even or zero `kernel_size`, a zero `dilation`, or a reach past `usize`
    /// (`InvalidValue`; a reach past 2²⁴ acts as unbounded, and a dilation past 2²⁴ is refused
    /// by the forward).
    pub fn neighborhood(kernel_size: usize, dilation: usize) -> Result<AttentionOptions> {
        if kernel_size.is_multiple_of(2) {
            return Err(Error::InvalidValue {
                what: "attention: neighborhood kernel_size".into(),
                got: kernel_size as f64,
                rule: "odd".into(),
            });
        }
        let reach = (kernel_size / 2)
            .checked_mul(dilation)
            .filter(|_| dilation > 0);
        let Some(reach) = reach else {
            return Err(Error::InvalidValue {
                what: "attention: neighborhood dilation".into(),
                got: dilation as f64,
                rule: "at least 1, with (kernel_size / 2)·dilation within usize".into(),
            });
        };
        Ok(AttentionOptions {
            window_left: Some(reach),
            window_right: Some(reach),
            dilation: Some(dilation),
            ..AttentionOptions::default()
        })
    }
}

/// What the backward needs: the inputs, the unrounded F32 output and the row statistics.
#[derive(Debug, Clone)]
pub struct AttentionSaved {
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Option<Tensor>,
    output_f32: Tensor,
    row_max: Tensor,
    log_denominator: Tensor,
    plan: Plan,
}

impl AttentionSaved {
    /// The unrounded output, F32, in the query's shape and layout (for an F32 query, the same
    /// tensor as the returned output: no second copy is kept).
    pub fn output_f32(&self) -> &Tensor {
        &self.output_f32
    }
    /// Raw (unscaled) maximum score of each query row, `[batch, q_heads, q_len]`, F32
    /// (−∞ for a row that sees no key).
    pub fn row_max(&self) -> &Tensor {
        &self.row_max
    }
    /// `log Σ_j exp(scale·(s_j − row_max))` of each query row, `[batch, q_heads, q_len]`, F32
    /// (−∞ for a row that sees no key).
    pub fn log_denominator(&self) -> &Tensor {
        &self.log_denominator
    }
    /// The scale that was applied.
    pub fn scale(&self) -> f32 {
        self.plan.scale
    }
    /// The diagonal offset that was used (resolved default).
    pub fn causal_offset(&self) -> i64 {
        i64::from(self.plan.offset)
    }
}

/// Gradients of [`attention_backward`] (F32) or [`attention_backward_as`] (its dtype), in the
/// shapes and layout of the inputs.
#[derive(Debug, Clone)]
pub struct AttentionGradients {
    /// d loss / d query.
    pub query: Tensor,
    /// d loss / d key (summed over the query heads sharing each key/value head).
    pub key: Tensor,
    /// d loss / d value (summed likewise).
    pub value: Tensor,
}

/// Resolved shape, strides and visibility of one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Plan {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    k_len: usize,
    head_dim: usize,
    q_strides: [usize; 3],
    k_strides: [usize; 3],
    m_strides: [usize; 3],
    offset: i32,
    lo: i32,
    hi: i32,
    scale: f32,
    dtype: DType,
    /// Dual-chunk partition: chunk length (0: none) and branch (`crate::dual_chunk`).
    pub(crate) chunk_len: u32,
    pub(crate) branch: u32,
    dilation: u32,
}

#[derive(encase::ShaderType, Default)]
struct Params {
    batch: u32,
    q_heads: u32,
    kv_heads: u32,
    q_len: u32,
    k_len: u32,
    group: u32,
    q_sb: u32,
    q_sh: u32,
    q_ss: u32,
    k_sb: u32,
    k_sh: u32,
    k_ss: u32,
    m_sb: u32,
    m_sh: u32,
    m_sq: u32,
    has_mask: u32,
    offset: i32,
    lo: i32,
    hi: i32,
    scale: f32,
    rows: u32,
    same_output: u32,
    first_group: u32,
    groups: u32,
    chunk_len: u32,
    branch: u32,
    dilation: u32,
}

impl Plan {
    fn params(&self, has_mask: bool) -> Params {
        let [q_sb, q_sh, q_ss] = self.q_strides.map(|s| s as u32);
        let [k_sb, k_sh, k_ss] = self.k_strides.map(|s| s as u32);
        let [m_sb, m_sh, m_sq] = self.m_strides.map(|s| s as u32);
        Params {
            batch: self.batch as u32,
            q_heads: self.q_heads as u32,
            kv_heads: self.kv_heads as u32,
            q_len: self.q_len as u32,
            k_len: self.k_len as u32,
            group: (self.q_heads / self.kv_heads.max(1)) as u32,
            q_sb,
            q_sh,
            q_ss,
            k_sb,
            k_sh,
            k_ss,
            m_sb,
            m_sh,
            m_sq,
            has_mask: u32::from(has_mask),
            offset: self.offset,
            lo: self.lo,
            hi: self.hi,
            scale: self.scale,
            rows: self.rows() as u32,
            same_output: u32::from(self.dtype == DType::F32),
            first_group: 0,
            groups: (self.batch * self.kv_heads) as u32,
            chunk_len: self.chunk_len,
            branch: self.branch,
            dilation: self.dilation,
        }
    }

    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    pub(crate) fn q_heads(&self) -> usize {
        self.q_heads
    }

    pub(crate) fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub(crate) fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub(crate) fn q_len(&self) -> usize {
        self.q_len
    }

    pub(crate) fn k_len(&self) -> usize {
        self.k_len
    }

    pub(crate) fn rows(&self) -> usize {
        self.batch * self.q_heads * self.q_len
    }

    fn constants(&self, d_output: DType) -> Constants {
        vec![
            ("DT", f64::from(self.dtype.code())),
            ("DTO", f64::from(d_output.code())),
            ("HD", self.head_dim as f64),
        ]
    }
}

/// `constants` with the workgroup memory layout of `entry` (`PADDED` and `P_COLS` in the
/// kernel) and its order of query blocks (`LAST_FIRST`). The layouts hold the same values, so
/// the bits do not depend on them; measured on an H200 (`notes/attention.md`, tenth round): the
/// swizzled layout's smaller footprint makes the forward 10–20% faster and takes 1.7–3.8% off
/// the stored schedule's forward+backward through its dQ pass, while the passes that recompute
/// scores in the backward are about 2% faster with the padded layout's constant offsets. On a
/// device with less than [`WORKGROUP_BYTES`] of workgroup memory every pass takes the compact
/// layout ([`COMPACT_WORKGROUP_BYTES`]).
fn with_layout(mut constants: Constants, entry: &str, engine: &Engine) -> Constants {
    let compact = workgroup_limit(engine) < WORKGROUP_BYTES;
    let swizzled = compact || matches!(entry, "attention_forward" | "attention_dq_stored");
    constants.push(("PADDED", if swizzled { 0.0 } else { 1.0 }));
    constants.push(("P_COLS", if compact { 32.0 } else { TILE as f64 }));
    let ascending = FORCED_ASCENDING.with(std::cell::Cell::get);
    constants.push(("LAST_FIRST", if ascending { 0.0 } else { 1.0 }));
    constants
}

thread_local! {
    static FORCED_ASCENDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Launches query blocks in increasing order (`true`) instead of the last block of a head
/// first, for kernels planned from the calling thread. The bits do not change. For
/// measurements.
#[doc(hidden)]
pub fn force_ascending_blocks(ascending: bool) {
    FORCED_ASCENDING.with(|f| f.set(ascending));
}

fn workgroup_limit(engine: &Engine) -> u64 {
    u64::from(engine.info().limits.max_compute_workgroup_storage_size)
}

/// Strides (batch, head, sequence) of a 4-axis tensor in `layout`, and its
/// (batch, heads, sequence, head_dim).
fn dims(shape: &[usize], layout: AttentionLayout) -> ([usize; 4], [usize; 3]) {
    let [a, b, c, d] = [shape[0], shape[1], shape[2], shape[3]];
    match layout {
        AttentionLayout::BatchHeadSeq => ([a, b, c, d], [b * c * d, c * d, d]),
        AttentionLayout::BatchSeqHead => ([a, c, b, d], [b * c * d, d, c * d]),
    }
}

fn float_dtype(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, t.dtype(), &DType::FLOATS))
    }
}

fn rank4(t: &Tensor, what: &str) -> Result<()> {
    if t.shape().len() == 4 {
        return Ok(());
    }
    // Only the rank is wrong: the expected shape has four (free) axes.
    Err(Error::ShapeMismatch {
        what: format!("{what}: rank (a 4-axis tensor)"),
        expected: vec![0; 4],
        got: t.shape().to_vec(),
    })
}

/// Check every input of a forward and resolve its plan.
pub(crate) fn plan(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    options: &AttentionOptions,
) -> Result<Plan> {
    let engine = query.engine();
    key.check_engine(engine, "attention: key")?;
    value.check_engine(engine, "attention: value")?;
    let wg_limit = workgroup_limit(engine);
    if wg_limit < COMPACT_WORKGROUP_BYTES {
        return Err(Error::LimitExceeded {
            what: "attention: workgroup memory".into(),
            bytes: COMPACT_WORKGROUP_BYTES,
            limit: wg_limit,
            limit_name: "max_compute_workgroup_storage_size",
        });
    }
    float_dtype(query, "attention: query")?;
    if key.dtype() != query.dtype() {
        return Err(Error::dtype(
            "attention: key",
            key.dtype(),
            &[query.dtype()],
        ));
    }
    if value.dtype() != query.dtype() {
        return Err(Error::dtype(
            "attention: value",
            value.dtype(),
            &[query.dtype()],
        ));
    }
    let layout = options.layout;
    rank4(query, "attention: query")?;
    rank4(key, "attention: key")?;
    if value.shape() != key.shape() {
        return Err(Error::shape("attention: value", key.shape(), value.shape()));
    }
    let ([batch, q_heads, q_len, head_dim], q_strides) = dims(query.shape(), layout);
    let ([k_batch, kv_heads, k_len, k_dim], k_strides) = dims(key.shape(), layout);
    if k_batch != batch || k_dim != head_dim {
        let mut expected = key.shape().to_vec();
        expected[0] = batch;
        expected[3] = head_dim;
        return Err(Error::shape("attention: key", &expected, key.shape()));
    }
    if !(8..=MAX_HEAD_DIM).contains(&head_dim) {
        return Err(Error::bounds(
            "attention: head_dim",
            head_dim as u64,
            8,
            MAX_HEAD_DIM as u64,
        ));
    }
    if head_dim % 8 != 0 {
        return Err(Error::InvalidValue {
            what: "attention: head_dim".into(),
            got: head_dim as f64,
            rule: "a multiple of 8 from 8 to 256".into(),
        });
    }
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(Error::InvalidValue {
            what: "attention: query heads".into(),
            got: q_heads as f64,
            rule: format!("a multiple of the key/value heads ({kv_heads})"),
        });
    }
    for (what, len) in [("attention: q_len", q_len), ("attention: k_len", k_len)] {
        if len > MAX_LEN {
            return Err(Error::bounds(what, len as u64, 0, MAX_LEN as u64));
        }
    }
    for (what, t) in [("attention: query", query), ("attention: key", key)] {
        if t.len() as u64 > u64::from(u32::MAX) {
            return Err(Error::bounds(
                format!("{what}: elements"),
                t.len() as u64,
                0,
                u64::from(u32::MAX),
            ));
        }
    }
    let offset = options.causal_offset.unwrap_or(k_len as i64 - q_len as i64);
    if offset.unsigned_abs() > MAX_LEN as u64 {
        return Err(Error::InvalidValue {
            what: "attention: causal_offset".into(),
            got: offset as f64,
            rule: format!("at most {MAX_LEN} in magnitude"),
        });
    }
    let scale = options.scale.unwrap_or(1.0 / (head_dim as f64).sqrt());
    if !(scale.is_finite() && scale > 0.0 && (scale as f32).is_normal()) {
        return Err(Error::InvalidValue {
            what: "attention: scale".into(),
            got: scale,
            rule: "finite, positive and a normal f32".into(),
        });
    }
    let dilation = options.dilation.unwrap_or(1);
    if !(1..=MAX_LEN).contains(&dilation) {
        return Err(Error::InvalidValue {
            what: "attention: dilation".into(),
            got: dilation as f64,
            rule: format!("from 1 to {MAX_LEN}"),
        });
    }
    let clamp = |w: Option<usize>| w.map_or(UNBOUNDED, |w| (w as i64).min(UNBOUNDED));
    let lo = -clamp(options.window_left);
    let mut hi = clamp(options.window_right);
    if options.causal {
        hi = hi.min(0);
    }
    let mut m_strides = [0; 3];
    if let Some(mask) = &options.mask {
        mask.check_engine(engine, "attention: mask")?;
        if !matches!(mask.dtype(), DType::U32 | DType::I32) {
            return Err(Error::dtype(
                "attention: mask",
                mask.dtype(),
                &[DType::U32, DType::I32],
            ));
        }
        let s = mask.shape();
        let ok = match s.len() {
            2 => s == [q_len, k_len],
            4 => {
                (s[0] == 1 || s[0] == batch)
                    && (s[1] == 1 || s[1] == q_heads)
                    && s[2] == q_len
                    && s[3] == k_len
            }
            _ => false,
        };
        if !ok {
            let expected = if s.len() == 4 {
                vec![
                    s[0].min(batch).max(1),
                    s[1].min(q_heads).max(1),
                    q_len,
                    k_len,
                ]
            } else {
                vec![q_len, k_len]
            };
            return Err(Error::shape("attention: mask", &expected, s));
        }
        if mask.len() as u64 > u64::from(u32::MAX) {
            return Err(Error::bounds(
                "attention: mask elements",
                mask.len() as u64,
                0,
                u64::from(u32::MAX),
            ));
        }
        let (mb, mh) = if s.len() == 4 { (s[0], s[1]) } else { (1, 1) };
        let plane = q_len * k_len;
        m_strides = [
            if mb == 1 { 0 } else { mh * plane },
            if mh == 1 { 0 } else { plane },
            k_len,
        ];
    }
    Ok(Plan {
        batch,
        q_heads,
        kv_heads,
        q_len,
        k_len,
        head_dim,
        q_strides,
        k_strides,
        m_strides,
        offset: offset as i32,
        lo: lo as i32,
        hi: hi as i32,
        scale: scale as f32,
        dtype: query.dtype(),
        chunk_len: 0,
        branch: 0,
        dilation: dilation as u32,
    })
}

/// Forward attention. Returns the output (query's dtype, shape and layout) and what the
/// backward needs. Errors, all before anything is launched: tensors of other engines
/// (`EngineMismatch`); a non-float query or a key/value of another dtype, a mask that is not
/// U32/I32 (`UnsupportedDType`); ranks, batch or head dim that differ, a value shaped unlike
/// the key, a mask of another shape (`ShapeMismatch`); a head dim outside 8..=256 or a length
/// past 2²⁴ (`OutOfBounds`); a head dim not a multiple of 8, query heads not a multiple of
/// key/value heads, a bad scale or offset (`InvalidValue`); outputs past the binding limit, or
/// a device with less workgroup memory than [`COMPACT_WORKGROUP_BYTES`] (`LimitExceeded`).
pub fn attention_forward(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    options: &AttentionOptions,
) -> Result<(Tensor, AttentionSaved)> {
    let plan = plan(query, key, value, options)?;
    let output = Tensor::empty(
        query.engine(),
        query.shape(),
        plan.dtype,
        "attention output",
    )?;
    let saved = forward_planned(query, key, value, options.mask.as_ref(), plan, &output)?;
    Ok((output, saved))
}

/// The forward of a checked `plan` into `output` (query's shape and dtype): the saved context,
/// whose F32 output is `output` itself for an F32 query.
pub(crate) fn forward_planned(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    mask: Option<&Tensor>,
    plan: Plan,
    output: &Tensor,
) -> Result<AttentionSaved> {
    let engine = query.engine();
    let stats_shape = [plan.batch, plan.q_heads, plan.q_len];
    // An F32 output is the saved output itself (tensors are immutable): the kernel writes it
    // once and the unused binding gets a one-word placeholder.
    let output_f32 = if plan.dtype == DType::F32 {
        output.clone()
    } else {
        Tensor::empty(engine, query.shape(), DType::F32, "attention saved output")?
    };
    let placeholder;
    let output_f32_binding = if plan.dtype == DType::F32 {
        placeholder = Tensor::empty(engine, &[1], DType::F32, "attention placeholder")?;
        placeholder.buffer()
    } else {
        output_f32.buffer()
    };
    let row_max = Tensor::empty(engine, &stats_shape, DType::F32, "attention row max")?;
    let log_denominator = Tensor::empty(engine, &stats_shape, DType::F32, "attention log den")?;
    let mask_buffer = mask.unwrap_or(query).buffer();
    engine.launch(
        &KERNEL,
        "attention_forward",
        &with_layout(plan.constants(DType::F32), "attention_forward", engine),
        &plan.params(mask.is_some()),
        &[
            query.buffer(),
            key.buffer(),
            value.buffer(),
            mask_buffer,
            output.buffer(),
            output_f32_binding,
            row_max.buffer(),
            log_denominator.buffer(),
        ],
        (plan.batch * plan.q_heads * plan.q_len.div_ceil(TILE)) as u64,
    )?;
    Ok(AttentionSaved {
        query: query.clone(),
        key: key.clone(),
        value: value.clone(),
        mask: mask.cloned(),
        output_f32,
        row_max,
        log_denominator,
        plan,
    })
}

impl AttentionSaved {
    /// The context of `self`'s query, keys and plan with another F32 output and row statistics
    /// (a dual-chunk branch under the merged softmax).
    pub(crate) fn with_statistics(&self, from: &AttentionSaved) -> AttentionSaved {
        AttentionSaved {
            output_f32: from.output_f32.clone(),
            row_max: from.row_max.clone(),
            log_denominator: from.log_denominator.clone(),
            ..self.clone()
        }
    }

    pub(crate) fn plan(&self) -> &Plan {
        &self.plan
    }
}

/// Merges the F32 output and row statistics of `src` (attention over other keys of the same
/// queries) into `acc`'s, in place: the results of attention over both key sets
/// (`attention_merge` for the outputs, then `attention_merge_rows` for the statistics); with
/// `output` (a 16-bit call's last merge) also the rounded output.
pub(crate) fn merge_into(
    acc: &AttentionSaved,
    src: &AttentionSaved,
    output: Option<&Tensor>,
) -> Result<()> {
    let engine = acc.query.engine();
    let plan = &acc.plan;
    let placeholder;
    let output_binding = match output {
        Some(t) => t.buffer(),
        None => {
            placeholder = Tensor::empty(engine, &[1], DType::F32, "attention placeholder")?;
            placeholder.buffer()
        }
    };
    let params = Params {
        same_output: u32::from(output.is_none()),
        ..plan.params(false)
    };
    let stats = [
        src.row_max.buffer(),
        src.log_denominator.buffer(),
        acc.row_max.buffer(),
        acc.log_denominator.buffer(),
    ];
    let values = (plan.rows() * plan.head_dim / 2) as u64;
    engine.launch(
        &KERNEL,
        "attention_merge",
        &plan.constants(DType::F32),
        &params,
        &[
            output_binding,
            src.output_f32.buffer(),
            stats[0],
            stats[1],
            acc.output_f32.buffer(),
            stats[2],
            stats[3],
        ],
        values.div_ceil(256),
    )?;
    engine.launch(
        &KERNEL,
        "attention_merge_rows",
        &plan.constants(DType::F32),
        &params,
        &stats,
        (plan.rows() as u64).div_ceil(256),
    )
}

/// `acc += src`, elementwise over two F32 tensors of one length and engine (`attention_add`;
/// the gradient sums of dual chunk attention and of attention graphs).
pub(crate) fn add_tensors(acc: &Tensor, src: &Tensor) -> Result<()> {
    debug_assert_eq!((acc.len(), acc.dtype()), (src.len(), src.dtype()));
    let rows = u32::try_from(acc.len())
        .map_err(|_| Error::bounds("attention_add: elements", acc.len() as u64, 0, 1 << 32))?;
    let params = Params {
        rows,
        ..Params::default()
    };
    acc.engine().launch(
        &KERNEL,
        "attention_add",
        &vec![],
        &params,
        &[src.buffer(), acc.buffer()],
        u64::from(rows).div_ceil(256),
    )
}

/// Scratch bytes [`attention_backward`] allocates beyond its gradients (16 bytes per query
/// row: the row statistics and `D = rowsum(dO ∘ O)`); the forward allocates none.
pub fn attention_workspace_bytes(batch: usize, q_heads: usize, q_len: usize) -> u64 {
    16 * (batch as u64) * (q_heads as u64) * (q_len as u64)
}

/// Backward attention: gradients of the loss with respect to query, key and value, given the
/// cotangent of the output (`d_output`: the query's shape, any float dtype). Errors: another
/// engine (`EngineMismatch`), a non-float cotangent (`UnsupportedDType`), another shape
/// (`ShapeMismatch`), scratch past the engine's workspace bound (`WorkspaceExceeded`).
pub fn attention_backward(saved: &AttentionSaved, d_output: &Tensor) -> Result<AttentionGradients> {
    attention_backward_as(saved, d_output, DType::F32)
}

/// [`attention_backward`] with the gradients stored in `dtype`: F32 gives that function's
/// result; F16 or BF16 gives each F32 gradient value rounded once to nearest-even (bit for bit
/// `cast::cast` of it; a NaN stays a NaN, its payload may differ), written directly by the
/// passes that own the rows (the accumulation is unchanged: FP32, the same order). Errors:
/// those of [`attention_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn attention_backward_as(
    saved: &AttentionSaved,
    d_output: &Tensor,
    dtype: DType,
) -> Result<AttentionGradients> {
    attention_backward_with(saved, d_output, dtype, BackwardSchedule::Recompute)
}

/// How the backward's dQ pass gets the score gradients `dS = P ∘ (dO·Vᵀ − D)` of its tiles.
/// Every schedule gives the same gradients, bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackwardSchedule {
    /// Recomputed from Q·Kᵀ and dO·Vᵀ (seven score-sized products in the backward; scratch
    /// O(rows), [`attention_workspace_bytes`]). The default.
    Recompute,
    /// Stored by the dK/dV pass and read back by the dQ pass (five products): F32 tiles of
    /// 64 × 64 (16 KiB) for every tile of a slice of (batch, kv head) groups, as few slices as
    /// `budget` bytes allow (the scratch buffer as the engine allocates it, rounded up to its
    /// pool's size class, within the budget), evened out (the budget capped by what the
    /// engine's workspace bound leaves and by one binding; at least one group must fit:
    /// `WorkspaceExceeded` otherwise; see [`stored_scores_bytes_per_group`]). Its dK/dV pass
    /// binds nine storage buffers: on a device with fewer (WebGPU's default 8) the backward
    /// recomputes instead, which gives the same bits with less memory.
    StoredScores {
        /// Bytes the score-gradient tiles of one slice may take.
        budget: u64,
    },
}

/// Bytes of score-gradient tiles one (batch, kv head) group needs under
/// [`BackwardSchedule::StoredScores`]: 16 KiB per 64 × 64 tile of each of its query heads
/// (every tile, the ones the causal band or window skips included).
pub fn stored_scores_bytes_per_group(
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    k_len: usize,
) -> u64 {
    let group = (q_heads / kv_heads.max(1)) as u64;
    group * q_len.div_ceil(TILE) as u64 * k_len.div_ceil(TILE) as u64 * TILE_BYTES
}

/// Bytes of one stored score-gradient tile (64 × 64 F32).
const TILE_BYTES: u64 = (TILE * TILE * 4) as u64;

/// [`attention_backward_as`] with the dQ pass's `schedule`. Errors: those of
/// [`attention_backward_as`]; with [`BackwardSchedule::StoredScores`], a budget (or what the
/// workspace bound leaves of it) below one group's tiles (`WorkspaceExceeded`).
pub fn attention_backward_with(
    saved: &AttentionSaved,
    d_output: &Tensor,
    dtype: DType,
    schedule: BackwardSchedule,
) -> Result<AttentionGradients> {
    let engine: &Engine = saved.query.engine();
    d_output.check_engine(engine, "attention_backward: d_output")?;
    float_dtype(d_output, "attention_backward: d_output")?;
    if !dtype.is_float() {
        return Err(Error::dtype(
            "attention_backward_as: dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    if d_output.shape() != saved.query.shape() {
        return Err(Error::shape(
            "attention_backward: d_output",
            saved.query.shape(),
            d_output.shape(),
        ));
    }
    let plan = &saved.plan;
    let own = attention_workspace_bytes(plan.batch, plan.q_heads, plan.q_len);
    engine.check_workspace("attention_backward", own)?;
    let groups = plan.batch * plan.kv_heads;
    // Groups a slice under the stored schedule (None: recompute, also where the device has
    // fewer storage buffers than `attention_dkdv_store` binds).
    let stored_fits = engine.require_storage_buffers(9).is_ok();
    let slice = match schedule {
        BackwardSchedule::StoredScores { .. } if !stored_fits => None,
        BackwardSchedule::Recompute => None,
        BackwardSchedule::StoredScores { budget } => {
            let per_group =
                stored_scores_bytes_per_group(plan.q_heads, plan.kv_heads, plan.q_len, plan.k_len);
            let room = budget
                .min(engine.workspace_bound() - own)
                .min(engine.max_binding_bytes());
            // Groups whose tiles fit the room as the engine allocates them (its pool rounds a
            // buffer up to a size class).
            let mut fit = room
                .checked_div(per_group)
                .unwrap_or(u64::MAX)
                .min(groups.max(1) as u64);
            while fit > 0 && per_group > 0 && crate::engine::size_class(fit * per_group) > room {
                fit -= 1;
            }
            if fit == 0 {
                return Err(Error::WorkspaceExceeded {
                    what: "attention_backward: score-gradient tiles of one (batch, kv head) group"
                        .to_string(),
                    needed: own + per_group,
                    bound: own + room,
                });
            }
            // As few slices as fit, evened out (no short last slice).
            let fit = fit as usize;
            let slices = groups.div_ceil(fit).max(1);
            Some(groups.div_ceil(slices).max(1))
        }
    };
    let d_query = Tensor::empty(engine, saved.query.shape(), dtype, "attention d_query")?;
    let d_key = Tensor::empty(engine, saved.key.shape(), dtype, "attention d_key")?;
    let d_value = Tensor::empty(engine, saved.key.shape(), dtype, "attention d_value")?;
    let row_info = Tensor::empty(engine, &[plan.rows(), 4], DType::F32, "attention row info")?;
    let mut constants = plan.constants(d_output.dtype());
    constants.push(("DTG", f64::from(dtype.code())));
    let params = plan.params(saved.mask.is_some());
    let mask_buffer = saved.mask.as_ref().unwrap_or(&saved.query).buffer();
    engine.launch(
        &KERNEL,
        "attention_delta",
        &constants,
        &params,
        &[
            d_output.buffer(),
            saved.output_f32.buffer(),
            saved.row_max.buffer(),
            saved.log_denominator.buffer(),
            row_info.buffer(),
        ],
        (plan.rows() as u64).div_ceil(16),
    )?;
    let (k_tiles, q_tiles) = (plan.k_len.div_ceil(TILE), plan.q_len.div_ceil(TILE));
    // Buffers of the dK/dV pass (then the stored tiles) and of the dQ pass (then its rows).
    let (q, k, v, go) = (
        saved.query.buffer(),
        saved.key.buffer(),
        saved.value.buffer(),
        d_output.buffer(),
    );
    let dkdv_buffers = [q, k, v, mask_buffer, go, row_info.buffer(), d_key.buffer()];
    let Some(per_slice) = slice else {
        let mut buffers = dkdv_buffers.to_vec();
        buffers.push(d_value.buffer());
        let launches = [
            ("attention_dkdv", buffers, groups * k_tiles),
            (
                "attention_dq",
                vec![
                    q,
                    k,
                    v,
                    mask_buffer,
                    go,
                    row_info.buffer(),
                    d_query.buffer(),
                ],
                plan.batch * plan.q_heads * q_tiles,
            ),
        ];
        for (entry, buffers, workgroups) in launches {
            engine.launch(
                &KERNEL,
                entry,
                &with_layout(constants.clone(), entry, engine),
                &params,
                &buffers,
                workgroups as u64,
            )?;
        }
        return Ok(AttentionGradients {
            query: d_query,
            key: d_key,
            value: d_value,
        });
    };
    // Stored schedule: per slice of groups, the dK/dV pass writes the tiles, the dQ pass reads
    // them; the next slice reuses the scratch.
    let per_group =
        stored_scores_bytes_per_group(plan.q_heads, plan.kv_heads, plan.q_len, plan.k_len);
    let words = (per_slice as u64 * per_group / 4).max(4) as usize;
    let tiles = Tensor::empty(engine, &[words], DType::F32, "attention score gradients")?;
    let mut store_buffers = dkdv_buffers.to_vec();
    store_buffers.extend([d_value.buffer(), tiles.buffer()]);
    let read_buffers = [q, k, v, go, d_query.buffer(), tiles.buffer()];
    let group = plan.q_heads / plan.kv_heads.max(1);
    for first in (0..groups).step_by(per_slice) {
        let count = per_slice.min(groups - first);
        let params = Params {
            first_group: first as u32,
            groups: count as u32,
            ..plan.params(saved.mask.is_some())
        };
        let launches = [
            ("attention_dkdv_store", &store_buffers[..], count * k_tiles),
            (
                "attention_dq_stored",
                &read_buffers[..],
                count * group * q_tiles,
            ),
        ];
        for (entry, buffers, workgroups) in launches {
            engine.launch(
                &KERNEL,
                entry,
                &with_layout(constants.clone(), entry, engine),
                &params,
                buffers,
                workgroups as u64,
            )?;
        }
    }
    Ok(AttentionGradients {
        query: d_query,
        key: d_key,
        value: d_value,
    })
}

/// A mask tensor (U32, one element per entry, 1 = visible) from booleans; `shape` as
/// [`AttentionOptions::mask`] accepts.
pub fn mask_from_bools(engine: &Engine, visible: &[bool], shape: &[usize]) -> Result<Tensor> {
    let words: Vec<u32> = visible.iter().map(|&v| u32::from(v)).collect();
    Tensor::from_slice(engine, &words, shape)
}

/// A mask tensor (U32, one element per entry) from u8 values, nonzero = visible.
pub fn mask_from_u8(engine: &Engine, visible: &[u8], shape: &[usize]) -> Result<Tensor> {
    let words: Vec<u32> = visible.iter().map(|&v| u32::from(v != 0)).collect();
    Tensor::from_slice(engine, &words, shape)
}

/// Floating-point operations of one forward (`4·d` per visible (query, key) pair of every
/// query head: two matrix products), counting every pair as visible when `causal` is false
/// and about half of them (the exact count for square causal attention) when it is true. The
/// backward does 2.5× the forward's work (five products instead of two).
pub fn attention_flops(
    batch: usize,
    q_heads: usize,
    q_len: usize,
    k_len: usize,
    head_dim: usize,
    causal: bool,
) -> f64 {
    let pairs = if causal {
        // Default offset: query i sees keys 0..=i + k_len − q_len.
        (0..q_len)
            .map(|i| (i + k_len + 1).saturating_sub(q_len).min(k_len) as f64)
            .sum::<f64>()
    } else {
        (q_len * k_len) as f64
    };
    4.0 * (batch * q_heads) as f64 * pairs * head_dim as f64
}
