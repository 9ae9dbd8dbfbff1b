// Manifold-constrained hyper-connections (mHC). A token holds n = HC streams of width C, x
// `[tokens, n, C]`, flattened per token to the row x_mat of K = n·C values.
//
// Coefficients (M = n² + 2n): `mix = (x_mat · phi) · r` with r = 1/sqrt(mean(x_mat²) + rms_eps)
// (the product by `matmul::gemm` into `mix`, scaled here in place), then
// h_pre = sigmoid(a_pre·mix[:n] + b[:n]) + pre_eps, h_post = post_mult·sigmoid(a_post·mix[n:2n] +
// b[n:2n]), and h_res the Sinkhorn–Knopp projection of L = a_res·mix[2n:] + b[2n:] (n × n): a
// row softmax P, then Y₀ = (P + ε) / (colsum(P + ε) + ε), then tmax − 1 times R = Y / (rowsum(Y)
// + ε), Y = R / (colsum(R) + ε). `pack` first copies b and the three alphas into the head of
// `scratch` (M + 3 F32 values) so that each later entry reads them from one binding.
//
// `coeff_forward`: a workgroup of WG lanes a token; the row's sum of squares by a fixed-order
// workgroup sum, then lane j < n the sigmoid pair and lane e < n² Sinkhorn entry e (row e / n,
// column e % n), the row and column sums of the n × n matrix in workgroup memory added in index
// order by each lane that needs them (every lane of a row adds the same values in the same
// order). `coeff_backward`: a workgroup a token runs the same Sinkhorn code again, keeping each
// step's R (P for the first), its row denominators and its column denominators in the token's
// history region of `scratch` (tmax·M values), walks the steps back (column normalization
// Y = R / d: g_R = (g_Y − Σ_rows g_Y·Y) / d; row normalization R = Y / d: g_Y = (g_R − Σ_cols
// g_R·R) / d; softmax: g_L = P (g_P − Σ_cols g_P·P)), and writes per token the logit gradients
// and the alphas' terms (a row of `rows`, summed over tokens by `reduce::sum_partials`),
// dz = g_logit · alpha · r (for the products dphi = x_matᵀ·dz and dx += dz·phiᵀ) and the
// RMS factor −r²·Σ g_mix·mix / K, which `coeff_dx` multiplies into x to start dx.
//
// `pre_forward` / `pre_backward`: out[t, c] = Σ_i h_pre[t, i]·x[t, i, c]; dx = h_pre·g,
// dh_pre[t, i] = Σ_c g·x_i. `post_forward` / `post_backward_x` / `post_backward_h`:
// out[t, o, c] = h_post[t, o]·f[t, c] + Σ_i h_res[t, o, i]·x[t, i, c]; dx_i = Σ_o h_res[o, i]·g_o,
// df = Σ_o h_post[o]·g_o, dh_post[o] = Σ_c g_o·f, dh_res[o, i] = Σ_c g_o·x_i. A workgroup a token,
// lane-strided columns (16-bit outputs: a lane owns column pairs, so only for an even C; the host
// narrows an odd C's F32 output). Every sum has a fixed order; no atomics.

override DX: u32 = 0u;   // x
override DF: u32 = 0u;   // f_out
override DB: u32 = 0u;   // b
override DA1: u32 = 0u;  // alpha_pre
override DA2: u32 = 0u;  // alpha_post
override DA3: u32 = 0u;  // alpha_res
override DH1: u32 = 0u;  // h_pre (pre)
override DH2: u32 = 0u;  // h_post (post_res)
override DH3: u32 = 0u;  // h_res (post_res)
override DG1: u32 = 0u;  // dh_pre (coefficients) or the output's cotangent (pre, post_res)
override DG2: u32 = 0u;  // dh_post (coefficients)
override DG3: u32 = 0u;  // dh_res (coefficients)
override DO: u32 = 0u;   // output dtype of pre / post_res (F32 for an odd C of 16-bit x);
                         // pre_backward, post_backward_x: the dtype of dx and d f_out (even C)

const MAX_STREAMS: u32 = 16u;
const MAX_ENTRIES: u32 = 256u;  // MAX_STREAMS²
const MAX_M: u32 = 288u;        // MAX_STREAMS² + 2·MAX_STREAMS

