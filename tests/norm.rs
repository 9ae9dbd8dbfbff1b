//! Normalization family (`wgrad::norm`) against the f64 references of
//! `wgrad::reference::norm`: forward outputs, saved statistics and every gradient, in every
//! storage dtype, on ragged widths; finite differences of every reference gradient;
//! bit-identical reruns; every documented bad input's error.
//!
//! Tolerance: `Tolerance::for_dtype` of the compared output (the output dtype for forwards,
//! F32 for statistics and gradients), unscaled. References take the values actually stored.

mod common;

use common::{Rng, engine};
use wgrad::gradcheck::{Comparison, Tolerance, check_vjp, compare};
use wgrad::norm::{self, CastingMode, LayerNormOptions, NormKind, RmsNormOptions};
use wgrad::reference::norm as reference;
use wgrad::{DType, Error, Tensor};

const F32: Tolerance = Tolerance::for_dtype(DType::F32);

fn upload(data: &[f64], shape: &[usize], dtype: DType) -> (Tensor, Vec<f64>) {
    wgrad::gradcheck::tensor_from_f64(engine(), data, shape, dtype).expect("upload")
}

fn check(what: &str, got: &Tensor, want: &[f64], tol: Tolerance) -> Comparison {
    let c = compare(&got.to_f64().expect("read back"), want, tol);
    assert!(c.passed, "{what}: {c}");
    c
}

/// Tolerance of a source gradient. For width 1 the exact RMSNorm gradient is ε-sized
/// (`w·dy·ε/(x² + ε)^1.5`), the difference of two O(1) terms (`dn − n·mean(dn·n)` with
/// `n² = x²/(x² + ε)`), so FP32 can only meet it absolutely: the elementwise F32 bound stays,
/// the relative L2 bound is waived for that width alone.
fn dx_tol(cols: usize) -> Tolerance {
    if cols == 1 {
        Tolerance {
            rel_l2: f64::INFINITY,
            ..F32
        }
    } else {
        F32
    }
}

fn fd(what: &str, c: Comparison) {
    assert!(c.passed, "finite differences, {what}: {c}");
}

struct RmsCase {
    rows: usize,
    cols: usize,
    x: DType,
    weight: Option<DType>,
    dy: DType,
    options: RmsNormOptions,
}

fn run_rms(case: &RmsCase, seed: u64) {
    let RmsCase {
        rows, cols, x: xdt, ..
    } = *case;
    let what = format!(
        "rms_norm {rows}x{cols} x {xdt} w {:?} dy {} {:?}",
        case.weight, case.dy, case.options
    );
    let mut rng = Rng::new(seed);
    let (x, xs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], xdt);
    let w = case
        .weight
        .map(|dt| upload(&rng.vec(cols, -1.0, 1.5), &[cols], dt));
    let ws = w.as_ref().map(|w| w.1.as_slice());
    let o = case.options;
    let (y, saved) = norm::rms_norm(&x, w.as_ref().map(|w| &w.0), &o).unwrap();
    assert_eq!((y.shape(), y.dtype()), (x.shape(), xdt));
    let eps = f64::from(o.eps);
    let want = reference::rms_norm(
        &xs,
        rows,
        cols,
        ws,
        f64::from(o.offset),
        eps,
        o.casting,
        xdt,
    );
    check(&format!("{what}: y"), &y, &want, Tolerance::for_dtype(xdt));
    check(
        &format!("{what}: inverse"),
        &saved.inverse,
        &reference::inverse_rms(&xs, rows, cols, eps),
        F32,
    );
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], case.dy);
    let g = norm::norm_backward(&saved, &dy, None).unwrap();
    let r = reference::rms_norm_backward(&xs, rows, cols, ws, f64::from(o.offset), eps, &dys);
    assert_eq!(g.source.dtype(), DType::F32);
    check(&format!("{what}: dx"), &g.source, &r.source, dx_tol(cols));
    match (&g.weight, ws) {
        (Some(dw), Some(_)) => {
            assert_eq!(dw.shape(), &[cols]);
            check(&format!("{what}: dw"), dw, &r.weight, F32);
        }
        (None, None) => {}
        _ => panic!("{what}: weight gradient present iff weight given"),
    }
    assert!(g.bias.is_none() && g.residual.is_none() && g.scale.is_none());
}

#[test]
fn rms_norm_ragged_widths_every_dtype() {
    let mut seed = 0;
    for cols in [1, 3, 7, 127, 4097] {
        let rows = if cols > 1000 { 3 } else { 37 };
        for xdt in DType::FLOATS {
            seed += 1;
            run_rms(
                &RmsCase {
                    rows,
                    cols,
                    x: xdt,
                    weight: Some(xdt),
                    dy: xdt,
                    options: RmsNormOptions::default(),
                },
                seed,
            );
        }
    }
}

#[test]
fn rms_norm_casting_modes_offsets_and_mixed_dtypes() {
    let mut seed = 100;
    // Width 66 takes the general forward; width 64 the register path (whole 4/8-value chunks).
    for cols in [66, 64] {
        for casting in [CastingMode::Llama, CastingMode::Gemma, CastingMode::None] {
            for offset in [0.0, 1.0] {
                for (xdt, wdt, dydt) in [
                    (DType::BF16, DType::F32, DType::BF16),
                    (DType::F16, DType::BF16, DType::F32),
                    (DType::F32, DType::F16, DType::F16),
                ] {
                    seed += 1;
                    run_rms(
                        &RmsCase {
                            rows: 19,
                            cols,
                            x: xdt,
                            weight: Some(wdt),
                            dy: dydt,
                            options: RmsNormOptions {
                                eps: 1e-6,
                                offset,
                                casting,
                            },
                        },
                        seed,
                    );
                }
            }
        }
    }
}

#[test]
fn rms_norm_register_path_limits() {
    // The register paths hold at most 8 chunks of 4 (F32) or 8 (16-bit) values per lane:
    // 256 lanes (forward and one-read backward) up to 8,192 F32 / 16,384 16-bit columns; then
    // 1,024 lanes: the two-read backward up to 8 chunks a lane for F32 (32,768 columns), 4 for
    // 16-bit (32,768), the forward up to 8 (32,768 / 65,536); then the chunk passes (the
    // backward) and the general kernels. Each limit and the next width up; the weight
    // alternately in the source's dtype (read as chunks) and in F32.
    for (i, (xdt, cols)) in [
        (DType::F32, 8192),
        (DType::F32, 8196),
        (DType::BF16, 16384),
        (DType::F16, 16392),
        (DType::F32, 16384),
        (DType::F32, 16388),
        (DType::BF16, 32768),
        (DType::F16, 32776),
        (DType::F32, 32768),
        (DType::F32, 32772),
        (DType::BF16, 65536),
        (DType::F16, 65544),
    ]
    .into_iter()
    .enumerate()
    {
        let wdt = if i % 2 == 0 { xdt } else { DType::F32 };
        run_rms(
            &RmsCase {
                rows: 2,
                cols,
                x: xdt,
                weight: Some(wdt),
                dy: xdt,
                options: RmsNormOptions::default(),
            },
            cols as u64 + wdt.code() as u64,
        );
    }
}

#[test]
fn register_backward_blocks_and_chunk_counts() {
    // Row counts that give blocks of several rows with a shorter last block (1,001 rows:
    // 251 blocks of 4, the last of 1), and widths of 1, 2, 4 and 8 chunks per lane.
    let mut seed = 5000;
    for (rows, cols) in [(1001, 16), (1001, 24), (7, 1028), (5, 2056), (3, 4100)] {
        for xdt in DType::FLOATS {
            seed += 1;
            run_rms(
                &RmsCase {
                    rows,
                    cols,
                    x: xdt,
                    weight: Some(xdt),
                    dy: xdt,
                    options: RmsNormOptions::default(),
                },
                seed,
            );
            run_layer(rows, cols, xdt, true, true, 0.0, seed + 50);
            run_add(
                rows,
                cols,
                xdt,
                xdt,
                Some(xdt),
                RmsNormOptions::default(),
                seed + 100,
            );
        }
    }
}

#[test]
fn rms_norm_without_weight() {
    for (k, (rows, cols)) in [(5, 9), (40, 64)].into_iter().enumerate() {
        for xdt in DType::FLOATS {
            run_rms(
                &RmsCase {
                    rows,
                    cols,
                    x: xdt,
                    weight: None,
                    dy: DType::F32,
                    options: RmsNormOptions::default(),
                },
                200 + k as u64,
            );
        }
    }
}

#[test]
fn rms_norm_liger_shapes() {
    // Liger's test shapes (2, 128, 512) and (5, 123, 123), flattened to rows.
    for (k, (rows, cols)) in [(256, 512), (615, 123)].into_iter().enumerate() {
        for xdt in [DType::F32, DType::BF16] {
            for casting in [CastingMode::Llama, CastingMode::Gemma] {
                run_rms(
                    &RmsCase {
                        rows,
                        cols,
                        x: xdt,
                        weight: Some(xdt),
                        dy: xdt,
                        options: RmsNormOptions {
                            casting,
                            offset: if casting == CastingMode::Gemma {
                                1.0
                            } else {
                                0.0
                            },
                            ..RmsNormOptions::default()
                        },
                    },
                    300 + k as u64,
                );
            }
        }
    }
}

#[test]
fn rms_norm_one_65536_wide_row() {
    for xdt in [DType::F32, DType::BF16] {
        run_rms(
            &RmsCase {
                rows: 1,
                cols: 65_536,
                x: xdt,
                weight: Some(DType::F32),
                dy: DType::F32,
                options: RmsNormOptions::default(),
            },
            400,
        );
    }
}

#[test]
fn leading_axes_flatten_to_rows() {
    let mut rng = Rng::new(5);
    let (x, xs) = upload(&rng.vec(2 * 3 * 10, -1.0, 1.0), &[2, 3, 10], DType::F32);
    let (y, saved) = norm::rms_norm(&x, None, &RmsNormOptions::default()).unwrap();
    assert_eq!(y.shape(), &[2, 3, 10]);
    assert_eq!(saved.inverse.shape(), &[2, 3]);
    let want = reference::rms_norm(&xs, 6, 10, None, 0.0, 1e-5, CastingMode::Llama, DType::F32);
    check("rms_norm [2, 3, 10]", &y, &want, F32);
    // A 1-D source is one row.
    let (v, vs) = upload(&xs[..10], &[10], DType::F32);
    let (y, saved) = norm::rms_norm(&v, None, &RmsNormOptions::default()).unwrap();
    assert_eq!(saved.inverse.len(), 1);
    let want = reference::rms_norm(&vs, 1, 10, None, 0.0, 1e-5, CastingMode::Llama, DType::F32);
    check("rms_norm [10]", &y, &want, F32);
}

fn run_layer(
    rows: usize,
    cols: usize,
    dt: DType,
    weight: bool,
    bias: bool,
    offset: f64,
    seed: u64,
) {
    let what = format!("layer_norm {rows}x{cols} {dt} w {weight} b {bias} offset {offset}");
    let data: Vec<f64> = Rng::new(seed)
        .vec(rows * cols, -1.0, 1.0)
        .into_iter()
        .map(|v| v + offset)
        .collect();
    run_layer_on(&what, &data, (rows, cols), dt, weight, bias, seed);
}

/// `run_layer` on given source values (`rows × cols`, stored in `dt`).
fn run_layer_on(
    what: &str,
    data: &[f64],
    (rows, cols): (usize, usize),
    dt: DType,
    weight: bool,
    bias: bool,
    seed: u64,
) {
    let mut rng = Rng::new(seed + 7);
    let (x, xs) = upload(data, &[rows, cols], dt);
    let w = weight.then(|| upload(&rng.vec(cols, 0.5, 1.5), &[cols], dt));
    let b = bias.then(|| upload(&rng.vec(cols, -0.5, 0.5), &[cols], DType::F32));
    let ws = w.as_ref().map(|w| w.1.as_slice());
    let bs = b.as_ref().map(|b| b.1.as_slice());
    let eps = 1e-5;
    let (y, saved) = norm::layer_norm(
        &x,
        w.as_ref().map(|w| &w.0),
        b.as_ref().map(|b| &b.0),
        &LayerNormOptions::default(),
    )
    .unwrap();
    assert_eq!((y.shape(), y.dtype()), (x.shape(), dt));
    check(
        &format!("{what}: y"),
        &y,
        &reference::layer_norm(&xs, rows, cols, ws, bs, eps),
        Tolerance::for_dtype(dt),
    );
    let (mean, inv) = reference::mean_inverse_std(&xs, rows, cols, eps);
    check(&format!("{what}: inverse"), &saved.inverse, &inv, F32);
    // The exact mean is `mean + correction` (the FP32 mean alone is off by up to an ulp of
    // the row's first value, large relative to a mean near zero).
    let saved_mean = saved.mean.as_ref().expect("layer norm saves the mean");
    let correction = saved.mean_correction.as_ref().expect("and its correction");
    let exact: Vec<f64> = saved_mean
        .to_f64()
        .unwrap()
        .iter()
        .zip(correction.to_f64().unwrap())
        .map(|(m, c)| m + c)
        .collect();
    // Judged against the row's spread, not the mean's own size (a mean near zero has no
    // relative precision to keep): FP32 summation of the row to within 1e-6 of its spread.
    for (r, (got, want)) in exact.iter().zip(&mean).enumerate() {
        let row = &xs[r * cols..(r + 1) * cols];
        let spread = row.iter().fold(0.0f64, |m, v| m.max((v - want).abs()));
        assert!(
            (got - want).abs() <= 1e-6 * spread,
            "{what}: mean of row {r}: {got} against {want} (spread {spread})"
        );
    }
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], DType::BF16);
    let g = norm::norm_backward(&saved, &dy, None).unwrap();
    let r = reference::layer_norm_backward(&xs, rows, cols, ws, eps, &dys);
    check(&format!("{what}: dx"), &g.source, &r.source, dx_tol(cols));
    assert_eq!(g.weight.is_some(), weight, "{what}");
    assert_eq!(g.bias.is_some(), bias, "{what}");
    if let Some(dw) = &g.weight {
        check(&format!("{what}: dw"), dw, &r.weight, F32);
    }
    if let Some(db) = &g.bias {
        check(&format!("{what}: db"), db, &r.bias, F32);
    }
}

