//! Kernel sources, the registry of every kernel wgrad ships, and the naga front end shared by
//! the pipeline cache (binding reflection) and the strict-MSL path.
//!
//! A kernel is one WGSL module assembled from parts: shared snippets of `wgsl/common/` followed
//! by a family's own file. The assembly is plain concatenation (WGSL module-scope declarations
//! are order independent), so a family file may use any function of the snippets it lists.

use crate::{Error, Result};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};

/// Shared WGSL: dtype codes and exact f32 ↔ f16/bf16 conversions.
pub const COMMON_DTYPE: &str = include_str!("../wgsl/common/dtype.wgsl");
/// Shared WGSL: linear workgroup index for folded launches.
pub const COMMON_LAUNCH: &str = include_str!("../wgsl/common/launch.wgsl");
/// Shared WGSL: fixed-order workgroup reductions (sum, max) over `WG` invocations.
pub const COMMON_REDUCE: &str = include_str!("../wgsl/common/reduce.wgsl");

/// Shared WGSL: the register rows' reductions (`lanes_sum`, `lanes_max`, `lanes_pairs`) as the
/// fan-in-8 trees of [`COMMON_REDUCE`].
pub const COMMON_ROWS: &str = include_str!("../wgsl/common/rows.wgsl");
/// Shared WGSL: the same functions with subgroup shuffles (naga takes the subgroup built-ins
/// without WGSL's `enable subgroups;`, which it does not parse yet; the device needs
/// `SUBGROUP`, and `reduce::subgroup_width` says when they may run).
pub const COMMON_ROWS_SUBGROUP: &str = include_str!("../wgsl/common/rows_subgroup.wgsl");

/// Shared WGSL: `lane_xor`, a lane's partner's value, for devices without subgroups (never
/// called there: the kernels that include it take one shuffle level a subgroup lane).
pub const COMMON_XOR: &str = include_str!("../wgsl/common/xor.wgsl");
/// Shared WGSL: `lane_xor` by a subgroup shuffle (the device needs `SUBGROUP`).
pub const COMMON_XOR_SUBGROUP: &str = include_str!("../wgsl/common/xor_subgroup.wgsl");

/// Shared WGSL: `tanh_accurate`, the tanh of the logit softcap (cross-entropy, fused linear).
pub const COMMON_SOFTCAP: &str = include_str!("../wgsl/common/softcap.wgsl");

/// Shared WGSL: the scalar activation formulas (`activation_eval(kind, x)` → (act, act′)).
pub const COMMON_ACTIVATION: &str = include_str!("../wgsl/common/activation.wgsl");

/// A family module assembled as `dtype`, `launch`, `reduce`, one of the row-reduction
/// snippets ([`COMMON_ROWS`] or [`COMMON_ROWS_SUBGROUP`]), further shared parts, then
/// `const WG` and the family file: `rows_module!(name, rows, [extra parts], wg, family)`.
macro_rules! rows_module {
    ($name:literal, $rows:expr, [$($extra:expr),*], $wg:literal, $family:expr) => {
        $crate::kernel::Kernel {
            name: $name,
            parts: &[
                $crate::kernel::COMMON_DTYPE,
                $crate::kernel::COMMON_LAUNCH,
                $crate::kernel::COMMON_REDUCE,
                $rows,
                $($extra,)*
                concat!("const WG: u32 = ", $wg, "u;"),
                $family,
            ],
        }
    };
}
pub(crate) use rows_module;

/// One WGSL module: a name and the parts it is assembled from, in order.
#[derive(Debug)]
pub struct Kernel {
    /// Unique name, also the pipeline-cache key's first part.
    pub name: &'static str,
    /// Source parts, concatenated in order.
    pub parts: &'static [&'static str],
}

impl Kernel {
    /// The assembled WGSL source.
    pub fn source(&self) -> String {
        let mut s = String::new();
        for (i, part) in self.parts.iter().enumerate() {
            s.push_str(&format!("// ---- {} part {} ----\n", self.name, i));
            s.push_str(part);
            s.push('\n');
        }
        s
    }

    /// Parse and validate the module with naga.
    pub fn module(&self) -> Result<(naga::Module, ModuleInfo)> {
        let source = self.source();
        let module = naga::front::wgsl::parse_str(&source).map_err(|e| Error::Kernel {
            kernel: self.name.into(),
            message: e.emit_to_string(&source),
        })?;
        let info = Validator::new(ValidationFlags::all(), Capabilities::all())
            .validate(&module)
            .map_err(|e| Error::Kernel {
                kernel: self.name.into(),
                message: e.emit_to_string(&source),
            })?;
        Ok((module, info))
    }

    /// The module with `constants` substituted for its overrides (the others keep their
    /// defaults), validated again, ready for a backend writer; for the compute entry `entry`.
    pub fn specialized(
        &self,
        entry: &str,
        constants: &Constants,
    ) -> Result<(naga::Module, ModuleInfo)> {
        let (module, info) = self.module()?;
        let mut pipeline_constants = naga::back::PipelineConstants::default();
        for (name, value) in constants {
            pipeline_constants.insert((*name).to_string(), *value);
        }
        let (module, info) = naga::back::pipeline_constants::process_overrides(
            &module,
            &info,
            Some((naga::ShaderStage::Compute, entry)),
            &pipeline_constants,
        )
        .map_err(|e| Error::Kernel {
            kernel: self.name.into(),
            message: format!("{entry}: overrides: {e}"),
        })?;
        Ok((module.into_owned(), info.into_owned()))
    }

