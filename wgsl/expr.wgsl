// Expression kernels: the fixed part of every kernel `crate::expr` generates. The generated
// part that follows declares the bindings (`params`, one array of u32 words per input, saved
// statistics, statistics, outputs), the input loads, the value functions and the entries
// `reduce_rows` (a workgroup of WG lanes a row: every row reduction, level by level, into
// `stats`), `elements` (an invocation per two consecutive elements: the element outputs) and
// `row_outputs` (an invocation per two consecutive rows: the row outputs).

struct Params {
    rows: u32,       // rows of the element inputs (their leading axes flattened)
    cols: u32,       // the last axis
    count: u32,      // rows · cols
    pairs: u32,      // ⌈count / 2⌉
    row_pairs: u32,  // ⌈rows / 2⌉
}

// +∞, the start of a running minimum (−∞ of a maximum).
fn expr_inf() -> f32 {
    return bitcast<f32>(0x7f800000u);
}

// A quiet NaN, the result of a maximum or minimum over a row holding a NaN.
fn expr_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

// Whether v is a NaN (by its bits: a compiler may fold `v != v`).
fn expr_is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// A lane's running maximum (`is_max`) or minimum over the values that are not NaN.
fn extreme_step(acc: f32, v: f32, is_max: bool) -> f32 {
    if (expr_is_nan(v)) {
        return acc;
    }
    if (is_max) {
        return max(acc, v);
    }
    return min(acc, v);
}

// The row's maximum or minimum from each lane's running one and whether the lane saw a NaN:
// NaN if any lane did, else the fixed-order tree of `workgroup_max` (a minimum as the negated
// maximum of the negated values, exact). Uniform control flow only.
fn row_extreme(acc: f32, saw_nan: bool, lid: u32, is_max: bool) -> f32 {
    let nans = workgroup_sum(select(0.0, 1.0, saw_nan), lid);
    var v = acc;
    if (!is_max) {
        v = -acc;
    }
    let m = workgroup_max(v, lid);
    if (nans > 0.0) {
        return expr_nan();
    }
    if (is_max) {
        return m;
    }
    return -m;
}

// Rounding to a 16-bit dtype and back (the forward of a cast; its derivative is 1).
fn round_bf16(x: f32) -> f32 {
    return bf16_to_f32(f32_to_bf16(x));
}

fn round_f16(x: f32) -> f32 {
    return f16_to_f32(f32_to_f16(x));
}

// The element at flat index `i` of a buffer of `dt` values bound as u32 words.
fn word_value(word: u32, i: u32, dt: u32) -> f32 {
    if (dt == DT_F32) {
        return bitcast<f32>(word);
    }
    return half_from_word(word, i, dt);
}

// The word holding values `a` (its first) and `b` of a 16-bit output; `two`: b is real (the
// last word of an odd count keeps a zero half).
fn half_word(a: f32, b: f32, two: bool, dt: u32) -> u32 {
    if (two) {
        return pack_halves(a, b, dt);
    }
    return half_bits(a, dt);
}
