// Rotary position embeddings, forward and backward, for every variant wgrad offers:
// per-row tables, shared tables with integer positions (HF position_ids), several heads per
// token in [batch, seq, heads, dim] or [batch, heads, seq, dim], Llama 4's complex tables and
// Qwen2-VL's multi-axis sections. FP32 math whatever the storage dtype.
//
// Pairs: split-half rotates (c, c + half), interleaved rotates (2i, 2i + 1), for frequency
// index i < half = rot / 2. The rotation of pair i of value row R is
//     (x1, x2) → (x1·cos − x2·sin, x2·cos + x1·sin),
// with (cos, sin) = table row p of frequency i, p = the row's position. Columns ≥ rot copy.
//
// `forward` and `backward_values` (any shape) give one invocation a pair of elements (2j, 2j + 1) of the
// flat values tensor and compute both independently, so every invocation owns its output word
// whatever the row width's parity.
//
// Table gradients: the gradient of entry (p, i) is the sum, over the tokens whose position for
// frequency i is p in token order (batch-major, then sequence), of each token's contribution
// `token_table_grad(b, s, i)` (itself summed over its q heads, then its k heads, in head
// order). Without position ids (`table_grad`) one invocation owns one entry and loops over the
// batch. With position ids the work is split in two launches (`table_grad_tokens`, then
// `table_grad_rows`, see there); both compute the same sums in the same order. No atomics,
// reruns are bit-identical.

override DT_V: u32 = 0u;        // values dtype (q and k)
override DT_T: u32 = 0u;        // table dtype
override DT_Y: u32 = 0u;        // forward: output dtype; backward: cotangent dtype
override INTERLEAVED: u32 = 0u; // 1: adjacent pairs
override LAYOUT: u32 = 0u;      // 0: [batch, seq, heads, dim]; 1: [batch, heads, seq, dim]
override POSITIONS: u32 = 0u;   // 0: position = seq index; 1: read from `positions`
override COMPLEX: u32 = 0u;     // 1: one table [rows, half, 2] of (cos, sin) pairs
const WG: u32 = 256u;

struct Params {
    count: u32,       // elements of the values tensor of this launch
    pairs: u32,       // ceil(count / 2), or table entries for table_grad
    dim: u32,         // last axis of the values
    rot: u32,         // rotary_dim (even, ≤ dim)
    half: u32,        // rot / 2
    heads: u32,       // heads of this launch (table_grad: q heads)
    heads_k: u32,     // table_grad: k heads (0: no k)
    seq: u32,
    batch: u32,
    table_rows: u32,
    pos_batched: u32, // 1: positions per (batch, seq); 0: per seq index, shared by the batch
    pos_axis_stride: u32, // elements per position axis (mRoPE: 3 axes)
    sec0: u32,        // frequencies i < sec0 use position axis 0, i < sec1 axis 1, else 2
    sec1: u32,
    token0: u32,      // table_grad_tokens / table_grad_rows: first token (b·seq + s) of the chunk
    tokens: u32,      // table_grad_rows: tokens in the chunk
    accumulate: u32,  // table_grad_rows: 1 to continue the sums already in dcos/dsin
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> values: array<u32>;
@group(0) @binding(2) var<storage, read> grads: array<u32>;
@group(0) @binding(3) var<storage, read> values_k: array<u32>;
@group(0) @binding(4) var<storage, read> grads_k: array<u32>;
@group(0) @binding(5) var<storage, read> positions: array<u32>;
@group(0) @binding(6) var<storage, read> cos_table: array<u32>;
@group(0) @binding(7) var<storage, read> sin_table: array<u32>;
@group(0) @binding(8) var<storage, read_write> out: array<u32>;
@group(0) @binding(9) var<storage, read_write> dcos: array<u32>;
@group(0) @binding(10) var<storage, read_write> dsin: array<u32>;
@group(0) @binding(15) var<storage, read> token_grads: array<u32>;

fn load_value(i: u32) -> f32 {
    if (DT_V == DT_F32) {
        return bitcast<f32>(values[i]);
    }
    return half_from_word(values[i >> 1u], i, DT_V);
}

fn load_value_k(i: u32) -> f32 {
    if (DT_V == DT_F32) {
        return bitcast<f32>(values_k[i]);
    }
    return half_from_word(values_k[i >> 1u], i, DT_V);
}

fn load_grad(i: u32) -> f32 {
    if (DT_Y == DT_F32) {
        return bitcast<f32>(grads[i]);
    }
    return half_from_word(grads[i >> 1u], i, DT_Y);
}

fn load_grad_k(i: u32) -> f32 {
    if (DT_Y == DT_F32) {
        return bitcast<f32>(grads_k[i]);
    }
    return half_from_word(grads_k[i >> 1u], i, DT_Y);
}

fn load_table(cos_side: bool, i: u32) -> f32 {
    if (cos_side) {
        if (DT_T == DT_F32) {
            return bitcast<f32>(cos_table[i]);
        }
        return half_from_word(cos_table[i >> 1u], i, DT_T);
    }
    if (DT_T == DT_F32) {
        return bitcast<f32>(sin_table[i]);
    }
    return half_from_word(sin_table[i >> 1u], i, DT_T);
}

// Position axis of frequency i (0 unless mRoPE sections are set).
fn axis_of(i: u32) -> u32 {
    if (i < params.sec0) {
        return 0u;
    }
    if (i < params.sec1) {
        return 1u;
    }
    return 2u;
}

// Table row of token (b, s) for frequency i; `table_rows` (never matched) when out of range.
fn position_of(b: u32, s: u32, i: u32) -> u32 {
    var p = s;
    if (POSITIONS == 1u) {
        var idx = s;
        if (params.pos_batched == 1u) {
            idx = b * params.seq + s;
        }
        p = positions[axis_of(i) * params.pos_axis_stride + idx]; // i32 bits: negative → huge
    }
    return min(p, params.table_rows);
}

// (cos, sin) of table row p, frequency i; (0, 0) past the table.
fn coefficients(p: u32, i: u32) -> vec2<f32> {
    if (p >= params.table_rows) {
        return vec2(0.0, 0.0);
    }
    let e = p * params.half + i;
    if (COMPLEX == 1u) {
        return vec2(load_table(true, 2u * e), load_table(true, 2u * e + 1u));
    }
    return vec2(load_table(true, e), load_table(false, e));
}

// (batch, seq) of value row r with `heads` heads.
fn token_of(r: u32, heads: u32) -> vec2<u32> {
    if (LAYOUT == 0u) {
        let t = r / heads;
        return vec2(t / params.seq, t % params.seq);
    }
    return vec2(r / (heads * params.seq), r % params.seq);
}

// Value row of (batch b, seq s, head h) with `heads` heads.
fn row_of(b: u32, s: u32, h: u32, heads: u32) -> u32 {
    if (LAYOUT == 0u) {
        return (b * params.seq + s) * heads + h;
    }
    return (b * heads + h) * params.seq + s;
}

// Columns of pair i: (first, second).
fn pair_columns(i: u32) -> vec2<u32> {
    if (INTERLEAVED == 1u) {
        return vec2(2u * i, 2u * i + 1u);
    }
    return vec2(i, i + params.half);
}

// Pair index of column c < rot and whether c is the pair's second member.
fn pair_of_column(c: u32) -> vec2<u32> {
    if (INTERLEAVED == 1u) {
        return vec2(c / 2u, c & 1u);
    }
    if (c < params.half) {
        return vec2(c, 0u);
    }
    return vec2(c - params.half, 1u);
}

// Forward value of flat element e.
fn rotated(e: u32) -> f32 {
    let r = e / params.dim;
    let c = e - r * params.dim;
    let x = load_value(e);
    if (c >= params.rot) {
        return x;
    }
    let pc = pair_of_column(c);
    let cols = pair_columns(pc.x);
    let base = r * params.dim;
    let bs = token_of(r, params.heads);
    let cs = coefficients(position_of(bs.x, bs.y, pc.x), pc.x);
    if (pc.y == 0u) {
        return x * cs.x - load_value(base + cols.y) * cs.y;
    }
    return x * cs.x + load_value(base + cols.x) * cs.y;
}

// Gradient of flat element e: the transpose of the rotation applied to the cotangent.
fn unrotated(e: u32) -> f32 {
    let r = e / params.dim;
    let c = e - r * params.dim;
    let g = load_grad(e);
    if (c >= params.rot) {
        return g;
    }
    let pc = pair_of_column(c);
    let cols = pair_columns(pc.x);
    let base = r * params.dim;
    let bs = token_of(r, params.heads);
    let cs = coefficients(position_of(bs.x, bs.y, pc.x), pc.x);
    if (pc.y == 0u) {
        return g * cs.x + load_grad(base + cols.y) * cs.y;
    }
    return g * cs.x - load_grad(base + cols.x) * cs.y;
}

fn store(pair: u32, a: f32, b: f32, has_second: bool) {
    let i = pair * 2u;
    if (DT_Y == DT_F32) {
        out[i] = bitcast<u32>(a);
        if (has_second) {
            out[i + 1u] = bitcast<u32>(b);
        }
    } else if (has_second) {
        out[pair] = pack_halves(a, b, DT_Y);
    } else {
        out[pair] = half_bits(a, DT_Y);
    }
}

@compute @workgroup_size(WG)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let pair = group_index(wid, nwg) * WG + lid;
    if (pair >= params.pairs) {
        return;
    }
    let e = pair * 2u;
    let has_second = e + 1u < params.count;
    let a = rotated(e);
    var b = 0.0;
    if (has_second) {
        b = rotated(e + 1u);
    }
    store(pair, a, b, has_second);
}

