//! Gated delta recurrences (`wgrad::gated_delta`) against the f64 reference of
//! `wgrad::reference::gated_delta`: forward (output, final state) and all six gradients, for
//! F32/F16/BF16 storage of q, k, v; head sizes 16/32/64/128 (and unequal K, V); scalar and
//! per-channel decay; T with partial checkpoint segments; head broadcast (v_repeat 1, 2, 3)
//! with strided q/k/v views into one fused projection; adversarial gates; chaining through
//! the initial state; finite differences of the reference backward; bit-identical reruns;
//! every documented bad input's typed error.
//!
//! Tolerance: `Tolerance::for_dtype` of the compared tensor (the output in v's dtype, the
//! state and every gradient F32), unscaled. The references take the values actually stored.

mod common;

use common::{Rng, engine, private_engine};
use wgrad::gated_delta::{
    DeltaAlgorithm, GatedDeltaGradients, GatedDeltaOptions, GatedDeltaShape, SeqView,
    gated_delta_backward, gated_delta_backward_as, gated_delta_forward,
    gated_delta_forward_workspace_bytes, gated_delta_saved_bytes, gated_delta_workspace_bytes,
};
use wgrad::gradcheck::{Tolerance, check_vjp, compare};
use wgrad::reference::gated_delta::{self as reference, Dims};
use wgrad::{DType, Error, Tensor};

#[derive(Debug, Clone, Copy)]
struct Case {
    b: usize,
    t: usize,
    hk: usize,
    hv: usize,
    kd: usize,
    vd: usize,
    per_channel: bool,
    dtype: DType,
    strided: bool,
    initial: bool,
    d_output: bool,
    d_final: bool,
    interval: Option<usize>,
    save_states: bool,
    chunked: bool,
    seed: u64,
}

const BASE: Case = Case {
    b: 1,
    t: 5,
    hk: 1,
    hv: 1,
    kd: 16,
    vd: 16,
    per_channel: false,
    dtype: DType::F32,
    strided: false,
    initial: true,
    d_output: true,
    d_final: true,
    interval: None,
    save_states: false,
    chunked: false,
    seed: 1,
};

/// Host data of one case (f64, as stored), dense.
#[derive(Clone)]
struct Data {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    beta: Vec<f64>,
    g: Vec<f64>,
    init: Option<Vec<f64>>,
    d_out: Option<Vec<f64>>,
    d_final: Option<Vec<f64>>,
}

fn dims(c: &Case) -> Dims {
    Dims {
        batch: c.b,
        time: c.t,
        key_heads: c.hk,
        value_heads: c.hv,
        key_dim: c.kd,
        value_dim: c.vd,
        per_channel: c.per_channel,
        scale: 1.0 / (c.kd as f64).sqrt(),
    }
}

/// Keys with unit L2 norm per (token, head) keep the recurrence contractive for β ∈ [0, 1].
fn unit_rows(rng: &mut Rng, rows: usize, dim: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * dim);
    for _ in 0..rows {
        let r = rng.vec(dim, -1.0, 1.0);
        let n = r.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-3);
        out.extend(r.iter().map(|x| x / n));
    }
    out
}

fn make_data(c: &Case) -> Data {
    let mut rng = Rng::new(c.seed);
    let rows = c.b * c.t;
    let gate_len = rows * c.hv * if c.per_channel { c.kd } else { 1 };
    let state_len = c.b * c.hv * c.kd * c.vd;
    Data {
        q: rng.vec(rows * c.hk * c.kd, -1.0, 1.0),
        k: unit_rows(&mut rng, rows * c.hk, c.kd),
        v: rng.vec(rows * c.hv * c.vd, -1.0, 1.0),
        beta: rng.vec(rows * c.hv, 0.05, 1.0),
        g: rng.vec(gate_len, -0.7, 0.0),
        init: c.initial.then(|| rng.vec(state_len, -0.5, 0.5)),
        d_out: c.d_output.then(|| rng.vec(rows * c.hv * c.vd, -1.0, 1.0)),
        d_final: c.d_final.then(|| rng.vec(state_len, -1.0, 1.0)),
    }
}

/// The GPU tensors of a case: q/k/v either dense or views into one fused `[B, T, W]` buffer
/// (`pad | q | k | v | pad`), so the views have offsets and row strides larger than H·D.
struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    fused: Option<(Tensor, [usize; 3], usize)>,
    beta: Tensor,
    g: Tensor,
    init: Option<Tensor>,
    d_out: Option<Tensor>,
    d_final: Option<Tensor>,
    stored: Data,
}

fn upload(c: &Case, data: Data) -> Inputs {
    let e = engine();
    let rows = c.b * c.t;
    let (qw, vw) = (c.hk * c.kd, c.hv * c.vd);
    let f32t = |v: &[f64], shape: &[usize]| common::tensor_from_f64(e, v, shape, DType::F32);
    let stored = |v: &[f64]| common::stored(v, c.dtype);
    let (q_s, k_s, v_s) = (stored(&data.q), stored(&data.k), stored(&data.v));
    let (q, k, v, fused) = if c.strided {
        let pad = 3;
        let width = pad + 2 * qw + vw + 5;
        let mut flat = vec![0.25; rows * width];
        for r in 0..rows {
            let row = &mut flat[r * width..(r + 1) * width];
            row[pad..pad + qw].copy_from_slice(&data.q[r * qw..(r + 1) * qw]);
            row[pad + qw..pad + 2 * qw].copy_from_slice(&data.k[r * qw..(r + 1) * qw]);
            row[pad + 2 * qw..pad + 2 * qw + vw].copy_from_slice(&data.v[r * vw..(r + 1) * vw]);
        }
        let t = common::tensor_from_f64(e, &flat, &[c.b, c.t, width], c.dtype);
        let dummy = Tensor::zeros(e, &[1], DType::F32).unwrap();
        (
            dummy.clone(),
            dummy.clone(),
            dummy,
            Some((t, [pad, pad + qw, pad + 2 * qw], width)),
        )
    } else {
        (
            common::tensor_from_f64(e, &data.q, &[c.b, c.t, c.hk, c.kd], c.dtype),
            common::tensor_from_f64(e, &data.k, &[c.b, c.t, c.hk, c.kd], c.dtype),
            common::tensor_from_f64(e, &data.v, &[c.b, c.t, c.hv, c.vd], c.dtype),
            None,
        )
    };
    let gate_shape: Vec<usize> = if c.per_channel {
        vec![c.b, c.t, c.hv, c.kd]
    } else {
        vec![c.b, c.t, c.hv]
    };
    let state_shape = [c.b, c.hv, c.kd, c.vd];
    let f32s = |v: &[f64]| common::stored(v, DType::F32);
    Inputs {
        q,
        k,
        v,
        fused,
        beta: f32t(&data.beta, &[c.b, c.t, c.hv]),
        g: f32t(&data.g, &gate_shape),
        init: data.init.as_ref().map(|s| f32t(s, &state_shape)),
        d_out: data
            .d_out
            .as_ref()
            .map(|s| f32t(s, &[c.b, c.t, c.hv, c.vd])),
        d_final: data.d_final.as_ref().map(|s| f32t(s, &state_shape)),
        stored: Data {
            q: q_s,
            k: k_s,
            v: v_s,
            beta: f32s(&data.beta),
            g: f32s(&data.g),
            init: data.init.as_deref().map(f32s),
            d_out: data.d_out.as_deref().map(f32s),
            d_final: data.d_final.as_deref().map(f32s),
        },
    }
}

