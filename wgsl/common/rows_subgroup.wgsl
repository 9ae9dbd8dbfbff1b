// The row reductions of the register-resident rows (softmax, norms) with subgroup shuffles (the
// twin of `rows.wgsl`; run only on devices with subgroups). SG_WIDTH is a power of
// two no larger than the device's smallest subgroup, set by the host (`reduce::subgroup_width`);
// lanes lid, lid ^ 1, ... lid ^ (SG_WIDTH − 1) are taken to share a subgroup (subgroups of
// consecutive invocations, as every driver lays out a one-dimensional workgroup).
//
// Order: the pairwise tree over adjacent lanes. A butterfly (partners lid ^ d, d = 1, 2, ...,
// SG_WIDTH / 2) leaves every lane of an aligned block of SG_WIDTH lanes with the block's
// value; the first lane of each block writes it to workgroup memory; the next level reads those
// values back into lanes (the identity past the end) and repeats, until one block holds every
// value; then each subgroup folds that last level itself, so every lane ends with the total
// and no broadcast is needed. Each operation (`sg_op`) is commutative bit for bit, so the
// two partners of a step compute the same bits, and the whole is one binary tree over the
// lanes in order whatever SG_WIDTH is (up to the sign of a zero sum). One barrier a level
// above the first: one in all for up to SG_WIDTH² lanes (1,024 lanes in subgroups of 32).
// The levels alternate between two arrays, and the alternation carries over from one call to
// the next (`sg_in_b`, the same in every lane since every lane makes the same calls): a level's
// writes never go to the array a slower lane may still be reading, in this call or the last.
override SG_WIDTH: u32 = 32u;

const SG_MAX: u32 = 2u; // componentwise maximum, besides `reduce.wgsl`'s PAIR_SUM and PAIR_SOFTMAX

// a ∘ b: `pair_op`, or the componentwise maximum.
fn sg_op(a: vec2<f32>, b: vec2<f32>, op: u32) -> vec2<f32> {
    if (op == SG_MAX) {
        return max(a, b);
    }
    return pair_op(a, b, op);
}

// The identity of `op`.
fn sg_identity(op: u32) -> vec2<f32> {
    if (op == PAIR_SOFTMAX) {
        return vec2<f32>(pair_neg_inf(), 0.0);
    }
    if (op == SG_MAX) {
        return vec2<f32>(pair_neg_inf());
    }
    return vec2<f32>(0.0);
}

var<workgroup> sg_level_b: array<vec2<f32>, WG / 4u>;
var<workgroup> sg_level_c: array<vec2<f32>, WG / 4u>;
var<private> sg_in_b: bool = true;

fn lanes_pairs(v: vec2<f32>, lid: u32, op: u32) -> vec2<f32> {
    var s = segment_pairs(v, SG_WIDTH, op);
    var count = WG / SG_WIDTH;  // values of the next level
    loop {
        if (count == 1u) {
            return s;
        }
        if (lid % SG_WIDTH == 0u) {
            if (sg_in_b) {
                sg_level_b[lid / SG_WIDTH] = s;
            } else {
                sg_level_c[lid / SG_WIDTH] = s;
            }
        }
        workgroupBarrier();
        // The last level (count ≤ SG_WIDTH): every subgroup folds it; before it, lanes < count.
        var i = lid;
        if (count <= SG_WIDTH) {
            i = lid % SG_WIDTH;
        }
        var x = sg_identity(op);
        if (i < count) {
            if (sg_in_b) {
                x = sg_level_b[i];
            } else {
                x = sg_level_c[i];
            }
        }
        s = segment_pairs(x, SG_WIDTH, op);
        sg_in_b = !sg_in_b;
        if (count <= SG_WIDTH) {
            return s;
        }
        count = count / SG_WIDTH;
    }
    return s; // not reached: the loop returns at its last level
}

// The `op`-sum of `v` over each aligned run of `width` lanes (a power of two no larger than
// SG_WIDTH, so the run lies in one subgroup): the butterfly's first levels, the same binary
// tree over the run's lanes in order, every lane of the run ending with it. No workgroup
// memory or barrier: a run may stop (return) while the others go on.
fn segment_pairs(v: vec2<f32>, width: u32, op: u32) -> vec2<f32> {
    var s = v;
    for (var d = 1u; d < width; d = d * 2u) {
        s = sg_op(s, subgroupShuffleXor(s, d), op);
    }
    return s;
}

fn lanes_sum(v: f32, lid: u32) -> f32 {
    return lanes_pairs(vec2<f32>(v, 0.0), lid, PAIR_SUM).x;
}

fn lanes_max(v: f32, lid: u32) -> f32 {
    return lanes_pairs(vec2<f32>(v), lid, SG_MAX).x;
}
