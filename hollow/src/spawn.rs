//! Forking a container's process into its cgroups, signalling it, and reaping exits: the part of
//! runc (`runc init` joins the cgroups before exec) and of the shim (waits for the process) that a
//! hollow container needs. The crate's only `unsafe` code is here. Kubelet counterpart: none.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::sys::signal::Signal;
use rustix::process::{Pid, WaitOptions, WaitStatus};

/// Starts `program args` with its standard streams on `/dev/null` and no environment. Between fork
/// and exec the child writes itself into each of `procs` (every hierarchy's `cgroup.procs` of its
/// container), so it execs inside its cgroups and the kernel charges its exec and exit there; and
/// it asks for SIGKILL when the runtime dies, so no container outlives the runtime that knew it.
/// Returns the pid; the caller reaps it through [`reap`].
///
/// The runtime serves from one thread, which forks every child: the death signal fires when the
/// forking thread exits, which here is when the process does.
pub fn spawn(program: &Path, args: &[OsString], procs: Vec<File>) -> io::Result<i32> {
    let runtime = rustix::process::getpid();
    let mut command = Command::new(program);
    command
        .args(args)
        // The container's program reads no environment; a copy per process is memory too.
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child of a possibly multithreaded process, where only
    // async-signal-safe work is allowed: it makes plain syscalls (write, prctl, getppid) on
    // descriptors opened before the fork, allocates nothing and takes no lock. An error converts
    // from a raw errno without allocating.
    unsafe {
        command.pre_exec(move || {
            for file in &procs {
                // "0" moves the writing process.
                rustix::io::write(file, b"0")?;
            }
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The runtime may have died before the death signal was asked for.
            if rustix::process::getppid() != Some(runtime) {
                return Err(io::Error::from(rustix::io::Errno::SRCH));
            }
            Ok(())
        });
    }
    let child = command.spawn()?;
    // Dropping a std `Child` neither waits for nor kills it; its exit is reaped by `reap`.
    i32::try_from(child.id()).map_err(io::Error::other)
}

/// Sends `signal` to `pid`; a process that is already gone is not an error.
pub fn kill(pid: i32, signal: Signal) -> io::Result<()> {
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// Every child that has exited since the last call, with its exit code.
pub fn reap() -> Vec<(i32, i32)> {
    let mut exits = Vec::new();
    loop {
        match rustix::process::waitpid(None, WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => {
                if let Some(code) = exit_code(status) {
                    exits.push((Pid::as_raw(Some(pid)), code));
                }
            }
            // No child left to wait for (ECHILD), or none has exited yet.
            Ok(None) | Err(_) => return exits,
        }
    }
}

/// The code containerd reports: the exit status, or 128 + the signal that killed the process
/// (`None` for a stop or continue). The integration tests check both kinds.
fn exit_code(status: WaitStatus) -> Option<i32> {
    status
        .exit_status()
        .or_else(|| status.terminating_signal().map(|signal| 128 + signal))
}
