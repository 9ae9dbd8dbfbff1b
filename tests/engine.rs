//! The engine: construction and info, the pipeline cache, embedding through `from_wgpu`,
//! limit checks, memory accounting, sharing across threads, GPU timing, folded launches and
//! engine-mismatch checks.

mod common;

use common::{app_adapter, engine, private_engine, random_f32, random_f64};
use wgrad::reference;
use wgrad::{DType, Engine, Error, MathMode, Tensor, TimingSource, reduce};

#[test]
fn engine_builds_and_reports_info() {
    let e = engine();
    let info = e.info();
    assert!(!info.adapter.is_empty(), "adapter name is empty");
    assert_eq!(info.math_mode, MathMode::Strict, "default math mode");
    // Only features wgrad asks for are enabled.
    assert!(wgrad::engine::WANTED_FEATURES.contains(info.features));
    assert!(
        info.limits.max_compute_invocations_per_workgroup
            >= wgrad::engine::MIN_INVOCATIONS_PER_WORKGROUP
    );
    assert!(
        info.limits.max_storage_buffers_per_shader_stage
            >= wgrad::engine::MIN_STORAGE_BUFFERS_PER_STAGE
    );
    assert_eq!(
        e.max_binding_bytes(),
        info.limits.max_storage_buffer_binding_size
    );
    assert_eq!(e.max_tensor_bytes(), info.limits.max_buffer_size);
    assert!(e.binding_alignment().is_power_of_two());
    // Strict MSL is used on Metal + Strict only.
    assert_eq!(info.strict_msl, info.backend == wgpu::Backend::Metal);
    let text = info.to_string();
    assert!(text.contains(&info.adapter), "{text}");
    assert!(text.contains("Strict"), "{text}");
    assert_eq!(e.device().limits(), info.limits);
    if info.device_type == wgpu::DeviceType::Cpu {
        // The software Vulkan driver (lavapipe) this suite is run on in CI.
        assert_eq!(info.backend, wgpu::Backend::Vulkan);
        assert!(
            info.features.contains(wgpu::Features::TIMESTAMP_QUERY),
            "lavapipe has TIMESTAMP_QUERY: {:?}",
            info.features
        );
    }
}

#[test]
fn builder_sets_math_mode_and_rejects_unknown_adapter() {
    let relaxed = Engine::builder()
        .math_mode(MathMode::Relaxed)
        .build()
        .unwrap();
    assert_eq!(relaxed.info().math_mode, MathMode::Relaxed);
    assert!(!relaxed.info().strict_msl);
    let data = random_f64(11, 2 * 5, -1.0, 1.0);
    let x = common::tensor_from_f64(&relaxed, &data, &[2, 5], DType::F32);
    let want = reference::reduce::sum_rows(&common::stored(&data, DType::F32), 2, 5);
    let got = reduce::sum_rows(&x).unwrap().to_f64().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5, "{got:?} vs {want:?}");
    }
    match Engine::builder()
        .adapter_name("no adapter is called this 7f3a")
        .build()
    {
        Err(Error::NoAdapter(_)) => {}
        other => panic!("expected NoAdapter, got {other:?}"),
    }
}

