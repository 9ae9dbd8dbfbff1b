// Elementwise activations, unary (`act(m_g·gate)·m_d`) and gated (`act(m_g·gate)·up·m_d`),
// forward and backward, FP32 math whatever the storage dtype.
//
// Each pair of output elements (2j, 2j+1) belongs to one invocation (which handles UNROLL
// pairs, WG apart): a 16-bit output word holds exactly that pair and f32 outputs take one
// word each, so no two invocations write one word for any element count. The packed layout
// reads gate and up from one [rows, 2·width] tensor (gate = first half of each row, up =
// second half) and writes its F32 gradient in the same layout; each invocation then owns the
// gradient words of its own elements.

override KIND: u32 = 0u;     // Activation::code()
override DT_G: u32 = 0u;     // gate (or packed input) dtype
override DT_U: u32 = 0u;     // up dtype
override DT_Y: u32 = 0u;     // output dtype (forward) / cotangent dtype (backward)
override PACKED: u32 = 0u;   // 1: gate and up are halves of each row of one tensor
const WG: u32 = 256u;
const UNROLL: u32 = 4u; // pairs per invocation, WG apart (coalesced, four loads in flight)

struct Params {
    count: u32,       // output elements
    pairs: u32,       // ceil(count / 2)
    width: u32,       // packed: output row width (gate half width); else unused
    gate_mult: f32,   // m_g: the activation sees m_g·gate
    down_mult: f32,   // m_d: the output is scaled by m_d
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> gate: array<u32>;
@group(0) @binding(2) var<storage, read> up: array<u32>;
@group(0) @binding(3) var<storage, read> dy: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> dgate: array<u32>;
@group(0) @binding(6) var<storage, read_write> dup: array<u32>;

// ---- math (formulas in wgsl/common/activation.wgsl) ----

fn act(x: f32) -> vec2<f32> {
    return activation_eval(KIND, x);
}

// ---- storage access ----

fn load_gate(i: u32, dt: u32) -> f32 {
    if (dt == DT_F32) {
        return bitcast<f32>(gate[i]);
    }
    return half_from_word(gate[i >> 1u], i, dt);
}

fn load_up(i: u32, dt: u32) -> f32 {
    if (dt == DT_F32) {
        return bitcast<f32>(up[i]);
    }
    return half_from_word(up[i >> 1u], i, dt);
}

fn load_dy(i: u32) -> f32 {
    if (DT_Y == DT_F32) {
        return bitcast<f32>(dy[i]);
    }
    return half_from_word(dy[i >> 1u], i, DT_Y);
}

// Elements (i, i + 1) of a tensor in the separate layout, i even: one word for 16-bit storage
// (its padding half reads as 0), two for f32 (the second only when it exists).
fn load_gate2(i: u32, has_second: bool) -> vec2<f32> {
    if (DT_G == DT_F32) {
        var b = 0.0;
        if (has_second) {
            b = bitcast<f32>(gate[i + 1u]);
        }
        return vec2(bitcast<f32>(gate[i]), b);
    }
    let w = gate[i >> 1u];
    return vec2(half_from_word(w, 0u, DT_G), half_from_word(w, 1u, DT_G));
}

fn load_up2(i: u32, has_second: bool) -> vec2<f32> {
    if (DT_U == DT_F32) {
        var b = 0.0;
        if (has_second) {
            b = bitcast<f32>(up[i + 1u]);
        }
        return vec2(bitcast<f32>(up[i]), b);
    }
    let w = up[i >> 1u];
    return vec2(half_from_word(w, 0u, DT_U), half_from_word(w, 1u, DT_U));
}

fn load_dy2(i: u32, has_second: bool) -> vec2<f32> {
    if (DT_Y == DT_F32) {
        var b = 0.0;
        if (has_second) {
            b = bitcast<f32>(dy[i + 1u]);
        }
        return vec2(bitcast<f32>(dy[i]), b);
    }
    let w = dy[i >> 1u];
    return vec2(half_from_word(w, 0u, DT_Y), half_from_word(w, 1u, DT_Y));
}

// Storage index of output element i's gate; its up is `width` further in packed layout.
// Packed layout: storage index of the gate of output elements i and i + 1 (one division per
// pair; the up of each is `width` further). Element i + 1 starts the next row when i ends one.
fn packed_gate_indices(i: u32) -> vec2<u32> {
    let r = i / params.width;
    let c = i - r * params.width;
    let first = i + r * params.width;
    var second = first + 1u;
    if (c + 1u == params.width) {
        second = second + params.width;
    }
    return vec2(first, second);
}

fn store_pair(pair: u32, a: f32, b: f32, has_second: bool) {
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

fn pair_of(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return group_index(wid, nwg) * WG + lid;
}

// ---- entry points ----

fn forward_unary_pair(pair: u32) {
    let i = pair * 2u;
    let has_second = i + 1u < params.count;
    let g = load_gate2(i, has_second) * params.gate_mult;
    let a = act(g.x).x * params.down_mult;
    let b = act(g.y).x * params.down_mult;
    store_pair(pair, a, b, has_second);
}

@compute @workgroup_size(WG)
fn forward_unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * WG * UNROLL + lid;
    for (var k = 0u; k < UNROLL; k = k + 1u) {
        let pair = base + k * WG;
        if (pair < params.pairs) {
            forward_unary_pair(pair);
        }
    }
}

// Gated forward of the element whose gate is at storage index gi and up at ui.
fn gated_value(gi: u32, ui: u32) -> f32 {
    let g = load_gate(gi, DT_G);
    var u: f32;
    if (PACKED == 1u) {
        u = load_gate(ui, DT_G);
    } else {
        u = load_up(ui, DT_U);
    }
    return act(params.gate_mult * g).x * u * params.down_mult;
}

fn forward_gated_pair(pair: u32) {
    let i = pair * 2u;
    let has_second = i + 1u < params.count;
    var a: f32;
    var b = 0.0;
    if (PACKED == 1u) {
        let gi = packed_gate_indices(i);
        a = gated_value(gi.x, gi.x + params.width);
        if (has_second) {
            b = gated_value(gi.y, gi.y + params.width);
        }
    } else {
        let g = load_gate2(i, has_second) * params.gate_mult;
        let u = load_up2(i, has_second);
        a = act(g.x).x * u.x * params.down_mult;
        b = act(g.y).x * u.y * params.down_mult;
    }
    store_pair(pair, a, b, has_second);
}

@compute @workgroup_size(WG)
fn forward_gated(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * WG * UNROLL + lid;
    for (var k = 0u; k < UNROLL; k = k + 1u) {
        let pair = base + k * WG;
        if (pair < params.pairs) {
            forward_gated_pair(pair);
        }
    }
}

fn backward_unary_pair(pair: u32) {
    let i = pair * 2u;
    let has_second = i + 1u < params.count;
    let g = load_gate2(i, has_second) * params.gate_mult;
    let dys = load_dy2(i, has_second) * (params.down_mult * params.gate_mult);
    dgate[i] = bitcast<u32>(dys.x * act(g.x).y);
    if (has_second) {
        dgate[i + 1u] = bitcast<u32>(dys.y * act(g.y).y);
    }
}

@compute @workgroup_size(WG)
fn backward_unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * WG * UNROLL + lid;
    for (var k = 0u; k < UNROLL; k = k + 1u) {
        let pair = base + k * WG;
        if (pair < params.pairs) {
            backward_unary_pair(pair);
        }
    }
}

