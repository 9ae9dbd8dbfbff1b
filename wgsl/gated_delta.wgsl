// Gated delta recurrence (Gated DeltaNet: one decay per head; KDA core: one per key channel).
// Per token and value head, with a = exp(log_decay):
//   D = diag(a)·S_prev;  e = v − Dᵀk;  S = D + β·k·eᵀ;  o = scale·Sᵀq.
// Every state element is written by exactly one invocation in each phase (barriers between
// phases), so nothing needs atomics; every sum runs in a fixed order (ascending index within a
// lane's chunk, then the chunks in lane order), so reruns give the same bits.
//
// q, k, v: storage dtype DT (F32/F16/BF16 as u32 words), addressed as views
//   offset + (b·T + t)·row_stride + head·dim + i.
// beta [B,T,Hv], log_decay [B,T,Hv] or [B,T,Hv,K], states [B,Hv,K,V]: F32.
// Checkpoints [B,Hv,NC,K,V]: checkpoint c is the state before token c·C.

override DT: u32 = 0u;
override KD: u32 = 128u;          // key dim K (16..=256)
override PER_CHANNEL: u32 = 0u;   // 1: log_decay [B,T,Hv,K]
const WG: u32 = 256u;             // lanes per workgroup (forward and backward)
const FWD_COLS: u32 = 32u;        // forward: value columns per workgroup
const FWD_PARTS: u32 = 8u;        // forward: lanes per column (WG / FWD_COLS)
const FWD_CHUNK: u32 = 32u;       // forward: most state rows per lane (MAXD / FWD_PARTS)
const MAXD: u32 = 256u;

struct Params {
    batch: u32,
    time: u32,
    key_heads: u32,
    value_heads: u32,
    vdim: u32,
    group: u32,        // Hv / Hk
    interval: u32,     // C, tokens per checkpoint segment
    checkpoints: u32,  // NC = ceil(T / C)
    q_off: u32,
    q_stride: u32,
    k_off: u32,
    k_stride: u32,
    v_off: u32,
    v_stride: u32,
    scale: f32,
    flags: u32,        // bit 0: initial state / output cotangent present
    sub: u32,          // backward: value head within the group handled by this launch
    units: u32,        // workgroups doing work
    slices: u32,       // forward: value-column slices per head
    unit_base: u32,    // backward: first unit of this launch
    seg: u32,          // backward mode 1 and sum_heads: the segment
    sub_interval: u32, // backward: tokens per sub-segment (c2)
    subs: u32,         // backward: most sub-segments per segment, ceil(C / c2)
    mode: u32,         // backward: 0 waves over all segments, 1 one segment, all value heads
    chunks: u32,       // chunked forward: chunks of CH tokens, ceil(T / CH)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_in: array<u32>;
@group(0) @binding(2) var<storage, read> k_in: array<u32>;
@group(0) @binding(3) var<storage, read> v_in: array<u32>;
@group(0) @binding(4) var<storage, read> beta_in: array<f32>;
@group(0) @binding(5) var<storage, read> gate_in: array<f32>;
@group(0) @binding(6) var<storage, read> init_in: array<f32>;
@group(0) @binding(7) var<storage, read_write> out_buf: array<f32>;
@group(0) @binding(8) var<storage, read_write> final_buf: array<f32>;
@group(0) @binding(9) var<storage, read_write> ckpt_buf: array<f32>;
@group(0) @binding(10) var<storage, read> dout_in: array<f32>;
@group(0) @binding(11) var<storage, read_write> states_buf: array<f32>;
@group(0) @binding(12) var<storage, read_write> ds_buf: array<f32>;
@group(0) @binding(13) var<storage, read_write> dq_buf: array<f32>;
@group(0) @binding(14) var<storage, read_write> dk_buf: array<f32>;
@group(0) @binding(15) var<storage, read_write> dv_buf: array<f32>;
@group(0) @binding(16) var<storage, read_write> dbeta_buf: array<f32>;
@group(0) @binding(17) var<storage, read_write> dg_buf: array<f32>;
@group(0) @binding(18) var<storage, read> pdq_in: array<f32>;
@group(0) @binding(19) var<storage, read> pdk_in: array<f32>;
@group(0) @binding(20) var<storage, read_write> ws_buf: array<f32>;

var<workgroup> sh_q: array<f32, MAXD>;
var<workgroup> sh_k: array<f32, MAXD>;
var<workgroup> sh_a: array<f32, MAXD>;
var<workgroup> sh_e: array<f32, MAXD>;
var<workgroup> sh_dp: array<f32, MAXD>;
var<workgroup> sh_do: array<f32, MAXD>;

fn load_q(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(q_in[i]);
    }
    return half_from_word(q_in[i >> 1u], i, DT);
}