#[test]
fn pipeline_cache_compiles_once() {
    // A private engine: the shared one compiles pipelines for the tests running in parallel.
    let e = private_engine();
    assert_eq!(e.cached_pipelines(), 0);
    let x = Tensor::from_slice(&e, &random_f32(1, 3 * 5), &[3, 5]).unwrap();
    let first = reduce::sum_rows(&x).unwrap().to_vec::<f32>().unwrap();
    let after_first = e.cached_pipelines();
    assert_eq!(after_first, 1, "one pipeline for row_sum");
    for _ in 0..3 {
        let again = reduce::sum_rows(&x).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(again, first);
    }
    assert_eq!(
        e.cached_pipelines(),
        after_first,
        "the cache grew on reruns"
    );
    // Another entry point, another pipeline; the same pair of dtypes again, no new one.
    reduce::max_rows(&x).unwrap();
    assert_eq!(e.cached_pipelines(), after_first + 1);
    reduce::max_rows(&x).unwrap();
    assert_eq!(e.cached_pipelines(), after_first + 1);
    // Other specialization constants (the input dtype) are another pipeline.
    let h = wgrad::cast::cast(&x, DType::F16).unwrap();
    let with_cast = e.cached_pipelines();
    assert_eq!(with_cast, after_first + 2);
    reduce::sum_rows(&h).unwrap();
    assert_eq!(e.cached_pipelines(), with_cast + 1);
    reduce::sum_rows(&h).unwrap();
    wgrad::cast::cast(&x, DType::F16).unwrap();
    assert_eq!(e.cached_pipelines(), with_cast + 1);
    // `prepare` compiles without running, and fills the same cache.
    let before = e.cached_pipelines();
    e.prepare(&reduce::KERNEL, "row_sum", &vec![("DT", 2.0)])
        .unwrap();
    assert_eq!(e.cached_pipelines(), before + 1);
    e.prepare(&reduce::KERNEL, "row_sum", &vec![("DT", 2.0)])
        .unwrap();
    assert_eq!(e.cached_pipelines(), before + 1);
    match e.prepare(&reduce::KERNEL, "no_such_entry", &vec![]) {
        Err(Error::Kernel { kernel, .. }) => assert_eq!(kernel, "reduce"),
        other => panic!("expected Error::Kernel, got {other:?}"),
    }
    assert_eq!(e.cached_pipelines(), before + 1);
}

#[test]
fn built_spirv_lists_what_the_driver_was_given() {
    // The strict SPIR-V of each built pipeline (Vulkan's default), sorted, one per pipeline;
    // nothing on engines that hand WGSL or MSL to wgpu.
    let e = private_engine();
    assert!(e.built_spirv().unwrap().is_empty());
    let x = Tensor::from_slice(&e, &random_f32(2, 4 * 6), &[4, 6]).unwrap();
    reduce::sum_rows(&x).unwrap();
    reduce::max_rows(&x).unwrap();
    let built = e.built_spirv().unwrap();
    if !e.info().strict_spirv {
        assert!(
            built.is_empty(),
            "{} entries without strict SPIR-V",
            built.len()
        );
        return;
    }
    assert_eq!(built.len(), e.cached_pipelines());
    // Made again from the kernels on each call: the same words every time.
    let again = e.built_spirv().unwrap();
    assert!(built.iter().zip(&again).all(|(a, b)| a.words == b.words));
    let entries: Vec<(&str, &str)> = built.iter().map(|b| (b.kernel, b.entry.as_str())).collect();
    assert_eq!(entries, [("reduce", "row_max"), ("reduce", "row_sum")]);
    for b in &built {
        assert_eq!(
            b.words.first(),
            Some(&0x0723_0203),
            "{}: not SPIR-V",
            b.entry
        );
        assert!(
            b.constants.contains("DT"),
            "{}: constants {}",
            b.entry,
            b.constants
        );
        assert!(!b.entry_name.is_empty());
        // A uniform block of parameters and at least one storage buffer.
        assert!(b.bindings.contains(&wgpu::BufferBindingType::Uniform));
        assert!(
            b.bindings
                .iter()
                .any(|t| matches!(t, wgpu::BufferBindingType::Storage { .. }))
        );
    }
}

/// A device of `adapter` with `limits`, as an app makes it.
fn app_device(adapter: &wgpu::Adapter, limits: wgpu::Limits) -> (wgpu::Device, wgpu::Queue) {
    common::app_device(
        adapter,
        &wgpu::DeviceDescriptor {
            label: Some("app device"),
            required_limits: limits,
            ..Default::default()
        },
    )
}

