// Optimizer steps (AdamW with optional AMSGrad, SGD with momentum; both optionally
// maximizing) on FP32 master weights, updated in place, with an optional 16-bit model copy
// written in the same pass; and the global L2 norm of a list of gradients (per-block partial
// sums of squares, then one fixed-order finish).
//
// Steps: each invocation owns element pairs (2j, 2j + 1), UNROLL pairs WG apart, so a 16-bit
// model copy word (one pair) has one writer whatever the element count. Elements past the
// end are skipped inside the element functions. Gradient clipping is
// a scale read from the norm tensor on the GPU: min(1, max_norm / (norm + 1e-6)); `maximize`
// negates that scale (an exact sign flip of every scaled gradient). The options are uniform
// flags, so one entry point (and its model-copy twin) serves every AdamW or SGD variant.

override DT_G: u32 = 0u;   // gradient dtype
override DT_C: u32 = 1u;   // model copy dtype (F16 or BF16)
const WG: u32 = 256u;
const UNROLL: u32 = 4u;        // element pairs per invocation of a step
const NORM_CHUNK: u32 = 32u;   // elements per invocation of norm_partials (block: WG·32)

// Bits of params.flags.
const FLAG_FIRST: u32 = 1u;     // SGD: first step (the momentum buffer starts as the gradient)
const FLAG_NESTEROV: u32 = 2u;  // SGD: Nesterov momentum
const FLAG_MAXIMIZE: u32 = 4u;  // AdamW, SGD: step along +g (the gradient is negated first)
const FLAG_AMSGRAD: u32 = 8u;   // AdamW: the denominator uses the running maximum of v

struct Params {
    count: u32,       // elements of the parameter (norm_partials: of the gradient)
    pairs: u32,       // ceil(count / 2)
    clip: u32,        // 1: scale the gradient by the clip factor
    flags: u32,       // FLAG_* bits
    lr: f32,          // SGD: learning rate
    decay: f32,       // AdamW: 1 − lr·weight_decay; SGD: weight_decay
    beta1: f32,       // AdamW: β1; SGD: momentum
    one_minus_beta1: f32, // AdamW: 1 − β1; SGD: 1 − dampening
    beta2: f32,
    one_minus_beta2: f32,
    eps: f32,
    step_size: f32,   // AdamW: lr / (1 − β1^t)
    bc2_sqrt: f32,    // AdamW: sqrt(1 − β2^t)
    max_norm: f32,
    base: u32,        // norm_partials: first partial written
    blocks: u32,      // norm_finish: partials
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> grad: array<u32>;
@group(0) @binding(2) var<storage, read> norm: array<f32>;
@group(0) @binding(3) var<storage, read_write> master: array<f32>;
@group(0) @binding(4) var<storage, read_write> exp_avg: array<f32>;
@group(0) @binding(5) var<storage, read_write> exp_avg_sq: array<f32>;
// AMSGrad's running maximum of v; a one-word placeholder, never accessed, without AMSGrad.
@group(0) @binding(6) var<storage, read_write> max_exp_avg_sq: array<f32>;
@group(0) @binding(7) var<storage, read_write> model_copy: array<u32>;
@group(0) @binding(8) var<storage, read_write> momentum_buf: array<f32>;
@group(0) @binding(9) var<storage, read_write> partials: array<f32>;
@group(0) @binding(10) var<storage, read> partials_in: array<f32>;
@group(0) @binding(11) var<storage, read_write> norm_out: array<f32>;

fn load_grad(i: u32) -> f32 {
    if (DT_G == DT_F32) {
        return bitcast<f32>(grad[i]);
    }
    return half_from_word(grad[i >> 1u], i, DT_G);
}

// The gradient scale of clipping (1 without it): max_norm / (norm + 1e-6), at most 1.
fn clip_scale() -> f32 {
    if (params.clip == 0u) {
        return 1.0;
    }
    let s = params.max_norm / (norm[0] + 1e-6);
    return select(1.0, s, s < 1.0);
}

// The factor of every gradient element of a step: the clip scale, negated with `maximize`
// (so the scaled gradient is exactly −(g·scale), PyTorch's negation of the clipped gradient).
fn grad_scale() -> f32 {
    let s = clip_scale();
    if ((params.flags & FLAG_MAXIMIZE) != 0u) {
        return -s;
    }
    return s;
}

// First of the UNROLL element pairs (WG apart) that invocation lid of a step owns.
fn first_pair(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return group_index(wid, nwg) * WG * UNROLL + lid;
}

// Model copy word of `pair` from its two new master values (`b` is 0 past the end, which
// packs to a zero high half). Pairs past the end are not written.
fn store_copy(pair: u32, a: f32, b: f32) {
    if (pair < params.pairs) {
        model_copy[pair] = pack_halves(a, b, DT_C);
    }
}

// ---- AdamW ----

// One element: decoupled decay p·(1 − lr·wd), moments, bias-corrected update (the operation
// order of PyTorch's single-tensor AdamW). With AMSGrad the denominator takes
// v_max = max(v_max, v) (the raw second moment's running maximum, bias-corrected like v).
// Returns the new master value (0 past the end, where nothing is written).
fn adamw_element(i: u32, scale: f32) -> f32 {
    if (i >= params.count) {
        return 0.0;
    }
    let g = load_grad(i) * scale;
    var p = master[i] * params.decay;
    let m = params.beta1 * exp_avg[i] + params.one_minus_beta1 * g;
    let v = params.beta2 * exp_avg_sq[i] + params.one_minus_beta2 * (g * g);
    var v_den = v;
    if ((params.flags & FLAG_AMSGRAD) != 0u) {
        v_den = max(max_exp_avg_sq[i], v);
        max_exp_avg_sq[i] = v_den;
    }
    let denom = sqrt(v_den) / params.bc2_sqrt + params.eps;
    p = p - params.step_size * (m / denom);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    return p;
}

@compute @workgroup_size(WG)
fn adamw_step(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let first = first_pair(wid, nwg, lid);
    let scale = grad_scale();
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let pair = first + u * WG;
        adamw_element(2u * pair, scale);
        adamw_element(2u * pair + 1u, scale);
    }
}

