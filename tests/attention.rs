//! Attention (`wgrad::attention`) against the f64 reference of `wgrad::reference::attention`,
//! which materializes every score matrix (so shapes stay small): output, saved F32 output,
//! row statistics and dq/dk/dv for F32, F16 and BF16 storage; grouped heads 1/2/4; causal with
//! the default (bottom-right) and top-left offsets, query_len < key_len and > key_len; masks
//! with fully masked rows in every broadcast shape; sliding windows; lengths 1/17/65/200 (not
//! multiples of the 32-row tile); head dims 8/32/72/128/256; a 1e4 common score offset; the
//! [B,S,H,D] layout; bit-identical reruns; finite differences of the reference backward;
//! workspace bound; empty shapes; every documented bad input's error; the stored
//! score-gradient schedule bit-identical to the default one; the compact 16 KiB layout (a device
//! with WebGPU's default workgroup memory) bit-identical to the full tiles.
//!
//! Tolerance: `Tolerance::for_dtype` of the compared output (the output in its storage dtype,
//! everything else F32), unscaled: the references use the stored (rounded) inputs, so only
//! FP32 arithmetic and the output's own rounding are left.

mod common;

use common::{Rng, engine, private_engine};
use wgrad::attention::{
    AttentionLayout, AttentionOptions, AttentionSaved, BackwardSchedule, attention_backward,
    attention_backward_as, attention_backward_with, attention_flops, attention_forward,
    attention_workspace_bytes, mask_from_bools, mask_from_u8, stored_scores_bytes_per_group,
};
use wgrad::gradcheck::{Tolerance, check_vjp, compare};
use wgrad::reference::attention::{self as reference, Dims, Visibility};
use wgrad::{DType, Engine, Error, Tensor};

/// One configuration: sizes, visibility, dtypes, layout, data seed.
#[derive(Clone)]
struct Setup {
    dims: Dims,
    causal: bool,
    offset: Option<i64>,
    window_left: Option<usize>,
    window_right: Option<usize>,
    dilation: Option<usize>,
    /// (visible, mask batch, mask heads, upload as 2 axes).
    mask: Option<(Vec<bool>, usize, usize, bool)>,
    scale: Option<f64>,
    dtype: DType,
    grad_dtype: DType,
    layout: AttentionLayout,
    seed: u64,
}

fn dims(
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    k_len: usize,
    d: usize,
) -> Dims {
    Dims {
        batch,
        q_heads,
        kv_heads,
        q_len,
        k_len,
        head_dim: d,
    }
}

impl Setup {
    fn new(dims: Dims) -> Setup {
        Setup {
            dims,
            causal: false,
            offset: None,
            window_left: None,
            window_right: None,
            dilation: None,
            mask: None,
            scale: None,
            dtype: DType::F32,
            grad_dtype: DType::F32,
            layout: AttentionLayout::BatchHeadSeq,
            seed: 1,
        }
    }

    fn visibility(&self) -> Visibility {
        let d = &self.dims;
        Visibility {
            causal: self.causal,
            offset: self.offset.unwrap_or(d.k_len as i64 - d.q_len as i64),
            window_left: self.window_left,
            window_right: self.window_right,
            dilation: self.dilation.unwrap_or(1),
            mask: self
                .mask
                .as_ref()
                .map(|(m, mb, mh, _)| (m.clone(), *mb, *mh)),
            scale: self.scale.unwrap_or(1.0 / (d.head_dim as f64).sqrt()),
        }
    }

    fn options(&self) -> AttentionOptions {
        self.options_on(engine())
    }

    fn options_on(&self, e: &Engine) -> AttentionOptions {
        let d = &self.dims;
        AttentionOptions {
            causal: self.causal,
            causal_offset: self.offset,
            scale: self.scale,
            mask: self.mask.as_ref().map(|(m, mb, mh, two)| {
                let shape = if *two {
                    vec![d.q_len, d.k_len]
                } else {
                    vec![*mb, *mh, d.q_len, d.k_len]
                };
                mask_from_bools(e, m, &shape).unwrap()
            }),
            window_left: self.window_left,
            window_right: self.window_right,
            dilation: self.dilation,
            layout: self.layout,
        }
    }

    fn q_count(&self) -> usize {
        let d = &self.dims;
        d.batch * d.q_heads * d.q_len * d.head_dim
    }

    fn k_count(&self) -> usize {
        let d = &self.dims;
        d.batch * d.kv_heads * d.k_len * d.head_dim
    }

    /// q, k, v, d_output in [B,H,S,D], uniform in [-1, 1).
    fn data(&self) -> [Vec<f64>; 4] {
        let mut rng = Rng::new(self.seed);
        [
            rng.vec(self.q_count(), -1.0, 1.0),
            rng.vec(self.k_count(), -1.0, 1.0),
            rng.vec(self.k_count(), -1.0, 1.0),
            rng.vec(self.q_count(), -1.0, 1.0),
        ]
    }
}

/// [B,H,S,D] → [B,S,H,D] (`back` false) or the reverse (`back` true).
fn permute(x: &[f64], b: usize, h: usize, s: usize, d: usize, back: bool) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                for c in 0..d {
                    let bhsd = ((bi * h + hi) * s + si) * d + c;
                    let bshd = ((bi * s + si) * h + hi) * d + c;
                    if back {
                        out[bhsd] = x[bshd];
                    } else {
                        out[bshd] = x[bhsd];
                    }
                }
            }
        }
    }
    out
}

/// Everything a run produced, in [B,H,S,D] order, plus the values the inputs hold.
struct Run {
    stored: [Vec<f64>; 4],
    output: Vec<f64>,
    output_f32: Vec<f64>,
    row_max: Vec<f64>,
    log_den: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    bits: Vec<Vec<u32>>,
}

fn upload(s: &Setup, x: &[f64], heads: usize, len: usize, dtype: DType) -> (Tensor, Vec<f64>) {
    upload_on(engine(), s, x, heads, len, dtype)
}

fn upload_on(
    e: &Engine,
    s: &Setup,
    x: &[f64],
    heads: usize,
    len: usize,
    dtype: DType,
) -> (Tensor, Vec<f64>) {
    let d = &s.dims;
    let stored = common::stored(x, dtype);
    let t = match s.layout {
        AttentionLayout::BatchHeadSeq => {
            common::tensor_from_f64(e, x, &[d.batch, heads, len, d.head_dim], dtype)
        }
        AttentionLayout::BatchSeqHead => common::tensor_from_f64(
            e,
            &permute(x, d.batch, heads, len, d.head_dim, false),
            &[d.batch, len, heads, d.head_dim],
            dtype,
        ),
    };
    (t, stored)
}

fn download(s: &Setup, t: &Tensor, heads: usize, len: usize) -> Vec<f64> {
    let d = &s.dims;
    let x = t.to_f64().unwrap();
    match s.layout {
        AttentionLayout::BatchHeadSeq => x,
        AttentionLayout::BatchSeqHead => permute(&x, d.batch, heads, len, d.head_dim, true),
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::F32 => common::f32_bits(t),
        DType::F16 => t
            .to_vec::<half::f16>()
            .unwrap()
            .iter()
            .map(|h| u32::from(h.to_bits()))
            .collect(),
        _ => t
            .to_vec::<half::bf16>()
            .unwrap()
            .iter()
            .map(|h| u32::from(h.to_bits()))
            .collect(),
    }
}

