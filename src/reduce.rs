//! Fixed-order reductions: the building blocks other families reuse, exposed as ops.
//!
//! * [`sum_rows`], [`max_rows`]: one workgroup per row; lane `t` folds columns `t, t+256, ...`
//!   in order, then a pairwise workgroup tree (`wgsl/common/reduce.wgsl`).
//! * [`sum_columns`]: rows are cut into blocks of 64; each block's column sums are taken top
//!   to bottom, then the block partials are summed in block order ([`sum_partials`]).
//!
//! The order of every addition depends only on the shape, never on timing or the adapter's
//! scheduling, so reruns are bit-identical. No atomics. Inputs F32, F16 or BF16 (the last axis
//! is the column axis, leading axes flatten to rows); outputs F32, accumulation F32.

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::{DType, Engine, Error, Result, Tensor};

/// `wgsl/reduce.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "reduce",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        include_str!("../wgsl/reduce.wgsl"),
    ],
};

const WG: u64 = 256;

std::thread_local! {
    static SUBGROUP_ROWS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Overrides how the register-resident softmax and norm rows reduce, for launches from the
/// calling thread: `Some(true)` by subgroup shuffles (`wgsl/common/rows_subgroup.wgsl`)
/// wherever [`subgroup_width`] gives a width, `Some(false)` by the fan-in-8 workgroup trees
/// everywhere, `None` (the default) by the measured rule of each launch: subgroups for the
/// norm forwards, the 16-bit softmax forward and the 1,024-lane norm backwards, trees for the
/// other backwards (`notes/measurements.md`). Results are deterministic either way; the two
/// orders differ in the last bits. The chunked gated delta's state walks follow it too
/// (`Some(false)`: their parts summed through workgroup memory alone; the same bits either
/// way). For tests and measurements.
#[doc(hidden)]
pub fn force_subgroup_rows(choice: Option<bool>) {
    SUBGROUP_ROWS.with(|f| f.set(choice));
}

/// The subgroup width the register rows' reductions use on this engine's adapter: its
/// smallest subgroup size, at most 32 (a power of two, at least 4); `None` without `SUBGROUP`
/// (the rows then reduce by the workgroup trees).
pub fn subgroup_width(engine: &Engine) -> Option<u32> {
    let size = engine.info().subgroup_min_size;
    (size >= 4 && size.is_power_of_two()).then_some(size.min(32))
}

/// The subgroup width of a register-row launch that `prefers` subgroups (or not): that of
/// [`subgroup_width`] where [`rows_kernel`] takes the subgroup module, else `None`.
pub(crate) fn rows_subgroup_width(engine: &Engine, prefers: bool) -> Option<u32> {
    let wanted = SUBGROUP_ROWS.with(std::cell::Cell::get).unwrap_or(prefers);
    subgroup_width(engine).filter(|_| wanted)
}

/// The module of a register-row launch: `subgroup` (with `SG_WIDTH` added to `constants`)
/// where the launch `prefers` subgroups (or [`force_subgroup_rows`] says so) and
/// [`subgroup_width`] gives a width, else `plain`.
pub(crate) fn rows_kernel(
    engine: &Engine,
    plain: &'static Kernel,
    subgroup: &'static Kernel,
    prefers: bool,
    constants: &mut crate::kernel::Constants,
) -> &'static Kernel {
    match rows_subgroup_width(engine, prefers) {
        Some(width) => {
            constants.push(("SG_WIDTH", f64::from(width)));
            subgroup
        }
        None => plain,
    }
}

/// Rows per block of [`sum_columns`]'s first pass.
pub const BLOCK_ROWS: usize = 64;

#[derive(encase::ShaderType)]
struct Params {
    rows: u32,
    cols: u32,
    blocks: u32,
    total: u32,
    base: u32,
    run: u32,
}

/// (rows, cols) of a tensor read as a matrix whose last axis is the columns.
pub(crate) fn rows_cols(x: &Tensor) -> (usize, usize) {
    let cols = x.shape().last().copied().unwrap_or(1);
    let rows = x.shape()[..x.shape().len().saturating_sub(1)]
        .iter()
        .product();
    (rows, cols)
}