/// The bits of the six gradients, in the struct's order.
fn gradient_bits(gr: &GatedDeltaGradients) -> Vec<Vec<u32>> {
    [
        &gr.query,
        &gr.key,
        &gr.value,
        &gr.beta,
        &gr.log_decay,
        &gr.initial_state,
    ]
    .map(common::f32_bits)
    .to_vec()
}

fn options(c: &Case) -> GatedDeltaOptions {
    GatedDeltaOptions {
        checkpoint_interval: c.interval,
        save_states: c.save_states,
        algorithm: if c.chunked {
            DeltaAlgorithm::Chunked
        } else {
            DeltaAlgorithm::Recurrent
        },
        ..GatedDeltaOptions::default()
    }
}

/// The case again with the chunked forward, where it applies (scalar decay, no `save_states`).
fn chunked_twin(c: &Case) -> Option<Case> {
    (!c.per_channel && !c.save_states && !c.chunked).then_some(Case {
        chunked: true,
        ..*c
    })
}

struct GpuResult {
    output: Vec<f64>,
    final_state: Vec<f64>,
    grads: [Vec<f64>; 6],
    bits: Vec<Vec<u32>>,
}

fn run_gpu(c: &Case, x: &Inputs) -> GpuResult {
    let opts = options(c);
    let ((out, saved), _) = match &x.fused {
        Some((t, offs, width)) => {
            let q = SeqView::strided(t, [c.b, c.t, c.hk, c.kd], offs[0], *width);
            let k = SeqView::strided(t, [c.b, c.t, c.hk, c.kd], offs[1], *width);
            let v = SeqView::strided(t, [c.b, c.t, c.hv, c.vd], offs[2], *width);
            (
                gated_delta_forward(q, k, v, &x.beta, &x.g, x.init.as_ref(), &opts).unwrap(),
                (),
            )
        }
        None => (
            gated_delta_forward(&x.q, &x.k, &x.v, &x.beta, &x.g, x.init.as_ref(), &opts).unwrap(),
            (),
        ),
    };
    assert_eq!(out.output.dtype(), c.dtype);
    assert_eq!(out.output.shape(), &[c.b, c.t, c.hv, c.vd]);
    assert_eq!(out.final_state.shape(), &[c.b, c.hv, c.kd, c.vd]);
    let g = gated_delta_backward(&saved, x.d_out.as_ref(), x.d_final.as_ref()).unwrap();
    assert_eq!(g.query.shape(), &[c.b, c.t, c.hk, c.kd]);
    assert_eq!(g.key.shape(), &[c.b, c.t, c.hk, c.kd]);
    assert_eq!(g.value.shape(), &[c.b, c.t, c.hv, c.vd]);
    assert_eq!(g.beta.shape(), &[c.b, c.t, c.hv]);
    assert_eq!(g.log_decay.shape(), x.g.shape());
    assert_eq!(g.initial_state.shape(), &[c.b, c.hv, c.kd, c.vd]);
    let grads = [
        &g.query,
        &g.key,
        &g.value,
        &g.beta,
        &g.log_decay,
        &g.initial_state,
    ];
    let mut bits: Vec<Vec<u32>> = grads.iter().map(|t| common::f32_bits(t)).collect();
    bits.push(common::f32_bits(&out.final_state));
    bits.push(
        wgrad::cast::cast(&out.output, DType::F32)
            .map(|t| common::f32_bits(&t))
            .unwrap(),
    );
    GpuResult {
        output: out.output.to_f64().unwrap(),
        final_state: out.final_state.to_f64().unwrap(),
        grads: grads.map(|t| t.to_f64().unwrap()),
        bits,
    }
}

const GRAD_NAMES: [&str; 6] = [
    "d_query",
    "d_key",
    "d_value",
    "d_beta",
    "d_log_decay",
    "d_initial_state",
];

/// Forward and every gradient against the reference, with the recurrent forward and, where it
/// applies, the chunked one; returns the first GPU result.
fn check_case(c: &Case) -> GpuResult {
    let gpu = check_one(c);
    if let Some(twin) = chunked_twin(c) {
        check_one(&twin);
    }
    gpu
}

fn check_one(c: &Case) -> GpuResult {
    let x = upload(c, make_data(c));
    let gpu = run_gpu(c, &x);
    let s = &x.stored;
    let d = dims(c);
    let fwd = reference::forward(&d, &s.q, &s.k, &s.v, &s.beta, &s.g, s.init.as_deref());
    let want_out = common::stored(&fwd.output, c.dtype);
    let cmp = compare(&gpu.output, &want_out, Tolerance::for_dtype(c.dtype));
    assert!(cmp.passed, "{c:?}: output: {cmp}");
    let f32tol = Tolerance::for_dtype(DType::F32);
    let cmp = compare(&gpu.final_state, &fwd.final_state, f32tol);
    assert!(cmp.passed, "{c:?}: final state: {cmp}");
    let r = reference::backward(
        &d,
        &s.q,
        &s.k,
        &s.v,
        &s.beta,
        &s.g,
        s.init.as_deref(),
        s.d_out.as_deref(),
        s.d_final.as_deref(),
    );
    let want = [
        &r.query,
        &r.key,
        &r.value,
        &r.beta,
        &r.log_decay,
        &r.initial_state,
    ];
    for (i, name) in GRAD_NAMES.iter().enumerate() {
        let cmp = compare(&gpu.grads[i], want[i], f32tol);
        assert!(cmp.passed, "{c:?}: {name}: {cmp}");
    }
    gpu
}

