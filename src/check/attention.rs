//! Checks of the attention family (`crate::attention`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "attention",
            kernels: &["attention"],
            run: |e| check_attention(e, false),
        },
        OperatorCheck {
            name: "attention_backward_as",
            kernels: &["attention", "cast"],
            run: |e| check_attention(e, true),
        },
        OperatorCheck {
            name: "attention_stored_scores",
            kernels: &["attention"],
            run: check_attention_stored_scores,
        },
        OperatorCheck {
            name: "neighborhood_attention",
            kernels: &["attention"],
            run: check_neighborhood_attention,
        },
        OperatorCheck {
            name: "dual_chunk_attention",
            kernels: &["attention"],
            run: check_dual_chunk_attention,
        },
        OperatorCheck {
            name: "attention_graph",
            kernels: &["attention"],
            run: check_attention_graph,
        },
    ]
}

/// An attention graph (`crate::graph`) of two chained nodes sharing the key,
/// `y1 = attention(q, k, v1)` causal and `y2 = attention(y1, k, v2)`, run with a tape and
/// backward from y2's cotangent, against the f64 references composed: y2 and the gradients of
/// q, k (both nodes' shares), v1, v2.
fn check_attention_graph(engine: &Engine) -> Result<Vec<Case>> {
    use crate::graph::GraphBuilder;
    use reference::attention::{Dims, Visibility};
    let dims = Dims {
        batch: 2,
        q_heads: 2,
        kv_heads: 2,
        q_len: 19,
        k_len: 19,
        head_dim: 16,
    };
    let shape = [2, 2, 19, 16];
    let mut b = GraphBuilder::new();
    let [q, k, v1, v2] = ["q", "k", "v1", "v2"].map(|n| b.input(n));
    let causal = crate::attention::AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let y1 = b.attention(q, k, v1, causal);
    let y2 = b.attention(y1, k, v2, Default::default());
    let graph = b.build(&[y2])?;
    let mut rng = Rng::new(6);
    let n = shape.iter().product();
    let mut x = Vec::new();
    let mut xs = Vec::new();
    for _ in 0..5 {
        let (t, s) = tensor_from_f64(engine, &rng.vec(n, -1.0, 1.0), &shape, DType::F32)?;
        x.push(t);
        xs.push(s);
    }
    let (outs, tape) = graph.forward_with_tape(&[&x[0], &x[1], &x[2], &x[3]])?;
    let grads = graph.backward(&tape, &[Some(&x[4])])?;
    let vis1 = Visibility {
        causal: true,
        ..Visibility::full(&dims)
    };
    let vis2 = Visibility::full(&dims);
    let att = &reference::attention::forward;
    let y1 = att(&xs[0], &xs[1], &xs[2], &dims, &vis1).output;
    let y2 = att(&y1, &xs[1], &xs[3], &dims, &vis2).output;
    let (dy1, dk2, dv2) = reference::attention::backward(&y1, &xs[1], &xs[3], &xs[4], &dims, &vis2);
    let (dq, dk1, dv1) = reference::attention::backward(&xs[0], &xs[1], &xs[2], &dy1, &dims, &vis1);
    let dk: Vec<f64> = dk1.iter().zip(&dk2).map(|(a, b)| a + b).collect();
    let tol = Tolerance::for_dtype(DType::F32);
    let mut cases = Vec::new();
    for (name, got, want) in [
        ("y2", &outs[0], &y2),
        ("dq", &grads[0], &dq),
        ("dk", &grads[1], &dk),
        ("dv1", &grads[2], &dv1),
        ("dv2", &grads[3], &dv2),
    ] {
        let label = format!("{name} f32 {shape:?} two chained nodes, shared key");
        cases.push(case(label, &got.to_f64()?, want, tol));
    }
    Ok(cases)
}

