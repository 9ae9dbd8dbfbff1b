//! Normalization: RMSNorm, LayerNorm, fused add+RMSNorm, modulated (AdaLN) RMSNorm, GroupNorm,
//! PolyNorm and DyT, forward and backward.
//!
//! Inputs are rows × columns: the last axis is the normalized one, leading axes flatten to
//! rows ([`group_norm`] views `[samples, channels, ...]` as (sample, group) rows). Sources
//! (and residuals) may be F32, F16 or BF16; weights, biases, modulation and cotangents may use
//! any of the three independently. Statistics, accumulation and every
//! gradient are FP32; outputs take the source's dtype.
//!
//! Bounds (checked before anything is launched; each breach is a typed [`Error`]):
//! * rows ≥ 1 (**zero rows is an error**, `OutOfBounds`: a normalization of nothing has no
//!   statistics to save) and columns in `1..=`[`MAX_COLUMNS`], any width (odd included);
//!   `rows × columns` FP32 values (the source gradient) must fit one storage binding
//!   (`LimitExceeded`; on a 128 MiB binding that is 33,554,432 elements) and `u32` indexing;
//! * weight and bias of shape `[columns]`; residual and cotangents of the source's shape;
//!   modulation scale/shift of shape `[batches, columns]` with `batches` dividing the rows;
//! * ε positive and finite in FP32 (default 1e-5), weight offset finite (`InvalidValue`).
//!
//! Kernels (`wgsl/norm.wgsl`):
//! * Register paths (RMSNorm, LayerNorm, add+RMSNorm; rows of whole chunks of 4 F32 or 8
//!   16-bit values, residual and cotangents in the source's dtype): a workgroup holds a row in
//!   named registers, at most [`REGISTER_CHUNKS`] chunks a lane, and reads it once. The forward
//!   takes 256, 512 ([`KERNEL_MID`]) or 1,024 lanes ([`KERNEL_WIDE`]) as [`forward_lanes`]
//!   says (about four chunks a lane; LayerNorm at most 512 where it fits; add+RMSNorm about
//!   two), within what the adapter allows, up to 32,768 F32 / 65,536 16-bit columns;
//!   LayerNorm's takes Σ (x − p) and Σ (x − p)² about the mean p of the row's first chunk in one
//!   pair sum, and sums the centered squares in a second pass only where their difference would
//!   cancel more than two bits. Rows of at most [`REGISTER_CHUNKS`] chunks a lane of the
//!   adapter's subgroup (1,024 F32 / 2,048 16-bit values on 32-lane subgroups) are taken in
//!   segments instead ([`force_segments`]): a row per run of subgroup-width lanes, 256 /
//!   width rows a workgroup, the row sums by shuffles within the run (no workgroup memory, no
//!   barrier; not add+RMSNorm of F32 sources); GroupNorm's register backward likewise, which
//!   then also takes its per-channel parameter partials from the registers. The
//!   backward splits the rows into at most [`REGISTER_BLOCKS`] blocks, one workgroup each: per
//!   row it loads x and dy once, computes the row constants, writes dx and adds the weight
//!   (and bias) partials of its columns in registers; the blocks' partial rows are summed in
//!   block order. In segments (the same rows as the forwards', every kind) each segment takes
//!   its share of the block's rows in turn and the segments' partials are added in segment
//!   order (workgroup memory) into the block's. 256 lanes (512 where [`mid_backward`] says)
//!   up to 8,192 / 16,384 columns;
//!   for RMSNorm and add+RMSNorm 1,024 lanes that read the row a second time for dx (mostly
//!   from cache) up to 16,384 / 32,768 (RMSNorm of F32 sources up to 32,768: 8 chunks a lane),
//!   except add+RMSNorm of 16-bit sources, which takes the chunk passes.
//!   add+RMSNorm and 16-bit sources on 256 lanes, and every 1,024-lane launch, hold the
//!   loaded words rather than their widened values across the row sum (same operations in the
//!   same order, so bit-identical; see [`register_backward_words`]); 16-bit sources with an
//!   F32 dx on 256 lanes load the next row's words while the current row's dx is computed
//!   ([`register_backward_prefetch`]).
//! * Chunk passes (RMSNorm, LayerNorm, add+RMSNorm rows of whole chunks, residual and
//!   cotangents in the source's dtype, that the register backward does not hold; see
//!   [`force_chunk_passes`]): the general backward's two passes read 16 bytes a lane: one
//!   workgroup per row for its constants, then one invocation per (block of [`BLOCK_ROWS`]
//!   rows, 4 columns; 8 where dx is 16-bit), two rows a step, writing dx (F32, or 16 bits
//!   for 16-bit sources) and the block's partials, finished as the register backward's.
//!   Each row is read twice (49–58% of copy bandwidth at 2048×32768 on an H200, where the
//!   general kernels reached 33–54%). Whether a backward takes them does not depend on dx's
//!   dtype, so a 16-bit dx is the F32 one rounded and the parameter gradients are the same.
//! * General kernels (every operator, any width): the forward takes one workgroup per row and
//!   reads the row in chunks of 256 columns (mean, squares, outputs). The backward takes one
//!   workgroup per row for the two row constants of the input gradient, then one invocation
//!   per (block of [`BLOCK_ROWS`] rows, column), which writes the input gradient and the
//!   block's FP32 parameter partials; the partials are summed in block order.
//!
//! No atomics; every sum runs in an order fixed by the shape (and, for the register paths,
//! by how many lanes the adapter allows a workgroup), so reruns are bit-identical; the register
//! and general paths add in different orders, so their results may differ in the last bits. A
//! 16-bit output of an odd width is computed into an FP32 temporary and narrowed with
//! [`crate::cast::cast`], so no two invocations share a word.
//!
//! Backward differentiates the real-valued formula with the saved FP32 statistics: the
//! rounding of the casting modes and of stored outputs is not differentiated.

use crate::kernel::{COMMON_ROWS, COMMON_ROWS_SUBGROUP, Constants, Kernel, rows_module};
use crate::{DType, Engine, Error, Result, Tensor, cast};

const NORM_WGSL: &str = include_str!("../wgsl/norm.wgsl");

/// `wgsl/norm.wgsl` with a row-reduction snippet and a workgroup size.
macro_rules! norm_module {
    ($name:literal, $rows:expr, $wg:literal) => {
        rows_module!($name, $rows, [], $wg, NORM_WGSL)
    };
}

/// `wgsl/norm.wgsl` with workgroups of 256 invocations.
pub static KERNEL: Kernel = norm_module!("norm", COMMON_ROWS, 256);

/// `wgsl/norm.wgsl` with workgroups of 1,024 invocations: the register forwards of rows too
/// wide for 256 lanes, on adapters that allow such workgroups.
pub static KERNEL_WIDE: Kernel = norm_module!("norm_wide", COMMON_ROWS, 1024);

/// `wgsl/norm.wgsl` with workgroups of 512 invocations: register forwards (see
/// [`forward_lanes`]).
pub static KERNEL_MID: Kernel = norm_module!("norm_mid", COMMON_ROWS, 512);

/// [`KERNEL`] with the register rows reduced by subgroup shuffles
/// (`wgsl/common/rows_subgroup.wgsl`), likewise the two below: the register forwards' and
/// 1,024-lane backwards' modules where the adapter has `SUBGROUP` (`reduce::rows_kernel`;
/// `reduce::force_subgroup_rows` overrides).
pub static KERNEL_SUBGROUP: Kernel = norm_module!("norm_subgroup", COMMON_ROWS_SUBGROUP, 256);

/// [`KERNEL_WIDE`] with subgroup row reductions.
pub static KERNEL_WIDE_SUBGROUP: Kernel =
    norm_module!("norm_wide_subgroup", COMMON_ROWS_SUBGROUP, 1024);

/// [`KERNEL_MID`] with subgroup row reductions.
pub static KERNEL_MID_SUBGROUP: Kernel =
    norm_module!("norm_mid_subgroup", COMMON_ROWS_SUBGROUP, 512);

/// Forces the lanes of the register backwards (512, or 1,024 reading rows twice, where the
/// row fits; another count: 256 where the row fits; `None`: the rule, [`mid_backward`]) for
/// launches from the calling thread. For tests and measurements.
#[doc(hidden)]
pub fn force_backward_lanes(lanes: Option<u64>) {
    FORCED_BACKWARD_LANES.with(|f| f.set(lanes));
}

/// Forces the most blocks of the register backwards ([`REGISTER_BLOCKS`] by default; half as
/// many on 1,024 lanes) for launches from the calling thread; `None` for the default. The
/// parameter gradients then add their rows in other groups (last bits); for measurements.
#[doc(hidden)]
pub fn force_register_blocks(blocks: Option<usize>) {
    FORCED_REGISTER_BLOCKS.with(|f| f.set(blocks));
}

/// Forces the segments of the register forwards and backwards for launches from the calling
/// thread: `Some(0)` none (one row a workgroup), `Some(w)` rows of `w` lanes (a power of two,
/// at most the register rows' subgroup width) where the row fits, `None` the rule (segments
/// as wide as that subgroup width wherever the row fits [`REGISTER_CHUNKS`] a lane of them;
/// [`segment_plan`]). Results differ in the last bits (the row sums group differently); for
/// tests and measurements.
#[doc(hidden)]
pub fn force_segments(width: Option<u64>) {
    FORCED_SEGMENTS.with(|f| f.set(width));
}

/// Forces the chunk passes of the backward (`Some(true)`: for every RMSNorm, LayerNorm and
/// add+RMSNorm of whole-chunk rows whose residual and cotangents share the source's dtype,
/// even where the register backward holds the row, and for modulated RMSNorm of whole-chunk
/// rows whose cotangent does; `Some(false)`: never, the general passes instead; `None`: the
/// rule, rows the register backward does not hold, add+RMSNorm of 16-bit sources that 1,024
/// lanes would hold, and modulated RMSNorm of whole-chunk rows whose cotangent shares the
/// source's dtype) for launches from the calling thread.
/// Results differ in the last bits between paths; for tests and measurements.
#[doc(hidden)]
pub fn force_chunk_passes(on: Option<bool>) {
    FORCED_CHUNK_PASSES.with(|f| f.set(on));
}

