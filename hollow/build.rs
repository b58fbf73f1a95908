//! Generates the hollow runtime's CRI server (and, for its tests, client) from the agent's CRI
//! subset (`../proto/cri/api.proto`, shared so the messages stay one definition) plus
//! `proto/hollow.proto`, which adds what the upstream kubelet calls beyond that subset. A proto
//! file cannot add methods to a service another file declares, so the extension declares its own
//! services and their methods are moved here into `RuntimeService` and `ImageService` before
//! generating: the server then answers on upstream's method paths.

use std::error::Error;

use prost_types::FileDescriptorSet;

const CRI_DIR: &str = "../proto/cri";
const CRI_PROTO: &str = "../proto/cri/api.proto";
const EXTENSION_PROTO: &str = "proto/hollow.proto";

/// Extension service → the upstream service that gets its methods.
const MERGES: [(&str, &str); 1] = [("HollowRuntimeServiceExtension", "RuntimeService")];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={CRI_PROTO}");
    println!("cargo:rerun-if-changed={EXTENSION_PROTO}");
    let mut descriptors = protox::compile([EXTENSION_PROTO], [CRI_DIR, "proto"])?;
    merge_services(&mut descriptors)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Exec, Attach, PortForward and the RPCs the hollow runtime does not implement answer
        // UNIMPLEMENTED.
        .generate_default_stubs(true)
        .compile_fds(descriptors)?;
    Ok(())
}

fn merge_services(descriptors: &mut FileDescriptorSet) -> Result<(), Box<dyn Error>> {
    // Source locations (doc comments) are indexed by position, which moving methods breaks; the
    // generated code goes without the protos' comments instead.
    for file in &mut descriptors.file {
        file.source_code_info = None;
    }
    for (extension, target) in MERGES {
        let mut methods = None;
        for file in &mut descriptors.file {
            if let Some(index) = file.service.iter().position(|s| s.name() == extension) {
                methods = Some(file.service.remove(index).method);
            }
        }
        let methods =
            methods.ok_or_else(|| format!("{EXTENSION_PROTO} declares no {extension}"))?;
        let service = descriptors
            .file
            .iter_mut()
            .flat_map(|file| file.service.iter_mut())
            .find(|s| s.name() == target)
            .ok_or_else(|| format!("{CRI_PROTO} declares no {target}"))?;
        service.method.extend(methods);
    }
    Ok(())
}
