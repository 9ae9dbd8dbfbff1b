// Stable softmax attention: a tiled forward with online softmax and a deterministic backward
// in three passes (row deltas, dK/dV per key block, dQ per query block). No atomics and no
// quadratic buffer: every score tile lives in workgroup memory only.
//
// Shapes (elements; strides come from the host, so [B,H,S,D] and [B,S,H,D] read alike):
//   query, output, d_output, d_query   [batch, q_heads, q_len, HD] at the query strides
//   key, value, d_key, d_value          [batch, kv_heads, k_len, HD] at the key strides
//   mask (optional)                     one u32 per (query, key), nonzero = visible,
//                                       batch and head strides 0 when broadcast
//   row_max, log_den                    [batch, q_heads, q_len], contiguous
//   row_info (backward scratch)         [batch, q_heads, q_len, 4]: row_max, log_den, delta, 0
//
// Numerics: scores s = q·k stay raw (unscaled); a row keeps its raw maximum m and the sum
// l = Σ exp(scale·(s − m)) (the raw maximum is subtracted before the scale is applied), and
// saves m and log(l) separately. Probabilities in the backward are exp(scale·(s − m) − log l).
// dQ and dK are accumulated unscaled and multiplied by the scale once at the end. A query row
// with no visible key has output 0, m = log l = −∞ and zero gradients.
//
// Work split: 256 invocations = 16 row lanes × 16 column lanes; every pass works on tiles of
// 32 rows × 32 columns (forward, dQ: queries × keys; dK/dV: keys × queries). Lane (r, t)
// owns rows r and r + 16: in the score phase it computes their scores against columns t and
// t + 16 of the tile (a 2 × 2 block); in the accumulation phase it owns the column pairs
// (32·c + 2t, 32·c + 2t + 1) of both rows for each 32-column head-dim chunk c, so a 16-bit
// output word always belongs to one invocation. Head dims are multiples of 8 up to 256
// (8 chunks, 16 accumulators per row and invocation). Staged rows are padded to 33 floats so
// that lanes reading different rows hit different banks.

override DT: u32 = 0u;   // storage dtype of query, key and value
override DTO: u32 = 0u;  // storage dtype of d_output
override HD: u32 = 64u;  // head dim

const WG: u32 = 256u;
const TILE: u32 = 16u;   // lanes per row; tiles are 2·TILE rows and FK = 2·TILE columns
const CW: u32 = 32u;     // head-dim columns per staged chunk
const CS: u32 = 33u;     // row stride of a staged chunk (padded: no bank conflicts by row)
const ACC: u32 = 16u;    // accumulators per invocation: 2 per chunk, HD ≤ 256

struct Params {
    batch: u32,
    q_heads: u32,
    kv_heads: u32,
    q_len: u32,
    k_len: u32,
    group: u32,      // q_heads / kv_heads
    q_sb: u32,       // query-layout strides: batch, head, sequence (head dim is contiguous)
    q_sh: u32,
    q_ss: u32,
    k_sb: u32,       // key-layout strides
    k_sh: u32,
    k_ss: u32,
    m_sb: u32,       // mask strides: batch, head, query (key is contiguous)
    m_sh: u32,
    m_sq: u32,
    has_mask: u32,
    offset: i32,     // diagonal: query i is aligned with key i + offset
    lo: i32,         // visible iff lo ≤ key − query − offset ≤ hi
    hi: i32,
    scale: f32,
    rows: u32,       // batch · q_heads · q_len (delta pass)
    same_output: u32, // F32 query: the output is the saved output, output_f32 is not written
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> query: array<u32>;
@group(0) @binding(2) var<storage, read> key: array<u32>;
@group(0) @binding(3) var<storage, read> value: array<u32>;
@group(0) @binding(4) var<storage, read> mask: array<u32>;
@group(0) @binding(5) var<storage, read> d_output: array<u32>;
@group(0) @binding(6) var<storage, read> saved_output: array<f32>;
@group(0) @binding(7) var<storage, read> row_info: array<f32>;
@group(0) @binding(8) var<storage, read_write> output: array<u32>;
@group(0) @binding(9) var<storage, read_write> output_f32: array<f32>;
@group(0) @binding(10) var<storage, read_write> row_max: array<f32>;
@group(0) @binding(11) var<storage, read_write> log_den: array<f32>;
@group(0) @binding(12) var<storage, read_write> grad_a: array<f32>;
@group(0) @binding(13) var<storage, read_write> grad_b: array<f32>;
@group(0) @binding(14) var<storage, read_write> info_out: array<f32>;


fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn load_q(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(query[i]);
    }
    return half_from_word(query[i >> 1u], i, DT);
}

