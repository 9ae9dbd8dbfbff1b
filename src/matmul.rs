//! Dense matrix products: `Y = act(A·B + bias)` with FP32 accumulation, forward and backward.
//!
//! * [`matmul`]: `A[.., M, K] @ B[.., K, N] (+ bias[N])`, either operand optionally stored
//!   transposed (`A` as `[.., K, M]`, `B` as `[.., N, K]`, e.g. weights `[N, K]` used without a
//!   copy), leading batch dimensions on either operand (equal when both have them; an operand
//!   without batch dimensions is shared by every batch), an optional [`Activation`] epilogue.
//!   Output F32 `[batch.., M, N]`. With an activation the unrounded FP32 pre-activation
//!   `A·B + bias` is saved for the backward.
//! * [`matmul_backward`]: with `G = dY ⊙ act'(pre)` (`G = dY` without an activation),
//!   `dA = G·Bᵀ`, `dB = Aᵀ·G`, `dbias = Σ_rows G`, all F32 and in each operand's stored layout
//!   (`dA` of a transposed `A` is `[.., K, M]`). The gradient of a shared (broadcast) operand is
//!   summed over the batches in a fixed order.
//! * [`gemm`]: the low-level product into a caller-owned F32 tensor at element offsets, with
//!   accumulation and scaling, on which the two above are built (and chunked operators).
//!
//! Storage F32, F16 or BF16 for `A`, `B`, bias and `dY` (each may differ): 16-bit operands are
//! widened exactly to f32 when staged; every product term is an FP32 fused multiply-add and
//! there is no reduced-precision mode. Each output element is summed over `k` in increasing
//! order by one invocation, so reruns are bit-identical.
//!
//! Tensor cores (opt-in: [`MatmulOptions::tensor_cores`], [`Gemm::tensor_cores`]; where
//! [`tensor_cores`] holds): products of F16 or BF16 operands on cooperative matrices
//! (`wgsl/matmul_tc.wgsl`, 16×16×16 F16 × F16 → F32). A BF16 operand is multiplied by a power
//! of two `2^s` chosen from the largest finite magnitude `M` of its tensor (`s = 14 − ⌊log2 M⌋`,
//! within −113..=126) and converted to F16, and the sums are multiplied back by `2^−s`: every value
//! within 2³¹ of `M` (binade at least `⌊log2 M⌋ − 31`) converts exactly, smaller ones round on
//! F16's subnormal grid (an error below `2^−40·M` each). The products are then exact in FP32
//! and the sums FP32, but in the hardware's order and rounding, so the results are compared
//! under [`tensor_core_tolerance`] instead of carrying the FP32 path's bits; reruns on one
//! device are bit-identical. F32 operands take the same route only with
//! [`Gemm::round_f32_operands`] (each value rounded to 11 significant bits,
//! [`tensor_core_rounded_tolerance`]). The factors cost one pass over the elements of each
//! scaled operand that the product reads (two small launches, no host synchronization); an
//! operand staged by many tiles is converted once into an F16 copy of those elements
//! (scratch, `tc_stage_f16`, see [`TC_COPY_MIN_TILES`]), the others on each tile, with the
//! same values either way. The epilogue is the FP32 path's
//! (alpha, bias of any float dtype, activation, pre-activation, accumulate, an F32 or 16-bit
//! out), applied to the same FP32 sums. Calls outside [`tensor_core_fits`] run on the FP32
//! path.
//!
//! Split-K: a product with few output tiles and a long K (e.g. `[256, 4096]` from a K of
//! 128,256) would leave most of a large GPU idle, so [`gemm`] cuts K into `S` slices
//! ([`gemm_split`] states the rule; a pure function of the shape and the workspace bound,
//! never of timing). Pass 1 runs one workgroup per (slice, tile), each summing its slice in
//! the unsplit order into F32 scratch `[S, batch, m, n]` ([`gemm_workspace_bytes`], through
//! the engine's workspace check); pass 2 adds the slices in increasing order (no atomics) and
//! applies the epilogue (alpha, bias, activation, pre-activation, accumulate) as the unsplit
//! kernel does. Results differ from the unsplit product only by that summation order and
//! reruns are bit-identical. Under a workspace bound too small for the scratch the product
//! uses fewer slices or none: it never fails for lack of a split. Tensor-core products split
//! by the same rule (slices of whole 64-element K steps, so at most the same scratch): pass 1
//! runs the tensor-core kernel on each slice, pass 2 is the same finish.
//!
//! Kernel (`wgsl/matmul.wgsl`): [`TILE_M`]×[`TILE_N`] = 128×128 output tile per workgroup of
//! 256 invocations, 8×8 micro-tile per invocation (sixteen vec4 accumulators), K steps of 16
//! staged in [`WORKGROUP_BYTES`] = 16 KiB of workgroup memory with the next step prefetched
//! into registers; edge tiles are bounds-checked in the kernel. A launch whose K is a whole
//! number of K steps and whose operands are 16-byte aligned ([`chunked_fetches`] states the
//! rule: the model shapes are) fetches each operand in 16-byte chunks, four F32 or eight
//! 16-bit values a load, without edge tests, and stages rows stored along `m` or `n` by vec4
//! stores: the same values in the same places, so the same bits (on the H200: 16-bit operands
//! 13–19% faster, F32 2–6%, `notes/measurements.md`). Small products whose edges
//! would leave much of that tile empty take a 64×64 tile of the same code instead (64
//! invocations, K steps of 8; [`gemm_tile`] states the rule), with the same bits. The
//! activation formulas are those of [`crate::activation`] (`wgsl/common/activation.wgsl`).
//!
//! Bounds: every tensor at most 2³²−1 elements (and one storage binding); at most 65,535²
//! workgroups per launch (`⌈M/128⌉·⌈N/128⌉·batch`; the 64×64 tile is only picked below
//! [`NARROW_MAX_TILES`] of them).

use crate::activation::{self, Activation, ActivationSaved};
use crate::kernel::{COMMON_ACTIVATION, COMMON_DTYPE, COMMON_LAUNCH, Kernel};
use crate::{DType, Error, Result, Tensor, reduce};

/// `wgsl/common/gemm_params.wgsl`: the launch parameters of both product modules ([`Params`])
/// and their shared epilogue helpers (the bias load, the activation).
const GEMM_PARAMS: &str = include_str!("../wgsl/common/gemm_params.wgsl");

/// `wgsl/matmul.wgsl`.
pub static KERNEL: Kernel = Kernel {
    name: "matmul",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        COMMON_ACTIVATION,
        GEMM_PARAMS,
        include_str!("../wgsl/matmul.wgsl"),
    ],
};

/// `wgsl/matmul_tc.wgsl`: the tensor-core product of 16-bit operands (cooperative matrices of
/// 16×16×16, F32 accumulators), for [`Gemm::tensor_cores`] where [`tensor_cores`] says the
/// engine can run it. Its own module: it starts with `enable wgpu_cooperative_matrix;`.
pub static TC_KERNEL: Kernel = Kernel {
    name: "matmul_tc",
    parts: &[
        "enable f16;\nenable wgpu_cooperative_matrix;",
        COMMON_DTYPE,
        COMMON_ACTIVATION,
        GEMM_PARAMS,
        include_str!("../wgsl/matmul_tc.wgsl"),
    ],
};

/// Output rows per workgroup of the wide tile (`BM` in the kernel), the tile that split-K
/// and the launch bounds count in.
pub const TILE_M: usize = 128;
/// Output columns per workgroup of the wide tile (`BN` in the kernel).
pub const TILE_N: usize = 128;

/// The output tile of a product's launch (see [`gemm_tile`]). Both are the same kernel code
/// with an 8×8 micro-tile per invocation and one fused multiply-add per term in increasing
/// `k`, so a product's bits do not depend on the tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmTile {
    /// 128×128 outputs per workgroup of 256 invocations, K steps of 16.
    Wide,
    /// 64×64 outputs per workgroup of 64 invocations, K steps of 8: a quarter of the padding
    /// of the wide tile on a ragged or narrow product, four times the workgroups.
    Narrow,
}

impl GemmTile {
    /// Output rows per workgroup.
    pub const fn rows(self) -> usize {
        match self {
            GemmTile::Wide => TILE_M,
            GemmTile::Narrow => 64,
        }
    }

    /// Output columns per workgroup.
    pub const fn cols(self) -> usize {
        match self {
            GemmTile::Wide => TILE_N,
            GemmTile::Narrow => 64,
        }
    }
}

/// [`gemm_tile`]: products whose wide grid has fewer workgroups than this may take the narrow
/// tile; larger ones always take the wide one.
pub const NARROW_MAX_TILES: usize = 32;

/// Workgroups of a `batch` of `[m, n]` outputs in tiles of `tile` (saturating).
fn grid(m: usize, n: usize, batch: usize, tile: GemmTile) -> u128 {
    (m.div_ceil(tile.rows()) as u128) * (n.div_ceil(tile.cols()) as u128) * (batch as u128)
}

/// The tile [`gemm`] launches a `batch` of `[m, k] @ [k, n]` products with, a pure function
/// of the shape. With `T_w = ⌈m/128⌉·⌈n/128⌉·batch` wide and `T_n = ⌈m/64⌉·⌈n/64⌉·batch`
/// narrow workgroups, [`GemmTile::Narrow`] when `T_w <` [`NARROW_MAX_TILES`] and either
///
/// * `T_n < 4·T_w`: the narrow grid covers less padding (`m` or `n` ends at most 64 past a
///   multiple of 128, e.g. 64, 192 or 320), or
/// * `T_w = 1`: a single wide workgroup would leave every other core idle;
///
/// [`GemmTile::Wide`] otherwise, so large products always take the 128×128 tile. Measured on
/// lavapipe (2 cores), time of the narrow tile over the wide one's: 0.55 at 256×64 (K 64) and
/// at 64×192 and 192×64 (K 256), 0.7 at 192×192, 0.75 at 256×192, 0.6 for a single wide tile
/// (128×128); 1.1 at equal padding (256×66, 256×256, 512×512, 1024×1024). The results are the
/// same bits either way; [`gemm_with_tile`] forces a tile.
pub fn gemm_tile(m: usize, n: usize, batch: usize) -> GemmTile {
    let wide = grid(m, n, batch, GemmTile::Wide);
    let narrow = grid(m, n, batch, GemmTile::Narrow);
    if wide < NARROW_MAX_TILES as u128 && (narrow < 4 * wide || wide == 1) {
        GemmTile::Narrow
    } else {
        GemmTile::Wide
    }
}

/// Workgroup memory of the kernel: the A and B tiles of one K step of the wide tile,
/// 2 × 16 × 128 f32 (the WebGPU default limit, 16 KiB; the narrow tile uses a quarter of it).
pub const WORKGROUP_BYTES: u64 = 2 * 16 * 128 * 4;

/// Split-K: products with fewer output tiles than this (`⌈m/128⌉·⌈n/128⌉·batch`) may be split.
pub const SPLIT_MAX_TILES: usize = 256;
/// Split-K: the number of workgroups (slices × tiles) a split aims for.
pub const SPLIT_TARGET_GROUPS: usize = 512;
/// Split-K: the shortest slice of K (elements) a split makes.
pub const SPLIT_MIN_SLICE_K: usize = 2048;
/// Split-K: the most slices of one product.
pub const SPLIT_MAX_SLICES: usize = 32;
/// K step of the kernel; every slice but the last is a multiple of it.
const K_STEP: usize = 16;

