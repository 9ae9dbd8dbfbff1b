//! The engine: device and queue, pipeline cache, batched submission, buffer pool, memory
//! statistics and GPU timing. Cheap to clone (an `Arc`), `Send + Sync`: one engine may be used
//! from several threads; recording is serialized by a lock, so ops from different threads
//! interleave whole. Engines built on one adapter share its device, which is never destroyed
//! (see [`EngineBuilder::build`]).

use crate::kernel::{BindingKind, BindingSlot, Constants, Kernel, entry_bindings};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Floating-point math mode of compiled kernels (part of the pipeline-cache key).
///
/// `Strict` (the default) compiles Metal kernels through wgrad's own strict MSL (safe math
/// mode, no contraction, precise transcendentals) and Vulkan kernels through wgrad's own
/// strict SPIR-V (`NoContraction` on every float arithmetic instruction, so no driver fuses,
/// reassociates or simplifies them; see [`crate::spirv`]). `Relaxed` hands the WGSL to wgpu,
/// whose translations leave those freedoms to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MathMode {
    /// IEEE-faithful math everywhere (default).
    #[default]
    Strict,
    /// The backend's default (fast math on Metal).
    Relaxed,
}

impl MathMode {
    /// `WGRAD_MATH_MODE=strict|relaxed`, if set.
    fn from_env() -> Result<Option<MathMode>> {
        match std::env::var("WGRAD_MATH_MODE")
            .ok()
            .filter(|v| !v.is_empty())
        {
            None => Ok(None),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "strict" => Ok(Some(MathMode::Strict)),
                "relaxed" => Ok(Some(MathMode::Relaxed)),
                _ => Err(Error::Device(format!(
                    "WGRAD_MATH_MODE={v:?}: expected \"strict\" or \"relaxed\""
                ))),
            },
        }
    }
}

/// Run-time guards the shader compiler adds to every kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ShaderChecks {
    /// No added guards (default). wgrad validates every shape, length and index bound on the
    /// host before it records a dispatch, and each kernel indexes only within the extents it
    /// was given, loops a bounded number of times and divides by validated non-zero sizes, so
    /// the guards would only cost instructions. Storage buffers stay protected wherever the
    /// driver itself enforces robust buffer access (Vulkan does on every adapter wgrad targets).
    #[default]
    Trusted,
    /// wgpu's guards: clamped array indices, an iteration bound on every loop, guarded integer
    /// division and buffer clamping where the driver does not do it. For debugging a kernel.
    Guarded,
}

impl ShaderChecks {
    fn runtime_checks(self) -> wgpu::ShaderRuntimeChecks {
        match self {
            ShaderChecks::Trusted => wgpu::ShaderRuntimeChecks::unchecked(),
            ShaderChecks::Guarded => wgpu::ShaderRuntimeChecks::checked(),
        }
    }

    /// `WGRAD_SHADER_CHECKS=guarded|trusted`, if set.
    fn from_env() -> Result<Option<ShaderChecks>> {
        match std::env::var("WGRAD_SHADER_CHECKS")
            .ok()
            .filter(|v| !v.is_empty())
        {
            None => Ok(None),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "trusted" => Ok(Some(ShaderChecks::Trusted)),
                "guarded" => Ok(Some(ShaderChecks::Guarded)),
                _ => Err(Error::Device(format!(
                    "WGRAD_SHADER_CHECKS={v:?}: expected \"trusted\" or \"guarded\""
                ))),
            },
        }
    }
}

/// Features wgrad uses when the adapter has them.
pub const WANTED_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::TIMESTAMP_QUERY)
    .union(wgpu::Features::PASSTHROUGH_SHADERS)
    .union(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);

/// Smallest limits wgrad runs with (`Engine::from_wgpu` checks them).
pub const MIN_STORAGE_BUFFERS_PER_STAGE: u32 = 8;
/// Every kernel is launched with at most this many threads per workgroup.
pub const MIN_INVOCATIONS_PER_WORKGROUP: u32 = 256;

/// What the engine runs on.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// Adapter name.
    pub adapter: String,
    /// Backend (Metal, Vulkan, ...).
    pub backend: wgpu::Backend,
    /// Device type (discrete, integrated, CPU, ...).
    pub device_type: wgpu::DeviceType,
    /// Driver name and version.
    pub driver: String,
    /// Features enabled on the device (of those wgrad asks for).
    pub features: wgpu::Features,
    /// Limits in force on the device.
    pub limits: wgpu::Limits,
    /// Math mode of compiled kernels.
    pub math_mode: MathMode,
    /// Whether strict Metal kernels go through wgrad's strict MSL (Metal + Strict + passthrough).
    pub strict_msl: bool,
    /// Whether strict Vulkan kernels go through wgrad's strict SPIR-V (Vulkan + Strict +
    /// passthrough).
    pub strict_spirv: bool,
    /// Run-time guards compiled into the kernels.
    pub shader_checks: ShaderChecks,
    /// The adapter's smallest subgroup size where the device has `SUBGROUP`, else 0.
    pub subgroup_min_size: u32,
    /// The adapter's largest subgroup size where the device has `SUBGROUP`, else 0.
    pub subgroup_max_size: u32,
    /// The cooperative-matrix (tensor-core) configurations the adapter reports, where the
    /// device has `EXPERIMENTAL_COOPERATIVE_MATRIX` and the engine knows the adapter (it
    /// created the device, or [`Engine::from_wgpu_adapter`]; [`Engine::from_wgpu`] has no
    /// adapter to ask: none).
    pub cooperative_matrices: Vec<wgpu::CooperativeMatrixProperties>,
}

impl std::fmt::Display for EngineInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({:?}, {:?}), driver {}; math {:?}{}{}; checks {:?}; features {:?}; max storage binding {} MiB, max workgroup storage {} KiB, max invocations {}, subgroups {}..={}",
            self.adapter,
            self.backend,
            self.device_type,
            self.driver,
            self.math_mode,
            if self.strict_msl { " (strict MSL)" } else { "" },
            if self.strict_spirv {
                " (strict SPIR-V)"
            } else {
                ""
            },
            self.shader_checks,
            self.features,
            self.limits.max_storage_buffer_binding_size >> 20,
            self.limits.max_compute_workgroup_storage_size >> 10,
            self.limits.max_compute_invocations_per_workgroup,
            self.subgroup_min_size,
            self.subgroup_max_size,
        )
    }
}

/// Memory held by the engine's tensors and pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes of buffers held by live tensors and in-flight scratch.
    pub live_bytes: u64,
    /// Highest `live_bytes` since creation or the last `reset_peak`.
    pub peak_bytes: u64,
    /// Bytes of free buffers kept for reuse.
    pub pooled_bytes: u64,
}

/// Where a measured time came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingSource {
    /// GPU timestamps around the recorded passes.
    Gpu,
    /// Host wall clock around record + submit + wait (adapter lacks TIMESTAMP_QUERY).
    WallClock,
}

/// One timed section.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Seconds from the first pass's start to the last pass's end (or wall clock).
    pub seconds: f64,
    /// How it was measured.
    pub source: TimingSource,
    /// Compute passes recorded in the section (consecutive dispatches share one pass; a copy,
    /// clear, upload or readback in between starts a new one).
    pub passes: u32,
    /// Passes that carried timestamps (less than `passes` when the section recorded more than
    /// 4,095 passes: the span then ends at the last stamped pass).
    pub stamped: u32,
}

/// One kernel entry's share of a profiled section ([`Engine::profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// The kernel (module) name, as in the `check` report and the operator registry.
    pub kernel: &'static str,
    /// The entry point.
    pub entry: String,
    /// Launches of this entry in the section.
    pub launches: u32,
    /// GPU seconds over those launches (the sum of each launch's pass, start to end).
    pub seconds: f64,
}