thread_local! {
    static FORCED_CHUNK_PASSES: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    static FORCED_SEGMENTS: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    static FORCED_REGISTER_BLOCKS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    static FORCED_FORWARD_LANES: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    static FORCED_BACKWARD_LANES: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Forces the lanes of the register forwards (256, 512 or 1,024, where the row fits
/// [`REGISTER_CHUNKS`] a lane and the adapter allows them) for launches from the calling
/// thread; `None` for the rule ([`forward_lanes`]). Results differ in the last bits between
/// lane counts (the row sums group differently); for tests and measurements.
#[doc(hidden)]
pub fn force_forward_lanes(lanes: Option<u64>) {
    FORCED_FORWARD_LANES.with(|f| f.set(lanes));
}

/// Lanes of a register forward (RMSNorm and modulated RMSNorm, LayerNorm and GroupNorm,
/// add+RMSNorm; PolyNorm takes RMSNorm's with `half` false) of rows of `chunks` whole chunks,
/// on an adapter allowing `max_lanes` invocations a workgroup: the power of two that gives
/// about four chunks a lane for RMSNorm (256 to 1,024 lanes), the same within 256 to 512 for
/// LayerNorm (its two row sums cost more on 1,024 lanes), about two for add+RMSNorm (512 to
/// 1,024), no more lanes than chunks (at least 256); never more than [`REGISTER_CHUNKS`] a
/// lane, nor more lanes than the adapter allows (then the fewest that fit, or `None`: the
/// general forward). Measured on an H200 against the other counts
/// (`notes/h200/2026-12-01-bs/norm-lanes/`). RMSNorm and LayerNorm of 16-bit sources (`half`;
/// not PolyNorm's) take at least 512 lanes for rows of 1,024 chunks and more (8,192 columns:
/// two chunks a lane instead of four; wider rows took 512 already). On an H100, BF16 forwards,
/// 256 → 512 lanes (`notes/h200/2026-12-06-s39/`, first runs): 8192² RMSNorm 101.4 → 98.7 µs,
/// LayerNorm 101.9 → 99.9 (`lanes512/`); narrower rows slower or no faster (`widths/`: 5,120
/// columns RMSNorm 98.6 → 106.0, LayerNorm 97.2 → 110.3; 6,144 columns 100.5 → 101.9 and
/// 101.0 → 105.3; 7,168 columns 100.5 → 98.4 and 101.5 → 101.4), PolyNorm 8192² slower (105.1
/// → 117.1).
pub fn forward_lanes(kind: NormKind, chunks: usize, max_lanes: u64, half: bool) -> Option<u64> {
    let (per_lane, lo, hi) = match kind {
        NormKind::AddRms => (2, 512, 1024),
        NormKind::Layer | NormKind::Group => (4, 256, 512),
        _ => (4, 256, 1024),
    };
    let lo = if half && chunks >= 1024 && matches!(kind, NormKind::Rms | NormKind::Layer) {
        512
    } else {
        lo
    };
    let fits = |lanes: u64| {
        lanes <= max_lanes && (chunks as u64).div_ceil(lanes) <= REGISTER_CHUNKS as u64
    };
    // No more lanes than chunks (at least 256).
    let wanted = (chunks as u64)
        .div_ceil(per_lane)
        .next_power_of_two()
        .clamp(lo, hi)
        .min((chunks as u64).next_power_of_two().max(256));
    if fits(wanted) {
        return Some(wanted);
    }
    // More lanes where the row needs them, else fewer where the adapter allows no more.
    [256u64, 512, 1024]
        .into_iter()
        .filter(|&l| l > wanted)
        .find(|&l| fits(l))
        .or_else(|| {
            [1024u64, 512, 256]
                .into_iter()
                .filter(|&l| l < wanted)
                .find(|&l| fits(l))
        })
}

/// Whether a register backward that fits 256 lanes takes 512 ([`KERNEL_MID`]) instead: F32
/// sources of at least 1,024 chunks (4,096 columns). On an H200 that took 2–6% off the F32
/// RMSNorm, LayerNorm and add+RMSNorm backwards at 4,096² and 8,192²; 16-bit sources keep 256
/// lanes (512 was 2–4% faster with a BF16 gradient for RMSNorm and add+RMSNorm but up to 22%
/// slower with the F32 one, and both gradients of one context must sum their rows alike, the
/// 16-bit one being the F32 one rounded;
/// `notes/h200/2026-12-01-bs/norm-lanes/ab-bwd-lanes.txt`).
pub fn mid_backward(source: DType, chunks: usize) -> bool {
    source == DType::F32 && chunks >= 1024
}

/// Lanes of [`KERNEL_WIDE`]'s workgroups.
const WIDE_WG: u64 = 1024;
/// Lanes of [`KERNEL_MID`]'s workgroups.
const MID_WG: u64 = 512;
/// Columns of one `partials_finish` workgroup.
const FINISH_COLUMNS: u64 = 32;

const WG: u64 = 256;
/// Rows per block of the backward's parameter partials.
pub const BLOCK_ROWS: usize = 32;
/// F32 words of one row's backward constants (inverse, mean, mean correction, c1, c2).
const ROWINFO: usize = 8;
/// Largest row width accepted.
pub const MAX_COLUMNS: usize = 1 << 20;
/// Default ε of RMSNorm, LayerNorm and their variants.
pub const DEFAULT_EPS: f32 = 1e-5;

/// Liger's casting modes of RMSNorm (they differ only for 16-bit sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CastingMode {
    /// Statistics in FP32; the normalized value is rounded to the source dtype before the
    /// weight multiply (Llama). The default.
    #[default]
    Llama,
    /// Everything in FP32, one rounding of the output (Gemma).
    Gemma,
    /// The normalized value and the weight factor are rounded to the source dtype before
    /// they are multiplied (statistics stay FP32).
    None,
}

impl CastingMode {
    fn code(self) -> f64 {
        match self {
            CastingMode::Llama => 0.0,
            CastingMode::Gemma => 1.0,
            CastingMode::None => 2.0,
        }
    }
}

/// Options of [`rms_norm`], [`add_rms_norm`] and [`modulated_rms_norm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNormOptions {
    /// ε added to the mean square (default 1e-5); positive and finite.
    pub eps: f32,
    /// Weight offset: the factor is `offset + w` (0 default; 1 for Gemma's `(1 + w)`); with
    /// offset 0 the factor is `w` itself (one addition a value less; a −0 weight stays −0).
    /// Ignored without a weight.
    pub offset: f32,
    /// Casting mode (default Llama). [`modulated_rms_norm`] always computes in FP32.
    pub casting: CastingMode,
}

impl Default for RmsNormOptions {
    fn default() -> Self {
        RmsNormOptions {
            eps: DEFAULT_EPS,
            offset: 0.0,
            casting: CastingMode::Llama,
        }
    }
}

/// Options of [`layer_norm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormOptions {
    /// ε added to the variance (default 1e-5); positive and finite.
    pub eps: f32,
}

impl Default for LayerNormOptions {
    fn default() -> Self {
        LayerNormOptions { eps: DEFAULT_EPS }
    }
}

/// Which operator a [`Saved`] context belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// [`rms_norm`].
    Rms,
    /// [`layer_norm`].
    Layer,
    /// [`add_rms_norm`].
    AddRms,
    /// [`modulated_rms_norm`].
    Modulated,
    /// [`group_norm`].
    Group,
}

/// How [`group_norm`] views its source: rows are (sample, group) pairs of
/// `channels_per_group × spatial` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLayout {
    /// Groups per sample.
    pub groups: usize,
    /// Channels in each group.
    pub channels_per_group: usize,
    /// Elements per channel (product of the axes after the channel axis; 1 for none).
    pub spatial: usize,
}

impl NormKind {
    fn code(self) -> f64 {
        match self {
            NormKind::Rms => 0.0,
            NormKind::Layer => 1.0,
            NormKind::AddRms => 2.0,
            NormKind::Modulated => 3.0,
            NormKind::Group => 4.0,
        }
    }
}

/// What a normalization forward keeps for its backward: the inputs (handles; tensors are
/// immutable) and the per-row FP32 statistics.
#[derive(Debug, Clone)]
pub struct Saved {
    /// The operator.
    pub kind: NormKind,
    /// The source `x`.
    pub source: Tensor,
    /// The residual of [`add_rms_norm`].
    pub residual: Option<Tensor>,
    /// The weight.
    pub weight: Option<Tensor>,
    /// Whether [`layer_norm`] had a bias.
    pub has_bias: bool,
    /// Modulation scale of [`modulated_rms_norm`], `[batches, columns]`.
    pub scale: Option<Tensor>,
    /// Per-row inverse RMS (RMSNorm variants) or inverse standard deviation (LayerNorm),
    /// F32, shape `[rows]`.
    pub inverse: Tensor,
    /// Per-row mean (LayerNorm), F32, shape `[rows]`.
    pub mean: Option<Tensor>,
    /// Per-row correction of the FP32 mean (LayerNorm), F32, shape `[rows]`: the exact
    /// mean is `mean + correction` to FP32 precision of the spread, so rows with a large
    /// common offset are centered accurately.
    pub mean_correction: Option<Tensor>,
    /// The layout of [`group_norm`].
    pub group: Option<GroupLayout>,
    /// ε used.
    pub eps: f32,
    /// Weight offset used.
    pub offset: f32,
}

/// Gradients of a normalization backward (FP32, but for the source and residual gradients of
/// [`norm_backward_as`]; `None` where the input was absent).
#[derive(Debug, Clone)]
pub struct NormGradients {
    /// dL/dx, the source's shape.
    pub source: Tensor,
    /// dL/dw, `[columns]`.
    pub weight: Option<Tensor>,
    /// dL/db (LayerNorm with a bias), `[columns]`.
    pub bias: Option<Tensor>,
    /// dL/dresidual ([`add_rms_norm`]): the same tensor as `source` (the two gradients are
    /// equal), the residual's shape.
    pub residual: Option<Tensor>,
    /// dL/dscale ([`modulated_rms_norm`]), `[batches, columns]`.
    pub scale: Option<Tensor>,
    /// dL/dshift ([`modulated_rms_norm`]), `[batches, columns]`.
    pub shift: Option<Tensor>,
}

#[derive(encase::ShaderType, Default)]
struct Params {
    rows: u32,
    cols: u32,
    rows_per_batch: u32,
    blocks_per_batch: u32,
    total: u32,
    stride: u32,
    base: u32,
    eps: f32,
    offset: f32,
    groups: u32,
    channels_per_group: u32,
    spatial: u32,
    block_rows: u32,
}

pub(crate) fn rows_cols(x: &Tensor) -> (usize, usize) {
    crate::reduce::rows_cols(x)
}

fn float(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, t.dtype(), &DType::FLOATS))
    }
}

fn check_eps(eps: f32, what: &str) -> Result<()> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidValue {
            what: format!("{what}: eps"),
            got: f64::from(eps),
            rule: "must be positive and finite".into(),
        })
    }
}

fn check_finite(v: f32, what: &str) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidValue {
            what: what.into(),
            got: f64::from(v),
            rule: "must be finite".into(),
        })
    }
}

/// Rows and columns of a source, validated: a float dtype, 1 ≤ rows, 1 ≤ columns ≤
/// [`MAX_COLUMNS`], `rows × columns` within `u32` indexing and an F32 copy within one binding
/// (gradients are F32).
fn source_extent(x: &Tensor, what: &str) -> Result<(usize, usize)> {
    float(x, &format!("{what}: source"))?;
    if x.shape().is_empty() {
        return Err(Error::bounds(format!("{what}: source axes"), 0, 1, 64));
    }
    let (rows, cols) = rows_cols(x);
    if rows == 0 {
        return Err(Error::bounds(
            format!("{what}: rows"),
            0,
            1,
            u64::from(u32::MAX),
        ));
    }
    if cols == 0 || cols > MAX_COLUMNS {
        return Err(Error::bounds(
            format!("{what}: columns"),
            cols as u64,
            1,
            MAX_COLUMNS as u64,
        ));
    }
    let len = (rows as u64) * (cols as u64);
    let limit = x.engine().max_binding_bytes();
    if len * 4 > limit {
        return Err(Error::LimitExceeded {
            what: format!("{what}: FP32 rows × columns"),
            bytes: len * 4,
            limit,
            limit_name: "max_storage_buffer_binding_size",
        });
    }
    if len > u64::from(u32::MAX) {
        return Err(Error::bounds(
            format!("{what}: rows × columns"),
            len,
            1,
            u64::from(u32::MAX),
        ));
    }
    Ok((rows, cols))
}

fn check_param(t: &Tensor, engine: &Engine, shape: &[usize], what: &str) -> Result<()> {
    t.check_engine(engine, what)?;
    float(t, what)?;
    if t.shape() != shape {
        return Err(Error::shape(what, shape, t.shape()));
    }
    Ok(())
}

fn check_same_shape(t: &Tensor, x: &Tensor, what: &str) -> Result<()> {
    check_param(t, x.engine(), x.shape(), what)
}

fn code(t: Option<&Tensor>) -> f64 {
    f64::from(t.map_or(0, |t| t.dtype().code()))
}

/// Scratch bytes a normalization forward allocates for `[rows, cols]` sources of `dtype`:
/// FP32 temporaries for 16-bit outputs of an odd width (one, two for [`add_rms_norm`]).
pub fn forward_workspace_bytes(kind: NormKind, rows: usize, cols: usize, dtype: DType) -> u64 {
    if dtype == DType::F32 || cols.is_multiple_of(2) {
        return 0;
    }
    let outputs = if kind == NormKind::AddRms { 2 } else { 1 };
    outputs * (rows * cols * 4) as u64
}

/// Partial slots the backward of `kind` needs (weight; bias or shift; scale).
fn partial_slots(kind: NormKind, has_weight: bool, has_bias: bool) -> usize {
    match kind {
        NormKind::Modulated => 3,
        NormKind::Layer if has_bias => 2,
        NormKind::Group => 0,
        _ => usize::from(has_weight),
    }
}

fn blocks_for(rows: usize, batches: usize) -> (usize, usize) {
    let per_batch = (rows / batches).div_ceil(BLOCK_ROWS);
    (per_batch, per_batch * batches)
}

/// Scratch bytes a normalization backward may allocate (an upper bound over its paths): the
/// general path's per-row constants (32 bytes a row) and FP32 parameter partials
/// (`slots × blocks × cols`, blocks of [`BLOCK_ROWS`] rows within each modulation batch;
/// `batches` = 1 except for [`modulated_rms_norm`]) with their finish's sums of runs of blocks
/// ([`crate::reduce::sum_partial_groups_workspace_bytes`]), or the register path's partials
/// (`slots × blocks × cols`, at most [`REGISTER_BLOCKS`] blocks), whichever is larger.
pub fn backward_workspace_bytes(
    kind: NormKind,
    rows: usize,
    cols: usize,
    batches: usize,
    has_weight: bool,
    has_bias: bool,
) -> u64 {
    let batches = batches.max(1);
    let (per_batch, blocks) = blocks_for(rows, batches);
    let slots = partial_slots(kind, has_weight, has_bias);
    // The partials' finish (one slot at a time) may add its runs' sums.
    let finish = if slots > 0 {
        crate::reduce::sum_partial_groups_workspace_bytes(batches, per_batch, cols)
    } else {
        0
    };
    let general = (rows * ROWINFO * 4 + slots * blocks * cols * 4) as u64 + finish;
    let register = if matches!(kind, NormKind::Rms | NormKind::Layer | NormKind::AddRms) {
        let (_, blocks) = register_blocks(rows, false);
        (slots.max(1) * blocks * cols * 4) as u64
    } else {
        0
    };
    general.max(register)
}

