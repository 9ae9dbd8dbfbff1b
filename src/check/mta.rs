//! Checks of multi-token attention (`crate::mta`).

use super::*;

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "multi_token_attention",
        kernels: &["mta"],
        run: check_multi_token_attention,
    }]
}

/// Multi-token attention's output and the gradients of the scores, weight and bias against the
/// f64 reference in every storage dtype: softmax over 2 × 4 heads of 16 × 16 scores into 4
/// channels by a 3 × 3 kernel with padding 1 (Liger's test shape), and sparsemax with 2 groups,
/// stride 2 and dilation 2.
fn check_multi_token_attention(engine: &Engine) -> Result<Vec<Case>> {
    use crate::mta::{MtaOptions, multi_token_attention, multi_token_attention_backward};
    use reference::mta::MtaConfig;
    let configs = [
        MtaConfig {
            batch: 2,
            c_in: 4,
            c_out: 4,
            side: 16,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
            sparse: false,
        },
        MtaConfig {
            batch: 1,
            c_in: 4,
            c_out: 2,
            side: 15,
            kernel: [3, 3],
            stride: [2, 2],
            padding: [2, 2],
            dilation: [2, 2],
            groups: 2,
            sparse: true,
        },
    ];
    let mut rng = Rng::new(31);
    let mut cases = Vec::new();
    for c in configs {
        let so = c.out_side(0);
        let shapes = [
            vec![c.batch, c.c_in, c.side, c.side],
            vec![c.c_out, c.c_in / c.groups, c.kernel[0], c.kernel[1]],
            vec![c.c_out],
            vec![c.batch, c.c_out, so, so],
        ];
        let options = MtaOptions {
            stride: c.stride,
            padding: c.padding,
            dilation: c.dilation,
            groups: c.groups,
            sparse: c.sparse,
        };
        let act = if c.sparse { "sparsemax" } else { "softmax" };
        for dtype in DType::FLOATS {
            let mut t = Vec::new();
            let mut v = Vec::new();
            for s in &shapes {
                let n = s.iter().product();
                let (x, stored) = tensor_from_f64(engine, &rng.vec(n, -2.0, 2.0), s, dtype)?;
                t.push(x);
                v.push(stored);
            }
            let (y, saved) = multi_token_attention(&t[0], &t[1], Some(&t[2]), &options)?;
            let g = multi_token_attention_backward(&saved, &t[3])?;
            let want = reference::mta::forward(&v[0], &v[1], Some(&v[2]), &c);
            let (ds, dw, db) = reference::mta::backward(&v[0], &v[1], &v[3], &c);
            let label = |name: &str| format!("{name} {act} {dtype} {:?}", shapes[0]);
            let out_tol = Tolerance::for_dtype(dtype).scaled(2.0);
            cases.push(case(label("y"), &y.to_f64()?, &want, out_tol));
            let tol = Tolerance::for_dtype(DType::F32).scaled(10.0);
            cases.push(case(label("d scores"), &g.scores.to_f64()?, &ds, tol));
            cases.push(case(label("d weight"), &g.weight.to_f64()?, &dw, tol));
            let gb = g
                .bias
                .as_ref()
                .map(Tensor::to_f64)
                .transpose()?
                .unwrap_or_default();
            cases.push(case(label("d bias"), &gb, &db, tol));
        }
    }
    Ok(cases)
}