@compute @workgroup_size(WG)
fn adamw_step_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let first = first_pair(wid, nwg, lid);
    let scale = grad_scale();
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let pair = first + u * WG;
        let a = adamw_element(2u * pair, scale);
        store_copy(pair, a, adamw_element(2u * pair + 1u, scale));
    }
}

// ---- SGD ----

// Weight decay added to the gradient, then p − lr·g (0 past the end, nothing written).
fn sgd_element(i: u32, scale: f32) -> f32 {
    if (i >= params.count) {
        return 0.0;
    }
    var p = master[i];
    let g = load_grad(i) * scale + params.decay * p;
    p = p - params.lr * g;
    master[i] = p;
    return p;
}

// With momentum μ and dampening τ: b = g on the first step, else μ·b + (1 − τ)·g; the step
// direction is b, or g + μ·b with Nesterov (0 past the end, nothing written).
fn sgd_momentum_element(i: u32, scale: f32) -> f32 {
    if (i >= params.count) {
        return 0.0;
    }
    var p = master[i];
    let g = load_grad(i) * scale + params.decay * p;
    var b = g;
    if ((params.flags & FLAG_FIRST) == 0u) {
        b = params.beta1 * momentum_buf[i] + params.one_minus_beta1 * g;
    }
    momentum_buf[i] = b;
    var d = b;
    if ((params.flags & FLAG_NESTEROV) != 0u) {
        d = g + params.beta1 * b;
    }
    p = p - params.lr * d;
    master[i] = p;
    return p;
}

@compute @workgroup_size(WG)
fn sgd_step(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let first = first_pair(wid, nwg, lid);
    let scale = grad_scale();
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let pair = first + u * WG;
        sgd_element(2u * pair, scale);
        sgd_element(2u * pair + 1u, scale);
    }
}

