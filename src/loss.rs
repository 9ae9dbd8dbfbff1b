//! Losses and normalizers over the last axis, forward and backward: [`softmax`],
//! [`log_softmax`], [`sparsemax`], [`cross_entropy`] (integer targets, with ignore_index, label
//! smoothing, z-loss, logit softcap and class weights), [`cross_entropy_soft`] (probability
//! targets), [`kl_div`], [`jsd`] and [`tvd`].
//!
//! Shapes: the last axis is the class axis, leading axes flatten to rows. Inputs are F32, F16
//! or BF16 storage; every statistic, loss and gradient is computed and returned in F32. The
//! row outputs of softmax, log-softmax and sparsemax have the input's dtype.
//!
//! How it runs: one workgroup of 256 lanes per row; lane `t` takes columns `t, t+256, ...` with
//! an online maximum and sum of exponentials, and lanes meet in fixed-order trees, so a row of
//! any width (tested to 262,144 classes) is one or two passes over the logits and never sits
//! in workgroup memory. When a row is a whole number of `vec4<u32>` chunks (columns a multiple
//! of 4 for F32, of 8 for F16/BF16), softmax, log-softmax and cross-entropy read whole chunks
//! (`*_v` entry points, 16-bit halves widened two at a time); otherwise element by element.
//! Softmax rows of such chunks wider than 2,048 chunks and up to 8,192 (8,193–32,768 F32 or
//! 16,385–65,536 16-bit columns) are held in registers and read once, forward
//! (`softmax_fwd_r`: each lane's maximum and sum over its chunks, then the row's in one
//! fan-in-8 tree of (maximum, sum) pairs) and backward with dy in x's dtype (`softmax_bwd_r`
//! for F32, its row sum by a fan-in-8 tree for the softmax and by the binary one for the
//! log-softmax; `softmax_bwd_h` for F16/BF16: lanes by half chunk, 8-byte loads of x and dy and one F32
//! vec4 of dx a lane, so the gradient's stores are contiguous, the row sum by a fan-in-8 tree,
//! the softmax probabilities computed once and held where they fit): one workgroup of 1024 lanes
//! per row (at most 8 chunks of each row tensor a lane) where the adapter allows 1024
//! invocations, else 256 lanes (the backward then up to 4,096 chunks). The softmax and
//! log-softmax forwards of 16-bit rows of up to 4,096 chunks (8–32,768 columns, a multiple of
//! 8) take `softmax_fwd_c` instead: 256 lanes, each holding up to 16 chunks in registers,
//! read once; the row maximum, then Σ exp(x − max), then the outputs, from the registers
//! (the rule is `held_row`). The 16-bit cross-entropy forward without a softcap or label
//! smoothing takes each step of four chunks a lane as one group (its maximum first, then one
//! rescale of the running sum and one argmax test; `ce_lane_group`), the in-place statistics
//! the same. [`cross_entropy_in_place`] computes the loss and writes the
//! gradient over the logits in one launch over them; [`cross_entropy_backward_as`] stores the
//! gradient in F16/BF16 in a fresh tensor (the F32 values rounded once). Forwards save the row maximum and the log denominator as two values (a
//! common shift of 1e4 leaves loss differences of 1e-3 intact); backwards recompute the
//! probabilities from the saved input and statistics, so no probability matrix is ever stored.
//! Sums over rows are per-row values reduced by [`crate::reduce::sum_columns`] (fixed order),
//! then a one-thread finish kernel; no atomics, reruns are bit-identical.
//!
//! Bounds: any number of columns ≥ 1 (cross-entropy, sparsemax, divergences; softmax also
//! accepts 0) and of rows. A tensor may exceed one storage binding (up to the device's
//! `max_buffer_size`, `Engine::max_tensor_bytes`): every entry here runs over windows of rows
//! that each fit a binding (`Engine::max_binding_bytes`), launching its kernels once a window
//! with the same per-row arithmetic, so the results are the bits of a one-binding run. Only a
//! row too wide for one window (the binding alignment's rows of the widest tensor past the
//! binding) and per-row tensors (targets, statistics: 32 bytes a row at most) past one binding
//! give `Error::LimitExceeded`. Row counts are exact up to 2²⁴ counted rows (they are summed
//! in F32). Scratch beyond the outputs: the per-row matrix of the cross-entropy
//! (`32·rows` bytes plus its column-sum partials) and of the divergences (`8·rows`), see
//! [`cross_entropy_workspace_bytes`] and [`divergence_workspace_bytes`]; the in-place
//! cross-entropy keeps one block of 4,096 rows' matrix
//! ([`cross_entropy_in_place_workspace_bytes`]).

use crate::engine::Bind;
use crate::kernel::{
    COMMON_ROWS, COMMON_ROWS_SUBGROUP, COMMON_SOFTCAP, Constants, Kernel, rows_module,
};
use crate::reduce::{
    BLOCK_ROWS, column_partials_at, rows_cols, sum_columns, sum_columns_workspace_bytes,
    sum_partials,
};
use crate::tensor::row_windows;
use crate::{DType, Engine, Error, Result, Tensor};
use std::ops::Range;

/// `wgsl/loss.wgsl` with a row-reduction snippet and a workgroup size.
macro_rules! loss_module {
    ($name:literal, $rows:expr, $wg:literal) => {
        rows_module!(
            $name,
            $rows,
            [COMMON_SOFTCAP],
            $wg,
            include_str!("../wgsl/loss.wgsl")
        )
    };
}

/// `wgsl/loss.wgsl` with 256-lane workgroups: every entry point.
pub static KERNEL: Kernel = loss_module!("loss", COMMON_ROWS, 256);

/// `wgsl/loss.wgsl` with 1024-lane workgroups, for the register-resident softmax rows
/// (`softmax_fwd_r`, `softmax_bwd_r`: four times the lanes hold a row in a quarter of the
/// registers a lane) on adapters that allow 1024 invocations.
pub static ROWS_KERNEL: Kernel = loss_module!("loss_rows", COMMON_ROWS, 1024);

/// [`KERNEL`] with the register rows (`softmax_fwd_c`, `softmax_bwd_h`) reduced by subgroup
/// shuffles (`wgsl/common/rows_subgroup.wgsl`): the 16-bit softmax forward's module where the
/// adapter has `SUBGROUP` (`reduce::rows_kernel`; `reduce::force_subgroup_rows` overrides).
pub static KERNEL_SUBGROUP: Kernel = loss_module!("loss_subgroup", COMMON_ROWS_SUBGROUP, 256);

/// [`ROWS_KERNEL`] with subgroup row reductions (see [`KERNEL_SUBGROUP`]).
pub static ROWS_KERNEL_SUBGROUP: Kernel =
    loss_module!("loss_rows_subgroup", COMMON_ROWS_SUBGROUP, 1024);

/// The subgroup twin of a loss module.
fn subgroup_twin(kernel: &'static Kernel) -> &'static Kernel {
    if std::ptr::eq(kernel, &ROWS_KERNEL) {
        &ROWS_KERNEL_SUBGROUP
    } else {
        &KERNEL_SUBGROUP
    }
}

const WG: u64 = 256;
const ROWS_WG: u64 = 1024;
const CE_COLS: usize = 8;
/// Most chunks a register-resident softmax row has: 8 a lane with 1024 lanes, 32 with 256
/// (32,768 F32 or 65,536 F16/BF16 columns) in the forward; the backward holds x and dy, 8 of
/// each a lane with 1024 lanes (the same rows), 16 with 256 (half the width).
const REGISTER_ROW_CHUNKS: u64 = 8192;
/// Rows of at most this many chunks run the two-pass entry (better occupancy than one row
/// in the registers of a workgroup).
const REGISTER_MIN_CHUNKS: u64 = 2048;

/// Most chunks a lane holds in `softmax_fwd_c` (256 lanes): 16-bit rows of up to 4,096 chunks
/// (32,768 columns).
const LANE_CHUNKS: u64 = 16;

/// The rule for the softmax / log-softmax forward of rows of whole chunks: `Some(CHUNKS)` when
/// a row of `chunks` chunks of `dtype` takes `softmax_fwd_c` (256 lanes, each holding CHUNKS
/// chunks in registers, the row read once): 16-bit rows of at most 16 × 256 = 4,096 chunks,
/// CHUNKS the smallest power of two with CHUNKS × 256 ≥ chunks (1, 2, 4, 8 or 16). `None`
/// otherwise: F32 rows, and 16-bit rows of more chunks, take [`register_row`]'s entries (wider
/// 16-bit rows of up to 8,192 chunks) or `softmax_fwd_v`.
fn held_row(dtype: DType, chunks: u64) -> Option<u64> {
    let forced_wide = FORCED_ROW_LANES.with(std::cell::Cell::get) == Some(ROWS_WG);
    if forced_wide || dtype == DType::F32 || chunks == 0 || chunks > LANE_CHUNKS * WG {
        return None;
    }
    Some(chunks.div_ceil(WG).next_power_of_two())
}

thread_local! {
    static FORCED_ROW_LANES: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Forces the lanes of the register-resident softmax rows for launches from the calling
/// thread: 256 (`KERNEL`, also where the adapter allows 1,024) or 1,024 (`ROWS_KERNEL` where
/// allowed, also for the 16-bit forwards `held_row` would take); `None`: the rule. Results may
/// differ in the last bits between lane counts; for tests and measurements.
#[doc(hidden)]
pub fn force_row_lanes(lanes: Option<u64>) {
    FORCED_ROW_LANES.with(|f| f.set(lanes));
}

/// The register-resident kernel and chunks per lane (`RK`/`RB`, a power of two) for a row of
/// `chunks` vec4 chunks, holding `tensors` row tensors (1: forward, 2: backward); `None` when
/// the row takes the two-pass entry.
fn register_row(engine: &Engine, chunks: u64, tensors: u64) -> Option<(&'static Kernel, u64)> {
    if chunks <= REGISTER_MIN_CHUNKS {
        return None;
    }
    let allowed = u64::from(engine.info().limits.max_compute_invocations_per_workgroup) >= ROWS_WG;
    let wide = match FORCED_ROW_LANES.with(std::cell::Cell::get) {
        Some(WG) => false,
        _ => allowed,
    };
    let (kernel, lanes, most) = if wide {
        (&ROWS_KERNEL, ROWS_WG, REGISTER_ROW_CHUNKS)
    } else {
        (&KERNEL, WG, REGISTER_ROW_CHUNKS / tensors)
    };
    if chunks > most {
        return None;
    }
    Some((kernel, chunks.div_ceil(lanes).next_power_of_two()))
}

std::thread_local! {
    static FORCED_WHOLE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Forces whether register-resident 16-bit softmax backward rows hold whole chunks a lane
/// (`softmax_bwd_r`) or half chunks (`softmax_bwd_h`), for launches from the calling thread;
/// `None` for the rule ([`whole_chunk_backward`]). The two sum a row in different orders, so
/// results may differ in the last bits between them (each is bit-identical on reruns, and its
/// 16-bit gradient is its own F32 gradient rounded once); for measurements.
#[doc(hidden)]
pub fn force_whole_chunk_backward(whole: Option<bool>) {
    FORCED_WHOLE.with(|f| f.set(whole));
}

/// Whether a register-resident 16-bit softmax backward row holds whole chunks a lane.
fn whole_chunk_backward() -> bool {
    FORCED_WHOLE.with(std::cell::Cell::get).unwrap_or(false)
}

const F_WEIGHT: u32 = 1;
const F_LABELS: u32 = 2;
const F_LOG_TARGET: u32 = 4;
const F_COT_ROW: u32 = 8;
const F_COT_ELEM: u32 = 16;
const F_MEAN: u32 = 32;
const F_BATCHMEAN: u32 = 64;
const F_PARTIALS: u32 = 128;
const F_NO_PRED: u32 = 256;
const F_ENTROPY: u32 = 512;

#[derive(encase::ShaderType, Default)]
struct Params {
    rows: u32,
    cols: u32,
    flags: u32,
    ignore_index: i32,
    a: f32,
    b: f32,
    c: f32,
    /// First row of the per-row tensors (targets/labels, per-row statistics, predictions,
    /// per-row cotangents) when a launch covers a block of rows of a larger batch.
    row0: u32,
    /// Cross-entropy gradients over a block of columns: the class of column 0.
    col0: u32,
    /// Cross-entropy: the number of classes when a launch covers a block of columns (0: the
    /// row width).
    classes: u32,
    /// `ce_grad_over` with `F_PARTIALS`: the first word of its block's column partials.
    partials: u32,
}

fn constants(dt: DType, tdt: DType, odt: DType, mode: u32) -> Constants {
    vec![
        ("DT", f64::from(dt.code())),
        ("TDT", f64::from(tdt.code())),
        ("ODT", f64::from(odt.code())),
        ("MODE", f64::from(mode)),
    ]
}

fn float_input(x: &Tensor, what: &str) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, x.dtype(), &DType::FLOATS))
    }
}

