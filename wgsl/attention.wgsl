// Stable softmax attention: a tiled forward with online softmax and a deterministic backward
// in three passes (row deltas, dK/dV per key block, dQ per query block). No atomics. By
// default no quadratic buffer: every score tile lives in workgroup memory only, and the dQ
// pass recomputes the scores and dO·vᵀ of its tiles. The stored schedule instead has the
// dK/dV pass (attention_dkdv_store) write each tile's score gradients to ds_store, for a slice
// of (batch, kv head) groups at a time, and attention_dq_stored reads them back: five
// score-sized products instead of seven, the same bits.
//
// Shapes (elements; strides come from the host, so [B,H,S,D] and [B,S,H,D] read alike):
//   query, output, d_output, d_query   [batch, q_heads, q_len, HD] at the query strides
//   key, value, d_key, d_value          [batch, kv_heads, k_len, HD] at the key strides
//   mask (optional)                     one u32 per (query, key), nonzero = visible,
//                                       batch and head strides 0 when broadcast
//   row_max, log_den                    [batch, q_heads, q_len], contiguous
//   row_info (backward scratch)         [batch, q_heads, q_len, 4]: row_max, log_den, delta, 0
//
// Numerics: scores s = q·k stay raw (unscaled); a row keeps its raw maximum m and the sum
// l = Σ exp(scale·(s − m)) (the raw maximum is subtracted before the scale is applied), and
// saves m and log(l) separately. Probabilities in the backward are exp(scale·(s − m) − log l).
// dQ and dK are accumulated unscaled and multiplied by the scale once at the end. A query row
// with no visible key has output 0, m = log l = −∞ and zero gradients.
//
// Work split: 256 invocations, (tx, ty) = (lid % 16, lid / 16), on tiles of 64 rows × 64
// columns (forward, dQ: queries × keys; dK/dV: keys × queries). An invocation computes the
// 4 × 4 scores of rows ty + 16·i and columns tx + 16·j, and accumulates rows ty + 16·i ×
// columns 64·c + 4·tx .. + 3 of every 64-column head-dim chunk c: sixteen named vec4
// registers at most (`Acc`), never an indexed private array (those go to slow local memory
// on some drivers). Operands are staged in workgroup memory in 16-column steps for the score
// products and 512-vec4 row groups for the accumulations, each loaded into registers one
// step ahead; staging rows are padded (stride 17 vec4) or, in the forward and the dQ pass over
// stored tiles, swizzled (stride 16, row XOR column: a smaller footprint) so no two lanes of a
// quarter-warp share a bank (`dot_at`, `ps_at`). Head dims are multiples of 8 up to 256.
// Staging reads sixteen bytes per lane (one vec4<u32>: four F32 or eight 16-bit values of a
// row) in the forward and for 16-bit operands of the backward; F32 backward operands are
// gathered element by element.

override DT: u32 = 0u;   // storage dtype of query, key and value
override DTO: u32 = 0u;  // storage dtype of d_output
override HD: u32 = 64u;  // head dim
override DTG: u32 = 0u;  // storage dtype of the gradients: F32, or F16/BF16 (the F32 values rounded once)

const WG: u32 = 256u;

struct Params {
    batch: u32,
    q_heads: u32,
    kv_heads: u32,
    q_len: u32,
    k_len: u32,
    group: u32,      // q_heads / kv_heads
    q_sb: u32,       // query-layout strides: batch, head, sequence (head dim is contiguous)
    q_sh: u32,
    q_ss: u32,
    k_sb: u32,       // key-layout strides
    k_sh: u32,
    k_ss: u32,
    m_sb: u32,       // mask strides: batch, head, query (key is contiguous)
    m_sh: u32,
    m_sq: u32,
    has_mask: u32,
    offset: i32,     // diagonal: query i is aligned with key i + offset
    lo: i32,         // visible iff lo ≤ key − query − offset ≤ hi
    hi: i32,
    scale: f32,
    rows: u32,       // batch · q_heads · q_len (delta pass)
    same_output: u32, // F32 query: the output is the saved output, output_f32 is not written
    first_group: u32, // dK/dV and stored-dQ passes: first (batch, kv head) group of the launch
    groups: u32,      // and how many (every one: batch · kv_heads, unless sliced)
    chunk_len: u32,   // dual-chunk partitions: chunk length (0: none)
    branch: u32,      // and the branch: 0 intra-chunk, 1 successive-chunk, 2 inter-chunk
    dilation: u32,    // visible keys a multiple of this from the diagonal (1: every key)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> query: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> key: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> value: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> mask: array<u32>;
@group(0) @binding(5) var<storage, read> d_output: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> saved_output: array<f32>;
@group(0) @binding(7) var<storage, read> row_info: array<f32>;
@group(0) @binding(8) var<storage, read_write> output: array<u32>;
@group(0) @binding(9) var<storage, read_write> output_f32: array<f32>;
@group(0) @binding(10) var<storage, read_write> row_max: array<f32>;
@group(0) @binding(11) var<storage, read_write> log_den: array<f32>;
// Gradients as words: F32 bits, or two 16-bit values a word (DTG).
@group(0) @binding(12) var<storage, read_write> grad_a: array<u32>;
@group(0) @binding(13) var<storage, read_write> grad_b: array<u32>;
@group(0) @binding(14) var<storage, read_write> info_out: array<f32>;
// Score-gradient tiles of the stored schedule: 1,024 vec4 per visible 64 × 64 tile
// of a launch's query heads, indexed ((local query head · q_tiles + query block) · k_tiles +
// key block) · 1,024.
@group(0) @binding(15) var<storage, read_write> ds_store: array<vec4<f32>>;


fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn load_q(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(query[i >> 2u][i & 3u]);
    }
    let w = i >> 1u;
    return half_from_word(query[w >> 2u][w & 3u], i, DT);
}

fn load_k(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(key[i >> 2u][i & 3u]);
    }
    let w = i >> 1u;
    return half_from_word(key[w >> 2u][w & 3u], i, DT);
}

fn load_v(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(value[i >> 2u][i & 3u]);
    }
    let w = i >> 1u;
    return half_from_word(value[w >> 2u][w & 3u], i, DT);
}

fn load_do(i: u32) -> f32 {
    if (DTO == DT_F32) {
        return bitcast<f32>(d_output[i >> 2u][i & 3u]);
    }
    let w = i >> 1u;
    return half_from_word(d_output[w >> 2u][w & 3u], i, DTO);
}

// Whether the band (causal / window) lets some query in [q_first, q_last] see some key in
// [k_first, k_last], and (dual-chunk partitions) whether the branch's chunks can meet there.
// Uniform per workgroup, so a skipped tile skips its barriers everywhere.
fn block_visible(q_first: u32, q_last: u32, k_first: u32, k_last: u32) -> bool {
    let rel_min = i32(k_first) - i32(q_last) - params.offset;
    let rel_max = i32(k_last) - i32(q_first) - params.offset;
    if (rel_max < params.lo || rel_min > params.hi) {
        return false;
    }
    if (params.chunk_len == 0u) {
        return true;
    }
    // Query chunks [cq0, cq1] (positions i + offset ≥ 0), key chunks [ck0, ck1].
    let cq0 = u32(i32(q_first) + params.offset) / params.chunk_len;
    let cq1 = u32(i32(q_last) + params.offset) / params.chunk_len;
    let ck0 = k_first / params.chunk_len;
    let ck1 = k_last / params.chunk_len;
    if (params.branch == 0u) {
        return ck0 <= cq1 && cq0 <= ck1;
    }
    if (params.branch == 1u) {
        return ck0 + 1u <= cq1 && cq0 <= ck1 + 1u;
    }
    return ck0 + 2u <= cq1;
}

