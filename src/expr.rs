//! Expression VJPs: elementwise and row-reduction expressions over rows of tensors, their
//! reverse-mode derivatives built as expressions ([`vjp`]), and both compiled to WGSL kernels
//! ([`ExprOp`]).
//!
//! An [`Expr`] is a DAG over inputs read at one element of a `[rows, cols]` problem (leading
//! axes flattened to rows): an [`Kind::Element`] input is read at the element, a
//! [`Kind::Column`] input (`[cols]`, a norm's weight say) at its column, a [`Kind::Row`] input
//! (one value a row, shaped as the leading axes) at its row, a [`Kind::Scalar`] input (one
//! value) everywhere. Operations: `+ − × ÷` and negation (with
//! `f32` constants on either side), `exp`, `log`, `sqrt`, `tanh`, `abs`, casts (rounding to
//! F16 or BF16 and back), [`Expr::select`] on a comparison, [`Expr::width`] (the number of
//! columns), and the row reductions [`Expr::row_sum`], [`Expr::row_max`], [`Expr::row_min`]
//! (a value a row, broadcast where used). A node is *element-level* when it varies along the
//! row, else *row-level* (constants, row and scalar inputs, reductions, and what is computed
//! from those alone).
//!
//! Derivative conventions (the reference [`crate::reference::expr`] follows the same): a cast's
//! derivative is 1 (the real-arithmetic convention, not a derivative of rounding); `abs` has
//! derivative 0 at 0 (NaN stays NaN); a row maximum or minimum splits its cotangent equally
//! among the elements equal to it (a row holding a NaN has a NaN extreme and gives its operand
//! no gradient); a selection passes the cotangent to the chosen branch (the comparison has no
//! derivative); a row-level value used at every element receives the row sum of its uses'
//! contributions, a scalar input the sum of those over the rows, and a column input the sum
//! over the rows of its elements' contributions (fixed order, [`crate::reduce`]). Inputs not
//! asked for are frozen coefficients.
//!
//! Kernels: every value in FP32 (inputs of any float dtype widened exactly, outputs rounded
//! once to their dtype). Row reductions run a workgroup of 256 lanes a row, each lane summing
//! (or taking the extreme of) columns `lane, lane + 256, …` in order and the lanes combined by
//! a fixed-order tree; reductions that depend on others run after them, those that do not in
//! one pass over the row. Outputs run an invocation per two consecutive elements (or rows), so
//! each 16-bit output word has one writer. No atomics: reruns give identical bits. The
//! generated WGSL goes through the engine like every kernel (strict MSL on Metal).
//!
//! ```no_run
//! use wgrad::expr::{Expr, ExprOp, Kind};
//! use wgrad::{DType, Engine, Tensor};
//! let engine = Engine::new()?;
//! // RMSNorm of each row, as an expression: x / sqrt(mean(x²) + 1e-6).
//! let x = Expr::input(0, Kind::Element);
//! let y = &x / ((&x * &x).row_sum() / Expr::width() + 1e-6).sqrt();
//! let op = ExprOp::new(&[Kind::Element], &[y])?;
//! let xs = Tensor::from_slice(&engine, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let (outs, saved) = op.forward(&[&xs], &[DType::F32])?;
//! let dy = Tensor::from_slice(&engine, &[1.0f32; 6], &[2, 3])?;
//! let grads = op.backward(&saved, &[Some(&dy)], &[0])?;
//! assert_eq!(grads[0].shape(), &[2, 3]);
//! # Ok::<(), wgrad::Error>(())
//! ```
//!
//! Bounds: rows · cols < 2³² and each tensor within one storage binding; at most
//! [`MAX_NODES`] nodes in a compiled expression (outputs and, in the backward, gradients);
//! an entry binds one storage buffer per input it reads and per output, plus the statistics
//! (`InsufficientLimit` on a device with fewer). Each distinct generated kernel is kept for
//! the life of the process (the engine caches pipelines by kernel).

use std::collections::{HashMap, HashSet};
use std::ops::{Add, Div, Mul, Neg, Sub};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::kernel::{
    COMMON_DTYPE, COMMON_LAUNCH, COMMON_REDUCE, COMMON_SOFTCAP, Kernel, entry_bindings,
};
use crate::{DType, Engine, Error, Result, Tensor};

/// Nodes a compiled expression may hold (outputs, and in the backward the gradients).
pub const MAX_NODES: usize = 4096;

/// Lanes of a row reduction's workgroup and invocations of an output workgroup.
const WG: u64 = 256;

/// How an input is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A `[.., cols]` tensor read at each element (all element inputs share one shape).
    Element,
    /// One value a row: a tensor shaped as the element inputs' leading axes.
    Row,
    /// One value a column (a `[cols]` tensor, e.g. a norm's weight) shared by every row.
    Column,
    /// One value (a tensor of one element) used at every element.
    Scalar,
}

/// Whether a value varies along the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Row,
    Element,
}

/// Unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unary {
    Neg,
    Exp,
    Log,
    Sqrt,
    Tanh,
    Abs,
    Cast(DType),
}

/// Binary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

/// Comparisons of a selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compare {
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
}

/// Row reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reduction {
    Sum,
    Max,
    Min,
}

#[derive(Debug)]
pub(crate) enum Op {
    Input(usize, Kind),
    Const(f32),
    Width,
    Unary(Unary, Expr),
    Binary(Binary, Expr, Expr),
    /// `(a cmp b) ? t : f`.
    Select(Compare, [Expr; 4]),
    Reduce(Reduction, Expr),
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) op: Op,
    pub(crate) level: Level,
}

/// An expression node (cheap to clone: a shared handle). Nodes are identified by handle, and
/// inputs by index, so an input named twice is one leaf.
#[derive(Debug, Clone)]
pub struct Expr(Arc<Node>);

/// A comparison of two expressions, the condition of [`Expr::select`].
#[derive(Debug, Clone)]
pub struct Condition {
    compare: Compare,
    a: Expr,
    b: Expr,
}

/// The identity of a node: inputs by index, other nodes by handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Input(usize),
    Node(usize),
}

impl Expr {
    fn new(op: Op) -> Expr {
        let level = match &op {
            Op::Input(_, Kind::Element | Kind::Column) => Level::Element,
            Op::Input(..) | Op::Const(_) | Op::Width | Op::Reduce(..) => Level::Row,
            Op::Unary(_, a) => a.level(),
            Op::Binary(_, a, b) => a.level().max(b.level()),
            Op::Select(_, v) => v.iter().map(Expr::level).max().unwrap_or(Level::Row),
        };
        Expr(Arc::new(Node { op, level }))
    }

    /// Input `index` of the function, read as `kind` says.
    pub fn input(index: usize, kind: Kind) -> Expr {
        Expr::new(Op::Input(index, kind))
    }

    /// A constant.
    pub fn constant(value: f32) -> Expr {
        Expr::new(Op::Const(value))
    }

