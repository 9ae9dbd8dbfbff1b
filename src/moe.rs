//! Fused mixture of experts (Liger-Kernel's fused MoE): the routed experts of a sparse MoE
//! layer, forward and backward, given the router's top-k choice.
//!
//! For tokens `x [.., H]` (T rows), experts' `gate_up [E, 2I, H]` (per expert the gate rows
//! then the up rows, each `[I, H]`, the `[out, in]` layout) and `down [E, H, I]`, and per token
//! K slots `index [.., K]` (I32 or U32 expert numbers) with weights `w [.., K]`:
//!
//! `y_t = Σ_k w_t,k · down_e · (act(gate_e · x_t) ⊙ (up_e · x_t))`, `e = index_t,k`,
//!
//! with `act` SiLU (SwiGLU, the default) or any gate of the activation family. Output
//! `[.., H]` F32, or F16 / BF16 ([`MoeOptions::output`]: the F32 sums rounded once, by the
//! combine); x, the weights' tensors, w and the cotangent F32, F16 or BF16 (each
//! independently); products accumulate in FP32 and every intermediate is F32.
//!
//! How it runs: a routing pass sorts the T·K slots by expert with a stable counting sort on the
//! GPU (slot order within an expert; [`MoeRouting`]), reads back the E + 1 expert starts (the
//! one synchronization, without a capacity: the products' extents depend on it), gathers x's
//! rows into expert order, and runs two products of the matmul family (`[gate ‖ up]` in one,
//! then `down`) around the packed gated activation: where the loads are even enough
//! ([`MoeOptions::pad`]) the slots are scattered into blocks of the largest load, zero rows
//! padding the rest, and each product is one batched launch over the experts; else one launch
//! per busy expert. A combine adds each token's K rows times their weights in slot order. No
//! atomics: every sum has a fixed order, so reruns are bit-identical.
//!
//! Gradients (F32; F16 / BF16 through [`fused_moe_backward_as`], bit for bit the F32 ones cast),
//! with `dy [.., H]`: per slot `s` of token `t` and expert `e`, with
//! `h_s = act(g_s) ⊙ u_s` and `dhu_s = down_eᵀ·dy_t`: `dw_t,k = ⟨dhu_s, h_s⟩`,
//! `dh_s = w_s·dhu_s`, `(dg_s, du_s)` through the activation, `dx_t = Σ_k gate_upᵀ_e·[dg_s ‖
//! du_s]`, `d down_e = Σ_s w_s·dy_t ⊗ h_s`, `d gate_up_e = Σ_s [dg_s ‖ du_s] ⊗ x_t`; the
//! expert sums are the products' fixed-order reductions over the expert's sorted slots. An
//! expert with no slots gets zero gradients.
//!
//! Slots whose index is E or more (a negative I32 included) route nowhere: they add nothing to
//! `y`, and their weight gradient is 0 (so a shard of an expert-parallel layer can pass the
//! global indices minus its first expert and drop the others' slots). Duplicate experts in a
//! token's top-k are two slots. T = 0 or K = 0 give a zero-row or zero output and zero weight
//! gradients.
//!
//! With [`MoeOptions::capacity`] `Some(c)` the routing reads nothing back: each expert gets a
//! block of `c` rows holding its first `c` slots in slot order (later slots are dropped: they
//! route nowhere), unused rows are zero padding, and each product is one batched launch over
//! the E blocks ([`route_with_capacity`]).
//!
//! Memory: the forward keeps the `[slots, 2I]` F32 pre-activations for the backward unless
//! [`MoeOptions::recompute`] (then the backward recomputes them: one more product an expert);
//! the sorted x rows are gathered again in the backward rather than kept.

use crate::activation::{self, Activation, ActivationOptions};
use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::matmul::{self, Gemm, GemmOperand};
use crate::mlp::check_float;
use crate::{DType, Error, Result, Tensor};

/// `wgsl/moe.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "moe",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        include_str!("../wgsl/moe.wgsl"),
    ],
};

/// The most experts a call takes.
pub const MAX_EXPERTS: usize = 4096;

/// Most sorted rows of [`MoeOptions::pad`]'s padded layout, as a multiple of the routed slots.
pub const PAD_LIMIT: usize = 2;

/// Slots a routing invocation counts and scatters (`TILE` of `wgsl/moe.wgsl`).
const TILE: usize = 256;

/// Lanes of a workgroup (`WG` of `wgsl/moe.wgsl`).
const WG: usize = 256;

