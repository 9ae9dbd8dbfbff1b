//! Measurement harness shared by the `bench` example and the criterion benches.
//!
//! * [`copy`]: the copy kernel whose bandwidth is the yardstick memory-bound kernels are
//!   judged against; [`copy_bandwidth`] measures it.
//! * [`prewarm`]: keeps the GPU busy for a moment before a timed section, so clocks are up
//!   (a GPU that idled downclocks; on an H200 figures then come out up to 2.5× low).
//! * [`measure`]: warmup runs, then one GPU-timed section ([`Engine::time`]) per run, summed
//!   up as [`Stats`]. [`gpu_time_iters`] is the same for criterion's `iter_custom`.
//! * [`Row`] and [`Report`]: the result table, printed or written as JSON.
//!
//! Every timed section goes through [`Engine::time`]: GPU timestamps when the adapter has
//! `TIMESTAMP_QUERY`, else the host wall clock, and the source is recorded with the figures.

use crate::engine::{Engine, TimingSource};
use crate::kernel::{COMMON_LAUNCH, Kernel};
use crate::{DType, Error, Result, Tensor};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// `wgsl/copy.wgsl`: the copy kernel whose bandwidth is the yardstick.
pub static COPY_KERNEL: Kernel = Kernel {
    name: "copy",
    parts: &[COMMON_LAUNCH, include_str!("../wgsl/copy.wgsl")],
};

/// Threads per workgroup of `copy_vec4`.
const COPY_WG: u64 = 256;

/// Default length of [`prewarm`], in seconds.
pub const DEFAULT_PREWARM_S: f64 = 0.3;

/// Compute passes [`Engine::time`] stamps in one section (one query for the first pass's start
/// plus one per pass end, within wgpu's query-set limit); passes past it are not counted, so a
/// section that reaches it may be cut short (see [`measure`] and [`gpu_time_iters`]).
pub const MAX_TIMED_PASSES: u32 = wgpu::QUERY_SET_MAX_QUERIES - 1;

#[derive(encase::ShaderType)]
struct CopyParams {
    vec4s: u32,
}

/// Number of `vec4<u32>` in `bytes`, checked: a multiple of 16 that fits `u32` vec4s.
fn copy_vec4s(what: &str, bytes: u64) -> Result<u32> {
    if !bytes.is_multiple_of(16) {
        return Err(Error::InvalidValue {
            what: format!("{what}: byte length"),
            got: bytes as f64,
            rule: "must be a multiple of 16 (the copy kernel moves whole vec4<u32>)".into(),
        });
    }
    let vec4s = bytes / 16;
    u32::try_from(vec4s)
        .map_err(|_| Error::bounds(format!("{what}: vec4 count"), vec4s, 0, u64::from(u32::MAX)))
}

/// Record one `copy_vec4` dispatch of `vec4s` vec4s from `source` to `dest`.
fn launch_copy(
    engine: &Engine,
    source: &wgpu::Buffer,
    dest: &wgpu::Buffer,
    vec4s: u32,
) -> Result<()> {
    engine.launch(
        &COPY_KERNEL,
        "copy_vec4",
        &Vec::new(),
        &CopyParams { vec4s },
        &[source, dest],
        u64::from(vec4s).div_ceil(COPY_WG),
    )
}

/// Probes of passes that write over the buffer they read, for measurements: `"rewrite"`
/// flips the bits of every vec4 of `x` in place (one a lane), `"rewrite_x4"` the same four a
/// lane (loaded before any is stored; vec4 counts not a multiple of 1,024 leave the tail),
/// `"copy_rw"` copies `x` to `out` with `x` bound read-write. Bytes moved: twice `x`'s.
///
/// Errors: as [`copy`]; an unknown probe name ([`Error::InvalidValue`]).
#[doc(hidden)]
pub fn probe_in_place(probe: &str, x: &Tensor, out: &Tensor) -> Result<()> {
    let vec4s = copy_vec4s("probe_in_place", x.byte_len())?;
    let engine = x.engine();
    let (entry, buffers, groups) = match probe {
        "rewrite" => (
            "rewrite_vec4",
            vec![x.buffer()],
            u64::from(vec4s).div_ceil(COPY_WG),
        ),
        "rewrite_x4" => (
            "rewrite_vec4_x4",
            vec![x.buffer()],
            u64::from(vec4s).div_ceil(4 * COPY_WG),
        ),
        "copy_rw" => (
            "copy_vec4_rw",
            vec![out.buffer(), x.buffer()],
            u64::from(vec4s).div_ceil(COPY_WG),
        ),
        _ => {
            return Err(Error::InvalidValue {
                what: format!("probe_in_place: probe {probe:?}"),
                got: 0.0,
                rule: "rewrite, rewrite_x4 or copy_rw".into(),
            });
        }
    };
    engine.launch(
        &COPY_KERNEL,
        entry,
        &Vec::new(),
        &CopyParams { vec4s },
        &buffers,
        groups,
    )
}

