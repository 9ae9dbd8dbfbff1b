//! Dual chunk attention (`wgrad::dual_chunk`) against the f64 reference of
//! `wgrad::reference::dual_chunk` (every row's scores materialized): output, saved F32 output,
//! row statistics and the five gradients for F32, F16 and BF16 storage; grouped heads; chunk
//! lengths from 1 to past the sequence; fewer queries than keys; lengths that are not tile
//! multiples; empty shapes; head dims 8–128; the `[B,S,H,D]` layout bit for bit the
//! `[B,H,S,D]` one; equal branches give causal attention; reruns bit-identical; finite
//! differences of the reference backward; the 16-bit gradients; the scratch against its
//! query; the positions helper; every documented bad input's error.
//!
//! Tolerance: `Tolerance::for_dtype` of the compared output (the output in its storage dtype,
//! everything else F32), unscaled: the references use the stored (rounded) inputs.

mod common;

use common::{Rng, engine};
use wgrad::attention::{AttentionLayout, AttentionOptions, attention_backward, attention_forward};
use wgrad::dual_chunk::{
    DualChunkOptions, DualChunkQueries, dual_chunk_attention, dual_chunk_attention_backward,
    dual_chunk_attention_backward_as, dual_chunk_positions, dual_chunk_workspace_bytes,
};
use wgrad::gradcheck::{Tolerance, check_vjp, compare, tensor_from_f64};
use wgrad::reference::attention::Dims;
use wgrad::reference::dual_chunk as reference;
use wgrad::{DType, Engine, Error, Tensor};

fn dims(b: usize, hq: usize, hk: usize, q_len: usize, k_len: usize, d: usize) -> Dims {
    Dims {
        batch: b,
        q_heads: hq,
        kv_heads: hk,
        q_len,
        k_len,
        head_dim: d,
    }
}

/// Uploaded inputs (three queries, key, value, d_output) and the values they hold.
struct Inputs {
    tensors: Vec<Tensor>,
    stored: Vec<Vec<f64>>,
}

fn inputs(d: &Dims, dtype: DType, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let q_shape = [d.batch, d.q_heads, d.q_len, d.head_dim];
    let k_shape = [d.batch, d.kv_heads, d.k_len, d.head_dim];
    let shapes = [q_shape, q_shape, q_shape, k_shape, k_shape, q_shape];
    let (tensors, stored) = shapes
        .iter()
        .map(|s| {
            let n = s.iter().product();
            tensor_from_f64(engine(), &rng.vec(n, -1.5, 1.5), s, dtype).unwrap()
        })
        .unzip();
    Inputs { tensors, stored }
}

fn queries(t: &[Tensor]) -> DualChunkQueries<'_> {
    DualChunkQueries {
        intra: &t[0],
        successive: &t[1],
        inter: &t[2],
    }
}

fn options(chunk_len: usize) -> DualChunkOptions {
    DualChunkOptions {
        chunk_len,
        scale: None,
        layout: AttentionLayout::BatchHeadSeq,
    }
}

fn assert_close(what: &str, got: &Tensor, want: &[f64], tol: Tolerance) {
    let c = compare(&got.to_f64().unwrap(), want, tol);
    assert!(c.passed, "{what}: {c}");
}

