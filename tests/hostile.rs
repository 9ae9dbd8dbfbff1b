//! Hostile inputs: the public entries of every operator family (normalization, activation,
//! RoPE, losses, dense products, embedding, fused linear heads, MLP, attention, dual chunk
//! attention, gated delta, GRPO, preference), the casts, reductions and optimizers, given tensors of every dtype and of
//! degenerate shapes (no axes, zero-length axes, lengths that match nothing, another engine's
//! tensors) in each argument, and option values outside their domains (NaN, ±∞, zero,
//! negative, past the bounds), return `Ok` or a typed `Err`: none panics. Afterwards the
//! engine still computes a correct result.
//!
//! Each sweep starts from a valid call (which must succeed) and replaces one argument at a
//! time, so every hostile value meets otherwise valid company.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use common::engine;
use wgrad::activation::{self, Activation, ActivationOptions};
use wgrad::embedding::{self, EmbeddingOptions};
use wgrad::fused_linear::{self, Chunking, FusedLinearCrossEntropyOptions, LinearHead};
use wgrad::loss::{self, CrossEntropyOptions, DivReduction, Reduction};
use wgrad::matmul::{self, MatmulOptions};
use wgrad::norm::{self, GroupNormOptions, LayerNormOptions, PolyNormOptions, RmsNormOptions};
use wgrad::rope::{self, RopeOptions, RopeQkOptions, RopeScaling};
use wgrad::{DType, Engine, Error, Result, Tensor};

const DTYPES: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32];

/// Shapes of the pool: no axes, zero-length axes, lengths that fit the bases' and lengths that
/// fit nothing.
const SHAPES: [&[usize]; 13] = [
    &[],
    &[0],
    &[1],
    &[3],
    &[8],
    &[2, 0],
    &[0, 8],
    &[2, 8],
    &[3, 8],
    &[4, 2],
    &[2, 2, 8],
    &[1, 2, 2, 8],
    &[2, 4, 2, 8],
];

/// A tensor of `shape` and `dtype` with small values: floats in [-2, 2], integers in
/// {-100, -1, 0, 1, 2, 7, 2^30} (targets, indices and positions in and out of range).
fn make(engine: &Engine, shape: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    match dtype {
        DType::I32 => {
            let pick = [-100, -1, 0, 1, 2, 7, 1 << 30];
            let v: Vec<i32> = (0..n)
                .map(|i| pick[(i + seed as usize) % pick.len()])
                .collect();
            Tensor::from_slice(engine, &v, shape)
        }
        DType::U32 => {
            let v: Vec<u32> = (0..n).map(|i| ((i as u64 + seed) % 9) as u32).collect();
            Tensor::from_slice(engine, &v, shape)
        }
        _ => {
            let v: Vec<f32> = common::random_f32(seed, n)
                .iter()
                .map(|x| 2.0 * x)
                .collect();
            let t = Tensor::from_slice(engine, &v, shape)?;
            wgrad::cast::cast(&t, dtype)
        }
    }
}

/// The hostile tensors: every shape in every dtype, and three of another engine.
fn pool() -> &'static Vec<(String, Tensor)> {
    static POOL: std::sync::OnceLock<Vec<(String, Tensor)>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let e = engine();
        let mut out = Vec::new();
        for (i, shape) in SHAPES.iter().enumerate() {
            for dtype in DTYPES {
                // A shape the engine refuses to hold is itself a typed error, never a panic.
                match catch_unwind(AssertUnwindSafe(|| make(e, shape, dtype, i as u64))) {
                    Ok(Ok(t)) => out.push((format!("{dtype:?}{shape:?}"), t)),
                    Ok(Err(_)) => {}
                    Err(_) => panic!("making a {dtype:?} tensor of shape {shape:?} panicked"),
                }
            }
        }
        let other = common::private_engine();
        for (shape, dtype) in [
            (&[2usize, 8][..], DType::F32),
            (&[3, 8][..], DType::F32),
            (&[2, 2, 8][..], DType::BF16),
        ] {
            let t = make(&other, shape, dtype, 99).expect("another engine's tensor");
            out.push((format!("other engine {dtype:?}{shape:?}"), t));
        }
        out
    })
}

/// Calls made on one engine and the panics they raised. `full`: sweep the pool through every
/// argument (the shared engine); otherwise only the valid calls and the hostile option values
/// (engines with tight limits, which may refuse even the valid calls).
struct Tally {
    engine: Engine,
    full: bool,
    ok: usize,
    err: usize,
    panics: Vec<String>,
}

impl Tally {
    fn on(engine: &Engine, full: bool) -> Tally {
        Tally {
            engine: engine.clone(),
            full,
            ok: 0,
            err: 0,
            panics: Vec::new(),
        }
    }

    /// The result of a call that a later step needs (a saved context): `None` when it was
    /// refused (only a tight engine may refuse it) or panicked (recorded).
    fn get<T>(&mut self, what: &str, f: impl FnOnce() -> Result<T>) -> Option<T> {
        let mut out = None;
        self.call(what, || {
            out = Some(f()?);
            Ok(())
        });
        assert!(
            out.is_some() || !self.full || !self.panics.is_empty(),
            "{what}: refused on the shared engine"
        );
        out
    }

    /// One call; a panic is recorded with `what`.
    fn call(&mut self, what: &str, f: impl FnOnce() -> Result<()>) {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => self.ok += 1,
            Ok(Err(_)) => self.err += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                self.panics.push(format!("{what}: {msg}"));
            }
        }
    }

    /// The valid call `f(base)` (which must succeed), then `f` with each argument in turn
    /// replaced by each pool tensor.
    fn sweep(&mut self, op: &str, base: &[&Tensor], f: impl Fn(&[&Tensor]) -> Result<()>) {
        if !self.full {
            self.call(op, || f(base));
            return;
        }
        match catch_unwind(AssertUnwindSafe(|| f(base))) {
            Ok(Ok(())) => self.ok += 1,
            Ok(Err(e)) => panic!("{op}: the valid base call failed: {e}"),
            Err(_) => panic!("{op}: the valid base call panicked"),
        }
        for slot in 0..base.len() {
            for (name, t) in pool() {
                let mut args = base.to_vec();
                args[slot] = t;
                self.call(&format!("{op}, argument {slot} = {name}"), || f(&args));
            }
        }
    }

    /// `f` once per hostile value (each call is expected to be refused or to succeed, never to
    /// panic).
    fn values<V: std::fmt::Debug + Copy>(
        &mut self,
        op: &str,
        values: &[V],
        f: impl Fn(V) -> Result<()>,
    ) {
        for &v in values {
            self.call(&format!("{op} with {v:?}"), || f(v));
        }
    }

    fn assert_clean(&self, family: &str) {
        eprintln!(
            "{family}: {} calls, {} ok, {} refused, {} panics",
            self.ok + self.err + self.panics.len(),
            self.ok,
            self.err,
            self.panics.len()
        );
        assert!(
            self.panics.is_empty(),
            "{family}: {} calls panicked:\n{}",
            self.panics.len(),
            self.panics.join("\n")
        );
        assert!(
            self.err > 0 && self.ok > 0,
            "{family}: the sweep must both pass and refuse calls"
        );
    }
}

/// Out-of-domain floats for ε, multipliers, smoothing, β and the like.
const BAD_F32: [f32; 7] = [
    0.0,
    -1.0,
    -0.0,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1e30,
];

/// The value of a call that later steps need, or the end of the family's sweep when the
/// (tight) engine refused it.
macro_rules! need {
    ($t:expr, $what:expr, $call:expr) => {
        match $t.get($what, || $call) {
            Some(v) => v,
            None => return,
        }
    };
}

fn f32_tensor(e: &Engine, shape: &[usize], seed: u64) -> Tensor {
    make(e, shape, DType::F32, seed).unwrap()
}

fn int_tensor(e: &Engine, values: &[i32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(e, values, shape).unwrap()
}

/// After a sweep the engine must still compute: RMSNorm of two known rows against the host.
fn assert_engine_still_computes(e: &Engine) {
    let x = f32_tensor(e, &[2, 8], 5);
    let (y, _) = norm::rms_norm(&x, None, &RmsNormOptions::default()).unwrap();
    let xs = x.to_f64().unwrap();
    let ys = y.to_f64().unwrap();
    for (row, got) in xs.chunks(8).zip(ys.chunks(8)) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 8.0;
        let inv = 1.0 / (ms + 1e-5).sqrt();
        for (v, g) in row.iter().zip(got) {
            assert!(
                (v * inv - g).abs() < 1e-5,
                "rms_norm after the sweep: {g} against {}",
                v * inv
            );
        }
    }
}

