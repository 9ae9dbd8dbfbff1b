//! Embedding lookup: forward gather and a deterministic table gradient.
//!
//! * Forward ([`embedding`]): `out[p, :] = table[indices[p], :]` for every position `p` of an
//!   index tensor of any shape; the output is `[indices.shape.., D]` in the table's dtype, a
//!   bit-exact copy of the stored rows (NaN payloads and signed zeros included).
//! * Backward ([`embedding_backward`]): `dtable[v, c] = Σ_{p : indices[p] = v} dy[p, c]`, F32
//!   `[V, D]`, the sum taken in **ascending position order** for every element (so the result
//!   is a plain left-to-right f32 sum, the same bits on every run and every adapter with IEEE
//!   addition). Rows that no position references get zeros.
//!
//! # Padding
//!
//! [`EmbeddingOptions::padding_index`] follows PyTorch: the forward still gathers the padding
//! row (whatever it holds), and the padding row receives no gradient (its `dtable` row is 0).
//!
//! # max_norm
//!
//! [`EmbeddingOptions::max_norm`] follows PyTorch's `max_norm` and `norm_type`
//! ([`EmbeddingOptions::norm_type`], default 2), made functional. PyTorch renormalizes the
//! table in place (under `no_grad`) before the lookup: every row referenced by an index whose
//! p-norm `‖w_v‖_p` exceeds `max_norm` is replaced by `w_v·max_norm/(‖w_v‖_p + 1e-7)`, with
//! `‖w‖_p = (Σ|w_c|^p)^(1/p)` for p > 0 and `max |w_c|` for p = ∞. Here no tensor is mutated:
//! the forward returns the rows as they would be after that renormalization (`out[p] =
//! s_v·table[v]`, `v = indices[p]`, `s_v = max_norm/(‖w_v‖_p + 1e-7)` when `‖w_v‖_p >
//! max_norm`, else 1; the norm in FP32 over the stored values — a sum of squares then `sqrt`
//! for p = 2, of magnitudes for p = 1, the running maximum for p = ∞, of `pow(|w|, p)` then
//! `pow(·, 1/p)` otherwise, each in the fixed order of the workgroup reduction — the product
//! rounded once to the table's dtype; rows with `s_v = 1` copied bit-exactly, the padding row
//! included), and [`embedding_renorm`] returns the renormalized copy of the table that PyTorch
//! would leave behind, for the caller to keep.
//! The gradient is PyTorch's: that of gathering the (renormalized) rows, i.e. the scale is a
//! constant and [`embedding_backward`] is unchanged — `dtable` is the gradient with respect
//! to the looked-up rows, to be applied to the renormalized table. Scratch: one F32 scale per
//! position ([`embedding_max_norm_workspace_bytes`]).
//!
//! # scale_grad_by_freq
//!
//! With [`EmbeddingOptions::scale_grad_by_freq`] (PyTorch's option of that name) the
//! gradient of row `v` is divided by `n_v`, the number of positions whose index is `v`:
//! `dtable[v, c] = (Σ_{p : indices[p] = v} dy[p, c]) / n_v`, the sum taken in ascending
//! position order as below and then divided once. The counts come from the sorted keys of the
//! backward (the length of each row's run), so the result stays deterministic. The padding
//! row still gets 0; out-of-range positions (unchecked) are not counted.
//!
//! # Out-of-range indices
//!
//! As in `loss::cross_entropy` and `rope`: with [`EmbeddingOptions::check_indices`] (the
//! default) the forward reads the indices back and rejects one outside `[0, V)` (negative:
//! `InvalidValue`; `≥ V`: `OutOfBounds`). **This synchronizes** (submits the pending work and
//! waits). Without the check nothing is read back; an out-of-range position then gathers a
//! row of zeros and contributes to no gradient. No kernel ever reads or writes outside a
//! buffer: indices are compared with `V` before use (a negative I32 reads as ≥ 2³¹ > V).
//!
//! # Backward algorithm
//!
//! No float atomics and no dependence on scheduling:
//!
//! 1. Each position `p` becomes a 64-bit key `(row, p)`; positions that give no gradient
//!    (out of range, padding) get the row `0xffffffff`, and the key list is padded to a power
//!    of two (at least 2,048) with such keys.
//! 2. A bitonic sorting network orders the keys: blocks of 2,048 sorted in workgroup memory,
//!    then merge steps (distances ≥ 2,048 in global memory, one launch each; shorter distances
//!    in workgroup memory, one launch per merge level). The position is part of the key, so
//!    keys are distinct and the sorted order is unique: equal rows end up in ascending
//!    position order whatever the network's schedule.
//! 3. A `[V]` table of run starts (cleared to 0) receives, for each row that has keys, one
//!    plus the index of its first key (written by that key's invocation: one writer each).
//! 4. One invocation per element `(v, c)` of `dtable` (per four consecutive columns when `D`
//!    is a multiple of 4) reads its row's run start and adds `dy[p, c]` for the row's
//!    positions in key order (ascending `p`), writing each element once; a row without
//!    positions writes 0.
//!
//! Launches: `1 + Σ_{K=12}^{m} (K − 10)` for the sort of `2^m` padded keys (1 up to 2,048
//! positions, 10 for 16,384), each reading and writing `8·2^m` bytes; then a clear and two
//! launches. The scratch is the key list and the run starts, `8·max(2048, 2^⌈log₂ N⌉) + 4·V`
//! bytes ([`embedding_workspace_bytes`]; 641 KiB for V = 128,256 and N = 16,384), checked
//! against the engine's workspace bound. The gradient pass writes `V·D` F32 values and reads
//! each position's cotangent row once; a row referenced by many positions is summed
//! sequentially (work ∝ its position count, one invocation per column or four), slower than a
//! tree but in the documented order.
//!
//! # Bounds and dtypes
//!
//! Table `[V, D]` F32, F16 or BF16, `V < 2³¹`, at most 2³¹ − 1 elements; indices I32 or U32,
//! any shape (0-D: one position; empty: an empty output and a zero gradient); the output
//! and the cotangent at most 2³¹ − 1 elements. `D` may be odd with 16-bit tables (each
//! invocation writes whole output words). The cotangent may be F32, F16 or BF16.

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::{DType, Engine, Error, Result, Tensor};

