//! Optimizers and gradient clipping: AdamW (optionally AMSGrad) and SGD (momentum, dampening,
//! Nesterov, weight decay), either minimizing or maximizing, on FP32 master weights, and the
//! global gradient norm.
//!
//! # Parameters are updated in place
//!
//! wgrad's tensors are otherwise immutable; the optimizers are the one deliberate exception.
//! [`AdamW::new`] and [`Sgd::new`] take the model's parameter tensors and keep their handles:
//!
//! * an **F32** parameter *is* its master weight: each step rewrites its buffer in place;
//! * an **F16/BF16** parameter gets an FP32 master (its exact widening, owned by the
//!   optimizer), and the parameter itself becomes the **model copy**: each step writes the
//!   master rounded to nearest even into the parameter's buffer, in the same pass.
//!
//! A model holding those tensor handles therefore sees the new weights after each step,
//! without any copy. Consequences: a step must come after every backward that reads the
//! parameters (a forward's saved context holds handles to the same buffers), and the
//! parameter buffers must not be shared with anything else the step reads (gradients, the
//! clip norm): that is checked (`Error::Aliased`).
//!
//! # One fused kernel per parameter
//!
//! A step is one launch per parameter tensor reading the gradient (F32, F16 or BF16; FP32
//! math), the master and the optimizer state and writing them back (plus the model copy).
//! Nothing is read back to the host: clipping ([`Clip`]) reads the norm that
//! [`grad_norm`] left on the GPU and scales the gradient by `min(1, max_norm / (norm + 1e-6))`
//! inside the step (PyTorch's `clip_grad_norm_` factor), so a training loop never waits.
//!
//! # Formulas (PyTorch's, in its operation order)
//!
//! With `maximize` (either optimizer) the gradient is negated first, `g ← −g` (after
//! clipping, which does not change the norm), and everything below is unchanged: the step
//! ascends the objective, while AdamW's decoupled decay still shrinks the weights and SGD's
//! weight decay is added to the negated gradient.
//!
//! AdamW, step `t` (counted from 1), gradient `g` (after clipping):
//! `p ← p·(1 − lr·λ)`; `m ← β1·m + (1 − β1)·g`; `v ← β2·v + (1 − β2)·g²`;
//! `p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)`. With AMSGrad a third state
//! `v_max` (zero at first) keeps the running maximum of the raw second moment,
//! `v_max ← max(v_max, v)`, and replaces `v` in the denominator, bias-corrected the same
//! way: `√v_max / √(1 − β2ᵗ) + ε`. The host computes the bias-correction factors and
//! `1 − lr·λ` in f64 and hands them to the kernel as f32.
//!
//! SGD: `g ← g + λ·p`; with momentum `μ > 0`: `b ← g` on the first step, else
//! `b ← μ·b + (1 − τ)·g`, and `g ← b` (or `g + μ·b` with Nesterov); then `p ← p − lr·g`.
//!
//! Each optimizer has one kernel entry point (plus its model-copy twin) whatever its
//! options: they are uniform flags, so the default path runs the same arithmetic as without
//! them.
//!
//! Gradient norm: `‖(g_1, …, g_k)‖₂ = sqrt(Σ_i Σ_j g_ij²)` in FP32, per-block partial sums of
//! squares (blocks of 8,192 elements: four running sums per invocation in a fixed order, then a
//! pairwise workgroup tree) finished by one workgroup in the same way; the order depends on
//! the shapes only, so two runs give the same bits. Squares of
//! values past ~1.8e19 overflow to an infinite norm.
//!
//! A non-finite gradient gives non-finite weights (with clipping too, as in PyTorch: its norm
//! is not finite); read the norm back if a loop must skip such steps.

use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, Kernel};
use crate::{DType, Engine, Error, Result, Tensor, cast};
use std::collections::HashMap;

/// `wgsl/optim.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "optim",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_REDUCE,
        include_str!("../wgsl/optim.wgsl"),
    ],
};

const WG: u64 = 256;
/// Element pairs per invocation of a step (`UNROLL` in the kernel).
const UNROLL: u64 = 4;
/// Gradient elements per partial of [`grad_norm`] (`WG · NORM_CHUNK` in the kernel).
pub const NORM_BLOCK: usize = 8192;
/// Largest element count of a parameter or gradient.
const MAX_ELEMENTS: u64 = (1 << 31) - 1;

