//! Elementwise activations, unary and gated, forward and backward.
//!
//! * Unary: `y = m_d · act(m_g · x)`.
//! * Gated: `y = m_d · act(m_g · gate) · up` with `gate` and `up` separate tensors of one shape
//!   ([`forward`] with `Some(up)`), or the packed layout ([`packed_forward`]): one tensor
//!   `[.., 2·w]` whose rows are `[gate ‖ up]`, output `[.., w]`, gradient in the packed layout.
//! * `m_g` (gate multiplier) and `m_d` (down multiplier) default to 1: the contract of Liger's
//!   SiLU-multiply with multipliers (Falcon-H1's MLP), `y = m_d·act(m_g·gate)·up`, so
//!   `dgate = m_g·m_d·dy·up·act'(m_g·gate)` and `dup = m_d·dy·act(m_g·gate)`.
//!
//! [`Activation`] names: `silu` (SwiGLU when gated), `sigmoid`, `gelu_tanh` (GeGLU when gated),
//! exact `gelu` (erf), `quick_gelu` (`x·σ(1.702x)`, a different function from tanh-GELU),
//! `relu` (derivative 0 at 0), `relu_squared`, `tanh`.
//!
//! Storage F32, F16 or BF16 for every input (each may differ); the output has the gate's
//! dtype; math is FP32; gradients are F32 ([`backward`]) or rounded once to F16/BF16
//! ([`backward_as`]: 16-bit step kernels write them directly). Any element count, odd and empty
//! included; tensors past one storage binding run in windows of it (units of 16 elements,
//! packed rows), with the one-binding bits. The backward recomputes the activation from the saved inputs.
//! Counts that are multiples of 4 (packed: row widths) run step kernels: 16-byte loads and
//! stores of F32 tensors, 16-byte (every tensor 16-bit, counts multiples of 8) or 8-byte
//! ones of 16-bit tensors, one launch per pass; other counts a per-element kernel. Both
//! compute each element with the same operations in the same order, so they give the same
//! bits.
//!
//! Accuracy: FP32 `exp`/`tanh` of the platform (Metal: `precise::`), and an erf of wgrad's own
//! (Taylor series below 1, a fitted `erfc` tail above; a few f32 ulps, see
//! `wgsl/common/activation.wgsl`).

use crate::engine::Bind;
use crate::kernel::{COMMON_ACTIVATION, COMMON_DTYPE, COMMON_LAUNCH, Kernel};
use crate::tensor::row_windows;
use crate::{DType, Engine, Error, Result, Tensor};
use std::ops::Range;

/// `wgsl/activation.wgsl` (formulas in `wgsl/common/activation.wgsl`).
pub static KERNEL: Kernel = Kernel {
    name: "activation",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_ACTIVATION,
        include_str!("../wgsl/activation.wgsl"),
    ],
};

const WG: u64 = 256;

/// The activation function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x·σ(x)`.
    Silu,
    /// `σ(x) = 1 / (1 + e^−x)`.
    Sigmoid,
    /// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`.
    GeluTanh,
    /// `x·Φ(x) = ½x(1 + erf(x/√2))`.
    Gelu,
    /// `x·σ(1.702x)`.
    QuickGelu,
    /// `max(x, 0)`; derivative 0 at 0.
    Relu,
    /// `max(x, 0)²`.
    ReluSquared,
    /// `tanh(x)`.
    Tanh,
}

impl Activation {
    /// Every activation.
    pub const ALL: [Activation; 8] = [
        Activation::Silu,
        Activation::Sigmoid,
        Activation::GeluTanh,
        Activation::Gelu,
        Activation::QuickGelu,
        Activation::Relu,
        Activation::ReluSquared,
        Activation::Tanh,
    ];

    /// The code the kernel receives (`K_*` in `wgsl/common/activation.wgsl`).
    pub const fn code(self) -> u32 {
        match self {
            Activation::Silu => 0,
            Activation::Sigmoid => 1,
            Activation::GeluTanh => 2,
            Activation::Gelu => 3,
            Activation::QuickGelu => 4,
            Activation::Relu => 5,
            Activation::ReluSquared => 6,
            Activation::Tanh => 7,
        }
    }

