//! Attention residuals (AttnRes, Liger-Kernel's): a softmax attention over depth replacing the
//! residual sum. For each token, N blocks `v_i` (rows of D values: the outputs of earlier
//! layers) are scored by a learned query against their RMS-normalized keys,
//!
//! `r_i = 1/sqrt(mean(v_i²) + ε)`, `k_i = round(v_i · r_i) · w_norm`, `s_i = Σ_d w_query,d k_i,d`,
//! `α = softmax_i(s)`, `h = Σ_i α_i v_i`,
//!
//! where `round` is the rounding to the blocks' storage dtype (the identity for F32). Blocks are
//! `[N, ..tokens, D]` (any leading token axes), `h` is `[..tokens, D]` in the blocks' dtype.
//!
//! Backward: `dα_i = Σ dh·v_i`, `dσ_i = α_i (dα_i − Σ_j α_j dα_j)`; `dv_i = α_i dh + dσ_i ·
//! RMSNorm′(v_i)ᵀ(w_query ⊙ w_norm)` (the rounding passed straight through, as Liger's
//! backward does); `d w_query = Σ_tokens Σ_i dσ_i k_i` and `d w_norm = Σ_tokens Σ_i dσ_i
//! w_query ⊙ round(v_i r_i)` (the derivatives of the forward's rounded keys), as partial rows of
//! 4 tokens added in row order (no atomics). Statistics, arithmetic and gradients FP32 (F16 /
//! BF16 gradients through [`attn_res_backward_as`], bit for bit the F32 ones cast).

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::{DType, Error, Result, Tensor, cast, reduce};

/// `wgsl/attn_res.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "attn_res",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        "const WG: u32 = 256u;",
        include_str!("../wgsl/attn_res.wgsl"),
    ],
};

/// The most blocks a call takes.
pub const MAX_BLOCKS: usize = 64;

/// Tokens a backward workgroup (and a partial row of the parameter gradients) covers.
const TOKENS: usize = 4;

/// Options of [`attn_res`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnResOptions {
    /// ε of the keys' RMS normalization, positive and finite (default 1e-6).
    pub eps: f32,
}

impl Default for AttnResOptions {
    fn default() -> Self {
        AttnResOptions { eps: 1e-6 }
    }
}

#[derive(encase::ShaderType)]
struct Params {
    blocks: u32,
    tokens: u32,
    d: u32,
    eps: f32,
}

/// What the backward needs: the blocks and weights (handles), the per-(token, block) inverse
/// RMS and weights α (F32 `[tokens, 2N]`), the settings.
#[derive(Debug, Clone)]
pub struct AttnResSaved {
    blocks: Tensor,
    query: Tensor,
    norm: Tensor,
    stats: Tensor,
    eps: f32,
}

impl AttnResSaved {
    /// Per token, the blocks' inverse RMS then their weights α: F32 `[tokens, 2N]`.
    pub fn statistics(&self) -> &Tensor {
        &self.stats
    }
}

/// The gradients of [`attn_res_backward`], F32.
#[derive(Debug, Clone)]
pub struct AttnResGradients {
    /// d blocks, the blocks' shape.
    pub blocks: Tensor,
    /// d w_query, `[D]`.
    pub query: Tensor,
    /// d w_norm, `[D]`.
    pub norm: Tensor,
}

