//! Manifold-constrained hyper-connections (`wgrad::mhc`): the coefficients (h_pre, h_post,
//! h_res), the pre-aggregation and the post + residual mix against the f64 reference, outputs
//! and every gradient, in every storage dtype (x, f_out, phi, b, the gains, the h inputs and
//! the cotangents each of its own dtype), 1 to 16 streams, widths 1 to 300+, leading token
//! axes; the reference against finite differences; absent cotangents; zero tokens;
//! bit-identical reruns; every documented bad input's typed error.

mod common;

use common::{Rng, assert_close, engine, expect_err, value_bits};
use wgrad::gradcheck::{Tolerance, check_vjp, stored_values, tensor_from_f64};
use wgrad::mhc::{
    MAX_SINKHORN_ITERATIONS, MAX_STREAMS, MhcOptions, mhc_coefficients, mhc_coefficients_backward,
    mhc_coefficients_backward_as, mhc_coefficients_backward_workspace_bytes, mhc_post_res,
    mhc_post_res_backward, mhc_post_res_backward_as, mhc_pre, mhc_pre_backward,
    mhc_pre_backward_as,
};
use wgrad::reference::mhc::{self as reference, MhcConfig};
use wgrad::{DType, Engine, Error, Tensor};

const F32: DType = DType::F32;
const F16: DType = DType::F16;
const BF16: DType = DType::BF16;

fn config(tokens: usize, n: usize, c: usize, o: &MhcOptions) -> MhcConfig {
    MhcConfig {
        tokens,
        n,
        c,
        tmax: o.tmax as usize,
        rms_eps: f64::from(o.rms_eps),
        pre_eps: f64::from(o.pre_eps),
        sinkhorn_eps: f64::from(o.sinkhorn_eps),
        post_mult: f64::from(o.post_mult),
    }
}

fn shape(lead: &[usize], tail: &[usize]) -> Vec<usize> {
    [lead, tail].concat()
}

/// Random values uploaded as `dtype`: the tensor and the values it holds.
fn upload(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64, dtype: DType) -> (Tensor, Vec<f64>) {
    let len = shape.iter().product();
    tensor_from_f64(engine(), &rng.vec(len, lo, hi), shape, dtype).unwrap()
}

/// The dtypes of one coefficients case: x, phi, b, the gains, the cotangents.
#[derive(Debug, Clone, Copy)]
struct CoefficientDtypes {
    x: DType,
    phi: DType,
    b: DType,
    alphas: DType,
    grads: DType,
}

impl CoefficientDtypes {
    fn all(dtype: DType) -> Self {
        CoefficientDtypes {
            x: dtype,
            phi: dtype,
            b: dtype,
            alphas: dtype,
            grads: dtype,
        }
    }
}

/// Which cotangents a backward is given.
#[derive(Debug, Clone, Copy)]
struct Given {
    pre: bool,
    post: bool,
    res: bool,
}

const ALL: Given = Given {
    pre: true,
    post: true,
    res: true,
};

