//! Criterion benches of manifold-constrained hyper-connections (`wgrad::mhc`): 512 tokens of 4
//! streams of width 1,024, F32 and BF16, the coefficients, the pre-aggregation and the post +
//! residual mix, forward and backward, timed on the GPU with `bench::gpu_time_iters`.
//! Throughput is the bytes the operator must move (x read; the outputs written; backwards: x
//! and the cotangent read, the F32 gradients written). `examples/bench.rs` (`--only mhc`) runs
//! 4,096 tokens of 4 × 4,096.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::mhc::{
    MhcOptions, mhc_coefficients, mhc_coefficients_backward, mhc_post_res, mhc_post_res_backward,
    mhc_pre, mhc_pre_backward,
};
use wgrad::{DType, bench};

const TOKENS: usize = 512;
const STREAMS: usize = 4;
const WIDTH: usize = 1024;

fn run(c: &mut Criterion) {
    let Some(engine) = common::engine("mhc") else {
        return;
    };
    let (t, n, w) = (TOKENS, STREAMS, WIDTH);
    let m = n * n + 2 * n;
    let o = MhcOptions::default();
    let mut group = c.benchmark_group("mhc");
    for dtype in [DType::F32, DType::BF16] {
        let text = format!("T{t}_HC{n}_C{w}_{dtype}");
        let saw = |shape: &[usize], seed, period, scale| {
            common::sawtooth(&engine, shape, dtype, seed, period, scale).expect("input")
        };
        let x = saw(&[t, n, w], 0, 7, 64.0);
        let phi = saw(&[n * w, m], 1, 5, 2000.0);
        let b = saw(&[m], 2, 3, 64.0);
        let a = saw(&[1], 3, 2, 64.0);
        let f = saw(&[t, w], 4, 7, 64.0);
        let g_pre = saw(&[t, n], 5, 3, 64.0);
        let g_res = saw(&[t, n, n], 6, 5, 64.0);
        let g_x = saw(&[t, n, w], 7, 7, 64.0);
        let g_f = saw(&[t, w], 8, 7, 64.0);
        let (h, cs) = mhc_coefficients(&x, &phi, &b, &a, &a, &a, &o).expect("coefficients");
        let (_, ps) = mhc_pre(&x, &h.h_pre).expect("pre");
        let (_, rs) = mhc_post_res(&x, &f, &h.h_post, &h.h_res).expect("post_res");
        bench::prewarm(&engine, 0.05).expect("prewarm");
        let (nx, nf, e) = ((t * n * w) as u64, (t * w) as u64, dtype.size() as u64);
        group.throughput(Throughput::Bytes(nx * e));
        group.bench_function(BenchmarkId::new("coefficients_forward", &text), |bch| {
            common::time_gpu(bch, &engine, || {
                mhc_coefficients(&x, &phi, &b, &a, &a, &a, &o).map(drop)
            })
        });
        group.throughput(Throughput::Bytes(nx * e + nx * 4));
        group.bench_function(BenchmarkId::new("coefficients_backward", &text), |bch| {
            common::time_gpu(bch, &engine, || {
                mhc_coefficients_backward(&cs, Some(&g_pre), Some(&g_pre), Some(&g_res)).map(drop)
            })
        });
        group.throughput(Throughput::Bytes((nx + nf) * e));
        group.bench_function(BenchmarkId::new("pre_forward", &text), |bch| {
            common::time_gpu(bch, &engine, || mhc_pre(&x, &h.h_pre).map(drop))
        });
        group.throughput(Throughput::Bytes((nx + nf) * e + nx * 4));
        group.bench_function(BenchmarkId::new("pre_backward", &text), |bch| {
            common::time_gpu(bch, &engine, || mhc_pre_backward(&ps, &g_f).map(drop))
        });
        group.throughput(Throughput::Bytes((2 * nx + nf) * e));
        group.bench_function(BenchmarkId::new("post_res_forward", &text), |bch| {
            common::time_gpu(bch, &engine, || {
                mhc_post_res(&x, &f, &h.h_post, &h.h_res).map(drop)
            })
        });
        group.throughput(Throughput::Bytes((2 * nx + nf) * e + (nx + nf) * 4));
        group.bench_function(BenchmarkId::new("post_res_backward", &text), |bch| {
            common::time_gpu(bch, &engine, || mhc_post_res_backward(&rs, &g_x).map(drop))
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
