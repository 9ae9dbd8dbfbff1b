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
@group(0) @binding(21) var<storage, read_write> bws_buf: array<f32>;
@group(0) @binding(22) var<storage, read_write> sc_buf: array<f32>;
@group(0) @binding(23) var<storage, read_write> cpq_buf: array<f32>;
@group(0) @binding(24) var<storage, read_write> cpk_buf: array<f32>;

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
// CS_COLS value columns) with the state in registers. Workspace per head
// (heads `unit_base..` of the launch): w [chunks, CH, K], u [chunks, CH, V], P [chunks, CH, CH],
// γ [chunks, CH], F32. Every sum in a fixed order.
const CH: u32 = 64u;
const CH_TILE: u32 = 8u;                                 // key dims staged a step
const CS_SOLVE: u32 = 8u;                                // rows a block of the substitutions
var<workgroup> sh_ck: array<f32, 512>;                   // CH_TILE × CH keys (key dim major); B tiles
var<workgroup> sh_cq: array<f32, 512>;                   // CH_TILE × CH queries; A tiles
var<workgroup> sh_ca: array<f32, 2016>;                  // A, strictly lower: row r at r(r − 1)/2
var<workgroup> sh_cg: array<f32, CH>;                    // γ
var<workgroup> sh_cb: array<f32, CH>;                    // β

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
    // The right side first (its loads independent of one another), then the substitution.
    var xs: array<f32, CH>;
    for (var r = 0u; r < CH; r = r + 1u) {
        var x = 0.0;
        if (r < len) {
            if (values) {
                x = sh_cb[r] * load_v(v_index(row0 + r, hv, col));
            } else {
                x = sh_cb[r] * exp(sh_cg[r]) * load_k(k_index(row0 + r, hk, col));
            }
        }
        xs[r] = x;
    }
    // Rows in blocks of CS_SOLVE: each earlier value read once for the block's rows, whose sums
    // stay in registers (every row's terms still in ascending order: the row-by-row bits).
    for (var b = 0u; b < CH; b = b + CS_SOLVE) {
        var x: array<f32, CS_SOLVE>;
        for (var k = 0u; k < CS_SOLVE; k = k + 1u) {
            x[k] = xs[b + k];
        }
        for (var s = 0u; s < b; s = s + 1u) {
            let v = xs[s];
            for (var k = 0u; k < CS_SOLVE; k = k + 1u) {
                let r = b + k;
                x[k] = x[k] - sh_ca[(r * r - r) / 2u + s] * v;
            }
        }
        for (var k = 0u; k < CS_SOLVE; k = k + 1u) {
            let r = b + k;
            for (var s2 = 0u; s2 < CS_SOLVE; s2 = s2 + 1u) {
                if (s2 < k) {
                    x[k] = x[k] - sh_ca[(r * r - r) / 2u + b + s2] * x[s2];
                }
            }
            if (r >= len) {
                x[k] = 0.0; // past the chunk: A's row is not written; the right side is zero
            }
            xs[r] = x[k];
            if (values) {
                ws_buf[cu_at(base, ch, r, col)] = x[k];
            } else {
                ws_buf[cw_at(base, ch, r, col)] = x[k];
            }
        }
    }
}

// Lane `lid`'s 4 × 4 block of a chunk's key products: rows r0 = 4·(lid / 16).., columns
// s0 = 4·(lid % 16).., `kk` = k_r·k_s and (with `with_q`) `qk` = q_r·k_s, the key dims staged
// CH_TILE at a time (stored key dim major, so the 16 lanes of a row block read 16 different
// rows from different banks) and summed in ascending order, the next step's elements fetched
// while the current one is summed; rows at or past `len` give zeros. Barriers: call from
// uniform control flow.
struct KeyBlocks {
    r0: u32,
    s0: u32,
    kk: array<f32, 16>,
    qk: array<f32, 16>,
}

// Elements lid and lid + WG of the key step at i0 (rows e / CH_TILE, key dims i0 + e % CH_TILE):
// k's in .xy, q's in .zw.
fn chunk_key_fetch(row0: u32, len: u32, hk: u32, lid: u32, with_q: bool, i0: u32) -> vec4<f32> {
    var f = vec4<f32>();
    for (var m = 0u; m < 2u; m = m + 1u) {
        let e = lid + m * WG;
        let r = e / CH_TILE;
        let i = i0 + e % CH_TILE;
        if (e < CH * CH_TILE && r < len && i < KD) {
            f[m] = load_k(k_index(row0 + r, hk, i));
            if (with_q) {
                f[2u + m] = load_q(q_index(row0 + r, hk, i));
            }
        }
    }
    return f;
}

fn chunk_key_blocks(row0: u32, len: u32, hk: u32, lid: u32, with_q: bool) -> KeyBlocks {
    var kb: KeyBlocks;
    kb.r0 = (lid / 16u) * 4u;
    kb.s0 = (lid % 16u) * 4u;
    for (var e = 0u; e < 16u; e = e + 1u) {
        kb.kk[e] = 0.0;
        kb.qk[e] = 0.0;
    }
    var f = chunk_key_fetch(row0, len, hk, lid, with_q, 0u);
    for (var i0 = 0u; i0 < KD; i0 = i0 + CH_TILE) {
        workgroupBarrier();
        for (var m = 0u; m < 2u; m = m + 1u) {
            let e = lid + m * WG;
            if (e < CH * CH_TILE) {
                let at = (e % CH_TILE) * CH + e / CH_TILE;
                sh_ck[at] = f[m];
                sh_cq[at] = f[2u + m];
            }
        }
        workgroupBarrier();
        if (i0 + CH_TILE < KD) {
            f = chunk_key_fetch(row0, len, hk, lid, with_q, i0 + CH_TILE);
        }
        for (var i = 0u; i < CH_TILE; i = i + 1u) {
            for (var a = 0u; a < 4u; a = a + 1u) {
                let kr = sh_ck[i * CH + kb.r0 + a];
                let qr = sh_cq[i * CH + kb.r0 + a];
                for (var c = 0u; c < 4u; c = c + 1u) {
                    let ks = sh_ck[i * CH + kb.s0 + c];
                    kb.kk[a * 4u + c] = kb.kk[a * 4u + c] + kr * ks;
                    kb.qk[a * 4u + c] = kb.qk[a * 4u + c] + qr * ks;
                }
            }
        }
    }
    return kb;
}

// One workgroup per (head of the launch, chunk).
@compute @workgroup_size(WG)
fn chunk_prepare(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let unit = group_index(wid, nwg);
    if (unit >= params.units) {
        return;
    }
    let ch = unit % params.chunks;
    let cr = chunk_refs(unit / params.chunks, ch);
    let hv = cr.hv;
    let hk = cr.hk;
    let len = cr.len;
    let row0 = cr.row0;
    let base = cr.base;
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
    let kb = chunk_key_blocks(row0, len, hk, lid, true);
    for (var a = 0u; a < 4u; a = a + 1u) {
        for (var c = 0u; c < 4u; c = c + 1u) {
            let r = kb.r0 + a;
            let s = kb.s0 + c;
            var p = 0.0;
            if (r < len && s <= r) {
                let dec = exp(sh_cg[r] - sh_cg[s]);
                p = kb.qk[a * 4u + c] * dec;
                if (s < r) {
                    sh_ca[(r * r - r) / 2u + s] = sh_cb[r] * kb.kk[a * 4u + c] * dec;
                }
            }
            ws_buf[cp_at(base, ch, r, s)] = p;
        }
    }
    workgroupBarrier();
    // The two solves side by side where the lanes suffice, else one after the other.
    let vd = params.vdim;
    if (KD + vd <= WG) {
        if (lid < KD) {
            chunk_solve(base, ch, len, row0, hk, hv, lid, false);
        } else if (lid < KD + vd) {
            chunk_solve(base, ch, len, row0, hk, hv, lid - KD, true);
        }
    } else {
        if (lid < KD) {
            chunk_solve(base, ch, len, row0, hk, hv, lid, false);
        }
        if (lid < vd) {
            chunk_solve(base, ch, len, row0, hk, hv, lid, true);
        }
    }
}

