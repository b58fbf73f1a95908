//! The agent's heap and the kernel. glibc's malloc gives every thread that allocates an arena of
//! its own, up to eight per core, and keeps the pages the agent frees (the state of a pod that
//! went, the burst of work while hundreds of pods start) instead of handing them back. With 500
//! pods on a 2-core machine that was 113 MiB resident (`cargo xtask bench density`): the tokio
//! blocking pool's threads (cgroup and file work) had made sixteen arenas. The agent caps the
//! arenas when it starts and hands free pages back to the kernel periodically: 54 MiB for the
//! same pods. Its allocations happen on one async thread plus short blocking calls, so two arenas
//! cost no contention that matters.

use std::time::Duration;

use tokio::time::MissedTickBehavior;

/// How many malloc arenas glibc may create.
pub const MALLOC_ARENAS: libc::c_int = 2;

/// How often free heap pages go back to the kernel.
pub const TRIM_PERIOD: Duration = Duration::from_secs(30);

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]; call it before any thread is started.
pub fn limit_malloc_arenas() {
    // SAFETY: mallopt only changes the allocator's parameters; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Every [`TRIM_PERIOD`], hands the free pages of every arena back to the kernel (`malloc_trim`),
/// on a blocking thread: it walks the heap, and the async core must not wait for it. Runs until
/// dropped.
pub async fn release_free_pages_periodically() {
    let mut ticks = tokio::time::interval(TRIM_PERIOD);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // SAFETY: malloc_trim takes no pointers and only gives free memory back to the kernel.
        let trimmed = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
        if let Err(err) = trimmed {
            tracing::debug!(%err, "malloc_trim did not run");
        }
    }
}