    /// snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::Sigmoid => "sigmoid",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Gelu => "gelu",
            Activation::QuickGelu => "quick_gelu",
            Activation::Relu => "relu",
            Activation::ReluSquared => "relu_squared",
            Activation::Tanh => "tanh",
        }
    }
}

/// Options of every activation call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationOptions {
    /// `m_g`: the activation sees `m_g·gate`. Default 1. Must be finite.
    pub gate_multiplier: f32,
    /// `m_d`: the output is scaled by `m_d`. Default 1. Must be finite.
    pub down_multiplier: f32,
}

impl Default for ActivationOptions {
    fn default() -> Self {
        ActivationOptions {
            gate_multiplier: 1.0,
            down_multiplier: 1.0,
        }
    }
}

/// Which layout a forward used.
#[derive(Debug, Clone)]
enum Inputs {
    Unary(Tensor),
    Gated(Tensor, Tensor),
    Packed(Tensor),
}

/// What a forward saves for its backward (the input handles; tensors are immutable).
#[derive(Debug, Clone)]
pub struct ActivationSaved {
    kind: Activation,
    options: ActivationOptions,
    inputs: Inputs,
    out_shape: Vec<usize>,
}

impl ActivationSaved {
    /// The activation.
    pub fn kind(&self) -> Activation {
        self.kind
    }
}

impl ActivationSaved {
    /// The saved context of a unary forward of `kind` on `x` with default multipliers,
    /// for callers that keep the pre-activation themselves (the matmul epilogue): its
    /// [`backward`] gives `dy·act'(x)`.
    pub(crate) fn unary(kind: Activation, x: &Tensor) -> ActivationSaved {
        ActivationSaved {
            kind,
            options: ActivationOptions::default(),
            inputs: Inputs::Unary(x.clone()),
            out_shape: x.shape().to_vec(),
        }
    }
}

/// Gradients of an activation: F32 ([`backward`]) or the dtype asked of [`backward_as`].
#[derive(Debug, Clone)]
pub struct ActivationGrads {
    /// Gradient of the gate (unary: of the input; packed: of the whole packed input, in its
    /// `[gate ‖ up]` layout).
    pub dgate: Tensor,
    /// Gradient of `up` (separate gated layout only).
    pub dup: Option<Tensor>,
}

#[derive(encase::ShaderType)]
struct Params {
    count: u32,
    pairs: u32,
    width: u32,
    gate_mult: f32,
    down_mult: f32,
}

fn check_float(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, t.dtype(), &DType::FLOATS))
    }
}

fn check_options(o: &ActivationOptions) -> Result<()> {
    for (what, v) in [
        ("activation: gate_multiplier", o.gate_multiplier),
        ("activation: down_multiplier", o.down_multiplier),
    ] {
        if !v.is_finite() {
            return Err(Error::InvalidValue {
                what: what.into(),
                got: f64::from(v),
                rule: "must be finite".into(),
            });
        }
    }
    Ok(())
}

fn check_count(count: usize, what: &str) -> Result<()> {
    // Indices (packed: up to twice the output count) must fit in u32.
    let max = (u32::MAX / 2) as u64;
    if count as u64 > max {
        return Err(Error::bounds(what, count as u64, 0, max));
    }
    Ok(())
}

fn params(count: usize, width: usize, o: &ActivationOptions) -> Params {
    Params {
        count: count as u32,
        pairs: count.div_ceil(2) as u32,
        width: width.max(1) as u32,
        gate_mult: o.gate_multiplier,
        down_mult: o.down_multiplier,
    }
}

fn constants(
    kind: Activation,
    g: DType,
    u: DType,
    y: DType,
    packed: bool,
) -> crate::kernel::Constants {
    vec![
        ("KIND", f64::from(kind.code())),
        ("DT_G", f64::from(g.code())),
        ("DT_U", f64::from(u.code())),
        ("DT_Y", f64::from(y.code())),
        ("PACKED", if packed { 1.0 } else { 0.0 }),
    ]
}

/// Pairs of elements per invocation (`UNROLL` in the kernel).
const UNROLL: u64 = 4;

