//! Tensors: upload/readback round trips for every dtype at awkward lengths, dtype and length
//! errors, reshape (shared data, element-count check, lifetime), zeros, wrapping an app's
//! buffer, and `to_f64`.

mod common;

use common::{Rng, engine};
use wgrad::{DType, Element, Error, Tensor, reduce};

const LENGTHS: [usize; 7] = [0, 1, 2, 3, 7, 1023, 1025];

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(make: impl Fn(&mut Rng) -> T) {
    let e = engine();
    let mut rng = Rng::new(T::DTYPE.code().into());
    for len in LENGTHS {
        let data: Vec<T> = (0..len).map(|_| make(&mut rng)).collect();
        let t = Tensor::from_slice(e, &data, &[len]).unwrap();
        assert_eq!(t.dtype(), T::DTYPE);
        assert_eq!(t.shape(), &[len]);
        assert_eq!(t.len(), len);
        assert_eq!(t.is_empty(), len == 0);
        assert_eq!(
            t.byte_len() as usize,
            (len * T::DTYPE.size()).div_ceil(4) * 4
        );
        assert!(t.buffer().size() >= t.byte_len());
        let back = t.to_vec::<T>().unwrap();
        // Compare bits: NaN payloads and signed zeros must survive too.
        let first_bad =
            (0..len).find(|&i| bytemuck::bytes_of(&back[i]) != bytemuck::bytes_of(&data[i]));
        assert_eq!(
            first_bad,
            None,
            "{} length {len}: first differing element (got {:?}, want {:?})",
            T::DTYPE,
            first_bad.map(|i| back[i]),
            first_bad.map(|i| data[i]),
        );
        // The same data in a 2-D shape, when it has one.
        if len > 1 && len % 3 == 0 {
            let t2 = Tensor::from_slice(e, &data, &[3, len / 3]).unwrap();
            let back2 = t2.to_vec::<T>().unwrap();
            assert!(
                bytemuck::cast_slice::<T, u8>(&back2) == bytemuck::cast_slice::<T, u8>(&data),
                "{} shape [3, {}]: data changed on the round trip",
                T::DTYPE,
                len / 3
            );
        }
    }
}

#[test]
fn round_trip_f32() {
    // Any bit pattern, NaNs and infinities included.
    round_trip(|r| f32::from_bits(r.next_u32()));
}

#[test]
fn round_trip_f16() {
    round_trip(|r| half::f16::from_bits(r.next_u32() as u16));
}

#[test]
fn round_trip_bf16() {
    round_trip(|r| half::bf16::from_bits(r.next_u32() as u16));
}

#[test]
fn round_trip_i32() {
    round_trip(|r| r.next_u32() as i32);
}

#[test]
fn round_trip_u32() {
    round_trip(|r| r.next_u32());
}

#[test]
fn round_trip_scalar_and_multi_dim() {
    let e = engine();
    let s = Tensor::from_slice(e, &[42.5f32], &[]).unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![42.5]);
    let data: Vec<i32> = (0..24).map(|i| i * 7 - 50).collect();
    let t = Tensor::from_slice(e, &data, &[2, 3, 4]).unwrap();
    assert_eq!(t.shape(), &[2, 3, 4]);
    assert_eq!(t.to_vec::<i32>().unwrap(), data);
    let z = Tensor::from_slice::<u32>(e, &[], &[4, 0, 3]).unwrap();
    assert!(z.is_empty());
    assert_eq!(z.to_vec::<u32>().unwrap(), Vec::<u32>::new());
}

fn expect_dtype_error<T>(r: wgrad::Result<T>, want_got: DType) {
    match r {
        Err(Error::UnsupportedDType { got, accepted, .. }) => {
            assert_eq!(got, want_got);
            assert!(!accepted.contains(&got));
        }
        Err(other) => panic!("expected UnsupportedDType, got {other:?}"),
        Ok(_) => panic!("expected UnsupportedDType, got Ok"),
    }
}

