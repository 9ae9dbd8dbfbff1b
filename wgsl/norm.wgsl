// Normalization family: RMSNorm, LayerNorm, fused add+RMSNorm, modulated (AdaLN) RMSNorm,
// GroupNorm (LayerNorm over (sample, group) rows), PolyNorm and DyT. Every floating buffer
// is bound as u32 words; dtype codes are override constants.
//
// Row operators (KIND 0..4) share three passes:
// * forward_rows: one workgroup per row. The row is read in chunks (lane t takes columns
//   t, t + WG, ...): mean (LayerNorm, summed as differences from the row's first value), then the sum of squared (centered) values, then the
//   outputs. Statistics are FP32 and saved per row (inverse RMS / inverse std, mean).
// * backward_rows: one workgroup per row; the row constants of the input gradient
//   c1 = mean(dn) (LayerNorm) and c2 = mean(dn * n), where n is the normalized value and dn
//   the cotangent of n, saved with the statistics as rowinfo[row] = (inv, mean, corr, c1, c2)
//   (ROWINFO words a row).
// * backward_columns: one invocation per (row block, column). It walks the block's rows in
//   order, writes dx = inv * (dn - c1 - n * c2) (+ the residual-sum cotangent), and writes
//   the block's parameter partials (slot 0: weight, 1: bias or shift, 2: scale).
// * the partials are finished by the shared `column_finish` (`reduce::sum_partial_groups`):
//   runs of consecutive blocks summed in block order (one run for parameter gradients, one
//   per batch for scale/shift gradients).
//
// RMSNorm, LayerNorm and add+RMSNorm rows of whole 4/8-value chunks take the register paths
// instead (see "Register paths" below): `*_forward_registers`, `*_backward_registers`,
// `rms_backward_words` and `partials_finish`; their backwards of rows too wide for the
// registers take the chunk passes (`backward_rows_chunks`, `backward_column_units`; modulated
// RMSNorm's, `mod_backward_rows_chunks` and `mod_backward_column_units`, where the host forces
// them).
//
// The order of every addition depends only on the shape, so reruns give identical bits.

const KIND_RMS: u32 = 0u;
const KIND_LAYER: u32 = 1u;
const KIND_ADD: u32 = 2u;
const KIND_MOD: u32 = 3u;
const KIND_GROUP: u32 = 4u;

const CAST_LLAMA: u32 = 0u;
const CAST_GEMMA: u32 = 1u;
const CAST_NONE: u32 = 2u;

override KIND: u32 = 0u;
override DX: u32 = 0u;   // source
override DA: u32 = 0u;   // aux: residual (add), scale (modulated), mean (LayerNorm backward, F32), alpha (DyT)
override DB: u32 = 0u;   // aux2: bias (LayerNorm), shift (modulated), beta (DyT)
override DW: u32 = 0u;   // weight (gamma for DyT)
override DY: u32 = 0u;   // output cotangent
override DR: u32 = 0u;   // residual-sum cotangent
override HAS_W: bool = true;
override HAS_B: bool = false;
override HAS_DRES: bool = false;
override CAST: u32 = 0u;
override PAIRS: bool = false;  // outputs are 16-bit of an even width: lanes write word pairs
override OUT_SUM: bool = false;

// WG (the workgroup size, 256 or 1024) is defined by the kernel's first part (`src/norm.rs`).
// Rows of one block of backward_columns (the host's BLOCK_ROWS).
const BLOCK_ROWS: u32 = 32u;
// Words of one row's constants in rowinfo (the host's ROWINFO).
const ROWINFO: u32 = 8u;

struct Params {
    rows: u32,
    cols: u32,
    rows_per_batch: u32,   // rows of one modulation batch (= rows otherwise)
    blocks_per_batch: u32, // ceil(rows_per_batch / BLOCK_ROWS); finish: blocks per group
    total: u32,            // invocations needed (column passes)
    stride: u32,           // words of one partials slot (blocks * cols)
    base: u32,             // finish: first word of the slot summed (0 elsewhere; see `rewiden`)
    eps: f32,
    offset: f32,
    groups: u32,             // GroupNorm: groups per sample (rows = batch * groups)
    channels_per_group: u32, // GroupNorm
    spatial: u32,            // GroupNorm: elements per channel
    block_rows: u32,         // register backward: rows per workgroup
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> aux: array<u32>;
@group(0) @binding(3) var<storage, read> aux2: array<u32>;
@group(0) @binding(4) var<storage, read> weight: array<u32>;
@group(0) @binding(5) var<storage, read_write> inv_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> y_out: array<u32>;
@group(0) @binding(8) var<storage, read_write> sum_out: array<u32>;
@group(0) @binding(9) var<storage, read> inv_in: array<f32>;
@group(0) @binding(10) var<storage, read> dy: array<u32>;
@group(0) @binding(11) var<storage, read> dres: array<u32>;
@group(0) @binding(12) var<storage, read_write> rowinfo_out: array<f32>;
@group(0) @binding(13) var<storage, read> rowinfo: array<f32>;
@group(0) @binding(14) var<storage, read_write> dx: array<f32>;
@group(0) @binding(15) var<storage, read_write> partials: array<f32>;

fn ld_x(i: u32) -> f32 {
    if (DX == DT_F32) {
        return bitcast<f32>(x[i]);
    }
    return half_from_word(x[i >> 1u], i, DX);
}

fn ld_aux(i: u32) -> f32 {
    if (DA == DT_F32) {
        return bitcast<f32>(aux[i]);
    }
    return half_from_word(aux[i >> 1u], i, DA);
}

fn ld_aux2(i: u32) -> f32 {
    if (DB == DT_F32) {
        return bitcast<f32>(aux2[i]);
    }
    return half_from_word(aux2[i >> 1u], i, DB);
}

fn ld_w(i: u32) -> f32 {
    if (DW == DT_F32) {
        return bitcast<f32>(weight[i]);
    }
    return half_from_word(weight[i >> 1u], i, DW);
}

fn ld_dy(i: u32) -> f32 {
    if (DY == DT_F32) {
        return bitcast<f32>(dy[i]);
    }
    return half_from_word(dy[i >> 1u], i, DY);
}

fn ld_dres(i: u32) -> f32 {
    if (DR == DT_F32) {
        return bitcast<f32>(dres[i]);
    }
    return half_from_word(dres[i >> 1u], i, DR);
}

// v rounded to the source storage dtype (the identity for F32).
fn round_src(v: f32) -> f32 {
    if (DX == DT_F32) {
        return v;
    }
    if (DX == DT_BF16) {
        return bf16_to_f32(f32_to_bf16(v));
    }
    return f16_to_f32(f32_to_f16(v));
}

// The value normalized: x, or the FP32 sum x + residual (never rounded) for add+RMSNorm.
fn source(i: u32) -> f32 {
    if (KIND == KIND_ADD) {
        return ld_x(i) + ld_aux(i);
    }
    return ld_x(i);
}

// Whether rows are centered (LayerNorm, GroupNorm).
fn centered() -> bool {
    return KIND == KIND_LAYER || KIND == KIND_GROUP;
}

// Index of the per-column parameters of element i (column c): c, or for GroupNorm the
// channel of the element (row = (sample, group), column = (channel in group, position)).
fn param_index(i: u32, c: u32) -> u32 {
    if (KIND == KIND_GROUP) {
        let row = i / params.cols;
        return (row % params.groups) * params.channels_per_group + c / params.spatial;
    }
    return c;
}

// Whether the weight offset is nonzero: without it the factor is w itself, one addition a
// value less (the host sets it from the offset; a −0 weight then stays −0).
override HAS_OFFSET: bool = true;

// Weight factor of column c: offset + w[c], or 1 without a weight.
fn weight_factor(c: u32) -> f32 {
    if (HAS_W) {
        if (!HAS_OFFSET) {
            return ld_w(c);
        }
        return params.offset + ld_w(c);
    }
    return 1.0;
}

// Output of element i (column c, modulation batch `batch`) from its row's statistics.
fn out_value(i: u32, c: u32, batch: u32, mean: f32, corr: f32, inv: f32) -> f32 {
    let n = ((source(i) - mean) - corr) * inv;
    let p = param_index(i, c);
    let wf = weight_factor(p);
    if (centered()) {
        var b = 0.0;
        if (HAS_B) {
            b = ld_aux2(p);
        }
        return n * wf + b;
    }
    if (KIND == KIND_MOD) {
        let m = batch * params.cols + c;
        return (1.0 + ld_aux(m)) * (n * wf) + ld_aux2(m);
    }
    // RMSNorm and add+RMSNorm: the casting modes.
    if (CAST == CAST_LLAMA) {
        return round_src(n) * wf;
    }
    if (CAST == CAST_NONE) {
        return round_src(n) * round_src(wf);
    }
    return n * wf;
}

// Whether a centered row's statistics came from one pair sum (1) or need the second pass over
// the centered squares (0): written by lane 0, read with `workgroupUniformLoad` so that the
// branch is uniform.
var<workgroup> one_pass: u32;

// Whether a centered row's variance may be taken from Σ (x − p)/n = δ and Σ (x − p)²/n = S
// about a pivot p near the mean, as S − δ²: where that cancels at most two bits (δ² ≤ ¾ S:
// within about 7 FP32 units beside the sums' own error); else the caller sums the centered
// squares. A common offset of the row lies in p, so it costs nothing. Uniform (every lane
// holds the same sums; the flag makes that visible), so the second pass may reduce.
fn one_pass_ok(sums: vec2<f32>, lid: u32) -> bool {
    if (SEG != 0u) {
        // Every lane of the segment holds the same sums (and no barrier may run).
        return sums.x * sums.x <= 0.75 * sums.y;
    }
    if (lid == 0u) {
        one_pass = select(0u, 1u, sums.x * sums.x <= 0.75 * sums.y);
    }
    return workgroupUniformLoad(&one_pass) == 1u;
}

@compute @workgroup_size(WG)
fn forward_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    var mean = 0.0;
    var corr = 0.0;
    var variance = 0.0;
    var second_pass = true;
    if (centered()) {
        // Sum the differences (and their squares) from a pivot near the mean, the mean of the
        // row's first (up to) eight values, so a large common offset does not cost the mean
        // its precision; the mean is kept as the FP32 value `mean` plus the small correction
        // `corr` (mean + corr = pivot + delta to about FP32 precision of delta), and values
        // are centered as (v - mean) - corr.
        let first = source(base);
        let k = min(cols, 8u);
        var t = 0.0;
        for (var j = 1u; j < k; j = j + 1u) {
            t = t + (source(base + j) - first);
        }
        let pivot = first + t / f32(k);
        var acc = vec2<f32>();
        for (var c = lid; c < cols; c = c + WG) {
            let d = source(base + c) - pivot;
            acc = acc + vec2<f32>(d, d * d);
        }
        let sums = row_sum2(acc, lid) / f32(cols);
        let delta = sums.x;
        mean = pivot + delta;
        corr = (pivot - mean) + delta;
        variance = sums.y - delta * delta;
        second_pass = !one_pass_ok(sums, lid);
    }
    if (second_pass) {
        var squares = 0.0;
        for (var c = lid; c < cols; c = c + WG) {
            let v = (source(base + c) - mean) - corr;
            squares = squares + v * v;
        }
        variance = workgroup_sum(squares, lid) / f32(cols);
    }
    let inv = 1.0 / sqrt(variance + params.eps);
    if (lid == 0u) {
        inv_out[row] = inv;
        if (centered()) {
            mean_out[row] = mean;
            sum_out[row] = bitcast<u32>(corr);
        }
    }
    let batch = row / params.rows_per_batch;
    if (PAIRS) {
        // 16-bit outputs of an even width: every row starts on a word boundary.
        let words = cols / 2u;
        let wbase = base / 2u;
        for (var p = lid; p < words; p = p + WG) {
            let c = 2u * p;
            let a = out_value(base + c, c, batch, mean, corr, inv);
            let b = out_value(base + c + 1u, c + 1u, batch, mean, corr, inv);
            y_out[wbase + p] = pack_halves(a, b, DX);
            if (OUT_SUM) {
                sum_out[wbase + p] = pack_halves(source(base + c), source(base + c + 1u), DX);
            }
        }
    } else {
        // F32 outputs (the source dtype, or an F32 temporary the host narrows).
        for (var c = lid; c < cols; c = c + WG) {
            y_out[base + c] = bitcast<u32>(out_value(base + c, c, batch, mean, corr, inv));
            if (OUT_SUM) {
                sum_out[base + c] = bitcast<u32>(round_src(source(base + c)));
            }
        }
    }
}

// Cotangent of the normalized value n at element i (column c, batch `batch`).
fn dnorm(i: u32, c: u32, batch: u32) -> f32 {
    var g = weight_factor(param_index(i, c));
    if (KIND == KIND_MOD) {
        g = g * (1.0 + ld_aux(batch * params.cols + c));
    }
    return ld_dy(i) * g;
}

@compute @workgroup_size(WG)
fn backward_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let inv = inv_in[row];
    var mean = 0.0;
    var corr = 0.0;
    if (centered()) {
        mean = ld_aux(row);
        corr = bitcast<f32>(aux2[row]);
    }
    let batch = row / params.rows_per_batch;
    var sum_dn = 0.0;
    var sum_dnn = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        let i = base + c;
        let n = ((source(i) - mean) - corr) * inv;
        let d = dnorm(i, c, batch);
        sum_dn = sum_dn + d;
        sum_dnn = sum_dnn + d * n;
    }
    var c1 = 0.0;
    if (centered()) {
        c1 = workgroup_sum(sum_dn, lid) / f32(cols);
    }
    let c2 = workgroup_sum(sum_dnn, lid) / f32(cols);
    if (lid == 0u) {
        rowinfo_out[ROWINFO * row] = inv;
        rowinfo_out[ROWINFO * row + 1u] = mean;
        rowinfo_out[ROWINFO * row + 2u] = corr;
        rowinfo_out[ROWINFO * row + 3u] = c1;
        rowinfo_out[ROWINFO * row + 4u] = c2;
    }
}

