//! Strict SPIR-V: every entry point of every registered kernel translates; every float
//! arithmetic instruction carries `NoContraction`; bindings are numbered by position among
//! the entry's bindings (as wgpu numbers the engine's layout on Vulkan); the decorations
//! land among the annotations; constants are substituted; the pass on handmade words. (Every
//! other test runs its kernels through this path on a Vulkan adapter in the default strict
//! mode.)

use wgrad::ShaderChecks;
use wgrad::kernel::registry;
use wgrad::spirv::{
    CAPABILITY_BFLOAT16_TYPE, DECORATION_FP_ROUNDING_MODE, FLOAT_ARITHMETIC, NO_CONTRACTION,
    OP_FCONVERT, contractible_results, instructions, no_contraction, strict_spirv,
    strict_spirv_for,
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

/// How `with` (the BF16 hooks converted by the device) differs from `without` (the integer
/// bodies), instruction by instruction: the capability, the extension and the two BF16 types
/// added, and hook bodies replaced by a conversion, its bitcast or conversion back, and the
/// return; anything else is a failure. Returns the number of bodies replaced.
fn replaced_hooks(with: &[u32], without: &[u32], what: &str) -> usize {
    const OP_EXTENSION: u32 = 10;
    const OP_CAPABILITY: u32 = 17;
    const OP_TYPE_FLOAT: u32 = 22;
    const OP_TYPE_VECTOR: u32 = 23;
    const OP_FUNCTION_END: u32 = 56;
    const OP_BITCAST: u32 = 124;
    const OP_RETURN_VALUE: u32 = 254;
    const OP_LABEL: u32 = 248;
    let a = instructions(with).unwrap();
    let b = instructions(without).unwrap();
    assert_eq!(with[..3], without[..3], "{what}: header");
    let bound = with[3];
    let (mut i, mut j, mut replaced, mut added, mut decorations) = (0, 0, 0, 0, 0);
    let mut bf16_vector = None;
    while i < a.len() {
        let (op, inst) = a[i];
        if j < b.len() && inst == b[j].1 {
            i += 1;
            j += 1;
            // A hook's body: the first block's label, then the conversion in place of the rest.
            if op == OP_LABEL && a.get(i).is_some_and(|(op, _)| *op == OP_FCONVERT) {
                let convert = a[i].1;
                assert_eq!(Some(convert[1]), bf16_vector, "{what}: conversion type");
                let back = a[i + 1].1;
                assert!(
                    [OP_BITCAST, OP_FCONVERT].contains(&a[i + 1].0) && back[3] == convert[2],
                    "{what}: {back:?}"
                );
                assert_eq!(a[i + 2].1, [(2 << 16) | OP_RETURN_VALUE, back[2]], "{what}");
                assert_eq!(a[i + 3].0, OP_FUNCTION_END, "{what}");
                assert!(
                    convert[2] < bound && back[2] < bound,
                    "{what}: ids past the bound"
                );
                while b[j].0 != OP_FUNCTION_END {
                    j += 1;
                }
                i += 3;
                replaced += 1;
            }
            continue;
        }
        match op {
            OP_CAPABILITY => assert_eq!(inst[1], CAPABILITY_BFLOAT16_TYPE, "{what}"),
            OP_EXTENSION => assert_eq!(
                inst[1..],
                [0x5f56_5053, 0x5f52_484b, 0x6f6c_6662, 0x3631_7461, 0],
                "{what}: SPV_KHR_bfloat16"
            ),
            OP_TYPE_FLOAT => assert_eq!(inst[2..], [16, 0], "{what}: BFloat16KHR"),
            OP_DECORATE => {
                assert_eq!(inst[2..], [DECORATION_FP_ROUNDING_MODE, 0], "{what}: RTE");
                decorations += 1;
                i += 1;
                continue;
            }
            OP_TYPE_VECTOR => {
                assert_eq!(inst[3], 4, "{what}");
                bf16_vector = Some(inst[1]);
            }
            _ => panic!("{what}: unexpected {inst:?} at instruction {i}"),
        }
        added += 1;
        i += 1;
    }
    assert_eq!(j, b.len(), "{what}: instructions missing");
    assert_eq!(added, if replaced > 0 { 4 } else { 0 }, "{what}");
    assert_eq!(
        decorations, replaced,
        "{what}: one rounding mode a conversion"
    );
    replaced
}

#[test]
fn bf16_hooks_become_the_devices_conversion() {
    // Every entry point, with its default constants and with 16-bit dtypes where the kernel
    // has them: the rewrite adds the extension and types and replaces only hook bodies.
    let mut rewritten = 0;
    let mut replaced = 0;
    for kernel in registry() {
        for entry in kernel.entry_points().unwrap() {
            for constants in [vec![], vec![("DT", 2.0)]] {
                let Ok(plain) =
                    strict_spirv_for(kernel, &entry, &constants, ShaderChecks::Trusted, false)
                else {
                    continue; // a kernel without DT
                };
                let what = format!("{}::{entry} {constants:?}", kernel.name);
                let hw = strict_spirv_for(kernel, &entry, &constants, ShaderChecks::Trusted, true)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(
                    plain.words,
                    strict_spirv(kernel, &entry, &constants).unwrap().words
                );
                assert_eq!(contractible_results(&hw.words).unwrap(), Vec::<u32>::new());
                let n = replaced_hooks(&hw.words, &plain.words, &what);
                rewritten += usize::from(n > 0);
                replaced += n;
            }
        }
    }
    eprintln!("{rewritten} modules, {replaced} hook bodies");
    assert!(rewritten > 20, "only {rewritten} modules use a hook");
    // The 16-bit softmax forward rounds through `bf16x4_nearest`, the BF16 norm forwards
    // through both hooks.
    let softmax = strict_spirv_for(
        &wgrad::loss::KERNEL,
        "softmax_fwd_c",
        &vec![("DT", 2.0)],
        ShaderChecks::Trusted,
        true,
    )
    .unwrap();
    let plain = strict_spirv(&wgrad::loss::KERNEL, "softmax_fwd_c", &vec![("DT", 2.0)]).unwrap();
    assert!(replaced_hooks(&softmax.words, &plain.words, "softmax_fwd_c") >= 1);
    assert!(replaced >= rewritten);
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
