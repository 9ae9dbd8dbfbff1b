// Dense matrix product on tensor cores (cooperative matrices), the opt-in path of
// `matmul::gemm` for 16-bit operands (`Gemm::tensor_cores`, `MatmulOptions::tensor_cores`):
//
//   out[off_c + b·stride_c + i·n + j] (=|+=) alpha · Σ_{l < k} A_b(i, l) · B_b(l, j)
//
// with A_b(i, l) at off_a + b·stride_a + i·k + l ([m, k] rows), or + l·m + i when TRANS_A, and
// B_b(l, j) at off_b + b·stride_b + l·n + j ([k, n] rows), or + j·k + l when TRANS_B ([n, k]).
// A and B are F16 (two halves a u32 word), or with DT_A / DT_B BF16 (two halves a word) or F32
// (`Gemm::round_f32_operands`), staged times their operand's power of two (`tc_scale`) as F16:
// exact for BF16 within 2^31 of its tensor's largest value, F32 rounded to 11 bits. (Operands
// staged by many tiles reach the kernel as F16 copies made by `tc_stage_f16` instead, with the
// same values.) Products of two F16 values are exact in FP32; the sums are the tensor cores' FP32 accumulation, whose order and rounding inside one
// 16-wide k step are the hardware's, not one IEEE fma per term: the results are deterministic on
// one device (a fixed schedule, no atomics) but not the bits of the FP32 path
// (`wgsl/matmul.wgsl`), hence an opt-in with its own tolerance (`matmul::tensor_core_tolerance`).
//
// Split-K (`slices` > 1, the plain entry only): workgroup g computes tile g mod T (T tiles of
// the product) over the k slice s = g / T, [s·k_slice, min(k, (s+1)·k_slice)), and stores its
// raw sums (alpha 1, no accumulate: the caller's parameters) at slice s's place of the F32
// scratch [slices, batch, m, n]; the FP32 module's `gemm_finish` then adds the slices in
// increasing order and applies the epilogue, as for its own split products.
//
// This module starts with `enable wgpu_cooperative_matrix;` (its own file for that reason) and
// runs only where `matmul::tensor_cores` holds: a Vulkan device with
// `EXPERIMENTAL_COOPERATIVE_MATRIX` and a 16×16×16 F16 × F16 → F32 configuration, subgroups
// of exactly 32 invocations and 44 KiB of workgroup memory.
//
// Tiling (`matmul::tensor_core_tile`, pipeline constants BM, SB, BK): a workgroup computes a
// BM×128 output tile with one subgroup of 32 invocations per SB×64 block: subgroup s owns rows
// SB·(s / 2).. and columns 64·(s % 2).., 2 × 4 (SB = 32) or 4 × 4 (SB = 64) fragments of 16×16
// held as F32 accumulators. The tiles: 128×128 with 32-row blocks (256 invocations), 64×128
// with 32-row blocks (128; products of at most 64 rows) and 256×128 with 64-row blocks (256;
// the backward's layouts); 64×128 and 128×128 with 64-row blocks are tested, not chosen. Each
// fragment adds its k fragments in increasing k in every tile: the same sums and bits. K
// advances in steps of BK = 2048 / SB (64, or 32 for 64-row blocks): the step's A (BM×BK) and
// B (BK×128) values, four 16-byte chunks of A and 2, 4 or 8 of B per invocation, are loaded
// into registers while the previous step is multiplied (their raw words, untouched until
// staged: a conversion right after the loads would wait for them before the products), then
// converted and stored to workgroup memory as F16 quads in the operand's own layout (rows
// along its contiguous axis, padded by 8 halves: eight consecutive rows of a fragment start 4
// banks apart; at most 44 KiB with the fragment staging), from which each subgroup loads its
// fragments (BK / 16 k fragments a step). Chunks past k, m or n are zeros. Whole tiles store
// their fragments straight to out; a tile reaching past m or n stores each through
// workgroup memory and writes the values inside the product (a cooperative store cannot be
// skipped for one subgroup: a cooperative operation may not sit under a branch on the
// subgroup's position, naga's uniformity rule). The host's rule (`matmul::tensor_core_fits`):
// every operand's contiguous extent, offset and batch stride a multiple of 8 halves (16-byte
// chunks), n, out's offset and batch stride multiples of 4 (16-byte rows of out).
//
// Entry points: `gemm_tc`, out F32 without bias, activation or pre-activation (the fragments
// stored straight to out, `alpha` and accumulate applied to whole fragments); `gemm_tc_bias`,
// the same with a bias (any float dtype, staged as 16 F32 rows and loaded as fragments: the
// epilogue's `alpha·Σ + bias[j]` on whole fragments, the same values); `gemm_tc_epilogue`
// and `gemm_tc_epilogue_pre`, the epilogue of `wgsl/matmul.wgsl` (`v = alpha·Σ + bias[j]`, out
// ← act(v) or out += v; out F32, or F16 / BF16 with DT_OUT, each value rounded once, two
// columns a word; `_pre` also stores v, F32, with out's indexing): every fragment goes through
// workgroup memory, where each invocation takes eight of its values. Where the workspace
// allows, the host runs such a product as `gemm_tc` into F32 scratch and the FP32 module's
// `gemm_finish` instead (`matmul::TC_STAGE_EPILOGUES`, the same bits).
//
// Measured on an H200 (`notes/measurements.md`) and not kept: fragments loaded straight from
// the buffers (no staging), chunks fetched as F16 quads, K steps of 32, two staging buffers
// with one barrier a step, 64×64 subgroup tiles on 128 invocations, B staged transposed (all
// before the raw words were held), and two steps in flight instead of one, K steps of 32
// staged in two buffers, and 64-row tiles for every product (after); 256×128 tiles of 64-row
// blocks for `x·Wᵀ` (2–5% slower) and for the epilogue entries (6–12%), whose fragments
// each take two barriers to stage; 128×128 tiles of 64-row blocks (22–43% slower); 64×128 tiles
// of 64-row blocks for the short products of a fused linear head (3% slower).

