// Dense matrix product with an epilogue, one launch per call of `matmul::gemm` (two for a
// split-K product, see the end of the file):
//
//   for each batch index b, row i < m, column j < n:
//     v = alpha · Σ_{l < k} A_b(i, l) · B_b(l, j)  (+ bias[j])
//     out[off_c + b·stride_c + i·n + j]  = act(v)   (pre-activation v stored when asked)
//                                        += v       (accumulate; no activation then)
//
// A_b(i, l) is read at off_a + b·stride_a + i·k + l ([m, k] rows), or + l·m + i when TRANS_A
// ([k, m] rows); B_b(l, j) at off_b + b·stride_b + l·n + j ([k, n]), or + j·k + l when TRANS_B
// ([n, k]). Operands are F32, F16 or BF16 (16-bit: two halves per u32 word, any element
// offset), widened to f32 as they are staged; accumulation is F32. The output is F32, or with
// DT_OUT F16 / BF16 each FP32 result rounded once, two columns a word (the host allows it for
// an even n and even offsets, without accumulate; the pre-activation stays F32).
//
// Tiling: one workgroup computes a BM×BN output tile, each invocation an 8×8 micro-tile held
// in sixteen vec4 accumulators. Two sizes of the same code, chosen by NARROW (the host's rule
// is `matmul::gemm_tile`):
// * wide (default): 128×128 on 256 invocations, K steps of BK = 16;
// * narrow: 64×64 on 64 invocations, K steps of BK = 8, for small products (a quarter of the
//   wide tile's padding on a ragged edge, four times the workgroups).
// Invocation (tx, ty) = (lid % (BN/8), lid / (BN/8)) owns rows 4·ty.. and BM/2 + 4·ty.. (four
// each), columns 4·tx.. and BN/2 + 4·tx.. (one vec4 each). K advances in steps of BK: the
// next step's A (BM×BK) and B (BK×BN) elements, eight of each per invocation, are loaded into
// registers while the current step, staged in workgroup memory as f32, is multiplied. Each k
// of a step reads four vec4s (two of A, two of B) for 64 fused multiply-adds. Every product
// term is one `fma` in increasing l, so each output's summation order depends on k only, not
// on the tile: reruns are bit-identical, both tiles give the same bits, and no two
// invocations write one output word. Edge tiles (ragged m, n, k) read zeros past the ends (or,
// on the aligned path, re-read the last row or columns) and write nothing outside the product.
//
// Staging layout (16 KiB declared, all of it used by the wide tile, 4 KiB by the narrow one; no
// padding): both tiles are k-major, BK rows (one per k) of ROW4 = BM/4 vec4s (BM values).
// Element (x, kk) of a tile, x the row of A or the column of B within the tile, lives in vec4
// kk·ROW4 + ((x / 4) ^ s(kk)), component x % 4, where the swizzle
// s(kk) = kk % 8 for an operand stored with k contiguous (A not transposed, B transposed) and
// 0 otherwise (s < 8 ≤ ROW4/2: the XOR keeps a vec4 in its half of the row). Banks (32 of 4
// bytes), for the wide tile:
// * Inner-loop reads: the sixteen lanes of one ty read one A vec4 (a broadcast; the two values
//   of ty in a 32-lane group read two vec4s of different banks), and the sixteen values of tx
//   read sixteen distinct vec4s of one k-row: 64 consecutive words up to the XOR, which only
//   permutes them. Conflict-free.
// * Staging stores, k contiguous in memory: the 32 lanes of a group fetch 16 consecutive k of
//   two adjacent rows (coalesced global reads) and store them into 16 k-rows. Without the
//   swizzle every k-row starts at bank 0, so the 16 stores of one row would hit one bank;
//   with it the vec4 column moves with kk % 8, spreading them over 8 vec4 positions: 16
//   banks for 32 lanes, a 2-way conflict, eight scalar stores per operand per step.
// * Staging stores, m or n contiguous in memory: the 32 lanes store 32 consecutive values of
//   one k-row, 32 distinct banks, conflict-free; no swizzle, so the inner loop reads this
//   operand at fixed offsets.
// Aligned fetches (ALIGNED, the host's rule is `matmul::chunked_fetches`): when k is a whole
// number of K steps and every operand row, offset and batch stride a whole number of 16-byte
// chunks, each invocation fetches its eight elements of an operand as two F32 chunks or one
// chunk of eight 16-bit values (one 16-byte load each, no edge tests: a ragged last tile
// re-reads the last row or columns, see `chunk_walk`), and stages an operand stored m- or
// n-contiguous by vec4 stores. The values of every stored output are the same, staged in the
// same places, so the results are the same, bit for bit. A k-contiguous operand's chunk holds
// 4 (8) consecutive k of one row, stored into as many k-rows: a 32-lane group covers 8 (16)
// rows, 16 banks after the swizzle, the same 2-way conflict as the element path.
// Global fetches on the element path: an invocation's eight elements of an operand lie a fixed
// stride apart and move by a fixed step per K step, so each index costs one addition; the row (column)
// bound is counted once per tile and the k bound once per step into a limit, and each
// element's edge test is one comparison with it.

