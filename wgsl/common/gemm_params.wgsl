// The uniform parameters of a dense product's launch (and, below, the epilogue's helpers),
// shared by `wgsl/matmul.wgsl` and the tensor-core module `wgsl/matmul_tc.wgsl` (which reads
// the fields up to `act` and leaves split-K's at their neutral values).
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
    k_slice: u32,    // split-K: elements of k per slice (a multiple of BK; k when unsplit)
    slices: u32,     // split-K: number of slices (1 when unsplit)
}

// Tile g of a launch whose tiles go in bands of `group` tile rows: (batch, tile row, tile
// column). Within a batch: down a band's column, then on to its next column (the last band may
// be shorter), so that workgroups running together share B's tiles; group 1: row after row.
// Both product modules launch in this order (each with its own GROUP_M); g past the last tile
// gives a batch past `params.batch`.
fn banded_tile(g: u32, group: u32) -> vec3<u32> {
    let per_batch = params.tiles_m * params.tiles_n;
    let bi = g / per_batch;
    let t = g - bi * per_batch;
    let per_band = group * params.tiles_n;
    let band = t / per_band;
    let first = band * group;
    let rows = max(min(group, params.tiles_m - min(first, params.tiles_m)), 1u);
    let r = t - band * per_band;
    let tn = r / rows;
    return vec3(bi, first + (r - tn * rows), tn);
}

// The epilogue's helpers, shared by both product modules (each declares `params` and its
// `bias` binding, a u32 view of the bias in its dtype `params.dt_bias`).

// bias[i] in FP32.
fn load_bias(i: u32) -> f32 {
    if (params.dt_bias == DT_F32) {
        return bitcast<f32>(bias[i]);
    }
    return half_from_word(bias[i >> 1u], i, params.dt_bias);
}

// The bias of column col in FP32 (0 past n or without a bias).
fn bias_at(col: u32) -> f32 {
    if (params.has_bias == 1u && col < params.n) {
        return load_bias(col);
    }
    return 0.0;
}

// The bias of the four columns from col (0 past n or without a bias).
fn bias4(col: u32) -> vec4<f32> {
    return vec4(bias_at(col), bias_at(col + 1u), bias_at(col + 2u), bias_at(col + 3u));
}

// act(v), or v without an activation.
fn epilogue(v: f32) -> f32 {
    if (params.act != 0u) {
        return activation_eval(params.act - 1u, v).x;
    }
    return v;
}
