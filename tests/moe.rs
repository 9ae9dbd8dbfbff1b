//! The fused mixture of experts against the f64 reference of `wgrad::reference::moe` in every
//! storage dtype (and mixed), both activations, saved and recomputed pre-activations, I32 and
//! U32 indices with slots that route nowhere and duplicate experts; the routing's sorted order
//! against a host sort across tiles; F16 and BF16 outputs and gradients bit for bit the F32 ones
//! cast;
//! finite differences of the reference backward; empty calls; bit-identical reruns; bad inputs.

mod common;

use common::{Rng, assert_close, engine, expect_err, f32_bits, stored, tensor_from_f64};
use wgrad::activation::Activation;
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::moe::{
    MoeOptions, fused_moe, fused_moe_backward, fused_moe_backward_as,
    fused_moe_backward_workspace_bytes, fused_moe_workspace_bytes, route,
};
use wgrad::reference::moe::{self as reference, Extents};
use wgrad::{DType, Engine, Error, Tensor};

/// One call's data, every float already rounded to its storage dtype.
struct Case {
    x: Vec<f64>,
    gate_up: Vec<f64>,
    down: Vec<f64>,
    index: Vec<i64>,
    weights: Vec<f64>,
    dy: Vec<f64>,
    e: Extents,
}

/// Storage dtypes of x, gate_up, down, weights and dy.
type Dtypes = [DType; 5];

/// Random data; each token's slots draw experts from `-1..=E` (so some route nowhere and some
/// repeat) unless `all_valid`.
fn case(seed: u64, e: Extents, dt: Dtypes, all_valid: bool) -> Case {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (e.h.max(1) as f64).sqrt();
    let down_scale = 1.0 / (e.i.max(1) as f64).sqrt();
    let index = (0..e.t * e.k)
        .map(|_| {
            let r = rng.uniform(0.0, 1.0);
            if all_valid {
                (r * e.e as f64) as i64 % e.e as i64
            } else {
                (r * (e.e + 2) as f64) as i64 - 1
            }
        })
        .collect();
    Case {
        x: stored(&rng.vec(e.t * e.h, -1.0, 1.0), dt[0]),
        gate_up: stored(
            &rng.vec(e.e * 2 * e.i * e.h, -2.0 * scale, 2.0 * scale),
            dt[1],
        ),
        down: stored(&rng.vec(e.e * e.h * e.i, -down_scale, down_scale), dt[2]),
        index,
        weights: stored(&rng.vec(e.t * e.k, 0.0, 1.0), dt[3]),
        dy: stored(&rng.vec(e.t * e.h, -1.0, 1.0), dt[4]),
        e,
    }
}

struct Uploaded {
    x: Tensor,
    gate_up: Tensor,
    down: Tensor,
    index: Tensor,
    weights: Tensor,
    dy: Tensor,
}

/// The index as I32 or U32 (negative values as their two's complement bits).
fn index_tensor(index: &[i64], shape: &[usize], dtype: DType) -> Tensor {
    let eng = engine();
    match dtype {
        DType::I32 => {
            let v: Vec<i32> = index.iter().map(|&i| i as i32).collect();
            Tensor::from_slice(eng, &v, shape).unwrap()
        }
        _ => {
            let v: Vec<u32> = index.iter().map(|&i| i as i32 as u32).collect();
            Tensor::from_slice(eng, &v, shape).unwrap()
        }
    }
}

fn upload(c: &Case, dt: Dtypes, lead: &[usize], index_dtype: DType) -> Uploaded {
    let eng = engine();
    let e = c.e;
    let with = |last: usize| {
        let mut s = lead.to_vec();
        s.push(last);
        s
    };
    Uploaded {
        x: tensor_from_f64(eng, &c.x, &with(e.h), dt[0]),
        gate_up: tensor_from_f64(eng, &c.gate_up, &[e.e, 2 * e.i, e.h], dt[1]),
        down: tensor_from_f64(eng, &c.down, &[e.e, e.h, e.i], dt[2]),
        index: index_tensor(&c.index, &with(e.k), index_dtype),
        weights: tensor_from_f64(eng, &c.weights, &with(e.k), dt[3]),
        dy: tensor_from_f64(eng, &c.dy, &with(e.h), dt[4]),
    }
}

