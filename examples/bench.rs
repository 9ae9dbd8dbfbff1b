//! Bandwidth of every wgrad operator against the copy kernel.
//!
//! ```text
//! cargo run --release --example bench -- [--quick] [--json PATH] [--prewarm SECONDS] [--only NAME,...] [--copy-mib MIB] [--pipeline-stats] [--profile]
//! ```
//!
//! Prints the engine, measures the copy bandwidth (256 MiB buffer, at most the device's largest
//! storage binding; `--quick`: 8 MiB; `--copy-mib`: a copy of the size an operator moves, to
//! see how much of the gap is the size itself), then times each operator on a large input (8192x8192
//! f32, or the most rows of 8192 columns that fit one binding; `--quick`: 1024x1024). Bytes
//! moved are each input read once plus each output written once; GB/s and the percentage of
//! the copy bandwidth of this same run are printed as a table and written as JSON (default
//! `$OUT/bench.json` when `OUT` is set, else `bench.json`). Every timed section follows a
//! prewarm (default 0.3 s; `--prewarm 0` turns it off, to see what idle clocks cost).
//! Compute-bound rows (matmul) also print their TFLOP/s to stderr.
//! `WGRAD_NORM_WORDS=0` (or `1`) makes every RMSNorm / add+RMSNorm register backward hold
//! widened values (or loaded words) across the row sum instead of following the rule, for
//! comparisons (bit-identical results).
//!
//! To add an operator, push one more [`Op`] in `operators`.

#[path = "support/vk_stats.rs"]
mod vk_stats;

use std::process::ExitCode;
use wgrad::bench::{self, Report};
use wgrad::gated_delta::{
    DeltaAlgorithm, GatedDeltaOptions, gated_delta_backward, gated_delta_forward,
};
use wgrad::{DType, Engine, Result, Tensor, cast, norm, reduce};

/// Records an operator once on its inputs and returns its outputs.
type RunFn = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// One benchmarked operator: its inputs and a closure that runs it once.
struct Op {
    /// Name in the table.
    name: &'static str,
    /// Dtype label, e.g. `f32` or `f32->bf16`.
    dtype: &'static str,
    /// Inputs, created before timing; the shape column shows the first one's.
    inputs: Vec<Tensor>,
    /// Records the operator once and returns its outputs.
    run: Box<RunFn>,
    /// Floating-point operations per run, when the operator is compute-bound (then the
    /// TFLOP/s of the median run is printed to stderr).
    flops: Option<f64>,
    /// Also measure the peak engine memory of one run (beyond what is live before it).
    peak: bool,
}

impl Op {
    fn new(
        name: &'static str,
        dtype: &'static str,
        inputs: Vec<Tensor>,
        run: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'static,
    ) -> Op {
        Op {
            name,
            dtype,
            inputs,
            run: Box::new(run),
            flops: None,
            peak: false,
        }
    }

    /// The same operator with its peak memory measured and reported.
    fn with_peak(self) -> Op {
        Op { peak: true, ..self }
    }

    /// The same operator, with its floating-point operations per run.
    fn with_flops(mut self, flops: f64) -> Op {
        self.flops = Some(flops);
        self
    }
}

/// Every operator wgrad has, on an input of `shape` (two axes).
fn operators(engine: &Engine, shape: &[usize]) -> Result<Vec<Op>> {
    let len: usize = shape.iter().product();
    // Ordinary values (no subnormals, which slow CPU adapters down), exact in bf16 and f16.
    let data: Vec<f32> = (0..len).map(|i| ((i % 251) as f32 - 125.0) / 8.0).collect();
    let x = Tensor::from_slice(engine, &data, shape)?;
    drop(data);
    let x_bf16 = cast::cast(&x, DType::BF16)?;
    let mut ops = vec![
        Op::new("cast", "f32->bf16", vec![x.clone()], |i| {
            Ok(vec![cast::cast(&i[0], DType::BF16)?])
        }),
        Op::new("cast", "f32->f16", vec![x.clone()], |i| {
            Ok(vec![cast::cast(&i[0], DType::F16)?])
        }),
        Op::new("cast", "bf16->f32", vec![x_bf16], |i| {
            Ok(vec![cast::cast(&i[0], DType::F32)?])
        }),
        Op::new("sum_rows", "f32", vec![x.clone()], |i| {
            Ok(vec![reduce::sum_rows(&i[0])?])
        }),
        Op::new("max_rows", "f32", vec![x.clone()], |i| {
            Ok(vec![reduce::max_rows(&i[0])?])
        }),
        Op::new("sum_columns", "f32", vec![x], |i| {
            Ok(vec![reduce::sum_columns(&i[0])?])
        }),
    ];
    ops.extend(norm_ops(engine, shape)?);
    Ok(ops)
}

/// Activations (SwiGLU, GeGLU; separate and packed layouts) at Liger's shape (BT = 8192 rows
/// of intermediate size 14336, or as many rows as fit one binding) and RoPE on q/k at B = 4,
/// T = 2048, Hq = 32, Hk = 8, D = 128 in Liger's [B, H, T, D] layout; forward and backward
/// separately, F32 and BF16.
/// `--quick`: 512 × 1024 and B = 1, T = 256, Hq = 8, Hk = 2, D = 64.
fn pointwise_operators(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::activation::{self, Activation, ActivationOptions};
    use wgrad::rope::{self, RopeLayout, RopeQkOptions, RopeScaling};
    let filled = |shape: &[usize], dtype: DType, seed: usize| -> Result<Tensor> {
        let len: usize = shape.iter().product();
        let data: Vec<f32> = (0..len)
            .map(|i| (((i + seed) % 251) as f32 - 125.0) / 32.0)
            .collect();
        cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
    };
    let width = if quick { 1024 } else { 14336 };
    // The packed input (2·width columns, F32) and the F32 gradients must fit one binding.
    let max_rows = (engine.max_binding_bytes() / (2 * width as u64 * 4)) as usize;
    let rows = (if quick { 512 } else { 8192 }).min(max_rows).max(1);
    let mut ops = Vec::new();
    for kind in [Activation::Silu, Activation::GeluTanh] {
        for (dtype, label) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
            let gate = filled(&[rows, width], dtype, 0)?;
            let up = filled(&[rows, width], dtype, 7)?;
            let dy = filled(&[rows, width], dtype, 3)?;
            let packed = filled(&[rows, 2 * width], dtype, 1)?;
            let opts = ActivationOptions::default();
            let (_, saved) = activation::forward(kind, &gate, Some(&up), &opts)?;
            let (_, saved_packed) = activation::packed_forward(kind, &packed, &opts)?;
            let fwd: &'static str = if kind == Activation::Silu {
                "swiglu_fwd"
            } else {
                "geglu_fwd"
            };
            let bwd: &'static str = if kind == Activation::Silu {
                "swiglu_bwd"
            } else {
                "geglu_bwd"
            };
            let pfwd: &'static str = if kind == Activation::Silu {
                "swiglu_packed_fwd"
            } else {
                "geglu_packed_fwd"
            };
            let pbwd: &'static str = if kind == Activation::Silu {
                "swiglu_packed_bwd"
            } else {
                "geglu_packed_bwd"
            };
            ops.push(Op::new(
                fwd,
                label,
                vec![gate.clone(), up.clone()],
                move |i| {
                    Ok(vec![
                        activation::forward(kind, &i[0], Some(&i[1]), &opts)?.0,
                    ])
                },
            ));
            if dtype != DType::F32 {
                // The gradients stored in the inputs' dtype (`backward_as`).
                let name: &'static str = if kind == Activation::Silu {
                    "swiglu_bwd_as"
                } else {
                    "geglu_bwd_as"
                };
                let saved = saved.clone();
                let inputs = vec![dy.clone(), gate.clone(), up.clone()];
                ops.push(Op::new(name, label, inputs, move |i| {
                    let g = activation::backward_as(&saved, &i[0], dtype)?;
                    Ok(vec![g.dgate].into_iter().chain(g.dup).collect())
                }));
            }
            ops.push(Op::new(bwd, label, vec![dy.clone(), gate, up], move |i| {
                let g = activation::backward(&saved, &i[0])?;
                Ok(vec![g.dgate].into_iter().chain(g.dup).collect())
            }));
            ops.push(Op::new(pfwd, label, vec![packed.clone()], move |i| {
                Ok(vec![activation::packed_forward(kind, &i[0], &opts)?.0])
            }));
            ops.push(Op::new(pbwd, label, vec![dy, packed], move |i| {
                Ok(vec![activation::backward(&saved_packed, &i[0])?.dgate])
            }));
        }
    }
    let [b, t, hq, hk, d] = if quick {
        [1, 256, 8, 2, 64]
    } else {
        [4, 2048, 32, 8, 128]
    };
    for (dtype, label) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
        let q = filled(&[b, hq, t, d], dtype, 0)?;
        let k = filled(&[b, hk, t, d], dtype, 5)?;
        let dq = filled(&[b, hq, t, d], dtype, 2)?;
        let dk = filled(&[b, hk, t, d], dtype, 3)?;
        let (cos, sin) = rope::tables(engine, t, d, 10000.0, &RopeScaling::None, dtype)?;
        // Liger's layout: q, k as [batch, heads, seq, dim].
        let opts = RopeQkOptions {
            layout: RopeLayout::Bhsd,
            ..RopeQkOptions::default()
        };
        let (_, saved) = rope::qk_forward(&q, &k, &cos, &sin, None, &opts)?;
        ops.push(Op::new(
            "rope_fwd",
            label,
            vec![q.clone(), k.clone(), cos.clone(), sin.clone()],
            move |i| {
                let ((qo, ko), _) = rope::qk_forward(&i[0], &i[1], &i[2], &i[3], None, &opts)?;
                Ok(vec![qo, ko])
            },
        ));
        if dtype != DType::F32 {
            // dq and dk stored in the cotangents' dtype.
            let saved = saved.clone();
            ops.push(Op::new(
                "rope_bwd_as",
                label,
                vec![dq.clone(), dk.clone(), cos.clone(), sin.clone()],
                move |i| {
                    let g = rope::qk_backward_as(&saved, &i[0], &i[1], dtype)?;
                    Ok(vec![g.dq, g.dk])
                },
            ));
        }
        ops.push(Op::new(
            "rope_bwd",
            label,
            vec![dq.clone(), dk.clone(), cos.clone(), sin.clone()],
            move |i| {
                let g = rope::qk_backward(&saved, &i[0], &i[1])?;
                Ok(vec![g.dq, g.dk])
            },
        ));
        // Position ids [B, T] (unchecked: the check reads the ids back) and table gradients
        // summed over the rows sharing a position.
        let ids: Vec<i32> = (0..b * t).map(|v| (v % t) as i32).collect();
        let positions = Tensor::from_slice(engine, &ids, &[b, t])?;
        let pos_opts = RopeQkOptions {
            check_positions: false,
            table_grads: true,
            ..opts
        };
        let (_, saved_pos) = rope::qk_forward(&q, &k, &cos, &sin, Some(&positions), &pos_opts)?;
        ops.push(Op::new(
            "rope_pos_fwd",
            label,
            vec![
                q.clone(),
                k.clone(),
                cos.clone(),
                sin.clone(),
                positions.clone(),
            ],
            move |i| {
                let ((qo, ko), _) =
                    rope::qk_forward(&i[0], &i[1], &i[2], &i[3], Some(&i[4]), &pos_opts)?;
                Ok(vec![qo, ko])
            },
        ));
        ops.push(Op::new(
            "rope_pos_bwd_tables",
            label,
            vec![dq, dk, q, k, cos, sin, positions],
            move |i| {
                let g = rope::qk_backward(&saved_pos, &i[0], &i[1])?;
                Ok(vec![g.dq, g.dk]
                    .into_iter()
                    .chain(g.dcos)
                    .chain(g.dsin)
                    .collect())
            },
        ));
    }
    Ok(ops)
}

struct Args {
    quick: bool,
    json: std::path::PathBuf,
    prewarm_s: f64,
    /// Operator-name prefixes to run (all when empty).
    only: Vec<String>,
    /// Size of the copy the percentages refer to (default 256 MiB, `--quick` 8 MiB).
    copy_mib: Option<u64>,
    /// After the rows: the driver's statistics of every pipeline they built.
    pipeline_stats: bool,
    profile: bool,
}

const USAGE: &str = "usage: bench [--quick] [--json PATH] [--prewarm SECONDS] [--only NAME,NAME...] [--copy-mib MIB] [--pipeline-stats] [--profile]";

fn parse_args() -> std::result::Result<Args, String> {
    let mut quick = false;
    let mut json = None;
    let mut prewarm_s = bench::DEFAULT_PREWARM_S;
    let mut only = Vec::new();
    let mut copy_mib = None;
    let mut pipeline_stats = false;
    let mut profile = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--json" => json = Some(args.next().ok_or("--json needs a path")?),
            "--prewarm" => {
                let v = args.next().ok_or("--prewarm needs seconds")?;
                prewarm_s = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or(format!("--prewarm: bad seconds {v:?}"))?;
            }
            "--only" => {
                let v = args.next().ok_or("--only needs operator names")?;
                only = v.split(',').map(str::to_string).collect();
            }
            "--copy-mib" => {
                let v = args.next().ok_or("--copy-mib needs a size")?;
                copy_mib = Some(
                    v.parse()
                        .ok()
                        .filter(|m: &u64| *m >= 1)
                        .ok_or(format!("--copy-mib: bad size {v:?}"))?,
                );
            }
            "--pipeline-stats" => pipeline_stats = true,
            "--profile" => profile = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    let json = match json {
        Some(p) => p.into(),
        None => match std::env::var_os("OUT").filter(|v| !v.is_empty()) {
            Some(dir) => std::path::Path::new(&dir).join("bench.json"),
            None => "bench.json".into(),
        },
    };
    Ok(Args {
        quick,
        json,
        prewarm_s,
        only,
        copy_mib,
        pipeline_stats,
        profile,
    })
}

/// The input shape: `[side, side]` f32 when it fits one storage binding, else as many rows
/// of `side` columns as fit.
fn input_shape(engine: &Engine, side: usize) -> Vec<usize> {
    let max_rows = (engine.max_binding_bytes() / (side as u64 * 4)) as usize;
    vec![side.min(max_rows).max(1), side]
}