fn norms(t: &mut Tally) {
    let e = t.engine.clone();
    let x = f32_tensor(&e, &[3, 8], 1);
    let w = f32_tensor(&e, &[8], 2);
    let b = f32_tensor(&e, &[8], 3);
    let dy = f32_tensor(&e, &[3, 8], 4);
    let rms = RmsNormOptions::default();
    t.sweep("rms_norm", &[&x, &w], |a| {
        norm::rms_norm(a[0], Some(a[1]), &rms).map(drop)
    });
    t.values("rms_norm eps", &BAD_F32, |eps| {
        norm::rms_norm(&x, Some(&w), &RmsNormOptions { eps, ..rms }).map(drop)
    });
    t.values("rms_norm offset", &BAD_F32, |offset| {
        norm::rms_norm(&x, Some(&w), &RmsNormOptions { offset, ..rms }).map(drop)
    });
    let ln = LayerNormOptions::default();
    t.sweep("layer_norm", &[&x, &w, &b], |a| {
        norm::layer_norm(a[0], Some(a[1]), Some(a[2]), &ln).map(drop)
    });
    t.values("layer_norm eps", &BAD_F32, |eps| {
        norm::layer_norm(&x, Some(&w), Some(&b), &LayerNormOptions { eps }).map(drop)
    });
    t.sweep("add_rms_norm", &[&x, &dy, &w], |a| {
        norm::add_rms_norm(a[0], a[1], Some(a[2]), &rms).map(drop)
    });
    let mods = f32_tensor(&e, &[1, 8], 6);
    t.sweep("modulated_rms_norm", &[&x, &w, &mods, &mods], |a| {
        norm::modulated_rms_norm(a[0], Some(a[1]), a[2], a[3], &rms).map(drop)
    });
    let gx = f32_tensor(&e, &[2, 4, 2, 8], 7);
    let gw = f32_tensor(&e, &[4], 8);
    let gn = GroupNormOptions::default();
    t.sweep("group_norm", &[&gx, &gw, &gw], |a| {
        norm::group_norm(a[0], 2, Some(a[1]), Some(a[2]), &gn).map(drop)
    });
    t.values("group_norm groups", &[0usize, 3, 5, usize::MAX], |g| {
        norm::group_norm(&gx, g, Some(&gw), Some(&gw), &gn).map(drop)
    });
    let scalar = f32_tensor(&e, &[1], 9);
    t.sweep("dyt", &[&x, &scalar, &w, &b], |a| {
        norm::dyt(a[0], a[1], a[2], Some(a[3])).map(drop)
    });
    let pw = f32_tensor(&e, &[3], 10);
    t.sweep("poly_norm", &[&x, &pw, &scalar], |a| {
        norm::poly_norm(a[0], a[1], Some(a[2]), &PolyNormOptions::default()).map(drop)
    });
    t.values("poly_norm eps", &BAD_F32, |eps| {
        norm::poly_norm(&x, &pw, None, &PolyNormOptions { eps }).map(drop)
    });

    // Backwards: every cotangent slot and every requested dtype.
    let saved = [
        need!(t, "rms_norm", norm::rms_norm(&x, Some(&w), &rms)).1,
        need!(
            t,
            "layer_norm",
            norm::layer_norm(&x, Some(&w), Some(&b), &ln)
        )
        .1,
        need!(
            t,
            "add_rms_norm",
            norm::add_rms_norm(&x, &dy, Some(&w), &rms)
        )
        .2,
        need!(
            t,
            "modulated_rms_norm",
            norm::modulated_rms_norm(&x, Some(&w), &mods, &mods, &rms)
        )
        .1,
    ];
    for (i, s) in saved.iter().enumerate() {
        // Only add+RMSNorm has a residual-sum output, so only it takes that cotangent.
        if i == 2 {
            t.sweep("norm_backward add", &[&dy, &dy], |a| {
                norm::norm_backward(s, a[0], Some(a[1])).map(drop)
            });
        } else {
            t.sweep(&format!("norm_backward {i}"), &[&dy], |a| {
                norm::norm_backward(s, a[0], None).map(drop)
            });
            t.call(
                &format!("norm_backward {i} with a residual cotangent"),
                || norm::norm_backward(s, &dy, Some(&dy)).map(drop),
            );
        }
        t.values(&format!("norm_backward_as {i}"), &DTYPES, |d| {
            norm::norm_backward_as(s, &dy, None, d).map(drop)
        });
    }
    let g = need!(
        t,
        "group_norm",
        norm::group_norm(&gx, 2, Some(&gw), Some(&gw), &gn)
    )
    .1;
    let gdy = f32_tensor(&e, &[2, 4, 2, 8], 11);
    t.sweep("group_norm backward", &[&gdy], |a| {
        norm::norm_backward(&g, a[0], None).map(drop)
    });
    let d = need!(t, "dyt", norm::dyt(&x, &scalar, &w, Some(&b))).1;
    t.sweep("dyt_backward", &[&dy], |a| {
        norm::dyt_backward(&d, a[0]).map(drop)
    });
    let p = need!(
        t,
        "poly_norm",
        norm::poly_norm(&x, &pw, Some(&scalar), &PolyNormOptions::default())
    )
    .1;
    t.sweep("poly_norm_backward", &[&dy], |a| {
        norm::poly_norm_backward(&p, a[0]).map(drop)
    });
}

fn activations(t: &mut Tally) {
    let e = t.engine.clone();
    let g = f32_tensor(&e, &[3, 8], 1);
    let u = f32_tensor(&e, &[3, 8], 2);
    let packed = f32_tensor(&e, &[3, 8], 3);
    let half_dy = f32_tensor(&e, &[3, 4], 4);
    let opts = ActivationOptions::default();
    for kind in [Activation::Silu, Activation::Gelu, Activation::Relu] {
        t.sweep(&format!("{kind:?} gated"), &[&g, &u], |a| {
            activation::forward(kind, a[0], Some(a[1]), &opts).map(drop)
        });
        t.sweep(&format!("{kind:?} packed"), &[&packed], |a| {
            activation::packed_forward(kind, a[0], &opts).map(drop)
        });
    }
    t.values("gate multiplier", &BAD_F32, |m| {
        let o = ActivationOptions {
            gate_multiplier: m,
            ..opts
        };
        activation::forward(Activation::Silu, &g, Some(&u), &o).map(drop)
    });
    t.values("down multiplier", &BAD_F32, |m| {
        let o = ActivationOptions {
            down_multiplier: m,
            ..opts
        };
        activation::forward(Activation::Silu, &g, None, &o).map(drop)
    });
    let gated = need!(t, "swiglu", activation::swiglu(&g, &u)).1;
    let unary = need!(t, "silu", activation::silu(&g)).1;
    let pk = need!(t, "swiglu_packed", activation::swiglu_packed(&packed)).1;
    for (name, saved, dy) in [
        ("gated", &gated, &u),
        ("unary", &unary, &u),
        ("packed", &pk, &half_dy),
    ] {
        t.sweep(&format!("backward {name}"), &[dy], |a| {
            activation::backward(saved, a[0]).map(drop)
        });
        t.values(&format!("backward_as {name}"), &DTYPES, |d| {
            activation::backward_as(saved, dy, d).map(drop)
        });
    }
    t.sweep("erf", &[&g], |a| activation::erf(a[0]).map(drop));
}

