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