fn run(args: &Args) -> Result<Report> {
    // A pool as large as the device's memory: an op's outputs reuse the previous run's buffers
    // instead of fresh ones, which wgpu would zero-fill on first use inside the timed section.
    let engine = Engine::builder().pool_limit(u64::MAX).build()?;
    println!("engine: {}", engine.info());
    let (copy_wanted, side, warmup, iters) = if args.quick {
        (8u64 << 20, 1024, 1, 5)
    } else {
        (256u64 << 20, 8192, 3, 20)
    };
    let copy_wanted = args.copy_mib.map_or(copy_wanted, |m| m << 20);
    let copy_bytes = bench::copy_bytes_for(&engine, copy_wanted);
    let copy = bench::copy_stats(&engine, copy_bytes, args.prewarm_s, warmup, iters)?;
    let mut report = Report::new(&engine, copy_bytes, &copy);
    println!(
        "copy: {:.2} GB/s over {} MiB ({:?} timer)",
        report.copy_bytes_per_s * 1e-9,
        copy_bytes >> 20,
        copy.source
    );

    let shape = input_shape(&engine, side);
    // Each family's inputs are made, timed and dropped before the next family's. A family
    // is built only when an `--only` pattern can match one of its operator names (given by
    // their prefixes), so filtered runs skip building large inputs they do not time.
    type Build<'a> = Box<dyn Fn() -> Result<Vec<Op>> + 'a>;
    let families: Vec<(&[&str], Build)> = vec![
        (
            &[
                "cast",
                "sum_rows",
                "max_rows",
                "sum_columns",
                "rms_norm",
                "layer_norm",
                "add_rms_norm",
                "modulated_rms_norm",
                "group_norm",
                "poly_norm",
                "dyt",
            ],
            Box::new(|| operators(&engine, &shape)),
        ),
        (
            &["swiglu", "geglu", "rope"],
            Box::new(|| pointwise_operators(&engine, args.quick)),
        ),
        (
            &[
                "cross_entropy",
                "softmax",
                "log_softmax",
                "sparsemax",
                "kl_div",
                "jsd",
                "tvd",
            ],
            Box::new(|| loss_operators(&engine, args.quick)),
        ),
        (&["grpo"], Box::new(|| grpo_ops(&engine, args.quick))),
        (
            &["preference"],
            Box::new(|| preference_ops(&engine, args.quick)),
        ),
        (
            &["gated_delta"],
            Box::new(|| gated_delta_ops(&engine, args.quick)),
        ),
        (
            &["attention"],
            Box::new(|| attention_ops(&engine, args.quick)),
        ),
        (
            &["dual_chunk"],
            Box::new(|| dual_chunk_ops(&engine, args.quick)),
        ),
        (&["expr"], Box::new(|| expr_ops(&engine, &shape))),
        (&["mta"], Box::new(|| mta_ops(&engine, args.quick))),
        (
            &["attn_res"],
            Box::new(|| attn_res_ops(&engine, args.quick)),
        ),
        (&["mhc"], Box::new(|| mhc_ops(&engine, args.quick))),
        (
            &["vocab_parallel"],
            Box::new(|| vocab_parallel_ops(&engine, args.quick)),
        ),
        (&["fused_moe"], Box::new(|| moe_ops(&engine, args.quick))),
        (&["matmul"], Box::new(|| matmul_ops(&engine, args.quick))),
        (&["swiglu_mlp"], Box::new(|| mlp_ops(&engine, args.quick))),
        (
            &["fused_linear"],
            Box::new(|| fused_linear_ops(&engine, args.quick)),
        ),
        (
            &["embedding"],
            Box::new(|| embedding_ops(&engine, args.quick)),
        ),
        (
            &["adamw", "sgd", "grad_norm"],
            Box::new(|| optim_ops(&engine, args.quick)),
        ),
        (
            &["probe"],
            Box::new(|| {
                // Only when asked for by name (`--only probe`): not operators.
                if args.only.iter().any(|p| p.starts_with("probe")) {
                    probe_ops(&engine, copy_bytes)
                } else {
                    Ok(Vec::new())
                }
            }),
        ),
    ];
    let wanted = |prefixes: &[&str]| {
        args.only.is_empty()
            || args.only.iter().any(|p| {
                prefixes
                    .iter()
                    .any(|t| t.starts_with(p.as_str()) || p.starts_with(t))
            })
    };
    for op in families
        .iter()
        .filter(|(prefixes, _)| wanted(prefixes))
        .flat_map(|(_, build)| match build() {
            Ok(ops) => ops.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) => vec![Err(e)],
        })
    {
        let op = op?;
        if !args.only.is_empty() && !args.only.iter().any(|p| op.name.starts_with(p.as_str())) {
            continue;
        }
        // One untimed run gives the outputs, hence the bytes moved (and compiles the kernel).
        let outputs = (op.run)(&op.inputs)?;
        let bytes: u64 = op.inputs.iter().chain(&outputs).map(Tensor::byte_len).sum();
        drop(outputs);
        // Peak memory of one more run beyond what is live (inputs, pooled buffers aside).
        let peak = if op.peak {
            engine.synchronize()?;
            let base = engine.memory().live_bytes;
            engine.reset_peak();
            drop((op.run)(&op.inputs)?);
            engine.synchronize()?;
            Some(engine.memory().peak_bytes - base)
        } else {
            None
        };
        bench::prewarm(&engine, args.prewarm_s)?;
        let stats = bench::measure(&engine, warmup, iters, || (op.run)(&op.inputs).map(drop))?;
        report.add(op.name, op.inputs[0].shape(), op.dtype, bytes, &stats);
        let row = report.rows.last_mut().expect("just added");
        row.peak_bytes = peak;
        eprintln!(
            "  {} {} {}: {:.2} GB/s, median {:.3} ms{}",
            row.name,
            row.dtype,
            row.shape,
            row.gb_per_s,
            row.median_s * 1e3,
            peak.map_or(String::new(), |p| format!(
                ", peak {:.1} MiB beyond the inputs",
                p as f64 / 1048576.0
            ))
        );
        if let Some(flops) = op.flops {
            eprintln!(
                "  {} {} {}: {:.2} TFLOP/s ({:.3e} FLOP in {:.3} ms)",
                row.name,
                row.dtype,
                row.shape,
                flops / stats.median_s * 1e-12,
                flops,
                stats.median_s * 1e3
            );
        }
        if args.profile {
            // One more run, each launch in a stamped pass of its own: GPU time by kernel entry.
            let (r, times) = engine.profile(|| (op.run)(&op.inputs).map(drop))?;
            r?;
            let total: f64 = times.iter().map(|t| t.seconds).sum();
            for t in &times {
                eprintln!(
                    "    profile {} {}: {}.{} ×{} {:.3} ms ({:.1}%)",
                    op.name,
                    op.dtype,
                    t.kernel,
                    t.entry,
                    t.launches,
                    t.seconds * 1e3,
                    100.0 * t.seconds / total.max(f64::MIN_POSITIVE)
                );
            }
        }
    }
    if args.pipeline_stats {
        // `WGRAD_DUMP_IR=DIR`: the driver's internal representations too, one file each.
        let dump = std::env::var_os("WGRAD_DUMP_IR").map(std::path::PathBuf::from);
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir).map_err(|e| wgrad::Error::Device(e.to_string()))?;
        }
        match vk_stats::report(
            &engine.built_spirv()?,
            Some(&engine.info().adapter),
            dump.as_deref(),
        ) {
            Ok(text) => println!("\n{text}"),
            Err(e) => eprintln!("pipeline statistics: {e}"),
        }
    }
    Ok(report)
}

fn main() -> ExitCode {
    // Measurement switch of the norm register backward (bit-identical either way).
    match std::env::var("WGRAD_NORM_WORDS").as_deref() {
        Ok("0") => norm::force_register_words(Some(false)),
        Ok("1") => norm::force_register_words(Some(true)),
        _ => {}
    }
    match std::env::var("WGRAD_NORM_PREFETCH").as_deref() {
        Ok("0") => norm::force_register_prefetch(Some(false)),
        Ok("1") => norm::force_register_prefetch(Some(true)),
        _ => {}
    }
    // Measurement switch of the 16-bit softmax register backward (whole or half chunks a lane).
    match std::env::var("WGRAD_SOFTMAX_WHOLE").as_deref() {
        Ok("0") => wgrad::loss::force_whole_chunk_backward(Some(false)),
        Ok("1") => wgrad::loss::force_whole_chunk_backward(Some(true)),
        _ => {}
    }
    // Measurement switch of the register rows' reductions (1: subgroup shuffles wherever the
    // adapter has them, 0: the fan-in-8 trees; unset: the rule).
    match std::env::var("WGRAD_SUBGROUP_ROWS").as_deref() {
        Ok("0") => wgrad::reduce::force_subgroup_rows(Some(false)),
        Ok("1") => wgrad::reduce::force_subgroup_rows(Some(true)),
        _ => {}
    }
    // Measurement switches of the lanes of the norm register forwards and backwards and of
    // the register softmax rows (256, 512, 1024; unset: the rules).
    let lanes = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    wgrad::norm::force_forward_lanes(lanes("WGRAD_NORM_FWD_LANES"));
    wgrad::norm::force_backward_lanes(lanes("WGRAD_NORM_BWD_LANES"));
    // Lanes a row of the norm register forwards' and backwards' segments (0: one row a
    // workgroup; unset: the rules).
    wgrad::norm::force_segments(lanes("WGRAD_NORM_SEGMENT"));
    // The norm backwards' chunk passes (0: never, the general passes; 1: wherever the rows are
    // whole chunks, modulated RMSNorm's included; unset: the rule).
    wgrad::norm::force_chunk_passes(match std::env::var("WGRAD_NORM_CHUNK_PASSES").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    });
    // The most blocks of the norm register backwards (unset: `norm::REGISTER_BLOCKS`).
    wgrad::norm::force_register_blocks(
        std::env::var("WGRAD_NORM_BLOCKS")
            .ok()
            .and_then(|v| v.parse().ok()),
    );
    wgrad::loss::force_row_lanes(lanes("WGRAD_ROW_LANES"));
    // The rows a block of the in-place cross-entropy takes (unset: 4,096).
    wgrad::loss::force_in_place_rows(
        std::env::var("WGRAD_IN_PLACE_ROWS")
            .ok()
            .and_then(|v| v.parse().ok()),
    );
    // Measurement switches of the dense products: element-by-element operand fetches (0),
    // and the tile rows per band of the launch order (a number).
    if std::env::var("WGRAD_CHUNKED_FETCHES").as_deref() == Ok("0") {
        wgrad::matmul::force_chunked_fetches(Some(false));
    }
    wgrad::matmul::force_tile_group_rows(
        std::env::var("WGRAD_GEMM_GROUP")
            .ok()
            .and_then(|v| v.parse().ok()),
    );
    // The tensor-core products' tile rows per band of the launch order (a number).
    wgrad::matmul::force_tensor_core_group_rows(
        std::env::var("WGRAD_TC_GROUP")
            .ok()
            .and_then(|v| v.parse().ok()),
    );
    // The tensor-core products' tile, `ROWSxBLOCK` (e.g. 256x64; the same bits).
    let tile = std::env::var("WGRAD_TC_TILE").ok().and_then(|v| {
        let (r, b) = v.split_once('x')?;
        Some(wgrad::matmul::TcTile {
            rows: r.parse().ok()?,
            block_rows: b.parse().ok()?,
        })
    });
    wgrad::matmul::force_tensor_core_tile(tile);
    // Tensor-core products that need the epilogue: `1` staged in F32 scratch for the finish
    // pass, `0` through workgroup memory (the same bits).
    wgrad::matmul::force_tensor_core_staging(
        std::env::var("WGRAD_TC_STAGE").ok().map(|v| v == "1"),
    );
    // Measurement switch of the attention launches' order of query blocks (bit-identical).
    wgrad::attention::force_ascending_blocks(std::env::var_os("WGRAD_ATTN_ASCENDING").is_some());
    if std::env::var_os("WGRAD_PROBE_COOP").is_some() {
        print_cooperative_matrices();
    }
    if std::env::var_os("WGRAD_PROBE_FLOAT_CONTROLS").is_some() {
        match vk_stats::float_controls() {
            Ok(lines) => print!("{lines}"),
            Err(e) => eprintln!("float controls: {e}"),
        }
        match vk_stats::bf16_support() {
            Ok(lines) => print!("{lines}"),
            Err(e) => eprintln!("bf16 support: {e}"),
        }
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let report = match run(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!();
    report.print_table();
    if let Err(e) = report.write_json(&args.json) {
        eprintln!("writing {}: {e}", args.json.display());
        return ExitCode::FAILURE;
    }
    println!("\nwrote {}", args.json.display());
    ExitCode::SUCCESS
}

/// `WGRAD_PROBE_COOP=1`: the cooperative-matrix configurations each adapter reports (the
/// tensor-core shapes wgpu 30 could use; see `notes/tensor-cores.md`).
fn print_cooperative_matrices() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    for adapter in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all())) {
        let info = adapter.get_info();
        println!(
            "adapter {} ({:?}): cooperative matrices {:?}",
            info.name,
            info.backend,
            adapter.cooperative_matrix_properties()
        );
    }
}

