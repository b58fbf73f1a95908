//! Where shutdown events come from: the [`ShutdownSource`] the manager waits on, and the lab's
//! `SIGUSR1` source (`--lab-node-shutdown-signal`), which stands in for logind on machines that
//! have none. Production uses [`super::Logind`].

use async_trait::async_trait;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::NodeShutdownError;

/// What the source reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownEvent {
    /// The machine is about to shut down (logind's `PrepareForShutdown(true)`).
    Shutdown,
    /// A shutdown announced before was cancelled (`PrepareForShutdown(false)`).
    Cancelled,
}

/// A source of shutdown events that can hold the shutdown back while the pods stop.
#[async_trait]
pub trait ShutdownSource: Send {
    /// The next event; `None` when no more can come.
    async fn next(&mut self) -> Option<ShutdownEvent>;
    /// The pods have been handled: let the shutdown go on (release the delay lock).
    fn release(&mut self);
}

/// `SIGUSR1` as `PrepareForShutdown(true)`, for the lab only: the flag that enables it is hidden
/// from `--help`, and nothing is held back (there is no logind to delay).
pub struct LabSignal {
    usr1: Signal,
}

impl LabSignal {
    pub fn new() -> Result<Self, NodeShutdownError> {
        let usr1 = signal(SignalKind::user_defined1()).map_err(NodeShutdownError::Signal)?;
        Ok(Self { usr1 })
    }
}

#[async_trait]
impl ShutdownSource for LabSignal {
    async fn next(&mut self) -> Option<ShutdownEvent> {
        self.usr1.recv().await.map(|()| ShutdownEvent::Shutdown)
    }

    fn release(&mut self) {}
}
