//! Checks of the embedding family (`crate::embedding`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![
        OperatorCheck {
            name: "embedding",
            kernels: &["embedding"],
            run: check_embedding,
        },
        OperatorCheck {
            name: "embedding_max_norm_freq",
            kernels: &["embedding"],
            run: check_embedding_max_norm_freq,
        },
    ]
}

/// Forward (exact copy of the rows) and table gradient against the f64 reference in every
/// storage dtype: V = 300, D = 37 (odd: element-wise kernels) and 64 (whole vec4 rows),
/// 1,500 positions `[30, 50]` with repeats (a third on one row), a padding row, I32 and U32
/// indices.
fn check_embedding(engine: &Engine) -> Result<Vec<Case>> {
    use crate::embedding::{EmbeddingOptions, embedding, embedding_backward};
    use reference::embedding as r;
    let (rows, shape) = (300usize, [30usize, 50usize]);
    let n = shape[0] * shape[1];
    let mut rng = Rng::new(5);
    let idx: Vec<i64> = (0..n)
        .map(|p| {
            if p % 3 == 0 {
                11
            } else {
                i64::from(rng.next_u32() % rows as u32)
            }
        })
        .collect();
    let options = EmbeddingOptions {
        padding_index: Some(4),
        check_indices: true,
        ..EmbeddingOptions::default()
    };
    let longest = (0..rows as i64)
        .map(|v| idx.iter().filter(|&&x| x == v).count())
        .max()
        .unwrap_or(0);
    let mut cases = Vec::new();
    for (dtype, dim) in DType::FLOATS
        .into_iter()
        .flat_map(|d| [(d, 37usize), (d, 64)])
    {
        let indices = if dtype == DType::F16 {
            let v: Vec<u32> = idx.iter().map(|&x| x as u32).collect();
            crate::Tensor::from_slice(engine, &v, &shape)?
        } else {
            let v: Vec<i32> = idx.iter().map(|&x| x as i32).collect();
            crate::Tensor::from_slice(engine, &v, &shape)?
        };
        let itype = indices.dtype();
        let (table, ts) =
            tensor_from_f64(engine, &rng.vec(rows * dim, -2.0, 2.0), &[rows, dim], dtype)?;
        let (dy, dys) = tensor_from_f64(engine, &rng.vec(n * dim, -1.0, 1.0), &[n, dim], dtype)?;
        let dy = dy.reshape(&[shape[0], shape[1], dim])?;
        let (y, saved) = embedding(&table, &indices, &options)?;
        let label = format!("{rows}x{dim} {dtype} indices {shape:?} {itype}");
        cases.push(case(
            format!("{label} y"),
            &y.to_f64()?,
            &r::forward(&ts, rows, dim, &idx),
            Tolerance::EXACT,
        ));
        let g = embedding_backward(&saved, &dy)?;
        // FP32 sums of up to `longest` terms of magnitude ≤ 1 (the reduction policy).
        let tol = Tolerance {
            abs: 1e-7 * longest as f64 + 1e-7,
            ..Tolerance::for_dtype(DType::F32)
        };
        cases.push(case(
            format!("{label} dtable"),
            &g.to_f64()?,
            &r::backward(&dys, rows, dim, &idx, options.padding_index),
            tol,
        ));
    }
    Ok(cases)
}

