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

const WG: u32 = 256u;
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
    base: u32,             // finish: first word of the slot summed
    eps: f32,
    offset: f32,
    groups: u32,             // GroupNorm: groups per sample (rows = batch * groups)
    channels_per_group: u32, // GroupNorm
    spatial: u32,            // GroupNorm: elements per channel
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

// Weight factor of column c: offset + w[c], or 1 without a weight.
fn weight_factor(c: u32) -> f32 {
    if (HAS_W) {
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
    if (centered()) {
        // Sum the differences from the row's first value, so a large common offset does not
        // cost the mean its precision; the mean is kept as the FP32 value `mean` plus the
        // small correction `corr` (mean + corr = pivot + delta to about FP32 precision of
        // delta), and values are centered as (v - mean) - corr.
        let pivot = source(base);
        var acc = 0.0;
        for (var c = lid; c < cols; c = c + WG) {
            acc = acc + (source(base + c) - pivot);
        }
        let delta = workgroup_sum(acc, lid) / f32(cols);
        mean = pivot + delta;
        corr = (pivot - mean) + delta;
    }
    var squares = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        let v = (source(base + c) - mean) - corr;
        squares = squares + v * v;
    }
    let inv = 1.0 / sqrt(workgroup_sum(squares, lid) / f32(cols) + params.eps);
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
    let first = batch * params.rows_per_batch + (block % params.blocks_per_batch) * BLOCK_ROWS;
    let last = min(first + BLOCK_ROWS, (batch + 1u) * params.rows_per_batch);
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

// ---- GroupNorm parameter partials ----
// One invocation per (sample b, channel ch) of total = batch * channels: sums over the
// channel's `spatial` elements of dy * n (slot 0) and dy (slot 1), position order; the host
// then sums the samples in order. params.cols is the row length (channels_per_group *
// spatial), params.stride = batch * channels.
@compute @workgroup_size(WG)
fn group_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let channels = params.groups * params.channels_per_group;
    let b = t / channels;
    let ch = t % channels;
    let row = b * params.groups + ch / params.channels_per_group;
    let first = row * params.cols + (ch % params.channels_per_group) * params.spatial;
    let inv = rowinfo[ROWINFO * row];
    let mean = rowinfo[ROWINFO * row + 1u];
    let corr = rowinfo[ROWINFO * row + 2u];
    var pw = 0.0;
    var pb = 0.0;
    for (var s = 0u; s < params.spatial; s = s + 1u) {
        let i = first + s;
        let d = ld_dy(i);
        pw = pw + d * (((ld_x(i) - mean) - corr) * inv);
        pb = pb + d;
    }
    partials[t] = pw;
    partials[params.stride + t] = pb;
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

// ---- RMSNorm forward, register path ----
// For RMSNorm rows of at most CHUNKS × WG chunks, a chunk being one vec4<u32> word group (4 F32
// or 8 16-bit values), each lane loads its chunks of the row once into registers (straight-line
// code, no indexed private array), so the row is read from memory exactly once. The sum of
// squares adds each lane's chunks in a fixed pairwise order, then the workgroup tree: fixed,
// so bit-reproducible, though not bit-equal to `forward_rows` (another order of additions).

@group(0) @binding(18) var<storage, read> x4: array<vec4<u32>>;
@group(0) @binding(19) var<storage, read_write> y4: array<vec4<u32>>;

// Values per chunk: 4 (F32) or 8 (16-bit).
fn chunk_len() -> u32 {
    if (DX == DT_F32) {
        return 4u;
    }
    return 8u;
}

fn word_squares(word: u32) -> f32 {
    let a = half_from_word(word, 0u, DX);
    let b = half_from_word(word, 1u, DX);
    return a * a + b * b;
}

fn chunk_squares(w: vec4<u32>) -> f32 {
    if (DX == DT_F32) {
        let v = bitcast<vec4<f32>>(w);
        return dot(v, v);
    }
    // Written out (no dynamic component index, which may force the chunk out of registers).
    return (word_squares(w.x) + word_squares(w.y)) + (word_squares(w.z) + word_squares(w.w));
}

fn rms_value(n: f32, c: u32) -> f32 {
    let wf = weight_factor(c);
    if (CAST == CAST_LLAMA) {
        return round_src(n) * wf;
    }
    if (CAST == CAST_NONE) {
        return round_src(n) * round_src(wf);
    }
    return n * wf;
}

// Output chunk for input chunk `w` whose first column is c0.
fn chunk_out(w: vec4<u32>, c0: u32, inv: f32) -> vec4<u32> {
    if (DX == DT_F32) {
        let v = bitcast<vec4<f32>>(w);
        return vec4<u32>(
            bitcast<u32>(rms_value(v.x * inv, c0)),
            bitcast<u32>(rms_value(v.y * inv, c0 + 1u)),
            bitcast<u32>(rms_value(v.z * inv, c0 + 2u)),
            bitcast<u32>(rms_value(v.w * inv, c0 + 3u)));
    }
    return vec4<u32>(
        word_out(w.x, c0, inv),
        word_out(w.y, c0 + 2u, inv),
        word_out(w.z, c0 + 4u, inv),
        word_out(w.w, c0 + 6u, inv));
}

// Output word for the 16-bit input word `word` whose first column is c.
fn word_out(word: u32, c: u32, inv: f32) -> u32 {
    let a = rms_value(half_from_word(word, 0u, DX) * inv, c);
    let b = rms_value(half_from_word(word, 1u, DX) * inv, c + 1u);
    return pack_halves(a, b, DX);
}

fn load_chunk(q: u32, n: u32, base: u32) -> vec4<u32> {
    if (q < n) {
        return x4[base + q];
    }
    return vec4<u32>();
}

fn store_chunk(w: vec4<u32>, q: u32, n: u32, base: u32, inv: f32) {
    if (q < n) {
        y4[base + q] = chunk_out(w, q * chunk_len(), inv);
    }
}

@compute @workgroup_size(WG)
fn rms_forward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len(); // chunks in the row (at most 8 × WG)
    let base = row * n;
    let w0 = load_chunk(lid, n, base);
    let w1 = load_chunk(lid + WG, n, base);
    let w2 = load_chunk(lid + 2u * WG, n, base);
    let w3 = load_chunk(lid + 3u * WG, n, base);
    let w4 = load_chunk(lid + 4u * WG, n, base);
    let w5 = load_chunk(lid + 5u * WG, n, base);
    let w6 = load_chunk(lid + 6u * WG, n, base);
    let w7 = load_chunk(lid + 7u * WG, n, base);
    let squares = ((chunk_squares(w0) + chunk_squares(w1)) + (chunk_squares(w2) + chunk_squares(w3)))
        + ((chunk_squares(w4) + chunk_squares(w5)) + (chunk_squares(w6) + chunk_squares(w7)));
    let inv = 1.0 / sqrt(workgroup_sum(squares, lid) / f32(params.cols) + params.eps);
    if (lid == 0u) {
        inv_out[row] = inv;
    }
    store_chunk(w0, lid, n, base, inv);
    store_chunk(w1, lid + WG, n, base, inv);
    store_chunk(w2, lid + 2u * WG, n, base, inv);
    store_chunk(w3, lid + 3u * WG, n, base, inv);
    store_chunk(w4, lid + 4u * WG, n, base, inv);
    store_chunk(w5, lid + 5u * WG, n, base, inv);
    store_chunk(w6, lid + 6u * WG, n, base, inv);
    store_chunk(w7, lid + 7u * WG, n, base, inv);
}