    /// The number of columns (as an f32), e.g. for a row mean `x.row_sum() / Expr::width()`.
    pub fn width() -> Expr {
        Expr::new(Op::Width)
    }

    fn unary(&self, op: Unary) -> Expr {
        Expr::new(Op::Unary(op, self.clone()))
    }

    /// `e^x`.
    pub fn exp(&self) -> Expr {
        self.unary(Unary::Exp)
    }

    /// Natural logarithm.
    pub fn log(&self) -> Expr {
        self.unary(Unary::Log)
    }

    /// Square root.
    pub fn sqrt(&self) -> Expr {
        self.unary(Unary::Sqrt)
    }

    /// Hyperbolic tangent (to a few ulps near 0 as well).
    pub fn tanh(&self) -> Expr {
        self.unary(Unary::Tanh)
    }

    /// Absolute value (derivative 0 at 0).
    pub fn abs(&self) -> Expr {
        self.unary(Unary::Abs)
    }

    /// The value rounded to `dtype` (F16, BF16; F32 is the identity) and widened back; the
    /// derivative is 1. Another dtype is refused when the expression is used.
    pub fn cast(&self, dtype: DType) -> Expr {
        self.unary(Unary::Cast(dtype))
    }

    fn reduce(&self, op: Reduction) -> Expr {
        Expr::new(Op::Reduce(op, self.clone()))
    }

    /// Sum over the row (0 for an empty row).
    pub fn row_sum(&self) -> Expr {
        self.reduce(Reduction::Sum)
    }

    /// Maximum over the row (−∞ for an empty row, NaN if the row holds one).
    pub fn row_max(&self) -> Expr {
        self.reduce(Reduction::Max)
    }

    /// Minimum over the row (+∞ for an empty row, NaN if the row holds one).
    pub fn row_min(&self) -> Expr {
        self.reduce(Reduction::Min)
    }

    fn compare(&self, compare: Compare, other: &Expr) -> Condition {
        Condition {
            compare,
            a: self.clone(),
            b: other.clone(),
        }
    }

    /// `self < other`.
    pub fn less(&self, other: &Expr) -> Condition {
        self.compare(Compare::Less, other)
    }

    /// `self ≤ other`.
    pub fn less_equal(&self, other: &Expr) -> Condition {
        self.compare(Compare::LessEqual, other)
    }

    /// `self > other`.
    pub fn greater(&self, other: &Expr) -> Condition {
        self.compare(Compare::Greater, other)
    }

    /// `self ≥ other`.
    pub fn greater_equal(&self, other: &Expr) -> Condition {
        self.compare(Compare::GreaterEqual, other)
    }

    /// `self == other`.
    pub fn equal(&self, other: &Expr) -> Condition {
        self.compare(Compare::Equal, other)
    }

    /// `self != other` (true when either is NaN).
    pub fn not_equal(&self, other: &Expr) -> Condition {
        self.compare(Compare::NotEqual, other)
    }

    /// `if_true` where `condition` holds, else `if_false` (comparisons with a NaN are false,
    /// but `not_equal`).
    pub fn select(condition: &Condition, if_true: &Expr, if_false: &Expr) -> Expr {
        let c = condition.clone();
        Expr::new(Op::Select(
            c.compare,
            [c.a, c.b, if_true.clone(), if_false.clone()],
        ))
    }

    pub(crate) fn node(&self) -> &Node {
        &self.0
    }

    pub(crate) fn level(&self) -> Level {
        self.0.level
    }

    pub(crate) fn key(&self) -> Key {
        match self.0.op {
            Op::Input(i, _) => Key::Input(i),
            _ => Key::Node(Arc::as_ptr(&self.0) as usize),
        }
    }

    /// The operands, in order.
    pub(crate) fn operands(&self) -> Vec<&Expr> {
        match &self.0.op {
            Op::Input(..) | Op::Const(_) | Op::Width => vec![],
            Op::Unary(_, a) | Op::Reduce(_, a) => vec![a],
            Op::Binary(_, a, b) => vec![a, b],
            Op::Select(_, v) => v.iter().collect(),
        }
    }
}

macro_rules! binary_ops {
    ($($trait:ident $method:ident $op:ident),*) => {$(
        impl $trait<&Expr> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: &Expr) -> Expr {
                Expr::new(Op::Binary(Binary::$op, self.clone(), rhs.clone()))
            }
        }
        impl $trait<Expr> for Expr {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                (&self).$method(&rhs)
            }
        }
        impl $trait<&Expr> for Expr {
            type Output = Expr;
            fn $method(self, rhs: &Expr) -> Expr {
                (&self).$method(rhs)
            }
        }
        impl $trait<Expr> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                self.$method(&rhs)
            }
        }
        impl $trait<f32> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: f32) -> Expr {
                self.$method(&Expr::constant(rhs))
            }
        }
        impl $trait<f32> for Expr {
            type Output = Expr;
            fn $method(self, rhs: f32) -> Expr {
                (&self).$method(&Expr::constant(rhs))
            }
        }
        impl $trait<&Expr> for f32 {
            type Output = Expr;
            fn $method(self, rhs: &Expr) -> Expr {
                (&Expr::constant(self)).$method(rhs)
            }
        }
        impl $trait<Expr> for f32 {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                (&Expr::constant(self)).$method(&rhs)
            }
        }
    )*};
}

binary_ops!(Add add Add, Sub sub Sub, Mul mul Mul, Div div Div);

impl Neg for &Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        self.unary(Unary::Neg)
    }
}

impl Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        -&self
    }
}

/// The nodes reachable from `roots`, operands before their users (each once); nodes for which
/// `leaf` holds are taken without their operands. Iterative, so deep chains do not recurse.
pub(crate) fn topological(roots: &[Expr], leaf: &dyn Fn(&Expr) -> bool) -> Vec<Expr> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(Expr, bool)> = roots.iter().rev().map(|e| (e.clone(), false)).collect();
    while let Some((e, expanded)) = stack.pop() {
        if expanded {
            order.push(e);
            continue;
        }
        if !seen.insert(e.key()) {
            continue;
        }
        stack.push((e.clone(), true));
        if !leaf(&e) {
            for c in e.operands().into_iter().rev() {
                if !seen.contains(&c.key()) {
                    stack.push((c.clone(), false));
                }
            }
        }
    }
    order
}

