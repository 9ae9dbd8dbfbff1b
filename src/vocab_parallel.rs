//! Vocabulary-parallel cross-entropy: the logits of a row split by columns into shards (each a
//! contiguous vocabulary range, e.g. one per device), each shard reduced alone, and only small
//! per-row statistics exchanged.
//!
//! The pieces, each usable on its own device:
//!
//! 1. [`shard_statistics`] of each shard `[rows, width]` (vocabulary `offset..offset + width`):
//!    per row the maximum `m`, `s = Σ exp(x − m)`, the target's logit `z` and `h = 1` when the
//!    target falls in the shard (else 0, 0): F32 `[rows, 4]`.
//! 2. [`combine_statistics`] of every shard's, in shard order (gather them on one device):
//!    `M = max m`, `lse = M + log Σ s·exp(m − M)`, `z = Σ h·z`, holders `Σ h`: F32 `[rows, 4]`.
//! 3. [`losses`]: per row `lse − z` (ignored rows 0; a counted row whose target no shard or
//!    several shards hold: NaN), reduced as [`Reduction`] says (mean over the counted rows, 0
//!    when none is counted), and the context for
//! 4. [`row_cotangents`]: each row's share of the loss cotangent (`[rows]` F32; 0 for ignored
//!    rows), and then on each shard's device
//! 5. [`shard_backward`]: `dlogits = g·(exp(x − lse) − [offset + j = target])`, F32.
//!
//! [`vocab_parallel_cross_entropy`] and [`vocab_parallel_cross_entropy_backward`] run the steps
//! on one engine. Sums are fixed-order (no atomics; rows' sums by `reduce`), so results are
//! bit-identical on reruns; they equal the single-device cross-entropy to rounding (the
//! statistics are combined in another order). Targets are I32 `[rows]`; `ignore_index` (default
//! −100) marks ignored rows. Logits any float dtype; statistics, losses and gradients F32.

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::loss::{Reduction, check_target_tensor};
use crate::{DType, Engine, Error, Result, Tensor, reduce};

/// `wgsl/vocab_parallel.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "vocab_parallel",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        include_str!("../wgsl/vocab_parallel.wgsl"),
    ],
};

const WG: u64 = 256;

/// Options of the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabParallelOptions {
    /// Target value of ignored rows (default −100).
    pub ignore_index: i32,
    /// How the rows' losses are reduced (default mean over the counted rows).
    pub reduction: Reduction,
}