/// Normalization rows: forward and backward (parameter partials included) of RMSNorm,
/// LayerNorm and add+RMSNorm in F32 and BF16 on `shape`, and, on the full-size run (8192
/// columns), also on 4096x4096, Liger's RMSNorm shape 2048x32768 and the narrow rows of
/// 65536x1024 (a hidden size of 1,024); the other
/// normalizations (modulated RMSNorm, GroupNorm, PolyNorm, DyT) in F32 and BF16 on `shape`.
/// `WGRAD_NORM_SHAPES` ("ROWSxCOLS,...") replaces these shapes, for measurements of a rule.
fn norm_ops(engine: &Engine, shape: &[usize]) -> Result<Vec<Op>> {
    let mut shapes = vec![shape.to_vec()];
    if let Ok(list) = std::env::var("WGRAD_NORM_SHAPES") {
        shapes = list
            .split(',')
            .filter_map(|s| {
                let (r, c) = s.split_once('x')?;
                Some(vec![r.trim().parse().ok()?, c.trim().parse().ok()?])
            })
            .collect();
    } else if shape[1] >= 8192 {
        for extra in [[4096, 4096], [2048, 32768], [65536, 1024]] {
            if (extra[0] * extra[1] * 4) as u64 <= engine.max_binding_bytes() {
                shapes.push(extra.to_vec());
            }
        }
    }
    let mut ops = Vec::new();
    for s in &shapes {
        let (rows, cols) = (s[0], s[1]);
        let len = rows * cols;
        let data: Vec<f32> = (0..len)
            .map(|i| ((i % 251) as f32 - 125.0) / 64.0)
            .collect();
        let x32 = Tensor::from_slice(engine, &data, s)?;
        drop(data);
        let w32 = Tensor::from_slice(engine, &vec![1.25f32; cols], &[cols])?;
        for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
            let x = cast::cast(&x32, dtype)?;
            let w = cast::cast(&w32, dtype)?;
            // Cotangent and residual: copies of the source (ordinary values, exact in bf16),
            // separate buffers so every input is really read.
            let dy = wgrad::bench::copy(&x)?;
            let r = wgrad::bench::copy(&x)?;
            let o = norm::RmsNormOptions::default();
            let lo = norm::LayerNormOptions::default();

            ops.push(Op::new(
                "rms_norm fwd",
                label,
                vec![x.clone(), w.clone()],
                move |i| {
                    let (y, s) = norm::rms_norm(&i[0], Some(&i[1]), &o)?;
                    Ok(vec![y, s.inverse])
                },
            ));
            let (_, saved) = norm::rms_norm(&x, Some(&w), &o)?;
            let inputs = vec![x.clone(), dy.clone(), w.clone(), saved.inverse.clone()];
            if dtype != DType::F32 {
                // The source gradient stored in the source's dtype.
                let saved = saved.clone();
                ops.push(Op::new(
                    "rms_norm bwd_as",
                    label,
                    inputs.clone(),
                    move |i| {
                        let g = norm::norm_backward_as(&saved, &i[1], None, dtype)?;
                        Ok(vec![g.source, g.weight.expect("weight gradient")])
                    },
                ));
            }
            ops.push(Op::new("rms_norm bwd", label, inputs, move |i| {
                let g = norm::norm_backward(&saved, &i[1], None)?;
                Ok(vec![g.source, g.weight.expect("weight gradient")])
            }));

            ops.push(Op::new(
                "layer_norm fwd",
                label,
                vec![x.clone(), w.clone(), w.clone()],
                move |i| {
                    let (y, s) = norm::layer_norm(&i[0], Some(&i[1]), Some(&i[2]), &lo)?;
                    Ok(vec![y, s.inverse, s.mean.expect("mean")])
                },
            ));
            let (_, saved) = norm::layer_norm(&x, Some(&w), Some(&w), &lo)?;
            let stats = [saved.inverse.clone(), saved.mean.clone().expect("mean")];
            let inputs = vec![
                x.clone(),
                dy.clone(),
                w.clone(),
                stats[0].clone(),
                stats[1].clone(),
            ];
            if dtype != DType::F32 {
                let saved = saved.clone();
                ops.push(Op::new(
                    "layer_norm bwd_as",
                    label,
                    inputs.clone(),
                    move |i| {
                        let g = norm::norm_backward_as(&saved, &i[1], None, dtype)?;
                        Ok(vec![g.source, g.weight.expect("dw"), g.bias.expect("db")])
                    },
                ));
            }
            ops.push(Op::new("layer_norm bwd", label, inputs, move |i| {
                let g = norm::norm_backward(&saved, &i[1], None)?;
                Ok(vec![g.source, g.weight.expect("dw"), g.bias.expect("db")])
            }));

            ops.push(Op::new(
                "add_rms_norm fwd",
                label,
                vec![x.clone(), r.clone(), w.clone()],
                move |i| {
                    let (y, sum, s) = norm::add_rms_norm(&i[0], &i[1], Some(&i[2]), &o)?;
                    Ok(vec![y, sum, s.inverse])
                },
            ));
            let (_, _, saved) = norm::add_rms_norm(&x, &r, Some(&w), &o)?;
            let inputs = vec![
                x.clone(),
                r.clone(),
                dy.clone(),
                w.clone(),
                saved.inverse.clone(),
            ];
            if dtype != DType::F32 {
                let saved = saved.clone();
                ops.push(Op::new(
                    "add_rms_norm bwd_as",
                    label,
                    inputs.clone(),
                    move |i| {
                        let g = norm::norm_backward_as(&saved, &i[2], None, dtype)?;
                        Ok(vec![g.source, g.weight.expect("weight gradient")])
                    },
                ));
            }
            ops.push(Op::new("add_rms_norm bwd", label, inputs, move |i| {
                // dx and dresidual are one tensor (the same gradient), written once.
                let g = norm::norm_backward(&saved, &i[2], None)?;
                Ok(vec![g.source, g.weight.expect("weight gradient")])
            }));
        }
        if s.as_slice() != shape {
            continue;
        }
        // The other normalizations, F32 and BF16 (parameters in the source's dtype), on the
        // main shape.
        for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
            let x = cast::cast(&x32, dtype)?;
            let dy = wgrad::bench::copy(&x)?;
            let w = cast::cast(&w32, dtype)?;
            let m = Tensor::from_slice(engine, &vec![0.125f32; 2 * cols], &[2, cols])?;
            let m = cast::cast(&m, dtype)?;
            let o = norm::RmsNormOptions::default();
            ops.push(Op::new(
                "modulated_rms_norm fwd",
                label,
                vec![x.clone(), w.clone(), m.clone(), m.clone()],
                move |i| {
                    let (y, s) = norm::modulated_rms_norm(&i[0], Some(&i[1]), &i[2], &i[3], &o)?;
                    Ok(vec![y, s.inverse])
                },
            ));
            let (_, saved) = norm::modulated_rms_norm(&x, Some(&w), &m, &m, &o)?;
            let inputs = vec![
                x.clone(),
                x.clone(),
                w.clone(),
                m.clone(),
                saved.inverse.clone(),
            ];
            ops.push(Op::new("modulated_rms_norm bwd", label, inputs, move |i| {
                let g = norm::norm_backward(&saved, &i[1], None)?;
                Ok(vec![
                    g.source,
                    g.weight.expect("dw"),
                    g.scale.expect("dscale"),
                    g.shift.expect("dshift"),
                ])
            }));

            let (channels, groups) = (32, 8);
            let gx = x.reshape(&[rows, channels, cols / channels])?;
            let gdy = dy.reshape(gx.shape())?;
            let gw = Tensor::from_slice(engine, &vec![1.25f32; channels], &[channels])?;
            let gw = cast::cast(&gw, dtype)?;
            let go = norm::GroupNormOptions::default();
            ops.push(Op::new(
                "group_norm fwd",
                label,
                vec![gx.clone(), gw.clone(), gw.clone()],
                move |i| {
                    let (y, s) = norm::group_norm(&i[0], groups, Some(&i[1]), Some(&i[2]), &go)?;
                    Ok(vec![y, s.inverse, s.mean.expect("mean")])
                },
            ));
            let (_, saved) = norm::group_norm(&gx, groups, Some(&gw), Some(&gw), &go)?;
            ops.push(Op::new(
                "group_norm bwd",
                label,
                vec![gx.clone(), gdy, gw.clone()],
                move |i| {
                    let g = norm::norm_backward(&saved, &i[1], None)?;
                    Ok(vec![g.source, g.weight.expect("dw"), g.bias.expect("db")])
                },
            ));

            let pw = cast::cast(
                &Tensor::from_slice(engine, &[0.5f32, 0.25, 1.0], &[3])?,
                dtype,
            )?;
            let pb = cast::cast(&Tensor::from_slice(engine, &[0.1f32], &[1])?, dtype)?;
            let po = norm::PolyNormOptions::default();
            ops.push(Op::new(
                "poly_norm fwd",
                label,
                vec![x.clone(), pw.clone(), pb.clone()],
                move |i| {
                    let (y, s) = norm::poly_norm(&i[0], &i[1], Some(&i[2]), &po)?;
                    Ok(vec![y, s.inverse])
                },
            ));
            let (_, saved) = norm::poly_norm(&x, &pw, Some(&pb), &po)?;
            ops.push(Op::new(
                "poly_norm bwd",
                label,
                vec![x.clone(), dy.clone(), pw.clone()],
                move |i| {
                    let g = norm::poly_norm_backward(&saved, &i[1])?;
                    Ok(vec![g.source, g.weight, g.bias.expect("db")])
                },
            ));

            let alpha = cast::cast(&Tensor::from_slice(engine, &[0.5f32], &[1])?, dtype)?;
            ops.push(Op::new(
                "dyt fwd",
                label,
                vec![x.clone(), alpha.clone(), w.clone(), w.clone()],
                move |i| {
                    let (y, _) = norm::dyt(&i[0], &i[1], &i[2], Some(&i[3]))?;
                    Ok(vec![y])
                },
            ));
            let (_, saved) = norm::dyt(&x, &alpha, &w, Some(&w))?;
            ops.push(Op::new(
                "dyt bwd",
                label,
                vec![x.clone(), dy.clone(), alpha.clone(), w.clone()],
                move |i| {
                    let g = norm::dyt_backward(&saved, &i[1])?;
                    Ok(vec![g.source, g.alpha, g.gamma, g.beta.expect("dbeta")])
                },
            ));
        }
    }
    Ok(ops)
}

/// Rows of `cols` columns that fit one binding for the F32 gradient, at most `rows`.
fn fitting_rows(engine: &Engine, rows: usize, cols: usize) -> usize {
    let max_rows = (engine.max_binding_bytes() / (cols as u64 * 4)) as usize;
    rows.min(max_rows).max(1)
}

/// Logits-like data of `shape` in `dtype`: ordinary values in [-8, 8) (multiples of 1/256,
/// exact in every float dtype), made in the dtype on the host.
fn logits(engine: &Engine, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let value = |i: usize| ((i.wrapping_mul(2_654_435_761) % 4096) as f32 - 2048.0) / 256.0;
    match dtype {
        DType::BF16 => {
            let data: Vec<half::bf16> = (0..len).map(|i| half::bf16::from_f32(value(i))).collect();
            Tensor::from_slice(engine, &data, shape)
        }
        DType::F16 => {
            let data: Vec<half::f16> = (0..len).map(|i| half::f16::from_f32(value(i))).collect();
            Tensor::from_slice(engine, &data, shape)
        }
        _ => {
            let data: Vec<f32> = (0..len).map(value).collect();
            cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
        }
    }
}

/// The loss family on the issue's shapes (cross-entropy at B·T = 8·2048 rows of 131,072 and
/// 128,256 classes, in windows of rows where a tensor exceeds one binding, as many rows as one
/// buffer holds; softmax and the others at 4096×32,000), or small ones with `--quick`. Forward and backward separately,
/// plus cross-entropy forward+backward. Targets are not read back (`check_targets: false`:
/// the check synchronizes, which a timed section must not do).
fn loss_operators(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::loss::{self, CrossEntropyOptions, DivReduction};
    let (ce_rows, wide_rows, wide_cols) = if quick {
        (64, 256, 4000)
    } else {
        (8 * 2048, 4096, 32000)
    };
    let vocabularies: &[usize] = if quick { &[8192] } else { &[131_072, 128_256] };
    let mut ops = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let dname: &'static str = dtype.name();
        for &cols in vocabularies {
            // The logits in windows of the binding, as many rows as one buffer holds
            // (`max_buffer_size`: 4 GiB − 2 MiB on the H200, so 16,376 / 16,384 BF16 rows of
            // 131,072 / 128,256 classes); the F32 gradient's rows likewise (8,188 / 8,367).
            let fit = |bytes: usize| {
                ((engine.max_tensor_bytes() / (cols * bytes) as u64) as usize).clamp(1, ce_rows)
            };
            let rows = fit(dtype.size());
            let grad_rows = fit(4);
            let x = logits(engine, &[rows, cols], dtype)?;
            let targets: Vec<i32> = (0..rows).map(|r| ((r * 7919) % cols) as i32).collect();
            let t = Tensor::from_slice(engine, &targets, &[rows])?;
            let (xg, tg) = if grad_rows < rows {
                (
                    logits(engine, &[grad_rows, cols], dtype)?,
                    Tensor::from_slice(engine, &targets[..grad_rows], &[grad_rows])?,
                )
            } else {
                (x.clone(), t.clone())
            };
            let opts = CrossEntropyOptions {
                check_targets: false,
                ..Default::default()
            };
            // Peak memory of one forward+backward above what is live before it (logits and
            // targets), from the engine's statistics.
            engine.synchronize()?;
            engine.reset_peak();
            let before = engine.memory().live_bytes;
            {
                let (_, s) = loss::cross_entropy(&xg, &tg, &opts)?;
                let dx = loss::cross_entropy_backward(&s, None)?;
                engine.synchronize()?;
                drop(dx);
            }
            eprintln!(
                "  cross_entropy fwd+bwd {dname} {grad_rows}x{cols}: peak {:.1} MiB above the \
                 inputs (logits {:.1} MiB, dlogits {:.1} MiB)",
                (engine.memory().peak_bytes - before) as f64 / 1048576.0,
                xg.byte_len() as f64 / 1048576.0,
                (grad_rows * cols * 4) as f64 / 1048576.0
            );
            let o = opts.clone();
            ops.push(Op::new(
                "cross_entropy",
                dname,
                vec![x.clone(), t.clone()],
                move |i| {
                    let (out, saved) = loss::cross_entropy(&i[0], &i[1], &o)?;
                    Ok(vec![
                        out.loss,
                        out.z_loss,
                        out.accuracy,
                        out.predicted.expect("integer targets"),
                        saved.rows_matrix().clone(),
                    ])
                },
            ));
            let (_, saved) = loss::cross_entropy(&xg, &tg, &opts)?;
            let m = saved.rows_matrix().clone();
            ops.push(Op::new(
                "cross_entropy_backward",
                dname,
                vec![xg.clone(), tg.clone(), m],
                move |_| Ok(vec![loss::cross_entropy_backward(&saved, None)?]),
            ));
            let o = opts.clone();
            ops.push(Op::new(
                "cross_entropy_fwd_bwd",
                dname,
                vec![xg.clone(), tg.clone()],
                move |i| {
                    let (out, saved) = loss::cross_entropy(&i[0], &i[1], &o)?;
                    Ok(vec![out.loss, loss::cross_entropy_backward(&saved, None)?])
                },
            ));
            drop(xg);
            // 16-bit logits: the gradient in their dtype, in a fresh tensor.
            if dtype != DType::F32 {
                let (_, saved) = loss::cross_entropy(&x, &t, &opts)?;
                let m = saved.rows_matrix().clone();
                ops.push(Op::new(
                    "cross_entropy_backward_as",
                    dname,
                    vec![x.clone(), t.clone(), m],
                    move |_| Ok(vec![loss::cross_entropy_backward_as(&saved, None, dtype)?]),
                ));
                let o = opts.clone();
                ops.push(Op::new(
                    "cross_entropy_fwd_bwd_as",
                    dname,
                    vec![x.clone(), t.clone()],
                    move |i| {
                        let (out, saved) = loss::cross_entropy(&i[0], &i[1], &o)?;
                        Ok(vec![
                            out.loss,
                            loss::cross_entropy_backward_as(&saved, None, dtype)?,
                        ])
                    },
                ));
            }
            // The gradient written over the logits (a copy of them: each run overwrites its
            // input, which only changes the values the next run reads). Bytes: the logits
            // read and the gradient written, in their dtype, as the peers count theirs. Timed
            // with the peers' outputs (no predictions); the peak also with predictions.
            let xc = wgrad::bench::copy(&x)?;
            drop(x);
            let mut peaks = Vec::new();
            for predicted in [false, true] {
                engine.synchronize()?;
                engine.reset_peak();
                let before = engine.memory().live_bytes;
                let o = CrossEntropyOptions {
                    predicted,
                    ..opts.clone()
                };
                drop(loss::cross_entropy_in_place(&xc, &t, &o)?);
                engine.synchronize()?;
                peaks.push((engine.memory().peak_bytes - before) as f64 / 1048576.0);
            }
            eprintln!(
                "  cross_entropy_in_place {dname} {rows}x{cols}: peak {:.3} MiB above the inputs \
                 ({:.3} MiB with predictions)",
                peaks[0], peaks[1],
            );
            let o = CrossEntropyOptions {
                predicted: false,
                ..opts.clone()
            };
            ops.push(Op::new(
                "cross_entropy_in_place",
                dname,
                vec![xc, t],
                move |i| {
                    let out = loss::cross_entropy_in_place(&i[0], &i[1], &o)?;
                    Ok(vec![out.loss, i[0].clone()])
                },
            ));
        }
        let rows = fitting_rows(engine, wide_rows, wide_cols);
        let x = logits(engine, &[rows, wide_cols], dtype)?;
        // Cotangents in the input's dtype, as a model in that dtype would pass them.
        let dy = logits(engine, &[rows, wide_cols], dtype)?;
        let (_, saved) = loss::softmax(&x)?;
        ops.push(Op::new("softmax", dname, vec![x.clone()], |i| {
            let (y, saved) = loss::softmax(&i[0])?;
            Ok(vec![y, saved.stats().clone()])
        }));
        let stats = saved.stats().clone();
        if dtype != DType::F32 {
            // The gradient stored in x's dtype.
            let saved = saved.clone();
            ops.push(Op::new(
                "softmax_backward_as",
                dname,
                vec![x.clone(), stats.clone(), dy.clone()],
                move |i| Ok(vec![loss::softmax_backward_as(&saved, &i[2], dtype)?]),
            ));
        }
        ops.push(Op::new(
            "softmax_backward",
            dname,
            vec![x.clone(), stats, dy.clone()],
            move |i| Ok(vec![loss::softmax_backward(&saved, &i[2])?]),
        ));
        // From the output (PyTorch's rule), the gradient in the output's dtype: reads y and dy.
        let (y, _) = loss::softmax(&x)?;
        ops.push(Op::new(
            "softmax_backward_from_output",
            dname,
            vec![y, dy.clone()],
            move |i| {
                Ok(vec![loss::softmax_backward_from_output(
                    &i[0], &i[1], false, dtype,
                )?])
            },
        ));
        let (_, saved) = loss::log_softmax(&x)?;
        ops.push(Op::new("log_softmax", dname, vec![x.clone()], |i| {
            let (y, saved) = loss::log_softmax(&i[0])?;
            Ok(vec![y, saved.stats().clone()])
        }));
        let stats = saved.stats().clone();
        ops.push(Op::new(
            "log_softmax_backward",
            dname,
            vec![x.clone(), stats, dy.clone()],
            move |i| Ok(vec![loss::softmax_backward(&saved, &i[2])?]),
        ));
        if dtype == DType::F32 {
            let (_, saved) = loss::sparsemax(&x)?;
            ops.push(Op::new("sparsemax", dname, vec![x.clone()], |i| {
                let (y, saved) = loss::sparsemax(&i[0])?;
                Ok(vec![y, saved.stats().clone()])
            }));
            let stats = saved.stats().clone();
            ops.push(Op::new(
                "sparsemax_backward",
                dname,
                vec![x.clone(), stats, dy.clone()],
                move |i| Ok(vec![loss::sparsemax_backward(&saved, &i[2])?]),
            ));
        }
        // Divergences on log-probabilities (KL, JSD) and probabilities (TVD).
        let (lx, _) = loss::log_softmax(&x)?;
        let (lt, _) = loss::log_softmax(&cast::cast(&dy, dtype)?)?;
        let (px, _) = loss::softmax(&x)?;
        let (pt, _) = loss::softmax(&cast::cast(&dy, dtype)?)?;
        let divergences: [(&'static str, &'static str, Tensor, Tensor); 3] = [
            ("kl_div", "kl_div_backward", lx.clone(), lt.clone()),
            ("jsd", "jsd_backward", lx, lt),
            ("tvd", "tvd_backward", px, pt),
        ];
        for (fwd, bwd, a, b) in divergences {
            let run = move |i: &[Tensor]| match fwd {
                "kl_div" => loss::kl_div(&i[0], &i[1], true, DivReduction::BatchMean),
                "jsd" => loss::jsd(&i[0], &i[1], 0.5, None, -100),
                _ => loss::tvd(&i[0], &i[1], DivReduction::BatchMean, None, -100),
            };
            let (_, saved) = run(&[a.clone(), b.clone()])?;
            ops.push(Op::new(fwd, dname, vec![a.clone(), b.clone()], move |i| {
                Ok(vec![run(i)?.0])
            }));
            // The KL gradient `−exp(t)/n` does not use the input (its load in `div_bwd_v` is
            // dead code, measured at the bandwidth of the target read alone): the bytes moved
            // count only what a backward reads.
            let read = if fwd == "kl_div" {
                vec![b.clone()]
            } else {
                vec![a.clone(), b.clone()]
            };
            if dtype != DType::F32 {
                // The gradient stored in the input's dtype.
                let saved = saved.clone();
                let name: &'static str = match fwd {
                    "kl_div" => "kl_div_backward_as",
                    "jsd" => "jsd_backward_as",
                    _ => "tvd_backward_as",
                };
                ops.push(Op::new(name, dname, read.clone(), move |_| {
                    Ok(vec![loss::divergence_backward_as(&saved, None, dtype)?])
                }));
            }
            ops.push(Op::new(bwd, dname, read, move |_| {
                Ok(vec![loss::divergence_backward(&saved, None)?])
            }));
        }
    }
    Ok(ops)
}