struct Params {
    tokens: u32,
    hc: u32,
    c: u32,
    m: u32,
    tmax: u32,
    // Bits 0, 1, 2: dh_pre, dh_post, dh_res given.
    flags: u32,
    // Per-token stride of the history region of `scratch` (tmax·M + 1: the factor last).
    stride: u32,
    // Where the history regions start (M + 3, after the packed b and alphas).
    base: u32,
    rms_eps: f32,
    pre_eps: f32,
    sinkhorn_eps: f32,
    post_mult: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xw: array<u32>;
@group(0) @binding(2) var<storage, read> fw: array<u32>;
@group(0) @binding(3) var<storage, read> bw: array<u32>;
@group(0) @binding(4) var<storage, read> a1w: array<u32>;
@group(0) @binding(5) var<storage, read> a2w: array<u32>;
@group(0) @binding(6) var<storage, read> a3w: array<u32>;
@group(0) @binding(7) var<storage, read> h1w: array<u32>;
@group(0) @binding(8) var<storage, read> h2w: array<u32>;
@group(0) @binding(9) var<storage, read> h3w: array<u32>;
@group(0) @binding(10) var<storage, read> g1w: array<u32>;
@group(0) @binding(11) var<storage, read> g2w: array<u32>;
@group(0) @binding(12) var<storage, read> g3w: array<u32>;
@group(0) @binding(13) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(14) var<storage, read_write> mix: array<f32>;
@group(0) @binding(15) var<storage, read_write> invr: array<f32>;
@group(0) @binding(16) var<storage, read_write> o1: array<f32>;
@group(0) @binding(17) var<storage, read_write> o2: array<f32>;
@group(0) @binding(18) var<storage, read_write> o3: array<f32>;
@group(0) @binding(19) var<storage, read_write> dz: array<f32>;
@group(0) @binding(20) var<storage, read_write> rows: array<f32>;
@group(0) @binding(21) var<storage, read_write> dx: array<u32>;   // F32, or 16-bit words (DO)
@group(0) @binding(22) var<storage, read_write> df: array<u32>;   // as dx
@group(0) @binding(23) var<storage, read_write> outw: array<u32>;

var<workgroup> mat: array<f32, MAX_ENTRIES>;
var<workgroup> glog: array<f32, MAX_M>;

fn x_at(i: u32) -> f32 {
    if (DX == DT_F32) {
        return bitcast<f32>(xw[i]);
    }
    return half_from_word(xw[i >> 1u], i, DX);
}

fn f_at(i: u32) -> f32 {
    if (DF == DT_F32) {
        return bitcast<f32>(fw[i]);
    }
    return half_from_word(fw[i >> 1u], i, DF);
}

fn b_at(i: u32) -> f32 {
    if (DB == DT_F32) {
        return bitcast<f32>(bw[i]);
    }
    return half_from_word(bw[i >> 1u], i, DB);
}

fn h1_at(i: u32) -> f32 {
    if (DH1 == DT_F32) {
        return bitcast<f32>(h1w[i]);
    }
    return half_from_word(h1w[i >> 1u], i, DH1);
}

fn h2_at(i: u32) -> f32 {
    if (DH2 == DT_F32) {
        return bitcast<f32>(h2w[i]);
    }
    return half_from_word(h2w[i >> 1u], i, DH2);
}

fn h3_at(i: u32) -> f32 {
    if (DH3 == DT_F32) {
        return bitcast<f32>(h3w[i]);
    }
    return half_from_word(h3w[i >> 1u], i, DH3);
}

fn g1_at(i: u32) -> f32 {
    if (DG1 == DT_F32) {
        return bitcast<f32>(g1w[i]);
    }
    return half_from_word(g1w[i >> 1u], i, DG1);
}

fn g2_at(i: u32) -> f32 {
    if (DG2 == DT_F32) {
        return bitcast<f32>(g2w[i]);
    }
    return half_from_word(g2w[i >> 1u], i, DG2);
}

fn g3_at(i: u32) -> f32 {
    if (DG3 == DT_F32) {
        return bitcast<f32>(g3w[i]);
    }
    return half_from_word(g3w[i >> 1u], i, DG3);
}

// Element 0 of a one-element tensor of dtype `dt` held in `word`.
fn scalar_of(word: u32, dt: u32) -> f32 {
    if (dt == DT_F32) {
        return bitcast<f32>(word);
    }
    return half_from_word(word, 0u, dt);
}

fn sigmoid(z: f32) -> f32 {
    return 1.0 / (1.0 + exp(-z));
}

// b then alpha_pre, alpha_post, alpha_res as F32 at the head of `scratch`. One workgroup.
@compute @workgroup_size(WG)
fn pack(@builtin(local_invocation_index) lid: u32) {
    let m = params.m;
    for (var j = lid; j < m; j = j + WG) {
        scratch[j] = b_at(j);
    }
    if (lid == 0u) {
        scratch[m] = scalar_of(a1w[0], DA1);
        scratch[m + 1u] = scalar_of(a2w[0], DA2);
        scratch[m + 2u] = scalar_of(a3w[0], DA3);
    }
}

// Sinkhorn–Knopp over the n × n logits, lane e < n² holding entry e (`logit`); returns the
// lane's entry of the result. With `keep`, step s's R (P for s = 0), row denominators and
// column denominators go to scratch[hist + s·M ..] as [R (n²) | rows (n) | columns (n)].
// Uniform control flow only (barriers).
fn sinkhorn(logit: f32, lid: u32, hist: u32, keep: bool) -> f32 {
    let n = params.hc;
    let nn = n * n;
    let m = params.m;
    let eps = params.sinkhorn_eps;
    let owner = lid < nn;
    let i = lid / n;
    let j = lid % n;
    if (owner) {
        mat[lid] = logit;
    }
    workgroupBarrier();
    var e = 0.0;
    if (owner) {
        var top = mat[i * n];
        for (var k = 1u; k < n; k = k + 1u) {
            top = max(top, mat[i * n + k]);
        }
        e = exp(logit - top);
    }
    workgroupBarrier();
    if (owner) {
        mat[lid] = e;
    }
    workgroupBarrier();
    var p = 0.0;
    if (owner) {
        var s = 0.0;
        for (var k = 0u; k < n; k = k + 1u) {
            s = s + mat[i * n + k];
        }
        p = e / s;
    }
    workgroupBarrier();
    if (owner) {
        mat[lid] = p + eps;
    }
    workgroupBarrier();
    var y = 0.0;
    if (owner) {
        var s = 0.0;
        for (var k = 0u; k < n; k = k + 1u) {
            s = s + mat[k * n + j];
        }
        let dc = s + eps;
        y = (p + eps) / dc;
        if (keep) {
            scratch[hist + lid] = p;
            if (i == 0u) {
                scratch[hist + nn + n + j] = dc;
            }
        }
    }
    workgroupBarrier();
    if (owner) {
        mat[lid] = y;
    }
    workgroupBarrier();
    for (var step = 1u; step < params.tmax; step = step + 1u) {
        var r = 0.0;
        var dr = 0.0;
        if (owner) {
            var s = 0.0;
            for (var k = 0u; k < n; k = k + 1u) {
                s = s + mat[i * n + k];
            }
            dr = s + eps;
            r = y / dr;
        }
        workgroupBarrier();
        if (owner) {
            mat[lid] = r;
        }
        workgroupBarrier();
        if (owner) {
            var s = 0.0;
            for (var k = 0u; k < n; k = k + 1u) {
                s = s + mat[k * n + j];
            }
            let dc = s + eps;
            y = r / dc;
            if (keep) {
                let h = hist + step * m;
                scratch[h + lid] = r;
                if (j == 0u) {
                    scratch[h + nn + i] = dr;
                }
                if (i == 0u) {
                    scratch[h + nn + n + j] = dc;
                }
            }
        }
        workgroupBarrier();
        if (owner) {
            mat[lid] = y;
        }
        workgroupBarrier();
    }
    return y;
}

@compute @workgroup_size(WG)
fn coeff_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.hc;
    let nn = n * n;
    let m = params.m;
    let k = n * params.c;
    var sq = 0.0;
    for (var i = lid; i < k; i = i + WG) {
        let v = x_at(t * k + i);
        sq = sq + v * v;
    }
    let r = 1.0 / sqrt(workgroup_sum(sq, lid) / f32(k) + params.rms_eps);
    if (lid == 0u) {
        invr[t] = r;
    }
    let row = t * m;
    // Each lane scales and reads back only the entries of `mix` it owns.
    if (lid < n) {
        let mp = mix[row + lid] * r;
        let mq = mix[row + n + lid] * r;
        mix[row + lid] = mp;
        mix[row + n + lid] = mq;
        o1[t * n + lid] = sigmoid(scratch[m] * mp + scratch[lid]) + params.pre_eps;
        o2[t * n + lid] = params.post_mult * sigmoid(scratch[m + 1u] * mq + scratch[n + lid]);
    }
    var logit = 0.0;
    if (lid < nn) {
        let mr = mix[row + 2u * n + lid] * r;
        mix[row + 2u * n + lid] = mr;
        logit = scratch[m + 2u] * mr + scratch[2u * n + lid];
    }
    let y = sinkhorn(logit, lid, 0u, false);
    if (lid < nn) {
        o3[t * nn + lid] = y;
    }
}

