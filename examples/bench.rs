//! Bandwidth of every wgrad operator against the copy kernel.
//!
//! ```text
//! cargo run --release --example bench -- [--quick] [--json PATH] [--prewarm SECONDS]
//! ```
//!
//! Prints the engine, measures the copy bandwidth (256 MiB buffer, at most the device's largest
//! storage binding; `--quick`: 8 MiB), then times each operator on a large input (8192x8192
//! f32, or the most rows of 8192 columns that fit one binding; `--quick`: 1024x1024). Bytes
//! moved are each input read once plus each output written once; GB/s and the percentage of
//! the copy bandwidth of this same run are printed as a table and written as JSON (default
//! `$OUT/bench.json` when `OUT` is set, else `bench.json`). Every timed section follows a
//! prewarm (default 0.3 s; `--prewarm 0` turns it off, to see what idle clocks cost).
//!
//! To add an operator, push one more [`Op`] in `operators`.

use std::process::ExitCode;
use wgrad::bench::{self, Report};
use wgrad::{DType, Engine, Result, Tensor, cast, reduce};

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
        }
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
    Ok(vec![
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
    ]
    .into_iter()
    .chain(loss_operators(engine, shape[1] < 8192)?)
    .collect())
}

/// Rows of `cols` columns that fit one binding for the F32 gradient, at most `rows`.
fn fitting_rows(engine: &Engine, rows: usize, cols: usize) -> usize {
    let max_rows = (engine.max_binding_bytes() / (cols as u64 * 4)) as usize;
    rows.min(max_rows).max(1)
}

/// Logits-like data of `shape` in `dtype`: ordinary values in [-8, 8).
fn logits(engine: &Engine, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| ((i.wrapping_mul(2_654_435_761) % 4096) as f32 - 2048.0) / 256.0)
        .collect();
    cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
}

/// The loss family on the issue's shapes (cross-entropy at B·T = 8·2048 rows of 131,072 and
/// 128,256 classes, as many rows as fit one binding for the F32 gradient; softmax and the
/// others at 4096×32,000), or small ones with `--quick`. Forward and backward separately,
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
            let rows = fitting_rows(engine, ce_rows, cols);
            let x = logits(engine, &[rows, cols], dtype)?;
            let targets: Vec<i32> = (0..rows).map(|r| ((r * 7919) % cols) as i32).collect();
            let t = Tensor::from_slice(engine, &targets, &[rows])?;
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
                let (_, s) = loss::cross_entropy(&x, &t, &opts)?;
                let dx = loss::cross_entropy_backward(&s, None)?;
                engine.synchronize()?;
                drop(dx);
            }
            eprintln!(
                "  cross_entropy fwd+bwd {dname} {rows}x{cols}: peak {:.1} MiB above the inputs \
                 (logits {:.1} MiB, dlogits {:.1} MiB)",
                (engine.memory().peak_bytes - before) as f64 / 1048576.0,
                x.byte_len() as f64 / 1048576.0,
                (rows * cols * 4) as f64 / 1048576.0
            );
            let (_, saved) = loss::cross_entropy(&x, &t, &opts)?;
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
            let m = saved.rows_matrix().clone();
            ops.push(Op::new(
                "cross_entropy_backward",
                dname,
                vec![x.clone(), t.clone(), m],
                move |_| Ok(vec![loss::cross_entropy_backward(&saved, None)?]),
            ));
            let o = opts.clone();
            ops.push(Op::new(
                "cross_entropy_fwd_bwd",
                dname,
                vec![x, t],
                move |i| {
                    let (out, saved) = loss::cross_entropy(&i[0], &i[1], &o)?;
                    Ok(vec![out.loss, loss::cross_entropy_backward(&saved, None)?])
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
        ops.push(Op::new(
            "softmax_backward",
            dname,
            vec![x.clone(), stats, dy.clone()],
            move |i| Ok(vec![loss::softmax_backward(&saved, &i[2])?]),
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
            ops.push(Op::new(bwd, dname, vec![a, b], move |_| {
                Ok(vec![loss::divergence_backward(&saved, None)?])
            }));
        }
    }
    Ok(ops)
}

struct Args {
    quick: bool,
    json: std::path::PathBuf,
    prewarm_s: f64,
}

const USAGE: &str = "usage: bench [--quick] [--json PATH] [--prewarm SECONDS]";

fn parse_args() -> std::result::Result<Args, String> {
    let mut quick = false;
    let mut json = None;
    let mut prewarm_s = bench::DEFAULT_PREWARM_S;
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
    })
}

/// The input shape: `[side, side]` f32 when it fits one storage binding, else as many rows
/// of `side` columns as fit.
fn input_shape(engine: &Engine, side: usize) -> Vec<usize> {
    let max_rows = (engine.max_binding_bytes() / (side as u64 * 4)) as usize;
    vec![side.min(max_rows).max(1), side]
}

fn run(args: &Args) -> Result<Report> {
    let engine = Engine::new()?;
    println!("engine: {}", engine.info());
    let (copy_wanted, side, warmup, iters) = if args.quick {
        (8u64 << 20, 1024, 1, 5)
    } else {
        (256u64 << 20, 8192, 3, 20)
    };
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
    for op in operators(&engine, &shape)? {
        // One untimed run gives the outputs, hence the bytes moved (and compiles the kernel).
        let outputs = (op.run)(&op.inputs)?;
        let bytes: u64 = op.inputs.iter().chain(&outputs).map(Tensor::byte_len).sum();
        drop(outputs);
        bench::prewarm(&engine, args.prewarm_s)?;
        let stats = bench::measure(&engine, warmup, iters, || (op.run)(&op.inputs).map(drop))?;
        let row = report.add(op.name, op.inputs[0].shape(), op.dtype, bytes, &stats);
        eprintln!(
            "  {} {} {}: {:.2} GB/s",
            row.name, row.dtype, row.shape, row.gb_per_s
        );
    }
    Ok(report)
}

fn main() -> ExitCode {
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
