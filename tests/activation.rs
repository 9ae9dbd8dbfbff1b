//! Activations (unary, gated, packed; multipliers) against the f64 references of
//! `wgrad::reference::activation`, in every storage dtype; wgrad's WGSL erf against the f64
//! erf, and the f64 erf against known values and properties; finite differences of the
//! reference backwards; formulas kept distinct; ReLU at 0; reruns; bad inputs.

mod common;

use common::{Rng, assert_close, engine, f32_bits, stored, tensor_from_f64};
use wgrad::activation::{self, Activation, ActivationOptions};
use wgrad::gradcheck::{Tolerance, check_vjp, compare};
use wgrad::reference::activation as reference;
use wgrad::{DType, Error, Tensor};

fn data(seed: u64, n: usize, range: f64) -> Vec<f64> {
    Rng::new(seed).vec(n, -range, range)
}

const OPTS: [ActivationOptions; 2] = [
    ActivationOptions {
        gate_multiplier: 1.0,
        down_multiplier: 1.0,
    },
    ActivationOptions {
        gate_multiplier: 0.75,
        down_multiplier: 1.5,
    },
];

#[test]
fn unary_and_gated_match_reference_in_every_dtype() {
    let e = engine();
    for kind in Activation::ALL {
        for dtype in DType::FLOATS {
            for (k, n) in [1usize, 2, 7, 1001, 4099].into_iter().enumerate() {
                let opts = OPTS[k % 2];
                let (gm, dm) = (
                    f64::from(opts.gate_multiplier),
                    f64::from(opts.down_multiplier),
                );
                let g = stored(&data(10 + k as u64, n, 6.0), dtype);
                let u = stored(&data(20 + k as u64, n, 2.0), dtype);
                let dy = stored(&data(30 + k as u64, n, 1.0), dtype);
                let gt = tensor_from_f64(e, &g, &[n], dtype);
                let ut = tensor_from_f64(e, &u, &[n], dtype);
                let dyt = tensor_from_f64(e, &dy, &[n], dtype);
                let label = format!("{} {dtype} n={n}", kind.name());
                // Unary.
                let (y, saved) = activation::forward(kind, &gt, None, &opts).unwrap();
                assert_eq!(y.dtype(), dtype);
                // Compared with the reference rounded to the output dtype: a lone tiny value
                // (n = 1) would otherwise fail the relative-L2 bound on its rounding alone.
                let want = stored(&reference::forward(kind, &g, None, gm, dm), dtype);
                assert_close(
                    &format!("{label} unary y"),
                    &y.to_f64().unwrap(),
                    &want,
                    Tolerance::for_dtype(dtype),
                );
                let grads = activation::backward(&saved, &dyt).unwrap();
                assert!(grads.dup.is_none());
                let (dg, _) = reference::backward(kind, &g, None, &dy, gm, dm);
                assert_close(
                    &format!("{label} unary dx"),
                    &grads.dgate.to_f64().unwrap(),
                    &dg,
                    Tolerance::for_dtype(DType::F32),
                );
                // Gated.
                let (y, saved) = activation::forward(kind, &gt, Some(&ut), &opts).unwrap();
                let want = stored(&reference::forward(kind, &g, Some(&u), gm, dm), dtype);
                assert_close(
                    &format!("{label} gated y"),
                    &y.to_f64().unwrap(),
                    &want,
                    Tolerance::for_dtype(dtype),
                );
                let grads = activation::backward(&saved, &dyt).unwrap();
                let (dg, du) = reference::backward(kind, &g, Some(&u), &dy, gm, dm);
                assert_eq!(grads.dgate.dtype(), DType::F32);
                assert_close(
                    &format!("{label} gated dgate"),
                    &grads.dgate.to_f64().unwrap(),
                    &dg,
                    Tolerance::for_dtype(DType::F32),
                );
                assert_close(
                    &format!("{label} gated dup"),
                    &grads.dup.unwrap().to_f64().unwrap(),
                    &du.unwrap(),
                    Tolerance::for_dtype(DType::F32),
                );
            }
        }
    }
}

#[test]
fn mixed_dtypes_gate_up_and_cotangent() {
    let e = engine();
    let n = 33;
    let g = stored(&data(1, n, 4.0), DType::BF16);
    let u = stored(&data(2, n, 2.0), DType::F32);
    let dy = stored(&data(3, n, 1.0), DType::F16);
    let (y, saved) = activation::forward(
        Activation::Silu,
        &tensor_from_f64(e, &g, &[3, 11], DType::BF16),
        Some(&tensor_from_f64(e, &u, &[3, 11], DType::F32)),
        &ActivationOptions::default(),
    )
    .unwrap();
    assert_eq!((y.dtype(), y.shape()), (DType::BF16, &[3usize, 11][..]));
    assert_close(
        "y",
        &y.to_f64().unwrap(),
        &reference::forward(Activation::Silu, &g, Some(&u), 1.0, 1.0),
        Tolerance::for_dtype(DType::BF16),
    );
    let grads =
        activation::backward(&saved, &tensor_from_f64(e, &dy, &[3, 11], DType::F16)).unwrap();
    let (dg, du) = reference::backward(Activation::Silu, &g, Some(&u), &dy, 1.0, 1.0);
    assert_close(
        "dgate",
        &grads.dgate.to_f64().unwrap(),
        &dg,
        Tolerance::for_dtype(DType::F32),
    );
    assert_close(
        "dup",
        &grads.dup.unwrap().to_f64().unwrap(),
        &du.unwrap(),
        Tolerance::for_dtype(DType::F32),
    );
}

