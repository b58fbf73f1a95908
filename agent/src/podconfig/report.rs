//! Reporting of bad manifests without flooding: sources rescan every few seconds, so a problem is
//! logged and recorded as an event only when it is new (absent from the previous scan), not on every
//! rescan. Corresponds to the event recording in the kubelet's `pkg/kubelet/config` sources.

use std::collections::HashSet;

use crate::events::{EventObject, EventType, Recorder};

/// Something wrong with one manifest, found during one scan.
#[derive(Clone, Debug)]
pub(super) struct Problem {
    /// The object of the event, e.g. `file//etc/kubernetes/manifests/web.yaml`.
    pub object: String,
    pub reason: &'static str,
    pub message: String,
    /// What makes this problem "the same" as one reported before, e.g. a digest of the file
    /// content, so an edited file that is still broken is reported again.
    pub identity: String,
}

pub(super) struct Reporter {
    recorder: Recorder,
    previous: HashSet<(String, String, String)>,
}

impl Reporter {
    pub(super) fn new(recorder: Recorder) -> Self {
        Self {
            recorder,
            previous: HashSet::new(),
        }
    }

    /// Reports the problems of a finished scan that were not there in the previous one.
    pub(super) fn finish_scan(&mut self, problems: Vec<Problem>) {
        let mut current = HashSet::with_capacity(problems.len());
        for problem in problems {
            let key = (problem.object, problem.message, problem.identity);
            if !self.previous.contains(&key) && !current.contains(&key) {
                self.recorder.event(
                    EventType::Warning,
                    EventObject::local(key.0.as_str()),
                    problem.reason,
                    key.1.as_str(),
                );
            }
            current.insert(key);
        }
        self.previous = current;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(object: &str, identity: &str) -> Problem {
        Problem {
            object: object.to_owned(),
            reason: "R",
            message: "broken".to_owned(),
            identity: identity.to_owned(),
        }
    }

    #[test]
    fn a_problem_is_reported_once_until_it_goes_away_or_changes() {
        let recorder = Recorder::new(None);
        let mut reporter = Reporter::new(recorder.clone());
        reporter.finish_scan(vec![problem("file/a", "1")]);
        reporter.finish_scan(vec![problem("file/a", "1")]);
        assert_eq!(recorder.recent().len(), 1);
        reporter.finish_scan(vec![problem("file/a", "2")]);
        assert_eq!(recorder.recent().len(), 2);
        reporter.finish_scan(vec![]);
        reporter.finish_scan(vec![problem("file/a", "2")]);
        assert_eq!(recorder.recent().len(), 3);
    }
}
