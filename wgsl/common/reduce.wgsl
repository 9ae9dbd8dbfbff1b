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