#[test]
fn packed_layout_matches_reference_including_odd_widths() {
    let e = engine();
    for kind in [
        Activation::Silu,
        Activation::GeluTanh,
        Activation::Gelu,
        Activation::ReluSquared,
    ] {
        for dtype in DType::FLOATS {
            for (k, &(rows, width)) in [
                (1usize, 1usize),
                (3, 5),
                (4, 7),
                (5, 64),
                (2, 301),
                (3, 8),
                (2, 2056),
            ]
            .iter()
            .enumerate()
            {
                let opts = OPTS[k % 2];
                let (gm, dm) = (
                    f64::from(opts.gate_multiplier),
                    f64::from(opts.down_multiplier),
                );
                let x = stored(&data(40 + k as u64, rows * 2 * width, 5.0), dtype);
                let dy = stored(&data(50 + k as u64, rows * width, 1.0), dtype);
                let xt = tensor_from_f64(e, &x, &[rows, 2 * width], dtype);
                let (y, saved) = activation::packed_forward(kind, &xt, &opts).unwrap();
                assert_eq!(y.shape(), &[rows, width]);
                let label = format!("packed {} {dtype} {rows}x{width}", kind.name());
                assert_close(
                    &format!("{label} y"),
                    &y.to_f64().unwrap(),
                    &reference::packed_forward(kind, &x, width, gm, dm),
                    Tolerance::for_dtype(dtype),
                );
                let grads =
                    activation::backward(&saved, &tensor_from_f64(e, &dy, &[rows, width], dtype))
                        .unwrap();
                assert_eq!(grads.dgate.shape(), &[rows, 2 * width]);
                assert!(grads.dup.is_none());
                assert_close(
                    &format!("{label} dx"),
                    &grads.dgate.to_f64().unwrap(),
                    &reference::packed_backward(kind, &x, width, &dy, gm, dm),
                    Tolerance::for_dtype(DType::F32),
                );
                // The packed result equals the separate-tensor result on the unpacked halves.
                let (g, u) = reference::unpack(&x, width);
                let (ys, _) = activation::forward(
                    kind,
                    &tensor_from_f64(e, &g, &[rows, width], dtype),
                    Some(&tensor_from_f64(e, &u, &[rows, width], dtype)),
                    &opts,
                )
                .unwrap();
                assert_eq!(
                    ys.to_f64().unwrap(),
                    y.to_f64().unwrap(),
                    "{label}: packed vs separate"
                );
            }
        }
    }
}

/// Outputs of the unary and gated forwards and backwards on the first `n` values of `g`, `u`,
/// `dy` (dtypes of gate, up and cotangent), each as f64, truncated to `keep` elements.
fn all_outputs(
    kind: Activation,
    opts: &ActivationOptions,
    (g, u, dy): (&[f64], &[f64], &[f64]),
    dtypes: (DType, DType, DType),
    n: usize,
    keep: usize,
) -> Vec<Vec<f64>> {
    let e = engine();
    let gt = tensor_from_f64(e, &g[..n], &[n], dtypes.0);
    let ut = tensor_from_f64(e, &u[..n], &[n], dtypes.1);
    let dyt = tensor_from_f64(e, &dy[..n], &[n], dtypes.2);
    let (y1, s1) = activation::forward(kind, &gt, None, opts).unwrap();
    let g1 = activation::backward(&s1, &dyt).unwrap();
    let (y2, s2) = activation::forward(kind, &gt, Some(&ut), opts).unwrap();
    let g2 = activation::backward(&s2, &dyt).unwrap();
    [y1, g1.dgate, y2, g2.dgate, g2.dup.unwrap()]
        .iter()
        .map(|t| t.to_f64().unwrap()[..keep].to_vec())
        .collect()
}

