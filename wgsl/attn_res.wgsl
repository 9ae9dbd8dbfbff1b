// Attention residuals (AttnRes): for each token, a softmax over N depth blocks v_i (rows of D
// values) of scores s_i = Σ_d q_d · k_i,d, with k_i = round(v_i · r_i) · w_d (RMSNorm of the
// block, r_i = 1/sqrt(mean(v_i²) + ε), rounded to the blocks' dtype) and output
// h = Σ_i α_i v_i. V is `[N, tokens, D]`; the statistics `[tokens, 2N]` F32 hold r_i then α_i.
//
// `forward`: a workgroup of WG lanes a token, lane-strided columns, per block two fixed-order
// row sums (Σ v², then Σ q·k), the softmax over the blocks from the stored scores (every lane
// the same, in block order), then h by columns (16-bit: a lane owns column pairs, so only for
// an even D; odd 16-bit D writes F32 and the host narrows it). `backward`: a workgroup for
// TOKENS consecutive tokens: per token dα_i = Σ dh·v_i, dσ_i = α_i (dα_i − Σ_j α_j dα_j), then
// per block c_i = Σ q·w·v, then by columns dV_i = α_i dh + r_i dσ_i q w − r_i³ dσ_i (c_i / D) v
// (F32; or, with a 16-bit DO and an even D, a lane a column pair, each value rounded once) and
// the parameter terms dσ_i round(n_i)·w (d w_query) and dσ_i q·round(n_i) (d w_norm) summed
// over the blocks in order, then added (token by token) into the workgroup's own
// partial row (each lane its columns), then `reduce::sum_partials` in row order. No atomics.

override DV: u32 = 0u;   // blocks' dtype
override DQ: u32 = 0u;   // w_query dtype
override DN: u32 = 0u;   // w_norm dtype
override DG: u32 = 0u;   // cotangent dtype
override DO: u32 = 0u;   // output dtype (F32 for an odd D of 16-bit blocks)
const MAX_BLOCKS: u32 = 64u;
const TOKENS: u32 = 4u;

struct Params {
    blocks: u32,
    tokens: u32,
    d: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> v_w: array<u32>;
@group(0) @binding(2) var<storage, read> q_w: array<u32>;
@group(0) @binding(3) var<storage, read> n_w: array<u32>;
@group(0) @binding(4) var<storage, read> g_w: array<u32>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32>;
@group(0) @binding(7) var<storage, read_write> partials: array<f32>;

var<workgroup> block_vals: array<f32, MAX_BLOCKS>;
var<workgroup> block_cs: array<f32, MAX_BLOCKS>;

fn v_at(i: u32) -> f32 {
    if (DV == DT_F32) {
        return bitcast<f32>(v_w[i]);
    }
    return half_from_word(v_w[i >> 1u], i, DV);
}

fn q_at(d: u32) -> f32 {
    if (DQ == DT_F32) {
        return bitcast<f32>(q_w[d]);
    }
    return half_from_word(q_w[d >> 1u], d, DQ);
}

fn wn_at(d: u32) -> f32 {
    if (DN == DT_F32) {
        return bitcast<f32>(n_w[d]);
    }
    return half_from_word(n_w[d >> 1u], d, DN);
}

fn g_at(i: u32) -> f32 {
    if (DG == DT_F32) {
        return bitcast<f32>(g_w[i]);
    }
    return half_from_word(g_w[i >> 1u], i, DG);
}

// The normalized value rounded to the blocks' dtype.
fn rounded(x: f32) -> f32 {
    if (DV == DT_F32) {
        return x;
    }
    return half_from_word(half_bits(x, DV), 0u, DV);
}

// Element d of block i of token t.
fn v_index(i: u32, t: u32, d: u32) -> u32 {
    return (i * params.tokens + t) * params.d + d;
}

// r_i (the block's inverse RMS) and its score, from fixed-order row sums. Uniform.
fn block_score(i: u32, t: u32, lid: u32) -> vec2<f32> {
    var sq = 0.0;
    for (var d = lid; d < params.d; d = d + WG) {
        let v = v_at(v_index(i, t, d));
        sq = sq + v * v;
    }
    let r = 1.0 / sqrt(workgroup_sum(sq, lid) / f32(params.d) + params.eps);
    var dot = 0.0;
    for (var d = lid; d < params.d; d = d + WG) {
        dot = dot + q_at(d) * (rounded(v_at(v_index(i, t, d)) * r) * wn_at(d));
    }
    return vec2<f32>(r, workgroup_sum(dot, lid));
}

@compute @workgroup_size(WG)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.blocks;
    let row = t * 2u * n;
    var top = -3.4028235e38;
    for (var i = 0u; i < n; i = i + 1u) {
        let rs = block_score(i, t, lid);
        if (lid == 0u) {
            block_vals[i] = rs.y;
            stats[row + i] = rs.x;
        }
        top = max(top, rs.y);
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < n; i = i + 1u) {
        total = total + exp(block_vals[i] - top);
    }
    workgroupBarrier();
    if (lid < n) {
        let a = exp(block_vals[lid] - top) / total;
        stats[row + n + lid] = a;
        block_vals[lid] = a;
    }
    workgroupBarrier();
    if (DO == DT_F32) {
        for (var d = lid; d < params.d; d = d + WG) {
            var h = 0.0;
            for (var i = 0u; i < n; i = i + 1u) {
                h = h + block_vals[i] * v_at(v_index(i, t, d));
            }
            out[t * params.d + d] = bitcast<u32>(h);
        }
        return;
    }
    // 16-bit, even D: a lane owns the pair (2p, 2p + 1).
    let base = t * params.d;
    for (var p = lid; 2u * p < params.d; p = p + WG) {
        var h = vec2<f32>();
        for (var i = 0u; i < n; i = i + 1u) {
            let a = block_vals[i];
            h = h + a * vec2<f32>(v_at(v_index(i, t, 2u * p)), v_at(v_index(i, t, 2u * p + 1u)));
        }
        out[(base >> 1u) + p] = pack_halves(h.x, h.y, DO);
    }
}

