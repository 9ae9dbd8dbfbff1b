// Multi-token attention: the convolution over causal attention probabilities,
// `y = mask₀(conv2d(softmax(mask₋∞(scores)), W, b))`, and its gradients. Scores and outputs are
// `[batch, channels, side, side]` planes (row i, column j; j > i is the future); P (the
// probabilities) is F32 `[batch, c_in, L, L]`; W is `[c_out, c_in / groups, kh, kw]`.
//
// `mask_future`: an F32 copy of the scores with the future set to −1e9 (then the softmax, a
// launch of the loss family, gives it probability 0). `conv_forward`: an invocation per four
// consecutive outputs (whole 16-bit words): bias + Σ over the group's input channels and the
// kernel taps in order (ci, ky, kx), 0 where x > y. `conv_input_grad`: dP, an invocation per
// four consecutive elements, Σ over the group's output channels and the taps in order (co, ky,
// kx) of W · G, G the cotangent with its future zeroed. With a stride and dilation of 1 along
// the rows and at most `MAX_ROW_TAPS` taps a row (`ROW_TAPS`), four outputs of one row read
// each tap row once, as a window of `ROW_TAPS + 3` values, and load each weight once; every
// output still adds the same terms in the same order (the same bits as one at a time).
// `conv_param_partials`: for each weight
// element (then each bias) and block of `block_rows` output rows (batch-major) × PARTIAL_COLS
// columns, Σ G · P over the block's rows and columns in order: the partial sums that
// `reduce::sum_partials` adds in block order (rows, then column segments). No atomics.

override DS: u32 = 0u;   // scores dtype (mask_future), output dtype (conv_forward)
override DW: u32 = 0u;   // weight dtype
override DB: u32 = 0u;   // bias dtype
override DY: u32 = 0u;   // cotangent dtype
override HAS_BIAS: bool = false;
// Taps along a row for the row windows (a stride and dilation of 1 along the rows); 0: one
// output at a time.
override ROW_TAPS: u32 = 0u;
const WG: u32 = 256u;
const QUAD: u32 = 4u;           // outputs an invocation
const MAX_ROW_TAPS: u32 = 8u;
const WINDOW: u32 = 11u;        // QUAD − 1 + MAX_ROW_TAPS
const PARTIAL_COLS: u32 = 256u; // output columns a parameter partial sums
const MASKED: f32 = -1e9;