fn run_with(s: &Setup, data: &[Vec<f64>; 4]) -> Run {
    let d = &s.dims;
    let (q, qs) = upload(s, &data[0], d.q_heads, d.q_len, s.dtype);
    let (k, ks) = upload(s, &data[1], d.kv_heads, d.k_len, s.dtype);
    let (v, vs) = upload(s, &data[2], d.kv_heads, d.k_len, s.dtype);
    let (go, gos) = upload(s, &data[3], d.q_heads, d.q_len, s.grad_dtype);
    let (out, saved) = attention_forward(&q, &k, &v, &s.options()).unwrap();
    assert_eq!(out.shape(), q.shape());
    assert_eq!(out.dtype(), s.dtype);
    assert_eq!(saved.row_max().shape(), &[d.batch, d.q_heads, d.q_len]);
    let grads = attention_backward(&saved, &go).unwrap();
    assert_eq!(grads.query.shape(), q.shape());
    assert_eq!(grads.key.shape(), k.shape());
    assert_eq!(grads.value.shape(), v.shape());
    assert_eq!(grads.query.dtype(), DType::F32);
    let all = [
        &out,
        saved.output_f32(),
        saved.row_max(),
        saved.log_denominator(),
        &grads.query,
        &grads.key,
        &grads.value,
    ];
    Run {
        stored: [qs, ks, vs, gos],
        output: download(s, &out, d.q_heads, d.q_len),
        output_f32: download(s, saved.output_f32(), d.q_heads, d.q_len),
        row_max: saved.row_max().to_f64().unwrap(),
        log_den: saved.log_denominator().to_f64().unwrap(),
        dq: download(s, &grads.query, d.q_heads, d.q_len),
        dk: download(s, &grads.key, d.kv_heads, d.k_len),
        dv: download(s, &grads.value, d.kv_heads, d.k_len),
        bits: all.iter().map(|t| bits(t)).collect(),
    }
}

fn run(s: &Setup) -> Run {
    run_with(s, &s.data())
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: Tolerance) {
    let c = compare(got, want, tol);
    assert!(c.passed, "{what}: {c}");
}

/// Run `s` and compare every result with the reference.
fn check_with(what: &str, s: &Setup, data: &[Vec<f64>; 4]) -> Run {
    let r = run_with(s, data);
    let vis = s.visibility();
    let [q, k, v, go] = &r.stored;
    let want = reference::forward(q, k, v, &s.dims, &vis);
    let (dq, dk, dv) = reference::backward(q, k, v, go, &s.dims, &vis);
    let f32_tol = Tolerance::for_dtype(DType::F32);
    assert_close(
        &format!("{what}: output"),
        &r.output,
        &want.output,
        Tolerance::for_dtype(s.dtype),
    );
    assert_close(
        &format!("{what}: output_f32"),
        &r.output_f32,
        &want.output,
        f32_tol,
    );
    assert_close(
        &format!("{what}: row_max"),
        &r.row_max,
        &want.row_max,
        f32_tol,
    );
    assert_close(
        &format!("{what}: log_den"),
        &r.log_den,
        &want.log_denominator,
        f32_tol,
    );
    assert_close(&format!("{what}: dq"), &r.dq, &dq, f32_tol);
    assert_close(&format!("{what}: dk"), &r.dk, &dk, f32_tol);
    assert_close(&format!("{what}: dv"), &r.dv, &dv, f32_tol);
    r
}

fn check(what: &str, s: &Setup) -> Run {
    check_with(what, s, &s.data())
}

#[test]
fn every_dtype_matches_the_reference() {
    for dtype in DType::FLOATS {
        let mut s = Setup::new(dims(2, 4, 2, 17, 33, 24));
        s.causal = true;
        s.dtype = dtype;
        s.grad_dtype = dtype;
        s.seed = 10 + u64::from(dtype.code());
        check(&format!("{dtype} causal"), &s);
    }
    // A cotangent of another dtype than the inputs.
    let mut s = Setup::new(dims(1, 2, 1, 9, 20, 24));
    s.grad_dtype = DType::BF16;
    check("f32 inputs, bf16 cotangent", &s);
    let mut s = Setup::new(dims(1, 2, 1, 9, 20, 24));
    s.dtype = DType::F16;
    check("f16 inputs, f32 cotangent", &s);
}

#[test]
fn grouped_query_ratios_1_2_4() {
    for kv in [4, 2, 1] {
        let mut s = Setup::new(dims(2, 4, kv, 19, 23, 16));
        s.seed = 20 + kv as u64;
        check(&format!("4 query heads on {kv}"), &s);
    }
    // Several query and key tiles, causal (tiles skipped), with the cotangent in F16.
    let mut s = Setup::new(dims(1, 4, 1, 40, 70, 16));
    s.causal = true;
    s.grad_dtype = DType::F16;
    s.seed = 25;
    check("4 query heads on 1, causal, 40 x 70", &s);
}

#[test]
fn causal_offsets_both_conventions() {
    // Bottom-right (default: k_len − q_len) and top-left (0), query_len < key_len.
    for offset in [None, Some(0), Some(3)] {
        let mut s = Setup::new(dims(1, 2, 2, 5, 17, 16));
        s.causal = true;
        s.offset = offset;
        s.seed = 30;
        check(&format!("causal offset {offset:?}"), &s);
    }
    // The saved offset is the resolved default.
    let s = Setup::new(dims(1, 1, 1, 5, 17, 16));
    let data = s.data();
    let (q, _) = upload(&s, &data[0], 1, 5, DType::F32);
    let (k, _) = upload(&s, &data[1], 1, 17, DType::F32);
    let (_, saved) = attention_forward(&q, &k, &k, &AttentionOptions::default()).unwrap();
    assert_eq!(saved.causal_offset(), 12);
    assert_eq!(saved.scale(), 0.25);
}

#[test]
fn causal_with_more_queries_than_keys_zeroes_hidden_rows() {
    // Default offset 4 − 21 = −17: queries 0..17 see no key at all.
    let mut s = Setup::new(dims(1, 2, 1, 21, 4, 16));
    s.causal = true;
    s.seed = 31;
    let r = check("q_len 21 > k_len 4", &s);
    let d = 16;
    for h in 0..2 {
        for i in 0..21 {
            let row = h * 21 + i;
            let hidden = i < 17;
            let out = &r.output[row * d..(row + 1) * d];
            let dq = &r.dq[row * d..(row + 1) * d];
            if hidden {
                assert!(
                    out.iter().chain(dq).all(|&x| x == 0.0),
                    "row {row} not zero"
                );
                assert_eq!(r.row_max[row], f64::NEG_INFINITY);
                assert_eq!(r.log_den[row], f64::NEG_INFINITY);
            } else {
                assert!(out.iter().any(|&x| x != 0.0), "row {row} is zero");
            }
        }
    }
}