/// Run the coefficients forward and backward and compare every output and gradient with the
/// reference; rerun both and require the same bits.
fn coefficients_case(
    seed: u64,
    lead: &[usize],
    n: usize,
    c: usize,
    dt: CoefficientDtypes,
    o: &MhcOptions,
    given: Given,
) {
    let what = format!("lead {lead:?} HC {n} C {c} {dt:?} {o:?} {given:?}");
    let tokens: usize = lead.iter().product();
    let cfg = config(tokens, n, c, o);
    let (k, m) = (cfg.k(), cfg.m());
    let rng = &mut Rng::new(seed);
    let (x, xs) = upload(rng, &shape(lead, &[n, c]), -1.0, 1.0, dt.x);
    let scale = 1.0 / (k as f64).sqrt();
    let (phi, phis) = upload(rng, &[k, m], -2.0 * scale, 2.0 * scale, dt.phi);
    let (b, bs) = upload(rng, &[m], -0.5, 0.5, dt.b);
    let (a1, a1s) = upload(rng, &[1], 0.5, 1.5, dt.alphas);
    let (a2, a2s) = upload(rng, &[1], 0.5, 1.5, dt.alphas);
    let (a3, a3s) = upload(rng, &[1], 0.5, 1.5, dt.alphas);
    let (g1, g1s) = upload(rng, &shape(lead, &[n]), -1.0, 1.0, dt.grads);
    let (g2, g2s) = upload(rng, &shape(lead, &[n]), -1.0, 1.0, dt.grads);
    let (g3, g3s) = upload(rng, &shape(lead, &[n, n]), -1.0, 1.0, dt.grads);
    let alphas = [a1s[0], a2s[0], a3s[0]];
    let (h, saved) = mhc_coefficients(&x, &phi, &b, &a1, &a2, &a3, o).unwrap();
    assert_eq!(h.h_pre.shape(), shape(lead, &[n]), "{what}");
    assert_eq!(h.h_post.shape(), shape(lead, &[n]), "{what}");
    assert_eq!(h.h_res.shape(), shape(lead, &[n, n]), "{what}");
    let want = reference::coefficients(&xs, &phis, &bs, alphas, &cfg);
    let tol = Tolerance::for_dtype(F32).scaled(10.0);
    assert_close(
        &format!("{what}: h_pre"),
        &h.h_pre.to_f64().unwrap(),
        &want.h_pre,
        tol,
    );
    assert_close(
        &format!("{what}: h_post"),
        &h.h_post.to_f64().unwrap(),
        &want.h_post,
        tol,
    );
    assert_close(
        &format!("{what}: h_res"),
        &h.h_res.to_f64().unwrap(),
        &want.h_res,
        tol,
    );
    let zeros = |v: &[f64], on: bool| if on { v.to_vec() } else { vec![0.0; v.len()] };
    let pick = |t: &Tensor, on: bool| on.then(|| t.clone());
    let (p1, p2, p3) = (
        pick(&g1, given.pre),
        pick(&g2, given.post),
        pick(&g3, given.res),
    );
    let g = mhc_coefficients_backward(&saved, p1.as_ref(), p2.as_ref(), p3.as_ref()).unwrap();
    for out in [F16, BF16] {
        let g16 = mhc_coefficients_backward_as(&saved, p1.as_ref(), p2.as_ref(), p3.as_ref(), out)
            .unwrap();
        common::assert_cast_of(
            "coefficients",
            &[
                ("d x", &g16.x, &g.x),
                ("d phi", &g16.phi, &g.phi),
                ("d b", &g16.b, &g.b),
                ("d alpha_pre", &g16.alpha_pre, &g.alpha_pre),
                ("d alpha_post", &g16.alpha_post, &g.alpha_post),
                ("d alpha_res", &g16.alpha_res, &g.alpha_res),
            ],
            out,
        );
    }
    let wg = reference::coefficients_backward(
        &xs,
        &phis,
        &bs,
        alphas,
        &zeros(&g1s, given.pre),
        &zeros(&g2s, given.post),
        &zeros(&g3s, given.res),
        &cfg,
    );
    assert_eq!(g.x.shape(), x.shape(), "{what}");
    assert_eq!(g.phi.shape(), [k, m], "{what}");
    for t in [
        &g.x,
        &g.phi,
        &g.b,
        &g.alpha_pre,
        &g.alpha_post,
        &g.alpha_res,
    ] {
        assert_eq!(t.dtype(), F32, "{what}");
    }
    assert_close(&format!("{what}: d x"), &g.x.to_f64().unwrap(), &wg.x, tol);
    assert_close(
        &format!("{what}: d phi"),
        &g.phi.to_f64().unwrap(),
        &wg.phi,
        tol,
    );
    assert_close(&format!("{what}: d b"), &g.b.to_f64().unwrap(), &wg.b, tol);
    let dalphas = [&g.alpha_pre, &g.alpha_post, &g.alpha_res].map(|t| {
        assert_eq!(t.shape(), [1], "{what}");
        t.to_f64().unwrap()[0]
    });
    assert_close(&format!("{what}: d alphas"), &dalphas, &wg.alphas, tol);
    let (h2, saved2) = mhc_coefficients(&x, &phi, &b, &a1, &a2, &a3, o).unwrap();
    for (a, b) in [
        (&h.h_pre, &h2.h_pre),
        (&h.h_post, &h2.h_post),
        (&h.h_res, &h2.h_res),
    ] {
        assert!(value_bits(a) == value_bits(b), "{what}: forward rerun");
    }
    let g2 = mhc_coefficients_backward(&saved2, p1.as_ref(), p2.as_ref(), p3.as_ref()).unwrap();
    for (a, b) in [
        (&g.x, &g2.x),
        (&g.phi, &g2.phi),
        (&g.b, &g2.b),
        (&g.alpha_pre, &g2.alpha_pre),
        (&g.alpha_post, &g2.alpha_post),
        (&g.alpha_res, &g2.alpha_res),
    ] {
        assert!(value_bits(a) == value_bits(b), "{what}: backward rerun");
    }
}

#[test]
fn coefficients_match_the_reference_in_every_dtype() {
    let o = MhcOptions::default();
    let shapes: [(&[usize], usize, usize); 6] = [
        (&[3], 1, 1),
        (&[2, 3], 2, 3),
        (&[5], 4, 127),
        (&[2], MAX_STREAMS, 3),
        (&[1, 2], 4, 300),
        (&[3], 3, 20),
    ];
    for (k, &(lead, n, c)) in shapes.iter().enumerate() {
        // A token of one value: mix = x·phi / sqrt(x² + ε) hardly depends on x, and d x is the
        // difference of two nearly equal terms; a larger ε keeps it well above their rounding.
        let o = if n * c == 1 {
            MhcOptions { rms_eps: 0.05, ..o }
        } else {
            o
        };
        for dtype in DType::FLOATS {
            let dt = CoefficientDtypes::all(dtype);
            coefficients_case(k as u64, lead, n, c, dt, &o, ALL);
        }
    }
}