// Rows [first, last) of block `block` of the column passes (blocks of BLOCK_ROWS rows within
// each modulation batch).
fn block_rows(block: u32) -> vec2<u32> {
    let batch = block / params.blocks_per_batch;
    let first = batch * params.rows_per_batch + (block % params.blocks_per_batch) * BLOCK_ROWS;
    return vec2<u32>(first, min(first + BLOCK_ROWS, (batch + 1u) * params.rows_per_batch));
}

@compute @workgroup_size(WG)
fn backward_columns(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let cols = params.cols;
    let block = t / cols;
    let c = t % cols;
    let batch = block / params.blocks_per_batch;
    let span = block_rows(block);
    let first = span.x;
    let last = span.y;
    let wf = weight_factor(c);
    var sc = 1.0;
    if (KIND == KIND_MOD) {
        sc = 1.0 + ld_aux(batch * cols + c);
    }
    var g = wf * sc;
    var pw = 0.0;
    var pb = 0.0;
    var ps = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let i = r * cols + c;
        let inv = rowinfo[ROWINFO * r];
        let mean = rowinfo[ROWINFO * r + 1u];
        let corr = rowinfo[ROWINFO * r + 2u];
        let c1 = rowinfo[ROWINFO * r + 3u];
        let c2 = rowinfo[ROWINFO * r + 4u];
        let n = ((source(i) - mean) - corr) * inv;
        let d = ld_dy(i);
        if (KIND == KIND_GROUP) {
            g = weight_factor(param_index(i, c));
        }
        if (KIND == KIND_MOD) {
            pw = pw + d * sc * n;
            ps = ps + d * n * wf;
        } else {
            pw = pw + d * n;
        }
        pb = pb + d;
        var v = inv * (d * g - c1 - n * c2);
        if (HAS_DRES) {
            v = v + ld_dres(i);
        }
        dx[i] = v;
    }
    if (KIND == KIND_GROUP) {
        return; // group_partials sums the parameter gradients per channel
    }
    if (HAS_W) {
        partials[t] = pw;
    }
    if (HAS_B || KIND == KIND_MOD) {
        partials[params.stride + t] = pb;
    }
    if (KIND == KIND_MOD) {
        partials[2u * params.stride + t] = ps;
    }
}

// ---- Column pass, two columns a lane ----
// `backward_columns` for even widths (every kind but GroupNorm): invocation t owns columns c
// and c + 1 (c = 2 · (t mod cols/2)) of block t / (cols/2), with the same operations in the
// same order per column (the same F32 values), reading each 16-bit word once for both, and
// writes dx a word at a time: two F32 words, or with DDX = F16/BF16 both values rounded once
// into one word (`pack_halves`). params.total = blocks · cols/2.
@group(0) @binding(30) var<storage, read_write> dxw: array<u32>;

@compute @workgroup_size(WG)
fn backward_column_pairs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let cols = params.cols;
    let half = cols / 2u;
    let block = t / half;
    let c = 2u * (t % half);
    let batch = block / params.blocks_per_batch;
    let span = block_rows(block);
    let wf = vec2<f32>(weight_factor(c), weight_factor(c + 1u));
    var sc = vec2<f32>(1.0);
    if (KIND == KIND_MOD) {
        sc = vec2<f32>(1.0 + ld_aux(batch * cols + c), 1.0 + ld_aux(batch * cols + c + 1u));
    }
    let g = wf * sc;
    var pw = vec2<f32>();
    var pb = vec2<f32>();
    var ps = vec2<f32>();
    for (var r = span.x; r < span.y; r = r + 1u) {
        let i = r * cols + c;
        let inv = rowinfo[ROWINFO * r];
        let mean = rowinfo[ROWINFO * r + 1u];
        let corr = rowinfo[ROWINFO * r + 2u];
        let c1 = rowinfo[ROWINFO * r + 3u];
        let c2 = rowinfo[ROWINFO * r + 4u];
        let n = ((vec2<f32>(source(i), source(i + 1u)) - vec2<f32>(mean)) - vec2<f32>(corr)) * inv;
        let d = vec2<f32>(ld_dy(i), ld_dy(i + 1u));
        if (KIND == KIND_MOD) {
            pw = pw + d * sc * n;
            ps = ps + d * n * wf;
        } else {
            pw = pw + d * n;
        }
        pb = pb + d;
        var v = inv * ((d * g - vec2<f32>(c1)) - n * c2);
        if (HAS_DRES) {
            v = v + vec2<f32>(ld_dres(i), ld_dres(i + 1u));
        }
        if (DDX == DT_F32) {
            dxw[i] = bitcast<u32>(v.x);
            dxw[i + 1u] = bitcast<u32>(v.y);
        } else {
            dxw[i >> 1u] = pack_halves(v.x, v.y, DDX);
        }
    }
    let at = block * cols + c;
    if (HAS_W) {
        partials[at] = pw.x;
        partials[at + 1u] = pw.y;
    }
    if (HAS_B || KIND == KIND_MOD) {
        partials[params.stride + at] = pb.x;
        partials[params.stride + at + 1u] = pb.y;
    }
    if (KIND == KIND_MOD) {
        partials[2u * params.stride + at] = ps.x;
        partials[2u * params.stride + at + 1u] = ps.y;
    }
}

// ---- GroupNorm parameter partials ----
// One segment of GP_LANES lanes per (sample b, channel ch) of total = batch * channels, so a
// workgroup takes WG / GP_LANES of them: lane l sums dy * n (slot 0) and dy (slot 1) over the
// channel's positions l, l + GP_LANES, ... (consecutive lanes read consecutive positions),
// then the segment's lanes are added by a fixed binary tree. Written as row b of a
// `[batch, 2 * channels]` matrix (dy * n at column ch, dy at channels + ch), whose columns the
// host sums over the samples (`reduce::sum_columns`). params.cols is the row length
// (channels_per_group * spatial).
const GP_LANES: u32 = 32u;
var<workgroup> gp_sums: array<vec2<f32>, WG>;

@compute @workgroup_size(WG)
fn group_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let l = lid % GP_LANES;
    let t = group_index(wid, nwg) * (WG / GP_LANES) + lid / GP_LANES;
    var acc = vec2<f32>();
    if (t < params.total) {
        let channels = params.groups * params.channels_per_group;
        let b = t / channels;
        let ch = t % channels;
        let row = b * params.groups + ch / params.channels_per_group;
        let first = row * params.cols + (ch % params.channels_per_group) * params.spatial;
        let inv = rowinfo[ROWINFO * row];
        let mean = rowinfo[ROWINFO * row + 1u];
        let corr = rowinfo[ROWINFO * row + 2u];
        for (var s = l; s < params.spatial; s = s + GP_LANES) {
            let i = first + s;
            let d = ld_dy(i);
            acc = acc + vec2<f32>(d * (((ld_x(i) - mean) - corr) * inv), d);
        }
    }
    gp_sums[lid] = acc;
    workgroupBarrier();
    for (var h = GP_LANES / 2u; h > 0u; h = h / 2u) {
        if (l < h) {
            gp_sums[lid] = gp_sums[lid] + gp_sums[lid + h];
        }
        workgroupBarrier();
    }
    if (l == 0u && t < params.total) {
        let channels = params.groups * params.channels_per_group;
        let at = (t / channels) * 2u * channels + t % channels;
        partials[at] = gp_sums[lid].x;
        partials[at + channels] = gp_sums[lid].y;
    }
}

// ---- DyT: y = gamma * tanh(alpha * x) + beta (alpha a scalar in aux[0]) ----

// tanh without overflow (exp of a large argument gives 1 exactly) and without the
// cancellation of 1 - 2 / (e^2v + 1) near zero (a Taylor series there).
fn tanh_exact(v: f32) -> f32 {
    let a = abs(v);
    var t: f32;
    if (a < 0.05) {
        let a2 = a * a;
        t = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))));
    } else {
        t = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    }
    return select(t, -t, v < 0.0);
}

fn dyt_value(i: u32, alpha: f32) -> f32 {
    let c = i % params.cols;
    var b = 0.0;
    if (HAS_B) {
        b = ld_aux2(c);
    }
    return ld_w(c) * tanh_exact(alpha * ld_x(i)) + b;
}

// One invocation per pair of elements (2p, 2p + 1) of the flat tensor: it owns the output
// word(s) of the pair whatever the width's parity. params.total = pairs, params.rows *
// params.cols = elements.
@compute @workgroup_size(WG)
fn dyt_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let p = group_index(wid, nwg) * WG + lid;
    if (p >= params.total) {
        return;
    }
    let count = params.rows * params.cols;
    let alpha = ld_aux(0u);
    let i = 2u * p;
    let a = dyt_value(i, alpha);
    let second = i + 1u < count;
    var b = 0.0;
    if (second) {
        b = dyt_value(i + 1u, alpha);
    }
    if (DX == DT_F32) {
        y_out[i] = bitcast<u32>(a);
        if (second) {
            y_out[i + 1u] = bitcast<u32>(b);
        }
    } else if (second) {
        y_out[p] = pack_halves(a, b, DX);
    } else {
        y_out[p] = half_bits(a, DX);
    }
}

// Four tanh_exact values at once, the same operations per value (both branches computed,
// then selected: no divergence).
fn tanh_exact4(v: vec4<f32>) -> vec4<f32> {
    let a = abs(v);
    let a2 = a * a;
    let small = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))));
    let large = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    let t = select(large, small, a < vec4<f32>(0.05));
    return select(t, -t, v < vec4<f32>(0.0));
}

// `dyt_forward` for rows of whole chunks (4 F32 or 8 16-bit values): one invocation per chunk
// of the flat tensor, γ and β read as chunks of the same columns (`w_chunk`, `b_chunk`), the
// same values as `dyt_value`. params.total = chunks.
@compute @workgroup_size(WG)
fn dyt_forward_chunks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let q = group_index(wid, nwg) * WG + lid;
    if (q >= params.total) {
        return;
    }
    let alpha = ld_aux(0u);
    let v = vals(x4[q], DX);
    let column = q % (params.cols / chunk_len());
    let t = Vals(tanh_exact4(alpha * v.lo), tanh_exact4(alpha * v.hi));
    y4[q] = pack(vadd(vmul(w_chunk(column), t), b_chunk(column)), DX);
}

// One invocation per (block of BLOCK_ROWS rows, column): dx and the block's partials of
// dgamma (slot 0), dbeta (slot 1) and dalpha (slot 2, per column).
@compute @workgroup_size(WG)
fn dyt_backward_columns(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let cols = params.cols;
    let block = t / cols;
    let c = t % cols;
    let first = block * BLOCK_ROWS;
    let last = min(first + BLOCK_ROWS, params.rows);
    let alpha = ld_aux(0u);
    let gamma = ld_w(c);
    var pg = 0.0;
    var pb = 0.0;
    var pa = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let i = r * cols + c;
        let v = ld_x(i);
        let th = tanh_exact(alpha * v);
        let d = ld_dy(i);
        let slope = d * gamma * (1.0 - th * th);
        dx[i] = slope * alpha;
        pa = pa + slope * v;
        pg = pg + d * th;
        pb = pb + d;
    }
    partials[t] = pg;
    if (HAS_B) {
        partials[params.stride + t] = pb;
    }
    partials[2u * params.stride + t] = pa;
}

// ---- PolyNorm: y = w0 n(x^3) + w1 n(x^2) + w2 n(x) + b, n(u) = u / sqrt(mean(u^2) + eps) ----
// weight holds (w0, w1, w2), aux2[0] the bias. Saved statistics: inv_out[3 row + k] is the
// inverse RMS of x^(3-k) (k = 0, 1, 2, the order of the weights).

fn poly_out(i: u32, i3: f32, i2: f32, i1: f32) -> f32 {
    let v = ld_x(i);
    let v2 = v * v;
    var b = 0.0;
    if (HAS_B) {
        b = ld_aux2(0u);
    }
    return ld_w(0u) * (v2 * v * i3) + ld_w(1u) * (v2 * i2) + ld_w(2u) * (v * i1) + b;
}

@compute @workgroup_size(WG)
fn poly_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    var s2 = 0.0;
    var s4 = 0.0;
    var s6 = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        let v = ld_x(base + c);
        let v2 = v * v;
        s2 = s2 + v2;
        s4 = s4 + v2 * v2;
        s6 = s6 + v2 * v2 * v2;
    }
    let n = f32(cols);
    let i1 = 1.0 / sqrt(workgroup_sum(s2, lid) / n + params.eps);
    let i2 = 1.0 / sqrt(workgroup_sum(s4, lid) / n + params.eps);
    let i3 = 1.0 / sqrt(workgroup_sum(s6, lid) / n + params.eps);
    if (lid == 0u) {
        inv_out[3u * row] = i3;
        inv_out[3u * row + 1u] = i2;
        inv_out[3u * row + 2u] = i1;
    }
    if (PAIRS) {
        let words = cols / 2u;
        let wbase = base / 2u;
        for (var p = lid; p < words; p = p + WG) {
            let c = 2u * p;
            y_out[wbase + p] = pack_halves(poly_out(base + c, i3, i2, i1),
                                           poly_out(base + c + 1u, i3, i2, i1), DX);
        }
    } else {
        for (var c = lid; c < cols; c = c + WG) {
            y_out[base + c] = bitcast<u32>(poly_out(base + c, i3, i2, i1));
        }
    }
}