fn load_k(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(key[i]);
    }
    return half_from_word(key[i >> 1u], i, DT);
}

fn load_v(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(value[i]);
    }
    return half_from_word(value[i >> 1u], i, DT);
}

fn load_do(i: u32) -> f32 {
    if (DTO == DT_F32) {
        return bitcast<f32>(d_output[i]);
    }
    return half_from_word(d_output[i >> 1u], i, DTO);
}

// Whether the band (causal / window) lets some query in [q_first, q_last] see some key in
// [k_first, k_last]. Uniform per workgroup, so a skipped tile skips its barriers everywhere.
fn block_visible(q_first: u32, q_last: u32, k_first: u32, k_last: u32) -> bool {
    let rel_min = i32(k_first) - i32(q_last) - params.offset;
    let rel_max = i32(k_last) - i32(q_first) - params.offset;
    return rel_max >= params.lo && rel_min <= params.hi;
}

// Whether query qi of (batch b, query head h) sees key kj (both in range).
fn visible(b: u32, h: u32, qi: u32, kj: u32) -> bool {
    let rel = i32(kj) - i32(qi) - params.offset;
    if (rel < params.lo || rel > params.hi) {
        return false;
    }
    if (params.has_mask != 0u) {
        return mask[b * params.m_sb + h * params.m_sh + qi * params.m_sq + kj] != 0u;
    }
    return true;
}

fn chunks() -> u32 {
    return (HD + CW - 1u) / CW;
}

// Columns of chunk ch that lie inside the head dim.
fn chunk_width(ch: u32) -> u32 {
    return min(CW, HD - ch * CW);
}

// Tiles of 2·TILE query rows × FK keys (every pass); the key chunk array holds the value
// chunk once the scores are done.
const FK: u32 = 32u;
var<workgroup> fwd_k: array<f32, 1056>;   // [FK][CS] chunk of key or value rows
var<workgroup> fwd_q: array<f32, 1056>;   // [2·TILE][CS] chunk of query rows
var<workgroup> fwd_s: array<f32, 1024>;   // [2·TILE][FK] scores, probabilities or their gradients

// Stage chunk ch of 2·TILE query rows from q0 into fwd_q; rows past the end and columns past
// the head dim read as 0.
fn stage_query_wide(lid: u32, ch: u32, q_base: u32, q0: u32) {
    for (var e = lid; e < 2u * TILE * CW; e = e + WG) {
        let rr = e / CW;
        let col = ch * CW + e % CW;
        var x = 0.0;
        if (col < HD && q0 + rr < params.q_len) {
            x = load_q(q_base + (q0 + rr) * params.q_ss + col);
        }
        fwd_q[rr * CS + e % CW] = x;
    }
}

// The same for d_output (dQ pass only: the forward binds no d_output).
fn stage_d_output_wide(lid: u32, ch: u32, q_base: u32, q0: u32) {
    for (var e = lid; e < 2u * TILE * CW; e = e + WG) {
        let rr = e / CW;
        let col = ch * CW + e % CW;
        var x = 0.0;
        if (col < HD && q0 + rr < params.q_len) {
            x = load_do(q_base + (q0 + rr) * params.q_ss + col);
        }
        fwd_q[rr * CS + e % CW] = x;
    }
}

