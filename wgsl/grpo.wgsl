// GRPO token loss (group relative policy optimization, with its DAPO / BNPO / Dr. GRPO
// normalizations) on policy logits, forward and backward. Three passes, no atomics:
//
//   grpo_rows      one workgroup per completion token r = b·L + t: z = logits[b, t, :] / T,
//                  its maximum and log Σ exp(z − max) (one read: running pairs per lane,
//                  merged in a fixed-order tree), the
//                  token's log-probability logp = z[id] − max − log Σ, and the per-token loss
//                    c1 = exp(logp − old), c2 = clamp(c1, 1 − eps_low, 1 + eps_high),
//                    loss_t = −min(c1·A_b, c2·A_b) + beta·(exp(ref − logp) − (ref − logp) − 1)
//                  with its derivative d loss_t / d logp (−A_b·c1 where the unclipped term is
//                  the minimum, else 0; plus beta·(1 − exp(ref − logp))). Masked tokens: 0.
//   grpo_reduce    one workgroup: the loss (its normalization by loss type) and each token's
//                  weight d loss / d loss_t, in a fixed order; splits the per-token outputs.
//   grpo_backward  one workgroup per logits position: d logits = g·(onehot(id) − softmax(z))/T
//                  with g = d_loss · weight · d loss_t / d logp (0 for masked tokens and for
//                  the position past the completion when logits carry L + 1 positions).
//
// On a fused linear head (`fused_linear_grpo_loss`) the gradient is formed in the forward:
// grpo_counted flags the counted tokens and grpo_reduce turns the flags into the weights
// first (they depend on nothing else); then, per chunk of the head, after the chunk's row
// statistics, grpo_chunk takes logp = −ce of each token (replacing grpo_rows) and
// grpo_cotangent writes the cotangent of its cross-entropy, −weight · d loss_t / d logp, which
// the chunk's gradient uses at once (no grpo_backward; the backward scales the gradients by
// d_loss); grpo_reduce then forms the loss.
//
// Logits are F32, F16 or BF16 (DT; 16-bit as two halves a word), read element by element;
// rows of whole 16-byte chunks (V a multiple of 4 for F32, of 8 for 16-bit) take the chunked
// entries grpo_rows_v and grpo_backward_v instead: a lane reads 16 bytes at a time, and the
// backward stores an F32 gradient or (ODT F16/BF16, 16-bit logits) one rounded once.

override DT: u32 = 0u;
override ODT: u32 = 0u;