/// A mask with some rows fully hidden, plus random holes.
fn mask_values(
    seed: u64,
    planes: usize,
    q_len: usize,
    k_len: usize,
    hidden_rows: &[usize],
) -> Vec<bool> {
    let mut rng = Rng::new(seed);
    let mut m: Vec<bool> = (0..planes * q_len * k_len)
        .map(|_| rng.next_f64() < 0.6)
        .collect();
    for p in 0..planes {
        for &i in hidden_rows {
            for j in 0..k_len {
                m[(p * q_len + i) * k_len + j] = false;
            }
        }
    }
    m
}

#[test]
fn masks_broadcast_and_fully_masked_rows_give_zeros() {
    let (b, h, q_len, k_len) = (2, 2, 18, 20);
    for (mb, mh, two) in [
        (1, 1, true),
        (1, 1, false),
        (b, 1, false),
        (1, h, false),
        (b, h, false),
    ] {
        let mut s = Setup::new(dims(b, h, 1, q_len, k_len, 16));
        s.mask = Some((
            mask_values(40, mb * mh, q_len, k_len, &[0, 7, 17]),
            mb,
            mh,
            two,
        ));
        s.seed = 41;
        let r = check(&format!("mask [{mb}, {mh}] two-axis {two}"), &s);
        for row in (0..b * h).flat_map(|p| [0, 7, 17].map(|i| p * q_len + i)) {
            assert!(r.output[row * 16..(row + 1) * 16].iter().all(|&x| x == 0.0));
            assert!(r.dq[row * 16..(row + 1) * 16].iter().all(|&x| x == 0.0));
        }
    }
    // A key hidden from every query gets zero dk and dv.
    let mut m = vec![true; 5 * 7];
    for i in 0..5 {
        m[i * 7 + 3] = false;
    }
    let mut s = Setup::new(dims(1, 1, 1, 5, 7, 8));
    s.mask = Some((m, 1, 1, true));
    let r = check("hidden key", &s);
    assert!(
        r.dk[3 * 8..4 * 8]
            .iter()
            .chain(&r.dv[3 * 8..4 * 8])
            .all(|&x| x == 0.0)
    );
    // Mask combined with causal and a window.
    let mut s = Setup::new(dims(1, 2, 1, 17, 17, 16));
    s.mask = Some((mask_values(42, 1, 17, 17, &[3]), 1, 1, true));
    s.causal = true;
    s.window_left = Some(6);
    check("mask + causal + window", &s);
}

#[test]
fn u8_and_i32_masks_mean_nonzero_is_visible() {
    let e = engine();
    let s = Setup::new(dims(1, 1, 1, 4, 6, 8));
    let data = s.data();
    let (q, _) = upload(&s, &data[0], 1, 4, DType::F32);
    let (k, _) = upload(&s, &data[1], 1, 6, DType::F32);
    let (v, _) = upload(&s, &data[2], 1, 6, DType::F32);
    let raw: Vec<u8> = (0..24).map(|i| [0u8, 1, 255, 7][i % 4]).collect();
    let as_u8 = mask_from_u8(e, &raw, &[4, 6]).unwrap();
    let as_i32 = Tensor::from_slice(
        e,
        &raw.iter().map(|&x| -i32::from(x)).collect::<Vec<_>>(),
        &[4, 6],
    )
    .unwrap();
    let as_bool =
        mask_from_bools(e, &raw.iter().map(|&x| x != 0).collect::<Vec<_>>(), &[4, 6]).unwrap();
    let outputs: Vec<Vec<u32>> = [as_u8, as_i32, as_bool]
        .into_iter()
        .map(|m| {
            let options = AttentionOptions {
                mask: Some(m),
                ..Default::default()
            };
            common::f32_bits(&attention_forward(&q, &k, &v, &options).unwrap().0)
        })
        .collect();
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[0], outputs[2]);
}

#[test]
fn sliding_windows() {
    for (left, right, causal) in [
        (Some(3), Some(2), false),
        (Some(4), None, true),
        (None, Some(1), false),
        (Some(0), Some(0), false),
    ] {
        let mut s = Setup::new(dims(1, 2, 1, 20, 37, 16));
        s.window_left = left;
        s.window_right = right;
        s.causal = causal;
        s.seed = 50;
        check(&format!("window {left:?} {right:?} causal {causal}"), &s);
    }
    // Top-left aligned window.
    let mut s = Setup::new(dims(1, 1, 1, 33, 20, 16));
    s.window_left = Some(2);
    s.window_right = Some(5);
    s.offset = Some(0);
    check("window, offset 0", &s);
}

#[test]
fn dilated_windows_and_neighborhoods() {
    // Dilation alone, with a one-sided window and causal, and top-left aligned.
    for (dilation, left, right, causal, dtype) in [
        (3, None, None, false, DType::F32),
        (2, Some(9), None, true, DType::BF16),
        (5, Some(20), Some(20), false, DType::F16),
        (1, Some(4), Some(4), false, DType::F32),
    ] {
        let mut s = Setup::new(dims(1, 2, 1, 70, 90, 16));
        s.dilation = Some(dilation);
        s.window_left = left;
        s.window_right = right;
        s.causal = causal;
        s.dtype = dtype;
        s.seed = 51;
        check(
            &format!("dilation {dilation} window {left:?} {right:?} causal {causal}"),
            &s,
        );
    }
    // `AttentionOptions::neighborhood`: Liger's mask, [start, end) = [max(0, i − r),
    // min(S, i + r + 1)) with r = (kernel_size / 2)·dilation and (j − i) a multiple of the
    // dilation, built here as a boolean mask: the same bits.
    let e = engine();
    for (kernel_size, dilation, len) in [(1, 1, 9), (3, 1, 40), (7, 2, 130), (5, 3, 67), (9, 9, 20)]
    {
        let d = dims(2, 2, 2, len, len, 8);
        let data = Setup::new(d).data();
        let up = |x: &[f64], h| common::tensor_from_f64(e, x, &[2, h, len, 8], DType::F32);
        let (q, k, v) = (up(&data[0], 2), up(&data[1], 2), up(&data[2], 2));
        let r = (kernel_size / 2) * dilation;
        let visible: Vec<bool> = (0..len * len)
            .map(|at| {
                let (i, j) = (at / len, at % len);
                let (start, end) = (i.saturating_sub(r), (i + r + 1).min(len));
                (start..end).contains(&j) && j.abs_diff(i) % dilation == 0
            })
            .collect();
        let masked = AttentionOptions {
            mask: Some(mask_from_bools(e, &visible, &[len, len]).unwrap()),
            ..Default::default()
        };
        let near = AttentionOptions::neighborhood(kernel_size, dilation).unwrap();
        let (want, _) = attention_forward(&q, &k, &v, &masked).unwrap();
        let (got, saved) = attention_forward(&q, &k, &v, &near).unwrap();
        assert_eq!(
            bits(&got),
            bits(&want),
            "kernel {kernel_size} dilation {dilation}"
        );
        let (_, want_saved) = attention_forward(&q, &k, &v, &masked).unwrap();
        let go = up(&data[3], 2);
        let g = attention_backward(&saved, &go).unwrap();
        let w = attention_backward(&want_saved, &go).unwrap();
        for (name, a, b) in [
            ("dq", &g.query, &w.query),
            ("dk", &g.key, &w.key),
            ("dv", &g.value, &w.value),
        ] {
            assert_eq!(
                bits(a),
                bits(b),
                "kernel {kernel_size} dilation {dilation} {name}"
            );
        }
    }
    for (kernel_size, dilation) in [(4, 1), (0, 1), (3, 0), (5, usize::MAX)] {
        match AttentionOptions::neighborhood(kernel_size, dilation) {
            Err(Error::InvalidValue { .. }) => {}
            other => panic!("kernel {kernel_size} dilation {dilation}: {other:?}"),
        }
    }
    // A dilation past 2²⁴ (or 0 set directly) is refused by the forward.
    let q = zeros(&[1, 1, 4, 8], DType::F32);
    for dilation in [0, (1 << 24) + 1] {
        let o = AttentionOptions {
            dilation: Some(dilation),
            ..Default::default()
        };
        assert!(matches!(
            forward_err(&q, &q, &q, &o),
            Error::InvalidValue { .. }
        ));
    }
}

