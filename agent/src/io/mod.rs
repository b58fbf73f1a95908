//! The I/O engine boundary: the `io_uring` (tokio-uring) and epoll (tokio) runtimes, the socket and file
//! adapters the servers, the CRI client and the cgroup sweeps use, and the `io_uring` probe behind
//! `--io-engine=auto`.
//!
//! No kubelet counterpart: the kubelet runs on Go's netpoller. Every tokio-uring and io-uring type
//! stays inside this module so the engine can be replaced without touching the domain; what leaves it
//! is std, tokio and hyper-compatible types.

mod engine;
mod fs;
mod grpc;
mod net;
mod probe;

pub use engine::{EngineError, IoEngine, IoEngineSetting, block_on, select};
pub use fs::read_small_files;
pub use grpc::unix_channel;
pub use net::{Listener, MAX_WRITE, Stream, connect_tcp, connect_unix, spawn_connection};
pub use probe::{UringUnavailable, probe};
