//! Rotary position embeddings (RoPE), forward and backward.
//!
//! The rotation of frequency pair `i < half = rotary_dim/2` of a value row is
//! `(x1, x2) → (x1·cos − x2·sin, x2·cos + x1·sin)`, pairs being `(i, i + half)` (split halves,
//! the HF `rotate_half` convention, `interleaved = false`) or `(2i, 2i + 1)` (adjacent,
//! `interleaved = true`). Columns `rotary_dim..dim` are copied unchanged (partial rotary) and
//! their gradient passes through. The backward applies the **transpose** of the supplied
//! rotation, so coefficients need not have unit norm, and can return the table gradients
//! `∂/∂cos = g1·x1 + g2·x2`, `∂/∂sin = g2·x1 − g1·x2`.
//!
//! Entry points:
//! * [`forward`]/[`backward`]: `values[rows, dim]` with per-row tables `[rows, rotary_dim/2]`.
//! * [`qk_forward`]/[`qk_backward`]: q and k (different head counts) in one call, layouts
//!   `[batch, seq, heads, dim]` or `[batch, heads, seq, dim]`, shared tables
//!   `[table_rows, rotary_dim/2]` indexed by the sequence index, or gathered by integer
//!   position ids (`[batch, seq]` or `[seq]`, I32 or U32). Table gradients are summed over
//!   every row that uses a table row in a fixed order (tokens in batch-major order, for each
//!   its q heads then its k heads), with no atomics. Without position ids one invocation per
//!   table entry sums its batch. With position ids a first launch computes every token's
//!   contribution to each frequency once (reading q, dq, k, dk once, into a scratch of
//!   `8·rotary_dim/2` bytes per token, [`backward_workspace_bytes`]) and a second gives one
//!   workgroup to each block of table rows, which reads every id once and adds the
//!   contributions of the tokens it owns in token order: the same sums, bit for bit, as the
//!   path without ids. Its id reads grow with `table_rows × batch·seq / rows per block`
//!   (4–128 rows a block, depending on `rotary_dim`), so very long unused tables still cost
//!   something. [`RopeQkOptions::mrope_section`] selects Qwen2-VL's multi-axis mRoPE
//!   (position ids `[3, batch, seq]` or `[3, seq]`).
//! * [`llama4_forward`]/[`llama4_backward`]: Llama 4's complex tables `freqs_cis[rows,
//!   rotary_dim/2, 2]` (real, imaginary) on adjacent pairs; its gradient has the same layout.
//! * [`tables`]: host-built cos/sin tables (standard, linear, NTK-aware, YaRN).
//!
//! Tables hold `rotary_dim/2` frequencies per row. HF's `cos`/`sin` of width `rotary_dim`
//! (the same frequencies twice, for `rotate_half`) map onto them by taking their first half.
//! Already gathered per-token tables (HF's `cos[B, S, ..]`, Qwen2-VL's `cos[3, B, S, ..]`)
//! are used as one table of `B·S` (mRoPE: `3·B·S`) rows with position ids `b·S + s`
//! (mRoPE: `a·B·S + b·S + s` on axis `a`).
//!
//! Storage F32/F16/BF16 for values, tables and cotangents (independently); output in the
//! values' dtype; FP32 math; gradients F32.
//!
//! Kernels: values (forward) and cotangents (backward) whose row width and rotary units are
//! whole steps — 4 F32 elements, 8 16-bit values of a forward, 4 16-bit cotangents of a
//! backward (split-half: `rotary_dim/2`, interleaved: `rotary_dim` a multiple of the step;
//! plain tables; mRoPE sections on multiples of the step) — run step kernels: 16-byte stores
//! and 16-byte loads (8-byte for 16-bit cotangents), every warp access contiguous, q and k in
//! one launch, each invocation rotating one unit of up to 4 heads of a token with coefficients
//! loaded once (see `step_shape`). Other shapes run unit, token or per-element kernels
//! (one launch per tensor). Every kernel computes an element with the same operations and
//! roundings, so they agree bit for bit.
//!
//! Position ids: with [`RopeQkOptions::check_positions`] (the default) the call reads the ids
//! back to check their range, which **synchronizes** (submits the pending work and waits);
//! an id outside `0..table_rows` is then `Error::OutOfBounds`. Without the check nothing
//! synchronizes and an out-of-range id rotates with coefficients (0, 0) and contributes to
//! no table gradient.

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, Kernel};
use crate::{DType, Engine, Error, Result, Tensor};

/// `wgsl/rope.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "rope",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        include_str!("../wgsl/rope.wgsl"),
    ],
};

const WG: u64 = 256;

/// Memory layout of multi-head values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeLayout {
    /// `[batch, seq, heads, dim]` (HF before the transpose).
    #[default]
    Bshd,
    /// `[batch, heads, seq, dim]` (HF attention layout).
    Bhsd,
}

/// Options of [`forward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RopeOptions {
    /// Rotated leading columns (even, ≤ dim); default (`None`): the whole row.
    pub rotary_dim: Option<usize>,
    /// Adjacent pairs instead of split halves. Default false.
    pub interleaved: bool,
    /// Whether the backward also returns the table gradients. Default false.
    pub table_grads: bool,
}

/// Options of [`qk_forward`] and [`llama4_forward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeQkOptions {
    /// Rotated leading columns (even, ≤ head dim); default: the whole head.
    pub rotary_dim: Option<usize>,
    /// Adjacent pairs instead of split halves. Default false (Llama 4: always adjacent).
    pub interleaved: bool,
    /// Value layout. Default [`RopeLayout::Bshd`].
    pub layout: RopeLayout,
    /// Whether the backward also returns the table gradients. Default false.
    pub table_grads: bool,
    /// Read the position ids back to check their range (synchronizes). Default true.
    pub check_positions: bool,
    /// Qwen2-VL mRoPE: frequencies `[0, s0)` use position axis 0 (time), `[s0, s0+s1)` axis 1
    /// (height), the rest axis 2 (width); the sections must sum to `rotary_dim/2` and position
    /// ids are `[3, batch, seq]` or `[3, seq]`. Default `None`.
    pub mrope_section: Option<[usize; 3]>,
}

impl Default for RopeQkOptions {
    fn default() -> Self {
        RopeQkOptions {
            rotary_dim: None,
            interleaved: false,
            layout: RopeLayout::Bshd,
            table_grads: false,
            check_positions: true,
            mrope_section: None,
        }
    }
}

