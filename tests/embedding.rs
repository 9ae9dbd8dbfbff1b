//! Embedding lookup against the f64 reference of `wgrad::reference::embedding`: the forward
//! bit for bit in every table dtype (odd widths of 16-bit tables, special values), the table
//! gradient in every cotangent dtype (every index repeated, all positions on one index,
//! padding, out-of-range positions, V = 1, sorts long enough to need the global merge steps),
//! and equal to a host f32 sum in ascending position order bit for bit; finite differences of
//! the reference backward; empty and 0-D index tensors; bit-identical reruns; bad inputs.

mod common;

use common::{Rng, assert_close, engine, f32_bits, stored, tensor_from_f64};
use wgrad::embedding::{
    EmbeddingOptions, embedding, embedding_backward, embedding_max_norm_workspace_bytes,
    embedding_renorm, embedding_renorm_workspace_bytes, embedding_workspace_bytes,
};
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::reference::embedding as reference;
use wgrad::{DType, Error, Tensor};

/// Raw storage bits of a float tensor, one entry per element.
fn bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::F32 => f32_bits(t),
        DType::F16 => t
            .to_vec::<half::f16>()
            .unwrap()
            .into_iter()
            .map(|h| u32::from(h.to_bits()))
            .collect(),
        DType::BF16 => t
            .to_vec::<half::bf16>()
            .unwrap()
            .into_iter()
            .map(|h| u32::from(h.to_bits()))
            .collect(),
        other => panic!("not a float tensor: {other}"),
    }
}

/// Table data with special values mixed in: ±0, ±∞, NaN, tiny and huge values.
fn table_data(seed: u64, n: usize) -> Vec<f64> {
    let mut v = Rng::new(seed).vec(n, -3.0, 3.0);
    let specials = [
        -0.0,
        0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-30,
        6e-8,
        3e38,
    ];
    for (i, s) in specials.iter().enumerate() {
        if 3 * i + 1 < n {
            v[3 * i + 1] = *s;
        }
    }
    v
}

fn index_tensor(values: &[i64], shape: &[usize], dtype: DType) -> Tensor {
    let e = engine();
    match dtype {
        DType::I32 => {
            let v: Vec<i32> = values.iter().map(|&x| x as i32).collect();
            Tensor::from_slice(e, &v, shape).unwrap()
        }
        _ => {
            let v: Vec<u32> = values.iter().map(|&x| x as u32).collect();
            Tensor::from_slice(e, &v, shape).unwrap()
        }
    }
}

fn unchecked() -> EmbeddingOptions {
    EmbeddingOptions {
        check_indices: false,
        ..Default::default()
    }
}

#[test]
fn forward_copies_rows_bit_for_bit_in_every_dtype() {
    let e = engine();
    for dtype in DType::FLOATS {
        for (k, &(rows, dim, ref shape)) in [
            (5usize, 4usize, vec![3usize, 5usize]),
            (7, 3, vec![11]),
            (4, 1, vec![2, 3, 2]),
            (9, 33, vec![7]),
            (1, 5, vec![4]),
            (6, 8, vec![5]),
            (3, 16, vec![2, 2]),
            (5, 12, vec![3]),
        ]
        .iter()
        .enumerate()
        {
            let n: usize = shape.iter().product();
            let table = table_data(10 + k as u64, rows * dim);
            let tt = tensor_from_f64(e, &table, &[rows, dim], dtype);
            let idx: Vec<i64> = (0..n)
                .map(|p| ((p * 7 + k) % rows) as i64)
                .collect::<Vec<_>>();
            for idtype in [DType::I32, DType::U32] {
                let it = index_tensor(&idx, shape, idtype);
                let (y, saved) = embedding(&tt, &it, &EmbeddingOptions::default()).unwrap();
                let mut want_shape = shape.clone();
                want_shape.push(dim);
                assert_eq!(y.shape(), want_shape.as_slice());
                assert_eq!(y.dtype(), dtype);
                assert_eq!(saved.table_shape(), [rows, dim]);
                // Bit for bit: each output element is the stored table element.
                let table_bits = bits(&tt);
                let want: Vec<u32> = idx
                    .iter()
                    .flat_map(|&r| table_bits[r as usize * dim..(r as usize + 1) * dim].to_vec())
                    .collect();
                assert_eq!(bits(&y), want, "{dtype} {rows}x{dim} {shape:?} {idtype}");
                // And the reference agrees (NaN matches NaN).
                let want = reference::forward(&stored(&table, dtype), rows, dim, &idx);
                assert_close(
                    "forward vs reference",
                    &y.to_f64().unwrap(),
                    &want,
                    Tolerance::EXACT,
                );
            }
        }
    }
}

