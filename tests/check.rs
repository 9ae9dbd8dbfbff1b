//! The operator check report (what `make demo` prints) passes on this adapter, and every
//! registered kernel is exercised by some operator check, so no shipped kernel goes unchecked.

mod common;

use wgrad::gradcheck::Comparison;
use wgrad::{Engine, ShaderChecks};

#[test]
fn every_registered_kernel_has_an_operator_check() {
    let checks = wgrad::check::operators();
    for kernel in wgrad::kernel::registry() {
        assert!(
            checks.iter().any(|c| c.kernels.contains(&kernel.name)),
            "kernel {} is not covered by any operator check",
            kernel.name
        );
    }
    let mut names: Vec<_> = checks.iter().map(|c| c.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(
        names.len(),
        checks.len(),
        "operator check names must be unique"
    );
}

/// Every operator check passes with the kernels compiled as shipped (`ShaderChecks::Trusted`:
/// no index clamps, loop bounds or division guards), and gives bit for bit the same comparisons
/// with wgpu's run-time guards compiled in. A kernel that read or wrote outside the extents the
/// guards clamp to, on the ragged, tiny and empty shapes the checks use, would differ.
#[test]
fn every_operator_check_passes_and_matches_guarded_kernels() {
    let build = |checks| {
        Engine::builder()
            .shader_checks(checks)
            .build()
            .expect("create an engine")
    };
    let trusted = build(ShaderChecks::Trusted);
    let guarded = build(ShaderChecks::Guarded);
    let key = |c: &Comparison| {
        (
            c.len,
            c.max_abs.to_bits(),
            c.max_rel.to_bits(),
            c.rel_l2.to_bits(),
            c.worst,
            c.violations,
            c.nonfinite_mismatches,
        )
    };
    for op in wgrad::check::operators() {
        let cases = (op.run)(&trusted).unwrap_or_else(|e| panic!("{}: {e}", op.name));
        assert!(!cases.is_empty(), "{} ran no case", op.name);
        for c in &cases {
            assert!(
                c.comparison.passed,
                "{} {}: {}",
                op.name, c.label, c.comparison
            );
        }
        let with_guards = (op.run)(&guarded).unwrap_or_else(|e| panic!("{}: {e}", op.name));
        assert_eq!(cases.len(), with_guards.len(), "{}", op.name);
        for (t, g) in cases.iter().zip(&with_guards) {
            assert_eq!(t.label, g.label, "{}", op.name);
            assert!(
                key(&t.comparison) == key(&g.comparison),
                "{} {}: trusted {} but guarded {}",
                op.name,
                t.label,
                t.comparison,
                g.comparison
            );
        }
    }
}

/// Subgroup sizes the operator checks run with again, in child processes, on lavapipe: its
/// vector width in bits sets them (`LP_NATIVE_VECTOR_WIDTH`: 128 bits give subgroups of 4,
/// 512 of 16; the default on an AVX2 machine is 256, subgroups of 8). Subgroups of 16 are
/// those of many Intel and Arm GPUs; 4 is the smallest wgrad takes (`reduce::subgroup_width`).
/// Lavapipe (Mesa 22.3) past 512 bits reports subgroups of 32 but runs 16 lanes, so 32
/// (NVIDIA, Apple, AMD's wave32) is checked on those devices.
const OTHER_SUBGROUPS: [(&str, u32); 2] = [("128", 4), ("512", 16)];

/// Set in the child processes: the subgroup size the child's adapter must report.
const CHILD_SUBGROUP: &str = "WGRAD_TEST_SUBGROUP_SIZE";

/// The register rows' subgroup reductions at other widths than the adapter's own: where the
/// adapter is lavapipe, every operator check passes again with subgroups of 4 and of 16 lanes
/// (each run by `operator_checks_pass_at_the_set_subgroup_size` in a child process of this
/// test binary, with lavapipe's vector width set). Elsewhere it says so and checks nothing.
#[test]
fn operator_checks_pass_with_other_subgroup_sizes() {
    let info = common::engine().info();
    if !info.adapter.starts_with("llvmpipe") || std::env::var_os(CHILD_SUBGROUP).is_some() {
        eprintln!(
            "not lavapipe ({}): other subgroup sizes not checked",
            info.adapter
        );
        return;
    }
    let exe = std::env::current_exe().expect("this test binary");
    for (bits, size) in OTHER_SUBGROUPS {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "operator_checks_pass_at_the_set_subgroup_size",
                "--include-ignored",
                "--test-threads=1",
            ])
            .env("LP_NATIVE_VECTOR_WIDTH", bits)
            .env(CHILD_SUBGROUP, size.to_string())
            .output()
            .expect("run this test binary again");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "subgroups of {size} ({bits}-bit lavapipe): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Run by `operator_checks_pass_with_other_subgroup_sizes` with `WGRAD_TEST_SUBGROUP_SIZE`
/// set: the adapter reports that subgroup size, and every operator check passes.
// Ignored in a plain run: without the variable set by its parent it would check nothing; its
// parent, which runs in every `cargo test` on lavapipe, runs it with the variable set.
#[test]
#[ignore = "run in a child process by operator_checks_pass_with_other_subgroup_sizes"]
fn operator_checks_pass_at_the_set_subgroup_size() {
    let Some(size) = std::env::var(CHILD_SUBGROUP).ok() else {
        eprintln!("{CHILD_SUBGROUP} not set: nothing to check");
        return;
    };
    let engine = Engine::builder().build().expect("create an engine");
    let info = engine.info();
    let sizes = (info.subgroup_min_size, info.subgroup_max_size);
    assert_eq!(
        (sizes.0.to_string(), sizes.1.to_string()),
        (size.clone(), size.clone()),
        "subgroup sizes of {info}"
    );
    assert_operator_checks_pass(&engine, &format!("subgroups of {size}"), |_, _| false);
}

/// Every operator check passes on `engine` (`tag` names the configuration in failures), but
/// for the ops whose run fails with an error `refused` accepts (and asserts on).
fn assert_operator_checks_pass(
    engine: &Engine,
    tag: &str,
    refused: impl Fn(&str, &wgrad::Error) -> bool,
) {
    for op in wgrad::check::operators() {
        let cases = match (op.run)(engine) {
            Err(e) if refused(op.name, &e) => continue,
            other => other.unwrap_or_else(|e| panic!("{tag}: {}: {e}", op.name)),
        };
        assert!(!cases.is_empty(), "{tag}: {} ran no case", op.name);
        for c in &cases {
            assert!(
                c.comparison.passed,
                "{tag}: {} {}: {}",
                op.name, c.label, c.comparison
            );
        }
    }
}

/// Every operator check on an app's device made with WebGPU's default limits and no optional
/// features (`Engine::from_wgpu`): 256 invocations a workgroup, 8 storage buffers a stage,
/// 128 MiB bindings, 16 KiB of workgroup memory, no subgroups, no timestamps, no F16 shader
/// type: the least a device can offer wgrad. Each family must take the paths such a device
/// allows (the 256-lane modules, the workgroup trees, windows of rows past 128 MiB) or refuse
/// with a typed error, and give results within the checks' tolerances.
#[test]
fn operator_checks_pass_on_a_device_with_webgpu_default_limits() {
    let engine = common::webgpu_default_engine();
    let info = engine.info();
    assert_eq!(info.limits.max_compute_invocations_per_workgroup, 256);
    assert!(info.features.is_empty(), "{:?}", info.features);
    // The ops whose kernels bind more than eight storage buffers refuse such a device with the
    // limit's typed error; attention (and the transformer step built on it) takes its compact
    // 16 KiB layout and passes, its stored-score schedule recomputing instead.
    let more_buffers = ["gated_delta"];
    assert_operator_checks_pass(&engine, "default limits", |op, e| match e {
        wgrad::Error::InsufficientLimit { name, got, .. } if more_buffers.contains(&op) => {
            assert_eq!((*name, *got), ("max_storage_buffers_per_shader_stage", 8));
            true
        }
        _ => false,
    });
}

/// Every kernel entry point fits the least device wgrad takes, but those whose ops check the
/// device's limit first and refuse a smaller one: at most `MIN_STORAGE_BUFFERS_PER_STAGE` (8)
/// storage buffers, counting every binding its call graph names (`InsufficientLimit`
/// otherwise: the gated delta recurrence, the fused GRPO head's chunk kernel, attention's
/// stored-score backward), and at most WebGPU's default 16 KiB of workgroup memory with the
/// override constants' defaults (the tensor-core products: `MissingFeature` without 44 KiB),
/// attention's with its compact layout (the one it takes on such a device).
#[test]
fn entry_points_fit_the_least_device() {
    let more_buffers = [
        ("gated_delta", "forward"),
        ("gated_delta", "backward"),
        ("gated_delta", "chunk_grads"),
        ("gated_delta_subgroup", "forward"),
        ("gated_delta_subgroup", "backward"),
        ("gated_delta_subgroup", "chunk_grads"),
        ("attention", "attention_dkdv_store"),
    ];
    let more_workgroup_memory = ["matmul_tc"];
    for kernel in wgrad::kernel::registry() {
        let (module, info) = kernel.module().expect("a valid module");
        for (i, entry) in module.entry_points.iter().enumerate() {
            let what = format!("{}.{}", kernel.name, entry.name);
            let uses = info.get_entry_point(i);
            let storage: Vec<&str> = module
                .global_variables
                .iter()
                .filter(|(h, g)| {
                    matches!(g.space, naga::AddressSpace::Storage { .. }) && !uses[*h].is_empty()
                })
                .map(|(_, g)| g.name.as_deref().unwrap_or("?"))
                .collect();
            let limit = if more_buffers.contains(&(kernel.name, entry.name.as_str())) {
                14
            } else {
                wgrad::engine::MIN_STORAGE_BUFFERS_PER_STAGE as usize
            };
            assert!(
                storage.len() <= limit,
                "{what} binds {} storage buffers: {storage:?}",
                storage.len()
            );
            // Workgroup arrays sized by override constants: their defaults, attention's compact
            // layout.
            let mut constants = naga::back::PipelineConstants::default();
            if kernel.name == "attention" {
                constants.insert("PADDED".into(), 0.0);
                constants.insert("P_COLS".into(), 32.0);
            }
            let (m, mi) = naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some((entry.stage, entry.name.as_str())),
                &constants,
            )
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let at = m.entry_points.iter().position(|e| e.name == entry.name);
            let uses = mi.get_entry_point(at.expect("the entry point"));
            let bytes: u32 = m
                .global_variables
                .iter()
                .filter(|(h, g)| g.space == naga::AddressSpace::WorkGroup && !uses[*h].is_empty())
                .map(|(_, g)| m.types[g.ty].inner.size(m.to_ctx()))
                .sum();
            if !more_workgroup_memory.contains(&kernel.name) {
                assert!(
                    bytes <= 16 << 10,
                    "{what} takes {bytes} bytes of workgroup memory"
                );
            }
        }
    }
}
