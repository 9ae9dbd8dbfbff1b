//! A lost device is replaced by the next build. Its own test binary: destroying the device that
//! every engine of the adapter shares would fail the engine tests running beside it.

use wgrad::{Engine, Error, Tensor, reduce};

fn row_sum(e: &Engine) -> wgrad::Result<Vec<f32>> {
    let x = Tensor::from_slice(e, &[1.0f32, 2.0, 4.0], &[1, 3])?;
    reduce::sum_rows(&x)?.to_vec::<f32>()
}

#[test]
fn a_lost_device_is_replaced_by_the_next_build() {
    let a = Engine::new().unwrap();
    assert_eq!(row_sum(&a).unwrap(), vec![7.0]);
    let x = Tensor::from_slice(&a, &[1.0f32; 8], &[2, 4]).unwrap();
    a.device().destroy();
    // The engines of the lost device report it, from an upload, a launch or a readback; none
    // panics.
    match row_sum(&a) {
        Err(Error::Device(_)) => {}
        other => panic!("expected Error::Device from a lost device, got {other:?}"),
    }
    match reduce::sum_rows(&x).and_then(|y| y.to_vec::<f32>()) {
        Err(Error::Device(_)) => {}
        other => panic!("expected Error::Device from a lost device, got {other:?}"),
    }
    match x.to_vec::<f32>() {
        Err(Error::Device(_)) => {}
        other => panic!("expected Error::Device from a lost device, got {other:?}"),
    }
    let b = Engine::new().unwrap();
    assert!(
        b.device() != a.device(),
        "the next build makes a new device"
    );
    assert_eq!(row_sum(&b).unwrap(), vec![7.0]);
    let c = Engine::builder().build().unwrap();
    assert!(c.device() == b.device(), "and shares it again");
}