/// Refuse an input named with two kinds, or a cast to a dtype that is not a float.
fn check_nodes(nodes: &[Expr], kinds: Option<&[Kind]>) -> Result<()> {
    let mut named: HashMap<usize, Kind> = HashMap::new();
    let mut all = Vec::new();
    for n in nodes {
        // Leaves merged by index: look at every occurrence, not only the first.
        all.extend(n.operands().into_iter().cloned());
        all.push(n.clone());
    }
    for n in &all {
        match n.node().op {
            Op::Input(i, kind) => {
                if let Some(kinds) = kinds {
                    if i >= kinds.len() {
                        return Err(Error::bounds(
                            "expression: input index",
                            i as u64,
                            0,
                            kinds.len() as u64 - 1,
                        ));
                    }
                    if kinds[i] != kind {
                        return Err(kind_conflict(i, kinds[i], kind));
                    }
                }
                if let Some(&k) = named.get(&i) {
                    if k != kind {
                        return Err(kind_conflict(i, k, kind));
                    }
                }
                named.insert(i, kind);
            }
            Op::Unary(Unary::Cast(dt), _) if !dt.is_float() => {
                return Err(Error::dtype("expression: cast", dt, &DType::FLOATS));
            }
            _ => {}
        }
    }
    Ok(())
}

fn kind_conflict(index: usize, a: Kind, b: Kind) -> Error {
    Error::InvalidValue {
        what: format!("expression: input {index}"),
        got: index as f64,
        rule: format!("read as {a:?} and as {b:?}; an input has one kind"),
    }
}

/// The vector-Jacobian product as expressions: for each node of `wrt`, the derivative of
/// `Σ_o ⟨cotangents[o], outputs[o]⟩` with respect to it (reverse mode over the DAG, by the
/// module's conventions). A `None` cotangent is zero (its output contributes nothing, not even
/// a NaN); a row-level output takes a row-level cotangent. A node no output depends on gets the
/// constant 0. The gradient of a row-level node is its per-row value, of an element-level node
/// its per-element value (a [`Kind::Scalar`] input's gradient is the sum of the first over the
/// rows, a [`Kind::Column`] input's the sum of the second; [`ExprOp::backward`] takes them). The
/// result is expressions over the same inputs and the cotangents' inputs: they compile like
/// any other (the derivative of a row reduction's users is itself a row reduction).
///
/// Errors: counts that differ, an element-level cotangent of a row-level output, an input read
/// with two kinds.
pub fn vjp(outputs: &[Expr], cotangents: &[Option<Expr>], wrt: &[Expr]) -> Result<Vec<Expr>> {
    if cotangents.len() != outputs.len() {
        return Err(Error::bounds(
            "vjp: cotangents",
            cotangents.len() as u64,
            outputs.len() as u64,
            outputs.len() as u64,
        ));
    }
    for (o, (y, c)) in outputs.iter().zip(cotangents).enumerate() {
        if let Some(c) = c {
            if y.level() == Level::Row && c.level() == Level::Element {
                return Err(Error::InvalidValue {
                    what: format!("vjp: cotangent {o}"),
                    got: o as f64,
                    rule: "a row-level output takes a row-level cotangent".into(),
                });
            }
        }
    }
    let mut roots = outputs.to_vec();
    roots.extend(cotangents.iter().flatten().cloned());
    roots.extend(wrt.iter().cloned());
    check_nodes(&topological(&roots, &|_| false), None)?;

    let order = topological(outputs, &|_| false);
    let mut adjoint: HashMap<Key, Expr> = HashMap::new();
    // Element-level contributions to row-level nodes, summed over the row when the node is
    // reached (every user before it).
    let mut along_row: HashMap<Key, Expr> = HashMap::new();
    for (y, c) in outputs.iter().zip(cotangents) {
        if let Some(c) = c {
            accumulate(&mut adjoint, y.key(), c.clone());
        }
    }
    for n in order.iter().rev() {
        let key = n.key();
        if let Some(s) = along_row.remove(&key) {
            accumulate(&mut adjoint, key, s.row_sum());
        }
        let Some(g) = adjoint.get(&key).cloned() else {
            continue;
        };
        for (operand, contribution) in local_vjp(n, &g) {
            if n.level() == Level::Element && operand.level() == Level::Row {
                accumulate(&mut along_row, operand.key(), contribution);
            } else {
                accumulate(&mut adjoint, operand.key(), contribution);
            }
        }
    }
    Ok(wrt
        .iter()
        .map(|w| {
            adjoint
                .get(&w.key())
                .cloned()
                .unwrap_or_else(|| Expr::constant(0.0))
        })
        .collect())
}

fn accumulate(map: &mut HashMap<Key, Expr>, key: Key, value: Expr) {
    let sum = match map.remove(&key) {
        Some(prev) => prev + value,
        None => value,
    };
    map.insert(key, sum);
}

/// Each operand of `n` with its contribution `g · ∂n/∂operand`.
fn local_vjp(n: &Expr, g: &Expr) -> Vec<(Expr, Expr)> {
    let zero = Expr::constant(0.0);
    match &n.node().op {
        Op::Input(..) | Op::Const(_) | Op::Width => vec![],
        Op::Unary(op, a) => {
            let d = match op {
                Unary::Neg => -g,
                Unary::Exp => g * n,
                Unary::Log => g / a,
                Unary::Sqrt => (g * 0.5) / n,
                Unary::Tanh => g * (1.0 - n * n),
                Unary::Abs => Expr::select(
                    &a.greater(&zero),
                    g,
                    &Expr::select(
                        &a.less(&zero),
                        &-g,
                        &Expr::select(&a.equal(&zero), &zero, &(g * a)),
                    ),
                ),
                Unary::Cast(_) => g.clone(),
            };
            vec![(a.clone(), d)]
        }
        Op::Binary(op, a, b) => match op {
            Binary::Add => vec![(a.clone(), g.clone()), (b.clone(), g.clone())],
            Binary::Sub => vec![(a.clone(), g.clone()), (b.clone(), -g)],
            Binary::Mul => vec![(a.clone(), g * b), (b.clone(), g * a)],
            Binary::Div => vec![(a.clone(), g / b), (b.clone(), -(g * n) / b)],
        },
        Op::Select(compare, [x, y, t, f]) => {
            let c = x.compare(*compare, y);
            vec![
                (t.clone(), Expr::select(&c, g, &zero)),
                (f.clone(), Expr::select(&c, &zero, g)),
            ]
        }
        Op::Reduce(op, u) => {
            if u.level() == Level::Row {
                // A row-level operand stands at every column: a sum counts it `cols` times,
                // an extreme is the value itself.
                return match op {
                    Reduction::Sum => vec![(u.clone(), g * Expr::width())],
                    _ => vec![(u.clone(), g.clone())],
                };
            }
            match op {
                Reduction::Sum => vec![(u.clone(), g.clone())],
                _ => {
                    let hit = u.equal(n);
                    let ties = Expr::select(&hit, &Expr::constant(1.0), &zero).row_sum();
                    vec![(u.clone(), Expr::select(&hit, &(g / ties), &zero))]
                }
            }
        }
    }
}

/// An input of a compiled expression: how it is read and its dtype.
type InputSpec = (Kind, DType);

/// An output of a compiled expression: the expression, whether it is written per element or
/// per row (an element output may be row-level: broadcast), and its dtype.
struct OutputSpec {
    expr: Expr,
    per_element: bool,
    dtype: DType,
}