#[test]
fn head_sizes_scalar_and_per_channel_decay() {
    // The model head sizes, plus unequal and odd sizes (rows not a multiple of the forward's
    // 8 lanes per column, columns not a multiple of its 32-column slices).
    for (kd, vd, t) in [
        (16, 16, 7),
        (32, 32, 6),
        (64, 64, 5),
        (128, 128, 3),
        (16, 48, 9),
        (20, 24, 5),
        (100, 17, 3),
    ] {
        for per_channel in [false, true] {
            check_case(&Case {
                kd,
                vd,
                t,
                per_channel,
                seed: (kd + vd + t) as u64,
                ..BASE
            });
        }
    }
}

#[test]
fn largest_head_dims() {
    check_case(&Case {
        kd: 256,
        vd: 256,
        t: 2,
        per_channel: true,
        ..BASE
    });
    check_case(&Case {
        kd: 256,
        vd: 32,
        t: 3,
        ..BASE
    });
}

#[test]
fn partial_segments_and_save_states() {
    // T = 23: default C = 5, segments 5+5+5+5+3; explicit intervals 4 (partial 3), 1, and T.
    for (interval, save_states) in [
        (None, false),
        (Some(4), false),
        (Some(23), false),
        (None, true),
    ] {
        check_case(&Case {
            t: 23,
            b: 2,
            interval,
            save_states,
            per_channel: interval == Some(4),
            seed: 11,
            ..BASE
        });
    }
    // With head broadcast (one launch per segment): every state kept, and one long segment
    // (C = T = 23, sub-segments of 5 with a partial last one of 3).
    for (interval, save_states) in [(None, true), (Some(23), false)] {
        check_case(&Case {
            t: 23,
            hv: 2,
            interval,
            save_states,
            seed: 12,
            ..BASE
        });
    }
    // T = 1 (one segment of one token), with and without head broadcast.
    check_case(&Case { t: 1, ..BASE });
    check_case(&Case {
        t: 1,
        hv: 3,
        ..BASE
    });
}

#[test]
fn long_sequence_with_partial_segments() {
    // T = 70: C = 9, eight segments with a partial last one (7 tokens).
    check_case(&Case {
        t: 70,
        seed: 70,
        ..BASE
    });
    // T = 300 (C = 18, a partial last segment of 12) at K = V = 64, three value heads on one
    // key head, per-channel decay: the tolerance holds over long recurrences.
    check_case(&Case {
        t: 300,
        hv: 3,
        kd: 64,
        vd: 64,
        per_channel: true,
        seed: 300,
        ..BASE
    });
}

#[test]
fn head_broadcast_with_strided_views() {
    for (hk, repeat) in [(2, 1), (2, 2), (1, 3), (2, 3)] {
        for strided in [false, true] {
            check_case(&Case {
                b: 2,
                t: 6,
                hk,
                hv: hk * repeat,
                kd: 32,
                vd: 16,
                strided,
                per_channel: repeat == 2,
                seed: (hk * 10 + repeat) as u64,
                ..BASE
            });
        }
    }
}

#[test]
fn half_storage() {
    for dtype in [DType::F16, DType::BF16] {
        for strided in [false, true] {
            check_case(&Case {
                dtype,
                strided,
                hk: 1,
                hv: 2,
                kd: 32,
                vd: 32,
                t: 6,
                per_channel: strided,
                seed: 5,
                ..BASE
            });
        }
    }
}

#[test]
fn absent_state_and_cotangents() {
    for (initial, d_output, d_final) in [
        (false, true, false),
        (false, false, true),
        (true, false, false),
        (false, false, false),
    ] {
        check_case(&Case {
            initial,
            d_output,
            d_final,
            t: 4,
            ..BASE
        });
    }
}

/// Upload, run and compare a case whose data the test builds itself (and its chunked twin).
fn check_data(c: &Case, data: Data) {
    if let Some(twin) = chunked_twin(c) {
        check_data(&twin, data.clone());
    }
    let x = upload(c, data);
    let gpu = run_gpu(c, &x);
    let s = &x.stored;
    let d = dims(c);
    let fwd = reference::forward(&d, &s.q, &s.k, &s.v, &s.beta, &s.g, s.init.as_deref());
    let f32tol = Tolerance::for_dtype(DType::F32);
    let cmp = compare(&gpu.output, &fwd.output, f32tol);
    assert!(cmp.passed, "output: {cmp}");
    let cmp = compare(&gpu.final_state, &fwd.final_state, f32tol);
    assert!(cmp.passed, "final state: {cmp}");
    let r = reference::backward(
        &d,
        &s.q,
        &s.k,
        &s.v,
        &s.beta,
        &s.g,
        s.init.as_deref(),
        s.d_out.as_deref(),
        s.d_final.as_deref(),
    );
    let want = [
        &r.query,
        &r.key,
        &r.value,
        &r.beta,
        &r.log_decay,
        &r.initial_state,
    ];
    for (i, name) in GRAD_NAMES.iter().enumerate() {
        let cmp = compare(&gpu.grads[i], want[i], f32tol);
        assert!(cmp.passed, "{name}: {cmp}");
    }
}

#[test]
fn adversarial_gates() {
    // log decay −120 (exp underflows to 0 in f32: the state is wiped), 0 (no decay);
    // β exactly 0 (no write) and 1 (full overwrite of the key's projection).
    for per_channel in [false, true] {
        let c = Case {
            t: 8,
            hv: 2,
            per_channel,
            seed: 120,
            ..BASE
        };
        let mut data = make_data(&c);
        for (i, b) in data.beta.iter_mut().enumerate() {
            *b = if i % 2 == 0 { 0.0 } else { 1.0 };
        }
        for (i, g) in data.g.iter_mut().enumerate() {
            *g = match i % 3 {
                0 => -120.0,
                1 => 0.0,
                _ => *g,
            };
        }
        check_data(&c, data);
    }
}