/// `wgsl/embedding.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "embedding",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        include_str!("../wgsl/embedding.wgsl"),
    ],
};

const WG: u64 = 256;
/// Output words per invocation of the gather (`UNROLL` in the kernel).
const UNROLL: u64 = 4;
/// Keys sorted per workgroup in the local stages (`SORT_BLOCK` in the kernel).
const SORT_BLOCK: usize = 2048;
/// Row value of keys that give no gradient (`NO_ROW` in the kernel).
const NO_ROW: u32 = u32::MAX;
/// Largest element count of the table, the output and the cotangent.
const MAX_ELEMENTS: u64 = (1 << 31) - 1;

/// Options of [`embedding`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbeddingOptions {
    /// Padding row (default none): gathered by the forward like any row, but it receives no
    /// gradient (PyTorch's `padding_idx`). Must be `< V`.
    pub padding_index: Option<usize>,
    /// Read the indices back and reject any outside `[0, V)` (default true). **This
    /// synchronizes**. With `false`, out-of-range positions gather zeros and contribute no
    /// gradient.
    pub check_indices: bool,
    /// Renormalize looked-up rows whose L2 norm exceeds this (default none; finite and > 0):
    /// see the module documentation for the exact formula and the gradient contract.
    pub max_norm: Option<f32>,
    /// The p of the norm `max_norm` bounds (default 2; PyTorch's `norm_type`): any p > 0, or
    /// `f32::INFINITY` for the largest magnitude. Ignored without `max_norm`.
    pub norm_type: f32,
    /// Divide each row's gradient by the number of positions that reference it (default
    /// false; PyTorch's `scale_grad_by_freq`).
    pub scale_grad_by_freq: bool,
}

