//! What a Vulkan driver makes of wgrad's pipelines: each pipeline's strict SPIR-V (as the engine
//! built it, [`wgrad::Engine::built_spirv`]) compiled again on a device of the same driver that
//! has `VK_KHR_pipeline_executable_properties`, and the driver's statistics of it printed (on
//! NVIDIA: registers a lane, binary size, shared and local memory, the last as 2^36 plus the
//! bytes of spilled registers). wgpu creates its devices without that extension, hence a
//! second, raw device. With `dump_dir`, the driver's internal representations (where it gives
//! any) are written there, one file each.

use ash::vk;
use std::ffi::CStr;
use std::fmt::Write as _;

/// The driver's statistics of every pipeline, one line each: `kernel entry constants | name
/// value, ...`. `adapter` picks the physical device whose name contains it (the first one
/// without it).
pub fn report(
    built: &[wgrad::BuiltSpirv],
    adapter: Option<&str>,
    dump_dir: Option<&std::path::Path>,
) -> Result<String, String> {
    let (_entry, instance) = raw_instance()?;
    let result = with_instance(&instance, built, adapter, dump_dir);
    unsafe { instance.destroy_instance(None) };
    result
}

/// A Vulkan 1.3 instance of the system's loader, beside wgpu's (the entry must outlive it; the
/// caller destroys the instance).
fn raw_instance() -> Result<(ash::Entry, ash::Instance), String> {
    let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("Vulkan loader: {e}"))?;
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
    let instance = unsafe {
        entry.create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app),
            None,
        )
    }
    .map_err(|e| format!("instance: {e}"))?;
    Ok((entry, instance))
}

/// Each Vulkan device's float controls (Vulkan 1.2): whether it can keep FP32 subnormals
/// (`DenormPreserve`), flush them, keep signed zeros, infinities and NaNs, and round to
/// nearest even, as the SPIR-V execution modes of `SPV_KHR_float_controls` would ask. One line
/// a device.
pub fn float_controls() -> Result<String, String> {
    let (_entry, instance) = raw_instance()?;
    let mut out = String::new();
    let physicals = unsafe { instance.enumerate_physical_devices() };
    for p in physicals.map_err(|e| format!("devices: {e}"))? {
        let mut fc = vk::PhysicalDeviceFloatControlsProperties::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut fc);
        unsafe { instance.get_physical_device_properties2(p, &mut props) };
        let name = device_name(&props.properties);
        let _ = writeln!(
            out,
            "{name}: FP32 denorm preserve {}, flush to zero {}, signed zero/inf/NaN preserve {}, \
             round to nearest even {}; FP16 denorm preserve {}; denorm independence {:?}, \
             rounding independence {:?}",
            fc.shader_denorm_preserve_float32,
            fc.shader_denorm_flush_to_zero_float32,
            fc.shader_signed_zero_inf_nan_preserve_float32,
            fc.shader_rounding_mode_rte_float32,
            fc.shader_denorm_preserve_float16,
            fc.denorm_behavior_independence,
            fc.rounding_mode_independence,
        );
    }
    unsafe { instance.destroy_instance(None) };
    Ok(out)
}

/// Each Vulkan device's support for `VK_KHR_shader_bfloat16` (the extension, then its three
/// features), and its driver version: whether shaders may convert to BF16 in hardware; then the
/// cooperative-matrix configurations the driver lists (`VK_KHR_cooperative_matrix`), raw
/// component types included (BF16 is 1000141000, which wgpu does not map).
pub fn bf16_support() -> Result<String, String> {
    let (entry, instance) = raw_instance()?;
    let coop = ash::khr::cooperative_matrix::Instance::new(&entry, &instance);
    let mut out = String::new();
    let physicals = unsafe { instance.enumerate_physical_devices() };
    for p in physicals.map_err(|e| format!("devices: {e}"))? {
        let props = unsafe { instance.get_physical_device_properties(p) };
        let name = device_name(&props);
        let all = extension_names(&instance, p);
        let names: Vec<&String> = all
            .iter()
            .filter(|n| n.contains("bfloat16") || n.contains("float_controls2"))
            .collect();
        let mut bf = Bf16Features::default();
        let mut features = vk::PhysicalDeviceFeatures2 {
            p_next: (&mut bf as *mut Bf16Features).cast(),
            ..Default::default()
        };
        unsafe { instance.get_physical_device_features2(p, &mut features) };
        let _ = writeln!(
            out,
            "{name}: api {}.{}.{}, driver {:#x}; extensions {names:?}; shaderBFloat16Type {}, \
             DotProduct {}, CooperativeMatrix {}",
            vk::api_version_major(props.api_version),
            vk::api_version_minor(props.api_version),
            vk::api_version_patch(props.api_version),
            props.driver_version,
            bf.shader_bfloat16_type,
            bf.shader_bfloat16_dot_product,
            bf.shader_bfloat16_cooperative_matrix,
        );
        if all.iter().any(|n| n == "VK_KHR_cooperative_matrix") {
            let configs = unsafe { coop.get_physical_device_cooperative_matrix_properties(p) }
                .map_err(|e| format!("cooperative matrices: {e}"))?;
            for c in configs {
                let _ = writeln!(
                    out,
                    "  cooperative matrix {}x{}x{}: A {} B {} C {} result {} ({:?})",
                    c.m_size,
                    c.n_size,
                    c.k_size,
                    c.a_type.as_raw(),
                    c.b_type.as_raw(),
                    c.c_type.as_raw(),
                    c.result_type.as_raw(),
                    c.scope,
                );
            }
        }
    }
    unsafe { instance.destroy_instance(None) };
    Ok(out)
}

