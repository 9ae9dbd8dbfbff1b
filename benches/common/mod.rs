//! Criterion plumbing shared by every bench: one configuration, one engine, and one way to
//! hand criterion GPU time (`iter_custom` over `bench::gpu_time_iters`, so criterion sees the
//! device's timestamps rather than host recording time).
#![allow(dead_code)]

use criterion::{Bencher, Criterion};
use std::time::Duration;
use wgrad::{DType, Engine, Result, Tensor, bench, cast};

/// Short warm-up and measurement, few samples: `cargo bench` stays quick even on lavapipe.
pub fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
}

/// The engine the benches run on, or `None` (with a note) when there is no adapter.
pub fn engine(what: &str) -> Option<Engine> {
    match Engine::new() {
        Ok(e) => {
            eprintln!("engine: {}", e.info());
            Some(e)
        }
        Err(e) => {
            eprintln!("no engine, skipping {what} benches: {e}");
            None
        }
    }
}

/// Measure `run` with GPU timestamps.
pub fn time_gpu(b: &mut Bencher, engine: &Engine, mut run: impl FnMut() -> Result<()>) {
    b.iter_custom(|iters| bench::gpu_time_iters(engine, iters, &mut run).expect("timed run"));
}

/// A `shape` tensor of `dtype` (cast from F32) holding the sawtooth
/// `((i·step + seed) mod 251 − 125) / scale` of the flat index `i`: deterministic, varied and
/// cheap to build at any size.
pub fn sawtooth(
    engine: &Engine,
    shape: &[usize],
    dtype: DType,
    seed: usize,
    step: usize,
    scale: f32,
) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| (((i * step + seed) % 251) as f32 - 125.0) / scale)
        .collect();
    cast::cast(&Tensor::from_slice(engine, &data, shape)?, dtype)
}
