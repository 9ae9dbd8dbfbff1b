// Losses and normalizers over the last axis: softmax, log-softmax, sparsemax, cross-entropy
// (integer and soft targets) and the divergences KL, JSD and TVD, forward and backward.
//
// One workgroup per row for everything that needs a row statistic. Lane t takes columns
// t, t + WG, ... in order, keeping an online maximum and a sum of exponentials relative to it;
// lanes meet in the fixed-order trees of wgsl/common/reduce.wgsl, so no row is ever held in
// workgroup memory and any width works. Cross-row sums (sum/mean reductions) are written as
// per-row partial matrices and finished on the host side with the fixed-order column sums of
// the reduce family, then by the *_finish entries. No atomics.
//
// Floating inputs are bound as u32 words (F32, or two F16/BF16 halves per word); gradients and
// loss values are F32.

override DT: u32 = 0u;    // dtype of x (logits / input / student)
override TDT: u32 = 0u;   // dtype of the second floating input (dy, target distribution)
override ODT: u32 = 0u;   // dtype of the row output of softmax / log_softmax / sparsemax (softmax_bwd_h: of dx)
override MODE: u32 = 0u;  // softmax: 0 softmax, 1 log-softmax; divergences: 0 KL, 1 JSD, 2 TVD
// Softmax backwards: the first input is the forward's output y, not x (p = y, log-softmax
// p = exp(y)); the statistics are not read.
override FROM_OUT: bool = false;
// WG, the workgroup size, is defined by the part before this file: 256 lanes (the `loss`
// module) or 1024 (`loss_rows`, the register-resident row entries on adapters that allow it).

// Columns of the per-row matrix of the cross-entropy forward ([rows, CE_COLS], F32).
const CE_COLS: u32 = 8u;
const CE_LOSS: u32 = 0u;    // cross-entropy part of the row loss (weighted, smoothed)
const CE_Z: u32 = 1u;       // z-loss part
const CE_WEIGHT: u32 = 2u;  // weight of the target class (1 without weights, 0 if ignored)
const CE_VALID: u32 = 3u;   // 1 for a counted row, 0 for an ignored one
const CE_CORRECT: u32 = 4u; // 1 when the argmax equals the target
const CE_MAX: u32 = 5u;     // row maximum of the (softcapped) logits
const CE_LOGDEN: u32 = 6u;  // log Σ exp(z − max)
const CE_WSUM: u32 = 7u;    // Σ_c w_c (smoothing) or Σ_c t_c (soft targets)

const F_WEIGHT: u32 = 1u;    // class weights bound
const F_LABELS: u32 = 2u;    // divergences: label rows with ignore_index are skipped
const F_LOG_TARGET: u32 = 4u;// KL: target given as log-probabilities
const F_COT_ROW: u32 = 8u;   // cotangent per row (cross-entropy, reduction none)
const F_COT_ELEM: u32 = 16u; // cotangent per element (divergences, reduction none)
const F_MEAN: u32 = 32u;     // finish: mean reduction
const F_BATCHMEAN: u32 = 64u;// divergence finish: divide by counted rows
const F_PARTIALS: u32 = 128u;// ce_grad_over: also the column partials of the block's matrix
const F_NO_PRED: u32 = 256u; // cross-entropy forwards: no predictions asked (`pred` unbound)
const F_ENTROPY: u32 = 512u; // ce_block_stats / ce_block_finish: the entropy's sum too

struct Params {
    rows: u32,
    cols: u32,
    flags: u32,
    ignore_index: i32,
    a: f32,  // cross-entropy: label smoothing ε; JSD: β
    b: f32,  // cross-entropy: z-loss coefficient
    c: f32,  // cross-entropy: softcap (0 = off)
    row0: u32, // first row of the per-row tensors (targets/labels, per-row statistics,
              // predictions, per-row cotangents) for a launch over a block of rows; 0 otherwise
    col0: u32, // cross-entropy gradients: the class of a launch's column 0 (a block of columns)
    classes: u32, // cross-entropy: the number of classes when a launch covers a block of
                  // columns; 0: the row width `cols`
    partials: u32, // ce_grad_over with F_PARTIALS: the first word of the block's column partials
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> y_out: array<u32>;
@group(0) @binding(3) var<storage, read_write> stats_out: array<f32>;
@group(0) @binding(4) var<storage, read> stats_in: array<f32>;
@group(0) @binding(5) var<storage, read> second: array<u32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read> labels: array<i32>;
@group(0) @binding(8) var<storage, read> weights: array<f32>;
@group(0) @binding(9) var<storage, read_write> pred: array<i32>;
@group(0) @binding(10) var<storage, read> final_in: array<f32>;
@group(0) @binding(11) var<storage, read> cot: array<f32>;
@group(0) @binding(12) var<storage, read_write> out_f32: array<f32>;
@group(0) @binding(13) var<storage, read_write> out2_f32: array<f32>;

var<workgroup> wg_best: array<f32, WG>;
var<workgroup> wg_index: array<u32, WG>;
var<workgroup> wg_uniform: f32;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn ld_x(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(x[i]);
    }
    return half_from_word(x[i >> 1u], i, DT);
}

fn ld_second(i: u32) -> f32 {
    if (TDT == DT_F32) {
        return bitcast<f32>(second[i]);
    }
    return half_from_word(second[i >> 1u], i, TDT);
}

// Online (max, Σ exp(z − max)) update of one lane; −∞ entries add nothing.
fn online(state: vec2<f32>, z: f32) -> vec2<f32> {
    if (z > state.x) {
        return vec2<f32>(z, state.y * exp(state.x - z) + 1.0);
    }
    if (z == neg_inf()) {
        return state;
    }
    return vec2<f32>(state.x, state.y + exp(z - state.x));
}

// Row maximum and Σ exp(z − maximum) from the lanes' online states (uniform control flow).
fn row_max_sum(state: vec2<f32>, lid: u32) -> vec2<f32> {
    let m = workgroup_max(state.x, lid);
    var part = 0.0;
    if (state.y > 0.0) {
        part = state.y * exp(state.x - m);
    }
    return vec2<f32>(m, workgroup_sum(part, lid));
}

// Row maximum and log denominator from the lanes' online states (uniform control flow).
fn row_stats(state: vec2<f32>, lid: u32) -> vec2<f32> {
    let ms = row_max_sum(state, lid);
    return vec2<f32>(ms.x, log(ms.y));
}

// Argmax over the lanes' (best value, lowest index) pairs: ties go to the lower index.
fn workgroup_argmax(v: f32, index: u32, lid: u32) -> u32 {
    wg_best[lid] = v;
    wg_index[lid] = index;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            let ov = wg_best[lid + stride];
            let oi = wg_index[lid + stride];
            let mv = wg_best[lid];
            let mi = wg_index[lid];
            if (ov > mv || (ov == mv && oi < mi) || (mv != mv && ov == ov)) {
                wg_best[lid] = ov;
                wg_index[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let best = wg_index[0];
    workgroupBarrier();
    return best;
}

// A value every lane sees as uniform (lane 0's), through workgroup memory.
fn broadcast(v: f32, lid: u32) -> f32 {
    if (lid == 0u) {
        wg_uniform = v;
    }
    return workgroupUniformLoad(&wg_uniform);
}

fn softmax_value(v: f32, m: f32, logden: f32) -> f32 {
    if (MODE == 1u) {
        return (v - m) - logden;
    }
    return exp((v - m) - logden);
}

// ---- softmax / log-softmax --------------------------------------------------------------

// y = softmax(x) or log_softmax(x) per row; stats_out[2r] = row max, [2r + 1] = log Σ exp(x − max).
@compute @workgroup_size(WG)
fn softmax_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    var st = vec2<f32>(neg_inf(), 0.0);
    for (var c = lid; c < cols; c = c + WG) {
        st = online(st, ld_x(base + c));
    }
    let rs = row_stats(st, lid);
    if (lid == 0u) {
        stats_out[2u * row] = rs.x;
        stats_out[2u * row + 1u] = rs.y;
    }
    if (ODT == DT_F32) {
        for (var c = lid; c < cols; c = c + WG) {
            y_out[base + c] = bitcast<u32>(softmax_value(ld_x(base + c), rs.x, rs.y));
        }
    } else {
        // 16-bit output: the host guarantees an even width, so rows start on word boundaries.
        let pairs = cols / 2u;
        let wbase = base / 2u;
        for (var p = lid; p < pairs; p = p + WG) {
            let lo = softmax_value(ld_x(base + 2u * p), rs.x, rs.y);
            let hi = softmax_value(ld_x(base + 2u * p + 1u), rs.x, rs.y);
            y_out[wbase + p] = pack_halves(lo, hi, ODT);
        }
    }
}

// The saved (maximum, log denominator) of a softmax row (zeros when FROM_OUT: not used).
fn softmax_stats(row: u32) -> vec2<f32> {
    if (FROM_OUT) {
        return vec2<f32>();
    }
    return vec2<f32>(stats_in[2u * row], stats_in[2u * row + 1u]);
}

// The softmax probabilities of four values v of a backward's first input: recomputed in FP32,
// exp((x − m) − logden), or from the output (FROM_OUT): y, log-softmax exp(y).
fn softmax_p4(v: vec4<f32>, m: f32, logden: f32) -> vec4<f32> {
    if (FROM_OUT) {
        if (MODE == 1u) {
            return exp(v);
        }
        return v;
    }
    return exp((v - vec4<f32>(m)) - vec4<f32>(logden));
}

fn softmax_p1(v: f32, m: f32, logden: f32) -> f32 {
    if (FROM_OUT) {
        if (MODE == 1u) {
            return exp(v);
        }
        return v;
    }
    return exp((v - m) - logden);
}

// dx from x, the saved statistics and dy (TDT): probabilities are recomputed in FP32 (or taken
// from the output y, FROM_OUT). softmax: dx = p (dy − Σ dy p); log-softmax: dx = dy − p Σ dy.
@compute @workgroup_size(WG)
fn softmax_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let st = softmax_stats(row);
    var acc = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        let g = ld_second(base + c);
        if (MODE == 1u) {
            acc = acc + g;
        } else {
            acc = acc + g * softmax_p1(ld_x(base + c), st.x, st.y);
        }
    }
    let total = workgroup_sum(acc, lid);
    for (var c = lid; c < cols; c = c + WG) {
        let p = softmax_p1(ld_x(base + c), st.x, st.y);
        let g = ld_second(base + c);
        if (MODE == 1u) {
            dx[base + c] = g - p * total;
        } else {
            dx[base + c] = p * (g - total);
        }
    }
}

// ---- sparsemax --------------------------------------------------------------------------

// y = max(x − τ, 0) with Σ y = 1. With x' = x − max, τ' is found by Michelot's fixed point:
// τ' = (Σ_{x' > τ'} x' − 1) / |{x' > τ'}|, starting from every column; the support shrinks
// every round until it stops changing. stats_out[2r] = row max, [2r + 1] = τ'.
@compute @workgroup_size(WG)
fn sparsemax_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    var best = neg_inf();
    for (var c = lid; c < cols; c = c + WG) {
        best = max(best, ld_x(base + c));
    }
    let m = workgroup_max(best, lid);
    var s = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        s = s + (ld_x(base + c) - m);
    }
    var tau = broadcast((workgroup_sum(s, lid) - 1.0) / f32(cols), lid);
    var support = f32(cols);
    loop {
        var ls = 0.0;
        var lk = 0.0;
        for (var c = lid; c < cols; c = c + WG) {
            let v = ld_x(base + c) - m;
            if (v > tau) {
                ls = ls + v;
                lk = lk + 1.0;
            }
        }
        let total = workgroup_sum(ls, lid);
        let k = broadcast(workgroup_sum(lk, lid), lid);
        if (k >= support || k == 0.0) {
            break;
        }
        support = k;
        tau = broadcast((total - 1.0) / k, lid);
    }
    if (lid == 0u) {
        stats_out[2u * row] = m;
        stats_out[2u * row + 1u] = tau;
    }
    if (ODT == DT_F32) {
        for (var c = lid; c < cols; c = c + WG) {
            y_out[base + c] = bitcast<u32>(max((ld_x(base + c) - m) - tau, 0.0));
        }
    } else {
        let pairs = cols / 2u;
        let wbase = base / 2u;
        for (var p = lid; p < pairs; p = p + WG) {
            let lo = max((ld_x(base + 2u * p) - m) - tau, 0.0);
            let hi = max((ld_x(base + 2u * p + 1u) - m) - tau, 0.0);
            y_out[wbase + p] = pack_halves(lo, hi, ODT);
        }
    }
}

// dx_i = dy_i − mean_{support} dy on the support {x' > τ'}, 0 elsewhere.
@compute @workgroup_size(WG)
fn sparsemax_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let m = stats_in[2u * row];
    let tau = stats_in[2u * row + 1u];
    var ls = 0.0;
    var lk = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        if (ld_x(base + c) - m > tau) {
            ls = ls + ld_second(base + c);
            lk = lk + 1.0;
        }
    }
    let total = workgroup_sum(ls, lid);
    let k = workgroup_sum(lk, lid);
    var mean = 0.0;
    if (k > 0.0) {
        mean = total / k;
    }
    for (var c = lid; c < cols; c = c + WG) {
        var g = 0.0;
        if (ld_x(base + c) - m > tau) {
            g = ld_second(base + c) - mean;
        }
        dx[base + c] = g;
    }
}

// ---- cross-entropy ----------------------------------------------------------------------

// tanh_accurate: wgsl/common/softcap.wgsl.
fn softcapped(v: f32) -> f32 {
    if (params.c > 0.0) {
        return params.c * tanh_accurate(v / params.c);
    }
    return v;
}

fn class_weight(c: u32) -> f32 {
    if ((params.flags & F_WEIGHT) != 0u) {
        return weights[c];
    }
    return 1.0;
}

// Whether the row's target counts: not ignore_index and inside [0, cols) (out-of-range targets
// are rejected on the host unless the caller turned the check off; then they count as ignored).
fn target_valid(t: i32) -> bool {
    return t != params.ignore_index && t >= 0 && u32(t) < ce_classes();
}

