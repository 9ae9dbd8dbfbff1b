//! Criterion benches of the activation family (SwiGLU, GeGLU; separate and packed layouts;
//! forward and backward), timed on the GPU with `bench::gpu_time_iters`. Small shapes and a
//! short measurement keep it quick on lavapipe; `examples/bench.rs` has the large shapes.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::activation::{self, Activation, ActivationOptions};
use wgrad::{DType, Engine, Result, Tensor, bench};

const SHAPES: [[usize; 2]; 2] = [[256, 1024], [1024, 2048]];

fn input(engine: &Engine, shape: &[usize], dtype: DType, seed: usize) -> Result<Tensor> {
    common::sawtooth(engine, shape, dtype, seed, 1, 32.0)
}

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("activation") else {
        return;
    };
    let opts = ActivationOptions::default();
    for (name, kind) in [
        ("swiglu", Activation::Silu),
        ("geglu", Activation::GeluTanh),
    ] {
        for dtype in [DType::F32, DType::BF16] {
            let mut group = c.benchmark_group(format!("{name}_{dtype}"));
            for shape in SHAPES {
                let gate = input(&engine, &shape, dtype, 0).expect("gate");
                let up = input(&engine, &shape, dtype, 7).expect("up");
                let dy = input(&engine, &shape, dtype, 3).expect("dy");
                let packed = input(&engine, &[shape[0], 2 * shape[1]], dtype, 1).expect("packed");
                let (y, saved) =
                    activation::forward(kind, &gate, Some(&up), &opts).expect("forward");
                let (_, saved_packed) =
                    activation::packed_forward(kind, &packed, &opts).expect("packed");
                let text = bench::shape_text(&shape);
                let fwd_bytes = gate.byte_len() + up.byte_len() + y.byte_len();
                let bwd_bytes =
                    gate.byte_len() + up.byte_len() + dy.byte_len() + 2 * 4 * gate.len() as u64;
                bench::prewarm(&engine, 0.05).expect("prewarm");
                group.throughput(Throughput::Bytes(fwd_bytes));
                group.bench_function(BenchmarkId::new("forward", &text), |b| {
                    common::time_gpu(b, &engine, || {
                        activation::forward(kind, &gate, Some(&up), &opts).map(drop)
                    })
                });
                group.bench_function(BenchmarkId::new("forward_packed", &text), |b| {
                    common::time_gpu(b, &engine, || {
                        activation::packed_forward(kind, &packed, &opts).map(drop)
                    })
                });
                group.throughput(Throughput::Bytes(bwd_bytes));
                group.bench_function(BenchmarkId::new("backward", &text), |b| {
                    common::time_gpu(b, &engine, || activation::backward(&saved, &dy).map(drop))
                });
                group.bench_function(BenchmarkId::new("backward_packed", &text), |b| {
                    common::time_gpu(b, &engine, || {
                        activation::backward(&saved_packed, &dy).map(drop)
                    })
                });
            }
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = run
}
criterion_main!(benches);
