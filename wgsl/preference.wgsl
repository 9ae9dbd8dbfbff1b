// Paired preference losses (DPO, CPO, SimPO, ORPO) on the per-token cross-entropies of a fused
// linear head: sequences 0..B are the chosen completions, B..2B the rejected ones, T tokens
// each; a token counts when its target is not ignore_index. Two passes, no atomics:
//
//   preference_sequences  one workgroup: each sequence's log-probability π_i (the sum over its
//                         counted tokens of logp = −ce, or their mean), in sequence order with
//                         fixed-order workgroup trees; then (one lane, pairs in order) the
//                         margin u_i, the loss −w/B·Σ[(1 − ls)·log σ(u_i) + ls·log σ(−u_i)] + α·NLL
//                         and d loss / d π for both sequences of every pair.
//   preference_tokens     one invocation per token: the cotangent of its cross-entropy,
//                         d_loss·(−d loss/d π_i · (1 or 1/n_i) + α/N_c on chosen tokens), zero
//                         on ignored ones.
//
// Margins (KIND): 0 DPO β·((π_c − ref_c) − (π_r − ref_r)); 1 CPO β·(π_c − π_r);
// 2 SimPO β·(π_c − π_r) − γ; 3 ORPO the log odds ratio (π_c − π_r) − (log(1 − e^π_c) −
// log(1 − e^π_r)), weighted by β outside.

