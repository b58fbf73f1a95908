//! Running external programs with errors that name the command that failed, and checking that we
//! run as root.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Runs `cmd` with inherited output and fails unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs `cmd`, fails unless it exits 0, and returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{cmd:?} printed non-UTF-8 output"))
}

/// Whether `cmd` runs and exits 0, with its output discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fails unless we run as root; `what` names what needs it ("the lab").
pub fn ensure_root(what: &str) -> Result<()> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!("{what} needs root, running as uid {euid}");
    }
    Ok(())
}