// The operands' dtypes and layouts and the tile size specialize the main loop; the epilogue's
// options are uniform parameters (one pipeline serves every bias dtype, activation and
// accumulation).
override DT_A: u32 = 0u;         // dtype codes of A and B
override DT_B: u32 = 0u;
override TRANS_A: u32 = 0u;      // 1: A stored [k, m]
override TRANS_B: u32 = 0u;      // 1: B stored [n, k]
override NARROW: bool = false;   // the 64×64 tile; the geometry below follows from it
override DT_OUT: u32 = 0u;       // dtype code of out (16-bit: pairs of columns a word)
override ALIGNED: bool = false;  // whole K steps, chunk-aligned operands: 16-byte fetches
override GROUP_M: u32 = 1u;      // tile rows per band of the launch order (`tile_of`)

override BM: u32 = select(128u, 64u, NARROW);  // tile rows
override BN: u32 = BM;                         // tile columns
override BK: u32 = select(16u, 8u, NARROW);    // K step
override LANES: u32 = (BM / 8u) * (BN / 8u);   // invocations of a tile's workgroup: 256 or 64
override ROW4: u32 = BM / 4u;                  // vec4s per staged k-row (BM / 4 = BN / 4)
const PER: u32 = 8u;    // elements of each operand one invocation stages per step: BM·BK / LANES
const WG: u32 = 256u;   // invocations of the split-K finish

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> pre: array<u32>;
@group(0) @binding(6) var<storage, read> part: array<u32>;   // split-K slice sums (pass 2)
@group(0) @binding(7) var<storage, read> a4: array<vec4<u32>>;  // a and b as 16-byte chunks
@group(0) @binding(8) var<storage, read> b4: array<vec4<u32>>;  // (read when ALIGNED)

var<workgroup> a_tile: array<vec4<f32>, 512>;   // wide BK · ROW4 (8 KiB); narrow: 128 of it
var<workgroup> b_tile: array<vec4<f32>, 512>;   // the same

// Registers hold no indexed arrays (an indexed private array may be placed in slow local
// memory): the accumulators are sixteen vec4s, the prefetched elements four vec4s, and every
// per-element helper is called with constant element numbers.

// Accumulators of one micro-tile: `loi` holds row i's columns 4·tx.., `hii` its columns
// BN/2 + 4·tx..; rows i < 4 are 4·ty + i of the tile, rows i ≥ 4 are BM/2 + 4·ty + i − 4.
struct Acc {
    lo0: vec4<f32>,
    hi0: vec4<f32>,
    lo1: vec4<f32>,
    hi1: vec4<f32>,
    lo2: vec4<f32>,
    hi2: vec4<f32>,
    lo3: vec4<f32>,
    hi3: vec4<f32>,
    lo4: vec4<f32>,
    hi4: vec4<f32>,
    lo5: vec4<f32>,
    hi5: vec4<f32>,
    lo6: vec4<f32>,
    hi6: vec4<f32>,
    lo7: vec4<f32>,
    hi7: vec4<f32>,
}