// Row constants: rowinfo[row] = (inv3, inv2, inv1, m3, m2, m1), m_k = mean(dn_k * n_k) with
// dn_k = dy * w_k.
@compute @workgroup_size(WG)
fn poly_backward_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let i3 = inv_in[3u * row];
    let i2 = inv_in[3u * row + 1u];
    let i1 = inv_in[3u * row + 2u];
    var a3 = 0.0;
    var a2 = 0.0;
    var a1 = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        let v = ld_x(base + c);
        let d = ld_dy(base + c);
        let v2 = v * v;
        a3 = a3 + d * (v2 * v * i3);
        a2 = a2 + d * (v2 * i2);
        a1 = a1 + d * (v * i1);
    }
    let n = f32(cols);
    let m3 = ld_w(0u) * workgroup_sum(a3, lid) / n;
    let m2 = ld_w(1u) * workgroup_sum(a2, lid) / n;
    let m1 = ld_w(2u) * workgroup_sum(a1, lid) / n;
    if (lid == 0u) {
        rowinfo_out[ROWINFO * row] = i3;
        rowinfo_out[ROWINFO * row + 1u] = i2;
        rowinfo_out[ROWINFO * row + 2u] = i1;
        rowinfo_out[ROWINFO * row + 3u] = m3;
        rowinfo_out[ROWINFO * row + 4u] = m2;
        rowinfo_out[ROWINFO * row + 5u] = m1;
    }
}

// One invocation per (block, column): dx = sum_k inv_k (dn_k - n_k m_k) d(x^k)/dx, and the
// block's partials of dw0, dw1, dw2 (slots 0..2) and db (slot 3), per column.
@compute @workgroup_size(WG)
fn poly_backward_columns(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let cols = params.cols;
    let block = t / cols;
    let c = t % cols;
    let first = block * BLOCK_ROWS;
    let last = min(first + BLOCK_ROWS, params.rows);
    let w0 = ld_w(0u);
    let w1 = ld_w(1u);
    let w2 = ld_w(2u);
    var p3 = 0.0;
    var p2 = 0.0;
    var p1 = 0.0;
    var pb = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let i = r * cols + c;
        let v = ld_x(i);
        let d = ld_dy(i);
        let v2 = v * v;
        let i3 = rowinfo[ROWINFO * r];
        let i2 = rowinfo[ROWINFO * r + 1u];
        let i1 = rowinfo[ROWINFO * r + 2u];
        let n3 = v2 * v * i3;
        let n2 = v2 * i2;
        let n1 = v * i1;
        let g3 = i3 * (d * w0 - n3 * rowinfo[ROWINFO * r + 3u]);
        let g2 = i2 * (d * w1 - n2 * rowinfo[ROWINFO * r + 4u]);
        let g1 = i1 * (d * w2 - n1 * rowinfo[ROWINFO * r + 5u]);
        dx[i] = g3 * (3.0 * v2) + g2 * (2.0 * v) + g1;
        p3 = p3 + d * n3;
        p2 = p2 + d * n2;
        p1 = p1 + d * n1;
        pb = pb + d;
    }
    partials[t] = p3;
    partials[params.stride + t] = p2;
    partials[2u * params.stride + t] = p1;
    if (HAS_B) {
        partials[3u * params.stride + t] = pb;
    }
}

// ---- Register paths: RMSNorm, LayerNorm and add+RMSNorm ------------------------------------
// Rows of whole chunks (a chunk is one vec4<u32>: 4 F32 or 8 16-bit values) of at most
// CHUNKS × WG chunks: lane t owns the row's chunks t, t + WG, ..., t + (CHUNKS − 1)·WG and keeps
// them in named registers (no indexed private array, which some compilers put in local
// memory), so the row is read from memory once. Weights and biases are read as chunks of the
// same columns (any float dtype; a dtype other than the source's is read value by value).
// 16-bit values are widened with `widen2` (exact for every finite value).
//
// Sums: each lane adds its chunks in a fixed pairwise order, then `row_sum2` adds the lanes in
// a fixed tree, so reruns are bit-identical (not bit-equal to the general kernels, which add
// in another order). The forwards may instead give each row a segment of SEG lanes (see SEG;
// lane t of a segment then owns chunks t, t + SEG, ...).
//
// The backward takes `block_rows` consecutive rows per workgroup: per row it loads the row's
// source and cotangent chunks once, computes the row constants, writes dx and adds the
// parameter partials of its columns into registers (rows in order); at the end it writes the
// block's partial rows, which `partials_finish` sums in block order. With RELOAD (1,024
// lanes, rows too wide to keep x and dy in registers) it reads each row twice, the second
// time mostly from cache.
// `rms_backward_words` is the RMSNorm backward that keeps the loaded words instead (see
// "Register backward, words kept").

override CHUNKS: u32 = 8u; // chunks per lane: 1, 2, 4 or 8 (the unused registers fold away)
// Segments (the register forwards and backwards, 256-lane subgroup modules only): 0, one row
// a workgroup; else a power of two no larger than SG_WIDTH, and each run of SEG consecutive
// lanes (within one subgroup) owns a row of at most CHUNKS × SEG chunks, WG / SEG rows at a
// time a workgroup, its sums a butterfly over the segment (`segment_pairs`): no workgroup
// memory and no barrier (the backwards add their segments' parameter partials once, at the
// end: `put_block_part`). For short rows (GroupNorm's (sample, group) rows, narrow models),
// where one row a workgroup leaves lanes idle and spends its time in the workgroup tree.
override SEG: u32 = 0u;
// Backward: load the row's chunks again for dx (from cache) instead of keeping them in
// registers across the row sum (rows too wide for the registers of the whole row).
override RELOAD: bool = false;
// Storage dtype of dx in the register backward: F32, or (16-bit sources only) F16 / BF16.
override DDX: u32 = 0u;

@group(0) @binding(18) var<storage, read> x4: array<vec4<u32>>;
@group(0) @binding(19) var<storage, read_write> y4: array<vec4<u32>>;
@group(0) @binding(20) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(21) var<storage, read> b4: array<vec4<u32>>;
@group(0) @binding(22) var<storage, read> r4: array<vec4<u32>>;
@group(0) @binding(23) var<storage, read_write> s4: array<vec4<u32>>;
@group(0) @binding(24) var<storage, read> dy4: array<vec4<u32>>;
@group(0) @binding(25) var<storage, read> dr4: array<vec4<u32>>;
// dx: F32 vec4s (their bits), or with DDX 16-bit, eight values rounded once a chunk.
@group(0) @binding(26) var<storage, read_write> dx4: array<vec4<u32>>;
@group(0) @binding(27) var<storage, read_write> part4: array<vec4<f32>>;
@group(0) @binding(28) var<storage, read> mean_in: array<f32>;
@group(0) @binding(29) var<storage, read> corr_in: array<f32>;

// Fixed-order workgroup sum of pairs: `lanes_pairs`, the shared fan-in-8 tree
// (`workgroup_pairs8`), or subgroup shuffles in the subgroup modules. Call from uniform
// control flow.
fn row_sum2(v: vec2<f32>, lid: u32) -> vec2<f32> {
    if (SEG != 0u) {
        return segment_pairs(v, SEG, PAIR_SUM);
    }
    return lanes_pairs(v, lid, PAIR_SUM);
}

fn row_sum(v: f32, lid: u32) -> f32 {
    return row_sum2(vec2<f32>(v, 0.0), lid).x;
}

// Values per chunk: 4 (F32) or 8 (16-bit).
fn chunk_len() -> u32 {
    if (DX == DT_F32) {
        return 4u;
    }
    return 8u;
}

// The values of one chunk in FP32: `lo` (F32: the 4 values), `hi` (16-bit: values 4..7).
struct Vals {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn vals(w: vec4<u32>, dt: u32) -> Vals {
    if (dt == DT_F32) {
        return Vals(bitcast<vec4<f32>>(w), vec4<f32>());
    }
    return Vals(vec4<f32>(widen2(w.x, dt), widen2(w.y, dt)), vec4<f32>(widen2(w.z, dt), widen2(w.w, dt)));
}

// BF16 rounding kept in FP32 (the low half zero), bit for bit as `f32_to_bf16`:
// `bf16_round` any value, `bf16_round_clean` values known not to be NaN (the shared
// `bf16_rne` / `bf16_bits` of `common/dtype.wgsl`).
// With BF16 sources the register forwards are bound by these integer operations rather than
// by memory (measured on an H200, `notes/measurements.md`): a NaN-free chunk (`clean`) takes
// the shorter form.
fn bf16_round(v: vec4<f32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(bf16_bits(v));
}

fn bf16_round_clean(v: vec4<f32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(bf16_rne(v) & vec4<u32>(0xffff0000u));
}

// Whether none of a chunk's values is NaN (`nan_free8`; opposite infinities take the longer
// rounding).
fn clean(v: Vals) -> bool {
    return nan_free8(v.lo, v.hi);
}

// Whether v is finite.
fn finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) < 0x7f800000u;
}

fn pack(v: Vals, dt: u32) -> vec4<u32> {
    if (dt == DT_F32) {
        return bitcast<vec4<u32>>(v.lo);
    }
    return narrow8(v.lo, v.hi, dt);
}

fn vzero() -> Vals {
    return Vals(vec4<f32>(), vec4<f32>());
}

fn vadd(a: Vals, b: Vals) -> Vals {
    return Vals(a.lo + b.lo, a.hi + b.hi);
}

fn vsub(a: Vals, b: Vals) -> Vals {
    return Vals(a.lo - b.lo, a.hi - b.hi);
}

fn vmul(a: Vals, b: Vals) -> Vals {
    return Vals(a.lo * b.lo, a.hi * b.hi);
}

fn vscale(a: Vals, s: f32) -> Vals {
    return Vals(a.lo * s, a.hi * s);
}

// (a − mean) − corr, the centering of `forward_rows`.
fn vcenter(a: Vals, mean: f32, corr: f32) -> Vals {
    return Vals((a.lo - mean) - corr, (a.hi - mean) - corr);
}

fn vdot(a: Vals, b: Vals) -> f32 {
    if (DX == DT_F32) {
        return dot(a.lo, b.lo);
    }
    return dot(a.lo, b.lo) + dot(a.hi, b.hi);
}

fn vtotal(a: Vals) -> f32 {
    let s = (a.lo.x + a.lo.y) + (a.lo.z + a.lo.w);
    if (DX == DT_F32) {
        return s;
    }
    return s + ((a.hi.x + a.hi.y) + (a.hi.z + a.hi.w));
}

// v rounded to the source dtype (the identity for F32); `no_nan`: v is known to hold no NaN.
fn vround(v: Vals, no_nan: bool) -> Vals {
    if (DX == DT_F32) {
        return v;
    }
    if (DX == DT_BF16) {
        if (no_nan || clean(v)) {
            return Vals(bf16_round_clean(v.lo), bf16_round_clean(v.hi));
        }
        return Vals(bf16_round(v.lo), bf16_round(v.hi));
    }
    return vals(pack(v, DX), DX);
}

// Weight value of column c (any float dtype; one word loaded, not its chunk) and the weight
// chunk of row chunk q.
fn w_one(c: u32) -> f32 {
    if (DW == DT_F32) {
        return bitcast<f32>(w4[c >> 2u][c & 3u]);
    }
    return half_from_word(w4[c >> 3u][(c >> 1u) & 3u], c, DW);
}

fn w_chunk(q: u32) -> Vals {
    if (DW == DX) {
        return vals(w4[q], DW);
    }
    let c = q * chunk_len();
    var v = Vals(vec4<f32>(w_one(c), w_one(c + 1u), w_one(c + 2u), w_one(c + 3u)), vec4<f32>());
    if (DX != DT_F32) {
        v.hi = vec4<f32>(w_one(c + 4u), w_one(c + 5u), w_one(c + 6u), w_one(c + 7u));
    }
    return v;
}

// Weight factor offset + w of row chunk q (1 without a weight).
fn wf_chunk(q: u32) -> Vals {
    if (!HAS_W) {
        return Vals(vec4<f32>(1.0), vec4<f32>(1.0));
    }
    let w = w_chunk(q);
    if (!HAS_OFFSET) {
        return w;
    }
    return Vals(w.lo + params.offset, w.hi + params.offset);
}

fn b_one(c: u32) -> f32 {
    if (DB == DT_F32) {
        return bitcast<f32>(b4[c >> 2u][c & 3u]);
    }
    return half_from_word(b4[c >> 3u][(c >> 1u) & 3u], c, DB);
}

// Bias chunk of row chunk q (0 without a bias).
fn b_chunk(q: u32) -> Vals {
    if (!HAS_B) {
        return vzero();
    }
    if (DB == DX) {
        return vals(b4[q], DB);
    }
    let c = q * chunk_len();
    var v = Vals(vec4<f32>(b_one(c), b_one(c + 1u), b_one(c + 2u), b_one(c + 3u)), vec4<f32>());
    if (DX != DT_F32) {
        v.hi = vec4<f32>(b_one(c + 4u), b_one(c + 5u), b_one(c + 6u), b_one(c + 7u));
    }
    return v;
}

// Lanes sharing a row: the workgroup, or a segment.
fn lanes() -> u32 {
    if (SEG == 0u) {
        return WG;
    }
    return SEG;
}