#[derive(encase::ShaderType, Clone, Copy, Debug)]
struct Params {
    count: u32,
    pairs: u32,
    dim: u32,
    rot: u32,
    half: u32,
    heads: u32,
    heads_k: u32,
    seq: u32,
    batch: u32,
    table_rows: u32,
    pos_batched: u32,
    pos_axis_stride: u32,
    sec0: u32,
    sec1: u32,
    token0: u32,
    tokens: u32,
    accumulate: u32,
}

/// Everything a launch needs besides buffers.
#[derive(Debug, Clone)]
struct Plan {
    dim: usize,
    rot: usize,
    batch: usize,
    seq: usize,
    heads_q: usize,
    heads_k: usize,
    table_rows: usize,
    interleaved: bool,
    layout: RopeLayout,
    complex: bool,
    positions: Option<Tensor>,
    pos_batched: bool,
    pos_axis_stride: usize,
    sections: (usize, usize),
}

impl Plan {
    fn half(&self) -> usize {
        self.rot / 2
    }

    /// Which value kernel runs for `count` elements with `heads` heads: (entry point, work
    /// items, workgroups). Unit kernels need an even row width (rows start on word boundaries)
    /// and `rotary_dim` a multiple of 4 (units of two pairs are whole words); the token
    /// variant (one workgroup per token) also needs the units per row to divide the workgroup
    /// and the token's heads to fill at least half of it. Otherwise the per-element kernels
    /// run.
    fn value_kernel(
        &self,
        count: usize,
        heads: usize,
        forward: bool,
    ) -> (&'static str, usize, u64) {
        let per_element = if forward {
            "forward"
        } else {
            "backward_values"
        };
        if self.dim == 0 || !self.dim.is_multiple_of(2) || !self.rot.is_multiple_of(4) {
            let pairs = count.div_ceil(2);
            return (per_element, pairs, groups(pairs));
        }
        let per_row = self.rot / 4 + (self.dim - self.rot) / 2;
        let wg = WG as usize;
        if per_row > 0 && wg.is_multiple_of(per_row) && 2 * heads * per_row >= wg {
            let tokens = self.batch * self.seq;
            let entry = if forward {
                "forward_tokens"
            } else {
                "backward_tokens"
            };
            return (entry, tokens, tokens as u64);
        }
        let units = count / self.dim * per_row;
        let entry = if forward {
            "forward_units"
        } else {
            "backward_units"
        };
        (entry, units, groups(units))
    }

    /// Heads per invocation of the step kernels (`forward_steps`, `backward_steps`: q and k
    /// in one launch) for steps of `step` elements (`step_shape`), or `None` where they do not
    /// apply. They need plain tables (not Llama 4's), a row width
    /// that is a multiple of the step, rotary units of whole steps (split-half:
    /// `rotary_dim/2`, interleaved: `rotary_dim` a multiple of the step) and mRoPE sections on
    /// multiples of the step, so that every access is aligned and a unit uses one position.
    /// The heads per invocation (4, 2 or 1, at most `most`) divide both head counts.
    fn step_heads(&self, step: usize, most: usize) -> Option<usize> {
        let sections_ok = |s: usize| s == u32::MAX as usize || s.is_multiple_of(step);
        let rotary = if self.interleaved {
            self.rot
        } else {
            self.half()
        };
        if self.complex
            || self.dim == 0
            || !self.dim.is_multiple_of(step)
            || !rotary.is_multiple_of(step)
            || !self.rot.is_multiple_of(4)
            || !sections_ok(self.sections.0)
            || !sections_ok(self.sections.1)
        {
            return None;
        }
        [4, 2, 1]
            .into_iter()
            .filter(|g| *g <= most)
            .find(|g| self.heads_q.is_multiple_of(*g) && self.heads_k.is_multiple_of(*g))
    }

    fn params(&self, heads: usize, heads_k: usize, count: usize, pairs: usize) -> Params {
        Params {
            count: count as u32,
            pairs: pairs as u32,
            dim: self.dim as u32,
            rot: self.rot as u32,
            half: self.half() as u32,
            heads: heads as u32,
            heads_k: heads_k as u32,
            seq: self.seq as u32,
            batch: self.batch as u32,
            table_rows: self.table_rows as u32,
            pos_batched: u32::from(self.pos_batched),
            pos_axis_stride: self.pos_axis_stride as u32,
            sec0: self.sections.0 as u32,
            sec1: self.sections.1 as u32,
            token0: 0,
            tokens: 0,
            accumulate: 0,
        }
    }

    fn constants(&self, dt_v: DType, dt_t: DType, dt_y: DType) -> crate::kernel::Constants {
        vec![
            ("DT_V", f64::from(dt_v.code())),
            ("DT_T", f64::from(dt_t.code())),
            ("DT_Y", f64::from(dt_y.code())),
            ("INTERLEAVED", f64::from(u8::from(self.interleaved))),
            (
                "LAYOUT",
                match self.layout {
                    RopeLayout::Bshd => 0.0,
                    RopeLayout::Bhsd => 1.0,
                },
            ),
            ("POSITIONS", f64::from(u8::from(self.positions.is_some()))),
            ("COMPLEX", f64::from(u8::from(self.complex))),
        ]
    }
}

/// What a forward saves: the input handles (tensors are immutable) and the plan.
#[derive(Debug, Clone)]
pub struct RopeSaved {
    plan: Plan,
    q: Tensor,
    k: Option<Tensor>,
    cos: Tensor,
    sin: Tensor,
    table_grads: bool,
}

/// Gradients of [`backward`], all F32 (`dvalues`: the dtype asked of [`backward_as`]).
#[derive(Debug, Clone)]
pub struct RopeGrads {
    /// Gradient of the values (suffix columns: the cotangent itself).
    pub dvalues: Tensor,
    /// Gradient of the cosine table, when `table_grads` was set.
    pub dcos: Option<Tensor>,
    /// Gradient of the sine table, when `table_grads` was set.
    pub dsin: Option<Tensor>,
}

/// Gradients of [`qk_backward`], all F32 (`dq`, `dk`: the dtype asked of [`qk_backward_as`]).
#[derive(Debug, Clone)]
pub struct RopeQkGrads {
    /// Gradient of q.
    pub dq: Tensor,
    /// Gradient of k.
    pub dk: Tensor,
    /// Gradient of the cosine table (`table_grads`), summed over every row using each entry.
    pub dcos: Option<Tensor>,
    /// Gradient of the sine table (`table_grads`).
    pub dsin: Option<Tensor>,
}

/// Gradients of [`llama4_backward`], all F32.
#[derive(Debug, Clone)]
pub struct Llama4Grads {
    /// Gradient of q.
    pub dq: Tensor,
    /// Gradient of k.
    pub dk: Tensor,
    /// Gradient of `freqs_cis` in its `[rows, half, 2]` layout: (∂/∂real, ∂/∂imaginary).
    pub dfreqs: Option<Tensor>,
}

