//! Attention graphs (`wgrad::graph`): a graph's forward and backward give the bits of the same
//! operators composed by hand (one node, chained nodes sharing inputs, a gated delta state
//! edge, dual chunk attention), a chain of attention nodes matches the f64 references composed,
//! repeated outputs and shared inputs accumulate, absent cotangents are zeros, disconnected
//! inputs get zeros, 16-bit cotangents are taken, neither inputs nor cotangents are written,
//! reruns are bit-identical, and every documented bad input gives its typed error.

mod common;

use common::{Rng, engine, value_bits};
use wgrad::attention::{AttentionOptions, attention_backward, attention_forward};
use wgrad::dual_chunk::{
    DualChunkOptions, DualChunkQueries, dual_chunk_attention, dual_chunk_attention_backward,
};
use wgrad::gated_delta::{GatedDeltaOptions, gated_delta_backward, gated_delta_forward};
use wgrad::gradcheck::{Tolerance, compare, tensor_from_f64};
use wgrad::graph::{GraphBuilder, Value};
use wgrad::reference::attention::{self as reference, Dims, Visibility};
use wgrad::{DType, Error, Tensor};

fn random(shape: &[usize], seed: u64) -> (Tensor, Vec<f64>) {
    let n = shape.iter().product();
    let mut rng = Rng::new(seed);
    tensor_from_f64(engine(), &rng.vec(n, -1.0, 1.0), shape, DType::F32).unwrap()
}

fn t(shape: &[usize], seed: u64) -> Tensor {
    random(shape, seed).0
}

fn assert_bits(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    assert!(value_bits(got) == value_bits(want), "{what}");
}

fn causal() -> AttentionOptions {
    AttentionOptions {
        causal: true,
        ..Default::default()
    }
}

#[test]
fn one_attention_node_is_attention() {
    let mut b = GraphBuilder::new();
    let [q, k, v] = ["q", "k", "v"].map(|n| b.input(n));
    let out = b.attention(q, k, v, causal());
    let graph = b.build(&[out]).unwrap();
    assert_eq!(graph.input_names(), ["q", "k", "v"]);
    let (qt, kt, vt) = (
        t(&[1, 4, 30, 16], 1),
        t(&[1, 2, 40, 16], 2),
        t(&[1, 2, 40, 16], 3),
    );
    let go = t(&[1, 4, 30, 16], 4);
    let (outs, tape) = graph.forward_with_tape(&[&qt, &kt, &vt]).unwrap();
    let grads = graph.backward(&tape, &[Some(&go)]).unwrap();
    let (want, saved) = attention_forward(&qt, &kt, &vt, &causal()).unwrap();
    let wg = attention_backward(&saved, &go).unwrap();
    assert_bits("output", &outs[0], &want);
    assert_bits(
        "forward without tape",
        &graph.forward(&[&qt, &kt, &vt]).unwrap()[0],
        &want,
    );
    for (name, g, w) in [
        ("dq", &grads[0], &wg.query),
        ("dk", &grads[1], &wg.key),
        ("dv", &grads[2], &wg.value),
    ] {
        assert_bits(name, g, w);
    }
}

/// Two attention nodes: y1 = att(q, k, v1), y2 = att(y1, k, v2), both outputs; k shared.
fn chain() -> (wgrad::graph::AttentionGraph, [Value; 2]) {
    let mut b = GraphBuilder::new();
    let [q, k, v1, v2] = ["q", "k", "v1", "v2"].map(|n| b.input(n));
    let y1 = b.attention(q, k, v1, causal());
    let y2 = b.attention(y1, k, v2, AttentionOptions::default());
    (b.build(&[y2, y1]).unwrap(), [y1, y2])
}