override TRANS_A: u32 = 0u;     // 1: A stored [k, m]
override TRANS_B: u32 = 0u;     // 1: B stored [n, k]
override DT_OUT: u32 = 0u;      // dtype code of out (the epilogue entries)
override DT_A: u32 = 1u;        // dtype codes of A and B: F16 (as staged), or BF16 / F32
override DT_B: u32 = 1u;        // (scaled, see `tc_scale`)
// A BF16 or F32 operand: both are staged times their factors and the sums multiplied back.
override SCALED: bool = DT_A != DT_F16 || DT_B != DT_F16;
// Tile rows per band of the launch order (`tile_at`; 1: row after row).
override GROUP_M: u32 = 1u;
// Tile rows BM, subgroup block rows SB and K step BK (`matmul::TcTile`): 128 / 32 / 64 (8
// subgroups), 64 / 32 / 64 (4 subgroups: short products, whose rows would leave most of a
// 128-row tile empty), or with SB = 64 (4 × 4 fragments a subgroup) BK = 32. Each subgroup
// computes SB×64 and each of its fragments the same sums in the same order in every shape.
override BM: u32 = 128u;
override SB: u32 = 32u;
override BK: u32 = 64u;
override WG: u32 = 64u * BM / SB;

const BN: u32 = 128u;
const PAD: u32 = 8u;
// Quads of halves per staged operand: k-contiguous, w rows of BK + PAD; else BK rows of w + PAD.
override A_QUADS: u32 = max(BM * (BK + PAD), BK * (BM + PAD)) / 4u;
override B_QUADS: u32 = max(BN * (BK + PAD), BK * (BN + PAD)) / 4u;


@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a4: array<vec4<u32>>;  // A, B as 16-byte chunks
@group(0) @binding(2) var<storage, read> b4: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// The epilogue entries: the bias (any float dtype), out as words (F32 bits, or two 16-bit
// values), the F32 pre-activation.
@group(0) @binding(4) var<storage, read> bias: array<u32>;
@group(0) @binding(5) var<storage, read_write> out_w: array<u32>;
@group(0) @binding(6) var<storage, read_write> pre: array<u32>;
// With SCALED: 2^sA, 2^sB, 2^−sA, 2^−sB (`tc_scale_pick` of `wgsl/matmul.wgsl`).
@group(0) @binding(7) var<storage, read> tc_scale: array<f32>;

var<workgroup> a_tile: array<vec4<f16>, A_QUADS>;
var<workgroup> b_tile: array<vec4<f16>, B_QUADS>;
// One 16×16 F32 fragment a subgroup: how a ragged tile's accumulators reach out.
var<workgroup> c_tile: array<f32, 2048>;

// Eight F16 values of one chunk.
struct H8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}

// Halves per staged row: a k-contiguous operand (A not transposed, B transposed) is staged as
// `w` rows of BK halves, the other as BK rows of `w` (w: the tile's extent along the operand,
// BM for A, BN for B).
fn pitch(kc: bool, w: u32) -> u32 {
    return select(w + PAD, BK + PAD, kc);
}

// The staging slot of chunk c (0..w·BK/8) of a step: (row, first column) in the staged layout.
fn chunk_slot(kc: bool, c: u32, w: u32) -> vec2<u32> {
    if (kc) {
        return vec2<u32>(c / (BK / 8u), (c % (BK / 8u)) * 8u);
    }
    return vec2<u32>(c / (w / 8u), (c % (w / 8u)) * 8u);
}

// Chunk c of the step at k0 of an operand: its element index and whether it lies inside the
// operand (k below `kend`, the end of the k slice, and row below `rows`, its extent along the
// tile's 128: m or n). `base` is its batch's first element, `x0` the tile's row/column origin;
// kc: consecutive k adjacent.
struct ChunkAt {
    e: u32,
    inside: bool,
}

fn chunk_at(kc: bool, c: u32, x0: u32, k0: u32, kend: u32, rows: u32, base: u32,
            w: u32) -> ChunkAt {
    let s = chunk_slot(kc, c, w);
    var x: u32;
    var kk: u32;
    var e: u32;
    if (kc) {
        x = x0 + s.x;
        kk = k0 + s.y;
        e = base + x * params.k + kk;
    } else {
        kk = k0 + s.x;
        x = x0 + s.y;
        e = base + kk * rows + x;
    }
    return ChunkAt(e, kk < kend && x < rows);
}

// The raw words of one chunk (two 16-byte chunks for F32 operands), loaded and not yet used:
// a fetched step is converted only when it is staged, after the next step's products, so the
// loads stay in flight through them (a use right after the load would wait for it).
struct Raw {
    lo: vec4<u32>,
    hi: vec4<u32>,
}