fn float(t: &Tensor, what: &str) -> Result<()> {
    t.dtype().require_float(what)
}

fn rotary_dim(opt: Option<usize>, dim: usize) -> Result<usize> {
    let rot = opt.unwrap_or(dim);
    if rot > dim {
        return Err(Error::bounds("rope: rotary_dim", rot as u64, 0, dim as u64));
    }
    if !rot.is_multiple_of(2) {
        return Err(Error::InvalidValue {
            what: "rope: rotary_dim".into(),
            got: rot as f64,
            rule: "must be even".into(),
        });
    }
    Ok(rot)
}

fn fits_u32(what: &str, n: usize) -> Result<()> {
    let max = u64::from(u32::MAX / 2);
    if n as u64 > max {
        return Err(Error::bounds(what, n as u64, 0, max));
    }
    Ok(())
}

fn check_table(
    t: &Tensor,
    what: &str,
    min_rows: usize,
    half: usize,
    engine: &Engine,
) -> Result<usize> {
    float(t, what)?;
    t.check_engine(engine, what)?;
    let shape = t.shape();
    if shape.len() != 2 || shape[1] != half {
        return Err(Error::shape(what, &[min_rows, half], shape));
    }
    if shape[0] < min_rows {
        return Err(Error::bounds(
            format!("{what}: rows"),
            shape[0] as u64,
            min_rows as u64,
            u64::from(u32::MAX),
        ));
    }
    fits_u32(what, t.len())?;
    Ok(shape[0])
}

/// The step kernels' cut for tensors of `dtype` read by a forward or a backward: F32 steps of
/// 4 (16 bytes read and written), up to 4 heads with overlapped loads; a 16-bit forward reads
/// and writes 8 values (16 bytes each way), up to 4 heads one after the other; a 16-bit
/// backward reads 4 (8 bytes) and writes their 4 F32 gradients (16 bytes), up to 2 heads with
/// overlapped loads. The 16-bit kernels run faster with less live state per lane (measured on
/// an H200, `notes/h200/2026-11-30-rope16/`).
fn step_shape(dtype: DType, forward: bool) -> StepShape {
    match (dtype, forward) {
        (DType::F32, _) => StepShape {
            span: 4,
            heads: 4,
            overlap: true,
        },
        (_, true) => StepShape {
            span: 8,
            heads: 4,
            overlap: false,
        },
        (_, false) => StepShape {
            span: 4,
            heads: 2,
            overlap: true,
        },
    }
}

/// How the step kernels cut the work: elements per step, the most heads per invocation, and
/// whether an invocation issues every head's loads before any arithmetic (otherwise head
/// after head).
struct StepShape {
    span: usize,
    heads: usize,
    overlap: bool,
}

fn groups(n: usize) -> u64 {
    (n as u64).div_ceil(WG)
}

/// Forward (`forward`, outputs in the values' dtype) or values backward (outputs in `grads`:
/// F32, or for a 16-bit cotangent 16-bit, the F32 values rounded once) of q and, when given,
/// k (of q's dtype) in one launch of a step kernel. `None` when the inputs or the plan do not
/// allow the step kernels.
fn run_steps(
    plan: &Plan,
    forward: bool,
    q: &Tensor,
    k: Option<&Tensor>,
    (cos, sin): (&Tensor, &Tensor),
    grads: DType,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    // q and k share one step shape (`step_shape`).
    if !q.dtype().is_float() || k.is_some_and(|k| k.dtype() != q.dtype()) {
        return Ok(None);
    }
    // 16-bit gradients: the 16-bit forward's steps (8 values, 16 bytes each way).
    let narrow = !forward && grads != DType::F32;
    if narrow && q.dtype() == DType::F32 {
        return Ok(None);
    }
    let shape = step_shape(q.dtype(), forward || narrow);
    let step = shape.span;
    let Some(per_lane) = plan.step_heads(step, shape.heads) else {
        return Ok(None);
    };
    // Every step reads one whole 16-byte word (a 16-bit backward step half of one): the
    // buffers hold whole words (pool buffers always do, but one clamped to the binding limit).
    let unfit = |t: &Tensor| t.buffer().size() < 16 || !t.buffer().size().is_multiple_of(16);
    if unfit(q) || k.is_some_and(unfit) {
        return Ok(None);
    }
    let engine = q.engine();
    let out_dtype = if forward { q.dtype() } else { grads };
    let label = if forward {
        "rope output"
    } else {
        "rope dvalues"
    };
    let qo = Tensor::empty(engine, q.shape(), out_dtype, label)?;
    let ko = match k {
        Some(k) => Some(Tensor::empty(engine, k.shape(), out_dtype, label)?),
        None => None,
    };
    // Without k the k side has no invocations; its output binding gets a placeholder.
    let k_out = match &ko {
        Some(t) => t.clone(),
        None => Tensor::empty(engine, &[4], DType::F32, "rope unused")?,
    };
    let rotary_units = if plan.interleaved {
        plan.rot / step
    } else {
        plan.half() / step
    };
    let units = rotary_units + (plan.dim - plan.rot) / step;
    let lanes = |heads: usize| plan.batch * plan.seq * (heads / per_lane) * units;
    let heads_k = if k.is_some() { plan.heads_k } else { 0 };
    let work = lanes(plan.heads_q) + lanes(heads_k);
    let mut constants = if forward {
        plan.constants(q.dtype(), cos.dtype(), q.dtype())
    } else {
        plan.constants(DType::F32, cos.dtype(), q.dtype())
    };
    constants.push(("HEADS", per_lane as f64));
    constants.push(("SPAN", step as f64));
    constants.push(("OVERLAP", f64::from(u8::from(shape.overlap))));
    constants.push(("DT_G", f64::from(out_dtype.code())));
    let entry = if forward {
        "forward_steps"
    } else {
        "backward_steps"
    };
    let pos = plan.positions.as_ref().unwrap_or(q);
    engine.launch(
        &KERNEL,
        entry,
        &constants,
        &plan.params(plan.heads_q, heads_k, q.len(), work),
        &[
            pos.buffer(),
            cos.buffer(),
            sin.buffer(),
            q.buffer(),
            k.unwrap_or(q).buffer(),
            qo.buffer(),
            k_out.buffer(),
        ],
        groups(work),
    )?;
    Ok(Some((qo, ko)))
}

