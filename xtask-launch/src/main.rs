//! What `cargo xtask` runs first (the alias in `.cargo/config.toml`). The xtask links the agent's
//! library, whose eBPF programs are compiled with clang against libbpf's headers, so on a fresh
//! Debian machine the xtask could not even be built to install them. This launcher has no
//! dependencies: it installs the Debian packages that building needs when they are missing (as
//! root, with apt-get), then replaces itself with `cargo run --package xtask` and the same
//! arguments. That run is not `--quiet`: the first one builds the agent's library for minutes, and
//! cargo's progress is what shows it is working.

use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode};

/// The Debian packages building the workspace needs beyond what linking this launcher already
/// needed (a C compiler and the C library's files): clang and the libbpf headers for the eBPF
/// programs (`ebpf/build.rs`).
const BUILD_PACKAGES: &[&str] = &["clang", "libbpf-dev"];

fn main() -> ExitCode {
    let missing: Vec<&str> = BUILD_PACKAGES
        .iter()
        .copied()
        .filter(|package| !installed(package))
        .collect();
    if !missing.is_empty()
        && let Err(message) = install(&missing)
    {
        eprintln!("cargo xtask: {message}");
        return ExitCode::FAILURE;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let error = Command::new(&cargo)
        .args(["run", "--package", "xtask", "--"])
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "cargo xtask: cannot run {}: {error}",
        cargo.to_string_lossy()
    );
    ExitCode::FAILURE
}

/// Whether dpkg has `package` installed. Without dpkg (not Debian) this cannot be told, and the
/// build itself names what is missing.
fn installed(package: &str) -> bool {
    match Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
    {
        Ok(output) => String::from_utf8_lossy(&output.stdout).contains("install ok installed"),
        Err(_) => true,
    }
}

/// Installs `packages` with apt-get (which needs root; its own message says so otherwise).
fn install(packages: &[&str]) -> Result<(), String> {
    let list = packages.join(" ");
    eprintln!("cargo xtask: installing the Debian packages building ringlet needs: {list}");
    let apt = |args: &[&str]| {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("cannot run apt-get ({e}); install {list} by hand"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "apt-get {} failed ({status}); building ringlet needs {list} \
                 (apt-get install {list}, as root)",
                args.join(" ")
            ))
        }
    };
    apt(&["update"])?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend_from_slice(packages);
    apt(&install)
}
