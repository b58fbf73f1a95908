//! The service manager's notification protocol (`sd_notify(3)`) for `Type=notify` units: `READY=1`
//! once the first relist succeeded and every `/healthz` check passes (the sync loop went round; the
//! servers are bound before this starts), `WATCHDOG=1` every half `WATCHDOG_USEC` while every
//! `/healthz` check passes, `STOPPING=1` on shutdown, and `STATUS=`
//! lines saying which. Without `NOTIFY_SOCKET` (not started by systemd) nothing is sent.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::task::JoinHandle;

use crate::kubelet::KubeletServerHost;
use crate::server::{HealthCheck, ServerHost as _};

/// How often the task looks for the first successful relist before `READY=1`.
const READY_POLL: Duration = Duration::from_millis(50);

/// The running notification task; [`Notifier::stopping`] ends it.
pub struct Notifier {
    task: JoinHandle<()>,
}

impl Notifier {
    /// Starts telling the service manager about `host` when it asked for notifications
    /// (`NOTIFY_SOCKET` is set); `None` otherwise. Call once the servers listen.
    pub fn start(host: Arc<KubeletServerHost>) -> Option<Self> {
        std::env::var_os("NOTIFY_SOCKET")?;
        let watchdog = sd_notify::watchdog_enabled();
        let ready_host = Arc::clone(&host);
        let task = tokio::spawn(notify_loop(
            move || {
                ready_host.pleg.last_relist().is_some()
                    && verdict(&ready_host.health_checks()).is_ok()
            },
            move || verdict(&host.health_checks()),
            watchdog,
            send,
        ));
        Some(Self { task })
    }

    /// The agent is shutting down: no more watchdog pings, and `STOPPING=1`.
    pub fn stopping(self) {
        self.task.abort();
        send(&[
            NotifyState::Stopping,
            NotifyState::Status("shutting down; running containers are left alone"),
        ]);
    }
}

/// Sends `states` to the service manager; a failure is logged, never fatal.
fn send(states: &[NotifyState<'_>]) {
    if let Err(err) = sd_notify::notify(states) {
        tracing::warn!(%err, "cannot notify the service manager");
    }
}

/// The `/healthz` verdict over `checks`: `Ok` when every check passes, otherwise the failures.
fn verdict(checks: &[HealthCheck]) -> Result<(), String> {
    let failed: Vec<String> = checks
        .iter()
        .filter_map(|check| {
            let reason = check.result.as_ref().err()?;
            Some(format!("{}: {reason}", check.name))
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Waits for `ready`, sends `READY=1`, then (with a watchdog) checks `health` every half watchdog
/// interval: `WATCHDOG=1` while it passes, a `STATUS=` line whenever the verdict changes.
async fn notify_loop(
    ready: impl Fn() -> bool,
    health: impl Fn() -> Result<(), String>,
    watchdog: Option<Duration>,
    send: impl Fn(&[NotifyState<'_>]),
) {
    while !ready() {
        tokio::time::sleep(READY_POLL).await;
    }
    tracing::info!("first relist done: telling the service manager the agent is ready");
    send(&[NotifyState::Ready, NotifyState::Status("running")]);
    let Some(watchdog) = watchdog else {
        return;
    };
    let mut tick = tokio::time::interval(watchdog / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Result<(), String> = Ok(());
    loop {
        tick.tick().await;
        let now = health();
        match &now {
            Ok(()) => send(&[NotifyState::Watchdog]),
            Err(reason) if last.is_ok() => {
                tracing::warn!("unhealthy, withholding the service manager's watchdog: {reason}");
            }
            Err(_) => {}
        }
        if now != last {
            let status = match &now {
                Ok(()) => "running".to_owned(),
                Err(reason) => format!("unhealthy: {reason}"),
            };
            send(&[NotifyState::Status(&status)]);
        }
        last = now;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;

    fn check(name: &'static str, result: Result<(), String>) -> HealthCheck {
        HealthCheck {
            name,
            result,
            detail: None,
        }
    }

    #[test]
    fn verdict_names_every_failing_check() {
        assert_eq!(verdict(&[check("ping", Ok(()))]), Ok(()));
        let failed = verdict(&[
            check("ping", Ok(())),
            check("syncloop", Err("stuck".to_owned())),
            check("pleg", Err("no relist".to_owned())),
        ]);
        assert_eq!(failed, Err("syncloop: stuck; pleg: no relist".to_owned()));
    }

    /// The loop's messages in order, as `KEY=value` lines.
    #[derive(Clone, Default)]
    struct Sent(Arc<Mutex<Vec<String>>>);

    impl Sent {
        fn sender(&self) -> impl Fn(&[NotifyState<'_>]) + use<> {
            let sent = self.0.clone();
            move |states| {
                let mut sent = sent.lock().unwrap();
                sent.extend(states.iter().map(ToString::to_string));
            }
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ready_waits_for_the_first_relist_and_the_watchdog_follows_health() {
        let relisted = Arc::new(AtomicBool::new(false));
        let healthy = Arc::new(AtomicBool::new(true));
        let sent = Sent::default();
        let task = tokio::spawn(notify_loop(
            {
                let relisted = relisted.clone();
                move || relisted.load(Ordering::SeqCst)
            },
            {
                let healthy = healthy.clone();
                move || {
                    if healthy.load(Ordering::SeqCst) {
                        Ok(())
                    } else {
                        Err("syncloop: stuck".to_owned())
                    }
                }
            },
            Some(Duration::from_secs(2)),
            sent.sender(),
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(sent.take().is_empty(), "nothing before the first relist");

        relisted.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(3100)).await;
        assert_eq!(
            sent.take(),
            [
                "READY=1",
                "STATUS=running",
                "WATCHDOG=1",
                "WATCHDOG=1",
                "WATCHDOG=1",
                "WATCHDOG=1"
            ]
        );

        healthy.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(sent.take(), ["STATUS=unhealthy: syncloop: stuck"]);

        healthy.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(sent.take(), ["WATCHDOG=1", "STATUS=running"]);
        task.abort();
    }
}