// Dual-chunk partition of the causal keys of query qi (position p = qi + offset, chunk
// p / chunk_len): branch 0 the keys of its own chunk (up to p: the band), 1 those of the chunk
// before, 2 those of every chunk before that.
fn in_branch(qi: u32, kj: u32) -> bool {
    let cq = u32(i32(qi) + params.offset) / params.chunk_len;
    let ck = kj / params.chunk_len;
    if (params.branch == 0u) {
        return ck == cq;
    }
    if (params.branch == 1u) {
        return ck + 1u == cq;
    }
    return ck + 2u <= cq;
}

// Whether query qi of (batch b, query head h) sees key kj (both in range).
fn visible(b: u32, h: u32, qi: u32, kj: u32) -> bool {
    let rel = i32(kj) - i32(qi) - params.offset;
    if (rel < params.lo || rel > params.hi) {
        return false;
    }
    if (params.chunk_len != 0u && !in_branch(qi, kj)) {
        return false;
    }
    if (params.dilation > 1u && u32(abs(rel)) % params.dilation != 0u) {
        return false;
    }
    if (params.has_mask != 0u) {
        return mask[b * params.m_sb + h * params.m_sh + qi * params.m_sq + kj] != 0u;
    }
    return true;
}

// Accumulator block of one invocation: rows ty + 16·i (i < 4) × columns 64·c + 4·tx .. + 3
// (c < NCH), one named vec4 per (row, chunk): registers, never an indexed array.
struct Acc {
    a00: vec4<f32>,
    a01: vec4<f32>,
    a02: vec4<f32>,
    a03: vec4<f32>,
    a10: vec4<f32>,
    a11: vec4<f32>,
    a12: vec4<f32>,
    a13: vec4<f32>,
    a20: vec4<f32>,
    a21: vec4<f32>,
    a22: vec4<f32>,
    a23: vec4<f32>,
    a30: vec4<f32>,
    a31: vec4<f32>,
    a32: vec4<f32>,
    a33: vec4<f32>,
}

// a with row i multiplied by f[i].
fn acc_scale(a: Acc, f: vec4<f32>) -> Acc {
    var r = a;
    r.a00 = r.a00 * f.x;
    r.a10 = r.a10 * f.y;
    r.a20 = r.a20 * f.z;
    r.a30 = r.a30 * f.w;
    if (NCH > 1u) {
        r.a01 = r.a01 * f.x;
        r.a11 = r.a11 * f.y;
        r.a21 = r.a21 * f.z;
        r.a31 = r.a31 * f.w;
    }
    if (NCH > 2u) {
        r.a02 = r.a02 * f.x;
        r.a12 = r.a12 * f.y;
        r.a22 = r.a22 * f.z;
        r.a32 = r.a32 * f.w;
    }
    if (NCH > 3u) {
        r.a03 = r.a03 * f.x;
        r.a13 = r.a13 * f.y;
        r.a23 = r.a23 * f.z;
        r.a33 = r.a33 * f.w;
    }
    return r;
}

// a += p[i] · (staged row at vec4 offset `at`), for every row i and chunk: one fma per term.
fn acc_step(a: Acc, p: vec4<f32>, at: u32, tx: u32) -> Acc {
    var r = a;
    let v0 = xs[at + 0u + tx];
    r.a00 = fma(vec4<f32>(p.x), v0, r.a00);
    r.a10 = fma(vec4<f32>(p.y), v0, r.a10);
    r.a20 = fma(vec4<f32>(p.z), v0, r.a20);
    r.a30 = fma(vec4<f32>(p.w), v0, r.a30);
    if (NCH > 1u) {
        let v1 = xs[at + 16u + tx];
        r.a01 = fma(vec4<f32>(p.x), v1, r.a01);
        r.a11 = fma(vec4<f32>(p.y), v1, r.a11);
        r.a21 = fma(vec4<f32>(p.z), v1, r.a21);
        r.a31 = fma(vec4<f32>(p.w), v1, r.a31);
    }
    if (NCH > 2u) {
        let v2 = xs[at + 32u + tx];
        r.a02 = fma(vec4<f32>(p.x), v2, r.a02);
        r.a12 = fma(vec4<f32>(p.y), v2, r.a12);
        r.a22 = fma(vec4<f32>(p.z), v2, r.a22);
        r.a32 = fma(vec4<f32>(p.w), v2, r.a32);
    }
    if (NCH > 3u) {
        let v3 = xs[at + 48u + tx];
        r.a03 = fma(vec4<f32>(p.x), v3, r.a03);
        r.a13 = fma(vec4<f32>(p.y), v3, r.a13);
        r.a23 = fma(vec4<f32>(p.z), v3, r.a23);
        r.a33 = fma(vec4<f32>(p.w), v3, r.a33);
    }
    return r;
}

// Row i, chunk c of a (epilogue only).
fn acc_get(a: Acc, i: u32, c: u32) -> vec4<f32> {
    switch (i * 4u + c) {
        case 0u: { return a.a00; }
        case 1u: { return a.a01; }
        case 2u: { return a.a02; }
        case 3u: { return a.a03; }
        case 4u: { return a.a10; }
        case 5u: { return a.a11; }
        case 6u: { return a.a12; }
        case 7u: { return a.a13; }
        case 8u: { return a.a20; }
        case 9u: { return a.a21; }
        case 10u: { return a.a22; }
        case 11u: { return a.a23; }
        case 12u: { return a.a30; }
        case 13u: { return a.a31; }
        case 14u: { return a.a32; }
        case 15u: { return a.a33; }
        default: { return vec4<f32>(0.0); }
    }
}

// Query block of workgroup g of a launch with q_tiles blocks a head. LAST_FIRST: a head's
// blocks from the last one down, so that under a causal mask (the last rows see the most keys)
// the longest workgroups start first and a launch ends on short ones; otherwise in order.
override LAST_FIRST: bool = true;

fn query_block(g: u32, q_tiles: u32) -> u32 {
    if (LAST_FIRST) {
        return q_tiles - 1u - g % q_tiles;
    }
    return g % q_tiles;
}

// Workgroup memory: `xs` stages operand slices (two blocks of 16 columns × 16 vec4 rows for
// the score products, `dot_at`; KS rows × RS vec4 for the accumulations; or the row partials
// of the softmax); `ps` holds P_COLS columns of a 64 × 64 tile of probabilities or score
// gradients, column-major by tile column: ps[ps_at(col, ty)] = the 4 rows ty + 16·i of that
// column. Two layouts of the same values, both free of bank conflicts (see `dot_at`): PADDED
// (25.5 KiB: a column's vec4s 17 apart, so unrolled loops address them by constant offsets) or
// swizzled (24 KiB: 16 apart, the row XOR-ed with the column; one more integer operation a
// load, a smaller footprint). P_COLS = 32 (compact, with the swizzled layout: 16 KiB, WebGPU's
// default limit) holds the tile in two halves of 32 columns, one after the other; the
// accumulations take the same terms in the same order, so the bits do not change.
override PADDED: bool = true;
override P_COLS: u32 = 64u;
override XS_LEN: u32 = select(512u, 544u, PADDED);
override PS_LEN: u32 = P_COLS * select(16u, 17u, PADDED);
var<workgroup> xs: array<vec4<f32>, XS_LEN>;
var<workgroup> ps: array<vec4<f32>, PS_LEN>;

// Scores (or dO·v) block of one invocation: component j of r_i is (row ty + 16·i,
// column tx + 16·j) of the tile.
struct Blk {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
}

const KIND_Q: u32 = 0u;
const KIND_K: u32 = 1u;
const KIND_V: u32 = 2u;
const KIND_DO: u32 = 3u;

fn fetch_fwd(kind: u32, i: u32) -> f32 {
    if (kind == KIND_Q) {
        return load_q(i);
    }
    if (kind == KIND_K) {
        return load_k(i);
    }
    return load_v(i);
}

// The same with d_output (backward entry points only: the forward binds no d_output).
fn fetch_bwd(kind: u32, i: u32) -> f32 {
    if (kind == KIND_DO) {
        return load_do(i);
    }
    return fetch_fwd(kind, i);
}