// Bits of `Params::flags` (`FLAG_*` in the kernel).
/// SGD: first step (the momentum buffer starts as the gradient).
const FLAG_FIRST: u32 = 1;
/// SGD: Nesterov momentum.
const FLAG_NESTEROV: u32 = 2;
/// AdamW, SGD: the gradient is negated.
const FLAG_MAXIMIZE: u32 = 4;
/// AdamW: AMSGrad's running maximum in the denominator.
const FLAG_AMSGRAD: u32 = 8;

impl AsRef<Tensor> for Tensor {
    fn as_ref(&self) -> &Tensor {
        self
    }
}

#[derive(encase::ShaderType, Clone, Copy, Default)]
struct Params {
    count: u32,
    pairs: u32,
    clip: u32,
    flags: u32,
    lr: f32,
    decay: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    eps: f32,
    step_size: f32,
    bc2_sqrt: f32,
    max_norm: f32,
    base: u32,
    blocks: u32,
}

/// Gradient clipping by global norm, applied inside an optimizer step: every gradient is
/// scaled by `min(1, max_norm / (norm + 1e-6))`, computed on the GPU.
#[derive(Debug, Clone)]
pub struct Clip {
    /// Largest norm let through; finite and > 0.
    pub max_norm: f32,
    /// The global norm, a 1-element F32 tensor (from [`grad_norm`]).
    pub norm: Tensor,
}

impl Clip {
    /// The norm of `grads` ([`grad_norm`]) with this `max_norm` (checked at the step).
    pub fn from_grads<T: AsRef<Tensor>>(grads: &[T], max_norm: f32) -> Result<Clip> {
        Ok(Clip {
            max_norm,
            norm: grad_norm(grads)?,
        })
    }
}

/// Options of [`AdamW`]; `Default` is PyTorch's `AdamW` default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWOptions {
    /// Learning rate, finite and ≥ 0 (default 1e-3); [`AdamW::set_lr`] changes it between steps.
    pub lr: f32,
    /// First-moment decay β1 in [0, 1) (default 0.9).
    pub beta1: f32,
    /// Second-moment decay β2 in [0, 1) (default 0.999).
    pub beta2: f32,
    /// Denominator term ε, finite and ≥ 0 (default 1e-8).
    pub eps: f32,
    /// Decoupled weight decay λ, finite and ≥ 0 (default 0.01).
    pub weight_decay: f32,
    /// AMSGrad (default false): keep `v_max = max(v_max, v)` per element (a third F32 state
    /// tensor, [`AdamW::max_second_moments`]) and divide by `√v_max / √(1 − β2ᵗ) + ε`.
    pub amsgrad: bool,
    /// Maximize the objective (default false): the gradient is negated before the step
    /// (the decoupled decay still shrinks the weights).
    pub maximize: bool,
}

impl Default for AdamWOptions {
    fn default() -> Self {
        AdamWOptions {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            amsgrad: false,
            maximize: false,
        }
    }
}

/// Options of [`Sgd`]; `Default` is PyTorch's `SGD` default (plain SGD).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdOptions {
    /// Learning rate, finite and ≥ 0 (default 1e-3); [`Sgd::set_lr`] changes it between steps.
    pub lr: f32,
    /// Momentum μ, finite and ≥ 0 (default 0: no momentum buffer).
    pub momentum: f32,
    /// Dampening τ in [0, 1] (default 0).
    pub dampening: f32,
    /// Weight decay λ (added to the gradient), finite and ≥ 0 (default 0).
    pub weight_decay: f32,
    /// Nesterov momentum (default false); needs μ > 0 and τ = 0.
    pub nesterov: bool,
    /// Maximize the objective (default false): the gradient is negated before anything
    /// else, weight decay included (`g ← −g + λ·p`).
    pub maximize: bool,
}

impl Default for SgdOptions {
    fn default() -> Self {
        SgdOptions {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }
}

fn invalid(what: &str, got: f32, rule: &str) -> Error {
    Error::InvalidValue {
        what: what.into(),
        got: f64::from(got),
        rule: rule.into(),
    }
}

fn non_negative(what: &str, v: f32) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(what, v, "must be finite and ≥ 0"))
    }
}

