//! Strict MSL: every entry point of every registered kernel translates, starts with the strict
//! pragmas, calls only `metal::precise::` transcendentals, reads no buffer sizes (the
//! passthrough path binds none), binds buffers 0..n exactly once, keeps no `threadgroup`
//! entry-point parameters; `make_strict` and `imprecise_calls` on handmade text; constants
//! substituted; a golden snapshot of `copy_vec4`.
//!
//! Regenerate the golden file with `WGRAD_BLESS=1 cargo test --test msl`.

use wgrad::kernel::{Constants, Kernel, registry};
use wgrad::msl::{STRICT_PRAGMAS, StrictMsl, imprecise_calls, make_strict, strict_msl};

/// Group-0 bindings (uniform and storage) the entry point uses, from naga's analysis.
fn used_bindings(kernel: &Kernel, entry: &str) -> usize {
    let (module, info) = kernel.module().unwrap();
    let index = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .unwrap();
    let uses = info.get_entry_point(index);
    module
        .global_variables
        .iter()
        .filter(|(h, v)| v.binding.is_some() && !uses[*h].is_empty())
        .count()
}

/// The parameter list of the MSL entry point `name`.
fn entry_params<'a>(msl: &'a str, name: &str) -> &'a str {
    let head = format!("kernel void {name}(");
    let start = msl
        .find(&head)
        .unwrap_or_else(|| panic!("no `{head}` in the MSL"))
        + head.len();
    let end = start + msl[start..].find(") {").expect("end of the parameter list");
    &msl[start..end]
}

/// The numbers in every `[[buffer(N)]]` attribute.
fn buffer_slots(text: &str) -> Vec<usize> {
    text.match_indices("[[buffer(")
        .map(|(pos, pat)| {
            let rest = &text[pos + pat.len()..];
            let end = rest.find(')').expect("closing parenthesis");
            rest[..end].trim().parse().expect("a buffer index")
        })
        .collect()
}

fn check_strict(kernel: &Kernel, entry: &str, constants: &Constants, msl: &StrictMsl) {
    let what = format!("{}::{entry}", kernel.name);
    let src = &msl.source;
    assert!(
        src.starts_with(STRICT_PRAGMAS),
        "{what}: no strict pragmas first"
    );
    assert_eq!(
        src.matches("#pragma METAL fp").count(),
        2,
        "{what}: pragmas more than once"
    );
    assert_eq!(imprecise_calls(src), Vec::<String>::new(), "{what}");
    // Buffer sizes: never read, never an entry-point argument.
    assert!(
        !src.contains("_buffer_sizes."),
        "{what}: reads _buffer_sizes"
    );
    assert!(
        !src.contains("_mslBufferSizes& _buffer_sizes [[buffer"),
        "{what}: _buffer_sizes is an entry argument"
    );
    // One entry point, with the reported name.
    assert_eq!(src.matches("kernel void ").count(), 1, "{what}");
    let params = entry_params(src, &msl.entry_name);
    // Bindings go to buffer slots 0..n, each exactly once, and nothing beyond.
    let n = used_bindings(kernel, entry);
    let mut slots = buffer_slots(params);
    slots.sort_unstable();
    assert_eq!(slots, (0..n).collect::<Vec<_>>(), "{what}: buffer slots");
    assert!(
        buffer_slots(src).iter().all(|&s| s < n),
        "{what}: a [[buffer(N)]] with N ≥ {n}"
    );
    // Workgroup memory is declared in the body, not passed in.
    for p in params.split('\n') {
        let p = p.trim().trim_start_matches(',').trim();
        assert!(
            !p.starts_with("threadgroup"),
            "{what}: threadgroup parameter `{p}` left"
        );
    }
    assert!(!params.contains("threadgroup "), "{what}: {params}");
    // Reported workgroup size is the WGSL one (an override expression evaluated with the
    // constants).
    let (x, y, z) = kernel.workgroup_size(entry, constants).unwrap();
    assert_eq!(msl.workgroup_size, (x, y, z), "{what}");
    assert!(
        src.contains(&format!("max_total_threads_per_threadgroup({})", x * y * z)),
        "{what}"
    );
}

