// Fixed-order workgroup reductions. The including module defines `const WG: u32` (a power of
// two, the workgroup size). Every value takes the same path through a pairwise tree whatever
// the timing: lane i adds lane i + stride, halving the stride, so results are bit-reproducible.
// Call from uniform control flow only (the functions contain barriers).

var<workgroup> wg_scratch: array<f32, WG>;

fn workgroup_sum(v: f32, lid: u32) -> f32 {
    wg_scratch[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            wg_scratch[lid] = wg_scratch[lid] + wg_scratch[lid + stride];
        }
        workgroupBarrier();
    }
    let total = wg_scratch[0];
    workgroupBarrier();
    return total;
}

fn workgroup_max(v: f32, lid: u32) -> f32 {
    wg_scratch[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            wg_scratch[lid] = max(wg_scratch[lid], wg_scratch[lid + stride]);
        }
        workgroupBarrier();
    }
    let best = wg_scratch[0];
    workgroupBarrier();
    return best;
}

// The same reductions as a tree of fan-in 8 with one barrier a level (3 levels for 256 lanes,
// 4 for 1,024, against 8 and 10 above): lane i combines values 8i..8i+7 of the level below in
// a fixed order, and every lane combines the last few values in order, so results are
// bit-reproducible (not bit-equal to `workgroup_sum`, which adds in another order). The
// levels ping-pong between `tree8_b` and `tree8_c`, and a call reads `tree8_in` only before
// its second barrier, so two calls in a row need no barrier between them.
var<workgroup> tree8_in: array<f32, WG>;
var<workgroup> tree8_b: array<f32, WG / 8u>;
var<workgroup> tree8_c: array<f32, WG / 8u>;

fn tree8_op(a: f32, b: f32, is_max: bool) -> f32 {
    if (is_max) {
        return max(a, b);
    }
    return a + b;
}

// ((a0 ∘ b0) ∘ (a1 ∘ b1)) ∘ ((a2 ∘ b2) ∘ (a3 ∘ b3)) for eight values a, b.
fn tree8_fold(a: vec4<f32>, b: vec4<f32>, is_max: bool) -> f32 {
    return tree8_op(tree8_op(tree8_op(a.x, b.x, is_max), tree8_op(a.y, b.y, is_max), is_max),
                    tree8_op(tree8_op(a.z, b.z, is_max), tree8_op(a.w, b.w, is_max), is_max), is_max);
}

fn tree8_fold_in(i: u32, is_max: bool) -> f32 {
    let f = 8u * i;
    return tree8_fold(vec4<f32>(tree8_in[f], tree8_in[f + 1u], tree8_in[f + 2u], tree8_in[f + 3u]),
                      vec4<f32>(tree8_in[f + 4u], tree8_in[f + 5u], tree8_in[f + 6u], tree8_in[f + 7u]), is_max);
}

fn tree8_fold_b(i: u32, is_max: bool) -> f32 {
    let f = 8u * i;
    return tree8_fold(vec4<f32>(tree8_b[f], tree8_b[f + 1u], tree8_b[f + 2u], tree8_b[f + 3u]),
                      vec4<f32>(tree8_b[f + 4u], tree8_b[f + 5u], tree8_b[f + 6u], tree8_b[f + 7u]), is_max);
}

fn tree8_fold_c(i: u32, is_max: bool) -> f32 {
    let f = 8u * i;
    return tree8_fold(vec4<f32>(tree8_c[f], tree8_c[f + 1u], tree8_c[f + 2u], tree8_c[f + 3u]),
                      vec4<f32>(tree8_c[f + 4u], tree8_c[f + 5u], tree8_c[f + 6u], tree8_c[f + 7u]), is_max);
}

fn workgroup_tree8(v: f32, lid: u32, is_max: bool) -> f32 {
    tree8_in[lid] = v;
    workgroupBarrier();
    var count = WG / 8u;
    if (lid < count) {
        tree8_b[lid] = tree8_fold_in(lid, is_max);
    }
    workgroupBarrier();
    var in_b = true;
    while (count > 8u) {
        count = count / 8u;
        if (lid < count) {
            if (in_b) {
                tree8_c[lid] = tree8_fold_b(lid, is_max);
            } else {
                tree8_b[lid] = tree8_fold_c(lid, is_max);
            }
        }
        workgroupBarrier();
        in_b = !in_b;
    }
    var total = tree8_c[0];
    if (in_b) {
        total = tree8_b[0];
    }
    for (var i = 1u; i < count; i = i + 1u) {
        if (in_b) {
            total = tree8_op(total, tree8_b[i], is_max);
        } else {
            total = tree8_op(total, tree8_c[i], is_max);
        }
    }
    return total;
}

fn workgroup_sum8(v: f32, lid: u32) -> f32 {
    return workgroup_tree8(v, lid, false);
}

fn workgroup_max8(v: f32, lid: u32) -> f32 {
    return workgroup_tree8(v, lid, true);
}