std::thread_local! {
    static CHUNKED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    static GROUP_M: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
    static TC_GROUP_M: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
    static TC_TILE: std::cell::Cell<Option<TcTile>> = const { std::cell::Cell::new(None) };
    static TC_STAGING: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// The output tile of a tensor-core launch (`BM`, `SB`, `BK` of `wgsl/matmul_tc.wgsl`): `rows`
/// × 128 outputs, each subgroup computing `block_rows` × 64 of them (2 × 4 or 4 × 4 fragments
/// of 16×16), K advancing `2048 / block_rows` a step. Every fragment's sums run in the same
/// order in every tile: the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcTile {
    /// 64, 128 or 256 (256 only with 64-row blocks).
    pub rows: usize,
    /// 32 or 64.
    pub block_rows: usize,
}

impl TcTile {
    /// The K step (`BK`).
    pub fn k_step(self) -> usize {
        2048 / self.block_rows
    }

    /// Invocations of its workgroup (`WG`): a subgroup of 32 a block.
    pub fn invocations(self) -> usize {
        64 * self.rows / self.block_rows
    }

    /// Every tile the kernel has: rows 64 or 128 with 32- or 64-row blocks, 256 with 64.
    pub const ALL: [TcTile; 5] = [
        TcTile::new(64, 32),
        TcTile::new(128, 32),
        TcTile::new(64, 64),
        TcTile::new(128, 64),
        TcTile::new(256, 64),
    ];

    const fn new(rows: usize, block_rows: usize) -> TcTile {
        TcTile { rows, block_rows }
    }

    /// Whether the kernel has this tile (one of [`TcTile::ALL`]).
    pub fn supported(self) -> bool {
        Self::ALL.contains(&self)
    }
}

/// The tile of a checked tensor-core product (the rule, measured on an H200,
/// `notes/measurements.md`):
/// * at most 64 rows: 64×128 (four subgroups; a short product, a fused linear head's chunk,
///   would leave more than half of a 128-row tile empty);
/// * more than 128 rows, B not transposed (the backward's `G·B` and `Aᵀ·G` of an `x·Wᵀ`
///   layer), fragments stored whole (an F32 out without activation or pre-activation; a
///   launch staged for its epilogue, [`TC_STAGE_EPILOGUES`], takes this tile too):
///   256×128 with 64×64 subgroup blocks (6–9% faster there; slower for `x·Wᵀ` itself and for
///   the epilogue entries, which stage each fragment with two barriers);
/// * else 128×128 with 32×64 blocks.
///
/// Every fragment's sums run in the same order in every tile: the same bits.
pub fn tensor_core_tile(call: &Gemm) -> TcTile {
    tile_for(call, whole_fragments(call))
}

/// [`tensor_core_tile`] for a launch that stores whole fragments (`whole`: `gemm_tc`,
/// `gemm_tc_bias`, or the sums of a product staged for its epilogue) or not.
fn tile_for(call: &Gemm, whole: bool) -> TcTile {
    let rule = match call.m {
        m if m <= 64 => TcTile::new(64, 32),
        m if m > 128 && !call.b.transposed && whole => TcTile::new(256, 64),
        _ => TcTile::new(128, 32),
    };
    TC_TILE.with(std::cell::Cell::get).unwrap_or(rule)
}

/// Whether a tensor-core product stores whole fragments (`gemm_tc`, `gemm_tc_bias`: an F32 out
/// without activation or pre-activation) rather than through the epilogue entries.
fn whole_fragments(call: &Gemm) -> bool {
    call.out.dtype() == DType::F32 && call.activation.is_none() && call.pre_activation.is_none()
}

/// Whether a tensor-core product that needs the epilogue (a 16-bit out, an activation or a
/// pre-activation) and is not split stores its sums as whole fragments into F32 scratch
/// (`4·batch·m·n` bytes, where [`Gemm::copy_bytes`], or the workspace bound, has room for them;
/// the F16 copies then take what is left) and then applies the epilogue in the FP32 module's `gemm_finish` pass, rather than
/// staging each fragment through workgroup memory (`gemm_tc_epilogue`): the same bits either
/// way (`alpha` is applied to the sums as the epilogue entries do, the finish adds the bias).
pub const TC_STAGE_EPILOGUES: bool = true;

/// Overrides [`TC_STAGE_EPILOGUES`] for launches from the calling thread (`None`: the
/// constant). The results are the same bits. For tests and measurements.
#[doc(hidden)]
pub fn force_tensor_core_staging(stage: Option<bool>) {
    TC_STAGING.with(|f| f.set(stage));
}

/// The F32 scratch of a tensor-core product staged for its epilogue (see
/// [`TC_STAGE_EPILOGUES`]), `None` when the product stores its fragments itself.
fn epilogue_staging(call: &Gemm, slices: usize) -> Option<u64> {
    let stage = TC_STAGING
        .with(std::cell::Cell::get)
        .unwrap_or(TC_STAGE_EPILOGUES);
    (stage && slices == 1 && !whole_fragments(call))
        .then(|| 4 * (call.batch as u64) * (call.m as u64) * (call.n as u64))
}

/// Overrides [`tensor_core_tile`] for launches from the calling thread (`None`: the rule; a
/// tile that is not [`TcTile::supported`] is ignored). For tests and measurements.
#[doc(hidden)]
pub fn force_tensor_core_tile(tile: Option<TcTile>) {
    TC_TILE.with(|f| f.set(tile.filter(|t| t.supported())));
}

/// Tile rows per band of a tensor-core launch's tile order (`GROUP_M` of
/// `wgsl/matmul_tc.wgsl`, the order `banded_tile`; the order of the tiles, not their values).
/// Bands of 8 rows let the workgroups running together share B's tiles: on an H200 the
/// 8192×4096×14336 forwards ran 3–4% faster than row after row, the rest within ±1.5%
/// (`notes/measurements.md`).
pub const TC_TILE_GROUP_ROWS: u32 = 8;

/// Overrides [`TC_TILE_GROUP_ROWS`] for launches from the calling thread (at least 1; `None`:
/// the constant). The results are the same bits. For tests and measurements.
#[doc(hidden)]
pub fn force_tensor_core_group_rows(rows: Option<u32>) {
    TC_GROUP_M.with(|f| f.set(rows.map(|r| r.max(1))));
}

/// Tile rows per band of a launch's tile order (`GROUP_M` of `wgsl/matmul.wgsl`; the order is
/// `banded_tile` of `wgsl/common/gemm_params.wgsl`, shared with the tensor-core module).
pub const TILE_GROUP_ROWS: u32 = 1;

/// Overrides [`TILE_GROUP_ROWS`] for launches from the calling thread (at least 1; the order
/// of the tiles, not their values: the results are the same bits). For measurements.
#[doc(hidden)]
pub fn force_tile_group_rows(rows: Option<u32>) {
    GROUP_M.with(|f| f.set(rows.map(|r| r.max(1))));
}

/// Overrides [`chunked_fetches`] for launches from the calling thread: `Some(false)` fetches
/// every operand element by element (the general path), `Some(true)` or `None` (the default)
/// follow the rule. The results are the same bits either way. For tests and measurements.
#[doc(hidden)]
pub fn force_chunked_fetches(choice: Option<bool>) {
    CHUNKED.with(|f| f.set(choice));
}

/// Whether a launch of `call` fetches its operands in 16-byte chunks (the kernel's `ALIGNED`
/// path: no edge tests, one load per four F32 or eight 16-bit elements): `k` a multiple of the
/// K step (16) and, for each operand, its offset, its batch stride (when `batch > 1`) and its
/// row pitch (`k` for an operand stored k-contiguous, else `m` or `n`) whole chunks of 4 (F32)
/// or 8 (16-bit) elements. Ragged `m` and `n` are fine (a last tile re-reads real values for
/// the outputs it does not store), and so is either tile, whose K steps divide 16.
pub fn chunked_fetches(call: &Gemm) -> bool {
    if CHUNKED.with(std::cell::Cell::get) == Some(false) {
        return false;
    }
    let chunked = |op: &GemmOperand, pitch: usize| {
        let e = 16 / op.tensor.dtype().size(); // elements per 16-byte chunk
        op.offset.is_multiple_of(e)
            && (call.batch < 2 || op.batch_stride.is_multiple_of(e))
            && pitch.is_multiple_of(e)
    };
    call.k.is_multiple_of(K_STEP)
        && chunked(&call.a, if call.a.transposed { call.m } else { call.k })
        && chunked(&call.b, if call.b.transposed { call.k } else { call.n })
}

