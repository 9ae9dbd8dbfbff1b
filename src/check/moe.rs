//! Checks of the fused mixture of experts (`crate::moe`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "fused_moe",
        kernels: &["moe", "matmul", "activation"],
        run: check_fused_moe,
    }]
}

/// The fused MoE (SwiGLU with kept pre-activations, GeGLU recomputed, SwiGLU with a capacity
/// of 8 slots an expert, which drops some) against the f64
/// reference in every storage dtype: output (also in the storage dtype, `MoeOptions::output`)
/// and the four gradients, 19 tokens of 3 slots over
/// 5 experts (ragged H 21, I 13), slots drawn from −1..=5 so that some route nowhere and some
/// repeat an expert, I32 indices. Where the engine runs tensor cores
/// (`matmul::tensor_cores`), also F16 with `tensor_cores` within
/// `matmul::tensor_core_tolerance` (H 24, I 16: whole 16-byte rows).
fn check_fused_moe(engine: &Engine) -> Result<Vec<Case>> {
    use crate::activation::Activation;
    use crate::matmul::{matmul_tolerance, tensor_core_tolerance, tensor_cores};
    use crate::moe::{MoeOptions, fused_moe, fused_moe_backward};
    use reference::moe::Extents;
    let mut rng = Rng::new(53);
    let mut cases = Vec::new();
    let mut configs = vec![
        (Activation::Silu, false, false, None, true),
        (Activation::GeluTanh, true, false, None, false),
        (Activation::Silu, false, false, Some(8), true),
    ];
    if tensor_cores(engine) {
        configs.push((Activation::Silu, false, true, None, true));
    }
    // `pad`: the default padded layout where the loads allow it, else a launch per expert.
    for (kind, recompute, tc, capacity, pad) in configs {
        let (h, i) = if tc { (24, 16) } else { (21, 13) };
        let e = Extents {
            t: 19,
            h,
            i,
            e: 5,
            k: 3,
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
            let index: Vec<i32> = (0..e.t * e.k)
                .map(|_| (rng.uniform(0.0, 1.0) * 7.0) as i32 - 1)
                .collect();
            let idx = Tensor::from_slice(engine, &index, &[e.t, e.k])?;
            let index: Vec<i64> = index.into_iter().map(i64::from).collect();
            // With a capacity the reference sees the late slots as routed nowhere.
            let index = match capacity {
                Some(c) => reference::moe::with_capacity(&index, e, c),
                None => index,
            };
            let mut up = |shape: &[usize], lo: f64, hi: f64| {
                let len = shape.iter().product();
                tensor_from_f64(engine, &rng.vec(len, lo, hi), shape, dtype)
            };
            let (x, xs) = up(&[e.t, h], -1.0, 1.0)?;
            let (gu, gus) = up(&[e.e, 2 * i, h], -0.4, 0.4)?;
            let (d, ds) = up(&[e.e, h, i], -0.3, 0.3)?;
            let (w, ws) = up(&[e.t, e.k], 0.0, 1.0)?;
            let (dy, dys) = up(&[e.t, h], -1.0, 1.0)?;
            let options = MoeOptions {
                activation: kind,
                recompute,
                tensor_cores: tc,
                capacity,
                pad,
                output: DType::F32,
            };
            let (y, saved) = fused_moe(&x, &gu, &d, &idx, &w, &options)?;
            let g = fused_moe_backward(&saved, &dy)?;
            let want = reference::moe::forward(kind, &xs, &gus, &ds, &index, &ws, e);
            let r = reference::moe::backward(kind, &xs, &gus, &ds, &index, &ws, &dys, e);
            let label = |what: &str| {
                format!(
                    "{what} {} {dtype} T{} K{} E{} H{h} I{i} recompute {recompute} tensor cores {tc} capacity {capacity:?} padded {}",
                    kind.name(),
                    e.t,
                    e.k,
                    e.e,
                    saved.routing().padded()
                )
            };
            let per_token = h + i;
            cases.push(case(label("y"), &y.to_f64()?, &want, tol(per_token)));
            if dtype != DType::F32 {
                // The output in the storage dtype, within that dtype's policy.
                let as_dtype = MoeOptions {
                    output: dtype,
                    ..options
                };
                let (y16, _) = fused_moe(&x, &gu, &d, &idx, &w, &as_dtype)?;
                cases.push(case(
                    label("y in the storage dtype"),
                    &y16.to_f64()?,
                    &want,
                    Tolerance::for_dtype(dtype),
                ));
            }
            cases.push(case(label("dx"), &g.x.to_f64()?, &r.x, tol(per_token)));
            cases.push(case(
                label("d gate_up"),
                &g.gate_up.to_f64()?,
                &r.gate_up,
                tol(e.t + h),
            ));
            cases.push(case(
                label("d down"),
                &g.down.to_f64()?,
                &r.down,
                tol(e.t + i),
            ));
            cases.push(case(
                label("d weights"),
                &g.weights.to_f64()?,
                &r.weights,
                tol(per_token),
            ));
        }
    }
    Ok(cases)
}