#[test]
fn from_wgpu_runs_ops_on_an_app_device() {
    let adapter = app_adapter();
    let (device, queue) = app_device(&adapter, wgpu::Limits::default());
    let e = Engine::from_wgpu(device, queue).unwrap();
    assert_eq!(e.info().adapter, adapter.get_info().name);
    assert_eq!(e.info().backend, adapter.get_info().backend);
    assert_eq!(e.info().math_mode, MathMode::Strict);
    // No features were requested, so none is reported.
    assert!(e.info().features.is_empty(), "{:?}", e.info().features);
    let (rows, cols) = (5, 9);
    let data = random_f64(2, rows * cols, -1.0, 1.0);
    let x = common::tensor_from_f64(&e, &data, &[rows, cols], DType::F32);
    let stored = common::stored(&data, DType::F32);
    let got = reduce::sum_columns(&x).unwrap().to_f64().unwrap();
    let want = reference::reduce::sum_columns(&stored, rows, cols);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5, "{got:?} vs {want:?}");
    }
    // 16-bit storage works without SHADER_F16 (kernels address it as u32 words).
    let h = wgrad::cast::cast(&x, DType::BF16).unwrap();
    let back: Vec<f64> = h.to_f64().unwrap();
    assert_eq!(back, common::stored(&data, DType::BF16));
    assert!(!e.same(engine()));
    // Without TIMESTAMP_QUERY, timing falls back to the wall clock.
    let (r, timing) = e.time(|| reduce::sum_rows(&x)).unwrap();
    r.unwrap();
    assert_eq!(timing.source, TimingSource::WallClock);
    assert!(timing.seconds > 0.0);
}

