//! Casts between F32, F16 and BF16, bit for bit against the `half` crate: narrowing over a
//! large set of f32 bit patterns (every sign/exponent pair with many mantissas, every rounding
//! tie and its neighbours, subnormal and overflow boundaries, zeros, infinities, NaNs), widening
//! and 16-bit ↔ 16-bit over all 65,536 patterns, odd element counts, reproducibility and
//! dtype errors. NaNs too are compared bit for bit (quiet bit and payload as `half` gives them).

mod common;

use common::{Rng, engine, private_engine};
use half::{bf16, f16};
use wgrad::{DType, Error, Tensor, cast::cast};

/// The f32 patterns every narrowing cast is checked on.
fn f32_patterns() -> Vec<u32> {
    let mut rng = Rng::new(0xca57);
    let mut v = Vec::new();
    // Every sign and exponent, with mantissas that hit the f16 and bf16 rounding positions
    // (bit 13 for f16 normals, bit 16 for bf16): exact, just below, at and just above ties.
    let mantissas: [u32; 24] = [
        0, 1, 2, 0x3ff, 0x400, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x5000, 0x7fff,
        0x8000, 0x8001, 0xffff, 0x10000, 0x17fff, 0x18000, 0x18001, 0x400000, 0x7fe000, 0x7ff000,
        0x7fffff,
    ];
    for sign in 0..2u32 {
        for exp in 0..256u32 {
            for &m in &mantissas {
                v.push(sign << 31 | exp << 23 | m);
            }
            for _ in 0..4 {
                v.push(sign << 31 | exp << 23 | (rng.next_u32() & 0x7fffff));
            }
        }
    }
    // Every halfway point between neighbouring finite f16 values (exact in f32), with its
    // f32 neighbours: the ties of f16 rounding, normal and subnormal, up to the overflow
    // threshold (the midpoint between 65504 and 65536 rounds to infinity).
    for h in 0..0x7c00u16 {
        let lo = f16::from_bits(h).to_f32();
        let hi = if h == 0x7bff {
            65536.0
        } else {
            f16::from_bits(h + 1).to_f32()
        };
        let mid = (lo + hi) / 2.0;
        for b in [mid.to_bits() - 1, mid.to_bits(), mid.to_bits() + 1] {
            v.push(b);
            v.push(b | 0x8000_0000);
        }
    }
    // Every halfway point between neighbouring bf16 values, with its neighbours.
    for h in 0..0x7f80u32 {
        let mid = h << 16 | 0x8000;
        for b in [mid - 1, mid, mid + 1] {
            v.push(b);
            v.push(b | 0x8000_0000);
        }
    }
    // Named boundaries and specials.
    let named: [f32; 16] = [
        0.0,
        65504.0,           // largest f16
        65519.996,         // just below the f16 overflow tie
        65520.0,           // ties to infinity
        6.103_515_6e-5,    // smallest normal f16 (2^-14)
        5.960_464_5e-8,    // smallest subnormal f16 (2^-24)
        2.980_232_2e-8,    // 2^-25: ties to zero
        8.940_697e-8,      // 1.5 * 2^-24: ties to even (2 * 2^-24)
        6.097_555e-5,      // largest f16 subnormal
        f32::MIN_POSITIVE, // smallest normal f32
        1e-45,             // smallest subnormal f32
        f32::MAX,          // overflows both f16 and (by rounding) bf16
        3.389_531_4e38,    // largest finite bf16
        f32::INFINITY,
        1.0,
        std::f32::consts::PI,
    ];
    for x in named {
        for d in [-2i64, -1, 0, 1, 2] {
            let b = (i64::from(x.to_bits()) + d).clamp(0, 0x7f80_0000) as u32;
            v.push(b);
            v.push(b | 0x8000_0000);
        }
    }
    // NaNs: quiet, signalling, with payloads in the low bits only (which f16 truncation
    // would drop), both signs.
    for b in [
        0x7fc0_0000u32,
        0x7f80_0001,
        0x7fa0_0000,
        0x7f80_2000,
        0x7f80_0fff,
        0x7fff_ffff,
        0x7fbf_ffff,
    ] {
        v.push(b);
        v.push(b | 0x8000_0000);
    }
    // And random patterns.
    for _ in 0..50_000 {
        v.push(rng.next_u32());
    }
    v
}

fn same_or_both_nan(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits()
}

/// Index and (input, got, want) of the first mismatch, for messages.
fn first_mismatch<I: std::fmt::Debug + Copy, O: std::fmt::Debug + Copy>(
    input: &[I],
    got: &[O],
    want: &[O],
    ok: impl Fn(O, O) -> bool,
) -> Option<(usize, I, O, O)> {
    assert_eq!(got.len(), want.len(), "length");
    (0..got.len())
        .find(|&i| !ok(got[i], want[i]))
        .map(|i| (i, input[i], got[i], want[i]))
}

fn upload_bits_f32(bits: &[u32]) -> Tensor {
    let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    Tensor::from_slice(engine(), &x, &[x.len()]).unwrap()
}