/// Counts that are multiples of 4 run the step kernels (16- or 8-byte loads and stores; steps
/// of 8 when every tensor is 16-bit and the count allows); one element more runs the
/// per-element kernels. The shared elements come out bit for bit equal in every dtype, mixed
/// ones included, for one or two steps (the invocation's other steps absent), a count of 12
/// (16-bit: steps of 4 through the 8-byte views) and two workgroups, the second partial; the
/// step results also match the reference.
#[test]
fn step_kernels_equal_per_element_kernels_bit_for_bit() {
    use DType::{BF16, F16, F32};
    let dtypes = [
        (F32, F32, F32),
        (BF16, BF16, BF16),
        (F16, F16, F16),
        (F32, BF16, F16),
        (BF16, F32, F32),
    ];
    for kind in Activation::ALL {
        // Every activation in F32 and BF16; F16 and mixed dtypes with SwiGLU and GeGLU (each
        // combination compiles its own pipelines).
        let common = matches!(kind, Activation::Silu | Activation::GeluTanh);
        let used = if common { &dtypes[..] } else { &dtypes[..2] };
        for (k, &dts) in used.iter().enumerate() {
            for n in [8usize, 12, 4104] {
                let opts = OPTS[k % 2];
                let g = stored(&data(100 + k as u64, n + 1, 6.0), dts.0);
                let u = stored(&data(110 + k as u64, n + 1, 2.0), dts.1);
                let dy = stored(&data(120 + k as u64, n + 1, 1.0), dts.2);
                let label = format!("{} {dts:?} n={n}", kind.name());
                let stepped = all_outputs(kind, &opts, (&g, &u, &dy), dts, n, n);
                let general = all_outputs(kind, &opts, (&g, &u, &dy), dts, n + 1, n);
                for (j, (a, b)) in stepped.iter().zip(&general).enumerate() {
                    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{label}: output {j} step vs per-element kernel");
                }
                let (gm, dm) = (
                    f64::from(opts.gate_multiplier),
                    f64::from(opts.down_multiplier),
                );
                let (g, u, dy) = (&g[..n], &u[..n], &dy[..n]);
                let want = stored(&reference::forward(kind, g, Some(u), gm, dm), dts.0);
                assert_close(
                    &format!("{label} gated y"),
                    &stepped[2],
                    &want,
                    Tolerance::for_dtype(dts.0),
                );
                let (dg, du) = reference::backward(kind, g, Some(u), dy, gm, dm);
                let tol = Tolerance::for_dtype(DType::F32);
                assert_close(&format!("{label} dgate"), &stepped[3], &dg, tol);
                assert_close(&format!("{label} dup"), &stepped[4], &du.unwrap(), tol);
            }
        }
    }
}

/// The packed layout's step kernels (width a multiple of 4) against the separate layout's
/// per-element kernels on the same halves (one element more), bit for bit.
#[test]
fn packed_step_kernels_equal_per_element_kernels_bit_for_bit() {
    let e = engine();
    for kind in [Activation::Silu, Activation::GeluTanh, Activation::Gelu] {
        for dtype in DType::FLOATS {
            for (k, &(rows, width)) in [(1usize, 8usize), (3, 16), (2, 12), (2, 2056)]
                .iter()
                .enumerate()
            {
                let opts = OPTS[k % 2];
                let n = rows * width;
                let x = stored(&data(130 + k as u64, 2 * n, 5.0), dtype);
                let dy = stored(&data(140 + k as u64, n + 1, 1.0), dtype);
                let xt = tensor_from_f64(e, &x, &[rows, 2 * width], dtype);
                let (y, saved) = activation::packed_forward(kind, &xt, &opts).unwrap();
                let dyt = tensor_from_f64(e, &dy[..n], &[rows, width], dtype);
                let dx = activation::backward(&saved, &dyt)
                    .unwrap()
                    .dgate
                    .to_f64()
                    .unwrap();
                let (mut g, mut u) = reference::unpack(&x, width);
                g.push(0.5);
                u.push(-0.25);
                let general =
                    all_outputs(kind, &opts, (&g, &u, &dy), (dtype, dtype, dtype), n + 1, n);
                let label = format!("packed {} {dtype} {rows}x{width}", kind.name());
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y.to_f64().unwrap()), bits(&general[2]), "{label} y");
                let (dg, du) = reference::unpack(&dx, width);
                assert_eq!(bits(&dg), bits(&general[3]), "{label} dgate");
                assert_eq!(bits(&du), bits(&general[4]), "{label} dup");
            }
        }
    }
}

#[test]
fn reference_backwards_match_finite_differences() {
    for kind in Activation::ALL {
        // Keep ReLU-type inputs away from the kink at 0.
        let g: Vec<f64> = data(60, 40, 3.0)
            .into_iter()
            .map(|v| if v.abs() < 0.05 { v + 0.1 } else { v })
            .collect();
        let u = data(61, 40, 2.0);
        let dy = data(62, 40, 1.0);
        let (gm, dm) = (0.8, 1.3);
        let (dg, du) = reference::backward(kind, &g, Some(&u), &dy, gm, dm);
        let c = check_vjp(
            |p| reference::forward(kind, p, Some(&u), gm, dm),
            &g,
            &dy,
            &dg,
        );
        assert!(c.passed, "{} dgate: {c}", kind.name());
        let c = check_vjp(
            |p| reference::forward(kind, &g, Some(p), gm, dm),
            &u,
            &dy,
            &du.unwrap(),
        );
        assert!(c.passed, "{} dup: {c}", kind.name());
        let width = 5;
        let x = data(63, 4 * 2 * width, 3.0)
            .into_iter()
            .map(|v| if v.abs() < 0.05 { v + 0.1 } else { v })
            .collect::<Vec<_>>();
        let dy = data(64, 4 * width, 1.0);
        let dx = reference::packed_backward(kind, &x, width, &dy, gm, dm);
        let c = check_vjp(
            |p| reference::packed_forward(kind, p, width, gm, dm),
            &x,
            &dy,
            &dx,
        );
        assert!(c.passed, "{} packed: {c}", kind.name());
    }
}

