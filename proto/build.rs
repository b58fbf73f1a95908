//! Generates the CRI client and server code from `cri/api.proto`. The proto is parsed by `protox`
//! (pure Rust), so building needs no `protoc` on the machine.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    let proto = "cri/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["cri"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