/// `max_norm` (2.0; row norms of 0.3 to 3 times it; L2, and norm types 1, 3 and ∞ for the
/// forward and the table copy) and `scale_grad_by_freq` in every storage dtype: V = 64, D = 37 and 64, 600 positions with repeats (a third on one row) and a
/// padding row: the renormalized rows, the renormalized table copy ([`embedding_renorm`]) and
/// the frequency-scaled table gradient against the f64 reference.
///
/// [`embedding_renorm`]: crate::embedding::embedding_renorm
fn check_embedding_max_norm_freq(engine: &Engine) -> Result<Vec<Case>> {
    use crate::embedding::{EmbeddingOptions, embedding, embedding_backward, embedding_renorm};
    use reference::embedding as r;
    let (rows, n, max_norm) = (64usize, 600usize, 2.0f32);
    let mut rng = Rng::new(6);
    let idx: Vec<i64> = (0..n)
        .map(|p| {
            if p % 3 == 0 {
                9
            } else {
                i64::from(rng.next_u32() % 48)
            }
        })
        .collect();
    let options = EmbeddingOptions {
        padding_index: Some(4),
        max_norm: Some(max_norm),
        scale_grad_by_freq: true,
        ..EmbeddingOptions::default()
    };
    let longest = idx.iter().filter(|&&x| x == 9).count();
    let v: Vec<i32> = idx.iter().map(|&x| x as i32).collect();
    let indices = crate::Tensor::from_slice(engine, &v, &[n])?;
    let mut cases = Vec::new();
    for (dtype, dim) in DType::FLOATS
        .into_iter()
        .flat_map(|d| [(d, 37usize), (d, 64)])
    {
        // Row norms 0.3, 0.6, 1.5, 3 times max_norm, far from the threshold.
        let mut values = rng.vec(rows * dim, -1.0, 1.0);
        for (k, row) in values.chunks_mut(dim).enumerate() {
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            let factor = [0.3, 0.6, 1.5, 3.0][k % 4] * f64::from(max_norm) / norm;
            row.iter_mut().for_each(|x| *x *= factor);
        }
        let (table, ts) = tensor_from_f64(engine, &values, &[rows, dim], dtype)?;
        let (dy, dys) = tensor_from_f64(engine, &rng.vec(n * dim, -1.0, 1.0), &[n, dim], dtype)?;
        let (y, saved) = embedding(&table, &indices, &options)?;
        let label = format!("{rows}x{dim} {dtype} max_norm 2 freq");
        let mn = f64::from(max_norm);
        cases.push(case(
            format!("{label} y"),
            &y.to_f64()?,
            &r::forward_max_norm(&ts, rows, dim, &idx, mn, 2.0),
            Tolerance::for_dtype(dtype),
        ));
        let renormed = embedding_renorm(&table, &indices, max_norm, 2.0, true)?;
        cases.push(case(
            format!("{label} renormalized table"),
            &renormed.to_f64()?,
            &r::renorm(&ts, rows, dim, &idx, mn, 2.0),
            Tolerance::for_dtype(dtype),
        ));
        let g = embedding_backward(&saved, &dy)?;
        cases.push(case(
            format!("{label} dtable"),
            &g.to_f64()?,
            &r::backward_scaled_by_freq(&dys, rows, dim, &idx, options.padding_index),
            Tolerance {
                abs: 1e-7 * longest as f64 + 1e-7,
                ..Tolerance::for_dtype(DType::F32)
            },
        ));
    }
    // Other norm types (PyTorch's `norm_type`): 1, 3 and ∞, rows scaled by their p-norm.
    for (p, dtype) in [
        (1.0f32, DType::F32),
        (3.0, DType::BF16),
        (f32::INFINITY, DType::F16),
    ] {
        let dim = 64usize;
        let pf = f64::from(p);
        let mut values = rng.vec(rows * dim, -1.0, 1.0);
        for (k, row) in values.chunks_mut(dim).enumerate() {
            let factor = [0.3, 0.6, 1.5, 3.0][k % 4] * f64::from(max_norm) / r::p_norm(row, pf);
            row.iter_mut().for_each(|x| *x *= factor);
        }
        let (table, ts) = tensor_from_f64(engine, &values, &[rows, dim], dtype)?;
        let o = EmbeddingOptions {
            norm_type: p,
            ..options
        };
        let (y, _) = embedding(&table, &indices, &o)?;
        let mn = f64::from(max_norm);
        cases.push(case(
            format!("{rows}x{dim} {dtype} max_norm 2 norm_type {p} y"),
            &y.to_f64()?,
            &r::forward_max_norm(&ts, rows, dim, &idx, mn, pf),
            Tolerance::for_dtype(dtype),
        ));
        let renormed = embedding_renorm(&table, &indices, max_norm, p, true)?;
        cases.push(case(
            format!("{rows}x{dim} {dtype} max_norm 2 norm_type {p} renormalized table"),
            &renormed.to_f64()?,
            &r::renorm(&ts, rows, dim, &idx, mn, pf),
            Tolerance::for_dtype(dtype),
        ));
    }
    Ok(cases)
}