/// What a storage binding of a compiled entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Input(usize),
    Stats,
    Output(usize),
}

/// An entry of a generated kernel and the storage bindings it uses, in binding order.
#[derive(Clone)]
struct Entry {
    name: String,
    roles: Vec<Role>,
}

/// A generated kernel: its entries in launch order, in groups (the reductions; the element
/// outputs, all in one entry and then one entry each; the row outputs likewise). A group runs
/// its first entry, or, where that binds more storage buffers than the device has, the others.
struct Compiled {
    kernel: &'static Kernel,
    entries: Vec<Vec<Entry>>,
    /// The row reductions computed, in statistics order.
    reductions: Vec<Key>,
}

/// The DAG of a compilation: nodes in order, reductions and their levels.
struct Analysis {
    order: Vec<Expr>,
    position: HashMap<Key, usize>,
    /// The statistics slot of each reduction computed here (by level, then order).
    slot: HashMap<Key, usize>,
    /// Reductions by level (1 = reads no other reduction), slots ascending.
    levels: Vec<Vec<usize>>,
}

fn analyze(outputs: &[Expr], saved: &HashMap<Key, usize>) -> Result<Analysis> {
    let order = topological(outputs, &|e| saved.contains_key(&e.key()));
    if order.len() > MAX_NODES {
        return Err(Error::bounds(
            "expression: nodes",
            order.len() as u64,
            1,
            MAX_NODES as u64,
        ));
    }
    let position: HashMap<Key, usize> = order
        .iter()
        .enumerate()
        .map(|(i, e)| (e.key(), i))
        .collect();
    let mut depth = vec![0usize; order.len()];
    let mut reductions = Vec::new();
    for (i, e) in order.iter().enumerate() {
        if saved.contains_key(&e.key()) {
            continue;
        }
        let below = e
            .operands()
            .iter()
            .map(|o| depth[position[&o.key()]])
            .max()
            .unwrap_or(0);
        depth[i] = below;
        if matches!(e.node().op, Op::Reduce(..)) {
            depth[i] = below + 1;
            reductions.push(i);
        }
    }
    reductions.sort_by_key(|&i| (depth[i], i));
    let deepest = reductions.last().map_or(0, |&i| depth[i]);
    let mut levels = vec![Vec::new(); deepest];
    let mut slot = HashMap::new();
    for (s, &i) in reductions.iter().enumerate() {
        slot.insert(order[i].key(), s);
        levels[depth[i] - 1].push(i);
    }
    Ok(Analysis {
        order,
        position,
        slot,
        levels,
    })
}

/// Where a generated statement is evaluated: inside a reduction pass (`e`, `row` and the
/// finished reductions `s<slot>` in scope), at an element (`e`, `row`), or at a row (`row`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Pass,
    Element,
    Row,
}

/// WGSL source of one expression kernel.
struct Writer<'a> {
    a: &'a Analysis,
    inputs: &'a [InputSpec],
    saved: &'a HashMap<Key, usize>,
}

fn literal(v: f32) -> String {
    format!("bitcast<f32>({:#010x}u)", v.to_bits())
}

