//! RoPE against the f64 references of `wgrad::reference::rope`: per-row tables (split-half and
//! interleaved, partial rotary, non-unit-norm coefficients), q/k with position ids in both
//! layouts (repeated positions, table gradients), mRoPE, Llama 4's complex tables, the host
//! table builder against an f64 formula, finite differences of the reference backward,
//! reruns, empty shapes and every documented bad input.

mod common;

use common::{Rng, assert_close, engine, f32_bits, stored, tensor_from_f64};
use wgrad::gradcheck::{Tolerance, check_vjp};
use wgrad::reference::rope as reference;
use wgrad::rope::{self, RopeLayout, RopeOptions, RopeQkOptions, RopeScaling};
use wgrad::{DType, Error, Tensor};

fn data(seed: u64, n: usize, range: f64) -> Vec<f64> {
    Rng::new(seed).vec(n, -range, range)
}

const F32: Tolerance = Tolerance::for_dtype(DType::F32);

#[test]
fn per_row_tables_match_reference() {
    let e = engine();
    // (rows, dim, rotary_dim): full, partial, odd dim with a copied suffix, one pair.
    // Rows of even width with rotary_dim % 4 == 0 run the unit kernels (one workgroup per
    // token when a token fills half a workgroup: 512 columns), the others the per-element
    // kernels: all are covered.
    let shapes = [
        (2, 512, 512),
        (3, 516, 0),
        (6, 20, 12),
        (300, 8, 4),
        (1usize, 2usize, 2usize),
        (5, 7, 4),
        (3, 64, 64),
        (17, 10, 6),
        (4, 33, 32),
        (2, 8, 0),
    ];
    for (k, &(rows, dim, rot)) in shapes.iter().enumerate() {
        for dtype in DType::FLOATS {
            for interleaved in [false, true] {
                let half = rot / 2;
                let x = stored(&data(k as u64, rows * dim, 2.0), dtype);
                // Non-unit-norm coefficients: independent uniforms.
                let c = stored(&data(100 + k as u64, rows * half, 1.5), dtype);
                let s = stored(&data(200 + k as u64, rows * half, 1.5), dtype);
                let dy = stored(&data(300 + k as u64, rows * dim, 1.0), dtype);
                let label = format!("{rows}x{dim} rot {rot} {dtype} interleaved {interleaved}");
                let opts = RopeOptions {
                    rotary_dim: Some(rot),
                    interleaved,
                    table_grads: true,
                };
                let (y, saved) = rope::forward(
                    &tensor_from_f64(e, &x, &[rows, dim], dtype),
                    &tensor_from_f64(e, &c, &[rows, half], dtype),
                    &tensor_from_f64(e, &s, &[rows, half], dtype),
                    &opts,
                )
                .unwrap();
                assert_eq!((y.shape(), y.dtype()), (&[rows, dim][..], dtype));
                let want = stored(
                    &reference::forward(&x, dim, &c, &s, rot, interleaved),
                    dtype,
                );
                assert_close(
                    &format!("{label} y"),
                    &y.to_f64().unwrap(),
                    &want,
                    Tolerance::for_dtype(dtype),
                );
                let g =
                    rope::backward(&saved, &tensor_from_f64(e, &dy, &[rows, dim], dtype)).unwrap();
                let (dv, dc, ds) = reference::backward(&x, &dy, dim, &c, &s, rot, interleaved);
                assert_close(
                    &format!("{label} dvalues"),
                    &g.dvalues.to_f64().unwrap(),
                    &dv,
                    F32,
                );
                assert_close(
                    &format!("{label} dcos"),
                    &g.dcos.unwrap().to_f64().unwrap(),
                    &dc,
                    F32,
                );
                assert_close(
                    &format!("{label} dsin"),
                    &g.dsin.unwrap().to_f64().unwrap(),
                    &ds,
                    F32,
                );
            }
        }
    }
}

#[test]
fn suffix_is_copied_exactly_and_its_gradient_passes_through() {
    let e = engine();
    let (rows, dim, rot) = (3, 9, 4);
    let x = stored(&data(1, rows * dim, 3.0), DType::BF16);
    let dy = stored(&data(2, rows * dim, 3.0), DType::BF16);
    let (c, s) = (data(3, rows * 2, 1.0), data(4, rows * 2, 1.0));
    let (y, saved) = rope::forward(
        &tensor_from_f64(e, &x, &[rows, dim], DType::BF16),
        &tensor_from_f64(e, &c, &[rows, 2], DType::F32),
        &tensor_from_f64(e, &s, &[rows, 2], DType::F32),
        &RopeOptions {
            rotary_dim: Some(rot),
            ..Default::default()
        },
    )
    .unwrap();
    let y = y.to_f64().unwrap();
    let dv = rope::backward(&saved, &tensor_from_f64(e, &dy, &[rows, dim], DType::BF16))
        .unwrap()
        .dvalues
        .to_f64()
        .unwrap();
    for r in 0..rows {
        for col in rot..dim {
            assert_eq!(y[r * dim + col], x[r * dim + col]);
            assert_eq!(dv[r * dim + col], dy[r * dim + col]);
        }
    }
}

#[test]
fn reference_backward_matches_finite_differences() {
    let (rows, dim, rot) = (3, 10, 6);
    for interleaved in [false, true] {
        let x = data(5, rows * dim, 2.0);
        let c = data(6, rows * rot / 2, 1.5);
        let s = data(7, rows * rot / 2, 1.5);
        let dy = data(8, rows * dim, 1.0);
        let (dv, dc, ds) = reference::backward(&x, &dy, dim, &c, &s, rot, interleaved);
        assert!(
            check_vjp(
                |p| reference::forward(p, dim, &c, &s, rot, interleaved),
                &x,
                &dy,
                &dv
            )
            .passed
        );
        assert!(
            check_vjp(
                |p| reference::forward(&x, dim, p, &s, rot, interleaved),
                &c,
                &dy,
                &dc
            )
            .passed
        );
        assert!(
            check_vjp(
                |p| reference::forward(&x, dim, &c, p, rot, interleaved),
                &s,
                &dy,
                &ds
            )
            .passed
        );
    }
}

/// Reference for q/k with shared tables: expand, rotate per row, reduce the table gradients.
struct QkCase {
    batch: usize,
    seq: usize,
    hq: usize,
    hk: usize,
    dim: usize,
    rot: usize,
    table_rows: usize,
    layout: RopeLayout,
    interleaved: bool,
}

impl QkCase {
    fn shape(&self, heads: usize) -> Vec<usize> {
        match self.layout {
            RopeLayout::Bshd => vec![self.batch, self.seq, heads, self.dim],
            RopeLayout::Bhsd => vec![self.batch, heads, self.seq, self.dim],
        }
    }

    fn heads(&self, heads: usize) -> reference::Heads {
        reference::Heads {
            batch: self.batch,
            seq: self.seq,
            heads,
            bhsd: self.layout == RopeLayout::Bhsd,
        }
    }
}

/// Values of q, k and their cotangents: uniform, or small integers (every F32 product and sum
/// of a table gradient is then exact, however many tokens share a row).
#[derive(Clone, Copy, PartialEq)]
enum QkData {
    Uniform,
    Integers,
}

fn qk_data(kind: QkData, seed: u64, n: usize, range: f64) -> Vec<f64> {
    match kind {
        QkData::Uniform => data(seed, n, range),
        QkData::Integers => data(seed, n, range + 1.0)
            .into_iter()
            .map(f64::trunc)
            .collect(),
    }
}