#[test]
fn f32_to_f16_matches_half() {
    let bits = f32_patterns();
    let x = upload_bits_f32(&bits);
    let y = cast(&x, DType::F16).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.shape(), x.shape());
    let got = y.to_vec::<f16>().unwrap();
    let want: Vec<f16> = bits
        .iter()
        .map(|&b| f16::from_f32(f32::from_bits(b)))
        .collect();
    let bad = first_mismatch(&bits, &got, &want, |g: f16, w: f16| {
        g.to_bits() == w.to_bits()
    });
    assert_eq!(
        bad,
        None,
        "(index, f32 bits, gpu, half) of {} patterns",
        bits.len()
    );
}

#[test]
fn f32_to_bf16_matches_half() {
    let bits = f32_patterns();
    let x = upload_bits_f32(&bits);
    let y = cast(&x, DType::BF16).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    let got = y.to_vec::<bf16>().unwrap();
    let want: Vec<bf16> = bits
        .iter()
        .map(|&b| bf16::from_f32(f32::from_bits(b)))
        .collect();
    let bad = first_mismatch(&bits, &got, &want, |g: bf16, w: bf16| {
        g.to_bits() == w.to_bits()
    });
    assert_eq!(
        bad,
        None,
        "(index, f32 bits, gpu, half) of {} patterns",
        bits.len()
    );
}

#[test]
fn f16_to_f32_all_patterns() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
    let x = Tensor::from_slice(engine(), &h, &[256, 256]).unwrap();
    let y = cast(&x, DType::F32).unwrap();
    assert_eq!(y.shape(), &[256, 256]);
    let got = y.to_vec::<f32>().unwrap();
    let want: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
    let bad = first_mismatch(&all, &got, &want, same_or_both_nan);
    assert_eq!(bad, None, "(index, f16 bits, gpu, half)");
}

#[test]
fn bf16_to_f32_all_patterns() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let b: Vec<bf16> = all.iter().map(|&v| bf16::from_bits(v)).collect();
    let x = Tensor::from_slice(engine(), &b, &[all.len()]).unwrap();
    let got = cast(&x, DType::F32).unwrap().to_vec::<f32>().unwrap();
    let want: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
    let bad = first_mismatch(&all, &got, &want, same_or_both_nan);
    assert_eq!(bad, None, "(index, bf16 bits, gpu, half)");
}

#[test]
fn f16_to_bf16_all_patterns() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
    let x = Tensor::from_slice(engine(), &h, &[all.len()]).unwrap();
    let got = cast(&x, DType::BF16).unwrap().to_vec::<bf16>().unwrap();
    let want: Vec<bf16> = h.iter().map(|v| bf16::from_f32(v.to_f32())).collect();
    let bad = first_mismatch(&all, &got, &want, |g: bf16, w: bf16| {
        g.to_bits() == w.to_bits()
    });
    assert_eq!(bad, None, "(index, f16 bits, gpu, half via f32)");
}

#[test]
fn bf16_to_f16_all_patterns() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let b: Vec<bf16> = all.iter().map(|&v| bf16::from_bits(v)).collect();
    let x = Tensor::from_slice(engine(), &b, &[all.len()]).unwrap();
    let got = cast(&x, DType::F16).unwrap().to_vec::<f16>().unwrap();
    let want: Vec<f16> = b.iter().map(|v| f16::from_f32(v.to_f32())).collect();
    let bad = first_mismatch(&all, &got, &want, |g: f16, w: f16| {
        g.to_bits() == w.to_bits()
    });
    assert_eq!(bad, None, "(index, bf16 bits, gpu, half via f32)");
}

/// The value of `x` in `dtype`, as `half` rounds it (the host-side model of a cast).
fn host_cast(x: f64, dtype: DType) -> f64 {
    common::round_to(x, dtype)
}

#[test]
fn odd_element_counts() {
    // A private engine, so that the pool hands out the dirty buffers freed just before.
    let e = private_engine();
    let mut rng = Rng::new(9);
    for len in [1usize, 3, 5, 257] {
        for from in DType::FLOATS {
            for to in DType::FLOATS {
                if from == to {
                    continue;
                }
                // Values of every magnitude f16 holds, from subnormal to near overflow.
                let data: Vec<f64> = (0..len)
                    .map(|_| rng.uniform(-1.0, 1.0) * 2f64.powf(rng.uniform(-26.0, 16.0)))
                    .collect();
                let x = common::tensor_from_f64(&e, &data, &[len], from);
                let src = x.to_f64().unwrap();
                // Fill the pool with a dirty buffer of the output's size class.
                let dirty = vec![u32::MAX; (len * to.size()).div_ceil(4) + 1];
                drop(Tensor::from_slice(&e, &dirty, &[dirty.len()]).unwrap());
                let y = cast(&x, to).unwrap();
                assert_eq!(y.len(), len);
                let got = y.to_f64().unwrap();
                let want: Vec<f64> = src.iter().map(|&v| host_cast(v, to)).collect();
                for i in 0..len {
                    assert_eq!(
                        got[i].to_bits(),
                        want[i].to_bits(),
                        "{from}→{to}, {len} elements: element {i} of {} is {}, want {}",
                        src[i],
                        got[i],
                        want[i]
                    );
                }
                // 16-bit outputs of odd length: the padding half of the last word is zero.
                if to.size() == 2 && len % 2 == 1 {
                    let padded =
                        Tensor::from_buffer(&e, y.buffer().clone(), &[len + 1], to).unwrap();
                    let bits = padded.to_f64().unwrap();
                    assert_eq!(bits[len].to_bits(), 0, "{from}→{to}, {len}: padding half");
                }
            }
        }
    }
}

