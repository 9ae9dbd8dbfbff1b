//! Dense matmul against the f64 reference of `wgrad::reference::matmul`: ragged M, N, K, both
//! transposes, broadcast batches (either operand shared), bias, every activation epilogue
//! (forward and gradients), every storage dtype, `gemm` with offsets / accumulate / alpha,
//! empty extents, bit-identical reruns, outputs bit-identical to a host f32 multiply-add in
//! increasing k (the summation order), the stated workgroup memory, finite differences of the
//! reference backward, each bad input's typed error, split-K, and the two output tiles: the
//! rule that picks one, and the same bits from both (which carries every check above, run
//! through whichever tile `gemm` picks for its small shapes, over to the other).

mod common;

use common::{Rng, assert_close, assert_same_bits, engine, f32_bits, stored, tensor_from_f64};
use wgrad::activation::Activation;
use wgrad::gradcheck::{Tolerance, check_vjp};
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
    check_problem_scaled(p, with_bias, dt, seed, 1.0);
}

/// [`check_problem`] with A's values in `[-a_scale, a_scale]` (long K: keeps the
/// pre-activation O(1), where the activations' derivatives are well conditioned).
fn check_problem_scaled(p: &Problem, with_bias: bool, dt: &Dtypes, seed: u64, a_scale: f64) {
    let e = engine();
    let (sa, sb) = shapes(p);
    let a_values: Vec<f64> = data(seed, p.a_len()).iter().map(|v| v * a_scale).collect();
    let a = stored(&a_values, dt.a);
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
        tensor_cores: false,
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
            );
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

/// The product as the kernel sums it, emulated on the host in f32: each output starts at +0
/// and takes one multiply-add per term in increasing `l`, then `1·sum + 0` (no bias). WGSL's
/// `fma` may be evaluated fused or as a rounded product and a rounded sum (lavapipe does the
/// latter), so `fused` picks which.
fn sequential_sum(p: &Problem, a: &[f64], b: &[f64], fused: bool) -> Vec<u32> {
    sliced_sum(p, a, b, fused, p.k.max(1))
}

/// As [`sequential_sum`] for a product split into K slices of `slice` values (split-K): each
/// slice summed from +0 in increasing `l`, then the slice sums added in increasing slice order
/// (one rounding each).
fn sliced_sum(p: &Problem, a: &[f64], b: &[f64], fused: bool, slice: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(p.out_len());
    for bi in 0..p.batch {
        for i in 0..p.m {
            for j in 0..p.n {
                let mut total = None::<f32>;
                for l0 in (0..p.k.max(1)).step_by(slice) {
                    let mut c = 0.0f32;
                    for l in l0..(l0 + slice).min(p.k) {
                        let x = a[p.a_index(bi, i, l)] as f32;
                        let y = b[p.b_index(bi, l, j)] as f32;
                        c = if fused { x.mul_add(y, c) } else { c + x * y };
                    }
                    total = Some(total.map_or(c, |t| t + c));
                }
                out.push((total.unwrap_or(0.0) * 1.0 + 0.0).to_bits());
            }
        }
    }
    out
}

