//! Checks of the activation and RoPE families (`crate::activation`, `crate::rope`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "silu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Silu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "sigmoid",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Sigmoid,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "gelu_tanh",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::GeluTanh,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "gelu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Gelu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "quick_gelu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::QuickGelu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "relu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Relu,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "relu_squared",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::ReluSquared,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "tanh",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Tanh,
                    ActivationCheck::UnaryAndGated,
                )
            },
        },
        OperatorCheck {
            name: "swiglu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Silu,
                    ActivationCheck::Multipliers,
                )
            },
        },
        OperatorCheck {
            name: "geglu",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::GeluTanh,
                    ActivationCheck::Multipliers,
                )
            },
        },
        OperatorCheck {
            name: "swiglu_packed",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::Silu,
                    ActivationCheck::Packed,
                )
            },
        },
        OperatorCheck {
            name: "geglu_packed",
            kernels: &["activation"],
            run: |e| {
                check_activation(
                    e,
                    crate::activation::Activation::GeluTanh,
                    ActivationCheck::Packed,
                )
            },
        },
        OperatorCheck {
            name: "activation_backward_as",
            kernels: &["activation", "cast"],
            run: check_activation_backward_as,
        },
        OperatorCheck {
            name: "erf",
            kernels: &["activation"],
            run: check_erf,
        },
        OperatorCheck {
            name: "rope",
            kernels: &["rope"],
            run: check_rope,
        },
        OperatorCheck {
            name: "rope_backward_as",
            kernels: &["rope", "cast"],
            run: check_rope_backward_as,
        },
        OperatorCheck {
            name: "rope_qk",
            kernels: &["rope"],
            run: |e| check_rope_qk(e, RopeVariant::Positions),
        },
        OperatorCheck {
            name: "mrope",
            kernels: &["rope"],
            run: |e| check_rope_qk(e, RopeVariant::Mrope),
        },
        OperatorCheck {
            name: "llama4_rope",
            kernels: &["rope"],
            run: |e| check_rope_qk(e, RopeVariant::Llama4),
        },
    ]
}

/// Which form of an activation a check runs.
#[derive(Clone, Copy)]
enum ActivationCheck {
    /// Unary and gated (separate tensors), default multipliers.
    UnaryAndGated,
    /// Gated with gate multiplier 0.5 and down multiplier 2 (Liger's SiLU-multiply variant).
    Multipliers,
    /// Packed `[gate ‖ up]` layout, odd width.
    Packed,
}