// (row, lane within the row) of invocation `lid` of a register forward.
fn row_lane(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> vec2<u32> {
    if (SEG == 0u) {
        return vec2<u32>(group_index(wid, nwg), lid);
    }
    let seg = max(SEG, 1u); // (the constant folding evaluates this with SEG = 0 too)
    return vec2<u32>(group_index(wid, nwg) * (WG / seg) + lid / seg, lid % seg);
}

// Whether lane `lid` owns its k-th chunk (row chunk lid + k·lanes()) of a row of n chunks.
fn has(k: u32, lid: u32, n: u32) -> bool {
    return k < CHUNKS && lid + k * lanes() < n;
}

// The lane's k-th source / cotangent chunk of the row starting at chunk `base` (0 if absent).
fn ld_x4(k: u32, lid: u32, n: u32, base: u32) -> vec4<u32> {
    if (has(k, lid, n)) {
        return x4[base + lid + k * lanes()];
    }
    return vec4<u32>();
}

fn ld_dy4(k: u32, lid: u32, n: u32, base: u32) -> vec4<u32> {
    if (has(k, lid, n)) {
        return dy4[base + lid + k * lanes()];
    }
    return vec4<u32>();
}

// The lane's eight chunk slots of a row (zeros where it holds none; slots past CHUNKS fold
// away), for the kernels that take them as one value.
struct Chunks {
    c0: vec4<u32>,
    c1: vec4<u32>,
    c2: vec4<u32>,
    c3: vec4<u32>,
    c4: vec4<u32>,
    c5: vec4<u32>,
    c6: vec4<u32>,
    c7: vec4<u32>,
}

fn x_chunks(lid: u32, n: u32, base: u32) -> Chunks {
    return Chunks(ld_x4(0u, lid, n, base), ld_x4(1u, lid, n, base), ld_x4(2u, lid, n, base),
                  ld_x4(3u, lid, n, base), ld_x4(4u, lid, n, base), ld_x4(5u, lid, n, base),
                  ld_x4(6u, lid, n, base), ld_x4(7u, lid, n, base));
}

fn dy_chunks(lid: u32, n: u32, base: u32) -> Chunks {
    return Chunks(ld_dy4(0u, lid, n, base), ld_dy4(1u, lid, n, base), ld_dy4(2u, lid, n, base),
                  ld_dy4(3u, lid, n, base), ld_dy4(4u, lid, n, base), ld_dy4(5u, lid, n, base),
                  ld_dy4(6u, lid, n, base), ld_dy4(7u, lid, n, base));
}

fn sq(w: vec4<u32>) -> f32 {
    let v = vals(w, DX);
    return vdot(v, v);
}

// Modulated RMSNorm: the scale (aux, DA) and shift (aux2, DB) chunk m of `[batches, cols]`
// (m = batch · chunks a row + row chunk), as chunks where the dtype is the source's, else value
// by value.
@group(0) @binding(31) var<storage, read> a4: array<vec4<u32>>;

fn scale_chunk(m: u32) -> Vals {
    if (DA == DX) {
        return vals(a4[m], DA);
    }
    let c = m * chunk_len();
    var v = Vals(vec4<f32>(ld_aux(c), ld_aux(c + 1u), ld_aux(c + 2u), ld_aux(c + 3u)), vec4<f32>());
    if (DX != DT_F32) {
        v.hi = vec4<f32>(ld_aux(c + 4u), ld_aux(c + 5u), ld_aux(c + 6u), ld_aux(c + 7u));
    }
    return v;
}

fn shift_chunk(m: u32) -> Vals {
    if (DB == DX) {
        return vals(b4[m], DB);
    }
    let c = m * chunk_len();
    var v = Vals(vec4<f32>(ld_aux2(c), ld_aux2(c + 1u), ld_aux2(c + 2u), ld_aux2(c + 3u)), vec4<f32>());
    if (DX != DT_F32) {
        v.hi = vec4<f32>(ld_aux2(c + 4u), ld_aux2(c + 5u), ld_aux2(c + 6u), ld_aux2(c + 7u));
    }
    return v;
}

// RMSNorm output chunk of the source values v (row chunk q of a row of n chunks in modulation
// batch `batch`), with the casting modes; modulated RMSNorm `(1 + scale)·(x·inv·wf) + shift`
// as `out_value` (no casting mode). `finite_row`: the row's sum of squares is finite, so every
// x is finite, inv finite and positive, and the normalized values n = x·inv hold no NaN.
fn rms_chunk(v: Vals, q: u32, n_chunks: u32, batch: u32, inv: f32, finite_row: bool) -> vec4<u32> {
    if (KIND == KIND_MOD) {
        let n = vscale(v, inv);
        let wf = wf_chunk(q);
        let m = batch * n_chunks + q;
        let sc = scale_chunk(m);
        let one = Vals(1.0 + sc.lo, 1.0 + sc.hi);
        return pack(vadd(vmul(one, vmul(n, wf)), shift_chunk(m)), DX);
    }
    return cast_chunk(v, q, inv, finite_row);
}

// `rms_chunk` without the modulation (add+RMSNorm's outputs: its entry then binds no scale or
// shift, six storage buffers in all).
fn cast_chunk(v: Vals, q: u32, inv: f32, finite_row: bool) -> vec4<u32> {
    let n = vscale(v, inv);
    let wf = wf_chunk(q);
    if (CAST == CAST_LLAMA) {
        return pack(vmul(vround(n, finite_row), wf), DX);
    }
    if (CAST == CAST_NONE) {
        return pack(vmul(vround(n, finite_row), vround(wf, false)), DX);
    }
    return pack(vmul(n, wf), DX);
}

fn rms_put(v: Vals, k: u32, lid: u32, n: u32, base: u32, inv: f32, finite_row: bool) {
    if (has(k, lid, n)) {
        let q = lid + k * lanes();
        let batch = (base / n) / params.rows_per_batch;
        y4[base + q] = rms_chunk(v, q, n, batch, inv, finite_row);
    }
}

@compute @workgroup_size(WG)
fn rms_forward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let at = row_lane(wid, nwg, lid);
    let row = at.x;
    let lane = at.y;
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let c0 = ld_x4(0u, lane, n, base);
    let c1 = ld_x4(1u, lane, n, base);
    let c2 = ld_x4(2u, lane, n, base);
    let c3 = ld_x4(3u, lane, n, base);
    let c4 = ld_x4(4u, lane, n, base);
    let c5 = ld_x4(5u, lane, n, base);
    let c6 = ld_x4(6u, lane, n, base);
    let c7 = ld_x4(7u, lane, n, base);
    let squares = ((sq(c0) + sq(c1)) + (sq(c2) + sq(c3))) + ((sq(c4) + sq(c5)) + (sq(c6) + sq(c7)));
    let total = row_sum(squares, lane);
    let inv = 1.0 / sqrt(total / f32(params.cols) + params.eps);
    let fin = finite(total);
    if (lane == 0u) {
        inv_out[row] = inv;
    }
    rms_put(vals(c0, DX), 0u, lane, n, base, inv, fin);
    rms_put(vals(c1, DX), 1u, lane, n, base, inv, fin);
    rms_put(vals(c2, DX), 2u, lane, n, base, inv, fin);
    rms_put(vals(c3, DX), 3u, lane, n, base, inv, fin);
    rms_put(vals(c4, DX), 4u, lane, n, base, inv, fin);
    rms_put(vals(c5, DX), 5u, lane, n, base, inv, fin);
    rms_put(vals(c6, DX), 6u, lane, n, base, inv, fin);
    rms_put(vals(c7, DX), 7u, lane, n, base, inv, fin);
}

// x + residual of the lane's k-th chunk in FP32 (unrounded; the residual has the source's
// dtype); writes the sum rounded to the source dtype.
fn add_load(k: u32, lid: u32, n: u32, base: u32) -> Vals {
    if (!has(k, lid, n)) {
        return vzero();
    }
    let i = base + lid + k * lanes();
    let s = vadd(vals(x4[i], DX), vals(r4[i], DX));
    s4[i] = pack(s, DX);
    return s;
}

// `rms_put` of add+RMSNorm (no modulation).
fn add_put(v: Vals, k: u32, lid: u32, n: u32, base: u32, inv: f32, finite_row: bool) {
    if (has(k, lid, n)) {
        let q = lid + k * lanes();
        y4[base + q] = cast_chunk(v, q, inv, finite_row);
    }
}

@compute @workgroup_size(WG)
fn add_forward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let at = row_lane(wid, nwg, lid);
    let row = at.x;
    let lane = at.y;
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let s0 = add_load(0u, lane, n, base);
    let s1 = add_load(1u, lane, n, base);
    let s2 = add_load(2u, lane, n, base);
    let s3 = add_load(3u, lane, n, base);
    let s4_ = add_load(4u, lane, n, base);
    let s5 = add_load(5u, lane, n, base);
    let s6 = add_load(6u, lane, n, base);
    let s7 = add_load(7u, lane, n, base);
    let squares = ((vdot(s0, s0) + vdot(s1, s1)) + (vdot(s2, s2) + vdot(s3, s3)))
        + ((vdot(s4_, s4_) + vdot(s5, s5)) + (vdot(s6, s6) + vdot(s7, s7)));
    let total = row_sum(squares, lane);
    let inv = 1.0 / sqrt(total / f32(params.cols) + params.eps);
    let fin = finite(total);
    if (lane == 0u) {
        inv_out[row] = inv;
    }
    add_put(s0, 0u, lane, n, base, inv, fin);
    add_put(s1, 1u, lane, n, base, inv, fin);
    add_put(s2, 2u, lane, n, base, inv, fin);
    add_put(s3, 3u, lane, n, base, inv, fin);
    add_put(s4_, 4u, lane, n, base, inv, fin);
    add_put(s5, 5u, lane, n, base, inv, fin);
    add_put(s6, 6u, lane, n, base, inv, fin);
    add_put(s7, 7u, lane, n, base, inv, fin);
}

// LayerNorm: the chunks stay in registers through one pair sum, Σ (x − p) and Σ (x − p)² about
// a pivot p (the mean of the row's first chunk, the same in every lane), and the outputs; the
// mean is kept as `mean` plus the correction `corr`, as in `forward_rows`. The variance is
// Σ (x − p)²/n − δ² (δ = Σ (x − p)/n) where that cancels at most two bits (δ² ≤ ¾ of the
// spread, so its relative error stays within about 7 FP32 units beside the sums' own), else
// the centered squares are summed in a second pass. A common offset of the row is in p, so it
// costs nothing; the second pass is for rows whose first chunk lies far from their mean.

// Σ (x − p) and Σ (x − p)² over the lane's k-th chunk.
fn ln_shifted(w: vec4<u32>, k: u32, lid: u32, n: u32, pivot: f32) -> vec2<f32> {
    if (!has(k, lid, n)) {
        return vec2<f32>();
    }
    let v = vals(w, DX);
    let d = Vals(v.lo - pivot, v.hi - pivot);
    return vec2<f32>(vtotal(d), vdot(d, d));
}

fn ln_sq(w: vec4<u32>, k: u32, lid: u32, n: u32, mean: f32, corr: f32) -> f32 {
    if (!has(k, lid, n)) {
        return 0.0;
    }
    let d = vcenter(vals(w, DX), mean, corr);
    return vdot(d, d);
}

// GroupNorm (rows (sample, group) of channels_per_group · spatial values, spatial a multiple
// of the chunk length): the weight factor and bias of row chunk q of row `row`, the same for
// the chunk's values (one channel), as `out_value`'s.
fn group_channel(row: u32, q: u32) -> u32 {
    return (row % params.groups) * params.channels_per_group + (q * chunk_len()) / params.spatial;
}

// Read through the chunk bindings `w4` and `b4` that LayerNorm's chunks use, so that the
// register forward binds at most eight storage buffers (`weight_factor` and `ld_aux2` would add
// two); the same values.
fn group_affine(row: u32, q: u32) -> vec2<f32> {
    let p = group_channel(row, q);
    var b = 0.0;
    if (HAS_B) {
        b = b_one(p);
    }
    var wf = 1.0;
    if (HAS_W) {
        wf = w_one(p);
        if (HAS_OFFSET) {
            wf = params.offset + wf;
        }
    }
    return vec2<f32>(wf, b);
}

// GroupNorm: the (weight factor, bias) of the lane's k-th chunk, loaded with the row's chunks
// (before its reductions, so the loads are not left for after them); zeros otherwise.
fn held_affine(k: u32, lid: u32, n: u32, row: u32) -> vec2<f32> {
    if (KIND != KIND_GROUP || !has(k, lid, n)) {
        return vec2<f32>();
    }
    return group_affine(row, lid + k * lanes());
}

// `a`: the chunk's `held_affine` (GroupNorm).
fn ln_put(w: vec4<u32>, k: u32, lid: u32, n: u32, base: u32, mean: f32, corr: f32, inv: f32,
          a: vec2<f32>) {
    if (has(k, lid, n)) {
        let q = lid + k * lanes();
        let nrm = vscale(vcenter(vals(w, DX), mean, corr), inv);
        if (KIND == KIND_GROUP) {
            y4[base + q] = pack(Vals(nrm.lo * a.x + a.y, nrm.hi * a.x + a.y), DX);
        } else {
            y4[base + q] = pack(vadd(vmul(nrm, wf_chunk(q)), b_chunk(q)), DX);
        }
    }
}