fn groups(count: usize) -> u64 {
    (count.div_ceil(2) as u64).div_ceil(WG * UNROLL)
}

/// Elements per invocation of the step kernels (`*_steps` in the kernel).
const STEP_ELEMENTS: u64 = 16;

/// The entry point and launch of an element-wise pass over `count` output elements (packed:
/// rows of `width`): a step kernel (16-byte or 8-byte loads and stores per step of `step`
/// elements) when every row splits into whole steps, else the per-element kernel `general`.
struct Pass {
    entry: &'static str,
    params: Params,
    groups: u64,
    /// Elements per step (8: every tensor 16-bit; 4), 0 for the per-element kernel.
    step: usize,
}

/// The windows of an element-wise pass over `count` output elements (packed: rows of
/// `width`), so that tensors past one storage binding run a window at a time: units of 16
/// output elements (packed: rows), each window a range of units and its output elements.
/// `tensors`: the dtype of each tensor and its elements per output element (packed inputs and
/// gradients 2, else 1).
fn windows(
    engine: &Engine,
    count: usize,
    width: Option<usize>,
    tensors: &[(DType, usize)],
) -> Result<Vec<(Range<usize>, usize)>> {
    let unit = unit_elements(width);
    let row_bytes: Vec<u64> = tensors
        .iter()
        .map(|&(d, k)| (unit * k * d.size()) as u64)
        .collect();
    let units = count.div_ceil(unit);
    Ok(row_windows(engine, "activation", units, &row_bytes)?
        .into_iter()
        .map(|w| {
            let n = (w.end * unit).min(count) - w.start * unit;
            (w, n)
        })
        .collect())
}

/// Output elements per window unit: a packed row, else 16.
fn unit_elements(width: Option<usize>) -> usize {
    width.unwrap_or(STEP_ELEMENTS as usize).max(1)
}

/// The binding of window `w` of `t`, which holds `k` elements per output element.
fn bind_window<'a>(t: &'a Tensor, w: &Range<usize>, width: Option<usize>, k: usize) -> Bind<'a> {
    t.bind_rows(w, unit_elements(width) * k)
}

/// `tensors`: (binding bytes, dtype) of every tensor the pass reads or writes (gradients
/// included).
fn pass(
    general: &'static str,
    stepped: &'static str,
    count: usize,
    width: Option<usize>,
    tensors: &[(u64, DType)],
    o: &ActivationOptions,
) -> Pass {
    let split = width.unwrap_or(count);
    let all_half = tensors.iter().all(|(_, d)| d.size() == 2);
    // Every binding, including the 16-byte views, must hold at least one vec4.
    let bindable = tensors.iter().all(|&(bytes, _)| bytes >= 16);
    let step = [8usize, 4]
        .into_iter()
        .find(|&s| (s == 4 || all_half) && split.is_multiple_of(s));
    match step {
        Some(step) if count > 0 && bindable => {
            let steps = count / step;
            let mut p = params(count, width.unwrap_or(0) / step, o);
            p.pairs = steps as u32;
            let per_invocation = STEP_ELEMENTS / step as u64;
            Pass {
                entry: stepped,
                params: p,
                groups: (steps as u64).div_ceil(WG * per_invocation),
                step,
            }
        }
        _ => Pass {
            entry: general,
            params: params(count, width.unwrap_or(0), o),
            groups: groups(count),
            step: 0,
        },
    }
}

impl Pass {
    /// The kernel's constants, with the step size.
    fn constants(&self, mut c: crate::kernel::Constants) -> crate::kernel::Constants {
        if self.step > 0 {
            c.push(("STEP", self.step as f64));
        }
        c
    }

    /// The launch's buffers: each tensor once for the per-element kernel; for the step
    /// kernels each of `views` twice (its 16-byte and 8-byte views), then the gradients
    /// `single` once.
    fn buffers<'a>(&self, views: &[Bind<'a>], single: &[Bind<'a>]) -> Vec<Bind<'a>> {
        let mut v = Vec::new();
        for b in views {
            v.push(*b);
            if self.step > 0 {
                v.push(*b);
            }
        }
        v.extend_from_slice(single);
        v
    }
}