// dvalues, F32: `out` is written one word per element (DT_Y is the cotangent's dtype here).
@compute @workgroup_size(WG)
fn backward_values(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let pair = group_index(wid, nwg) * WG + lid;
    if (pair >= params.pairs) {
        return;
    }
    let e = pair * 2u;
    out[e] = bitcast<u32>(unrotated(e));
    if (e + 1u < params.count) {
        out[e + 1u] = bitcast<u32>(unrotated(e + 1u));
    }
}

// Contribution of value row r (q side when `is_q`) to the gradients of its pair i's
// coefficients: (∂/∂cos, ∂/∂sin) = (g1·x1 + g2·x2, g2·x1 − g1·x2).
fn row_table_grad(is_q: bool, r: u32, i: u32) -> vec2<f32> {
    let cols = pair_columns(i);
    let a = r * params.dim + cols.x;
    let b = r * params.dim + cols.y;
    var x1: f32;
    var x2: f32;
    var g1: f32;
    var g2: f32;
    if (is_q) {
        x1 = load_value(a);
        x2 = load_value(b);
        g1 = load_grad(a);
        g2 = load_grad(b);
    } else {
        x1 = load_value_k(a);
        x2 = load_value_k(b);
        g1 = load_grad_k(a);
        g2 = load_grad_k(b);
    }
    return vec2(g1 * x1 + g2 * x2, g2 * x1 - g1 * x2);
}

// Sum of the contributions of `count` heads (q side when `is_q`) of token (b, s) to pair i,
// added to `acc` in head order. Heads go four at a time, each group's loads issued before its
// sums, so an invocation keeps sixteen loads in flight instead of four.
fn heads_table_grad(acc_in: vec2<f32>, is_q: bool, b: u32, s: u32, i: u32,
        count: u32) -> vec2<f32> {
    var acc = acc_in;
    var h = 0u;
    for (; h + 4u <= count; h = h + 4u) {
        let c0 = row_table_grad(is_q, row_of(b, s, h, count), i);
        let c1 = row_table_grad(is_q, row_of(b, s, h + 1u, count), i);
        let c2 = row_table_grad(is_q, row_of(b, s, h + 2u, count), i);
        let c3 = row_table_grad(is_q, row_of(b, s, h + 3u, count), i);
        acc = acc + c0;
        acc = acc + c1;
        acc = acc + c2;
        acc = acc + c3;
    }
    for (; h < count; h = h + 1u) {
        acc = acc + row_table_grad(is_q, row_of(b, s, h, count), i);
    }
    return acc;
}

