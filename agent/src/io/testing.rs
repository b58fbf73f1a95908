//! Test support: one test body run on each engine, inside that engine's [`block_on`], so every
//! test of I/O-carrying code covers both the `io_uring` and the epoll path.

use std::future::Future;

use super::{IoEngine, block_on};

/// How a test's clock runs.
#[derive(Clone, Copy)]
pub(crate) enum Clock {
    /// Paused and auto-advancing, as `#[tokio::test(start_paused = true)]`.
    Paused,
    Real,
}

/// Runs one test body inside `block_on` of `engine`.
pub(crate) fn run_on<F: Future<Output = ()>>(
    engine: IoEngine,
    clock: Clock,
    test: impl FnOnce(IoEngine) -> F,
) {
    block_on(engine, async move {
        if let Clock::Paused = clock {
            tokio::time::pause();
        }
        test(engine).await;
    })
    .unwrap();
}

/// Declares a `#[test]` per engine (`uring::<name>`, `epoll::<name>`) for every listed
/// `async fn <name>(engine: IoEngine)`, grouped by the clock they run with.
macro_rules! on_both_engines {
    ($($clock:ident: [$($name:ident),* $(,)?]),* $(,)?) => {
        $crate::io::testing::on_both_engines!(@engine uring Uring $($clock [$($name)*])*);
        $crate::io::testing::on_both_engines!(@engine epoll Epoll $($clock [$($name)*])*);
    };
    (@engine $module:ident $engine:ident $($clock:ident [$($name:ident)*])*) => {
        mod $module {
            $($(
                #[test]
                fn $name() {
                    $crate::io::testing::run_on(
                        $crate::io::IoEngine::$engine,
                        $crate::io::testing::Clock::$clock,
                        super::$name,
                    );
                }
            )*)*
        }
    };
}
pub(crate) use on_both_engines;
