//! Limits on image pulls (the kubelet's `pkg/kubelet/images/puller.go`, its serial and parallel
//! pullers, and `helpers.go`, `throttleImagePulling`): with `serializeImagePulls` one pull runs at a
//! time and the others wait their turn in order; without it at most `maxParallelImagePulls` run at
//! once (no limit when unset). A pull whose turn has come then needs a token of the
//! `registryPullQPS`/`registryBurst` bucket: without one it fails at once with the kubelet's
//! `pull QPS exceeded` (the container's `ErrImagePull`, then the pull back-off) instead of waiting.
//! `registryPullQPS` 0 means no rate limit.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::apis::config::ImagePullSettings;

/// Why a pull may not start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PullLimitError {
    /// The kubelet's message, which users match on in pod statuses and events.
    #[error("pull QPS exceeded")]
    QpsExceeded,
}

/// The rate limiter's clock: tokio's, so that tests with paused time drive the bucket.
#[derive(Debug, Clone)]
struct TokioClock {
    origin: Instant,
}

impl Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

type Bucket = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>;

/// The `registryPullQPS`/`registryBurst` token bucket.
enum Throttle {
    /// `registryPullQPS` 0.
    Unlimited,
    Bucket(Bucket),
    /// A QPS with `registryBurst` 0: the kubelet's token bucket then never holds a token.
    Empty,
}

impl Throttle {
    fn new(qps: u32, burst: u32) -> Self {
        let Some(qps) = NonZeroU32::new(qps) else {
            return Self::Unlimited;
        };
        let Some(burst) = NonZeroU32::new(burst) else {
            return Self::Empty;
        };
        let clock = TokioClock {
            origin: Instant::now(),
        };
        Self::Bucket(RateLimiter::direct_with_clock(
            Quota::per_second(qps).allow_burst(burst),
            clock,
        ))
    }

    fn try_accept(&self) -> bool {
        match self {
            Self::Unlimited => true,
            Self::Bucket(bucket) => bucket.check().is_ok(),
            Self::Empty => false,
        }
    }
}

/// Admits image pulls per the settings; shared by every pod worker's pulls.
pub struct ImagePuller {
    /// One permit per pull that may run at once; `None` without a limit. Tokio's semaphore is
    /// fair, so waiting pulls start in the order they asked, as the kubelet's serial queue does.
    slots: Option<Semaphore>,
    throttle: Throttle,
}

/// Held while a pull runs; dropping it lets the next pull start.
#[must_use = "the pull's slot is released when the permit is dropped"]
pub struct PullPermit<'a> {
    _slot: Option<SemaphorePermit<'a>>,
}

impl ImagePuller {
    pub fn new(settings: &ImagePullSettings) -> Self {
        let slots = if settings.serialize {
            Some(1)
        } else {
            settings.max_parallel.map(NonZeroU32::get)
        };
        Self {
            slots: slots.map(|n| Semaphore::new(usize::try_from(n).unwrap_or(usize::MAX))),
            throttle: Throttle::new(settings.registry_qps, settings.registry_burst),
        }
    }

    /// Waits for the pull's turn, then takes a token of the rate limit; fails without waiting
    /// when the bucket is empty.
    pub async fn admit(&self) -> Result<PullPermit<'_>, PullLimitError> {
        let slot = match &self.slots {
            // The semaphore is never closed, so acquiring only waits.
            Some(slots) => slots.acquire().await.ok(),
            None => None,
        };
        if self.throttle.try_accept() {
            Ok(PullPermit { _slot: slot })
        } else {
            Err(PullLimitError::QpsExceeded)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::pin::pin;
    use std::task::Poll;

    use futures::poll;

    use super::*;

    fn puller(serialize: bool, max_parallel: Option<u32>, qps: u32, burst: u32) -> ImagePuller {
        ImagePuller::new(&ImagePullSettings {
            serialize,
            max_parallel: max_parallel.and_then(NonZeroU32::new),
            registry_qps: qps,
            registry_burst: burst,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn serialized_pulls_run_one_at_a_time_in_order() {
        let puller = puller(true, None, 0, 10);
        let first = puller.admit().await.unwrap();
        let mut second = pin!(puller.admit());
        let mut third = pin!(puller.admit());
        assert!(poll!(&mut second).is_pending());
        assert!(poll!(&mut third).is_pending());
        drop(first);
        let Poll::Ready(second) = poll!(&mut second) else {
            panic!("the second pull starts when the first is done");
        };
        assert!(
            poll!(&mut third).is_pending(),
            "the third waits for the second"
        );
        drop(second);
        assert!(matches!(poll!(&mut third), Poll::Ready(Ok(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn parallel_pulls_are_limited_to_max_parallel_image_pulls() {
        let puller = puller(false, Some(2), 0, 10);
        let first = puller.admit().await.unwrap();
        let _second = puller.admit().await.unwrap();
        let mut third = pin!(puller.admit());
        assert!(poll!(&mut third).is_pending());
        drop(first);
        assert!(matches!(poll!(&mut third), Poll::Ready(Ok(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn parallel_pulls_without_a_maximum_all_run_at_once() {
        let puller = puller(false, None, 0, 10);
        let mut held = Vec::new();
        for _ in 0..50 {
            held.push(puller.admit().await.unwrap());
        }
        assert_eq!(held.len(), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pull_over_the_rate_fails_at_once_until_a_token_comes_back() {
        // 5 per second: a token every 200ms, at most 2 kept.
        let puller = puller(false, None, 5, 2);
        drop(puller.admit().await.unwrap());
        drop(puller.admit().await.unwrap());
        assert_eq!(
            puller.admit().await.err(),
            Some(PullLimitError::QpsExceeded)
        );
        assert_eq!(PullLimitError::QpsExceeded.to_string(), "pull QPS exceeded");
        tokio::time::advance(Duration::from_millis(199)).await;
        assert!(puller.admit().await.is_err());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(puller.admit().await.is_ok());
        assert!(puller.admit().await.is_err(), "one token came back");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(puller.admit().await.is_ok());
        assert!(puller.admit().await.is_ok());
        assert!(puller.admit().await.is_err(), "the burst caps the tokens");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_is_no_rate_limit_and_zero_burst_admits_nothing() {
        let unlimited = puller(false, None, 0, 1);
        for _ in 0..100 {
            assert!(unlimited.admit().await.is_ok());
        }
        let empty = puller(false, None, 5, 0);
        assert!(empty.admit().await.is_err());
        tokio::time::advance(Duration::from_mins(1)).await;
        assert!(empty.admit().await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_pull_takes_its_token_when_its_turn_comes() {
        let puller = puller(true, None, 1, 1);
        let first = puller.admit().await.unwrap();
        let mut second = pin!(puller.admit());
        assert!(poll!(&mut second).is_pending());
        // The bucket is empty while the first pull runs; the token is back by the time it ends.
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(first);
        assert!(matches!(poll!(&mut second), Poll::Ready(Ok(_))));
    }
}