// One return, at the end: a return under a branch on the invocation (or an argument) would
// make the callers' cooperative operations non-uniform to naga. Chunks past k, or past m or n
// in a ragged last tile, read chunk 0 (zeroed when staged, `to_h8`).
fn fetch(kc: bool, c: u32, x0: u32, k0: u32, kend: u32, rows: u32, base: u32, is_a: bool) -> Raw {
    let p = chunk_at(kc, c, x0, k0, kend, rows, base, select(BN, BM, is_a));
    let dt = select(DT_B, DT_A, is_a);
    var r: Raw;
    if (dt == DT_F32) {
        let at = select(0u, p.e / 4u, p.inside);
        r = Raw(chunk(is_a, at), chunk(is_a, at + 1u));
    } else {
        r = Raw(chunk(is_a, select(0u, p.e / 8u, p.inside)), vec4<u32>());
    }
    return r;
}

// A fetched chunk as eight F16 values (zeros outside the operand). BF16 and F32 values are
// multiplied by their operand's factor `scale` (exact) before they are rounded to F16.
fn to_h8(r: Raw, inside: bool, is_a: bool, scale: f32) -> H8 {
    let dt = select(DT_B, DT_A, is_a);
    var h: H8;
    if (dt == DT_F32) {
        let lo = select(vec4<f32>(), bitcast<vec4<f32>>(r.lo), inside) * scale;
        let hi = select(vec4<f32>(), bitcast<vec4<f32>>(r.hi), inside) * scale;
        h = H8(vec4<f16>(lo), vec4<f16>(hi));
    } else {
        let w = select(vec4<u32>(), r.lo, inside);
        if (dt == DT_BF16) {
            h = H8(vec4<f16>(chunk_lo(w, DT_BF16) * scale),
                   vec4<f16>(chunk_hi(w, DT_BF16) * scale));
        } else {
            h = H8(vec4<f16>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y))),
                   vec4<f16>(vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w))));
        }
    }
    return h;
}

// The 16-byte chunk `at` of A or B.
fn chunk(is_a: bool, at: u32) -> vec4<u32> {
    var w: vec4<u32>;
    if (is_a) {
        w = a4[at];
    } else {
        w = b4[at];
    }
    return w;
}

// The factors the sums are multiplied by: (2^−sA, alpha·2^−sB), or (1, alpha) for F16
// operands (then the bits of `acc · alpha`). Two multiplications, each exact but for
// underflow, so the sums are rounded once.
fn factors() -> vec2<f32> {
    var f = vec2<f32>(1.0, params.alpha);
    if (SCALED) {
        f = vec2<f32>(tc_scale[2], params.alpha * tc_scale[3]);
    }
    return f;
}

// Store fetched chunk c into its operand's staged tile (two quads).
fn store_a(kc: bool, c: u32, h: H8) {
    let s = chunk_slot(kc, c, BM);
    let at = (s.x * pitch(kc, BM) + s.y) / 4u;
    a_tile[at] = h.lo;
    a_tile[at + 1u] = h.hi;
}

fn store_b(kc: bool, c: u32, h: H8) {
    let s = chunk_slot(kc, c, BN);
    let at = (s.x * pitch(kc, BN) + s.y) / 4u;
    b_tile[at] = h.lo;
    b_tile[at + 1u] = h.hi;
}

// The A fragment of tile rows r.., step columns kk.. (16×16); the loads address quads
// (offsets and strides in quads: every fragment starts on one).
fn frag_a(r: u32, kk: u32) -> coop_mat16x16<f16, A> {
    var f: coop_mat16x16<f16, A>;
    if (TRANS_A == 0u) {
        let stride = (BK + PAD) / 4u;
        f = coopLoadT<coop_mat16x16<f16, A>>(&a_tile[(r * (BK + PAD) + kk) / 4u], stride);
    } else {
        let stride = (BM + PAD) / 4u;
        f = coopLoad<coop_mat16x16<f16, A>>(&a_tile[(kk * (BM + PAD) + r) / 4u], stride);
    }
    return f;
}

// The B fragment of step rows kk.., tile columns c.. (16×16).
fn frag_b(kk: u32, c: u32) -> coop_mat16x16<f16, B> {
    var f: coop_mat16x16<f16, B>;
    if (TRANS_B == 1u) {
        let stride = (BK + PAD) / 4u;
        f = coopLoad<coop_mat16x16<f16, B>>(&b_tile[(c * (BK + PAD) + kk) / 4u], stride);
    } else {
        let stride = (BN + PAD) / 4u;
        f = coopLoadT<coop_mat16x16<f16, B>>(&b_tile[(kk * (BN + PAD) + c) / 4u], stride);
    }
    return f;
}

// alpha times an accumulator of output rows i.., columns j.., written to out (or added to
// out's values with accumulate).
fn acc_store(acc: coop_mat16x16<f32, C>, i: u32, j: u32, c0: u32) {
    // The stride is a named value: naga 30's SPIR-V writer does not emit an expression written
    // inline in `coopStore`'s arguments.
    let stride = params.n;
    let at = c0 + i * stride + j;
    let f = factors();
    var v = acc * f.x * f.y;
    if (params.accumulate == 1u) {
        v = v + coopLoadT<coop_mat16x16<f32, C>>(&out[at], stride);
    }
    let result = v;
    coopStoreT(result, &out[at], stride);
}

// Each subgroup stores its accumulator into its 16×16 of `c_tile` for its invocations to
// read: invocation `lane` of the subgroup then takes row lane / 2, columns 8·(lane % 2)..+8
// (`staged`). Uniform: every subgroup stages the same fragment of its block, and the caller
// ends with a barrier before the next one.
fn stage_frag(acc: coop_mat16x16<f32, C>, sg: u32) {
    coopStoreT(acc, &c_tile[sg * 256u], 16u);
    workgroupBarrier();
}

