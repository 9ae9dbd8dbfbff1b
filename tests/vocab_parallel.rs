//! Vocabulary-parallel cross-entropy (`wgrad::vocab_parallel`): the loss and every shard's
//! gradient against the f64 reference (the shards joined: plain cross-entropy) for each
//! reduction, logits dtype and cotangent dtype, shards of widths 0–300 and ignored rows; the
//! steps run across two engines (statistics and cotangents moved through the host) give the
//! one-engine bits; all-ignored means are 0 with zero gradients; an out-of-range target gives a
//! NaN loss; reruns are bit-identical; every bad input gives its typed error.

mod common;

use common::{Rng, assert_close, engine, expect_err, private_engine, value_bits};
use wgrad::gradcheck::{Tolerance, tensor_from_f64};
use wgrad::loss::Reduction;
use wgrad::reference::vocab_parallel as reference;
use wgrad::vocab_parallel::{
    VocabParallelOptions, combine_statistics, losses, row_cotangents, shard_backward,
    shard_statistics, vocab_parallel_cross_entropy, vocab_parallel_cross_entropy_backward,
};
use wgrad::{DType, Error, Tensor};

const WIDTHS: [usize; 5] = [7, 1, 300, 0, 33];

fn targets(rows: usize, vocab: usize, seed: u64) -> Vec<i32> {
    let mut rng = Rng::new(seed);
    (0..rows)
        .map(|r| {
            if r % 5 == 3 {
                -100
            } else {
                (rng.next_u32() as usize % vocab) as i32
            }
        })
        .collect()
}

fn shards(rows: usize, dtype: DType, seed: u64) -> (Vec<Tensor>, Vec<Vec<f64>>) {
    let mut rng = Rng::new(seed);
    WIDTHS
        .iter()
        .map(|&w| {
            tensor_from_f64(engine(), &rng.vec(rows * w, -4.0, 4.0), &[rows, w], dtype).unwrap()
        })
        .unzip()
}

#[test]
fn losses_and_gradients_match_the_reference() {
    let vocab: usize = WIDTHS.iter().sum();
    for rows in [1, 6, 37] {
        let t = targets(rows, vocab, rows as u64);
        let tt = Tensor::from_slice(engine(), &t, &[rows]).unwrap();
        for dtype in DType::FLOATS {
            let (x, xs) = shards(rows, dtype, 7 + rows as u64);
            let refs: Vec<&Tensor> = x.iter().collect();
            let slices: Vec<&[f64]> = xs.iter().map(Vec::as_slice).collect();
            for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
                let what = format!("rows {rows} {dtype:?} {reduction:?}");
                let o = VocabParallelOptions {
                    reduction,
                    ..Default::default()
                };
                let (loss, saved) = vocab_parallel_cross_entropy(&refs, &tt, &o).unwrap();
                let want = reference::forward(&slices, &WIDTHS, &t, -100, reduction);
                let tol = Tolerance::for_dtype(DType::F32).scaled(4.0);
                assert_close(
                    &format!("{what}: loss"),
                    &loss.to_f64().unwrap(),
                    &want,
                    tol,
                );
                for cot_dtype in [DType::F32, DType::BF16] {
                    let mut rng = Rng::new(3);
                    let n = if reduction == Reduction::None {
                        rows
                    } else {
                        1
                    };
                    let shape: &[usize] = if reduction == Reduction::None {
                        &[rows]
                    } else {
                        &[]
                    };
                    let (dl, dls) =
                        tensor_from_f64(engine(), &rng.vec(n, 0.5, 2.0), shape, cot_dtype).unwrap();
                    let grads = vocab_parallel_cross_entropy_backward(&saved, &refs, &dl).unwrap();
                    let want = reference::backward(&slices, &WIDTHS, &t, -100, reduction, &dls);
                    assert_eq!(grads.len(), WIDTHS.len());
                    for (k, (g, w)) in grads.iter().zip(&want).enumerate() {
                        assert_eq!(g.shape(), &[rows, WIDTHS[k]], "{what}");
                        assert_close(
                            &format!("{what}: shard {k} gradient"),
                            &g.to_f64().unwrap(),
                            w,
                            tol,
                        );
                    }
                    let again = vocab_parallel_cross_entropy_backward(&saved, &refs, &dl).unwrap();
                    for (a, b) in grads.iter().zip(&again) {
                        assert!(value_bits(a) == value_bits(b), "{what}: backward rerun");
                    }
                }
                let (again, _) = vocab_parallel_cross_entropy(&refs, &tt, &o).unwrap();
                assert!(
                    value_bits(&loss) == value_bits(&again),
                    "{what}: forward rerun"
                );
            }
        }
    }
}

/// Host copy of an F32 tensor onto another engine.
fn moved(t: &Tensor, to: &wgrad::Engine) -> Tensor {
    Tensor::from_slice(to, &t.to_vec::<f32>().unwrap(), t.shape()).unwrap()
}

