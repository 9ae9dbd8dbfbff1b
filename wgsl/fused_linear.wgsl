// Fused linear losses: the elementwise and per-row steps between the products (matmul family)
// and the loss kernels (loss family), which do all the rest.
//
// combine: out[i] = (a·x[i] + b·y[i])·s, with y optional (F_Y) and s either 1, a scalar that
// lives on the GPU (F_SCALE: s = scale[0], e.g. a loss cotangent, so the host never reads it
// back) or one value per row (F_ROW_SCALE: s = scale[row0 + i / cols], a per-row cotangent of
// a block of rows). x and y are F32, F16 or BF16 storage (XT, YT), out is F32. Used for the
// division of bias and logits by a temperature, the weighted sum of the hard and soft logit
// gradients, the running bias-gradient sum across chunks (in chunk order) and the cotangent
// scaling of gradients.
//
// scale_words: the cotangent scaling of a 16-bit gradient (XT) kept in its dtype, one word
// (two elements) an invocation: out_words[i] = narrow(x[2i]·scale[0], x[2i+1]·scale[0]), each
// product rounded once to nearest-even (the word past an odd end gets 0 in its high half).
//
// entropy_rows: the entropy H = −Σ_c p_c log p_c of softmax(z) for each row of a block of F32
// logits, z the (softcapped) logits, p recomputed from the row maximum and log denominator the
// cross-entropy forward stored in the per-row matrix (columns 5 and 6); rows that the
// cross-entropy does not count (column 3 = 0) get 0. One workgroup per row, fixed-order tree.
//
// entropy_grad: adds the entropy's contribution g_r·dH/dz_c = −g_r·p_c·(log p_c + H_r) (times
// the softcap's derivative) to a block's logit gradient, in place, g the per-row entropy
// cotangent.
//
// take_column: out[r] = stats[r·cols + row0] (one column of a per-row matrix).
//
// cosine_rows / cosine_grad: the cosine soft term of distillation, β·(1 − s·t/(|s|·|t|)) of
// each row of a block of student (x) and teacher (y) F32 logits, one workgroup per row, the
// three row sums (s·t, |s|², |t|²) in fixed-order trees (the same bits in both kernels);
// rows_ writes it into column 0 of the batch's [rows, 2] soft matrix where column 1 (the
// counting pass's flag) is set; grad_ writes −cot·scale·β·(t/(|s||t|) − cos·s/|s|²).

override XT: u32 = 0u;
override YT: u32 = 0u;
const WG: u32 = 256u;

const F_Y: u32 = 1u;
const F_SCALE: u32 = 2u;
const F_ROW_SCALE: u32 = 4u;

// Columns of the cross-entropy's per-row matrix (see wgsl/loss.wgsl).
const CE_COLS: u32 = 8u;
const CE_VALID: u32 = 3u;
const CE_MAX: u32 = 5u;
const CE_LOGDEN: u32 = 6u;

struct Params {
    n: u32,     // elements (combine, entropy_grad) or rows (entropy_rows, take_column)
    flags: u32,
    a: f32,
    b: f32,
    cols: u32,  // row width (vocabulary, or the per-row matrix's width for take_column)
    row0: u32,  // first row of the block in the whole batch (take_column: the column)
    cap: f32,   // softcap, 0 = off
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> y: array<u32>;
@group(0) @binding(3) var<storage, read> scale: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read> entropy: array<f32>;
@group(0) @binding(7) var<storage, read_write> out_words: array<u32>;

fn ld_x(i: u32) -> f32 {
    if (XT == DT_F32) {
        return bitcast<f32>(x[i]);
    }
    return half_from_word(x[i >> 1u], i, XT);
}

fn ld_y(i: u32) -> f32 {
    if (YT == DT_F32) {
        return bitcast<f32>(y[i]);
    }
    return half_from_word(y[i >> 1u], i, YT);
}

@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.n) {
        return;
    }
    var v = params.a * ld_x(i);
    if ((params.flags & F_Y) != 0u) {
        v = v + params.b * ld_y(i);
    }
    if ((params.flags & F_SCALE) != 0u) {
        v = v * scale[0];
    }
    if ((params.flags & F_ROW_SCALE) != 0u) {
        v = v * scale[params.row0 + i / params.cols];
    }
    out[i] = v;
}

