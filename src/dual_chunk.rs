//! Dual chunk attention (causal): three query branches, rotated by the caller at their own
//! positions, attend three partitions of the causal keys under one softmax.
//!
//! Query `i` sits at position `p = i + k_len − q_len` (the queries are the last `q_len` of the
//! `k_len` positions) in chunk `p / chunk_len`; key `j` in chunk `j / chunk_len`. Among the
//! keys `j ≤ p`:
//!
//! * the **intra-chunk** branch's query scores the keys of its own chunk,
//! * the **successive-chunk** branch's query the keys of the chunk before,
//! * the **inter-chunk** branch's query the keys of every chunk before that,
//!
//! so every causal key is scored by exactly one branch, `s_ij = q_b(i,j)·k_j`, and
//! `O_i = Σ_j softmax_j(scale·s_ij)·v_j` over all of them: one denominator, not three
//! separately normalized outputs added. [`dual_chunk_positions`] gives the rotary positions
//! of each branch and of the keys (ChunkLlama's: with `chunk_len = chunk_size − local_window`,
//! keys and intra-chunk queries at `t mod chunk_len`, successive-chunk queries at
//! `min(t mod chunk_len + chunk_len, chunk_size)`, inter-chunk queries at
//! `min(2·chunk_len − 1, chunk_size)`), for [`crate::rope`] with position ids.
//!
//! # Schedule
//!
//! Each branch runs [`crate::attention`]'s kernels with its partition as the visibility
//! (tiles no query of the branch can see skipped; nothing quadratic stored): its output and
//! row statistics (raw maximum `m_b`, `log l_b`). The branches are then merged row by row in
//! branch order (`m = max(m_a, m_b)`, weights `exp(scale·(m_x − m) + log l_x)`), which gives
//! the output and statistics of the one softmax over all causal keys. The backward runs
//! attention's backward once per branch with the merged output and statistics (so each
//! branch's probabilities are those of the one softmax and `D = rowsum(dO ∘ O)` is the merged
//! output's): each branch gives its query's gradient and its partition's key and value
//! gradients, which are added in branch order. FP32 throughout, no atomics: reruns give the
//! same bits.

use crate::attention::{self, AttentionLayout, AttentionOptions, AttentionSaved};
use crate::error::{Error, Result};
use crate::{DType, Tensor};

/// The three query branches, each `[batch, q_heads, q_len, head_dim]` (or the layout's), of
/// one dtype and shape, rotated at [`dual_chunk_positions`]'s positions.
#[derive(Debug, Clone, Copy)]
pub struct DualChunkQueries<'a> {
    /// Scores the keys of the query's own chunk.
    pub intra: &'a Tensor,
    /// Scores the keys of the chunk before.
    pub successive: &'a Tensor,
    /// Scores the keys of every earlier chunk.
    pub inter: &'a Tensor,
}

/// Options of [`dual_chunk_attention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DualChunkOptions {
    /// Positions a chunk (`chunk_size − local_window` in ChunkLlama's terms), at least 1.
    pub chunk_len: usize,
    /// Score scale; `None` = `1/sqrt(head_dim)`.
    pub scale: Option<f64>,
    /// Layout of the queries, keys and values (and of the output and gradients).
    pub layout: AttentionLayout,
}

/// What [`dual_chunk_attention_backward`] needs: each branch's inputs with the merged F32
/// output and row statistics.
#[derive(Debug, Clone)]
pub struct DualChunkSaved {
    branches: [AttentionSaved; 3],
}

impl DualChunkSaved {
    /// The unrounded merged output, F32 (for an F32 call, the returned output itself).
    pub fn output_f32(&self) -> &Tensor {
        self.branches[0].output_f32()
    }
    /// Raw maximum score of each query row over all its keys, `[batch, q_heads, q_len]`.
    pub fn row_max(&self) -> &Tensor {
        self.branches[0].row_max()
    }
    /// `log Σ exp(scale·(s − row_max))` of each query row over all its keys.
    pub fn log_denominator(&self) -> &Tensor {
        self.branches[0].log_denominator()
    }
}

/// Gradients of [`dual_chunk_attention_backward`], F32, in the inputs' shapes and layout.
#[derive(Debug, Clone)]
pub struct DualChunkGradients {
    /// d loss / d intra-chunk query.
    pub intra: Tensor,
    /// d loss / d successive-chunk query.
    pub successive: Tensor,
    /// d loss / d inter-chunk query.
    pub inter: Tensor,
    /// d loss / d key (every branch and every query head of the group).
    pub key: Tensor,
    /// d loss / d value.
    pub value: Tensor,
}

