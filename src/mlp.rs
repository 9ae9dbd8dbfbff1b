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
//! recomputes it with the activation backward's own recomputation.
//! [`MlpOptions::tile_rows`] (a tiled MLP) runs both passes over tiles of rows, recomputing:
//! no `[T, I]` tensor exists, the intermediates of one tile at most ([`intermediate_bytes`]),
//! so long sequences cost O(tile·I) beyond the inputs and gradients. The output and `dx` rows
//! of a tile are written at its offset; the weight gradients are written by the first tile and
//! added to by the later ones, in row order.
//!
//! Deterministic: every product and the activation are fixed-order, so reruns with the same
//! tiling are bit-identical. The forward's rows do not depend on the tiling (bit for bit
//! unless a product's split-K choice differs with its row count); the weight gradients'
//! row sums are grouped by tile, so different tilings agree to rounding.

use crate::activation::{self, Activation, ActivationOptions};
use crate::matmul::{self, Gemm, GemmOperand};
use crate::{DType, Error, Result, Tensor};

/// Options of [`mlp`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlpOptions {
    /// The gate activation: [`Activation::Silu`] (SwiGLU, the default) or any other of the
    /// activation family ([`Activation::GeluTanh`]: GeGLU).
    pub activation: Activation,
    /// Recompute the gate and up products in the backward instead of saving them.
    pub recompute: bool,
    /// Rows a tile: `Some(t)` runs the forward and the backward `t` rows at a time (the last
    /// tile shorter), so the `[rows, I]` intermediates exist for one tile only
    /// ([`intermediate_bytes`]); it implies recomputation. `None` (the default): every row at
    /// once.
    pub tile_rows: Option<usize>,
    /// Opt-in: the products whose two operands are 16-bit (F16 or BF16) run on tensor cores
    /// ([`matmul::Gemm::tensor_cores`]: BF16 scaled by a power of two into F16, FP32
    /// accumulation in the hardware's order, compared under [`matmul::tensor_core_tolerance`]):
    /// the gate and up products for 16-bit `x`, `W_g`, `W_u`, and `dh = dy·W_d` for a 16-bit
    /// `dy` and `W_d`. The others (their operand `h`, `dg` or `du` is F32) run on the FP32
    /// path. Needs [`matmul::tensor_cores`] when any product
    /// qualifies (else `MissingFeature`).
    pub tensor_cores: bool,
}

