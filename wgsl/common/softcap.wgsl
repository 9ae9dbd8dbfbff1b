// Logit softcapping shared by the cross-entropy kernels (loss family) and the entropy kernels
// of the fused linear family, so that both see the same capped logits.
//
// tanh to a few ulps whatever the driver's tanh does near 0 (some compute it as
// (e^2u − 1)/(e^2u + 1), which loses relative precision for small u): a series below 1/8,
// else from exp(−2|u|) (no overflow).
fn tanh_accurate(u: f32) -> f32 {
    let a = abs(u);
    if (a < 0.125) {
        let u2 = u * u;
        return u * (1.0 + u2 * (-1.0 / 3.0 + u2 * (2.0 / 15.0 + u2 * (-17.0 / 315.0))));
    }
    let e = exp(-2.0 * a);
    return sign(u) * ((1.0 - e) / (1.0 + e));
}
