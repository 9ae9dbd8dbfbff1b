//! Criterion benches of vocabulary-parallel cross-entropy (`wgrad::vocab_parallel`): 256 rows
//! over a vocabulary of 4 × 2,000 in 4 shards, mean loss, the steps on one engine, forward and
//! forward + backward, F32 and BF16 logits, timed on the GPU with `bench::gpu_time_iters`.
//! Throughput is the logit bytes read (and, with the backward, the F32 gradient written).
//! `examples/bench.rs` (`--only vocab_parallel`) runs 4,096 rows of 4 × 8,000.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::vocab_parallel::{
    VocabParallelOptions, vocab_parallel_cross_entropy, vocab_parallel_cross_entropy_backward,
};
use wgrad::{DType, Tensor, bench};

const ROWS: usize = 256;
const WIDTH: usize = 2000;

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("vocab_parallel") else {
        return;
    };
    let targets: Vec<i32> = (0..ROWS)
        .map(|r| ((r * 7919) % (4 * WIDTH)) as i32)
        .collect();
    let t = Tensor::from_slice(&engine, &targets, &[ROWS]).expect("targets");
    let dl = Tensor::from_slice(&engine, &[1.0f32], &[]).expect("dloss");
    let o = VocabParallelOptions::default();
    let mut group = c.benchmark_group("vocab_parallel");
    for dtype in [DType::F32, DType::BF16] {
        let shards: Vec<Tensor> = (0..4)
            .map(|k| common::sawtooth(&engine, &[ROWS, WIDTH], dtype, k, 13, 64.0).expect("shard"))
            .collect();
        let refs: Vec<&Tensor> = shards.iter().collect();
        bench::prewarm(&engine, 0.05).expect("prewarm");
        let n = (4 * ROWS * WIDTH) as u64;
        group.throughput(Throughput::Bytes(n * dtype.size() as u64));
        group.bench_function(BenchmarkId::new("forward", dtype.to_string()), |b| {
            common::time_gpu(b, &engine, || {
                vocab_parallel_cross_entropy(&refs, &t, &o).map(drop)
            })
        });
        group.throughput(Throughput::Bytes(n * (2 * dtype.size() as u64 + 4)));
        group.bench_function(
            BenchmarkId::new("forward_backward", dtype.to_string()),
            |b| {
                common::time_gpu(b, &engine, || {
                    let (_, saved) = vocab_parallel_cross_entropy(&refs, &t, &o)?;
                    vocab_parallel_cross_entropy_backward(&saved, &refs, &dl).map(drop)
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = run
}
criterion_main!(benches);