fn float_input(x: &Tensor, what: &str) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, x.dtype(), &DType::FLOATS))
    }
}

fn dt(x: &Tensor) -> crate::kernel::Constants {
    vec![("DT", f64::from(x.dtype().code()))]
}

fn per_row(x: &Tensor, entry: &str) -> Result<Tensor> {
    float_input(x, entry)?;
    let (rows, cols) = rows_cols(x);
    let leading = &x.shape()[..x.shape().len().saturating_sub(1)];
    let out = Tensor::empty(x.engine(), leading, DType::F32, entry)?;
    x.engine().launch(
        &KERNEL,
        entry,
        &dt(x),
        &Params {
            rows: rows as u32,
            cols: cols as u32,
            blocks: 0,
            total: 0,
            base: 0,
            run: 0,
        },
        &[x.buffer(), out.buffer()],
        rows as u64,
    )?;
    Ok(out)
}

/// Sum of each row: `out[r] = Σ_c x[r, c]`, shape = `x`'s leading axes, F32. An empty row
/// sums to 0.
pub fn sum_rows(x: &Tensor) -> Result<Tensor> {
    per_row(x, "row_sum")
}

/// Maximum of each row, F32; an empty row gives −∞.
pub fn max_rows(x: &Tensor) -> Result<Tensor> {
    per_row(x, "row_max")
}

/// Sum of each column: `out[c] = Σ_r x[r, c]`, shape `[cols]`, F32. No rows give zeros.
pub fn sum_columns(x: &Tensor) -> Result<Tensor> {
    float_input(x, "sum_columns")?;
    let (rows, cols) = rows_cols(x);
    let engine = x.engine();
    let blocks = rows.div_ceil(BLOCK_ROWS);
    engine.check_workspace("sum_columns", sum_columns_workspace_bytes(rows, cols))?;
    let partials = Tensor::empty(engine, &[blocks, cols], DType::F32, "sum_columns partials")?;
    column_partials_at(x, rows, &partials, 0)?;
    sum_partials(engine, &partials)
}

/// The first pass of [`sum_columns`] over the first `rows` rows of `x` (`[≥ rows, cols]`),
/// written as partial rows `first_block..` of `partials` (`[blocks, cols]` F32). Rows taken a
/// block of rows at a time (each block's `x` starting at a multiple of [`BLOCK_ROWS`] of the
/// whole) fill the partials the whole matrix would: [`sum_partials`] then gives the bits of
/// [`sum_columns`] of the whole.
pub(crate) fn column_partials_at(
    x: &Tensor,
    rows: usize,
    partials: &Tensor,
    first_block: usize,
) -> Result<()> {
    let (_, cols) = rows_cols(x);
    let blocks = rows.div_ceil(BLOCK_ROWS);
    let total = blocks * cols;
    let base = first_block * cols;
    if rows * cols > x.len() {
        return Err(Error::bounds(
            "column partials: elements read",
            (rows * cols) as u64,
            0,
            x.len() as u64,
        ));
    }
    if base + total > partials.len() {
        return Err(Error::bounds(
            "column partials: partial elements written",
            (base + total) as u64,
            0,
            partials.len() as u64,
        ));
    }
    x.engine().launch(
        &KERNEL,
        "column_partials",
        &dt(x),
        &Params {
            rows: rows as u32,
            cols: cols as u32,
            blocks: blocks as u32,
            total: total as u32,
            base: base as u32,
            run: 0,
        },
        &[x.buffer(), partials.buffer()],
        (total as u64).div_ceil(WG),
    )
}

/// Scratch bytes [`sum_columns`] allocates for a `[rows, cols]` input (its block partials).
pub fn sum_columns_workspace_bytes(rows: usize, cols: usize) -> u64 {
    let blocks = rows.div_ceil(BLOCK_ROWS);
    (blocks * cols * 4) as u64 + sum_partial_groups_workspace_bytes(1, blocks, cols)
}

