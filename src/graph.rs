//! Typed attention graphs with a tape: softmax attention ([`crate::attention`]), dual chunk
//! attention ([`crate::dual_chunk`]) and gated delta recurrences ([`crate::gated_delta`],
//! Gated DeltaNet and the KDA core) as explicit nodes of a graph, run forward with a tape and
//! backward from the outputs' cotangents to every graph input's gradient.
//!
//! A [`GraphBuilder`] names the graph's inputs and adds nodes, each taking earlier values (inputs
//! or outputs of earlier nodes) and giving its outputs: attention one, dual chunk attention
//! one, a gated delta recurrence two (the output and the final state, so a state can feed the
//! next recurrence's initial state). The node kinds stay distinct: nothing is rewritten from
//! one mechanism into another. [`GraphBuilder::build`] picks the graph's outputs.
//!
//! [`AttentionGraph::forward`] runs the nodes in order and keeps nothing;
//! [`AttentionGraph::forward_with_tape`] also returns a [`GraphTape`]: every node's saved
//! context and every value. [`AttentionGraph::backward`] takes the tape and one cotangent per
//! graph output (`None`: zero) and returns one F32 gradient per graph input, in input order:
//! the nodes' backwards in reverse order, each value's cotangent the sum of its uses'
//! contributions (and of every listing of it among the outputs), added in F32 in the order
//! they arrive (reverse node order, then input order within a node), without atomics, so
//! reruns give the same bits. An input no output depends on gets zeros. The backward writes
//! neither the inputs nor the cotangents; the inputs must stay unchanged until it has run (the
//! tape holds handles, not copies). Memory: the tape holds every node's saved context (see
//! each operator's) and every value; no per-operator workspace bound covers the whole tape.

use crate::attention::{self, AttentionOptions, AttentionSaved};
use crate::dual_chunk::{self, DualChunkOptions, DualChunkQueries, DualChunkSaved};
use crate::error::{Error, Result};
use crate::gated_delta::{self, GatedDeltaOptions, GatedDeltaSaved};
use crate::{DType, Tensor};

/// A value of a graph: one of its inputs or an output of one of its nodes (valid only in the
/// builder that made it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value(usize);

/// One node: its inputs (values) and options.
#[derive(Debug, Clone)]
enum Node {
    /// q, k, v → output.
    Attention {
        qkv: [Value; 3],
        options: AttentionOptions,
    },
    /// intra, successive, inter queries, k, v → output.
    DualChunk {
        inputs: [Value; 5],
        options: DualChunkOptions,
    },
    /// q, k, v, β, log decay, optional initial state → output, final state.
    GatedDelta {
        inputs: [Value; 5],
        initial_state: Option<Value>,
        options: GatedDeltaOptions,
    },
}

impl Node {
    fn outputs(&self) -> usize {
        match self {
            Node::GatedDelta { .. } => 2,
            _ => 1,
        }
    }

    fn inputs(&self) -> Vec<Value> {
        match self {
            Node::Attention { qkv, .. } => qkv.to_vec(),
            Node::DualChunk { inputs, .. } => inputs.to_vec(),
            Node::GatedDelta {
                inputs,
                initial_state,
                ..
            } => inputs.iter().copied().chain(*initial_state).collect(),
        }
    }
}

/// Builds an [`AttentionGraph`].
#[derive(Debug, Clone, Default)]
pub struct GraphBuilder {
    names: Vec<String>,
    nodes: Vec<Node>,
    /// Values so far: the inputs, then each node's outputs.
    values: usize,
    /// The first value that refers to nothing yet, if any was passed (reported by `build`).
    invalid: Option<usize>,
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// A graph input named `name` (the names are for messages). Inputs come before any node.
    pub fn input(&mut self, name: &str) -> Value {
        if !self.nodes.is_empty() {
            self.invalid.get_or_insert(self.values);
        }
        self.names.push(name.to_string());
        self.push_values(1)
    }