fn load_k(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(k_in[i]);
    }
    return half_from_word(k_in[i >> 1u], i, DT);
}

fn load_v(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(v_in[i]);
    }
    return half_from_word(v_in[i >> 1u], i, DT);
}

// Element index of (row = b·T + t, head, i) in a view.
fn q_index(row: u32, head: u32, i: u32) -> u32 {
    return params.q_off + row * params.q_stride + head * KD + i;
}

fn k_index(row: u32, head: u32, i: u32) -> u32 {
    return params.k_off + row * params.k_stride + head * KD + i;
}

fn v_index(row: u32, head: u32, j: u32) -> u32 {
    return params.v_off + row * params.v_stride + head * params.vdim + j;
}

fn decay(row: u32, hv: u32, i: u32) -> f32 {
    let r = row * params.value_heads + hv;
    if (PER_CHANNEL == 1u) {
        return exp(gate_in[r * KD + i]);
    }
    return exp(gate_in[r]);
}

// Load k (and q when `with_q`) of key head hk and the decay of value head hv at token row into
// workgroup memory, lanes striding by `lanes`. Call from uniform control flow.
fn stage_token(row: u32, hk: u32, hv: u32, lid: u32, lanes: u32, with_q: bool) {
    workgroupBarrier();
    for (var i = lid; i < KD; i = i + lanes) {
        sh_k[i] = load_k(k_index(row, hk, i));
        if (with_q) {
            sh_q[i] = load_q(q_index(row, hk, i));
        }
        sh_a[i] = decay(row, hv, i);
    }
    workgroupBarrier();
}

// One workgroup per (b, value head, slice of FWD_COLS value columns). Lane (column j, part r)
// keeps rows [r·chunk, (r+1)·chunk) of state column j in registers (chunk = ⌈K/FWD_PARTS⌉);
// the parts' dot products are combined in part order through workgroup memory. Loops run a
// constant `chunk` times (guarded by the lane's row count) so drivers can keep `s` in registers.
@compute @workgroup_size(WG)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let unit = group_index(wid, nwg);
    if (unit >= params.units) {
        return;
    }
    let vd = params.vdim;
    let bh = unit / params.slices;
    let j = lid % FWD_COLS;
    let r = lid / FWD_COLS;
    let col = (unit % params.slices) * FWD_COLS + j;
    let hv = bh % params.value_heads;
    let b = bh / params.value_heads;
    let hk = hv / params.group;
    let col_live = col < vd;
    let chunk = (KD + FWD_PARTS - 1u) / FWD_PARTS;
    let i0 = min(r * chunk, KD);
    let n = min(i0 + chunk, KD) - i0;
    let sbase = bh * KD * vd;
    var s: array<f32, FWD_CHUNK>;
    for (var c = 0u; c < chunk; c = c + 1u) {
        if (c < n) {
            var x = 0.0;
            if (col_live && (params.flags & 1u) != 0u) {
                x = init_in[sbase + (i0 + c) * vd + col];
            }
            s[c] = x;
        }
    }
    for (var t = 0u; t < params.time; t = t + 1u) {
        let row = b * params.time + t;
        if (col_live && t % params.interval == 0u) {
            let cbase = (bh * params.checkpoints + t / params.interval) * KD * vd;
            for (var c = 0u; c < chunk; c = c + 1u) {
                if (c < n) {
                    ckpt_buf[cbase + (i0 + c) * vd + col] = s[c];
                }
            }
        }
        stage_token(row, hk, hv, lid, WG, true);
        var p = 0.0;
        for (var c = 0u; c < chunk; c = c + 1u) {
            if (c < n) {
                s[c] = sh_a[i0 + c] * s[c];
                p = p + s[c] * sh_k[i0 + c];
            }
        }
        sh_pa[lid] = p;
        workgroupBarrier();
        var pt = 0.0;
        for (var part = 0u; part < FWD_PARTS; part = part + 1u) {
            pt = pt + sh_pa[part * FWD_COLS + j];
        }
        var v = 0.0;
        if (col_live) {
            v = load_v(v_index(row, hv, col));
        }
        let be = beta_in[row * params.value_heads + hv] * (v - pt);
        var o = 0.0;
        for (var c = 0u; c < chunk; c = c + 1u) {
            if (c < n) {
                s[c] = s[c] + sh_k[i0 + c] * be;
                o = o + s[c] * sh_q[i0 + c];
            }
        }
        sh_pk[lid] = o;
        workgroupBarrier();
        if (col_live && r == 0u) {
            var ot = 0.0;
            for (var part = 0u; part < FWD_PARTS; part = part + 1u) {
                ot = ot + sh_pk[part * FWD_COLS + j];
            }
            out_buf[(row * params.value_heads + hv) * vd + col] = params.scale * ot;
        }
    }
    if (col_live) {
        for (var c = 0u; c < chunk; c = c + 1u) {
            if (c < n) {
                final_buf[sbase + (i0 + c) * vd + col] = s[c];
            }
        }
    }
}