impl Writer<'_> {
    /// How node `i` is referred to: a finished reduction or saved statistic inline, else its
    /// variable.
    fn name(&self, i: usize, place: Place) -> String {
        let key = self.a.order[i].key();
        if let Some(s) = self.saved.get(&key) {
            return format!("saved_at(row, {s}u)");
        }
        if let Some(s) = self.a.slot.get(&key) {
            return match place {
                Place::Pass => format!("s{s}"),
                _ => format!("stat_at(row, {s}u)"),
            };
        }
        format!("n{i}")
    }

    fn operand(&self, e: &Expr, place: Place) -> String {
        self.name(self.a.position[&e.key()], place)
    }

    /// The WGSL value of node `i` from its operands' names.
    fn value(&self, i: usize, place: Place) -> String {
        let e = &self.a.order[i];
        let o = |x: &Expr| self.operand(x, place);
        match &e.node().op {
            Op::Input(k, Kind::Element) => format!("in{k}(e)"),
            Op::Input(k, Kind::Row) => format!("in{k}(row)"),
            Op::Input(k, Kind::Column) => format!("in{k}(e - row * params.cols)"),
            Op::Input(k, Kind::Scalar) => format!("in{k}(0u)"),
            Op::Const(v) => literal(*v),
            Op::Width => "f32(params.cols)".into(),
            Op::Unary(op, a) => {
                let a = o(a);
                match op {
                    Unary::Neg => format!("-{a}"),
                    Unary::Exp => format!("exp({a})"),
                    Unary::Log => format!("log({a})"),
                    Unary::Sqrt => format!("sqrt({a})"),
                    Unary::Tanh => format!("tanh_accurate({a})"),
                    Unary::Abs => format!("abs({a})"),
                    Unary::Cast(DType::BF16) => format!("round_bf16({a})"),
                    Unary::Cast(DType::F16) => format!("round_f16({a})"),
                    Unary::Cast(_) => a,
                }
            }
            Op::Binary(op, a, b) => {
                let sign = match op {
                    Binary::Add => "+",
                    Binary::Sub => "-",
                    Binary::Mul => "*",
                    Binary::Div => "/",
                };
                format!("({} {sign} {})", o(a), o(b))
            }
            Op::Select(c, [x, y, t, f]) => {
                let cmp = match c {
                    Compare::Less => "<",
                    Compare::LessEqual => "<=",
                    Compare::Greater => ">",
                    Compare::GreaterEqual => ">=",
                    Compare::Equal => "==",
                    Compare::NotEqual => "!=",
                };
                format!("select({}, {}, {} {cmp} {})", o(f), o(t), o(x), o(y))
            }
            // Reductions are referred to by name, never evaluated in place.
            Op::Reduce(..) => self.name(i, place),
        }
    }

    /// `let` statements for every node `targets` need, in order, not crossing reductions or
    /// saved statistics (referred to by name).
    fn statements(&self, targets: &[usize], place: Place, indent: &str) -> String {
        let mut need = vec![false; self.a.order.len()];
        let mut stack: Vec<usize> = targets.to_vec();
        while let Some(i) = stack.pop() {
            if need[i] {
                continue;
            }
            let key = self.a.order[i].key();
            if self.saved.contains_key(&key) || self.a.slot.contains_key(&key) {
                continue;
            }
            need[i] = true;
            for op in self.a.order[i].operands() {
                stack.push(self.a.position[&op.key()]);
            }
        }
        let mut s = String::new();
        for (i, needed) in need.iter().enumerate() {
            if *needed {
                s += &format!("{indent}let n{i} = {};\n", self.value(i, place));
            }
        }
        s
    }

    fn bindings(&self, outputs: &[OutputSpec], saved_width: usize) -> String {
        let mut s = String::from("@group(0) @binding(0) var<uniform> params: Params;\n");
        let mut b = 1;
        for (i, (_, dt)) in self.inputs.iter().enumerate() {
            let index = if *dt == DType::F32 { "k" } else { "k >> 1u" };
            s += &format!(
                "@group(0) @binding({b}) var<storage, read> in{i}_w: array<u32>;\n\
                 fn in{i}(k: u32) -> f32 {{\n    return word_value(in{i}_w[{index}], k, {}u);\n}}\n",
                dt.code()
            );
            b += 1;
        }
        // One binding for the statistics: the saved ones (`[rows, saved_width]`, a copy, in
        // the backward) then this kernel's own (`[rows, m]`).
        s += &format!(
            "@group(0) @binding({b}) var<storage, read_write> stats_w: array<f32>;\n\
             fn saved_at(row: u32, s: u32) -> f32 {{\n    return stats_w[row * {saved_width}u + s];\n}}\n\
             fn stat_index(row: u32, s: u32) -> u32 {{\n    return params.rows * {saved_width}u + row * {}u + s;\n}}\n\
             fn stat_at(row: u32, s: u32) -> f32 {{\n    return stats_w[stat_index(row, s)];\n}}\n",
            self.a.slot.len()
        );
        b += 1;
        for o in 0..outputs.len() {
            s += &format!("@group(0) @binding({b}) var<storage, read_write> out{o}: array<u32>;\n");
            b += 1;
        }
        s
    }

    /// `reduce_rows`: every reduction, level by level, its row's values stored as statistics.
    fn reduce_rows(&self) -> String {
        let mut s = String::from(
            "@compute @workgroup_size(WG)\n\
             fn reduce_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,\n\
             \x20              @builtin(local_invocation_index) lid: u32) {\n\
             \x20   let row = group_index(wid, nwg);\n\
             \x20   if (row >= params.rows) {\n        return;\n    }\n",
        );
        for level in &self.a.levels {
            let operands: Vec<usize> = level
                .iter()
                .map(|&i| self.a.position[&self.a.order[i].operands()[0].key()])
                .collect();
            let mut folds = String::new();
            let mut finish = String::new();
            for (&i, &u) in level.iter().zip(&operands) {
                let slot = self.a.slot[&self.a.order[i].key()];
                let v = self.name(u, Place::Pass);
                let Op::Reduce(op, _) = self.a.order[i].node().op else {
                    continue;
                };
                match op {
                    Reduction::Sum => {
                        s += &format!("    var a{slot} = 0.0;\n");
                        folds += &format!("        a{slot} = a{slot} + {v};\n");
                        finish += &format!("    let s{slot} = workgroup_sum(a{slot}, lid);\n");
                    }
                    _ => {
                        let max = op == Reduction::Max;
                        let start = if max { "-expr_inf()" } else { "expr_inf()" };
                        s += &format!("    var a{slot} = {start};\n    var z{slot} = false;\n");
                        folds += &format!(
                            "        a{slot} = extreme_step(a{slot}, {v}, {max});\n\
                             \x20       z{slot} = z{slot} || expr_is_nan({v});\n"
                        );
                        finish += &format!(
                            "    let s{slot} = row_extreme(a{slot}, z{slot}, lid, {max});\n"
                        );
                    }
                }
            }
            s += "    for (var j = lid; j < params.cols; j = j + WG) {\n        let e = row * params.cols + j;\n";
            s += &self.statements(&operands, Place::Pass, "        ");
            s += &folds;
            s += "    }\n";
            s += &finish;
        }
        s += "    if (lid == 0u) {\n";
        for slot in 0..self.a.slot.len() {
            s += &format!("        stats_w[stat_index(row, {slot}u)] = s{slot};\n");
        }
        s += "    }\n}\n";
        s
    }

    /// The value function and entry `entry` writing the outputs `mine` (all per element, or
    /// all per row): an invocation per two consecutive elements (rows).
    fn outputs(&self, outputs: &[OutputSpec], mine: &[usize], entry: &str) -> String {
        let per_element = outputs[mine[0]].per_element;
        let name = format!("Values_{entry}");
        let (place, index, count, total) = if per_element {
            (Place::Element, "e", "params.count", "params.pairs")
        } else {
            (Place::Row, "row", "params.rows", "params.row_pairs")
        };
        let targets: Vec<usize> = mine
            .iter()
            .map(|&o| self.a.position[&outputs[o].expr.key()])
            .collect();
        let mut s = format!("struct {name} {{\n");
        for k in 0..mine.len() {
            s += &format!("    v{k}: f32,\n");
        }
        s += &format!("}}\n\nfn {entry}_at({index}: u32) -> {name} {{\n");
        if per_element {
            s += "    let row = e / params.cols;\n";
        }
        s += &self.statements(&targets, place, "    ");
        let values: Vec<String> = targets.iter().map(|&t| self.name(t, place)).collect();
        s += &format!("    return {name}({});\n}}\n\n", values.join(", "));
        s += &format!(
            "@compute @workgroup_size(WG)\n\
             fn {entry}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,\n\
             \x20          @builtin(local_invocation_index) lid: u32) {{\n\
             \x20   let p = group_index(wid, nwg) * WG + lid;\n\
             \x20   if (p >= {total}) {{\n        return;\n    }}\n\
             \x20   let i = 2u * p;\n\
             \x20   let two = i + 1u < {count};\n\
             \x20   let a = {entry}_at(i);\n\
             \x20   var b = a;\n\
             \x20   if (two) {{\n        b = {entry}_at(i + 1u);\n    }}\n"
        );
        for (k, &o) in mine.iter().enumerate() {
            if outputs[o].dtype == DType::F32 {
                s += &format!(
                    "    out{o}[i] = bitcast<u32>(a.v{k});\n    if (two) {{\n        out{o}[i + 1u] = bitcast<u32>(b.v{k});\n    }}\n"
                );
            } else {
                s += &format!(
                    "    out{o}[p] = half_word(a.v{k}, b.v{k}, two, {}u);\n",
                    outputs[o].dtype.code()
                );
            }
        }
        s += "}\n";
        s
    }
}

/// Every generated kernel of the process, by source: each compiled once, kept (leaked) for the
/// life of the process, its name unique.
fn kernels() -> &'static Mutex<HashMap<String, Arc<Compiled>>> {
    static KERNELS: OnceLock<Mutex<HashMap<String, Arc<Compiled>>>> = OnceLock::new();
    KERNELS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Every expression kernel generated in this process so far, in generation order (to inspect
/// them: their strict MSL, SPIR-V or source).
pub fn generated_kernels() -> Vec<&'static Kernel> {
    let map = match kernels().lock() {
        Ok(m) => m,
        Err(poisoned) => poisoned.into_inner(),
    };
    let mut all: Vec<&'static Kernel> = map.values().map(|c| c.kernel).collect();
    all.sort_by_key(|k| k.name[5..].parse::<usize>().unwrap_or(usize::MAX));
    all
}

