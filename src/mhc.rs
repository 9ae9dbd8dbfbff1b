//! Manifold-constrained hyper-connections (mHC, Liger-Kernel's): the residual stream widened to
//! `n` parallel streams, mixed between layers by per-token coefficients. Input `x` is
//! `[..tokens, n, C]` (n = HC streams of width C, any leading token axes, N tokens in all);
//! `x_mat` is a token's row of `K = n·C` values. Three operators, each a forward and a backward:
//!
//! * [`mhc_coefficients`] (`M = n² + 2n` columns of `phi [K, M]`, bias `b [M]`, three scalar
//!   gains α given as one-element tensors `[1]`):
//!   `r = 1/sqrt(mean(x_mat²) + rms_eps)`, `mix = (x_mat · phi) · r` (the stored x as it is: no
//!   rounding of a normalized row; the product in FP32),
//!   `h_pre = sigmoid(α_pre·mix[..n] + b[..n]) + pre_eps`,
//!   `h_post = post_mult · sigmoid(α_post·mix[n..2n] + b[n..2n])`,
//!   `h_res = Sinkhorn(α_res·mix[2n..] + b[2n..])` over the logits as an `n × n` matrix `L`
//!   (row `o` = output stream, column `i` = input stream): the row softmax `P` (row maximum
//!   subtracted), `Y₀ = (P + ε) / (colsum(P + ε) + ε)`, then `tmax − 1` times
//!   `R = Y / (rowsum(Y) + ε)`, `Y = R / (colsum(R) + ε)` (ε = `sinkhorn_eps`), so `tmax` column
//!   normalizations in all and `h_res` nearly doubly stochastic. Outputs F32 `[..tokens, n]`,
//!   `[..tokens, n]`, `[..tokens, n, n]`.
//! * [`mhc_pre`]: `out[t, c] = Σ_i h_pre[t, i] · x[t, i, c]`, `[..tokens, C]` in x's dtype.
//! * [`mhc_post_res`]: `out[t, o, c] = Σ_i h_res[t, o, i] · x[t, i, c] + h_post[t, o] · f[t, c]`,
//!   x's shape and dtype (`f_out [..tokens, C]` of any float dtype).
//!
//! Outputs in a 16-bit dtype are the FP32 sums rounded once (an odd C goes through an F32
//! temporary narrowed by [`cast::cast`]).
//!
//! # Gradients
//!
//! Every gradient is F32 and exact for the forward as computed (no straight-through terms);
//! the `*_backward_as` entry points give them in F16 / BF16, bit for bit the F32 ones cast.
//! [`mhc_coefficients_backward`] takes each of `dh_pre`, `dh_post`, `dh_res` as an `Option`
//! (`None` counts as zero) and returns the gradients of x, phi, b and the three α (`[1]` each,
//! matching the α tensors). With `g` the logits' gradients (the sigmoids' derivatives; Sinkhorn's
//! steps walked back, each normalization `Y = R / d` giving `g_R = (g_Y − Σ g_Y·Y) / d` over the
//! normalized axis, the softmax `g_L = P (g_P − Σ_row g_P·P)`), `g_mix = α·g` per segment,
//! `dz = r · g_mix`: `dphi = x_matᵀ · dz`, `dx = dz · phiᵀ − (r² Σ_m g_mix·mix / K) · x_mat`,
//! `db = Σ_tokens g`, `dα_seg = Σ_tokens Σ_seg g·mix`. The token sums of db and the α are
//! per-token rows added in row order by [`reduce::sum_partials`]; the two products are
//! [`matmul::gemm`] calls (fixed-order FP32 sums). No atomics: two runs give the same bits.
//!
//! The Sinkhorn backward **recomputes** the iterations from the saved `mix` (the same code as
//! the forward, so the same values) and keeps each step's matrix and denominators in scratch
//! for the backward walk: `N · (tmax·M + 1)` F32 values of workspace during the backward only,
//! nothing extra held between forward and backward (the forward saves `mix [N, M]` and `r [N]`).
//! [`mhc_coefficients_backward_workspace_bytes`] gives the scratch.
//!
//! [`mhc_pre_backward`] gives dx (`h_pre ⊙ g`) and dh_pre (`Σ_c g·x_i`), [`mhc_post_res_backward`]
//! dx, df_out, dh_post and dh_res, all F32 and per token (no cross-token sums).
//!
//! # Bounds and errors
//!
//! `1 ≤ n ≤` [`MAX_STREAMS`], `C ≥ 1`, any N ≥ 0 (zero tokens: empty outputs and zero parameter
//! gradients). `x` has at least two axes (`[n, C]` alone is one token). `phi` must be
//! `[n·C, n² + 2n]`, `b` `[n² + 2n]`, each α `[1]`; `h_pre`/`h_post` `[..tokens, n]` and `h_res`
//! `[..tokens, n, n]` with x's leading axes; `f_out` `[..tokens, C]`; cotangents the output's
//! shape. Options: `tmax` in `1..=`[`MAX_SINKHORN_ITERATIONS`], `rms_eps` and `sinkhorn_eps`
//! positive and finite, `pre_eps` finite and ≥ 0, `post_mult` finite. Every tensor a kernel
//! binds (x, the F32 outputs and gradients, the scratch) within one storage binding
//! ([`crate::Engine::max_binding_bytes`]) and 2³² − 1 elements. Each breach is a typed
//! [`Error`] before anything is launched; scratch beyond the outputs is checked against the
//! engine's workspace bound. Any float dtype (F32, F16, BF16) for every tensor argument,
//! independently.
//!
//! Where Liger leaves it open: the α are taken as tensors of any float dtype (so their gradients
//! are tensors of the same shape), an F32 x is multiplied in full FP32 (not TF32), the
//! coefficients' inputs need not share a dtype, and h inputs of [`mhc_pre`] and
//! [`mhc_post_res`] may be any float dtype.