fn run_forward(
    plan: &Plan,
    values: &Tensor,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let engine = values.engine();
    let out = Tensor::empty(engine, values.shape(), values.dtype(), "rope output")?;
    let count = values.len();
    let pos = plan.positions.as_ref().unwrap_or(values);
    let (entry, work, launch_groups) = plan.value_kernel(count, heads, true);
    engine.launch(
        &KERNEL,
        entry,
        &plan.constants(values.dtype(), cos.dtype(), values.dtype()),
        &plan.params(heads, 0, count, work),
        &[
            values.buffer(),
            pos.buffer(),
            cos.buffer(),
            sin.buffer(),
            out.buffer(),
        ],
        launch_groups,
    )?;
    Ok(out)
}

fn run_backward_values(
    plan: &Plan,
    dy: &Tensor,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let engine = dy.engine();
    let out = Tensor::empty(engine, dy.shape(), DType::F32, "rope dvalues")?;
    let count = dy.len();
    let pos = plan.positions.as_ref().unwrap_or(dy);
    let (entry, work, launch_groups) = plan.value_kernel(count, heads, false);
    engine.launch(
        &KERNEL,
        entry,
        &plan.constants(DType::F32, cos.dtype(), dy.dtype()),
        &plan.params(heads, 0, count, work),
        &[
            dy.buffer(),
            pos.buffer(),
            cos.buffer(),
            sin.buffer(),
            out.buffer(),
        ],
        launch_groups,
    )?;
    Ok(out)
}

/// Scratch bytes per token of the table gradients with position ids: one (∂cos, ∂sin) F32
/// pair per frequency.
fn table_scratch_per_token(half: usize) -> u64 {
    half as u64 * 8
}

/// Tokens per chunk of the table gradients with position ids: all of them when their scratch
/// fits the workspace bound and one binding, else as many as fit (at least one).
fn table_chunk_tokens(engine: &Engine, tokens: usize, half: usize) -> usize {
    let per_token = table_scratch_per_token(half).max(1);
    let cap = engine.workspace_bound().min(engine.max_binding_bytes());
    tokens.min((cap / per_token).max(1) as usize).max(1)
}

/// Scratch bytes the backward of a forward saved as `saved` allocates beyond its outputs:
/// with `table_grads` and position ids, `8·rotary_dim/2` bytes per token (`batch·seq`) of
/// per-token table-gradient contributions; otherwise nothing. Under a smaller workspace bound
/// the tokens are taken in chunks, one after the other (same results bit for bit); only a
/// bound below one token's `8·rotary_dim/2` bytes fails (`Error::WorkspaceExceeded`).
pub fn backward_workspace_bytes(saved: &RopeSaved) -> u64 {
    let plan = &saved.plan;
    if !saved.table_grads || plan.positions.is_none() || plan.half() == 0 {
        return 0;
    }
    (plan.batch * plan.seq) as u64 * table_scratch_per_token(plan.half())
}

/// Table rows per workgroup of `table_grad_rows` and frequency blocks (as the kernel's
/// `tg_block_rows`, `tg_ib`).
fn table_row_blocks(plan: &Plan) -> (usize, usize) {
    let half = plan.half();
    let ib = half.min(WG as usize);
    let groups = (WG as usize / ib).min(32);
    (4 * groups, half.div_ceil(ib))
}

/// Table gradients with position ids (`table_grad_tokens` then `table_grad_rows`, per chunk
/// of tokens); outputs as [`run_table_grads`].
fn run_table_grads_positions(
    plan: &Plan,
    q: &Tensor,
    dq: &Tensor,
    k: (&Tensor, &Tensor, usize),
    outs: (&Tensor, Option<&Tensor>),
) -> Result<()> {
    let engine = q.engine();
    let (kv, kg, hk) = k;
    let pos = plan.positions.as_ref().unwrap_or(q);
    let half = plan.half();
    let tokens = plan.batch * plan.seq;
    let chunk = table_chunk_tokens(engine, tokens, half);
    let what = "rope backward (table gradients)";
    engine.check_workspace(what, chunk as u64 * table_scratch_per_token(half))?;
    let scratch = Tensor::empty(
        engine,
        &[chunk * half * 2],
        DType::F32,
        "rope table scratch",
    )?;
    let constants = plan.constants(q.dtype(), DType::F32, dq.dtype());
    let (rows_per_block, freq_blocks) = table_row_blocks(plan);
    let row_groups = (plan.table_rows.div_ceil(rows_per_block) * freq_blocks) as u64;
    let mut token0 = 0;
    loop {
        let n = chunk.min(tokens - token0);
        let mut params = plan.params(plan.heads_q, hk, 0, n * half);
        params.token0 = token0 as u32;
        params.tokens = n as u32;
        params.accumulate = u32::from(token0 > 0);
        engine.launch(
            &KERNEL,
            "table_grad_tokens",
            &constants,
            &params,
            &[
                q.buffer(),
                dq.buffer(),
                kv.buffer(),
                kg.buffer(),
                scratch.buffer(),
            ],
            groups(n * half),
        )?;
        let (entry, mut buffers) = match outs.1 {
            Some(dsin) => (
                "table_grad_rows",
                vec![pos.buffer(), outs.0.buffer(), dsin.buffer()],
            ),
            None => (
                "table_grad_rows_complex",
                vec![pos.buffer(), outs.0.buffer()],
            ),
        };
        buffers.push(scratch.buffer());
        engine.launch(&KERNEL, entry, &constants, &params, &buffers, row_groups)?;
        token0 += n;
        if token0 >= tokens {
            return Ok(());
        }
    }
}

/// Table gradients: (dcos, dsin) `[table_rows, half]`, or for complex tables one
/// `[table_rows, half, 2]` tensor (returned as the first, the second `None`).
fn run_table_grads(
    plan: &Plan,
    q: &Tensor,
    dq: &Tensor,
    k: Option<(&Tensor, &Tensor)>,
) -> Result<(Tensor, Option<Tensor>)> {
    let engine = q.engine();
    let entries = plan.table_rows * plan.half();
    let (kv, kg, hk) = match k {
        Some((kv, kg)) => (kv, kg, plan.heads_k),
        None => (q, dq, 0),
    };
    let params = plan.params(plan.heads_q, hk, 0, entries);
    let constants = plan.constants(q.dtype(), DType::F32, dq.dtype());
    let by_positions = plan.positions.is_some() && entries > 0;
    if plan.complex {
        let d = Tensor::empty(
            engine,
            &[plan.table_rows, plan.half(), 2],
            DType::F32,
            "rope dfreqs",
        )?;
        if by_positions {
            run_table_grads_positions(plan, q, dq, (kv, kg, hk), (&d, None))?;
            return Ok((d, None));
        }
        engine.launch(
            &KERNEL,
            "table_grad_complex",
            &constants,
            &params,
            &[
                q.buffer(),
                dq.buffer(),
                kv.buffer(),
                kg.buffer(),
                d.buffer(),
            ],
            groups(entries),
        )?;
        return Ok((d, None));
    }
    let dcos = Tensor::empty(
        engine,
        &[plan.table_rows, plan.half()],
        DType::F32,
        "rope dcos",
    )?;
    let dsin = Tensor::empty(
        engine,
        &[plan.table_rows, plan.half()],
        DType::F32,
        "rope dsin",
    )?;
    if by_positions {
        run_table_grads_positions(plan, q, dq, (kv, kg, hk), (&dcos, Some(&dsin)))?;
        return Ok((dcos, Some(dsin)));
    }
    engine.launch(
        &KERNEL,
        "table_grad",
        &constants,
        &params,
        &[
            q.buffer(),
            dq.buffer(),
            kv.buffer(),
            kg.buffer(),
            dcos.buffer(),
            dsin.buffer(),
        ],
        groups(entries),
    )?;
    Ok((dcos, Some(dsin)))
}