/// (blocks N, tokens, D), every input checked.
fn check(
    blocks: &Tensor,
    query: &Tensor,
    norm: &Tensor,
    eps: f32,
) -> Result<(usize, usize, usize)> {
    let what = "attn_res";
    let engine = blocks.engine();
    for (t, name) in [(blocks, "blocks"), (query, "w_query"), (norm, "w_norm")] {
        t.check_engine(engine, &format!("{what}: {name}"))?;
        if !t.dtype().is_float() {
            return Err(Error::dtype(
                format!("{what}: {name}"),
                t.dtype(),
                &DType::FLOATS,
            ));
        }
    }
    let shape = blocks.shape();
    if shape.len() < 2 {
        return Err(Error::shape(
            format!("{what}: blocks [N, ..tokens, D]"),
            &[1, 1],
            shape,
        ));
    }
    let (n, d) = (shape[0], shape[shape.len() - 1]);
    let tokens: usize = shape[1..shape.len() - 1].iter().product();
    if n == 0 || n > MAX_BLOCKS {
        return Err(Error::bounds(
            format!("{what}: blocks N"),
            n as u64,
            1,
            MAX_BLOCKS as u64,
        ));
    }
    if d == 0 {
        return Err(Error::bounds(format!("{what}: D"), 0, 1, u32::MAX.into()));
    }
    for (t, name) in [(query, "w_query"), (norm, "w_norm")] {
        if t.shape() != [d] {
            return Err(Error::shape(format!("{what}: {name}"), &[d], t.shape()));
        }
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(Error::InvalidValue {
            what: format!("{what}: eps"),
            got: f64::from(eps),
            rule: "positive and finite".into(),
        });
    }
    if blocks.len() > u32::MAX as usize {
        return Err(Error::bounds(
            format!("{what}: elements"),
            blocks.len() as u64,
            0,
            u32::MAX.into(),
        ));
    }
    Ok((n, tokens, d))
}

fn constants(v: DType, q: DType, n: DType, g: DType, out: DType) -> Vec<(&'static str, f64)> {
    vec![
        ("DV", f64::from(v.code())),
        ("DQ", f64::from(q.code())),
        ("DN", f64::from(n.code())),
        ("DG", f64::from(g.code())),
        ("DO", f64::from(out.code())),
    ]
}

/// Scratch bytes of [`attn_res_backward`] for `tokens` tokens of width `d`: the parameter
/// partial rows and their finish.
pub fn attn_res_backward_workspace_bytes(tokens: usize, d: usize) -> u64 {
    let rows = tokens.div_ceil(TOKENS);
    (rows * 2 * d * 4) as u64 + reduce::sum_partial_groups_workspace_bytes(1, rows, 2 * d)
}

/// `h = Σ_i softmax_i(w_query · round(RMSNorm(v_i)) w_norm) v_i` per token, in the blocks'
/// dtype, and the saved context.
///
/// Errors: blocks of fewer than two axes, N outside 1..=[`MAX_BLOCKS`], D = 0; weights not
/// `[D]`; ε not positive and finite; non-float dtypes; tensors of other engines; more than
/// 2³² − 1 elements.
pub fn attn_res(
    blocks: &Tensor,
    w_query: &Tensor,
    w_norm: &Tensor,
    options: &AttnResOptions,
) -> Result<(Tensor, AttnResSaved)> {
    let (n, tokens, d) = check(blocks, w_query, w_norm, options.eps)?;
    let engine = blocks.engine();
    let dt = blocks.dtype();
    // 16-bit outputs are written a column pair a lane: an odd D goes through F32.
    let direct = dt == DType::F32 || d % 2 == 0;
    let out_dt = if direct { dt } else { DType::F32 };
    let out_shape = &blocks.shape()[1..];
    let out = Tensor::empty(engine, out_shape, out_dt, "attn_res output")?;
    let stats = Tensor::empty(engine, &[tokens, 2 * n], DType::F32, "attn_res statistics")?;
    let params = Params {
        blocks: n as u32,
        tokens: tokens as u32,
        d: d as u32,
        eps: options.eps,
    };
    let consts = constants(dt, w_query.dtype(), w_norm.dtype(), DType::F32, out_dt);
    let buffers = [
        blocks.buffer(),
        w_query.buffer(),
        w_norm.buffer(),
        stats.buffer(),
        out.buffer(),
    ];
    engine.launch(
        &KERNEL,
        "forward",
        &consts,
        &params,
        &buffers,
        tokens as u64,
    )?;
    let out = if direct { out } else { cast::cast(&out, dt)? };
    let saved = AttnResSaved {
        blocks: blocks.clone(),
        query: w_query.clone(),
        norm: w_norm.clone(),
        stats,
        eps: options.eps,
    };
    Ok((out, saved))
}

