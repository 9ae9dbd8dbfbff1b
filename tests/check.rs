//! The operator check report (what `make demo` prints) passes on this adapter, and every
//! registered kernel is exercised by some operator check, so no shipped kernel goes unchecked.

mod common;

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

#[test]
fn every_operator_check_passes() {
    let engine = common::engine();
    for op in wgrad::check::operators() {
        let cases = (op.run)(engine).unwrap_or_else(|e| panic!("{}: {e}", op.name));
        assert!(!cases.is_empty(), "{} ran no case", op.name);
        for c in &cases {
            assert!(
                c.comparison.passed,
                "{} {}: {}",
                op.name, c.label, c.comparison
            );
        }
    }
}
