//! Criterion benches of the normalization family, timed on the GPU (`bench::gpu_time_iters`
//! through `iter_custom`): forward and backward (parameter partials included) of RMSNorm,
//! LayerNorm and add+RMSNorm in F32 and BF16, and of the other normalizations in F32, on
//! small and medium shapes with a short measurement time (quick on lavapipe). The `bench`
//! example has the large-shape, bandwidth-vs-copy figures.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::bench;
use wgrad::{DType, Engine, Result, Tensor, cast, norm};

/// Shapes every operator runs on.
const SHAPES: [[usize; 2]; 2] = [[256, 256], [1024, 1024]];

/// Runs an operator once on its inputs and returns its outputs.
type Run = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>>;

/// (name, inputs, run) of every benched operator on one shape and dtype.
fn operators(
    engine: &Engine,
    shape: &[usize],
    dtype: DType,
) -> Result<Vec<(String, Vec<Tensor>, Run)>> {
    let (rows, cols) = (shape[0], shape[1]);
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| ((i % 251) as f32 - 125.0) / 64.0)
        .collect();
    let x = cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)?;
    let dy = bench::copy(&x)?;
    let w = cast::cast(
        &Tensor::from_slice(engine, &vec![1.25f32; cols], &[cols])?,
        dtype,
    )?;
    let o = norm::RmsNormOptions::default();
    let lo = norm::LayerNormOptions::default();
    let (_, rms) = norm::rms_norm(&x, Some(&w), &o)?;
    let (_, layer) = norm::layer_norm(&x, Some(&w), Some(&w), &lo)?;
    let (_, _, add) = norm::add_rms_norm(&x, &dy, Some(&w), &o)?;
    let mut ops: Vec<(String, Vec<Tensor>, Run)> = vec![
        (
            "rms_norm_fwd".into(),
            vec![x.clone(), w.clone()],
            Box::new(move |i| Ok(vec![norm::rms_norm(&i[0], Some(&i[1]), &o)?.0])),
        ),
        (
            "rms_norm_bwd".into(),
            vec![x.clone(), dy.clone(), w.clone()],
            Box::new(move |i| {
                let g = norm::norm_backward(&rms, &i[1], None)?;
                Ok(vec![g.source, g.weight.expect("dw")])
            }),
        ),
        (
            "layer_norm_fwd".into(),
            vec![x.clone(), w.clone(), w.clone()],
            Box::new(move |i| {
                Ok(vec![
                    norm::layer_norm(&i[0], Some(&i[1]), Some(&i[2]), &lo)?.0,
                ])
            }),
        ),
        (
            "layer_norm_bwd".into(),
            vec![x.clone(), dy.clone(), w.clone()],
            Box::new(move |i| {
                let g = norm::norm_backward(&layer, &i[1], None)?;
                Ok(vec![g.source, g.weight.expect("dw"), g.bias.expect("db")])
            }),
        ),
        (
            "add_rms_norm_fwd".into(),
            vec![x.clone(), dy.clone(), w.clone()],
            Box::new(move |i| {
                let (y, s, _) = norm::add_rms_norm(&i[0], &i[1], Some(&i[2]), &o)?;
                Ok(vec![y, s])
            }),
        ),
        (
            "add_rms_norm_bwd".into(),
            vec![x.clone(), dy.clone(), dy.clone(), w.clone()],
            Box::new(move |i| {
                let g = norm::norm_backward(&add, &i[1], None)?;
                Ok(vec![g.source, g.weight.expect("dw")])
            }),
        ),
    ];
    if dtype == DType::F32 {
        let m = Tensor::from_slice(engine, &vec![0.125f32; 2 * cols], &[2, cols])?;
        let (_, modulated) = norm::modulated_rms_norm(&x, Some(&w), &m, &m, &o)?;
        let alpha = Tensor::from_slice(engine, &[0.5f32], &[1])?;
        let (_, dyt) = norm::dyt(&x, &alpha, &w, Some(&w))?;
        let pw = Tensor::from_slice(engine, &[0.5f32, 0.25, 1.0], &[3])?;
        let po = norm::PolyNormOptions::default();
        let (_, poly) = norm::poly_norm(&x, &pw, None, &po)?;
        let gx = x.reshape(&[rows, 16, cols / 16])?;
        let gw = Tensor::from_slice(engine, &[1.25f32; 16], &[16])?;
        let go = norm::GroupNormOptions::default();
        let (_, group) = norm::group_norm(&gx, 4, Some(&gw), Some(&gw), &go)?;
        let gdy = dy.reshape(gx.shape())?;
        ops.push((
            "modulated_rms_norm_fwd".into(),
            vec![x.clone(), w.clone(), m.clone(), m.clone()],
            Box::new(move |i| {
                Ok(vec![
                    norm::modulated_rms_norm(&i[0], Some(&i[1]), &i[2], &i[3], &o)?.0,
                ])
            }),
        ));
        ops.push((
            "modulated_rms_norm_bwd".into(),
            vec![x.clone(), dy.clone(), w.clone(), m.clone()],
            Box::new(move |i| Ok(vec![norm::norm_backward(&modulated, &i[1], None)?.source])),
        ));
        ops.push((
            "dyt_fwd".into(),
            vec![x.clone(), alpha.clone(), w.clone(), w.clone()],
            Box::new(move |i| Ok(vec![norm::dyt(&i[0], &i[1], &i[2], Some(&i[3]))?.0])),
        ));
        ops.push((
            "dyt_bwd".into(),
            vec![x.clone(), dy.clone(), w.clone()],
            Box::new(move |i| Ok(vec![norm::dyt_backward(&dyt, &i[1])?.source])),
        ));
        ops.push((
            "poly_norm_fwd".into(),
            vec![x.clone(), pw.clone()],
            Box::new(move |i| Ok(vec![norm::poly_norm(&i[0], &i[1], None, &po)?.0])),
        ));
        ops.push((
            "poly_norm_bwd".into(),
            vec![x.clone(), dy.clone()],
            Box::new(move |i| Ok(vec![norm::poly_norm_backward(&poly, &i[1])?.source])),
        ));
        ops.push((
            "group_norm_fwd".into(),
            vec![gx.clone(), gw.clone(), gw.clone()],
            Box::new(move |i| {
                Ok(vec![
                    norm::group_norm(&i[0], 4, Some(&i[1]), Some(&i[2]), &go)?.0,
                ])
            }),
        ));
        ops.push((
            "group_norm_bwd".into(),
            vec![gx, gdy.clone(), gw],
            Box::new(move |i| Ok(vec![norm::norm_backward(&group, &i[1], None)?.source])),
        ));
    }
    Ok(ops)
}

fn norms(c: &mut Criterion) {
    let Some(engine) = common::engine("norm") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for shape in SHAPES {
            for (name, inputs, run) in operators(&engine, &shape, dtype).expect("bench inputs") {
                let mut group = c.benchmark_group(format!("{name}_{dtype}"));
                let outputs = run(&inputs).expect("first run");
                let bytes: u64 = inputs.iter().chain(&outputs).map(Tensor::byte_len).sum();
                drop(outputs);
                group.throughput(Throughput::Bytes(bytes));
                bench::prewarm(&engine, 0.05).expect("prewarm");
                group.bench_with_input(
                    BenchmarkId::from_parameter(bench::shape_text(&shape)),
                    &inputs,
                    |b, inputs| common::time_gpu(b, &engine, || run(inputs).map(drop)),
                );
                group.finish();
            }
        }
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = norms
}
criterion_main!(benches);