const CS_COLS: u32 = 16u;                                 // value columns a workgroup
const CS_PARTS: u32 = 16u;                                // WG / CS_COLS
var<workgroup> sh_cu: array<f32, 1024>;                   // U (dU) of the chunk: CH × CS_COLS

// A chunk of the launch's head hl.
fn chunk_refs(hl: u32, ch: u32) -> ChunkRefs {
    let bh = params.unit_base + hl;
    let hv = bh % params.value_heads;
    let t0 = ch * CH;
    return ChunkRefs(0u, chunk_bws_base(hl), chunk_head_base(hl), ch,
                     (bh / params.value_heads) * params.time + t0, hv / params.group, hv,
                     min(CH, params.time - t0));
}

// ---- chunk_states / chunk_dstate: rounds of CS_R tokens, the parts summed by a butterfly ----
// Lane (part p = lid % CS_PARTS, column j = lid / CS_PARTS) of a workgroup's CS_COLS value
// columns keeps the state (state gradient) rows of column j in groups of four, groups p,
// p + CS_PARTS, ... (rows 4g..4g + 3 of group g), in registers. Tokens go CS_R a round: their
// rows staged in workgroup memory as 16-byte groups (fetched into registers a round ahead,
// `cs_fetch`, across phases and chunks; stored by `cs_put`), each lane's partial dots over its
// groups for every token of the round, then each token's CS_PARTS partials summed as one
// pairwise tree over the parts in order (`cs_reduce`): the first levels by shuffles within runs
// of CS_SG lanes (each level halves the tokens a lane holds), the rest through workgroup
// memory. Every CS_SG gives the same tree, so the same bits, with or without subgroups. Staged
// rows are K rounded up to groups of four (zeros past K).
override CS_SG: u32 = 1u;        // parts summed by shuffles: min(subgroup width, 16), 1 without
override CS_R: u32 = 4u;         // tokens a round: 8, or 4 (host: by the staged groups)
override CS_STAGE: u32 = 256u;   // staged groups: the larger of a round's (`cs_groups`) and the parts' (CS_R·(CS_PARTS / CS_SG)·CS_COLS / 4)
override CS_LOADS: u32 = 1u;     // staged groups a lane fetches: ⌈a round's groups / WG⌉
const CS_RMAX: u32 = 8u;         // the most CS_R
const CS_FMAX: u32 = 3u;         // the most CS_LOADS (a round's groups ≤ 768)
const CS_GROUPS: u32 = 4u;       // the most row groups a lane keeps: MAXD / 4 / CS_PARTS
var<workgroup> sh_cs: array<vec4<f32>, CS_STAGE>;  // a round's groups (`cs_groups`), or the parts

const CS_W: u32 = 0u;   // w rows; the owner's u
const CS_Q: u32 = 1u;   // e^γ q rows, then P rows
const CS_K: u32 = 2u;   // e^{γ_last − γ} k rows
const CS_KD: u32 = 3u;  // `chunk_dstate`: e^{γ_last − γ} k rows; the owner's scale·PᵀdO term
const CS_QW: u32 = 4u;  // `chunk_dstate`: scale·e^γ q rows, then w rows, then dO [CS_R, CS_COLS]

// Groups of four in a staged row.
fn cs_kq() -> u32 {
    return (KD + 3u) / 4u;
}

struct CsStage {
    x: array<vec4<f32>, CS_FMAX>,  // staged groups lid + m·WG (zeros past the chunk or K)
    g: array<f32, CS_FMAX>,        // γ of each q or k group's token
    u: f32,                        // u (CS_W) or dU's P term (CS_KD) of the lane's token and column
}

// First token of the round a lane holds after the shuffle levels (each level's upper lane keeps
// the upper half).
fn cs_held_base(p: u32) -> u32 {
    var t = 0u;
    for (var d = 1u; d < CS_SG; d = d * 2u) {
        if (CS_R / d > 1u && (p & d) != 0u) {
            t = t + CS_R / (2u * d);
        }
    }
    return t;
}

// The token of the round whose total part p's lane ends with (valid where p < CS_R).
fn cs_token(p: u32) -> u32 {
    if (CS_SG < CS_PARTS) {
        return p;
    }
    return cs_held_base(p);
}

// Staged groups of a round: its rows, and P's rows (CS_Q) or w's rows and dO (CS_QW).
fn cs_groups(which: u32) -> u32 {
    let rows = CS_R * cs_kq();
    if (which == CS_Q) {
        return rows + CS_R * (CH / 4u);
    }
    if (which == CS_QW) {
        return 2u * rows + CS_R * (CS_COLS / 4u);
    }
    return rows;
}

fn cs_fetch(which: u32, cr: ChunkRefs, rg: u32, lid: u32, p: u32, col: u32, live: bool) -> CsStage {
    var st: CsStage;
    let kq = cs_kq();
    let rows = CS_R * kq;
    let has_dout = (params.flags & 1u) != 0u;
    for (var m = 0u; m < CS_FMAX; m = m + 1u) {
        var x = vec4<f32>();
        var g = 0.0;
        let e = lid + m * WG;
        if (m < CS_LOADS && e < cs_groups(which)) {
            if (e < rows || (which == CS_QW && e < 2u * rows)) {
                // A row group: q, k or w of token t, rows i0.., zeros past K.
                let w_row = which == CS_W || e >= rows;
                let er = e % rows;
                let t = rg + er / kq;
                let i0 = (er % kq) * 4u;
                if (t < cr.len) {
                    if (!w_row) {
                        g = ws_buf[cg_at(cr.base, cr.ch, t)];
                    }
                    for (var c = 0u; c < 4u; c = c + 1u) {
                        let i = i0 + c;
                        if (i < KD) {
                            if (w_row) {
                                x[c] = ws_buf[cw_at(cr.base, cr.ch, t, i)];
                            } else if (which == CS_Q || which == CS_QW) {
                                x[c] = load_q(q_index(cr.row0 + t, cr.hk, i));
                            } else {
                                x[c] = load_k(k_index(cr.row0 + t, cr.hk, i));
                            }
                        }
                    }
                }
            } else if (which == CS_Q) {
                let e2 = e - rows;
                let t = rg + e2 / (CH / 4u);
                if (t < cr.len) {
                    let at = cp_at(cr.base, cr.ch, t, (e2 % (CH / 4u)) * 4u);
                    x = vec4<f32>(ws_buf[at], ws_buf[at + 1u], ws_buf[at + 2u], ws_buf[at + 3u]);
                }
            }
        }
        st.x[m] = x;
        st.g[m] = g;
    }
    st.u = 0.0;
    let t = rg + cs_token(p);
    if (live && p < CS_R && t < cr.len) {
        if (which == CS_W) {
            st.u = ws_buf[cu_at(cr.base, cr.ch, t, col)];
        } else if (which == CS_KD && has_dout) {
            st.u = bws_buf[cdu_at(cr.hb, cr.ch, t, col)];
        }
    }
    return st;
}