// The cross-entropy's number of classes: the row width, or `classes` for a launch over a block
// of columns (whose column c is class col0 + c).
fn ce_classes() -> u32 {
    if (params.classes == 0u) {
        return params.cols;
    }
    return params.classes;
}

// The columns of the launch's row from word `base` (lane t: t, t + WG, ...; column c is class
// col0 + c), reduced over the workgroup in fixed trees (uniform control flow): the maximum m and
// Σ exp(z − m) of the softcapped logits z, the label smoothing's Σ w_c (z_c − reference) and
// Σ w_c (0 without smoothing), the argmax of the raw logits (ties to the lowest class), and
// with F_ENTROPY the entropy's Σ exp(z − m)·(z − m) (else 0).
struct CeScan {
    ms: vec2<f32>,
    sum_wz: f32,
    sum_w: f32,
    arg: u32,
    t: f32,
}

// Σ exp(z − m)·(z − m) of a state (m, s, t) rescaled to the maximum `to` ≥ m: the terms'
// common factor exp(m − to) and their shift (m − to) times Σ exp(z − m). An empty state (s 0)
// gives 0.
fn entropy_sum_at(m: f32, s: f32, t: f32, to: f32) -> f32 {
    if (s > 0.0) {
        return exp(m - to) * (t + (m - to) * s);
    }
    return 0.0;
}

fn ce_scan(base: u32, col0: u32, reference: f32, lid: u32) -> CeScan {
    let eps = params.a;
    let with_t = (params.flags & F_ENTROPY) != 0u;
    var st = vec2<f32>(neg_inf(), 0.0);
    var t = 0.0;
    var best = neg_inf();
    var best_index = col0;
    var wz = 0.0;
    var wsum = 0.0;
    for (var c = lid; c < params.cols; c = c + WG) {
        let raw = ld_x(base + c);
        let z = softcapped(raw);
        if (with_t) {
            if (z > st.x) {
                t = entropy_sum_at(st.x, st.y, t, z);
            } else if (z != neg_inf()) {
                t = t + exp(z - st.x) * (z - st.x);
            }
        }
        st = online(st, z);
        if (raw > best) {
            best = raw;
            best_index = col0 + c;
        }
        if (eps > 0.0) {
            let w = class_weight(col0 + c);
            wz = wz + w * (z - reference);
            wsum = wsum + w;
        }
    }
    let ms = row_max_sum(st, lid);
    var sum_wz = 0.0;
    var sum_w = 0.0;
    if (eps > 0.0) { // uniform: a parameter
        sum_wz = workgroup_sum(wz, lid);
        sum_w = workgroup_sum(wsum, lid);
    }
    var sum_t = 0.0;
    if (with_t) { // uniform: a parameter
        sum_t = workgroup_sum(entropy_sum_at(st.x, st.y, t, ms.x), lid);
    }
    return CeScan(ms, sum_wz, sum_w, workgroup_argmax(best, best_index, lid), sum_t);
}

// Per-row cross-entropy with integer targets into stats_out ([rows, CE_COLS], see above) and
// the argmax of the raw logits into pred (ties to the lowest index; −1 for an ignored row).
// loss = (1 − ε) w_y (lse − z_y) + ε/C Σ_c w_c (lse − z_c), z = softcap(x), lse = max + logden,
// each difference taken against the row maximum so that a large common shift cancels exactly.
@compute @workgroup_size(WG)
fn ce_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let eps = params.a;
    let reference = softcapped(ld_x(base));
    let scan = ce_scan(base, 0u, reference, lid);
    let rs = vec2<f32>(scan.ms.x, log(scan.ms.y));
    let sum_wz = scan.sum_wz;
    let sum_w = scan.sum_w;
    let arg = scan.arg;
    if (lid == 0u) {
        let t = labels[params.row0 + row];
        let o = (params.row0 + row) * CE_COLS;
        var loss = 0.0;
        var zl = 0.0;
        var wy = 0.0;
        var valid = 0.0;
        var correct = 0.0;
        if (target_valid(t)) {
            let ti = u32(t);
            let zy = softcapped(ld_x(base + ti));
            wy = class_weight(ti);
            valid = 1.0;
            loss = (1.0 - eps) * wy * ((rs.x - zy) + rs.y);
            if (eps > 0.0) {
                let spread = sum_w * (rs.x - reference) - sum_wz;
                loss = loss + eps / f32(cols) * (spread + sum_w * rs.y);
            }
            let lse = rs.x + rs.y;
            zl = params.b * lse * lse;
            if (arg == ti) {
                correct = 1.0;
            }
            store_pred(row, i32(arg));
        } else {
            store_pred(row, -1);
        }
        stats_out[o + CE_LOSS] = loss;
        stats_out[o + CE_Z] = zl;
        stats_out[o + CE_WEIGHT] = wy;
        stats_out[o + CE_VALID] = valid;
        stats_out[o + CE_CORRECT] = correct;
        stats_out[o + CE_MAX] = rs.x;
        stats_out[o + CE_LOGDEN] = rs.y;
        stats_out[o + CE_WSUM] = sum_w;
    }
}

// Cross-entropy with a target distribution t (TDT): loss = Σ_c t_c (lse − x_c).
@compute @workgroup_size(WG)
fn ce_soft_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let reference = ld_x(base);
    var st = vec2<f32>(neg_inf(), 0.0);
    var tz = 0.0;
    var tsum = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        let z = ld_x(base + c);
        let t = ld_second(base + c);
        st = online(st, z);
        tz = tz + t * (z - reference);
        tsum = tsum + t;
    }
    let rs = row_stats(st, lid);
    let sum_tz = workgroup_sum(tz, lid);
    let sum_t = workgroup_sum(tsum, lid);
    if (lid == 0u) {
        let o = (params.row0 + row) * CE_COLS;
        stats_out[o + CE_LOSS] = (sum_t * (rs.x - reference) - sum_tz) + sum_t * rs.y;
        stats_out[o + CE_Z] = 0.0;
        stats_out[o + CE_WEIGHT] = 1.0;
        stats_out[o + CE_VALID] = 1.0;
        stats_out[o + CE_CORRECT] = 0.0;
        stats_out[o + CE_MAX] = rs.x;
        stats_out[o + CE_LOGDEN] = rs.y;
        stats_out[o + CE_WSUM] = sum_t;
    }
}

// From the column sums of the per-row matrix (stats_in, CE_COLS values) to
// out_f32 = [loss, z-loss, accuracy, ce scale, z scale, counted rows, 0, 0].
// Mean divides the cross-entropy part by Σ w_y (with weights) or the counted rows, and the
// z-loss part by the counted rows; a zero denominator gives zero (all rows ignored).
@compute @workgroup_size(1)
fn ce_finish() {
    let ce = stats_in[CE_LOSS];
    let zl = stats_in[CE_Z];
    let wy = stats_in[CE_WEIGHT];
    let n = stats_in[CE_VALID];
    let correct = stats_in[CE_CORRECT];
    var loss = ce + zl;
    var z = zl;
    var scale_ce = 1.0;
    var scale_z = 1.0;
    if ((params.flags & F_MEAN) != 0u) {
        var den = n;
        if ((params.flags & F_WEIGHT) != 0u) {
            den = wy;
        }
        var ce_mean = 0.0;
        scale_ce = 0.0;
        if (den != 0.0) {
            ce_mean = ce / den;
            scale_ce = 1.0 / den;
        }
        z = 0.0;
        scale_z = 0.0;
        if (n != 0.0) {
            z = zl / n;
            scale_z = 1.0 / n;
        }
        loss = ce_mean + z;
    }
    var accuracy = 0.0;
    if (n != 0.0) {
        accuracy = correct / n;
    }
    out_f32[0] = loss;
    out_f32[1] = z;
    out_f32[2] = accuracy;
    out_f32[3] = scale_ce;
    out_f32[4] = scale_z;
    out_f32[5] = n;
    out_f32[6] = 0.0;
    out_f32[7] = 0.0;
}

// Reduction none: the per-row loss (cross-entropy + z-loss) and z-loss columns as [rows] each.
@compute @workgroup_size(WG)
fn ce_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg) * WG + lid;
    if (r >= params.rows) {
        return;
    }
    out_f32[r] = stats_in[r * CE_COLS + CE_LOSS] + stats_in[r * CE_COLS + CE_Z];
    out2_f32[r] = stats_in[r * CE_COLS + CE_Z];
}

// Counting pass of a cross-entropy computed block by block (the fused linear losses): one
// invocation per row writes the target weight and the counted flag into the per-row matrix
// (every other column 0), so that ce_finish over its column sums gives the mean scales before
// any block's logits exist.
@compute @workgroup_size(WG)
fn ce_count(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg) * WG + lid;
    if (r >= params.rows) {
        return;
    }
    let counted = target_count(labels[r]);
    let o = r * CE_COLS;
    for (var k = 0u; k < CE_COLS; k = k + 1u) {
        stats_out[o + k] = 0.0;
    }
    stats_out[o + CE_WEIGHT] = counted.x;
    stats_out[o + CE_VALID] = counted.y;
}

// A target's (weight, counted) pair of the counting passes: (w_t, 1), or (0, 0) when ignored.
fn target_count(t: i32) -> vec2<f32> {
    if (target_valid(t)) {
        return vec2<f32>(class_weight(u32(t)), 1.0);
    }
    return vec2<f32>(0.0, 0.0);
}

// The counting pass straight into column partials (`cross_entropy_in_place`): one invocation
// per block of COUNT_ROWS rows (reduce's BLOCK_ROWS) writes the block's row [CE_COLS] of the
// partials of reduce's `column_partials` over ce_count's matrix, the same sums in the same
// order (from 0, row after row, an ignored row adding 0), so the same bits, without the matrix.
const COUNT_ROWS: u32 = 64u;

@compute @workgroup_size(WG)
fn ce_count_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let b = group_index(wid, nwg) * WG + lid;
    let first = b * COUNT_ROWS;
    if (first >= params.rows) {
        return;
    }
    let last = min(first + COUNT_ROWS, params.rows);
    var wsum = 0.0;
    var counted = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let c = target_count(labels[r]);
        wsum = wsum + c.x;
        counted = counted + c.y;
    }
    let o = b * CE_COLS;
    for (var k = 0u; k < CE_COLS; k = k + 1u) {
        stats_out[o + k] = 0.0;
    }
    stats_out[o + CE_WEIGHT] = wsum;
    stats_out[o + CE_VALID] = counted;
}

// Partial t of the column partials of reduce's `column_partials` over the launch's per-row
// matrix (stats_in, `[params.rows, CE_COLS]`): column t % CE_COLS summed over the t / CE_COLS-th
// block of COUNT_ROWS rows, from 0, top to bottom, so the same bits; written at word
// params.partials + t of stats_out.
fn ce_block_partials(t: u32) {
    if (t >= ((params.rows + COUNT_ROWS - 1u) / COUNT_ROWS) * CE_COLS) {
        return;
    }
    let col = t % CE_COLS;
    let first = (t / CE_COLS) * COUNT_ROWS;
    let last = min(first + COUNT_ROWS, params.rows);
    var acc = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        acc = acc + stats_in[r * CE_COLS + col];
    }
    stats_out[params.partials + t] = acc;
}

// A row's prediction (argmax, −1 ignored), unless none was asked for.
fn store_pred(row: u32, p: i32) {
    if ((params.flags & F_NO_PRED) == 0u) {
        pred[params.row0 + row] = p;
    }
}

fn row_cotangent(row: u32) -> f32 {
    if ((params.flags & F_COT_ROW) != 0u) {
        return cot[row];
    }
    return cot[0];
}

// What a row's gradient takes from the forward: the target (`valid` false for an ignored row,
// whose gradient is zero), the row's statistics and the scales of the cross-entropy and z-loss
// terms for the row's cotangent. `row` counts from the launch's first row (`params.row0`).
struct CeGradRow {
    valid: bool,
    ti: u32,
    m: f32,
    logden: f32,
    wy: f32,
    wsum: f32,
    f_ce: f32,
    f_z: f32,
}

fn ce_grad_row(row: u32) -> CeGradRow {
    let r = params.row0 + row;
    let t = labels[r];
    // Every load is issued before the target is tested (every row has its statistics), so
    // none waits for the label's.
    let o = r * CE_COLS;
    let m = stats_in[o + CE_MAX];
    let logden = stats_in[o + CE_LOGDEN];
    let wy = stats_in[o + CE_WEIGHT];
    let wsum = stats_in[o + CE_WSUM];
    let c = row_cotangent(r);
    let f_ce = c * final_in[3];
    let f_z = c * final_in[4] * 2.0 * params.b * (m + logden);
    if (!target_valid(t)) {
        return CeGradRow(false, 0u, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    }
    return CeGradRow(true, u32(t), m, logden, wy, wsum, f_ce, f_z);
}

// dlogits of the integer-target cross-entropy, recomputing p = exp(z − max − logden).
@compute @workgroup_size(WG)
fn ce_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let gr = ce_grad_row(row);
    if (!gr.valid) {
        for (var c = lid; c < cols; c = c + WG) {
            dx[base + c] = 0.0;
        }
        return;
    }
    let ti = gr.ti;
    let eps = params.a;
    let m = gr.m;
    let logden = gr.logden;
    let wy = gr.wy;
    let wsum = gr.wsum;
    let f_ce = gr.f_ce;
    let f_z = gr.f_z;
    let spread_w = eps / f32(ce_classes());
    for (var c = lid; c < cols; c = c + WG) {
        let raw = ld_x(base + c);
        let z = softcapped(raw);
        let p = exp((z - m) - logden);
        let label = params.col0 + c;
        var onehot = 0.0;
        if (label == ti) {
            onehot = 1.0;
        }
        var d = (1.0 - eps) * wy * (p - onehot);
        if (eps > 0.0) {
            d = d + spread_w * (wsum * p - class_weight(label));
        }
        d = d * f_ce + p * f_z;
        if (params.c > 0.0) {
            let th = z / params.c;
            d = d * (1.0 - th * th);
        }
        dx[base + c] = d;
    }
}