use crate::engine::Bind;
use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::matmul::{self, Gemm, GemmOperand};
use crate::{DType, Engine, Error, Result, Tensor, cast, reduce};

/// `wgsl/mhc.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "mhc",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        "const WG: u32 = 256u;",
        include_str!("../wgsl/mhc.wgsl"),
    ],
};

/// The most streams (HC) a call takes.
pub const MAX_STREAMS: usize = 16;

/// The most Sinkhorn–Knopp iterations ([`MhcOptions::tmax`]) a call takes.
pub const MAX_SINKHORN_ITERATIONS: u32 = 256;

/// Options of [`mhc_coefficients`] (Liger's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MhcOptions {
    /// Column normalizations of the Sinkhorn–Knopp projection, 1..=[`MAX_SINKHORN_ITERATIONS`]
    /// (default 20).
    pub tmax: u32,
    /// ε of the RMS scale `r`, positive and finite (default 1e-6).
    pub rms_eps: f32,
    /// Added to `h_pre` after the sigmoid, finite and ≥ 0 (default 0).
    pub pre_eps: f32,
    /// ε of the Sinkhorn–Knopp steps, positive and finite (default 1e-6).
    pub sinkhorn_eps: f32,
    /// Scale of `h_post`'s sigmoid, finite (default 2).
    pub post_mult: f32,
}

impl Default for MhcOptions {
    fn default() -> Self {
        MhcOptions {
            tmax: 20,
            rms_eps: 1e-6,
            pre_eps: 0.0,
            sinkhorn_eps: 1e-6,
            post_mult: 2.0,
        }
    }
}

#[derive(encase::ShaderType)]
struct Params {
    tokens: u32,
    hc: u32,
    c: u32,
    m: u32,
    tmax: u32,
    flags: u32,
    stride: u32,
    base: u32,
    rms_eps: f32,
    pre_eps: f32,
    sinkhorn_eps: f32,
    post_mult: f32,
}

/// The three coefficient tensors of [`mhc_coefficients`], F32.
#[derive(Debug, Clone)]
pub struct MhcCoefficients {
    /// `[..tokens, n]`.
    pub h_pre: Tensor,
    /// `[..tokens, n]`.
    pub h_post: Tensor,
    /// `[..tokens, n, n]`, row = output stream, column = input stream.
    pub h_res: Tensor,
}

/// What [`mhc_coefficients_backward`] needs: the inputs (handles), the scaled `mix` (F32
/// `[N, M]`) and the RMS scales `r` (F32 `[N]`), the options.
#[derive(Debug, Clone)]
pub struct MhcCoefficientsSaved {
    x: Tensor,
    phi: Tensor,
    b: Tensor,
    alphas: [Tensor; 3],
    mix: Tensor,
    invr: Tensor,
    options: MhcOptions,
}

impl MhcCoefficientsSaved {
    /// `mix = (x_mat · phi) · r`, F32 `[N, M]`.
    pub fn mix(&self) -> &Tensor {
        &self.mix
    }

    /// The RMS scales `r = 1/sqrt(mean(x_mat²) + rms_eps)`, F32 `[N]`.
    pub fn inverse_rms(&self) -> &Tensor {
        &self.invr
    }
}

/// The gradients of [`mhc_coefficients_backward`], F32.
#[derive(Debug, Clone)]
pub struct MhcCoefficientsGradients {
    /// d x, x's shape.
    pub x: Tensor,
    /// d phi, `[n·C, M]`.
    pub phi: Tensor,
    /// d b, `[M]`.
    pub b: Tensor,
    /// d α_pre, `[1]`.
    pub alpha_pre: Tensor,
    /// d α_post, `[1]`.
    pub alpha_post: Tensor,
    /// d α_res, `[1]`.
    pub alpha_res: Tensor,
}

/// What [`mhc_pre_backward`] needs.
#[derive(Debug, Clone)]
pub struct MhcPreSaved {
    x: Tensor,
    h_pre: Tensor,
}

/// The gradients of [`mhc_pre_backward`], F32.
#[derive(Debug, Clone)]
pub struct MhcPreGradients {
    /// d x, x's shape.
    pub x: Tensor,
    /// d h_pre, `[..tokens, n]`.
    pub h_pre: Tensor,
}

/// What [`mhc_post_res_backward`] needs.
#[derive(Debug, Clone)]
pub struct MhcPostResSaved {
    x: Tensor,
    f_out: Tensor,
    h_post: Tensor,
    h_res: Tensor,
}

