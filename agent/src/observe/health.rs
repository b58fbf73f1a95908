//! Observe mode's health, served on `/healthz`: healthy (200 `ok`) once the BPF programs are
//! attached and the first CRI list succeeded. A source that cannot read the kubelet's reports does
//! not make it unhealthy (the kubelet being down is not observe mode's illness, and a liveness probe
//! restarting it would not help); its problem shows on `/healthz?verbose` and in
//! `ringlet_observed_source_errors_total`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use super::args::SourceKind;

#[derive(Debug, Default)]
pub struct Health {
    ebpf_attached: AtomicBool,
    cri_listed: AtomicBool,
    /// Each source's last problem; `None` once it read successfully.
    sources: Mutex<BTreeMap<SourceKind, Option<String>>>,
}

impl Health {
    pub fn ebpf_attached(&self) {
        self.ebpf_attached.store(true, Ordering::Relaxed);
    }

    pub fn cri_listed(&self) {
        self.cri_listed.store(true, Ordering::Relaxed);
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, BTreeMap<SourceKind, Option<String>>> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn source_ok(&self, source: SourceKind) {
        self.sources().insert(source, None);
    }

    pub fn source_failed(&self, source: SourceKind, problem: String) {
        self.sources().insert(source, Some(problem));
    }

    pub fn is_healthy(&self) -> bool {
        self.ebpf_attached.load(Ordering::Relaxed) && self.cri_listed.load(Ordering::Relaxed)
    }

    /// `ok`, or with `verbose` one `[+]`/`[-]` line per check (the kubelet's `/healthz?verbose`
    /// style) and a `[!]` line per source with a problem.
    pub fn render(&self, verbose: bool) -> String {
        if !verbose {
            return if self.is_healthy() { "ok" } else { "not ready" }.to_owned();
        }
        let mut text = String::new();
        let mark = |ok: bool| if ok { "[+]" } else { "[-]" };
        let ebpf = self.ebpf_attached.load(Ordering::Relaxed);
        let cri = self.cri_listed.load(Ordering::Relaxed);
        let _ = writeln!(
            text,
            "{}ebpf {}",
            mark(ebpf),
            if ebpf { "ok" } else { "not attached" }
        );
        let _ = writeln!(
            text,
            "{}cri {}",
            mark(cri),
            if cri { "ok" } else { "not listed yet" }
        );
        for (source, problem) in self.sources().iter() {
            match problem {
                None => {
                    let _ = writeln!(text, "[+]{} ok", source.label());
                }
                Some(problem) => {
                    let _ = writeln!(text, "[!]{} {problem}", source.label());
                }
            }
        }
        text.push_str(if self.is_healthy() {
            "healthz check passed\n"
        } else {
            "healthz check failed\n"
        });
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_source_shows_but_does_not_fail_health() {
        let health = Health::default();
        assert!(!health.is_healthy());
        health.ebpf_attached();
        health.cri_listed();
        health.source_failed(SourceKind::KubeletPods, "connection refused".to_owned());
        assert!(health.is_healthy());
        assert_eq!(health.render(false), "ok");
        assert!(
            health
                .render(true)
                .contains("[!]kubelet_pods connection refused")
        );
    }
}
