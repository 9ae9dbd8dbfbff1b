//! Checks of manifold-constrained hyper-connections (`crate::mhc`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "mhc_coefficients",
            kernels: &["mhc", "matmul", "reduce"],
            run: check_coefficients,
        },
        OperatorCheck {
            name: "mhc_pre",
            kernels: &["mhc", "cast"],
            run: check_pre,
        },
        OperatorCheck {
            name: "mhc_post_res",
            kernels: &["mhc", "cast"],
            run: check_post_res,
        },
    ]
}

fn config(tokens: usize, n: usize, c: usize) -> reference::mhc::MhcConfig {
    reference::mhc::MhcConfig {
        tokens,
        n,
        c,
        tmax: 20,
        rms_eps: f64::from(1e-6f32),
        pre_eps: 0.0,
        sinkhorn_eps: f64::from(1e-6f32),
        post_mult: 2.0,
    }
}

/// The coefficients h_pre, h_post, h_res and the gradients of x, phi, b and the three gains
/// against the f64 reference in every storage dtype: 2 × 3 tokens of 4 streams of width 33.
fn check_coefficients(engine: &Engine) -> Result<Vec<Case>> {
    use crate::mhc::{MhcOptions, mhc_coefficients, mhc_coefficients_backward};
    let mut rng = Rng::new(43);
    let mut cases = Vec::new();
    let (n, c) = (4, 33);
    let cfg = config(6, n, c);
    let (k, m) = (cfg.k(), cfg.m());
    for dtype in DType::FLOATS {
        let mut up = |shape: &[usize], lo: f64, hi: f64| {
            let len = shape.iter().product();
            tensor_from_f64(engine, &rng.vec(len, lo, hi), shape, dtype)
        };
        let (x, xs) = up(&[2, 3, n, c], -1.0, 1.0)?;
        let (phi, phis) = up(&[k, m], -0.2, 0.2)?;
        let (b, bs) = up(&[m], -0.5, 0.5)?;
        let (a1, a1s) = up(&[1], 0.5, 1.5)?;
        let (a2, a2s) = up(&[1], 0.5, 1.5)?;
        let (a3, a3s) = up(&[1], 0.5, 1.5)?;
        let (g1, g1s) = up(&[2, 3, n], -1.0, 1.0)?;
        let (g2, g2s) = up(&[2, 3, n], -1.0, 1.0)?;
        let (g3, g3s) = up(&[2, 3, n, n], -1.0, 1.0)?;
        let alphas = [a1s[0], a2s[0], a3s[0]];
        let (h, saved) = mhc_coefficients(&x, &phi, &b, &a1, &a2, &a3, &MhcOptions::default())?;
        let grads = mhc_coefficients_backward(&saved, Some(&g1), Some(&g2), Some(&g3))?;
        let want = reference::mhc::coefficients(&xs, &phis, &bs, alphas, &cfg);
        let wg =
            reference::mhc::coefficients_backward(&xs, &phis, &bs, alphas, &g1s, &g2s, &g3s, &cfg);
        let label = |name: &str| format!("{name} {dtype} tokens6 HC{n} C{c}");
        let tol = Tolerance::for_dtype(DType::F32).scaled(10.0);
        cases.push(case(label("h_pre"), &h.h_pre.to_f64()?, &want.h_pre, tol));
        cases.push(case(
            label("h_post"),
            &h.h_post.to_f64()?,
            &want.h_post,
            tol,
        ));
        cases.push(case(label("h_res"), &h.h_res.to_f64()?, &want.h_res, tol));
        cases.push(case(label("d x"), &grads.x.to_f64()?, &wg.x, tol));
        cases.push(case(label("d phi"), &grads.phi.to_f64()?, &wg.phi, tol));
        cases.push(case(label("d b"), &grads.b.to_f64()?, &wg.b, tol));
        let dalphas = [
            grads.alpha_pre.to_f64()?[0],
            grads.alpha_post.to_f64()?[0],
            grads.alpha_res.to_f64()?[0],
        ];
        cases.push(case(label("d alphas"), &dalphas, &wg.alphas, tol));
    }
    Ok(cases)
}