@compute @workgroup_size(WG)
fn coeff_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.hc;
    let nn = n * n;
    let m = params.m;
    let eps = params.sinkhorn_eps;
    let row = t * m;
    let hist = params.base + t * params.stride;
    let r = invr[t];
    let owner = lid < nn;
    let i = lid / n;
    let j = lid % n;
    var g_res = 0.0;
    if ((params.flags & 4u) != 0u) {
        var logit = 0.0;
        if (owner) {
            logit = scratch[m + 2u] * mix[row + 2u * n + lid] + scratch[2u * n + lid];
        }
        _ = sinkhorn(logit, lid, hist, true);
        storageBarrier();
        var g = 0.0;
        if (owner) {
            g = g3_at(t * nn + lid);
        }
        for (var q = 1u; q < params.tmax; q = q + 1u) {
            let h = hist + (params.tmax - q) * m;
            if (owner) {
                mat[lid] = g;
            }
            workgroupBarrier();
            // Column normalization Y = R / d.
            var gr = 0.0;
            if (owner) {
                let d = scratch[h + nn + n + j];
                var dot = 0.0;
                for (var k = 0u; k < n; k = k + 1u) {
                    dot = dot + mat[k * n + j] * (scratch[h + k * n + j] / d);
                }
                gr = (g - dot) / d;
            }
            workgroupBarrier();
            if (owner) {
                mat[lid] = gr;
            }
            workgroupBarrier();
            // Row normalization R = Y_prev / d.
            if (owner) {
                let d = scratch[h + nn + i];
                var dot = 0.0;
                for (var k = 0u; k < n; k = k + 1u) {
                    dot = dot + mat[i * n + k] * scratch[h + i * n + k];
                }
                g = (gr - dot) / d;
            }
            workgroupBarrier();
        }
        // Step 0: Y₀ = (P + ε) / d, P the row softmax of the logits.
        if (owner) {
            mat[lid] = g;
        }
        workgroupBarrier();
        var gp = 0.0;
        var p = 0.0;
        if (owner) {
            let d = scratch[hist + nn + n + j];
            var dot = 0.0;
            for (var k = 0u; k < n; k = k + 1u) {
                dot = dot + mat[k * n + j] * ((scratch[hist + k * n + j] + eps) / d);
            }
            gp = (g - dot) / d;
            p = scratch[hist + lid];
        }
        workgroupBarrier();
        if (owner) {
            mat[lid] = gp * p;
        }
        workgroupBarrier();
        if (owner) {
            var dot = 0.0;
            for (var k = 0u; k < n; k = k + 1u) {
                dot = dot + mat[i * n + k];
            }
            g_res = p * (gp - dot);
        }
        workgroupBarrier();
    }
    let ap = scratch[m];
    let aq = scratch[m + 1u];
    let ar = scratch[m + 2u];
    let prow = t * (m + 3u);
    if (lid < n) {
        var gp = 0.0;
        var gq = 0.0;
        if ((params.flags & 1u) != 0u) {
            let s = sigmoid(ap * mix[row + lid] + scratch[lid]);
            gp = g1_at(t * n + lid) * (s * (1.0 - s));
        }
        if ((params.flags & 2u) != 0u) {
            let s = sigmoid(aq * mix[row + n + lid] + scratch[n + lid]);
            gq = g2_at(t * n + lid) * (params.post_mult * (s * (1.0 - s)));
        }
        glog[lid] = gp;
        glog[n + lid] = gq;
        rows[prow + lid] = gp;
        rows[prow + n + lid] = gq;
        dz[row + lid] = gp * ap * r;
        dz[row + n + lid] = gq * aq * r;
    }
    if (owner) {
        glog[2u * n + lid] = g_res;
        rows[prow + 2u * n + lid] = g_res;
        dz[row + 2u * n + lid] = g_res * ar * r;
    }
    workgroupBarrier();
    if (lid == 0u) {
        // Σ g_logit·mix per segment (the alphas' terms), and Σ g_mix·mix for the RMS factor.
        var s_pre = 0.0;
        var s_post = 0.0;
        var s_res = 0.0;
        for (var q = 0u; q < n; q = q + 1u) {
            s_pre = s_pre + glog[q] * mix[row + q];
            s_post = s_post + glog[n + q] * mix[row + n + q];
        }
        for (var q = 0u; q < nn; q = q + 1u) {
            s_res = s_res + glog[2u * n + q] * mix[row + 2u * n + q];
        }
        rows[prow + m] = s_pre;
        rows[prow + m + 1u] = s_post;
        rows[prow + m + 2u] = s_res;
        let g_mix = (ap * s_pre + aq * s_post) + ar * s_res;
        scratch[hist + params.tmax * m] = -(g_mix * r * r) / f32(n * params.c);
    }
}