// The fetched groups into sh_cs, q rows times e^γ (CS_QW: scale·e^γ) and k rows times
// e^{γ_last − γ} (rows of tokens past the chunk are never read); barriers before and after
// (uniform control flow).
fn cs_put(which: u32, st: CsStage, lid: u32, glast: f32) {
    workgroupBarrier();
    let rows = CS_R * cs_kq();
    for (var m = 0u; m < CS_FMAX; m = m + 1u) {
        let e = lid + m * WG;
        if (m < CS_LOADS && e < cs_groups(which)) {
            var x = st.x[m];
            if (e < rows && which == CS_Q) {
                x = exp(st.g[m]) * x;
            } else if (e < rows && which == CS_QW) {
                x = (params.scale * exp(st.g[m])) * x;
            } else if (e < rows && (which == CS_K || which == CS_KD)) {
                x = exp(glast - st.g[m]) * x;
            }
            sh_cs[e] = x;
        }
    }
    workgroupBarrier();
}

// The lane's partial dots of the round's staged rows with its state rows; with `out`, plus the
// P·U terms of the lane's U rows `u4` (tokens 4p.., none after the output's token).
fn cs_partials(pa: ptr<function, array<f32, CS_RMAX>>, s: ptr<function, array<vec4<f32>, CS_GROUPS>>,
               rg: u32, len: u32, p: u32, out: bool, u4: vec4<f32>) {
    let kq = cs_kq();
    for (var a = 0u; a < CS_RMAX; a = a + 1u) {
        var x = 0.0;
        if (a < CS_R && rg + a < len) {
            for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
                let g = p + c * CS_PARTS;
                if (g < kq) {
                    x = x + dot(sh_cs[a * kq + g], (*s)[c]);
                }
            }
            if (out) {
                let s2 = vec4<u32>(4u * p) + vec4<u32>(0u, 1u, 2u, 3u);
                let pu = select(vec4<f32>(), sh_cs[CS_R * kq + a * (CH / 4u) + p] * u4,
                                s2 <= vec4<u32>(rg + a));
                x = x + ((pu.x + pu.y) + (pu.z + pu.w));
            }
        }
        (*pa)[a] = x;
    }
}

// One shuffle level of `cs_reduce`: partner lane p ^ d; `held` tokens a lane holds before it.
fn cs_level(pa: ptr<function, array<f32, CS_RMAX>>, p: u32, d: u32, held: u32) {
    if (d >= CS_SG) {
        return;
    }
    let upper = (p & d) != 0u;
    if (held > 1u) {
        let half = held / 2u;
        for (var a = 0u; a < CS_RMAX / 2u; a = a + 1u) {
            if (a < half) {
                let lo = (*pa)[a];
                let hi = (*pa)[a + half];
                let got = lane_xor(select(hi, lo, upper), d);
                (*pa)[a] = select(lo, hi, upper) + got;
            }
        }
    } else {
        (*pa)[0] = (*pa)[0] + lane_xor((*pa)[0], d);
    }
}

// One level of the groups' tree in `cs_reduce` (groups g and g + w).
fn cs_group_level(v: ptr<function, array<f32, CS_PARTS>>, w: u32, groups: u32) {
    for (var h = 0u; h < CS_PARTS / 2u; h = h + 1u) {
        let g = h * 2u * w;
        if (g + w < groups) {
            (*v)[g] = (*v)[g] + (*v)[g + w];
        }
    }
}

// Each token's partials summed over the parts of its column: the lane's total is token
// `cs_token(p)`'s (where p < CS_R). Barriers where CS_SG < CS_PARTS: uniform control flow.
fn cs_reduce(pa: ptr<function, array<f32, CS_RMAX>>, p: u32, j: u32) -> f32 {
    cs_level(pa, p, 1u, CS_R);
    cs_level(pa, p, 2u, max(CS_R / 2u, 1u));
    cs_level(pa, p, 4u, max(CS_R / 4u, 1u));
    cs_level(pa, p, 8u, max(CS_R / 8u, 1u));
    let groups = CS_PARTS / CS_SG;
    if (groups == 1u) {
        return (*pa)[0];
    }
    // The other levels through sh_cs (floats [token][group][column], after the staged rows'
    // readers): the lane's tokens (lanes holding the same token write the same bits), then the
    // owner of token p sums its groups.
    let held = max(CS_R / CS_SG, 1u);
    let first = cs_held_base(p);
    let g = p / CS_SG;
    workgroupBarrier();
    for (var a = 0u; a < CS_RMAX; a = a + 1u) {
        if (a < held) {
            let f = ((first + a) * groups + g) * CS_COLS + j;
            sh_cs[f / 4u][f % 4u] = (*pa)[a];
        }
    }
    workgroupBarrier();
    var v: array<f32, CS_PARTS>;
    for (var h = 0u; h < CS_PARTS; h = h + 1u) {
        var x = 0.0;
        if (h < groups && p < CS_R) {
            let f = (p * groups + h) * CS_COLS + j;
            x = sh_cs[f / 4u][f % 4u];
        }
        v[h] = x;
    }
    cs_group_level(&v, 1u, groups);
    cs_group_level(&v, 2u, groups);
    cs_group_level(&v, 4u, groups);
    cs_group_level(&v, 8u, groups);
    return v[0];
}

// S ← S + Σ_a k̃_a U_a over the round's staged rows (tokens in order).
fn cs_update(s: ptr<function, array<vec4<f32>, CS_GROUPS>>, rg: u32, len: u32, p: u32, j: u32) {
    let kq = cs_kq();
    for (var a = 0u; a < CS_RMAX; a = a + 1u) {
        if (a < CS_R && rg + a < len) {
            let u = sh_cu[(rg + a) * CS_COLS + j];
            for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
                let g = p + c * CS_PARTS;
                if (g < kq) {
                    (*s)[c] = (*s)[c] + sh_cs[a * kq + g] * u;
                }
            }
        }
    }
}

// A lane's state rows times f.
fn cs_scale(s: ptr<function, array<vec4<f32>, CS_GROUPS>>, f: f32) {
    for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
        (*s)[c] = f * (*s)[c];
    }
}

// State row i of a lane's groups: group c, component r.
fn cs_row(p: u32, c: u32, r: u32) -> u32 {
    return 4u * (p + c * CS_PARTS) + r;
}