/// The GPU's output and every gradient against the reference, saved and recomputed.
/// With a capacity, the reference sees the index with the dropped slots routed nowhere.
fn check_case(label: &str, kind: Activation, c: &Case, u: &Uploaded, capacity: Option<usize>) {
    let index = match capacity {
        Some(cap) => reference::with_capacity(&c.index, c.e, cap),
        None => c.index.clone(),
    };
    let want = reference::forward(kind, &c.x, &c.gate_up, &c.down, &index, &c.weights, c.e);
    let grads = reference::backward(
        kind, &c.x, &c.gate_up, &c.down, &index, &c.weights, &c.dy, c.e,
    );
    let tol = Tolerance::for_dtype(DType::F32);
    // Without a capacity: the padded layout (where the loads allow it) and a launch an expert.
    let pads: &[bool] = if capacity.is_none() {
        &[true, false]
    } else {
        &[true]
    };
    for (recompute, &pad) in [false, true]
        .into_iter()
        .flat_map(|r| pads.iter().map(move |p| (r, p)))
    {
        let options = MoeOptions {
            activation: kind,
            recompute,
            tensor_cores: false,
            capacity,
            pad,
            output: DType::F32,
        };
        let label = format!("{label} capacity={capacity:?} recompute={recompute} pad={pad}");
        let (y, saved) = fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &options)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        if !pad {
            assert!(!saved.routing().padded(), "{label}: padded without pad");
        }
        assert_eq!((y.shape(), y.dtype()), (u.x.shape(), DType::F32));
        assert_close(&format!("{label} y"), &y.to_f64().unwrap(), &want, tol);
        // A 16-bit output: bit for bit the F32 output cast.
        for out in [DType::F16, DType::BF16] {
            let o = MoeOptions {
                output: out,
                ..options
            };
            let (y16, _) = fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &o)
                .unwrap_or_else(|e| panic!("{label} {out:?} output: {e}"));
            common::assert_cast_of(&label, &[("y", &y16, &y)], out);
        }
        let g = fused_moe_backward(&saved, &u.dy).unwrap();
        assert_eq!(g.x.shape(), u.x.shape());
        assert_eq!(g.gate_up.shape(), u.gate_up.shape());
        assert_eq!(g.down.shape(), u.down.shape());
        assert_eq!(g.weights.shape(), u.weights.shape());
        for (what, got, want) in [
            ("dx", &g.x, &grads.x),
            ("d gate_up", &g.gate_up, &grads.gate_up),
            ("d down", &g.down, &grads.down),
            ("d weights", &g.weights, &grads.weights),
        ] {
            assert_close(
                &format!("{label} {what}"),
                &got.to_f64().unwrap(),
                want,
                tol,
            );
        }
        // 16-bit gradients: bit for bit the F32 ones cast (direct for even widths).
        for out in [DType::F16, DType::BF16] {
            let g16 = fused_moe_backward_as(&saved, &u.dy, out).unwrap();
            common::assert_cast_of(
                &label,
                &[
                    ("dx", &g16.x, &g.x),
                    ("d gate_up", &g16.gate_up, &g.gate_up),
                    ("d down", &g16.down, &g.down),
                    ("d weights", &g16.weights, &g.weights),
                ],
                out,
            );
        }
    }
}

#[test]
fn forward_and_gradients_match_reference_in_every_dtype() {
    // (leading axes, H, I, E, K): one of everything, a tile-crossing slot count, ragged
    // widths with leading axes, more slots a token than experts.
    let shapes = [
        (vec![1usize], 1usize, 1usize, 1usize, 1usize),
        (vec![7], 16, 24, 4, 2),
        (vec![3, 5], 33, 17, 6, 3),
        (vec![130], 8, 9, 8, 2),
        (vec![5], 6, 5, 2, 4),
    ];
    for (n, (lead, h, i, experts, k)) in shapes.iter().enumerate() {
        let t = lead.iter().product();
        let e = Extents {
            t,
            h: *h,
            i: *i,
            e: *experts,
            k: *k,
        };
        for (d, dtype) in DType::FLOATS.into_iter().enumerate() {
            let kind = if (n + d) % 2 == 0 {
                Activation::Silu
            } else {
                Activation::GeluTanh
            };
            let index_dtype = if d % 2 == 0 { DType::I32 } else { DType::U32 };
            let dt = [dtype; 5];
            let c = case(200 + n as u64, e, dt, false);
            let u = upload(&c, dt, lead, index_dtype);
            let label = format!("{} {dtype} {index_dtype} {e:?}", kind.name());
            check_case(&label, kind, &c, &u, None);
        }
    }
}

/// Each tensor in its own dtype (16-bit x of odd width, so the gathered rows do not start on
/// word boundaries).
#[test]
fn mixed_dtypes_match_reference() {
    let e = Extents {
        t: 11,
        h: 7,
        i: 10,
        e: 3,
        k: 2,
    };
    for dt in [
        [DType::BF16, DType::F16, DType::F32, DType::BF16, DType::F16],
        [DType::F16, DType::F32, DType::BF16, DType::F32, DType::BF16],
    ] {
        let c = case(31, e, dt, false);
        let u = upload(&c, dt, &[e.t], DType::I32);
        check_case(&format!("mixed {dt:?}"), Activation::Silu, &c, &u, None);
    }
}

