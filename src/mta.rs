//! Multi-token attention (Liger-Kernel's): a 2-D convolution over the causal attention
//! probabilities of each head, `y = mask₀(conv2d(act(mask₋∞(scores)), W, b))`.
//!
//! Scores are `[batch, c_in, L, L]` (query rows, key columns); `mask₋∞` sets the future
//! (column > row) to −1e9, `act` is the softmax (or, with `sparse`, the sparsemax) over the
//! last axis (so the future gets probability 0), the convolution has weight
//! `[c_out, c_in / groups, kh, kw]`, an optional bias `[c_out]`, stride, padding and dilation
//! per axis and groups (PyTorch's `conv2d`), and `mask₀` zeroes the output's future. The
//! output is square (`[batch, c_out, L', L']`, `L' = ⌊(L + 2p − d(k − 1) − 1)/s⌋ + 1` on both
//! axes).
//!
//! Backward: from the output cotangent G (its future zeroed): dP = the transposed convolution
//! of G, dW = Σ G·P and db = Σ G (partial sums over blocks of an output row's
//! [`PARTIAL_COLUMNS`] columns, rows batch-major, added in block order by
//! `reduce::sum_partials`: no atomics), and the scores' gradient by
//! the activation's backward (softmax: `P ⊙ (dP − Σ dP·P)`, 0 in the future since P is; sparsemax:
//! over its support). Probabilities, statistics and arithmetic FP32; the output in the scores'
//! dtype; every gradient F32.
//!
//! With a stride and dilation of 1 along the rows and at most 8 taps a row (the usual 3 × 3
//! kernel), the convolutions take four outputs of a row an invocation, each tap row read once
//! as a window, and the parameter partials one invocation per tap row (its slots at once, a
//! window of probabilities sliding along the row); every value adds the same terms in the same
//! order as one at a time, so the bits do not depend on the path ([`force_single_taps`]).

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, Kernel};
use crate::loss::{self, SparsemaxSaved};
use crate::{DType, Error, Result, Tensor};

/// `wgsl/mta.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "mta",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        include_str!("../wgsl/mta.wgsl"),
    ],
};

const WG: u64 = 256;
/// Outputs an invocation of `conv_forward` and `conv_input_grad` computes.
const QUAD: usize = 4;
/// The most taps along a row that the windowed path takes (`MAX_ROW_TAPS` in the kernel).
const MAX_ROW_TAPS: usize = 8;

/// Output rows (of `batch · L'`) a block of the parameter partials sums.
pub const BLOCK_ROWS: usize = 1;

/// Output columns a block of the parameter partials sums (`PARTIAL_COLS` of the kernel): a
/// block is [`BLOCK_ROWS`] rows × this many columns, so that long rows give more, shorter sums.
pub const PARTIAL_COLUMNS: usize = 256;

/// Blocks of the parameter partials: row blocks × column segments.
fn partial_blocks(batch: usize, out_side: usize) -> (usize, usize) {
    let segments = out_side.div_ceil(PARTIAL_COLUMNS).max(1);
    ((batch * out_side).div_ceil(BLOCK_ROWS) * segments, segments)
}

/// The convolution's settings (PyTorch's `conv2d` arguments, `[height, width]`) and the
/// activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtaOptions {
    /// Stride per axis, ≥ 1 (default 1).
    pub stride: [usize; 2],
    /// Zero padding per axis (default 0).
    pub padding: [usize; 2],
    /// Dilation per axis, ≥ 1 (default 1).
    pub dilation: [usize; 2],
    /// Groups, dividing both channel counts (default 1).
    pub groups: usize,
    /// Sparsemax instead of softmax (default false).
    pub sparse: bool,
}

impl Default for MtaOptions {
    fn default() -> Self {
        MtaOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            sparse: false,
        }
    }
}

/// The shapes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dims {
    batch: usize,
    c_in: usize,
    c_out: usize,
    side: usize,
    out_side: usize,
    kh: usize,
    kw: usize,
}

impl Dims {
    fn weights(&self, groups: usize) -> usize {
        self.c_out * (self.c_in / groups) * self.kh * self.kw
    }
}