@compute @workgroup_size(WG)
fn layer_forward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let at = row_lane(wid, nwg, lid);
    let row = at.x;
    let lane = at.y;
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let c0 = ld_x4(0u, lane, n, base);
    let c1 = ld_x4(1u, lane, n, base);
    let c2 = ld_x4(2u, lane, n, base);
    let c3 = ld_x4(3u, lane, n, base);
    let c4 = ld_x4(4u, lane, n, base);
    let c5 = ld_x4(5u, lane, n, base);
    let c6 = ld_x4(6u, lane, n, base);
    let c7 = ld_x4(7u, lane, n, base);
    let a0 = held_affine(0u, lane, n, row);
    let a1 = held_affine(1u, lane, n, row);
    let a2 = held_affine(2u, lane, n, row);
    let a3 = held_affine(3u, lane, n, row);
    let a4 = held_affine(4u, lane, n, row);
    let a5 = held_affine(5u, lane, n, row);
    let a6 = held_affine(6u, lane, n, row);
    let a7 = held_affine(7u, lane, n, row);
    // The first chunk's mean, each value scaled first (by a power of two) so the sum cannot
    // overflow.
    let pivot = vtotal(vscale(vals(x4[base], DX), 1.0 / f32(chunk_len())));
    let shifted = ((ln_shifted(c0, 0u, lane, n, pivot) + ln_shifted(c1, 1u, lane, n, pivot))
        + (ln_shifted(c2, 2u, lane, n, pivot) + ln_shifted(c3, 3u, lane, n, pivot)))
        + ((ln_shifted(c4, 4u, lane, n, pivot) + ln_shifted(c5, 5u, lane, n, pivot))
        + (ln_shifted(c6, 6u, lane, n, pivot) + ln_shifted(c7, 7u, lane, n, pivot)));
    let sums = row_sum2(shifted, lane) / f32(params.cols);
    let delta = sums.x;
    let mean = pivot + delta;
    let corr = (pivot - mean) + delta;
    var variance = sums.y - delta * delta;
    if (!one_pass_ok(sums, lane)) {
        let squares = ((ln_sq(c0, 0u, lane, n, mean, corr) + ln_sq(c1, 1u, lane, n, mean, corr))
            + (ln_sq(c2, 2u, lane, n, mean, corr) + ln_sq(c3, 3u, lane, n, mean, corr)))
            + ((ln_sq(c4, 4u, lane, n, mean, corr) + ln_sq(c5, 5u, lane, n, mean, corr))
            + (ln_sq(c6, 6u, lane, n, mean, corr) + ln_sq(c7, 7u, lane, n, mean, corr)));
        variance = row_sum(squares, lane) / f32(params.cols);
    }
    let inv = 1.0 / sqrt(variance + params.eps);
    if (lane == 0u) {
        inv_out[row] = inv;
        mean_out[row] = mean;
        sum_out[row] = bitcast<u32>(corr);
    }
    ln_put(c0, 0u, lane, n, base, mean, corr, inv, a0);
    ln_put(c1, 1u, lane, n, base, mean, corr, inv, a1);
    ln_put(c2, 2u, lane, n, base, mean, corr, inv, a2);
    ln_put(c3, 3u, lane, n, base, mean, corr, inv, a3);
    ln_put(c4, 4u, lane, n, base, mean, corr, inv, a4);
    ln_put(c5, 5u, lane, n, base, mean, corr, inv, a5);
    ln_put(c6, 6u, lane, n, base, mean, corr, inv, a6);
    ln_put(c7, 7u, lane, n, base, mean, corr, inv, a7);
}

// PolyNorm: the chunks stay in registers through the sums of x², x⁴ and x⁶ (one pair sum and
// one sum) and the outputs, `poly_out`'s formula.

// Σ x², Σ x⁴, Σ x⁶ over the lane's k-th chunk.
fn poly_sums(w: vec4<u32>, k: u32, lid: u32, n: u32) -> vec3<f32> {
    if (!has(k, lid, n)) {
        return vec3<f32>();
    }
    let v = vals(w, DX);
    let v2 = vmul(v, v);
    let v4 = vmul(v2, v2);
    return vec3<f32>(vtotal(v2), vtotal(v4), vtotal(vmul(v4, v2)));
}

fn poly_put(w: vec4<u32>, k: u32, lid: u32, n: u32, base: u32, inv: vec3<f32>, coef: vec4<f32>) {
    if (has(k, lid, n)) {
        let v = vals(w, DX);
        let v2 = vmul(v, v);
        let t3 = vscale(vscale(vmul(v2, v), inv.x), coef.x);
        let t2 = vscale(vscale(v2, inv.y), coef.y);
        let t1 = vscale(vscale(v, inv.z), coef.z);
        let b = Vals(vec4<f32>(coef.w), vec4<f32>(coef.w));
        y4[base + lid + k * lanes()] = pack(vadd(vadd(vadd(t3, t2), t1), b), DX);
    }
}

@compute @workgroup_size(WG)
fn poly_forward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let at = row_lane(wid, nwg, lid);
    let row = at.x;
    let lane = at.y;
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let c = x_chunks(lane, n, base);
    let sums = ((poly_sums(c.c0, 0u, lane, n) + poly_sums(c.c1, 1u, lane, n))
        + (poly_sums(c.c2, 2u, lane, n) + poly_sums(c.c3, 3u, lane, n)))
        + ((poly_sums(c.c4, 4u, lane, n) + poly_sums(c.c5, 5u, lane, n))
        + (poly_sums(c.c6, 6u, lane, n) + poly_sums(c.c7, 7u, lane, n)));
    let s24 = row_sum2(sums.xy, lane);
    let s6 = row_sum(sums.z, lane);
    let count = f32(params.cols);
    let i1 = 1.0 / sqrt(s24.x / count + params.eps);
    let i2 = 1.0 / sqrt(s24.y / count + params.eps);
    let i3 = 1.0 / sqrt(s6 / count + params.eps);
    if (lane == 0u) {
        inv_out[3u * row] = i3;
        inv_out[3u * row + 1u] = i2;
        inv_out[3u * row + 2u] = i1;
    }
    var b = 0.0;
    if (HAS_B) {
        b = ld_aux2(0u);
    }
    let inv = vec3<f32>(i3, i2, i1);
    let coef = vec4<f32>(ld_w(0u), ld_w(1u), ld_w(2u), b);
    poly_put(c.c0, 0u, lane, n, base, inv, coef);
    poly_put(c.c1, 1u, lane, n, base, inv, coef);
    poly_put(c.c2, 2u, lane, n, base, inv, coef);
    poly_put(c.c3, 3u, lane, n, base, inv, coef);
    poly_put(c.c4, 4u, lane, n, base, inv, coef);
    poly_put(c.c5, 5u, lane, n, base, inv, coef);
    poly_put(c.c6, 6u, lane, n, base, inv, coef);
    poly_put(c.c7, 7u, lane, n, base, inv, coef);
}

// ---- Register backward ----

// dx of row chunk i (F32 source: one vec4; 16-bit source: two F32 vec4s, or one vec4 of
// words with DDX 16-bit).
fn put_dx(g: Vals, i: u32) {
    if (DX == DT_F32) {
        dx4[i] = bitcast<vec4<u32>>(g.lo);
    } else if (DDX != DT_F32) {
        dx4[i] = narrow8(g.lo, g.hi, DDX);
    } else {
        dx4[2u * i] = bitcast<vec4<u32>>(g.lo);
        dx4[2u * i + 1u] = bitcast<vec4<u32>>(g.hi);
    }
}

// PolyNorm backward from registers (x and dy of one dtype, rows of whole chunks): the row's
// chunks of x and dy are loaded once; Σ dy·n_k (n3 = x³·inv3, n2 = x²·inv2, n1 = x·inv1) and
// Σ dy in two pair sums; m_k = w_k·Σ dy·n_k / n, dx as `poly_backward_columns` from the
// registers (F32, `put_dx`). The weights are scalars, so their gradients are those row sums
// summed over the rows: lane 0 writes the weights' k-major, partials[k·rows + row], and the
// bias's to rowinfo_out[row], which the host sums (`reduce::sum_rows`: a fixed order).

// (Σ dy·n3, Σ dy·n2, Σ dy·n1, Σ dy) over the lane's k-th chunks.
fn poly_dots(w: vec4<u32>, g: vec4<u32>, k: u32, lid: u32, n: u32, inv: vec3<f32>) -> vec4<f32> {
    if (!has(k, lid, n)) {
        return vec4<f32>();
    }
    let v = vals(w, DX);
    let d = vals(g, DX);
    let v2 = vmul(v, v);
    let n3 = vscale(vmul(v2, v), inv.x);
    let n2 = vscale(v2, inv.y);
    let n1 = vscale(v, inv.z);
    return vec4<f32>(vdot(d, n3), vdot(d, n2), vdot(d, n1), vtotal(d));
}

fn poly_dx(w: vec4<u32>, g: vec4<u32>, k: u32, lid: u32, n: u32, base: u32, inv: vec3<f32>,
           wt: vec3<f32>, m: vec3<f32>) {
    if (!has(k, lid, n)) {
        return;
    }
    let v = vals(w, DX);
    let d = vals(g, DX);
    let v2 = vmul(v, v);
    let n3 = vscale(vmul(v2, v), inv.x);
    let n2 = vscale(v2, inv.y);
    let n1 = vscale(v, inv.z);
    let g3 = vscale(vsub(vscale(d, wt.x), vscale(n3, m.x)), inv.x);
    let g2 = vscale(vsub(vscale(d, wt.y), vscale(n2, m.y)), inv.y);
    let g1 = vscale(vsub(vscale(d, wt.z), vscale(n1, m.z)), inv.z);
    let dx3 = vmul(g3, vscale(v2, 3.0));
    let dx2 = vmul(g2, vscale(v, 2.0));
    put_dx(vadd(vadd(dx3, dx2), g1), base + lid + k * lanes());
}

@compute @workgroup_size(WG)
fn poly_backward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let c = x_chunks(lid, n, base);
    let g = dy_chunks(lid, n, base);
    let inv = vec3<f32>(inv_in[3u * row], inv_in[3u * row + 1u], inv_in[3u * row + 2u]);
    let sums = ((poly_dots(c.c0, g.c0, 0u, lid, n, inv) + poly_dots(c.c1, g.c1, 1u, lid, n, inv))
        + (poly_dots(c.c2, g.c2, 2u, lid, n, inv) + poly_dots(c.c3, g.c3, 3u, lid, n, inv)))
        + ((poly_dots(c.c4, g.c4, 4u, lid, n, inv) + poly_dots(c.c5, g.c5, 5u, lid, n, inv))
        + (poly_dots(c.c6, g.c6, 6u, lid, n, inv) + poly_dots(c.c7, g.c7, 7u, lid, n, inv)));
    let s32 = row_sum2(sums.xy, lid);
    let s1b = row_sum2(sums.zw, lid);
    let count = f32(params.cols);
    let wt = vec3<f32>(ld_w(0u), ld_w(1u), ld_w(2u));
    let m = vec3<f32>(wt.x * s32.x / count, wt.y * s32.y / count, wt.z * s1b.x / count);
    if (lid == 0u) {
        let rows = params.rows;
        partials[row] = s32.x;
        partials[rows + row] = s32.y;
        partials[2u * rows + row] = s1b.x;
        rowinfo_out[row] = s1b.y;
    }
    poly_dx(c.c0, g.c0, 0u, lid, n, base, inv, wt, m);
    poly_dx(c.c1, g.c1, 1u, lid, n, base, inv, wt, m);
    poly_dx(c.c2, g.c2, 2u, lid, n, base, inv, wt, m);
    poly_dx(c.c3, g.c3, 3u, lid, n, base, inv, wt, m);
    poly_dx(c.c4, g.c4, 4u, lid, n, base, inv, wt, m);
    poly_dx(c.c5, g.c5, 5u, lid, n, base, inv, wt, m);
    poly_dx(c.c6, g.c6, 6u, lid, n, base, inv, wt, m);
    poly_dx(c.c7, g.c7, 7u, lid, n, base, inv, wt, m);
}

// GroupNorm backward from registers (x and dy of one dtype; rows (sample, group) of whole
// chunks, each chunk within one channel): the row's chunks of x and dy are loaded once;
// n = ((x − mean) − corr)·inv, dn = dy·(offset + w[channel]); c1 = mean(dn), c2 = mean(dn·n)
// in one pair sum; dx = inv·((dn − c1) − n·c2) from the registers (F32, `put_dx`), as
// `backward_rows` and `backward_columns` compute it. Lane 0 writes the row's inv, mean and corr
// to rowinfo_out for `group_partials`, which sums the parameter gradients per channel. One
// row a workgroup or a segment (SEG), as the forward.

fn group_n(w: vec4<u32>, mean: f32, corr: f32, inv: f32) -> Vals {
    return vscale(vcenter(vals(w, DX), mean, corr), inv);
}

// (Σ dn, Σ dn·n) over the lane's k-th chunks.
fn group_dots(w: vec4<u32>, g: vec4<u32>, k: u32, lid: u32, n: u32, row: u32, mean: f32,
              corr: f32, inv: f32) -> vec2<f32> {
    if (!has(k, lid, n)) {
        return vec2<f32>();
    }
    let nrm = group_n(w, mean, corr, inv);
    let dn = vscale(vals(g, DX), weight_factor(group_channel(row, lid + k * lanes())));
    return vec2<f32>(vtotal(dn), vdot(dn, nrm));
}

fn group_dx(w: vec4<u32>, g: vec4<u32>, k: u32, lid: u32, n: u32, row: u32, mean: f32,
            corr: f32, inv: f32, c: vec2<f32>) {
    if (!has(k, lid, n)) {
        return;
    }
    let q = lid + k * lanes();
    let nrm = group_n(w, mean, corr, inv);
    let dn = vscale(vals(g, DX), weight_factor(group_channel(row, q)));
    let c1 = Vals(vec4<f32>(c.x), vec4<f32>(c.x));
    put_dx(vscale(vsub(vsub(dn, c1), vscale(nrm, c.y)), inv), row * n + q);
}

// With GROUP_SUMS (segments whose lanes' k-th chunks all lie in one channel: the chunks a
// channel, spatial / chunk length, a multiple of SEG), the kernel also writes the parameter
// partials `group_partials` would: per chunk, (Σ dy·n, Σ dy) over its values, summed over the
// segment's lanes (`segment_pairs`), then over the channel's chunks in order by lane 0, into
// `rowinfo_out` (bound to the partials then) as row `sample` of the `[samples, 2 · channels]`
// matrix. x and dy are then read once in all.
override GROUP_SUMS: bool = false;

// (Σ dy·n, Σ dy) over the lane's k-th chunk, summed over the segment's lanes.
fn group_param_sums(w: vec4<u32>, g: vec4<u32>, k: u32, lid: u32, n: u32, mean: f32, corr: f32,
                    inv: f32) -> vec2<f32> {
    if (k >= CHUNKS) {
        return vec2<f32>();
    }
    var p = vec2<f32>();
    if (has(k, lid, n)) {
        let d = vals(g, DX);
        p = vec2<f32>(vdot(d, group_n(w, mean, corr, inv)), vtotal(d));
    }
    return segment_pairs(p, SEG, PAIR_SUM);
}