#[test]
fn reference_erf_known_values_and_properties() {
    // erf values to 16 digits (Abramowitz & Stegun table 7.1 / any CAS).
    for (x, want) in [
        (0.0, 0.0),
        (0.1, 0.112_462_916_018_284_9),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.0, 0.999_977_909_503_001_4),
    ] {
        assert!(
            (reference::erf(x) - want).abs() < 1e-15,
            "erf({x}) = {}",
            reference::erf(x)
        );
        assert!((reference::erf(-x) + want).abs() < 1e-15, "odd at {x}");
    }
    // erfc(5) = 1.5374597944280349e-12, erfc(10) = 2.088487583762545e-45: relative accuracy.
    assert!((reference::erfc(5.0) / 1.537_459_794_428_035e-12 - 1.0).abs() < 1e-13);
    assert!((reference::erfc(10.0) / 2.088_487_583_762_545e-45 - 1.0).abs() < 1e-13);
    // Continuity at the series/continued-fraction switch, monotone, bounded, derivative 2/√π·e^(−x²).
    assert!((reference::erf(2.5 - 1e-12) - reference::erf(2.5)).abs() < 1e-14);
    let mut last = -1.0;
    for k in -400..=400 {
        let x = k as f64 / 50.0;
        let v = reference::erf(x);
        assert!(
            v >= last && v.abs() <= 1.0,
            "erf not monotone/bounded at {x}"
        );
        last = v;
        let h = 1e-6;
        let numeric = (reference::erf(x + h) - reference::erf(x - h)) / (2.0 * h);
        let exact = std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp();
        assert!(
            (numeric - exact).abs() < 1e-8,
            "erf' at {x}: {numeric} vs {exact}"
        );
        assert!((reference::erf(x) + reference::erfc(x) - 1.0).abs() < 1e-15);
    }
}

#[test]
fn gpu_erf_is_accurate_to_f32_rounding() {
    let e = engine();
    let mut x: Vec<f64> = (-6000..=6000)
        .map(|k| f64::from(k as f32 / 1000.0))
        .collect();
    x.extend(data(70, 2000, 12.0).iter().map(|&v| f64::from(v as f32)));
    x.extend([
        0.0,
        -0.0,
        1e-30,
        1e-8,
        0.999_999_9,
        1.0,
        1.000_000_1,
        9.99,
        10.0,
        30.0,
        -30.0,
    ]);
    let got = activation::erf(
        &Tensor::from_slice(
            e,
            &x.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &[x.len()],
        )
        .unwrap(),
    )
    .unwrap()
    .to_f64()
    .unwrap();
    for (i, &xi) in x.iter().enumerate() {
        let want = reference::erf(xi);
        // Three f32 ulps of the result (ulp of |want|, at least the ulp of the smallest normal
        // scale of x·2/√π near 0).
        let ulp = (want.abs().max(1e-37) as f32).to_bits();
        let ulp = f64::from(f32::from_bits(ulp + 1)) - f64::from(f32::from_bits(ulp));
        assert!(
            (got[i] - want).abs() <= 3.0 * ulp,
            "erf({xi}) = {} want {want} ({} ulps)",
            got[i],
            (got[i] - want).abs() / ulp
        );
    }
}

#[test]
fn gelu_variants_are_distinct() {
    // At x = 1.5 the three GELU formulas differ by more than any tolerance in use:
    // erf-GELU 1.399789, tanh-GELU 1.399572, quick-GELU 1.391... (f64 references).
    let e = engine();
    let x = [1.5f64, -1.0, 2.5, -2.0];
    let xt = tensor_from_f64(e, &x, &[4], DType::F32);
    let run = |k| {
        activation::forward(k, &xt, None, &ActivationOptions::default())
            .unwrap()
            .0
            .to_f64()
            .unwrap()
    };
    let tol = Tolerance::for_dtype(DType::F32);
    for (kind, others) in [
        (
            Activation::Gelu,
            [Activation::GeluTanh, Activation::QuickGelu],
        ),
        (
            Activation::GeluTanh,
            [Activation::Gelu, Activation::QuickGelu],
        ),
        (
            Activation::QuickGelu,
            [Activation::Gelu, Activation::GeluTanh],
        ),
    ] {
        let got = run(kind);
        assert!(
            compare(&got, &reference::forward(kind, &x, None, 1.0, 1.0), tol).passed,
            "{}",
            kind.name()
        );
        for other in others {
            assert!(
                !compare(&got, &reference::forward(other, &x, None, 1.0, 1.0), tol).passed,
                "{} matches {}",
                kind.name(),
                other.name()
            );
        }
    }
    // Hand-checked anchors: Φ(1.5)·1.5 with Φ(1.5) = 0.9331927987311419.
    assert!((run(Activation::Gelu)[0] - 1.5 * 0.933_192_798_731_141_9).abs() < 1e-6);
}