/// The gradients of [`mhc_post_res_backward`], F32.
#[derive(Debug, Clone)]
pub struct MhcPostResGradients {
    /// d x, x's shape.
    pub x: Tensor,
    /// d f_out, `[..tokens, C]`.
    pub f_out: Tensor,
    /// d h_post, `[..tokens, n]`.
    pub h_post: Tensor,
    /// d h_res, `[..tokens, n, n]`.
    pub h_res: Tensor,
}

/// x's extents: (tokens N, streams n, width C).
#[derive(Debug, Clone, Copy)]
struct Dims {
    tokens: usize,
    n: usize,
    c: usize,
}

impl Dims {
    fn m(self) -> usize {
        self.n * self.n + 2 * self.n
    }

    fn k(self) -> usize {
        self.n * self.c
    }
}

fn float_input(t: &Tensor, engine: &Engine, what: &str) -> Result<()> {
    t.check_engine(engine, what)?;
    if !t.dtype().is_float() {
        return Err(Error::dtype(what, t.dtype(), &DType::FLOATS));
    }
    Ok(())
}

fn expect_shape(t: &Tensor, want: &[usize], what: &str) -> Result<()> {
    if t.shape() != want {
        return Err(Error::shape(what, want, t.shape()));
    }
    Ok(())
}

/// `elements` values of `bytes_each` bytes fit one storage binding and u32 indexing.
fn fits(engine: &Engine, what: &str, elements: usize, bytes_each: usize) -> Result<()> {
    let elements = elements as u64;
    if elements > u64::from(u32::MAX) {
        return Err(Error::bounds(
            format!("{what}: elements"),
            elements,
            0,
            u32::MAX.into(),
        ));
    }
    let bytes = elements * bytes_each as u64;
    let limit = engine.max_binding_bytes();
    if bytes > limit {
        return Err(Error::LimitExceeded {
            what: what.into(),
            bytes,
            limit,
            limit_name: "max_storage_buffer_binding_size",
        });
    }
    Ok(())
}

/// x: float, on `engine`, `[..tokens, n, C]` within the bounds; its F32 copy (gradients) fits.
fn check_x(x: &Tensor, engine: &Engine, what: &str) -> Result<Dims> {
    float_input(x, engine, &format!("{what}: x"))?;
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(Error::shape(
            format!("{what}: x [..tokens, HC, C]"),
            &[1, 1],
            shape,
        ));
    }
    let (n, c) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    if n == 0 || n > MAX_STREAMS {
        return Err(Error::bounds(
            format!("{what}: streams HC"),
            n as u64,
            1,
            MAX_STREAMS as u64,
        ));
    }
    if c == 0 {
        return Err(Error::bounds(format!("{what}: C"), 0, 1, u32::MAX.into()));
    }
    let tokens = shape[..shape.len() - 2].iter().product();
    fits(engine, &format!("{what}: F32 x"), x.len(), 4)?;
    fits(engine, &format!("{what}: h_res"), tokens * n * n, 4)?;
    Ok(Dims { tokens, n, c })
}

fn lead(x: &Tensor) -> &[usize] {
    &x.shape()[..x.shape().len() - 2]
}

fn with(lead: &[usize], tail: &[usize]) -> Vec<usize> {
    let mut s = lead.to_vec();
    s.extend_from_slice(tail);
    s
}

fn check_options(o: &MhcOptions) -> Result<()> {
    let what = "mhc_coefficients";
    if o.tmax == 0 || o.tmax > MAX_SINKHORN_ITERATIONS {
        return Err(Error::bounds(
            format!("{what}: tmax"),
            o.tmax.into(),
            1,
            MAX_SINKHORN_ITERATIONS.into(),
        ));
    }
    let rules: [(&str, f32, bool, &str); 4] = [
        (
            "rms_eps",
            o.rms_eps,
            o.rms_eps.is_finite() && o.rms_eps > 0.0,
            "positive and finite",
        ),
        (
            "sinkhorn_eps",
            o.sinkhorn_eps,
            o.sinkhorn_eps.is_finite() && o.sinkhorn_eps > 0.0,
            "positive and finite",
        ),
        (
            "pre_eps",
            o.pre_eps,
            o.pre_eps.is_finite() && o.pre_eps >= 0.0,
            "finite and not negative",
        ),
        ("post_mult", o.post_mult, o.post_mult.is_finite(), "finite"),
    ];
    for (name, value, ok, rule) in rules {
        if !ok {
            return Err(Error::InvalidValue {
                what: format!("{what}: {name}"),
                got: f64::from(value),
                rule: rule.into(),
            });
        }
    }
    Ok(())
}