/// Copy `x` into a new tensor of the same shape and dtype with the `copy_vec4` kernel (a
/// tensor past one storage binding: with the queue's buffer copy).
///
/// `x`'s byte length ([`Tensor::byte_len`]) must be a multiple of 16 (error
/// [`Error::InvalidValue`]) and at most `u32::MAX` vec4s ([`Error::OutOfBounds`]).
pub fn copy(x: &Tensor) -> Result<Tensor> {
    let engine = x.engine();
    let out = Tensor::empty(engine, x.shape(), x.dtype(), "copy")?;
    if x.byte_len() > engine.max_binding_bytes() {
        // Past one binding: the queue's buffer copy.
        let bytes = x.byte_len();
        engine.record(|enc| enc.copy_buffer_to_buffer(x.buffer(), 0, out.buffer(), 0, bytes));
        return Ok(out);
    }
    let vec4s = copy_vec4s("copy", x.byte_len())?;
    launch_copy(engine, x.buffer(), out.buffer(), vec4s)?;
    Ok(out)
}

/// Bytes of the buffer [`prewarm`] copies: 256 MiB on GPUs, 16 MiB on CPU adapters (lavapipe,
/// which has no clocks to raise), at most the device's largest storage binding.
pub fn prewarm_bytes(engine: &Engine) -> u64 {
    let wanted: u64 = if engine.info().device_type == wgpu::DeviceType::Cpu {
        16 << 20
    } else {
        256 << 20
    };
    (wanted.min(engine.max_binding_bytes()) / 16 * 16).max(16)
}

/// Keep the GPU busy for about `seconds` (use [`DEFAULT_PREWARM_S`]), so its clocks are up
/// before a timed section: copies of a large buffer ([`prewarm_bytes`]) in batches, each
/// batch submitted and waited for (batches grow until one takes about an eighth of the time,
/// so the GPU is never starved by the host, and never queued far ahead). Returns once the
/// GPU is idle again. Work recorded before the call is submitted and waited for first.
///
/// Errors: `seconds` negative or not finite ([`Error::InvalidValue`]), device errors.
pub fn prewarm(engine: &Engine, seconds: f64) -> Result<()> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(Error::InvalidValue {
            what: "prewarm: seconds".into(),
            got: seconds,
            rule: "must be finite and not negative".into(),
        });
    }
    engine.synchronize()?;
    if seconds == 0.0 {
        return Ok(());
    }
    let bytes = prewarm_bytes(engine);
    let vec4s = copy_vec4s("prewarm", bytes)?;
    let words = (bytes / 4) as usize;
    let source = Tensor::empty(engine, &[words], DType::U32, "prewarm source")?;
    let dest = Tensor::empty(engine, &[words], DType::U32, "prewarm dest")?;
    let budget = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut batch = 1u32;
    while start.elapsed() < budget {
        let t0 = Instant::now();
        for i in 0..batch {
            // Alternate directions so consecutive copies do not just rewrite the same bytes.
            let (s, d) = if i % 2 == 0 {
                (&source, &dest)
            } else {
                (&dest, &source)
            };
            launch_copy(engine, s.buffer(), d.buffer(), vec4s)?;
        }
        engine.synchronize()?;
        if t0.elapsed() < budget / 8 && batch < 1024 {
            batch *= 2;
        }
    }
    Ok(())
}

/// Summary of the timed runs of one [`measure`] call.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Median of the samples, seconds (mean of the middle two for an even count).
    pub median_s: f64,
    /// Fastest sample, seconds.
    pub min_s: f64,
    /// Slowest sample, seconds.
    pub max_s: f64,
    /// Every sample in run order, seconds.
    pub samples: Vec<f64>,
    /// How the samples were timed.
    pub source: TimingSource,
}

