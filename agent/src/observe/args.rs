//! The flags of `ringlet observe` (the interface the observe-mode `DaemonSet` in `deploy/` is
//! written against).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::apis::config::CgroupDriver;

/// Where observe mode serves its event stream unless told otherwise (not the agent's socket, so
/// both can run on one node).
pub const DEFAULT_EVENTS_SOCKET: &str = "/run/ringlet/observe-events.sock";
/// Where observe mode pins its BPF objects unless told otherwise (not the agent's directory).
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/ringlet-observe";

/// How observe mode learns that the kubelet reported an exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum SourceKind {
    /// Polls the kubelet's own `GET /pods` (read-only or authenticated port).
    KubeletPods,
    /// Watches the node's pods in the API server.
    Apiserver,
}

impl SourceKind {
    /// The `source` label of the lag histogram.
    pub fn label(self) -> &'static str {
        match self {
            Self::KubeletPods => "kubelet_pods",
            Self::Apiserver => "apiserver",
        }
    }
}

/// The cgroup driver flag's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupDriverArg {
    Cgroupfs,
    Systemd,
}

impl From<CgroupDriverArg> for CgroupDriver {
    fn from(driver: CgroupDriverArg) -> Self {
        match driver {
            CgroupDriverArg::Cgroupfs => Self::Cgroupfs,
            CgroupDriverArg::Systemd => Self::Systemd,
        }
    }
}

/// The flags of `ringlet observe`.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "observe",
    bin_name = "ringlet observe",
    about = "Measure how long the node's kubelet takes to report container exits the kernel saw \
             (runs no pods; read-only CRI calls)"
)]
pub struct ObserveArgs {
    /// The CRI endpoint of the node's runtime; only read-only calls are made.
    #[arg(
        long,
        value_name = "URL",
        default_value = "unix:///run/containerd/containerd.sock"
    )]
    pub container_runtime_endpoint: String,
    /// Where the kubelet's reports are read (repeatable).
    #[arg(long = "source", value_enum, default_values_t = [SourceKind::KubeletPods])]
    pub sources: Vec<SourceKind>,
    /// The kubelet whose `GET <URL>/pods` the `kubelet-pods` source polls.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:10255")]
    pub kubelet_url: String,
    /// CA bundle (PEM) to verify an https kubelet URL with.
    #[arg(long, value_name = "PATH")]
    pub kubelet_ca_file: Option<PathBuf>,
    /// File holding a bearer token for the kubelet URL (e.g. a service account token).
    #[arg(long, value_name = "PATH")]
    pub kubelet_token_file: Option<PathBuf>,
    /// How often `/pods` is polled while an exit waits for the kubelet (idle otherwise).
    #[arg(long, value_name = "DURATION", default_value = "2ms", value_parser = parse_duration)]
    pub kubelet_poll_interval: Duration,
    /// Kubeconfig for the `apiserver` source (default: in-cluster config or `KUBECONFIG`).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The node whose pods the `apiserver` source watches (default: the hostname).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Plain HTTP address of `/metrics` and `/healthz`.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:10290")]
    pub listen_address: SocketAddr,
    /// The unix socket of the live event stream (`ringlet events --socket PATH`).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_EVENTS_SOCKET)]
    pub events_socket: PathBuf,
    /// The bpffs directory the BPF objects are pinned in (removed on a clean stop).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_PIN_PATH)]
    pub bpf_pin_path: PathBuf,
    /// The kubelet's cgroup driver, which names the pods' parent cgroup.
    #[arg(long, value_enum, default_value_t = CgroupDriverArg::Cgroupfs)]
    pub cgroup_driver: CgroupDriverArg,
    /// The kubelet's `cgroupRoot`.
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub cgroup_root: String,
    /// An exit the kubelet has not reported after this long is given up on (and counted).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub give_up_after: Duration,
    /// Log verbosity level.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value_t = 0)]
    pub verbosity: u8,
}

impl ObserveArgs {
    /// The sources asked for, each once, in a fixed order.
    pub fn unique_sources(&self) -> Vec<SourceKind> {
        let mut sources = self.sources.clone();
        sources.sort();
        sources.dedup();
        sources
    }
}

/// A duration as `250ms`, `2s`, `5m` or `1h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit (ms, s, m or h)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" => Ok(Duration::from_secs(number)),
        "m" => Ok(Duration::from_secs(number.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(number.saturating_mul(3600))),
        _ => Err(format!("{text:?} has unit {unit:?}; use ms, s, m or h")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[test]
    fn defaults_follow_the_agreed_interface() {
        let args = ObserveArgs::parse_from(["observe"]);
        assert_eq!(
            args.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(args.unique_sources(), [SourceKind::KubeletPods]);
        assert_eq!(args.kubelet_url, "http://127.0.0.1:10255");
        assert_eq!(args.listen_address.to_string(), "0.0.0.0:10290");
        assert_eq!(args.events_socket, PathBuf::from(DEFAULT_EVENTS_SOCKET));
        assert_eq!(args.bpf_pin_path, PathBuf::from(DEFAULT_PIN_PATH));
        assert_eq!(args.give_up_after, Duration::from_mins(5));
    }

    #[test]
    fn sources_repeat_and_durations_parse() {
        let args = ObserveArgs::parse_from([
            "observe",
            "--source",
            "apiserver",
            "--source",
            "kubelet-pods",
            "--source",
            "apiserver",
            "--kubelet-poll-interval",
            "5ms",
        ]);
        assert_eq!(
            args.unique_sources(),
            [SourceKind::KubeletPods, SourceKind::Apiserver]
        );
        assert_eq!(args.kubelet_poll_interval, Duration::from_millis(5));
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
        assert!(parse_duration("5d").unwrap_err().contains("unit \"d\""));
    }
}