fn check_activation(
    engine: &Engine,
    kind: crate::activation::Activation,
    which: ActivationCheck,
) -> Result<Vec<Case>> {
    use crate::activation::{self as act, ActivationOptions};
    use reference::activation as r;
    let mut rng = Rng::new(40 + u64::from(kind.code()));
    let mut cases = Vec::new();
    let f32_tol = Tolerance::for_dtype(DType::F32);
    let n = 1001;
    for dtype in DType::FLOATS {
        let tol = Tolerance::for_dtype(dtype);
        match which {
            ActivationCheck::UnaryAndGated | ActivationCheck::Multipliers => {
                let opts = match which {
                    ActivationCheck::Multipliers => ActivationOptions {
                        gate_multiplier: 0.5,
                        down_multiplier: 2.0,
                    },
                    _ => ActivationOptions::default(),
                };
                let (gm, dm) = (
                    f64::from(opts.gate_multiplier),
                    f64::from(opts.down_multiplier),
                );
                let (g, gs) = tensor_from_f64(engine, &rng.vec(n, -6.0, 6.0), &[n], dtype)?;
                let (u, us) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[n], dtype)?;
                let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[n], dtype)?;
                if matches!(which, ActivationCheck::UnaryAndGated) {
                    let (y, saved) = act::forward(kind, &g, None, &opts)?;
                    let want = stored_values(&r::forward(kind, &gs, None, gm, dm), dtype);
                    cases.push(case(
                        format!("unary n={n} {dtype} y"),
                        &y.to_f64()?,
                        &want,
                        tol,
                    ));
                    let grads = act::backward(&saved, &dy)?;
                    let (dg, _) = r::backward(kind, &gs, None, &dys, gm, dm);
                    cases.push(case(
                        format!("unary n={n} {dtype} dx"),
                        &grads.dgate.to_f64()?,
                        &dg,
                        f32_tol,
                    ));
                }
                let (y, saved) = act::forward(kind, &g, Some(&u), &opts)?;
                let want = stored_values(&r::forward(kind, &gs, Some(&us), gm, dm), dtype);
                cases.push(case(
                    format!("gated n={n} {dtype} y"),
                    &y.to_f64()?,
                    &want,
                    tol,
                ));
                let grads = act::backward(&saved, &dy)?;
                let (dg, du) = r::backward(kind, &gs, Some(&us), &dys, gm, dm);
                cases.push(case(
                    format!("gated n={n} {dtype} dgate"),
                    &grads.dgate.to_f64()?,
                    &dg,
                    f32_tol,
                ));
                if let (Some(got), Some(want)) = (grads.dup, du) {
                    cases.push(case(
                        format!("gated n={n} {dtype} dup"),
                        &got.to_f64()?,
                        &want,
                        f32_tol,
                    ));
                }
            }
            ActivationCheck::Packed => {
                let (rows, width) = (13, 37);
                let ((x, xs), (dy, dys)) = packed_inputs(engine, &mut rng, rows, width, dtype)?;
                let (y, saved) = act::packed_forward(kind, &x, &ActivationOptions::default())?;
                let want = stored_values(&r::packed_forward(kind, &xs, width, 1.0, 1.0), dtype);
                cases.push(case(
                    format!("{rows}x{} {dtype} y", 2 * width),
                    &y.to_f64()?,
                    &want,
                    tol,
                ));
                let grads = act::backward(&saved, &dy)?;
                let want = r::packed_backward(kind, &xs, width, &dys, 1.0, 1.0);
                cases.push(case(
                    format!("{rows}x{} {dtype} dx", 2 * width),
                    &grads.dgate.to_f64()?,
                    &want,
                    f32_tol,
                ));
            }
        }
    }
    Ok(cases)
}

/// A tensor and the values it actually stores.
type Stored = (crate::Tensor, Vec<f64>);

/// A packed `[rows, 2·width]` input in (−6, 6) and its `[rows, width]` cotangent in (−1, 1).
fn packed_inputs(
    engine: &Engine,
    rng: &mut Rng,
    rows: usize,
    width: usize,
    dtype: DType,
) -> Result<(Stored, Stored)> {
    let x = tensor_from_f64(
        engine,
        &rng.vec(rows * 2 * width, -6.0, 6.0),
        &[rows, 2 * width],
        dtype,
    )?;
    let dy = tensor_from_f64(
        engine,
        &rng.vec(rows * width, -1.0, 1.0),
        &[rows, width],
        dtype,
    )?;
    Ok((x, dy))
}

/// SwiGLU gradients stored in the inputs' dtype (`backward_as`): 1,024 elements and packed
/// rows 40 wide take the 16-bit step kernels in 16 bits, 1,001 elements the F32 gradients
/// narrowed; against the reference at the dtype's tolerance.
fn check_activation_backward_as(engine: &Engine) -> Result<Vec<Case>> {
    use crate::activation::{self as act, Activation, ActivationOptions};
    use reference::activation as r;
    let kind = Activation::Silu;
    let opts = ActivationOptions {
        gate_multiplier: 0.5,
        down_multiplier: 2.0,
    };
    let mut rng = Rng::new(48);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let tol = Tolerance::for_dtype(dtype);
        for n in [1024, 1001] {
            let (g, gs) = tensor_from_f64(engine, &rng.vec(n, -6.0, 6.0), &[n], dtype)?;
            let (u, us) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[n], dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[n], dtype)?;
            let (_, saved) = act::forward(kind, &g, Some(&u), &opts)?;
            let grads = act::backward_as(&saved, &dy, dtype)?;
            let (dg, du) = r::backward(kind, &gs, Some(&us), &dys, 0.5, 2.0);
            for (what, got, want) in [
                ("dgate", Some(grads.dgate), Some(dg)),
                ("dup", grads.dup, du),
            ] {
                if let (Some(got), Some(want)) = (got, want) {
                    cases.push(case(
                        format!("gated n={n} {dtype} {what}"),
                        &got.to_f64()?,
                        &stored_values(&want, dtype),
                        tol,
                    ));
                }
            }
        }
        let (rows, width) = (13, 40);
        let ((x, xs), (dy, dys)) = packed_inputs(engine, &mut rng, rows, width, dtype)?;
        let (_, saved) = act::packed_forward(kind, &x, &ActivationOptions::default())?;
        let dx = act::backward_as(&saved, &dy, dtype)?.dgate;
        let want = r::packed_backward(kind, &xs, width, &dys, 1.0, 1.0);
        cases.push(case(
            format!("packed {rows}x{} {dtype} dx", 2 * width),
            &dx.to_f64()?,
            &stored_values(&want, dtype),
            tol,
        ));
    }
    Ok(cases)
}