#[test]
fn every_kernel_translates_to_strict_msl() {
    let kernels = registry();
    assert!(!kernels.is_empty());
    let mut names: Vec<&str> = kernels.iter().map(|k| k.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), kernels.len(), "kernel names are not unique");
    let mut entries = 0;
    for kernel in kernels {
        kernel
            .module()
            .unwrap_or_else(|e| panic!("{}: naga validation: {e}", kernel.name));
        let eps = kernel.entry_points().unwrap();
        assert!(
            !eps.is_empty(),
            "{} has no compute entry point",
            kernel.name
        );
        for entry in &eps {
            let msl = strict_msl(kernel, entry, &vec![])
                .unwrap_or_else(|e| panic!("{}::{entry}: {e}", kernel.name));
            check_strict(kernel, entry, &vec![], &msl);
            entries += 1;
        }
    }
    assert!(entries >= kernels.len());
}

/// Kernels `wgrad::expr` generates (every operation, reductions two deep, 16-bit inputs and
/// outputs, forward and backward) pass the same checks.
#[test]
fn expression_kernels_translate_to_strict_msl() {
    use wgrad::expr::{Expr, ExprOp, Kind, generated_kernels};
    use wgrad::{DType, Engine, Tensor};
    let engine = Engine::new().unwrap();
    let x = Expr::input(0, Kind::Element);
    let w = Expr::input(1, Kind::Column);
    let c = &x - x.row_sum() / Expr::width();
    let pick = Expr::select(&x.less(&w), &x.exp(), &(x.abs() + 1.0).log());
    let y = (&c * (&c * &c).row_min().sqrt()).tanh() / (x.row_max() - &w).cast(DType::BF16) - pick;
    let op = ExprOp::new(&[Kind::Element, Kind::Column], &[y, c.row_sum()]).unwrap();
    let xt = Tensor::from_slice(&engine, &[half::bf16::from_f32(0.5); 6], &[2, 3]).unwrap();
    let wt = Tensor::from_slice(&engine, &[1.0f32; 3], &[3]).unwrap();
    let (outs, saved) = op.forward(&[&xt, &wt], &[DType::F16, DType::F32]).unwrap();
    op.backward(&saved, &[Some(&outs[0]), Some(&outs[1])], &[0, 1])
        .unwrap();
    let kernels = generated_kernels();
    assert!(kernels.len() >= 2, "forward and backward kernels");
    for kernel in kernels {
        for entry in &kernel.entry_points().unwrap() {
            let msl = strict_msl(kernel, entry, &vec![])
                .unwrap_or_else(|e| panic!("{}::{entry}: {e}", kernel.name));
            check_strict(kernel, entry, &vec![], &msl);
        }
    }
}

#[test]
fn workgroup_size_overrides_are_evaluated() {
    // The matmul tile entry points take their workgroup size from the NARROW override.
    let kernel = &wgrad::matmul::KERNEL;
    for (narrow, lanes) in [(0.0, 256), (1.0, 64)] {
        let constants = vec![("NARROW", narrow)];
        for entry in ["gemm", "gemm_h", "gemm_pre", "gemm_partial"] {
            let msl = strict_msl(kernel, entry, &constants).unwrap();
            check_strict(kernel, entry, &constants, &msl);
            assert_eq!(msl.workgroup_size, (lanes, 1, 1), "{entry} NARROW {narrow}");
        }
    }
}

