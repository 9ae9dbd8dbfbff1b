//! Criterion benches of the optimizer family: an AdamW step (F32 parameters; BF16
//! parameters with FP32 masters and BF16 gradients; F32 with AMSGrad and `maximize`), an SGD
//! step with momentum, and the global
//! gradient norm, timed on the GPU with `bench::gpu_time_iters`. Throughput is the bytes a
//! step moves (each operand read once, each updated one written once). Small sizes for
//! lavapipe; `examples/bench.rs` runs 64M parameters.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::optim::{AdamW, AdamWOptions, Sgd, SgdOptions, grad_norm};
use wgrad::{DType, Engine, Result, Tensor, bench};

const SIZES: [usize; 2] = [1 << 18, 1 << 20];

fn input(engine: &Engine, n: usize, dtype: DType, seed: usize) -> Result<Tensor> {
    common::sawtooth(engine, &[n], dtype, seed, 1, 128.0)
}

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("optim") else {
        return;
    };
    let mut group = c.benchmark_group("optim");
    for n in SIZES {
        let text = format!("n{n}");
        let n4 = 4 * n as u64;
        let p32 = input(&engine, n, DType::F32, 0).expect("params");
        let g32 = input(&engine, n, DType::F32, 1).expect("grads");
        let p16 = input(&engine, n, DType::BF16, 2).expect("params");
        let g16 = input(&engine, n, DType::BF16, 3).expect("grads");
        let mut adam =
            AdamW::new(std::slice::from_ref(&p32), AdamWOptions::default()).expect("adamw");
        let mut adam16 =
            AdamW::new(std::slice::from_ref(&p16), AdamWOptions::default()).expect("adamw");
        let mut ams = AdamW::new(
            std::slice::from_ref(&input(&engine, n, DType::F32, 5).expect("params")),
            AdamWOptions {
                amsgrad: true,
                maximize: true,
                ..AdamWOptions::default()
            },
        )
        .expect("adamw");
        let mut sgd = Sgd::new(
            std::slice::from_ref(&input(&engine, n, DType::F32, 4).expect("params")),
            SgdOptions {
                momentum: 0.9,
                ..SgdOptions::default()
            },
        )
        .expect("sgd");
        bench::prewarm(&engine, 0.05).expect("prewarm");
        // g, p, m, v read; p, m, v written.
        group.throughput(Throughput::Bytes(7 * n4));
        group.bench_function(BenchmarkId::new("adamw_f32", &text), |b| {
            common::time_gpu(b, &engine, || adam.step(&[&g32], None))
        });
        // bf16 g, f32 p, m, v read; f32 p, m, v and the bf16 copy written.
        group.throughput(Throughput::Bytes(
            2 * n as u64 + 3 * n4 + 3 * n4 + 2 * n as u64,
        ));
        group.bench_function(BenchmarkId::new("adamw_bf16_copy", &text), |b| {
            common::time_gpu(b, &engine, || adam16.step(&[&g16], None))
        });
        // g, p, m, v, v_max read; p, m, v, v_max written.
        group.throughput(Throughput::Bytes(9 * n4));
        group.bench_function(BenchmarkId::new("adamw_amsgrad_maximize_f32", &text), |b| {
            common::time_gpu(b, &engine, || ams.step(&[&g32], None))
        });
        // g, p, b read; p, b written.
        group.throughput(Throughput::Bytes(5 * n4));
        group.bench_function(BenchmarkId::new("sgd_momentum_f32", &text), |b| {
            common::time_gpu(b, &engine, || sgd.step(&[&g32], None))
        });
        group.throughput(Throughput::Bytes(n4));
        group.bench_function(BenchmarkId::new("grad_norm_f32", &text), |b| {
            common::time_gpu(b, &engine, || grad_norm(&[&g32]).map(drop))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = run
}
criterion_main!(benches);
