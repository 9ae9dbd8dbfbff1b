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
// How fragments reach the subgroups (measurement variants; the host's rule picks one):
// 0: loaded straight from the operands' buffers (no staging, no barriers; k a multiple of 16);
// 1: staged, chunks fetched as u32 words and converted; 2: staged, chunks fetched as F16.
override STAGE: u32 = 1u;
override BK: u32 = 32u;         // K step of the staged variants: 32 or 64

const BM: u32 = 128u;
const BN: u32 = 128u;
const PAD: u32 = 8u;
override DB: bool = false;      // two staging buffers, one barrier a step (BK 32 only)
// Subgroup tiles of 64×64 (16 accumulators) on 4 subgroups (128 invocations) instead of 32×64
// on 8; staged variants without DB, BK 32 (each invocation stages 4 chunks an operand).
override W64: bool = false;
override LANES: u32 = select(256u, 128u, W64);
// A k-contiguous B ([n, k]) staged transposed, as BK rows of 128 columns (each chunk's eight
// values scattered over eight rows), so that its fragments load row by row.
override BT: bool = false;
// Quads of halves per staging buffer (one of each operand): the larger of 128 · (BK + 8) and
// BK · (128 + 8) halves, 9,216 at BK 64; two buffers of 5,120 at BK 32 with DB (20 KiB).
const TILE_QUADS: u32 = 2560u;

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
@group(0) @binding(4) var<storage, read> a8: array<vec4<f16>>;  // A, B as 8-byte F16 quads
@group(0) @binding(5) var<storage, read> b8: array<vec4<f16>>;
@group(0) @binding(6) var<storage, read> a16: array<f16>;       // A, B element by element
@group(0) @binding(7) var<storage, read> b16: array<f16>;

// Eight F16 values of one chunk.
struct H8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}

var<workgroup> a_tile: array<vec4<f16>, TILE_QUADS>;
var<workgroup> b_tile: array<vec4<f16>, TILE_QUADS>;

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
fn fetch(kc: bool, c: u32, x0: u32, k0: u32, rows: u32, base: u32, is_a: bool) -> H8 {
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
    var h: H8;
    if (STAGE == 2u) {
        if (is_a) {
            h = H8(a8[2u * at], a8[2u * at + 1u]);
        } else {
            h = H8(b8[2u * at], b8[2u * at + 1u]);
        }
    } else {
        var w: vec4<u32>;
        if (is_a) {
            w = a4[at];
        } else {
            w = b4[at];
        }
        h = H8(vec4<f16>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y))),
               vec4<f16>(vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w))));
    }
    if (!inside) {
        h = H8(vec4<f16>(), vec4<f16>());
    }
    return h;
}

// Store a fetched chunk into staging buffer `buf` (0 or 1; 1 only with DB), two quads.
fn store_a(kc: bool, c: u32, h: H8, buf: u32) {
    let s = chunk_slot(kc, c);
    let at = (s.x * pitch(kc) + s.y) / 4u + buf * (TILE_QUADS / 2u);
    a_tile[at] = h.lo;
    a_tile[at + 1u] = h.hi;
}

fn store_b(kc: bool, c: u32, h: H8, buf: u32) {
    let s = chunk_slot(kc, c);
    if (BT && kc) {
        // Element (k, n) = (s.y + i, s.x) at half (s.y + i)·(BN + PAD) + s.x.
        let q0 = buf * (TILE_QUADS / 2u);
        let e0 = s.y * (BN + PAD) + s.x;
        let p = BN + PAD;
        b_tile[q0 + e0 / 4u][e0 % 4u] = h.lo.x;
        b_tile[q0 + (e0 + p) / 4u][(e0 + p) % 4u] = h.lo.y;
        b_tile[q0 + (e0 + 2u * p) / 4u][(e0 + 2u * p) % 4u] = h.lo.z;
        b_tile[q0 + (e0 + 3u * p) / 4u][(e0 + 3u * p) % 4u] = h.lo.w;
        b_tile[q0 + (e0 + 4u * p) / 4u][(e0 + 4u * p) % 4u] = h.hi.x;
        b_tile[q0 + (e0 + 5u * p) / 4u][(e0 + 5u * p) % 4u] = h.hi.y;
        b_tile[q0 + (e0 + 6u * p) / 4u][(e0 + 6u * p) % 4u] = h.hi.z;
        b_tile[q0 + (e0 + 7u * p) / 4u][(e0 + 7u * p) % 4u] = h.hi.w;
        return;
    }
    let at = (s.x * pitch(kc) + s.y) / 4u + buf * (TILE_QUADS / 2u);
    b_tile[at] = h.lo;
    b_tile[at + 1u] = h.hi;
}