struct Params {
    rows: u32,        // B·L completion tokens
    seq: u32,         // L
    batch: u32,       // B
    positions: u32,   // logits positions per sequence: L or L + 1
    vocab: u32,
    temperature: f32,
    beta: f32,
    eps_low: f32,
    eps_high: f32,
    has_old: u32,
    has_ref: u32,
    has_mask: u32,
    loss_type: u32,   // 0 GRPO (per-sequence mean), 1 BNPO / DAPO (token mean), 2 Dr. GRPO
    max_len: u32,     // Dr. GRPO's normalizer B·max_len
    row0: u32,        // grpo_chunk: first token of the head's chunk
    row_count: u32,   // grpo_chunk: tokens of the chunk
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read> advantages: array<f32>;
@group(0) @binding(4) var<storage, read> old_logp: array<f32>;
@group(0) @binding(5) var<storage, read> ref_logp: array<f32>;
@group(0) @binding(6) var<storage, read> mask: array<u32>;
// Two vec4 a token: (max, log Σ, loss_t, d loss_t / d logp), (kl, clipped, logp, counted).
@group(0) @binding(7) var<storage, read_write> stats: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> loss_out: array<f32>;
@group(0) @binding(9) var<storage, read_write> weights: array<f32>;
@group(0) @binding(10) var<storage, read_write> per_token: array<f32>;
@group(0) @binding(11) var<storage, read_write> kl_out: array<f32>;
@group(0) @binding(12) var<storage, read_write> clipped_out: array<u32>;
@group(0) @binding(13) var<storage, read> d_loss: array<f32>;
@group(0) @binding(14) var<storage, read_write> d_logits: array<f32>;
// Fused head: its per-row matrix (8 values a token, the cross-entropy −logp first) and the
// cotangent of each token's cross-entropy.
@group(0) @binding(15) var<storage, read> head_rows: array<f32>;
@group(0) @binding(16) var<storage, read_write> head_cotangent: array<f32>;

// z_j of the logits row starting at element `base`.
fn z_at(base: u32, j: u32) -> f32 {
    let i = base + j;
    var x: f32;
    if (DT == DT_F32) {
        x = bitcast<f32>(logits[i]);
    } else {
        x = half_from_word(logits[i / 2u], i % 2u, DT);
    }
    return x / params.temperature;
}

// (max, log Σ exp(z − max)) of a row, reading it once: each lane keeps a running maximum and
// the sum rescaled to it over its columns (in column order), then the lanes' pairs merge in
// the fixed-order softmax tree of common/reduce.wgsl.
fn row_stats(base: u32, lid: u32) -> vec2<f32> {
    var m = pair_neg_inf();
    var s = 0.0;
    for (var j = lid; j < params.vocab; j = j + WG) {
        let z = z_at(base, j);
        if (z > m) {
            s = s * exp(m - z) + 1.0;
            m = z;
        } else if (z != pair_neg_inf()) {
            s = s + exp(z - m);
        }
    }
    let total = workgroup_pairs8(vec2<f32>(m, s), lid, PAIR_SOFTMAX);
    return vec2<f32>(total.x, log(total.y));
}

fn counted(r: u32) -> bool {
    return params.has_mask == 0u || mask[r] != 0u;
}

// Token r's terms from its log-probability (`valid`: counted and its id in range), stored
// with the row statistics `st` (max, log Σ) of its logits.
fn token_terms(r: u32, logp: f32, valid: bool, st: vec2<f32>) {
    var loss_t = 0.0;
    var d = 0.0;
    var kl = 0.0;
    var clipped = 0.0;
    if (valid) {
        let old = select(logp, old_logp[r], params.has_old != 0u);
        let a = advantages[r / params.seq];
        let c1 = exp(logp - old);
        let c2 = clamp(c1, 1.0 - params.eps_low, 1.0 + params.eps_high);
        let l1 = c1 * a;
        let l2 = c2 * a;
        loss_t = -min(l1, l2);
        d = select(0.0, -a * c1, l1 <= l2);
        clipped = select(0.0, 1.0, l2 < l1);
        if (params.has_ref != 0u) {
            let diff = ref_logp[r] - logp;
            kl = exp(diff) - diff - 1.0;
            loss_t = loss_t + params.beta * kl;
            d = d + params.beta * (1.0 - exp(diff));
        }
    }
    stats[2u * r] = vec4<f32>(st.x, st.y, loss_t, d);
    stats[2u * r + 1u] = vec4<f32>(kl, clipped, logp, select(0.0, 1.0, valid));
}

@compute @workgroup_size(WG)
fn grpo_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg);
    if (r >= params.rows) {
        return;
    }
    let b = r / params.seq;
    let t = r % params.seq;
    let base = (b * params.positions + t) * params.vocab;
    let st = row_stats(base, lid);
    if (lid == 0u) {
        let id = u32(ids[r]);
        var z = 0.0;
        if (id < params.vocab) {
            z = z_at(base, id);
        }
        token_of_row(r, z, st);
    }
}

// Token r's terms from its logit z[id] (unused for an id outside the vocabulary, which counts
// as masked: only when the host check is off) and its row statistics `st`.
fn token_of_row(r: u32, z_id: f32, st: vec2<f32>) {
    let valid = u32(ids[r]) < params.vocab;
    token_terms(r, select(0.0, z_id - st.x - st.y, valid), valid && counted(r), st);
}

// ---- Chunked entries (rows of whole 16-byte chunks) ----
@group(0) @binding(17) var<storage, read> logits4: array<vec4<u32>>;
@group(0) @binding(18) var<storage, read_write> d_logits4: array<vec4<u32>>;

// z of a chunk's values 0..3 and (16-bit) 4..7 (`chunk_lo` / `chunk_hi` of common/dtype.wgsl
// over T).
fn z_lo(w: vec4<u32>) -> vec4<f32> {
    return chunk_lo(w, DT) / params.temperature;
}

fn z_hi(w: vec4<u32>) -> vec4<f32> {
    return chunk_hi(w, DT) / params.temperature;
}