/// The fixed part of every expression kernel, after the shared snippets.
pub const EXPR_WGSL: &str = include_str!("../wgsl/expr.wgsl");

/// Generate (or fetch) the kernel computing `outputs` from `inputs`, with the row reductions in
/// `saved` read from saved statistics (`saved_width` a row) instead of computed.
fn compile(
    inputs: &[InputSpec],
    outputs: &[OutputSpec],
    saved: &HashMap<Key, usize>,
    saved_width: usize,
) -> Result<Arc<Compiled>> {
    let exprs: Vec<Expr> = outputs.iter().map(|o| o.expr.clone()).collect();
    let kinds: Vec<Kind> = inputs.iter().map(|i| i.0).collect();
    let a = analyze(&exprs, saved)?;
    check_nodes(&a.order, Some(&kinds))?;
    for o in outputs {
        if !o.per_element && o.expr.level() == Level::Element {
            return Err(Error::InvalidValue {
                what: "expression: row output".into(),
                got: 0.0,
                rule: "a row output must be row-level".into(),
            });
        }
    }
    let w = Writer {
        a: &a,
        inputs,
        saved,
    };
    let mut source = w.bindings(outputs, saved_width);
    // Entry groups: the reductions; the element outputs together, then each alone; the row
    // outputs likewise (one output an entry binds fewer buffers: the device's limit decides).
    let mut groups: Vec<Vec<String>> = Vec::new();
    if !a.slot.is_empty() {
        source += &w.reduce_rows();
        groups.push(vec!["reduce_rows".into()]);
    }
    for (per_element, entry) in [(true, "elements"), (false, "row_outputs")] {
        let mine: Vec<usize> = (0..outputs.len())
            .filter(|&o| outputs[o].per_element == per_element)
            .collect();
        if mine.is_empty() {
            continue;
        }
        source += &w.outputs(outputs, &mine, entry);
        let mut group = vec![entry.to_string()];
        if mine.len() > 1 {
            for &o in &mine {
                let alone = format!("{entry}_{o}");
                source += &w.outputs(outputs, &[o], &alone);
                group.push(alone);
            }
        }
        groups.push(group);
    }
    let mut reductions = vec![Key::Input(usize::MAX); a.slot.len()];
    for (k, &s) in &a.slot {
        reductions[s] = *k;
    }
    let mut map = kernels()
        .lock()
        .map_err(|_| Error::Device("expression kernels: lock poisoned".into()))?;
    if let Some(c) = map.get(&source) {
        // Same source, same slots: the keys are this call's nodes.
        return Ok(Arc::new(Compiled {
            kernel: c.kernel,
            entries: c.entries.clone(),
            reductions,
        }));
    }
    let name: &'static str = Box::leak(format!("expr_{}", map.len()).into_boxed_str());
    let generated: &'static str = Box::leak(source.clone().into_boxed_str());
    let parts: &'static [&'static str] = Box::leak(
        vec![
            COMMON_DTYPE,
            COMMON_LAUNCH,
            COMMON_REDUCE,
            COMMON_SOFTCAP,
            "const WG: u32 = 256u;",
            EXPR_WGSL,
            generated,
        ]
        .into_boxed_slice(),
    );
    let kernel: &'static Kernel = Box::leak(Box::new(Kernel { name, parts }));
    let (module, info) = kernel.module()?;
    let n_inputs = inputs.len();
    let mut entries = Vec::new();
    for group in groups {
        let mut roled = Vec::new();
        for entry in group {
            let slots = entry_bindings(kernel, &module, &info, &entry)?;
            let roles = slots
                .iter()
                .filter(|s| s.binding > 0)
                .map(|s| {
                    let b = s.binding as usize - 1;
                    match b {
                        b if b < n_inputs => Role::Input(b),
                        b if b == n_inputs => Role::Stats,
                        b => Role::Output(b - n_inputs - 1),
                    }
                })
                .collect();
            roled.push(Entry { name: entry, roles });
        }
        entries.push(roled);
    }
    let compiled = Arc::new(Compiled {
        kernel,
        entries,
        reductions,
    });
    map.insert(source, compiled.clone());
    Ok(compiled)
}

#[derive(encase::ShaderType)]
struct Params {
    rows: u32,
    cols: u32,
    count: u32,
    pairs: u32,
    row_pairs: u32,
}

/// The problem's rows and columns.
#[derive(Debug, Clone, Copy)]
struct Extent {
    rows: usize,
    cols: usize,
}

impl Extent {
    fn params(self) -> Params {
        let count = self.rows * self.cols;
        Params {
            rows: self.rows as u32,
            cols: self.cols as u32,
            count: count as u32,
            pairs: count.div_ceil(2) as u32,
            row_pairs: self.rows.div_ceil(2) as u32,
        }
    }
}

/// Run every entry of `c`: the reductions (a workgroup a row), then the outputs.
fn run(
    engine: &Engine,
    c: &Compiled,
    x: Extent,
    inputs: &[Option<&Tensor>],
    stats: Option<&Tensor>,
    outputs: &[Tensor],
) -> Result<()> {
    let params = x.params();
    let limit = engine.info().limits.max_storage_buffers_per_shader_stage as usize;
    for group in &c.entries {
        let chosen = if group[0].roles.len() <= limit || group.len() == 1 {
            &group[..1]
        } else {
            &group[1..]
        };
        for entry in chosen {
            let mut buffers = Vec::new();
            for r in &entry.roles {
                let t = match *r {
                    Role::Input(i) => inputs.get(i).copied().flatten(),
                    Role::Stats => stats,
                    Role::Output(o) => outputs.get(o),
                };
                let t = t.ok_or_else(|| Error::Kernel {
                    kernel: c.kernel.name.into(),
                    message: format!("{}: no tensor for {r:?}", entry.name),
                })?;
                buffers.push(t.buffer());
            }
            engine.require_storage_buffers(buffers.len() as u32)?;
            let groups = if entry.name == "reduce_rows" {
                x.rows as u64
            } else if entry.name.starts_with("elements") {
                u64::from(params.pairs).div_ceil(WG)
            } else {
                u64::from(params.row_pairs).div_ceil(WG)
            };
            engine.launch(
                c.kernel,
                &entry.name,
                &Vec::new(),
                &params,
                &buffers,
                groups,
            )?;
        }
    }
    Ok(())
}

/// F32 statistics `[rows, m]` (none when `m` is 0).
fn statistics(engine: &Engine, x: Extent, m: usize, what: &str) -> Result<Option<Tensor>> {
    if m == 0 {
        return Ok(None);
    }
    Tensor::empty(engine, &[x.rows, m], DType::F32, what).map(Some)
}

static NEXT_OP: AtomicU64 = AtomicU64::new(1);

