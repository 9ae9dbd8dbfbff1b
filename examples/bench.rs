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
use wgrad::gated_delta::{GatedDeltaOptions, gated_delta_backward, gated_delta_forward};
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
    ])
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
            let fwd = |i: &[Tensor]| {
                gated_delta_forward(
                    &i[1],
                    &i[2],
                    &i[0],
                    &i[3],
                    &i[4],
                    None,
                    &GatedDeltaOptions::default(),
                )
            };
            // Peak memory beyond the inputs.
            engine.synchronize()?;
            let base = engine.memory().live_bytes;
            engine.reset_peak();
            drop(fwd(&inputs)?);
            engine.synchronize()?;
            let peak_fwd = engine.memory().peak_bytes - base;
            engine.reset_peak();
            let (_, saved) = fwd(&inputs)?;
            drop(gated_delta_backward(&saved, Some(&inputs[5]), None)?);
            drop(saved);
            engine.synchronize()?;
            let peak_full = engine.memory().peak_bytes - base;
            println!(
                "gated_delta {dtype} B{b} T{t} Hk{hk} Hv{hv} K{kd} V{vd}: peak memory beyond inputs: forward {:.1} MiB, forward+backward {:.1} MiB",
                peak_fwd as f64 / 1048576.0,
                peak_full as f64 / 1048576.0
            );
            let dt: &'static str = dtype.name();
            let name = |what: &str| -> &'static str {
                Box::leak(format!("{what} Hk{hk}").into_boxed_str())
            };
            ops.push(Op::new(
                name("gated_delta_fwd"),
                dt,
                inputs[..5].to_vec(),
                move |i| {
                    let (out, saved) = fwd(i)?;
                    Ok(vec![
                        out.output,
                        out.final_state,
                        saved.checkpoints().clone(),
                    ])
                },
            ));
            ops.push(Op::new(name("gated_delta_fwd_bwd"), dt, inputs, move |i| {
                let (out, saved) = fwd(i)?;
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
    for op in operators(&engine, &shape)?
        .into_iter()
        .chain(gated_delta_ops(&engine, args.quick)?)
    {
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
