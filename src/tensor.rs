//! Tensors: a shared GPU buffer, a shape, a dtype and the engine they live on.
//!
//! Tensors are immutable through the public API: every op writes fresh outputs, so a forward's
//! saved context (which holds tensor handles) cannot be changed before its backward. The one
//! deliberate exception is an optimizer step ([`crate::optim`]), which updates the parameter
//! tensors it was given in place. Cloning a tensor clones the handle, not the data.

use crate::engine::{Bind, Engine, PooledBuffer};
use crate::{DType, Element, Error, Result};
use std::sync::Arc;

enum Storage {
    Pooled(Arc<PooledBuffer>),
    External(wgpu::Buffer),
}

struct TensorInner {
    engine: Engine,
    storage: Storage,
    shape: Vec<usize>,
    dtype: DType,
}

/// A dense, row-major tensor on an engine's device.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?})", self.inner.dtype, self.inner.shape)
    }
}

fn element_count(what: &str, shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d).ok_or_else(|| {
            Error::bounds(
                format!("{what}: element count"),
                u64::MAX,
                0,
                usize::MAX as u64,
            )
        })
    })
}

impl Tensor {
    /// An uninitialized tensor (for op outputs that the kernel writes entirely).
    pub(crate) fn empty(
        engine: &Engine,
        shape: &[usize],
        dtype: DType,
        what: &str,
    ) -> Result<Tensor> {
        let len = element_count(what, shape)?;
        let bytes = dtype.buffer_bytes(len) as u64;
        let buffer = engine.alloc(bytes, what)?;
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                engine: engine.clone(),
                storage: Storage::Pooled(Arc::new(buffer)),
                shape: shape.to_vec(),
                dtype,
            }),
        })
    }

    /// A tensor of zeros.
    pub fn zeros(engine: &Engine, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let t = Tensor::empty(engine, shape, dtype, "zeros")?;
        engine.zero(t.buffer(), t.byte_len());
        Ok(t)
    }

    /// Upload host data with a shape; `data.len()` must equal the product of the shape.
    pub fn from_slice<T: Element>(engine: &Engine, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let len = element_count("from_slice", shape)?;
        if len != data.len() {
            return Err(Error::LengthMismatch {
                what: "from_slice".into(),
                shape: shape.to_vec(),
                expected: len,
                got: data.len(),
            });
        }
        let t = Tensor::empty(engine, shape, T::DTYPE, "from_slice")?;
        engine.upload(t.buffer(), bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// Wrap an app's buffer. It needs `STORAGE`, `COPY_SRC` and `COPY_DST` usage and at least
    /// the tensor's bytes (padded to a 4-byte word); it must belong to the engine's device, and
    /// the app must not write it while wgrad ops that read it are pending.
    pub fn from_buffer(
        engine: &Engine,
        buffer: wgpu::Buffer,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        let len = element_count("from_buffer", shape)?;
        let needed = dtype.buffer_bytes(len) as u64;
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        if !buffer.usage().contains(usage) {
            return Err(Error::InvalidValue {
                what: "from_buffer: buffer usage".into(),
                got: f64::from(buffer.usage().bits()),
                rule: format!(
                    "must contain STORAGE | COPY_SRC | COPY_DST, has {:?}",
                    buffer.usage()
                ),
            });
        }
        if buffer.size() < needed {
            return Err(Error::bounds(
                "from_buffer: buffer bytes",
                buffer.size(),
                needed,
                u64::MAX,
            ));
        }
        if needed > engine.max_tensor_bytes() {
            return Err(Error::LimitExceeded {
                what: "from_buffer".into(),
                bytes: needed,
                limit: engine.max_tensor_bytes(),
                limit_name: "max_buffer_size",
            });
        }
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                engine: engine.clone(),
                storage: Storage::External(buffer),
                shape: shape.to_vec(),
                dtype,
            }),
        })
    }

    /// The underlying buffer (may be larger than the tensor; the tensor is its first
    /// [`Tensor::byte_len`] bytes).
    pub fn buffer(&self) -> &wgpu::Buffer {
        match &self.inner.storage {
            Storage::Pooled(p) => p.buffer.as_ref().expect("live pooled buffer"),
            Storage::External(b) => b,
        }
    }

    /// The engine the tensor lives on.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Shape (row-major).
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// Storage dtype.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.inner.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the tensor's data, padded to a 4-byte word.
    pub fn byte_len(&self) -> u64 {
        self.inner.dtype.buffer_bytes(self.len()) as u64
    }

    /// The binding of rows `rows` of the tensor viewed as rows of `cols` elements (the last
    /// row may be partial): the whole buffer when they are all of it, else their bytes
    /// (rounded up to a 4-byte word, within [`Tensor::byte_len`]), for a launch over a window
    /// ([`row_windows`] gives windows that start where a binding may).
    pub(crate) fn bind_rows(&self, rows: &std::ops::Range<usize>, cols: usize) -> Bind<'_> {
        let row_bytes = (cols * self.dtype().size()) as u64;
        let offset = rows.start as u64 * row_bytes;
        let size = (rows.len() as u64 * row_bytes).div_ceil(4) * 4;
        if offset == 0 && size >= self.byte_len() {
            return Bind::whole(self.buffer());
        }
        Bind {
            buffer: self.buffer(),
            offset,
            size: size.min(self.byte_len() - offset),
        }
    }

    /// Copy the data back to the host (submits pending work and waits). `T` must be the
    /// tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::dtype("to_vec", self.dtype(), &[T::DTYPE]));
        }
        let bytes = self
            .engine()
            .read_bytes(self.buffer(), 0, self.byte_len())?;
        let len = self.len();
        let mut out = vec![T::zeroed(); len];
        bytemuck::cast_slice_mut::<T, u8>(&mut out)
            .copy_from_slice(&bytes[..len * T::DTYPE.size()]);
        Ok(out)
    }

    /// Copy a floating tensor back as f64 (exact widening of any float dtype), for comparisons.
    pub fn to_f64(&self) -> Result<Vec<f64>> {
        Ok(match self.dtype() {
            DType::F32 => self.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
            DType::F16 => self
                .to_vec::<half::f16>()?
                .into_iter()
                .map(f64::from)
                .collect(),
            DType::BF16 => self
                .to_vec::<half::bf16>()?
                .into_iter()
                .map(f64::from)
                .collect(),
            other => return Err(Error::dtype("to_f64", other, &DType::FLOATS)),
        })
    }

    /// The same data with another shape of the same element count (no copy).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let len = element_count("reshape", shape)?;
        if len != self.len() {
            return Err(Error::shape("reshape", self.shape(), shape));
        }
        let storage = match &self.inner.storage {
            Storage::External(b) => Storage::External(b.clone()),
            Storage::Pooled(p) => Storage::Pooled(p.clone()),
        };
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                engine: self.inner.engine.clone(),
                storage,
                shape: shape.to_vec(),
                dtype: self.dtype(),
            }),
        })
    }

    /// A fresh F32 tensor of shape `shape` holding elements `start..start + n` of this F32
    /// tensor (`n` the shape's element count; a GPU copy, recorded).
    pub(crate) fn f32_range(&self, start: usize, shape: &[usize], what: &str) -> Result<Tensor> {
        let engine = self.engine();
        let out = Tensor::empty(engine, shape, DType::F32, what)?;
        let bytes = 4 * out.len() as u64;
        if bytes > 0 {
            engine.record(|enc| {
                enc.copy_buffer_to_buffer(self.buffer(), 4 * start as u64, out.buffer(), 0, bytes)
            });
        }
        Ok(out)
    }

    /// Check that this tensor lives on `engine`.
    pub(crate) fn check_engine(&self, engine: &Engine, what: &str) -> Result<()> {
        if self.engine().same(engine) {
            Ok(())
        } else {
            Err(Error::EngineMismatch { what: what.into() })
        }
    }

    /// A scalar loss cotangent: `d_loss` checked to be F32 `[1]` on `engine`, or a fresh 1.
    pub(crate) fn scalar_cotangent(
        engine: &Engine,
        d_loss: Option<&Tensor>,
        what: &str,
    ) -> Result<Tensor> {
        let Some(t) = d_loss else {
            return Tensor::from_slice(engine, &[1.0f32], &[1]);
        };
        t.check(engine, what, &[1], &[DType::F32])?;
        Ok(t.clone())
    }

    /// Check that this tensor lives on `engine`, has one of `dtypes` and exactly `shape`.
    pub(crate) fn check(
        &self,
        engine: &Engine,
        what: &str,
        shape: &[usize],
        dtypes: &[DType],
    ) -> Result<()> {
        self.check_engine(engine, what)?;
        if !dtypes.contains(&self.dtype()) {
            return Err(Error::dtype(what, self.dtype(), dtypes));
        }
        if self.shape() != shape {
            return Err(Error::shape(what, shape, self.shape()));
        }
        Ok(())
    }
}