/// The gradients of `⟨dh, h⟩` with respect to the blocks, w_query and w_norm, F32.
///
/// Errors: `dh` not the output's shape, not a float dtype, or of another engine; scratch past
/// the workspace bound.
pub fn attn_res_backward(saved: &AttnResSaved, dh: &Tensor) -> Result<AttnResGradients> {
    backward_in(saved, dh, DType::F32, "attn_res_backward")
}

/// [`attn_res_backward`] with every gradient in `dtype` (F32, F16 or BF16), bit for bit the
/// F32 gradients cast ([`crate::cast::cast`]): d blocks written in 16 bits by the kernel for an
/// even D (no F32 copy; an odd D computes it in F32 and casts), the `[D]` weight gradients
/// cast.
///
/// Errors: those of [`attn_res_backward`]; a `dtype` that is not a float.
pub fn attn_res_backward_as(
    saved: &AttnResSaved,
    dh: &Tensor,
    dtype: DType,
) -> Result<AttnResGradients> {
    let what = "attn_res_backward_as";
    dtype.require_float(format!("{what}: dtype"))?;
    backward_in(saved, dh, dtype, what)
}

fn backward_in(
    saved: &AttnResSaved,
    dh: &Tensor,
    dtype: DType,
    what: &str,
) -> Result<AttnResGradients> {
    let (n, tokens, d) = check(&saved.blocks, &saved.query, &saved.norm, saved.eps)?;
    let engine = saved.blocks.engine();
    let dh_what = format!("{what}: dh");
    dh.check_engine(engine, &dh_what)?;
    let want = &saved.blocks.shape()[1..];
    if dh.shape() != want {
        return Err(Error::shape(dh_what, want, dh.shape()));
    }
    if !dh.dtype().is_float() {
        return Err(Error::dtype(dh_what, dh.dtype(), &DType::FLOATS));
    }
    engine.check_workspace(what, attn_res_backward_workspace_bytes(tokens, d))?;
    let rows = tokens.div_ceil(TOKENS);
    // The kernel writes a 16-bit dV itself where each row is whole words.
    let dv_dtype = if d.is_multiple_of(2) {
        dtype
    } else {
        DType::F32
    };
    let dv = Tensor::empty(engine, saved.blocks.shape(), dv_dtype, "attn_res d blocks")?;
    if rows == 0 {
        return Ok(AttnResGradients {
            blocks: crate::cast::cast(&dv, dtype)?,
            query: Tensor::zeros(engine, &[d], dtype)?,
            norm: Tensor::zeros(engine, &[d], dtype)?,
        });
    }
    let partials = Tensor::empty(engine, &[rows, 2 * d], DType::F32, "attn_res partials")?;
    let params = Params {
        blocks: n as u32,
        tokens: tokens as u32,
        d: d as u32,
        eps: saved.eps,
    };
    let b = &saved.blocks;
    let consts = constants(
        b.dtype(),
        saved.query.dtype(),
        saved.norm.dtype(),
        dh.dtype(),
        dv_dtype,
    );
    let buffers = [
        b.buffer(),
        saved.query.buffer(),
        saved.norm.buffer(),
        dh.buffer(),
        saved.stats.buffer(),
        dv.buffer(),
        partials.buffer(),
    ];
    engine.launch(&KERNEL, "backward", &consts, &params, &buffers, rows as u64)?;
    let sums = reduce::sum_partials(engine, &partials)?;
    Ok(AttnResGradients {
        blocks: crate::cast::cast(&dv, dtype)?,
        query: crate::cast::cast(&sums.f32_range(0, &[d], "attn_res d w_query")?, dtype)?,
        norm: crate::cast::cast(&sums.f32_range(d, &[d], "attn_res d w_norm")?, dtype)?,
    })
}