#[test]
fn attention_layouts_translate_and_size_their_workgroup_memory() {
    // The attention passes take the padded (25.5 KiB, `WORKGROUP_BYTES`), the swizzled
    // (24 KiB) or the compact (16 KiB, `COMPACT_WORKGROUP_BYTES`: swizzled, 32 tile columns at a
    // time) layout of their workgroup arrays from the PADDED and P_COLS overrides, and their
    // order of query blocks from LAST_FIRST; every combination translates to strict MSL.
    let kernel = &wgrad::attention::KERNEL;
    let entries = [
        "attention_forward",
        "attention_dkdv",
        "attention_dkdv_store",
        "attention_dq",
        "attention_dq_stored",
    ];
    let layouts = [
        (1.0, 64.0, wgrad::attention::WORKGROUP_BYTES),
        (0.0, 64.0, 24 * 1024),
        (0.0, 32.0, wgrad::attention::COMPACT_WORKGROUP_BYTES),
    ];
    for (padded, p_cols, bytes) in layouts {
        for last_first in [0.0, 1.0] {
            let constants = vec![
                ("PADDED", padded),
                ("P_COLS", p_cols),
                ("LAST_FIRST", last_first),
            ];
            for entry in entries {
                let msl = strict_msl(kernel, entry, &constants).unwrap();
                check_strict(kernel, entry, &constants, &msl);
                let (module, _) = kernel.specialized(entry, &constants).unwrap();
                let staged: u64 = module
                    .global_variables
                    .iter()
                    .filter(|(_, v)| matches!(v.name.as_deref(), Some("xs" | "ps")))
                    .map(|(_, v)| u64::from(module.types[v.ty].inner.size(module.to_ctx())))
                    .sum();
                assert_eq!(staged, bytes, "{entry} PADDED {padded} P_COLS {p_cols}");
            }
        }
    }
}

#[test]
fn workgroup_variables_become_body_declarations() {
    // `reduce::row_sum` uses workgroup memory (the tree's scratch).
    let msl = strict_msl(&wgrad::reduce::KERNEL, "row_sum", &vec![]).unwrap();
    let params = entry_params(&msl.source, &msl.entry_name);
    let body_start = msl.source.find(params).unwrap() + params.len();
    let body = &msl.source[body_start..];
    assert!(
        body.contains("threadgroup ") && body.contains("wg_scratch;"),
        "no threadgroup declaration in the body"
    );
}

#[test]
fn constants_are_substituted() {
    let kernel = &wgrad::cast::KERNEL;
    let default = strict_msl(kernel, "convert", &vec![]).unwrap();
    assert!(default.source.contains("constant uint SRC = 0u;"));
    assert!(default.source.contains("constant uint DST = 1u;"));
    let bf16_to_f16 = strict_msl(kernel, "convert", &vec![("SRC", 2.0), ("DST", 1.0)]).unwrap();
    check_strict(
        kernel,
        "convert",
        &vec![("SRC", 2.0), ("DST", 1.0)],
        &bf16_to_f16,
    );
    assert!(
        bf16_to_f16.source.contains("constant uint SRC = 2u;"),
        "SRC override not substituted"
    );
    assert!(bf16_to_f16.source.contains("constant uint DST = 1u;"));
    assert!(!bf16_to_f16.source.contains("SRC = 0u"));
    assert_ne!(default.source, bf16_to_f16.source);
    // An override that the kernel does not declare is an error, not ignored.
    match strict_msl(kernel, "convert", &vec![("NO_SUCH_CONSTANT", 1.0)]) {
        Err(wgrad::Error::Kernel { kernel, .. }) => assert_eq!(kernel, "cast"),
        other => panic!(
            "expected Error::Kernel, got {:?}",
            other.map(|m| m.entry_name)
        ),
    }
    match strict_msl(kernel, "no_such_entry", &vec![]) {
        Err(wgrad::Error::Kernel { .. }) => {}
        other => panic!(
            "expected Error::Kernel, got {:?}",
            other.map(|m| m.entry_name)
        ),
    }
}