/// Gated delta recurrence: forward alone and forward + backward (scalar decay, output
/// cotangent only), F32 and BF16 q/k/v, at B1 T8192 Hk16 Hv48 K=V=128 and B4 T2048 H16
/// K=V=128 (`--quick`: B1 T64 Hk2 Hv6 K=V=32). Inputs are v, q, k, beta, log_decay (and
/// d_output for forward + backward; the shape column is v's); the name carries Hk. Bytes moved
/// count the saved checkpoints as a forward output. Prints each shape's peak engine memory
/// beyond the inputs for forward and forward + backward.
fn gated_delta_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    let shapes: &[[usize; 6]] = if quick {
        &[[1, 64, 2, 6, 32, 32]]
    } else {
        &[[1, 8192, 16, 48, 128, 128], [4, 2048, 16, 16, 128, 128]]
    };
    let mut ops = Vec::new();
    for &[b, t, hk, hv, kd, vd] in shapes {
        for dtype in [DType::F32, DType::BF16] {
            let filled = |shape: &[usize], f: &dyn Fn(usize) -> f32| -> Result<Tensor> {
                let data: Vec<f32> = (0..shape.iter().product()).map(f).collect();
                Tensor::from_slice(engine, &data, shape)
            };
            let ks = 1.0 / (kd as f32).sqrt();
            let q = cast::cast(
                &filled(&[b, t, hk, kd], &|i| ((i % 13) as f32 - 6.0) / 8.0)?,
                dtype,
            )?;
            let k = cast::cast(
                &filled(&[b, t, hk, kd], &|i| if i % 3 == 0 { -ks } else { ks })?,
                dtype,
            )?;
            let v = cast::cast(
                &filled(&[b, t, hv, vd], &|i| ((i % 11) as f32 - 5.0) / 8.0)?,
                dtype,
            )?;
            let beta = filled(&[b, t, hv], &|_| 0.5)?;
            let g = filled(&[b, t, hv], &|_| -0.1)?;
            let d_out = filled(&[b, t, hv, vd], &|i| ((i % 7) as f32 - 3.0) / 4.0)?;
            let inputs = vec![v, q, k, beta, g, d_out];
            let fwd = |i: &[Tensor], algorithm: DeltaAlgorithm| {
                gated_delta_forward(
                    &i[1],
                    &i[2],
                    &i[0],
                    &i[3],
                    &i[4],
                    None,
                    &GatedDeltaOptions {
                        algorithm,
                        ..GatedDeltaOptions::default()
                    },
                )
            };
            let dt: &'static str = dtype.name();
            let name = |what: &str| -> &'static str {
                Box::leak(format!("{what} Hk{hk}").into_boxed_str())
            };
            for (algorithm, fwd_name, full_name) in [
                (
                    DeltaAlgorithm::Recurrent,
                    "gated_delta_fwd",
                    "gated_delta_fwd_bwd",
                ),
                (
                    DeltaAlgorithm::Chunked,
                    "gated_delta_chunked_fwd",
                    "gated_delta_chunked_fwd_bwd",
                ),
            ] {
                // Peak memory beyond the inputs.
                engine.synchronize()?;
                let base = engine.memory().live_bytes;
                engine.reset_peak();
                drop(fwd(&inputs, algorithm)?);
                engine.synchronize()?;
                let peak_fwd = engine.memory().peak_bytes - base;
                engine.reset_peak();
                let (_, saved) = fwd(&inputs, algorithm)?;
                drop(gated_delta_backward(&saved, Some(&inputs[5]), None)?);
                drop(saved);
                engine.synchronize()?;
                let peak_full = engine.memory().peak_bytes - base;
                println!(
                    "{fwd_name} {dtype} B{b} T{t} Hk{hk} Hv{hv} K{kd} V{vd}: peak memory beyond inputs: forward {:.1} MiB, forward+backward {:.1} MiB",
                    peak_fwd as f64 / 1048576.0,
                    peak_full as f64 / 1048576.0
                );
                ops.push(Op::new(
                    name(fwd_name),
                    dt,
                    inputs[..5].to_vec(),
                    move |i| {
                        let (out, saved) = fwd(i, algorithm)?;
                        Ok(vec![
                            out.output,
                            out.final_state,
                            saved.checkpoints().clone(),
                        ])
                    },
                ));
                ops.push(Op::new(name(full_name), dt, inputs.clone(), move |i| {
                    let (out, saved) = fwd(i, algorithm)?;
                    let g = gated_delta_backward(&saved, Some(&i[5]), None)?;
                    Ok(vec![
                        out.output,
                        out.final_state,
                        g.query,
                        g.key,
                        g.value,
                        g.beta,
                        g.log_decay,
                        g.initial_state,
                    ])
                }));
            }
        }
    }
    Ok(ops)
}

/// A `shape` tensor of `dtype` holding a sawtooth in `[-scale, scale]` (period 251).
fn ramp(engine: &Engine, shape: &[usize], scale: f32, dtype: DType) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| (((i * 7) % 251) as f32 - 125.0) / 125.0 * scale)
        .collect();
    cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
}

/// The GRPO token loss forward + backward (old and reference log-probabilities, β 0.04, a
/// mask, DAPO normalization) on logits `[8, 1025, 32768]` (`--quick`: `[2, 17, 512]`) in F32
/// and BF16, with the peak memory; the shape column is the logits'. Then the same loss on a
/// fused head (`fused_linear_grpo_fwd_bwd`, FLOPs of its three head products to stderr).
fn grpo_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::grpo::{
        GrpoInputs, GrpoOptions, GrpoTokens, fused_linear_grpo_loss,
        fused_linear_grpo_loss_backward, grpo_loss, grpo_loss_backward_as,
    };
    let (b, l, v) = if quick {
        (2, 16, 512)
    } else {
        (8, 1024, 32768)
    };
    let mut ops = Vec::new();
    for (dtype, label) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
        let logits = ramp(engine, &[b, l + 1, v], 4.0, dtype)?;
        let ids: Vec<i32> = (0..b * l).map(|i| ((i * 7919) % v) as i32).collect();
        let ids = Tensor::from_slice(engine, &ids, &[b, l])?;
        let adv: Vec<f32> = (0..b).map(|i| i as f32 / b as f32 - 0.5).collect();
        let adv = Tensor::from_slice(engine, &adv, &[b])?;
        let logp: Vec<f32> = (0..b * l).map(|i| -10.0 + (i % 5) as f32 * 0.1).collect();
        let logp = Tensor::from_slice(engine, &logp, &[b, l])?;
        let mask: Vec<i32> = (0..b * l).map(|i| i32::from(i % 7 != 0)).collect();
        let mask = Tensor::from_slice(engine, &mask, &[b, l])?;
        let options = GrpoOptions {
            beta: 0.04,
            check_ids: false,
            ..GrpoOptions::default()
        };
        // F32 gradients, and for BF16 logits also BF16 gradients (as Liger's).
        let grads: &[(&'static str, DType)] = if dtype == DType::F32 {
            &[("grpo_loss_fwd_bwd", DType::F32)]
        } else {
            &[
                ("grpo_loss_fwd_bwd_as", DType::BF16),
                ("grpo_loss_fwd_bwd", DType::F32),
            ]
        };
        for &(name, grad_dtype) in grads {
            let inputs = vec![
                logits.clone(),
                ids.clone(),
                adv.clone(),
                logp.clone(),
                logp.clone(),
                mask.clone(),
            ];
            ops.push(
                Op::new(name, label, inputs, move |i| {
                    let inputs = GrpoInputs {
                        logits: &i[0],
                        completion_ids: &i[1],
                        advantages: &i[2],
                        old_logp: Some(&i[3]),
                        ref_logp: Some(&i[4]),
                        mask: Some(&i[5]),
                    };
                    let (out, saved) = grpo_loss(&inputs, &options)?;
                    let grad = grpo_loss_backward_as(&saved, None, grad_dtype)?;
                    Ok(vec![out.loss, out.per_token, grad])
                })
                .with_peak(),
            );
        }
    }
    // On a fused head: x [4, 1024, 4096], W [128256, 4096] (`--quick`: [2, 16, 64], [512, 64]).
    let (b, l, h, v) = if quick {
        (2, 16, 64, 512)
    } else {
        (4, 1024, 4096, 128_256)
    };
    for (dtype, label, chunking) in head_chunkings(engine) {
        let x = ramp(engine, &[b, l, h], 1.0, dtype)?;
        let w = ramp(engine, &[v, h], 0.02, dtype)?;
        let ids: Vec<i32> = (0..b * l).map(|i| ((i * 7919) % v) as i32).collect();
        let ids = Tensor::from_slice(engine, &ids, &[b, l])?;
        let adv: Vec<f32> = (0..b).map(|i| i as f32 / b as f32 - 0.5).collect();
        let adv = Tensor::from_slice(engine, &adv, &[b])?;
        let logp = Tensor::from_slice(engine, &vec![-11.0f32; b * l], &[b, l])?;
        // Three head products (logits, dx, dW), all in the forward.
        let flops = 6.0 * (b * l) as f64 * h as f64 * v as f64;
        eprintln!(
            "  fused_linear_grpo {label} rows {} H{h} V{v}: {flops:.3e} FLOP per run",
            b * l
        );
        let options = GrpoOptions {
            beta: 0.04,
            check_ids: false,
            ..GrpoOptions::default()
        };
        ops.push(
            Op::new(
                "fused_linear_grpo_fwd_bwd",
                label,
                vec![x, w, ids, adv, logp],
                move |i| {
                    let head = wgrad::fused_linear::LinearHead {
                        input: &i[0],
                        weight: &i[1],
                        bias: None,
                    };
                    let tokens = GrpoTokens {
                        completion_ids: &i[2],
                        advantages: &i[3],
                        old_logp: Some(&i[4]),
                        ref_logp: Some(&i[4]),
                        mask: None,
                    };
                    let (out, saved) = fused_linear_grpo_loss(head, &tokens, &options, chunking)?;
                    let g = fused_linear_grpo_loss_backward(&saved, None)?;
                    Ok(vec![out.loss, g.input, g.weight])
                },
            )
            .with_flops(flops)
            .with_peak(),
        );
    }
    Ok(ops)
}