/// Rows per block and blocks of the register backward: at most [`REGISTER_BLOCKS`] blocks of
/// at least [`REGISTER_MIN_BLOCK_ROWS`] rows (the last may be shorter; half as many blocks
/// for workgroups of 1,024 lanes), a function of the shape only.
fn register_blocks(rows: usize, wide: bool) -> (usize, usize) {
    let blocks = FORCED_REGISTER_BLOCKS
        .with(|f| f.get())
        .unwrap_or(REGISTER_BLOCKS)
        .max(2);
    let most = if wide { blocks / 2 } else { blocks };
    let block_rows = rows.div_ceil(most).max(REGISTER_MIN_BLOCK_ROWS);
    (block_rows, rows.div_ceil(block_rows))
}

fn dummy(engine: &Engine, what: &str) -> Result<Tensor> {
    Tensor::empty(engine, &[1], DType::F32, what)
}

struct Forward<'a> {
    kind: NormKind,
    x: &'a Tensor,
    aux: Option<&'a Tensor>,
    aux2: Option<&'a Tensor>,
    weight: Option<&'a Tensor>,
    rows_per_batch: usize,
    eps: f32,
    offset: f32,
    casting: CastingMode,
    layout: Option<GroupLayout>,
}

fn forward_params(f: &Forward<'_>, rows: usize, cols: usize) -> Params {
    Params {
        rows: rows as u32,
        cols: cols as u32,
        rows_per_batch: f.rows_per_batch as u32,
        blocks_per_batch: 0,
        total: 0,
        stride: 0,
        base: 0,
        eps: f.eps,
        offset: f.offset,
        groups: f.layout.map_or(0, |l| l.groups as u32),
        channels_per_group: f.layout.map_or(0, |l| l.channels_per_group as u32),
        spatial: f.layout.map_or(1, |l| l.spatial as u32),
        block_rows: 0,
    }
}

/// Most chunks per lane of the register paths (a chunk: 4 F32 or 8 16-bit values).
pub const REGISTER_CHUNKS: usize = 8;
/// The register backward splits the rows into at most this many blocks (one workgroup each).
pub const REGISTER_BLOCKS: usize = 256;
/// Fewest rows of a register backward block (so the partials stay at most a quarter of dx).
pub const REGISTER_MIN_BLOCK_ROWS: usize = 4;

thread_local! {
    static FORCED_WORDS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    static FORCED_PREFETCH: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Forces whether `rms_backward_words` loads each next row's words while the current row's dx
/// is computed (`PREFETCH`), for launches from the calling thread; `None` for the rule
/// ([`register_backward_prefetch`]). The same bits either way; for tests and measurements.
#[doc(hidden)]
pub fn force_register_prefetch(on: Option<bool>) {
    FORCED_PREFETCH.with(|f| f.set(on));
}

/// Whether `rms_backward_words` loads each next row's words while the current row's dx is
/// computed: for 16-bit sources (`half`) with an F32 dx (`f32_dx`) on 256 lanes, not on 1,024
/// (`wide`: those lanes read the row twice, and the held words spill). On an H100, against the
/// build before, alternating twice (`notes/h200/2026-12-05-s38/rule/`, first run), BF16 with an
/// F32 dx: RMSNorm 8192² 223.3 → 211.2 µs, 4096² 70.4 → 66.6, add+RMSNorm 8192² 270.8 → 258.5,
/// 4096² 77.8 → 76.0; with a BF16 dx it gained nothing (RMSNorm 8192² 168.2 → 167.3 µs against
/// the words alone in `prefetch/`, add+RMSNorm 4096² 65.4 → 67.1 in `rule/`); on 1,024 lanes
/// 2.6–3.2× slower (`prefetch/`).
pub fn register_backward_prefetch(half: bool, f32_dx: bool, wide: bool) -> bool {
    FORCED_PREFETCH
        .with(std::cell::Cell::get)
        .unwrap_or(half && f32_dx && !wide)
}

/// Forces whether the RMSNorm / add+RMSNorm register backward holds the loaded words across
/// the row sum (`rms_backward_words`) or their widened values (`rms_backward_registers`), for
/// launches from the calling thread; `None` for the rule ([`register_backward_words`]). Both
/// give bit-identical results; for tests and measurements.
#[doc(hidden)]
pub fn force_register_words(words: Option<bool>) {
    FORCED_WORDS.with(|f| f.set(words));
}

/// Whether the RMSNorm / add+RMSNorm register backward (any source dtype) on 1,024
/// lanes (`wide`) or 256 holds the loaded words across the row sum: add+RMSNorm (16-bit
/// sources +15–22% on an H200, F32 about +3%), every 1,024-lane launch (which reads the row
/// again for dx), and 16-bit sources (`half`), whose words [`register_backward_prefetch`]
/// loads a row ahead. For RMSNorm of F32 sources on 256 lanes holding the widened values
/// measured faster (`notes/h200/2026-11-30-final5/ab-norm.txt`). LayerNorm always holds the
/// widened values.
pub fn register_backward_words(add: bool, wide: bool, half: bool) -> bool {
    FORCED_WORDS
        .with(std::cell::Cell::get)
        .unwrap_or(wide || add || half)
}

/// How a register path runs: the workgroup size (256, 512 or 1,024 lanes) and the chunks
/// each lane holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RegisterPlan {
    lanes: u64,
    chunks: u32,
    /// Lanes a row in segments (`SEG`), 0 for one row a workgroup.
    segment: u64,
}

impl RegisterPlan {
    /// `lanes` lanes over a row of `row_chunks` chunks: the fewest chunks a lane (1, 2, 4 or
    /// 8) that cover the row, `None` past [`REGISTER_CHUNKS`].
    fn on(lanes: u64, row_chunks: usize) -> Option<RegisterPlan> {
        [1u32, 2, 4, 8]
            .into_iter()
            .find(|&c| u64::from(c) * lanes >= row_chunks as u64)
            .filter(|&c| c as usize <= REGISTER_CHUNKS)
            .map(|chunks| RegisterPlan {
                lanes,
                chunks,
                segment: 0,
            })
    }

    /// Segments: rows of `row_chunks` chunks, `width` lanes each, on workgroups of 256
    /// lanes; `None` where the row needs more than [`REGISTER_CHUNKS`] a lane.
    fn segments(width: u64, row_chunks: usize) -> Option<RegisterPlan> {
        RegisterPlan::on(width, row_chunks).map(|p| RegisterPlan {
            lanes: WG,
            segment: width,
            ..p
        })
    }

    /// Workgroups for `rows` rows.
    fn workgroups(self, rows: usize) -> u64 {
        match self.lanes.checked_div(self.segment) {
            Some(rows_a_workgroup) => (rows as u64).div_ceil(rows_a_workgroup),
            None => rows as u64,
        }
    }

    /// 1,024 lanes (the backward then reads each row twice).
    fn wide(self) -> bool {
        self.lanes == WIDE_WG
    }

    /// The module for these lanes: its subgroup twin (`SG_WIDTH` then added to `constants`)
    /// where `reduce::rows_kernel` takes it; `prefers_subgroups` is the launch's measured rule.
    fn kernel(
        self,
        engine: &Engine,
        prefers_subgroups: bool,
        constants: &mut Constants,
    ) -> &'static Kernel {
        let (plain, subgroup) = match self.lanes {
            WIDE_WG => (&KERNEL_WIDE, &KERNEL_WIDE_SUBGROUP),
            MID_WG => (&KERNEL_MID, &KERNEL_MID_SUBGROUP),
            _ => (&KERNEL, &KERNEL_SUBGROUP),
        };
        if self.segment > 0 {
            // Segments were planned from `rows_subgroup_width`, so this is the subgroup module.
            constants.push(("SEG", self.segment as f64));
        }
        crate::reduce::rows_kernel(engine, plain, subgroup, prefers_subgroups, constants)
    }
}

/// The most lanes a workgroup may have on the engine's adapter.
fn max_lanes(engine: &Engine) -> u64 {
    let limits = &engine.info().limits;
    u64::from(limits.max_compute_invocations_per_workgroup)
        .min(u64::from(limits.max_compute_workgroup_size_x))
}

/// Chunks of a row of `cols` values of `dtype` (4 F32 or 8 16-bit values a chunk), `None`
/// when the row is not whole chunks.
fn row_chunks(cols: usize, dtype: DType) -> Option<usize> {
    let len = chunk_len(dtype);
    (cols > 0 && cols.is_multiple_of(len)).then_some(cols / len)
}

/// Values of a 16-byte chunk of `dtype`: 4 F32 or 8 16-bit values.
fn chunk_len(dtype: DType) -> usize {
    if dtype == DType::F32 { 4 } else { 8 }
}

/// The register path for rows of `cols` values of `dtype`: whole chunks, at most
/// [`REGISTER_CHUNKS`] per lane of 256, else (on an adapter that allows it) at most
/// `wide_chunks` per lane of 1,024; the fewest chunks per lane (1, 2, 4 or 8) that cover the row.
fn register_plan(
    engine: &Engine,
    cols: usize,
    dtype: DType,
    wide_chunks: u32,
) -> Option<RegisterPlan> {
    let chunks = row_chunks(cols, dtype)?;
    RegisterPlan::on(WG, chunks).or_else(|| {
        (wide_chunks > 0 && max_lanes(engine) >= WIDE_WG)
            .then(|| RegisterPlan::on(WIDE_WG, chunks))
            .flatten()
            .filter(|p| p.chunks <= wide_chunks)
    })
}

/// Segments (`SEG`) for rows of `chunks` chunks, where the adapter's subgroups allow them: as
/// wide as the register rows' subgroup width, if the row fits [`REGISTER_CHUNKS`] a lane of it
/// and the launch's rule `allows` them; a width forced by [`force_segments`] instead, whatever
/// the rule. The forwards take them for every kind but add+RMSNorm of F32 sources, the
/// register backwards (RMSNorm, LayerNorm, add+RMSNorm; GroupNorm's follows its forward) for
/// every kind. On an H200 (segments of 32 lanes against one row a workgroup, µs; forwards
/// `notes/h200/2026-12-04-s28/segments/`, backwards `narrow-backward/`): GroupNorm
/// `[8192, 32, 256]` with 8 groups forward F32 169 → 140, BF16 166 → 93; 65536×1024 forwards
/// RMSNorm F32 145 → 137, BF16 130 → 77, LayerNorm F32 162 → 140, BF16 157 → 81, add+RMSNorm
/// BF16 162 → 146, but add+RMSNorm F32 258 → 271; 65536×1024 backwards RMSNorm F32 330 → 220,
/// BF16 334 → 161, LayerNorm F32 339 → 240, BF16 339 → 183, add+RMSNorm F32 374 → 292, BF16
/// 349 → 212.
fn segment_plan(engine: &Engine, chunks: usize, allows: bool) -> Option<RegisterPlan> {
    let width = u64::from(crate::reduce::rows_subgroup_width(engine, true)?);
    let width = match FORCED_SEGMENTS.with(std::cell::Cell::get) {
        Some(0) => return None,
        Some(w) if w.is_power_of_two() => w.min(width),
        _ if !allows => return None,
        _ => width,
    };
    RegisterPlan::segments(width, chunks)
}

/// The plan of a register forward of `kind` (PolyNorm: [`NormKind::Rms`], `poly`) over rows of
/// `cols` values of `dtype`: segments where the row fits ([`segment_plan`]), else the lanes of
/// [`forward_lanes`] (or those forced by [`force_forward_lanes`], which also turns segments
/// off); `None` for rows the register path does not hold.
fn forward_plan(
    engine: &Engine,
    kind: NormKind,
    cols: usize,
    dtype: DType,
    poly: bool,
) -> Option<RegisterPlan> {
    register_plan(engine, cols, dtype, REGISTER_CHUNKS as u32)?;
    let chunks = row_chunks(cols, dtype)?;
    let max = max_lanes(engine);
    let forced = FORCED_FORWARD_LANES.with(std::cell::Cell::get);
    let allows = !(kind == NormKind::AddRms && dtype == DType::F32);
    forced
        .filter(|&l| l <= max)
        .and_then(|l| RegisterPlan::on(l, chunks))
        .or_else(|| {
            forced
                .is_none()
                .then(|| segment_plan(engine, chunks, allows))
                .flatten()
        })
        .or_else(|| {
            RegisterPlan::on(
                forward_lanes(kind, chunks, max, dtype != DType::F32 && !poly)?,
                chunks,
            )
        })
}