impl Default for EmbeddingOptions {
    fn default() -> Self {
        EmbeddingOptions {
            padding_index: None,
            check_indices: true,
            max_norm: None,
            norm_type: 2.0,
            scale_grad_by_freq: false,
        }
    }
}

/// What [`embedding`] keeps for its backward: the index tensor (a handle) and the table's
/// extents. The table itself is not kept (the gradient does not depend on its values).
#[derive(Debug, Clone)]
pub struct EmbeddingSaved {
    indices: Tensor,
    rows: usize,
    dim: usize,
    padding_index: Option<usize>,
    scale_grad_by_freq: bool,
}

impl EmbeddingSaved {
    /// The index tensor of the forward.
    pub fn indices(&self) -> &Tensor {
        &self.indices
    }

    /// The table's shape `[V, D]`.
    pub fn table_shape(&self) -> [usize; 2] {
        [self.rows, self.dim]
    }

    /// The padding row of the forward's options.
    pub fn padding_index(&self) -> Option<usize> {
        self.padding_index
    }

    /// Whether the backward divides each row's gradient by its position count.
    pub fn scale_grad_by_freq(&self) -> bool {
        self.scale_grad_by_freq
    }
}

#[derive(encase::ShaderType, Clone, Copy)]
struct Params {
    count: u32,
    words: u32,
    dim: u32,
    rows: u32,
    positions: u32,
    padding: u32,
    k: u32,
    j: u32,
    flags: u32,
    max_norm: f32,
    norm_type: f32,
}

/// `table_grad`: divide by the row's position count.
const F_FREQ: u32 = 1;
/// `row_scales`: one item per table row (else per position).
const F_TABLE_ROWS: u32 = 2;

impl Params {
    fn new(rows: usize, dim: usize, positions: usize, padding: Option<usize>) -> Params {
        Params {
            count: 0,
            words: 0,
            dim: dim as u32,
            rows: rows as u32,
            positions: positions as u32,
            padding: padding.map_or(NO_ROW, |p| p as u32),
            k: 0,
            j: 0,
            flags: 0,
            max_norm: 0.0,
            norm_type: 2.0,
        }
    }
}

/// Scratch bytes of [`embedding`] with `max_norm` for `positions` positions: one F32 scale
/// each.
pub fn embedding_max_norm_workspace_bytes(positions: usize) -> u64 {
    4 * positions as u64
}

/// Scratch bytes of [`embedding_renorm`]: the sort keys and run starts of
/// [`embedding_workspace_bytes`] plus one F32 scale per table row.
pub fn embedding_renorm_workspace_bytes(rows: usize, positions: usize) -> u64 {
    if positions == 0 {
        0
    } else {
        embedding_workspace_bytes(rows, positions) + 4 * rows as u64
    }
}

fn check_max_norm(what: &str, max_norm: f32, norm_type: f32) -> Result<()> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::InvalidValue {
            what: format!("{what}: max_norm"),
            got: f64::from(max_norm),
            rule: "must be finite and > 0".into(),
        });
    }
    if !(norm_type > 0.0) {
        return Err(Error::InvalidValue {
            what: format!("{what}: norm_type"),
            got: f64::from(norm_type),
            rule: "must be > 0 (f32::INFINITY for the largest magnitude)".into(),
        });
    }
    Ok(())
}

fn elements(what: &str, n: usize) -> Result<()> {
    if n as u64 > MAX_ELEMENTS {
        return Err(Error::bounds(what, n as u64, 0, MAX_ELEMENTS));
    }
    Ok(())
}

