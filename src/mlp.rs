//! Fused gated MLP: `y = (act(x·W_gᵀ) ⊙ (x·W_uᵀ)) · W_dᵀ`, forward and backward.
//!
//! The Llama/Mistral feed-forward block (`act` = SiLU: SwiGLU; `act` = tanh-GELU: GeGLU),
//! built from the matmul and activation families: two products for the gate and up
//! projections, the gated activation, the down product. No kernel of its own.
//!
//! Shapes: `x [.., H]` (rows `T` = the product of the leading dimensions), `W_g`, `W_u`
//! `[I, H]`, `W_d [H, I]` (the `[out, in]` layout of a linear layer, used transposed without
//! a copy). Output `[.., H]` F32. Storage F32, F16 or BF16 for every input (each may differ);
//! products accumulate in FP32, the intermediates `g = x·W_gᵀ`, `u = x·W_uᵀ` and
//! `h = act(g)⊙u` are F32.
//!
//! Gradients (all F32), with `dy [.., H]`:
//! `dh = dy·W_d`, `dW_d = dyᵀ·h`, `dg = dh⊙u⊙act'(g)`, `du = dh⊙act(g)`,
//! `dx = dg·W_g + du·W_u`, `dW_g = dgᵀ·x`, `dW_u = duᵀ·x`.
//!
//! Memory: by default the forward keeps `g` and `u` (2·T·I F32) for the backward;
//! [`MlpOptions::recompute`] keeps only the inputs and recomputes the two products in the
//! backward (two more products, `2·T·I` fewer saved floats). `h` is never kept: the backward
//! recomputes it with the activation backward's own recomputation. Deterministic: every
//! product and the activation are fixed-order.

use crate::activation::{self, Activation, ActivationOptions};
use crate::matmul::{self, Gemm, GemmOperand, MatmulOptions};
use crate::{DType, Error, Result, Tensor};

/// Options of [`mlp`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlpOptions {
    /// The gate activation: [`Activation::Silu`] (SwiGLU, the default) or any other of the
    /// activation family ([`Activation::GeluTanh`]: GeGLU).
    pub activation: Activation,
    /// Recompute the gate and up products in the backward instead of saving them.
    pub recompute: bool,
}

impl Default for MlpOptions {
    fn default() -> Self {
        MlpOptions {
            activation: Activation::Silu,
            recompute: false,
        }
    }
}

/// What [`mlp_backward`] needs: the inputs and, unless recomputing, the F32 gate and up
/// products.
#[derive(Debug, Clone)]
pub struct MlpSaved {
    x: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    products: Option<(Tensor, Tensor)>,
    options: MlpOptions,
}

/// Gradients of [`mlp`], all F32, each in its input's shape.
#[derive(Debug, Clone)]
pub struct MlpGradients {
    /// `dx [.., H]`.
    pub x: Tensor,
    /// `dW_g [I, H]`.
    pub gate: Tensor,
    /// `dW_u [I, H]`.
    pub up: Tensor,
    /// `dW_d [H, I]`.
    pub down: Tensor,
}

fn check_float(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, t.dtype(), &DType::FLOATS))
    }
}

/// `(rows, hidden, intermediate)` after validating every shape.
fn extents(x: &Tensor, gate: &Tensor, up: &Tensor, down: &Tensor) -> Result<(usize, usize, usize)> {
    for (t, what) in [
        (x, "mlp: x"),
        (gate, "mlp: gate weight"),
        (up, "mlp: up weight"),
        (down, "mlp: down weight"),
    ] {
        check_float(t, what)?;
        if !t.engine().same(x.engine()) {
            return Err(Error::EngineMismatch {
                what: what.to_string(),
            });
        }
    }
    let Some((&hidden, lead)) = x.shape().split_last() else {
        return Err(Error::shape("mlp: x (at least 1-D)", &[0], x.shape()));
    };
    let rows: usize = lead.iter().product();
    if gate.shape().len() != 2 || gate.shape()[1] != hidden {
        return Err(Error::shape(
            "mlp: gate weight [I, H]",
            &[gate.shape().first().copied().unwrap_or(0), hidden],
            gate.shape(),
        ));
    }
    let inter = gate.shape()[0];
    if up.shape() != [inter, hidden] {
        return Err(Error::shape(
            "mlp: up weight [I, H]",
            &[inter, hidden],
            up.shape(),
        ));
    }
    if down.shape() != [hidden, inter] {
        return Err(Error::shape(
            "mlp: down weight [H, I]",
            &[hidden, inter],
            down.shape(),
        ));
    }
    Ok((rows, hidden, inter))
}

/// `x·Wᵀ` for `x [rows, in]`, `W [out, in]`: F32 `[rows, out]`.
fn linear(x: &Tensor, w: &Tensor, rows: usize) -> Result<Tensor> {
    let x2 = x.reshape(&[rows, w.shape()[1]])?;
    let options = MatmulOptions {
        transpose_b: true,
        ..MatmulOptions::default()
    };
    Ok(matmul::matmul(&x2, w, None, &options)?.0)
}

/// Gate and up products, F32 `[rows, I]` each.
fn products(saved: &MlpSaved, rows: usize) -> Result<(Tensor, Tensor)> {
    match &saved.products {
        Some(p) => Ok(p.clone()),
        None => Ok((
            linear(&saved.x, &saved.gate, rows)?,
            linear(&saved.x, &saved.up, rows)?,
        )),
    }
}

