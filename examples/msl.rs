//! Print the strict MSL of a kernel entry point: `cargo run --example msl -- reduce row_sum`.
fn main() -> Result<(), wgrad::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kernels = wgrad::kernel::registry();
    if args.len() < 2 {
        for k in kernels {
            println!("{}: {:?}", k.name, k.entry_points()?);
        }
        return Ok(());
    }
    let kernel = kernels
        .iter()
        .find(|k| k.name == args[0])
        .ok_or_else(|| wgrad::Error::NoAdapter(format!("no kernel named {}", args[0])))?;
    let msl = wgrad::msl::strict_msl(kernel, &args[1], &vec![])?;
    println!("{}", msl.source);
    Ok(())
}