// Column `col` of rows r, r + 16, r + 32, r + 48 of a [len, HD] operand at `base` with row
// stride `stride` (zero past len or HD).
fn gather4_bwd(kind: u32, base: u32, stride: u32, r: u32, len: u32, col: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (col < HD) {
        if (r < len) {
            v.x = fetch_bwd(kind, base + r * stride + col);
        }
        if (r + 16u < len) {
            v.y = fetch_bwd(kind, base + (r + 16u) * stride + col);
        }
        if (r + 32u < len) {
            v.z = fetch_bwd(kind, base + (r + 32u) * stride + col);
        }
        if (r + 48u < len) {
            v.w = fetch_bwd(kind, base + (r + 48u) * stride + col);
        }
    }
    return v;
}

// Columns col .. col + 3 of row r (zero past len or HD; HD is a multiple of 8).
fn row4_bwd(kind: u32, base: u32, stride: u32, r: u32, len: u32, col: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (r < len && col < HD) {
        let i = base + r * stride + col;
        v = vec4<f32>(fetch_bwd(kind, i), fetch_bwd(kind, i + 1u), fetch_bwd(kind, i + 2u),
                      fetch_bwd(kind, i + 3u));
    }
    return v;
}

// 16-byte staging. Operand rows are read sixteen bytes per lane (four F32
// values or eight 16-bit values, one vec4<u32> load) and written transposed into the same
// staging layouts as the element gathers above, so the products see the same values in the
// same order. Every row start is a multiple of 8 elements (strides are multiples of HD).
struct Pair {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Sixteen bytes at vec4 index `at` of q/k/v (forward) or q/k/v/dO (backward).
fn raw_fwd(kind: u32, at: u32) -> vec4<u32> {
    if (kind == KIND_Q) {
        return query[at];
    }
    if (kind == KIND_K) {
        return key[at];
    }
    return value[at];
}

fn raw_bwd(kind: u32, at: u32) -> vec4<u32> {
    if (kind == KIND_DO) {
        return d_output[at];
    }
    return raw_fwd(kind, at);
}

fn kind_dt(kind: u32) -> u32 {
    return select(DT, DTO, kind == KIND_DO);
}

// Eight 16-bit values (four words) widened, elements in order.
fn widen8(w: vec4<u32>, dt: u32) -> Pair {
    return Pair(vec4<f32>(widen2(w.x, dt), widen2(w.y, dt)),
                vec4<f32>(widen2(w.z, dt), widen2(w.w, dt)));
}

// Score-step staging, lane l: i = l % 4, r = (l / 8) % 16, row R = r + 16·i of the tile.
// F32 (both sides): a = columns d0 + 4q .. + 3 of row R of the tile's rows, b = the same of
// its columns, q = (l / 4) % 2 + 2·(l / 128). 16-bit (both sides): lanes l < 128 stage the
// rows, the others the columns; a, b = columns d0 + 8q .. + 7 of row R, q = (l / 4) % 2.
// Zeros past the length or HD (HD is a multiple of 8, so a load never straddles it).
fn step_row(l: u32) -> u32 {
    return (l / 8u) % 16u + 16u * (l % 4u);
}

fn step_load_fwd(l: u32, d0: u32, ka: u32, a_base: u32, a_ss: u32, a0: u32, a_len: u32,
                 kb: u32, b_base: u32, b_ss: u32, b0: u32, b_len: u32) -> Pair {
    let rr = step_row(l);
    var n = Pair();
    if (DT == DT_F32) {
        let col = d0 + 4u * ((l / 4u) % 2u + 2u * (l / 128u));
        if (col < HD) {
            if (a0 + rr < a_len) {
                n.a = bitcast<vec4<f32>>(raw_fwd(ka, (a_base + (a0 + rr) * a_ss + col) >> 2u));
            }
            if (b0 + rr < b_len) {
                n.b = bitcast<vec4<f32>>(raw_fwd(kb, (b_base + (b0 + rr) * b_ss + col) >> 2u));
            }
        }
    } else {
        let col = d0 + 8u * ((l / 4u) % 2u);
        let side_b = l >= 128u;
        let kind = select(ka, kb, side_b);
        let base = select(a_base, b_base, side_b);
        let ss = select(a_ss, b_ss, side_b);
        let r = select(a0, b0, side_b) + rr;
        if (col < HD && r < select(a_len, b_len, side_b)) {
            n = widen8(raw_fwd(kind, (base + r * ss + col) >> 3u), DT);
        }
    }
    return n;
}

// The same for the backward products when both sides are 16-bit (F32 backward products
// keep the element gathers: the 16-byte staging measured slower there on the H200).
fn step_load_bwd(l: u32, d0: u32, ka: u32, a_base: u32, a_ss: u32, a0: u32, a_len: u32,
                 kb: u32, b_base: u32, b_ss: u32, b0: u32, b_len: u32) -> Pair {
    let col = d0 + 8u * ((l / 4u) % 2u);
    let side_b = l >= 128u;
    let kind = select(ka, kb, side_b);
    let base = select(a_base, b_base, side_b);
    let ss = select(a_ss, b_ss, side_b);
    let r = select(a0, b0, side_b) + step_row(l);
    var n = Pair();
    if (col < HD && r < select(a_len, b_len, side_b)) {
        n = widen8(raw_bwd(kind, (base + r * ss + col) >> 3u), kind_dt(kind));
    }
    return n;
}

// Writes a staged step into the dot_at layout: component i of vec4 dot_at(side, col, r).
// The lane mapping above and the swizzle keep the 32 scalar stores of a warp in distinct
// banks (F32) or two to a bank (16-bit).
fn step_store(l: u32, n: Pair, wide: bool) {
    let i = l % 4u;
    let r = (l / 8u) % 16u;
    // (side, first column) of n.a's four columns, and of n.b's.
    var a0 = vec2<u32>(0u, 4u * ((l / 4u) % 2u + 2u * (l / 128u)));
    var b0 = vec2<u32>(1u, a0.y);
    if (!wide) {
        a0 = vec2<u32>(l / 128u, 8u * ((l / 4u) % 2u));
        b0 = vec2<u32>(a0.x, a0.y + 4u);
    }
    xs[dot_at(a0.x, a0.y, r)][i] = n.a.x;
    xs[dot_at(a0.x, a0.y + 1u, r)][i] = n.a.y;
    xs[dot_at(a0.x, a0.y + 2u, r)][i] = n.a.z;
    xs[dot_at(a0.x, a0.y + 3u, r)][i] = n.a.w;
    xs[dot_at(b0.x, b0.y, r)][i] = n.b.x;
    xs[dot_at(b0.x, b0.y + 1u, r)][i] = n.b.y;
    xs[dot_at(b0.x, b0.y + 2u, r)][i] = n.b.z;
    xs[dot_at(b0.x, b0.y + 3u, r)][i] = n.b.w;
}

// Accumulation-step staging (KS rows × RS vec4 from row r0, row-major): F32 lanes load slots
// l and l + 256 (a, b), 16-bit lanes the adjacent slots 2l and 2l + 1 (one 16-byte load).
fn rows_load_fwd(l: u32, kind: u32, base: u32, ss: u32, r0: u32, len: u32) -> Pair {
    var n = Pair();
    if (DT == DT_F32) {
        let ra = r0 + l / RS;
        let ca = 4u * (l % RS);
        if (ra < len && ca < HD) {
            n.a = bitcast<vec4<f32>>(raw_fwd(kind, (base + ra * ss + ca) >> 2u));
        }
        let rb = r0 + (l + WG) / RS;
        let cb = 4u * ((l + WG) % RS);
        if (rb < len && cb < HD) {
            n.b = bitcast<vec4<f32>>(raw_fwd(kind, (base + rb * ss + cb) >> 2u));
        }
    } else {
        let r = r0 + (2u * l) / RS;
        let c = 4u * ((2u * l) % RS);
        if (r < len && c < HD) {
            n = widen8(raw_fwd(kind, (base + r * ss + c) >> 3u), DT);
        }
    }
    return n;
}

// The same for a 16-bit operand of the backward accumulations (F32 keeps the row gathers).
fn rows_load_bwd(l: u32, kind: u32, base: u32, ss: u32, r0: u32, len: u32) -> Pair {
    let r = r0 + (2u * l) / RS;
    let c = 4u * ((2u * l) % RS);
    var n = Pair();
    if (r < len && c < HD) {
        n = widen8(raw_bwd(kind, (base + r * ss + c) >> 3u), kind_dt(kind));
    }
    return n;
}

fn rows_store(l: u32, n: Pair, wide: bool) {
    if (wide) {
        xs[l] = n.a;
        xs[l + WG] = n.b;
    } else {
        xs[2u * l] = n.a;
        xs[2u * l + 1u] = n.b;
    }
}

// Staging slot of invocation lid for the score products: column lid % 16 of the step, rows
// lid / 16 + 16·i; `side` 0 holds the tile's rows, 1 its columns.
fn dot_slot(side: u32, lid: u32) -> u32 {
    return dot_at(side, lid % 16u, lid / 16u);
}

// The vec4 of a score-product step holding column `col` (0..16) of rows r + 16·i (r < 16) of
// `side`: 17 vec4s a column (PADDED), or 16 with the row XOR-ed with the column; either way a
// column's transposed stores spread over the banks (the reads take a row of vec4s or one).
fn dot_at(side: u32, col: u32, r: u32) -> u32 {
    if (PADDED) {
        return side * 272u + col * 17u + r;
    }
    return side * 256u + col * 16u + (r ^ col);
}

// The vec4 of `ps` holding column c (0..64) of the tile at rows t + 16·i (t < 16), laid out
// as `dot_at` (c % 16 is the lane's tx where put_tile writes).
fn ps_at(c: u32, t: u32) -> u32 {
    if (PADDED) {
        return c * 17u + t;
    }
    return c * 16u + (t ^ (c % 16u));
}

// r += the staged 16-column step of rows × columns (one fma per term, columns in order).
fn dots(s: Blk, tx: u32, ty: u32) -> Blk {
    var r = s;
    for (var dd = 0u; dd < 16u; dd = dd + 1u) {
        let a = xs[dot_at(0u, dd, ty)];
        let b = xs[dot_at(1u, dd, tx)];
        r.r0 = fma(vec4<f32>(a.x), b, r.r0);
        r.r1 = fma(vec4<f32>(a.y), b, r.r1);
        r.r2 = fma(vec4<f32>(a.z), b, r.r2);
        r.r3 = fma(vec4<f32>(a.w), b, r.r3);
    }
    return r;
}

// Writes column j = tx + 16·jj of a block into ps (4 rows ty + 16·i as one vec4): every
// column, or (P_COLS = 32) those of half `hf` of the tile, at hf·32 fewer.
fn put_tile(s: Blk, tx: u32, ty: u32, hf: u32) {
    if (P_COLS == BT) {
        ps[ps_at(tx, ty)] = vec4<f32>(s.r0.x, s.r1.x, s.r2.x, s.r3.x);
        ps[ps_at(tx + 16u, ty)] = vec4<f32>(s.r0.y, s.r1.y, s.r2.y, s.r3.y);
        ps[ps_at(tx + 32u, ty)] = vec4<f32>(s.r0.z, s.r1.z, s.r2.z, s.r3.z);
        ps[ps_at(tx + 48u, ty)] = vec4<f32>(s.r0.w, s.r1.w, s.r2.w, s.r3.w);
    } else if (hf == 0u) {
        ps[ps_at(tx, ty)] = vec4<f32>(s.r0.x, s.r1.x, s.r2.x, s.r3.x);
        ps[ps_at(tx + 16u, ty)] = vec4<f32>(s.r0.y, s.r1.y, s.r2.y, s.r3.y);
    } else {
        ps[ps_at(tx, ty)] = vec4<f32>(s.r0.z, s.r1.z, s.r2.z, s.r3.z);
        ps[ps_at(tx + 16u, ty)] = vec4<f32>(s.r0.w, s.r1.w, s.r2.w, s.r3.w);
    }
}

// Whether every (query, key) of the tile is in range and inside the band, with no mask:
// then no per-element test is needed. Uniform per workgroup.
fn block_full(q0: u32, k0: u32) -> bool {
    if (params.has_mask != 0u || params.chunk_len != 0u || params.dilation > 1u ||
        q0 + BT > params.q_len || k0 + BT > params.k_len) {
        return false;
    }
    let rel_min = i32(k0) - i32(q0 + BT - 1u) - params.offset;
    let rel_max = i32(k0 + BT - 1u) - i32(q0) - params.offset;
    return rel_min >= params.lo && rel_max <= params.hi;
}

// Visibility of (query qi[j], key kj[j]) for four pairs (out of range = hidden).
fn vis4(b: u32, h: u32, qi: vec4<u32>, kj: vec4<u32>) -> vec4<bool> {
    return vec4<bool>(
        qi.x < params.q_len && kj.x < params.k_len && visible(b, h, qi.x, kj.x),
        qi.y < params.q_len && kj.y < params.k_len && visible(b, h, qi.y, kj.y),
        qi.z < params.q_len && kj.z < params.k_len && visible(b, h, qi.z, kj.z),
        qi.w < params.q_len && kj.w < params.k_len && visible(b, h, qi.w, kj.w));
}

fn max4(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}

fn sum4(v: vec4<f32>) -> f32 {
    return ((v.x + v.y) + v.z) + v.w;
}

// Tile side (query rows and keys per tile; 256 invocations hold 4 × 4 scores each).
const BT: u32 = 64u;
// 64-column head-dim chunks; accumulator rows staged at RS vec4, KS rows per step.
override NCH: u32 = (HD + 63u) / 64u;
override RS: u32 = 16u * select(NCH, 4u, NCH == 3u);
override KS: u32 = 512u / RS;

// Row statistics (row_max, log_den, delta) of query qi of (b, h); zeros past the end.
fn info(b: u32, h: u32, qi: u32) -> vec3<f32> {
    if (qi >= params.q_len) {
        return vec3<f32>(0.0);
    }
    let row = (b * params.q_heads + h) * params.q_len + qi;
    return vec3<f32>(row_info[4u * row], row_info[4u * row + 1u], row_info[4u * row + 2u]);
}

// One workgroup per (batch, query head, block of BT query rows); online softmax over BT-key
// tiles. Invocation (tx, ty) = (lid % 16, lid / 16): scores of rows ty + 16·i against keys
// tx + 16·j (4 × 4), output rows ty + 16·i × columns 64·c + 4·tx .. + 3. Row maxima are
// combined through workgroup memory (every lane of a row takes the same maximum); each lane
// keeps the partial denominator of its own keys, summed over the lanes in order at the end.
@compute @workgroup_size(256)
fn attention_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let q_tiles = (params.q_len + BT - 1u) / BT;
    let g = group_index(wid, nwg);
    if (g >= params.batch * params.q_heads * q_tiles) {
        return;
    }
    let qb = query_block(g, q_tiles);
    let bh = g / q_tiles;
    let h = bh % params.q_heads;
    let b = bh / params.q_heads;
    let kvh = h / params.group;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let q0 = qb * BT;
    let q_last = min(q0 + BT, params.q_len) - 1u;
    let q_base = b * params.q_sb + h * params.q_sh;
    let k_base = b * params.k_sb + kvh * params.k_sh;
    let k_tiles = (params.k_len + BT - 1u) / BT;
    let rows = vec4<u32>(q0 + ty) + vec4<u32>(0u, 16u, 32u, 48u);
    let ninf = vec4<f32>(neg_inf());