/// The post-training heads' configurations: F32 and BF16 with the default chunking, and where
/// the engine has tensor cores BF16 with every head product on them (`bf16 tc+grads`), then
/// also with gradients in the head's dtypes by vocabulary-block statistics (`bf16 tc+grads
/// blocks`, the default budget).
fn head_chunkings(engine: &Engine) -> Vec<(DType, &'static str, wgrad::fused_linear::Chunking)> {
    use wgrad::fused_linear::Chunking;
    let mut runs = vec![
        (DType::F32, "f32", Chunking::default()),
        (DType::BF16, "bf16", Chunking::default()),
    ];
    if wgrad::matmul::tensor_cores(engine) {
        let tc = Chunking {
            tensor_cores: true,
            tensor_core_gradients: true,
            ..Chunking::default()
        };
        let blocks = Chunking {
            head_dtype_gradients: true,
            block_statistics: true,
            ..tc
        };
        runs.extend([
            (DType::BF16, "bf16 tc+grads", tc),
            (DType::BF16, "bf16 tc+grads blocks", blocks),
        ]);
    }
    runs
}

/// The DPO loss on a fused head, forward + backward against a reference head (Liger's
/// `use_ref_model`): 2 pairs of 1,024-token completions, H 4096, V 128,256 (`--quick`: 2 pairs
/// of 16, H 64, V 512), F32 and BF16 x/W, with the peak memory; FLOPs per run (`10·rows·H·V`:
/// the reference's and the forward's logits, the backward's recomputed logits, dx and dW) to
/// stderr; the shape column is x's.
fn preference_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::fused_linear::LinearHead;
    use wgrad::preference::{
        PreferenceLoss, PreferenceOptions, PreferenceReference, preference_loss,
        preference_loss_backward,
    };
    let (pairs, t, h, v) = if quick {
        (2, 16, 64, 512)
    } else {
        (2, 1024, 4096, 128_256)
    };
    let rows = 2 * pairs * t;
    let mut ops = Vec::new();
    for (dtype, label, chunking) in head_chunkings(engine) {
        let x = ramp(engine, &[2 * pairs, t, h], 1.0, dtype)?;
        let w = ramp(engine, &[v, h], 0.02, dtype)?;
        let targets: Vec<i32> = (0..rows).map(|i| ((i * 7919) % v) as i32).collect();
        let targets = Tensor::from_slice(engine, &targets, &[2 * pairs, t])?;
        let w_ref = ramp(engine, &[v, h], 0.021, dtype)?;
        let flops = 10.0 * rows as f64 * h as f64 * v as f64;
        eprintln!("  preference_dpo {label} rows {rows} H{h} V{v}: {flops:.3e} FLOP per run");
        let options = PreferenceOptions {
            check_targets: false,
            chunking,
            ..PreferenceOptions::new(PreferenceLoss::Dpo)
        };
        ops.push(
            Op::new(
                "preference_dpo_fwd_bwd",
                label,
                vec![x, w, targets, w_ref],
                move |i| {
                    let head = LinearHead {
                        input: &i[0],
                        weight: &i[1],
                        bias: None,
                    };
                    let reference = LinearHead {
                        weight: &i[3],
                        ..head
                    };
                    let (out, saved) = preference_loss(
                        head,
                        &i[2],
                        Some(PreferenceReference::Head(reference)),
                        &options,
                    )?;
                    let g = preference_loss_backward(&saved, None)?;
                    Ok(vec![out.loss, g.input, g.weight])
                },
            )
            .with_flops(flops)
            .with_peak(),
        );
    }
    Ok(ops)
}

/// Attention at B4 H32 S2048 D128 and B1 H16 S8192 D128 (`--quick`: small), causal F32/BF16 and
/// full F32, forward and forward+backward.
fn attention_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::attention::BackwardSchedule::StoredScores;
    // The stored score-gradient schedule within the workspace bound, and within 240 MiB (at
    // B4 H32 S2048 D128 F32 that keeps the peak below SDPA's 771 MiB).
    let stored = StoredScores { budget: u64::MAX };
    let stored_240 = StoredScores { budget: 240 << 20 };
    let f32_grads = (DType::F32, DType::F32);
    Ok(vec![
        attention_op(engine, quick, 0, DType::F32, true, false)?,
        attention_op(engine, quick, 0, DType::F32, true, true)?,
        attention_op_with(engine, quick, 0, f32_grads, true, stored)?,
        attention_op_with(engine, quick, 0, f32_grads, true, stored_240)?,
        attention_op_with(engine, quick, 0, f32_grads, false, stored)?,
        attention_op_with(engine, quick, 0, f32_grads, false, stored_240)?,
        attention_op_with(engine, quick, 0, (DType::BF16, DType::BF16), true, stored)?,
        attention_op_with(engine, quick, 1, f32_grads, true, stored)?,
        attention_op_with(engine, quick, 1, f32_grads, false, stored)?,
        attention_op(engine, quick, 0, DType::BF16, true, false)?,
        attention_op(engine, quick, 0, DType::BF16, true, true)?,
        attention_op_as(engine, quick, 0, (DType::BF16, DType::BF16), true, true)?,
        attention_op(engine, quick, 0, DType::F32, false, false)?,
        attention_op(engine, quick, 0, DType::F32, false, true)?,
        attention_op(engine, quick, 1, DType::F32, true, false)?,
        attention_op(engine, quick, 1, DType::F32, true, true)?,
        attention_op(engine, quick, 1, DType::BF16, true, false)?,
        attention_op(engine, quick, 1, DType::BF16, true, true)?,
        attention_op_as(engine, quick, 1, (DType::BF16, DType::BF16), true, true)?,
        attention_op(engine, quick, 1, DType::F32, false, false)?,
        attention_op(engine, quick, 1, DType::F32, false, true)?,
    ])
}

/// Attention shapes `[batch, heads, seq, head_dim]` of the bench: B4 H32 S2048 D128 and
/// B1 H16 S8192 D128 (`--quick`: B1 H2 S128 D64 and B1 H1 S256 D64).
const ATTENTION_SHAPES: [[usize; 4]; 2] = [[4, 32, 2048, 128], [1, 16, 8192, 128]];
const ATTENTION_QUICK_SHAPES: [[usize; 4]; 2] = [[1, 2, 128, 64], [1, 1, 256, 64]];

/// One attention row: forward (`backward` false) or forward + backward, causal or full, on
/// query = key = value-shaped inputs of `dtype`. Time per run and the engine's peak memory
/// beyond the inputs (output, saved statistics, gradients and scratch) are in the table;
/// FLOPs per run are `wgrad::attention::attention_flops` (×3.5 with the backward), printed to
/// stderr.
fn attention_op(
    engine: &Engine,
    quick: bool,
    which: usize,
    dtype: DType,
    causal: bool,
    backward: bool,
) -> Result<Op> {
    attention_op_as(engine, quick, which, (dtype, DType::F32), causal, backward)
}

/// [`attention_op`] with the gradients stored in `grads` (`attention_fwd_bwd_as` when 16-bit,
/// as SDPA returns them).
fn attention_op_as(
    engine: &Engine,
    quick: bool,
    which: usize,
    (dtype, grads): (DType, DType),
    causal: bool,
    backward: bool,
) -> Result<Op> {
    attention_op_full(engine, quick, which, (dtype, grads), causal, backward, None)
}

/// Forward + backward under a backward `schedule` (`attention_fwd_bwd_stored`, or
/// `attention_fwd_bwd_stored_240m` with a 240 MiB budget; the label names the gradients' dtype
/// when 16-bit).
fn attention_op_with(
    engine: &Engine,
    quick: bool,
    which: usize,
    dtypes: (DType, DType),
    causal: bool,
    schedule: wgrad::attention::BackwardSchedule,
) -> Result<Op> {
    attention_op_full(engine, quick, which, dtypes, causal, true, Some(schedule))
}

fn attention_op_full(
    engine: &Engine,
    quick: bool,
    which: usize,
    (dtype, grads): (DType, DType),
    causal: bool,
    backward: bool,
    schedule: Option<wgrad::attention::BackwardSchedule>,
) -> Result<Op> {
    use wgrad::attention::{
        AttentionOptions, BackwardSchedule, attention_backward_with, attention_flops,
        attention_forward,
    };
    let shape = if quick {
        ATTENTION_QUICK_SHAPES[which]
    } else {
        ATTENTION_SHAPES[which]
    };
    let len: usize = shape.iter().product();
    let make = |seed: usize| -> Result<Tensor> {
        let data: Vec<f32> = (0..len)
            .map(|i| (((i * 7 + seed * 13) % 257) as f32 - 128.0) / 128.0)
            .collect();
        cast::cast(&Tensor::from_slice(engine, &data, &shape)?, dtype)
    };
    let inputs = vec![make(1)?, make(2)?, make(3)?, make(4)?];
    let flops = attention_flops(shape[0], shape[1], shape[2], shape[2], shape[3], causal)
        * if backward { 3.5 } else { 1.0 };
    let name = match (backward, grads, schedule) {
        (true, _, Some(BackwardSchedule::StoredScores { budget })) if budget < u64::MAX => {
            "attention_fwd_bwd_stored_240m"
        }
        (true, _, Some(_)) => "attention_fwd_bwd_stored",
        (true, DType::F32, None) => "attention_fwd_bwd",
        (true, _, None) => "attention_fwd_bwd_as",
        _ => "attention_fwd",
    };
    let label = match (dtype, causal) {
        (DType::BF16, true) => "bf16 causal",
        (DType::BF16, false) => "bf16 full",
        (_, true) => "f32 causal",
        (_, false) => "f32 full",
    };
    eprintln!("  {name} {label} {shape:?}: {:.3e} FLOP per run", flops);
    Ok(Op::new(name, label, inputs, move |i| {
        let options = AttentionOptions {
            causal,
            ..Default::default()
        };
        let (out, saved) = attention_forward(&i[0], &i[1], &i[2], &options)?;
        if backward {
            let schedule = schedule.unwrap_or(BackwardSchedule::Recompute);
            let g = attention_backward_with(&saved, &i[3], grads, schedule)?;
            Ok(vec![out, g.query, g.key, g.value])
        } else {
            Ok(vec![out, saved.output_f32().clone()])
        }
    })
    .with_peak())
}

/// Dual chunk attention on the first attention shape (B4 H32 S2048 D128; `--quick` B1 H2 S128
/// D64) in chunks of a quarter of the sequence: forward, and forward + backward (F32
/// gradients), F32 and BF16; three query branches, key, value, cotangent.
fn dual_chunk_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::dual_chunk::{
        DualChunkOptions, DualChunkQueries, dual_chunk_attention, dual_chunk_attention_backward,
    };
    let shape = if quick {
        ATTENTION_QUICK_SHAPES[0]
    } else {
        ATTENTION_SHAPES[0]
    };
    let len: usize = shape.iter().product();
    let options = DualChunkOptions {
        chunk_len: shape[2] / 4,
        scale: None,
        layout: Default::default(),
    };
    let mut ops = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for backward in [false, true] {
            let make = |seed: usize| -> Result<Tensor> {
                let data: Vec<f32> = (0..len)
                    .map(|i| (((i * 7 + seed * 13) % 257) as f32 - 128.0) / 128.0)
                    .collect();
                cast::cast(&Tensor::from_slice(engine, &data, &shape)?, dtype)
            };
            let inputs = (1..=6).map(make).collect::<Result<Vec<_>>>()?;
            let name = if backward {
                "dual_chunk_fwd_bwd"
            } else {
                "dual_chunk_fwd"
            };
            let label = match dtype {
                DType::F32 => "f32 causal, chunks of S/4",
                _ => "bf16 causal, chunks of S/4",
            };
            ops.push(
                Op::new(name, label, inputs, move |i| {
                    let queries = DualChunkQueries {
                        intra: &i[0],
                        successive: &i[1],
                        inter: &i[2],
                    };
                    let (out, saved) = dual_chunk_attention(queries, &i[3], &i[4], &options)?;
                    if !backward {
                        return Ok(vec![out, saved.output_f32().clone()]);
                    }
                    let g = dual_chunk_attention_backward(&saved, &i[5])?;
                    Ok(vec![out, g.intra, g.successive, g.inter, g.key, g.value])
                })
                .with_peak(),
            );
        }
    }
    Ok(ops)
}

/// Expression VJPs (`wgrad::expr`): RMSNorm with a weight written as an expression,
/// `x / sqrt(Σx²/cols + 1e-5) · w`, forward and backward (dx and dw) on the norm rows' main
/// shape, beside the hand-written `rms_norm` rows.
fn expr_ops(engine: &Engine, shape: &[usize]) -> Result<Vec<Op>> {
    use std::rc::Rc;
    use wgrad::expr::{Expr, ExprOp, Kind};
    let cols = shape[1];
    let x = Expr::input(0, Kind::Element);
    let w = Expr::input(1, Kind::Column);
    let y = &x / ((&x * &x).row_sum() / Expr::width() + 1e-5).sqrt() * &w;
    let op = Rc::new(ExprOp::new(&[Kind::Element, Kind::Column], &[y])?);
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| ((i % 251) as f32 - 125.0) / 64.0)
        .collect();
    let x32 = Tensor::from_slice(engine, &data, shape)?;
    drop(data);
    let w32 = Tensor::from_slice(engine, &vec![1.25f32; cols], &[cols])?;
    let mut ops = Vec::new();
    for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
        let x = cast::cast(&x32, dtype)?;
        let w = cast::cast(&w32, dtype)?;
        let dy = wgrad::bench::copy(&x)?;
        let fwd = op.clone();
        ops.push(Op::new(
            "expr_rms_norm fwd",
            label,
            vec![x.clone(), w.clone()],
            move |i| Ok(fwd.forward(&[&i[0], &i[1]], &[dtype])?.0),
        ));
        let (_, saved) = op.forward(&[&x, &w], &[dtype])?;
        let stats = saved.statistics().expect("a row reduction").clone();
        let bwd = op.clone();
        ops.push(Op::new(
            "expr_rms_norm bwd",
            label,
            vec![x, dy, w, stats],
            move |i| bwd.backward(&saved, &[Some(&i[1])], &[0, 1]),
        ));
    }
    Ok(ops)
}