/// Options of [`fused_moe`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeOptions {
    /// The gate activation: [`Activation::Silu`] (SwiGLU, the default) or another of the
    /// activation family ([`Activation::GeluTanh`]: GeGLU).
    pub activation: Activation,
    /// Recompute the `[gate ‖ up]` products in the backward instead of keeping them.
    pub recompute: bool,
    /// Opt-in: products whose two operands are 16-bit run on tensor cores
    /// ([`crate::matmul::Gemm::tensor_cores`]; see [`crate::mlp::MlpOptions::tensor_cores`]): the
    /// `[gate ‖ up]` products for 16-bit x and `gate_up`, and `dhu = dy·down` for a 16-bit dy and
    /// `down`. Needs [`crate::matmul::tensor_cores`] when any product qualifies (else
    /// `MissingFeature`).
    pub tensor_cores: bool,
    /// `Some(c)`: route with [`route_with_capacity`] — at most `c` slots an expert (the
    /// later ones, in slot order, dropped: deterministic token dropping), no readback, each
    /// product one batched launch over the experts' `c`-row blocks (padding rows are zeros).
    /// `None` (the default): every slot, [`route`]'s one readback, then the layout `pad` picks.
    pub capacity: Option<usize>,
    /// Without a capacity: lay the sorted rows out in blocks of the largest expert load (every
    /// slot kept, padding rows zeros) where E × that load is at most [`PAD_LIMIT`] × the routed
    /// slots and the scratch of both passes fits the workspace bound, so each product is one
    /// batched launch over the experts; otherwise, or when false, a launch per busy expert.
    /// Default true. Either layout gives every slot the same products (the padded rows add
    /// zeros to the weight gradients).
    pub pad: bool,
    /// The output's dtype: F32 (the default), or F16 / BF16, each value the F32 sum rounded
    /// once to nearest even (bit for bit [`crate::cast::cast`] of the F32 output), written by the
    /// combine itself: no F32 output is allocated.
    pub output: DType,
}

impl Default for MoeOptions {
    fn default() -> Self {
        MoeOptions {
            activation: Activation::Silu,
            recompute: false,
            tensor_cores: false,
            capacity: None,
            pad: true,
            output: DType::F32,
        }
    }
}

#[derive(encase::ShaderType)]
struct Params {
    tokens: u32,
    k: u32,
    experts: u32,
    tiles: u32,
    width: u32,
    weighted: u32,
    rows: u32,
    capacity: u32,
}

/// The slots of a top-k index sorted by expert into rows: row `p` holds slot `perm[p]` (slot
/// `f = t·K + k`), slot `f` sits at row `inverse[f]` (`u32::MAX` when it routes nowhere or is
/// dropped). Expert `e` owns rows `starts[e]..starts[e + 1]`, its slots in slot order: exactly
/// its slots ([`route`]), or `capacity` rows (`e·capacity..`, [`route_with_capacity`]) holding
/// its first `capacity` slots, the unused rows marked `u32::MAX` (gathered as zeros).
#[derive(Debug, Clone)]
pub struct MoeRouting {
    perm: Tensor,
    inverse: Tensor,
    slot_starts: Tensor,
    starts: Vec<usize>,
    capacity: Option<usize>,
    padded: bool,
    tokens: usize,
    k: usize,
}

impl MoeRouting {
    /// U32 `[rows]`: the slot of each sorted row (`u32::MAX` for a padding row).
    pub fn permutation(&self) -> &Tensor {
        &self.perm
    }

    /// U32 `[T·K]`: each slot's row, `u32::MAX` for a slot that routes nowhere or is dropped.
    pub fn inverse(&self) -> &Tensor {
        &self.inverse
    }

    /// The `E + 1` starts of the experts' rows (host).
    pub fn starts(&self) -> &[usize] {
        &self.starts
    }