fn rope_family(t: &mut Tally) {
    let e = t.engine.clone();
    // values [rows 4, dim 8] with tables [4, 4].
    let v = f32_tensor(&e, &[4, 8], 1);
    let cos = f32_tensor(&e, &[4, 4], 2);
    let sin = f32_tensor(&e, &[4, 4], 3);
    let o = RopeOptions::default();
    t.sweep("rope forward", &[&v, &cos, &sin], |a| {
        rope::forward(a[0], a[1], a[2], &o).map(drop)
    });
    t.values(
        "rope rotary_dim",
        &[Some(0usize), Some(3), Some(6), Some(10), Some(usize::MAX)],
        |r| rope::forward(&v, &cos, &sin, &RopeOptions { rotary_dim: r, ..o }).map(drop),
    );
    let saved = need!(
        t,
        "saved",
        rope::forward(
            &v,
            &cos,
            &sin,
            &RopeOptions {
                table_grads: true,
                ..o
            },
        )
    )
    .1;
    t.sweep("rope backward", &[&v], |a| {
        rope::backward(&saved, a[0]).map(drop)
    });
    t.values("rope backward_as", &DTYPES, |d| {
        rope::backward_as(&saved, &v, d).map(drop)
    });

    // q [1, 2, 2, 8] and k [1, 2, 2, 8] (batch, seq, heads, dim), tables [2, 4].
    let q = f32_tensor(&e, &[1, 2, 2, 8], 4);
    let k = f32_tensor(&e, &[1, 2, 2, 8], 5);
    let tc = f32_tensor(&e, &[2, 4], 6);
    let ts = f32_tensor(&e, &[2, 4], 7);
    let pos = int_tensor(&e, &[0, 1], &[1, 2]);
    let qo = RopeQkOptions::default();
    t.sweep("qk_forward", &[&q, &k, &tc, &ts, &pos], |a| {
        rope::qk_forward(a[0], a[1], a[2], a[3], Some(a[4]), &qo).map(drop)
    });
    t.sweep("qk_forward unchecked positions", &[&pos], |a| {
        let o = RopeQkOptions {
            check_positions: false,
            ..qo
        };
        rope::qk_forward(&q, &k, &tc, &ts, Some(a[0]), &o).map(drop)
    });
    t.values(
        "qk_forward mrope_section",
        &[
            [0usize, 0, 0],
            [1, 1, 1],
            [4, 4, 4],
            [usize::MAX, 1, 1],
            [usize::MAX, 2, 3],
        ],
        |s| {
            let o = RopeQkOptions {
                mrope_section: Some(s),
                ..qo
            };
            rope::qk_forward(&q, &k, &tc, &ts, None, &o).map(drop)
        },
    );
    let qs = need!(
        t,
        "qs",
        rope::qk_forward(
            &q,
            &k,
            &tc,
            &ts,
            Some(&pos),
            &RopeQkOptions {
                table_grads: true,
                ..qo
            },
        )
    )
    .1;
    t.sweep("qk_backward", &[&q, &k], |a| {
        rope::qk_backward(&qs, a[0], a[1]).map(drop)
    });
    t.values("qk_backward_as", &DTYPES, |d| {
        rope::qk_backward_as(&qs, &q, &k, d).map(drop)
    });
    let freqs = f32_tensor(&e, &[2, 4, 2], 8);
    t.sweep("llama4_forward", &[&q, &k, &freqs, &pos], |a| {
        rope::llama4_forward(a[0], a[1], a[2], Some(a[3]), &qo).map(drop)
    });
    let ls = need!(
        t,
        "ls",
        rope::llama4_forward(
            &q,
            &k,
            &freqs,
            None,
            &RopeQkOptions {
                table_grads: true,
                ..qo
            },
        )
    )
    .1;
    t.sweep("llama4_backward", &[&q, &k], |a| {
        rope::llama4_backward(&ls, a[0], a[1]).map(drop)
    });

    // Host tables: bad sizes, bases and scalings.
    let scalings = [
        RopeScaling::None,
        RopeScaling::Linear { factor: f64::NAN },
        RopeScaling::Linear { factor: 0.0 },
        RopeScaling::Ntk { factor: -1.0 },
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_positions: 0,
            beta_fast: f64::INFINITY,
            beta_slow: -1.0,
            attention_factor: Some(f64::NAN),
        },
    ];
    for s in &scalings {
        for (rows, dim, base) in [
            (4usize, 8usize, 10000.0),
            (0, 8, 1.0),
            (4, 0, 10000.0),
            (4, 7, 10000.0),
            (4, 8, f64::NAN),
            (4, 8, 0.0),
            (4, 8, -5.0),
        ] {
            t.call(&format!("tables {rows} {dim} {base} {s:?}"), || {
                rope::tables(&e, rows, dim, base, s, DType::BF16).map(drop)
            });
            t.call(&format!("llama4_freqs {rows} {dim} {base} {s:?}"), || {
                rope::llama4_freqs(&e, rows, dim, base, s).map(drop)
            });
        }
    }
}

fn losses(t: &mut Tally) {
    let e = t.engine.clone();
    let x = f32_tensor(&e, &[3, 8], 1);
    let dy = f32_tensor(&e, &[3, 8], 2);
    t.sweep("softmax", &[&x], |a| loss::softmax(a[0]).map(drop));
    t.sweep("log_softmax", &[&x], |a| loss::log_softmax(a[0]).map(drop));
    t.sweep("sparsemax", &[&x], |a| loss::sparsemax(a[0]).map(drop));
    let (y, s) = need!(t, "loss::softmax", loss::softmax(&x));
    t.sweep("softmax_backward", &[&dy], |a| {
        loss::softmax_backward(&s, a[0]).map(drop)
    });
    t.values("softmax_backward_as", &DTYPES, |d| {
        loss::softmax_backward_as(&s, &dy, d).map(drop)
    });
    t.sweep("softmax_backward_from_output", &[&y, &dy], |a| {
        loss::softmax_backward_from_output(a[0], a[1], false, DType::F32).map(drop)
    });
    let sp = need!(t, "loss::sparsemax", loss::sparsemax(&x)).1;
    t.sweep("sparsemax_backward", &[&dy], |a| {
        loss::sparsemax_backward(&sp, a[0]).map(drop)
    });

    // Cross-entropy: targets with an ignored row; class weights F32 [8].
    let targets = int_tensor(&e, &[1, -100, 7], &[3]);
    let cw = Tensor::from_slice(&e, &[0.5f32, 1.0, 2.0, 0.0, 1.5, 1.0, 0.25, 3.0], &[8]).unwrap();
    let all = CrossEntropyOptions {
        label_smoothing: 0.1,
        z_loss: 1e-4,
        softcap: Some(30.0),
        weight: Some(cw.clone()),
        ..Default::default()
    };
    t.sweep("cross_entropy", &[&x, &targets, &cw], |a| {
        let o = CrossEntropyOptions {
            weight: Some(a[2].clone()),
            ..all.clone()
        };
        loss::cross_entropy(a[0], a[1], &o).map(drop)
    });
    t.sweep("cross_entropy unchecked targets", &[&targets], |a| {
        let o = CrossEntropyOptions {
            check_targets: false,
            ..all.clone()
        };
        loss::cross_entropy(&x, a[0], &o).map(drop)
    });
    t.sweep("cross_entropy_in_place", &[&x, &targets], |a| {
        // The logits are overwritten: a copy of whatever the slot holds.
        let logits = wgrad::cast::cast(a[0], a[0].dtype())?;
        loss::cross_entropy_in_place(&logits, a[1], &all).map(drop)
    });
    t.values("label_smoothing", &BAD_F32, |v| {
        loss::cross_entropy(
            &x,
            &targets,
            &CrossEntropyOptions {
                label_smoothing: v,
                ..all.clone()
            },
        )
        .map(drop)
    });
    t.values("z_loss", &BAD_F32, |v| {
        loss::cross_entropy(
            &x,
            &targets,
            &CrossEntropyOptions {
                z_loss: v,
                ..all.clone()
            },
        )
        .map(drop)
    });
    t.values("softcap", &BAD_F32, |v| {
        loss::cross_entropy(
            &x,
            &targets,
            &CrossEntropyOptions {
                softcap: Some(v),
                ..all.clone()
            },
        )
        .map(drop)
    });
    t.values("ignore_index", &[i32::MIN, -1, 0, 7, 8, i32::MAX], |v| {
        loss::cross_entropy(
            &x,
            &targets,
            &CrossEntropyOptions {
                ignore_index: v,
                ..all.clone()
            },
        )
        .map(drop)
    });
    for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        let o = CrossEntropyOptions {
            reduction,
            ..all.clone()
        };
        let s = need!(t, "cross_entropy", loss::cross_entropy(&x, &targets, &o)).1;
        let cot = match reduction {
            Reduction::None => f32_tensor(&e, &[3], 4),
            _ => f32_tensor(&e, &[1], 4),
        };
        t.sweep(
            &format!("cross_entropy_backward {reduction:?}"),
            &[&cot],
            |a| loss::cross_entropy_backward(&s, Some(a[0])).map(drop),
        );
        t.values(
            &format!("cross_entropy_backward_as {reduction:?}"),
            &DTYPES,
            |d| loss::cross_entropy_backward_as(&s, None, d).map(drop),
        );
    }
    let soft = f32_tensor(&e, &[3, 8], 5);
    t.sweep("cross_entropy_soft", &[&x, &soft], |a| {
        loss::cross_entropy_soft(a[0], a[1], Reduction::Mean).map(drop)
    });

    // Divergences: log-probabilities of input and target, labels with an ignored row.
    let (lp, _) = need!(t, "loss::log_softmax", loss::log_softmax(&x));
    let (lt, _) = need!(t, "loss::log_softmax", loss::log_softmax(&dy));
    let labels = int_tensor(&e, &[0, -100, 2], &[3]);
    t.sweep("kl_div", &[&lp, &lt], |a| {
        loss::kl_div(a[0], a[1], true, DivReduction::BatchMean).map(drop)
    });
    t.sweep("jsd", &[&lp, &lt, &labels], |a| {
        loss::jsd(a[0], a[1], 0.5, Some(a[2]), -100).map(drop)
    });
    t.values("jsd beta", &BAD_F32, |beta| {
        loss::jsd(&lp, &lt, beta, None, -100).map(drop)
    });
    t.sweep("tvd", &[&lp, &lt, &labels], |a| {
        loss::tvd(a[0], a[1], DivReduction::Sum, Some(a[2]), -100).map(drop)
    });
    let divergences = [
        (
            "kl_div",
            need!(
                t,
                "kl_div",
                loss::kl_div(&lp, &lt, false, DivReduction::None)
            )
            .1,
        ),
        (
            "jsd",
            need!(t, "jsd", loss::jsd(&lp, &lt, 0.2, Some(&labels), -100)).1,
        ),
        (
            "tvd",
            need!(
                t,
                "tvd",
                loss::tvd(&lp, &lt, DivReduction::Mean, None, -100)
            )
            .1,
        ),
    ];
    for (name, saved) in divergences {
        let cot = if name == "kl_div" {
            f32_tensor(&e, &[3, 8], 6)
        } else {
            f32_tensor(&e, &[1], 6)
        };
        t.sweep(&format!("divergence_backward {name}"), &[&cot], |a| {
            loss::divergence_backward(&saved, Some(a[0])).map(drop)
        });
        t.values(&format!("divergence_backward_as {name}"), &DTYPES, |d| {
            loss::divergence_backward_as(&saved, None, d).map(drop)
        });
    }
}