#[test]
fn the_steps_across_two_engines_give_the_one_engine_bits() {
    let (a, b) = (engine(), &private_engine());
    let rows = 9;
    let vocab = 40;
    let t = targets(rows, vocab, 1);
    let mut rng = Rng::new(2);
    let x: Vec<f64> = rng.vec(rows * 25, -3.0, 3.0);
    let y: Vec<f64> = rng.vec(rows * 15, -3.0, 3.0);
    let on = |e, v: &[f64], w| tensor_from_f64(e, v, &[rows, w], DType::BF16).unwrap().0;
    let (xa, ya, yb) = (on(a, &x, 25), on(a, &y, 15), on(b, &y, 15));
    let (ta, tb) = (
        Tensor::from_slice(a, &t, &[rows]).unwrap(),
        Tensor::from_slice(b, &t, &[rows]).unwrap(),
    );
    let o = VocabParallelOptions::default();
    // One engine.
    let (loss, saved) = vocab_parallel_cross_entropy(&[&xa, &ya], &ta, &o).unwrap();
    let dl = Tensor::from_slice(a, &[1.5f32], &[]).unwrap();
    let grads = vocab_parallel_cross_entropy_backward(&saved, &[&xa, &ya], &dl).unwrap();
    // Shard 0 on engine a, shard 1 on engine b; only statistics and cotangents move.
    let s0 = shard_statistics(&xa, &ta, 0, -100).unwrap();
    let s1 = moved(&shard_statistics(&yb, &tb, 25, -100).unwrap(), a);
    let global = combine_statistics(&[&s0, &s1]).unwrap();
    let (loss2, saved2) = losses(&global, &ta, &o).unwrap();
    let g = row_cotangents(&saved2, &dl).unwrap();
    let d0 = shard_backward(&xa, &ta, 0, -100, &global, &g).unwrap();
    let d1 = shard_backward(&yb, &tb, 25, -100, &moved(&global, b), &moved(&g, b)).unwrap();
    assert!(value_bits(&loss) == value_bits(&loss2));
    assert!(value_bits(&grads[0]) == value_bits(&d0));
    assert!(value_bits(&grads[1]) == value_bits(&d1));
    assert!(value_bits(saved.statistics()) == value_bits(&global));
}

#[test]
fn ignored_and_out_of_range_targets() {
    let e = engine();
    let x = Tensor::from_slice(e, &[0.5f32; 12], &[3, 4]).unwrap();
    let all_ignored = Tensor::from_slice(e, &[-100i32; 3], &[3]).unwrap();
    let (loss, saved) =
        vocab_parallel_cross_entropy(&[&x], &all_ignored, &VocabParallelOptions::default())
            .unwrap();
    assert_eq!(loss.to_vec::<f32>().unwrap(), vec![0.0]);
    let dl = Tensor::from_slice(e, &[1.0f32], &[1]).unwrap();
    let g = vocab_parallel_cross_entropy_backward(&saved, &[&x], &dl).unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![0.0; 12]);
    let bad = Tensor::from_slice(e, &[0i32, 9, 1], &[3]).unwrap();
    let o = VocabParallelOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let (loss, _) = vocab_parallel_cross_entropy(&[&x], &bad, &o).unwrap();
    let l = loss.to_vec::<f32>().unwrap();
    assert!(
        l[0].is_finite() && l[1].is_nan() && l[2].is_finite(),
        "{l:?}"
    );
}

#[test]
fn bad_inputs_give_typed_errors() {
    let e = engine();
    let x = Tensor::zeros(e, &[3, 4], DType::F32).unwrap();
    let t = Tensor::from_slice(e, &[0i32; 3], &[3]).unwrap();
    let o = VocabParallelOptions::default();
    let shape = |e: &Error| matches!(e, Error::ShapeMismatch { .. });
    expect_err(
        "no shards",
        vocab_parallel_cross_entropy(&[], &t, &o),
        |e| matches!(e, Error::OutOfBounds { got: 0, .. }),
    );
    expect_err(
        "3-D logits",
        shard_statistics(
            &Tensor::zeros(e, &[3, 1, 4], DType::F32).unwrap(),
            &t,
            0,
            -100,
        ),
        shape,
    );
    expect_err(
        "targets length",
        shard_statistics(
            &x,
            &Tensor::from_slice(e, &[0i32; 2], &[2]).unwrap(),
            0,
            -100,
        ),
        shape,
    );
    expect_err(
        "float targets",
        shard_statistics(&x, &Tensor::zeros(e, &[3], DType::F32).unwrap(), 0, -100),
        |e| {
            matches!(
                e,
                Error::UnsupportedDType {
                    got: DType::F32,
                    ..
                }
            )
        },
    );
    expect_err(
        "offset past i32",
        shard_statistics(&x, &t, i32::MAX as usize, -100),
        |e| matches!(e, Error::OutOfBounds { .. }),
    );
    expect_err("no statistics", combine_statistics(&[]), |e| {
        matches!(e, Error::OutOfBounds { got: 0, .. })
    });
    expect_err(
        "statistics shape",
        combine_statistics(&[&Tensor::zeros(e, &[3, 3], DType::F32).unwrap()]),
        shape,
    );
    let s = shard_statistics(&x, &t, 0, -100).unwrap();
    expect_err(
        "rows differ",
        combine_statistics(&[&s, &Tensor::zeros(e, &[2, 4], DType::F32).unwrap()]),
        shape,
    );
    let (_, saved) = vocab_parallel_cross_entropy(&[&x], &t, &o).unwrap();
    expect_err(
        "cotangent shape",
        row_cotangents(&saved, &Tensor::zeros(e, &[3], DType::F32).unwrap()),
        shape,
    );
    let dl = Tensor::zeros(e, &[], DType::F32).unwrap();
    expect_err(
        "shard count",
        vocab_parallel_cross_entropy_backward(&saved, &[&x, &x], &dl),
        |e| matches!(e, Error::OutOfBounds { got: 2, .. }),
    );
    expect_err(
        "row cotangents shape",
        shard_backward(
            &x,
            &t,
            0,
            -100,
            saved.statistics(),
            &Tensor::zeros(e, &[2], DType::F32).unwrap(),
        ),
        shape,
    );
}
