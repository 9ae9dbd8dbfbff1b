// Multi-token attention: the convolution over causal attention probabilities,
// `y = mask₀(conv2d(softmax(mask₋∞(scores)), W, b))`, and its gradients. Scores and outputs are
// `[batch, channels, side, side]` planes (row i, column j; j > i is the future); P (the
// probabilities) is F32 `[batch, c_in, L, L]`; W is `[c_out, c_in / groups, kh, kw]`.
//
// `mask_future`: an F32 copy of the scores with the future set to −1e9 (then the softmax, a
// launch of the loss family, gives it probability 0). `conv_forward`: an invocation per two
// consecutive outputs (one writer per 16-bit word): bias + Σ over the group's input channels
// and the kernel taps in order (ci, ky, kx), 0 where x > y. `conv_input_grad`: dP, an
// invocation per element, Σ over the group's output channels and the taps in order (co, ky,
// kx) of W · G, G the cotangent with its future zeroed. `conv_param_partials`: for each weight
// element (then each bias) and block of `block_rows` output rows (batch-major), Σ G · P over
// the block's rows and columns in order: the partial sums that `reduce::sum_partials` adds in
// block order. No atomics.

override DS: u32 = 0u;   // scores dtype (mask_future), output dtype (conv_forward)
override DW: u32 = 0u;   // weight dtype
override DB: u32 = 0u;   // bias dtype
override DY: u32 = 0u;   // cotangent dtype
override HAS_BIAS: bool = false;
const WG: u32 = 256u;
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
    pairs: u32,       // ⌈count / 2⌉
    blocks: u32,      // conv_param_partials: blocks of output rows
    block_rows: u32,  // output rows (of batch · out_side) a block
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

// The cotangent at output element `o`, 0 in the future (x > y), which the output mask zeroes.
fn grad_at(o: u32) -> f32 {
    let side = params.out_side;
    let x = o % side;
    let y = (o / side) % side;
    if (x > y) {
        return 0.0;
    }
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

// Output element `o` (flat over [batch, c_out, out_side, out_side]).
fn conv_value(o: u32) -> f32 {
    let so = params.out_side;
    let x = o % so;
    let y = (o / so) % so;
    if (x > y) {
        return 0.0;
    }
    let co = (o / (so * so)) % params.c_out;
    let n = o / (so * so * params.c_out);
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

@compute @workgroup_size(WG)
fn conv_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let p = linear(wid, nwg, lid);
    if (p >= params.pairs) {
        return;
    }
    let o = 2u * p;
    let two = o + 1u < params.count;
    let a = conv_value(o);
    var b = 0.0;
    if (two) {
        b = conv_value(o + 1u);
    }
    if (DS == DT_F32) {
        out[o] = bitcast<u32>(a);
        if (two) {
            out[o + 1u] = bitcast<u32>(b);
        }
    } else if (two) {
        out[p] = pack_halves(a, b, DS);
    } else {
        out[p] = half_bits(a, DS);
    }
}

// The output index along one axis that input index `i` meets through tap `k`, or −1.
fn tap_source(i: u32, k: u32, s: u32, pad: u32, d: u32, n_out: u32) -> i32 {
    let t = i32(i + pad) - i32(k * d);
    if (t < 0 || t % i32(s) != 0) {
        return -1;
    }
    let y = t / i32(s);
    if (y >= i32(n_out)) {
        return -1;
    }
    return y;
}

@compute @workgroup_size(WG)
fn conv_input_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let e = linear(wid, nwg, lid);
    if (e >= params.count) {
        return;
    }
    let side = params.side;
    let j = e % side;
    let i = (e / side) % side;
    let ci = (e / (side * side)) % params.c_in;
    let n = e / (side * side * params.c_in);
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
            for (var kx = 0u; kx < params.kw; kx = kx + 1u) {
                let x = tap_source(j, kx, params.sw, params.pw, params.dw, so);
                if (x < 0) {
                    continue;
                }
                let gv = grad_at(plane + u32(y) * so + u32(x));
                acc = acc + weight_at(wbase + ky * params.kw + kx) * gv;
            }
        }
    }
    out[e] = bitcast<u32>(acc);
}

// Slot s < weights: Σ G·P of weight element s over the block's rows; s ≥ weights: Σ G of bias
// s − weights. Partial row `block`, column s, of `out` as `[blocks, weights + c_out]`.
@compute @workgroup_size(WG)
fn conv_param_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let t = linear(wid, nwg, lid);
    let slots = params.count;
    if (t >= slots * params.blocks) {
        return;
    }
    let s = t % slots;
    let block = t / slots;
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
    let first = block * params.block_rows;
    let last = min(first + params.block_rows, params.batch * so);
    var acc = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let n = r / so;
        let y = r % so;
        let grow = ((n * params.c_out + co) * so + y) * so;
        if (is_bias) {
            for (var x = 0u; x <= y && x < so; x = x + 1u) {
                acc = acc + grad_at(grow + x);
            }
            continue;
        }
        let iy = i32(y * params.sh + ky * params.dh) - i32(params.ph);
        if (iy < 0 || iy >= i32(side)) {
            continue;
        }
        let prow = ((n * params.c_in + ci) * side + u32(iy)) * side;
        for (var x = 0u; x <= y && x < so; x = x + 1u) {
            let ix = i32(x * params.sw + kx * params.dw) - i32(params.pw);
            if (ix < 0 || ix >= i32(side)) {
                continue;
            }
            acc = acc + grad_at(grow + x) * probs[prow + u32(ix)];
        }
    }
    out[block * slots + s] = bitcast<u32>(acc);
}