/// Column sums of an F32 partials matrix `[blocks, cols]`, blocks summed in order: the second
/// pass of every cross-workgroup reduction (parameter gradients, loss sums).
pub fn sum_partials(engine: &Engine, partials: &Tensor) -> Result<Tensor> {
    let (rows, cols) = rows_cols(partials);
    let out = sum_partial_groups(engine, partials, 0, 1, rows, cols)?;
    out.reshape(&[cols])
}

/// Partial rows a run of [`sum_partial_groups`]'s first levels sums: short enough that a long
/// finish has many invocations in flight.
pub const FINISH_RUN_ROWS: usize = 16;

/// Scratch bytes [`sum_partial_groups`] allocates for `groups` runs of `per_group` partial
/// rows of `cols` columns: none for runs of at most [`BLOCK_ROWS`] rows; else each level's
/// sums of [`FINISH_RUN_ROWS`] rows at a time, until at most [`BLOCK_ROWS`] remain.
pub fn sum_partial_groups_workspace_bytes(groups: usize, per_group: usize, cols: usize) -> u64 {
    let mut bytes = 0u64;
    let mut rows = per_group;
    while rows > BLOCK_ROWS {
        rows = rows.div_ceil(FINISH_RUN_ROWS);
        bytes = bytes.saturating_add((groups as u64) * (rows as u64) * (cols as u64) * 4);
    }
    bytes
}

/// Grouped column sums of F32 partials stored from element `base` of `partials` as
/// `[groups · per_group, cols]`: `out[g, c] = Σ_{j < per_group} p[g·per_group + j, c]`, shape
/// `[groups, cols]`, in a fixed order: a run of at most [`BLOCK_ROWS`] rows top to bottom; a
/// longer one as the sums of its consecutive runs of [`FINISH_RUN_ROWS`] rows (each top to
/// bottom), summed the same way in turn (scratch: [`sum_partial_groups_workspace_bytes`]).
/// Families that keep several partial slots (or per-batch runs of blocks) in one buffer
/// finish them with this.
pub fn sum_partial_groups(
    engine: &Engine,
    partials: &Tensor,
    base: usize,
    groups: usize,
    per_group: usize,
    cols: usize,
) -> Result<Tensor> {
    partials.check_engine(engine, "sum_partials")?;
    if partials.dtype() != DType::F32 {
        return Err(Error::dtype(
            "sum_partials",
            partials.dtype(),
            &[DType::F32],
        ));
    }
    // Checked: a caller's sizes past usize must be refused, not wrap to a small count (the
    // kernel indexes in u32, which the partials' length bounds).
    let needed = groups
        .checked_mul(per_group)
        .and_then(|n| n.checked_mul(cols))
        .and_then(|n| n.checked_add(base));
    if needed.is_none_or(|n| n > partials.len()) {
        return Err(Error::bounds(
            "sum_partials: partial elements read",
            needed.map_or(u64::MAX, |n| n as u64),
            0,
            partials.len() as u64,
        ));
    }
    // A long group is first summed in runs of FINISH_RUN_ROWS partial rows (one invocation
    // summing thousands of rows serially left most of the device idle); a short one in one run.
    let (run, sub) = if per_group > BLOCK_ROWS {
        engine.check_workspace(
            "sum_partials",
            sum_partial_groups_workspace_bytes(groups, per_group, cols),
        )?;
        (FINISH_RUN_ROWS, per_group.div_ceil(FINISH_RUN_ROWS))
    } else {
        (per_group, 1)
    };
    let label = if sub > 1 {
        "sum_partials runs"
    } else {
        "sum_partials"
    };
    let out = Tensor::empty(engine, &[groups * sub, cols], DType::F32, label)?;
    let total = out.len();
    engine.launch(
        &KERNEL,
        "column_finish",
        &vec![("DT", 0.0)],
        &Params {
            rows: per_group as u32,
            cols: cols as u32,
            blocks: sub as u32,
            total: total as u32,
            base: base as u32,
            run: run as u32,
        },
        &[partials.buffer(), out.buffer()],
        (total as u64).div_ceil(WG),
    )?;
    if sub > 1 {
        return sum_partial_groups(engine, &out, 0, groups, sub, cols);
    }
    Ok(out)
}
