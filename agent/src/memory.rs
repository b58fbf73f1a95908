//! The agent's heap and the kernel. glibc's malloc gives every thread that allocates an arena of
//! its own, up to eight per core, and keeps the pages the agent frees (the state of a pod that
//! went, the burst of work while hundreds of pods start) instead of handing them back. With 500
//! pods on a 2-core machine that was 113 MiB resident (`cargo xtask bench density`): the tokio
//! blocking pool's threads (cgroup and file work) had made sixteen arenas. The agent caps the
//! arenas when it starts and hands free pages back to the kernel periodically: 54 MiB for the
//! same pods. Its allocations happen on one async thread plus short blocking calls, so two arenas
//! cost no contention that matters.
//!
//! It also fixes the size from which malloc maps a block of its own. glibc raises that size to the
//! largest mapped block freed so far; loading the eBPF programs parses the kernel's BTF into
//! vectors of about 9 MiB and frees them, after which every block below 9 MiB came from the heap
//! and left it fragmented. Fixed at 1 MiB, the anonymous memory of the agent with 100 pods fell by
//! about 0.5 MiB. glibc's starting value, 128 KiB, saved as much but mapped and unmapped the
//! buffer of every `/pods` answer above 75 pods (170 KiB at 100), page faults included.

use std::time::Duration;

use tokio::time::MissedTickBehavior;

/// How many malloc arenas glibc may create.
pub const MALLOC_ARENAS: libc::c_int = 2;

/// Blocks of at least this many bytes get a mapping of their own, which goes back to the kernel
/// when they are freed.
pub const MMAP_THRESHOLD_BYTES: libc::c_int = 1024 * 1024;

/// How often free heap pages go back to the kernel.
pub const TRIM_PERIOD: Duration = Duration::from_secs(30);

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`] and fixes its mapping threshold at
/// [`MMAP_THRESHOLD_BYTES`]; call it before any thread is started.
pub fn tune_malloc() {
    crate::sys::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    crate::sys::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
}

/// Every [`TRIM_PERIOD`], hands the free pages of every arena back to the kernel (`malloc_trim`),
/// on a blocking thread: it walks the heap, and the async core must not wait for it. Runs until
/// dropped.
pub async fn release_free_pages_periodically() {
    let mut ticks = tokio::time::interval(TRIM_PERIOD);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let trimmed = tokio::task::spawn_blocking(crate::sys::malloc_trim).await;
        if let Err(err) = trimmed {
            tracing::debug!(%err, "malloc_trim did not run");
        }
    }
}
