//! Checks of the normalization family (`crate::norm`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "rms_norm",
            kernels: &["norm", "norm_mid", "norm_wide", "cast"],
            run: check_rms_norm,
        },
        OperatorCheck {
            name: "norm_backward_as",
            kernels: &["norm", "norm_mid", "norm_wide", "cast"],
            run: check_norm_backward_as,
        },
        OperatorCheck {
            name: "layer_norm",
            kernels: &["norm", "norm_mid", "norm_wide", "cast"],
            run: check_layer_norm,
        },
        OperatorCheck {
            name: "add_rms_norm",
            kernels: &["norm", "norm_mid", "norm_wide", "cast"],
            run: check_add_rms_norm,
        },
        OperatorCheck {
            name: "modulated_rms_norm",
            kernels: &["norm", "cast"],
            run: check_modulated_rms_norm,
        },
        OperatorCheck {
            name: "dyt",
            kernels: &["norm"],
            run: check_dyt,
        },
        OperatorCheck {
            name: "poly_norm",
            kernels: &["norm", "cast"],
            run: check_poly_norm,
        },
        OperatorCheck {
            name: "group_norm",
            kernels: &["norm", "cast"],
            run: check_group_norm,
        },
    ]
}

// ---- normalization ----

/// Shapes of the normalization checks: a ragged odd width (16-bit outputs through the FP32
/// temporary) and an even one over several parameter blocks.
const NORM_SHAPES: [(usize, usize); 2] = [(7, 127), (70, 64)];
/// More shapes for the register paths of RMSNorm, LayerNorm and add+RMSNorm, on the lanes of
/// `norm::forward_lanes` and `norm::mid_backward`: blocks of several rows with 1 or 2 chunks a
/// lane (add+RMSNorm F32 on 512 lanes), F32 rows of 4,096 columns (backward on 512 lanes), and
/// 16,384 columns (16-bit forwards on 512 lanes, LayerNorm F32 on 512 × 8, RMSNorm and
/// add+RMSNorm F32 on 1,024).
const REGISTER_SHAPES: [(usize, usize); 3] = [(300, 2048), (5, 4096), (3, 16384)];

pub(super) fn check_rms_norm(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{CastingMode, RmsNormOptions, norm_backward, rms_norm};
    let mut rng = Rng::new(40);
    let mut cases = Vec::new();
    for (rows, cols) in NORM_SHAPES.into_iter().chain(REGISTER_SHAPES) {
        for dtype in DType::FLOATS {
            for (casting, offset) in [(CastingMode::Llama, 0.0), (CastingMode::Gemma, 1.0)] {
                let tag = format!("{rows}x{cols} {dtype} {casting:?}");
                let (x, xs) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * cols, -2.0, 2.0),
                    &[rows, cols],
                    dtype,
                )?;
                let (w, ws) = tensor_from_f64(engine, &rng.vec(cols, -1.0, 1.5), &[cols], dtype)?;
                let (dy, dys) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * cols, -1.0, 1.0),
                    &[rows, cols],
                    dtype,
                )?;
                let o = RmsNormOptions {
                    casting,
                    offset,
                    ..RmsNormOptions::default()
                };
                let (y, saved) = rms_norm(&x, Some(&w), &o)?;
                let eps = f64::from(o.eps);
                let want = reference::norm::rms_norm(
                    &xs,
                    rows,
                    cols,
                    Some(&ws),
                    f64::from(offset),
                    eps,
                    casting,
                    dtype,
                );
                cases.push(case(
                    format!("{tag} y"),
                    &y.to_f64()?,
                    &want,
                    Tolerance::for_dtype(dtype),
                ));
                let g = norm_backward(&saved, &dy, None)?;
                let r = reference::norm::rms_norm_backward(
                    &xs,
                    rows,
                    cols,
                    Some(&ws),
                    f64::from(offset),
                    eps,
                    &dys,
                );
                let f32 = Tolerance::for_dtype(DType::F32);
                cases.push(case(
                    format!("{tag} dx"),
                    &g.source.to_f64()?,
                    &r.source,
                    f32,
                ));
                if let Some(dw) = &g.weight {
                    cases.push(case(format!("{tag} dw"), &dw.to_f64()?, &r.weight, f32));
                }
            }
        }
    }
    Ok(cases)
}