fn staged(sg: u32, lane: u32, q: u32) -> f32 {
    return c_tile[sg * 256u + (lane / 2u) * 16u + q];
}

// The staged fragment at output rows i.., columns j.. of a tile that reaches past m or n (the
// whole workgroup takes this path): the values inside the product, times f.x·f.y (added to
// out's with accumulate).
fn edge_out(i: u32, j: u32, c0: u32, sg: u32, lane: u32, f: vec2<f32>) {
    let r = lane / 2u;
    let q0 = (lane % 2u) * 8u;
    if (i + r < params.m) {
        for (var q = q0; q < q0 + 8u; q += 1u) {
            if (j + q < params.n) {
                let at = c0 + (i + r) * params.n + j + q;
                var v = staged(sg, lane, q) * f.x * f.y;
                if (params.accumulate == 1u) {
                    v = v + out[at];
                }
                out[at] = v;
            }
        }
    }
}

fn acc_store_edge(acc: coop_mat16x16<f32, C>, i: u32, j: u32, c0: u32, sg: u32, lane: u32) {
    stage_frag(acc, sg);
    edge_out(i, j, c0, sg, lane, factors());
    workgroupBarrier();
}

// ---- `gemm_tc_bias`: F32 out with a bias, no activation ----

// c_tile ← 16 rows of the tile's 128 column biases in FP32 (zeros past n): the bias fragment
// of tile columns c.. is then a 16×16 load at c_tile[c] with a stride of 128.
fn stage_bias_rows(n0: u32, lid: u32) {
    for (var e = lid; e < 2048u; e += WG) {
        c_tile[e] = bias_at(n0 + e % 128u);
    }
    workgroupBarrier();
}

fn bias_frag(c: u32) -> coop_mat16x16<f32, C> {
    return coopLoadT<coop_mat16x16<f32, C>>(&c_tile[c], 128u);
}

// v = alpha·Σ + bias of a whole accumulator (the epilogue's operations in its order), to out
// (or added to out's values with accumulate).
fn bias_store(acc: coop_mat16x16<f32, C>, b: coop_mat16x16<f32, C>, i: u32, j: u32, c0: u32) {
    let stride = params.n;
    let at = c0 + i * stride + j;
    let f = factors();
    var v = acc * f.x * f.y + b;
    if (params.accumulate == 1u) {
        v = v + coopLoadT<coop_mat16x16<f32, C>>(&out[at], stride);
    }
    let result = v;
    coopStoreT(result, &out[at], stride);
}

// The same for a tile reaching past m or n: v staged, then its values inside the product
// written (times 1, exact).
fn bias_store_edge(acc: coop_mat16x16<f32, C>, b: coop_mat16x16<f32, C>, i: u32, j: u32,
                   c0: u32, sg: u32, lane: u32) {
    let f = factors();
    stage_frag(acc * f.x * f.y + b, sg);
    edge_out(i, j, c0, sg, lane, vec2<f32>(1.0, 1.0));
    workgroupBarrier();
}

// ---- the epilogue entries ----

// Eight FP32 values of one fragment row: columns q0.. (`lo`) and q0 + 4.. (`hi`).
struct F8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The bias of columns j + q0.. of an invocation's fragment row (zeros past n or without a
// bias). Each entry loads all of its columns' biases (32) before its first store, and each
// fragment row's values are formed before any of them is stored: with each bias loaded at its
// value's store, one after another, the epilogue cost 27% of the plain product's rate on an
// H200, 22% so.
fn bias8(j: u32, q0: u32) -> F8 {
    return F8(bias4(j + q0), bias4(j + q0 + 4u));
}

// v = alpha·Σ + bias of the invocation's eight staged values: row lane / 2 of its subgroup's
// fragment, columns q0 = 8·(lane % 2)... The bias (zeros without one) is always added, as
// `gemm_finish` adds it to a product staged in F32 scratch (`matmul::TC_STAGE_EPILOGUES`):
// the same bits, a sum of −0 included.
fn epi_values(sg: u32, lane: u32, b: F8) -> F8 {
    let at = sg * 256u + (lane / 2u) * 16u + (lane % 2u) * 8u;
    let lo = vec4<f32>(c_tile[at], c_tile[at + 1u], c_tile[at + 2u], c_tile[at + 3u]);
    let hi = vec4<f32>(c_tile[at + 4u], c_tile[at + 5u], c_tile[at + 6u], c_tile[at + 7u]);
    let f = factors();
    return F8(lo * f.x * f.y + b.lo, hi * f.x * f.y + b.hi);
}

// Value q (0..8) of eight.
fn f8_at(v: F8, q: u32) -> f32 {
    if (q < 4u) {
        return v.lo[q];
    }
    return v.hi[q - 4u];
}

// One F32 out value at row word `row` + column q (inside n): act(v), or out += v.
fn put_f32(row: u32, q: u32, v: f32) {
    if (params.accumulate == 1u) {
        out_w[row + q] = bitcast<u32>(bitcast<f32>(out_w[row + q]) + v);
    } else {
        out_w[row + q] = bitcast<u32>(epilogue(v));
    }
}