fn u32_extent(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::bounds(what, n as u64, 0, u64::from(u32::MAX)))
}

fn finite(what: &str, v: f64, rule: &str, ok: bool) -> Result<()> {
    if ok && v.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidValue {
            what: what.into(),
            got: v,
            rule: rule.into(),
        })
    }
}

/// (rows, cols) of a float input with every extent checked against the kernels' u32 indices.
fn matrix(x: &Tensor, what: &str) -> Result<(usize, usize)> {
    float_input(x, what)?;
    let (rows, cols) = rows_cols(x);
    u32_extent(&format!("{what}: rows"), rows)?;
    u32_extent(&format!("{what}: columns"), cols)?;
    u32_extent(&format!("{what}: elements"), x.len())?;
    Ok((rows, cols))
}

fn leading(x: &Tensor) -> &[usize] {
    &x.shape()[..x.shape().len().saturating_sub(1)]
}

fn same_shape(what: &str, expected: &Tensor, got: &Tensor) -> Result<()> {
    if expected.shape() == got.shape() {
        Ok(())
    } else {
        Err(Error::shape(what, expected.shape(), got.shape()))
    }
}

fn classes_at_least_one(what: &str, cols: usize) -> Result<()> {
    if cols == 0 {
        return Err(Error::bounds(
            format!("{what}: classes"),
            0,
            1,
            u64::from(u32::MAX),
        ));
    }
    Ok(())
}

/// Values of one 16-byte chunk: 4 F32 or 8 16-bit values.
fn chunk_len(dtype: DType) -> usize {
    if dtype == DType::F32 { 4 } else { 8 }
}

/// Whether rows of `cols` elements of `dtype` are whole vec4<u32> chunks (4 F32 or 8 16-bit
/// elements), so the vectorized entry points apply.
pub(crate) fn vectorized(dtype: DType, cols: usize) -> bool {
    cols > 0 && cols.is_multiple_of(chunk_len(dtype))
}

fn check_engine(engine: &Engine, tensors: &[(&Tensor, &str)]) -> Result<()> {
    for (t, what) in tensors {
        t.check_engine(engine, what)?;
    }
    Ok(())
}

/// The parameters of a row launch over the window `w` of rows of `cols` columns.
fn window_params(w: &Range<usize>, cols: usize) -> Params {
    Params {
        rows: w.len() as u32,
        cols: cols as u32,
        ..Default::default()
    }
}

/// Bytes of one row of `cols` values of each dtype, then `extra` (the windows' rows of each
/// tensor, [`row_windows`]).
fn row_bytes_of(cols: usize, dtypes: &[DType], extra: &[u64]) -> Vec<u64> {
    dtypes
        .iter()
        .map(|d| (cols * d.size()) as u64)
        .chain(extra.iter().copied())
        .collect()
}

/// A row output of `x`'s shape and dtype, written by `entry` (directly, or through an F32
/// temporary narrowed by `cast` when a 16-bit row does not start on a word boundary).
fn row_output(
    x: &Tensor,
    entry: &str,
    mode: u32,
    rows: usize,
    cols: usize,
) -> Result<(Tensor, Tensor)> {
    let engine = x.engine();
    let direct = x.dtype() == DType::F32 || cols.is_multiple_of(2);
    let odt = if direct { x.dtype() } else { DType::F32 };
    let out = Tensor::empty(engine, x.shape(), odt, entry)?;
    let stats = Tensor::empty(engine, &[rows, 2], DType::F32, entry)?;
    let mut consts = constants(x.dtype(), DType::F32, odt, mode);
    let chunks = (cols / chunk_len(x.dtype())) as u64;
    // The kernel and entry (the same for every window); `stats_first`: the chunked softmax
    // entries bind the statistics before the rows.
    let (kernel, entry, stats_first) = if entry == "softmax_fwd" && vectorized(x.dtype(), cols) {
        // 16-bit rows of up to 4,096 chunks and wide rows stay in registers (one read);
        // others take two passes.
        if let Some(per_lane) = held_row(x.dtype(), chunks) {
            consts.push(("CHUNKS", per_lane as f64));
            // Subgroup reductions where the adapter has them: 1.3% faster on an H200
            // (`notes/h200/2026-12-01-es/subgroups/`).
            let kernel =
                crate::reduce::rows_kernel(engine, &KERNEL, &KERNEL_SUBGROUP, true, &mut consts);
            (kernel, "softmax_fwd_c", true)
        } else if let Some((kernel, per_lane)) = register_row(engine, chunks, 1) {
            consts.push(("RK", per_lane as f64));
            (kernel, "softmax_fwd_r", true)
        } else {
            (&KERNEL, "softmax_fwd_v", true)
        }
    } else {
        (&KERNEL, entry, false)
    };
    // Every tensor is per row (the statistics two F32 values a row): windows of rows bind
    // each one's rows where a tensor exceeds one binding.
    let row_bytes = row_bytes_of(cols, &[x.dtype(), odt], &[8]);
    for w in row_windows(engine, entry, rows, &row_bytes)? {
        let (xb, ob, sb) = (
            x.bind_rows(&w, cols),
            out.bind_rows(&w, cols),
            stats.bind_rows(&w, 2),
        );
        let binds = if stats_first {
            [sb, xb, ob]
        } else {
            [xb, ob, sb]
        };
        let params = window_params(&w, cols);
        engine.launch_bound(kernel, entry, &consts, &params, &binds, w.len() as u64)?;
    }
    let out = if direct {
        out
    } else {
        crate::cast::cast(&out, x.dtype())?
    };
    Ok((out, stats))
}

// ---- softmax / log-softmax ------------------------------------------------------------------

/// What [`softmax`] and [`log_softmax`] keep for their backward.
#[derive(Debug, Clone)]
pub struct SoftmaxSaved {
    input: Tensor,
    stats: Tensor,
    log: bool,
}

impl SoftmaxSaved {
    /// `[rows, 2]` F32: per row the maximum and the log denominator `log Σ exp(x − max)`,
    /// kept as two values.
    pub fn stats(&self) -> &Tensor {
        &self.stats
    }
}

fn softmax_forward(x: &Tensor, log: bool) -> Result<(Tensor, SoftmaxSaved)> {
    let what = if log { "log_softmax" } else { "softmax" };
    let (rows, cols) = matrix(x, what)?;
    let (out, stats) = row_output(x, "softmax_fwd", u32::from(log), rows, cols)?;
    Ok((
        out,
        SoftmaxSaved {
            input: x.clone(),
            stats,
            log,
        },
    ))
}

/// `softmax(x)` over the last axis, in `x`'s dtype, with the saved context for
/// [`softmax_backward`]. Rows are shifted by their maximum; a row of −∞ gives NaN (as PyTorch).
/// Errors: a non-float `x`, rows too wide for one binding window (`LimitExceeded`; see the module bounds).
pub fn softmax(x: &Tensor) -> Result<(Tensor, SoftmaxSaved)> {
    softmax_forward(x, false)
}

/// `log_softmax(x) = (x − max) − log Σ exp(x − max)` over the last axis, in `x`'s dtype.
pub fn log_softmax(x: &Tensor) -> Result<(Tensor, SoftmaxSaved)> {
    softmax_forward(x, true)
}

/// Gradient of [`softmax`] or [`log_softmax`] with respect to `x` (F32, `x`'s shape) for the
/// cotangent `dy` (any float dtype, the output's shape). Probabilities are recomputed in FP32
/// from the saved input and statistics (not from the rounded output): softmax
/// `dx = p (dy − Σ dy p)`, log-softmax `dx = dy − p Σ dy`.
pub fn softmax_backward(saved: &SoftmaxSaved, dy: &Tensor) -> Result<Tensor> {
    softmax_backward_as(saved, dy, DType::F32)
}

/// [`softmax_backward`] with the gradient stored in `dtype`: F32 gives that function's result;
/// F16 or BF16 gives the F32 gradient rounded once to nearest-even (bit for bit `cast::cast` of
/// it; a NaN stays a NaN, its payload may differ), in a fresh tensor. 16-bit `x` and `dy` of
/// one dtype in rows of whole 8-value chunks
/// (`softmax_bwd_h` in the register range, `softmax_bwd_v` otherwise) write it directly (2
/// bytes an element instead of 4); every other case computes the F32 gradient and narrows it.
///
/// Errors: those of [`softmax_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn softmax_backward_as(saved: &SoftmaxSaved, dy: &Tensor, dtype: DType) -> Result<Tensor> {
    let x = &saved.input;
    softmax_backward_inputs("softmax_backward_as", x, dy, dtype)?;
    softmax_backward_launch(x, Some(&saved.stats), saved.log, dy, dtype)
}

/// The checks of a softmax backward's cotangent and gradient dtype against `x` (the input or
/// the output).
fn softmax_backward_inputs(what: &str, x: &Tensor, dy: &Tensor, dtype: DType) -> Result<()> {
    check_engine(x.engine(), &[(dy, &format!("{what}: dy"))])?;
    float_input(dy, &format!("{what}: dy"))?;
    same_shape(&format!("{what}: dy"), x, dy)?;
    if !dtype.is_float() {
        return Err(Error::dtype(
            format!("{what}: dtype"),
            dtype,
            &DType::FLOATS,
        ));
    }
    Ok(())
}

/// Gradient of softmax (`log = false`) or log-softmax (`log = true`) from the forward's
/// output `y` (as stored, any float dtype) and the cotangent `dy` (any float dtype, `y`'s
/// shape), stored in `dtype` (F32, F16 or BF16; 16-bit ones rounded once from the FP32
/// values): softmax `dx = y (dy − Σ dy y)`, log-softmax `dx = dy − exp(y) Σ dy`, FP32 math,
/// row sums in fixed order. The rule of PyTorch's softmax backward: no saved input or
/// statistics, and the probabilities are the stored (rounded) output, so a 16-bit `y` gives a
/// gradient within the output's rounding of [`softmax_backward`]'s, and no exponential is
/// computed for softmax. Same kernels and paths as [`softmax_backward_as`].
///
/// Errors: a non-float `y`, `dy` or `dtype` (`UnsupportedDType`), shapes that differ,
/// tensors of another engine, rows too wide for one binding window (`LimitExceeded`; see the module bounds).
pub fn softmax_backward_from_output(
    y: &Tensor,
    dy: &Tensor,
    log: bool,
    dtype: DType,
) -> Result<Tensor> {
    let what = "softmax_backward_from_output";
    matrix(y, what)?;
    softmax_backward_inputs(what, y, dy, dtype)?;
    softmax_backward_launch(y, None, log, dy, dtype)
}