// Adds the k-th chunks' sums `p` to `acc`; at the channel's last chunk writes and clears it.
fn group_param_put(acc: ptr<function, vec2<f32>>, p: vec2<f32>, k: u32, n: u32, row: u32) {
    if (k >= CHUNKS || k * SEG >= n) {
        return;
    }
    *acc = *acc + p;
    let per_channel = params.spatial / chunk_len();
    if (((k + 1u) * SEG) % per_channel == 0u) {
        let channels = params.groups * params.channels_per_group;
        let ch = (row % params.groups) * params.channels_per_group + (k * SEG) / per_channel;
        let at = (row / params.groups) * 2u * channels + ch;
        rowinfo_out[at] = (*acc).x;
        rowinfo_out[at + channels] = (*acc).y;
        *acc = vec2<f32>();
    }
}

@compute @workgroup_size(WG)
fn group_backward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
    let at = row_lane(wid, nwg, lid);
    let row = at.x;
    let lane = at.y;
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let c = x_chunks(lane, n, base);
    let g = dy_chunks(lane, n, base);
    let inv = inv_in[row];
    let mean = mean_in[row];
    let corr = corr_in[row];
    let sums = ((group_dots(c.c0, g.c0, 0u, lane, n, row, mean, corr, inv)
        + group_dots(c.c1, g.c1, 1u, lane, n, row, mean, corr, inv))
        + (group_dots(c.c2, g.c2, 2u, lane, n, row, mean, corr, inv)
        + group_dots(c.c3, g.c3, 3u, lane, n, row, mean, corr, inv)))
        + ((group_dots(c.c4, g.c4, 4u, lane, n, row, mean, corr, inv)
        + group_dots(c.c5, g.c5, 5u, lane, n, row, mean, corr, inv))
        + (group_dots(c.c6, g.c6, 6u, lane, n, row, mean, corr, inv)
        + group_dots(c.c7, g.c7, 7u, lane, n, row, mean, corr, inv)));
    let consts = row_sum2(sums, lane) / f32(params.cols);
    // With GROUP_SUMS the binding holds the parameter partials instead (eight storage
    // bindings in all), and no pass reads the row constants.
    if (lane == 0u && !GROUP_SUMS) {
        rowinfo_out[ROWINFO * row] = inv;
        rowinfo_out[ROWINFO * row + 1u] = mean;
        rowinfo_out[ROWINFO * row + 2u] = corr;
    }
    group_dx(c.c0, g.c0, 0u, lane, n, row, mean, corr, inv, consts);
    group_dx(c.c1, g.c1, 1u, lane, n, row, mean, corr, inv, consts);
    group_dx(c.c2, g.c2, 2u, lane, n, row, mean, corr, inv, consts);
    group_dx(c.c3, g.c3, 3u, lane, n, row, mean, corr, inv, consts);
    group_dx(c.c4, g.c4, 4u, lane, n, row, mean, corr, inv, consts);
    group_dx(c.c5, g.c5, 5u, lane, n, row, mean, corr, inv, consts);
    group_dx(c.c6, g.c6, 6u, lane, n, row, mean, corr, inv, consts);
    group_dx(c.c7, g.c7, 7u, lane, n, row, mean, corr, inv, consts);
    if (GROUP_SUMS) {
        let p0 = group_param_sums(c.c0, g.c0, 0u, lane, n, mean, corr, inv);
        let p1 = group_param_sums(c.c1, g.c1, 1u, lane, n, mean, corr, inv);
        let p2 = group_param_sums(c.c2, g.c2, 2u, lane, n, mean, corr, inv);
        let p3 = group_param_sums(c.c3, g.c3, 3u, lane, n, mean, corr, inv);
        let p4 = group_param_sums(c.c4, g.c4, 4u, lane, n, mean, corr, inv);
        let p5 = group_param_sums(c.c5, g.c5, 5u, lane, n, mean, corr, inv);
        let p6 = group_param_sums(c.c6, g.c6, 6u, lane, n, mean, corr, inv);
        let p7 = group_param_sums(c.c7, g.c7, 7u, lane, n, mean, corr, inv);
        if (lane == 0u) {
            var acc = vec2<f32>();
            group_param_put(&acc, p0, 0u, n, row);
            group_param_put(&acc, p1, 1u, n, row);
            group_param_put(&acc, p2, 2u, n, row);
            group_param_put(&acc, p3, 3u, n, row);
            group_param_put(&acc, p4, 4u, n, row);
            group_param_put(&acc, p5, 5u, n, row);
            group_param_put(&acc, p6, 6u, n, row);
            group_param_put(&acc, p7, 7u, n, row);
        }
    }
}

// DyT backward for rows of whole chunks with dy in x's dtype: `dyt_backward_columns` with one
// invocation per (block of BLOCK_ROWS rows, column chunk), 16-byte loads of x and dy, the same
// operations per value in the same row order (the same bits); dx F32 (`put_dx`), the block's
// partials of dγ, dβ and the α columns as vec4s. params.total = blocks · chunks a row.
@compute @workgroup_size(WG)
fn dyt_backward_chunks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let n = params.cols / chunk_len();
    let block = t / n;
    let q = t % n;
    let first = block * BLOCK_ROWS;
    let last = min(first + BLOCK_ROWS, params.rows);
    let alpha = ld_aux(0u);
    let gamma = w_chunk(q);
    var pg = vzero();
    var pb = vzero();
    var pa = vzero();
    for (var r = first; r < last; r = r + 1u) {
        let i = r * n + q;
        let v = vals(x4[i], DX);
        let d = vals(dy4[i], DX);
        let th = Vals(tanh_exact4(alpha * v.lo), tanh_exact4(alpha * v.hi));
        let slope = vmul(vmul(d, gamma), vsub(Vals(vec4<f32>(1.0), vec4<f32>(1.0)), vmul(th, th)));
        put_dx(vscale(slope, alpha), i);
        pa = vadd(pa, vmul(slope, v));
        pg = vadd(pg, vmul(d, th));
        pb = vadd(pb, d);
    }
    // Partials of column chunk q of the block: F32 words block·cols + q·chunk_len onwards.
    let at = (block * params.cols + q * chunk_len()) / 4u;
    let slot = params.stride / 4u;
    part4[at] = pg.lo;
    part4[2u * slot + at] = pa.lo;
    if (HAS_B) {
        part4[slot + at] = pb.lo;
    }
    if (DX != DT_F32) {
        part4[at + 1u] = pg.hi;
        part4[2u * slot + at + 1u] = pa.hi;
        if (HAS_B) {
            part4[slot + at + 1u] = pb.hi;
        }
    }
}

// The rows of block `block` (params.block_rows rows from block · block_rows) that invocation
// `lid` of a register backward takes, and its lane within its row: every row, one after the
// other (SEG 0); or, in segments, segment s = lid / SEG takes rows first + s, first + s + WG /
// SEG, ... (its own row sums, `segment_pairs`).
struct RowsOf {
    first: u32,
    last: u32,
    step: u32,
    lane: u32,
    segment: u32,
}

fn rows_of(block: u32, lid: u32) -> RowsOf {
    let first = block * params.block_rows;
    let last = min(first + params.block_rows, params.rows);
    if (SEG == 0u) {
        return RowsOf(first, last, 1u, lid, 0u);
    }
    let seg = max(SEG, 1u);
    return RowsOf(first + lid / seg, last, WG / seg, lid % seg, lid / seg);
}

// The segments' partials of one chunk slot, added across the segments (segments run on
// 256-lane workgroups only): the low and high vec4 of each invocation's Vals, at [lid] and
// [WG + lid]. Sized by the host: 2 · WG for a backward in segments, else 1, so that no other pipeline holds workgroup memory it
// does not use (8 KiB of it had made the H200's 8,192-wide backwards up to 27% slower).
override SEG_PARTS: u32 = 1u;
var<workgroup> segment_parts: array<vec4<f32>, SEG_PARTS>;

// The block's partials of slot `slot` for the lane's k-th chunk (`put_part`); in segments,
// first the segments' sums of the same columns added in segment order (through workgroup
// memory: two barriers; call from uniform control flow).
fn put_block_part(acc: Vals, slot: u32, block: u32, k: u32, r: RowsOf, n: u32) {
    if (SEG == 0u) {
        put_part(acc, slot, block, k, r.lane, n);
        return;
    }
    if (k >= CHUNKS) {
        return;
    }
    let seg = max(SEG, 1u);
    let me = r.segment * seg + r.lane;
    segment_parts[me] = acc.lo;
    segment_parts[WG + me] = acc.hi;
    workgroupBarrier();
    if (r.segment == 0u) {
        var total = vzero();
        for (var t = 0u; t < WG / seg; t = t + 1u) {
            let at = t * seg + r.lane;
            total = vadd(total, Vals(segment_parts[at], segment_parts[WG + at]));
        }
        put_part(total, slot, block, k, r.lane, n);
    }
    workgroupBarrier();
}

// The block's partials of slot `slot` for the lane's k-th chunk.
fn put_part(acc: Vals, slot: u32, block: u32, k: u32, lid: u32, n: u32) {
    if (!has(k, lid, n)) {
        return;
    }
    let q = lid + k * lanes();
    let at = (slot * params.stride + block * params.cols) / 4u;
    if (DX == DT_F32) {
        part4[at + q] = acc.lo;
    } else {
        part4[at + 2u * q] = acc.lo;
        part4[at + 2u * q + 1u] = acc.hi;
    }
}

// Σ dn · n over the lane's k-th chunk (RMSNorm variants): s the normalized source, d the cotangent.
fn rms_dot(s: Vals, d: Vals, k: u32, lid: u32, n: u32, inv: f32) -> f32 {
    if (!has(k, lid, n)) {
        return 0.0;
    }
    return vdot(vmul(d, wf_chunk(lid + k * lanes())), vscale(s, inv));
}

// dx = inv · (dn − n · c2) (+ the residual-sum cotangent) of the lane's k-th chunk, and the
// weight partial dy · n added to `acc`.
fn rms_step(acc: ptr<function, Vals>, s_held: Vals, d_held: Vals, k: u32, lid: u32, n: u32, base: u32, inv: f32,
            c2: f32) {
    if (!has(k, lid, n)) {
        return;
    }
    let q = lid + k * lanes();
    var s = s_held;
    var d = d_held;
    if (RELOAD) {
        s = rms_source(k, lid, n, base);
        d = vals(dy4[base + q], DX);
    }
    let nrm = vscale(s, inv);
    var g = vscale(vsub(vmul(d, wf_chunk(q)), vscale(nrm, c2)), inv);
    if (HAS_DRES) {
        g = vadd(g, vals(dr4[base + q], DX));
    }
    put_dx(g, base + q);
    *acc = vadd(*acc, vmul(d, nrm));
}

// The lane's k-th chunk of the normalized source: x (RMSNorm) or x + residual (add+RMSNorm).
fn rms_source(k: u32, lid: u32, n: u32, base: u32) -> Vals {
    if (!has(k, lid, n)) {
        return vzero();
    }
    let i = base + lid + k * lanes();
    if (KIND == KIND_ADD) {
        return vadd(vals(x4[i], DX), vals(r4[i], DX));
    }
    return vals(x4[i], DX);
}

@compute @workgroup_size(WG)
fn rms_backward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let block = group_index(wid, nwg);
    if (block * params.block_rows >= params.rows) {
        return;
    }
    let r = rows_of(block, lid);
    let lane = r.lane;
    let n = params.cols / chunk_len();
    var a0 = vzero();
    var a1 = vzero();
    var a2 = vzero();
    var a3 = vzero();
    var a4 = vzero();
    var a5 = vzero();
    var a6 = vzero();
    var a7 = vzero();
    for (var row = r.first; row < r.last; row = row + r.step) {
        let base = row * n;
        let inv = inv_in[row];
        let s0 = rms_source(0u, lane, n, base);
        let s1 = rms_source(1u, lane, n, base);
        let s2 = rms_source(2u, lane, n, base);
        let s3 = rms_source(3u, lane, n, base);
        let s4_ = rms_source(4u, lane, n, base);
        let s5 = rms_source(5u, lane, n, base);
        let s6 = rms_source(6u, lane, n, base);
        let s7 = rms_source(7u, lane, n, base);
        let d0 = vals(ld_dy4(0u, lane, n, base), DX);
        let d1 = vals(ld_dy4(1u, lane, n, base), DX);
        let d2 = vals(ld_dy4(2u, lane, n, base), DX);
        let d3 = vals(ld_dy4(3u, lane, n, base), DX);
        let d4 = vals(ld_dy4(4u, lane, n, base), DX);
        let d5 = vals(ld_dy4(5u, lane, n, base), DX);
        let d6 = vals(ld_dy4(6u, lane, n, base), DX);
        let d7 = vals(ld_dy4(7u, lane, n, base), DX);
        let t = ((rms_dot(s0, d0, 0u, lane, n, inv) + rms_dot(s1, d1, 1u, lane, n, inv))
            + (rms_dot(s2, d2, 2u, lane, n, inv) + rms_dot(s3, d3, 3u, lane, n, inv)))
            + ((rms_dot(s4_, d4, 4u, lane, n, inv) + rms_dot(s5, d5, 5u, lane, n, inv))
            + (rms_dot(s6, d6, 6u, lane, n, inv) + rms_dot(s7, d7, 7u, lane, n, inv)));
        let c2 = row_sum(t, lane) / f32(params.cols);
        rms_step(&a0, s0, d0, 0u, lane, n, base, inv, c2);
        rms_step(&a1, s1, d1, 1u, lane, n, base, inv, c2);
        rms_step(&a2, s2, d2, 2u, lane, n, base, inv, c2);
        rms_step(&a3, s3, d3, 3u, lane, n, base, inv, c2);
        rms_step(&a4, s4_, d4, 4u, lane, n, base, inv, c2);
        rms_step(&a5, s5, d5, 5u, lane, n, base, inv, c2);
        rms_step(&a6, s6, d6, 6u, lane, n, base, inv, c2);
        rms_step(&a7, s7, d7, 7u, lane, n, base, inv, c2);
    }
    if (HAS_W) {
        put_block_part(a0, 0u, block, 0u, r, n);
        put_block_part(a1, 0u, block, 1u, r, n);
        put_block_part(a2, 0u, block, 2u, r, n);
        put_block_part(a3, 0u, block, 3u, r, n);
        put_block_part(a4, 0u, block, 4u, r, n);
        put_block_part(a5, 0u, block, 5u, r, n);
        put_block_part(a6, 0u, block, 6u, r, n);
        put_block_part(a7, 0u, block, 7u, r, n);
    }
}

