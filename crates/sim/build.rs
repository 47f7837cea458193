//! Declares `tokio_unstable`, which the simulator uses when built with it (tokio's seeded
//! scheduler randomness, `Builder::rng_seed`).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(tokio_unstable)");
}