#[test]
fn layer_norm_every_dtype_and_width() {
    let mut seed = 500;
    for cols in [1, 3, 7, 127, 4097] {
        let rows = if cols > 1000 { 3 } else { 41 };
        for dt in DType::FLOATS {
            seed += 1;
            run_layer(rows, cols, dt, true, true, 0.0, seed);
        }
    }
    run_layer(10, 33, DType::F32, false, true, 0.0, 550);
    run_layer(10, 33, DType::F16, true, false, 0.0, 551);
    run_layer(10, 33, DType::BF16, false, false, 0.0, 552);
    for dt in [DType::F32, DType::BF16] {
        run_layer(256, 512, dt, true, true, 0.0, 553);
        run_layer(615, 123, dt, true, true, 0.0, 554);
    }
    run_layer(1, 65_536, DType::F32, true, true, 0.0, 555);
}

#[test]
fn layer_norm_register_path_limits() {
    // Whole 4-value (F32) or 8-value (16-bit) chunks, at most 8 per lane, take the register
    // path: its narrowest and widest rows, and the next widths up (the general forward).
    let mut seed = 570;
    for (dt, cols) in [
        (DType::F32, 4),
        (DType::F16, 8),
        (DType::F32, 8192),
        (DType::F32, 8196),
        (DType::BF16, 16384),
        (DType::F16, 16392),
        (DType::F32, 32768),
        (DType::F32, 32772),
        (DType::BF16, 65536),
        (DType::F16, 65544),
    ] {
        seed += 1;
        run_layer(3, cols, dt, true, true, 0.0, seed);
        run_layer(2, cols, dt, false, false, 0.0, seed + 100);
    }
    // A large common offset through the register path (F32, 256 = 64 chunks of 4).
    run_layer(5, 256, DType::F32, true, true, 1e4, 580);
}

#[test]
fn layer_norm_rows_whose_first_chunk_lies_far_from_their_mean() {
    // The forwards' variance about the mean of the row's first values (the register path's
    // first chunk, the general path's first eight) cancels too much when those lie far from
    // the row's mean; such rows take the centered second pass. Rows alternate: the first
    // chunk (4 F32 / 8 16-bit values) at 1e3, 30 or −500 against noise in [-1, 1) (the second
    // pass), the same rows with the outliers last (one pass), and noise around a common 1e3
    // (one pass). Widths of whole chunks take the register path, the others the general one.
    for (dt, cols, seed) in [
        (DType::F32, 256, 590),
        (DType::BF16, 512, 591),
        (DType::F32, 8192, 592),
        (DType::F32, 8191, 593),
        (DType::BF16, 4093, 594),
    ] {
        let rows = 9;
        let first = if dt == DType::F32 { 4 } else { 8 };
        let mut data = Rng::new(seed).vec(rows * cols, -1.0, 1.0);
        for r in 0..rows {
            let at = [1e3, 30.0, -500.0][r % 3];
            let row = &mut data[r * cols..(r + 1) * cols];
            match r / 3 {
                0 => row[..first].iter_mut().for_each(|v| *v += at),
                1 => row[cols - first..].iter_mut().for_each(|v| *v += at),
                _ => row.iter_mut().for_each(|v| *v += 1e3),
            }
        }
        let what = format!("layer_norm {rows}x{cols} {dt}, outlying first chunks");
        run_layer_on(&what, &data, (rows, cols), dt, true, true, seed);
    }
}

#[test]
fn register_forward_lane_rule() {
    use norm::forward_lanes;
    // (kind, chunks a row, adapter lanes) → lanes: about four chunks a lane (RMSNorm), within
    // 256..512 where it fits (LayerNorm), about two (add+RMSNorm), capped by the adapter, at
    // most 8 chunks a lane, never more lanes than chunks beyond 256; 16-bit RMSNorm and
    // LayerNorm rows of 1,024 chunks and more on at least 512 lanes.
    for (kind, chunks, max, half, want) in [
        (NormKind::Rms, 1024, 1024, true, Some(512)),
        (NormKind::Rms, 1023, 1024, true, Some(256)),
        (NormKind::Rms, 640, 1024, true, Some(256)),
        (NormKind::Rms, 512, 1024, true, Some(256)),
        (NormKind::Rms, 2048, 1024, true, Some(512)),
        (NormKind::Rms, 4096, 1024, true, Some(1024)),
        (NormKind::Rms, 1024, 256, true, Some(256)),
        (NormKind::Layer, 1024, 1024, true, Some(512)),
        (NormKind::Layer, 4096, 1024, true, Some(512)),
        (NormKind::AddRms, 1024, 1024, true, Some(512)),
        (NormKind::Group, 1024, 1024, true, Some(256)),
        (NormKind::Modulated, 1024, 1024, true, Some(256)),
    ] {
        assert_eq!(
            forward_lanes(kind, chunks, max, half),
            want,
            "{kind:?} {chunks} {max} 16-bit"
        );
    }
    for (kind, chunks, max, want) in [
        (NormKind::Rms, 2048, 1024, Some(512)),
        (NormKind::Rms, 1024, 1024, Some(256)),
        (NormKind::Rms, 4096, 1024, Some(1024)),
        (NormKind::Rms, 8192, 1024, Some(1024)),
        (NormKind::Rms, 2048, 256, Some(256)),
        (NormKind::Rms, 4096, 256, None),
        (NormKind::Rms, 1, 1024, Some(256)),
        (NormKind::Layer, 2048, 1024, Some(512)),
        (NormKind::Layer, 4096, 1024, Some(512)),
        (NormKind::Layer, 8192, 1024, Some(1024)),
        (NormKind::Layer, 4096, 256, None),
        (NormKind::AddRms, 2048, 1024, Some(1024)),
        (NormKind::AddRms, 1024, 1024, Some(512)),
        (NormKind::AddRms, 512, 1024, Some(512)),
        (NormKind::AddRms, 256, 1024, Some(256)),
        (NormKind::AddRms, 2048, 512, Some(512)),
    ] {
        assert_eq!(
            forward_lanes(kind, chunks, max, false),
            want,
            "{kind:?} {chunks} {max}"
        );
    }
}

#[test]
fn register_backward_lane_rule() {
    use norm::mid_backward;
    // 512 lanes: F32 sources from 1,024 chunks; 16-bit sources keep 256.
    assert!(mid_backward(DType::F32, 1024));
    assert!(mid_backward(DType::F32, 2048));
    assert!(!mid_backward(DType::F32, 512));
    assert!(!mid_backward(DType::BF16, 2048));
    assert!(!mid_backward(DType::F16, 1024));
}

#[test]
fn register_forwards_on_every_lane_count() {
    // The register forwards and backwards forced to 256, 512 and 1,024 lanes (rows of 1 to 8
    // chunks a lane for each), RMSNorm and LayerNorm (with a 1e4 offset), against the
    // reference.
    let mut seed = 590;
    for lanes in [256u64, 512, 1024] {
        norm::force_forward_lanes(Some(lanes));
        norm::force_backward_lanes(Some(lanes));
        for (dt, cols) in [
            (DType::F32, 4),
            (DType::F32, 2048),
            (DType::BF16, 4096),
            (DType::F32, 8192),
            (DType::F16, 16384),
        ] {
            seed += 1;
            run_layer(3, cols, dt, true, true, 1e4, seed);
            run_rms(
                &RmsCase {
                    rows: 3,
                    cols,
                    x: dt,
                    weight: Some(dt),
                    dy: dt,
                    options: RmsNormOptions::default(),
                },
                seed + 50,
            );
        }
        norm::force_forward_lanes(None);
        norm::force_backward_lanes(None);
    }
}

#[test]
fn register_paths_in_segments() {
    // The register forwards and backwards with rows of 2 and 4 lanes (segments), the rule
    // (segments of the adapter's subgroup width where the row fits; without subgroups, one row
    // a workgroup) and none, against the reference (the backwards' parameter gradients add the
    // segments' partials): rows of 1 to 8 chunks a lane, a row count that leaves the
    // last workgroup part empty, every kind (LayerNorm with a 1e4 offset and with outlying
    // first chunks, which take the second pass), then reruns bit for bit.
    let mut seed = 3100;
    for seg in [Some(2u64), Some(4), None, Some(0)] {
        norm::force_segments(seg);
        for (dt, cols) in [
            (DType::F32, 4),
            (DType::F32, 24),
            (DType::F32, 128),
            (DType::BF16, 64),
            (DType::F16, 256),
        ] {
            seed += 1;
            run_rms(
                &RmsCase {
                    rows: 37,
                    cols,
                    x: dt,
                    weight: Some(dt),
                    dy: dt,
                    options: RmsNormOptions::default(),
                },
                seed,
            );
            run_layer(37, cols, dt, true, true, 1e4, seed + 1);
            run_add(
                37,
                cols,
                dt,
                dt,
                Some(dt),
                RmsNormOptions::default(),
                seed + 2,
            );
            run_modulated(36, cols, 3, dt, true, seed + 3);
            run_poly(37, cols, dt, true, seed + 4);
            let first = if dt == DType::F32 { 4 } else { 8 };
            let mut data = Rng::new(seed + 5).vec(9 * cols, -1.0, 1.0);
            for r in 0..9 {
                data[r * cols..r * cols + first.min(cols)]
                    .iter_mut()
                    .for_each(|v| *v += [1e3, 30.0, -500.0][r % 3]);
            }
            let what = format!("layer_norm 9x{cols} {dt}, outlying first chunks, seg {seg:?}");
            run_layer_on(&what, &data, (9, cols), dt, true, true, seed + 5);
        }
        // GroupNorm: the backward in segments too; with the parameter partials from its
        // registers where a channel's chunks are a multiple of the segment ([16] F32 and [32]
        // in segments of 2 and 4; [64] and [32] F32 in segments of 8, the rule on lavapipe).
        for dt in DType::FLOATS {
            seed += 1;
            run_group_dy((5, 8, &[16][..], 2), dt, dt, true, 0.0, seed);
            run_group_dy((3, 4, &[64][..], 1), dt, DType::F32, false, 0.0, seed + 1);
            run_group_dy((4, 6, &[32][..], 3), dt, dt, true, 0.0, seed + 2);
            run_group_dy((2, 4, &[64][..], 2), dt, dt, true, 0.0, seed + 3);
        }
        // Reruns: one row a workgroup and in segments each give their bits again.
        let mut rng = Rng::new(seed);
        let (x, _) = upload(&rng.vec(70 * 128, -2.0, 2.0), &[70, 128], DType::F32);
        let (w, _) = upload(&rng.vec(128, 0.5, 1.5), &[128], DType::F32);
        let run = || {
            let (y1, s1) = norm::rms_norm(&x, Some(&w), &RmsNormOptions::default()).unwrap();
            let (y2, s2) =
                norm::layer_norm(&x, Some(&w), Some(&w), &LayerNormOptions::default()).unwrap();
            [bits(&y1), bits(&s1.inverse), bits(&y2), bits(&s2.inverse)]
        };
        assert!(run() == run(), "segments {seg:?}: second run differs");
    }
    norm::force_segments(None);
}

#[test]
fn layer_norm_centers_a_large_common_offset() {
    // 1e4 + noise in [-1, 1): F32 (a 16-bit dtype would round the noise away at 1e4).
    for (rows, cols) in [(16, 300), (3, 4097)] {
        run_layer(rows, cols, DType::F32, true, true, 1e4, 600);
    }
}

fn run_add(
    rows: usize,
    cols: usize,
    xdt: DType,
    rdt: DType,
    dsum: Option<DType>,
    o: RmsNormOptions,
    seed: u64,
) {
    let what = format!("add_rms_norm {rows}x{cols} x {xdt} r {rdt} dsum {dsum:?} {o:?}");
    let mut rng = Rng::new(seed);
    let (x, xs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], xdt);
    let (r, rs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], rdt);
    let (w, ws) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], DType::F32);
    let eps = f64::from(o.eps);
    let offset = f64::from(o.offset);
    let (y, sum, saved) = norm::add_rms_norm(&x, &r, Some(&w), &o).unwrap();
    assert_eq!((y.dtype(), sum.dtype()), (xdt, xdt));
    assert_eq!((y.shape(), sum.shape()), (x.shape(), x.shape()));
    let (want_y, want_s) =
        reference::add_rms_norm(&xs, &rs, rows, cols, Some(&ws), offset, eps, o.casting, xdt);
    check(
        &format!("{what}: y"),
        &y,
        &want_y,
        Tolerance::for_dtype(xdt),
    );
    check(
        &format!("{what}: sum"),
        &sum,
        &want_s,
        Tolerance::for_dtype(xdt),
    );
    let s: Vec<f64> = xs.iter().zip(&rs).map(|(a, b)| a + b).collect();
    check(
        &format!("{what}: inverse"),
        &saved.inverse,
        &reference::inverse_rms(&s, rows, cols, eps),
        F32,
    );
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], xdt);
    let ds = dsum.map(|dt| upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt));
    let g = norm::norm_backward(&saved, &dy, ds.as_ref().map(|d| &d.0)).unwrap();
    let want = reference::add_rms_norm_backward(
        &xs,
        &rs,
        rows,
        cols,
        Some(&ws),
        offset,
        eps,
        &dys,
        ds.as_ref().map(|d| d.1.as_slice()),
    );
    check(
        &format!("{what}: dx"),
        &g.source,
        &want.source,
        dx_tol(cols),
    );
    check(
        &format!("{what}: dresidual"),
        g.residual.as_ref().expect("residual gradient"),
        &want.source,
        dx_tol(cols),
    );
    check(
        &format!("{what}: dw"),
        g.weight.as_ref().expect("weight gradient"),
        &want.weight,
        F32,
    );
}