#[test]
fn chained_nodes_sharing_a_key_give_the_composed_bits() {
    let (graph, _) = chain();
    let shape = [2, 2, 20, 8];
    let x: Vec<Tensor> = (0..4).map(|s| t(&shape, 10 + s)).collect();
    let (d2, d1) = (t(&shape, 20), t(&shape, 21));
    let (outs, tape) = graph
        .forward_with_tape(&[&x[0], &x[1], &x[2], &x[3]])
        .unwrap();
    let grads = graph.backward(&tape, &[Some(&d2), Some(&d1)]).unwrap();
    // By hand: the second node's backward first; y1's cotangent is d1 plus its share.
    let (y1, s1) = attention_forward(&x[0], &x[1], &x[2], &causal()).unwrap();
    let (y2, s2) = attention_forward(&y1, &x[1], &x[3], &AttentionOptions::default()).unwrap();
    assert_bits("y2", &outs[0], &y2);
    assert_bits("y1", &outs[1], &y1);
    let g2 = attention_backward(&s2, &d2).unwrap();
    let dy1: Vec<f32> = g2
        .query
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(d1.to_vec::<f32>().unwrap())
        .map(|(a, b)| b + a)
        .collect();
    let dy1 = Tensor::from_slice(engine(), &dy1, &shape).unwrap();
    let g1 = attention_backward(&s1, &dy1).unwrap();
    let dk: Vec<f32> = g2
        .key
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(g1.key.to_vec::<f32>().unwrap())
        .map(|(a, b)| a + b)
        .collect();
    assert_bits("dq", &grads[0], &g1.query);
    assert_eq!(grads[1].to_vec::<f32>().unwrap(), dk, "dk");
    assert_bits("dv1", &grads[2], &g1.value);
    assert_bits("dv2", &grads[3], &g2.value);
    // Reruns: the same bits.
    let again = graph.backward(&tape, &[Some(&d2), Some(&d1)]).unwrap();
    for (g, a) in grads.iter().zip(&again) {
        assert_bits("rerun", a, g);
    }
}

#[test]
fn a_chain_matches_the_composed_references() {
    let (graph, _) = chain();
    let d = Dims {
        batch: 1,
        q_heads: 2,
        kv_heads: 2,
        q_len: 9,
        k_len: 9,
        head_dim: 8,
    };
    let shape = [1, 2, 9, 8];
    let (x, xs): (Vec<Tensor>, Vec<Vec<f64>>) = (0..4).map(|s| random(&shape, 30 + s)).unzip();
    let (d2, d2s) = random(&shape, 40);
    let (outs, tape) = graph
        .forward_with_tape(&[&x[0], &x[1], &x[2], &x[3]])
        .unwrap();
    // Only y2 has a cotangent.
    let grads = graph.backward(&tape, &[Some(&d2), None]).unwrap();
    let vis1 = Visibility {
        causal: true,
        ..Visibility::full(&d)
    };
    let vis2 = Visibility::full(&d);
    let y1 = reference::forward(&xs[0], &xs[1], &xs[2], &d, &vis1).output;
    let y2 = reference::forward(&y1, &xs[1], &xs[3], &d, &vis2).output;
    let (dy1, dk2, dv2) = reference::backward(&y1, &xs[1], &xs[3], &d2s, &d, &vis2);
    let (dq, dk1, dv1) = reference::backward(&xs[0], &xs[1], &xs[2], &dy1, &d, &vis1);
    let dk: Vec<f64> = dk1.iter().zip(&dk2).map(|(a, b)| a + b).collect();
    let tol = Tolerance::for_dtype(DType::F32);
    for (name, got, want) in [
        ("y2", &outs[0], &y2),
        ("dq", &grads[0], &dq),
        ("dk", &grads[1], &dk),
        ("dv1", &grads[2], &dv1),
        ("dv2", &grads[3], &dv2),
    ] {
        let c = compare(&got.to_f64().unwrap(), want, tol);
        assert!(c.passed, "{name}: {c}");
    }
}

