//! Dense matmul against the f64 reference of `wgrad::reference::matmul`: ragged M, N, K, both
//! transposes, broadcast batches (either operand shared), bias, every activation epilogue
//! (forward and gradients), every storage dtype, `gemm` with offsets / accumulate / alpha,
//! empty extents, bit-identical reruns, finite differences of the reference backward, and
//! each bad input's typed error.

mod common;

use common::{Rng, engine, f32_bits, stored, tensor_from_f64};
use wgrad::activation::Activation;
use wgrad::gradcheck::{Tolerance, check_vjp, compare};
use wgrad::matmul::{self, Gemm, GemmOperand, MatmulOptions, gemm, matmul as mm, matmul_backward};
use wgrad::reference::matmul::{self as reference, Problem};
use wgrad::{DType, Error, Tensor};

fn data(seed: u64, n: usize) -> Vec<f64> {
    Rng::new(seed).vec(n, -1.0, 1.0)
}

/// Budget of sums of `k` FP32 products (see `matmul_tolerance`).
fn tol_for(k: usize) -> Tolerance {
    matmul::matmul_tolerance(k)
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: Tolerance) {
    let c = compare(got, want, tol);
    assert!(
        c.passed,
        "{what}: {c}; got {:?} want {:?}",
        got.get(c.worst),
        want.get(c.worst)
    );
}

/// Shapes of A and B for a problem (batch dimensions `[batch]` where present).
fn shapes(p: &Problem) -> (Vec<usize>, Vec<usize>) {
    let mut a = if p.transpose_a {
        vec![p.k, p.m]
    } else {
        vec![p.m, p.k]
    };
    let mut b = if p.transpose_b {
        vec![p.n, p.k]
    } else {
        vec![p.k, p.n]
    };
    if p.a_batched {
        a.insert(0, p.batch);
    }
    if p.b_batched {
        b.insert(0, p.batch);
    }
    (a, b)
}

struct Dtypes {
    a: DType,
    b: DType,
    bias: DType,
    dy: DType,
}

const ALL_F32: Dtypes = Dtypes {
    a: DType::F32,
    b: DType::F32,
    bias: DType::F32,
    dy: DType::F32,
};

/// Run forward and backward on the GPU and compare everything with the reference.
fn check_problem(p: &Problem, with_bias: bool, dt: &Dtypes, seed: u64) {
    let e = engine();
    let (sa, sb) = shapes(p);
    let a = stored(&data(seed, p.a_len()), dt.a);
    let b = stored(&data(seed + 1, p.b_len()), dt.b);
    let bias = with_bias.then(|| stored(&data(seed + 2, p.n), dt.bias));
    let dy = stored(&data(seed + 3, p.out_len()), dt.dy);
    let at = tensor_from_f64(e, &a, &sa, dt.a);
    let bt = tensor_from_f64(e, &b, &sb, dt.b);
    let biast = bias
        .as_ref()
        .map(|c| tensor_from_f64(e, c, &[p.n], dt.bias));
    let options = MatmulOptions {
        transpose_a: p.transpose_a,
        transpose_b: p.transpose_b,
        activation: p.activation,
    };
    let label = format!(
        "batch {} ({}{}) m {} n {} k {} ta {} tb {} act {:?} bias {} dtypes {}/{}/{}/{}",
        p.batch,
        if p.a_batched { "A" } else { "" },
        if p.b_batched { "B" } else { "" },
        p.m,
        p.n,
        p.k,
        p.transpose_a,
        p.transpose_b,
        p.activation.map(|a| a.name()),
        with_bias,
        dt.a,
        dt.b,
        dt.bias,
        dt.dy
    );
    let (y, saved) = mm(&at, &bt, biast.as_ref(), &options).unwrap();
    assert_eq!(y.dtype(), DType::F32, "{label}");
    let mut out_shape: Vec<usize> = if p.a_batched || p.b_batched {
        vec![p.batch]
    } else {
        vec![]
    };
    out_shape.extend([p.m, p.n]);
    assert_eq!(y.shape(), out_shape.as_slice(), "{label}");
    let tol = tol_for(p.k);
    let want = reference::forward(p, &a, &b, bias.as_deref());
    assert_close(&format!("{label} y"), &y.to_f64().unwrap(), &want, tol);
    if p.activation.is_some() {
        let pre = reference::pre_activation(p, &a, &b, bias.as_deref());
        assert_close(
            &format!("{label} pre"),
            &saved.pre_activation().unwrap().to_f64().unwrap(),
            &pre,
            tol,
        );
    } else {
        assert!(saved.pre_activation().is_none());
    }
    let dyt = tensor_from_f64(e, &dy, &out_shape, dt.dy);
    let grads = matmul_backward(&saved, &dyt).unwrap();
    let (da, db, dbias) = reference::backward(p, &a, &b, bias.as_deref(), &dy);
    assert_eq!(grads.a.shape(), sa.as_slice(), "{label}");
    assert_eq!(grads.b.shape(), sb.as_slice(), "{label}");
    assert_eq!(grads.a.dtype(), DType::F32);
    assert_eq!(grads.b.dtype(), DType::F32);
    // dA sums n terms; dB sums batch·m terms when B is shared, m otherwise.
    let shared_b = if p.b_batched { 1 } else { p.batch };
    let shared_a = if p.a_batched { 1 } else { p.batch };
    assert_close(
        &format!("{label} dA"),
        &grads.a.to_f64().unwrap(),
        &da,
        tol_for(p.n * shared_a),
    );
    assert_close(
        &format!("{label} dB"),
        &grads.b.to_f64().unwrap(),
        &db,
        tol_for(p.m * shared_b),
    );
    match (grads.bias, dbias) {
        (Some(got), Some(want)) => {
            assert_eq!(got.shape(), &[p.n]);
            assert_close(
                &format!("{label} dbias"),
                &got.to_f64().unwrap(),
                &want,
                tol_for(p.batch * p.m),
            )
        }
        (None, None) => {}
        _ => panic!("{label}: dbias presence"),
    }
}