// Stage chunk ch of FK rows from k0 of key (or of value, with `values`) into fwd_k.
fn stage_kv_wide(lid: u32, ch: u32, k_base: u32, k0: u32, values: bool) {
    for (var e = lid; e < FK * CW; e = e + WG) {
        let rr = e / CW;
        let col = ch * CW + e % CW;
        var x = 0.0;
        if (col < HD && k0 + rr < params.k_len) {
            let i = k_base + (k0 + rr) * params.k_ss + col;
            if (values) {
                x = load_v(i);
            } else {
                x = load_k(i);
            }
        }
        fwd_k[rr * CS + e % CW] = x;
    }
}

// Scores (or dO·v) of rows r, r + 16 of fwd_q against rows t, t + 16 of fwd_k over one staged
// chunk, added to `acc` in column order.
fn block_dots(r: u32, t: u32, ch: u32, acc: vec4<f32>) -> vec4<f32> {
    var s = acc;
    let w = chunk_width(ch);
    for (var c = 0u; c < w; c = c + 1u) {
        let x0 = fwd_q[r * CS + c];
        let x1 = fwd_q[(r + TILE) * CS + c];
        let y0 = fwd_k[t * CS + c];
        let y1 = fwd_k[(t + TILE) * CS + c];
        s.x = s.x + x0 * y0;
        s.y = s.y + x0 * y1;
        s.z = s.z + x1 * y0;
        s.w = s.w + x1 * y1;
    }
    return s;
}

// Online-softmax update of one query row from its FK raw scores in fwd_s (−∞ = hidden):
// returns (new maximum, rescale factor of the old accumulators).
fn row_update(row: u32, m: f32) -> vec2<f32> {
    var m_new = m;
    for (var j = 0u; j < FK; j = j + 1u) {
        m_new = max(m_new, fwd_s[row * FK + j]);
    }
    var alpha = 1.0;
    if (m_new > m) {
        if (m == neg_inf()) {
            alpha = 0.0;
        } else {
            alpha = exp(params.scale * (m - m_new));
        }
    }
    return vec2<f32>(m_new, alpha);
}

fn prob(vis: bool, s: f32, m: f32) -> f32 {
    if (vis) {
        return exp(params.scale * (s - m));
    }
    return 0.0;
}