// All barriers of the backward: storage (state scratch, dS) and workgroup memory.
fn sync() {
    storageBarrier();
    workgroupBarrier();
}

// Partial sums of lanes sharing one column (phase A) or one row (phase B), combined in lane
// order.
var<workgroup> sh_pa: array<f32, WG>;
var<workgroup> sh_pk: array<f32, WG>;
var<workgroup> sh_b1: array<f32, WG>;
var<workgroup> sh_b2: array<f32, WG>;
var<workgroup> sh_b3: array<f32, WG>;
var<workgroup> sh_db: array<f32, WG>;
const SUM_LANES: u32 = 16u;
var<workgroup> sh_db2: array<f32, SUM_LANES>;
var<workgroup> sh_dg2: array<f32, SUM_LANES>;

// Lanes of the column work (phase A and the recomputation): lane = (column ja, part), the part
// taking key rows [ia0, ia1).
struct LanesA {
    ja: u32,
    on: bool,
    i0: u32,
    i1: u32,
    parts: u32,
}

// One token of the recurrence from the scratch state at `src` to `dst` (may be `src`: each
// lane reads and writes only its own rows). Call from uniform control flow.
fn recompute_token(row: u32, hk: u32, hv: u32, lid: u32, src: u32, dst: u32, la: LanesA) {
    let vd = params.vdim;
    stage_token(row, hk, hv, lid, WG, false);
    if (la.on) {
        var p = 0.0;
        for (var i = la.i0; i < la.i1; i = i + 1u) {
            p = p + (sh_a[i] * states_buf[src + i * vd + la.ja]) * sh_k[i];
        }
        sh_pa[lid] = p;
    }
    workgroupBarrier();
    if (la.on) {
        var p = 0.0;
        for (var r = 0u; r < la.parts; r = r + 1u) {
            p = p + sh_pa[r * vd + la.ja];
        }
        let beta = beta_in[row * params.value_heads + hv];
        let be = beta * (load_v(v_index(row, hv, la.ja)) - p);
        for (var i = la.i0; i < la.i1; i = i + 1u) {
            let idx = i * vd + la.ja;
            states_buf[dst + idx] = sh_a[i] * states_buf[src + idx] + sh_k[i] * be;
        }
    }
}