// ---- LayerNorm forward, register path -------------------------------------------------------
// The same one-read scheme for LayerNorm: the chunks stay in registers through three passes
// (sum of differences from the row's first value, centered squares, output). The mean is kept
// as `mean` plus the correction `corr`, as in `forward_rows`.

fn word_delta(word: u32, pivot: f32) -> f32 {
    return (half_from_word(word, 0u, DX) - pivot) + (half_from_word(word, 1u, DX) - pivot);
}

// Sum of (value − pivot) over chunk q of the row (0 for a chunk past the row's end).
fn chunk_delta(w: vec4<u32>, q: u32, n: u32, pivot: f32) -> f32 {
    if (q >= n) {
        return 0.0;
    }
    if (DX == DT_F32) {
        let v = bitcast<vec4<f32>>(w) - vec4<f32>(pivot);
        return (v.x + v.y) + (v.z + v.w);
    }
    return (word_delta(w.x, pivot) + word_delta(w.y, pivot)) + (word_delta(w.z, pivot) + word_delta(w.w, pivot));
}

fn centered_square(v: f32, mean: f32, corr: f32) -> f32 {
    let d = (v - mean) - corr;
    return d * d;
}

fn word_centered(word: u32, mean: f32, corr: f32) -> f32 {
    return centered_square(half_from_word(word, 0u, DX), mean, corr)
        + centered_square(half_from_word(word, 1u, DX), mean, corr);
}

// Sum of centered squares over chunk q (0 past the row's end).
fn chunk_centered(w: vec4<u32>, q: u32, n: u32, mean: f32, corr: f32) -> f32 {
    if (q >= n) {
        return 0.0;
    }
    if (DX == DT_F32) {
        let v = bitcast<vec4<f32>>(w);
        return (centered_square(v.x, mean, corr) + centered_square(v.y, mean, corr))
            + (centered_square(v.z, mean, corr) + centered_square(v.w, mean, corr));
    }
    return (word_centered(w.x, mean, corr) + word_centered(w.y, mean, corr))
        + (word_centered(w.z, mean, corr) + word_centered(w.w, mean, corr));
}

