//! Criterion benches of the fused mixture of experts (`wgrad::moe`): 256 tokens of width 256
//! over 8 experts of I 128, top-2, forward (routing included) and backward with kept and with
//! recomputed pre-activations, F32 and BF16, timed on the GPU with `bench::gpu_time_iters`;
//! throughput in FLOPs (three products a slot forward, six backward, two more recomputing).
//! `examples/bench.rs` (`--only fused_moe`) runs Qwen3-MoE-30B's experts.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::matmul::matmul_flops;
use wgrad::moe::{MoeOptions, fused_moe, fused_moe_backward};
use wgrad::{DType, Tensor, bench};

const TOKENS: usize = 256;
const EXPERTS: usize = 8;
const HIDDEN: usize = 256;
const INTER: usize = 128;
const TOP_K: usize = 2;

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("moe") else {
        return;
    };
    let index: Vec<u32> = (0..TOKENS * TOP_K)
        .map(|f| ((f / TOP_K * 3 + f % TOP_K * 4) % EXPERTS) as u32)
        .collect();
    let idx = Tensor::from_slice(&engine, &index, &[TOKENS, TOP_K]).expect("index");
    let slot_products = matmul_flops(1, TOKENS * TOP_K, INTER, HIDDEN) as u64;
    let mut group = c.benchmark_group("fused_moe");
    for dtype in [DType::F32, DType::BF16] {
        let (t, e, h, i) = (TOKENS, EXPERTS, HIDDEN, INTER);
        let x = common::sawtooth(&engine, &[t, h], dtype, 0, 7, 64.0).expect("x");
        let gu = common::sawtooth(&engine, &[e, 2 * i, h], dtype, 1, 3, 2000.0).expect("gate_up");
        let down = common::sawtooth(&engine, &[e, h, i], dtype, 2, 5, 2000.0).expect("down");
        let w = common::sawtooth(&engine, &[t, TOP_K], dtype, 3, 5, 500.0).expect("weights");
        let dy = common::sawtooth(&engine, &[t, h], dtype, 4, 7, 64.0).expect("dy");
        let text = format!("T{t}_E{e}_H{h}_I{i}_K{TOP_K}_{dtype}");
        bench::prewarm(&engine, 0.05).expect("prewarm");
        let o = MoeOptions::default();
        group.throughput(Throughput::Elements(3 * slot_products));
        group.bench_function(BenchmarkId::new("forward", &text), |b| {
            common::time_gpu(b, &engine, || {
                fused_moe(&x, &gu, &down, &idx, &w, &o).map(drop)
            })
        });
        for recompute in [false, true] {
            let options = MoeOptions { recompute, ..o };
            let (_, saved) = fused_moe(&x, &gu, &down, &idx, &w, &options).expect("forward");
            let products = if recompute { 8 } else { 6 };
            group.throughput(Throughput::Elements(products * slot_products));
            let name = if recompute {
                "backward_recompute"
            } else {
                "backward"
            };
            group.bench_function(BenchmarkId::new(name, &text), |b| {
                common::time_gpu(b, &engine, || fused_moe_backward(&saved, &dy).map(drop))
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