// The fragment row's values inside the product to out: F32 (act(v), or out += v), or 16-bit
// pairs of columns (n, out's offset and batch stride even: j + q even). `row` is out's index
// of column j of the row, `inside` whether the row is below m.
fn epi_out(v: F8, row: u32, j: u32, q0: u32, inside: bool) {
    if (!inside) {
        return;
    }
    if (DT_OUT == DT_F32) {
        for (var q = 0u; q < 8u; q += 1u) {
            if (j + q0 + q < params.n) {
                put_f32(row, q0 + q, f8_at(v, q));
            }
        }
    } else {
        for (var q = 0u; q < 8u; q += 2u) {
            if (j + q0 + q < params.n) {
                let h = pack_halves(epilogue(f8_at(v, q)), epilogue(f8_at(v, q + 1u)), DT_OUT);
                out_w[(row + q0 + q) / 2u] = h;
            }
        }
    }
}

// The fragment row's pre-activations v inside the product.
fn epi_pre(v: F8, row: u32, j: u32, q0: u32, inside: bool) {
    if (!inside) {
        return;
    }
    for (var q = 0u; q < 8u; q += 1u) {
        if (j + q0 + q < params.n) {
            pre[row + q0 + q] = bitcast<u32>(f8_at(v, q));
        }
    }
}

// An invocation's row of a staged accumulator: its values, out's index of column j of the
// row, the first column q0 and whether the row is below m.
struct FragRow {
    v: F8,
    row: u32,
    q0: u32,
    inside: bool,
}

// Accumulator `acc` (output rows i.., columns j..) staged in workgroup memory, and the
// invocation's row of it with the bias `b` of its columns added.
fn frag_row(acc: coop_mat16x16<f32, C>, i: u32, j: u32, c0: u32, sg: u32, lane: u32,
            b: F8) -> FragRow {
    stage_frag(acc, sg);
    let r = lane / 2u;
    return FragRow(epi_values(sg, lane, b), c0 + (i + r) * params.n + j, (lane % 2u) * 8u,
                   i + r < params.m);
}

// `acc` to out through workgroup memory (`gemm_tc_epilogue`).
fn epi_store(acc: coop_mat16x16<f32, C>, i: u32, j: u32, c0: u32, sg: u32, lane: u32, b: F8) {
    let f = frag_row(acc, i, j, c0, sg, lane, b);
    epi_out(f.v, f.row, j, f.q0, f.inside);
    workgroupBarrier();
}

// `acc` to out and its pre-activation to `pre` (`gemm_tc_epilogue_pre`).
fn epi_store_pre(acc: coop_mat16x16<f32, C>, i: u32, j: u32, c0: u32, sg: u32, lane: u32,
                 b: F8) {
    let f = frag_row(acc, i, j, c0, sg, lane, b);
    epi_pre(f.v, f.row, j, f.q0, f.inside);
    epi_out(f.v, f.row, j, f.q0, f.inside);
    workgroupBarrier();
}

// Eight accumulators of a subgroup's block: cRQ at rows 16·R.., columns 16·Q.. of its 32×64.
struct Acc8 {
    c00: coop_mat16x16<f32, C>,
    c01: coop_mat16x16<f32, C>,
    c02: coop_mat16x16<f32, C>,
    c03: coop_mat16x16<f32, C>,
    c10: coop_mat16x16<f32, C>,
    c11: coop_mat16x16<f32, C>,
    c12: coop_mat16x16<f32, C>,
    c13: coop_mat16x16<f32, C>,
}

// A subgroup's SB×64 block: rows 0..32 (`t`) and, with SB = 64, rows 32..64 (`u`; zeros and
// unused otherwise).
struct Acc {
    t: Acc8,
    u: Acc8,
}

// A tile's launch: its batch's operand bases and out offset, its origin, this subgroup's
// block origin (tile coordinates), and its k range (a slice of k with split-K).
struct TileAt {
    abase: u32,
    bbase: u32,
    c0: u32,
    m0: u32,
    n0: u32,
    wr: u32,
    wc: u32,
    k0: u32,
    k1: u32,
}

// The tile's operands, output and subgroup block, in bands of GROUP_M tile rows
// (`banded_tile` of `common/gemm_params.wgsl`, the FP32 module's order).
fn tile_at(tile: u32, sg: u32) -> TileAt {
    let per_slice = params.tiles_m * params.tiles_n * params.batch;
    let slice = tile / per_slice;
    let t = banded_tile(tile - slice * per_slice, GROUP_M);
    let bi = t.x;
    let k0 = slice * params.k_slice;
    // A slice's sums go to its [batch, m, n] of the scratch (stride_c is 0 for one batch).
    let c0 = params.off_c + bi * params.stride_c + slice * params.batch * params.m * params.n;
    return TileAt(params.off_a + bi * params.stride_a, params.off_b + bi * params.stride_b, c0,
                  t.y * BM, t.z * BN, (sg / 2u) * SB, (sg % 2u) * 64u, k0,
                  min(params.k, k0 + params.k_slice));
}

// Whether workgroup `tile` has a tile to compute (uniform: the early return before the
// cooperative operations stays uniform).
fn tile_launched(tile: u32) -> bool {
    return tile < params.tiles_m * params.tiles_n * params.batch * params.slices;
}

// A step's chunks of both operands for one invocation: chunks lid + WG·q of A (aQ; BM·BK/8 =
// 4·WG of them) and of B (bQ; BN·BK/8 of them: 2, 4 or 8 an invocation, `b_chunks`, the
// others left empty).
struct Step {
    a0: Raw,
    a1: Raw,
    a2: Raw,
    a3: Raw,
    b0: Raw,
    b1: Raw,
    b2: Raw,
    b3: Raw,
    b4: Raw,
    b5: Raw,
    b6: Raw,
    b7: Raw,
}

// B chunks an invocation stages a step.
fn b_chunks() -> u32 {
    return BN * BK / (8u * WG);
}