// Contribution of token (b, s) to the gradient of its table entry for pair i: its q heads,
// then its k heads, summed in head order.
fn token_table_grad(b: u32, s: u32, i: u32) -> vec2<f32> {
    let acc = heads_table_grad(vec2(0.0, 0.0), true, b, s, i, params.heads);
    return heads_table_grad(acc, false, b, s, i, params.heads_k);
}

// Without position ids: gradient of table entry (p, i) = flat entry `entry`, summed over the
// batch in order (row p is used by the tokens (b, p)).
fn entry_grad(entry: u32) -> vec2<f32> {
    let p = entry / params.half;
    let i = entry - p * params.half;
    var acc = vec2(0.0, 0.0);
    if (p < params.seq) {
        for (var b = 0u; b < params.batch; b = b + 1u) {
            acc = acc + token_table_grad(b, p, i);
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn table_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let entry = group_index(wid, nwg) * WG + lid;
    if (entry >= params.pairs) {
        return;
    }
    let g = entry_grad(entry);
    dcos[entry] = bitcast<u32>(g.x);
    dsin[entry] = bitcast<u32>(g.y);
}

// Llama 4: the gradient of the complex table [rows, half, 2] in its own layout.
@compute @workgroup_size(WG)
fn table_grad_complex(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let entry = group_index(wid, nwg) * WG + lid;
    if (entry >= params.pairs) {
        return;
    }
    let g = entry_grad(entry);
    dcos[2u * entry] = bitcast<u32>(g.x);
    dcos[2u * entry + 1u] = bitcast<u32>(g.y);
}

// ---- table gradients with position ids ----
// Scanning every token for every entry (what one invocation per entry would do) costs
// table_rows · half · batch · seq id comparisons and re-reads each matching token's heads once
// per entry it feeds. Instead:
//
// 1. `table_grad_tokens`: one invocation per (token, pair i) of a chunk of tokens computes
//    `token_table_grad` and stores it (two F32 words) at (t − token0)·half + i of a scratch
//    buffer. This is the whole read of q, dq, k, dk, once, in a token-parallel launch whose
//    cost does not depend on the positions: consecutive invocations take consecutive pairs of
//    one token, so a warp reads whole runs of a head row; each invocation keeps 16 loads in
//    flight (heads_table_grad).
// 2. `table_grad_rows`: one workgroup per block of TG_ROWS·groups table rows × ib frequencies
//    (ib = min(half, 256); `groups` = min(256 / ib, 32) row groups of TG_ROWS rows). Lane
//    (r, il) owns the entries (p, i) of its frequency i = block's first + il and its group's
//    TG_ROWS rows, accumulating them in workgroup memory only it touches. The workgroup walks
//    the chunk's tokens in order, TG_CHUNK at a time: lane l reads the ids of tokens 4l..4l+3
//    (every axis in use; the next step's are fetched while this step's hits are added), turns
//    them into, per token, the local row of each axis (a byte; 0xFF: not in this block) and a
//    nibble of hits; 32 lanes join the nibbles into a bit mask of the step. Each lane then
//    visits the set bits in order, eight at a time: it issues the loads of the scratch values
//    of the hits it owns (the token's local row for its frequency's axis falls in its group),
//    then adds them in token order. Every entry is thus the sum of its tokens' contributions
//    in token order, as one invocation per entry would compute it. Rows nobody uses keep
//    their zero; ids past the table (or negative I32, huge as u32) hit no block. Workgroup
//    memory: 13.1 KiB.
//
// Traffic at B4 T2048, 32 + 8 heads of 128, table 2048 rows, F32: launch 1 reads q, dq, k, dk
// (335 MB) and writes 4 MB, the traffic of the rotation backward; launch 2 runs 128 workgroups
// of 16 rows, each 8 steps of 1,024 tokens, and reads the 4 MB scratch once. Measured on an
// H200 (`notes/h200/2026-11-30-final3/`): the whole backward with table gradients 0.207 ms F32,
// 0.170 ms BF16, against 0.091 / 0.080 ms for the rotation backward alone; with one invocation
// per entry (2048·64 entries × 8192 id comparisons each) 2.14 / 1.60 ms (`…-mm-rope-zero/`).
// With many more table rows than tokens the id reads grow (table_rows / rows-per-block
// workgroups × tokens); with every token at one position one lane per frequency sums them
// all (eight loads in flight). Chunks of tokens run one after the other (the host sizes them
// to the workspace bound); `accumulate` continues the sums of the previous chunks from
// dcos/dsin, which holds them in F32, so chunking does not change a bit.

const TG_ROWS: u32 = 4u;      // table rows per lane
const TG_CHUNK: u32 = 1024u;  // tokens per step of table_grad_rows
const TG_NONE: u32 = 0xFFu;   // local row byte: token not in this block on that axis

var<workgroup> tg_acc: array<vec2<f32>, 1024>;   // [local row, il]: TG_ROWS·groups·ib ≤ 1024
var<workgroup> tg_rows: array<vec4<u32>, 256>;   // per token: local row per axis, a byte each
var<workgroup> tg_nibbles: array<u32, 256>;      // per 4 tokens: which hit the block
var<workgroup> tg_mask: array<vec4<u32>, 8>;     // TG_CHUNK bits: token hits the block

@compute @workgroup_size(WG)
fn table_grad_tokens(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = group_index(wid, nwg) * WG + lid;
    if (w >= params.pairs) {
        return;
    }
    let tr = w / params.half;
    let i = w - tr * params.half;
    let t = params.token0 + tr;
    let b = t / params.seq;
    let g = token_table_grad(b, t - b * params.seq, i);
    out[2u * w] = bitcast<u32>(g.x);
    out[2u * w + 1u] = bitcast<u32>(g.y);
}

// Frequencies per block of table_grad_rows, row groups, and table rows per block.
fn tg_ib() -> u32 {
    return min(params.half, WG);
}

fn tg_groups() -> u32 {
    return min(WG / tg_ib(), 32u);
}

fn tg_block_rows() -> u32 {
    return TG_ROWS * tg_groups();
}

// Position axes that frequencies use: 1 (no mRoPE, or every section on axis 0), 2 or 3.
fn tg_axes() -> u32 {
    if (params.sec0 >= params.half) {
        return 1u;
    }
    if (params.sec1 >= params.half) {
        return 2u;
    }
    return 3u;
}

// Id of chunk token j on axis a; 0xFFFFFFFF (no row) past the chunk or the axes in use.
fn tg_id(j: u32, a: u32) -> u32 {
    if (j >= params.tokens || a >= tg_axes()) {
        return 0xFFFFFFFFu;
    }
    let t = params.token0 + j;
    var idx = t - (t / params.seq) * params.seq;
    if (params.pos_batched == 1u) {
        idx = t;
    }
    return positions[a * params.pos_axis_stride + idx]; // i32 bits: negative → huge
}

// Ids of the four chunk tokens c0 + 4·lid .. + 3 of a step, one vector per axis.
struct TgIds {
    a0: vec4<u32>,
    a1: vec4<u32>,
    a2: vec4<u32>,
}

fn tg_fetch(c0: u32, lid: u32) -> TgIds {
    let j = c0 + 4u * lid;
    var r: TgIds;
    r.a0 = vec4(tg_id(j, 0u), tg_id(j + 1u, 0u), tg_id(j + 2u, 0u), tg_id(j + 3u, 0u));
    r.a1 = vec4(tg_id(j, 1u), tg_id(j + 1u, 1u), tg_id(j + 2u, 1u), tg_id(j + 3u, 1u));
    r.a2 = vec4(tg_id(j, 2u), tg_id(j + 1u, 2u), tg_id(j + 2u, 2u), tg_id(j + 3u, 2u));
    return r;
}

// Local rows (one byte per axis, TG_NONE outside [p0, end)) of a token with ids `ids`.
fn tg_pack(p0: u32, end: u32, ids: vec3<u32>) -> u32 {
    var packed = 0xFFFFFFFFu;
    for (var a = 0u; a < 3u; a = a + 1u) {
        let p = ids[a];
        if (p >= p0 && p < end) {
            packed = (packed & ~(TG_NONE << (8u * a))) | ((p - p0) << (8u * a));
        }
    }
    return packed;
}

// A lane's entries: frequency i (= block start + il), row group r.
struct TgLane {
    i: u32,
    il: u32,
    r: u32,
    axis: u32,
    owner: bool,
}

fn tg_lane(g: u32, lid: u32) -> TgLane {
    let ib = tg_ib();
    let i_blocks = (params.half + ib - 1u) / ib;
    var l: TgLane;
    l.r = lid / ib;
    l.il = lid - l.r * ib;
    l.i = (g % i_blocks) * ib + l.il;
    l.owner = l.r < tg_groups() && l.i < params.half;
    l.axis = axis_of(l.i);
    return l;
}

// One visited hit: its accumulator slot (0xFFFFFFFF when not this lane's) and value.
struct TgHit {
    slot: u32,
    v: vec2<f32>,
}

// The scratch value of token `c0 + jj` of the chunk (jj = base + j; j ≥ 32: no token) when
// this lane owns it.
fn tg_load(l: TgLane, c0: u32, base: u32, j: u32) -> TgHit {
    var h = TgHit(0xFFFFFFFFu, vec2(0.0, 0.0));
    if (j >= 32u || !l.owner) {
        return h;
    }
    let jj = base + j;
    let lr = (tg_rows[jj >> 2u][jj & 3u] >> (8u * l.axis)) & TG_NONE;
    if (lr == TG_NONE || lr / TG_ROWS != l.r) {
        return h;
    }
    let e = 2u * ((c0 + jj) * params.half + l.i);
    h.slot = lr * tg_ib() + l.il;
    h.v = vec2(bitcast<f32>(token_grads[e]), bitcast<f32>(token_grads[e + 1u]));
    return h;
}

fn tg_add(h: TgHit) {
    if (h.slot != 0xFFFFFFFFu) {
        tg_acc[h.slot] = tg_acc[h.slot] + h.v;
    }
}

// Walk the chunk's tokens in order and add every hit this lane owns to its accumulators.
// Called in uniform control flow (barriers inside); the scratch holds this chunk's tokens.
fn tg_accumulate(p0: u32, l: TgLane, lid: u32) {
    let end = min(p0 + tg_block_rows(), params.table_rows);
    var ids = tg_fetch(0u, lid);
    for (var c0 = 0u; c0 < params.tokens; c0 = c0 + TG_CHUNK) {
        // Lane lid stages tokens 4·lid .. + 3 of the step, then fetches the next step's ids
        // (in flight while this step's hits are added).
        let rows = vec4(tg_pack(p0, end, vec3(ids.a0.x, ids.a1.x, ids.a2.x)),
            tg_pack(p0, end, vec3(ids.a0.y, ids.a1.y, ids.a2.y)),
            tg_pack(p0, end, vec3(ids.a0.z, ids.a1.z, ids.a2.z)),
            tg_pack(p0, end, vec3(ids.a0.w, ids.a1.w, ids.a2.w)));
        tg_rows[lid] = rows;
        let hit = vec4<u32>(rows != vec4(0xFFFFFFFFu));
        tg_nibbles[lid] = hit.x | (hit.y << 1u) | (hit.z << 2u) | (hit.w << 3u);
        if (c0 + TG_CHUNK < params.tokens) {
            ids = tg_fetch(c0 + TG_CHUNK, lid);
        }
        workgroupBarrier();
        if (lid < TG_CHUNK / 32u) {
            var bits = 0u;
            for (var k = 0u; k < 8u; k = k + 1u) {
                bits = bits | (tg_nibbles[8u * lid + k] << (4u * k));
            }
            tg_mask[lid / 4u][lid % 4u] = bits;
        }
        workgroupBarrier();
        for (var q = 0u; q < TG_CHUNK / 128u; q = q + 1u) {
            let m4 = tg_mask[q];
            if (any(m4 != vec4(0u))) {
                for (var k = 0u; k < 4u; k = k + 1u) {
                    tg_word(l, c0, 32u * (4u * q + k), m4[k]);
                }
            }
        }
        workgroupBarrier();
    }
}

// Add this lane's hits among the 32 tokens base .. base + 31 of the step at c0 (set bits of
// `word`), in token order.
fn tg_word(l: TgLane, c0: u32, base: u32, word: u32) {
    var bits = word;
    while (bits != 0u) {
        // Eight hits: indices first, then the loads, then the sums in token order.
        let j0 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let j1 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let j2 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let j3 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let j4 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let j5 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let j6 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let j7 = firstTrailingBit(bits);
        bits = bits & (bits - 1u);
        let h0 = tg_load(l, c0, base, j0);
        let h1 = tg_load(l, c0, base, j1);
        let h2 = tg_load(l, c0, base, j2);
        let h3 = tg_load(l, c0, base, j3);
        let h4 = tg_load(l, c0, base, j4);
        let h5 = tg_load(l, c0, base, j5);
        let h6 = tg_load(l, c0, base, j6);
        let h7 = tg_load(l, c0, base, j7);
        tg_add(h0);
        tg_add(h1);
        tg_add(h2);
        tg_add(h3);
        tg_add(h4);
        tg_add(h5);
        tg_add(h6);
        tg_add(h7);
    }
}

// First table row of table_grad_rows' workgroup g (blocks of rows × blocks of frequencies).
fn tg_p0(g: u32) -> u32 {
    let ib = tg_ib();
    let i_blocks = (params.half + ib - 1u) / ib;
    return (g / i_blocks) * tg_block_rows();
}

// Table entry of a lane's m-th row (m < TG_ROWS), or 0xFFFFFFFF past the table / inactive.
fn tg_entry(p0: u32, l: TgLane, m: u32) -> u32 {
    let p = p0 + l.r * TG_ROWS + m;
    if (!l.owner || p >= params.table_rows) {
        return 0xFFFFFFFFu;
    }
    return p * params.half + l.i;
}

fn tg_slot(l: TgLane, m: u32) -> u32 {
    return (l.r * TG_ROWS + m) * tg_ib() + l.il;
}

@compute @workgroup_size(WG)
fn table_grad_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let p0 = tg_p0(g);
    if (p0 >= params.table_rows) {
        return;
    }
    let l = tg_lane(g, lid);
    for (var m = 0u; m < TG_ROWS; m = m + 1u) {
        let e = tg_entry(p0, l, m);
        if (e != 0xFFFFFFFFu) {
            var v = vec2(0.0, 0.0);
            if (params.accumulate == 1u) {
                v = vec2(bitcast<f32>(dcos[e]), bitcast<f32>(dsin[e]));
            }
            tg_acc[tg_slot(l, m)] = v;
        }
    }
    tg_accumulate(p0, l, lid);
    for (var m = 0u; m < TG_ROWS; m = m + 1u) {
        let e = tg_entry(p0, l, m);
        if (e != 0xFFFFFFFFu) {
            let v = tg_acc[tg_slot(l, m)];
            dcos[e] = bitcast<u32>(v.x);
            dsin[e] = bitcast<u32>(v.y);
        }
    }
}

// Llama 4: the same sums written in the complex table's [rows, half, 2] layout.
@compute @workgroup_size(WG)
fn table_grad_rows_complex(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let p0 = tg_p0(g);
    if (p0 >= params.table_rows) {
        return;
    }
    let l = tg_lane(g, lid);
    for (var m = 0u; m < TG_ROWS; m = m + 1u) {
        let e = tg_entry(p0, l, m);
        if (e != 0xFFFFFFFFu) {
            var v = vec2(0.0, 0.0);
            if (params.accumulate == 1u) {
                v = vec2(bitcast<f32>(dcos[2u * e]), bitcast<f32>(dcos[2u * e + 1u]));
            }
            tg_acc[tg_slot(l, m)] = v;
        }
    }
    tg_accumulate(p0, l, lid);
    for (var m = 0u; m < TG_ROWS; m = m + 1u) {
        let e = tg_entry(p0, l, m);
        if (e != 0xFFFFFFFFu) {
            let v = tg_acc[tg_slot(l, m)];
            dcos[2u * e] = bitcast<u32>(v.x);
            dcos[2u * e + 1u] = bitcast<u32>(v.y);
        }
    }
}

// ---- unit kernels: rows of even width with rotary_dim a multiple of 4 ----
// A row is cut into units: rot/4 rotary units, each two frequency pairs (split-half: columns
// 2m, 2m+1 and their partners 2m+half, 2m+half+1; interleaved: columns 4m..4m+3), then
// (dim − rot)/2 suffix units of two columns. Every unit is made of whole 16-bit words (rows
// start on word boundaries since dim is even, and half is even), so one invocation per unit
// owns its output words; an element is read once, and the row/token arithmetic is done once
// per unit rather than per element.

fn load_value2(e: u32) -> vec2<f32> {
    if (DT_V == DT_F32) {
        return vec2(bitcast<f32>(values[e]), bitcast<f32>(values[e + 1u]));
    }
    let w = values[e >> 1u];
    return vec2(half_from_word(w, 0u, DT_V), half_from_word(w, 1u, DT_V));
}

fn load_grad2(e: u32) -> vec2<f32> {
    if (DT_Y == DT_F32) {
        return vec2(bitcast<f32>(grads[e]), bitcast<f32>(grads[e + 1u]));
    }
    let w = grads[e >> 1u];
    return vec2(half_from_word(w, 0u, DT_Y), half_from_word(w, 1u, DT_Y));
}

// Store elements e, e + 1 (e even) of the output in dtype `dt`.
fn store2(e: u32, v: vec2<f32>, dt: u32) {
    if (dt == DT_F32) {
        out[e] = bitcast<u32>(v.x);
        out[e + 1u] = bitcast<u32>(v.y);
    } else {
        out[e >> 1u] = pack_halves(v.x, v.y, dt);
    }
}

// Rotary unit u (< half/2) of the row starting at `base`, with the coefficients of its pairs
// 2u and 2u + 1: split-half units rotate columns (2u, 2u+1) with their partners (2u+half,
// 2u+half+1); interleaved units hold pairs (4u, 4u+1) and (4u+2, 4u+3). Suffix units
// (u ≥ half/2) copy two columns.
fn apply_forward(base: u32, u: u32, c0: vec2<f32>, c1: vec2<f32>) {
    if (u >= params.half / 2u) {
        let e = base + params.rot + 2u * (u - params.half / 2u);
        store2(e, load_value2(e), DT_Y);
        return;
    }
    if (INTERLEAVED == 1u) {
        let e = base + 4u * u;
        let p = load_value2(e);
        let q = load_value2(e + 2u);
        store2(e, vec2(p.x * c0.x - p.y * c0.y, p.y * c0.x + p.x * c0.y), DT_Y);
        store2(e + 2u, vec2(q.x * c1.x - q.y * c1.y, q.y * c1.x + q.x * c1.y), DT_Y);
        return;
    }
    let cs = vec2(c0.x, c1.x);
    let sn = vec2(c0.y, c1.y);
    let ea = base + 2u * u;
    let eb = ea + params.half;
    let x1 = load_value2(ea);
    let x2 = load_value2(eb);
    store2(ea, x1 * cs - x2 * sn, DT_Y);
    store2(eb, x2 * cs + x1 * sn, DT_Y);
}

// The transpose of the rotation on the cotangent, F32 out; same units as `apply_forward`.
fn apply_backward(base: u32, u: u32, c0: vec2<f32>, c1: vec2<f32>) {
    if (u >= params.half / 2u) {
        let e = base + params.rot + 2u * (u - params.half / 2u);
        store2(e, load_grad2(e), DT_F32);
        return;
    }
    if (INTERLEAVED == 1u) {
        let e = base + 4u * u;
        let p = load_grad2(e);
        let q = load_grad2(e + 2u);
        store2(e, vec2(p.x * c0.x + p.y * c0.y, p.y * c0.x - p.x * c0.y), DT_F32);
        store2(e + 2u, vec2(q.x * c1.x + q.y * c1.y, q.y * c1.x - q.x * c1.y), DT_F32);
        return;
    }
    let cs = vec2(c0.x, c1.x);
    let sn = vec2(c0.y, c1.y);
    let ea = base + 2u * u;
    let eb = ea + params.half;
    let g1 = load_grad2(ea);
    let g2 = load_grad2(eb);
    store2(ea, g1 * cs + g2 * sn, DT_F32);
    store2(eb, g2 * cs - g1 * sn, DT_F32);
}

// Coefficients of unit u's pairs for token (b, s); unused for suffix units.
fn unit_coefficients(b: u32, s: u32, u: u32) -> array<vec2<f32>, 2> {
    if (u >= params.half / 2u) {
        return array<vec2<f32>, 2>(vec2(0.0, 0.0), vec2(0.0, 0.0));
    }
    let i = 2u * u;
    return array<vec2<f32>, 2>(
        coefficients(position_of(b, s, i), i),
        coefficients(position_of(b, s, i + 1u), i + 1u),
    );
}

fn units_per_row() -> u32 {
    return params.half / 2u + (params.dim - params.rot) / 2u;
}

@compute @workgroup_size(WG)
fn forward_units(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.pairs) {
        return;
    }
    let units = units_per_row();
    let r = t / units;
    let u = t - r * units;
    let bs = token_of(r, params.heads);
    let c = unit_coefficients(bs.x, bs.y, u);
    apply_forward(r * params.dim, u, c[0], c[1]);
}