fn run_qk_case(
    case: &QkCase,
    dtype: DType,
    seed: u64,
    positions: Option<(&[i32], Vec<usize>)>,
    mrope: Option<[usize; 3]>,
    llama4: bool,
) {
    run_qk_case_with(case, dtype, seed, positions, mrope, llama4, QkData::Uniform);
}

/// GPU against the reference. Position ids outside `0..table_rows` (negative included) are
/// passed unchecked: the reference maps them to an extra zero table row whose gradient is
/// dropped (they rotate by (0, 0) and feed no table row).
#[allow(clippy::type_complexity)]
fn run_qk_case_with(
    case: &QkCase,
    dtype: DType,
    seed: u64,
    positions: Option<(&[i32], Vec<usize>)>,
    mrope: Option<[usize; 3]>,
    llama4: bool,
    kind: QkData,
) {
    let e = engine();
    let half = case.rot / 2;
    let n_q = case.batch * case.seq * case.hq * case.dim;
    let n_k = case.batch * case.seq * case.hk * case.dim;
    let q = stored(&qk_data(kind, seed, n_q, 2.0), dtype);
    let k = stored(&qk_data(kind, seed + 1, n_k, 2.0), dtype);
    let c = stored(&data(seed + 2, case.table_rows * half, 1.2), dtype);
    let s = stored(&data(seed + 3, case.table_rows * half, 1.2), dtype);
    let dq = stored(&qk_data(kind, seed + 4, n_q, 1.0), dtype);
    let dk = stored(&qk_data(kind, seed + 5, n_k, 1.0), dtype);
    let pos_tensor = positions
        .as_ref()
        .map(|(p, shape)| Tensor::from_slice(e, p, shape).unwrap());
    let in_range = |p: i32| p >= 0 && (p as usize) < case.table_rows;
    let opts = RopeQkOptions {
        rotary_dim: Some(case.rot),
        interleaved: case.interleaved,
        layout: case.layout,
        table_grads: true,
        check_positions: positions
            .as_ref()
            .is_none_or(|(p, _)| p.iter().all(|&v| in_range(v))),
        mrope_section: mrope,
    };
    // Table row of (b, s, i), as the reference sees it (`table_rows`: the zero row).
    let position = |b: usize, si: usize, i: usize| -> usize {
        match &positions {
            None => si,
            Some((p, shape)) => {
                let axis = mrope.map_or(0, |m| reference::mrope_axis(i, m));
                let batched = shape.len() == if mrope.is_some() { 3 } else { 2 };
                let per_axis = if batched {
                    case.batch * case.seq
                } else {
                    case.seq
                };
                let idx = if batched { b * case.seq + si } else { si };
                let v = p[axis * per_axis + idx];
                if in_range(v) {
                    v as usize
                } else {
                    case.table_rows
                }
            }
        }
    };
    let zero_row = vec![0.0; half];
    let c_ext: Vec<f64> = c.iter().chain(&zero_row).copied().collect();
    let s_ext: Vec<f64> = s.iter().chain(&zero_row).copied().collect();
    let qt = tensor_from_f64(e, &q, &case.shape(case.hq), dtype);
    let kt = tensor_from_f64(e, &k, &case.shape(case.hk), dtype);
    let dqt = tensor_from_f64(e, &dq, &case.shape(case.hq), dtype);
    let dkt = tensor_from_f64(e, &dk, &case.shape(case.hk), dtype);
    let ((qo, ko), (dqg, dkg, dc_got, ds_got)) = if llama4 {
        let freqs = reference::join_complex(&c, &s);
        let ft = tensor_from_f64(e, &freqs, &[case.table_rows, half, 2], dtype);
        let (outs, saved) =
            rope::llama4_forward(&qt, &kt, &ft, pos_tensor.as_ref(), &opts).unwrap();
        let g = rope::llama4_backward(&saved, &dqt, &dkt).unwrap();
        let (gc, gs) = reference::split_complex(&g.dfreqs.unwrap().to_f64().unwrap());
        (outs, (g.dq, g.dk, gc, gs))
    } else {
        let (outs, saved) = rope::qk_forward(
            &qt,
            &kt,
            &tensor_from_f64(e, &c, &[case.table_rows, half], dtype),
            &tensor_from_f64(e, &s, &[case.table_rows, half], dtype),
            pos_tensor.as_ref(),
            &opts,
        )
        .unwrap();
        let g = rope::qk_backward(&saved, &dqt, &dkt).unwrap();
        (
            outs,
            (
                g.dq,
                g.dk,
                g.dcos.unwrap().to_f64().unwrap(),
                g.dsin.unwrap().to_f64().unwrap(),
            ),
        )
    };
    let interleaved = case.interleaved || llama4;
    let label = format!(
        "{dtype} {:?} interleaved {interleaved} mrope {mrope:?} llama4 {llama4}",
        case.layout
    );
    let mut want_dc = vec![0.0; (case.table_rows + 1) * half];
    let mut want_ds = vec![0.0; (case.table_rows + 1) * half];
    for (x, dy, heads, out, dgot, name) in [
        (&q, &dq, case.hq, &qo, &dqg, "q"),
        (&k, &dk, case.hk, &ko, &dkg, "k"),
    ] {
        let h = case.heads(heads);
        let ce = reference::expand(&c_ext, half, &h, position);
        let se = reference::expand(&s_ext, half, &h, position);
        let want = stored(
            &reference::forward(x, case.dim, &ce, &se, case.rot, interleaved),
            dtype,
        );
        assert_close(
            &format!("{label} {name} out"),
            &out.to_f64().unwrap(),
            &want,
            Tolerance::for_dtype(dtype),
        );
        let (dv, dce, dse) = reference::backward(x, dy, case.dim, &ce, &se, case.rot, interleaved);
        assert_close(
            &format!("{label} d{name}"),
            &dgot.to_f64().unwrap(),
            &dv,
            F32,
        );
        for (acc, per_row) in [(&mut want_dc, dce), (&mut want_ds, dse)] {
            for (a, v) in acc.iter_mut().zip(reference::reduce(
                &per_row,
                half,
                &h,
                case.table_rows + 1,
                position,
            )) {
                *a += v;
            }
        }
    }
    want_dc.truncate(case.table_rows * half);
    want_ds.truncate(case.table_rows * half);
    assert_close(&format!("{label} dcos"), &dc_got, &want_dc, F32);
    assert_close(&format!("{label} dsin"), &ds_got, &want_ds, F32);
}

#[test]
fn qk_without_positions_both_layouts() {
    for layout in [RopeLayout::Bshd, RopeLayout::Bhsd] {
        for dtype in DType::FLOATS {
            let case = QkCase {
                batch: 2,
                seq: 5,
                hq: 3,
                hk: 2,
                dim: 10,
                rot: 8,
                table_rows: 7,
                layout,
                interleaved: false,
            };
            run_qk_case(&case, dtype, 10, None, None, false);
            let case = QkCase {
                interleaved: true,
                dim: 7,
                rot: 6,
                ..case
            };
            run_qk_case(&case, dtype, 20, None, None, false);
        }
    }
}