#[test]
fn coefficients_take_inputs_of_independent_dtypes_and_other_options() {
    let mixed = [
        CoefficientDtypes {
            x: BF16,
            phi: F32,
            b: F16,
            alphas: F32,
            grads: BF16,
        },
        CoefficientDtypes {
            x: F16,
            phi: BF16,
            b: F32,
            alphas: BF16,
            grads: F32,
        },
        CoefficientDtypes {
            x: F32,
            phi: F16,
            b: BF16,
            alphas: F16,
            grads: F16,
        },
    ];
    for (k, dt) in mixed.into_iter().enumerate() {
        coefficients_case(
            20 + k as u64,
            &[2, 2],
            4,
            9,
            dt,
            &MhcOptions::default(),
            ALL,
        );
    }
    let options = [
        MhcOptions {
            tmax: 1,
            ..MhcOptions::default()
        },
        MhcOptions {
            tmax: 3,
            rms_eps: 1e-3,
            pre_eps: 0.25,
            sinkhorn_eps: 1e-3,
            post_mult: 1.5,
        },
        MhcOptions {
            tmax: 60,
            ..MhcOptions::default()
        },
    ];
    for (k, o) in options.iter().enumerate() {
        coefficients_case(
            30 + k as u64,
            &[3],
            4,
            10,
            CoefficientDtypes::all(F32),
            o,
            ALL,
        );
    }
}

/// Many tokens: the parameter sums finish in several levels (`reduce::sum_partials`), d phi's
/// product over the tokens may be split, the dispatch covers thousands of workgroups.
#[test]
fn many_tokens_match_the_reference() {
    let o = MhcOptions::default();
    let dt = CoefficientDtypes {
        x: BF16,
        phi: F32,
        b: F32,
        alphas: F32,
        grads: F32,
    };
    coefficients_case(50, &[3, 1500], 2, 3, dt, &o, ALL);
    // d phi = x_matᵀ · dz: [6, 8] summed over 4,500 tokens, split-K.
    assert!(wgrad::matmul::gemm_split(6, 8, 4500, 1) >= 2);
}

#[test]
fn absent_cotangents_contribute_nothing() {
    let o = MhcOptions::default();
    let cases = [
        (true, false, false),
        (false, true, false),
        (false, false, true),
        (true, false, true),
        (false, false, false),
    ];
    for (k, (pre, post, res)) in cases.into_iter().enumerate() {
        let given = Given { pre, post, res };
        coefficients_case(
            40 + k as u64,
            &[2, 2],
            2,
            7,
            CoefficientDtypes::all(BF16),
            &o,
            given,
        );
    }
}

#[test]
fn pre_matches_the_reference_in_every_dtype() {
    let shapes: [(&[usize], usize, usize); 6] = [
        (&[3], 1, 1),
        (&[2, 3], 2, 3),
        (&[5], 4, 127),
        (&[2], MAX_STREAMS, 3),
        (&[1, 2], 4, 300),
        (&[], 3, 513),
    ];
    for (k, &(lead, n, c)) in shapes.iter().enumerate() {
        let tokens: usize = lead.iter().product();
        let cfg = config(tokens, n, c, &MhcOptions::default());
        for (dtype, h_dtype) in [(F32, F32), (F16, BF16), (BF16, F32), (BF16, F16)] {
            let what = format!("lead {lead:?} HC {n} C {c} x {dtype:?} h_pre {h_dtype:?}");
            let rng = &mut Rng::new(100 + k as u64);
            let (x, xs) = upload(rng, &shape(lead, &[n, c]), -2.0, 2.0, dtype);
            let (h, hs) = upload(rng, &shape(lead, &[n]), 0.0, 1.0, h_dtype);
            let (g, gs) = upload(rng, &shape(lead, &[c]), -1.0, 1.0, dtype);
            let (out, saved) = mhc_pre(&x, &h).unwrap();
            assert_eq!(
                (out.shape(), out.dtype()),
                (&shape(lead, &[c])[..], dtype),
                "{what}"
            );
            let want = stored_values(&reference::pre(&xs, &hs, &cfg), dtype);
            let tol = Tolerance::for_dtype(dtype).scaled(2.0);
            assert_close(&format!("{what}: out"), &out.to_f64().unwrap(), &want, tol);
            let grads = mhc_pre_backward(&saved, &g).unwrap();
            for out in [F16, BF16] {
                let g16 = mhc_pre_backward_as(&saved, &g, out).unwrap();
                common::assert_cast_of(
                    &what,
                    &[
                        ("d x", &g16.x, &grads.x),
                        ("d h_pre", &g16.h_pre, &grads.h_pre),
                    ],
                    out,
                );
            }
            let (dx, dh) = reference::pre_backward(&xs, &hs, &gs, &cfg);
            let tol = Tolerance::for_dtype(F32).scaled(10.0);
            assert_close(
                &format!("{what}: d x"),
                &grads.x.to_f64().unwrap(),
                &dx,
                tol,
            );
            assert_close(
                &format!("{what}: d h_pre"),
                &grads.h_pre.to_f64().unwrap(),
                &dh,
                tol,
            );
            let (out2, saved2) = mhc_pre(&x, &h).unwrap();
            assert!(
                value_bits(&out) == value_bits(&out2),
                "{what}: forward rerun"
            );
            let grads2 = mhc_pre_backward(&saved2, &g).unwrap();
            assert!(
                value_bits(&grads.x) == value_bits(&grads2.x),
                "{what}: rerun"
            );
            assert!(
                value_bits(&grads.h_pre) == value_bits(&grads2.h_pre),
                "{what}: rerun"
            );
        }
    }
}