// Eight staged elements of one operand.
struct Eight {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn load_a(i: u32) -> f32 {
    if (DT_A == DT_F32) {
        return bitcast<f32>(a[i]);
    }
    return half_from_word(a[i >> 1u], i, DT_A);
}

fn load_b(i: u32) -> f32 {
    if (DT_B == DT_F32) {
        return bitcast<f32>(b[i]);
    }
    return half_from_word(b[i >> 1u], i, DT_B);
}

// An operand is "k-contiguous" when consecutive k are adjacent in memory: A not transposed
// ([m, k] rows), B transposed ([n, k] rows).
fn a_kc() -> bool {
    return TRANS_A == 0u;
}

fn b_kc() -> bool {
    return TRANS_B == 1u;
}

// (x, kk) of this invocation's r-th element of a step: x the row of A (column of B) within the
// tile, kk the k within the step. Consecutive invocations follow the contiguous axis in memory.
fn slot(kc: bool, lid: u32, r: u32) -> vec2<u32> {
    if (kc) {
        return vec2(lid / BK + r * (LANES / BK), lid % BK);
    }
    return vec2(lid % BM, lid / BM + r * (LANES / BM));
}

// The XOR applied to the vec4 column of staged k-row kk (see the header).
fn swizzle(kc: bool, kk: u32) -> u32 {
    return select(0u, kk & 7u, kc);
}

// The vec4 of a staged tile holding element (x, kk).
fn staged(kc: bool, s: vec2<u32>) -> u32 {
    return s.y * ROW4 + ((s.x / 4u) ^ swizzle(kc, s.y));
}

// Number of r in 0..PER with first + r·stride < end.
fn count(first: u32, stride: u32, end: u32) -> u32 {
    if (first >= end) {
        return 0u;
    }
    if (stride == 0u) {
        return PER;
    }
    return min(PER, (end - first - 1u) / stride + 1u);
}

// How one invocation walks an operand: its r-th element of the current step is stored at
// idx + r·dr, and lies inside the operand when r < min(inside, count(k0 + k_first, k_stride,
// k)) for the step at k0; idx advances by d_step per step. Indices of elements outside are
// never used (u32 arithmetic wraps; the indices used are exact).
struct Walk {
    idx: u32,
    dr: u32,
    d_step: u32,
    inside: u32,
    k_first: u32,
    k_stride: u32,
}

// The walk of an operand at `base`, extent `ext` (m for A, n for B) along x, tile start x0,
// from k = kb on.
fn walk(kc: bool, lid: u32, base: u32, x0: u32, ext: u32, kb: u32) -> Walk {
    let k = params.k;
    let s = slot(kc, lid, 0u);
    let x = x0 + s.x;
    var w: Walk;
    if (kc) {
        // Stored [ext, k]: element (x, l) at base + x·k + l.
        w = Walk(base + x * k + kb + s.y, (LANES / BK) * k, BK, count(x, LANES / BK, ext), s.y,
                 0u);
    } else {
        // Stored [k, ext]: element (x, l) at base + l·ext + x.
        w = Walk(base + (kb + s.y) * ext + x, (LANES / BM) * ext, BK * ext, count(x, 0u, ext),
                 s.y, LANES / BM);
    }
    w.dr = tile_dependent(w.dr, x0);
    w.d_step = tile_dependent(w.d_step, x0);
    return w;
}

// ALIGNED: the walk in 16-byte chunks of E = chunk_width(dt) elements (4 F32, 8 16-bit); an
// invocation's PER elements of a step are PER / E whole chunks, chunk c at idx + c·dr (in
// chunks; u32 arithmetic wraps), and idx advances by d_step chunks a step. k-contiguous:
// BK / E invocations share a row's step, invocation lid taking row lid / (BK / E)
// (+ c·LANES·E / BK) and the E values of k from (lid % (BK / E))·E; otherwise BM / E
// invocations share a k, lid taking the E columns from (lid % (BM / E))·E of k-row
// lid / (BM / E) (+ c·LANES·E / BM). In a ragged last tile, rows (columns) past the extent
// read the last row (chunk of columns) instead: real values, which only reach accumulators
// of outputs the epilogue does not store. The host guarantees whole chunks, ext ≥ E where
// columns are chunked, and whole K steps.
fn chunk_walk(kc: bool, dt: u32, lid: u32, base: u32, x0: u32, ext: u32, kb: u32) -> Walk {
    let e = chunk_width(dt);
    let k = params.k;
    var w: Walk;
    if (kc) {
        let per = BK / e;
        let x = x0 + lid / per;
        let first = (base + min(x, ext - 1u) * k + kb + (lid % per) * e) / e;
        let second = (base + min(x + LANES / per, ext - 1u) * k + kb + (lid % per) * e) / e;
        w = Walk(first, second - first, BK / e, 0u, 0u, 0u);
    } else {
        let per = BM / e;
        let x = min(x0 + (lid % per) * e, ext - e);
        w = Walk((base + (kb + lid / per) * ext + x) / e, (LANES / per) * (ext / e),
                 BK * (ext / e), 0u, 0u, 0u);
    }
    w.dr = tile_dependent(w.dr, x0);
    w.d_step = tile_dependent(w.d_step, x0);
    return w;
}

// `v` unchanged (tiles start at multiples of 64, never at 1), computed from the tile start x0
// as well as the parameters. Mesa's lavapipe (a CPU Vulkan driver) recompiles a kernel at
// each dispatch, with the parameters' values inlined, when values derived from the uniform
// parameters alone feed it in certain ways: the walk strides of a transposed A did (10-15 ms
// a launch on a 2-core machine, whatever the size of the product). One select per workgroup.
fn tile_dependent(v: u32, x0: u32) -> u32 {
    return select(v, 0u, x0 == 1u);
}

// Elements r < limit of the step at k0 (absolute) lie inside the operand and before ke.
fn limit(w: Walk, k0: u32, ke: u32) -> u32 {
    return min(w.inside, count(k0 + w.k_first, w.k_stride, ke));
}

// Element i of A (or of B when `is_b`), zero when not `inside`.
fn operand_at(is_b: bool, i: u32, inside: bool) -> f32 {
    if (!inside) {
        return 0.0;
    }
    if (is_b) {
        return load_b(i);
    }
    return load_a(i);
}

// The eight A (or B, `is_b`) elements of the step at k0 (zero past the edges and from ke on).
fn fetch(is_b: bool, w: Walk, k0: u32, ke: u32) -> Eight {
    if (ALIGNED) {
        return fetch_chunks(is_b, w);
    }
    let n = limit(w, k0, ke);
    let i1 = w.idx + w.dr;
    let i2 = i1 + w.dr;
    let i3 = i2 + w.dr;
    let i4 = i3 + w.dr;
    let i5 = i4 + w.dr;
    let i6 = i5 + w.dr;
    let i7 = i6 + w.dr;
    return Eight(
        vec4(operand_at(is_b, w.idx, 0u < n), operand_at(is_b, i1, 1u < n),
             operand_at(is_b, i2, 2u < n), operand_at(is_b, i3, 3u < n)),
        vec4(operand_at(is_b, i4, 4u < n), operand_at(is_b, i5, 5u < n),
             operand_at(is_b, i6, 6u < n), operand_at(is_b, i7, 7u < n)),
    );
}

// ALIGNED: the step's chunks of A (or B, `is_b`) as eight values, element r of the walk's
// order (chunk r / E, value r % E).
fn fetch_chunks(is_b: bool, w: Walk) -> Eight {
    let dt = select(DT_A, DT_B, is_b);
    var c0: vec4<u32>;
    var c1 = vec4(0u);
    if (is_b) {
        c0 = b4[w.idx];
        if (dt == DT_F32) {
            c1 = b4[w.idx + w.dr];
        }
    } else {
        c0 = a4[w.idx];
        if (dt == DT_F32) {
            c1 = a4[w.idx + w.dr];
        }
    }
    if (dt == DT_F32) {
        return Eight(bitcast<vec4<f32>>(c0), bitcast<vec4<f32>>(c1));
    }
    return Eight(chunk_lo(c0, dt), chunk_hi(c0, dt));
}

// ALIGNED: (x, kk) of this invocation's r-th element of a step in the chunked walk.
fn chunk_slot(kc: bool, dt: u32, lid: u32, r: u32) -> vec2<u32> {
    let e = chunk_width(dt);
    let c = r / e;
    let j = r % e;
    if (kc) {
        let per = BK / e;
        return vec2(lid / per + c * (LANES / per), (lid % per) * e + j);
    }
    let per = BM / e;
    return vec2((lid % per) * e + j, lid / per + c * (LANES / per));
}

// ALIGNED: workgroup memory ← one operand's eight chunked values. k-contiguous: one value a
// k-row (the swizzled layout of the header); otherwise four consecutive columns of one k-row
// are one staged vec4 (no swizzle for these operands).
fn stage_chunks(is_b: bool, lid: u32, v: Eight) {
    let kc = select(a_kc(), b_kc(), is_b);
    let dt = select(DT_A, DT_B, is_b);
    if (kc) {
        stage_one(is_b, chunk_slot(kc, dt, lid, 0u), v.lo.x);
        stage_one(is_b, chunk_slot(kc, dt, lid, 1u), v.lo.y);
        stage_one(is_b, chunk_slot(kc, dt, lid, 2u), v.lo.z);
        stage_one(is_b, chunk_slot(kc, dt, lid, 3u), v.lo.w);
        stage_one(is_b, chunk_slot(kc, dt, lid, 4u), v.hi.x);
        stage_one(is_b, chunk_slot(kc, dt, lid, 5u), v.hi.y);
        stage_one(is_b, chunk_slot(kc, dt, lid, 6u), v.hi.z);
        stage_one(is_b, chunk_slot(kc, dt, lid, 7u), v.hi.w);
        return;
    }
    let s0 = chunk_slot(kc, dt, lid, 0u);
    let s4 = chunk_slot(kc, dt, lid, 4u);
    if (is_b) {
        b_tile[s0.y * ROW4 + s0.x / 4u] = v.lo;
        b_tile[s4.y * ROW4 + s4.x / 4u] = v.hi;
    } else {
        a_tile[s0.y * ROW4 + s0.x / 4u] = v.lo;
        a_tile[s4.y * ROW4 + s4.x / 4u] = v.hi;
    }
}

// Workgroup memory ← element (x, kk) = s of A (or B, `is_b`).
fn stage_one(is_b: bool, s: vec2<u32>, v: f32) {
    if (is_b) {
        b_tile[staged(b_kc(), s)][s.x % 4u] = v;
    } else {
        a_tile[staged(a_kc(), s)][s.x % 4u] = v;
    }
}

// Workgroup memory ← fetched elements.
fn stage_a(lid: u32, r: u32, v: f32) {
    stage_one(false, slot(a_kc(), lid, r), v);
}

fn stage_b(lid: u32, r: u32, v: f32) {
    stage_one(true, slot(b_kc(), lid, r), v);
}

fn stage(lid: u32, av: Eight, bv: Eight) {
    if (ALIGNED) {
        stage_chunks(false, lid, av);
        stage_chunks(true, lid, bv);
        return;
    }
    stage_a(lid, 0u, av.lo.x);
    stage_a(lid, 1u, av.lo.y);
    stage_a(lid, 2u, av.lo.z);
    stage_a(lid, 3u, av.lo.w);
    stage_a(lid, 4u, av.hi.x);
    stage_a(lid, 5u, av.hi.y);
    stage_a(lid, 6u, av.hi.z);
    stage_a(lid, 7u, av.hi.w);
    stage_b(lid, 0u, bv.lo.x);
    stage_b(lid, 1u, bv.lo.y);
    stage_b(lid, 2u, bv.lo.z);
    stage_b(lid, 3u, bv.lo.w);
    stage_b(lid, 4u, bv.hi.x);
    stage_b(lid, 5u, bv.hi.y);
    stage_b(lid, 6u, bv.hi.z);
    stage_b(lid, 7u, bv.hi.w);
}

// The tile of workgroup `g`: (batch, row0, col0, 1), or w = 0 past the last tile; in bands of
// GROUP_M tile rows (`banded_tile` of `common/gemm_params.wgsl`).
fn tile_of(g: u32) -> vec4<u32> {
    let t = banded_tile(g, GROUP_M);
    return vec4(t.x, t.y * BM, t.z * BN, u32(t.x < params.batch));
}

// Σ_{kb ≤ l < ke} A(row, l)·B(l, col) over this invocation's micro-tile (kb a multiple of BK,
// kb < ke ≤ k, or kb = ke = 0 for k = 0). Called in uniform control flow (every invocation of
// the workgroup, the same trip count).
fn product(lid: u32, bi: u32, row0: u32, col0: u32, kb: u32, ke: u32) -> Acc {
    let tx = lid % (BN / 8u);
    let ty = lid / (BN / 8u);
    let base_a = params.off_a + bi * params.stride_a;
    let base_b = params.off_b + bi * params.stride_b;
    var wa: Walk;
    var wb: Walk;
    if (ALIGNED) {
        wa = chunk_walk(a_kc(), DT_A, lid, base_a, row0, params.m, kb);
        wb = chunk_walk(b_kc(), DT_B, lid, base_b, col0, params.n, kb);
    } else {
        wa = walk(a_kc(), lid, base_a, row0, params.m, kb);
        wb = walk(b_kc(), lid, base_b, col0, params.n, kb);
    }
    var lo0 = vec4(0.0);
    var hi0 = vec4(0.0);
    var lo1 = vec4(0.0);
    var hi1 = vec4(0.0);
    var lo2 = vec4(0.0);
    var hi2 = vec4(0.0);
    var lo3 = vec4(0.0);
    var hi3 = vec4(0.0);
    var lo4 = vec4(0.0);
    var hi4 = vec4(0.0);
    var lo5 = vec4(0.0);
    var hi5 = vec4(0.0);
    var lo6 = vec4(0.0);
    var hi6 = vec4(0.0);
    var lo7 = vec4(0.0);
    var hi7 = vec4(0.0);
    let steps = (ke - kb + BK - 1u) / BK;
    var next_a = Eight(vec4(0.0), vec4(0.0));
    var next_b = Eight(vec4(0.0), vec4(0.0));
    if (steps > 0u) {
        next_a = fetch(false, wa, kb, ke);
        next_b = fetch(true, wb, kb, ke);
    }
    for (var t = 0u; t < steps; t = t + 1u) {
        workgroupBarrier();
        stage(lid, next_a, next_b);
        workgroupBarrier();
        if (t + 1u < steps) {
            let k0 = kb + (t + 1u) * BK;
            wa.idx = wa.idx + wa.d_step;
            wb.idx = wb.idx + wb.d_step;
            next_a = fetch(false, wa, k0, ke);
            next_b = fetch(true, wb, k0, ke);
        }
        for (var l = 0u; l < BK; l = l + 1u) {
            // Rows 4·ty.. and BM/2 + 4·ty.. of A, columns 4·tx.. and BN/2 + 4·tx.. of B.
            let ia = l * ROW4 + (ty ^ swizzle(a_kc(), l));
            let ib = l * ROW4 + (tx ^ swizzle(b_kc(), l));
            let a0 = a_tile[ia];
            let a1 = a_tile[ia + ROW4 / 2u];
            let b0 = b_tile[ib];
            let b1 = b_tile[ib + ROW4 / 2u];
            lo0 = fma(vec4(a0.x), b0, lo0);
            hi0 = fma(vec4(a0.x), b1, hi0);
            lo1 = fma(vec4(a0.y), b0, lo1);
            hi1 = fma(vec4(a0.y), b1, hi1);
            lo2 = fma(vec4(a0.z), b0, lo2);
            hi2 = fma(vec4(a0.z), b1, hi2);
            lo3 = fma(vec4(a0.w), b0, lo3);
            hi3 = fma(vec4(a0.w), b1, hi3);
            lo4 = fma(vec4(a1.x), b0, lo4);
            hi4 = fma(vec4(a1.x), b1, hi4);
            lo5 = fma(vec4(a1.y), b0, lo5);
            hi5 = fma(vec4(a1.y), b1, hi5);
            lo6 = fma(vec4(a1.z), b0, lo6);
            hi6 = fma(vec4(a1.z), b1, hi6);
            lo7 = fma(vec4(a1.w), b0, lo7);
            hi7 = fma(vec4(a1.w), b1, hi7);
        }
    }
    return Acc(lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3, lo4, hi4, lo5, hi5, lo6, hi6, lo7, hi7);
}

// Row of accumulator row i (0..8) and first column of half h (0, 1) of this invocation's
// micro-tile, within the tile.
fn micro_row(lid: u32, i: u32) -> u32 {
    return (i / 4u) * (BM / 2u) + (lid / (BN / 8u)) * 4u + i % 4u;
}

fn micro_col(lid: u32, h: u32) -> u32 {
    return h * (BN / 2u) + (lid % (BN / 8u)) * 4u;
}

// F32 out: out ← act(v), or out += v.
fn store_out(idx: u32, v: f32) {
    if (params.accumulate == 1u) {
        out[idx] = bitcast<u32>(bitcast<f32>(out[idx]) + v);
    } else if (params.act != 0u) {
        out[idx] = bitcast<u32>(activation_eval(params.act - 1u, v).x);
    } else {
        out[idx] = bitcast<u32>(v);
    }
}

// 16-bit out: elements idx (even) and idx + 1 ← act(v0), act(v1), rounded once into one word.
fn store_pair(idx: u32, v0: f32, v1: f32) {
    out[idx / 2u] = pack_halves(epilogue(v0), epilogue(v1), DT_OUT);
}

// 16-bit out: the leading values of v at idx (even) of out, two (count 2) or four (count > 2).
fn store_pairs(idx: u32, v: vec4<f32>, count: u32) {
    store_pair(idx, v.x, v.y);
    if (count > 2u) {
        store_pair(idx + 2u, v.z, v.w);
    }
}

// Accumulator q = 2·i + h: row i, half h (a switch, not an indexed array: the values stay in
// registers).
fn acc_at(c: Acc, q: u32) -> vec4<f32> {
    switch q {
        case 0u: { return c.lo0; }
        case 1u: { return c.hi0; }
        case 2u: { return c.lo1; }
        case 3u: { return c.hi1; }
        case 4u: { return c.lo2; }
        case 5u: { return c.hi2; }
        case 6u: { return c.lo3; }
        case 7u: { return c.hi3; }
        case 8u: { return c.lo4; }
        case 9u: { return c.hi4; }
        case 10u: { return c.lo5; }
        case 11u: { return c.hi5; }
        case 12u: { return c.lo6; }
        case 13u: { return c.hi6; }
        case 14u: { return c.lo7; }
        default: { return c.hi7; }
    }
}

// The epilogue loops stay loops (the activation's code is emitted once, not per element).
// Accumulator q's four values go to row tile.y + micro_row(q / 2), columns
// tile.z + micro_col(q % 2) + c, element off_c + batch·stride_c + row·n + col.
@compute @workgroup_size(LANES)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(group_index(wid, nwg));
    if (tile.w == 0u) {
        return;
    }
    let acc = product(lid, tile.x, tile.y, tile.z, 0u, params.k);
    let bias_lo = bias4(tile.z + micro_col(lid, 0u));
    let bias_hi = bias4(tile.z + micro_col(lid, 1u));
    let base = params.off_c + tile.x * params.stride_c;
    for (var q = 0u; q < 16u; q = q + 1u) {
        let row = tile.y + micro_row(lid, q / 2u);
        let col = tile.z + micro_col(lid, q % 2u);
        let v = params.alpha * acc_at(acc, q) + select(bias_lo, bias_hi, q % 2u == 1u);
        if (row < params.m) {
            for (var c = 0u; c < 4u; c = c + 1u) {
                if (col + c < params.n) {
                    store_out(base + row * params.n + col + c, v[c]);
                }
            }
        }
    }
}