/// Every input of the coefficients checked: x's extents.
fn check_coefficients(
    x: &Tensor,
    phi: &Tensor,
    b: &Tensor,
    alphas: [&Tensor; 3],
    options: &MhcOptions,
) -> Result<Dims> {
    let what = "mhc_coefficients";
    let engine = x.engine();
    let d = check_x(x, engine, what)?;
    float_input(phi, engine, &format!("{what}: phi"))?;
    float_input(b, engine, &format!("{what}: b"))?;
    expect_shape(
        phi,
        &[d.k(), d.m()],
        &format!("{what}: phi [HC·C, HC² + 2·HC]"),
    )?;
    expect_shape(b, &[d.m()], &format!("{what}: b [HC² + 2·HC]"))?;
    for (a, name) in alphas.iter().zip(["alpha_pre", "alpha_post", "alpha_res"]) {
        float_input(a, engine, &format!("{what}: {name}"))?;
        expect_shape(a, &[1], &format!("{what}: {name}"))?;
    }
    check_options(options)?;
    fits(engine, &format!("{what}: phi"), phi.len(), 4)?;
    fits(engine, &format!("{what}: mix"), d.tokens * d.m(), 4)?;
    Ok(d)
}

fn params(d: Dims, options: &MhcOptions, flags: u32) -> Params {
    let m = d.m();
    Params {
        tokens: d.tokens as u32,
        hc: d.n as u32,
        c: d.c as u32,
        m: m as u32,
        tmax: options.tmax,
        flags,
        stride: (options.tmax as usize * m + 1) as u32,
        base: (m + 3) as u32,
        rms_eps: options.rms_eps,
        pre_eps: options.pre_eps,
        sinkhorn_eps: options.sinkhorn_eps,
        post_mult: options.post_mult,
    }
}