/// The routing against a host stable sort by expert: slots in order within each expert, the
/// inverse, NONE (u32::MAX) for slots outside `0..E`, over several tiles of 256 slots.
#[test]
fn routing_is_a_stable_sort_by_expert() {
    let eng = engine();
    for (t, k, experts, seed) in [
        (1usize, 1usize, 1usize, 1u64),
        (300, 3, 5, 2),
        (97, 8, 64, 3),
    ] {
        let mut rng = Rng::new(seed);
        let index: Vec<i64> = (0..t * k)
            .map(|_| (rng.uniform(0.0, 1.0) * (experts + 2) as f64) as i64 - 1)
            .collect();
        for dtype in [DType::I32, DType::U32] {
            let r = route(&index_tensor(&index, &[t, k], dtype), experts).unwrap();
            let mut order: Vec<usize> = (0..t * k)
                .filter(|&f| index[f] >= 0 && (index[f] as usize) < experts)
                .collect();
            order.sort_by_key(|&f| index[f]);
            let routed = order.len();
            assert_eq!(r.rows(), routed, "{dtype} t={t} k={k}");
            let perm = r.permutation().to_vec::<u32>().unwrap();
            let got: Vec<usize> = perm[..routed].iter().map(|&p| p as usize).collect();
            assert_eq!(got, order, "{dtype} permutation");
            let inverse = r.inverse().to_vec::<u32>().unwrap();
            for (f, &p) in inverse.iter().enumerate() {
                match order.iter().position(|&o| o == f) {
                    Some(at) => assert_eq!(p as usize, at, "inverse of slot {f}"),
                    None => assert_eq!(p, u32::MAX, "unrouted slot {f}"),
                }
            }
            let counts: Vec<usize> = (0..experts)
                .map(|e| index.iter().filter(|&&i| i == e as i64).count())
                .collect();
            assert_eq!(r.counts(), counts);
            assert_eq!(r.starts().len(), experts + 1);
        }
    }
    let _ = eng;
}

#[test]
fn reference_backward_matches_finite_differences() {
    let e = Extents {
        t: 3,
        h: 4,
        i: 5,
        e: 3,
        k: 2,
    };
    for kind in [Activation::Silu, Activation::GeluTanh] {
        let c = case(7, e, [DType::F32; 5], true);
        let g = reference::backward(
            kind, &c.x, &c.gate_up, &c.down, &c.index, &c.weights, &c.dy, e,
        );
        let f = |x: &[f64], gu: &[f64], d: &[f64], w: &[f64]| {
            reference::forward(kind, x, gu, d, &c.index, w, e)
        };
        let checks = [
            (
                "dx",
                check_vjp(|p| f(p, &c.gate_up, &c.down, &c.weights), &c.x, &c.dy, &g.x),
            ),
            (
                "d gate_up",
                check_vjp(
                    |p| f(&c.x, p, &c.down, &c.weights),
                    &c.gate_up,
                    &c.dy,
                    &g.gate_up,
                ),
            ),
            (
                "d down",
                check_vjp(
                    |p| f(&c.x, &c.gate_up, p, &c.weights),
                    &c.down,
                    &c.dy,
                    &g.down,
                ),
            ),
            (
                "d weights",
                check_vjp(
                    |p| f(&c.x, &c.gate_up, &c.down, p),
                    &c.weights,
                    &c.dy,
                    &g.weights,
                ),
            ),
        ];
        for (what, check) in checks {
            assert!(check.passed, "{} {what}: {check}", kind.name());
        }
    }
}

#[test]
fn reruns_and_recomputation_are_bit_identical() {
    let e = Extents {
        t: 90,
        h: 24,
        i: 40,
        e: 6,
        k: 3,
    };
    let dt = [DType::BF16; 5];
    let c = case(3, e, dt, false);
    let u = upload(&c, dt, &[e.t], DType::I32);
    let run = |recompute| {
        let options = MoeOptions {
            recompute,
            ..MoeOptions::default()
        };
        let (y, saved) =
            fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &options).unwrap();
        let g = fused_moe_backward(&saved, &u.dy).unwrap();
        [y, g.x, g.gate_up, g.down, g.weights].map(|t| f32_bits(&t))
    };
    let first = run(false);
    assert_eq!(first, run(false));
    assert_eq!(first, run(true));
}

