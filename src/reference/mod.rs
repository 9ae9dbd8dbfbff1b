//! f64 CPU references: the executable contract of every operator, written to be read.
//! Forward and analytic backward of each family, used by the tests, the `check` example and
//! the benches, and public so users can reuse them.

pub mod activation;
pub mod attention;
pub mod attn_res;
pub mod dual_chunk;
pub mod embedding;
pub mod expr;
pub mod fused_linear;
pub mod gated_delta;
pub mod grpo;
pub mod loss;
pub mod matmul;
pub mod mhc;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod mta;
pub mod norm;
pub mod optim;
pub mod preference;
pub mod reduce;
pub mod rope;
pub mod vocab_parallel;
