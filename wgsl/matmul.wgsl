// Dense matrix product with an epilogue, one launch per call of `matmul::gemm`:
//
//   for each batch index b, row i < m, column j < n:
//     v = alpha · Σ_{l < k} A_b(i, l) · B_b(l, j)  (+ bias[j])
//     out[off_c + b·stride_c + i·n + j]  = act(v)   (pre-activation v stored when asked)
//                                        += v       (accumulate; no activation then)
//
// A_b(i, l) is read at off_a + b·stride_a + i·k + l ([m, k] rows), or + l·m + i when TRANS_A
// ([k, m] rows); B_b(l, j) at off_b + b·stride_b + l·n + j ([k, n]), or + j·k + l when TRANS_B
// ([n, k]). Operands are F32, F16 or BF16 (16-bit: two halves per u32 word, any element
// offset), widened to f32 as they are staged; accumulation and the output are F32.
//
// Tiling: one workgroup of 256 invocations computes a BM×BN = 128×64 output tile; invocation
// (tx, ty) = (lid % 16, lid / 16) owns the 8×4 micro-tile of rows 8·ty.., columns 4·tx...
// K advances in steps of BK = 16: the next step's A (128×16) and B (16×64) tiles are loaded
// into registers while the current step, staged in workgroup memory as f32 (k-major, rows
// padded by 4 to spread the banks; 12.5 KiB), is multiplied. Every product term is one
// `fma` in increasing l, so each output's summation order depends on k only: reruns are
// bit-identical and no two invocations write one output word. Edge tiles (ragged m, n, k)
// read zeros past the ends and write nothing outside the product.

// The operands' dtypes and layouts specialize the main loop; the epilogue's options are
// uniform parameters (one pipeline serves every bias dtype, activation and accumulation).
override DT_A: u32 = 0u;         // dtype codes of A and B
override DT_B: u32 = 0u;
override TRANS_A: u32 = 0u;      // 1: A stored [k, m]
override TRANS_B: u32 = 0u;      // 1: B stored [n, k]

const WG: u32 = 256u;
const BM: u32 = 128u;
const BN: u32 = 64u;
const BK: u32 = 16u;
const TM: u32 = 8u;              // micro-tile rows
const TN: u32 = 4u;              // micro-tile columns (one vec4)
const AS_ROW: u32 = 33u;         // vec4s per staged k-row of A: (BM + 4) / 4
const BS_ROW: u32 = 17u;         // vec4s per staged k-row of B: (BN + 4) / 4

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
    has_bias: u32,   // 1: add bias[j]
    dt_bias: u32,    // the bias's dtype code
    accumulate: u32, // 1: out += v (F32)
    act: u32,        // 0: none; else Activation::code() + 1
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> pre: array<u32>;

var<workgroup> a_tile: array<vec4<f32>, 528>;   // BK · AS_ROW
var<workgroup> b_tile: array<vec4<f32>, 272>;   // BK · BS_ROW

// Registers hold no indexed arrays (an indexed private array may be placed in slow local
// memory): the accumulators are eight vec4s, the prefetched elements three vec4s, and every
// per-element helper is called with constant element numbers.

