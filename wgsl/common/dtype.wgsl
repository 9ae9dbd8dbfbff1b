// Storage dtype codes and exact conversions between f32 and the 16-bit formats.
// 16-bit tensors live in u32 words, element 2i in the low half. Narrowing rounds to nearest
// even (ties to even), keeps NaN a NaN and overflows to infinity, bit for bit as the `half`
// crate does. Widening is exact, subnormals included (no flush to zero); a NaN comes back
// quiet (its top mantissa bit set), as `half` does.

const DT_F32: u32 = 0u;
const DT_F16: u32 = 1u;
const DT_BF16: u32 = 2u;
const DT_I32: u32 = 3u;
const DT_U32: u32 = 4u;

fn bf16_to_f32(h: u32) -> f32 {
    if ((h & 0x7fffu) > 0x7f80u) {
        return bitcast<f32>(((h & 0xffffu) | 0x40u) << 16u); // NaN comes back quiet
    }
    return bitcast<f32>((h & 0xffffu) << 16u);
}

fn f32_to_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return ((b >> 16u) | 0x40u) & 0xffffu; // quiet NaN, sign kept
    }
    let rounding = 0x7fffu + ((b >> 16u) & 1u);
    return ((b + rounding) >> 16u) & 0xffffu;
}

fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // zero or subnormal: m * 2^-24, exact in f32
        let v = f32(m) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(v) | sign);
    }
    if (e == 31u) {
        if (m != 0u) {
            return bitcast<f32>(sign | 0x7fc00000u | (m << 13u)); // NaN comes back quiet
        }
        return bitcast<f32>(sign | 0x7f800000u);
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn f32_to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let e = (b >> 23u) & 0xffu;
    let m = b & 0x7fffffu;
    if (e == 255u) {
        if (m != 0u) {
            return sign | 0x7e00u | (m >> 13u); // NaN stays NaN (quiet bit set)
        }
        return sign | 0x7c00u;
    }
    let he = i32(e) - 112;
    if (he >= 31) {
        return sign | 0x7c00u; // overflow to infinity
    }
    if (he <= 0) {
        // subnormal or zero in f16
        if (he < -10) {
            return sign;
        }
        let mant = m | 0x800000u;
        let shift = u32(14 - he);
        let half_m = mant >> shift;
        let rem = mant & ((1u << shift) - 1u);
        let halfway = 1u << (shift - 1u);
        var r = half_m;
        if (rem > halfway || (rem == halfway && (half_m & 1u) == 1u)) {
            r = r + 1u;
        }
        return sign | r;
    }
    let base = (u32(he) << 10u) | (m >> 13u);
    let rem = m & 0x1fffu;
    var r = base;
    if (rem > 0x1000u || (rem == 0x1000u && (base & 1u) == 1u)) {
        r = r + 1u; // may carry into the exponent, up to infinity: still correct
    }
    return sign | r;
}

// Widen one element of 16-bit storage, given its word and index.
fn half_from_word(word: u32, index: u32, dt: u32) -> f32 {
    let h = (word >> ((index & 1u) * 16u)) & 0xffffu;
    if (dt == DT_BF16) {
        return bf16_to_f32(h);
    }
    return f16_to_f32(h);
}

// Narrow an f32 to the 16-bit bits of dtype `dt`.
fn half_bits(x: f32, dt: u32) -> u32 {
    if (dt == DT_BF16) {
        return f32_to_bf16(x);
    }
    return f32_to_f16(x);
}

// Two f32 values narrowed to dtype `dt` and packed into one word (first in the low half).
fn pack_halves(lo: f32, hi: f32, dt: u32) -> u32 {
    return half_bits(lo, dt) | (half_bits(hi, dt) << 16u);
}

// Both elements of a 16-bit word, widened for arithmetic (element 2i in `.x`). Exact for every
// finite value, subnormals included, and cheaper than `half_from_word`: BF16 is a shift or a
// mask, F16 the hardware conversion. A NaN stays a NaN, but its payload is the hardware's (BF16:
// unquieted; F16: whatever the conversion gives, not always the input's on NVIDIA), so use this
// where the value feeds arithmetic, and `half_from_word` where the widened bits are stored or
// narrowed again and must match `half` bit for bit.
fn widen2(word: u32, dt: u32) -> vec2<f32> {
    if (dt == DT_BF16) {
        return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
    }
    return unpack2x16float(word);
}

// Two values narrowed to dtype `dt` and packed into one word (`.x` in the low half).
fn narrow2(v: vec2<f32>, dt: u32) -> u32 {
    return pack_halves(v.x, v.y, dt);
}

// BF16 rounding of four values, bit for bit as `f32_to_bf16`: round to nearest even, a NaN
// stays a NaN with its quiet bit set. `bf16_rne` rounds values that are not NaN in three
// integer operations a value (the sign and infinities come through, overflow goes to
// infinity; the low half keeps the rounding's carry bits, for the callers to mask or shift
// out); `bf16_bits` any value, without branches (the high halves). `bf16x4_nearest` packs
// values known not to be NaN into two words (`.x` in the low half of the first; a NaN may come
// out as anything), `bf16_pack` any values.
fn bf16_rne(v: vec4<f32>) -> vec4<u32> {
    let b = bitcast<vec4<u32>>(v);
    return b + (vec4<u32>(0x7fffu) + ((b >> vec4<u32>(16u)) & vec4<u32>(1u)));
}