// The backward. Two launch modes:
// * mode 0 (Hv = Hk, or waves): one workgroup per (b, key head) for value head
//   hk·group + sub, walking every segment; launches for sub = 0, 1, ... run in order, so dq and
//   dk add the value heads of a group in a fixed order.
// * mode 1 (Hv > Hk): one workgroup per (b, value head) for the one segment `seg`; dq and dk
//   go to per-value-head partials [B, C, Hv, K] that `sum_heads` then adds in head order.
// Segments are walked last to first. A segment's states are recomputed in two levels: first
// every sub_interval-th state from the checkpoint (scratch slots A), then, sub-segment by
// sub-segment from the last, each state of the sub-segment (slots B), whose tokens are then
// walked in reverse. Phase A (column work: error, dS += scale·q·dOᵀ, dv, dβ terms): lane =
// (column j, part r), part r taking a contiguous chunk of the key rows. Phase B (row work: dq,
// dk, dlog_decay, dS_prev = diag(a)·(dS + k·dpᵀ)): lane = (row i, part r), part r taking a
// chunk of the columns. Parts are summed in part order.
@compute @workgroup_size(WG)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let local = group_index(wid, nwg);
    if (local >= params.units) {
        return;
    }
    let unit = params.unit_base + local;
    let vd = params.vdim;
    let per_seg = params.mode == 1u;
    let hv = select((unit % params.key_heads) * params.group + params.sub,
                    unit % params.value_heads, per_seg);
    let b = select(unit / params.key_heads, unit / params.value_heads, per_seg);
    let hk = hv / params.group;
    let bh = b * params.value_heads + hv;
    let kv = KD * vd;
    let sbase = bh * kv;               // dS (ds_buf)
    let c2 = params.sub_interval;
    let abase = local * (params.subs + c2) * kv;  // slots A (sub-checkpoints)
    let bbase = abase + params.subs * kv;          // slots B (states of one sub-segment)
    let has_dout = (params.flags & 1u) != 0u;
    // Phase A lanes: column ja, part ra of parts_a, key rows [ia0, ia1).
    let parts_a = WG / vd;
    let ja = lid % vd;
    let ra = lid / vd;
    let on_a = ra < parts_a;
    let chunk_a = (KD + parts_a - 1u) / parts_a;
    let ia0 = min(ra * chunk_a, KD);
    let ia1 = min(ia0 + chunk_a, KD);
    let la = LanesA(ja, on_a, ia0, ia1, parts_a);
    // Phase B lanes: row ib, part rb of parts_b, columns [jb0, jb1).
    let parts_b = WG / KD;
    let ib = lid % KD;
    let rb = lid / KD;
    let on_b = rb < parts_b;
    let chunk_b = (vd + parts_b - 1u) / parts_b;
    let jb0 = min(rb * chunk_b, vd);
    let jb1 = min(jb0 + chunk_b, vd);
    let seg_hi = select(params.checkpoints, params.seg + 1u, per_seg);
    let seg_lo = select(0u, params.seg, per_seg);
    for (var seg = seg_hi; seg > seg_lo; seg = seg - 1u) {
        let first = (seg - 1u) * params.interval;
        let len = min(params.interval, params.time - first);
        let nsub = (len + c2 - 1u) / c2;
        // Level 1: sub-checkpoints (slot A u = state before token first + u·c2).
        if (on_a) {
            let cbase = (bh * params.checkpoints + seg - 1u) * kv;
            for (var i = ia0; i < ia1; i = i + 1u) {
                states_buf[abase + i * vd + ja] = ckpt_buf[cbase + i * vd + ja];
            }
        }
        for (var u = 1u; u < nsub; u = u + 1u) {
            let slot = abase + u * kv;
            if (on_a) {
                for (var i = ia0; i < ia1; i = i + 1u) {
                    states_buf[slot + i * vd + ja] = states_buf[slot - kv + i * vd + ja];
                }
            }
            for (var m = (u - 1u) * c2; m < u * c2; m = m + 1u) {
                recompute_token(b * params.time + first + m, hk, hv, lid, slot, slot, la);
            }
        }
        for (var u = nsub; u > 0u; u = u - 1u) {
            let s0 = first + (u - 1u) * c2;
            let sl = min(c2, first + len - s0);
            // Level 2: slot B m = state before token s0 + m.
            if (on_a) {
                let src = abase + (u - 1u) * kv;
                for (var i = ia0; i < ia1; i = i + 1u) {
                    states_buf[bbase + i * vd + ja] = states_buf[src + i * vd + ja];
                }
            }
            for (var m = 0u; m + 1u < sl; m = m + 1u) {
                recompute_token(b * params.time + s0 + m, hk, hv, lid, bbase + m * kv,
                                bbase + (m + 1u) * kv, la);
            }
            sync();
            // Walk the sub-segment's tokens in reverse.
            for (var m = sl; m > 0u; m = m - 1u) {
                let t = s0 + m - 1u;
                let row = b * params.time + t;
                let pbase = bbase + (m - 1u) * kv;  // S_prev
                stage_token(row, hk, hv, lid, WG, true);
                let beta = beta_in[row * params.value_heads + hv];
                let vrow = row * params.value_heads + hv;
                // Phase A.
                if (on_a) {
                    var p = 0.0;
                    for (var i = ia0; i < ia1; i = i + 1u) {
                        p = p + (sh_a[i] * states_buf[pbase + i * vd + ja]) * sh_k[i];
                    }
                    sh_pa[lid] = p;
                }
                workgroupBarrier();
                var e = 0.0;
                var dout = 0.0;
                if (on_a) {
                    var p = 0.0;
                    for (var r = 0u; r < parts_a; r = r + 1u) {
                        p = p + sh_pa[r * vd + ja];
                    }
                    e = load_v(v_index(row, hv, ja)) - p;
                    if (has_dout) {
                        dout = dout_in[vrow * vd + ja];
                    }
                    let sd = params.scale * dout;
                    var kds = 0.0;
                    for (var i = ia0; i < ia1; i = i + 1u) {
                        let idx = sbase + i * vd + ja;
                        let g = ds_buf[idx] + sh_q[i] * sd;
                        ds_buf[idx] = g;
                        kds = kds + g * sh_k[i];
                    }
                    sh_pk[lid] = kds;
                }
                workgroupBarrier();
                if (on_a && ra == 0u) {
                    var kds = 0.0;
                    for (var r = 0u; r < parts_a; r = r + 1u) {
                        kds = kds + sh_pk[r * vd + ja];
                    }
                    let de = beta * kds;
                    dv_buf[vrow * vd + ja] = de;
                    sh_e[ja] = e;
                    sh_dp[ja] = -de;
                    sh_do[ja] = dout;
                    sh_db[ja] = kds * e;
                }
                sync();
                // Phase B.
                if (on_b) {
                    let a = sh_a[ib];
                    let k = sh_k[ib];
                    var dq = 0.0;
                    var dk = 0.0;
                    var dg = 0.0;
                    for (var j = jb0; j < jb1; j = j + 1u) {
                        let dcy = a * states_buf[pbase + ib * vd + j];
                        let st = dcy + k * (beta * sh_e[j]);
                        dq = dq + st * sh_do[j];
                        let idx = sbase + ib * vd + j;
                        let g = ds_buf[idx];
                        dk = dk + (beta * g * sh_e[j] + dcy * sh_dp[j]);
                        let dd = g + k * sh_dp[j];
                        dg = dg + dd * dcy;
                        ds_buf[idx] = a * dd;
                    }
                    sh_b1[lid] = dq;
                    sh_b2[lid] = dk;
                    sh_b3[lid] = dg;
                }
                workgroupBarrier();
                if (on_b && rb == 0u) {
                    var dq = 0.0;
                    var dk = 0.0;
                    var dg_row = 0.0;
                    for (var r = 0u; r < parts_b; r = r + 1u) {
                        dq = dq + sh_b1[r * KD + ib];
                        dk = dk + sh_b2[r * KD + ib];
                        dg_row = dg_row + sh_b3[r * KD + ib];
                    }
                    dq = params.scale * dq;
                    if (per_seg) {
                        let pi = ((b * params.interval + t - first) * params.value_heads + hv) * KD + ib;
                        dq_buf[pi] = dq;
                        dk_buf[pi] = dk;
                    } else {
                        let qi = (row * params.key_heads + hk) * KD + ib;
                        if (params.sub == 0u) {
                            dq_buf[qi] = dq;
                            dk_buf[qi] = dk;
                        } else {
                            dq_buf[qi] = dq_buf[qi] + dq;
                            dk_buf[qi] = dk_buf[qi] + dk;
                        }
                    }
                    if (PER_CHANNEL == 1u) {
                        dg_buf[vrow * KD + ib] = dg_row;
                    }
                    sh_pa[ib] = dg_row;
                }
                workgroupBarrier();
                // dβ = Σ_j sh_db[j] and the scalar dlog_decay = Σ_i sh_pa[i]: 16 lanes sum
                // consecutive chunks, lane 0 sums the 16 chunk sums.
                if (lid < SUM_LANES) {
                    let cv = (vd + SUM_LANES - 1u) / SUM_LANES;
                    var x = 0.0;
                    for (var j = min(lid * cv, vd); j < min(lid * cv + cv, vd); j = j + 1u) {
                        x = x + sh_db[j];
                    }
                    sh_db2[lid] = x;
                    let ck = (KD + SUM_LANES - 1u) / SUM_LANES;
                    var y = 0.0;
                    for (var i = min(lid * ck, KD); i < min(lid * ck + ck, KD); i = i + 1u) {
                        y = y + sh_pa[i];
                    }
                    sh_dg2[lid] = y;
                }
                workgroupBarrier();
                if (lid == 0u) {
                    var x = 0.0;
                    var y = 0.0;
                    for (var l = 0u; l < SUM_LANES; l = l + 1u) {
                        x = x + sh_db2[l];
                        y = y + sh_dg2[l];
                    }
                    dbeta_buf[vrow] = x;
                    if (PER_CHANNEL == 0u) {
                        dg_buf[vrow] = y;
                    }
                }
                sync();
            }
        }
    }
}

