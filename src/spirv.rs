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
    strict_spirv_for(kernel, entry, constants, checks, false)
}

/// [`strict_spirv_with`], and with `bf16_conversion` the BF16 hooks of `wgsl/common/dtype.wgsl`
/// converted by the device ([`bf16_conversion`]), for a device with `VK_KHR_shader_bfloat16`'s
/// `shaderBFloat16Type` enabled.
pub fn strict_spirv_for(
    kernel: &Kernel,
    entry: &str,
    constants: &Constants,
    checks: ShaderChecks,
    bf16_conversion: bool,
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
    // The hooks are found by their names, which naga writes with `DEBUG` (and nothing else).
    let hooks = bf16_conversion
        && module
            .functions
            .iter()
            .any(|(_, f)| f.name.as_deref().is_some_and(|n| BF16_HOOKS.contains(&n)));
    let guarded = checks == ShaderChecks::Guarded;
    let options = spv::Options {
        lang_version: SPIRV_VERSION,
        binding_map,
        fake_missing_bindings: false,
        flags: if hooks {
            spv::WriterFlags::DEBUG
        } else {
            spv::WriterFlags::empty()
        },
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
    let failed = |message: String| Error::Kernel {
        kernel: kernel.name.into(),
        message: format!("{entry}: spir-v: {message}"),
    };
    let words = if hooks {
        bf16_conversion_words(&words).map_err(failed)?
    } else {
        words
    };
    Ok(StrictSpirv {
        words: no_contraction(&words).map_err(failed)?,
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

/// The WGSL functions whose bodies [`bf16_conversion_words`] replaces: `bf16x4_nearest(v:
/// vec4<f32>) -> vec2<u32>` (four values not NaN rounded to BF16, packed two a word, `.x` in the
/// low half) and `bf16_round_nan_free(v: vec4<f32>) -> vec4<f32>` (the same rounding kept in
/// F32).
pub const BF16_HOOKS: [&str; 2] = ["bf16x4_nearest", "bf16_round_nan_free"];

/// `BFloat16TypeKHR` in SPIR-V's capability enumeration (`SPV_KHR_bfloat16`).
pub const CAPABILITY_BFLOAT16_TYPE: u32 = 5116;
const OP_NAME: u32 = 5;
const OP_MEMBER_NAME: u32 = 6;
const OP_EXTENSION: u32 = 10;
const OP_CAPABILITY: u32 = 17;
const OP_TYPE_FLOAT: u32 = 22;
const OP_TYPE_VECTOR: u32 = 23;
const OP_FUNCTION: u32 = 54;
const OP_FUNCTION_PARAMETER: u32 = 55;
const OP_FUNCTION_END: u32 = 56;
const OP_LABEL: u32 = 248;
/// `OpFConvert`.
pub const OP_FCONVERT: u32 = 115;
const OP_BITCAST: u32 = 124;
const OP_RETURN_VALUE: u32 = 254;

/// `words` (written with names) with the bodies of the [`BF16_HOOKS`] replaced by the device's
/// conversion, and every name removed:
///
/// * `bf16x4_nearest(v)`: `OpBitcast` to `vec2<u32>` of `OpFConvert` to a 4-vector of BF16;
/// * `bf16_round_nan_free(v)`: `OpFConvert` back to F32 of the same conversion.
///
/// Conversions to a float type round to nearest even in Vulkan, as the integer bodies do; a
/// hook never takes a NaN. The module gains the `BFloat16TypeKHR` capability, the
/// `SPV_KHR_bfloat16` extension, and the types `OpTypeFloat 16 BFloat16KHR` and its 4-vector.
pub fn bf16_conversion_words(words: &[u32]) -> std::result::Result<Vec<u32>, String> {
    let list = instructions(words)?;
    let mut hooks = std::collections::HashMap::new();
    for (op, inst) in &list {
        if *op == OP_NAME && inst.len() >= 3 {
            let name = literal_string(&inst[2..]);
            if let Some(k) = BF16_HOOKS.iter().position(|h| *h == name) {
                hooks.insert(inst[1], k);
            }
        }
    }
    if hooks.is_empty() {
        return Ok(strip_names(&list, words.len()));
    }
    let mut bound = words[3];
    let mut fresh = || {
        bound += 1;
        bound - 1
    };
    let bf16 = fresh();
    let bf16x4 = fresh();
    let mut rounded = Vec::new();
    let mut out = Vec::with_capacity(words.len() + 32);
    out.extend_from_slice(&words[..5]);
    let mut declared = false;
    let mut i = 0;
    while i < list.len() {
        let (op, inst) = list[i];
        match op {
            OP_NAME | OP_MEMBER_NAME => {}
            OP_CAPABILITY if !matches!(list.get(i + 1), Some((OP_CAPABILITY, _))) => {
                out.extend_from_slice(inst);
                out.extend_from_slice(&[(2 << 16) | OP_CAPABILITY, CAPABILITY_BFLOAT16_TYPE]);
                let name = literal_words("SPV_KHR_bfloat16");
                out.push(((1 + name.len() as u32) << 16) | OP_EXTENSION);
                out.extend_from_slice(&name);
            }
            OP_FUNCTION if hooks.contains_key(&inst[2]) => {
                if !declared {
                    return Err("a BF16 hook before the types".into());
                }
                // OpFunction, one parameter, the first label; the rest of the body is replaced.
                let (result_type, kind) = (inst[1], hooks[&inst[2]]);
                let param = match list.get(i + 1) {
                    Some((OP_FUNCTION_PARAMETER, p)) => p[2],
                    _ => return Err("a BF16 hook without its parameter".into()),
                };
                let Some((OP_LABEL, _)) = list.get(i + 2) else {
                    return Err("a BF16 hook with more than one parameter".into());
                };
                for (_, kept) in &list[i..i + 3] {
                    out.extend_from_slice(kept);
                }
                let converted = fresh();
                let result = fresh();
                rounded.push(converted);
                out.extend_from_slice(&[(4 << 16) | OP_FCONVERT, bf16x4, converted, param]);
                let back = if kind == 0 { OP_BITCAST } else { OP_FCONVERT };
                out.extend_from_slice(&[(4 << 16) | back, result_type, result, converted]);
                out.extend_from_slice(&[(2 << 16) | OP_RETURN_VALUE, result]);
                while list[i].0 != OP_FUNCTION_END {
                    i += 1;
                    if i == list.len() {
                        return Err("a BF16 hook without its end".into());
                    }
                }
                out.extend_from_slice(list[i].1);
            }
            _ => {
                if op == OP_FUNCTION && !declared {
                    // The types section ends at the first function.
                    out.extend_from_slice(&[(4 << 16) | OP_TYPE_FLOAT, bf16, 16, 0]);
                    out.extend_from_slice(&[(4 << 16) | OP_TYPE_VECTOR, bf16x4, bf16, 4]);
                    declared = true;
                }
                out.extend_from_slice(inst);
            }
        }
        i += 1;
    }
    out[3] = bound;
    // Round to nearest even, asked for on each conversion: NVIDIA's driver (580) truncates
    // without it.
    let decorations: Vec<u32> = rounded
        .into_iter()
        .flat_map(|id| {
            [
                (4 << 16) | OP_DECORATE,
                id,
                DECORATION_FP_ROUNDING_MODE,
                ROUNDING_RTE,
            ]
        })
        .collect();
    let list = instructions(&out)?;
    let mut out = with_annotations(&out, &list, &decorations);
    if std::env::var_os("WGRAD_BF16_RTE_EXECUTION_MODE").is_some() {
        out = with_rte_execution_mode(&out)?;
    }
    Ok(out)
}

/// `FPRoundingMode` in SPIR-V's decoration enumeration, and its `RTE` value.
pub const DECORATION_FP_ROUNDING_MODE: u32 = 39;
const ROUNDING_RTE: u32 = 0;

/// `words` with the entry point's `RoundingModeRTE 16` execution mode (`SPV_KHR_float_controls`)
/// as well: a measurement switch (`WGRAD_BF16_RTE_EXECUTION_MODE`), for drivers that would
/// ignore the decoration.
fn with_rte_execution_mode(words: &[u32]) -> std::result::Result<Vec<u32>, String> {
    const OP_ENTRY_POINT: u32 = 15;
    const OP_EXECUTION_MODE: u32 = 16;
    let list = instructions(words)?;
    let mut out = Vec::with_capacity(words.len() + 16);
    out.extend_from_slice(&words[..5]);
    let entry = list
        .iter()
        .find(|(op, _)| *op == OP_ENTRY_POINT)
        .map(|(_, inst)| inst[2])
        .ok_or("no entry point")?;
    for (i, (op, inst)) in list.iter().enumerate() {
        out.extend_from_slice(inst);
        let next = list.get(i + 1).map(|(op, _)| *op);
        if *op == OP_CAPABILITY && next != Some(OP_CAPABILITY) {
            out.extend_from_slice(&[(2 << 16) | OP_CAPABILITY, 4467]);
            let name = literal_words("SPV_KHR_float_controls");
            out.push(((1 + name.len() as u32) << 16) | OP_EXTENSION);
            out.extend_from_slice(&name);
        }
        if (*op == OP_ENTRY_POINT || *op == OP_EXECUTION_MODE)
            && !matches!(next, Some(OP_ENTRY_POINT | OP_EXECUTION_MODE))
        {
            out.extend_from_slice(&[(4 << 16) | OP_EXECUTION_MODE, entry, 4462, 16]);
        }
    }
    Ok(out)
}

/// The words of `list` without `OpName` and `OpMemberName`.
fn strip_names(list: &[(u32, &[u32])], len: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(len);
    for (op, inst) in list {
        if *op != OP_NAME && *op != OP_MEMBER_NAME {
            out.extend_from_slice(inst);
        }
    }
    out
}

/// A SPIR-V literal string's text (UTF-8, NUL-terminated, packed little-endian into words).
fn literal_string(words: &[u32]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take_while(|b| *b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `text` as a SPIR-V literal string.
fn literal_words(text: &str) -> Vec<u32> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.resize(text.len() / 4 * 4 + 4, 0);
    bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
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
    let extra: Vec<u32> = targets
        .into_iter()
        .flat_map(|id| [(3 << 16) | OP_DECORATE, id, NO_CONTRACTION])
        .collect();
    Ok(with_annotations(words, &list, &extra))
}

/// `words` (parsed as `list`) with the instructions `extra` inserted after its annotations,
/// before the first instruction of the types section.
fn with_annotations(words: &[u32], list: &[(u32, &[u32])], extra: &[u32]) -> Vec<u32> {
    let mut at = 5;
    for (op, inst) in list {
        if !PREAMBLE.contains(op) {
            break;
        }
        at += inst.len();
    }
    let mut out = Vec::with_capacity(words.len() + extra.len());
    out.extend_from_slice(&words[..at]);
    out.extend_from_slice(extra);
    out.extend_from_slice(&words[at..]);
    out
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