#[test]
fn add_rms_norm_both_residual_seeds() {
    let mut seed = 700;
    for cols in [1, 3, 7, 127, 4097] {
        let rows = if cols > 1000 { 2 } else { 35 };
        for xdt in DType::FLOATS {
            for dsum in [None, Some(DType::F16), Some(xdt)] {
                seed += 1;
                run_add(rows, cols, xdt, xdt, dsum, RmsNormOptions::default(), seed);
            }
        }
    }
    for casting in [CastingMode::Llama, CastingMode::Gemma, CastingMode::None] {
        seed += 1;
        let o = RmsNormOptions {
            casting,
            offset: 1.0,
            ..RmsNormOptions::default()
        };
        run_add(21, 50, DType::BF16, DType::F32, Some(DType::F16), o, seed);
        run_add(
            21,
            48,
            DType::BF16,
            DType::BF16,
            Some(DType::BF16),
            o,
            seed + 10,
        );
    }
    run_add(
        256,
        512,
        DType::BF16,
        DType::BF16,
        Some(DType::F16),
        RmsNormOptions::default(),
        790,
    );
    // The register paths' limits (see `rms_norm_register_path_limits`).
    for (xdt, cols) in [
        (DType::F32, 8192),
        (DType::F32, 8196),
        (DType::BF16, 16384),
        (DType::F32, 16384),
        (DType::F32, 16388),
        (DType::BF16, 32768),
        (DType::F32, 32772),
        (DType::F16, 65536),
    ] {
        seed += 1;
        run_add(
            2,
            cols,
            xdt,
            xdt,
            Some(xdt),
            RmsNormOptions::default(),
            seed,
        );
    }
}

/// Modulated RMSNorm against the reference; `params`: the weight's, scale's and shift's dtypes.
fn run_modulated_with(
    (rows, cols, batches): (usize, usize, usize),
    xdt: DType,
    params: [DType; 3],
    weight: bool,
    seed: u64,
) {
    let what = format!(
        "modulated_rms_norm {rows}x{cols} batches {batches} {xdt} w {weight} params {params:?}"
    );
    let mut rng = Rng::new(seed);
    let (x, xs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], xdt);
    let w = weight.then(|| upload(&rng.vec(cols, 0.5, 1.5), &[cols], params[0]));
    let ws = w.as_ref().map(|w| w.1.as_slice());
    let (sc, scs) = upload(
        &rng.vec(batches * cols, -0.5, 0.5),
        &[batches, cols],
        params[1],
    );
    let (sh, shs) = upload(
        &rng.vec(batches * cols, -0.5, 0.5),
        &[batches, cols],
        params[2],
    );
    let o = RmsNormOptions {
        offset: 1.0,
        ..RmsNormOptions::default()
    };
    let (y, saved) = norm::modulated_rms_norm(&x, w.as_ref().map(|w| &w.0), &sc, &sh, &o).unwrap();
    let want = reference::modulated_rms_norm(&xs, rows, cols, batches, ws, 1.0, &scs, &shs, 1e-5);
    check(&format!("{what}: y"), &y, &want, Tolerance::for_dtype(xdt));
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], DType::F32);
    let g = norm::norm_backward(&saved, &dy, None).unwrap();
    let r =
        reference::modulated_rms_norm_backward(&xs, rows, cols, batches, ws, 1.0, &scs, 1e-5, &dys);
    check(&format!("{what}: dx"), &g.source, &r.source, dx_tol(cols));
    if weight {
        check(
            &format!("{what}: dw"),
            g.weight.as_ref().unwrap(),
            &r.weight,
            F32,
        );
    } else {
        assert!(g.weight.is_none());
    }
    let dscale = g.scale.as_ref().expect("scale gradient");
    let dshift = g.shift.as_ref().expect("shift gradient");
    assert_eq!(
        (dscale.shape(), dshift.shape()),
        (&[batches, cols][..], &[batches, cols][..])
    );
    check(&format!("{what}: dscale"), dscale, &r.scale, F32);
    check(&format!("{what}: dshift"), dshift, &r.bias, F32);
}

fn run_modulated(rows: usize, cols: usize, batches: usize, xdt: DType, weight: bool, seed: u64) {
    let params = [DType::BF16, DType::F16, DType::F32];
    run_modulated_with((rows, cols, batches), xdt, params, weight, seed);
}

#[test]
fn modulated_rms_norm_register_forward() {
    // Rows of whole chunks take the register forward (256 and 1,024 lanes): scale and shift of
    // the source's dtype read as chunks, of other dtypes value by value, with and without a
    // weight, against the reference.
    let mut seed = 860;
    for (rows, cols, batches) in [(6, 8, 3), (70, 128, 2), (4, 4096, 2), (3, 16384, 3)] {
        for xdt in DType::FLOATS {
            seed += 1;
            run_modulated_with((rows, cols, batches), xdt, [xdt; 3], true, seed);
            run_modulated(rows, cols, batches, xdt, true, seed + 100);
        }
    }
    run_modulated_with((8, 64, 4), DType::BF16, [DType::BF16; 3], false, 990);
}

#[test]
fn modulated_rms_norm_every_dtype() {
    let mut seed = 800;
    for (rows, cols, batches) in [(1, 1, 1), (12, 7, 3), (70, 130, 2), (4, 4097, 2)] {
        for xdt in DType::FLOATS {
            seed += 1;
            run_modulated(rows, cols, batches, xdt, true, seed);
        }
    }
    run_modulated(10, 6, 5, DType::F32, false, 850);
}

/// Finite differences of every reference gradient on small shapes (F32 references: the
/// roundings of the casting modes are the identity there).
#[test]
fn reference_gradients_match_finite_differences() {
    let (rows, cols) = (3, 5);
    let n = rows * cols;
    let mut rng = Rng::new(900);
    let x = rng.vec(n, -2.0, 2.0);
    let r = rng.vec(n, -2.0, 2.0);
    let w = rng.vec(cols, 0.5, 1.5);
    let b = rng.vec(cols, -0.5, 0.5);
    let dy = rng.vec(n, -1.0, 1.0);
    let eps = 1e-5;
    let ll = CastingMode::Llama;

    for offset in [0.0, 1.0] {
        let g = reference::rms_norm_backward(&x, rows, cols, Some(&w), offset, eps, &dy);
        let f =
            |x: &[f64]| reference::rms_norm(x, rows, cols, Some(&w), offset, eps, ll, DType::F32);
        fd("rms dx", check_vjp(f, &x, &dy, &g.source));
        let f =
            |w: &[f64]| reference::rms_norm(&x, rows, cols, Some(w), offset, eps, ll, DType::F32);
        fd("rms dw", check_vjp(f, &w, &dy, &g.weight));
    }
    let g = reference::rms_norm_backward(&x, rows, cols, None, 0.0, eps, &dy);
    let f = |x: &[f64]| reference::rms_norm(x, rows, cols, None, 0.0, eps, ll, DType::F32);
    fd("rms dx (no weight)", check_vjp(f, &x, &dy, &g.source));

    // LayerNorm, with a common offset too.
    let shifted: Vec<f64> = x.iter().map(|v| v + 100.0).collect();
    for x in [&x, &shifted] {
        let g = reference::layer_norm_backward(x, rows, cols, Some(&w), eps, &dy);
        let f = |x: &[f64]| reference::layer_norm(x, rows, cols, Some(&w), Some(&b), eps);
        fd("layer dx", check_vjp(f, x, &dy, &g.source));
        let f = |w: &[f64]| reference::layer_norm(x, rows, cols, Some(w), Some(&b), eps);
        fd("layer dw", check_vjp(f, &w, &dy, &g.weight));
        let f = |b: &[f64]| reference::layer_norm(x, rows, cols, Some(&w), Some(b), eps);
        fd("layer db", check_vjp(f, &b, &dy, &g.bias));
    }

    // add+RMSNorm: both outputs' cotangents at once.
    let ds = rng.vec(n, -1.0, 1.0);
    let both: Vec<f64> = dy.iter().chain(&ds).copied().collect();
    let g =
        reference::add_rms_norm_backward(&x, &r, rows, cols, Some(&w), 1.0, eps, &dy, Some(&ds));
    let out = |x: &[f64], r: &[f64], w: &[f64]| {
        let (y, s) = reference::add_rms_norm(x, r, rows, cols, Some(w), 1.0, eps, ll, DType::F32);
        y.into_iter().chain(s).collect::<Vec<_>>()
    };
    fd(
        "add dx",
        check_vjp(|x| out(x, &r, &w), &x, &both, &g.source),
    );
    fd(
        "add dresidual",
        check_vjp(|r| out(&x, r, &w), &r, &both, &g.source),
    );
    fd(
        "add dw",
        check_vjp(|w| out(&x, &r, w), &w, &both, &g.weight),
    );
    let g0 = reference::add_rms_norm_backward(&x, &r, rows, cols, Some(&w), 1.0, eps, &dy, None);
    let y_only = |x: &[f64]| {
        reference::add_rms_norm(x, &r, rows, cols, Some(&w), 1.0, eps, ll, DType::F32).0
    };
    fd("add dx (no dsum)", check_vjp(y_only, &x, &dy, &g0.source));

    // Modulated RMSNorm, 3 rows in 3 batches.
    let batches = 3;
    let sc = rng.vec(batches * cols, -0.5, 0.5);
    let sh = rng.vec(batches * cols, -0.5, 0.5);
    let g = reference::modulated_rms_norm_backward(
        &x,
        rows,
        cols,
        batches,
        Some(&w),
        1.0,
        &sc,
        eps,
        &dy,
    );
    let m = |x: &[f64], w: &[f64], sc: &[f64], sh: &[f64]| {
        reference::modulated_rms_norm(x, rows, cols, batches, Some(w), 1.0, sc, sh, eps)
    };
    fd(
        "mod dx",
        check_vjp(|x| m(x, &w, &sc, &sh), &x, &dy, &g.source),
    );
    fd(
        "mod dw",
        check_vjp(|w| m(&x, w, &sc, &sh), &w, &dy, &g.weight),
    );
    fd(
        "mod dscale",
        check_vjp(|s| m(&x, &w, s, &sh), &sc, &dy, &g.scale),
    );
    fd(
        "mod dshift",
        check_vjp(|s| m(&x, &w, &sc, s), &sh, &dy, &g.bias),
    );
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64().unwrap().into_iter().map(f64::to_bits).collect()
}

#[test]
fn reruns_are_bit_identical() {
    let (rows, cols, batches) = (130, 301, 2);
    let mut rng = Rng::new(1000);
    let (x, _) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], DType::BF16);
    let (r, _) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], DType::F32);
    let (w, _) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], DType::F32);
    let (b, _) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], DType::F32);
    let (sc, _) = upload(
        &rng.vec(batches * cols, -0.5, 0.5),
        &[batches, cols],
        DType::F32,
    );
    let (dy, _) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], DType::F32);
    let o = RmsNormOptions::default();
    let run = || -> Vec<Vec<u64>> {
        let mut out = Vec::new();
        let (y1, s1) = norm::rms_norm(&x, Some(&w), &o).unwrap();
        let (y2, s2) =
            norm::layer_norm(&x, Some(&w), Some(&b), &LayerNormOptions::default()).unwrap();
        let (y3, sum, s3) = norm::add_rms_norm(&x, &r, Some(&w), &o).unwrap();
        let (y4, s4) = norm::modulated_rms_norm(&x, Some(&w), &sc, &sc, &o).unwrap();
        for y in [&y1, &y2, &y3, &sum, &y4] {
            out.push(bits(y));
        }
        for (s, d) in [(&s1, None), (&s2, None), (&s3, Some(&dy)), (&s4, None)] {
            let g = norm::norm_backward(s, &dy, d).unwrap();
            for t in [
                Some(&g.source),
                g.weight.as_ref(),
                g.bias.as_ref(),
                g.scale.as_ref(),
                g.shift.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                out.push(bits(t));
            }
        }
        out
    };
    let first = run();
    assert_eq!(first.len(), 5 + 1 + 1 + 2 + 1 + 2 + 1 + 3);
    assert!(first == run(), "second run differs");
}

#[test]
fn register_path_reruns_are_bit_identical() {
    // 256 lanes with blocks of 4 rows (300 rows, 64 columns) and 1,024 lanes (8,196 F32 /
    // 16,392 16-bit columns: forward and, for the RMSNorm variants, the two-read backward).
    for (rows, cols, dt) in [
        (300, 64, DType::F32),
        (300, 64, DType::BF16),
        (3, 8196, DType::F32),
        (3, 16392, DType::F16),
    ] {
        let mut rng = Rng::new(1100 + cols as u64);
        let (x, _) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], dt);
        let (r, _) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], dt);
        let (w, _) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], dt);
        let (b, _) = upload(&rng.vec(cols, -0.5, 0.5), &[cols], dt);
        let (dy, _) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt);
        let o = RmsNormOptions::default();
        let run = || -> Vec<Vec<u64>> {
            let mut out = Vec::new();
            let (y1, s1) = norm::rms_norm(&x, Some(&w), &o).unwrap();
            let (y2, s2) =
                norm::layer_norm(&x, Some(&w), Some(&b), &LayerNormOptions::default()).unwrap();
            let (y3, sum, s3) = norm::add_rms_norm(&x, &r, Some(&w), &o).unwrap();
            for y in [&y1, &y2, &y3, &sum, &s1.inverse, &s2.inverse, &s3.inverse] {
                out.push(bits(y));
            }
            for (s, d) in [(&s1, None), (&s2, None), (&s3, Some(&dy))] {
                let g = norm::norm_backward(s, &dy, d).unwrap();
                for t in [Some(&g.source), g.weight.as_ref(), g.bias.as_ref()]
                    .into_iter()
                    .flatten()
                {
                    out.push(bits(t));
                }
            }
            out
        };
        let first = run();
        assert_eq!(first.len(), 7 + 2 + 3 + 2);
        assert!(first == run(), "{rows}x{cols} {dt}: second run differs");
    }
}

