//! Checks of the gated delta family (`crate::gated_delta`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "gated_delta",
        kernels: &["gated_delta", "gated_delta_subgroup"],
        run: check_gated_delta,
    }]
}

/// `gated_delta_forward` / `gated_delta_backward` against the f64 reference: output, final
/// state and all six gradients, for q/k/v stored as F32, F16 and BF16, scalar and per-channel
/// decay, two value heads sharing one key head, T spanning a partial checkpoint segment; the
/// chunked forward (scalar decay) over two chunks, the second partial.
fn check_gated_delta(engine: &Engine) -> Result<Vec<Case>> {
    use crate::gated_delta::{
        DeltaAlgorithm, GatedDeltaOptions, gated_delta_backward, gated_delta_forward,
    };
    use crate::reference::gated_delta::{Dims, backward, forward};
    let (b, hk, hv, kd, vd) = (1, 1, 2, 32, 16);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        for (per_channel, chunked) in [(false, false), (true, false), (false, true)] {
            let t = if chunked { 70 } else { 7 };
            let mut rng = Rng::new(40 + u64::from(dtype.code()));
            let d = Dims {
                batch: b,
                time: t,
                key_heads: hk,
                value_heads: hv,
                key_dim: kd,
                value_dim: vd,
                per_channel,
                scale: 1.0 / (kd as f64).sqrt(),
            };
            let q = rng.vec(b * t * hk * kd, -1.0, 1.0);
            // Unit-norm keys keep the recurrence contractive.
            let mut k = rng.vec(b * t * hk * kd, -1.0, 1.0);
            for row in k.chunks_mut(kd) {
                let n = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                row.iter_mut().for_each(|x| *x /= n);
            }
            let v = rng.vec(b * t * hv * vd, -1.0, 1.0);
            let beta = rng.vec(b * t * hv, 0.05, 1.0);
            let gate_shape: Vec<usize> = if per_channel {
                vec![b, t, hv, kd]
            } else {
                vec![b, t, hv]
            };
            let g = rng.vec(gate_shape.iter().product(), -0.7, 0.0);
            let s0 = rng.vec(b * hv * kd * vd, -0.5, 0.5);
            let dout = rng.vec(b * t * hv * vd, -1.0, 1.0);
            let dfin = rng.vec(b * hv * kd * vd, -1.0, 1.0);
            let (qt, qs) = tensor_from_f64(engine, &q, &[b, t, hk, kd], dtype)?;
            let (kt, ks) = tensor_from_f64(engine, &k, &[b, t, hk, kd], dtype)?;
            let (vt, vs) = tensor_from_f64(engine, &v, &[b, t, hv, vd], dtype)?;
            let f32t = |x: &[f64], shape: &[usize]| tensor_from_f64(engine, x, shape, DType::F32);
            let (bt, bs) = f32t(&beta, &[b, t, hv])?;
            let (gt, gs) = f32t(&g, &gate_shape)?;
            let (st, ss) = f32t(&s0, &[b, hv, kd, vd])?;
            let (dot, dos) = f32t(&dout, &[b, t, hv, vd])?;
            let (dft, dfs) = f32t(&dfin, &[b, hv, kd, vd])?;
            let options = GatedDeltaOptions {
                checkpoint_interval: Some(3),
                algorithm: if chunked {
                    DeltaAlgorithm::Chunked
                } else {
                    DeltaAlgorithm::Recurrent
                },
                ..GatedDeltaOptions::default()
            };
            let (out, saved) = gated_delta_forward(&qt, &kt, &vt, &bt, &gt, Some(&st), &options)?;
            let grads = gated_delta_backward(&saved, Some(&dot), Some(&dft))?;
            let want = forward(&d, &qs, &ks, &vs, &bs, &gs, Some(&ss));
            let wg = backward(
                &d,
                &qs,
                &ks,
                &vs,
                &bs,
                &gs,
                Some(&ss),
                Some(&dos),
                Some(&dfs),
            );
            let decay = match (per_channel, chunked) {
                (true, _) => "per-channel",
                (false, false) => "scalar",
                (false, true) => "scalar chunked",
            };
            let label =
                |what: &str| format!("{dtype} {decay} B{b} T{t} Hk{hk} Hv{hv} K{kd} V{vd} {what}");
            let f32tol = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                label("output"),
                &out.output.to_f64()?,
                &stored_values(&want.output, dtype),
                Tolerance::for_dtype(dtype),
            ));
            cases.push(case(
                label("final_state"),
                &out.final_state.to_f64()?,
                &want.final_state,
                f32tol,
            ));
            for (name, got, w) in [
                ("d_query", &grads.query, &wg.query),
                ("d_key", &grads.key, &wg.key),
                ("d_value", &grads.value, &wg.value),
                ("d_beta", &grads.beta, &wg.beta),
                ("d_log_decay", &grads.log_decay, &wg.log_decay),
                ("d_initial_state", &grads.initial_state, &wg.initial_state),
            ] {
                cases.push(case(label(name), &got.to_f64()?, w, f32tol));
            }
        }
    }
    Ok(cases)
}