// One workgroup per (batch, query head, block of 2·TILE query rows). Lane (r, t) owns query
// rows r and r + 16: score phase against keys t and t + 16 of each FK-key tile (a 2×2 block,
// four loads per four products), accumulation phase columns 2t and 2t + 1 of each chunk for
// both rows.
@compute @workgroup_size(256)
fn attention_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let q_tiles = (params.q_len + 2u * TILE - 1u) / (2u * TILE);
    let g = group_index(wid, nwg);
    if (g >= params.batch * params.q_heads * q_tiles) {
        return;
    }
    let qb = g % q_tiles;
    let bh = g / q_tiles;
    let h = bh % params.q_heads;
    let b = bh / params.q_heads;
    let kvh = h / params.group;
    let r = lid / TILE;
    let t = lid % TILE;
    let q0 = qb * 2u * TILE;
    let q_last = min(q0 + 2u * TILE, params.q_len) - 1u;
    let qa = q0 + r;
    let qc = qa + TILE;
    let q_base = b * params.q_sb + h * params.q_sh;
    let k_base = b * params.k_sb + kvh * params.k_sh;
    let nch = chunks();
    let k_tiles = (params.k_len + FK - 1u) / FK;

    var acc_a: array<f32, ACC>;
    var acc_c: array<f32, ACC>;
    var m_a = neg_inf();
    var m_c = neg_inf();
    var l_a = 0.0;
    var l_c = 0.0;
    for (var kb = 0u; kb < k_tiles; kb = kb + 1u) {
        let k0 = kb * FK;
        if (!block_visible(q0, q_last, k0, min(k0 + FK, params.k_len) - 1u)) {
            continue;
        }
        // Raw scores of rows r, r + 16 against keys t, t + 16, chunk by chunk in column order.
        var sc = vec4<f32>(0.0);
        for (var ch = 0u; ch < nch; ch = ch + 1u) {
            stage_query_wide(lid, ch, q_base, q0);
            stage_kv_wide(lid, ch, k_base, k0, false);
            workgroupBarrier();
            sc = block_dots(r, t, ch, sc);
            workgroupBarrier();
        }
        let s00 = sc.x;
        let s01 = sc.y;
        let s10 = sc.z;
        let s11 = sc.w;
        let kj0 = k0 + t;
        let kj1 = kj0 + TILE;
        let in0 = kj0 < params.k_len;
        let in1 = kj1 < params.k_len;
        let va0 = qa < params.q_len && in0 && visible(b, h, qa, kj0);
        let va1 = qa < params.q_len && in1 && visible(b, h, qa, kj1);
        let vc0 = qc < params.q_len && in0 && visible(b, h, qc, kj0);
        let vc1 = qc < params.q_len && in1 && visible(b, h, qc, kj1);
        fwd_s[r * FK + t] = select(neg_inf(), s00, va0);
        fwd_s[r * FK + t + TILE] = select(neg_inf(), s01, va1);
        fwd_s[(r + TILE) * FK + t] = select(neg_inf(), s10, vc0);
        fwd_s[(r + TILE) * FK + t + TILE] = select(neg_inf(), s11, vc1);
        workgroupBarrier();
        // Every lane of a row takes the same maximum and sum in the same order.
        let ua = row_update(r, m_a);
        let uc = row_update(r + TILE, m_c);
        workgroupBarrier();
        fwd_s[r * FK + t] = prob(va0, s00, ua.x);
        fwd_s[r * FK + t + TILE] = prob(va1, s01, ua.x);
        fwd_s[(r + TILE) * FK + t] = prob(vc0, s10, uc.x);
        fwd_s[(r + TILE) * FK + t + TILE] = prob(vc1, s11, uc.x);
        workgroupBarrier();
        var sum_a = 0.0;
        var sum_c = 0.0;
        for (var j = 0u; j < FK; j = j + 1u) {
            sum_a = sum_a + fwd_s[r * FK + j];
            sum_c = sum_c + fwd_s[(r + TILE) * FK + j];
        }
        l_a = l_a * ua.y + sum_a;
        l_c = l_c * uc.y + sum_c;
        m_a = ua.x;
        m_c = uc.x;
        for (var a = 0u; a < ACC; a = a + 1u) {
            acc_a[a] = acc_a[a] * ua.y;
            acc_c[a] = acc_c[a] * uc.y;
        }
        // acc += P · V, chunk by chunk (the value chunk replaces the key chunk).
        for (var ch = 0u; ch < nch; ch = ch + 1u) {
            stage_kv_wide(lid, ch, k_base, k0, true);
            workgroupBarrier();
            if (2u * t < chunk_width(ch)) {
                var a0 = acc_a[2u * ch];
                var a1 = acc_a[2u * ch + 1u];
                var c0 = acc_c[2u * ch];
                var c1 = acc_c[2u * ch + 1u];
                for (var j = 0u; j < FK; j = j + 1u) {
                    let pa = fwd_s[r * FK + j];
                    let pc = fwd_s[(r + TILE) * FK + j];
                    let v0 = fwd_k[j * CS + 2u * t];
                    let v1 = fwd_k[j * CS + 2u * t + 1u];
                    a0 = a0 + pa * v0;
                    a1 = a1 + pa * v1;
                    c0 = c0 + pc * v0;
                    c1 = c1 + pc * v1;
                }
                acc_a[2u * ch] = a0;
                acc_a[2u * ch + 1u] = a1;
                acc_c[2u * ch] = c0;
                acc_c[2u * ch + 1u] = c1;
            }
            workgroupBarrier();
        }
    }
    write_row(b, h, qa, t, q_base, nch, acc_a, m_a, l_a);
    write_row(b, h, qc, t, q_base, nch, acc_c, m_c, l_c);
}

