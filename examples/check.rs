//! The gradient-check report for every operator on this machine's adapter:
//! `cargo run --release --example check`. One line per operator with PASS/FAIL and the worst
//! measured errors; exit code 1 when any check fails. Pass operator names (separate arguments
//! or comma-separated) to run a subset; an unknown name is an error (exit code 2, the known
//! names listed) before anything runs.

use std::process::ExitCode;
use wgrad::Engine;

fn main() -> ExitCode {
    let engine = match Engine::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("no engine: {e}");
            return ExitCode::from(2);
        }
    };
    println!("adapter: {}", engine.info());
    let only: Vec<String> = std::env::args()
        .skip(1)
        .flat_map(|a| a.split(',').map(str::to_string).collect::<Vec<_>>())
        .filter(|n| !n.is_empty())
        .collect();
    let operators = wgrad::check::operators();
    let known: Vec<&str> = operators.iter().map(|op| op.name).collect();
    let unknown: Vec<&str> = only
        .iter()
        .map(String::as_str)
        .filter(|n| !known.contains(n))
        .collect();
    if !unknown.is_empty() {
        eprintln!(
            "unknown operator {}; known: {}",
            unknown.join(", "),
            known.join(", ")
        );
        return ExitCode::from(2);
    }
    let mut failed = 0;
    let mut ran = 0;
    for op in operators {
        if !only.is_empty() && !only.iter().any(|n| n == op.name) {
            continue;
        }
        ran += 1;
        match (op.run)(&engine) {
            Ok(cases) => {
                let bad: Vec<_> = cases.iter().filter(|c| !c.comparison.passed).collect();
                let worst = |f: fn(&wgrad::gradcheck::Comparison) -> f64| {
                    cases.iter().map(|c| f(&c.comparison)).fold(0.0, f64::max)
                };
                println!(
                    "{:<16} {}  cases {:>3}  max_abs {:.2e}  max_rel {:.2e}  rel_l2 {:.2e}",
                    op.name,
                    if bad.is_empty() { "PASS" } else { "FAIL" },
                    cases.len(),
                    worst(|c| c.max_abs),
                    worst(|c| c.max_rel),
                    worst(|c| c.rel_l2),
                );
                for c in &bad {
                    println!("    FAIL {}: {}", c.label, c.comparison);
                }
                if !bad.is_empty() {
                    failed += 1;
                }
            }
            Err(e) => {
                println!("{:<16} FAIL  error: {e}", op.name);
                failed += 1;
            }
        }
    }
    println!("{} passed, {} failed", ran - failed, failed);
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
