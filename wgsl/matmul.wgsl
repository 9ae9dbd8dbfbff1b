// Dense matrix product with an epilogue, one launch per call of `matmul::gemm`:
//
//   for each batch index b, row i < m, column j < n:
//     v = alpha · Σ_{l < k} A_b(i, l) · B_b(l, j)  (+ bias[j])
//     out[off_c + b·stride_c + i·n + j]  = act(v)   (pre-activation v stored when asked)
//                                        += v       (ACCUMULATE; no activation then)
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
// padded by 4 to spread the banks; 12.75 KiB), is multiplied. Every product term is one
// `fma` in increasing l, so each output's summation order depends on k only: reruns are
// bit-identical and no two invocations write one output word. Edge tiles (ragged m, n, k)
// read zeros past the ends and write nothing outside the product.

override DT_A: u32 = 0u;         // dtype codes of A, B, bias
override DT_B: u32 = 0u;
override DT_BIAS: u32 = 0u;
override TRANS_A: u32 = 0u;      // 1: A stored [k, m]
override TRANS_B: u32 = 0u;      // 1: B stored [n, k]
override HAS_BIAS: u32 = 0u;     // 1: add bias[j]
override ACCUMULATE: u32 = 0u;   // 1: out += v (F32)
override ACT: u32 = 0u;          // 0: none; else Activation::code() + 1

const WG: u32 = 256u;
const BM: u32 = 128u;
const BN: u32 = 64u;
const BK: u32 = 16u;
const TM: u32 = 8u;              // micro-tile rows
const TN: u32 = 4u;              // micro-tile columns (one vec4)
const A_LOADS: u32 = 8u;         // BM·BK / WG
const B_LOADS: u32 = 4u;         // BK·BN / WG
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
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> pre: array<u32>;

var<workgroup> a_tile: array<vec4<f32>, 528>;   // BK · AS_ROW
var<workgroup> b_tile: array<vec4<f32>, 272>;   // BK · BS_ROW

var<private> acc: array<vec4<f32>, 8>;          // TM rows × TN columns
var<private> a_next: array<f32, 8>;             // A_LOADS
var<private> b_next: array<f32, 4>;             // B_LOADS

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
    if (DT_BIAS == DT_F32) {
        return bitcast<f32>(bias[i]);
    }
    return half_from_word(bias[i >> 1u], i, DT_BIAS);
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

// Registers ← the A and B elements of the K step starting at k0 (zero past the edges).
fn fetch(lid: u32, row0: u32, col0: u32, k0: u32, base_a: u32, base_b: u32) {
    for (var r = 0u; r < A_LOADS; r = r + 1u) {
        let s = a_slot(lid, r);
        let row = row0 + s.x;
        let l = k0 + s.y;
        var v = 0.0;
        if (row < params.m && l < params.k) {
            if (TRANS_A == 1u) {
                v = load_a(base_a + l * params.m + row);
            } else {
                v = load_a(base_a + row * params.k + l);
            }
        }
        a_next[r] = v;
    }
    for (var r = 0u; r < B_LOADS; r = r + 1u) {
        let s = b_slot(lid, r);
        let col = col0 + s.x;
        let l = k0 + s.y;
        var v = 0.0;
        if (col < params.n && l < params.k) {
            if (TRANS_B == 1u) {
                v = load_b(base_b + col * params.k + l);
            } else {
                v = load_b(base_b + l * params.n + col);
            }
        }
        b_next[r] = v;
    }
}

// Workgroup memory ← the fetched registers (k-major: a_tile[l][row], b_tile[l][col]).
fn stage(lid: u32) {
    for (var r = 0u; r < A_LOADS; r = r + 1u) {
        let s = a_slot(lid, r);
        a_tile[s.y * AS_ROW + s.x / 4u][s.x % 4u] = a_next[r];
    }
    for (var r = 0u; r < B_LOADS; r = r + 1u) {
        let s = b_slot(lid, r);
        b_tile[s.y * BS_ROW + s.x / 4u][s.x % 4u] = b_next[r];
    }
}

// The tile of workgroup `g` (batch, row0, col0); false past the last tile.
fn tile_of(g: u32) -> vec4<u32> {
    let per_batch = params.tiles_m * params.tiles_n;
    let bi = g / per_batch;
    let t = g - bi * per_batch;
    let tm = t / params.tiles_n;
    let tn = t - tm * params.tiles_n;
    return vec4(bi, tm * BM, tn * BN, u32(bi < params.batch));
}