#[test]
fn qk_token_kernels() {
    // Enough heads × units per row to run one workgroup per token (q), k on the unit kernel.
    let ids: Vec<i32> = vec![4, 0, 4, 1, 1, 3];
    for layout in [RopeLayout::Bshd, RopeLayout::Bhsd] {
        for dtype in DType::FLOATS {
            for interleaved in [false, true] {
                let case = QkCase {
                    batch: 2,
                    seq: 3,
                    hq: 16,
                    hk: 2,
                    dim: 32,
                    rot: 32,
                    table_rows: 5,
                    layout,
                    interleaved,
                };
                run_qk_case(&case, dtype, 35, Some((&ids, vec![2, 3])), None, false);
                let case = QkCase {
                    hq: 8,
                    hk: 8,
                    dim: 40,
                    rot: 16,
                    ..case
                };
                run_qk_case(&case, dtype, 36, None, None, false);
                // Rows whose width is not a multiple of 4 (the step kernels above do not
                // take them): 4 units per row, one workgroup per token for q.
                let case = QkCase {
                    hq: 32,
                    hk: 2,
                    dim: 10,
                    rot: 4,
                    ..case
                };
                run_qk_case(&case, dtype, 37, None, None, false);
            }
        }
    }
}

#[test]
fn qk_with_repeated_position_ids_and_table_gradients() {
    // Positions repeat within and across sequences; table row 8 is never used (zero grad).
    let batched: Vec<i32> = vec![3, 3, 0, 7, 1, 2, 3, 3, 9, 0];
    let shared: Vec<i32> = vec![4, 4, 4, 0, 9];
    for layout in [RopeLayout::Bshd, RopeLayout::Bhsd] {
        for dtype in DType::FLOATS {
            for interleaved in [false, true] {
                let case = QkCase {
                    batch: 2,
                    seq: 5,
                    hq: 4,
                    hk: 1,
                    dim: 12,
                    rot: 12,
                    table_rows: 10,
                    layout,
                    interleaved,
                };
                run_qk_case(&case, dtype, 30, Some((&batched, vec![2, 5])), None, false);
                let case = QkCase {
                    dim: 13,
                    rot: 6,
                    ..case
                };
                run_qk_case(&case, dtype, 40, Some((&shared, vec![5])), None, false);
            }
        }
    }
}

#[test]
fn position_table_gradients_under_stress() {
    // Every token at one position, more tokens than one step of the row kernel (1,024), in
    // both layouts; integer data makes every F32 sum exact however long.
    let one = vec![3i32; 2 * 650];
    for layout in [RopeLayout::Bshd, RopeLayout::Bhsd] {
        for dtype in DType::FLOATS {
            let case = QkCase {
                batch: 2,
                seq: 650,
                hq: 2,
                hk: 1,
                dim: 8,
                rot: 8,
                table_rows: 5,
                layout,
                interleaved: false,
            };
            let ids = Some((&one[..], vec![2, 650]));
            run_qk_case_with(&case, dtype, 100, ids, None, false, QkData::Integers);
        }
    }
    for dtype in DType::FLOATS {
        // Ids past the table and negative ones (unchecked): they feed no row.
        let outside = [0, -1, 6, 5, 1000, 2, 2, i32::MIN, 5, 5, 7, 0, 3, -7];
        let case = QkCase {
            batch: 2,
            seq: 7,
            hq: 3,
            hk: 2,
            dim: 10,
            rot: 10,
            table_rows: 6,
            layout: RopeLayout::Bshd,
            interleaved: false,
        };
        run_qk_case(&case, dtype, 110, Some((&outside, vec![2, 7])), None, false);
        // More table rows than tokens, rows past two whole blocks of 128 (half = 6), rows no
        // token uses; batched and shared ids.
        let sparse = [299, 0, 128, 127, 256, 255, 299, 130];
        let case = QkCase {
            batch: 2,
            seq: 4,
            hq: 2,
            hk: 1,
            dim: 14,
            rot: 12,
            table_rows: 300,
            layout: RopeLayout::Bhsd,
            interleaved: true,
        };
        run_qk_case(&case, dtype, 120, Some((&sparse, vec![2, 4])), None, false);
        run_qk_case(
            &case,
            dtype,
            125,
            Some((&sparse[..4], vec![4])),
            None,
            false,
        );
        // half = 45: five row groups of 45 lanes (20 rows a block), 41 table rows.
        let spread: Vec<i32> = (0..2 * 30).map(|v| v * 17 % 41).collect();
        for interleaved in [false, true] {
            let case = QkCase {
                batch: 2,
                seq: 30,
                hq: 3,
                hk: 2,
                dim: 92,
                rot: 90,
                table_rows: 41,
                layout: RopeLayout::Bshd,
                interleaved,
            };
            run_qk_case(&case, dtype, 130, Some((&spread, vec![2, 30])), None, false);
        }
        // half = 260: two blocks of frequencies, also with mRoPE sections across them.
        let ids = [8, 0, 4, 4, 3, 8];
        let case = QkCase {
            batch: 2,
            seq: 3,
            hq: 1,
            hk: 1,
            dim: 520,
            rot: 520,
            table_rows: 9,
            layout: RopeLayout::Bshd,
            interleaved: false,
        };
        run_qk_case(&case, dtype, 140, Some((&ids, vec![2, 3])), None, false);
        let axes: Vec<i32> = (0..3 * 6).map(|v| v * 5 % 9).collect();
        run_qk_case(
            &case,
            dtype,
            145,
            Some((&axes, vec![3, 2, 3])),
            Some([100, 100, 60]),
            false,
        );
        // mRoPE and Llama 4 over more than 1,024 tokens, a few ids past the table.
        let axes: Vec<i32> = (0..3 * 1100).map(|v| v * 7 % 15).collect();
        let case = QkCase {
            batch: 1,
            seq: 1100,
            hq: 2,
            hk: 1,
            dim: 8,
            rot: 8,
            table_rows: 13,
            layout: RopeLayout::Bshd,
            interleaved: false,
        };
        let ids = Some((&axes[..], vec![3, 1, 1100]));
        run_qk_case_with(
            &case,
            dtype,
            150,
            ids,
            Some([1, 1, 2]),
            false,
            QkData::Integers,
        );
        let cyclic: Vec<i32> = (0..2 * 520).map(|v| v % 7).collect();
        let case = QkCase {
            batch: 2,
            seq: 520,
            table_rows: 6,
            interleaved: true,
            ..case
        };
        let ids = Some((&cyclic[..], vec![2, 520]));
        run_qk_case_with(&case, dtype, 160, ids, None, true, QkData::Integers);
    }
}

/// (dq, dk, dcos, dsin) bits of `qk_backward` (or `llama4_backward`: dfreqs for dcos, dsin
/// empty) with table gradients.
#[allow(clippy::too_many_arguments)]
fn table_grad_bits(
    q: &Tensor,
    k: &Tensor,
    c: &Tensor,
    s: &Tensor,
    dq: &Tensor,
    dk: &Tensor,
    positions: Option<&Tensor>,
    llama4: bool,
) -> [Vec<u32>; 4] {
    let opts = RopeQkOptions {
        table_grads: true,
        ..Default::default()
    };
    if llama4 {
        let (_, saved) = rope::llama4_forward(q, k, c, positions, &opts).unwrap();
        let g = rope::llama4_backward(&saved, dq, dk).unwrap();
        return [
            f32_bits(&g.dq),
            f32_bits(&g.dk),
            f32_bits(&g.dfreqs.unwrap()),
            vec![],
        ];
    }
    let (_, saved) = rope::qk_forward(q, k, c, s, positions, &opts).unwrap();
    let g = rope::qk_backward(&saved, dq, dk).unwrap();
    [
        f32_bits(&g.dq),
        f32_bits(&g.dk),
        f32_bits(&g.dcos.unwrap()),
        f32_bits(&g.dsin.unwrap()),
    ]
}