/// Launch the forward; returns (output, residual sum or mean correction, inverse, mean).
fn forward<'a>(f: Forward<'a>) -> Result<(Tensor, Option<Tensor>, Tensor, Option<Tensor>)> {
    let x = f.x;
    let engine = x.engine();
    let (rows, cols) = rows_cols(x);
    let dtype = x.dtype();
    let pairs = dtype != DType::F32 && cols.is_multiple_of(2);
    let direct = dtype == DType::F32 || pairs;
    engine.check_workspace(
        "norm forward",
        forward_workspace_bytes(f.kind, rows, cols, dtype),
    )?;
    let out_dtype = if direct { dtype } else { DType::F32 };
    let y = Tensor::empty(engine, x.shape(), out_dtype, "norm output")?;
    let with_sum = f.kind == NormKind::AddRms;
    let leading = &x.shape()[..x.shape().len() - 1];
    let sum = if with_sum {
        Some(Tensor::empty(
            engine,
            x.shape(),
            out_dtype,
            "norm residual sum",
        )?)
    } else if matches!(f.kind, NormKind::Layer | NormKind::Group) {
        Some(Tensor::empty(
            engine,
            leading,
            DType::F32,
            "norm mean correction",
        )?)
    } else {
        None
    };
    let inverse = Tensor::empty(engine, leading, DType::F32, "norm inverse")?;
    let mean = if matches!(f.kind, NormKind::Layer | NormKind::Group) {
        Some(Tensor::empty(engine, leading, DType::F32, "norm mean")?)
    } else {
        None
    };
    let constants: Constants = vec![
        ("KIND", f.kind.code()),
        ("DX", f64::from(dtype.code())),
        ("DA", code(f.aux)),
        ("DB", code(f.aux2)),
        ("DW", code(f.weight)),
        ("HAS_W", f64::from(u8::from(f.weight.is_some()))),
        ("HAS_B", f64::from(u8::from(f.aux2.is_some()))),
        ("CAST", f.casting.code()),
        ("HAS_OFFSET", f64::from(u8::from(f.offset != 0.0))),
        ("PAIRS", f64::from(u8::from(pairs))),
        ("OUT_SUM", f64::from(u8::from(with_sum))),
    ];
    // Rows of whole chunks that fit the lanes' registers take the register path (one read of
    // the row): RMSNorm, LayerNorm, modulated RMSNorm, add+RMSNorm with a residual of the
    // source's dtype, GroupNorm where a chunk lies within one channel.
    let register_kind = match f.kind {
        NormKind::AddRms => f.aux.is_none_or(|r| r.dtype() == dtype),
        NormKind::Group => f
            .layout
            .is_some_and(|l| l.spatial.is_multiple_of(chunk_len(dtype))),
        _ => true,
    };
    let plan = if register_kind {
        forward_plan(engine, f.kind, cols, dtype, false)
    } else {
        None
    };
    if let Some(plan) = plan {
        let mut constants = constants;
        constants.push(("CHUNKS", f64::from(plan.chunks)));
        let params = forward_params(&f, rows, cols);
        // Weight and bias in the chunk bindings `w4`, `b4` (GroupNorm's per channel, read
        // value by value from them).
        let (entry, buffers): (&str, Vec<&wgpu::Buffer>) = match f.kind {
            NormKind::Layer | NormKind::Group => (
                "layer_forward_registers",
                vec![
                    inverse.buffer(),
                    mean.as_ref().unwrap_or(&inverse).buffer(),
                    sum.as_ref().unwrap_or(&inverse).buffer(),
                    x.buffer(),
                    y.buffer(),
                    f.weight.unwrap_or(x).buffer(),
                    f.aux2.unwrap_or(x).buffer(),
                ],
            ),
            NormKind::AddRms => (
                "add_forward_registers",
                vec![
                    inverse.buffer(),
                    x.buffer(),
                    y.buffer(),
                    f.weight.unwrap_or(x).buffer(),
                    f.aux.unwrap_or(x).buffer(),
                    sum.as_ref().unwrap_or(&y).buffer(),
                ],
            ),
            // RMSNorm and modulated RMSNorm (scale in `aux`/`a4`, shift in `aux2`/`b4`).
            _ => (
                "rms_forward_registers",
                vec![
                    f.aux.unwrap_or(x).buffer(),
                    f.aux2.unwrap_or(x).buffer(),
                    inverse.buffer(),
                    x.buffer(),
                    y.buffer(),
                    f.weight.unwrap_or(x).buffer(),
                    f.aux2.unwrap_or(x).buffer(),
                    f.aux.unwrap_or(x).buffer(),
                ],
            ),
        };
        // Subgroup reductions: 1–6% faster than the trees for every register forward on an
        // H200 (`notes/h200/2026-12-01-es/subgroups/`).
        let kernel = plan.kernel(engine, true, &mut constants);
        engine.launch(
            kernel,
            entry,
            &constants,
            &params,
            &buffers,
            plan.workgroups(rows),
        )?;
        return Ok((y, sum, inverse, mean));
    }
    let mean_dummy = dummy(engine, "norm mean (unused)")?;
    let sum_dummy = dummy(engine, "norm sum (unused)")?;
    engine.launch(
        &KERNEL,
        "forward_rows",
        &constants,
        &forward_params(&f, rows, cols),
        &[
            x.buffer(),
            f.aux.unwrap_or(x).buffer(),
            f.aux2.unwrap_or(x).buffer(),
            f.weight.unwrap_or(x).buffer(),
            inverse.buffer(),
            mean.as_ref().unwrap_or(&mean_dummy).buffer(),
            y.buffer(),
            sum.as_ref().unwrap_or(&sum_dummy).buffer(),
        ],
        rows as u64,
    )?;
    let (y, sum) = if direct {
        (y, sum)
    } else if with_sum {
        (
            cast::cast(&y, dtype)?,
            sum.map(|s| cast::cast(&s, dtype)).transpose()?,
        )
    } else {
        (cast::cast(&y, dtype)?, sum)
    };
    Ok((y, sum, inverse, mean))
}

/// RMSNorm: `y = x · inv · (offset + w)`, `inv = 1/sqrt(mean(x²) + ε)` per row, with Liger's
/// casting modes. `weight` (optional) has shape `[columns]`; without it `y = x · inv`.
/// Returns the output (source dtype and shape) and the saved context.
pub fn rms_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    options: &RmsNormOptions,
) -> Result<(Tensor, Saved)> {
    let what = "rms_norm";
    let (rows, cols) = source_extent(x, what)?;
    if let Some(w) = weight {
        check_param(w, x.engine(), &[cols], "rms_norm: weight")?;
    }
    check_eps(options.eps, what)?;
    check_finite(options.offset, "rms_norm: offset")?;
    let (y, _, inverse, _) = forward(Forward {
        kind: NormKind::Rms,
        x,
        aux: None,
        aux2: None,
        weight,
        rows_per_batch: rows,
        eps: options.eps,
        offset: options.offset,
        casting: options.casting,
        layout: None,
    })?;
    Ok((
        y,
        Saved {
            kind: NormKind::Rms,
            source: x.clone(),
            residual: None,
            weight: weight.cloned(),
            has_bias: false,
            scale: None,
            inverse,
            mean: None,
            mean_correction: None,
            group: None,
            eps: options.eps,
            offset: options.offset,
        },
    ))
}

/// LayerNorm: `y = (x − mean) · inv · w + b`, with the population variance of the centered
/// row (`inv = 1/sqrt(mean((x − mean)²) + ε)`). Weight and bias (each optional) have shape
/// `[columns]`.
pub fn layer_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    options: &LayerNormOptions,
) -> Result<(Tensor, Saved)> {
    let what = "layer_norm";
    let (rows, cols) = source_extent(x, what)?;
    if let Some(w) = weight {
        check_param(w, x.engine(), &[cols], "layer_norm: weight")?;
    }
    if let Some(b) = bias {
        check_param(b, x.engine(), &[cols], "layer_norm: bias")?;
    }
    check_eps(options.eps, what)?;
    let (y, correction, inverse, mean) = forward(Forward {
        kind: NormKind::Layer,
        x,
        aux: None,
        aux2: bias,
        weight,
        rows_per_batch: rows,
        eps: options.eps,
        offset: 0.0,
        casting: CastingMode::Gemma,
        layout: None,
    })?;
    Ok((
        y,
        Saved {
            kind: NormKind::Layer,
            source: x.clone(),
            residual: None,
            weight: weight.cloned(),
            has_bias: bias.is_some(),
            scale: None,
            inverse,
            mean,
            mean_correction: correction,
            group: None,
            eps: options.eps,
            offset: 0.0,
        },
    ))
}

/// Fused add+RMSNorm: `s = x + residual` in FP32, `y = RMSNorm(s)` of the unrounded sum.
/// Returns `(y, s rounded to the source dtype, saved)`. `residual` has the source's shape
/// (any float dtype).
pub fn add_rms_norm(
    x: &Tensor,
    residual: &Tensor,
    weight: Option<&Tensor>,
    options: &RmsNormOptions,
) -> Result<(Tensor, Tensor, Saved)> {
    let what = "add_rms_norm";
    let (rows, cols) = source_extent(x, what)?;
    check_same_shape(residual, x, "add_rms_norm: residual")?;
    if let Some(w) = weight {
        check_param(w, x.engine(), &[cols], "add_rms_norm: weight")?;
    }
    check_eps(options.eps, what)?;
    check_finite(options.offset, "add_rms_norm: offset")?;
    let (y, sum, inverse, _) = forward(Forward {
        kind: NormKind::AddRms,
        x,
        aux: Some(residual),
        aux2: None,
        weight,
        rows_per_batch: rows,
        eps: options.eps,
        offset: options.offset,
        casting: options.casting,
        layout: None,
    })?;
    let sum = sum.ok_or_else(|| Error::Device("add_rms_norm: no residual sum".into()))?;
    Ok((
        y,
        sum,
        Saved {
            kind: NormKind::AddRms,
            source: x.clone(),
            residual: Some(residual.clone()),
            weight: weight.cloned(),
            has_bias: false,
            scale: None,
            inverse,
            mean: None,
            mean_correction: None,
            group: None,
            eps: options.eps,
            offset: options.offset,
        },
    ))
}

/// Modulated RMSNorm (AdaLN): `y = (1 + scale[b]) · RMSNorm(x) · (offset + w) + shift[b]`.
/// The source's rows are `batches` consecutive runs of `rows / batches` rows; `scale` and
/// `shift` have shape `[batches, columns]` (`batches` must divide the rows). Computed in FP32
/// (the casting mode is not used), one rounding of the output.
pub fn modulated_rms_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    scale: &Tensor,
    shift: &Tensor,
    options: &RmsNormOptions,
) -> Result<(Tensor, Saved)> {
    let what = "modulated_rms_norm";
    let (rows, cols) = source_extent(x, what)?;
    if let Some(w) = weight {
        check_param(w, x.engine(), &[cols], "modulated_rms_norm: weight")?;
    }
    let batches = match scale.shape() {
        [b, c] if *c == cols && *b >= 1 && rows.is_multiple_of(*b) => *b,
        _ => {
            return Err(Error::shape(
                "modulated_rms_norm: scale ([batches dividing the rows, columns])",
                &[scale.shape().first().copied().unwrap_or(1), cols],
                scale.shape(),
            ));
        }
    };
    check_param(
        scale,
        x.engine(),
        &[batches, cols],
        "modulated_rms_norm: scale",
    )?;
    check_param(
        shift,
        x.engine(),
        &[batches, cols],
        "modulated_rms_norm: shift",
    )?;
    check_eps(options.eps, what)?;
    check_finite(options.offset, "modulated_rms_norm: offset")?;
    let (y, _, inverse, _) = forward(Forward {
        kind: NormKind::Modulated,
        x,
        aux: Some(scale),
        aux2: Some(shift),
        weight,
        rows_per_batch: rows / batches,
        eps: options.eps,
        offset: options.offset,
        casting: CastingMode::Gemma,
        layout: None,
    })?;
    Ok((
        y,
        Saved {
            kind: NormKind::Modulated,
            source: x.clone(),
            residual: None,
            weight: weight.cloned(),
            has_bias: false,
            scale: Some(scale.clone()),
            inverse,
            mean: None,
            mean_correction: None,
            group: None,
            eps: options.eps,
            offset: options.offset,
        },
    ))
}

/// Sum the `slot`-th partials in block order: `groups` runs of `per_group` blocks each;
/// returns `[groups, cols]`.
fn finish(
    engine: &Engine,
    partials: &Tensor,
    slot: usize,
    stride: usize,
    groups: usize,
    per_group: usize,
    cols: usize,
) -> Result<Tensor> {
    crate::reduce::sum_partial_groups(engine, partials, slot * stride, groups, per_group, cols)
}

fn check_stats(t: &Tensor, engine: &Engine, len: usize, what: &str) -> Result<()> {
    t.check_engine(engine, what)?;
    if t.dtype() != DType::F32 {
        return Err(Error::dtype(what, t.dtype(), &[DType::F32]));
    }
    if t.len() != len {
        return Err(Error::shape(what, &[len], t.shape()));
    }
    Ok(())
}

fn incomplete(rule: &str) -> Error {
    Error::InvalidValue {
        what: "norm_backward: saved context".into(),
        got: 0.0,
        rule: rule.into(),
    }
}