// Mode 1's second step for segment `seg`: dq and dk of each (b, token of the segment, key head,
// row) = the partials of the group's value heads added in head order (the same order, and so
// the same bits, as mode 0's launches). `units` = B · len · Hk · K threads.
@compute @workgroup_size(WG)
fn sum_heads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let tid = group_index(wid, nwg) * WG + lid;
    if (tid >= params.units) {
        return;
    }
    let first = params.seg * params.interval;
    let len = min(params.interval, params.time - first);
    let i = tid % KD;
    let rest = tid / KD;
    let hk = rest % params.key_heads;
    let rest2 = rest / params.key_heads;
    let tl = rest2 % len;
    let b = rest2 / len;
    let base = ((b * params.interval + tl) * params.value_heads + hk * params.group) * KD + i;
    var q = pdq_in[base];
    var k = pdk_in[base];
    for (var r = 1u; r < params.group; r = r + 1u) {
        q = q + pdq_in[base + r * KD];
        k = k + pdk_in[base + r * KD];
    }
    let qi = ((b * params.time + first + tl) * params.key_heads + hk) * KD + i;
    dq_buf[qi] = q;
    dk_buf[qi] = k;
}

// ---- Chunked (WY) forward, scalar decay ----
// Chunks of CH tokens. Within a chunk, with γ the running sum of the log decay from its first
// token and S the state before it:
//   A_rs = β_r (k_r·k_s) e^{γ_r − γ_s} (s < r),  w = (I + A)⁻¹ diag(β e^γ) K,  u = (I + A)⁻¹ diag(β) V,
//   P_ts = (q_t·k_s) e^{γ_t − γ_s} (s ≤ t),
//   U = u − w S,  O = scale·(diag(e^γ) Q S + P U),  S ← e^{γ_last} S + (diag(e^{γ_last − γ}) K)ᵀ U,
// the recurrence unrolled over the chunk (U_r = β_r e_r). `chunk_prepare` forms w, u, P and γ of
// every chunk at once (a workgroup a chunk of a head; the solve by forward substitution, one
// lane a column); `chunk_states` walks the chunks in order, a workgroup a (head, slice of
// FWD_COLS value columns) with the state in registers as in `forward`. Workspace per head
// (heads `unit_base..` of the launch): w [chunks, CH, K], u [chunks, CH, V], P [chunks, CH, CH],
// γ [chunks, CH], F32. Every sum in a fixed order.
const CH: u32 = 64u;
const CH_TILE: u32 = 8u;                                 // key dims staged a step
var<workgroup> sh_ck: array<f32, 512>;                   // CH × CH_TILE keys
var<workgroup> sh_cq: array<f32, 512>;                   // CH × CH_TILE queries
var<workgroup> sh_ca: array<f32, 2016>;                  // A, strictly lower: row r at r(r − 1)/2
var<workgroup> sh_cg: array<f32, CH>;                    // γ
var<workgroup> sh_cb: array<f32, CH>;                    // β
var<workgroup> sh_cpart: array<f32, 2048>;               // 8 tokens × FWD_PARTS × FWD_COLS
var<workgroup> sh_cu: array<f32, 2048>;                  // U of the chunk: CH × FWD_COLS