/// Whether `engine` runs tensor-core products ([`Gemm::tensor_cores`]): a Vulkan device with
/// `EXPERIMENTAL_COOPERATIVE_MATRIX`, `SHADER_F16` and `SUBGROUP`, subgroups of exactly 32
/// invocations, a reported 16×16×16 F16 × F16 → F32 cooperative-matrix configuration and
/// 44 KiB of workgroup memory. (Metal's simdgroup matrices are 8×8: not mapped yet.)
pub fn tensor_cores(engine: &crate::Engine) -> bool {
    let info = engine.info();
    let features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    info.backend == wgpu::Backend::Vulkan
        && info.features.contains(features)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && info.limits.max_compute_workgroup_storage_size >= TC_WORKGROUP_BYTES
        && info.cooperative_matrices.iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// Workgroup memory of the tensor-core tile: two staged operands of 2,304 quads of halves and
/// a 16×16 F32 fragment for each of the 8 subgroups (ragged tiles).
const TC_WORKGROUP_BYTES: u32 = 45056;

/// The comparison budget of a tensor-core product's element summed over `terms` products of
/// magnitude ≤ 1 against the f64 reference: the products are exact, but the hardware's FP32
/// accumulation may round each partial sum toward zero (up to one FP32 ulp a step instead of
/// half), so the absolute part is `1e-6·terms`, five times [`matmul_tolerance`]'s.
pub fn tensor_core_tolerance(terms: usize) -> crate::gradcheck::Tolerance {
    summed_tolerance(1e-6, terms)
}

/// The comparison budget of a tensor-core product with an F32 operand rounded to F16
/// ([`Gemm::round_f32_operands`]), for `terms` products of magnitude ≤ 1: each rounded value
/// is off by at most 2⁻¹¹ of itself (2⁻¹⁰ for a product of two), so the absolute part is
/// `1e-3·terms` and the relative parts are F16's (the L2 one doubled: a sum of many products
/// keeps about 2⁻¹¹ of its size).
pub fn tensor_core_rounded_tolerance(terms: usize) -> crate::gradcheck::Tolerance {
    let f16 = crate::gradcheck::Tolerance::for_dtype(DType::F16);
    crate::gradcheck::Tolerance {
        abs: f16.abs.max(1e-3 * terms as f64),
        rel_l2: 2.0 * f16.rel_l2,
        ..f16
    }
}

/// The typed errors of a [`Gemm::tensor_cores`] call beyond [`gemm`]'s: the engine cannot run
/// tensor-core products (`MissingFeature`); an operand that is not F16 or BF16, or F32 with
/// [`Gemm::round_f32_operands`] (`UnsupportedDType`).
fn check_tensor_core_call(call: &Gemm) -> Result<()> {
    if !tensor_cores(call.out.engine()) {
        return Err(Error::MissingFeature {
            features: "EXPERIMENTAL_COOPERATIVE_MATRIX with 16×16×16 F16 × F16 → F32, \
                       SHADER_F16, SUBGROUP of 32 (Vulkan)"
                .into(),
        });
    }
    let allowed: &[DType] = if call.round_f32_operands {
        &DType::FLOATS
    } else {
        &[DType::F16, DType::BF16]
    };
    for (t, what) in [
        (call.a.tensor, "gemm (tensor cores): a"),
        (call.b.tensor, "gemm (tensor cores): b"),
    ] {
        if !allowed.contains(&t.dtype()) {
            return Err(Error::dtype(what, t.dtype(), allowed));
        }
    }
    Ok(())
}

/// Whether a checked tensor-core call fits the kernel's layout rule (else it runs on the FP32
/// path): each operand's offset, batch stride (more than one batch) and row pitch (`k`, or `m`
/// / `n` when that is its contiguous axis) multiples of 8 halves; `n`, out's offset and batch
/// stride multiples of 4. Any `m`, `n`, `k` otherwise (ragged tiles included).
pub fn tensor_core_fits(call: &Gemm) -> bool {
    let op = |op: &GemmOperand, pitch: usize| {
        op.offset.is_multiple_of(8)
            && (call.batch < 2 || op.batch_stride.is_multiple_of(8))
            && pitch.is_multiple_of(8)
    };
    call.n.is_multiple_of(4)
        && op(&call.a, if call.a.transposed { call.m } else { call.k })
        && op(&call.b, if call.b.transposed { call.k } else { call.n })
        && call.out_offset.is_multiple_of(4)
        && (call.batch < 2 || call.out_batch_stride.is_multiple_of(4))
}

/// Launch a checked, fitting tensor-core product ([`tensor_core_tile`]; one workgroup a tile):
/// an F32 out without activation or pre-activation takes `gemm_tc` / `gemm_tc_bias`
/// (fragments stored whole); anything else is staged in F32 scratch for `gemm_finish` where
/// [`Gemm::copy_bytes`] leaves room for it ([`TC_STAGE_EPILOGUES`]), else takes the epilogue
/// entries (fragments through workgroup memory).
fn gemm_tc(call: &Gemm, allowance: u64) -> Result<()> {
    let engine = call.out.engine();
    let (m, n, batch) = (call.m, call.n, call.batch);
    let (slices, k_slice) = tc_split_plan(m, n, call.k, batch, allowance);
    // Scratch for the staged sums, then for the F16 copies (the bits do not depend on it).
    let scratch = call.copy_bytes.map_or(engine.workspace_bound(), |b| {
        b.min(engine.workspace_bound())
    });
    let staging = epilogue_staging(call, slices).filter(|&b| b <= scratch);
    let tile = tile_for(call, whole_fragments(call) || staging.is_some());
    let tiles_m = m.div_ceil(tile.rows);
    let tiles_n = n.div_ceil(TILE_N);
    // Without a bias, A's buffer is bound in its place (never read).
    let bias = call.bias.unwrap_or(call.a.tensor);
    let tiles = (tiles_m as u64) * (tiles_n as u64) * (batch as u64);
    // The factors of BF16 / F32 operands, taken over the elements the product reads (none for
    // two F16 ones: A's buffer then stands in for the unread factors), and the F16 copies of
    // those elements the kernel stages in their place (F16 codes, read from element 0).
    let regions = [
        Region::of(&call.a, batch, call.m * call.k),
        Region::of(&call.b, batch, call.k * call.n),
    ];
    let maxima = [0, 1].map(|i| call.maxima[i].filter(|_| scan_groups(&regions[i]).is_some()));
    for (i, m) in maxima.iter().enumerate() {
        if let Some(m) = m {
            check_maxima(["A", "B"][i], m, &regions[i])?;
        }
    }
    let scales = scales_of(regions, maxima)?;
    // The staging first (it spares the product a pass through workgroup memory a fragment),
    // then the copies in what is left.
    let copies = match &scales {
        Some(f) => f16_copies(
            regions,
            f,
            (tiles_m, tiles_n),
            batch,
            scratch - staging.unwrap_or(0),
        )?,
        None => [None, None],
    };
    fn staged<'b>(op: GemmOperand<'b>, copy: &'b Option<Tensor>) -> GemmOperand<'b> {
        match copy {
            Some(t) => GemmOperand {
                tensor: t,
                offset: 0,
                ..op
            },
            None => op,
        }
    }
    let call = &Gemm {
        a: staged(call.a, &copies[0]),
        b: staged(call.b, &copies[1]),
        ..*call
    };
    let [a, b] = [call.a.tensor, call.b.tensor];
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    let out_dtype = if slices > 1 || staging.is_some() {
        DType::F32
    } else {
        call.out.dtype()
    };
    let constants = vec![
        ("TRANS_A", flag(call.a.transposed)),
        ("TRANS_B", flag(call.b.transposed)),
        ("DT_OUT", f64::from(out_dtype.code())),
        ("SCALED", flag(scales.is_some())),
        ("DT_A", f64::from(a.dtype().code())),
        ("DT_B", f64::from(b.dtype().code())),
        (
            "GROUP_M",
            f64::from(
                TC_GROUP_M
                    .with(std::cell::Cell::get)
                    .unwrap_or(TC_TILE_GROUP_ROWS),
            ),
        ),
        ("BM", tile.rows as f64),
        ("SB", tile.block_rows as f64),
        ("BK", tile.k_step() as f64),
    ];
    let factors = scales.as_ref().unwrap_or(call.a.tensor).buffer();
    if slices > 1 || staging.is_some() {
        // Split-K: each slice's raw sums (alpha 1) into F32 scratch [slices, batch, m, n] by
        // the plain entry, then the FP32 module's fixed-order finish with the epilogue. Staged
        // for the epilogue (one slice): the sums times alpha, formed as the epilogue entries
        // form them, then a finish with alpha 1 (exact) that adds the bias and stores.
        let (what, alpha, finish_alpha) = if slices > 1 {
            ("gemm (tensor-core split-K slice sums)", 1.0, call.alpha)
        } else {
            (
                "gemm (tensor-core sums staged for the epilogue)",
                call.alpha,
                1.0,
            )
        };
        engine.check_workspace(what, 4 * (slices * batch * m * n) as u64)?;
        let part = Tensor::empty(engine, &[slices * batch * m * n], DType::F32, what)?;
        let partial = Gemm {
            out: &part,
            out_offset: 0,
            out_batch_stride: m * n,
            alpha,
            bias: None,
            accumulate: false,
            activation: None,
            pre_activation: None,
            ..*call
        };
        let params = Params::new(&partial, (tiles_m, tiles_n), (slices, k_slice), a);
        engine.launch(
            &TC_KERNEL,
            "gemm_tc",
            &constants,
            &params,
            &[a.buffer(), b.buffer(), part.buffer(), factors],
            tiles * slices as u64,
        )?;
        let finish = Gemm {
            alpha: finish_alpha,
            ..*call
        };
        let params = Params::new(&finish, (tiles_m, tiles_n), (slices, k_slice), bias);
        return split_finish(&finish, &params, bias, &part);
    }
    let params = Params::new(call, (tiles_m, tiles_n), (1, call.k), bias);
    let mut buffers = vec![a.buffer(), b.buffer()];
    let plain = whole_fragments(call);
    let entry = if plain && call.bias.is_none() {
        buffers.push(call.out.buffer());
        "gemm_tc"
    } else if plain {
        // The bias added to whole fragments (no per-value epilogue).
        buffers.extend([call.out.buffer(), bias.buffer()]);
        "gemm_tc_bias"
    } else {
        buffers.extend([bias.buffer(), call.out.buffer()]);
        match call.pre_activation {
            Some(pre) => {
                buffers.push(pre.buffer());
                "gemm_tc_epilogue_pre"
            }
            None => "gemm_tc_epilogue",
        }
    };
    buffers.push(factors);
    engine.launch(&TC_KERNEL, entry, &constants, &params, &buffers, tiles)
}

/// The longest K step of the tensor-core kernel (`BK` of `wgsl/matmul_tc.wgsl`, 64 or 32):
/// split slices are whole multiples of it.
const TC_K_STEP: usize = 64;

/// `(slices, k per slice)` of a tensor-core product: [`split_plan`]'s split (the same rule as
/// the FP32 path's: few output tiles, a long K) with slices of whole K steps, so its scratch
/// is at most the FP32 split's ([`gemm_workspace_bytes`]).
fn tc_split_plan(m: usize, n: usize, k: usize, batch: usize, allowance: u64) -> (usize, usize) {
    let (slices, slice) = split_plan(m, n, k, batch, allowance);
    if slices < 2 {
        return (1, k);
    }
    let slice = slice.div_ceil(TC_K_STEP) * TC_K_STEP;
    match k.div_ceil(slice) {
        0 | 1 => (1, k),
        slices => (slices, slice),
    }
}

/// The second pass of a split product: `gemm_finish` (`_pre` with a pre-activation) adds the
/// slice sums of `part` in increasing slice order and applies `call`'s epilogue, one element
/// (one word of a 16-bit out) an invocation.
fn split_finish(call: &Gemm, params: &Params, bias: &Tensor, part: &Tensor) -> Result<()> {
    let mut buffers = vec![bias.buffer(), call.out.buffer()];
    let entry = match call.pre_activation {
        Some(pre) => {
            buffers.push(pre.buffer());
            "gemm_finish_pre"
        }
        None => "gemm_finish",
    };
    buffers.push(part.buffer());
    let span = if call.out.dtype() == DType::F32 { 1 } else { 2 };
    let elements = (call.batch as u64) * (call.m as u64) * (call.n as u64);
    call.out.engine().launch(
        &KERNEL,
        entry,
        &vec![("DT_OUT", f64::from(call.out.dtype().code()))],
        params,
        &buffers,
        (elements / span).div_ceil(256),
    )
}

/// Tiles that must stage a BF16 or F32 operand's values before a tensor-core product converts
/// it once into an F16 copy (scratch within the workspace bound) instead of on every tile (H200, `notes/measurements.md`: copies of operands staged by
/// 32–112 tiles made BF16 products 2–5% and rounded F32 ones 13–17% faster; FLCE's weight,
/// staged by 8 row tiles a chunk, is 1 GB, whose copy would cost that memory for little).
pub const TC_COPY_MIN_TILES: usize = 16;

/// The F16 copies (scaled by their factors, `tc_stage_f16`) a tensor-core product stages
/// instead of its BF16 or F32 operands: `[A's, B's]`, `None` for an F16 operand or one that each
/// tile converts as it stages it. An operand is copied when at least [`TC_COPY_MIN_TILES`] tiles
/// stage its values (A's: the tiles of a row of tiles, times the batches when A is shared; B's
/// likewise by columns), within `bound` (the engine's workspace bound, or the call's
/// `copy_bytes`; the copies are scratch): both
/// when both fit, else the one staged by more tiles when it fits alone, else none. A copy holds
/// the F16 values the kernel's own conversion makes, so the product's bits do not depend on
/// the choice; it holds the operand's region only (the elements the product reads).
fn f16_copies(
    regions: [Region; 2],
    factors: &Tensor,
    tiles: (usize, usize),
    batch: usize,
    bound: u64,
) -> Result<[Option<Tensor>; 2]> {
    let engine = regions[0].tensor.engine();
    let shared = |r: &Region| if r.shared { batch } else { 1 };
    let staged_by = [tiles.1 * shared(&regions[0]), tiles.0 * shared(&regions[1])];
    let wanted = [0, 1]
        .map(|i| regions[i].tensor.dtype() != DType::F16 && staged_by[i] >= TC_COPY_MIN_TILES);
    let bytes = regions.map(|r| DType::F16.buffer_bytes(r.len) as u64);
    let size = |take: [bool; 2]| -> u64 { (0..2).filter(|&i| take[i]).map(|i| bytes[i]).sum() };
    let first = if staged_by[0] >= staged_by[1] { 0 } else { 1 };
    let mut take = wanted;
    if size(take) > bound {
        take = [false, false];
        take[first] = wanted[first];
        if size(take) > bound {
            take[first] = false;
            take[1 - first] = wanted[1 - first] && bytes[1 - first] <= bound;
        }
    }
    engine.check_workspace("gemm (tensor-core F16 copies)", size(take))?;
    let mut out = [None, None];
    for (i, r) in regions.into_iter().enumerate() {
        if take[i] {
            out[i] = Some(f16_copy(r, factors, i)?);
        }
    }
    Ok(out)
}

/// The region `r` (BF16 or F32) times factor `slot` of `factors` (0: A's, 1: B's), as an F16
/// tensor of `r.len` values (`tc_stage_f16`).
fn f16_copy(r: Region, factors: &Tensor, slot: usize) -> Result<Tensor> {
    let engine = r.tensor.engine();
    let copy = Tensor::empty(engine, &[r.len], DType::F16, "tensor-core F16 copy")?;
    let params = ScaleParams {
        slot: slot as u32,
        ..r.params()
    };
    engine.launch(
        &KERNEL,
        "tc_stage_f16",
        &Vec::new(),
        &params,
        &[r.tensor.buffer(), factors.buffer(), copy.buffer()],
        (r.len as u64).div_ceil(512),
    )?;
    Ok(copy)
}

/// The elements of a tensor that a product reads: `len` from `start` (even for 16-bit
/// tensors: tensor-core products take offsets that are multiples of 8).
#[derive(Clone, Copy)]
struct Region<'a> {
    tensor: &'a Tensor,
    start: usize,
    len: usize,
    /// One matrix for every batch.
    shared: bool,
}