#[derive(encase::ShaderType)]
struct Params {
    batch: u32,
    c_in: u32,
    c_out: u32,
    side: u32,
    out_side: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    groups: u32,
    count: u32,
    quads: u32,
    blocks: u32,
    block_rows: u32,
    units: u32,
    segments: u32,
}

/// What the backward needs: the probabilities (F32), the weight and bias, the settings.
#[derive(Debug, Clone)]
pub struct MtaSaved {
    probs: Tensor,
    sparse: Option<SparsemaxSaved>,
    weight: Tensor,
    bias: Option<Tensor>,
    options: MtaOptions,
    dims: Dims,
    out_dtype: DType,
}

impl MtaSaved {
    /// The probabilities `act(mask₋∞(scores))`, F32 `[batch, c_in, L, L]`.
    pub fn probabilities(&self) -> &Tensor {
        &self.probs
    }
}

/// The gradients of [`multi_token_attention_backward`], F32.
#[derive(Debug, Clone)]
pub struct MtaGradients {
    /// d scores, `[batch, c_in, L, L]` (0 in the future).
    pub scores: Tensor,
    /// d weight, `[c_out, c_in / groups, kh, kw]`.
    pub weight: Tensor,
    /// d bias, `[c_out]` (when the forward had a bias).
    pub bias: Option<Tensor>,
}

fn out_len(side: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = side.checked_add(2 * p)?;
    Some(padded.checked_sub(span)? / s + 1)
}

fn check(scores: &Tensor, weight: &Tensor, bias: Option<&Tensor>, o: &MtaOptions) -> Result<Dims> {
    let what = "multi_token_attention";
    let engine = scores.engine();
    weight.check_engine(engine, "multi_token_attention: weight")?;
    for (t, name) in [
        (Some(scores), "scores"),
        (Some(weight), "weight"),
        (bias, "bias"),
    ] {
        if let Some(t) = t {
            if !t.dtype().is_float() {
                return Err(Error::dtype(
                    format!("{what}: {name}"),
                    t.dtype(),
                    &DType::FLOATS,
                ));
            }
        }
    }
    let [batch, c_in, l, l2] = scores.shape() else {
        return Err(Error::shape(
            format!("{what}: scores [batch, c_in, L, L]"),
            &[1, 1, 1, 1],
            scores.shape(),
        ));
    };
    if l != l2 {
        return Err(Error::shape(
            format!("{what}: scores (square planes)"),
            &[*batch, *c_in, *l, *l],
            scores.shape(),
        ));
    }
    let [c_out, cin_g, kh, kw] = weight.shape() else {
        return Err(Error::shape(
            format!("{what}: weight [c_out, c_in / groups, kh, kw]"),
            &[1, 1, 1, 1],
            weight.shape(),
        ));
    };
    let g = o.groups;
    if g == 0 || c_in % g != 0 || c_out % g != 0 {
        return Err(Error::InvalidValue {
            what: format!("{what}: groups"),
            got: g as f64,
            rule: format!("≥ 1 and dividing c_in = {c_in} and c_out = {c_out}"),
        });
    }
    if *cin_g != c_in / g || *kh == 0 || *kw == 0 || *c_out == 0 {
        return Err(Error::shape(
            format!("{what}: weight"),
            &[(*c_out).max(1), c_in / g, (*kh).max(1), (*kw).max(1)],
            weight.shape(),
        ));
    }
    if let Some(b) = bias {
        b.check_engine(engine, "multi_token_attention: bias")?;
        if b.shape() != [*c_out] {
            return Err(Error::shape(format!("{what}: bias"), &[*c_out], b.shape()));
        }
    }
    for (name, v) in [("stride", o.stride), ("dilation", o.dilation)] {
        for x in v {
            if x == 0 {
                return Err(Error::bounds(
                    format!("{what}: {name}"),
                    0,
                    1,
                    u32::MAX.into(),
                ));
            }
        }
    }
    let oh = out_len(*l, *kh, o.stride[0], o.padding[0], o.dilation[0]);
    let ow = out_len(*l, *kw, o.stride[1], o.padding[1], o.dilation[1]);
    let (Some(oh), Some(ow)) = (oh, ow) else {
        return Err(Error::InvalidValue {
            what: format!("{what}: kernel"),
            got: (*kh).max(*kw) as f64,
            rule: format!("the dilated kernel must fit the padded side {l}"),
        });
    };
    if oh != ow {
        return Err(Error::shape(
            format!("{what}: output (square planes)"),
            &[oh, oh],
            &[oh, ow],
        ));
    }
    let dims = Dims {
        batch: *batch,
        c_in: *c_in,
        c_out: *c_out,
        side: *l,
        out_side: oh,
        kh: *kh,
        kw: *kw,
    };
    let biggest = (batch * c_in * l * l).max(batch * c_out * oh * oh);
    if biggest > u32::MAX as usize
        || o.padding
            .iter()
            .chain(&o.stride)
            .chain(&o.dilation)
            .any(|&v| v > 1 << 20)
    {
        return Err(Error::bounds(
            format!("{what}: elements or settings"),
            biggest as u64,
            0,
            u32::MAX.into(),
        ));
    }
    Ok(dims)
}