fn backward_gated_pair(pair: u32) {
    let i = pair * 2u;
    let has_second = i + 1u < params.count;
    let g = load_gate2(i, has_second) * params.gate_mult;
    let u = load_up2(i, has_second);
    let dys = load_dy2(i, has_second) * params.down_mult;
    let a0 = act(g.x);
    dgate[i] = bitcast<u32>(dys.x * u.x * a0.y * params.gate_mult);
    dup[i] = bitcast<u32>(dys.x * a0.x);
    if (has_second) {
        let a1 = act(g.y);
        dgate[i + 1u] = bitcast<u32>(dys.y * u.y * a1.y * params.gate_mult);
        dup[i + 1u] = bitcast<u32>(dys.y * a1.x);
    }
}

@compute @workgroup_size(WG)
fn backward_gated(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * WG * UNROLL + lid;
    for (var k = 0u; k < UNROLL; k = k + 1u) {
        let pair = base + k * WG;
        if (pair < params.pairs) {
            backward_gated_pair(pair);
        }
    }
}

// Packed layout: the F32 gradient [rows, 2·width] has the input's layout; dgate holds both
// halves (this invocation's gate and up elements).
fn backward_packed_pair(pair: u32) {
    let first = pair * 2u;
    let idx = packed_gate_indices(first);
    let n = min(2u, params.count - first);
    for (var k = 0u; k < n; k = k + 1u) {
        let i = first + k;
        var gi = idx.x;
        if (k == 1u) {
            gi = idx.y;
        }
        let ui = gi + params.width;
        let g = load_gate(gi, DT_G);
        let u = load_gate(ui, DT_G);
        let a = act(params.gate_mult * g);
        let dys = load_dy(i) * params.down_mult;
        dgate[gi] = bitcast<u32>(dys * u * a.y * params.gate_mult);
        dgate[ui] = bitcast<u32>(dys * a.x);
    }
}

