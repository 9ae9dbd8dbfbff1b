// Dense matrix product on tensor cores (cooperative matrices), the opt-in path of
// `matmul::gemm` for F16 operands (`Gemm::tensor_cores`, `MatmulOptions::tensor_cores`):
//
//   out[off_c + b·stride_c + i·n + j] (=|+=) alpha · Σ_{l < k} A_b(i, l) · B_b(l, j)
//
// with A_b(i, l) at off_a + b·stride_a + i·k + l ([m, k] rows), or + l·m + i when TRANS_A, and
// B_b(l, j) at off_b + b·stride_b + l·n + j ([k, n] rows), or + j·k + l when TRANS_B ([n, k]).
// A and B are F16 (two halves a u32 word), out is F32. Products of two F16 values are exact in
// FP32; the sums are the tensor cores' FP32 accumulation, whose order and rounding inside one
// 16-wide k step are the hardware's, not one IEEE fma per term: the results are deterministic on
// one device (a fixed schedule, no atomics) but not the bits of the FP32 path
// (`wgsl/matmul.wgsl`), hence an opt-in with its own tolerance (`matmul::TENSOR_CORE_TOLERANCE`).
//
// This module starts with `enable wgpu_cooperative_matrix;` (its own file for that reason) and
// runs only where the device has `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` with a 16×16×16
// F16 × F16 → F32 configuration and subgroups of 32 invocations (the host checks both).
//
// Tiling: a workgroup of 256 invocations (8 subgroups of 32) computes a 128×128 output tile;
// subgroup s owns rows 32·(s / 2).. and columns 64·(s % 2).., 2 × 4 fragments of 16×16 held
// as F32 accumulators. K advances in steps of BK = 32: the step's A (128×32) and B (32×128)
// F16 values, two 16-byte chunks of each per invocation, are fetched into registers while the
// previous step is multiplied, then stored to workgroup memory in the operand's own layout
// (rows along its contiguous axis, padded by 8 halves so that fragment rows start on
// different banks), from which each subgroup loads its fragments (two k fragments a step).
// Chunks past k are zeros. The host's rule (`matmul::tensor_core_fits`): m and n multiples
// of 128 (whole tiles: the fragments are stored straight to out), every operand's contiguous
// extent, offset and batch stride a multiple of 8 halves (16-byte chunks), out's offset and
// batch stride multiples of 4; no bias, activation or pre-activation.

override TRANS_A: u32 = 0u;     // 1: A stored [k, m]
override TRANS_B: u32 = 0u;     // 1: B stored [n, k]

const BM: u32 = 128u;
const BN: u32 = 128u;
const BK: u32 = 32u;
const PAD: u32 = 8u;
const TILE_HALVES: u32 = 5120u;  // max(128 · (32 + 8), 32 · (128 + 8)) halves, 10 KiB

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    tiles_m: u32,    // ceil(m / BM)
    tiles_n: u32,    // ceil(n / BN)
    off_a: u32,      // element offsets of batch 0
    off_b: u32,
    off_c: u32,
    stride_a: u32,   // element strides between batches (0: shared operand)
    stride_b: u32,
    stride_c: u32,
    alpha: f32,
    accumulate: u32, // 1: out += v
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a4: array<vec4<u32>>;  // A, B as 16-byte chunks
@group(0) @binding(2) var<storage, read> b4: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> a_tile: array<f16, TILE_HALVES>;
var<workgroup> b_tile: array<f16, TILE_HALVES>;

// Halves per staged row and the operand's staged geometry: a k-contiguous operand (A not
// transposed, B transposed) is staged as 128 rows of BK halves, the other as BK rows of 128.
fn pitch(kc: bool) -> u32 {
    return select(BM + PAD, BK + PAD, kc);
}

