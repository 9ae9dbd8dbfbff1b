//! # wgrad
//!
//! GPU training kernels for wgpu: every operator is a forward/backward pair of WGSL compute
//! shaders. Metal (through wgrad's strict MSL) is the primary target, Vulkan (NVIDIA, AMD,
//! Mesa's lavapipe on a CPU) the second. Reductions are fixed-order and atomic-free, so two
//! runs give identical bits; every bad input is a typed [`Error`].
//!
//! ```no_run
//! use wgrad::{Engine, Tensor, DType};
//! let engine = Engine::new()?;
//! let x = Tensor::from_slice(&engine, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let sums = wgrad::reduce::sum_rows(&x)?;
//! assert_eq!(sums.to_vec::<f32>()?, vec![3.0, 7.0]);
//! let h = wgrad::cast::cast(&x, DType::BF16)?;
//! assert_eq!(h.to_f64()?, vec![1.0, 2.0, 3.0, 4.0]);
//! # Ok::<(), wgrad::Error>(())
//! ```

pub mod activation;
pub mod attention;
pub mod attn_res;
pub mod bench;
pub mod cast;
pub mod check;
pub mod dtype;
pub mod dual_chunk;
pub mod embedding;
pub mod engine;
pub mod error;
pub mod expr;
pub mod fused_linear;
pub mod gated_delta;
pub mod gradcheck;
pub mod graph;
pub mod grpo;
pub mod kernel;
pub mod loss;
pub mod matmul;
pub mod mhc;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod msl;
pub mod mta;
pub mod norm;
pub mod optim;
pub mod preference;
pub mod reduce;
pub mod reference;
pub mod rope;
pub mod spirv;
pub mod tensor;
pub mod vocab_parallel;

pub use dtype::{DType, Element};
pub use engine::{
    BuiltSpirv, Engine, EngineBuilder, EngineInfo, KernelTime, MathMode, MemoryStats, ShaderChecks,
    Timing, TimingSource,
};
pub use error::{Error, Result};
pub use tensor::Tensor;