#[test]
fn lengths_that_are_not_tile_multiples() {
    for (q_len, k_len) in [(1, 1), (1, 17), (17, 65), (65, 200), (200, 1), (200, 200)] {
        let mut s = Setup::new(dims(1, 1, 1, q_len, k_len, 16));
        s.seed = 60 + q_len as u64;
        check(&format!("q_len {q_len} k_len {k_len}"), &s);
    }
    let mut s = Setup::new(dims(1, 2, 1, 200, 200, 16));
    s.causal = true;
    s.dtype = DType::BF16;
    s.grad_dtype = DType::BF16;
    check("200 causal bf16", &s);
}

#[test]
fn head_dims_8_to_256() {
    for d in [8, 32, 72, 128, 256] {
        let mut s = Setup::new(dims(1, 2, 1, 5, 18, d));
        s.causal = true;
        s.seed = 70 + d as u64;
        check(&format!("head dim {d}"), &s);
    }
    let mut s = Setup::new(dims(1, 1, 1, 3, 17, 256));
    s.dtype = DType::BF16;
    s.grad_dtype = DType::BF16;
    check("head dim 256 bf16", &s);
}

#[test]
fn explicit_scale() {
    let mut s = Setup::new(dims(1, 2, 2, 9, 13, 16));
    s.scale = Some(0.9);
    s.causal = true;
    check("scale 0.9", &s);
}

#[test]
fn a_1e4_score_offset_keeps_the_result() {
    // Entries on a 1/32 grid make every score exact in FP32 even with the offset, so the
    // offset can only change the result through the softmax's own arithmetic: component 0 of
    // every query is 100 and of every key 100 (score + 1e4) or 0 (no offset).
    let base = Setup::new(dims(1, 2, 1, 12, 19, 32));
    let mut rng = Rng::new(80);
    let mut grid = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| (rng.uniform(-32.0, 32.0)).round() / 32.0)
            .collect()
    };
    let mut q = grid(base.q_count());
    let k0 = grid(base.k_count());
    let v = grid(base.k_count());
    let go = grid(base.q_count());
    for row in q.chunks_mut(32) {
        row[0] = 100.0;
    }
    let mut k_shift = k0.clone();
    let mut k_plain = k0;
    for (a, b) in k_shift.chunks_mut(32).zip(k_plain.chunks_mut(32)) {
        a[0] = 100.0;
        b[0] = 0.0;
    }
    for dtype in [DType::F32, DType::BF16] {
        let mut s = base.clone();
        s.dtype = dtype;
        s.causal = true;
        let shifted = check_with(
            "1e4 offset",
            &s,
            &[q.clone(), k_shift.clone(), v.clone(), go.clone()],
        );
        let plain = run_with(&s, &[q.clone(), k_plain.clone(), v.clone(), go.clone()]);
        let f32_tol = Tolerance::for_dtype(DType::F32);
        assert_close(
            "offset: output",
            &shifted.output,
            &plain.output,
            Tolerance::for_dtype(dtype),
        );
        assert_close(
            "offset: output_f32",
            &shifted.output_f32,
            &plain.output_f32,
            f32_tol,
        );
        assert_close("offset: dv", &shifted.dv, &plain.dv, f32_tol);
        assert_close("offset: dk", &shifted.dk, &plain.dk, f32_tol);
        // The raw maximum carries the offset; the log denominator does not change.
        for (a, b) in shifted.row_max.iter().zip(&plain.row_max) {
            assert_eq!(*a, *b + 1e4);
        }
        assert_close("offset: log_den", &shifted.log_den, &plain.log_den, f32_tol);
    }
}

#[test]
fn batch_seq_head_layout_reads_in_place() {
    for dtype in [DType::F32, DType::F16] {
        let mut s = Setup::new(dims(2, 4, 2, 17, 21, 24));
        s.causal = true;
        s.dtype = dtype;
        s.grad_dtype = dtype;
        s.seed = 90;
        let a = check(
            &format!("bshd {dtype}"),
            &Setup {
                layout: AttentionLayout::BatchSeqHead,
                ..s.clone()
            },
        );
        // Same arithmetic in the same order: identical values to the [B,H,S,D] run.
        let b = run(&s);
        assert_eq!(a.output, b.output);
        assert_eq!(a.output_f32, b.output_f32);
        assert_eq!(a.row_max, b.row_max);
        assert_eq!(a.dq, b.dq);
        assert_eq!(a.dk, b.dk);
        assert_eq!(a.dv, b.dv);
    }
    // With a mask.
    let mut s = Setup::new(dims(2, 2, 1, 9, 11, 16));
    s.mask = Some((mask_values(91, 2, 9, 11, &[4]), 2, 1, false));
    s.layout = AttentionLayout::BatchSeqHead;
    check("bshd masked", &s);
}

#[test]
fn reruns_are_bit_identical() {
    for dtype in [DType::F32, DType::BF16] {
        let mut s = Setup::new(dims(2, 4, 1, 40, 45, 24));
        s.causal = true;
        s.dtype = dtype;
        s.grad_dtype = dtype;
        s.window_left = Some(30);
        let first = run(&s);
        let second = run(&s);
        assert_eq!(first.bits, second.bits, "{dtype}");
    }
}