fn products(t: &mut Tally) {
    let e = t.engine.clone();
    // A [3, 8] · B [8, 4] (and B stored [4, 8], transposed), bias [4].
    let a = f32_tensor(&e, &[3, 8], 1);
    let b = f32_tensor(&e, &[8, 4], 2);
    let bt = f32_tensor(&e, &[4, 8], 3);
    let bias = f32_tensor(&e, &[4], 4);
    let mo = MatmulOptions::default();
    t.sweep("matmul", &[&a, &b, &bias], |x| {
        matmul::matmul(x[0], x[1], Some(x[2]), &mo).map(drop)
    });
    let mt = MatmulOptions {
        transpose_b: true,
        activation: Some(Activation::GeluTanh),
        ..mo
    };
    t.sweep("matmul transposed", &[&a, &bt], |x| {
        matmul::matmul(x[0], x[1], None, &mt).map(drop)
    });
    t.values("matmul_as", &DTYPES, |d| {
        matmul::matmul_as(&a, &b, Some(&bias), &mo, d).map(drop)
    });
    let (y, s) = need!(
        t,
        "matmul::matmul",
        matmul::matmul(&a, &bt, Some(&bias), &mt)
    );
    t.sweep("matmul_backward", &[&y], |x| {
        matmul::matmul_backward(&s, x[0]).map(drop)
    });
    t.values("matmul_backward_as", &DTYPES, |d| {
        matmul::matmul_backward_as(&s, &y, d).map(drop)
    });

    // Embedding: table [8, 8], indices [2, 3] in range.
    let table = f32_tensor(&e, &[8, 8], 5);
    let idx = int_tensor(&e, &[0, 1, 7, 2, 2, 0], &[2, 3]);
    let eo = EmbeddingOptions {
        padding_index: Some(2),
        ..Default::default()
    };
    t.sweep("embedding", &[&table, &idx], |x| {
        embedding::embedding(x[0], x[1], &eo).map(drop)
    });
    t.values(
        "embedding padding_index",
        &[Some(8usize), Some(usize::MAX)],
        |p| {
            embedding::embedding(
                &table,
                &idx,
                &EmbeddingOptions {
                    padding_index: p,
                    ..eo
                },
            )
            .map(drop)
        },
    );
    t.values("embedding max_norm", &BAD_F32, |m| {
        embedding::embedding(
            &table,
            &idx,
            &EmbeddingOptions {
                max_norm: Some(m),
                ..eo
            },
        )
        .map(drop)
    });
    t.values("embedding norm_type", &BAD_F32, |p| {
        embedding::embedding(
            &table,
            &idx,
            &EmbeddingOptions {
                max_norm: Some(1.0),
                norm_type: p,
                ..eo
            },
        )
        .map(drop)
    });
    let (rows, es) = need!(
        t,
        "embedding::embedding",
        embedding::embedding(&table, &idx, &eo)
    );
    t.sweep("embedding_backward", &[&rows], |x| {
        embedding::embedding_backward(&es, x[0]).map(drop)
    });

    // Fused linear cross-entropy: x [3, 8], W [4, 8], bias [4], targets [3].
    let targets = int_tensor(&e, &[1, -100, 3], &[3]);
    let fo = FusedLinearCrossEntropyOptions::default();
    t.sweep(
        "fused_linear_cross_entropy",
        &[&a, &bt, &bias, &targets],
        |x| {
            let head = LinearHead {
                input: x[0],
                weight: x[1],
                bias: Some(x[2]),
            };
            fused_linear::fused_linear_cross_entropy(head, x[3], &fo).map(drop)
        },
    );
    t.values(
        "fused_linear_cross_entropy temperature",
        &BAD_F32,
        |temperature| {
            let head = unbiased(&a, &bt);
            let o = FusedLinearCrossEntropyOptions {
                temperature,
                ..fo.clone()
            };
            fused_linear::fused_linear_cross_entropy(head, &targets, &o).map(drop)
        },
    );
    let chunkings = [
        Chunking {
            chunk_rows: Some(0),
            ..Default::default()
        },
        Chunking {
            memory_budget: Some(0),
            ..Default::default()
        },
        Chunking {
            vocab_block: Some(0),
            head_dtype_gradients: true,
            ..Default::default()
        },
        Chunking {
            block_statistics: true,
            ..Default::default()
        },
        Chunking {
            chunk_rows: Some(usize::MAX),
            ..Default::default()
        },
    ];
    for (i, chunking) in chunkings.iter().enumerate() {
        t.call(&format!("fused_linear_cross_entropy chunking {i}"), || {
            let head = LinearHead {
                input: &a,
                weight: &bt,
                bias: Some(&bias),
            };
            let o = FusedLinearCrossEntropyOptions {
                chunking: *chunking,
                ..fo.clone()
            };
            fused_linear::fused_linear_cross_entropy(head, &targets, &o).map(drop)
        });
    }
    let head = LinearHead {
        input: &a,
        weight: &bt,
        bias: Some(&bias),
    };
    let fs = need!(
        t,
        "fused_linear_cross_entropy",
        fused_linear::fused_linear_cross_entropy(head, &targets, &fo)
    )
    .1;
    let one = f32_tensor(&e, &[1], 6);
    t.sweep("fused_linear_cross_entropy_backward", &[&one], |x| {
        fused_linear::fused_linear_cross_entropy_backward(&fs, Some(x[0])).map(drop)
    });

    // Distillation: the teacher head [4, 6] over its own hidden size, labels with an ignored row.
    let tx = f32_tensor(&e, &[3, 6], 7);
    let tw = f32_tensor(&e, &[4, 6], 8);
    let dopt = fused_linear::DistillationOptions::default();
    t.sweep("fused_linear_jsd", &[&a, &bt, &tx, &tw, &targets], |x| {
        let student = unbiased(x[0], x[1]);
        let teacher = unbiased(x[2], x[3]);
        fused_linear::fused_linear_jsd(student, teacher, Some(x[4]), 0.5, &dopt).map(drop)
    });
    t.values("fused_linear_jsd beta", &BAD_F32, |beta| {
        let student = unbiased(&a, &bt);
        let teacher = unbiased(&tx, &tw);
        fused_linear::fused_linear_jsd(student, teacher, None, beta, &dopt).map(drop)
    });
    t.values("fused_linear_kl temperature", &BAD_F32, |temperature| {
        let student = unbiased(&a, &bt);
        let teacher = unbiased(&tx, &tw);
        let o = fused_linear::DistillationOptions {
            temperature,
            ..dopt.clone()
        };
        fused_linear::fused_linear_kl(student, teacher, Some(&targets), &o).map(drop)
    });
    let student = unbiased(&a, &bt);
    let teacher = unbiased(&tx, &tw);
    let ds = need!(
        t,
        "fused_linear_tvd",
        fused_linear::fused_linear_tvd(student, teacher, Some(&targets), &dopt)
    )
    .1;
    t.sweep("fused_linear_distillation_backward", &[&one], |x| {
        fused_linear::fused_linear_distillation_backward(&ds, Some(x[0])).map(drop)
    });

    // Fused gated MLP: x [3, 8], gate and up [4, 8], down [8, 4].
    let wg = f32_tensor(&e, &[4, 8], 9);
    let wu = f32_tensor(&e, &[4, 8], 10);
    let wd = f32_tensor(&e, &[8, 4], 11);
    let mopt = wgrad::mlp::MlpOptions::default();
    t.sweep("mlp", &[&a, &wg, &wu, &wd], |x| {
        wgrad::mlp::mlp(x[0], x[1], x[2], x[3], &mopt).map(drop)
    });
    t.values(
        "mlp tile_rows",
        &[Some(0usize), Some(1), Some(usize::MAX)],
        |tile_rows| {
            let o = wgrad::mlp::MlpOptions { tile_rows, ..mopt };
            wgrad::mlp::mlp(&a, &wg, &wu, &wd, &o).map(drop)
        },
    );
    let (my, ms) = need!(
        t,
        "wgrad::mlp::mlp",
        wgrad::mlp::mlp(&a, &wg, &wu, &wd, &mopt)
    );
    t.sweep("mlp_backward", &[&my], |x| {
        wgrad::mlp::mlp_backward(&ms, x[0]).map(drop)
    });
}