fn chunk_head_base(hl: u32) -> u32 {
    return hl * params.chunks * CH * (KD + params.vdim + CH + 1u);
}

fn cw_at(base: u32, ch: u32, r: u32, i: u32) -> u32 {
    return base + (ch * CH + r) * KD + i;
}

fn cu_at(base: u32, ch: u32, r: u32, j: u32) -> u32 {
    return base + params.chunks * CH * KD + (ch * CH + r) * params.vdim + j;
}

fn cp_at(base: u32, ch: u32, t: u32, s: u32) -> u32 {
    return base + params.chunks * CH * (KD + params.vdim) + (ch * CH + t) * CH + s;
}

fn cg_at(base: u32, ch: u32, r: u32) -> u32 {
    return base + params.chunks * CH * (KD + params.vdim + CH) + ch * CH + r;
}

// Column `col` of w (`values` false: right side β e^γ k) or u (true: β v) of one chunk by
// forward substitution through the unit lower triangular I + A, rows in order.
fn chunk_solve(base: u32, ch: u32, len: u32, row0: u32, hk: u32, hv: u32, col: u32,
               values: bool) {
    var xs: array<f32, CH>;
    for (var r = 0u; r < CH; r = r + 1u) {
        var x = 0.0;
        if (r < len) {
            if (values) {
                x = sh_cb[r] * load_v(v_index(row0 + r, hv, col));
            } else {
                x = sh_cb[r] * exp(sh_cg[r]) * load_k(k_index(row0 + r, hk, col));
            }
            let ar = (r * r - r) / 2u;
            for (var s = 0u; s < r; s = s + 1u) {
                x = x - sh_ca[ar + s] * xs[s];
            }
        }
        xs[r] = x;
        if (values) {
            ws_buf[cu_at(base, ch, r, col)] = x;
        } else {
            ws_buf[cw_at(base, ch, r, col)] = x;
        }
    }
}