/// Standard RoPE on `values[rows, dim]` with per-row tables `cos`, `sin` `[rows,
/// rotary_dim/2]` (more table rows than value rows are allowed; the first `rows` are used).
/// Output: `values`' shape and dtype.
///
/// Errors: `values` not 2-D or tables not `[≥rows, rotary_dim/2]` (`ShapeMismatch`); a table
/// with fewer rows than values (`OutOfBounds`); an odd `rotary_dim` (`InvalidValue`) or one
/// above `dim` (`OutOfBounds`); non-float dtypes; cos and sin of different dtypes; another
/// engine; more than 2³¹−1 elements.
pub fn forward(
    values: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    options: &RopeOptions,
) -> Result<(Tensor, RopeSaved)> {
    float(values, "rope: values")?;
    let engine = values.engine();
    let &[rows, dim] = values.shape() else {
        return Err(Error::shape(
            "rope: values (2-D)",
            &[values.len(), 1],
            values.shape(),
        ));
    };
    let rot = rotary_dim(options.rotary_dim, dim)?;
    fits_u32("rope: values", values.len())?;
    let table_rows = check_table(cos, "rope: cos", rows, rot / 2, engine)?;
    check_table(sin, "rope: sin", rows, rot / 2, engine)?;
    if sin.shape() != cos.shape() {
        return Err(Error::shape("rope: sin", cos.shape(), sin.shape()));
    }
    if sin.dtype() != cos.dtype() {
        return Err(Error::dtype(
            "rope: sin (the dtype of cos)",
            sin.dtype(),
            &[cos.dtype()],
        ));
    }
    let plan = Plan {
        dim,
        rot,
        batch: 1,
        seq: rows,
        heads_q: 1,
        heads_k: 0,
        table_rows,
        interleaved: options.interleaved,
        layout: RopeLayout::Bshd,
        complex: false,
        positions: None,
        pos_batched: false,
        pos_axis_stride: 0,
        sections: (u32::MAX as usize, u32::MAX as usize),
    };
    let out = match run_steps(&plan, true, values, None, (cos, sin), DType::F32)? {
        Some((out, _)) => out,
        None => run_forward(&plan, values, 1, cos, sin)?,
    };
    Ok((
        out,
        RopeSaved {
            plan,
            q: values.clone(),
            k: None,
            cos: cos.clone(),
            sin: sin.clone(),
            table_grads: options.table_grads,
        },
    ))
}

fn check_cotangent(dy: &Tensor, like: &Tensor, what: &str) -> Result<()> {
    float(dy, what)?;
    dy.check_engine(like.engine(), what)?;
    if dy.shape() != like.shape() {
        return Err(Error::shape(what, like.shape(), dy.shape()));
    }
    Ok(())
}

/// Backward of [`forward`]: `dy` has the values' shape (any float dtype). Returns F32
/// `dvalues` and, with `table_grads`, per-row `dcos`, `dsin` of the tables' shape (rows past
/// the values' get zeros). Errors: `dy` of another shape or a non-float dtype, another engine.
pub fn backward(saved: &RopeSaved, dy: &Tensor) -> Result<RopeGrads> {
    backward_as(saved, dy, DType::F32)
}

/// [`backward`] with `dvalues` stored in `dtype`: F32 gives that function's result; F16 or
/// BF16 gives the F32 gradient rounded once to nearest-even (bit for bit `cast::cast` of it; a
/// NaN stays a NaN, its payload may differ). The table gradients stay F32. A 16-bit cotangent
/// on the step kernels (whole steps of 8 values) writes the 16-bit gradient directly; other
/// cases narrow the F32 gradient.
///
/// Errors: those of [`backward`], and a `dtype` that is not a float dtype (`UnsupportedDType`).
pub fn backward_as(saved: &RopeSaved, dy: &Tensor, dtype: DType) -> Result<RopeGrads> {
    check_cotangent(dy, &saved.q, "rope: dy")?;
    dtype.require_float("rope: gradient dtype")?;
    let tables = (&saved.cos, &saved.sin);
    let dvalues = match run_steps(&saved.plan, false, dy, None, tables, dtype)? {
        Some((d, _)) => d,
        None => {
            let d = match run_steps(&saved.plan, false, dy, None, tables, DType::F32)? {
                Some((d, _)) => d,
                None => run_backward_values(&saved.plan, dy, 1, &saved.cos, &saved.sin)?,
            };
            crate::cast::cast(&d, dtype)?
        }
    };
    let (dcos, dsin) = if saved.table_grads {
        let (c, s) = run_table_grads(&saved.plan, &saved.q, dy, None)?;
        (Some(c), s)
    } else {
        (None, None)
    };
    Ok(RopeGrads {
        dvalues,
        dcos,
        dsin,
    })
}

/// (batch, seq, heads, dim) of multi-head values in `layout`.
fn bshd(t: &Tensor, layout: RopeLayout, what: &str) -> Result<(usize, usize, usize, usize)> {
    let &[a, b, c, d] = t.shape() else {
        return Err(Error::shape(
            format!("{what} (4-D)"),
            &[1, t.len(), 1, 1],
            t.shape(),
        ));
    };
    Ok(match layout {
        RopeLayout::Bshd => (a, b, c, d),
        RopeLayout::Bhsd => (a, c, b, d),
    })
}