// dlogits of the soft-target cross-entropy: (Σ t) p − t.
@compute @workgroup_size(WG)
fn ce_soft_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let o = (params.row0 + row) * CE_COLS;
    let m = stats_in[o + CE_MAX];
    let logden = stats_in[o + CE_LOGDEN];
    let tsum = stats_in[o + CE_WSUM];
    let f = row_cotangent(params.row0 + row) * final_in[3];
    for (var c = lid; c < cols; c = c + WG) {
        let p = exp((ld_x(base + c) - m) - logden);
        dx[base + c] = (tsum * p - ld_second(base + c)) * f;
    }
}

// ---- divergences: KL (MODE 0), JSD (MODE 1), TVD (MODE 2) --------------------------------

// (loss, d loss / d x) of one element; x is the input (KL: log-probabilities; JSD: student
// log-probabilities; TVD: probabilities), t the target in the matching form.
fn divergence(xv: f32, t: f32) -> vec2<f32> {
    if (MODE == 0u) {
        if ((params.flags & F_LOG_TARGET) != 0u) {
            let pt = exp(t);
            return vec2<f32>(pt * (t - xv), -pt);
        }
        var xlogx = 0.0;
        if (t != 0.0) {
            xlogx = t * log(t);
        }
        return vec2<f32>(xlogx - t * xv, -t);
    }
    if (MODE == 1u) {
        let beta = params.a;
        if (beta == 0.0) {
            let p = exp(t);
            return vec2<f32>(p * (t - xv), -p);
        }
        if (beta == 1.0) {
            let q = exp(xv);
            let l = q * (xv - t);
            return vec2<f32>(l, l + q);
        }
        let q = exp(xv);
        let p = exp(t);
        let mix = beta * p + (1.0 - beta) * q;
        let log_mix = log(mix);
        let l = beta * p * (t - log_mix) + (1.0 - beta) * q * (xv - log_mix);
        return vec2<f32>(l, (1.0 - beta) * q * (xv - log_mix));
    }
    let diff = xv - t;
    return vec2<f32>(0.5 * abs(diff), 0.5 * sign(diff));
}

// Whether row `row` of the launch (label row0 + row) counts.
fn row_counted(row: u32) -> bool {
    if ((params.flags & F_LABELS) != 0u) {
        return labels[params.row0 + row] != params.ignore_index;
    }
    return true;
}

// stats_out[2r] = Σ_c loss (0 for a skipped row), [2r + 1] = 1 for a counted row.
@compute @workgroup_size(WG)
fn div_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    var acc = 0.0;
    for (var c = lid; c < cols; c = c + WG) {
        acc = acc + divergence(ld_x(base + c), ld_second(base + c)).x;
    }
    let total = workgroup_sum(acc, lid);
    if (lid == 0u) {
        if (row_counted(row)) {
            stats_out[2u * (params.row0 + row)] = total;
            stats_out[2u * (params.row0 + row) + 1u] = 1.0;
        } else {
            stats_out[2u * (params.row0 + row)] = 0.0;
            stats_out[2u * (params.row0 + row) + 1u] = 0.0;
        }
    }
}

// Reduction none: the elementwise loss (0 on skipped rows).
@compute @workgroup_size(WG)
fn div_elems(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.rows * params.cols) {
        return;
    }
    var l = 0.0;
    if (row_counted(i / params.cols)) {
        l = divergence(ld_x(i), ld_second(i)).x;
    }
    out_f32[i] = l;
}

// Counting pass of a divergence computed block by block: stats_out[2r] = 0, [2r + 1] = 1 for a
// counted row, so that div_finish over the column sums gives the scale before any block runs.
@compute @workgroup_size(WG)
fn div_count(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg) * WG + lid;
    if (r >= params.rows) {
        return;
    }
    var counted = 0.0;
    if (row_counted(r)) {
        counted = 1.0;
    }
    stats_out[2u * r] = 0.0;
    stats_out[2u * r + 1u] = counted;
}

// out_f32 = [loss, scale]: sum → Σ; mean → Σ / (counted rows · cols); batchmean → Σ / counted
// rows; a zero denominator gives zero loss and zero scale.
@compute @workgroup_size(1)
fn div_finish() {
    let total = stats_in[0];
    let n = stats_in[1];
    var den = 1.0;
    if ((params.flags & F_MEAN) != 0u) {
        den = n * f32(params.cols);
    }
    if ((params.flags & F_BATCHMEAN) != 0u) {
        den = n;
    }
    var loss = 0.0;
    var scale = 0.0;
    if (den != 0.0) {
        loss = total / den;
        scale = 1.0 / den;
    }
    out_f32[0] = loss;
    out_f32[1] = scale;
}

// d loss / d x, times the cotangent (per element for none, else the scalar) and the scale.
@compute @workgroup_size(WG)
fn div_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.rows * params.cols) {
        return;
    }
    var g = 0.0;
    if (row_counted(i / params.cols)) {
        var ct = cot[0];
        if ((params.flags & F_COT_ELEM) != 0u) {
            ct = cot[i];
        }
        g = divergence(ld_x(i), ld_second(i)).y * ct * final_in[1];
    }
    dx[i] = g;
}

// ---- vectorized row kernels ----------------------------------------------------------------
// The same softmax, log-softmax and cross-entropy kernels reading whole vec4<u32> chunks: 4
// F32 or 8 F16/BF16 elements per load (more bytes in flight per lane). The host picks them
// when every row is a whole number of chunks (columns a multiple of 4, or of 8 for 16-bit
// storage; the same dtype for x and dy); the per-lane order is chunk by chunk, lanes still
// meet in the fixed trees, so results are deterministic (and differ from the scalar entries
// only by rounding).

@group(0) @binding(14) var<storage, read> x4: array<vec4<u32>>;
@group(0) @binding(15) var<storage, read_write> y4: array<vec4<u32>>;
@group(0) @binding(16) var<storage, read> second4: array<vec4<u32>>;
@group(0) @binding(17) var<storage, read_write> dx4: array<vec4<f32>>;

fn pack_chunk(a: vec4<f32>, b: vec4<f32>, dt: u32) -> vec4<u32> {
    return narrow8(a, b, dt);
}

fn softmax4(v: vec4<f32>, m: f32, logden: f32) -> vec4<f32> {
    if (MODE == 1u) {
        return (v - vec4<f32>(m)) - vec4<f32>(logden);
    }
    return exp((v - vec4<f32>(m)) - vec4<f32>(logden));
}

@compute @workgroup_size(WG)
fn softmax_fwd_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let nv = params.cols / chunk_width(DT);
    let vbase = row * nv;
    var st = vec2<f32>(neg_inf(), 0.0);
    for (var v = lid; v < nv; v = v + WG) {
        let w = x4[vbase + v];
        st = online4(st, chunk_lo(w, DT));
        if (DT != DT_F32) {
            st = online4(st, chunk_hi(w, DT));
        }
    }
    let rs = row_stats(st, lid);
    if (lid == 0u) {
        stats_out[2u * row] = rs.x;
        stats_out[2u * row + 1u] = rs.y;
    }
    for (var v = lid; v < nv; v = v + WG) {
        let w = x4[vbase + v];
        let a = softmax4(chunk_lo(w, DT), rs.x, rs.y);
        if (DT == DT_F32) {
            y4[vbase + v] = bitcast<vec4<u32>>(a);
        } else {
            y4[vbase + v] = pack_chunk(a, softmax4(chunk_hi(w, DT), rs.x, rs.y), DT);
        }
    }
}

// Softmax / log-softmax backward contribution of four elements to the row sum.
fn softmax_bwd_acc(xv: vec4<f32>, g: vec4<f32>, m: f32, logden: f32) -> f32 {
    if (MODE == 1u) {
        return (g.x + g.y) + (g.z + g.w);
    }
    let q = softmax_p4(xv, m, logden) * g;
    return (q.x + q.y) + (q.z + q.w);
}

fn softmax_bwd_value(xv: vec4<f32>, g: vec4<f32>, m: f32, logden: f32, total: f32) -> vec4<f32> {
    let p = softmax_p4(xv, m, logden);
    if (MODE == 1u) {
        return g - p * total;
    }
    return p * (g - vec4<f32>(total));
}

// x and dy share the dtype DT; dx is F32 (dx4) or, for 16-bit x, ODT (y4).
@compute @workgroup_size(WG)
fn softmax_bwd_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let nv = params.cols / chunk_width(DT);
    let vbase = row * nv;
    let st = softmax_stats(row);
    let m = st.x;
    let logden = st.y;
    var acc = 0.0;
    for (var v = lid; v < nv; v = v + WG) {
        let w = x4[vbase + v];
        let g = second4[vbase + v];
        acc = acc + softmax_bwd_acc(chunk_lo(w, DT), chunk_lo(g, DT), m, logden);
        if (DT != DT_F32) {
            acc = acc + softmax_bwd_acc(chunk_hi(w, DT), chunk_hi(g, DT), m, logden);
        }
    }
    let total = workgroup_sum(acc, lid);
    if (DT == DT_F32) {
        for (var v = lid; v < nv; v = v + WG) {
            let w = x4[vbase + v];
            let g = second4[vbase + v];
            dx4[vbase + v] = softmax_bwd_value(chunk_lo(w, DT), chunk_lo(g, DT), m, logden, total);
        }
        return;
    }
    if (ODT != DT_F32) {
        // dx in 16 bits (into y4, which the host binds to dx): one chunk a lane, its eight F32
        // values rounded once.
        for (var v = lid; v < nv; v = v + WG) {
            let w = x4[vbase + v];
            let g = second4[vbase + v];
            let lo = softmax_bwd_value(chunk_lo(w, DT), chunk_lo(g, DT), m, logden, total);
            let hi = softmax_bwd_value(chunk_hi(w, DT), chunk_hi(g, DT), m, logden, total);
            y4[vbase + v] = narrow8(lo, hi, ODT);
        }
        return;
    }
    // 16-bit x, F32 dx: lanes by F32 vec4 of dx (half a chunk), so each store of the workgroup
    // is contiguous (as in ce_bwd_v); neighbouring lanes load the same chunks.
    for (var o = lid; o < 2u * nv; o = o + WG) {
        let w = x4[vbase + o / 2u];
        let g = second4[vbase + o / 2u];
        var xv = chunk_lo(w, DT);
        var gv = chunk_lo(g, DT);
        if ((o & 1u) == 1u) {
            xv = chunk_hi(w, DT);
            gv = chunk_hi(g, DT);
        }
        dx4[2u * vbase + o] = softmax_bwd_value(xv, gv, m, logden, total);
    }
}

fn softcapped4(v: vec4<f32>) -> vec4<f32> {
    if (params.c > 0.0) {
        return vec4<f32>(softcapped(v.x), softcapped(v.y), softcapped(v.z), softcapped(v.w));
    }
    return v;
}

// Per-lane cross-entropy accumulators of the vectorized forward.
struct CeLane {
    st: vec2<f32>,
    best: f32,
    best_index: u32,
    wz: f32,
    wsum: f32,
}

fn ce_lane4(lane: CeLane, raw: vec4<f32>, first: u32, reference: f32) -> CeLane {
    var l = lane;
    let z = softcapped4(raw);
    // Argmax by chunk: the chunk's largest raw value, at its first position, replaces the
    // lane's best only when strictly larger, which is the element-by-element scan's result
    // (NaN never wins: max returns the other operand). Without a softcap it is also the
    // chunk maximum of the online update.
    let rm = max(max(raw.x, raw.y), max(raw.z, raw.w));
    var zm = rm;
    if (params.c > 0.0) {
        zm = max(max(z.x, z.y), max(z.z, z.w));
    }
    l.st = online4_max(l.st, z, zm);
    if (rm > l.best) {
        l.best = rm;
        var j = 3u;
        if (raw.z == rm) {
            j = 2u;
        }
        if (raw.y == rm) {
            j = 1u;
        }
        if (raw.x == rm) {
            j = 0u;
        }
        l.best_index = first + j;
    }
    if (params.a > 0.0) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            let w = class_weight(first + j);
            l.wz = l.wz + w * (z[j] - reference);
            l.wsum = l.wsum + w;
        }
    }
    return l;
}

// One chunk (4 or 8 elements) into the lane's accumulators.
fn ce_lane_chunk(lane: CeLane, w: vec4<u32>, first: u32, reference: f32) -> CeLane {
    var l = ce_lane4(lane, chunk_lo(w, DT), first, reference);
    if (DT != DT_F32) {
        l = ce_lane4(l, chunk_hi(w, DT), first + 4u, reference);
    }
    return l;
}

// Position (0..8) of the first element of a 16-bit chunk equal to `v`, one of its elements.
fn chunk_first(w: vec4<u32>, v: f32) -> u32 {
    let a = chunk_lo(w, DT);
    let b = chunk_hi(w, DT);
    var j = 7u;
    if (b.z == v) { j = 6u; }
    if (b.y == v) { j = 5u; }
    if (b.x == v) { j = 4u; }
    if (a.w == v) { j = 3u; }
    if (a.z == v) { j = 2u; }
    if (a.y == v) { j = 1u; }
    if (a.x == v) { j = 0u; }
    return j;
}

// Four 16-bit chunks (32 elements; first columns f, f + WG·8, f + 2·WG·8, f + 3·WG·8) into
// the lane's accumulators without a softcap or label smoothing, the maximum first: the group's
// maximum (each chunk's by `chunk_max`, then the four), the argmax (the first position of the
// group's maximum, taken only when it beats the lane's best: the element-by-element scan's
// result, NaN never winning), one rescale of the running sum when the maximum grows, then
// Σ exp(z − max) of the 32 values (each chunk's by `chunk_expsum`, then the four in a fixed
// tree). Against a chunk at a time this saves the per-chunk rescale test and argmax test
// (and their divergent branches) and sums relative to a maximum that is already the group's.
fn ce_lane_group(lane: CeLane, w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>,
                 f: u32) -> CeLane {
    var l = lane;
    let m0 = chunk_max(w0);
    let m1 = chunk_max(w1);
    let m2 = chunk_max(w2);
    let m3 = chunk_max(w3);
    let gm = max(max(m0, m1), max(m2, m3));
    if (gm > l.best) {
        l.best = gm;
        let step = 8u * WG;
        if (m0 == gm) {
            l.best_index = f + chunk_first(w0, gm);
        } else if (m1 == gm) {
            l.best_index = f + step + chunk_first(w1, gm);
        } else if (m2 == gm) {
            l.best_index = f + 2u * step + chunk_first(w2, gm);
        } else {
            l.best_index = f + 3u * step + chunk_first(w3, gm);
        }
    }
    var m = l.st.x;
    var s = l.st.y;
    if (gm > m) {
        s = s * exp(m - gm);
        m = gm;
    }
    if (m != neg_inf()) {
        s = s + ((chunk_expsum(w0, m) + chunk_expsum(w1, m)) +
                 (chunk_expsum(w2, m) + chunk_expsum(w3, m)));
    }
    l.st = vec2<f32>(m, s);
    return l;
}