fn check_erf(engine: &Engine) -> Result<Vec<Case>> {
    let data = Rng::new(49).vec(4001, -8.0, 8.0);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (x, xs) = tensor_from_f64(engine, &data, &[data.len()], dtype)?;
        let got = crate::activation::erf(&x)?.to_f64()?;
        let want: Vec<f64> = xs.iter().map(|&v| reference::activation::erf(v)).collect();
        // A few f32 ulps (tests/activation.rs checks three ulps element by element).
        let tol = Tolerance {
            abs: 2e-7,
            rel: 4e-7,
            rel_l2: 2e-7,
        };
        cases.push(case(format!("n={} {dtype}", data.len()), &got, &want, tol));
    }
    Ok(cases)
}

fn check_rope(engine: &Engine) -> Result<Vec<Case>> {
    use crate::rope::{self, RopeOptions};
    use reference::rope as r;
    let mut rng = Rng::new(60);
    let mut cases = Vec::new();
    let f32_tol = Tolerance::for_dtype(DType::F32);
    for (rows, dim, rot) in [(37, 64, 64), (19, 13, 8)] {
        for interleaved in [false, true] {
            for dtype in DType::FLOATS {
                let half = rot / 2;
                let (x, xs) =
                    tensor_from_f64(engine, &rng.vec(rows * dim, -2.0, 2.0), &[rows, dim], dtype)?;
                // Non-unit-norm coefficients.
                let (c, cs) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * half, -1.5, 1.5),
                    &[rows, half],
                    dtype,
                )?;
                let (s, ss) = tensor_from_f64(
                    engine,
                    &rng.vec(rows * half, -1.5, 1.5),
                    &[rows, half],
                    dtype,
                )?;
                let (dy, dys) =
                    tensor_from_f64(engine, &rng.vec(rows * dim, -1.0, 1.0), &[rows, dim], dtype)?;
                let opts = RopeOptions {
                    rotary_dim: Some(rot),
                    interleaved,
                    table_grads: true,
                };
                let label = format!(
                    "{rows}x{dim} rot {rot} {} {dtype}",
                    if interleaved { "interleaved" } else { "split" }
                );
                let (y, saved) = rope::forward(&x, &c, &s, &opts)?;
                let want = stored_values(&r::forward(&xs, dim, &cs, &ss, rot, interleaved), dtype);
                cases.push(case(
                    format!("{label} y"),
                    &y.to_f64()?,
                    &want,
                    Tolerance::for_dtype(dtype),
                ));
                let g = rope::backward(&saved, &dy)?;
                let (dv, dc, ds) = r::backward(&xs, &dys, dim, &cs, &ss, rot, interleaved);
                cases.push(case(
                    format!("{label} dvalues"),
                    &g.dvalues.to_f64()?,
                    &dv,
                    f32_tol,
                ));
                if let (Some(gc), Some(gs)) = (g.dcos, g.dsin) {
                    cases.push(case(format!("{label} dcos"), &gc.to_f64()?, &dc, f32_tol));
                    cases.push(case(format!("{label} dsin"), &gs.to_f64()?, &ds, f32_tol));
                }
            }
        }
    }
    Ok(cases)
}

