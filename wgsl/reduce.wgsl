// Fixed-order reductions: per-row sum and max (one workgroup per row, lane t takes columns
// t, t + WG, ... in order, then the workgroup tree), and column sums in two fixed-order passes
// (row blocks of BLOCK_ROWS summed top to bottom, then the block partials summed in block
// order). Input may be F32, F16 or BF16 (bound as u32 words); outputs are F32.

override DT: u32 = 0u;
const WG: u32 = 256u;
const BLOCK_ROWS: u32 = 64u;

struct Params {
    rows: u32,
    cols: u32,
    blocks: u32,  // column_partials: ceil(rows / BLOCK_ROWS); column_finish: runs per group
    total: u32,   // column passes: threads needed
    base: u32,    // column_partials: first word written; column_finish: first word of the partials
    run: u32,     // column_finish: rows a run
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> source: array<u32>;
@group(0) @binding(2) var<storage, read_write> dest: array<f32>;

fn load(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(source[i]);
    }
    return half_from_word(source[i >> 1u], i, DT);
}

@compute @workgroup_size(WG)
fn row_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    var acc = 0.0;
    for (var c = lid; c < params.cols; c = c + WG) {
        acc = acc + load(row * params.cols + c);
    }
    let total = workgroup_sum(acc, lid);
    if (lid == 0u) {
        dest[row] = total;
    }
}

@compute @workgroup_size(WG)
fn row_max(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= params.rows) {
        return;
    }
    var best = bitcast<f32>(0xff800000u); // -inf
    for (var c = lid; c < params.cols; c = c + WG) {
        best = max(best, load(row * params.cols + c));
    }
    let result = workgroup_max(best, lid);
    if (lid == 0u) {
        dest[row] = result;
    }
}

// dest[base + block·cols + col] = sum of source[row, col] for the rows of that block, top to
// bottom.
@compute @workgroup_size(WG)
fn column_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let block = t / params.cols;
    let col = t % params.cols;
    let first = block * BLOCK_ROWS;
    let last = min(first + BLOCK_ROWS, params.rows);
    var acc = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        acc = acc + load(r * params.cols + col);
    }
    dest[params.base + t] = acc;
}

// Groups of per-block partials (source F32 `[groups * per_group, cols]` from word `base` on,
// per_group = params.rows) summed in runs of params.run consecutive rows, each in row order:
// dest[(g * sub + s) * cols + col] = the sum of rows s * run .. min((s + 1) * run, per_group)
// of group g (sub = params.blocks runs a group; one run of per_group rows is the group's
// whole sum). params.total = groups * sub * cols.
@compute @workgroup_size(WG)
fn column_finish(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if (t >= params.total) {
        return;
    }
    let cols = params.cols;
    let run = t / cols;
    let g = run / params.blocks;
    let first = (run % params.blocks) * params.run;
    let last = min(first + params.run, params.rows);
    let at = params.base + g * params.rows * cols + t % cols;
    var acc = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        acc = acc + bitcast<f32>(source[at + r * cols]);
    }
    dest[t] = acc;
}