/// RMSNorm and LayerNorm source gradients stored in the source's dtype (`norm_backward_as`):
/// 16-bit register rows (2,048 and 16,384 columns) take the direct 16-bit stores, 127 columns
/// the F32 gradient narrowed; the source gradient against the reference at the dtype's
/// tolerance, the weight gradient (F32) at F32's.
pub(super) fn check_norm_backward_as(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{LayerNormOptions, RmsNormOptions, layer_norm, norm_backward_as, rms_norm};
    use reference::norm as r;
    let mut rng = Rng::new(47);
    let mut cases = Vec::new();
    for (rows, cols) in [(7, 127), (30, 2048), (5, 4096), (3, 16384)] {
        for dtype in DType::FLOATS {
            let n = rows * cols;
            let (x, xs) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[rows, cols], dtype)?;
            let (w, ws) = tensor_from_f64(engine, &rng.vec(cols, 0.5, 1.5), &[cols], dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
            let eps = f64::from(RmsNormOptions::default().eps);
            let (_, rms) = rms_norm(&x, Some(&w), &RmsNormOptions::default())?;
            let want_rms = r::rms_norm_backward(&xs, rows, cols, Some(&ws), 0.0, eps, &dys);
            let (_, layer) = layer_norm(&x, Some(&w), None, &LayerNormOptions::default())?;
            let want_layer = r::layer_norm_backward(&xs, rows, cols, Some(&ws), eps, &dys);
            for (name, saved, want) in [("rms", rms, want_rms), ("layer", layer, want_layer)] {
                let tag = format!("{name} {rows}x{cols} {dtype}");
                let g = norm_backward_as(&saved, &dy, None, dtype)?;
                cases.push(case(
                    format!("{tag} dx"),
                    &g.source.to_f64()?,
                    &crate::gradcheck::stored_values(&want.source, dtype),
                    Tolerance::for_dtype(dtype),
                ));
                if let Some(dw) = &g.weight {
                    let f32 = Tolerance::for_dtype(DType::F32);
                    cases.push(case(format!("{tag} dw"), &dw.to_f64()?, &want.weight, f32));
                }
            }
        }
    }
    Ok(cases)
}

pub(super) fn check_layer_norm(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{LayerNormOptions, layer_norm, norm_backward};
    let mut rng = Rng::new(41);
    let mut cases = Vec::new();
    for (rows, cols) in NORM_SHAPES.into_iter().chain(REGISTER_SHAPES) {
        for dtype in DType::FLOATS {
            let tag = format!("{rows}x{cols} {dtype}");
            let (x, xs) = tensor_from_f64(
                engine,
                &rng.vec(rows * cols, -2.0, 2.0),
                &[rows, cols],
                dtype,
            )?;
            let (w, ws) = tensor_from_f64(engine, &rng.vec(cols, 0.5, 1.5), &[cols], dtype)?;
            let (b, bs) = tensor_from_f64(engine, &rng.vec(cols, -0.5, 0.5), &[cols], dtype)?;
            let (dy, dys) = tensor_from_f64(
                engine,
                &rng.vec(rows * cols, -1.0, 1.0),
                &[rows, cols],
                dtype,
            )?;
            let o = LayerNormOptions::default();
            let eps = f64::from(o.eps);
            let (y, saved) = layer_norm(&x, Some(&w), Some(&b), &o)?;
            let want = reference::norm::layer_norm(&xs, rows, cols, Some(&ws), Some(&bs), eps);
            cases.push(case(
                format!("{tag} y"),
                &y.to_f64()?,
                &want,
                Tolerance::for_dtype(dtype),
            ));
            let g = norm_backward(&saved, &dy, None)?;
            let r = reference::norm::layer_norm_backward(&xs, rows, cols, Some(&ws), eps, &dys);
            let f32 = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                format!("{tag} dx"),
                &g.source.to_f64()?,
                &r.source,
                f32,
            ));
            if let (Some(dw), Some(db)) = (&g.weight, &g.bias) {
                cases.push(case(format!("{tag} dw"), &dw.to_f64()?, &r.weight, f32));
                cases.push(case(format!("{tag} db"), &db.to_f64()?, &r.bias, f32));
            }
        }
    }
    Ok(cases)
}