#[test]
fn summation_order_is_one_fma_per_term_in_increasing_k() {
    // The tiling may change, the order of each output's sum may not: the GPU's bits equal the
    // host's sequential FP32 fused multiply-adds, over shapes with edge tiles in every
    // direction (several tiles in M and N, K steps with a ragged tail), every transpose
    // combination, 16-bit operands (widened exactly) and a batch with a shared operand.
    let e = engine();
    let extents = [
        (1, 1, 1),
        (7, 33, 129),
        (129, 65, 7),
        (130, 257, 37),
        (255, 129, 16),
    ];
    let dtypes = [
        (DType::F32, DType::F32),
        (DType::F16, DType::BF16),
        (DType::BF16, DType::F32),
    ];
    let mut seed = 900;
    for (s, &(m, n, k)) in extents.iter().enumerate() {
        for (t, (ta, tb)) in [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
        {
            let (da, db) = dtypes[(s + t) % 3];
            let p = Problem {
                batch: 2,
                a_batched: true,
                b_batched: (s + t) % 2 == 0,
                ..problem(m, n, k, ta, tb)
            };
            seed += 2;
            let (sa, sb) = shapes(&p);
            let a = stored(&data(seed, p.a_len()), da);
            let b = stored(&data(seed + 1, p.b_len()), db);
            let at = tensor_from_f64(e, &a, &sa, da);
            let bt = tensor_from_f64(e, &b, &sb, db);
            let options = MatmulOptions {
                transpose_a: ta,
                transpose_b: tb,
                activation: None,
                tensor_cores: false,
            };
            let (y, _) = mm(&at, &bt, None, &options).unwrap();
            let got = f32_bits(&y);
            let fused = sequential_sum(&p, &a, &b, true);
            let unfused = sequential_sum(&p, &a, &b, false);
            let first = |want: &[u32]| got.iter().zip(want).position(|(g, w)| g != w);
            assert!(
                got == fused || got == unfused,
                "m {m} n {n} k {k} ta {ta} tb {tb} {da}/{db}: first difference at element \
                 {:?} (fused), {:?} (unfused)",
                first(&fused),
                first(&unfused)
            );
        }
    }
}

#[test]
fn workgroup_memory_is_as_stated() {
    // The products' workgroup variables add up to `WORKGROUP_BYTES`, within the WebGPU default
    // limit every adapter offers (16 KiB); the tensor-core factors' entries use only their own
    // tree (2 KiB).
    let (module, _) = matmul::KERNEL.module().unwrap();
    let size = |name: Option<&str>| -> u64 {
        module
            .global_variables
            .iter()
            .filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup)
            .filter(|(_, v)| name.is_none_or(|n| v.name.as_deref() == Some(n)))
            .map(|(_, v)| u64::from(module.types[v.ty].inner.size(module.to_ctx())))
            .sum()
    };
    let scale_tree = size(Some("scale_tree"));
    assert_eq!(scale_tree, 2048);
    let bytes = size(None) - scale_tree;
    assert_eq!(bytes, matmul::WORKGROUP_BYTES);
    assert!(bytes <= 16 * 1024);
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
    // Each operand (A, B, bias, dY) in every dtype across the rotations, then all BF16.
    let f = DType::FLOATS;
    let mut sets: Vec<Dtypes> = (0..3)
        .map(|i| Dtypes {
            a: f[i],
            b: f[(i + 1) % 3],
            bias: f[(i + 2) % 3],
            dy: f[(i + 1) % 3],
        })
        .collect();
    sets.push(Dtypes {
        a: DType::BF16,
        b: DType::BF16,
        bias: DType::BF16,
        dy: DType::BF16,
    });
    for (i, dt) in sets.iter().enumerate() {
        // Odd extents: 16-bit rows start in the middle of words.
        let p = Problem {
            batch: 2,
            a_batched: true,
            b_batched: i % 2 == 0,
            activation: (i == 1).then_some(Activation::Silu),
            ..problem(7, 33, 13, i == 1 || i == 3, i >= 2)
        };
        check_problem(&p, true, dt, 400 + i as u64);
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

/// The expected output of a `gemm` call over host copies of its operands.
#[allow(clippy::too_many_arguments)]
fn gemm_reference(
    a: &[f64],
    a_op: (usize, bool, usize),
    b: &[f64],
    b_op: (usize, bool, usize),
    out: &mut [f64],
    out_op: (usize, usize),
    (m, n, k, batch): (usize, usize, usize, usize),
    bias: Option<&[f64]>,
    accumulate: bool,
    activation: Option<Activation>,
    alpha: f64,
) {
    let p = Problem {
        transpose_a: a_op.1,
        transpose_b: b_op.1,
        ..Problem::new(m, n, k)
    };
    for bi in 0..batch {
        let a0 = a_op.0 + bi * a_op.2;
        let b0 = b_op.0 + bi * b_op.2;
        let pre = reference::pre_activation(&p, &a[a0..a0 + m * k], &b[b0..b0 + k * n], None);
        for i in 0..m {
            for j in 0..n {
                let v = alpha * pre[i * n + j] + bias.map_or(0.0, |c| c[j]);
                let o = &mut out[out_op.0 + bi * out_op.1 + i * n + j];
                *o = if accumulate {
                    *o + v
                } else {
                    activation.map_or(v, |kind| wgrad::reference::activation::act(kind, v))
                };
            }
        }
    }
}

fn operand(
    tensor: &Tensor,
    offset: usize,
    transposed: bool,
    batch_stride: usize,
) -> GemmOperand<'_> {
    GemmOperand {
        tensor,
        offset,
        transposed,
        batch_stride,
    }
}

#[test]
fn gemm_offsets_accumulate_and_alpha() {
    gemm_offsets_case(7, 33, 13, 3, 600);
}

/// `gemm` with odd offsets, gapped batch strides, a bias, accumulation, alpha and an
/// activation with its pre-activation, in every dtype, against [`gemm_reference`].
fn gemm_offsets_case(m: usize, n: usize, k: usize, batch: usize, seed: u64) {
    let e = engine();
    for (case, dtype) in DType::FLOATS.into_iter().enumerate() {
        let (ta, tb) = (case == 1, case != 1);
        // Odd element offsets and batch strides with gaps between the matrices.
        let (a_off, a_stride) = (5, m * k + 3);
        let (b_off, b_stride) = (3, k * n + 1);
        let (c_off, c_stride) = (11, m * n + 7);
        let a = stored(&data(seed, a_off + batch * a_stride), dtype);
        let b = stored(&data(seed + 1, b_off + batch * b_stride), dtype);
        let bias = stored(&data(seed + 2, n), dtype);
        let init = data(seed + 3, c_off + batch * c_stride + 4);
        let at = tensor_from_f64(e, &a, &[a.len()], dtype);
        let bt = tensor_from_f64(e, &b, &[b.len()], dtype);
        let biast = tensor_from_f64(e, &bias, &[n], dtype);
        for (accumulate, activation, alpha) in [
            (false, None, 1.0f32),
            (true, None, 0.5),
            (false, Some(Activation::Silu), -1.25),
        ] {
            let out = tensor_from_f64(e, &init, &[init.len()], DType::F32);
            let pre = Tensor::zeros(e, &[init.len()], DType::F32).unwrap();
            let call = Gemm {
                a: operand(&at, a_off, ta, a_stride),
                b: operand(&bt, b_off, tb, b_stride),
                out: &out,
                out_offset: c_off,
                out_batch_stride: c_stride,
                m,
                n,
                k,
                batch,
                bias: Some(&biast),
                accumulate,
                activation,
                pre_activation: activation.map(|_| &pre),
                alpha,
                tensor_cores: false,
                round_f32_operands: false,
                copy_bytes: None,
                maxima: [None, None],
            };
            gemm(&call).unwrap();
            let mut want = init.clone();
            gemm_reference(
                &a,
                (a_off, ta, a_stride),
                &b,
                (b_off, tb, b_stride),
                &mut want,
                (c_off, c_stride),
                (m, n, k, batch),
                Some(&bias),
                accumulate,
                activation,
                f64::from(alpha),
            );
            let label = format!(
                "m {m} n {n} k {k} batch {batch} {dtype} accumulate {accumulate} \
                 act {activation:?} alpha {alpha}"
            );
            // Elements outside the product (gaps, before and after) keep their values.
            assert_close(&label, &out.to_f64().unwrap(), &want, tol_for(k));
            if activation.is_some() {
                let mut want_pre = vec![0.0; init.len()];
                gemm_reference(
                    &a,
                    (a_off, ta, a_stride),
                    &b,
                    (b_off, tb, b_stride),
                    &mut want_pre,
                    (c_off, c_stride),
                    (m, n, k, batch),
                    Some(&bias),
                    false,
                    None,
                    f64::from(alpha),
                );
                assert_close(
                    &format!("{label} pre"),
                    &pre.to_f64().unwrap(),
                    &want_pre,
                    tol_for(k),
                );
            }
        }
    }
}

#[test]
fn empty_extents() {
    let e = engine();
    // K = 0: the product is zero, the output is act(bias) (or zeros); dA, dB are empty and
    // dbias is the column sum of G.
    let a = Tensor::zeros(e, &[5, 0], DType::F32).unwrap();
    let b = Tensor::zeros(e, &[0, 3], DType::BF16).unwrap();
    let bias_v = [0.5, -1.0, 2.0];
    let bias = tensor_from_f64(e, &bias_v, &[3], DType::F32);
    let options = MatmulOptions {
        activation: Some(Activation::Relu),
        ..Default::default()
    };
    let (y, saved) = mm(&a, &b, Some(&bias), &options).unwrap();
    assert_eq!(y.shape(), &[5, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [0.5, 0.0, 2.0].repeat(5));
    let (y0, _) = mm(&a, &b, None, &MatmulOptions::default()).unwrap();
    assert_eq!(y0.to_vec::<f32>().unwrap(), vec![0.0; 15]);
    let dy = tensor_from_f64(e, &[1.0; 15], &[5, 3], DType::F32);
    let g = matmul_backward(&saved, &dy).unwrap();
    assert_eq!(
        (g.a.shape(), g.b.shape()),
        (&[5usize, 0][..], &[0usize, 3][..])
    );
    assert_eq!(g.bias.unwrap().to_vec::<f32>().unwrap(), [5.0, 0.0, 5.0]);

    // M = 0: empty output and dA, zero dB; N = 0: empty output and dB, zero dA.
    let a = Tensor::zeros(e, &[2, 0, 4], DType::F32).unwrap();
    let b = tensor_from_f64(e, &data(701, 12), &[4, 3], DType::F32);
    let (y, saved) = mm(&a, &b, None, &MatmulOptions::default()).unwrap();
    assert_eq!(y.shape(), &[2, 0, 3]);
    let g = matmul_backward(&saved, &Tensor::zeros(e, &[2, 0, 3], DType::F32).unwrap()).unwrap();
    assert_eq!(g.a.shape(), &[2, 0, 4]);
    assert_eq!(g.b.to_vec::<f32>().unwrap(), vec![0.0; 12]);
    let a = tensor_from_f64(e, &data(702, 8), &[2, 4], DType::F16);
    let b = Tensor::zeros(e, &[4, 0], DType::F32).unwrap();
    let (y, saved) = mm(&a, &b, None, &MatmulOptions::default()).unwrap();
    assert_eq!(y.shape(), &[2, 0]);
    let g = matmul_backward(&saved, &Tensor::zeros(e, &[2, 0], DType::F32).unwrap()).unwrap();
    assert_eq!(g.a.to_vec::<f32>().unwrap(), vec![0.0; 8]);
    assert_eq!(g.b.shape(), &[4, 0]);

    // No batches (batch dimension 0) with a shared B: dB is zero.
    for ta in [false, true] {
        let a_shape = if ta { [0, 4, 3] } else { [0, 3, 4] };
        let a = Tensor::zeros(e, &a_shape, DType::F32).unwrap();
        let b = tensor_from_f64(e, &data(703, 20), &[4, 5], DType::F32);
        let options = MatmulOptions {
            transpose_a: ta,
            ..Default::default()
        };
        let (y, saved) = mm(&a, &b, None, &options).unwrap();
        assert_eq!(y.shape(), &[0, 3, 5]);
        let dy = Tensor::zeros(e, y.shape(), DType::F32).unwrap();
        let g = matmul_backward(&saved, &dy).unwrap();
        assert_eq!(g.b.to_vec::<f32>().unwrap(), vec![0.0; 20]);
    }
}

#[test]
fn reruns_are_bit_identical() {
    let e = engine();
    let p = Problem {
        batch: 3,
        a_batched: true,
        activation: Some(Activation::Gelu),
        ..problem(70, 65, 129, false, true)
    };
    let (sa, sb) = shapes(&p);
    let a = tensor_from_f64(e, &data(800, p.a_len()), &sa, DType::BF16);
    let b = tensor_from_f64(e, &data(801, p.b_len()), &sb, DType::F32);
    let bias = tensor_from_f64(e, &data(802, p.n), &[p.n], DType::F16);
    let dy = tensor_from_f64(e, &data(803, p.out_len()), &[3, p.m, p.n], DType::F32);
    let options = MatmulOptions {
        transpose_b: true,
        activation: p.activation,
        ..Default::default()
    };
    let run = || {
        let (y, saved) = mm(&a, &b, Some(&bias), &options).unwrap();
        let g = matmul_backward(&saved, &dy).unwrap();
        [
            f32_bits(&y),
            f32_bits(saved.pre_activation().unwrap()),
            f32_bits(&g.a),
            f32_bits(&g.b),
            f32_bits(&g.bias.unwrap()),
        ]
    };
    assert_eq!(run(), run());
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let f32s = |shape: &[usize]| Tensor::zeros(e, shape, DType::F32).unwrap();
    let none = MatmulOptions::default();
    // Inner-dimension mismatch: expected B's shape with the matching K.
    let r = mm(&f32s(&[3, 4]), &f32s(&[5, 6]), None, &none);
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { expected, got, .. }) if expected == &[4, 6] && got == &[5, 6]),
        "{r:?}"
    );
    let tb = MatmulOptions {
        transpose_b: true,
        ..none
    };
    let r = mm(&f32s(&[3, 4]), &f32s(&[6, 5]), None, &tb);
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { expected, .. }) if expected == &[6, 4]),
        "{r:?}"
    );
    // Rank below 2.
    assert!(matches!(
        mm(&f32s(&[4]), &f32s(&[4, 2]), None, &none),
        Err(Error::ShapeMismatch { .. })
    ));
    // Batch mismatch.
    let r = mm(&f32s(&[2, 3, 4]), &f32s(&[3, 4, 5]), None, &none);
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { expected, .. }) if expected == &[2, 4, 5]),
        "{r:?}"
    );
    // Bias length.
    let r = mm(&f32s(&[3, 4]), &f32s(&[4, 5]), Some(&f32s(&[4])), &none);
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { expected, .. }) if expected == &[5]),
        "{r:?}"
    );
    // Integer operand.
    let ints = Tensor::from_slice(e, &[1i32; 12], &[3, 4]).unwrap();
    assert!(matches!(
        mm(&ints, &f32s(&[4, 5]), None, &none),
        Err(Error::UnsupportedDType { .. })
    ));
    // Cotangent of another shape.
    let (_, saved) = mm(&f32s(&[3, 4]), &f32s(&[4, 5]), None, &none).unwrap();
    assert!(matches!(
        matmul_backward(&saved, &f32s(&[3, 6])),
        Err(Error::ShapeMismatch { .. })
    ));

    let a = f32s(&[12]);
    let b = f32s(&[20]);
    let out = f32s(&[15]);
    let base = |out| Gemm {
        a: GemmOperand {
            tensor: &a,
            offset: 0,
            transposed: false,
            batch_stride: 0,
        },
        b: GemmOperand {
            tensor: &b,
            offset: 0,
            transposed: false,
            batch_stride: 0,
        },
        out,
        out_offset: 0,
        out_batch_stride: 0,
        m: 3,
        n: 5,
        k: 4,
        batch: 1,
        bias: None,
        accumulate: false,
        activation: None,
        pre_activation: None,
        alpha: 1.0,
        tensor_cores: false,
        round_f32_operands: false,
        copy_bytes: None,
        maxima: [None, None],
    };
    gemm(&base(&out)).unwrap();
    // A 16-bit out of an odd width (two columns a word), an integer out.
    let half_out = Tensor::zeros(e, &[15], DType::F16).unwrap();
    let r = gemm(&base(&half_out));
    assert!(
        matches!(&r, Err(Error::InvalidValue { what, got, .. }) if what.contains("n (16-bit out)") && *got == 5.0),
        "{r:?}"
    );
    let int_out = Tensor::zeros(e, &[15], DType::I32).unwrap();
    assert!(matches!(
        gemm(&base(&int_out)),
        Err(Error::UnsupportedDType {
            got: DType::I32,
            ..
        })
    ));
    // Out too small.
    let small = f32s(&[14]);
    assert!(matches!(
        gemm(&base(&small)),
        Err(Error::OutOfBounds {
            got: 15,
            max: 14,
            ..
        })
    ));
    // Offsets past the end, and extents running past it.
    let mut c = base(&out);
    c.a.offset = 13;
    assert!(matches!(
        gemm(&c),
        Err(Error::OutOfBounds {
            got: 13,
            max: 12,
            ..
        })
    ));
    let mut c = base(&out);
    c.b.offset = 1;
    assert!(matches!(
        gemm(&c),
        Err(Error::OutOfBounds {
            got: 21,
            max: 20,
            ..
        })
    ));
    let mut c = base(&out);
    c.out_offset = 16;
    assert!(matches!(
        gemm(&c),
        Err(Error::OutOfBounds {
            got: 16,
            max: 15,
            ..
        })
    ));
    let mut c = base(&out);
    c.batch = 2;
    c.a.batch_stride = 1;
    c.out_batch_stride = 15;
    assert!(matches!(gemm(&c), Err(Error::OutOfBounds { .. })));
    // Overlapping batch outputs.
    let big = f32s(&[30]);
    let mut c = base(&big);
    c.batch = 2;
    c.out_batch_stride = 10;
    assert!(matches!(
        gemm(&c),
        Err(Error::OutOfBounds {
            got: 10,
            min: 15,
            ..
        })
    ));
    // Activation with accumulate; pre-activation with accumulate.
    let mut c = base(&out);
    c.accumulate = true;
    c.activation = Some(Activation::Relu);
    assert!(matches!(gemm(&c), Err(Error::InvalidValue { .. })));
    let pre = f32s(&[15]);
    let mut c = base(&out);
    c.accumulate = true;
    c.pre_activation = Some(&pre);
    assert!(matches!(gemm(&c), Err(Error::InvalidValue { .. })));
    // Non-finite alpha.
    let mut c = base(&out);
    c.alpha = f32::NAN;
    assert!(matches!(gemm(&c), Err(Error::InvalidValue { .. })));
    // Bias length, out aliasing an operand.
    let bias = f32s(&[4]);
    let mut c = base(&out);
    c.bias = Some(&bias);
    assert!(matches!(gemm(&c), Err(Error::ShapeMismatch { .. })));
    let c = base(&b);
    assert!(matches!(gemm(&c), Err(Error::InvalidValue { .. })));
    // Tensors of another engine.
    let other = common::private_engine();
    let foreign = Tensor::zeros(&other, &[4, 5], DType::F32).unwrap();
    assert!(matches!(
        mm(&f32s(&[3, 4]), &foreign, None, &none),
        Err(Error::EngineMismatch { .. })
    ));
}

// ---- split-K ---------------------------------------------------------------------------

/// K values per slice of a split product, by the documented rule.
fn slice_len(k: usize, slices: usize) -> usize {
    k.div_ceil(16).div_ceil(slices) * 16
}

