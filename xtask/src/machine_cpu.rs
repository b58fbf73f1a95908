//! How busy the machine and one agent were during a phase of a bench: the share of all cores' time
//! that anything used (`/proc/stat`), and the share the agent used (its utime + stime). A phase in
//! which the machine is nearly always busy while the agent's share is small is bound by the work of
//! the others (the runtime's `runc`, shims and containerd), not by waits in the agent; idle time
//! in a phase is time that nothing used.

use std::fs;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::benchkit::{clock_ticks, process_cpu_seconds};

/// The machine's and an agent's CPU counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Snapshot {
    /// Ticks all cores spent on anything but idling and waiting for I/O.
    busy_ticks: u64,
    /// Ticks all cores spent, idle included.
    all_ticks: u64,
    agent_seconds: f64,
}

/// What a phase used, in % of all cores' time over the phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shares {
    pub machine_busy: f64,
    pub agent: f64,
}

impl Snapshot {
    pub fn take(agent_pid: u32) -> Result<Self> {
        let stat = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let (busy_ticks, all_ticks) = machine_ticks(&stat)?;
        Ok(Self {
            busy_ticks,
            all_ticks,
            agent_seconds: process_cpu_seconds(agent_pid)?,
        })
    }

    /// The shares from this snapshot to `later`; `None` when no tick passed between them.
    pub fn shares_until(&self, later: &Snapshot) -> Option<Shares> {
        let all = later.all_ticks.checked_sub(self.all_ticks)?;
        if all == 0 {
            return None;
        }
        let busy = later.busy_ticks.saturating_sub(self.busy_ticks);
        #[allow(clippy::cast_precision_loss, reason = "tick counts of a bench phase")]
        let (busy, all) = (busy as f64, all as f64);
        let agent = (later.agent_seconds - self.agent_seconds).max(0.0) * clock_ticks();
        Some(Shares {
            machine_busy: busy * 100.0 / all,
            agent: agent * 100.0 / all,
        })
    }
}

/// Busy and total ticks of all cores from the `cpu` line of `/proc/stat` (user nice system idle
/// iowait irq softirq steal …; guest time is already part of user).
fn machine_ticks(stat: &str) -> Result<(u64, u64)> {
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))
        .context("no cpu line in /proc/stat")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("a counter of /proc/stat's cpu line is not a number: {line}"))?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = fields[..] else {
        anyhow::bail!("/proc/stat's cpu line has fewer than 8 counters: {line}");
    };
    let busy = user + nice + system + irq + softirq + steal;
    Ok((busy, busy + idle + iowait))
}

/// The snapshot taken once `after` of a phase had passed (at the first poll past it), so the part
/// of the phase after a fixed wait can be told apart.
pub struct PhaseCpu {
    after: Duration,
    pub later: Option<Snapshot>,
}

impl PhaseCpu {
    pub fn new(after: Duration) -> Self {
        Self { after, later: None }
    }

    /// Takes the later snapshot at the first call with `elapsed` past the wait.
    pub fn poll(
        &mut self,
        elapsed: Duration,
        take: impl FnOnce() -> Result<Snapshot>,
    ) -> Result<()> {
        if self.later.is_none() && elapsed >= self.after {
            self.later = Some(take()?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\nintr 1\n";

    #[test]
    fn busy_is_everything_but_idle_and_iowait() {
        assert_eq!(machine_ticks(STAT).unwrap(), (160, 980));
    }

    #[test]
    fn a_short_or_garbled_cpu_line_is_an_error_naming_it() {
        let short = machine_ticks("cpu 1 2 3\n").unwrap_err().to_string();
        assert!(short.contains("fewer than 8"), "{short}");
        let garbled = machine_ticks("cpu 1 x 3 4 5 6 7 8\n")
            .unwrap_err()
            .to_string();
        assert!(garbled.contains("not a number"), "{garbled}");
        assert!(machine_ticks("intr 1\n").is_err());
    }

    fn snapshot(busy_ticks: u64, all_ticks: u64, agent_seconds: f64) -> Snapshot {
        Snapshot {
            busy_ticks,
            all_ticks,
            agent_seconds,
        }
    }

    #[test]
    fn shares_are_percent_of_all_cores_time() {
        let ticks = clock_ticks();
        // 400 ticks of all cores, 300 of them busy, 40 ticks' worth of seconds the agent's.
        let shares = snapshot(1000, 2000, 1.0)
            .shares_until(&snapshot(1300, 2400, 1.0 + 40.0 / ticks))
            .unwrap();
        assert!((shares.machine_busy - 75.0).abs() < 1e-9, "{shares:?}");
        assert!((shares.agent - 10.0).abs() < 1e-9, "{shares:?}");
    }

    #[test]
    fn no_ticks_between_snapshots_gives_no_shares() {
        let at = snapshot(10, 20, 0.5);
        assert_eq!(at.shares_until(&at), None);
        assert_eq!(at.shares_until(&snapshot(10, 19, 0.5)), None);
    }

    #[test]
    fn the_later_snapshot_is_the_first_past_the_wait() {
        let mut phase = PhaseCpu::new(Duration::from_secs(2));
        phase
            .poll(Duration::from_millis(1900), || Ok(snapshot(1, 1, 0.0)))
            .unwrap();
        assert_eq!(phase.later, None);
        phase
            .poll(Duration::from_millis(2100), || Ok(snapshot(2, 2, 0.0)))
            .unwrap();
        phase
            .poll(Duration::from_millis(2300), || Ok(snapshot(3, 3, 0.0)))
            .unwrap();
        assert_eq!(phase.later, Some(snapshot(2, 2, 0.0)));
    }
}
