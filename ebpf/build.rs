//! Compiles every `src/*.bpf.c` with clang (`-target bpf -O2 -g`: BTF and CO-RE relocations are
//! what let one object run on every kernel with BTF) into `$OUT_DIR/<name>.bpf.o`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's libbpf-dev puts `bpf/bpf_helpers.h`.
const LIBBPF_HEADER: &str = "/usr/include/bpf/bpf_helpers.h";

fn main() {
    if let Err(message) = run() {
        // A build script reports failure by exiting non-zero; the message is what cargo shows.
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let src = manifest_dir.join("src");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    println!("cargo:rerun-if-env-changed=CLANG");

    let include = env::var("LIBBPF_INCLUDE").unwrap_or_else(|_| "/usr/include".to_owned());
    println!("cargo:rerun-if-env-changed=LIBBPF_INCLUDE");
    let helpers = Path::new(&include).join("bpf/bpf_helpers.h");
    if !helpers.exists() {
        return Err(format!(
            "the libbpf headers are missing ({} not found; expected {LIBBPF_HEADER}): install the \
             Debian packages `clang libbpf-dev`, or point LIBBPF_INCLUDE at their include directory",
            helpers.display()
        ));
    }

    let mut sources = Vec::new();
    for entry in fs::read_dir(&src).map_err(|e| format!("reading {}: {e}", src.display()))? {
        let path = entry
            .map_err(|e| format!("reading {}: {e}", src.display()))?
            .path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(".bpf.c") {
            sources.push(path);
        } else if path.extension().is_some_and(|e| e == "h") {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    sources.sort();

    for source in sources {
        println!("cargo:rerun-if-changed={}", source.display());
        let stem = source
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".c"))
            .ok_or_else(|| format!("odd source name {}", source.display()))?;
        let object = out_dir.join(format!("{stem}.o"));
        let output = Command::new(&clang)
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .arg(format!("-I{}", src.display()))
            .arg(format!("-I{include}"))
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .output()
            .map_err(|e| {
                format!(
                    "running `{clang}` to compile {}: {e}; install the Debian packages \
                     `clang libbpf-dev` (or set CLANG to a clang that targets bpf)",
                    source.display()
                )
            })?;
        if !output.status.success() {
            return Err(format!(
                "clang failed to compile {}:\n{}",
                source.display(),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    Ok(())
}