/// No tokens, no slots a token, and every slot outside `0..E`: zero outputs and gradients of
/// the right shapes; experts without slots get zero weight gradients.
#[test]
fn empty_calls_and_idle_experts_give_zeros() {
    let eng = engine();
    let zeros = |t: &Tensor| t.to_f64().unwrap().iter().all(|&v| v == 0.0);
    for (t, k, nowhere) in [(0usize, 2usize, false), (4, 0, false), (5, 2, true)] {
        let e = Extents {
            t,
            h: 6,
            i: 4,
            e: 3,
            k,
        };
        let dt = [DType::F32; 5];
        let mut c = case(5, e, dt, true);
        if nowhere {
            c.index.iter_mut().for_each(|i| *i = 3);
        }
        let u = upload(&c, dt, &[t], DType::U32);
        let (y, saved) = fused_moe(
            &u.x,
            &u.gate_up,
            &u.down,
            &u.index,
            &u.weights,
            &MoeOptions::default(),
        )
        .unwrap();
        assert_eq!(y.shape(), &[t, 6]);
        assert!(zeros(&y), "t={t} k={k}: y");
        let bf16 = MoeOptions {
            output: DType::BF16,
            ..MoeOptions::default()
        };
        let (y16, _) = fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &bf16).unwrap();
        assert_eq!((y16.shape(), y16.dtype()), (&[t, 6][..], DType::BF16));
        assert!(zeros(&y16), "t={t} k={k}: BF16 y");
        let g = fused_moe_backward(&saved, &u.dy).unwrap();
        assert_eq!(g.weights.shape(), &[t, k]);
        let g16 = fused_moe_backward_as(&saved, &u.dy, DType::F16).unwrap();
        for grad in [&g16.x, &g16.gate_up, &g16.down, &g16.weights] {
            assert_eq!(grad.dtype(), DType::F16);
            assert!(zeros(grad), "t={t} k={k} nowhere={nowhere}: F16 gradients");
        }
        for (what, grad) in [
            ("dx", &g.x),
            ("d gate_up", &g.gate_up),
            ("d down", &g.down),
            ("d weights", &g.weights),
        ] {
            assert!(zeros(grad), "t={t} k={k} nowhere={nowhere}: {what}");
        }
    }
    // Experts 1 and 3 of 4 get no slots: their gradients are zero, the others' are not.
    let e = Extents {
        t: 6,
        h: 5,
        i: 3,
        e: 4,
        k: 2,
    };
    let dt = [DType::F32; 5];
    let mut c = case(8, e, dt, true);
    c.index = (0..12).map(|f| if f % 3 == 0 { 2 } else { 0 }).collect();
    let u = upload(&c, dt, &[e.t], DType::I32);
    let (_, saved) = fused_moe(
        &u.x,
        &u.gate_up,
        &u.down,
        &u.index,
        &u.weights,
        &MoeOptions::default(),
    )
    .unwrap();
    let g = fused_moe_backward(&saved, &u.dy).unwrap();
    let down = g.down.to_f64().unwrap();
    let gate_up = g.gate_up.to_f64().unwrap();
    let (per_down, per_gu) = (e.h * e.i, 2 * e.i * e.h);
    for ex in 0..4 {
        let idle = ex % 2 == 1;
        let d = &down[ex * per_down..(ex + 1) * per_down];
        let gu = &gate_up[ex * per_gu..(ex + 1) * per_gu];
        assert_eq!(d.iter().all(|&v| v == 0.0), idle, "expert {ex} d down");
        assert_eq!(gu.iter().all(|&v| v == 0.0), idle, "expert {ex} d gate_up");
    }
    let _ = eng;
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = Extents {
        t: 4,
        h: 6,
        i: 5,
        e: 3,
        k: 2,
    };
    let dt = [DType::F32; 5];
    let c = case(9, e, dt, true);
    let u = upload(&c, dt, &[e.t], DType::I32);
    let eng = engine();
    let opts = MoeOptions::default();
    let zeros = |shape: &[usize]| Tensor::zeros(eng, shape, DType::F32).unwrap();
    let shape = |r: &Error| matches!(r, Error::ShapeMismatch { .. });
    let bounds = |r: &Error| matches!(r, Error::OutOfBounds { .. });
    let dtype = |r: &Error| matches!(r, Error::UnsupportedDType { .. });
    let run = |x: &Tensor, gu: &Tensor, d: &Tensor, i: &Tensor, w: &Tensor| {
        fused_moe(x, gu, d, i, w, &opts).map(drop)
    };
    let (_, saved) = fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &opts).unwrap();
    expect_err(
        "integer gradient dtype",
        fused_moe_backward_as(&saved, &u.dy, DType::I32).map(drop),
        |r| {
            matches!(
                r,
                Error::UnsupportedDType {
                    got: DType::I32,
                    ..
                }
            )
        },
    );
    for out in [DType::I32, DType::U32] {
        let o = MoeOptions {
            output: out,
            ..opts
        };
        expect_err(
            "integer output dtype",
            fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &o).map(drop),
            |r| matches!(r, Error::UnsupportedDType { got, .. } if *got == out),
        );
    }
    expect_err(
        "gate_up width",
        run(&u.x, &zeros(&[3, 10, 7]), &u.down, &u.index, &u.weights),
        shape,
    );
    expect_err(
        "gate_up odd rows",
        run(&u.x, &zeros(&[3, 9, 6]), &u.down, &u.index, &u.weights),
        shape,
    );
    expect_err(
        "gate_up rank",
        run(&u.x, &zeros(&[30, 6]), &u.down, &u.index, &u.weights),
        shape,
    );
    expect_err(
        "down",
        run(&u.x, &u.gate_up, &zeros(&[3, 5, 6]), &u.index, &u.weights),
        shape,
    );
    expect_err(
        "index rows",
        run(
            &u.x,
            &u.gate_up,
            &u.down,
            &index_tensor(&[0; 6], &[3, 2], DType::I32),
            &u.weights,
        ),
        shape,
    );
    expect_err(
        "weights shape",
        run(&u.x, &u.gate_up, &u.down, &u.index, &zeros(&[4, 3])),
        shape,
    );
    expect_err(
        "no experts",
        run(
            &u.x,
            &zeros(&[0, 10, 6]),
            &zeros(&[0, 6, 5]),
            &u.index,
            &u.weights,
        ),
        bounds,
    );
    expect_err(
        "zero intermediate",
        run(
            &u.x,
            &zeros(&[3, 0, 6]),
            &zeros(&[3, 6, 0]),
            &u.index,
            &u.weights,
        ),
        bounds,
    );
    expect_err(
        "float index",
        run(&u.x, &u.gate_up, &u.down, &u.weights, &u.weights),
        dtype,
    );
    let int_x = Tensor::from_slice(eng, &[0i32; 24], &[4, 6]).unwrap();
    expect_err(
        "integer x",
        run(&int_x, &u.gate_up, &u.down, &u.index, &u.weights),
        dtype,
    );
    let int_w = Tensor::from_slice(eng, &[0u32; 8], &[4, 2]).unwrap();
    expect_err(
        "integer weights",
        run(&u.x, &u.gate_up, &u.down, &u.index, &int_w),
        dtype,
    );
    expect_err(
        "route: too many experts",
        route(&u.index, wgrad::moe::MAX_EXPERTS + 1).map(drop),
        bounds,
    );
    expect_err("route: float index", route(&u.x, 3).map(drop), dtype);
    let (_, saved) = fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &opts).unwrap();
    expect_err(
        "dy shape",
        fused_moe_backward(&saved, &zeros(&[4, 7])).map(drop),
        shape,
    );
    expect_err(
        "dy dtype",
        fused_moe_backward(&saved, &int_x).map(drop),
        dtype,
    );
    // The scratch bounds: the forward's exact need passes and one byte less is refused; the
    // backward needs more than the forward here, so the same engine refuses it.
    let need = fused_moe_workspace_bytes(e.t, e.k, e.e, e.h, e.i, None);
    for (bound, forward_ok) in [(need - 1, false), (need, true)] {
        let tight = Engine::builder().workspace_bound(bound).build().unwrap();
        let on = |t: &Tensor, dtype: DType| {
            tensor_from_f64(&tight, &t.to_f64().unwrap(), t.shape(), dtype)
        };
        let index = Tensor::from_slice(&tight, &[0i32, 1, 2, 0, 1, 2, 0, 1], &[4, 2]).unwrap();
        let (x, gu, d, w) = (
            on(&u.x, DType::F32),
            on(&u.gate_up, DType::F32),
            on(&u.down, DType::F32),
            on(&u.weights, DType::F32),
        );
        let r = fused_moe(&x, &gu, &d, &index, &w, &opts);
        let workspace = |r: &Error| matches!(r, Error::WorkspaceExceeded { .. });
        if !forward_ok {
            expect_err("forward workspace", r.map(drop), workspace);
            continue;
        }
        let (_, saved) = r.unwrap();
        assert!(fused_moe_backward_workspace_bytes(&saved) > bound);
        let dy = on(&u.dy, DType::F32);
        expect_err(
            "backward workspace",
            fused_moe_backward(&saved, &dy).map(drop),
            workspace,
        );
    }
    let other = common::private_engine();
    let x_elsewhere = tensor_from_f64(&other, &c.x, &[e.t, e.h], DType::F32);
    expect_err(
        "engines",
        run(&x_elsewhere, &u.gate_up, &u.down, &u.index, &u.weights),
        |r| matches!(r, Error::EngineMismatch { .. }),
    );
}

