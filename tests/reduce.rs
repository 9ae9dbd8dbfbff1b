//! Fixed-order reductions (`sum_rows`, `max_rows`, `sum_columns`, `sum_partials`) against the
//! f64 references of `wgrad::reference::reduce`, for F32, F16 and BF16 inputs on ragged and
//! empty shapes; reproducibility and dtype/engine errors.
//!
//! Tolerance. Inputs are compared as stored (16-bit inputs widen exactly to f32), so the only
//! error is f32 accumulation. A sum whose longest chain of dependent additions has `k` steps
//! is within `k·u·Σ|x|` of the exact sum (u = 2⁻²⁴, the f32 unit roundoff; first-order bound,
//! see Higham, "Accuracy and Stability of Numerical Algorithms", §4.2). The chains are fixed
//! by the kernels' documented order:
//! * `sum_rows`: lane `t` folds `⌈cols/256⌉` columns, then an 8-level tree over 256 lanes;
//! * `sum_columns`: at most 64 rows per block top to bottom, then the blocks in order.
//!
//! We allow `(k + 1)·u·Σ|x| + 1e-30`. Maxima are exact (no rounding), so they must be equal.

mod common;

use common::{engine, private_engine};
use wgrad::reference::reduce as reference;
use wgrad::{DType, Error, Tensor, reduce};

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Ragged shapes: single element, fewer columns than lanes, more columns than lanes
/// (several per lane), more rows than a column block (several blocks), partial blocks.
const SHAPES: [(usize, usize); 9] = [
    (1, 1),
    (3, 7),
    (17, 300),
    (130, 5),
    (1000, 3),
    (65, 257),
    (2, 513),
    (64, 1),
    (129, 64),
];

fn data_for(seed: u64, rows: usize, cols: usize) -> Vec<f64> {
    // Mixed magnitudes and signs, well inside f16's range.
    let mut rng = common::Rng::new(seed);
    (0..rows * cols)
        .map(|_| rng.uniform(-1.0, 1.0) * 2f64.powi(rng.uniform(-6.0, 6.0) as i32))
        .collect()
}

fn check_sums(what: &str, got: &[f64], want: &[f64], abs_sums: &[f64], chain: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let tol = (chain as f64 + 1.0) * U * abs_sums[i] + 1e-30;
        assert!(
            (got[i] - want[i]).abs() <= tol,
            "{what}: element {i}: gpu {} vs reference {} (|diff| {:e} > tolerance {:e})",
            got[i],
            want[i],
            (got[i] - want[i]).abs(),
            tol
        );
    }
}

fn abs_rows(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let a: Vec<f64> = x.iter().map(|v| v.abs()).collect();
    reference::sum_rows(&a, rows, cols)
}

fn abs_columns(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let a: Vec<f64> = x.iter().map(|v| v.abs()).collect();
    reference::sum_columns(&a, rows, cols)
}

fn row_chain(cols: usize) -> usize {
    cols.div_ceil(256) + 8
}

fn column_chain(rows: usize) -> usize {
    rows.min(reduce::BLOCK_ROWS) + rows.div_ceil(reduce::BLOCK_ROWS)
}

fn run_all_shapes(dtype: DType) {
    let e = engine();
    for (k, &(rows, cols)) in SHAPES.iter().enumerate() {
        let what = format!("{dtype} [{rows}, {cols}]");
        let data = data_for(k as u64 * 31 + dtype.code() as u64, rows, cols);
        let x = common::tensor_from_f64(e, &data, &[rows, cols], dtype);
        let stored = x.to_f64().unwrap();
        assert_eq!(stored, common::stored(&data, dtype));

        let s = reduce::sum_rows(&x).unwrap();
        assert_eq!(s.shape(), &[rows]);
        assert_eq!(s.dtype(), DType::F32);
        let got = s.to_f64().unwrap();
        check_sums(
            &format!("sum_rows {what}"),
            &got,
            &reference::sum_rows(&stored, rows, cols),
            &abs_rows(&stored, rows, cols),
            row_chain(cols),
        );

        let m = reduce::max_rows(&x).unwrap();
        assert_eq!(m.shape(), &[rows]);
        assert_eq!(
            m.to_f64().unwrap(),
            reference::max_rows(&stored, rows, cols),
            "max_rows {what}"
        );

        let c = reduce::sum_columns(&x).unwrap();
        assert_eq!(c.shape(), &[cols]);
        assert_eq!(c.dtype(), DType::F32);
        check_sums(
            &format!("sum_columns {what}"),
            &c.to_f64().unwrap(),
            &reference::sum_columns(&stored, rows, cols),
            &abs_columns(&stored, rows, cols),
            column_chain(rows),
        );

        // A second run gives the same bits.
        assert!(
            common::f32_bits(&s) == common::f32_bits(&reduce::sum_rows(&x).unwrap()),
            "sum_rows {what}: second run differs"
        );
        assert!(
            common::f32_bits(&m) == common::f32_bits(&reduce::max_rows(&x).unwrap()),
            "max_rows {what}: second run differs"
        );
        assert!(
            common::f32_bits(&c) == common::f32_bits(&reduce::sum_columns(&x).unwrap()),
            "sum_columns {what}: second run differs"
        );
    }
}