    fn push_values(&mut self, n: usize) -> Value {
        let first = self.values;
        self.values += n;
        Value(first)
    }

    fn add(&mut self, node: Node) -> Value {
        for v in node.inputs() {
            if v.0 >= self.values {
                self.invalid.get_or_insert(v.0);
            }
        }
        let n = node.outputs();
        self.nodes.push(node);
        self.push_values(n)
    }

    /// Softmax attention of `q` over `k`, `v` ([`attention::attention_forward`]): its output.
    pub fn attention(&mut self, q: Value, k: Value, v: Value, options: AttentionOptions) -> Value {
        self.add(Node::Attention {
            qkv: [q, k, v],
            options,
        })
    }

    /// Dual chunk attention of the three query branches over `k`, `v`
    /// ([`dual_chunk::dual_chunk_attention`]): its output.
    pub fn dual_chunk_attention(
        &mut self,
        [intra, successive, inter]: [Value; 3],
        k: Value,
        v: Value,
        options: DualChunkOptions,
    ) -> Value {
        self.add(Node::DualChunk {
            inputs: [intra, successive, inter, k, v],
            options,
        })
    }

    /// A gated delta recurrence ([`gated_delta::gated_delta_forward`], dense `[B, T, H, D]`
    /// q, k, v): its output and final state.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta(
        &mut self,
        q: Value,
        k: Value,
        v: Value,
        beta: Value,
        log_decay: Value,
        initial_state: Option<Value>,
        options: GatedDeltaOptions,
    ) -> (Value, Value) {
        let out = self.add(Node::GatedDelta {
            inputs: [q, k, v, beta, log_decay],
            initial_state,
            options,
        });
        (out, Value(out.0 + 1))
    }

    /// The graph with these outputs (a value may be listed more than once). Errors: no output,
    /// or a value this builder did not make, or an input added after a node (`InvalidValue`).
    pub fn build(self, outputs: &[Value]) -> Result<AttentionGraph> {
        let bad = outputs
            .iter()
            .map(|v| v.0)
            .find(|&v| v >= self.values)
            .or(self.invalid);
        if let Some(v) = bad {
            return Err(Error::InvalidValue {
                what: "attention graph: value".into(),
                got: v as f64,
                rule: format!(
                    "one of this builder's {} values, inputs before the first node",
                    self.values
                ),
            });
        }
        if outputs.is_empty() {
            return Err(Error::InvalidValue {
                what: "attention graph: outputs".into(),
                got: 0.0,
                rule: "at least one".into(),
            });
        }
        Ok(AttentionGraph {
            names: self.names,
            nodes: self.nodes,
            outputs: outputs.to_vec(),
        })
    }
}

/// A built graph: run it with [`AttentionGraph::forward`] or
/// [`AttentionGraph::forward_with_tape`] and [`AttentionGraph::backward`].
#[derive(Debug, Clone)]
pub struct AttentionGraph {
    names: Vec<String>,
    nodes: Vec<Node>,
    outputs: Vec<Value>,
}

/// A node's saved context.
#[derive(Debug, Clone)]
enum NodeSaved {
    Attention(AttentionSaved),
    DualChunk(Box<DualChunkSaved>),
    GatedDelta(GatedDeltaSaved),
}

/// What [`AttentionGraph::backward`] needs: every value of a forward and every node's saved
/// context.
#[derive(Debug, Clone)]
pub struct GraphTape {
    values: Vec<Tensor>,
    saved: Vec<NodeSaved>,
}

/// A value's cotangent so far: a tensor and whether it is the graph's own (may be added into
/// in place) or a caller's.
struct Cotangent {
    tensor: Tensor,
    own: bool,
}