/// The tensor-core opt-in (`MoeOptions::tensor_cores`). F32 inputs: no product has two 16-bit
/// operands, so every result is the FP32 path's bit for bit on any engine. F16 inputs: where
/// the engine cannot run tensor cores the call is `MissingFeature`; where it can, the output
/// and every gradient match the f64 reference within the tensor-core budget, and reruns are
/// bit-identical.
#[test]
fn tensor_cores_match_reference_or_are_refused() {
    let tc = MoeOptions {
        tensor_cores: true,
        ..MoeOptions::default()
    };
    let e = Extents {
        t: 37,
        h: 24,
        i: 16,
        e: 4,
        k: 2,
    };
    let run = |u: &Uploaded, options: &MoeOptions| {
        let (y, saved) =
            fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, options).unwrap();
        let g = fused_moe_backward(&saved, &u.dy).unwrap();
        [y, g.x, g.gate_up, g.down, g.weights].map(|t| f32_bits(&t))
    };
    let f32s = [DType::F32; 5];
    let c = case(61, e, f32s, false);
    let u = upload(&c, f32s, &[e.t], DType::I32);
    assert_eq!(
        run(&u, &MoeOptions::default()),
        run(&u, &tc),
        "F32 inputs with tensor_cores: the FP32 path"
    );
    let f16s = [DType::F16; 5];
    let c = case(62, e, f16s, false);
    let u = upload(&c, f16s, &[e.t], DType::I32);
    if !wgrad::matmul::tensor_cores(engine()) {
        expect_err(
            "F16 with tensor_cores on an engine without them",
            fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &tc).map(drop),
            |r| matches!(r, Error::MissingFeature { .. }),
        );
        return;
    }
    let kind = Activation::Silu;
    let want = reference::forward(kind, &c.x, &c.gate_up, &c.down, &c.index, &c.weights, e);
    let grads = reference::backward(
        kind, &c.x, &c.gate_up, &c.down, &c.index, &c.weights, &c.dy, e,
    );
    let tol = wgrad::matmul::tensor_core_tolerance(e.t + e.h + e.i);
    let (y, saved) = fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &tc).unwrap();
    let g = fused_moe_backward(&saved, &u.dy).unwrap();
    for (what, got, want) in [
        ("y", &y, &want),
        ("dx", &g.x, &grads.x),
        ("d gate_up", &g.gate_up, &grads.gate_up),
        ("d down", &g.down, &grads.down),
        ("d weights", &g.weights, &grads.weights),
    ] {
        assert_close(
            &format!("tensor cores {what}"),
            &got.to_f64().unwrap(),
            want,
            tol,
        );
    }
    assert_eq!(run(&u, &tc), run(&u, &tc), "tensor cores: reruns");
}

