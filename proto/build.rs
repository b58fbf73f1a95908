//! Generates Rust from the protos: the CRI client and server code from `cri/api.proto`,
//! ringlet's own event API from `ringlet/events/v1/events.proto`, and the gRPC health protocol
//! (`grpc/health/v1/health.proto`) the gRPC prober calls. The protos are parsed by `protox`
//! (pure Rust), so building needs no `protoc` on the machine.

use std::error::Error;

/// Each proto with the include directory its imports are resolved against.
const PROTOS: [(&str, &str); 3] = [
    ("cri/api.proto", "cri"),
    ("ringlet/events/v1/events.proto", "."),
    ("grpc/health/v1/health.proto", "."),
];

fn main() -> Result<(), Box<dyn Error>> {
    for (proto, include) in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
        let descriptors = protox::compile([proto], [include])?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            // CRI test doubles implement only the RPCs they exercise; the rest answer UNIMPLEMENTED,
            // so adding a CRI RPC does not break every fake runtime. (Not for the event API: stubs
            // would change its streaming method's signature.)
            // The same for health servers in tests, which serve `Check` only.
            .generate_default_stubs(!proto.starts_with("ringlet/"))
            .compile_fds(descriptors)?;
    }
    Ok(())
}