#[test]
fn chaining_through_the_initial_state() {
    // One call over T1 + T2 equals a call over T1 whose final state starts a call over T2,
    // forward and backward (the second call's initial-state gradient is the first call's
    // final-state cotangent).
    let e = engine();
    let (t1, t2) = (5, 4);
    let c = Case {
        t: t1 + t2,
        hk: 1,
        hv: 2,
        kd: 16,
        vd: 32,
        per_channel: true,
        seed: 9,
        ..BASE
    };
    let data = make_data(&c);
    let x = upload(&c, data);
    let s = &x.stored;
    let gd = if c.per_channel { c.hv * c.kd } else { c.hv };
    let t = |v: &[f64], shape: &[usize]| common::tensor_from_f64(e, v, shape, DType::F32);
    let part =
        |r: std::ops::Range<usize>, v: &[f64], per: usize| v[r.start * per..r.end * per].to_vec();
    let qk = c.hk * c.kd;
    let vv = c.hv * c.vd;
    let mk = |r: std::ops::Range<usize>| {
        let n = r.len();
        (
            t(&part(r.clone(), &s.q, qk), &[1, n, c.hk, c.kd]),
            t(&part(r.clone(), &s.k, qk), &[1, n, c.hk, c.kd]),
            t(&part(r.clone(), &s.v, vv), &[1, n, c.hv, c.vd]),
            t(&part(r.clone(), &s.beta, c.hv), &[1, n, c.hv]),
            t(&part(r.clone(), &s.g, gd), &[1, n, c.hv, c.kd]),
            t(&part(r, s.d_out.as_ref().unwrap(), vv), &[1, n, c.hv, c.vd]),
        )
    };
    let opts = GatedDeltaOptions::default();
    let (q1, k1, v1, b1, g1, do1) = mk(0..t1);
    let (q2, k2, v2, b2, g2, do2) = mk(t1..t1 + t2);
    let (o1, s1) = gated_delta_forward(&q1, &k1, &v1, &b1, &g1, x.init.as_ref(), &opts).unwrap();
    let (o2, s2) =
        gated_delta_forward(&q2, &k2, &v2, &b2, &g2, Some(&o1.final_state), &opts).unwrap();
    let (ow, sw) =
        gated_delta_forward(&x.q, &x.k, &x.v, &x.beta, &x.g, x.init.as_ref(), &opts).unwrap();
    let f32tol = Tolerance::for_dtype(DType::F32);
    let mut chained = o1.output.to_f64().unwrap();
    chained.extend(o2.output.to_f64().unwrap());
    let cmp = compare(&chained, &ow.output.to_f64().unwrap(), f32tol);
    assert!(cmp.passed, "chained output: {cmp}");
    let cmp = compare(
        &o2.final_state.to_f64().unwrap(),
        &ow.final_state.to_f64().unwrap(),
        f32tol,
    );
    assert!(cmp.passed, "chained final state: {cmp}");
    // Backward: second call first, its initial-state gradient feeds the first call.
    let g2r = gated_delta_backward(&s2, Some(&do2), x.d_final.as_ref()).unwrap();
    let g1r = gated_delta_backward(&s1, Some(&do1), Some(&g2r.initial_state)).unwrap();
    let gw = gated_delta_backward(&sw, x.d_out.as_ref(), x.d_final.as_ref()).unwrap();
    let cat = |a: &Tensor, b: &Tensor| {
        let mut v = a.to_f64().unwrap();
        v.extend(b.to_f64().unwrap());
        v
    };
    let pairs = [
        ("d_query", cat(&g1r.query, &g2r.query), &gw.query),
        ("d_key", cat(&g1r.key, &g2r.key), &gw.key),
        ("d_value", cat(&g1r.value, &g2r.value), &gw.value),
        ("d_beta", cat(&g1r.beta, &g2r.beta), &gw.beta),
        (
            "d_log_decay",
            cat(&g1r.log_decay, &g2r.log_decay),
            &gw.log_decay,
        ),
        (
            "d_initial_state",
            g1r.initial_state.to_f64().unwrap(),
            &gw.initial_state,
        ),
    ];
    for (name, got, want) in pairs {
        let cmp = compare(&got, &want.to_f64().unwrap(), f32tol);
        assert!(cmp.passed, "chained {name}: {cmp}");
    }
    // And the whole call matches the reference (the chain is not just self-consistent).
    let r = reference::forward(
        &dims(&c),
        &s.q,
        &s.k,
        &s.v,
        &s.beta,
        &s.g,
        s.init.as_deref(),
    );
    assert!(compare(&ow.output.to_f64().unwrap(), &r.output, f32tol).passed);
}

#[test]
fn reference_backward_matches_finite_differences() {
    for per_channel in [false, true] {
        let c = Case {
            b: 1,
            t: 4,
            hk: 1,
            hv: 2,
            kd: 3,
            vd: 2,
            per_channel,
            seed: 33,
            ..BASE
        };
        let data = make_data(&c);
        let d = Dims {
            key_dim: 3,
            value_dim: 2,
            ..dims(&c)
        };
        let init = data.init.clone().unwrap();
        let d_out = data.d_out.clone().unwrap();
        let d_final = data.d_final.clone().unwrap();
        let mut cot = d_out.clone();
        cot.extend(&d_final);
        let r = reference::backward(
            &d,
            &data.q,
            &data.k,
            &data.v,
            &data.beta,
            &data.g,
            Some(&init),
            Some(&d_out),
            Some(&d_final),
        );
        // Each input in turn is the variable; the outputs are output ‖ final state.
        let run = |which: usize, x: &[f64]| -> Vec<f64> {
            let pick = |i: usize, own: &[f64]| -> Vec<f64> {
                if i == which { x.to_vec() } else { own.to_vec() }
            };
            let f = reference::forward(
                &d,
                &pick(0, &data.q),
                &pick(1, &data.k),
                &pick(2, &data.v),
                &pick(3, &data.beta),
                &pick(4, &data.g),
                Some(&pick(5, &init)),
            );
            let mut out = f.output;
            out.extend(f.final_state);
            out
        };
        let inputs: [(&str, &Vec<f64>, &Vec<f64>); 6] = [
            ("q", &data.q, &r.query),
            ("k", &data.k, &r.key),
            ("v", &data.v, &r.value),
            ("beta", &data.beta, &r.beta),
            ("log_decay", &data.g, &r.log_decay),
            ("initial_state", &init, &r.initial_state),
        ];
        for (which, (name, x, analytic)) in inputs.iter().enumerate() {
            let cmp = check_vjp(|p| run(which, p), x, &cot, analytic);
            assert!(cmp.passed, "per_channel {per_channel}: d_{name}: {cmp}");
        }
    }
}