fn check_adamw(o: &AdamWOptions) -> Result<()> {
    non_negative("adamw: lr", o.lr)?;
    for (what, b) in [("adamw: beta1", o.beta1), ("adamw: beta2", o.beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(invalid(what, b, "must be in [0, 1)"));
        }
    }
    non_negative("adamw: eps", o.eps)?;
    non_negative("adamw: weight_decay", o.weight_decay)
}

fn check_sgd(o: &SgdOptions) -> Result<()> {
    non_negative("sgd: lr", o.lr)?;
    non_negative("sgd: momentum", o.momentum)?;
    if !(0.0..=1.0).contains(&o.dampening) {
        return Err(invalid("sgd: dampening", o.dampening, "must be in [0, 1]"));
    }
    non_negative("sgd: weight_decay", o.weight_decay)?;
    if o.nesterov && o.momentum <= 0.0 {
        return Err(invalid(
            "sgd: momentum",
            o.momentum,
            "must be > 0 with nesterov",
        ));
    }
    if o.nesterov && o.dampening != 0.0 {
        return Err(invalid(
            "sgd: dampening",
            o.dampening,
            "must be 0 with nesterov",
        ));
    }
    Ok(())
}

fn elements(what: &str, t: &Tensor) -> Result<()> {
    if t.len() as u64 > MAX_ELEMENTS {
        return Err(Error::bounds(what, t.len() as u64, 0, MAX_ELEMENTS));
    }
    Ok(())
}

/// Master weights and model copies of a parameter list (shared by both optimizers).
#[derive(Debug)]
struct Masters {
    engine: Option<Engine>,
    masters: Vec<Tensor>,
    copies: Vec<Option<Tensor>>,
}