#[test]
fn register_backward_words_match_widened_values() {
    // Where the rule takes `rms_backward_words` (the loaded words held across the row sum),
    // with or without the next row's words loaded ahead, it must give the bits of
    // `rms_backward_registers` (their widened values): add+RMSNorm (with and without the
    // residual-sum cotangent) and RMSNorm of 16-bit sources on 256 lanes (11 rows: blocks of 4
    // and a short last one; 2,056 BF16 columns: lanes without their last chunk, F32 weight;
    // 5 rows of 4,104 F16 columns: three chunks a lane of four, BF16 weight), add+RMSNorm
    // (with it) and RMSNorm on 1,024 lanes (two reads; 16,392 BF16 columns, BF16 weight), and
    // add+RMSNorm F32 on 256 lanes (F32 `vals`, 1,028 columns).
    assert!(norm::register_backward_words(true, false, false));
    assert!(!norm::register_backward_words(false, false, false));
    assert!(norm::register_backward_words(false, false, true));
    assert!(norm::register_backward_words(false, true, false));
    assert!(norm::register_backward_prefetch(true, true, false));
    assert!(!norm::register_backward_prefetch(true, false, false));
    assert!(!norm::register_backward_prefetch(true, true, true));
    assert!(!norm::register_backward_prefetch(false, true, false));
    let cases = [
        (11, 2056, DType::BF16, DType::F32, false),
        (5, 4104, DType::F16, DType::BF16, false),
        (3, 16392, DType::BF16, DType::BF16, true),
        (9, 1028, DType::F32, DType::F32, false),
    ];
    for (rows, cols, dt, wdt, wide) in cases {
        let mut rng = Rng::new(1200 + cols as u64);
        let (x, _) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], dt);
        let (r, _) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], dt);
        let (w, _) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], wdt);
        let (dy, _) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt);
        let (ds, _) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt);
        let o = RmsNormOptions {
            offset: 0.5,
            ..RmsNormOptions::default()
        };
        let add = norm::add_rms_norm(&x, &r, Some(&w), &o).unwrap().2;
        let rms = norm::rms_norm(&x, Some(&w), &o).unwrap().1;
        let saved = if wide {
            vec![(add, Some(&ds)), (rms, None)]
        } else {
            vec![(add.clone(), Some(&ds)), (add, None), (rms, None)]
        };
        let run = |words: Option<bool>, prefetch: Option<bool>| -> Vec<Vec<u64>> {
            norm::force_register_words(words);
            norm::force_register_prefetch(prefetch);
            let mut out = Vec::new();
            for (s, d) in &saved {
                let g = norm::norm_backward(s, &dy, *d).unwrap();
                for t in [Some(&g.source), g.weight.as_ref()].into_iter().flatten() {
                    out.push(bits(t));
                }
            }
            norm::force_register_words(None);
            norm::force_register_prefetch(None);
            out
        };
        let widened = run(Some(false), None);
        assert_eq!(widened.len(), 2 * saved.len());
        assert!(
            widened == run(None, None),
            "{rows}x{cols} {dt} (weight {wdt}): words differ from widened values"
        );
        for prefetch in [false, true] {
            assert!(
                widened == run(Some(true), Some(prefetch)),
                "{rows}x{cols} {dt} (weight {wdt}): words (prefetch {prefetch}) differ from widened values"
            );
        }
    }
}

/// BF16 values of a tensor as f32.
fn bf16_values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<half::bf16>()
        .unwrap()
        .into_iter()
        .map(half::bf16::to_f32)
        .collect()
}

/// `got` is `want` rounded to BF16 bit for bit (nearest even), or a quiet NaN where `want` is
/// NaN; `alt` is a second acceptable FP32 value (a fused multiply-add) or `want` itself.
fn assert_bf16(what: &str, i: usize, got: f32, want: f32, alt: f32) {
    let got_bits = half::bf16::from_f32(got).to_bits();
    if want.is_nan() {
        assert!(
            got.is_nan() && got_bits & 0x40 != 0,
            "{what} [{i}]: {got} ({got_bits:#06x}), want a quiet NaN"
        );
        return;
    }
    let ok = [want, alt]
        .iter()
        .any(|&w| half::bf16::from_f32(w).to_bits() == got_bits);
    assert!(ok, "{what} [{i}]: {got} ({got_bits:#06x}), want {want}");
}

fn bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// The BF16 register forwards round like `cast` (nearest even, NaN kept and quieted) whether a
/// chunk takes the rounding of NaN-free values or the general one: outputs against a host
/// emulation of their FP32 operations (the saved statistics, `half`'s rounding) bit for bit,
/// on rows holding a NaN, an infinity, opposite infinities or squares that overflow FP32, a
/// zero under an infinite weight (0·∞) and weights holding NaN and ±∞, beside ordinary rows.
/// RMSNorm in every casting mode with offsets 0 and 1 and a BF16 or F32 weight (the latter
/// with NaNs whose low bits are all ones), add+RMSNorm (output and sum) and LayerNorm (its
/// output accepted with or without a fused multiply-add). The NaNs that FP32 arithmetic makes
/// from BF16 values have a zero low half on this machine's adapter, so the F32 weight's are the
/// ones that tell the two roundings apart here.
#[test]
fn bf16_register_forwards_round_bit_for_bit() {
    let (rows, cols) = (7, 64);
    let mut rng = Rng::new(1200);
    let mut xd = rng.vec(rows * cols, -2.0, 2.0);
    let mut rd = rng.vec(rows * cols, -2.0, 2.0);
    let mut wd = rng.vec(cols, 0.5, 1.5);
    xd[7] = 0.0; // row 0, under the infinite weight
    xd[cols + 5] = f64::NAN;
    xd[2 * cols + 9] = f64::INFINITY;
    xd[3 * cols] = f64::NEG_INFINITY;
    xd[3 * cols + 1] = f64::INFINITY;
    xd[4 * cols + 3] = 3e38;
    rd[5 * cols + 11] = f64::NAN;
    xd[6 * cols + 2] = f64::INFINITY;
    rd[6 * cols + 2] = f64::NEG_INFINITY;
    wd[7] = f64::INFINITY;
    wd[20] = f64::NAN;
    wd[33] = f64::NEG_INFINITY;
    let (x, _) = upload(&xd, &[rows, cols], DType::BF16);
    let (r, _) = upload(&rd, &[rows, cols], DType::BF16);
    let (w, _) = upload(&wd, &[cols], DType::BF16);
    let (b, _) = upload(&rng.vec(cols, -0.5, 0.5), &[cols], DType::BF16);
    let (xs, rs, ws, bs) = (
        bf16_values(&x),
        bf16_values(&r),
        bf16_values(&w),
        bf16_values(&b),
    );
    // An F32 weight with NaNs whose low half is all ones: on this path they reach the
    // rounding as they are, where the rounding of NaN-free values would carry them into ±0.
    let mut ws32 = ws.clone();
    ws32[20] = f32::from_bits(0x7fff_ffff);
    ws32[33] = f32::from_bits(0xffff_ffff);
    let w32 = Tensor::from_slice(engine(), &ws32, &[cols]).unwrap();
    for ((w, ws), casting) in [(&w, &ws), (&w32, &ws32)]
        .into_iter()
        .flat_map(|w| [CastingMode::Llama, CastingMode::Gemma, CastingMode::None].map(|c| (w, c)))
    {
        for offset in [0.0f32, 1.0] {
            let o = RmsNormOptions {
                offset,
                casting,
                ..RmsNormOptions::default()
            };
            let out = |n: f32, c: usize| {
                let wf = ws[c] + offset;
                match casting {
                    CastingMode::Llama => bf16(n) * wf,
                    CastingMode::Gemma => n * wf,
                    CastingMode::None => bf16(n) * bf16(wf),
                }
            };
            let what = format!("w {} {o:?}", w.dtype());
            let (y, saved) = norm::rms_norm(&x, Some(w), &o).unwrap();
            let (y, inv) = (bf16_values(&y), saved.inverse.to_vec::<f32>().unwrap());
            for (i, &got) in y.iter().enumerate() {
                let want = out(xs[i] * inv[i / cols], i % cols);
                assert_bf16(&format!("rms_norm {what}"), i, got, want, want);
            }
            let (y, sum, saved) = norm::add_rms_norm(&x, &r, Some(w), &o).unwrap();
            let (y, sum) = (bf16_values(&y), bf16_values(&sum));
            let inv = saved.inverse.to_vec::<f32>().unwrap();
            for i in 0..rows * cols {
                let s = xs[i] + rs[i];
                assert_bf16(&format!("add_rms_norm sum {what}"), i, sum[i], s, s);
                let want = out(s * inv[i / cols], i % cols);
                assert_bf16(&format!("add_rms_norm {what}"), i, y[i], want, want);
            }
        }
    }
    let (y, saved) =
        norm::layer_norm(&x, Some(&w), Some(&b), &LayerNormOptions::default()).unwrap();
    let y = bf16_values(&y);
    let inv = saved.inverse.to_vec::<f32>().unwrap();
    let mean = saved.mean.unwrap().to_vec::<f32>().unwrap();
    let corr = saved.mean_correction.unwrap().to_vec::<f32>().unwrap();
    for (i, &got) in y.iter().enumerate() {
        let (row, c) = (i / cols, i % cols);
        let n = ((xs[i] - mean[row]) - corr[row]) * inv[row];
        assert_bf16(
            "layer_norm",
            i,
            got,
            n * ws[c] + bs[c],
            n.mul_add(ws[c], bs[c]),
        );
    }
}

/// The BF16 rounding of FP32 products at its edges, through RMSNorm (Gemma casting: the output
/// is `n·w` rounded once) of rows of ones with an F32 weight holding the edge values: exact
/// ties and their neighbours, values whose product with 2^16 + 1 overflows (near 5.2e33) and
/// beyond, the largest finite values, subnormals (ties on BF16's subnormal grid among them),
/// the smallest normal values, signed zeros, infinities and NaNs, chunks of eight holding only
/// ordinary values beside chunks that mix in one edge value. Every output is the host's
/// nearest-even rounding (`half`) of the product formed with the saved inverse, bit for bit,
/// except that a subnormal product may come out as a zero: the device's FP32 arithmetic may
/// flush subnormals to zero (the H200's Vulkan driver does, lavapipe does not;
/// `notes/measurements.md`), and the rounding keeps the zero.
#[test]
fn bf16_rounding_of_products_at_its_edges() {
    let mut rng = Rng::new(1300);
    let edges: Vec<f32> = [
        0x3f80_8000u32, // 1 + 2^-8: a tie, to even (down)
        0x3f81_8000,    // a tie, to even (up)
        0x3f80_8001,
        0x3f80_7fff,
        0x3f81_7fff,
        0x3f81_8001,
        0x777f_fe00, // the products with 2^16 + 1 overflow from about here
        0x777f_ff00,
        0x777f_ffff,
        0x7780_0000,
        0x7f7f_8000, // the largest BF16 tie: to infinity
        0x7f7f_7fff,
        0x7f7f_ffff,
        0x0000_0001, // subnormals
        0x0000_8000, // a tie on BF16's subnormal grid, to even (down)
        0x0001_8000, // a tie, to even (up)
        0x0000_8001,
        0x007f_ffff,
        0x0040_0000,
        0x0080_0000, // the smallest normal and its neighbours
        0x0080_8000,
        0x0080_7fff,
        0x0000_0000,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_1234,
        0xffa0_0001,
    ]
    .iter()
    .flat_map(|&b| [f32::from_bits(b), -f32::from_bits(b)])
    .collect();
    let (rows, cols) = (3, 64);
    assert!(edges.len() <= cols);
    // Weights: the edges packed together, each group of eight edges spread one to a chunk
    // beside ordinary values, and ordinary values only.
    let ordinary: Vec<f32> = rng.vec(cols, -3.0, 3.0).iter().map(|&v| v as f32).collect();
    let mut packed = ordinary.clone();
    packed[..edges.len()].copy_from_slice(&edges);
    let mut weights = vec![packed, ordinary.clone()];
    for group in edges.chunks(cols / 8) {
        let mut w = ordinary.clone();
        for (j, &e) in group.iter().enumerate() {
            w[8 * j + 5] = e;
        }
        weights.push(w);
    }
    let (x, _) = upload(&vec![1.0; rows * cols], &[rows, cols], DType::BF16);
    for (t, w) in weights.iter().enumerate() {
        let w = Tensor::from_slice(engine(), w, &[cols]).unwrap();
        let ws = w.to_vec::<f32>().unwrap();
        let o = RmsNormOptions {
            eps: f32::MIN_POSITIVE,
            casting: CastingMode::Gemma,
            ..RmsNormOptions::default()
        };
        let (y, saved) = norm::rms_norm(&x, Some(&w), &o).unwrap();
        let (y, inv) = (bf16_values(&y), saved.inverse.to_vec::<f32>().unwrap());
        for (i, &got) in y.iter().enumerate() {
            let want = inv[i / cols] * ws[i % cols];
            let flushed = want != 0.0 && want.abs() < f32::MIN_POSITIVE && got == 0.0;
            if !flushed {
                assert_bf16(&format!("weight {t}"), i, got, want, want);
            }
        }
    }
}