// One workgroup per (head of the launch, slice of CS_COLS value columns), chunks in order;
// checkpoints at chunk starts that are multiples of the interval (the forward's interval is T:
// the initial state alone). `mode` 1 (the backward's recomputation): the initial state is the
// saved checkpoint, every chunk's first state and U go to the backward workspace, no output.
// Per chunk: U = u − w S; O = scale·Σ_parts ((e^γ q)·S + P·U); then
// S ← e^{γ_last} S + Σ_s (e^{γ_last − γ_s} k_s) U_s, tokens in order.
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
    let p = lid % CS_PARTS;
    let j = lid / CS_PARTS;
    let col = (unit % params.slices) * CS_COLS + j;
    let hv = bh % params.value_heads;
    let live = col < vd;
    let owner = p < CS_R;
    let tok = cs_token(p);
    let sbase = bh * KD * vd;
    let mode = params.mode;
    var s: array<vec4<f32>, CS_GROUPS>;
    for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let i = cs_row(p, c, r);
            if (i < KD && live && (params.flags & 1u) != 0u) {
                s[c][r] = init_in[sbase + i * vd + col];
            }
        }
    }
    var pa: array<f32, CS_RMAX>;
    var u4 = vec4<f32>();
    var st = cs_fetch(CS_W, chunk_refs(hl, 0u), 0u, lid, p, col, live);
    for (var ch = 0u; ch < params.chunks; ch = ch + 1u) {
        let cr = chunk_refs(hl, ch);
        let len = cr.len;
        let t0 = ch * CH;
        let glast = ws_buf[cg_at(cr.base, ch, len - 1u)];
        if (live && (mode == 1u || t0 % params.interval == 0u)) {
            let cbase = (bh * params.checkpoints + t0 / params.interval) * KD * vd;
            for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
                for (var r = 0u; r < 4u; r = r + 1u) {
                    let i = cs_row(p, c, r);
                    if (i < KD) {
                        if (mode == 1u) {
                            bws_buf[chs_at(cr.hb, ch, i, col)] = s[c][r];
                        } else {
                            ckpt_buf[cbase + i * vd + col] = s[c][r];
                        }
                    }
                }
            }
        }
        // U = u − w S.
        for (var rg = 0u; rg < len; rg = rg + CS_R) {
            cs_put(CS_W, st, lid, glast);
            let uu = st.u;
            if (rg + CS_R < len) {
                st = cs_fetch(CS_W, cr, rg + CS_R, lid, p, col, live);
            } else if (mode == 0u) {
                st = cs_fetch(CS_Q, cr, 0u, lid, p, col, live);
            } else {
                st = cs_fetch(CS_K, cr, 0u, lid, p, col, live);
            }
            cs_partials(&pa, &s, rg, len, p, false, u4);
            let dot = cs_reduce(&pa, p, j);
            let t = rg + tok;
            if (owner && t < len) {
                let x = uu - dot;
                sh_cu[t * CS_COLS + j] = x;
                if (live && mode == 1u) {
                    bws_buf[cuu_at(cr.hb, ch, t, col)] = x;
                }
            }
        }
        if (mode == 0u) {
            // O = scale·Σ_parts ((e^γ q)·S + P·U).
            for (var rg = 0u; rg < len; rg = rg + CS_R) {
                cs_put(CS_Q, st, lid, glast);
                if (rg == 0u) {
                    for (var m = 0u; m < 4u; m = m + 1u) {
                        let s2 = 4u * p + m;
                        u4[m] = select(0.0, sh_cu[s2 * CS_COLS + j], s2 < len);
                    }
                }
                if (rg + CS_R < len) {
                    st = cs_fetch(CS_Q, cr, rg + CS_R, lid, p, col, live);
                } else {
                    st = cs_fetch(CS_K, cr, 0u, lid, p, col, live);
                }
                cs_partials(&pa, &s, rg, len, p, true, u4);
                let o = cs_reduce(&pa, p, j);
                let t = rg + tok;
                if (owner && t < len && live) {
                    out_buf[((cr.row0 + t) * params.value_heads + hv) * vd + col] = params.scale * o;
                }
            }
        }
        // S ← e^{γ_last} S + Σ_s (e^{γ_last − γ_s} k_s) U_s.
        cs_scale(&s, exp(glast));
        for (var rg = 0u; rg < len; rg = rg + CS_R) {
            cs_put(CS_K, st, lid, glast);
            if (rg + CS_R < len) {
                st = cs_fetch(CS_K, cr, rg + CS_R, lid, p, col, live);
            } else if (ch + 1u < params.chunks) {
                st = cs_fetch(CS_W, chunk_refs(hl, ch + 1u), 0u, lid, p, col, live);
            }
            cs_update(&s, rg, len, p, j);
        }
    }
    if (live && mode == 0u) {
        for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
            for (var r = 0u; r < 4u; r = r + 1u) {
                let i = cs_row(p, c, r);
                if (i < KD) {
                    final_buf[sbase + i * vd + col] = s[c][r];
                }
            }
        }
    }
}

// ---- Chunked backward, scalar decay ----
// Per head of the launch, besides the forward's w, u, P and γ: U and dU [chunks, CH, V], the
// chunks' first states S and the gradients dS' of their last ones [chunks, K, V] (`bws_buf`).
// With dS' the gradient after a chunk (the next chunk's dS, or d_final):
//   dU = (diag(e^{γ_last − γ}) K) dS' + scale Pᵀ dO,  dS = e^{γ_last} dS' + scale (diag(e^γ) Q)ᵀ dO − wᵀ dU
// walked from the last chunk (`chunk_dstate`, the state gradient in registers); then every chunk
// at once (`chunk_grads`): dw = −dU Sᵀ, dQ̃ = scale dO Sᵀ, dK̃ = U dS'ᵀ, dP = scale dO Uᵀ,
// the transposed solves dW0 = (I + A)⁻ᵀ dw, dU0 = (I + A)⁻ᵀ dU, dA = −(dW0 wᵀ + dU0 uᵀ), and
// from them dq, dk (per value head, `chunk_sum_heads` adds each key head's in head order),
// dv, dβ and dγ, whose running sums from the chunk's end give dlog_decay.

fn chunk_bws_base(hl: u32) -> u32 {
    return hl * 2u * params.chunks * (CH + KD) * params.vdim;
}

fn cuu_at(hb: u32, ch: u32, t: u32, j: u32) -> u32 {
    return hb + (ch * CH + t) * params.vdim + j;
}

fn cdu_at(hb: u32, ch: u32, t: u32, j: u32) -> u32 {
    return hb + params.chunks * CH * params.vdim + (ch * CH + t) * params.vdim + j;
}

fn chs_at(hb: u32, ch: u32, i: u32, j: u32) -> u32 {
    return hb + 2u * params.chunks * CH * params.vdim + (ch * KD + i) * params.vdim + j;
}

fn cds_at(hb: u32, ch: u32, i: u32, j: u32) -> u32 {
    return hb + params.chunks * (2u * CH + KD) * params.vdim + (ch * KD + i) * params.vdim + j;
}

fn dout_at(row: u32, hv: u32, j: u32) -> f32 {
    return dout_in[(row * params.value_heads + hv) * params.vdim + j];
}

// scale·PᵀdO of every chunk at once (a workgroup a (head of the launch, chunk)): dU's term that
// does not depend on the state, into dU's place in the backward workspace, where
// `chunk_dstate` adds the state's term. Sums over the chunk's tokens in order.
@compute @workgroup_size(WG)
fn chunk_pdo(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let unit = group_index(wid, nwg);
    if (unit >= params.units) {
        return;
    }
    let vd = params.vdim;
    let cr = chunk_refs(unit / params.chunks, unit % params.chunks);
    let m0 = (lid / 16u) * 4u;
    let k16 = lid % 16u;
    for (var nb = 0u; nb < vd; nb = nb + 128u) {
        var x = chunk_acc_zero();
        chunk_product(&x, OP_PT, OP_DO, false, cr, cr.len, nb, 128u, vd - nb, lid);
        for (var a = 0u; a < 4u; a = a + 1u) {
            for (var c = 0u; c < 8u; c = c + 1u) {
                let t = m0 + a;
                let jj = nb + k16 + 16u * c;
                if (t < cr.len && jj < vd) {
                    bws_buf[cdu_at(cr.hb, cr.ch, t, jj)] = params.scale * x[a * GT_C + c];
                }
            }
        }
    }
}

// `cs_fetch` of a CS_QW round, with its dO groups (token t at the workgroup's columns c0..c0 + 3;
// zeros without an output cotangent). Only `chunk_dstate` reaches dO's binding.
fn cs_fetch_back(which: u32, cr: ChunkRefs, rg: u32, lid: u32, p: u32, col: u32, live: bool) -> CsStage {
    var st = cs_fetch(which, cr, rg, lid, p, col, live);
    if (which != CS_QW || (params.flags & 1u) == 0u) {
        return st;
    }
    let rows = CS_R * cs_kq();
    for (var m = 0u; m < CS_FMAX; m = m + 1u) {
        let e = lid + m * WG;
        if (m < CS_LOADS && e >= 2u * rows && e < cs_groups(CS_QW)) {
            let e3 = e - 2u * rows;
            let t = rg + e3 / (CS_COLS / 4u);
            let c0 = (col / CS_COLS) * CS_COLS + (e3 % (CS_COLS / 4u)) * 4u;
            if (t < cr.len) {
                for (var c = 0u; c < 4u; c = c + 1u) {
                    if (c0 + c < params.vdim) {
                        st.x[m][c] = dout_at(cr.row0 + t, cr.hv, c0 + c);
                    }
                }
            }
        }
    }
    return st;
}