@compute @workgroup_size(WG)
fn backward_packed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let base = group_index(wid, nwg) * WG * UNROLL + lid;
    for (var k = 0u; k < UNROLL; k = k + 1u) {
        let pair = base + k * WG;
        if (pair < params.pairs) {
            backward_packed_pair(pair);
        }
    }
}

// erf of each element (F32 out): wgrad's erf exposed for testing and reuse.
@compute @workgroup_size(WG)
fn erf_values(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = pair_of(wid, nwg, lid);
    if (i >= params.count) {
        return;
    }
    out[i] = bitcast<u32>(erf_f32(load_gate(i, DT_G)));
}

// ---- chunk kernels: element counts (packed: row widths) that are multiples of 8 ----
// A chunk is 8 consecutive elements: two vec4<u32> of F32 storage or one of 16-bit storage
// (four words of two halves), so every load and store is 16 bytes. Each invocation takes
// CHUNKS chunks WG apart, issues all their loads before any arithmetic (the chunk index is
// clamped to the last chunk, so the loads need no branch) and stores the chunks that exist.
// The arithmetic of each element is the per-element kernels' own, in the same order, so
// both paths give the same bits.

const CHUNKS: u32 = 2u;

@group(0) @binding(7) var<storage, read> gate4: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> up4: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> dy4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read_write> out4: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read_write> dgate4: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read_write> dup4: array<vec4<u32>>;