// dx = factor·x, before the product dz·phiᵀ is added to it.
@compute @workgroup_size(WG)
fn coeff_dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let k = params.hc * params.c;
    let factor = scratch[params.base + t * params.stride + params.tmax * params.m];
    for (var i = lid; i < k; i = i + WG) {
        dx[t * k + i] = bitcast<u32>(factor * x_at(t * k + i));
    }
}

@compute @workgroup_size(WG)
fn pre_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.hc;
    let c = params.c;
    if (DO == DT_F32) {
        for (var col = lid; col < c; col = col + WG) {
            var acc = 0.0;
            for (var i = 0u; i < n; i = i + 1u) {
                acc = acc + h1_at(t * n + i) * x_at((t * n + i) * c + col);
            }
            outw[t * c + col] = bitcast<u32>(acc);
        }
        return;
    }
    // 16-bit, even C: a lane owns the column pair (2p, 2p + 1).
    for (var p = lid; 2u * p < c; p = p + WG) {
        var acc = vec2<f32>();
        for (var i = 0u; i < n; i = i + 1u) {
            let at = (t * n + i) * c + 2u * p;
            acc = acc + h1_at(t * n + i) * vec2<f32>(x_at(at), x_at(at + 1u));
        }
        outw[((t * c) >> 1u) + p] = pack_halves(acc.x, acc.y, DO);
    }
}