/// The softmax backward launch: `x` the input with its `stats`, or (`stats` `None`) the
/// forward's output.
fn softmax_backward_launch(
    x: &Tensor,
    stats: Option<&Tensor>,
    log: bool,
    dy: &Tensor,
    dtype: DType,
) -> Result<Tensor> {
    let engine = x.engine();
    let (rows, cols) = rows_cols(x);
    let vector = dy.dtype() == x.dtype() && vectorized(x.dtype(), cols);
    // Wide rows: x and dy held in registers, each read once.
    let chunks = (cols / chunk_len(x.dtype())) as u64;
    let register = if vector {
        register_row(engine, chunks, 2)
    } else {
        None
    };
    let halves = register.filter(|_| x.dtype() != DType::F32 && !whole_chunk_backward());
    if dtype != DType::F32 && !(vector && x.dtype() != DType::F32) {
        return crate::cast::cast(
            &softmax_backward_launch(x, stats, log, dy, DType::F32)?,
            dtype,
        );
    }
    let dx = Tensor::empty(engine, x.shape(), dtype, "softmax_backward")?;
    let mut consts = constants(x.dtype(), dy.dtype(), dtype, u32::from(log));
    consts.push(("FROM_OUT", f64::from(u8::from(stats.is_none()))));
    /// The bindings' order of an entry.
    enum Order {
        /// `softmax_bwd_h`: statistics, dx, x, dy, dx.
        Halves,
        /// `softmax_bwd_r` / `_v`: statistics, x, dx, dy, dx (a 16-bit dx through `y4`, an
        /// F32 one through `dx4`).
        Chunks,
        /// `softmax_bwd`: x, statistics, dy, dx.
        Elements,
    }
    // The kernel and entry, the same for every window.
    let (kernel, entry, order) = if let Some((kernel, per_lane)) = halves {
        // 16-bit rows are held by half chunks (`softmax_bwd_h`: one F32 vec4, or its four
        // values rounded to `dtype`, a half chunk, so the stores are contiguous), twice as
        // many a lane as whole chunks.
        consts.push(("HB", (2 * per_lane) as f64));
        // The trees by default: subgroups measured no faster here (H200,
        // `notes/h200/2026-12-01-es/subgroups/`).
        let kernel =
            crate::reduce::rows_kernel(engine, kernel, subgroup_twin(kernel), false, &mut consts);
        (kernel, "softmax_bwd_h", Order::Halves)
    } else if vector {
        match register {
            Some((kernel, per_lane)) => {
                consts.push(("RB", per_lane as f64));
                (kernel, "softmax_bwd_r", Order::Chunks)
            }
            None => (&KERNEL, "softmax_bwd_v", Order::Chunks),
        }
    } else {
        (&KERNEL, "softmax_bwd", Order::Elements)
    };
    // Per-row tensors in windows of rows where one exceeds a binding (see `row_output`).
    let row_bytes = row_bytes_of(cols, &[x.dtype(), dy.dtype(), dtype], &[8]);
    for w in row_windows(engine, "softmax_backward", rows, &row_bytes)? {
        let (xb, dyb, dxb) = (
            x.bind_rows(&w, cols),
            dy.bind_rows(&w, cols),
            dx.bind_rows(&w, cols),
        );
        // Without statistics the kernels do not read their binding: `x` stands in.
        let sb = stats.map_or(xb, |st| st.bind_rows(&w, 2));
        let binds = match order {
            Order::Halves => vec![sb, dxb, xb, dyb, dxb],
            Order::Chunks => vec![sb, xb, dxb, dyb, dxb],
            Order::Elements => vec![xb, sb, dyb, dxb],
        };
        let params = window_params(&w, cols);
        engine.launch_bound(kernel, entry, &consts, &params, &binds, w.len() as u64)?;
    }
    Ok(dx)
}

// ---- sparsemax --------------------------------------------------------------------------

/// What [`sparsemax`] keeps for its backward.
#[derive(Debug, Clone)]
pub struct SparsemaxSaved {
    input: Tensor,
    stats: Tensor,
}

impl SparsemaxSaved {
    /// `[rows, 2]` F32: per row the maximum `m` and the threshold `τ'` relative to it
    /// (`y = max(x − m − τ', 0)`; the support is `{x − m > τ'}`).
    pub fn stats(&self) -> &Tensor {
        &self.stats
    }
}

/// `sparsemax(x)` over the last axis (Martins & Astudillo 2016): the Euclidean projection of
/// each row onto the probability simplex, `y = max(x − τ, 0)` with `Σ y = 1`, in `x`'s dtype.
/// τ is found exactly by Michelot's fixed point: each round is one pass over the row and the
/// support only shrinks, so it ends; typical rows take 5–15 rounds (13 for 262,144 uniform
/// values), the worst case one round per support element. Elements equal to τ are outside the support. Errors: a non-float `x`, zero
/// columns (`OutOfBounds`), rows too wide for one binding window (`LimitExceeded`; see the module bounds).
pub fn sparsemax(x: &Tensor) -> Result<(Tensor, SparsemaxSaved)> {
    let (rows, cols) = matrix(x, "sparsemax")?;
    if rows > 0 {
        classes_at_least_one("sparsemax", cols)?;
    }
    let (out, stats) = row_output(x, "sparsemax_fwd", 0, rows, cols)?;
    Ok((
        out,
        SparsemaxSaved {
            input: x.clone(),
            stats,
        },
    ))
}

/// Gradient of [`sparsemax`] (F32): on the support `dx = dy − mean_support(dy)`, else 0.
pub fn sparsemax_backward(saved: &SparsemaxSaved, dy: &Tensor) -> Result<Tensor> {
    let x = &saved.input;
    let engine = x.engine();
    check_engine(engine, &[(dy, "sparsemax_backward: dy")])?;
    float_input(dy, "sparsemax_backward: dy")?;
    same_shape("sparsemax_backward: dy", x, dy)?;
    let (rows, cols) = rows_cols(x);
    let dx = Tensor::empty(engine, x.shape(), DType::F32, "sparsemax_backward")?;
    let row_bytes = row_bytes_of(cols, &[x.dtype(), dy.dtype(), DType::F32], &[8]);
    for w in row_windows(engine, "sparsemax_backward", rows, &row_bytes)? {
        engine.launch_bound(
            &KERNEL,
            "sparsemax_bwd",
            &constants(x.dtype(), dy.dtype(), DType::F32, 0),
            &window_params(&w, cols),
            &[
                x.bind_rows(&w, cols),
                saved.stats.bind_rows(&w, 2),
                dy.bind_rows(&w, cols),
                dx.bind_rows(&w, cols),
            ],
            w.len() as u64,
        )?;
    }
    Ok(dx)
}

// ---- cross-entropy ------------------------------------------------------------------------

/// How per-row losses combine (cross-entropy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// Per-row losses, shape = the logits' leading axes.
    None,
    /// Sum over counted rows (a scalar, shape `[]`).
    Sum,
    /// Mean (a scalar): see [`CrossEntropyOptions`] for the denominators.
    #[default]
    Mean,
}

/// Options of [`cross_entropy`]; `Default` is PyTorch's and Liger's defaults.
#[derive(Debug, Clone)]
pub struct CrossEntropyOptions {
    /// Targets equal to this are skipped: zero loss, zero gradient, not counted (default −100).
    pub ignore_index: i32,
    /// Uniform label smoothing ε in [0, 1]: the target distribution is
    /// `(1 − ε)·onehot + ε/classes` (default 0).
    pub label_smoothing: f32,
    /// z-loss coefficient ≥ 0: adds `coef·lse²` to each counted row (default 0; Liger's
    /// `lse_square_scale`).
    pub z_loss: f32,
    /// Logit softcap > 0: logits become `cap·tanh(x/cap)` before the loss (default none).
    pub softcap: Option<f32>,
    /// Per-class weights, F32 `[classes]` (default none). As PyTorch: the row loss is scaled
    /// by `w_target`, smoothing terms by `w_c`, and the mean divides by `Σ w_target` over
    /// counted rows.
    pub weight: Option<Tensor>,
    /// Reduction (default mean). Mean divides the cross-entropy part by the number of counted
    /// rows (or by `Σ w_target` with weights) and the z-loss part by the counted rows; with no
    /// counted row (or a zero weight sum) the loss and the gradient are zero.
    pub reduction: Reduction,
    /// Read the targets back to the host and reject any outside `[0, classes)` other than
    /// `ignore_index` with `Error::OutOfBounds` (default true). **This synchronizes**: it
    /// submits pending work and waits for it. With `false` nothing is read back and such rows
    /// are treated as ignored by the kernels (they are never used as an index).
    pub check_targets: bool,
    /// Return the per-row argmax, [`CrossEntropyOutput::predicted`] (default true). With
    /// `false` it is `None` and neither written nor allocated (4 bytes a row less).
    pub predicted: bool,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            ignore_index: -100,
            label_smoothing: 0.0,
            z_loss: 0.0,
            softcap: None,
            weight: None,
            reduction: Reduction::Mean,
            check_targets: true,
            predicted: true,
        }
    }
}

/// Outputs of [`cross_entropy`] and [`cross_entropy_soft`] (all F32 except `predicted`).
#[derive(Debug, Clone)]
pub struct CrossEntropyOutput {
    /// The loss: `[]` for sum/mean, the leading shape for none (cross-entropy + z-loss).
    pub loss: Tensor,
    /// The z-loss term, reduced like the loss (zeros when the coefficient is 0).
    pub z_loss: Tensor,
    /// Fraction of counted rows whose argmax equals the target, `[]` (0 with no counted
    /// row; 0 for soft targets).
    pub accuracy: Tensor,
    /// Argmax of the raw logits per row (ties to the lowest index), I32, leading shape; −1 on
    /// ignored rows. Absent for soft targets and with `CrossEntropyOptions::predicted` false.
    pub predicted: Option<Tensor>,
    /// Per-row entropy of the softmax, F32 of the leading shape: only from
    /// `fused_linear::fused_linear_cross_entropy` with `return_entropy` (absent otherwise).
    pub entropy: Option<Tensor>,
}

/// What [`cross_entropy`] keeps for its backward.
#[derive(Debug, Clone)]
pub struct CrossEntropySaved {
    logits: Tensor,
    targets: Option<Tensor>,
    soft: Option<Tensor>,
    rows_matrix: Tensor,
    finish: Tensor,
    settings: CeSettings,
}

impl CrossEntropySaved {
    /// Per-row statistics `[rows, 8]` F32: cross-entropy part, z-loss part, target weight,
    /// counted (1/0), correct (1/0), row maximum, log denominator, and `Σ_c w_c` (with label
    /// smoothing; 0 without) or `Σ_c t_c` (soft targets). Maximum and log denominator are kept separately.
    pub fn rows_matrix(&self) -> &Tensor {
        &self.rows_matrix
    }
}

/// Scratch bytes [`cross_entropy`] allocates for `rows` rows beyond its outputs: the per-row
/// matrix, its column-sum partials and the 8-value finish buffer.
pub fn cross_entropy_workspace_bytes(rows: usize) -> u64 {
    (rows * CE_COLS * 4) as u64 + sum_columns_workspace_bytes(rows, CE_COLS) + 64
}

/// Rows of logits [`cross_entropy_in_place`] takes at a time: its per-row statistics exist for
/// one block of rows (32 bytes a row), so its scratch stays small at any batch (a multiple of
/// [`BLOCK_ROWS`], so that the blocks' column partials are those of the whole batch).
const IN_PLACE_ROWS: usize = 4096;
// `ce_count_partials` sums blocks of COUNT_ROWS = 64 rows, the column sums' blocks.
const _: () = assert!(BLOCK_ROWS == 64);