// As `gemm` for a 16-bit out (DT_OUT F16 / BF16): two columns a word. Its own entry point, so
// the F32 store code of `gemm` is compiled alone.
@compute @workgroup_size(LANES)
fn gemm_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(group_index(wid, nwg));
    if (tile.w == 0u) {
        return;
    }
    let acc = product(lid, tile.x, tile.y, tile.z, 0u, params.k);
    let bias_lo = bias4(tile.z + micro_col(lid, 0u));
    let bias_hi = bias4(tile.z + micro_col(lid, 1u));
    let base = params.off_c + tile.x * params.stride_c;
    for (var q = 0u; q < 16u; q = q + 1u) {
        let row = tile.y + micro_row(lid, q / 2u);
        let col = tile.z + micro_col(lid, q % 2u);
        let v = params.alpha * acc_at(acc, q) + select(bias_lo, bias_hi, q % 2u == 1u);
        if (row < params.m && col < params.n) {
            store_pairs(base + row * params.n + col, v, params.n - col);
        }
    }
}

// As `gemm`, also storing the FP32 pre-activation (same indexing as out) in `pre`.
@compute @workgroup_size(LANES)
fn gemm_pre(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(group_index(wid, nwg));
    if (tile.w == 0u) {
        return;
    }
    let acc = product(lid, tile.x, tile.y, tile.z, 0u, params.k);
    let bias_lo = bias4(tile.z + micro_col(lid, 0u));
    let bias_hi = bias4(tile.z + micro_col(lid, 1u));
    let base = params.off_c + tile.x * params.stride_c;
    for (var q = 0u; q < 16u; q = q + 1u) {
        let row = tile.y + micro_row(lid, q / 2u);
        let col = tile.z + micro_col(lid, q % 2u);
        let v = params.alpha * acc_at(acc, q) + select(bias_lo, bias_hi, q % 2u == 1u);
        if (row < params.m) {
            for (var c = 0u; c < 4u; c = c + 1u) {
                if (col + c < params.n) {
                    let idx = base + row * params.n + col + c;
                    pre[idx] = bitcast<u32>(v[c]);
                    if (DT_OUT == DT_F32) {
                        store_out(idx, v[c]);
                    }
                }
            }
            if (DT_OUT != DT_F32 && col < params.n) {
                store_pairs(base + row * params.n + col, v, params.n - col);
            }
        }
    }
}