// LayerNorm: Σ dn and Σ dn · n over the lane's k-th chunk.
fn ln_sums(x: vec4<u32>, d: Vals, k: u32, lid: u32, n: u32, mean: f32, corr: f32, inv: f32) -> vec2<f32> {
    if (!has(k, lid, n)) {
        return vec2<f32>();
    }
    let nrm = vscale(vcenter(vals(x, DX), mean, corr), inv);
    let dn = vmul(d, wf_chunk(lid + k * lanes()));
    return vec2<f32>(vtotal(dn), vdot(dn, nrm));
}

// dx = inv · ((dn − c1) − n · c2) of the lane's k-th chunk; dy · n added to `aw`, dy to `ab`.
fn ln_step(aw: ptr<function, Vals>, ab: ptr<function, Vals>, x: vec4<u32>, d: Vals, k: u32, lid: u32, n: u32,
           base: u32, mean: f32, corr: f32, inv: f32, c: vec2<f32>) {
    if (!has(k, lid, n)) {
        return;
    }
    let q = lid + k * lanes();
    let nrm = vscale(vcenter(vals(x, DX), mean, corr), inv);
    let dn = vmul(d, wf_chunk(q));
    let g = Vals((dn.lo - c.x) - nrm.lo * c.y, (dn.hi - c.x) - nrm.hi * c.y);
    put_dx(vscale(g, inv), base + q);
    *aw = vadd(*aw, vmul(d, nrm));
    *ab = vadd(*ab, d);
}

@compute @workgroup_size(WG)
fn layer_backward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
    let block = group_index(wid, nwg);
    if (block * params.block_rows >= params.rows) {
        return;
    }
    let r = rows_of(block, lid);
    let lane = r.lane;
    let n = params.cols / chunk_len();
    var a0 = vzero();
    var a1 = vzero();
    var a2 = vzero();
    var a3 = vzero();
    var a4 = vzero();
    var a5 = vzero();
    var a6 = vzero();
    var a7 = vzero();
    var b0 = vzero();
    var b1 = vzero();
    var b2 = vzero();
    var b3 = vzero();
    var b4_ = vzero();
    var b5 = vzero();
    var b6 = vzero();
    var b7 = vzero();
    for (var row = r.first; row < r.last; row = row + r.step) {
        let base = row * n;
        let inv = inv_in[row];
        let mean = mean_in[row];
        let corr = corr_in[row];
        let x0 = ld_x4(0u, lane, n, base);
        let x1 = ld_x4(1u, lane, n, base);
        let x2 = ld_x4(2u, lane, n, base);
        let x3 = ld_x4(3u, lane, n, base);
        let x4_ = ld_x4(4u, lane, n, base);
        let x5 = ld_x4(5u, lane, n, base);
        let x6 = ld_x4(6u, lane, n, base);
        let x7 = ld_x4(7u, lane, n, base);
        let d0 = vals(ld_dy4(0u, lane, n, base), DX);
        let d1 = vals(ld_dy4(1u, lane, n, base), DX);
        let d2 = vals(ld_dy4(2u, lane, n, base), DX);
        let d3 = vals(ld_dy4(3u, lane, n, base), DX);
        let d4 = vals(ld_dy4(4u, lane, n, base), DX);
        let d5 = vals(ld_dy4(5u, lane, n, base), DX);
        let d6 = vals(ld_dy4(6u, lane, n, base), DX);
        let d7 = vals(ld_dy4(7u, lane, n, base), DX);
        let t = ((ln_sums(x0, d0, 0u, lane, n, mean, corr, inv) + ln_sums(x1, d1, 1u, lane, n, mean, corr, inv))
            + (ln_sums(x2, d2, 2u, lane, n, mean, corr, inv) + ln_sums(x3, d3, 3u, lane, n, mean, corr, inv)))
            + ((ln_sums(x4_, d4, 4u, lane, n, mean, corr, inv) + ln_sums(x5, d5, 5u, lane, n, mean, corr, inv))
            + (ln_sums(x6, d6, 6u, lane, n, mean, corr, inv) + ln_sums(x7, d7, 7u, lane, n, mean, corr, inv)));
        let c = row_sum2(t, lane) / f32(params.cols);
        ln_step(&a0, &b0, x0, d0, 0u, lane, n, base, mean, corr, inv, c);
        ln_step(&a1, &b1, x1, d1, 1u, lane, n, base, mean, corr, inv, c);
        ln_step(&a2, &b2, x2, d2, 2u, lane, n, base, mean, corr, inv, c);
        ln_step(&a3, &b3, x3, d3, 3u, lane, n, base, mean, corr, inv, c);
        ln_step(&a4, &b4_, x4_, d4, 4u, lane, n, base, mean, corr, inv, c);
        ln_step(&a5, &b5, x5, d5, 5u, lane, n, base, mean, corr, inv, c);
        ln_step(&a6, &b6, x6, d6, 6u, lane, n, base, mean, corr, inv, c);
        ln_step(&a7, &b7, x7, d7, 7u, lane, n, base, mean, corr, inv, c);
    }
    if (HAS_W) {
        put_block_part(a0, 0u, block, 0u, r, n);
        put_block_part(a1, 0u, block, 1u, r, n);
        put_block_part(a2, 0u, block, 2u, r, n);
        put_block_part(a3, 0u, block, 3u, r, n);
        put_block_part(a4, 0u, block, 4u, r, n);
        put_block_part(a5, 0u, block, 5u, r, n);
        put_block_part(a6, 0u, block, 6u, r, n);
        put_block_part(a7, 0u, block, 7u, r, n);
    }
    if (HAS_B) {
        put_block_part(b0, 1u, block, 0u, r, n);
        put_block_part(b1, 1u, block, 1u, r, n);
        put_block_part(b2, 1u, block, 2u, r, n);
        put_block_part(b3, 1u, block, 3u, r, n);
        put_block_part(b4_, 1u, block, 4u, r, n);
        put_block_part(b5, 1u, block, 5u, r, n);
        put_block_part(b6, 1u, block, 6u, r, n);
        put_block_part(b7, 1u, block, 7u, r, n);
    }
}

// ---- Chunk passes: rows too wide for the register backward ----
// RMSNorm, LayerNorm and add+RMSNorm rows of whole chunks (residual and cotangents in the
// source's dtype) that the register backward does not hold: the general path's two passes and
// its partials, read in 16-byte chunks instead of word by word.
// * `backward_rows_chunks`: one workgroup a row; lane t adds Σ dn and Σ dn·n over the row's
//   chunks t, t + WG, ... (four loaded at a time, in that order), then the row sum; rowinfo as
//   `backward_rows` writes it.
// * `backward_column_units`: invocation t owns unit t mod (cols / UNIT) of block
//   t / (cols / UNIT) (blocks of BLOCK_ROWS rows, `block_rows`), UNIT = `unit_len()` values:
//   a whole chunk (8 values) where both the source and dx are 16-bit (one 16-byte store of
//   dx), else 4 (an F32 chunk, or half of a 16-bit chunk, whose lane then writes one F32 vec4
//   of dx, so a workgroup's stores stay contiguous; two lanes load that chunk, one sector). It walks the block's rows two at a time
//   (both rows' loads first), writes dx = inv·((dn − c1) − n·c2) (+ the residual-sum
//   cotangent) and the block's partials of its columns (dy·n in slot 0, dy in slot 1).

// Values of one unit of `backward_column_units`.
fn unit_len() -> u32 {
    if (DX != DT_F32 && DDX != DT_F32) {
        return 8u;
    }
    return 4u;
}

// The row chunk holding unit u, and the unit's values from that chunk's words.
fn unit_chunk(u: u32) -> u32 {
    if (DX != DT_F32 && DDX == DT_F32) {
        return u >> 1u;
    }
    return u;
}

fn unit_vals(w: vec4<u32>, u: u32) -> Vals {
    if (DX != DT_F32 && DDX == DT_F32) {
        let h = select(w.xy, w.zw, (u & 1u) == 1u);
        return Vals(vec4<f32>(widen2(h.x, DX), widen2(h.y, DX)), vec4<f32>());
    }
    return vals(w, DX);
}

// Weight factors of unit u (offset + w, or 1 without a weight): `wf_chunk` of its chunk, or
// that chunk's half.
fn unit_wf(u: u32) -> Vals {
    return unit_part(wf_chunk(unit_chunk(u)), u);
}

// Unit u's values of its chunk's values v: all of them, or the half it owns.
fn unit_part(v: Vals, u: u32) -> Vals {
    if (DX != DT_F32 && DDX == DT_F32) {
        return Vals(select(v.lo, v.hi, (u & 1u) == 1u), vec4<f32>());
    }
    return v;
}

// (Σ dn, Σ dn·n) of row chunk q (row starting at chunk `base`, n chunks; zeros past the row).
fn chunk_sums(q: u32, n: u32, base: u32, mean: f32, corr: f32, inv: f32) -> vec2<f32> {
    if (q >= n) {
        return vec2<f32>();
    }
    return chunk_sums_by(q, base, mean, corr, inv, wf_chunk(q));
}

// (Σ dn, Σ dn·n) of row chunk q whose dn = dy·g.
fn chunk_sums_by(q: u32, base: u32, mean: f32, corr: f32, inv: f32, g: Vals) -> vec2<f32> {
    var s = vals(x4[base + q], DX);
    if (KIND == KIND_ADD) {
        s = vadd(s, vals(r4[base + q], DX));
    }
    let dn = vmul(vals(dy4[base + q], DX), g);
    return vec2<f32>(vtotal(dn), vdot(dn, vscale(vcenter(s, mean, corr), inv)));
}

// The row constants of `row` from the means (Σ dn, Σ dn·n)/cols, as `backward_rows` writes them.
fn put_rowinfo(row: u32, inv: f32, mean: f32, corr: f32, sums: vec2<f32>) {
    rowinfo_out[ROWINFO * row] = inv;
    rowinfo_out[ROWINFO * row + 1u] = mean;
    rowinfo_out[ROWINFO * row + 2u] = corr;
    rowinfo_out[ROWINFO * row + 3u] = select(0.0, sums.x, centered());
    rowinfo_out[ROWINFO * row + 4u] = sums.y;
}

@compute @workgroup_size(WG)
fn backward_rows_chunks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let inv = inv_in[row];
    var mean = 0.0;
    var corr = 0.0;
    if (centered()) {
        mean = mean_in[row];
        corr = corr_in[row];
    }
    var acc = vec2<f32>();
    for (var q = lid; q < n; q = q + 4u * WG) {
        let t = (chunk_sums(q, n, base, mean, corr, inv) + chunk_sums(q + WG, n, base, mean, corr, inv))
            + (chunk_sums(q + 2u * WG, n, base, mean, corr, inv) + chunk_sums(q + 3u * WG, n, base, mean, corr, inv));
        acc = acc + t;
    }
    let sums = row_sum2(acc, lid) / f32(params.cols);
    if (lid == 0u) {
        put_rowinfo(row, inv, mean, corr, sums);
    }
}

// One row's loaded words of a unit: source, residual (add+RMSNorm), cotangent, residual-sum
// cotangent (HAS_DRES).
struct UnitWords {
    x: vec4<u32>,
    r: vec4<u32>,
    d: vec4<u32>,
    dr: vec4<u32>,
}

fn unit_words(row: u32, n: u32, q: u32) -> UnitWords {
    let i = row * n + q;
    var w = plain_unit_words(row, n, q);
    if (KIND == KIND_ADD) {
        w.r = r4[i];
    }
    if (HAS_DRES) {
        w.dr = dr4[i];
    }
    return w;
}

// The source and cotangent words only (no residual words).
fn plain_unit_words(row: u32, n: u32, q: u32) -> UnitWords {
    let i = row * n + q;
    return UnitWords(x4[i], vec4<u32>(), dy4[i], vec4<u32>());
}

// dx of unit u of `row` from its words (dn = dy·g); dy·n added to `pw`, dy to `pb`.
fn unit_step(pw: ptr<function, Vals>, pb: ptr<function, Vals>, w: UnitWords, row: u32, u: u32,
             g: Vals) {
    let inv = rowinfo[ROWINFO * row];
    let mean = rowinfo[ROWINFO * row + 1u];
    let corr = rowinfo[ROWINFO * row + 2u];
    let c1 = rowinfo[ROWINFO * row + 3u];
    let c2 = rowinfo[ROWINFO * row + 4u];
    var s = unit_vals(w.x, u);
    if (KIND == KIND_ADD) {
        s = vadd(s, unit_vals(w.r, u));
    }
    let d = unit_vals(w.d, u);
    let nrm = vscale(vcenter(s, mean, corr), inv);
    let dn = vmul(d, g);
    var v = vscale(Vals((dn.lo - c1) - nrm.lo * c2, (dn.hi - c1) - nrm.hi * c2), inv);
    if (HAS_DRES) {
        v = vadd(v, unit_vals(w.dr, u));
    }
    let units = params.cols / unit_len();
    if (unit_len() == 8u) {
        dx4[row * units + u] = narrow8(v.lo, v.hi, DDX);
    } else {
        dx4[row * units + u] = bitcast<vec4<u32>>(v.lo);
    }
    *pw = vadd(*pw, vmul(d, nrm));
    *pb = vadd(*pb, d);
}

