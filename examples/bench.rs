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
    let quick = shape[1] < 8192;
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
        attention_op(engine, quick, 0, DType::F32, true, false)?,
        attention_op(engine, quick, 0, DType::F32, true, true)?,
        attention_op(engine, quick, 0, DType::BF16, true, false)?,
        attention_op(engine, quick, 0, DType::BF16, true, true)?,
        attention_op(engine, quick, 0, DType::F32, false, false)?,
        attention_op(engine, quick, 0, DType::F32, false, true)?,
        attention_op(engine, quick, 1, DType::F32, true, false)?,
        attention_op(engine, quick, 1, DType::F32, true, true)?,
        attention_op(engine, quick, 1, DType::BF16, true, false)?,
        attention_op(engine, quick, 1, DType::BF16, true, true)?,
        attention_op(engine, quick, 1, DType::F32, false, false)?,
        attention_op(engine, quick, 1, DType::F32, false, true)?,
    ])
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

/// Attention shapes `[batch, heads, seq, head_dim]` of the bench: B4 H32 S2048 D128 and
/// B1 H16 S8192 D128 (`--quick`: B1 H2 S128 D64 and B1 H1 S256 D64).
const ATTENTION_SHAPES: [[usize; 4]; 2] = [[4, 32, 2048, 128], [1, 16, 8192, 128]];
const ATTENTION_QUICK_SHAPES: [[usize; 4]; 2] = [[1, 2, 128, 64], [1, 1, 256, 64]];

/// One attention row: forward (`backward` false) or forward + backward, causal or full, on
/// query = key = value-shaped inputs of `dtype`. Time per run is in the table; FLOPs per run
/// are `wgrad::attention::attention_flops` (×3.5 with the backward), printed to stderr.
fn attention_op(
    engine: &Engine,
    quick: bool,
    which: usize,
    dtype: DType,
    causal: bool,
    backward: bool,
) -> Result<Op> {
    use wgrad::attention::{
        AttentionOptions, attention_backward, attention_flops, attention_forward,
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
    let name = if backward {
        "attention_fwd_bwd"
    } else {
        "attention_fwd"
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
            let g = attention_backward(&saved, &i[3])?;
            Ok(vec![out, g.query, g.key, g.value])
        } else {
            Ok(vec![out, saved.output_f32().clone()])
        }
    }))
}