/// Dual chunk attention (`crate::dual_chunk`) forward (output, saved F32 output) and backward
/// (the three query gradients, dk, dv) against the f64 reference in every storage dtype:
/// grouped heads (4 query heads on 2), fewer queries than keys (21 of 37), chunks of 6.
fn check_dual_chunk_attention(engine: &Engine) -> Result<Vec<Case>> {
    use crate::dual_chunk::{
        DualChunkOptions, DualChunkQueries, dual_chunk_attention, dual_chunk_attention_backward,
    };
    use reference::attention::Dims;
    let dims = Dims {
        batch: 2,
        q_heads: 4,
        kv_heads: 2,
        q_len: 21,
        k_len: 37,
        head_dim: 16,
    };
    let chunk_len = 6;
    let q_shape = [dims.batch, dims.q_heads, dims.q_len, dims.head_dim];
    let k_shape = [dims.batch, dims.kv_heads, dims.k_len, dims.head_dim];
    let scale = 1.0 / (dims.head_dim as f64).sqrt();
    let options = DualChunkOptions {
        chunk_len,
        scale: Some(scale),
        layout: Default::default(),
    };
    let mut rng = Rng::new(5);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let mut upload = |shape: &[usize]| {
            let n = shape.iter().product();
            tensor_from_f64(engine, &rng.vec(n, -1.5, 1.5), shape, dtype)
        };
        let (q0, qs0) = upload(&q_shape)?;
        let (q1, qs1) = upload(&q_shape)?;
        let (q2, qs2) = upload(&q_shape)?;
        let (k, ks) = upload(&k_shape)?;
        let (v, vs) = upload(&k_shape)?;
        let (go, gos) = upload(&q_shape)?;
        let queries = DualChunkQueries {
            intra: &q0,
            successive: &q1,
            inter: &q2,
        };
        let (out, saved) = dual_chunk_attention(queries, &k, &v, &options)?;
        let grads = dual_chunk_attention_backward(&saved, &go)?;
        let qs = [&qs0[..], &qs1[..], &qs2[..]];
        let want = reference::dual_chunk::forward(qs, &ks, &vs, &dims, chunk_len, scale);
        let (dq, dk, dv) =
            reference::dual_chunk::backward(qs, &ks, &vs, &gos, &dims, chunk_len, scale);
        let label = |what: &str| format!("{what} {dtype} {q_shape:?} kv {k_shape:?} chunk 6");
        let f32_tol = Tolerance::for_dtype(DType::F32);
        output_cases(&mut cases, &label, [&out, saved.output_f32()], &want.output)?;
        let [d0, d1, d2] = dq;
        for (name, got, want) in [
            ("d intra", &grads.intra, d0),
            ("d successive", &grads.successive, d1),
            ("d inter", &grads.inter, d2),
            ("dk", &grads.key, dk),
            ("dv", &grads.value, dv),
        ] {
            cases.push(case(label(name), &got.to_f64()?, &want, f32_tol));
        }
    }
    Ok(cases)
}

/// The cases of an attention output (at its dtype's tolerance) and of the saved unrounded F32
/// output, against the reference output.
fn output_cases(
    cases: &mut Vec<Case>,
    label: &dyn Fn(&str) -> String,
    [out, out_f32]: [&crate::Tensor; 2],
    want: &[f64],
) -> Result<()> {
    let tol = Tolerance::for_dtype(out.dtype());
    cases.push(case(label("output"), &out.to_f64()?, want, tol));
    let f32_tol = Tolerance::for_dtype(DType::F32);
    cases.push(case(label("output_f32"), &out_f32.to_f64()?, want, f32_tol));
    Ok(())
}

/// The backward with the stored score-gradient schedule (`attention_backward_with`,
/// `BackwardSchedule::StoredScores`, one (batch, kv head) group a slice) against the f64
/// reference, as in `check_attention`.
fn check_attention_stored_scores(engine: &Engine) -> Result<Vec<Case>> {
    check_attention_with(engine, false, true, false)
}

/// Neighborhood attention (`AttentionOptions::neighborhood(7, 2)`: keys within 6 positions
/// either side at even distances) on 21 queries and keys against the f64 reference, as in
/// `check_attention`.
fn check_neighborhood_attention(engine: &Engine) -> Result<Vec<Case>> {
    check_attention_with(engine, false, false, true)
}