#[test]
fn post_res_matches_the_reference_in_every_dtype() {
    let shapes: [(&[usize], usize, usize); 6] = [
        (&[3], 1, 1),
        (&[2, 3], 2, 3),
        (&[5], 4, 127),
        (&[2], MAX_STREAMS, 3),
        (&[1, 2], 4, 300),
        (&[], 3, 513),
    ];
    for (k, &(lead, n, c)) in shapes.iter().enumerate() {
        let tokens: usize = lead.iter().product();
        let cfg = config(tokens, n, c, &MhcOptions::default());
        for dtype in DType::FLOATS {
            for f_dtype in DType::FLOATS {
                // The h inputs in F32 (the coefficients' dtype), or 16-bit with a 16-bit x.
                let h_dtype = if dtype == F32 { F32 } else { f_dtype };
                let what = format!(
                    "lead {lead:?} HC {n} C {c} x {dtype:?} f_out {f_dtype:?} h {h_dtype:?}"
                );
                let rng = &mut Rng::new(200 + k as u64);
                let (x, xs) = upload(rng, &shape(lead, &[n, c]), -2.0, 2.0, dtype);
                let (f, fs) = upload(rng, &shape(lead, &[c]), -2.0, 2.0, f_dtype);
                let (hp, hps) = upload(rng, &shape(lead, &[n]), 0.0, 2.0, h_dtype);
                let (hr, hrs) = upload(rng, &shape(lead, &[n, n]), 0.0, 0.5, h_dtype);
                let (g, gs) = upload(rng, &shape(lead, &[n, c]), -1.0, 1.0, f_dtype);
                let (out, saved) = mhc_post_res(&x, &f, &hp, &hr).unwrap();
                assert_eq!((out.shape(), out.dtype()), (x.shape(), dtype), "{what}");
                let want = stored_values(&reference::post_res(&xs, &fs, &hps, &hrs, &cfg), dtype);
                let tol = Tolerance::for_dtype(dtype).scaled(2.0);
                assert_close(&format!("{what}: out"), &out.to_f64().unwrap(), &want, tol);
                let gr = mhc_post_res_backward(&saved, &g).unwrap();
                for out in [F16, BF16] {
                    let g16 = mhc_post_res_backward_as(&saved, &g, out).unwrap();
                    common::assert_cast_of(
                        &what,
                        &[
                            ("d x", &g16.x, &gr.x),
                            ("d f_out", &g16.f_out, &gr.f_out),
                            ("d h_post", &g16.h_post, &gr.h_post),
                            ("d h_res", &g16.h_res, &gr.h_res),
                        ],
                        out,
                    );
                }
                let (dx, df, dp, dr) =
                    reference::post_res_backward(&xs, &fs, &hps, &hrs, &gs, &cfg);
                let tol = Tolerance::for_dtype(F32).scaled(10.0);
                assert_close(&format!("{what}: d x"), &gr.x.to_f64().unwrap(), &dx, tol);
                assert_close(
                    &format!("{what}: d f_out"),
                    &gr.f_out.to_f64().unwrap(),
                    &df,
                    tol,
                );
                assert_close(
                    &format!("{what}: d h_post"),
                    &gr.h_post.to_f64().unwrap(),
                    &dp,
                    tol,
                );
                assert_close(
                    &format!("{what}: d h_res"),
                    &gr.h_res.to_f64().unwrap(),
                    &dr,
                    tol,
                );
                let (out2, saved2) = mhc_post_res(&x, &f, &hp, &hr).unwrap();
                assert!(
                    value_bits(&out) == value_bits(&out2),
                    "{what}: forward rerun"
                );
                let gr2 = mhc_post_res_backward(&saved2, &g).unwrap();
                for (a, b) in [
                    (&gr.x, &gr2.x),
                    (&gr.f_out, &gr2.f_out),
                    (&gr.h_post, &gr2.h_post),
                    (&gr.h_res, &gr2.h_res),
                ] {
                    assert!(value_bits(a) == value_bits(b), "{what}: backward rerun");
                }
            }
        }
    }
}