impl<'a> Region<'a> {
    fn whole(tensor: &'a Tensor) -> Region<'a> {
        Region {
            tensor,
            start: 0,
            len: tensor.len(),
            shared: false,
        }
    }

    /// The region of `op` in a product of `batch` batches of `matrix` elements each.
    fn of(op: &GemmOperand<'a>, batch: usize, matrix: usize) -> Region<'a> {
        let shared = op.batch_stride == 0;
        let span = if shared || batch == 0 {
            matrix
        } else {
            (batch - 1) * op.batch_stride + matrix
        };
        Region {
            tensor: op.tensor,
            start: op.offset,
            len: span.min(op.tensor.len().saturating_sub(op.offset)),
            shared,
        }
    }

    /// The scale kernels' parameters for this region (slot and groups left 0).
    fn params(&self) -> ScaleParams {
        let base = if self.tensor.dtype() == DType::F32 {
            self.start
        } else {
            self.start / 2
        };
        ScaleParams {
            len: self.len as u32,
            dt: self.tensor.dtype().code(),
            base: base as u32,
            ..ScaleParams::default()
        }
    }
}

/// The launch parameters of `tc_scale_part` and `tc_scale_pick` (`wgsl/matmul.wgsl`).
#[derive(encase::ShaderType, Default)]
struct ScaleParams {
    len: u32,
    dt: u32,
    slot: u32,
    groups: u32,
    base: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

/// The power-of-two factors a tensor-core product of `a` and `b` stages its operands with
/// (`None` when both are F16: none): an F32 tensor of 516 values whose first four are `2^sA,
/// 2^sB, 2^−sA, 2^−sB` (the rest the partial maxima). For a BF16 or F32 tensor,
/// `s = clamp(14 − ⌊log2 M⌋, −113, 126)` with `M` its largest finite magnitude (a subnormal `M`
/// counts as binade −127; `s = 0` when no value is finite and nonzero), so every finite value
/// times `2^s` is below 2¹⁵; `s = 0` for F16. Two launches (partial maxima, then the factors),
/// no synchronization; runs on any adapter. See `tc_scale_part` in `wgsl/matmul.wgsl`.
pub fn tensor_core_scales(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    scales_of([Region::whole(a), Region::whole(b)], [None, None])
}

/// The partial maxima of a BF16 or F32 tensor's finite magnitudes: the scan a tensor-core
/// product of it starts with (see [`tensor_core_scales`]), taken once by
/// [`tensor_core_maxima`] so that products reading the whole tensor again can skip it
/// ([`Gemm::maxima`]).
/// It holds the scanned tensor, so that its buffer cannot pass to another tensor while the
/// maxima exist.
#[derive(Debug, Clone)]
pub struct OperandMaxima {
    /// One partial maximum (F32 bits) a workgroup of the scan.
    partials: Tensor,
    /// The tensor scanned.
    source: Tensor,
    /// The elements scanned: `len` of them from element `start`.
    start: usize,
    len: usize,
}

impl OperandMaxima {
    /// The partial maxima: F32 `[groups]` holding the bits of each scan workgroup's largest
    /// finite magnitude (as F32 values: the largest of them is the tensor's).
    pub fn partials(&self) -> &Tensor {
        &self.partials
    }

    /// Workgroups of the scan (partial maxima).
    fn groups(&self) -> u32 {
        self.partials.len() as u32
    }
}

/// The partial maxima of every element of `t` (F32 or BF16; `None` for an F16 or empty
/// tensor, which needs no factor), for [`Gemm::maxima`]: one launch, no synchronization.
/// Valid as long as `t`'s values do not change.
pub fn tensor_core_maxima(t: &Tensor) -> Result<Option<OperandMaxima>> {
    tensor_core_maxima_of(t, 0, t.len())
}

/// [`tensor_core_maxima`] of the `len` elements of `t` from element `start`, for products
/// that read exactly that region (an operand at that offset, of that many elements).
/// Errors: a region past the end of `t` (`OutOfBounds`).
pub fn tensor_core_maxima_of(
    t: &Tensor,
    start: usize,
    len: usize,
) -> Result<Option<OperandMaxima>> {
    let end = start.saturating_add(len);
    if end > t.len() {
        return Err(Error::bounds(
            "tensor_core_maxima_of: end of the region",
            end as u64,
            0,
            t.len() as u64,
        ));
    }
    let region = Region {
        tensor: t,
        start,
        len,
        shared: false,
    };
    let Some(groups) = scan_groups(&region) else {
        return Ok(None);
    };
    let partials = Tensor::empty(t.engine(), &[groups as usize], DType::F32, "operand maxima")?;
    scan(&region, groups, &partials, 0)?;
    Ok(Some(OperandMaxima {
        partials,
        source: t.clone(),
        start,
        len,
    }))
}

/// Workgroups of the maxima scan of `r` (at most 256, each at least 4,096 words); `None` when
/// it has no factor to find (F16 or empty).
fn scan_groups(r: &Region) -> Option<u32> {
    if r.tensor.dtype() == DType::F16 || r.len == 0 {
        return None;
    }
    let words = if r.tensor.dtype() == DType::F32 {
        r.len
    } else {
        r.len.div_ceil(2)
    };
    Some(words.div_ceil(4096).clamp(1, 256) as u32)
}

/// `tc_scale_part` over `r`: its `groups` partial maxima to words `slot..` of `dest`.
fn scan(r: &Region, groups: u32, dest: &Tensor, slot: u32) -> Result<()> {
    let params = ScaleParams {
        slot,
        groups,
        ..r.params()
    };
    r.tensor.engine().launch(
        &KERNEL,
        "tc_scale_part",
        &Vec::new(),
        &params,
        &[r.tensor.buffer(), dest.buffer()],
        u64::from(groups),
    )
}

/// Whether `m` was taken over exactly the elements of `r` (`InvalidValue` otherwise).
fn check_maxima(what: &str, m: &OperandMaxima, r: &Region) -> Result<()> {
    let (src, same_buffer) = (&m.source, m.source.buffer() == r.tensor.buffer());
    let same =
        same_buffer && src.dtype() == r.tensor.dtype() && (m.start, m.len) == (r.start, r.len);
    if same {
        return Ok(());
    }
    Err(Error::InvalidValue {
        what: format!("matmul: maxima of {what}"),
        got: m.len as f64,
        rule: format!(
            "taken over {} {:?} elements from element {}; the product reads {} {:?} elements \
             from element {} of {}",
            m.len,
            src.dtype(),
            m.start,
            r.len,
            r.tensor.dtype(),
            r.start,
            if same_buffer {
                "the same tensor"
            } else {
                "another tensor"
            },
        ),
    })
}

/// [`tensor_core_scales`] of two regions: each factor from the largest finite magnitude of its
/// region's elements, scanned here or taken from `maxima` (checked against the region by the
/// caller).
fn scales_of(regions: [Region; 2], maxima: [Option<&OperandMaxima>; 2]) -> Result<Option<Tensor>> {
    let [a, b] = regions.map(|r| r.tensor);
    if a.dtype() == DType::F16 && b.dtype() == DType::F16 {
        return Ok(None);
    }
    let engine = a.engine();
    let scales = Tensor::empty(engine, &[516], DType::F32, "tensor-core scale factors")?;
    let mut groups = [0u32; 2];
    for (i, r) in regions.into_iter().enumerate() {
        let Some(g) = scan_groups(&r) else {
            continue;
        };
        let slot = 4 + 256 * i as u32;
        match maxima[i] {
            Some(m) => {
                groups[i] = m.groups();
                engine.record(|enc| {
                    enc.copy_buffer_to_buffer(
                        m.partials.buffer(),
                        0,
                        scales.buffer(),
                        4 * u64::from(slot),
                        4 * u64::from(m.groups()),
                    )
                });
            }
            None => {
                groups[i] = g;
                scan(&r, g, &scales, slot)?;
            }
        }
    }
    let params = ScaleParams {
        len: groups[0],
        groups: groups[1],
        ..ScaleParams::default()
    };
    engine.launch(
        &KERNEL,
        "tc_scale_pick",
        &Vec::new(),
        &params,
        &[scales.buffer()],
        1,
    )?;
    Ok(Some(scales))
}

/// `(slices, k per slice)` of a product whose scratch may take `allowance` bytes.
fn split_plan(m: usize, n: usize, k: usize, batch: usize, allowance: u64) -> (usize, usize) {
    let unsplit = (1, k);
    if m == 0 || n == 0 || k == 0 || batch == 0 {
        return unsplit;
    }
    let tiles = (m.div_ceil(TILE_M) as u128) * (n.div_ceil(TILE_N) as u128) * (batch as u128);
    if tiles >= SPLIT_MAX_TILES as u128 {
        return unsplit;
    }
    let tiles = tiles as u64;
    let elements = (batch as u64) * (m as u64) * (n as u64);
    let most = (SPLIT_TARGET_GROUPS as u64)
        .div_ceil(tiles)
        .min((k / SPLIT_MIN_SLICE_K) as u64)
        .min(SPLIT_MAX_SLICES as u64)
        .min(allowance / (4 * elements))
        .min(u64::from(u32::MAX) / elements);
    if most < 2 {
        return unsplit;
    }
    let slice = k.div_ceil(K_STEP).div_ceil(most as usize) * K_STEP;
    let slices = k.div_ceil(slice);
    if slices < 2 {
        return unsplit;
    }
    (slices, slice)
}

/// The number of K slices [`gemm`] splits a product of `batch` `[m, k] @ [k, n]` products
/// into, when the engine's workspace bound does not limit it (1: not split). A pure function
/// of the shape:
///
/// * no split when `T = ⌈m/128⌉·⌈n/128⌉·batch ≥ 256` ([`SPLIT_MAX_TILES`]: enough workgroups
///   already) or when any extent is 0;
/// * else `S = min(⌈512/T⌉, ⌊k/2048⌋, 32)` ([`SPLIT_TARGET_GROUPS`],
///   [`SPLIT_MIN_SLICE_K`], [`SPLIT_MAX_SLICES`]), capped so that the scratch has at most
///   2³²−1 elements; `S < 2` is no split;
/// * each slice takes `⌈⌈k/16⌉/S⌉·16` values of k (a multiple of the 16-wide K step, at least
///   2,048), the last one the rest, so the slice count is `⌈k / slice⌉`.
///
/// Under an engine whose workspace bound is below [`gemm_workspace_bytes`], `gemm` takes the
/// largest `S` whose scratch fits (see [`gemm_split_within`]), or none.
pub fn gemm_split(m: usize, n: usize, k: usize, batch: usize) -> usize {
    gemm_split_within(m, n, k, batch, u64::MAX)
}

/// [`gemm_split`] with the slices' scratch (`4·S·batch·m·n` bytes) limited to `bytes`: `S` is
/// lowered until it fits, 1 (no split) when not even two slices fit. `gemm` uses the engine's
/// workspace bound (and the largest binding) here.
pub fn gemm_split_within(m: usize, n: usize, k: usize, batch: usize, bytes: u64) -> usize {
    split_plan(m, n, k, batch, bytes).0
}

/// Scratch bytes of [`gemm`] for this shape beyond its outputs: the F32 slice sums
/// `[S, batch, m, n]` of a split product (`4·S·batch·m·n`, `S` = [`gemm_split`]), 0 when it is
/// not split. Under a smaller workspace bound `gemm` uses less (fewer slices or none), never
/// more; callers that plan memory count this figure for each product they issue. A
/// tensor-core product may also take F16 copies of its operands and F32 sums staged for its
/// epilogue, within [`Gemm::copy_bytes`] (the workspace bound by default).
pub fn gemm_workspace_bytes(m: usize, n: usize, k: usize, batch: usize) -> u64 {
    split_scratch(m, n, batch, gemm_split(m, n, k, batch))
}

fn split_scratch(m: usize, n: usize, batch: usize, slices: usize) -> u64 {
    if slices < 2 {
        0
    } else {
        4 * (slices as u64) * (batch as u64) * (m as u64) * (n as u64)
    }
}

/// Options of [`matmul`]. Default: no transpose, no activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MatmulOptions {
    /// `A` is stored `[.., K, M]` (its transpose is used).
    pub transpose_a: bool,
    /// `B` is stored `[.., N, K]` (its transpose is used; `x·Wᵀ` with weights `[N, K]`).
    pub transpose_b: bool,
    /// Epilogue `act(A·B + bias)`; the FP32 pre-activation is saved for the backward.
    pub activation: Option<Activation>,
    /// Opt-in: products of two 16-bit operands (F16 or BF16, each either) on tensor cores
    /// ([`Gemm::tensor_cores`]: BF16 scaled by a power of two into F16, FP32 accumulation in
    /// the hardware's order, [`tensor_core_tolerance`]), with the same epilogue (bias,
    /// activation, pre-activation; `matmul_as` stores F16 / BF16). The forward takes them for
    /// 16-bit `A` and `B` (an F32 operand is refused); the backward for a 16-bit cotangent
    /// without an activation (both its products then have 16-bit operands; F32 gradients, or
    /// 16-bit ones with `matmul_backward_as`); the other products run on the FP32 path.
    pub tensor_cores: bool,
}

/// Extents of one product, derived from the operands' shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dims {
    batch_shape: Vec<usize>,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a_batched: bool,
    b_batched: bool,
}

/// What [`matmul`] saves for [`matmul_backward`]: the operand handles (tensors are
/// immutable), whether a bias was added, the FP32 pre-activation (with an activation) and
/// the options.
#[derive(Debug, Clone)]
pub struct MatmulSaved {
    a: Tensor,
    b: Tensor,
    has_bias: bool,
    pre: Option<Tensor>,
    options: MatmulOptions,
    dims: Dims,
}

impl MatmulSaved {
    /// The options of the forward.
    pub fn options(&self) -> &MatmulOptions {
        &self.options
    }