/// A [`Saved`] has public fields: check that one built or edited by hand still describes a
/// forward of this shape before its buffers are bound.
fn validate_saved(saved: &Saved, rows: usize, cols: usize) -> Result<()> {
    let engine = saved.source.engine();
    check_eps(saved.eps, "norm_backward: saved")?;
    check_finite(saved.offset, "norm_backward: saved offset")?;
    check_stats(&saved.inverse, engine, rows, "norm_backward: saved inverse")?;
    let param_len = match (saved.kind, saved.group) {
        (NormKind::Group, Some(l)) => {
            if l.groups == 0 || !rows.is_multiple_of(l.groups) {
                return Err(incomplete("group layout does not match the source"));
            }
            l.groups * l.channels_per_group
        }
        (NormKind::Group, None) | (_, Some(_)) => {
            return Err(incomplete("a group layout goes with group_norm only"));
        }
        _ => cols,
    };
    if let Some(w) = &saved.weight {
        check_param(w, engine, &[param_len], "norm_backward: saved weight")?;
    }
    match saved.kind {
        NormKind::Layer | NormKind::Group => {
            let (Some(m), Some(c)) = (&saved.mean, &saved.mean_correction) else {
                return Err(incomplete(
                    "a centered norm needs its mean and mean correction",
                ));
            };
            check_stats(m, engine, rows, "norm_backward: saved mean")?;
            check_stats(c, engine, rows, "norm_backward: saved mean correction")?;
        }
        NormKind::AddRms => {
            let Some(r) = &saved.residual else {
                return Err(incomplete("add_rms_norm needs its residual"));
            };
            check_same_shape(r, &saved.source, "norm_backward: saved residual")?;
        }
        NormKind::Modulated => {
            let Some(sc) = &saved.scale else {
                return Err(incomplete("modulated_rms_norm needs its scale"));
            };
            sc.check_engine(engine, "norm_backward: saved scale")?;
            float(sc, "norm_backward: saved scale")?;
            match sc.shape() {
                [b, c] if *c == cols && *b >= 1 && rows.is_multiple_of(*b) => {}
                other => {
                    return Err(Error::shape(
                        "norm_backward: saved scale ([batches dividing the rows, columns])",
                        &[other.first().copied().unwrap_or(1), cols],
                        other,
                    ));
                }
            }
        }
        NormKind::Rms => {}
    }
    Ok(())
}

/// Backward of any normalization forward of this module. `output_gradient` has the source's
/// shape (any float dtype); `residual_output_gradient` (only for [`add_rms_norm`], default
/// zero) is the cotangent of the residual sum, added to both the source and the residual
/// gradients. Returns FP32 gradients of every input that was given; independent calls never
/// accumulate into earlier results.
pub fn norm_backward(
    saved: &Saved,
    output_gradient: &Tensor,
    residual_output_gradient: Option<&Tensor>,
) -> Result<NormGradients> {
    norm_backward_as(saved, output_gradient, residual_output_gradient, DType::F32)
}