#[test]
fn position_ids_equal_to_the_sequence_index_give_the_same_bits() {
    // Both paths sum each entry over its tokens in token order: the same bits (short
    // sequences: several tokens of one row in one group of hits of the row kernel, one
    // token per sequence: every token on row 0).
    let e = engine();
    let (hq, hk, d, rows) = (5, 2, 16, 45);
    let shapes = [
        (3, 40, DType::F32),
        (6, 5, DType::F32),
        (40, 1, DType::F32),
        (3, 40, DType::BF16),
    ];
    for (b, sq, dtype) in shapes {
        let t = |seed, heads: usize, range| {
            tensor_from_f64(
                e,
                &data(seed, b * sq * heads * d, range),
                &[b, sq, heads, d],
                dtype,
            )
        };
        let (q, k, dq, dk) = (
            t(170, hq, 2.0),
            t(171, hk, 2.0),
            t(172, hq, 1.0),
            t(173, hk, 1.0),
        );
        let c = tensor_from_f64(e, &data(174, rows * d / 2, 1.2), &[rows, d / 2], dtype);
        let s = tensor_from_f64(e, &data(175, rows * d / 2, 1.2), &[rows, d / 2], dtype);
        let f = tensor_from_f64(e, &data(176, rows * d, 1.2), &[rows, d / 2, 2], dtype);
        let seq_ids: Vec<i32> = (0..sq as i32).collect();
        let shared = Tensor::from_slice(e, &seq_ids, &[sq]).unwrap();
        let batched_ids: Vec<i32> = (0..b).flat_map(|_| seq_ids.clone()).collect();
        let batched = Tensor::from_slice(e, &batched_ids, &[b, sq]).unwrap();
        for llama4 in [false, true] {
            let c = if llama4 { &f } else { &c };
            let plain = table_grad_bits(&q, &k, c, &s, &dq, &dk, None, llama4);
            for ids in [&shared, &batched] {
                let got = table_grad_bits(&q, &k, c, &s, &dq, &dk, Some(ids), llama4);
                let what = format!("{dtype} b {b} ids {:?} llama4 {llama4}", ids.shape());
                assert_eq!(got, plain, "{what}");
            }
        }
    }
}