@compute @workgroup_size(WG)
fn backward_units(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.pairs) {
        return;
    }
    let units = units_per_row();
    let r = t / units;
    let u = t - r * units;
    let bs = token_of(r, params.heads);
    let c = unit_coefficients(bs.x, bs.y, u);
    apply_backward(r * params.dim, u, c[0], c[1]);
}

// ---- token kernels: the unit kernels' work, one workgroup per token ----
// When the units per row divide WG, lane `lid` keeps one unit m = lid % units of every row
// (head) h ≡ lid / units of the token: the token's position and m's coefficients are read
// once per lane and reused for all its heads, and no per-unit division is left.

@compute @workgroup_size(WG)
fn forward_tokens(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.pairs) {
        return;
    }
    let units = units_per_row();
    let m = lid % units;
    let b = t / params.seq;
    let s = t - b * params.seq;
    let c = unit_coefficients(b, s, m);
    for (var h = lid / units; h < params.heads; h = h + WG / units) {
        apply_forward(row_of(b, s, h, params.heads) * params.dim, m, c[0], c[1]);
    }
}

@compute @workgroup_size(WG)
fn backward_tokens(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= params.pairs) {
        return;
    }
    let units = units_per_row();
    let m = lid % units;
    let b = t / params.seq;
    let s = t - b * params.seq;
    let c = unit_coefficients(b, s, m);
    for (var h = lid / units; h < params.heads; h = h + WG / units) {
        apply_backward(row_of(b, s, h, params.heads) * params.dim, m, c[0], c[1]);
    }
}

