//! Strict SPIR-V: every entry point of every registered kernel translates; every float
//! arithmetic instruction carries `NoContraction`; bindings are numbered by position among
//! the entry's bindings (as wgpu numbers the engine's layout on Vulkan); the decorations
//! land among the annotations; constants are substituted; the pass on handmade words. (Every
//! other test runs its kernels through this path on a Vulkan adapter in the default strict
//! mode.)

use wgrad::kernel::registry;
use wgrad::spirv::{
    FLOAT_ARITHMETIC, NO_CONTRACTION, contractible_results, instructions, no_contraction,
    strict_spirv,
};

const OP_DECORATE: u32 = 71;
const DECORATION_BINDING: u32 = 33;

/// The `Binding` decorations of a module, sorted.
fn bindings(words: &[u32]) -> Vec<u32> {
    let mut found: Vec<u32> = instructions(words)
        .unwrap()
        .iter()
        .filter(|(op, inst)| *op == OP_DECORATE && inst.len() == 4 && inst[2] == DECORATION_BINDING)
        .map(|(_, inst)| inst[3])
        .collect();
    found.sort_unstable();
    found
}

#[test]
fn every_kernel_translates_to_strict_spirv() {
    let mut entries = 0;
    let mut decorated = 0;
    for kernel in registry() {
        for entry in kernel.entry_points().unwrap() {
            let what = format!("{}::{entry}", kernel.name);
            let spirv =
                strict_spirv(kernel, &entry, &vec![]).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                contractible_results(&spirv.words).unwrap(),
                Vec::<u32>::new(),
                "{what}: float arithmetic without NoContraction"
            );
            // Bindings: 0..k, at most one variable each, k ≤ the entry's slots.
            let found = bindings(&spirv.words);
            let mut unique = found.clone();
            unique.dedup();
            assert_eq!(unique, found, "{what}: a binding used twice");
            assert_eq!(
                found,
                (0..found.len() as u32).collect::<Vec<_>>(),
                "{what}: bindings not numbered by position"
            );
            assert_eq!(
                Ok(spirv.workgroup_size),
                kernel.workgroup_size(&entry, &vec![]),
                "{what}"
            );
            assert_eq!(spirv.entry_name, entry, "{what}");
            decorated += instructions(&spirv.words)
                .unwrap()
                .iter()
                .filter(|(op, _)| FLOAT_ARITHMETIC.contains(op))
                .count();
            entries += 1;
        }
    }
    assert!(entries >= registry().len());
    assert!(decorated > 1000, "only {decorated} float instructions seen");
}

#[test]
fn workgroup_size_overrides_are_evaluated() {
    // The matmul tile entry points take their workgroup size from the NARROW override.
    let kernel = &wgrad::matmul::KERNEL;
    for (narrow, lanes) in [(0.0, 256), (1.0, 64)] {
        for entry in ["gemm", "gemm_h", "gemm_pre", "gemm_partial"] {
            let spirv = strict_spirv(kernel, entry, &vec![("NARROW", narrow)]).unwrap();
            assert_eq!(
                spirv.workgroup_size,
                (lanes, 1, 1),
                "{entry} NARROW {narrow}"
            );
            assert_eq!(
                contractible_results(&spirv.words).unwrap(),
                Vec::<u32>::new(),
                "{entry} NARROW {narrow}"
            );
        }
    }
}

#[test]
fn attention_layouts_translate() {
    // Both workgroup layouts of the attention passes (PADDED) and both orders of query blocks
    // (LAST_FIRST) translate with every float result decorated.
    let kernel = &wgrad::attention::KERNEL;
    for padded in [0.0, 1.0] {
        for last_first in [0.0, 1.0] {
            let constants = vec![("PADDED", padded), ("LAST_FIRST", last_first)];
            for entry in ["attention_forward", "attention_dkdv", "attention_dq_stored"] {
                let spirv = strict_spirv(kernel, entry, &constants).unwrap();
                assert_eq!(
                    contractible_results(&spirv.words).unwrap(),
                    Vec::<u32>::new(),
                    "{entry} PADDED {padded} LAST_FIRST {last_first}"
                );
            }
        }
    }
}

#[test]
fn constants_are_substituted_and_unknown_ones_rejected() {
    let kernel = &wgrad::cast::KERNEL;
    let default = strict_spirv(kernel, "convert", &vec![]).unwrap();
    let other = strict_spirv(kernel, "convert", &vec![("SRC", 2.0), ("DST", 1.0)]).unwrap();
    assert_ne!(default.words, other.words);
    assert!(matches!(
        strict_spirv(kernel, "convert", &vec![("NO_SUCH_CONSTANT", 1.0)]),
        Err(wgrad::Error::Kernel { .. })
    ));
    assert!(matches!(
        strict_spirv(kernel, "no_such_entry", &vec![]),
        Err(wgrad::Error::Kernel { .. })
    ));
}

/// A handmade module: header, `OpCapability Shader`, `OpName %7 "a"`, `OpDecorate %9
/// NoContraction` (already there), `OpTypeFloat %2 32`, then `%7 = OpFAdd %2 %3 %4`,
/// `%8 = OpIAdd %5 %3 %4`, `%9 = OpFMul %2 %7 %7`, `%10 = OpFNegate %2 %9`.
fn handmade() -> Vec<u32> {
    vec![
        0x0723_0203,
        0x0001_0300,
        0,
        11,
        0,
        (2 << 16) | 17,
        1,
        (3 << 16) | 5,
        7,
        u32::from_le_bytes(*b"a\0\0\0"),
        (3 << 16) | OP_DECORATE,
        9,
        NO_CONTRACTION,
        (3 << 16) | 22,
        2,
        32,
        (5 << 16) | 129,
        2,
        7,
        3,
        4,
        (5 << 16) | 128,
        5,
        8,
        3,
        4,
        (5 << 16) | 133,
        2,
        9,
        7,
        7,
        (4 << 16) | 127,
        2,
        10,
        9,
    ]
}

#[test]
fn the_pass_decorates_each_float_result_once_among_the_annotations() {
    let words = handmade();
    assert_eq!(contractible_results(&words).unwrap(), vec![7, 10]);
    let out = no_contraction(&words).unwrap();
    assert_eq!(contractible_results(&out).unwrap(), Vec::<u32>::new());
    let list = instructions(&out).unwrap();
    let decorations: Vec<u32> = list
        .iter()
        .filter(|(op, inst)| *op == OP_DECORATE && inst[2] == NO_CONTRACTION)
        .map(|(_, inst)| inst[1])
        .collect();
    // %9 keeps its one decoration, %7 and %10 get one each, the integer add none.
    assert_eq!(decorations, vec![9, 7, 10]);
    // Every decoration precedes the first type declaration.
    let first_type = list.iter().position(|(op, _)| *op == 22).unwrap();
    let last_decoration = list.iter().rposition(|(op, _)| *op == OP_DECORATE).unwrap();
    assert!(last_decoration < first_type);
    assert_eq!(out.len(), words.len() + 6);
    // Idempotent.
    assert_eq!(no_contraction(&out).unwrap(), out);
    // Malformed input is an error, not a panic.
    assert!(no_contraction(&[1, 2, 3]).is_err());
    let mut truncated = words.clone();
    truncated.truncate(words.len() - 1);
    assert!(no_contraction(&truncated).is_err());
    let mut zero = words;
    zero[5] = 0;
    assert!(no_contraction(&zero).is_err());
}