/// Multi-token attention (`wgrad::mta`) at Liger's benchmark settings: batch 2, 4 heads into 4
/// channels, a 3 × 3 kernel with padding 1, softmax, bias; L 1,024 and 2,048 (`--quick`: 64);
/// forward, and forward + backward.
fn mta_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::mta::{
        MtaOptions, multi_token_attention, multi_token_attention_backward,
        multi_token_attention_backward_as,
    };
    let sides: &[usize] = if quick { &[64] } else { &[1024, 2048] };
    let options = MtaOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let mut ops = Vec::new();
    for &l in sides {
        for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
            let shape = [2, 4, l, l];
            let len: usize = shape.iter().product();
            let data: Vec<f32> = (0..len)
                .map(|i| ((i * 7 % 257) as f32 - 128.0) / 32.0)
                .collect();
            let scores = cast::cast(&Tensor::from_slice(engine, &data, &shape)?, dtype)?;
            let dy = wgrad::bench::copy(&scores)?;
            drop(data);
            let wdata: Vec<f32> = (0..144).map(|i| ((i % 13) as f32 - 6.0) / 20.0).collect();
            let weight = cast::cast(&Tensor::from_slice(engine, &wdata, &[4, 4, 3, 3])?, dtype)?;
            let bias = cast::cast(
                &Tensor::from_slice(engine, &[0.1f32, -0.2, 0.3, 0.0], &[4])?,
                dtype,
            )?;
            // Forward; forward + backward; for 16-bit scores also the gradients in their dtype.
            let mut modes = vec![
                ("mta_fwd", false, DType::F32),
                ("mta_fwd_bwd", true, DType::F32),
            ];
            if dtype != DType::F32 {
                modes.push(("mta_fwd_bwd_as", true, dtype));
            }
            for (name, backward, grad_dtype) in modes {
                let inputs = vec![scores.clone(), weight.clone(), bias.clone(), dy.clone()];
                ops.push(
                    Op::new(name, label, inputs, move |i| {
                        let (y, saved) =
                            multi_token_attention(&i[0], &i[1], Some(&i[2]), &options)?;
                        if !backward {
                            return Ok(vec![y]);
                        }
                        let g = if grad_dtype == DType::F32 {
                            multi_token_attention_backward(&saved, &i[3])?
                        } else {
                            multi_token_attention_backward_as(&saved, &i[3], grad_dtype)?
                        };
                        Ok(vec![y, g.scores, g.weight, g.bias.expect("bias gradient")])
                    })
                    .with_peak(),
                );
            }
        }
    }
    Ok(ops)
}

/// Attention residuals (`wgrad::attn_res`): 8 blocks of 2 × 1,024 tokens of width 4,096
/// (`--quick`: 4 blocks of 64 tokens of 256); forward, and forward + backward.
fn attn_res_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::attn_res::{AttnResOptions, attn_res, attn_res_backward, attn_res_backward_as};
    let (n, tokens, d) = if quick { (4, 64, 256) } else { (8, 2048, 4096) };
    let mut ops = Vec::new();
    for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
        let make = |len: usize, shape: &[usize], scale: f32| -> Result<Tensor> {
            let data: Vec<f32> = (0..len)
                .map(|i| ((i * 7 % 251) as f32 - 125.0) / scale)
                .collect();
            cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
        };
        let v = make(n * tokens * d, &[n, 2, tokens / 2, d], 64.0)?;
        let q = make(d, &[d], 2000.0)?;
        let w = make(d, &[d], 500.0)?;
        let dh = make(tokens * d, &[2, tokens / 2, d], 64.0)?;
        // Forward; forward + backward; for 16-bit blocks also the gradients in their dtype.
        let mut modes = vec![
            ("attn_res_fwd", false, DType::F32),
            ("attn_res_fwd_bwd", true, DType::F32),
        ];
        if dtype != DType::F32 {
            modes.push(("attn_res_fwd_bwd_as", true, dtype));
        }
        for (name, backward, grad_dtype) in modes {
            let inputs = vec![v.clone(), q.clone(), w.clone(), dh.clone()];
            ops.push(
                Op::new(name, label, inputs, move |i| {
                    let (h, saved) = attn_res(&i[0], &i[1], &i[2], &AttnResOptions::default())?;
                    if !backward {
                        return Ok(vec![h]);
                    }
                    let g = if grad_dtype == DType::F32 {
                        attn_res_backward(&saved, &i[3])?
                    } else {
                        attn_res_backward_as(&saved, &i[3], grad_dtype)?
                    };
                    Ok(vec![h, g.blocks, g.query, g.norm])
                })
                .with_peak(),
            );
        }
    }
    Ok(ops)
}

/// Fused mixture of experts (`wgrad::moe`), Qwen3-MoE-30B's experts: 4,096 tokens, 128
/// experts, H 2,048, I 768, top-8 (`--quick`: 64 tokens, 8 experts, H 128, I 64, top-2), every
/// expert equally loaded; forward (routing included), and forward + backward. FLOPs are the
/// products' (three an expert slot forward, six more backward).
fn moe_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::matmul::matmul_flops;
    use wgrad::moe::{MoeOptions, fused_moe, fused_moe_backward, fused_moe_backward_as};
    let [t, e, h, i, k] = if quick {
        [64, 8, 128, 64, 2]
    } else {
        [4096, 128, 2048, 768, 8]
    };
    let index: Vec<u32> = (0..t * k)
        .map(|f| ((f / k * 7 + f % k * (e / k)) % e) as u32)
        .collect();
    let idx = Tensor::from_slice(engine, &index, &[t, k])?;
    // The backward's sorted rows at this shape (T·K = 32,768 of H 2,048 and I 768, F32) take
    // 0.94 GB of scratch at their peak (`fused_moe_backward_workspace_bytes`), near the
    // default bound of 1 GiB: room for the products' split sums and for padding.
    engine.set_workspace_bound(engine.workspace_bound().max(4 << 30));
    let mut ops = Vec::new();
    for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
        let make = |shape: &[usize], seed: usize, scale: f32| -> Result<Tensor> {
            let len: usize = shape.iter().product();
            let data: Vec<f32> = (0..len)
                .map(|v| (((v * 7 + seed * 13) % 257) as f32 - 128.0) / scale)
                .collect();
            cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
        };
        let x = make(&[t, h], 1, 128.0)?;
        let gate_up = make(&[e, 2 * i, h], 2, 4096.0)?;
        let down = make(&[e, h, i], 3, 4096.0)?;
        let weights = make(&[t, k], 4, 1024.0)?;
        let dy = make(&[t, h], 5, 128.0)?;
        let slot_products = matmul_flops(1, t * k, i, h);
        eprintln!(
            "  fused_moe {label} T{t} E{e} H{h} I{i} K{k}: {:.3e} FLOP per forward",
            3.0 * slot_products
        );
        // Exact routing (padded: every expert equally loaded here), then a capacity of 1.25 ×
        // the mean load (nothing drops), for F32 the launch an expert (`pad: false`), and for
        // BF16 the tensor-core products.
        let capacity = (t * k).div_ceil(e) * 5 / 4;
        let mut rows = vec![
            ("fused_moe_fwd", false, None, true, false),
            ("fused_moe_fwd_bwd", true, None, true, false),
            ("fused_moe_capacity_fwd", false, Some(capacity), true, false),
            (
                "fused_moe_capacity_fwd_bwd",
                true,
                Some(capacity),
                true,
                false,
            ),
        ];
        if dtype == DType::F32 {
            rows.push(("fused_moe_per_expert_fwd", false, None, false, false));
        } else {
            // The output and the gradients in the storage dtype (`MoeOptions::output`,
            // `fused_moe_backward_as`).
            rows.push(("fused_moe_as_fwd", false, None, true, false));
            rows.push(("fused_moe_as_fwd_bwd", true, None, true, false));
        }
        if dtype != DType::F32 && wgrad::matmul::tensor_cores(engine) {
            rows.push(("fused_moe_tc_fwd", false, None, true, true));
            rows.push(("fused_moe_tc_fwd_bwd", true, None, true, true));
        }
        for (name, backward, capacity, pad, tensor_cores) in rows {
            let inputs = vec![
                x.clone(),
                gate_up.clone(),
                down.clone(),
                idx.clone(),
                weights.clone(),
                dy.clone(),
            ];
            let flops = if backward { 9.0 } else { 3.0 } * slot_products;
            let output = if name.starts_with("fused_moe_as") {
                dtype
            } else {
                DType::F32
            };
            ops.push(
                Op::new(name, label, inputs, move |v| {
                    let o = MoeOptions {
                        capacity,
                        pad,
                        tensor_cores,
                        output,
                        ..MoeOptions::default()
                    };
                    let (y, saved) = fused_moe(&v[0], &v[1], &v[2], &v[3], &v[4], &o)?;
                    if !backward {
                        return Ok(vec![y]);
                    }
                    let g = if output == DType::F32 {
                        fused_moe_backward(&saved, &v[5])?
                    } else {
                        fused_moe_backward_as(&saved, &v[5], output)?
                    };
                    Ok(vec![y, g.x, g.gate_up, g.down, g.weights])
                })
                .with_flops(flops)
                .with_peak(),
            );
        }
    }
    Ok(ops)
}

/// Manifold-constrained hyper-connections (`wgrad::mhc`): 2 × 2,048 tokens of 4 streams of
/// width 4,096 (`--quick`: 64 tokens of 4 × 256); the coefficients (all three cotangents), the
/// pre-aggregation and the post + residual mix, forward and forward + backward.
fn mhc_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::mhc::{
        MhcOptions, mhc_coefficients, mhc_coefficients_backward, mhc_post_res,
        mhc_post_res_backward, mhc_pre, mhc_pre_backward,
    };
    let (tokens, n, c) = if quick { (64, 4, 256) } else { (4096, 4, 4096) };
    let m = n * n + 2 * n;
    let lead = [2, tokens / 2];
    let with = |tail: &[usize]| [&lead[..], tail].concat();
    let mut ops = Vec::new();
    for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
        let make = |shape: &[usize], scale: f32| -> Result<Tensor> {
            let len = shape.iter().product();
            let data: Vec<f32> = (0..len)
                .map(|i| ((i * 7 % 251) as f32 - 125.0) / scale)
                .collect();
            cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
        };
        let x = make(&with(&[n, c]), 64.0)?;
        let phi = make(&[n * c, m], 20000.0)?;
        let b = make(&[m], 200.0)?;
        let a = make(&[1], 100.0)?;
        let f = make(&with(&[c]), 64.0)?;
        let hp = make(&with(&[n]), 200.0)?;
        let hr = make(&with(&[n, n]), 500.0)?;
        let gx = make(&with(&[n, c]), 64.0)?;
        for backward in [false, true] {
            let name = if backward {
                "mhc_coefficients_fwd_bwd"
            } else {
                "mhc_coefficients_fwd"
            };
            let inputs = vec![x.clone(), phi.clone(), b.clone(), a.clone()];
            ops.push(
                Op::new(name, label, inputs, move |i| {
                    let o = MhcOptions::default();
                    let (h, saved) =
                        mhc_coefficients(&i[0], &i[1], &i[2], &i[3], &i[3], &i[3], &o)?;
                    if !backward {
                        return Ok(vec![h.h_pre, h.h_post, h.h_res]);
                    }
                    let (gp, gq, gr) = (Some(&h.h_post), Some(&h.h_pre), Some(&h.h_res));
                    let g = mhc_coefficients_backward(&saved, gp, gq, gr)?;
                    Ok(vec![h.h_res, g.x, g.phi, g.b, g.alpha_res])
                })
                .with_peak(),
            );
            let name = if backward {
                "mhc_pre_fwd_bwd"
            } else {
                "mhc_pre_fwd"
            };
            let inputs = vec![x.clone(), hp.clone(), f.clone()];
            ops.push(
                Op::new(name, label, inputs, move |i| {
                    let (out, saved) = mhc_pre(&i[0], &i[1])?;
                    if !backward {
                        return Ok(vec![out]);
                    }
                    let g = mhc_pre_backward(&saved, &i[2])?;
                    Ok(vec![out, g.x, g.h_pre])
                })
                .with_peak(),
            );
            let name = if backward {
                "mhc_post_res_fwd_bwd"
            } else {
                "mhc_post_res_fwd"
            };
            let inputs = vec![x.clone(), f.clone(), hp.clone(), hr.clone(), gx.clone()];
            ops.push(
                Op::new(name, label, inputs, move |i| {
                    let (out, saved) = mhc_post_res(&i[0], &i[1], &i[2], &i[3])?;
                    if !backward {
                        return Ok(vec![out]);
                    }
                    let g = mhc_post_res_backward(&saved, &i[4])?;
                    Ok(vec![out, g.x, g.f_out, g.h_post, g.h_res])
                })
                .with_peak(),
            );
        }
    }
    Ok(ops)
}

/// Vocabulary-parallel cross-entropy (`wgrad::vocab_parallel`): 4,096 rows over a vocabulary of
/// 32,000 in 4 shards (`--quick`: 64 rows of 4 × 500), mean loss; the steps on one engine,
/// forward and forward + backward.
fn vocab_parallel_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::vocab_parallel::{
        VocabParallelOptions, vocab_parallel_cross_entropy, vocab_parallel_cross_entropy_backward,
    };
    let (rows, width) = if quick { (64, 500) } else { (4096, 8000) };
    let targets: Vec<i32> = (0..rows)
        .map(|r| ((r * 7919) % (4 * width)) as i32)
        .collect();
    let t = Tensor::from_slice(engine, &targets, &[rows])?;
    let dl = Tensor::from_slice(engine, &[1.0f32], &[])?;
    let mut ops = Vec::new();
    for (label, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
        let mut inputs = Vec::new();
        for k in 0..4 {
            let data: Vec<f32> = (0..rows * width)
                .map(|i| (((i + k * 31) * 13 % 509) as f32 - 254.0) / 64.0)
                .collect();
            inputs.push(cast::cast(
                &Tensor::from_slice(engine, &data, &[rows, width])?,
                dtype,
            )?);
        }
        inputs.push(t.clone());
        inputs.push(dl.clone());
        for backward in [false, true] {
            let name = if backward {
                "vocab_parallel_ce_fwd_bwd"
            } else {
                "vocab_parallel_ce_fwd"
            };
            ops.push(
                Op::new(name, label, inputs.clone(), move |i| {
                    let shards = [&i[0], &i[1], &i[2], &i[3]];
                    let (loss, saved) = vocab_parallel_cross_entropy(
                        &shards,
                        &i[4],
                        &VocabParallelOptions::default(),
                    )?;
                    if !backward {
                        return Ok(vec![loss]);
                    }
                    let mut out = vocab_parallel_cross_entropy_backward(&saved, &shards, &i[5])?;
                    out.push(loss);
                    Ok(out)
                })
                .with_peak(),
            );
        }
    }
    Ok(ops)
}