// The fragments of the direct variant (STAGE 0), from the operands' buffers: A at output
// rows i.., k kk..; B at k kk.., output columns j...
fn direct_a(i: u32, kk: u32, base: u32) -> coop_mat16x16<f16, A> {
    var f: coop_mat16x16<f16, A>;
    if (TRANS_A == 0u) {
        let stride = params.k;
        f = coopLoadT<coop_mat16x16<f16, A>>(&a16[base + i * stride + kk], stride);
    } else {
        let stride = params.m;
        f = coopLoad<coop_mat16x16<f16, A>>(&a16[base + kk * stride + i], stride);
    }
    return f;
}

fn direct_b(kk: u32, j: u32, base: u32) -> coop_mat16x16<f16, B> {
    var f: coop_mat16x16<f16, B>;
    if (TRANS_B == 1u) {
        let stride = params.k;
        f = coopLoad<coop_mat16x16<f16, B>>(&b16[base + j * stride + kk], stride);
    } else {
        let stride = params.n;
        f = coopLoadT<coop_mat16x16<f16, B>>(&b16[base + kk * stride + j], stride);
    }
    return f;
}

// The A fragment of tile rows r.., step columns kk.. (16×16) from staging buffer `buf`; the
// loads address quads (offsets and strides in quads: every fragment starts on one).
fn frag_a(r: u32, kk: u32, buf: u32) -> coop_mat16x16<f16, A> {
    var f: coop_mat16x16<f16, A>;
    let q0 = buf * (TILE_QUADS / 2u);
    if (TRANS_A == 0u) {
        let stride = (BK + PAD) / 4u;
        f = coopLoadT<coop_mat16x16<f16, A>>(&a_tile[q0 + (r * (BK + PAD) + kk) / 4u], stride);
    } else {
        let stride = (BM + PAD) / 4u;
        f = coopLoad<coop_mat16x16<f16, A>>(&a_tile[q0 + (kk * (BM + PAD) + r) / 4u], stride);
    }
    return f;
}