#[test]
fn backward_does_not_change_its_inputs() {
    let mut rng = Rng::new(1100);
    let (x, xs) = upload(&rng.vec(6 * 9, -2.0, 2.0), &[6, 9], DType::F16);
    let (w, ws) = upload(&rng.vec(9, 0.5, 1.5), &[9], DType::F32);
    let (dy, dys) = upload(&rng.vec(6 * 9, -1.0, 1.0), &[6, 9], DType::F32);
    let (_, saved) = norm::rms_norm(&x, Some(&w), &RmsNormOptions::default()).unwrap();
    let inverse = bits(&saved.inverse);
    let g1 = norm::norm_backward(&saved, &dy, None).unwrap();
    let g2 = norm::norm_backward(&saved, &dy, None).unwrap();
    assert_eq!(x.to_f64().unwrap(), xs);
    assert_eq!(w.to_f64().unwrap(), ws);
    assert_eq!(dy.to_f64().unwrap(), dys);
    assert_eq!(bits(&saved.inverse), inverse);
    // Independent calls do not accumulate.
    assert_eq!(
        bits(g1.weight.as_ref().unwrap()),
        bits(g2.weight.as_ref().unwrap())
    );
}

fn expect_bounds<T: std::fmt::Debug>(r: wgrad::Result<T>, got: u64, what: &str) {
    match r {
        Err(Error::OutOfBounds { got: g, .. }) if g == got => {}
        other => panic!("{what}: expected OutOfBounds({got}), got {other:?}"),
    }
}

fn expect_shape<T: std::fmt::Debug>(r: wgrad::Result<T>, what: &str) {
    match r {
        Err(Error::ShapeMismatch { .. }) => {}
        other => panic!("{what}: expected ShapeMismatch, got {other:?}"),
    }
}

fn expect_dtype<T: std::fmt::Debug>(r: wgrad::Result<T>, bad: DType, what: &str) {
    match r {
        Err(Error::UnsupportedDType { got, .. }) if got == bad => {}
        other => panic!("{what}: expected UnsupportedDType({bad}), got {other:?}"),
    }
}

fn expect_invalid<T: std::fmt::Debug>(r: wgrad::Result<T>, what: &str) {
    match r {
        Err(Error::InvalidValue { .. }) => {}
        other => panic!("{what}: expected InvalidValue, got {other:?}"),
    }
}

#[test]
fn bad_inputs_give_typed_errors() {
    let e = engine();
    let o = RmsNormOptions::default();
    let lo = LayerNormOptions::default();
    let x = Tensor::zeros(e, &[4, 6], DType::F32).unwrap();
    let w = Tensor::zeros(e, &[6], DType::F32).unwrap();
    let w5 = Tensor::zeros(e, &[5], DType::F32).unwrap();
    let wi = Tensor::from_slice(e, &[1i32; 6], &[6]).unwrap();
    let xi = Tensor::from_slice(e, &[1i32; 24], &[4, 6]).unwrap();

    // Zero rows and zero columns are errors.
    let empty = Tensor::zeros(e, &[0, 6], DType::F32).unwrap();
    expect_bounds(norm::rms_norm(&empty, Some(&w), &o), 0, "zero rows");
    expect_bounds(norm::layer_norm(&empty, None, None, &lo), 0, "zero rows");
    let narrow = Tensor::zeros(e, &[3, 0], DType::F32).unwrap();
    expect_bounds(norm::rms_norm(&narrow, None, &o), 0, "zero columns");
    let scalar = Tensor::zeros(e, &[], DType::F32).unwrap();
    expect_bounds(norm::rms_norm(&scalar, None, &o), 0, "no axes");

    // Mismatched weight / bias / residual / scale shapes.
    expect_shape(norm::rms_norm(&x, Some(&w5), &o), "rms weight length");
    expect_shape(
        norm::layer_norm(&x, Some(&w5), None, &lo),
        "layer weight length",
    );
    expect_shape(
        norm::layer_norm(&x, Some(&w), Some(&w5), &lo),
        "layer bias length",
    );
    let r = Tensor::zeros(e, &[4, 5], DType::F32).unwrap();
    expect_shape(norm::add_rms_norm(&x, &r, Some(&w), &o), "residual shape");
    let sc3 = Tensor::zeros(e, &[3, 6], DType::F32).unwrap();
    expect_shape(
        norm::modulated_rms_norm(&x, Some(&w), &sc3, &sc3, &o),
        "batches not dividing rows",
    );
    let sc2 = Tensor::zeros(e, &[2, 6], DType::F32).unwrap();
    let sh = Tensor::zeros(e, &[2, 5], DType::F32).unwrap();
    expect_shape(
        norm::modulated_rms_norm(&x, Some(&w), &sc2, &sh, &o),
        "shift shape",
    );

    // Wrong dtypes.
    expect_dtype(norm::rms_norm(&xi, None, &o), DType::I32, "integer source");
    expect_dtype(
        norm::rms_norm(&x, Some(&wi), &o),
        DType::I32,
        "integer weight",
    );
    expect_dtype(
        norm::layer_norm(&x, Some(&w), Some(&wi), &lo),
        DType::I32,
        "integer bias",
    );
    expect_dtype(
        norm::add_rms_norm(&x, &xi, None, &o),
        DType::I32,
        "integer residual",
    );

    // ε ≤ 0 or not finite; a non-finite offset.
    for eps in [0.0, -1e-5, f32::NAN, f32::INFINITY] {
        let bad = RmsNormOptions { eps, ..o };
        expect_invalid(norm::rms_norm(&x, Some(&w), &bad), "rms eps");
        expect_invalid(norm::add_rms_norm(&x, &x, Some(&w), &bad), "add eps");
        expect_invalid(
            norm::modulated_rms_norm(&x, None, &sc2, &sc2, &bad),
            "mod eps",
        );
        expect_invalid(
            norm::layer_norm(&x, None, None, &LayerNormOptions { eps }),
            "layer eps",
        );
    }
    let bad = RmsNormOptions {
        offset: f32::NAN,
        ..o
    };
    expect_invalid(norm::rms_norm(&x, Some(&w), &bad), "offset");

    // Backward: cotangent shape and dtype, a residual cotangent without a residual output.
    let (_, saved) = norm::rms_norm(&x, Some(&w), &o).unwrap();
    let dy5 = Tensor::zeros(e, &[4, 5], DType::F32).unwrap();
    expect_shape(norm::norm_backward(&saved, &dy5, None), "cotangent shape");
    expect_dtype(
        norm::norm_backward(&saved, &xi, None),
        DType::I32,
        "integer cotangent",
    );
    expect_invalid(
        norm::norm_backward(&saved, &x, Some(&x)),
        "residual cotangent for rms_norm",
    );
    let (_, _, saved) = norm::add_rms_norm(&x, &x, Some(&w), &o).unwrap();
    expect_shape(
        norm::norm_backward(&saved, &x, Some(&dy5)),
        "residual cotangent shape",
    );

    // Columns past the bound.
    let wide = Tensor::zeros(e, &[1, norm::MAX_COLUMNS + 1], DType::BF16).unwrap();
    expect_bounds(
        norm::rms_norm(&wide, None, &o),
        norm::MAX_COLUMNS as u64 + 1,
        "too wide",
    );

    // A tensor of another engine.
    let other = common::private_engine();
    let wo = Tensor::zeros(&other, &[6], DType::F32).unwrap();
    match norm::rms_norm(&x, Some(&wo), &o) {
        Err(Error::EngineMismatch { .. }) => {}
        r => panic!("expected EngineMismatch, got {r:?}"),
    }
}

#[test]
fn workspace_bounds_and_queries() {
    let engine = common::private_engine();
    let (rows, cols) = (100, 33);
    let mut rng = Rng::new(1200);
    let data = rng.vec(rows * cols, -1.0, 1.0);
    let (x, _) =
        wgrad::gradcheck::tensor_from_f64(&engine, &data, &[rows, cols], DType::BF16).unwrap();
    let (w, _) =
        wgrad::gradcheck::tensor_from_f64(&engine, &data[..cols], &[cols], DType::F32).unwrap();
    let o = RmsNormOptions::default();
    // Odd-width 16-bit output: one FP32 temporary.
    let fwd = norm::forward_workspace_bytes(NormKind::Rms, rows, cols, DType::BF16);
    assert_eq!(fwd, (rows * cols * 4) as u64);
    assert_eq!(
        norm::forward_workspace_bytes(NormKind::Rms, rows, 34, DType::BF16),
        0
    );
    assert_eq!(
        norm::forward_workspace_bytes(NormKind::AddRms, rows, cols, DType::F16),
        2 * fwd
    );
    engine.set_workspace_bound(fwd - 1);
    match norm::rms_norm(&x, Some(&w), &o) {
        Err(Error::WorkspaceExceeded { needed, bound, .. }) => {
            assert_eq!((needed, bound), (fwd, fwd - 1))
        }
        r => panic!("expected WorkspaceExceeded, got {r:?}"),
    }
    engine.set_workspace_bound(fwd);
    let (_, saved) = norm::rms_norm(&x, Some(&w), &o).unwrap();
    let bwd = norm::backward_workspace_bytes(NormKind::Rms, rows, cols, 1, true, false);
    assert_eq!(
        bwd,
        (rows * 32 + rows.div_ceil(norm::BLOCK_ROWS) * cols * 4) as u64
    );
    engine.set_workspace_bound(bwd - 1);
    match norm::norm_backward(&saved, &x, None) {
        Err(Error::WorkspaceExceeded { needed, .. }) => assert_eq!(needed, bwd),
        r => panic!("expected WorkspaceExceeded, got {r:?}"),
    }
    engine.set_workspace_bound(bwd);
    let g = norm::norm_backward(&saved, &x, None).unwrap();
    assert_eq!(g.weight.unwrap().shape(), &[cols]);
}

fn run_dyt(rows: usize, cols: usize, xdt: DType, pdt: DType, beta: bool, alpha: f64, seed: u64) {
    let what = format!("dyt {rows}x{cols} x {xdt} params {pdt} beta {beta} alpha {alpha}");
    let mut rng = Rng::new(seed);
    let (x, xs) = upload(&rng.vec(rows * cols, -3.0, 3.0), &[rows, cols], xdt);
    let (a, a_s) = upload(&[alpha], &[1], pdt);
    let (g, gs) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], pdt);
    let b = beta.then(|| upload(&rng.vec(cols, -0.5, 0.5), &[cols], DType::F32));
    let (y, saved) = norm::dyt(&x, &a, &g, b.as_ref().map(|b| &b.0)).unwrap();
    assert_eq!((y.shape(), y.dtype()), (x.shape(), xdt));
    let want = reference::dyt(
        &xs,
        rows,
        cols,
        a_s[0],
        &gs,
        b.as_ref().map(|b| b.1.as_slice()),
    );
    check(&format!("{what}: y"), &y, &want, Tolerance::for_dtype(xdt));
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], xdt);
    let grads = norm::dyt_backward(&saved, &dy).unwrap();
    let r = reference::dyt_backward(&xs, rows, cols, a_s[0], &gs, &dys);
    check(&format!("{what}: dx"), &grads.source, &r.source, F32);
    assert_eq!(grads.alpha.shape(), &[1]);
    check(&format!("{what}: dalpha"), &grads.alpha, &[r.alpha], F32);
    check(&format!("{what}: dgamma"), &grads.gamma, &r.gamma, F32);
    assert_eq!(grads.beta.is_some(), beta, "{what}");
    if let Some(db) = &grads.beta {
        check(&format!("{what}: dbeta"), db, &r.beta, F32);
    }
}

#[test]
fn dyt_every_dtype_and_width() {
    let mut seed = 1300;
    for (rows, cols) in [(1, 1), (5, 3), (9, 7), (33, 127), (2, 4097)] {
        for xdt in DType::FLOATS {
            seed += 1;
            run_dyt(rows, cols, xdt, xdt, true, 0.7, seed);
        }
    }
    run_dyt(40, 65, DType::BF16, DType::F32, false, 3.0, 1350);
    run_dyt(40, 66, DType::F16, DType::BF16, true, -0.2, 1351);
    run_dyt(256, 512, DType::BF16, DType::BF16, true, 0.5, 1352);
    // Rows of whole chunks, one invocation a chunk: parameters of the source's dtype (read as
    // chunks) and of others (value by value), with and without β, |αx| on both sides of the
    // series' bound.
    for (rows, cols, xdt, pdt, beta, alpha) in [
        (3, 4, DType::F32, DType::F16, true, 0.01),
        (9, 8, DType::F32, DType::BF16, false, 0.7),
        (5, 16, DType::BF16, DType::F32, true, -2.0),
        (7, 24, DType::F16, DType::F16, true, 0.02),
        (33, 128, DType::BF16, DType::BF16, false, 1.5),
        (4, 4096, DType::F32, DType::F32, true, 0.5),
    ] {
        run_dyt(rows, cols, xdt, pdt, beta, alpha, 1360 + cols as u64);
    }
}

#[test]
fn dyt_backward_by_chunks_gives_the_column_kernels_bits() {
    // Rows of whole chunks with dy in x's dtype take one invocation a column chunk; the same
    // cotangent widened to F32 (exactly) takes the column kernel: every gradient the same bits.
    for (rows, cols, dt, beta) in [
        (70, 64, DType::BF16, true),
        (33, 12, DType::F32, false),
        (5, 4096, DType::F16, true),
    ] {
        let mut rng = Rng::new(1390 + cols as u64);
        let (x, _) = upload(&rng.vec(rows * cols, -3.0, 3.0), &[rows, cols], dt);
        let (a, _) = upload(&[0.6], &[1], dt);
        let (g, _) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], dt);
        let b = beta.then(|| upload(&rng.vec(cols, -0.5, 0.5), &[cols], dt).0);
        let (_, saved) = norm::dyt(&x, &a, &g, b.as_ref()).unwrap();
        let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt);
        let (dy32, _) = upload(&dys, &[rows, cols], DType::F32);
        let chunks = norm::dyt_backward(&saved, &dy).unwrap();
        let columns = norm::dyt_backward(&saved, &dy32).unwrap();
        let what = format!("dyt backward {rows}x{cols} {dt}");
        common::assert_same_bits(&format!("{what}: dx"), &chunks.source, &columns.source);
        common::assert_same_bits(&format!("{what}: dalpha"), &chunks.alpha, &columns.alpha);
        common::assert_same_bits(&format!("{what}: dgamma"), &chunks.gamma, &columns.gamma);
        assert_eq!(chunks.beta.is_some(), beta);
        if let (Some(p), Some(q)) = (&chunks.beta, &columns.beta) {
            common::assert_same_bits(&format!("{what}: dbeta"), p, q);
        }
    }
}