// ---- step kernels: q and k in one launch, 16-byte accesses, every warp access contiguous ----
// A step is SPAN consecutive elements of a row: 4 F32 (one vec4<u32>), 8 16-bit values (a
// forward's; one vec4<u32> read and one written) or 4 16-bit values (a backward's: half a
// vec4<u32> read, 4 F32 written as one vec4, so that every store of a warp is contiguous).
// A row is cut into units: rotary units (split-half: the step at columns SPAN·u and its
// partner step SPAN·u + half; interleaved: the step at columns SPAN·u, SPAN/2 adjacent pairs),
// then one unit per suffix step, copied. One invocation takes one unit of HEADS heads of one
// token: the token's coefficients are loaded once for all of them; with OVERLAP every head's
// loads are issued before any arithmetic, otherwise the heads run one after the other (fewer
// live registers: 16-bit forwards). Invocations [0, lanes_q) serve q, the rest k; consecutive
// invocations take consecutive units, then the next head group (BSHD) or the next token
// (BHSD), so a warp's accesses are contiguous. Each element is computed as the other kernels
// compute it, bit for bit: rotated values widen with `widen2` (exact for every value that is
// not NaN), copied suffix values with the exact `half_from_word`, and a forward's 16-bit
// output narrows with `narrow8` (the same bits as `pack_halves`).
// The tensor read is the values (forward) or the cotangent (backward), both of dtype DT_Y; the
// output is DT_Y (forward) or DT_G (backward: F32, or the F32 gradient rounded once).