    /// The saved FP32 pre-activation `A·B + bias` (shape of the output), with an activation.
    pub fn pre_activation(&self) -> Option<&Tensor> {
        self.pre.as_ref()
    }

    /// The output shape `[batch.., M, N]` (also the cotangent's).
    pub fn out_shape(&self) -> Vec<usize> {
        let mut s = self.dims.batch_shape.clone();
        s.extend([self.dims.m, self.dims.n]);
        s
    }

    /// `(batch, M, N, K)`: the batch count (product of the batch dimensions) and the extents.
    pub fn extents(&self) -> (usize, usize, usize, usize) {
        (self.dims.batch, self.dims.m, self.dims.n, self.dims.k)
    }
}

/// Gradients of [`matmul`], all F32, each in its operand's stored shape and layout.
#[derive(Debug, Clone)]
pub struct MatmulGradients {
    /// `dA` (`[.., K, M]` for a transposed `A`).
    pub a: Tensor,
    /// `dB` (`[.., N, K]` for a transposed `B`); summed over the batches when `B` is shared.
    pub b: Tensor,
    /// `dbias` `[N]` (summed over every row of every batch), when a bias was given.
    pub bias: Option<Tensor>,
}

/// Floating-point operations of a product: `2·batch·m·n·k`.
pub fn matmul_flops(batch: usize, m: usize, n: usize, k: usize) -> f64 {
    2.0 * batch as f64 * m as f64 * n as f64 * k as f64
}

/// The comparison budget of an output (or gradient) element summed over `terms` FP32
/// products of magnitude ≤ 1 against the f64 reference: the F32 policy of
/// [`crate::gradcheck`] with its absolute part grown to `2e-7·terms`.
pub fn matmul_tolerance(terms: usize) -> crate::gradcheck::Tolerance {
    summed_tolerance(2e-7, terms)
}

/// The F32 policy of [`crate::gradcheck`] with its absolute part grown to `per_term·terms`.
fn summed_tolerance(per_term: f64, terms: usize) -> crate::gradcheck::Tolerance {
    let f32_tol = crate::gradcheck::Tolerance::for_dtype(DType::F32);
    crate::gradcheck::Tolerance {
        abs: f32_tol.abs.max(per_term * terms as f64),
        ..f32_tol
    }
}

/// One operand of [`gemm`]: `tensor` read from element `offset`, batch `b` from
/// `offset + b·batch_stride` (0: shared by every batch). Not transposed: `[m, k]` (A) or
/// `[k, n]` (B) rows; transposed: `[k, m]` (A) or `[n, k]` (B) rows; rows contiguous.
#[derive(Debug, Clone, Copy)]
pub struct GemmOperand<'a> {
    /// The stored elements (F32, F16 or BF16).
    pub tensor: &'a Tensor,
    /// Element offset of batch 0.
    pub offset: usize,
    /// Stored as the transpose (see above).
    pub transposed: bool,
    /// Elements between consecutive batches (0: the same matrix for every batch).
    pub batch_stride: usize,
}

impl<'a> GemmOperand<'a> {
    /// The whole of `tensor` from element 0, one matrix for every batch.
    pub fn whole(tensor: &'a Tensor, transposed: bool) -> GemmOperand<'a> {
        GemmOperand {
            tensor,
            offset: 0,
            transposed,
            batch_stride: 0,
        }
    }
}

/// A low-level product into a caller-owned F32 tensor (see [`gemm`]).
#[derive(Debug, Clone, Copy)]
pub struct Gemm<'a> {
    /// Left operand, logically `[m, k]`.
    pub a: GemmOperand<'a>,
    /// Right operand, logically `[k, n]`.
    pub b: GemmOperand<'a>,
    /// Output, F32 (or F16 / BF16, see [`gemm`]); batch `b`'s `[m, n]` rows start at
    /// `out_offset + b·out_batch_stride`.
    pub out: &'a Tensor,
    /// Element offset of batch 0's output.
    pub out_offset: usize,
    /// Elements between consecutive batches' outputs (at least `m·n` when `batch > 1`).
    pub out_batch_stride: usize,
    /// Rows of the product.
    pub m: usize,
    /// Columns of the product.
    pub n: usize,
    /// Reduction length (0: the product is zero).
    pub k: usize,
    /// Number of batches.
    pub batch: usize,
    /// Optional bias `[n]` (F32, F16 or BF16), added to every row after the scaling.
    pub bias: Option<&'a Tensor>,
    /// `out += alpha·A·B (+ bias)` in FP32 instead of `out = ...`.
    pub accumulate: bool,
    /// Epilogue; not allowed together with `accumulate`.
    pub activation: Option<Activation>,
    /// Where to write the FP32 pre-activation (same indexing as `out`); not with `accumulate`.
    pub pre_activation: Option<&'a Tensor>,
    /// Product scale (1.0 normally); must be finite.
    pub alpha: f32,
    /// Opt-in: run the product on tensor cores (F16 or BF16 operands; see [`gemm`]).
    pub tensor_cores: bool,
    /// Opt-in, with `tensor_cores`: also take F32 operands, each value rounded to F16 after
    /// its operand's power-of-two scaling (11 significant bits, the precision of TF32; see
    /// [`tensor_core_rounded_tolerance`]). A reduced-precision product, hence its own switch.
    pub round_f32_operands: bool,
    /// With `tensor_cores`: at most this many bytes of F16 operand copies (see
    /// [`TC_COPY_MIN_TILES`]) and of F32 sums staged for the epilogue (see
    /// [`TC_STAGE_EPILOGUES`]; taken first); `None` (default): the engine's workspace bound. For callers
    /// that hold a memory budget; the bits do not depend on it.
    pub copy_bytes: Option<u64>,
    /// With `tensor_cores`: A's and B's partial maxima taken beforehand by
    /// [`tensor_core_maxima`] (for products that read one whole tensor many times, such as a
    /// fused linear head's weight), in place of the product's own scan of that operand: the
    /// same factors, so the same bits. Each must have been taken over the very elements the
    /// product reads (its whole tensor), else `InvalidValue`; ignored by products not on
    /// tensor cores and for F16 operands (`None` from `tensor_core_maxima`).
    pub maxima: [Option<&'a OperandMaxima>; 2],
}

impl<'a> Gemm<'a> {
    /// One product `out (=|+=) op(A)·op(B)`, `[m, k] @ [k, n]`, written from element 0 of
    /// `out`: one batch, no bias or epilogue, `alpha` 1. Other fields can be set with struct
    /// update syntax (`Gemm { out_offset, ..Gemm::plain(..) }`).
    pub fn plain(
        a: GemmOperand<'a>,
        b: GemmOperand<'a>,
        out: &'a Tensor,
        (m, n, k): (usize, usize, usize),
        accumulate: bool,
    ) -> Gemm<'a> {
        Gemm {
            a,
            b,
            out,
            out_offset: 0,
            out_batch_stride: m * n,
            m,
            n,
            k,
            batch: 1,
            bias: None,
            accumulate,
            activation: None,
            pre_activation: None,
            alpha: 1.0,
            tensor_cores: false,
            round_f32_operands: false,
            copy_bytes: None,
            maxima: [None, None],
        }
    }
}