/// [`norm_backward`] with the source gradient (and add+RMSNorm's residual gradient, the same
/// tensor) stored in `dtype`: F32 gives that function's result; F16 or BF16 gives the F32
/// gradient rounded once to nearest-even (bit for bit `cast::cast` of it; a NaN stays a NaN,
/// its payload may differ). The parameter
/// gradients (weight, bias, scale, shift: sums over rows) stay F32. A 16-bit source whose
/// cotangents share its dtype, in rows the register backward takes, writes the 16-bit gradient
/// directly (2 bytes an element instead of 4); every other case computes the F32 gradient and
/// narrows it.
///
/// Errors: those of [`norm_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn norm_backward_as(
    saved: &Saved,
    output_gradient: &Tensor,
    residual_output_gradient: Option<&Tensor>,
    dtype: DType,
) -> Result<NormGradients> {
    let what = "norm_backward";
    if !dtype.is_float() {
        return Err(Error::dtype(
            "norm_backward_as: dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    let (given_dy, given_dres) = (output_gradient, residual_output_gradient);
    check_same_shape(
        output_gradient,
        &saved.source,
        "norm_backward: output gradient",
    )?;
    // GroupNorm works on its (sample, group) × (channel, position) view.
    let (x, output_gradient) = match saved.group {
        Some(l) => {
            let width = l.channels_per_group * l.spatial;
            let view = [saved.source.len() / width.max(1), width];
            (
                saved.source.reshape(&view)?,
                output_gradient.reshape(&view)?,
            )
        }
        None => (saved.source.clone(), output_gradient.clone()),
    };
    let (x, output_gradient) = (&x, &output_gradient);
    let engine = x.engine();
    let (rows, cols) = source_extent(x, what)?;
    validate_saved(saved, rows, cols)?;
    if let Some(d) = residual_output_gradient {
        if saved.kind != NormKind::AddRms {
            return Err(Error::InvalidValue {
                what: "norm_backward: residual output gradient".into(),
                got: 1.0,
                rule: "only add_rms_norm has a residual-sum output".into(),
            });
        }
        check_same_shape(d, x, "norm_backward: residual output gradient")?;
    }
    let batches = match (&saved.kind, &saved.scale) {
        (NormKind::Modulated, Some(s)) => s.shape()[0],
        _ => 1,
    };
    let rows_per_batch = rows / batches;
    let (per_batch, blocks) = blocks_for(rows, batches);
    let has_weight = saved.weight.is_some();
    let slots = partial_slots(saved.kind, has_weight, saved.has_bias);
    let needed = match saved.group {
        Some(l) => group_norm_backward_workspace_bytes(rows / l.groups, l),
        None => {
            backward_workspace_bytes(saved.kind, rows, cols, batches, has_weight, saved.has_bias)
        }
    };
    engine.check_workspace(what, needed)?;
    let stride = blocks * cols;
    if (slots * stride) as u64 > u64::from(u32::MAX) {
        return Err(Error::bounds(
            "norm_backward: partial words",
            (slots * stride) as u64,
            0,
            u64::from(u32::MAX),
        ));
    }
    // RMSNorm, LayerNorm and add+RMSNorm with cotangents (and residual) of the source's dtype
    // take the register backward when the rows fit 256 lanes' registers.
    let xdt = x.dtype();
    let same = |t: Option<&Tensor>| t.is_none_or(|t| t.dtype() == xdt);
    let same_dtypes = matches!(
        saved.kind,
        NormKind::Rms | NormKind::Layer | NormKind::AddRms
    ) && output_gradient.dtype() == xdt
        && same(saved.residual.as_ref())
        && same(residual_output_gradient);
    let plan = if same_dtypes {
        // Wide rows of RMSNorm and add+RMSNorm take 1,024 lanes that read each row twice: up
        // to 8 chunks a lane for RMSNorm of F32 sources (32 weight partials a lane; medians at
        // 2048×32768 on an H200 313 µs, against 337 by the chunk passes, `notes/h200/
        // 2026-12-04-s29/finish-wide8/`), else up to 4 (add+RMSNorm F32 at 8 spills: 954 µs
        // against 456; 16-bit values hold twice the partials a chunk).
        let wide_chunks = match (saved.kind, xdt) {
            (NormKind::Layer, _) => 0,
            (NormKind::Rms, DType::F32) => 8,
            _ => 4,
        };
        let plan = register_plan(engine, cols, xdt, wide_chunks);
        // 512 lanes instead of 256 (`mid_backward`), or the lanes forced for a measurement
        // (512, or 1,024 reading rows twice up to 4 chunks a lane, where they fit).
        let forced = FORCED_BACKWARD_LANES.with(std::cell::Cell::get);
        let lanes = match forced {
            Some(l @ (MID_WG | WIDE_WG)) => Some(l),
            Some(_) => None,
            None => plan
                .filter(|p| {
                    !p.wide() && row_chunks(cols, xdt).is_some_and(|c| mid_backward(xdt, c))
                })
                .map(|_| MID_WG),
        };
        // Rows within 8 chunks a lane of a subgroup: segments (`segment_plan`), unless lanes
        // are forced. Each segment takes its rows of the block in turn; the segments'
        // parameter partials are added in segment order before the block's partial row is
        // written.
        let segments = plan
            .filter(|_| forced.is_none())
            .and_then(|_| segment_plan(engine, row_chunks(cols, xdt)?, true));
        lanes
            .filter(|&l| plan.is_some() && l <= max_lanes(engine))
            .and_then(|l| RegisterPlan::on(l, row_chunks(cols, xdt)?))
            .filter(|p| !p.wide() || p.chunks <= 4)
            .or(segments)
            .or(plan)
    } else {
        None
    };
    // Rows of whole chunks that the register backward does not hold take the chunk passes,
    // and so does add+RMSNorm of 16-bit sources that the 1,024-lane register backward would
    // take (medians at 2048×32768 on an H200, `notes/h200/2026-12-04-s29/chunk-passes/`: F32
    // dx 321 → 291 µs, its lanes storing two F32 vec4s 32 bytes apart; BF16 dx 240 → 244);
    // or wherever forced ([`force_chunk_passes`]). The choice does not depend on dx's dtype,
    // so a 16-bit dx is the F32 one rounded, and the parameter gradients are the same.
    // Modulated RMSNorm (cotangent of the source's dtype, the scale of any) takes them for
    // every row of whole chunks (8192², 2 batches, on an H200: f32 295.5 → 251.2 µs, bf16
    // 358.6 → 201.8 µs against the general passes, `notes/h200/2026-12-05-s31/norm/`).
    let modulated = saved.kind == NormKind::Modulated && output_gradient.dtype() == xdt;
    let chunked = (same_dtypes || modulated)
        && row_chunks(cols, xdt).is_some()
        && FORCED_CHUNK_PASSES.with(std::cell::Cell::get).unwrap_or(
            modulated
                || plan.is_none_or(|p| {
                    p.wide() && saved.kind == NormKind::AddRms && xdt != DType::F32
                }),
        );
    let plan = plan.filter(|_| !chunked);
    // 16-bit sources of an even width (not GroupNorm) take the column pass that owns two
    // columns a lane (`backward_column_pairs`), which also stores a 16-bit gradient.
    let pairs = saved.group.is_none() && xdt != DType::F32 && cols.is_multiple_of(2);
    if dtype != DType::F32 && (xdt == DType::F32 || (plan.is_none() && !pairs)) {
        // Other F16/BF16 gradients: the F32 gradient, then one rounding.
        let mut grads = norm_backward_as(saved, given_dy, given_dres, DType::F32)?;
        grads.source = crate::cast::cast(&grads.source, dtype)?;
        if grads.residual.is_some() {
            grads.residual = Some(grads.source.clone());
        }
        return Ok(grads);
    }
    let dx = Tensor::empty(engine, x.shape(), dtype, "norm source gradient")?;
    // GroupNorm rows within the registers (each chunk in one channel, dy in x's dtype): dx
    // from one read of x and dy (F32; 16-bit gradients are that rounded, above), on the
    // forward's lanes or segments.
    let group_plan = saved
        .group
        .filter(|l| output_gradient.dtype() == xdt && l.spatial.is_multiple_of(chunk_len(xdt)))
        .and_then(|_| forward_plan(engine, NormKind::Group, cols, xdt, false));
    if let (Some(plan), Some(l)) = (group_plan, saved.group) {
        let rowinfo = Tensor::empty(engine, &[rows, ROWINFO], DType::F32, "norm row constants")?;
        let mean = saved
            .mean
            .as_ref()
            .ok_or_else(|| incomplete("GroupNorm needs its mean"))?;
        let corr = saved
            .mean_correction
            .as_ref()
            .ok_or_else(|| incomplete("GroupNorm needs its mean correction"))?;
        // In segments whose lanes' chunks each lie in one channel, the kernel also writes the
        // parameter partials (`GROUP_SUMS`), so x and dy are read once in all.
        let sums = (saved.weight.is_some() || saved.has_bias)
            && plan.segment > 0
            && (l.spatial / chunk_len(xdt)).is_multiple_of(plan.segment as usize);
        let partials = if sums {
            Some(group_partials_matrix(engine, rows, l)?)
        } else {
            None
        };
        let mut constants: Constants = vec![
            ("KIND", NormKind::Group.code()),
            ("DX", f64::from(xdt.code())),
            ("DW", code(saved.weight.as_ref())),
            ("HAS_W", f64::from(u8::from(has_weight))),
            ("HAS_OFFSET", f64::from(u8::from(saved.offset != 0.0))),
            ("CHUNKS", f64::from(plan.chunks)),
            ("GROUP_SUMS", f64::from(u8::from(sums))),
        ];
        let kernel = plan.kernel(engine, true, &mut constants);
        engine.launch(
            kernel,
            "group_backward_registers",
            &constants,
            &Params {
                rows: rows as u32,
                cols: cols as u32,
                offset: saved.offset,
                groups: l.groups as u32,
                channels_per_group: l.channels_per_group as u32,
                spatial: l.spatial as u32,
                ..Params::default()
            },
            &[
                saved.weight.as_ref().unwrap_or(x).buffer(),
                saved.inverse.buffer(),
                // The row constants, or the parameter partials where the kernel writes them.
                partials.as_ref().unwrap_or(&rowinfo).buffer(),
                x.buffer(),
                output_gradient.buffer(),
                dx.buffer(),
                mean.buffer(),
                corr.buffer(),
            ],
            plan.workgroups(rows),
        )?;
        return group_parameter_gradients(
            saved,
            l,
            (x, output_gradient, &rowinfo),
            partials,
            dx.reshape(saved.source.shape())?,
        );
    }
    if let Some(plan) = plan {
        return register_backward(
            saved,
            x,
            output_gradient,
            residual_output_gradient,
            dx,
            plan,
            slots,
        );
    }
    let rowinfo = Tensor::empty(engine, &[rows, ROWINFO], DType::F32, "norm row constants")?;
    let partials = Tensor::empty(
        engine,
        &[slots.max(1) * stride.max(1)],
        DType::F32,
        "norm partials",
    )?;
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        rows_per_batch: rows_per_batch as u32,
        blocks_per_batch: per_batch as u32,
        total: stride as u32,
        stride: stride as u32,
        base: 0,
        eps: saved.eps,
        offset: saved.offset,
        groups: saved.group.map_or(0, |l| l.groups as u32),
        channels_per_group: saved.group.map_or(0, |l| l.channels_per_group as u32),
        spatial: saved.group.map_or(1, |l| l.spatial as u32),
        block_rows: 0,
    };
    if chunked {
        chunk_passes(
            saved,
            (x, output_gradient, residual_output_gradient),
            (&dx, &rowinfo, &partials),
            params,
        )?;
    } else {
        general_passes(
            saved,
            (x, output_gradient, residual_output_gradient),
            (&dx, &rowinfo, &partials),
            params,
            pairs,
        )?;
    }
    if let Some(l) = saved.group {
        return group_parameter_gradients(
            saved,
            l,
            (x, output_gradient, &rowinfo),
            None,
            dx.reshape(saved.source.shape())?,
        );
    }
    // The chunk passes' partials (one batch, columns of whole quads) by the register
    // backward's finish, eight column quads a workgroup: 13–15 → 9–10 µs a slot at
    // 2048×32768 on an H200 (`notes/h200/2026-12-04-s29/profile-wide8-try/`, `finish-wide8/`).
    let all = |slot| match chunked {
        true => partials_finish(&partials, slot * stride, blocks, cols),
        false => finish(engine, &partials, slot, stride, 1, blocks, cols)?.reshape(&[cols]),
    };
    let per_batch_sum = |slot| finish(engine, &partials, slot, stride, batches, per_batch, cols);
    gradients(saved, dx, all, per_batch_sum)
}

/// The gradients of a backward from its dx and the sums of its partial slots: `all(slot)`
/// over every row (weight: slot 0; LayerNorm's bias: slot 1), `per_batch(slot)` per
/// modulation batch (modulated RMSNorm's scale: slot 2, shift: slot 1).
fn gradients(
    saved: &Saved,
    dx: Tensor,
    all: impl Fn(usize) -> Result<Tensor>,
    per_batch: impl Fn(usize) -> Result<Tensor>,
) -> Result<NormGradients> {
    let weight = match saved.weight {
        Some(_) => Some(all(0)?),
        None => None,
    };
    let (bias, scale, shift) = match saved.kind {
        NormKind::Layer if saved.has_bias => (Some(all(1)?), None, None),
        NormKind::Modulated => (None, Some(per_batch(2)?), Some(per_batch(1)?)),
        _ => (None, None, None),
    };
    let residual = (saved.kind == NormKind::AddRms).then(|| dx.clone());
    Ok(NormGradients {
        source: dx,
        weight,
        bias,
        residual,
        scale,
        shift,
    })
}

/// The override constants the general passes and the chunk passes share: the kind, the
/// source's and the weight's dtypes, and which parameters and cotangents there are.
fn backward_constants(
    saved: &Saved,
    x: &Tensor,
    residual_output_gradient: Option<&Tensor>,
) -> Constants {
    let weight = saved.weight.as_ref();
    vec![
        ("KIND", saved.kind.code()),
        ("DX", f64::from(x.dtype().code())),
        ("DW", code(weight)),
        ("HAS_W", f64::from(u8::from(weight.is_some()))),
        ("HAS_OFFSET", f64::from(u8::from(saved.offset != 0.0))),
        ("HAS_B", f64::from(u8::from(saved.has_bias))),
        (
            "HAS_DRES",
            f64::from(u8::from(residual_output_gradient.is_some())),
        ),
    ]
}

/// The general backward's row pass (`backward_rows`) and column pass (`backward_columns`, or
/// `backward_column_pairs` for `pairs`), writing dx, the row constants and the partials.
fn general_passes(
    saved: &Saved,
    (x, output_gradient, residual_output_gradient): (&Tensor, &Tensor, Option<&Tensor>),
    (dx, rowinfo, partials): (&Tensor, &Tensor, &Tensor),
    params: Params,
    pairs: bool,
) -> Result<()> {
    let engine = x.engine();
    let weight = saved.weight.as_ref();
    // aux: residual (add), scale (modulated), mean (LayerNorm).
    let aux = match saved.kind {
        NormKind::AddRms => saved.residual.as_ref(),
        NormKind::Modulated => saved.scale.as_ref(),
        NormKind::Layer | NormKind::Group => saved.mean.as_ref(),
        NormKind::Rms => None,
    };
    let mut constants = backward_constants(saved, x, residual_output_gradient);
    constants.extend([
        ("DA", code(aux)),
        ("DY", f64::from(output_gradient.dtype().code())),
        ("DR", code(residual_output_gradient)),
    ]);
    let stride = params.stride as usize;
    engine.launch(
        &KERNEL,
        "backward_rows",
        &constants,
        &params,
        &[
            x.buffer(),
            aux.unwrap_or(x).buffer(),
            saved.mean_correction.as_ref().unwrap_or(x).buffer(),
            weight.unwrap_or(x).buffer(),
            saved.inverse.buffer(),
            output_gradient.buffer(),
            rowinfo.buffer(),
        ],
        u64::from(params.rows),
    )?;
    // Binding order: the inputs and row constants, then dx and the partials (`dxw`, the
    // pairs' dx, comes after the partials).
    let mut columns = vec![
        x.buffer(),
        aux.unwrap_or(x).buffer(),
        weight.unwrap_or(x).buffer(),
        output_gradient.buffer(),
        residual_output_gradient.unwrap_or(x).buffer(),
        rowinfo.buffer(),
    ];
    if pairs {
        columns.extend([partials.buffer(), dx.buffer()]);
        let mut constants = constants.clone();
        constants.push(("DDX", f64::from(dx.dtype().code())));
        let params = Params {
            total: (stride / 2) as u32,
            ..params
        };
        engine.launch(
            &KERNEL,
            "backward_column_pairs",
            &constants,
            &params,
            &columns,
            (stride as u64 / 2).div_ceil(WG),
        )?;
    } else {
        columns.extend([dx.buffer(), partials.buffer()]);
        engine.launch(
            &KERNEL,
            "backward_columns",
            &constants,
            &params,
            &columns,
            (stride as u64).div_ceil(WG),
        )?;
    }
    Ok(())
}

/// The chunk passes (`backward_rows_chunks`, then `backward_column_units`; see
/// `wgsl/norm.wgsl`) of RMSNorm, LayerNorm and add+RMSNorm rows of whole chunks whose
/// residual and cotangents share the source's dtype, and of modulated RMSNorm rows whose
/// cotangent does (`mod_backward_rows_chunks`, `mod_backward_column_units`): the general
/// passes' row constants, dx (F32, or 16 bits for a 16-bit source) and partials, read 16
/// bytes a lane.
fn chunk_passes(
    saved: &Saved,
    (x, output_gradient, residual_output_gradient): (&Tensor, &Tensor, Option<&Tensor>),
    (dx, rowinfo, partials): (&Tensor, &Tensor, &Tensor),
    params: Params,
) -> Result<()> {
    let engine = x.engine();
    let weight = saved.weight.as_ref();
    let mut constants = backward_constants(saved, x, residual_output_gradient);
    constants.push(("DDX", f64::from(dx.dtype().code())));
    let scale = match saved.kind {
        NormKind::Modulated => Some(
            saved
                .scale
                .as_ref()
                .ok_or_else(|| incomplete("modulated RMSNorm needs its scale"))?,
        ),
        _ => None,
    };
    if let Some(scale) = scale {
        constants.push(("DA", f64::from(scale.dtype().code())));
    }
    let column_constants = constants.clone();
    let rows_kernel =
        crate::reduce::rows_kernel(engine, &KERNEL, &KERNEL_SUBGROUP, true, &mut constants);
    let (mean, corr) = match (&saved.mean, &saved.mean_correction) {
        (Some(m), Some(c)) => (m, c),
        _ if saved.kind == NormKind::Layer => {
            return Err(incomplete(
                "a centered norm needs its mean and mean correction",
            ));
        }
        _ => (x, x),
    };
    let residual = saved.residual.as_ref().unwrap_or(x);
    // The scale is bound twice, as words (`aux`) and as chunks (`a4`); the source stands in
    // for the residual binding, which modulated RMSNorm does not read.
    let (entries, row_buffers) = match scale {
        Some(scale) => (
            ["mod_backward_rows_chunks", "mod_backward_column_units"],
            [
                scale,
                &saved.inverse,
                rowinfo,
                x,
                weight.unwrap_or(x),
                x,
                output_gradient,
                scale,
            ],
        ),
        None => (
            ["backward_rows_chunks", "backward_column_units"],
            [
                &saved.inverse,
                rowinfo,
                x,
                weight.unwrap_or(x),
                residual,
                output_gradient,
                mean,
                corr,
            ],
        ),
    };
    engine.launch(
        rows_kernel,
        entries[0],
        &constants,
        &params,
        &row_buffers.map(Tensor::buffer),
        u64::from(params.rows),
    )?;
    // Values a lane owns: a whole 16-bit chunk where dx is 16-bit too, else 4.
    let unit = if x.dtype() != DType::F32 && dx.dtype() != DType::F32 {
        8
    } else {
        4
    };
    let total = params.stride / unit;
    let column_buffers = match scale {
        Some(scale) => [
            scale,
            rowinfo,
            x,
            weight.unwrap_or(x),
            output_gradient,
            dx,
            partials,
            scale,
        ],
        None => [
            rowinfo,
            x,
            weight.unwrap_or(x),
            residual,
            output_gradient,
            residual_output_gradient.unwrap_or(x),
            dx,
            partials,
        ],
    };
    engine.launch(
        &KERNEL,
        entries[1],
        &column_constants,
        &Params { total, ..params },
        &column_buffers.map(Tensor::buffer),
        u64::from(total).div_ceil(WG),
    )?;
    Ok(())
}

/// A parameter gradient from the blocks' partial rows of a slot starting at word `base`
/// (`partials_finish`: columns in quads, each a fixed-order sum over the blocks; `cols` and
/// `base` multiples of 4).
fn partials_finish(partials: &Tensor, base: usize, blocks: usize, cols: usize) -> Result<Tensor> {
    let engine = partials.engine();
    let out = Tensor::empty(engine, &[cols], DType::F32, "norm parameter gradient")?;
    engine.launch(
        &KERNEL,
        "partials_finish",
        &Constants::new(),
        &Params {
            cols: cols as u32,
            blocks_per_batch: blocks as u32,
            base: base as u32,
            ..Params::default()
        },
        &[out.buffer(), partials.buffer()],
        (cols as u64).div_ceil(FINISH_COLUMNS),
    )?;
    Ok(out)
}

/// The register backward of RMSNorm, LayerNorm and add+RMSNorm (see `wgsl/norm.wgsl`): one
/// workgroup per block of rows, one read of the source and cotangent, the blocks' parameter
/// partials summed in block order.
fn register_backward(
    saved: &Saved,
    x: &Tensor,
    output_gradient: &Tensor,
    residual_output_gradient: Option<&Tensor>,
    dx: Tensor,
    plan: RegisterPlan,
    slots: usize,
) -> Result<NormGradients> {
    let engine = x.engine();
    let (rows, cols) = rows_cols(x);
    let (block_rows, blocks) = register_blocks(rows, plan.wide());
    let stride = blocks * cols;
    if (slots.max(1) * stride) as u64 > u64::from(u32::MAX) {
        return Err(Error::bounds(
            "norm_backward: partial words",
            (slots * stride) as u64,
            0,
            u64::from(u32::MAX),
        ));
    }
    // At least one vec4 so the binding is never empty.
    let partials = Tensor::empty(
        engine,
        &[(slots.max(1) * stride).max(4)],
        DType::F32,
        "norm partials",
    )?;
    let weight = saved.weight.as_ref();
    let mut constants: Constants = vec![
        ("KIND", saved.kind.code()),
        ("DX", f64::from(x.dtype().code())),
        ("DW", code(weight)),
        ("HAS_W", f64::from(u8::from(weight.is_some()))),
        ("HAS_B", f64::from(u8::from(saved.has_bias))),
        (
            "HAS_DRES",
            f64::from(u8::from(residual_output_gradient.is_some())),
        ),
        ("CHUNKS", f64::from(plan.chunks)),
        ("HAS_OFFSET", f64::from(u8::from(saved.offset != 0.0))),
        ("RELOAD", f64::from(u8::from(plan.wide()))),
        ("DDX", f64::from(dx.dtype().code())),
    ];
    // RMSNorm and add+RMSNorm: the words entry (segments hold widened values; the same bits),
    // which alone reads `PREFETCH`.
    let half = x.dtype() != DType::F32;
    let words = saved.kind != NormKind::Layer
        && plan.segment == 0
        && register_backward_words(saved.kind == NormKind::AddRms, plan.wide(), half);
    if words {
        let prefetch = register_backward_prefetch(half, dx.dtype() == DType::F32, plan.wide());
        constants.push(("PREFETCH", f64::from(u8::from(prefetch))));
    }
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        stride: stride as u32,
        eps: saved.eps,
        offset: saved.offset,
        block_rows: block_rows as u32,
        ..Params::default()
    };
    // Subgroup reductions only for the 1,024-lane backwards (4–6% faster on an H200); on 256
    // and 512 lanes they were no faster, and 5–12% slower for the 16-bit LayerNorm backward
    // (`notes/h200/2026-12-01-es/subgroups/`).
    if plan.segment > 0 {
        // Workgroup memory for the segments' partials: two vec4s a lane.
        constants.push(("SEG_PARTS", (2 * plan.lanes) as f64));
    }
    let kernel = plan.kernel(engine, plan.wide() || plan.segment > 0, &mut constants);
    if saved.kind == NormKind::Layer {
        let (Some(mean), Some(corr)) = (&saved.mean, &saved.mean_correction) else {
            return Err(incomplete(
                "a centered norm needs its mean and mean correction",
            ));
        };
        engine.launch(
            kernel,
            "layer_backward_registers",
            &constants,
            &params,
            &[
                saved.inverse.buffer(),
                x.buffer(),
                weight.unwrap_or(x).buffer(),
                output_gradient.buffer(),
                dx.buffer(),
                partials.buffer(),
                mean.buffer(),
                corr.buffer(),
            ],
            blocks as u64,
        )?;
    } else {
        engine.launch(
            kernel,
            if words {
                "rms_backward_words"
            } else {
                "rms_backward_registers"
            },
            &constants,
            &params,
            &[
                saved.inverse.buffer(),
                x.buffer(),
                weight.unwrap_or(x).buffer(),
                saved.residual.as_ref().unwrap_or(x).buffer(),
                output_gradient.buffer(),
                residual_output_gradient.unwrap_or(x).buffer(),
                dx.buffer(),
                partials.buffer(),
            ],
            blocks as u64,
        )?;
    }
    // One batch: the register backward takes no modulated rows.
    let all = |slot: usize| partials_finish(&partials, slot * stride, blocks, cols);
    gradients(saved, dx, all, all)
}

// ---- GroupNorm ----

/// Options of [`group_norm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupNormOptions {
    /// ε added to the variance (default 1e-5); positive and finite.
    pub eps: f32,
}