/// Forward: unary `m_d·act(m_g·gate)` when `up` is `None`, gated `m_d·act(m_g·gate)·up`
/// otherwise. Output: the gate's shape and dtype.
///
/// Errors: a non-float dtype; `up` of another shape than `gate` (`ShapeMismatch`); a
/// non-finite multiplier (`InvalidValue`); tensors of another engine; more than 2³¹−1
/// elements (`OutOfBounds`).
pub fn forward(
    kind: Activation,
    gate: &Tensor,
    up: Option<&Tensor>,
    options: &ActivationOptions,
) -> Result<(Tensor, ActivationSaved)> {
    check_float(gate, "activation: gate")?;
    check_options(options)?;
    check_count(gate.len(), "activation: elements")?;
    let engine = gate.engine();
    let count = gate.len();
    let out = Tensor::empty(engine, gate.shape(), gate.dtype(), "activation output")?;
    if let Some(up) = up {
        check_float(up, "activation: up")?;
        up.check_engine(engine, "activation: up")?;
        if up.shape() != gate.shape() {
            return Err(Error::shape("activation: up", gate.shape(), up.shape()));
        }
    }
    let mut tensors = vec![(gate.dtype(), 1)];
    tensors.extend(up.map(|u| (u.dtype(), 1)));
    tensors.push((out.dtype(), 1));
    let (general, stepped) = match up {
        None => ("forward_unary", "forward_unary_steps"),
        Some(_) => ("forward_gated", "forward_gated_steps"),
    };
    let up_dtype = up.map_or(gate.dtype(), |u| u.dtype());
    let consts = constants(kind, gate.dtype(), up_dtype, gate.dtype(), false);
    for (w, n) in windows(engine, count, None, &tensors)? {
        let mut views = vec![bind_window(gate, &w, None, 1)];
        views.extend(up.map(|u| bind_window(u, &w, None, 1)));
        views.push(bind_window(&out, &w, None, 1));
        let sizes: Vec<(u64, DType)> = views
            .iter()
            .zip(&tensors)
            .map(|(b, &(d, _))| (b.size, d))
            .collect();
        let p = pass(general, stepped, n, None, &sizes, options);
        engine.launch_bound(
            &KERNEL,
            p.entry,
            &p.constants(consts.clone()),
            &p.params,
            &p.buffers(&views, &[]),
            p.groups,
        )?;
    }
    let inputs = match up {
        None => Inputs::Unary(gate.clone()),
        Some(up) => Inputs::Gated(gate.clone(), up.clone()),
    };
    Ok((
        out,
        ActivationSaved {
            kind,
            options: *options,
            inputs,
            out_shape: gate.shape().to_vec(),
        },
    ))
}

/// Forward of the packed layout: `x` is `[.., 2·w]` with rows `[gate ‖ up]`; the output is
/// `[.., w]` in `x`'s dtype. Errors: as [`forward`], plus an empty shape or an odd last axis
/// (`ShapeMismatch`, expected the even width).
pub fn packed_forward(
    kind: Activation,
    x: &Tensor,
    options: &ActivationOptions,
) -> Result<(Tensor, ActivationSaved)> {
    check_float(x, "activation: packed input")?;
    check_options(options)?;
    let Some(&last) = x.shape().last() else {
        return Err(Error::shape("activation: packed input", &[2], x.shape()));
    };
    if last % 2 != 0 {
        let mut expected = x.shape().to_vec();
        *expected.last_mut().expect("non-empty") = last + 1;
        return Err(Error::shape(
            "activation: packed input (even last axis)",
            &expected,
            x.shape(),
        ));
    }
    check_count(x.len(), "activation: packed elements")?;
    let width = last / 2;
    let mut out_shape = x.shape().to_vec();
    *out_shape.last_mut().expect("non-empty") = width;
    let count = x.len() / 2;
    let engine = x.engine();
    let out = Tensor::empty(engine, &out_shape, x.dtype(), "activation output")?;
    let tensors = [(x.dtype(), 2), (out.dtype(), 1)];
    for (w, n) in windows(engine, count, Some(width), &tensors)? {
        let (xb, ob) = (
            bind_window(x, &w, Some(width), 2),
            bind_window(&out, &w, Some(width), 1),
        );
        let p = pass(
            "forward_gated",
            "forward_gated_steps",
            n,
            Some(width),
            &[(xb.size, x.dtype()), (ob.size, out.dtype())],
            options,
        );
        engine.launch_bound(
            &KERNEL,
            p.entry,
            &p.constants(constants(kind, x.dtype(), x.dtype(), x.dtype(), true)),
            &p.params,
            &p.buffers(&[xb, xb, ob], &[]),
            p.groups,
        )?;
    }
    Ok((
        out,
        ActivationSaved {
            kind,
            options: *options,
            inputs: Inputs::Packed(x.clone()),
            out_shape,
        },
    ))
}

