//! ringlet's subcommands that inspect a running agent instead of being one (`ringlet events`). The
//! kubelet has no counterpart; these play the part `crictl` and `kubectl get events` play for it.

mod events;

#[cfg(test)]
pub(crate) use events::print_events;
pub use events::{
    ConnectFailure, EventWatch, EventsArgs, EventsError, OutputFormat, WatchItem, format_json,
    format_text, run_events, watch_events,
};