/// Attention, gated delta, GRPO (on logits and fused), preference and KTO heads, casts,
/// reductions, embedding renormalization and the optimizers.
fn others(t: &mut Tally) {
    use wgrad::attention::{self, AttentionOptions};
    use wgrad::gated_delta::{self, GatedDeltaOptions};
    use wgrad::grpo::{self, GrpoInputs, GrpoOptions, GrpoTokens};
    use wgrad::optim::{AdamW, AdamWOptions, Sgd, SgdOptions};
    use wgrad::preference::{self, PreferenceLoss, PreferenceOptions};
    let e = t.engine.clone();
    // Attention: q, k, v [batch 1, heads 2, len 2, head_dim 8].
    let q = f32_tensor(&e, &[1, 2, 2, 8], 1);
    let k = f32_tensor(&e, &[1, 2, 2, 8], 2);
    let v = f32_tensor(&e, &[1, 2, 2, 8], 3);
    let ao = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    t.sweep("attention_forward", &[&q, &k, &v], |a| {
        attention::attention_forward(a[0], a[1], a[2], &ao).map(drop)
    });
    t.values(
        "attention scale",
        &[0.0, -1.0, f64::NAN, f64::INFINITY, 1e300],
        |scale| {
            let o = AttentionOptions {
                scale: Some(scale),
                ..ao.clone()
            };
            attention::attention_forward(&q, &k, &v, &o).map(drop)
        },
    );
    t.values(
        "attention window",
        &[
            (Some(0usize), None),
            (None, Some(usize::MAX)),
            (Some(usize::MAX), Some(usize::MAX)),
        ],
        |(l, r)| {
            let o = AttentionOptions {
                window_left: l,
                window_right: r,
                ..ao.clone()
            };
            attention::attention_forward(&q, &k, &v, &o).map(drop)
        },
    );
    t.values(
        "attention causal offset",
        &[i64::MIN, -3, 5, i64::MAX],
        |off| {
            let o = AttentionOptions {
                causal_offset: Some(off),
                ..ao.clone()
            };
            attention::attention_forward(&q, &k, &v, &o).map(drop)
        },
    );
    t.values(
        "attention dilation",
        &[0usize, 1 << 25, usize::MAX],
        |dilation| {
            let o = AttentionOptions {
                dilation: Some(dilation),
                ..ao.clone()
            };
            attention::attention_forward(&q, &k, &v, &o).map(drop)
        },
    );
    t.values(
        "attention neighborhood",
        &[
            (0usize, 1usize),
            (2, 1),
            (3, 0),
            (usize::MAX, usize::MAX),
            (3, 1 << 25),
        ],
        |(kernel, dilation)| {
            let o = AttentionOptions::neighborhood(kernel, dilation)?;
            attention::attention_forward(&q, &k, &v, &o).map(drop)
        },
    );
    let (ao_out, asaved) = need!(
        t,
        "attention_forward",
        attention::attention_forward(&q, &k, &v, &ao)
    );
    t.sweep("attention_backward", &[&ao_out], |a| {
        attention::attention_backward(&asaved, a[0]).map(drop)
    });
    t.values("attention_backward_as", &DTYPES, |d| {
        attention::attention_backward_as(&asaved, &ao_out, d).map(drop)
    });

    // Dual chunk attention: the three query branches, key and value of attention's shape.
    use wgrad::dual_chunk::{self, DualChunkOptions, DualChunkQueries};
    let q2 = f32_tensor(&e, &[1, 2, 2, 8], 6);
    let q3 = f32_tensor(&e, &[1, 2, 2, 8], 7);
    let dco = DualChunkOptions {
        chunk_len: 1,
        scale: None,
        layout: Default::default(),
    };
    let branches = |a: &[&Tensor]| -> Result<()> {
        let queries = DualChunkQueries {
            intra: a[0],
            successive: a[1],
            inter: a[2],
        };
        dual_chunk::dual_chunk_attention(queries, a[3], a[4], &dco).map(drop)
    };
    t.sweep("dual_chunk_attention", &[&q, &q2, &q3, &k, &v], branches);
    let queries = DualChunkQueries {
        intra: &q,
        successive: &q2,
        inter: &q3,
    };
    t.values(
        "dual_chunk_attention chunk_len",
        &[0usize, usize::MAX, 1 << 24, (1 << 24) + 1],
        |chunk_len| {
            let o = DualChunkOptions { chunk_len, ..dco };
            dual_chunk::dual_chunk_attention(queries, &k, &v, &o).map(drop)
        },
    );
    let (dc_out, dcsaved) = need!(
        t,
        "dual_chunk_attention",
        dual_chunk::dual_chunk_attention(queries, &k, &v, &dco)
    );
    t.sweep("dual_chunk_attention_backward", &[&dc_out], |a| {
        dual_chunk::dual_chunk_attention_backward(&dcsaved, a[0]).map(drop)
    });
    t.values("dual_chunk_attention_backward_as", &DTYPES, |d| {
        dual_chunk::dual_chunk_attention_backward_as(&dcsaved, &dc_out, d).map(drop)
    });

    // Gated delta: q, k [1, 2, 2, 16] (batch, time, key heads, key dim), v [1, 2, 2, 16], β
    // and log-decay [1, 2, 2].
    let (q, k, v) = (
        f32_tensor(&e, &[1, 2, 2, 16], 16),
        f32_tensor(&e, &[1, 2, 2, 16], 17),
        f32_tensor(&e, &[1, 2, 2, 16], 18),
    );
    let beta = f32_tensor(&e, &[1, 2, 2], 4);
    let decay = f32_tensor(&e, &[1, 2, 2], 5);
    let go = GatedDeltaOptions::default();
    t.sweep("gated_delta_forward", &[&q, &k, &v, &beta, &decay], |a| {
        gated_delta::gated_delta_forward(a[0], a[1], a[2], a[3], a[4], None, &go).map(drop)
    });
    t.values(
        "gated_delta checkpoint_interval",
        &[Some(0usize), Some(1), Some(usize::MAX)],
        |c| {
            let o = GatedDeltaOptions {
                checkpoint_interval: c,
                ..go
            };
            gated_delta::gated_delta_forward(&q, &k, &v, &beta, &decay, None, &o).map(drop)
        },
    );
    let (gout, gsaved) = need!(
        t,
        "gated_delta_forward",
        gated_delta::gated_delta_forward(&q, &k, &v, &beta, &decay, None, &go)
    );
    t.sweep("gated_delta_backward", &[&gout.output], |a| {
        gated_delta::gated_delta_backward(&gsaved, Some(a[0]), None).map(drop)
    });
    t.values("gated_delta_backward_as dtype", &DTYPES, |d| {
        gated_delta::gated_delta_backward_as(&gsaved, Some(&gout.output), None, d).map(drop)
    });
    let co = GatedDeltaOptions {
        algorithm: gated_delta::DeltaAlgorithm::Chunked,
        ..go
    };
    t.sweep(
        "gated_delta_forward chunked",
        &[&q, &k, &v, &beta, &decay],
        |a| gated_delta::gated_delta_forward(a[0], a[1], a[2], a[3], a[4], None, &co).map(drop),
    );
    let (cout, csaved) = need!(
        t,
        "gated_delta_forward chunked",
        gated_delta::gated_delta_forward(&q, &k, &v, &beta, &decay, None, &co)
    );
    t.sweep(
        "gated_delta_backward chunked",
        &[&cout.output, &cout.final_state],
        |a| gated_delta::gated_delta_backward(&csaved, Some(a[0]), Some(a[1])).map(drop),
    );

    // GRPO on logits [2, 4, 8] (3 completion tokens and a spare position), ids [2, 3].
    let logits = f32_tensor(&e, &[2, 4, 8], 6);
    let ids = int_tensor(&e, &[0, 7, 3, 1, 2, 5], &[2, 3]);
    let adv = f32_tensor(&e, &[2], 7);
    let mask = int_tensor(&e, &[1, 1, 0, 1, 0, 1], &[2, 3]);
    let old = f32_tensor(&e, &[2, 3], 8);
    let gro = GrpoOptions::default();
    t.sweep("grpo_loss", &[&logits, &ids, &adv, &old, &mask], |a| {
        let i = GrpoInputs {
            logits: a[0],
            completion_ids: a[1],
            advantages: a[2],
            old_logp: Some(a[3]),
            ref_logp: Some(a[3]),
            mask: Some(a[4]),
        };
        grpo::grpo_loss(&i, &gro).map(drop)
    });
    // Each option alone out of its domain.
    let inputs = GrpoInputs {
        logits: &logits,
        completion_ids: &ids,
        advantages: &adv,
        old_logp: None,
        ref_logp: None,
        mask: None,
    };
    type Edit = fn(GrpoOptions, f64) -> GrpoOptions;
    let edits: [(&str, Edit); 4] = [
        ("temperature", |o, x| GrpoOptions {
            temperature: x,
            ..o
        }),
        ("beta", |o, x| GrpoOptions { beta: x, ..o }),
        ("eps_low", |o, x| GrpoOptions { eps_low: x, ..o }),
        ("eps_high", |o, x| GrpoOptions { eps_high: x, ..o }),
    ];
    for (name, edit) in edits {
        t.values(
            &format!("grpo {name}"),
            &[f64::NAN, 0.0, -1.0, f64::INFINITY],
            |x| grpo::grpo_loss(&inputs, &edit(gro, x)).map(drop),
        );
    }
    // Fused GRPO: x [2, 3, 8] through W [8, 8].
    let gx = f32_tensor(&e, &[2, 3, 8], 9);
    let gw = f32_tensor(&e, &[8, 8], 10);
    t.sweep("fused_linear_grpo_loss", &[&gx, &gw, &ids, &adv], |a| {
        let tokens = GrpoTokens {
            completion_ids: a[2],
            advantages: a[3],
            old_logp: None,
            ref_logp: None,
            mask: None,
        };
        grpo::fused_linear_grpo_loss(unbiased(a[0], a[1]), &tokens, &gro, Chunking::default())
            .map(drop)
    });

    // DPO: x [2 sequences, 3 tokens, 8] through W [8, 8], targets [2, 3].
    let px = f32_tensor(&e, &[2, 3, 8], 11);
    let targets = int_tensor(&e, &[1, -100, 7, 0, 3, 3], &[2, 3]);
    let dpo = PreferenceOptions::new(PreferenceLoss::Dpo);
    t.sweep("preference_loss", &[&px, &gw, &targets], |a| {
        preference::preference_loss(unbiased(a[0], a[1]), a[2], None, &dpo).map(drop)
    });
    t.values("preference beta", &BAD_F32, |beta| {
        let o = PreferenceOptions {
            beta,
            ..PreferenceOptions::new(PreferenceLoss::Dpo)
        };
        preference::preference_loss(unbiased(&px, &gw), &targets, None, &o).map(drop)
    });
    let desirable = int_tensor(&e, &[1, 0], &[2]);
    let kto = PreferenceOptions::new(PreferenceLoss::Kto);
    t.sweep("kto_loss", &[&px, &gw, &targets, &desirable], |a| {
        preference::kto_loss(unbiased(a[0], a[1]), a[2], a[3], None, None, &kto).map(drop)
    });

    // Casts, reductions, embedding renormalization.
    let x = f32_tensor(&e, &[3, 8], 12);
    for to in [DType::F32, DType::F16, DType::BF16] {
        t.sweep(&format!("cast to {to:?}"), &[&x], |a| {
            wgrad::cast::cast(a[0], to).map(drop)
        });
    }
    t.values(
        "cast to an integer dtype",
        &[DType::I32, DType::U32],
        |to| wgrad::cast::cast(&x, to).map(drop),
    );
    t.sweep("sum_rows", &[&x], |a| {
        wgrad::reduce::sum_rows(a[0]).map(drop)
    });
    t.sweep("max_rows", &[&x], |a| {
        wgrad::reduce::max_rows(a[0]).map(drop)
    });
    t.sweep("sum_columns", &[&x], |a| {
        wgrad::reduce::sum_columns(a[0]).map(drop)
    });
    t.values(
        "sum_partial_groups",
        &[
            (0usize, 1usize, 3usize, 8usize),
            (1, 1, 3, 8),
            (0, 0, 0, 0),
            (0, usize::MAX, 1, 1),
            (usize::MAX, 1, 1, 1),
            (0, 2, 2, 8),
        ],
        |(base, groups, per_group, cols)| {
            wgrad::reduce::sum_partial_groups(&e, &x, base, groups, per_group, cols).map(drop)
        },
    );
    let table = f32_tensor(&e, &[8, 8], 13);
    let idx = int_tensor(&e, &[0, 7, 3], &[3]);
    t.sweep("embedding_renorm", &[&table, &idx], |a| {
        embedding::embedding_renorm(a[0], a[1], 1.0, 2.0, true).map(drop)
    });

    // Optimizers: one parameter [3, 8]; steps with each hostile gradient.
    let param = f32_tensor(&e, &[3, 8], 14);
    let grad = f32_tensor(&e, &[3, 8], 15);
    if let Some(adam) = t.get("AdamW::new", || {
        AdamW::new(std::slice::from_ref(&param), AdamWOptions::default())
    }) {
        let adam = std::cell::RefCell::new(adam);
        t.sweep("AdamW::step", &[&grad], |a| {
            adam_step(&mut adam.borrow_mut(), a[0])
        });
    }
    t.values("AdamW lr", &BAD_F32, |lr| {
        AdamW::new(
            std::slice::from_ref(&param),
            AdamWOptions {
                lr,
                ..Default::default()
            },
        )
        .map(drop)
    });
    t.values("Sgd momentum", &BAD_F32, |momentum| {
        Sgd::new(
            std::slice::from_ref(&param),
            SgdOptions {
                momentum,
                ..Default::default()
            },
        )
        .map(drop)
    });
    t.sweep("grad_norm", &[&grad], |a| {
        wgrad::optim::grad_norm(&[a[0]]).map(drop)
    });
}