#[test]
fn reductions_f32() {
    run_all_shapes(DType::F32);
}

#[test]
fn reductions_f16() {
    run_all_shapes(DType::F16);
}

#[test]
fn reductions_bf16() {
    run_all_shapes(DType::BF16);
}

#[test]
fn leading_axes_flatten_to_rows() {
    let e = engine();
    let (a, b, cols) = (2, 3, 70);
    let data = data_for(5, a * b, cols);
    let x = common::tensor_from_f64(e, &data, &[a, b, cols], DType::F32);
    let stored = x.to_f64().unwrap();
    let s = reduce::sum_rows(&x).unwrap();
    assert_eq!(s.shape(), &[a, b]);
    check_sums(
        "sum_rows [2, 3, 70]",
        &s.to_f64().unwrap(),
        &reference::sum_rows(&stored, a * b, cols),
        &abs_rows(&stored, a * b, cols),
        row_chain(cols),
    );
    let m = reduce::max_rows(&x).unwrap();
    assert_eq!(m.shape(), &[a, b]);
    assert_eq!(
        m.to_f64().unwrap(),
        reference::max_rows(&stored, a * b, cols)
    );
    let c = reduce::sum_columns(&x).unwrap();
    assert_eq!(c.shape(), &[cols]);
    check_sums(
        "sum_columns [2, 3, 70]",
        &c.to_f64().unwrap(),
        &reference::sum_columns(&stored, a * b, cols),
        &abs_columns(&stored, a * b, cols),
        column_chain(a * b),
    );
    // A 1-D tensor is one row.
    let v = common::tensor_from_f64(e, &data[..10], &[10], DType::F32);
    let s = reduce::sum_rows(&v).unwrap();
    assert!(s.shape().is_empty());
    assert_eq!(s.len(), 1);
    check_sums(
        "sum_rows [10]",
        &s.to_f64().unwrap(),
        &reference::sum_rows(&v.to_f64().unwrap(), 1, 10),
        &abs_rows(&v.to_f64().unwrap(), 1, 10),
        row_chain(10),
    );
}

#[test]
fn maxima_with_infinities_and_negative_rows() {
    let e = engine();
    let rows: Vec<Vec<f32>> = vec![
        vec![-5.0, -3.0, -4.0],
        vec![f32::NEG_INFINITY, -1e30, f32::NEG_INFINITY],
        vec![1.0, f32::INFINITY, 2.0],
        vec![f32::NEG_INFINITY; 3],
        vec![-0.0, -0.0, -0.0],
    ];
    let flat: Vec<f32> = rows.concat();
    let x = Tensor::from_slice(e, &flat, &[rows.len(), 3]).unwrap();
    let got = reduce::max_rows(&x).unwrap().to_f64().unwrap();
    let stored: Vec<f64> = flat.iter().map(|&v| f64::from(v)).collect();
    let want = reference::max_rows(&stored, rows.len(), 3);
    assert_eq!(got, want);
    // Over 256 columns the lanes' partial maxima meet in the tree.
    let cols = 600;
    for peak in [0, 255, 256, 599] {
        let mut v = vec![-1.0f32; cols];
        v[peak] = 7.5;
        let x = Tensor::from_slice(e, &v, &[1, cols]).unwrap();
        let stored: Vec<f64> = v.iter().map(|&a| f64::from(a)).collect();
        assert_eq!(
            reduce::max_rows(&x).unwrap().to_f64().unwrap(),
            reference::max_rows(&stored, 1, cols),
            "peak at column {peak}"
        );
    }
}