// S ← S + Σ_a (q̃_a dO_a − w_a dU_a) over the round's staged rows (tokens in order; CS_QW).
fn cs_update_back(s: ptr<function, array<vec4<f32>, CS_GROUPS>>, rg: u32, len: u32, p: u32, j: u32) {
    let kq = cs_kq();
    let rows = CS_R * kq;
    for (var a = 0u; a < CS_RMAX; a = a + 1u) {
        if (a < CS_R && rg + a < len) {
            let d_out = sh_cs[2u * rows + a * (CS_COLS / 4u) + j / 4u][j % 4u];
            let du = sh_cu[(rg + a) * CS_COLS + j];
            for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
                let g = p + c * CS_PARTS;
                if (g < kq) {
                    (*s)[c] = (*s)[c] + sh_cs[a * kq + g] * d_out - sh_cs[rows + a * kq + g] * du;
                }
            }
        }
    }
}

// One workgroup per (head of the launch, slice of CS_COLS value columns), chunks last to
// first; lane (part p, column j) keeps its row groups of dS column j as `chunk_states` keeps S,
// and the rounds go as there. Starts from ds_buf (d_final or zeros) and leaves the initial
// state's gradient there. Per chunk: dU = (e^{γ_last − γ} k)·dS' + scale PᵀdO (the second term
// from `chunk_pdo`), then dS = e^{γ_last} dS' + Σ_t ((scale e^{γ_t} q_t) dO_t − w_t dU_t),
// tokens in order.
@compute @workgroup_size(WG)
fn chunk_dstate(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let unit = group_index(wid, nwg);
    if (unit >= params.units) {
        return;
    }
    let vd = params.vdim;
    let hl = unit / params.slices;
    let bh = params.unit_base + hl;
    let p = lid % CS_PARTS;
    let j = lid / CS_PARTS;
    let col = (unit % params.slices) * CS_COLS + j;
    let live = col < vd;
    let owner = p < CS_R;
    let tok = cs_token(p);
    let has_dout = (params.flags & 1u) != 0u;
    let sbase = bh * KD * vd;
    var s: array<vec4<f32>, CS_GROUPS>;
    for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let i = cs_row(p, c, r);
            if (i < KD && live) {
                s[c][r] = ds_buf[sbase + i * vd + col];
            }
        }
    }
    var pa: array<f32, CS_RMAX>;
    let last = params.chunks - 1u;
    var st = cs_fetch_back(CS_KD, chunk_refs(hl, last), 0u, lid, p, col, live);
    for (var cc = 0u; cc < params.chunks; cc = cc + 1u) {
        let ch = last - cc;
        let cr = chunk_refs(hl, ch);
        let len = cr.len;
        let glast = ws_buf[cg_at(cr.base, ch, len - 1u)];
        if (live) {
            for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
                for (var r = 0u; r < 4u; r = r + 1u) {
                    let i = cs_row(p, c, r);
                    if (i < KD) {
                        bws_buf[cds_at(cr.hb, ch, i, col)] = s[c][r];
                    }
                }
            }
        }
        // dU: the parts of (e^{γ_last − γ_t} k_t)·dS', plus the P term.
        for (var rg = 0u; rg < len; rg = rg + CS_R) {
            cs_put(CS_KD, st, lid, glast);
            let pre = st.u;
            if (rg + CS_R < len) {
                st = cs_fetch_back(CS_KD, cr, rg + CS_R, lid, p, col, live);
            } else {
                st = cs_fetch_back(CS_QW, cr, 0u, lid, p, col, live);
            }
            cs_partials(&pa, &s, rg, len, p, false, vec4<f32>());
            var du = cs_reduce(&pa, p, j);
            let t = rg + tok;
            if (owner && t < len) {
                if (has_dout && live) {
                    du = du + pre;
                }
                sh_cu[t * CS_COLS + j] = du;
                if (live) {
                    bws_buf[cdu_at(cr.hb, ch, t, col)] = du;
                }
            }
        }
        cs_scale(&s, exp(glast));
        for (var rg = 0u; rg < len; rg = rg + CS_R) {
            cs_put(CS_QW, st, lid, glast);
            if (rg + CS_R < len) {
                st = cs_fetch_back(CS_QW, cr, rg + CS_R, lid, p, col, live);
            } else if (ch > 0u) {
                st = cs_fetch_back(CS_KD, chunk_refs(hl, ch - 1u), 0u, lid, p, col, live);
            }
            cs_update_back(&s, rg, len, p, j);
        }
    }
    if (live) {
        for (var c = 0u; c < CS_GROUPS; c = c + 1u) {
            for (var r = 0u; r < 4u; r = r + 1u) {
                let i = cs_row(p, c, r);
                if (i < KD) {
                    ds_buf[sbase + i * vd + col] = s[c][r];
                }
            }
        }
    }
}

// Scratch of one `chunk_grads` workgroup: dw, dQ̃, dK̃, dW0 [CH, K]; dU0 [CH, V]; dP, Ak
// ((k_r·k_s) e^{γ_r − γ_s}), dA, E (e^{γ_r − γ_s}, s ≤ r) [CH, CH].
fn sc_len() -> u32 {
    return 4u * CH * KD + CH * params.vdim + 4u * CH * CH;
}

fn sc_kd(sb: u32, which: u32, t: u32, i: u32) -> u32 {
    return sb + which * CH * KD + t * KD + i;
}

fn sc_du0(sb: u32, t: u32, j: u32) -> u32 {
    return sb + 4u * CH * KD + t * params.vdim + j;
}

fn sc_cc(sb: u32, which: u32, r: u32, s: u32) -> u32 {
    return sb + 4u * CH * KD + CH * params.vdim + which * CH * CH + r * CH + s;
}

const SC_DW: u32 = 0u;
const SC_DQ: u32 = 1u;
const SC_DK: u32 = 2u;
const SC_DW0: u32 = 3u;
const SC_DP: u32 = 0u;
const SC_AK: u32 = 1u;
const SC_DA: u32 = 2u;
const SC_E: u32 = 3u;
var<workgroup> sh_rows: array<f32, 320>;                 // per-row dots [4][CH], then ⟨dS', S⟩
var<workgroup> sh_dgam: array<f32, CH>;