/// Backward of [`forward`] / [`packed_forward`]: `dy` has the output's shape (any float
/// dtype). Returns F32 gradients: `dgate = dy·m_d·up·act'(m_g·gate)·m_g` (unary: without
/// `up`), `dup = dy·m_d·act(m_g·gate)`; packed: both in one `[.., 2·w]` tensor.
///
/// Errors: `dy` of another shape (`ShapeMismatch`) or a non-float dtype, another engine.
pub fn backward(saved: &ActivationSaved, dy: &Tensor) -> Result<ActivationGrads> {
    backward_as(saved, dy, DType::F32)
}

/// [`backward`] with the gradients stored in `dtype`: F32 gives that function's result; F16
/// or BF16 gives each F32 gradient value rounded once to nearest-even (bit for bit
/// `cast::cast` of [`backward`]'s gradients; a NaN stays a NaN, its payload may differ), in
/// fresh tensors. When every input, `dy` and the
/// gradients are 16-bit and the count (packed: the row width) is a multiple of 8, the step
/// kernel writes them directly (2 bytes an element instead of 4); otherwise the F32 gradients
/// are computed and narrowed.
///
/// Errors: those of [`backward`], and a `dtype` that is not a float dtype (`UnsupportedDType`).
pub fn backward_as(saved: &ActivationSaved, dy: &Tensor, dtype: DType) -> Result<ActivationGrads> {
    check_float(dy, "activation: dy")?;
    if !dtype.is_float() {
        return Err(Error::dtype(
            "activation: gradient dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    if dy.shape() != saved.out_shape.as_slice() {
        return Err(Error::shape("activation: dy", &saved.out_shape, dy.shape()));
    }
    let (g, up, width, general, stepped) = match &saved.inputs {
        Inputs::Unary(g) => (g, None, None, "backward_unary", "backward_unary_steps"),
        Inputs::Gated(g, u) => (g, Some(u), None, "backward_gated", "backward_gated_steps"),
        Inputs::Packed(x) => (
            x,
            None,
            Some(saved.out_shape.last().copied().unwrap_or(1)),
            "backward_packed",
            "backward_packed_steps",
        ),
    };
    dy.check_engine(g.engine(), "activation: dy")?;
    let engine = g.engine();
    let count = dy.len();
    // Elements of the input and gradients per output element: 2 packed.
    let k = if width.is_some() { 2 } else { 1 };
    let mut tensors = vec![(g.dtype(), k)];
    tensors.extend(up.map(|u| (u.dtype(), 1)));
    tensors.push((dy.dtype(), 1));
    tensors.extend(std::iter::repeat_n(
        (dtype, k),
        1 + usize::from(up.is_some()),
    ));
    let plan = windows(engine, count, width, &tensors)?;
    // The kernel for the whole tensors; 16-bit gradients need every window on the 16-bit step
    // kernel (the whole count in steps of 8 and every binding a vec4).
    let whole: Vec<(u64, DType)> = tensors
        .iter()
        .map(|&(d, kk)| ((count * kk * d.size()) as u64, d))
        .collect();
    let direct = |n: usize, sizes: &[(u64, DType)]| {
        pass(general, stepped, n, width, sizes, &saved.options).step == 8
    };
    if dtype != DType::F32 && !direct(count, &whole) {
        // The 16-bit gradient kernels need 16-bit tensors in whole steps of 8: F32 gradients,
        // then one rounding each.
        let f32_grads = backward_as(saved, dy, DType::F32)?;
        return Ok(ActivationGrads {
            dgate: crate::cast::cast(&f32_grads.dgate, dtype)?,
            dup: f32_grads
                .dup
                .map(|d| crate::cast::cast(&d, dtype))
                .transpose()?,
        });
    }
    let dgate = Tensor::empty(engine, g.shape(), dtype, "activation dgate")?;
    let dup = up
        .map(|_| Tensor::empty(engine, g.shape(), dtype, "activation dup"))
        .transpose()?;
    let up_dtype = up.map_or(g.dtype(), |u| u.dtype());
    let base = constants(saved.kind, g.dtype(), up_dtype, dy.dtype(), width.is_some());
    for (w, n) in plan {
        let mut views = vec![bind_window(g, &w, width, k)];
        views.extend(up.map(|u| bind_window(u, &w, width, 1)));
        views.push(bind_window(dy, &w, width, 1));
        let mut grads = vec![bind_window(&dgate, &w, width, k)];
        grads.extend(dup.as_ref().map(|d| bind_window(d, &w, width, 1)));
        let sizes: Vec<(u64, DType)> = views
            .iter()
            .chain(&grads)
            .zip(&tensors)
            .map(|(b, &(d, _))| (b.size, d))
            .collect();
        let p = pass(general, stepped, n, width, &sizes, &saved.options);
        if dtype != DType::F32 && p.step != 8 {
            return Err(Error::Kernel {
                kernel: KERNEL.name.into(),
                message: format!("a {n}-element window cannot take the 16-bit step kernel"),
            });
        }
        let mut c = p.constants(base.clone());
        c.push(("DT_D", f64::from(dtype.code())));
        engine.launch_bound(
            &KERNEL,
            p.entry,
            &c,
            &p.params,
            &p.buffers(&views, &grads),
            p.groups,
        )?;
    }
    Ok(ActivationGrads { dgate, dup })
}

/// `silu(x)` (unary, default options).
pub fn silu(x: &Tensor) -> Result<(Tensor, ActivationSaved)> {
    forward(Activation::Silu, x, None, &ActivationOptions::default())
}

/// SwiGLU: `silu(gate)·up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<(Tensor, ActivationSaved)> {
    forward(
        Activation::Silu,
        gate,
        Some(up),
        &ActivationOptions::default(),
    )
}

/// GeGLU (tanh-GELU): `gelu_tanh(gate)·up`.
pub fn geglu(gate: &Tensor, up: &Tensor) -> Result<(Tensor, ActivationSaved)> {
    forward(
        Activation::GeluTanh,
        gate,
        Some(up),
        &ActivationOptions::default(),
    )
}

/// SwiGLU on the packed `[gate ‖ up]` layout.
pub fn swiglu_packed(x: &Tensor) -> Result<(Tensor, ActivationSaved)> {
    packed_forward(Activation::Silu, x, &ActivationOptions::default())
}

/// GeGLU on the packed `[gate ‖ up]` layout.
pub fn geglu_packed(x: &Tensor) -> Result<(Tensor, ActivationSaved)> {
    packed_forward(Activation::GeluTanh, x, &ActivationOptions::default())
}

/// The error function of each element, F32 out (the erf the exact GELU uses, exposed for
/// testing and reuse). Accurate to a few f32 ulps; `±1` beyond |x| ≥ 10. Errors: a non-float
/// dtype, more than 2³¹−1 elements.
pub fn erf(x: &Tensor) -> Result<Tensor> {
    check_float(x, "erf: input")?;
    check_count(x.len(), "erf: elements")?;
    let engine = x.engine();
    let out = Tensor::empty(engine, x.shape(), DType::F32, "erf output")?;
    let count = x.len();
    engine.launch(
        &KERNEL,
        "erf_values",
        &constants(Activation::Gelu, x.dtype(), x.dtype(), DType::F32, false),
        &params(count, 0, &ActivationOptions::default()),
        &[x.buffer(), out.buffer()],
        (count as u64).div_ceil(WG),
    )?;
    Ok(out)
}