// The staging slot of chunk c (0..512) of a step: (row, first column) in the staged layout.
fn chunk_slot(kc: bool, c: u32) -> vec2<u32> {
    if (kc) {
        return vec2<u32>(c / (BK / 8u), (c % (BK / 8u)) * 8u);
    }
    return vec2<u32>(c / (BM / 8u), (c % (BM / 8u)) * 8u);
}

// Chunk c of the step at k0 of an operand: `rows` its extent along the tile's 128 (m or n),
// `base` its batch's first element, tile row/column origin `x0`. kc: consecutive k adjacent.
fn fetch(kc: bool, c: u32, x0: u32, k0: u32, rows: u32, base: u32, is_a: bool) -> vec4<u32> {
    let s = chunk_slot(kc, c);
    var x: u32;
    var kk: u32;
    var e: u32;
    var inside: bool;
    if (kc) {
        x = x0 + s.x;
        kk = k0 + s.y;
        inside = x < rows && kk < params.k;
        e = base + x * params.k + kk;
    } else {
        kk = k0 + s.x;
        x = x0 + s.y;
        inside = kk < params.k && x < rows;
        e = base + kk * rows + x;
    }
    // No early return: a return under a branch on the invocation would make the callers'
    // cooperative operations non-uniform to naga. Outside chunks read chunk 0 and are zeroed.
    let at = select(0u, e / 8u, inside);
    var w: vec4<u32>;
    if (is_a) {
        w = a4[at];
    } else {
        w = b4[at];
    }
    return select(vec4<u32>(), w, inside);
}

fn store_a(kc: bool, c: u32, w: vec4<u32>) {
    let s = chunk_slot(kc, c);
    let at = s.x * pitch(kc) + s.y;
    let h0 = vec2<f16>(unpack2x16float(w.x));
    let h1 = vec2<f16>(unpack2x16float(w.y));
    let h2 = vec2<f16>(unpack2x16float(w.z));
    let h3 = vec2<f16>(unpack2x16float(w.w));
    a_tile[at] = h0.x;
    a_tile[at + 1u] = h0.y;
    a_tile[at + 2u] = h1.x;
    a_tile[at + 3u] = h1.y;
    a_tile[at + 4u] = h2.x;
    a_tile[at + 5u] = h2.y;
    a_tile[at + 6u] = h3.x;
    a_tile[at + 7u] = h3.y;
}

fn store_b(kc: bool, c: u32, w: vec4<u32>) {
    let s = chunk_slot(kc, c);
    let at = s.x * pitch(kc) + s.y;
    let h0 = vec2<f16>(unpack2x16float(w.x));
    let h1 = vec2<f16>(unpack2x16float(w.y));
    let h2 = vec2<f16>(unpack2x16float(w.z));
    let h3 = vec2<f16>(unpack2x16float(w.w));
    b_tile[at] = h0.x;
    b_tile[at + 1u] = h0.y;
    b_tile[at + 2u] = h1.x;
    b_tile[at + 3u] = h1.y;
    b_tile[at + 4u] = h2.x;
    b_tile[at + 5u] = h2.y;
    b_tile[at + 6u] = h3.x;
    b_tile[at + 7u] = h3.y;
}

// The A fragment of tile rows r.., step columns kk.. (16×16).
fn frag_a(r: u32, kk: u32) -> coop_mat16x16<f16, A> {
    var f: coop_mat16x16<f16, A>;
    if (TRANS_A == 0u) {
        f = coopLoadT<coop_mat16x16<f16, A>>(&a_tile[r * (BK + PAD) + kk], BK + PAD);
    } else {
        f = coopLoad<coop_mat16x16<f16, A>>(&a_tile[kk * (BM + PAD) + r], BM + PAD);
    }
    return f;
}

// The B fragment of step rows kk.., tile columns c.. (16×16).
fn frag_b(kk: u32, c: u32) -> coop_mat16x16<f16, B> {
    var f: coop_mat16x16<f16, B>;
    if (TRANS_B == 1u) {
        f = coopLoad<coop_mat16x16<f16, B>>(&b_tile[c * (BK + PAD) + kk], BK + PAD);
    } else {
        f = coopLoadT<coop_mat16x16<f16, B>>(&b_tile[kk * (BN + PAD) + c], BN + PAD);
    }
    return f;
}