// Column d of token t's per-column inputs, loaded once for all its blocks.
struct Column {
    d: u32,
    q: f32,
    wn: f32,
    gd: f32,
}

fn column_at(t: u32, d: u32) -> Column {
    return Column(d, q_at(d), wn_at(d), g_at(t * params.d + d));
}

// Block i's dV at column `col` of token t (`row` its statistics), and its parameter terms
// added to `acc` (d w_query, d w_norm), in the blocks' order.
fn column_terms(i: u32, t: u32, col: Column, row: u32, acc: ptr<function, vec2<f32>>) -> f32 {
    let n = params.blocks;
    let ds = block_vals[i];
    let r = stats[row + i];
    let v = v_at(v_index(i, t, col.d));
    let dv = stats[row + n + i] * col.gd + r * ds * (col.q * col.wn) - r * r * r * block_cs[i] * v;
    let nr = rounded(v * r);
    (*acc).x = (*acc).x + ds * (nr * col.wn);
    (*acc).y = (*acc).y + ds * (col.q * nr);
    return dv;
}

@compute @workgroup_size(WG)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let group = group_index(wid, nwg);
    let first = group * TOKENS;
    if (first >= params.tokens) {
        return;
    }
    let n = params.blocks;
    let dd = params.d;
    let prow = group * 2u * dd;
    for (var d = lid; d < dd; d = d + WG) {
        partials[prow + d] = 0.0;
        partials[prow + dd + d] = 0.0;
    }
    let last = min(first + TOKENS, params.tokens);
    for (var t = first; t < last; t = t + 1u) {
        let row = t * 2u * n;
        // dα_i = Σ dh·v_i.
        for (var i = 0u; i < n; i = i + 1u) {
            var s = 0.0;
            for (var d = lid; d < dd; d = d + WG) {
                s = s + g_at(t * dd + d) * v_at(v_index(i, t, d));
            }
            let da = workgroup_sum(s, lid);
            if (lid == 0u) {
                block_vals[i] = da;
            }
        }
        workgroupBarrier();
        var mix = 0.0;
        for (var i = 0u; i < n; i = i + 1u) {
            mix = mix + stats[row + n + i] * block_vals[i];
        }
        workgroupBarrier();
        if (lid < n) {
            block_vals[lid] = stats[row + n + lid] * (block_vals[lid] - mix);
        }
        workgroupBarrier();
        // c_i = Σ q·w·v_i, then each column's dV over the blocks and its parameter terms
        // summed over the blocks before they join the partial row.
        for (var i = 0u; i < n; i = i + 1u) {
            var c = 0.0;
            for (var d = lid; d < dd; d = d + WG) {
                c = c + q_at(d) * wn_at(d) * v_at(v_index(i, t, d));
            }
            let cs = block_vals[i] * workgroup_sum(c, lid) / f32(dd);
            if (lid == 0u) {
                block_cs[i] = cs;
            }
        }
        workgroupBarrier();
        if (DO == DT_F32) {
            for (var d = lid; d < dd; d = d + WG) {
                let col = column_at(t, d);
                var acc = vec2<f32>(0.0, 0.0);
                for (var i = 0u; i < n; i = i + 1u) {
                    let dv = column_terms(i, t, col, row, &acc);
                    out[v_index(i, t, d)] = bitcast<u32>(dv);
                }
                partials[prow + d] = partials[prow + d] + acc.x;
                partials[prow + dd + d] = partials[prow + dd + d] + acc.y;
            }
        } else {
            // A 16-bit dV (even D): a lane a column pair, each value the F32 one rounded once.
            for (var d0 = 2u * lid; d0 < dd; d0 = d0 + 2u * WG) {
                let col0 = column_at(t, d0);
                let col1 = column_at(t, d0 + 1u);
                var acc0 = vec2<f32>(0.0, 0.0);
                var acc1 = vec2<f32>(0.0, 0.0);
                for (var i = 0u; i < n; i = i + 1u) {
                    let dv0 = column_terms(i, t, col0, row, &acc0);
                    let dv1 = column_terms(i, t, col1, row, &acc1);
                    out[v_index(i, t, d0) >> 1u] = pack_halves(dv0, dv1, DO);
                }
                partials[prow + d0] = partials[prow + d0] + acc0.x;
                partials[prow + d0 + 1u] = partials[prow + d0 + 1u] + acc1.x;
                partials[prow + dd + d0] = partials[prow + dd + d0] + acc0.y;
                partials[prow + dd + d0 + 1u] = partials[prow + dd + d0 + 1u] + acc1.y;
            }
        }
        workgroupBarrier();
    }
}
