// Temporary naive product used until the matmul family is available. One invocation per output.
override AT: u32 = 0u;
override BT: u32 = 0u;
override CT: u32 = 0u;
const WG: u32 = 256u;
struct Params { m: u32, n: u32, k: u32, flags: u32, a_off: u32, b_off: u32, o_off: u32, alpha: f32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
fn ld(dt: u32, which: u32, i: u32) -> f32 {
    var w = 0u;
    if (which == 0u) { w = a[select(i, i >> 1u, dt != DT_F32)]; }
    else if (which == 1u) { w = b[select(i, i >> 1u, dt != DT_F32)]; }
    else { w = bias[select(i, i >> 1u, dt != DT_F32)]; }
    if (dt == DT_F32) { return bitcast<f32>(w); }
    return half_from_word(w, i, dt);
}
@compute @workgroup_size(WG)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid, nwg) * WG + lid;
    if (idx >= params.m * params.n) { return; }
    let i = idx / params.n;
    let j = idx % params.n;
    var acc = 0.0;
    for (var kk = 0u; kk < params.k; kk = kk + 1u) {
        var ai = params.a_off + i * params.k + kk;
        if ((params.flags & 1u) != 0u) { ai = params.a_off + kk * params.m + i; }
        var bi = params.b_off + kk * params.n + j;
        if ((params.flags & 2u) != 0u) { bi = params.b_off + j * params.k + kk; }
        acc = acc + ld(AT, 0u, ai) * ld(BT, 1u, bi);
    }
    var v = params.alpha * acc;
    if ((params.flags & 4u) != 0u) { v = v + ld(CT, 2u, j); }
    let o = params.o_off + idx;
    if ((params.flags & 8u) != 0u) { v = out[o] + v; }
    out[o] = v;
}
