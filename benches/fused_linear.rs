//! Criterion benches of the fused linear losses, timed on the GPU ([`bench::gpu_time_iters`]
//! through `iter_custom`): fused linear cross-entropy forward + backward (gradients come out of
//! the forward; mean over targets, a fifth ignored) and JSD and cosine distillation forward +
//! backward, F32 and BF16, and the scaled cross-entropy (temperature 0.7, entropy output, backward with
//! an entropy cotangent, which recomputes the chunks: `8·rows·hidden·vocab` FLOPs), on small
//! shapes so `cargo bench --bench fused_linear` stays quick on
//! lavapipe. Throughput is in FLOPs (`6·rows·hidden·vocab` for the cross-entropy, `8·…` for
//! the distillation, whose teacher head adds one product), so criterion's "elem/s" reads as
//! FLOP/s. The `bench` example runs Liger's shape (H 4096, V 128,256, BT 2,048 and 8,192)
//! and reports the peak memory.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::fused_linear::{
    Chunking, DistillationOptions, FusedLinearCrossEntropyOptions, LinearHead, SoftLoss,
    fused_linear_cross_entropy, fused_linear_cross_entropy_backward,
    fused_linear_cross_entropy_backward_with_entropy, fused_linear_distillation,
    fused_linear_distillation_backward,
};
use wgrad::loss::CrossEntropyOptions;
use wgrad::{DType, Engine, Result, Tensor, bench, cast};

/// `[rows, hidden, vocab]`.
const SHAPES: [[usize; 3]; 2] = [[64, 64, 1024], [256, 128, 2048]];

fn filled(
    engine: &Engine,
    shape: &[usize],
    dtype: DType,
    scale: f32,
    seed: usize,
) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| ((((i + seed) * 7919) % 2001) as f32 - 1000.0) / 1000.0 * scale)
        .collect();
    cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
}

fn fused_linear(c: &mut Criterion) {
    let Some(engine) = common::engine("fused_linear") else {
        return;
    };
    // Targets are not read back inside timed sections (the check synchronizes).
    let ce_options = FusedLinearCrossEntropyOptions {
        cross_entropy: CrossEntropyOptions {
            check_targets: false,
            ..Default::default()
        },
        chunking: Chunking {
            chunk_rows: Some(64),
            memory_budget: None,
            tensor_cores: false,
            tensor_core_gradients: false,
            ..Chunking::default()
        },
        ..Default::default()
    };
    let distill_options = DistillationOptions {
        temperature: 2.0,
        chunking: ce_options.chunking,
        ..Default::default()
    };
    for dtype in [DType::F32, DType::BF16] {
        let mut ce = c.benchmark_group(format!("fused_linear_ce_fwd_bwd_{dtype}"));
        let mut inputs = Vec::new();
        for [rows, hidden, vocab] in SHAPES {
            let w_scale = 1.0 / (hidden as f32).sqrt();
            let x = filled(&engine, &[rows, hidden], dtype, 1.0, 1).expect("x");
            let w = filled(&engine, &[vocab, hidden], dtype, w_scale, 2).expect("w");
            let xt = filled(&engine, &[rows, hidden], dtype, 1.0, 3).expect("teacher x");
            let wt = filled(&engine, &[vocab, hidden], dtype, w_scale, 4).expect("teacher w");
            let targets: Vec<i32> = (0..rows)
                .map(|r| {
                    if r % 5 == 0 {
                        -100
                    } else {
                        ((r * 7919) % vocab) as i32
                    }
                })
                .collect();
            let t = Tensor::from_slice(&engine, &targets, &[rows]).expect("targets");
            inputs.push(([rows, hidden, vocab], x, w, xt, wt, t));
        }
        for ([rows, hidden, vocab], x, w, _, _, t) in &inputs {
            let head = LinearHead {
                input: x,
                weight: w,
                bias: None,
            };
            ce.throughput(Throughput::Elements((6 * rows * hidden * vocab) as u64));
            bench::prewarm(&engine, 0.05).expect("prewarm");
            ce.bench_function(
                BenchmarkId::from_parameter(bench::shape_text(&[*rows, *hidden, *vocab])),
                |b| {
                    common::time_gpu(b, &engine, || {
                        let (_, saved) = fused_linear_cross_entropy(head, t, &ce_options)?;
                        fused_linear_cross_entropy_backward(&saved, None).map(drop)
                    })
                },
            );
        }
        ce.finish();
        let scaled_options = FusedLinearCrossEntropyOptions {
            temperature: 0.7,
            return_entropy: true,
            ..ce_options.clone()
        };
        let mut scaled = c.benchmark_group(format!("fused_linear_ce_scaled_fwd_bwd_{dtype}"));
        for ([rows, hidden, vocab], x, w, _, _, t) in &inputs {
            let head = LinearHead {
                input: x,
                weight: w,
                bias: None,
            };
            let ecot = Tensor::from_slice(&engine, &vec![0.01f32; *rows], &[*rows]).expect("ecot");
            scaled.throughput(Throughput::Elements((8 * rows * hidden * vocab) as u64));
            bench::prewarm(&engine, 0.05).expect("prewarm");
            scaled.bench_function(
                BenchmarkId::from_parameter(bench::shape_text(&[*rows, *hidden, *vocab])),
                |b| {
                    common::time_gpu(b, &engine, || {
                        let (_, saved) = fused_linear_cross_entropy(head, t, &scaled_options)?;
                        fused_linear_cross_entropy_backward_with_entropy(&saved, None, Some(&ecot))
                            .map(drop)
                    })
                },
            );
        }
        scaled.finish();
        let cosine_options = DistillationOptions {
            soft: SoftLoss::Cosine { beta: 0.5 },
            ..distill_options.clone()
        };
        for (name, options) in [("jsd", &distill_options), ("cosine", &cosine_options)] {
            let mut group = c.benchmark_group(format!("fused_linear_{name}_fwd_bwd_{dtype}"));
            for ([rows, hidden, vocab], x, w, xt, wt, t) in &inputs {
                let student = LinearHead {
                    input: x,
                    weight: w,
                    bias: None,
                };
                let teacher = LinearHead {
                    input: xt,
                    weight: wt,
                    bias: None,
                };
                group.throughput(Throughput::Elements((8 * rows * hidden * vocab) as u64));
                bench::prewarm(&engine, 0.05).expect("prewarm");
                group.bench_function(
                    BenchmarkId::from_parameter(bench::shape_text(&[*rows, *hidden, *vocab])),
                    |b| {
                        common::time_gpu(b, &engine, || {
                            let (_, saved) =
                                fused_linear_distillation(student, teacher, Some(t), options)?;
                            fused_linear_distillation_backward(&saved, None).map(drop)
                        })
                    },
                );
            }
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = fused_linear
}
criterion_main!(benches);