#[test]
fn reference_gradients_match_finite_differences() {
    let shapes = [(1, 3, 20), (2, 3, 20), (3, 4, 5), (4, 2, 1), (2, 5, 3)];
    for (k, &(n, c, tmax)) in shapes.iter().enumerate() {
        let o = MhcOptions {
            tmax,
            sinkhorn_eps: 1e-3,
            pre_eps: 0.1,
            ..MhcOptions::default()
        };
        let cfg = config(2, n, c, &o);
        let (kk, m) = (cfg.k(), cfg.m());
        let mut rng = Rng::new(300 + k as u64);
        let x = rng.vec(2 * kk, -1.0, 1.0);
        let phi = rng.vec(kk * m, -0.6, 0.6);
        let b = rng.vec(m, -0.5, 0.5);
        let alphas = [
            rng.uniform(0.5, 1.5),
            rng.uniform(0.5, 1.5),
            rng.uniform(0.5, 1.5),
        ];
        let (g1, g2, g3) = (
            rng.vec(2 * n, -1.0, 1.0),
            rng.vec(2 * n, -1.0, 1.0),
            rng.vec(2 * n * n, -1.0, 1.0),
        );
        let cot = [&g1[..], &g2, &g3].concat();
        let want = reference::coefficients_backward(&x, &phi, &b, alphas, &g1, &g2, &g3, &cfg);
        let f = |x: &[f64], phi: &[f64], b: &[f64], a: [f64; 3]| {
            reference::coefficients(x, phi, b, a, &cfg).concatenated()
        };
        let what = format!("HC {n} C {c} tmax {tmax}");
        let cmp = check_vjp(|v| f(v, &phi, &b, alphas), &x, &cot, &want.x);
        assert!(cmp.passed, "{what}: d x {cmp}");
        let cmp = check_vjp(|v| f(&x, v, &b, alphas), &phi, &cot, &want.phi);
        assert!(cmp.passed, "{what}: d phi {cmp}");
        let cmp = check_vjp(|v| f(&x, &phi, v, alphas), &b, &cot, &want.b);
        assert!(cmp.passed, "{what}: d b {cmp}");
        let cmp = check_vjp(
            |v| f(&x, &phi, &b, [v[0], v[1], v[2]]),
            &alphas,
            &cot,
            &want.alphas,
        );
        assert!(cmp.passed, "{what}: d alphas {cmp}");
        // The pre-aggregation and the post + residual mix.
        let cfg = config(2, n, c + 2, &o);
        let len = 2 * n * (c + 2);
        let (x, f_out) = (rng.vec(len, -1.0, 1.0), rng.vec(2 * (c + 2), -1.0, 1.0));
        let (hp, hr) = (rng.vec(2 * n, 0.0, 2.0), rng.vec(2 * n * n, 0.0, 1.0));
        let (gp, gr) = (rng.vec(2 * (c + 2), -1.0, 1.0), rng.vec(len, -1.0, 1.0));
        let (dx, dh) = reference::pre_backward(&x, &hp, &gp, &cfg);
        let cmp = check_vjp(|v| reference::pre(v, &hp, &cfg), &x, &gp, &dx);
        assert!(cmp.passed, "{what}: pre d x {cmp}");
        let cmp = check_vjp(|v| reference::pre(&x, v, &cfg), &hp, &gp, &dh);
        assert!(cmp.passed, "{what}: pre d h_pre {cmp}");
        let (dx, df, dp, dr) = reference::post_res_backward(&x, &f_out, &hp, &hr, &gr, &cfg);
        let post =
            |x: &[f64], f: &[f64], p: &[f64], r: &[f64]| reference::post_res(x, f, p, r, &cfg);
        let cmp = check_vjp(|v| post(v, &f_out, &hp, &hr), &x, &gr, &dx);
        assert!(cmp.passed, "{what}: post_res d x {cmp}");
        let cmp = check_vjp(|v| post(&x, v, &hp, &hr), &f_out, &gr, &df);
        assert!(cmp.passed, "{what}: post_res d f_out {cmp}");
        let cmp = check_vjp(|v| post(&x, &f_out, v, &hr), &hp, &gr, &dp);
        assert!(cmp.passed, "{what}: post_res d h_post {cmp}");
        let cmp = check_vjp(|v| post(&x, &f_out, &hp, v), &hr, &gr, &dr);
        assert!(cmp.passed, "{what}: post_res d h_res {cmp}");
    }
}

