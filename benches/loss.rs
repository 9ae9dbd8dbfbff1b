//! Criterion benches of the loss family, timed on the GPU ([`bench::gpu_time_iters`] through
//! `iter_custom`): cross-entropy forward, backward, both and in place, softmax, log-softmax
//! and sparsemax forward and backward, and the divergences, on small shapes with a short
//! measurement so `cargo bench --bench loss` stays quick on lavapipe. The `bench` example has
//! the large shapes.

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgrad::bench;
use wgrad::loss::{self, CrossEntropyOptions, DivReduction};
use wgrad::{DType, Engine, Result, Tensor, cast};

/// (rows, classes) of the cross-entropy benches.
const CE_SHAPES: [[usize; 2]; 2] = [[64, 8192], [16, 32000]];
/// (rows, columns) of the softmax-like and divergence benches.
const ROW_SHAPES: [[usize; 2]; 2] = [[256, 256], [128, 4000]];

fn logits(engine: &Engine, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| ((i.wrapping_mul(2_654_435_761) % 4096) as f32 - 2048.0) / 256.0)
        .collect();
    cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
}

fn time(
    c: &mut Criterion,
    engine: &Engine,
    group: &str,
    shape: &[usize],
    bytes: u64,
    mut f: impl FnMut() -> Result<()>,
) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(bytes));
    bench::prewarm(engine, 0.05).expect("prewarm");
    g.bench_function(BenchmarkId::from_parameter(bench::shape_text(shape)), |b| {
        common::time_gpu(b, engine, &mut f)
    });
    g.finish();
}

fn losses(c: &mut Criterion) {
    let Some(engine) = common::engine("loss") else {
        return;
    };
    // Targets are not read back inside timed sections (the check synchronizes).
    let opts = CrossEntropyOptions {
        check_targets: false,
        ..Default::default()
    };
    for dtype in [DType::F32, DType::BF16] {
        let d = dtype.name();
        for shape in CE_SHAPES {
            let x = logits(&engine, &shape, dtype).expect("logits");
            let targets: Vec<i32> = (0..shape[0])
                .map(|r| ((r * 7919) % shape[1]) as i32)
                .collect();
            let t = Tensor::from_slice(&engine, &targets, &[shape[0]]).expect("targets");
            let (_, saved) = loss::cross_entropy(&x, &t, &opts).expect("first run");
            let grad_bytes = (shape[0] * shape[1] * 4) as u64;
            time(
                c,
                &engine,
                &format!("cross_entropy_{d}"),
                &shape,
                x.byte_len() + t.byte_len(),
                || loss::cross_entropy(&x, &t, &opts).map(drop),
            );
            time(
                c,
                &engine,
                &format!("cross_entropy_backward_{d}"),
                &shape,
                x.byte_len() + grad_bytes,
                || loss::cross_entropy_backward(&saved, None).map(drop),
            );
            time(
                c,
                &engine,
                &format!("cross_entropy_fwd_bwd_{d}"),
                &shape,
                x.byte_len() + grad_bytes,
                || {
                    let (_, s) = loss::cross_entropy(&x, &t, &opts)?;
                    loss::cross_entropy_backward(&s, None).map(drop)
                },
            );
            // Over a copy of the logits (each run overwrites its input with the gradient),
            // with the outputs of the peers' in-place cross-entropy (no predictions).
            let xc = bench::copy(&x).expect("copy");
            let no_predictions = CrossEntropyOptions {
                predicted: false,
                ..opts.clone()
            };
            time(
                c,
                &engine,
                &format!("cross_entropy_in_place_{d}"),
                &shape,
                2 * x.byte_len(),
                || loss::cross_entropy_in_place(&xc, &t, &no_predictions).map(drop),
            );
        }
        for shape in ROW_SHAPES {
            let x = logits(&engine, &shape, dtype).expect("input");
            let dy = logits(&engine, &shape, dtype).expect("cotangent");
            let grad_bytes = (shape[0] * shape[1] * 4) as u64;
            let (_, s_soft) = loss::softmax(&x).expect("softmax");
            let (_, s_log) = loss::log_softmax(&x).expect("log_softmax");
            let (_, s_sparse) = loss::sparsemax(&x).expect("sparsemax");
            time(
                c,
                &engine,
                &format!("softmax_{d}"),
                &shape,
                2 * x.byte_len(),
                || loss::softmax(&x).map(drop),
            );
            time(
                c,
                &engine,
                &format!("softmax_backward_{d}"),
                &shape,
                x.byte_len() + dy.byte_len() + grad_bytes,
                || loss::softmax_backward(&s_soft, &dy).map(drop),
            );
            time(
                c,
                &engine,
                &format!("log_softmax_{d}"),
                &shape,
                2 * x.byte_len(),
                || loss::log_softmax(&x).map(drop),
            );
            time(
                c,
                &engine,
                &format!("log_softmax_backward_{d}"),
                &shape,
                x.byte_len() + dy.byte_len() + grad_bytes,
                || loss::softmax_backward(&s_log, &dy).map(drop),
            );
            time(
                c,
                &engine,
                &format!("sparsemax_{d}"),
                &shape,
                2 * x.byte_len(),
                || loss::sparsemax(&x).map(drop),
            );
            time(
                c,
                &engine,
                &format!("sparsemax_backward_{d}"),
                &shape,
                x.byte_len() + dy.byte_len() + grad_bytes,
                || loss::sparsemax_backward(&s_sparse, &dy).map(drop),
            );
            let (lx, _) = loss::log_softmax(&x).expect("log-probabilities");
            let (lt, _) = loss::log_softmax(&cast::cast(&dy, dtype).expect("cast"))
                .expect("log-probabilities");
            let (_, s_kl) = loss::kl_div(&lx, &lt, true, DivReduction::BatchMean).expect("kl");
            let (_, s_jsd) = loss::jsd(&lx, &lt, 0.5, None, -100).expect("jsd");
            let (_, s_tvd) = loss::tvd(&x, &x, DivReduction::BatchMean, None, -100).expect("tvd");
            let pair = 2 * x.byte_len();
            time(c, &engine, &format!("kl_div_{d}"), &shape, pair, || {
                loss::kl_div(&lx, &lt, true, DivReduction::BatchMean).map(drop)
            });
            time(
                c,
                &engine,
                &format!("kl_div_backward_{d}"),
                &shape,
                pair + grad_bytes,
                || loss::divergence_backward(&s_kl, None).map(drop),
            );
            time(c, &engine, &format!("jsd_{d}"), &shape, pair, || {
                loss::jsd(&lx, &lt, 0.5, None, -100).map(drop)
            });
            time(
                c,
                &engine,
                &format!("jsd_backward_{d}"),
                &shape,
                pair + grad_bytes,
                || loss::divergence_backward(&s_jsd, None).map(drop),
            );
            time(c, &engine, &format!("tvd_{d}"), &shape, pair, || {
                loss::tvd(&x, &x, DivReduction::BatchMean, None, -100).map(drop)
            });
            time(
                c,
                &engine,
                &format!("tvd_backward_{d}"),
                &shape,
                pair + grad_bytes,
                || loss::divergence_backward(&s_tvd, None).map(drop),
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = losses
}
criterion_main!(benches);