// The invocation's chunks of the step at k0 (loads only). The branches are on pipeline
// constants: compiled away.
fn fetch_step(at: TileAt, k0: u32, lid: u32) -> Step {
    let akc = TRANS_A == 0u;
    let bkc = TRANS_B == 1u;
    let m0 = at.m0;
    let n0 = at.n0;
    let ab = at.abase;
    let bb = at.bbase;
    let kend = at.k1;
    let m = params.m;
    let n = params.n;
    var t = Step(fetch(akc, lid, m0, k0, kend, m, ab, true),
                 fetch(akc, lid + WG, m0, k0, kend, m, ab, true),
                 fetch(akc, lid + 2u * WG, m0, k0, kend, m, ab, true),
                 fetch(akc, lid + 3u * WG, m0, k0, kend, m, ab, true),
                 fetch(bkc, lid, n0, k0, kend, n, bb, false),
                 fetch(bkc, lid + WG, n0, k0, kend, n, bb, false),
                 Raw(), Raw(), Raw(), Raw(), Raw(), Raw());
    if (b_chunks() >= 4u) {
        t.b2 = fetch(bkc, lid + 2u * WG, n0, k0, kend, n, bb, false);
        t.b3 = fetch(bkc, lid + 3u * WG, n0, k0, kend, n, bb, false);
    }
    if (b_chunks() == 8u) {
        t.b4 = fetch(bkc, lid + 4u * WG, n0, k0, kend, n, bb, false);
        t.b5 = fetch(bkc, lid + 5u * WG, n0, k0, kend, n, bb, false);
        t.b6 = fetch(bkc, lid + 6u * WG, n0, k0, kend, n, bb, false);
        t.b7 = fetch(bkc, lid + 7u * WG, n0, k0, kend, n, bb, false);
    }
    return t;
}

// B's chunk c of the step at k0, staged (`t`: its fetched words).
fn stage_b(t: Raw, bkc: bool, c: u32, at: TileAt, k0: u32, sc: f32) {
    let inside = chunk_at(bkc, c, at.n0, k0, at.k1, params.n, 0u, BN).inside;
    store_b(bkc, c, to_h8(t, inside, false, sc));
}

// A's, likewise.
fn stage_a(t: Raw, akc: bool, c: u32, at: TileAt, k0: u32, sc: f32) {
    let inside = chunk_at(akc, c, at.m0, k0, at.k1, params.m, 0u, BM).inside;
    store_a(akc, c, to_h8(t, inside, true, sc));
}

// The step at k0, fetched by `fetch_step`, staged in workgroup memory as F16 (between the
// caller's barriers). `sc`: the operands' factors (1 for F16).
fn stage_step(t: Step, at: TileAt, k0: u32, lid: u32, sc: vec2<f32>) {
    let akc = TRANS_A == 0u;
    let bkc = TRANS_B == 1u;
    stage_a(t.a0, akc, lid, at, k0, sc.x);
    stage_a(t.a1, akc, lid + WG, at, k0, sc.x);
    stage_a(t.a2, akc, lid + 2u * WG, at, k0, sc.x);
    stage_a(t.a3, akc, lid + 3u * WG, at, k0, sc.x);
    stage_b(t.b0, bkc, lid, at, k0, sc.y);
    stage_b(t.b1, bkc, lid + WG, at, k0, sc.y);
    if (b_chunks() >= 4u) {
        stage_b(t.b2, bkc, lid + 2u * WG, at, k0, sc.y);
        stage_b(t.b3, bkc, lid + 3u * WG, at, k0, sc.y);
    }
    if (b_chunks() == 8u) {
        stage_b(t.b4, bkc, lid + 4u * WG, at, k0, sc.y);
        stage_b(t.b5, bkc, lid + 5u * WG, at, k0, sc.y);
        stage_b(t.b6, bkc, lid + 6u * WG, at, k0, sc.y);
        stage_b(t.b7, bkc, lid + 7u * WG, at, k0, sc.y);
    }
}

// The products of one k fragment (k columns kk.. of the staged step) added to the eight
// accumulators of block rows r.., columns wc..: B's four fragments given.
fn rows_products(c: Acc8, r: u32, kk: u32, b0: coop_mat16x16<f16, B>, b1: coop_mat16x16<f16, B>,
                 b2: coop_mat16x16<f16, B>, b3: coop_mat16x16<f16, B>) -> Acc8 {
    let a0 = frag_a(r, kk);
    let a1 = frag_a(r + 16u, kk);
    var x = c;
    x.c00 = coopMultiplyAdd(a0, b0, x.c00);
    x.c01 = coopMultiplyAdd(a0, b1, x.c01);
    x.c02 = coopMultiplyAdd(a0, b2, x.c02);
    x.c03 = coopMultiplyAdd(a0, b3, x.c03);
    x.c10 = coopMultiplyAdd(a1, b0, x.c10);
    x.c11 = coopMultiplyAdd(a1, b1, x.c11);
    x.c12 = coopMultiplyAdd(a1, b2, x.c12);
    x.c13 = coopMultiplyAdd(a1, b3, x.c13);
    return x;
}