/// A physical device's name.
fn device_name(props: &vk::PhysicalDeviceProperties) -> String {
    props
        .device_name_as_c_str()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every extension name of a physical device.
fn extension_names(instance: &ash::Instance, p: vk::PhysicalDevice) -> Vec<String> {
    unsafe { instance.enumerate_device_extension_properties(p) }
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.extension_name_as_c_str().ok())
        .map(|n| n.to_string_lossy().into_owned())
        .collect()
}

/// `VkPhysicalDeviceShaderBfloat16FeaturesKHR` (newer than the `ash` release in use).
#[repr(C)]
struct Bf16Features {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    shader_bfloat16_type: vk::Bool32,
    shader_bfloat16_dot_product: vk::Bool32,
    shader_bfloat16_cooperative_matrix: vk::Bool32,
}

impl Default for Bf16Features {
    fn default() -> Self {
        Bf16Features {
            s_type: vk::StructureType::from_raw(1_000_141_000),
            p_next: std::ptr::null_mut(),
            shader_bfloat16_type: 0,
            shader_bfloat16_dot_product: 0,
            shader_bfloat16_cooperative_matrix: 0,
        }
    }
}

fn with_instance(
    instance: &ash::Instance,
    built: &[wgrad::BuiltSpirv],
    adapter: Option<&str>,
    dump_dir: Option<&std::path::Path>,
) -> Result<String, String> {
    let physicals =
        unsafe { instance.enumerate_physical_devices() }.map_err(|e| format!("devices: {e}"))?;
    let mut chosen = None;
    for p in physicals {
        let props = unsafe { instance.get_physical_device_properties(p) };
        let name = device_name(&props);
        if adapter.is_none_or(|a| name.contains(a)) {
            chosen = Some((p, name));
            break;
        }
    }
    let (physical, name) = chosen.ok_or("no Vulkan device matches")?;
    let extensions = unsafe { instance.enumerate_device_extension_properties(physical) }
        .map_err(|e| format!("extensions: {e}"))?;
    let has = |wanted: &CStr| {
        extensions
            .iter()
            .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == wanted))
    };
    if !has(ash::khr::pipeline_executable_properties::NAME) {
        return Err(format!("{name}: no VK_KHR_pipeline_executable_properties"));
    }
    let mut enabled = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
    let coop = has(ash::khr::cooperative_matrix::NAME);
    if coop {
        enabled.push(ash::khr::cooperative_matrix::NAME.as_ptr());
    }
    // Every feature the device has, so that any capability the SPIR-V declares is enabled.
    let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut cm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut features = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut v11)
        .push_next(&mut v12)
        .push_next(&mut v13)
        .push_next(&mut exec);
    if coop {
        features = features.push_next(&mut cm);
    }
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    let family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or("no compute queue")? as u32;
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&enabled)
        .push_next(&mut features);
    let device = unsafe { instance.create_device(physical, &info, None) }
        .map_err(|e| format!("device: {e}"))?;
    let result = with_device(instance, &device, built, &name, dump_dir);
    unsafe { device.destroy_device(None) };
    result
}

fn with_device(
    instance: &ash::Instance,
    device: &ash::Device,
    built: &[wgrad::BuiltSpirv],
    name: &str,
    dump_dir: Option<&std::path::Path>,
) -> Result<String, String> {
    let exec = ash::khr::pipeline_executable_properties::Device::new(instance, device);
    let mut out = format!(
        "pipeline statistics on {name} ({} pipelines)\n",
        built.len()
    );
    for (i, b) in built.iter().enumerate() {
        let _ = write!(out, "{} {} {} |", b.kernel, b.entry, b.constants);
        match unsafe { statistics(device, &exec, b) } {
            Ok((stats, reps)) => {
                out.push_str(&stats);
                if let Some(dir) = dump_dir {
                    for (j, (rep_name, text)) in reps.iter().enumerate() {
                        let file = dir.join(format!("{i:03}-{}-{}-{j}.txt", b.kernel, b.entry));
                        let head =
                            format!("{} {} {}\n{rep_name}\n", b.kernel, b.entry, b.constants);
                        std::fs::write(&file, head + text)
                            .map_err(|e| format!("{}: {e}", file.display()))?;
                    }
                }
            }
            Err(e) => {
                let _ = write!(out, " error: {e}");
            }
        }
        out.push('\n');
    }
    Ok(out)
}

