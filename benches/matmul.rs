//! Criterion benches of the dense matmul family (a linear layer `x·Wᵀ`, weights `[N, K]`;
//! forward and backward; F32 and BF16 inputs), timed on the GPU with `bench::gpu_time_iters`.
//! Throughput is in floating-point operations (criterion's "elements"). Small shapes keep it
//! quick on lavapipe; `examples/bench.rs` has the large shapes.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::matmul::{MatmulOptions, matmul, matmul_backward, matmul_flops};
use wgrad::{DType, Engine, Result, Tensor, bench};

/// (M, K, N).
const SHAPES: [[usize; 3]; 2] = [[128, 128, 128], [256, 128, 384]];

fn input(engine: &Engine, shape: &[usize], dtype: DType, seed: usize) -> Result<Tensor> {
    common::sawtooth(engine, shape, dtype, seed, 7, 256.0)
}

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("matmul") else {
        return;
    };
    let options = MatmulOptions {
        transpose_b: true,
        ..Default::default()
    };
    for dtype in [DType::F32, DType::BF16] {
        let mut group = c.benchmark_group(format!("matmul_{dtype}"));
        for [m, k, n] in SHAPES {
            let x = input(&engine, &[m, k], dtype, 0).expect("x");
            let w = input(&engine, &[n, k], dtype, 5).expect("w");
            let dy = input(&engine, &[m, n], dtype, 3).expect("dy");
            let (_, saved) = matmul(&x, &w, None, &options).expect("forward");
            let text = format!("{m}x{k}x{n}");
            let flops = matmul_flops(1, m, n, k) as u64;
            bench::prewarm(&engine, 0.05).expect("prewarm");
            group.throughput(Throughput::Elements(flops));
            group.bench_function(BenchmarkId::new("forward", &text), |b| {
                common::time_gpu(b, &engine, || matmul(&x, &w, None, &options).map(drop))
            });
            group.throughput(Throughput::Elements(2 * flops));
            group.bench_function(BenchmarkId::new("backward", &text), |b| {
                common::time_gpu(b, &engine, || matmul_backward(&saved, &dy).map(drop))
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = run
}
criterion_main!(benches);
