//! logind as the source of shutdown events (the kubelet's `pkg/kubelet/nodeshutdown/systemd`): a
//! delay inhibitor lock on `shutdown` from `org.freedesktop.login1.Manager.Inhibit`, held until the
//! pods are handled, and the manager's `PrepareForShutdown` signal. logind waits for the lock at
//! most `InhibitDelayMaxSec`; when that is shorter than the grace periods the agent says so and
//! leaves logind's configuration alone (the kubelet writes a drop-in and reloads logind).

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use zbus::proxy::{CacheProperties, SignalStream};
use zbus::zvariant::OwnedFd;
use zbus::{Connection, Proxy};

use super::NodeShutdownError;
use super::source::{ShutdownEvent, ShutdownSource};

const LOGIND: &str = "org.freedesktop.login1";
const PATH: &str = "/org/freedesktop/login1";
const MANAGER: &str = "org.freedesktop.login1.Manager";
/// The lock's `who` and `why`, as `systemd-inhibit --list` shows them (the kubelet's words).
const WHO: &str = "kubelet";
const WHY: &str = "Kubelet needs time to handle node shutdown";

/// The logind connection, its signal subscription and the lock.
pub struct Logind {
    proxy: Proxy<'static>,
    signals: SignalStream<'static>,
    /// Closing the descriptor releases the lock.
    lock: Option<OwnedFd>,
}

fn logind_error(what: &'static str) -> impl FnOnce(zbus::Error) -> NodeShutdownError {
    move |source| NodeShutdownError::Logind {
        what,
        source: Box::new(source),
    }
}

impl Logind {
    /// Connects to logind on the system bus, subscribes to `PrepareForShutdown` and takes the
    /// delay lock; `requested` is the sum of the grace periods, compared with logind's maximum.
    pub async fn connect(requested: Duration) -> Result<Self, NodeShutdownError> {
        let connection = Connection::system()
            .await
            .map_err(logind_error("connecting to the system bus"))?;
        let proxy = zbus::proxy::Builder::<Proxy<'static>>::new(&connection)
            .destination(LOGIND)
            .and_then(|b| b.path(PATH))
            .and_then(|b| b.interface(MANAGER))
            .map_err(logind_error("naming logind's manager object"))?
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(logind_error("reaching logind's manager object"))?;
        let max_delay: u64 = proxy
            .get_property("InhibitDelayMaxUSec")
            .await
            .map_err(logind_error("asking logind for InhibitDelayMaxUSec"))?;
        let max_delay = Duration::from_micros(max_delay);
        if max_delay < requested {
            tracing::warn!(
                "logind waits at most {}s for a shutdown delay lock (InhibitDelayMaxSec) but the \
                 shutdown grace periods add up to {}s: pods may be cut short; raise \
                 InhibitDelayMaxSec in a logind.conf.d drop-in",
                max_delay.as_secs(),
                requested.as_secs()
            );
        }
        let signals = proxy
            .receive_signal("PrepareForShutdown")
            .await
            .map_err(logind_error("subscribing to logind's PrepareForShutdown"))?;
        let lock = inhibit(&proxy).await?;
        Ok(Self {
            proxy,
            signals,
            lock: Some(lock),
        })
    }
}

async fn inhibit(proxy: &Proxy<'_>) -> Result<OwnedFd, NodeShutdownError> {
    proxy
        .call("Inhibit", &("shutdown", WHO, WHY, "delay"))
        .await
        .map_err(logind_error("taking a shutdown delay lock from logind"))
}

#[async_trait]
impl ShutdownSource for Logind {
    async fn next(&mut self) -> Option<ShutdownEvent> {
        loop {
            let message = self.signals.next().await?;
            match message.body().deserialize::<bool>() {
                Ok(true) => return Some(ShutdownEvent::Shutdown),
                Ok(false) => {
                    // A cancelled shutdown: the next one must be held back too.
                    match inhibit(&self.proxy).await {
                        Ok(lock) => self.lock = Some(lock),
                        Err(err) => tracing::warn!(
                            "the next shutdown will not wait for the pods: {}",
                            crate::error_chain::error_chain(&err)
                        ),
                    }
                    return Some(ShutdownEvent::Cancelled);
                }
                Err(err) => tracing::warn!("ignoring a malformed PrepareForShutdown signal: {err}"),
            }
        }
    }

    fn release(&mut self) {
        self.lock = None;
    }
}