#[test]
fn reruns_are_bit_identical() {
    let c = Case {
        b: 2,
        t: 11,
        hk: 1,
        hv: 3,
        kd: 32,
        vd: 16,
        per_channel: true,
        strided: true,
        seed: 4,
        ..BASE
    };
    let x = upload(&c, make_data(&c));
    let a = run_gpu(&c, &x);
    let b = run_gpu(&c, &x);
    assert!(a.bits == b.bits, "second run differs");
}

#[test]
fn memory_queries() {
    let shape = GatedDeltaShape {
        batch: 1,
        time: 8192,
        key_heads: 16,
        value_heads: 48,
        key_dim: 128,
        value_dim: 128,
        per_channel: false,
    };
    let opts = GatedDeltaOptions {
        algorithm: DeltaAlgorithm::Recurrent,
        ..GatedDeltaOptions::default()
    };
    assert_eq!(shape.interval(&opts), 91);
    let state = 128 * 128 * 4u64;
    // 48 workgroups × (10 sub-checkpoints + 10 sub-segment states) + dq/dk partials of one
    // segment (2 × 91 × 48 × 128 F32).
    assert_eq!(
        gated_delta_workspace_bytes(&shape, &opts),
        48 * 20 * state + 2 * 91 * 48 * 128 * 4
    );
    assert_eq!(gated_delta_saved_bytes(&shape, &opts), 48 * 91 * state);
    eprintln!(
        "T=8192 Hk=16 Hv=48 K=V=128: backward workspace {:.1} MiB, saved checkpoints {:.1} MiB",
        gated_delta_workspace_bytes(&shape, &opts) as f64 / (1u64 << 20) as f64,
        gated_delta_saved_bytes(&shape, &opts) as f64 / (1u64 << 20) as f64
    );
    let all = GatedDeltaOptions {
        save_states: true,
        ..opts
    };
    assert_eq!(shape.interval(&all), 1);
    assert_eq!(gated_delta_saved_bytes(&shape, &all), 48 * 8192 * state);
    // The default (`Auto`): chunked for a scalar decay, the recurrence for a per-channel one
    // or with save_states, and the memory queries follow.
    let auto = GatedDeltaOptions::default();
    let chunked = GatedDeltaOptions {
        algorithm: DeltaAlgorithm::Chunked,
        ..auto
    };
    let kda = GatedDeltaShape {
        per_channel: true,
        ..shape
    };
    assert_eq!(auto.algorithm, DeltaAlgorithm::Auto);
    assert_eq!(shape.algorithm(&auto), DeltaAlgorithm::Chunked);
    assert_eq!(kda.algorithm(&auto), DeltaAlgorithm::Recurrent);
    let auto_all = GatedDeltaOptions {
        save_states: true,
        ..auto
    };
    assert_eq!(shape.algorithm(&auto_all), DeltaAlgorithm::Recurrent);
    assert_eq!(shape.algorithm(&opts), DeltaAlgorithm::Recurrent);
    assert_eq!(
        gated_delta_workspace_bytes(&shape, &auto),
        gated_delta_workspace_bytes(&shape, &chunked)
    );
    assert_eq!(
        gated_delta_saved_bytes(&shape, &auto),
        gated_delta_saved_bytes(&shape, &chunked)
    );
    assert_eq!(
        gated_delta_workspace_bytes(&kda, &auto),
        gated_delta_workspace_bytes(&kda, &opts)
    );
    assert_eq!(gated_delta_saved_bytes(&kda, &auto), 48 * 91 * state);
    assert_eq!(
        gated_delta_saved_bytes(&shape, &auto_all),
        48 * 8192 * state
    );
    assert_eq!(
        gated_delta_forward_workspace_bytes(&kda, &auto, DType::F32),
        0
    );
}