/// Padded key count of the backward's sort for `positions` positions.
fn padded_keys(positions: usize) -> usize {
    positions.next_power_of_two().max(SORT_BLOCK)
}

/// Scratch bytes [`embedding_backward`] allocates for a table of `rows` rows and `positions`
/// index positions: the sort keys, 8 bytes each for `max(2048, 2^⌈log₂ positions⌉)` keys, and
/// the `[rows]` U32 run starts (0 without positions).
pub fn embedding_workspace_bytes(rows: usize, positions: usize) -> u64 {
    if positions == 0 {
        0
    } else {
        8 * padded_keys(positions) as u64 + 4 * rows as u64
    }
}

/// Read the indices back and check them against `[0, rows)`.
fn check_index_values(indices: &Tensor, rows: usize) -> Result<()> {
    let values: Vec<i64> = match indices.dtype() {
        DType::I32 => indices
            .to_vec::<i32>()?
            .into_iter()
            .map(i64::from)
            .collect(),
        _ => indices
            .to_vec::<u32>()?
            .into_iter()
            .map(i64::from)
            .collect(),
    };
    if let Some((p, &v)) = values
        .iter()
        .enumerate()
        .find(|&(_, &v)| v < 0 || v >= rows as i64)
    {
        let what = format!("embedding: indices[{p}]");
        if v < 0 {
            return Err(Error::InvalidValue {
                what,
                got: v as f64,
                rule: format!("must be in [0, {rows})"),
            });
        }
        return Err(Error::OutOfBounds {
            what,
            got: v as u64,
            min: 0,
            max: rows.saturating_sub(1) as u64,
        });
    }
    Ok(())
}