#[test]
fn table_gradients_in_token_chunks_give_the_same_bits() {
    // A workspace bound below the whole scratch runs the tokens in chunks, one after the
    // other: the same bits; a bound below one token's scratch is a typed error.
    let e = common::private_engine();
    let (b, sq, hq, hk, d, rows) = (2, 1050, 2, 1, 8, 20);
    let t = |seed, heads: usize, range| {
        tensor_from_f64(
            &e,
            &data(seed, b * sq * heads * d, range),
            &[b, sq, heads, d],
            DType::F32,
        )
    };
    let (q, k, dq, dk) = (
        t(180, hq, 2.0),
        t(181, hk, 2.0),
        t(182, hq, 1.0),
        t(183, hk, 1.0),
    );
    let (c, s) = rope::tables(&e, rows, d, 10000.0, &RopeScaling::None, DType::F32).unwrap();
    let ids: Vec<i32> = (0..b * sq).map(|v| (v * 13 % 23) as i32).collect();
    let pos = Tensor::from_slice(&e, &ids, &[b, sq]).unwrap();
    let opts = RopeQkOptions {
        table_grads: true,
        check_positions: false,
        ..Default::default()
    };
    let (_, saved) = rope::qk_forward(&q, &k, &c, &s, Some(&pos), &opts).unwrap();
    let per_token = 8 * d as u64 / 2;
    assert_eq!(
        rope::backward_workspace_bytes(&saved),
        b as u64 * sq as u64 * per_token
    );
    let bits = || {
        let g = rope::qk_backward(&saved, &dq, &dk).unwrap();
        [f32_bits(&g.dcos.unwrap()), f32_bits(&g.dsin.unwrap())]
    };
    let whole = bits();
    assert_eq!(bits(), whole, "rerun");
    for tokens in [1030, 97, 1] {
        e.set_workspace_bound(tokens * per_token + 3);
        assert_eq!(bits(), whole, "chunks of {tokens} tokens");
    }
    e.set_workspace_bound(per_token - 1);
    assert!(matches!(
        rope::qk_backward(&saved, &dq, &dk),
        Err(Error::WorkspaceExceeded { .. })
    ));
    // Without table gradients (or without ids) nothing is needed.
    let (_, plain) = rope::qk_forward(
        &q,
        &k,
        &c,
        &s,
        Some(&pos),
        &RopeQkOptions {
            check_positions: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(rope::backward_workspace_bytes(&plain), 0);
    assert!(rope::qk_backward(&plain, &dq, &dk).is_ok());
}

#[test]
fn mrope_sections_select_position_axes() {
    // Three axes (time, height, width) of 2×4 tokens; sections [2, 1, 2] over half = 5.
    let ids: Vec<i32> = (0..3 * 2 * 4).map(|v| v * 7 % 11).collect();
    for dtype in DType::FLOATS {
        for layout in [RopeLayout::Bshd, RopeLayout::Bhsd] {
            let case = QkCase {
                batch: 2,
                seq: 4,
                hq: 2,
                hk: 3,
                dim: 12,
                rot: 10,
                table_rows: 11,
                layout,
                interleaved: false,
            };
            run_qk_case(
                &case,
                dtype,
                50,
                Some((&ids, vec![3, 2, 4])),
                Some([2, 1, 2]),
                false,
            );
            run_qk_case(
                &case,
                dtype,
                60,
                Some((&ids[..12], vec![3, 4])),
                Some([1, 3, 1]),
                false,
            );
            // Sections on multiples of the step run the step kernels.
            let wide = QkCase {
                dim: 32,
                rot: 32,
                ..case
            };
            run_qk_case(
                &wide,
                dtype,
                55,
                Some((&ids, vec![3, 2, 4])),
                Some([8, 0, 8]),
                false,
            );
            let case = QkCase { rot: 8, ..case };
            run_qk_case(
                &case,
                dtype,
                65,
                Some((&ids, vec![3, 2, 4])),
                Some([1, 2, 1]),
                false,
            );
        }
    }
}

#[test]
fn llama4_complex_tables() {
    let ids: Vec<i32> = vec![0, 5, 5, 2, 1, 1];
    for dtype in DType::FLOATS {
        let case = QkCase {
            batch: 2,
            seq: 3,
            hq: 4,
            hk: 2,
            dim: 16,
            rot: 16,
            table_rows: 6,
            layout: RopeLayout::Bshd,
            interleaved: true,
        };
        run_qk_case(&case, dtype, 70, Some((&ids, vec![2, 3])), None, true);
        run_qk_case(&case, dtype, 80, None, None, true);
    }
    // The complex product itself: (x1 + i·x2)·(c + i·s) for one pair.
    let e = engine();
    let q = Tensor::from_slice(e, &[1.0f32, 2.0], &[1, 1, 1, 2]).unwrap();
    let f = Tensor::from_slice(e, &[0.5f32, -3.0], &[1, 1, 2]).unwrap();
    let ((qo, _), _) = rope::llama4_forward(&q, &q, &f, None, &RopeQkOptions::default()).unwrap();
    assert_eq!(
        qo.to_vec::<f32>().unwrap(),
        vec![1.0 * 0.5 - 2.0 * -3.0, 1.0 * -3.0 + 2.0 * 0.5]
    );
}

#[test]
fn host_tables_match_the_f64_formulas() {
    let e = engine();
    let (rows, d, base) = (40usize, 16usize, 10000.0f64);
    let half = d / 2;
    let theta = |i: usize, b: f64| b.powf(-((2 * i) as f64) / d as f64);
    let yarn_rate = |i: usize| {
        // YaRN with factor 4, original length 32, beta_fast 32, beta_slow 1 (HF defaults).
        let corr = |rot: f64| {
            d as f64 * (32.0 / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let (lo, hi) = (
            corr(32.0).floor().max(0.0),
            corr(1.0).ceil().min(d as f64 - 1.0),
        );
        let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
        theta(i, base) * (1.0 - ramp) + theta(i, base) / 4.0 * ramp
    };
    type Rate<'a> = Box<dyn Fn(usize) -> f64 + 'a>;
    let cases: [(RopeScaling, Rate<'_>, f64); 4] = [
        (RopeScaling::None, Box::new(|i| theta(i, base)), 1.0),
        (
            RopeScaling::Linear { factor: 2.0 },
            Box::new(|i| theta(i, base) / 2.0),
            1.0,
        ),
        (
            RopeScaling::Ntk { factor: 4.0 },
            Box::new(|i| theta(i, base * 4f64.powf(16.0 / 14.0))),
            1.0,
        ),
        (
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_positions: 32,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
            },
            Box::new(yarn_rate),
            0.1 * 4f64.ln() + 1.0,
        ),
    ];
    for (scaling, rate, scale) in &cases {
        let (rates, got_scale) = rope::frequencies(d, base, scaling).unwrap();
        assert_eq!(got_scale, *scale);
        for (i, r) in rates.iter().enumerate() {
            assert!(
                (r - rate(i)).abs() <= 1e-15 * rate(i),
                "{scaling:?} rate {i}: {r} vs {}",
                rate(i)
            );
        }
        for dtype in DType::FLOATS {
            let (c, s) = rope::tables(e, rows, d, base, scaling, dtype).unwrap();
            assert_eq!(c.shape(), &[rows, half]);
            let want_c: Vec<f64> = (0..rows * half)
                .map(|k| scale * ((k / half) as f64 * rate(k % half)).cos())
                .collect();
            let want_s: Vec<f64> = (0..rows * half)
                .map(|k| scale * ((k / half) as f64 * rate(k % half)).sin())
                .collect();
            assert_close(
                &format!("{scaling:?} cos {dtype}"),
                &c.to_f64().unwrap(),
                &stored(&want_c, dtype),
                Tolerance::EXACT,
            );
            assert_close(
                &format!("{scaling:?} sin {dtype}"),
                &s.to_f64().unwrap(),
                &stored(&want_s, dtype),
                Tolerance::EXACT,
            );
        }
    }
    // YaRN actually blends: high frequencies kept, low frequencies divided by the factor.
    let (plain, _) = rope::frequencies(d, base, &RopeScaling::None).unwrap();
    let (yarn, _) = rope::frequencies(d, base, &cases[3].0).unwrap();
    assert_eq!(yarn[0], plain[0]);
    assert!((yarn[half - 1] - plain[half - 1] / 4.0).abs() < 1e-18);
    let f = rope::llama4_freqs(e, rows, d, base, &RopeScaling::None).unwrap();
    let (c, s) = rope::tables(e, rows, d, base, &RopeScaling::None, DType::F32).unwrap();
    assert_eq!(
        f.to_f64().unwrap(),
        reference::join_complex(&c.to_f64().unwrap(), &s.to_f64().unwrap())
    );
    // Bad table parameters.
    assert!(matches!(
        rope::frequencies(7, base, &RopeScaling::None),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        rope::frequencies(8, 1.0, &RopeScaling::None),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        rope::frequencies(8, base, &RopeScaling::Ntk { factor: 0.5 }),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        rope::frequencies(8, base, &RopeScaling::Linear { factor: 0.0 }),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        rope::tables(e, 2, 8, base, &RopeScaling::None, DType::I32),
        Err(Error::UnsupportedDType { .. })
    ));
}

/// The step kernels (rows whose width and rotary units are whole 16-byte steps: 4 F32 or 8
/// 16-bit elements) against the unit and token kernels, which run on the same rows widened
/// by a 2-column suffix: the columns agree bit for bit, forward and backward, with F32, F16
/// and BF16 values and cotangents, F32 and 16-bit tables, both layouts and pair conventions,
/// 1, 2 and 4 heads per invocation, partial rotary (copied suffix steps), NaN and infinities
/// among the values (rotated and copied); a rerun gives the same bits.
#[test]
fn step_kernels_equal_unit_kernels_bit_for_bit() {
    let e = engine();
    let (b, s, rows) = (2usize, 5usize, 7usize);
    let pad = |v: &[f64], d: usize| -> Vec<f64> {
        v.chunks(d)
            .flat_map(|r| r.iter().copied().chain([0.5, -0.25]))
            .collect()
    };
    let unpad = |v: Vec<f64>, d: usize| -> Vec<f64> {
        v.chunks(d + 2).flat_map(|r| r[..d].to_vec()).collect()
    };
    let ids: Vec<i32> = vec![3, 0, 6, 6, 1, 2, 4, 5, 0, 1];
    let pos = Tensor::from_slice(e, &ids, &[b, s]).unwrap();
    use DType::{BF16, F16, F32};
    use RopeLayout::{Bhsd, Bshd};
    // (q heads, k heads, layout, values dtype, table dtype, cotangent dtype, interleaved,
    // head dim, rotary dim)
    let cases = [
        (3usize, 1usize, Bshd, F32, F32, F32, false, 16usize, 16usize),
        (3, 1, Bhsd, F32, BF16, F32, true, 16, 16),
        (4, 2, Bshd, F32, F16, F32, true, 16, 16),
        (4, 2, Bhsd, F32, F32, F32, false, 16, 16),
        (8, 4, Bshd, F32, BF16, F32, false, 16, 16),
        (8, 4, Bhsd, F32, F32, F32, true, 16, 16),
        (8, 4, Bhsd, F32, F16, BF16, false, 16, 16),
        (2, 1, Bshd, F32, F32, F32, true, 12, 12),
        (4, 2, Bhsd, F32, BF16, F32, true, 8, 8),
        (2, 2, Bshd, F32, F32, F32, false, 24, 24),
        (2, 2, Bshd, F32, F32, F32, false, 24, 16),
        (3, 1, Bshd, BF16, F32, BF16, false, 16, 16),
        (4, 2, Bhsd, BF16, BF16, BF16, true, 16, 16),
        (8, 4, Bshd, BF16, F16, F32, false, 32, 32),
        (8, 4, Bhsd, F16, F32, F16, true, 24, 24),
        (4, 2, Bshd, F16, BF16, F16, false, 16, 16),
        (2, 1, Bshd, BF16, F32, BF16, false, 24, 16),
        (4, 2, Bhsd, F16, F32, BF16, true, 32, 16),
        (2, 2, Bshd, BF16, F32, BF16, true, 8, 8),
        (2, 2, Bshd, BF16, F32, BF16, false, 24, 24),
    ];
    for (hq, hk, layout, val, table, grad, interleaved, d, rot) in cases {
        let shape = |h: usize, w: usize| match layout {
            RopeLayout::Bshd => vec![b, s, h, w],
            RopeLayout::Bhsd => vec![b, h, s, w],
        };
        let seed = 70 + hq as u64;
        let mut q = data(seed, b * s * hq * d, 2.0);
        // Special values, rotated (column 1) and, with partial rotary, copied (the last).
        q[1] = f64::NAN;
        q[d + 1] = f64::INFINITY;
        q[2 * d - 1] = f64::NAN;
        q[3 * d - 1] = f64::NEG_INFINITY;
        let k = data(seed + 1, b * s * hk * d, 2.0);
        let dq = stored(&data(seed + 2, b * s * hq * d, 1.0), grad);
        let dk = stored(&data(seed + 3, b * s * hk * d, 1.0), grad);
        let c = tensor_from_f64(
            e,
            &data(seed + 4, rows * rot / 2, 1.2),
            &[rows, rot / 2],
            table,
        );
        let sn = tensor_from_f64(
            e,
            &data(seed + 5, rows * rot / 2, 1.2),
            &[rows, rot / 2],
            table,
        );
        let opts = RopeQkOptions {
            rotary_dim: Some(rot),
            interleaved,
            layout,
            ..Default::default()
        };
        let run = |w: usize, f: &dyn Fn(&[f64]) -> Vec<f64>| -> Vec<Vec<f64>> {
            let t = |v: &[f64], h: usize, dt| tensor_from_f64(e, &f(v), &shape(h, w), dt);
            let (qt, kt) = (t(&q, hq, val), t(&k, hk, val));
            let ((qo, ko), saved) = rope::qk_forward(&qt, &kt, &c, &sn, Some(&pos), &opts).unwrap();
            let g = rope::qk_backward(&saved, &t(&dq, hq, grad), &t(&dk, hk, grad)).unwrap();
            [qo, ko, g.dq, g.dk]
                .iter()
                .map(|x| x.to_f64().unwrap())
                .collect()
        };
        let label = format!(
            "hq {hq} hk {hk} {layout:?} {val} {table} {grad} interleaved {interleaved} d {d} rot {rot}"
        );
        let bits = |v: &[Vec<f64>]| -> Vec<Vec<u64>> {
            v.iter()
                .map(|x| x.iter().map(|y| y.to_bits()).collect())
                .collect()
        };
        let stepped = run(d, &|v| v.to_vec());
        let units: Vec<Vec<f64>> = run(d + 2, &|v| pad(v, d))
            .into_iter()
            .map(|v| unpad(v, d))
            .collect();
        assert_eq!(
            bits(&stepped),
            bits(&units),
            "{label}: step vs unit kernels"
        );
        assert_eq!(
            bits(&stepped),
            bits(&run(d, &|v| v.to_vec())),
            "{label}: rerun"
        );
    }
}

#[test]
fn reruns_are_bit_identical_including_table_gradients() {
    let e = engine();
    let (b, s, hq, hk, d) = (2, 6, 3, 2, 8);
    let q = tensor_from_f64(
        e,
        &data(90, b * s * hq * d, 2.0),
        &[b, s, hq, d],
        DType::F32,
    );
    let k = tensor_from_f64(
        e,
        &data(91, b * s * hk * d, 2.0),
        &[b, s, hk, d],
        DType::F32,
    );
    let dq = tensor_from_f64(
        e,
        &data(92, b * s * hq * d, 1.0),
        &[b, s, hq, d],
        DType::F32,
    );
    let dk = tensor_from_f64(
        e,
        &data(93, b * s * hk * d, 1.0),
        &[b, s, hk, d],
        DType::F32,
    );
    let (c, sn) = rope::tables(e, 4, d, 10000.0, &RopeScaling::None, DType::F32).unwrap();
    let pos = Tensor::from_slice(e, &[0i32, 1, 1, 2, 3, 0, 3, 3, 3, 2, 1, 0], &[b, s]).unwrap();
    let opts = RopeQkOptions {
        table_grads: true,
        ..Default::default()
    };
    let run = || {
        let ((qo, ko), saved) = rope::qk_forward(&q, &k, &c, &sn, Some(&pos), &opts).unwrap();
        let g = rope::qk_backward(&saved, &dq, &dk).unwrap();
        [
            f32_bits(&qo),
            f32_bits(&ko),
            f32_bits(&g.dq),
            f32_bits(&g.dk),
            f32_bits(&g.dcos.unwrap()),
            f32_bits(&g.dsin.unwrap()),
        ]
    };
    assert_eq!(run(), run());
}

#[test]
fn empty_shapes() {
    let e = engine();
    let v = Tensor::zeros(e, &[0, 8], DType::F16).unwrap();
    let t = Tensor::zeros(e, &[0, 4], DType::F32).unwrap();
    let (y, saved) = rope::forward(
        &v,
        &t,
        &t,
        &RopeOptions {
            table_grads: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(y.shape(), &[0, 8]);
    let g = rope::backward(&saved, &v).unwrap();
    assert_eq!((g.dvalues.len(), g.dcos.unwrap().len()), (0, 0));
    let g = rope::backward_as(&saved, &v, DType::BF16).unwrap();
    assert_eq!(
        (g.dvalues.shape(), g.dvalues.dtype()),
        (&[0, 8][..], DType::BF16)
    );
    let q = Tensor::zeros(e, &[2, 0, 3, 8], DType::BF16).unwrap();
    let c = Tensor::zeros(e, &[5, 4], DType::F32).unwrap();
    let ((qo, _), saved) = rope::qk_forward(
        &q,
        &q,
        &c,
        &c,
        None,
        &RopeQkOptions {
            table_grads: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(qo.shape(), &[2, 0, 3, 8]);
    let g = rope::qk_backward(&saved, &q, &q).unwrap();
    assert_eq!(g.dcos.unwrap().to_f64().unwrap(), vec![0.0; 20]);
    let g = rope::qk_backward_as(&saved, &q, &q, DType::BF16).unwrap();
    assert_eq!((g.dq.len(), g.dq.dtype()), (0, DType::BF16));
    assert_eq!(g.dcos.unwrap().to_f64().unwrap(), vec![0.0; 20]);
}

#[test]
fn unchecked_out_of_range_positions_rotate_by_zero() {
    let e = engine();
    let q = Tensor::from_slice(e, &[1.0f32, 2.0, 3.0, 4.0], &[1, 2, 1, 2]).unwrap();
    let c = Tensor::from_slice(e, &[0.5f32], &[1, 1]).unwrap();
    let pos = Tensor::from_slice(e, &[0i32, 5], &[1, 2]).unwrap();
    let opts = RopeQkOptions {
        check_positions: false,
        table_grads: true,
        ..Default::default()
    };
    let ((qo, _), saved) = rope::qk_forward(&q, &q, &c, &c, Some(&pos), &opts).unwrap();
    assert_eq!(
        qo.to_vec::<f32>().unwrap(),
        vec![0.5 * 1.0 - 0.5 * 2.0, 0.5 * 2.0 + 0.5 * 1.0, 0.0, 0.0]
    );
    let g = rope::qk_backward(&saved, &q, &q).unwrap();
    // Only token 0 (twice: as q and as k) contributes to table row 0.
    assert_eq!(
        g.dcos.unwrap().to_vec::<f32>().unwrap(),
        vec![2.0 * (1.0 * 1.0 + 2.0 * 2.0)]
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let e = engine();
    let v = Tensor::zeros(e, &[3, 8], DType::F32).unwrap();
    let t = Tensor::zeros(e, &[3, 4], DType::F32).unwrap();
    let d = RopeOptions::default();
    // Odd rotary_dim, rotary_dim above dim.
    assert!(matches!(
        rope::forward(
            &v,
            &t,
            &t,
            &RopeOptions {
                rotary_dim: Some(5),
                ..d
            }
        ),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        rope::forward(
            &v,
            &t,
            &t,
            &RopeOptions {
                rotary_dim: Some(10),
                ..d
            }
        ),
        Err(Error::OutOfBounds { .. })
    ));
    // Table too short, wrong width, cos/sin mismatch, integer table, 1-D values.
    let short = Tensor::zeros(e, &[2, 4], DType::F32).unwrap();
    assert_eq!(
        rope::forward(&v, &short, &short, &d).unwrap_err(),
        Error::OutOfBounds {
            what: "rope: cos: rows".into(),
            got: 2,
            min: 3,
            max: u64::from(u32::MAX)
        }
    );
    let wide = Tensor::zeros(e, &[3, 5], DType::F32).unwrap();
    assert!(matches!(
        rope::forward(&v, &wide, &wide, &d),
        Err(Error::ShapeMismatch { .. })
    ));
    let t16 = Tensor::zeros(e, &[3, 4], DType::F16).unwrap();
    assert!(matches!(
        rope::forward(&v, &t, &t16, &d),
        Err(Error::UnsupportedDType { .. })
    ));
    let ti = Tensor::from_slice(e, &[0i32; 12], &[3, 4]).unwrap();
    assert!(matches!(
        rope::forward(&v, &ti, &ti, &d),
        Err(Error::UnsupportedDType { .. })
    ));
    assert!(matches!(
        rope::forward(&v.reshape(&[24]).unwrap(), &t, &t, &d),
        Err(Error::ShapeMismatch { .. })
    ));
    // Cotangent of the wrong shape.
    let (_, saved) = rope::forward(&v, &t, &t, &d).unwrap();
    assert!(matches!(
        rope::backward(&saved, &t),
        Err(Error::ShapeMismatch { .. })
    ));
    // q/k: position id out of range (negative and too large), wrong position shape or dtype,
    // table shorter than seq, k of another batch, mRoPE sections.
    let q = Tensor::zeros(e, &[2, 3, 4, 8], DType::BF16).unwrap();
    let k = Tensor::zeros(e, &[2, 3, 1, 8], DType::BF16).unwrap();
    let c = Tensor::zeros(e, &[4, 4], DType::F32).unwrap();
    let qd = RopeQkOptions::default();
    let pos = |ids: &[i32], shape: &[usize]| Tensor::from_slice(e, ids, shape).unwrap();
    assert_eq!(
        rope::qk_forward(
            &q,
            &k,
            &c,
            &c,
            Some(&pos(&[0, 1, 2, 3, 4, 0], &[2, 3])),
            &qd
        )
        .unwrap_err(),
        Error::OutOfBounds {
            what: "rope: position id".into(),
            got: 4,
            min: 0,
            max: 3
        }
    );
    assert!(matches!(
        rope::qk_forward(&q, &k, &c, &c, Some(&pos(&[0, -1, 2], &[3])), &qd),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        rope::qk_forward(&q, &k, &c, &c, Some(&pos(&[0, 1], &[2])), &qd),
        Err(Error::ShapeMismatch { .. })
    ));
    let fpos = Tensor::zeros(e, &[3], DType::F32).unwrap();
    assert!(matches!(
        rope::qk_forward(&q, &k, &c, &c, Some(&fpos), &qd),
        Err(Error::UnsupportedDType { .. })
    ));
    let c2 = Tensor::zeros(e, &[2, 4], DType::F32).unwrap();
    assert!(matches!(
        rope::qk_forward(&q, &k, &c2, &c2, None, &qd),
        Err(Error::OutOfBounds { .. })
    ));
    let k_bad = Tensor::zeros(e, &[1, 3, 1, 8], DType::BF16).unwrap();
    assert!(matches!(
        rope::qk_forward(&q, &k_bad, &c, &c, None, &qd),
        Err(Error::ShapeMismatch { .. })
    ));
    let k32 = Tensor::zeros(e, &[2, 3, 1, 8], DType::F32).unwrap();
    assert!(matches!(
        rope::qk_forward(&q, &k32, &c, &c, None, &qd),
        Err(Error::UnsupportedDType { .. })
    ));
    let m = RopeQkOptions {
        mrope_section: Some([1, 1, 1]),
        ..qd
    };
    let p3 = pos(&[0; 9], &[3, 3]);
    assert!(matches!(
        rope::qk_forward(&q, &k, &c, &c, Some(&p3), &m),
        Err(Error::OutOfBounds { .. })
    ));
    let m = RopeQkOptions {
        mrope_section: Some([2, 1, 1]),
        ..qd
    };
    assert!(matches!(
        rope::qk_forward(&q, &k, &c, &c, None, &m),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(rope::qk_forward(&q, &k, &c, &c, Some(&p3), &m).is_ok());
    // Llama 4: freqs not [rows, half, 2]; the wrong backward for a saved context.
    assert!(matches!(
        rope::llama4_forward(&q, &k, &c, None, &qd),
        Err(Error::ShapeMismatch { .. })
    ));
    let (_, saved) = rope::qk_forward(&q, &k, &c, &c, None, &qd).unwrap();
    assert!(rope::llama4_backward(&saved, &q, &k).is_err());
    assert!(rope::qk_backward(&saved, &k, &k).is_err());
}

#[test]
fn tensors_of_another_engine_are_rejected() {
    let e = engine();
    let other = common::private_engine();
    let v = Tensor::zeros(e, &[2, 4], DType::F32).unwrap();
    let t = Tensor::zeros(e, &[2, 2], DType::F32).unwrap();
    let t_other = Tensor::zeros(&other, &[2, 2], DType::F32).unwrap();
    let d = RopeOptions::default();
    assert!(matches!(
        rope::forward(&v, &t_other, &t, &d),
        Err(Error::EngineMismatch { .. })
    ));
    let (_, saved) = rope::forward(&v, &t, &t, &d).unwrap();
    let dy_other = Tensor::zeros(&other, &[2, 4], DType::F32).unwrap();
    assert!(matches!(
        rope::backward(&saved, &dy_other),
        Err(Error::EngineMismatch { .. })
    ));
    let q = Tensor::zeros(e, &[1, 2, 1, 4], DType::F32).unwrap();
    let k_other = Tensor::zeros(&other, &[1, 2, 1, 4], DType::F32).unwrap();
    let qd = RopeQkOptions::default();
    assert!(matches!(
        rope::qk_forward(&q, &k_other, &t, &t, None, &qd),
        Err(Error::EngineMismatch { .. })
    ));
    let pos_other = Tensor::from_slice(&other, &[0i32, 1], &[2]).unwrap();
    assert!(matches!(
        rope::qk_forward(&q, &q, &t, &t, Some(&pos_other), &qd),
        Err(Error::EngineMismatch { .. })
    ));
}

/// `backward_as` / `qk_backward_as` store the value gradients as the F32 gradients rounded
/// once: bit for bit `cast::cast` of [`rope::backward`]'s / [`rope::qk_backward`]'s (a NaN as
/// any NaN), the table gradients F32 and identical. 16-bit cotangents whose rows split into
/// whole steps of 8 (head dims 16, 24, 32; split halves need half the rotary dim a multiple of
/// 8) are written directly by the step kernels; the others (F32 cotangents, head dim 12,
/// partial rotary with a short half) narrow the F32 gradient. Both layouts, interleaved and
/// split pairs, position ids with table gradients.
#[test]
fn backward_as_is_the_f32_gradient_rounded_once() {
    use DType::{BF16, F16, F32};
    use RopeLayout::{Bhsd, Bshd};
    let e = engine();
    let (b, s, rows) = (2usize, 5usize, 7usize);
    let ids: Vec<i32> = vec![3, 0, 6, 6, 1, 2, 4, 5, 0, 1];
    let pos = Tensor::from_slice(e, &ids, &[b, s]).unwrap();
    let narrowed = |t: &Tensor, d: DType| {
        if d == F32 {
            t.clone()
        } else {
            wgrad::cast::cast(t, d).unwrap()
        }
    };
    let bits =
        |t: &Tensor| -> Vec<u64> { t.to_f64().unwrap().iter().map(|v| v.to_bits()).collect() };
    // (q heads, k heads, layout, values and cotangent dtype, interleaved, head dim, rotary dim)
    let cases = [
        (4usize, 2usize, Bshd, BF16, false, 16usize, 16usize),
        (4, 2, Bhsd, F16, true, 16, 16),
        (8, 4, Bshd, BF16, true, 32, 32),
        (2, 1, Bhsd, BF16, false, 32, 16),
        (2, 2, Bshd, F16, false, 24, 24),
        (2, 1, Bshd, BF16, true, 12, 12),
        (2, 2, Bhsd, F32, false, 16, 16),
    ];
    for (hq, hk, layout, dt, interleaved, d, rot) in cases {
        let shape = |h: usize| match layout {
            Bshd => vec![b, s, h, d],
            Bhsd => vec![b, h, s, d],
        };
        let t = |seed: u64, h: usize, range: f64| {
            tensor_from_f64(e, &data(seed, b * s * h * d, range), &shape(h), dt)
        };
        let (q, k) = (t(80, hq, 2.0), t(81, hk, 2.0));
        let mut dqv = data(82, b * s * hq * d, 1.0);
        dqv[1] = f64::NAN;
        dqv[d + 2] = f64::INFINITY;
        let dq = tensor_from_f64(e, &dqv, &shape(hq), dt);
        let dk = t(83, hk, 1.0);
        let table =
            |seed| tensor_from_f64(e, &data(seed, rows * rot / 2, 1.2), &[rows, rot / 2], F32);
        let (c, sn) = (table(84), table(85));
        let opts = RopeQkOptions {
            rotary_dim: Some(rot),
            interleaved,
            layout,
            table_grads: true,
            ..Default::default()
        };
        let (_, saved) = rope::qk_forward(&q, &k, &c, &sn, Some(&pos), &opts).unwrap();
        let want = rope::qk_backward(&saved, &dq, &dk).unwrap();
        for out in DType::FLOATS {
            let what = format!(
                "hq {hq} hk {hk} {layout:?} {dt} -> {out} interleaved {interleaved} d {d} rot {rot}"
            );
            let got = rope::qk_backward_as(&saved, &dq, &dk, out).unwrap();
            assert_eq!(got.dq.dtype(), out, "{what}");
            common::assert_same_bits(&format!("{what} dq"), &got.dq, &narrowed(&want.dq, out));
            common::assert_same_bits(&format!("{what} dk"), &got.dk, &narrowed(&want.dk, out));
            for (a, w) in [(&got.dcos, &want.dcos), (&got.dsin, &want.dsin)] {
                assert_eq!(
                    bits(a.as_ref().unwrap()),
                    bits(w.as_ref().unwrap()),
                    "{what} tables"
                );
            }
            let again = rope::qk_backward_as(&saved, &dq, &dk, out).unwrap();
            assert_eq!(bits(&again.dq), bits(&got.dq), "{what} rerun");
        }
    }
    // Single tensors `[rows, dim]` with per-row tables.
    for (dt, dim, rot, interleaved) in [
        (BF16, 64usize, 64usize, false),
        (F16, 40, 32, true),
        (BF16, 20, 20, false),
    ] {
        let n = 6;
        let x = tensor_from_f64(e, &data(90, n * dim, 2.0), &[n, dim], dt);
        let dy = tensor_from_f64(e, &data(91, n * dim, 1.0), &[n, dim], dt);
        let table = |seed| tensor_from_f64(e, &data(seed, n * rot / 2, 1.2), &[n, rot / 2], dt);
        let (c, sn) = (table(92), table(93));
        let opts = RopeOptions {
            rotary_dim: Some(rot),
            interleaved,
            table_grads: true,
        };
        let (_, saved) = rope::forward(&x, &c, &sn, &opts).unwrap();
        let want = rope::backward(&saved, &dy).unwrap();
        for out in DType::FLOATS {
            let what =
                format!("single {dt} -> {out} dim {dim} rot {rot} interleaved {interleaved}");
            let got = rope::backward_as(&saved, &dy, out).unwrap();
            common::assert_same_bits(&what, &got.dvalues, &narrowed(&want.dvalues, out));
            assert_eq!(
                bits(got.dcos.as_ref().unwrap()),
                bits(want.dcos.as_ref().unwrap()),
                "{what} dcos"
            );
        }
    }
    // The direct path allocates no F32 gradient.
    let private = common::private_engine();
    let (hq, hk, d) = (8, 2, 128);
    let up = |seed: u64, h: usize| {
        wgrad::gradcheck::tensor_from_f64(
            &private,
            &data(seed, b * s * h * d, 1.0),
            &[b, s, h, d],
            BF16,
        )
        .unwrap()
        .0
    };
    let (q, k) = (up(95, hq), up(96, hk));
    let cs = |seed| {
        wgrad::gradcheck::tensor_from_f64(&private, &data(seed, s * d / 2, 1.0), &[s, d / 2], BF16)
            .unwrap()
            .0
    };
    let (c, sn) = (cs(97), cs(98));
    let (_, saved) = rope::qk_forward(&q, &k, &c, &sn, None, &RopeQkOptions::default()).unwrap();
    private.synchronize().unwrap();
    let before = private.memory().live_bytes;
    private.reset_peak();
    let got = rope::qk_backward_as(&saved, &q, &k, BF16).unwrap();
    private.synchronize().unwrap();
    let grown = private.memory().peak_bytes - before;
    let direct = ((hq + hk) * b * s * d * 2) as u64;
    assert!(
        grown <= direct * 9 / 8 + 4096,
        "peak grew {grown} bytes for {direct} bytes of BF16 gradients"
    );
    drop(got);
    match rope::qk_backward_as(&saved, &q, &k, DType::I32) {
        Err(Error::UnsupportedDType { .. }) => {}
        other => panic!("expected UnsupportedDType, got {other:?}"),
    }
}