#[derive(Clone, Copy, PartialEq)]
enum RopeVariant {
    Positions,
    Mrope,
    Llama4,
}

/// RoPE value gradients stored in the values' dtype (`rope::backward_as`, per-row tables):
/// 16-bit rows 64 wide (whole steps of 8) take the step kernels' direct 16-bit stores, rows 20
/// wide the F32 gradient narrowed; against the reference at the dtype's tolerance.
fn check_rope_backward_as(engine: &Engine) -> Result<Vec<Case>> {
    use crate::rope::{self, RopeOptions};
    use reference::rope as r;
    let mut rng = Rng::new(62);
    let mut cases = Vec::new();
    let rows = 11;
    for (dim, rot, interleaved) in [(64usize, 64usize, false), (64, 48, true), (20, 20, false)] {
        for dtype in DType::FLOATS {
            let half = rot / 2;
            let n = rows * dim;
            let (x, xs) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), &[rows, dim], dtype)?;
            let (dy, dys) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &[rows, dim], dtype)?;
            let (c, cs) = tensor_from_f64(
                engine,
                &rng.vec(rows * half, -1.2, 1.2),
                &[rows, half],
                dtype,
            )?;
            let (s, ss) = tensor_from_f64(
                engine,
                &rng.vec(rows * half, -1.2, 1.2),
                &[rows, half],
                dtype,
            )?;
            let opts = RopeOptions {
                rotary_dim: Some(rot),
                interleaved,
                table_grads: false,
            };
            let (_, saved) = rope::forward(&x, &c, &s, &opts)?;
            let g = rope::backward_as(&saved, &dy, dtype)?;
            let (want, _, _) = r::backward(&xs, &dys, dim, &cs, &ss, rot, interleaved);
            cases.push(case(
                format!("{rows}x{dim} rot {rot} interleaved {interleaved} {dtype} dx"),
                &g.dvalues.to_f64()?,
                &stored_values(&want, dtype),
                Tolerance::for_dtype(dtype),
            ));
        }
    }
    Ok(cases)
}