thread_local! {
    static FORCED_IN_PLACE_ROWS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Forces the rows a block of [`cross_entropy_in_place`] takes, for launches from the calling
/// thread (rounded up to a multiple of 64; `None`: 4,096). Results are the same bits for every
/// block size; for tests and measurements.
#[doc(hidden)]
pub fn force_in_place_rows(rows: Option<usize>) {
    FORCED_IN_PLACE_ROWS.with(|f| f.set(rows.map(|r| r.max(1).next_multiple_of(BLOCK_ROWS))));
}

fn in_place_rows() -> usize {
    FORCED_IN_PLACE_ROWS
        .with(std::cell::Cell::get)
        .unwrap_or(IN_PLACE_ROWS)
}

/// Scratch bytes [`cross_entropy_in_place`] allocates for `rows` rows of whole 16-byte chunks
/// beyond its outputs: one block's per-row matrix (`[min(rows, 4096), 8]` F32), two sets of
/// column partials (the counting pass's and the loss's, `[⌈rows / 64⌉, 8]` F32 each), their
/// sums and finish values and the unit cotangent. Rows of other widths take
/// [`cross_entropy`] and [`cross_entropy_backward_as`] instead (see there).
pub fn cross_entropy_in_place_workspace_bytes(rows: usize) -> u64 {
    let partials = sum_columns_workspace_bytes(rows, CE_COLS);
    (rows.min(in_place_rows()) * CE_COLS * 4) as u64 + 2 * partials + 4 * 32 + 4
}

/// Scratch bytes [`kl_div`], [`jsd`] and [`tvd`] allocate for `rows` rows: the per-row
/// `[rows, 2]` matrix, its column-sum partials and the 2-value finish buffer.
pub fn divergence_workspace_bytes(rows: usize) -> u64 {
    (rows * 8) as u64 + sum_columns_workspace_bytes(rows, 2) + 16
}

/// Validated cross-entropy settings. [`cross_entropy`] and the fused linear losses (which run
/// the same kernels block by block of rows, see `crate::fused_linear`) share them.
#[derive(Debug, Clone)]
pub(crate) struct CeSettings {
    flags: u32,
    ignore_index: i32,
    eps: f32,
    z_loss: f32,
    cap: f32,
    weight: Option<Tensor>,
    pub(crate) reduction: Reduction,
    /// The number of classes (0: each launch's row width).
    classes: usize,
}

impl CeSettings {
    fn params(&self, rows: usize, cols: usize, row0: usize, flags: u32) -> Params {
        Params {
            rows: rows as u32,
            cols: cols as u32,
            flags,
            ignore_index: self.ignore_index,
            a: self.eps,
            b: self.z_loss,
            c: self.cap,
            row0: row0 as u32,
            col0: 0,
            classes: self.classes as u32,
            partials: 0,
        }
    }

    fn plain(reduction: Reduction) -> CeSettings {
        CeSettings {
            flags: 0,
            ignore_index: 0,
            eps: 0.0,
            z_loss: 0.0,
            cap: 0.0,
            weight: None,
            reduction,
            classes: 0,
        }
    }
}

/// Check the scalar options and the class weights of a cross-entropy over `cols` classes
/// (`what` prefixes the errors).
pub(crate) fn ce_settings(
    what: &str,
    engine: &Engine,
    options: &CrossEntropyOptions,
    cols: usize,
) -> Result<CeSettings> {
    let eps = options.label_smoothing;
    finite(
        &format!("{what}: label_smoothing"),
        f64::from(eps),
        "must be in [0, 1]",
        (0.0..=1.0).contains(&eps),
    )?;
    finite(
        &format!("{what}: z_loss"),
        f64::from(options.z_loss),
        "must be finite and ≥ 0",
        options.z_loss >= 0.0,
    )?;
    let cap = match options.softcap {
        Some(c) => {
            finite(
                &format!("{what}: softcap"),
                f64::from(c),
                "must be finite and > 0",
                c > 0.0,
            )?;
            c
        }
        None => 0.0,
    };
    let mut flags = 0;
    if let Some(w) = &options.weight {
        w.check_engine(engine, &format!("{what}: weight"))?;
        if w.dtype() != DType::F32 {
            return Err(Error::dtype(
                format!("{what}: weight"),
                w.dtype(),
                &[DType::F32],
            ));
        }
        if w.shape() != [cols] {
            return Err(Error::shape(format!("{what}: weight"), &[cols], w.shape()));
        }
        flags |= F_WEIGHT;
    }
    Ok(CeSettings {
        flags,
        ignore_index: options.ignore_index,
        eps,
        z_loss: options.z_loss,
        cap,
        weight: options.weight.clone(),
        reduction: options.reduction,
        classes: cols,
    })
}

/// Check that `targets` is an I32 tensor of shape `lead` on `engine`.
pub(crate) fn check_target_tensor(
    what: &str,
    engine: &Engine,
    targets: &Tensor,
    lead: &[usize],
) -> Result<()> {
    targets.check_engine(engine, what)?;
    if targets.dtype() != DType::I32 {
        return Err(Error::dtype(what, targets.dtype(), &[DType::I32]));
    }
    if targets.shape() != lead {
        return Err(Error::shape(what, lead, targets.shape()));
    }
    Ok(())
}

/// Read the targets back (**synchronizes**) and reject any outside `[0, cols)` other than
/// `ignore_index`: `OutOfBounds` past the end, `InvalidValue` when negative.
pub(crate) fn check_target_range(
    what: &str,
    targets: &Tensor,
    ignore_index: i32,
    cols: usize,
) -> Result<()> {
    if targets.is_empty() {
        return Ok(());
    }
    let t = targets.to_vec::<i32>()?;
    let bad = t
        .iter()
        .enumerate()
        .find(|&(_, &v)| v != ignore_index && (v < 0 || v as i64 >= cols as i64));
    if let Some((row, &v)) = bad {
        let what = format!("{what}[{row}] (ignore_index {ignore_index} also allowed)");
        if v < 0 {
            return Err(Error::InvalidValue {
                what,
                got: f64::from(v),
                rule: format!("must be in [0, {cols}) or ignore_index"),
            });
        }
        return Err(Error::OutOfBounds {
            what,
            got: v as u64,
            min: 0,
            max: cols as u64 - 1,
        });
    }
    Ok(())
}

/// The forwards' flag for "no predictions asked" (their `pred` binding then unused).
fn no_pred(predicted: Option<&Tensor>) -> u32 {
    if predicted.is_some() { 0 } else { F_NO_PRED }
}

/// `[lead]` I32 predictions when `options` asks for them.
fn predictions(
    engine: &Engine,
    options: &CrossEntropyOptions,
    lead: &[usize],
) -> Result<Option<Tensor>> {
    options
        .predicted
        .then(|| Tensor::empty(engine, lead, DType::I32, "cross_entropy predicted"))
        .transpose()
}

/// Per-row cross-entropy statistics of a block of rows: `logits` holds rows
/// `row0..row0 + rows` of the whole batch (`[rows, cols]`, any float dtype); `targets`,
/// `mat` (`[all rows, 8]` F32) and `predicted` (I32, if asked for) cover the whole batch and
/// are read or written at rows `row0..`.
pub(crate) fn ce_rows_block(
    logits: &Tensor,
    targets: &Tensor,
    s: &CeSettings,
    row0: usize,
    mat: &Tensor,
    predicted: Option<&Tensor>,
) -> Result<()> {
    let engine = logits.engine();
    let (rows, cols) = rows_cols(logits);
    let weight = Bind::whole(s.weight.as_ref().unwrap_or(targets).buffer());
    let consts = constants(logits.dtype(), DType::F32, DType::F32, 0);
    let row_bytes = (cols * logits.dtype().size()) as u64;
    for w in row_windows(engine, "cross_entropy: logits", rows, &[row_bytes])? {
        let params = s.params(w.len(), cols, row0 + w.start, s.flags | no_pred(predicted));
        let x = logits.bind_rows(&w, cols);
        let (mat, targets, predicted) = (
            Bind::whole(mat.buffer()),
            Bind::whole(targets.buffer()),
            predicted.map_or(Bind::unused(mat.buffer()), |p| Bind::whole(p.buffer())),
        );
        let (entry, binds) = if vectorized(logits.dtype(), cols) {
            ("ce_fwd_v", [mat, targets, weight, predicted, x])
        } else {
            ("ce_fwd", [x, mat, targets, weight, predicted])
        };
        engine.launch_bound(&KERNEL, entry, &consts, &params, &binds, w.len() as u64)?;
    }
    Ok(())
}

/// The most classes [`ce_stats_block`] takes (its running argmax is held as an F32 value).
pub(crate) const CE_BLOCK_MAX_CLASSES: usize = 1 << 24;

/// Values a row of [`ce_stats_block`]'s state.
pub(crate) const CE_BLOCK_STATE: usize = 9;

/// One block of columns of a cross-entropy whose logits exist a block at a time: `logits`
/// (`[rows, w]` F32, every row of the batch) holds classes `col0..col0 + w`; their running
/// maximum, sum of exponentials, argmax, smoothing sums and target logit (and with `entropy`
/// the entropy's `Σ exp(z − m)·(z − m)`) are folded into `state` (`[rows, CE_BLOCK_STATE]`
/// F32), which the block at `col0 = 0` starts. Blocks must come in increasing `col0`;
/// [`ce_stats_finish`] then gives the per-row matrix. Needs `s` made for all the classes
/// ([`ce_settings`]), at most [`CE_BLOCK_MAX_CLASSES`].
pub(crate) fn ce_stats_block(
    logits: &Tensor,
    targets: &Tensor,
    s: &CeSettings,
    col0: usize,
    state: &Tensor,
    entropy: bool,
) -> Result<()> {
    let engine = logits.engine();
    let (rows, cols) = rows_cols(logits);
    let weight = Bind::whole(s.weight.as_ref().unwrap_or(targets).buffer());
    let consts = constants(logits.dtype(), DType::F32, DType::F32, 0);
    let row_bytes = (cols * logits.dtype().size()) as u64;
    for w in row_windows(engine, "cross_entropy block statistics", rows, &[row_bytes])? {
        let flags = s.flags | if entropy { F_ENTROPY } else { 0 };
        let params = Params {
            col0: col0 as u32,
            ..s.params(w.len(), cols, w.start, flags)
        };
        let binds = [
            logits.bind_rows(&w, cols),
            Bind::whole(state.buffer()),
            Bind::whole(targets.buffer()),
            weight,
        ];
        engine.launch_bound(
            &KERNEL,
            "ce_block_stats",
            &consts,
            &params,
            &binds,
            w.len() as u64,
        )?;
    }
    Ok(())
}

/// The per-row matrix `mat` (`[rows, 8]`, as [`ce_rows_block`] writes it) and the predictions
/// of a cross-entropy over `classes` classes from the `state` its blocks left
/// ([`ce_stats_block`]); with `entropy` (blocks folded with theirs) each row's entropy
/// `−Σ p·log p` of the softcapped logits (0 on a row not counted), F32 `[rows]`.
pub(crate) fn ce_stats_finish(
    state: &Tensor,
    targets: &Tensor,
    s: &CeSettings,
    classes: usize,
    mat: &Tensor,
    predicted: Option<&Tensor>,
    entropy: Option<&Tensor>,
) -> Result<()> {
    let rows = targets.len();
    let weight = s.weight.as_ref().unwrap_or(targets);
    let binds = [
        Bind::whole(mat.buffer()),
        Bind::whole(state.buffer()),
        Bind::whole(targets.buffer()),
        Bind::whole(weight.buffer()),
        predicted.map_or(Bind::unused(mat.buffer()), |p| Bind::whole(p.buffer())),
        entropy.map_or(Bind::unused(mat.buffer()), |e| Bind::whole(e.buffer())),
    ];
    let flags = s.flags | no_pred(predicted) | if entropy.is_some() { F_ENTROPY } else { 0 };
    targets.engine().launch_bound(
        &KERNEL,
        "ce_block_finish",
        &constants(DType::F32, DType::F32, DType::F32, 0),
        &s.params(rows, classes, 0, flags),
        &binds,
        (rows as u64).div_ceil(WG),
    )
}

/// Counting pass over every target: writes the target weight and the counted flag of each
/// row into `mat` (`[rows, 8]`, the other columns 0), so that [`ce_finish_values`] gives the
/// mean scales before any logits exist.
pub(crate) fn ce_count(targets: &Tensor, s: &CeSettings, cols: usize, mat: &Tensor) -> Result<()> {
    let rows = targets.len();
    let engine = targets.engine();
    let weight_buffer = s.weight.as_ref().unwrap_or(targets).buffer();
    engine.launch(
        &KERNEL,
        "ce_count",
        &constants(DType::F32, DType::F32, DType::F32, 0),
        &s.params(rows, cols, 0, s.flags),
        &[mat.buffer(), targets.buffer(), weight_buffer],
        (rows as u64).div_ceil(WG),
    )
}

/// The 8 finish values `[loss, z-loss, accuracy, ce scale, z scale, counted rows, 0, 0]` from
/// the per-row matrix: fixed-order column sums, then `ce_finish`.
pub(crate) fn ce_finish_values(engine: &Engine, mat: &Tensor, s: &CeSettings) -> Result<Tensor> {
    ce_finish_of_sums(engine, &sum_columns(mat)?, s)
}

/// [`ce_finish_values`] from the column sums of the per-row matrix (`[CE_COLS]` F32).
fn ce_finish_of_sums(engine: &Engine, sums: &Tensor, s: &CeSettings) -> Result<Tensor> {
    let mut flags = s.flags;
    if s.reduction == Reduction::Mean {
        flags |= F_MEAN;
    }
    let finish = Tensor::empty(engine, &[8], DType::F32, "cross_entropy finish")?;
    engine.launch(
        &KERNEL,
        "ce_finish",
        &constants(DType::F32, DType::F32, DType::F32, 0),
        &Params {
            flags,
            ..Default::default()
        },
        &[sums.buffer(), finish.buffer()],
        1,
    )?;
    Ok(finish)
}

/// The loss outputs (without `predicted`) from the per-row matrix and its finish values:
/// scalars for sum/mean, per-row tensors of shape `lead` for none.
pub(crate) fn ce_outputs(
    engine: &Engine,
    mat: &Tensor,
    finish: &Tensor,
    reduction: Reduction,
    lead: &[usize],
) -> Result<CrossEntropyOutput> {
    let per_row = ce_loss_rows(engine, reduction, lead)?;
    if let Some((loss, z)) = &per_row {
        ce_row_losses(engine, mat, &(0..lead.iter().product()), loss, z)?;
    }
    ce_finished(engine, finish, per_row)
}

/// For reduction none, the per-row loss and z-loss tensors (shape `lead`, F32) to fill.
fn ce_loss_rows(
    engine: &Engine,
    reduction: Reduction,
    lead: &[usize],
) -> Result<Option<(Tensor, Tensor)>> {
    if reduction != Reduction::None {
        return Ok(None);
    }
    Ok(Some((
        Tensor::empty(engine, lead, DType::F32, "cross_entropy loss")?,
        Tensor::empty(engine, lead, DType::F32, "cross_entropy z_loss")?,
    )))
}

/// Rows `rows` of the per-row loss and z-loss (`ce_rows`) from rows `0..rows.len()` of the
/// per-row matrix `mat`.
fn ce_row_losses(
    engine: &Engine,
    mat: &Tensor,
    rows: &Range<usize>,
    loss: &Tensor,
    z: &Tensor,
) -> Result<()> {
    engine.launch_bound(
        &KERNEL,
        "ce_rows",
        &constants(DType::F32, DType::F32, DType::F32, 0),
        &Params {
            rows: rows.len() as u32,
            ..Default::default()
        },
        &[
            Bind::whole(mat.buffer()),
            loss.bind_rows(rows, 1),
            z.bind_rows(rows, 1),
        ],
        (rows.len() as u64).div_ceil(WG),
    )
}

/// The outputs from the finish values: the per-row tensors for reduction none, else the
/// finish values' loss and z-loss scalars; the accuracy scalar (without `predicted`).
fn ce_finished(
    engine: &Engine,
    finish: &Tensor,
    per_row: Option<(Tensor, Tensor)>,
) -> Result<CrossEntropyOutput> {
    let (loss, z_loss) = match per_row {
        Some(pair) => pair,
        None => (
            slice_scalar(engine, finish, 0)?,
            slice_scalar(engine, finish, 1)?,
        ),
    };
    Ok(CrossEntropyOutput {
        loss,
        z_loss,
        accuracy: slice_scalar(engine, finish, 2)?,
        predicted: None,
        entropy: None,
    })
}

/// Check a cross-entropy cotangent against the loss shape (`lead` for none, `[]`/`[1]`
/// otherwise); `None` gives a unit cotangent. Returns the tensor and whether it is per row.
pub(crate) fn ce_cotangent(
    what: &str,
    engine: &Engine,
    cotangent: Option<&Tensor>,
    reduction: Reduction,
    lead: &[usize],
) -> Result<(Tensor, bool)> {
    match cotangent {
        None => Ok((Tensor::from_slice(engine, &[1.0f32], &[1])?, false)),
        Some(c) => {
            c.check_engine(engine, what)?;
            if c.dtype() != DType::F32 {
                return Err(Error::dtype(what, c.dtype(), &[DType::F32]));
            }
            if reduction == Reduction::None {
                if c.shape() != lead {
                    return Err(Error::shape(what, lead, c.shape()));
                }
                Ok((c.clone(), true))
            } else if c.len() != 1 || c.shape().len() > 1 {
                Err(Error::shape(what, &[], c.shape()))
            } else {
                Ok((c.clone(), false))
            }
        }
    }
}

/// Where a block of logits lies in the whole `[rows, classes]` matrix of a cross-entropy:
/// its rows are rows `row0..` of the batch (of the targets, the per-row statistics and
/// per-row cotangents), its columns classes `col0..` (whole rows: `col0` 0).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CeBlock {
    pub row0: usize,
    pub col0: usize,
}