/// Adds `t` (F32 or a caller's 16-bit cotangent, widened) into the cotangent of a value shaped
/// `shape`. Errors: another shape (`ShapeMismatch`).
fn accumulate(slot: &mut Option<Cotangent>, t: Tensor, own: bool, shape: &[usize]) -> Result<()> {
    if t.shape() != shape {
        return Err(Error::shape("attention graph: cotangent", shape, t.shape()));
    }
    let (t, own) = if t.dtype() == DType::F32 {
        (t, own)
    } else {
        (crate::cast::cast(&t, DType::F32)?, true)
    };
    match slot {
        None => *slot = Some(Cotangent { tensor: t, own }),
        Some(c) => {
            if !c.own {
                c.tensor = copy(&c.tensor)?;
                c.own = true;
            }
            attention::add_tensors(&c.tensor, &t)?;
        }
    }
    Ok(())
}

fn other_tape() -> Error {
    Error::InvalidValue {
        what: "attention graph: tape".into(),
        got: 0.0,
        rule: "a tape of this graph's forward".into(),
    }
}

/// A copy of an F32 tensor (its bits).
fn copy(t: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(
        t.engine(),
        t.shape(),
        t.dtype(),
        "attention graph cotangent",
    )?;
    let bytes = t.byte_len();
    t.engine()
        .record(|enc| enc.copy_buffer_to_buffer(t.buffer(), 0, out.buffer(), 0, bytes));
    Ok(out)
}

impl AttentionGraph {
    /// The inputs' names, in input order.
    pub fn input_names(&self) -> &[String] {
        &self.names
    }

    /// Runs the graph on `inputs` (one tensor per input, in order): its outputs, in output
    /// order (a value listed twice is the same tensor twice). Nothing is kept. Errors: another
    /// number of inputs (`InvalidValue`); the nodes' own.
    pub fn forward(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Ok(self.run(inputs)?.0)
    }

    /// [`AttentionGraph::forward`], and the tape the backward needs.
    pub fn forward_with_tape(&self, inputs: &[&Tensor]) -> Result<(Vec<Tensor>, GraphTape)> {
        let (outputs, values, saved) = self.run(inputs)?;
        Ok((outputs, GraphTape { values, saved }))
    }

    fn run(&self, inputs: &[&Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>, Vec<NodeSaved>)> {
        if inputs.len() != self.names.len() {
            return Err(Error::InvalidValue {
                what: "attention graph: inputs".into(),
                got: inputs.len() as f64,
                rule: format!("one tensor per input ({})", self.names.len()),
            });
        }
        let mut values: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
        let mut saved = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let at = |v: &Value| &values[v.0];
            let (outs, s) = match node {
                Node::Attention { qkv, options } => {
                    let [q, k, v] = qkv.each_ref().map(at);
                    let (out, s) = attention::attention_forward(q, k, v, options)?;
                    (vec![out], NodeSaved::Attention(s))
                }
                Node::DualChunk { inputs, options } => {
                    let [intra, successive, inter, k, v] = inputs.each_ref().map(at);
                    let queries = DualChunkQueries {
                        intra,
                        successive,
                        inter,
                    };
                    let (out, s) = dual_chunk::dual_chunk_attention(queries, k, v, options)?;
                    (vec![out], NodeSaved::DualChunk(Box::new(s)))
                }
                Node::GatedDelta {
                    inputs,
                    initial_state,
                    options,
                } => {
                    let [q, k, v, beta, log_decay] = inputs.each_ref().map(at);
                    let init = initial_state.as_ref().map(at);
                    let (out, s) =
                        gated_delta::gated_delta_forward(q, k, v, beta, log_decay, init, options)?;
                    (vec![out.output, out.final_state], NodeSaved::GatedDelta(s))
                }
            };
            values.extend(outs);
            saved.push(s);
        }
        let outputs = self.outputs.iter().map(|v| values[v.0].clone()).collect();
        Ok((outputs, values, saved))
    }

