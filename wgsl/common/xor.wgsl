// `lane_xor(v, d)`: lane lid ^ d's v. This twin is for devices without subgroups: the kernels
// that include it call it only where their override constants say a subgroup is there (never,
// on such a device), so it returns the lane's own value.
fn lane_xor(v: f32, d: u32) -> f32 {
    return v;
}
