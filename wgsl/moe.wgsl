// Fused mixture of experts: the routing (a stable counting sort of the token–expert slots by
// expert), the gathers and combines around the per-expert products, and the routing weights'
// gradient. The products themselves are the matmul family's.
//
// A slot is one entry f = t·K + k of the `[T, K]` top-k index; its expert index[f] (bits of an
// I32 or U32; a value ≥ E, a negative I32 included, routes nowhere). Slots are sorted by expert,
// and within an expert by f, into positions p: perm[p] = f, inverse[f] = p (NONE for a slot that
// routes nowhere).
//
// `route_count`: an invocation per (expert e, tile of TILE slots): how many slots of the tile
// go to e (`[E, tiles]`); the invocations of expert 0 also mark the tile's unrouted slots NONE.
// `route_offsets`: one workgroup; each lane turns its experts' tile counts into exclusive
// running sums and their totals, lane 0 scans the totals in expert order into starts `[E + 1]`,
// then each lane adds its experts' starts to their tile offsets. `route_scatter`: an
// invocation per (expert, tile) walks the tile in slot order writing perm and inverse.
// With a capacity C, expert e owns rows e·C .. (e + 1)·C: `route_scatter` puts its first C slots
// (slot order) there and marks the rest NONE (dropped), `pad_rows` marks the unused rows NONE.
// `gather`: rows of a `[T, width]` tensor to the `[rows, width]` sorted rows, raw bits
// (16-bit: an invocation per output word, its two halves from wherever they come), zeros for
// padding rows.
// `combine`: out[t, c] = Σ_k w[t, k]·sorted_rows[inverse[t·K + k], c] (or unweighted), k in order,
// F32, or rounded once to a 16-bit output (an invocation a word). `slot_backward`: a workgroup per sorted row p of slot f: dw_slot[p] = Σ_i dhu[p, i]·
// h[p, i] (lane-strided, then the fixed-order tree), then dhu ← w_f·dhu and h ← w_f·h in place.
// `token_values`: an invocation per slot f: the `[T, K]` gradient of the weights, dw_slot at
// its position (0 where it routes nowhere). No atomics anywhere.

override DX: u32 = 0u;   // gather: the source rows' dtype
override DW: u32 = 0u;   // the routing weights' dtype
override DO: u32 = 0u;   // combine: the output's dtype
const WG: u32 = 256u;
const TILE: u32 = 256u;
const NONE: u32 = 0xffffffffu;

struct Params {
    tokens: u32,
    k: u32,
    experts: u32,
    tiles: u32,
    width: u32,
    weighted: u32,
    rows: u32,       // sorted rows: the slots routed to some expert, or E × capacity
    capacity: u32,   // rows an expert (0: exactly its slots)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> index: array<u32>;
@group(0) @binding(2) var<storage, read_write> counts: array<u32>;
@group(0) @binding(3) var<storage, read_write> starts: array<u32>;
@group(0) @binding(4) var<storage, read_write> perm: array<u32>;
@group(0) @binding(5) var<storage, read_write> inverse: array<u32>;
@group(0) @binding(6) var<storage, read> src: array<u32>;
@group(0) @binding(7) var<storage, read> weights: array<u32>;
@group(0) @binding(8) var<storage, read> offsets: array<u32>;
@group(0) @binding(9) var<storage, read> sorted_perm: array<u32>;
@group(0) @binding(10) var<storage, read> sorted_inverse: array<u32>;
@group(0) @binding(11) var<storage, read> sorted_rows: array<f32>;
@group(0) @binding(12) var<storage, read_write> out: array<u32>;
@group(0) @binding(13) var<storage, read_write> h: array<f32>;
@group(0) @binding(14) var<storage, read_write> dhu: array<f32>;
@group(0) @binding(15) var<storage, read_write> dw_slot: array<f32>;
@group(0) @binding(16) var<storage, read> slot_values: array<f32>;

fn slots() -> u32 {
    return params.tokens * params.k;
}

fn weight_at(f: u32) -> f32 {
    if (DW == DT_F32) {
        return bitcast<f32>(weights[f]);
    }
    return half_from_word(weights[f >> 1u], f, DW);
}

// (expert, first slot, one past the last slot) of invocation g of the (expert, tile) grid.
fn expert_tile(g: u32) -> vec3<u32> {
    let e = g / params.tiles;
    let first = (g % params.tiles) * TILE;
    return vec3<u32>(e, first, min(first + TILE, slots()));
}

@compute @workgroup_size(WG)
fn route_count(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg) * WG + lid;
    if (g >= params.experts * params.tiles) {
        return;
    }
    let et = expert_tile(g);
    var n = 0u;
    for (var f = et.y; f < et.z; f = f + 1u) {
        let e = index[f];
        if (e == et.x) {
            n = n + 1u;
        }
        if (et.x == 0u && e >= params.experts) {
            inverse[f] = NONE;
        }
    }
    counts[g] = n;
}