// Four chunks loaded together (chunks v, v + WG, v + 2·WG, v + 3·WG of the row) into the
// lane's accumulators, in the lane's column order: 16-bit rows without a softcap or label
// smoothing by `ce_lane_group`, others a chunk at a time.
fn ce_lane_step(lane: CeLane, w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>,
                v: u32, reference: f32) -> CeLane {
    let cw = chunk_width(DT);
    if (DT != DT_F32 && !(params.c > 0.0 || params.a > 0.0)) { // uniform: parameters
        return ce_lane_group(lane, w0, w1, w2, w3, v * cw);
    }
    var l = ce_lane_chunk(lane, w0, v * cw, reference);
    l = ce_lane_chunk(l, w1, (v + WG) * cw, reference);
    l = ce_lane_chunk(l, w2, (v + 2u * WG) * cw, reference);
    return ce_lane_chunk(l, w3, (v + 3u * WG) * cw, reference);
}

// Element `k` of a chunk of dtype DT.
fn chunk_element(w: vec4<u32>, k: u32) -> f32 {
    if (k < 4u) {
        return chunk_lo(w, DT)[k];
    }
    return chunk_hi(w, DT)[k - 4u];
}

// Lane 0's part of the vectorized cross-entropy forwards: the per-row matrix and the argmax
// of row `row` of the launch from the row statistics, the smoothing sums, the argmax and the
// raw target logit `raw_y` (unused on an ignored row).
fn ce_write_row(row: u32, rs: vec2<f32>, sum_wz: f32, sum_w: f32, arg: u32, raw_y: f32,
                reference: f32) {
    let eps = params.a;
    let t = labels[params.row0 + row];
    let o = (params.row0 + row) * CE_COLS;
    var loss = 0.0;
    var zl = 0.0;
    var wy = 0.0;
    var valid = 0.0;
    var correct = 0.0;
    if (target_valid(t)) {
        let ti = u32(t);
        let zy = softcapped(raw_y);
        wy = class_weight(ti);
        valid = 1.0;
        loss = (1.0 - eps) * wy * ((rs.x - zy) + rs.y);
        if (eps > 0.0) {
            let spread = sum_w * (rs.x - reference) - sum_wz;
            loss = loss + eps / f32(params.cols) * (spread + sum_w * rs.y);
        }
        let lse = rs.x + rs.y;
        zl = params.b * lse * lse;
        if (arg == ti) {
            correct = 1.0;
        }
        store_pred(row, i32(arg));
    } else {
        store_pred(row, -1);
    }
    stats_out[o + CE_LOSS] = loss;
    stats_out[o + CE_Z] = zl;
    stats_out[o + CE_WEIGHT] = wy;
    stats_out[o + CE_VALID] = valid;
    stats_out[o + CE_CORRECT] = correct;
    stats_out[o + CE_MAX] = rs.x;
    stats_out[o + CE_LOGDEN] = rs.y;
    stats_out[o + CE_WSUM] = sum_w;
}

@compute @workgroup_size(WG)
fn ce_fwd_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cw = chunk_width(DT);
    let nv = params.cols / cw;
    let vbase = row * nv;
    let reference = softcapped(chunk_lo(x4[vbase], DT).x);
    var lane = CeLane(vec2<f32>(neg_inf(), 0.0), neg_inf(), 0u, 0.0, 0.0);
    // Four chunks loaded per step (more bytes in flight), consumed in the lane's column order.
    var v = lid;
    loop {
        if (v + 3u * WG >= nv) {
            break;
        }
        let w0 = x4[vbase + v];
        let w1 = x4[vbase + v + WG];
        let w2 = x4[vbase + v + 2u * WG];
        let w3 = x4[vbase + v + 3u * WG];
        lane = ce_lane_step(lane, w0, w1, w2, w3, v, reference);
        v = v + 4u * WG;
    }
    for (; v < nv; v = v + WG) {
        lane = ce_lane_chunk(lane, x4[vbase + v], v * cw, reference);
    }
    let rs = row_stats(lane.st, lid);
    var sum_wz = 0.0;
    var sum_w = 0.0;
    if (params.a > 0.0) { // uniform: a parameter
        sum_wz = workgroup_sum(lane.wz, lid);
        sum_w = workgroup_sum(lane.wsum, lid);
    }
    let arg = workgroup_argmax(lane.best, lane.best_index, lid);
    if (lid == 0u) {
        let t = labels[params.row0 + row];
        var raw_y = 0.0;
        if (target_valid(t)) {
            let ti = u32(t);
            raw_y = chunk_element(x4[vbase + ti / cw], ti % cw);
        }
        ce_write_row(row, rs, sum_wz, sum_w, arg, raw_y, reference);
    }
}

// ---- cross-entropy statistics by blocks of columns ------------------------------------------

// The fused linear heads' block order ([rows, classes] logits that exist one block of columns at
// a time): ce_block_stats folds the block x = [rows, cols] of classes col0.. into a running
// per-row state [rows, CE_COLS] (stats_out), the first block (col0 = 0) starting it; then
// ce_block_finish turns the state (stats_in) into the per-row matrix and predictions that
// ce_fwd writes for whole rows. State columns (CS_COLS a row):
const CS_COLS: u32 = 9u;
const CS_MAX: u32 = 0u;   // running maximum m of the (softcapped) logits
const CS_SUM: u32 = 1u;   // Σ exp(z − m)
const CS_BEST: u32 = 2u;  // largest raw logit so far (NaN-free)
const CS_INDEX: u32 = 3u; // its class, the lowest of equal values (as F32: classes ≤ 2^24)
const CS_WZ: u32 = 4u;    // Σ w_c (z_c − reference) (label smoothing)
const CS_WSUM: u32 = 5u;  // Σ w_c (label smoothing)
const CS_RAW_Y: u32 = 6u; // the target's raw logit (once its block has passed)
const CS_REF: u32 = 7u;   // reference: the softcapped logit of class 0
const CS_T: u32 = 8u;     // Σ exp(z − m)·(z − m) (with F_ENTROPY)

@compute @workgroup_size(WG)
fn ce_block_stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cols = params.cols;
    let base = row * cols;
    let o = (params.row0 + row) * CS_COLS;
    let first = params.col0 == 0u;
    var reference = 0.0;
    if (first) {
        reference = softcapped(ld_x(base));
    } else {
        reference = stats_out[o + CS_REF];
    }
    let scan = ce_scan(base, params.col0, reference, lid);
    let m = scan.ms.x;
    let s = scan.ms.y;
    var sum_wz = scan.sum_wz;
    var sum_w = scan.sum_w;
    let arg = scan.arg;
    if (lid == 0u) {
        var m_out = m;
        var s_out = s;
        var t_out = scan.t;
        var best_out = ld_x(base + arg - params.col0);
        if (!(best_out > neg_inf())) {
            best_out = neg_inf(); // no value beat −∞ in this block (NaNs never count)
        }
        var index_out = f32(arg);
        var raw_y = 0.0;
        if (!first) {
            // Earlier blocks first: their maximum, sums and (on ties) their argmax win.
            let m0 = stats_out[o + CS_MAX];
            let s0 = stats_out[o + CS_SUM];
            let mm = max(m0, m);
            s_out = 0.0;
            if (s0 > 0.0) {
                s_out = s0 * exp(m0 - mm);
            }
            if (s > 0.0) {
                s_out = s_out + s * exp(m - mm);
            }
            m_out = mm;
            t_out = entropy_sum_at(m0, s0, stats_out[o + CS_T], mm) +
                    entropy_sum_at(m, s, scan.t, mm);
            let b0 = stats_out[o + CS_BEST];
            if (!(best_out > b0)) {
                best_out = b0;
                index_out = stats_out[o + CS_INDEX];
            }
            sum_wz = stats_out[o + CS_WZ] + sum_wz;
            sum_w = stats_out[o + CS_WSUM] + sum_w;
            raw_y = stats_out[o + CS_RAW_Y];
        }
        let t = labels[params.row0 + row];
        if (target_valid(t) && u32(t) >= params.col0 && u32(t) - params.col0 < cols) {
            raw_y = ld_x(base + u32(t) - params.col0);
        }
        stats_out[o + CS_MAX] = m_out;
        stats_out[o + CS_SUM] = s_out;
        stats_out[o + CS_BEST] = best_out;
        stats_out[o + CS_INDEX] = index_out;
        stats_out[o + CS_WZ] = sum_wz;
        stats_out[o + CS_WSUM] = sum_w;
        stats_out[o + CS_RAW_Y] = raw_y;
        stats_out[o + CS_REF] = reference;
        stats_out[o + CS_T] = t_out;
    }
}

// One invocation per row: the per-row matrix (stats_out) and prediction of a row from its
// finished block state (stats_in), as ce_fwd / ce_fwd_v write them (params.cols: the classes);
// with F_ENTROPY also the row's entropy H = log s − t/s into out_f32 (0 on a row not counted).
@compute @workgroup_size(WG)
fn ce_block_finish(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg) * WG + lid;
    if (row >= params.rows) {
        return;
    }
    let o = (params.row0 + row) * CS_COLS;
    let s = stats_in[o + CS_SUM];
    let rs = vec2<f32>(stats_in[o + CS_MAX], log(s));
    ce_write_row(row, rs, stats_in[o + CS_WZ], stats_in[o + CS_WSUM], u32(stats_in[o + CS_INDEX]),
                 stats_in[o + CS_RAW_Y], stats_in[o + CS_REF]);
    if ((params.flags & F_ENTROPY) != 0u) {
        var h = 0.0;
        if (target_valid(labels[params.row0 + row])) {
            h = rs.y - stats_in[o + CS_T] / s;
        }
        out_f32[params.row0 + row] = h;
    }
}

// Four gradient values of the cross-entropy backward (see ce_bwd), in vector form:
// p·((1 − ε)·w_y·f_ce + f_z) − [c = y]·(1 − ε)·w_y·f_ce + ε/C·f_ce·(W·p − w_c), times the
// softcap derivative.
fn ce_grad4(raw: vec4<f32>, column: u32, ti: u32, m: f32, logden: f32, wy: f32, wsum: f32,
            f_ce: f32, f_z: f32) -> vec4<f32> {
    let eps = params.a;
    let first = params.col0 + column; // the class of raw.x
    let z = softcapped4(raw);
    let p = exp((z - vec4<f32>(m)) - vec4<f32>(logden));
    let target_scale = (1.0 - eps) * wy * f_ce;
    var d = p * (target_scale + f_z);
    if (ti >= first && ti < first + 4u) {
        d[ti - first] = d[ti - first] - target_scale;
    }
    if (eps > 0.0) {
        let w = vec4<f32>(class_weight(first), class_weight(first + 1u),
                          class_weight(first + 2u), class_weight(first + 3u));
        d = d + (eps / f32(ce_classes()) * f_ce) * (wsum * p - w);
    }
    if (params.c > 0.0) {
        let th = z / params.c;
        d = d * (vec4<f32>(1.0) - th * th);
    }
    return d;
}

@compute @workgroup_size(WG)
fn ce_bwd_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cw = chunk_width(DT);
    let nv = params.cols / cw;
    let vbase = row * nv;
    let f4 = cw / 4u; // F32 vec4s of dx per chunk
    let g = ce_grad_row(row);
    if (!g.valid) {
        for (var v = lid; v < nv * f4; v = v + WG) {
            dx4[vbase * f4 + v] = vec4<f32>(0.0);
        }
        return;
    }
    if (DT == DT_F32) {
        for (var v = lid; v < nv; v = v + WG) {
            dx4[vbase + v] = ce_grad4(chunk_lo(x4[vbase + v], DT), v * 4u, g.ti, g.m, g.logden,
                                      g.wy, g.wsum, g.f_ce, g.f_z);
        }
    } else {
        // Lane by F32 vec4 of dx (half a chunk), so each store of the workgroup is contiguous;
        // neighbouring lanes load the same chunk.
        for (var o = lid; o < 2u * nv; o = o + WG) {
            let w = x4[vbase + o / 2u];
            var raw = chunk_lo(w, DT);
            if ((o & 1u) == 1u) {
                raw = chunk_hi(w, DT);
            }
            dx4[2u * vbase + o] =
                ce_grad4(raw, o * 4u, g.ti, g.m, g.logden, g.wy, g.wsum, g.f_ce, g.f_z);
        }
    }
}

// ce_bwd_v with the gradient in the logits' 16-bit dtype, into y4 (a fresh buffer, not the
// logits): one chunk a lane per step, ce_grad_chunk's values and rounding, so the words are
// those of the F32 gradient rounded once to nearest-even.
@compute @workgroup_size(WG)
fn ce_bwd_n(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let cw = chunk_width(DT);
    let nv = params.cols / cw;
    let vbase = row * nv;
    let g = ce_grad_row(row);
    if (!g.valid) {
        for (var v = lid; v < nv; v = v + WG) {
            y4[vbase + v] = vec4<u32>(0u);
        }
        return;
    }
    for (var v = lid; v < nv; v = v + WG) {
        y4[vbase + v] = ce_grad_chunk(x4[vbase + v], v * cw, g.ti, g.m, g.logden, g.wy, g.wsum,
                                      g.f_ce, g.f_z);
    }
}

// The gradient of one chunk (elements first..first + cw) of a row with a valid target, packed
// in the logits' dtype.
fn ce_grad_chunk(w: vec4<u32>, first: u32, ti: u32, m: f32, logden: f32, wy: f32, wsum: f32,
                 f_ce: f32, f_z: f32) -> vec4<u32> {
    let a = ce_grad4(chunk_lo(w, DT), first, ti, m, logden, wy, wsum, f_ce, f_z);
    if (DT == DT_F32) {
        return bitcast<vec4<u32>>(a);
    }
    let b = ce_grad4(chunk_hi(w, DT), first + 4u, ti, m, logden, wy, wsum, f_ce, f_z);
    return pack_chunk(a, b, DT);
}