/// Forward: `y = (act(x·W_gᵀ) ⊙ (x·W_uᵀ)) · W_dᵀ`, F32 `[.., H]`.
///
/// Errors: non-float dtypes; `x` of rank 0; weights not `[I, H]`, `[I, H]`, `[H, I]` with
/// `H` the last extent of `x` (`ShapeMismatch`); tensors of another engine; the matmul
/// family's bounds.
pub fn mlp(
    x: &Tensor,
    gate: &Tensor,
    up: &Tensor,
    down: &Tensor,
    options: &MlpOptions,
) -> Result<(Tensor, MlpSaved)> {
    let (rows, hidden, _) = extents(x, gate, up, down)?;
    let g = linear(x, gate, rows)?;
    let u = linear(x, up, rows)?;
    let (h, _) = activation::forward(
        options.activation,
        &g,
        Some(&u),
        &ActivationOptions::default(),
    )?;
    let y = linear(&h, down, rows)?.reshape(&out_shape(x, hidden))?;
    let saved = MlpSaved {
        x: x.clone(),
        gate: gate.clone(),
        up: up.clone(),
        down: down.clone(),
        products: (!options.recompute).then_some((g, u)),
        options: *options,
    };
    Ok((y, saved))
}

fn out_shape(x: &Tensor, hidden: usize) -> Vec<usize> {
    let mut shape = x.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = hidden;
    }
    shape
}

/// `out (=|+=) op(a)·op(b)` for whole 2-D operands.
fn product_into(
    out: &Tensor,
    a: (&Tensor, bool),
    b: (&Tensor, bool),
    extents: (usize, usize, usize),
    accumulate: bool,
) -> Result<()> {
    let (a, b) = (GemmOperand::whole(a.0, a.1), GemmOperand::whole(b.0, b.1));
    matmul::gemm(&Gemm::plain(a, b, out, extents, accumulate))
}

/// Backward: every gradient of [`mlp`] from `dy [.., H]` (any float dtype).
///
/// Errors: `dy` not of the output's shape (`ShapeMismatch`) or not a float dtype; another
/// engine.
pub fn mlp_backward(saved: &MlpSaved, dy: &Tensor) -> Result<MlpGradients> {
    let (rows, hidden, inter) = extents(&saved.x, &saved.gate, &saved.up, &saved.down)?;
    check_float(dy, "mlp: dy")?;
    if !dy.engine().same(saved.x.engine()) {
        return Err(Error::EngineMismatch {
            what: "mlp: dy".to_string(),
        });
    }
    let shape = out_shape(&saved.x, hidden);
    if dy.shape() != shape.as_slice() {
        return Err(Error::shape("mlp: dy", &shape, dy.shape()));
    }
    let engine = saved.x.engine();
    let (g, u) = products(saved, rows)?;
    let dy2 = dy.reshape(&[rows, hidden])?;
    let x2 = saved.x.reshape(&[rows, hidden])?;
    // dh = dy·W_d  [rows, I]
    let dh = matmul::matmul(&dy2, &saved.down, None, &MatmulOptions::default())?.0;
    // The activation's backward recomputes h' from (g, u); h itself is recomputed for dW_d.
    let (h, act_saved) = activation::forward(
        saved.options.activation,
        &g,
        Some(&u),
        &ActivationOptions::default(),
    )?;
    let grads = activation::backward(&act_saved, &dh)?;
    let dg = grads.dgate;
    let du = grads.dup.ok_or_else(|| Error::Kernel {
        kernel: "mlp".to_string(),
        message: "the gated activation returned no up gradient".to_string(),
    })?;
    // dW_d = dyᵀ·h  [H, I]
    let d_down = Tensor::empty(engine, &[hidden, inter], DType::F32, "mlp: dW_d")?;
    product_into(
        &d_down,
        (&dy2, true),
        (&h, false),
        (hidden, inter, rows),
        false,
    )?;
    // dx = dg·W_g + du·W_u  [rows, H]
    let dx = Tensor::empty(engine, &[rows, hidden], DType::F32, "mlp: dx")?;
    product_into(
        &dx,
        (&dg, false),
        (&saved.gate, false),
        (rows, hidden, inter),
        false,
    )?;
    product_into(
        &dx,
        (&du, false),
        (&saved.up, false),
        (rows, hidden, inter),
        true,
    )?;
    // dW_g = dgᵀ·x, dW_u = duᵀ·x  [I, H]
    let d_gate = Tensor::empty(engine, &[inter, hidden], DType::F32, "mlp: dW_g")?;
    product_into(
        &d_gate,
        (&dg, true),
        (&x2, false),
        (inter, hidden, rows),
        false,
    )?;
    let d_up = Tensor::empty(engine, &[inter, hidden], DType::F32, "mlp: dW_u")?;
    product_into(
        &d_up,
        (&du, true),
        (&x2, false),
        (inter, hidden, rows),
        false,
    )?;
    Ok(MlpGradients {
        x: dx.reshape(saved.x.shape())?,
        gate: d_gate,
        up: d_up,
        down: d_down,
    })
}