// The staged step's products added to this subgroup's accumulators (block rows wr.., columns
// wc.. of the tile): BK / 16 k fragments, 8 products each for every 32 block rows.
fn step_products(c: Acc, wr: u32, wc: u32) -> Acc {
    var r = c;
    for (var kk = 0u; kk < BK; kk += 16u) {
        let b0 = frag_b(kk, wc);
        let b1 = frag_b(kk, wc + 16u);
        let b2 = frag_b(kk, wc + 32u);
        let b3 = frag_b(kk, wc + 48u);
        r.t = rows_products(r.t, wr, kk, b0, b1, b2, b3);
        if (SB == 64u) {
            r.u = rows_products(r.u, wr + 32u, kk, b0, b1, b2, b3);
        }
    }
    return r;
}

// Σ over k of this subgroup's SB×64 block of the tile (raw sums, no alpha). Called in uniform
// control flow by every invocation of the workgroup. Each step is fetched one step before it
// is staged, its loads in flight through the products of the step between.
fn tile_product(at: TileAt, lid: u32) -> Acc {
    let k_lo = at.k0;
    let k_hi = at.k1;
    // The operands' scale factors (1 for F16, see `factors`).
    var sc = vec2<f32>(1.0, 1.0);
    if (SCALED) {
        sc = vec2<f32>(tc_scale[0], tc_scale[1]);
    }
    let z = coop_mat16x16<f32, C>();
    let z8 = Acc8(z, z, z, z, z, z, z, z);
    var acc = Acc(z8, z8);
    // Fetches are unconditional (a step past the slice reads chunk 0, never staged): a fetch
    // under a branch would merge its registers with the old ones, a copy that waits for the
    // loads.
    var s = fetch_step(at, k_lo, lid);
    for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
        workgroupBarrier();
        stage_step(s, at, k0, lid, sc);
        workgroupBarrier();
        s = fetch_step(at, k0 + BK, lid);
        acc = step_products(acc, at.wr, at.wc);
    }
    return acc;
}

// Eight accumulators (rows i.., columns j.. of out) to out, whole or (`acc_store_edge`)
// through workgroup memory.
fn acc8_store(a: Acc8, i: u32, j: u32, c0: u32) {
    acc_store(a.c00, i, j, c0);
    acc_store(a.c01, i, j + 16u, c0);
    acc_store(a.c02, i, j + 32u, c0);
    acc_store(a.c03, i, j + 48u, c0);
    acc_store(a.c10, i + 16u, j, c0);
    acc_store(a.c11, i + 16u, j + 16u, c0);
    acc_store(a.c12, i + 16u, j + 32u, c0);
    acc_store(a.c13, i + 16u, j + 48u, c0);
}

fn acc8_store_edge(a: Acc8, i: u32, j: u32, c0: u32, sg: u32, lane: u32) {
    acc_store_edge(a.c00, i, j, c0, sg, lane);
    acc_store_edge(a.c01, i, j + 16u, c0, sg, lane);
    acc_store_edge(a.c02, i, j + 32u, c0, sg, lane);
    acc_store_edge(a.c03, i, j + 48u, c0, sg, lane);
    acc_store_edge(a.c10, i + 16u, j, c0, sg, lane);
    acc_store_edge(a.c11, i + 16u, j + 16u, c0, sg, lane);
    acc_store_edge(a.c12, i + 16u, j + 32u, c0, sg, lane);
    acc_store_edge(a.c13, i + 16u, j + 48u, c0, sg, lane);
}

// The four bias fragments of a subgroup's 64 columns.
struct Bias4 {
    b0: coop_mat16x16<f32, C>,
    b1: coop_mat16x16<f32, C>,
    b2: coop_mat16x16<f32, C>,
    b3: coop_mat16x16<f32, C>,
}

fn bias8_store(a: Acc8, b: Bias4, i: u32, j: u32, c0: u32) {
    bias_store(a.c00, b.b0, i, j, c0);
    bias_store(a.c01, b.b1, i, j + 16u, c0);
    bias_store(a.c02, b.b2, i, j + 32u, c0);
    bias_store(a.c03, b.b3, i, j + 48u, c0);
    bias_store(a.c10, b.b0, i + 16u, j, c0);
    bias_store(a.c11, b.b1, i + 16u, j + 16u, c0);
    bias_store(a.c12, b.b2, i + 16u, j + 32u, c0);
    bias_store(a.c13, b.b3, i + 16u, j + 48u, c0);
}

fn bias8_store_edge(a: Acc8, b: Bias4, i: u32, j: u32, c0: u32, sg: u32, lane: u32) {
    bias_store_edge(a.c00, b.b0, i, j, c0, sg, lane);
    bias_store_edge(a.c01, b.b1, i, j + 16u, c0, sg, lane);
    bias_store_edge(a.c02, b.b2, i, j + 32u, c0, sg, lane);
    bias_store_edge(a.c03, b.b3, i, j + 48u, c0, sg, lane);
    bias_store_edge(a.c10, b.b0, i + 16u, j, c0, sg, lane);
    bias_store_edge(a.c11, b.b1, i + 16u, j + 16u, c0, sg, lane);
    bias_store_edge(a.c12, b.b2, i + 16u, j + 32u, c0, sg, lane);
    bias_store_edge(a.c13, b.b3, i + 16u, j + 48u, c0, sg, lane);
}

// The biases of an invocation's 32 columns (see `bias8`): columns j + 16·Q + q0...
struct Bias32 {
    b0: F8,
    b1: F8,
    b2: F8,
    b3: F8,
}

fn bias32(j: u32, lane: u32) -> Bias32 {
    let q0 = (lane % 2u) * 8u;
    return Bias32(bias8(j, q0), bias8(j + 16u, q0), bias8(j + 32u, q0), bias8(j + 48u, q0));
}