/// A product's launch parameters (`struct Params` of `wgsl/common/gemm_params.wgsl`, read by
/// both product modules).
#[derive(encase::ShaderType)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    tiles_m: u32,
    tiles_n: u32,
    off_a: u32,
    off_b: u32,
    off_c: u32,
    stride_a: u32,
    stride_b: u32,
    stride_c: u32,
    alpha: f32,
    has_bias: u32,
    dt_bias: u32,
    accumulate: u32,
    act: u32,
    k_slice: u32,
    slices: u32,
}

impl Params {
    /// The parameters of `call`'s launch over `tiles` = (tile rows, tile columns), split into
    /// `split` = (slices, k per slice), with `bias` bound for the bias (A's buffer without one).
    fn new(call: &Gemm, tiles: (usize, usize), split: (usize, usize), bias: &Tensor) -> Params {
        // Strides only matter from the second batch on, where the extent checks bound them.
        let stride = |s: usize| if call.batch > 1 { s as u32 } else { 0 };
        Params {
            m: call.m as u32,
            n: call.n as u32,
            k: call.k as u32,
            batch: call.batch as u32,
            tiles_m: tiles.0 as u32,
            tiles_n: tiles.1 as u32,
            off_a: call.a.offset as u32,
            off_b: call.b.offset as u32,
            off_c: call.out_offset as u32,
            stride_a: stride(call.a.batch_stride),
            stride_b: stride(call.b.batch_stride),
            stride_c: stride(call.out_batch_stride),
            alpha: call.alpha,
            has_bias: u32::from(call.bias.is_some()),
            dt_bias: bias.dtype().code(),
            accumulate: u32::from(call.accumulate),
            act: call.activation.map_or(0, |a| a.code() + 1),
            k_slice: split.1 as u32,
            slices: split.0 as u32,
        }
    }
}

fn check_float(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(what, t.dtype(), &DType::FLOATS))
    }
}

fn check_f32(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype() == DType::F32 {
        Ok(())
    } else {
        Err(Error::dtype(what, t.dtype(), &[DType::F32]))
    }
}

/// Elements `offset .. offset + (batch − 1)·stride + per` must lie inside `len`, and `len`
/// must be addressable with 32-bit indices.
fn check_extent(
    what: &str,
    len: usize,
    offset: usize,
    batch: usize,
    stride: usize,
    per: usize,
) -> Result<()> {
    let max = u64::from(u32::MAX);
    if len as u64 > max {
        return Err(Error::bounds(
            format!("{what}: elements"),
            len as u64,
            0,
            max,
        ));
    }
    if offset > len {
        return Err(Error::bounds(
            format!("{what}: offset"),
            offset as u64,
            0,
            len as u64,
        ));
    }
    if batch == 0 || per == 0 {
        return Ok(());
    }
    let needed = (offset as u128) + (batch as u128 - 1) * (stride as u128) + per as u128;
    if needed > len as u128 {
        return Err(Error::bounds(
            format!("{what}: last element used + 1"),
            u64::try_from(needed).unwrap_or(u64::MAX),
            0,
            len as u64,
        ));
    }
    Ok(())
}

fn invalid(what: &str, got: f64, rule: &str) -> Error {
    Error::InvalidValue {
        what: what.into(),
        got,
        rule: rule.into(),
    }
}

/// The low-level product: for each batch index `b < batch`, row `i < m`, column `j < n`,
///
/// `out[out_offset + b·out_batch_stride + i·n + j] (= | +=) act(alpha·Σ_l A_b(i, l)·B_b(l, j) + bias[j])`
///
/// with `A_b`, `B_b` read as [`GemmOperand`] describes. Accumulation is FP32 in increasing `l`
/// (`k = 0` gives `bias` or zeros); a product that [`gemm_split`] splits into `S` slices sums
/// each slice in increasing `l` and then the slice sums in increasing slice order, before
/// `alpha` (scratch [`gemm_workspace_bytes`], at most the engine's workspace bound: fewer
/// slices or none when it does not fit); with `accumulate` the FP32 value is added to what `out`
/// holds (no activation then). With `pre_activation` the FP32 value before the activation is
/// written there too. Elements of `out` outside the product are left untouched. Recorded,
/// not submitted; this is the one wgrad call that writes into a caller's tensor.
///
/// `out` is F32, or F16 / BF16 (each FP32 result rounded once to nearest-even; `n`,
/// `out_offset` and, with more than one batch, `out_batch_stride` even; no `accumulate`); the
/// pre-activation is always F32.
///
/// Errors (before anything is recorded): a non-float `a`/`b`/`bias`/`out` or a non-F32
/// `pre_activation` (`UnsupportedDType`); a 16-bit `out` with an odd `n`, offset or batch
/// stride, or with `accumulate` (`InvalidValue`); bias of another length than `n` (`ShapeMismatch`);
/// an offset past a tensor's end or an extent that reads or writes past it, or a tensor of
/// more than 2³²−1 elements (`OutOfBounds`); `out_batch_stride < m·n` with `batch > 1`
/// (outputs of two batches would overlap, `OutOfBounds`); a non-finite `alpha`, an activation
/// or pre-activation together with `accumulate`, or `out` / `pre_activation` sharing a buffer
/// with another argument (`InvalidValue`); tensors of another engine (`EngineMismatch`). With
/// `tensor_cores`: an engine without them (`MissingFeature`, see [`tensor_cores`]), `a` or `b`
/// not F16 or BF16 (F32 too with `round_f32_operands`; `UnsupportedDType`); a call that passes
/// these but not [`tensor_core_fits`] runs on the FP32 path. With tensor cores the sums are the hardware's FP32 accumulation (see the
/// module docs); the epilogue is the same.
pub fn gemm(call: &Gemm) -> Result<()> {
    gemm_within(call, call.out.engine().workspace_bound())
}

/// [`gemm`] launched with `tile` instead of the one [`gemm_tile`] picks: the same results, bit
/// for bit, and the same split and scratch; for measuring the tiles against each other. The
/// launch counts `⌈m/rows⌉·⌈n/cols⌉·batch` workgroups of `tile` (times the slices of a split
/// product), at most 65,535² (`OutOfBounds`).
pub fn gemm_with_tile(call: &Gemm, tile: GemmTile) -> Result<()> {
    gemm_tiled(call, call.out.engine().workspace_bound(), Some(tile))
}

/// [`gemm`] with its split-K scratch limited to `allowance` bytes (and the engine's bound):
/// for operators that hold scratch of their own while they issue products.
pub(crate) fn gemm_within(call: &Gemm, allowance: u64) -> Result<()> {
    gemm_tiled(call, allowance, None)
}

/// [`gemm_within`] with the tile given (`None`: [`gemm_tile`]).
fn gemm_tiled(call: &Gemm, allowance: u64, tile: Option<GemmTile>) -> Result<()> {
    let engine = call.out.engine();
    for (t, what) in [(call.a.tensor, "gemm: a"), (call.b.tensor, "gemm: b")]
        .into_iter()
        .chain(call.bias.map(|t| (t, "gemm: bias")))
        .chain(call.pre_activation.map(|t| (t, "gemm: pre_activation")))
    {
        t.check_engine(engine, what)?;
    }
    check_float(call.a.tensor, "gemm: a")?;
    check_float(call.b.tensor, "gemm: b")?;
    check_float(call.out, "gemm: out")?;
    let narrow_out = call.out.dtype() != DType::F32;
    if narrow_out {
        // Each invocation writes whole words: two columns of one row a word.
        let odd = [
            ("gemm: n (16-bit out)", call.n),
            ("gemm: out_offset (16-bit out)", call.out_offset),
            (
                "gemm: out_batch_stride (16-bit out)",
                if call.batch > 1 {
                    call.out_batch_stride
                } else {
                    0
                },
            ),
        ];
        if let Some((what, v)) = odd.into_iter().find(|(_, v)| v % 2 == 1) {
            return Err(invalid(what, v as f64, "a 16-bit out needs it even"));
        }
        if call.accumulate {
            return Err(invalid(
                "gemm: accumulate (16-bit out)",
                1.0,
                "only an F32 out accumulates",
            ));
        }
    }
    if let Some(bias) = call.bias {
        check_float(bias, "gemm: bias")?;
        if bias.len() != call.n {
            return Err(Error::shape("gemm: bias", &[call.n], bias.shape()));
        }
    }
    if let Some(pre) = call.pre_activation {
        check_f32(pre, "gemm: pre_activation")?;
    }
    if !call.alpha.is_finite() {
        return Err(invalid(
            "gemm: alpha",
            f64::from(call.alpha),
            "must be finite",
        ));
    }
    if call.accumulate && call.activation.is_some() {
        return Err(invalid(
            "gemm: activation with accumulate",
            1.0,
            "an activation epilogue cannot accumulate into out",
        ));
    }
    if call.accumulate && call.pre_activation.is_some() {
        return Err(invalid(
            "gemm: pre_activation with accumulate",
            1.0,
            "the pre-activation is only written by a non-accumulating product",
        ));
    }
    let (m, n, k, batch) = (call.m, call.n, call.k, call.batch);
    let mn = m.saturating_mul(n);
    check_extent(
        "gemm: a",
        call.a.tensor.len(),
        call.a.offset,
        batch,
        call.a.batch_stride,
        m.saturating_mul(k),
    )?;
    check_extent(
        "gemm: b",
        call.b.tensor.len(),
        call.b.offset,
        batch,
        call.b.batch_stride,
        k.saturating_mul(n),
    )?;
    let outputs = std::iter::once((call.out, "gemm: out"))
        .chain(call.pre_activation.map(|t| (t, "gemm: pre_activation")));
    for (t, what) in outputs {
        check_extent(
            what,
            t.len(),
            call.out_offset,
            batch,
            call.out_batch_stride,
            mn,
        )?;
    }
    if batch > 1 && call.out_batch_stride < mn {
        return Err(Error::bounds(
            "gemm: out_batch_stride",
            call.out_batch_stride as u64,
            mn as u64,
            u64::from(u32::MAX),
        ));
    }
    let inputs = [Some(call.a.tensor), Some(call.b.tensor), call.bias];
    for (written, what) in std::iter::once((call.out, "gemm: out"))
        .chain(call.pre_activation.map(|t| (t, "gemm: pre_activation")))
    {
        let mut others = inputs.iter().flatten().copied().collect::<Vec<_>>();
        if what != "gemm: out" {
            others.push(call.out);
        }
        if others.iter().any(|t| t.buffer() == written.buffer()) {
            return Err(invalid(
                what,
                0.0,
                "must not share a buffer with another argument of the call",
            ));
        }
    }
    if call.tensor_cores {
        check_tensor_core_call(call)?;
    }
    if m == 0 || n == 0 || batch == 0 {
        return Ok(());
    }
    if call.tensor_cores && tensor_core_fits(call) {
        let bound = engine.workspace_bound().min(engine.max_binding_bytes());
        return gemm_tc(call, allowance.min(bound));
    }
    let tile = tile.unwrap_or_else(|| gemm_tile(m, n, batch));
    let tiles_m = m.div_ceil(tile.rows());
    let tiles_n = n.div_ceil(tile.cols());
    let tiles = (tiles_m as u64) * (tiles_n as u64) * (batch as u64);
    let allowance = allowance
        .min(engine.workspace_bound())
        .min(engine.max_binding_bytes());
    let (slices, k_slice) = split_plan(m, n, k, batch, allowance);
    // Without a bias, A's buffer is bound in its place (never read).
    let bias = call.bias.unwrap_or(call.a.tensor);
    let params = Params::new(call, (tiles_m, tiles_n), (slices, k_slice), bias);
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    let constants = vec![
        ("DT_A", f64::from(call.a.tensor.dtype().code())),
        ("DT_B", f64::from(call.b.tensor.dtype().code())),
        ("TRANS_A", flag(call.a.transposed)),
        ("TRANS_B", flag(call.b.transposed)),
        ("NARROW", flag(tile == GemmTile::Narrow)),
        ("DT_OUT", f64::from(call.out.dtype().code())),
        ("ALIGNED", flag(chunked_fetches(call))),
        (
            "GROUP_M",
            f64::from(
                GROUP_M
                    .with(std::cell::Cell::get)
                    .unwrap_or(TILE_GROUP_ROWS),
            ),
        ),
    ];
    // The operands bound again as 16-byte chunks (read on the ALIGNED path).
    let chunks = [call.a.tensor.buffer(), call.b.tensor.buffer()];
    if slices > 1 {
        // Split-K: slice sums into scratch, then one fixed-order finish with the epilogue.
        let scratch_bytes = split_scratch(m, n, batch, slices);
        engine.check_workspace("gemm (split-K slice sums)", scratch_bytes)?;
        let part = Tensor::empty(
            engine,
            &[slices * batch * m * n],
            DType::F32,
            "gemm split-K slice sums",
        )?;
        engine.launch(
            &KERNEL,
            "gemm_partial",
            &constants,
            &params,
            &[
                call.a.tensor.buffer(),
                call.b.tensor.buffer(),
                part.buffer(),
                chunks[0],
                chunks[1],
            ],
            tiles * slices as u64,
        )?;
        return split_finish(call, &params, bias, &part);
    }
    let mut buffers = vec![
        call.a.tensor.buffer(),
        call.b.tensor.buffer(),
        bias.buffer(),
        call.out.buffer(),
    ];
    let entry = match call.pre_activation {
        Some(pre) => {
            buffers.push(pre.buffer());
            "gemm_pre"
        }
        None if narrow_out => "gemm_h",
        None => "gemm",
    };
    buffers.extend(chunks);
    engine.launch(&KERNEL, entry, &constants, &params, &buffers, tiles)
}

