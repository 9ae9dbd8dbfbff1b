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

// ---- Probes of passes that write over what they read (measurements, `bench::probe_*`) ----
@group(0) @binding(3) var<storage, read_write> inout: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> source_rw: array<vec4<u32>>;

// Each vec4 loaded and stored back with its bits flipped, one vec4 an invocation.
@compute @workgroup_size(WG)
fn rewrite_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i < params.vec4s) {
        inout[i] = ~inout[i];
    }
}

// The same, four vec4 an invocation (i, i + WG, i + 2·WG, i + 3·WG), all four loaded before
// any is stored.
@compute @workgroup_size(WG)
fn rewrite_vec4_x4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 4u * WG + lid;
    if (i + 3u * WG < params.vec4s) {
        let a = inout[i];
        let b = inout[i + WG];
        let c = inout[i + 2u * WG];
        let d = inout[i + 3u * WG];
        inout[i] = ~a;
        inout[i + WG] = ~b;
        inout[i + 2u * WG] = ~c;
        inout[i + 3u * WG] = ~d;
    }
}

// The copy with its source bound read-write (only read).
@compute @workgroup_size(WG)
fn copy_vec4_rw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i < params.vec4s) {
        dest[i] = source_rw[i];
    }
}