#[test]
fn cast_is_bit_reproducible() {
    let bits = f32_patterns();
    let x = upload_bits_f32(&bits[..bits.len().min(60_001)]);
    for to in [DType::F16, DType::BF16] {
        let a = cast(&x, to).unwrap();
        let b = cast(&x, to).unwrap();
        let (a, b) = match to {
            DType::F16 => (
                a.to_vec::<f16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                b.to_vec::<f16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
            ),
            _ => (
                a.to_vec::<bf16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
                b.to_vec::<bf16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
            ),
        };
        assert!(a == b, "{to}: two runs differ");
        // And back to f32.
        let h = cast(&x, to).unwrap();
        let w1 = common::f32_bits(&cast(&h, DType::F32).unwrap());
        let w2 = common::f32_bits(&cast(&h, DType::F32).unwrap());
        assert!(w1 == w2, "{to}→f32: two runs differ");
    }
}

#[test]
fn non_float_dtypes_are_rejected() {
    let e = engine();
    let i = Tensor::from_slice(e, &[1i32, 2, 3], &[3]).unwrap();
    let u = Tensor::from_slice(e, &[1u32, 2, 3], &[3]).unwrap();
    let f = Tensor::from_slice(e, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    for (x, to, bad) in [
        (&i, DType::F32, DType::I32),
        (&u, DType::F16, DType::U32),
        (&i, DType::I32, DType::I32),
        (&f, DType::I32, DType::I32),
        (&f, DType::U32, DType::U32),
    ] {
        match cast(x, to) {
            Err(Error::UnsupportedDType { got, accepted, .. }) => {
                assert_eq!(got, bad);
                assert_eq!(accepted, DType::FLOATS.to_vec());
            }
            other => panic!(
                "{:?} → {to}: expected UnsupportedDType, got {other:?}",
                x.dtype()
            ),
        }
    }
}

#[test]
fn same_dtype_returns_equal_data() {
    let e = engine();
    let data: Vec<f64> = common::random_f64(12, 11, -3.0, 3.0);
    for dt in DType::FLOATS {
        let x = common::tensor_from_f64(e, &data, &[11], dt);
        let y = cast(&x, dt).unwrap();
        assert_eq!(y.dtype(), dt);
        assert_eq!(y.shape(), x.shape());
        assert_eq!(y.to_f64().unwrap(), x.to_f64().unwrap());
        assert_eq!(y.to_f64().unwrap(), common::stored(&data, dt));
    }
}

#[test]
fn empty_and_shaped_casts() {
    let e = engine();
    for from in DType::FLOATS {
        for to in DType::FLOATS {
            let x = Tensor::zeros(e, &[0, 3], from).unwrap();
            let y = cast(&x, to).unwrap();
            assert_eq!(y.shape(), &[0, 3]);
            assert_eq!(y.to_f64().unwrap(), Vec::<f64>::new());
        }
    }
    let data = common::random_f64(13, 2 * 3 * 5, -100.0, 100.0);
    let x = common::tensor_from_f64(e, &data, &[2, 3, 5], DType::F32);
    for to in [DType::F16, DType::BF16] {
        let y = cast(&x, to).unwrap();
        assert_eq!(y.shape(), &[2, 3, 5]);
        assert_eq!(y.to_f64().unwrap(), common::stored(&data, to));
        // Round trip back to f32 is exact (widening).
        let z = cast(&y, DType::F32).unwrap();
        assert_eq!(z.to_f64().unwrap(), common::stored(&data, to));
    }
}

#[test]
fn casts_past_the_binding_limit_run_in_windows() {
    // An engine binding at most 4 KiB: odd counts of F32, F16 and BF16 values many bindings
    // long convert to the same bits as on the shared engine (windows of whole pairs; the last
    // one short and ending inside a word).
    let small = common::capped_engine(4 << 10);
    let n = 12_345;
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 10_007) as f32 / 37.0 - 130.0)
        .collect();
    for from in [DType::F32, DType::F16, DType::BF16] {
        for to in [DType::F32, DType::F16, DType::BF16] {
            if from == to {
                continue;
            }
            let on = |e: &wgrad::Engine| -> Vec<u64> {
                let x = cast(&Tensor::from_slice(e, &values, &[n]).unwrap(), from).unwrap();
                let y = cast(&x, to).unwrap();
                common::value_bits(&y)
            };
            assert!((n * 2) as u64 > 4 << 10);
            assert_eq!(on(engine()), on(&small), "{from:?} -> {to:?}");
        }
    }
}