/// Matmul shapes (M, K, N) of the bench: 4096³ and 8192×4096×14336 (`--quick`: 256³ and
/// 512×256×768).
const MATMUL_SHAPES: [[usize; 3]; 2] = [[4096, 4096, 4096], [8192, 4096, 14336]];
const MATMUL_QUICK_SHAPES: [[usize; 3]; 2] = [[256, 256, 256], [512, 256, 768]];
/// The fused linear cross-entropy's input-gradient product (M, K, N) = chunk rows × vocabulary
/// × hidden, `dlogits[M, K] · W[K, N]` with W stored `[vocab, hidden]`: few output tiles and a
/// long K, the split-K case (`--quick`: 16 × 8192 × 256).
const MATMUL_SPLIT_SHAPE: [usize; 3] = [256, 128_256, 4096];
const MATMUL_SPLIT_QUICK_SHAPE: [usize; 3] = [16, 8192, 256];

/// Probes of passes that write over the buffer they read (`wgrad::bench::probe_in_place`),
/// beside the copy, on a buffer of the copy's size: in place one vec4 a lane, four a lane, and
/// the copy with its source bound read-write.
fn probe_ops(engine: &Engine, bytes: u64) -> Result<Vec<Op>> {
    let x = Tensor::zeros(engine, &[(bytes / 4) as usize], DType::U32)?;
    let mut ops = vec![Op::new("probe_copy", "u32", vec![x.clone()], |i| {
        Ok(vec![wgrad::bench::copy(&i[0])?])
    })];
    for (name, probe) in [
        ("probe_rewrite", "rewrite"),
        ("probe_rewrite_x4", "rewrite_x4"),
    ] {
        ops.push(Op::new(name, "u32", vec![x.clone()], move |i| {
            // `out` is not bound by the in-place probes.
            wgrad::bench::probe_in_place(probe, &i[0], &i[0])?;
            // In place: the same bytes are read and written (the input counted twice).
            Ok(vec![i[0].clone()])
        }));
    }
    let out = Tensor::zeros(engine, x.shape(), DType::U32)?;
    ops.push(Op::new("probe_copy_rw", "u32", vec![x], move |i| {
        wgrad::bench::probe_in_place("copy_rw", &i[0], &out)?;
        Ok(vec![out.clone()])
    }));
    Ok(ops)
}

/// Dense matmul as a linear layer, `x[M, K] · Wᵀ` with weights stored `[N, K]`, F32 and BF16
/// inputs (F32 output and gradients; with BF16 inputs also the BF16 output and gradients of
/// `matmul_as` / `matmul_backward_as`), forward and backward (dx, dW) timed separately. FLOPs per run are
/// `wgrad::matmul::matmul_flops` (×2 for the backward); TFLOP/s go to stderr.
fn matmul_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::matmul::{
        MatmulOptions, matmul, matmul_as, matmul_backward, matmul_backward_as, matmul_flops,
    };
    let shapes = if quick {
        MATMUL_QUICK_SHAPES
    } else {
        MATMUL_SHAPES
    };
    let options = MatmulOptions {
        transpose_b: true,
        ..Default::default()
    };
    // Deterministic operands in [-0.5, 0.5), stored in `dtype`.
    let make = |shape: &[usize], seed: usize, dtype: DType| -> Result<Tensor> {
        let len: usize = shape.iter().product();
        let data: Vec<f32> = (0..len)
            .map(|i| (((i * 7 + seed * 13) % 257) as f32 - 128.0) / 256.0)
            .collect();
        cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
    };
    let mut ops = Vec::new();
    for [m, k, n] in shapes {
        for dtype in [DType::F32, DType::BF16] {
            let x = make(&[m, k], 1, dtype)?;
            let w = make(&[n, k], 2, dtype)?;
            let dy = make(&[m, n], 3, dtype)?;
            let label = if dtype == DType::BF16 { "bf16" } else { "f32" };
            let flops = matmul_flops(1, m, n, k);
            eprintln!("  matmul {label} M{m} K{k} N{n}: {flops:.3e} FLOP per forward");
            ops.push(
                Op::new("matmul_fwd", label, vec![x.clone(), w.clone()], move |i| {
                    let (y, _) = matmul(&i[0], &i[1], None, &options)?;
                    Ok(vec![y])
                })
                .with_flops(flops),
            );
            if dtype != DType::F32 {
                // The product stored in BF16 by its epilogue (half the output bytes).
                ops.push(
                    Op::new(
                        "matmul_fwd_as",
                        label,
                        vec![x.clone(), w.clone()],
                        move |i| {
                            let (y, _) = matmul_as(&i[0], &i[1], None, &options, dtype)?;
                            Ok(vec![y])
                        },
                    )
                    .with_flops(flops),
                );
            }
            let (_, saved) = matmul(&x, &w, None, &options)?;
            if dtype != DType::F32 {
                // dx and dW stored in BF16 by their products' epilogues.
                let saved = saved.clone();
                ops.push(
                    Op::new(
                        "matmul_bwd_as",
                        label,
                        vec![x.clone(), w.clone(), dy.clone()],
                        move |i| {
                            let g = matmul_backward_as(&saved, &i[2], dtype)?;
                            Ok(vec![g.a, g.b])
                        },
                    )
                    .with_flops(2.0 * flops),
                );
            }
            ops.push(
                Op::new("matmul_bwd", label, vec![x, w, dy], move |i| {
                    let g = matmul_backward(&saved, &i[2])?;
                    Ok(vec![g.a, g.b])
                })
                .with_flops(2.0 * flops),
            );
        }
        if wgrad::matmul::tensor_cores(engine) {
            let flops = matmul_flops(1, m, n, k);
            let tc = MatmulOptions {
                tensor_cores: true,
                ..options
            };
            // F16 inputs: the FP32 path beside the tensor cores (same operands).
            let x = make(&[m, k], 1, DType::F16)?;
            let w = make(&[n, k], 2, DType::F16)?;
            ops.push(
                Op::new("matmul_fwd", "f16", vec![x.clone(), w.clone()], move |i| {
                    let (y, _) = matmul(&i[0], &i[1], None, &options)?;
                    Ok(vec![y])
                })
                .with_flops(flops),
            );
            // A linear layer on tensor cores: bias, tanh-GELU and an F16 out from the epilogue
            // (fragments through workgroup memory), the pre-activation saved.
            let bias = make(&[n], 4, DType::F16)?;
            let layer = MatmulOptions {
                activation: Some(wgrad::activation::Activation::GeluTanh),
                ..tc
            };
            ops.push(
                Op::new(
                    "matmul_fwd_tc_epilogue",
                    "f16",
                    vec![x, w, bias],
                    move |i| {
                        let (y, _) = matmul_as(&i[0], &i[1], Some(&i[2]), &layer, DType::F16)?;
                        Ok(vec![y])
                    },
                )
                .with_flops(flops),
            );
            // The tensor-core product of F16 operands, and of BF16 ones scaled into F16 (the
            // factors' passes included): forward, and the backward with a cotangent of the
            // same dtype (both its products on tensor cores).
            for (dtype, label) in [(DType::F16, "f16"), (DType::BF16, "bf16")] {
                let x = make(&[m, k], 1, dtype)?;
                let w = make(&[n, k], 2, dtype)?;
                let dy = make(&[m, n], 3, dtype)?;
                ops.push(
                    Op::new(
                        "matmul_fwd_tc",
                        label,
                        vec![x.clone(), w.clone()],
                        move |i| {
                            let (y, _) = matmul(&i[0], &i[1], None, &tc)?;
                            Ok(vec![y])
                        },
                    )
                    .with_flops(flops),
                );
                let (_, saved) = matmul(&x, &w, None, &tc)?;
                ops.push(
                    Op::new("matmul_bwd_tc", label, vec![x, w, dy], move |i| {
                        let g = matmul_backward(&saved, &i[2])?;
                        Ok(vec![g.a, g.b])
                    })
                    .with_flops(2.0 * flops),
                );
            }
            // F32 operands rounded to F16 (`round_f32_operands`), `x·Wᵀ` through `gemm`.
            let x = make(&[m, k], 1, DType::F32)?;
            let w = make(&[n, k], 2, DType::F32)?;
            let out = Tensor::zeros(engine, &[m, n], DType::F32)?;
            ops.push(
                Op::new("matmul_fwd_tc_rounded", "f32", vec![x, w], move |i| {
                    wgrad::matmul::gemm(&wgrad::matmul::Gemm {
                        tensor_cores: true,
                        round_f32_operands: true,
                        ..wgrad::matmul::Gemm::plain(
                            wgrad::matmul::GemmOperand::whole(&i[0], false),
                            wgrad::matmul::GemmOperand::whole(&i[1], true),
                            &out,
                            (m, n, k),
                            false,
                        )
                    })?;
                    Ok(vec![out.clone()])
                })
                .with_flops(flops),
            );
        }
    }
    let [m, k, n] = if quick {
        MATMUL_SPLIT_QUICK_SHAPE
    } else {
        MATMUL_SPLIT_SHAPE
    };
    for dtype in [DType::F32, DType::BF16] {
        let dlogits = make(&[m, k], 4, dtype)?;
        let w = make(&[k, n], 5, dtype)?;
        let label = if dtype == DType::BF16 { "bf16" } else { "f32" };
        let flops = matmul_flops(1, m, n, k);
        let slices = wgrad::matmul::gemm_split(m, n, k, 1);
        eprintln!("  matmul (FLCE dx) {label} M{m} K{k} N{n}: {flops:.3e} FLOP, {slices} K slices");
        ops.push(
            Op::new("matmul_flce_dx", label, vec![dlogits, w], move |i| {
                let (y, _) = matmul(&i[0], &i[1], None, &MatmulOptions::default())?;
                Ok(vec![y])
            })
            .with_flops(flops),
        );
    }
    Ok(ops)
}

/// The fused SwiGLU MLP at a Llama-3-8B layer (rows × hidden × intermediate = 4096 × 4096 ×
/// 14336; `--quick`: 256 × 256 × 688), F32 and BF16 inputs, and F16 with `tensor_cores` where
/// the engine runs them (gate, up and `dh` products on tensor cores): forward (three products) and
/// backward with saved products (six products), TFLOP/s to stderr; then forward+backward with
/// the peak memory, untiled and tiled by a quarter of the rows (`MlpOptions::tile_rows`).
fn mlp_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::matmul::matmul_flops;
    use wgrad::mlp::{MlpOptions, mlp, mlp_backward};
    let [t, h, i] = if quick {
        [256, 256, 688]
    } else {
        [4096, 4096, 14336]
    };
    let mut ops = Vec::new();
    let mut runs = vec![(DType::F32, false), (DType::BF16, false)];
    if wgrad::matmul::tensor_cores(engine) {
        runs.push((DType::F16, true));
    }
    for (dtype, tensor_cores) in runs {
        let base = MlpOptions {
            tensor_cores,
            ..MlpOptions::default()
        };
        let make = |shape: &[usize], seed: usize| -> Result<Tensor> {
            let len: usize = shape.iter().product();
            let data: Vec<f32> = (0..len)
                .map(|v| (((v * 7 + seed * 13) % 257) as f32 - 128.0) / 2048.0)
                .collect();
            cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
        };
        let x = make(&[t, h], 1)?;
        let wg = make(&[i, h], 2)?;
        let wu = make(&[i, h], 3)?;
        let wd = make(&[h, i], 4)?;
        let dy = make(&[t, h], 5)?;
        let label = match dtype {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            _ => "f32",
        };
        let product = matmul_flops(1, t, i, h);
        eprintln!(
            "  swiglu_mlp {label} T{t} H{h} I{i}: {:.3e} FLOP per forward",
            3.0 * product
        );
        ops.push(
            Op::new(
                "swiglu_mlp_fwd",
                label,
                vec![x.clone(), wg.clone(), wu.clone(), wd.clone()],
                move |v| {
                    let (y, _) = mlp(&v[0], &v[1], &v[2], &v[3], &base)?;
                    Ok(vec![y])
                },
            )
            .with_flops(3.0 * product),
        );
        let (_, saved) = mlp(&x, &wg, &wu, &wd, &base)?;
        let inputs = vec![x, wg, wu, wd, dy];
        ops.push(
            Op::new("swiglu_mlp_bwd", label, inputs.clone(), move |v| {
                let g = mlp_backward(&saved, &v[4])?;
                Ok(vec![g.x, g.gate, g.up, g.down])
            })
            .with_flops(6.0 * product),
        );
        // Forward and backward with their peak memory: untiled (9 products), and tiled by
        // T/4 rows (11: the gate and up products recomputed).
        for (name, tile_rows, products) in [
            ("swiglu_mlp_fwd_bwd", None, 9.0),
            ("swiglu_mlp_tiled_fwd_bwd", Some(t.div_ceil(4)), 11.0),
        ] {
            let options = MlpOptions { tile_rows, ..base };
            ops.push(
                Op::new(name, label, inputs.clone(), move |v| {
                    let (y, saved) = mlp(&v[0], &v[1], &v[2], &v[3], &options)?;
                    let g = mlp_backward(&saved, &v[4])?;
                    Ok(vec![y, g.x, g.gate, g.up, g.down])
                })
                .with_flops(products * product)
                .with_peak(),
            );
        }
    }
    Ok(ops)
}

