//! Checks of attention residuals (`crate::attn_res`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "attn_res",
        kernels: &["attn_res", "cast", "reduce"],
        run: check_attn_res,
    }]
}

/// Attention residuals' output and the gradients of the blocks, w_query and w_norm against the
/// f64 reference in every storage dtype: 4 blocks of 2 × 5 tokens, widths 123 (odd: 16-bit
/// outputs through F32) and 300 (past a workgroup's 256 lanes).
fn check_attn_res(engine: &Engine) -> Result<Vec<Case>> {
    use crate::attn_res::{AttnResOptions, attn_res, attn_res_backward};
    use reference::attn_res::AttnResConfig;
    let mut rng = Rng::new(41);
    let mut cases = Vec::new();
    for d in [123, 300] {
        let (n, tokens) = (4, 10);
        for dtype in DType::FLOATS {
            let mut up = |shape: &[usize], lo: f64, hi: f64| {
                let len = shape.iter().product();
                tensor_from_f64(engine, &rng.vec(len, lo, hi), shape, dtype)
            };
            let (v, vs) = up(&[n, 2, 5, d], -2.0, 2.0)?;
            let (q, qs) = up(&[d], -0.5, 0.5)?;
            let (w, ws) = up(&[d], 0.5, 1.5)?;
            let (g, gs) = up(&[2, 5, d], -1.0, 1.0)?;
            let (h, saved) = attn_res(&v, &q, &w, &AttnResOptions::default())?;
            let grads = attn_res_backward(&saved, &g)?;
            let c = AttnResConfig {
                n,
                tokens,
                d,
                eps: f64::from(1e-6f32),
                dtype,
            };
            let want = reference::attn_res::forward(&vs, &qs, &ws, &c);
            let (dv, dq, dw) = reference::attn_res::backward(&vs, &qs, &ws, &gs, &c);
            let label = |name: &str| format!("{name} {dtype} N{n} tokens{tokens} D{d}");
            let tol = Tolerance::for_dtype(dtype).scaled(2.0);
            cases.push(case(label("h"), &h.to_f64()?, &want, tol));
            let tol = Tolerance::for_dtype(DType::F32).scaled(10.0);
            cases.push(case(label("d blocks"), &grads.blocks.to_f64()?, &dv, tol));
            cases.push(case(label("d w_query"), &grads.query.to_f64()?, &dq, tol));
            cases.push(case(label("d w_norm"), &grads.norm.to_f64()?, &dw, tol));
        }
    }
    Ok(cases)
}