/// Scratch bytes a dual chunk attention call allocates beyond its outputs and saved context,
/// for `batch` × `q_heads` query rows of `q_len` and `batch` × `kv_heads` key rows of `k_len`,
/// `head_dim` wide: the larger of the forward's (two branches' F32 outputs and row statistics
/// until they are merged) and the backward's (attention's row scratch, and two branches' F32
/// key and value gradients until they are added). Checked against the engine's workspace
/// bound by both.
pub fn dual_chunk_workspace_bytes(
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    k_len: usize,
    head_dim: usize,
) -> u64 {
    let rows = (batch * q_heads * q_len) as u64;
    let q = rows * head_dim as u64;
    let k = (batch * kv_heads * k_len * head_dim) as u64;
    let forward = 2 * 4 * (q + 2 * rows);
    let backward = attention::attention_workspace_bytes(batch, q_heads, q_len) + 2 * 2 * 4 * k;
    forward.max(backward)
}

fn workspace(p: &attention::Plan) -> u64 {
    dual_chunk_workspace_bytes(
        p.batch(),
        p.q_heads(),
        p.kv_heads(),
        p.q_len(),
        p.k_len(),
        p.head_dim(),
    )
}

/// Dual chunk attention forward: the output (the queries' dtype, shape and layout) and what
/// the backward needs. Keys and values as [`attention::attention_forward`]'s (grouped heads,
/// F32/F16/BF16, head dims multiples of 8 up to 256).
///
/// Errors, before anything is launched: those of [`attention::attention_forward`] for each
/// branch; branches of other shapes or dtypes (`ShapeMismatch` / `UnsupportedDType`); a
/// `chunk_len` of 0 or past 2²⁴, or fewer keys than queries (`InvalidValue`); scratch
/// ([`dual_chunk_workspace_bytes`]) past the engine's workspace bound (`WorkspaceExceeded`).
pub fn dual_chunk_attention(
    queries: DualChunkQueries<'_>,
    key: &Tensor,
    value: &Tensor,
    options: &DualChunkOptions,
) -> Result<(Tensor, DualChunkSaved)> {
    let branches = [queries.intra, queries.successive, queries.inter];
    for (what, q) in [
        ("dual_chunk_attention: successive", queries.successive),
        ("dual_chunk_attention: inter", queries.inter),
    ] {
        if q.shape() != queries.intra.shape() {
            return Err(Error::shape(what, queries.intra.shape(), q.shape()));
        }
        if q.dtype() != queries.intra.dtype() {
            return Err(Error::dtype(what, q.dtype(), &[queries.intra.dtype()]));
        }
    }
    if !(1..=attention::MAX_LEN).contains(&options.chunk_len) {
        return Err(Error::InvalidValue {
            what: "dual_chunk_attention: chunk_len".into(),
            got: options.chunk_len as f64,
            rule: format!("from 1 to {}", attention::MAX_LEN),
        });
    }
    let attention_options = AttentionOptions {
        causal: true,
        scale: options.scale,
        layout: options.layout,
        ..AttentionOptions::default()
    };
    let mut plans = Vec::with_capacity(3);
    for (branch, q) in branches.iter().enumerate() {
        let mut plan = attention::plan(q, key, value, &attention_options)?;
        plan.chunk_len = options.chunk_len as u32;
        plan.branch = branch as u32;
        plans.push(plan);
    }
    let (q_len, k_len) = (plans[0].q_len(), plans[0].k_len());
    if k_len < q_len {
        return Err(Error::InvalidValue {
            what: "dual_chunk_attention: key length".into(),
            got: k_len as f64,
            rule: format!("at least the query length ({q_len}): queries are the last positions"),
        });
    }
    let engine = key.engine();
    engine.check_workspace("dual_chunk_attention", workspace(&plans[0]))?;
    let dtype = queries.intra.dtype();
    let output = Tensor::empty(engine, queries.intra.shape(), dtype, "dual chunk output")?;
    // Branch 0 writes the merged results in place; F32 branches 1 and 2 need outputs of their
    // own (their outputs are their saved outputs), 16-bit ones write theirs over `output`.
    let mut saved = Vec::with_capacity(3);
    for (i, (q, plan)) in branches.iter().zip(plans).enumerate() {
        let out = if i == 0 || dtype != DType::F32 {
            output.clone()
        } else {
            Tensor::empty(engine, q.shape(), dtype, "dual chunk branch output")?
        };
        saved.push(attention::forward_planned(q, key, value, None, plan, &out)?);
    }
    let last = (dtype != DType::F32).then_some(&output);
    attention::merge_into(&saved[0], &saved[1], None)?;
    attention::merge_into(&saved[0], &saved[2], last)?;
    let merged = saved[0].clone();
    let branches = [
        merged.clone(),
        saved[1].with_statistics(&merged),
        saved[2].with_statistics(&merged),
    ];
    Ok((output, DualChunkSaved { branches }))
}

