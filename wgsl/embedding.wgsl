// Embedding: the forward gathers table rows by integer index (a bit-exact copy of the stored
// elements); the backward sorts the positions by index on the GPU and sums, for each table
// element, the cotangent rows of its positions in ascending position order.
//
// Indices (I32 or U32) are read as u32 bits: a negative I32 becomes ≥ 2³¹, and the host keeps
// the table below 2³¹ rows, so every out-of-range index, negative or too large, compares
// ≥ params.rows. Such positions gather zeros and contribute to no gradient.
//
// Backward, in four steps:
// 1. `sort_blocks`: key (row, position) per position — (0xffffffff, position) for positions
//    that give no gradient (out of range, padding, past the end of the padded length) — and a
//    bitonic sort of each block of SORT_BLOCK keys in workgroup memory.
// 2. `merge_global` (one compare-exchange step at distance ≥ SORT_BLOCK) and `merge_blocks`
//    (the steps at distances < SORT_BLOCK, in workgroup memory) finish the bitonic network.
//    Keys are distinct (the position is part of the key), so the sorted order is unique: the
//    network's schedule cannot change it.
// 3. `run_starts`: the first key of each row's run is found (the key before it has another
//    row) and its index + 1 written to starts[row]; every row has at most one such key, so
//    each entry has one writer. Rows without keys keep the 0 the host cleared them to.
// 4. `table_grad`: one invocation per table element (row, column) adds the cotangents of the
//    row's positions in ascending position order (four loads in flight, the additions still
//    one after another). Rows with no position get 0. `table_grad_vec4` does the same for
//    four consecutive columns at once when the width is a multiple of 4.
//
// The forward copies whole vec4s (`gather_vec4`) when rows are whole vec4s.
//
// max_norm (PyTorch's renormalization, made functional): `row_scales` computes, per position
// (or per table row), s = max_norm / (‖row‖_p + 1e-7) when the row's p-norm (p = norm_type)
// exceeds max_norm, else 1 (one workgroup per row; FP32 sums of squares, magnitudes or
// pow(|w|, p), or the largest magnitude, in a fixed-order tree); `gather_scaled`
// gathers the rows times their position's scale (rows with s = 1 are copied bit-exactly) and
// `renorm_table` writes a copy of the table with each referenced row (starts[row] ≠ 0, from the
// sort of the backward) scaled.
//
// scale_grad_by_freq (F_FREQ): `table_grad` divides each row's sum by the number of positions
// that reference the row (the length of its run of sorted keys), rounded to nearest even
// (`div_rn`: WGSL's `/` need not be).

override DT: u32 = 0u;       // forward: table dtype; table_grad: cotangent dtype
const WG: u32 = 256u;
const UNROLL: u32 = 4u;       // gather: words per invocation, WG apart
const SORT_BLOCK: u32 = 2048u; // keys per workgroup in the local stages (eight per invocation)
const PAIRS_PER: u32 = SORT_BLOCK / (2u * WG); // compare-exchanges per invocation and step
const NO_ROW: u32 = 0xffffffffu;
const F_FREQ: u32 = 1u;       // table_grad: divide by the row's position count
const F_TABLE_ROWS: u32 = 2u; // row_scales: item n is table row n (else the row of position n)

