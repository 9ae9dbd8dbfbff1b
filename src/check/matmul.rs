//! Checks of the dense matmul family (`crate::matmul`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "matmul",
            kernels: &["matmul", "activation", "reduce"],
            run: check_matmul,
        },
        OperatorCheck {
            name: "matmul_as",
            kernels: &["matmul", "cast"],
            run: check_matmul_as,
        },
        OperatorCheck {
            name: "matmul_tensor_cores",
            kernels: &["matmul_tc", "matmul"],
            run: check_matmul_tensor_cores,
        },
    ]
}

/// The opt-in tensor-core product (`MatmulOptions::tensor_cores`, F16 or BF16 operands).
/// Where the engine cannot run it (`matmul::tensor_cores`), one case records that the call is
/// refused with `MissingFeature` (any other outcome is an error). Where it can, against the
/// f64 reference within `matmul::tensor_core_tolerance`: a `[256, 192] · [128, 192]ᵀ` forward
/// and its backward with an F16 cotangent (both products on tensor cores); a batched A with a
/// shared, non-transposed B; BF16 operands outside F16's range (A below 2^-20, B near 2^20,
/// which the product scales into it by powers of two), forward and backward with a BF16
/// cotangent; a linear layer (BF16 bias, with tanh-GELU and without an activation) on a
/// ragged tile.
fn check_matmul_tensor_cores(engine: &Engine) -> Result<Vec<Case>> {
    use crate::matmul::{
        MatmulOptions, matmul, matmul_backward, tensor_core_tolerance, tensor_cores,
    };
    use reference::matmul::Problem;
    let options = |transpose_b| MatmulOptions {
        transpose_b,
        tensor_cores: true,
        ..Default::default()
    };
    let mut rng = Rng::new(7);
    if !tensor_cores(engine) {
        let (a, _) = tensor_from_f64(
            engine,
            &rng.vec(128 * 64, -1.0, 1.0),
            &[128, 64],
            DType::F16,
        )?;
        let (b, _) = tensor_from_f64(
            engine,
            &rng.vec(64 * 128, -1.0, 1.0),
            &[64, 128],
            DType::F16,
        )?;
        return match matmul(&a, &b, None, &options(false)) {
            Err(crate::Error::MissingFeature { .. }) => Ok(vec![case(
                "refused with MissingFeature: no tensor cores on this adapter".into(),
                &[1.0],
                &[1.0],
                Tolerance::EXACT,
            )]),
            Err(e) => Err(e),
            Ok(_) => Err(crate::Error::Device(
                "a tensor-core product ran on an engine without tensor cores".into(),
            )),
        };
    }
    let mut cases = Vec::new();
    let problems = [
        Problem {
            transpose_b: true,
            ..Problem::new(256, 128, 192)
        },
        Problem {
            batch: 2,
            a_batched: true,
            ..Problem::new(128, 256, 72)
        },
    ];
    for p in &problems {
        let mut a_shape = vec![p.m, p.k];
        let b_shape = if p.transpose_b {
            vec![p.n, p.k]
        } else {
            vec![p.k, p.n]
        };
        let mut out_shape = vec![p.m, p.n];
        if p.a_batched {
            a_shape.insert(0, p.batch);
            out_shape.insert(0, p.batch);
        }
        let (a, a_s) =
            tensor_from_f64(engine, &rng.vec(p.a_len(), -1.0, 1.0), &a_shape, DType::F16)?;
        let (b, b_s) =
            tensor_from_f64(engine, &rng.vec(p.b_len(), -1.0, 1.0), &b_shape, DType::F16)?;
        let (dy, dy_s) = tensor_from_f64(
            engine,
            &rng.vec(p.out_len(), -1.0, 1.0),
            &out_shape,
            DType::F16,
        )?;
        let (y, saved) = matmul(&a, &b, None, &options(p.transpose_b))?;
        let grads = matmul_backward(&saved, &dy)?;
        let want = reference::matmul::forward(p, &a_s, &b_s, None);
        let (da, db, _) = reference::matmul::backward(p, &a_s, &b_s, None, &dy_s);
        let label = |what: &str| format!("{what} f16 a {a_shape:?} b {b_shape:?} tensor cores");
        cases.push(case(
            label("y"),
            &y.to_f64()?,
            &want,
            tensor_core_tolerance(p.k),
        ));
        cases.push(case(
            label("dA"),
            &grads.a.to_f64()?,
            &da,
            tensor_core_tolerance(p.n),
        ));
        cases.push(case(
            label("dB"),
            &grads.b.to_f64()?,
            &db,
            tensor_core_tolerance(p.batch * p.m),
        ));
    }
    // BF16 operands, each scaled into F16 by its power of two: A's values below 2^-20 and
    // B's near 2^20 (neither within F16's normal range), a `[N, K]` B, then the backward
    // with a BF16 cotangent; compared with the powers divided out (exactly).
    let p = Problem {
        transpose_b: true,
        ..Problem::new(160, 136, 96)
    };
    let spread = |v: Vec<f64>, power: i32| -> Vec<f64> {
        v.into_iter().map(|x| x * 2f64.powi(power)).collect()
    };
    let (a, a_s) = tensor_from_f64(
        engine,
        &spread(rng.vec(p.a_len(), -1.0, 1.0), -20),
        &[p.m, p.k],
        DType::BF16,
    )?;
    let (b, b_s) = tensor_from_f64(
        engine,
        &spread(rng.vec(p.b_len(), -1.0, 1.0), 20),
        &[p.n, p.k],
        DType::BF16,
    )?;
    let (dy, dy_s) = tensor_from_f64(
        engine,
        &rng.vec(p.out_len(), -1.0, 1.0),
        &[p.m, p.n],
        DType::BF16,
    )?;
    let (y, saved) = matmul(&a, &b, None, &options(true))?;
    let grads = matmul_backward(&saved, &dy)?;
    let (da, db, _) = reference::matmul::backward(&p, &a_s, &b_s, None, &dy_s);
    let label = |what: &str| format!("{what} bf16 a [160, 96]·2^-20 b [136, 96]·2^20 tensor cores");
    let unscale = |v: Vec<f64>, power: i32| spread(v, -power);
    cases.push(case(
        label("y"),
        &y.to_f64()?,
        &reference::matmul::forward(&p, &a_s, &b_s, None),
        tensor_core_tolerance(p.k),
    ));
    cases.push(case(
        label("dA·2^-20"),
        &unscale(grads.a.to_f64()?, 20),
        &unscale(da, 20),
        tensor_core_tolerance(p.n),
    ));
    cases.push(case(
        label("dB·2^20"),
        &unscale(grads.b.to_f64()?, -20),
        &unscale(db, -20),
        tensor_core_tolerance(p.m),
    ));
    // A linear layer on tensor cores, bias (BF16) on a ragged tile: with tanh-GELU (the
    // epilogue entry), and without an activation (the bias added to whole fragments).
    for activation in [Some(crate::activation::Activation::GeluTanh), None] {
        let p = Problem {
            transpose_b: true,
            activation,
            ..Problem::new(136, 200, 72)
        };
        let (a, a_s) = tensor_from_f64(
            engine,
            &rng.vec(p.a_len(), -1.0, 1.0),
            &[p.m, p.k],
            DType::F16,
        )?;
        let (b, b_s) = tensor_from_f64(
            engine,
            &rng.vec(p.b_len(), -1.0, 1.0),
            &[p.n, p.k],
            DType::F16,
        )?;
        let (bias, bias_s) =
            tensor_from_f64(engine, &rng.vec(p.n, -1.0, 1.0), &[p.n], DType::BF16)?;
        let layer = MatmulOptions {
            activation: p.activation,
            ..options(true)
        };
        let (y, _) = matmul(&a, &b, Some(&bias), &layer)?;
        let act = activation.map_or("".to_string(), |a| format!("{a:?} of "));
        cases.push(case(
            format!(
                "y = {act}a·bᵀ + bias, f16 a [{}, {}] bias bf16, tensor cores",
                p.m, p.k
            ),
            &y.to_f64()?,
            &reference::matmul::forward(&p, &a_s, &b_s, Some(&bias_s)),
            tensor_core_tolerance(p.k + 1),
        ));
    }
    Ok(cases)
}