/// A limit's name, how to lower it, the lowered value and the least wgrad needs.
type LimitCheck = (&'static str, fn(&mut wgpu::Limits), u64, u64);

#[test]
fn from_wgpu_rejects_low_limits() {
    let adapter = app_adapter();
    // Downlevel limits with fewer invocations per workgroup than wgrad launches.
    let mut low = wgpu::Limits::downlevel_defaults();
    low.max_compute_invocations_per_workgroup = 128;
    let (device, queue) = app_device(&adapter, low);
    match Engine::from_wgpu(device, queue) {
        Err(Error::InsufficientLimit { got, needed, .. }) => assert!(got < needed),
        other => panic!("expected InsufficientLimit, got {other:?}"),
    }
    // Each checked limit is named, with the device's value and the one needed.
    let checks: [LimitCheck; 3] = [
        (
            "max_compute_invocations_per_workgroup",
            |l| l.max_compute_invocations_per_workgroup = 128,
            128,
            u64::from(wgrad::engine::MIN_INVOCATIONS_PER_WORKGROUP),
        ),
        (
            "max_storage_buffers_per_shader_stage",
            |l| l.max_storage_buffers_per_shader_stage = 4,
            4,
            u64::from(wgrad::engine::MIN_STORAGE_BUFFERS_PER_STAGE),
        ),
        (
            "max_compute_workgroup_size_x",
            |l| l.max_compute_workgroup_size_x = 64,
            64,
            u64::from(wgrad::engine::MIN_INVOCATIONS_PER_WORKGROUP),
        ),
    ];
    for (want_name, lower, want_got, want_needed) in checks {
        let mut limits = wgpu::Limits::default();
        lower(&mut limits);
        let (device, queue) = app_device(&adapter, limits);
        match Engine::from_wgpu(device, queue) {
            Err(Error::InsufficientLimit { name, got, needed }) => {
                assert_eq!((name, got, needed), (want_name, want_got, want_needed));
            }
            other => panic!("{want_name}: expected InsufficientLimit, got {other:?}"),
        }
    }
}

#[test]
fn live_bytes_return_to_baseline() {
    let e = private_engine();
    let base = e.memory();
    assert_eq!(base.live_bytes, 0);
    let a = Tensor::from_slice(&e, &random_f32(3, 1000), &[10, 100]).unwrap();
    let b = Tensor::zeros(&e, &[3000], DType::BF16).unwrap();
    let s = reduce::sum_rows(&a).unwrap();
    let live = e.memory().live_bytes;
    let needed = a.byte_len() + b.byte_len() + s.byte_len();
    assert!(
        live >= needed,
        "live {live} < bytes of the live tensors {needed}"
    );
    // Buffers come in size classes of at most 12.5% slack (or 256-byte steps when small).
    assert!(live <= needed + needed / 8 + 3 * 256, "live {live}");
    // A clone or a reshape shares the buffer: no new bytes.
    let a2 = a.clone();
    let a3 = a.reshape(&[1000]).unwrap();
    assert_eq!(e.memory().live_bytes, live);
    drop((a, a2, a3, b, s));
    let after = e.memory();
    assert_eq!(after.live_bytes, base.live_bytes);
    assert!(after.peak_bytes >= live);
    // Freed buffers are pooled, and the pool is emptied by `trim`.
    assert!(after.pooled_bytes >= needed);
    e.trim();
    assert_eq!(e.memory().pooled_bytes, 0);
    assert_eq!(e.memory().live_bytes, base.live_bytes);
}

#[test]
fn op_loop_does_not_grow_memory() {
    let e = private_engine();
    let x = Tensor::from_slice(&e, &random_f32(4, 4 * 3), &[4, 3]).unwrap();
    let want = reduce::sum_rows(&x).unwrap().to_vec::<f32>().unwrap();
    e.synchronize().unwrap();
    let before = e.memory();
    for _ in 0..1000 {
        let r = reduce::sum_rows(&x).unwrap();
        drop(r);
    }
    e.synchronize().unwrap();
    let after = e.memory();
    assert_eq!(
        after.live_bytes, before.live_bytes,
        "live bytes grew over 1000 op calls"
    );
    assert_eq!(
        after.pooled_bytes, before.pooled_bytes,
        "the pool grew over 1000 op calls (buffers not reused)"
    );
    assert_eq!(after.peak_bytes, before.peak_bytes);
    // The engine still computes after the loop.
    assert_eq!(reduce::sum_rows(&x).unwrap().to_vec::<f32>().unwrap(), want);
}

#[test]
fn reset_peak_works() {
    let e = private_engine();
    let small = Tensor::zeros(&e, &[16], DType::F32).unwrap();
    let live_small = e.memory().live_bytes;
    let big = Tensor::zeros(&e, &[1 << 16], DType::F32).unwrap();
    let live_both = e.memory().live_bytes;
    assert!(live_both >= live_small + big.byte_len());
    assert_eq!(e.memory().peak_bytes, live_both);
    drop(big);
    let m = e.memory();
    assert_eq!(m.live_bytes, live_small);
    assert_eq!(m.peak_bytes, live_both, "peak forgot the big tensor");
    e.reset_peak();
    let m = e.memory();
    assert_eq!(m.peak_bytes, m.live_bytes);
    assert_eq!(m.peak_bytes, live_small);
    // A new allocation raises the peak from the reset point only.
    let other = Tensor::zeros(&e, &[100], DType::F32).unwrap();
    let m = e.memory();
    assert_eq!(m.peak_bytes, m.live_bytes);
    assert!(m.peak_bytes < live_both);
    drop((small, other));
}

#[test]
fn engine_shared_by_threads() {
    let e = engine().clone();
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..40u64 {
                    let (rows, cols) = (1 + t as usize, 1 + 3 * i as usize);
                    let data = random_f64(100 * t + i, rows * cols, -2.0, 2.0);
                    let x = common::tensor_from_f64(&e, &data, &[rows, cols], DType::F32);
                    let stored = common::stored(&data, DType::F32);
                    let sums = reduce::sum_rows(&x).unwrap().to_f64().unwrap();
                    let maxima = reduce::max_rows(&x).unwrap().to_f64().unwrap();
                    let want_sums = reference::reduce::sum_rows(&stored, rows, cols);
                    let want_max = reference::reduce::max_rows(&stored, rows, cols);
                    assert_eq!(maxima, want_max, "thread {t} iteration {i}");
                    for (g, w) in sums.iter().zip(&want_sums) {
                        assert!((g - w).abs() <= 1e-4, "thread {t}: {g} vs {w}");
                    }
                    let h = wgrad::cast::cast(&x, DType::F16).unwrap();
                    assert_eq!(h.to_f64().unwrap(), common::stored(&data, DType::F16));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread panicked");
    }
}

#[test]
fn time_reports_gpu_time() {
    let e = private_engine();
    let x = Tensor::from_slice(&e, &random_f32(5, 64 * 1000), &[64, 1000]).unwrap();
    let (r, timing) = e
        .time(|| {
            let a = reduce::sum_rows(&x).unwrap();
            let b = reduce::sum_columns(&x).unwrap();
            // A clear ends the open pass; the next dispatch begins another.
            let z = Tensor::zeros(&e, &[4], wgrad::DType::F32).unwrap();
            let c = reduce::sum_rows(&z.reshape(&[2, 2]).unwrap()).unwrap();
            (a, b, c)
        })
        .unwrap();
    if e.info().features.contains(wgpu::Features::TIMESTAMP_QUERY) {
        assert_eq!(timing.source, TimingSource::Gpu);
        // sum_rows and sum_columns's two dispatches share one pass; the clear starts a second.
        assert_eq!(timing.passes, 2);
        assert_eq!(timing.stamped, 2);
    } else {
        assert_eq!(timing.source, TimingSource::WallClock);
    }
    assert!(timing.seconds > 0.0 && timing.seconds < 60.0, "{timing:?}");
    assert_eq!(r.0.shape(), &[64]);
    assert_eq!(r.1.shape(), &[1000]);
    assert_eq!(r.2.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    // Nothing recorded: zero passes, zero seconds.
    let ((), empty) = e.time(|| ()).unwrap();
    assert_eq!(empty.passes, 0);
    assert_eq!(empty.seconds, 0.0);
    // One section at a time: a nested call is refused, the outer one still measures.
    let (inner, outer) = e
        .time(|| {
            let s = reduce::sum_rows(&x).unwrap();
            (e.time(|| ()).map(|_| ()), s)
        })
        .unwrap();
    match inner.0 {
        Err(Error::TimingInProgress) => {}
        other => panic!("nested time: expected TimingInProgress, got {other:?}"),
    }
    assert_eq!(outer.passes, 1);
    // After the sections, timing works again.
    let (_, again) = e.time(|| reduce::sum_rows(&x).unwrap()).unwrap();
    assert_eq!(again.passes, 1);
}

/// `Engine::profile`: every launch counted under its kernel and entry, in the order of first
/// launch, with finite GPU seconds; the same results as without it; more launches than one
/// query set holds; nothing recorded gives nothing; one timed or profiled section at a time.
#[test]
fn profile_counts_every_launch_by_kernel_entry() {
    let e = private_engine();
    let x = Tensor::from_slice(&e, &random_f32(6, 64 * 1000), &[64, 1000]).unwrap();
    if !e.info().features.contains(wgpu::Features::TIMESTAMP_QUERY) {
        assert!(matches!(
            e.profile(|| ()),
            Err(Error::MissingFeature { .. })
        ));
        return;
    }
    let (_, rows) = e.profile(|| reduce::sum_rows(&x).unwrap()).unwrap();
    let (_, columns) = e.profile(|| reduce::sum_columns(&x).unwrap()).unwrap();
    assert!(!rows.is_empty() && !columns.is_empty());
    let launches = |t: &[wgrad::KernelTime]| t.iter().map(|k| k.launches).sum::<u32>();
    let ((a, b, c), both) = e
        .profile(|| {
            (
                reduce::sum_rows(&x).unwrap(),
                reduce::sum_columns(&x).unwrap(),
                reduce::sum_rows(&x).unwrap(),
            )
        })
        .unwrap();
    assert_eq!(launches(&both), 2 * launches(&rows) + launches(&columns));
    assert_eq!(
        (both[0].kernel, &both[0].entry),
        (rows[0].kernel, &rows[0].entry)
    );
    for (i, t) in both.iter().enumerate() {
        assert!(t.seconds.is_finite() && t.seconds >= 0.0, "{t:?}");
        assert!(
            both[..i]
                .iter()
                .all(|u| (u.kernel, &u.entry) != (t.kernel, &t.entry)),
            "{t:?} listed twice"
        );
    }
    let plain = reduce::sum_rows(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), plain);
    assert_eq!(c.to_vec::<f32>().unwrap(), plain);
    assert_eq!(
        b.to_vec::<f32>().unwrap(),
        reduce::sum_columns(&x).unwrap().to_vec::<f32>().unwrap()
    );
    // More launches than one query set stamps (2,048 a set).
    let small = Tensor::from_slice(&e, &[1.0f32, 2.0], &[1, 2]).unwrap();
    let (_, one) = e.profile(|| reduce::sum_rows(&small).unwrap()).unwrap();
    let n = 2100;
    let (_, many) = e
        .profile(|| {
            for _ in 0..n {
                reduce::sum_rows(&small).unwrap();
            }
        })
        .unwrap();
    assert_eq!(launches(&many), n * launches(&one));
    assert!(
        many.iter()
            .all(|t| t.seconds.is_finite() && t.seconds >= 0.0)
    );
    // Nothing recorded.
    let ((), none) = e.profile(|| ()).unwrap();
    assert!(none.is_empty());
    // One section at a time, either way.
    let (inner, _) = e.profile(|| e.time(|| ()).map(|_| ())).unwrap();
    assert!(matches!(inner, Err(Error::TimingInProgress)), "{inner:?}");
    let (inner, _) = e.time(|| e.profile(|| ()).map(|_| ())).unwrap();
    assert!(matches!(inner, Err(Error::TimingInProgress)), "{inner:?}");
    let (inner, _) = e.profile(|| e.profile(|| ()).map(|_| ())).unwrap();
    assert!(matches!(inner, Err(Error::TimingInProgress)), "{inner:?}");
}

#[test]
fn time_stamps_at_most_the_query_set_capacity() {
    let e = private_engine();
    let x = Tensor::from_slice(&e, &[1.0f32, 2.0], &[1, 2]).unwrap();
    let capacity = wgpu::QUERY_SET_MAX_QUERIES - 1;
    let n = capacity + 5;
    let (last, timing) = e
        .time(|| {
            let mut last = None;
            for _ in 0..n {
                // The clear ends the open pass, so every dispatch gets a pass of its own.
                drop(Tensor::zeros(&e, &[1], wgrad::DType::F32).unwrap());
                last = Some(reduce::sum_rows(&x).unwrap());
            }
            last.unwrap()
        })
        .unwrap();
    if timing.source == TimingSource::Gpu {
        assert_eq!(timing.passes, n);
        assert_eq!(timing.stamped, capacity);
        assert!(timing.seconds > 0.0, "{timing:?}");
    }
    let want = reference::reduce::sum_rows(&x.to_f64().unwrap(), 1, 2);
    assert_eq!(last.to_f64().unwrap(), want);
}

#[test]
fn launches_fold_past_65535_workgroups() {
    let e = engine();
    let rows = 70_000;
    assert!(rows as u32 > e.info().limits.max_compute_workgroups_per_dimension);
    let data = random_f64(6, rows, -100.0, 100.0);
    let x = common::tensor_from_f64(e, &data, &[rows, 1], DType::F32);
    let stored = common::stored(&data, DType::F32);
    // One workgroup per row: 70,000 workgroups, every row written exactly (one element).
    let sums = reduce::sum_rows(&x).unwrap().to_f64().unwrap();
    assert_eq!(sums, reference::reduce::sum_rows(&stored, rows, 1));
    let maxima = reduce::max_rows(&x).unwrap().to_f64().unwrap();
    assert_eq!(maxima, reference::reduce::max_rows(&stored, rows, 1));
}

#[test]
fn tensors_of_another_engine_are_rejected() {
    let other = private_engine();
    let t = Tensor::zeros(&other, &[2, 3], DType::F32).unwrap();
    assert!(!t.engine().same(engine()));
    assert!(t.engine().same(&other));
    match reduce::sum_partials(engine(), &t) {
        Err(Error::EngineMismatch { .. }) => {}
        other => panic!("expected EngineMismatch, got {other:?}"),
    }
    // On its own engine the same call works.
    assert_eq!(
        reduce::sum_partials(&other, &t)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![0.0; 3]
    );
}

/// `from_wgpu_adapter`: the engine takes the adapter's cooperative-matrix configurations when
/// the app's device has `EXPERIMENTAL_COOPERATIVE_MATRIX` (then `matmul::tensor_cores` can
/// hold), none otherwise; `from_wgpu` never has them. Where the adapter offers the feature,
/// the device is asked for it as an app would.
#[test]
fn from_wgpu_adapter_knows_the_cooperative_matrices() {
    let adapter = app_adapter();
    let (device, queue) = app_device(&adapter, wgpu::Limits::default());
    let e = Engine::from_wgpu_adapter(&adapter, device, queue).unwrap();
    assert_eq!(e.info().adapter, adapter.get_info().name);
    assert!(e.info().cooperative_matrices.is_empty());
    assert!(!wgrad::matmul::tensor_cores(&e));
    let coop = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    if !adapter.features().contains(coop) {
        eprintln!("{}: no cooperative matrices", adapter.get_info().name);
        return;
    }
    let wanted = coop | (adapter.features() & wgrad::engine::WANTED_FEATURES);
    let request = |_| {
        common::app_device(
            &adapter,
            &wgpu::DeviceDescriptor {
                label: Some("app device with cooperative matrices"),
                required_features: wanted,
                required_limits: adapter.limits(),
                // SAFETY: the test only asks the engine for its configurations and products.
                experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
                ..Default::default()
            },
        )
    };
    let (device, queue) = request(());
    let e = Engine::from_wgpu_adapter(&adapter, device, queue).unwrap();
    assert_eq!(
        e.info().cooperative_matrices,
        adapter.cooperative_matrix_properties()
    );
    let (device, queue) = request(());
    let plain = Engine::from_wgpu(device, queue).unwrap();
    assert!(plain.info().cooperative_matrices.is_empty());
    assert!(!wgrad::matmul::tensor_cores(&plain));
}

/// Engines built for one adapter share its device (made once, never destroyed: see
/// `wgrad::engine`), each with its own pool, statistics and pipeline cache; dropping one leaves
/// the others working, and a new one gets the same device.
#[test]
fn built_engines_share_their_adapters_device() {
    let a = private_engine();
    let b = Engine::builder()
        .math_mode(MathMode::Relaxed)
        .binding_limit(1 << 16)
        .build()
        .unwrap();
    assert!(!a.same(&b));
    assert!(a.device() == b.device() && a.device() == engine().device());
    let x = Tensor::from_slice(&b, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let (a0, b0) = (a.memory(), b.memory());
    let y = Tensor::from_slice(&a, &[0.5f32; 6], &[3, 2]).unwrap();
    assert!(a.memory().live_bytes > a0.live_bytes);
    assert_eq!(
        b.memory(),
        b0,
        "another engine's tensor counts on its own engine only"
    );
    drop(y);
    drop(a);
    assert_eq!(
        reduce::sum_rows(&x).unwrap().to_vec::<f32>().unwrap(),
        vec![3.0, 7.0]
    );
    let c = private_engine();
    assert!(c.device() == b.device());
    let z = Tensor::from_slice(&c, &[2.0f32; 3], &[1, 3]).unwrap();
    assert_eq!(
        reduce::sum_rows(&z).unwrap().to_vec::<f32>().unwrap(),
        vec![6.0]
    );
}