// The cross-entropy gradient written over the logits (`cross_entropy_in_place`, after the
// forward): one chunk of y4 (the logits) an invocation over the chunks of every row, a flat
// grid (no lane walks a row: a load after a store to the binding it reads waits for it), with
// ce_bwd_n's values (F32 logits: ce_bwd_v's) from the row's statistics and cotangent.
// With F_PARTIALS the workgroups past the gradient's also write the column partials of the
// launch's per-row matrix (`ce_block_partials`), which it only reads, so no launch of their own.
@compute @workgroup_size(WG)
fn ce_grad_over(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let cw = chunk_width(DT);
    let nv = params.cols / cw;
    let gid = group_index(wid, nwg);
    let grad_groups = (params.rows * nv + WG - 1u) / WG;
    if (gid >= grad_groups) {
        if ((params.flags & F_PARTIALS) != 0u) {
            ce_block_partials((gid - grad_groups) * WG + lid);
        }
        return;
    }
    let i = gid * WG + lid;
    if (i >= params.rows * nv) {
        return;
    }
    // The chunk's load is issued first: it does not wait for the row's label and statistics.
    let w = y4[i];
    let row = i / nv;
    let g = ce_grad_row(row);
    if (!g.valid) {
        y4[i] = vec4<u32>(0u);
        return;
    }
    y4[i] = ce_grad_chunk(w, (i - row * nv) * cw, g.ti, g.m, g.logden, g.wy, g.wsum, g.f_ce, g.f_z);
}

// Vectorized divergences: x and the target share the dtype DT; rows are whole chunks.
fn divergence_loss4(a: vec4<f32>, b: vec4<f32>) -> f32 {
    let l = vec4<f32>(divergence(a.x, b.x).x, divergence(a.y, b.y).x,
                      divergence(a.z, b.z).x, divergence(a.w, b.w).x);
    return (l.x + l.y) + (l.z + l.w);
}

@compute @workgroup_size(WG)
fn div_rows_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let nv = params.cols / chunk_width(DT);
    let vbase = row * nv;
    var acc = 0.0;
    for (var v = lid; v < nv; v = v + WG) {
        let w = x4[vbase + v];
        let g = second4[vbase + v];
        acc = acc + divergence_loss4(chunk_lo(w, DT), chunk_lo(g, DT));
        if (DT != DT_F32) {
            acc = acc + divergence_loss4(chunk_hi(w, DT), chunk_hi(g, DT));
        }
    }
    let total = workgroup_sum(acc, lid);
    if (lid == 0u) {
        if (row_counted(row)) {
            stats_out[2u * (params.row0 + row)] = total;
            stats_out[2u * (params.row0 + row) + 1u] = 1.0;
        } else {
            stats_out[2u * (params.row0 + row)] = 0.0;
            stats_out[2u * (params.row0 + row) + 1u] = 0.0;
        }
    }
}

// The elementwise loss of four elements starting at element `first` (0 on skipped rows).
fn divergence_loss_out4(a: vec4<f32>, b: vec4<f32>, first: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    if (row_counted(first / params.cols)) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            out[j] = divergence(a[j], b[j]).x;
        }
    }
    return out;
}

// The gradient of four elements times the cotangent and the scale.
fn divergence_grad_out4(a: vec4<f32>, b: vec4<f32>, first: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    if (row_counted(first / params.cols)) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            var ct = cot[0];
            if ((params.flags & F_COT_ELEM) != 0u) {
                ct = cot[first + j];
            }
            out[j] = divergence(a[j], b[j]).y * ct * final_in[1];
        }
    }
    return out;
}

// One chunk per invocation: the elementwise loss (reduction none) into dx4.
@compute @workgroup_size(WG)
fn div_elems_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    let cw = chunk_width(DT);
    if (i >= (params.rows * params.cols) / cw) {
        return;
    }
    let w = x4[i];
    let g = second4[i];
    dx4[i * (cw / 4u)] = divergence_loss_out4(chunk_lo(w, DT), chunk_lo(g, DT), i * cw);
    if (DT != DT_F32) {
        dx4[i * 2u + 1u] = divergence_loss_out4(chunk_hi(w, DT), chunk_hi(g, DT), i * cw + 4u);
    }
}

// One chunk per invocation: the gradient into dx4 (F32), or for 16-bit x with ODT 16-bit into
// y4 (the host binds dx to both), its eight F32 values rounded once.
@compute @workgroup_size(WG)
fn div_bwd_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    let cw = chunk_width(DT);
    if (i >= (params.rows * params.cols) / cw) {
        return;
    }
    let w = x4[i];
    let g = second4[i];
    if (ODT != DT_F32) {
        y4[i] = narrow8(divergence_grad_out4(chunk_lo(w, DT), chunk_lo(g, DT), i * cw),
                        divergence_grad_out4(chunk_hi(w, DT), chunk_hi(g, DT), i * cw + 4u), ODT);
        return;
    }
    dx4[i * (cw / 4u)] = divergence_grad_out4(chunk_lo(w, DT), chunk_lo(g, DT), i * cw);
    if (DT != DT_F32) {
        dx4[i * 2u + 1u] = divergence_grad_out4(chunk_hi(w, DT), chunk_hi(g, DT), i * cw + 4u);
    }
}

// The 16-bit entries with F32 outputs take one half chunk (four values) an invocation: each lane
// loads 8 bytes of x and of the target (`x2`, `second2`) and stores one vec4, so a workgroup's
// stores are contiguous (a lane of whole chunks stores two vec4s 32 bytes apart, which costs
// half the store bandwidth). The same values as the whole-chunk entries.
fn half_vals(h: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(widen2(h.x, DT), widen2(h.y, DT));
}

@compute @workgroup_size(WG)
fn div_elems_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= (params.rows * params.cols) / 4u) {
        return;
    }
    dx4[i] = divergence_loss_out4(half_vals(x2[i]), half_vals(second2[i]), i * 4u);
}

@compute @workgroup_size(WG)
fn div_bwd_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= (params.rows * params.cols) / 4u) {
        return;
    }
    dx4[i] = divergence_grad_out4(half_vals(x2[i]), half_vals(second2[i]), i * 4u);
}

// ---- register-resident softmax forward ---------------------------------------------------
// For rows of up to RK·WG chunks, each lane keeps its RK chunks in registers, so the row is
// read once: each lane's maximum, then its Σ exp(x − that maximum), then the row's pair by one
// tree (`workgroup_pairs8` with PAIR_SOFTMAX: 4 barriers with 1024 lanes), then the output,
// all from registers. Straight-line
// code (no indexed private array, which some compilers move to slow local memory); the
// statements repeat for chunks 0..32, lane `lid` holding chunks lid, lid + WG, ... of the row,
// and every statement for chunk k ≥ RK is behind `RK > k`, a constant once the pipeline is
// specialized, so the compiler drops it and keeps only RK chunks live. The host sets RK to the
// smallest power of two covering the row: with 1024 lanes (`loss_rows`) at most 8 chunks (32
// registers) a lane, with 256 lanes at most 32.
override RK: u32 = 32u;

fn chunk_max(w: vec4<u32>) -> f32 {
    let a = chunk_lo(w, DT);
    var m = max(max(a.x, a.y), max(a.z, a.w));
    if (DT != DT_F32) {
        let b = chunk_hi(w, DT);
        m = max(m, max(max(b.x, b.y), max(b.z, b.w)));
    }
    return m;
}

fn chunk_expsum(w: vec4<u32>, m: f32) -> f32 {
    let a = exp(chunk_lo(w, DT) - vec4<f32>(m));
    var s = (a.x + a.y) + (a.z + a.w);
    if (DT != DT_F32) {
        let b = exp(chunk_hi(w, DT) - vec4<f32>(m));
        s = s + ((b.x + b.y) + (b.z + b.w));
    }
    return s;
}

fn chunk_store(i: u32, w: vec4<u32>, m: f32, logden: f32) {
    let a = softmax4(chunk_lo(w, DT), m, logden);
    if (DT == DT_F32) {
        y4[i] = bitcast<vec4<u32>>(a);
    } else {
        y4[i] = pack_chunk(a, softmax4(chunk_hi(w, DT), m, logden), DT);
    }
}