// Accumulators of one micro-tile: row i of the 8 is `ri`, its 4 columns one vec4.
struct Acc {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
    r4: vec4<f32>,
    r5: vec4<f32>,
    r6: vec4<f32>,
    r7: vec4<f32>,
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

fn load_bias(i: u32) -> f32 {
    if (params.dt_bias == DT_F32) {
        return bitcast<f32>(bias[i]);
    }
    return half_from_word(bias[i >> 1u], i, params.dt_bias);
}

// (row within the tile, k within the step) of this invocation's r-th A element; consecutive
// invocations follow the stored layout's contiguous axis.
fn a_slot(lid: u32, r: u32) -> vec2<u32> {
    if (TRANS_A == 1u) {
        return vec2(lid % BM, lid / BM + r * (WG / BM));
    }
    return vec2(lid / BK + r * (WG / BK), lid % BK);
}

// (column within the tile, k within the step) of this invocation's r-th B element.
fn b_slot(lid: u32, r: u32) -> vec2<u32> {
    if (TRANS_B == 1u) {
        return vec2(lid / BK + r * (WG / BK), lid % BK);
    }
    return vec2(lid % BN, lid / BN + r * (WG / BN));
}

// The r-th A element of the K step at k0 (zero past the edges).
fn fetch_a(lid: u32, r: u32, row0: u32, k0: u32, base: u32) -> f32 {
    let s = a_slot(lid, r);
    let row = row0 + s.x;
    let l = k0 + s.y;
    if (row >= params.m || l >= params.k) {
        return 0.0;
    }
    if (TRANS_A == 1u) {
        return load_a(base + l * params.m + row);
    }
    return load_a(base + row * params.k + l);
}

// The r-th B element of the K step at k0 (zero past the edges).
fn fetch_b(lid: u32, r: u32, col0: u32, k0: u32, base: u32) -> f32 {
    let s = b_slot(lid, r);
    let col = col0 + s.x;
    let l = k0 + s.y;
    if (col >= params.n || l >= params.k) {
        return 0.0;
    }
    if (TRANS_B == 1u) {
        return load_b(base + col * params.k + l);
    }
    return load_b(base + l * params.n + col);
}

fn fetch_a4(lid: u32, r: u32, row0: u32, k0: u32, base: u32) -> vec4<f32> {
    return vec4(
        fetch_a(lid, r, row0, k0, base),
        fetch_a(lid, r + 1u, row0, k0, base),
        fetch_a(lid, r + 2u, row0, k0, base),
        fetch_a(lid, r + 3u, row0, k0, base),
    );
}

fn fetch_b4(lid: u32, col0: u32, k0: u32, base: u32) -> vec4<f32> {
    return vec4(
        fetch_b(lid, 0u, col0, k0, base),
        fetch_b(lid, 1u, col0, k0, base),
        fetch_b(lid, 2u, col0, k0, base),
        fetch_b(lid, 3u, col0, k0, base),
    );
}

// Workgroup memory ← fetched elements (k-major: a_tile[l][row], b_tile[l][col]).
fn stage_a(lid: u32, r: u32, v: f32) {
    let s = a_slot(lid, r);
    a_tile[s.y * AS_ROW + s.x / 4u][s.x % 4u] = v;
}

fn stage_b(lid: u32, r: u32, v: f32) {
    let s = b_slot(lid, r);
    b_tile[s.y * BS_ROW + s.x / 4u][s.x % 4u] = v;
}

fn stage(lid: u32, a_lo: vec4<f32>, a_hi: vec4<f32>, bv: vec4<f32>) {
    stage_a(lid, 0u, a_lo.x);
    stage_a(lid, 1u, a_lo.y);
    stage_a(lid, 2u, a_lo.z);
    stage_a(lid, 3u, a_lo.w);
    stage_a(lid, 4u, a_hi.x);
    stage_a(lid, 5u, a_hi.y);
    stage_a(lid, 6u, a_hi.z);
    stage_a(lid, 7u, a_hi.w);
    stage_b(lid, 0u, bv.x);
    stage_b(lid, 1u, bv.y);
    stage_b(lid, 2u, bv.z);
    stage_b(lid, 3u, bv.w);
}

// The tile of workgroup `g`: (batch, row0, col0, 1), or w = 0 past the last tile.
fn tile_of(g: u32) -> vec4<u32> {
    let per_batch = params.tiles_m * params.tiles_n;
    let bi = g / per_batch;
    let t = g - bi * per_batch;
    let tm = t / params.tiles_n;
    let tn = t - tm * params.tiles_n;
    return vec4(bi, tm * BM, tn * BN, u32(bi < params.batch));
}

// Σ_l A(row, l)·B(l, col) over this invocation's micro-tile. Called in uniform control flow
// (every invocation of the workgroup, the same trip count).
fn product(lid: u32, bi: u32, row0: u32, col0: u32) -> Acc {
    let tx = lid % 16u;
    let ty = lid / 16u;
    let base_a = params.off_a + bi * params.stride_a;
    let base_b = params.off_b + bi * params.stride_b;
    var c0 = vec4(0.0);
    var c1 = vec4(0.0);
    var c2 = vec4(0.0);
    var c3 = vec4(0.0);
    var c4 = vec4(0.0);
    var c5 = vec4(0.0);
    var c6 = vec4(0.0);
    var c7 = vec4(0.0);
    let steps = (params.k + BK - 1u) / BK;
    var next_lo = vec4(0.0);
    var next_hi = vec4(0.0);
    var next_b = vec4(0.0);
    if (steps > 0u) {
        next_lo = fetch_a4(lid, 0u, row0, 0u, base_a);
        next_hi = fetch_a4(lid, 4u, row0, 0u, base_a);
        next_b = fetch_b4(lid, col0, 0u, base_b);
    }
    for (var t = 0u; t < steps; t = t + 1u) {
        workgroupBarrier();
        stage(lid, next_lo, next_hi, next_b);
        workgroupBarrier();
        if (t + 1u < steps) {
            let k0 = (t + 1u) * BK;
            next_lo = fetch_a4(lid, 0u, row0, k0, base_a);
            next_hi = fetch_a4(lid, 4u, row0, k0, base_a);
            next_b = fetch_b4(lid, col0, k0, base_b);
        }
        for (var l = 0u; l < BK; l = l + 1u) {
            let a_lo = a_tile[l * AS_ROW + ty * 2u];
            let a_hi = a_tile[l * AS_ROW + ty * 2u + 1u];
            let bv = b_tile[l * BS_ROW + tx];
            c0 = fma(vec4(a_lo.x), bv, c0);
            c1 = fma(vec4(a_lo.y), bv, c1);
            c2 = fma(vec4(a_lo.z), bv, c2);
            c3 = fma(vec4(a_lo.w), bv, c3);
            c4 = fma(vec4(a_hi.x), bv, c4);
            c5 = fma(vec4(a_hi.y), bv, c5);
            c6 = fma(vec4(a_hi.z), bv, c6);
            c7 = fma(vec4(a_hi.w), bv, c7);
        }
    }
    return Acc(c0, c1, c2, c3, c4, c5, c6, c7);
}

fn bias_at(col: u32) -> f32 {
    if (params.has_bias == 1u && col < params.n) {
        return load_bias(col);
    }
    return 0.0;
}

// The bias of this invocation's micro-tile columns (4·tx.. of the tile at col0).
fn micro_bias(lid: u32, col0: u32) -> vec4<f32> {
    let col = col0 + (lid % 16u) * TN;
    return vec4(bias_at(col), bias_at(col + 1u), bias_at(col + 2u), bias_at(col + 3u));
}

// out ← act(v), or out += v.
fn store_out(idx: u32, v: f32) {
    if (params.accumulate == 1u) {
        out[idx] = bitcast<u32>(bitcast<f32>(out[idx]) + v);
    } else if (params.act != 0u) {
        out[idx] = bitcast<u32>(activation_eval(params.act - 1u, v).x);
    } else {
        out[idx] = bitcast<u32>(v);
    }
}

// Element index of micro-tile element (r, c) in out, or 0xffffffff outside the product.
fn out_index(lid: u32, tile: vec4<u32>, r: u32, c: u32) -> u32 {
    let row = tile.y + (lid / 16u) * TM + r;
    let col = tile.z + (lid % 16u) * TN + c;
    if (row >= params.m || col >= params.n) {
        return 0xffffffffu;
    }
    return params.off_c + tile.x * params.stride_c + row * params.n + col;
}

// Row r of the accumulators (a switch, not an indexed array: the values stay in registers).
fn acc_row(c: Acc, r: u32) -> vec4<f32> {
    switch r {
        case 0u: { return c.r0; }
        case 1u: { return c.r1; }
        case 2u: { return c.r2; }
        case 3u: { return c.r3; }
        case 4u: { return c.r4; }
        case 5u: { return c.r5; }
        case 6u: { return c.r6; }
        default: { return c.r7; }
    }
}

// The epilogue loops stay loops (the activation's code is emitted once, not per element).
@compute @workgroup_size(WG)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(group_index(wid, nwg));
    if (tile.w == 0u) {
        return;
    }
    let acc = product(lid, tile.x, tile.y, tile.z);
    let bias_v = micro_bias(lid, tile.z);
    for (var r = 0u; r < TM; r = r + 1u) {
        let v = params.alpha * acc_row(acc, r) + bias_v;
        for (var c = 0u; c < TN; c = c + 1u) {
            let idx = out_index(lid, tile, r, c);
            if (idx != 0xffffffffu) {
                store_out(idx, v[c]);
            }
        }
    }
}

// As `gemm`, also storing the FP32 pre-activation (same indexing as out) in `pre`.
@compute @workgroup_size(WG)
fn gemm_pre(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(group_index(wid, nwg));
    if (tile.w == 0u) {
        return;
    }
    let acc = product(lid, tile.x, tile.y, tile.z);
    let bias_v = micro_bias(lid, tile.z);
    for (var r = 0u; r < TM; r = r + 1u) {
        let v = params.alpha * acc_row(acc, r) + bias_v;
        for (var c = 0u; c < TN; c = c + 1u) {
            let idx = out_index(lid, tile, r, c);
            if (idx != 0xffffffffu) {
                pre[idx] = bitcast<u32>(v[c]);
                store_out(idx, v[c]);
            }
        }
    }
}