fn problem(m: usize, n: usize, k: usize, ta: bool, tb: bool) -> Problem {
    Problem {
        transpose_a: ta,
        transpose_b: tb,
        ..Problem::new(m, n, k)
    }
}

#[test]
fn ragged_shapes_and_transposes_match_reference() {
    // A representative sample of {1, 7, 33, 129}³ (edge tiles in every direction), each with
    // all four transpose combinations.
    let shapes = [
        (1, 1, 1),
        (7, 33, 129),
        (33, 7, 1),
        (129, 1, 33),
        (1, 129, 7),
        (129, 65, 7),
        (33, 33, 33),
    ];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        for (t, (ta, tb)) in [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
        {
            let p = problem(m, n, k, ta, tb);
            check_problem(
                &p,
                (s + t) % 2 == 0,
                &ALL_F32,
                100 + 10 * s as u64 + t as u64,
            );
        }
    }
}

#[test]
fn broadcast_batches_match_reference() {
    for (a_batched, b_batched) in [(true, false), (false, true), (true, true)] {
        for (ta, tb) in [(false, false), (true, true), (false, true), (true, false)] {
            let p = Problem {
                batch: 3,
                a_batched,
                b_batched,
                ..problem(7, 33, 9, ta, tb)
            };
            check_problem(&p, true, &ALL_F32, 200);
        }
    }
}

#[test]
fn every_activation_epilogue_matches_reference() {
    for (i, kind) in Activation::ALL.into_iter().enumerate() {
        let p = Problem {
            activation: Some(kind),
            ..problem(33, 7, 129, i % 2 == 1, i % 3 == 1)
        };
        check_problem(&p, i % 2 == 0, &ALL_F32, 300 + i as u64);
    }
}

#[test]
fn every_storage_dtype_matches_reference() {
    for (i, a) in DType::FLOATS.into_iter().enumerate() {
        for (j, b) in DType::FLOATS.into_iter().enumerate() {
            let dt = Dtypes {
                a,
                b,
                bias: DType::FLOATS[(i + j) % 3],
                dy: DType::FLOATS[(i + 2 * j) % 3],
            };
            // Odd extents and odd offsets of 16-bit rows (halves split across words).
            let p = Problem {
                batch: 2,
                a_batched: true,
                b_batched: i == j,
                activation: (i == 1).then_some(Activation::Silu),
                ..problem(7, 33, 13, j == 1, i == 2)
            };
            check_problem(&p, true, &dt, 400 + 3 * i as u64 + j as u64);
        }
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    for (i, kind) in [None, Some(Activation::Silu), Some(Activation::Gelu)]
        .into_iter()
        .enumerate()
    {
        let p = Problem {
            batch: 2,
            a_batched: true,
            b_batched: i == 1,
            activation: kind,
            ..problem(3, 4, 5, i == 1, i != 1)
        };
        let a = data(500 + i as u64, p.a_len());
        let b = data(510 + i as u64, p.b_len());
        let bias = data(520 + i as u64, p.n);
        let dy = data(530 + i as u64, p.out_len());
        let (da, db, dbias) = reference::backward(&p, &a, &b, Some(&bias), &dy);
        let c = check_vjp(|x| reference::forward(&p, x, &b, Some(&bias)), &a, &dy, &da);
        assert!(c.passed, "{i} dA: {c}");
        let c = check_vjp(|x| reference::forward(&p, &a, x, Some(&bias)), &b, &dy, &db);
        assert!(c.passed, "{i} dB: {c}");
        let c = check_vjp(
            |x| reference::forward(&p, &a, &b, Some(x)),
            &bias,
            &dy,
            &dbias.unwrap(),
        );
        assert!(c.passed, "{i} dbias: {c}");
    }
}
