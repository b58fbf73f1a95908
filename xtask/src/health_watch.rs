//! A thread that reads an agent's health endpoint every second of a bench run (`/healthz/pleg` on
//! ringlet, `/healthz` on the upstream kubelet, whose PLEG check only shows in its node status and
//! log) and keeps every failed answer with what the bench was doing then.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::http;

/// How often the endpoint is read.
pub const HEALTH_POLL: Duration = Duration::from_secs(1);

/// A failed read (answered, not 200) while the watcher was on.
#[derive(Serialize, Deserialize)]
pub struct HealthFailure {
    /// Which run it happened in (a PLEG mode, an agent and pod count).
    pub mode: String,
    /// What the bench was doing (e.g. `starting 1000 pods`).
    pub phase: String,
    pub status: u16,
}

/// What the health watcher saw.
#[derive(Default)]
pub struct HealthLog {
    pub checks: u64,
    /// Reads that got no answer within the HTTP timeout (the agent busy).
    pub unanswered: u64,
    pub failures: Vec<HealthFailure>,
}

impl HealthLog {
    pub fn add(&mut self, other: Self) {
        self.checks += other.checks;
        self.unanswered += other.unanswered;
        self.failures.extend(other.failures);
    }
}

/// Reads `path` on `port` every [`HEALTH_POLL`] and records each failure with the phase of the
/// bench it happened in; paused while the agent is stopped on purpose.
pub struct HealthWatcher {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    phase: Arc<Mutex<String>>,
    handle: JoinHandle<HealthLog>,
}

impl HealthWatcher {
    pub fn start(port: u16, path: &'static str, run: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(Mutex::new("starting".to_owned()));
        let handle = {
            let (stop, paused, phase) = (stop.clone(), paused.clone(), phase.clone());
            std::thread::spawn(move || {
                let mut log = HealthLog::default();
                while !stop.load(Ordering::Relaxed) {
                    if !paused.load(Ordering::Relaxed) {
                        log.checks += 1;
                        match http::status(port, path) {
                            Ok(200) => {}
                            Ok(status) => {
                                let phase = phase.lock().map(|p| p.clone()).unwrap_or_default();
                                println!("{path} answered {status} while {phase}");
                                log.failures.push(HealthFailure {
                                    mode: run.clone(),
                                    phase,
                                    status,
                                });
                            }
                            Err(_) => log.unanswered += 1,
                        }
                    }
                    std::thread::sleep(HEALTH_POLL);
                }
                log
            })
        };
        Self {
            stop,
            paused,
            phase,
            handle,
        }
    }

    pub fn set_phase(&self, phase: String) {
        if let Ok(mut current) = self.phase.lock() {
            *current = phase;
        }
    }

    /// Pauses the watcher until the guard is dropped.
    pub fn pause(&self) -> Paused<'_> {
        self.paused.store(true, Ordering::Relaxed);
        Paused(&self.paused)
    }

    pub fn stop(self) -> HealthLog {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// The watcher paused until this is dropped.
pub struct Paused<'a>(&'a AtomicBool);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}
