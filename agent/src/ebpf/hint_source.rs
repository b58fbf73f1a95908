//! Chooses the PLEG's hint source at start-up (`--pleg-mode`): the eBPF programs when they load and
//! attach; otherwise, in `auto` mode, none, so the PLEG relists, with one log line saying why, and in
//! `ebpf` mode an error that stops the agent. The reader reports the kernel's drop counter as
//! `ringlet_ebpf_ring_buffer_drops_total` whenever it reads it (on its wake-ups and at every full
//! relist), so the metric needs no timer of its own.

use std::path::PathBuf;

use tokio::sync::mpsc;

use super::{EbpfError, EbpfHandle, EbpfOptions};
use crate::apis::config::PlegModeSetting;
use crate::error_chain::error_chain;
use crate::metrics::Metrics;
use crate::pleg::{HintChannel, PlegHints};

/// Hints buffered between the ring-buffer reader and the PLEG; past this the reader asks for a
/// full relist instead of blocking.
const HINT_CHANNEL_CAPACITY: usize = 4096;

/// A running eBPF hint source: the PLEG's end of the hint channel and the loader's handle, which
/// detaches the programs and removes the pins when dropped.
pub struct HintSource {
    pub channel: HintChannel,
    pub handle: EbpfHandle,
}

/// Starts the eBPF hint source unless `mode` is `relist`. `pods_cgroup` is the cgroup2 directory of
/// the pods' parent (`None` when the host has no cgroup2). In `auto` mode a failure is logged once
/// with its cause and yields `Ok(None)`: the agent then runs the relist PLEG. In `ebpf` mode it is
/// the error.
pub fn start_hint_source(
    mode: PlegModeSetting,
    pods_cgroup: Option<PathBuf>,
    ring_buffer_bytes: u32,
    metrics: &Metrics,
) -> Result<Option<HintSource>, EbpfError> {
    if mode == PlegModeSetting::Relist {
        return Ok(None);
    }
    let unavailable = |err: EbpfError| {
        if mode == PlegModeSetting::Ebpf {
            return Err(err);
        }
        tracing::warn!(
            "eBPF PLEG unavailable, running the relist PLEG: {}",
            error_chain(&err)
        );
        Ok(None)
    };
    let Some(pods_cgroup) = pods_cgroup else {
        return unavailable(EbpfError::NoCgroup2Mount);
    };
    let (sender, hints) = mpsc::channel(HINT_CHANNEL_CAPACITY);
    let hints = PlegHints::new(hints);
    let refresh = hints.refreshes.requester();
    let options = EbpfOptions {
        ring_buffer_bytes,
        ..EbpfOptions::new(pods_cgroup)
    };
    let metrics = metrics.clone();
    let on_drops = move |total| metrics.set_ring_buffer_drops_total(total);
    match super::start(options, sender, on_drops) {
        Ok(handle) => {
            tracing::info!(programs = ?handle.attached_programs(), pins = %handle.pin_dir().display(),
                "eBPF PLEG hints attached");
            Ok(Some(HintSource {
                channel: HintChannel {
                    hints,
                    refresh,
                    check: handle.source_check(),
                },
                handle,
            }))
        }
        Err(err) => unavailable(err),
    }
}