/// Derive the product's extents from the operands' shapes.
fn dims(a: &Tensor, b: &Tensor, o: &MatmulOptions) -> Result<Dims> {
    let matrix = |t: &Tensor, what: &str| -> Result<()> {
        if t.shape().len() < 2 {
            let mut expected = vec![1; 2 - t.shape().len()];
            expected.extend(t.shape());
            return Err(Error::shape(
                format!("{what} (a matrix: rank ≥ 2)"),
                &expected,
                t.shape(),
            ));
        }
        Ok(())
    };
    matrix(a, "matmul: a")?;
    matrix(b, "matmul: b")?;
    let (ra, rb) = (a.shape().len(), b.shape().len());
    let (a0, a1) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (b0, b1) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    let (m, k) = if o.transpose_a { (a1, a0) } else { (a0, a1) };
    let (kb, n) = if o.transpose_b { (b1, b0) } else { (b0, b1) };
    if kb != k {
        let mut expected = b.shape().to_vec();
        expected[rb - if o.transpose_b { 1 } else { 2 }] = k;
        return Err(Error::shape(
            "matmul: b (inner dimension)",
            &expected,
            b.shape(),
        ));
    }
    let (a_lead, b_lead) = (&a.shape()[..ra - 2], &b.shape()[..rb - 2]);
    if !a_lead.is_empty() && !b_lead.is_empty() && a_lead != b_lead {
        let mut expected = a_lead.to_vec();
        expected.extend(&b.shape()[rb - 2..]);
        return Err(Error::shape(
            "matmul: b (batch dimensions)",
            &expected,
            b.shape(),
        ));
    }
    let batch_shape = if a_lead.is_empty() { b_lead } else { a_lead }.to_vec();
    Ok(Dims {
        batch: batch_shape.iter().product(),
        batch_shape,
        m,
        n,
        k,
        a_batched: !a_lead.is_empty(),
        b_batched: !b_lead.is_empty(),
    })
}

/// Forward: `Y = act(A·B + bias)`, F32 `[batch.., M, N]` (see the module docs for layouts
/// and broadcasting).
///
/// Errors: an operand of rank < 2 or an inner-dimension mismatch (`ShapeMismatch`, expected
/// `b`'s shape with the matching K); batch dimensions present on both operands but different
/// (`ShapeMismatch`); a bias of another shape than `[N]` (`ShapeMismatch`); a non-float
/// dtype (`UnsupportedDType`); tensors of another engine; extents beyond the bounds of
/// [`gemm`] (`OutOfBounds`); with `options.tensor_cores`, those of [`gemm`]'s tensor cores
/// (no tensor cores, an operand not F16 or BF16).
pub fn matmul(
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    options: &MatmulOptions,
) -> Result<(Tensor, MatmulSaved)> {
    matmul_as(a, b, bias, options, DType::F32)
}

/// [`matmul`] with the output stored in `dtype`: F32 gives that function's result; F16 or BF16
/// gives each FP32 value rounded once to nearest-even (bit for bit `cast::cast` of it; a NaN
/// stays a NaN, its payload may differ), written by the product's epilogue for an even `N`
/// (2 bytes an element instead of 4), otherwise computed in F32 and narrowed. The saved
/// context (and the F32 pre-activation of an epilogue) is the same as [`matmul`]'s.
///
/// Errors: those of [`matmul`], and a `dtype` that is not a float dtype (`UnsupportedDType`).
pub fn matmul_as(
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    options: &MatmulOptions,
    dtype: DType,
) -> Result<(Tensor, MatmulSaved)> {
    if !dtype.is_float() {
        return Err(Error::dtype("matmul_as: dtype", dtype, &DType::FLOATS));
    }
    check_float(a, "matmul: a")?;
    check_float(b, "matmul: b")?;
    let engine = a.engine();
    b.check_engine(engine, "matmul: b")?;
    let dims = dims(a, b, options)?;
    if let Some(bias) = bias {
        check_float(bias, "matmul: bias")?;
        bias.check_engine(engine, "matmul: bias")?;
        if bias.shape() != [dims.n] {
            return Err(Error::shape("matmul: bias", &[dims.n], bias.shape()));
        }
    }
    if dtype != DType::F32 && dims.n % 2 == 1 {
        // Two columns a word: an odd N is computed in F32 and narrowed.
        let (out, saved) = matmul_as(a, b, bias, options, DType::F32)?;
        return Ok((crate::cast::cast(&out, dtype)?, saved));
    }
    let mut out_shape = dims.batch_shape.clone();
    out_shape.extend([dims.m, dims.n]);
    let out = Tensor::empty(engine, &out_shape, dtype, "matmul output")?;
    let pre = match options.activation {
        Some(_) => Some(Tensor::empty(
            engine,
            &out_shape,
            DType::F32,
            "matmul pre-activation",
        )?),
        None => None,
    };
    let (m, n, k) = (dims.m, dims.n, dims.k);
    gemm(&Gemm {
        a: GemmOperand {
            tensor: a,
            offset: 0,
            transposed: options.transpose_a,
            batch_stride: if dims.a_batched { m * k } else { 0 },
        },
        b: GemmOperand {
            tensor: b,
            offset: 0,
            transposed: options.transpose_b,
            batch_stride: if dims.b_batched { k * n } else { 0 },
        },
        out: &out,
        out_offset: 0,
        out_batch_stride: m * n,
        m,
        n,
        k,
        batch: dims.batch,
        bias,
        accumulate: false,
        activation: options.activation,
        pre_activation: pre.as_ref(),
        alpha: 1.0,
        tensor_cores: options.tensor_cores,
        round_f32_operands: false,
        copy_bytes: None,
        maxima: [None, None],
    })?;
    Ok((
        out,
        MatmulSaved {
            a: a.clone(),
            b: b.clone(),
            has_bias: bias.is_some(),
            pre,
            options: *options,
            dims,
        },
    ))
}

/// Scratch bytes [`matmul_backward`] allocates beyond its gradients: the F32 `G = dY ⊙
/// act'(pre)` with an activation, the column partials of `dbias` with a bias, and the largest
/// split-K scratch ([`gemm_workspace_bytes`]) of the products it issues (one at a time). The
/// call checks the first two against the engine's workspace bound; its products then split
/// within what is left of the bound (fewer slices or none), so the whole call stays within
/// both this figure and the bound.
pub fn matmul_backward_workspace_bytes(saved: &MatmulSaved) -> u64 {
    own_backward_bytes(saved)
        + backward_products(&saved.dims, &saved.options)
            .into_iter()
            .map(|(m, n, k, batch)| gemm_workspace_bytes(m, n, k, batch))
            .max()
            .unwrap_or(0)
}

/// The scratch of [`matmul_backward`] outside its products.
fn own_backward_bytes(saved: &MatmulSaved) -> u64 {
    let d = &saved.dims;
    let rows = d.batch * d.m;
    let g = if saved.options.activation.is_some() {
        (rows * d.n * 4) as u64
    } else {
        0
    };
    let bias = if saved.has_bias {
        reduce::sum_columns_workspace_bytes(rows, d.n)
    } else {
        0
    };
    g + bias
}

/// `(m, n, k, batch)` of each product [`matmul_backward`] issues (a batch sum is `batch`
/// products of batch 1).
fn backward_products(d: &Dims, o: &MatmulOptions) -> Vec<(usize, usize, usize, usize)> {
    let (m, n, k, batch) = (d.m, d.n, d.k, d.batch);
    let (ta, tb) = (o.transpose_a, o.transpose_b);
    let da = if ta { (k, m, n) } else { (m, k, n) };
    let da_batch = if d.a_batched { batch } else { 1 };
    let (db, db_batch) = if d.b_batched || !d.a_batched {
        let e = if tb { (n, k, m) } else { (k, n, m) };
        (e, if d.b_batched { batch } else { 1 })
    } else if !ta {
        (
            if tb {
                (n, k, batch * m)
            } else {
                (k, n, batch * m)
            },
            1,
        )
    } else {
        (if tb { (n, k, m) } else { (k, n, m) }, 1)
    };
    vec![(da.0, da.1, da.2, da_batch), (db.0, db.1, db.2, db_batch)]
}

