//! Train the small transformer of `wgrad::model` on the sonnets shipped in `data/`, one
//! character per token: `cargo run --release --example train` (or `make demo`).
//!
//! Shows a progress bar (step, loss, tokens/s), writes `loss.csv` (step, loss, tokens/s,
//! elapsed seconds) and `loss.svg` (the loss curve) into the output folder (default
//! `out/train/`), then prints the held-out loss, a few sampled lines, tokens/s and the peak
//! GPU memory of the engine.
//!
//! Flags (all optional): `--layers N --d-model N --heads N --ffn N --seq N --batch N
//! --steps N --lr X --seed N --out DIR`. The head width is `d_model / heads` (a multiple of
//! 8).

use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use wgrad::Engine;
use wgrad::gradcheck::Rng;
use wgrad::model::{
    AdamWSettings, Batch, Model, ModelAdamW, ModelConfig, Vocabulary, sample_windows,
};

const CORPUS: &[u8] = include_bytes!("../data/sonnets.txt");

#[derive(Debug, Clone)]
struct Args {
    layers: usize,
    d_model: usize,
    heads: usize,
    ffn: usize,
    seq: usize,
    batch: usize,
    steps: usize,
    lr: f64,
    seed: u64,
    out: PathBuf,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            layers: 2,
            d_model: 64,
            heads: 4,
            ffn: 192,
            seq: 32,
            batch: 8,
            steps: 64,
            lr: 1e-2,
            seed: 0,
            out: PathBuf::from("out/train"),
        }
    }
}

const USAGE: &str = "usage: train [--layers N] [--d-model N] [--heads N] [--ffn N] [--seq N] \
[--batch N] [--steps N] [--lr X] [--seed N] [--out DIR]";

fn parse_args() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_string());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let int = |v: &str| -> Result<usize, String> {
            v.parse()
                .map_err(|_| format!("{flag}: not a non-negative integer: {v}"))
        };
        match flag.as_str() {
            "--layers" => a.layers = int(&value)?,
            "--d-model" => a.d_model = int(&value)?,
            "--heads" => a.heads = int(&value)?,
            "--ffn" => a.ffn = int(&value)?,
            "--seq" => a.seq = int(&value)?,
            "--batch" => a.batch = int(&value)?,
            "--steps" => a.steps = int(&value)?,
            "--seed" => a.seed = int(&value)? as u64,
            "--lr" => {
                a.lr = value
                    .parse()
                    .ok()
                    .filter(|x: &f64| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| format!("--lr: not a positive number: {value}"))?
            }
            "--out" => a.out = PathBuf::from(value),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    if a.heads == 0 || !a.d_model.is_multiple_of(a.heads) {
        return Err(format!(
            "--d-model {} must be a multiple of --heads {}",
            a.d_model, a.heads
        ));
    }
    if a.steps == 0 || a.batch == 0 {
        return Err("--steps and --batch must be at least 1".into());
    }
    Ok(a)
}

/// One logged step.
struct Record {
    step: usize,
    loss: f64,
    tokens_per_s: f64,
    elapsed: f64,
}

/// Learning rate of `step` (0-based) of `steps`: linear warm-up over the first 5% (at least
/// one step), then cosine decay to a tenth of the peak.
fn learning_rate(peak: f64, step: usize, steps: usize) -> f64 {
    let warm = (steps / 20).max(1);
    if step < warm {
        return peak * (step + 1) as f64 / warm as f64;
    }
    let t = (step - warm) as f64 / (steps - warm).max(1) as f64;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
}

fn write_csv(path: &Path, records: &[Record]) -> std::io::Result<()> {
    let mut s = String::from("step,loss,tokens_per_s,elapsed_s\n");
    for r in records {
        s.push_str(&format!(
            "{},{:.6},{:.1},{:.3}\n",
            r.step, r.loss, r.tokens_per_s, r.elapsed
        ));
    }
    std::fs::write(path, s)
}