// Output (both dtypes) and statistics of query row qi from lane t's accumulators.
fn write_row(b: u32, h: u32, qi: u32, t: u32, q_base: u32, nch: u32, acc: array<f32, ACC>,
             m: f32, l: f32) {
    if (qi >= params.q_len) {
        return;
    }
    var inv = 0.0;
    if (l > 0.0) {
        inv = 1.0 / l;
    }
    let o_base = q_base + qi * params.q_ss;
    for (var ch = 0u; ch < nch; ch = ch + 1u) {
        let col = ch * CW + 2u * t;
        if (col < HD) {
            let o0 = acc[2u * ch] * inv;
            let o1 = acc[2u * ch + 1u] * inv;
            let idx = o_base + col;
            if (params.same_output == 0u) {
                output_f32[idx] = o0;
                output_f32[idx + 1u] = o1;
            }
            if (DT == DT_F32) {
                output[idx] = bitcast<u32>(o0);
                output[idx + 1u] = bitcast<u32>(o1);
            } else {
                output[idx >> 1u] = pack_halves(o0, o1, DT);
            }
        }
    }
    if (t == 0u) {
        let row = (b * params.q_heads + h) * params.q_len + qi;
        row_max[row] = m;
        if (l > 0.0) {
            log_den[row] = log(l);
        } else {
            log_den[row] = neg_inf();
        }
    }
}

// Row statistics for the backward: info_out[row] = (row_max, log_den, delta, 0) with
// delta = Σ_d d_output · saved_output (the unrounded F32 output). One workgroup per TILE rows,
// TILE lanes per row: lane t sums columns t, t + TILE, ... in order (coalesced reads), then
// lane 0 adds the TILE partial sums in lane order.
var<workgroup> delta_parts: array<f32, 256>;

@compute @workgroup_size(256)
fn attention_delta(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let first = group_index(wid, nwg) * TILE;
    if (first >= params.rows) {
        return;
    }
    let row = first + lid / TILE;
    let t = lid % TILE;
    var part = 0.0;
    if (row < params.rows) {
        let qi = row % params.q_len;
        let bh = row / params.q_len;
        let h = bh % params.q_heads;
        let b = bh / params.q_heads;
        let base = b * params.q_sb + h * params.q_sh + qi * params.q_ss;
        for (var c = t; c < HD; c = c + TILE) {
            part = part + load_do(base + c) * saved_output[base + c];
        }
    }
    delta_parts[lid] = part;
    workgroupBarrier();
    if (t == 0u && row < params.rows) {
        var delta = 0.0;
        for (var i = 0u; i < TILE; i = i + 1u) {
            delta = delta + delta_parts[lid + i];
        }
        info_out[4u * row] = row_max[row];
        info_out[4u * row + 1u] = log_den[row];
        info_out[4u * row + 2u] = delta;
        info_out[4u * row + 3u] = 0.0;
    }
}

// Score, probability and score gradient of (query qi, key kj) from the staged chunks of the
// score phase: s and dp are the caller's running dot products.
fn score_grad(b: u32, h: u32, qi: u32, kj: u32, s: f32, dp: f32) -> vec2<f32> {
    if (qi >= params.q_len || kj >= params.k_len || !visible(b, h, qi, kj)) {
        return vec2<f32>(0.0, 0.0);
    }
    let row = (b * params.q_heads + h) * params.q_len + qi;
    let m = row_info[4u * row];
    let log_l = row_info[4u * row + 1u];
    let delta = row_info[4u * row + 2u];
    let p = exp(params.scale * (s - m) - log_l);
    return vec2<f32>(p, p * (dp - delta));
}