/// Validate q, k, positions; build the plan (tables are checked by the callers).
#[allow(clippy::too_many_arguments)]
fn qk_plan(
    q: &Tensor,
    k: &Tensor,
    table_rows: usize,
    half_of_table: usize,
    positions: Option<&Tensor>,
    options: &RopeQkOptions,
    complex: bool,
) -> Result<Plan> {
    float(q, "rope: q")?;
    float(k, "rope: k")?;
    let engine = q.engine();
    k.check_engine(engine, "rope: k")?;
    if k.dtype() != q.dtype() {
        return Err(Error::dtype(
            "rope: k (the dtype of q)",
            k.dtype(),
            &[q.dtype()],
        ));
    }
    let (batch, seq, hq, dim) = bshd(q, options.layout, "rope: q")?;
    let (kb, ks, hk, kd) = bshd(k, options.layout, "rope: k")?;
    if (kb, ks, kd) != (batch, seq, dim) {
        let expected = match options.layout {
            RopeLayout::Bshd => [batch, seq, hk, dim],
            RopeLayout::Bhsd => [batch, hk, seq, dim],
        };
        return Err(Error::shape("rope: k", &expected, k.shape()));
    }
    fits_u32("rope: q", q.len())?;
    fits_u32("rope: k", k.len())?;
    let rot = rotary_dim(options.rotary_dim, dim)?;
    let half = rot / 2;
    if half_of_table != half {
        return Err(Error::shape(
            "rope: table (rotary_dim/2 frequencies)",
            &[table_rows, half],
            &[table_rows, half_of_table],
        ));
    }
    let axes = if options.mrope_section.is_some() {
        3
    } else {
        1
    };
    let sections = match options.mrope_section {
        Some([a, b, c]) => {
            // Checked: sections past usize must be refused, not wrap to a valid sum.
            let sum = a.checked_add(b).and_then(|ab| ab.checked_add(c));
            if sum != Some(half) {
                return Err(Error::bounds(
                    "rope: mrope_section sum",
                    sum.map_or(u64::MAX, |s| s as u64),
                    half as u64,
                    half as u64,
                ));
            }
            (a, a + b)
        }
        None => (u32::MAX as usize, u32::MAX as usize),
    };
    let (pos_batched, pos_axis_stride) = match positions {
        None => {
            if options.mrope_section.is_some() {
                return Err(Error::shape(
                    "rope: mrope position ids",
                    &[3, batch, seq],
                    &[],
                ));
            }
            if table_rows < seq {
                return Err(Error::bounds(
                    "rope: table rows (≥ seq)",
                    table_rows as u64,
                    seq as u64,
                    u64::from(u32::MAX),
                ));
            }
            (false, 0)
        }
        Some(p) => {
            p.check_engine(engine, "rope: positions")?;
            if !matches!(p.dtype(), DType::I32 | DType::U32) {
                return Err(Error::dtype(
                    "rope: positions",
                    p.dtype(),
                    &[DType::I32, DType::U32],
                ));
            }
            let lead = if axes == 3 { vec![3] } else { vec![] };
            let batched: Vec<usize> = lead.iter().copied().chain([batch, seq]).collect();
            let shared: Vec<usize> = lead.iter().copied().chain([seq]).collect();
            let pb = if p.shape() == batched.as_slice() {
                true
            } else if p.shape() == shared.as_slice() {
                false
            } else {
                return Err(Error::shape("rope: positions", &batched, p.shape()));
            };
            if options.check_positions && !p.is_empty() {
                let ids: Vec<i64> = match p.dtype() {
                    DType::I32 => p.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
                    _ => p.to_vec::<u32>()?.into_iter().map(i64::from).collect(),
                };
                if let Some(&bad) = ids.iter().find(|&&v| v < 0 || v >= table_rows as i64) {
                    return Err(Error::OutOfBounds {
                        what: "rope: position id".into(),
                        got: bad as u64,
                        min: 0,
                        max: table_rows.saturating_sub(1) as u64,
                    });
                }
            }
            (pb, if pb { batch * seq } else { seq })
        }
    };
    Ok(Plan {
        dim,
        rot,
        batch,
        seq,
        heads_q: hq,
        heads_k: hk,
        table_rows,
        interleaved: options.interleaved || complex,
        layout: options.layout,
        complex,
        positions: positions.cloned(),
        pos_batched,
        pos_axis_stride,
        sections,
    })
}

/// RoPE of q and k in one call. `q` and `k` are `[batch, seq, heads, dim]` (or `[batch, heads,
/// seq, dim]` with [`RopeLayout::Bhsd`]) with their own head counts and one dtype; `cos`, `sin`
/// are shared tables `[table_rows, rotary_dim/2]`. Without `positions` token `(b, s)` uses
/// table row `s` (`table_rows ≥ seq`); with `positions` (I32 or U32, `[batch, seq]` or `[seq]`;
/// mRoPE: `[3, batch, seq]` or `[3, seq]`) it uses row `positions[.., b, s]`.
///
/// Errors: shapes (`ShapeMismatch`), a table shorter than `seq` without positions or a
/// position id outside `0..table_rows` (`OutOfBounds`, the latter only with
/// `check_positions`, which synchronizes), odd/too large `rotary_dim`, mRoPE sections not
/// summing to `rotary_dim/2` (`OutOfBounds`), dtypes, engines, sizes.
pub fn qk_forward(
    q: &Tensor,
    k: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    positions: Option<&Tensor>,
    options: &RopeQkOptions,
) -> Result<((Tensor, Tensor), RopeSaved)> {
    let engine = q.engine();
    check_table(
        cos,
        "rope: cos",
        1,
        cos.shape().get(1).copied().unwrap_or(0),
        engine,
    )?;
    if cos.shape().len() != 2 {
        return Err(Error::shape("rope: cos", &[1, 1], cos.shape()));
    }
    let (table_rows, half) = (cos.shape()[0], cos.shape()[1]);
    check_table(sin, "rope: sin", table_rows, half, engine)?;
    if sin.shape() != cos.shape() {
        return Err(Error::shape("rope: sin", cos.shape(), sin.shape()));
    }
    if sin.dtype() != cos.dtype() {
        return Err(Error::dtype(
            "rope: sin (the dtype of cos)",
            sin.dtype(),
            &[cos.dtype()],
        ));
    }
    let plan = qk_plan(q, k, table_rows, half, positions, options, false)?;
    let (qo, ko) = match run_steps(&plan, true, q, Some(k), (cos, sin), DType::F32)? {
        Some((qo, Some(ko))) => (qo, ko),
        _ => (
            run_forward(&plan, q, plan.heads_q, cos, sin)?,
            run_forward(&plan, k, plan.heads_k, cos, sin)?,
        ),
    };
    Ok((
        (qo, ko),
        RopeSaved {
            plan,
            q: q.clone(),
            k: Some(k.clone()),
            cos: cos.clone(),
            sin: sin.clone(),
            table_grads: options.table_grads,
        },
    ))
}