@compute @workgroup_size(WG)
fn pre_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.hc;
    let c = params.c;
    for (var i = 0u; i < n; i = i + 1u) {
        let h = h1_at(t * n + i);
        var s = 0.0;
        for (var col = lid; col < c; col = col + WG) {
            let g = g1_at(t * c + col);
            let at = (t * n + i) * c + col;
            if (DO == DT_F32) {
                dx[at] = bitcast<u32>(h * g);
            }
            s = s + g * x_at(at);
        }
        if (DO != DT_F32) {
            // A 16-bit dx (even C): column pairs, each value h·g rounded once (g read again:
            // the row sum above keeps the F32 path's lane order, so d h_pre's bits).
            for (var p = lid; 2u * p < c; p = p + WG) {
                let at = (t * n + i) * c + 2u * p;
                let g = vec2<f32>(g1_at(t * c + 2u * p), g1_at(t * c + 2u * p + 1u));
                dx[at >> 1u] = pack_halves(h * g.x, h * g.y, DO);
            }
        }
        let total = workgroup_sum(s, lid);
        if (lid == 0u) {
            o1[t * n + i] = total;
        }
    }
}

// h_post[o]·f + Σ_i h_res[o, i]·x_i at column `col` of token t.
fn post_value(t: u32, o: u32, col: u32) -> f32 {
    let n = params.hc;
    let c = params.c;
    var acc = h2_at(t * n + o) * f_at(t * c + col);
    for (var i = 0u; i < n; i = i + 1u) {
        acc = acc + h3_at((t * n + o) * n + i) * x_at((t * n + i) * c + col);
    }
    return acc;
}