// One workgroup per (batch, key/value head, block of 2·TILE keys): owns those rows of d_key and
// d_value and sums over the query heads of its group, then over tiles of 2·TILE queries, then
// over the rows of a tile, always in that order. Lane (j, t): key rows j and j + 16; score
// phase against query rows t and t + 16 of the tile, accumulation phase columns 2t, 2t + 1
// of each chunk. fwd_q holds query-side chunks (query or d_output), fwd_k key-side chunks
// (key or value), fwd_s the probabilities and then the score gradients, key-major.
@compute @workgroup_size(256)
fn attention_dkdv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let k_tiles = (params.k_len + 2u * TILE - 1u) / (2u * TILE);
    let g = group_index(wid, nwg);
    if (g >= params.batch * params.kv_heads * k_tiles) {
        return;
    }
    let kb = g % k_tiles;
    let bh = g / k_tiles;
    let kvh = bh % params.kv_heads;
    let b = bh / params.kv_heads;
    let j = lid / TILE;
    let t = lid % TILE;
    let k0 = kb * 2u * TILE;
    let k_last = min(k0 + 2u * TILE, params.k_len) - 1u;
    let ka = k0 + j;
    let kc = ka + TILE;
    let k_base = b * params.k_sb + kvh * params.k_sh;
    let nch = chunks();
    let q_tiles = (params.q_len + 2u * TILE - 1u) / (2u * TILE);

    var dk_a: array<f32, ACC>;
    var dk_c: array<f32, ACC>;
    var dv_a: array<f32, ACC>;
    var dv_c: array<f32, ACC>;
    for (var gi = 0u; gi < params.group; gi = gi + 1u) {
        let h = kvh * params.group + gi;
        let q_base = b * params.q_sb + h * params.q_sh;
        for (var qb = 0u; qb < q_tiles; qb = qb + 1u) {
            let q0 = qb * 2u * TILE;
            if (!block_visible(q0, min(q0 + 2u * TILE, params.q_len) - 1u, k0, k_last)) {
                continue;
            }
            // (query t, key j), (t, j + 16), (t + 16, j), (t + 16, j + 16).
            var sc = vec4<f32>(0.0);
            for (var ch = 0u; ch < nch; ch = ch + 1u) {
                stage_query_wide(lid, ch, q_base, q0);
                stage_kv_wide(lid, ch, k_base, k0, false);
                workgroupBarrier();
                sc = block_dots(t, j, ch, sc);
                workgroupBarrier();
            }
            var dp = vec4<f32>(0.0);
            for (var ch = 0u; ch < nch; ch = ch + 1u) {
                stage_d_output_wide(lid, ch, q_base, q0);
                stage_kv_wide(lid, ch, k_base, k0, true);
                workgroupBarrier();
                dp = block_dots(t, j, ch, dp);
                workgroupBarrier();
            }
            let qt = q0 + t;
            let qu = qt + TILE;
            let g00 = score_grad(b, h, qt, ka, sc.x, dp.x);
            let g01 = score_grad(b, h, qt, kc, sc.y, dp.y);
            let g10 = score_grad(b, h, qu, ka, sc.z, dp.z);
            let g11 = score_grad(b, h, qu, kc, sc.w, dp.w);
            // dV += Pᵀ dO.
            fwd_s[j * FK + t] = g00.x;
            fwd_s[(j + TILE) * FK + t] = g01.x;
            fwd_s[j * FK + t + TILE] = g10.x;
            fwd_s[(j + TILE) * FK + t + TILE] = g11.x;
            for (var ch = 0u; ch < nch; ch = ch + 1u) {
                stage_d_output_wide(lid, ch, q_base, q0);
                workgroupBarrier();
                if (2u * t < chunk_width(ch)) {
                    var a0 = dv_a[2u * ch];
                    var a1 = dv_a[2u * ch + 1u];
                    var c0 = dv_c[2u * ch];
                    var c1 = dv_c[2u * ch + 1u];
                    for (var i = 0u; i < FK; i = i + 1u) {
                        let pa = fwd_s[j * FK + i];
                        let pc = fwd_s[(j + TILE) * FK + i];
                        let x0 = fwd_q[i * CS + 2u * t];
                        let x1 = fwd_q[i * CS + 2u * t + 1u];
                        a0 = a0 + pa * x0;
                        a1 = a1 + pa * x1;
                        c0 = c0 + pc * x0;
                        c1 = c1 + pc * x1;
                    }
                    dv_a[2u * ch] = a0;
                    dv_a[2u * ch + 1u] = a1;
                    dv_c[2u * ch] = c0;
                    dv_c[2u * ch + 1u] = c1;
                }
                workgroupBarrier();
            }
            // dK += dSᵀ Q (scaled at the end).
            fwd_s[j * FK + t] = g00.y;
            fwd_s[(j + TILE) * FK + t] = g01.y;
            fwd_s[j * FK + t + TILE] = g10.y;
            fwd_s[(j + TILE) * FK + t + TILE] = g11.y;
            for (var ch = 0u; ch < nch; ch = ch + 1u) {
                stage_query_wide(lid, ch, q_base, q0);
                workgroupBarrier();
                if (2u * t < chunk_width(ch)) {
                    var a0 = dk_a[2u * ch];
                    var a1 = dk_a[2u * ch + 1u];
                    var c0 = dk_c[2u * ch];
                    var c1 = dk_c[2u * ch + 1u];
                    for (var i = 0u; i < FK; i = i + 1u) {
                        let da = fwd_s[j * FK + i];
                        let dc = fwd_s[(j + TILE) * FK + i];
                        let x0 = fwd_q[i * CS + 2u * t];
                        let x1 = fwd_q[i * CS + 2u * t + 1u];
                        a0 = a0 + da * x0;
                        a1 = a1 + da * x1;
                        c0 = c0 + dc * x0;
                        c1 = c1 + dc * x1;
                    }
                    dk_a[2u * ch] = a0;
                    dk_a[2u * ch + 1u] = a1;
                    dk_c[2u * ch] = c0;
                    dk_c[2u * ch + 1u] = c1;
                }
                workgroupBarrier();
            }
        }
    }
    write_dkdv(ka, t, k_base, nch, dk_a, dv_a);
    write_dkdv(kc, t, k_base, nch, dk_c, dv_c);
}