fn write_svg(
    path: &Path,
    records: &[Record],
    title: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_loss = records.iter().map(|r| r.loss).fold(0.0, f64::max);
    let steps = records.last().map_or(1, |r| r.step).max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..steps as f64, 0f64..(max_loss * 1.05).max(1e-3))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss (nats per character)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            records.iter().map(|r| (r.step as f64, r.loss)),
            BLUE.mix(0.35),
        ))?
        .label("batch loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.mix(0.35)));
    // Mean over a trailing window of 10 steps.
    let smoothed: Vec<(f64, f64)> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let w = &records[i.saturating_sub(9)..=i];
            (
                r.step as f64,
                w.iter().map(|r| r.loss).sum::<f64>() / w.len() as f64,
            )
        })
        .collect();
    chart
        .draw_series(LineSeries::new(smoothed, BLUE.stroke_width(2)))?
        .label("mean of the last 10 steps")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Mean loss over `batches` fixed windows of `stream`.
fn evaluate(
    engine: &Engine,
    model: &Model,
    stream: &[i32],
    batch: usize,
    seq: usize,
    batches: usize,
) -> wgrad::Result<f64> {
    let mut rng = Rng::new(12345);
    let mut total = 0.0;
    for _ in 0..batches {
        let (x, y) = sample_windows(stream, batch, seq, &mut rng)?;
        let b = Batch::new(engine, &x, &y, batch, seq, model.config().vocab)?;
        let (loss, _) = model.forward(&b)?;
        total += loss.to_f64()?[0];
    }
    Ok(total / batches as f64)
}