// One workgroup per (head of the launch, chunk).
@compute @workgroup_size(WG)
fn chunk_prepare(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let unit = group_index(wid, nwg);
    if (unit >= params.units) {
        return;
    }
    let hl = unit / params.chunks;
    let ch = unit % params.chunks;
    let bh = params.unit_base + hl;
    let hv = bh % params.value_heads;
    let b = bh / params.value_heads;
    let hk = hv / params.group;
    let t0 = ch * CH;
    let len = min(CH, params.time - t0);
    let row0 = b * params.time + t0;
    let base = chunk_head_base(hl);
    if (lid == 0u) {
        var g = 0.0;
        for (var r = 0u; r < CH; r = r + 1u) {
            var be = 0.0;
            if (r < len) {
                let at = (row0 + r) * params.value_heads + hv;
                g = g + gate_in[at];
                be = beta_in[at];
            }
            sh_cg[r] = g;
            sh_cb[r] = be;
            ws_buf[cg_at(base, ch, r)] = g;
        }
    }
    // k_r·k_s and q_t·k_s by 4 × 4 blocks a lane, the key dims in ascending order.
    let r0 = (lid / 16u) * 4u;
    let s0 = (lid % 16u) * 4u;
    var acc_a: array<f32, 16>;
    var acc_p: array<f32, 16>;
    for (var e = 0u; e < 16u; e = e + 1u) {
        acc_a[e] = 0.0;
        acc_p[e] = 0.0;
    }
    for (var i0 = 0u; i0 < KD; i0 = i0 + CH_TILE) {
        workgroupBarrier();
        for (var e = lid; e < CH * CH_TILE; e = e + WG) {
            let r = e / CH_TILE;
            let i = i0 + e % CH_TILE;
            var kv = 0.0;
            var qv = 0.0;
            if (r < len && i < KD) {
                kv = load_k(k_index(row0 + r, hk, i));
                qv = load_q(q_index(row0 + r, hk, i));
            }
            sh_ck[e] = kv;
            sh_cq[e] = qv;
        }
        workgroupBarrier();
        for (var i = 0u; i < CH_TILE; i = i + 1u) {
            for (var a = 0u; a < 4u; a = a + 1u) {
                let kr = sh_ck[(r0 + a) * CH_TILE + i];
                let qr = sh_cq[(r0 + a) * CH_TILE + i];
                for (var c = 0u; c < 4u; c = c + 1u) {
                    let ks = sh_ck[(s0 + c) * CH_TILE + i];
                    acc_a[a * 4u + c] = acc_a[a * 4u + c] + kr * ks;
                    acc_p[a * 4u + c] = acc_p[a * 4u + c] + qr * ks;
                }
            }
        }
    }
    for (var a = 0u; a < 4u; a = a + 1u) {
        for (var c = 0u; c < 4u; c = c + 1u) {
            let r = r0 + a;
            let s = s0 + c;
            var p = 0.0;
            if (r < len && s <= r) {
                let dec = exp(sh_cg[r] - sh_cg[s]);
                p = acc_p[a * 4u + c] * dec;
                if (s < r) {
                    sh_ca[(r * r - r) / 2u + s] = sh_cb[r] * acc_a[a * 4u + c] * dec;
                }
            }
            ws_buf[cp_at(base, ch, r, s)] = p;
        }
    }
    workgroupBarrier();
    if (lid < KD) {
        chunk_solve(base, ch, len, row0, hk, hv, lid, false);
    }
    if (lid < params.vdim) {
        chunk_solve(base, ch, len, row0, hk, hv, lid, true);
    }
}

