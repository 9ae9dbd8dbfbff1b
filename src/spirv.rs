//! Strict SPIR-V: how wgrad compiles kernels for Vulkan with IEEE-faithful arithmetic.
//!
//! Vulkan lets a driver treat SPIR-V float arithmetic much like C's `-ffast-math`: unless an
//! instruction carries the `NoContraction` decoration, it may be fused, reassociated or
//! simplified algebraically (`(a − (a + b)) + b` may become 0, `(x − a) − b` may become
//! `x − (a + b)`). NVIDIA's compiler does: the compensated centring of LayerNorm lost its
//! correction term there and a row with a common offset of 1e4 came out wrong by 1e-3.
//! naga emits no `NoContraction`, so in `MathMode::Strict` on a Vulkan adapter wgrad writes
//! the SPIR-V itself:
//!
//! 1. naga parses and validates the WGSL and substitutes the pipeline constants;
//! 2. naga writes SPIR-V for the one entry point, with the run-time guards of the engine's
//!    [`ShaderChecks`], without zero-filling workgroup memory (every kernel writes its
//!    workgroup memory before reading it; naga's zero-filling code made Mesa's compiler take
//!    minutes over the attention kernels, and the driver feature that does it natively cannot
//!    be queried through wgpu), and each
//!    binding numbered as wgpu numbers the engine's pipeline layout on Vulkan (the binding's
//!    position among the entry point's bindings, in binding order);
//! 3. every float arithmetic instruction (`OpFAdd`, `OpFSub`, `OpFMul`, `OpFDiv`, `OpFRem`,
//!    `OpFMod`, `OpFNegate`, `OpVectorTimesScalar`, `OpDot`, the matrix products) gets
//!    `NoContraction`, so each rounds exactly as written. Explicit `fma` calls stay fused:
//!    they are the operation the kernel asks for.
//!
//! The engine feeds the words to `create_shader_module_passthrough`. [`strict_spirv`] runs on
//! every platform; the tests check every registered entry point's words, and on a Vulkan
//! adapter (lavapipe included) every kernel runs through this path.

use crate::kernel::{Constants, Kernel, entry_bindings, entry_index};
use crate::{Error, Result, ShaderChecks};
use naga::back::spv;

/// One entry point translated to strict SPIR-V.
#[derive(Debug, Clone)]
pub struct StrictSpirv {
    /// The module's words.
    pub words: Vec<u32>,
    /// The entry point's name in the module.
    pub entry_name: String,
    /// Threads per workgroup.
    pub workgroup_size: (u32, u32, u32),
}

/// SPIR-V version written (Vulkan 1.1 and later accept it).
pub const SPIRV_VERSION: (u8, u8) = (1, 3);

/// `NoContraction` in SPIR-V's decoration enumeration.
pub const NO_CONTRACTION: u32 = 42;
const OP_DECORATE: u32 = 71;

/// Opcodes of the float arithmetic instructions that get `NoContraction`: each has its result
/// id in word 2 (after the result type).
pub const FLOAT_ARITHMETIC: &[u32] = &[
    127, // OpFNegate
    129, // OpFAdd
    131, // OpFSub
    133, // OpFMul
    136, // OpFDiv
    138, // OpFRem
    141, // OpFMod
    142, // OpVectorTimesScalar
    143, // OpMatrixTimesScalar
    144, // OpVectorTimesMatrix
    145, // OpMatrixTimesVector
    146, // OpMatrixTimesMatrix
    147, // OpOuterProduct
    148, // OpDot
];

/// Opcodes allowed before the first type declaration: mode setting, debug information and
/// annotations (SPIR-V's logical layout, sections 1–7).
const PREAMBLE: &[u32] = &[
    2, 3, 4, 5, 6, 7, 8, 10, 11, 14, 15, 16, 17, 71, 72, 73, 74, 75, 317, 330, 331, 332, 5632, 5633,
];

/// Translate one entry point of `kernel` to strict SPIR-V, with `constants` substituted, for an
/// engine with [`ShaderChecks::Trusted`].
pub fn strict_spirv(kernel: &Kernel, entry: &str, constants: &Constants) -> Result<StrictSpirv> {
    strict_spirv_with(kernel, entry, constants, ShaderChecks::Trusted)
}