// Column `col` of dW0 (`values` false, from dw) or dU0 (true, from dU) by back substitution
// through (I + A)ᵀ, rows from the last.
fn chunk_back_solve(sb: u32, hb: u32, ch: u32, len: u32, col: u32, values: bool) {
    // The right side first (its loads independent of one another), then the substitution.
    var xs: array<f32, CH>;
    for (var r = 0u; r < CH; r = r + 1u) {
        var x = 0.0;
        if (r < len) {
            if (values) {
                x = bws_buf[cdu_at(hb, ch, r, col)];
            } else {
                x = sc_buf[sc_kd(sb, SC_DW, r, col)];
            }
        }
        xs[r] = x;
    }
    // Rows in blocks of CS_SOLVE from the last: each later value read once for the block's rows,
    // whose sums stay in registers; a row subtracts the later blocks' terms (ascending), then its
    // block's (ascending).
    for (var bb = 0u; bb < CH; bb = bb + CS_SOLVE) {
        let b = CH - CS_SOLVE - bb;
        var x: array<f32, CS_SOLVE>;
        for (var k = 0u; k < CS_SOLVE; k = k + 1u) {
            x[k] = xs[b + k];
        }
        for (var s = b + CS_SOLVE; s < len; s = s + 1u) {
            let v = xs[s];
            let at = (s * s - s) / 2u + b;
            for (var k = 0u; k < CS_SOLVE; k = k + 1u) {
                x[k] = x[k] - sh_ca[at + k] * v;
            }
        }
        for (var kk = 0u; kk < CS_SOLVE; kk = kk + 1u) {
            let k = CS_SOLVE - 1u - kk;
            let r = b + k;
            for (var s2 = 0u; s2 < CS_SOLVE; s2 = s2 + 1u) {
                let s = b + s2;
                if (s2 > k && s < len) {
                    x[k] = x[k] - sh_ca[(s * s - s) / 2u + r] * x[s2];
                }
            }
            if (r >= len) {
                x[k] = 0.0;
            }
            xs[r] = x[k];
            if (values) {
                sc_buf[sc_du0(sb, r, col)] = x[k];
            } else {
                sc_buf[sc_kd(sb, SC_DW0, r, col)] = x[k];
            }
        }
    }
}

// ---- The chunk products of `chunk_grads` ----
// A chunk's operands, row-major, rows of the chunk (tokens at or past len read as zeros) or of
// the key dim; staged GT_L steps of their inner index at a time into sh_cq (A: CH rows) and
// sh_ck (B: up to 128 rows), each lane keeping a 4 × GT_C block of the product in registers
// (rows 4·(lid / 16).., columns GT_C·(lid % 16).. of a 16·GT_C-column pass). Every sum in
// ascending order of the inner index.
const OP_DU: u32 = 0u;    // dU [CH, V]
const OP_DO: u32 = 1u;    // dO [CH, V]
const OP_U: u32 = 2u;     // U [CH, V]
const OP_S: u32 = 3u;     // S [K, V], the chunk's first state
const OP_DS: u32 = 4u;    // dS' [K, V]
const OP_DW0: u32 = 5u;   // dW0 [CH, K]
const OP_W: u32 = 6u;     // w [CH, K]
const OP_DU0: u32 = 7u;   // dU0 [CH, V]
const OP_UF: u32 = 8u;    // u [CH, V]
const OP_K: u32 = 9u;     // k [CH, K]
const OP_Q: u32 = 10u;    // q [CH, K]
const OP_MQ: u32 = 11u;   // dq's coefficients: (dP ⊙ E)_rs, s ≤ r [CH, CH]
const OP_MK: u32 = 12u;   // dk's key coefficients: dA_rs β_r E_rs (s < r), dA_sr β_s E_sr (s > r)
const OP_MKQ: u32 = 13u;  // dk's query coefficients: (dP ⊙ E)_sr, s ≥ r
const OP_PT: u32 = 14u;   // Pᵀ: P_sr, s ≥ r
const GT_L: u32 = 4u;
const GT_C: u32 = 8u;

struct ChunkRefs {
    sb: u32,     // scratch base
    hb: u32,     // backward workspace base
    base: u32,   // forward workspace base
    ch: u32,
    row0: u32,
    hk: u32,
    hv: u32,
    len: u32,
}

fn chunk_operand(op: u32, cr: ChunkRefs, row: u32, l: u32) -> f32 {
    if (op == OP_S) {
        return bws_buf[chs_at(cr.hb, cr.ch, row, l)];
    }
    if (op == OP_DS) {
        return bws_buf[cds_at(cr.hb, cr.ch, row, l)];
    }
    if (row >= cr.len) {
        return 0.0;
    }
    switch op {
        case OP_DU: {
            return bws_buf[cdu_at(cr.hb, cr.ch, row, l)];
        }
        case OP_DO: {
            return dout_at(cr.row0 + row, cr.hv, l);
        }
        case OP_U: {
            return bws_buf[cuu_at(cr.hb, cr.ch, row, l)];
        }
        case OP_DW0: {
            return sc_buf[sc_kd(cr.sb, SC_DW0, row, l)];
        }
        case OP_W: {
            return ws_buf[cw_at(cr.base, cr.ch, row, l)];
        }
        case OP_DU0: {
            return sc_buf[sc_du0(cr.sb, row, l)];
        }
        case OP_UF: {
            return ws_buf[cu_at(cr.base, cr.ch, row, l)];
        }
        case OP_K: {
            return load_k(k_index(cr.row0 + row, cr.hk, l));
        }
        case OP_Q: {
            return load_q(q_index(cr.row0 + row, cr.hk, l));
        }
        case OP_MQ: {
            if (l > row || l >= cr.len) {
                return 0.0;
            }
            return sc_buf[sc_cc(cr.sb, SC_DP, row, l)] * sc_buf[sc_cc(cr.sb, SC_E, row, l)];
        }
        case OP_MK: {
            if (l >= cr.len || l == row) {
                return 0.0;
            }
            if (l < row) {
                return sc_buf[sc_cc(cr.sb, SC_DA, row, l)] * sh_cb[row]
                    * sc_buf[sc_cc(cr.sb, SC_E, row, l)];
            }
            return sc_buf[sc_cc(cr.sb, SC_DA, l, row)] * sh_cb[l]
                * sc_buf[sc_cc(cr.sb, SC_E, l, row)];
        }
        case OP_PT: {
            if (l < row || l >= cr.len) {
                return 0.0;
            }
            return ws_buf[cp_at(cr.base, cr.ch, l, row)];
        }
        case OP_MKQ: {
            if (l < row || l >= cr.len) {
                return 0.0;
            }
            return sc_buf[sc_cc(cr.sb, SC_DP, l, row)] * sc_buf[sc_cc(cr.sb, SC_E, l, row)];
        }
        default: {
            return 0.0;
        }
    }
}

// One step's operand elements of a lane: A's element lid (row lid / GT_L), B's elements
// lid + m·WG, fetched a step ahead of their use.
struct Tile {
    a: f32,
    b: array<f32, 2>,    // 128 · GT_L / WG
}

// B's element e of a step: (column n, inner offset li).
fn chunk_tile_at(e: u32, b_rows: bool, cols: u32) -> vec2<u32> {
    if (b_rows) {
        return vec2<u32>(e / GT_L, e % GT_L);
    }
    return vec2<u32>(e % cols, e / cols);
}

fn chunk_tile_fetch(opa: u32, opb: u32, b_rows: bool, cr: ChunkRefs, inner: u32, nb: u32,
                    cols: u32, nlim: u32, l0: u32, lid: u32) -> Tile {
    var tl: Tile;
    tl.a = 0.0;
    let la = l0 + lid % GT_L;
    if (la < inner) {
        tl.a = chunk_operand(opa, cr, lid / GT_L, la);
    }
    for (var m = 0u; m < 2u; m = m + 1u) {
        let e = lid + m * WG;
        let at = chunk_tile_at(e, b_rows, cols);
        let l = l0 + at.y;
        var x = 0.0;
        if (e < cols * GT_L && l < inner && at.x < nlim) {
            if (b_rows) {
                x = chunk_operand(opb, cr, nb + at.x, l);
            } else {
                x = chunk_operand(opb, cr, l, nb + at.x);
            }
        }
        tl.b[m] = x;
    }
    return tl;
}