#[test]
fn to_vec_with_the_wrong_element_type() {
    let e = engine();
    let f = Tensor::from_slice(e, &[1.0f32, 2.0], &[2]).unwrap();
    expect_dtype_error(f.to_vec::<u32>(), DType::F32);
    expect_dtype_error(f.to_vec::<i32>(), DType::F32);
    expect_dtype_error(f.to_vec::<half::f16>(), DType::F32);
    let h = Tensor::from_slice(e, &[half::f16::ONE; 3], &[3]).unwrap();
    expect_dtype_error(h.to_vec::<half::bf16>(), DType::F16);
    expect_dtype_error(h.to_vec::<f32>(), DType::F16);
    let b = Tensor::from_slice(e, &[half::bf16::ONE; 3], &[3]).unwrap();
    expect_dtype_error(b.to_vec::<half::f16>(), DType::BF16);
    let i = Tensor::from_slice(e, &[1i32, -1], &[2]).unwrap();
    expect_dtype_error(i.to_vec::<u32>(), DType::I32);
    expect_dtype_error(i.to_vec::<f32>(), DType::I32);
    let u = Tensor::from_slice(e, &[1u32], &[1]).unwrap();
    expect_dtype_error(u.to_vec::<i32>(), DType::U32);
    // Even with no elements.
    let empty = Tensor::from_slice::<f32>(e, &[], &[0]).unwrap();
    expect_dtype_error(empty.to_vec::<i32>(), DType::F32);
}

#[test]
fn from_slice_with_a_wrong_length() {
    let e = engine();
    let cases: [(&[usize], usize); 5] =
        [(&[4], 3), (&[2, 3], 5), (&[2, 3], 7), (&[0], 1), (&[], 0)];
    for (shape, n) in cases {
        let data = vec![1.0f32; n];
        match Tensor::from_slice(e, &data, shape) {
            Err(Error::LengthMismatch {
                shape: s,
                expected,
                got,
                ..
            }) => {
                assert_eq!(s, shape);
                assert_eq!(expected, shape.iter().product::<usize>());
                assert_eq!(got, n);
            }
            other => {
                panic!("shape {shape:?}, {n} elements: expected LengthMismatch, got {other:?}")
            }
        }
    }
    // Overflowing element counts are an error, not a panic.
    assert!(Tensor::from_slice::<f32>(e, &[], &[usize::MAX, 2]).is_err());
}

#[test]
fn reshape_shares_data_and_checks_the_count() {
    let e = engine();
    let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 1.0).collect();
    let t = Tensor::from_slice(e, &data, &[3, 4]).unwrap();
    let r = t.reshape(&[2, 6]).unwrap();
    assert_eq!(r.shape(), &[2, 6]);
    assert_eq!(r.dtype(), DType::F32);
    assert_eq!(r.to_vec::<f32>().unwrap(), data);
    // No copy: the same buffer.
    assert_eq!(r.buffer(), t.buffer());
    // The new shape is what ops see.
    let sums = reduce::sum_rows(&r).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(sums.len(), 2);
    assert_eq!(sums[0], data[..6].iter().sum::<f32>());
    assert_eq!(t.reshape(&[12]).unwrap().shape(), &[12]);
    assert_eq!(t.reshape(&[1, 12, 1]).unwrap().len(), 12);
    for bad in [&[5, 2][..], &[13], &[], &[0], &[3, 4, 2]] {
        match t.reshape(bad) {
            Err(Error::ShapeMismatch { expected, got, .. }) => {
                assert_eq!(expected, vec![3, 4]);
                assert_eq!(got, bad);
            }
            other => panic!("reshape to {bad:?}: expected ShapeMismatch, got {other:?}"),
        }
    }
    // The original is untouched by reshapes.
    assert_eq!(t.shape(), &[3, 4]);
}

#[test]
fn reshaped_tensor_outlives_the_original() {
    let e = engine();
    let data: Vec<f32> = (0..300).map(|i| (i as f32).sin()).collect();
    let t = Tensor::from_slice(e, &data, &[300]).unwrap();
    let r = t.reshape(&[10, 30]).unwrap();
    drop(t);
    e.synchronize().unwrap();
    // Buffers of the same size class, written with other data: if the shared buffer had gone
    // back to the pool, one of these would take it and overwrite it.
    let others: Vec<Tensor> = (0..4)
        .map(|k| Tensor::from_slice(e, &vec![k as f32 + 100.0; 300], &[300]).unwrap())
        .chain((0..4).map(|_| Tensor::zeros(e, &[300], DType::F32).unwrap()))
        .collect();
    for o in &others {
        assert_ne!(
            o.buffer(),
            r.buffer(),
            "a live tensor's buffer was handed out again"
        );
    }
    assert_eq!(r.to_vec::<f32>().unwrap(), data);
    let sums = reduce::sum_rows(&r).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(sums.len(), 10);
    drop(others);
    assert_eq!(r.to_vec::<f32>().unwrap(), data);
}