    var o = Acc();
    var m = ninf;
    var l = vec4<f32>(0.0);
    for (var kb = 0u; kb < k_tiles; kb = kb + 1u) {
        let k0 = kb * BT;
        if (!block_visible(q0, q_last, k0, min(k0 + BT, params.k_len) - 1u)) {
            continue;
        }
        // The next step's slices are loaded into registers while this step is multiplied.
        var s = Blk();
        var n = step_load_fwd(lid, 0u, KIND_Q, q_base, params.q_ss, q0, params.q_len,
                              KIND_K, k_base, params.k_ss, k0, params.k_len);
        for (var d0 = 0u; d0 < HD; d0 = d0 + 16u) {
            step_store(lid, n, DT == DT_F32);
            workgroupBarrier();
            if (d0 + 16u < HD) {
                n = step_load_fwd(lid, d0 + 16u, KIND_Q, q_base, params.q_ss, q0, params.q_len,
                                  KIND_K, k_base, params.k_ss, k0, params.k_len);
            }
            s = dots(s, tx, ty);
            workgroupBarrier();
        }
        if (!block_full(q0, k0)) {
            let keys = vec4<u32>(k0 + tx) + vec4<u32>(0u, 16u, 32u, 48u);
            s.r0 = select(ninf, s.r0, vis4(b, h, vec4<u32>(rows.x), keys));
            s.r1 = select(ninf, s.r1, vis4(b, h, vec4<u32>(rows.y), keys));
            s.r2 = select(ninf, s.r2, vis4(b, h, vec4<u32>(rows.z), keys));
            s.r3 = select(ninf, s.r3, vis4(b, h, vec4<u32>(rows.w), keys));
        }
        xs[tx * 17u + ty] = vec4<f32>(max4(s.r0), max4(s.r1), max4(s.r2), max4(s.r3));
        workgroupBarrier();
        var m_new = m;
        for (var t = 0u; t < 16u; t = t + 1u) {
            m_new = max(m_new, xs[t * 17u + ty]);
        }
        workgroupBarrier();
        // A row's first visible tile: the old accumulators are zero (factor 0, no NaN).
        let alpha = select(exp(params.scale * (m - m_new)), vec4<f32>(0.0), m == ninf);
        var p = Blk();
        p.r0 = select(exp(params.scale * (s.r0 - vec4<f32>(m_new.x))), vec4<f32>(0.0), s.r0 == ninf);
        p.r1 = select(exp(params.scale * (s.r1 - vec4<f32>(m_new.y))), vec4<f32>(0.0), s.r1 == ninf);
        p.r2 = select(exp(params.scale * (s.r2 - vec4<f32>(m_new.z))), vec4<f32>(0.0), s.r2 == ninf);
        p.r3 = select(exp(params.scale * (s.r3 - vec4<f32>(m_new.w))), vec4<f32>(0.0), s.r3 == ninf);
        l = l * alpha + vec4<f32>(sum4(p.r0), sum4(p.r1), sum4(p.r2), sum4(p.r3));
        m = m_new;
        o = acc_scale(o, alpha);
        // o += P · V, P_COLS keys of P at a time, KS keys per staged step.
        // KS · RS = 512 staged vec4: slots lid and lid + 256, prefetched one step ahead.
        for (var hf = 0u; hf < BT / P_COLS; hf = hf + 1u) {
            put_tile(p, tx, ty, hf);
            let k1 = k0 + hf * P_COLS;
            var nv = rows_load_fwd(lid, KIND_V, k_base, params.k_ss, k1, params.k_len);
            for (var ks = 0u; ks < P_COLS; ks = ks + KS) {
                rows_store(lid, nv, DT == DT_F32);
                workgroupBarrier();
                if (ks + KS < P_COLS) {
                    nv = rows_load_fwd(lid, KIND_V, k_base, params.k_ss, k1 + ks + KS,
                                       params.k_len);
                }
                for (var kr = 0u; kr < KS; kr = kr + 1u) {
                    o = acc_step(o, ps[ps_at(ks + kr, ty)], kr * RS, tx);
                }
                workgroupBarrier();
            }
        }
    }
    // Denominators: the lanes' partial sums of each row, in lane order.
    xs[tx * 17u + ty] = l;
    workgroupBarrier();
    var den = vec4<f32>(0.0);
    for (var t = 0u; t < 16u; t = t + 1u) {
        den = den + xs[t * 17u + ty];
    }
    let inv = select(vec4<f32>(0.0), 1.0 / den, den > vec4<f32>(0.0));
    for (var i = 0u; i < 4u; i = i + 1u) {
        let qi = rows[i];
        if (qi >= params.q_len) {
            continue;
        }
        let o_base = q_base + qi * params.q_ss;
        for (var c = 0u; c < NCH; c = c + 1u) {
            let col = 64u * c + 4u * tx;
            if (col < HD) {
                let v = acc_get(o, i, c) * inv[i];
                let idx = o_base + col;
                if (params.same_output == 0u) {
                    output_f32[idx] = v.x;
                    output_f32[idx + 1u] = v.y;
                    output_f32[idx + 2u] = v.z;
                    output_f32[idx + 3u] = v.w;
                }
                if (DT == DT_F32) {
                    output[idx] = bitcast<u32>(v.x);
                    output[idx + 1u] = bitcast<u32>(v.y);
                    output[idx + 2u] = bitcast<u32>(v.z);
                    output[idx + 3u] = bitcast<u32>(v.w);
                } else {
                    output[idx >> 1u] = pack_halves(v.x, v.y, DT);
                    output[(idx >> 1u) + 1u] = pack_halves(v.z, v.w, DT);
                }
            }
        }
        if (tx == 0u) {
            let row = (b * params.q_heads + h) * params.q_len + qi;
            row_max[row] = m[i];
            if (den[i] > 0.0) {
                log_den[row] = log(den[i]);
            } else {
                log_den[row] = neg_inf();
            }
        }
    }
}