// ---- split-K (see `matmul::gemm_split`) ----------------------------------------------------
//
// Pass 1, `gemm_partial`: workgroup g computes slice s = g / T of tile g % T (T = tiles_m ·
// tiles_n · batch): the raw FP32 sum over l in [s·k_slice, min((s + 1)·k_slice, k)), the same
// multiply-adds in the same order as the unsplit kernel restricted to the slice (k_slice is a
// multiple of BK, so the slice starts a K step). It goes to `out` (here the scratch,
// [slices, batch, m, n] F32) at ((s·batch + b)·m + row)·n + col.
// Pass 2, `gemm_finish` / `gemm_finish_pre`: one invocation per output element sums the slices
// in increasing s (p_0 + p_1 + ... one rounding each, always that order), then applies the
// unsplit epilogue to the sum: alpha, bias, activation / accumulate, pre-activation.

@compute @workgroup_size(LANES)
fn gemm_partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let tiles = params.tiles_m * params.tiles_n * params.batch;
    let s = g / tiles;
    if (s >= params.slices) {
        return;
    }
    let tile = tile_of(g - s * tiles);
    let kb = s * params.k_slice;
    let ke = min(kb + params.k_slice, params.k);
    let acc = product(lid, tile.x, tile.y, tile.z, kb, ke);
    let base = (s * params.batch + tile.x) * params.m * params.n;
    for (var q = 0u; q < 16u; q = q + 1u) {
        let row = tile.y + micro_row(lid, q / 2u);
        let col = tile.z + micro_col(lid, q % 2u);
        let v = acc_at(acc, q);
        if (row < params.m) {
            for (var c = 0u; c < 4u; c = c + 1u) {
                if (col + c < params.n) {
                    out[base + row * params.n + col + c] = bitcast<u32>(v[c]);
                }
            }
        }
    }
}

