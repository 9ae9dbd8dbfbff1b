//! Criterion benches of multi-token attention (`wgrad::mta`): batch 2, 4 heads into 4
//! channels, a 3 × 3 kernel with padding 1, softmax, bias; forward and backward, F32 and BF16,
//! timed on the GPU with `bench::gpu_time_iters`. Throughput is the bytes the operator must move
//! (scores read and the output written; the backward: the cotangent and probabilities read,
//! the F32 score gradient written). Small sides for lavapipe; `examples/bench.rs`
//! (`--only mta`) runs L 1,024 and 2,048.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::mta::{MtaOptions, multi_token_attention, multi_token_attention_backward};
use wgrad::{DType, bench};

const SIDES: [usize; 2] = [64, 128];

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("mta") else {
        return;
    };
    let options = MtaOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let mut group = c.benchmark_group("mta");
    for l in SIDES {
        for dtype in [DType::F32, DType::BF16] {
            let text = format!("L{l}_{dtype}");
            let shape = [2, 4, l, l];
            let scores = common::sawtooth(&engine, &shape, dtype, 0, 7, 32.0).expect("scores");
            let dy = common::sawtooth(&engine, &shape, dtype, 1, 5, 64.0).expect("dy");
            let weight = common::sawtooth(&engine, &[4, 4, 3, 3], dtype, 2, 3, 200.0).expect("w");
            let bias = common::sawtooth(&engine, &[4], dtype, 3, 1, 100.0).expect("bias");
            let (_, saved) =
                multi_token_attention(&scores, &weight, Some(&bias), &options).expect("forward");
            bench::prewarm(&engine, 0.05).expect("prewarm");
            let n = (2 * 4 * l * l) as u64;
            let e = dtype.size() as u64;
            group.throughput(Throughput::Bytes(2 * n * e));
            group.bench_function(BenchmarkId::new("forward", &text), |b| {
                common::time_gpu(b, &engine, || {
                    multi_token_attention(&scores, &weight, Some(&bias), &options).map(drop)
                })
            });
            group.throughput(Throughput::Bytes(n * e + n * 4 + n * 4));
            group.bench_function(BenchmarkId::new("backward", &text), |b| {
                common::time_gpu(b, &engine, || {
                    multi_token_attention_backward(&saved, &dy).map(drop)
                })
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = run
}
criterion_main!(benches);