/// A capacity (`MoeOptions::capacity`): every expert keeps its first `capacity` slots in slot
/// order and drops the rest, against the reference on the index with those slots routed
/// nowhere, in every dtype and both index dtypes, kept and recomputed; capacities that drop
/// (1, 3), that just fit and that pad (the largest load, and more) — the last two the exact
/// routing's values; the routing's rows, inverse and device starts against a host computation.
#[test]
fn capacity_drops_late_slots_and_matches_reference() {
    let e = Extents {
        t: 23,
        h: 10,
        i: 7,
        e: 4,
        k: 3,
    };
    for (d, dtype) in DType::FLOATS.into_iter().enumerate() {
        let dt = [dtype; 5];
        let c = case(70 + d as u64, e, dt, false);
        let index_dtype = if d % 2 == 0 { DType::U32 } else { DType::I32 };
        let u = upload(&c, dt, &[e.t], index_dtype);
        let loads: Vec<usize> = (0..e.e)
            .map(|x| c.index.iter().filter(|&&i| i == x as i64).count())
            .collect();
        let most = *loads.iter().max().unwrap();
        for capacity in [1, 3, most, most + 5] {
            let kept = reference::with_capacity(&c.index, e, capacity);
            let label = format!("{dtype} {index_dtype}");
            check_case(&label, Activation::Silu, &c, &u, Some(capacity));
            // The routing: rows e·capacity.. hold expert e's kept slots in slot order.
            let r = wgrad::moe::route_with_capacity(&u.index, e.e, capacity).unwrap();
            assert_eq!(r.rows(), e.e * capacity);
            assert_eq!(r.capacity(), Some(capacity));
            let perm = r.permutation().to_vec::<u32>().unwrap();
            let inverse = r.inverse().to_vec::<u32>().unwrap();
            let mut want_perm = vec![u32::MAX; e.e * capacity];
            let mut want_inverse = vec![u32::MAX; e.t * e.k];
            let mut fill = vec![0usize; e.e];
            for (f, &x) in kept.iter().enumerate() {
                if x >= 0 {
                    let row = x as usize * capacity + fill[x as usize];
                    fill[x as usize] += 1;
                    want_perm[row] = f as u32;
                    want_inverse[f] = row as u32;
                }
            }
            assert_eq!(perm, want_perm, "capacity {capacity}: rows");
            assert_eq!(inverse, want_inverse, "capacity {capacity}: inverse");
            let starts = r.slot_starts().to_vec::<u32>().unwrap();
            let want_starts: Vec<u32> = std::iter::once(0)
                .chain(loads.iter().scan(0, |s, &l| {
                    *s += l as u32;
                    Some(*s)
                }))
                .collect();
            assert_eq!(starts, want_starts, "capacity {capacity}: slot starts");
        }
    }
}