#[test]
fn a_gated_delta_state_edge_gives_the_composed_bits() {
    // Two recurrences over two segments of a sequence: the first's final state is the second's
    // initial state; both share k and the log decay. Outputs: both outputs and the last state.
    let (bt, h, kd) = ([1, 6, 2, 16], 2, 16);
    let scalar = [1, 6, h];
    let mut b = GraphBuilder::new();
    let names = ["q1", "q2", "k", "v1", "v2", "beta", "decay", "s0"];
    let [q1, q2, k, v1, v2, beta, decay, s0] = names.map(|n| b.input(n));
    let opts = GatedDeltaOptions::default();
    let (o1, s1) = b.gated_delta(q1, k, v1, beta, decay, Some(s0), opts);
    let (o2, s2) = b.gated_delta(q2, k, v2, beta, decay, Some(s1), opts);
    let graph = b.build(&[o1, o2, s2]).unwrap();
    let x = [
        t(&bt, 50),
        t(&bt, 51),
        t(&bt, 52),
        t(&bt, 53),
        t(&bt, 54),
        t(&scalar, 55),
        t(&scalar, 56),
        t(&[1, h, kd, kd], 57),
    ];
    let refs: Vec<&Tensor> = x.iter().collect();
    let (d_o1, d_o2, d_s2) = (
        t(&[1, 6, h, kd], 60),
        t(&[1, 6, h, kd], 61),
        t(&[1, h, kd, kd], 62),
    );
    let (outs, tape) = graph.forward_with_tape(&refs).unwrap();
    let grads = graph
        .backward(&tape, &[Some(&d_o1), Some(&d_o2), Some(&d_s2)])
        .unwrap();
    let (f1, sv1) =
        gated_delta_forward(&x[0], &x[2], &x[3], &x[5], &x[6], Some(&x[7]), &opts).unwrap();
    let (f2, sv2) = gated_delta_forward(
        &x[1],
        &x[2],
        &x[4],
        &x[5],
        &x[6],
        Some(&f1.final_state),
        &opts,
    )
    .unwrap();
    assert_bits("o1", &outs[0], &f1.output);
    assert_bits("o2", &outs[1], &f2.output);
    assert_bits("s2", &outs[2], &f2.final_state);
    let g2 = gated_delta_backward(&sv2, Some(&d_o2), Some(&d_s2)).unwrap();
    let g1 = gated_delta_backward(&sv1, Some(&d_o1), Some(&g2.initial_state)).unwrap();
    let sum = |a: &Tensor, b: &Tensor| -> Vec<f32> {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        a.iter().zip(b).map(|(x, y)| x + y).collect()
    };
    assert_bits("dq1", &grads[0], &g1.query);
    assert_bits("dq2", &grads[1], &g2.query);
    // Shared inputs: the second node's contribution arrives first (a two-term sum either way).
    assert_eq!(
        grads[2].to_vec::<f32>().unwrap(),
        sum(&g2.key, &g1.key),
        "dk"
    );
    assert_bits("dv1", &grads[3], &g1.value);
    assert_bits("dv2", &grads[4], &g2.value);
    assert_eq!(
        grads[5].to_vec::<f32>().unwrap(),
        sum(&g2.beta, &g1.beta),
        "dbeta"
    );
    assert_eq!(
        grads[6].to_vec::<f32>().unwrap(),
        sum(&g2.log_decay, &g1.log_decay),
        "dlog_decay"
    );
    assert_bits("ds0", &grads[7], &g1.initial_state);
}

#[test]
fn a_dual_chunk_node_is_dual_chunk_attention() {
    let mut b = GraphBuilder::new();
    let [qa, qb, qc, k, v] = ["intra", "successive", "inter", "k", "v"].map(|n| b.input(n));
    let options = DualChunkOptions {
        chunk_len: 7,
        scale: None,
        layout: Default::default(),
    };
    let out = b.dual_chunk_attention([qa, qb, qc], k, v, options);
    let graph = b.build(&[out]).unwrap();
    let x: Vec<Tensor> = (0..5).map(|s| t(&[1, 2, 33, 8], 70 + s)).collect();
    let go = t(&[1, 2, 33, 8], 80);
    let (outs, tape) = graph
        .forward_with_tape(&x.iter().collect::<Vec<_>>())
        .unwrap();
    let grads = graph.backward(&tape, &[Some(&go)]).unwrap();
    let queries = DualChunkQueries {
        intra: &x[0],
        successive: &x[1],
        inter: &x[2],
    };
    let (want, saved) = dual_chunk_attention(queries, &x[3], &x[4], &options).unwrap();
    let g = dual_chunk_attention_backward(&saved, &go).unwrap();
    assert_bits("output", &outs[0], &want);
    for (i, w) in [&g.intra, &g.successive, &g.inter, &g.key, &g.value]
        .iter()
        .enumerate()
    {
        assert_bits(&format!("gradient {i}"), &grads[i], w);
    }
}

