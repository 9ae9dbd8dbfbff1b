//! Criterion benches of the GRPO token loss (forward, backward, both), timed on the GPU with
//! `bench::gpu_time_iters`, on small logits so `cargo bench --bench grpo` stays quick on
//! lavapipe; `examples/bench.rs` has the large shape. Throughput: the logits' bytes.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::grpo::{GrpoInputs, GrpoOptions, grpo_loss, grpo_loss_backward};
use wgrad::{DType, Result, Tensor, bench, cast};

/// (sequences, completion length, vocabulary).
const SHAPES: [(usize, usize, usize); 2] = [(2, 32, 4096), (4, 64, 8192)];

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("grpo") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let mut group = c.benchmark_group(format!("grpo_loss_{dtype}"));
        for (b, l, v) in SHAPES {
            let make = || -> Result<[Tensor; 4]> {
                let data: Vec<f32> = (0..b * (l + 1) * v)
                    .map(|i| ((i * 7 % 251) as f32 - 125.0) / 32.0)
                    .collect();
                let logits =
                    cast::cast(&Tensor::from_slice(&engine, &data, &[b, l + 1, v])?, dtype)?;
                let ids: Vec<i32> = (0..b * l).map(|i| (i * 7919 % v) as i32).collect();
                let adv: Vec<f32> = (0..b).map(|i| i as f32 - 0.5).collect();
                let logp = vec![-9.0f32; b * l];
                Ok([
                    logits,
                    Tensor::from_slice(&engine, &ids, &[b, l])?,
                    Tensor::from_slice(&engine, &adv, &[b])?,
                    Tensor::from_slice(&engine, &logp, &[b, l])?,
                ])
            };
            let [logits, ids, adv, logp] = make().expect("inputs");
            let inputs = GrpoInputs {
                logits: &logits,
                completion_ids: &ids,
                advantages: &adv,
                old_logp: Some(&logp),
                ref_logp: Some(&logp),
                mask: None,
            };
            let options = GrpoOptions {
                beta: 0.04,
                check_ids: false,
                ..GrpoOptions::default()
            };
            let text = format!("{b}x{l}x{v}");
            bench::prewarm(&engine, 0.05).expect("prewarm");
            group.throughput(Throughput::Bytes(logits.byte_len()));
            group.bench_function(BenchmarkId::new("forward", &text), |bch| {
                common::time_gpu(bch, &engine, || grpo_loss(&inputs, &options).map(drop))
            });
            let (_, saved) = grpo_loss(&inputs, &options).expect("forward");
            group.bench_function(BenchmarkId::new("backward", &text), |bch| {
                common::time_gpu(bch, &engine, || grpo_loss_backward(&saved, None).map(drop))
            });
            group.bench_function(BenchmarkId::new("forward_backward", &text), |bch| {
                common::time_gpu(bch, &engine, || {
                    let (_, saved) = grpo_loss(&inputs, &options)?;
                    grpo_loss_backward(&saved, None).map(drop)
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