// The finished value of element e of [batch, m, n] (slices summed in order, alpha, bias), and
// its index in out.
fn finished(e: u32) -> vec2<u32> {
    let mn = params.m * params.n;
    let total = mn * params.batch;
    var sum = bitcast<f32>(part[e]);
    for (var s = 1u; s < params.slices; s = s + 1u) {
        sum = sum + bitcast<f32>(part[s * total + e]);
    }
    let bi = e / mn;
    let r = e - bi * mn;
    let col = r % params.n;
    let v = params.alpha * sum + bias_at(col);
    return vec2(bitcast<u32>(v), params.off_c + bi * params.stride_c + r);
}

// Elements per invocation of the finish: 1, or 2 (a word) for a 16-bit out.
fn finish_span() -> u32 {
    return select(1u, 2u, DT_OUT != DT_F32);
}

@compute @workgroup_size(WG)
fn gemm_finish(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let e = (group_index(wid, nwg) * WG + lid) * finish_span();
    if (e >= params.m * params.n * params.batch) {
        return;
    }
    let f = finished(e);
    if (DT_OUT != DT_F32) {
        store_pair(f.y, bitcast<f32>(f.x), bitcast<f32>(finished(e + 1u).x));
        return;
    }
    store_out(f.y, bitcast<f32>(f.x));
}