/// A capacity run twice and recomputed gives the same bits; a capacity of 0 is refused; no
/// slots under a capacity give zeros.
#[test]
fn capacity_reruns_are_bit_identical_and_bad_capacities_refused() {
    let e = Extents {
        t: 40,
        h: 16,
        i: 12,
        e: 5,
        k: 2,
    };
    let dt = [DType::BF16; 5];
    let c = case(81, e, dt, false);
    let u = upload(&c, dt, &[e.t], DType::I32);
    let run = |recompute| {
        let options = MoeOptions {
            recompute,
            capacity: Some(9),
            ..MoeOptions::default()
        };
        let (y, saved) =
            fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &options).unwrap();
        let g = fused_moe_backward(&saved, &u.dy).unwrap();
        [y, g.x, g.gate_up, g.down, g.weights].map(|t| f32_bits(&t))
    };
    let first = run(false);
    assert_eq!(first, run(false));
    assert_eq!(first, run(true));
    let zero = MoeOptions {
        capacity: Some(0),
        ..MoeOptions::default()
    };
    expect_err(
        "capacity 0",
        fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &zero).map(drop),
        |r| matches!(r, Error::OutOfBounds { .. }),
    );
    expect_err(
        "route capacity past 2³¹ rows",
        wgrad::moe::route_with_capacity(&u.index, 5, usize::MAX / 2).map(drop),
        |r| matches!(r, Error::OutOfBounds { .. }),
    );
    let f32s = [DType::F32; 5];
    let empty = Extents { t: 3, k: 0, ..e };
    let c = case(82, empty, f32s, true);
    let u = upload(&c, f32s, &[3], DType::U32);
    let options = MoeOptions {
        capacity: Some(4),
        ..MoeOptions::default()
    };
    let (y, saved) = fused_moe(&u.x, &u.gate_up, &u.down, &u.index, &u.weights, &options).unwrap();
    assert!(y.to_f64().unwrap().iter().all(|&v| v == 0.0));
    let g = fused_moe_backward(&saved, &u.dy).unwrap();
    for t in [&g.x, &g.gate_up, &g.down] {
        assert!(t.to_f64().unwrap().iter().all(|&v| v == 0.0));
    }
}