// Row statistics for the backward: info_out[row] = (row_max, log_den, delta, 0) with
// delta = Σ_d d_output · saved_output (the unrounded F32 output). One workgroup per 16 rows,
// 16 lanes per row: lane t sums columns t, t + 16, ... in order (coalesced reads), then
// lane 0 adds the 16 partial sums in lane order.
var<workgroup> delta_parts: array<f32, 256>;

@compute @workgroup_size(256)
fn attention_delta(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let first = group_index(wid, nwg) * 16u;
    if (first >= params.rows) {
        return;
    }
    let row = first + lid / 16u;
    let t = lid % 16u;
    var part = 0.0;
    if (row < params.rows) {
        let qi = row % params.q_len;
        let bh = row / params.q_len;
        let h = bh % params.q_heads;
        let b = bh / params.q_heads;
        let base = b * params.q_sb + h * params.q_sh + qi * params.q_ss;
        for (var c = t; c < HD; c = c + 16u) {
            part = part + load_do(base + c) * saved_output[base + c];
        }
    }
    delta_parts[lid] = part;
    workgroupBarrier();
    if (t == 0u && row < params.rows) {
        var delta = 0.0;
        for (var i = 0u; i < 16u; i = i + 1u) {
            delta = delta + delta_parts[lid + i];
        }
        info_out[4u * row] = row_max[row];
        info_out[4u * row + 1u] = log_den[row];
        info_out[4u * row + 2u] = delta;
        info_out[4u * row + 3u] = 0.0;
    }
}