#[test]
fn split_rule_is_the_documented_pure_function_of_the_shape() {
    use matmul::{gemm_split, gemm_split_within, gemm_workspace_bytes};
    // Few tiles and K ≥ 2·2,048: split, ⌈512/T⌉ capped by ⌊k/2048⌋ and 32.
    assert_eq!(gemm_split(64, 64, 4096, 1), 2);
    assert_eq!(gemm_split(64, 64, 4095, 1), 1);
    assert_eq!(gemm_split(1, 1, 10_000, 1), 4);
    assert_eq!(gemm_split(1, 1, 1 << 20, 1), 32);
    assert_eq!(gemm_split(64, 64, 1 << 20, 8), 32);
    assert_eq!(gemm_split(64, 64, 1 << 20, 32), 16);
    // The fused linear cross-entropy's dx product at the H200 shape: 2·32 tiles, 8 slices.
    assert_eq!(gemm_split(256, 4096, 128_256, 1), 8);
    assert_eq!(
        gemm_workspace_bytes(256, 4096, 128_256, 1),
        4 * 8 * 256 * 4096
    );
    // Enough tiles (T ≥ 256), short K, empty extents: never split, no scratch.
    assert_eq!(gemm_split(4096, 4096, 1 << 20, 1), 1);
    assert_eq!(gemm_split(2048, 2048, 1 << 20, 1), 1);
    assert_eq!(gemm_split(1920, 2048, 1 << 20, 1), 3);
    for k in [0, 1, 257, 2048, 4095] {
        assert_eq!(gemm_split(7, 33, k, 3), 1, "k {k}");
        assert_eq!(gemm_workspace_bytes(7, 33, k, 3), 0);
    }
    assert_eq!(gemm_split(0, 64, 1 << 20, 1), 1);
    assert_eq!(gemm_split(64, 64, 1 << 20, 0), 1);
    // Slices: multiples of the 16-wide K step, at least 2,048; the last one the rest.
    for (m, n, k, batch) in [(1, 1, 10_000, 1), (64, 64, 4099, 1), (7, 33, 65_537, 3)] {
        let s = gemm_split(m, n, k, batch);
        let len = slice_len(k, s);
        assert!(
            len.is_multiple_of(16) && len >= 2048 && k.div_ceil(len) == s,
            "{k}: {s} × {len}"
        );
        assert_eq!(
            gemm_workspace_bytes(m, n, k, batch),
            (4 * s * batch * m * n) as u64
        );
    }
    // A workspace limit lowers the slice count, to none when two slices do not fit.
    let per = 4 * 64 * 64;
    assert_eq!(gemm_split(64, 64, 8192, 1), 4);
    assert_eq!(gemm_split_within(64, 64, 8192, 1, 4 * per), 4);
    assert_eq!(gemm_split_within(64, 64, 8192, 1, 4 * per - 1), 3);
    assert_eq!(gemm_split_within(64, 64, 8192, 1, 2 * per), 2);
    assert_eq!(gemm_split_within(64, 64, 8192, 1, 2 * per - 1), 1);
    assert_eq!(gemm_split_within(64, 64, 8192, 1, 0), 1);
}

#[test]
fn split_products_match_reference() {
    // Products that split K (one tile, K ≥ 4,096) against the f64 reference: every dtype,
    // bias, every activation with its pre-activation, both transposes, batches with a shared
    // operand, ragged K; the backward's products go through the same checks.
    let k = 4100;
    assert_eq!(matmul::gemm_split(17, 9, k, 1), 2);
    let mut seed = 1000;
    let mut next = || {
        seed += 4;
        seed
    };
    for (i, activation) in Activation::ALL.into_iter().enumerate() {
        let p = Problem {
            activation: Some(activation),
            ..problem(17, 9, k, i % 2 == 0, i % 3 == 0)
        };
        check_problem_scaled(&p, true, &ALL_F32, next(), 1.0 / 32.0);
    }
    for (a, b, bias, dy) in [
        (DType::F16, DType::F16, DType::F16, DType::F16),
        (DType::BF16, DType::BF16, DType::BF16, DType::BF16),
        (DType::BF16, DType::F16, DType::F32, DType::BF16),
    ] {
        let p = Problem {
            activation: Some(Activation::Silu),
            ..problem(21, 19, 4100, true, true)
        };
        check_problem_scaled(&p, true, &Dtypes { a, b, bias, dy }, next(), 1.0 / 32.0);
    }
    for (a_batched, b_batched) in [(true, true), (true, false), (false, true)] {
        let p = Problem {
            batch: 3,
            a_batched,
            b_batched,
            ..problem(12, 20, 4097, false, false)
        };
        assert_eq!(matmul::gemm_split(12, 20, 4097, 3), 2);
        check_problem(&p, true, &ALL_F32, next());
    }
}

#[test]
fn split_gemm_offsets_accumulate_and_alpha() {
    assert_eq!(matmul::gemm_split(7, 33, 4133, 3), 2);
    gemm_offsets_case(7, 33, 4133, 3, 1100);
}

/// Runs a product on `e` twice (identical bits required) and tells whether its bits are the
/// host's slice sums for slices of `slice` values (fused or unfused multiply-adds).
fn split_bits(e: &wgrad::Engine, p: &Problem, dt: (DType, DType), slice: usize, seed: u64) -> bool {
    let (sa, sb) = shapes(p);
    let a = stored(&data(seed, p.a_len()), dt.0);
    let b = stored(&data(seed + 1, p.b_len()), dt.1);
    let at = tensor_from_f64(e, &a, &sa, dt.0);
    let bt = tensor_from_f64(e, &b, &sb, dt.1);
    let options = MatmulOptions {
        transpose_a: p.transpose_a,
        transpose_b: p.transpose_b,
        activation: None,
        tensor_cores: false,
    };
    let (y, _) = mm(&at, &bt, None, &options).unwrap();
    let got = f32_bits(&y);
    let (y2, _) = mm(&at, &bt, None, &options).unwrap();
    assert_eq!(got, f32_bits(&y2), "rerun");
    got == sliced_sum(p, &a, &b, true, slice) || got == sliced_sum(p, &a, &b, false, slice)
}

#[test]
fn split_sums_are_slice_sums_added_in_slice_order() {
    // Bits: each slice summed as the unsplit kernel sums (one multiply-add per term in
    // increasing k), the slice sums added in increasing order, reruns identical. Under a
    // workspace bound that fits fewer slices, fewer are used; under one that fits none, the
    // product is the unsplit one, bit for bit.
    let e = common::private_engine();
    let cases = [
        (
            problem(5, 6, 10_000, false, false),
            (DType::F32, DType::F32),
        ),
        (problem(3, 17, 4099, true, true), (DType::BF16, DType::F16)),
        (
            Problem {
                batch: 2,
                a_batched: true,
                ..problem(9, 4, 6200, false, true)
            },
            (DType::F16, DType::F32),
        ),
    ];
    for (c, (p, dt)) in cases.iter().enumerate() {
        let seed = 1200 + 4 * c as u64;
        let s = matmul::gemm_split(p.m, p.n, p.k, p.batch);
        assert!(s >= 2, "{p:?}");
        let label = format!("m {} n {} k {} batch {} {dt:?}", p.m, p.n, p.k, p.batch);
        e.set_workspace_bound(wgrad::engine::DEFAULT_WORKSPACE_BOUND);
        assert!(
            split_bits(&e, p, *dt, slice_len(p.k, s), seed),
            "{label}: {s} slices"
        );
        // Room for two slices only.
        let per = (4 * p.batch * p.m * p.n) as u64;
        e.set_workspace_bound(2 * per);
        assert!(
            split_bits(&e, p, *dt, slice_len(p.k, 2), seed),
            "{label}: 2 slices"
        );
        // No room for a split: the unsplit order.
        e.set_workspace_bound(2 * per - 1);
        assert!(split_bits(&e, p, *dt, p.k, seed), "{label}: unsplit");
        e.set_workspace_bound(0);
        assert!(split_bits(&e, p, *dt, p.k, seed), "{label}: bound 0");
    }
}

#[test]
fn split_scratch_is_the_stated_workspace() {
    // The engine's memory statistics see exactly one extra buffer during a split product:
    // gemm_workspace_bytes (rounded up to the pool's size class), and none without a split.
    let e = common::private_engine();
    for (m, n, k, split) in [(40, 24, 8192, true), (40, 24, 4095, false)] {
        let a = Tensor::from_slice(&e, &vec![0.5f32; m * k], &[m, k]).unwrap();
        let b = Tensor::from_slice(&e, &vec![0.25f32; k * n], &[k, n]).unwrap();
        let out = Tensor::zeros(&e, &[m, n], DType::F32).unwrap();
        e.synchronize().unwrap();
        let bytes = matmul::gemm_workspace_bytes(m, n, k, 1);
        assert_eq!(bytes > 0, split);
        let before = e.memory().live_bytes;
        e.reset_peak();
        gemm(&Gemm::plain(
            GemmOperand::whole(&a, false),
            GemmOperand::whole(&b, false),
            &out,
            (m, n, k),
            false,
        ))
        .unwrap();
        e.synchronize().unwrap();
        let extra = e.memory().peak_bytes - before;
        assert!(
            extra >= bytes && extra <= bytes + bytes / 8,
            "k {k}: peak grew by {extra}, workspace {bytes}"
        );
        let want = 0.5 * 0.25 * k as f32;
        assert!(out.to_vec::<f32>().unwrap().iter().all(|&v| v == want));
    }
}

// ---- the two tiles -------------------------------------------------------------------------

#[test]
fn tile_rule_is_the_documented_pure_function_of_the_shape() {
    use matmul::{GemmTile, NARROW_MAX_TILES, gemm_tile};
    assert_eq!((GemmTile::Wide.rows(), GemmTile::Wide.cols()), (128, 128));
    assert_eq!((GemmTile::Narrow.rows(), GemmTile::Narrow.cols()), (64, 64));
    assert_eq!(NARROW_MAX_TILES, 32);
    let (narrow, wide) = (GemmTile::Narrow, GemmTile::Wide);
    for (m, n, batch, tile) in [
        // m or n at most 64 past a multiple of 128: the narrow grid pads less.
        (256, 64, 1, narrow),
        (256, 192, 1, narrow),
        (64, 192, 1, narrow),
        (66, 64, 1, narrow),
        (7, 33, 3, narrow),
        (2048, 64, 1, narrow), // 16 wide tiles
        (64, 64, 31, narrow),
        // As much padding either way: wide, unless it is a single wide workgroup.
        (256, 66, 1, wide),
        (256, 256, 1, wide),
        (512, 512, 1, wide),
        (200, 100, 1, wide),
        (128, 128, 2, wide),
        (128, 128, 1, narrow),
        (100, 120, 1, narrow),
        // At least NARROW_MAX_TILES wide workgroups: wide, whatever the padding.
        (64, 64, 32, wide),
        (4096, 64, 1, wide),
        (64, 128_256, 1, wide),
        (4096, 4096, 1, wide),
        (8192, 14336, 1, wide),
        (256, 4096, 1, wide),
        (256, 128_256, 1, wide),
        // Empty.
        (0, 64, 1, wide),
        (64, 64, 0, wide),
    ] {
        assert_eq!(gemm_tile(m, n, batch), tile, "{m}×{n}×{batch}");
    }
}

/// Output and pre-activation bits of `call` (`gemm`'s tile, or the one given) written into a
/// fresh copy of `init` (and fresh zeros).
fn tile_bits(call: &Gemm, init: &[f64], tile: Option<matmul::GemmTile>) -> (Vec<u32>, Vec<u32>) {
    let e = engine();
    let out = tensor_from_f64(e, init, &[init.len()], DType::F32);
    let pre = Tensor::zeros(e, &[init.len()], DType::F32).unwrap();
    let c = Gemm {
        out: &out,
        pre_activation: call.pre_activation.map(|_| &pre),
        ..*call
    };
    match tile {
        Some(t) => matmul::gemm_with_tile(&c, t).unwrap(),
        None => gemm(&c).unwrap(),
    }
    (f32_bits(&out), f32_bits(&pre))
}