fn check_rope_qk(engine: &Engine, variant: RopeVariant) -> Result<Vec<Case>> {
    use crate::rope::{self, RopeLayout, RopeQkOptions};
    use reference::rope as r;
    let mut rng = Rng::new(61);
    let mut cases = Vec::new();
    let f32_tol = Tolerance::for_dtype(DType::F32);
    let (batch, seq, hq, hk, dim, table_rows) = (2usize, 9usize, 4usize, 2usize, 18usize, 12usize);
    let rot = if variant == RopeVariant::Llama4 {
        dim
    } else {
        12
    };
    let half = rot / 2;
    let section = [2usize, 2, 2];
    let axes = if variant == RopeVariant::Mrope { 3 } else { 1 };
    let ids: Vec<i32> = (0..axes * batch * seq)
        .map(|_| (rng.next_u32() % table_rows as u32) as i32)
        .collect();
    let positions = crate::Tensor::from_slice(
        engine,
        &ids,
        &if axes == 3 {
            vec![3, batch, seq]
        } else {
            vec![batch, seq]
        },
    )?;
    let position = |b: usize, s: usize, i: usize| -> usize {
        let axis = if variant == RopeVariant::Mrope {
            r::mrope_axis(i, section)
        } else {
            0
        };
        ids[axis * batch * seq + b * seq + s] as usize
    };
    for layout in [RopeLayout::Bshd, RopeLayout::Bhsd] {
        for dtype in DType::FLOATS {
            let shape = |h: usize| match layout {
                RopeLayout::Bshd => vec![batch, seq, h, dim],
                RopeLayout::Bhsd => vec![batch, h, seq, dim],
            };
            let heads = |h: usize| r::Heads {
                batch,
                seq,
                heads: h,
                bhsd: layout == RopeLayout::Bhsd,
            };
            let (q, qs) = tensor_from_f64(
                engine,
                &rng.vec(batch * seq * hq * dim, -2.0, 2.0),
                &shape(hq),
                dtype,
            )?;
            let (k, ks) = tensor_from_f64(
                engine,
                &rng.vec(batch * seq * hk * dim, -2.0, 2.0),
                &shape(hk),
                dtype,
            )?;
            let (dq, dqs) = tensor_from_f64(
                engine,
                &rng.vec(batch * seq * hq * dim, -1.0, 1.0),
                &shape(hq),
                dtype,
            )?;
            let (dk, dks) = tensor_from_f64(
                engine,
                &rng.vec(batch * seq * hk * dim, -1.0, 1.0),
                &shape(hk),
                dtype,
            )?;
            let cs = stored_values(&rng.vec(table_rows * half, -1.2, 1.2), dtype);
            let ss = stored_values(&rng.vec(table_rows * half, -1.2, 1.2), dtype);
            let opts = RopeQkOptions {
                rotary_dim: Some(rot),
                interleaved: false,
                layout,
                table_grads: true,
                check_positions: true,
                mrope_section: (variant == RopeVariant::Mrope).then_some(section),
            };
            let (qo, ko, dqg, dkg, dcg, dsg) = if variant == RopeVariant::Llama4 {
                let (f, _) = tensor_from_f64(
                    engine,
                    &r::join_complex(&cs, &ss),
                    &[table_rows, half, 2],
                    dtype,
                )?;
                let ((qo, ko), saved) = rope::llama4_forward(&q, &k, &f, Some(&positions), &opts)?;
                let g = rope::llama4_backward(&saved, &dq, &dk)?;
                let d = g
                    .dfreqs
                    .map(|t| t.to_f64())
                    .transpose()?
                    .unwrap_or_default();
                let (dc, ds) = r::split_complex(&d);
                (qo, ko, g.dq, g.dk, dc, ds)
            } else {
                let (c, _) = tensor_from_f64(engine, &cs, &[table_rows, half], dtype)?;
                let (s, _) = tensor_from_f64(engine, &ss, &[table_rows, half], dtype)?;
                let ((qo, ko), saved) = rope::qk_forward(&q, &k, &c, &s, Some(&positions), &opts)?;
                let g = rope::qk_backward(&saved, &dq, &dk)?;
                let dc = g.dcos.map(|t| t.to_f64()).transpose()?.unwrap_or_default();
                let ds = g.dsin.map(|t| t.to_f64()).transpose()?.unwrap_or_default();
                (qo, ko, g.dq, g.dk, dc, ds)
            };
            let interleaved = variant == RopeVariant::Llama4;
            let label = format!("{layout:?} q{hq} k{hk} {dtype}");
            let mut want_dc = vec![0.0; table_rows * half];
            let mut want_ds = vec![0.0; table_rows * half];
            for (name, xs, dys, h, out, dgot) in [
                ("q", &qs, &dqs, hq, &qo, &dqg),
                ("k", &ks, &dks, hk, &ko, &dkg),
            ] {
                let ce = r::expand(&cs, half, &heads(h), position);
                let se = r::expand(&ss, half, &heads(h), position);
                let want = stored_values(&r::forward(xs, dim, &ce, &se, rot, interleaved), dtype);
                cases.push(case(
                    format!("{label} {name}"),
                    &out.to_f64()?,
                    &want,
                    Tolerance::for_dtype(dtype),
                ));
                let (dv, dce, dse) = r::backward(xs, dys, dim, &ce, &se, rot, interleaved);
                cases.push(case(
                    format!("{label} d{name}"),
                    &dgot.to_f64()?,
                    &dv,
                    f32_tol,
                ));
                for (acc, per_row) in [(&mut want_dc, dce), (&mut want_ds, dse)] {
                    for (a, v) in acc.iter_mut().zip(r::reduce(
                        &per_row,
                        half,
                        &heads(h),
                        table_rows,
                        position,
                    )) {
                        *a += v;
                    }
                }
            }
            cases.push(case(format!("{label} dcos"), &dcg, &want_dc, f32_tol));
            cases.push(case(format!("{label} dsin"), &dsg, &want_ds, f32_tol));
        }
    }
    Ok(cases)
}