// alpha times an accumulator of output rows i.., columns j.., written to out (or added to
// out's values with accumulate). Whole tiles only: a cooperative operation must not sit under
// a branch on the subgroup's position (naga's uniformity rule), so none is skipped.
fn acc_store(acc: coop_mat16x16<f32, C>, i: u32, j: u32, c0: u32) {
    // The stride is a named value: naga 30's SPIR-V writer does not emit an expression written
    // inline in `coopStore`'s arguments.
    let stride = params.n;
    let at = c0 + i * stride + j;
    var v = acc * params.alpha;
    if (params.accumulate == 1u) {
        v = v + coopLoadT<coop_mat16x16<f32, C>>(&out[at], stride);
    }
    let result = v;
    coopStoreT(result, &out[at], stride);
}

@compute @workgroup_size(256)
fn gemm_tc(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32) {
    let tile = wid.x + nwg.x * (wid.y + nwg.y * wid.z); // group_index, inline (see below)
    let per_batch = params.tiles_m * params.tiles_n;
    if (tile >= per_batch * params.batch) {
        return;
    }
    let bi = tile / per_batch;
    let t = tile % per_batch;
    let m0 = (t / params.tiles_n) * BM;
    let n0 = (t % params.tiles_n) * BN;
    let akc = TRANS_A == 0u;
    let bkc = TRANS_B == 1u;
    let abase = params.off_a + bi * params.stride_a;
    let bbase = params.off_b + bi * params.stride_b;
    let c0 = params.off_c + bi * params.stride_c;
    // This subgroup's 32×64 block of the tile (tile coordinates).
    let wr = (sg / 2u) * 32u;
    let wc = (sg % 2u) * 64u;
    let i0 = m0 + wr;
    let j0 = n0 + wc;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    var fa0 = fetch(akc, lid, m0, 0u, params.m, abase, true);
    var fa1 = fetch(akc, lid + 256u, m0, 0u, params.m, abase, true);
    var fb0 = fetch(bkc, lid, n0, 0u, params.n, bbase, false);
    var fb1 = fetch(bkc, lid + 256u, n0, 0u, params.n, bbase, false);
    for (var k0 = 0u; k0 < params.k; k0 += BK) {
        workgroupBarrier();
        store_a(akc, lid, fa0);
        store_a(akc, lid + 256u, fa1);
        store_b(bkc, lid, fb0);
        store_b(bkc, lid + 256u, fb1);
        workgroupBarrier();
        let kn = k0 + BK;
        if (kn < params.k) {
            fa0 = fetch(akc, lid, m0, kn, params.m, abase, true);
            fa1 = fetch(akc, lid + 256u, m0, kn, params.m, abase, true);
            fb0 = fetch(bkc, lid, n0, kn, params.n, bbase, false);
            fb1 = fetch(bkc, lid + 256u, n0, kn, params.n, bbase, false);
        }
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = frag_a(wr, kk);
            let a1 = frag_a(wr + 16u, kk);
            let b0 = frag_b(kk, wc);
            let b1 = frag_b(kk, wc + 16u);
            let b2 = frag_b(kk, wc + 32u);
            let b3 = frag_b(kk, wc + 48u);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
        }
    }
    acc_store(c00, i0, j0, c0);
    acc_store(c01, i0, j0 + 16u, c0);
    acc_store(c02, i0, j0 + 32u, c0);
    acc_store(c03, i0, j0 + 48u, c0);
    acc_store(c10, i0 + 16u, j0, c0);
    acc_store(c11, i0 + 16u, j0 + 16u, c0);
    acc_store(c12, i0 + 16u, j0 + 32u, c0);
    acc_store(c13, i0 + 16u, j0 + 48u, c0);
}