impl Masters {
    fn new(name: &str, params: &[Tensor]) -> Result<Masters> {
        let engine = params.first().map(|p| p.engine().clone());
        // wgpu::Buffer hashes and compares by its id, which never changes.
        #[allow(clippy::mutable_key_type)]
        let mut seen: HashMap<wgpu::Buffer, usize> = HashMap::new();
        let mut masters = Vec::with_capacity(params.len());
        let mut copies = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let what = format!("{name}: params[{i}]");
            if let Some(e) = &engine {
                p.check_engine(e, &what)?;
            }
            if !p.dtype().is_float() {
                return Err(Error::dtype(what, p.dtype(), &DType::FLOATS));
            }
            elements(&what, p)?;
            if let Some(j) = seen.insert(p.buffer().clone(), i) {
                return Err(Error::Aliased {
                    what,
                    other: format!("{name}: params[{j}]"),
                });
            }
            if p.dtype() == DType::F32 {
                masters.push(p.clone());
                copies.push(None);
            } else {
                masters.push(cast::cast(p, DType::F32)?);
                copies.push(Some(p.clone()));
            }
        }
        Ok(Masters {
            engine,
            masters,
            copies,
        })
    }

    /// Check the gradients and the clip against the parameters and the state buffers
    /// `state` (which the step writes); returns the clip's scale parameters.
    fn check_step<T: AsRef<Tensor>>(
        &self,
        name: &str,
        grads: &[T],
        clip: Option<&Clip>,
        state: &[&Tensor],
    ) -> Result<(u32, f32)> {
        if grads.len() != self.masters.len() {
            return Err(Error::shape(
                format!("{name}: grads (count)"),
                &[self.masters.len()],
                &[grads.len()],
            ));
        }
        // wgpu::Buffer hashes and compares by its id, which never changes.
        #[allow(clippy::mutable_key_type)]
        let mut written: HashMap<wgpu::Buffer, String> = HashMap::new();
        for (i, (m, c)) in self.masters.iter().zip(&self.copies).enumerate() {
            written.insert(m.buffer().clone(), format!("{name}: params[{i}] (master)"));
            if let Some(c) = c {
                written.insert(c.buffer().clone(), format!("{name}: params[{i}]"));
            }
        }
        for t in state {
            written.insert(t.buffer().clone(), format!("{name}: optimizer state"));
        }
        let aliased = |t: &Tensor, what: &str| -> Result<()> {
            match written.get(t.buffer()) {
                Some(other) => Err(Error::Aliased {
                    what: what.into(),
                    other: other.clone(),
                }),
                None => Ok(()),
            }
        };
        for (i, (g, m)) in grads.iter().zip(&self.masters).enumerate() {
            let g = g.as_ref();
            let what = format!("{name}: grads[{i}]");
            g.check_engine(m.engine(), &what)?;
            if !g.dtype().is_float() {
                return Err(Error::dtype(what, g.dtype(), &DType::FLOATS));
            }
            if g.shape() != m.shape() {
                return Err(Error::shape(what, m.shape(), g.shape()));
            }
            aliased(g, &what)?;
        }
        let Some(clip) = clip else {
            return Ok((0, 0.0));
        };
        let what = format!("{name}: clip.norm");
        if let Some(e) = &self.engine {
            clip.norm.check_engine(e, &what)?;
        }
        if clip.norm.dtype() != DType::F32 {
            return Err(Error::dtype(what, clip.norm.dtype(), &[DType::F32]));
        }
        if clip.norm.len() != 1 {
            return Err(Error::shape(what, &[1], clip.norm.shape()));
        }
        aliased(&clip.norm, &what)?;
        if !(clip.max_norm.is_finite() && clip.max_norm > 0.0) {
            return Err(invalid(
                &format!("{name}: clip.max_norm"),
                clip.max_norm,
                "must be finite and > 0",
            ));
        }
        Ok((1, clip.max_norm))
    }

    /// Launch `entry` (or `entry_copy` with a model copy) once per parameter; `state(i)` gives
    /// the parameter's state buffers in binding order after the master.
    fn launch<T: AsRef<Tensor>>(
        &self,
        entry: &str,
        grads: &[T],
        clip: Option<&Clip>,
        params: Params,
        state: impl Fn(usize) -> Vec<Tensor>,
    ) -> Result<()> {
        let copy_entry = format!("{entry}_copy");
        for (i, (g, m)) in grads.iter().zip(&self.masters).enumerate() {
            let g = g.as_ref();
            let engine = m.engine();
            let count = m.len();
            // Without clipping, the norm binding is never read: the gradient stands in.
            let norm = clip.map_or(g, |c| &c.norm);
            let state = state(i);
            let mut buffers = vec![g.buffer(), norm.buffer(), m.buffer()];
            let constants = match &self.copies[i] {
                Some(copy) => {
                    // Bindings: grad, norm, master, AdamW state..., model copy, momentum buffer.
                    let (moments, momentum) = split_state(entry, &state);
                    buffers.extend(moments.iter().map(Tensor::buffer));
                    buffers.push(copy.buffer());
                    buffers.extend(momentum.iter().map(Tensor::buffer));
                    vec![
                        ("DT_G", f64::from(g.dtype().code())),
                        ("DT_C", f64::from(copy.dtype().code())),
                    ]
                }
                None => {
                    buffers.extend(state.iter().map(Tensor::buffer));
                    vec![("DT_G", f64::from(g.dtype().code())), ("DT_C", 1.0)]
                }
            };
            let pairs = count.div_ceil(2);
            engine.launch(
                &KERNEL,
                if self.copies[i].is_some() {
                    &copy_entry
                } else {
                    entry
                },
                &constants,
                &Params {
                    count: count as u32,
                    pairs: pairs as u32,
                    ..params
                },
                &buffers,
                (pairs as u64).div_ceil(WG * UNROLL),
            )?;
        }
        Ok(())
    }
}

/// The AdamW state (moments and running maximum, bound before the model copy) and the SGD
/// momentum buffer (after it).
fn split_state<'a>(entry: &str, state: &'a [Tensor]) -> (&'a [Tensor], &'a [Tensor]) {
    if entry.starts_with("adamw") {
        (state, &[])
    } else {
        (&[], state)
    }
}