fn params(d: &Dims, o: &MtaOptions, count: usize, blocks: usize) -> Params {
    Params {
        batch: d.batch as u32,
        c_in: d.c_in as u32,
        c_out: d.c_out as u32,
        side: d.side as u32,
        out_side: d.out_side as u32,
        kh: d.kh as u32,
        kw: d.kw as u32,
        sh: o.stride[0] as u32,
        sw: o.stride[1] as u32,
        ph: o.padding[0] as u32,
        pw: o.padding[1] as u32,
        dh: o.dilation[0] as u32,
        dw: o.dilation[1] as u32,
        groups: o.groups as u32,
        count: count as u32,
        quads: count.div_ceil(QUAD) as u32,
        blocks: blocks as u32,
        block_rows: BLOCK_ROWS as u32,
        units: count as u32,
        segments: 1,
    }
}

/// Makes launches from the calling thread compute the convolutions one output at a time
/// (`true`) instead of by row windows where they apply (`false`, the default). Both add the
/// same terms in the same order (the same bits); for tests and measurements.
#[doc(hidden)]
pub fn force_single_taps(on: bool) {
    SINGLE_TAPS.with(|f| f.set(on));
}

thread_local! {
    static SINGLE_TAPS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The taps along a row for the row windows (`ROW_TAPS`): `kw` with a stride and dilation of
/// 1 along the rows and `kw ≤ MAX_ROW_TAPS`, else 0 (one output at a time).
fn row_taps(d: &Dims, o: &MtaOptions) -> usize {
    let windowed = o.stride[1] == 1 && o.dilation[1] == 1 && d.kw <= MAX_ROW_TAPS;
    if windowed && !SINGLE_TAPS.with(std::cell::Cell::get) {
        d.kw
    } else {
        0
    }
}

fn constants(
    scores: DType,
    weight: DType,
    bias: Option<DType>,
    dy: DType,
    row_taps: usize,
) -> Vec<(&'static str, f64)> {
    vec![
        ("ROW_TAPS", row_taps as f64),
        ("DS", f64::from(scores.code())),
        ("DW", f64::from(weight.code())),
        ("DB", f64::from(bias.unwrap_or(DType::F32).code())),
        ("DY", f64::from(dy.code())),
        ("HAS_BIAS", f64::from(u8::from(bias.is_some()))),
    ]
}

/// Scratch bytes of a forward (the F32 masked scores, kept as the sparsemax's saved input)
/// and of a backward (dP and the parameter partials) for these shapes.
pub fn multi_token_attention_workspace_bytes(
    batch: usize,
    c_in: usize,
    c_out: usize,
    side: usize,
    out_side: usize,
    weights: usize,
) -> u64 {
    let planes = (batch * c_in * side * side * 4) as u64;
    let (blocks, _) = partial_blocks(batch, out_side);
    let partials = (blocks * (weights + c_out) * 4) as u64;
    planes
        + partials
        + crate::reduce::sum_partial_groups_workspace_bytes(1, blocks, weights + c_out)
}

/// `mask₀(conv2d(act(mask₋∞(scores)), weight, bias))` in the scores' dtype, and the saved
/// context.
///
/// Errors: scores not `[batch, c_in, L, L]`; a weight not `[c_out, c_in / groups, kh, kw]`
/// (nonzero c_out, kh, kw); a bias not `[c_out]`; groups not dividing both channel counts;
/// a stride or dilation of 0; a dilated kernel wider than the padded side; a non-square
/// output; non-float dtypes; tensors of other engines; more than 2³² − 1 elements; scratch
/// past the workspace bound.
pub fn multi_token_attention(
    scores: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: &MtaOptions,
) -> Result<(Tensor, MtaSaved)> {
    let d = check(scores, weight, bias, options)?;
    let engine = scores.engine();
    engine.check_workspace(
        "multi_token_attention",
        multi_token_attention_workspace_bytes(
            d.batch,
            d.c_in,
            d.c_out,
            d.side,
            d.out_side,
            d.weights(options.groups),
        ),
    )?;
    let consts = constants(
        scores.dtype(),
        weight.dtype(),
        bias.map(Tensor::dtype),
        DType::F32,
        row_taps(&d, options),
    );
    let n_in = d.batch * d.c_in * d.side * d.side;
    let masked = Tensor::empty(
        engine,
        &[d.batch * d.c_in * d.side, d.side],
        DType::F32,
        "mta masked scores",
    )?;
    engine.launch(
        &KERNEL,
        "mask_future",
        &consts,
        &params(&d, options, n_in, 0),
        &[scores.buffer(), masked.buffer()],
        (n_in as u64).div_ceil(WG),
    )?;
    let (probs, sparse) = if options.sparse {
        let (p, s) = loss::sparsemax(&masked)?;
        (p, Some(s))
    } else {
        (loss::softmax(&masked)?.0, None)
    };
    drop(masked);
    let probs = probs.reshape(&[d.batch, d.c_in, d.side, d.side])?;
    let so = d.out_side;
    let out = Tensor::empty(
        engine,
        &[d.batch, d.c_out, so, so],
        scores.dtype(),
        "mta output",
    )?;
    let n_out = out.len();
    engine.launch(
        &KERNEL,
        "conv_forward",
        &consts,
        &params(&d, options, n_out, 0),
        &[
            probs.buffer(),
            weight.buffer(),
            bias.unwrap_or(weight).buffer(),
            out.buffer(),
        ],
        (n_out.div_ceil(QUAD) as u64).div_ceil(WG),
    )?;
    let saved = MtaSaved {
        probs,
        sparse,
        weight: weight.clone(),
        bias: bias.cloned(),
        options: *options,
        dims: d,
        out_dtype: scores.dtype(),
    };
    Ok((out, saved))
}

/// The gradients of `⟨dy, y⟩` with respect to the scores, the weight and the bias, F32.
///
/// Errors: `dy` not the output's shape, not a float dtype, or of another engine; scratch past
/// the workspace bound; more than 2³² − 1 invocations of the parameter partials (output rows ×
/// column blocks × weight slots: only for inputs near the element bound with many channels).
pub fn multi_token_attention_backward(saved: &MtaSaved, dy: &Tensor) -> Result<MtaGradients> {
    backward_in(saved, dy, DType::F32, "multi_token_attention_backward")
}

/// [`multi_token_attention_backward`] with every gradient in `dtype` (F32, F16 or BF16), bit
/// for bit the F32 gradients cast ([`crate::cast::cast`]): the scores' gradient written in
/// `dtype` by the softmax backward (the sparsemax's, and the small weight and bias gradients,
/// computed in F32 and cast).
///
/// Errors: those of [`multi_token_attention_backward`]; a `dtype` that is not a float.
pub fn multi_token_attention_backward_as(
    saved: &MtaSaved,
    dy: &Tensor,
    dtype: DType,
) -> Result<MtaGradients> {
    let what = "multi_token_attention_backward_as";
    dtype.require_float(format!("{what}: dtype"))?;
    backward_in(saved, dy, dtype, what)
}

fn backward_in(saved: &MtaSaved, dy: &Tensor, dtype: DType, what: &str) -> Result<MtaGradients> {
    let d = saved.dims;
    let o = &saved.options;
    let engine = saved.probs.engine();
    let dy_what = format!("{what}: dy");
    dy.check_engine(engine, &dy_what)?;
    let so = d.out_side;
    let want = [d.batch, d.c_out, so, so];
    if dy.shape() != want {
        return Err(Error::shape(dy_what, &want, dy.shape()));
    }
    if !dy.dtype().is_float() {
        return Err(Error::dtype(dy_what, dy.dtype(), &DType::FLOATS));
    }
    let weights = d.weights(o.groups);
    engine.check_workspace(
        what,
        multi_token_attention_workspace_bytes(d.batch, d.c_in, d.c_out, d.side, so, weights),
    )?;
    let w = &saved.weight;
    let taps = row_taps(&d, o);
    let consts = constants(
        saved.out_dtype,
        w.dtype(),
        saved.bias.as_ref().map(Tensor::dtype),
        dy.dtype(),
        taps,
    );
    let n_in = d.batch * d.c_in * d.side * d.side;
    let dp = Tensor::empty(
        engine,
        &[d.batch * d.c_in * d.side, d.side],
        DType::F32,
        "mta dP",
    )?;
    engine.launch(
        &KERNEL,
        "conv_input_grad",
        &consts,
        &params(&d, o, n_in, 0),
        &[w.buffer(), dy.buffer(), dp.buffer()],
        (n_in.div_ceil(QUAD) as u64).div_ceil(WG),
    )?;
    let slots = weights + d.c_out;
    // With the row windows an invocation a tap row (its `taps` slots) and one a bias; else one
    // a slot.
    let units = match taps {
        0 => slots,
        t => weights / t + d.c_out,
    };
    let (blocks, segments) = partial_blocks(d.batch, so);
    // The partials' invocations are numbered in 32 bits.
    let invocations = blocks as u64 * units as u64;
    if invocations > u64::from(u32::MAX) {
        return Err(Error::bounds(
            format!("{what}: parameter partial invocations (blocks × units)"),
            invocations,
            0,
            u32::MAX.into(),
        ));
    }
    let (dw, db) = if blocks == 0 {
        (
            Tensor::zeros(engine, w.shape(), DType::F32)?,
            Tensor::zeros(engine, &[d.c_out], DType::F32)?,
        )
    } else {
        let partials = Tensor::empty(
            engine,
            &[blocks, slots],
            DType::F32,
            "mta parameter partials",
        )?;
        engine.launch(
            &KERNEL,
            "conv_param_partials",
            &consts,
            &Params {
                units: units as u32,
                segments: segments as u32,
                ..params(&d, o, slots, blocks)
            },
            &[saved.probs.buffer(), dy.buffer(), partials.buffer()],
            ((blocks * units) as u64).div_ceil(WG),
        )?;
        let sums = crate::reduce::sum_partials(engine, &partials)?;
        (
            sums.f32_range(0, w.shape(), "mta d weight")?,
            sums.f32_range(weights, &[d.c_out], "mta d bias")?,
        )
    };
    let ds = match &saved.sparse {
        Some(s) => crate::cast::cast(&loss::sparsemax_backward(s, &dp)?, dtype)?,
        None => {
            let p = saved.probs.reshape(dp.shape())?;
            loss::softmax_backward_from_output(&p, &dp, false, dtype)?
        }
    };
    Ok(MtaGradients {
        scores: ds.reshape(&[d.batch, d.c_in, d.side, d.side])?,
        weight: crate::cast::cast(&dw, dtype)?,
        bias: match &saved.bias {
            Some(_) => Some(crate::cast::cast(&db, dtype)?),
            None => None,
        },
    })
}
