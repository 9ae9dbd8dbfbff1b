//! Checks of expression VJPs (`crate::expr`).

use super::*;
use crate::expr::{Expr, ExprOp, Kind};

/// This family's operator checks, in report order.
pub(super) fn operators() -> Vec<OperatorCheck> {
    vec![OperatorCheck {
        name: "expression_vjp",
        kernels: &["reduce"],
        run: check_expression_vjp,
    }]
}

/// A weighted RMSNorm (element and column inputs, a row reduction) beside a tempered
/// log-softmax (a row input, a row maximum) and a row output, compiled forward and backward,
/// against the f64 reference in every storage dtype: both outputs, then the gradients of x,
/// the weight and the temperature from 16-bit-or-F32 cotangents; 3 rows of 300 columns (more
/// than a workgroup's 256 lanes).
fn check_expression_vjp(engine: &Engine) -> Result<Vec<Case>> {
    use reference::expr::{self as r, Problem};
    let (rows, cols) = (3, 300);
    let kinds = [Kind::Element, Kind::Column, Kind::Row];
    let x = Expr::input(0, Kind::Element);
    let w = Expr::input(1, Kind::Column);
    let t = Expr::input(2, Kind::Row);
    let inv = 1.0 / ((&x * &x).row_sum() / Expr::width() + 1e-5).sqrt();
    let z = &x / &t;
    let m = z.row_max();
    let outputs = [
        &x * &inv * &w,
        &z - &m - (&z - &m).exp().row_sum().log(),
        inv.clone(),
    ];
    let op = ExprOp::new(&kinds, &outputs)?;
    let mut rng = Rng::new(21);
    let mut cases = Vec::new();
    for dtype in DType::FLOATS {
        let shapes = [vec![rows, cols], vec![cols], vec![rows]];
        let ranges = [(-2.0, 2.0), (-2.0, 2.0), (0.5, 2.0)];
        let mut tensors = Vec::new();
        let mut stored = Vec::new();
        for (shape, (lo, hi)) in shapes.iter().zip(ranges) {
            let n = shape.iter().product();
            let (t, s) = tensor_from_f64(engine, &rng.vec(n, lo, hi), shape, dtype)?;
            tensors.push(t);
            stored.push(s);
        }
        let refs: Vec<&crate::Tensor> = tensors.iter().collect();
        let (outs, saved) = op.forward(&refs, &[dtype; 3])?;
        let slices: Vec<&[f64]> = stored.iter().map(Vec::as_slice).collect();
        let p = Problem {
            rows,
            cols,
            kinds: &kinds,
            inputs: &slices,
        };
        let want = r::forward(&outputs, &p);
        let tol = Tolerance::for_dtype(dtype);
        for (name, got, want) in [
            ("rms", &outs[0], &want[0]),
            ("log_softmax", &outs[1], &want[1]),
            ("inverse", &outs[2], &want[2]),
        ] {
            let label = format!("{name} {dtype} [{rows}, {cols}]");
            cases.push(case(label, &got.to_f64()?, want, tol));
        }
        let mut cots = Vec::new();
        let mut cot_values = Vec::new();
        for y in &outs {
            let (c, s) = tensor_from_f64(engine, &rng.vec(y.len(), -1.0, 1.0), y.shape(), dtype)?;
            cots.push(c);
            cot_values.push(s);
        }
        let given: Vec<Option<&crate::Tensor>> = cots.iter().map(Some).collect();
        let grads = op.backward(&saved, &given, &[0, 1, 2])?;
        let c: Vec<Option<&[f64]>> = cot_values.iter().map(|v| Some(v.as_slice())).collect();
        let want = r::backward(&outputs, &p, &c, &[0, 1, 2]);
        let tol = Tolerance::for_dtype(DType::F32).scaled(20.0);
        for (name, got, want) in [
            ("dx", &grads[0], &want[0]),
            ("dw", &grads[1], &want[1]),
            ("dt", &grads[2], &want[2]),
        ] {
            let label = format!("{name} {dtype} [{rows}, {cols}]");
            cases.push(case(label, &got.to_f64()?, want, tol));
        }
    }
    Ok(cases)
}