/// AdamW with FP32 master weights and moments (see the module documentation for the formula
/// and for the in-place update of the parameters).
#[derive(Debug)]
pub struct AdamW {
    options: AdamWOptions,
    masters: Masters,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// AMSGrad's running maxima (empty without AMSGrad).
    max_exp_avg_sq: Vec<Tensor>,
    /// Without AMSGrad, the one-word tensor bound in place of the running maximum (never
    /// accessed by the kernel); `None` with AMSGrad or without parameters.
    placeholder: Option<Tensor>,
    steps: u64,
}

impl AdamW {
    /// An optimizer over `params` (moments zero, step count 0; with AMSGrad a third F32 state
    /// tensor per parameter, zero). F32 parameters are updated in place; F16/BF16 parameters
    /// get an FP32 master and are rewritten from it at every step.
    ///
    /// Errors: options outside their ranges (`InvalidValue`: lr, eps or weight decay negative
    /// or not finite, β1 or β2 outside [0, 1)); a parameter that is not F32/F16/BF16
    /// (`UnsupportedDType`), past 2³¹ − 1 elements (`OutOfBounds`), of another engine than the
    /// first (`EngineMismatch`), or sharing a buffer with another (`Aliased`).
    pub fn new(params: &[Tensor], options: AdamWOptions) -> Result<AdamW> {
        check_adamw(&options)?;
        let masters = Masters::new("adamw", params)?;
        let mut exp_avg = Vec::with_capacity(params.len());
        let mut exp_avg_sq = Vec::with_capacity(params.len());
        let mut max_exp_avg_sq = Vec::new();
        for m in &masters.masters {
            exp_avg.push(Tensor::zeros(m.engine(), m.shape(), DType::F32)?);
            exp_avg_sq.push(Tensor::zeros(m.engine(), m.shape(), DType::F32)?);
            if options.amsgrad {
                max_exp_avg_sq.push(Tensor::zeros(m.engine(), m.shape(), DType::F32)?);
            }
        }
        let placeholder = match &masters.engine {
            Some(e) if !options.amsgrad => Some(Tensor::empty(
                e,
                &[1],
                DType::F32,
                "adamw max_exp_avg_sq placeholder",
            )?),
            _ => None,
        };
        Ok(AdamW {
            options,
            masters,
            exp_avg,
            exp_avg_sq,
            max_exp_avg_sq,
            placeholder,
            steps: 0,
        })
    }

    /// One step: one fused launch per parameter, `grads[i]` (F32/F16/BF16, the shape of
    /// parameter `i`) optionally clipped by `clip` on the GPU. Nothing is read back. The step
    /// count advances only when the step is recorded.
    ///
    /// Errors: a gradient count or shape that does not match (`ShapeMismatch`), a gradient that
    /// is not a float dtype (`UnsupportedDType`) or of another engine (`EngineMismatch`); a
    /// clip norm that is not a 1-element F32 tensor, a `max_norm` not finite or ≤ 0
    /// (`InvalidValue`); a gradient or norm sharing a buffer with a parameter or the
    /// optimizer state (`Aliased`).
    pub fn step<T: AsRef<Tensor>>(&mut self, grads: &[T], clip: Option<&Clip>) -> Result<()> {
        let state: Vec<&Tensor> = self
            .exp_avg
            .iter()
            .chain(&self.exp_avg_sq)
            .chain(&self.max_exp_avg_sq)
            .collect();
        let (clip_on, max_norm) = self.masters.check_step("adamw", grads, clip, &state)?;
        let o = &self.options;
        let t = self.steps + 1;
        let exponent = i32::try_from(t).unwrap_or(i32::MAX);
        let bc1 = 1.0 - f64::from(o.beta1).powi(exponent);
        let bc2 = 1.0 - f64::from(o.beta2).powi(exponent);
        let flags = (u32::from(o.maximize) * FLAG_MAXIMIZE) | (u32::from(o.amsgrad) * FLAG_AMSGRAD);
        let params = Params {
            clip: clip_on,
            max_norm,
            flags,
            decay: (1.0 - f64::from(o.lr) * f64::from(o.weight_decay)) as f32,
            beta1: o.beta1,
            one_minus_beta1: (1.0 - f64::from(o.beta1)) as f32,
            beta2: o.beta2,
            one_minus_beta2: (1.0 - f64::from(o.beta2)) as f32,
            eps: o.eps,
            step_size: (f64::from(o.lr) / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            ..Params::default()
        };
        self.masters
            .launch("adamw_step", grads, clip, params, |i| {
                let max = self
                    .max_exp_avg_sq
                    .get(i)
                    .or(self.placeholder.as_ref())
                    .expect("a running maximum or the placeholder");
                vec![
                    self.exp_avg[i].clone(),
                    self.exp_avg_sq[i].clone(),
                    max.clone(),
                ]
            })?;
        self.steps = t;
        Ok(())
    }

    /// Change the learning rate for the following steps. Errors: negative or not finite
    /// (`InvalidValue`).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        non_negative("adamw: lr", lr)?;
        self.options.lr = lr;
        Ok(())
    }