@compute @workgroup_size(WG)
fn scale_words(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (2u * i >= params.n) {
        return;
    }
    let s = scale[0];
    let lo = half_from_word(x[i], 0u, XT) * s;
    var hi = 0.0;
    if (2u * i + 1u < params.n) {
        hi = half_from_word(x[i], 1u, XT) * s;
    }
    out_words[i] = pack_halves(lo, hi, XT);
}

fn capped(v: f32) -> f32 {
    if (params.cap > 0.0) {
        return params.cap * tanh_accurate(v / params.cap);
    }
    return v;
}

// out[row0 + r] = H of block row r (x: the block's F32 logits, stats: the whole batch's
// per-row matrix).
@compute @workgroup_size(WG)
fn entropy_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.n) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let o = (params.row0 + row) * CE_COLS;
    let m = stats[o + CE_MAX];
    let logden = stats[o + CE_LOGDEN];
    var acc = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        let log_p = (capped(bitcast<f32>(x[base + c])) - m) - logden;
        acc = acc - exp(log_p) * log_p;
    }
    let h = workgroup_sum(acc, lid);
    if (lid == 0u) {
        var v = 0.0;
        if (stats[o + CE_VALID] != 0.0) {
            v = h;
        }
        out[params.row0 + row] = v;
    }
}

// out[i] += −g_r·p_c·(log p_c + H_r)·cap′ for element i = r·cols + c of the block (x: its F32
// logits; scale: the whole batch's entropy cotangent; entropy: the whole batch's H).
@compute @workgroup_size(WG)
fn entropy_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.n) {
        return;
    }
    let r = params.row0 + i / params.cols;
    let o = r * CE_COLS;
    if (stats[o + CE_VALID] == 0.0) {
        return;
    }
    let z = capped(bitcast<f32>(x[i]));
    let log_p = (z - stats[o + CE_MAX]) - stats[o + CE_LOGDEN];
    var d = -scale[r] * exp(log_p) * (log_p + entropy[r]);
    if (params.cap > 0.0) {
        let th = z / params.cap;
        d = d * (1.0 - th * th);
    }
    out[i] = out[i] + d;
}

@compute @workgroup_size(WG)
fn take_column(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg) * WG + lid;
    if (r >= params.n) {
        return;
    }
    out[r] = stats[r * params.cols + params.row0];
}

// (s·t, |s|², |t|²) of block row `row`.
fn cosine_sums(row: u32, lid: u32) -> vec3<f32> {
    let base = row * params.cols;
    var st = 0.0;
    var ss = 0.0;
    var tt = 0.0;
    for (var c = lid; c < params.cols; c = c + WG) {
        let a = bitcast<f32>(x[base + c]);
        let b = bitcast<f32>(y[base + c]);
        st = st + a * b;
        ss = ss + a * a;
        tt = tt + b * b;
    }
    return vec3<f32>(workgroup_sum(st, lid), workgroup_sum(ss, lid), workgroup_sum(tt, lid));
}

@compute @workgroup_size(WG)
fn cosine_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.n) {
        return;
    }
    let sums = cosine_sums(row, lid);
    if (lid == 0u) {
        let o = 2u * (params.row0 + row);
        var v = 0.0;
        if (out[o + 1u] != 0.0) {
            v = params.a * (1.0 - sums.x / (sqrt(sums.y) * sqrt(sums.z)));
        }
        out[o] = v;
    }
}

@compute @workgroup_size(WG)
fn cosine_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.n) {
        return;
    }
    let sums = cosine_sums(row, lid);
    let ns = sqrt(sums.y);
    let nt = sqrt(sums.z);
    let cos = sums.x / (ns * nt);
    var g = 0.0;
    if (stats[2u * (params.row0 + row) + 1u] != 0.0) {
        g = -scale[0] * entropy[1] * params.a;
    }
    let base = row * params.cols;
    for (var c = lid; c < params.cols; c = c + WG) {
        var v = 0.0;
        if (g != 0.0) {
            let a = bitcast<f32>(x[base + c]);
            let b = bitcast<f32>(y[base + c]);
            v = g * (b / (ns * nt) - cos * a / (ns * ns));
        }
        out[base + c] = v;
    }
}