/// Runs forward and backward on `d` and compares everything with the reference.
fn check(d: Dims, chunk_len: usize, dtype: DType, seed: u64) {
    let what = format!("{d:?} chunk {chunk_len} {dtype}");
    let x = inputs(&d, dtype, seed);
    let t = &x.tensors;
    let (out, saved) = dual_chunk_attention(queries(t), &t[3], &t[4], &options(chunk_len)).unwrap();
    assert_eq!((out.shape(), out.dtype()), (t[0].shape(), dtype));
    let g = dual_chunk_attention_backward(&saved, &t[5]).unwrap();
    let s = &x.stored;
    let q = [&s[0][..], &s[1][..], &s[2][..]];
    let scale = 1.0 / (d.head_dim as f64).sqrt();
    let want = reference::forward(q, &s[3], &s[4], &d, chunk_len, scale);
    let (dq, dk, dv) = reference::backward(q, &s[3], &s[4], &s[5], &d, chunk_len, scale);
    let f32_tol = Tolerance::for_dtype(DType::F32);
    assert_close(
        &format!("{what}: output"),
        &out,
        &want.output,
        Tolerance::for_dtype(dtype),
    );
    assert_close(
        &format!("{what}: output_f32"),
        saved.output_f32(),
        &want.output,
        f32_tol,
    );
    assert_close(
        &format!("{what}: row_max"),
        saved.row_max(),
        &want.row_max,
        f32_tol,
    );
    assert_close(
        &format!("{what}: log_den"),
        saved.log_denominator(),
        &want.log_denominator,
        f32_tol,
    );
    for (name, got, want) in [
        ("d intra", &g.intra, &dq[0]),
        ("d successive", &g.successive, &dq[1]),
        ("d inter", &g.inter, &dq[2]),
        ("dk", &g.key, &dk),
        ("dv", &g.value, &dv),
    ] {
        assert_eq!(got.dtype(), DType::F32);
        assert_close(&format!("{what}: {name}"), got, want, f32_tol);
    }
}

#[test]
fn every_dtype_matches_the_reference() {
    for dtype in DType::FLOATS {
        check(dims(2, 4, 2, 70, 70, 32), 16, dtype, 1);
    }
}

#[test]
fn chunk_lengths_from_one_to_past_the_sequence() {
    // 1: every earlier key inter-chunk but the one before; 7, 23 and 64: chunks across tile
    // edges and on them; 130: every key in the query's chunk (plain causal attention).
    for chunk_len in [1, 7, 23, 64, 130] {
        check(dims(1, 2, 1, 130, 130, 16), chunk_len, DType::F32, 2);
    }
}

#[test]
fn fewer_queries_than_keys_ragged_lengths_and_head_dims() {
    check(dims(1, 3, 1, 17, 150, 8), 20, DType::F32, 3);
    check(dims(2, 2, 2, 1, 67, 40), 9, DType::BF16, 4);
    check(dims(1, 2, 1, 65, 129, 128), 50, DType::F16, 5);
    check(dims(1, 1, 1, 3, 3, 72), 2, DType::F32, 6);
}

#[test]
fn empty_shapes() {
    // No queries (with and without keys), no batch: empty outputs, zero key/value gradients.
    check(dims(1, 2, 1, 0, 5, 8), 2, DType::F32, 15);
    check(dims(1, 2, 1, 0, 0, 8), 2, DType::BF16, 16);
    check(dims(0, 2, 1, 4, 4, 8), 2, DType::F32, 17);
}

#[test]
fn equal_branches_are_causal_attention() {
    // With one query in every branch the partitions only split the causal keys: the result is
    // causal attention's (within FP32 rounding: the merge orders the sums differently).
    let d = dims(1, 4, 2, 100, 120, 24);
    let x = inputs(&d, DType::F32, 7);
    let t = &x.tensors;
    let same = DualChunkQueries {
        intra: &t[0],
        successive: &t[0],
        inter: &t[0],
    };
    let (out, saved) = dual_chunk_attention(same, &t[3], &t[4], &options(13)).unwrap();
    let g = dual_chunk_attention_backward(&saved, &t[5]).unwrap();
    let causal = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let (want, want_saved) = attention_forward(&t[0], &t[3], &t[4], &causal).unwrap();
    let wg = attention_backward(&want_saved, &t[5]).unwrap();
    let tol = Tolerance::for_dtype(DType::F32);
    assert_close("output", &out, &want.to_f64().unwrap(), tol);
    // The three query gradients add up to causal attention's.
    let dq: Vec<f64> = [&g.intra, &g.successive, &g.inter]
        .iter()
        .map(|t| t.to_f64().unwrap())
        .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x + y).collect())
        .unwrap();
    let c = compare(&dq, &wg.query.to_f64().unwrap(), tol);
    assert!(c.passed, "dq: {c}");
    assert_close("dk", &g.key, &wg.key.to_f64().unwrap(), tol);
    assert_close("dv", &g.value, &wg.value.to_f64().unwrap(), tol);
}

