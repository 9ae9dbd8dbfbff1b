// Scalar activation formulas shared by every kernel with an activation (the activation
// family, the matmul epilogue): `activation_eval(kind, x)` returns (act(x), act'(x)) in FP32
// for the code `kind` of `Activation::code()`. The activation family passes an override
// constant (the switch folds away when the pipeline is specialized); the matmul epilogue a
// uniform parameter (one pipeline for every activation).

const K_SILU: u32 = 0u;
const K_SIGMOID: u32 = 1u;
const K_GELU_TANH: u32 = 2u;
const K_GELU: u32 = 3u;
const K_QUICK_GELU: u32 = 4u;
const K_RELU: u32 = 5u;
const K_RELU_SQUARED: u32 = 6u;
const K_TANH: u32 = 7u;

// (σ(x), σ(−x)) = (σ(x), 1 − σ(x)) without cancellation: both from e = exp(−|x|) ≤ 1.
fn sigmoid2(x: f32) -> vec2<f32> {
    let e = exp(-abs(x));
    let big = 1.0 / (1.0 + e);
    let small = e * big;
    if (x >= 0.0) {
        return vec2(big, small);
    }
    return vec2(small, big);
}

fn tanh_safe(x: f32) -> f32 {
    // |x| ≥ 9.01 rounds to ±1 in f32; clamping keeps exp-based tanh implementations
    // away from inf / inf.
    return tanh(clamp(x, -10.0, 10.0));
}

// erfc(z) for z ≥ 1: t·exp(−z² + P(t)), t = 1 / (1 + z/2), P a Chebyshev interpolant of
// degree 9 fitted on z ∈ [1, 10] (relative error 6e-10 in exact arithmetic). z² is split as
// zh² + (z − zh)(z + zh) with zh holding 12 significant bits, so zh² is exact and exp's
// argument carries no rounding of order z²·2⁻²⁴.
fn erfc_tail(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    var p = 0.2082216702401638;
    p = p * t - 1.0246794751845298;
    p = p * t + 1.9282951357929654;
    p = p * t - 1.647192611753901;
    p = p * t + 0.633472994938697;
    p = p * t - 0.33792008980241844;
    p = p * t + 0.13672546277438655;
    p = p * t + 0.3678586160216114;
    p = p * t + 1.000546982500873;
    p = p * t - 1.2655303879990418;
    let zh = bitcast<f32>(bitcast<u32>(z) & 0xfffff000u);
    let zl = z - zh;
    return t * exp(-zh * zh) * exp(-zl * (z + zh) + p);
}

// erf(z) for |z| < 1: Taylor series 2/√π Σ (−1)ⁿ z^(2n+1) / (n!(2n+1)), n ≤ 10 (truncation
// below 2e-9 relative), Horner in z².
fn erf_small(z: f32) -> f32 {
    let s = z * z;
    var p = 1.4807192815879218e-08;
    p = p * s - 1.6365844691234924e-07;
    p = p * s + 1.6462114365889246e-06;
    p = p * s - 1.492565035840625e-05;
    p = p * s + 0.00012055332981789664;
    p = p * s - 0.0008548327023450852;
    p = p * s + 0.005223977625442188;
    p = p * s - 0.026866170645131252;
    p = p * s + 0.11283791670955126;
    p = p * s - 0.37612638903183754;
    p = p * s + 1.1283791670955126;
    return z * p;
}

fn erf_f32(z: f32) -> f32 {
    let a = abs(z);
    if (a < 1.0) {
        return erf_small(z);
    }
    if (a >= 10.0) {
        return sign(z);
    }
    return sign(z) * (1.0 - erfc_tail(a));
}

// Φ(x) = ½·erfc(−x/√2), the standard normal CDF, with relative accuracy in the lower tail.
fn normal_cdf(x: f32) -> f32 {
    let z = x * 0.70710678118654752;
    if (z <= -1.0) {
        if (z <= -10.0) {
            return 0.0;
        }
        return 0.5 * erfc_tail(-z);
    }
    return 0.5 * (1.0 + erf_f32(z));
}

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;
const GELU_C: f32 = 0.044715;
const INV_SQRT_2PI: f32 = 0.3989422804014327;

// (act(x), act'(x)) of the activation with code `kind` (`Activation::code()`).
fn activation_eval(kind: u32, x: f32) -> vec2<f32> {
    switch kind {
        case K_SILU: {
            let s = sigmoid2(x);
            return vec2(x * s.x, s.x * (1.0 + x * s.y));
        }
        case K_SIGMOID: {
            let s = sigmoid2(x);
            return vec2(s.x, s.x * s.y);
        }
        case K_GELU_TANH: {
            // ½x(1 + tanh(u)) = x·σ(2u): no cancellation for negative x.
            let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
            let s = sigmoid2(2.0 * u);
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
            return vec2(x * s.x, s.x + 2.0 * x * s.x * s.y * du);
        }
        case K_GELU: {
            let cdf = normal_cdf(x);
            let pdf = INV_SQRT_2PI * exp(-0.5 * x * x);
            return vec2(x * cdf, cdf + x * pdf);
        }
        case K_QUICK_GELU: {
            let s = sigmoid2(1.702 * x);
            return vec2(x * s.x, s.x + 1.702 * x * s.x * s.y);
        }
        case K_RELU: {
            if (x > 0.0) {
                return vec2(x, 1.0);
            }
            return vec2(0.0, 0.0);
        }
        case K_RELU_SQUARED: {
            if (x > 0.0) {
                return vec2(x * x, 2.0 * x);
            }
            return vec2(0.0, 0.0);
        }
        default: { // K_TANH
            // tanh' = 1 − tanh² = 4e/(1 + e)², e = exp(−2|x|): no cancellation in the tails.
            let e = exp(-2.0 * abs(x));
            let d = 4.0 * e / ((1.0 + e) * (1.0 + e));
            return vec2(tanh_safe(x), d);
        }
    }
}