override HEADS: u32 = 1u; // heads per invocation: 1, 2 or 4, dividing both head counts
override SPAN: u32 = 4u;  // elements per step: 4 (F32, 16-bit backward) or 8 (16-bit output)
override DT_G: u32 = 0u;  // backward: gradient dtype (16-bit with a 16-bit cotangent and SPAN 8)
override OVERLAP: u32 = 1u; // 1: every head's loads before any arithmetic; 0: head after head

@group(0) @binding(11) var<storage, read> values4: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read> values_k4: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read_write> out4: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read_write> out_k4: array<vec4<u32>>;

// Eight values of a step (steps of 4 use `lo` only).
struct Step {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// A head's unit: step a and (split-half rotary units) its partner step b, as read (16-bit
// values stay packed until their arithmetic: fewer registers while the loads are in flight).
struct Words {
    a: vec4<u32>,
    b: vec4<u32>,
}

struct Unit {
    a: Step,
    b: Step,
}

// The words of the step at element e (16-bit steps of 4: in `.xy`).
fn load_words(is_k: bool, e: u32) -> vec4<u32> {
    let per_word = select(8u, 4u, DT_Y == DT_F32); // elements per vec4<u32>
    var w: vec4<u32>;
    if (is_k) {
        w = values_k4[e / per_word];
    } else {
        w = values4[e / per_word];
    }
    if (DT_Y != DT_F32 && SPAN == 4u && (e & 4u) != 0u) {
        w = w.zwxy;
    }
    return w;
}

// A step's words widened; `exact` quiets NaN as `half_from_word` does (copied values).
fn widen_step(w: vec4<u32>, exact: bool) -> Step {
    if (DT_Y == DT_F32) {
        return Step(bitcast<vec4<f32>>(w), vec4<f32>());
    }
    var s: Step;
    if (exact) {
        s = Step(
            vec4(half_from_word(w.x, 0u, DT_Y), half_from_word(w.x, 1u, DT_Y),
                half_from_word(w.y, 0u, DT_Y), half_from_word(w.y, 1u, DT_Y)),
            vec4(half_from_word(w.z, 0u, DT_Y), half_from_word(w.z, 1u, DT_Y),
                half_from_word(w.w, 0u, DT_Y), half_from_word(w.w, 1u, DT_Y)));
    } else {
        s = Step(vec4(widen2(w.x, DT_Y), widen2(w.y, DT_Y)), vec4(widen2(w.z, DT_Y), widen2(w.w, DT_Y)));
    }
    if (SPAN == 4u) {
        s.hi = vec4<f32>();
    }
    return s;
}

fn put4(is_k: bool, i: u32, w: vec4<u32>) {
    if (is_k) {
        out_k4[i] = w;
    } else {
        out4[i] = w;
    }
}

// Store step v at element e of the output: 8 values of a 16-bit output (DT_Y forward, DT_G
// backward, SPAN 8) rounded once, or 4 F32.
fn store_step(is_k: bool, e: u32, v: Step, fwd: bool) {
    let dt = select(DT_G, DT_Y, fwd);
    if (dt != DT_F32) {
        put4(is_k, e / 8u, narrow8(v.lo, v.hi, dt));
        return;
    }
    put4(is_k, e / 4u, bitcast<vec4<u32>>(v.lo));
}

fn table_word(cos_side: bool, i: u32) -> u32 {
    if (cos_side) {
        return cos_table[i];
    }
    return sin_table[i];
}

// Table values e .. e + n − 1 (n = 2 or 4; e even), cos or sin side.
fn table_quad(cos_side: bool, e: u32, n: u32) -> vec4<f32> {
    if (DT_T == DT_F32) {
        var c = vec4(bitcast<f32>(table_word(cos_side, e)),
            bitcast<f32>(table_word(cos_side, e + 1u)), 0.0, 0.0);
        if (n == 4u) {
            c.z = bitcast<f32>(table_word(cos_side, e + 2u));
            c.w = bitcast<f32>(table_word(cos_side, e + 3u));
        }
        return c;
    }
    let lo = widen2(table_word(cos_side, e >> 1u), DT_T);
    if (n == 4u) {
        return vec4(lo, widen2(table_word(cos_side, (e >> 1u) + 1u), DT_T));
    }
    return vec4(lo, 0.0, 0.0);
}

// Table values e .. e + n − 1 (n = 2, 4 or 8), cos or sin side.
fn table_step(cos_side: bool, e: u32, n: u32) -> Step {
    if (n == 8u) {
        return Step(table_quad(cos_side, e, 4u), table_quad(cos_side, e + 4u, 4u));
    }
    return Step(table_quad(cos_side, e, n), vec4<f32>());
}

fn rot_units() -> u32 {
    if (INTERLEAVED == 1u) {
        return params.rot / SPAN;
    }
    return params.half / SPAN;
}

fn step_units_per_row() -> u32 {
    return rot_units() + (params.dim - params.rot) / SPAN;
}

// Two adjacent pairs p = (x1, x2, x1', x2') with coefficients (c.x, s.x), (c.y, s.y), or
// their transpose (backward).
fn turn_pairs(p: vec4<f32>, c: vec2<f32>, s: vec2<f32>, fwd: bool) -> vec4<f32> {
    if (fwd) {
        return vec4(p.x * c.x - p.y * s.x, p.y * c.x + p.x * s.x,
            p.z * c.y - p.w * s.y, p.w * c.y + p.z * s.y);
    }
    return vec4(p.x * c.x + p.y * s.x, p.y * c.x - p.x * s.x,
        p.z * c.y + p.w * s.y, p.w * c.y - p.z * s.y);
}

// Split-half rotation of four frequencies: values a with partners b.
fn turn_halves(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, s: vec4<f32>, fwd: bool) -> array<vec4<f32>, 2> {
    if (fwd) {
        return array<vec4<f32>, 2>(a * c - b * s, b * c + a * s);
    }
    return array<vec4<f32>, 2>(a * c + b * s, b * c - a * s);
}

fn rotate_step_unit(v: Unit, c: Step, s: Step, fwd: bool) -> Unit {
    if (INTERLEAVED == 1u) {
        // F32: pairs (lo.xy, lo.zw) with frequencies c.lo.xy; 16-bit: two more in hi, c.lo.zw.
        return Unit(Step(turn_pairs(v.a.lo, c.lo.xy, s.lo.xy, fwd),
            turn_pairs(v.a.hi, c.lo.zw, s.lo.zw, fwd)), v.b);
    }
    let l = turn_halves(v.a.lo, v.b.lo, c.lo, s.lo, fwd);
    let h = turn_halves(v.a.hi, v.b.hi, c.hi, s.hi, fwd);
    return Unit(Step(l[0], h[0]), Step(l[1], h[1]));
}

// Everything an invocation needs before its loads: which tensor, the elements of steps a and
// b of its first head and the distance to the next head's, the unit's kind and coefficients.
struct Work {
    is_k: bool,
    rotary: bool,
    pair: bool,       // split-half rotary unit: two steps per head
    first: vec2<u32>,
    stride: u32,
    c: Step,
    s: Step,
}

fn elements(w: Work, j: u32) -> vec2<u32> {
    return w.first + vec2(j * w.stride);
}

fn lanes_q() -> u32 {
    return params.batch * params.seq * (params.heads / HEADS) * step_units_per_row();
}

fn work_of(t: u32) -> Work {
    let lq = lanes_q();
    let is_k = t >= lq;
    var heads = params.heads;
    var i = t;
    if (is_k) {
        heads = params.heads_k;
        i = t - lq;
    }
    let units = step_units_per_row();
    let groups = heads / HEADS;
    let u = i % units;
    let rest = i / units;
    var b: u32;
    var s: u32;
    var g: u32;
    if (LAYOUT == 0u) {
        g = rest % groups;
        let token = rest / groups;
        b = token / params.seq;
        s = token % params.seq;
    } else {
        s = rest % params.seq;
        let bg = rest / params.seq;
        g = bg % groups;
        b = bg / groups;
    }
    let ru = rot_units();
    let rotary = u < ru;
    var w: Work;
    w.is_k = is_k;
    w.rotary = rotary;
    w.pair = rotary && INTERLEAVED == 0u;
    w.c = Step(vec4(0.0), vec4(0.0));
    w.s = w.c;
    if (rotary) {
        var i0 = SPAN * u;
        var n = SPAN;
        if (INTERLEAVED == 1u) {
            i0 = (SPAN / 2u) * u;
            n = SPAN / 2u;
        }
        let p = position_of(b, s, i0);
        if (p < params.table_rows) {
            w.c = table_step(true, p * params.half + i0, n);
            w.s = table_step(false, p * params.half + i0, n);
        }
    }
    let base = row_of(b, s, g * HEADS, heads) * params.dim;
    if (rotary) {
        w.first = vec2(base + SPAN * u, base + SPAN * u + params.half);
    } else {
        let e = base + params.rot + SPAN * (u - ru);
        w.first = vec2(e, e);
    }
    w.stride = params.dim;
    if (LAYOUT == 1u) {
        w.stride = params.seq * params.dim;
    }
    return w;
}

fn load_unit(w: Work, j: u32) -> Words {
    let e = elements(w, j);
    let a = load_words(w.is_k, e.x);
    var b = a;
    if (w.pair) {
        b = load_words(w.is_k, e.y);
    }
    return Words(a, b);
}

fn finish_unit(w: Work, j: u32, words: Words, fwd: bool) {
    var r = Unit(widen_step(words.a, !w.rotary), widen_step(words.b, false));
    if (w.rotary) {
        r = rotate_step_unit(r, w.c, w.s, fwd);
    }
    let e = elements(w, j);
    store_step(w.is_k, e.x, r.a, fwd);
    if (w.pair) {
        store_step(w.is_k, e.y, r.b, fwd);
    }
}

fn steps(t: u32, fwd: bool) {
    if (t >= params.pairs) {
        return;
    }
    let w = work_of(t);
    if (OVERLAP == 0u) {
        for (var j = 0u; j < HEADS; j = j + 1u) {
            finish_unit(w, j, load_unit(w, j), fwd);
        }
        return;
    }
    let v0 = load_unit(w, 0u);
    var v1 = v0;
    var v2 = v0;
    var v3 = v0;
    if (HEADS >= 2u) {
        v1 = load_unit(w, 1u);
    }
    if (HEADS == 4u) {
        v2 = load_unit(w, 2u);
        v3 = load_unit(w, 3u);
    }
    finish_unit(w, 0u, v0, fwd);
    if (HEADS >= 2u) {
        finish_unit(w, 1u, v1, fwd);
    }
    if (HEADS == 4u) {
        finish_unit(w, 2u, v2, fwd);
        finish_unit(w, 3u, v3, fwd);
    }
}

@compute @workgroup_size(WG)
fn forward_steps(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    steps(group_index(wid, nwg) * WG + lid, true);
}

@compute @workgroup_size(WG)
fn backward_steps(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    steps(group_index(wid, nwg) * WG + lid, false);
}