// The block's partials of slot `slot` for unit u.
fn put_unit_part(acc: Vals, slot: u32, block: u32, u: u32) {
    let at = (slot * params.stride + block * params.cols) / 4u;
    if (unit_len() == 8u) {
        part4[at + 2u * u] = acc.lo;
        part4[at + 2u * u + 1u] = acc.hi;
    } else {
        part4[at + u] = acc.lo;
    }
}

@compute @workgroup_size(WG)
fn backward_column_units(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let units = params.cols / unit_len();
    let block = t / units;
    let u = t % units;
    let q = unit_chunk(u);
    let n = params.cols / chunk_len();
    let span = block_rows(block);
    let g = unit_wf(u);
    var pw = vzero();
    var pb = vzero();
    for (var row = span.x; row < span.y; row = row + 2u) {
        let a = unit_words(row, n, q);
        let two = row + 1u < span.y;
        var b = a;
        if (two) {
            b = unit_words(row + 1u, n, q);
        }
        unit_step(&pw, &pb, a, row, u, g);
        if (two) {
            unit_step(&pw, &pb, b, row + 1u, u, g);
        }
    }
    if (HAS_W) {
        put_unit_part(pw, 0u, block, u);
    }
    if (HAS_B) {
        put_unit_part(pb, 1u, block, u);
    }
}

// ---- Chunk passes of modulated RMSNorm ----
// The two passes above for modulated RMSNorm (source and cotangent of one dtype, the scale of
// any), in entries of their own: the scale's bindings would take the others past eight
// storage bindings. A row of modulation batch b has dn = dy·(offset + w)·(1 + scale[b]); a
// column pass block lies in one batch, so it sums dy·n and dy over its rows and writes the
// partials `backward_columns` writes, each product taken once at the end: (1 + scale)·Σ dy·n
// (slot 0, the weight), Σ dy (slot 1, the shift), (offset + w)·Σ dy·n (slot 2, the scale).

// 1 + scale of row chunk q of modulation batch `batch` (rows of n chunks).
fn scale_factors(batch: u32, n: u32, q: u32) -> Vals {
    let s = scale_chunk(batch * n + q);
    return Vals(1.0 + s.lo, 1.0 + s.hi);
}

// `chunk_sums` of a modulated row of batch `batch`.
fn mod_chunk_sums(q: u32, n: u32, base: u32, batch: u32, inv: f32) -> vec2<f32> {
    if (q >= n) {
        return vec2<f32>();
    }
    return chunk_sums_by(q, base, 0.0, 0.0, inv, vmul(wf_chunk(q), scale_factors(batch, n, q)));
}

@compute @workgroup_size(WG)
fn mod_backward_rows_chunks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let batch = row / params.rows_per_batch;
    let inv = inv_in[row];
    var acc = vec2<f32>();
    for (var q = lid; q < n; q = q + 4u * WG) {
        let t = (mod_chunk_sums(q, n, base, batch, inv) + mod_chunk_sums(q + WG, n, base, batch, inv))
            + (mod_chunk_sums(q + 2u * WG, n, base, batch, inv) + mod_chunk_sums(q + 3u * WG, n, base, batch, inv));
        acc = acc + t;
    }
    let sums = row_sum2(acc, lid) / f32(params.cols);
    if (lid == 0u) {
        put_rowinfo(row, inv, 0.0, 0.0, sums);
    }
}

@compute @workgroup_size(WG)
fn mod_backward_column_units(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                             @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let units = params.cols / unit_len();
    let block = t / units;
    let u = t % units;
    let q = unit_chunk(u);
    let n = params.cols / chunk_len();
    let span = block_rows(block);
    let wf = unit_wf(u);
    let sc = unit_part(scale_factors(block / params.blocks_per_batch, n, q), u);
    let g = vmul(wf, sc);
    var pn = vzero();
    var pd = vzero();
    for (var row = span.x; row < span.y; row = row + 2u) {
        let a = plain_unit_words(row, n, q);
        let two = row + 1u < span.y;
        var b = a;
        if (two) {
            b = plain_unit_words(row + 1u, n, q);
        }
        unit_step(&pn, &pd, a, row, u, g);
        if (two) {
            unit_step(&pn, &pd, b, row + 1u, u, g);
        }
    }
    if (HAS_W) {
        put_unit_part(vmul(sc, pn), 0u, block, u);
    }
    put_unit_part(pd, 1u, block, u);
    put_unit_part(vmul(wf, pn), 2u, block, u);
}

// ---- Register backward, words kept: add+RMSNorm 16-bit and the 1,024-lane path ----
// `rms_backward_words` computes what `rms_backward_registers` does, with the same operations in
// the same order (bit-identical results), but holds the source, residual and cotangent chunks
// across the row sum as their loaded words (vec4<u32>), not as widened values. Without RELOAD
// the second use widens the words again from `rewiden(w)` = `w ^ params.base`: `base` is 0 in
// every register backward launch, but the compiler cannot know it, so it keeps the words (half
// the registers of 16-bit values) instead of the first widening. With RELOAD (1,024 lanes) the
// second use reads the row again, as `rms_backward_registers` does. The host takes this entry
// for add+RMSNorm and 16-bit sources on 256 lanes (with PREFETCH where dx is F32) and for
// every RELOAD launch, where it measured faster; other RMSNorm and all LayerNorm launches take
// the entries above.

// Weight partials of the lane's chunks, chunk k in wacc_k.
var<private> wacc0: Vals;
var<private> wacc1: Vals;
var<private> wacc2: Vals;
var<private> wacc3: Vals;
var<private> wacc4: Vals;
var<private> wacc5: Vals;
var<private> wacc6: Vals;
var<private> wacc7: Vals;

// The lane's k-th residual chunk of the row starting at chunk `base` (0 if absent or not add+RMSNorm).
fn ld_r4(k: u32, lid: u32, n: u32, base: u32) -> vec4<u32> {
    if (KIND == KIND_ADD && has(k, lid, n)) {
        return r4[base + lid + k * lanes()];
    }
    return vec4<u32>();
}

// Words widened again for their second use (`params.base` is 0; see above).
fn rewiden(w: vec4<u32>) -> vec4<u32> {
    if (DX == DT_F32) {
        return w;
    }
    return w ^ vec4<u32>(params.base);
}

// The normalized source of a chunk's words: x (RMSNorm) or x + residual (add+RMSNorm).
fn words_src(x: vec4<u32>, r: vec4<u32>) -> Vals {
    if (KIND == KIND_ADD) {
        return vadd(vals(x, DX), vals(r, DX));
    }
    return vals(x, DX);
}

// Σ dn · n over the lane's k-th chunk, from its words.
fn words_dot(x: vec4<u32>, r: vec4<u32>, g: vec4<u32>, k: u32, lid: u32, n: u32, inv: f32) -> f32 {
    if (!has(k, lid, n)) {
        return 0.0;
    }
    return vdot(vmul(vals(g, DX), wf_chunk(lid + k * lanes())), vscale(words_src(x, r), inv));
}

// `rms_step` from the chunk's words: dx of the lane's k-th chunk, dy · n added to `acc`.
fn words_step(acc: ptr<private, Vals>, x: vec4<u32>, r: vec4<u32>, g: vec4<u32>, k: u32, lid: u32, n: u32,
              base: u32, inv: f32, c2: f32) {
    if (!has(k, lid, n)) {
        return;
    }
    let q = lid + k * lanes();
    let i = base + q;
    var s: Vals;
    var d: Vals;
    if (RELOAD) {
        var r_now = vec4<u32>();
        if (KIND == KIND_ADD) {
            r_now = r4[i];
        }
        s = words_src(x4[i], r_now);
        d = vals(dy4[i], DX);
    } else {
        s = words_src(rewiden(x), rewiden(r));
        d = vals(rewiden(g), DX);
    }
    let nrm = vscale(s, inv);
    var v = vscale(vsub(vmul(d, wf_chunk(q)), vscale(nrm, c2)), inv);
    if (HAS_DRES) {
        v = vadd(v, vals(dr4[i], DX));
    }
    put_dx(v, i);
    *acc = vadd(*acc, vmul(d, nrm));
}

// Backward: load the next row's words right after the current row's sum, so that they are in
// flight while the current row's dx is computed and stored (`rms_backward_words` only; the
// same operations in the same order: the same bits).
override PREFETCH: bool = false;

fn r_chunks(lid: u32, n: u32, base: u32) -> Chunks {
    return Chunks(ld_r4(0u, lid, n, base), ld_r4(1u, lid, n, base), ld_r4(2u, lid, n, base),
                  ld_r4(3u, lid, n, base), ld_r4(4u, lid, n, base), ld_r4(5u, lid, n, base),
                  ld_r4(6u, lid, n, base), ld_r4(7u, lid, n, base));
}

// One row's words: source, residual (add+RMSNorm) and cotangent chunks.
struct RowWords {
    x: Chunks,
    r: Chunks,
    g: Chunks,
}

fn row_words(lid: u32, n: u32, base: u32) -> RowWords {
    return RowWords(x_chunks(lid, n, base), r_chunks(lid, n, base), dy_chunks(lid, n, base));
}

@compute @workgroup_size(WG)
fn rms_backward_words(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let block = group_index(wid, nwg);
    let first = block * params.block_rows;
    if (first >= params.rows) {
        return;
    }
    let last = min(first + params.block_rows, params.rows);
    let n = params.cols / chunk_len();
    var ahead = RowWords();
    if (PREFETCH) {
        ahead = row_words(lid, n, first * n);
    }
    for (var row = first; row < last; row = row + 1u) {
        let base = row * n;
        let inv = inv_in[row];
        var w = ahead;
        if (!PREFETCH) {
            w = row_words(lid, n, base);
        }
        let x = w.x;
        let r = w.r;
        let g = w.g;
        let t = ((words_dot(x.c0, r.c0, g.c0, 0u, lid, n, inv) + words_dot(x.c1, r.c1, g.c1, 1u, lid, n, inv))
            + (words_dot(x.c2, r.c2, g.c2, 2u, lid, n, inv) + words_dot(x.c3, r.c3, g.c3, 3u, lid, n, inv)))
            + ((words_dot(x.c4, r.c4, g.c4, 4u, lid, n, inv) + words_dot(x.c5, r.c5, g.c5, 5u, lid, n, inv))
            + (words_dot(x.c6, r.c6, g.c6, 6u, lid, n, inv) + words_dot(x.c7, r.c7, g.c7, 7u, lid, n, inv)));
        let c2 = row_sum(t, lid) / f32(params.cols);
        if (PREFETCH) {
            // The last row loads itself again (from cache) rather than branch.
            ahead = row_words(lid, n, min(row + 1u, last - 1u) * n);
        }
        words_step(&wacc0, x.c0, r.c0, g.c0, 0u, lid, n, base, inv, c2);
        words_step(&wacc1, x.c1, r.c1, g.c1, 1u, lid, n, base, inv, c2);
        words_step(&wacc2, x.c2, r.c2, g.c2, 2u, lid, n, base, inv, c2);
        words_step(&wacc3, x.c3, r.c3, g.c3, 3u, lid, n, base, inv, c2);
        words_step(&wacc4, x.c4, r.c4, g.c4, 4u, lid, n, base, inv, c2);
        words_step(&wacc5, x.c5, r.c5, g.c5, 5u, lid, n, base, inv, c2);
        words_step(&wacc6, x.c6, r.c6, g.c6, 6u, lid, n, base, inv, c2);
        words_step(&wacc7, x.c7, r.c7, g.c7, 7u, lid, n, base, inv, c2);
    }
    if (HAS_W) {
        put_part(wacc0, 0u, block, 0u, lid, n);
        put_part(wacc1, 0u, block, 1u, lid, n);
        put_part(wacc2, 0u, block, 2u, lid, n);
        put_part(wacc3, 0u, block, 3u, lid, n);
        put_part(wacc4, 0u, block, 4u, lid, n);
        put_part(wacc5, 0u, block, 5u, lid, n);
        put_part(wacc6, 0u, block, 6u, lid, n);
        put_part(wacc7, 0u, block, 7u, lid, n);
    }
}

// ---- Register backward: parameter partials finish ----
// out[c] = Σ over the blocks of partials[base + block · cols + c], in a fixed order: a
// workgroup takes 8 column quads; its 32 segments of lanes each add a run of consecutive
// blocks in order, then the first segment adds the 32 runs in order. params: cols (a multiple
// of 4), blocks_per_batch = blocks, base = first word (a multiple of 4).
const FIN_QUADS: u32 = 8u;
const FIN_SEGMENTS: u32 = 32u;
var<workgroup> fin: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn partials_finish(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let quads = params.cols / 4u;
    let v = lid % FIN_QUADS;
    let segment = lid / FIN_QUADS;
    let quad = group_index(wid, nwg) * FIN_QUADS + v;
    let blocks = params.blocks_per_batch;
    let per = (blocks + FIN_SEGMENTS - 1u) / FIN_SEGMENTS;
    let first = min(segment * per, blocks);
    let last = min(first + per, blocks);
    var acc = vec4<f32>();
    if (quad < quads) {
        let at = params.base / 4u + quad;
        for (var b = first; b < last; b = b + 1u) {
            acc = acc + part4[at + b * quads];
        }
    }
    fin[lid] = acc;
    workgroupBarrier();
    if (segment == 0u && quad < quads) {
        var total = fin[v];
        for (var s = 1u; s < FIN_SEGMENTS; s = s + 1u) {
            total = total + fin[s * FIN_QUADS + v];
        }
        dx4[quad] = bitcast<vec4<u32>>(total);
    }
}