// Eight values in FP32: elements 0..3 in `lo`, 4..7 in `hi`.
struct Chunk {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn widen_chunk(w: vec4<u32>, dt: u32) -> Chunk {
    return Chunk(vec4(widen2(w.x, dt), widen2(w.y, dt)), vec4(widen2(w.z, dt), widen2(w.w, dt)));
}

fn narrow_chunk(c: Chunk, dt: u32) -> vec4<u32> {
    return vec4(narrow2(c.lo.xy, dt), narrow2(c.lo.zw, dt), narrow2(c.hi.xy, dt),
        narrow2(c.hi.zw, dt));
}

// Chunk c of gate (packed: of the packed input, which also holds up).
fn gate_chunk(c: u32) -> Chunk {
    if (DT_G == DT_F32) {
        return Chunk(bitcast<vec4<f32>>(gate4[2u * c]), bitcast<vec4<f32>>(gate4[2u * c + 1u]));
    }
    return widen_chunk(gate4[c], DT_G);
}

fn up_chunk(c: u32) -> Chunk {
    if (PACKED == 1u) {
        return gate_chunk(c);
    }
    if (DT_U == DT_F32) {
        return Chunk(bitcast<vec4<f32>>(up4[2u * c]), bitcast<vec4<f32>>(up4[2u * c + 1u]));
    }
    return widen_chunk(up4[c], DT_U);
}

fn dy_chunk(c: u32) -> Chunk {
    if (DT_Y == DT_F32) {
        return Chunk(bitcast<vec4<f32>>(dy4[2u * c]), bitcast<vec4<f32>>(dy4[2u * c + 1u]));
    }
    return widen_chunk(dy4[c], DT_Y);
}

fn store_out_chunk(c: u32, v: Chunk) {
    if (DT_Y == DT_F32) {
        out4[2u * c] = bitcast<vec4<u32>>(v.lo);
        out4[2u * c + 1u] = bitcast<vec4<u32>>(v.hi);
    } else {
        out4[c] = narrow_chunk(v, DT_Y);
    }
}

fn store_dgate_chunk(c: u32, v: Chunk) {
    dgate4[2u * c] = bitcast<vec4<u32>>(v.lo);
    dgate4[2u * c + 1u] = bitcast<vec4<u32>>(v.hi);
}

fn store_dup_chunk(c: u32, v: Chunk) {
    dup4[2u * c] = bitcast<vec4<u32>>(v.lo);
    dup4[2u * c + 1u] = bitcast<vec4<u32>>(v.hi);
}

// Gate chunk index of output chunk c: c itself, or in the packed layout c plus the up halves
// of the rows before it (`width` counts chunks here); the up chunk is `width` further.
fn gate_chunk_index(c: u32) -> u32 {
    if (PACKED == 1u) {
        return c + (c / params.width) * params.width;
    }
    return c;
}

fn up_chunk_index(gi: u32) -> u32 {
    if (PACKED == 1u) {
        return gi + params.width;
    }
    return gi;
}

// act(v)·m per element (unary forward; v already scaled by m_g).
fn unary4(v: vec4<f32>, m: f32) -> vec4<f32> {
    return vec4(act(v.x).x * m, act(v.y).x * m, act(v.z).x * m, act(v.w).x * m);
}

// act(g)·u·m per element (gated forward; g already scaled by m_g).
fn gated4(g: vec4<f32>, u: vec4<f32>, m: f32) -> vec4<f32> {
    return vec4(act(g.x).x * u.x * m, act(g.y).x * u.y * m, act(g.z).x * u.z * m,
        act(g.w).x * u.w * m);
}

// dy·act'(g) per element (unary backward; dy already scaled by m_d·m_g).
fn unary_grad4(g: vec4<f32>, d: vec4<f32>) -> vec4<f32> {
    return vec4(d.x * act(g.x).y, d.y * act(g.y).y, d.z * act(g.z).y, d.w * act(g.w).y);
}

// Gated backward of four elements (dy already scaled by m_d): (dgate, dup).
struct Grads4 {
    dg: vec4<f32>,
    du: vec4<f32>,
}

fn gated_grad1(g: f32, u: f32, d: f32) -> vec2<f32> {
    let a = act(g);
    return vec2(d * u * a.y * params.gate_mult, d * a.x);
}

fn gated_grad4(g: vec4<f32>, u: vec4<f32>, d: vec4<f32>) -> Grads4 {
    let x = gated_grad1(g.x, u.x, d.x);
    let y = gated_grad1(g.y, u.y, d.y);
    let z = gated_grad1(g.z, u.z, d.z);
    let w = gated_grad1(g.w, u.w, d.w);
    return Grads4(vec4(x.x, y.x, z.x, w.x), vec4(x.y, y.y, z.y, w.y));
}

// The chunks of one invocation: the first, and CHUNKS − 1 more WG apart (clamped to the last).
fn first_chunk(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return group_index(wid, nwg) * WG * CHUNKS + lid;
}

@compute @workgroup_size(WG)
fn forward_unary_chunks(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c0 = first_chunk(wid, nwg, lid);
    let c1 = c0 + WG;
    let last = params.pairs - 1u; // chunks here
    let g0 = gate_chunk(min(c0, last));
    let g1 = gate_chunk(min(c1, last));
    let m = params.gate_mult;
    let d = params.down_mult;
    if (c0 <= last) {
        store_out_chunk(c0, Chunk(unary4(g0.lo * m, d), unary4(g0.hi * m, d)));
    }
    if (c1 <= last) {
        store_out_chunk(c1, Chunk(unary4(g1.lo * m, d), unary4(g1.hi * m, d)));
    }
}

@compute @workgroup_size(WG)
fn forward_gated_chunks(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c0 = first_chunk(wid, nwg, lid);
    let c1 = c0 + WG;
    let last = params.pairs - 1u;
    let i0 = gate_chunk_index(min(c0, last));
    let i1 = gate_chunk_index(min(c1, last));
    let g0 = gate_chunk(i0);
    let u0 = up_chunk(up_chunk_index(i0));
    let g1 = gate_chunk(i1);
    let u1 = up_chunk(up_chunk_index(i1));
    let m = params.gate_mult;
    let d = params.down_mult;
    if (c0 <= last) {
        store_out_chunk(c0, Chunk(gated4(g0.lo * m, u0.lo, d), gated4(g0.hi * m, u0.hi, d)));
    }
    if (c1 <= last) {
        store_out_chunk(c1, Chunk(gated4(g1.lo * m, u1.lo, d), gated4(g1.hi * m, u1.hi, d)));
    }
}

@compute @workgroup_size(WG)
fn backward_unary_chunks(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c0 = first_chunk(wid, nwg, lid);
    let c1 = c0 + WG;
    let last = params.pairs - 1u;
    let g0 = gate_chunk(min(c0, last));
    let d0 = dy_chunk(min(c0, last));
    let g1 = gate_chunk(min(c1, last));
    let d1 = dy_chunk(min(c1, last));
    let m = params.gate_mult;
    let s = params.down_mult * params.gate_mult;
    if (c0 <= last) {
        store_dgate_chunk(c0, Chunk(unary_grad4(g0.lo * m, d0.lo * s),
            unary_grad4(g0.hi * m, d0.hi * s)));
    }
    if (c1 <= last) {
        store_dgate_chunk(c1, Chunk(unary_grad4(g1.lo * m, d1.lo * s),
            unary_grad4(g1.hi * m, d1.hi * s)));
    }
}

// Gated backward of one chunk: (dgate, dup).
struct ChunkGrads {
    dg: Chunk,
    du: Chunk,
}

fn gated_grads(g: Chunk, u: Chunk, dy: Chunk) -> ChunkGrads {
    let m = params.gate_mult;
    let d = params.down_mult;
    let lo = gated_grad4(g.lo * m, u.lo, dy.lo * d);
    let hi = gated_grad4(g.hi * m, u.hi, dy.hi * d);
    return ChunkGrads(Chunk(lo.dg, hi.dg), Chunk(lo.du, hi.du));
}

@compute @workgroup_size(WG)
fn backward_gated_chunks(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c0 = first_chunk(wid, nwg, lid);
    let c1 = c0 + WG;
    let last = params.pairs - 1u;
    let k0 = min(c0, last);
    let k1 = min(c1, last);
    let g0 = gate_chunk(k0);
    let u0 = up_chunk(k0);
    let d0 = dy_chunk(k0);
    let g1 = gate_chunk(k1);
    let u1 = up_chunk(k1);
    let d1 = dy_chunk(k1);
    if (c0 <= last) {
        let r = gated_grads(g0, u0, d0);
        store_dgate_chunk(c0, r.dg);
        store_dup_chunk(c0, r.du);
    }
    if (c1 <= last) {
        let r = gated_grads(g1, u1, d1);
        store_dgate_chunk(c1, r.dg);
        store_dup_chunk(c1, r.du);
    }
}

// Packed layout: both gradients go to dgate4, in the input's [gate ‖ up] layout.
@compute @workgroup_size(WG)
fn backward_packed_chunks(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c0 = first_chunk(wid, nwg, lid);
    let c1 = c0 + WG;
    let last = params.pairs - 1u;
    let i0 = gate_chunk_index(min(c0, last));
    let i1 = gate_chunk_index(min(c1, last));
    let g0 = gate_chunk(i0);
    let u0 = gate_chunk(i0 + params.width);
    let d0 = dy_chunk(min(c0, last));
    let g1 = gate_chunk(i1);
    let u1 = gate_chunk(i1 + params.width);
    let d1 = dy_chunk(min(c1, last));
    if (c0 <= last) {
        let r = gated_grads(g0, u0, d0);
        store_dgate_chunk(i0, r.dg);
        store_dgate_chunk(i0 + params.width, r.du);
    }
    if (c1 <= last) {
        let r = gated_grads(g1, u1, d1);
        store_dgate_chunk(i1, r.dg);
        store_dgate_chunk(i1 + params.width, r.du);
    }
}
