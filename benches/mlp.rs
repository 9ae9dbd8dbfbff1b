//! Criterion benches of the fused gated MLP (SwiGLU; forward, backward with saved and with
//! recomputed products), timed on the GPU with `bench::gpu_time_iters`; throughput in FLOPs
//! (three products forward, six backward, two more when recomputing). Small shapes keep it
//! quick on lavapipe; `examples/bench.rs` has the model shapes.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::gradcheck::Rng;
use wgrad::matmul::matmul_flops;
use wgrad::mlp::{MlpOptions, mlp, mlp_backward};
use wgrad::{DType, Engine, Result, Tensor, bench, cast};

/// (rows, hidden, intermediate).
const SHAPES: [(usize, usize, usize); 2] = [(64, 128, 344), (256, 256, 688)];

fn input(engine: &Engine, shape: &[usize], scale: f64, dtype: DType, seed: u64) -> Result<Tensor> {
    let len = shape.iter().product();
    let data: Vec<f32> = Rng::new(seed)
        .vec(len, -scale, scale)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
}

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("mlp") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let mut group = c.benchmark_group(format!("swiglu_mlp_{dtype}"));
        for (t, h, i) in SHAPES {
            let x = input(&engine, &[t, h], 1.0, dtype, 1).expect("x");
            let wg = input(&engine, &[i, h], 0.05, dtype, 2).expect("gate");
            let wu = input(&engine, &[i, h], 0.05, dtype, 3).expect("up");
            let wd = input(&engine, &[h, i], 0.05, dtype, 4).expect("down");
            let dy = input(&engine, &[t, h], 1.0, dtype, 5).expect("dy");
            let product = matmul_flops(1, t, i, h) as u64;
            let text = format!("{t}x{h}x{i}");
            bench::prewarm(&engine, 0.05).expect("prewarm");
            group.throughput(Throughput::Elements(3 * product));
            group.bench_function(BenchmarkId::new("forward", &text), |b| {
                common::time_gpu(b, &engine, || {
                    mlp(&x, &wg, &wu, &wd, &MlpOptions::default()).map(drop)
                })
            });
            for recompute in [false, true] {
                let options = MlpOptions {
                    recompute,
                    ..MlpOptions::default()
                };
                let (_, saved) = mlp(&x, &wg, &wu, &wd, &options).expect("forward");
                let products = if recompute { 8 } else { 6 };
                group.throughput(Throughput::Elements(products * product));
                let name = if recompute {
                    "backward_recompute"
                } else {
                    "backward"
                };
                group.bench_function(BenchmarkId::new(name, &text), |b| {
                    common::time_gpu(b, &engine, || mlp_backward(&saved, &dy).map(drop))
                });
            }
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