/// One AdamW step with `grad` (the optimizer in a `RefCell`: `sweep` takes a shared closure).
/// Expression VJPs, multi-token attention, attention residuals, vocabulary-parallel
/// cross-entropy.
fn newer(t: &mut Tally) {
    let e = t.engine.clone();
    // Expressions: x [2, 8] (element), w [8] (column), s [2] (row): a weighted RMSNorm plus a
    // tempered row maximum.
    use wgrad::expr::{Expr, ExprOp, Kind};
    let xe = Expr::input(0, Kind::Element);
    let we = Expr::input(1, Kind::Column);
    let se = Expr::input(2, Kind::Row);
    let outs = [
        &xe / ((&xe * &xe).row_sum() / Expr::width() + 1e-5).sqrt() * &we,
        (&xe / &se).row_max(),
    ];
    let op = ExprOp::new(&[Kind::Element, Kind::Column, Kind::Row], &outs).expect("expression");
    let (x, w, s) = (
        f32_tensor(&e, &[2, 8], 1),
        f32_tensor(&e, &[8], 2),
        f32_tensor(&e, &[2], 3),
    );
    let f32s = [DType::F32, DType::F32];
    t.sweep("expression forward", &[&x, &w, &s], |a| {
        op.forward(a, &f32s).map(drop)
    });
    t.values("expression output dtype", &DTYPES, |d| {
        op.forward(&[&x, &w, &s], &[d, DType::F32]).map(drop)
    });
    let (eo, esaved) = need!(t, "expression forward", op.forward(&[&x, &w, &s], &f32s));
    t.sweep("expression backward", &[&eo[0], &eo[1]], |a| {
        op.backward(&esaved, &[Some(a[0]), Some(a[1])], &[0, 1, 2])
            .map(drop)
    });
    t.values("expression backward wrt", &[3usize, usize::MAX], |i| {
        op.backward(&esaved, &[None, None], &[i]).map(drop)
    });

    // Multi-token attention: scores [1, 2, 8, 8], weight [2, 2, 3, 3], bias [2].
    use wgrad::mta::{self, MtaOptions};
    let sc = f32_tensor(&e, &[1, 2, 8, 8], 4);
    let mw = f32_tensor(&e, &[2, 2, 3, 3], 5);
    let mb = f32_tensor(&e, &[2], 6);
    let mo = MtaOptions {
        padding: [1, 1],
        ..Default::default()
    };
    t.sweep("multi_token_attention", &[&sc, &mw, &mb], |a| {
        mta::multi_token_attention(a[0], a[1], Some(a[2]), &mo).map(drop)
    });
    t.values(
        "multi_token_attention settings",
        &[0usize, 1, 7, usize::MAX, 1 << 40],
        |v| {
            let o = MtaOptions {
                stride: [v, v],
                padding: [v, v],
                dilation: [v, 1],
                groups: v,
                sparse: v == 7,
            };
            mta::multi_token_attention(&sc, &mw, Some(&mb), &o).map(drop)
        },
    );
    let (my, msaved) = need!(
        t,
        "multi_token_attention",
        mta::multi_token_attention(&sc, &mw, Some(&mb), &mo)
    );
    t.sweep("multi_token_attention_backward", &[&my], |a| {
        mta::multi_token_attention_backward(&msaved, a[0]).map(drop)
    });
    t.sweep("multi_token_attention_backward_as", &[&my], |a| {
        mta::multi_token_attention_backward_as(&msaved, a[0], DType::BF16).map(drop)
    });
    t.values("multi_token_attention_backward_as dtype", &DTYPES, |d| {
        mta::multi_token_attention_backward_as(&msaved, &my, d).map(drop)
    });

    // Attention residuals: blocks [2, 2, 8], weights [8].
    use wgrad::attn_res::{self, AttnResOptions};
    let blocks = f32_tensor(&e, &[2, 2, 8], 7);
    let wq = f32_tensor(&e, &[8], 8);
    t.sweep("attn_res", &[&blocks, &wq, &w], |a| {
        attn_res::attn_res(a[0], a[1], a[2], &AttnResOptions::default()).map(drop)
    });
    t.values(
        "attn_res eps",
        &[0.0f32, -1.0, f32::NAN, f32::INFINITY, 1e-30],
        |eps| attn_res::attn_res(&blocks, &wq, &w, &AttnResOptions { eps }).map(drop),
    );
    let (ah, asaved) = need!(
        t,
        "attn_res",
        attn_res::attn_res(&blocks, &wq, &w, &AttnResOptions::default())
    );
    t.sweep("attn_res_backward", &[&ah], |a| {
        attn_res::attn_res_backward(&asaved, a[0]).map(drop)
    });
    t.sweep("attn_res_backward_as", &[&ah], |a| {
        attn_res::attn_res_backward_as(&asaved, a[0], DType::F16).map(drop)
    });
    t.values("attn_res_backward_as dtype", &DTYPES, |d| {
        attn_res::attn_res_backward_as(&asaved, &ah, d).map(drop)
    });

    // Vocabulary-parallel cross-entropy: two shards [2, 8] and [2, 3], targets [2].
    use wgrad::vocab_parallel::{self as vp, VocabParallelOptions};
    let sh2 = f32_tensor(&e, &[2, 3], 9);
    let tg = int_tensor(&e, &[1, 9], &[2]);
    let vo = VocabParallelOptions::default();
    t.sweep("vocab_parallel_cross_entropy", &[&x, &sh2, &tg], |a| {
        vp::vocab_parallel_cross_entropy(&[a[0], a[1]], a[2], &vo).map(drop)
    });
    t.values(
        "vocab shard offset",
        &[0usize, i32::MAX as usize, usize::MAX],
        |offset| vp::shard_statistics(&x, &tg, offset, -100).map(drop),
    );
    let (vl, vsaved) = need!(
        t,
        "vocab_parallel_cross_entropy",
        vp::vocab_parallel_cross_entropy(&[&x, &sh2], &tg, &vo)
    );
    t.sweep(
        "vocab_parallel_cross_entropy_backward",
        &[&vl, &x, &sh2],
        |a| vp::vocab_parallel_cross_entropy_backward(&vsaved, &[a[1], a[2]], a[0]).map(drop),
    );
}