@compute @workgroup_size(WG)
fn sgd_step_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let first = first_pair(wid, nwg, lid);
    let scale = grad_scale();
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let pair = first + u * WG;
        let a = sgd_element(2u * pair, scale);
        store_copy(pair, a, sgd_element(2u * pair + 1u, scale));
    }
}

@compute @workgroup_size(WG)
fn sgd_momentum_step(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let first = first_pair(wid, nwg, lid);
    let scale = grad_scale();
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let pair = first + u * WG;
        sgd_momentum_element(2u * pair, scale);
        sgd_momentum_element(2u * pair + 1u, scale);
    }
}

@compute @workgroup_size(WG)
fn sgd_momentum_step_copy(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let first = first_pair(wid, nwg, lid);
    let scale = grad_scale();
    for (var u = 0u; u < UNROLL; u = u + 1u) {
        let pair = first + u * WG;
        let a = sgd_momentum_element(2u * pair, scale);
        store_copy(pair, a, sgd_momentum_element(2u * pair + 1u, scale));
    }
}

// ---- gradient norm ----

// g² of F32 element i (0 past the end).
fn square_f32(i: u32) -> f32 {
    if (i >= params.count) {
        return 0.0;
    }
    let g = bitcast<f32>(grad[i]);
    return g * g;
}

// Sum of g² of the two 16-bit elements of word w that exist.
fn square_word(w: u32) -> f32 {
    let i = 2u * w;
    if (i >= params.count) {
        return 0.0;
    }
    let word = grad[w];
    let a = half_from_word(word, 0u, DT_G);
    var s = a * a;
    if (i + 1u < params.count) {
        let b = half_from_word(word, 1u, DT_G);
        s = s + b * b;
    }
    return s;
}

// partials[base + block] = Σ g² over the block's WG·NORM_CHUNK elements. Invocation lid takes
// F32 elements lid + k·WG (16-bit: words, two elements each) of the block into four running
// sums (k mod 4), combined as (s0 + s1) + (s2 + s3), then the workgroup tree: a fixed order.
@compute @workgroup_size(WG)
fn norm_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let block = group_index(wid, nwg);
    let start = block * WG * NORM_CHUNK;
    if (start >= params.count) {
        return;
    }
    var acc = vec4<f32>(0.0);
    if (DT_G == DT_F32) {
        for (var k = 0u; k < NORM_CHUNK; k = k + 4u) {
            let i = start + k * WG + lid;
            acc = acc + vec4(square_f32(i), square_f32(i + WG), square_f32(i + 2u * WG),
                             square_f32(i + 3u * WG));
        }
    } else {
        let first = start / 2u;
        for (var k = 0u; k < NORM_CHUNK / 2u; k = k + 4u) {
            let w = first + k * WG + lid;
            acc = acc + vec4(square_word(w), square_word(w + WG), square_word(w + 2u * WG),
                             square_word(w + 3u * WG));
        }
    }
    let total = workgroup_sum((acc.x + acc.y) + (acc.z + acc.w), lid);
    if (lid == 0u) {
        partials[params.base + block] = total;
    }
}

fn partial_at(b: u32) -> f32 {
    if (b >= params.blocks) {
        return 0.0;
    }
    return partials_in[b];
}

// norm_out[0] = sqrt(Σ partials): invocation lid takes partials lid + k·WG into four running
// sums (k mod 4), then the workgroup tree. One workgroup.
@compute @workgroup_size(WG)
fn norm_finish(@builtin(local_invocation_index) lid: u32) {
    var acc = vec4<f32>(0.0);
    for (var b = lid; b < params.blocks; b = b + 4u * WG) {
        acc = acc + vec4(partial_at(b), partial_at(b + WG), partial_at(b + 2u * WG),
                         partial_at(b + 3u * WG));
    }
    let total = workgroup_sum((acc.x + acc.y) + (acc.z + acc.w), lid);
    if (lid == 0u) {
        norm_out[0] = sqrt(total);
    }
}
