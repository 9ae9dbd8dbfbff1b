//! Measurement harness shared by the `bench` example and the criterion benches.

use crate::kernel::{COMMON_LAUNCH, Kernel};

/// `wgsl/copy.wgsl`: the copy kernel whose bandwidth is the yardstick.
pub static COPY_KERNEL: Kernel = Kernel {
    name: "copy",
    parts: &[COMMON_LAUNCH, include_str!("../wgsl/copy.wgsl")],
};
