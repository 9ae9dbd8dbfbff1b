//! Checks of the fused gated MLP (`crate::mlp`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "mlp",
        kernels: &["matmul", "activation"],
        run: check_mlp,
    }]
}

/// The SwiGLU MLP (saved products), the GeGLU MLP (recomputed products) and the tiled SwiGLU
/// MLP (tiles of 4 rows, the last one shorter) against the f64 reference in every storage
/// dtype: output and the four gradients, ragged extents.
fn check_mlp(engine: &Engine) -> Result<Vec<Case>> {
    use crate::activation::Activation;
    use crate::matmul::matmul_tolerance;
    use crate::mlp::{MlpOptions, mlp, mlp_backward};
    use reference::mlp::Extents;
    let mut rng = Rng::new(11);
    let mut cases = Vec::new();
    let e = Extents {
        t: 21,
        h: 24,
        i: 37,
    };
    for (kind, recompute, tile_rows) in [
        (Activation::Silu, false, None),
        (Activation::GeluTanh, true, None),
        (Activation::Silu, true, Some(4)),
    ] {
        for dtype in DType::FLOATS {
            let (x, xs) =
                tensor_from_f64(engine, &rng.vec(e.t * e.h, -1.0, 1.0), &[e.t, e.h], dtype)?;
            let (g, gs) =
                tensor_from_f64(engine, &rng.vec(e.i * e.h, -0.4, 0.4), &[e.i, e.h], dtype)?;
            let (u, us) =
                tensor_from_f64(engine, &rng.vec(e.i * e.h, -0.2, 0.2), &[e.i, e.h], dtype)?;
            let (d, ds) =
                tensor_from_f64(engine, &rng.vec(e.h * e.i, -0.2, 0.2), &[e.h, e.i], dtype)?;
            let (dy, dys) =
                tensor_from_f64(engine, &rng.vec(e.t * e.h, -1.0, 1.0), &[e.t, e.h], dtype)?;
            let options = MlpOptions {
                activation: kind,
                recompute,
                tile_rows,
            };
            let (y, saved) = mlp(&x, &g, &u, &d, &options)?;
            let grads = mlp_backward(&saved, &dy)?;
            let want = reference::mlp::forward(kind, &xs, &gs, &us, &ds, e);
            let r = reference::mlp::backward(kind, &xs, &gs, &us, &ds, &dys, e);
            let label = |what: &str| {
                format!(
                    "{what} {} {dtype} recompute {recompute} tiles {tile_rows:?}",
                    kind.name()
                )
            };
            cases.push(case(label("y"), &y.to_f64()?, &want, matmul_tolerance(e.i)));
            cases.push(case(
                label("dx"),
                &grads.x.to_f64()?,
                &r.x,
                matmul_tolerance(e.i),
            ));
            cases.push(case(
                label("dWg"),
                &grads.gate.to_f64()?,
                &r.gate,
                matmul_tolerance(e.t),
            ));
            cases.push(case(
                label("dWu"),
                &grads.up.to_f64()?,
                &r.up,
                matmul_tolerance(e.t),
            ));
            cases.push(case(
                label("dWd"),
                &grads.down.to_f64()?,
                &r.down,
                matmul_tolerance(e.t),
            ));
        }
    }
    Ok(cases)
}