@compute @workgroup_size(WG)
fn route_offsets(@builtin(local_invocation_index) lid: u32) {
    let tiles = params.tiles;
    for (var e = lid; e < params.experts; e = e + WG) {
        var run = 0u;
        for (var j = 0u; j < tiles; j = j + 1u) {
            let c = counts[e * tiles + j];
            counts[e * tiles + j] = run;
            run = run + c;
        }
        starts[e + 1u] = run;
    }
    storageBarrier();
    workgroupBarrier();
    if (lid == 0u) {
        starts[0] = 0u;
        for (var e = 0u; e < params.experts; e = e + 1u) {
            starts[e + 1u] = starts[e + 1u] + starts[e];
        }
    }
    storageBarrier();
    workgroupBarrier();
    for (var e = lid; e < params.experts; e = e + WG) {
        let base = starts[e];
        for (var j = 0u; j < tiles; j = j + 1u) {
            counts[e * tiles + j] = counts[e * tiles + j] + base;
        }
    }
}

@compute @workgroup_size(WG)
fn route_scatter(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg) * WG + lid;
    if (g >= params.experts * params.tiles) {
        return;
    }
    let et = expert_tile(g);
    var p = offsets[g];
    // With a capacity, expert e's rows are e·capacity.. and its slots past the capacity drop.
    let first = starts[et.x];
    for (var f = et.y; f < et.z; f = f + 1u) {
        if (index[f] == et.x) {
            if (params.capacity == 0u) {
                perm[p] = f;
                inverse[f] = p;
            } else if (p - first < params.capacity) {
                let q = et.x * params.capacity + (p - first);
                perm[q] = f;
                inverse[f] = q;
            } else {
                inverse[f] = NONE;
            }
            p = p + 1u;
        }
    }
}

// With a capacity: the rows of each expert past its slots hold NONE (gathered as zeros).
@compute @workgroup_size(WG)
fn pad_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let q = group_index(wid, nwg) * WG + lid;
    if (q >= params.experts * params.capacity) {
        return;
    }
    let e = q / params.capacity;
    if (q % params.capacity >= starts[e + 1u] - starts[e]) {
        perm[q] = NONE;
    }
}

// Element j of the sorted `[rows, width]` rows: its source element's index, or NONE for a
// padding row.
fn source_element(j: u32) -> u32 {
    let f = sorted_perm[j / params.width];
    if (f == NONE) {
        return NONE;
    }
    return (f / params.k) * params.width + j % params.width;
}

fn source_half(i: u32) -> u32 {
    if (i == NONE) {
        return 0u;
    }
    return (src[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
}

@compute @workgroup_size(WG)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let w = group_index(wid, nwg) * WG + lid;
    let elements = params.rows * params.width;
    if (DX == DT_F32) {
        if (w < elements) {
            let i = source_element(w);
            var bits = 0u;
            if (i != NONE) {
                bits = src[i];
            }
            out[w] = bits;
        }
        return;
    }
    let j = 2u * w;
    if (j >= elements) {
        return;
    }
    var word = source_half(source_element(j));
    if (j + 1u < elements) {
        word = word | (source_half(source_element(j + 1u)) << 16u);
    }
    out[w] = word;
}

// Element e of the combine: Σ_k (w[t, k]·) sorted_rows[inverse[t·K + k], c], k in order.
fn combine_value(e: u32) -> f32 {
    let t = e / params.width;
    let c = e % params.width;
    var acc = 0.0;
    for (var k = 0u; k < params.k; k = k + 1u) {
        let f = t * params.k + k;
        let p = sorted_inverse[f];
        if (p != NONE) {
            let v = sorted_rows[p * params.width + c];
            if (params.weighted != 0u) {
                acc = acc + weight_at(f) * v;
            } else {
                acc = acc + v;
            }
        }
    }
    return acc;
}

// An invocation an output word: one F32 element, or (DO 16-bit) the two elements of a word,
// each the F32 sum rounded once.
@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    let elements = params.tokens * params.width;
    if (DO == DT_F32) {
        if (i < elements) {
            out[i] = bitcast<u32>(combine_value(i));
        }
        return;
    }
    let e = 2u * i;
    if (e >= elements) {
        return;
    }
    if (e + 1u < elements) {
        out[i] = pack_halves(combine_value(e), combine_value(e + 1u), DO);
    } else {
        out[i] = half_bits(combine_value(e), DO);
    }
}

@compute @workgroup_size(WG)
fn slot_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let p = group_index(wid, nwg);
    if (p >= params.rows) {
        return;
    }
    let f = sorted_perm[p];
    var w = 0.0;
    if (f != NONE) {
        w = weight_at(f);
    }
    let base = p * params.width;
    var s = 0.0;
    for (var i = lid; i < params.width; i = i + WG) {
        let a = h[base + i];
        let d = dhu[base + i];
        s = s + d * a;
        dhu[base + i] = w * d;
        h[base + i] = w * a;
    }
    let total = workgroup_sum(s, lid);
    if (lid == 0u) {
        dw_slot[p] = total;
    }
}

@compute @workgroup_size(WG)
fn token_values(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let f = group_index(wid, nwg) * WG + lid;
    if (f >= slots()) {
        return;
    }
    let p = sorted_inverse[f];
    var v = 0.0;
    if (p != NONE) {
        v = slot_values[p];
    }
    out[f] = bitcast<u32>(v);
}