/// Embedding forward: `out[.., :] = table[indices[..], :]`, shape `[indices.shape.., D]`, in
/// the table's dtype (a bit-exact copy of the rows). See the module documentation for padding
/// and out-of-range indices.
///
/// Errors: a table that is not 2-D (`ShapeMismatch`) or not F32/F16/BF16, indices that are
/// not I32/U32 (`UnsupportedDType`); `V ≥ 2³¹`, a table, output or position count past
/// 2³¹ − 1 elements, `padding_index ≥ V` (`OutOfBounds`); with `check_indices`, an index
/// outside `[0, V)` (`InvalidValue` when negative, `OutOfBounds` otherwise; this
/// synchronizes); tensors of another engine (`EngineMismatch`); an output past the binding
/// limit (`LimitExceeded`).
pub fn embedding(
    table: &Tensor,
    indices: &Tensor,
    options: &EmbeddingOptions,
) -> Result<(Tensor, EmbeddingSaved)> {
    let &[rows, dim] = table.shape() else {
        return Err(Error::shape(
            "embedding: table (2-D [rows, dim])",
            &[table.len(), 1],
            table.shape(),
        ));
    };
    if !table.dtype().is_float() {
        return Err(Error::dtype(
            "embedding: table",
            table.dtype(),
            &DType::FLOATS,
        ));
    }
    if !matches!(indices.dtype(), DType::I32 | DType::U32) {
        return Err(Error::dtype(
            "embedding: indices",
            indices.dtype(),
            &[DType::I32, DType::U32],
        ));
    }
    let engine = table.engine();
    indices.check_engine(engine, "embedding: indices")?;
    elements("embedding: table rows", rows)?;
    elements("embedding: table elements", table.len())?;
    let positions = indices.len();
    elements("embedding: positions", positions)?;
    let count = positions.saturating_mul(dim);
    elements("embedding: output elements", count)?;
    if let Some(pad) = options.padding_index
        && pad >= rows
    {
        return Err(Error::bounds(
            "embedding: padding_index",
            pad as u64,
            0,
            rows.saturating_sub(1) as u64,
        ));
    }
    if let Some(m) = options.max_norm {
        check_max_norm("embedding", m, options.norm_type)?;
        engine.check_workspace("embedding", embedding_max_norm_workspace_bytes(positions))?;
    }
    if options.check_indices && positions > 0 {
        check_index_values(indices, rows)?;
    }
    let mut shape = indices.shape().to_vec();
    shape.push(dim);
    let out = Tensor::empty(engine, &shape, table.dtype(), "embedding output")?;
    let dt = vec![("DT", f64::from(table.dtype().code()))];
    let base = Params {
        count: count as u32,
        ..Params::new(rows, dim, positions, options.padding_index)
    };
    let saved = EmbeddingSaved {
        indices: indices.clone(),
        rows,
        dim,
        padding_index: options.padding_index,
        scale_grad_by_freq: options.scale_grad_by_freq,
    };
    if let Some(max_norm) = options.max_norm {
        if count == 0 {
            return Ok((out, saved));
        }
        let scales = Tensor::empty(engine, &[positions], DType::F32, "embedding row scales")?;
        engine.launch(
            &KERNEL,
            "row_scales",
            &dt,
            &Params {
                count: positions as u32,
                max_norm,
                norm_type: options.norm_type,
                ..base
            },
            &[table.buffer(), indices.buffer(), scales.buffer()],
            positions as u64,
        )?;
        let words = if table.dtype() == DType::F32 {
            count
        } else {
            count.div_ceil(2)
        };
        engine.launch(
            &KERNEL,
            "gather_scaled",
            &dt,
            &Params {
                words: words as u32,
                ..base
            },
            &[
                table.buffer(),
                indices.buffer(),
                out.buffer(),
                scales.buffer(),
            ],
            (words as u64).div_ceil(WG),
        )?;
        return Ok((out, saved));
    }
    // Whole vec4 rows (4 F32 or 8 16-bit elements per vec4): one vec4 per copy.
    let per_vec = if table.dtype() == DType::F32 { 4 } else { 8 };
    if dim.is_multiple_of(per_vec) {
        let vecs = count / per_vec;
        engine.launch(
            &KERNEL,
            "gather_vec4",
            &dt,
            &Params {
                words: vecs as u32,
                ..base
            },
            &[indices.buffer(), table.buffer(), out.buffer()],
            (vecs as u64).div_ceil(WG * UNROLL),
        )?;
    } else {
        let words = if table.dtype() == DType::F32 {
            count
        } else {
            count.div_ceil(2)
        };
        engine.launch(
            &KERNEL,
            "gather",
            &dt,
            &Params {
                words: words as u32,
                ..base
            },
            &[table.buffer(), indices.buffer(), out.buffer()],
            (words as u64).div_ceil(WG * UNROLL),
        )?;
    }
    Ok((out, saved))
}