struct Params {
    count: u32,      // gather: output elements; sort: padded key count; table_grad: threads
    words: u32,      // gather: output words (gather_vec4: output vec4s)
    dim: u32,        // D
    rows: u32,       // V
    positions: u32,  // N
    padding: u32,    // padding row, NO_ROW for none
    k: u32,          // bitonic: length of the runs being merged
    j: u32,          // bitonic: compare distance
    flags: u32,
    max_norm: f32,
    norm_type: f32,  // p of the norm max_norm bounds (> 0; +inf: largest magnitude)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read> indices: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<storage, read_write> keys: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read> dy: array<u32>;
@group(0) @binding(6) var<storage, read> sorted: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> dtable: array<u32>;
@group(0) @binding(8) var<storage, read_write> starts: array<u32>;
@group(0) @binding(9) var<storage, read> run_start: array<u32>;
@group(0) @binding(11) var<storage, read> table4: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read_write> out4: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read_write> dtable4: array<vec4<f32>>;
@group(0) @binding(14) var<storage, read> dy4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read_write> scales: array<f32>;
@group(0) @binding(15) var<storage, read> scale_in: array<f32>;

var<workgroup> block_keys: array<vec2<u32>, SORT_BLOCK>;

// ---- forward ----

// Storage bits of output element e: an F32 word, or the 16 bits of a half (0 out of range).
fn gathered(e: u32) -> u32 {
    let p = e / params.dim;
    let c = e - p * params.dim;
    let row = indices[p];
    if (row >= params.rows) {
        return 0u;
    }
    let t = row * params.dim + c;
    if (DT == DT_F32) {
        return table[t];
    }
    return (table[t >> 1u] >> ((t & 1u) * 16u)) & 0xffffu;
}

// Output word w: one F32 element, or the 16-bit pair (2w, 2w + 1); with an even width both
// halves come from one table word, copied whole. The padding half of an odd count stays 0.
fn gather_word(w: u32) -> u32 {
    if (DT == DT_F32) {
        return gathered(w);
    }
    let e = 2u * w;
    if ((params.dim & 1u) == 0u) {
        let p = e / params.dim;
        let row = indices[p];
        if (row >= params.rows) {
            return 0u;
        }
        return table[(row * params.dim + (e - p * params.dim)) >> 1u];
    }
    var word = gathered(e);
    if (e + 1u < params.count) {
        word = word | (gathered(e + 1u) << 16u);
    }
    return word;
}

@compute @workgroup_size(WG)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * WG * UNROLL + lid;
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let w = base + u * WG;
        if (w < params.words) {
            out[w] = gather_word(w);
        }
    }
}

// Output vec4 v: 4 F32 or 8 16-bit elements of one row, copied as one vec4 (the width is a
// multiple of the elements of a vec4, so rows start on vec4 boundaries).
@compute @workgroup_size(WG)
fn gather_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * WG * UNROLL + lid;
    var per_vec = 8u;
    if (DT == DT_F32) {
        per_vec = 4u;
    }
    let row_vecs = params.dim / per_vec;
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let v = base + u * WG;
        if (v < params.words) {
            let p = v / row_vecs;
            let row = indices[p];
            var x = vec4<u32>(0u);
            if (row < params.rows) {
                x = table4[row * row_vecs + (v - p * row_vecs)];
            }
            out4[v] = x;
        }
    }
}

// ---- max_norm ----

fn table_value(t: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(table[t]);
    }
    return half_from_word(table[t >> 1u], t, DT);
}

// scales[n] for item n < params.count: the renormalization factor of its row (1 for a row
// within max_norm or an out-of-range index).
@compute @workgroup_size(WG)
fn row_scales(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let n = group_index(wid, nwg);
    if (n >= params.count) {
        return;
    }
    var row = n;
    if ((params.flags & F_TABLE_ROWS) == 0u) {
        row = indices[n];
    }
    if (row >= params.rows) {
        if (lid == 0u) {
            scales[n] = 1.0;
        }
        return;
    }
    let d = params.dim;
    let p = params.norm_type;
    let inf = p > 3.0e38;
    var acc = 0.0;
    for (var c = lid; c < d; c = c + WG) {
        let v = table_value(row * d + c);
        if (p == 2.0) {
            acc = acc + v * v;
        } else if (p == 1.0) {
            acc = acc + abs(v);
        } else if (inf) {
            acc = max(acc, abs(v));
        } else if (v != 0.0) {
            acc = acc + pow(abs(v), p);
        }
    }
    var norm = 0.0;
    if (p == 2.0) {
        norm = sqrt(workgroup_sum(acc, lid));
    } else if (p == 1.0) {
        norm = workgroup_sum(acc, lid);
    } else if (inf) {
        norm = workgroup_max(acc, lid);
    } else {
        let total = workgroup_sum(acc, lid);
        if (total > 0.0) {
            norm = pow(total, 1.0 / p);
        }
    }
    if (lid == 0u) {
        var s = 1.0;
        if (norm > params.max_norm) {
            s = params.max_norm / (norm + 1e-7);
        }
        scales[n] = s;
    }
}