/// The pre-aggregation's output and the gradients of x and h_pre in every storage dtype: 2 × 3
/// tokens of 4 streams of widths 123 (odd: 16-bit outputs through F32) and 300.
fn check_pre(engine: &Engine) -> Result<Vec<Case>> {
    use crate::mhc::{mhc_pre, mhc_pre_backward};
    let mut rng = Rng::new(44);
    let mut cases = Vec::new();
    for c in [123, 300] {
        let n = 4;
        let cfg = config(6, n, c);
        for dtype in DType::FLOATS {
            let mut up = |shape: &[usize], lo: f64, hi: f64| {
                let len = shape.iter().product();
                tensor_from_f64(engine, &rng.vec(len, lo, hi), shape, dtype)
            };
            let (x, xs) = up(&[2, 3, n, c], -2.0, 2.0)?;
            let (h, hs) = up(&[2, 3, n], 0.0, 1.0)?;
            let (g, gs) = up(&[2, 3, c], -1.0, 1.0)?;
            let (out, saved) = mhc_pre(&x, &h)?;
            let grads = mhc_pre_backward(&saved, &g)?;
            let want = stored_values(&reference::mhc::pre(&xs, &hs, &cfg), dtype);
            let (dx, dh) = reference::mhc::pre_backward(&xs, &hs, &gs, &cfg);
            let label = |name: &str| format!("{name} {dtype} tokens6 HC{n} C{c}");
            let tol = Tolerance::for_dtype(dtype).scaled(2.0);
            cases.push(case(label("out"), &out.to_f64()?, &want, tol));
            let tol = Tolerance::for_dtype(DType::F32).scaled(10.0);
            cases.push(case(label("d x"), &grads.x.to_f64()?, &dx, tol));
            cases.push(case(label("d h_pre"), &grads.h_pre.to_f64()?, &dh, tol));
        }
    }
    Ok(cases)
}

/// The post + residual mix's output and the gradients of x, f_out, h_post and h_res in every
/// storage dtype (f_out in another dtype than x): 2 × 3 tokens of 4 streams of widths 123 and
/// 300.
fn check_post_res(engine: &Engine) -> Result<Vec<Case>> {
    use crate::mhc::{mhc_post_res, mhc_post_res_backward};
    let mut rng = Rng::new(45);
    let mut cases = Vec::new();
    for c in [123, 300] {
        let n = 4;
        let cfg = config(6, n, c);
        for (dtype, f_dtype) in [
            (DType::F32, DType::BF16),
            (DType::F16, DType::F32),
            (DType::BF16, DType::F16),
        ] {
            let mut up = |shape: &[usize], lo: f64, hi: f64, dt: DType| {
                let len = shape.iter().product();
                tensor_from_f64(engine, &rng.vec(len, lo, hi), shape, dt)
            };
            let (x, xs) = up(&[2, 3, n, c], -2.0, 2.0, dtype)?;
            let (f, fs) = up(&[2, 3, c], -2.0, 2.0, f_dtype)?;
            let (hp, hps) = up(&[2, 3, n], 0.0, 2.0, DType::F32)?;
            let (hr, hrs) = up(&[2, 3, n, n], 0.0, 0.5, DType::F32)?;
            let (g, gs) = up(&[2, 3, n, c], -1.0, 1.0, dtype)?;
            let (out, saved) = mhc_post_res(&x, &f, &hp, &hr)?;
            let grads = mhc_post_res_backward(&saved, &g)?;
            let want = stored_values(&reference::mhc::post_res(&xs, &fs, &hps, &hrs, &cfg), dtype);
            let (dx, df, dp, dr) =
                reference::mhc::post_res_backward(&xs, &fs, &hps, &hrs, &gs, &cfg);
            let label = |name: &str| format!("{name} {dtype} f_out {f_dtype} tokens6 HC{n} C{c}");
            let tol = Tolerance::for_dtype(dtype).scaled(2.0);
            cases.push(case(label("out"), &out.to_f64()?, &want, tol));
            let tol = Tolerance::for_dtype(DType::F32).scaled(10.0);
            cases.push(case(label("d x"), &grads.x.to_f64()?, &dx, tol));
            cases.push(case(label("d f_out"), &grads.f_out.to_f64()?, &df, tol));
            cases.push(case(label("d h_post"), &grads.h_post.to_f64()?, &dp, tol));
            cases.push(case(label("d h_res"), &grads.h_res.to_f64()?, &dr, tol));
        }
    }
    Ok(cases)
}