#[test]
fn relu_derivative_is_zero_at_zero() {
    let e = engine();
    let x = [0.0f64, -0.0, 1e-30, -1e-30, 2.0, -2.0];
    let xt = tensor_from_f64(e, &x, &[6], DType::F32);
    for (kind, want_y, want_d) in [
        (
            Activation::Relu,
            [0.0, 0.0, 1e-30, 0.0, 2.0, 0.0],
            [0.0, 0.0, 1.0, 0.0, 1.0, 0.0],
        ),
        (
            Activation::ReluSquared,
            [0.0, 0.0, 0.0, 0.0, 4.0, 0.0],
            [0.0, 0.0, 2e-30, 0.0, 4.0, 0.0],
        ),
    ] {
        let (y, saved) =
            activation::forward(kind, &xt, None, &ActivationOptions::default()).unwrap();
        let y = y.to_f64().unwrap();
        let d = activation::backward(&saved, &tensor_from_f64(e, &[1.0; 6], &[6], DType::F32))
            .unwrap()
            .dgate
            .to_f64()
            .unwrap();
        for i in 0..6 {
            assert!(
                (y[i] - f64::from(want_y[i] as f32)).abs() <= 1e-37,
                "{} y[{i}] = {}",
                kind.name(),
                y[i]
            );
            assert!(
                (d[i] - f64::from(want_d[i] as f32)).abs() <= 1e-37,
                "{} d[{i}] = {}",
                kind.name(),
                d[i]
            );
        }
    }
}

#[test]
fn extreme_inputs_stay_finite() {
    let e = engine();
    let x = [-1000.0f64, -90.0, -20.0, 20.0, 90.0, 1000.0];
    let xt = tensor_from_f64(e, &x, &[6], DType::F32);
    for kind in Activation::ALL {
        let (y, saved) =
            activation::forward(kind, &xt, None, &ActivationOptions::default()).unwrap();
        let y = y.to_f64().unwrap();
        let d = activation::backward(&saved, &tensor_from_f64(e, &[1.0; 6], &[6], DType::F32))
            .unwrap()
            .dgate
            .to_f64()
            .unwrap();
        let want = reference::forward(kind, &x, None, 1.0, 1.0);
        let (want_d, _) = reference::backward(kind, &x, None, &[1.0; 6], 1.0, 1.0);
        for i in 0..6 {
            assert!(
                y[i].is_finite() && d[i].is_finite(),
                "{} at {}: {} {}",
                kind.name(),
                x[i],
                y[i],
                d[i]
            );
            if want[i].abs() < 3e38 {
                assert!(
                    (y[i] - want[i]).abs() <= 1e-5 + 1e-4 * want[i].abs(),
                    "{} y({}) = {} want {}",
                    kind.name(),
                    x[i],
                    y[i],
                    want[i]
                );
            }
            assert!(
                (d[i] - want_d[i]).abs() <= 1e-5 + 1e-4 * want_d[i].abs(),
                "{} d({}) = {} want {}",
                kind.name(),
                x[i],
                d[i],
                want_d[i]
            );
        }
    }
}

#[test]
fn empty_inputs_give_empty_outputs() {
    let e = engine();
    let x = Tensor::zeros(e, &[0, 4], DType::BF16).unwrap();
    let (y, saved) = activation::swiglu(&x, &x).unwrap();
    assert_eq!(y.shape(), &[0, 4]);
    let g = activation::backward(&saved, &x).unwrap();
    assert_eq!(g.dgate.len(), 0);
    let (y, _) =
        activation::swiglu_packed(&Tensor::zeros(e, &[0, 6], DType::F16).unwrap()).unwrap();
    assert_eq!(y.shape(), &[0, 3]);
}

#[test]
fn reruns_are_bit_identical() {
    let e = engine();
    let g = tensor_from_f64(e, &data(80, 777, 5.0), &[777], DType::F32);
    let u = tensor_from_f64(e, &data(81, 777, 5.0), &[777], DType::F32);
    let dy = tensor_from_f64(e, &data(82, 777, 1.0), &[777], DType::F32);
    let run = || {
        let (y, s) = activation::geglu(&g, &u).unwrap();
        let gr = activation::backward(&s, &dy).unwrap();
        (
            f32_bits(&y),
            f32_bits(&gr.dgate),
            f32_bits(&gr.dup.unwrap()),
        )
    };
    assert_eq!(run(), run());
    // The step kernels (a multiple of 8 elements, several workgroups), BF16 storage.
    let n = 8 * 1100;
    let g = tensor_from_f64(e, &data(83, n, 5.0), &[n], DType::BF16);
    let u = tensor_from_f64(e, &data(84, n, 5.0), &[n], DType::BF16);
    let dy = tensor_from_f64(e, &data(85, n, 1.0), &[n], DType::BF16);
    let x = tensor_from_f64(e, &data(86, 2 * n, 5.0), &[8, n / 4], DType::BF16);
    let dyp = tensor_from_f64(e, &data(87, n, 1.0), &[8, n / 8], DType::BF16);
    let run = || {
        let (y, s) = activation::swiglu(&g, &u).unwrap();
        let gr = activation::backward(&s, &dy).unwrap();
        let (yp, sp) = activation::swiglu_packed(&x).unwrap();
        let dx = activation::backward(&sp, &dyp).unwrap().dgate;
        (
            y.to_f64()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            f32_bits(&gr.dgate),
            f32_bits(&gr.dup.unwrap()),
            yp.to_f64()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            f32_bits(&dx),
        )
    };
    assert_eq!(run(), run());
}