struct Params {
    seqs: u32,         // sequences: 2B (paired: chosen then rejected) or N (KTO)
    tokens: u32,       // T
    ignore_index: i32,
    kind: u32,
    average: u32,      // π is the mean over counted tokens (else the sum)
    has_ref: u32,
    beta: f32,
    gamma: f32,
    smoothing: f32,
    alpha: f32,        // weight of the chosen sequences' NLL
    has_point: u32,    // KTO: a reference point z0 is bound (else 0)
    ref_packed: u32,   // DPO: ref_chosen holds [2, B] (chosen, then rejected) sequence log-probs
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ce: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<i32>;
@group(0) @binding(3) var<storage, read> ref_chosen: array<f32>;
@group(0) @binding(4) var<storage, read> ref_rejected: array<f32>;
// Per sequence (π, n, d loss / d π, 0); element 2B: (N_c, Σ chosen ce, 0, 0).
@group(0) @binding(5) var<storage, read_write> seq_stats: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> loss_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> nll_out: array<f32>;
@group(0) @binding(8) var<storage, read_write> logps_out: array<f32>;  // [2, B]: π chosen, rejected
@group(0) @binding(9) var<storage, read> d_loss: array<f32>;
@group(0) @binding(10) var<storage, read_write> cotangent: array<f32>;
// KTO: nonzero = desirable sequence; the reference point z0 ([1]).
@group(0) @binding(11) var<storage, read> labels: array<u32>;
@group(0) @binding(12) var<storage, read> reference_point: array<f32>;

// log σ(x) without overflow: min(x, 0) − log(1 + e^−|x|).
fn log_sigmoid(x: f32) -> f32 {
    return min(x, 0.0) - log(1.0 + exp(-abs(x)));
}

fn sigmoid(x: f32) -> f32 {
    return exp(log_sigmoid(x));
}

// The margin of pair i and its derivatives with respect to π_c and π_r.
fn margin(i: u32, pc: f32, pr: f32) -> vec3<f32> {
    let b = params.beta;
    if (params.kind == 3u) {
        // log(p/(1 − p)) for p = e^π: π − log(1 − e^π); d/dπ = 1/(1 − e^π).
        let u = (pc - pr) - (log(1.0 - exp(pc)) - log(1.0 - exp(pr)));
        return vec3<f32>(u, 1.0 / (1.0 - exp(pc)), -1.0 / (1.0 - exp(pr)));
    }
    var d = pc - pr;
    if (params.kind == 0u && params.has_ref != 0u) {
        if (params.ref_packed != 0u) {
            d = d - (ref_chosen[i] - ref_chosen[params.seqs / 2u + i]);
        } else {
            d = d - (ref_chosen[i] - ref_rejected[i]);
        }
    }
    var u = b * d;
    if (params.kind == 2u) {
        u = u - params.gamma;
    }
    return vec3<f32>(u, b, -b);
}

// Every sequence's π (and n) into seq_stats and logps_out, sequences in order; lane 0
// returns (counted tokens, Σ ce) of the first half (the chosen sequences of a paired batch).
fn sequence_logps(lid: u32) -> vec2<f32> {
    var chosen_tokens = 0.0;
    var chosen_ce = 0.0;
    for (var i = 0u; i < params.seqs; i = i + 1u) {
        var s = 0.0;
        var n = 0.0;
        for (var t = lid; t < params.tokens; t = t + WG) {
            let k = i * params.tokens + t;
            if (targets[k] != params.ignore_index) {
                s = s + ce[k];
                n = n + 1.0;
            }
        }
        let total = workgroup_sum(s, lid);
        let count = workgroup_sum(n, lid);
        if (lid == 0u) {
            var pi = -total;
            if (params.average != 0u) {
                pi = pi / max(count, 1.0);
            }
            seq_stats[i] = vec4<f32>(pi, count, 0.0, 0.0);
            logps_out[i] = pi;
            if (i < params.seqs / 2u) {
                chosen_tokens = chosen_tokens + count;
                chosen_ce = chosen_ce + total;
            }
        }
    }
    return vec2<f32>(chosen_tokens, chosen_ce);
}

@compute @workgroup_size(WG)
fn preference_sequences(@builtin(local_invocation_index) lid: u32) {
    let seqs = params.seqs;
    let pairs = seqs / 2u;
    let chosen = sequence_logps(lid);
    let chosen_tokens = chosen.x;
    let chosen_ce = chosen.y;
    if (lid != 0u) {
        return;
    }
    // The pairs in order: loss terms and d loss / d π.
    let w = select(1.0, params.beta, params.kind == 3u) / f32(max(pairs, 1u));
    let ls = params.smoothing;
    var pref = 0.0;
    for (var i = 0u; i < pairs; i = i + 1u) {
        let m = margin(i, seq_stats[i].x, seq_stats[pairs + i].x);
        pref = pref - ((1.0 - ls) * log_sigmoid(m.x) + ls * log_sigmoid(-m.x));
        // d/du of −[(1 − ls)·log σ(u) + ls·log σ(−u)] = −(1 − ls)·σ(−u) + ls·σ(u).
        let du = w * (-(1.0 - ls) * sigmoid(-m.x) + ls * sigmoid(m.x));
        seq_stats[i].z = du * m.y;
        seq_stats[pairs + i].z = du * m.z;
    }
    let nll = chosen_ce / max(chosen_tokens, 1.0);
    seq_stats[seqs] = vec4<f32>(chosen_tokens, chosen_ce, 0.0, 0.0);
    loss_out[0] = w * pref + params.alpha * nll;
    nll_out[0] = nll;
}

@compute @workgroup_size(WG)
fn preference_tokens(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let k = group_index(wid, nwg) * WG + lid;
    let seqs = params.seqs;
    if (k >= seqs * params.tokens) {
        return;
    }
    let i = k / params.tokens;
    var g = 0.0;
    if (targets[k] != params.ignore_index) {
        let st = seq_stats[i];
        // ce = −logp, so d loss / d ce = −d loss / d π · d π / d logp.
        g = -st.z;
        if (params.average != 0u) {
            g = g / max(st.y, 1.0);
        }
        if (i < seqs / 2u) {
            g = g + params.alpha / max(seq_stats[seqs].x, 1.0);
        }
    }
    cotangent[k] = d_loss[0] * g;
}

// KTO (unpaired): loss = (1/N)·Σ_i (1 − σ(u_i)) with u_i = β·(r_i − z0) for a desirable
// sequence and β·(z0 − r_i) for an undesirable one, r_i = π_i − ref_i (ref bound in
// ref_chosen, or 0), z0 the reference point (or 0); d loss / d π_i = −σ(u)(1 − σ(u))·(±β)/N.
@compute @workgroup_size(WG)
fn kto_sequences(@builtin(local_invocation_index) lid: u32) {
    let seqs = params.seqs;
    sequence_logps(lid);
    if (lid != 0u) {
        return;
    }
    let z0 = select(0.0, reference_point[0], params.has_point != 0u);
    let inv_n = 1.0 / f32(max(seqs, 1u));
    var total = 0.0;
    for (var i = 0u; i < seqs; i = i + 1u) {
        var r = seq_stats[i].x;
        if (params.has_ref != 0u) {
            r = r - ref_chosen[i];
        }
        let sign = select(-1.0, 1.0, labels[i] != 0u);
        let u = params.beta * sign * (r - z0);
        let p = sigmoid(u);
        total = total + (1.0 - p);
        seq_stats[i].z = -p * (1.0 - p) * sign * params.beta * inv_n;
    }
    seq_stats[seqs] = vec4<f32>(0.0);
    loss_out[0] = total * inv_n;
}
