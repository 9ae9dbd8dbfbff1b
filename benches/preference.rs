//! Criterion benches of the paired preference losses on a fused head (DPO, ORPO and KTO,
//! forward and backward), timed on the GPU with `bench::gpu_time_iters`, on small heads so
//! `cargo bench --bench preference` stays quick on lavapipe; `examples/bench.rs` has the large
//! shape. Throughput: the FLOPs of the four head products (`8·rows·H·V`).

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::fused_linear::LinearHead;
use wgrad::preference::{
    PreferenceLoss, PreferenceOptions, kto_loss, preference_loss, preference_loss_backward,
};
use wgrad::{DType, Tensor, bench, cast};

/// (pairs, tokens, hidden, vocabulary).
const SHAPES: [(usize, usize, usize, usize); 2] = [(2, 16, 64, 1024), (2, 64, 128, 4096)];

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("preference") else {
        return;
    };
    let mut group = c.benchmark_group("preference_loss");
    for (pairs, t, h, v) in SHAPES {
        let rows = 2 * pairs * t;
        let make = |len: usize, shape: &[usize]| {
            let data: Vec<f32> = (0..len)
                .map(|i| ((i * 7 % 251) as f32 - 125.0) / 500.0)
                .collect();
            cast::cast(
                &Tensor::from_slice(&engine, &data, shape).expect("upload"),
                DType::F32,
            )
            .expect("cast")
        };
        let x = make(rows * h, &[2 * pairs, t, h]);
        let w = make(v * h, &[v, h]);
        let ids: Vec<i32> = (0..rows).map(|i| (i * 7919 % v) as i32).collect();
        let targets = Tensor::from_slice(&engine, &ids, &[2 * pairs, t]).expect("targets");
        let text = format!("{rows}x{h}x{v}");
        group.throughput(Throughput::Elements((8 * rows * h * v) as u64));
        bench::prewarm(&engine, 0.05).expect("prewarm");
        for loss in [PreferenceLoss::Dpo, PreferenceLoss::Orpo] {
            let options = PreferenceOptions {
                check_targets: false,
                ..PreferenceOptions::new(loss)
            };
            let name = format!("{loss:?}").to_lowercase();
            group.bench_function(BenchmarkId::new(name, &text), |b| {
                common::time_gpu(b, &engine, || {
                    let head = LinearHead {
                        input: &x,
                        weight: &w,
                        bias: None,
                    };
                    let (_, saved) = preference_loss(head, &targets, None, &options)?;
                    preference_loss_backward(&saved, None).map(drop)
                })
            });
        }
        let labels: Vec<u32> = (0..2 * pairs).map(|i| (i % 2) as u32).collect();
        let labels = Tensor::from_slice(&engine, &labels, &[2 * pairs]).expect("labels");
        let options = PreferenceOptions {
            check_targets: false,
            ..PreferenceOptions::new(PreferenceLoss::Kto)
        };
        group.bench_function(BenchmarkId::new("kto", &text), |b| {
            common::time_gpu(b, &engine, || {
                let head = LinearHead {
                    input: &x,
                    weight: &w,
                    bias: None,
                };
                let (_, saved) = kto_loss(head, &targets, &labels, None, None, &options)?;
                preference_loss_backward(&saved, None).map(drop)
            })
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