/// Options for [`Engine::new`]-style construction.
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    backends: Option<wgpu::Backends>,
    adapter_name: Option<String>,
    math_mode: Option<MathMode>,
    shader_checks: Option<ShaderChecks>,
    pool_limit: u64,
    workspace_bound: u64,
    binding_limit: Option<u64>,
}

/// Default per-call workspace bound: 1 GiB. It is also the default memory budget of the fused
/// linear losses' chunks (at a vocabulary of 128,256, 1,024 rows a chunk).
pub const DEFAULT_WORKSPACE_BOUND: u64 = 1 << 30;

impl Default for EngineBuilder {
    fn default() -> Self {
        EngineBuilder {
            backends: None,
            adapter_name: None,
            math_mode: None,
            shader_checks: None,
            pool_limit: 1 << 30,
            workspace_bound: DEFAULT_WORKSPACE_BOUND,
            binding_limit: None,
        }
    }
}

fn parse_backends(s: &str) -> Option<wgpu::Backends> {
    let mut out = wgpu::Backends::empty();
    for part in s.split(',') {
        out |= match part.trim().to_ascii_lowercase().as_str() {
            "metal" | "mtl" => wgpu::Backends::METAL,
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            _ => return None,
        };
    }
    Some(out)
}

impl EngineBuilder {
    /// Force a set of backends (overrides `WGRAD_BACKEND`/`WGPU_BACKEND`).
    pub fn backends(mut self, backends: wgpu::Backends) -> Self {
        self.backends = Some(backends);
        self
    }

    /// Pick the first adapter whose name contains this text, case-insensitive (overrides
    /// `WGRAD_ADAPTER`).
    pub fn adapter_name(mut self, name: impl Into<String>) -> Self {
        self.adapter_name = Some(name.into());
        self
    }

    /// Math mode of compiled kernels (default `Strict`; overrides `WGRAD_MATH_MODE`).
    pub fn math_mode(mut self, mode: MathMode) -> Self {
        self.math_mode = Some(mode);
        self
    }

    /// Run-time guards compiled into the kernels (default `Trusted`; overrides
    /// `WGRAD_SHADER_CHECKS`).
    pub fn shader_checks(mut self, checks: ShaderChecks) -> Self {
        self.shader_checks = Some(checks);
        self
    }

    /// Most bytes of free buffers the pool keeps (default 1 GiB).
    pub fn pool_limit(mut self, bytes: u64) -> Self {
        self.pool_limit = bytes;
        self
    }

    /// Most scratch bytes one op call may allocate beyond its outputs (default 1 GiB, [`DEFAULT_WORKSPACE_BOUND`]); ops
    /// needing more return `Error::WorkspaceExceeded`. Each op family has a
    /// `*_workspace_bytes` query.
    pub fn workspace_bound(mut self, bytes: u64) -> Self {
        self.workspace_bound = bytes;
        self
    }

    /// Bind at most this many bytes of a buffer at once (default: the device's
    /// `max_storage_buffer_binding_size`; a larger value keeps the device's). Ops that run over
    /// windows of rows (see [`Engine::max_binding_bytes`]) then take smaller windows; the others
    /// refuse tensors past it. For running as a device with a smaller limit would (a WebGPU
    /// browser's 128 MiB), and for testing the windows with small tensors.
    pub fn binding_limit(mut self, bytes: u64) -> Self {
        self.binding_limit = Some(bytes);
        self
    }

    /// Create the engine: Metal on Apple, Vulkan elsewhere; a hardware adapter when there is
    /// one, else a software one (lavapipe). Engines built on one adapter share its device and
    /// queue, made by the first build and kept until the process exits (destroying a Vulkan
    /// device while other threads use the GPU has deadlocked NVIDIA's driver); each keeps its
    /// own pool, statistics, pipeline cache and settings. A device error reaches the next
    /// flush or readback of whichever of its engines comes first.
    pub fn build(self) -> Result<Engine> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let backends = match self.backends {
            Some(b) => b,
            None => match env("WGRAD_BACKEND").or_else(|| env("WGPU_BACKEND")) {
                Some(s) => parse_backends(&s).ok_or_else(|| {
                    Error::NoAdapter(format!(
                        "unknown backend name {s:?} (metal, vulkan, gl, dx12)"
                    ))
                })?,
                None => wgpu::Backends::METAL | wgpu::Backends::VULKAN,
            },
        };
        let name = self.adapter_name.clone().or_else(|| env("WGRAD_ADAPTER"));
        let shared = shared_device(backends, name)?;
        let shader_checks = match self.shader_checks {
            Some(c) => c,
            None => ShaderChecks::from_env()?.unwrap_or_default(),
        };
        let math_mode = match self.math_mode {
            Some(m) => m,
            None => MathMode::from_env()?.unwrap_or_default(),
        };
        let cooperative_matrices = if shared
            .device
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            shared.adapter.cooperative_matrix_properties()
        } else {
            Vec::new()
        };
        Engine::assemble(
            shared.device,
            shared.queue,
            shared.adapter.get_info(),
            Settings {
                math_mode,
                shader_checks,
                pool_limit: self.pool_limit,
                workspace_bound: self.workspace_bound,
                binding_limit: self.binding_limit,
                cooperative_matrices,
            },
            Some(shared.errors),
        )
    }
}

/// A device wgrad created: shared by every engine [`EngineBuilder::build`] makes on its
/// adapter, and never destroyed (see [`shared_device`]).
#[derive(Clone)]
struct SharedDevice {
    adapter: wgpu::Adapter,
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The first uncaptured error of the device, taken by the next flush of any of its engines.
    errors: Arc<Mutex<Option<String>>>,
    /// Set by the device-lost callback: the next build makes a new device.
    lost: Arc<std::sync::atomic::AtomicBool>,
}

/// One set of backends: its instance, the adapters it found, the device in use on each (made
/// on first use) and the lost devices it replaced (kept, like the others, never destroyed).
struct BackendSet {
    backends: wgpu::Backends,
    _instance: wgpu::Instance,
    adapters: Vec<wgpu::Adapter>,
    devices: Vec<Option<SharedDevice>>,
    retired: Vec<SharedDevice>,
}

/// Every instance and device wgrad created in this process. Nothing in it is ever dropped:
/// destroying a Vulkan device while other threads submit work to the GPU deadlocked NVIDIA's
/// driver (580.159; `vkDestroyDevice` waiting on a driver thread while submissions and device
/// creations of other threads waited on the driver's locks: parallel test threads that each
/// built and dropped engines hung in 2 of 4 runs on an H200). So engines share their adapter's
/// device, made once under this lock, and an engine's drop frees its buffers and pipelines but
/// leaves the device.
static BACKEND_SETS: Mutex<Vec<BackendSet>> = Mutex::new(Vec::new());