#[test]
fn both_tiles_give_identical_bits() {
    // Each output is summed over k in the same order whichever tile computes it: ragged
    // shapes, both transposes, batches with a shared operand, gapped offsets, every dtype,
    // bias, every activation epilogue with its pre-activation, accumulate with alpha, and a
    // split-K product give the same bits through the wide and the narrow tile (and `gemm`'s
    // own choice). Elements outside the product stay as they were.
    use matmul::GemmTile;
    let e = engine();
    let shapes = [
        (1, 1, 1, 1),
        (7, 33, 13, 3),
        (65, 129, 70, 2),
        (130, 66, 41, 1),
        (20, 17, 4133, 1),
    ];
    let mut case = 0usize;
    for (si, &(m, n, k, batch)) in shapes.iter().enumerate() {
        if k > 4096 {
            assert_eq!(matmul::gemm_split(m, n, k, batch), 2);
        }
        // One dtype pair per layout (each pair and layout is a pipeline of each tile).
        for (ta, tb, dt_a, dt_b) in [
            (false, false, DType::F32, DType::F32),
            (false, true, DType::BF16, DType::F32),
            (true, false, DType::F16, DType::BF16),
            (true, true, DType::F32, DType::F16),
        ] {
            case += 1;
            let seed = 1200 + 10 * case as u64;
            // A shared by the batches in odd cases, B in even ones; gaps between matrices.
            let a_stride = if case % 2 == 1 { 0 } else { m * k + 3 };
            let b_stride = if case.is_multiple_of(2) { 0 } else { k * n + 1 };
            let (a_off, b_off, c_off, c_stride) = (5, 3, 11, m * n + 7);
            let a = stored(&data(seed, a_off + batch * (m * k + 3)), dt_a);
            let b = stored(&data(seed + 1, b_off + batch * (k * n + 1)), dt_b);
            let bias = stored(&data(seed + 2, n), DType::FLOATS[case % 3]);
            let init = data(seed + 3, c_off + batch * c_stride + 4);
            let at = tensor_from_f64(e, &a, &[a.len()], dt_a);
            let bt = tensor_from_f64(e, &b, &[b.len()], dt_b);
            let biast = tensor_from_f64(e, &bias, &[n], DType::FLOATS[case % 3]);
            let activation = Activation::ALL[case % Activation::ALL.len()];
            let placeholder = Tensor::zeros(e, &[init.len()], DType::F32).unwrap();
            for (accumulate, act, alpha) in [
                (false, None, 1.0f32),
                (false, Some(activation), -0.75),
                (true, None, 0.5),
            ] {
                let call = Gemm {
                    a: operand(&at, a_off, ta, a_stride),
                    b: operand(&bt, b_off, tb, b_stride),
                    out: &placeholder,
                    out_offset: c_off,
                    out_batch_stride: c_stride,
                    m,
                    n,
                    k,
                    batch,
                    bias: (si % 2 == 1 || act.is_some()).then_some(&biast),
                    accumulate,
                    activation: act,
                    pre_activation: act.map(|_| &placeholder),
                    alpha,
                    tensor_cores: false,
                    round_f32_operands: false,
                    copy_bytes: None,
                    maxima: [None, None],
                };
                let wide = tile_bits(&call, &init, Some(GemmTile::Wide));
                let narrow = tile_bits(&call, &init, Some(GemmTile::Narrow));
                let label = format!(
                    "{m}×{n}×{k} batch {batch} ta {ta} tb {tb} {dt_a}/{dt_b} acc {accumulate} \
                     {act:?}"
                );
                assert!(wide == narrow, "{label}: the tiles differ");
                assert!(
                    tile_bits(&call, &init, None) == wide,
                    "{label}: gemm's own tile"
                );
                // Outside the product (before, between and after the batches): untouched.
                let before: Vec<u32> = init[..c_off]
                    .iter()
                    .map(|&v| (v as f32).to_bits())
                    .collect();
                assert_eq!(narrow.0[..c_off], before[..], "{label}");
                let tail = c_off + (batch - 1) * c_stride + m * n;
                let after: Vec<u32> = init[tail..].iter().map(|&v| (v as f32).to_bits()).collect();
                assert_eq!(narrow.0[tail..], after[..], "{label}");
            }
        }
    }
}

