//! Tensors: a shared GPU buffer, a shape, a dtype and the engine they live on.
//!
//! Tensors are immutable through the public API: every op writes fresh outputs, so a forward's
//! saved context (which holds tensor handles) cannot be changed before its backward. The one
//! deliberate exception is an optimizer step ([`crate::optim`]), which updates the parameter
//! tensors it was given in place. Cloning a tensor clones the handle, not the data.

use crate::engine::{Engine, PooledBuffer};
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
        engine.upload(t.buffer(), bytemuck::cast_slice(data));
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
        if needed > engine.max_binding_bytes() {
            return Err(Error::LimitExceeded {
                what: "from_buffer".into(),
                bytes: needed,
                limit: engine.max_binding_bytes(),
                limit_name: "max_storage_buffer_binding_size",
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