// Storage bits of element t of the table times s (the stored bits when s = 1).
fn scaled_bits(t: u32, s: f32) -> u32 {
    if (DT == DT_F32) {
        if (s == 1.0) {
            return table[t];
        }
        return bitcast<u32>(bitcast<f32>(table[t]) * s);
    }
    let h = (table[t >> 1u] >> ((t & 1u) * 16u)) & 0xffffu;
    if (s == 1.0) {
        return h;
    }
    return half_bits(half_from_word(table[t >> 1u], t, DT) * s, DT);
}

// Output element e of the renormalized gather (0 out of range), as storage bits.
fn gathered_scaled(e: u32) -> u32 {
    let p = e / params.dim;
    let row = indices[p];
    if (row >= params.rows) {
        return 0u;
    }
    return scaled_bits(row * params.dim + (e - p * params.dim), scale_in[p]);
}

@compute @workgroup_size(WG)
fn gather_scaled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let w = group_index(wid, nwg) * WG + lid;
    if (w >= params.words) {
        return;
    }
    if (DT == DT_F32) {
        out[w] = gathered_scaled(w);
        return;
    }
    let e = 2u * w;
    var word = gathered_scaled(e);
    if (e + 1u < params.count) {
        word = word | (gathered_scaled(e + 1u) << 16u);
    }
    out[w] = word;
}

// Word w of the renormalized copy of the table: rows with a run start (referenced by some
// position) scaled by scale_in[row], every other row copied.
fn renormed(t: u32) -> u32 {
    let row = t / params.dim;
    var s = 1.0;
    if (run_start[row] != 0u) {
        s = scale_in[row];
    }
    return scaled_bits(t, s);
}

@compute @workgroup_size(WG)
fn renorm_table(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let w = group_index(wid, nwg) * WG + lid;
    if (w >= params.words) {
        return;
    }
    if (DT == DT_F32) {
        out[w] = renormed(w);
        return;
    }
    let e = 2u * w;
    var word = renormed(e);
    if (e + 1u < params.count) {
        word = word | (renormed(e + 1u) << 16u);
    }
    out[w] = word;
}

// ---- backward: sort ----

fn key_less(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

fn initial_key(i: u32) -> vec2<u32> {
    if (i >= params.positions) {
        return vec2(NO_ROW, i);
    }
    let row = indices[i];
    if (row >= params.rows || row == params.padding) {
        return vec2(NO_ROW, i);
    }
    return vec2(row, i);
}

// Bitonic steps at distances j0, j0/2, ..., 1 for runs of length k, on the block of keys in
// workgroup memory whose first key has global index `base`. Invocation lid compares the pairs
// (a, a + j) numbered lid + r·WG; the run's direction comes from the global index, as in
// `merge_global`.
fn local_steps(base: u32, lid: u32, k: u32, j0: u32) {
    for (var j = j0; j > 0u; j = j >> 1u) {
        for (var r = 0u; r < PAIRS_PER; r = r + 1u) {
            let q = lid + r * WG;
            let a = (q / j) * 2u * j + q % j;
            let b = a + j;
            let ascending = ((base + a) & k) == 0u;
            let x = block_keys[a];
            let y = block_keys[b];
            if (key_less(y, x) == ascending) {
                block_keys[a] = y;
                block_keys[b] = x;
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(WG)
fn sort_blocks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * SORT_BLOCK;
    if (base >= params.count) {
        return;
    }
    for (var r = 0u; r < SORT_BLOCK / WG; r = r + 1u) {
        block_keys[lid + r * WG] = initial_key(base + lid + r * WG);
    }
    workgroupBarrier();
    for (var k = 2u; k <= SORT_BLOCK; k = k << 1u) {
        local_steps(base, lid, k, k >> 1u);
    }
    for (var r = 0u; r < SORT_BLOCK / WG; r = r + 1u) {
        keys[base + lid + r * WG] = block_keys[lid + r * WG];
    }
}

@compute @workgroup_size(WG)
fn merge_blocks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * SORT_BLOCK;
    if (base >= params.count) {
        return;
    }
    for (var r = 0u; r < SORT_BLOCK / WG; r = r + 1u) {
        block_keys[lid + r * WG] = keys[base + lid + r * WG];
    }
    workgroupBarrier();
    local_steps(base, lid, params.k, SORT_BLOCK >> 1u);
    for (var r = 0u; r < SORT_BLOCK / WG; r = r + 1u) {
        keys[base + lid + r * WG] = block_keys[lid + r * WG];
    }
}

@compute @workgroup_size(WG)
fn merge_global(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.count / 2u) {
        return;
    }
    let j = params.j;
    let a = (i / j) * 2u * j + i % j;
    let b = a + j;
    let x = keys[a];
    let y = keys[b];
    if (key_less(y, x) == ((a & params.k) == 0u)) {
        keys[a] = y;
        keys[b] = x;
    }
}

// ---- backward: table gradient ----

fn load_dy(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(dy[i]);
    }
    return half_from_word(dy[i >> 1u], i, DT);
}

// starts[row] = 1 + index of the row's first key, for the rows that have keys.
@compute @workgroup_size(WG)
fn run_starts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.positions) {
        return;
    }
    let row = sorted[i].x;
    if (row == NO_ROW) {
        return;
    }
    if (i == 0u || sorted[i - 1u].x != row) {
        starts[row] = i + 1u;
    }
}