/// The bits of every result of a forward and backward.
fn all_bits(t: &[Tensor], options: &DualChunkOptions) -> Vec<Vec<u64>> {
    let (out, saved) = dual_chunk_attention(queries(t), &t[3], &t[4], options).unwrap();
    let g = dual_chunk_attention_backward(&saved, &t[5]).unwrap();
    [
        &out,
        saved.output_f32(),
        saved.row_max(),
        saved.log_denominator(),
        &g.intra,
        &g.successive,
        &g.inter,
        &g.key,
        &g.value,
    ]
    .iter()
    .map(|t| common::value_bits(t))
    .collect()
}

#[test]
fn reruns_are_bit_identical() {
    for dtype in [DType::F32, DType::BF16] {
        let x = inputs(&dims(2, 2, 1, 90, 90, 16), dtype, 8);
        let first = all_bits(&x.tensors, &options(30));
        assert!(first == all_bits(&x.tensors, &options(30)), "{dtype}");
    }
}

/// `[B,H,S,D]` values as `[B,S,H,D]`.
fn to_bshd(x: &[f64], shape: &[usize]) -> Vec<f64> {
    let [h, s, d] = [shape[1], shape[2], shape[3]];
    let mut out = vec![0.0; x.len()];
    for (i, v) in x.iter().enumerate() {
        let (c, si, hi, bi) = (i % d, i / d % s, i / (d * s) % h, i / (d * s * h));
        out[((bi * s + si) * h + hi) * d + c] = *v;
    }
    out
}

#[test]
fn batch_seq_head_layout_gives_the_same_bits() {
    let d = dims(2, 4, 2, 40, 75, 16);
    let x = inputs(&d, DType::F32, 9);
    let moved: Vec<Tensor> = x
        .tensors
        .iter()
        .map(|t| {
            let s = t.shape();
            let v = to_bshd(&t.to_f64().unwrap(), s);
            common::tensor_from_f64(engine(), &v, &[s[0], s[2], s[1], s[3]], DType::F32)
        })
        .collect();
    let bshd = DualChunkOptions {
        layout: AttentionLayout::BatchSeqHead,
        ..options(11)
    };
    let want = all_bits(&x.tensors, &options(11));
    let got = all_bits(&moved, &bshd);
    // Outputs and gradients in the inputs' layout; the row statistics in [B,H,S] either way.
    let layouts = [0, 1, 4, 5, 6, 7, 8];
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w = if layouts.contains(&i) {
            let shape = if i < 7 {
                [d.batch, d.q_heads, d.q_len, d.head_dim]
            } else {
                [d.batch, d.kv_heads, d.k_len, d.head_dim]
            };
            let f: Vec<f64> = w.iter().map(|b| f64::from_bits(*b)).collect();
            to_bshd(&f, &shape).iter().map(|v| v.to_bits()).collect()
        } else {
            w.clone()
        };
        assert!(*g == w, "result {i}");
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    let d = dims(1, 2, 1, 6, 7, 8);
    let mut rng = Rng::new(10);
    let q: Vec<Vec<f64>> = (0..3).map(|_| rng.vec(2 * 6 * 8, -1.0, 1.0)).collect();
    let k = rng.vec(7 * 8, -1.0, 1.0);
    let v = rng.vec(7 * 8, -1.0, 1.0);
    let go = rng.vec(2 * 6 * 8, -1.0, 1.0);
    let (chunk, scale) = (2, 0.7);
    let qs = |q: &[Vec<f64>]| [q[0].clone(), q[1].clone(), q[2].clone()];
    let (dq, dk, dv) = reference::backward([&q[0], &q[1], &q[2]], &k, &v, &go, &d, chunk, scale);
    for b in 0..3 {
        let c = check_vjp(
            |x| {
                let mut all = qs(&q);
                all[b] = x.to_vec();
                reference::forward([&all[0], &all[1], &all[2]], &k, &v, &d, chunk, scale).output
            },
            &q[b],
            &go,
            &dq[b],
        );
        assert!(c.passed, "dq[{b}]: {c}");
    }
    let fwd = |k: &[f64], v: &[f64]| {
        reference::forward([&q[0], &q[1], &q[2]], k, v, &d, chunk, scale).output
    };
    let c = check_vjp(|x| fwd(x, &v), &k, &go, &dk);
    assert!(c.passed, "dk: {c}");
    let c = check_vjp(|x| fwd(&k, x), &v, &go, &dv);
    assert!(c.passed, "dv: {c}");
}