#[test]
fn empty_shapes() {
    let e = engine();
    for dtype in DType::FLOATS {
        // No rows: no row results, zero column sums.
        let x = Tensor::zeros(e, &[0, 5], dtype).unwrap();
        let s = reduce::sum_rows(&x).unwrap();
        assert_eq!(s.shape(), &[0]);
        assert_eq!(s.to_f64().unwrap(), Vec::<f64>::new());
        let m = reduce::max_rows(&x).unwrap();
        assert_eq!(m.shape(), &[0]);
        assert_eq!(m.to_f64().unwrap(), Vec::<f64>::new());
        // Take pooled buffers with data in them first: the zeros must be written.
        drop(Tensor::from_slice(e, &[f32::NAN; 8], &[8]).unwrap());
        let c = reduce::sum_columns(&x).unwrap();
        assert_eq!(c.shape(), &[5]);
        assert_eq!(c.to_f64().unwrap(), reference::sum_columns(&[], 0, 5));
        // No columns: empty rows sum to 0 and have maximum −∞; no column sums.
        let x = Tensor::zeros(e, &[4, 0], dtype).unwrap();
        drop(Tensor::from_slice(e, &[f32::NAN; 8], &[8]).unwrap());
        let s = reduce::sum_rows(&x).unwrap();
        assert_eq!(s.shape(), &[4]);
        assert_eq!(s.to_f64().unwrap(), reference::sum_rows(&[], 4, 0));
        let m = reduce::max_rows(&x).unwrap();
        assert_eq!(m.to_f64().unwrap(), reference::max_rows(&[], 4, 0));
        let c = reduce::sum_columns(&x).unwrap();
        assert_eq!(c.shape(), &[0]);
        assert_eq!(c.to_f64().unwrap(), Vec::<f64>::new());
        // Neither.
        let x = Tensor::zeros(e, &[0, 0], dtype).unwrap();
        assert_eq!(reduce::sum_rows(&x).unwrap().shape(), &[0]);
        assert_eq!(reduce::max_rows(&x).unwrap().shape(), &[0]);
        assert_eq!(reduce::sum_columns(&x).unwrap().shape(), &[0]);
    }
}

#[test]
fn sum_partials_matches_the_reference() {
    let e = engine();
    for (blocks, cols) in [(1, 1), (5, 3), (16, 300), (0, 4)] {
        let data = data_for(blocks as u64 + 100, blocks, cols);
        let p = common::tensor_from_f64(e, &data, &[blocks, cols], DType::F32);
        let stored = p.to_f64().unwrap();
        let got = reduce::sum_partials(e, &p).unwrap();
        assert_eq!(got.shape(), &[cols]);
        check_sums(
            &format!("sum_partials [{blocks}, {cols}]"),
            &got.to_f64().unwrap(),
            &reference::sum_columns(&stored, blocks, cols),
            &abs_columns(&stored, blocks, cols),
            blocks,
        );
    }
}

#[test]
fn long_partial_groups_sum_runs_of_64_rows_first() {
    // Runs longer than 64 partial rows are summed as the sums of their runs of 16 rows,
    // level by level until at most 64 remain (65 rows: two levels; 4,100: three): against the
    // reference within the chain of that order, from an offset, several groups; reruns
    // bit-identical; the scratch of those levels is the query's, and a bound below it is a
    // typed error.
    let e = engine();
    for (groups, per_group, cols, base) in [(1, 65, 3, 0), (3, 130, 7, 5), (2, 4100, 2, 11)] {
        let len = base + groups * per_group * cols;
        let data = data_for(len as u64, 1, len);
        let p = common::tensor_from_f64(e, &data, &[len], DType::F32);
        let stored = p.to_f64().unwrap();
        let got = reduce::sum_partial_groups(e, &p, base, groups, per_group, cols).unwrap();
        assert_eq!(got.shape(), &[groups, cols]);
        let block = &stored[base..];
        // Chain: at most 64 additions a level, one level per factor of 16.
        let levels = (per_group as f64).log(16.0).ceil() as usize;
        for g in 0..groups {
            let rows = &block[g * per_group * cols..(g + 1) * per_group * cols];
            let want = reference::sum_columns(rows, per_group, cols);
            check_sums(
                &format!("sum_partial_groups {groups}x{per_group}x{cols} group {g}"),
                &got.to_f64().unwrap()[g * cols..(g + 1) * cols],
                &want,
                &abs_columns(rows, per_group, cols),
                64 * levels,
            );
        }
        let again = reduce::sum_partial_groups(e, &p, base, groups, per_group, cols).unwrap();
        assert_eq!(common::f32_bits(&got), common::f32_bits(&again));
    }
    let runs = |rows: usize| rows.div_ceil(16);
    assert_eq!(reduce::sum_partial_groups_workspace_bytes(3, 64, 7), 0);
    assert_eq!(
        reduce::sum_partial_groups_workspace_bytes(3, 130, 7),
        (3 * runs(130) * 7 * 4) as u64
    );
    // 4,100 rows: 257 runs, then 17 (at most 64: the last level sums them directly).
    assert_eq!(
        reduce::sum_partial_groups_workspace_bytes(2, 4100, 2),
        (2 * (runs(4100) + runs(runs(4100))) * 2 * 4) as u64
    );
    let capped = private_engine();
    let p = Tensor::zeros(&capped, &[3 * 130 * 7], DType::F32).unwrap();
    let need = reduce::sum_partial_groups_workspace_bytes(3, 130, 7);
    capped.set_workspace_bound(need - 1);
    match reduce::sum_partial_groups(&capped, &p, 0, 3, 130, 7) {
        Err(Error::WorkspaceExceeded { needed, .. }) => assert_eq!(needed, need),
        r => panic!("expected WorkspaceExceeded, got {r:?}"),
    }
    capped.set_workspace_bound(need);
    assert!(reduce::sum_partial_groups(&capped, &p, 0, 3, 130, 7).is_ok());
}