@compute @workgroup_size(WG)
fn softmax_fwd_r(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let nv = params.cols / chunk_width(DT);
    let vbase = row * nv;
    let zero = vec4<u32>(0u);
    let i0 = lid + 0u * WG;
    var c0 = zero;
    if (RK > 0u && i0 < nv) { c0 = x4[vbase + i0]; }
    let i1 = lid + 1u * WG;
    var c1 = zero;
    if (RK > 1u && i1 < nv) { c1 = x4[vbase + i1]; }
    let i2 = lid + 2u * WG;
    var c2 = zero;
    if (RK > 2u && i2 < nv) { c2 = x4[vbase + i2]; }
    let i3 = lid + 3u * WG;
    var c3 = zero;
    if (RK > 3u && i3 < nv) { c3 = x4[vbase + i3]; }
    let i4 = lid + 4u * WG;
    var c4 = zero;
    if (RK > 4u && i4 < nv) { c4 = x4[vbase + i4]; }
    let i5 = lid + 5u * WG;
    var c5 = zero;
    if (RK > 5u && i5 < nv) { c5 = x4[vbase + i5]; }
    let i6 = lid + 6u * WG;
    var c6 = zero;
    if (RK > 6u && i6 < nv) { c6 = x4[vbase + i6]; }
    let i7 = lid + 7u * WG;
    var c7 = zero;
    if (RK > 7u && i7 < nv) { c7 = x4[vbase + i7]; }
    let i8 = lid + 8u * WG;
    var c8 = zero;
    if (RK > 8u && i8 < nv) { c8 = x4[vbase + i8]; }
    let i9 = lid + 9u * WG;
    var c9 = zero;
    if (RK > 9u && i9 < nv) { c9 = x4[vbase + i9]; }
    let i10 = lid + 10u * WG;
    var c10 = zero;
    if (RK > 10u && i10 < nv) { c10 = x4[vbase + i10]; }
    let i11 = lid + 11u * WG;
    var c11 = zero;
    if (RK > 11u && i11 < nv) { c11 = x4[vbase + i11]; }
    let i12 = lid + 12u * WG;
    var c12 = zero;
    if (RK > 12u && i12 < nv) { c12 = x4[vbase + i12]; }
    let i13 = lid + 13u * WG;
    var c13 = zero;
    if (RK > 13u && i13 < nv) { c13 = x4[vbase + i13]; }
    let i14 = lid + 14u * WG;
    var c14 = zero;
    if (RK > 14u && i14 < nv) { c14 = x4[vbase + i14]; }
    let i15 = lid + 15u * WG;
    var c15 = zero;
    if (RK > 15u && i15 < nv) { c15 = x4[vbase + i15]; }
    let i16 = lid + 16u * WG;
    var c16 = zero;
    if (RK > 16u && i16 < nv) { c16 = x4[vbase + i16]; }
    let i17 = lid + 17u * WG;
    var c17 = zero;
    if (RK > 17u && i17 < nv) { c17 = x4[vbase + i17]; }
    let i18 = lid + 18u * WG;
    var c18 = zero;
    if (RK > 18u && i18 < nv) { c18 = x4[vbase + i18]; }
    let i19 = lid + 19u * WG;
    var c19 = zero;
    if (RK > 19u && i19 < nv) { c19 = x4[vbase + i19]; }
    let i20 = lid + 20u * WG;
    var c20 = zero;
    if (RK > 20u && i20 < nv) { c20 = x4[vbase + i20]; }
    let i21 = lid + 21u * WG;
    var c21 = zero;
    if (RK > 21u && i21 < nv) { c21 = x4[vbase + i21]; }
    let i22 = lid + 22u * WG;
    var c22 = zero;
    if (RK > 22u && i22 < nv) { c22 = x4[vbase + i22]; }
    let i23 = lid + 23u * WG;
    var c23 = zero;
    if (RK > 23u && i23 < nv) { c23 = x4[vbase + i23]; }
    let i24 = lid + 24u * WG;
    var c24 = zero;
    if (RK > 24u && i24 < nv) { c24 = x4[vbase + i24]; }
    let i25 = lid + 25u * WG;
    var c25 = zero;
    if (RK > 25u && i25 < nv) { c25 = x4[vbase + i25]; }
    let i26 = lid + 26u * WG;
    var c26 = zero;
    if (RK > 26u && i26 < nv) { c26 = x4[vbase + i26]; }
    let i27 = lid + 27u * WG;
    var c27 = zero;
    if (RK > 27u && i27 < nv) { c27 = x4[vbase + i27]; }
    let i28 = lid + 28u * WG;
    var c28 = zero;
    if (RK > 28u && i28 < nv) { c28 = x4[vbase + i28]; }
    let i29 = lid + 29u * WG;
    var c29 = zero;
    if (RK > 29u && i29 < nv) { c29 = x4[vbase + i29]; }
    let i30 = lid + 30u * WG;
    var c30 = zero;
    if (RK > 30u && i30 < nv) { c30 = x4[vbase + i30]; }
    let i31 = lid + 31u * WG;
    var c31 = zero;
    if (RK > 31u && i31 < nv) { c31 = x4[vbase + i31]; }
    var m = neg_inf();
    if (RK > 0u && i0 < nv) { m = max(m, chunk_max(c0)); }
    if (RK > 1u && i1 < nv) { m = max(m, chunk_max(c1)); }
    if (RK > 2u && i2 < nv) { m = max(m, chunk_max(c2)); }
    if (RK > 3u && i3 < nv) { m = max(m, chunk_max(c3)); }
    if (RK > 4u && i4 < nv) { m = max(m, chunk_max(c4)); }
    if (RK > 5u && i5 < nv) { m = max(m, chunk_max(c5)); }
    if (RK > 6u && i6 < nv) { m = max(m, chunk_max(c6)); }
    if (RK > 7u && i7 < nv) { m = max(m, chunk_max(c7)); }
    if (RK > 8u && i8 < nv) { m = max(m, chunk_max(c8)); }
    if (RK > 9u && i9 < nv) { m = max(m, chunk_max(c9)); }
    if (RK > 10u && i10 < nv) { m = max(m, chunk_max(c10)); }
    if (RK > 11u && i11 < nv) { m = max(m, chunk_max(c11)); }
    if (RK > 12u && i12 < nv) { m = max(m, chunk_max(c12)); }
    if (RK > 13u && i13 < nv) { m = max(m, chunk_max(c13)); }
    if (RK > 14u && i14 < nv) { m = max(m, chunk_max(c14)); }
    if (RK > 15u && i15 < nv) { m = max(m, chunk_max(c15)); }
    if (RK > 16u && i16 < nv) { m = max(m, chunk_max(c16)); }
    if (RK > 17u && i17 < nv) { m = max(m, chunk_max(c17)); }
    if (RK > 18u && i18 < nv) { m = max(m, chunk_max(c18)); }
    if (RK > 19u && i19 < nv) { m = max(m, chunk_max(c19)); }
    if (RK > 20u && i20 < nv) { m = max(m, chunk_max(c20)); }
    if (RK > 21u && i21 < nv) { m = max(m, chunk_max(c21)); }
    if (RK > 22u && i22 < nv) { m = max(m, chunk_max(c22)); }
    if (RK > 23u && i23 < nv) { m = max(m, chunk_max(c23)); }
    if (RK > 24u && i24 < nv) { m = max(m, chunk_max(c24)); }
    if (RK > 25u && i25 < nv) { m = max(m, chunk_max(c25)); }
    if (RK > 26u && i26 < nv) { m = max(m, chunk_max(c26)); }
    if (RK > 27u && i27 < nv) { m = max(m, chunk_max(c27)); }
    if (RK > 28u && i28 < nv) { m = max(m, chunk_max(c28)); }
    if (RK > 29u && i29 < nv) { m = max(m, chunk_max(c29)); }
    if (RK > 30u && i30 < nv) { m = max(m, chunk_max(c30)); }
    if (RK > 31u && i31 < nv) { m = max(m, chunk_max(c31)); }
    // The lane's own Σ exp(x − m) over its chunks, then the row's (maximum, sum) in one tree.
    var s = 0.0;
    if (RK > 0u && i0 < nv) { s = s + chunk_expsum(c0, m); }
    if (RK > 1u && i1 < nv) { s = s + chunk_expsum(c1, m); }
    if (RK > 2u && i2 < nv) { s = s + chunk_expsum(c2, m); }
    if (RK > 3u && i3 < nv) { s = s + chunk_expsum(c3, m); }
    if (RK > 4u && i4 < nv) { s = s + chunk_expsum(c4, m); }
    if (RK > 5u && i5 < nv) { s = s + chunk_expsum(c5, m); }
    if (RK > 6u && i6 < nv) { s = s + chunk_expsum(c6, m); }
    if (RK > 7u && i7 < nv) { s = s + chunk_expsum(c7, m); }
    if (RK > 8u && i8 < nv) { s = s + chunk_expsum(c8, m); }
    if (RK > 9u && i9 < nv) { s = s + chunk_expsum(c9, m); }
    if (RK > 10u && i10 < nv) { s = s + chunk_expsum(c10, m); }
    if (RK > 11u && i11 < nv) { s = s + chunk_expsum(c11, m); }
    if (RK > 12u && i12 < nv) { s = s + chunk_expsum(c12, m); }
    if (RK > 13u && i13 < nv) { s = s + chunk_expsum(c13, m); }
    if (RK > 14u && i14 < nv) { s = s + chunk_expsum(c14, m); }
    if (RK > 15u && i15 < nv) { s = s + chunk_expsum(c15, m); }
    if (RK > 16u && i16 < nv) { s = s + chunk_expsum(c16, m); }
    if (RK > 17u && i17 < nv) { s = s + chunk_expsum(c17, m); }
    if (RK > 18u && i18 < nv) { s = s + chunk_expsum(c18, m); }
    if (RK > 19u && i19 < nv) { s = s + chunk_expsum(c19, m); }
    if (RK > 20u && i20 < nv) { s = s + chunk_expsum(c20, m); }
    if (RK > 21u && i21 < nv) { s = s + chunk_expsum(c21, m); }
    if (RK > 22u && i22 < nv) { s = s + chunk_expsum(c22, m); }
    if (RK > 23u && i23 < nv) { s = s + chunk_expsum(c23, m); }
    if (RK > 24u && i24 < nv) { s = s + chunk_expsum(c24, m); }
    if (RK > 25u && i25 < nv) { s = s + chunk_expsum(c25, m); }
    if (RK > 26u && i26 < nv) { s = s + chunk_expsum(c26, m); }
    if (RK > 27u && i27 < nv) { s = s + chunk_expsum(c27, m); }
    if (RK > 28u && i28 < nv) { s = s + chunk_expsum(c28, m); }
    if (RK > 29u && i29 < nv) { s = s + chunk_expsum(c29, m); }
    if (RK > 30u && i30 < nv) { s = s + chunk_expsum(c30, m); }
    if (RK > 31u && i31 < nv) { s = s + chunk_expsum(c31, m); }
    if (m == neg_inf()) {
        s = 0.0;
    }
    let stats = workgroup_pairs8(vec2<f32>(m, s), lid, PAIR_SOFTMAX);
    let rmax = stats.x;
    let logden = log(stats.y);
    if (lid == 0u) {
        stats_out[2u * row] = rmax;
        stats_out[2u * row + 1u] = logden;
    }
    if (RK > 0u && i0 < nv) { chunk_store(vbase + i0, c0, rmax, logden); }
    if (RK > 1u && i1 < nv) { chunk_store(vbase + i1, c1, rmax, logden); }
    if (RK > 2u && i2 < nv) { chunk_store(vbase + i2, c2, rmax, logden); }
    if (RK > 3u && i3 < nv) { chunk_store(vbase + i3, c3, rmax, logden); }
    if (RK > 4u && i4 < nv) { chunk_store(vbase + i4, c4, rmax, logden); }
    if (RK > 5u && i5 < nv) { chunk_store(vbase + i5, c5, rmax, logden); }
    if (RK > 6u && i6 < nv) { chunk_store(vbase + i6, c6, rmax, logden); }
    if (RK > 7u && i7 < nv) { chunk_store(vbase + i7, c7, rmax, logden); }
    if (RK > 8u && i8 < nv) { chunk_store(vbase + i8, c8, rmax, logden); }
    if (RK > 9u && i9 < nv) { chunk_store(vbase + i9, c9, rmax, logden); }
    if (RK > 10u && i10 < nv) { chunk_store(vbase + i10, c10, rmax, logden); }
    if (RK > 11u && i11 < nv) { chunk_store(vbase + i11, c11, rmax, logden); }
    if (RK > 12u && i12 < nv) { chunk_store(vbase + i12, c12, rmax, logden); }
    if (RK > 13u && i13 < nv) { chunk_store(vbase + i13, c13, rmax, logden); }
    if (RK > 14u && i14 < nv) { chunk_store(vbase + i14, c14, rmax, logden); }
    if (RK > 15u && i15 < nv) { chunk_store(vbase + i15, c15, rmax, logden); }
    if (RK > 16u && i16 < nv) { chunk_store(vbase + i16, c16, rmax, logden); }
    if (RK > 17u && i17 < nv) { chunk_store(vbase + i17, c17, rmax, logden); }
    if (RK > 18u && i18 < nv) { chunk_store(vbase + i18, c18, rmax, logden); }
    if (RK > 19u && i19 < nv) { chunk_store(vbase + i19, c19, rmax, logden); }
    if (RK > 20u && i20 < nv) { chunk_store(vbase + i20, c20, rmax, logden); }
    if (RK > 21u && i21 < nv) { chunk_store(vbase + i21, c21, rmax, logden); }
    if (RK > 22u && i22 < nv) { chunk_store(vbase + i22, c22, rmax, logden); }
    if (RK > 23u && i23 < nv) { chunk_store(vbase + i23, c23, rmax, logden); }
    if (RK > 24u && i24 < nv) { chunk_store(vbase + i24, c24, rmax, logden); }
    if (RK > 25u && i25 < nv) { chunk_store(vbase + i25, c25, rmax, logden); }
    if (RK > 26u && i26 < nv) { chunk_store(vbase + i26, c26, rmax, logden); }
    if (RK > 27u && i27 < nv) { chunk_store(vbase + i27, c27, rmax, logden); }
    if (RK > 28u && i28 < nv) { chunk_store(vbase + i28, c28, rmax, logden); }
    if (RK > 29u && i29 < nv) { chunk_store(vbase + i29, c29, rmax, logden); }
    if (RK > 30u && i30 < nv) { chunk_store(vbase + i30, c30, rmax, logden); }
    if (RK > 31u && i31 < nv) { chunk_store(vbase + i31, c31, rmax, logden); }
}

// Register-resident softmax / log-softmax backward: x and dy (same dtype) for rows of up to
// RB·WG chunks are read once into registers, the row sum is taken from them, then dx is
// written. Same straight-line pattern as softmax_fwd_r; RB (a power of two) is at most 8 with
// 1024 lanes (64 registers of x and dy a lane), 16 with 256. 16-bit rows of the same range
// take it too when the host's switch says so (`softmax_bwd_h`, half chunks a lane, otherwise):
// a chunk's eight values then feed the lane's sum low half first, and dx is stored as two F32
// vec4s (dx4) or one chunk of eight values rounded once to ODT (y4, bound to dx too).
override RB: u32 = 16u;

fn chunk_bwd_acc(w: vec4<u32>, g: vec4<u32>, m: f32, logden: f32) -> f32 {
    let lo = softmax_bwd_acc(chunk_lo(w, DT), chunk_lo(g, DT), m, logden);
    if (DT == DT_F32) {
        return lo;
    }
    return lo + softmax_bwd_acc(chunk_hi(w, DT), chunk_hi(g, DT), m, logden);
}

fn chunk_bwd_store(i: u32, w: vec4<u32>, g: vec4<u32>, m: f32, logden: f32, total: f32) {
    let lo = softmax_bwd_value(chunk_lo(w, DT), chunk_lo(g, DT), m, logden, total);
    if (DT == DT_F32) {
        dx4[i] = lo;
        return;
    }
    let hi = softmax_bwd_value(chunk_hi(w, DT), chunk_hi(g, DT), m, logden, total);
    if (ODT != DT_F32) {
        y4[i] = narrow8(lo, hi, ODT);
    } else {
        dx4[2u * i] = lo;
        dx4[2u * i + 1u] = hi;
    }
}