#[test]
fn reference_partitions_split_the_causal_keys() {
    // Position 9 with chunks of 4: keys 8, 9 intra; 4..=7 successive; 0..=3 inter; 10 hidden.
    let got: Vec<Option<usize>> = (0..11).map(|j| reference::branch(9, j, 4)).collect();
    let mut want = vec![Some(2); 4];
    want.extend([Some(1); 4]);
    want.extend([Some(0), Some(0), None]);
    assert_eq!(got, want);
}

#[test]
fn positions_follow_the_chunk_layout() {
    let p = dual_chunk_positions(11, 6, 2).unwrap();
    assert_eq!(p.chunk_len, 4);
    let within: Vec<i32> = (0..11).map(|t| t % 4).collect();
    assert_eq!(p.key, within);
    assert_eq!(p.intra, within);
    // Successive-chunk queries one chunk further, capped at the chunk size.
    let succ: Vec<i32> = within.iter().map(|t| (t + 4).min(6)).collect();
    assert_eq!(p.successive, succ);
    assert_eq!(p.inter, vec![6; 11]);
    for (size, window) in [(4, 4), (4, 9)] {
        match dual_chunk_positions(3, size, window) {
            Err(Error::InvalidValue { .. }) => {}
            other => panic!("window {window}: {other:?}"),
        }
    }
}