    /// The workgroup size of the compute entry `entry` with `constants` substituted (sizes
    /// may be override expressions, e.g. the matmul tiles').
    pub fn workgroup_size(&self, entry: &str, constants: &Constants) -> Result<(u32, u32, u32)> {
        let (module, _) = self.specialized(entry, constants)?;
        let ep = module
            .entry_points
            .iter()
            .find(|e| e.name == entry)
            .ok_or_else(|| Error::Kernel {
                kernel: self.name.into(),
                message: format!("no entry point {entry}"),
            })?;
        let [x, y, z] = ep.workgroup_size;
        Ok((x, y, z))
    }

    /// The group-0 bindings the compute entry `entry` uses (those a launch of it must pass, in
    /// binding order): the globals its call graph reaches.
    pub fn bindings(&self, entry: &str) -> Result<Vec<BindingSlot>> {
        let (module, info) = self.module()?;
        entry_bindings(self, &module, &info, entry)
    }

    /// Names of the module's compute entry points.
    pub fn entry_points(&self) -> Result<Vec<String>> {
        let (module, _) = self.module()?;
        Ok(module
            .entry_points
            .iter()
            .filter(|e| e.stage == naga::ShaderStage::Compute)
            .map(|e| e.name.clone())
            .collect())
    }
}

/// Every kernel wgrad ships. Tests (strict MSL for each), the `check` example and the benches
/// walk this list, so a kernel that is not here is not shipped.
pub fn registry() -> &'static [&'static Kernel] {
    static REGISTRY: &[&Kernel] = &[
        &crate::cast::KERNEL,
        &crate::reduce::KERNEL,
        &crate::bench::COPY_KERNEL,
        &crate::norm::KERNEL,
        &crate::norm::KERNEL_MID,
        &crate::norm::KERNEL_WIDE,
        &crate::norm::KERNEL_SUBGROUP,
        &crate::norm::KERNEL_MID_SUBGROUP,
        &crate::norm::KERNEL_WIDE_SUBGROUP,
        &crate::activation::KERNEL,
        &crate::rope::KERNEL,
        &crate::loss::KERNEL,
        &crate::loss::ROWS_KERNEL,
        &crate::loss::KERNEL_SUBGROUP,
        &crate::loss::ROWS_KERNEL_SUBGROUP,
        &crate::grpo::KERNEL,
        &crate::preference::KERNEL,
        &crate::gated_delta::KERNEL,
        &crate::gated_delta::KERNEL_SUBGROUP,
        &crate::attention::KERNEL,
        &crate::matmul::KERNEL,
        &crate::matmul::TC_KERNEL,
        &crate::fused_linear::KERNEL,
        &crate::embedding::KERNEL,
        &crate::optim::KERNEL,
        &crate::mta::KERNEL,
        &crate::attn_res::KERNEL,
        &crate::mhc::KERNEL,
        &crate::vocab_parallel::KERNEL,
        &crate::moe::KERNEL,
    ];
    REGISTRY
}

/// How one binding of an entry point is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindingKind {
    /// `var<uniform>`: the launch's parameter struct.
    Uniform,
    /// `var<storage, read>`.
    StorageRead,
    /// `var<storage, read_write>`.
    StorageReadWrite,
}

/// One binding of group 0 used by an entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BindingSlot {
    /// `@binding(n)`.
    pub binding: u32,
    /// How it is used.
    pub kind: BindingKind,
    /// The fewest bytes the binding's type needs (one element of a runtime-sized array).
    pub min_bytes: u64,
}

/// The group-0 bindings an entry point uses, sorted by binding number. Only group 0 is allowed.
pub(crate) fn entry_bindings(
    kernel: &Kernel,
    module: &naga::Module,
    info: &ModuleInfo,
    entry: &str,
) -> Result<Vec<BindingSlot>> {
    let index = entry_index(kernel, module, entry)?;
    let function_info = info.get_entry_point(index);
    let mut slots = Vec::new();
    for (handle, var) in module.global_variables.iter() {
        if function_info[handle].is_empty() {
            continue;
        }
        let Some(binding) = &var.binding else {
            continue;
        };
        if binding.group != 0 {
            return Err(Error::Kernel {
                kernel: kernel.name.into(),
                message: format!(
                    "binding group {} used; kernels use group 0 only",
                    binding.group
                ),
            });
        }
        let kind = match var.space {
            naga::AddressSpace::Uniform => BindingKind::Uniform,
            naga::AddressSpace::Storage { access }
                if access.contains(naga::StorageAccess::STORE) =>
            {
                BindingKind::StorageReadWrite
            }
            naga::AddressSpace::Storage { .. } => BindingKind::StorageRead,
            other => {
                return Err(Error::Kernel {
                    kernel: kernel.name.into(),
                    message: format!("unsupported resource address space {other:?}"),
                });
            }
        };
        let min_bytes = module.types[var.ty]
            .inner
            .try_size(module.to_ctx())
            .map_or(0, u64::from);
        slots.push(BindingSlot {
            binding: binding.binding,
            kind,
            min_bytes,
        });
    }
    slots.sort_by_key(|s| s.binding);
    Ok(slots)
}

pub(crate) fn entry_index(kernel: &Kernel, module: &naga::Module, entry: &str) -> Result<usize> {
    module
        .entry_points
        .iter()
        .position(|e| e.name == entry && e.stage == naga::ShaderStage::Compute)
        .ok_or_else(|| Error::Kernel {
            kernel: kernel.name.into(),
            message: format!("no compute entry point named {entry}"),
        })
}

/// Specialization constants: WGSL `override` names and values.
pub type Constants = Vec<(&'static str, f64)>;