/// A compiled expression function: inputs of given kinds, one tensor per output. Output `o` is
/// shaped as the element inputs when its expression is element-level, else as their leading
/// axes (one value a row).
#[derive(Debug)]
pub struct ExprOp {
    id: u64,
    kinds: Vec<Kind>,
    outputs: Vec<Expr>,
}

/// What [`ExprOp::forward`] saves for the backward: the inputs (handles: they must stay
/// unchanged until the backward has run) and the row reductions' values (F32 `[rows, m]`).
#[derive(Debug, Clone)]
pub struct ExprSaved {
    op: u64,
    inputs: Vec<Tensor>,
    stats: Option<Tensor>,
    reductions: Vec<Key>,
}

impl ExprSaved {
    /// The saved row reductions, F32 `[rows, m]` (`None` without reductions).
    pub fn statistics(&self) -> Option<&Tensor> {
        self.stats.as_ref()
    }
}

impl ExprOp {
    /// A function of inputs read as `inputs` says computing `outputs`. At least one input must
    /// be [`Kind::Element`] (it gives the rows and columns).
    ///
    /// Errors: no outputs; no element input; an input index past `inputs` or read with another
    /// kind; a cast to a non-float dtype; more than [`MAX_NODES`] nodes.
    pub fn new(inputs: &[Kind], outputs: &[Expr]) -> Result<ExprOp> {
        if outputs.is_empty() {
            return Err(Error::bounds("expression: outputs", 0, 1, u64::MAX));
        }
        if !inputs.contains(&Kind::Element) {
            return Err(Error::InvalidValue {
                what: "expression: inputs".into(),
                got: inputs.len() as f64,
                rule: "one input at least must be Kind::Element".into(),
            });
        }
        let a = analyze(outputs, &HashMap::new())?;
        check_nodes(&a.order, Some(inputs))?;
        Ok(ExprOp {
            id: NEXT_OP.fetch_add(1, Ordering::Relaxed),
            kinds: inputs.to_vec(),
            outputs: outputs.to_vec(),
        })
    }

    /// The element inputs' shape, rows and columns, every input checked against its kind.
    fn extent(&self, inputs: &[&Tensor]) -> Result<(Vec<usize>, Extent)> {
        if inputs.len() != self.kinds.len() {
            return Err(Error::bounds(
                "expression: inputs",
                inputs.len() as u64,
                self.kinds.len() as u64,
                self.kinds.len() as u64,
            ));
        }
        let first = self
            .kinds
            .iter()
            .position(|k| *k == Kind::Element)
            .unwrap_or(0);
        let shape = inputs[first].shape().to_vec();
        let Some((&cols, lead)) = shape.split_last() else {
            return Err(Error::shape(
                format!("expression: input {first}"),
                &[1],
                &shape,
            ));
        };
        let rows: usize = lead.iter().product();
        let engine = inputs[first].engine();
        for (i, (t, kind)) in inputs.iter().zip(&self.kinds).enumerate() {
            let what = format!("expression: input {i}");
            t.check_engine(engine, &what)?;
            if !t.dtype().is_float() {
                return Err(Error::dtype(what, t.dtype(), &DType::FLOATS));
            }
            let ok = match kind {
                Kind::Element => t.shape() == shape.as_slice(),
                Kind::Row => t.shape() == lead,
                Kind::Column => t.shape() == [cols],
                Kind::Scalar => t.len() == 1,
            };
            if !ok {
                let expected = match kind {
                    Kind::Element => shape.clone(),
                    Kind::Row => lead.to_vec(),
                    Kind::Column => vec![cols],
                    Kind::Scalar => vec![1],
                };
                return Err(Error::shape(what, &expected, t.shape()));
            }
        }
        let count = rows.saturating_mul(cols);
        if count > u32::MAX as usize {
            return Err(Error::bounds(
                "expression: rows · cols",
                count as u64,
                0,
                u64::from(u32::MAX),
            ));
        }
        Ok((shape, Extent { rows, cols }))
    }

    fn output_shape(&self, o: usize, shape: &[usize]) -> Vec<usize> {
        if self.outputs[o].level() == Level::Element {
            shape.to_vec()
        } else {
            shape[..shape.len() - 1].to_vec()
        }
    }