    /// The options in force (with the current learning rate).
    pub fn options(&self) -> &AdamWOptions {
        &self.options
    }

    /// Steps taken.
    pub fn step_count(&self) -> u64 {
        self.steps
    }

    /// The FP32 master weights, in parameter order (an F32 parameter's own tensor).
    pub fn params(&self) -> &[Tensor] {
        &self.masters.masters
    }

    /// The 16-bit model copies: `Some(parameter)` for each F16/BF16 parameter, `None` for F32.
    pub fn model_copies(&self) -> &[Option<Tensor>] {
        &self.masters.copies
    }

    /// First moments `m` (F32), in parameter order.
    pub fn first_moments(&self) -> &[Tensor] {
        &self.exp_avg
    }

    /// Second moments `v` (F32), in parameter order.
    pub fn second_moments(&self) -> &[Tensor] {
        &self.exp_avg_sq
    }

    /// AMSGrad's running maxima `v_max` of the second moments (F32, parameter order; empty
    /// without AMSGrad).
    pub fn max_second_moments(&self) -> &[Tensor] {
        &self.max_exp_avg_sq
    }
}

/// SGD with optional momentum, dampening, Nesterov and weight decay, on FP32 master weights
/// (see the module documentation for the formula and the in-place update).
#[derive(Debug)]
pub struct Sgd {
    options: SgdOptions,
    masters: Masters,
    buffers: Vec<Tensor>,
    steps: u64,
}

impl Sgd {
    /// An optimizer over `params` (step count 0; an F32 momentum buffer per parameter when
    /// `momentum > 0`). Parameters as in [`AdamW::new`].
    ///
    /// Errors: lr, momentum or weight decay negative or not finite, dampening outside [0, 1],
    /// Nesterov without momentum or with dampening (`InvalidValue`); parameters as in
    /// [`AdamW::new`].
    pub fn new(params: &[Tensor], options: SgdOptions) -> Result<Sgd> {
        check_sgd(&options)?;
        let masters = Masters::new("sgd", params)?;
        let buffers = if options.momentum > 0.0 {
            masters
                .masters
                .iter()
                .map(|m| Tensor::zeros(m.engine(), m.shape(), DType::F32))
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        Ok(Sgd {
            options,
            masters,
            buffers,
            steps: 0,
        })
    }

    /// One step, as [`AdamW::step`] (same errors).
    pub fn step<T: AsRef<Tensor>>(&mut self, grads: &[T], clip: Option<&Clip>) -> Result<()> {
        let state: Vec<&Tensor> = self.buffers.iter().collect();
        let (clip_on, max_norm) = self.masters.check_step("sgd", grads, clip, &state)?;
        let o = &self.options;
        let momentum = o.momentum > 0.0;
        let flags = (u32::from(self.steps == 0) * FLAG_FIRST)
            | (u32::from(o.nesterov) * FLAG_NESTEROV)
            | (u32::from(o.maximize) * FLAG_MAXIMIZE);
        let params = Params {
            clip: clip_on,
            max_norm,
            flags,
            lr: o.lr,
            decay: o.weight_decay,
            beta1: o.momentum,
            one_minus_beta1: (1.0 - f64::from(o.dampening)) as f32,
            ..Params::default()
        };
        if momentum {
            self.masters
                .launch("sgd_momentum_step", grads, clip, params, |i| {
                    vec![self.buffers[i].clone()]
                })?;
        } else {
            self.masters
                .launch("sgd_step", grads, clip, params, |_| Vec::new())?;
        }
        self.steps += 1;
        Ok(())
    }

    /// Change the learning rate for the following steps. Errors: negative or not finite
    /// (`InvalidValue`).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        non_negative("sgd: lr", lr)?;
        self.options.lr = lr;
        Ok(())
    }