/// The table after PyTorch's in-place `max_norm` renormalization, as a fresh tensor (same
/// shape and dtype): every row referenced by some index in `indices` (the padding row
/// included) whose `norm_type`-norm exceeds `max_norm` becomes `row·max_norm/(‖row‖_p + 1e-7)`
/// (FP32, rounded once to the table's dtype; the norm as in the module documentation); every
/// other row is copied bit-exactly. Together with [`embedding`] and the same `max_norm` and
/// `norm_type` this gives both results of PyTorch's `embedding(.., max_norm, norm_type)`: the
/// looked-up rows and the table it leaves behind.
///
/// Errors: those of [`embedding`] for the table, the indices and `check_indices` (which
/// synchronizes; unchecked out-of-range indices reference no row); a `max_norm` that is not
/// finite and positive or a `norm_type` that is not > 0 (`InvalidValue`); scratch over the
/// workspace bound (`WorkspaceExceeded`, [`embedding_renorm_workspace_bytes`]).
pub fn embedding_renorm(
    table: &Tensor,
    indices: &Tensor,
    max_norm: f32,
    norm_type: f32,
    check_indices: bool,
) -> Result<Tensor> {
    let options = EmbeddingOptions {
        check_indices: false,
        ..EmbeddingOptions::default()
    };
    // The shape, dtype and bound checks of the forward (nothing is launched for 0 positions).
    let empty_indices;
    let probe = if indices.is_empty() {
        indices
    } else {
        empty_indices = Tensor::zeros(table.engine(), &[0], indices.dtype())?;
        &empty_indices
    };
    embedding(table, probe, &options)?;
    let engine = table.engine();
    indices.check_engine(engine, "embedding_renorm: indices")?;
    check_max_norm("embedding_renorm", max_norm, norm_type)?;
    let (rows, dim) = (table.shape()[0], table.shape()[1]);
    let positions = indices.len();
    elements("embedding_renorm: positions", positions)?;
    engine.check_workspace(
        "embedding_renorm",
        embedding_renorm_workspace_bytes(rows, positions),
    )?;
    if check_indices && positions > 0 {
        check_index_values(indices, rows)?;
    }
    let out = Tensor::empty(engine, table.shape(), table.dtype(), "embedding_renorm")?;
    let count = rows * dim;
    if count == 0 {
        return Ok(out);
    }
    let dt = vec![("DT", f64::from(table.dtype().code()))];
    let base = Params {
        count: count as u32,
        max_norm,
        norm_type,
        ..Params::new(rows, dim, positions, None)
    };
    // Referenced rows: the run starts of the sorted keys (no padding exclusion).
    let starts = Tensor::zeros(engine, &[rows], DType::U32)?;
    if positions > 0 {
        let saved = EmbeddingSaved {
            indices: indices.clone(),
            rows,
            dim,
            padding_index: None,
            scale_grad_by_freq: false,
        };
        let keys = sort_keys(engine, &saved)?;
        engine.launch(
            &KERNEL,
            "run_starts",
            &vec![("DT", 0.0)],
            &base,
            &[keys.buffer(), starts.buffer()],
            (positions as u64).div_ceil(WG),
        )?;
    }
    let scales = Tensor::empty(engine, &[rows], DType::F32, "embedding_renorm scales")?;
    engine.launch(
        &KERNEL,
        "row_scales",
        &dt,
        &Params {
            count: rows as u32,
            flags: F_TABLE_ROWS,
            ..base
        },
        &[table.buffer(), indices.buffer(), scales.buffer()],
        rows as u64,
    )?;
    let words = if table.dtype() == DType::F32 {
        count
    } else {
        count.div_ceil(2)
    };
    engine.launch(
        &KERNEL,
        "renorm_table",
        &dt,
        &Params {
            words: words as u32,
            ..base
        },
        &[
            table.buffer(),
            out.buffer(),
            starts.buffer(),
            scales.buffer(),
        ],
        (words as u64).div_ceil(WG),
    )?;
    Ok(out)
}