/// dq, dk and the table gradients of `run_table_grads`.
type QkGrads = (Tensor, Tensor, Option<(Tensor, Option<Tensor>)>);

fn qk_grads(saved: &RopeSaved, dq: &Tensor, dk: &Tensor, dtype: DType) -> Result<QkGrads> {
    dtype.require_float("rope: gradient dtype")?;
    let Some(k) = &saved.k else {
        return Err(Error::shape(
            "rope: saved k (use rope::backward for single tensors)",
            &[1],
            &[],
        ));
    };
    check_cotangent(dq, &saved.q, "rope: dq")?;
    check_cotangent(dk, k, "rope: dk")?;
    if dk.dtype() != dq.dtype() {
        return Err(Error::dtype(
            "rope: dk (the dtype of dq)",
            dk.dtype(),
            &[dq.dtype()],
        ));
    }
    let p = &saved.plan;
    let tables = (&saved.cos, &saved.sin);
    let (dqv, dkv) = match run_steps(p, false, dq, Some(dk), tables, dtype)? {
        Some((dqv, Some(dkv))) => (dqv, dkv),
        _ => {
            let (dqv, dkv) = match run_steps(p, false, dq, Some(dk), tables, DType::F32)? {
                Some((dqv, Some(dkv))) => (dqv, dkv),
                _ => (
                    run_backward_values(p, dq, p.heads_q, &saved.cos, &saved.sin)?,
                    run_backward_values(p, dk, p.heads_k, &saved.cos, &saved.sin)?,
                ),
            };
            (
                crate::cast::cast(&dqv, dtype)?,
                crate::cast::cast(&dkv, dtype)?,
            )
        }
    };
    let tables = if saved.table_grads {
        Some(run_table_grads(p, &saved.q, dq, Some((k, dk)))?)
    } else {
        None
    };
    Ok((dqv, dkv, tables))
}

/// Backward of [`qk_forward`]: F32 `dq`, `dk` and, with `table_grads`, `dcos`, `dsin`
/// `[table_rows, rotary_dim/2]` summed over every (batch, seq, head) that used each entry, in
/// a fixed order: per entry its tokens in batch-major order, per token its q heads then its k
/// heads (ids outside the table feed no entry; unused rows get 0). With position ids the
/// table gradients use scratch ([`backward_workspace_bytes`]). Errors: cotangent
/// shapes/dtypes (dq and dk of one dtype), engines, a saved context of [`forward`], a
/// workspace bound below one token's scratch (`WorkspaceExceeded`).
pub fn qk_backward(saved: &RopeSaved, dq: &Tensor, dk: &Tensor) -> Result<RopeQkGrads> {
    qk_backward_as(saved, dq, dk, DType::F32)
}

/// [`qk_backward`] with `dq` and `dk` stored in `dtype` (F16 or BF16: the F32 gradients
/// rounded once, as [`backward_as`]; written directly by the step kernels for 16-bit
/// cotangents in whole steps of 8 values). The table gradients stay F32.
///
/// Errors: those of [`qk_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn qk_backward_as(
    saved: &RopeSaved,
    dq: &Tensor,
    dk: &Tensor,
    dtype: DType,
) -> Result<RopeQkGrads> {
    if saved.plan.complex {
        return Err(Error::shape(
            "rope: saved context (Llama 4: use llama4_backward)",
            &[],
            &[],
        ));
    }
    let (dq, dk, tables) = qk_grads(saved, dq, dk, dtype)?;
    let (dcos, dsin) = match tables {
        Some((c, s)) => (Some(c), s),
        None => (None, None),
    };
    Ok(RopeQkGrads { dq, dk, dcos, dsin })
}

/// Llama 4 RoPE: q and k as in [`qk_forward`] viewed as complex numbers over adjacent pairs
/// and multiplied by `freqs_cis[table_rows, rotary_dim/2, 2]` (real, imaginary; F32, F16 or
/// BF16), gathered by `positions` or by the sequence index. `options.interleaved` is ignored
/// (always adjacent pairs); `mrope_section` must be `None`. Errors: as [`qk_forward`].
pub fn llama4_forward(
    q: &Tensor,
    k: &Tensor,
    freqs_cis: &Tensor,
    positions: Option<&Tensor>,
    options: &RopeQkOptions,
) -> Result<((Tensor, Tensor), RopeSaved)> {
    float(freqs_cis, "rope: freqs_cis")?;
    freqs_cis.check_engine(q.engine(), "rope: freqs_cis")?;
    let &[table_rows, half, 2] = freqs_cis.shape() else {
        return Err(Error::shape(
            "rope: freqs_cis",
            &[1, 1, 2],
            freqs_cis.shape(),
        ));
    };
    fits_u32("rope: freqs_cis", freqs_cis.len())?;
    if options.mrope_section.is_some() {
        return Err(Error::shape(
            "rope: mrope_section (not with Llama 4)",
            &[],
            &[3],
        ));
    }
    let plan = qk_plan(q, k, table_rows, half, positions, options, true)?;
    let qo = run_forward(&plan, q, plan.heads_q, freqs_cis, freqs_cis)?;
    let ko = run_forward(&plan, k, plan.heads_k, freqs_cis, freqs_cis)?;
    Ok((
        (qo, ko),
        RopeSaved {
            plan,
            q: q.clone(),
            k: Some(k.clone()),
            cos: freqs_cis.clone(),
            sin: freqs_cis.clone(),
            table_grads: options.table_grads,
        },
    ))
}

/// Backward of [`llama4_forward`]: F32 `dq`, `dk` and, with `table_grads`, `dfreqs` in
/// `freqs_cis`' layout (∂/∂real, ∂/∂imaginary). Errors: as [`qk_backward`].
pub fn llama4_backward(saved: &RopeSaved, dq: &Tensor, dk: &Tensor) -> Result<Llama4Grads> {
    if !saved.plan.complex {
        return Err(Error::shape(
            "rope: saved context (not Llama 4: use qk_backward)",
            &[],
            &[],
        ));
    }
    let (dq, dk, tables) = qk_grads(saved, dq, dk, DType::F32)?;
    Ok(Llama4Grads {
        dq,
        dk,
        dfreqs: tables.map(|(d, _)| d),
    })
}

