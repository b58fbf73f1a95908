//! Supervised tasks: a task that panics is logged, reported unhealthy for a while and run again
//! after a back-off, instead of vanishing with a dropped `JoinHandle` while what it did (a pod's
//! worker, the PLEG) silently stops. The kubelet has no counterpart: a panicking goroutine there
//! takes the whole process down (`runtime.HandleCrash` re-panics) and the service manager restarts
//! it; here one pod's worker failing must not stop every pod, and must not go unnoticed either.
//!
//! [`spawn_supervised`] runs the future a closure makes and makes a new one after each panic;
//! [`TaskPanics`] collects the panics of a group of tasks (every pod worker, say) for `/healthz`.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt as _;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The wait before the first restart; it doubles with each panic in a row.
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// The longest wait before a restart; a run that lasted this long without panicking resets the
/// back-off.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_mins(1);
/// How long after a panic [`TaskPanics::healthy`] reports it: the PLEG's relist threshold, so a
/// panic is visible to whoever polls `/healthz` at the usual rate.
pub const PANIC_UNHEALTHY_FOR: Duration = Duration::from_mins(3);

/// One panic of a supervised task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskPanic {
    pub task: String,
    pub message: String,
    pub at: Instant,
}

#[derive(Debug, Default)]
struct PanicsState {
    total: u64,
    last: Option<TaskPanic>,
}

/// The panics of a group of supervised tasks. Cloneable; clones share the record.
#[derive(Clone, Debug, Default)]
pub struct TaskPanics {
    state: Arc<Mutex<PanicsState>>,
}

impl TaskPanics {
    fn lock(&self) -> std::sync::MutexGuard<'_, PanicsState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `task` panicked with `message` now.
    pub fn record(&self, task: &str, message: &str) {
        let mut state = self.lock();
        state.total += 1;
        state.last = Some(TaskPanic {
            task: task.to_owned(),
            message: message.to_owned(),
            at: Instant::now(),
        });
    }

    /// Panics recorded since the start.
    pub fn total(&self) -> u64 {
        self.lock().total
    }

    /// The latest panic, if any.
    pub fn last(&self) -> Option<TaskPanic> {
        self.lock().last.clone()
    }

    /// `Ok` unless a task panicked within [`PANIC_UNHEALTHY_FOR`]; then which, when and why.
    pub fn healthy(&self) -> Result<(), String> {
        let state = self.lock();
        match &state.last {
            Some(last) if last.at.elapsed() < PANIC_UNHEALTHY_FOR => Err(format!(
                "task {} panicked {:?} ago ({} panics since start): {}",
                last.task,
                last.at.elapsed(),
                state.total,
                last.message
            )),
            _ => Ok(()),
        }
    }
}

/// The text a panic was raised with (`panic!("…")` payloads are `&str` or `String`).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The waits before restarts: [`RESTART_BACKOFF_INITIAL`], doubling with each panic up to
/// [`RESTART_BACKOFF_MAX`]; a run that lasted [`RESTART_BACKOFF_MAX`] before it panicked starts
/// over from the initial wait.
#[derive(Debug)]
pub struct RestartBackoff {
    next: Duration,
}

impl Default for RestartBackoff {
    fn default() -> Self {
        Self {
            next: RESTART_BACKOFF_INITIAL,
        }
    }
}

impl RestartBackoff {
    /// How long to wait before restarting a run that panicked after running for `ran`.
    pub fn after_panic(&mut self, ran: Duration) -> Duration {
        if ran >= RESTART_BACKOFF_MAX {
            self.next = RESTART_BACKOFF_INITIAL;
        }
        let wait = self.next;
        self.next = (wait * 2).min(RESTART_BACKOFF_MAX);
        wait
    }
}

/// Spawns the future `make` returns as task `task`. When it panics, the panic is recorded in
/// `panics` and logged, and after a back-off ([`RESTART_BACKOFF_INITIAL`] doubling up to
/// [`RESTART_BACKOFF_MAX`]) `make` is called again for a new run. The task ends when a run returns
/// without panicking; aborting the returned handle stops the current run too. `make` must build
/// each run from state that outlives it (shared handles, not a moved-in receiver), since a panicked
/// run's state is gone.
pub fn spawn_supervised<F, Fut>(
    task: impl Into<String>,
    panics: TaskPanics,
    make: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(supervise(task.into(), panics, make))
}

/// The supervising loop of [`spawn_supervised`], for callers that spawn it themselves (on a local
/// set, say).
pub async fn supervise<F, Fut>(task: String, panics: TaskPanics, mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut backoff = RestartBackoff::default();
    loop {
        let started = Instant::now();
        // The run's state is dropped with the panic and a new run starts from `make`, so nothing
        // observes the state the panic left.
        let Err(payload) = AssertUnwindSafe(make()).catch_unwind().await else {
            return;
        };
        let message = panic_message(&*payload);
        panics.record(&task, &message);
        let wait = backoff.after_panic(started.elapsed());
        tracing::error!(task, panic = %message, restart_in = ?wait, "a task panicked; restarting it");
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_restarted_after_a_growing_back_off_and_reported() {
        let runs = Arc::new(AtomicU32::new(0));
        let panics = TaskPanics::default();
        let handle = spawn_supervised("pod-worker uid-1", panics.clone(), {
            let runs = Arc::clone(&runs);
            move || {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    assert!(run > 2, "run {run} fails");
                }
            }
        });
        settle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let unhealthy = panics.healthy().unwrap_err();
        assert!(
            unhealthy.contains("pod-worker uid-1") && unhealthy.contains("run 1 fails"),
            "{unhealthy}"
        );
        tokio::time::advance(RESTART_BACKOFF_INITIAL.saturating_sub(Duration::from_millis(1)))
            .await;
        settle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "still backing off");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        tokio::time::advance(
            (RESTART_BACKOFF_INITIAL * 2).saturating_sub(Duration::from_millis(1)),
        )
        .await;
        settle().await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "the second wait is twice as long"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert!(handle.is_finished(), "the third run returned");
        assert_eq!(panics.total(), 2);
        assert!(panics.healthy().is_err());
        tokio::time::advance(PANIC_UNHEALTHY_FOR).await;
        assert!(panics.healthy().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn aborting_the_handle_stops_the_run() {
        let panics = TaskPanics::default();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let handle = spawn_supervised("forever", panics, move || {
            let tx = tx.clone();
            async move {
                std::future::pending::<()>().await;
                drop(tx);
            }
        });
        settle().await;
        handle.abort();
        // The run's sender goes with it: the channel closes.
        assert_eq!(rx.recv().await, None);
    }

    #[test]
    fn the_back_off_doubles_up_to_the_cap_and_resets_after_a_long_run() {
        let short = Duration::from_millis(10);
        let mut backoff = RestartBackoff::default();
        let waits: Vec<u64> = (0..8)
            .map(|_| backoff.after_panic(short).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(
            backoff.after_panic(RESTART_BACKOFF_MAX),
            RESTART_BACKOFF_INITIAL
        );
    }

    #[test]
    fn panic_messages_are_read_from_str_and_string_payloads() {
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&42_u8), "a panic without a message");
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
}