// Products of the backward tile: s = A·Bᵀ and dp = C·Dᵀ over the head dim, A and C the
// tile's rows, B and D its columns (kinds and bases given by the caller).
fn bwd_scores(lid: u32, tx: u32, ty: u32, ka: u32, a_base: u32, a_ss: u32, a0: u32, a_len: u32,
              kb: u32, b_base: u32, b_ss: u32, b0: u32, b_len: u32) -> Blk {
    var s = Blk();
    if (kind_dt(ka) != DT_F32 && kind_dt(kb) != DT_F32) {
        var n = step_load_bwd(lid, 0u, ka, a_base, a_ss, a0, a_len, kb, b_base, b_ss, b0, b_len);
        for (var d0 = 0u; d0 < HD; d0 = d0 + 16u) {
            step_store(lid, n, false);
            workgroupBarrier();
            if (d0 + 16u < HD) {
                n = step_load_bwd(lid, d0 + 16u, ka, a_base, a_ss, a0, a_len, kb, b_base, b_ss, b0,
                                  b_len);
            }
            s = dots(s, tx, ty);
            workgroupBarrier();
        }
        return s;
    }
    var na = gather4_bwd(ka, a_base, a_ss, a0 + lid / 16u, a_len, lid % 16u);
    var nb = gather4_bwd(kb, b_base, b_ss, b0 + lid / 16u, b_len, lid % 16u);
    for (var d0 = 0u; d0 < HD; d0 = d0 + 16u) {
        xs[dot_slot(0u, lid)] = na;
        xs[dot_slot(1u, lid)] = nb;
        workgroupBarrier();
        if (d0 + 16u < HD) {
            let col = d0 + 16u + lid % 16u;
            na = gather4_bwd(ka, a_base, a_ss, a0 + lid / 16u, a_len, col);
            nb = gather4_bwd(kb, b_base, b_ss, b0 + lid / 16u, b_len, col);
        }
        s = dots(s, tx, ty);
        workgroupBarrier();
    }
    return s;
}

// acc += the tile's columns in ps · (P_COLS rows of `kind` from r0), KS rows per staged step.
fn bwd_accumulate(acc: Acc, lid: u32, tx: u32, ty: u32, kind: u32, base: u32, ss: u32, r0: u32,
                  len: u32) -> Acc {
    var a = acc;
    if (kind_dt(kind) != DT_F32) {
        var n = rows_load_bwd(lid, kind, base, ss, r0, len);
        for (var ks = 0u; ks < P_COLS; ks = ks + KS) {
            rows_store(lid, n, false);
            workgroupBarrier();
            if (ks + KS < P_COLS) {
                n = rows_load_bwd(lid, kind, base, ss, r0 + ks + KS, len);
            }
            for (var kr = 0u; kr < KS; kr = kr + 1u) {
                a = acc_step(a, ps[ps_at(ks + kr, ty)], kr * RS, tx);
            }
            workgroupBarrier();
        }
        return a;
    }
    var n0 = row4_bwd(kind, base, ss, r0 + lid / RS, len, 4u * (lid % RS));
    var n1 = row4_bwd(kind, base, ss, r0 + (lid + WG) / RS, len, 4u * ((lid + WG) % RS));
    for (var ks = 0u; ks < P_COLS; ks = ks + KS) {
        xs[lid] = n0;
        xs[lid + WG] = n1;
        workgroupBarrier();
        if (ks + KS < P_COLS) {
            let r = r0 + ks + KS;
            n0 = row4_bwd(kind, base, ss, r + lid / RS, len, 4u * (lid % RS));
            n1 = row4_bwd(kind, base, ss, r + (lid + WG) / RS, len, 4u * ((lid + WG) % RS));
        }
        for (var kr = 0u; kr < KS; kr = kr + 1u) {
            a = acc_step(a, ps[ps_at(ks + kr, ty)], kr * RS, tx);
        }
        workgroupBarrier();
    }
    return a;
}

// acc += tile t · (BT rows of `kind` from r0): the tile put into ps P_COLS columns at a time.
fn tile_accumulate(acc: Acc, t: Blk, lid: u32, tx: u32, ty: u32, kind: u32, base: u32, ss: u32,
                   r0: u32, len: u32) -> Acc {
    var a = acc;
    for (var hf = 0u; hf < BT / P_COLS; hf = hf + 1u) {
        put_tile(t, tx, ty, hf);
        a = bwd_accumulate(a, lid, tx, ty, kind, base, ss, r0 + hf * P_COLS, len);
    }
    return a;
}

// Four consecutive gradient values as stored: their F32 bits, or (DTG 16-bit) rounded once
// into the first two words (element offsets are even: head dims are multiples of 8).
fn grad_words(v: vec4<f32>) -> vec4<u32> {
    if (DTG == DT_F32) {
        return bitcast<vec4<u32>>(v);
    }
    return vec4<u32>(narrow4(v, DTG), vec2<u32>());
}

// Rows r0 + ty + 16·i (< len) of an accumulator times `f`, written to grad_a (d_query or
// d_key) at base + row · ss; `write_acc_b` writes grad_b (d_value). Separate helpers: the dQ
// pass binds no grad_b.
fn write_acc_a(a: Acc, tx: u32, ty: u32, base: u32, ss: u32, r0: u32, len: u32, f: f32) {
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = r0 + ty + 16u * i;
        for (var c = 0u; c < NCH; c = c + 1u) {
            let col = 64u * c + 4u * tx;
            if (r < len && col < HD) {
                let w = grad_words(acc_get(a, i, c) * f);
                let idx = base + r * ss + col;
                if (DTG == DT_F32) {
                    grad_a[idx] = w.x;
                    grad_a[idx + 1u] = w.y;
                    grad_a[idx + 2u] = w.z;
                    grad_a[idx + 3u] = w.w;
                } else {
                    grad_a[idx / 2u] = w.x;
                    grad_a[idx / 2u + 1u] = w.y;
                }
            }
        }
    }
}

fn write_acc_b(a: Acc, tx: u32, ty: u32, base: u32, ss: u32, r0: u32, len: u32) {
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = r0 + ty + 16u * i;
        for (var c = 0u; c < NCH; c = c + 1u) {
            let col = 64u * c + 4u * tx;
            if (r < len && col < HD) {
                let w = grad_words(acc_get(a, i, c));
                let idx = base + r * ss + col;
                if (DTG == DT_F32) {
                    grad_b[idx] = w.x;
                    grad_b[idx + 1u] = w.y;
                    grad_b[idx + 2u] = w.z;
                    grad_b[idx + 3u] = w.w;
                } else {
                    grad_b[idx / 2u] = w.x;
                    grad_b[idx / 2u + 1u] = w.y;
                }
            }
        }
    }
}

// Probabilities and score gradients of one dK/dV tile (keys × queries).
struct TileGrads {
    p: Blk,
    ds: Blk,
}

// The dK/dV pass's tile of keys k0.. (rows ty + 16·i) against queries q0.. (columns tx + 16·j)
// of query head h: P = exp(scale·(K·Qᵀ − m) − log l) (masked to 0) and dS = P ∘ (V·dOᵀ − D).
fn dkdv_tile(lid: u32, tx: u32, ty: u32, b: u32, h: u32, k_base: u32, q_base: u32, k0: u32,
             q0: u32) -> TileGrads {
    let zero = vec4<f32>(0.0);
    let keys = vec4<u32>(k0 + ty) + vec4<u32>(0u, 16u, 32u, 48u);
    let st = bwd_scores(lid, tx, ty, KIND_K, k_base, params.k_ss, k0, params.k_len,
                        KIND_Q, q_base, params.q_ss, q0, params.q_len);
    let dpt = bwd_scores(lid, tx, ty, KIND_V, k_base, params.k_ss, k0, params.k_len,
                         KIND_DO, q_base, params.q_ss, q0, params.q_len);
    let qs = vec4<u32>(q0 + tx) + vec4<u32>(0u, 16u, 32u, 48u);
    let i0 = info(b, h, qs.x);
    let i1 = info(b, h, qs.y);
    let i2 = info(b, h, qs.z);
    let i3 = info(b, h, qs.w);
    let qm = vec4<f32>(i0.x, i1.x, i2.x, i3.x);
    let ql = vec4<f32>(i0.y, i1.y, i2.y, i3.y);
    let qd = vec4<f32>(i0.z, i1.z, i2.z, i3.z);
    var t = TileGrads();
    t.p.r0 = exp(params.scale * (st.r0 - qm) - ql);
    t.p.r1 = exp(params.scale * (st.r1 - qm) - ql);
    t.p.r2 = exp(params.scale * (st.r2 - qm) - ql);
    t.p.r3 = exp(params.scale * (st.r3 - qm) - ql);
    if (!block_full(q0, k0)) {
        t.p.r0 = select(zero, t.p.r0, vis4(b, h, qs, vec4<u32>(keys.x)));
        t.p.r1 = select(zero, t.p.r1, vis4(b, h, qs, vec4<u32>(keys.y)));
        t.p.r2 = select(zero, t.p.r2, vis4(b, h, qs, vec4<u32>(keys.z)));
        t.p.r3 = select(zero, t.p.r3, vis4(b, h, qs, vec4<u32>(keys.w)));
    }
    t.ds.r0 = t.p.r0 * (dpt.r0 - qd);
    t.ds.r1 = t.p.r1 * (dpt.r1 - qd);
    t.ds.r2 = t.p.r2 * (dpt.r2 - qd);
    t.ds.r3 = t.p.r3 * (dpt.r3 - qd);
    return t;
}