// z_j of the row starting at chunk `base4`.
fn z_at4(base4: u32, j: u32) -> f32 {
    let w = logits4[base4 + j / chunk_width(DT)];
    let k = j % chunk_width(DT);
    if (DT == DT_F32) {
        return bitcast<f32>(w[k]) / params.temperature;
    }
    return half_from_word(w[k / 2u], k, DT) / params.temperature;
}

// `row_stats` by chunks: each lane's running pair over its chunks (`online4`, the chunk's
// values in order), merged in the same fixed-order tree.
fn row_stats4(base4: u32, lid: u32) -> vec2<f32> {
    var st = vec2<f32>(pair_neg_inf(), 0.0);
    let n = params.vocab / chunk_width(DT);
    for (var c = lid; c < n; c = c + WG) {
        let w = logits4[base4 + c];
        st = online4(st, z_lo(w));
        if (DT != DT_F32) {
            st = online4(st, z_hi(w));
        }
    }
    let total = workgroup_pairs8(st, lid, PAIR_SOFTMAX);
    return vec2<f32>(total.x, log(total.y));
}

@compute @workgroup_size(WG)
fn grpo_rows_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg);
    if (r >= params.rows) {
        return;
    }
    let b = r / params.seq;
    let t = r % params.seq;
    let base4 = (b * params.positions + t) * (params.vocab / chunk_width(DT));
    let st = row_stats4(base4, lid);
    if (lid == 0u) {
        let id = u32(ids[r]);
        var z = 0.0;
        if (id < params.vocab) {
            z = z_at4(base4, id);
        }
        token_of_row(r, z, st);
    }
}

// The gradient of four values z with the position's g, id and statistics (first column j).
fn grad4(z: vec4<f32>, g: f32, j: u32, id: u32, st: vec2<f32>) -> vec4<f32> {
    if (g == 0.0) {
        return vec4<f32>(0.0);
    }
    let prob = exp((z - vec4<f32>(st.x)) - vec4<f32>(st.y));
    let hot = select(vec4<f32>(0.0), vec4<f32>(1.0), vec4<u32>(j, j + 1u, j + 2u, j + 3u) == vec4<u32>(id));
    return g * (hot - prob);
}

@compute @workgroup_size(WG)
fn grpo_backward_v(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let p = group_index(wid, nwg);
    if (p >= params.batch * params.positions) {
        return;
    }
    let n = params.vocab / chunk_width(DT);
    let base4 = p * n;
    let pt = position_terms(p);
    let g = pt.g;
    let id = pt.id;
    let st = pt.st;
    for (var c = lid; c < n; c = c + WG) {
        let w = logits4[base4 + c];
        let j = c * chunk_width(DT);
        let lo = grad4(z_lo(w), g, j, id, st);
        if (DT == DT_F32) {
            d_logits4[base4 + c] = bitcast<vec4<u32>>(lo);
            continue;
        }
        let hi = grad4(z_hi(w), g, j + 4u, id, st);
        if (ODT != DT_F32) {
            d_logits4[base4 + c] = narrow8(lo, hi, ODT);
        } else {
            d_logits4[2u * (base4 + c)] = bitcast<vec4<u32>>(lo);
            d_logits4[2u * (base4 + c) + 1u] = bitcast<vec4<u32>>(hi);
        }
    }
}

// The fused head, before it: every token's counted flag (stats[2r + 1].w; the rest 0), so
// that grpo_reduce gives the weights, which depend on the flags alone.
@compute @workgroup_size(WG)
fn grpo_counted(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg) * WG + lid;
    if (r >= params.rows) {
        return;
    }
    let valid = u32(ids[r]) < params.vocab && counted(r);
    stats[2u * r] = vec4<f32>(0.0);
    stats[2u * r + 1u] = vec4<f32>(0.0, 0.0, 0.0, select(0.0, 1.0, valid));
}

// The fused head, one chunk of tokens row0..row0 + row_count after its row statistics: each
// token's terms from logp = −ce (column 0 of the head's per-row matrix).
@compute @workgroup_size(WG)
fn grpo_chunk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.row_count) {
        return;
    }
    let r = params.row0 + i;
    let valid = u32(ids[r]) < params.vocab && counted(r);
    token_terms(r, select(0.0, -head_rows[8u * r], valid), valid, vec2<f32>(0.0));
}