// acc ← Σ_l A(row, l)·B(l, col) over this invocation's micro-tile. Called in uniform control
// flow (every invocation of the workgroup, same trip count).
fn product(lid: u32, bi: u32, row0: u32, col0: u32) {
    let tx = lid % 16u;
    let ty = lid / 16u;
    let base_a = params.off_a + bi * params.stride_a;
    let base_b = params.off_b + bi * params.stride_b;
    for (var i = 0u; i < TM; i = i + 1u) {
        acc[i] = vec4(0.0);
    }
    let steps = (params.k + BK - 1u) / BK;
    if (steps > 0u) {
        fetch(lid, row0, col0, 0u, base_a, base_b);
    }
    for (var t = 0u; t < steps; t = t + 1u) {
        workgroupBarrier();
        stage(lid);
        workgroupBarrier();
        if (t + 1u < steps) {
            fetch(lid, row0, col0, (t + 1u) * BK, base_a, base_b);
        }
        for (var l = 0u; l < BK; l = l + 1u) {
            let a_lo = a_tile[l * AS_ROW + ty * 2u];
            let a_hi = a_tile[l * AS_ROW + ty * 2u + 1u];
            let bv = b_tile[l * BS_ROW + tx];
            acc[0] = fma(vec4(a_lo.x), bv, acc[0]);
            acc[1] = fma(vec4(a_lo.y), bv, acc[1]);
            acc[2] = fma(vec4(a_lo.z), bv, acc[2]);
            acc[3] = fma(vec4(a_lo.w), bv, acc[3]);
            acc[4] = fma(vec4(a_hi.x), bv, acc[4]);
            acc[5] = fma(vec4(a_hi.y), bv, acc[5]);
            acc[6] = fma(vec4(a_hi.z), bv, acc[6]);
            acc[7] = fma(vec4(a_hi.w), bv, acc[7]);
        }
    }
}

// The bias of this invocation's micro-tile columns (4·tx.. of the tile at col0).
fn micro_bias(lid: u32, col0: u32) -> vec4<f32> {
    var bias_v = vec4(0.0);
    if (HAS_BIAS == 1u) {
        for (var c = 0u; c < TN; c = c + 1u) {
            let col = col0 + (lid % 16u) * TN + c;
            if (col < params.n) {
                bias_v[c] = load_bias(col);
            }
        }
    }
    return bias_v;
}

// out ← act(v), or out += v.
fn store_out(idx: u32, v: f32) {
    if (ACCUMULATE == 1u) {
        out[idx] = bitcast<u32>(bitcast<f32>(out[idx]) + v);
    } else if (ACT != 0u) {
        out[idx] = bitcast<u32>(activation_eval(ACT - 1u, v).x);
    } else {
        out[idx] = bitcast<u32>(v);
    }
}

// Element index of micro-tile element (r, c) in out, or 0xffffffff outside the product.
fn out_index(lid: u32, bi: u32, row0: u32, col0: u32, r: u32, c: u32) -> u32 {
    let row = row0 + (lid / 16u) * TM + r;
    let col = col0 + (lid % 16u) * TN + c;
    if (row >= params.m || col >= params.n) {
        return 0xffffffffu;
    }
    return params.off_c + bi * params.stride_c + row * params.n + col;
}

@compute @workgroup_size(WG)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(group_index(wid, nwg));
    if (tile.w == 0u) {
        return;
    }
    product(lid, tile.x, tile.y, tile.z);
    let bias_v = micro_bias(lid, tile.z);
    for (var r = 0u; r < TM; r = r + 1u) {
        let v = params.alpha * acc[r] + bias_v;
        for (var c = 0u; c < TN; c = c + 1u) {
            let idx = out_index(lid, tile.x, tile.y, tile.z, r, c);
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
    product(lid, tile.x, tile.y, tile.z);
    let bias_v = micro_bias(lid, tile.z);
    for (var r = 0u; r < TM; r = r + 1u) {
        let v = params.alpha * acc[r] + bias_v;
        for (var c = 0u; c < TN; c = c + 1u) {
            let idx = out_index(lid, tile.x, tile.y, tile.z, r, c);
            if (idx != 0xffffffffu) {
                pre[idx] = bitcast<u32>(v[c]);
                store_out(idx, v[c]);
            }
        }
    }
}