impl CeSettings {
    /// The parameters of a gradient launch over rows `w` of the block `logits` at `at`.
    fn block_params(
        &self,
        logits: &Tensor,
        at: CeBlock,
        w: &Range<usize>,
        per_row: bool,
    ) -> Params {
        let (_, cols) = rows_cols(logits);
        let mut flags = self.flags;
        if per_row {
            flags |= F_COT_ROW;
        }
        Params {
            col0: at.col0 as u32,
            ..self.params(w.len(), cols, at.row0 + w.start, flags)
        }
    }
}

/// What the cross-entropy gradient of a block of logits needs besides the logits: the
/// targets and settings (a block of columns needs settings that know the number of classes,
/// those of [`ce_settings`]), `mat` the per-row statistics of the whole batch, `finish` the
/// scales (values 3 and 4), `cot` one value or one per row of the whole batch (`per_row`).
pub(crate) struct CeGradInputs<'a> {
    pub targets: &'a Tensor,
    pub settings: &'a CeSettings,
    pub mat: &'a Tensor,
    pub finish: &'a Tensor,
    pub cot: &'a Tensor,
    pub per_row: bool,
}

impl CeGradInputs<'_> {
    /// The bindings of the per-row statistics, targets, class weights (without them, the
    /// targets stand in: the binding is not read), finish values and cotangent.
    fn whole_binds(&self) -> [Bind<'_>; 5] {
        let weight = self.settings.weight.as_ref().unwrap_or(self.targets);
        [self.mat, self.targets, weight, self.finish, self.cot].map(|t| Bind::whole(t.buffer()))
    }
}

/// dlogits (F32, `logits`' shape) of a block of logits at `at` (see [`ce_rows_block`] for
/// rows).
pub(crate) fn ce_grad_block(logits: &Tensor, at: CeBlock, g: &CeGradInputs) -> Result<Tensor> {
    let s = g.settings;
    let engine = logits.engine();
    let (rows, cols) = rows_cols(logits);
    let dx = Tensor::empty(engine, logits.shape(), DType::F32, "cross_entropy_backward")?;
    let consts = constants(logits.dtype(), DType::F32, DType::F32, 0);
    let row_bytes = row_bytes_of(cols, &[logits.dtype(), DType::F32], &[]);
    for w in row_windows(engine, "cross_entropy_backward", rows, &row_bytes)? {
        let params = s.block_params(logits, at, &w, g.per_row);
        let (x, d) = (logits.bind_rows(&w, cols), dx.bind_rows(&w, cols));
        let [mat, targets, weight, finish, cot] = g.whole_binds();
        let (entry, binds) = if vectorized(logits.dtype(), cols) {
            ("ce_bwd_v", [mat, targets, weight, finish, cot, x, d])
        } else {
            ("ce_bwd", [x, mat, d, targets, weight, finish, cot])
        };
        engine.launch_bound(&KERNEL, entry, &consts, &params, &binds, w.len() as u64)?;
    }
    Ok(dx)
}

/// [`ce_grad_block`] written over `logits` (`ce_grad_over`, the values bit for bit) when its
/// rows are whole 16-byte chunks ([`vectorized`]); otherwise (F32 logits only) the gradient
/// is computed into a fresh tensor and copied over the logits.
pub(crate) fn ce_grad_block_over(logits: &Tensor, at: CeBlock, g: &CeGradInputs) -> Result<()> {
    let s = g.settings;
    let engine = logits.engine();
    let (rows, cols) = rows_cols(logits);
    if !vectorized(logits.dtype(), cols) {
        let dx = ce_grad_block(logits, at, g)?;
        let bytes = dx.byte_len();
        if logits.dtype() == DType::F32 && bytes > 0 {
            engine
                .record(|enc| enc.copy_buffer_to_buffer(dx.buffer(), 0, logits.buffer(), 0, bytes));
            return Ok(());
        }
        return Err(Error::dtype(
            "cross-entropy gradient over the logits",
            logits.dtype(),
            &[DType::F32],
        ));
    }
    let row_bytes = (cols * logits.dtype().size()) as u64;
    for w in row_windows(engine, "cross_entropy gradient", rows, &[row_bytes])? {
        let groups = ((w.len() * (cols / chunk_len(logits.dtype()))) as u64).div_ceil(WG);
        let [mat, targets, weight, finish, cot] = g.whole_binds();
        engine.launch_bound(
            &KERNEL,
            "ce_grad_over",
            &constants(logits.dtype(), DType::F32, DType::F32, 0),
            &s.block_params(logits, at, &w, g.per_row),
            &[
                Bind::unused(g.targets.buffer()),
                mat,
                targets,
                weight,
                finish,
                cot,
                logits.bind_rows(&w, cols),
            ],
            groups,
        )?;
    }
    Ok(())
}

