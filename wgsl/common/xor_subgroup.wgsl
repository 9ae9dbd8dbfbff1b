// `lane_xor(v, d)`: lane lid ^ d's v by a subgroup shuffle (the device needs `SUBGROUP`; lanes
// lid and lid ^ d must share a subgroup, which holds for d below the subgroup width in the
// one-dimensional workgroups of every driver).
fn lane_xor(v: f32, d: u32) -> f32 {
    return subgroupShuffleXor(v, d);
}