impl Default for MlpOptions {
    fn default() -> Self {
        MlpOptions {
            activation: Activation::Silu,
            recompute: false,
            tile_rows: None,
            tensor_cores: false,
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

pub(crate) fn check_float(t: &Tensor, what: &str) -> Result<()> {
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

/// Row tiles `(first row, rows)` of a call: `tile_rows` at a time (the last tile shorter), or
/// one tile of every row without tiling (also when there are no rows, so the backward's
/// weight products still write their zeros).
fn tiles(rows: usize, tile_rows: Option<usize>) -> Vec<(usize, usize)> {
    let step = tile_rows.unwrap_or(rows).max(1);
    if rows == 0 {
        return vec![(0, 0)];
    }
    (0..rows)
        .step_by(step)
        .map(|r| (r, step.min(rows - r)))
        .collect()
}

/// Rows `first..` of a `[.., width]` tensor as a product operand (stored `[rows, width]`;
/// `transposed`: used as `[width, rows]`).
pub(crate) fn rows_of(
    tensor: &Tensor,
    first: usize,
    width: usize,
    transposed: bool,
) -> GemmOperand<'_> {
    GemmOperand {
        tensor,
        offset: first * width,
        transposed,
        batch_stride: 0,
    }
}

/// `out[out_offset..] (=|+=) a·b` with logical extents `(m, n, k)`; on tensor cores where
/// `tc` (the options' opt-in) and both operands are 16-bit.
pub(crate) fn product(
    out: &Tensor,
    out_offset: usize,
    a: GemmOperand,
    b: GemmOperand,
    extents: (usize, usize, usize),
    accumulate: bool,
    tc: bool,
) -> Result<()> {
    let tensor_cores = tc && a.tensor.dtype() != DType::F32 && b.tensor.dtype() != DType::F32;
    matmul::gemm(&Gemm {
        out_offset,
        tensor_cores,
        ..Gemm::plain(a, b, out, extents, accumulate)
    })
}

/// A fresh F32 `[m, n]` product `a·b`.
fn fresh(
    a: GemmOperand,
    b: GemmOperand,
    extents: (usize, usize, usize),
    what: &str,
    tc: bool,
) -> Result<Tensor> {
    let out = Tensor::empty(a.tensor.engine(), &[extents.0, extents.1], DType::F32, what)?;
    product(&out, 0, a, b, extents, false, tc)?;
    Ok(out)
}

/// Gate and up products of rows `first..first + count` of `x`, F32 `[count, I]` each.
fn gate_up(
    x: &Tensor,
    gate: &Tensor,
    up: &Tensor,
    (first, count): (usize, usize),
    tc: bool,
) -> Result<(Tensor, Tensor)> {
    let (inter, hidden) = (gate.shape()[0], gate.shape()[1]);
    let extents = (count, inter, hidden);
    Ok((
        fresh(
            rows_of(x, first, hidden, false),
            GemmOperand::whole(gate, true),
            extents,
            "mlp: gate product",
            tc,
        )?,
        fresh(
            rows_of(x, first, hidden, false),
            GemmOperand::whole(up, true),
            extents,
            "mlp: up product",
            tc,
        )?,
    ))
}

/// F32 bytes of the `[rows, I]` intermediates [`mlp_backward`] holds at once: six per row of a
/// tile (gate and up products, `dh`, `h`, `dg`, `du`), and with saved products (no tiling, no
/// recomputation) the two saved ones over every row besides. The forward holds three per row
/// of a tile (gate, up, `h`). The products' split-K scratch comes on top, within the engine's
/// workspace bound.
pub fn intermediate_bytes(rows: usize, inter: usize, options: &MlpOptions) -> u64 {
    let tile = options.tile_rows.map_or(rows, |t| t.min(rows)) as u64;
    let row = 4 * inter as u64;
    let saved = if options.tile_rows.is_none() && !options.recompute {
        2 * rows as u64 * row
    } else {
        0
    };
    saved + 6 * tile * row
}

/// Forward: `y = (act(x·W_gᵀ) ⊙ (x·W_uᵀ)) · W_dᵀ`, F32 `[.., H]`; with
/// [`MlpOptions::tile_rows`] one tile of rows at a time.
///
/// Errors: non-float dtypes; `x` of rank 0; weights not `[I, H]`, `[I, H]`, `[H, I]` with
/// `H` the last extent of `x` (`ShapeMismatch`); tensors of another engine; `tile_rows` of 0
/// (`InvalidValue`); the matmul family's bounds.
pub fn mlp(
    x: &Tensor,
    gate: &Tensor,
    up: &Tensor,
    down: &Tensor,
    options: &MlpOptions,
) -> Result<(Tensor, MlpSaved)> {
    let (rows, hidden, inter) = extents(x, gate, up, down)?;
    if options.tile_rows == Some(0) {
        return Err(Error::InvalidValue {
            what: "mlp: tile_rows".to_string(),
            got: 0.0,
            rule: "at least 1 row a tile".to_string(),
        });
    }
    let y = Tensor::empty(x.engine(), &out_shape(x, hidden), DType::F32, "mlp: y")?;
    let mut products = None;
    for tile in tiles(rows, options.tile_rows) {
        let (g, u) = gate_up(x, gate, up, tile, options.tensor_cores)?;
        let (h, _) = activation::forward(
            options.activation,
            &g,
            Some(&u),
            &ActivationOptions::default(),
        )?;
        let (first, count) = tile;
        product(
            &y,
            first * hidden,
            GemmOperand::whole(&h, false),
            GemmOperand::whole(down, true),
            (count, hidden, inter),
            false,
            options.tensor_cores,
        )?;
        if options.tile_rows.is_none() && !options.recompute {
            products = Some((g, u));
        }
    }
    let saved = MlpSaved {
        x: x.clone(),
        gate: gate.clone(),
        up: up.clone(),
        down: down.clone(),
        products,
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

/// Backward: every gradient of [`mlp`] from `dy [.., H]` (any float dtype); with
/// [`MlpOptions::tile_rows`] one tile of rows at a time (gate and up products recomputed per
/// tile, weight gradients accumulated over the tiles in row order).
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
    let (x, gate, up, down) = (&saved.x, &saved.gate, &saved.up, &saved.down);
    let tc = saved.options.tensor_cores;
    let dx = Tensor::empty(engine, x.shape(), DType::F32, "mlp: dx")?;
    let d_gate = Tensor::empty(engine, &[inter, hidden], DType::F32, "mlp: dW_g")?;
    let d_up = Tensor::empty(engine, &[inter, hidden], DType::F32, "mlp: dW_u")?;
    let d_down = Tensor::empty(engine, &[hidden, inter], DType::F32, "mlp: dW_d")?;
    for tile in tiles(rows, saved.options.tile_rows) {
        let (first, count) = tile;
        let (g, u) = match &saved.products {
            Some(p) => p.clone(),
            None => gate_up(x, gate, up, tile, tc)?,
        };
        // dh = dy·W_d  [count, I]
        let dh = fresh(
            rows_of(dy, first, hidden, false),
            GemmOperand::whole(down, false),
            (count, inter, hidden),
            "mlp: dh",
            tc,
        )?;
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
        // Weight gradients: the first tile writes, later tiles add (row order).
        let add = first > 0;
        // dW_d (+)= dyᵀ·h  [H, I]
        let dy_t = rows_of(dy, first, hidden, true);
        product(
            &d_down,
            0,
            dy_t,
            GemmOperand::whole(&h, false),
            (hidden, inter, count),
            add,
            tc,
        )?;
        // dx = dg·W_g + du·W_u  [count, H]
        let at = first * hidden;
        let extents = (count, hidden, inter);
        product(
            &dx,
            at,
            GemmOperand::whole(&dg, false),
            GemmOperand::whole(gate, false),
            extents,
            false,
            tc,
        )?;
        product(
            &dx,
            at,
            GemmOperand::whole(&du, false),
            GemmOperand::whole(up, false),
            extents,
            true,
            tc,
        )?;
        // dW_g (+)= dgᵀ·x, dW_u (+)= duᵀ·x  [I, H]
        let x_rows = rows_of(x, first, hidden, false);
        product(
            &d_gate,
            0,
            GemmOperand::whole(&dg, true),
            x_rows,
            (inter, hidden, count),
            add,
            tc,
        )?;
        product(
            &d_up,
            0,
            GemmOperand::whole(&du, true),
            x_rows,
            (inter, hidden, count),
            add,
            tc,
        )?;
    }
    Ok(MlpGradients {
        x: dx,
        gate: d_gate,
        up: d_up,
        down: d_down,
    })
}