/// Dual chunk attention backward from the output's cotangent (`d_output`: the queries' shape,
/// any float dtype): every gradient in F32. Errors: those of
/// [`attention::attention_backward`]; scratch ([`dual_chunk_workspace_bytes`]) past the
/// engine's workspace bound (`WorkspaceExceeded`).
pub fn dual_chunk_attention_backward(
    saved: &DualChunkSaved,
    d_output: &Tensor,
) -> Result<DualChunkGradients> {
    dual_chunk_attention_backward_as(saved, d_output, DType::F32)
}

/// [`dual_chunk_attention_backward`] with the gradients stored in `dtype`: F32 gives that
/// function's; F16/BF16 give each F32 gradient rounded once (cast after the key and value
/// gradients are added), bit for bit the cast of the F32 gradients. Errors: those of
/// [`dual_chunk_attention_backward`]; a non-float `dtype` (`UnsupportedDType`).
pub fn dual_chunk_attention_backward_as(
    saved: &DualChunkSaved,
    d_output: &Tensor,
    dtype: DType,
) -> Result<DualChunkGradients> {
    if !dtype.is_float() {
        return Err(Error::dtype(
            "dual_chunk_attention_backward_as: dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    let [intra, successive, inter] = [0, 1, 2].map(|b| &saved.branches[b]);
    let engine = saved.output_f32().engine();
    engine.check_workspace("dual_chunk_attention_backward", workspace(intra.plan()))?;
    let g0 = attention::attention_backward(intra, d_output)?;
    let g1 = attention::attention_backward(successive, d_output)?;
    let g2 = attention::attention_backward(inter, d_output)?;
    for g in [&g1, &g2] {
        attention::add_tensors(&g0.key, &g.key)?;
        attention::add_tensors(&g0.value, &g.value)?;
    }
    Ok(DualChunkGradients {
        intra: crate::cast::cast(&g0.query, dtype)?,
        successive: crate::cast::cast(&g1.query, dtype)?,
        inter: crate::cast::cast(&g2.query, dtype)?,
        key: crate::cast::cast(&g0.key, dtype)?,
        value: crate::cast::cast(&g0.value, dtype)?,
    })
}

/// Rotary positions of dual chunk attention for tokens `0..len` (ChunkLlama's): keys and
/// intra-chunk queries at `t mod chunk_len`, successive-chunk queries at
/// `min(t mod chunk_len + chunk_len, chunk_size)`, inter-chunk queries at
/// `min(2·chunk_len − 1, chunk_size)`, with `chunk_len = chunk_size − local_window` (the
/// [`DualChunkOptions::chunk_len`] to pass).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DualChunkPositions {
    /// `chunk_size − local_window`.
    pub chunk_len: usize,
    /// Positions of the keys.
    pub key: Vec<i32>,
    /// Positions of the intra-chunk queries.
    pub intra: Vec<i32>,
    /// Positions of the successive-chunk queries.
    pub successive: Vec<i32>,
    /// Positions of the inter-chunk queries.
    pub inter: Vec<i32>,
}

/// [`DualChunkPositions`] of `len` tokens. Errors: `local_window ≥ chunk_size`, or a
/// `chunk_size` past `i32::MAX` (`InvalidValue`).
pub fn dual_chunk_positions(
    len: usize,
    chunk_size: usize,
    local_window: usize,
) -> Result<DualChunkPositions> {
    if local_window >= chunk_size || chunk_size > i32::MAX as usize {
        return Err(Error::InvalidValue {
            what: "dual_chunk_positions: local_window".into(),
            got: local_window as f64,
            rule: format!("below chunk_size ({chunk_size}), which is at most 2^31 - 1"),
        });
    }
    let chunk_len = chunk_size - local_window;
    let within = |t: usize| t % chunk_len;
    let at = |p: usize| p.min(chunk_size) as i32;
    Ok(DualChunkPositions {
        chunk_len,
        key: (0..len).map(|t| within(t) as i32).collect(),
        intra: (0..len).map(|t| within(t) as i32).collect(),
        successive: (0..len).map(|t| at(within(t) + chunk_len)).collect(),
        inter: vec![at(2 * chunk_len - 1); len],
    })
}