/// The dtype override constants in `set`; the others keep their WGSL default (F32).
fn constants(set: &[(&'static str, DType)]) -> Vec<(&'static str, f64)> {
    set.iter().map(|&(k, t)| (k, f64::from(t.code()))).collect()
}

/// The forward's own scratch: the packed b and α.
fn forward_scratch(n: usize) -> u64 {
    ((n * n + 2 * n + 3) * 4) as u64
}

/// The backward's own scratch: the packed b and α with each token's Sinkhorn history and RMS
/// factor, `dz`, the per-token rows of the parameter sums and their finish.
fn backward_scratch(tokens: usize, n: usize, tmax: u32) -> u64 {
    let m = n * n + 2 * n;
    let scratch = (m + 3 + tokens * (tmax as usize * m + 1)) * 4;
    let dz = tokens * m * 4;
    let rows = tokens * (m + 3) * 4;
    (scratch + dz + rows) as u64 + reduce::sum_partial_groups_workspace_bytes(1, tokens, m + 3)
}

/// Scratch bytes of [`mhc_coefficients`] for `tokens` tokens of `n` streams of width `c`: the
/// packed b and α (checked against the workspace bound), and the product's split sums
/// ([`matmul::gemm_workspace_bytes`]; the product keeps them within the bound by itself).
pub fn mhc_coefficients_workspace_bytes(tokens: usize, n: usize, c: usize) -> u64 {
    let m = n * n + 2 * n;
    forward_scratch(n) + matmul::gemm_workspace_bytes(tokens, m, n * c, 1)
}

/// Scratch bytes of [`mhc_coefficients_backward`]: the packed b and α with each token's
/// Sinkhorn history and RMS factor (`tmax·M + 1` values), `dz` and the per-token rows of the
/// parameter sums (`[N, M]`, `[N, M + 3]`) and their finish (these checked against the
/// workspace bound), and the larger of the two products' split sums (kept within the bound by
/// the products themselves).
pub fn mhc_coefficients_backward_workspace_bytes(
    tokens: usize,
    n: usize,
    c: usize,
    tmax: u32,
) -> u64 {
    let (m, k) = (n * n + 2 * n, n * c);
    let gemms = matmul::gemm_workspace_bytes(k, m, tokens, 1)
        .max(matmul::gemm_workspace_bytes(tokens, k, m, 1));
    backward_scratch(tokens, n, tmax) + gemms
}

/// Pack b and the α into the head of `scratch`.
fn pack(
    engine: &Engine,
    b: &Tensor,
    alphas: [&Tensor; 3],
    scratch: &Tensor,
    p: &Params,
) -> Result<()> {
    let consts = constants(&[
        ("DB", b.dtype()),
        ("DA1", alphas[0].dtype()),
        ("DA2", alphas[1].dtype()),
        ("DA3", alphas[2].dtype()),
    ]);
    let buffers = [
        b.buffer(),
        alphas[0].buffer(),
        alphas[1].buffer(),
        alphas[2].buffer(),
        scratch.buffer(),
    ];
    engine.launch(&KERNEL, "pack", &consts, p, &buffers, 1)
}

/// The mHC coefficients `h_pre`, `h_post`, `h_res` of each token of `x` (see the module docs),
/// F32, and the saved context. The α are one-element tensors `[1]`.
///
/// Errors: x of fewer than two axes, HC outside 1..=[`MAX_STREAMS`], C = 0; phi not
/// `[HC·C, HC² + 2·HC]`, b not `[HC² + 2·HC]`, an α not `[1]`; options out of their bounds
/// ([`MhcOptions`]); non-float dtypes; tensors of other engines; extents past one binding;
/// scratch past the workspace bound.
pub fn mhc_coefficients(
    x: &Tensor,
    phi: &Tensor,
    b: &Tensor,
    alpha_pre: &Tensor,
    alpha_post: &Tensor,
    alpha_res: &Tensor,
    options: &MhcOptions,
) -> Result<(MhcCoefficients, MhcCoefficientsSaved)> {
    let alphas = [alpha_pre, alpha_post, alpha_res];
    let d = check_coefficients(x, phi, b, alphas, options)?;
    let engine = x.engine();
    engine.check_workspace("mhc_coefficients", forward_scratch(d.n))?;
    let (m, k) = (d.m(), d.k());
    let lead = lead(x);
    let mix = Tensor::empty(engine, &[d.tokens, m], DType::F32, "mhc mix")?;
    let invr = Tensor::empty(engine, &[d.tokens], DType::F32, "mhc inverse rms")?;
    let h_pre = Tensor::empty(engine, &with(lead, &[d.n]), DType::F32, "mhc h_pre")?;
    let h_post = Tensor::empty(engine, &with(lead, &[d.n]), DType::F32, "mhc h_post")?;
    let h_res = Tensor::empty(engine, &with(lead, &[d.n, d.n]), DType::F32, "mhc h_res")?;
    let saved = |mix: Tensor, invr: Tensor| MhcCoefficientsSaved {
        x: x.clone(),
        phi: phi.clone(),
        b: b.clone(),
        alphas: [alpha_pre.clone(), alpha_post.clone(), alpha_res.clone()],
        mix,
        invr,
        options: *options,
    };
    if d.tokens == 0 {
        return Ok((
            MhcCoefficients {
                h_pre,
                h_post,
                h_res,
            },
            saved(mix, invr),
        ));
    }
    let p = params(d, options, 0);
    let packed = Tensor::empty(engine, &[m + 3], DType::F32, "mhc packed b and alphas")?;
    pack(engine, b, alphas, &packed, &p)?;
    matmul::gemm(&Gemm::plain(
        GemmOperand::whole(x, false),
        GemmOperand::whole(phi, false),
        &mix,
        (d.tokens, m, k),
        false,
    ))?;
    let consts = constants(&[("DX", x.dtype())]);
    let buffers = [
        x.buffer(),
        packed.buffer(),
        mix.buffer(),
        invr.buffer(),
        h_pre.buffer(),
        h_post.buffer(),
        h_res.buffer(),
    ];
    engine.launch(
        &KERNEL,
        "coeff_forward",
        &consts,
        &p,
        &buffers,
        d.tokens as u64,
    )?;
    Ok((
        MhcCoefficients {
            h_pre,
            h_post,
            h_res,
        },
        saved(mix, invr),
    ))
}

/// The gradients of `⟨dh_pre, h_pre⟩ + ⟨dh_post, h_post⟩ + ⟨dh_res, h_res⟩` with respect to x,
/// phi, b and the three α, F32; an absent cotangent counts as zero.
///
/// Errors: a cotangent not its coefficient's shape, not a float dtype, or of another engine;
/// scratch past the workspace bound or one binding.
pub fn mhc_coefficients_backward(
    saved: &MhcCoefficientsSaved,
    dh_pre: Option<&Tensor>,
    dh_post: Option<&Tensor>,
    dh_res: Option<&Tensor>,
) -> Result<MhcCoefficientsGradients> {
    coefficients_backward_f32(saved, dh_pre, dh_post, dh_res)
}

/// [`mhc_coefficients_backward`] with every gradient in `dtype` (F32, F16 or BF16): the F32
/// gradients cast ([`crate::cast::cast`]; d x is summed in F32 by its product).
///
/// Errors: those of [`mhc_coefficients_backward`]; a `dtype` that is not a float.
pub fn mhc_coefficients_backward_as(
    saved: &MhcCoefficientsSaved,
    dh_pre: Option<&Tensor>,
    dh_post: Option<&Tensor>,
    dh_res: Option<&Tensor>,
    dtype: DType,
) -> Result<MhcCoefficientsGradients> {
    dtype.require_float("mhc_coefficients_backward_as: dtype")?;
    let g = coefficients_backward_f32(saved, dh_pre, dh_post, dh_res)?;
    Ok(MhcCoefficientsGradients {
        x: cast::cast(&g.x, dtype)?,
        phi: cast::cast(&g.phi, dtype)?,
        b: cast::cast(&g.b, dtype)?,
        alpha_pre: cast::cast(&g.alpha_pre, dtype)?,
        alpha_post: cast::cast(&g.alpha_post, dtype)?,
        alpha_res: cast::cast(&g.alpha_res, dtype)?,
    })
}

fn coefficients_backward_f32(
    saved: &MhcCoefficientsSaved,
    dh_pre: Option<&Tensor>,
    dh_post: Option<&Tensor>,
    dh_res: Option<&Tensor>,
) -> Result<MhcCoefficientsGradients> {
    let s = saved;
    let alphas = [&s.alphas[0], &s.alphas[1], &s.alphas[2]];
    let d = check_coefficients(&s.x, &s.phi, &s.b, alphas, &s.options)?;
    let engine = s.x.engine();
    let lead = lead(&s.x);
    let what = "mhc_coefficients_backward";
    let cotangents = [
        (dh_pre, with(lead, &[d.n]), "dh_pre"),
        (dh_post, with(lead, &[d.n]), "dh_post"),
        (dh_res, with(lead, &[d.n, d.n]), "dh_res"),
    ];
    let mut flags = 0;
    for (bit, (g, shape, name)) in cotangents.iter().enumerate() {
        if let Some(g) = g {
            float_input(g, engine, &format!("{what}: {name}"))?;
            expect_shape(g, shape, &format!("{what}: {name}"))?;
            flags |= 1 << bit;
        }
    }
    let (m, k, tmax) = (d.m(), d.k(), s.options.tmax as usize);
    let scratch_len = m + 3 + d.tokens * (tmax * m + 1);
    fits(engine, &format!("{what}: Sinkhorn history"), scratch_len, 4)?;
    fits(engine, &format!("{what}: rows"), d.tokens * (m + 3), 4)?;
    engine.check_workspace(what, backward_scratch(d.tokens, d.n, s.options.tmax))?;
    let dx = Tensor::empty(engine, s.x.shape(), DType::F32, "mhc d x")?;
    if d.tokens == 0 {
        let zero = || Tensor::zeros(engine, &[1], DType::F32);
        return Ok(MhcCoefficientsGradients {
            x: dx,
            phi: Tensor::zeros(engine, &[k, m], DType::F32)?,
            b: Tensor::zeros(engine, &[m], DType::F32)?,
            alpha_pre: zero()?,
            alpha_post: zero()?,
            alpha_res: zero()?,
        });
    }
    let p = params(d, &s.options, flags);
    let scratch = Tensor::empty(engine, &[scratch_len], DType::F32, "mhc backward scratch")?;
    pack(engine, &s.b, alphas, &scratch, &p)?;
    let dz = Tensor::empty(engine, &[d.tokens, m], DType::F32, "mhc dz")?;
    let rows = Tensor::empty(engine, &[d.tokens, m + 3], DType::F32, "mhc rows")?;
    let dtype_of = |g: Option<&Tensor>| g.map_or(DType::F32, Tensor::dtype);
    let consts = constants(&[
        ("DG1", dtype_of(dh_pre)),
        ("DG2", dtype_of(dh_post)),
        ("DG3", dtype_of(dh_res)),
    ]);
    let stand_in = Bind::unused(s.mix.buffer());
    let [b1, b2, b3] =
        [dh_pre, dh_post, dh_res].map(|g| g.map_or(stand_in, |g| Bind::whole(g.buffer())));
    let buffers = [
        b1,
        b2,
        b3,
        Bind::whole(scratch.buffer()),
        Bind::whole(s.mix.buffer()),
        Bind::whole(s.invr.buffer()),
        Bind::whole(dz.buffer()),
        Bind::whole(rows.buffer()),
    ];
    engine.launch_bound(
        &KERNEL,
        "coeff_backward",
        &consts,
        &p,
        &buffers,
        d.tokens as u64,
    )?;
    let consts = constants(&[("DX", s.x.dtype())]);
    let buffers = [s.x.buffer(), scratch.buffer(), dx.buffer()];
    engine.launch(&KERNEL, "coeff_dx", &consts, &p, &buffers, d.tokens as u64)?;
    // dx += dz · phiᵀ (phi stored [K, M] = the transpose of the [M, K] operand).
    matmul::gemm(&Gemm::plain(
        GemmOperand::whole(&dz, false),
        GemmOperand::whole(&s.phi, true),
        &dx,
        (d.tokens, k, m),
        true,
    ))?;
    // dphi = x_matᵀ · dz (x stored [N, K] = the transpose of the [K, N] operand).
    let dphi = Tensor::empty(engine, &[k, m], DType::F32, "mhc d phi")?;
    matmul::gemm(&Gemm::plain(
        GemmOperand::whole(&s.x, true),
        GemmOperand::whole(&dz, false),
        &dphi,
        (k, m, d.tokens),
        false,
    ))?;
    let sums = reduce::sum_partials(engine, &rows)?;
    Ok(MhcCoefficientsGradients {
        x: dx,
        phi: dphi,
        b: sums.f32_range(0, &[m], "mhc d b")?,
        alpha_pre: sums.f32_range(m, &[1], "mhc d alpha_pre")?,
        alpha_post: sums.f32_range(m + 1, &[1], "mhc d alpha_post")?,
        alpha_res: sums.f32_range(m + 2, &[1], "mhc d alpha_res")?,
    })
}

/// Check an h input: float, on `engine`, of shape `want`.
fn check_h(h: &Tensor, engine: &Engine, want: &[usize], what: &str) -> Result<()> {
    float_input(h, engine, what)?;
    expect_shape(h, want, what)
}

/// Check a cotangent `g` of an output of shape `want`.
fn check_cotangent(g: &Tensor, engine: &Engine, want: &[usize], what: &str) -> Result<()> {
    float_input(g, engine, what)?;
    expect_shape(g, want, what)
}

/// Run `entry` into an output of `shape` in x's dtype: directly where each lane owns whole
/// words (F32, or an even C), else into F32 and narrowed.
fn mixed_output(
    x: &Tensor,
    shape: &[usize],
    c: usize,
    label: &str,
    run: impl FnOnce(&Tensor, DType) -> Result<()>,
) -> Result<Tensor> {
    let dt = x.dtype();
    let direct = dt == DType::F32 || c.is_multiple_of(2);
    let out_dt = if direct { dt } else { DType::F32 };
    let out = Tensor::empty(x.engine(), shape, out_dt, label)?;
    run(&out, out_dt)?;
    if direct {
        Ok(out)
    } else {
        cast::cast(&out, dt)
    }
}

/// `out[t, c] = Σ_i h_pre[t, i] · x[t, i, c]`, `[..tokens, C]` in x's dtype, and the saved
/// context.
///
/// Errors: x as for [`mhc_coefficients`]; h_pre not `[..tokens, HC]` (x's leading axes), a
/// non-float dtype, tensors of other engines.
pub fn mhc_pre(x: &Tensor, h_pre: &Tensor) -> Result<(Tensor, MhcPreSaved)> {
    let what = "mhc_pre";
    let engine = x.engine();
    let d = check_x(x, engine, what)?;
    check_h(
        h_pre,
        engine,
        &with(lead(x), &[d.n]),
        &format!("{what}: h_pre"),
    )?;
    let out_shape = with(lead(x), &[d.c]);
    let p = params(d, &MhcOptions::default(), 0);
    let out = mixed_output(x, &out_shape, d.c, "mhc_pre output", |out, out_dt| {
        let consts = constants(&[("DX", x.dtype()), ("DH1", h_pre.dtype()), ("DO", out_dt)]);
        let buffers = [x.buffer(), h_pre.buffer(), out.buffer()];
        engine.launch(
            &KERNEL,
            "pre_forward",
            &consts,
            &p,
            &buffers,
            d.tokens as u64,
        )
    })?;
    let saved = MhcPreSaved {
        x: x.clone(),
        h_pre: h_pre.clone(),
    };
    Ok((out, saved))
}

/// The gradients of `⟨d_out, out⟩` of [`mhc_pre`] with respect to x and h_pre, F32.
///
/// Errors: `d_out` not the output's shape, not a float dtype, or of another engine.
pub fn mhc_pre_backward(saved: &MhcPreSaved, d_out: &Tensor) -> Result<MhcPreGradients> {
    pre_backward_in(saved, d_out, DType::F32, "mhc_pre_backward")
}

/// [`mhc_pre_backward`] with both gradients in `dtype` (F32, F16 or BF16), bit for bit the F32
/// ones cast: d x written in 16 bits by the kernel for an even C (no F32 copy), d h_pre cast.
///
/// Errors: those of [`mhc_pre_backward`]; a `dtype` that is not a float.
pub fn mhc_pre_backward_as(
    saved: &MhcPreSaved,
    d_out: &Tensor,
    dtype: DType,
) -> Result<MhcPreGradients> {
    let what = "mhc_pre_backward_as";
    dtype.require_float(format!("{what}: dtype"))?;
    pre_backward_in(saved, d_out, dtype, what)
}

/// The dtype a kernel writes a `[.., C]`-rowed gradient in: `dtype` where its rows are whole
/// words (F32, or an even C), else F32 (cast afterwards).
fn row_gradient_dtype(dtype: DType, c: usize) -> DType {
    if c.is_multiple_of(2) {
        dtype
    } else {
        DType::F32
    }
}

fn pre_backward_in(
    saved: &MhcPreSaved,
    d_out: &Tensor,
    dtype: DType,
    what: &str,
) -> Result<MhcPreGradients> {
    let (x, h) = (&saved.x, &saved.h_pre);
    let engine = x.engine();
    let d = check_x(x, engine, what)?;
    check_cotangent(
        d_out,
        engine,
        &with(lead(x), &[d.c]),
        &format!("{what}: d_out"),
    )?;
    let dx_dtype = row_gradient_dtype(dtype, d.c);
    let dx = Tensor::empty(engine, x.shape(), dx_dtype, "mhc_pre d x")?;
    let dh = Tensor::empty(engine, h.shape(), DType::F32, "mhc_pre d h_pre")?;
    let p = params(d, &MhcOptions::default(), 0);
    let consts = constants(&[
        ("DX", x.dtype()),
        ("DH1", h.dtype()),
        ("DG1", d_out.dtype()),
        ("DO", dx_dtype),
    ]);
    let buffers = [
        x.buffer(),
        h.buffer(),
        d_out.buffer(),
        dh.buffer(),
        dx.buffer(),
    ];
    engine.launch(
        &KERNEL,
        "pre_backward",
        &consts,
        &p,
        &buffers,
        d.tokens as u64,
    )?;
    Ok(MhcPreGradients {
        x: cast::cast(&dx, dtype)?,
        h_pre: cast::cast(&dh, dtype)?,
    })
}

/// `out[t, o, c] = Σ_i h_res[t, o, i] · x[t, i, c] + h_post[t, o] · f_out[t, c]`, x's shape
/// and dtype, and the saved context.
///
/// Errors: x as for [`mhc_coefficients`]; f_out not `[..tokens, C]`, h_post not
/// `[..tokens, HC]`, h_res not `[..tokens, HC, HC]` (x's leading axes); non-float dtypes;
/// tensors of other engines.
pub fn mhc_post_res(
    x: &Tensor,
    f_out: &Tensor,
    h_post: &Tensor,
    h_res: &Tensor,
) -> Result<(Tensor, MhcPostResSaved)> {
    let what = "mhc_post_res";
    let engine = x.engine();
    let d = check_x(x, engine, what)?;
    let lead = lead(x);
    check_h(
        f_out,
        engine,
        &with(lead, &[d.c]),
        &format!("{what}: f_out"),
    )?;
    check_h(
        h_post,
        engine,
        &with(lead, &[d.n]),
        &format!("{what}: h_post"),
    )?;
    check_h(
        h_res,
        engine,
        &with(lead, &[d.n, d.n]),
        &format!("{what}: h_res"),
    )?;
    let p = params(d, &MhcOptions::default(), 0);
    let out = mixed_output(x, x.shape(), d.c, "mhc_post_res output", |out, out_dt| {
        let consts = constants(&[
            ("DX", x.dtype()),
            ("DF", f_out.dtype()),
            ("DH2", h_post.dtype()),
            ("DH3", h_res.dtype()),
            ("DO", out_dt),
        ]);
        let buffers = [
            x.buffer(),
            f_out.buffer(),
            h_post.buffer(),
            h_res.buffer(),
            out.buffer(),
        ];
        engine.launch(
            &KERNEL,
            "post_forward",
            &consts,
            &p,
            &buffers,
            d.tokens as u64,
        )
    })?;
    let saved = MhcPostResSaved {
        x: x.clone(),
        f_out: f_out.clone(),
        h_post: h_post.clone(),
        h_res: h_res.clone(),
    };
    Ok((out, saved))
}

/// The gradients of `⟨d_out, out⟩` of [`mhc_post_res`] with respect to x, f_out, h_post and
/// h_res, F32.
///
/// Errors: `d_out` not x's shape, not a float dtype, or of another engine.
pub fn mhc_post_res_backward(
    saved: &MhcPostResSaved,
    d_out: &Tensor,
) -> Result<MhcPostResGradients> {
    post_res_backward_in(saved, d_out, DType::F32, "mhc_post_res_backward")
}

/// [`mhc_post_res_backward`] with every gradient in `dtype` (F32, F16 or BF16), bit for bit the
/// F32 ones cast: d x and d f_out written in 16 bits by the kernel for an even C (no F32
/// copies), d h_post and d h_res cast.
///
/// Errors: those of [`mhc_post_res_backward`]; a `dtype` that is not a float.
pub fn mhc_post_res_backward_as(
    saved: &MhcPostResSaved,
    d_out: &Tensor,
    dtype: DType,
) -> Result<MhcPostResGradients> {
    let what = "mhc_post_res_backward_as";
    dtype.require_float(format!("{what}: dtype"))?;
    post_res_backward_in(saved, d_out, dtype, what)
}

fn post_res_backward_in(
    saved: &MhcPostResSaved,
    d_out: &Tensor,
    dtype: DType,
    what: &str,
) -> Result<MhcPostResGradients> {
    let s = saved;
    let x = &s.x;
    let engine = x.engine();
    let d = check_x(x, engine, what)?;
    check_cotangent(d_out, engine, x.shape(), &format!("{what}: d_out"))?;
    fits(engine, &format!("{what}: F32 d f_out"), s.f_out.len(), 4)?;
    let dx_dtype = row_gradient_dtype(dtype, d.c);
    let dx = Tensor::empty(engine, x.shape(), dx_dtype, "mhc_post_res d x")?;
    let df = Tensor::empty(engine, s.f_out.shape(), dx_dtype, "mhc_post_res d f_out")?;
    let dpost = Tensor::empty(engine, s.h_post.shape(), DType::F32, "mhc d h_post")?;
    let dres = Tensor::empty(engine, s.h_res.shape(), DType::F32, "mhc d h_res")?;
    let p = params(d, &MhcOptions::default(), 0);
    let consts = constants(&[
        ("DX", x.dtype()),
        ("DF", s.f_out.dtype()),
        ("DH2", s.h_post.dtype()),
        ("DH3", s.h_res.dtype()),
        ("DG1", d_out.dtype()),
        ("DO", dx_dtype),
    ]);
    let buffers = [
        s.h_post.buffer(),
        s.h_res.buffer(),
        d_out.buffer(),
        dx.buffer(),
        df.buffer(),
    ];
    let groups = d.tokens as u64;
    engine.launch(&KERNEL, "post_backward_x", &consts, &p, &buffers, groups)?;
    let buffers = [
        x.buffer(),
        s.f_out.buffer(),
        d_out.buffer(),
        dpost.buffer(),
        dres.buffer(),
    ];
    engine.launch(&KERNEL, "post_backward_h", &consts, &p, &buffers, groups)?;
    Ok(MhcPostResGradients {
        x: cast::cast(&dx, dtype)?,
        f_out: cast::cast(&df, dtype)?,
        h_post: cast::cast(&dpost, dtype)?,
        h_res: cast::cast(&dres, dtype)?,
    })
}