/// Cross-entropy of `logits` (`[..., classes]`, F32/F16/BF16) against integer `targets` (I32,
/// the logits' leading shape), with the options of [`CrossEntropyOptions`]:
///
/// `loss_r = (1 − ε)·w_y·(lse − z_y) + ε/C·Σ_c w_c·(lse − z_c) + coef·lse²`, where `z` are the
/// (softcapped) logits, `lse = max + log Σ exp(z − max)` and `y` the target.
///
/// Errors: non-float logits or non-I32 targets (`UnsupportedDType`), a targets or weight shape
/// that does not match (`ShapeMismatch`), zero classes (`OutOfBounds`), ε outside [0, 1], a
/// negative or non-finite z-loss, a softcap not > 0 (`InvalidValue`), a target outside
/// `[0, classes)` other than `ignore_index` (`OutOfBounds` past the end, `InvalidValue` when
/// negative; only with `check_targets`, which synchronizes), a weight that is not F32, scratch over the workspace bound
/// (`WorkspaceExceeded`), rows too wide for one binding window (`LimitExceeded`).
pub fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    options: &CrossEntropyOptions,
) -> Result<(CrossEntropyOutput, CrossEntropySaved)> {
    let (rows, cols) = matrix(logits, "cross_entropy: logits")?;
    let engine = logits.engine();
    check_target_tensor("cross_entropy: targets", engine, targets, leading(logits))?;
    classes_at_least_one("cross_entropy", cols)?;
    let settings = ce_settings("cross_entropy", engine, options, cols)?;
    engine.check_workspace("cross_entropy", cross_entropy_workspace_bytes(rows))?;
    if options.check_targets {
        check_target_range(
            "cross_entropy: targets",
            targets,
            options.ignore_index,
            cols,
        )?;
    }
    let mat = Tensor::empty(engine, &[rows, CE_COLS], DType::F32, "cross_entropy rows")?;
    let predicted = predictions(engine, options, targets.shape())?;
    ce_rows_block(logits, targets, &settings, 0, &mat, predicted.as_ref())?;
    let finish = ce_finish_values(engine, &mat, &settings)?;
    let output = ce_outputs(engine, &mat, &finish, settings.reduction, leading(logits))?;
    Ok((
        CrossEntropyOutput {
            predicted,
            ..output
        },
        CrossEntropySaved {
            logits: logits.clone(),
            targets: Some(targets.clone()),
            soft: None,
            rows_matrix: mat,
            finish,
            settings,
        },
    ))
}

/// Cross-entropy as [`cross_entropy`] that also writes the gradient over the logits: on
/// return `logits` holds `d loss / d logits` for a unit cotangent (for reduction none, every
/// row's cotangent 1), **in the logits' dtype** (the FP32 gradient rounded to F16/BF16 for
/// 16-bit logits), and the returned outputs are those of [`cross_entropy`] (the same bits).
/// Nothing of the size of the logits is allocated, and for rows of whole chunks nothing of the
/// size of the batch but `predicted` (and the per-row loss for reduction none): scratch is
/// [`cross_entropy_in_place_workspace_bytes`] (one block of 4,096 rows' statistics, 128 KiB,
/// and 64 bytes for every 64 rows); `predicted` can be switched off
/// ([`CrossEntropyOptions::predicted`]).
///
/// How it runs, rows of whole `vec4<u32>` chunks (classes a multiple of 4 for F32, of 8 for
/// F16/BF16): a counting pass over the targets gives the mean's scales; then, a block of
/// 4,096 rows at a time, [`cross_entropy`]'s forward (the row statistics: one read of the
/// logits), whose column partials go to their place among the whole batch's (so the loss has
/// [`cross_entropy`]'s bits), then `ce_grad_over` writes the gradient over the block's logits,
/// one 16-byte chunk an invocation over a flat grid of every row's chunks (a second read and a
/// write), the values of [`cross_entropy_backward_as`] with a unit cotangent, bit for bit. A
/// kernel whose lanes walked a row, loading chunks from the binding they had just stored to,
/// ran at half the copy rate on an H200 (a grid of row segments measured 1–2% slower than the
/// flat one). Other widths (and zero rows) run [`cross_entropy`] and
/// [`cross_entropy_backward_as`] and then store the gradient over the logits (an F32 gradient
/// of the logits' size is allocated meanwhile).
///
/// Every other holder of `logits` (a clone, a saved context) sees the gradient afterwards; do
/// not pass logits that are still needed. Errors: those of [`cross_entropy`].
pub fn cross_entropy_in_place(
    logits: &Tensor,
    targets: &Tensor,
    options: &CrossEntropyOptions,
) -> Result<CrossEntropyOutput> {
    let (rows, cols) = matrix(logits, "cross_entropy_in_place: logits")?;
    let engine = logits.engine();
    check_target_tensor(
        "cross_entropy_in_place: targets",
        engine,
        targets,
        leading(logits),
    )?;
    classes_at_least_one("cross_entropy_in_place", cols)?;
    if rows == 0 || !vectorized(logits.dtype(), cols) {
        let (output, saved) = cross_entropy(logits, targets, options)?;
        let dx = cross_entropy_backward_as(&saved, None, logits.dtype())?;
        drop(saved);
        let bytes = dx.byte_len();
        if bytes > 0 {
            engine
                .record(|enc| enc.copy_buffer_to_buffer(dx.buffer(), 0, logits.buffer(), 0, bytes));
        }
        return Ok(output);
    }
    let settings = ce_settings("cross_entropy_in_place", engine, options, cols)?;
    engine.check_workspace(
        "cross_entropy_in_place",
        cross_entropy_in_place_workspace_bytes(rows),
    )?;
    if options.check_targets {
        check_target_range(
            "cross_entropy_in_place: targets",
            targets,
            options.ignore_index,
            cols,
        )?;
    }
    let predicted = predictions(engine, options, targets.shape())?;
    ce_in_place_blocks(logits, targets, &settings, predicted)
}

/// The blocks of rows of [`cross_entropy_in_place`] (rows of whole chunks): a counting pass over
/// the targets gives the mean's scales (`ce_count_partials`: `ce_count`'s column partials);
/// then each block's forward writes its per-row matrix (`ce_fwd_v`), and its gradient over the
/// logits (`ce_grad_over`) also writes the matrix's column partials at their place among the
/// whole batch's (a block in one binding window; else `column_partials_at` launches them).
/// The loss is finished from the partials: the bits of [`cross_entropy`], whose matrix covers
/// every row.
fn ce_in_place_blocks(
    logits: &Tensor,
    targets: &Tensor,
    s: &CeSettings,
    predicted: Option<Tensor>,
) -> Result<CrossEntropyOutput> {
    let engine = logits.engine();
    let (rows, cols) = rows_cols(logits);
    let lead = leading(logits);
    let block = rows.min(in_place_rows());
    let f32_rows = |r: usize, label: &str| Tensor::empty(engine, &[r, CE_COLS], DType::F32, label);
    let mat = f32_rows(block, "cross_entropy_in_place rows")?;
    let partial_rows = rows.div_ceil(BLOCK_ROWS);
    let counts = f32_rows(partial_rows, "cross_entropy_in_place count partials")?;
    let sums = f32_rows(partial_rows, "cross_entropy_in_place loss partials")?;
    let per_row = ce_loss_rows(engine, s.reduction, lead)?;
    let weight = s.weight.as_ref().unwrap_or(targets);
    let plain = constants(DType::F32, DType::F32, DType::F32, 0);
    let consts = constants(logits.dtype(), DType::F32, DType::F32, 0);
    let blocks: Vec<Range<usize>> = (0..rows)
        .step_by(block)
        .map(|r0| r0..(r0 + block).min(rows))
        .collect();
    // The counting pass, written as the column partials of `ce_count`'s matrix (one launch).
    engine.launch(
        &KERNEL,
        "ce_count_partials",
        &plain,
        &s.params(rows, cols, 0, s.flags),
        &[counts.buffer(), targets.buffer(), weight.buffer()],
        (partial_rows as u64).div_ceil(WG),
    )?;
    let scales = ce_finish_of_sums(engine, &sum_partials(engine, &counts)?, s)?;
    let (unit, _) = ce_cotangent("cross_entropy_in_place", engine, None, s.reduction, lead)?;
    let row_bytes = [
        (cols * logits.dtype().size()) as u64,
        4,
        (CE_COLS * 4) as u64,
    ];
    for b in &blocks {
        let windows = row_windows(
            engine,
            "cross_entropy_in_place: logits",
            b.len(),
            &row_bytes,
        )?;
        for w in &windows {
            let at = b.start + w.start..b.start + w.end;
            engine.launch_bound(
                &KERNEL,
                "ce_fwd_v",
                &consts,
                &s.params(w.len(), cols, 0, s.flags | no_pred(predicted.as_ref())),
                &[
                    mat.bind_rows(w, CE_COLS),
                    targets.bind_rows(&at, 1),
                    Bind::whole(weight.buffer()),
                    predicted
                        .as_ref()
                        .map_or(Bind::unused(mat.buffer()), |p| p.bind_rows(&at, 1)),
                    logits.bind_rows(&at, cols),
                ],
                w.len() as u64,
            )?;
        }
        // A block in one window: its gradient launch also writes the block's column partials.
        let fold = windows.len() == 1;
        if !fold {
            column_partials_at(&mat, b.len(), &sums, b.start / BLOCK_ROWS)?;
        }
        if let Some((loss, z)) = &per_row {
            ce_row_losses(engine, &mat, b, loss, z)?;
        }
        for w in &windows {
            let at = b.start + w.start..b.start + w.end;
            let mut groups = ((w.len() * (cols / chunk_len(logits.dtype()))) as u64).div_ceil(WG);
            let mut params = s.params(w.len(), cols, 0, s.flags);
            if fold {
                params.flags |= F_PARTIALS;
                params.partials = (b.start / BLOCK_ROWS * CE_COLS) as u32;
                groups += ((w.len().div_ceil(BLOCK_ROWS) * CE_COLS) as u64).div_ceil(WG);
            }
            engine.launch_bound(
                &KERNEL,
                "ce_grad_over",
                &consts,
                &params,
                &[
                    Bind::whole(sums.buffer()),
                    mat.bind_rows(w, CE_COLS),
                    targets.bind_rows(&at, 1),
                    Bind::whole(weight.buffer()),
                    Bind::whole(scales.buffer()),
                    Bind::whole(unit.buffer()),
                    logits.bind_rows(&at, cols),
                ],
                groups,
            )?;
        }
    }
    let finish = ce_finish_of_sums(engine, &sum_partials(engine, &sums)?, s)?;
    Ok(CrossEntropyOutput {
        predicted,
        ..ce_finished(engine, &finish, per_row)?
    })
}

/// A scalar `[]` F32 tensor holding element `index` of an F32 vector (a GPU copy).
pub(crate) fn slice_scalar(engine: &Engine, v: &Tensor, index: u64) -> Result<Tensor> {
    v.check_engine(engine, "loss scalar")?;
    v.f32_range(index as usize, &[], "loss scalar")
}