#[test]
fn workspace_bound_is_enforced() {
    let e = private_engine();
    let c = Case { t: 9, ..BASE };
    let data = make_data(&c);
    let t = |v: &[f64], s: &[usize]| common::tensor_from_f64(&e, v, s, DType::F32);
    let q = t(&data.q, &[1, 9, 1, 16]);
    let k = t(&data.k, &[1, 9, 1, 16]);
    let v = t(&data.v, &[1, 9, 1, 16]);
    let beta = t(&data.beta, &[1, 9, 1]);
    let g = t(&data.g, &[1, 9, 1]);
    let recurrent = GatedDeltaOptions {
        algorithm: DeltaAlgorithm::Recurrent,
        ..GatedDeltaOptions::default()
    };
    let (_, saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &recurrent).unwrap();
    let needed = gated_delta_workspace_bytes(&saved.shape(), &recurrent);
    // C = 3, sub-segments of 2: 2 sub-checkpoints + 2 states.
    assert_eq!(needed, 4 * 16 * 16 * 4);
    e.set_workspace_bound(needed - 1);
    match gated_delta_backward(&saved, None, None) {
        Err(Error::WorkspaceExceeded {
            needed: n, bound, ..
        }) => assert_eq!((n, bound), (needed, needed - 1)),
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
    e.set_workspace_bound(needed);
    gated_delta_backward(&saved, None, None).unwrap();
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let z = |s: &[usize]| Tensor::zeros(e, s, DType::F32).unwrap();
    let (q, k, v) = (z(&[1, 4, 2, 16]), z(&[1, 4, 2, 16]), z(&[1, 4, 4, 16]));
    let (beta, g) = (z(&[1, 4, 4]), z(&[1, 4, 4]));
    let o = GatedDeltaOptions::default();
    let fwd = |q: &Tensor,
               k: &Tensor,
               v: &Tensor,
               beta: &Tensor,
               g: &Tensor,
               s0: Option<&Tensor>,
               o: &GatedDeltaOptions| {
        gated_delta_forward(q, k, v, beta, g, s0, o).map(|_| ())
    };
    assert!(fwd(&q, &k, &v, &beta, &g, None, &o).is_ok());
    let shape_err = |r: wgrad::Result<()>, what: &str| match r {
        Err(Error::ShapeMismatch { .. }) => {}
        other => panic!("{what}: expected ShapeMismatch, got {other:?}"),
    };
    let bounds_err = |r: wgrad::Result<()>, what: &str, want: u64| match r {
        Err(Error::OutOfBounds { got, .. }) => assert_eq!(got, want, "{what}"),
        other => panic!("{what}: expected OutOfBounds, got {other:?}"),
    };
    let dtype_err = |r: wgrad::Result<()>, what: &str, want: DType| match r {
        Err(Error::UnsupportedDType { got, .. }) => assert_eq!(got, want, "{what}"),
        other => panic!("{what}: expected UnsupportedDType, got {other:?}"),
    };
    // Shapes.
    shape_err(fwd(&z(&[4, 2, 16]), &k, &v, &beta, &g, None, &o), "3-D q");
    shape_err(
        fwd(&q, &z(&[1, 4, 2, 32]), &v, &beta, &g, None, &o),
        "k dims",
    );
    shape_err(
        fwd(
            &q,
            &k,
            &z(&[1, 4, 3, 16]),
            &z(&[1, 4, 3]),
            &z(&[1, 4, 3]),
            None,
            &o,
        ),
        "Hv not a multiple of Hk",
    );
    shape_err(
        fwd(&q, &k, &z(&[1, 5, 4, 16]), &beta, &g, None, &o),
        "v time",
    );
    shape_err(fwd(&q, &k, &v, &z(&[1, 4, 2]), &g, None, &o), "beta");
    shape_err(
        fwd(&q, &k, &v, &beta, &z(&[1, 4, 4, 8]), None, &o),
        "per-channel decay width",
    );
    shape_err(
        fwd(&q, &k, &v, &beta, &g, Some(&z(&[1, 4, 16, 8])), &o),
        "initial state",
    );
    // Bounds.
    let small = z(&[1, 4, 2, 8]);
    bounds_err(
        fwd(
            &small,
            &small,
            &z(&[1, 4, 2, 16]),
            &z(&[1, 4, 2]),
            &z(&[1, 4, 2]),
            None,
            &o,
        ),
        "K = 8",
        8,
    );
    let big = z(&[1, 1, 1, 257]);
    bounds_err(
        fwd(
            &z(&[1, 1, 1, 16]),
            &z(&[1, 1, 1, 16]),
            &big,
            &z(&[1, 1, 1]),
            &z(&[1, 1, 1]),
            None,
            &o,
        ),
        "V = 257",
        257,
    );
    let t0 = z(&[1, 0, 2, 16]);
    bounds_err(
        fwd(
            &t0,
            &t0,
            &z(&[1, 0, 4, 16]),
            &z(&[1, 0, 4]),
            &z(&[1, 0, 4]),
            None,
            &o,
        ),
        "T = 0",
        0,
    );
    let b0 = z(&[0, 4, 2, 16]);
    bounds_err(
        fwd(
            &b0,
            &b0,
            &z(&[0, 4, 4, 16]),
            &z(&[0, 4, 4]),
            &z(&[0, 4, 4]),
            None,
            &o,
        ),
        "B = 0",
        0,
    );
    // Views.
    let fused = z(&[1, 4, 40]);
    let view = |off: usize, stride: usize| SeqView::strided(&fused, [1, 4, 2, 16], off, stride);
    bounds_err(
        gated_delta_forward(view(0, 20), &k, &v, &beta, &g, None, &o).map(|_| ()),
        "row stride below H·D",
        20,
    );
    bounds_err(
        gated_delta_forward(view(9, 40), &k, &v, &beta, &g, None, &o).map(|_| ()),
        "view past the end",
        9 + 3 * 40 + 32,
    );
    assert!(gated_delta_forward(view(8, 40), &k, &v, &beta, &g, None, &o).is_ok());
    // Dtypes.
    let h = common::tensor_from_f64(e, &[0.0; 128], &[1, 4, 2, 16], DType::BF16);
    dtype_err(
        fwd(&q, &h, &v, &beta, &g, None, &o),
        "mixed q/k dtypes",
        DType::BF16,
    );
    let hb = common::tensor_from_f64(e, &[0.0; 16], &[1, 4, 4], DType::F16);
    dtype_err(fwd(&q, &k, &v, &hb, &g, None, &o), "f16 beta", DType::F16);
    dtype_err(
        fwd(&q, &k, &v, &beta, &hb, None, &o),
        "f16 log_decay",
        DType::F16,
    );
    let iq = Tensor::from_slice(e, &[0i32; 128], &[1, 4, 2, 16]).unwrap();
    dtype_err(
        fwd(
            &iq,
            &iq,
            &Tensor::from_slice(e, &[0i32; 256], &[1, 4, 4, 16]).unwrap(),
            &beta,
            &g,
            None,
            &o,
        ),
        "i32 q",
        DType::I32,
    );
    // Scalars.
    for scale in [f64::NAN, f64::INFINITY, 1e300] {
        let so = GatedDeltaOptions {
            scale: Some(scale),
            ..o
        };
        assert!(
            matches!(
                fwd(&q, &k, &v, &beta, &g, None, &so),
                Err(Error::InvalidValue { .. })
            ),
            "scale {scale}"
        );
    }
    let co = GatedDeltaOptions {
        checkpoint_interval: Some(0),
        ..o
    };
    assert!(matches!(
        fwd(&q, &k, &v, &beta, &g, None, &co),
        Err(Error::InvalidValue { .. })
    ));
    // Engines.
    let other = private_engine();
    let foreign = Tensor::zeros(&other, &[1, 4, 4], DType::F32).unwrap();
    assert!(matches!(
        fwd(&q, &k, &v, &foreign, &g, None, &o),
        Err(Error::EngineMismatch { .. })
    ));
    // Backward cotangents.
    let (_, saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &o).unwrap();
    let bwd = |d_out: Option<&Tensor>, d_final: Option<&Tensor>| {
        gated_delta_backward(&saved, d_out, d_final).map(|_| ())
    };
    shape_err(bwd(Some(&z(&[1, 4, 4, 8])), None), "d_output shape");
    shape_err(bwd(None, Some(&z(&[1, 4, 16, 8]))), "d_final_state shape");
    let hd = common::tensor_from_f64(e, &[0.0; 256], &[1, 4, 4, 16], DType::BF16);
    dtype_err(bwd(Some(&hd), None), "bf16 d_output", DType::BF16);
    let fd = Tensor::zeros(&other, &[1, 4, 16, 16], DType::F32).unwrap();
    assert!(matches!(
        bwd(None, Some(&fd)),
        Err(Error::EngineMismatch { .. })
    ));
    assert!(bwd(None, None).is_ok());
}

#[test]
fn small_workspace_bound_splits_launches_with_the_same_bits() {
    // A bound of one workgroup's scratch runs the workgroups one launch at a time.
    let c = Case {
        b: 2,
        t: 7,
        hk: 2,
        hv: 4,
        kd: 16,
        vd: 32,
        per_channel: true,
        seed: 21,
        ..BASE
    };
    let data = make_data(&c);
    let e = private_engine();
    let t = |v: &[f64], s: &[usize]| common::tensor_from_f64(&e, v, s, DType::F32);
    let q = t(&data.q, &[2, 7, 2, 16]);
    let k = t(&data.k, &[2, 7, 2, 16]);
    let v = t(&data.v, &[2, 7, 4, 32]);
    let beta = t(&data.beta, &[2, 7, 4]);
    let g = t(&data.g, &[2, 7, 4, 16]);
    let d_out = t(data.d_out.as_ref().unwrap(), &[2, 7, 4, 32]);
    let opts = GatedDeltaOptions::default();
    let run = || {
        let (_, saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &opts).unwrap();
        let gr = gated_delta_backward(&saved, Some(&d_out), None).unwrap();
        gradient_bits(&gr)
    };
    let full = run();
    let shape = GatedDeltaShape {
        batch: 2,
        time: 7,
        key_heads: 2,
        value_heads: 4,
        key_dim: 16,
        value_dim: 32,
        per_channel: true,
    };
    // C = 3, sub-segments of 2: 4 states per workgroup; 8 workgroups (B·Hv); dq/dk partials
    // of one segment 2 × B·C·Hv·K F32.
    let unit = 4 * 16 * 32 * 4;
    let partials = 2 * 2 * 3 * 4 * 16 * 4;
    assert_eq!(
        gated_delta_workspace_bytes(&shape, &opts),
        partials + 8 * unit
    );
    for bound in [partials + unit, partials + 3 * unit, partials + unit + 1] {
        e.set_workspace_bound(bound);
        assert!(run() == full, "bound {bound}: results differ");
    }
    e.set_workspace_bound(partials + unit - 1);
    let (_, saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &opts).unwrap();
    match gated_delta_backward(&saved, None, None) {
        Err(Error::WorkspaceExceeded { needed, bound, .. }) => {
            assert_eq!((needed, bound), (partials + unit, partials + unit - 1))
        }
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
}

/// The chunked forward and backward over several chunks of 64 tokens: partial last chunks,
/// checkpoint intervals (ignored: the chunked forward saves the initial state alone), head
/// broadcast through strided views, 16-bit storage, K = V = 128.
#[test]
fn chunked_forward_over_many_chunks() {
    let chunked = Case {
        chunked: true,
        ..BASE
    };
    for (t, interval) in [(64, None), (65, None), (130, Some(100)), (200, Some(500))] {
        check_case(&Case {
            b: 2,
            t,
            hk: 1,
            hv: 2,
            kd: 32,
            vd: 40,
            interval,
            seed: t as u64,
            ..chunked
        });
    }
    for dtype in [DType::F16, DType::BF16] {
        check_case(&Case {
            t: 150,
            hk: 2,
            hv: 6,
            kd: 16,
            vd: 24,
            strided: true,
            dtype,
            seed: 150,
            ..chunked
        });
    }
    check_case(&Case {
        t: 96,
        kd: 128,
        vd: 128,
        seed: 96,
        ..chunked
    });
    // K not a multiple of four (the staged rows' groups padded with zeros), and K past 128
    // (rounds of 8 tokens, a lane's fourth row group partly past K).
    for (kd, vd, t) in [(18, 20, 70), (200, 24, 70)] {
        check_case(&Case {
            b: 2,
            t,
            hv: 2,
            kd,
            vd,
            seed: kd as u64,
            ..chunked
        });
    }
    let shape = GatedDeltaShape {
        batch: 1,
        time: 8192,
        key_heads: 16,
        value_heads: 48,
        key_dim: 128,
        value_dim: 128,
        per_channel: false,
    };
    let opts = GatedDeltaOptions {
        algorithm: DeltaAlgorithm::Chunked,
        ..GatedDeltaOptions::default()
    };
    assert_eq!(shape.interval(&opts), 8192);
    assert_eq!(gated_delta_saved_bytes(&shape, &opts), 48 * 128 * 128 * 4);
    // w, u, P and γ of 128 chunks for each of 48 heads.
    let forward = 48 * 8192 * (128 + 128 + 64 + 1) * 4;
    assert_eq!(
        gated_delta_forward_workspace_bytes(&shape, &opts, DType::F32),
        forward
    );
    // Again, with U and dU, 128 states and state gradients and the dq/dk partials a head,
    // and 1,024 gradient workgroups' scratch.
    assert_eq!(
        gated_delta_workspace_bytes(&shape, &opts),
        forward
            + 48 * (2 * 8192 * 128 + 2 * 128 * 128 * 128 + 2 * 8192 * 128) * 4
            + 1024 * 64 * (4 * 128 + 128 + 4 * 64) * 4
    );
}

/// Chunked reruns give the same bits, and so does any workspace bound that fits one head
/// (fewer heads a launch) in the forward and one key head in the backward; below that
/// `WorkspaceExceeded`; per-channel decay and `save_states` are refused; the default `Auto`
/// takes the chunked form here and the recurrence for those two.
#[test]
fn chunked_reruns_bounds_and_refusals() {
    let e = private_engine();
    let c = Case {
        b: 2,
        t: 70,
        hk: 1,
        hv: 3,
        kd: 16,
        vd: 16,
        chunked: true,
        seed: 7,
        ..BASE
    };
    let data = make_data(&c);
    let t = |v: &[f64], s: &[usize]| common::tensor_from_f64(&e, v, s, DType::F32);
    let q = t(&data.q, &[2, 70, 1, 16]);
    let k = t(&data.k, &[2, 70, 1, 16]);
    let v = t(&data.v, &[2, 70, 3, 16]);
    let beta = t(&data.beta, &[2, 70, 3]);
    let g = t(&data.g, &[2, 70, 3]);
    let opts = options(&c);
    let run = || {
        let (out, saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &opts).unwrap();
        [&out.output, &out.final_state, saved.checkpoints()]
            .map(common::f32_bits)
            .to_vec()
    };
    let first = run();
    assert!(run() == first, "second run differs");
    let shape = GatedDeltaShape {
        batch: 2,
        time: 70,
        key_heads: 1,
        value_heads: 3,
        key_dim: 16,
        value_dim: 16,
        per_channel: false,
    };
    let all = gated_delta_forward_workspace_bytes(&shape, &opts, DType::F32);
    let head = all / 6;
    assert_eq!(head, 128 * (16 + 16 + 64 + 1) * 4);
    for bound in [head, 2 * head + 1, 4 * head] {
        e.set_workspace_bound(bound);
        assert!(run() == first, "bound {bound}: results differ");
    }
    e.set_workspace_bound(head - 1);
    match gated_delta_forward(&q, &k, &v, &beta, &g, None, &opts) {
        Err(Error::WorkspaceExceeded { needed, bound, .. }) => {
            assert_eq!((needed, bound), (head, head - 1))
        }
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
    // The backward: all key heads in one launch, one a launch (a bound just below all of
    // them), and below one key head's need `WorkspaceExceeded`.
    e.set_workspace_bound(u64::MAX);
    let dout = t(&data.d_out.clone().unwrap(), &[2, 70, 3, 16]);
    let (_, saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &opts).unwrap();
    let backward = || gated_delta_backward(&saved, Some(&dout), None).map(|gr| gradient_bits(&gr));
    let full = backward().unwrap();
    let needed_all = gated_delta_workspace_bytes(&shape, &opts);
    e.set_workspace_bound(needed_all - 1);
    assert!(
        backward().unwrap() == full,
        "one key head a launch: results differ"
    );
    e.set_workspace_bound(1);
    let one = match backward() {
        Err(Error::WorkspaceExceeded { needed, .. }) => needed,
        other => panic!("expected WorkspaceExceeded, got {:?}", other.map(drop)),
    };
    assert!(one < needed_all);
    e.set_workspace_bound(one);
    assert!(backward().unwrap() == full, "bound {one}: results differ");
    e.set_workspace_bound(all);
    let per_channel = t(&vec![-0.1; 2 * 70 * 3 * 16], &[2, 70, 3, 16]);
    for (what, decay, o) in [
        ("per-channel decay", &per_channel, opts),
        (
            "save_states",
            &g,
            GatedDeltaOptions {
                save_states: true,
                ..opts
            },
        ),
    ] {
        match gated_delta_forward(&q, &k, &v, &beta, decay, None, &o) {
            Err(Error::InvalidValue { .. }) => {}
            other => panic!("{what}: expected InvalidValue, got {other:?}"),
        }
    }
    // The default (`Auto`) runs the chunked form for this scalar decay (the same bits, the
    // initial state alone saved, the chunked backward) and the recurrence for a per-channel
    // decay (checkpoints every ⌈√70⌉ = 9 tokens) or with save_states (every token).
    e.set_workspace_bound(u64::MAX);
    let auto = GatedDeltaOptions::default();
    let (out, saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &auto).unwrap();
    assert!(
        [&out.output, &out.final_state, saved.checkpoints()]
            .map(common::f32_bits)
            .to_vec()
            == first,
        "Auto's forward differs from the chunked one"
    );
    assert_eq!(saved.checkpoint_interval(), 70);
    let gr = gated_delta_backward(&saved, Some(&dout), None).unwrap();
    assert!(
        gradient_bits(&gr) == full,
        "Auto's backward differs from the chunked one"
    );
    let (_, per_channel_saved) =
        gated_delta_forward(&q, &k, &v, &beta, &per_channel, None, &auto).unwrap();
    assert_eq!(per_channel_saved.checkpoint_interval(), 9);
    let every = GatedDeltaOptions {
        save_states: true,
        ..auto
    };
    let (_, every_saved) = gated_delta_forward(&q, &k, &v, &beta, &g, None, &every).unwrap();
    assert_eq!(every_saved.checkpoint_interval(), 1);
}

/// `gated_delta_backward_as`: every gradient in F16 / BF16 bit for bit the F32 one cast, after
/// a recurrent and a chunked forward; a non-float dtype is a typed error.
#[test]
fn sixteen_bit_gradients_are_the_f32_ones_cast() {
    for chunked in [false, true] {
        let c = Case {
            t: 70,
            hk: 1,
            hv: 2,
            chunked,
            dtype: DType::BF16,
            ..BASE
        };
        let x = upload(&c, make_data(&c));
        let (_, saved) = gated_delta_forward(
            &x.q,
            &x.k,
            &x.v,
            &x.beta,
            &x.g,
            x.init.as_ref(),
            &options(&c),
        )
        .unwrap();
        let g = gated_delta_backward(&saved, x.d_out.as_ref(), x.d_final.as_ref()).unwrap();
        for out in [DType::F16, DType::BF16] {
            let g16 =
                gated_delta_backward_as(&saved, x.d_out.as_ref(), x.d_final.as_ref(), out).unwrap();
            let wide = [
                &g.query,
                &g.key,
                &g.value,
                &g.beta,
                &g.log_decay,
                &g.initial_state,
            ];
            let narrow = [
                &g16.query,
                &g16.key,
                &g16.value,
                &g16.beta,
                &g16.log_decay,
                &g16.initial_state,
            ];
            let pairs: Vec<(&str, &Tensor, &Tensor)> = GRAD_NAMES
                .iter()
                .zip(narrow.into_iter().zip(wide))
                .map(|(name, (n, w))| (*name, n, w))
                .collect();
            common::assert_cast_of(&format!("chunked {chunked}"), &pairs, out);
        }
        assert!(matches!(
            gated_delta_backward_as(&saved, x.d_out.as_ref(), None, DType::I32),
            Err(Error::UnsupportedDType {
                got: DType::I32,
                ..
            })
        ));
    }
}

/// The chunk states' parts are summed by subgroup shuffles where the adapter has subgroups and
/// through workgroup memory otherwise (also in rounds of other sizes): the same tree, so the
/// same bits, forward and backward (K of 32: 16- and 8-token rounds; K of 256: 8 either way).
#[test]
fn chunk_states_bits_do_not_depend_on_subgroups() {
    for (t, kd, vd, seed) in [(130, 32, 40, 31), (70, 256, 24, 32), (70, 18, 20, 33)] {
        let c = Case {
            b: 2,
            t,
            hk: 1,
            hv: 2,
            kd,
            vd,
            chunked: true,
            seed,
            ..BASE
        };
        let x = upload(&c, make_data(&c));
        let run = |subgroups: bool| {
            wgrad::reduce::force_subgroup_rows(Some(subgroups));
            let r = run_gpu(&c, &x);
            wgrad::reduce::force_subgroup_rows(None);
            r.bits
        };
        let plain = run(false);
        assert!(plain == run(false), "{c:?}: reruns differ");
        assert!(
            run(true) == plain,
            "{c:?}: shuffles and workgroup memory differ"
        );
    }
}
