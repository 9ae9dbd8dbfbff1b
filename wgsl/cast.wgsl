// Casts between F32, F16 and BF16 storage. Every buffer is bound as u32 words. One invocation
// owns one pair of elements (2j, 2j+1), so it owns every output word it touches: a 16-bit
// output word holds exactly that pair, an f32 output takes two words. No two invocations
// write the same word, whatever the element count's parity.

override SRC: u32 = 0u;
override DST: u32 = 1u;
const WG: u32 = 256u;

struct Params {
    count: u32,  // elements
    pairs: u32,  // ceil(count / 2)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> source: array<u32>;
@group(0) @binding(2) var<storage, read_write> dest: array<u32>;

fn load(i: u32) -> f32 {
    if (SRC == DT_F32) {
        return bitcast<f32>(source[i]);
    }
    return half_from_word(source[i >> 1u], i, SRC);
}

@compute @workgroup_size(WG)
fn convert(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let pair = group_index(wid, nwg) * WG + lid;
    if (pair >= params.pairs) {
        return;
    }
    let i = pair * 2u;
    let has_second = i + 1u < params.count;
    var a = 0.0;
    var b = 0.0;
    if (SRC == DT_BF16 && DST != DT_F32) {
        // BF16 to 16-bit: the fast widening, a shift or a mask (the narrowing quiets a NaN);
        // the padding half of an odd count is zero and is not written. F16 sources take
        // `load`, whose exact widening keeps a NaN's payload: the hardware conversion of
        // `widen2` need not (an H200 returned another NaN for 0x7c01).
        let v = widen2(source[pair], SRC);
        a = v.x;
        b = v.y;
    } else {
        a = load(i);
        if (has_second) {
            b = load(i + 1u);
        }
    }
    if (DST == DT_F32) {
        dest[i] = bitcast<u32>(a);
        if (has_second) {
            dest[i + 1u] = bitcast<u32>(b);
        }
    } else {
        if (has_second) {
            dest[pair] = pack_halves(a, b, DST);
        } else {
            dest[pair] = half_bits(a, DST); // the padding half stays zero
        }
    }
}
