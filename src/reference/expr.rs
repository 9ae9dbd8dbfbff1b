//! Expression VJPs in f64: [`crate::expr`]'s expressions evaluated row by row, and their
//! gradients by a reverse pass over numbers (not through the derivative expressions that
//! [`crate::expr::vjp`] builds), by the module's conventions.

use std::collections::HashMap;

use crate::DType;
use crate::expr::{Binary, Compare, Expr, Key, Kind, Level, Op, Reduction, Unary, topological};

/// A problem: `rows` rows of `cols` columns, input `i` read as `kinds[i]` from `inputs[i]`
/// (`rows · cols` values for an element input, `cols` for a column input, `rows` for a row
/// input, one for a scalar).
#[derive(Debug, Clone, Copy)]
pub struct Problem<'a> {
    /// Rows (the element inputs' leading axes flattened).
    pub rows: usize,
    /// Columns (their last axis).
    pub cols: usize,
    /// How each input is read.
    pub kinds: &'a [Kind],
    /// Each input's values.
    pub inputs: &'a [&'a [f64]],
}

/// A value at one row: one number a column, or one for the whole row.
#[derive(Debug, Clone)]
enum Val {
    Element(Vec<f64>),
    Row(f64),
}

impl Val {
    fn at(&self, j: usize) -> f64 {
        match self {
            Val::Element(v) => v[j],
            Val::Row(v) => *v,
        }
    }

    /// Apply `f` at every column (once for row values of row operands).
    fn map(operands: &[&Val], cols: usize, f: impl Fn(&[f64]) -> f64) -> Val {
        if operands.iter().all(|v| matches!(v, Val::Row(_))) {
            let x: Vec<f64> = operands.iter().map(|v| v.at(0)).collect();
            return Val::Row(f(&x));
        }
        Val::Element(
            (0..cols)
                .map(|j| {
                    let x: Vec<f64> = operands.iter().map(|v| v.at(j)).collect();
                    f(&x)
                })
                .collect(),
        )
    }

    /// The sum over the row's columns (a row value counted once a column).
    fn row_sum(&self, cols: usize) -> f64 {
        match self {
            Val::Element(v) => v.iter().sum(),
            Val::Row(v) if cols > 0 => v * cols as f64,
            Val::Row(_) => 0.0,
        }
    }

    fn add(&self, other: &Val, cols: usize) -> Val {
        Val::map(&[self, other], cols, |x| x[0] + x[1])
    }
}

fn round(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => half::f16::from_f32(v as f32).to_f64(),
        DType::BF16 => half::bf16::from_f32(v as f32).to_f64(),
        _ => v,
    }
}

fn holds(c: Compare, a: f64, b: f64) -> bool {
    match c {
        Compare::Less => a < b,
        Compare::LessEqual => a <= b,
        Compare::Greater => a > b,
        Compare::GreaterEqual => a >= b,
        Compare::Equal => a == b,
        Compare::NotEqual => a != b,
    }
}

/// The maximum (or minimum) of a row: NaN if it holds one, −∞ (+∞) when empty.
fn extreme(v: &Val, cols: usize, max: bool) -> f64 {
    let values: Vec<f64> = (0..cols).map(|j| v.at(j)).collect();
    if values.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let start = if max {
        f64::NEG_INFINITY
    } else {
        f64::INFINITY
    };
    values
        .into_iter()
        .fold(start, |m, x| if max { m.max(x) } else { m.min(x) })
}