fn bf16_bits(v: vec4<f32>) -> vec4<u32> {
    let b = bitcast<vec4<u32>>(v);
    let r = bf16_rne(v) & vec4<u32>(0xffff0000u);
    let nan = (b & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
    return select(r, (b | vec4<u32>(0x400000u)) & vec4<u32>(0xffff0000u), nan);
}

fn bf16x4_nearest(v: vec4<f32>) -> vec2<u32> {
    let h = bf16_rne(v);
    return vec2<u32>((h.x >> 16u) | (h.y & 0xffff0000u), (h.z >> 16u) | (h.w & 0xffff0000u));
}

fn bf16_pack(v: vec4<f32>) -> vec2<u32> {
    let h = bf16_bits(v);
    return vec2<u32>((h.x >> 16u) | h.y, (h.z >> 16u) | h.w);
}

// Whether none of eight values is NaN: their FP32 sum is not NaN (a NaN term makes it NaN; so
// do opposite infinities, which callers then treat as possibly NaN).
fn nan_free8(lo: vec4<f32>, hi: vec4<f32>) -> bool {
    let s = ((lo.x + lo.y) + (lo.z + lo.w)) + ((hi.x + hi.y) + (hi.z + hi.w));
    return (bitcast<u32>(s) & 0x7fffffffu) <= 0x7f800000u;
}

// Eight values narrowed to 16-bit dtype `dt` and packed into four words (`lo.x` in the low half
// of the first), bit for bit as `pack_halves`. BF16 takes `bf16x4_nearest` when `nan_free8`,
// `bf16_pack` otherwise.
fn narrow8(lo: vec4<f32>, hi: vec4<f32>, dt: u32) -> vec4<u32> {
    if (dt == DT_BF16) {
        if (nan_free8(lo, hi)) {
            return vec4<u32>(bf16x4_nearest(lo), bf16x4_nearest(hi));
        }
        return vec4<u32>(bf16_pack(lo), bf16_pack(hi));
    }
    return vec4<u32>(narrow4(lo, dt), narrow4(hi, dt));
}

// Four values narrowed the same way into two words.
fn narrow4(v: vec4<f32>, dt: u32) -> vec2<u32> {
    if (dt == DT_BF16) {
        if (nan_free8(v, vec4<f32>(0.0))) {
            return bf16x4_nearest(v);
        }
        return bf16_pack(v);
    }
    return vec2<u32>(narrow2(v.xy, dt), narrow2(v.zw, dt));
}

// ---- 16-byte chunks: 4 F32 or 8 16-bit values in a vec4<u32> ----

// Elements per vec4<u32> chunk of dtype `dt`.
fn chunk_width(dt: u32) -> u32 {
    if (dt == DT_F32) {
        return 4u;
    }
    return 8u;
}

// Elements 0..4 of a chunk of dtype `dt`. 16-bit halves are widened with `widen2` (a shift
// or mask for BF16, the hardware conversion for F16): every use feeds arithmetic or a
// narrowing, so a NaN's unquieted payload never reaches an output as it is.
fn chunk_lo(w: vec4<u32>, dt: u32) -> vec4<f32> {
    if (dt == DT_F32) {
        return bitcast<vec4<f32>>(w);
    }
    return vec4<f32>(widen2(w.x, dt), widen2(w.y, dt));
}

// Elements 4..8 of a 16-bit chunk.
fn chunk_hi(w: vec4<u32>, dt: u32) -> vec4<f32> {
    return vec4<f32>(widen2(w.z, dt), widen2(w.w, dt));
}

// ---- Division rounded to nearest even ----

// x = hi + lo exactly, hi holding x's leading 12 significant bits (Veltkamp's split).
fn split12(x: f32) -> vec2<f32> {
    let t = x * 4097.0;
    let hi = t - (t - x);
    return vec2<f32>(hi, x - hi);
}

// a − q·n exactly, for q·n within a few units of the last place of a (Dekker's product: no fused
// operation, so exact on every adapter under strict math, fused `fma` or not).
fn div_residual(a: f32, q: f32, n: f32) -> f32 {
    let p = q * n;
    let qs = split12(q);
    let ns = split12(n);
    let e = ((qs.x * ns.x - p) + qs.x * ns.y + qs.y * ns.x) + qs.y * ns.y;
    return (a - p) - e;
}

// a / n rounded to nearest even, for n an integer-valued f32 in [1, 2^24] and 2^-76 ≤ |a| <
// 2^100 (other a: WGSL's `/`). WGSL's `/` need not round correctly (Vulkan allows 2.5 units of
// the last place; an H200's differs from the host's division in the last bit): its quotient is
// corrected once with its exact residual, which leaves it within one unit, then moved to its
// neighbour when the exact residual says a / n lies past their midpoint (a / n is never on
// one). `tests/embedding.rs` runs it on the host, every division off by up to 3 units of the
// last place, against the host's correctly rounded division.
fn div_rn(a: f32, n: f32) -> f32 {
    let q0 = a / n;
    let m = abs(a);
    if (!(m >= 1.3234889800848443e-23 && m < 1.2676506002282294e30)) {
        return q0;
    }
    let q1 = q0 + div_residual(a, q0, n) / n;
    let r = div_residual(a, q1, n);
    // q1's neighbour toward a / n (bits + 1 is the larger magnitude), and half the gap times n.
    let b = bitcast<u32>(q1);
    let q2 = bitcast<f32>(select(b - 1u, b + 1u, (r > 0.0) == (q1 > 0.0)));
    return select(q1, q2, abs(r) > abs(q2 - q1) * 0.5 * n);
}