fn expect_dtype_error(r: wgrad::Result<Tensor>, bad: DType, what: &str) {
    match r {
        Err(Error::UnsupportedDType { got, accepted, .. }) => {
            assert_eq!(got, bad, "{what}");
            assert!(!accepted.contains(&bad), "{what}");
        }
        other => panic!("{what}: expected UnsupportedDType, got {other:?}"),
    }
}

#[test]
fn integer_inputs_are_rejected() {
    let e = engine();
    let i = Tensor::from_slice(e, &[1i32, 2, 3, 4], &[2, 2]).unwrap();
    let u = Tensor::from_slice(e, &[1u32, 2, 3, 4], &[2, 2]).unwrap();
    for (x, dt) in [(&i, DType::I32), (&u, DType::U32)] {
        expect_dtype_error(reduce::sum_rows(x), dt, "sum_rows");
        expect_dtype_error(reduce::max_rows(x), dt, "max_rows");
        expect_dtype_error(reduce::sum_columns(x), dt, "sum_columns");
        expect_dtype_error(reduce::sum_partials(e, x), dt, "sum_partials");
    }
}

#[test]
fn sum_partials_needs_f32() {
    let e = engine();
    for dt in [DType::F16, DType::BF16] {
        let p = common::tensor_from_f64(e, &[1.0, 2.0, 3.0, 4.0], &[2, 2], dt);
        expect_dtype_error(reduce::sum_partials(e, &p), dt, "sum_partials");
    }
}

#[test]
fn sum_partials_checks_the_engine() {
    let other = private_engine();
    let p = Tensor::zeros(&other, &[2, 2], DType::F32).unwrap();
    match reduce::sum_partials(engine(), &p) {
        Err(Error::EngineMismatch { .. }) => {}
        r => panic!("expected EngineMismatch, got {r:?}"),
    }
}

#[test]
fn sum_columns_respects_the_workspace_bound() {
    let engine = common::private_engine();
    let (rows, cols) = (200, 300);
    let needed = wgrad::reduce::sum_columns_workspace_bytes(rows, cols);
    assert_eq!(needed, (rows.div_ceil(64) * cols * 4) as u64);
    let x = common::tensor_from_f64(&engine, &vec![1.0; rows * cols], &[rows, cols], DType::F32);
    engine.set_workspace_bound(needed - 1);
    match wgrad::reduce::sum_columns(&x) {
        Err(wgrad::Error::WorkspaceExceeded {
            needed: n, bound, ..
        }) => {
            assert_eq!((n, bound), (needed, needed - 1))
        }
        other => panic!("expected WorkspaceExceeded, got {other:?}"),
    }
    engine.set_workspace_bound(needed);
    let sums = wgrad::reduce::sum_columns(&x)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(sums.iter().all(|&s| s == rows as f32));
}