#[test]
fn make_strict_routes_transcendentals_to_precise() {
    let out = make_strict("float y = metal::exp(x);");
    assert_eq!(
        out,
        format!("{STRICT_PRAGMAS}float y = metal::precise::exp(x);")
    );
    // Non-transcendental calls, and names that only start like one, are untouched.
    let untouched = "float a = metal::abs(x); float b = metal::max(x, y); metal::exp_like(x);";
    assert_eq!(
        make_strict(untouched),
        format!("{STRICT_PRAGMAS}{untouched}")
    );
    // Names that are prefixes of one another.
    assert_eq!(
        make_strict("metal::exp2(x) + metal::exp10(y) + metal::rsqrt(z) + metal::sqrt(w)"),
        format!(
            "{STRICT_PRAGMAS}metal::precise::exp2(x) + metal::precise::exp10(y) + \
             metal::precise::rsqrt(z) + metal::precise::sqrt(w)"
        )
    );
    // Already precise: untouched.
    let precise = "metal::precise::exp(x) * metal::precise::log(y)";
    assert_eq!(make_strict(precise), format!("{STRICT_PRAGMAS}{precise}"));
    // A type or constant that is not a call is untouched.
    let types = "metal::uint3 id; metal::float4 v = metal::float4(metal::exp(a));";
    assert_eq!(
        make_strict(types),
        format!(
            "{STRICT_PRAGMAS}metal::uint3 id; metal::float4 v = metal::float4(metal::precise::exp(a));"
        )
    );
    // Every function of the list is routed.
    for name in wgrad::msl::PRECISE_FUNCTIONS {
        let s = make_strict(&format!("y = metal::{name}(x);"));
        assert!(
            s.ends_with(&format!("y = metal::precise::{name}(x);")),
            "{name}: {s}"
        );
        assert!(imprecise_calls(&s).is_empty(), "{name}");
    }
}

#[test]
fn imprecise_calls_finds_fast_calls() {
    assert_eq!(imprecise_calls("float y = metal::exp(x);"), vec!["exp"]);
    assert_eq!(
        imprecise_calls("y = metal::log2(x) + metal::tanh(z);"),
        vec!["log2", "tanh"]
    );
    // Unqualified calls are the fast versions too.
    assert_eq!(imprecise_calls("float y = sqrt(x);"), vec!["sqrt"]);
    assert_eq!(imprecise_calls("float y = (rsqrt(x));"), vec!["rsqrt"]);
    // Not flagged: precise calls, other functions, longer names.
    assert!(imprecise_calls("metal::precise::exp(x) + metal::precise::sqrt(y)").is_empty());
    assert!(
        imprecise_calls("metal::abs(x) + metal::fma(a, b, c) + my_exp(x) + metal::exp_like(x)")
            .is_empty()
    );
    assert!(imprecise_calls("").is_empty());
    // After make_strict, nothing is left.
    let fast = "a = metal::exp(x); b = metal::cos(y); c = metal::pow(x, y);";
    assert_eq!(imprecise_calls(fast).len(), 3);
    assert!(imprecise_calls(&make_strict(fast)).is_empty());
}

#[test]
fn golden_copy_vec4() {
    // The tree it was built from, or (a test binary carried to another machine) the working
    // directory's.
    let rel = "tests/golden/copy_vec4.msl";
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let path = if built.exists() {
        built
    } else {
        std::path::PathBuf::from(rel)
    };
    let msl = strict_msl(&wgrad::bench::COPY_KERNEL, "copy_vec4", &vec![]).unwrap();
    check_strict(&wgrad::bench::COPY_KERNEL, "copy_vec4", &vec![], &msl);
    if std::env::var("WGRAD_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &msl.source).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; generate it with WGRAD_BLESS=1 cargo test --test msl",
            path.display()
        )
    });
    if golden != msl.source {
        let line = golden
            .lines()
            .zip(msl.source.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(golden.lines().count().min(msl.source.lines().count()));
        panic!(
            "strict MSL of copy::copy_vec4 differs from {} from line {} on:\n--- golden\n{}\n--- now\n{}\n\
             (if the change is intended: WGRAD_BLESS=1 cargo test --test msl)",
            path.display(),
            line + 1,
            golden
                .lines()
                .skip(line)
                .take(5)
                .collect::<Vec<_>>()
                .join("\n"),
            msl.source
                .lines()
                .skip(line)
                .take(5)
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
}