#[test]
fn unchecked_out_of_range_indices_gather_zeros_and_give_no_gradient() {
    let e = engine();
    let (rows, dim) = (6, 5);
    let idx: Vec<i64> = vec![0, 6, -1, 5, 1000, i32::MIN as i64, 2, 0];
    for dtype in DType::FLOATS {
        let table = table_data(20, rows * dim);
        let tt = tensor_from_f64(e, &table, &[rows, dim], dtype);
        let it = index_tensor(&idx, &[8], DType::I32);
        let (y, saved) = embedding(&tt, &it, &unchecked()).unwrap();
        let want = reference::forward(&stored(&table, dtype), rows, dim, &idx);
        assert_close("y", &y.to_f64().unwrap(), &want, Tolerance::EXACT);
        let dy = Rng::new(21).vec(8 * dim, -1.0, 1.0);
        let dyt = tensor_from_f64(e, &dy, &[8, dim], DType::F32);
        let g = embedding_backward(&saved, &dyt).unwrap();
        let want = reference::backward(&stored(&dy, DType::F32), rows, dim, &idx, None);
        assert_close(
            "dtable",
            &g.to_f64().unwrap(),
            &want,
            Tolerance::for_dtype(DType::F32),
        );
    }
    // U32 indices past the table.
    let it = index_tensor(&[1, 7, u32::MAX as i64], &[3], DType::U32);
    let tt = tensor_from_f64(e, &[1.0; 6], &[3, 2], DType::F32);
    let (y, _) = embedding(&tt, &it, &unchecked()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
}

/// The GPU gradient against the reference, and bit for bit against a host f32 sum taken in
/// ascending position order (the documented order).
fn check_backward(label: &str, rows: usize, dim: usize, idx: &[i64], padding: Option<usize>) {
    let e = engine();
    let n = idx.len();
    let table = Rng::new(30).vec(rows * dim, -1.0, 1.0);
    let tt = tensor_from_f64(e, &table, &[rows, dim], DType::F32);
    let it = index_tensor(idx, &[n], DType::I32);
    let options = EmbeddingOptions {
        padding_index: padding,
        check_indices: true,
        ..EmbeddingOptions::default()
    };
    let (_, saved) = embedding(&tt, &it, &options).unwrap();
    for dtype in DType::FLOATS {
        let dy = stored(&Rng::new(31).vec(n * dim, -1.0, 1.0), dtype);
        let dyt = tensor_from_f64(e, &dy, &[n, dim], dtype);
        let g = embedding_backward(&saved, &dyt).unwrap();
        assert_eq!((g.dtype(), g.shape()), (DType::F32, &[rows, dim][..]));
        let want = reference::backward(&dy, rows, dim, idx, padding);
        // FP32 sums of up to `longest` terms of magnitude ≤ 1.
        let longest = (0..rows)
            .map(|r| idx.iter().filter(|&&v| v == r as i64).count())
            .max()
            .unwrap_or(0);
        let tol = Tolerance {
            abs: 1e-7 * longest as f64 + 1e-7,
            ..Tolerance::for_dtype(DType::F32)
        };
        let got = g.to_f64().unwrap();
        assert_close(&format!("{label} {dtype} dtable"), &got, &want, tol);
        let mut host = vec![0.0f32; rows * dim];
        for (p, &v) in idx.iter().enumerate() {
            if padding == Some(v as usize) {
                continue;
            }
            for c in 0..dim {
                host[v as usize * dim + c] += dy[p * dim + c] as f32;
            }
        }
        assert_eq!(
            f32_bits(&g),
            host.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{label} {dtype}: not the ascending-position f32 sum"
        );
    }
}

#[test]
fn backward_every_index_repeated() {
    let idx: Vec<i64> = (0..60).map(|p| (p * 7 % 10) as i64).collect();
    check_backward("repeated", 10, 6, &idx, None);
}

#[test]
fn backward_all_positions_one_index() {
    let idx = vec![3i64; 777];
    check_backward("one index", 5, 9, &idx, None);
    check_backward("one index D=12", 5, 12, &idx, None);
}

#[test]
fn backward_padding_row_gets_no_gradient() {
    let idx: Vec<i64> = (0..40).map(|p| (p % 4) as i64).collect();
    check_backward("padding", 6, 7, &idx, Some(2));
    let e = engine();
    let tt = tensor_from_f64(e, &[2.0, 3.0, 4.0, 5.0], &[2, 2], DType::F32);
    let it = index_tensor(&[1, 0, 1], &[3], DType::I32);
    let (y, saved) = embedding(
        &tt,
        &it,
        &EmbeddingOptions {
            padding_index: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    // The forward still gathers the padding row.
    assert_eq!(y.to_vec::<f32>().unwrap(), [4.0, 5.0, 2.0, 3.0, 4.0, 5.0]);
    let g =
        embedding_backward(&saved, &tensor_from_f64(e, &[1.0; 6], &[3, 2], DType::F32)).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), [1.0, 1.0, 0.0, 0.0]);
}

#[test]
fn backward_single_row_table() {
    check_backward("V=1", 1, 3, &[0, 0, 0, 0, 0], None);
    check_backward("V=1 N=1", 1, 1, &[0], None);
}

#[test]
fn backward_long_sorts_with_global_merge_steps() {
    // 3,001 positions: 4,096 padded keys, so merge level 4,096 runs a global step; a skewed
    // distribution (a third of the positions on row 0) and unused rows.
    let mut rng = Rng::new(40);
    let idx: Vec<i64> = (0..3001)
        .map(|p| {
            if p % 3 == 0 {
                0
            } else {
                i64::from(rng.next_u32() % 700)
            }
        })
        .collect();
    check_backward("N=3001", 1000, 5, &idx, Some(7));
    // A sorted and a reverse-sorted index list, just past one local block; widths that take
    // the four-column path.
    let up: Vec<i64> = (0..2049).map(|p| (p / 3) as i64).collect();
    check_backward("ascending", 700, 3, &up, None);
    check_backward("ascending D=8", 700, 8, &up, None);
    let down: Vec<i64> = up.iter().rev().copied().collect();
    check_backward("descending", 700, 4, &down, None);
}

#[test]
fn odd_widths_of_16_bit_tables_and_cotangents() {
    let e = engine();
    for dtype in [DType::F16, DType::BF16] {
        for (rows, dim, n) in [(3usize, 1usize, 5usize), (4, 3, 7), (5, 7, 3)] {
            let table = table_data(50, rows * dim);
            let tt = tensor_from_f64(e, &table, &[rows, dim], dtype);
            let idx: Vec<i64> = (0..n).map(|p| ((p * 2 + 1) % rows) as i64).collect();
            let it = index_tensor(&idx, &[n], DType::U32);
            let (y, saved) = embedding(&tt, &it, &EmbeddingOptions::default()).unwrap();
            let tb = bits(&tt);
            let want: Vec<u32> = idx
                .iter()
                .flat_map(|&r| tb[r as usize * dim..(r as usize + 1) * dim].to_vec())
                .collect();
            assert_eq!(bits(&y), want, "{dtype} {rows}x{dim} n={n}");
            let dy = stored(&Rng::new(51).vec(n * dim, -1.0, 1.0), dtype);
            let g = embedding_backward(&saved, &tensor_from_f64(e, &dy, &[n, dim], dtype)).unwrap();
            assert_close(
                &format!("{dtype} {rows}x{dim} dtable"),
                &g.to_f64().unwrap(),
                &reference::backward(&dy, rows, dim, &idx, None),
                Tolerance::for_dtype(DType::F32),
            );
        }
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    let (rows, dim) = (6, 4);
    let idx: Vec<i64> = vec![0, 5, 2, 2, 7, 5, 5, -1, 3];
    let dy = Rng::new(60).vec(idx.len() * dim, -1.0, 1.0);
    let table = Rng::new(61).vec(rows * dim, -1.0, 1.0);
    for padding in [None, Some(5)] {
        let analytic = reference::backward(&dy, rows, dim, &idx, padding);
        // With padding, the padding row's entries are treated as constants: the forward
        // used here zeroes their effect so that finite differences see no dependence.
        let c = check_vjp(
            |t| {
                let mut t = t.to_vec();
                if let Some(pad) = padding {
                    for c in 0..dim {
                        t[pad * dim + c] = table[pad * dim + c];
                    }
                }
                reference::forward(&t, rows, dim, &idx)
            },
            &table,
            &dy,
            &analytic,
        );
        assert!(c.passed, "padding {padding:?}: {c}");
    }
}

#[test]
fn empty_and_scalar_index_tensors() {
    let e = engine();
    let tt = tensor_from_f64(e, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], DType::BF16);
    for shape in [vec![0usize], vec![2, 0]] {
        let it = Tensor::from_slice(e, &[] as &[i32], &shape).unwrap();
        let (y, saved) = embedding(&tt, &it, &EmbeddingOptions::default()).unwrap();
        let mut want = shape.clone();
        want.push(2);
        assert_eq!(y.shape(), want.as_slice());
        assert_eq!(y.len(), 0);
        let dy = Tensor::zeros(e, &want, DType::F32).unwrap();
        let g = embedding_backward(&saved, &dy).unwrap();
        assert_eq!(g.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    }
    assert_eq!(embedding_workspace_bytes(3, 0), 0);
    // 0-D indices: one position, output [D].
    let it = Tensor::from_slice(e, &[2u32], &[]).unwrap();
    let (y, saved) = embedding(&tt, &it, &EmbeddingOptions::default()).unwrap();
    assert_eq!(y.shape(), &[2]);
    assert_eq!(y.to_f64().unwrap(), [5.0, 6.0]);
    let g =
        embedding_backward(&saved, &tensor_from_f64(e, &[1.0, -1.0], &[2], DType::F16)).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), [0.0, 0.0, 0.0, 0.0, 1.0, -1.0]);
    // Zero-width table.
    let tz = Tensor::zeros(e, &[3, 0], DType::F32).unwrap();
    let it = Tensor::from_slice(e, &[0i32, 2], &[2]).unwrap();
    let (y, saved) = embedding(&tz, &it, &EmbeddingOptions::default()).unwrap();
    assert_eq!(y.shape(), &[2, 0]);
    let g = embedding_backward(&saved, &Tensor::zeros(e, &[2, 0], DType::F32).unwrap()).unwrap();
    assert_eq!(g.shape(), &[3, 0]);
}