/// The fused mixture of experts: x [2, 8], gate_up [3, 4, 8], down [3, 8, 2], top-2 slots
/// (one out of range, one negative), and the routing alone.
fn moe_family(t: &mut Tally) {
    use wgrad::moe::{self, MoeOptions};
    let e = t.engine.clone();
    let x = f32_tensor(&e, &[2, 8], 1);
    let gate_up = f32_tensor(&e, &[3, 4, 8], 2);
    let down = f32_tensor(&e, &[3, 8, 2], 3);
    let index = int_tensor(&e, &[0, 2, 7, -1], &[2, 2]);
    let weights = f32_tensor(&e, &[2, 2], 4);
    let o = MoeOptions::default();
    t.sweep("fused_moe", &[&x, &gate_up, &down, &index, &weights], |a| {
        moe::fused_moe(a[0], a[1], a[2], a[3], a[4], &o).map(drop)
    });
    t.values(
        "moe route experts",
        &[0usize, 1, moe::MAX_EXPERTS + 1, usize::MAX],
        |n| moe::route(&index, n).map(drop),
    );
    t.values("fused_moe capacity", &[0usize, 1, 2, usize::MAX], |c| {
        let capped = MoeOptions {
            capacity: Some(c),
            ..o
        };
        moe::fused_moe(&x, &gate_up, &down, &index, &weights, &capped).map(drop)
    });
    t.values("fused_moe output dtype", &DTYPES, |d| {
        let out = MoeOptions { output: d, ..o };
        moe::fused_moe(&x, &gate_up, &down, &index, &weights, &out).map(drop)
    });
    let (y, saved) = need!(
        t,
        "fused_moe",
        moe::fused_moe(&x, &gate_up, &down, &index, &weights, &o)
    );
    t.sweep("fused_moe_backward", &[&y], |a| {
        moe::fused_moe_backward(&saved, a[0]).map(drop)
    });
    for d in DType::FLOATS {
        t.sweep(&format!("fused_moe_backward_as {d:?}"), &[&y], |a| {
            moe::fused_moe_backward_as(&saved, a[0], d).map(drop)
        });
    }
    t.values("fused_moe_backward_as dtype", &DTYPES, |d| {
        moe::fused_moe_backward_as(&saved, &y, d).map(drop)
    });
}

fn adam_step(adam: &mut wgrad::optim::AdamW, grad: &Tensor) -> Result<()> {
    adam.step(&[grad], None)
}

/// A linear head without bias.
fn unbiased<'a>(input: &'a Tensor, weight: &'a Tensor) -> LinearHead<'a> {
    LinearHead {
        input,
        weight,
        bias: None,
    }
}

fn sweep_family(name: &str, family: fn(&mut Tally)) {
    let mut t = Tally::on(engine(), true);
    family(&mut t);
    t.assert_clean(name);
    assert_engine_still_computes(engine());
}

#[test]
fn norms_never_panic() {
    sweep_family("norms", norms);
}

#[test]
fn activations_never_panic() {
    sweep_family("activations", activations);
}

#[test]
fn rope_never_panics() {
    sweep_family("rope", rope_family);
}

#[test]
fn losses_never_panic() {
    sweep_family("losses", losses);
}

#[test]
fn products_embedding_and_heads_never_panic() {
    sweep_family("products, embedding and heads", products);
}

#[test]
fn newer_operators_never_panic() {
    sweep_family(
        "expressions, multi-token attention, attention residuals, vocabulary-parallel CE",
        newer,
    );
}

#[test]
fn moe_never_panics() {
    sweep_family("fused mixture of experts", moe_family);
}

#[test]
fn other_families_never_panic() {
    sweep_family(
        "attention, gated delta, GRPO, preference, casts, reductions, optimizers",
        others,
    );
}