/// The device of the best adapter of `backends` (a hardware adapter before a software one)
/// whose name contains `name` (case-insensitive), made on first use with the adapter's
/// features among [`WANTED_FEATURES`] and its limits, and made anew when the last one was lost
/// (its engines keep the lost one and get `Error::Device` from it).
fn shared_device(backends: wgpu::Backends, name: Option<String>) -> Result<SharedDevice> {
    let mut sets = lock(&BACKEND_SETS);
    let k = match sets.iter().position(|s| s.backends == backends) {
        Some(k) => k,
        None => {
            let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
            desc.backends = backends;
            let instance = wgpu::Instance::new(desc);
            let adapters = pollster::block_on(instance.enumerate_adapters(backends));
            let devices = vec![None; adapters.len()];
            sets.push(BackendSet {
                backends,
                _instance: instance,
                adapters,
                devices,
                retired: Vec::new(),
            });
            sets.len() - 1
        }
    };
    let set = &mut sets[k];
    let rank = |t: wgpu::DeviceType| match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let i = (0..set.adapters.len())
        .filter(|&i| {
            let n = set.adapters[i].get_info().name.to_ascii_lowercase();
            name.as_ref()
                .is_none_or(|want| n.contains(&want.to_ascii_lowercase()))
        })
        .min_by_key(|&i| rank(set.adapters[i].get_info().device_type))
        .ok_or_else(|| {
            let seen: Vec<String> = set
                .adapters
                .iter()
                .map(|a| format!("{} ({:?})", a.get_info().name, a.get_info().backend))
                .collect();
            Error::NoAdapter(format!(
                "backends {backends:?}, name filter {name:?}; adapters seen: {seen:?}. \
                 On Debian/Ubuntu without a GPU: apt-get install mesa-vulkan-drivers"
            ))
        })?;
    if let Some(d) = set.devices[i].take() {
        // A destroyed device calls its lost callback from wgpu's maintenance, which a
        // non-blocking poll runs (its result does not matter here).
        let _ = d.device.poll(wgpu::PollType::Poll);
        if !d.lost.load(std::sync::atomic::Ordering::SeqCst) {
            set.devices[i] = Some(d.clone());
            return Ok(d);
        }
        set.retired.push(d);
    }
    let adapter = set.adapters[i].clone();
    let features = adapter.features() & WANTED_FEATURES;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("wgrad"),
        required_features: features,
        required_limits: adapter.limits(),
        experimental_features: if features.intersects(
            wgpu::Features::PASSTHROUGH_SHADERS | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
        ) {
            // SAFETY: passthrough modules are only created from naga's translations of
            // validated modules (strict MSL, strict SPIR-V); cooperative matrices are
            // used only in configurations the adapter reports (`matmul::tensor_cores`).
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| Error::Device(format!("request_device: {e}")))?;
    // Device errors (out of memory, validation) come back as `Error::Device` from the next
    // flush or readback of an engine on the device instead of wgpu's default panic.
    let errors = Arc::new(Mutex::new(None::<String>));
    let sink = errors.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        let mut slot = lock(&sink);
        if slot.is_none() {
            *slot = Some(e.to_string());
        }
    }));
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = lost.clone();
    device.set_device_lost_callback(move |_, _| {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let d = SharedDevice {
        adapter,
        device,
        queue,
        errors,
        lost,
    };
    set.devices[i] = Some(d.clone());
    Ok(d)
}

/// The engine-wide settings [`Engine::assemble`] takes from the builder or `from_wgpu`.
struct Settings {
    math_mode: MathMode,
    shader_checks: ShaderChecks,
    pool_limit: u64,
    workspace_bound: u64,
    binding_limit: Option<u64>,
    cooperative_matrices: Vec<wgpu::CooperativeMatrixProperties>,
}

struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    slots: Vec<BindingSlot>,
    /// Strict SPIR-V engines: the kernel and constants its SPIR-V was made from (regenerated,
    /// not kept, by [`Engine::built_spirv`]).
    spirv_source: Option<(&'static Kernel, Constants)>,
}

/// One pipeline an engine has built from strict SPIR-V ([`Engine::built_spirv`]): what a
/// driver was given, for inspecting what it made of it (the `bench` example's
/// `--pipeline-stats` asks a Vulkan driver for its statistics of each).
#[derive(Clone, Debug)]
pub struct BuiltSpirv {
    /// The kernel's registry name.
    pub kernel: &'static str,
    /// The WGSL entry point.
    pub entry: String,
    /// The override constants it was specialized with (as the pipeline cache keys them).
    pub constants: String,
    /// The entry point's name in the SPIR-V module.
    pub entry_name: String,
    /// The module's words.
    pub words: Vec<u32>,
    /// The entry point's descriptor bindings of set 0, in binding-number order.
    pub bindings: Vec<wgpu::BufferBindingType>,
}

type PipelineKey = (&'static str, String, String, MathMode);

fn buffer_binding_type(kind: BindingKind) -> wgpu::BufferBindingType {
    match kind {
        BindingKind::Uniform => wgpu::BufferBindingType::Uniform,
        BindingKind::StorageRead => wgpu::BufferBindingType::Storage { read_only: true },
        BindingKind::StorageReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
    }
}

/// Recorded, not yet submitted work. Dispatches go into one open compute pass (wgpu orders
/// and synchronizes the dispatches within it); a buffer copy or clear ends the pass first.
struct Pending {
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    timing: Option<TimingState>,
    profile: Option<ProfileState>,
}

impl Pending {
    /// The encoder, with any open pass ended.
    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgrad"),
            })
        })
    }

    /// The open compute pass, begun on demand. While timing, each pass writes its end stamp
    /// (query i + 1 for pass i) and the first pass also its start stamp (query 0).
    fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let encoder = self.encoder.get_or_insert_with(|| {
                device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("wgrad"),
                })
            });
            let timestamp_writes = self.timing.as_mut().and_then(|t| {
                t.passes += 1;
                (t.passes <= t.capacity).then(|| wgpu::ComputePassTimestampWrites {
                    query_set: &t.queries,
                    beginning_of_pass_write_index: (t.passes == 1).then_some(0),
                    end_of_pass_write_index: Some(t.passes),
                })
            });
            let pass = encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("wgrad"),
                    timestamp_writes,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("pass begun above")
    }

    /// While profiling: a compute pass of its own for the next dispatch (any open pass ended),
    /// stamped at its start and end (queries 2i and 2i + 1 of dispatch i's set); the caller
    /// ends it after the dispatch.
    fn profiled_pass(
        &mut self,
        device: &wgpu::Device,
        kernel: &'static str,
        entry: &str,
    ) -> &mut wgpu::ComputePass<'static> {
        self.encoder(device);
        let encoder = self.encoder.as_mut().expect("begun above");
        let profile = self.profile.as_mut().expect("profiling");
        let i = profile.launches.len();
        if i / PROFILE_SET_LAUNCHES == profile.sets.len() {
            profile
                .sets
                .push(device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("wgrad profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2 * PROFILE_SET_LAUNCHES as u32,
                }));
        }
        profile.launches.push((kernel, entry.to_string()));
        let slot = (i % PROFILE_SET_LAUNCHES) as u32;
        let pass = encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgrad profile"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &profile.sets[i / PROFILE_SET_LAUNCHES],
                    beginning_of_pass_write_index: Some(2 * slot),
                    end_of_pass_write_index: Some(2 * slot + 1),
                }),
            })
            .forget_lifetime();
        self.pass.insert(pass)
    }

    /// The finished command buffer of everything recorded, if any.
    fn finish(&mut self) -> Option<wgpu::CommandBuffer> {
        self.pass = None;
        self.encoder.take().map(|e| e.finish())
    }
}

struct TimingState {
    queries: wgpu::QuerySet,
    capacity: u32,
    passes: u32,
}

/// Launches a profile's query set stamps (two timestamps each).
const PROFILE_SET_LAUNCHES: usize = wgpu::QUERY_SET_MAX_QUERIES as usize / 2;

