//! Cross-entropy helpers shared by the loss and fused linear cross-entropy tests: the GPU
//! options of a reference configuration, the configuration as the GPU stores it, and the
//! check of the loss, z-loss and accuracy outputs.

use super::{assert_close, engine, stored, tensor_from_f64};
use wgrad::DType;
use wgrad::gradcheck::Tolerance;
use wgrad::loss::{CrossEntropyOptions, CrossEntropyOutput};
use wgrad::reference::loss::{CrossEntropyConfig, CrossEntropyResult};

/// The GPU options of `cfg` (class weights uploaded as F32; targets checked).
pub fn options_for(cfg: &CrossEntropyConfig) -> CrossEntropyOptions {
    CrossEntropyOptions {
        ignore_index: cfg.ignore_index,
        label_smoothing: cfg.label_smoothing as f32,
        z_loss: cfg.z_loss as f32,
        softcap: cfg.softcap.map(|c| c as f32),
        weight: cfg
            .weight
            .as_ref()
            .map(|w| tensor_from_f64(engine(), w, &[w.len()], DType::F32)),
        reduction: cfg.reduction,
        ..Default::default()
    }
}

/// The configuration's scalars and class weights as the GPU sees them (stored as f32).
pub fn as_stored(cfg: &CrossEntropyConfig) -> CrossEntropyConfig {
    CrossEntropyConfig {
        weight: cfg.weight.as_ref().map(|w| stored(w, DType::F32)),
        label_smoothing: cfg.label_smoothing as f32 as f64,
        z_loss: cfg.z_loss as f32 as f64,
        softcap: cfg.softcap.map(|c| c as f32 as f64),
        ..cfg.clone()
    }
}

/// Assert the loss, z-loss and accuracy of `out` against the reference within `tol`.
pub fn assert_ce_outputs(
    what: &str,
    out: &CrossEntropyOutput,
    want: &CrossEntropyResult,
    tol: Tolerance,
) {
    assert_close(
        &format!("{what} loss"),
        &out.loss.to_f64().unwrap(),
        &want.loss,
        tol,
    );
    assert_close(
        &format!("{what} z_loss"),
        &out.z_loss.to_f64().unwrap(),
        &want.z_loss,
        tol,
    );
    assert_close(
        &format!("{what} accuracy"),
        &out.accuracy.to_f64().unwrap(),
        &[want.accuracy],
        tol,
    );
}