#[test]
fn h_res_is_nearly_doubly_stochastic() {
    let o = MhcOptions::default();
    let (n, c) = (4, 16);
    let rng = &mut Rng::new(7);
    let (x, _) = upload(rng, &[3, n, c], -1.0, 1.0, F32);
    let (phi, _) = upload(rng, &[n * c, n * n + 2 * n], -0.5, 0.5, F32);
    let (b, _) = upload(rng, &[n * n + 2 * n], -1.0, 1.0, F32);
    let (a, _) = upload(rng, &[1], 1.0, 2.0, F32);
    let (h, _) = mhc_coefficients(&x, &phi, &b, &a, &a, &a, &o).unwrap();
    let r = h.h_res.to_f64().unwrap();
    for t in 0..3 {
        let m = &r[t * n * n..(t + 1) * n * n];
        for i in 0..n {
            let row: f64 = (0..n).map(|j| m[i * n + j]).sum();
            let col: f64 = (0..n).map(|j| m[j * n + i]).sum();
            assert!(
                // Columns are normalized last; rows converge more slowly.
                (row - 1.0).abs() < 5e-2 && (col - 1.0).abs() < 1e-5,
                "{row} {col}"
            );
        }
        assert!(m.iter().all(|&v| v > 0.0));
    }
    let post = h.h_post.to_f64().unwrap();
    assert!(post.iter().all(|&v| v > 0.0 && v < 2.0));
}

#[test]
fn no_tokens_give_empty_outputs_and_zero_parameter_gradients() {
    let e = engine();
    let (n, c) = (4, 5);
    let m = n * n + 2 * n;
    let x = Tensor::zeros(e, &[2, 0, n, c], BF16).unwrap();
    let phi = Tensor::from_slice(e, &vec![0.5f32; n * c * m], &[n * c, m]).unwrap();
    let b = Tensor::from_slice(e, &vec![0.5f32; m], &[m]).unwrap();
    let a = Tensor::from_slice(e, &[1.0f32], &[1]).unwrap();
    let (h, saved) = mhc_coefficients(&x, &phi, &b, &a, &a, &a, &MhcOptions::default()).unwrap();
    assert_eq!(h.h_pre.shape(), &[2, 0, n]);
    assert_eq!(h.h_res.shape(), &[2, 0, n, n]);
    let gr = Tensor::zeros(e, &[2, 0, n, n], F32).unwrap();
    let g = mhc_coefficients_backward(&saved, None, None, Some(&gr)).unwrap();
    assert_eq!(g.x.shape(), x.shape());
    assert_eq!(g.phi.to_vec::<f32>().unwrap(), vec![0.0; n * c * m]);
    assert_eq!(g.b.to_vec::<f32>().unwrap(), vec![0.0; m]);
    for t in [&g.alpha_pre, &g.alpha_post, &g.alpha_res] {
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0]);
    }
    let hp = Tensor::zeros(e, &[2, 0, n], F32).unwrap();
    let (out, saved) = mhc_pre(&x, &hp).unwrap();
    assert_eq!((out.shape(), out.dtype()), (&[2, 0, c][..], BF16));
    let gp = mhc_pre_backward(&saved, &Tensor::zeros(e, &[2, 0, c], F32).unwrap()).unwrap();
    assert_eq!(gp.x.shape(), x.shape());
    assert_eq!(gp.h_pre.shape(), &[2, 0, n]);
    let f = Tensor::zeros(e, &[2, 0, c], F16).unwrap();
    let (out, saved) = mhc_post_res(&x, &f, &hp, &gr).unwrap();
    assert_eq!(out.shape(), x.shape());
    let g = mhc_post_res_backward(&saved, &Tensor::zeros(e, x.shape(), F32).unwrap()).unwrap();
    assert_eq!(g.f_out.shape(), &[2, 0, c]);
    assert_eq!(g.h_res.shape(), &[2, 0, n, n]);
}