#[test]
fn zeros_of_every_dtype() {
    let e = engine();
    for len in LENGTHS {
        // Take pooled buffers that held data first, so zeros must really clear them.
        drop(Tensor::from_slice(e, &vec![u32::MAX; len.max(1)], &[len.max(1)]).unwrap());
        let f = Tensor::zeros(e, &[len], DType::F32).unwrap();
        assert_eq!(f.to_vec::<f32>().unwrap(), vec![0.0; len]);
        let h = Tensor::zeros(e, &[len], DType::F16).unwrap();
        assert_eq!(h.to_vec::<half::f16>().unwrap(), vec![half::f16::ZERO; len]);
        let b = Tensor::zeros(e, &[len], DType::BF16).unwrap();
        assert_eq!(
            b.to_vec::<half::bf16>().unwrap(),
            vec![half::bf16::ZERO; len]
        );
        let i = Tensor::zeros(e, &[len], DType::I32).unwrap();
        assert_eq!(i.to_vec::<i32>().unwrap(), vec![0; len]);
        let u = Tensor::zeros(e, &[len], DType::U32).unwrap();
        assert_eq!(u.to_vec::<u32>().unwrap(), vec![0; len]);
    }
    let z = Tensor::zeros(e, &[2, 0, 5], DType::F32).unwrap();
    assert!(z.is_empty());
    assert_eq!(z.shape(), &[2, 0, 5]);
}

fn app_buffer(usage: wgpu::BufferUsages, size: u64) -> wgpu::Buffer {
    engine().device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("app buffer"),
        size,
        usage,
        mapped_at_creation: false,
    })
}

#[test]
fn from_buffer_wraps_an_app_buffer() {
    let e = engine();
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let (rows, cols) = (3, 5);
    let data: Vec<f32> = (0..rows * cols).map(|i| i as f32 - 4.0).collect();
    let buffer = app_buffer(usage, 4 * data.len() as u64);
    e.queue()
        .write_buffer(&buffer, 0, bytemuck::cast_slice(&data));
    let t = Tensor::from_buffer(e, buffer.clone(), &[rows, cols], DType::F32).unwrap();
    assert_eq!(t.buffer(), &buffer);
    assert_eq!(t.to_vec::<f32>().unwrap(), data);
    // An op reads it.
    let sums = reduce::sum_rows(&t).unwrap().to_vec::<f32>().unwrap();
    let want: Vec<f32> = data.chunks(cols).map(|r| r.iter().sum()).collect();
    assert_eq!(sums, want);
    // A reshape of a wrapped buffer shares it too.
    let r = t.reshape(&[cols, rows]).unwrap();
    assert_eq!(r.buffer(), &buffer);
    assert_eq!(r.to_vec::<f32>().unwrap(), data);
    // Odd-length 16-bit data in a larger buffer: the tensor is its first bytes.
    let h: Vec<half::f16> = (0..7)
        .map(|i| half::f16::from_f32(i as f32 * 0.25))
        .collect();
    let hb = app_buffer(usage, 64);
    e.queue()
        .write_buffer(&hb, 0, bytemuck::cast_slice(&h[..6]));
    e.queue()
        .write_buffer(&hb, 12, bytemuck::cast_slice(&[h[6], half::f16::ZERO]));
    let ht = Tensor::from_buffer(e, hb, &[7], DType::F16).unwrap();
    assert_eq!(ht.to_vec::<half::f16>().unwrap(), h);
    let s = reduce::sum_rows(&ht).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(s, vec![h.iter().map(|x| x.to_f32()).sum::<f32>()]);
}

