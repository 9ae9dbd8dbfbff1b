//! Criterion benches of the embedding family (forward gather, table gradient with its sort;
//! the `max_norm` forward, `embedding_renorm` and the `scale_grad_by_freq` backward), timed on the GPU with `bench::gpu_time_iters`. Small shapes for lavapipe;
//! `examples/bench.rs` has a Llama-3-sized vocabulary.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::embedding::{self, EmbeddingOptions};
use wgrad::{DType, Engine, Result, Tensor, bench};

/// (vocabulary rows, width, positions).
const SHAPES: [[usize; 3]; 2] = [[8192, 256, 1024], [32000, 128, 4096]];

fn input(engine: &Engine, shape: &[usize], dtype: DType, seed: usize) -> Result<Tensor> {
    common::sawtooth(engine, shape, dtype, seed, 1, 32.0)
}

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("embedding") else {
        return;
    };
    let options = EmbeddingOptions {
        check_indices: false,
        ..Default::default()
    };
    for dtype in [DType::F32, DType::BF16] {
        let mut group = c.benchmark_group(format!("embedding_{dtype}"));
        for [rows, dim, n] in SHAPES {
            let table = input(&engine, &[rows, dim], dtype, 0).expect("table");
            let ids: Vec<i32> = (0..n).map(|p| ((p * 7919) % rows) as i32).collect();
            let indices = Tensor::from_slice(&engine, &ids, &[n]).expect("indices");
            let dy = input(&engine, &[n, dim], dtype, 3).expect("dy");
            let (y, saved) = embedding::embedding(&table, &indices, &options).expect("forward");
            let text = format!("v{rows}_d{dim}_n{n}");
            bench::prewarm(&engine, 0.05).expect("prewarm");
            // Forward: the gathered rows read, the indices read, the output written.
            group.throughput(Throughput::Bytes(2 * y.byte_len() + indices.byte_len()));
            group.bench_function(BenchmarkId::new("forward", &text), |b| {
                common::time_gpu(b, &engine, || {
                    embedding::embedding(&table, &indices, &options).map(drop)
                })
            });
            // Backward: indices and cotangent read, the F32 table gradient written.
            group.throughput(Throughput::Bytes(
                indices.byte_len() + dy.byte_len() + 4 * (rows * dim) as u64,
            ));
            group.bench_function(BenchmarkId::new("backward", &text), |b| {
                common::time_gpu(b, &engine, || {
                    embedding::embedding_backward(&saved, &dy).map(drop)
                })
            });
            // max_norm: each row read twice (norm, then gather) plus the output.
            let renorm = EmbeddingOptions {
                max_norm: Some(1.0),
                scale_grad_by_freq: true,
                ..options
            };
            group.throughput(Throughput::Bytes(3 * y.byte_len() + indices.byte_len()));
            group.bench_function(BenchmarkId::new("forward_max_norm", &text), |b| {
                common::time_gpu(b, &engine, || {
                    embedding::embedding(&table, &indices, &renorm).map(drop)
                })
            });
            // The renormalized table: every row's norm and a copy of the table (plus the sort).
            group.throughput(Throughput::Bytes(3 * table.byte_len()));
            group.bench_function(BenchmarkId::new("renorm_table", &text), |b| {
                common::time_gpu(b, &engine, || {
                    embedding::embedding_renorm(&table, &indices, 1.0, 2.0, false).map(drop)
                })
            });
            let (_, saved_freq) = embedding::embedding(&table, &indices, &renorm).expect("fwd");
            group.throughput(Throughput::Bytes(
                indices.byte_len() + dy.byte_len() + 4 * (rows * dim) as u64,
            ));
            group.bench_function(BenchmarkId::new("backward_freq", &text), |b| {
                common::time_gpu(b, &engine, || {
                    embedding::embedding_backward(&saved_freq, &dy).map(drop)
                })
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