    /// The rows of each expert: its slots ([`route`]), or the capacity.
    pub fn counts(&self) -> Vec<usize> {
        self.starts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// The sorted rows: the routed slots ([`route`]), or E × capacity.
    pub fn rows(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The rows of each expert's block: the capacity of [`route_with_capacity`], or the
    /// largest load of [`fused_moe`]'s padded layout ([`MoeOptions::pad`]); `None` for
    /// [`route`]'s rows.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// Whether [`fused_moe`] padded an exact routing into blocks of its largest load (nothing
    /// dropped; [`MoeOptions::pad`]).
    pub fn padded(&self) -> bool {
        self.padded
    }

    /// U32 `[E + 1]` on the device: the exclusive running sum of the slots routed to each
    /// expert before any capacity (so expert `e` got `s[e + 1] − s[e]` slots, and with a
    /// capacity `max(0, s[e + 1] − s[e] − capacity)` of them dropped), with no readback.
    pub fn slot_starts(&self) -> &Tensor {
        &self.slot_starts
    }

    fn experts(&self) -> usize {
        self.starts.len() - 1
    }

    /// No slot at all, or no sorted row: every output and gradient is zero.
    fn idle(&self) -> bool {
        self.tokens * self.k == 0 || self.rows() == 0
    }

    fn params(&self, width: usize, weighted: bool) -> Params {
        Params {
            tokens: self.tokens as u32,
            k: self.k as u32,
            experts: self.experts() as u32,
            tiles: 0,
            width: width as u32,
            weighted: u32::from(weighted),
            rows: self.rows() as u32,
            capacity: self.capacity.unwrap_or(0) as u32,
        }
    }
}

/// Scratch bytes of [`route`] and [`route_with_capacity`]: the per-(expert, tile) counts.
pub fn route_workspace_bytes(slots: usize, experts: usize) -> u64 {
    (experts as u64)
        .saturating_mul(slots.div_ceil(TILE) as u64)
        .saturating_mul(4)
}

/// Sort the slots of `index [.., K]` (I32 or U32) by expert among `experts`: the GPU counts, the
/// E + 1 starts are read back (this synchronizes with the device), then the GPU scatters (no
/// atomics: the order is the slot order within each expert).
///
/// Errors: `index` not I32/U32 or of rank 0; `experts` outside 1..=[`MAX_EXPERTS`]; more than
/// 2³¹ − 1 slots, or experts × ⌈slots / 256⌉ past 2³² − 1; scratch past the workspace bound.
pub fn route(index: &Tensor, experts: usize) -> Result<MoeRouting> {
    sort_slots(index, experts, Layout::Exact)
}

/// [`route`] with `capacity` rows an expert and no readback: expert `e`'s first `capacity`
/// slots (in slot order) take rows `e·capacity..`, its further slots are dropped (they route
/// nowhere: nothing added, weight gradient 0), unused rows are padding. Deterministic token
/// dropping, as a capacity factor does (`capacity = ⌈factor·T·K / E⌉`); the products then run
/// as one batched launch each.
///
/// Errors: those of [`route`]; `capacity` 0, or E × capacity past 2³¹ − 1 (`OutOfBounds`).
pub fn route_with_capacity(index: &Tensor, experts: usize, capacity: usize) -> Result<MoeRouting> {
    let rows = experts.saturating_mul(capacity);
    if capacity == 0 || rows > i32::MAX as usize {
        return Err(Error::bounds(
            "moe: capacity (E × capacity rows)",
            rows as u64,
            1,
            i32::MAX as u64,
        ));
    }
    sort_slots(index, experts, Layout::Capacity(capacity))
}

/// How [`sort_slots`] lays the rows out.
enum Layout<'a> {
    /// Every routed slot, the starts read back.
    Exact,
    /// Blocks of this capacity, nothing read back.
    Capacity(usize),
    /// The starts read back, then blocks of the capacity this gives for them (padded: nothing
    /// dropped), or every routed slot where it gives none.
    Padded(&'a dyn Fn(&[usize]) -> Option<usize>),
}

fn sort_slots(index: &Tensor, experts: usize, layout: Layout) -> Result<MoeRouting> {
    let engine = index.engine();
    if !matches!(index.dtype(), DType::I32 | DType::U32) {
        return Err(Error::dtype(
            "moe: index",
            index.dtype(),
            &[DType::I32, DType::U32],
        ));
    }
    let Some(&k) = index.shape().last() else {
        return Err(Error::shape("moe: index [.., K]", &[1], index.shape()));
    };
    if experts == 0 || experts > MAX_EXPERTS {
        return Err(Error::bounds(
            "moe: experts",
            experts as u64,
            1,
            MAX_EXPERTS as u64,
        ));
    }
    let slots = index.len();
    if slots > i32::MAX as usize {
        return Err(Error::bounds(
            "moe: slots (T·K)",
            slots as u64,
            0,
            i32::MAX as u64,
        ));
    }
    let tiles = slots.div_ceil(TILE).max(1);
    if experts * tiles > u32::MAX as usize {
        return Err(Error::bounds(
            "moe: experts × routing tiles",
            (experts * tiles) as u64,
            1,
            u32::MAX.into(),
        ));
    }
    engine.check_workspace("moe: route", route_workspace_bytes(slots, experts))?;
    let tokens = slots.checked_div(k).unwrap_or(0);
    let inverse = Tensor::empty(engine, &[slots], DType::U32, "moe: inverse")?;
    // `route_offsets` writes every start; without slots nothing runs, so they are zeros.
    let slot_starts = if slots == 0 {
        Tensor::zeros(engine, &[experts + 1], DType::U32)?
    } else {
        Tensor::empty(engine, &[experts + 1], DType::U32, "moe: slot starts")?
    };
    let mut params = Params {
        tokens: tokens as u32,
        k: k as u32,
        experts: experts as u32,
        tiles: tiles as u32,
        width: 0,
        weighted: 0,
        rows: 0,
        capacity: 0,
    };
    let grid = (experts * tiles).div_ceil(WG) as u64;
    let counts = Tensor::empty(engine, &[experts * tiles], DType::U32, "moe: tile counts")?;
    if slots > 0 {
        engine.launch(
            &KERNEL,
            "route_count",
            &vec![],
            &params,
            &[index.buffer(), counts.buffer(), inverse.buffer()],
            grid,
        )?;
        engine.launch(
            &KERNEL,
            "route_offsets",
            &vec![],
            &params,
            &[counts.buffer(), slot_starts.buffer()],
            1,
        )?;
    }
    // The one readback, unless the layout is a given capacity.
    let read = || -> Result<Vec<usize>> {
        if slots == 0 {
            return Ok(vec![0; experts + 1]);
        }
        Ok(slot_starts
            .to_vec::<u32>()?
            .into_iter()
            .map(|s| s as usize)
            .collect())
    };
    let (starts, capacity, padded) = match layout {
        Layout::Exact => (read()?, None, false),
        Layout::Capacity(c) => ((0..=experts).map(|e| e * c).collect(), Some(c), false),
        Layout::Padded(choose) => {
            let read = read()?;
            match choose(&read) {
                Some(c) => ((0..=experts).map(|e| e * c).collect(), Some(c), true),
                None => (read, None, false),
            }
        }
    };
    let rows = capacity.map_or(slots, |c| experts * c);
    params.rows = rows as u32;
    params.capacity = capacity.unwrap_or(0) as u32;
    let perm = Tensor::empty(engine, &[rows], DType::U32, "moe: permutation")?;
    if slots > 0 {
        engine.launch(
            &KERNEL,
            "route_scatter",
            &vec![],
            &params,
            &[
                index.buffer(),
                slot_starts.buffer(),
                perm.buffer(),
                inverse.buffer(),
                counts.buffer(),
            ],
            grid,
        )?;
    }
    if capacity.is_some() {
        engine.launch(
            &KERNEL,
            "pad_rows",
            &vec![],
            &params,
            &[slot_starts.buffer(), perm.buffer()],
            rows.div_ceil(WG) as u64,
        )?;
    }
    Ok(MoeRouting {
        perm,
        inverse,
        slot_starts,
        starts,
        capacity,
        padded,
        tokens,
        k,
    })
}

/// The slots of `index` sorted by expert, laid out in blocks of the largest load (nothing
/// dropped) where [`MoeOptions::pad`]'s conditions hold for the loads read back, else exactly.
fn route_padded(index: &Tensor, x: Extents, recompute: bool) -> Result<MoeRouting> {
    let bound = index.engine().workspace_bound();
    let choose = |starts: &[usize]| {
        let load = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let rows = x.e * load;
        let elements = rows.saturating_mul(x.h.max(2 * x.i));
        let scratch = fused_moe_workspace_bytes(x.t, x.k, x.e, x.h, x.i, Some(load))
            .max(backward_scratch(rows, x.h, x.i, recompute));
        let routed = starts.last().copied().unwrap_or(0);
        (load > 0
            && rows <= PAD_LIMIT * routed
            && rows <= i32::MAX as usize
            && elements <= u32::MAX as usize
            && scratch <= bound)
            .then_some(load)
    };
    sort_slots(index, x.e, Layout::Padded(&choose))
}

/// What [`fused_moe_backward`] needs: the inputs, the routing and, unless recomputing, the F32
/// `[gate ‖ up]` pre-activations `[routed slots, 2I]`.
#[derive(Debug, Clone)]
pub struct MoeSaved {
    x: Tensor,
    gate_up: Tensor,
    down: Tensor,
    weights: Tensor,
    routing: MoeRouting,
    pre: Option<Tensor>,
    options: MoeOptions,
}

impl MoeSaved {
    /// The routing of the forward.
    pub fn routing(&self) -> &MoeRouting {
        &self.routing
    }
}

/// Gradients of [`fused_moe`], all F32, each in its input's shape.
#[derive(Debug, Clone)]
pub struct MoeGradients {
    /// `dx [.., H]`.
    pub x: Tensor,
    /// `d gate_up [E, 2I, H]`.
    pub gate_up: Tensor,
    /// `d down [E, H, I]`.
    pub down: Tensor,
    /// `dw [.., K]` (0 for slots that route nowhere).
    pub weights: Tensor,
}

/// The extents of a call: tokens T, hidden H, intermediate I, experts E, slots a token K.
#[derive(Debug, Clone, Copy)]
struct Extents {
    t: usize,
    h: usize,
    i: usize,
    e: usize,
    k: usize,
}

/// Every input checked; the extents.
fn extents(
    x: &Tensor,
    gate_up: &Tensor,
    down: &Tensor,
    index: &Tensor,
    weights: &Tensor,
) -> Result<Extents> {
    let engine = x.engine();
    for (t, what) in [
        (x, "moe: x"),
        (gate_up, "moe: gate_up"),
        (down, "moe: down"),
        (index, "moe: index"),
        (weights, "moe: weights"),
    ] {
        t.check_engine(engine, what)?;
    }
    for (t, what) in [
        (x, "moe: x"),
        (gate_up, "moe: gate_up"),
        (down, "moe: down"),
        (weights, "moe: weights"),
    ] {
        check_float(t, what)?;
    }
    if !matches!(index.dtype(), DType::I32 | DType::U32) {
        return Err(Error::dtype(
            "moe: index",
            index.dtype(),
            &[DType::I32, DType::U32],
        ));
    }
    let Some((&h, lead)) = x.shape().split_last() else {
        return Err(Error::shape("moe: x (at least 1-D)", &[1], x.shape()));
    };
    let t: usize = lead.iter().product();
    if gate_up.shape().len() != 3
        || gate_up.shape()[2] != h
        || !gate_up.shape()[1].is_multiple_of(2)
    {
        let e = gate_up.shape().first().copied().unwrap_or(1);
        let two_i = gate_up.shape().get(1).copied().unwrap_or(2);
        return Err(Error::shape(
            "moe: gate_up [E, 2I, H]",
            &[e, two_i + two_i % 2, h],
            gate_up.shape(),
        ));
    }
    let (e, i) = (gate_up.shape()[0], gate_up.shape()[1] / 2);
    if e == 0 || e > MAX_EXPERTS {
        return Err(Error::bounds(
            "moe: experts",
            e as u64,
            1,
            MAX_EXPERTS as u64,
        ));
    }
    if h == 0 || i == 0 {
        return Err(Error::bounds(
            "moe: hidden and intermediate widths",
            h.min(i) as u64,
            1,
            u32::MAX.into(),
        ));
    }
    if down.shape() != [e, h, i] {
        return Err(Error::shape(
            "moe: down [E, H, I]",
            &[e, h, i],
            down.shape(),
        ));
    }
    let k = index.shape().last().copied().unwrap_or(0);
    let mut want = lead.to_vec();
    want.push(k);
    if index.shape() != want.as_slice() {
        return Err(Error::shape("moe: index [.., K]", &want, index.shape()));
    }
    if weights.shape() != index.shape() {
        return Err(Error::shape("moe: weights", index.shape(), weights.shape()));
    }
    let widest = (t * k).saturating_mul(h.max(2 * i));
    if widest > u32::MAX as usize {
        return Err(Error::bounds(
            "moe: slots × width",
            widest as u64,
            0,
            u32::MAX.into(),
        ));
    }
    Ok(Extents { t, h, i, e, k })
}

/// Scratch bytes of [`fused_moe`] (beyond the output and the saved pre-activations): the
/// routing's, the sorted x rows (at most F32), the activation and the expert outputs, F32, over
/// the T·K routed rows, or E × capacity rows with [`MoeOptions::capacity`]. The
/// products' split-K scratch comes on top, within the engine's workspace bound.
pub fn fused_moe_workspace_bytes(
    tokens: usize,
    k: usize,
    experts: usize,
    hidden: usize,
    inter: usize,
    capacity: Option<usize>,
) -> u64 {
    // Saturating: a hostile capacity gives a size every bound refuses, not a wrapped one.
    let slots = tokens.saturating_mul(k);
    let rows = capacity.map_or(slots, |c| experts.saturating_mul(c)) as u64;
    let per_row = (2 * hidden as u64).saturating_add(inter as u64);
    route_workspace_bytes(slots, experts)
        .saturating_add(rows.saturating_mul(per_row).saturating_mul(4))
}

/// Scratch bytes of [`fused_moe_backward`] (beyond the gradients) at its peak: the sorted x and
/// dy rows (at most F32), `dhu` and the activation, the slot weight gradients and the packed
/// activation gradient, with the recomputed pre-activations where they were not kept (the
/// sorted dx rows come later, in the memory of those no longer used). The products' split-K
/// scratch comes on top, within the engine's workspace bound.
pub fn fused_moe_backward_workspace_bytes(saved: &MoeSaved) -> u64 {
    backward_scratch(
        saved.routing.rows(),
        saved.x.shape().last().copied().unwrap_or(0),
        saved.down.shape()[2],
        saved.pre.is_none(),
    )
}

/// [`fused_moe_backward_workspace_bytes`] of `rows` sorted rows.
fn backward_scratch(rows: usize, h: usize, i: usize, recompute: bool) -> u64 {
    let recomputed = if recompute { 2 * i } else { 0 };
    4 * rows as u64 * (2 * h + 4 * i + 1 + recomputed) as u64
}

/// An operand or output of the per-expert products: the sorted rows of a `[rows, width]`
/// tensor (expert `e`'s from its first row), or expert `e`'s matrix of `per` elements in a
/// stacked `[E, ..]` tensor; `transposed` as [`GemmOperand::transposed`] (outputs never are).
#[derive(Clone, Copy)]
enum Part<'a> {
    Rows(&'a Tensor, usize, bool),
    Expert(&'a Tensor, usize, bool),
}

impl<'a> Part<'a> {
    /// Expert `e`'s operand, its rows starting at sorted row `first`; consecutive experts
    /// `stride` rows apart (a batched call over a capacity layout).
    fn operand(self, e: usize, first: usize, stride: usize) -> GemmOperand<'a> {
        let (tensor, offset, batch_stride, transposed) = match self {
            Part::Rows(t, width, tr) => (t, first * width, stride * width, tr),
            Part::Expert(t, per, tr) => (t, e * per, per, tr),
        };
        GemmOperand {
            tensor,
            offset,
            transposed,
            batch_stride,
        }
    }
}

/// `out_e = a_e · b_e` for every expert, `extents(rows)` its `(m, n, k)`: one call an expert
/// (every expert when `all`, the weight gradients, whose idle experts' products of k = 0 write
/// zeros; else those with rows), or with a capacity one batched call over the experts. On
/// tensor cores where `tc` and both operands are 16-bit.
fn expert_products(
    routing: &MoeRouting,
    out: Part,
    a: Part,
    b: Part,
    extents: impl Fn(usize) -> (usize, usize, usize),
    all: bool,
    tc: bool,
) -> Result<()> {
    let (Part::Rows(out_tensor, ..) | Part::Expert(out_tensor, ..)) = out;
    let call = |e: usize, first: usize, rows: usize, batch: usize| {
        let stride = routing.capacity.unwrap_or(0);
        let (aa, bb, oo) = (
            a.operand(e, first, stride),
            b.operand(e, first, stride),
            out.operand(e, first, stride),
        );
        let tensor_cores = tc && aa.tensor.dtype() != DType::F32 && bb.tensor.dtype() != DType::F32;
        let (m, n, k) = extents(rows);
        matmul::gemm(&Gemm {
            out_offset: oo.offset,
            out_batch_stride: if batch > 1 { oo.batch_stride } else { m * n },
            batch,
            tensor_cores,
            ..Gemm::plain(aa, bb, out_tensor, (m, n, k), false)
        })
    };
    if let Some(capacity) = routing.capacity {
        return call(0, 0, capacity, routing.experts());
    }
    for (e, w) in routing.starts.windows(2).enumerate() {
        if all || w[1] > w[0] {
            call(e, w[0], w[1] - w[0], 1)?;
        }
    }
    Ok(())
}

/// `src`'s `[T, width]` rows in sorted order, `[routed, width]` in `src`'s dtype (raw bits).
fn gather(src: &Tensor, routing: &MoeRouting, width: usize, what: &str) -> Result<Tensor> {
    let engine = src.engine();
    let rows = routing.rows();
    let out = Tensor::empty(engine, &[rows, width], src.dtype(), what)?;
    let words = src.dtype().buffer_bytes(rows * width).div_ceil(4);
    engine.launch(
        &KERNEL,
        "gather",
        &vec![("DX", f64::from(src.dtype().code()))],
        &routing.params(width, false),
        &[src.buffer(), routing.perm.buffer(), out.buffer()],
        words.div_ceil(WG) as u64,
    )?;
    Ok(out)
}

/// `out[t] = Σ_k (w[t, k]·) rows[inverse[t·K + k]]` of `shape` in `dtype` (16-bit: each F32
/// sum rounded once); callers handle an idle routing, whose output is zeros.
fn combine(
    rows: &Tensor,
    weights: &Tensor,
    routing: &MoeRouting,
    width: usize,
    weighted: bool,
    (shape, dtype): (&[usize], DType),
    what: &str,
) -> Result<Tensor> {
    let engine = rows.engine();
    let out = Tensor::empty(engine, shape, dtype, what)?;
    // An invocation a word: one F32 element, or two 16-bit ones.
    let words = (routing.tokens * width).div_ceil(if dtype == DType::F32 { 1 } else { 2 });
    engine.launch(
        &KERNEL,
        "combine",
        &vec![
            ("DW", f64::from(weights.dtype().code())),
            ("DO", f64::from(dtype.code())),
        ],
        &routing.params(width, weighted),
        &[
            weights.buffer(),
            routing.inverse.buffer(),
            rows.buffer(),
            out.buffer(),
        ],
        words.div_ceil(WG) as u64,
    )?;
    Ok(out)
}

/// The `[gate ‖ up]` pre-activations of the sorted rows `xs`, F32 `[routed, 2I]`.
fn pre_activations(
    xs: &Tensor,
    gate_up: &Tensor,
    routing: &MoeRouting,
    x: Extents,
    tc: bool,
) -> Result<Tensor> {
    let pre = Tensor::empty(
        xs.engine(),
        &[routing.rows(), 2 * x.i],
        DType::F32,
        "moe: pre-activations",
    )?;
    expert_products(
        routing,
        Part::Rows(&pre, 2 * x.i, false),
        Part::Rows(xs, x.h, false),
        Part::Expert(gate_up, 2 * x.i * x.h, true),
        |rows| (rows, 2 * x.i, x.h),
        false,
        tc,
    )?;
    Ok(pre)
}

/// Forward: `y [.., H]` in [`MoeOptions::output`]'s dtype (F32 by default; see the module
/// documentation) and the saved context.
///
/// Errors: non-float x / gate_up / down / weights or output dtype, index not I32/U32; x of
/// rank 0; gate_up not `[E, 2I, H]` with H x's last extent, down not `[E, H, I]`, index not
/// `[.., K]` over x's leading extents, weights not index's shape (`ShapeMismatch`); E outside
/// 1..=[`MAX_EXPERTS`], H or I zero, slots × width past 2³², a capacity of 0 or with
/// E × capacity × width past 2³² (`OutOfBounds`); tensors of other engines; scratch past the
/// workspace bound; the matmul family's bounds.
pub fn fused_moe(
    x: &Tensor,
    gate_up: &Tensor,
    down: &Tensor,
    index: &Tensor,
    weights: &Tensor,
    options: &MoeOptions,
) -> Result<(Tensor, MoeSaved)> {
    let ext = extents(x, gate_up, down, index, weights)?;
    let engine = x.engine();
    options.output.require_float("fused_moe: output")?;
    if let Some(c) = options.capacity {
        let elements = ext.e.saturating_mul(c).saturating_mul(ext.h.max(2 * ext.i));
        if c == 0 || elements > u32::MAX as usize {
            return Err(Error::bounds(
                "moe: capacity (E × capacity rows × width)",
                elements as u64,
                1,
                u32::MAX.into(),
            ));
        }
    }
    engine.check_workspace(
        "fused_moe",
        fused_moe_workspace_bytes(ext.t, ext.k, ext.e, ext.h, ext.i, options.capacity),
    )?;
    let routing = match options.capacity {
        None if options.pad => route_padded(index, ext, options.recompute)?,
        None => route(index, ext.e)?,
        Some(c) => route_with_capacity(index, ext.e, c)?,
    };
    let tc = options.tensor_cores;
    let y_shape = x.shape().to_vec();
    let (y, pre) = if routing.idle() {
        (Tensor::zeros(engine, &y_shape, options.output)?, None)
    } else {
        let xs = gather(x, &routing, ext.h, "moe: sorted x")?;
        let pre = pre_activations(&xs, gate_up, &routing, ext, tc)?;
        let (act, _) =
            activation::packed_forward(options.activation, &pre, &ActivationOptions::default())?;
        let ys = Tensor::empty(
            engine,
            &[routing.rows(), ext.h],
            DType::F32,
            "moe: expert outputs",
        )?;
        expert_products(
            &routing,
            Part::Rows(&ys, ext.h, false),
            Part::Rows(&act, ext.i, false),
            Part::Expert(down, ext.h * ext.i, true),
            |rows| (rows, ext.h, ext.i),
            false,
            tc,
        )?;
        let y = combine(
            &ys,
            weights,
            &routing,
            ext.h,
            true,
            (&y_shape, options.output),
            "moe: y",
        )?;
        (y, Some(pre))
    };
    let saved = MoeSaved {
        x: x.clone(),
        gate_up: gate_up.clone(),
        down: down.clone(),
        weights: weights.clone(),
        routing,
        pre: if options.recompute { None } else { pre },
        options: *options,
    };
    Ok((y, saved))
}

/// Backward: every gradient of [`fused_moe`] from `dy [.., H]` (any float dtype).
///
/// Errors: `dy` not the output's shape (`ShapeMismatch`), not a float dtype, or of another
/// engine; scratch past the workspace bound ([`fused_moe_backward_workspace_bytes`]).
pub fn fused_moe_backward(saved: &MoeSaved, dy: &Tensor) -> Result<MoeGradients> {
    backward_in(saved, dy, DType::F32, "fused_moe_backward")
}

/// [`fused_moe_backward`] with every gradient in `dtype` (F32, F16 or BF16): bit for bit the
/// F32 gradients cast ([`crate::cast::cast`]). dx is rounded by the combine; d down (for an even
/// I) and d gate_up (for an even H) by the weight products' epilogues, so no F32 copy of those
/// is allocated; d weights and the odd widths' gradients are computed in F32 and cast.
///
/// Errors: those of [`fused_moe_backward`]; a `dtype` that is not a float (`UnsupportedDType`).
pub fn fused_moe_backward_as(saved: &MoeSaved, dy: &Tensor, dtype: DType) -> Result<MoeGradients> {
    dtype.require_float("fused_moe_backward_as: dtype")?;
    backward_in(saved, dy, dtype, "fused_moe_backward_as")
}

fn backward_in(saved: &MoeSaved, dy: &Tensor, dtype: DType, what: &str) -> Result<MoeGradients> {
    let x = &saved.x;
    let engine = x.engine();
    let dy_what = format!("{what}: dy");
    dy.check_engine(engine, &dy_what)?;
    check_float(dy, &dy_what)?;
    if dy.shape() != x.shape() {
        return Err(Error::shape(dy_what, x.shape(), dy.shape()));
    }
    let (h, e, i) = (
        x.shape().last().copied().unwrap_or(0),
        saved.gate_up.shape()[0],
        saved.down.shape()[2],
    );
    let routing = &saved.routing;
    let ext = Extents {
        t: routing.tokens,
        h,
        i,
        e,
        k: routing.k,
    };
    engine.check_workspace(what, fused_moe_backward_workspace_bytes(saved))?;
    if routing.idle() {
        return Ok(MoeGradients {
            x: Tensor::zeros(engine, x.shape(), dtype)?,
            gate_up: Tensor::zeros(engine, saved.gate_up.shape(), dtype)?,
            down: Tensor::zeros(engine, saved.down.shape(), dtype)?,
            weights: Tensor::zeros(engine, saved.weights.shape(), dtype)?,
        });
    }
    // The weight products write a 16-bit gradient themselves where its rows are whole words.
    let direct = |n: usize| {
        if n.is_multiple_of(2) {
            dtype
        } else {
            DType::F32
        }
    };
    let tc = saved.options.tensor_cores;
    let rows_all = routing.rows();
    let d_weights = Tensor::empty(engine, saved.weights.shape(), DType::F32, "moe: d weights")?;
    let xs = gather(x, routing, h, "moe: sorted x")?;
    let dys = gather(dy, routing, h, "moe: sorted dy")?;
    let pre = match &saved.pre {
        Some(p) => p.clone(),
        None => pre_activations(&xs, &saved.gate_up, routing, ext, tc)?,
    };
    // dhu = dy·down_e  [routed, I]
    let dhu = Tensor::empty(engine, &[rows_all, i], DType::F32, "moe: dhu")?;
    expert_products(
        routing,
        Part::Rows(&dhu, i, false),
        Part::Rows(&dys, h, false),
        Part::Expert(&saved.down, h * i, false),
        |rows| (rows, i, h),
        false,
        tc,
    )?;
    // The activation again; then per sorted row dw = ⟨dhu, h⟩, dhu ← w·dhu, h ← w·h.
    let (act, act_saved) = activation::packed_forward(
        saved.options.activation,
        &pre,
        &ActivationOptions::default(),
    )?;
    let d_slot = Tensor::empty(engine, &[rows_all], DType::F32, "moe: slot d weights")?;
    let w = &saved.weights;
    engine.launch(
        &KERNEL,
        "slot_backward",
        &vec![("DW", f64::from(w.dtype().code()))],
        &routing.params(i, true),
        &[
            w.buffer(),
            routing.perm.buffer(),
            act.buffer(),
            dhu.buffer(),
            d_slot.buffer(),
        ],
        rows_all as u64,
    )?;
    let d_pre = activation::backward(&act_saved, &dhu)?.dgate;
    // Each scratch tensor is dropped after its last use, so the next ones reuse its memory.
    drop((dhu, act_saved, pre));
    let d_down = Tensor::empty(engine, saved.down.shape(), direct(i), "moe: d down")?;
    let d_gate_up = Tensor::empty(engine, saved.gate_up.shape(), direct(h), "moe: d gate_up")?;
    // d down_e = dysᵀ·(w·h)  [H, I]
    expert_products(
        routing,
        Part::Expert(&d_down, h * i, false),
        Part::Rows(&dys, h, true),
        Part::Rows(&act, i, false),
        |rows| (h, i, rows),
        true,
        tc,
    )?;
    drop((dys, act));
    // d gate_up_e = d_preᵀ·xs  [2I, H]
    expert_products(
        routing,
        Part::Expert(&d_gate_up, 2 * i * h, false),
        Part::Rows(&d_pre, 2 * i, true),
        Part::Rows(&xs, h, false),
        |rows| (2 * i, h, rows),
        true,
        tc,
    )?;
    drop(xs);
    let dxs = Tensor::empty(engine, &[rows_all, h], DType::F32, "moe: sorted dx")?;
    // sorted dx = d_pre·gate_up_e  [rows, H]
    expert_products(
        routing,
        Part::Rows(&dxs, h, false),
        Part::Rows(&d_pre, 2 * i, false),
        Part::Expert(&saved.gate_up, 2 * i * h, false),
        |rows| (rows, h, 2 * i),
        false,
        tc,
    )?;
    let dx = combine(&dxs, w, routing, h, false, (x.shape(), dtype), "moe: dx")?;
    engine.launch(
        &KERNEL,
        "token_values",
        &vec![],
        &routing.params(1, false),
        &[
            routing.inverse.buffer(),
            d_weights.buffer(),
            d_slot.buffer(),
        ],
        (ext.t * ext.k).div_ceil(WG) as u64,
    )?;
    Ok(MoeGradients {
        x: dx,
        gate_up: crate::cast::cast(&d_gate_up, dtype)?,
        down: crate::cast::cast(&d_down, dtype)?,
        weights: crate::cast::cast(&d_weights, dtype)?,
    })
}