/// Frequency scaling of [`tables`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    /// `θ_i = base^(−2i/d)`.
    #[default]
    None,
    /// Position interpolation: positions divided by `factor`.
    Linear {
        /// Scale factor (> 0).
        factor: f64,
    },
    /// NTK-aware scaling: the base becomes `base·factor^(d/(d−2))`.
    Ntk {
        /// Scale factor (≥ 1).
        factor: f64,
    },
    /// YaRN: frequencies blended between extrapolation and interpolation (by `factor`) with a
    /// linear ramp over the dimensions whose wavelengths fall between `beta_fast` and
    /// `beta_slow` rotations in `original_max_positions`, and cos/sin scaled by the attention
    /// factor (default `0.1·ln(factor) + 1`).
    Yarn {
        /// Scale factor (≥ 1).
        factor: f64,
        /// Context length the model was trained with.
        original_max_positions: usize,
        /// Rotations marking the end of extrapolation (HF default 32).
        beta_fast: f64,
        /// Rotations marking the start of interpolation (HF default 1).
        beta_slow: f64,
        /// cos/sin scale; `None`: `0.1·ln(factor) + 1`.
        attention_factor: Option<f64>,
    },
}

fn positive(what: &str, v: f64, min: f64) -> Result<()> {
    if !v.is_finite() || v < min {
        return Err(Error::InvalidValue {
            what: what.into(),
            got: v,
            rule: format!("must be finite and ≥ {min}"),
        });
    }
    Ok(())
}

/// Per-frequency angle rates `[rotary_dim/2]` (position p, frequency i rotates by
/// `p·rate_i`) and the cos/sin scale, for `base` and `scaling`, in f64.
///
/// Errors: `rotary_dim` zero or odd; `base` ≤ 1 or non-finite; a bad factor, beta or
/// original length (`InvalidValue`).
pub fn frequencies(rotary_dim: usize, base: f64, scaling: &RopeScaling) -> Result<(Vec<f64>, f64)> {
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(Error::InvalidValue {
            what: "rope tables: rotary_dim".into(),
            got: rotary_dim as f64,
            rule: "must be even and positive".into(),
        });
    }
    if !base.is_finite() || base <= 1.0 {
        return Err(Error::InvalidValue {
            what: "rope tables: base".into(),
            got: base,
            rule: "must be finite and > 1".into(),
        });
    }
    let d = rotary_dim as f64;
    let half = rotary_dim / 2;
    let plain = |b: f64| -> Vec<f64> { (0..half).map(|i| b.powf(-2.0 * i as f64 / d)).collect() };
    Ok(match *scaling {
        RopeScaling::None => (plain(base), 1.0),
        RopeScaling::Linear { factor } => {
            if !factor.is_finite() || factor <= 0.0 {
                return Err(Error::InvalidValue {
                    what: "rope tables: linear factor".into(),
                    got: factor,
                    rule: "must be finite and > 0".into(),
                });
            }
            (plain(base).into_iter().map(|f| f / factor).collect(), 1.0)
        }
        RopeScaling::Ntk { factor } => {
            positive("rope tables: NTK factor", factor, 1.0)?;
            if rotary_dim < 4 {
                return Err(Error::InvalidValue {
                    what: "rope tables: rotary_dim (NTK needs ≥ 4)".into(),
                    got: d,
                    rule: "must be ≥ 4".into(),
                });
            }
            (plain(base * factor.powf(d / (d - 2.0))), 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_max_positions,
            beta_fast,
            beta_slow,
            attention_factor,
        } => {
            positive("rope tables: YaRN factor", factor, 1.0)?;
            positive("rope tables: YaRN beta_fast", beta_fast, f64::MIN_POSITIVE)?;
            positive("rope tables: YaRN beta_slow", beta_slow, f64::MIN_POSITIVE)?;
            if original_max_positions == 0 {
                return Err(Error::InvalidValue {
                    what: "rope tables: YaRN original_max_positions".into(),
                    got: 0.0,
                    rule: "must be positive".into(),
                });
            }
            let scale = match attention_factor {
                Some(a) => {
                    positive("rope tables: YaRN attention_factor", a, 0.0)?;
                    a
                }
                None => 0.1 * factor.ln() + 1.0,
            };
            // Dimension index whose wavelength fits `rotations` turns in the original context.
            let dim_for = |rotations: f64| {
                d * (original_max_positions as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * base.ln())
            };
            let low = dim_for(beta_fast).floor().max(0.0);
            let mut high = dim_for(beta_slow).ceil().min(d - 1.0);
            if high == low {
                high += 0.001;
            }
            let freqs = plain(base)
                .into_iter()
                .enumerate()
                .map(|(i, extrapolated)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp; // share of the extrapolated (unscaled) frequency
                    extrapolated / factor * (1.0 - keep) + extrapolated * keep
                })
                .collect();
            (freqs, scale)
        }
    })
}

/// Host-built tables `(cos, sin)` `[rows, rotary_dim/2]` in `dtype`: row p, frequency i is
/// `scale·cos(p·rate_i)`, `scale·sin(p·rate_i)` from [`frequencies`], computed in f64 and
/// rounded once. Errors: as [`frequencies`], a non-float dtype.
pub fn tables(
    engine: &Engine,
    rows: usize,
    rotary_dim: usize,
    base: f64,
    scaling: &RopeScaling,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    if !dtype.is_float() {
        return Err(Error::dtype("rope tables", dtype, &DType::FLOATS));
    }
    let (rates, scale) = frequencies(rotary_dim, base, scaling)?;
    let half = rates.len();
    let mut c = Vec::with_capacity(rows * half);
    let mut s = Vec::with_capacity(rows * half);
    for p in 0..rows {
        for &rate in &rates {
            let angle = p as f64 * rate;
            c.push(scale * angle.cos());
            s.push(scale * angle.sin());
        }
    }
    let (cos, _) = crate::gradcheck::tensor_from_f64(engine, &c, &[rows, half], dtype)?;
    let (sin, _) = crate::gradcheck::tensor_from_f64(engine, &s, &[rows, half], dtype)?;
    Ok((cos, sin))
}

/// Llama 4's `freqs_cis` `[rows, rotary_dim/2, 2]` (F32): the (cos, sin) of [`tables`]
/// interleaved as (real, imaginary).
pub fn llama4_freqs(
    engine: &Engine,
    rows: usize,
    rotary_dim: usize,
    base: f64,
    scaling: &RopeScaling,
) -> Result<Tensor> {
    let (rates, scale) = frequencies(rotary_dim, base, scaling)?;
    let half = rates.len();
    let mut f = Vec::with_capacity(rows * half * 2);
    for p in 0..rows {
        for &rate in &rates {
            let angle = p as f64 * rate;
            f.push((scale * angle.cos()) as f32);
            f.push((scale * angle.sin()) as f32);
        }
    }
    Tensor::from_slice(engine, &f, &[rows, half, 2])
}