// acc += A·Bᵀ over the inner index 0..inner for the lane's block: A = `opa` rows 0..CH, B =
// `opb` rows nb.. (`cols` of them, 64 or 128; those at or past nb + nlim read as zeros). With
// `b_rows` false, B is given transposed (A·B for an operand [inner, ..]). Lane: rows
// 4·(lid / 16) + a, columns nb + lid % 16 + 16·c (c < cols / 16), accumulator a·GT_C + c.
// GT_L inner steps a round, staged in sh_cq / sh_ck, the next round's fetched meanwhile.
// Barriers: call from uniform control flow.
fn chunk_product(acc: ptr<function, array<f32, 32>>, opa: u32, opb: u32, b_rows: bool,
                 cr: ChunkRefs, inner: u32, nb: u32, cols: u32, nlim: u32, lid: u32) {
    let m0 = (lid / 16u) * 4u;
    let cw = cols / 16u;
    let k = lid % 16u;
    var tl = chunk_tile_fetch(opa, opb, b_rows, cr, inner, nb, cols, nlim, 0u, lid);
    for (var l0 = 0u; l0 < inner; l0 = l0 + GT_L) {
        workgroupBarrier();
        sh_cq[lid] = tl.a;
        for (var m = 0u; m < 2u; m = m + 1u) {
            let e = lid + m * WG;
            if (e < cols * GT_L) {
                let at = chunk_tile_at(e, b_rows, cols);
                sh_ck[at.y * cols + at.x] = tl.b[m];
            }
        }
        workgroupBarrier();
        if (l0 + GT_L < inner) {
            tl = chunk_tile_fetch(opa, opb, b_rows, cr, inner, nb, cols, nlim, l0 + GT_L, lid);
        }
        for (var l = 0u; l < GT_L; l = l + 1u) {
            for (var a = 0u; a < 4u; a = a + 1u) {
                let av = sh_cq[(m0 + a) * GT_L + l];
                for (var c = 0u; c < GT_C; c = c + 1u) {
                    if (c < cw) {
                        (*acc)[a * GT_C + c] = (*acc)[a * GT_C + c] + av * sh_ck[l * cols + k + 16u * c];
                    }
                }
            }
        }
    }
}