/// Continue each prompt by `count` characters, all rows in one forward per character:
/// greedy where the temperature is 0, else sampled from `softmax(logits / temperature)`.
/// Every row sees its last `L` characters, `L` = the shortest row's length (at most
/// `seq_len`).
fn generate(
    model: &Model,
    vocab: &Vocabulary,
    prompts: &[(&str, f64)],
    count: usize,
    rng: &mut Rng,
) -> wgrad::Result<Vec<String>> {
    let mut rows: Vec<Vec<i32>> = prompts
        .iter()
        .map(|(p, _)| vocab.encode(p.as_bytes()))
        .collect::<wgrad::Result<_>>()?;
    let v = model.config().vocab;
    for _ in 0..count {
        let shortest = rows.iter().map(Vec::len).min().unwrap_or(1);
        let len = shortest.min(model.config().seq_len);
        let context: Vec<i32> = rows
            .iter()
            .flat_map(|r| r[r.len() - len..].iter().copied())
            .collect();
        let logits = model.logits(&context, rows.len())?.to_vec::<f32>()?;
        for (r, row) in rows.iter_mut().enumerate() {
            let last = &logits[((r + 1) * len - 1) * v..(r + 1) * len * v];
            let temperature = prompts[r].1;
            let next = if temperature <= 0.0 {
                (0..v).fold(0, |best, i| if last[i] > last[best] { i } else { best })
            } else {
                let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f64> = last
                    .iter()
                    .map(|&z| (f64::from(z - max) / temperature).exp())
                    .collect();
                let mut u = rng.next_f64() * weights.iter().sum::<f64>();
                let mut pick = v - 1;
                for (i, w) in weights.iter().enumerate() {
                    if u < *w {
                        pick = i;
                        break;
                    }
                    u -= w;
                }
                pick
            };
            row.push(next as i32);
        }
    }
    Ok(rows
        .iter()
        .map(|r| String::from_utf8_lossy(&vocab.decode(r)).into_owned())
        .collect())
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::new()?;
    println!("adapter: {}", engine.info());
    let vocab = Vocabulary::from_text(CORPUS);
    let stream = vocab.encode(CORPUS)?;
    let split = stream.len() * 9 / 10;
    let (train, held_out) = stream.split_at(split);
    let config = ModelConfig {
        vocab: vocab.len(),
        layers: args.layers,
        d_model: args.d_model,
        heads: args.heads,
        head_dim: args.d_model / args.heads,
        ffn: args.ffn,
        seq_len: args.seq,
        seed: args.seed,
        ..ModelConfig::default()
    };
    let model = Model::new(&engine, config)?;
    println!(
        "corpus: {} characters ({} for training, {} held out), vocabulary {}",
        stream.len(),
        train.len(),
        held_out.len(),
        vocab.len()
    );
    println!(
        "model: {} layers, d_model {}, {} heads of {}, ffn {}, seq {}: {} parameters",
        config.layers,
        config.d_model,
        config.heads,
        config.head_dim,
        config.ffn,
        config.seq_len,
        config.parameter_count()
    );
    println!(
        "training: {} steps of {} x {} tokens, AdamW lr {} (warm-up, cosine decay), seed {}",
        args.steps, args.batch, args.seq, args.lr, args.seed
    );
    std::fs::create_dir_all(&args.out)?;

    let mut optimizer = ModelAdamW::new(
        &model,
        AdamWSettings {
            lr: args.lr as f32,
            ..AdamWSettings::default()
        },
    )?;
    let mut rng = Rng::new(args.seed ^ 0x5eed);
    let bar = ProgressBar::new(args.steps as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30.cyan/blue} step {pos}/{len} {msg} [{elapsed_precise}]",
        )?
        .progress_chars("=> "),
    );
    let tokens_per_step = (args.batch * args.seq) as f64;
    let start = Instant::now();
    engine.reset_peak();
    let mut records = Vec::with_capacity(args.steps);
    for step in 0..args.steps {
        let t0 = Instant::now();
        let (x, y) = sample_windows(train, args.batch, args.seq, &mut rng)?;
        let batch = Batch::new(&engine, &x, &y, args.batch, args.seq, config.vocab)?;
        let (loss, tape) = model.forward(&batch)?;
        let grads = model.backward(&tape)?;
        drop(tape);
        optimizer.set_lr(learning_rate(args.lr, step, args.steps) as f32)?;
        optimizer.step(&grads)?;
        let loss = loss.to_f64()?[0];
        let dt = t0.elapsed().as_secs_f64();
        records.push(Record {
            step: step + 1,
            loss,
            tokens_per_s: tokens_per_step / dt,
            elapsed: start.elapsed().as_secs_f64(),
        });
        bar.set_message(format!(
            "loss {loss:.3}  {:.0} tokens/s",
            tokens_per_step / dt
        ));
        bar.inc(1);
    }
    bar.finish();
    let elapsed = start.elapsed().as_secs_f64();
    let peak = engine.memory().peak_bytes;

    let csv = args.out.join("loss.csv");
    let svg = args.out.join("loss.svg");
    write_csv(&csv, &records)?;
    let title = format!(
        "wgrad char-level transformer: {} layers, d_model {}, {} steps",
        config.layers, config.d_model, args.steps
    );
    write_svg(&svg, &records, &title)?;

    let first = records.first().map_or(0.0, |r| r.loss);
    let tail = &records[records.len().saturating_sub(20)..];
    let last = tail.iter().map(|r| r.loss).sum::<f64>() / tail.len() as f64;
    let held = evaluate(&engine, &model, held_out, args.batch, args.seq, 4)?;
    println!(
        "loss {first:.3} -> {last:.3} (mean of the last {} steps); held-out loss {held:.3}; uniform guess {:.3}",
        tail.len(),
        (vocab.len() as f64).ln()
    );
    println!(
        "{:.0} tokens/s over {} steps ({elapsed:.1} s); peak GPU memory {:.2} MiB",
        tokens_per_step * args.steps as f64 / elapsed,
        args.steps,
        peak as f64 / (1024.0 * 1024.0)
    );
    println!("wrote {} and {}", csv.display(), svg.display());
    println!("samples:");
    let prompts = [
        ("Shall I compare thee", 0.0),
        ("When I do count the ", 0.0),
        ("Love is not love wh", 0.8),
        ("Then can I drown an", 0.8),
    ];
    let mut sample_rng = Rng::new(args.seed ^ 0xabc);
    let texts = generate(&model, &vocab, &prompts, 72, &mut sample_rng)?;
    for ((_, temperature), text) in prompts.iter().zip(texts) {
        let how = if *temperature == 0.0 {
            "greedy".to_string()
        } else {
            format!("T={temperature}")
        };
        println!("  [{how:>6}] {}", text.replace('\n', " / "));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