fn run_poly(rows: usize, cols: usize, xdt: DType, bias: bool, seed: u64) {
    run_poly_dy(rows, cols, xdt, DType::F32, bias, seed);
}

/// PolyNorm against the reference with the output gradient in `dydt`.
fn run_poly_dy(rows: usize, cols: usize, xdt: DType, dydt: DType, bias: bool, seed: u64) {
    let what = format!("poly_norm {rows}x{cols} {xdt} dy {dydt} bias {bias}");
    let mut rng = Rng::new(seed);
    let (x, xs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], xdt);
    let (w, ws) = upload(&rng.vec(3, -1.0, 1.0), &[3], DType::F32);
    let b = bias.then(|| upload(&[0.25], &[1], xdt));
    let o = norm::PolyNormOptions::default();
    let eps = f64::from(o.eps);
    let (y, saved) = norm::poly_norm(&x, &w, b.as_ref().map(|b| &b.0), &o).unwrap();
    assert_eq!((y.shape(), y.dtype()), (x.shape(), xdt));
    let want = reference::poly_norm(&xs, rows, cols, &ws, b.as_ref().map(|b| b.1[0]), eps);
    check(&format!("{what}: y"), &y, &want, Tolerance::for_dtype(xdt));
    let inv: Vec<f64> = (0..rows)
        .flat_map(|r| reference::poly_inverses(&xs[r * cols..(r + 1) * cols], eps))
        .collect();
    check(&format!("{what}: inverse"), &saved.inverse, &inv, F32);
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dydt);
    let g = norm::poly_norm_backward(&saved, &dy).unwrap();
    let r = reference::poly_norm_backward(&xs, rows, cols, &ws, eps, &dys);
    check(&format!("{what}: dx"), &g.source, &r.source, dx_tol(cols));
    assert_eq!(g.weight.shape(), &[3]);
    check(&format!("{what}: dw"), &g.weight, &r.weight, F32);
    assert_eq!(g.bias.is_some(), bias, "{what}");
    if let Some(db) = &g.bias {
        assert_eq!(db.shape(), &[1]);
        // db = Σ dy: an FP32 sum is accurate relative to Σ |dy|, not to its (cancelled) value.
        let cond = (dys.iter().map(|v| v.abs()).sum::<f64>() / r.bias.abs()).max(1.0);
        let tol = Tolerance {
            rel_l2: F32.rel_l2 * cond,
            ..F32
        };
        check(&format!("{what}: db"), db, &[r.bias], tol);
    }
}

#[test]
fn poly_norm_every_dtype_and_width() {
    let mut seed = 1400;
    for cols in [1, 3, 7, 127, 4097] {
        let rows = if cols > 1000 { 2 } else { 37 };
        for xdt in DType::FLOATS {
            seed += 1;
            run_poly(rows, cols, xdt, true, seed);
        }
    }
    run_poly(20, 64, DType::BF16, false, 1450);
    run_poly(256, 512, DType::F32, true, 1451);
    // Rows of whole chunks on the register forward and, with dy in x's dtype, the register
    // backward (per-row sums of the weights' gradients): one chunk, 256 and 1,024 lanes, more
    // rows than a block of the row sums' finish (64).
    for (rows, cols, xdt) in [
        (3, 8, DType::F16),
        (70, 64, DType::BF16),
        (3, 4096, DType::F16),
        (2, 16384, DType::F32),
        (2, 32768, DType::BF16),
    ] {
        run_poly_dy(rows, cols, xdt, xdt, true, 1452 + cols as u64);
        run_poly_dy(rows, cols, xdt, DType::F32, false, 1453 + cols as u64);
    }
}

#[test]
fn dyt_and_poly_norm_reference_gradients_match_finite_differences() {
    let (rows, cols) = (3, 5);
    let n = rows * cols;
    let mut rng = Rng::new(1500);
    let x = rng.vec(n, -2.0, 2.0);
    let dy = rng.vec(n, -1.0, 1.0);
    let gamma = rng.vec(cols, 0.5, 1.5);
    let beta = rng.vec(cols, -0.5, 0.5);
    let alpha = 0.8;
    let g = reference::dyt_backward(&x, rows, cols, alpha, &gamma, &dy);
    let f = |x: &[f64]| reference::dyt(x, rows, cols, alpha, &gamma, Some(&beta));
    fd("dyt dx", check_vjp(f, &x, &dy, &g.source));
    let f = |a: &[f64]| reference::dyt(&x, rows, cols, a[0], &gamma, Some(&beta));
    fd("dyt dalpha", check_vjp(f, &[alpha], &dy, &[g.alpha]));
    let f = |gm: &[f64]| reference::dyt(&x, rows, cols, alpha, gm, Some(&beta));
    fd("dyt dgamma", check_vjp(f, &gamma, &dy, &g.gamma));
    let f = |b: &[f64]| reference::dyt(&x, rows, cols, alpha, &gamma, Some(b));
    fd("dyt dbeta", check_vjp(f, &beta, &dy, &g.beta));

    let w = [0.7, -0.4, 1.1];
    let eps = 1e-6;
    let g = reference::poly_norm_backward(&x, rows, cols, &w, eps, &dy);
    let f = |x: &[f64]| reference::poly_norm(x, rows, cols, &w, Some(0.3), eps);
    fd("poly dx", check_vjp(f, &x, &dy, &g.source));
    let f = |w: &[f64]| reference::poly_norm(&x, rows, cols, w, Some(0.3), eps);
    fd("poly dw", check_vjp(f, &w, &dy, &g.weight));
    let f = |b: &[f64]| reference::poly_norm(&x, rows, cols, &w, Some(b[0]), eps);
    fd("poly db", check_vjp(f, &[0.3], &dy, &[g.bias]));
}

#[test]
fn dyt_and_poly_norm_reruns_are_bit_identical() {
    let (rows, cols) = (100, 129);
    let mut rng = Rng::new(1600);
    let (x, _) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], DType::F16);
    let (dy, _) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], DType::F32);
    let (a, _) = upload(&[0.9], &[1], DType::F32);
    let (g, _) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], DType::F32);
    let (w, _) = upload(&[0.5, 0.25, 1.0], &[3], DType::F32);
    let run = || {
        let (y1, s1) = norm::dyt(&x, &a, &g, Some(&g)).unwrap();
        let d1 = norm::dyt_backward(&s1, &dy).unwrap();
        let (y2, s2) =
            norm::poly_norm(&x, &w, Some(&a), &norm::PolyNormOptions::default()).unwrap();
        let d2 = norm::poly_norm_backward(&s2, &dy).unwrap();
        [
            &y1,
            &d1.source,
            &d1.alpha,
            &d1.gamma,
            d1.beta.as_ref().unwrap(),
            &y2,
            &d2.source,
            &d2.weight,
            d2.bias.as_ref().unwrap(),
        ]
        .map(bits)
    };
    assert!(run() == run(), "second run differs");
}

#[test]
fn dyt_and_poly_norm_bad_inputs() {
    let e = engine();
    let x = Tensor::zeros(e, &[4, 6], DType::F32).unwrap();
    let a = Tensor::zeros(e, &[1], DType::F32).unwrap();
    let a2 = Tensor::zeros(e, &[2], DType::F32).unwrap();
    let g = Tensor::zeros(e, &[6], DType::F32).unwrap();
    let g5 = Tensor::zeros(e, &[5], DType::F32).unwrap();
    let ai = Tensor::from_slice(e, &[1i32], &[1]).unwrap();
    expect_shape(norm::dyt(&x, &a2, &g, None), "dyt alpha shape");
    expect_shape(norm::dyt(&x, &a, &g5, None), "dyt gamma length");
    expect_shape(norm::dyt(&x, &a, &g, Some(&g5)), "dyt beta length");
    expect_dtype(
        norm::dyt(&x, &ai, &g, None),
        DType::I32,
        "dyt integer alpha",
    );
    let empty = Tensor::zeros(e, &[0, 6], DType::F32).unwrap();
    expect_bounds(norm::dyt(&empty, &a, &g, None), 0, "dyt zero rows");
    let (_, saved) = norm::dyt(&x, &a, &g, None).unwrap();
    let dy5 = Tensor::zeros(e, &[4, 5], DType::F32).unwrap();
    expect_shape(norm::dyt_backward(&saved, &dy5), "dyt cotangent shape");

    let w = Tensor::zeros(e, &[3], DType::F32).unwrap();
    let po = norm::PolyNormOptions::default();
    assert_eq!(po.eps, 1e-6);
    expect_shape(norm::poly_norm(&x, &a2, None, &po), "poly weight shape");
    expect_shape(norm::poly_norm(&x, &w, Some(&a2), &po), "poly bias shape");
    expect_dtype(
        norm::poly_norm(&x, &w, Some(&ai), &po),
        DType::I32,
        "poly integer bias",
    );
    expect_bounds(norm::poly_norm(&empty, &w, None, &po), 0, "poly zero rows");
    for eps in [0.0, -1.0, f32::NAN] {
        expect_invalid(
            norm::poly_norm(&x, &w, None, &norm::PolyNormOptions { eps }),
            "poly eps",
        );
    }
    let (_, saved) = norm::poly_norm(&x, &w, None, &po).unwrap();
    expect_shape(
        norm::poly_norm_backward(&saved, &dy5),
        "poly cotangent shape",
    );
}

#[allow(clippy::too_many_arguments)]
fn run_group(
    samples: usize,
    channels: usize,
    spatial: &[usize],
    groups: usize,
    dt: DType,
    affine: bool,
    offset: f64,
    seed: u64,
) {
    run_group_dy(
        (samples, channels, spatial, groups),
        dt,
        DType::F16,
        affine,
        offset,
        seed,
    );
}

/// GroupNorm against the reference with the output gradient in `dydt`.
fn run_group_dy(
    (samples, channels, spatial, groups): (usize, usize, &[usize], usize),
    dt: DType,
    dydt: DType,
    affine: bool,
    offset: f64,
    seed: u64,
) {
    let what = format!(
        "group_norm [{samples}, {channels}, {spatial:?}] groups {groups} {dt} dy {dydt} affine {affine}"
    );
    let s: usize = spatial.iter().product();
    let mut shape = vec![samples, channels];
    shape.extend_from_slice(spatial);
    let n = samples * channels * s;
    let mut rng = Rng::new(seed);
    let data: Vec<f64> = rng
        .vec(n, -1.0, 1.0)
        .into_iter()
        .map(|v| v + offset)
        .collect();
    let (x, xs) = upload(&data, &shape, dt);
    let w = affine.then(|| upload(&rng.vec(channels, 0.5, 1.5), &[channels], DType::BF16));
    let b = affine.then(|| upload(&rng.vec(channels, -0.5, 0.5), &[channels], DType::F32));
    let ws = w.as_ref().map(|w| w.1.as_slice());
    let bs = b.as_ref().map(|b| b.1.as_slice());
    let o = norm::GroupNormOptions::default();
    let eps = f64::from(o.eps);
    let (y, saved) = norm::group_norm(
        &x,
        groups,
        w.as_ref().map(|w| &w.0),
        b.as_ref().map(|b| &b.0),
        &o,
    )
    .unwrap();
    assert_eq!((y.shape(), y.dtype()), (&shape[..], dt));
    assert_eq!(saved.inverse.shape(), &[samples, groups]);
    let want = reference::group_norm(&xs, samples, channels, s, groups, ws, bs, eps);
    check(&format!("{what}: y"), &y, &want, Tolerance::for_dtype(dt));
    let (mean, inv) =
        reference::mean_inverse_std(&xs, samples * groups, channels / groups * s, eps);
    check(&format!("{what}: inverse"), &saved.inverse, &inv, F32);
    check(
        &format!("{what}: mean"),
        saved.mean.as_ref().unwrap(),
        &mean,
        F32,
    );
    let (dy, dys) = upload(&rng.vec(n, -1.0, 1.0), &shape, dydt);
    let g = norm::norm_backward(&saved, &dy, None).unwrap();
    assert_eq!(g.source.shape(), &shape[..]);
    let r = reference::group_norm_backward(&xs, samples, channels, s, groups, ws, eps, &dys);
    check(&format!("{what}: dx"), &g.source, &r.source, F32);
    assert_eq!(g.weight.is_some(), affine);
    assert_eq!(g.bias.is_some(), affine);
    if let (Some(dw), Some(db)) = (&g.weight, &g.bias) {
        assert_eq!((dw.shape(), db.shape()), (&[channels][..], &[channels][..]));
        check(&format!("{what}: dw"), dw, &r.weight, F32);
        check(&format!("{what}: db"), db, &r.bias, F32);
    }
}

#[test]
fn group_norm_every_dtype_and_layout() {
    let mut seed = 1700;
    for dt in DType::FLOATS {
        for (samples, channels, spatial, groups) in [
            (1, 1, &[][..], 1),
            (3, 6, &[5][..], 3),
            (2, 8, &[3, 3][..], 2),
            (4, 12, &[7][..], 12),
            (2, 4, &[1031][..], 1),
        ] {
            seed += 1;
            run_group(samples, channels, spatial, groups, dt, true, 0.0, seed);
        }
    }
    run_group(3, 6, &[4], 2, DType::F32, false, 0.0, 1790);
    run_group(2, 4, &[300], 2, DType::F32, true, 1e4, 1791);
    // More samples than one block of the parameter gradients' column sums (64), positions
    // fewer and more than the 32 lanes of a channel's sum.
    run_group(150, 4, &[33], 2, DType::F32, true, 0.0, 1792);
    run_group(70, 2, &[5], 1, DType::BF16, true, 0.0, 1793);
}