/// Gradient of [`cross_entropy`] or [`cross_entropy_soft`] with respect to the logits (F32,
/// the logits' shape). `cotangent`: `None` for a unit cotangent, or an F32 tensor of the
/// loss's shape (`[]` or `[1]` for sum/mean, the leading shape for none). Targets, weights and
/// options are those of the forward.
pub fn cross_entropy_backward(
    saved: &CrossEntropySaved,
    cotangent: Option<&Tensor>,
) -> Result<Tensor> {
    let logits = &saved.logits;
    let engine = logits.engine();
    let (_, cols) = rows_cols(logits);
    let (cot, per_row) = ce_cotangent(
        "cross_entropy_backward: cotangent",
        engine,
        cotangent,
        saved.settings.reduction,
        leading(logits),
    )?;
    if let Some(soft) = &saved.soft {
        let mut flags = 0;
        if per_row {
            flags |= F_COT_ROW;
        }
        let dx = Tensor::empty(engine, logits.shape(), DType::F32, "cross_entropy_backward")?;
        let windows = div_windows(
            engine,
            "cross_entropy_backward",
            logits,
            soft,
            Some(&[DType::F32]),
        )?;
        for w in windows {
            engine.launch_bound(
                &KERNEL,
                "ce_soft_bwd",
                &constants(logits.dtype(), soft.dtype(), DType::F32, 0),
                &saved.settings.params(w.len(), cols, w.start, flags),
                &[
                    logits.bind_rows(&w, cols),
                    Bind::whole(saved.rows_matrix.buffer()),
                    soft.bind_rows(&w, cols),
                    dx.bind_rows(&w, cols),
                    Bind::whole(saved.finish.buffer()),
                    Bind::whole(cot.buffer()),
                ],
                w.len() as u64,
            )?;
        }
        return Ok(dx);
    }
    let targets = saved.targets.as_ref().expect("integer targets");
    let inputs = CeGradInputs {
        targets,
        settings: &saved.settings,
        mat: &saved.rows_matrix,
        finish: &saved.finish,
        cot: &cot,
        per_row,
    };
    ce_grad_block(logits, CeBlock::default(), &inputs)
}