// The accumulators of a dK/dV workgroup (named registers, never an indexed array).
struct DkDv {
    dk: Acc,
    dv: Acc,
}

// dV += Pᵀ dO, then dK += dSᵀ Q (scaled at the end), for one tile's queries q0...
fn dkdv_accumulate(a: DkDv, t: TileGrads, lid: u32, tx: u32, ty: u32, q_base: u32,
                   q0: u32) -> DkDv {
    var r = a;
    r.dv = tile_accumulate(r.dv, t.p, lid, tx, ty, KIND_DO, q_base, params.q_ss, q0,
                           params.q_len);
    r.dk = tile_accumulate(r.dk, t.ds, lid, tx, ty, KIND_Q, q_base, params.q_ss, q0,
                           params.q_len);
    return r;
}

// A dK/dV tile's score gradients (keys ty + 16·i × queries tx + 16·j) stored at `at` in the
// order the dQ pass keeps them in `ps`: vec4 k·16 + t holds key k's values of queries t + 16·i.
fn store_ds(ds: Blk, at: u32, tx: u32, ty: u32) {
    ds_store[at + ty * 16u + tx] = ds.r0;
    ds_store[at + (ty + 16u) * 16u + tx] = ds.r1;
    ds_store[at + (ty + 32u) * 16u + tx] = ds.r2;
    ds_store[at + (ty + 48u) * 16u + tx] = ds.r3;
}

// The (batch, kv head, key block) of a dK/dV workgroup: x = batch, y = kv head, z = key block,
// w = 0 for a workgroup past the launch's groups (nothing to do), else 1.
fn dkdv_owner(wid: vec3<u32>, nwg: vec3<u32>) -> vec4<u32> {
    let k_tiles = (params.k_len + BT - 1u) / BT;
    let g = group_index(wid, nwg);
    if (g >= params.groups * k_tiles) {
        return vec4<u32>(0u);
    }
    let bh = params.first_group + g / k_tiles;
    return vec4<u32>(bh / params.kv_heads, bh % params.kv_heads, g % k_tiles, 1u);
}

// Rows k0.. of d_key (scaled) and d_value from the accumulators.
fn dkdv_write(a: DkDv, tx: u32, ty: u32, k_base: u32, k0: u32) {
    write_acc_a(a.dk, tx, ty, k_base, params.k_ss, k0, params.k_len, params.scale);
    write_acc_b(a.dv, tx, ty, k_base, params.k_ss, k0, params.k_len);
}

// One workgroup per (batch, key/value head, block of BT keys) of the launch's groups: owns
// those rows of d_key and d_value and sums over the query heads of its group, then over tiles
// of BT queries, then over the queries of a tile, always in that order. Invocation (tx, ty):
// key rows ty + 16·i, query columns tx + 16·j of the transposed tile; accumulators rows
// ty + 16·i × columns 64·c + 4·tx ... `attention_dkdv_store` is the same pass storing each
// tile's dS for `attention_dq_stored` (its own entry point, so this one binds no ds_store).
@compute @workgroup_size(256)
fn attention_dkdv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let o = dkdv_owner(wid, nwg);
    if (o.w == 0u) {
        return;
    }
    let tx = lid % 16u;
    let ty = lid / 16u;
    let k0 = o.z * BT;
    let k_last = min(k0 + BT, params.k_len) - 1u;
    let k_base = o.x * params.k_sb + o.y * params.k_sh;
    let q_tiles = (params.q_len + BT - 1u) / BT;
    var acc = DkDv();
    for (var gi = 0u; gi < params.group; gi = gi + 1u) {
        let h = o.y * params.group + gi;
        let q_base = o.x * params.q_sb + h * params.q_sh;
        for (var qb = 0u; qb < q_tiles; qb = qb + 1u) {
            let q0 = qb * BT;
            if (block_visible(q0, min(q0 + BT, params.q_len) - 1u, k0, k_last)) {
                let t = dkdv_tile(lid, tx, ty, o.x, h, k_base, q_base, k0, q0);
                acc = dkdv_accumulate(acc, t, lid, tx, ty, q_base, q0);
            }
        }
    }
    dkdv_write(acc, tx, ty, k_base, k0);
}

@compute @workgroup_size(256)
fn attention_dkdv_store(@builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let o = dkdv_owner(wid, nwg);
    if (o.w == 0u) {
        return;
    }
    let tx = lid % 16u;
    let ty = lid / 16u;
    let k0 = o.z * BT;
    let k_last = min(k0 + BT, params.k_len) - 1u;
    let k_base = o.x * params.k_sb + o.y * params.k_sh;
    let q_tiles = (params.q_len + BT - 1u) / BT;
    let k_tiles = (params.k_len + BT - 1u) / BT;
    let first_head = (o.x * params.kv_heads + o.y - params.first_group) * params.group;
    var acc = DkDv();
    for (var gi = 0u; gi < params.group; gi = gi + 1u) {
        let h = o.y * params.group + gi;
        let q_base = o.x * params.q_sb + h * params.q_sh;
        for (var qb = 0u; qb < q_tiles; qb = qb + 1u) {
            let q0 = qb * BT;
            if (block_visible(q0, min(q0 + BT, params.q_len) - 1u, k0, k_last)) {
                let t = dkdv_tile(lid, tx, ty, o.x, h, k_base, q_base, k0, q0);
                store_ds(t.ds, (((first_head + gi) * q_tiles + qb) * k_tiles + o.z) * 1024u, tx, ty);
                acc = dkdv_accumulate(acc, t, lid, tx, ty, q_base, q0);
            }
        }
    }
    dkdv_write(acc, tx, ty, k_base, k0);
}