    /// The options in force (with the current learning rate).
    pub fn options(&self) -> &SgdOptions {
        &self.options
    }

    /// Steps taken.
    pub fn step_count(&self) -> u64 {
        self.steps
    }

    /// The FP32 master weights, in parameter order (an F32 parameter's own tensor).
    pub fn params(&self) -> &[Tensor] {
        &self.masters.masters
    }

    /// The 16-bit model copies: `Some(parameter)` for each F16/BF16 parameter, `None` for F32.
    pub fn model_copies(&self) -> &[Option<Tensor>] {
        &self.masters.copies
    }

    /// The momentum buffers (F32, parameter order; empty without momentum). Their contents
    /// are meaningful after the first step.
    pub fn momentum_buffers(&self) -> &[Tensor] {
        &self.buffers
    }
}

/// Scratch bytes [`grad_norm`] allocates for gradients of these element counts: one F32
/// partial per started block of 8,192 elements ([`NORM_BLOCK`]) of each tensor.
pub fn grad_norm_workspace_bytes(lens: &[usize]) -> u64 {
    4 * lens
        .iter()
        .map(|&n| n.div_ceil(NORM_BLOCK) as u64)
        .sum::<u64>()
}

/// Global L2 norm of a list of gradients, `sqrt(Σ g²)` over every element of every tensor
/// (F32, F16 or BF16; FP32 accumulation in a fixed order), as a `[1]` F32 tensor on the GPU
/// (nothing is read back). Empty tensors contribute 0.
///
/// Errors: an empty list (`OutOfBounds`: the result needs an engine), a tensor that is not a
/// float dtype (`UnsupportedDType`), of another engine (`EngineMismatch`) or past 2³¹ − 1
/// elements (`OutOfBounds`); partials over the workspace bound (`WorkspaceExceeded`, see
/// [`grad_norm_workspace_bytes`]).
pub fn grad_norm<T: AsRef<Tensor>>(grads: &[T]) -> Result<Tensor> {
    let Some(first) = grads.first() else {
        return Err(Error::bounds("grad_norm: tensors", 0, 1, u64::MAX));
    };
    let engine = first.as_ref().engine();
    for (i, g) in grads.iter().enumerate() {
        let g = g.as_ref();
        let what = format!("grad_norm: grads[{i}]");
        g.check_engine(engine, &what)?;
        if !g.dtype().is_float() {
            return Err(Error::dtype(what, g.dtype(), &DType::FLOATS));
        }
        elements(&what, g)?;
    }
    let lens: Vec<usize> = grads.iter().map(|g| g.as_ref().len()).collect();
    let bytes = grad_norm_workspace_bytes(&lens);
    engine.check_workspace("grad_norm", bytes)?;
    let blocks = (bytes / 4) as usize;
    if blocks as u64 > u64::from(u32::MAX) {
        return Err(Error::bounds(
            "grad_norm: partials",
            blocks as u64,
            0,
            u64::from(u32::MAX),
        ));
    }
    let partials = Tensor::empty(engine, &[blocks], DType::F32, "grad_norm partials")?;
    let mut base = 0usize;
    for g in grads {
        let g = g.as_ref();
        let n = g.len().div_ceil(NORM_BLOCK);
        engine.launch(
            &KERNEL,
            "norm_partials",
            &vec![("DT_G", f64::from(g.dtype().code())), ("DT_C", 1.0)],
            &Params {
                count: g.len() as u32,
                base: base as u32,
                ..Params::default()
            },
            &[g.buffer(), partials.buffer()],
            n as u64,
        )?;
        base += n;
    }
    let out = Tensor::empty(engine, &[1], DType::F32, "grad_norm")?;
    engine.launch(
        &KERNEL,
        "norm_finish",
        &vec![("DT_G", 0.0), ("DT_C", 1.0)],
        &Params {
            blocks: blocks as u32,
            ..Params::default()
        },
        &[partials.buffer(), out.buffer()],
        1,
    )?;
    Ok(out)
}
