//! Criterion benches of the gated delta recurrence (`wgrad::gated_delta`), timed on the GPU
//! with `bench::gpu_time_iters`: the forward alone and forward + backward, F32 and BF16 q/k/v,
//! scalar decay, on shapes small enough for lavapipe (the `bench` example runs the model
//! shapes).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::time::Duration;
use wgrad::gated_delta::{
    DeltaAlgorithm, GatedDeltaOptions, gated_delta_backward, gated_delta_forward,
};
use wgrad::{DType, Engine, Result, Tensor, bench, cast};

/// (B, T, Hk, Hv, K, V).
const SHAPES: [[usize; 6]; 2] = [[1, 256, 2, 4, 64, 64], [1, 64, 2, 2, 128, 128]];

struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    d_out: Tensor,
}

fn filled(engine: &Engine, shape: &[usize], f: impl Fn(usize) -> f32) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len).map(f).collect();
    Tensor::from_slice(engine, &data, shape)
}

fn inputs(engine: &Engine, s: [usize; 6], dtype: DType) -> Result<Inputs> {
    let [b, t, hk, hv, kd, vd] = s;
    // Keys of norm about 1 keep the recurrence bounded.
    let kscale = 1.0 / (kd as f32).sqrt();
    Ok(Inputs {
        q: cast::cast(
            &filled(engine, &[b, t, hk, kd], |i| ((i % 13) as f32 - 6.0) / 8.0)?,
            dtype,
        )?,
        k: cast::cast(
            &filled(engine, &[b, t, hk, kd], |i| {
                if i % 3 == 0 { -kscale } else { kscale }
            })?,
            dtype,
        )?,
        v: cast::cast(
            &filled(engine, &[b, t, hv, vd], |i| ((i % 11) as f32 - 5.0) / 8.0)?,
            dtype,
        )?,
        beta: filled(engine, &[b, t, hv], |_| 0.5)?,
        g: filled(engine, &[b, t, hv], |_| -0.1)?,
        d_out: filled(engine, &[b, t, hv, vd], |i| ((i % 7) as f32 - 3.0) / 4.0)?,
    })
}

fn run(x: &Inputs, backward: bool, algorithm: DeltaAlgorithm) -> Result<()> {
    let (out, saved) = gated_delta_forward(
        &x.q,
        &x.k,
        &x.v,
        &x.beta,
        &x.g,
        None,
        &GatedDeltaOptions {
            algorithm,
            ..GatedDeltaOptions::default()
        },
    )?;
    if backward {
        drop(gated_delta_backward(&saved, Some(&x.d_out), None)?);
    }
    drop(out);
    Ok(())
}

fn gated_delta(c: &mut Criterion) {
    let engine = match Engine::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("no engine, skipping gated_delta benches: {e}");
            return;
        }
    };
    for (name, backward, algorithm) in [
        ("gated_delta_forward", false, DeltaAlgorithm::Recurrent),
        (
            "gated_delta_forward_backward",
            true,
            DeltaAlgorithm::Recurrent,
        ),
        (
            "gated_delta_chunked_forward",
            false,
            DeltaAlgorithm::Chunked,
        ),
        (
            "gated_delta_chunked_forward_backward",
            true,
            DeltaAlgorithm::Chunked,
        ),
    ] {
        let mut group = c.benchmark_group(name);
        for dtype in [DType::F32, DType::BF16] {
            for s in SHAPES {
                let x = inputs(&engine, s, dtype).expect("bench inputs");
                run(&x, backward, algorithm).expect("first run");
                bench::prewarm(&engine, 0.05).expect("prewarm");
                let id = format!(
                    "{dtype} B{} T{} Hk{} Hv{} K{} V{}",
                    s[0], s[1], s[2], s[3], s[4], s[5]
                );
                group.bench_with_input(BenchmarkId::from_parameter(id), &x, |bch, x| {
                    bch.iter_custom(|iters| {
                        bench::gpu_time_iters(&engine, iters, || run(x, backward, algorithm))
                            .expect("timed run")
                    })
                });
            }
        }
        group.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
}

criterion_group! {
    name = benches;
    config = config();
    targets = gated_delta
}
criterion_main!(benches);
