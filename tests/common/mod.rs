//! Shared helpers of the integration tests: one engine per test binary, a deterministic PRNG
//! and builders of tensors of any float dtype from f64 data (the library's own
//! `wgrad::gradcheck` helpers, unwrapped for tests).
//!
//! Each `tests/*.rs` file is its own crate and uses only part of this module.
#![allow(dead_code)]

pub mod cross_entropy;

use std::sync::{Mutex, OnceLock};
use wgrad::gradcheck::{Comparison, Tolerance, compare};
use wgrad::{DType, Engine, Tensor};

pub use wgrad::gradcheck::{Rng, stored_values as stored};

/// The engine shared by every test of one test binary (created on first use).
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let engine = Engine::new().expect("create an engine (no GPU? install mesa-vulkan-drivers)");
        eprintln!("test engine: {}", engine.info());
        engine
    })
}

/// An engine of its own, for tests that watch engine-wide state (memory statistics, the
/// pipeline cache) which the tests running in parallel on the shared engine would disturb.
pub fn private_engine() -> Engine {
    Engine::new().expect("create a private engine")
}

/// An adapter of the backend wgrad takes on this platform (Metal on macOS, Vulkan elsewhere),
/// found the way an app would (one instance for the test binary, kept).
pub fn app_adapter() -> wgpu::Adapter {
    static ADAPTER: OnceLock<(wgpu::Instance, wgpu::Adapter)> = OnceLock::new();
    let (_, adapter) = ADAPTER.get_or_init(|| {
        let backends = if cfg!(target_os = "macos") {
            wgpu::Backends::METAL
        } else {
            wgpu::Backends::VULKAN
        };
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = pollster::block_on(instance.enumerate_adapters(backends))
            .into_iter()
            .next()
            .expect("a Metal or Vulkan adapter (lavapipe without a GPU)");
        (instance, adapter)
    });
    adapter.clone()
}

/// A device made on `adapter` the way an app makes one, for `Engine::from_wgpu`. Devices are
/// made one at a time and a handle of each is kept until the test binary exits: destroying a
/// Vulkan device while other test threads use the GPU deadlocked NVIDIA's driver (see
/// `wgrad::engine`'s shared devices).
pub fn app_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
) -> (wgpu::Device, wgpu::Queue) {
    static KEPT: Mutex<Vec<(wgpu::Device, wgpu::Queue)>> = Mutex::new(Vec::new());
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let (device, queue) = pollster::block_on(adapter.request_device(desc)).expect("request_device");
    kept.push((device.clone(), queue.clone()));
    (device, queue)
}

/// An engine on an app's device made with WebGPU's default limits and no optional features
/// (`Engine::from_wgpu`): 256 invocations a workgroup, 8 storage buffers a stage, 16 KiB of
/// workgroup memory, 128 MiB bindings, no subgroups or timestamps.
pub fn webgpu_default_engine() -> Engine {
    let (device, queue) = app_device(
        &app_adapter(),
        &wgpu::DeviceDescriptor {
            label: Some("WebGPU default limits"),
            required_limits: wgpu::Limits::default(),
            ..Default::default()
        },
    );
    Engine::from_wgpu(device, queue).expect("an engine on the app's device")
}

/// An engine of its own whose storage bindings hold at most `bytes` (`EngineBuilder::
/// binding_limit`): tensors past it run the windowed ops a window at a time.
pub fn capped_engine(bytes: u64) -> Engine {
    Engine::builder()
        .binding_limit(bytes)
        .build()
        .expect("create an engine with capped bindings")
}

/// The values of a float tensor as the bit patterns of their exact f64 widening (bit-for-bit
/// comparisons of runs).
pub fn value_bits(t: &Tensor) -> Vec<u64> {
    t.to_f64().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Each `(name, narrow, wide)`: `narrow` has `wide`'s shape and `dtype`, and its values are bit
/// for bit `wide` cast to `dtype` (a `*_backward_as` gradient against the F32 one).
pub fn assert_cast_of(what: &str, pairs: &[(&str, &Tensor, &Tensor)], dtype: DType) {
    for (name, narrow, wide) in pairs {
        assert_eq!(
            (narrow.shape(), narrow.dtype()),
            (wide.shape(), dtype),
            "{what}: {name}"
        );
        let cast = wgrad::cast::cast(wide, dtype).unwrap();
        assert!(
            value_bits(narrow) == value_bits(&cast),
            "{what}: {dtype:?} {name} is not the F32 value cast"
        );
    }
}

/// `n` f32 values uniform in [-1, 1), determined by `seed`.
pub fn random_f32(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect()
}

/// `n` f64 values uniform in [lo, hi), determined by `seed`.
pub fn random_f64(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    Rng::new(seed).vec(n, lo, hi)
}

/// The value `x` takes once stored as `dtype` (through f32, as a GPU cast of f32 data does).
pub fn round_to(x: f64, dtype: DType) -> f64 {
    stored(&[x], dtype)[0]
}

/// Upload f64 data as a tensor of the float dtype `dtype` (rounded as [`round_to`] does).
pub fn tensor_from_f64(engine: &Engine, data: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    wgrad::gradcheck::tensor_from_f64(engine, data, shape, dtype)
        .expect("upload tensor")
        .0
}

/// The bits of an f32 tensor (for bit-identity checks).
pub fn f32_bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .expect("read f32 tensor")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// A 16-bit value rounded `units` times from an FP32 sum, against the f64 reference rounded to
/// the same dtype: `units` units in the last place, relative, plus the F32 policy's absolute
/// part (for sums that cancel); F32 values: the F32 policy.
pub fn rounded_tolerance(dtype: DType, units: f64) -> Tolerance {
    let f32 = Tolerance::for_dtype(DType::F32);
    let significant = match dtype {
        DType::BF16 => 8,
        DType::F16 => 11,
        _ => return f32,
    };
    let rel = units * 2f64.powi(1 - significant);
    Tolerance {
        rel,
        rel_l2: rel,
        ..f32
    }
}

/// Assert that `got` matches `want` within `tol`; the message names the worst element. Returns
/// the comparison for tests that look further (its worst error, say).
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: Tolerance) -> Comparison {
    let c = compare(got, want, tol);
    assert!(
        c.passed,
        "{what}: {c}; got {:?} want {:?}",
        got.get(c.worst),
        want.get(c.worst)
    );
    c
}

/// Assert that two tensors hold the same values bit for bit, except that a NaN matches any NaN
/// (IEEE arithmetic leaves a NaN's sign and payload open, and two compilations of one formula
/// may propagate different ones). The message counts the mismatches and names the first.
pub fn assert_same_bits(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_f64().expect("read"), want.to_f64().expect("read"));
    assert_eq!(g.len(), w.len(), "{what}: length");
    let differs =
        |i: &usize| g[*i].to_bits() != w[*i].to_bits() && !(g[*i].is_nan() && w[*i].is_nan());
    let bad: Vec<usize> = (0..g.len()).filter(differs).collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{what}: {} of {} differ; first at {i}: got {} want {}",
            bad.len(),
            g.len(),
            g[i],
            w[i]
        );
    }
}

/// Assert that `r` is an error for which `check` holds; the message names `what` and what came
/// back instead.
pub fn expect_err<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, wgrad::Error>,
    check: impl Fn(&wgrad::Error) -> bool,
) {
    match r {
        Err(e) => assert!(check(&e), "{what}: unexpected error {e:?}"),
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
    }
}