impl Stats {
    /// Summarize samples (at least one, seconds) timed by `source`.
    pub fn from_samples(samples: Vec<f64>, source: TimingSource) -> Result<Stats> {
        if samples.is_empty() {
            return Err(Error::bounds("Stats: samples", 0, 1, u64::MAX));
        }
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median_s = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
        };
        Ok(Stats {
            median_s,
            min_s: sorted[0],
            max_s: sorted[n - 1],
            samples,
            source,
        })
    }

    /// Bytes per second at the median time for `bytes_moved` bytes per run.
    pub fn bytes_per_s(&self, bytes_moved: u64) -> f64 {
        bytes_moved as f64 / self.median_s
    }
}

/// Time `f`: run it `warmup` times (then wait for the GPU), then `iters` times, each run in its
/// own [`Engine::time`] section (GPU timestamps, or the wall clock when the adapter lacks
/// them; [`Stats::source`] says which). `f` records GPU work (launches ops); what it returns
/// is dropped after each run.
///
/// Errors: `iters` is 0 ([`Error::OutOfBounds`]); under GPU timing, a run that recorded no
/// compute pass (nothing to time) or [`MAX_TIMED_PASSES`] or more (the span would be cut
/// short) ([`Error::OutOfBounds`]); any error of `f` or the device.
pub fn measure(
    engine: &Engine,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Stats> {
    if iters == 0 {
        return Err(Error::bounds("measure: iters", 0, 1, u64::MAX));
    }
    for _ in 0..warmup {
        f()?;
    }
    engine.synchronize()?;
    let mut samples = Vec::with_capacity(iters);
    let mut source = TimingSource::WallClock;
    for _ in 0..iters {
        let (r, t) = engine.time(&mut f)?;
        r?;
        check_passes("measure", t.source, t.passes)?;
        source = t.source;
        samples.push(t.seconds);
    }
    Stats::from_samples(samples, source)
}

fn check_passes(what: &str, source: TimingSource, passes: u32) -> Result<()> {
    if source == TimingSource::Gpu && !(1..MAX_TIMED_PASSES).contains(&passes) {
        return Err(Error::bounds(
            format!("{what}: compute passes in a timed section"),
            u64::from(passes),
            1,
            u64::from(MAX_TIMED_PASSES - 1),
        ));
    }
    Ok(())
}

/// Total time of `iters` runs of `f`, for criterion's `Bencher::iter_custom` (so criterion
/// sees GPU time, not host recording time). The runs are split into [`Engine::time`] sections
/// that stay below [`MAX_TIMED_PASSES`] passes each (the first section is one run, which
/// gives the passes per run); the sections' times are summed. Errors as [`measure`].
pub fn gpu_time_iters(
    engine: &Engine,
    iters: u64,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Duration> {
    let mut total = 0.0f64;
    let mut done = 0u64;
    let mut chunk = 1u64;
    while done < iters {
        let n = chunk.min(iters - done);
        let (r, t) = engine.time(|| (0..n).try_for_each(|_| f()))?;
        r?;
        check_passes("gpu_time_iters", t.source, t.passes)?;
        if done == 0 && t.source == TimingSource::Gpu {
            let per_run = u64::from(t.passes).max(1);
            chunk = (u64::from(MAX_TIMED_PASSES / 2) / per_run).max(1);
        } else if done == 0 {
            chunk = 256;
        }
        total += t.seconds;
        done += n;
    }
    Ok(Duration::from_secs_f64(total))
}

/// Statistics of the copy kernel on a `bytes`-byte buffer: a [`prewarm`] of `prewarm_s`
/// seconds (use [`DEFAULT_PREWARM_S`]), then [`measure`] with `warmup` and `iters`. Bytes moved per run are
/// `2 * bytes` (read + write). `bytes` must be a positive multiple of 16 and fit one storage
/// binding.
pub fn copy_stats(
    engine: &Engine,
    bytes: u64,
    prewarm_s: f64,
    warmup: usize,
    iters: usize,
) -> Result<Stats> {
    copy_vec4s("copy_bandwidth", bytes)?;
    if bytes == 0 {
        return Err(Error::bounds(
            "copy_bandwidth: bytes",
            0,
            16,
            engine.max_binding_bytes(),
        ));
    }
    let words = (bytes / 4) as usize;
    let x = Tensor::zeros(engine, &[words], DType::U32)?;
    prewarm(engine, prewarm_s)?;
    let stats = measure(engine, warmup, iters, || copy(&x).map(drop))?;
    if stats.median_s.is_nan() || stats.median_s <= 0.0 {
        return Err(Error::InvalidValue {
            what: "copy_bandwidth: median time".into(),
            got: stats.median_s,
            rule: "must be positive".into(),
        });
    }
    Ok(stats)
}

/// Bandwidth of the copy kernel in bytes per second, counting read + write (`2 * bytes` per
/// copy), at the median of 20 timed copies after 3 warmups and a prewarm (see [`copy_stats`]).
pub fn copy_bandwidth(engine: &Engine, bytes: u64) -> Result<f64> {
    Ok(copy_stats(engine, bytes, DEFAULT_PREWARM_S, 3, 20)?.bytes_per_s(2 * bytes))
}

/// The copy buffer size to measure with: `wanted` bytes, at most the device's largest storage
/// binding, rounded down to a multiple of 16 (at least 16).
pub fn copy_bytes_for(engine: &Engine, wanted: u64) -> u64 {
    (wanted.min(engine.max_binding_bytes()) / 16 * 16).max(16)
}

/// "1024x1024"-style text of a shape ("scalar" for no axes).
pub fn shape_text(shape: &[usize]) -> String {
    if shape.is_empty() {
        return "scalar".into();
    }
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

fn source_name(source: TimingSource) -> &'static str {
    match source {
        TimingSource::Gpu => "gpu",
        TimingSource::WallClock => "wall",
    }
}

/// One measured operation of a [`Report`].
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Operation name.
    pub name: String,
    /// Input shape, as [`shape_text`] writes it.
    pub shape: String,
    /// Dtype(s), e.g. `f32` or `f32->bf16`.
    pub dtype: String,
    /// Bytes moved per run: each input read once plus each output written once.
    pub bytes_moved: u64,
    /// Median seconds per run.
    pub median_s: f64,
    /// Fastest run, seconds.
    pub min_s: f64,
    /// Slowest run, seconds.
    pub max_s: f64,
    /// Timed runs.
    pub iters: usize,
    /// `bytes_moved / median_s / 1e9`.
    pub gb_per_s: f64,
    /// Bandwidth as a percentage of the copy kernel's, measured in the same run.
    pub pct_of_copy: f64,
    /// How the runs were timed.
    pub source: TimingSource,
    /// Peak engine memory of one run beyond what was live before it (`engine.memory()` after
    /// `reset_peak`), for operations that measure it.
    pub peak_bytes: Option<u64>,
}

impl Row {
    /// A row from measured [`Stats`], against the copy bandwidth `copy_bytes_per_s`.
    pub fn new(
        name: impl Into<String>,
        shape: &[usize],
        dtype: impl Into<String>,
        bytes_moved: u64,
        stats: &Stats,
        copy_bytes_per_s: f64,
    ) -> Row {
        let bytes_per_s = stats.bytes_per_s(bytes_moved);
        Row {
            name: name.into(),
            shape: shape_text(shape),
            dtype: dtype.into(),
            bytes_moved,
            median_s: stats.median_s,
            min_s: stats.min_s,
            max_s: stats.max_s,
            iters: stats.samples.len(),
            gb_per_s: bytes_per_s * 1e-9,
            pct_of_copy: 100.0 * bytes_per_s / copy_bytes_per_s,
            source: stats.source,
            peak_bytes: None,
        }
    }
}

/// The result table of a benchmark run: the engine, the copy yardstick and one [`Row`] per
/// operation (the copy itself first).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The engine, as [`crate::EngineInfo`] displays it.
    pub engine: String,
    /// Adapter name.
    pub adapter: String,
    /// Backend name.
    pub backend: String,
    /// Device type.
    pub device_type: String,
    /// Bytes of the copy kernel's buffer.
    pub copy_bytes: u64,
    /// Copy bandwidth, bytes per second (read + write).
    pub copy_bytes_per_s: f64,
    /// Rows, the copy first.
    pub rows: Vec<Row>,
}

fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", b / f64::from(1u32 << 30))
    } else if bytes >= 1 << 20 {
        format!("{:.1} MiB", b / f64::from(1u32 << 20))
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", b / f64::from(1u32 << 10))
    } else {
        format!("{bytes} B")
    }
}

fn human_seconds(s: f64) -> String {
    if !s.is_finite() {
        format!("{s}")
    } else if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.2} us", s * 1e6)
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `x` as a JSON number (`null` when not finite).
fn json_number(x: f64) -> String {
    if x.is_finite() {
        // Shortest text that reads back to the same f64; never an exponent, so plain JSON.
        format!("{x}")
    } else {
        "null".into()
    }
}

impl Report {
    /// A report for `engine` whose yardstick is the copy of `copy_bytes` bytes timed as
    /// `copy` (see [`copy_stats`]); the copy is the first row.
    pub fn new(engine: &Engine, copy_bytes: u64, copy: &Stats) -> Report {
        let info = engine.info();
        let copy_bytes_per_s = copy.bytes_per_s(2 * copy_bytes);
        let words = (copy_bytes / 4) as usize;
        Report {
            engine: info.to_string(),
            adapter: info.adapter.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            copy_bytes,
            copy_bytes_per_s,
            rows: vec![Row::new(
                "copy",
                &[words],
                "u32",
                2 * copy_bytes,
                copy,
                copy_bytes_per_s,
            )],
        }
    }