// Then the cotangent of each of the chunk's cross-entropies for a unit d_loss,
// −weight · d loss_t / d logp (0 when not counted: the flag token_terms stored), which the
// head's chunk gradient takes at once. (A launch of its own: with grpo_chunk's bindings it
// would take nine storage buffers.)
@compute @workgroup_size(WG)
fn grpo_cotangent(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.row_count) {
        return;
    }
    let r = params.row0 + i;
    var g = 0.0;
    if (stats[2u * r + 1u].w != 0.0) {
        g = -weights[r] * stats[2u * r].w;
    }
    head_cotangent[r] = g;
}

// Σ over tokens first..first + count of component `c` (0: loss_t, 1: counted) in a fixed order.
fn span_sum(first: u32, count: u32, c: u32, lid: u32) -> f32 {
    var s = 0.0;
    for (var i = lid; i < count; i = i + WG) {
        let r = first + i;
        s = s + select(stats[2u * r].z, stats[2u * r + 1u].w, c == 1u);
    }
    return workgroup_sum(s, lid);
}

// Weights of tokens first..first + count: counted · scale.
fn span_weights(first: u32, count: u32, scale: f32, lid: u32) {
    for (var i = lid; i < count; i = i + WG) {
        let r = first + i;
        weights[r] = stats[2u * r + 1u].w * scale;
    }
}

@compute @workgroup_size(WG)
fn grpo_reduce(@builtin(local_invocation_index) lid: u32) {
    for (var r = lid; r < params.rows; r = r + WG) {
        let s0 = stats[2u * r];
        let s1 = stats[2u * r + 1u];
        per_token[r] = s0.z;
        kl_out[r] = s1.x;
        clipped_out[r] = u32(s1.y);
    }
    var loss = 0.0;
    if (params.loss_type == 0u) {
        // Mean over sequences of each sequence's mean over its counted tokens.
        let inv_batch = 1.0 / f32(max(params.batch, 1u));
        for (var b = 0u; b < params.batch; b = b + 1u) {
            let total = span_sum(b * params.seq, params.seq, 0u, lid);
            let count = max(span_sum(b * params.seq, params.seq, 1u, lid), 1.0);
            loss = loss + total / count;
            span_weights(b * params.seq, params.seq, inv_batch / count, lid);
        }
        loss = loss * inv_batch;
    } else {
        let total = span_sum(0u, params.rows, 0u, lid);
        var norm = f32(params.batch) * f32(params.max_len);
        if (params.loss_type == 1u) {
            norm = span_sum(0u, params.rows, 1u, lid);
        }
        norm = max(norm, 1.0);
        loss = total / norm;
        span_weights(0u, params.rows, 1.0 / norm, lid);
    }
    if (lid == 0u) {
        loss_out[0] = loss;
    }
}

// What the backward needs at logits position p: the factor g = d_loss · weight · d loss_t /
// d logp / T (0 for masked tokens and the position past the completion), the token's id and
// its row statistics.
struct PositionTerms {
    g: f32,
    id: u32,
    st: vec2<f32>,
}

fn position_terms(p: u32) -> PositionTerms {
    var out = PositionTerms(0.0, 0u, vec2<f32>(0.0));
    let t = p % params.positions;
    if (t < params.seq) {
        let r = (p / params.positions) * params.seq + t;
        let s0 = stats[2u * r];
        out.st = s0.xy;
        out.id = u32(ids[r]);
        if (stats[2u * r + 1u].w != 0.0) {
            out.g = d_loss[0] * weights[r] * s0.w / params.temperature;
        }
    }
    return out;
}

@compute @workgroup_size(WG)
fn grpo_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let p = group_index(wid, nwg);
    if (p >= params.batch * params.positions) {
        return;
    }
    let base = p * params.vocab;
    let pt = position_terms(p);
    let g = pt.g;
    let id = pt.id;
    let st = pt.st;
    for (var j = lid; j < params.vocab; j = j + WG) {
        var v = 0.0;
        if (g != 0.0) {
            let prob = exp(z_at(base, j) - st.x - st.y);
            v = g * (select(0.0, 1.0, j == id) - prob);
        }
        d_logits[base + j] = v;
    }
}