/// Fused linear cross-entropy forward + backward (mean over targets, a fifth ignored; the
/// gradients of x, W and the bias come out of the forward, the backward returns them) at
/// Liger's benchmark shape H 4096, V 128,256, BT 2,048 and 8,192, F32 and BF16 x/W/bias, and
/// F16 with `Chunking::tensor_cores` where the engine runs them (the logits products on tensor
/// cores) (`--quick`: H 128, V 2,048, BT 64 and 256), chunked by the default budget (the engine's
/// workspace bound). Inputs are x, W, bias, targets (the shape column is x's). Each row also
/// reports the peak engine memory of one run beyond the inputs; FLOPs per run
/// (`6·BT·H·V`: logits, d input, d weight) are printed to stderr.
fn fused_linear_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::fused_linear::{
        FusedLinearCrossEntropyOptions, LinearHead, fused_linear_cross_entropy,
        fused_linear_cross_entropy_backward, plan_cross_entropy,
    };
    use wgrad::loss::CrossEntropyOptions;
    let (hidden, vocab, rows): (usize, usize, &[usize]) = if quick {
        (128, 2048, &[64, 256])
    } else {
        (4096, 128_256, &[2048, 8192])
    };
    let options = FusedLinearCrossEntropyOptions {
        // Targets are not read back inside timed sections (the check synchronizes).
        cross_entropy: CrossEntropyOptions {
            check_targets: false,
            ..Default::default()
        },
        ..Default::default()
    };
    // Inputs: x [bt, H], W [V, H] scaled by 1/sqrt(H), bias, targets (a fifth ignored).
    let scaled = |n: usize, scale: f32, seed: usize, dtype: DType| -> Result<Tensor> {
        let data: Vec<f32> = (0..n)
            .map(|i| ((((i + seed) * 7919) % 2001) as f32 - 1000.0) / 1000.0 * scale)
            .collect();
        cast::cast(&Tensor::from_slice(engine, &data, &[n])?, dtype)
    };
    let weight = |dtype: DType| -> Result<Tensor> {
        scaled(vocab * hidden, 1.0 / (hidden as f32).sqrt(), 1, dtype)?.reshape(&[vocab, hidden])
    };
    let input = |bt: usize, dtype: DType| -> Result<Tensor> {
        scaled(bt * hidden, 1.0, 3, dtype)?.reshape(&[bt, hidden])
    };
    let targets = |bt: usize| -> Result<Tensor> {
        let t: Vec<i32> = (0..bt)
            .map(|r| {
                if r % 5 == 0 {
                    -100
                } else {
                    ((r * 7919) % vocab) as i32
                }
            })
            .collect();
        Tensor::from_slice(engine, &t, &[bt])
    };
    // One timed run: the loss and the three gradients of inputs x, W, bias, targets.
    let fwd_bwd = |i: &[Tensor], options: &FusedLinearCrossEntropyOptions| -> Result<Vec<Tensor>> {
        let head = LinearHead {
            input: &i[0],
            weight: &i[1],
            bias: Some(&i[2]),
        };
        let (out, saved) = fused_linear_cross_entropy(head, &i[3], options)?;
        let g = fused_linear_cross_entropy_backward(&saved, None)?;
        Ok(vec![
            out.loss,
            g.input,
            g.weight,
            g.bias.expect("bias gradient"),
        ])
    };
    let mut ops = Vec::new();
    // (dtype, logits products on tensor cores, gradient products on tensor cores, gradients
    // in the head's dtypes (2: with block statistics too), memory budget in MiB, label).
    let mut runs = vec![
        (DType::F32, false, false, 0u8, None, "f32"),
        (DType::BF16, false, false, 0, None, "bf16"),
        (DType::BF16, false, false, 1, None, "bf16 head"),
    ];
    if wgrad::matmul::tensor_cores(engine) {
        // 16-bit heads with the logits products on tensor cores, then the gradient products
        // too (the logit gradient rounded to F16), and an F32 head with the latter; then the
        // gradients in the head's dtypes, with the default budget, 256 MiB and 40 MiB (the
        // scratch beside the BF16 gradients within Liger's peak).
        runs.extend([
            (DType::F16, true, false, 0, None, "f16 tc"),
            (DType::BF16, true, false, 0, None, "bf16 tc"),
            (DType::BF16, true, true, 0, None, "bf16 tc+grads"),
            (DType::F32, false, true, 0, None, "f32 tc grads"),
            (DType::BF16, true, true, 1, None, "bf16 tc+grads head"),
            (DType::BF16, true, true, 1, Some(256), "bf16 tc+grads head"),
            (DType::BF16, true, true, 1, Some(40), "bf16 tc+grads head"),
        ]);
        // Block statistics (no row chunks): the default budget, 40 to 64 MiB (the F32 dx sum
        // of BT 2,048 is 32 MiB; 56 MiB keeps the peak within Liger's), 192 and 256 MiB (that
        // of BT 8,192 is 128 MiB).
        for budget in [
            None,
            Some(40),
            Some(48),
            Some(56),
            Some(64),
            Some(192),
            Some(256),
        ] {
            runs.push((DType::BF16, true, true, 2, budget, "bf16 tc+grads blocks"));
        }
    }
    // `WGRAD_FLCE_LABELS`: only the runs of these labels (comma-separated; "f32 budget" for
    // the smaller-budget F32 rows), for a shorter call.
    let keep = |label: &str| {
        std::env::var("WGRAD_FLCE_LABELS").map_or(true, |v| v.split(',').any(|l| l == label))
    };
    runs.retain(|run| keep(run.5));
    for (dtype, tensor_cores, grads, head_dtype, budget_mib, label) in runs {
        let w = weight(dtype)?;
        let b = scaled(vocab, 0.1, 2, dtype)?;
        let mut options = options.clone();
        options.chunking.tensor_cores = tensor_cores;
        options.chunking.tensor_core_gradients = grads;
        options.chunking.head_dtype_gradients = head_dtype > 0;
        options.chunking.block_statistics = head_dtype == 2;
        options.chunking.memory_budget = budget_mib.map(|m| m << 20);
        // `WGRAD_FLCE_BLOCK`: a set vocabulary block for the block-statistics rows.
        if head_dtype == 2 {
            options.chunking.vocab_block = std::env::var("WGRAD_FLCE_BLOCK")
                .ok()
                .and_then(|v| v.parse().ok());
        }
        let budget_name = budget_mib.map_or(String::new(), |m| format!(" budget {m}M"));
        for &bt in rows {
            let x = input(bt, dtype)?;
            let t = targets(bt)?;
            let plan =
                match plan_cross_entropy(engine, bt, hidden, vocab, true, dtype, &options.chunking)
                {
                    Ok(plan) => plan,
                    Err(e) => {
                        eprintln!("  fused_linear_ce {label}{budget_name} BT{bt}: skipped ({e})");
                        continue;
                    }
                };
            eprintln!(
                "  fused_linear_ce {label}{budget_name} BT{bt} H{hidden} V{vocab}: {:.3e} FLOP per run, {} chunks of {} rows, vocabulary blocks {:?}, workspace {:.1} MiB",
                6.0 * (bt * hidden) as f64 * vocab as f64,
                plan.chunks,
                plan.chunk_rows,
                plan.vocab_block,
                plan.workspace_bytes as f64 / 1048576.0
            );
            let options = options.clone();
            let name: &'static str =
                Box::leak(format!("fused_linear_ce_fwd_bwd BT{bt}{budget_name}").into_boxed_str());
            ops.push(
                Op::new(name, label, vec![x, w.clone(), b.clone(), t], move |i| {
                    fwd_bwd(i, &options)
                })
                .with_peak()
                .with_flops(6.0 * (bt * hidden) as f64 * vocab as f64),
            );
        }
    }
    // The same call with smaller memory budgets than the default 1 GiB bound (F32, the largest
    // BT): more, shorter chunks.
    let bt = *rows.last().expect("a row count");
    let budgets: &[u64] = if keep("f32 budget") { &[256, 512] } else { &[] };
    for &budget_mib in budgets {
        let budget = budget_mib << 20;
        let (x, w) = (input(bt, DType::F32)?, weight(DType::F32)?);
        let (b, t) = (scaled(vocab, 0.1, 2, DType::F32)?, targets(bt)?);
        let mut options = options.clone();
        options.chunking.memory_budget = Some(budget);
        let bound = engine.workspace_bound();
        engine.set_workspace_bound(bound.max(budget));
        let plan = plan_cross_entropy(
            engine,
            bt,
            hidden,
            vocab,
            true,
            DType::F32,
            &options.chunking,
        );
        engine.set_workspace_bound(bound);
        let plan = plan?;
        eprintln!(
            "  fused_linear_ce f32 BT{bt} budget {budget_mib} MiB: {} chunks of {} rows, workspace {:.1} MiB",
            plan.chunks,
            plan.chunk_rows,
            plan.workspace_bytes as f64 / 1048576.0
        );
        let name: &'static str = Box::leak(
            format!("fused_linear_ce_fwd_bwd BT{bt} budget {budget_mib}M").into_boxed_str(),
        );
        ops.push(
            Op::new(name, "f32", vec![x, w, b, t], move |i| {
                let engine = i[0].engine();
                let bound = engine.workspace_bound();
                engine.set_workspace_bound(bound.max(budget));
                let run = fwd_bwd(i, &options);
                engine.set_workspace_bound(bound);
                run
            })
            .with_peak()
            .with_flops(6.0 * (bt * hidden) as f64 * vocab as f64),
        );
    }
    Ok(ops)
}

/// Embedding at a Llama-3 vocabulary (V = 128,256 rows of width 1,024, or as many rows as fit
/// one binding for the F32 gradient) and B·T = 16,384 positions (`--quick`: V = 8,192,
/// D = 256, 1,024 positions), F32 and BF16 tables; forward and backward separately. Indices
/// are spread over the vocabulary (`p·7919 mod V`) and not read back (`check_indices: false`).
/// Bytes moved: the forward's inputs are the indices and a tensor of the gathered rows' size
/// (the bytes read from the table, which is not read in full); the backward reads the
/// indices and the cotangent and writes the F32 `[V, D]` gradient (the sort's scratch is not
/// counted).
fn embedding_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use wgrad::embedding::{EmbeddingOptions, embedding, embedding_backward};
    let (rows, dim, n) = if quick {
        (8192, 256, 1024)
    } else {
        (128_256, 1024, 16_384)
    };
    let rows = fitting_rows(engine, rows, dim);
    let options = EmbeddingOptions {
        check_indices: false,
        ..Default::default()
    };
    let ids: Vec<i32> = (0..n).map(|p| ((p * 7919) % rows) as i32).collect();
    let indices = Tensor::from_slice(engine, &ids, &[n])?;
    let mut ops = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let dname: &'static str = dtype.name();
        let data: Vec<f32> = (0..rows * dim)
            .map(|i| ((i % 251) as f32 - 125.0) / 32.0)
            .collect();
        let table = cast::cast(&Tensor::from_slice(engine, &data, &[rows, dim])?, dtype)?;
        drop(data);
        let (rows_read, saved) = embedding(&table, &indices, &options)?;
        let dy = wgrad::bench::copy(&rows_read)?;
        eprintln!("  embedding {dname}: table [{rows}, {dim}], {n} positions");
        ops.push(Op::new(
            "embedding_fwd",
            dname,
            vec![indices.clone(), rows_read],
            move |i| Ok(vec![embedding(&table, &i[0], &options)?.0]),
        ));
        ops.push(Op::new(
            "embedding_bwd",
            dname,
            vec![dy, indices.clone()],
            move |i| Ok(vec![embedding_backward(&saved, &i[0])?]),
        ));
    }
    Ok(ops)
}

/// Optimizer steps and the gradient norm over one parameter tensor of 64M elements
/// (`--quick`: 1M): AdamW with F32 parameters and gradients; AdamW with BF16 parameters (FP32
/// masters, the BF16 copy written in the same pass) and BF16 gradients; AdamW clipped (the
/// norm computed then the clipped step, as a training loop runs them); AdamW with AMSGrad and
/// `maximize` (F32, a third state tensor read and written); SGD with momentum;
/// plain SGD; `grad_norm` of F32 and BF16 gradients. Each run is a real step (the state
/// evolves between runs). Bytes moved: each operand read once and each updated tensor written
/// once (the inputs are the gradient, then the tensors the step reads; the outputs those it
/// writes; the clipped row reads the gradient twice).
fn optim_ops(engine: &Engine, quick: bool) -> Result<Vec<Op>> {
    use std::cell::RefCell;
    use wgrad::optim::{AdamW, AdamWOptions, Clip, Sgd, SgdOptions, grad_norm};
    let n = if quick { 1 << 20 } else { 1 << 26 };
    let filled = |dtype: DType, seed: usize| -> Result<Tensor> {
        let data: Vec<f32> = (0..n)
            .map(|i| (((i + seed) % 251) as f32 - 125.0) / 128.0)
            .collect();
        cast::cast(&Tensor::from_slice(engine, &data, &[n])?, dtype)
    };
    let g32 = filled(DType::F32, 1)?;
    let g16 = filled(DType::BF16, 2)?;
    let mut ops = Vec::new();

    let adam_state = |opt: &AdamW| -> Vec<Tensor> {
        vec![
            opt.params()[0].clone(),
            opt.first_moments()[0].clone(),
            opt.second_moments()[0].clone(),
        ]
    };
    let opt = AdamW::new(&[filled(DType::F32, 3)?], AdamWOptions::default())?;
    let mut inputs = vec![g32.clone()];
    inputs.extend(adam_state(&opt));
    let opt = RefCell::new(opt);
    ops.push(Op::new("adamw_step", "f32", inputs, move |i| {
        let mut opt = opt.borrow_mut();
        opt.step(&[&i[0]], None)?;
        Ok(adam_state(&opt))
    }));

    let opt = AdamW::new(&[filled(DType::BF16, 4)?], AdamWOptions::default())?;
    let mut inputs = vec![g16.clone()];
    inputs.extend(adam_state(&opt));
    let opt = RefCell::new(opt);
    ops.push(Op::new("adamw_step", "bf16 copy", inputs, move |i| {
        let mut opt = opt.borrow_mut();
        opt.step(&[&i[0]], None)?;
        let mut out = adam_state(&opt);
        out.extend(opt.model_copies()[0].clone());
        Ok(out)
    }));

    let opt = AdamW::new(&[filled(DType::F32, 5)?], AdamWOptions::default())?;
    let mut inputs = vec![g32.clone(), g32.clone()];
    inputs.extend(adam_state(&opt));
    let opt = RefCell::new(opt);
    ops.push(Op::new("adamw_clip_step", "f32", inputs, move |i| {
        let mut opt = opt.borrow_mut();
        let clip = Clip::from_grads(&[&i[0]], 1.0)?;
        opt.step(&[&i[0]], Some(&clip))?;
        Ok(adam_state(&opt))
    }));

    let amsgrad = AdamWOptions {
        amsgrad: true,
        maximize: true,
        ..AdamWOptions::default()
    };
    let opt = AdamW::new(&[filled(DType::F32, 8)?], amsgrad)?;
    let ams_state = move |opt: &AdamW| -> Vec<Tensor> {
        let mut state = adam_state(opt);
        state.push(opt.max_second_moments()[0].clone());
        state
    };
    let mut inputs = vec![g32.clone()];
    inputs.extend(ams_state(&opt));
    let opt = RefCell::new(opt);
    ops.push(Op::new(
        "adamw_amsgrad_step",
        "f32 maximize",
        inputs,
        move |i| {
            let mut opt = opt.borrow_mut();
            opt.step(&[&i[0]], None)?;
            Ok(ams_state(&opt))
        },
    ));

    let momentum = SgdOptions {
        momentum: 0.9,
        ..SgdOptions::default()
    };
    let opt = Sgd::new(&[filled(DType::F32, 6)?], momentum)?;
    let inputs = vec![
        g32.clone(),
        opt.params()[0].clone(),
        opt.momentum_buffers()[0].clone(),
    ];
    let opt = RefCell::new(opt);
    ops.push(Op::new("sgd_momentum_step", "f32", inputs, move |i| {
        let mut opt = opt.borrow_mut();
        opt.step(&[&i[0]], None)?;
        Ok(vec![
            opt.params()[0].clone(),
            opt.momentum_buffers()[0].clone(),
        ])
    }));

    let opt = Sgd::new(&[filled(DType::F32, 7)?], SgdOptions::default())?;
    let inputs = vec![g32.clone(), opt.params()[0].clone()];
    let opt = RefCell::new(opt);
    ops.push(Op::new("sgd_step", "f32", inputs, move |i| {
        let mut opt = opt.borrow_mut();
        opt.step(&[&i[0]], None)?;
        Ok(vec![opt.params()[0].clone()])
    }));

    for (g, label) in [(g32, "f32"), (g16, "bf16")] {
        ops.push(Op::new("grad_norm", label, vec![g], |i| {
            Ok(vec![grad_norm(&[&i[0]])?])
        }));
    }
    Ok(ops)
}
