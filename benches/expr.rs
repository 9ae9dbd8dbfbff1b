//! Criterion benches of expression VJPs (`wgrad::expr`): RMSNorm with a weight written as an
//! expression (`x / sqrt(Σx²/cols + 1e-5) · w`), forward and backward (dx and dw), F32 and
//! BF16, timed on the GPU with `bench::gpu_time_iters`. Throughput is the bytes the operator
//! itself must move (x, w read and y written; x, dy, w, the saved statistic read and dx, dw
//! written). Small sizes for lavapipe; `examples/bench.rs` (`--only expr`) runs the norm rows'
//! shape.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::expr::{Expr, ExprOp, Kind};
use wgrad::{DType, bench};

const SHAPES: [[usize; 2]; 2] = [[256, 1024], [1024, 1024]];

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("expr") else {
        return;
    };
    let x = Expr::input(0, Kind::Element);
    let w = Expr::input(1, Kind::Column);
    let y = &x / ((&x * &x).row_sum() / Expr::width() + 1e-5).sqrt() * &w;
    let op = ExprOp::new(&[Kind::Element, Kind::Column], &[y]).expect("expression");
    let mut group = c.benchmark_group("expr");
    for [rows, cols] in SHAPES {
        for dtype in [DType::F32, DType::BF16] {
            let text = format!("{rows}x{cols}_{dtype}");
            let xs = common::sawtooth(&engine, &[rows, cols], dtype, 0, 251, 64.0).expect("x");
            let ws = common::sawtooth(&engine, &[cols], dtype, 1, 7, 4.0).expect("w");
            let dy = common::sawtooth(&engine, &[rows, cols], dtype, 2, 251, 64.0).expect("dy");
            let (_, saved) = op.forward(&[&xs, &ws], &[dtype]).expect("forward");
            bench::prewarm(&engine, 0.05).expect("prewarm");
            let (n, e, w) = ((rows * cols) as u64, dtype.size() as u64, cols as u64);
            group.throughput(Throughput::Bytes(2 * n * e + w * e));
            group.bench_function(BenchmarkId::new("rms_norm_fwd", &text), |b| {
                common::time_gpu(b, &engine, || op.forward(&[&xs, &ws], &[dtype]).map(drop))
            });
            group.throughput(Throughput::Bytes(
                2 * n * e + n * 4 + w * (e + 4) + 4 * rows as u64,
            ));
            group.bench_function(BenchmarkId::new("rms_norm_bwd", &text), |b| {
                common::time_gpu(b, &engine, || {
                    op.backward(&saved, &[Some(&dy)], &[0, 1]).map(drop)
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
