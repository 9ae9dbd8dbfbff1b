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