#[test]
fn helpers_are_the_named_activations() {
    let e = engine();
    let g = tensor_from_f64(e, &data(90, 20, 3.0), &[20], DType::F32);
    let u = tensor_from_f64(e, &data(91, 20, 3.0), &[20], DType::F32);
    let x = tensor_from_f64(e, &data(92, 40, 3.0), &[2, 20], DType::F32);
    let d = ActivationOptions::default();
    let bits = |t: &Tensor| f32_bits(t);
    assert_eq!(
        bits(&activation::silu(&g).unwrap().0),
        bits(
            &activation::forward(Activation::Silu, &g, None, &d)
                .unwrap()
                .0
        )
    );
    assert_eq!(
        bits(&activation::swiglu(&g, &u).unwrap().0),
        bits(
            &activation::forward(Activation::Silu, &g, Some(&u), &d)
                .unwrap()
                .0
        )
    );
    assert_eq!(
        bits(&activation::geglu(&g, &u).unwrap().0),
        bits(
            &activation::forward(Activation::GeluTanh, &g, Some(&u), &d)
                .unwrap()
                .0
        )
    );
    assert_eq!(
        bits(&activation::swiglu_packed(&x).unwrap().0),
        bits(
            &activation::packed_forward(Activation::Silu, &x, &d)
                .unwrap()
                .0
        )
    );
    assert_eq!(
        bits(&activation::geglu_packed(&x).unwrap().0),
        bits(
            &activation::packed_forward(Activation::GeluTanh, &x, &d)
                .unwrap()
                .0
        )
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let g = Tensor::zeros(e, &[2, 3], DType::F32).unwrap();
    let d = ActivationOptions::default();
    let i = Tensor::from_slice(e, &[1i32, 2], &[2]).unwrap();
    assert!(matches!(
        activation::forward(Activation::Silu, &i, None, &d),
        Err(Error::UnsupportedDType { .. })
    ));
    assert!(matches!(
        activation::forward(Activation::Silu, &g, Some(&i), &d),
        Err(Error::UnsupportedDType { .. })
    ));
    let u = Tensor::zeros(e, &[3, 2], DType::F32).unwrap();
    assert_eq!(
        activation::forward(Activation::Silu, &g, Some(&u), &d).unwrap_err(),
        Error::ShapeMismatch {
            what: "activation: up".into(),
            expected: vec![2, 3],
            got: vec![3, 2]
        }
    );
    let bad = ActivationOptions {
        gate_multiplier: f32::NAN,
        ..d
    };
    assert!(matches!(
        activation::forward(Activation::Silu, &g, None, &bad),
        Err(Error::InvalidValue { .. })
    ));
    let bad = ActivationOptions {
        down_multiplier: f32::INFINITY,
        ..d
    };
    assert!(matches!(
        activation::packed_forward(Activation::Silu, &u, &bad),
        Err(Error::InvalidValue { .. })
    ));
    // Odd packed width, scalar packed input.
    assert_eq!(
        activation::packed_forward(Activation::Silu, &g, &d).unwrap_err(),
        Error::ShapeMismatch {
            what: "activation: packed input (even last axis)".into(),
            expected: vec![2, 4],
            got: vec![2, 3]
        }
    );
    let s = Tensor::zeros(e, &[], DType::F32).unwrap();
    assert!(matches!(
        activation::packed_forward(Activation::Silu, &s, &d),
        Err(Error::ShapeMismatch { .. })
    ));
    // Cotangent of the wrong shape or dtype.
    let (_, saved) = activation::packed_forward(Activation::Silu, &u, &d).unwrap();
    assert_eq!(
        activation::backward(&saved, &g).unwrap_err(),
        Error::ShapeMismatch {
            what: "activation: dy".into(),
            expected: vec![3, 1],
            got: vec![2, 3]
        }
    );
    let (_, saved) = activation::forward(
        Activation::Tanh,
        &i.reshape(&[2]).map(|_| g.clone()).unwrap(),
        None,
        &d,
    )
    .unwrap();
    assert!(matches!(
        activation::backward(&saved, &Tensor::from_slice(e, &[0u32; 6], &[2, 3]).unwrap()),
        Err(Error::UnsupportedDType { .. })
    ));
    assert!(matches!(
        activation::erf(&i),
        Err(Error::UnsupportedDType { .. })
    ));
}

#[test]
fn tensors_of_another_engine_are_rejected() {
    let e = engine();
    let other = common::private_engine();
    let g = Tensor::zeros(e, &[4], DType::F32).unwrap();
    let u = Tensor::zeros(&other, &[4], DType::F32).unwrap();
    let d = ActivationOptions::default();
    assert!(matches!(
        activation::forward(Activation::Silu, &g, Some(&u), &d),
        Err(Error::EngineMismatch { .. })
    ));
    let (_, saved) = activation::forward(Activation::Silu, &g, None, &d).unwrap();
    assert!(matches!(
        activation::backward(&saved, &u),
        Err(Error::EngineMismatch { .. })
    ));
}

/// `backward_as` stores each gradient as the F32 gradient rounded once: bit for bit
/// `cast::cast` of [`activation::backward`]'s (a NaN as any NaN), for the unary, gated and packed layouts, every
/// input dtype into every gradient dtype. 16-bit tensors in whole steps of 8 (counts 8 and
/// 4,104; packed widths 8 and 2,056) take the 16-bit step kernels; other counts (12, 4,105),
/// widths (12) and dtypes the narrowed F32 gradients. The cotangent holds a NaN, both
/// infinities and a value whose F16 gradient overflows.
#[test]
fn backward_as_is_the_f32_gradient_rounded_once() {
    use DType::{BF16, F16, F32};
    let e = engine();
    let bits = common::value_bits;
    let narrowed = |t: &Tensor, d: DType| {
        if d == F32 {
            t.clone()
        } else {
            wgrad::cast::cast(t, d).unwrap()
        }
    };
    let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 9.0e4];
    let cotangent = |seed: u64, n: usize| {
        let mut v = data(seed, n, 1.0);
        for (slot, s) in v.iter_mut().step_by(5).zip(special) {
            *slot = s;
        }
        v
    };
    let opts = OPTS[1];
    for kind in [Activation::Silu, Activation::GeluTanh, Activation::Relu] {
        for dtype in DType::FLOATS {
            for out in DType::FLOATS {
                for n in [8usize, 12, 4104, 4105] {
                    let what = format!("{} {dtype} -> {out} n={n}", kind.name());
                    let g = tensor_from_f64(e, &data(150, n, 6.0), &[n], dtype);
                    let u = tensor_from_f64(e, &data(151, n, 2.0), &[n], dtype);
                    let dy = tensor_from_f64(e, &cotangent(152, n), &[n], dtype);
                    let (_, unary) = activation::forward(kind, &g, None, &opts).unwrap();
                    let (_, gated) = activation::forward(kind, &g, Some(&u), &opts).unwrap();
                    for (layout, saved) in [("unary", &unary), ("gated", &gated)] {
                        let want = activation::backward(saved, &dy).unwrap();
                        let got = activation::backward_as(saved, &dy, out).unwrap();
                        assert_eq!(got.dgate.dtype(), out, "{what} {layout}");
                        let dgate = narrowed(&want.dgate, out);
                        common::assert_same_bits(
                            &format!("{what} {layout} dgate"),
                            &got.dgate,
                            &dgate,
                        );
                        assert_eq!(got.dup.is_some(), want.dup.is_some(), "{what} {layout}");
                        if let (Some(a), Some(b)) = (&got.dup, &want.dup) {
                            assert_eq!(a.dtype(), out, "{what} {layout} dup dtype");
                            common::assert_same_bits(
                                &format!("{what} {layout} dup"),
                                a,
                                &narrowed(b, out),
                            );
                        }
                        let again = activation::backward_as(saved, &dy, out).unwrap();
                        assert_eq!(bits(&again.dgate), bits(&got.dgate), "{what} rerun");
                    }
                }
                for (rows, width) in [(3usize, 8usize), (2, 12), (2, 2056)] {
                    let what = format!("packed {} {dtype} -> {out} {rows}x{width}", kind.name());
                    let x = tensor_from_f64(
                        e,
                        &data(153, 2 * rows * width, 5.0),
                        &[rows, 2 * width],
                        dtype,
                    );
                    let dy =
                        tensor_from_f64(e, &cotangent(154, rows * width), &[rows, width], dtype);
                    let (_, saved) = activation::packed_forward(kind, &x, &opts).unwrap();
                    let want = narrowed(&activation::backward(&saved, &dy).unwrap().dgate, out);
                    let got = activation::backward_as(&saved, &dy, out).unwrap();
                    assert_eq!(got.dgate.shape(), x.shape(), "{what}");
                    common::assert_same_bits(&what, &got.dgate, &want);
                }
            }
        }
    }
    // Mixed 16-bit dtypes (direct) and an F32 gate among 16-bit tensors (narrowed).
    for (dg, du, dd, out) in [
        (BF16, F16, BF16, F16),
        (F16, BF16, F16, BF16),
        (F32, BF16, BF16, BF16),
    ] {
        let n = 4104;
        let g = tensor_from_f64(e, &data(155, n, 6.0), &[n], dg);
        let u = tensor_from_f64(e, &data(156, n, 2.0), &[n], du);
        let dy = tensor_from_f64(e, &cotangent(157, n), &[n], dd);
        let (_, saved) = activation::forward(Activation::Silu, &g, Some(&u), &opts).unwrap();
        let want = activation::backward(&saved, &dy).unwrap();
        let got = activation::backward_as(&saved, &dy, out).unwrap();
        let what = format!("mixed {dg} {du} {dd} -> {out}");
        common::assert_same_bits(
            &format!("{what} dgate"),
            &got.dgate,
            &narrowed(&want.dgate, out),
        );
        let dup = narrowed(want.dup.as_ref().unwrap(), out);
        common::assert_same_bits(&format!("{what} dup"), got.dup.as_ref().unwrap(), &dup);
    }
    // The 16-bit step kernels write the gradients directly: no F32 gradient exists on the way
    // (the peak grows by the two BF16 gradients, not by F32 ones too).
    let private = common::private_engine();
    let n = 1 << 16;
    let g = tensor_from_f64(&private, &data(159, n, 6.0), &[n], BF16);
    let (_, saved) = activation::forward(Activation::Silu, &g, Some(&g), &opts).unwrap();
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let got = activation::backward_as(&saved, &g, BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let direct = (2 * n * 2) as u64;
    assert!(
        grown <= direct * 9 / 8 + 4096,
        "peak grew {grown} bytes for {direct} bytes of BF16 gradients"
    );
    drop(got);
    // A gradient dtype that is not a float dtype; an empty input.
    let g = tensor_from_f64(e, &data(158, 16, 1.0), &[16], BF16);
    let (_, saved) = activation::forward(Activation::Silu, &g, None, &opts).unwrap();
    match activation::backward_as(&saved, &g, DType::I32) {
        Err(Error::UnsupportedDType { .. }) => {}
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
    let empty = tensor_from_f64(e, &[], &[0, 8], BF16);
    let (_, saved) = activation::forward(Activation::Silu, &empty, Some(&empty), &opts).unwrap();
    let got = activation::backward_as(&saved, &empty, BF16).unwrap();
    assert_eq!(got.dgate.shape(), &[0, 8]);
    assert_eq!(got.dgate.dtype(), BF16);
}

/// Every output and gradient of the activation entries on `e` (bit patterns): unary SiLU and
/// tanh-GELU, gated SwiGLU (F32 `up` beside a 16-bit gate too), packed GeGLU, each backward
/// with F32 gradients and with gradients in `dtype`.
fn activations_everything(
    e: &wgrad::Engine,
    n: usize,
    width: usize,
    dtype: DType,
) -> Vec<Vec<u64>> {
    let shape = [n / width, width];
    let g = tensor_from_f64(e, &data(31, n, 4.0), &shape, dtype);
    let u = tensor_from_f64(e, &data(32, n, 2.0), &shape, dtype);
    let u32_ = tensor_from_f64(e, &data(33, n, 2.0), &shape, DType::F32);
    let dy = tensor_from_f64(e, &data(34, n, 1.0), &shape, dtype);
    let packed = tensor_from_f64(e, &data(35, 2 * n, 3.0), &[n / width, 2 * width], dtype);
    let opts = ActivationOptions {
        gate_multiplier: 0.75,
        down_multiplier: 1.5,
    };
    let mut outs = Vec::new();
    let runs = [
        activation::forward(Activation::Silu, &g, None, &opts).unwrap(),
        activation::forward(Activation::GeluTanh, &g, None, &opts).unwrap(),
        activation::forward(Activation::Silu, &g, Some(&u), &opts).unwrap(),
        activation::forward(Activation::Silu, &g, Some(&u32_), &opts).unwrap(),
        activation::packed_forward(Activation::GeluTanh, &packed, &opts).unwrap(),
    ];
    for (y, saved) in runs {
        for d in [DType::F32, dtype] {
            let grads = activation::backward_as(&saved, &dy, d).unwrap();
            outs.push(grads.dgate);
            outs.extend(grads.dup);
        }
        outs.push(y);
    }
    outs.iter().map(common::value_bits).collect()
}

#[test]
fn activations_past_the_binding_limit_run_in_windows_with_the_same_bits() {
    // An engine binding at most 16 KiB: inputs, outputs and gradients many windows long (units
    // of 16 elements, packed rows), in element counts that take the 16-byte, 8-byte and
    // per-element kernels, give the one-binding run's bits.
    let small = common::capped_engine(16 << 10);
    for (n, width, dtype) in [
        (40_000, 40, DType::BF16),
        (30_000, 12, DType::F16),
        (21_000, 100, DType::F32),
        (9_999, 101, DType::BF16),
        (12_345, 5, DType::F32),
    ] {
        assert!(n * 4 > 16 << 10);
        let one = activations_everything(engine(), n, width, dtype);
        let windows = activations_everything(&small, n, width, dtype);
        for (k, (a, b)) in one.iter().zip(&windows).enumerate() {
            assert!(
                a == b,
                "{n} elements, rows of {width}, {dtype:?}: output {k} differs"
            );
        }
    }
}