/// Embedding backward: the table gradient `dtable [V, D]` (F32) from the cotangent `dy` of
/// the forward's output (`[indices.shape.., D]`, F32/F16/BF16). Repeated indices accumulate
/// in ascending position order (then divided by their count with `scale_grad_by_freq`); the
/// padding row, unreferenced rows and out-of-range positions give zeros. With `max_norm` the
/// gradient is the same (with respect to the looked-up, renormalized rows; see the module
/// documentation). Algorithm, launches and scratch: see the module documentation.
///
/// Errors: `dy` of another shape (`ShapeMismatch`) or not a float dtype (`UnsupportedDType`),
/// of another engine (`EngineMismatch`); sort keys and run starts over the workspace bound
/// (`WorkspaceExceeded`, see [`embedding_workspace_bytes`]); `V·D` past 2³¹ − 1
/// (`OutOfBounds`) or a gradient past the binding limit (`LimitExceeded`).
pub fn embedding_backward(saved: &EmbeddingSaved, dy: &Tensor) -> Result<Tensor> {
    let engine = saved.indices.engine();
    if !dy.dtype().is_float() {
        return Err(Error::dtype(
            "embedding_backward: dy",
            dy.dtype(),
            &DType::FLOATS,
        ));
    }
    let mut shape = saved.indices.shape().to_vec();
    shape.push(saved.dim);
    if dy.shape() != shape.as_slice() {
        return Err(Error::shape("embedding_backward: dy", &shape, dy.shape()));
    }
    dy.check_engine(engine, "embedding_backward: dy")?;
    let (rows, dim) = (saved.rows, saved.dim);
    let positions = saved.indices.len();
    let count = rows.saturating_mul(dim);
    elements("embedding_backward: gradient elements", count)?;
    if positions == 0 || count == 0 {
        return Tensor::zeros(engine, &[rows, dim], DType::F32);
    }
    engine.check_workspace(
        "embedding_backward",
        embedding_workspace_bytes(rows, positions),
    )?;
    let keys = sort_keys(engine, saved)?;
    let params = Params {
        count: count as u32,
        flags: if saved.scale_grad_by_freq { F_FREQ } else { 0 },
        ..Params::new(rows, dim, positions, saved.padding_index)
    };
    let starts = Tensor::zeros(engine, &[rows], DType::U32)?;
    engine.launch(
        &KERNEL,
        "run_starts",
        &vec![("DT", 0.0)],
        &params,
        &[keys.buffer(), starts.buffer()],
        (positions as u64).div_ceil(WG),
    )?;
    let dtable = Tensor::empty(engine, &[rows, dim], DType::F32, "embedding dtable")?;
    let dt = vec![("DT", f64::from(dy.dtype().code()))];
    if dim.is_multiple_of(4) {
        let threads = count / 4;
        engine.launch(
            &KERNEL,
            "table_grad_vec4",
            &dt,
            &Params {
                count: threads as u32,
                ..params
            },
            // The cotangent is bound twice: as words (16-bit) and as vec4s (F32).
            &[
                dy.buffer(),
                keys.buffer(),
                starts.buffer(),
                dtable.buffer(),
                dy.buffer(),
            ],
            (threads as u64).div_ceil(WG),
        )?;
    } else {
        engine.launch(
            &KERNEL,
            "table_grad",
            &dt,
            &params,
            &[dy.buffer(), keys.buffer(), dtable.buffer(), starts.buffer()],
            (count as u64).div_ceil(WG),
        )?;
    }
    Ok(dtable)
}

/// The sorted `(row, position)` keys of the saved indices (U32 pairs, padded length).
fn sort_keys(engine: &Engine, saved: &EmbeddingSaved) -> Result<Tensor> {
    let positions = saved.indices.len();
    let n = padded_keys(positions);
    let keys = Tensor::empty(engine, &[n, 2], DType::U32, "embedding sort keys")?;
    let base = Params {
        count: n as u32,
        ..Params::new(saved.rows, saved.dim, positions, saved.padding_index)
    };
    let no_constants = vec![("DT", 0.0)];
    let blocks = (n / SORT_BLOCK) as u64;
    engine.launch(
        &KERNEL,
        "sort_blocks",
        &no_constants,
        &base,
        &[saved.indices.buffer(), keys.buffer()],
        blocks,
    )?;
    let mut k = 2 * SORT_BLOCK;
    while k <= n {
        let mut j = k / 2;
        while j >= SORT_BLOCK {
            engine.launch(
                &KERNEL,
                "merge_global",
                &no_constants,
                &Params {
                    k: k as u32,
                    j: j as u32,
                    ..base
                },
                &[keys.buffer()],
                (n as u64 / 2).div_ceil(WG),
            )?;
            j /= 2;
        }
        engine.launch(
            &KERNEL,
            "merge_blocks",
            &no_constants,
            &Params {
                k: k as u32,
                ..base
            },
            &[keys.buffer()],
            blocks,
        )?;
        k *= 2;
    }
    Ok(keys)
}
