// Vocabulary-parallel cross-entropy: logits split by columns into shards (vocabulary ranges
// [offset, offset + width)), each reduced alone, their statistics combined in shard order.
//
// `shard_stats`: a workgroup of WG lanes a row of a shard: m = max, s = Σ exp(x − m) (one read:
// each lane's running pair, then fixed-order row reductions), z = the target's logit and h = 1 when the target falls in the shard
// (else 0, 0), written as the row's four values. `combine`: an invocation a row over the
// stacked `[shards, rows, 4]` statistics in shard order: M = max m, lse = M + log Σ s·exp(m − M),
// z = Σ h·z, holders = Σ h. `row_losses`: `[2, rows]`, each row's loss then whether it counts: ignored rows (0, 0), rows whose
// target one shard holds (lse − z, 1), others (NaN, 1). `finish`: the sum, or the sum over the
// count (0 without a counted row; one invocation). `row_cotangents`: each row's cotangent (none: dloss[r]; sum:
// dloss[0]; mean: dloss[0] / count; 0 for ignored rows). `shard_grad`: dlogits = g·(exp(x − lse)
// − [offset + j = target]), F32.

override DT: u32 = 0u;     // logits dtype; row_cotangents: the loss cotangent's
const WG: u32 = 256u;
const RED_NONE: u32 = 0u;
const RED_SUM: u32 = 1u;
const RED_MEAN: u32 = 2u;

struct Params {
    rows: u32,
    cols: u32,       // the shard's width
    offset: u32,     // the shard's first vocabulary index
    shards: u32,
    ignore_index: i32,
    reduction: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read> targets: array<i32>;
@group(0) @binding(3) var<storage, read> stats_in: array<f32>;
@group(0) @binding(4) var<storage, read> cot: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

fn logit(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(logits[i]);
    }
    return half_from_word(logits[i >> 1u], i, DT);
}

fn ignored(r: u32) -> bool {
    return targets[r] == params.ignore_index;
}

// The target's column within the shard, or −1.
fn local_target(r: u32) -> i32 {
    let t = targets[r];
    if (ignored(r) || t < i32(params.offset) || t >= i32(params.offset + params.cols)) {
        return -1;
    }
    return t - i32(params.offset);
}

@compute @workgroup_size(WG)
fn shard_stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = r * params.cols;
    // One read: each lane's running maximum and Σ exp(x − it), rescaled when it grows; then
    // the lanes' sums rescaled to the row's maximum.
    var m = -3.4028235e38;
    var s = 0.0;
    for (var j = lid; j < params.cols; j = j + WG) {
        let x = logit(base + j);
        if (x > m) {
            s = s * exp(m - x) + 1.0;
            m = x;
        } else {
            s = s + exp(x - m);
        }
    }
    let top = workgroup_max(m, lid);
    let total = workgroup_sum(s * exp(m - top), lid);
    if (lid == 0u) {
        let t = local_target(r);
        var z = 0.0;
        var held = 0.0;
        if (t >= 0) {
            z = logit(base + u32(t));
            held = 1.0;
        }
        out[4u * r] = top;
        out[4u * r + 1u] = total;
        out[4u * r + 2u] = z;
        out[4u * r + 3u] = held;
    }
}

fn row_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return group_index(wid, nwg) * WG + lid;
}

@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let r = row_index(wid, nwg, lid);
    if (r >= params.rows) {
        return;
    }
    let stride = 4u * params.rows;
    var top = -3.4028235e38;
    for (var k = 0u; k < params.shards; k = k + 1u) {
        top = max(top, stats_in[k * stride + 4u * r]);
    }
    var s = 0.0;
    var z = 0.0;
    var held = 0.0;
    for (var k = 0u; k < params.shards; k = k + 1u) {
        let at = k * stride + 4u * r;
        s = s + stats_in[at + 1u] * exp(stats_in[at] - top);
        z = z + stats_in[at + 2u] * stats_in[at + 3u];
        held = held + stats_in[at + 3u];
    }
    out[4u * r] = top;
    out[4u * r + 1u] = top + log(s);
    out[4u * r + 2u] = z;
    out[4u * r + 3u] = held;
}

@compute @workgroup_size(WG)
fn row_losses(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let r = row_index(wid, nwg, lid);
    if (r >= params.rows) {
        return;
    }
    var loss = 0.0;
    var counted = 0.0;
    if (!ignored(r)) {
        counted = 1.0;
        if (stats_in[4u * r + 3u] == 1.0) {
            loss = stats_in[4u * r + 1u] - stats_in[4u * r + 2u];
        } else {
            loss = bitcast<f32>(0x7fc00000u);
        }
    }
    out[r] = loss;
    out[params.rows + r] = counted;
}

// stats_in: the column sums (Σ loss, Σ counted).
@compute @workgroup_size(1)
fn finish() {
    if (params.reduction == RED_MEAN) {
        // No counted row: 0 (an all-ignored loss is zero with zero gradient).
        out[0] = select(stats_in[0] / stats_in[1], 0.0, stats_in[1] == 0.0);
    } else {
        out[0] = stats_in[0];
    }
}

fn cot_at(i: u32) -> f32 {
    if (DT == DT_F32) {
        return bitcast<f32>(cot[i]);
    }
    return half_from_word(cot[i >> 1u], i, DT);
}

// stats_in: the column sums (Σ loss, Σ counted).
@compute @workgroup_size(WG)
fn row_cotangents(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let r = row_index(wid, nwg, lid);
    if (r >= params.rows) {
        return;
    }
    var g = 0.0;
    if (!ignored(r)) {
        if (params.reduction == RED_NONE) {
            g = cot_at(r);
        } else if (params.reduction == RED_SUM) {
            g = cot_at(0u);
        } else {
            g = cot_at(0u) / stats_in[1];
        }
    }
    out[r] = g;
}

// stats_in: the combined statistics `[rows, 4]`; cot: the rows' cotangents (F32).
@compute @workgroup_size(WG)
fn shard_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let e = row_index(wid, nwg, lid);
    if (e >= params.rows * params.cols) {
        return;
    }
    let r = e / params.cols;
    let j = e % params.cols;
    let g = bitcast<f32>(cot[r]);
    var p = exp(logit(e) - stats_in[4u * r + 1u]);
    if (local_target(r) == i32(j)) {
        p = p - 1.0;
    }
    out[e] = g * p;
}
