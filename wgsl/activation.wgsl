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
override DT_D: u32 = 0u;     // gradient dtype of the backward step kernels (16-bit: STEP = 8)
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

// ---- step kernels: element counts (packed: row widths) that are multiples of STEP ----
// A step is STEP consecutive elements: STEP = 8 when every tensor of the pass is 16-bit (one
// vec4<u32> each), else 4 (one vec4<u32> of F32 storage, one vec2<u32> of 16-bit storage).
// An invocation takes 16 elements: 16 / STEP steps, WG apart, so each load or store
// instruction of a warp covers one contiguous span of memory. All loads are issued before
// any arithmetic (the step index is clamped to the last step, so the loads need no branch);
// the steps that exist are stored. Each element is computed with the per-element kernels'
// operations in the same order, so both give the same bits. The backward kernels write F32
// gradients with STEP 4, or (DT_D 16-bit, every tensor 16-bit) 16-bit gradients with STEP 8,
// each value rounded once from the FP32 gradient. (Two adjacent vec4 per lane, every other 16
// bytes of a warp's span per instruction, measured 10-30% slower on the H200 than this layout.)

override STEP: u32 = 4u;

@group(0) @binding(7) var<storage, read> gate4: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> gate2: array<vec2<u32>>;
@group(0) @binding(9) var<storage, read> up4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> up2: array<vec2<u32>>;
@group(0) @binding(11) var<storage, read> dy4: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read> dy2: array<vec2<u32>>;
@group(0) @binding(13) var<storage, read_write> out4: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read_write> out2: array<vec2<u32>>;
@group(0) @binding(15) var<storage, read_write> dgate4: array<vec4<u32>>;
@group(0) @binding(16) var<storage, read_write> dup4: array<vec4<u32>>;

