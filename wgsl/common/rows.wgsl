// The row reductions of the register-resident rows (softmax, norms) in a module without
// subgroup operations: the shared fan-in-8 trees of `reduce.wgsl`. A module built with
// `rows_subgroup.wgsl` instead defines the same three functions with subgroup shuffles.
// Call from uniform control flow. Without subgroups there are no segment sums: the hosts
// launch segments (`segment_pairs`) on subgroup modules only, so this one is never reached
// and returns its argument.
fn lanes_sum(v: f32, lid: u32) -> f32 {
    return workgroup_sum8(v, lid);
}

fn lanes_max(v: f32, lid: u32) -> f32 {
    return workgroup_max8(v, lid);
}

fn lanes_pairs(v: vec2<f32>, lid: u32, op: u32) -> vec2<f32> {
    return workgroup_pairs8(v, lid, op);
}

fn segment_pairs(v: vec2<f32>, width: u32, op: u32) -> vec2<f32> {
    return v;
}
