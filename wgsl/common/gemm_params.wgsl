// The uniform parameters of a dense product's launch, shared by `wgsl/matmul.wgsl` and the
// tensor-core module `wgsl/matmul_tc.wgsl` (which reads the fields up to `act` and leaves
// split-K's at their neutral values).
struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    tiles_m: u32,    // ceil(m / BM)
    tiles_n: u32,    // ceil(n / BN)
    off_a: u32,      // element offsets of batch 0
    off_b: u32,
    off_c: u32,
    stride_a: u32,   // element strides between batches (0: shared operand)
    stride_b: u32,
    stride_c: u32,
    alpha: f32,
    has_bias: u32,   // 1: add bias[j]
    dt_bias: u32,    // the bias's dtype code
    accumulate: u32, // 1: out += v (F32)
    act: u32,        // 0: none; else Activation::code() + 1
    k_slice: u32,    // split-K: elements of k per slice (a multiple of BK; k when unsplit)
    slices: u32,     // split-K: number of slices (1 when unsplit)
}