#[test]
fn bad_inputs_give_typed_errors() {
    let e = engine();
    let z = |shape: &[usize], dtype| Tensor::zeros(e, shape, dtype).unwrap();
    let q = z(&[1, 2, 8, 16], DType::F32);
    let k = z(&[1, 1, 8, 16], DType::F32);
    let err = |queries: DualChunkQueries<'_>, k: &Tensor, chunk_len| {
        dual_chunk_attention(queries, k, k, &options(chunk_len)).unwrap_err()
    };
    let all = DualChunkQueries {
        intra: &q,
        successive: &q,
        inter: &q,
    };
    assert!(matches!(err(all, &k, 0), Error::InvalidValue { .. }));
    let long = z(&[1, 2, 9, 16], DType::F32);
    let longer = DualChunkQueries {
        intra: &long,
        successive: &long,
        inter: &long,
    };
    assert!(matches!(err(longer, &k, 4), Error::InvalidValue { .. }));
    let other_shape = DualChunkQueries {
        successive: &long,
        ..all
    };
    assert!(matches!(
        err(other_shape, &k, 4),
        Error::ShapeMismatch { .. }
    ));
    let half = z(&[1, 2, 8, 16], DType::BF16);
    let other_dtype = DualChunkQueries {
        inter: &half,
        ..all
    };
    assert!(matches!(
        err(other_dtype, &k, 4),
        Error::UnsupportedDType { .. }
    ));
    // Attention's own checks: a key of another head dim.
    let k12 = z(&[1, 1, 8, 24], DType::F32);
    assert!(matches!(err(all, &k12, 4), Error::ShapeMismatch { .. }));
    // The backward's cotangent shape.
    let (_, saved) = dual_chunk_attention(all, &k, &k, &options(4)).unwrap();
    assert!(matches!(
        dual_chunk_attention_backward(&saved, &k).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
}

#[test]
fn backward_as_is_the_f32_gradient_rounded_once() {
    for dtype in [DType::F16, DType::BF16] {
        let x = inputs(&dims(1, 4, 2, 50, 60, 16), dtype, 11);
        let t = &x.tensors;
        let (_, saved) = dual_chunk_attention(queries(t), &t[3], &t[4], &options(9)).unwrap();
        let f32 = dual_chunk_attention_backward(&saved, &t[5]).unwrap();
        let got = dual_chunk_attention_backward_as(&saved, &t[5], dtype).unwrap();
        for (name, g, w) in [
            ("d intra", &got.intra, &f32.intra),
            ("d successive", &got.successive, &f32.successive),
            ("d inter", &got.inter, &f32.inter),
            ("dk", &got.key, &f32.key),
            ("dv", &got.value, &f32.value),
        ] {
            assert_eq!((g.dtype(), g.shape()), (dtype, w.shape()), "{name}");
            let want = wgrad::cast::cast(w, dtype).unwrap();
            assert!(
                common::value_bits(g) == common::value_bits(&want),
                "{dtype} {name}"
            );
        }
    }
    let x = inputs(&dims(1, 1, 1, 4, 4, 8), DType::F32, 12);
    let t = &x.tensors;
    let (_, saved) = dual_chunk_attention(queries(t), &t[3], &t[4], &options(2)).unwrap();
    assert!(matches!(
        dual_chunk_attention_backward_as(&saved, &t[5], DType::I32).unwrap_err(),
        Error::UnsupportedDType { .. }
    ));
}

#[test]
fn scratch_stays_within_the_workspace_query() {
    // What the engine grows by beyond the results stays within `dual_chunk_workspace_bytes`
    // (each buffer rounded up to the pool's size class, less than a quarter more; launch
    // parameters add a few hundred bytes a launch), and a workspace bound below it is refused
    // before anything runs.
    let d = dims(2, 4, 2, 70, 90, 16);
    let scratch = dual_chunk_workspace_bytes(2, 4, 2, 70, 90, 16);
    let e = Engine::builder().build().unwrap();
    let mut rng = Rng::new(13);
    let q_shape = [2, 4, 70, 16];
    let k_shape = [2, 2, 90, 16];
    let mut up = |shape: &[usize]| {
        let n = shape.iter().product();
        common::tensor_from_f64(&e, &rng.vec(n, -1.0, 1.0), shape, DType::F32)
    };
    let t: Vec<Tensor> = [q_shape, q_shape, q_shape, k_shape, k_shape, q_shape]
        .iter()
        .map(|s| up(s))
        .collect();
    let q_bytes = (d.batch * d.q_heads * d.q_len * d.head_dim * 4) as u64;
    let k_bytes = (d.batch * d.kv_heads * d.k_len * d.head_dim * 4) as u64;
    let stats = (d.batch * d.q_heads * d.q_len * 4) as u64;
    let slack = 8192;
    e.synchronize().unwrap();
    let before = e.memory().live_bytes;
    e.reset_peak();
    let (out, saved) = dual_chunk_attention(queries(&t), &t[3], &t[4], &options(20)).unwrap();
    e.synchronize().unwrap();
    // The F32 output is the saved output; two row statistics are kept.
    let kept = q_bytes + 2 * stats;
    let grown = e.memory().peak_bytes - before;
    assert!(
        grown <= (kept + scratch) * 5 / 4 + slack,
        "forward grew {grown}"
    );
    let before = e.memory().live_bytes;
    e.reset_peak();
    let g = dual_chunk_attention_backward(&saved, &t[5]).unwrap();
    e.synchronize().unwrap();
    let grads = 3 * q_bytes + 2 * k_bytes;
    let grown = e.memory().peak_bytes - before;
    assert!(
        grown <= (grads + scratch) * 5 / 4 + slack,
        "backward grew {grown}"
    );
    drop((out, g));
    // Below the query: refused.
    let small = Engine::builder()
        .workspace_bound(scratch - 1)
        .build()
        .unwrap();
    let mut rng = Rng::new(14);
    let t: Vec<Tensor> = [q_shape, q_shape, q_shape, k_shape, k_shape]
        .iter()
        .map(|s| {
            let n = s.iter().product();
            common::tensor_from_f64(&small, &rng.vec(n, -1.0, 1.0), s, DType::F32)
        })
        .collect();
    match dual_chunk_attention(queries(&t), &t[3], &t[4], &options(20)) {
        Err(Error::WorkspaceExceeded { needed, bound, .. }) => {
            assert_eq!((needed, bound), (scratch, scratch - 1));
        }
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
}