struct ProfileState {
    sets: Vec<wgpu::QuerySet>,
    /// (kernel, entry) of each launch, in order.
    launches: Vec<(&'static str, String)>,
}

#[derive(Default)]
struct Pool {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    pooled: u64,
    live: u64,
    peak: u64,
}

pub(crate) struct Inner {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: EngineInfo,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Pipeline>>>,
    pending: Mutex<Pending>,
    pool: Mutex<Pool>,
    pool_limit: u64,
    workspace_bound: std::sync::atomic::AtomicU64,
    device_error: Arc<Mutex<Option<String>>>,
    /// Bound in place of a buffer smaller than one element of its binding (see `launch`).
    stand_in: wgpu::Buffer,
}

/// Bytes of [`Inner::stand_in`]: more than any binding's element.
const STAND_IN_BYTES: u64 = 256;

/// The engine's binding limit: the device's, or `cap` where that is smaller (at least 4
/// bytes and 4-byte granular, as binding sizes are; [`EngineBuilder::binding_limit`]).
fn capped_binding(device: u64, cap: Option<u64>) -> u64 {
    cap.map_or(device, |c| device.min(c.max(4) / 4 * 4))
}

/// One storage binding of a launch ([`Engine::launch_bound`]): bytes `offset..offset + size`
/// of `buffer`.
#[derive(Clone, Copy)]
pub(crate) struct Bind<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl<'a> Bind<'a> {
    /// The whole buffer.
    pub fn whole(buffer: &'a wgpu::Buffer) -> Bind<'a> {
        Bind {
            buffer,
            offset: 0,
            size: buffer.size(),
        }
    }

    /// A binding the kernel never reaches in this launch: an empty view, so the engine binds
    /// its stand-in there (no usage of `buffer`, which may be bound elsewhere in the launch;
    /// for bindings whose element is at most the stand-in's 256 bytes).
    pub fn unused(buffer: &'a wgpu::Buffer) -> Bind<'a> {
        Bind {
            buffer,
            offset: 0,
            size: 0,
        }
    }
}

/// The handle every operation runs through. See the module documentation.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", &self.inner.info)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these structures half-updated in a way that
    // matters (worst case a lost pooled buffer), so a poisoned lock is taken over.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Size class of a pooled buffer: a multiple of 256 bytes below 4 KiB, a multiple of 1 MiB
/// above 64 MiB (slack below 1.6%: a 1,002 MiB weight gradient takes 1,002 MiB, not the
/// 1,024 of the coarser classes), else rounded up to a multiple of one eighth of the next
/// power of two (slack below a quarter of the size).
pub(crate) fn size_class(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let bytes = bytes.max(4);
    if bytes <= 4096 {
        return bytes.div_ceil(256) * 256;
    }
    let step = if bytes > 64 * MIB {
        MIB
    } else {
        bytes.next_power_of_two() / 8
    };
    bytes.div_ceil(step) * step
}

/// A buffer lent by the engine's pool; goes back to the pool when dropped.
pub(crate) struct PooledBuffer {
    pub(crate) buffer: Option<wgpu::Buffer>,
    engine: std::sync::Weak<Inner>,
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let (Some(buffer), Some(inner)) = (self.buffer.take(), self.engine.upgrade()) {
            inner.release(buffer);
        }
    }
}

impl Inner {
    fn release(&self, buffer: wgpu::Buffer) {
        let size = buffer.size();
        let mut pool = lock(&self.pool);
        pool.live -= size;
        if pool.pooled + size <= self.pool_limit {
            pool.pooled += size;
            pool.free.entry(size).or_default().push(buffer);
        }
    }
}

impl Engine {
    /// An engine on the best adapter found (see [`EngineBuilder::build`]).
    pub fn new() -> Result<Engine> {
        EngineBuilder::default().build()
    }

    /// Options for creating an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Embed wgrad in an app that owns a device (strict math). The device must have at least
    /// [`MIN_STORAGE_BUFFERS_PER_STAGE`] storage buffers per stage and
    /// [`MIN_INVOCATIONS_PER_WORKGROUP`] invocations per workgroup, else
    /// `Error::InsufficientLimit` names the limit; features it has among [`WANTED_FEATURES`]
    /// are used, and an op that needs a missing one returns `Error::MissingFeature` naming it.
    /// Tensor-core products need the adapter's cooperative-matrix configurations, which a device
    /// cannot report: [`Engine::from_wgpu_adapter`] takes the adapter too.
    /// wgrad's work is submitted on `queue`, in order with the app's own submissions. The app's
    /// uncaptured-error handler stays in place (wgrad installs its own only on devices it
    /// creates).
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Result<Engine> {
        Engine::from_wgpu_with_mode(device, queue, MathMode::Strict)
    }

    /// [`Engine::from_wgpu`] with a chosen math mode.
    pub fn from_wgpu_with_mode(
        device: wgpu::Device,
        queue: wgpu::Queue,
        math_mode: MathMode,
    ) -> Result<Engine> {
        Engine::from_app(device, queue, math_mode, Vec::new())
    }

