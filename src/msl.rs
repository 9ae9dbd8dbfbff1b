//! Strict MSL: how wgrad compiles kernels for Metal with IEEE-faithful math.
//!
//! wgpu compiles WGSL for Metal through naga's MSL writer and leaves Metal's default fast math
//! on, under which `exp`, `log`, `rsqrt`, division and contraction may be approximated. In
//! `MathMode::Strict` on a Metal adapter, wgrad instead translates each kernel itself:
//!
//! 1. naga parses and validates the WGSL, pipeline constants are substituted;
//! 2. naga writes MSL for the one entry point, with the binding map of the engine's explicit
//!    pipeline layout (group 0 bindings in binding order → buffer slots 0, 1, ...), no
//!    bounds-check code that would need buffer sizes (wgpu's passthrough path binds no
//!    `_buffer_sizes`; wgrad validates every extent on the host), and no immediates;
//! 3. the source is made strict: `#pragma METAL fp math_mode(safe)` and
//!    `#pragma METAL fp contract(off)` lead the file, and every transcendental call goes to
//!    `metal::precise::`;
//! 4. workgroup variables, which naga passes as `threadgroup` entry-point arguments (memory
//!    the passthrough path would never allocate), become `threadgroup` declarations inside the
//!    kernel body, so the Metal compiler allocates them statically.
//!
//! The engine feeds the result to `create_shader_module_passthrough`. [`strict_msl`] works on
//! every platform, so the translation of every registered kernel is generated and checked by
//! the tests on machines without a Mac.

use crate::kernel::{BindingKind, Constants, Kernel, entry_bindings, entry_index};
use crate::{Error, Result, ShaderChecks};
use naga::back::msl;

/// Functions that have a `metal::precise::` form and are routed to it.
pub const PRECISE_FUNCTIONS: &[&str] = &[
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cos", "cosh", "cospi", "divide",
    "exp", "exp10", "exp2", "log", "log10", "log2", "pow", "powr", "rsqrt", "sin", "sincos",
    "sinh", "sinpi", "sqrt", "tan", "tanh", "tanpi",
];

/// The pragmas that lead every strict MSL file.
pub const STRICT_PRAGMAS: &str =
    "#pragma METAL fp math_mode(safe)\n#pragma METAL fp contract(off)\n";

/// One entry point translated to strict MSL.
#[derive(Debug, Clone)]
pub struct StrictMsl {
    /// The MSL source.
    pub source: String,
    /// The entry point's name in the MSL (naga may rename).
    pub entry_name: String,
    /// Threads per threadgroup.
    pub workgroup_size: (u32, u32, u32),
}

fn kernel_error(kernel: &Kernel, message: impl std::fmt::Display) -> Error {
    Error::Kernel {
        kernel: kernel.name.into(),
        message: message.to_string(),
    }
}

/// Translate one entry point of `kernel` to strict MSL, with `constants` substituted (the
/// overrides not given keep their defaults), for an engine with [`ShaderChecks::Trusted`].
pub fn strict_msl(kernel: &Kernel, entry: &str, constants: &Constants) -> Result<StrictMsl> {
    strict_msl_with(kernel, entry, constants, ShaderChecks::Trusted)
}

/// [`strict_msl`] with the given run-time guards: `Guarded` clamps indices of fixed-size
/// arrays (workgroup and private memory) and bounds every loop, `Trusted` adds neither.
pub fn strict_msl_with(
    kernel: &Kernel,
    entry: &str,
    constants: &Constants,
    checks: ShaderChecks,
) -> Result<StrictMsl> {
    let (module, info) = kernel.specialized(entry, constants)?;
    let slots = entry_bindings(kernel, &module, &info, entry)?;
    let mut resources = msl::BindingMap::new();
    for (slot, s) in slots.iter().enumerate() {
        let target = msl::BindTarget {
            buffer: Some(slot as u8),
            mutable: s.kind == BindingKind::StorageReadWrite,
            ..Default::default()
        };
        resources.insert(
            naga::ResourceBinding {
                group: 0,
                binding: s.binding,
            },
            target,
        );
    }
    let mut options = msl::Options {
        lang_version: (2, 4),
        fake_missing_bindings: false,
        zero_initialize_workgroup_memory: true,
        force_loop_bounding: checks == ShaderChecks::Guarded,
        bounds_check_policies: match checks {
            ShaderChecks::Trusted => naga::proc::BoundsCheckPolicies::default(),
            // Buffer clamps would need the runtime-array sizes argument, which strict MSL drops.
            ShaderChecks::Guarded => naga::proc::BoundsCheckPolicies {
                index: naga::proc::BoundsCheckPolicy::Restrict,
                ..Default::default()
            },
        },
        ..Default::default()
    };
    options.per_entry_point_map.insert(
        entry.to_string(),
        msl::EntryPointResources {
            resources,
            immediates_buffer: None,
            // naga insists on a slot for runtime-array sizes; the argument is removed below.
            sizes_buffer: Some(slots.len() as u8),
        },
    );
    let pipeline_options = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
        ..Default::default()
    };
    let (source, translation) = msl::write_string(&module, &info, &options, &pipeline_options)
        .map_err(|e| kernel_error(kernel, format!("{entry}: msl: {e}")))?;
    let index = entry_index(kernel, &module, entry)?;
    let entry_name = translation
        .entry_point_names
        .into_iter()
        .flatten()
        .next()
        .ok_or_else(|| kernel_error(kernel, format!("{entry}: no MSL entry point written")))?;
    let [x, y, z] = module.entry_points[index].workgroup_size;
    let source = make_strict(&hoist_threadgroup(&source, &entry_name)?);
    Ok(StrictMsl {
        source,
        entry_name,
        workgroup_size: (x, y, z),
    })
}