type Representations = Vec<(String, String)>;

/// Compile one pipeline with statistics captured and return them as ` name value,` pairs, with
/// the internal representations' names and texts.
unsafe fn statistics(
    device: &ash::Device,
    exec: &ash::khr::pipeline_executable_properties::Device,
    b: &wgrad::BuiltSpirv,
) -> Result<(String, Representations), String> {
    let module = unsafe {
        device.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&b.words), None)
    }
    .map_err(|e| format!("module: {e}"))?;
    let bindings: Vec<vk::DescriptorSetLayoutBinding> = b
        .bindings
        .iter()
        .enumerate()
        .map(|(i, t)| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(i as u32)
                .descriptor_type(match t {
                    wgpu::BufferBindingType::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
                    _ => vk::DescriptorType::STORAGE_BUFFER,
                })
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let set_layout = unsafe {
        device.create_descriptor_set_layout(
            &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
            None,
        )
    }
    .map_err(|e| format!("set layout: {e}"))?;
    let layouts = [set_layout];
    let layout = unsafe {
        device.create_pipeline_layout(
            &vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts),
            None,
        )
    }
    .map_err(|e| format!("layout: {e}"))?;
    let entry_name = std::ffi::CString::new(b.entry_name.clone()).map_err(|e| e.to_string())?;
    let stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(&entry_name);
    let info = vk::ComputePipelineCreateInfo::default()
        .flags(
            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR,
        )
        .stage(stage)
        .layout(layout);
    let created =
        unsafe { device.create_compute_pipelines(vk::PipelineCache::null(), &[info], None) };
    let result = match created {
        Ok(pipelines) => {
            let p = pipelines[0];
            let r = unsafe { describe(exec, p) };
            unsafe { device.destroy_pipeline(p, None) };
            r
        }
        Err((_, e)) => Err(format!("pipeline: {e}")),
    };
    unsafe {
        device.destroy_pipeline_layout(layout, None);
        device.destroy_descriptor_set_layout(set_layout, None);
        device.destroy_shader_module(module, None);
    }
    result
}

unsafe fn describe(
    exec: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> Result<(String, Representations), String> {
    let executables = unsafe {
        exec.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))
    }
    .map_err(|e| format!("executables: {e}"))?;
    let mut out = String::new();
    let mut reps = Vec::new();
    for index in 0..executables.len() as u32 {
        let which = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(index);
        let stats = unsafe { exec.get_pipeline_executable_statistics(&which) }
            .map_err(|e| format!("statistics: {e}"))?;
        for s in &stats {
            let name = s
                .name_as_c_str()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            let value = unsafe {
                match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => s.value.b32.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                    _ => s.value.f64.to_string(),
                }
            };
            let _ = write!(out, " {name} {value},");
        }
        reps.extend(unsafe { representations(exec, &which) }?);
    }
    Ok((out, reps))
}

/// The executable's internal representations (two calls: sizes, then the texts).
unsafe fn representations(
    exec: &ash::khr::pipeline_executable_properties::Device,
    which: &vk::PipelineExecutableInfoKHR<'_>,
) -> Result<Representations, String> {
    let f = exec
        .fp()
        .get_pipeline_executable_internal_representations_khr;
    let mut count = 0u32;
    unsafe { f(exec.device(), which, &mut count, std::ptr::null_mut()) }
        .result()
        .map_err(|e| format!("representations: {e}"))?;
    let mut reps = vec![vk::PipelineExecutableInternalRepresentationKHR::default(); count as usize];
    unsafe { f(exec.device(), which, &mut count, reps.as_mut_ptr()) }
        .result()
        .map_err(|e| format!("representations: {e}"))?;
    let mut buffers: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
    for (r, buf) in reps.iter_mut().zip(buffers.iter_mut()) {
        r.p_data = buf.as_mut_ptr().cast();
    }
    unsafe { f(exec.device(), which, &mut count, reps.as_mut_ptr()) }
        .result()
        .map_err(|e| format!("representations: {e}"))?;
    Ok(reps
        .iter()
        .zip(buffers)
        .map(|(r, buf)| {
            let name = r.name_as_c_str().map(|n| n.to_string_lossy().into_owned());
            let text = if r.is_text == vk::TRUE {
                String::from_utf8_lossy(&buf)
                    .trim_end_matches('\0')
                    .to_string()
            } else {
                format!("({} bytes of binary)", buf.len())
            };
            (name.unwrap_or_default(), text)
        })
        .collect())
}