    /// [`Engine::from_wgpu`] given the adapter the app made its device from, so that the
    /// engine knows the adapter's cooperative-matrix configurations and can run tensor-core
    /// products (`matmul::tensor_cores`) when the device has
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`; otherwise the same as `from_wgpu`.
    pub fn from_wgpu_adapter(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
    ) -> Result<Engine> {
        let cooperative = if device
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            adapter.cooperative_matrix_properties()
        } else {
            Vec::new()
        };
        Engine::from_app(device, queue, MathMode::Strict, cooperative)
    }

    /// An engine on an app's device and queue (see [`Engine::from_wgpu`]).
    fn from_app(
        device: wgpu::Device,
        queue: wgpu::Queue,
        math_mode: MathMode,
        cooperative_matrices: Vec<wgpu::CooperativeMatrixProperties>,
    ) -> Result<Engine> {
        let adapter_info = device.adapter_info();
        let limits = device.limits();
        let checks: [(&'static str, u64, u64); 3] = [
            (
                "max_storage_buffers_per_shader_stage",
                limits.max_storage_buffers_per_shader_stage.into(),
                MIN_STORAGE_BUFFERS_PER_STAGE.into(),
            ),
            (
                "max_compute_invocations_per_workgroup",
                limits.max_compute_invocations_per_workgroup.into(),
                MIN_INVOCATIONS_PER_WORKGROUP.into(),
            ),
            (
                "max_compute_workgroup_size_x",
                limits.max_compute_workgroup_size_x.into(),
                MIN_INVOCATIONS_PER_WORKGROUP.into(),
            ),
        ];
        for (name, got, needed) in checks {
            if got < needed {
                return Err(Error::InsufficientLimit { name, got, needed });
            }
        }
        // The app keeps its own uncaptured-error handler: wgrad does not replace it.
        Engine::assemble(
            device,
            queue,
            adapter_info,
            Settings {
                math_mode,
                shader_checks: ShaderChecks::from_env()?.unwrap_or_default(),
                pool_limit: 1 << 30,
                workspace_bound: DEFAULT_WORKSPACE_BOUND,
                binding_limit: None,
                cooperative_matrices,
            },
            None,
        )
    }

    fn assemble(
        device: wgpu::Device,
        queue: wgpu::Queue,
        adapter: wgpu::AdapterInfo,
        settings: Settings,
        errors: Option<Arc<Mutex<Option<String>>>>,
    ) -> Result<Engine> {
        let Settings {
            math_mode,
            shader_checks,
            pool_limit,
            workspace_bound,
            binding_limit,
            cooperative_matrices,
        } = settings;
        let mut limits = device.limits();
        limits.max_storage_buffer_binding_size =
            capped_binding(limits.max_storage_buffer_binding_size, binding_limit);
        // A device wgrad made reports its uncaptured errors to `errors`; an app's device keeps
        // the app's handler, and the engine's slot stays empty.
        let device_error = errors.unwrap_or_default();
        let features = device.features();
        let strict_msl = adapter.backend == wgpu::Backend::Metal
            && math_mode == MathMode::Strict
            && features.contains(wgpu::Features::PASSTHROUGH_SHADERS);
        let strict_spirv = adapter.backend == wgpu::Backend::Vulkan
            && math_mode == MathMode::Strict
            && features.contains(wgpu::Features::PASSTHROUGH_SHADERS);
        let info = EngineInfo {
            adapter: adapter.name.clone(),
            backend: adapter.backend,
            device_type: adapter.device_type,
            driver: format!("{} {}", adapter.driver, adapter.driver_info)
                .trim()
                .to_string(),
            features: features & WANTED_FEATURES,
            limits,
            math_mode,
            strict_msl,
            strict_spirv,
            shader_checks,
            subgroup_min_size: if features.contains(wgpu::Features::SUBGROUP) {
                adapter.subgroup_min_size
            } else {
                0
            },
            subgroup_max_size: if features.contains(wgpu::Features::SUBGROUP) {
                adapter.subgroup_max_size
            } else {
                0
            },
            cooperative_matrices,
        };
        let stand_in = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgrad stand-in binding"),
            size: STAND_IN_BYTES,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(Engine {
            inner: Arc::new(Inner {
                stand_in,
                device,
                queue,
                info,
                pipelines: Mutex::new(HashMap::new()),
                pending: Mutex::new(Pending {
                    pass: None,
                    encoder: None,
                    timing: None,
                    profile: None,
                }),
                pool: Mutex::new(Pool::default()),
                pool_limit,
                workspace_bound: workspace_bound.into(),
                device_error,
            }),
        })
    }

    /// Adapter, backend, driver, features, limits and math mode.
    pub fn info(&self) -> &EngineInfo {
        &self.inner.info
    }

    /// The wgpu device (for apps that share it).
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    /// Another engine on this engine's device and queue (so the same features and limits)
    /// with the same settings, whose bindings hold at most `bytes`
    /// ([`EngineBuilder::binding_limit`]): for comparing windowed launches with whole ones on
    /// one device. It has a pool, statistics and pipeline cache of its own, and reports device
    /// errors where this engine's device does.
    pub(crate) fn with_binding_limit(&self, bytes: u64) -> Result<Engine> {
        let info = &self.inner.info;
        Engine::assemble(
            self.inner.device.clone(),
            self.inner.queue.clone(),
            self.inner.device.adapter_info(),
            Settings {
                math_mode: info.math_mode,
                shader_checks: info.shader_checks,
                pool_limit: self.inner.pool_limit,
                workspace_bound: self.workspace_bound(),
                binding_limit: Some(bytes),
                cooperative_matrices: info.cooperative_matrices.clone(),
            },
            Some(self.inner.device_error.clone()),
        )
    }

    /// `InsufficientLimit` unless the device allows `needed` storage buffers a shader stage
    /// (the kernels of a few ops bind more than [`MIN_STORAGE_BUFFERS_PER_STAGE`]).
    pub(crate) fn require_storage_buffers(&self, needed: u32) -> Result<()> {
        let got = self.inner.info.limits.max_storage_buffers_per_shader_stage;
        if got < needed {
            return Err(Error::InsufficientLimit {
                name: "max_storage_buffers_per_shader_stage",
                got: got.into(),
                needed: needed.into(),
            });
        }
        Ok(())
    }

    /// Whether two handles are the same engine.
    pub fn same(&self, other: &Engine) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Live, peak and pooled bytes.
    pub fn memory(&self) -> MemoryStats {
        let pool = lock(&self.inner.pool);
        MemoryStats {
            live_bytes: pool.live,
            peak_bytes: pool.peak,
            pooled_bytes: pool.pooled,
        }
    }

    /// Set the peak to the current live bytes.
    pub fn reset_peak(&self) {
        let mut pool = lock(&self.inner.pool);
        pool.peak = pool.live;
    }

    /// Free every pooled buffer.
    pub fn trim(&self) {
        let mut pool = lock(&self.inner.pool);
        pool.free.clear();
        pool.pooled = 0;
    }

    /// The per-call workspace bound in bytes (see [`EngineBuilder::workspace_bound`]).
    pub fn workspace_bound(&self) -> u64 {
        self.inner
            .workspace_bound
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Change the per-call workspace bound.
    pub fn set_workspace_bound(&self, bytes: u64) {
        self.inner
            .workspace_bound
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// `Error::WorkspaceExceeded` when `needed` scratch bytes exceed the bound. Every op that
    /// allocates scratch calls this before allocating.
    pub fn check_workspace(&self, what: &str, needed: u64) -> Result<()> {
        let bound = self.workspace_bound();
        if needed > bound {
            return Err(Error::WorkspaceExceeded {
                what: what.into(),
                needed,
                bound,
            });
        }
        Ok(())
    }

    /// The largest storage binding, in bytes: the device's `max_storage_buffer_binding_size`,
    /// or less with [`EngineBuilder::binding_limit`]. A tensor may be larger (up to
    /// [`Engine::max_tensor_bytes`]); ops bind whole tensors unless their documentation says
    /// they run over windows of rows, and return `Error::LimitExceeded` for a tensor past one
    /// binding otherwise.
    pub fn max_binding_bytes(&self) -> u64 {
        self.inner.info.limits.max_storage_buffer_binding_size
    }

    /// The largest tensor, in bytes: the device's `max_buffer_size`.
    pub fn max_tensor_bytes(&self) -> u64 {
        self.inner.info.limits.max_buffer_size
    }

    /// Where a storage binding may start: offsets are multiples of this many bytes (the
    /// device's `min_storage_buffer_offset_alignment`).
    pub fn binding_alignment(&self) -> u64 {
        u64::from(
            self.inner
                .info
                .limits
                .min_storage_buffer_offset_alignment
                .max(4),
        )
    }

    /// A storage buffer of at least `bytes` bytes from the pool (contents undefined).
    pub(crate) fn alloc(&self, bytes: u64, what: &str) -> Result<PooledBuffer> {
        let limit = self.max_tensor_bytes();
        if bytes > limit {
            return Err(Error::LimitExceeded {
                what: what.into(),
                bytes,
                limit,
                limit_name: "max_buffer_size",
            });
        }
        // A buffer within one binding stays within it (its size class is capped there); one
        // past it is allocated at its size (4-byte granular), so that a binding of all of it
        // names the tensor's bytes.
        let binding = self.max_binding_bytes();
        let class = if bytes <= binding {
            size_class(bytes).min(binding)
        } else {
            bytes.div_ceil(4) * 4
        };
        let mut pool = lock(&self.inner.pool);
        let reused = pool.free.get_mut(&class).and_then(|v| v.pop());
        let buffer = match reused {
            Some(b) => {
                pool.pooled -= class;
                b
            }
            None => {
                drop(pool);
                let b = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(what),
                    size: class,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                pool = lock(&self.inner.pool);
                b
            }
        };
        pool.live += class;
        pool.peak = pool.peak.max(pool.live);
        Ok(PooledBuffer {
            buffer: Some(buffer),
            engine: Arc::downgrade(&self.inner),
        })
    }

    /// Run `f` with the pending command encoder (created on demand).
    pub(crate) fn record<R>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> R {
        let mut pending = lock(&self.inner.pending);
        f(pending.encoder(&self.inner.device))
    }

    /// Record a copy of host bytes into `dest` (ordered after everything recorded before).
    /// `Error::Device` when the device cannot map a staging buffer (a lost device).
    pub(crate) fn upload(&self, dest: &wgpu::Buffer, bytes: &[u8]) -> Result<()> {
        // Through staging buffers of at most 256 MiB each, so that a tensor of gigabytes
        // does not need a mapped buffer of its size.
        const PIECE: usize = 256 << 20;
        for (k, piece) in bytes.chunks(PIECE).enumerate() {
            let padded = piece.len().div_ceil(4) * 4;
            let staging =
                self.mapped_buffer("wgrad upload", wgpu::BufferUsages::COPY_SRC, piece, padded)?;
            let at = (k * PIECE) as u64;
            self.record(|enc| enc.copy_buffer_to_buffer(&staging, 0, dest, at, padded as u64));
        }
        Ok(())
    }

    /// A buffer of `size` bytes (a multiple of 4, at least `bytes.len()`) holding `bytes` then
    /// zeros, written through its mapping at creation; `Error::Device` where the device cannot
    /// map it (a lost device).
    fn mapped_buffer(
        &self,
        label: &str,
        usage: wgpu::BufferUsages,
        bytes: &[u8],
        size: usize,
    ) -> Result<wgpu::Buffer> {
        let buffer = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size as u64,
            usage,
            mapped_at_creation: true,
        });
        {
            let mut view = buffer
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| Error::Device(format!("{label}: {e}")))?;
            view.slice(..bytes.len()).copy_from_slice(bytes);
            view.slice(bytes.len()..).fill(0);
        }
        buffer.unmap();
        Ok(buffer)
    }

    /// Record zero-filling the first `bytes` (a multiple of 4) of `dest`.
    pub(crate) fn zero(&self, dest: &wgpu::Buffer, bytes: u64) {
        if bytes > 0 {
            self.record(|enc| enc.clear_buffer(dest, 0, Some(bytes)));
        }
    }

    fn take_error(&self) -> Result<()> {
        match lock(&self.inner.device_error).take() {
            Some(message) => Err(Error::Device(message)),
            None => Ok(()),
        }
    }

    /// Submit everything recorded so far (does not wait).
    pub fn flush(&self) -> Result<()> {
        // Submit under the lock: another thread must not record into (and submit) a newer
        // encoder before this one reaches the queue.
        let mut pending = lock(&self.inner.pending);
        if let Some(commands) = pending.finish() {
            self.inner.queue.submit([commands]);
        }
        drop(pending);
        self.take_error()
    }

    /// Submit and wait until the GPU has finished all recorded work.
    pub fn synchronize(&self) -> Result<()> {
        self.flush()?;
        self.inner
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| Error::Device(format!("poll: {e}")))?;
        self.take_error()
    }

    /// Copy `bytes` bytes of `source` back to the host (submits and waits).
    pub(crate) fn read_bytes(
        &self,
        source: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let padded = bytes.div_ceil(4) * 4;
        let staging = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgrad readback"),
            size: padded,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
            mapped_at_creation: false,
        });
        self.record(|enc| enc.copy_buffer_to_buffer(source, offset, &staging, 0, padded));
        self.flush()?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |r| drop(tx.send(r)));
        self.inner
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| Error::Device(format!("poll: {e}")))?;
        rx.recv()
            .map_err(|e| Error::Device(format!("map: {e}")))?
            .map_err(|e| Error::Device(format!("map: {e}")))?;
        let data = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Device(format!("map: {e}")))?[..bytes as usize]
            .to_vec();
        staging.unmap();
        self.take_error()?;
        Ok(data)
    }

    fn pipeline(
        &self,
        kernel: &'static Kernel,
        entry: &str,
        constants: &Constants,
    ) -> Result<Arc<Pipeline>> {
        let key: PipelineKey = (
            kernel.name,
            entry.to_string(),
            format!("{constants:?}"),
            self.inner.info.math_mode,
        );
        if let Some(p) = lock(&self.inner.pipelines).get(&key) {
            return Ok(p.clone());
        }
        let (module, info) = kernel.module()?;
        let slots = entry_bindings(kernel, &module, &info, entry)?;
        let device = &self.inner.device;
        let entries: Vec<wgpu::BindGroupLayoutEntry> = slots
            .iter()
            .map(|s| wgpu::BindGroupLayoutEntry {
                binding: s.binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: buffer_binding_type(s.kind),
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(kernel.name),
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(kernel.name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let constant_refs: Vec<(&str, f64)> = constants.iter().map(|(k, v)| (*k, *v)).collect();
        let strict = if self.inner.info.strict_msl {
            let msl = crate::msl::strict_msl_with(
                kernel,
                entry,
                constants,
                self.inner.info.shader_checks,
            )?;
            Some((msl.entry_name, msl.workgroup_size, Some(msl.source), None))
        } else if self.inner.info.strict_spirv {
            let spirv = crate::spirv::strict_spirv_with(
                kernel,
                entry,
                constants,
                self.inner.info.shader_checks,
            )?;
            Some((
                spirv.entry_name,
                spirv.workgroup_size,
                None,
                Some(spirv.words),
            ))
        } else {
            None
        };
        let info = &self.inner.info;
        let spirv_source =
            (info.strict_spirv && !info.strict_msl).then(|| (kernel, constants.clone()));
        let pipeline = if let Some((entry_name, workgroup_size, msl, spirv)) = strict {
            let entry_points = [wgpu::PassthroughShaderEntryPoint {
                name: entry_name.clone().into(),
                workgroup_size,
            }];
            // SAFETY: the MSL or SPIR-V is naga's translation of a validated module with the
            // constants substituted (strict MSL; strict SPIR-V adds `NoContraction`, which changes
            // no interface), bound with the slot map of `pipeline_layout` (group 0 entries in
            // binding order; Vulkan numbers them by position, as `spirv` does).
            let module = unsafe {
                device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                    label: Some(kernel.name),
                    entry_points: entry_points.as_slice().into(),
                    msl: msl.map(Into::into),
                    spirv: spirv.map(Into::into),
                    ..Default::default()
                })
            };
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.name),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(&entry_name),
                compilation_options: Default::default(),
                cache: None,
            })
        } else {
            let descriptor = wgpu::ShaderModuleDescriptor {
                label: Some(kernel.name),
                source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
            };
            // SAFETY: with `ShaderChecks::Trusted` the guards are dropped on the contract stated
            // there: every dispatch is recorded after host validation of its shapes and bounds.
            let module = unsafe {
                device.create_shader_module_trusted(
                    descriptor,
                    self.inner.info.shader_checks.runtime_checks(),
                )
            };
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.name),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constant_refs,
                    zero_initialize_workgroup_memory: true,
                },
                cache: None,
            })
        };
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Kernel {
                kernel: kernel.name.into(),
                message: format!("{entry}: {e}"),
            });
        }
        let p = Arc::new(Pipeline {
            pipeline,
            layout,
            slots,
            spirv_source,
        });
        lock(&self.inner.pipelines).insert(key, p.clone());
        Ok(p)
    }

    /// The strict SPIR-V of every pipeline built so far, sorted by kernel, entry and constants
    /// (empty unless the engine runs strict SPIR-V, the Vulkan default), made again from the
    /// kernels: the same words the driver was given.
    pub fn built_spirv(&self) -> Result<Vec<BuiltSpirv>> {
        let mut sources: Vec<_> = lock(&self.inner.pipelines)
            .iter()
            .filter_map(|((_, entry, key, _), p)| {
                let (kernel, constants) = p.spirv_source.clone()?;
                let bindings: Vec<_> = p
                    .slots
                    .iter()
                    .map(|s| buffer_binding_type(s.kind))
                    .collect();
                Some((kernel, entry.clone(), key.clone(), constants, bindings))
            })
            .collect();
        sources.sort_by(|a, b| (a.0.name, &a.1, &a.2).cmp(&(b.0.name, &b.1, &b.2)));
        sources
            .into_iter()
            .map(|(kernel, entry, key, constants, bindings)| {
                let spirv = crate::spirv::strict_spirv_with(
                    kernel,
                    &entry,
                    &constants,
                    self.inner.info.shader_checks,
                )?;
                Ok(BuiltSpirv {
                    kernel: kernel.name,
                    entry,
                    constants: key,
                    entry_name: spirv.entry_name,
                    words: spirv.words,
                    bindings,
                })
            })
            .collect()
    }

    /// Number of compiled pipelines in the cache.
    pub fn cached_pipelines(&self) -> usize {
        lock(&self.inner.pipelines).len()
    }

    /// Compile (or fetch from the cache) a kernel entry point without running it.
    pub fn prepare(
        &self,
        kernel: &'static Kernel,
        entry: &str,
        constants: &Constants,
    ) -> Result<()> {
        self.pipeline(kernel, entry, constants).map(|_| ())
    }

    /// Record one dispatch: the shared launch path of every operator.
    ///
    /// `buffers` are bound to the entry point's storage bindings in binding order; `params`
    /// (any `encase` uniform struct) to its uniform binding, if it has one. `groups` workgroups
    /// are dispatched, folded into (x, y) past 65,535 per dimension; kernels recover the
    /// linear index with `group_index` (`wgsl/common/launch.wgsl`) and return early past the
    /// end.
    pub fn launch<P: encase::ShaderType + encase::internal::WriteInto>(
        &self,
        kernel: &'static Kernel,
        entry: &str,
        constants: &Constants,
        params: &P,
        buffers: &[&wgpu::Buffer],
        groups: u64,
    ) -> Result<()> {
        let whole: Vec<Bind> = buffers.iter().map(|b| Bind::whole(b)).collect();
        self.launch_bound(kernel, entry, constants, params, &whole, groups)
    }

    /// [`Engine::launch`] with each storage binding a byte range of its buffer ([`Bind`]):
    /// how an op runs a kernel over a window of a tensor larger than one binding. Every range
    /// must fit the binding limit ([`Engine::max_binding_bytes`]; `Error::LimitExceeded`
    /// naming the kernel, entry and binding otherwise, before anything is recorded) and start
    /// at a multiple of `min_storage_buffer_offset_alignment` ([`Engine::binding_alignment`]).
    pub(crate) fn launch_bound<P: encase::ShaderType + encase::internal::WriteInto>(
        &self,
        kernel: &'static Kernel,
        entry: &str,
        constants: &Constants,
        params: &P,
        buffers: &[Bind],
        groups: u64,
    ) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        let limit = self.max_binding_bytes();
        let align = self.binding_alignment();
        for (i, b) in buffers.iter().enumerate() {
            if b.size > limit {
                return Err(Error::LimitExceeded {
                    what: format!("{}.{entry}: storage binding {i}", kernel.name),
                    bytes: b.size,
                    limit,
                    limit_name: "max_storage_buffer_binding_size",
                });
            }
            if b.offset % align != 0 || b.offset + b.size > b.buffer.size() {
                return Err(Error::Kernel {
                    kernel: kernel.name.into(),
                    message: format!(
                        "{entry}: binding {i} at bytes {}..{} of a {}-byte buffer (offsets \
                         multiples of {align})",
                        b.offset,
                        b.offset + b.size,
                        b.buffer.size()
                    ),
                });
            }
        }
        let pipeline = self.pipeline(kernel, entry, constants)?;
        let storage_slots = pipeline
            .slots
            .iter()
            .filter(|s| s.kind != BindingKind::Uniform)
            .count();
        if storage_slots != buffers.len() {
            return Err(Error::Kernel {
                kernel: kernel.name.into(),
                message: format!(
                    "{entry}: {} buffers passed, {storage_slots} bound",
                    buffers.len()
                ),
            });
        }
        let mut uniform = encase::UniformBuffer::new(Vec::<u8>::new());
        uniform
            .write(params)
            .map_err(|e| Error::Device(format!("params: {e}")))?;
        let uniform_bytes = uniform.into_inner();
        let needs_uniform = pipeline
            .slots
            .iter()
            .any(|s| s.kind == BindingKind::Uniform);
        let uniform_buffer = if needs_uniform {
            let size = uniform_bytes.len().max(16).div_ceil(4) * 4;
            Some(self.mapped_buffer(
                "wgrad params",
                wgpu::BufferUsages::UNIFORM,
                &uniform_bytes,
                size,
            )?)
        } else {
            None
        };
        // A buffer smaller than one element of its binding (an app's tensor of fewer than 16
        // bytes under a 16-byte view, which the kernel reads value by value): read-only, it is
        // bound as a copy of its words in a buffer of at least that element; writable, or
        // empty, it holds nothing the kernel may access there, and the engine's stand-in is
        // bound instead, so that the binding is valid.
        let storage_slots = pipeline
            .slots
            .iter()
            .filter(|s| s.kind != BindingKind::Uniform);
        let mut padded = Vec::new();
        for (s, b) in storage_slots.zip(buffers) {
            let copy = if s.kind == BindingKind::StorageRead && b.size >= 4 && b.size < s.min_bytes
            {
                let copy = self.alloc(s.min_bytes, "wgrad padded binding")?;
                let words = b.size / 4 * 4;
                let to = copy.buffer.as_ref().expect("live pooled buffer");
                self.record(|enc| enc.copy_buffer_to_buffer(b.buffer, b.offset, to, 0, words));
                Some(copy)
            } else {
                None
            };
            padded.push(copy);
        }
        let mut storage = buffers.iter().zip(&padded);
        let entries: Vec<wgpu::BindGroupEntry> = pipeline
            .slots
            .iter()
            .map(|s| wgpu::BindGroupEntry {
                binding: s.binding,
                resource: match s.kind {
                    BindingKind::Uniform => uniform_buffer
                        .as_ref()
                        .expect("uniform")
                        .as_entire_binding(),
                    _ => {
                        let (b, copy) = storage.next().expect("counted above");
                        if let Some(copy) = copy {
                            copy.buffer
                                .as_ref()
                                .expect("live pooled buffer")
                                .as_entire_binding()
                        } else if b.size < s.min_bytes && s.min_bytes <= STAND_IN_BYTES {
                            self.inner.stand_in.as_entire_binding()
                        } else if b.offset == 0 && b.size == b.buffer.size() {
                            b.buffer.as_entire_binding()
                        } else {
                            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: b.buffer,
                                offset: b.offset,
                                size: std::num::NonZeroU64::new(b.size),
                            })
                        }
                    }
                },
            })
            .collect();
        let bind_group = self
            .inner
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel.name),
                layout: &pipeline.layout,
                entries: &entries,
            });
        let max_dim = u64::from(
            self.inner
                .info
                .limits
                .max_compute_workgroups_per_dimension
                .max(1),
        );
        let y = groups.div_ceil(max_dim);
        let x = groups.div_ceil(y);
        if y > max_dim {
            return Err(Error::bounds(
                format!("{} workgroups", kernel.name),
                groups,
                1,
                max_dim * max_dim,
            ));
        }
        let mut pending = lock(&self.inner.pending);
        let profiling = pending.profile.is_some();
        let pass = if profiling {
            pending.profiled_pass(&self.inner.device, kernel.name, entry)
        } else {
            pending.pass(&self.inner.device)
        };
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(x as u32, y as u32, 1);
        if profiling {
            pending.pass = None;
        }
        Ok(())
    }

    /// Time the GPU work that `f` records. With TIMESTAMP_QUERY: the span from the first
    /// recorded pass's start to the last one's end, by GPU timestamps (at most 4,095 passes are
    /// stamped). Without it: wall clock around recording, submission and completion. Work
    /// recorded before the call is submitted first and not counted. Work recorded by other
    /// threads during `f` is counted, and so is other engines' work on the same device (they
    /// share its queue) that runs between the section's first and last pass.
    ///
    /// One section at a time per engine: a nested or concurrent call returns
    /// `Error::TimingInProgress`.
    pub fn time<R>(&self, f: impl FnOnce() -> R) -> Result<(R, Timing)> {
        if self.timing_open() {
            return Err(Error::TimingInProgress);
        }
        self.synchronize()?;
        if !self
            .inner
            .info
            .features
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            let start = Instant::now();
            let r = f();
            self.synchronize()?;
            return Ok((
                r,
                Timing {
                    seconds: start.elapsed().as_secs_f64(),
                    source: TimingSource::WallClock,
                    passes: 0,
                    stamped: 0,
                },
            ));
        }
        const CAPACITY: u32 = wgpu::QUERY_SET_MAX_QUERIES - 1;
        let queries = self
            .inner
            .device
            .create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("wgrad timing"),
                ty: wgpu::QueryType::Timestamp,
                count: CAPACITY + 1,
            });
        lock(&self.inner.pending).timing = Some(TimingState {
            queries,
            capacity: CAPACITY,
            passes: 0,
        });
        let r = f();
        let state = lock(&self.inner.pending)
            .timing
            .take()
            .expect("timing state");
        if state.passes == 0 {
            return Ok((
                r,
                Timing {
                    seconds: 0.0,
                    source: TimingSource::Gpu,
                    passes: 0,
                    stamped: 0,
                },
            ));
        }
        let stamped = state.passes.min(state.capacity);
        let stamps = self.read_timestamps(&[(&state.queries, stamped + 1)])?;
        let first = stamps[0];
        let last = stamps[stamps.len() - 1];
        let period = f64::from(self.inner.queue.get_timestamp_period());
        Ok((
            r,
            Timing {
                seconds: last.saturating_sub(first) as f64 * period * 1e-9,
                source: TimingSource::Gpu,
                passes: state.passes,
                stamped,
            },
        ))
    }
}

impl Engine {
    /// The first `count` timestamps of each query set, in order: resolved into one buffer and
    /// read back once.
    fn read_timestamps(&self, sets: &[(&wgpu::QuerySet, u32)]) -> Result<Vec<u64>> {
        // Each set's stamps start at a multiple of the resolve alignment (256 bytes).
        let offsets: Vec<u64> = sets
            .iter()
            .scan(0u64, |at, &(_, count)| {
                let here = *at;
                *at += (u64::from(count) * 8).div_ceil(256) * 256;
                Some(here)
            })
            .collect();
        let Some((&last, &(_, last_count))) = offsets.last().zip(sets.last()) else {
            return Ok(Vec::new());
        };
        let bytes = last + u64::from(last_count) * 8;
        let resolve = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgrad timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        self.record(|enc| {
            for (&(set, count), &at) in sets.iter().zip(&offsets) {
                enc.resolve_query_set(set, 0..count, &resolve, at);
            }
        });
        let raw = self.read_bytes(&resolve, 0, bytes)?;
        let word =
            |i: usize| u64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        Ok(sets
            .iter()
            .zip(&offsets)
            .flat_map(|(&(_, count), &at)| (0..count as usize).map(move |j| (at / 8) as usize + j))
            .map(word)
            .collect())
    }

    /// Whether a timed or profiled section is open.
    fn timing_open(&self) -> bool {
        let pending = lock(&self.inner.pending);
        pending.timing.is_some() || pending.profile.is_some()
    }

    /// Profile the GPU work that `f` records: each launch runs in a compute pass of its own,
    /// stamped at its start and end, and the result is every kernel entry's launches and GPU
    /// seconds (the sum of its launches' spans), in the order of first launch. Launches in
    /// passes of their own can take a little longer than in a shared pass, so the totals are a
    /// breakdown, not a replacement for [`Engine::time`]. Work recorded before the call is
    /// submitted first and not counted; launches recorded by other threads during `f` are.
    ///
    /// `Error::MissingFeature` without `TIMESTAMP_QUERY`; one timed or profiled section at a
    /// time per engine (`Error::TimingInProgress`).
    pub fn profile<R>(&self, f: impl FnOnce() -> R) -> Result<(R, Vec<KernelTime>)> {
        if !self
            .inner
            .info
            .features
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Err(Error::MissingFeature {
                features: "TIMESTAMP_QUERY".into(),
            });
        }
        if self.timing_open() {
            return Err(Error::TimingInProgress);
        }
        self.synchronize()?;
        lock(&self.inner.pending).profile = Some(ProfileState {
            sets: Vec::new(),
            launches: Vec::new(),
        });
        let r = f();
        let state = lock(&self.inner.pending)
            .profile
            .take()
            .expect("profile state");
        let sets: Vec<(&wgpu::QuerySet, u32)> = state
            .sets
            .iter()
            .enumerate()
            .map(|(s, set)| {
                let launches =
                    (state.launches.len() - s * PROFILE_SET_LAUNCHES).min(PROFILE_SET_LAUNCHES);
                (set, 2 * launches as u32)
            })
            .collect();
        let stamps = self.read_timestamps(&sets)?;
        let period = f64::from(self.inner.queue.get_timestamp_period());
        let mut times: Vec<KernelTime> = Vec::new();
        for (i, (kernel, entry)) in state.launches.into_iter().enumerate() {
            let seconds = stamps[2 * i + 1].saturating_sub(stamps[2 * i]) as f64 * period * 1e-9;
            match times
                .iter_mut()
                .find(|t| t.kernel == kernel && t.entry == entry)
            {
                Some(t) => {
                    t.launches += 1;
                    t.seconds += seconds;
                }
                None => times.push(KernelTime {
                    kernel,
                    entry,
                    launches: 1,
                    seconds,
                }),
            }
        }
        Ok((r, times))
    }
}

#[cfg(test)]
mod tests {
    use super::{capped_binding, size_class};

    #[test]
    fn a_binding_cap_only_lowers_the_device_limit() {
        let device = 2047 << 20;
        assert_eq!(capped_binding(device, None), device);
        assert_eq!(capped_binding(device, Some(1 << 20)), 1 << 20);
        assert_eq!(capped_binding(device, Some(u64::MAX)), device);
        assert_eq!(capped_binding(device, Some(1_000_003)), 1_000_000);
        assert_eq!(capped_binding(device, Some(0)), 4);
    }

    /// Classes hold their request, grow with it, and waste little: under a quarter up to
    /// 64 MiB, under 1 MiB above (a 1,002 MiB buffer takes 1,002 MiB).
    #[test]
    fn size_classes_hold_their_request_with_bounded_slack() {
        const MIB: u64 = 1 << 20;
        let mut last = 0;
        let mut n = 1u64;
        while n < 3 << 30 {
            for bytes in [n, n + 1, n * 3 / 2, n * 2 - 1] {
                let class = size_class(bytes);
                assert!(class >= bytes, "{bytes}: class {class}");
                let slack = class - bytes;
                if bytes > 64 * MIB {
                    assert!(slack < MIB, "{bytes}: class {class}");
                } else if bytes > 4096 {
                    assert!(slack * 4 < bytes, "{bytes}: class {class}");
                }
            }
            let class = size_class(n);
            assert!(class >= last, "{n}: class {class} below {last}");
            last = class;
            n = n * 5 / 4 + 1;
        }
        assert_eq!(size_class(128_256 * 4096 * 2), 1002 * MIB);
        assert_eq!(size_class(100), 256);
    }
}