#[test]
fn query_block_order_does_not_change_the_bits() {
    // The launches take a head's query blocks from the last one down by default; in
    // increasing order every workgroup computes the same values.
    for (causal, dtype) in [(true, DType::F32), (false, DType::BF16)] {
        let mut s = Setup::new(dims(2, 4, 2, 150, 140, 32));
        s.causal = causal;
        s.dtype = dtype;
        s.grad_dtype = dtype;
        let last_first = run(&s);
        wgrad::attention::force_ascending_blocks(true);
        let ascending = run(&s);
        wgrad::attention::force_ascending_blocks(false);
        assert!(last_first.bits == ascending.bits, "causal {causal} {dtype}");
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    let d = dims(1, 2, 1, 3, 5, 8);
    let mut s = Setup::new(d);
    s.causal = true;
    s.window_left = Some(3);
    s.mask = Some((mask_values(100, 1, 3, 5, &[]), 1, 1, true));
    let vis = s.visibility();
    for vis in [vis, Visibility::full(&d)] {
        let [q, k, v, go] = s.data();
        let (dq, dk, dv) = reference::backward(&q, &k, &v, &go, &d, &vis);
        let c = check_vjp(
            |x| reference::forward(x, &k, &v, &d, &vis).output,
            &q,
            &go,
            &dq,
        );
        assert!(c.passed, "dq: {c}");
        let c = check_vjp(
            |x| reference::forward(&q, x, &v, &d, &vis).output,
            &k,
            &go,
            &dk,
        );
        assert!(c.passed, "dk: {c}");
        let c = check_vjp(
            |x| reference::forward(&q, &k, x, &d, &vis).output,
            &v,
            &go,
            &dv,
        );
        assert!(c.passed, "dv: {c}");
    }
}

#[test]
fn empty_lengths() {
    // No keys: every row sees nothing.
    let s = Setup::new(dims(1, 2, 1, 5, 0, 8));
    let r = check("k_len 0", &s);
    assert!(r.output.iter().chain(&r.dq).all(|&x| x == 0.0));
    // No queries: zero key/value gradients.
    let s = Setup::new(dims(1, 2, 1, 0, 6, 8));
    let r = check("q_len 0", &s);
    assert!(r.dk.iter().chain(&r.dv).all(|&x| x == 0.0));
    check("batch 0", &Setup::new(dims(0, 2, 1, 3, 6, 8)));
    // 16-bit gradients of empty lengths: zeros (no keys) and empty tensors (no queries).
    let e = engine();
    for (q_len, k_len) in [(5usize, 0usize), (0, 6)] {
        let q = Tensor::zeros(e, &[1, 2, q_len, 8], DType::BF16).unwrap();
        let k = Tensor::zeros(e, &[1, 1, k_len, 8], DType::BF16).unwrap();
        let (_, saved) = attention_forward(&q, &k, &k, &AttentionOptions::default()).unwrap();
        let g = attention_backward_as(&saved, &q, DType::BF16).unwrap();
        for t in [&g.query, &g.key, &g.value] {
            assert_eq!(t.dtype(), DType::BF16);
            assert!(t.to_f64().unwrap().iter().all(|&x| x == 0.0));
        }
        assert_eq!((g.query.len(), g.key.len()), (2 * q_len * 8, k_len * 8));
    }
}

#[test]
fn workspace_query_and_bound() {
    assert_eq!(attention_workspace_bytes(2, 4, 10), 2 * 4 * 10 * 16);
    let e = private_engine();
    let q = Tensor::zeros(&e, &[1, 2, 10, 8], DType::F32).unwrap();
    let k = Tensor::zeros(&e, &[1, 1, 7, 8], DType::F32).unwrap();
    let (_, saved) = attention_forward(&q, &k, &k, &AttentionOptions::default()).unwrap();
    e.set_workspace_bound(attention_workspace_bytes(1, 2, 10) - 1);
    match attention_backward(&saved, &q) {
        Err(Error::WorkspaceExceeded { needed, bound, .. }) => {
            assert_eq!((needed, bound), (320, 319));
        }
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
    e.set_workspace_bound(320);
    assert!(attention_backward(&saved, &q).is_ok());
}

#[test]
fn flop_count() {
    assert_eq!(
        attention_flops(2, 3, 4, 5, 8, false),
        4.0 * 6.0 * 20.0 * 8.0
    );
    // Square causal: 1 + 2 + 3 + 4 pairs per head.
    assert_eq!(attention_flops(1, 1, 4, 4, 8, true), 4.0 * 10.0 * 8.0);
    // Suffix queries see k_len − q_len + i + 1 keys.
    assert_eq!(attention_flops(1, 1, 2, 5, 8, true), 4.0 * 9.0 * 8.0);
}

fn zeros(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(engine(), shape, dtype).unwrap()
}

fn forward_err(q: &Tensor, k: &Tensor, v: &Tensor, options: &AttentionOptions) -> Error {
    attention_forward(q, k, v, options).expect_err("bad input accepted")
}

#[test]
fn bad_inputs_give_typed_errors() {
    let f = DType::F32;
    let q = zeros(&[1, 4, 5, 16], f);
    let k = zeros(&[1, 2, 6, 16], f);
    let none = AttentionOptions::default();
    // Query heads not a multiple of key/value heads.
    let k3 = zeros(&[1, 3, 6, 16], f);
    assert!(
        matches!(forward_err(&q, &k3, &k3, &none), Error::InvalidValue { got, .. } if got == 4.0)
    );
    // Head dims: not a multiple of 8, too small, too large.
    let q12 = zeros(&[1, 2, 5, 12], f);
    let k12 = zeros(&[1, 2, 6, 12], f);
    assert!(
        matches!(forward_err(&q12, &k12, &k12, &none), Error::InvalidValue { got, .. } if got == 12.0)
    );
    let q264 = zeros(&[1, 1, 2, 264], f);
    let k264 = zeros(&[1, 1, 2, 264], f);
    assert!(matches!(
        forward_err(&q264, &k264, &k264, &none),
        Error::OutOfBounds {
            got: 264,
            min: 8,
            max: 256,
            ..
        }
    ));
    let q0 = zeros(&[1, 1, 2, 0], f);
    assert!(matches!(
        forward_err(&q0, &q0, &q0, &none),
        Error::OutOfBounds { got: 0, .. }
    ));
    // Mask shape wrong: transposed, wrong batch, wrong rank.
    for shape in [
        vec![6, 5],
        vec![2, 1, 5, 6],
        vec![1, 3, 5, 6],
        vec![5, 6, 1],
    ] {
        let n: usize = shape.iter().product();
        let m = mask_from_bools(engine(), &vec![true; n], &shape).unwrap();
        let options = AttentionOptions {
            mask: Some(m),
            ..Default::default()
        };
        assert!(
            matches!(forward_err(&q, &k, &k, &options), Error::ShapeMismatch { ref got, .. } if *got == shape),
            "mask {shape:?}"
        );
    }
    // Mask dtype.
    let options = AttentionOptions {
        mask: Some(zeros(&[5, 6], f)),
        ..Default::default()
    };
    assert!(matches!(
        forward_err(&q, &k, &k, &options),
        Error::UnsupportedDType {
            got: DType::F32,
            ..
        }
    ));
    // Dtypes: integer query, key of another dtype.
    let qi = Tensor::from_slice(engine(), &vec![0u32; 4 * 5 * 16], &[1, 4, 5, 16]).unwrap();
    assert!(matches!(
        forward_err(&qi, &k, &k, &none),
        Error::UnsupportedDType {
            got: DType::U32,
            ..
        }
    ));
    let kb = zeros(&[1, 2, 6, 16], DType::BF16);
    assert!(matches!(
        forward_err(&q, &kb, &k, &none),
        Error::UnsupportedDType {
            got: DType::BF16,
            ..
        }
    ));
    assert!(matches!(
        forward_err(&q, &k, &kb, &none),
        Error::UnsupportedDType {
            got: DType::BF16,
            ..
        }
    ));
    // Shapes: value unlike key, batch or head dim unlike the query's, rank.
    let v7 = zeros(&[1, 2, 7, 16], f);
    assert!(matches!(
        forward_err(&q, &k, &v7, &none),
        Error::ShapeMismatch { .. }
    ));
    let k_b2 = zeros(&[2, 2, 6, 16], f);
    assert!(matches!(
        forward_err(&q, &k_b2, &k_b2, &none),
        Error::ShapeMismatch { .. }
    ));
    let k_d8 = zeros(&[1, 2, 6, 8], f);
    assert!(matches!(
        forward_err(&q, &k_d8, &k_d8, &none),
        Error::ShapeMismatch { .. }
    ));
    let q3 = zeros(&[4, 5, 16], f);
    assert!(matches!(
        forward_err(&q3, &k, &k, &none),
        Error::ShapeMismatch { .. }
    ));
    // [B,S,H,D]: the same tensors now have 5 query heads on 6 key heads.
    let bshd = AttentionOptions {
        layout: AttentionLayout::BatchSeqHead,
        ..Default::default()
    };
    assert!(
        matches!(forward_err(&q, &k, &k, &bshd), Error::InvalidValue { got, .. } if got == 5.0)
    );
    // Scale and offset.
    for scale in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-60] {
        let options = AttentionOptions {
            scale: Some(scale),
            ..Default::default()
        };
        assert!(
            matches!(
                forward_err(&q, &k, &k, &options),
                Error::InvalidValue { .. }
            ),
            "scale {scale}"
        );
    }
    let options = AttentionOptions {
        causal_offset: Some(1 << 40),
        ..Default::default()
    };
    assert!(matches!(
        forward_err(&q, &k, &k, &options),
        Error::InvalidValue { .. }
    ));
    // Another engine.
    let other = private_engine();
    let k_other = Tensor::zeros(&other, &[1, 2, 6, 16], f).unwrap();
    assert!(matches!(
        forward_err(&q, &k_other, &k, &none),
        Error::EngineMismatch { .. }
    ));
    // Backward: cotangent shape, dtype, engine.
    let (_, saved) = attention_forward(&q, &k, &k, &none).unwrap();
    let wrong = zeros(&[1, 4, 6, 16], f);
    assert!(matches!(
        attention_backward(&saved, &wrong),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        attention_backward(&saved, &qi),
        Err(Error::UnsupportedDType { .. })
    ));
    let go_other = Tensor::zeros(&other, &[1, 4, 5, 16], f).unwrap();
    assert!(matches!(
        attention_backward(&saved, &go_other),
        Err(Error::EngineMismatch { .. })
    ));
}

#[test]
fn outputs_past_the_binding_limit_are_refused() {
    // An F16 query whose F32 saved output needs more than one storage binding.
    let e = private_engine();
    let max = e.max_binding_bytes();
    if max > 256 << 20 {
        eprintln!("skipped: a {max}-byte binding limit needs too large a query here");
        return;
    }
    let rows = (max / 4 / 128 + 1) as usize;
    let q = Tensor::zeros(&e, &[1, 1, rows, 128], DType::F16).unwrap();
    let k = Tensor::zeros(&e, &[1, 1, 8, 128], DType::F16).unwrap();
    match attention_forward(&q, &k, &k, &AttentionOptions::default()) {
        Err(Error::LimitExceeded { bytes, limit, .. }) => {
            assert_eq!(limit, max);
            assert_eq!(bytes, rows as u64 * 128 * 4);
        }
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
}

#[test]
fn saved_state_is_the_output_and_two_row_statistics() {
    // Nothing quadratic is kept: a forward leaves the output, the F32 output (the same tensor
    // for an F32 query) and 2 × 4 bytes per query row alive.
    let e = private_engine();
    let (q_len, k_len, d) = (64, 96, 32);
    for dtype in [DType::F32, DType::BF16] {
        let q = Tensor::zeros(&e, &[1, 2, q_len, d], dtype).unwrap();
        let k = Tensor::zeros(&e, &[1, 1, k_len, d], dtype).unwrap();
        e.synchronize().unwrap();
        let before = e.memory().live_bytes;
        let (out, saved) = attention_forward(&q, &k, &k, &AttentionOptions::default()).unwrap();
        let grew = e.memory().live_bytes - before;
        let f32_bytes = (2 * q_len * d * 4) as u64;
        let stats = 2 * (2 * q_len * 4) as u64;
        let expected = match dtype {
            DType::F32 => f32_bytes + stats,
            _ => f32_bytes / 2 + f32_bytes + stats,
        };
        assert_eq!(grew, expected, "{dtype}");
        assert_eq!(saved.output_f32().dtype(), DType::F32);
        if dtype == DType::F32 {
            assert_eq!(common::f32_bits(&out), common::f32_bits(saved.output_f32()));
        }
    }
}

/// `attention_backward_as` stores dq, dk and dv as the F32 gradients rounded once: bit for bit
/// `cast::cast` of [`attention_backward`]'s (a NaN as any NaN), every input dtype into every
/// gradient dtype; causal with grouped queries, a full pass with ragged lengths, the
/// `[B, S, H, D]` layout, head dims 8, 72 and 128. The 16-bit gradients are written by the
/// passes that own the rows: no F32 gradient exists on the way (engine peak).
#[test]
fn attention_backward_as_is_the_f32_gradient_rounded_once() {
    let e = engine();
    let narrowed = |t: &Tensor, d: DType| {
        if d == DType::F32 {
            t.clone()
        } else {
            wgrad::cast::cast(t, d).unwrap()
        }
    };
    // (batch, q heads, kv heads, q len, k len, head dim, causal, [B, S, H, D])
    let cases = [
        (
            1usize, 4usize, 2usize, 17usize, 17usize, 8usize, true, false,
        ),
        (1, 2, 2, 65, 40, 72, false, true),
        (1, 2, 1, 33, 33, 128, true, false),
    ];
    let mut rng = Rng::new(700);
    for (b, hq, hk, sq, sk, d, causal, bshd) in cases {
        let layout = if bshd {
            AttentionLayout::BatchSeqHead
        } else {
            AttentionLayout::BatchHeadSeq
        };
        let shape = |h: usize, s: usize| {
            if bshd {
                vec![b, s, h, d]
            } else {
                vec![b, h, s, d]
            }
        };
        let options = AttentionOptions {
            causal,
            layout,
            ..AttentionOptions::default()
        };
        for dtype in DType::FLOATS {
            let up = |h: usize, s: usize, rng: &mut Rng| {
                common::tensor_from_f64(e, &rng.vec(b * h * s * d, -1.0, 1.0), &shape(h, s), dtype)
            };
            let (q, k, v, go) = (
                up(hq, sq, &mut rng),
                up(hk, sk, &mut rng),
                up(hk, sk, &mut rng),
                up(hq, sq, &mut rng),
            );
            let (_, saved) = attention_forward(&q, &k, &v, &options).unwrap();
            let want = attention_backward(&saved, &go).unwrap();
            for out in DType::FLOATS {
                let what = format!(
                    "b{b} hq{hq} hk{hk} {sq}x{sk} d{d} causal {causal} bshd {bshd} {dtype} -> {out}"
                );
                let got = attention_backward_as(&saved, &go, out).unwrap();
                for (name, g, w) in [
                    ("dq", &got.query, &want.query),
                    ("dk", &got.key, &want.key),
                    ("dv", &got.value, &want.value),
                ] {
                    assert_eq!(g.dtype(), out, "{what} {name}");
                    assert_eq!(g.shape(), w.shape(), "{what} {name}");
                    common::assert_same_bits(&format!("{what} {name}"), g, &narrowed(w, out));
                }
                if out == DType::BF16 {
                    let again = attention_backward_as(&saved, &go, out).unwrap();
                    assert_eq!(bits(&again.key), bits(&got.key), "{what} rerun");
                }
            }
        }
    }
    // No F32 gradient on the direct path: the peak grows by the BF16 gradients and the row
    // scratch only.
    let private = private_engine();
    let (b, h, s, d) = (1usize, 2usize, 64usize, 64usize);
    let up = |rng: &mut Rng| {
        common::tensor_from_f64(
            &private,
            &rng.vec(b * h * s * d, -1.0, 1.0),
            &[b, h, s, d],
            DType::BF16,
        )
    };
    let (q, k, v) = (up(&mut rng), up(&mut rng), up(&mut rng));
    let (_, saved) = attention_forward(&q, &k, &v, &AttentionOptions::default()).unwrap();
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let got = attention_backward_as(&saved, &q, DType::BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let direct = (3 * b * h * s * d * 2) as u64 + attention_workspace_bytes(b, h, s);
    assert!(
        grown <= direct * 9 / 8 + 4096,
        "peak grew {grown} bytes for {direct}"
    );
    drop(got);
    match attention_backward_as(&saved, &q, DType::I32) {
        Err(Error::UnsupportedDType { .. }) => {}
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
}

/// `BackwardSchedule::StoredScores` gives the default schedule's gradients bit for bit: slices
/// of one group, of two (the last one shorter) and of every group; grouped queries with batches,
/// causal (both offsets, fewer queries than keys), a mask with fully masked rows and a window,
/// ragged lengths, head dims 8 to 128, the `[B, S, H, D]` layout, 16-bit inputs and
/// gradients, empty lengths; its scratch is one slice's tiles (engine peak); a budget below one
/// group's tiles is a typed error.
/// The first setups of the schedule and layout comparisons: causal grouped queries with
/// batches (head dim 8), and `[B,S,H,D]` BF16 inputs and gradients with fewer queries than
/// keys (head dim 72).
fn schedule_setups() -> Vec<Setup> {
    let mut causal = Setup::new(dims(2, 4, 2, 17, 17, 8));
    causal.causal = true;
    let mut bshd = Setup::new(dims(1, 4, 1, 65, 130, 72));
    bshd.layout = AttentionLayout::BatchSeqHead;
    bshd.dtype = DType::BF16;
    bshd.grad_dtype = DType::BF16;
    vec![causal, bshd]
}

#[test]
fn stored_score_gradients_give_the_recompute_bits() {
    let mut setups = schedule_setups();
    let mut s = Setup::new(dims(1, 2, 1, 17, 17, 16));
    s.mask = Some((mask_values(42, 1, 17, 17, &[3]), 1, 1, true));
    s.causal = true;
    s.window_left = Some(6);
    setups.push(s);
    let mut s = Setup::new(dims(3, 3, 3, 40, 100, 32));
    s.causal = true;
    s.offset = Some(0);
    s.dtype = DType::F16;
    setups.push(s);
    let mut s = Setup::new(dims(1, 2, 1, 70, 70, 128));
    s.causal = true;
    setups.push(s);
    setups.push(Setup::new(dims(1, 2, 1, 5, 0, 8)));
    setups.push(Setup::new(dims(1, 2, 1, 0, 6, 8)));
    for (n, s) in setups.iter().enumerate() {
        let d = &s.dims;
        let data = s.data();
        let (q, _) = upload(s, &data[0], d.q_heads, d.q_len, s.dtype);
        let (k, _) = upload(s, &data[1], d.kv_heads, d.k_len, s.dtype);
        let (v, _) = upload(s, &data[2], d.kv_heads, d.k_len, s.dtype);
        let (go, _) = upload(s, &data[3], d.q_heads, d.q_len, s.grad_dtype);
        let (_, saved) = attention_forward(&q, &k, &v, &s.options()).unwrap();
        let per_group = stored_scores_bytes_per_group(d.q_heads, d.kv_heads, d.q_len, d.k_len);
        for grads in [DType::F32, s.grad_dtype] {
            let want = attention_backward_as(&saved, &go, grads).unwrap();
            for budget in [per_group, 2 * per_group + 1, u64::MAX] {
                let schedule = BackwardSchedule::StoredScores { budget };
                let got = attention_backward_with(&saved, &go, grads, schedule).unwrap();
                for (name, g, w) in [
                    ("dq", &got.query, &want.query),
                    ("dk", &got.key, &want.key),
                    ("dv", &got.value, &want.value),
                ] {
                    assert_eq!((g.dtype(), g.shape()), (grads, w.shape()));
                    assert_eq!(
                        bits(g),
                        bits(w),
                        "setup {n} {d:?} grads {grads} budget {budget}: {name}"
                    );
                }
            }
        }
        if per_group > 0 {
            let schedule = BackwardSchedule::StoredScores {
                budget: per_group - 1,
            };
            match attention_backward_with(&saved, &go, DType::F32, schedule) {
                Err(Error::WorkspaceExceeded { .. }) => {}
                other => panic!("setup {n}: expected WorkspaceExceeded, got {other:?}"),
            }
        }
    }
    // Scratch: one slice's tiles beside the gradients and the row scratch.
    let e = private_engine();
    let (b, hq, hk, sq, sk, d) = (2usize, 2usize, 1usize, 70usize, 90usize, 16usize);
    let mut rng = Rng::new(77);
    let mut up = |h: usize, len: usize| {
        common::tensor_from_f64(
            &e,
            &rng.vec(b * h * len * d, -1.0, 1.0),
            &[b, h, len, d],
            DType::F32,
        )
    };
    let (q, k, v, go) = (up(hq, sq), up(hk, sk), up(hk, sk), up(hq, sq));
    let (_, saved) = attention_forward(&q, &k, &v, &AttentionOptions::default()).unwrap();
    let per_group = stored_scores_bytes_per_group(hq, hk, sq, sk);
    assert_eq!(per_group, (2 * 2 * 2 * 64 * 64 * 4) as u64);
    let gradients = (4 * (b * hq * sq * d + 2 * b * hk * sk * d)) as u64;
    let rows = attention_workspace_bytes(b, hq, sq);
    // Bytes the engine grows by during a stored-schedule backward (its gradients included).
    let growth = |saved: &AttentionSaved, go: &Tensor, budget: u64| -> u64 {
        e.synchronize().unwrap();
        let before = e.memory().live_bytes;
        e.reset_peak();
        let schedule = BackwardSchedule::StoredScores { budget };
        let g = attention_backward_with(saved, go, DType::F32, schedule).unwrap();
        e.synchronize().unwrap();
        let grown = e.memory().peak_bytes - before;
        drop(g);
        grown
    };
    for (budget, slice) in [(per_group, per_group), (u64::MAX, 2 * per_group)] {
        let grown = growth(&saved, &go, budget);
        // (Launch parameters add a few hundred bytes a launch.)
        let want = gradients + rows + slice;
        assert!(
            (want..want + 8192).contains(&grown),
            "budget {budget}: grew {grown}, want {want}"
        );
    }
    // The budget bounds the scratch as the engine's pool allocates it (rounded up to a size
    // class): nine one-tile groups within nine tiles' bytes take two slices of five, since one
    // buffer of nine tiles (144 KiB) would be rounded up to 160 KiB.
    {
        let (b9, len, d9) = (9usize, 40usize, 8usize);
        let up = |seed: u64| {
            let mut rng = Rng::new(seed);
            common::tensor_from_f64(
                &e,
                &rng.vec(b9 * len * d9, -1.0, 1.0),
                &[b9, 1, len, d9],
                DType::F32,
            )
        };
        let (q, k, v, go) = (up(1), up(2), up(3), up(4));
        let (_, saved) = attention_forward(&q, &k, &v, &AttentionOptions::default()).unwrap();
        let tile = stored_scores_bytes_per_group(1, 1, len, len);
        assert_eq!(tile, 16384);
        let budget = 9 * tile;
        let grown = growth(&saved, &go, budget);
        let want =
            (4 * 3 * b9 * len * d9) as u64 + attention_workspace_bytes(b9, 1, len) + 5 * tile;
        assert!(
            (want..want + 8192).contains(&grown),
            "budget {budget}: grew {grown}, want {want}"
        );
    }
    // The workspace bound caps the budget.
    e.set_workspace_bound(rows + per_group - 1);
    match attention_backward_with(
        &saved,
        &go,
        DType::F32,
        BackwardSchedule::StoredScores { budget: u64::MAX },
    ) {
        Err(Error::WorkspaceExceeded { needed, bound, .. }) => {
            assert_eq!((needed, bound), (rows + per_group, rows + per_group - 1));
        }
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
}

/// An engine on an app's device with 16 KiB of workgroup memory (WebGPU's default) and the
/// adapter's other limits and wanted features: attention takes its compact layout there.
fn compact_engine() -> Engine {
    let adapter = common::app_adapter();
    let (device, queue) = common::app_device(
        &adapter,
        &wgpu::DeviceDescriptor {
            label: Some("16 KiB of workgroup memory"),
            // (Not cooperative matrices: an experimental feature the request would have to
            // enable, and attention does not use it.)
            required_features: adapter.features()
                & wgrad::engine::WANTED_FEATURES
                & !wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            required_limits: wgpu::Limits {
                max_compute_workgroup_storage_size: 16 << 10,
                ..adapter.limits()
            },
            ..Default::default()
        },
    );
    Engine::from_wgpu(device, queue).unwrap()
}

/// The bits of a forward and a backward of `s` on `e`: output, saved F32 output, row maxima,
/// log denominators, dq, dk, dv.
fn bits_on(e: &Engine, s: &Setup, grads: DType, schedule: BackwardSchedule) -> Vec<Vec<u32>> {
    let d = &s.dims;
    let data = s.data();
    let (q, _) = upload_on(e, s, &data[0], d.q_heads, d.q_len, s.dtype);
    let (k, _) = upload_on(e, s, &data[1], d.kv_heads, d.k_len, s.dtype);
    let (v, _) = upload_on(e, s, &data[2], d.kv_heads, d.k_len, s.dtype);
    let (go, _) = upload_on(e, s, &data[3], d.q_heads, d.q_len, s.grad_dtype);
    let (out, saved) = attention_forward(&q, &k, &v, &s.options_on(e)).unwrap();
    let g = attention_backward_with(&saved, &go, grads, schedule).unwrap();
    [
        &out,
        saved.output_f32(),
        saved.row_max(),
        saved.log_denominator(),
        &g.query,
        &g.key,
        &g.value,
    ]
    .iter()
    .map(|t| bits(t))
    .collect()
}

#[test]
fn the_compact_layout_gives_the_bits_of_the_full_tiles() {
    // With less workgroup memory than `WORKGROUP_BYTES` every pass holds its probability and
    // score-gradient tiles 32 columns at a time (`COMPACT_WORKGROUP_BYTES`, 16 KiB): the same
    // products in the same order, so the bits of the full 64-column tiles, for the forward,
    // both backward schedules, one to four 64-column head-dim chunks and ragged lengths.
    let compact = compact_engine();
    let limit = compact.info().limits.max_compute_workgroup_storage_size;
    assert!(u64::from(limit) < wgrad::attention::WORKGROUP_BYTES);
    assert_eq!(u64::from(limit), wgrad::attention::COMPACT_WORKGROUP_BYTES);
    let mut setups = schedule_setups();
    let mut s = Setup::new(dims(1, 2, 1, 70, 70, 128));
    s.causal = true;
    s.window_left = Some(40);
    s.dtype = DType::F16;
    setups.push(s);
    let mut s = Setup::new(dims(1, 2, 2, 33, 100, 192));
    s.mask = Some((mask_values(5, 1, 33, 100, &[7]), 1, 1, true));
    setups.push(s);
    let mut s = Setup::new(dims(1, 1, 1, 64, 64, 256));
    s.dtype = DType::BF16;
    setups.push(s);
    setups.push(Setup::new(dims(1, 2, 1, 130, 129, 64)));
    for (n, s) in setups.iter().enumerate() {
        for grads in [DType::F32, s.grad_dtype] {
            for schedule in [
                BackwardSchedule::Recompute,
                BackwardSchedule::StoredScores { budget: u64::MAX },
            ] {
                let want = bits_on(engine(), s, grads, schedule);
                let got = bits_on(&compact, s, grads, schedule);
                for (i, name) in ["out", "out_f32", "row_max", "log_den", "dq", "dk", "dv"]
                    .iter()
                    .enumerate()
                {
                    assert!(
                        got[i] == want[i],
                        "setup {n} {:?} grads {grads} {schedule:?}: {name}",
                        s.dims
                    );
                }
            }
        }
    }
}

#[test]
fn the_stored_schedule_recomputes_on_an_eight_buffer_device() {
    // `attention_dkdv_store` binds nine storage buffers: on a device with WebGPU's default
    // eight the stored schedule recomputes: the default schedule's bits and memory, and a
    // budget below one group's tiles is no error.
    let small = common::webgpu_default_engine();
    assert_eq!(small.info().limits.max_storage_buffers_per_shader_stage, 8);
    let mut s = Setup::new(dims(2, 4, 2, 70, 90, 40));
    s.causal = true;
    s.dtype = DType::BF16;
    s.grad_dtype = DType::BF16;
    // Bits and the engine's peak bytes of a forward and backward.
    let run = |schedule| {
        small.synchronize().unwrap();
        small.reset_peak();
        let bits = bits_on(&small, &s, DType::F32, schedule);
        small.synchronize().unwrap();
        (bits, small.memory().peak_bytes)
    };
    let want = run(BackwardSchedule::Recompute);
    for budget in [0, u64::MAX] {
        let got = run(BackwardSchedule::StoredScores { budget });
        assert!(
            got == want,
            "budget {budget}: peak {} against {}",
            got.1,
            want.1
        );
    }
}