/// Matmul forward and backward (dA, dB, dbias) against the f64 reference in every storage
/// dtype: ragged extents (edge tiles in M, N and K), weights stored `[N, K]` (transposed B)
/// shared by 2 batches, a bias and the tanh-GELU epilogue; then a plain product with a
/// transposed batched A and no bias; then a split-K product (one tile per batch, K 4,100 in
/// two slices, `matmul::gemm_split`) with a bias.
fn check_matmul(engine: &Engine) -> Result<Vec<Case>> {
    use crate::activation::Activation;
    use crate::matmul::{MatmulOptions, matmul, matmul_backward, matmul_tolerance};
    use reference::matmul::Problem;
    let mut rng = Rng::new(5);
    let mut cases = Vec::new();
    let problems = [
        Problem {
            batch: 2,
            a_batched: true,
            transpose_b: true,
            activation: Some(Activation::GeluTanh),
            ..Problem::new(37, 70, 45)
        },
        Problem {
            batch: 2,
            a_batched: true,
            b_batched: true,
            transpose_a: true,
            ..Problem::new(130, 9, 33)
        },
        Problem {
            batch: 2,
            a_batched: true,
            transpose_b: true,
            ..Problem::new(24, 40, 4100)
        },
    ];
    for (i, p) in problems.iter().enumerate() {
        let with_bias = i != 1;
        let mut a_shape = if p.transpose_a {
            vec![p.k, p.m]
        } else {
            vec![p.m, p.k]
        };
        let mut b_shape = if p.transpose_b {
            vec![p.n, p.k]
        } else {
            vec![p.k, p.n]
        };
        if p.a_batched {
            a_shape.insert(0, p.batch);
        }
        if p.b_batched {
            b_shape.insert(0, p.batch);
        }
        let out_shape = [p.batch, p.m, p.n];
        for dtype in DType::FLOATS {
            let (a, a_s) =
                tensor_from_f64(engine, &rng.vec(p.a_len(), -1.0, 1.0), &a_shape, dtype)?;
            let (b, b_s) =
                tensor_from_f64(engine, &rng.vec(p.b_len(), -1.0, 1.0), &b_shape, dtype)?;
            let (bias, bias_s) = tensor_from_f64(engine, &rng.vec(p.n, -1.0, 1.0), &[p.n], dtype)?;
            let (dy, dy_s) =
                tensor_from_f64(engine, &rng.vec(p.out_len(), -1.0, 1.0), &out_shape, dtype)?;
            let options = MatmulOptions {
                transpose_a: p.transpose_a,
                transpose_b: p.transpose_b,
                activation: p.activation,
                tensor_cores: false,
            };
            let bias_ref = with_bias.then_some(bias_s.as_slice());
            let (y, saved) = matmul(&a, &b, with_bias.then_some(&bias), &options)?;
            let grads = matmul_backward(&saved, &dy)?;
            let want = reference::matmul::forward(p, &a_s, &b_s, bias_ref);
            let (da, db, dbias) = reference::matmul::backward(p, &a_s, &b_s, bias_ref, &dy_s);
            let label = |what: &str| {
                format!(
                    "{what} {dtype} a {a_shape:?} b {b_shape:?}{}{}",
                    if with_bias { " bias" } else { "" },
                    p.activation
                        .map_or(String::new(), |a| format!(" {}", a.name()))
                )
            };
            let b_terms = if p.b_batched { p.m } else { p.batch * p.m };
            cases.push(case(label("y"), &y.to_f64()?, &want, matmul_tolerance(p.k)));
            cases.push(case(
                label("dA"),
                &grads.a.to_f64()?,
                &da,
                matmul_tolerance(p.n),
            ));
            cases.push(case(
                label("dB"),
                &grads.b.to_f64()?,
                &db,
                matmul_tolerance(b_terms),
            ));
            if let (Some(got), Some(want)) = (&grads.bias, &dbias) {
                cases.push(case(
                    label("dbias"),
                    &got.to_f64()?,
                    want,
                    matmul_tolerance(p.batch * p.m),
                ));
            }
        }
    }
    Ok(cases)
}