/// A product summed over batches in batch order: batch 0 is written, each later batch added
/// (one launch per batch). No batches: `out` is zero-filled.
fn gemm_batch_sum(call: Gemm, allowance: u64) -> Result<()> {
    if call.batch == 0 {
        let engine = call.out.engine();
        engine.zero(call.out.buffer(), call.out.byte_len());
        return Ok(());
    }
    for bi in 0..call.batch {
        let mut one = call;
        one.batch = 1;
        one.a.offset += bi * call.a.batch_stride;
        one.b.offset += bi * call.b.batch_stride;
        one.accumulate = bi > 0;
        gemm_within(&one, allowance)?;
    }
    Ok(())
}

/// Backward of [`matmul`]: `dy` of the output's shape (any float dtype). Returns F32
/// `dA = G·Bᵀ`, `dB = Aᵀ·G` and `dbias = Σ_rows G` with `G = dy ⊙ act'(pre)` (`G = dy`
/// without an activation), each in its operand's stored shape; a shared operand's gradient is
/// summed over the batches in batch order.
///
/// Errors: `dy` of another shape (`ShapeMismatch`) or a non-float dtype; another engine;
/// the scratch of `G` and the bias partials beyond the engine's bound (`WorkspaceExceeded`,
/// see [`matmul_backward_workspace_bytes`]; the products' split-K scratch never fails, it
/// shrinks to what is left).
pub fn matmul_backward(saved: &MatmulSaved, dy: &Tensor) -> Result<MatmulGradients> {
    matmul_backward_as(saved, dy, DType::F32)
}

/// [`matmul_backward`] with every gradient (`dA`, `dB`, `dbias`) stored in `dtype`: F32 gives
/// that function's result; F16 or BF16 gives each FP32 gradient rounded once to nearest-even
/// (bit for bit `cast::cast` of it; a NaN stays a NaN, its payload may differ). A product that
/// is not summed over batches and whose stored rows have an even length (`K` for `dA`, `N` for
/// `dB`; `M` for a transposed `A`, `K` for a transposed `B`) stores its 16-bit words from the
/// epilogue, so no F32 copy of that gradient exists; a batch sum (a shared operand, except `B`
/// shared by an untransposed batched `A`, which is one product), an odd row length and `dbias`
/// are computed in F32 and narrowed.
///
/// Errors: those of [`matmul_backward`], and a `dtype` that is not a float dtype
/// (`UnsupportedDType`).
pub fn matmul_backward_as(
    saved: &MatmulSaved,
    dy: &Tensor,
    dtype: DType,
) -> Result<MatmulGradients> {
    if !dtype.is_float() {
        return Err(Error::dtype(
            "matmul_backward_as: dtype",
            dtype,
            &DType::FLOATS,
        ));
    }
    check_float(dy, "matmul_backward: dy")?;
    let engine = saved.a.engine();
    dy.check_engine(engine, "matmul_backward: dy")?;
    let out_shape = saved.out_shape();
    if dy.shape() != out_shape.as_slice() {
        return Err(Error::shape("matmul_backward: dy", &out_shape, dy.shape()));
    }
    let own = own_backward_bytes(saved);
    engine.check_workspace("matmul_backward", own)?;
    // The products split within what the call's own scratch leaves of the bound.
    let allowance = engine.workspace_bound() - own;
    let gemm = |call: &Gemm| gemm_within(call, allowance);
    let gemm_batch_sum = |call: Gemm| gemm_batch_sum(call, allowance);
    let d = &saved.dims;
    let (m, n, k, batch) = (d.m, d.n, d.k, d.batch);
    let (ta, tb) = (saved.options.transpose_a, saved.options.transpose_b);
    let (a, b) = (&saved.a, &saved.b);
    let g = match (saved.options.activation, &saved.pre) {
        (Some(kind), Some(pre)) => {
            activation::backward(&ActivationSaved::unary(kind, pre), dy)?.dgate
        }
        _ => dy.clone(),
    };
    let a_stride = if d.a_batched { m * k } else { 0 };
    let b_stride = if d.b_batched { k * n } else { 0 };
    let op = |tensor, transposed, batch_stride| GemmOperand {
        tensor,
        offset: 0,
        transposed,
        batch_stride,
    };
    // Tensor cores (opted in by the forward's options) where both operands of a product are
    // 16-bit, i.e. for a 16-bit cotangent without an activation (F32 or 16-bit gradients).
    let tc = saved.options.tensor_cores
        && [a.dtype(), b.dtype(), g.dtype()]
            .iter()
            .all(|&t| t != DType::F32);
    let plain = |a_op, b_op, out, rows, cols, inner, count, out_stride| Gemm {
        batch: count,
        out_batch_stride: out_stride,
        tensor_cores: tc,
        ..Gemm::plain(a_op, b_op, out, (rows, cols, inner), false)
    };
    // A gradient's storage: `dtype` where its product writes it whole (not a batch sum) in
    // rows of even length (two 16-bit values a word), F32 otherwise (narrowed at the end).
    let store = |row_len: usize, summed: bool| {
        if dtype == DType::F32 || (summed && batch > 1) || row_len % 2 == 1 {
            DType::F32
        } else {
            dtype
        }
    };

    // dA = G·Bᵀ ([M, K]); transposed A: dAᵀ = B·Gᵀ ([K, M]).
    let da_dtype = store(if ta { m } else { k }, !d.a_batched);
    let da = Tensor::empty(engine, a.shape(), da_dtype, "matmul dA")?;
    let da_call = if ta {
        plain(
            op(b, tb, b_stride),
            op(&g, true, m * n),
            &da,
            k,
            m,
            n,
            batch,
            m * k,
        )
    } else {
        plain(
            op(&g, false, m * n),
            op(b, !tb, b_stride),
            &da,
            m,
            k,
            n,
            batch,
            m * k,
        )
    };
    if d.a_batched {
        gemm(&da_call)?;
    } else {
        // A shared by the batches: its gradient is the batch sum, in batch order.
        gemm_batch_sum(da_call)?;
    }

    // dB = Aᵀ·G ([K, N]); transposed B: dBᵀ = Gᵀ·A ([N, K]).
    let db_summed = !d.b_batched && (!d.a_batched || ta);
    let db_dtype = store(if tb { k } else { n }, db_summed);
    let db = Tensor::empty(engine, b.shape(), db_dtype, "matmul dB")?;
    if d.b_batched || !d.a_batched {
        let call = if tb {
            plain(
                op(&g, true, m * n),
                op(a, ta, a_stride),
                &db,
                n,
                k,
                m,
                batch,
                k * n,
            )
        } else {
            plain(
                op(a, !ta, a_stride),
                op(&g, false, m * n),
                &db,
                k,
                n,
                m,
                batch,
                k * n,
            )
        };
        if d.b_batched {
            gemm(&call)?;
        } else {
            gemm_batch_sum(call)?;
        }
    } else if !ta {
        // B shared, A batched with [M, K] rows: the batches continue the reduction over rows,
        // so the batch sum is one product over batch·M rows.
        let rows = batch * m;
        let call = if tb {
            plain(op(&g, true, 0), op(a, false, 0), &db, n, k, rows, 1, 0)
        } else {
            plain(op(a, true, 0), op(&g, false, 0), &db, k, n, rows, 1, 0)
        };
        gemm(&call)?;
    } else {
        let call = if tb {
            plain(
                op(&g, true, m * n),
                op(a, true, a_stride),
                &db,
                n,
                k,
                m,
                batch,
                0,
            )
        } else {
            plain(
                op(a, false, a_stride),
                op(&g, false, m * n),
                &db,
                k,
                n,
                m,
                batch,
                0,
            )
        };
        gemm_batch_sum(call)?;
    }

    let bias = if saved.has_bias {
        Some(reduce::sum_columns(&g)?)
    } else {
        None
    };
    Ok(MatmulGradients {
        a: crate::cast::cast(&da, dtype)?,
        b: crate::cast::cast(&db, dtype)?,
        bias: bias.map(|t| crate::cast::cast(&t, dtype)).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tc_stage_f16` on any adapter: each BF16 value times its operand's factor exactly when
    /// it lies within 2³¹ of the tensor's largest (F16's subnormal grid below that), F32
    /// values within half an F16 unit of the scaled value, odd lengths included.
    #[test]
    fn f16_copies_hold_the_scaled_values() {
        let e = crate::Engine::new().unwrap();
        let f16 = crate::cast::cast(
            &Tensor::from_slice(&e, &[1.0f32; 8], &[8]).unwrap(),
            DType::F16,
        )
        .unwrap();
        for dt in [DType::BF16, DType::F32] {
            for len in [1usize, 7, 1000, 70_001] {
                let v: Vec<f32> = (0..len)
                    .map(|i| {
                        let x = ((i * 7919) % 2001) as f32 / 1000.0 - 1.0;
                        x * 2f32.powi(-20 - (i / 5 % 40) as i32)
                    })
                    .collect();
                let t = Tensor::from_slice(&e, &v, &[len]).unwrap();
                let t = crate::cast::cast(&t, dt).unwrap();
                let stored = t.to_f64().unwrap();
                let factors = tensor_core_scales(&t, &f16).unwrap().unwrap();
                let s = factors.to_f64().unwrap()[0];
                let copy = f16_copy(Region::whole(&t), &factors, 0)
                    .unwrap()
                    .to_f64()
                    .unwrap();
                // A region's copy (an even start, as tensor-core offsets are) holds the same
                // values as the whole tensor's copy there; its own factor is that of its
                // largest magnitude.
                if len >= 8 {
                    let (start, n) = ((len / 4) & !1, len / 2 + 1);
                    let region = Region {
                        tensor: &t,
                        start,
                        len: n,
                        shared: true,
                    };
                    let part = f16_copy(region, &factors, 0).unwrap().to_f64().unwrap();
                    assert_eq!(part, copy[start..start + n], "{dt:?} {len}: region copy");
                    let own = scales_of([region, Region::whole(&f16)], [None, None])
                        .unwrap()
                        .unwrap();
                    let top = stored[start..start + n]
                        .iter()
                        .fold(0f64, |m, x| m.max(x.abs()));
                    let s = own.to_f64().unwrap()[0];
                    assert!(
                        top * s < 32768.0 && top * s >= 8192.0,
                        "{dt:?} {len}: region factor {s}"
                    );
                }
                let top = stored.iter().fold(0f64, |m, x| m.max(x.abs()));
                assert!(
                    top * s < 32768.0 && top * s >= 8192.0,
                    "{dt:?} {len}: factor {s}"
                );
                for (i, (&x, &c)) in stored.iter().zip(&copy).enumerate() {
                    let want = x * s;
                    let err = (c - want).abs();
                    let unit = (want.abs() * 2f64.powi(-11)).max(2f64.powi(-25));
                    let label = format!("{dt:?} len {len} value {i}: {x} × {s} → {c}");
                    if dt == DType::BF16 && x.abs() >= top * 2f64.powi(-31) {
                        assert_eq!(c, want, "{label}");
                    } else {
                        assert!(err <= unit, "{label}");
                    }
                }
            }
        }
    }
}
