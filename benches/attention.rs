//! Criterion benches of attention, timed on the GPU (`bench::gpu_time_iters` through
//! `iter_custom`): forward and forward + backward, causal and full, F32 and BF16, on small
//! shapes so `cargo bench` stays quick on lavapipe. Throughput is in FLOPs
//! (`attention_flops`, ×3.5 with the backward), so criterion's "elem/s" reads as FLOP/s. The
//! `bench` example runs the large shapes (B4 H32 S2048 D128, B1 H16 S8192 D128). Dual chunk
//! attention (`wgrad::dual_chunk`, chunks of a quarter of the sequence) likewise, forward and
//! forward + backward, throughput in the causal FLOPs of one attention.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;
use wgrad::attention::{AttentionOptions, attention_backward, attention_flops, attention_forward};
use wgrad::{DType, Engine, Result, Tensor, bench, cast};

/// `[batch, heads, seq, head_dim]`.
const SHAPES: [[usize; 4]; 2] = [[1, 2, 64, 64], [1, 1, 128, 128]];

fn input(engine: &Engine, shape: &[usize], dtype: DType, seed: usize) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| (((i * 7 + seed * 13) % 257) as f32 - 128.0) / 128.0)
        .collect();
    cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
}

fn run(inputs: &[Tensor], causal: bool, backward: bool) -> Result<()> {
    let options = AttentionOptions {
        causal,
        ..Default::default()
    };
    let (_, saved) = attention_forward(&inputs[0], &inputs[1], &inputs[2], &options)?;
    if backward {
        attention_backward(&saved, &inputs[3])?;
    }
    Ok(())
}

fn attention(c: &mut Criterion) {
    let engine = match Engine::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("no engine, skipping attention benches: {e}");
            return;
        }
    };
    for backward in [false, true] {
        for dtype in [DType::F32, DType::BF16] {
            for causal in [true, false] {
                let name = format!(
                    "attention_{}_{}_{}",
                    if backward { "fwd_bwd" } else { "fwd" },
                    dtype,
                    if causal { "causal" } else { "full" }
                );
                let mut group = c.benchmark_group(name);
                for shape in SHAPES {
                    let inputs: Vec<Tensor> = (0..4)
                        .map(|s| input(&engine, &shape, dtype, s))
                        .collect::<Result<_>>()
                        .expect("bench inputs");
                    run(&inputs, causal, backward).expect("first run");
                    let flops =
                        attention_flops(shape[0], shape[1], shape[2], shape[2], shape[3], causal)
                            * if backward { 3.5 } else { 1.0 };
                    group.throughput(Throughput::Elements(flops as u64));
                    bench::prewarm(&engine, 0.05).expect("prewarm");
                    group.bench_with_input(
                        BenchmarkId::from_parameter(bench::shape_text(&shape)),
                        &inputs,
                        |b, inputs| {
                            b.iter_custom(|iters| {
                                bench::gpu_time_iters(&engine, iters, || {
                                    run(inputs, causal, backward)
                                })
                                .expect("timed run")
                            })
                        },
                    );
                }
                group.finish();
            }
        }
    }
}

fn dual_chunk(c: &mut Criterion) {
    use wgrad::dual_chunk::{
        DualChunkOptions, DualChunkQueries, dual_chunk_attention, dual_chunk_attention_backward,
    };
    let Ok(engine) = Engine::new() else {
        eprintln!("no engine, skipping dual chunk benches");
        return;
    };
    let run = |i: &[Tensor], chunk_len: usize, backward: bool| -> Result<()> {
        let queries = DualChunkQueries {
            intra: &i[0],
            successive: &i[1],
            inter: &i[2],
        };
        let options = DualChunkOptions {
            chunk_len,
            scale: None,
            layout: Default::default(),
        };
        let (_, saved) = dual_chunk_attention(queries, &i[3], &i[4], &options)?;
        if backward {
            dual_chunk_attention_backward(&saved, &i[5])?;
        }
        Ok(())
    };
    for backward in [false, true] {
        let name = format!(
            "dual_chunk_{}_f32",
            if backward { "fwd_bwd" } else { "fwd" }
        );
        let mut group = c.benchmark_group(name);
        for shape in SHAPES {
            let inputs: Vec<Tensor> = (0..6)
                .map(|s| input(&engine, &shape, DType::F32, s))
                .collect::<Result<_>>()
                .expect("bench inputs");
            let chunk_len = shape[2] / 4;
            run(&inputs, chunk_len, backward).expect("first run");
            let flops = attention_flops(shape[0], shape[1], shape[2], shape[2], shape[3], true)
                * if backward { 3.5 } else { 1.0 };
            group.throughput(Throughput::Elements(flops as u64));
            group.bench_with_input(
                BenchmarkId::from_parameter(bench::shape_text(&shape)),
                &inputs,
                |b, inputs| {
                    b.iter_custom(|iters| {
                        bench::gpu_time_iters(&engine, iters, || run(inputs, chunk_len, backward))
                            .expect("timed run")
                    })
                },
            );
        }
        group.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
}

criterion_group! {
    name = benches;
    config = config();
    targets = attention, dual_chunk
}
criterion_main!(benches);