#[test]
fn reruns_are_bit_identical() {
    let e = engine();
    let (rows, dim, n) = (300, 17, 2000);
    let mut rng = Rng::new(70);
    let idx: Vec<i64> = (0..n).map(|_| i64::from(rng.next_u32() % 50)).collect();
    let tt = tensor_from_f64(e, &table_data(71, rows * dim), &[rows, dim], DType::BF16);
    let it = index_tensor(&idx, &[n], DType::I32);
    let dyt = tensor_from_f64(
        e,
        &Rng::new(72).vec(n * dim, -1.0, 1.0),
        &[n, dim],
        DType::F32,
    );
    let run = || {
        let (y, saved) = embedding(&tt, &it, &EmbeddingOptions::default()).unwrap();
        (
            bits(&y),
            f32_bits(&embedding_backward(&saved, &dyt).unwrap()),
        )
    };
    assert_eq!(run(), run());
}

#[test]
fn workspace_is_the_padded_key_list_and_run_starts() {
    assert_eq!(embedding_workspace_bytes(4, 1), 8 * 2048 + 16);
    assert_eq!(embedding_workspace_bytes(4, 2048), 8 * 2048 + 16);
    assert_eq!(embedding_workspace_bytes(4, 2049), 8 * 4096 + 16);
    assert_eq!(
        embedding_workspace_bytes(128_256, 16_384),
        8 * 16_384 + 4 * 128_256
    );
    let e = common::private_engine();
    let tt = Tensor::zeros(&e, &[4, 2], DType::F32).unwrap();
    let it = Tensor::from_slice(&e, &vec![1i32; 2100], &[2100]).unwrap();
    let (_, saved) = embedding(&tt, &it, &EmbeddingOptions::default()).unwrap();
    let dy = Tensor::zeros(&e, &[2100, 2], DType::F32).unwrap();
    e.set_workspace_bound(8 * 4096 + 15);
    assert_eq!(
        embedding_backward(&saved, &dy).unwrap_err(),
        Error::WorkspaceExceeded {
            what: "embedding_backward".into(),
            needed: 8 * 4096 + 16,
            bound: 8 * 4096 + 15
        }
    );
    e.set_workspace_bound(8 * 4096 + 16);
    assert!(embedding_backward(&saved, &dy).is_ok());
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let table = Tensor::zeros(e, &[4, 3], DType::F32).unwrap();
    let idx = Tensor::from_slice(e, &[0i32, 3], &[2]).unwrap();
    let d = EmbeddingOptions::default();
    // Table not 2-D.
    for shape in [vec![12usize], vec![2, 2, 3], vec![]] {
        let t = Tensor::zeros(e, &shape, DType::F32).unwrap();
        assert!(
            matches!(embedding(&t, &idx, &d), Err(Error::ShapeMismatch { .. })),
            "{shape:?}"
        );
    }
    // Integer table, float indices.
    let it = Tensor::zeros(e, &[4, 3], DType::I32).unwrap();
    assert!(matches!(
        embedding(&it, &idx, &d),
        Err(Error::UnsupportedDType { .. })
    ));
    for dtype in DType::FLOATS {
        let fi = Tensor::zeros(e, &[2], dtype).unwrap();
        assert_eq!(
            embedding(&table, &fi, &d).unwrap_err(),
            Error::UnsupportedDType {
                what: "embedding: indices".into(),
                got: dtype,
                accepted: vec![DType::I32, DType::U32]
            }
        );
    }
    // Padding index past the table.
    assert_eq!(
        embedding(
            &table,
            &idx,
            &EmbeddingOptions {
                padding_index: Some(4),
                ..d
            }
        )
        .unwrap_err(),
        Error::OutOfBounds {
            what: "embedding: padding_index".into(),
            got: 4,
            min: 0,
            max: 3
        }
    );
    // Checked indices: too large, negative.
    let big = Tensor::from_slice(e, &[0u32, 4], &[2]).unwrap();
    assert_eq!(
        embedding(&table, &big, &d).unwrap_err(),
        Error::OutOfBounds {
            what: "embedding: indices[1]".into(),
            got: 4,
            min: 0,
            max: 3
        }
    );
    let neg = Tensor::from_slice(e, &[1i32, 2, -3], &[3]).unwrap();
    assert!(matches!(
        embedding(&table, &neg, &d),
        Err(Error::InvalidValue { got, .. }) if got == -3.0
    ));
    // A zero-row table accepts no index (checked), gathers zeros unchecked.
    let empty = Tensor::zeros(e, &[0, 3], DType::F32).unwrap();
    assert!(matches!(
        embedding(&empty, &idx, &d),
        Err(Error::OutOfBounds { .. })
    ));
    let (y, _) = embedding(&empty, &idx, &unchecked()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    // Cotangent of the wrong shape or dtype.
    let (_, saved) = embedding(&table, &idx, &d).unwrap();
    let dy = Tensor::zeros(e, &[2, 4], DType::F32).unwrap();
    assert_eq!(
        embedding_backward(&saved, &dy).unwrap_err(),
        Error::ShapeMismatch {
            what: "embedding_backward: dy".into(),
            expected: vec![2, 3],
            got: vec![2, 4]
        }
    );
    let dy = Tensor::zeros(e, &[2, 3], DType::U32).unwrap();
    assert!(matches!(
        embedding_backward(&saved, &dy),
        Err(Error::UnsupportedDType { .. })
    ));
    // Tensors of another engine.
    let other = common::private_engine();
    let oi = Tensor::from_slice(&other, &[0i32], &[1]).unwrap();
    assert!(matches!(
        embedding(&table, &oi, &d),
        Err(Error::EngineMismatch { .. })
    ));
    let ody = Tensor::zeros(&other, &[2, 3], DType::F32).unwrap();
    assert!(matches!(
        embedding_backward(&saved, &ody),
        Err(Error::EngineMismatch { .. })
    ));
}

// ---- max_norm and scale_grad_by_freq ------------------------------------------------------

/// A table whose row norms are `factor·max_norm` with factors cycling through 0.3, 0.6, 1.5
/// and 3 (well away from the threshold, whatever the storage rounding).
fn table_with_norms(seed: u64, rows: usize, dim: usize, max_norm: f64) -> Vec<f64> {
    let mut v = Rng::new(seed).vec(rows * dim, -1.0, 1.0);
    for r in 0..rows {
        let row = &mut v[r * dim..(r + 1) * dim];
        let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
        let factor = [0.3, 0.6, 1.5, 3.0][r % 4];
        for x in row.iter_mut() {
            *x *= factor * max_norm / norm;
        }
    }
    v
}

#[test]
fn max_norm_renormalizes_looked_up_rows_and_the_table_copy() {
    let e = engine();
    let (rows, max_norm) = (40usize, 2.0f32);
    let mn = f64::from(max_norm);
    // Repeats, unreferenced rows (30..40), the padding row 3 referenced.
    let idx: Vec<i64> = (0..90).map(|p| ((p * 7) % 30) as i64).collect();
    let shape = [9usize, 10];
    let options = EmbeddingOptions {
        padding_index: Some(3),
        max_norm: Some(max_norm),
        ..EmbeddingOptions::default()
    };
    for (k, dtype) in DType::FLOATS.into_iter().enumerate() {
        for dim in [37usize, 64] {
            let label = format!("{dtype} {rows}x{dim}");
            let table = table_with_norms(600 + k as u64, rows, dim, mn);
            let ts = stored(&table, dtype);
            let tt = tensor_from_f64(e, &table, &[rows, dim], dtype);
            let idtype = if k % 2 == 0 { DType::I32 } else { DType::U32 };
            let it = index_tensor(&idx, &shape, idtype);
            let (y, saved) = embedding(&tt, &it, &options).unwrap();
            assert_eq!(y.shape(), &[9, 10, dim]);
            assert_eq!(y.dtype(), dtype);
            let want = reference::forward_max_norm(&ts, rows, dim, &idx, mn, 2.0);
            assert_close(
                &format!("{label} y"),
                &y.to_f64().unwrap(),
                &want,
                Tolerance::for_dtype(dtype),
            );
            // Rows within max_norm are copied bit for bit.
            let table_bits = bits(&tt);
            let y_bits = bits(&y);
            for (p, &v) in idx.iter().enumerate() {
                let v = v as usize;
                if v % 4 < 2 {
                    assert_eq!(
                        y_bits[p * dim..(p + 1) * dim],
                        table_bits[v * dim..(v + 1) * dim],
                        "{label}: row {v} copied"
                    );
                }
            }
            // The renormalized copy of the table.
            let renormed = embedding_renorm(&tt, &it, max_norm, 2.0, true).unwrap();
            assert_eq!(renormed.shape(), &[rows, dim]);
            assert_eq!(renormed.dtype(), dtype);
            assert_close(
                &format!("{label} renormalized table"),
                &renormed.to_f64().unwrap(),
                &reference::renorm(&ts, rows, dim, &idx, mn, 2.0),
                Tolerance::for_dtype(dtype),
            );
            // Gathering from the renormalized table gives the same rows (PyTorch's result).
            let (y2, _) = embedding(&renormed, &it, &EmbeddingOptions::default()).unwrap();
            assert_eq!(
                bits(&y2),
                y_bits,
                "{label}: gather of the renormalized table"
            );
            // The gradient is the plain gather's (with respect to the looked-up rows).
            let dyt = tensor_from_f64(
                e,
                &Rng::new(610).vec(90 * dim, -1.0, 1.0),
                &[9, 10, dim],
                DType::F32,
            );
            let plain = EmbeddingOptions {
                max_norm: None,
                ..options
            };
            let (_, saved_plain) = embedding(&tt, &it, &plain).unwrap();
            assert_eq!(
                f32_bits(&embedding_backward(&saved, &dyt).unwrap()),
                f32_bits(&embedding_backward(&saved_plain, &dyt).unwrap()),
                "{label}: max_norm gradient"
            );
            // Reruns: same bits.
            let (y3, _) = embedding(&tt, &it, &options).unwrap();
            assert_eq!(bits(&y3), y_bits, "{label}: rerun");
            let renormed2 = embedding_renorm(&tt, &it, max_norm, 2.0, true).unwrap();
            assert_eq!(bits(&renormed2), bits(&renormed), "{label}: renorm rerun");
        }
    }
}

#[test]
fn max_norm_with_out_of_range_and_empty_indices() {
    let e = engine();
    let (rows, dim, max_norm) = (6usize, 5usize, 1.0f32);
    let table = table_with_norms(620, rows, dim, 1.0);
    let tt = tensor_from_f64(e, &table, &[rows, dim], DType::F32);
    // Unchecked out-of-range positions gather zeros and reference no row.
    let idx = [2i64, 9, 3, -1];
    let it = index_tensor(&idx, &[4], DType::I32);
    let options = EmbeddingOptions {
        max_norm: Some(max_norm),
        ..unchecked()
    };
    let (y, _) = embedding(&tt, &it, &options).unwrap();
    assert_close(
        "out of range y",
        &y.to_f64().unwrap(),
        &reference::forward_max_norm(&table, rows, dim, &idx, 1.0, 2.0),
        Tolerance::for_dtype(DType::F32),
    );
    let renormed = embedding_renorm(&tt, &it, max_norm, 2.0, false).unwrap();
    assert_close(
        "out of range renorm",
        &renormed.to_f64().unwrap(),
        &reference::renorm(&table, rows, dim, &idx, 1.0, 2.0),
        Tolerance::for_dtype(DType::F32),
    );
    // Checked: the same typed error as the forward.
    assert!(matches!(
        embedding_renorm(&tt, &it, max_norm, 2.0, true),
        Err(Error::OutOfBounds { .. })
    ));
    // No positions: an empty output; the table copied unchanged.
    let empty = Tensor::from_slice(e, &[] as &[i32], &[0]).unwrap();
    let (y, _) = embedding(&tt, &empty, &options).unwrap();
    assert_eq!(y.shape(), &[0, dim]);
    let copy = embedding_renorm(&tt, &empty, max_norm, 2.0, true).unwrap();
    assert_eq!(f32_bits(&copy), f32_bits(&tt));
}

/// A table whose rows' `p`-norms are `factor·max_norm`, factors cycling through 0.3, 0.6, 1.5
/// and 3 (away from the threshold whatever the storage rounding).
fn table_with_p_norms(seed: u64, rows: usize, dim: usize, max_norm: f64, p: f64) -> Vec<f64> {
    let mut v = Rng::new(seed).vec(rows * dim, -1.0, 1.0);
    for r in 0..rows {
        let row = &mut v[r * dim..(r + 1) * dim];
        let norm = reference::p_norm(row, p);
        let factor = [0.3, 0.6, 1.5, 3.0][r % 4];
        for x in row.iter_mut() {
            *x *= factor * max_norm / norm;
        }
    }
    v
}

#[test]
fn max_norm_with_other_norm_types() {
    let e = engine();
    let (rows, max_norm) = (24usize, 1.5f32);
    let mn = f64::from(max_norm);
    // Repeats, unreferenced rows 20..24, a zero row (row 1: norm 0 for every p).
    let idx: Vec<i64> = (0..60).map(|p| ((p * 7) % 20) as i64).collect();
    for (k, p) in [1.0f32, 3.0, 0.5, 2.5, f32::INFINITY]
        .into_iter()
        .enumerate()
    {
        let options = EmbeddingOptions {
            max_norm: Some(max_norm),
            norm_type: p,
            ..EmbeddingOptions::default()
        };
        for dtype in DType::FLOATS {
            for dim in [7usize, 300] {
                let label = format!("p {p} {dtype} {rows}x{dim}");
                let mut table = table_with_p_norms(650 + k as u64, rows, dim, mn, f64::from(p));
                table[dim..2 * dim].fill(0.0);
                let ts = stored(&table, dtype);
                let tt = tensor_from_f64(e, &table, &[rows, dim], dtype);
                let it = index_tensor(&idx, &[60], DType::I32);
                let (y, _) = embedding(&tt, &it, &options).unwrap();
                let want = reference::forward_max_norm(&ts, rows, dim, &idx, mn, f64::from(p));
                assert_close(
                    &format!("{label} y"),
                    &y.to_f64().unwrap(),
                    &want,
                    Tolerance::for_dtype(dtype),
                );
                // The factor matters: rows over the bound differ from the plain gather.
                let plain = reference::forward(&ts, rows, dim, &idx);
                assert!(
                    want.iter()
                        .zip(&plain)
                        .any(|(a, b)| *b != 0.0 && (a - b).abs() > 0.2 * b.abs()),
                    "{label}: some rows renormalized"
                );
                let renormed = embedding_renorm(&tt, &it, max_norm, p, true).unwrap();
                assert_close(
                    &format!("{label} renormalized table"),
                    &renormed.to_f64().unwrap(),
                    &reference::renorm(&ts, rows, dim, &idx, mn, f64::from(p)),
                    Tolerance::for_dtype(dtype),
                );
                let (y2, _) = embedding(&tt, &it, &options).unwrap();
                assert_eq!(bits(&y2), bits(&y), "{label}: rerun");
            }
        }
    }
}

#[test]
fn scale_grad_by_freq_divides_each_row_by_its_count() {
    let e = engine();
    let rows = 12usize;
    // Row 5 on a third of the positions, the padding row 2 referenced, rows 10 and 11 never.
    let idx: Vec<i64> = (0..300)
        .map(|p| if p % 3 == 0 { 5 } else { ((p * 7) % 10) as i64 })
        .collect();
    let n = idx.len();
    let options = EmbeddingOptions {
        padding_index: Some(2),
        scale_grad_by_freq: true,
        ..EmbeddingOptions::default()
    };
    for dim in [5usize, 8] {
        let tt = tensor_from_f64(
            e,
            &Rng::new(630).vec(rows * dim, -1.0, 1.0),
            &[rows, dim],
            DType::F32,
        );
        let it = index_tensor(&idx, &[n], DType::I32);
        let (_, saved) = embedding(&tt, &it, &options).unwrap();
        assert!(saved.scale_grad_by_freq());
        let longest = idx.iter().filter(|&&v| v == 5).count();
        for dtype in DType::FLOATS {
            let dy = stored(&Rng::new(631).vec(n * dim, -1.0, 1.0), dtype);
            let dyt = tensor_from_f64(e, &dy, &[n, dim], dtype);
            let g = embedding_backward(&saved, &dyt).unwrap();
            let label = format!("D{dim} dy {dtype}");
            assert_close(
                &format!("{label} dtable"),
                &g.to_f64().unwrap(),
                &reference::backward_scaled_by_freq(&dy, rows, dim, &idx, Some(2)),
                Tolerance {
                    abs: 1e-7 * longest as f64 + 1e-7,
                    ..Tolerance::for_dtype(DType::F32)
                },
            );
            // Bit for bit: the f32 sum in ascending position order, divided once by the count.
            let mut want = vec![0.0f32; rows * dim];
            let mut counts = vec![0u32; rows];
            for (p, &v) in idx.iter().enumerate() {
                let v = v as usize;
                counts[v] += 1;
                if v == 2 {
                    continue;
                }
                for c in 0..dim {
                    want[v * dim + c] += dy[p * dim + c] as f32;
                }
            }
            for v in 0..rows {
                if counts[v] > 0 {
                    for c in 0..dim {
                        want[v * dim + c] /= counts[v] as f32;
                    }
                }
            }
            let want_bits: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
            assert_eq!(f32_bits(&g), want_bits, "{label}: host f32 order");
            let g2 = embedding_backward(&saved, &dyt).unwrap();
            assert_eq!(f32_bits(&g2), want_bits, "{label}: rerun");
        }
    }
}

#[test]
fn max_norm_bad_inputs_and_workspace() {
    let e = engine();
    let table = Tensor::zeros(e, &[4, 3], DType::F32).unwrap();
    let idx = Tensor::from_slice(e, &[0i32, 3], &[2]).unwrap();
    for m in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let o = EmbeddingOptions {
            max_norm: Some(m),
            ..EmbeddingOptions::default()
        };
        assert!(
            matches!(embedding(&table, &idx, &o), Err(Error::InvalidValue { .. })),
            "max_norm {m}"
        );
        assert!(
            matches!(
                embedding_renorm(&table, &idx, m, 2.0, true),
                Err(Error::InvalidValue { .. })
            ),
            "renorm max_norm {m}"
        );
    }
    for q in [0.0f32, -2.0, f32::NAN, f32::NEG_INFINITY] {
        let o = EmbeddingOptions {
            max_norm: Some(1.0),
            norm_type: q,
            ..EmbeddingOptions::default()
        };
        assert!(
            matches!(embedding(&table, &idx, &o), Err(Error::InvalidValue { .. })),
            "norm_type {q}"
        );
        assert!(
            matches!(
                embedding_renorm(&table, &idx, 1.0, q, true),
                Err(Error::InvalidValue { .. })
            ),
            "renorm norm_type {q}"
        );
    }
    // Without max_norm the norm type is not used (and not checked).
    let unused = EmbeddingOptions {
        norm_type: -1.0,
        ..EmbeddingOptions::default()
    };
    assert!(embedding(&table, &idx, &unused).is_ok());
    // embedding_renorm takes the forward's table and index checks.
    let t1 = Tensor::zeros(e, &[12], DType::F32).unwrap();
    assert!(matches!(
        embedding_renorm(&t1, &idx, 1.0, 2.0, true),
        Err(Error::ShapeMismatch { .. })
    ));
    let fi = Tensor::zeros(e, &[2], DType::F32).unwrap();
    assert!(matches!(
        embedding_renorm(&table, &fi, 1.0, 2.0, true),
        Err(Error::UnsupportedDType { .. })
    ));
    let other = common::private_engine();
    let oi = Tensor::from_slice(&other, &[0i32], &[1]).unwrap();
    assert!(matches!(
        embedding_renorm(&table, &oi, 1.0, 2.0, true),
        Err(Error::EngineMismatch { .. })
    ));
    // Scratch: one scale per position (forward), keys + starts + scales (renorm).
    assert_eq!(embedding_max_norm_workspace_bytes(10), 40);
    assert_eq!(
        embedding_renorm_workspace_bytes(4, 2),
        embedding_workspace_bytes(4, 2) + 16
    );
    assert_eq!(embedding_renorm_workspace_bytes(4, 0), 0);
    let p = common::private_engine();
    let pt = Tensor::zeros(&p, &[4, 3], DType::F32).unwrap();
    let pi = Tensor::from_slice(&p, &[0i32, 3], &[2]).unwrap();
    p.set_workspace_bound(embedding_renorm_workspace_bytes(4, 2) - 1);
    assert!(matches!(
        embedding_renorm(&pt, &pi, 1.0, 2.0, true),
        Err(Error::WorkspaceExceeded { .. })
    ));
    p.set_workspace_bound(7);
    let o = EmbeddingOptions {
        max_norm: Some(1.0),
        ..EmbeddingOptions::default()
    };
    assert!(matches!(
        embedding(&pt, &pi, &o),
        Err(Error::WorkspaceExceeded { .. })
    ));
}

