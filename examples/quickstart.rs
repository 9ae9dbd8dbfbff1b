//! Upload a tensor, run ops, read the results back.
use wgrad::{DType, Engine, Tensor, cast, reduce};

fn main() -> Result<(), wgrad::Error> {
    let engine = Engine::new()?;
    println!("engine: {}", engine.info());
    let x = Tensor::from_slice(&engine, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    println!("row sums    {:?}", reduce::sum_rows(&x)?.to_vec::<f32>()?);
    println!("row maxima  {:?}", reduce::max_rows(&x)?.to_vec::<f32>()?);
    println!(
        "column sums {:?}",
        reduce::sum_columns(&x)?.to_vec::<f32>()?
    );
    let h = cast::cast(&x, DType::BF16)?;
    println!("as bf16     {:?}", h.to_vec::<half::bf16>()?);
    println!("memory      {:?}", engine.memory());
    Ok(())
}