fn layer_value(v: f32, c: u32, mean: f32, corr: f32, inv: f32) -> f32 {
    var b = 0.0;
    if (HAS_B) {
        b = ld_aux2(c);
    }
    return (((v - mean) - corr) * inv) * weight_factor(c) + b;
}

fn layer_word(word: u32, c: u32, mean: f32, corr: f32, inv: f32) -> u32 {
    return pack_halves(layer_value(half_from_word(word, 0u, DX), c, mean, corr, inv),
                       layer_value(half_from_word(word, 1u, DX), c + 1u, mean, corr, inv), DX);
}

fn layer_chunk(w: vec4<u32>, c0: u32, mean: f32, corr: f32, inv: f32) -> vec4<u32> {
    if (DX == DT_F32) {
        let v = bitcast<vec4<f32>>(w);
        return vec4<u32>(
            bitcast<u32>(layer_value(v.x, c0, mean, corr, inv)),
            bitcast<u32>(layer_value(v.y, c0 + 1u, mean, corr, inv)),
            bitcast<u32>(layer_value(v.z, c0 + 2u, mean, corr, inv)),
            bitcast<u32>(layer_value(v.w, c0 + 3u, mean, corr, inv)));
    }
    return vec4<u32>(
        layer_word(w.x, c0, mean, corr, inv),
        layer_word(w.y, c0 + 2u, mean, corr, inv),
        layer_word(w.z, c0 + 4u, mean, corr, inv),
        layer_word(w.w, c0 + 6u, mean, corr, inv));
}

fn layer_store(w: vec4<u32>, q: u32, n: u32, base: u32, mean: f32, corr: f32, inv: f32) {
    if (q < n) {
        y4[base + q] = layer_chunk(w, q * chunk_len(), mean, corr, inv);
    }
}

@compute @workgroup_size(WG)
fn layer_forward_registers(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_len();
    let base = row * n;
    let w0 = load_chunk(lid, n, base);
    let w1 = load_chunk(lid + WG, n, base);
    let w2 = load_chunk(lid + 2u * WG, n, base);
    let w3 = load_chunk(lid + 3u * WG, n, base);
    let w4 = load_chunk(lid + 4u * WG, n, base);
    let w5 = load_chunk(lid + 5u * WG, n, base);
    let w6 = load_chunk(lid + 6u * WG, n, base);
    let w7 = load_chunk(lid + 7u * WG, n, base);
    let first = x4[base].x;
    var pivot = bitcast<f32>(first);
    if (DX != DT_F32) {
        pivot = half_from_word(first, 0u, DX);
    }
    let deltas = ((chunk_delta(w0, lid, n, pivot) + chunk_delta(w1, lid + WG, n, pivot))
        + (chunk_delta(w2, lid + 2u * WG, n, pivot) + chunk_delta(w3, lid + 3u * WG, n, pivot)))
        + ((chunk_delta(w4, lid + 4u * WG, n, pivot) + chunk_delta(w5, lid + 5u * WG, n, pivot))
        + (chunk_delta(w6, lid + 6u * WG, n, pivot) + chunk_delta(w7, lid + 7u * WG, n, pivot)));
    let delta = workgroup_sum(deltas, lid) / f32(params.cols);
    let mean = pivot + delta;
    let corr = (pivot - mean) + delta;
    let squares = ((chunk_centered(w0, lid, n, mean, corr) + chunk_centered(w1, lid + WG, n, mean, corr))
        + (chunk_centered(w2, lid + 2u * WG, n, mean, corr) + chunk_centered(w3, lid + 3u * WG, n, mean, corr)))
        + ((chunk_centered(w4, lid + 4u * WG, n, mean, corr) + chunk_centered(w5, lid + 5u * WG, n, mean, corr))
        + (chunk_centered(w6, lid + 6u * WG, n, mean, corr) + chunk_centered(w7, lid + 7u * WG, n, mean, corr)));
    let inv = 1.0 / sqrt(workgroup_sum(squares, lid) / f32(params.cols) + params.eps);
    if (lid == 0u) {
        inv_out[row] = inv;
        mean_out[row] = mean;
        sum_out[row] = bitcast<u32>(corr);
    }
    layer_store(w0, lid, n, base, mean, corr, inv);
    layer_store(w1, lid + WG, n, base, mean, corr, inv);
    layer_store(w2, lid + 2u * WG, n, base, mean, corr, inv);
    layer_store(w3, lid + 3u * WG, n, base, mean, corr, inv);
    layer_store(w4, lid + 4u * WG, n, base, mean, corr, inv);
    layer_store(w5, lid + 5u * WG, n, base, mean, corr, inv);
    layer_store(w6, lid + 6u * WG, n, base, mean, corr, inv);
    layer_store(w7, lid + 7u * WG, n, base, mean, corr, inv);
}