#[test]
fn bad_inputs_give_typed_errors() {
    let e = engine();
    let t = |shape: &[usize]| Tensor::zeros(e, shape, F32).unwrap();
    let (n, c) = (2, 3);
    let m = n * n + 2 * n;
    let (x, phi, b, a) = (t(&[4, n, c]), t(&[n * c, m]), t(&[m]), t(&[1]));
    let o = MhcOptions::default();
    let bounds = |e: &Error| matches!(e, Error::OutOfBounds { .. });
    let shape = |e: &Error| matches!(e, Error::ShapeMismatch { .. });
    let invalid = |e: &Error| matches!(e, Error::InvalidValue { .. });
    let coeff = |x: &Tensor, phi: &Tensor, b: &Tensor, a: &Tensor, o: &MhcOptions| {
        mhc_coefficients(x, phi, b, a, a, a, o).map(drop)
    };
    // Streams and widths.
    expect_err(
        "no streams",
        coeff(&t(&[4, 0, c]), &t(&[0, 0]), &t(&[0]), &a, &o),
        bounds,
    );
    let wide = MAX_STREAMS + 1;
    expect_err(
        "17 streams",
        mhc_pre(&t(&[1, wide, 2]), &t(&[1, wide])).map(drop),
        |e| {
            matches!(
                e,
                Error::OutOfBounds {
                    got: 17,
                    max: 16,
                    ..
                }
            )
        },
    );
    expect_err(
        "zero width",
        mhc_pre(&t(&[1, 2, 0]), &t(&[1, 2])).map(drop),
        bounds,
    );
    expect_err("one axis", mhc_pre(&t(&[4]), &t(&[4])).map(drop), shape);
    // Parameter shapes.
    expect_err(
        "phi rows",
        coeff(&x, &t(&[n * c + 1, m]), &b, &a, &o),
        shape,
    );
    expect_err(
        "phi columns",
        coeff(&x, &t(&[n * c, m - 1]), &b, &a, &o),
        shape,
    );
    expect_err("b length", coeff(&x, &phi, &t(&[m + 1]), &a, &o), shape);
    expect_err("alpha shape", coeff(&x, &phi, &b, &t(&[2]), &o), shape);
    expect_err("alpha scalar", coeff(&x, &phi, &b, &t(&[]), &o), shape);
    // Options.
    for tmax in [0, MAX_SINKHORN_ITERATIONS + 1] {
        let bad = MhcOptions { tmax, ..o };
        expect_err("tmax", coeff(&x, &phi, &b, &a, &bad), bounds);
    }
    for v in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let bad = MhcOptions { rms_eps: v, ..o };
        expect_err("rms_eps", coeff(&x, &phi, &b, &a, &bad), invalid);
        let bad = MhcOptions {
            sinkhorn_eps: v,
            ..o
        };
        expect_err("sinkhorn_eps", coeff(&x, &phi, &b, &a, &bad), invalid);
    }
    for v in [-1e-3, f32::NAN, f32::NEG_INFINITY] {
        let bad = MhcOptions { pre_eps: v, ..o };
        expect_err("pre_eps", coeff(&x, &phi, &b, &a, &bad), invalid);
    }
    for v in [f32::NAN, f32::INFINITY] {
        let bad = MhcOptions { post_mult: v, ..o };
        expect_err("post_mult", coeff(&x, &phi, &b, &a, &bad), invalid);
    }
    // Dtypes.
    let ints = Tensor::from_slice(e, &[0i32; 24], &[4, n, c]).unwrap();
    let int_err = |e: &Error| {
        matches!(
            e,
            Error::UnsupportedDType {
                got: DType::I32,
                ..
            }
        )
    };
    expect_err("integer x", coeff(&ints, &phi, &b, &a, &o), int_err);
    let int_a = Tensor::from_slice(e, &[1i32], &[1]).unwrap();
    expect_err("integer alpha", coeff(&x, &phi, &b, &int_a, &o), int_err);
    expect_err(
        "integer x (pre)",
        mhc_pre(&ints, &t(&[4, n])).map(drop),
        int_err,
    );
    let int_f = Tensor::from_slice(e, &[0i32; 12], &[4, c]).unwrap();
    let (hp, hr) = (t(&[4, n]), t(&[4, n, n]));
    expect_err(
        "integer f_out",
        mhc_post_res(&x, &int_f, &hp, &hr).map(drop),
        int_err,
    );
    // h and f_out shapes: the leading axes must be x's.
    expect_err("h_pre width", mhc_pre(&x, &t(&[4, n + 1])).map(drop), shape);
    expect_err(
        "h_pre leading",
        mhc_pre(&x, &t(&[2, 2, n])).map(drop),
        shape,
    );
    expect_err(
        "f_out width",
        mhc_post_res(&x, &t(&[4, c + 1]), &hp, &hr).map(drop),
        shape,
    );
    expect_err(
        "h_post",
        mhc_post_res(&x, &t(&[4, c]), &t(&[4, n + 1]), &hr).map(drop),
        shape,
    );
    expect_err(
        "h_res",
        mhc_post_res(&x, &t(&[4, c]), &hp, &t(&[4, n, n + 1])).map(drop),
        shape,
    );
    // Cotangents.
    let (_, saved) = mhc_coefficients(&x, &phi, &b, &a, &a, &a, &o).unwrap();
    let back = |g1: Option<&Tensor>, g2: Option<&Tensor>, g3: Option<&Tensor>| {
        mhc_coefficients_backward(&saved, g1, g2, g3).map(drop)
    };
    expect_err(
        "dh_pre shape",
        back(Some(&t(&[4, n + 1])), None, None),
        shape,
    );
    expect_err("dh_post shape", back(None, Some(&t(&[3, n])), None), shape);
    expect_err("dh_res shape", back(None, None, Some(&t(&[4, n]))), shape);
    let int_g = Tensor::from_slice(e, &[0i32; 8], &[4, n]).unwrap();
    expect_err("integer dh_pre", back(Some(&int_g), None, None), int_err);
    let (_, pre_saved) = mhc_pre(&x, &hp).unwrap();
    expect_err(
        "pre d_out",
        mhc_pre_backward(&pre_saved, &t(&[4, c + 1])).map(drop),
        shape,
    );
    let (_, post_saved) = mhc_post_res(&x, &t(&[4, c]), &hp, &hr).unwrap();
    expect_err(
        "post d_out",
        mhc_post_res_backward(&post_saved, &t(&[4, c])).map(drop),
        shape,
    );
    // Engines.
    if let Ok(other) = Engine::builder().build() {
        let oa = Tensor::zeros(&other, &[1], F32).unwrap();
        let mismatch = |e: &Error| matches!(e, Error::EngineMismatch { .. });
        expect_err("another engine", coeff(&x, &phi, &b, &oa, &o), mismatch);
        let oh = Tensor::zeros(&other, &[4, n], F32).unwrap();
        expect_err("another engine (pre)", mhc_pre(&x, &oh).map(drop), mismatch);
        let og = Tensor::zeros(&other, &[4, n, n], F32).unwrap();
        expect_err(
            "another engine (dh_res)",
            back(None, None, Some(&og)),
            mismatch,
        );
    }
    // Workspace: the forward's packed parameters, the backward's Sinkhorn history.
    let small = Engine::builder().workspace_bound(16).build().unwrap();
    let st = |shape: &[usize]| Tensor::zeros(&small, shape, F32).unwrap();
    let (sx, sphi, sb, sa) = (st(&[4, n, c]), st(&[n * c, m]), st(&[m]), st(&[1]));
    expect_err(
        "workspace",
        mhc_coefficients(&sx, &sphi, &sb, &sa, &sa, &sa, &o).map(drop),
        |e| matches!(e, Error::WorkspaceExceeded { bound: 16, .. }),
    );
    // The forward's 44 bytes fit 64, the backward's history (4 tokens of 20 steps) does not.
    let need = mhc_coefficients_backward_workspace_bytes(4, n, c, o.tmax);
    assert!(need >= 4 * 4 * (20 * m as u64 + 1), "{need}");
    let mid = Engine::builder().workspace_bound(64).build().unwrap();
    let mt = |shape: &[usize]| Tensor::zeros(&mid, shape, F32).unwrap();
    let (mx, mphi, mb, ma) = (mt(&[4, n, c]), mt(&[n * c, m]), mt(&[m]), mt(&[1]));
    let (_, msaved) = mhc_coefficients(&mx, &mphi, &mb, &ma, &ma, &ma, &o).unwrap();
    let mg = mt(&[4, n, n]);
    expect_err(
        "backward workspace",
        mhc_coefficients_backward(&msaved, None, None, Some(&mg)).map(drop),
        |e| matches!(e, Error::WorkspaceExceeded { .. }),
    );
    // One binding: an x whose F32 gradient would not fit.
    let capped = common::capped_engine(256);
    let cx = Tensor::zeros(&capped, &[8, 4, 4], BF16).unwrap();
    let ch = Tensor::zeros(&capped, &[8, 4], F32).unwrap();
    expect_err("binding", mhc_pre(&cx, &ch).map(drop), |e| {
        matches!(e, Error::LimitExceeded { .. })
    });
}