    /// Gradients of every graph input (F32, the input's shape, in input order) from one
    /// cotangent per graph output (`None`: zero; any float dtype, the output's shape). Errors:
    /// another number of cotangents (`InvalidValue`); a cotangent of another shape
    /// (`ShapeMismatch`) or of a non-float dtype (`UnsupportedDType`); the nodes' own.
    pub fn backward(
        &self,
        tape: &GraphTape,
        cotangents: &[Option<&Tensor>],
    ) -> Result<Vec<Tensor>> {
        if cotangents.len() != self.outputs.len() {
            return Err(Error::InvalidValue {
                what: "attention graph: cotangents".into(),
                got: cotangents.len() as f64,
                rule: format!("one per output ({})", self.outputs.len()),
            });
        }
        let values = &tape.values;
        let count = self.names.len() + self.nodes.iter().map(Node::outputs).sum::<usize>();
        if values.len() != count || tape.saved.len() != self.nodes.len() {
            return Err(other_tape());
        }
        let engine = values.first().map(Tensor::engine);
        let mut grads: Vec<Option<Cotangent>> = values.iter().map(|_| None).collect();
        for (v, c) in self.outputs.iter().zip(cotangents) {
            if let Some(c) = c {
                if !c.dtype().is_float() {
                    return Err(Error::dtype(
                        "attention graph: cotangent",
                        c.dtype(),
                        &DType::FLOATS,
                    ));
                }
                if let Some(e) = engine {
                    c.check_engine(e, "attention graph: cotangent")?;
                }
                accumulate(&mut grads[v.0], (*c).clone(), false, values[v.0].shape())?;
            }
        }
        // Each node's first output value.
        let mut first = self.names.len();
        let firsts: Vec<usize> = self
            .nodes
            .iter()
            .map(|n| {
                let f = first;
                first += n.outputs();
                f
            })
            .collect();
        for ((node, saved), &out) in self.nodes.iter().zip(&tape.saved).zip(&firsts).rev() {
            let cot = |i: usize| grads[out + i].as_ref().map(|c| &c.tensor);
            let contributions: Vec<(Value, Tensor)> = match (node, saved) {
                (Node::Attention { qkv, .. }, NodeSaved::Attention(s)) => {
                    let Some(d) = cot(0) else { continue };
                    let g = attention::attention_backward(s, d)?;
                    qkv.iter().copied().zip([g.query, g.key, g.value]).collect()
                }
                (Node::DualChunk { inputs, .. }, NodeSaved::DualChunk(s)) => {
                    let Some(d) = cot(0) else { continue };
                    let g = dual_chunk::dual_chunk_attention_backward(s, d)?;
                    let all = [g.intra, g.successive, g.inter, g.key, g.value];
                    inputs.iter().copied().zip(all).collect()
                }
                (
                    Node::GatedDelta {
                        inputs,
                        initial_state,
                        ..
                    },
                    NodeSaved::GatedDelta(s),
                ) => {
                    if cot(0).is_none() && cot(1).is_none() {
                        continue;
                    }
                    let g = gated_delta::gated_delta_backward(s, cot(0), cot(1))?;
                    let all = [g.query, g.key, g.value, g.beta, g.log_decay];
                    let mut c: Vec<(Value, Tensor)> = inputs.iter().copied().zip(all).collect();
                    c.extend(initial_state.map(|v| (v, g.initial_state)));
                    c
                }
                _ => return Err(other_tape()),
            };
            for (v, t) in contributions {
                accumulate(&mut grads[v.0], t, true, values[v.0].shape())?;
            }
        }
        grads
            .into_iter()
            .zip(values)
            .take(self.names.len())
            .map(|(g, x)| match g {
                Some(c) if c.own => Ok(c.tensor),
                // A graph input listed as an output: its cotangent, copied.
                Some(c) => copy(&c.tensor),
                None => Tensor::zeros(x.engine(), x.shape(), DType::F32),
            })
            .collect()
    }
}