#[test]
fn group_norm_register_forward_and_backward() {
    // Positions a multiple of the chunk length (4 F32, 8 16-bit values) take the register
    // forward, a chunk within one channel, and with dy in x's dtype the register backward:
    // every dtype, with and without the affine parameters, a 1e4 offset, rows of one chunk
    // and rows of 16,384 values.
    let mut seed = 1800;
    for dt in DType::FLOATS {
        for (samples, channels, spatial, groups, affine, offset) in [
            (3, 6, &[8][..], 3, true, 0.0),
            (5, 8, &[4, 4][..], 2, true, 0.0),
            (2, 4, &[8][..], 4, false, 0.0),
            (2, 4, &[256][..], 2, true, 1e4),
            (2, 16, &[1024][..], 1, true, 0.0),
        ] {
            if dt != DType::F32 && offset != 0.0 {
                continue;
            }
            seed += 1;
            let layout = (samples, channels, spatial, groups);
            run_group_dy(layout, dt, dt, affine, offset, seed);
            run_group_dy(layout, dt, DType::F32, affine, offset, seed + 100);
        }
    }
}

#[test]
fn group_norm_reference_gradients_match_finite_differences() {
    let (samples, channels, spatial, groups) = (2, 4, 3, 2);
    let n = samples * channels * spatial;
    let mut rng = Rng::new(1800);
    let x = rng.vec(n, -2.0, 2.0);
    let dy = rng.vec(n, -1.0, 1.0);
    let w = rng.vec(channels, 0.5, 1.5);
    let b = rng.vec(channels, -0.5, 0.5);
    let eps = 1e-5;
    let g =
        reference::group_norm_backward(&x, samples, channels, spatial, groups, Some(&w), eps, &dy);
    let f = |x: &[f64]| {
        reference::group_norm(
            x,
            samples,
            channels,
            spatial,
            groups,
            Some(&w),
            Some(&b),
            eps,
        )
    };
    fd("group dx", check_vjp(f, &x, &dy, &g.source));
    let f = |w: &[f64]| {
        reference::group_norm(
            &x,
            samples,
            channels,
            spatial,
            groups,
            Some(w),
            Some(&b),
            eps,
        )
    };
    fd("group dw", check_vjp(f, &w, &dy, &g.weight));
    let f = |b: &[f64]| {
        reference::group_norm(
            &x,
            samples,
            channels,
            spatial,
            groups,
            Some(&w),
            Some(b),
            eps,
        )
    };
    fd("group db", check_vjp(f, &b, &dy, &g.bias));
}

#[test]
fn group_norm_reruns_and_bad_inputs() {
    let e = engine();
    let mut rng = Rng::new(1900);
    let (x, _) = upload(&rng.vec(4 * 8 * 50, -2.0, 2.0), &[4, 8, 50], DType::BF16);
    let (w, _) = upload(&rng.vec(8, 0.5, 1.5), &[8], DType::F32);
    let (dy, _) = upload(&rng.vec(4 * 8 * 50, -1.0, 1.0), &[4, 8, 50], DType::F32);
    let o = norm::GroupNormOptions::default();
    let run = || {
        let (y, saved) = norm::group_norm(&x, 4, Some(&w), Some(&w), &o).unwrap();
        let g = norm::norm_backward(&saved, &dy, None).unwrap();
        [
            &y,
            &g.source,
            g.weight.as_ref().unwrap(),
            g.bias.as_ref().unwrap(),
        ]
        .map(bits)
    };
    assert!(run() == run(), "second run differs");

    for groups in [0, 3, 9] {
        expect_bounds(
            norm::group_norm(&x, groups, None, None, &o),
            groups as u64,
            "groups",
        );
    }
    let w7 = Tensor::zeros(e, &[7], DType::F32).unwrap();
    expect_shape(
        norm::group_norm(&x, 2, Some(&w7), None, &o),
        "group weight length",
    );
    expect_shape(
        norm::group_norm(&x, 2, None, Some(&w7), &o),
        "group bias length",
    );
    let flat = Tensor::zeros(e, &[8], DType::F32).unwrap();
    expect_bounds(norm::group_norm(&flat, 1, None, None, &o), 1, "one axis");
    let empty = Tensor::zeros(e, &[0, 8, 5], DType::F32).unwrap();
    expect_bounds(
        norm::group_norm(&empty, 2, None, None, &o),
        0,
        "zero samples",
    );
    expect_invalid(
        norm::group_norm(&x, 2, None, None, &norm::GroupNormOptions { eps: 0.0 }),
        "eps",
    );
    let (_, saved) = norm::group_norm(&x, 2, None, None, &o).unwrap();
    let bad = Tensor::zeros(e, &[4, 8, 49], DType::F32).unwrap();
    expect_shape(norm::norm_backward(&saved, &bad, None), "cotangent shape");
}

#[test]
fn hand_edited_saved_contexts_are_rejected() {
    let e = engine();
    let mut rng = Rng::new(2000);
    let (x, _) = upload(&rng.vec(8 * 6, -1.0, 1.0), &[8, 6], DType::F32);
    let (w, _) = upload(&rng.vec(6, 0.5, 1.5), &[6], DType::F32);
    let (_, saved) = norm::layer_norm(&x, Some(&w), None, &LayerNormOptions::default()).unwrap();
    let short = Tensor::zeros(e, &[7], DType::F32).unwrap();
    let mut bad = saved.clone();
    bad.inverse = short.clone();
    expect_shape(norm::norm_backward(&bad, &x, None), "short inverse");
    let mut bad = saved.clone();
    bad.mean = None;
    expect_invalid(norm::norm_backward(&bad, &x, None), "missing mean");
    let mut bad = saved.clone();
    bad.inverse = Tensor::zeros(e, &[8], DType::BF16).unwrap();
    expect_dtype(
        norm::norm_backward(&bad, &x, None),
        DType::BF16,
        "16-bit inverse",
    );
    let mut bad = saved.clone();
    bad.eps = -1.0;
    expect_invalid(norm::norm_backward(&bad, &x, None), "saved eps");
    let mut bad = saved.clone();
    bad.kind = NormKind::Modulated;
    expect_invalid(
        norm::norm_backward(&bad, &x, None),
        "modulated without scale",
    );
    bad.scale = Some(Tensor::zeros(e, &[3, 6], DType::F32).unwrap());
    expect_shape(
        norm::norm_backward(&bad, &x, None),
        "scale batches not dividing rows",
    );
    let mut bad = saved.clone();
    bad.kind = NormKind::AddRms;
    expect_invalid(norm::norm_backward(&bad, &x, None), "add without residual");
    let mut bad = saved.clone();
    bad.kind = NormKind::Group;
    expect_invalid(norm::norm_backward(&bad, &x, None), "group without layout");
    let mut bad = saved;
    bad.weight = Some(short);
    expect_shape(norm::norm_backward(&bad, &x, None), "saved weight length");

    let (a, _) = upload(&[0.5], &[1], DType::F32);
    let (_, mut dyt) = norm::dyt(&x, &a, &w, None).unwrap();
    dyt.gamma = Tensor::zeros(e, &[5], DType::F32).unwrap();
    expect_shape(norm::dyt_backward(&dyt, &x), "dyt saved gamma");
    let (pw, _) = upload(&[0.5, 0.5, 0.5], &[3], DType::F32);
    let (_, mut poly) = norm::poly_norm(&x, &pw, None, &norm::PolyNormOptions::default()).unwrap();
    poly.inverse = Tensor::zeros(e, &[8], DType::F32).unwrap();
    expect_shape(norm::poly_norm_backward(&poly, &x), "poly saved inverse");
}

#[test]
fn more_rows_than_one_dispatch_dimension() {
    // 66,000 rows: the per-row launches fold past 65,535 workgroups.
    let (rows, cols) = (66_000, 2);
    run_rms(
        &RmsCase {
            rows,
            cols,
            x: DType::BF16,
            weight: Some(DType::F32),
            dy: DType::F32,
            options: RmsNormOptions::default(),
        },
        2100,
    );
}

/// `norm_backward_as` stores the source (and residual) gradient as the F32 gradient rounded
/// once: bit for bit `cast::cast` of [`norm::norm_backward`]'s, with the parameter gradients
/// F32 and bit-identical to it. RMSNorm (Gemma offset), LayerNorm (weight and bias), add+RMSNorm
/// (with and without a residual-sum cotangent), modulated RMSNorm and GroupNorm, every source
/// dtype into every gradient dtype. 16-bit sources in register rows (64, 4,096 and 16,392
/// columns, the last the two-read 1,024-lane backward of the RMSNorm variants) write the
/// 16-bit gradient directly, as do the other 16-bit rows of an even width (302; LayerNorm at
/// 16,392; the modulated form), whose column pass owns two columns a lane; odd widths (7,
/// 301), GroupNorm and F32 sources narrow the F32 gradient. The cotangent holds a NaN and an
/// infinity.
#[test]
fn norm_backward_as_is_the_f32_gradient_rounded_once() {
    let narrowed = |t: &Tensor, d: DType| {
        if d == DType::F32 {
            t.clone()
        } else {
            wgrad::cast::cast(t, d).unwrap()
        }
    };
    let params = |g: &norm::NormGradients| -> Vec<Vec<u64>> {
        [&g.weight, &g.bias, &g.scale, &g.shift]
            .into_iter()
            .flatten()
            .map(bits)
            .collect()
    };
    let mut rng = Rng::new(1100);
    for (rows, cols) in [
        (5usize, 64usize),
        (3, 4096),
        (2, 16_392),
        (4, 7),
        (3, 301),
        (35, 302),
    ] {
        for xdt in DType::FLOATS {
            let n = rows * cols;
            let (x, _) = upload(&rng.vec(n, -2.0, 2.0), &[rows, cols], xdt);
            let (r, _) = upload(&rng.vec(n, -2.0, 2.0), &[rows, cols], xdt);
            let (w, _) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], xdt);
            let (b, _) = upload(&rng.vec(cols, -0.5, 0.5), &[cols], xdt);
            let (sc, _) = upload(&rng.vec(cols, -0.5, 0.5), &[1, cols], DType::F32);
            let mut dyv = rng.vec(n, -1.0, 1.0);
            dyv[1] = f64::NAN;
            dyv[n - 1] = f64::INFINITY;
            let (dy, _) = upload(&dyv, &[rows, cols], xdt);
            let (dres, _) = upload(&rng.vec(n, -1.0, 1.0), &[rows, cols], xdt);
            let gemma = RmsNormOptions {
                offset: 1.0,
                ..RmsNormOptions::default()
            };
            let o = RmsNormOptions::default();
            let (_, s_rms) = norm::rms_norm(&x, Some(&w), &gemma).unwrap();
            let (_, s_layer) =
                norm::layer_norm(&x, Some(&w), Some(&b), &LayerNormOptions::default()).unwrap();
            let (_, _, s_add) = norm::add_rms_norm(&x, &r, Some(&w), &o).unwrap();
            let (_, s_mod) = norm::modulated_rms_norm(&x, Some(&w), &sc, &sc, &o).unwrap();
            let mut cases = vec![
                ("rms", &s_rms, None),
                ("layer", &s_layer, None),
                ("add", &s_add, None),
                ("add+dres", &s_add, Some(&dres)),
                ("modulated", &s_mod, None),
            ];
            let grouped = (cols % 2 == 0).then(|| {
                let (_, s) =
                    norm::group_norm(&x, 2, Some(&w), Some(&b), &Default::default()).unwrap();
                s
            });
            if let Some(s) = &grouped {
                cases.push(("group", s, None));
            }
            for (name, saved, d) in cases {
                let want = norm::norm_backward(saved, &dy, d).unwrap();
                for out in DType::FLOATS {
                    let what = format!("{name} {xdt} -> {out} [{rows}, {cols}]");
                    let got = norm::norm_backward_as(saved, &dy, d, out).unwrap();
                    assert_eq!(got.source.dtype(), out, "{what}");
                    let source = narrowed(&want.source, out);
                    common::assert_same_bits(&format!("{what}: source"), &got.source, &source);
                    assert_eq!(params(&got), params(&want), "{what}: parameters");
                    assert_eq!(got.residual.is_some(), want.residual.is_some(), "{what}");
                    if let Some(res) = &got.residual {
                        common::assert_same_bits(&format!("{what}: residual"), res, &source);
                    }
                    let again = norm::norm_backward_as(saved, &dy, d, out).unwrap();
                    assert!(bits(&again.source) == bits(&got.source), "{what}: rerun");
                }
            }
        }
    }
    // The direct path allocates no F32 source gradient: the peak grows by the BF16 gradient
    // where the F32 backward grows by the F32 one (same partials and parameter gradients).
    let private = common::private_engine();
    let (rows, cols) = (256, 4096);
    let v = rng.vec(rows * cols, -2.0, 2.0);
    let up = |v: &[f64], shape: &[usize]| {
        wgrad::gradcheck::tensor_from_f64(&private, v, shape, DType::BF16)
            .unwrap()
            .0
    };
    let x = up(&v, &[rows, cols]);
    let w = up(&rng.vec(cols, 0.5, 1.5), &[cols]);
    let (_, saved) = norm::rms_norm(&x, Some(&w), &RmsNormOptions::default()).unwrap();
    let peak = |dtype: DType| {
        private.synchronize().unwrap();
        let before = private.memory().live_bytes;
        private.reset_peak();
        let g = norm::norm_backward_as(&saved, &x, None, dtype).unwrap();
        private.synchronize().unwrap();
        drop(g);
        private.memory().peak_bytes - before
    };
    let (f32_peak, bf16_peak) = (peak(DType::F32), peak(DType::BF16));
    let saved_bytes = (rows * cols * 2) as u64;
    assert!(
        bf16_peak + saved_bytes * 7 / 8 <= f32_peak,
        "BF16 gradient peak {bf16_peak} bytes, F32 {f32_peak}: expected {saved_bytes} fewer"
    );
    // A dtype that is not a float dtype.
    expect_dtype(
        norm::norm_backward_as(&saved, &x, None, DType::I32),
        DType::I32,
        "norm_backward_as: dtype",
    );
}

