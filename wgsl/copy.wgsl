// Plain copy of u32 words, four per invocation (vec4 loads and stores): the bandwidth
// yardstick that memory-bound kernels are judged against.

const WG: u32 = 256u;

struct Params {
    vec4s: u32,  // whole vec4s to copy
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> source: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dest: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn copy_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i < params.vec4s) {
        dest[i] = source[i];
    }
}
