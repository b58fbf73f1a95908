//! Daemons the xtask starts and leaves running (the lab's containerd, the control plane's etcd and
//! kube-apiserver): detached from our session with `setsid`, with a log and a pid file in their
//! owner's state directory, found again through the pid file, and stopped with SIGTERM (SIGKILL
//! when that is ignored). Shared by the xtask and the fault tests, which stop a daemon and start it
//! again with the command line it ran with.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How many log lines an error about a daemon that did not come up quotes.
const LOG_TAIL_LINES: usize = 30;
/// Opens the line written into a daemon's log before each start.
const START_MARKER: &str = "=== cargo xtask starts";

/// One daemon: `program` is both the binary's file name and the process name (`/proc/<pid>/comm`)
/// the pid file is checked against, so a recycled pid is not mistaken for it.
pub struct Daemon {
    pub program: &'static str,
    dir: &'static str,
}

impl Daemon {
    pub const fn new(program: &'static str, dir: &'static str) -> Self {
        Self { program, dir }
    }

    pub fn log_path(&self) -> PathBuf {
        Path::new(self.dir).join(format!("{}.log", self.program))
    }

    fn pid_path(&self) -> PathBuf {
        Path::new(self.dir).join(format!("{}.pid", self.program))
    }

    /// The pid in the pid file, if that process is still this daemon.
    pub fn running_pid(&self) -> Result<Option<u32>> {
        let pid_file = self.pid_path();
        let Ok(text) = fs::read_to_string(&pid_file) else {
            return Ok(None);
        };
        let pid: u32 = text
            .trim()
            .parse()
            .with_context(|| format!("{} does not hold a pid: {text:?}", pid_file.display()))?;
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        Ok((comm.trim() == comm_name(self.program) && process_alive(pid)).then_some(pid))
    }

    /// Starts `binary args…` detached unless the daemon already answers, and waits until
    /// `answers()` says it serves. A daemon of ours that runs but does not answer yet (another
    /// `up` started it a moment ago) is waited for rather than started twice.
    pub fn start(
        &self,
        binary: &Path,
        args: &[String],
        answers: impl Fn() -> bool,
        timeout: Duration,
    ) -> Result<()> {
        let name = self.program;
        if answers() {
            println!("{name}: already answering");
            return Ok(());
        }
        let started = Instant::now();
        let mut child = None;
        let pid = if let Some(pid) = self.running_pid()? {
            println!("{name}: running (pid {pid}), waiting for it to answer");
            pid
        } else {
            let log_path = self.log_path();
            let mut log = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .with_context(|| format!("opening {}", log_path.display()))?;
            // The log is kept across starts; the marker tells this start's lines from older ones.
            writeln!(
                log,
                "{START_MARKER} {} {}",
                binary.display(),
                args.join(" ")
            )
            .with_context(|| format!("writing to {}", log_path.display()))?;
            // setsid detaches the daemon from our session so it outlives this command and the
            // terminal; it does not fork (we are not a process-group leader), so the pid we
            // record is the daemon's.
            let spawned = Command::new("setsid")
                .arg(binary)
                .args(args)
                .stdin(Stdio::null())
                .stdout(log.try_clone().context("duplicating the log file handle")?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            let pid = spawned.id();
            fs::write(self.pid_path(), format!("{pid}\n"))
                .with_context(|| format!("writing {}", self.pid_path().display()))?;
            child = Some(spawned);
            pid
        };
        while !answers() {
            let exited = match child.as_mut() {
                Some(child) => child
                    .try_wait()
                    .with_context(|| format!("waiting for {name}"))?
                    .map(|status| status.to_string()),
                None => (!process_alive(pid)).then(|| "an unknown status".to_owned()),
            };
            if let Some(status) = exited {
                bail!(
                    "{name} exited with {status} before answering; the end of {}:\n{}",
                    self.log_path().display(),
                    self.log_tail()
                );
            }
            if started.elapsed() > timeout {
                bail!(
                    "{name} (pid {pid}) did not answer within {timeout:?}; the end of {}:\n{}",
                    self.log_path().display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "{name}: answering (pid {pid}) after {:?}, log {}",
            started.elapsed(),
            self.log_path().display()
        );
        Ok(())
    }

    /// Stops the daemon the pid file names with SIGTERM, and SIGKILL after `timeout`; returns its
    /// pid, or `None` when none of ours was running.
    pub fn stop(&self, timeout: Duration) -> Result<Option<u32>> {
        let Some(pid) = self.running_pid()? else {
            remove_if_exists(&self.pid_path())?;
            return Ok(None);
        };
        let name = self.program;
        if !signal(pid, libc::SIGTERM) {
            bail!("stopping {name} {pid}: {}", std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + timeout;
        while process_alive(pid) {
            if Instant::now() > deadline {
                println!("{name} {pid} ignored SIGTERM for {timeout:?}: killing it");
                signal(pid, libc::SIGKILL);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        remove_if_exists(&self.pid_path())?;
        Ok(Some(pid))
    }

    /// The running daemon's command line (binary first), read from `/proc`; `None` when it does
    /// not run.
    pub fn command_line(&self) -> Result<Option<Vec<String>>> {
        let Some(pid) = self.running_pid()? else {
            return Ok(None);
        };
        let raw = fs::read(format!("/proc/{pid}/cmdline"))
            .with_context(|| format!("reading the command line of {} {pid}", self.program))?;
        Ok(Some(
            raw.split(|b| *b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect(),
        ))
    }

    /// The last lines the latest start logged.
    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let latest = log
            .rfind(START_MARKER)
            .map_or(log.as_str(), |start| &log[start..]);
        let lines: Vec<&str> = latest.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

/// The kernel keeps the first 15 bytes of a program's name as the process name
/// (`TASK_COMM_LEN` is 16 with the NUL): `kube-controller-manager` runs as `kube-controller`.
fn comm_name(program: &str) -> &str {
    const COMM_LEN: usize = 15;
    program.get(..COMM_LEN).unwrap_or(program)
}

/// Sends `signal` to `pid`; whether it was delivered.
pub fn signal(pid: u32, signal: i32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: kill has no memory-safety preconditions; the pid came from our own pid file.
    unsafe { libc::kill(pid, signal) == 0 }
}

fn process_alive(pid: u32) -> bool {
    // A stopped process whose parent has not reaped it yet is a zombie ("Z"): it is gone for our purpose.
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::comm_name;

    #[test]
    fn long_program_names_are_cut_to_the_kernels_process_name() {
        assert_eq!(comm_name("kube-controller-manager"), "kube-controller");
        assert_eq!(comm_name("kube-apiserver"), "kube-apiserver");
        assert_eq!(comm_name("etcd"), "etcd");
    }
}
