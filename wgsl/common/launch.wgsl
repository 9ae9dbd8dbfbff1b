// Linear workgroup index for launches folded past the 65,535-groups-per-dimension limit.
// The host dispatches (x, y, 1) groups with x * y >= the groups needed; groups past the end
// must return early (the index is uniform across the workgroup, so barriers stay uniform).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + nwg.x * (wid.y + nwg.y * wid.z);
}
