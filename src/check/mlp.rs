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
/// dtype: output and the four gradients, ragged extents. Where the engine runs tensor cores
/// (`matmul::tensor_cores`), also the F16 SwiGLU MLP with `tensor_cores` (gate, up and `dh`
/// products on them) within `matmul::tensor_core_tolerance`.
fn check_mlp(engine: &Engine) -> Result<Vec<Case>> {
    use crate::activation::Activation;
    use crate::matmul::{matmul_tolerance, tensor_core_tolerance, tensor_cores};
    use crate::mlp::{MlpOptions, mlp, mlp_backward};
    use reference::mlp::Extents;
    let mut rng = Rng::new(11);
    let mut cases = Vec::new();
    let mut configs = vec![
        (Activation::Silu, false, None, false),
        (Activation::GeluTanh, true, None, false),
        (Activation::Silu, true, Some(4), false),
    ];
    if tensor_cores(engine) {
        configs.push((Activation::Silu, false, None, true));
    }
    for (kind, recompute, tile_rows, tc) in configs {
        // Tensor cores take the products of whole 16-byte rows: I a multiple of 8 there.
        let e = Extents {
            t: 21,
            h: 24,
            i: if tc { 40 } else { 37 },
        };
        let dtypes = if tc {
            &[DType::F16][..]
        } else {
            &DType::FLOATS[..]
        };
        let tol = |terms: usize| {
            if tc {
                tensor_core_tolerance(terms)
            } else {
                matmul_tolerance(terms)
            }
        };
        for &dtype in dtypes {
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
                tensor_cores: tc,
            };
            let (y, saved) = mlp(&x, &g, &u, &d, &options)?;
            let grads = mlp_backward(&saved, &dy)?;
            let want = reference::mlp::forward(kind, &xs, &gs, &us, &ds, e);
            let r = reference::mlp::backward(kind, &xs, &gs, &us, &ds, &dys, e);
            let label = |what: &str| {
                format!(
                    "{what} {} {dtype} recompute {recompute} tiles {tile_rows:?} tensor cores {tc}",
                    kind.name()
                )
            };
            cases.push(case(label("y"), &y.to_f64()?, &want, tol(e.i)));
            cases.push(case(label("dx"), &grads.x.to_f64()?, &r.x, tol(e.i)));
            cases.push(case(label("dWg"), &grads.gate.to_f64()?, &r.gate, tol(e.t)));
            cases.push(case(label("dWu"), &grads.up.to_f64()?, &r.up, tol(e.t)));
            cases.push(case(label("dWd"), &grads.down.to_f64()?, &r.down, tol(e.t)));
        }
    }
    Ok(cases)
}