fn epi8_store(a: Acc8, i: u32, j: u32, c0: u32, sg: u32, lane: u32, b: Bias32) {
    epi_store(a.c00, i, j, c0, sg, lane, b.b0);
    epi_store(a.c01, i, j + 16u, c0, sg, lane, b.b1);
    epi_store(a.c02, i, j + 32u, c0, sg, lane, b.b2);
    epi_store(a.c03, i, j + 48u, c0, sg, lane, b.b3);
    epi_store(a.c10, i + 16u, j, c0, sg, lane, b.b0);
    epi_store(a.c11, i + 16u, j + 16u, c0, sg, lane, b.b1);
    epi_store(a.c12, i + 16u, j + 32u, c0, sg, lane, b.b2);
    epi_store(a.c13, i + 16u, j + 48u, c0, sg, lane, b.b3);
}

fn epi8_store_pre(a: Acc8, i: u32, j: u32, c0: u32, sg: u32, lane: u32, b: Bias32) {
    epi_store_pre(a.c00, i, j, c0, sg, lane, b.b0);
    epi_store_pre(a.c01, i, j + 16u, c0, sg, lane, b.b1);
    epi_store_pre(a.c02, i, j + 32u, c0, sg, lane, b.b2);
    epi_store_pre(a.c03, i, j + 48u, c0, sg, lane, b.b3);
    epi_store_pre(a.c10, i + 16u, j, c0, sg, lane, b.b0);
    epi_store_pre(a.c11, i + 16u, j + 16u, c0, sg, lane, b.b1);
    epi_store_pre(a.c12, i + 16u, j + 32u, c0, sg, lane, b.b2);
    epi_store_pre(a.c13, i + 16u, j + 48u, c0, sg, lane, b.b3);
}

// Each entry computes its tile index itself (`group_index` written out: the early return
// after it must stay uniform for the cooperative operations that follow). The branches on
// SB are on a pipeline constant, uniform.

@compute @workgroup_size(WG)
fn gemm_tc(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
           @builtin(subgroup_invocation_id) lane: u32) {
    let tile = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if (!tile_launched(tile)) {
        return;
    }
    let at = tile_at(tile, sg);
    let acc = tile_product(at, lid);
    let i0 = at.m0 + at.wr;
    let j0 = at.n0 + at.wc;
    let c0 = at.c0;
    if (at.m0 + BM > params.m || at.n0 + BN > params.n) {
        acc8_store_edge(acc.t, i0, j0, c0, sg, lane);
        if (SB == 64u) {
            acc8_store_edge(acc.u, i0 + 32u, j0, c0, sg, lane);
        }
        return;
    }
    acc8_store(acc.t, i0, j0, c0);
    if (SB == 64u) {
        acc8_store(acc.u, i0 + 32u, j0, c0);
    }
}

// F32 out with a bias and no activation or pre-activation: the bias added to whole fragments
// (loaded from 16 staged rows of biases), the same values as `gemm_tc_epilogue`'s at the
// plain entry's stores.
@compute @workgroup_size(WG)
fn gemm_tc_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
                @builtin(subgroup_invocation_id) lane: u32) {
    let tile = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if (!tile_launched(tile)) {
        return;
    }
    let at = tile_at(tile, sg);
    let acc = tile_product(at, lid);
    let i0 = at.m0 + at.wr;
    let j0 = at.n0 + at.wc;
    let c0 = at.c0;
    stage_bias_rows(at.n0, lid);
    let b = Bias4(bias_frag(at.wc), bias_frag(at.wc + 16u), bias_frag(at.wc + 32u),
                  bias_frag(at.wc + 48u));
    if (at.m0 + BM > params.m || at.n0 + BN > params.n) {
        // The staged fragments go where the biases were.
        workgroupBarrier();
        bias8_store_edge(acc.t, b, i0, j0, c0, sg, lane);
        if (SB == 64u) {
            bias8_store_edge(acc.u, b, i0 + 32u, j0, c0, sg, lane);
        }
        return;
    }
    bias8_store(acc.t, b, i0, j0, c0);
    if (SB == 64u) {
        bias8_store(acc.u, b, i0 + 32u, j0, c0);
    }
}

@compute @workgroup_size(WG)
fn gemm_tc_epilogue(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
                    @builtin(subgroup_invocation_id) lane: u32) {
    let tile = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if (!tile_launched(tile)) {
        return;
    }
    let at = tile_at(tile, sg);
    let acc = tile_product(at, lid);
    let i0 = at.m0 + at.wr;
    let j0 = at.n0 + at.wc;
    // Every bias this invocation adds, loaded before the first store (see `bias8`).
    let b = bias32(j0, lane);
    epi8_store(acc.t, i0, j0, at.c0, sg, lane, b);
    if (SB == 64u) {
        epi8_store(acc.u, i0 + 32u, j0, at.c0, sg, lane, b);
    }
}

@compute @workgroup_size(WG)
fn gemm_tc_epilogue_pre(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
                        @builtin(subgroup_invocation_id) lane: u32) {
    let tile = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if (!tile_launched(tile)) {
        return;
    }
    let at = tile_at(tile, sg);
    let acc = tile_product(at, lid);
    let i0 = at.m0 + at.wr;
    let j0 = at.n0 + at.wc;
    // Every bias this invocation adds, loaded before the first store (see `bias8`).
    let b = bias32(j0, lane);
    epi8_store_pre(acc.t, i0, j0, at.c0, sg, lane, b);
    if (SB == 64u) {
        epi8_store_pre(acc.u, i0 + 32u, j0, at.c0, sg, lane, b);
    }
}