@compute @workgroup_size(WG)
fn softmax_bwd_r(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let nv = params.cols / chunk_width(DT);
    let vbase = row * nv;
    let st = softmax_stats(row);
    let m = st.x;
    let logden = st.y;
    let zero = vec4<u32>(0u);
    let i0 = lid + 0u * WG;
    var c0 = zero;
    var g0 = zero;
    if (RB > 0u && i0 < nv) {
        c0 = x4[vbase + i0];
        g0 = second4[vbase + i0];
    }
    let i1 = lid + 1u * WG;
    var c1 = zero;
    var g1 = zero;
    if (RB > 1u && i1 < nv) {
        c1 = x4[vbase + i1];
        g1 = second4[vbase + i1];
    }
    let i2 = lid + 2u * WG;
    var c2 = zero;
    var g2 = zero;
    if (RB > 2u && i2 < nv) {
        c2 = x4[vbase + i2];
        g2 = second4[vbase + i2];
    }
    let i3 = lid + 3u * WG;
    var c3 = zero;
    var g3 = zero;
    if (RB > 3u && i3 < nv) {
        c3 = x4[vbase + i3];
        g3 = second4[vbase + i3];
    }
    let i4 = lid + 4u * WG;
    var c4 = zero;
    var g4 = zero;
    if (RB > 4u && i4 < nv) {
        c4 = x4[vbase + i4];
        g4 = second4[vbase + i4];
    }
    let i5 = lid + 5u * WG;
    var c5 = zero;
    var g5 = zero;
    if (RB > 5u && i5 < nv) {
        c5 = x4[vbase + i5];
        g5 = second4[vbase + i5];
    }
    let i6 = lid + 6u * WG;
    var c6 = zero;
    var g6 = zero;
    if (RB > 6u && i6 < nv) {
        c6 = x4[vbase + i6];
        g6 = second4[vbase + i6];
    }
    let i7 = lid + 7u * WG;
    var c7 = zero;
    var g7 = zero;
    if (RB > 7u && i7 < nv) {
        c7 = x4[vbase + i7];
        g7 = second4[vbase + i7];
    }
    let i8 = lid + 8u * WG;
    var c8 = zero;
    var g8 = zero;
    if (RB > 8u && i8 < nv) {
        c8 = x4[vbase + i8];
        g8 = second4[vbase + i8];
    }
    let i9 = lid + 9u * WG;
    var c9 = zero;
    var g9 = zero;
    if (RB > 9u && i9 < nv) {
        c9 = x4[vbase + i9];
        g9 = second4[vbase + i9];
    }
    let i10 = lid + 10u * WG;
    var c10 = zero;
    var g10 = zero;
    if (RB > 10u && i10 < nv) {
        c10 = x4[vbase + i10];
        g10 = second4[vbase + i10];
    }
    let i11 = lid + 11u * WG;
    var c11 = zero;
    var g11 = zero;
    if (RB > 11u && i11 < nv) {
        c11 = x4[vbase + i11];
        g11 = second4[vbase + i11];
    }
    let i12 = lid + 12u * WG;
    var c12 = zero;
    var g12 = zero;
    if (RB > 12u && i12 < nv) {
        c12 = x4[vbase + i12];
        g12 = second4[vbase + i12];
    }
    let i13 = lid + 13u * WG;
    var c13 = zero;
    var g13 = zero;
    if (RB > 13u && i13 < nv) {
        c13 = x4[vbase + i13];
        g13 = second4[vbase + i13];
    }
    let i14 = lid + 14u * WG;
    var c14 = zero;
    var g14 = zero;
    if (RB > 14u && i14 < nv) {
        c14 = x4[vbase + i14];
        g14 = second4[vbase + i14];
    }
    let i15 = lid + 15u * WG;
    var c15 = zero;
    var g15 = zero;
    if (RB > 15u && i15 < nv) {
        c15 = x4[vbase + i15];
        g15 = second4[vbase + i15];
    }
    var acc = 0.0;
    if (RB > 0u && i0 < nv) { acc = acc + chunk_bwd_acc(c0, g0, m, logden); }
    if (RB > 1u && i1 < nv) { acc = acc + chunk_bwd_acc(c1, g1, m, logden); }
    if (RB > 2u && i2 < nv) { acc = acc + chunk_bwd_acc(c2, g2, m, logden); }
    if (RB > 3u && i3 < nv) { acc = acc + chunk_bwd_acc(c3, g3, m, logden); }
    if (RB > 4u && i4 < nv) { acc = acc + chunk_bwd_acc(c4, g4, m, logden); }
    if (RB > 5u && i5 < nv) { acc = acc + chunk_bwd_acc(c5, g5, m, logden); }
    if (RB > 6u && i6 < nv) { acc = acc + chunk_bwd_acc(c6, g6, m, logden); }
    if (RB > 7u && i7 < nv) { acc = acc + chunk_bwd_acc(c7, g7, m, logden); }
    if (RB > 8u && i8 < nv) { acc = acc + chunk_bwd_acc(c8, g8, m, logden); }
    if (RB > 9u && i9 < nv) { acc = acc + chunk_bwd_acc(c9, g9, m, logden); }
    if (RB > 10u && i10 < nv) { acc = acc + chunk_bwd_acc(c10, g10, m, logden); }
    if (RB > 11u && i11 < nv) { acc = acc + chunk_bwd_acc(c11, g11, m, logden); }
    if (RB > 12u && i12 < nv) { acc = acc + chunk_bwd_acc(c12, g12, m, logden); }
    if (RB > 13u && i13 < nv) { acc = acc + chunk_bwd_acc(c13, g13, m, logden); }
    if (RB > 14u && i14 < nv) { acc = acc + chunk_bwd_acc(c14, g14, m, logden); }
    if (RB > 15u && i15 < nv) { acc = acc + chunk_bwd_acc(c15, g15, m, logden); }
    // Softmax sums by a fan-in-8 tree, log-softmax by the binary one (each the faster on the
    // H200: 420 → 410 µs and 402 → 384 µs at 4096×32000 F32).
    var total = 0.0;
    if (MODE == 0u) {
        total = workgroup_sum8(acc, lid);
    } else {
        total = workgroup_sum(acc, lid);
    }
    if (RB > 0u && i0 < nv) { chunk_bwd_store(vbase + i0, c0, g0, m, logden, total); }
    if (RB > 1u && i1 < nv) { chunk_bwd_store(vbase + i1, c1, g1, m, logden, total); }
    if (RB > 2u && i2 < nv) { chunk_bwd_store(vbase + i2, c2, g2, m, logden, total); }
    if (RB > 3u && i3 < nv) { chunk_bwd_store(vbase + i3, c3, g3, m, logden, total); }
    if (RB > 4u && i4 < nv) { chunk_bwd_store(vbase + i4, c4, g4, m, logden, total); }
    if (RB > 5u && i5 < nv) { chunk_bwd_store(vbase + i5, c5, g5, m, logden, total); }
    if (RB > 6u && i6 < nv) { chunk_bwd_store(vbase + i6, c6, g6, m, logden, total); }
    if (RB > 7u && i7 < nv) { chunk_bwd_store(vbase + i7, c7, g7, m, logden, total); }
    if (RB > 8u && i8 < nv) { chunk_bwd_store(vbase + i8, c8, g8, m, logden, total); }
    if (RB > 9u && i9 < nv) { chunk_bwd_store(vbase + i9, c9, g9, m, logden, total); }
    if (RB > 10u && i10 < nv) { chunk_bwd_store(vbase + i10, c10, g10, m, logden, total); }
    if (RB > 11u && i11 < nv) { chunk_bwd_store(vbase + i11, c11, g11, m, logden, total); }
    if (RB > 12u && i12 < nv) { chunk_bwd_store(vbase + i12, c12, g12, m, logden, total); }
    if (RB > 13u && i13 < nv) { chunk_bwd_store(vbase + i13, c13, g13, m, logden, total); }
    if (RB > 14u && i14 < nv) { chunk_bwd_store(vbase + i14, c14, g14, m, logden, total); }
    if (RB > 15u && i15 < nv) { chunk_bwd_store(vbase + i15, c15, g15, m, logden, total); }
}

// ---- softmax forward from registers, 256 lanes (softmax_fwd_c) ---------------------------
// For rows of whole chunks of at most CHUNKS × WG chunks (the host's rule: 16-bit rows of up to
// 16 × 256 chunks, `src/loss.rs`). Lane t holds the row's chunks t, t + WG, ...,
// t + (CHUNKS − 1)·WG as packed vec4<u32> in named registers (no indexed private array, which
// some compilers put in local memory), all loaded before any arithmetic; statements for chunk
// k ≥ CHUNKS fold away once the pipeline is specialized. From the registers, in three steps:
// the row maximum (no exp: each lane's chunks in order, then `lanes_max`: the fan-in-8 tree, or
// subgroup shuffles in the subgroup module); Σ exp(x − max), one exp a value (each lane's
// chunks in order, then `lanes_sum`); the outputs (softmax
// one exp a value, as exp2((x − max)·log2 e − log Σ·log2 e) with one fused multiply-add;
// log-softmax (x − max) − log Σ, no exp). The saved statistics are those of the other entries
// (row maximum, log denominator; a row of −∞ gives −∞ and −∞ and NaN outputs).
//
// BF16 outputs: when a row's log denominator is finite, every input is finite or −∞, so no
// output is NaN and each rounds with the three-operation nearest-even sequence
// (`bf16x4_nearest`); other rows (a NaN or +∞ in the row, or a row of −∞, whose outputs are
// all NaN) take the full narrowing. F16 outputs always take `narrow2`. Same bits either way.
override CHUNKS: u32 = 16u; // chunks per lane: 1, 2, 4, 8 or 16 (the unused registers fold away)

const LOG2E: f32 = 1.4426950408889634;

// Whether lane `lid` holds its k-th chunk (row chunk lid + k·WG) of a row of n chunks.
fn held(k: u32, lid: u32, n: u32) -> bool {
    return k < CHUNKS && lid + k * WG < n;
}

// The lane's k-th chunk of the row starting at chunk `base` (zeros if it holds none).
fn held_load(k: u32, lid: u32, n: u32, base: u32) -> vec4<u32> {
    if (held(k, lid, n)) {
        return x4[base + lid + k * WG];
    }
    return vec4<u32>();
}

fn held_max(m: f32, w: vec4<u32>, k: u32, lid: u32, n: u32) -> f32 {
    if (held(k, lid, n)) {
        return max(m, chunk_max(w));
    }
    return m;
}

fn held_expsum(s: f32, w: vec4<u32>, k: u32, lid: u32, n: u32, m: f32) -> f32 {
    if (held(k, lid, n)) {
        return s + chunk_expsum(w, m);
    }
    return s;
}

// Softmax (exp2 of fma(x − m, log2 e, c), c = −log Σ·log2 e) or log-softmax of four values.
fn held_out4(v: vec4<f32>, m: f32, logden: f32, c: f32) -> vec4<f32> {
    let d = v - vec4<f32>(m);
    if (MODE == 1u) {
        return d - vec4<f32>(logden);
    }
    return exp2(fma(d, vec4<f32>(LOG2E), vec4<f32>(c)));
}

fn held_store(w: vec4<u32>, k: u32, lid: u32, n: u32, base: u32, m: f32, logden: f32, c: f32,
              no_nan: bool) {
    if (!held(k, lid, n)) {
        return;
    }
    let a = held_out4(chunk_lo(w, DT), m, logden, c);
    var out = bitcast<vec4<u32>>(a);
    if (DT != DT_F32) {
        let b = held_out4(chunk_hi(w, DT), m, logden, c);
        if (DT == DT_BF16 && no_nan) {
            out = vec4<u32>(bf16x4_nearest(a), bf16x4_nearest(b));
        } else {
            out = pack_chunk(a, b, DT);
        }
    }
    y4[base + lid + k * WG] = out;
}

@compute @workgroup_size(WG)
fn softmax_fwd_c(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / chunk_width(DT);
    let base = row * n;
    let c0 = held_load(0u, lid, n, base);
    let c1 = held_load(1u, lid, n, base);
    let c2 = held_load(2u, lid, n, base);
    let c3 = held_load(3u, lid, n, base);
    let c4 = held_load(4u, lid, n, base);
    let c5 = held_load(5u, lid, n, base);
    let c6 = held_load(6u, lid, n, base);
    let c7 = held_load(7u, lid, n, base);
    let c8 = held_load(8u, lid, n, base);
    let c9 = held_load(9u, lid, n, base);
    let c10 = held_load(10u, lid, n, base);
    let c11 = held_load(11u, lid, n, base);
    let c12 = held_load(12u, lid, n, base);
    let c13 = held_load(13u, lid, n, base);
    let c14 = held_load(14u, lid, n, base);
    let c15 = held_load(15u, lid, n, base);
    var m = neg_inf();
    m = held_max(m, c0, 0u, lid, n);
    m = held_max(m, c1, 1u, lid, n);
    m = held_max(m, c2, 2u, lid, n);
    m = held_max(m, c3, 3u, lid, n);
    m = held_max(m, c4, 4u, lid, n);
    m = held_max(m, c5, 5u, lid, n);
    m = held_max(m, c6, 6u, lid, n);
    m = held_max(m, c7, 7u, lid, n);
    m = held_max(m, c8, 8u, lid, n);
    m = held_max(m, c9, 9u, lid, n);
    m = held_max(m, c10, 10u, lid, n);
    m = held_max(m, c11, 11u, lid, n);
    m = held_max(m, c12, 12u, lid, n);
    m = held_max(m, c13, 13u, lid, n);
    m = held_max(m, c14, 14u, lid, n);
    m = held_max(m, c15, 15u, lid, n);
    let rmax = lanes_max(m, lid);
    var s = 0.0;
    if (rmax != neg_inf()) {
        s = held_expsum(s, c0, 0u, lid, n, rmax);
        s = held_expsum(s, c1, 1u, lid, n, rmax);
        s = held_expsum(s, c2, 2u, lid, n, rmax);
        s = held_expsum(s, c3, 3u, lid, n, rmax);
        s = held_expsum(s, c4, 4u, lid, n, rmax);
        s = held_expsum(s, c5, 5u, lid, n, rmax);
        s = held_expsum(s, c6, 6u, lid, n, rmax);
        s = held_expsum(s, c7, 7u, lid, n, rmax);
        s = held_expsum(s, c8, 8u, lid, n, rmax);
        s = held_expsum(s, c9, 9u, lid, n, rmax);
        s = held_expsum(s, c10, 10u, lid, n, rmax);
        s = held_expsum(s, c11, 11u, lid, n, rmax);
        s = held_expsum(s, c12, 12u, lid, n, rmax);
        s = held_expsum(s, c13, 13u, lid, n, rmax);
        s = held_expsum(s, c14, 14u, lid, n, rmax);
        s = held_expsum(s, c15, 15u, lid, n, rmax);
    }
    let logden = log(lanes_sum(s, lid));
    if (lid == 0u) {
        stats_out[2u * row] = rmax;
        stats_out[2u * row + 1u] = logden;
    }
    let c = -logden * LOG2E;
    let no_nan = (bitcast<u32>(logden) & 0x7fffffffu) < 0x7f800000u;
    held_store(c0, 0u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c1, 1u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c2, 2u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c3, 3u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c4, 4u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c5, 5u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c6, 6u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c7, 7u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c8, 8u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c9, 9u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c10, 10u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c11, 11u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c12, 12u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c13, 13u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c14, 14u, lid, n, base, rmax, logden, c, no_nan);
    held_store(c15, 15u, lid, n, base, rmax, logden, c, no_nan);
}

// ---- 16-bit softmax / log-softmax backward from registers by half chunks (softmax_bwd_h) ----
// For 16-bit x and dy (same dtype) in rows of whole chunks, the register range of
// `softmax_bwd_r` (the host's rule, `src/loss.rs`). Lane t holds the row's half chunks
// (4 elements: one vec2<u32> of x and one of dy, 8-byte loads) t, t + WG, ...,
// t + (HB − 1)·WG in named registers, all loaded before any arithmetic, and writes dx's F32
// vec4 of each (or, with ODT 16-bit, its four values rounded once into one vec2<u32>): the
// stores of a workgroup are contiguous (a lane holding whole chunks would write two vec4s 32
// bytes apart, which costs half the store bandwidth). From the registers:
// Σ p·dy (softmax) or Σ dy (log-softmax), each lane's half chunks in order, then `lanes_sum`
// (the fan-in-8 tree `workgroup_sum8`, or subgroup shuffles in the subgroup module; the
// pairwise tree's twelve barriers at 1,024 lanes cost 8% of the BF16-gradient backward on an
// H200); then dx. p is exp2(fma(x − max, log2 e, −log Σ·log2 e)), as in
// `softmax_fwd_c`, computed once and held where it fits (`hold_p`; recomputing it for the store
// cost 4% more there). Statements for half chunk k ≥ HB fold away once the pipeline is
// specialized: HB (a power of two) is at most 16 with 1024 lanes (32 registers of x and dy a
// lane at the benchmark width), 32 with 256.
override HB: u32 = 32u;

@group(0) @binding(18) var<storage, read> x2: array<vec2<u32>>;
@group(0) @binding(19) var<storage, read> second2: array<vec2<u32>>;
// dx in 16 bits (ODT): the F32 values rounded once, 8 bytes a half chunk (the host binds dx
// both here and as dx4; only the binding of ODT is written).
@group(0) @binding(20) var<storage, read_write> dx2: array<vec2<u32>>;

// Whether lane `lid` holds its k-th half chunk (row half chunk lid + k·WG) of a row of n.
fn half_held(k: u32, lid: u32, n: u32) -> bool {
    return k < HB && lid + k * WG < n;
}