/// App buffers smaller than one element of a kernel's 16-byte view (a 4-byte F32 scalar, a
/// 4-byte BF16 pair) bind: the engine puts its stand-in there (nothing of them is reachable
/// through such a view), in both math modes (the relaxed one validates binding sizes against
/// the shader: the dense product's chunk views failed there before), and the operators give the
/// right values.
#[test]
fn tiny_app_buffers_bind_under_16_byte_views() {
    use wgrad::MathMode;
    use wgrad::matmul::{MatmulOptions, matmul};
    for mode in [MathMode::Strict, MathMode::Relaxed] {
        let e = &wgrad::Engine::builder().math_mode(mode).build().unwrap();
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        let app = |bytes: &[u8]| {
            let b = e.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("app"),
                size: bytes.len() as u64,
                usage,
                mapped_at_creation: false,
            });
            e.queue().write_buffer(&b, 0, bytes);
            b
        };
        let scalar = |v: f32| {
            Tensor::from_buffer(e, app(bytemuck::cast_slice(&[v])), &[1, 1], DType::F32).unwrap()
        };
        let (a, b) = (scalar(1.5), scalar(-2.0));
        let (y, _) = matmul(&a, &b, None, &MatmulOptions::default()).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![-3.0], "{mode:?}");
        assert_eq!(
            reduce::sum_rows(&a).unwrap().to_vec::<f32>().unwrap(),
            vec![1.5]
        );
        let (s, _) = wgrad::loss::softmax(&a).unwrap();
        assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0], "{mode:?}");
        let h = [half::bf16::from_f32(1.0), half::bf16::from_f32(-3.0)];
        let x =
            Tensor::from_buffer(e, app(bytemuck::cast_slice(&h)), &[1, 2], DType::BF16).unwrap();
        let w =
            Tensor::from_buffer(e, app(bytemuck::cast_slice(&h)), &[2, 1], DType::BF16).unwrap();
        let (y, _) = matmul(&x, &w, None, &MatmulOptions::default()).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![10.0], "{mode:?}");
        assert_eq!(
            reduce::sum_rows(&x).unwrap().to_vec::<f32>().unwrap(),
            vec![-2.0]
        );
    }
}

#[test]
fn from_buffer_checks_usage_and_size() {
    let e = engine();
    let full =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    for usage in [
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    ] {
        match Tensor::from_buffer(e, app_buffer(usage, 64), &[4], DType::F32) {
            Err(Error::InvalidValue { .. }) => {}
            other => panic!("usage {usage:?}: expected InvalidValue, got {other:?}"),
        }
    }
    // Too small: 10 f32 need 40 bytes.
    match Tensor::from_buffer(e, app_buffer(full, 36), &[10], DType::F32) {
        Err(Error::OutOfBounds { got, min, .. }) => {
            assert_eq!(got, 36);
            assert_eq!(min, 40);
        }
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
    // 16-bit data is padded to a whole word: 3 f16 need 8 bytes.
    match Tensor::from_buffer(e, app_buffer(full, 4), &[3], DType::F16) {
        Err(Error::OutOfBounds { got, min, .. }) => assert_eq!((got, min), (4, 8)),
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
    assert!(Tensor::from_buffer(e, app_buffer(full, 8), &[3], DType::BF16).is_ok());
    assert!(Tensor::from_buffer(e, app_buffer(full, 40), &[10], DType::F32).is_ok());
    assert!(Tensor::from_buffer(e, app_buffer(full, 40), &[2, 5], DType::I32).is_ok());
}

#[test]
fn to_f64_widens_exactly() {
    let e = engine();
    let mut rng = Rng::new(77);
    let f: Vec<f32> = (0..33)
        .map(|_| rng.uniform(-1e6, 1e6) as f32)
        .chain([0.0, -0.0, f32::MIN_POSITIVE, 1e-45, f32::MAX, f32::INFINITY])
        .collect();
    let t = Tensor::from_slice(e, &f, &[f.len()]).unwrap();
    let back = t.to_f64().unwrap();
    let want: Vec<f64> = f.iter().map(|&x| f64::from(x)).collect();
    assert_eq!(back, want);
    let h: Vec<half::f16> = (0..=0x7c00u16)
        .step_by(97)
        .map(half::f16::from_bits)
        .collect();
    let th = Tensor::from_slice(e, &h, &[h.len()]).unwrap();
    let want: Vec<f64> = h.iter().map(|x| x.to_f64()).collect();
    assert_eq!(th.to_f64().unwrap(), want);
    let b: Vec<half::bf16> = (0..=0xff80u16)
        .step_by(331)
        .map(half::bf16::from_bits)
        .collect();
    let tb = Tensor::from_slice(e, &b, &[b.len()]).unwrap();
    let want: Vec<f64> = b.iter().map(|x| x.to_f64()).collect();
    let got = tb.to_f64().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!(g == w || (g.is_nan() && w.is_nan()), "{g} vs {w}");
    }
    // Integer tensors have no f64 view.
    let i = Tensor::from_slice(e, &[1i32, 2], &[2]).unwrap();
    expect_dtype_error(i.to_f64(), DType::I32);
    let u = Tensor::from_slice(e, &[1u32, 2], &[2]).unwrap();
    expect_dtype_error(u.to_f64(), DType::U32);
}
