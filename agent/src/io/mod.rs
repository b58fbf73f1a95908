//! The I/O engine boundary: the `io_uring` (tokio-uring) and epoll (tokio) runtimes, the socket and file
//! adapters the servers, the CRI client and the cgroup sweeps use, and the `io_uring` probe behind
//! `--io-engine=auto`.
//!
//! No kubelet counterpart: the kubelet runs on Go's netpoller. Every tokio-uring and io-uring type
//! stays inside this module so the engine can be replaced without touching the domain; what leaves it
//! is std, tokio and hyper-compatible types.
//!
//! Wiring: `select(setting)` once at start-up (log the fallback reason), then run the whole agent in
//! `block_on(engine, ..)`. Inside it, servers accept on a [`Listener`] and drive each connection with
//! [`spawn_connection`] (uring streams are `!Send`); the CRI client uses [`unix_channel`]; cgroup
//! sweeps use [`read_small_files`]; container and node logs are read through [`ReadFile`]. Plain
//! tokio (timers, `tokio::spawn`, tokio sockets) keeps working on both engines.

mod engine;
mod file;
mod fs;
mod grpc;
mod net;
mod probe;
#[cfg(test)]
pub(crate) mod testing;

pub use engine::{EngineError, IoEngine, IoEngineSetting, block_on, select};
pub use file::{FileIdentity, ReadFile, identity_of};
pub use fs::read_small_files;
pub use grpc::unix_channel;
pub use net::{
    Listener, MAX_WRITE, SendStream, Stream, connect_tcp, connect_unix, spawn_connection,
};
pub use probe::{UringUnavailable, probe};