/// Windows of rows for a row-wise launch over tensors that may exceed one storage binding:
/// `row_bytes` holds the bytes of one row of each tensor the launch windows (the others it
/// binds whole). One window of every row when each tensor fits a binding; otherwise the
/// largest windows whose rows of every tensor fit one binding and start at a multiple of the
/// binding alignment (`Engine::binding_alignment`), in row order. `LimitExceeded` when even
/// the fewest rows a window can start on do not fit.
pub(crate) fn row_windows(
    engine: &Engine,
    what: &str,
    rows: usize,
    row_bytes: &[u64],
) -> Result<Vec<std::ops::Range<usize>>> {
    let limit = engine.max_binding_bytes();
    let widest = row_bytes.iter().copied().max().unwrap_or(0);
    if rows == 0 || (rows as u64 * widest).div_ceil(4) * 4 <= limit {
        return Ok(std::iter::once(0..rows).collect());
    }
    let align = engine.binding_alignment();
    // Rows between window starts: each tensor's start must be a multiple of `align` bytes.
    let step = row_bytes
        .iter()
        .map(|&b| align / gcd(b, align))
        .max()
        .unwrap_or(1);
    let window = (limit / widest) / step * step;
    if window == 0 {
        return Err(Error::LimitExceeded {
            what: format!("{what}: a window of {step} rows"),
            bytes: step * widest,
            limit,
            limit_name: "max_storage_buffer_binding_size",
        });
    }
    let window = window as usize;
    Ok((0..rows)
        .step_by(window)
        .map(|r0| r0..(r0 + window).min(rows))
        .collect())
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_windows_fit_the_binding_and_start_aligned() {
        let limit = 64 << 10;
        let e = Engine::builder().binding_limit(limit).build().unwrap();
        let align = e.binding_alignment();
        // Everything fits: one window, also for no rows.
        assert_eq!(row_windows(&e, "t", 10, &[400, 800]).unwrap(), vec![0..10]);
        assert_eq!(row_windows(&e, "t", 0, &[1 << 20]).unwrap(), vec![0..0]);
        for (rows, row_bytes) in [
            (1000, vec![4000u64]),
            (3001, vec![14, 28, 8]),
            (777, vec![2048, 4096]),
            (50_000, vec![6, 2]),
        ] {
            let w = row_windows(&e, "t", rows, &row_bytes).unwrap();
            assert!(w.len() > 1, "{rows} rows of {row_bytes:?}");
            // In order, covering every row once.
            assert_eq!(w.first().unwrap().start, 0);
            assert_eq!(w.last().unwrap().end, rows);
            assert!(w.windows(2).all(|p| p[0].end == p[1].start));
            for r in &w {
                for &b in &row_bytes {
                    assert_eq!(r.start as u64 * b % align, 0, "{r:?} of {b}-byte rows");
                    assert!((r.len() as u64 * b).div_ceil(4) * 4 <= limit);
                }
            }
            // The largest such windows: one more step of rows would not fit.
            let step = row_bytes
                .iter()
                .map(|&b| align / gcd(b, align))
                .max()
                .unwrap();
            let widest = row_bytes.iter().copied().max().unwrap();
            assert!((w[0].len() as u64 + step) * widest > limit);
        }
        // A row too wide for the fewest rows a window can start on.
        match row_windows(&e, "t", 4, &[limit + 4]) {
            Err(Error::LimitExceeded {
                bytes, limit: l, ..
            }) => {
                assert_eq!(l, limit);
                assert!(bytes > limit);
            }
            other => panic!("expected LimitExceeded, got {other:?}"),
        }
    }
}