/// Matmul outputs and gradients stored in F16 / BF16 (`matmul::matmul_as`,
/// `matmul::matmul_backward_as`) against the f64 reference rounded to that dtype: an even N
/// written in 16 bits by the tiled product (with a bias and the SiLU epilogue), by the split-K
/// finish (K 4,100), and an odd N computed in F32 and narrowed; dA, dB, dbias likewise.
fn check_matmul_as(engine: &Engine) -> Result<Vec<Case>> {
    use crate::activation::Activation;
    use crate::matmul::{MatmulOptions, matmul_as, matmul_backward_as};
    use reference::matmul::Problem;
    let mut rng = Rng::new(6);
    let mut cases = Vec::new();
    let problems = [
        Problem {
            transpose_b: true,
            activation: Some(Activation::Silu),
            ..Problem::new(45, 70, 38)
        },
        Problem {
            transpose_b: true,
            ..Problem::new(24, 40, 4100)
        },
        Problem::new(33, 9, 17),
    ];
    for p in &problems {
        let b_shape = if p.transpose_b {
            vec![p.n, p.k]
        } else {
            vec![p.k, p.n]
        };
        for dtype in [DType::F16, DType::BF16] {
            let (a, a_s) =
                tensor_from_f64(engine, &rng.vec(p.a_len(), -1.0, 1.0), &[p.m, p.k], dtype)?;
            let (b, b_s) =
                tensor_from_f64(engine, &rng.vec(p.b_len(), -1.0, 1.0), &b_shape, dtype)?;
            let (bias, bias_s) = tensor_from_f64(engine, &rng.vec(p.n, -1.0, 1.0), &[p.n], dtype)?;
            let options = MatmulOptions {
                transpose_b: p.transpose_b,
                activation: p.activation,
                ..Default::default()
            };
            let (dy, dy_s) =
                tensor_from_f64(engine, &rng.vec(p.out_len(), -1.0, 1.0), &[p.m, p.n], dtype)?;
            let (y, saved) = matmul_as(&a, &b, Some(&bias), &options, dtype)?;
            let grads = matmul_backward_as(&saved, &dy, dtype)?;
            let want = reference::matmul::forward(p, &a_s, &b_s, Some(&bias_s));
            let (da, db, dbias) = reference::matmul::backward(p, &a_s, &b_s, Some(&bias_s), &dy_s);
            let label = |what: &str| {
                format!(
                    "{what} {dtype} M{} N{} K{}{}",
                    p.m,
                    p.n,
                    p.k,
                    p.activation
                        .map_or(String::new(), |a| format!(" {}", a.name()))
                )
            };
            let mut outputs = vec![("y", y, want), ("dA", grads.a, da), ("dB", grads.b, db)];
            if let (Some(got), Some(want)) = (grads.bias, dbias) {
                outputs.push(("dbias", got, want));
            }
            for (what, got, want) in outputs {
                cases.push(case(
                    label(what),
                    &got.to_f64()?,
                    &stored_values(&want, dtype),
                    Tolerance::for_dtype(dtype),
                ));
            }
        }
    }
    Ok(cases)
}
