// Fused linear losses: the elementwise step between the products (matmul family) and the
// loss kernels (loss family), which do all the rest.
//
// combine: out[i] = (a·x[i] + b·y[i])·s, with y optional (F_Y) and s either 1 or a scalar
// that lives on the GPU (F_SCALE: s = scale[0], e.g. a loss cotangent, so the host never
// reads it back). x and y are F32, F16 or BF16 storage (XT, YT), out is F32. Used for the
// temperature division of logits, the weighted sum of the hard and soft logit gradients, the
// running bias-gradient sum across chunks (in chunk order) and the cotangent scaling of the
// gradients computed in the forward.

override XT: u32 = 0u;
override YT: u32 = 0u;
const WG: u32 = 256u;

const F_Y: u32 = 1u;
const F_SCALE: u32 = 2u;

struct Params {
    n: u32,
    flags: u32,
    a: f32,
    b: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> y: array<u32>;
@group(0) @binding(3) var<storage, read> scale: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn ld_x(i: u32) -> f32 {
    if (XT == DT_F32) {
        return bitcast<f32>(x[i]);
    }
    return half_from_word(x[i >> 1u], i, XT);
}

fn ld_y(i: u32) -> f32 {
    if (YT == DT_F32) {
        return bitcast<f32>(y[i]);
    }
    return half_from_word(y[i >> 1u], i, YT);
}

@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= params.n) {
        return;
    }
    var v = params.a * ld_x(i);
    if ((params.flags & F_Y) != 0u) {
        v = v + params.b * ld_y(i);
    }
    if ((params.flags & F_SCALE) != 0u) {
        v = v * scale[0];
    }
    out[i] = v;
}
