//! Criterion benches of attention residuals (`wgrad::attn_res`): 4 and 8 blocks of 256 tokens
//! of width 1,024, forward and backward, F32 and BF16, timed on the GPU with
//! `bench::gpu_time_iters`. Throughput is the bytes the operator must move (the blocks read and
//! the output written; the backward: the blocks and the cotangent read, the F32 block gradient
//! written). `examples/bench.rs` (`--only attn_res`) runs 8 blocks of 2,048 tokens of 4,096.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::attn_res::{AttnResOptions, attn_res, attn_res_backward};
use wgrad::{DType, bench};

const BLOCKS: [usize; 2] = [4, 8];
const TOKENS: usize = 256;
const WIDTH: usize = 1024;

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("attn_res") else {
        return;
    };
    let o = AttnResOptions::default();
    let mut group = c.benchmark_group("attn_res");
    for n in BLOCKS {
        for dtype in [DType::F32, DType::BF16] {
            let text = format!("N{n}_{dtype}");
            let v = common::sawtooth(&engine, &[n, TOKENS, WIDTH], dtype, 0, 7, 64.0).expect("v");
            let q = common::sawtooth(&engine, &[WIDTH], dtype, 1, 3, 2000.0).expect("q");
            let w = common::sawtooth(&engine, &[WIDTH], dtype, 2, 5, 500.0).expect("w");
            let dh = common::sawtooth(&engine, &[TOKENS, WIDTH], dtype, 3, 7, 64.0).expect("dh");
            let (_, saved) = attn_res(&v, &q, &w, &o).expect("forward");
            bench::prewarm(&engine, 0.05).expect("prewarm");
            let (nv, nh, e) = (
                (n * TOKENS * WIDTH) as u64,
                (TOKENS * WIDTH) as u64,
                dtype.size() as u64,
            );
            group.throughput(Throughput::Bytes((nv + nh) * e));
            group.bench_function(BenchmarkId::new("forward", &text), |b| {
                common::time_gpu(b, &engine, || attn_res(&v, &q, &w, &o).map(drop))
            });
            group.throughput(Throughput::Bytes((nv + nh) * e + nv * 4));
            group.bench_function(BenchmarkId::new("backward", &text), |b| {
                common::time_gpu(b, &engine, || attn_res_backward(&saved, &dh).map(drop))
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
