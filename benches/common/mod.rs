//! Criterion plumbing shared by every bench: one configuration, one engine, and one way to
//! hand criterion GPU time (`iter_custom` over `bench::gpu_time_iters`, so criterion sees the
//! device's timestamps rather than host recording time).
#![allow(dead_code)]

use criterion::{Bencher, Criterion};
use std::time::Duration;
use wgrad::{Engine, Result, bench};

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