// The B fragment of step rows kk.., tile columns c.. (16×16).
fn frag_b(kk: u32, c: u32, buf: u32) -> coop_mat16x16<f16, B> {
    var f: coop_mat16x16<f16, B>;
    let q0 = buf * (TILE_QUADS / 2u);
    if ((TRANS_B == 1u) & !BT) {
        let stride = (BK + PAD) / 4u;
        f = coopLoad<coop_mat16x16<f16, B>>(&b_tile[q0 + (c * (BK + PAD) + kk) / 4u], stride);
    } else {
        let stride = (BN + PAD) / 4u;
        f = coopLoadT<coop_mat16x16<f16, B>>(&b_tile[q0 + (kk * (BN + PAD) + c) / 4u], stride);
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

@compute @workgroup_size(LANES)
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
    let wr = (sg / 2u) * select(32u, 64u, W64);
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
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c22 = coop_mat16x16<f32, C>();
    var c23 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    var c32 = coop_mat16x16<f32, C>();
    var c33 = coop_mat16x16<f32, C>();
    if (STAGE == 0u) {
        for (var kk = 0u; kk < params.k; kk += 16u) {
            let a0 = direct_a(i0, kk, abase);
            let a1 = direct_a(i0 + 16u, kk, abase);
            let b0 = direct_b(kk, j0, bbase);
            let b1 = direct_b(kk, j0 + 16u, bbase);
            let b2 = direct_b(kk, j0 + 32u, bbase);
            let b3 = direct_b(kk, j0 + 48u, bbase);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
        }
    } else if (DB) {
        // BK 32: two chunks a lane per operand and step, staged into the buffer the
        // subgroups are not reading; one barrier a step.
        var fa0 = fetch(akc, lid, m0, 0u, params.m, abase, true);
        var fa1 = fetch(akc, lid + 256u, m0, 0u, params.m, abase, true);
        var fb0 = fetch(bkc, lid, n0, 0u, params.n, bbase, false);
        var fb1 = fetch(bkc, lid + 256u, n0, 0u, params.n, bbase, false);
        store_a(akc, lid, fa0, 0u);
        store_a(akc, lid + 256u, fa1, 0u);
        store_b(bkc, lid, fb0, 0u);
        store_b(bkc, lid + 256u, fb1, 0u);
        workgroupBarrier();
        var buf = 0u;
        for (var k0 = 0u; k0 < params.k; k0 += BK) {
            let kn = k0 + BK;
            let more = kn < params.k;
            if (more) {
                fa0 = fetch(akc, lid, m0, kn, params.m, abase, true);
                fa1 = fetch(akc, lid + 256u, m0, kn, params.m, abase, true);
                fb0 = fetch(bkc, lid, n0, kn, params.n, bbase, false);
                fb1 = fetch(bkc, lid + 256u, n0, kn, params.n, bbase, false);
            }
            for (var kk = 0u; kk < BK; kk += 16u) {
                let a0 = frag_a(wr, kk, buf);
                let a1 = frag_a(wr + 16u, kk, buf);
                let b0 = frag_b(kk, wc, buf);
                let b1 = frag_b(kk, wc + 16u, buf);
                let b2 = frag_b(kk, wc + 32u, buf);
                let b3 = frag_b(kk, wc + 48u, buf);
                c00 = coopMultiplyAdd(a0, b0, c00);
                c01 = coopMultiplyAdd(a0, b1, c01);
                c02 = coopMultiplyAdd(a0, b2, c02);
                c03 = coopMultiplyAdd(a0, b3, c03);
                c10 = coopMultiplyAdd(a1, b0, c10);
                c11 = coopMultiplyAdd(a1, b1, c11);
                c12 = coopMultiplyAdd(a1, b2, c12);
                c13 = coopMultiplyAdd(a1, b3, c13);
            }
            if (more) {
                store_a(akc, lid, fa0, 1u - buf);
                store_a(akc, lid + 256u, fa1, 1u - buf);
                store_b(bkc, lid, fb0, 1u - buf);
                store_b(bkc, lid + 256u, fb1, 1u - buf);
            }
            workgroupBarrier();
            buf = 1u - buf;
        }
    } else {
        // Chunks a lane stages per operand and step: 128 · BK / 8 / LANES (2 or 4).
        let wide = BM * BK / 8u / LANES == 4u;
        var fa0 = fetch(akc, lid, m0, 0u, params.m, abase, true);
        var fa1 = fetch(akc, lid + 1u * LANES, m0, 0u, params.m, abase, true);
        var fa2 = fetch(akc, lid + 2u * LANES, m0, 0u, params.m, abase, true);
        var fa3 = fetch(akc, lid + 3u * LANES, m0, 0u, params.m, abase, true);
        var fb0 = fetch(bkc, lid, n0, 0u, params.n, bbase, false);
        var fb1 = fetch(bkc, lid + 1u * LANES, n0, 0u, params.n, bbase, false);
        var fb2 = fetch(bkc, lid + 2u * LANES, n0, 0u, params.n, bbase, false);
        var fb3 = fetch(bkc, lid + 3u * LANES, n0, 0u, params.n, bbase, false);
        for (var k0 = 0u; k0 < params.k; k0 += BK) {
            workgroupBarrier();
            store_a(akc, lid, fa0, 0u);
            store_a(akc, lid + 1u * LANES, fa1, 0u);
            store_b(bkc, lid, fb0, 0u);
            store_b(bkc, lid + 1u * LANES, fb1, 0u);
            if (wide) {
                store_a(akc, lid + 2u * LANES, fa2, 0u);
                store_a(akc, lid + 3u * LANES, fa3, 0u);
                store_b(bkc, lid + 2u * LANES, fb2, 0u);
                store_b(bkc, lid + 3u * LANES, fb3, 0u);
            }
            workgroupBarrier();
            let kn = k0 + BK;
            if (kn < params.k) {
                fa0 = fetch(akc, lid, m0, kn, params.m, abase, true);
                fa1 = fetch(akc, lid + 1u * LANES, m0, kn, params.m, abase, true);
                fb0 = fetch(bkc, lid, n0, kn, params.n, bbase, false);
                fb1 = fetch(bkc, lid + 1u * LANES, n0, kn, params.n, bbase, false);
                if (wide) {
                    fa2 = fetch(akc, lid + 2u * LANES, m0, kn, params.m, abase, true);
                    fa3 = fetch(akc, lid + 3u * LANES, m0, kn, params.m, abase, true);
                    fb2 = fetch(bkc, lid + 2u * LANES, n0, kn, params.n, bbase, false);
                    fb3 = fetch(bkc, lid + 3u * LANES, n0, kn, params.n, bbase, false);
                }
            }
            for (var kk = 0u; kk < BK; kk += 16u) {
                let a0 = frag_a(wr, kk, 0u);
                let a1 = frag_a(wr + 16u, kk, 0u);
                let b0 = frag_b(kk, wc, 0u);
                let b1 = frag_b(kk, wc + 16u, 0u);
                let b2 = frag_b(kk, wc + 32u, 0u);
                let b3 = frag_b(kk, wc + 48u, 0u);
                c00 = coopMultiplyAdd(a0, b0, c00);
                c01 = coopMultiplyAdd(a0, b1, c01);
                c02 = coopMultiplyAdd(a0, b2, c02);
                c03 = coopMultiplyAdd(a0, b3, c03);
                c10 = coopMultiplyAdd(a1, b0, c10);
                c11 = coopMultiplyAdd(a1, b1, c11);
                c12 = coopMultiplyAdd(a1, b2, c12);
                c13 = coopMultiplyAdd(a1, b3, c13);
                if (W64) {
                    let a2 = frag_a(wr + 32u, kk, 0u);
                    let a3 = frag_a(wr + 48u, kk, 0u);
                    c20 = coopMultiplyAdd(a2, b0, c20);
                    c21 = coopMultiplyAdd(a2, b1, c21);
                    c22 = coopMultiplyAdd(a2, b2, c22);
                    c23 = coopMultiplyAdd(a2, b3, c23);
                    c30 = coopMultiplyAdd(a3, b0, c30);
                    c31 = coopMultiplyAdd(a3, b1, c31);
                    c32 = coopMultiplyAdd(a3, b2, c32);
                    c33 = coopMultiplyAdd(a3, b3, c33);
                }
            }
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
    if (W64) {
        acc_store(c20, i0 + 32u, j0, c0);
        acc_store(c21, i0 + 32u, j0 + 16u, c0);
        acc_store(c22, i0 + 32u, j0 + 32u, c0);
        acc_store(c23, i0 + 32u, j0 + 48u, c0);
        acc_store(c30, i0 + 48u, j0, c0);
        acc_store(c31, i0 + 48u, j0 + 16u, c0);
        acc_store(c32, i0 + 48u, j0 + 32u, c0);
        acc_store(c33, i0 + 48u, j0 + 48u, c0);
    }
}