fn write_dkdv(kj: u32, t: u32, k_base: u32, nch: u32, dk: array<f32, ACC>, dv: array<f32, ACC>) {
    if (kj >= params.k_len) {
        return;
    }
    let base = k_base + kj * params.k_ss;
    for (var ch = 0u; ch < nch; ch = ch + 1u) {
        let col = ch * CW + 2u * t;
        if (col < HD) {
            grad_a[base + col] = dk[2u * ch] * params.scale;
            grad_a[base + col + 1u] = dk[2u * ch + 1u] * params.scale;
            grad_b[base + col] = dv[2u * ch];
            grad_b[base + col + 1u] = dv[2u * ch + 1u];
        }
    }
}

// One workgroup per (batch, query head, block of 2·TILE query rows): owns those rows of
// d_query and sums over key tiles (FK keys), then keys of a tile, in order. Lane (r, t):
// query rows r and r + 16; score phase against keys t and t + 16 of the tile, accumulation
// phase columns 2t, 2t + 1 of each chunk.
@compute @workgroup_size(256)
fn attention_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let q_tiles = (params.q_len + 2u * TILE - 1u) / (2u * TILE);
    let g = group_index(wid, nwg);
    if (g >= params.batch * params.q_heads * q_tiles) {
        return;
    }
    let qb = g % q_tiles;
    let bh = g / q_tiles;
    let h = bh % params.q_heads;
    let b = bh / params.q_heads;
    let kvh = h / params.group;
    let r = lid / TILE;
    let t = lid % TILE;
    let q0 = qb * 2u * TILE;
    let q_last = min(q0 + 2u * TILE, params.q_len) - 1u;
    let qa = q0 + r;
    let qc = qa + TILE;
    let q_base = b * params.q_sb + h * params.q_sh;
    let k_base = b * params.k_sb + kvh * params.k_sh;
    let nch = chunks();
    let k_tiles = (params.k_len + FK - 1u) / FK;

    var dq_a: array<f32, ACC>;
    var dq_c: array<f32, ACC>;
    for (var kb = 0u; kb < k_tiles; kb = kb + 1u) {
        let k0 = kb * FK;
        if (!block_visible(q0, q_last, k0, min(k0 + FK, params.k_len) - 1u)) {
            continue;
        }
        var sc = vec4<f32>(0.0);
        for (var ch = 0u; ch < nch; ch = ch + 1u) {
            stage_query_wide(lid, ch, q_base, q0);
            stage_kv_wide(lid, ch, k_base, k0, false);
            workgroupBarrier();
            sc = block_dots(r, t, ch, sc);
            workgroupBarrier();
        }
        var dp = vec4<f32>(0.0);
        for (var ch = 0u; ch < nch; ch = ch + 1u) {
            stage_d_output_wide(lid, ch, q_base, q0);
            stage_kv_wide(lid, ch, k_base, k0, true);
            workgroupBarrier();
            dp = block_dots(r, t, ch, dp);
            workgroupBarrier();
        }
        let kj0 = k0 + t;
        let kj1 = kj0 + TILE;
        fwd_s[r * FK + t] = score_grad(b, h, qa, kj0, sc.x, dp.x).y;
        fwd_s[r * FK + t + TILE] = score_grad(b, h, qa, kj1, sc.y, dp.y).y;
        fwd_s[(r + TILE) * FK + t] = score_grad(b, h, qc, kj0, sc.z, dp.z).y;
        fwd_s[(r + TILE) * FK + t + TILE] = score_grad(b, h, qc, kj1, sc.w, dp.w).y;
        workgroupBarrier();
        for (var ch = 0u; ch < nch; ch = ch + 1u) {
            stage_kv_wide(lid, ch, k_base, k0, false);
            workgroupBarrier();
            if (2u * t < chunk_width(ch)) {
                var a0 = dq_a[2u * ch];
                var a1 = dq_a[2u * ch + 1u];
                var c0 = dq_c[2u * ch];
                var c1 = dq_c[2u * ch + 1u];
                for (var j = 0u; j < FK; j = j + 1u) {
                    let da = fwd_s[r * FK + j];
                    let dc = fwd_s[(r + TILE) * FK + j];
                    let k_0 = fwd_k[j * CS + 2u * t];
                    let k_1 = fwd_k[j * CS + 2u * t + 1u];
                    a0 = a0 + da * k_0;
                    a1 = a1 + da * k_1;
                    c0 = c0 + dc * k_0;
                    c1 = c1 + dc * k_1;
                }
                dq_a[2u * ch] = a0;
                dq_a[2u * ch + 1u] = a1;
                dq_c[2u * ch] = c0;
                dq_c[2u * ch + 1u] = c1;
            }
            workgroupBarrier();
        }
    }
    write_dq(qa, t, q_base, nch, dq_a);
    write_dq(qc, t, q_base, nch, dq_c);
}

fn write_dq(qi: u32, t: u32, q_base: u32, nch: u32, dq: array<f32, ACC>) {
    if (qi >= params.q_len) {
        return;
    }
    let base = q_base + qi * params.q_ss;
    for (var ch = 0u; ch < nch; ch = ch + 1u) {
        let col = ch * CW + 2u * t;
        if (col < HD) {
            grad_a[base + col] = dq[2u * ch] * params.scale;
            grad_a[base + col + 1u] = dq[2u * ch + 1u] * params.scale;
        }
    }
}