#[test]
fn repeated_outputs_absent_cotangents_and_disconnected_inputs() {
    // Outputs: y listed twice, then z; an input nothing reads.
    let mut b = GraphBuilder::new();
    let [q, k, v, _unused] = ["q", "k", "v", "unused"].map(|n| b.input(n));
    let y = b.attention(q, k, v, AttentionOptions::default());
    let z = b.attention(q, k, v, causal());
    let graph = b.build(&[y, y, z]).unwrap();
    let shape = [1, 1, 12, 8];
    let x: Vec<Tensor> = (0..3).map(|s| t(&shape, 90 + s)).collect();
    let free = t(&[3, 5], 93);
    let (c1, c2) = (t(&shape, 94), t(&shape, 95));
    let (outs, tape) = graph
        .forward_with_tape(&[&x[0], &x[1], &x[2], &free])
        .unwrap();
    assert_bits("a value listed twice is one tensor", &outs[0], &outs[1]);
    let (before1, before2) = (value_bits(&c1), value_bits(&c2));
    let inputs_before: Vec<_> = x.iter().map(value_bits).collect();
    // A 16-bit cotangent is widened; z has none.
    let c2_16 = wgrad::cast::cast(&c2, DType::BF16).unwrap();
    let grads = graph
        .backward(&tape, &[Some(&c1), Some(&c2_16), None])
        .unwrap();
    assert!(value_bits(&c1) == before1 && value_bits(&c2) == before2);
    let after: Vec<_> = x.iter().map(value_bits).collect();
    assert!(after == inputs_before, "inputs unchanged");
    // Equals one output with the summed cotangent.
    let widened = wgrad::cast::cast(&c2_16, DType::F32).unwrap();
    let sum: Vec<f32> = c1
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(widened.to_vec::<f32>().unwrap())
        .map(|(a, b)| a + b)
        .collect();
    let sum = Tensor::from_slice(engine(), &sum, &shape).unwrap();
    let (_, saved) = attention_forward(&x[0], &x[1], &x[2], &AttentionOptions::default()).unwrap();
    let want = attention_backward(&saved, &sum).unwrap();
    assert_bits("dq", &grads[0], &want.query);
    assert_bits("dk", &grads[1], &want.key);
    assert_bits("dv", &grads[2], &want.value);
    assert_eq!(
        (grads[3].shape(), grads[3].dtype()),
        (&[3, 5][..], DType::F32)
    );
    assert!(grads[3].to_vec::<f32>().unwrap().iter().all(|&g| g == 0.0));
    // No cotangent at all: zero gradients.
    let zero = graph.backward(&tape, &[None, None, None]).unwrap();
    assert!(
        zero.iter()
            .all(|g| g.to_f64().unwrap().iter().all(|&x| x == 0.0))
    );
    // An input listed as an output gets its cotangent (a copy).
    let mut b = GraphBuilder::new();
    let a = b.input("a");
    let graph = b.build(&[a]).unwrap();
    let (_, tape) = graph.forward_with_tape(&[&free]).unwrap();
    let c = t(&[3, 5], 96);
    let g = graph.backward(&tape, &[Some(&c)]).unwrap();
    assert_bits("identity", &g[0], &c);
    assert!(!g[0].buffer().eq(c.buffer()), "a copy");
}

#[test]
fn bad_inputs_give_typed_errors() {
    let invalid = |r: Result<wgrad::graph::AttentionGraph, Error>| {
        assert!(matches!(r.unwrap_err(), Error::InvalidValue { .. }));
    };
    invalid(GraphBuilder::new().build(&[]));
    // A value of another builder.
    let mut other = GraphBuilder::new();
    let [a, b2, c] = ["a", "b", "c"].map(|n| other.input(n));
    let foreign = other.attention(a, b2, c, AttentionOptions::default());
    let mut b = GraphBuilder::new();
    let q = b.input("q");
    invalid(b.clone().build(&[foreign]));
    let y = b.attention(q, q, foreign, AttentionOptions::default());
    invalid(b.clone().build(&[y]));
    // An input after a node.
    let mut b = GraphBuilder::new();
    let q = b.input("q");
    let y = b.attention(q, q, q, AttentionOptions::default());
    b.input("late");
    invalid(b.build(&[y]));

    let mut b = GraphBuilder::new();
    let q = b.input("q");
    let y = b.attention(q, q, q, AttentionOptions::default());
    let graph = b.build(&[y]).unwrap();
    let x = t(&[1, 1, 4, 8], 100);
    assert!(matches!(
        graph.forward(&[]).unwrap_err(),
        Error::InvalidValue { .. }
    ));
    // The node's own errors pass through: a rank-2 query.
    assert!(matches!(
        graph.forward(&[&t(&[4, 8], 101)]).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    let (_, tape) = graph.forward_with_tape(&[&x]).unwrap();
    assert!(matches!(
        graph.backward(&tape, &[]).unwrap_err(),
        Error::InvalidValue { .. }
    ));
    assert!(matches!(
        graph
            .backward(&tape, &[Some(&t(&[1, 1, 5, 8], 102))])
            .unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    let ints = Tensor::zeros(engine(), &[1, 1, 4, 8], DType::I32).unwrap();
    assert!(matches!(
        graph.backward(&tape, &[Some(&ints)]).unwrap_err(),
        Error::UnsupportedDType { .. }
    ));
    // Another graph's tape.
    let (chain, _) = chain();
    let shape = [1, 1, 4, 8];
    let xs: Vec<Tensor> = (0..4).map(|s| t(&shape, 110 + s)).collect();
    let (_, other_tape) = chain
        .forward_with_tape(&xs.iter().collect::<Vec<_>>())
        .unwrap();
    assert!(matches!(
        graph.backward(&other_tape, &[None]).unwrap_err(),
        Error::InvalidValue { .. }
    ));
    // A cotangent of another engine.
    let e2 = common::private_engine();
    let foreign_c = Tensor::zeros(&e2, &[1, 1, 4, 8], DType::F32).unwrap();
    assert!(matches!(
        graph.backward(&tape, &[Some(&foreign_c)]).unwrap_err(),
        Error::EngineMismatch { .. }
    ));
}