// One workgroup per (batch, query head, block of BT query rows): owns those rows of d_query
// and sums over key tiles, then keys of a tile, in order. Invocation (tx, ty): query rows
// ty + 16·i, keys tx + 16·j; accumulators rows ty + 16·i × columns 64·c + 4·tx ...
@compute @workgroup_size(256)
fn attention_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let q_tiles = (params.q_len + BT - 1u) / BT;
    let g = group_index(wid, nwg);
    if (g >= params.batch * params.q_heads * q_tiles) {
        return;
    }
    let qb = query_block(g, q_tiles);
    let bh = g / q_tiles;
    let h = bh % params.q_heads;
    let b = bh / params.q_heads;
    let kvh = h / params.group;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let q0 = qb * BT;
    let q_last = min(q0 + BT, params.q_len) - 1u;
    let q_base = b * params.q_sb + h * params.q_sh;
    let k_base = b * params.k_sb + kvh * params.k_sh;
    let k_tiles = (params.k_len + BT - 1u) / BT;
    let rows = vec4<u32>(q0 + ty) + vec4<u32>(0u, 16u, 32u, 48u);
    let zero = vec4<f32>(0.0);
    let i0 = info(b, h, rows.x);
    let i1 = info(b, h, rows.y);
    let i2 = info(b, h, rows.z);
    let i3 = info(b, h, rows.w);

    var dq = Acc();
    for (var kb = 0u; kb < k_tiles; kb = kb + 1u) {
        let k0 = kb * BT;
        if (!block_visible(q0, q_last, k0, min(k0 + BT, params.k_len) - 1u)) {
            continue;
        }
        let s = bwd_scores(lid, tx, ty, KIND_Q, q_base, params.q_ss, q0, params.q_len,
                           KIND_K, k_base, params.k_ss, k0, params.k_len);
        let dp = bwd_scores(lid, tx, ty, KIND_DO, q_base, params.q_ss, q0, params.q_len,
                            KIND_V, k_base, params.k_ss, k0, params.k_len);
        var p = Blk();
        p.r0 = exp(params.scale * (s.r0 - vec4<f32>(i0.x)) - vec4<f32>(i0.y));
        p.r1 = exp(params.scale * (s.r1 - vec4<f32>(i1.x)) - vec4<f32>(i1.y));
        p.r2 = exp(params.scale * (s.r2 - vec4<f32>(i2.x)) - vec4<f32>(i2.y));
        p.r3 = exp(params.scale * (s.r3 - vec4<f32>(i3.x)) - vec4<f32>(i3.y));
        if (!block_full(q0, k0)) {
            let keys = vec4<u32>(k0 + tx) + vec4<u32>(0u, 16u, 32u, 48u);
            p.r0 = select(zero, p.r0, vis4(b, h, vec4<u32>(rows.x), keys));
            p.r1 = select(zero, p.r1, vis4(b, h, vec4<u32>(rows.y), keys));
            p.r2 = select(zero, p.r2, vis4(b, h, vec4<u32>(rows.z), keys));
            p.r3 = select(zero, p.r3, vis4(b, h, vec4<u32>(rows.w), keys));
        }
        var ds = Blk();
        ds.r0 = p.r0 * (dp.r0 - vec4<f32>(i0.z));
        ds.r1 = p.r1 * (dp.r1 - vec4<f32>(i1.z));
        ds.r2 = p.r2 * (dp.r2 - vec4<f32>(i2.z));
        ds.r3 = p.r3 * (dp.r3 - vec4<f32>(i3.z));
        dq = tile_accumulate(dq, ds, lid, tx, ty, KIND_K, k_base, params.k_ss, k0, params.k_len);
    }
    write_acc_a(dq, tx, ty, q_base, params.q_ss, q0, params.q_len, params.scale);
}

// The dQ pass of the stored schedule: like attention_dq, for the query heads of the launch's
// groups, with each visible tile's score gradients read from ds_store (written by the dK/dV
// pass, the same values bit for bit) instead of recomputed: one product per tile, not three.
@compute @workgroup_size(256)
fn attention_dq_stored(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let q_tiles = (params.q_len + BT - 1u) / BT;
    let g = group_index(wid, nwg);
    if (g >= params.groups * params.group * q_tiles) {
        return;
    }
    let qb = query_block(g, q_tiles);
    let lq = g / q_tiles;
    let bh = params.first_group * params.group + lq;
    let h = bh % params.q_heads;
    let b = bh / params.q_heads;
    let kvh = h / params.group;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let q0 = qb * BT;
    let q_last = min(q0 + BT, params.q_len) - 1u;
    let q_base = b * params.q_sb + h * params.q_sh;
    let k_base = b * params.k_sb + kvh * params.k_sh;
    let k_tiles = (params.k_len + BT - 1u) / BT;

    var dq = Acc();
    for (var kb = 0u; kb < k_tiles; kb = kb + 1u) {
        let k0 = kb * BT;
        if (!block_visible(q0, q_last, k0, min(k0 + BT, params.k_len) - 1u)) {
            continue;
        }
        let at = ((lq * q_tiles + qb) * k_tiles + kb) * 1024u;
        for (var hf = 0u; hf < BT / P_COLS; hf = hf + 1u) {
            // Columns hf·P_COLS .. of the tile: 16 vec4 a column.
            for (var r = 0u; r < P_COLS / 16u; r = r + 1u) {
                let e = lid + WG * r;
                ps[ps_at(e / 16u, e % 16u)] = ds_store[at + 16u * P_COLS * hf + e];
            }
            dq = bwd_accumulate(dq, lid, tx, ty, KIND_K, k_base, params.k_ss, k0 + hf * P_COLS,
                                params.k_len);
        }
    }
    write_acc_a(dq, tx, ty, q_base, params.q_ss, q0, params.q_len, params.scale);
}

// ---- Dual-chunk attention: the branches' results merged, and key/value gradients summed ----

// The three branches' bindings (the merge reads branch `src` and updates branch `acc` in place).
@group(0) @binding(16) var<storage, read> src_out: array<f32>;
@group(0) @binding(17) var<storage, read> src_max: array<f32>;
@group(0) @binding(18) var<storage, read> src_log: array<f32>;
@group(0) @binding(19) var<storage, read_write> acc_out: array<f32>;
@group(0) @binding(20) var<storage, read_write> acc_max: array<f32>;
@group(0) @binding(21) var<storage, read_write> acc_log: array<f32>;

// The union of two disjoint key sets (acc, src) of query row `row`: with
//   m = max(m_a, m_b), w_x = exp(scale·(m_x − m) + log l_x),
// the factors (w_a, w_b) / (w_a + w_b) of the two outputs, m and log l = log(w_a + w_b); a set
// with no visible key (m = −∞) weighs 0, and with both empty `total` is 0 (nothing changes).
struct Union {
    fa: f32,
    fb: f32,
    m: f32,
    total: f32,
}

fn union_of(row: u32) -> Union {
    let ma = acc_max[row];
    let mb = src_max[row];
    let m = max(ma, mb);
    var wa = 0.0;
    var wb = 0.0;
    if (ma != neg_inf()) {
        wa = exp(params.scale * (ma - m) + acc_log[row]);
    }
    if (mb != neg_inf()) {
        wb = exp(params.scale * (mb - m) + src_log[row]);
    }
    let total = wa + wb;
    return Union(wa / total, wb / total, m, total);
}

// One invocation per two adjacent output values of the `rows` query rows (b, h, i): the
// unrounded output of the union, o = fa·o_a + fb·o_b, in place in acc_out; with `same_output`
// 0 also the rounded pair in DT (the last merge of a 16-bit call). `attention_merge_rows` then
// updates the row statistics (after this launch: every invocation here reads the old ones).
@compute @workgroup_size(WG)
fn attention_merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    let pairs = HD / 2u;
    let row = t / pairs;
    if (row >= params.rows) {
        return;
    }
    let qi = row % params.q_len;
    let bh = row / params.q_len;
    let h = bh % params.q_heads;
    let b = bh / params.q_heads;
    let at = b * params.q_sb + h * params.q_sh + qi * params.q_ss + 2u * (t % pairs);
    let u = union_of(row);
    var o = vec2<f32>(acc_out[at], acc_out[at + 1u]);
    if (u.total > 0.0) {
        o = u.fa * o + u.fb * vec2<f32>(src_out[at], src_out[at + 1u]);
        acc_out[at] = o.x;
        acc_out[at + 1u] = o.y;
    }
    if (params.same_output == 0u) {
        output[at >> 1u] = pack_halves(o.x, o.y, DT);
    }
}

// One invocation per query row: its raw maximum and log denominator become the union's.
@compute @workgroup_size(WG)
fn attention_merge_rows(@builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg) * WG + lid;
    if (row >= params.rows) {
        return;
    }
    let u = union_of(row);
    if (u.total > 0.0) {
        acc_max[row] = u.m;
        acc_log[row] = log(u.total);
    }
}

// acc_out[i] += src_out[i] for i < rows (the branches' key or value gradients, in branch order).
@compute @workgroup_size(WG)
fn attention_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i < params.rows) {
        acc_out[i] = acc_out[i] + src_out[i];
    }
}