// The values of one step in FP32: elements 0..3 in `lo`, 4..7 in `hi` (STEP = 8 only).
struct Chunk {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn widen4(w: vec4<u32>, dt: u32) -> Chunk {
    return Chunk(vec4(widen2(w.x, dt), widen2(w.y, dt)), vec4(widen2(w.z, dt), widen2(w.w, dt)));
}

fn widen_step(w4: vec4<u32>, w2: vec2<u32>, dt: u32) -> Chunk {
    if (dt == DT_F32) {
        return Chunk(bitcast<vec4<f32>>(w4), vec4(0.0));
    }
    if (STEP == 8u) {
        return widen4(w4, dt);
    }
    return Chunk(vec4(widen2(w2.x, dt), widen2(w2.y, dt)), vec4(0.0));
}

// Step s of gate (packed: of the packed input, which also holds up).
fn gate_step(s: u32) -> Chunk {
    if (DT_G == DT_F32 || STEP == 8u) {
        return widen_step(gate4[s], vec2<u32>(), DT_G);
    }
    return widen_step(vec4<u32>(), gate2[s], DT_G);
}

fn up_step(s: u32) -> Chunk {
    if (DT_U == DT_F32 || STEP == 8u) {
        return widen_step(up4[s], vec2<u32>(), DT_U);
    }
    return widen_step(vec4<u32>(), up2[s], DT_U);
}

fn dy_step(s: u32) -> Chunk {
    if (DT_Y == DT_F32 || STEP == 8u) {
        return widen_step(dy4[s], vec2<u32>(), DT_Y);
    }
    return widen_step(vec4<u32>(), dy2[s], DT_Y);
}

fn store_out_step(s: u32, v: Chunk) {
    if (DT_Y == DT_F32) {
        out4[s] = bitcast<vec4<u32>>(v.lo);
    } else if (STEP == 8u) {
        out4[s] = vec4(narrow2(v.lo.xy, DT_Y), narrow2(v.lo.zw, DT_Y), narrow2(v.hi.xy, DT_Y),
            narrow2(v.hi.zw, DT_Y));
    } else {
        out2[s] = vec2(narrow2(v.lo.xy, DT_Y), narrow2(v.lo.zw, DT_Y));
    }
}

// The words of a gradient step: four F32 values (STEP = 4), or eight narrowed to DT_D.
fn grad_words(v: Chunk) -> vec4<u32> {
    if (DT_D == DT_F32) {
        return bitcast<vec4<u32>>(v.lo);
    }
    return narrow8(v.lo, v.hi, DT_D);
}

fn store_dgate_step(s: u32, v: Chunk) {
    dgate4[s] = grad_words(v);
}

fn store_dup_step(s: u32, v: Chunk) {
    dup4[s] = grad_words(v);
}

// Gate step index of output step s: s itself, or in the packed layout s plus the up halves
// of the rows before it (`width` counts steps here); the up step is `width` further.
fn gate_step_index(s: u32) -> u32 {
    if (PACKED == 1u) {
        return s + (s / params.width) * params.width;
    }
    return s;
}

fn up_of(gi: u32) -> Chunk {
    if (PACKED == 1u) {
        return gate_step(gi + params.width);
    }
    return up_step(gi);
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

fn gated_grad1(g: f32, u: f32, d: f32) -> vec2<f32> {
    let a = act(g);
    return vec2(d * u * a.y * params.gate_mult, d * a.x);
}

// Gated backward of one step (g scaled by m_g, dy by m_d): (dgate, dup).
struct StepGrads {
    dg: Chunk,
    du: Chunk,
}

// (dgate, dup) of four elements, as columns 0 and 1.
fn gated_grads4(g: vec4<f32>, u: vec4<f32>, dy: vec4<f32>) -> mat4x2<f32> {
    let m = params.gate_mult;
    let d = params.down_mult;
    return mat4x2<f32>(gated_grad1(g.x * m, u.x, dy.x * d), gated_grad1(g.y * m, u.y, dy.y * d),
        gated_grad1(g.z * m, u.z, dy.z * d), gated_grad1(g.w * m, u.w, dy.w * d));
}

fn gated_grads(g: Chunk, u: Chunk, dy: Chunk) -> StepGrads {
    let lo = transpose(gated_grads4(g.lo, u.lo, dy.lo));
    var hi = mat2x4<f32>();
    if (STEP == 8u) {
        hi = transpose(gated_grads4(g.hi, u.hi, dy.hi));
    }
    return StepGrads(Chunk(lo[0], hi[0]), Chunk(lo[1], hi[1]));
}

fn forward_unary_value(g: Chunk) -> Chunk {
    let m = params.gate_mult;
    let d = params.down_mult;
    var hi = vec4(0.0);
    if (STEP == 8u) {
        hi = unary4(g.hi * m, d);
    }
    return Chunk(unary4(g.lo * m, d), hi);
}

fn forward_gated_value(g: Chunk, u: Chunk) -> Chunk {
    let m = params.gate_mult;
    let d = params.down_mult;
    var hi = vec4(0.0);
    if (STEP == 8u) {
        hi = gated4(g.hi * m, u.hi, d);
    }
    return Chunk(gated4(g.lo * m, u.lo, d), hi);
}

fn steps_per_invocation() -> u32 {
    return 16u / STEP;
}

// First step of an invocation; its others follow WG apart (16 elements in all).
fn step_base(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return group_index(wid, nwg) * WG * steps_per_invocation() + lid;
}

@compute @workgroup_size(WG)
fn forward_unary_steps(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s0 = step_base(wid, nwg, lid);
    let l = WG;
    let last = params.pairs - 1u; // steps here
    let n = steps_per_invocation();
    let g0 = gate_step(min(s0, last));
    let g1 = gate_step(min(s0 + l, last));
    var g2 = g0;
    var g3 = g0;
    if (n == 4u) {
        g2 = gate_step(min(s0 + 2u * l, last));
        g3 = gate_step(min(s0 + 3u * l, last));
    }
    if (s0 <= last) {
        store_out_step(s0, forward_unary_value(g0));
    }
    if (s0 + l <= last) {
        store_out_step(s0 + l, forward_unary_value(g1));
    }
    if (n == 4u) {
        if (s0 + 2u * l <= last) {
            store_out_step(s0 + 2u * l, forward_unary_value(g2));
        }
        if (s0 + 3u * l <= last) {
            store_out_step(s0 + 3u * l, forward_unary_value(g3));
        }
    }
}

@compute @workgroup_size(WG)
fn forward_gated_steps(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s0 = step_base(wid, nwg, lid);
    let l = WG;
    let last = params.pairs - 1u;
    let n = steps_per_invocation();
    let i0 = gate_step_index(min(s0, last));
    let i1 = gate_step_index(min(s0 + l, last));
    let g0 = gate_step(i0);
    let u0 = up_of(i0);
    let g1 = gate_step(i1);
    let u1 = up_of(i1);
    var g2 = g0;
    var u2 = u0;
    var g3 = g0;
    var u3 = u0;
    if (n == 4u) {
        let i2 = gate_step_index(min(s0 + 2u * l, last));
        let i3 = gate_step_index(min(s0 + 3u * l, last));
        g2 = gate_step(i2);
        u2 = up_of(i2);
        g3 = gate_step(i3);
        u3 = up_of(i3);
    }
    if (s0 <= last) {
        store_out_step(s0, forward_gated_value(g0, u0));
    }
    if (s0 + l <= last) {
        store_out_step(s0 + l, forward_gated_value(g1, u1));
    }
    if (n == 4u) {
        if (s0 + 2u * l <= last) {
            store_out_step(s0 + 2u * l, forward_gated_value(g2, u2));
        }
        if (s0 + 3u * l <= last) {
            store_out_step(s0 + 3u * l, forward_gated_value(g3, u3));
        }
    }
}

// Backward kernels: four steps per invocation (F32 gradients, STEP 4) or two (STEP 8).

fn unary_grad_step(g: Chunk, d: Chunk) -> Chunk {
    let s = params.down_mult * params.gate_mult;
    var hi = vec4(0.0);
    if (STEP == 8u) {
        hi = unary_grad4(g.hi * params.gate_mult, d.hi * s);
    }
    return Chunk(unary_grad4(g.lo * params.gate_mult, d.lo * s), hi);
}

@compute @workgroup_size(WG)
fn backward_unary_steps(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s0 = step_base(wid, nwg, lid);
    let l = WG;
    let last = params.pairs - 1u;
    let n = steps_per_invocation();
    let k0 = min(s0, last);
    let k1 = min(s0 + l, last);
    let g0 = gate_step(k0);
    let d0 = dy_step(k0);
    let g1 = gate_step(k1);
    let d1 = dy_step(k1);
    var g2 = g0;
    var d2 = d0;
    var g3 = g0;
    var d3 = d0;
    if (n == 4u) {
        let k2 = min(s0 + 2u * l, last);
        let k3 = min(s0 + 3u * l, last);
        g2 = gate_step(k2);
        d2 = dy_step(k2);
        g3 = gate_step(k3);
        d3 = dy_step(k3);
    }
    if (s0 <= last) {
        store_dgate_step(s0, unary_grad_step(g0, d0));
    }
    if (s0 + l <= last) {
        store_dgate_step(s0 + l, unary_grad_step(g1, d1));
    }
    if (n == 4u) {
        if (s0 + 2u * l <= last) {
            store_dgate_step(s0 + 2u * l, unary_grad_step(g2, d2));
        }
        if (s0 + 3u * l <= last) {
            store_dgate_step(s0 + 3u * l, unary_grad_step(g3, d3));
        }
    }
}

fn store_gated(s: u32, g: Chunk, u: Chunk, d: Chunk) {
    let r = gated_grads(g, u, d);
    store_dgate_step(s, r.dg);
    store_dup_step(s, r.du);
}

@compute @workgroup_size(WG)
fn backward_gated_steps(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s0 = step_base(wid, nwg, lid);
    let l = WG;
    let last = params.pairs - 1u;
    let n = steps_per_invocation();
    let k0 = min(s0, last);
    let k1 = min(s0 + l, last);
    let g0 = gate_step(k0);
    let u0 = up_step(k0);
    let d0 = dy_step(k0);
    let g1 = gate_step(k1);
    let u1 = up_step(k1);
    let d1 = dy_step(k1);
    var g2 = g0;
    var u2 = u0;
    var d2 = d0;
    var g3 = g0;
    var u3 = u0;
    var d3 = d0;
    if (n == 4u) {
        let k2 = min(s0 + 2u * l, last);
        let k3 = min(s0 + 3u * l, last);
        g2 = gate_step(k2);
        u2 = up_step(k2);
        d2 = dy_step(k2);
        g3 = gate_step(k3);
        u3 = up_step(k3);
        d3 = dy_step(k3);
    }
    if (s0 <= last) {
        store_gated(s0, g0, u0, d0);
    }
    if (s0 + l <= last) {
        store_gated(s0 + l, g1, u1, d1);
    }
    if (n == 4u) {
        if (s0 + 2u * l <= last) {
            store_gated(s0 + 2u * l, g2, u2, d2);
        }
        if (s0 + 3u * l <= last) {
            store_gated(s0 + 3u * l, g3, u3, d3);
        }
    }
}

// Packed layout: both gradients go to dgate4, in the input's [gate ‖ up] layout.
fn store_packed(i: u32, g: Chunk, u: Chunk, d: Chunk) {
    let r = gated_grads(g, u, d);
    store_dgate_step(i, r.dg);
    store_dgate_step(i + params.width, r.du);
}

@compute @workgroup_size(WG)
fn backward_packed_steps(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s0 = step_base(wid, nwg, lid);
    let l = WG;
    let last = params.pairs - 1u;
    let n = steps_per_invocation();
    let k0 = min(s0, last);
    let k1 = min(s0 + l, last);
    let i0 = gate_step_index(k0);
    let i1 = gate_step_index(k1);
    let g0 = gate_step(i0);
    let u0 = gate_step(i0 + params.width);
    let d0 = dy_step(k0);
    let g1 = gate_step(i1);
    let u1 = gate_step(i1 + params.width);
    let d1 = dy_step(k1);
    var i2 = i0;
    var i3 = i0;
    var g2 = g0;
    var u2 = u0;
    var d2 = d0;
    var g3 = g0;
    var u3 = u0;
    var d3 = d0;
    if (n == 4u) {
        let k2 = min(s0 + 2u * l, last);
        let k3 = min(s0 + 3u * l, last);
        i2 = gate_step_index(k2);
        i3 = gate_step_index(k3);
        g2 = gate_step(i2);
        u2 = gate_step(i2 + params.width);
        d2 = dy_step(k2);
        g3 = gate_step(i3);
        u3 = gate_step(i3 + params.width);
        d3 = dy_step(k3);
    }
    if (s0 <= last) {
        store_packed(i0, g0, u0, d0);
    }
    if (s0 + l <= last) {
        store_packed(i1, g1, u1, d1);
    }
    if (n == 4u) {
        if (s0 + 2u * l <= last) {
            store_packed(i2, g2, u2, d2);
        }
        if (s0 + 3u * l <= last) {
            store_packed(i3, g3, u3, d3);
        }
    }
}