/// One chunk-pass case: `kind` 0 RMSNorm (weight in `dt`), 1 RMSNorm with an F32 weight and
/// the Gemma offset, 2 LayerNorm with weight and bias, 3 LayerNorm with neither, 4 add+RMSNorm
/// with a residual-sum cotangent, 5 without, 6 LayerNorm with a bias alone. Checks dx and every parameter gradient against
/// the reference, the 16-bit dx (16-bit sources) against the F32 one rounded (bit for bit, the
/// parameter gradients equal), and a rerun bit for bit.
fn run_chunk_case(kind: u8, (rows, cols): (usize, usize), dt: DType, seed: u64) {
    let what = format!("chunk passes, case {kind}, {rows}x{cols} {dt}");
    let mut rng = Rng::new(seed);
    let (x, xs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], dt);
    let wdt = if kind == 1 { DType::F32 } else { dt };
    let (w, ws) = upload(&rng.vec(cols, 0.5, 1.5), &[cols], wdt);
    let (b, _) = upload(&rng.vec(cols, -0.5, 0.5), &[cols], DType::F32);
    let (r, rs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], dt);
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt);
    let (ds, dss) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt);
    let eps = f64::from(norm::DEFAULT_EPS);
    let o = RmsNormOptions {
        offset: if kind == 1 { 1.0 } else { 0.0 },
        ..RmsNormOptions::default()
    };
    let dres = (kind == 4).then_some(&ds);
    let (saved, want) = match kind {
        0 | 1 => (
            norm::rms_norm(&x, Some(&w), &o).unwrap().1,
            reference::rms_norm_backward(
                &xs,
                rows,
                cols,
                Some(&ws),
                f64::from(o.offset),
                eps,
                &dys,
            ),
        ),
        2 | 3 | 6 => {
            let (wb, bb) = match kind {
                2 => (Some(&w), Some(&b)),
                3 => (None, None),
                _ => (None, Some(&b)),
            };
            let saved = norm::layer_norm(&x, wb, bb, &LayerNormOptions::default())
                .unwrap()
                .1;
            let ws = (kind == 2).then_some(ws.as_slice());
            (
                saved,
                reference::layer_norm_backward(&xs, rows, cols, ws, eps, &dys),
            )
        }
        _ => (
            norm::add_rms_norm(&x, &r, Some(&w), &o).unwrap().2,
            reference::add_rms_norm_backward(
                &xs,
                &rs,
                rows,
                cols,
                Some(&ws),
                0.0,
                eps,
                &dys,
                dres.map(|_| dss.as_slice()),
            ),
        ),
    };
    let g = norm::norm_backward(&saved, &dy, dres).unwrap();
    check(
        &format!("{what}: dx"),
        &g.source,
        &want.source,
        dx_tol(cols),
    );
    if matches!(kind, 4 | 5) {
        let residual = g.residual.as_ref().expect("residual gradient");
        assert_eq!(bits(residual), bits(&g.source), "{what}: dresidual");
    }
    let params = [
        (g.weight.as_ref(), &want.weight),
        (g.bias.as_ref(), &want.bias),
    ];
    for (name, (got, want)) in ["dw", "db"].iter().zip(params) {
        match got {
            Some(got) => {
                check(&format!("{what}: {name}"), got, want, F32);
            }
            None => assert!(
                kind == 3
                    || (*name == "db" && kind != 2 && kind != 6)
                    || (*name == "dw" && kind == 6),
                "{what}: {name} missing"
            ),
        }
    }
    assert_rerun_and_rounded_dx(&what, &saved, (&dy, dres), dt, &g);
}

/// The backward run again gives every gradient of `g` bit for bit, and for a 16-bit `dt`
/// `norm_backward_as` gives `g`'s dx rounded to it and the same parameter gradients.
fn assert_rerun_and_rounded_dx(
    what: &str,
    saved: &norm::Saved,
    (dy, dres): (&Tensor, Option<&Tensor>),
    dt: DType,
    g: &norm::NormGradients,
) {
    let all = |g: &norm::NormGradients| {
        [&g.weight, &g.bias, &g.scale, &g.shift].map(|t| t.as_ref().map(bits))
    };
    let again = norm::norm_backward(saved, dy, dres).unwrap();
    assert_eq!(bits(&again.source), bits(&g.source), "{what}: rerun dx");
    assert_eq!(all(&again), all(g), "{what}: rerun parameter gradients");
    if dt != DType::F32 {
        let h = norm::norm_backward_as(saved, dy, dres, dt).unwrap();
        assert_eq!(h.source.dtype(), dt, "{what}");
        let rounded = wgrad::cast::cast(&g.source, dt).unwrap();
        assert_eq!(bits(&h.source), bits(&rounded), "{what}: 16-bit dx");
        assert_eq!(all(&h), all(g), "{what}: 16-bit dx's params");
    }
}

#[test]
fn chunk_passes_match_reference() {
    // The chunk passes of the backward: forced onto rows of 1, 3, 65 and 1,030 chunks (the
    // row pass takes 1,024 chunks a step), and by the rule at 4,096 chunks (LayerNorm, past 8
    // chunks a lane of 256; add+RMSNorm of 16-bit sources, which 1,024 lanes would hold; the
    // others on 1,024 lanes) and 4,097 (add+RMSNorm and 16-bit RMSNorm past 4 a lane of 1,024;
    // F32 RMSNorm there on 1,024 lanes of 5 chunks): each 16-bit dx the F32 one rounded, the
    // parameter gradients the same; 37 rows leave a last block of 5 (an odd row of the two-row
    // steps).
    let mut seed = 4200;
    for (forced, rows, chunks) in [
        (Some(true), 37, &[1usize, 3, 65, 1030][..]),
        (None, 3, &[4096, 4097][..]),
    ] {
        norm::force_chunk_passes(forced);
        for dt in DType::FLOATS {
            let len = if dt == DType::F32 { 4 } else { 8 };
            for &c in chunks {
                for kind in 0..7 {
                    seed += 1;
                    run_chunk_case(kind, (rows, c * len), dt, seed);
                }
            }
        }
    }
    // More rows than one dispatch dimension holds (65,535 workgroups): the row pass's
    // workgroups in two dimensions.
    norm::force_chunk_passes(Some(true));
    for (kind, dt, cols) in [(2, DType::F32, 4), (4, DType::BF16, 8)] {
        seed += 1;
        run_chunk_case(kind, (70_001, cols), dt, seed);
    }
    norm::force_chunk_passes(None);
}

/// Modulated RMSNorm's backward by the chunk passes (forced): `rows` in `batches` modulation
/// batches, dy in x's dtype, scale and shift in `sdt`, against the f64 reference; reruns bit
/// for bit; a 16-bit dx the F32 one rounded with the same parameter gradients.
fn run_modulated_chunk_case(
    (rows, cols, batches): (usize, usize, usize),
    dt: DType,
    sdt: DType,
    weight: bool,
    seed: u64,
) {
    let what = format!(
        "modulated chunk passes {rows}x{cols} batches {batches} {dt} scale {sdt} weight {weight}"
    );
    let mut rng = Rng::new(seed);
    let (x, xs) = upload(&rng.vec(rows * cols, -2.0, 2.0), &[rows, cols], dt);
    let w = weight.then(|| upload(&rng.vec(cols, 0.5, 1.5), &[cols], dt));
    let ws = w.as_ref().map(|w| w.1.as_slice());
    let (sc, scs) = upload(&rng.vec(batches * cols, -0.5, 0.5), &[batches, cols], sdt);
    let (sh, _) = upload(&rng.vec(batches * cols, -0.5, 0.5), &[batches, cols], sdt);
    let (dy, dys) = upload(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dt);
    let o = RmsNormOptions {
        offset: 1.0,
        ..RmsNormOptions::default()
    };
    let saved = norm::modulated_rms_norm(&x, w.as_ref().map(|w| &w.0), &sc, &sh, &o)
        .unwrap()
        .1;
    let eps = f64::from(norm::DEFAULT_EPS);
    let want =
        reference::modulated_rms_norm_backward(&xs, rows, cols, batches, ws, 1.0, &scs, eps, &dys);
    let g = norm::norm_backward(&saved, &dy, None).unwrap();
    check(
        &format!("{what}: dx"),
        &g.source,
        &want.source,
        dx_tol(cols),
    );
    match &g.weight {
        Some(dw) => {
            check(&format!("{what}: dw"), dw, &want.weight, F32);
        }
        None => assert!(!weight, "{what}: dw missing"),
    }
    let dscale = g.scale.as_ref().expect("scale gradient");
    let dshift = g.shift.as_ref().expect("shift gradient");
    check(&format!("{what}: dscale"), dscale, &want.scale, F32);
    check(&format!("{what}: dshift"), dshift, &want.bias, F32);
    assert_rerun_and_rounded_dx(&what, &saved, (&dy, None), dt, &g);
}

#[test]
fn modulated_chunk_passes_match_reference() {
    // Forced onto rows of 1, 3, 65 and 1,030 chunks: one batch of 37 rows (a last block of 5,
    // an odd row of the two-row steps), two of 33 (a block of 32 and one of 1 in each), three
    // of 2 and five of 1; scale and shift in x's dtype (read as chunks) and in another (value
    // by value); with and without a weight; every dtype.
    let mut seed = 4400;
    norm::force_chunk_passes(Some(true));
    for dt in DType::FLOATS {
        let len = if dt == DType::F32 { 4 } else { 8 };
        let other = if dt == DType::F32 {
            DType::BF16
        } else {
            DType::F32
        };
        for (rows, batches, chunks) in [
            (37, 1, &[1usize, 3, 65, 1030][..]),
            (66, 2, &[3, 65][..]),
            (6, 3, &[1, 65][..]),
            (5, 5, &[3][..]),
        ] {
            for &c in chunks {
                for (sdt, weight) in [(dt, true), (other, true), (dt, false)] {
                    seed += 1;
                    run_modulated_chunk_case((rows, c * len, batches), dt, sdt, weight, seed);
                }
            }
        }
    }
    // The entries taken: the chunk passes by the rule and where forced, the general passes
    // where they are forced off.
    let e = engine();
    let (x, _) = upload(&Rng::new(1).vec(4 * 64, -2.0, 2.0), &[4, 64], DType::F32);
    let (sc, _) = upload(&Rng::new(2).vec(2 * 64, -0.5, 0.5), &[2, 64], DType::F32);
    let o = RmsNormOptions::default();
    let saved = norm::modulated_rms_norm(&x, None, &sc, &sc, &o).unwrap().1;
    for (forced, taken) in [(Some(true), true), (None, true), (Some(false), false)] {
        norm::force_chunk_passes(forced);
        let kernels = match e.profile(|| norm::norm_backward(&saved, &x, None).unwrap()) {
            Ok((_, kernels)) => kernels,
            // No timestamps on this adapter: the entries cannot be listed.
            Err(Error::MissingFeature { .. }) => break,
            Err(other) => panic!("profile: {other:?}"),
        };
        let launched = |entry: &str| kernels.iter().any(|k| k.entry == entry);
        for entry in ["mod_backward_rows_chunks", "mod_backward_column_units"] {
            assert_eq!(launched(entry), taken, "{entry} with {forced:?}");
        }
    }
    norm::force_chunk_passes(None);
}

#[test]
fn parameters_in_app_buffers_smaller_than_a_chunk() {
    // Weights (and GroupNorm's bias) in an app's buffer of fewer than 16 bytes, which the
    // register paths read through 16-byte chunk bindings: the results are those of the same
    // values in the engine's own tensors. RMSNorm of F32 rows of 4 values with a BF16 weight
    // (8 bytes); GroupNorm of 2 F32 channels with F32 weight and bias (8 bytes each).
    let e = engine();
    // The same values in an engine tensor and in an app's buffer of their bytes.
    fn both<T: wgrad::Element>(e: &wgrad::Engine, values: &[T]) -> (Tensor, Tensor) {
        let own = Tensor::from_slice(e, values, &[values.len()]).unwrap();
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let buffer = e.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("app parameter"),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        e.queue().write_buffer(&buffer, 0, bytes);
        let app = Tensor::from_buffer(e, buffer, &[values.len()], T::DTYPE).unwrap();
        (own, app)
    }
    let mut rng = Rng::new(77);
    let (x, _) = upload(&rng.vec(12, -2.0, 2.0), &[3, 4], DType::F32);
    let w: Vec<half::bf16> = rng
        .vec(4, 0.5, 1.5)
        .into_iter()
        .map(half::bf16::from_f64)
        .collect();
    let (own, app) = both(e, &w);
    let o = RmsNormOptions::default();
    let want = norm::rms_norm(&x, Some(&own), &o).unwrap().0;
    let got = norm::rms_norm(&x, Some(&app), &o).unwrap().0;
    assert_eq!(bits(&got), bits(&want), "RMSNorm, BF16 weight of 8 bytes");
    let (gx, _) = upload(&rng.vec(2 * 2 * 8, -2.0, 2.0), &[2, 2, 8], DType::F32);
    let f32s = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<f32>>();
    let (ow, aw) = both(e, &f32s(rng.vec(2, 0.5, 1.5)));
    let (ob, ab) = both(e, &f32s(rng.vec(2, -0.5, 0.5)));
    let go = norm::GroupNormOptions::default();
    let want = norm::group_norm(&gx, 1, Some(&ow), Some(&ob), &go)
        .unwrap()
        .0;
    let got = norm::group_norm(&gx, 1, Some(&aw), Some(&ab), &go)
        .unwrap()
        .0;
    assert_eq!(
        bits(&got),
        bits(&want),
        "GroupNorm, weight and bias of 8 bytes"
    );
}