/// [`strict_spirv`] with the given run-time guards: `Guarded` clamps indices of fixed-size
/// arrays, bounds every loop and guards integer division (buffers are left to the driver's
/// robust buffer access, which wgpu enables); `Trusted` adds none of them.
pub fn strict_spirv_with(
    kernel: &Kernel,
    entry: &str,
    constants: &Constants,
    checks: ShaderChecks,
) -> Result<StrictSpirv> {
    // wgpu numbers a bind group layout's Vulkan bindings by position (entries sorted by
    // binding), so WGSL binding n goes to the position of n among the entry's slots — the
    // slots the engine's pipeline layout is made of.
    let (plain, plain_info) = kernel.module()?;
    let slots = entry_bindings(kernel, &plain, &plain_info, entry)?;
    let binding_map = slots
        .iter()
        .enumerate()
        .map(|(position, s)| {
            (
                naga::ResourceBinding {
                    group: 0,
                    binding: s.binding,
                },
                spv::BindingInfo {
                    descriptor_set: 0,
                    binding: position as u32,
                    binding_array_size: None,
                },
            )
        })
        .collect();
    let (module, info) = kernel.specialized(entry, constants)?;
    let guarded = checks == ShaderChecks::Guarded;
    let options = spv::Options {
        lang_version: SPIRV_VERSION,
        binding_map,
        fake_missing_bindings: false,
        flags: spv::WriterFlags::empty(),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: if guarded {
                naga::proc::BoundsCheckPolicy::Restrict
            } else {
                naga::proc::BoundsCheckPolicy::Unchecked
            },
            ..Default::default()
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: guarded,
        emit_int_div_checks: guarded,
        ..Default::default()
    };
    let pipeline_options = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.to_string(),
    };
    let words = spv::write_vec(&module, &info, &options, Some(&pipeline_options)).map_err(|e| {
        Error::Kernel {
            kernel: kernel.name.into(),
            message: format!("{entry}: spir-v: {e}"),
        }
    })?;
    let index = entry_index(kernel, &module, entry)?;
    let [x, y, z] = module.entry_points[index].workgroup_size;
    Ok(StrictSpirv {
        words: no_contraction(&words).map_err(|message| Error::Kernel {
            kernel: kernel.name.into(),
            message: format!("{entry}: spir-v: {message}"),
        })?,
        entry_name: entry.to_string(),
        workgroup_size: (x, y, z),
    })
}

/// The instructions of a module after its 5-word header, as (opcode, words) slices.
pub fn instructions(words: &[u32]) -> std::result::Result<Vec<(u32, &[u32])>, String> {
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err("not a SPIR-V module".into());
    }
    let mut out = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 || at + count > words.len() {
            return Err(format!("malformed instruction at word {at}"));
        }
        out.push((words[at] & 0xffff, &words[at..at + count]));
        at += count;
    }
    Ok(out)
}

/// `words` with an `OpDecorate %id NoContraction` for the result of every float arithmetic
/// instruction that lacks one, placed with the module's other annotations.
pub fn no_contraction(words: &[u32]) -> std::result::Result<Vec<u32>, String> {
    let list = instructions(words)?;
    let mut decorated = std::collections::HashSet::new();
    let mut targets = Vec::new();
    for (op, inst) in &list {
        if *op == OP_DECORATE && inst.len() >= 3 && inst[2] == NO_CONTRACTION {
            decorated.insert(inst[1]);
        }
        if FLOAT_ARITHMETIC.contains(op) && inst.len() >= 3 {
            targets.push(inst[2]);
        }
    }
    targets.retain(|id| decorated.insert(*id));
    // Insert before the first instruction past the annotations.
    let mut at = 5;
    for (op, inst) in &list {
        if !PREAMBLE.contains(op) {
            break;
        }
        at += inst.len();
    }
    let mut out = Vec::with_capacity(words.len() + 3 * targets.len());
    out.extend_from_slice(&words[..at]);
    for id in targets {
        out.extend_from_slice(&[(3 << 16) | OP_DECORATE, id, NO_CONTRACTION]);
    }
    out.extend_from_slice(&words[at..]);
    Ok(out)
}

/// Result ids of float arithmetic instructions without `NoContraction` (empty for strict
/// SPIR-V).
pub fn contractible_results(words: &[u32]) -> std::result::Result<Vec<u32>, String> {
    let list = instructions(words)?;
    let decorated: std::collections::HashSet<u32> = list
        .iter()
        .filter(|(op, inst)| *op == OP_DECORATE && inst.len() >= 3 && inst[2] == NO_CONTRACTION)
        .map(|(_, inst)| inst[1])
        .collect();
    Ok(list
        .iter()
        .filter(|(op, inst)| FLOAT_ARITHMETIC.contains(op) && inst.len() >= 3)
        .map(|(_, inst)| inst[2])
        .filter(|id| !decorated.contains(id))
        .collect())
}