/// A 16-bit output (`matmul_as`, `gemm` into an F16 / BF16 tensor) holds the F32 product
/// rounded once: bit for bit `cast::cast` of the F32 output (a NaN as any NaN), written by the
/// epilogue for even N (both tiles, a split-K finish with and without a pre-activation, bias
/// and activation, broadcast batches, transposes, 16-bit operands), an odd N computed in F32
/// and narrowed; the saved context gives the same gradients; `gemm` leaves the elements
/// outside the product untouched; no F32 output is allocated on the way (engine peak).
#[test]
fn a_16_bit_output_is_the_f32_product_rounded_once() {
    use DType::{BF16, F16, F32};
    let e = engine();
    let narrowed = |t: &Tensor, d: DType| {
        if d == F32 {
            t.clone()
        } else {
            wgrad::cast::cast(t, d).unwrap()
        }
    };
    // (m, n, k, transpose a, transpose b, a batched [2, ..], bias, activation, operand dtype)
    let cases = [
        (
            7usize, 8usize, 33usize, false, false, false, false, None, F32,
        ),
        (
            130,
            258,
            65,
            true,
            false,
            true,
            true,
            Some(Activation::Silu),
            BF16,
        ),
        (33, 130, 17, false, true, false, true, None, F16),
        (
            16,
            24,
            4100,
            false,
            false,
            false,
            true,
            Some(Activation::GeluTanh),
            BF16,
        ),
        (9, 40, 5000, true, true, true, false, None, F32),
        (
            5,
            7,
            9,
            false,
            false,
            false,
            true,
            Some(Activation::Relu),
            BF16,
        ),
    ];
    let mut rng = Rng::new(900);
    for (m, n, k, ta, tb, batched, with_bias, activation, dt) in cases {
        let a_shape = match (batched, ta) {
            (true, false) => vec![2, m, k],
            (true, true) => vec![2, k, m],
            (false, false) => vec![m, k],
            (false, true) => vec![k, m],
        };
        let b_shape = if tb { vec![n, k] } else { vec![k, n] };
        let len = |s: &[usize]| s.iter().product::<usize>();
        let a = tensor_from_f64(e, &rng.vec(len(&a_shape), -1.0, 1.0), &a_shape, dt);
        let b = tensor_from_f64(e, &rng.vec(len(&b_shape), -1.0, 1.0), &b_shape, dt);
        let bias = with_bias.then(|| tensor_from_f64(e, &rng.vec(n, -1.0, 1.0), &[n], dt));
        let options = MatmulOptions {
            transpose_a: ta,
            transpose_b: tb,
            activation,
            tensor_cores: false,
        };
        let (want, saved) = mm(&a, &b, bias.as_ref(), &options).unwrap();
        let dy = tensor_from_f64(e, &rng.vec(want.len(), -1.0, 1.0), want.shape(), F32);
        let grads = matmul_backward(&saved, &dy).unwrap();
        for out in DType::FLOATS {
            let what = format!("{m}x{n}x{k} ta {ta} tb {tb} batched {batched} {dt} -> {out}");
            let (got, saved_as) = matmul::matmul_as(&a, &b, bias.as_ref(), &options, out).unwrap();
            assert_eq!((got.shape(), got.dtype()), (want.shape(), out), "{what}");
            common::assert_same_bits(&what, &got, &narrowed(&want, out));
            let g = matmul_backward(&saved_as, &dy).unwrap();
            assert_eq!(f32_bits(&g.a), f32_bits(&grads.a), "{what}: da");
            assert_eq!(f32_bits(&g.b), f32_bits(&grads.b), "{what}: db");
        }
    }
    // gemm into a 16-bit tensor at an even offset and batch stride: the rest stays as it was.
    let (m, n, k, batch) = (6usize, 10usize, 12usize, 2usize);
    let a = tensor_from_f64(
        e,
        &rng.vec(batch * m * k, -1.0, 1.0),
        &[batch * m * k],
        BF16,
    );
    let b = tensor_from_f64(e, &rng.vec(k * n, -1.0, 1.0), &[k * n], BF16);
    let total = 4 + batch * (m * n + 2);
    let init: Vec<f64> = (0..total).map(|i| 100.0 + i as f64).collect();
    for tile in [matmul::GemmTile::Wide, matmul::GemmTile::Narrow] {
        let run = |dtype: DType| {
            let out = tensor_from_f64(e, &init, &[total], dtype);
            let call = Gemm {
                out_offset: 4,
                out_batch_stride: m * n + 2,
                batch,
                activation: Some(Activation::Tanh),
                ..Gemm::plain(
                    GemmOperand {
                        tensor: &a,
                        offset: 0,
                        transposed: false,
                        batch_stride: m * k,
                    },
                    GemmOperand {
                        tensor: &b,
                        offset: 0,
                        transposed: false,
                        batch_stride: 0,
                    },
                    &out,
                    (m, n, k),
                    false,
                )
            };
            matmul::gemm_with_tile(&call, tile).unwrap();
            out
        };
        let want = narrowed(&run(F32), F16);
        common::assert_same_bits(&format!("gemm {tile:?} f16 out"), &run(F16), &want);
    }
    // No F32 output on the direct path.
    let private = common::private_engine();
    let (m, n, k) = (256, 512, 64);
    let mut up = |len: usize, shape: &[usize]| {
        wgrad::gradcheck::tensor_from_f64(&private, &rng.vec(len, -1.0, 1.0), shape, BF16)
            .unwrap()
            .0
    };
    let (a, b) = (up(m * k, &[m, k]), up(k * n, &[k, n]));
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let (y, _) = matmul::matmul_as(&a, &b, None, &MatmulOptions::default(), BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let direct = (m * n * 2) as u64;
    assert!(
        grown <= direct * 9 / 8 + 4096,
        "peak grew {grown} bytes for a {direct}-byte output"
    );
    drop(y);
    assert!(matches!(
        matmul::matmul_as(&a, &b, None, &MatmulOptions::default(), DType::I32),
        Err(Error::UnsupportedDType { .. })
    ));
}

/// `matmul_backward_as` stores every gradient as the F32 gradient rounded once: bit for bit
/// `cast::cast` of `matmul_backward`'s (a NaN as any NaN) for products written directly (even
/// rows, batched operands, B shared by an untransposed batched A), batch sums and odd rows
/// narrowed, a bias and an epilogue, both transposes, every operand dtype; no F32 dA is
/// allocated on the direct path (engine peak); a non-float dtype is a typed error.
#[test]
fn backward_as_is_the_f32_gradients_rounded_once() {
    use DType::{BF16, F16, F32};
    let e = engine();
    // (m, n, k, ta, tb, a batched, b batched, bias, activation, operand dtype)
    let cases = [
        (
            8usize, 6usize, 10usize, false, false, true, true, true, None, BF16,
        ),
        (
            7,
            12,
            9,
            true,
            true,
            true,
            false,
            false,
            Some(Activation::Silu),
            F16,
        ),
        (33, 130, 18, false, true, true, false, true, None, F32),
        (
            5,
            7,
            4,
            false,
            false,
            false,
            true,
            false,
            Some(Activation::GeluTanh),
            BF16,
        ),
        (130, 66, 33, true, false, false, false, true, None, BF16),
        (16, 24, 4100, false, true, false, false, false, None, F16),
    ];
    let mut rng = Rng::new(901);
    for (m, n, k, ta, tb, a_batched, b_batched, with_bias, activation, dt) in cases {
        let p = Problem {
            batch: if a_batched || b_batched { 2 } else { 1 },
            a_batched,
            b_batched,
            transpose_a: ta,
            transpose_b: tb,
            activation,
            ..Problem::new(m, n, k)
        };
        let (a_shape, b_shape) = shapes(&p);
        let a = tensor_from_f64(e, &rng.vec(p.a_len(), -1.0, 1.0), &a_shape, dt);
        let b = tensor_from_f64(e, &rng.vec(p.b_len(), -1.0, 1.0), &b_shape, dt);
        let bias = with_bias.then(|| tensor_from_f64(e, &rng.vec(n, -1.0, 1.0), &[n], dt));
        let options = MatmulOptions {
            transpose_a: ta,
            transpose_b: tb,
            activation,
            tensor_cores: false,
        };
        let (y, saved) = mm(&a, &b, bias.as_ref(), &options).unwrap();
        let mut dy_values = rng.vec(y.len(), -1.0, 1.0);
        dy_values[0] = f64::NAN;
        dy_values[1] = f64::INFINITY;
        let dy = tensor_from_f64(e, &dy_values, y.shape(), dt);
        let want = matmul_backward(&saved, &dy).unwrap();
        for out in DType::FLOATS {
            let what = format!(
                "{m}x{n}x{k} ta {ta} tb {tb} batched {a_batched}/{b_batched} {dt} -> {out}"
            );
            let got = matmul::matmul_backward_as(&saved, &dy, out).unwrap();
            let narrowed = |t: &Tensor| {
                if out == F32 {
                    t.clone()
                } else {
                    wgrad::cast::cast(t, out).unwrap()
                }
            };
            common::assert_same_bits(&format!("{what}: da"), &got.a, &narrowed(&want.a));
            common::assert_same_bits(&format!("{what}: db"), &got.b, &narrowed(&want.b));
            assert_eq!(got.bias.is_some(), with_bias, "{what}");
            if let (Some(got), Some(want)) = (&got.bias, &want.bias) {
                common::assert_same_bits(&format!("{what}: dbias"), got, &narrowed(want));
            }
        }
    }
    // No F32 dA on the direct path: the call grows the peak by the two 16-bit gradients (and
    // the product's split-K scratch, none at this shape), not by an F32 copy.
    let private = common::private_engine();
    let (m, n, k) = (512, 64, 256);
    let mut up = |len: usize, shape: &[usize]| {
        wgrad::gradcheck::tensor_from_f64(&private, &rng.vec(len, -1.0, 1.0), shape, BF16)
            .unwrap()
            .0
    };
    let (a, b, dy) = (up(m * k, &[m, k]), up(k * n, &[k, n]), up(m * n, &[m, n]));
    let (y, saved) = mm(&a, &b, None, &MatmulOptions::default()).unwrap();
    drop(y);
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let g = matmul::matmul_backward_as(&saved, &dy, BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let direct = ((m * k + k * n) * 2) as u64;
    assert!(
        grown <= direct * 9 / 8 + 4096,
        "peak grew {grown} bytes for {direct} bytes of 16-bit gradients"
    );
    assert_eq!((g.a.dtype(), g.b.dtype()), (BF16, BF16));
    assert!(matches!(
        matmul::matmul_backward_as(&saved, &dy, DType::U32),
        Err(Error::UnsupportedDType { .. })
    ));
}

/// Products whose K is whole K steps and whose operands are 16-byte aligned fetch them in
/// chunks (`matmul::chunked_fetches`): the same bits as the element-by-element path (forced
/// with `force_chunked_fetches(Some(false))`) for every layout, mixed dtypes, batches with a
/// shared or strided operand at aligned offsets, whole and ragged tiles of both sizes, a
/// split-K product, and the reference's values; the tile order in bands of rows gives them too;
/// the rule says no to a misaligned launch or a k off the K step.
#[test]
fn chunked_fetches_give_the_element_path_bits() {
    use DType::{BF16, F16, F32};
    use matmul::{GemmTile, chunked_fetches, force_chunked_fetches};
    let e = engine();
    // (m, n, k, batch, tile)
    // Whole tiles, and ragged ones (m, n past a tile).
    let shapes = [
        (384, 256, 48, 2, GemmTile::Wide),
        (64, 128, 32, 1, GemmTile::Narrow),
        (128, 128, 4096, 1, GemmTile::Wide),
        (136, 72, 32, 2, GemmTile::Wide),
        (72, 136, 16, 1, GemmTile::Narrow),
        (131, 77, 32, 2, GemmTile::Wide),
    ];
    let mut case = 0usize;
    for &(m, n, k, batch, tile) in &shapes {
        for (ta, tb, dt_a, dt_b) in [
            (false, false, F32, F32),
            (false, true, BF16, BF16),
            (true, false, F16, F32),
            (true, true, F32, BF16),
        ] {
            // An extent that is an operand's pitch must be whole chunks (8 suits every dtype);
            // the 131×77 product runs only with both operands k-contiguous.
            if (ta && m % 8 != 0) || (!tb && n % 8 != 0) {
                continue;
            }
            case += 1;
            let seed = 3100 + 10 * case as u64;
            // Offsets and strides of whole chunks (8 elements suit every dtype).
            let a_stride = if case % 2 == 1 { 0 } else { m * k + 8 };
            let b_stride = if case.is_multiple_of(2) {
                0
            } else {
                k * n + 16
            };
            let (a_off, b_off, c_off, c_stride) = (8, 16, 3, m * n + 5);
            let a = stored(&data(seed, a_off + batch * (m * k + 8)), dt_a);
            let b = stored(&data(seed + 1, b_off + batch * (k * n + 16)), dt_b);
            let init = data(seed + 3, c_off + batch * c_stride);
            let at = tensor_from_f64(e, &a, &[a.len()], dt_a);
            let bt = tensor_from_f64(e, &b, &[b.len()], dt_b);
            let placeholder = Tensor::zeros(e, &[init.len()], DType::F32).unwrap();
            let call = Gemm {
                a: operand(&at, a_off, ta, a_stride),
                b: operand(&bt, b_off, tb, b_stride),
                out: &placeholder,
                out_offset: c_off,
                out_batch_stride: c_stride,
                m,
                n,
                k,
                batch,
                bias: None,
                accumulate: false,
                activation: None,
                pre_activation: None,
                alpha: 1.0,
                tensor_cores: false,
                round_f32_operands: false,
                copy_bytes: None,
                maxima: [None, None],
            };
            let label = format!("{m}×{n}×{k} batch {batch} ta {ta} tb {tb} {dt_a}/{dt_b}");
            assert!(chunked_fetches(&call), "{label}: the rule");
            let chunked = tile_bits(&call, &init, Some(tile));
            force_chunked_fetches(Some(false));
            let elements = tile_bits(&call, &init, Some(tile));
            force_chunked_fetches(None);
            assert!(
                chunked == elements,
                "{label}: chunked and element fetches differ"
            );
            // The tiles in bands of 2 rows (a shorter last band at 3 tile rows): same bits.
            matmul::force_tile_group_rows(Some(2));
            let banded = tile_bits(&call, &init, Some(tile));
            matmul::force_tile_group_rows(None);
            assert!(
                chunked == banded,
                "{label}: the tile order changed the bits"
            );
            let mut want = init.clone();
            gemm_reference(
                &a,
                (a_off, ta, a_stride),
                &b,
                (b_off, tb, b_stride),
                &mut want,
                (c_off, c_stride),
                (m, n, k, batch),
                None,
                false,
                None,
                1.0,
            );
            let got: Vec<f64> = chunked
                .0
                .iter()
                .map(|&w| f64::from(f32::from_bits(w)))
                .collect();
            assert_close(&label, &got, &want, tol_for(k));
        }
    }
    // The rule: a k off the K step, or an offset, stride or pitch that is not whole chunks
    // sends the launch down the element path.
    let at = Tensor::zeros(e, &[2 * 128 * 64 + 64], F32).unwrap();
    let ht = Tensor::zeros(e, &[2 * 128 * 64 + 64], BF16).unwrap();
    let out = Tensor::zeros(e, &[2 * 128 * 128], F32).unwrap();
    let call_t = |a: &Tensor, ta: bool, off: usize, stride: usize, mnk: (usize, usize, usize)| {
        let c = Gemm {
            batch: 2,
            out_batch_stride: mnk.0 * mnk.1,
            ..Gemm::plain(
                operand(a, off, ta, stride),
                operand(&at, 0, true, 0),
                &out,
                mnk,
                false,
            )
        };
        chunked_fetches(&c)
    };
    let call = |a: &Tensor, off: usize, stride: usize, mnk: (usize, usize, usize)| {
        call_t(a, false, off, stride, mnk)
    };
    assert!(call(&at, 4, 128 * 64, (128, 128, 64)));
    assert!(!call(&at, 2, 128 * 64, (128, 128, 64)), "F32 offset 2");
    assert!(
        !call(&at, 4, 128 * 64 + 2, (128, 128, 64)),
        "F32 batch stride"
    );
    assert!(call(&ht, 8, 128 * 64, (128, 128, 64)));
    assert!(!call(&ht, 4, 128 * 64, (128, 128, 64)), "BF16 offset 4");
    assert!(call(&at, 0, 128 * 64, (96, 128, 64)), "ragged m");
    assert!(
        call_t(&at, true, 0, 128 * 64, (96, 128, 64)),
        "transposed A, pitch 96"
    );
    assert!(
        !call_t(&at, true, 0, 128 * 64, (97, 128, 64)),
        "transposed A, pitch 97"
    );
    assert!(
        !call_t(&ht, true, 0, 128 * 64, (100, 128, 64)),
        "BF16 transposed A, pitch 100"
    );
    assert!(!call(&at, 0, 128 * 64, (128, 128, 40)), "k off the K step");
}

/// A tensor-core call (`Gemm::tensor_cores`) over F16 operands of `m`, `n`, `k`, `batch` with
/// gapped offsets and batch strides (multiples of 8 halves, out's of 4), in `layout` (A, B
/// transposed), against the f64 reference under `tensor_core_tolerance`; returns out's bits.
#[allow(clippy::too_many_arguments)]
fn tensor_core_case(
    e: &wgrad::Engine,
    shape: (usize, usize, usize, usize),
    layout: (bool, bool),
    b_shared: bool,
    accumulate: bool,
    alpha: f32,
    tensor_cores: bool,
    seed: u64,
) -> Vec<u32> {
    let case = TcCase {
        b_shared,
        accumulate,
        alpha,
        tensor_cores,
        ..TcCase::default()
    };
    tensor_core_case_as(e, shape, layout, (DType::F16, DType::F16), case, seed)
}

/// The options of [`tensor_core_case_as`].
#[derive(Clone, Copy)]
struct TcCase {
    b_shared: bool,
    accumulate: bool,
    alpha: f32,
    tensor_cores: bool,
    /// `Gemm::round_f32_operands`.
    round: bool,
    /// Every value of A times `2^mags.0`, of B times `2^mags.1` (out's first values times
    /// `2^(mags.0 + mags.1)`); compared after dividing out by the same power.
    mags: (i32, i32),
}

impl Default for TcCase {
    fn default() -> TcCase {
        TcCase {
            b_shared: false,
            accumulate: false,
            alpha: 1.0,
            tensor_cores: true,
            round: false,
            mags: (0, 0),
        }
    }
}

/// [`tensor_core_case`] with operands of `dtypes` (A, B) and the options of `c`, under the
/// rounded budget when an F32 operand is rounded. A BF16 or F32 operand's values are `data`
/// (|v| ≤ 1) times `2^-j`, j cycling over 0..=30 every 7 values (so they span 31 binades
/// below the largest), then times `2^mags`.
fn tensor_core_case_as(
    e: &wgrad::Engine,
    (m, n, k, batch): (usize, usize, usize, usize),
    (ta, tb): (bool, bool),
    (dt_a, dt_b): (DType, DType),
    c: TcCase,
    seed: u64,
) -> Vec<u32> {
    let TcCase {
        b_shared,
        accumulate,
        alpha,
        tensor_cores,
        round,
        mags,
    } = c;
    let (a_off, a_stride) = (8, m * k + 16);
    let (b_off, b_stride) = (16, if b_shared { 0 } else { k * n + 8 });
    let (c_off, c_stride) = (4, m * n + 12);
    let spread = |v: Vec<f64>, dt: DType, mag: i32| -> Vec<f64> {
        let v = v.iter().enumerate();
        v.map(|(i, x)| match dt {
            DType::F16 => *x,
            _ => x * 2f64.powi(mag - ((i / 7) % 31) as i32),
        })
        .collect()
    };
    let a = stored(
        &spread(data(seed, a_off + batch * a_stride), dt_a, mags.0),
        dt_a,
    );
    let b_len = b_off + batch.max(1) * (k * n + 8);
    let b = stored(&spread(data(seed + 1, b_len), dt_b, mags.1), dt_b);
    let unit = 2f64.powi(mags.0 + mags.1);
    let init: Vec<f64> = data(seed + 2, c_off + batch * c_stride + 4)
        .iter()
        .map(|v| v * unit)
        .collect();
    let at = tensor_from_f64(e, &a, &[a.len()], dt_a);
    let bt = tensor_from_f64(e, &b, &[b.len()], dt_b);
    let out = tensor_from_f64(e, &init, &[init.len()], DType::F32);
    let call = Gemm {
        a: operand(&at, a_off, ta, a_stride),
        b: operand(&bt, b_off, tb, b_stride),
        out: &out,
        out_offset: c_off,
        out_batch_stride: c_stride,
        m,
        n,
        k,
        batch,
        bias: None,
        accumulate,
        activation: None,
        pre_activation: None,
        alpha,
        tensor_cores,
        round_f32_operands: round,
        copy_bytes: None,
        maxima: [None, None],
    };
    gemm(&call).unwrap();
    let mut want = init.clone();
    gemm_reference(
        &a,
        (a_off, ta, a_stride),
        &b,
        (b_off, tb, b_stride),
        &mut want,
        (c_off, c_stride),
        (m, n, k, batch),
        None,
        accumulate,
        None,
        f64::from(alpha),
    );
    let label = format!(
        "tensor cores {tensor_cores}: m {m} n {n} k {k} batch {batch} ta {ta} tb {tb} \
         shared b {b_shared} accumulate {accumulate} alpha {alpha} {dt_a:?}×{dt_b:?} \
         rounded {round}"
    );
    let tol = if round && (dt_a == DType::F32 || dt_b == DType::F32) {
        matmul::tensor_core_rounded_tolerance(k)
    } else {
        matmul::tensor_core_tolerance(k)
    };
    // Elements outside the product (gaps, before and after) keep their values.
    let unscaled = |v: Vec<f64>| v.iter().map(|x| x / unit).collect::<Vec<_>>();
    assert_close(
        &label,
        &unscaled(out.to_f64().unwrap()),
        &unscaled(want),
        tol,
    );
    f32_bits(&out)
}

/// The opt-in tensor-core product (F16 operands, F32 out): where the engine cannot run it, a
/// call asking for it is `MissingFeature` (through `gemm` and `matmul`) and nothing is written;
/// where it can, every layout, shared and strided batches, k not a whole K step, ragged tiles
/// in m and n, accumulate and alpha match the reference within `tensor_core_tolerance` (the
/// values around the product untouched), reruns are bit-identical, shapes outside the rule (k
/// or n not whole chunks or rows of out) take the FP32 path (its bits), the backward with an
/// F16 cotangent matches the reference (with an F32 one it is the FP32 path's), and the dtype
/// and epilogue errors are typed.
#[test]
fn tensor_core_entries_bind_what_their_launches_pass() {
    // After the parameters (binding 0): `gemm_tc` takes A, B and out, `gemm_tc_bias` the bias
    // too; the epilogue entries A, B, the bias and out's words, `_pre` the pre-activation
    // too; each the scale factors
    // last (binding 7, read only for BF16 or F32 operands). Read from the module, so
    // checked on every adapter: a binding an entry reaches by mistake (through a shared helper)
    // would fail its launches with `Error::Kernel` on devices with tensor cores only.
    for (entry, want) in [
        ("gemm_tc", vec![0u32, 1, 2, 3, 7]),
        ("gemm_tc_bias", vec![0, 1, 2, 3, 4, 7]),
        ("gemm_tc_epilogue", vec![0, 1, 2, 4, 5, 7]),
        ("gemm_tc_epilogue_pre", vec![0, 1, 2, 4, 5, 6, 7]),
    ] {
        let got: Vec<u32> = matmul::TC_KERNEL
            .bindings(entry)
            .unwrap()
            .iter()
            .map(|s| s.binding)
            .collect();
        assert_eq!(got, want, "{entry}");
        // Every tile (`matmul::TcTile`) translates to strict SPIR-V with a subgroup of 32
        // invocations a block.
        for tile in matmul::TcTile::ALL {
            let constants = vec![
                ("BM", tile.rows as f64),
                ("SB", tile.block_rows as f64),
                ("BK", tile.k_step() as f64),
                ("SCALED", 1.0),
            ];
            let spirv = wgrad::spirv::strict_spirv(&matmul::TC_KERNEL, entry, &constants)
                .unwrap_or_else(|e| panic!("{entry} {tile:?}: {e}"));
            assert_eq!(
                spirv.workgroup_size,
                (tile.invocations() as u32, 1, 1),
                "{entry} {tile:?}"
            );
        }
    }
}

#[test]
fn tensor_core_products_match_reference_or_are_refused() {
    let e = engine();
    let a = tensor_from_f64(e, &data(1, 128 * 64), &[128, 64], DType::F16);
    let b = tensor_from_f64(e, &data(2, 64 * 128), &[64, 128], DType::F16);
    let out = Tensor::zeros(e, &[128 * 128], DType::F32).unwrap();
    let call = Gemm {
        tensor_cores: true,
        ..Gemm::plain(
            operand(&a, 0, false, 0),
            operand(&b, 0, false, 0),
            &out,
            (128, 128, 64),
            false,
        )
    };
    let tc = MatmulOptions {
        tensor_cores: true,
        ..Default::default()
    };
    if !matmul::tensor_cores(e) {
        assert!(matches!(gemm(&call), Err(Error::MissingFeature { .. })));
        assert!(matches!(
            mm(&a, &b, None, &tc),
            Err(Error::MissingFeature { .. })
        ));
        assert!(f32_bits(&out).iter().all(|&w| w == 0));
        eprintln!(
            "no tensor cores on {}: the refusals checked",
            e.info().adapter
        );
        return;
    }
    for (ta, tb) in [(false, true), (false, false), (true, false), (true, true)] {
        for (shape, b_shared, accumulate, alpha) in [
            ((128, 128, 64, 1), false, false, 1.0f32),
            ((256, 384, 200, 1), false, true, 0.5),
            ((128, 256, 8, 2), true, false, -1.25),
            ((384, 128, 1008, 3), false, true, 1.0),
            ((136, 120, 72, 2), false, true, 0.5),
            ((200, 264, 64, 1), true, false, 2.0),
            // Few tiles and a long K: split into K slices (a shorter last one), the slices
            // summed by the FP32 module's finish (accumulate, alpha, a shared B).
            ((64, 128, 8200, 1), false, true, 0.5),
            ((128, 64, 4160, 3), true, false, -1.25),
        ] {
            let seed = 700 + shape.2 as u64;
            let bits =
                tensor_core_case(e, shape, (ta, tb), b_shared, accumulate, alpha, true, seed);
            let again =
                tensor_core_case(e, shape, (ta, tb), b_shared, accumulate, alpha, true, seed);
            assert_eq!(bits, again, "tensor-core rerun {shape:?} ta {ta} tb {tb}");
            // Tiles in bands of two rows (a shorter last band where the tile rows are odd):
            // the same bits.
            matmul::force_tensor_core_group_rows(Some(2));
            let other =
                tensor_core_case(e, shape, (ta, tb), b_shared, accumulate, alpha, true, seed);
            matmul::force_tensor_core_group_rows(None);
            assert_eq!(
                bits, other,
                "tensor-core schedule {shape:?} ta {ta} tb {tb}"
            );
            // Every tile (`matmul::TcTile`): the same bits.
            for tile in matmul::TcTile::ALL {
                matmul::force_tensor_core_tile(Some(tile));
                let tiled =
                    tensor_core_case(e, shape, (ta, tb), b_shared, accumulate, alpha, true, seed);
                matmul::force_tensor_core_tile(None);
                assert_eq!(bits, tiled, "{tile:?} {shape:?} ta {ta} tb {tb}");
            }
        }
    }
    // BF16 operands (either or both), scaled into F16 by powers of two: every layout, values
    // over 31 binades, magnitudes F16 cannot hold (2^-60, 2^40) that only the scaling brings
    // into its range; F32 operands rounded (`round_f32_operands`), alone or with BF16.
    for (ta, tb) in [(false, true), (false, false), (true, false), (true, true)] {
        for (dtypes, mags, round) in [
            ((DType::BF16, DType::BF16), (0, 0), false),
            ((DType::BF16, DType::F16), (-60, 0), false),
            ((DType::F16, DType::BF16), (0, 40), false),
            ((DType::BF16, DType::BF16), (-60, 40), false),
            ((DType::F32, DType::BF16), (-30, 20), true),
            ((DType::F32, DType::F32), (0, 0), true),
        ] {
            for (shape, b_shared, accumulate, alpha) in [
                ((136, 120, 72, 2), false, true, 0.5f32),
                ((128, 256, 200, 1), true, false, 1.0),
            ] {
                let c = TcCase {
                    b_shared,
                    accumulate,
                    alpha,
                    round,
                    mags,
                    ..TcCase::default()
                };
                let bits = tensor_core_case_as(e, shape, (ta, tb), dtypes, c, 77);
                let again = tensor_core_case_as(e, shape, (ta, tb), dtypes, c, 77);
                assert_eq!(bits, again, "rerun {dtypes:?} {shape:?} ta {ta} tb {tb}");
            }
        }
    }
    // The operands' F16 copies (A's, B's, both: operands staged by at least
    // `TC_COPY_MIN_TILES` tiles, scratch within the workspace bound), one copy (room for one),
    // or none (a bound too small, or operands staged by few tiles): the same bits.
    let own = common::private_engine();
    for (dtypes, round) in [
        ((DType::BF16, DType::BF16), false),
        ((DType::F32, DType::BF16), true),
        ((DType::BF16, DType::F16), false),
    ] {
        for shape in [
            (136, 2056, 72, 1),
            (2056, 120, 40, 1),
            (2056, 2056, 8, 1),
            (136, 264, 72, 2),
        ] {
            let c = TcCase {
                round,
                accumulate: true,
                alpha: 0.75,
                ..TcCase::default()
            };
            let label = format!("{dtypes:?} {shape:?}");
            let copied = tensor_core_case_as(&own, shape, (false, true), dtypes, c, 91);
            for bound in [16, 40_000] {
                own.set_workspace_bound(bound);
                let converted = tensor_core_case_as(&own, shape, (false, true), dtypes, c, 91);
                own.set_workspace_bound(wgrad::engine::DEFAULT_WORKSPACE_BOUND);
                assert_eq!(copied, converted, "{label}: copies or not, bound {bound}");
            }
        }
    }
    // Outside the rule (k, n not whole chunks or rows of out): the FP32 path's bits.
    for shape in [(128, 122, 64, 1), (128, 128, 12, 2)] {
        let fp32 = tensor_core_case(e, shape, (false, true), false, false, 1.0, false, 9);
        let asked = tensor_core_case(e, shape, (false, true), false, false, 1.0, true, 9);
        assert_eq!(
            fp32, asked,
            "{shape:?} outside the rule takes the FP32 path"
        );
    }
    // matmul with the option: the forward on tensor cores, the backward on the FP32 path.
    let (y, saved) = mm(&a, &b, None, &tc).unwrap();
    let want = reference::forward(
        &Problem::new(128, 128, 64),
        &a.to_f64().unwrap(),
        &b.to_f64().unwrap(),
        None,
    );
    assert_close(
        "matmul tensor cores",
        &y.to_f64().unwrap(),
        &want,
        matmul::tensor_core_tolerance(64),
    );
    drop((y, saved));
    // The backward with a 16-bit cotangent on tensor cores (every layout, a batched A with a
    // shared B, F16 and BF16); with an F32 cotangent on the FP32 path (its bits).
    for ((ta, tb), dt) in [(false, true), (false, false), (true, false), (true, true)]
        .into_iter()
        .flat_map(|l| [(l, DType::F16), (l, DType::BF16)])
    {
        for (batch, m, n, k) in [(1, 256, 128, 384), (2, 128, 256, 128)] {
            let p = Problem {
                transpose_a: ta,
                transpose_b: tb,
                batch,
                a_batched: batch > 1,
                b_batched: false,
                ..Problem::new(m, n, k)
            };
            let (sa, sb) = shapes(&p);
            let av = stored(&data(40, p.a_len()), dt);
            let bv = stored(&data(41, p.b_len()), dt);
            let dyv = stored(&data(42, p.out_len()), dt);
            let at = tensor_from_f64(e, &av, &sa, dt);
            let bt = tensor_from_f64(e, &bv, &sb, dt);
            let mut out_shape = if batch > 1 { vec![batch] } else { vec![] };
            out_shape.extend([m, n]);
            let dy16 = tensor_from_f64(e, &dyv, &out_shape, dt);
            let options = MatmulOptions {
                transpose_a: ta,
                transpose_b: tb,
                ..tc
            };
            let (_, saved) = mm(&at, &bt, None, &options).unwrap();
            let g = matmul_backward(&saved, &dy16).unwrap();
            let (want_a, want_b, _) = reference::backward(&p, &av, &bv, None, &dyv);
            let label = format!("tensor-core backward {dt:?} ta {ta} tb {tb} batch {batch}");
            let tol = matmul::tensor_core_tolerance(batch * m.max(n));
            assert_close(&format!("{label} dA"), &g.a.to_f64().unwrap(), &want_a, tol);
            assert_close(&format!("{label} dB"), &g.b.to_f64().unwrap(), &want_b, tol);
            let again = matmul_backward(&saved, &dy16).unwrap();
            assert_eq!(f32_bits(&g.a), f32_bits(&again.a), "{label} rerun dA");
            assert_eq!(f32_bits(&g.b), f32_bits(&again.b), "{label} rerun dB");
            let dy32 = tensor_from_f64(e, &dyv, &out_shape, DType::F32);
            let plain = MatmulOptions {
                tensor_cores: false,
                ..options
            };
            let (_, saved32) = mm(&at, &bt, None, &plain).unwrap();
            let fp32 = matmul_backward(&saved32, &dy32).unwrap();
            let asked = matmul_backward(&saved, &dy32).unwrap();
            assert_eq!(f32_bits(&fp32.a), f32_bits(&asked.a), "{label}: F32 dy, dA");
            assert_eq!(f32_bits(&fp32.b), f32_bits(&asked.b), "{label}: F32 dy, dB");
        }
    }
    // Maxima taken ahead (`Gemm::maxima`, `tensor_core_maxima`) in place of the product's
    // own scans: the same bits, BF16 and rounded F32 operands, whole and ragged tiles, split
    // K; maxima of other elements are refused.
    for (dt, (m, n, k)) in [
        (DType::BF16, (128, 128, 64)),
        (DType::F32, (200, 264, 72)),
        (DType::BF16, (64, 128, 4160)),
    ] {
        let x = tensor_from_f64(e, &data(31, m * k), &[m, k], dt);
        let w = tensor_from_f64(e, &data(32, n * k), &[n, k], DType::BF16);
        let mx = matmul::tensor_core_maxima(&x).unwrap();
        let mw = matmul::tensor_core_maxima(&w).unwrap();
        assert!(mx.is_some() && mw.is_some());
        let run_from = |maxima: [Option<&matmul::OperandMaxima>; 2], row0: usize, rows: usize| {
            let out = Tensor::zeros(e, &[m * n], DType::F32).unwrap();
            gemm(&Gemm {
                tensor_cores: true,
                round_f32_operands: true,
                maxima,
                ..Gemm::plain(
                    operand(&x, row0 * k, false, 0),
                    operand(&w, 0, true, 0),
                    &out,
                    (rows, n, k),
                    false,
                )
            })
            .map(|()| f32_bits(&out))
        };
        let run =
            |maxima: [Option<&matmul::OperandMaxima>; 2], rows: usize| run_from(maxima, 0, rows);
        let own = run([None, None], m).unwrap();
        let label = format!("{dt:?} {m}x{n}x{k}");
        assert_eq!(
            own,
            run([mx.as_ref(), mw.as_ref()], m).unwrap(),
            "{label}: both"
        );
        assert_eq!(own, run([None, mw.as_ref()], m).unwrap(), "{label}: B's");
        // A's maxima for B, and A's maxima for fewer rows of A than it was taken over.
        match run([None, mx.as_ref()], m) {
            Err(Error::InvalidValue { what, .. }) => assert!(what.contains("of B"), "{what}"),
            other => panic!("{label}: B given A's maxima: {other:?}"),
        }
        match run([mx.as_ref(), None], m - 8) {
            Err(Error::InvalidValue { got, .. }) => assert_eq!(got, (m * k) as f64),
            other => panic!("{label}: maxima of more rows: {other:?}"),
        }
        // A's maxima for its rows after the first 8 (a region at an offset of A's tensor).
        match run_from([mx.as_ref(), None], 8, m - 8) {
            Err(Error::InvalidValue { rule, .. }) => {
                assert!(rule.contains(&format!("from element {}", 8 * k)), "{rule}")
            }
            other => panic!("{label}: maxima for an offset region: {other:?}"),
        }
        // Maxima taken over exactly that region (`tensor_core_maxima_of`): the same bits as
        // the product's own scan; a region past the end is refused.
        let region = matmul::tensor_core_maxima_of(&x, 8 * k, (m - 8) * k).unwrap();
        assert_eq!(
            run_from([None, None], 8, m - 8).unwrap(),
            run_from([region.as_ref(), mw.as_ref()], 8, m - 8).unwrap(),
            "{label}: region maxima"
        );
        assert!(matches!(
            matmul::tensor_core_maxima_of(&x, 8 * k, (m - 7) * k),
            Err(Error::OutOfBounds { .. })
        ));
    }
    // Typed errors.
    let f32_a = Tensor::zeros(e, &[128, 64], DType::F32).unwrap();
    let bad_dtype = Gemm {
        a: operand(&f32_a, 0, false, 0),
        ..call
    };
    assert!(matches!(
        gemm(&bad_dtype),
        Err(Error::UnsupportedDType { .. })
    ));
}

/// One tensor-core product with an epilogue: F16 operands `[m, k]` (`ta`: stored `[k, m]`)
/// and `[n, k]`, a bias of `bias_dt` (none: `None`), an activation with its pre-activation,
/// `out_dt` out, alpha 0.75, at gapped offsets. Returns the bits of out's values and of the
/// pre-activation's (empty without one) after checking both against the f64 reference (a 16-bit out: the F32
/// epilogue's result of the same call rounded once, bit for bit).
fn tensor_core_epilogue_case(
    e: &wgrad::Engine,
    (m, n, k): (usize, usize, usize),
    ta: bool,
    bias_dt: Option<DType>,
    activation: Option<Activation>,
    out_dt: DType,
    seed: u64,
) -> (Vec<u64>, Vec<u64>) {
    let (a_off, b_off, c_off) = (8, 16, 4);
    let alpha = 0.75f32;
    let a = stored(&data(seed, a_off + m * k), DType::F16);
    let b = stored(&data(seed + 1, b_off + n * k), DType::F16);
    let at = tensor_from_f64(e, &a, &[a.len()], DType::F16);
    let bt = tensor_from_f64(e, &b, &[b.len()], DType::F16);
    let bias = bias_dt.map(|dt| {
        let v = stored(&data(seed + 2, n), dt);
        (tensor_from_f64(e, &v, &[n], dt), v)
    });
    let run = |out_dt: DType| {
        let out = Tensor::zeros(e, &[c_off + m * n + 4], out_dt).unwrap();
        let pre = Tensor::zeros(e, &[c_off + m * n + 4], DType::F32).unwrap();
        let call = Gemm {
            out_offset: c_off,
            bias: bias.as_ref().map(|(t, _)| t),
            activation,
            pre_activation: activation.map(|_| &pre),
            alpha,
            tensor_cores: true,
            ..Gemm::plain(
                operand(&at, a_off, ta, 0),
                operand(&bt, b_off, true, 0),
                &out,
                (m, n, k),
                false,
            )
        };
        gemm(&call).unwrap();
        (out, pre)
    };
    let label = format!(
        "tensor-core epilogue m {m} n {n} k {k} ta {ta} bias {bias_dt:?} {activation:?} out {out_dt:?}"
    );
    let (out32, pre) = run(DType::F32);
    let mut want = vec![0.0; c_off + m * n + 4];
    let mut want_pre = want.clone();
    let bias_v = bias.as_ref().map(|(_, v)| v.as_slice());
    let ops = ((a_off, ta, 0), (b_off, true, 0));
    let dims = (m, n, k, 1);
    let f = f64::from(alpha);
    gemm_reference(
        &a,
        ops.0,
        &b,
        ops.1,
        &mut want,
        (c_off, 0),
        dims,
        bias_v,
        false,
        activation,
        f,
    );
    gemm_reference(
        &a,
        ops.0,
        &b,
        ops.1,
        &mut want_pre,
        (c_off, 0),
        dims,
        bias_v,
        false,
        None,
        f,
    );
    // The activations' slopes are at most about 1.1 on these values: the sums' budget holds.
    let tol = matmul::tensor_core_tolerance(k + 1);
    assert_close(&label, &out32.to_f64().unwrap(), &want, tol);
    let pre_bits = if activation.is_some() {
        assert_close(
            &format!("{label} pre"),
            &pre.to_f64().unwrap(),
            &want_pre,
            tol,
        );
        common::value_bits(&pre)
    } else {
        Vec::new()
    };
    if out_dt == DType::F32 {
        return (common::value_bits(&out32), pre_bits);
    }
    let (out16, _) = run(out_dt);
    let rounded = wgrad::cast::cast(&out32, out_dt).unwrap();
    assert_same_bits(
        &format!("{label}: the F32 result rounded once"),
        &out16,
        &rounded,
    );
    (common::value_bits(&out16), pre_bits)
}

/// The tensor-core product's epilogue (bias of every float dtype, activations with their
/// pre-activation, F16 / BF16 outputs, alpha; whole and ragged tiles, A stored either way)
/// against the f64 reference, a 16-bit out bit for bit the F32 one rounded once, a zero bias
/// giving the plain product's bits (the same sums), reruns bit-identical, and `matmul_as`
/// with a bias and F16 out the rounding of `matmul`'s. Without tensor cores: a call with a
/// bias and activation is refused with `MissingFeature`, and nothing is written.
#[test]
fn tensor_core_epilogues_match_reference_or_are_refused() {
    let e = engine();
    let a = tensor_from_f64(e, &data(5, 128 * 64), &[128, 64], DType::F16);
    let b = tensor_from_f64(e, &data(6, 64 * 128), &[128, 64], DType::F16);
    let bias = tensor_from_f64(e, &data(7, 128), &[128], DType::BF16);
    let tc = MatmulOptions {
        transpose_b: true,
        activation: Some(Activation::GeluTanh),
        tensor_cores: true,
        ..Default::default()
    };
    if !matmul::tensor_cores(e) {
        assert!(matches!(
            mm(&a, &b, Some(&bias), &tc),
            Err(Error::MissingFeature { .. })
        ));
        let out = Tensor::zeros(e, &[128 * 128], DType::F16).unwrap();
        let call = Gemm {
            bias: Some(&bias),
            tensor_cores: true,
            ..Gemm::plain(
                operand(&a, 0, false, 0),
                operand(&b, 0, true, 0),
                &out,
                (128, 128, 64),
                false,
            )
        };
        assert!(matches!(gemm(&call), Err(Error::MissingFeature { .. })));
        assert!(out.to_f64().unwrap().iter().all(|&x| x.to_bits() == 0));
        return;
    }
    let cases = [
        (Some(DType::F32), None, DType::F32),
        (Some(DType::F16), Some(Activation::GeluTanh), DType::F32),
        (Some(DType::BF16), Some(Activation::Relu), DType::F16),
        (None, Some(Activation::Silu), DType::BF16),
        (None, None, DType::F16),
        (Some(DType::F32), Some(Activation::Tanh), DType::BF16),
    ];
    for (shape, ta) in [
        ((128, 128, 64), false),
        ((136, 120, 72), true),
        ((200, 264, 200), false),
        // Split into K slices: the epilogue applied by the FP32 module's finish.
        ((72, 136, 4160), true),
    ] {
        for (i, &(bias_dt, act, out_dt)) in cases.iter().enumerate() {
            let seed = 900 + 10 * i as u64;
            let first = tensor_core_epilogue_case(e, shape, ta, bias_dt, act, out_dt, seed);
            if i == 1 {
                let again = tensor_core_epilogue_case(e, shape, ta, bias_dt, act, out_dt, seed);
                assert_eq!(first, again, "tensor-core epilogue rerun {shape:?}");
            }
            // Every tile (`matmul::TcTile`): the same bits.
            for tile in matmul::TcTile::ALL {
                matmul::force_tensor_core_tile(Some(tile));
                let tiled = tensor_core_epilogue_case(e, shape, ta, bias_dt, act, out_dt, seed);
                matmul::force_tensor_core_tile(None);
                assert_eq!(first, tiled, "{tile:?}, epilogue {shape:?} case {i}");
            }
            // Through workgroup memory (`gemm_tc_epilogue`) instead of staged in F32 scratch
            // for `gemm_finish` (the rule, where the scratch fits): the same bits.
            matmul::force_tensor_core_staging(Some(false));
            let direct = tensor_core_epilogue_case(e, shape, ta, bias_dt, act, out_dt, seed);
            matmul::force_tensor_core_staging(None);
            assert_eq!(first, direct, "unstaged epilogue {shape:?} case {i}");
        }
        // A zero bias: the epilogue entry's sums are the plain entry's.
        let (m, n, k) = shape;
        let a16 = tensor_from_f64(e, &data(11, m * k), &[m * k], DType::F16);
        let b16 = tensor_from_f64(e, &data(12, n * k), &[n * k], DType::F16);
        let zero = Tensor::zeros(e, &[n], DType::F32).unwrap();
        let product = |bias: Option<&Tensor>| {
            let out = Tensor::zeros(e, &[m * n], DType::F32).unwrap();
            gemm(&Gemm {
                bias,
                tensor_cores: true,
                ..Gemm::plain(
                    operand(&a16, 0, ta, 0),
                    operand(&b16, 0, true, 0),
                    &out,
                    (m, n, k),
                    false,
                )
            })
            .unwrap();
            f32_bits(&out)
        };
        assert_eq!(product(None), product(Some(&zero)), "{shape:?}: zero bias");
        // Sums of zero times a negative alpha (−0) into a 16-bit out without a bias: staged
        // or through workgroup memory, both add the (zero) bias, so the same bits (+0).
        let zeros = Tensor::zeros(e, &[m * k], DType::F16).unwrap();
        let negated = |stage: bool| {
            let out = Tensor::zeros(e, &[m * n], DType::BF16).unwrap();
            matmul::force_tensor_core_staging(Some(stage));
            gemm(&Gemm {
                alpha: -1.0,
                tensor_cores: true,
                ..Gemm::plain(
                    operand(&zeros, 0, ta, 0),
                    operand(&b16, 0, true, 0),
                    &out,
                    (m, n, k),
                    false,
                )
            })
            .unwrap();
            matmul::force_tensor_core_staging(None);
            out.to_f64().unwrap()
        };
        let (staged, direct) = (negated(true), negated(false));
        assert!(
            staged
                .iter()
                .zip(&direct)
                .all(|(s, d)| s.to_bits() == d.to_bits() && s.to_bits() == 0),
            "{shape:?}: −0 sums"
        );
    }
    // An F32 out with a bias and no activation (the bias added to whole fragments,
    // `gemm_tc_bias`): bit for bit the pre-activation the epilogue entry saves, for biases of
    // each dtype, whole and ragged tiles, F16 and BF16 (scaled) operands, and accumulate.
    for (m, n, k) in [(128, 128, 64), (200, 264, 200)] {
        for (i, dt) in [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .enumerate()
        {
            let seed = 950 + 10 * i as u64;
            let x_dt = if dt == DType::BF16 { dt } else { DType::F16 };
            let x = tensor_from_f64(e, &data(seed, m * k), &[m, k], x_dt);
            let w = tensor_from_f64(e, &data(seed + 1, n * k), &[n, k], DType::BF16);
            let bias = tensor_from_f64(e, &data(seed + 2, n), &[n], dt);
            let plain = MatmulOptions {
                transpose_b: true,
                tensor_cores: true,
                ..Default::default()
            };
            let (y, _) = mm(&x, &w, Some(&bias), &plain).unwrap();
            let act = MatmulOptions {
                activation: Some(Activation::Relu),
                ..plain
            };
            let (_, saved) = mm(&x, &w, Some(&bias), &act).unwrap();
            let pre = saved.pre_activation().expect("pre-activation");
            assert_same_bits(&format!("bias {dt:?} {m}x{n}x{k}"), &y, pre);
            // accumulate: out + (alpha·Σ + bias), the epilogue's F32 store.
            let start = tensor_from_f64(e, &data(seed + 3, m * n), &[m * n], DType::F32);
            let acc = tensor_from_f64(e, &data(seed + 3, m * n), &[m * n], DType::F32);
            let run = |out: &Tensor, accumulate: bool| {
                gemm(&Gemm {
                    bias: Some(&bias),
                    tensor_cores: true,
                    alpha: 0.75,
                    ..Gemm::plain(
                        operand(&x, 0, false, 0),
                        operand(&w, 0, true, 0),
                        out,
                        (m, n, k),
                        accumulate,
                    )
                })
                .unwrap()
            };
            run(&acc, true);
            let fresh = Tensor::zeros(e, &[m * n], DType::F32).unwrap();
            run(&fresh, false);
            let want: Vec<f64> = start
                .to_f64()
                .unwrap()
                .iter()
                .zip(fresh.to_f64().unwrap())
                .map(|(s, v)| f64::from(*s as f32 + v as f32))
                .collect();
            let got = acc.to_f64().unwrap();
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "accumulate {dt:?} {m}x{n}x{k} at {j}"
                );
            }
        }
    }
    // matmul_as with a bias and activation, F16 out: the F32 result rounded once.
    let (y32, _) = mm(&a, &b, Some(&bias), &tc).unwrap();
    let (y16, _) = matmul::matmul_as(&a, &b, Some(&bias), &tc, DType::F16).unwrap();
    let rounded = wgrad::cast::cast(&y32, DType::F16).unwrap();
    assert_same_bits("matmul_as F16 with tensor cores", &y16, &rounded);
}

/// The power-of-two factors of tensor-core products (`matmul::tensor_core_scales`, run on any
/// adapter): none for two F16 operands; for BF16 and F32 tensors (random values times 2^-60
/// or 2^90, infinities and NaNs among them, subnormals only, zeros only, ±0, an odd BF16
/// length whose buffer holds a larger value past the end, tensors of 5 million values with the
/// largest inside the sixteen-word steps or after them, a tensor of 1.2 million values that
/// takes every partial group and loops, an empty one) exactly the host's rule from the
/// largest finite magnitude; and every finite BF16 value times its factor is below 2^15 and,
/// within 2^31 of the largest, an F16 value exactly.
#[test]
fn tensor_core_scales_follow_the_largest_finite_magnitude() {
    let e = engine();
    let f16 = tensor_from_f64(e, &[1.0; 8], &[8], DType::F16);
    assert!(matmul::tensor_core_scales(&f16, &f16).unwrap().is_none());
    assert!(matmul::tensor_core_maxima(&f16).unwrap().is_none());
    // The host's rule: s from the largest finite magnitude.
    let exponent = |values: &[f64], dt: DType| -> i32 {
        let m = values
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| (v.abs() as f32).to_bits())
            .max()
            .unwrap_or(0);
        if m == 0 {
            return 0;
        }
        assert!(dt != DType::F16);
        (14 - ((m >> 23) as i32 - 127)).clamp(-113, 126)
    };
    let mut rng = Rng::new(5);
    let random = |rng: &mut Rng, n: usize, p: i32| -> Vec<f64> {
        rng.vec(n, -1.0, 1.0)
            .iter()
            .map(|v| v * 2f64.powi(p))
            .collect()
    };
    let mut specials = random(&mut rng, 300, -60);
    specials[3] = f64::INFINITY;
    specials[17] = f64::NEG_INFINITY;
    specials[200] = f64::NAN;
    let subnormal: Vec<f64> = (1..40).map(|i| f64::from(i) * 2f64.powi(-140)).collect();
    // Five million values, the largest inside the steps of sixteen words an invocation, or
    // in the words after them.
    let mut inside = random(&mut rng, 5_000_000, 3);
    inside[1_234_567] = 3.0e6;
    let mut last = random(&mut rng, 5_000_000, 3);
    last[4_999_999] = -3.0e6;
    let cases: Vec<(&str, Vec<f64>)> = vec![
        ("5 million, the largest in a step", inside),
        ("5 million, the largest last", last),
        ("2^-60 with inf and NaN", specials),
        ("2^90", random(&mut rng, 1000, 90)),
        ("the top binade", vec![3.0e38, -1.0, 2.5e38]),
        ("subnormal", subnormal),
        ("zeros", vec![0.0; 64]),
        ("signed zeros", vec![-0.0, 0.0, -0.0]),
        ("1.2 million", random(&mut rng, 1_200_000, 3)),
        ("one", vec![-0.75]),
        ("empty", vec![]),
    ];
    for dt in [DType::BF16, DType::F32] {
        for (name, values) in &cases {
            let v = stored(values, dt);
            let t = tensor_from_f64(e, &v, &[v.len()], dt);
            let other = tensor_from_f64(e, &random(&mut rng, 24, -3), &[24], DType::BF16);
            // The partial maxima taken ahead (`Gemm::maxima`): their largest is the host's
            // largest finite magnitude (none for an empty tensor).
            let top = v
                .iter()
                .filter(|x| x.is_finite())
                .map(|x| (x.abs() as f32).to_bits())
                .max();
            match matmul::tensor_core_maxima(&t).unwrap() {
                Some(m) => {
                    let got = f32_bits(m.partials()).into_iter().max();
                    assert_eq!(got, Some(top.unwrap_or(0)), "{dt:?} {name}: maxima");
                }
                None => assert!(v.is_empty(), "{dt:?} {name}: no maxima"),
            }
            for (a, b, va) in [(&t, &f16, true), (&other, &t, false)] {
                let got = matmul::tensor_core_scales(a, b)
                    .unwrap()
                    .unwrap()
                    .to_f64()
                    .unwrap();
                let s = exponent(&v, dt);
                let (sa, sb) = if va {
                    (s, 0)
                } else {
                    (exponent(&other.to_f64().unwrap(), DType::BF16), s)
                };
                let want = [sa, sb, -sa, -sb].map(|p| 2f64.powi(p));
                assert_eq!(
                    &got[..4],
                    &want,
                    "{dt:?} {name} as {}",
                    if va { "a" } else { "b" }
                );
            }
            if dt == DType::BF16 {
                let s = exponent(&v, dt);
                let top = v
                    .iter()
                    .filter(|x| x.is_finite())
                    .fold(0f64, |m, x| m.max(x.abs()));
                for x in v.iter().filter(|x| x.is_finite() && **x != 0.0) {
                    let y = x * 2f64.powi(s);
                    assert!(y.abs() < 32768.0, "{name}: {x} scales to {y}");
                    if x.abs().log2().floor() >= top.log2().floor() - 31.0 {
                        let h = half::f16::from_f64(y).to_f64();
                        assert_eq!(h, y, "{name}: {x} times 2^{s} is not an F16 value");
                    }
                }
            }
        }
    }
    // An odd BF16 length: the half after the last element (here about 2^100) is not read.
    let values = [0.5, -0.25, 1.0, 2.0, 0.125, 3.0, -1.5, 1e30];
    let padded = tensor_from_f64(e, &values, &[8], DType::BF16);
    let seven = Tensor::from_buffer(e, padded.buffer().clone(), &[7], DType::BF16).unwrap();
    let got = matmul::tensor_core_scales(&seven, &f16)
        .unwrap()
        .unwrap()
        .to_f64()
        .unwrap();
    assert_eq!(
        got[0],
        2f64.powi(13),
        "the largest of seven is 3.0 (binade 1)"
    );
}