/// Every node's value at row `r`, by key.
fn evaluate(order: &[Expr], p: &Problem, r: usize) -> HashMap<Key, Val> {
    let cols = p.cols;
    let mut vals: HashMap<Key, Val> = HashMap::new();
    for e in order {
        let get = |x: &Expr| vals[&x.key()].clone();
        let v = match &e.node().op {
            Op::Input(i, Kind::Element) => {
                Val::Element(p.inputs[*i][r * cols..(r + 1) * cols].to_vec())
            }
            Op::Input(i, Kind::Column) => Val::Element(p.inputs[*i][..cols].to_vec()),
            Op::Input(i, Kind::Row) => Val::Row(p.inputs[*i][r]),
            Op::Input(i, Kind::Scalar) => Val::Row(p.inputs[*i][0]),
            Op::Const(c) => Val::Row(f64::from(*c)),
            Op::Width => Val::Row(cols as f64),
            Op::Unary(op, a) => {
                let a = get(a);
                Val::map(&[&a], cols, |x| match op {
                    Unary::Neg => -x[0],
                    Unary::Exp => x[0].exp(),
                    Unary::Log => x[0].ln(),
                    Unary::Sqrt => x[0].sqrt(),
                    Unary::Tanh => x[0].tanh(),
                    Unary::Abs => x[0].abs(),
                    Unary::Cast(dt) => round(x[0], *dt),
                })
            }
            Op::Binary(op, a, b) => {
                let (a, b) = (get(a), get(b));
                Val::map(&[&a, &b], cols, |x| match op {
                    Binary::Add => x[0] + x[1],
                    Binary::Sub => x[0] - x[1],
                    Binary::Mul => x[0] * x[1],
                    Binary::Div => x[0] / x[1],
                })
            }
            Op::Select(c, ops) => {
                let v: Vec<Val> = ops.iter().map(get).collect();
                Val::map(&[&v[0], &v[1], &v[2], &v[3]], cols, |x| {
                    if holds(*c, x[0], x[1]) { x[2] } else { x[3] }
                })
            }
            Op::Reduce(op, u) => {
                let u = get(u);
                Val::Row(match op {
                    Reduction::Sum => u.row_sum(cols),
                    Reduction::Max => extreme(&u, cols, true),
                    Reduction::Min => extreme(&u, cols, false),
                })
            }
        };
        vals.insert(e.key(), v);
    }
    vals
}

/// The outputs: an element-level output as `rows · cols` values, a row-level one as `rows`.
pub fn forward(outputs: &[Expr], p: &Problem) -> Vec<Vec<f64>> {
    let order = topological(outputs, &|_| false);
    let mut out: Vec<Vec<f64>> = vec![Vec::new(); outputs.len()];
    for r in 0..p.rows {
        let vals = evaluate(&order, p, r);
        for (o, y) in outputs.iter().enumerate() {
            let v = &vals[&y.key()];
            match y.level() {
                Level::Element => out[o].extend((0..p.cols).map(|j| v.at(j))),
                Level::Row => out[o].push(v.at(0)),
            }
        }
    }
    out
}

/// Each operand of `n` with `g · ∂n/∂operand` at row values `vals`.
fn contributions(n: &Expr, g: &Val, vals: &HashMap<Key, Val>, cols: usize) -> Vec<(Expr, Val)> {
    let v = &vals[&n.key()];
    let of = |x: &Expr| vals[&x.key()].clone();
    match &n.node().op {
        Op::Input(..) | Op::Const(_) | Op::Width => vec![],
        Op::Unary(op, a) => {
            let x = of(a);
            let d = Val::map(&[g, &x, v], cols, |t| {
                let (g, x, y) = (t[0], t[1], t[2]);
                match op {
                    Unary::Neg => -g,
                    Unary::Exp => g * y,
                    Unary::Log => g / x,
                    Unary::Sqrt => g * 0.5 / y,
                    Unary::Tanh => g * (1.0 - y * y),
                    Unary::Abs if x > 0.0 => g,
                    Unary::Abs if x < 0.0 => -g,
                    Unary::Abs if x == 0.0 => 0.0,
                    Unary::Abs => g * x,
                    Unary::Cast(_) => g,
                }
            });
            vec![(a.clone(), d)]
        }
        Op::Binary(op, a, b) => {
            let (x, y) = (of(a), of(b));
            let da = Val::map(&[g, &x, &y], cols, |t| match op {
                Binary::Add | Binary::Sub => t[0],
                Binary::Mul => t[0] * t[2],
                Binary::Div => t[0] / t[2],
            });
            let db = Val::map(&[g, &x, &y, v], cols, |t| match op {
                Binary::Add => t[0],
                Binary::Sub => -t[0],
                Binary::Mul => t[0] * t[1],
                Binary::Div => -(t[0] * t[3]) / t[2],
            });
            vec![(a.clone(), da), (b.clone(), db)]
        }
        Op::Select(c, [x, y, t, f]) => {
            let (x, y) = (of(x), of(y));
            let pick = |on_true: bool| {
                Val::map(&[g, &x, &y], cols, |s| {
                    if holds(*c, s[1], s[2]) == on_true {
                        s[0]
                    } else {
                        0.0
                    }
                })
            };
            vec![(t.clone(), pick(true)), (f.clone(), pick(false))]
        }
        Op::Reduce(op, u) => {
            let x = of(u);
            let g = g.at(0);
            if u.level() == Level::Row {
                let d = if *op == Reduction::Sum {
                    g * cols as f64
                } else {
                    g
                };
                return vec![(u.clone(), Val::Row(d))];
            }
            if *op == Reduction::Sum {
                return vec![(u.clone(), Val::Row(g))];
            }
            let m = v.at(0);
            let ties = (0..cols).filter(|&j| x.at(j) == m).count() as f64;
            let d = (0..cols)
                .map(|j| if x.at(j) == m { g / ties } else { 0.0 })
                .collect();
            vec![(u.clone(), Val::Element(d))]
        }
    }
}