/// `mhc_post_res_backward_as` and `mhc_pre_backward_as` with an even C write d x (and d f_out)
/// in 16 bits from their kernels: the call's peak grows by about the 16-bit gradients, not by
/// F32 copies (twice them).
#[test]
fn sixteen_bit_stream_gradients_allocate_no_f32_copy() {
    let private = common::private_engine();
    let (tokens, n, c) = (64, 4, 512);
    let rng = &mut Rng::new(77);
    let mut up = |shape: &[usize], lo: f64, hi: f64| {
        wgrad::gradcheck::tensor_from_f64(
            &private,
            &rng.vec(shape.iter().product(), lo, hi),
            shape,
            BF16,
        )
        .unwrap()
        .0
    };
    let x = up(&[tokens, n, c], -2.0, 2.0);
    let f = up(&[tokens, c], -2.0, 2.0);
    let hp = up(&[tokens, n], 0.0, 2.0);
    let hr = up(&[tokens, n, n], 0.0, 0.5);
    let g = up(&[tokens, n, c], -1.0, 1.0);
    let gp = up(&[tokens, c], -1.0, 1.0);
    let (out, saved) = mhc_post_res(&x, &f, &hp, &hr).unwrap();
    let (pout, psaved) = mhc_pre(&x, &hp).unwrap();
    drop((out, pout));
    private.synchronize().unwrap();
    let measure = |run: &dyn Fn()| {
        private.synchronize().unwrap();
        let before = private.memory().live_bytes;
        private.reset_peak();
        run();
        private.synchronize().unwrap();
        private.memory().peak_bytes - before
    };
    let post16 = ((tokens * n * c + tokens * c) * 2) as u64;
    let grown = measure(&|| {
        let gr = mhc_post_res_backward_as(&saved, &g, BF16).unwrap();
        assert_eq!(gr.x.dtype(), BF16);
    });
    assert!(
        grown < post16 * 3 / 2,
        "post_res: peak grew {grown} bytes for {post16} bytes of 16-bit gradients"
    );
    let pre16 = (tokens * n * c * 2) as u64;
    let grown = measure(&|| {
        let gr = mhc_pre_backward_as(&psaved, &gp, BF16).unwrap();
        assert_eq!(gr.x.dtype(), BF16);
    });
    assert!(
        grown < pre16 * 3 / 2,
        "pre: peak grew {grown} bytes for {pre16} bytes of 16-bit gradients"
    );
}