/// Attention forward (output, saved F32 output) and backward (dq, dk, dv) against the f64
/// reference in every storage dtype: grouped heads (4 query heads on 2), causal with the
/// default offset and query_len < key_len, a ragged length, head dim 40. `stored`: the
/// gradients come from `attention_backward_as` in the inputs' dtype and are compared at that
/// dtype's tolerance.
fn check_attention(engine: &Engine, stored: bool) -> Result<Vec<Case>> {
    check_attention_with(engine, stored, false, false)
}

/// [`check_attention`], the backward under the stored score-gradient schedule when
/// `stored_scores`, and a dilated neighborhood on 21 queries instead of causal when
/// `neighborhood`.
fn check_attention_with(
    engine: &Engine,
    stored: bool,
    stored_scores: bool,
    neighborhood: bool,
) -> Result<Vec<Case>> {
    use crate::attention::{
        AttentionOptions, BackwardSchedule, attention_backward_with, attention_forward,
        stored_scores_bytes_per_group,
    };
    use reference::attention::{Dims, Visibility};
    let dims = Dims {
        batch: 2,
        q_heads: 4,
        kv_heads: 2,
        q_len: if neighborhood { 21 } else { 13 },
        k_len: 21,
        head_dim: 40,
    };
    let q_shape = [dims.batch, dims.q_heads, dims.q_len, dims.head_dim];
    let k_shape = [dims.batch, dims.kv_heads, dims.k_len, dims.head_dim];
    let q_len: usize = q_shape.iter().product();
    let k_len: usize = k_shape.iter().product();
    let (vis, options) = if neighborhood {
        let vis = Visibility {
            window_left: Some(6),
            window_right: Some(6),
            dilation: 2,
            ..Visibility::full(&dims)
        };
        (vis, AttentionOptions::neighborhood(7, 2)?)
    } else {
        let vis = Visibility {
            causal: true,
            ..Visibility::full(&dims)
        };
        let options = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        (vis, options)
    };
    let mut rng = Rng::new(4);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let (q, qs) = tensor_from_f64(engine, &rng.vec(q_len, -1.0, 1.0), &q_shape, dtype)?;
        let (k, ks) = tensor_from_f64(engine, &rng.vec(k_len, -1.0, 1.0), &k_shape, dtype)?;
        let (v, vs) = tensor_from_f64(engine, &rng.vec(k_len, -1.0, 1.0), &k_shape, dtype)?;
        let (go, gos) = tensor_from_f64(engine, &rng.vec(q_len, -1.0, 1.0), &q_shape, dtype)?;
        let (out, saved) = attention_forward(&q, &k, &v, &options)?;
        let grad_dtype = if stored { dtype } else { DType::F32 };
        let schedule = if stored_scores {
            BackwardSchedule::StoredScores {
                budget: stored_scores_bytes_per_group(
                    dims.q_heads,
                    dims.kv_heads,
                    dims.q_len,
                    dims.k_len,
                ),
            }
        } else {
            BackwardSchedule::Recompute
        };
        let grads = attention_backward_with(&saved, &go, grad_dtype, schedule)?;
        let want = reference::attention::forward(&qs, &ks, &vs, &dims, &vis);
        let (dq, dk, dv) = reference::attention::backward(&qs, &ks, &vs, &gos, &dims, &vis);
        let visibility = if neighborhood {
            "neighborhood 7, dilation 2"
        } else {
            "causal"
        };
        let label = |what: &str| format!("{what} {dtype} {q_shape:?} kv {k_shape:?} {visibility}");
        output_cases(&mut cases, &label, [&out, saved.output_f32()], &want.output)?;
        let grad_tol = Tolerance::for_dtype(grad_dtype);
        for (name, got, want) in [
            ("dq", &grads.query, dq),
            ("dk", &grads.key, dk),
            ("dv", &grads.value, dv),
        ] {
            let want = if stored {
                crate::gradcheck::stored_values(&want, grad_dtype)
            } else {
                want
            };
            cases.push(case(label(name), &got.to_f64()?, &want, grad_tol));
        }
    }
    Ok(cases)
}
