//! Criterion benches of every wgrad operator, timed on the GPU: `iter_custom` returns the
//! summed [`Engine::time`] spans (GPU timestamps, or the wall clock when the adapter has none),
//! so criterion sees device time rather than host recording time. Small and medium shapes and
//! a short measurement time keep `cargo bench` quick even on lavapipe; the `bench` example is
//! the large-shape, bandwidth-vs-copy report.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::bench;
use wgrad::{DType, Engine, Result, Tensor, cast, reduce};

/// Shapes every operator runs on.
const SHAPES: [[usize; 2]; 2] = [[256, 256], [1024, 1024]];

type OpFn = fn(&Tensor) -> Result<Tensor>;

/// (name, input dtype, operator).
fn operators() -> Vec<(&'static str, DType, OpFn)> {
    vec![
        ("copy", DType::F32, bench::copy),
        ("cast_f32_bf16", DType::F32, |x| cast::cast(x, DType::BF16)),
        ("cast_f32_f16", DType::F32, |x| cast::cast(x, DType::F16)),
        ("cast_bf16_f32", DType::BF16, |x| cast::cast(x, DType::F32)),
        ("sum_rows", DType::F32, reduce::sum_rows),
        ("max_rows", DType::F32, reduce::max_rows),
        ("sum_columns", DType::F32, reduce::sum_columns),
    ]
}

fn input(engine: &Engine, shape: &[usize], dtype: DType) -> Result<Tensor> {
    common::sawtooth(engine, shape, dtype, 0, 1, 8.0)
}

fn ops(c: &mut Criterion) {
    let Some(engine) = common::engine("wgrad") else {
        return;
    };
    for (name, dtype, op) in operators() {
        let mut group = c.benchmark_group(name);
        for shape in SHAPES {
            let x = input(&engine, &shape, dtype).expect("bench input");
            let out = op(&x).expect("first run");
            group.throughput(Throughput::Bytes(x.byte_len() + out.byte_len()));
            drop(out);
            bench::prewarm(&engine, 0.05).expect("prewarm");
            group.bench_with_input(
                BenchmarkId::from_parameter(bench::shape_text(&shape)),
                &x,
                |b, x| common::time_gpu(b, &engine, || op(x).map(drop)),
            );
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = ops
}
criterion_main!(benches);