@compute @workgroup_size(WG)
fn gemm_finish_pre(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let e = (group_index(wid, nwg) * WG + lid) * finish_span();
    if (e >= params.m * params.n * params.batch) {
        return;
    }
    let f = finished(e);
    pre[f.y] = f.x;
    if (DT_OUT != DT_F32) {
        let g = finished(e + 1u);
        pre[g.y] = g.x;
        store_pair(f.y, bitcast<f32>(f.x), bitcast<f32>(g.x));
        return;
    }
    store_out(f.y, bitcast<f32>(f.x));
}

// ---- Power-of-two operand scales of the tensor-core product (`wgsl/matmul_tc.wgsl`) ----
//
// A BF16 or F32 operand reaches the F16 tensor cores multiplied by 2^s, with s chosen from its
// largest finite magnitude M: E = M's binade (⌊log2 M⌋, −127 for a subnormal M) and
// s = clamp(14 − E, −113, 126) (s = 0 when every value is zero or not finite). The scaled
// values stay below 2^15, so none overflows F16 (infinities and NaNs stay what they are), and
// a BF16 value whose binade is at least E − 31 scales to an F16 value exactly. The product's
// accumulators are multiplied back by 2^−s of each operand.
//
// `tc_scale_part`: workgroup g (of `groups`) takes the maximum of the finite magnitudes of the
// source's words g·256 + lane, + groups·256, ... (counted from word `base`: the region of the
// tensor a product reads) (F32 bits, or BF16 halves moved to F32's
// position) and writes it to word `slot + g`. `tc_scale_pick`: one workgroup takes the
// maxima of A's `groups_a` partials (words 4..) and B's `groups_b` (words 260..) and writes the
// four factors 2^sA, 2^sB, 2^−sA, 2^−sB (F32 bits) to words 0..4. A maximum of integers does
// not depend on the order it is taken in, so the factors are exact and reproducible.

