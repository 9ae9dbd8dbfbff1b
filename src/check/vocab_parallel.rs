//! Checks of vocabulary-parallel cross-entropy (`crate::vocab_parallel`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "vocab_parallel_cross_entropy",
        kernels: &["vocab_parallel", "reduce"],
        run: check_vocab_parallel,
    }]
}

/// The mean loss and every shard's gradient against the plain cross-entropy of the joined
/// logits (f64), in every logits dtype: 37 rows (every fifth ignored) over shards of widths 7,
/// 300 and 33.
fn check_vocab_parallel(engine: &Engine) -> Result<Vec<Case>> {
    use crate::loss::Reduction;
    use crate::vocab_parallel::{
        VocabParallelOptions, vocab_parallel_cross_entropy, vocab_parallel_cross_entropy_backward,
    };
    let (rows, widths) = (37, [7, 300, 33]);
    let vocab: usize = widths.iter().sum();
    let mut rng = Rng::new(51);
    let targets: Vec<i32> = (0..rows)
        .map(|r| {
            if r % 5 == 3 {
                -100
            } else {
                (rng.next_u32() as usize % vocab) as i32
            }
        })
        .collect();
    let t = crate::Tensor::from_slice(engine, &targets, &[rows])?;
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let mut x = Vec::new();
        let mut xs = Vec::new();
        for w in widths {
            let (s, v) = tensor_from_f64(engine, &rng.vec(rows * w, -4.0, 4.0), &[rows, w], dtype)?;
            x.push(s);
            xs.push(v);
        }
        let refs: Vec<&crate::Tensor> = x.iter().collect();
        let slices: Vec<&[f64]> = xs.iter().map(Vec::as_slice).collect();
        let o = VocabParallelOptions::default();
        let (loss, saved) = vocab_parallel_cross_entropy(&refs, &t, &o)?;
        let dl = crate::Tensor::from_slice(engine, &[1.25f32], &[])?;
        let grads = vocab_parallel_cross_entropy_backward(&saved, &refs, &dl)?;
        use reference::vocab_parallel as r;
        let want = r::forward(&slices, &widths, &targets, -100, Reduction::Mean);
        let want_g = r::backward(&slices, &widths, &targets, -100, Reduction::Mean, &[1.25]);
        let tol = Tolerance::for_dtype(DType::F32).scaled(4.0);
        cases.push(case(
            format!("loss {dtype} {rows} rows, V {vocab} in 3 shards"),
            &loss.to_f64()?,
            &want,
            tol,
        ));
        for (k, (g, w)) in grads.iter().zip(&want_g).enumerate() {
            cases.push(case(format!("d shard {k} {dtype}"), &g.to_f64()?, w, tol));
        }
    }
    Ok(cases)
}