    /// Evaluate the outputs, output `o` stored in `dtypes[o]`, and save what the backward needs.
    ///
    /// Errors: a count of inputs or dtypes that differs; an input of another engine, a non-float
    /// dtype, or a shape its kind does not allow (element inputs of one shape with at least one
    /// axis, row inputs of its leading axes, scalars of one element); rows · cols ≥ 2³²; a
    /// tensor past one binding; too few storage buffers on the device.
    pub fn forward(
        &self,
        inputs: &[&Tensor],
        dtypes: &[DType],
    ) -> Result<(Vec<Tensor>, ExprSaved)> {
        let (shape, x) = self.extent(inputs)?;
        if dtypes.len() != self.outputs.len() {
            return Err(Error::bounds(
                "expression: output dtypes",
                dtypes.len() as u64,
                self.outputs.len() as u64,
                self.outputs.len() as u64,
            ));
        }
        for (o, dt) in dtypes.iter().enumerate() {
            if !dt.is_float() {
                return Err(Error::dtype(
                    format!("expression: output {o}"),
                    *dt,
                    &DType::FLOATS,
                ));
            }
        }
        let specs: Vec<InputSpec> = self
            .kinds
            .iter()
            .zip(inputs)
            .map(|(k, t)| (*k, t.dtype()))
            .collect();
        let outs: Vec<OutputSpec> = self
            .outputs
            .iter()
            .zip(dtypes)
            .map(|(e, dt)| OutputSpec {
                expr: e.clone(),
                per_element: e.level() == Level::Element,
                dtype: *dt,
            })
            .collect();
        let c = compile(&specs, &outs, &HashMap::new(), 0)?;
        let engine = inputs[0].engine();
        let stats = statistics(engine, x, c.reductions.len(), "expression statistics")?;
        let outputs = (0..self.outputs.len())
            .map(|o| {
                Tensor::empty(
                    engine,
                    &self.output_shape(o, &shape),
                    dtypes[o],
                    "expression",
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let given: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        run(engine, &c, x, &given, stats.as_ref(), &outputs)?;
        let saved = ExprSaved {
            op: self.id,
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
            stats,
            reductions: c.reductions.clone(),
        };
        Ok((outputs, saved))
    }

    /// The gradient expressions of inputs `wrt` from cotangent inputs (input `n + o` the
    /// cotangent of output `o`, `n` the function's inputs).
    fn gradients(&self, given: &[bool], wrt: &[usize]) -> Result<Vec<Expr>> {
        let n = self.kinds.len();
        let mut seen = HashSet::new();
        for &i in wrt {
            if i >= n {
                return Err(Error::bounds(
                    "expression backward: wrt input",
                    i as u64,
                    0,
                    n as u64 - 1,
                ));
            }
            if !seen.insert(i) {
                return Err(Error::InvalidValue {
                    what: "expression backward: wrt".into(),
                    got: i as f64,
                    rule: "each input at most once".into(),
                });
            }
        }
        let cotangents: Vec<Option<Expr>> = self
            .outputs
            .iter()
            .enumerate()
            .map(|(o, y)| given[o].then(|| Expr::input(n + o, cotangent_kind(y))))
            .collect();
        let leaves: Vec<Expr> = wrt.iter().map(|&i| Expr::input(i, self.kinds[i])).collect();
        vjp(&self.outputs, &cotangents, &leaves)
    }

    /// Scratch bytes [`ExprOp::backward`] allocates for `rows` × `cols` and gradients of
    /// `wrt`: the statistics (a copy of the saved ones, then the backward's own row
    /// reductions; F32 a row each), the per-row parts of scalar
    /// inputs' gradients and the per-element parts of column inputs' (with their column sums'
    /// partials). Errors as the backward's for `wrt`.
    pub fn backward_workspace_bytes(&self, rows: usize, cols: usize, wrt: &[usize]) -> Result<u64> {
        let grads = self.gradients(&vec![true; self.outputs.len()], wrt)?;
        let saved: HashMap<Key, usize> = analyze(&self.outputs, &HashMap::new())?
            .slot
            .into_iter()
            .collect();
        let a = analyze(&grads, &saved)?;
        let mut bytes = ((saved.len() + a.slot.len()) * rows * 4) as u64;
        for &i in wrt {
            bytes += match self.kinds[i] {
                Kind::Scalar => (rows * 4) as u64,
                Kind::Column => {
                    ((rows * cols * 4) as u64)
                        + crate::reduce::sum_columns_workspace_bytes(rows, cols)
                }
                _ => 0,
            };
        }
        Ok(bytes)
    }

    /// One F32 gradient per input of `wrt` (in that order, shaped as the input) of
    /// `Σ_o ⟨cotangents[o], output o⟩`; `None` cotangents are zero. Inputs not in `wrt` are
    /// frozen coefficients. Reads the saved inputs and statistics, writes neither them nor the
    /// cotangents. A scalar input's gradient sums its per-row parts in row order.
    ///
    /// Errors: `saved` from another function; a count of cotangents that differs; a cotangent
    /// of another engine, a non-float dtype or a shape other than its output's; a `wrt` index
    /// past the inputs or named twice; scratch past the workspace bound; the forward's limits.
    pub fn backward(
        &self,
        saved: &ExprSaved,
        cotangents: &[Option<&Tensor>],
        wrt: &[usize],
    ) -> Result<Vec<Tensor>> {
        if saved.op != self.id {
            return Err(Error::InvalidValue {
                what: "expression backward: saved".into(),
                got: saved.op as f64,
                rule: format!("saved by another function (this one is {})", self.id),
            });
        }
        if cotangents.len() != self.outputs.len() {
            return Err(Error::bounds(
                "expression backward: cotangents",
                cotangents.len() as u64,
                self.outputs.len() as u64,
                self.outputs.len() as u64,
            ));
        }
        let refs: Vec<&Tensor> = saved.inputs.iter().collect();
        let (shape, x) = self.extent(&refs)?;
        let engine = refs[0].engine();
        for (o, c) in cotangents.iter().enumerate() {
            if let Some(c) = c {
                let what = format!("expression backward: cotangent {o}");
                c.check_engine(engine, &what)?;
                if !c.dtype().is_float() {
                    return Err(Error::dtype(what, c.dtype(), &DType::FLOATS));
                }
                let want = self.output_shape(o, &shape);
                if c.shape() != want.as_slice() {
                    return Err(Error::shape(what, &want, c.shape()));
                }
            }
        }
        let given: Vec<bool> = cotangents.iter().map(Option::is_some).collect();
        let grads = self.gradients(&given, wrt)?;
        let mut specs: Vec<InputSpec> = self
            .kinds
            .iter()
            .zip(&saved.inputs)
            .map(|(k, t)| (*k, t.dtype()))
            .collect();
        for (y, c) in self.outputs.iter().zip(cotangents) {
            specs.push((cotangent_kind(y), c.map_or(DType::F32, Tensor::dtype)));
        }
        let outs: Vec<OutputSpec> = wrt
            .iter()
            .zip(&grads)
            .map(|(&i, g)| OutputSpec {
                expr: g.clone(),
                per_element: self.kinds[i].level() == Level::Element,
                dtype: DType::F32,
            })
            .collect();
        let slots: HashMap<Key, usize> = saved
            .reductions
            .iter()
            .enumerate()
            .map(|(s, k)| (*k, s))
            .collect();
        let c = compile(&specs, &outs, &slots, saved.reductions.len())?;
        engine.check_workspace(
            "expression backward",
            self.backward_workspace_bytes(x.rows, x.cols, wrt)?,
        )?;
        // The saved statistics copied ahead of the backward's own, so that one binding holds
        // both.
        let width = saved.reductions.len() + c.reductions.len();
        let stats = statistics(engine, x, width, "expression backward statistics")?;
        if let (Some(from), Some(to)) = (&saved.stats, &stats) {
            engine.record(|e| {
                e.copy_buffer_to_buffer(from.buffer(), 0, to.buffer(), 0, from.byte_len())
            });
        }
        let lead = &shape[..shape.len() - 1];
        let raw = wrt
            .iter()
            .map(|&i| {
                let s = if self.kinds[i].level() == Level::Element {
                    &shape[..]
                } else {
                    lead
                };
                Tensor::empty(engine, s, DType::F32, "expression gradient")
            })
            .collect::<Result<Vec<_>>>()?;
        let mut inputs: Vec<Option<&Tensor>> = saved.inputs.iter().map(Some).collect();
        inputs.extend(cotangents.iter().copied());
        run(engine, &c, x, &inputs, stats.as_ref(), &raw)?;
        wrt.iter()
            .zip(raw)
            .map(|(&i, g)| {
                // Column and scalar inputs: the per-element (per-row) parts summed over the
                // rows in row order.
                let want = saved.inputs[i].shape();
                match self.kinds[i] {
                    Kind::Element | Kind::Row => Ok(g),
                    _ if x.rows == 0 => Tensor::zeros(engine, want, DType::F32),
                    Kind::Column => crate::reduce::sum_columns(&g.reshape(&[x.rows, x.cols])?),
                    Kind::Scalar => crate::reduce::sum_partials(engine, &g.reshape(&[x.rows, 1])?)?
                        .reshape(want),
                }
            })
            .collect()
    }
}

impl Kind {
    fn level(self) -> Level {
        match self {
            Kind::Element | Kind::Column => Level::Element,
            Kind::Row | Kind::Scalar => Level::Row,
        }
    }
}

fn cotangent_kind(output: &Expr) -> Kind {
    match output.level() {
        Level::Element => Kind::Element,
        Level::Row => Kind::Row,
    }
}