@compute @workgroup_size(WG)
fn post_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.hc;
    let c = params.c;
    for (var o = 0u; o < n; o = o + 1u) {
        let base = (t * n + o) * c;
        if (DO == DT_F32) {
            for (var col = lid; col < c; col = col + WG) {
                outw[base + col] = bitcast<u32>(post_value(t, o, col));
            }
        } else {
            for (var p = lid; 2u * p < c; p = p + WG) {
                let lo = post_value(t, o, 2u * p);
                let hi = post_value(t, o, 2u * p + 1u);
                outw[(base >> 1u) + p] = pack_halves(lo, hi, DO);
            }
        }
    }
}

// d f_out at column `col` of token t: Σ_o h_post[o]·g[o, col].
fn post_df(t: u32, col: u32) -> f32 {
    let n = params.hc;
    let c = params.c;
    var gf = 0.0;
    for (var o = 0u; o < n; o = o + 1u) {
        gf = gf + h2_at(t * n + o) * g1_at((t * n + o) * c + col);
    }
    return gf;
}

// dx of stream i at column `col` of token t: Σ_o h_res[o, i]·g[o, col].
fn post_dx(t: u32, i: u32, col: u32) -> f32 {
    let n = params.hc;
    let c = params.c;
    var gx = 0.0;
    for (var o = 0u; o < n; o = o + 1u) {
        gx = gx + h3_at((t * n + o) * n + i) * g1_at((t * n + o) * c + col);
    }
    return gx;
}

@compute @workgroup_size(WG)
fn post_backward_x(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.hc;
    let c = params.c;
    if (DO == DT_F32) {
        for (var col = lid; col < c; col = col + WG) {
            df[t * c + col] = bitcast<u32>(post_df(t, col));
            for (var i = 0u; i < n; i = i + 1u) {
                dx[(t * n + i) * c + col] = bitcast<u32>(post_dx(t, i, col));
            }
        }
        return;
    }
    // 16-bit dx and d f_out (even C): column pairs, each value rounded once.
    for (var p = lid; 2u * p < c; p = p + WG) {
        let col = 2u * p;
        df[(t * c + col) >> 1u] = pack_halves(post_df(t, col), post_df(t, col + 1u), DO);
        for (var i = 0u; i < n; i = i + 1u) {
            let at = (t * n + i) * c + col;
            dx[at >> 1u] = pack_halves(post_dx(t, i, col), post_dx(t, i, col + 1u), DO);
        }
    }
}

@compute @workgroup_size(WG)
fn post_backward_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.tokens) {
        return;
    }
    let n = params.hc;
    let c = params.c;
    for (var o = 0u; o < n; o = o + 1u) {
        let go = (t * n + o) * c;
        var s = 0.0;
        for (var col = lid; col < c; col = col + WG) {
            s = s + g1_at(go + col) * f_at(t * c + col);
        }
        let total = workgroup_sum(s, lid);
        if (lid == 0u) {
            o1[t * n + o] = total;
        }
        for (var i = 0u; i < n; i = i + 1u) {
            var si = 0.0;
            for (var col = lid; col < c; col = col + WG) {
                si = si + g1_at(go + col) * x_at((t * n + i) * c + col);
            }
            let ti = workgroup_sum(si, lid);
            if (lid == 0u) {
                o2[(t * n + o) * n + i] = ti;
            }
        }
    }
}