@compute @workgroup_size(WG)
fn table_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.count) {
        return;
    }
    let d = params.dim;
    let row = t / d;
    let c = t - row * d;
    let first = run_start[row];
    var acc = 0.0;
    if (first != 0u) {
        let n = params.positions;
        var i = first - 1u;
        // Keys are sorted: when key i + 3 belongs to the row, so do i .. i + 2.
        while (i + 3u < n && sorted[i + 3u].x == row) {
            let v0 = load_dy(sorted[i].y * d + c);
            let v1 = load_dy(sorted[i + 1u].y * d + c);
            let v2 = load_dy(sorted[i + 2u].y * d + c);
            let v3 = load_dy(sorted[i + 3u].y * d + c);
            acc = acc + v0;
            acc = acc + v1;
            acc = acc + v2;
            acc = acc + v3;
            i = i + 4u;
        }
        while (i < n && sorted[i].x == row) {
            acc = acc + load_dy(sorted[i].y * d + c);
            i = i + 1u;
        }
        if ((params.flags & F_FREQ) != 0u) {
            acc = div_rn(acc, f32(i - (first - 1u)));
        }
    }
    dtable[t] = bitcast<u32>(acc);
}

// Four consecutive cotangent elements from element e (a multiple of 4).
fn load_dy4(e: u32) -> vec4<f32> {
    if (DT == DT_F32) {
        return bitcast<vec4<f32>>(dy4[e >> 2u]);
    }
    let lo = dy[e >> 1u];
    let hi = dy[(e >> 1u) + 1u];
    return vec4(half_from_word(lo, 0u, DT), half_from_word(lo, 1u, DT),
                half_from_word(hi, 0u, DT), half_from_word(hi, 1u, DT));
}

// `table_grad` for widths that are multiples of 4: invocation t owns columns 4c .. 4c + 3 of
// one row (t = row·D/4 + c) and writes them as one vec4; each column's sum is taken in the same
// order as in `table_grad`, so the bits are the same.
@compute @workgroup_size(WG)
fn table_grad_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.count) {
        return;
    }
    let d = params.dim;
    let row_vecs = d / 4u;
    let row = t / row_vecs;
    let c = 4u * (t - row * row_vecs);
    let first = run_start[row];
    var acc = vec4<f32>(0.0);
    if (first != 0u) {
        let n = params.positions;
        var i = first - 1u;
        while (i + 3u < n && sorted[i + 3u].x == row) {
            let v0 = load_dy4(sorted[i].y * d + c);
            let v1 = load_dy4(sorted[i + 1u].y * d + c);
            let v2 = load_dy4(sorted[i + 2u].y * d + c);
            let v3 = load_dy4(sorted[i + 3u].y * d + c);
            acc = acc + v0;
            acc = acc + v1;
            acc = acc + v2;
            acc = acc + v3;
            i = i + 4u;
        }
        while (i < n && sorted[i].x == row) {
            acc = acc + load_dy4(sorted[i].y * d + c);
            i = i + 1u;
        }
        if ((params.flags & F_FREQ) != 0u) {
            let count = f32(i - (first - 1u));
            acc = vec4<f32>(div_rn(acc.x, count), div_rn(acc.y, count), div_rn(acc.z, count),
                            div_rn(acc.w, count));
        }
    }
    dtable4[t] = acc;
}