/// Engines with tight limits (no workspace, 256 bytes of it, bindings of 64 bytes, no pool,
/// an app's device with WebGPU's default limits and no optional features): every family's
/// valid calls and hostile option values are refused with a typed error or succeed, never
/// panic, and the engine computes correctly afterwards.
#[test]
fn tight_engines_never_panic() {
    let build = |b: wgrad::EngineBuilder| b.build().expect("an engine with tight limits");
    let configs = [
        (
            "workspace bound 0",
            build(Engine::builder().workspace_bound(0)),
        ),
        (
            "workspace bound 256 B",
            build(Engine::builder().workspace_bound(256)),
        ),
        (
            "bindings of 64 B",
            build(Engine::builder().binding_limit(64)),
        ),
        ("pool limit 0", build(Engine::builder().pool_limit(0))),
        ("WebGPU default limits", common::webgpu_default_engine()),
    ];
    for (name, e) in configs {
        let mut t = Tally::on(&e, false);
        for family in [
            norms,
            activations,
            rope_family,
            losses,
            products,
            others,
            newer,
            moe_family,
            mhc_family,
        ] {
            family(&mut t);
        }
        t.assert_clean(name);
        assert_engine_still_computes(&e);
    }
}

/// The typed error of a hostile call names what was wrong (spot checks of the sweep's
/// refusals: a scalar source, another engine's weight, a NaN ε).
#[test]
fn hostile_refusals_are_typed() {
    let x = f32_tensor(engine(), &[3, 8], 1);
    let scalar = make(engine(), &[], DType::F32, 2).unwrap();
    let other = common::private_engine();
    let w_other = make(&other, &[8], DType::F32, 3).unwrap();
    let r = norm::rms_norm(&scalar, None, &RmsNormOptions::default());
    assert!(
        matches!(r, Err(Error::OutOfBounds { .. })),
        "scalar source: {r:?}"
    );
    let r = norm::rms_norm(&x, Some(&w_other), &RmsNormOptions::default());
    assert!(
        matches!(r, Err(Error::EngineMismatch { .. })),
        "another engine's weight: {r:?}"
    );
    let r = norm::rms_norm(
        &x,
        None,
        &RmsNormOptions {
            eps: f32::NAN,
            ..Default::default()
        },
    );
    assert!(
        matches!(r, Err(Error::InvalidValue { .. })),
        "NaN eps: {r:?}"
    );
    // Shapes whose element count fits usize but whose bytes do not (they wrapped to a tiny
    // buffer under a huge shape), and element counts past usize.
    for shape in [
        &[1usize << 62][..],
        &[usize::MAX][..],
        &[1 << 40, 1 << 40][..],
        &[3, 1 << 61][..],
    ] {
        for dtype in DTYPES {
            let r = Tensor::zeros(engine(), shape, dtype);
            assert!(
                matches!(
                    r,
                    Err(Error::LimitExceeded { .. } | Error::OutOfBounds { .. })
                ),
                "a {dtype:?} tensor of shape {shape:?}: {r:?}"
            );
        }
    }
    // Partial sums read past usize (base, groups, blocks, columns).
    let p = f32_tensor(engine(), &[3, 8], 7);
    for (base, groups, per_group, cols) in [
        (usize::MAX, 1, 1, 1),
        (0, usize::MAX, 2, 1),
        (0, 1 << 33, 0, 1 << 33),
    ] {
        let r = wgrad::reduce::sum_partial_groups(engine(), &p, base, groups, per_group, cols);
        assert!(
            r.is_err(),
            "sum_partial_groups({base}, {groups}, {per_group}, {cols}): {r:?}"
        );
    }
    // mRoPE sections whose sum wraps around usize to the right total (4 frequencies).
    let e = engine();
    let q = f32_tensor(e, &[1, 2, 2, 8], 4);
    let tables = f32_tensor(e, &[2, 4], 6);
    let pos = int_tensor(e, &[0, 1, 0, 1, 0, 1], &[3, 2]);
    let o = RopeQkOptions {
        mrope_section: Some([usize::MAX, 2, 3]),
        ..Default::default()
    };
    let r = rope::qk_forward(&q, &q, &tables, &tables, Some(&pos), &o);
    assert!(
        matches!(r, Err(Error::OutOfBounds { .. })),
        "mRoPE sections wrapping to the sum: {r:?}"
    );
}

/// Manifold-constrained hyper-connections: x [2, 2, 8] (2 tokens of 2 streams of width 8),
/// phi [16, 8], b [8], gains [1], f_out [2, 8]; each option through its hostile values.
fn mhc_family(t: &mut Tally) {
    use wgrad::mhc::{self, MhcOptions};
    let e = t.engine.clone();
    let x = f32_tensor(&e, &[2, 2, 8], 11);
    let phi = f32_tensor(&e, &[16, 8], 12);
    let b = f32_tensor(&e, &[8], 13);
    let a = f32_tensor(&e, &[1], 14);
    let f = f32_tensor(&e, &[2, 8], 15);
    let hp = f32_tensor(&e, &[2, 2], 16);
    let hr = f32_tensor(&e, &[2, 2, 2], 17);
    // The mixes first: they need no workspace, so tight engines run them too.
    t.sweep("mhc_pre", &[&x, &hp], |v| {
        mhc::mhc_pre(v[0], v[1]).map(drop)
    });
    t.sweep("mhc_post_res", &[&x, &f, &hp, &hr], |v| {
        mhc::mhc_post_res(v[0], v[1], v[2], v[3]).map(drop)
    });
    if let Some((p, psaved)) = t.get("mhc_pre", || mhc::mhc_pre(&x, &hp)) {
        t.sweep("mhc_pre_backward", &[&p], |v| {
            mhc::mhc_pre_backward(&psaved, v[0]).map(drop)
        });
        t.sweep("mhc_pre_backward_as", &[&p], |v| {
            mhc::mhc_pre_backward_as(&psaved, v[0], DType::BF16).map(drop)
        });
        t.values("mhc_pre_backward_as dtype", &DTYPES, |d| {
            mhc::mhc_pre_backward_as(&psaved, &p, d).map(drop)
        });
    }
    if let Some((r, rsaved)) = t.get("mhc_post_res", || mhc::mhc_post_res(&x, &f, &hp, &hr)) {
        t.sweep("mhc_post_res_backward", &[&r], |v| {
            mhc::mhc_post_res_backward(&rsaved, v[0]).map(drop)
        });
        t.sweep("mhc_post_res_backward_as", &[&r], |v| {
            mhc::mhc_post_res_backward_as(&rsaved, v[0], DType::F16).map(drop)
        });
        t.values("mhc_post_res_backward_as dtype", &DTYPES, |d| {
            mhc::mhc_post_res_backward_as(&rsaved, &r, d).map(drop)
        });
    }
    let o = MhcOptions::default();
    let coefficients = |o: MhcOptions| mhc::mhc_coefficients(&x, &phi, &b, &a, &a, &a, &o);
    t.sweep("mhc_coefficients", &[&x, &phi, &b, &a, &a, &a], |v| {
        mhc::mhc_coefficients(v[0], v[1], v[2], v[3], v[4], v[5], &o).map(drop)
    });
    t.values("mhc tmax", &[0u32, 1, 256, 257, u32::MAX], |tmax| {
        coefficients(MhcOptions { tmax, ..o }).map(drop)
    });
    t.values("mhc rms_eps", &BAD_F32, |rms_eps| {
        coefficients(MhcOptions { rms_eps, ..o }).map(drop)
    });
    t.values("mhc sinkhorn_eps", &BAD_F32, |sinkhorn_eps| {
        coefficients(MhcOptions { sinkhorn_eps, ..o }).map(drop)
    });
    t.values("mhc pre_eps", &BAD_F32, |pre_eps| {
        coefficients(MhcOptions { pre_eps, ..o }).map(drop)
    });
    t.values("mhc post_mult", &BAD_F32, |post_mult| {
        coefficients(MhcOptions { post_mult, ..o }).map(drop)
    });
    let (h, saved) = need!(t, "mhc_coefficients", coefficients(o));
    t.sweep(
        "mhc_coefficients_backward",
        &[&h.h_pre, &h.h_post, &h.h_res],
        |v| mhc::mhc_coefficients_backward(&saved, Some(v[0]), Some(v[1]), Some(v[2])).map(drop),
    );
    t.call("mhc_coefficients_backward without cotangents", || {
        mhc::mhc_coefficients_backward(&saved, None, None, None).map(drop)
    });
    t.values("mhc_coefficients_backward_as dtype", &DTYPES, |d| {
        mhc::mhc_coefficients_backward_as(&saved, Some(&h.h_pre), None, None, d).map(drop)
    });
}

#[test]
fn mhc_never_panics() {
    sweep_family("manifold-constrained hyper-connections", mhc_family);
}