impl Default for GroupNormOptions {
    fn default() -> Self {
        GroupNormOptions { eps: DEFAULT_EPS }
    }
}

/// Scratch bytes the backward of [`group_norm`] allocates for `samples` samples: the per-row
/// constants of the `samples × groups` rows and two FP32 partial slots of
/// `samples × channels`.
pub fn group_norm_backward_workspace_bytes(samples: usize, layout: GroupLayout) -> u64 {
    let rows = samples * layout.groups;
    let channels = layout.groups * layout.channels_per_group;
    (rows * ROWINFO * 4 + 2 * samples * channels * 4) as u64
        + crate::reduce::sum_columns_workspace_bytes(samples, 2 * channels)
}

/// GroupNorm: `x` is `[samples, channels, ...]` (the axes after the channels are the
/// spatial ones); each sample's channels are cut into `groups` runs of `channels / groups`,
/// each normalized over its channels and positions with the population variance of the
/// centered values, then `y = n · w[ch] + b[ch]`. Weight and bias (each optional) have shape
/// `[channels]`; `groups` must divide the channels. Saved statistics are per (sample, group),
/// shape `[samples, groups]`.
pub fn group_norm(
    x: &Tensor,
    groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    options: &GroupNormOptions,
) -> Result<(Tensor, Saved)> {
    let what = "group_norm";
    float(x, "group_norm: source")?;
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(Error::bounds(
            "group_norm: source axes ([samples, channels, ...])",
            shape.len() as u64,
            2,
            64,
        ));
    }
    let (samples, channels) = (shape[0], shape[1]);
    let spatial: usize = shape[2..].iter().product();
    if channels == 0 || groups == 0 || groups > channels || !channels.is_multiple_of(groups) {
        return Err(Error::bounds(
            "group_norm: groups (a divisor of the channels)",
            groups as u64,
            1,
            channels as u64,
        ));
    }
    let layout = GroupLayout {
        groups,
        channels_per_group: channels / groups,
        spatial,
    };
    let width = layout.channels_per_group * spatial;
    let view = x.reshape(&[samples * groups, width])?;
    let (rows, _) = source_extent(&view, what)?;
    if let Some(w) = weight {
        check_param(w, x.engine(), &[channels], "group_norm: weight")?;
    }
    if let Some(b) = bias {
        check_param(b, x.engine(), &[channels], "group_norm: bias")?;
    }
    check_eps(options.eps, what)?;
    let (y, correction, inverse, mean) = forward(Forward {
        kind: NormKind::Group,
        x: &view,
        aux: None,
        aux2: bias,
        weight,
        rows_per_batch: rows,
        eps: options.eps,
        offset: 0.0,
        casting: CastingMode::Gemma,
        layout: Some(layout),
    })?;
    let stats = [samples, groups];
    Ok((
        y.reshape(shape)?,
        Saved {
            kind: NormKind::Group,
            source: x.clone(),
            residual: None,
            weight: weight.cloned(),
            has_bias: bias.is_some(),
            scale: None,
            inverse: inverse.reshape(&stats)?,
            mean: mean.map(|m| m.reshape(&stats)).transpose()?,
            mean_correction: correction.map(|m| m.reshape(&stats)).transpose()?,
            group: Some(layout),
            eps: options.eps,
            offset: 0.0,
        },
    ))
}

/// Lanes of `group_partials` a (sample, channel) (`GP_LANES` in `wgsl/norm.wgsl`).
const GROUP_PARTIAL_LANES: u64 = 32;

/// The weight and bias gradients of GroupNorm: per (sample, channel) sums over the positions
/// (`group_partials`: 32 lanes a channel, a fixed tree), then the column sums over the samples
/// (`reduce::sum_columns`: blocks of 64 samples, then the blocks in order).
fn group_partials_matrix(engine: &Engine, rows: usize, layout: GroupLayout) -> Result<Tensor> {
    let channels = layout.groups * layout.channels_per_group;
    Tensor::empty(
        engine,
        &[rows / layout.groups, 2 * channels],
        DType::F32,
        "group_norm partials",
    )
}

/// The parameter gradients of GroupNorm from the `[samples, 2 · channels]` partials matrix:
/// `written` by the register backward, or summed here (`group_partials`) from x, dy and the
/// row constants.
fn group_parameter_gradients(
    saved: &Saved,
    layout: GroupLayout,
    (x, output_gradient, rowinfo): (&Tensor, &Tensor, &Tensor),
    written: Option<Tensor>,
    dx: Tensor,
) -> Result<NormGradients> {
    let engine = x.engine();
    let (rows, cols) = rows_cols(x);
    let samples = rows / layout.groups;
    let channels = layout.groups * layout.channels_per_group;
    let total = samples * channels;
    let (weight, bias) = if let Some(partials) = written {
        group_sums(saved, &partials, channels)?
    } else if saved.weight.is_some() || saved.has_bias {
        let partials = group_partials_matrix(engine, rows, layout)?;
        engine.launch(
            &KERNEL,
            "group_partials",
            &vec![
                ("KIND", NormKind::Group.code()),
                ("DX", f64::from(x.dtype().code())),
                ("DY", f64::from(output_gradient.dtype().code())),
            ],
            &Params {
                rows: rows as u32,
                cols: cols as u32,
                total: total as u32,
                groups: layout.groups as u32,
                channels_per_group: layout.channels_per_group as u32,
                spatial: layout.spatial as u32,
                ..Params::default()
            },
            &[
                x.buffer(),
                output_gradient.buffer(),
                rowinfo.buffer(),
                partials.buffer(),
            ],
            (total as u64).div_ceil(WG / GROUP_PARTIAL_LANES),
        )?;
        group_sums(saved, &partials, channels)?
    } else {
        (None, None)
    };
    Ok(NormGradients {
        source: dx,
        weight,
        bias,
        residual: None,
        scale: None,
        shift: None,
    })
}

/// (dweight, dbias) of GroupNorm: the column sums of the partials matrix over the samples,
/// in blocks of 64 then the blocks in order (`reduce::sum_columns`).
fn group_sums(
    saved: &Saved,
    partials: &Tensor,
    channels: usize,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let sums = crate::reduce::sum_columns(partials)?;
    Ok((
        saved
            .weight
            .as_ref()
            .map(|_| sums.f32_range(0, &[channels], "group_norm dweight"))
            .transpose()?,
        saved
            .has_bias
            .then(|| sums.f32_range(channels, &[channels], "group_norm dbias"))
            .transpose()?,
    ))
}

// ---- DyT ----

/// What [`dyt`] keeps for its backward.
#[derive(Debug, Clone)]
pub struct DytSaved {
    /// The source `x`.
    pub source: Tensor,
    /// α, shape `[1]`.
    pub alpha: Tensor,
    /// γ, shape `[columns]`.
    pub gamma: Tensor,
    /// Whether β was given.
    pub has_beta: bool,
}

/// Gradients of [`dyt_backward`] (FP32).
#[derive(Debug, Clone)]
pub struct DytGradients {
    /// dL/dx, the source's shape.
    pub source: Tensor,
    /// dL/dα, `[1]`.
    pub alpha: Tensor,
    /// dL/dγ, `[columns]`.
    pub gamma: Tensor,
    /// dL/dβ, `[columns]` (when β was given).
    pub beta: Option<Tensor>,
}

/// Scratch bytes [`dyt_backward`] allocates: three FP32 partial slots of `blocks × cols`
/// (blocks of [`BLOCK_ROWS`] rows), the per-column α partial sums, and the finish's sums of
/// runs of blocks ([`crate::reduce::sum_partial_groups_workspace_bytes`]).
pub fn dyt_backward_workspace_bytes(rows: usize, cols: usize) -> u64 {
    let blocks = rows.div_ceil(BLOCK_ROWS);
    (3 * blocks * cols * 4 + cols * 4) as u64
        + crate::reduce::sum_partial_groups_workspace_bytes(1, blocks, cols)
}

/// Dynamic tanh: `y = γ · tanh(α · x) + β` with a trainable scalar α (`[1]`), γ and β
/// (optional) of shape `[columns]`. Elementwise (any width; the output has the source's dtype).
pub fn dyt(
    x: &Tensor,
    alpha: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
) -> Result<(Tensor, DytSaved)> {
    let (rows, cols) = source_extent(x, "dyt")?;
    let engine = x.engine();
    check_param(alpha, engine, &[1], "dyt: alpha")?;
    check_param(gamma, engine, &[cols], "dyt: gamma")?;
    if let Some(b) = beta {
        check_param(b, engine, &[cols], "dyt: beta")?;
    }
    let y = Tensor::empty(engine, x.shape(), x.dtype(), "dyt output")?;
    let constants: Constants = vec![
        ("DX", f64::from(x.dtype().code())),
        ("DA", f64::from(alpha.dtype().code())),
        ("DB", code(beta)),
        ("DW", f64::from(gamma.dtype().code())),
        ("HAS_B", f64::from(u8::from(beta.is_some()))),
    ];
    // Rows of whole chunks: one invocation a chunk (16-byte loads and stores); else one a pair
    // of elements.
    let (entry, total, buffers) = match row_chunks(cols, x.dtype()) {
        Some(chunks) => (
            "dyt_forward_chunks",
            rows * chunks,
            [alpha, x, &y, gamma, beta.unwrap_or(gamma)],
        ),
        None => (
            "dyt_forward",
            (rows * cols).div_ceil(2),
            [x, alpha, beta.unwrap_or(x), gamma, &y],
        ),
    };
    engine.launch(
        &KERNEL,
        entry,
        &constants,
        &Params {
            rows: rows as u32,
            cols: cols as u32,
            rows_per_batch: rows as u32,
            total: total as u32,
            ..Params::default()
        },
        &buffers.map(Tensor::buffer),
        (total as u64).div_ceil(WG),
    )?;
    Ok((
        y,
        DytSaved {
            source: x.clone(),
            alpha: alpha.clone(),
            gamma: gamma.clone(),
            has_beta: beta.is_some(),
        },
    ))
}