/// [`cross_entropy_backward`] with the gradient stored in `dtype`: F32 gives that function's
/// result; F16 or BF16 gives the F32 gradient rounded once to nearest-even (bit for bit
/// `cast::cast` of it), in a fresh tensor. Integer targets over whole 16-bit chunks of logits of
/// that same dtype write it directly (`ce_bwd_n`: 2 bytes an element written instead of 4,
/// the logits left untouched, unlike [`cross_entropy_in_place`]); every other case computes the
/// F32 gradient and narrows it.
///
/// Errors: those of [`cross_entropy_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn cross_entropy_backward_as(
    saved: &CrossEntropySaved,
    cotangent: Option<&Tensor>,
    dtype: DType,
) -> Result<Tensor> {
    if !dtype.is_float() {
        return Err(Error::dtype(
            "cross_entropy_backward_as: dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    let logits = &saved.logits;
    let (rows, cols) = rows_cols(logits);
    let direct = dtype != DType::F32
        && dtype == logits.dtype()
        && saved.targets.is_some()
        && vectorized(dtype, cols);
    if !direct {
        let dx = cross_entropy_backward(saved, cotangent)?;
        return if dtype == DType::F32 {
            Ok(dx)
        } else {
            crate::cast::cast(&dx, dtype)
        };
    }
    let engine = logits.engine();
    let (cot, per_row) = ce_cotangent(
        "cross_entropy_backward_as: cotangent",
        engine,
        cotangent,
        saved.settings.reduction,
        leading(logits),
    )?;
    let targets = saved.targets.as_ref().expect("integer targets");
    let s = &saved.settings;
    let mut flags = s.flags;
    if per_row {
        flags |= F_COT_ROW;
    }
    let dx = Tensor::empty(engine, logits.shape(), dtype, "cross_entropy_backward_as")?;
    let inputs = CeGradInputs {
        targets,
        settings: s,
        mat: &saved.rows_matrix,
        finish: &saved.finish,
        cot: &cot,
        per_row,
    };
    // Logits and gradient share the dtype, so one row's bytes.
    let row_bytes = (cols * dtype.size()) as u64;
    for w in row_windows(engine, "cross_entropy_backward_as", rows, &[row_bytes])? {
        let [mat, targets, weight, finish, cot] = inputs.whole_binds();
        engine.launch_bound(
            &KERNEL,
            "ce_bwd_n",
            &constants(logits.dtype(), DType::F32, DType::F32, 0),
            &s.params(w.len(), cols, w.start, flags),
            &[
                mat,
                targets,
                weight,
                finish,
                cot,
                logits.bind_rows(&w, cols),
                dx.bind_rows(&w, cols),
            ],
            w.len() as u64,
        )?;
    }
    Ok(dx)
}

/// Cross-entropy against a target distribution `targets` (any float dtype, the logits'
/// shape): `loss_r = Σ_c t_c (lse − x_c)`, reduced as `reduction` (mean over rows). The
/// targets are used as given (not normalized). Backward: [`cross_entropy_backward`],
/// `dx = (Σ t)·p − t`. `accuracy` is zero and `predicted` absent.
pub fn cross_entropy_soft(
    logits: &Tensor,
    targets: &Tensor,
    reduction: Reduction,
) -> Result<(CrossEntropyOutput, CrossEntropySaved)> {
    let (rows, cols) = matrix(logits, "cross_entropy_soft: logits")?;
    let engine = logits.engine();
    check_engine(engine, &[(targets, "cross_entropy_soft: targets")])?;
    float_input(targets, "cross_entropy_soft: targets")?;
    same_shape("cross_entropy_soft: targets", logits, targets)?;
    classes_at_least_one("cross_entropy_soft", cols)?;
    engine.check_workspace("cross_entropy_soft", cross_entropy_workspace_bytes(rows))?;
    let mat = Tensor::empty(engine, &[rows, CE_COLS], DType::F32, "cross_entropy rows")?;
    for w in div_windows(engine, "cross_entropy_soft", logits, targets, None)? {
        engine.launch_bound(
            &KERNEL,
            "ce_soft_fwd",
            &constants(logits.dtype(), targets.dtype(), DType::F32, 0),
            &Params {
                row0: w.start as u32,
                ..window_params(&w, cols)
            },
            &[
                logits.bind_rows(&w, cols),
                Bind::whole(mat.buffer()),
                targets.bind_rows(&w, cols),
            ],
            w.len() as u64,
        )?;
    }
    let settings = CeSettings::plain(reduction);
    let finish = ce_finish_values(engine, &mat, &settings)?;
    let output = ce_outputs(engine, &mat, &finish, reduction, leading(logits))?;
    Ok((
        output,
        CrossEntropySaved {
            logits: logits.clone(),
            targets: None,
            soft: Some(targets.clone()),
            rows_matrix: mat,
            finish,
            settings,
        },
    ))
}

// ---- divergences ---------------------------------------------------------------------------

/// How the divergences combine their elementwise losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DivReduction {
    /// Elementwise losses, the input's shape (F32; zero on skipped rows).
    None,
    /// Sum of every element (a scalar `[]`).
    Sum,
    /// Sum divided by the number of elements of the counted rows.
    Mean,
    /// Sum divided by the number of counted rows (Liger's default).
    #[default]
    BatchMean,
}

/// What [`kl_div`], [`jsd`] and [`tvd`] keep for their backward (inputs and the scale).
#[derive(Debug, Clone)]
pub struct DivergenceSaved {
    input: Tensor,
    target: Tensor,
    labels: Option<Tensor>,
    finish: Tensor,
    settings: DivSettings,
}

/// Validated divergence settings. The divergences and the fused linear distillation losses
/// (which run the same kernels block by block of rows) share them.
#[derive(Debug, Clone)]
pub(crate) struct DivSettings {
    /// 0 KL, 1 JSD, 2 TVD.
    mode: u32,
    flags: u32,
    ignore_index: i32,
    beta: f32,
    pub(crate) reduction: DivReduction,
}

impl DivSettings {
    /// Settings of divergence `mode` (0 KL, 1 JSD, 2 TVD) with labels (`labels`) or without.
    pub(crate) fn new(
        mode: u32,
        log_target: bool,
        labels: bool,
        ignore_index: i32,
        beta: f32,
        reduction: DivReduction,
    ) -> DivSettings {
        let mut flags = 0;
        if log_target {
            flags |= F_LOG_TARGET;
        }
        if labels {
            flags |= F_LABELS;
        }
        DivSettings {
            mode,
            flags,
            ignore_index,
            beta,
            reduction,
        }
    }

    fn params(&self, rows: usize, cols: usize, row0: usize, flags: u32) -> Params {
        Params {
            rows: rows as u32,
            cols: cols as u32,
            flags,
            ignore_index: self.ignore_index,
            a: self.beta,
            row0: row0 as u32,
            ..Default::default()
        }
    }

    fn constants(&self, input: &Tensor, target: &Tensor) -> Constants {
        constants(input.dtype(), target.dtype(), DType::F32, self.mode)
    }
}

/// Per-row divergence sums of a block of rows: `input` and `target` hold rows
/// `row0..row0 + rows` of the whole batch; `labels` (whole batch, optional) and `mat`
/// (`[all rows, 2]` F32: row sum, counted flag) are read and written at rows `row0..`.
pub(crate) fn div_rows_block(
    input: &Tensor,
    target: &Tensor,
    labels: Option<&Tensor>,
    s: &DivSettings,
    row0: usize,
    mat: &Tensor,
) -> Result<()> {
    let engine = input.engine();
    let (_, cols) = rows_cols(input);
    for w in div_windows(engine, "divergence", input, target, None)? {
        let params = s.params(w.len(), cols, row0 + w.start, s.flags);
        let (x, t) = (input.bind_rows(&w, cols), target.bind_rows(&w, cols));
        // Without labels the binding is not read: the input stands in.
        let l = labels.map_or(x, |l| Bind::whole(l.buffer()));
        let m = Bind::whole(mat.buffer());
        let (entry, binds) = if target.dtype() == input.dtype() && vectorized(input.dtype(), cols) {
            ("div_rows_v", [m, l, x, t])
        } else {
            ("div_rows", [x, m, t, l])
        };
        let consts = s.constants(input, target);
        engine.launch_bound(&KERNEL, entry, &consts, &params, &binds, w.len() as u64)?;
    }
    Ok(())
}

/// Windows of rows for a divergence launch over `input`, `target` and an optional per-element
/// output of F32 or `out`'s dtype (see [`row_windows`]).
fn div_windows(
    engine: &Engine,
    what: &str,
    input: &Tensor,
    target: &Tensor,
    out: Option<&[DType]>,
) -> Result<Vec<Range<usize>>> {
    let (rows, cols) = rows_cols(input);
    let mut dtypes = vec![input.dtype(), target.dtype()];
    dtypes.extend_from_slice(out.unwrap_or(&[]));
    row_windows(engine, what, rows, &row_bytes_of(cols, &dtypes, &[]))
}

/// Counting pass: `mat[r] = (0, counted)` for each of `rows` rows, so that
/// [`div_finish_values`] gives the scale before any block runs.
pub(crate) fn div_count(
    engine: &Engine,
    labels: Option<&Tensor>,
    rows: usize,
    s: &DivSettings,
    mat: &Tensor,
) -> Result<()> {
    // Without labels the binding is unused; any read-only buffer other than `mat` will do.
    let placeholder;
    let labels = match labels {
        Some(l) => l,
        None => {
            placeholder = Tensor::zeros(engine, &[1], DType::I32)?;
            &placeholder
        }
    };
    let labels_buffer = labels.buffer();
    engine.launch(
        &KERNEL,
        "div_count",
        &constants(DType::F32, DType::F32, DType::F32, s.mode),
        &s.params(rows, 0, 0, s.flags),
        &[mat.buffer(), labels_buffer],
        (rows as u64).div_ceil(WG),
    )
}

/// `[loss, scale]` from the per-row matrix `[rows, 2]` of a divergence over `cols` columns
/// (fixed-order column sums, then `div_finish`).
pub(crate) fn div_finish_values(
    engine: &Engine,
    mat: &Tensor,
    s: &DivSettings,
    cols: usize,
) -> Result<Tensor> {
    let sums = sum_columns(mat)?;
    let finish = Tensor::empty(engine, &[2], DType::F32, "divergence finish")?;
    let flags = s.flags
        | match s.reduction {
            DivReduction::Mean => F_MEAN,
            DivReduction::BatchMean => F_BATCHMEAN,
            _ => 0,
        };
    engine.launch(
        &KERNEL,
        "div_finish",
        &constants(DType::F32, DType::F32, DType::F32, s.mode),
        &s.params(0, cols, 0, flags),
        &[sums.buffer(), finish.buffer()],
        1,
    )?;
    Ok(finish)
}

/// d loss / d input (`input`'s shape) of a block of rows `row0..` (see [`div_rows_block`]):
/// `finish` holds the scale (value 1), `cot` one value or, with `per_element`, one per element
/// of the block. Stored in `dtype` (16-bit: each F32 value rounded once; written directly by
/// `div_bwd_v` for 16-bit inputs and targets of one dtype in whole chunks, otherwise the F32
/// gradient narrowed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn div_grad_block(
    input: &Tensor,
    target: &Tensor,
    labels: Option<&Tensor>,
    s: &DivSettings,
    row0: usize,
    finish: &Tensor,
    cot: &Tensor,
    per_element: bool,
    dtype: DType,
) -> Result<Tensor> {
    let engine = input.engine();
    let (_, cols) = rows_cols(input);
    let vector = target.dtype() == input.dtype() && vectorized(input.dtype(), cols);
    if dtype != DType::F32 && !(vector && input.dtype() != DType::F32) {
        let dx = div_grad_block(
            input,
            target,
            labels,
            s,
            row0,
            finish,
            cot,
            per_element,
            DType::F32,
        )?;
        return crate::cast::cast(&dx, dtype);
    }
    let mut flags = s.flags;
    if per_element {
        flags |= F_COT_ELEM;
    }
    let dx = Tensor::empty(engine, input.shape(), dtype, "divergence_backward")?;
    let outs = [dtype, DType::F32];
    let outs = if per_element { &outs[..] } else { &outs[..1] };
    for w in div_windows(engine, "divergence_backward", input, target, Some(outs))? {
        let params = s.params(w.len(), cols, row0 + w.start, flags);
        let (x, t, d) = (
            input.bind_rows(&w, cols),
            target.bind_rows(&w, cols),
            dx.bind_rows(&w, cols),
        );
        // Without labels the binding is not read: the input stands in.
        let l = labels.map_or(x, |l| Bind::whole(l.buffer()));
        let f = Bind::whole(finish.buffer());
        // A per-element cotangent has the input's rows; a scalar one is bound whole.
        let c = if per_element {
            cot.bind_rows(&w, cols)
        } else {
            Bind::whole(cot.buffer())
        };
        let elements = (w.len() * cols) as u64;
        // 16-bit inputs with an F32 gradient: half chunks a lane, contiguous stores
        // (`div_bwd_h`); other whole chunks: `div_bwd_v` (16-bit gradients one chunk a lane);
        // else element by element.
        let chunk = chunk_len(input.dtype()) as u64;
        let (entry, consts, binds, per_invocation) =
            if vector && input.dtype() != DType::F32 && dtype == DType::F32 {
                (
                    "div_bwd_h",
                    s.constants(input, target),
                    vec![l, f, c, d, x, t],
                    4,
                )
            } else if vector {
                let consts = constants(input.dtype(), target.dtype(), dtype, s.mode);
                ("div_bwd_v", consts, vec![l, f, c, x, d, t, d], chunk)
            } else {
                (
                    "div_bwd",
                    s.constants(input, target),
                    vec![x, t, d, l, f, c],
                    1,
                )
            };
        let groups = (elements / per_invocation).div_ceil(WG);
        engine.launch_bound(&KERNEL, entry, &consts, &params, &binds, groups)?;
    }
    Ok(dx)
}

/// Check divergence labels: I32 of shape `lead`, on `engine`.
pub(crate) fn check_labels(what: &str, engine: &Engine, l: &Tensor, lead: &[usize]) -> Result<()> {
    l.check_engine(engine, what)?;
    if l.dtype() != DType::I32 {
        return Err(Error::dtype(what, l.dtype(), &[DType::I32]));
    }
    if l.shape() != lead {
        return Err(Error::shape(what, lead, l.shape()));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn divergence_forward(
    what: &str,
    mode: u32,
    input: &Tensor,
    target: &Tensor,
    labels: Option<&Tensor>,
    ignore_index: i32,
    beta: f32,
    log_target: bool,
    reduction: DivReduction,
) -> Result<(Tensor, DivergenceSaved)> {
    let (rows, cols) = matrix(input, &format!("{what}: input"))?;
    let engine = input.engine();
    check_engine(engine, &[(target, "target")])?;
    float_input(target, &format!("{what}: target"))?;
    same_shape(&format!("{what}: target"), input, target)?;
    if let Some(l) = labels {
        check_labels(&format!("{what}: labels"), engine, l, leading(input))?;
    }
    engine.check_workspace(what, divergence_workspace_bytes(rows))?;
    let settings = DivSettings::new(
        mode,
        log_target,
        labels.is_some(),
        ignore_index,
        beta,
        reduction,
    );
    let (loss, finish) = if reduction == DivReduction::None {
        let out = Tensor::empty(engine, input.shape(), DType::F32, what)?;
        let consts = settings.constants(input, target);
        for w in div_windows(engine, what, input, target, Some(&[DType::F32]))? {
            let params = settings.params(w.len(), cols, w.start, settings.flags);
            let (x, t, o) = (
                input.bind_rows(&w, cols),
                target.bind_rows(&w, cols),
                out.bind_rows(&w, cols),
            );
            // Without labels the binding is not read: the input stands in.
            let l = labels.map_or(x, |l| Bind::whole(l.buffer()));
            let elements = (w.len() * cols) as u64;
            let vector = target.dtype() == input.dtype() && vectorized(input.dtype(), cols);
            // 16-bit inputs: half chunks a lane, contiguous F32 stores (`div_elems_h`).
            let (entry, binds, per_invocation) = if vector && input.dtype() != DType::F32 {
                ("div_elems_h", [l, o, x, t], 4)
            } else if vector {
                ("div_elems_v", [l, x, t, o], chunk_len(input.dtype()) as u64)
            } else {
                ("div_elems", [x, t, l, o], 1)
            };
            let groups = (elements / per_invocation).div_ceil(WG);
            engine.launch_bound(&KERNEL, entry, &consts, &params, &binds, groups)?;
        }
        (out, Tensor::from_slice(engine, &[0.0f32, 1.0], &[2])?)
    } else {
        let mat = Tensor::empty(engine, &[rows, 2], DType::F32, what)?;
        div_rows_block(input, target, labels, &settings, 0, &mat)?;
        let finish = div_finish_values(engine, &mat, &settings, cols)?;
        (slice_scalar(engine, &finish, 0)?, finish)
    };
    Ok((
        loss,
        DivergenceSaved {
            input: input.clone(),
            target: target.clone(),
            labels: labels.cloned(),
            finish,
            settings,
        },
    ))
}

/// Kullback–Leibler divergence as PyTorch's `kl_div(input, target)`: `input` holds
/// log-probabilities; elementwise `t·(log t − input)` (0 where `t = 0`), or with `log_target`
/// `exp(t)·(t − input)`. Reductions: none, sum, mean (over elements), batchmean (over rows).
/// The target is frozen: the backward gives the input's gradient only.
pub fn kl_div(
    input: &Tensor,
    target: &Tensor,
    log_target: bool,
    reduction: DivReduction,
) -> Result<(Tensor, DivergenceSaved)> {
    divergence_forward(
        "kl_div", 0, input, target, None, 0, 0.0, log_target, reduction,
    )
}

/// Generalized Jensen–Shannon divergence as Liger's: `input` = student log-probabilities
/// (log Q), `target` = teacher log-probabilities (log P), `M = β·P + (1 − β)·Q`,
/// elementwise `β·P·(log P − log M) + (1 − β)·Q·(log Q − log M)`; β = 0 is the forward KL
/// `P·(log P − log Q)` and β = 1 the reverse KL `Q·(log Q − log P)`. Rows whose `labels`
/// entry equals `ignore_index` are skipped; the loss is the sum divided by the counted rows
/// (Liger's batchmean; zero when none counts). Errors as [`kl_div`], plus β outside [0, 1]
/// (`InvalidValue`) and labels that are not I32 of the leading shape.
pub fn jsd(
    input: &Tensor,
    target: &Tensor,
    beta: f32,
    labels: Option<&Tensor>,
    ignore_index: i32,
) -> Result<(Tensor, DivergenceSaved)> {
    finite(
        "jsd: beta",
        f64::from(beta),
        "must be in [0, 1]",
        (0.0..=1.0).contains(&beta),
    )?;
    divergence_forward(
        "jsd",
        1,
        input,
        target,
        labels,
        ignore_index,
        beta,
        false,
        DivReduction::BatchMean,
    )
}

/// Total variation distance as Liger's: `input` = P and `target` = Q (probabilities),
/// elementwise `½·|P − Q|`, gradient `½·sign(P − Q)` (0 where equal). Rows whose `labels`
/// entry equals `ignore_index` are skipped and not counted (mean: counted rows × columns;
/// batchmean: counted rows).
pub fn tvd(
    input: &Tensor,
    target: &Tensor,
    reduction: DivReduction,
    labels: Option<&Tensor>,
    ignore_index: i32,
) -> Result<(Tensor, DivergenceSaved)> {
    divergence_forward(
        "tvd",
        2,
        input,
        target,
        labels,
        ignore_index,
        0.0,
        false,
        reduction,
    )
}

/// Gradient of [`kl_div`], [`jsd`] or [`tvd`] with respect to the input (F32, the input's
/// shape). `cotangent`: `None` for a unit cotangent, or F32 of the loss's shape (`[]`/`[1]`
/// when reduced, the input's shape for none).
pub fn divergence_backward(saved: &DivergenceSaved, cotangent: Option<&Tensor>) -> Result<Tensor> {
    divergence_backward_as(saved, cotangent, DType::F32)
}

/// [`divergence_backward`] with the gradient stored in `dtype`: F32 gives that function's
/// result; F16 or BF16 the F32 gradient rounded once to nearest-even (bit for bit `cast::cast`
/// of it; a NaN stays a NaN, its payload may differ), in a fresh tensor. A 16-bit input and
/// target of one dtype in rows of whole 8-value chunks write it directly (2 bytes an element
/// instead of 4); every other case computes the F32 gradient and narrows it.
///
/// Errors: those of [`divergence_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn divergence_backward_as(
    saved: &DivergenceSaved,
    cotangent: Option<&Tensor>,
    dtype: DType,
) -> Result<Tensor> {
    if !dtype.is_float() {
        return Err(Error::dtype(
            "divergence_backward_as: dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    let input = &saved.input;
    let engine = input.engine();
    let unit;
    let mut per_element = false;
    let cot = match cotangent {
        None => {
            unit = Tensor::from_slice(engine, &[1.0f32], &[1])?;
            &unit
        }
        Some(c) => {
            check_engine(engine, &[(c, "divergence_backward: cotangent")])?;
            if c.dtype() != DType::F32 {
                return Err(Error::dtype(
                    "divergence_backward: cotangent",
                    c.dtype(),
                    &[DType::F32],
                ));
            }
            if saved.settings.reduction == DivReduction::None {
                same_shape("divergence_backward: cotangent", input, c)?;
                per_element = true;
            } else if c.len() != 1 || c.shape().len() > 1 {
                return Err(Error::shape(
                    "divergence_backward: cotangent",
                    &[],
                    c.shape(),
                ));
            }
            c
        }
    };
    div_grad_block(
        input,
        &saved.target,
        saved.labels.as_ref(),
        &saved.settings,
        0,
        &saved.finish,
        cot,
        per_element,
        dtype,
    )
}