/// The gradients of `Σ_o ⟨cotangents[o], output o⟩` (a `None` cotangent is zero) with respect
/// to the inputs `wrt`, each shaped as its input's values (a column input's summed over the
/// rows, a scalar's over the rows and columns).
pub fn backward(
    outputs: &[Expr],
    p: &Problem,
    cotangents: &[Option<&[f64]>],
    wrt: &[usize],
) -> Vec<Vec<f64>> {
    let order = topological(outputs, &|_| false);
    let cols = p.cols;
    let mut grads: Vec<Vec<f64>> = wrt
        .iter()
        .map(|&i| match p.kinds[i] {
            Kind::Element => vec![0.0; p.rows * cols],
            Kind::Column => vec![0.0; cols],
            Kind::Row => vec![0.0; p.rows],
            Kind::Scalar => vec![0.0],
        })
        .collect();
    for r in 0..p.rows {
        let vals = evaluate(&order, p, r);
        let mut adj: HashMap<Key, Val> = HashMap::new();
        let add = |adj: &mut HashMap<Key, Val>, k: Key, v: Val| {
            let s = match adj.remove(&k) {
                Some(prev) => prev.add(&v, cols),
                None => v,
            };
            adj.insert(k, s);
        };
        for (y, c) in outputs.iter().zip(cotangents) {
            if let Some(c) = c {
                let g = match y.level() {
                    Level::Element => Val::Element(c[r * cols..(r + 1) * cols].to_vec()),
                    Level::Row => Val::Row(c[r]),
                };
                add(&mut adj, y.key(), g);
            }
        }
        for n in order.iter().rev() {
            let Some(g) = adj.get(&n.key()).cloned() else {
                continue;
            };
            for (operand, d) in contributions(n, &g, &vals, cols) {
                // A row-level operand of an element-level node stands at every column: it
                // receives the row sum of the contributions.
                let d = if n.level() == Level::Element && operand.level() == Level::Row {
                    Val::Row(d.row_sum(cols))
                } else {
                    d
                };
                add(&mut adj, operand.key(), d);
            }
        }
        for (k, &i) in wrt.iter().enumerate() {
            let Some(g) = adj.get(&Key::Input(i)) else {
                continue;
            };
            match p.kinds[i] {
                Kind::Element => {
                    for j in 0..cols {
                        grads[k][r * cols + j] = g.at(j);
                    }
                }
                Kind::Column => {
                    for (j, s) in grads[k].iter_mut().enumerate() {
                        *s += g.at(j);
                    }
                }
                Kind::Row => grads[k][r] = g.at(0),
                Kind::Scalar => grads[k][0] += g.at(0),
            }
        }
    }
    grads
}