pub(super) fn check_add_rms_norm(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{CastingMode, RmsNormOptions, add_rms_norm, norm_backward};
    let mut rng = Rng::new(42);
    let mut cases = Vec::new();
    for (rows, cols) in NORM_SHAPES.into_iter().chain(REGISTER_SHAPES) {
        for dtype in DType::FLOATS {
            let tag = format!("{rows}x{cols} {dtype}");
            let n = rows * cols;
            let (x, xs) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[rows, cols], dtype)?;
            let (r, rs) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[rows, cols], dtype)?;
            let (w, ws) = tensor_from_f64(engine, &rng.vec(cols, 0.5, 1.5), &[cols], dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
            let (ds, dss) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
            let o = RmsNormOptions::default();
            let eps = f64::from(o.eps);
            let (y, sum, saved) = add_rms_norm(&x, &r, Some(&w), &o)?;
            let (want_y, want_s) = reference::norm::add_rms_norm(
                &xs,
                &rs,
                rows,
                cols,
                Some(&ws),
                0.0,
                eps,
                CastingMode::Llama,
                dtype,
            );
            let tol = Tolerance::for_dtype(dtype);
            cases.push(case(format!("{tag} y"), &y.to_f64()?, &want_y, tol));
            cases.push(case(format!("{tag} sum"), &sum.to_f64()?, &want_s, tol));
            let g = norm_backward(&saved, &dy, Some(&ds))?;
            let want = reference::norm::add_rms_norm_backward(
                &xs,
                &rs,
                rows,
                cols,
                Some(&ws),
                0.0,
                eps,
                &dys,
                Some(&dss),
            );
            let f32 = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                format!("{tag} dx"),
                &g.source.to_f64()?,
                &want.source,
                f32,
            ));
            if let (Some(dr), Some(dw)) = (&g.residual, &g.weight) {
                cases.push(case(
                    format!("{tag} dresidual"),
                    &dr.to_f64()?,
                    &want.source,
                    f32,
                ));
                cases.push(case(format!("{tag} dw"), &dw.to_f64()?, &want.weight, f32));
            }
        }
    }
    Ok(cases)
}

fn check_modulated_rms_norm(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{RmsNormOptions, modulated_rms_norm, norm_backward};
    let mut rng = Rng::new(43);
    let mut cases = Vec::new();
    for (rows, cols) in NORM_SHAPES {
        let batches = if rows % 2 == 0 { 2 } else { 1 };
        for dtype in DType::FLOATS {
            let tag = format!("{rows}x{cols} batches {batches} {dtype}");
            let n = rows * cols;
            let (x, xs) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[rows, cols], dtype)?;
            let (w, ws) = tensor_from_f64(engine, &rng.vec(cols, -0.5, 0.5), &[cols], dtype)?;
            let m = [batches, cols];
            let (sc, scs) =
                tensor_from_f64(engine, &rng.vec(batches * cols, -0.5, 0.5), &m, dtype)?;
            let (sh, shs) =
                tensor_from_f64(engine, &rng.vec(batches * cols, -0.5, 0.5), &m, dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
            let o = RmsNormOptions {
                offset: 1.0,
                ..RmsNormOptions::default()
            };
            let eps = f64::from(o.eps);
            let (y, saved) = modulated_rms_norm(&x, Some(&w), &sc, &sh, &o)?;
            let want = reference::norm::modulated_rms_norm(
                &xs,
                rows,
                cols,
                batches,
                Some(&ws),
                1.0,
                &scs,
                &shs,
                eps,
            );
            cases.push(case(
                format!("{tag} y"),
                &y.to_f64()?,
                &want,
                Tolerance::for_dtype(dtype),
            ));
            let g = norm_backward(&saved, &dy, None)?;
            let r = reference::norm::modulated_rms_norm_backward(
                &xs,
                rows,
                cols,
                batches,
                Some(&ws),
                1.0,
                &scs,
                eps,
                &dys,
            );
            let f32 = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                format!("{tag} dx"),
                &g.source.to_f64()?,
                &r.source,
                f32,
            ));
            if let (Some(dw), Some(dsc), Some(dsh)) = (&g.weight, &g.scale, &g.shift) {
                cases.push(case(format!("{tag} dw"), &dw.to_f64()?, &r.weight, f32));
                cases.push(case(format!("{tag} dscale"), &dsc.to_f64()?, &r.scale, f32));
                cases.push(case(format!("{tag} dshift"), &dsh.to_f64()?, &r.bias, f32));
            }
        }
    }
    Ok(cases)
}

fn check_dyt(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{dyt, dyt_backward};
    let mut rng = Rng::new(44);
    let mut cases = Vec::new();
    for (rows, cols) in NORM_SHAPES {
        for dtype in DType::FLOATS {
            let tag = format!("{rows}x{cols} {dtype}");
            let n = rows * cols;
            let (x, xs) = tensor_from_f64(engine, &rng.vec(n, -3.0, 3.0), &[rows, cols], dtype)?;
            let (a, a_s) = tensor_from_f64(engine, &[0.7], &[1], dtype)?;
            let (g, gs) = tensor_from_f64(engine, &rng.vec(cols, 0.5, 1.5), &[cols], dtype)?;
            let (b, bs) = tensor_from_f64(engine, &rng.vec(cols, -0.5, 0.5), &[cols], dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
            let (y, saved) = dyt(&x, &a, &g, Some(&b))?;
            let want = reference::norm::dyt(&xs, rows, cols, a_s[0], &gs, Some(&bs));
            cases.push(case(
                format!("{tag} y"),
                &y.to_f64()?,
                &want,
                Tolerance::for_dtype(dtype),
            ));
            let grads = dyt_backward(&saved, &dy)?;
            let r = reference::norm::dyt_backward(&xs, rows, cols, a_s[0], &gs, &dys);
            let f32 = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                format!("{tag} dx"),
                &grads.source.to_f64()?,
                &r.source,
                f32,
            ));
            cases.push(case(
                format!("{tag} dalpha"),
                &grads.alpha.to_f64()?,
                &[r.alpha],
                f32,
            ));
            cases.push(case(
                format!("{tag} dgamma"),
                &grads.gamma.to_f64()?,
                &r.gamma,
                f32,
            ));
            if let Some(db) = &grads.beta {
                cases.push(case(format!("{tag} dbeta"), &db.to_f64()?, &r.beta, f32));
            }
        }
    }
    Ok(cases)
}

