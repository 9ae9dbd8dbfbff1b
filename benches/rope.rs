//! Criterion benches of the RoPE family: q and k with different head counts, shared tables,
//! forward and backward (with and without table gradients), timed on the GPU with
//! `bench::gpu_time_iters`. Small shapes for lavapipe; `examples/bench.rs` has Liger's shapes.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::rope::{self, RopeQkOptions, RopeScaling};
use wgrad::{DType, Engine, Result, Tensor, bench};

/// (batch, seq, q heads, k heads, head dim).
const SHAPES: [[usize; 5]; 2] = [[1, 128, 8, 2, 64], [2, 256, 8, 2, 128]];

fn input(engine: &Engine, shape: &[usize], dtype: DType, seed: usize) -> Result<Tensor> {
    common::sawtooth(engine, shape, dtype, seed, 1, 32.0)
}

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("rope") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let mut group = c.benchmark_group(format!("rope_qk_{dtype}"));
        for [b, s, hq, hk, d] in SHAPES {
            let q = input(&engine, &[b, s, hq, d], dtype, 0).expect("q");
            let k = input(&engine, &[b, s, hk, d], dtype, 5).expect("k");
            let dq = input(&engine, &[b, s, hq, d], dtype, 2).expect("dq");
            let dk = input(&engine, &[b, s, hk, d], dtype, 3).expect("dk");
            let (cos, sin) =
                rope::tables(&engine, s, d, 10000.0, &RopeScaling::None, dtype).expect("tables");
            let opts = RopeQkOptions::default();
            let grads_opts = RopeQkOptions {
                table_grads: true,
                ..opts
            };
            let (_, saved) = rope::qk_forward(&q, &k, &cos, &sin, None, &opts).expect("forward");
            let (_, saved_tables) =
                rope::qk_forward(&q, &k, &cos, &sin, None, &grads_opts).expect("forward");
            let text = format!("b{b}_t{s}_hq{hq}_hk{hk}_d{d}");
            let tables = cos.byte_len() + sin.byte_len();
            let qk = q.byte_len() + k.byte_len();
            bench::prewarm(&engine, 0.05).expect("prewarm");
            group.throughput(Throughput::Bytes(2 * qk + tables));
            group.bench_function(BenchmarkId::new("forward", &text), |bch| {
                common::time_gpu(bch, &engine, || {
                    rope::qk_forward(&q, &k, &cos, &sin, None, &opts).map(drop)
                })
            });
            let f32_out = 4 * (q.len() + k.len()) as u64;
            group.throughput(Throughput::Bytes(qk + tables + f32_out));
            group.bench_function(BenchmarkId::new("backward", &text), |bch| {
                common::time_gpu(bch, &engine, || {
                    rope::qk_backward(&saved, &dq, &dk).map(drop)
                })
            });
            group.throughput(Throughput::Bytes(2 * qk + tables + f32_out + 2 * tables));
            group.bench_function(BenchmarkId::new("backward_table_grads", &text), |bch| {
                common::time_gpu(bch, &engine, || {
                    rope::qk_backward(&saved_tables, &dq, &dk).map(drop)
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