/// Prepend the strict pragmas and route transcendental calls to `metal::precise::`.
pub fn make_strict(msl: &str) -> String {
    let mut out = String::with_capacity(msl.len() + 256);
    out.push_str(STRICT_PRAGMAS);
    let mut rest = msl;
    while let Some(pos) = rest.find("metal::") {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + "metal::".len()..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        let is_call = after[name_len..].starts_with('(');
        if is_call && PRECISE_FUNCTIONS.contains(&name) {
            out.push_str("metal::precise::");
        } else {
            out.push_str("metal::");
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Calls of transcendental functions that are not `metal::precise::` (empty for strict MSL).
pub fn imprecise_calls(msl: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (pos, _) in msl.match_indices("metal::") {
        let after = &msl[pos + "metal::".len()..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        if after[name_len..].starts_with('(') && PRECISE_FUNCTIONS.contains(&name) {
            found.push(name.to_string());
        }
    }
    // Unqualified calls (`exp(`) are the fast versions too under fast math.
    for name in PRECISE_FUNCTIONS {
        for (pos, _) in msl.match_indices(&format!("{name}(")) {
            let before = msl[..pos].chars().last();
            if before.is_some_and(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
                found.push(name.to_string());
            }
        }
    }
    found
}

/// Move `threadgroup T& name` parameters of the entry point into its body as
/// `threadgroup T name;`, so Metal allocates them statically, and replace the
/// `_buffer_sizes` argument (which the passthrough path never binds) by a reference to a
/// program-scope zero struct.
fn hoist_threadgroup(msl: &str, entry_name: &str) -> Result<String> {
    let Some(kernel_pos) = msl.find(&format!(" {entry_name}(")) else {
        return Ok(msl.to_string());
    };
    let params_start = kernel_pos + entry_name.len() + 2;
    let Some(body_rel) = msl[params_start..].find(") {") else {
        return Ok(msl.to_string());
    };
    let params_end = params_start + body_rel;
    let params: Vec<&str> = split_params(&msl[params_start..params_end]);
    let mut kept = Vec::new();
    let mut declarations = String::new();
    let mut sizes_removed = false;
    for p in params {
        let t = p.trim();
        if t.starts_with("constant _mslBufferSizes&") {
            // No sizes are bound by the passthrough path, and none are read (no arrayLength,
            // unchecked indexing): helpers that take the reference get one to zeros.
            declarations
                .push_str("    constant _mslBufferSizes& _buffer_sizes = wgrad_no_buffer_sizes;\n");
            sizes_removed = true;
        } else if let Some(decl) = t.strip_prefix("threadgroup ") {
            // `T& name` -> `threadgroup T name;`
            let Some(amp) = decl.rfind('&') else {
                return Err(Error::Kernel {
                    kernel: entry_name.into(),
                    message: format!("unexpected threadgroup parameter {t}"),
                });
            };
            let ty = decl[..amp].trim();
            let name = decl[amp + 1..].trim();
            declarations.push_str(&format!("    threadgroup {ty} {name};\n"));
        } else {
            kept.push(t.to_string());
        }
    }
    if declarations.is_empty() {
        return Ok(msl.to_string());
    }
    let mut out = String::with_capacity(msl.len() + declarations.len() + 64);
    let head = &msl[..params_start];
    let sizes_end = head
        .find("struct _mslBufferSizes {")
        .and_then(|p| head[p..].find("};\n").map(|q| p + q + 3));
    match sizes_end {
        Some(end) if sizes_removed => {
            out.push_str(&head[..end]);
            out.push_str("constant _mslBufferSizes wgrad_no_buffer_sizes = {};\n");
            out.push_str(&head[end..]);
        }
        _ => out.push_str(head),
    }
    out.push_str("\n  ");
    out.push_str(&kept.join("\n, "));
    out.push_str("\n) {\n");
    out.push_str(&declarations);
    out.push_str(&msl[params_end + 3..]);
    Ok(out)
}

/// Split a parameter list at top-level commas (not inside `<>`, `()` or `[[ ]]`).
fn split_params(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(&s[start..]);
    }
    out
}