fn chunk_acc_zero() -> array<f32, 32> {
    return array<f32, 32>();
}
// `params.slices` workgroups, each taking units (head of the launch, chunk) g, g + slices, ...
// with its own scratch.
@compute @workgroup_size(WG)
fn chunk_grads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    if (g >= params.slices) {
        return;
    }
    let vd = params.vdim;
    let sb = g * sc_len();
    let has_dout = (params.flags & 1u) != 0u;
    for (var unit = g; unit < params.units; unit = unit + params.slices) {
        let hl = unit / params.chunks;
        let ch = unit % params.chunks;
        var cr = chunk_refs(hl, ch);
        cr.sb = sb;
        let hv = cr.hv;
        let hk = cr.hk;
        let t0 = ch * CH;
        let len = cr.len;
        let row0 = cr.row0;
        let base = cr.base;
        let hb = cr.hb;
        sync();
        if (lid < CH) {
            sh_cg[lid] = ws_buf[cg_at(base, ch, lid)];
            var be = 0.0;
            if (lid < len) {
                be = beta_in[(row0 + lid) * params.value_heads + hv];
            }
            sh_cb[lid] = be;
        }
        workgroupBarrier();
        let glast = sh_cg[len - 1u];
        let k16 = lid % 16u;
        let m0 = (lid / 16u) * 4u;
        // dw = −dU Sᵀ, dQ̃ = scale dO Sᵀ, dK̃ = U dS'ᵀ (sums over the value columns in order),
        // 128 key dims a pass.
        for (var nb = 0u; nb < KD; nb = nb + 128u) {
            for (var which = 0u; which < 3u; which = which + 1u) {
                var x = chunk_acc_zero();
                if (which == 0u) {
                    chunk_product(&x, OP_DU, OP_S, true, cr, vd, nb, 128u, KD - nb, lid);
                } else if (which == 1u) {
                    if (has_dout) {
                        chunk_product(&x, OP_DO, OP_S, true, cr, vd, nb, 128u, KD - nb, lid);
                    }
                } else {
                    chunk_product(&x, OP_U, OP_DS, true, cr, vd, nb, 128u, KD - nb, lid);
                }
                for (var a = 0u; a < 4u; a = a + 1u) {
                    for (var c = 0u; c < 8u; c = c + 1u) {
                        let i = nb + k16 + 16u * c;
                        if (i < KD) {
                            let t = m0 + a;
                            let y = x[a * GT_C + c];
                            if (which == 0u) {
                                sc_buf[sc_kd(sb, SC_DW, t, i)] = -y;
                            } else if (which == 1u) {
                                sc_buf[sc_kd(sb, SC_DQ, t, i)] = params.scale * y;
                            } else {
                                sc_buf[sc_kd(sb, SC_DK, t, i)] = y;
                            }
                        }
                    }
                }
            }
        }
        // dP = scale dO Uᵀ (s ≤ t) and E.
        {
            var xp = chunk_acc_zero();
            if (has_dout) {
                chunk_product(&xp, OP_DO, OP_U, true, cr, vd, 0u, 64u, CH, lid);
            }
            for (var a = 0u; a < 4u; a = a + 1u) {
                for (var c = 0u; c < 4u; c = c + 1u) {
                    let t = m0 + a;
                    let s = k16 + 16u * c;
                    var dp = 0.0;
                    var ex = 0.0;
                    if (t < len && s <= t) {
                        dp = params.scale * xp[a * GT_C + c];
                        ex = exp(sh_cg[t] - sh_cg[s]);
                    }
                    sc_buf[sc_cc(sb, SC_DP, t, s)] = dp;
                    sc_buf[sc_cc(sb, SC_E, t, s)] = ex;
                }
            }
        }
        // Ak and A = β Ak (packed, for the solves), from the forward's key products.
        let kb = chunk_key_blocks(row0, len, hk, lid, false);
        for (var a = 0u; a < 4u; a = a + 1u) {
            for (var c = 0u; c < 4u; c = c + 1u) {
                let t = kb.r0 + a;
                let s = kb.s0 + c;
                var ak = 0.0;
                if (t < len && s < t) {
                    let ex = exp(sh_cg[t] - sh_cg[s]);
                    ak = kb.kk[a * 4u + c] * ex;
                    sh_ca[(t * t - t) / 2u + s] = sh_cb[t] * kb.kk[a * 4u + c] * ex;
                }
                sc_buf[sc_cc(sb, SC_AK, t, s)] = ak;
            }
        }
        // ⟨dS', S⟩: each lane's elements in order, then the lanes in order.
        var d = 0.0;
        for (var e = lid; e < KD * vd; e = e + WG) {
            d = d + bws_buf[cds_at(hb, ch, 0u, 0u) + e] * bws_buf[chs_at(hb, ch, 0u, 0u) + e];
        }
        sh_pa[lid] = d;
        sync();
        // The two solves side by side where the lanes suffice, else one after the other.
        if (KD + vd <= WG) {
            if (lid < KD) {
                chunk_back_solve(sb, hb, ch, len, lid, false);
            } else if (lid < KD + vd) {
                chunk_back_solve(sb, hb, ch, len, lid - KD, true);
            }
        } else {
            if (lid < KD) {
                chunk_back_solve(sb, hb, ch, len, lid, false);
            }
            if (lid < vd) {
                chunk_back_solve(sb, hb, ch, len, lid, true);
            }
        }
        sync();
        // dA = −(dW0 wᵀ + dU0 uᵀ), s < r.
        {
            var xa = chunk_acc_zero();
            chunk_product(&xa, OP_DW0, OP_W, true, cr, KD, 0u, 64u, CH, lid);
            chunk_product(&xa, OP_DU0, OP_UF, true, cr, vd, 0u, 64u, CH, lid);
            for (var a = 0u; a < 4u; a = a + 1u) {
                for (var c = 0u; c < 4u; c = c + 1u) {
                    let r = m0 + a;
                    let s = k16 + 16u * c;
                    var x = 0.0;
                    if (r < len && s < r) {
                        x = -xa[a * GT_C + c];
                    }
                    sc_buf[sc_cc(sb, SC_DA, r, s)] = x;
                }
            }
        }
        // Per-row dots: q·dQ̃, k·dK̃, k·dW0, v·dU0, four lanes a row (dims l ≡ lane mod 4, in
        // order; then the four in order); and the lanes' ⟨dS', S⟩ in order.
        workgroupBarrier();
        {
            let r = lid / 4u;
            let qtr = lid % 4u;
            var x1 = 0.0;
            var x2 = 0.0;
            var x3 = 0.0;
            var x4 = 0.0;
            if (r < len) {
                let row = row0 + r;
                for (var i = qtr; i < KD; i = i + 4u) {
                    let qv = load_q(q_index(row, hk, i));
                    let kv = load_k(k_index(row, hk, i));
                    x1 = x1 + qv * sc_buf[sc_kd(sb, SC_DQ, r, i)];
                    x2 = x2 + kv * sc_buf[sc_kd(sb, SC_DK, r, i)];
                    x3 = x3 + kv * sc_buf[sc_kd(sb, SC_DW0, r, i)];
                }
                for (var jj = qtr; jj < vd; jj = jj + 4u) {
                    x4 = x4 + load_v(v_index(row, hv, jj)) * sc_buf[sc_du0(sb, r, jj)];
                }
            }
            sh_cq[lid] = x1;
            sh_cq[WG + lid] = x2;
            sh_ck[lid] = x3;
            sh_ck[WG + lid] = x4;
        }
        workgroupBarrier();
        if (lid < len) {
            var x1 = 0.0;
            var x2 = 0.0;
            var x3 = 0.0;
            var x4 = 0.0;
            for (var qtr = 0u; qtr < 4u; qtr = qtr + 1u) {
                x1 = x1 + sh_cq[lid * 4u + qtr];
                x2 = x2 + sh_cq[WG + lid * 4u + qtr];
                x3 = x3 + sh_ck[lid * 4u + qtr];
                x4 = x4 + sh_ck[WG + lid * 4u + qtr];
            }
            sh_rows[lid] = x1;
            sh_rows[CH + lid] = x2;
            sh_rows[2u * CH + lid] = x3;
            sh_rows[3u * CH + lid] = x4;
        }
        if (lid == CH) {
            var tot = 0.0;
            for (var l = 0u; l < WG; l = l + 1u) {
                tot = tot + sh_pa[l];
            }
            sh_rows[4u * CH] = tot;
        }
        sync();
        // dβ and dγ of each row.
        if (lid < len) {
            let r = lid;
            let gr = sh_cg[r];
            let br = sh_cb[r];
            var dg = exp(gr) * sh_rows[r];
            for (var s = 0u; s <= r; s = s + 1u) {
                dg = dg + sc_buf[sc_cc(sb, SC_DP, r, s)] * ws_buf[cp_at(base, ch, r, s)];
            }
            for (var t = r; t < len; t = t + 1u) {
                dg = dg - sc_buf[sc_cc(sb, SC_DP, t, r)] * ws_buf[cp_at(base, ch, t, r)];
            }
            dg = dg - exp(glast - gr) * sh_rows[CH + r];
            if (r == len - 1u) {
                var tot = 0.0;
                for (var s = 0u; s < len; s = s + 1u) {
                    tot = tot + exp(glast - sh_cg[s]) * sh_rows[CH + s];
                }
                dg = dg + tot + exp(glast) * sh_rows[4u * CH];
            }
            var db = 0.0;
            for (var s = 0u; s < r; s = s + 1u) {
                let da = sc_buf[sc_cc(sb, SC_DA, r, s)];
                let ak = sc_buf[sc_cc(sb, SC_AK, r, s)];
                dg = dg + da * br * ak;
                db = db + da * ak;
            }
            for (var t = r + 1u; t < len; t = t + 1u) {
                dg = dg - sc_buf[sc_cc(sb, SC_DA, t, r)] * sh_cb[t] * sc_buf[sc_cc(sb, SC_AK, t, r)];
            }
            dg = dg + br * exp(gr) * sh_rows[2u * CH + r];
            db = db + exp(gr) * sh_rows[2u * CH + r] + sh_rows[3u * CH + r];
            dbeta_buf[(row0 + r) * params.value_heads + hv] = db;
            sh_dgam[r] = dg;
        }
        workgroupBarrier();
        if (lid == 0u) {
            var acc = 0.0;
            for (var rr = 0u; rr < len; rr = rr + 1u) {
                let r = len - 1u - rr;
                acc = acc + sh_dgam[r];
                dg_buf[(row0 + r) * params.value_heads + hv] = acc;
            }
        }
        // dq, dk of this value head: the coefficient matrices times the chunk's k and q rows,
        // 128 key dims a pass, then the terms through dQ̃, dK̃ and dW0; dv.
        sync();
        for (var nb = 0u; nb < KD; nb = nb + 128u) {
            for (var which = 0u; which < 2u; which = which + 1u) {
                var x = chunk_acc_zero();
                if (which == 0u) {
                    chunk_product(&x, OP_MQ, OP_K, false, cr, len, nb, 128u, KD - nb, lid);
                } else {
                    chunk_product(&x, OP_MK, OP_K, false, cr, len, nb, 128u, KD - nb, lid);
                    chunk_product(&x, OP_MKQ, OP_Q, false, cr, len, nb, 128u, KD - nb, lid);
                }
                for (var a = 0u; a < 4u; a = a + 1u) {
                    for (var c = 0u; c < 8u; c = c + 1u) {
                        let r = m0 + a;
                        let i = nb + k16 + 16u * c;
                        if (r < len && i < KD) {
                            let gr = sh_cg[r];
                            let at = (hl * params.time + t0 + r) * KD + i;
                            if (which == 0u) {
                                cpq_buf[at] = x[a * GT_C + c]
                                    + exp(gr) * sc_buf[sc_kd(sb, SC_DQ, r, i)];
                            } else {
                                cpk_buf[at] = x[a * GT_C + c]
                                    + exp(glast - gr) * sc_buf[sc_kd(sb, SC_DK, r, i)]
                                    + sh_cb[r] * exp(gr) * sc_buf[sc_kd(sb, SC_DW0, r, i)];
                            }
                        }
                    }
                }
            }
        }
        for (var e = lid; e < CH * vd; e = e + WG) {
            let r = e / vd;
            let jj = e % vd;
            if (r < len) {
                dv_buf[((row0 + r) * params.value_heads + hv) * vd + jj] =
                    sh_cb[r] * sc_buf[sc_du0(sb, r, jj)];
            }
        }
    }
}

// dq and dk of the launch's key heads: each the sum of its value heads' in head order.
// Threads over (key head of the launch, token, key dim).
@compute @workgroup_size(WG)
fn chunk_sum_heads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * WG + lid;
    if (e >= params.units) {
        return;
    }
    let i = e % KD;
    let t = (e / KD) % params.time;
    let khl = e / (KD * params.time);
    let bh0 = params.unit_base + khl * params.group;
    let b = bh0 / params.value_heads;
    let hk = (bh0 % params.value_heads) / params.group;
    var q = 0.0;
    var k = 0.0;
    for (var sub = 0u; sub < params.group; sub = sub + 1u) {
        let at = ((khl * params.group + sub) * params.time + t) * KD + i;
        q = q + pdq_in[at];
        k = k + pdk_in[at];
    }
    let out = ((b * params.time + t) * params.key_heads + hk) * KD + i;
    dq_buf[out] = q;
    dk_buf[out] = k;
}