struct Params {
    batch: u32,
    c_in: u32,
    c_out: u32,
    side: u32,        // L: the scores' side
    out_side: u32,    // the output's side
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    groups: u32,
    count: u32,       // elements of the launch's output (conv_forward: outputs; partials: slots)
    quads: u32,       // ⌈count / 4⌉
    blocks: u32,      // conv_param_partials: blocks of output rows
    block_rows: u32,  // output rows (of batch · out_side) a block
    units: u32,       // conv_param_partials: invocations a block
    segments: u32,    // conv_param_partials: column segments of PARTIAL_COLS a row block
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> probs: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read> dy: array<u32>;
@group(0) @binding(5) var<storage, read> scores: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32>;

fn weight_at(i: u32) -> f32 {
    if (DW == DT_F32) {
        return bitcast<f32>(weight[i]);
    }
    return half_from_word(weight[i >> 1u], i, DW);
}

fn bias_at(c: u32) -> f32 {
    if (!HAS_BIAS) {
        return 0.0;
    }
    if (DB == DT_F32) {
        return bitcast<f32>(bias[c]);
    }
    return half_from_word(bias[c >> 1u], c, DB);
}

// The stored cotangent at output element `o` (the caller applies the future's zero).
fn grad_word(o: u32) -> f32 {
    if (DY == DT_F32) {
        return bitcast<f32>(dy[o]);
    }
    return half_from_word(dy[o >> 1u], o, DY);
}

fn linear(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return group_index(wid, nwg) * WG + lid;
}

@compute @workgroup_size(WG)
fn mask_future(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let e = linear(wid, nwg, lid);
    if (e >= params.count) {
        return;
    }
    let side = params.side;
    var v = MASKED;
    if (e % side <= (e / side) % side) {
        if (DS == DT_F32) {
            v = bitcast<f32>(scores[e]);
        } else {
            v = half_from_word(scores[e >> 1u], e, DS);
        }
    }
    out[e] = bitcast<u32>(v);
}

// An element's (column, row, channel, batch) in `[batch, channels, side, side]` planes.
fn plane_at(e: u32, side: u32, channels: u32) -> vec4<u32> {
    return vec4<u32>(e % side, (e / side) % side, (e / (side * side)) % channels,
                     e / (side * side * channels));
}

// Output element `o` (flat over [batch, c_out, out_side, out_side]).
fn conv_value(o: u32) -> f32 {
    let so = params.out_side;
    let at = plane_at(o, so, params.c_out);
    let x = at.x;
    let y = at.y;
    if (x > y) {
        return 0.0;
    }
    let co = at.z;
    let n = at.w;
    let cin_g = params.c_in / params.groups;
    let ci0 = (co / (params.c_out / params.groups)) * cin_g;
    let side = params.side;
    var acc = bias_at(co);
    for (var c = 0u; c < cin_g; c = c + 1u) {
        let plane = (n * params.c_in + ci0 + c) * side * side;
        let wbase = ((co * cin_g + c) * params.kh) * params.kw;
        for (var ky = 0u; ky < params.kh; ky = ky + 1u) {
            // Signed: a tap may fall in the padding.
            let iy = i32(y * params.sh + ky * params.dh) - i32(params.ph);
            if (iy < 0 || iy >= i32(side)) {
                continue;
            }
            for (var kx = 0u; kx < params.kw; kx = kx + 1u) {
                let ix = i32(x * params.sw + kx * params.dw) - i32(params.pw);
                if (ix < 0 || ix >= i32(side)) {
                    continue;
                }
                let p = probs[plane + u32(iy) * side + u32(ix)];
                acc = acc + weight_at(wbase + ky * params.kw + kx) * p;
            }
        }
    }
    return acc;
}

// Outputs o .. o + 3 of one row (o % out_side + 3 < out_side) by the row windows.
fn conv_quad(o: u32) -> array<f32, QUAD> {
    let so = params.out_side;
    let at = plane_at(o, so, params.c_out);
    let x0 = at.x;
    let y = at.y;
    let co = at.z;
    let n = at.w;
    let cin_g = params.c_in / params.groups;
    let ci0 = (co / (params.c_out / params.groups)) * cin_g;
    let side = params.side;
    let b = bias_at(co);
    var acc = array<f32, QUAD>(b, b, b, b);
    for (var c = 0u; c < cin_g; c = c + 1u) {
        let plane = (n * params.c_in + ci0 + c) * side * side;
        let wbase = ((co * cin_g + c) * params.kh) * params.kw;
        for (var ky = 0u; ky < params.kh; ky = ky + 1u) {
            let iy = i32(y * params.sh + ky * params.dh) - i32(params.ph);
            if (iy < 0 || iy >= i32(side)) {
                continue;
            }
            let row = plane + u32(iy) * side;
            // Window w: input column x0 − pw + w, tap kx of output x0 + u at w = u + kx.
            var win: array<f32, WINDOW>;
            var inside: array<bool, WINDOW>;
            for (var w = 0u; w < QUAD - 1u + ROW_TAPS; w = w + 1u) {
                let ix = i32(x0 + w) - i32(params.pw);
                inside[w] = ix >= 0 && ix < i32(side);
                win[w] = 0.0;
                if (inside[w]) {
                    win[w] = probs[row + u32(ix)];
                }
            }
            for (var kx = 0u; kx < ROW_TAPS; kx = kx + 1u) {
                let wv = weight_at(wbase + ky * params.kw + kx);
                for (var u = 0u; u < QUAD; u = u + 1u) {
                    if (inside[u + kx]) {
                        acc[u] = acc[u] + wv * win[u + kx];
                    }
                }
            }
        }
    }
    for (var u = 0u; u < QUAD; u = u + 1u) {
        if (x0 + u > y) {
            acc[u] = 0.0;
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn conv_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let q = linear(wid, nwg, lid);
    if (q >= params.quads) {
        return;
    }
    let o = QUAD * q;
    var v = array<f32, QUAD>(0.0, 0.0, 0.0, 0.0);
    if (ROW_TAPS != 0u && o % params.out_side + QUAD <= params.out_side) {
        v = conv_quad(o);
    } else {
        for (var u = 0u; u < QUAD && o + u < params.count; u = u + 1u) {
            v[u] = conv_value(o + u);
        }
    }
    for (var u = 0u; u < QUAD; u = u + 2u) {
        let e = o + u;
        if (e >= params.count) {
            break;
        }
        let two = e + 1u < params.count;
        if (DS == DT_F32) {
            out[e] = bitcast<u32>(v[u]);
            if (two) {
                out[e + 1u] = bitcast<u32>(v[u + 1u]);
            }
        } else if (two) {
            out[e >> 1u] = pack_halves(v[u], v[u + 1u], DS);
        } else {
            out[e >> 1u] = half_bits(v[u], DS);
        }
    }
}

// The output index along one axis that input index `i` meets through tap `k`, or −1. A stride
// of 1 (the common case) takes no division.
fn tap_source(i: u32, k: u32, s: u32, pad: u32, d: u32, n_out: u32) -> i32 {
    let reach = i + pad;
    if (reach < k * d) {
        return -1;
    }
    var y = reach - k * d;
    if (s != 1u) {
        if (y % s != 0u) {
            return -1;
        }
        y = y / s;
    }
    if (y >= n_out) {
        return -1;
    }
    return i32(y);
}

// dP at input element e (flat over [batch, c_in, side, side]), taps one at a time.
fn input_grad_value(e: u32) -> f32 {
    let at = plane_at(e, params.side, params.c_in);
    let j = at.x;
    let i = at.y;
    let ci = at.z;
    let n = at.w;
    let cin_g = params.c_in / params.groups;
    let cout_g = params.c_out / params.groups;
    let g = ci / cin_g;
    let so = params.out_side;
    var acc = 0.0;
    for (var c = 0u; c < cout_g; c = c + 1u) {
        let co = g * cout_g + c;
        let plane = (n * params.c_out + co) * so * so;
        let wbase = ((co * cin_g + ci - g * cin_g) * params.kh) * params.kw;
        for (var ky = 0u; ky < params.kh; ky = ky + 1u) {
            let y = tap_source(i, ky, params.sh, params.ph, params.dh, so);
            if (y < 0) {
                continue;
            }
            let row = plane + u32(y) * so;
            for (var kx = 0u; kx < params.kw; kx = kx + 1u) {
                let x = tap_source(j, kx, params.sw, params.pw, params.dw, so);
                if (x < 0) {
                    continue;
                }
                // The future (x > y) contributes W · 0, as the zeroed cotangent does.
                let gv = select(grad_word(row + u32(x)), 0.0, x > y);
                acc = acc + weight_at(wbase + ky * params.kw + kx) * gv;
            }
        }
    }
    return acc;
}

// dP at elements e .. e + 3 of one row (e % side + 3 < side) by the row windows.
fn input_grad_quad(e: u32) -> array<f32, QUAD> {
    let at = plane_at(e, params.side, params.c_in);
    let j0 = at.x;
    let i = at.y;
    let ci = at.z;
    let n = at.w;
    let cin_g = params.c_in / params.groups;
    let cout_g = params.c_out / params.groups;
    let g = ci / cin_g;
    let so = params.out_side;
    var acc = array<f32, QUAD>(0.0, 0.0, 0.0, 0.0);
    for (var c = 0u; c < cout_g; c = c + 1u) {
        let co = g * cout_g + c;
        let plane = (n * params.c_out + co) * so * so;
        let wbase = ((co * cin_g + ci - g * cin_g) * params.kh) * params.kw;
        for (var ky = 0u; ky < params.kh; ky = ky + 1u) {
            let y = tap_source(i, ky, params.sh, params.ph, params.dh, so);
            if (y < 0) {
                continue;
            }
            let row = plane + u32(y) * so;
            // Window w: cotangent column j0 + pw − (ROW_TAPS − 1) + w, tap kx of element
            // j0 + u at w = u + ROW_TAPS − 1 − kx; the future read as 0.
            var win: array<f32, WINDOW>;
            var inside: array<bool, WINDOW>;
            for (var w = 0u; w < QUAD - 1u + ROW_TAPS; w = w + 1u) {
                let x = i32(j0 + params.pw + w + 1u) - i32(ROW_TAPS);
                inside[w] = x >= 0 && x < i32(so);
                win[w] = 0.0;
                if (inside[w] && x <= y) {
                    win[w] = grad_word(row + u32(x));
                }
            }
            for (var kx = 0u; kx < ROW_TAPS; kx = kx + 1u) {
                let wv = weight_at(wbase + ky * params.kw + kx);
                for (var u = 0u; u < QUAD; u = u + 1u) {
                    let w = u + ROW_TAPS - (kx + 1u);
                    if (inside[w]) {
                        acc[u] = acc[u] + wv * win[w];
                    }
                }
            }
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn conv_input_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let q = linear(wid, nwg, lid);
    if (q >= params.quads) {
        return;
    }
    let e = QUAD * q;
    if (ROW_TAPS != 0u && e % params.side + QUAD <= params.side) {
        let v = input_grad_quad(e);
        for (var u = 0u; u < QUAD; u = u + 1u) {
            out[e + u] = bitcast<u32>(v[u]);
        }
        return;
    }
    for (var u = 0u; u < QUAD && e + u < params.count; u = u + 1u) {
        out[e + u] = bitcast<u32>(input_grad_value(e + u));
    }
}

// Block `block` of the parameter partials: (first row, past its last row, first column, past its
// last column) of the outputs it sums: `block_rows` rows (batch-major) and PARTIAL_COLS columns.
fn segment(block: u32) -> vec4<u32> {
    let rb = block / params.segments;
    let x0 = (block % params.segments) * PARTIAL_COLS;
    let first = rb * params.block_rows;
    let last = min(first + params.block_rows, params.batch * params.out_side);
    return vec4<u32>(first, last, x0, min(x0 + PARTIAL_COLS, params.out_side));
}

// Slot s < weights: Σ G·P of weight element s over the block's rows and columns; s ≥ weights:
// Σ G of bias s − weights: partial row `block`, column s, of `out` as `[blocks, weights + c_out]`.
// A row y sums the block's columns x ≤ y (the rest of G is the zeroed future) in increasing x; a
// weight slot only those whose tap falls inside the probabilities' row, a range found once.
fn slot_partial(block: u32, s: u32) -> f32 {
    let cin_g = params.c_in / params.groups;
    let weights = params.c_out * cin_g * params.kh * params.kw;
    let so = params.out_side;
    let side = params.side;
    var co = 0u;
    var c = 0u;
    var ky = 0u;
    var kx = 0u;
    let is_bias = s >= weights;
    if (is_bias) {
        co = s - weights;
    } else {
        kx = s % params.kw;
        ky = (s / params.kw) % params.kh;
        c = (s / (params.kw * params.kh)) % cin_g;
        co = s / (params.kw * params.kh * cin_g);
    }
    let ci = (co / (params.c_out / params.groups)) * cin_g + c;
    // Column x reads probability column x·sw + tap − pw; inside the row for x in [x_lo, x_hi).
    let sw = params.sw;
    let tap = kx * params.dw;
    let pw = params.pw;
    var x_lo = 0u;
    if (tap < pw) {
        x_lo = (pw - tap + sw - 1u) / sw;
    }
    var x_hi = 0u;
    if (side + pw > tap) {
        x_hi = min(so, (side + pw - tap + sw - 1u) / sw);
    }
    let seg = segment(block);
    var acc = 0.0;
    for (var r = seg.x; r < seg.y; r = r + 1u) {
        let n = r / so;
        let y = r % so;
        let grow = ((n * params.c_out + co) * so + y) * so;
        let xe = min(y + 1u, seg.w);
        if (is_bias) {
            for (var x = seg.z; x < xe; x = x + 1u) {
                acc = acc + grad_word(grow + x);
            }
            continue;
        }
        let iy = i32(y * params.sh + ky * params.dh) - i32(params.ph);
        if (iy < 0 || iy >= i32(side)) {
            continue;
        }
        let prow = ((n * params.c_in + ci) * side + u32(iy)) * side + tap;
        let end = min(xe, x_hi);
        for (var x = max(x_lo, seg.z); x < end; x = x + 1u) {
            acc = acc + grad_word(grow + x) * probs[prow + x * sw - pw];
        }
    }
    return acc;
}

// The ROW_TAPS weight slots of tap row `unit` = (co, c, ky) at once (a stride and dilation of
// 1 along the rows): G at column x is read once and meets probability column x + kx − pw of
// each slot kx, held in a window that slides one column a step. Each slot adds the terms of
// `slot_partial` in its order.
fn tap_row_partials(block: u32, unit: u32) {
    let cin_g = params.c_in / params.groups;
    let ky = unit % params.kh;
    let c = (unit / params.kh) % cin_g;
    let co = unit / (params.kh * cin_g);
    let ci = (co / (params.c_out / params.groups)) * cin_g + c;
    let so = params.out_side;
    let side = params.side;
    let pw = params.pw;
    let seg = segment(block);
    var acc: array<f32, MAX_ROW_TAPS>;
    for (var kx = 0u; kx < ROW_TAPS; kx = kx + 1u) {
        acc[kx] = 0.0;
    }
    for (var r = seg.x; r < seg.y; r = r + 1u) {
        let n = r / so;
        let y = r % so;
        let grow = ((n * params.c_out + co) * so + y) * so;
        let iy = i32(y * params.sh + ky * params.dh) - i32(params.ph);
        if (iy < 0 || iy >= i32(side)) {
            continue;
        }
        let prow = ((n * params.c_in + ci) * side + u32(iy)) * side;
        // win[kx]: probability column x + kx − pw of the current x (0 outside the row).
        var win: array<f32, MAX_ROW_TAPS>;
        var inside: array<bool, MAX_ROW_TAPS>;
        for (var kx = 0u; kx + 1u < ROW_TAPS; kx = kx + 1u) {
            let ix = i32(seg.z + kx) - i32(pw);
            inside[kx] = ix >= 0 && ix < i32(side);
            win[kx] = 0.0;
            if (inside[kx]) {
                win[kx] = probs[prow + u32(ix)];
            }
        }
        let xe = min(y + 1u, seg.w);
        for (var x = seg.z; x < xe; x = x + 1u) {
            let newest = max(ROW_TAPS, 1u) - 1u;
            let ix = i32(x + newest) - i32(pw);
            inside[newest] = ix >= 0 && ix < i32(side);
            win[newest] = 0.0;
            if (inside[newest]) {
                win[newest] = probs[prow + u32(ix)];
            }
            let gv = grad_word(grow + x);
            for (var kx = 0u; kx < ROW_TAPS; kx = kx + 1u) {
                if (inside[kx]) {
                    acc[kx] = acc[kx] + gv * win[kx];
                }
            }
            for (var kx = 0u; kx + 1u < ROW_TAPS; kx = kx + 1u) {
                win[kx] = win[kx + 1u];
                inside[kx] = inside[kx + 1u];
            }
        }
    }
    let base = block * params.count + unit * ROW_TAPS;
    for (var kx = 0u; kx < ROW_TAPS; kx = kx + 1u) {
        out[base + kx] = bitcast<u32>(acc[kx]);
    }
}

// An invocation per (block, unit): with ROW_TAPS a unit is a tap row (ROW_TAPS slots) or, after
// the weights / ROW_TAPS tap rows, a bias; without, a unit is a slot. (`max(ROW_TAPS, 1u)`:
// the override's value is folded into constant expressions in code it never reaches, where
// a 0 would divide by zero or underflow and fail the pipeline.)
@compute @workgroup_size(WG)
fn conv_param_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let t = linear(wid, nwg, lid);
    let units = params.units;
    if (t >= units * params.blocks) {
        return;
    }
    let unit = t % units;
    let block = t / units;
    let slots = params.count;
    if (ROW_TAPS == 0u) {
        out[block * slots + unit] = bitcast<u32>(slot_partial(block, unit));
        return;
    }
    let tap_rows = (slots - params.c_out) / max(ROW_TAPS, 1u);
    if (unit < tap_rows) {
        tap_row_partials(block, unit);
        return;
    }
    let s = slots - params.c_out + (unit - tap_rows);
    out[block * slots + s] = bitcast<u32>(slot_partial(block, s));
}
