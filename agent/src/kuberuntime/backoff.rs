//! Per-key exponential back-off (the kubelet's `flowcontrol.Backoff` as used for crash loops and
//! image pulls): 10 s doubling to 5 min, forgotten once the key has been quiet for 10 min (a container
//! that ran that long starts over at 10 s).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

pub const INITIAL: Duration = Duration::from_secs(10);
pub const MAX: Duration = Duration::from_mins(5);
/// Twice the maximum, as upstream: a key untouched for this long starts over.
pub const RESET_AFTER: Duration = Duration::from_mins(10);

#[derive(Clone, Copy, Debug)]
struct Entry {
    delay: Duration,
    /// When the event that set `delay` happened (a container exit, a failed pull).
    last_event: Instant,
}

/// Back-off state for many keys (e.g. `<pod uid>/<container name>`).
#[derive(Debug)]
pub struct BackOff {
    initial: Duration,
    max: Duration,
    reset_after: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Default for BackOff {
    fn default() -> Self {
        Self::new(INITIAL, MAX, RESET_AFTER)
    }
}

impl BackOff {
    pub fn new(initial: Duration, max: Duration, reset_after: Duration) -> Self {
        Self {
            initial,
            max,
            reset_after,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current delay if `now` is still inside the back-off window opened by the event at
    /// `event` (the kubelet's `IsInBackOffSince`); `None` means "go ahead". The key starts over
    /// when `event` came long after the last recorded one (a container that ran that long), not
    /// when `now` is long after it: at the 5-minute cap, the recorded event is the exit before the
    /// last one, already more than 5 minutes old when the window of the last one ends.
    pub fn in_backoff_since(&self, key: &str, event: Instant, now: Instant) -> Option<Duration> {
        let entries = self.lock();
        let entry = entries.get(key)?;
        if event.saturating_duration_since(entry.last_event) > self.reset_after {
            return None;
        }
        (now.saturating_duration_since(event) < entry.delay).then_some(entry.delay)
    }

    /// The current delay if `now` is still inside the window opened by the key's last recorded
    /// event (the kubelet's `IsInBackOffSinceUpdate`, used for image pulls).
    pub fn in_backoff_since_update(&self, key: &str, now: Instant) -> Option<Duration> {
        let entries = self.lock();
        let entry = entries.get(key)?;
        (now.saturating_duration_since(entry.last_event) < entry.delay).then_some(entry.delay)
    }

    /// Records an event for `key` and returns the delay that now applies: the initial delay for a new
    /// or long-quiet key, otherwise double the previous one, capped.
    pub fn next(&self, key: &str, event: Instant) -> Duration {
        let mut entries = self.lock();
        let reset_after = self.reset_after;
        entries.retain(|_, e| event.saturating_duration_since(e.last_event) <= reset_after);
        let delay = match entries.get(key) {
            Some(entry) => (entry.delay * 2).min(self.max),
            None => self.initial,
        };
        entries.insert(
            key.to_owned(),
            Entry {
                delay,
                last_event: event,
            },
        );
        delay
    }

    /// Forgets every key starting with `prefix` (e.g. a deleted pod's uid).
    pub fn forget_prefix(&self, prefix: &str) {
        self.lock().retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn delay_doubles_up_to_the_cap() {
        let backoff = BackOff::default();
        let mut delays = Vec::new();
        for _ in 0..7 {
            delays.push(backoff.next("k", Instant::now()).as_secs());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn window_runs_from_the_event() {
        let backoff = BackOff::default();
        let exit = Instant::now();
        assert_eq!(backoff.in_backoff_since("k", exit, exit), None);
        backoff.next("k", exit);
        tokio::time::advance(Duration::from_secs(30)).await;
        let second_exit = Instant::now();
        assert_eq!(
            backoff.in_backoff_since("k", second_exit, Instant::now()),
            Some(INITIAL)
        );
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(
            backoff
                .in_backoff_since("k", second_exit, Instant::now())
                .is_some()
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            backoff.in_backoff_since("k", second_exit, Instant::now()),
            None
        );
        assert_eq!(
            backoff.next("k", second_exit),
            Duration::from_secs(20),
            "a second crash doubles the delay"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pull_window_runs_from_the_last_failure() {
        let backoff = BackOff::default();
        assert_eq!(backoff.in_backoff_since_update("img", Instant::now()), None);
        backoff.next("img", Instant::now());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(
            backoff.in_backoff_since_update("img", Instant::now()),
            Some(INITIAL)
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(backoff.in_backoff_since_update("img", Instant::now()), None);
    }

    /// The timeline of the e2e spec "should cap back-off at `MaxContainerBackOff`": a container
    /// that exits 5 s after each start, restarted at the cap. The window of each exit must last
    /// the full 5 minutes, though the exit recorded with the key is more than 5 minutes older.
    #[tokio::test(start_paused = true)]
    async fn at_the_cap_each_exit_waits_the_full_delay() {
        let backoff = BackOff::default();
        let mut exit = Instant::now();
        for _ in 0..6 {
            backoff.next("k", exit);
            exit += Duration::from_secs(1);
        }
        let run = Duration::from_secs(5);
        for _ in 0..3 {
            let restart_at = exit + MAX;
            assert_eq!(
                backoff.in_backoff_since("k", exit, restart_at - Duration::from_secs(1)),
                Some(MAX)
            );
            assert_eq!(backoff.in_backoff_since("k", exit, restart_at), None);
            assert_eq!(backoff.next("k", exit), MAX);
            exit = restart_at + run;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_quiet_key_starts_over() {
        let backoff = BackOff::default();
        backoff.next("k", Instant::now());
        backoff.next("k", Instant::now());
        tokio::time::advance(RESET_AFTER + Duration::from_secs(1)).await;
        assert_eq!(
            backoff.in_backoff_since("k", Instant::now(), Instant::now()),
            None
        );
        assert_eq!(backoff.next("k", Instant::now()), INITIAL);
    }

    #[tokio::test(start_paused = true)]
    async fn forget_prefix_drops_a_pods_keys() {
        let backoff = BackOff::default();
        backoff.next("u1/a", Instant::now());
        backoff.next("u2/a", Instant::now());
        backoff.forget_prefix("u1/");
        assert_eq!(backoff.next("u1/a", Instant::now()), INITIAL);
        assert_eq!(
            backoff.next("u2/a", Instant::now()),
            Duration::from_secs(20)
        );
    }
}