fn check_poly_norm(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{PolyNormOptions, poly_norm, poly_norm_backward};
    let mut rng = Rng::new(45);
    let mut cases = Vec::new();
    for (rows, cols) in NORM_SHAPES {
        for dtype in DType::FLOATS {
            let tag = format!("{rows}x{cols} {dtype}");
            let n = rows * cols;
            let (x, xs) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[rows, cols], dtype)?;
            let (w, ws) = tensor_from_f64(engine, &rng.vec(3, -1.0, 1.0), &[3], dtype)?;
            let (b, bs) = tensor_from_f64(engine, &[0.25], &[1], dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, cols], dtype)?;
            let o = PolyNormOptions::default();
            let eps = f64::from(o.eps);
            let (y, saved) = poly_norm(&x, &w, Some(&b), &o)?;
            let want = reference::norm::poly_norm(&xs, rows, cols, &ws, Some(bs[0]), eps);
            cases.push(case(
                format!("{tag} y"),
                &y.to_f64()?,
                &want,
                Tolerance::for_dtype(dtype),
            ));
            let g = poly_norm_backward(&saved, &dy)?;
            let r = reference::norm::poly_norm_backward(&xs, rows, cols, &ws, eps, &dys);
            let f32 = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                format!("{tag} dx"),
                &g.source.to_f64()?,
                &r.source,
                f32,
            ));
            cases.push(case(
                format!("{tag} dw"),
                &g.weight.to_f64()?,
                &r.weight,
                f32,
            ));
            if let Some(db) = &g.bias {
                cases.push(case(format!("{tag} db"), &db.to_f64()?, &[r.bias], f32));
            }
        }
    }
    Ok(cases)
}

fn check_group_norm(engine: &Engine) -> Result<Vec<Case>> {
    use crate::norm::{GroupNormOptions, group_norm, norm_backward};
    let mut rng = Rng::new(46);
    let mut cases = Vec::new();
    for (samples, channels, spatial, groups) in [(3, 6, 7, 3), (2, 8, 16, 2)] {
        for dtype in DType::FLOATS {
            let tag = format!("[{samples}, {channels}, {spatial}] groups {groups} {dtype}");
            let shape = [samples, channels, spatial];
            let n = samples * channels * spatial;
            let (x, xs) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &shape, dtype)?;
            let (w, ws) =
                tensor_from_f64(engine, &rng.vec(channels, 0.5, 1.5), &[channels], dtype)?;
            let (b, bs) =
                tensor_from_f64(engine, &rng.vec(channels, -0.5, 0.5), &[channels], dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &shape, dtype)?;
            let o = GroupNormOptions::default();
            let eps = f64::from(o.eps);
            let (y, saved) = group_norm(&x, groups, Some(&w), Some(&b), &o)?;
            let want = reference::norm::group_norm(
                &xs,
                samples,
                channels,
                spatial,
                groups,
                Some(&ws),
                Some(&bs),
                eps,
            );
            cases.push(case(
                format!("{tag} y"),
                &y.to_f64()?,
                &want,
                Tolerance::for_dtype(dtype),
            ));
            let g = norm_backward(&saved, &dy, None)?;
            let r = reference::norm::group_norm_backward(
                &xs,
                samples,
                channels,
                spatial,
                groups,
                Some(&ws),
                eps,
                &dys,
            );
            let f32 = Tolerance::for_dtype(DType::F32);
            cases.push(case(
                format!("{tag} dx"),
                &g.source.to_f64()?,
                &r.source,
                f32,
            ));
            if let (Some(dw), Some(db)) = (&g.weight, &g.bias) {
                cases.push(case(format!("{tag} dw"), &dw.to_f64()?, &r.weight, f32));
                cases.push(case(format!("{tag} db"), &db.to_f64()?, &r.bias, f32));
            }
        }
    }
    Ok(cases)
}
