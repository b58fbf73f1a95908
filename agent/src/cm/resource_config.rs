//! The cgroup settings the node writes itself (the kubelet's `ResourceConfig` in `pkg/kubelet/cm`,
//! `MilliCPUToShares`, `MilliCPUToQuota` and the shares-to-weight conversion of
//! `cgroup_manager_linux.go`), and writing them to an existing cgroup through cgroups-rs.

use cgroups_rs::fs::Cgroup;
use cgroups_rs::fs::MaxValue;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::hierarchies;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;

use super::CmError;

/// The kernel's bounds of `cpu.shares`.
const MIN_CPU_SHARES: u64 = 2;
const MAX_CPU_SHARES: u64 = 262_144;
const SHARES_PER_CPU: i64 = 1024;
const MILLI_CPU_PER_CPU: i64 = 1000;
/// A CFS quota is at least 1 ms.
const MIN_QUOTA_US: i64 = 1_000;

/// Settings for one cgroup; `None` leaves a setting as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// `cpu.shares` (converted to `cpu.weight` on cgroup v2).
    pub cpu_shares: Option<u64>,
    /// `memory.limit_in_bytes` / `memory.max`.
    pub memory_bytes: Option<i64>,
    /// `pids.max`.
    pub pids_max: Option<i64>,
}

/// CPU shares for a CPU request in millicores: 1024 per CPU, at least the kernel's minimum.
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    let shares = milli_cpu.saturating_mul(SHARES_PER_CPU) / MILLI_CPU_PER_CPU;
    u64::try_from(shares)
        .unwrap_or(0)
        .clamp(MIN_CPU_SHARES, MAX_CPU_SHARES)
}

/// The CFS quota, in microseconds, that lets a CPU limit in millicores run over `period_us`: the
/// limit's share of the period (1000m is the whole period), at least 1 ms; 0 (no quota) for no
/// limit.
pub fn milli_cpu_to_quota(milli_cpu: i64, period_us: i64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    (milli_cpu.saturating_mul(period_us) / MILLI_CPU_PER_CPU).max(MIN_QUOTA_US)
}

/// `cpu.weight` (1..10000) for `cpu.shares` (2..262144), the conversion runc and the kubelet use
/// on cgroup v2.
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(MIN_CPU_SHARES, MAX_CPU_SHARES);
    1 + ((shares - MIN_CPU_SHARES) * 9999) / (MAX_CPU_SHARES - MIN_CPU_SHARES)
}

/// Writes `config` to the cgroup at `relative` (below every hierarchy's mount point), which must
/// exist. Each setting goes to the hierarchy of its controller, so a hybrid host's controller-less
/// cgroup2 tree is left alone.
pub(super) fn apply(relative: &str, config: &ResourceConfig) -> Result<(), CmError> {
    let hierarchy = hierarchies::auto();
    let v2 = hierarchy.v2();
    let cgroup = Cgroup::load(hierarchy, relative);
    let failed = |setting: &'static str| {
        move |source| CmError::Update {
            path: format!("/{relative}"),
            setting,
            source,
        }
    };
    let missing = |controller: &'static str| CmError::NoController {
        path: format!("/{relative}"),
        controller,
    };
    if let Some(shares) = config.cpu_shares {
        let cpu: &CpuController = cgroup.controller_of().ok_or_else(|| missing("cpu"))?;
        let value = if v2 { shares_to_weight(shares) } else { shares };
        cpu.set_shares(value).map_err(failed("cpu shares"))?;
    }
    if let Some(bytes) = config.memory_bytes {
        let memory: &MemController = cgroup.controller_of().ok_or_else(|| missing("memory"))?;
        memory.set_limit(bytes).map_err(failed("memory limit"))?;
    }
    if let Some(max) = config.pids_max {
        let pids: &PidController = cgroup.controller_of().ok_or_else(|| missing("pids"))?;
        pids.set_pid_max(MaxValue::Value(max))
            .map_err(failed("pids limit"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_request_within_the_kernels_bounds() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(2000), 2048);
        assert_eq!(milli_cpu_to_shares(1_000_000), 262_144);
        assert_eq!(milli_cpu_to_shares(-5), 2);
    }

    #[test]
    fn quotas_scale_with_the_period() {
        // The kubelet's default period.
        assert_eq!(milli_cpu_to_quota(100, 100_000), 10_000);
        assert_eq!(milli_cpu_to_quota(1500, 100_000), 150_000);
        // A custom period: the limit is the same share of a different window.
        assert_eq!(milli_cpu_to_quota(100, 50_000), 5_000);
        assert_eq!(milli_cpu_to_quota(2000, 1_000_000), 2_000_000);
        // At least 1 ms, and no quota without a limit.
        assert_eq!(milli_cpu_to_quota(1, 100_000), 1_000);
        assert_eq!(milli_cpu_to_quota(5, 5_000), 1_000);
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
    }

    #[test]
    fn weights_span_the_cgroup2_range() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(0), 1);
    }
}