#[test]
fn subgroup_rows_are_deterministic_and_agree_with_the_trees() {
    // The register rows' reductions by subgroup shuffles (`force_subgroup_rows`): the softmax
    // and RMSNorm register rows rerun bit for bit, stay within a few f32 roundings of the
    // fan-in-8 trees, and the 16-bit softmax gradient is still the F32 one rounded once.
    let e = engine();
    let width = reduce::subgroup_width(e);
    if !e.info().features.contains(wgpu::Features::SUBGROUP) {
        assert_eq!(width, None);
        return;
    }
    let width = width.expect("a subgroup width on an adapter with SUBGROUP");
    assert!(
        width.is_power_of_two() && (4..=32).contains(&width),
        "{width}"
    );
    let (rows, cols) = (3, 32_000);
    let x = common::tensor_from_f64(
        e,
        &common::random_f64(250, rows * cols, -6.0, 6.0),
        &[rows, cols],
        DType::BF16,
    );
    let dy = common::tensor_from_f64(
        e,
        &common::random_f64(251, rows * cols, -1.0, 1.0),
        &[rows, cols],
        DType::BF16,
    );
    let w = common::tensor_from_f64(
        e,
        &common::random_f64(252, cols, -1.0, 1.0),
        &[cols],
        DType::BF16,
    );
    // A narrower row: its norm backward runs on 256 lanes (the wider one's on 1,024).
    let x2 = common::tensor_from_f64(
        e,
        &common::random_f64(253, 3 * 4096, -3.0, 3.0),
        &[3, 4096],
        DType::BF16,
    );
    let dy2 = common::tensor_from_f64(
        e,
        &common::random_f64(254, 3 * 4096, -1.0, 1.0),
        &[3, 4096],
        DType::BF16,
    );
    // The forwards with `forwards` forced (None: the rule), the backwards with `backwards`.
    let run = |forwards: Option<bool>, backwards: Option<bool>| {
        let opts = wgrad::norm::RmsNormOptions::default();
        reduce::force_subgroup_rows(forwards);
        let (y, saved) = wgrad::loss::softmax(&x).unwrap();
        let (n, nsaved) = wgrad::norm::rms_norm(&x, Some(&w), &opts).unwrap();
        let (n2, saved2) = wgrad::norm::rms_norm(&x2, None, &opts).unwrap();
        reduce::force_subgroup_rows(backwards);
        let dx = wgrad::loss::softmax_backward(&saved, &dy).unwrap();
        let dx16 = wgrad::loss::softmax_backward_as(&saved, &dy, DType::BF16).unwrap();
        let g = wgrad::norm::norm_backward(&nsaved, &dy, None).unwrap();
        let g2 = wgrad::norm::norm_backward(&saved2, &dy2, None).unwrap();
        reduce::force_subgroup_rows(None);
        [y, dx, dx16, n, g.source, n2, g2.source]
    };
    let sub = run(Some(true), Some(true));
    let again = run(Some(true), Some(true));
    let tree = run(Some(false), Some(false));
    // The default rule: subgroups for the forwards and the 1,024-lane norm backward, the trees
    // for the softmax backward and the 256-lane norm backward. A backward reads its forward's
    // saved statistics, which the subgroup forward may round differently from the tree one (an
    // H200 did for the 4,096-wide rows), so the rule's tree backwards are compared with tree
    // backwards of the subgroup forwards.
    let rule = run(None, None);
    let mixed = run(Some(true), Some(false));
    for (i, prefers_subgroups) in [true, false, false, true, true, true, false]
        .into_iter()
        .enumerate()
    {
        let want = if prefers_subgroups {
            &sub[i]
        } else {
            &mixed[i]
        };
        common::assert_same_bits(&format!("output {i} by the rule"), &rule[i], want);
    }
    for (i, ((a, b), t)) in sub.iter().zip(&again).zip(&tree).enumerate() {
        assert_eq!(
            a.to_f64().unwrap(),
            b.to_f64().unwrap(),
            "output {i}: rerun"
        );
        let (a, t) = (a.to_f64().unwrap(), t.to_f64().unwrap());
        let scale = t.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let worst = a
            .iter()
            .zip(&t)
            .fold(0.0f64, |m, (p, q)| m.max((p - q).abs()));
        // 16-bit outputs may land on the neighbouring value (2⁻⁸ relative); F32 ones differ by
        // a few roundings of the row sums.
        assert!(
            worst <= scale / 128.0,
            "output {i}: {worst} against scale {scale}"
        );
    }
    let rounded = wgrad::cast::cast(&sub[1], DType::BF16).unwrap();
    common::assert_same_bits("BF16 gradient = the F32 one rounded", &sub[2], &rounded);
}