/// `div_rn` of `wgsl/common/dtype.wgsl` in host FP32 arithmetic (no fused operation), with each
/// division `div` standing in for a GPU's, which need not round correctly.
fn div_rn(a: f32, n: f32, div: &mut dyn FnMut(f32, f32) -> f32) -> f32 {
    let split12 = |x: f32| {
        let t = x * 4097.0;
        let hi = t - (t - x);
        (hi, x - hi)
    };
    let residual = |a: f32, q: f32| {
        let p = q * n;
        let (qh, ql) = split12(q);
        let (nh, nl) = split12(n);
        let e = ((qh * nh - p) + qh * nl + ql * nh) + ql * nl;
        (a - p) - e
    };
    let q0 = div(a, n);
    if !(2f32.powi(-76)..2f32.powi(100)).contains(&a.abs()) {
        return q0;
    }
    let q1 = q0 + div(residual(a, q0), n);
    let r = residual(a, q1);
    let b = q1.to_bits();
    let q2 = f32::from_bits(if (r > 0.0) == (q1 > 0.0) {
        b + 1
    } else {
        b - 1
    });
    if r.abs() > (q2 - q1).abs() * 0.5 * n {
        q2
    } else {
        q1
    }
}

#[test]
fn scale_grad_division_rounds_to_nearest_even() {
    // The kernel's division by a position count, simulated with divisions off by up to 3 units
    // of the last place (Vulkan allows 2.5), against the host's correctly rounded one: counts
    // 1..16, 1..1000 and up to 2^24, sums of magnitude 2^-76..2^100 of either sign.
    let mut rng = Rng::new(0xd1f);
    let mut off = Rng::new(0x0ff);
    let mut sloppy = |a: f32, n: f32| {
        let q = a / n;
        let k = (off.next_u32() % 7) as i32 - 3;
        if q == 0.0 || !q.is_finite() {
            q
        } else {
            f32::from_bits(q.to_bits().wrapping_add_signed(k))
        }
    };
    for i in 0..2_000_000u32 {
        let e = 51 + rng.next_u32() % 176;
        let a = f32::from_bits(rng.next_u32() & 0x807f_ffff | e << 23);
        let n = match i % 3 {
            0 => 1 + rng.next_u32() % 16,
            1 => 1 + rng.next_u32() % 1000,
            _ => 1 + rng.next_u32() % (1 << 24),
        } as f32;
        let got = div_rn(a, n, &mut sloppy);
        assert_eq!(got.to_bits(), (a / n).to_bits(), "{a:e} / {n}");
    }
}