// The fan-in-8 tree over pairs of values, with one of two operations: PAIR_SUM adds pairs
// componentwise; PAIR_SOFTMAX merges (maximum, Σ exp(x − maximum)) pairs into the larger
// maximum and the sum of the sums rescaled to it. A node folds its eight children (for
// PAIR_SOFTMAX, rescaled to their common maximum first) as
// ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)), one barrier a level (3 for 256 lanes, 4 for
// 1,024); every lane then folds the last few values in order, starting from the identity. The
// levels ping-pong between `pair8_b` and `pair8_c`, so a call never overwrites what a slower
// lane may still read from the previous call. Bit-reproducible; call from uniform control flow.
const PAIR_SUM: u32 = 0u;
const PAIR_SOFTMAX: u32 = 1u;
var<workgroup> pair8_in: array<vec2<f32>, WG>;
var<workgroup> pair8_b: array<vec2<f32>, WG / 8u>;
var<workgroup> pair8_c: array<vec2<f32>, WG / 8u>;

fn pair_neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

// a ∘ b.
fn pair_op(a: vec2<f32>, b: vec2<f32>, op: u32) -> vec2<f32> {
    if (op == PAIR_SUM) {
        return a + b;
    }
    let mx = max(a.x, b.x);
    if (mx == pair_neg_inf()) {
        return vec2<f32>(pair_neg_inf(), 0.0);
    }
    return vec2<f32>(mx, a.y * exp(a.x - mx) + b.y * exp(b.x - mx));
}

fn pair8_fold(c: array<vec2<f32>, 8>, op: u32) -> vec2<f32> {
    if (op == PAIR_SUM) {
        return ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
    }
    let mx = max(max(max(c[0].x, c[1].x), max(c[2].x, c[3].x)),
                 max(max(c[4].x, c[5].x), max(c[6].x, c[7].x)));
    if (mx == pair_neg_inf()) {
        return vec2<f32>(pair_neg_inf(), 0.0);
    }
    let a = vec4<f32>(c[0].y * exp(c[0].x - mx), c[1].y * exp(c[1].x - mx),
                      c[2].y * exp(c[2].x - mx), c[3].y * exp(c[3].x - mx));
    let b = vec4<f32>(c[4].y * exp(c[4].x - mx), c[5].y * exp(c[5].x - mx),
                      c[6].y * exp(c[6].x - mx), c[7].y * exp(c[7].x - mx));
    return vec2<f32>(mx, ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w)));
}

fn pair8_in_at(f: u32) -> array<vec2<f32>, 8> {
    return array<vec2<f32>, 8>(pair8_in[f], pair8_in[f + 1u], pair8_in[f + 2u], pair8_in[f + 3u],
                               pair8_in[f + 4u], pair8_in[f + 5u], pair8_in[f + 6u], pair8_in[f + 7u]);
}

fn pair8_b_at(f: u32) -> array<vec2<f32>, 8> {
    return array<vec2<f32>, 8>(pair8_b[f], pair8_b[f + 1u], pair8_b[f + 2u], pair8_b[f + 3u],
                               pair8_b[f + 4u], pair8_b[f + 5u], pair8_b[f + 6u], pair8_b[f + 7u]);
}

fn pair8_c_at(f: u32) -> array<vec2<f32>, 8> {
    return array<vec2<f32>, 8>(pair8_c[f], pair8_c[f + 1u], pair8_c[f + 2u], pair8_c[f + 3u],
                               pair8_c[f + 4u], pair8_c[f + 5u], pair8_c[f + 6u], pair8_c[f + 7u]);
}

fn workgroup_pairs8(v: vec2<f32>, lid: u32, op: u32) -> vec2<f32> {
    pair8_in[lid] = v;
    workgroupBarrier();
    // Level 1: pair8_in -> pair8_b; then pair8_b -> pair8_c -> pair8_b ... while more than 8 remain.
    var count = WG / 8u;
    if (lid < count) {
        pair8_b[lid] = pair8_fold(pair8_in_at(8u * lid), op);
    }
    workgroupBarrier();
    var in_b = true;
    while (count > 8u) {
        count = count / 8u;
        if (lid < count) {
            if (in_b) {
                pair8_c[lid] = pair8_fold(pair8_b_at(8u * lid), op);
            } else {
                pair8_b[lid] = pair8_fold(pair8_c_at(8u * lid), op);
            }
        }
        workgroupBarrier();
        in_b = !in_b;
    }
    var total = vec2<f32>(0.0);
    if (op == PAIR_SOFTMAX) {
        total = vec2<f32>(pair_neg_inf(), 0.0);
    }
    for (var i = 0u; i < count; i = i + 1u) {
        if (in_b) {
            total = pair_op(total, pair8_b[i], op);
        } else {
            total = pair_op(total, pair8_c[i], op);
        }
    }
    return total;
}

// Online (max, Σ exp(z − max)) update with four values at once.
// The running sum is rescaled only when the maximum grows (one exp per element otherwise).
fn online4(state: vec2<f32>, z: vec4<f32>) -> vec2<f32> {
    return online4_max(state, z, max(max(z.x, z.y), max(z.z, z.w)));
}

// online4 given the chunk's maximum `cm`.
fn online4_max(state: vec2<f32>, z: vec4<f32>, cm: f32) -> vec2<f32> {
    var m = state.x;
    var s = state.y;
    if (cm > m) {
        s = s * exp(m - cm);
        m = cm;
    }
    if (m == pair_neg_inf()) {
        return state;
    }
    let e = exp(z - vec4<f32>(m));
    return vec2<f32>(m, s + ((e.x + e.y) + (e.z + e.w)));
}