    /// Add a row for an operation that moves `bytes_moved` bytes per run, timed as `stats`.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        dtype: impl Into<String>,
        bytes_moved: u64,
        stats: &Stats,
    ) -> &Row {
        let row = Row::new(
            name,
            shape,
            dtype,
            bytes_moved,
            stats,
            self.copy_bytes_per_s,
        );
        self.rows.push(row);
        self.rows.last().expect("just pushed")
    }

    /// The table as text, one line per row under a header.
    pub fn table(&self) -> String {
        let header = [
            "op", "shape", "dtype", "moved", "median", "min", "GB/s", "% copy", "timer", "peak",
        ];
        let lines: Vec<[String; 10]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.name.clone(),
                    r.shape.clone(),
                    r.dtype.clone(),
                    human_bytes(r.bytes_moved),
                    human_seconds(r.median_s),
                    human_seconds(r.min_s),
                    format!("{:.2}", r.gb_per_s),
                    format!("{:.1}", r.pct_of_copy),
                    source_name(r.source).to_string(),
                    r.peak_bytes.map_or("-".into(), human_bytes),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for line in &lines {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        // Text columns left-aligned, figures right-aligned.
        let left = [
            true, true, true, false, false, false, false, false, true, false,
        ];
        let mut out = String::new();
        let mut emit = |cells: &[String]| {
            let mut line = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                if left[i] {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                } else {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        };
        emit(&header.map(String::from));
        emit(&widths.map(|w| "-".repeat(w)));
        for line in &lines {
            emit(line);
        }
        out
    }

    /// Print [`Report::table`] to stdout, preceded by the copy bandwidth.
    pub fn print_table(&self) {
        println!(
            "copy bandwidth: {:.2} GB/s (read + write, {} buffer)",
            self.copy_bytes_per_s * 1e-9,
            human_bytes(self.copy_bytes)
        );
        print!("{}", self.table());
    }

    /// The report as a JSON document (written by hand; non-finite numbers become `null`).
    pub fn to_json(&self) -> String {
        let mut s = String::new();
        s.push_str("{\n");
        let _ = writeln!(s, "  \"engine\": {},", json_string(&self.engine));
        let _ = writeln!(s, "  \"adapter\": {},", json_string(&self.adapter));
        let _ = writeln!(s, "  \"backend\": {},", json_string(&self.backend));
        let _ = writeln!(s, "  \"device_type\": {},", json_string(&self.device_type));
        let _ = writeln!(s, "  \"copy_bytes\": {},", self.copy_bytes);
        let _ = writeln!(
            s,
            "  \"copy_bytes_per_s\": {},",
            json_number(self.copy_bytes_per_s)
        );
        let _ = writeln!(
            s,
            "  \"copy_gb_per_s\": {},",
            json_number(self.copy_bytes_per_s * 1e-9)
        );
        s.push_str("  \"rows\": [");
        for (i, r) in self.rows.iter().enumerate() {
            s.push_str(if i == 0 { "\n" } else { ",\n" });
            let _ = write!(
                s,
                "    {{\"name\": {}, \"shape\": {}, \"dtype\": {}, \"bytes_moved\": {}, \
                 \"median_s\": {}, \"min_s\": {}, \"max_s\": {}, \"iters\": {}, \
                 \"gb_per_s\": {}, \"pct_of_copy\": {}, \"timing\": {}, \"peak_bytes\": {}}}",
                json_string(&r.name),
                json_string(&r.shape),
                json_string(&r.dtype),
                r.bytes_moved,
                json_number(r.median_s),
                json_number(r.min_s),
                json_number(r.max_s),
                r.iters,
                json_number(r.gb_per_s),
                json_number(r.pct_of_copy),
                json_string(source_name(r.source)),
                r.peak_bytes.map_or("null".into(), |b| b.to_string()),
            );
        }
        s.push_str(if self.rows.is_empty() {
            "]\n"
        } else {
            "\n  ]\n"
        });
        s.push_str("}\n");
        s
    }

    /// Write [`Report::to_json`] to `path`.
    pub fn write_json(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_median_min_max() {
        let s = Stats::from_samples(vec![3.0, 1.0, 4.0, 2.0], TimingSource::Gpu).unwrap();
        assert_eq!((s.median_s, s.min_s, s.max_s), (2.5, 1.0, 4.0));
        assert_eq!(s.samples, vec![3.0, 1.0, 4.0, 2.0]);
        let s = Stats::from_samples(vec![5.0, 1.0, 2.0], TimingSource::WallClock).unwrap();
        assert_eq!(s.median_s, 2.0);
        assert!(matches!(
            Stats::from_samples(vec![], TimingSource::Gpu),
            Err(Error::OutOfBounds { .. })
        ));
    }

    #[test]
    fn json_escapes_and_numbers() {
        assert_eq!(json_string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(json_number(f64::NAN), "null");
        assert_eq!(json_number(1.5e-6), "0.0000015");
        assert_eq!(json_number(100.0), "100");
        assert_eq!(shape_text(&[8192, 8192]), "8192x8192");
        assert_eq!(shape_text(&[]), "scalar");
    }

    fn engine() -> Option<Engine> {
        Engine::new().ok()
    }

    #[test]
    fn copy_round_trip_and_errors() {
        let Some(engine) = engine() else { return };
        let data: Vec<u32> = (0..1000u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let x = Tensor::from_slice(&engine, &data, &[10, 100]).unwrap();
        let y = copy(&x).unwrap();
        assert_eq!(y.shape(), &[10, 100]);
        assert_eq!(y.to_vec::<u32>().unwrap(), data);
        let odd = Tensor::from_slice(&engine, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
        assert!(matches!(copy(&odd), Err(Error::InvalidValue { .. })));
        let empty = Tensor::from_slice::<f32>(&engine, &[], &[0]).unwrap();
        assert!(copy(&empty).unwrap().is_empty());
    }

    #[test]
    fn measure_and_report() {
        let Some(engine) = engine() else { return };
        assert!(matches!(
            prewarm(&engine, -1.0),
            Err(Error::InvalidValue { .. })
        ));
        prewarm(&engine, 0.01).unwrap();
        let x = Tensor::zeros(&engine, &[4096], DType::F32).unwrap();
        assert!(matches!(
            measure(&engine, 0, 0, || Ok(())),
            Err(Error::OutOfBounds { .. })
        ));
        let stats = measure(&engine, 1, 3, || copy(&x).map(drop)).unwrap();
        assert_eq!(stats.samples.len(), 3);
        assert!(stats.min_s > 0.0 && stats.min_s <= stats.median_s);
        assert!(stats.median_s <= stats.max_s);
        let d = gpu_time_iters(&engine, 5, || copy(&x).map(drop)).unwrap();
        assert!(d > Duration::ZERO);
        let mut report = Report::new(&engine, x.byte_len(), &stats);
        assert!((report.rows[0].pct_of_copy - 100.0).abs() < 1e-9);
        report.add("sum_rows", x.shape(), "f32", x.byte_len() + 4, &stats);
        assert_eq!(report.table().lines().count(), 4);
        let json = report.to_json();
        assert!(json.contains("\"name\": \"sum_rows\""));
        assert!(json.trim_end().ends_with('}'));
    }
}