/// `MoeOptions::pad`: even loads take the padded layout (blocks of the largest load, one
/// batched launch a product) and so do uneven ones within `PAD_LIMIT` × the slots, unless the
/// workspace bound fits only the exact layout's scratch; loads past the limit take a launch an
/// expert. Every layout matches the reference.
#[test]
fn padding_follows_the_loads_and_the_workspace_bound() {
    let e = Extents {
        t: 40,
        h: 12,
        i: 10,
        e: 8,
        k: 2,
    };
    let dt = [DType::F32; 5];
    let tol = Tolerance::for_dtype(DType::F32);
    // Even: 10 slots an expert. Uneven: expert 0 takes 16 (8 × 16 rows ≤ 2 × 80). Skewed:
    // expert 0 takes 40 (8 × 40 rows > 2 × 80).
    let even: Vec<i64> = (0..80).map(|f| f % 8).collect();
    let uneven: Vec<i64> = (0..80)
        .map(|f| if f % 5 == 0 { 0 } else { 1 + f % 7 })
        .collect();
    let skewed: Vec<i64> = (0..80)
        .map(|f| if f % 2 == 0 { 0 } else { f % 8 })
        .collect();
    let run = |engine: &Engine, c: &Case, options: &MoeOptions| {
        let up = |v: &[f64], shape: &[usize]| tensor_from_f64(engine, v, shape, DType::F32);
        let idx: Vec<i32> = c.index.iter().map(|&v| v as i32).collect();
        let idx = Tensor::from_slice(engine, &idx, &[e.t, e.k]).unwrap();
        let (y, saved) = fused_moe(
            &up(&c.x, &[e.t, e.h]),
            &up(&c.gate_up, &[e.e, 2 * e.i, e.h]),
            &up(&c.down, &[e.e, e.h, e.i]),
            &idx,
            &up(&c.weights, &[e.t, e.k]),
            options,
        )
        .unwrap();
        let g = fused_moe_backward(&saved, &up(&c.dy, &[e.t, e.h])).unwrap();
        (saved, [y, g.x, g.gate_up, g.down, g.weights])
    };
    for (label, index, load) in [
        ("even", even, 10),
        ("uneven", uneven, 16),
        ("skewed", skewed, 40),
    ] {
        let mut c = case(91, e, dt, true);
        c.index = index;
        let want = reference::forward(
            Activation::Silu,
            &c.x,
            &c.gate_up,
            &c.down,
            &c.index,
            &c.weights,
            e,
        );
        let r = reference::backward(
            Activation::Silu,
            &c.x,
            &c.gate_up,
            &c.down,
            &c.index,
            &c.weights,
            &c.dy,
            e,
        );
        let wants = [&want, &r.x, &r.gate_up, &r.down, &r.weights];
        let exact_options = MoeOptions {
            pad: false,
            ..MoeOptions::default()
        };
        let (exact, exact_out) = run(engine(), &c, &exact_options);
        let (padded, padded_out) = run(engine(), &c, &MoeOptions::default());
        assert!(!exact.routing().padded() && exact.routing().capacity().is_none());
        let want_padded = e.e * load <= 2 * e.t * e.k;
        assert_eq!(padded.routing().padded(), want_padded, "{label}");
        if want_padded {
            assert_eq!(padded.routing().capacity(), Some(load), "{label}");
            assert_eq!(padded.routing().rows(), e.e * load, "{label}");
        }
        // A bound that fits the exact layout's scratch, forward and backward.
        let bound = fused_moe_workspace_bytes(e.t, e.k, e.e, e.h, e.i, None)
            .max(fused_moe_backward_workspace_bytes(&exact));
        let tight = Engine::builder().workspace_bound(bound).build().unwrap();
        let (tight_saved, tight_out) = run(&tight, &c, &MoeOptions::default());
        // Even loads pad to the same rows, so the same bound fits.
        assert_eq!(
            tight_saved.routing().padded(),
            label == "even",
            "{label} tight"
        );
        for (n, what) in ["y", "dx", "d gate_up", "d down", "d weights"]
            .iter()
            .enumerate()
        {
            for (layout, out) in [
                ("exact", &exact_out),
                ("padded", &padded_out),
                ("tight", &tight_out),
            ] {
                assert_close(
                    &format!("{label} {layout} {what}"),
                    &out[n].to_f64().unwrap(),
                    wants[n],
                    tol,
                );
            }
        }
    }
}

/// `fused_moe_backward_as` with even H and I writes d gate_up and d down in 16 bits from the
/// weight products: the call's peak grows by the 16-bit gradients and the (small) scratch, not
/// by F32 copies of the weight gradients (which alone would be twice the 16-bit ones).
#[test]
fn sixteen_bit_weight_gradients_allocate_no_f32_copy() {
    let private = common::private_engine();
    let e = Extents {
        t: 4,
        h: 64,
        i: 64,
        e: 8,
        k: 1,
    };
    let dt = [DType::BF16; 5];
    let c = case(21, e, dt, true);
    let up = |v: &[f64], shape: &[usize], dtype: DType| tensor_from_f64(&private, v, shape, dtype);
    let x = up(&c.x, &[e.t, e.h], DType::BF16);
    let gate_up = up(&c.gate_up, &[e.e, 2 * e.i, e.h], DType::BF16);
    let down = up(&c.down, &[e.e, e.h, e.i], DType::BF16);
    let index: Vec<i32> = c.index.iter().map(|&i| i as i32).collect();
    let index = Tensor::from_slice(&private, &index, &[e.t, e.k]).unwrap();
    let weights = up(&c.weights, &[e.t, e.k], DType::BF16);
    let dy = up(&c.dy, &[e.t, e.h], DType::BF16);
    let (y, saved) = fused_moe(
        &x,
        &gate_up,
        &down,
        &index,
        &weights,
        &MoeOptions::default(),
    )
    .unwrap();
    drop(y);
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let g = fused_moe_backward_as(&saved, &dy, DType::BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let weight_grads = ((e.e * 2 * e.i * e.h + e.e * e.h * e.i) * 2) as u64;
    assert!(
        grown < weight_grads * 3 / 2,
        "peak grew {grown} bytes for {weight_grads} bytes of 16-bit weight gradients"
    );
    assert_eq!(
        (g.gate_up.dtype(), g.down.dtype()),
        (DType::BF16, DType::BF16)
    );
}