// One workgroup per (head of the launch, slice of FWD_COLS value columns), chunks in order.
// Lane (column j, part) keeps rows [part·chunk, ..) of state column j, as in `forward`;
// checkpoints at chunk starts that are multiples of the interval (a multiple of CH, or T).
@compute @workgroup_size(WG)
fn chunk_states(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let unit = group_index(wid, nwg);
    if (unit >= params.units) {
        return;
    }
    let vd = params.vdim;
    let hl = unit / params.slices;
    let bh = params.unit_base + hl;
    let j = lid % FWD_COLS;
    let part = lid / FWD_COLS;
    let col = (unit % params.slices) * FWD_COLS + j;
    let hv = bh % params.value_heads;
    let b = bh / params.value_heads;
    let hk = hv / params.group;
    let col_live = col < vd;
    let chunk = (KD + FWD_PARTS - 1u) / FWD_PARTS;
    let i0 = min(part * chunk, KD);
    let n = min(i0 + chunk, KD) - i0;
    let sbase = bh * KD * vd;
    let base = chunk_head_base(hl);
    var s: array<f32, FWD_CHUNK>;
    for (var c = 0u; c < chunk; c = c + 1u) {
        if (c < n) {
            var x = 0.0;
            if (col_live && (params.flags & 1u) != 0u) {
                x = init_in[sbase + (i0 + c) * vd + col];
            }
            s[c] = x;
        }
    }
    for (var ch = 0u; ch < params.chunks; ch = ch + 1u) {
        let t0 = ch * CH;
        let len = min(CH, params.time - t0);
        let row0 = b * params.time + t0;
        if (col_live && t0 % params.interval == 0u) {
            let cbase = (bh * params.checkpoints + t0 / params.interval) * KD * vd;
            for (var c = 0u; c < chunk; c = c + 1u) {
                if (c < n) {
                    ckpt_buf[cbase + (i0 + c) * vd + col] = s[c];
                }
            }
        }
        // U = u − w S, eight tokens a round: partial dots over each lane's rows, then the
        // parts in order by lane (token tg + part, column j).
        for (var tg = 0u; tg < len; tg = tg + 8u) {
            for (var a = 0u; a < 8u; a = a + 1u) {
                var p = 0.0;
                if (tg + a < len) {
                    for (var c = 0u; c < chunk; c = c + 1u) {
                        if (c < n) {
                            p = p + ws_buf[cw_at(base, ch, tg + a, i0 + c)] * s[c];
                        }
                    }
                }
                sh_cpart[(a * FWD_PARTS + part) * FWD_COLS + j] = p;
            }
            workgroupBarrier();
            let t = tg + part;
            if (t < len) {
                var pt = 0.0;
                for (var pp = 0u; pp < FWD_PARTS; pp = pp + 1u) {
                    pt = pt + sh_cpart[(part * FWD_PARTS + pp) * FWD_COLS + j];
                }
                var uu = 0.0;
                if (col_live) {
                    uu = ws_buf[cu_at(base, ch, t, col)];
                }
                sh_cu[t * FWD_COLS + j] = uu - pt;
            }
            workgroupBarrier();
        }
        // O = scale·(e^γ q·S + Σ_{s ≤ t} P_ts U_s), the same rounds for q·S.
        for (var tg = 0u; tg < len; tg = tg + 8u) {
            for (var a = 0u; a < 8u; a = a + 1u) {
                var p = 0.0;
                if (tg + a < len) {
                    for (var c = 0u; c < chunk; c = c + 1u) {
                        if (c < n) {
                            p = p + load_q(q_index(row0 + tg + a, hk, i0 + c)) * s[c];
                        }
                    }
                }
                sh_cpart[(a * FWD_PARTS + part) * FWD_COLS + j] = p;
            }
            workgroupBarrier();
            let t = tg + part;
            if (t < len && col_live) {
                var qs = 0.0;
                for (var pp = 0u; pp < FWD_PARTS; pp = pp + 1u) {
                    qs = qs + sh_cpart[(part * FWD_PARTS + pp) * FWD_COLS + j];
                }
                var pu = 0.0;
                for (var s2 = 0u; s2 <= t; s2 = s2 + 1u) {
                    pu = pu + ws_buf[cp_at(base, ch, t, s2)] * sh_cu[s2 * FWD_COLS + j];
                }
                let g = ws_buf[cg_at(base, ch, t)];
                out_buf[((row0 + t) * params.value_heads + hv) * vd + col] =
                    params.scale * (exp(g) * qs + pu);
            }
            workgroupBarrier();
        }
        // S ← e^{γ_last} S + Σ_s e^{γ_last − γ_s} k_s U_s, tokens in order.
        let glast = ws_buf[cg_at(base, ch, len - 1u)];
        let dl = exp(glast);
        for (var c = 0u; c < chunk; c = c + 1u) {
            if (c < n) {
                s[c] = dl * s[c];
            }
        }
        for (var s2 = 0u; s2 < len; s2 = s2 + 1u) {
            let eu = exp(glast - ws_buf[cg_at(base, ch, s2)]) * sh_cu[s2 * FWD_COLS + j];
            for (var c = 0u; c < chunk; c = c + 1u) {
                if (c < n) {
                    s[c] = s[c] + load_k(k_index(row0 + s2, hk, i0 + c)) * eu;
                }
            }
        }
        workgroupBarrier();
    }
    if (col_live) {
        for (var c = 0u; c < chunk; c = c + 1u) {
            if (c < n) {
                final_buf[sbase + (i0 + c) * vd + col] = s[c];
            }
        }
    }
}