struct ScaleParams {
    len: u32,       // elements of the source (tc_scale_part); A's partials (tc_scale_pick)
    dt: u32,        // the source's dtype code, F32 or BF16 (tc_scale_part)
    slot: u32,      // first partial word written (tc_scale_part)
    groups: u32,    // workgroups of the launch (tc_scale_part); B's partials (tc_scale_pick)
    base: u32,      // the source's first word (tc_scale_part, tc_stage_f16: an operand's region)
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(9) var<uniform> sparams: ScaleParams;
@group(0) @binding(10) var<storage, read> scale_src: array<u32>;
@group(0) @binding(11) var<storage, read_write> scale_words: array<u32>;

// The maxima are taken over integer bits in a tree of their own rather than with
// `workgroup_max` of `wgsl/common/reduce.wgsl`: a float maximum may flush a subnormal to zero
// on devices that do not preserve F32 denormals, which would lose a tensor whose largest value
// is subnormal.
var<workgroup> scale_tree: array<u32, 512>;

// The finite magnitude of an F32 value's bits (0 for an infinity or a NaN).
fn finite_magnitude(bits: u32) -> u32 {
    let m = bits & 0x7fffffffu;
    return select(0u, m, m < 0x7f800000u);
}

// The largest finite magnitude (F32 bits) of source word w, whose bits are `bits`: one F32
// value, or the two BF16 halves inside the source's `len` elements. Without branches, so that
// a run of loaded words can all be in flight before any is used.
fn word_magnitude(bits: u32, w: u32) -> u32 {
    let lo = finite_magnitude(bits << 16u);
    let hi = select(0u, finite_magnitude(bits & 0xffff0000u), 2u * w + 1u < sparams.len);
    return select(max(lo, hi), finite_magnitude(bits), sparams.dt == DT_F32);
}

// The largest finite magnitude of the eight source words w + i·stride (i < 8), all loaded
// first.
fn eight_magnitude(w: u32, stride: u32) -> u32 {
    let b = sparams.base + w;
    let b0 = scale_src[b];
    let b1 = scale_src[b + stride];
    let b2 = scale_src[b + 2u * stride];
    let b3 = scale_src[b + 3u * stride];
    let b4 = scale_src[b + 4u * stride];
    let b5 = scale_src[b + 5u * stride];
    let b6 = scale_src[b + 6u * stride];
    let b7 = scale_src[b + 7u * stride];
    let m0 = max(word_magnitude(b0, w), word_magnitude(b1, w + stride));
    let m1 = max(word_magnitude(b2, w + 2u * stride), word_magnitude(b3, w + 3u * stride));
    let m2 = max(word_magnitude(b4, w + 4u * stride), word_magnitude(b5, w + 5u * stride));
    let m3 = max(word_magnitude(b6, w + 6u * stride), word_magnitude(b7, w + 7u * stride));
    return max(max(m0, m1), max(m2, m3));
}

// Maximum of scale_tree[base .. base + 256) into scale_tree[base] (every invocation calls it).
fn tree_max(base: u32, lid: u32) {
    for (var half = 128u; half > 0u; half >>= 1u) {
        workgroupBarrier();
        if (lid < half) {
            scale_tree[base + lid] = max(scale_tree[base + lid], scale_tree[base + lid + half]);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn tc_scale_part(@builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    var words = sparams.len;
    if (sparams.dt != DT_F32) {
        words = (sparams.len + 1u) / 2u;
    }
    // Sixteen words an invocation a step, loaded before any is used (one word a step kept one
    // load in flight an invocation); then the rest one at a time. The maximum does not depend
    // on the order.
    let stride = sparams.groups * 256u;
    var m = 0u;
    var w = wid.x * 256u + lid;
    while (w + 15u * stride < words) {
        m = max(m, max(eight_magnitude(w, stride), eight_magnitude(w + 8u * stride, stride)));
        w += 16u * stride;
    }
    for (; w < words; w += stride) {
        m = max(m, word_magnitude(scale_src[sparams.base + w], w));
    }
    scale_tree[lid] = m;
    tree_max(0u, lid);
    if (lid == 0u) {
        scale_words[sparams.slot + wid.x] = scale_tree[0];
    }
}

// The exponent s of an operand whose largest finite magnitude has the bits `m`.
fn scale_exponent(m: u32) -> i32 {
    if (m == 0u) {
        return 0;
    }
    let binade = i32(m >> 23u) - 127;
    return clamp(14 - binade, -113, 126);
}

// 2^s as F32 bits (|s| ≤ 126: a normal number).
fn power_of_two(s: i32) -> u32 {
    return u32(s + 127) << 23u;
}

@compute @workgroup_size(256)
fn tc_scale_pick(@builtin(local_invocation_index) lid: u32) {
    scale_tree[lid] = select(0u, scale_words[4u + lid], lid < sparams.len);
    scale_tree[256u + lid] = select(0u, scale_words[260u + lid], lid < sparams.groups);
    tree_max(0u, lid);
    tree_max(256u, lid);
    if (lid == 0u) {
        let sa = scale_exponent(scale_tree[0]);
        let sb = scale_exponent(scale_tree[256]);
        scale_words[0] = power_of_two(sa);
        scale_words[1] = power_of_two(sb);
        scale_words[2] = power_of_two(-sa);
        scale_words[3] = power_of_two(-sb);
    }
}

// `tc_stage_f16`: an F16 copy of a BF16 or F32 source times its factor (word `slot` of the
// factors: 0 for A, 1 for B), so that the tensor-core product stages it as it comes instead
// of converting every value on every tile. Invocation w writes word w of the copy (elements
// 2w and 2w + 1; the half past an odd `len` is 0). BF16 values convert exactly, as in the
// kernel's own conversion; F32 ones take the device's rounding to F16.
@group(0) @binding(12) var<storage, read_write> f16_copy: array<u32>;

// Elements 2w and 2w + 1 of the source, widened to F32 as the tensor-core kernel widens them
// (`widen2`; the second 0 past `len`).
fn scale_src_pair(w: u32) -> vec2<f32> {
    let base = sparams.base;
    var v = widen2(scale_src[base + w], sparams.dt);
    if (sparams.dt == DT_F32) {
        let second = min(2u * w + 1u, sparams.len - 1u);
        v = vec2<f32>(bitcast<f32>(scale_src[base + 2u * w]),
                      bitcast<f32>(scale_src[base + second]));
    }
    return select(vec2<f32>(v.x, 0.0), v, 2u * w + 1u < sparams.len);
}

@compute @workgroup_size(256)
fn tc_stage_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let w = group_index(wid, nwg) * 256u + lid;
    if (2u * w >= sparams.len) {
        return;
    }
    let f = bitcast<f32>(scale_words[sparams.slot]);
    f16_copy[w] = pack2x16float(scale_src_pair(w) * f);
}