impl Default for VocabParallelOptions {
    fn default() -> Self {
        VocabParallelOptions {
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

#[derive(encase::ShaderType)]
struct Params {
    rows: u32,
    cols: u32,
    offset: u32,
    shards: u32,
    ignore_index: i32,
    reduction: u32,
}

fn code(r: Reduction) -> u32 {
    match r {
        Reduction::None => 0,
        Reduction::Sum => 1,
        Reduction::Mean => 2,
    }
}

fn params(
    rows: usize,
    cols: usize,
    offset: usize,
    shards: usize,
    o: &VocabParallelOptions,
) -> Params {
    Params {
        rows: rows as u32,
        cols: cols as u32,
        offset: offset as u32,
        shards: shards as u32,
        ignore_index: o.ignore_index,
        reduction: code(o.reduction),
    }
}

fn dt(d: DType) -> Vec<(&'static str, f64)> {
    vec![("DT", f64::from(d.code()))]
}

/// The rows and the width of a shard, checked with its targets and offset.
fn shard_shape(
    logits: &Tensor,
    targets: &Tensor,
    offset: usize,
    what: &str,
) -> Result<(usize, usize)> {
    if !logits.dtype().is_float() {
        return Err(Error::dtype(
            format!("{what}: logits"),
            logits.dtype(),
            &DType::FLOATS,
        ));
    }
    let [rows, cols] = logits.shape() else {
        return Err(Error::shape(
            format!("{what}: logits [rows, width]"),
            &[1, 1],
            logits.shape(),
        ));
    };
    check_target_tensor(
        &format!("{what}: targets"),
        logits.engine(),
        targets,
        &[*rows],
    )?;
    let end = offset.saturating_add(*cols);
    if end > i32::MAX as usize || rows * cols > u32::MAX as usize {
        return Err(Error::bounds(
            format!("{what}: vocabulary end"),
            end as u64,
            0,
            i32::MAX as u64,
        ));
    }
    Ok((*rows, *cols))
}

/// A shard's statistics (see the module): F32 `[rows, 4]`.
///
/// Errors: logits not a float `[rows, width]`; targets not I32 `[rows]` on the same engine;
/// `offset + width` past `i32::MAX` or more than 2³² − 1 logits.
pub fn shard_statistics(
    logits: &Tensor,
    targets: &Tensor,
    offset: usize,
    ignore_index: i32,
) -> Result<Tensor> {
    let (rows, cols) = shard_shape(logits, targets, offset, "shard_statistics")?;
    let engine = logits.engine();
    let out = Tensor::empty(engine, &[rows, 4], DType::F32, "vocab shard statistics")?;
    let o = VocabParallelOptions {
        ignore_index,
        ..Default::default()
    };
    engine.launch(
        &KERNEL,
        "shard_stats",
        &dt(logits.dtype()),
        &params(rows, cols, offset, 1, &o),
        &[logits.buffer(), targets.buffer(), out.buffer()],
        rows as u64,
    )?;
    Ok(out)
}

/// Every shard's statistics combined in the order given (see the module): F32 `[rows, 4]`.
///
/// Errors: no shards; statistics not F32 `[rows, 4]` of one row count on one engine.
pub fn combine_statistics(shards: &[&Tensor]) -> Result<Tensor> {
    let what = "combine_statistics";
    let Some(first) = shards.first() else {
        return Err(Error::bounds(
            format!("{what}: shards"),
            0,
            1,
            u32::MAX.into(),
        ));
    };
    let engine = first.engine();
    let rows = first.shape().first().copied().unwrap_or(0);
    for (k, s) in shards.iter().enumerate() {
        let w = format!("{what}: shard {k}");
        s.check_engine(engine, &w)?;
        if s.dtype() != DType::F32 {
            return Err(Error::dtype(w, s.dtype(), &[DType::F32]));
        }
        if s.shape() != [rows, 4] {
            return Err(Error::shape(w, &[rows, 4], s.shape()));
        }
    }
    // The shards stacked `[shards, rows, 4]` (copies of 16 bytes a row).
    let stacked = Tensor::empty(
        engine,
        &[shards.len(), rows, 4],
        DType::F32,
        "vocab stacked statistics",
    )?;
    let bytes = (rows * 16) as u64;
    if bytes > 0 {
        engine.record(|enc| {
            for (k, s) in shards.iter().enumerate() {
                enc.copy_buffer_to_buffer(s.buffer(), 0, stacked.buffer(), k as u64 * bytes, bytes);
            }
        });
    }
    let out = Tensor::empty(engine, &[rows, 4], DType::F32, "vocab statistics")?;
    engine.launch(
        &KERNEL,
        "combine",
        &dt(DType::F32),
        &params(rows, 0, 0, shards.len(), &VocabParallelOptions::default()),
        &[stacked.buffer(), out.buffer()],
        (rows as u64).div_ceil(WG),
    )?;
    Ok(out)
}

/// What the loss keeps for [`row_cotangents`]: the targets, the counted-row sums, the options.
#[derive(Debug, Clone)]
pub struct VocabParallelSaved {
    targets: Tensor,
    statistics: Tensor,
    sums: Tensor,
    options: VocabParallelOptions,
    /// The shards' vocabulary offsets (only through [`vocab_parallel_cross_entropy`]).
    offsets: Vec<usize>,
}

impl VocabParallelSaved {
    /// The combined statistics, F32 `[rows, 4]`.
    pub fn statistics(&self) -> &Tensor {
        &self.statistics
    }
}

fn check_statistics(global: &Tensor, targets: &Tensor, what: &str) -> Result<usize> {
    global.check_engine(targets.engine(), what)?;
    let rows = targets.shape().first().copied().unwrap_or(0);
    check_target_tensor(
        &format!("{what}: targets"),
        targets.engine(),
        targets,
        &[rows],
    )?;
    if global.dtype() != DType::F32 || global.shape() != [rows, 4] {
        return Err(Error::shape(
            format!("{what}: statistics (F32)"),
            &[rows, 4],
            global.shape(),
        ));
    }
    Ok(rows)
}

/// The loss from the combined statistics: `[rows]` per-row losses (`Reduction::None`) or a
/// scalar `[]`, F32; and the context of the backward.
///
/// Errors: targets not I32 `[rows]`; statistics not F32 `[rows, 4]`; another engine.
pub fn losses(
    global: &Tensor,
    targets: &Tensor,
    options: &VocabParallelOptions,
) -> Result<(Tensor, VocabParallelSaved)> {
    let rows = check_statistics(global, targets, "vocab_parallel losses")?;
    let engine = targets.engine();
    // Each row's loss, then whether it counts: `[2, rows]`.
    let per_row = Tensor::empty(engine, &[2, rows], DType::F32, "vocab row losses")?;
    engine.launch(
        &KERNEL,
        "row_losses",
        &dt(DType::F32),
        &params(rows, 0, 0, 1, options),
        &[targets.buffer(), global.buffer(), per_row.buffer()],
        (rows as u64).div_ceil(WG),
    )?;
    // (Σ loss, Σ counted), each in a fixed order.
    let sums = reduce::sum_rows(&per_row)?;
    let loss = if options.reduction == Reduction::None {
        per_row.f32_range(0, &[rows], "vocab losses")?
    } else {
        let out = Tensor::empty(engine, &[], DType::F32, "vocab loss")?;
        engine.launch(
            &KERNEL,
            "finish",
            &dt(DType::F32),
            &params(rows, 0, 0, 1, options),
            &[sums.buffer(), out.buffer()],
            1,
        )?;
        out
    };
    let saved = VocabParallelSaved {
        targets: targets.clone(),
        statistics: global.clone(),
        sums,
        options: *options,
        offsets: Vec::new(),
    };
    Ok((loss, saved))
}

/// Each row's cotangent `[rows]` F32 from the loss cotangent (`[rows]` for
/// `Reduction::None`, else `[]` or `[1]`; any float dtype).
///
/// Errors: a cotangent of another shape, dtype or engine.
pub fn row_cotangents(saved: &VocabParallelSaved, dloss: &Tensor) -> Result<Tensor> {
    let what = "vocab_parallel row_cotangents: dloss";
    let engine = saved.targets.engine();
    dloss.check_engine(engine, what)?;
    if !dloss.dtype().is_float() {
        return Err(Error::dtype(what, dloss.dtype(), &DType::FLOATS));
    }
    let rows = saved.targets.len();
    let want: Vec<usize> = if saved.options.reduction == Reduction::None {
        vec![rows]
    } else {
        vec![]
    };
    if dloss.shape() != want.as_slice() && !(want.is_empty() && dloss.shape() == [1]) {
        return Err(Error::shape(what, &want, dloss.shape()));
    }
    let out = Tensor::empty(engine, &[rows], DType::F32, "vocab row cotangents")?;
    engine.launch(
        &KERNEL,
        "row_cotangents",
        &dt(dloss.dtype()),
        &params(rows, 0, 0, 1, &saved.options),
        &[
            saved.targets.buffer(),
            saved.sums.buffer(),
            dloss.buffer(),
            out.buffer(),
        ],
        (rows as u64).div_ceil(WG),
    )?;
    Ok(out)
}

/// A shard's logit gradient, F32 `[rows, width]`, from the combined statistics and the rows'
/// cotangents (both copied to the shard's device).
///
/// Errors: as [`shard_statistics`]; statistics not F32 `[rows, 4]` or cotangents not F32
/// `[rows]` on the logits' engine.
pub fn shard_backward(
    logits: &Tensor,
    targets: &Tensor,
    offset: usize,
    ignore_index: i32,
    global: &Tensor,
    cotangents: &Tensor,
) -> Result<Tensor> {
    let what = "shard_backward";
    let (rows, cols) = shard_shape(logits, targets, offset, what)?;
    check_statistics(global, targets, what)?;
    cotangents.check_engine(logits.engine(), what)?;
    if cotangents.dtype() != DType::F32 || cotangents.shape() != [rows] {
        return Err(Error::shape(
            format!("{what}: row cotangents (F32)"),
            &[rows],
            cotangents.shape(),
        ));
    }
    let engine = logits.engine();
    let out = Tensor::empty(engine, &[rows, cols], DType::F32, "vocab shard gradient")?;
    let o = VocabParallelOptions {
        ignore_index,
        ..Default::default()
    };
    engine.launch(
        &KERNEL,
        "shard_grad",
        &dt(logits.dtype()),
        &params(rows, cols, offset, 1, &o),
        &[
            logits.buffer(),
            targets.buffer(),
            global.buffer(),
            cotangents.buffer(),
            out.buffer(),
        ],
        ((rows * cols) as u64).div_ceil(WG),
    )?;
    Ok(out)
}

/// The steps on one engine: the shards (consecutive vocabulary ranges, in order) reduced, their
/// statistics combined, the loss.
///
/// Errors: no shards; shards of different row counts or engines; the steps' errors.
pub fn vocab_parallel_cross_entropy(
    shards: &[&Tensor],
    targets: &Tensor,
    options: &VocabParallelOptions,
) -> Result<(Tensor, VocabParallelSaved)> {
    let engine: &Engine = targets.engine();
    let mut offsets = Vec::with_capacity(shards.len());
    let mut stats = Vec::with_capacity(shards.len());
    let mut offset = 0usize;
    for (k, s) in shards.iter().enumerate() {
        s.check_engine(engine, &format!("vocab_parallel_cross_entropy: shard {k}"))?;
        offsets.push(offset);
        stats.push(shard_statistics(s, targets, offset, options.ignore_index)?);
        offset += s.shape().get(1).copied().unwrap_or(0);
    }
    let refs: Vec<&Tensor> = stats.iter().collect();
    let global = combine_statistics(&refs)?;
    let (loss, mut saved) = losses(&global, targets, options)?;
    saved.offsets = offsets;
    Ok((loss, saved))
}

/// Every shard's logit gradient (F32, in shard order) of [`vocab_parallel_cross_entropy`].
///
/// Errors: a shard count other than the forward's; the steps' errors.
pub fn vocab_parallel_cross_entropy_backward(
    saved: &VocabParallelSaved,
    shards: &[&Tensor],
    dloss: &Tensor,
) -> Result<Vec<Tensor>> {
    if shards.len() != saved.offsets.len() {
        return Err(Error::bounds(
            "vocab_parallel_cross_entropy_backward: shards",
            shards.len() as u64,
            saved.offsets.len() as u64,
            saved.offsets.len() as u64,
        ));
    }
    let g = row_cotangents(saved, dloss)?;
    shards
        .iter()
        .zip(&saved.offsets)
        .map(|(s, &offset)| {
            shard_backward(
                s,
                &saved.targets,
                offset,
                saved.options.ignore_index,
                &saved.statistics,
                &g,
            )
        })
        .collect()
}