// The lane's k-th half chunk of x (row starting at half chunk `base`; zeros if it holds none).
fn half_x(k: u32, lid: u32, n: u32, base: u32) -> vec2<u32> {
    if (half_held(k, lid, n)) {
        return x2[base + lid + k * WG];
    }
    return vec2<u32>();
}

// The same half chunk of dy.
fn half_dy(k: u32, lid: u32, n: u32, base: u32) -> vec2<u32> {
    if (half_held(k, lid, n)) {
        return second2[base + lid + k * WG];
    }
    return vec2<u32>();
}

// Four 16-bit values widened for arithmetic (`widen2`: every use below is arithmetic).
fn half_values(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(widen2(w.x, DT), widen2(w.y, DT));
}

// Probabilities of four logits: exp2(fma(x − m, log2 e, c)), c = −log Σ·log2 e (or from
// the output, FROM_OUT).
fn half_p(w: vec2<u32>, m: f32, c: f32) -> vec4<f32> {
    if (FROM_OUT) {
        return softmax_p4(half_values(w), 0.0, 0.0);
    }
    return exp2(fma(half_values(w) - vec4<f32>(m), vec4<f32>(LOG2E), vec4<f32>(c)));
}

// Whether the softmax probabilities are computed once, right after the loads, and held in
// place of x for the store (one exp a value instead of two): when they fit, at most 8 half
// chunks a lane (32 F32 registers); log-softmax needs p at the store only.
fn hold_p() -> bool {
    return MODE == 0u && HB <= 8u;
}

fn half_held_p(w: vec2<u32>, k: u32, lid: u32, n: u32, m: f32, c: f32) -> vec4<f32> {
    if (!hold_p() || !half_held(k, lid, n)) {
        return vec4<f32>();
    }
    return half_p(w, m, c);
}

fn half_acc(acc: f32, w: vec2<u32>, hp: vec4<f32>, g: vec2<u32>, k: u32, lid: u32, n: u32, m: f32,
            c: f32) -> f32 {
    if (!half_held(k, lid, n)) {
        return acc;
    }
    let gv = half_values(g);
    if (MODE == 1u) {
        return acc + ((gv.x + gv.y) + (gv.z + gv.w));
    }
    var p = hp;
    if (!hold_p()) {
        p = half_p(w, m, c);
    }
    let q = p * gv;
    return acc + ((q.x + q.y) + (q.z + q.w));
}

fn half_store(w: vec2<u32>, hp: vec4<f32>, g: vec2<u32>, k: u32, lid: u32, n: u32, base: u32,
              m: f32, c: f32, total: f32) {
    if (!half_held(k, lid, n)) {
        return;
    }
    var p = hp;
    if (!hold_p()) {
        p = half_p(w, m, c);
    }
    let gv = half_values(g);
    var d = p * (gv - vec4<f32>(total));
    if (MODE == 1u) {
        d = gv - p * total;
    }
    let i = base + lid + k * WG;
    if (ODT == DT_F32) {
        dx4[i] = d;
    } else {
        dx2[i] = narrow4(d, ODT);
    }
}

@compute @workgroup_size(WG)
fn softmax_bwd_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    let n = params.cols / 4u;
    let base = row * n;
    let st = softmax_stats(row);
    let m = st.x;
    let c = -st.y * LOG2E;
    let x0 = half_x(0u, lid, n, base);
    let g0 = half_dy(0u, lid, n, base);
    let x1 = half_x(1u, lid, n, base);
    let g1 = half_dy(1u, lid, n, base);
    let x2 = half_x(2u, lid, n, base);
    let g2 = half_dy(2u, lid, n, base);
    let x3 = half_x(3u, lid, n, base);
    let g3 = half_dy(3u, lid, n, base);
    let x4 = half_x(4u, lid, n, base);
    let g4 = half_dy(4u, lid, n, base);
    let x5 = half_x(5u, lid, n, base);
    let g5 = half_dy(5u, lid, n, base);
    let x6 = half_x(6u, lid, n, base);
    let g6 = half_dy(6u, lid, n, base);
    let x7 = half_x(7u, lid, n, base);
    let g7 = half_dy(7u, lid, n, base);
    let x8 = half_x(8u, lid, n, base);
    let g8 = half_dy(8u, lid, n, base);
    let x9 = half_x(9u, lid, n, base);
    let g9 = half_dy(9u, lid, n, base);
    let x10 = half_x(10u, lid, n, base);
    let g10 = half_dy(10u, lid, n, base);
    let x11 = half_x(11u, lid, n, base);
    let g11 = half_dy(11u, lid, n, base);
    let x12 = half_x(12u, lid, n, base);
    let g12 = half_dy(12u, lid, n, base);
    let x13 = half_x(13u, lid, n, base);
    let g13 = half_dy(13u, lid, n, base);
    let x14 = half_x(14u, lid, n, base);
    let g14 = half_dy(14u, lid, n, base);
    let x15 = half_x(15u, lid, n, base);
    let g15 = half_dy(15u, lid, n, base);
    let x16 = half_x(16u, lid, n, base);
    let g16 = half_dy(16u, lid, n, base);
    let x17 = half_x(17u, lid, n, base);
    let g17 = half_dy(17u, lid, n, base);
    let x18 = half_x(18u, lid, n, base);
    let g18 = half_dy(18u, lid, n, base);
    let x19 = half_x(19u, lid, n, base);
    let g19 = half_dy(19u, lid, n, base);
    let x20 = half_x(20u, lid, n, base);
    let g20 = half_dy(20u, lid, n, base);
    let x21 = half_x(21u, lid, n, base);
    let g21 = half_dy(21u, lid, n, base);
    let x22 = half_x(22u, lid, n, base);
    let g22 = half_dy(22u, lid, n, base);
    let x23 = half_x(23u, lid, n, base);
    let g23 = half_dy(23u, lid, n, base);
    let x24 = half_x(24u, lid, n, base);
    let g24 = half_dy(24u, lid, n, base);
    let x25 = half_x(25u, lid, n, base);
    let g25 = half_dy(25u, lid, n, base);
    let x26 = half_x(26u, lid, n, base);
    let g26 = half_dy(26u, lid, n, base);
    let x27 = half_x(27u, lid, n, base);
    let g27 = half_dy(27u, lid, n, base);
    let x28 = half_x(28u, lid, n, base);
    let g28 = half_dy(28u, lid, n, base);
    let x29 = half_x(29u, lid, n, base);
    let g29 = half_dy(29u, lid, n, base);
    let x30 = half_x(30u, lid, n, base);
    let g30 = half_dy(30u, lid, n, base);
    let x31 = half_x(31u, lid, n, base);
    let g31 = half_dy(31u, lid, n, base);
    let p0 = half_held_p(x0, 0u, lid, n, m, c);
    let p1 = half_held_p(x1, 1u, lid, n, m, c);
    let p2 = half_held_p(x2, 2u, lid, n, m, c);
    let p3 = half_held_p(x3, 3u, lid, n, m, c);
    let p4 = half_held_p(x4, 4u, lid, n, m, c);
    let p5 = half_held_p(x5, 5u, lid, n, m, c);
    let p6 = half_held_p(x6, 6u, lid, n, m, c);
    let p7 = half_held_p(x7, 7u, lid, n, m, c);
    let p8 = half_held_p(x8, 8u, lid, n, m, c);
    let p9 = half_held_p(x9, 9u, lid, n, m, c);
    let p10 = half_held_p(x10, 10u, lid, n, m, c);
    let p11 = half_held_p(x11, 11u, lid, n, m, c);
    let p12 = half_held_p(x12, 12u, lid, n, m, c);
    let p13 = half_held_p(x13, 13u, lid, n, m, c);
    let p14 = half_held_p(x14, 14u, lid, n, m, c);
    let p15 = half_held_p(x15, 15u, lid, n, m, c);
    let p16 = half_held_p(x16, 16u, lid, n, m, c);
    let p17 = half_held_p(x17, 17u, lid, n, m, c);
    let p18 = half_held_p(x18, 18u, lid, n, m, c);
    let p19 = half_held_p(x19, 19u, lid, n, m, c);
    let p20 = half_held_p(x20, 20u, lid, n, m, c);
    let p21 = half_held_p(x21, 21u, lid, n, m, c);
    let p22 = half_held_p(x22, 22u, lid, n, m, c);
    let p23 = half_held_p(x23, 23u, lid, n, m, c);
    let p24 = half_held_p(x24, 24u, lid, n, m, c);
    let p25 = half_held_p(x25, 25u, lid, n, m, c);
    let p26 = half_held_p(x26, 26u, lid, n, m, c);
    let p27 = half_held_p(x27, 27u, lid, n, m, c);
    let p28 = half_held_p(x28, 28u, lid, n, m, c);
    let p29 = half_held_p(x29, 29u, lid, n, m, c);
    let p30 = half_held_p(x30, 30u, lid, n, m, c);
    let p31 = half_held_p(x31, 31u, lid, n, m, c);
    var acc = 0.0;
    acc = half_acc(acc, x0, p0, g0, 0u, lid, n, m, c);
    acc = half_acc(acc, x1, p1, g1, 1u, lid, n, m, c);
    acc = half_acc(acc, x2, p2, g2, 2u, lid, n, m, c);
    acc = half_acc(acc, x3, p3, g3, 3u, lid, n, m, c);
    acc = half_acc(acc, x4, p4, g4, 4u, lid, n, m, c);
    acc = half_acc(acc, x5, p5, g5, 5u, lid, n, m, c);
    acc = half_acc(acc, x6, p6, g6, 6u, lid, n, m, c);
    acc = half_acc(acc, x7, p7, g7, 7u, lid, n, m, c);
    acc = half_acc(acc, x8, p8, g8, 8u, lid, n, m, c);
    acc = half_acc(acc, x9, p9, g9, 9u, lid, n, m, c);
    acc = half_acc(acc, x10, p10, g10, 10u, lid, n, m, c);
    acc = half_acc(acc, x11, p11, g11, 11u, lid, n, m, c);
    acc = half_acc(acc, x12, p12, g12, 12u, lid, n, m, c);
    acc = half_acc(acc, x13, p13, g13, 13u, lid, n, m, c);
    acc = half_acc(acc, x14, p14, g14, 14u, lid, n, m, c);
    acc = half_acc(acc, x15, p15, g15, 15u, lid, n, m, c);
    acc = half_acc(acc, x16, p16, g16, 16u, lid, n, m, c);
    acc = half_acc(acc, x17, p17, g17, 17u, lid, n, m, c);
    acc = half_acc(acc, x18, p18, g18, 18u, lid, n, m, c);
    acc = half_acc(acc, x19, p19, g19, 19u, lid, n, m, c);
    acc = half_acc(acc, x20, p20, g20, 20u, lid, n, m, c);
    acc = half_acc(acc, x21, p21, g21, 21u, lid, n, m, c);
    acc = half_acc(acc, x22, p22, g22, 22u, lid, n, m, c);
    acc = half_acc(acc, x23, p23, g23, 23u, lid, n, m, c);
    acc = half_acc(acc, x24, p24, g24, 24u, lid, n, m, c);
    acc = half_acc(acc, x25, p25, g25, 25u, lid, n, m, c);
    acc = half_acc(acc, x26, p26, g26, 26u, lid, n, m, c);
    acc = half_acc(acc, x27, p27, g27, 27u, lid, n, m, c);
    acc = half_acc(acc, x28, p28, g28, 28u, lid, n, m, c);
    acc = half_acc(acc, x29, p29, g29, 29u, lid, n, m, c);
    acc = half_acc(acc, x30, p30, g30, 30u, lid, n, m, c);
    acc = half_acc(acc, x31, p31, g31, 31u, lid, n, m, c);
    let total = lanes_sum(acc, lid);
    half_store(x0, p0, g0, 0u, lid, n, base, m, c, total);
    half_store(x1, p1, g1, 1u, lid, n, base, m, c, total);
    half_store(x2, p2, g2, 2u, lid, n, base, m, c, total);
    half_store(x3, p3, g3, 3u, lid, n, base, m, c, total);
    half_store(x4, p4, g4, 4u, lid, n, base, m, c, total);
    half_store(x5, p5, g5, 5u, lid, n, base, m, c, total);
    half_store(x6, p6, g6, 6u, lid, n, base, m, c, total);
    half_store(x7, p7, g7, 7u, lid, n, base, m, c, total);
    half_store(x8, p8, g8, 8u, lid, n, base, m, c, total);
    half_store(x9, p9, g9, 9u, lid, n, base, m, c, total);
    half_store(x10, p10, g10, 10u, lid, n, base, m, c, total);
    half_store(x11, p11, g11, 11u, lid, n, base, m, c, total);
    half_store(x12, p12, g12, 12u, lid, n, base, m, c, total);
    half_store(x13, p13, g13, 13u, lid, n, base, m, c, total);
    half_store(x14, p14, g14, 14u, lid, n, base, m, c, total);
    half_store(x15, p15, g15, 15u, lid, n, base, m, c, total);
    half_store(x16, p16, g16, 16u, lid, n, base, m, c, total);
    half_store(x17, p17, g17, 17u, lid, n, base, m, c, total);
    half_store(x18, p18, g18, 18u, lid, n, base, m, c, total);
    half_store(x19, p19, g19, 19u, lid, n, base, m, c, total);
    half_store(x20, p20, g20, 20u, lid, n, base, m, c, total);
    half_store(x21, p21, g21, 21u, lid, n, base, m, c, total);
    half_store(x22, p22, g22, 22u, lid, n, base, m, c, total);
    half_store(x23, p23, g23, 23u, lid, n, base, m, c, total);
    half_store(x24, p24, g24, 24u, lid, n, base, m, c, total);
    half_store(x25, p25, g25, 25u, lid, n, base, m, c, total);
    half_store(x26, p26, g26, 26u, lid, n, base, m, c, total);
    half_store(x27, p27, g27, 27u, lid, n, base, m, c, total);
    half_store(x28, p28, g28, 28u, lid, n, base, m, c, total);
    half_store(x29, p29, g29, 29u, lid, n, base, m, c, total);
    half_store(x30, p30, g30, 30u, lid, n, base, m, c, total);
    half_store(x31, p31, g31, 31u, lid, n, base, m, c, total);
}