/// Backward of [`dyt`]: `output_gradient` has the source's shape (any float dtype).
pub fn dyt_backward(saved: &DytSaved, output_gradient: &Tensor) -> Result<DytGradients> {
    let x = &saved.source;
    let engine = x.engine();
    let (rows, cols) = source_extent(x, "dyt_backward")?;
    check_same_shape(output_gradient, x, "dyt_backward: output gradient")?;
    check_param(&saved.alpha, engine, &[1], "dyt_backward: saved alpha")?;
    check_param(&saved.gamma, engine, &[cols], "dyt_backward: saved gamma")?;
    engine.check_workspace("dyt_backward", dyt_backward_workspace_bytes(rows, cols))?;
    let blocks = rows.div_ceil(BLOCK_ROWS);
    let stride = blocks * cols;
    if (3 * stride) as u64 > u64::from(u32::MAX) {
        return Err(Error::bounds(
            "dyt_backward: partial words",
            (3 * stride) as u64,
            0,
            u64::from(u32::MAX),
        ));
    }
    let dx = Tensor::empty(engine, x.shape(), DType::F32, "dyt source gradient")?;
    let partials = Tensor::empty(engine, &[3 * stride], DType::F32, "dyt partials")?;
    let constants: Constants = vec![
        ("DX", f64::from(x.dtype().code())),
        ("DA", f64::from(saved.alpha.dtype().code())),
        ("DW", f64::from(saved.gamma.dtype().code())),
        ("DY", f64::from(output_gradient.dtype().code())),
        ("HAS_B", f64::from(u8::from(saved.has_beta))),
    ];
    // Rows of whole chunks with dy in x's dtype: one invocation a (block, column chunk), the
    // same bits; else one a (block, column).
    let chunks = row_chunks(cols, x.dtype()).filter(|_| output_gradient.dtype() == x.dtype());
    let (alpha, gamma) = (&saved.alpha, &saved.gamma);
    let (entry, total, buffers) = match chunks {
        Some(chunks) => (
            "dyt_backward_chunks",
            blocks * chunks,
            [alpha, x, gamma, output_gradient, &dx, &partials],
        ),
        None => (
            "dyt_backward_columns",
            stride,
            [x, alpha, gamma, output_gradient, &dx, &partials],
        ),
    };
    engine.launch(
        &KERNEL,
        entry,
        &constants,
        &Params {
            rows: rows as u32,
            cols: cols as u32,
            rows_per_batch: rows as u32,
            blocks_per_batch: blocks as u32,
            total: total as u32,
            stride: stride as u32,
            ..Params::default()
        },
        &buffers.map(Tensor::buffer),
        (total as u64).div_ceil(WG),
    )?;
    let gamma = finish(engine, &partials, 0, stride, 1, blocks, cols)?.reshape(&[cols])?;
    let beta = if saved.has_beta {
        Some(finish(engine, &partials, 1, stride, 1, blocks, cols)?.reshape(&[cols])?)
    } else {
        None
    };
    let alpha_columns = finish(engine, &partials, 2, stride, 1, blocks, cols)?;
    let alpha = crate::reduce::sum_rows(&alpha_columns)?;
    Ok(DytGradients {
        source: dx,
        alpha,
        gamma,
        beta,
    })
}

// ---- PolyNorm ----

/// Default ε of [`poly_norm`].
pub const POLY_DEFAULT_EPS: f32 = 1e-6;

/// Options of [`poly_norm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolyNormOptions {
    /// ε added to each mean square (default 1e-6); positive and finite.
    pub eps: f32,
}

impl Default for PolyNormOptions {
    fn default() -> Self {
        PolyNormOptions {
            eps: POLY_DEFAULT_EPS,
        }
    }
}

/// What [`poly_norm`] keeps for its backward.
#[derive(Debug, Clone)]
pub struct PolySaved {
    /// The source `x`.
    pub source: Tensor,
    /// The weights `(w0, w1, w2)`, shape `[3]`.
    pub weight: Tensor,
    /// Whether a bias was given.
    pub has_bias: bool,
    /// Per-row inverse RMS of `x³`, `x²`, `x` (in that order), F32, shape `[rows, 3]`.
    pub inverse: Tensor,
    /// ε used.
    pub eps: f32,
}

/// Gradients of [`poly_norm_backward`] (FP32).
#[derive(Debug, Clone)]
pub struct PolyGradients {
    /// dL/dx, the source's shape.
    pub source: Tensor,
    /// dL/dw, `[3]`.
    pub weight: Tensor,
    /// dL/db, `[1]` (when a bias was given).
    pub bias: Option<Tensor>,
}

/// Scratch bytes [`poly_norm_backward`] allocates: the per-row constants and four FP32
/// partial slots of `blocks × cols`, then their per-column sums (and the finish's sums of
/// runs of blocks, [`crate::reduce::sum_partial_groups_workspace_bytes`]).
pub fn poly_backward_workspace_bytes(rows: usize, cols: usize) -> u64 {
    let blocks = rows.div_ceil(BLOCK_ROWS);
    (rows * ROWINFO * 4 + 4 * blocks * cols * 4 + 4 * cols * 4) as u64
        + crate::reduce::sum_partial_groups_workspace_bytes(3, blocks, cols)
}

/// PolyNorm: `y = w0·n(x³) + w1·n(x²) + w2·n(x) + b` per row, `n(u) = u/sqrt(mean(u²) + ε)`.
/// `weight` has shape `[3]`, `bias` (optional) `[1]`. Output in the source dtype.
pub fn poly_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: &PolyNormOptions,
) -> Result<(Tensor, PolySaved)> {
    let (rows, cols) = source_extent(x, "poly_norm")?;
    let engine = x.engine();
    check_param(weight, engine, &[3], "poly_norm: weight")?;
    if let Some(b) = bias {
        check_param(b, engine, &[1], "poly_norm: bias")?;
    }
    check_eps(options.eps, "poly_norm")?;
    let dtype = x.dtype();
    let pairs = dtype != DType::F32 && cols.is_multiple_of(2);
    let direct = dtype == DType::F32 || pairs;
    engine.check_workspace(
        "poly_norm",
        forward_workspace_bytes(NormKind::Rms, rows, cols, dtype),
    )?;
    let y = Tensor::empty(
        engine,
        x.shape(),
        if direct { dtype } else { DType::F32 },
        "poly_norm output",
    )?;
    let inverse = Tensor::empty(engine, &[rows, 3], DType::F32, "poly_norm inverse")?;
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        rows_per_batch: rows as u32,
        eps: options.eps,
        ..Params::default()
    };
    // Rows of whole chunks within the lanes' registers: one read of the row (the lanes of
    // RMSNorm's register forward, which holds as much, without its 16-bit rule: `poly`).
    let plan = forward_plan(engine, NormKind::Rms, cols, dtype, true);
    let mut constants: Constants = vec![
        ("DX", f64::from(dtype.code())),
        ("DB", code(bias)),
        ("DW", f64::from(weight.dtype().code())),
        ("HAS_B", f64::from(u8::from(bias.is_some()))),
        ("PAIRS", f64::from(u8::from(pairs))),
    ];
    let bias_or_x = bias.unwrap_or(x);
    let (kernel, entry, buffers, workgroups) = match plan {
        Some(plan) => (
            {
                constants.push(("CHUNKS", f64::from(plan.chunks)));
                plan.kernel(engine, true, &mut constants)
            },
            "poly_forward_registers",
            [bias_or_x, weight, &inverse, x, &y],
            plan.workgroups(rows),
        ),
        None => (
            &KERNEL,
            "poly_forward",
            [x, bias_or_x, weight, &inverse, &y],
            rows as u64,
        ),
    };
    engine.launch(
        kernel,
        entry,
        &constants,
        &params,
        &buffers.map(Tensor::buffer),
        workgroups,
    )?;
    let y = if direct { y } else { cast::cast(&y, dtype)? };
    Ok((
        y,
        PolySaved {
            source: x.clone(),
            weight: weight.clone(),
            has_bias: bias.is_some(),
            inverse,
            eps: options.eps,
        },
    ))
}

/// Backward of [`poly_norm`]: `output_gradient` has the source's shape (any float dtype).
pub fn poly_norm_backward(saved: &PolySaved, output_gradient: &Tensor) -> Result<PolyGradients> {
    let x = &saved.source;
    let engine = x.engine();
    let (rows, cols) = source_extent(x, "poly_norm_backward")?;
    check_same_shape(output_gradient, x, "poly_norm_backward: output gradient")?;
    check_param(
        &saved.weight,
        engine,
        &[3],
        "poly_norm_backward: saved weight",
    )?;
    check_stats(
        &saved.inverse,
        engine,
        3 * rows,
        "poly_norm_backward: saved inverse",
    )?;
    check_eps(saved.eps, "poly_norm_backward: saved")?;
    engine.check_workspace(
        "poly_norm_backward",
        poly_backward_workspace_bytes(rows, cols),
    )?;
    let blocks = rows.div_ceil(BLOCK_ROWS);
    let stride = blocks * cols;
    if (4 * stride) as u64 > u64::from(u32::MAX) {
        return Err(Error::bounds(
            "poly_norm_backward: partial words",
            (4 * stride) as u64,
            0,
            u64::from(u32::MAX),
        ));
    }
    let dx = Tensor::empty(engine, x.shape(), DType::F32, "poly_norm source gradient")?;
    // Rows of whole chunks with dy in x's dtype, within the lanes' registers: one read of x
    // and dy (the lanes of RMSNorm's register forward), the weights' gradients from per-row
    // sums.
    let plan = (output_gradient.dtype() == x.dtype())
        .then(|| register_plan(engine, cols, x.dtype(), REGISTER_CHUNKS as u32))
        .flatten()
        .and_then(|_| {
            let chunks = row_chunks(cols, x.dtype())?;
            RegisterPlan::on(
                // PolyNorm keeps the four-chunk rule (`half` false): the 16-bit one was
                // measured on RMSNorm's and LayerNorm's forwards only.
                forward_lanes(NormKind::Rms, chunks, max_lanes(engine), false)?,
                chunks,
            )
        });
    if let Some(plan) = plan {
        let sums = Tensor::empty(engine, &[3, rows], DType::F32, "poly_norm row sums")?;
        let bias_sums = Tensor::empty(engine, &[1, rows], DType::F32, "poly_norm bias sums")?;
        let mut constants: Constants = vec![
            ("DX", f64::from(x.dtype().code())),
            ("DW", f64::from(saved.weight.dtype().code())),
            ("CHUNKS", f64::from(plan.chunks)),
        ];
        let kernel = plan.kernel(engine, true, &mut constants);
        engine.launch(
            kernel,
            "poly_backward_registers",
            &constants,
            &Params {
                rows: rows as u32,
                cols: cols as u32,
                eps: saved.eps,
                ..Params::default()
            },
            &[
                saved.weight.buffer(),
                saved.inverse.buffer(),
                bias_sums.buffer(),
                sums.buffer(),
                x.buffer(),
                output_gradient.buffer(),
                dx.buffer(),
            ],
            rows as u64,
        )?;
        let weight = crate::reduce::sum_rows(&sums)?;
        let bias = if saved.has_bias {
            Some(crate::reduce::sum_rows(&bias_sums)?)
        } else {
            None
        };
        return Ok(PolyGradients {
            source: dx,
            weight,
            bias,
        });
    }
    let rowinfo = Tensor::empty(engine, &[rows, ROWINFO], DType::F32, "poly_norm rows")?;
    let partials = Tensor::empty(engine, &[4 * stride], DType::F32, "poly_norm partials")?;
    let constants: Constants = vec![
        ("DX", f64::from(x.dtype().code())),
        ("DW", f64::from(saved.weight.dtype().code())),
        ("DY", f64::from(output_gradient.dtype().code())),
        ("HAS_B", f64::from(u8::from(saved.has_bias))),
    ];
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        rows_per_batch: rows as u32,
        blocks_per_batch: blocks as u32,
        total: stride as u32,
        stride: stride as u32,
        base: 0,
        eps: saved.eps,
        offset: 0.0,
        ..Params::default()
    };
    engine.launch(
        &KERNEL,
        "poly_backward_rows",
        &constants,
        &params,
        &[
            x.buffer(),
            saved.weight.buffer(),
            saved.inverse.buffer(),
            output_gradient.buffer(),
            rowinfo.buffer(),
        ],
        rows as u64,
    )?;
    engine.launch(
        &KERNEL,
        "poly_backward_columns",
        &constants,
        &params,
        &[
            x.buffer(),
            saved.weight.buffer(),
            output_gradient.buffer(),
            rowinfo.buffer(),
            dx.buffer(),
            partials.buffer(),
        ],
        (stride as u64).div_ceil(WG),
    )?;
    let weight = crate::reduce::sum_rows(&finish(engine, &partials, 0, stride, 3, blocks, cols)?)?;
    let bias = if saved.has_bias {
        Some(crate::reduce::sum_rows(&finish(
            engine, &partials, 3, stride, 1, blocks, cols,
        )?)?)
    } else {
        None
    };
    Ok(PolyGradients {
        source: dx,
        weight,
        bias,
    })
}
