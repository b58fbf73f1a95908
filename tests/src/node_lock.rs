//! One node agent at a time on the lab's containerd. A kubelet (and ringlet) owns its runtime: it
//! stops every pod it does not know, so two agents on one containerd kill each other's pods, and two
//! ringlets contend for the eBPF pins. Every agent the tests and benches start holds this lock: an
//! exclusive `flock` on a file in the lab directory, taken (waiting if need be) before the agent
//! starts and released when it is gone. Agents of one process share it, so a test may run two.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};

use crate::LAB_DIR;

/// The lock file, next to the lab's containerd state.
const LOCK_FILE: &str = "node-agent.lock";

/// A share of the process's hold on the lock; the lock goes when the last share drops.
#[derive(Clone)]
pub struct NodeLock {
    _held: Arc<Flock<File>>,
}

static HELD: Mutex<Weak<Flock<File>>> = Mutex::new(Weak::new());

/// Takes the lock for this process, waiting while another process holds it.
pub fn node_lock() -> Result<NodeLock> {
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(existing) = held.upgrade() {
        return Ok(NodeLock { _held: existing });
    }
    std::fs::create_dir_all(LAB_DIR).with_context(|| format!("creating {LAB_DIR}"))?;
    let path = Path::new(LAB_DIR).join(LOCK_FILE);
    let open = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))
    };
    let locked = match Flock::lock(open()?, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((file, _)) => {
            eprintln!(
                "waiting for another node agent on the lab's containerd to finish ({})",
                path.display()
            );
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, errno)| errno)
                .with_context(|| format!("locking {}", path.display()))?
        }
    };
    let shared = Arc::new(locked);
    *held = Arc::downgrade(&shared);
    Ok(NodeLock { _held: shared })
}
