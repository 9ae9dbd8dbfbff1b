//! Temporary naive product with the matmul family's `gemm` interface (removed once it lands).
#![allow(missing_docs, dead_code)]
use crate::kernel::{COMMON_DTYPE, COMMON_LAUNCH, Kernel};
use crate::{Result, Tensor};

pub static KERNEL: Kernel = Kernel {
    name: "gemm_stub",
    parts: &[
        COMMON_DTYPE,
        COMMON_LAUNCH,
        include_str!("../wgsl/gemm_stub.wgsl"),
    ],
};

pub struct GemmOperand<'a> {
    pub tensor: &'a Tensor,
    pub offset: usize,
    pub transposed: bool,
    pub batch_stride: usize,
}
pub struct Gemm<'a> {
    pub a: GemmOperand<'a>,
    pub b: GemmOperand<'a>,
    pub out: &'a Tensor,
    pub out_offset: usize,
    pub out_batch_stride: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub bias: Option<&'a Tensor>,
    pub accumulate: bool,
    pub activation: Option<crate::activation::Activation>,
    pub pre_activation: Option<&'a Tensor>,
    pub alpha: f32,
}

#[derive(encase::ShaderType)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    a_off: u32,
    b_off: u32,
    o_off: u32,
    alpha: f32,
}

pub fn gemm(c: &Gemm) -> Result<()> {
    let engine = c.out.engine();
    let mut flags = 0;
    if c.a.transposed {
        flags |= 1;
    }
    if c.b.transposed {
        flags |= 2;
    }
    if c.bias.is_some() {
        flags |= 4;
    }
    if c.accumulate {
        flags |= 8;
    }
    let bias = c.bias.unwrap_or(c.a.tensor);
    engine.launch(
        &KERNEL,
        "gemm",
        &vec![
            ("AT", f64::from(c.a.tensor.dtype().code())),
            ("BT", f64::from(c.b.tensor.dtype().code())),
            ("CT", f64::from(bias.dtype().code())),
        ],
        &Params {
            m: c.m as u32,
            n: c.n as u32,
            k: c.k as u32,
            flags,
            a_off: c.a.offset as u32,
            b_off: c.b.offset as u32,
            o_off: c.out_offset as u32,
            alpha: c.alpha,
        },
        &[
            c.a.tensor.buffer(),
            c.b.tensor.buffer(),
            bias.buffer(),
            c.out.buffer(),
        ],
        ((c.m * c.n) as u64).div_ceil(256),
    )
}
