//! What a conformance run found: ginkgo's JSON report read into one record per spec that was
//! selected (its full name, state, and the first line of its failure or skip reason), and the
//! results file `bench/results/conformance.{json,md}` that puts each agent's record of every spec
//! side by side, one section per suite, with the totals and the specs where the two differ.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// One spec's outcome on one agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// ginkgo's state: `passed`, `failed`, `skipped`, `timedout`, `panicked`, `interrupted`, ...
    pub state: String,
    /// The first line of the failure (or runtime skip) message; empty when it passed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Seconds the spec ran.
    pub seconds: f64,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.state == "passed"
    }
}

/// The specs of one run on one agent, by full name.
pub type Outcomes = BTreeMap<String, Outcome>;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SuiteReport {
    #[serde(default)]
    spec_reports: Vec<SpecReport>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SpecReport {
    #[serde(default)]
    container_hierarchy_texts: Option<Vec<String>>,
    #[serde(default)]
    leaf_node_text: String,
    #[serde(default)]
    leaf_node_type: String,
    state: String,
    #[serde(default)]
    run_time: i64,
    #[serde(default)]
    failure: Option<Failure>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Failure {
    #[serde(default)]
    message: String,
}

/// A spec's full name as ginkgo's `--focus` matches it: its containers' texts and its own, joined
/// by spaces.
pub fn full_name(containers: &[String], leaf: &str) -> String {
    let mut parts: Vec<&str> = containers.iter().map(String::as_str).collect();
    parts.push(leaf);
    parts.join(" ")
}

/// Reads ginkgo's `--json-report` output: every `It` that was selected. A spec left out by the
/// focus is reported `skipped` without a reason; one skipped while it ran (the framework found
/// the cluster lacks something) carries its reason and is kept.
pub fn parse_ginkgo_report(json: &str) -> Result<Outcomes> {
    let suites: Vec<SuiteReport> =
        serde_json::from_str(json).context("parsing ginkgo's JSON report")?;
    let mut outcomes = Outcomes::new();
    for spec in suites.into_iter().flat_map(|s| s.spec_reports) {
        if spec.leaf_node_type != "It" {
            continue;
        }
        let message = spec
            .failure
            .map(|f| first_line(&f.message))
            .unwrap_or_default();
        if spec.state == "skipped" && message.is_empty() {
            continue;
        }
        let name = full_name(
            spec.container_hierarchy_texts
                .as_deref()
                .unwrap_or_default(),
            &spec.leaf_node_text,
        );
        #[allow(clippy::cast_precision_loss, reason = "nanoseconds of a test run")]
        let seconds = (spec.run_time as f64 / 1e9 * 10.0).round() / 10.0;
        outcomes.insert(
            name,
            Outcome {
                state: spec.state,
                message,
                seconds,
            },
        );
    }
    Ok(outcomes)
}

/// The first non-empty line of a message, cut at 300 characters.
fn first_line(message: &str) -> String {
    const MAX: usize = 300;
    let line = message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// How one agent's run of a section went.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentRun {
    /// `ringlet <commit> (<profile> build)` or the kubelet's `--version`.
    pub version: String,
    /// When the run started (UTC).
    pub started: String,
    pub minutes: f64,
    pub procs: u32,
}

/// One suite's results: how it selected its specs, each agent's run, and every spec.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Section {
    pub title: String,
    pub focus: Vec<String>,
    pub skip: Vec<String>,
    pub runs: BTreeMap<String, AgentRun>,
    /// Spec name → agent → outcome.
    pub specs: BTreeMap<String, BTreeMap<String, Outcome>>,
}

impl Section {
    /// Puts `agent`'s run into the section, replacing its earlier outcomes.
    pub fn record(&mut self, agent: &str, run: AgentRun, outcomes: Outcomes) {
        for by_agent in self.specs.values_mut() {
            by_agent.remove(agent);
        }
        self.specs.retain(|_, by_agent| !by_agent.is_empty());
        for (name, outcome) in outcomes {
            self.specs
                .entry(name)
                .or_default()
                .insert(agent.to_owned(), outcome);
        }
        self.runs.insert(agent.to_owned(), run);
    }

    /// How many specs `agent` passed, and how many it ran.
    pub fn totals(&self, agent: &str) -> (usize, usize) {
        let mut passed = 0;
        let mut ran = 0;
        for outcome in self.specs.values().filter_map(|a| a.get(agent)) {
            ran += 1;
            passed += usize::from(outcome.passed());
        }
        (passed, ran)
    }

    /// The specs that `reference` passed and `agent` did not.
    pub fn gap(&self, agent: &str, reference: &str) -> Vec<(&str, Option<&Outcome>)> {
        self.specs
            .iter()
            .filter(|(_, by_agent)| {
                by_agent.get(reference).is_some_and(Outcome::passed)
                    && !by_agent.get(agent).is_some_and(Outcome::passed)
            })
            .map(|(name, by_agent)| (name.as_str(), by_agent.get(agent)))
            .collect()
    }
}

/// The whole results file: sections by suite name.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub e2e_version: String,
    pub machine: String,
    pub sections: BTreeMap<String, Section>,
}

/// Why a spec fails on any agent on this machine, for the specs where that is known: the suite
/// needs something this lab does not have. Matched against the spec's full name.
pub const MACHINE_REASONS: &[(&str, &str)] = &[
    (
        "PrivilegedPod [NodeConformance] should enable privileged commands",
        "the spec adds a `dummy` network link, and this VM's kernel has no dummy driver \
         (`ip link add dummy1 type dummy`: Operation not supported)",
    ),
    (
        "when running a container with a new image [Serial] should be able to pull image ",
        "the spec pulls `registry.k8s.io/e2e-test-images/agnhost:2.63.0` with \
         `imagePullPolicy: Always`, and this machine cannot resolve registry.k8s.io \
         (`dial tcp: lookup registry.k8s.io: no such host`): the image imported by the harness \
         does not count under Always",
    ),
    (
        "when running a container with a new image [Serial] should be able to pull from private \
         registry with secret",
        "the spec pulls `localhost:5000/pause:testing` (`Always`, with the pull secret) from the \
         registry it runs in an agnhost pod (`fake-registry-server --private`), which serves the \
         image files the real agnhost image carries in `/var/registry`, downloaded from \
         registry.k8s.io when that image is built; the harness's agnhost stand-in has none and this \
         machine cannot reach registry.k8s.io to make them, so the pull ends in `not found`",
    ),
    (
        "ImageVolume should succeed with pod and pull policy of Always",
        "the image volume is `registry.k8s.io/e2e-test-images/kitten:1.8` with `pullPolicy: \
         Always`, and this machine cannot resolve registry.k8s.io \
         (`dial tcp: lookup registry.k8s.io: no such host`)",
    ),
];

/// The known machine reason for `spec`, if any.
pub fn machine_reason(spec: &str) -> Option<&'static str> {
    MACHINE_REASONS
        .iter()
        .find(|(pattern, _)| spec.contains(pattern))
        .map(|(_, reason)| *reason)
}

fn outcome_cell(outcome: Option<&Outcome>) -> String {
    match outcome {
        None => "—".to_owned(),
        Some(o) if o.passed() => "passed".to_owned(),
        Some(o) => format!("**{}**", o.state),
    }
}

/// Escapes what would break a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The results as Markdown: per section, the totals per agent, the gap (specs the kubelet passed
/// and ringlet did not), the specs that failed on both with the reason where it is known, and
/// every spec.
pub fn markdown(results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Kubernetes e2e conformance: ringlet and the upstream kubelet\n\n\
         e2e suite {}, one node (`localhost`) on this machine: {}.\n\
         Produced by `cargo xtask conformance`; each section says how its specs were selected.\n",
        results.e2e_version, results.machine
    );
    for (name, section) in &results.sections {
        section_markdown(&mut out, name, section);
    }
    out
}

fn section_markdown(out: &mut String, name: &str, section: &Section) {
    let _ = writeln!(out, "## {} (`--suite {name}`)\n", section.title);
    let _ = writeln!(
        out,
        "Focus `{}`, skip `{}`.\n",
        section.focus.join("` or `"),
        section.skip.join("` or `")
    );
    let _ = writeln!(
        out,
        "| agent | passed | of | version | started | minutes | procs |\n|---|---:|---:|---|---|---:|---:|"
    );
    for (agent, run) in &section.runs {
        let (passed, ran) = section.totals(agent);
        let _ = writeln!(
            out,
            "| {agent} | {passed} | {ran} | {} | {} | {:.1} | {} |",
            cell(&run.version),
            run.started,
            run.minutes,
            run.procs
        );
    }
    if section.runs.contains_key("ringlet") && section.runs.contains_key("kubelet") {
        gap_table(out, section, "ringlet", "kubelet", true);
        gap_table(out, section, "kubelet", "ringlet", false);
    }
    not_passed_table(out, section);
    every_spec_table(out, section);
}

/// The specs `reference` passed and `agent` did not, with `agent`'s failure; the table is left
/// out when there are none unless `always`.
fn gap_table(out: &mut String, section: &Section, agent: &str, reference: &str, always: bool) {
    let gap = section.gap(agent, reference);
    if gap.is_empty() && !always {
        return;
    }
    let _ = writeln!(
        out,
        "\n### Passed by {reference}, not by {agent}: {}\n",
        gap.len()
    );
    if gap.is_empty() {
        return;
    }
    let _ = writeln!(out, "| spec | {agent} | failure |\n|---|---|---|");
    for (spec, outcome) in gap {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            cell(spec),
            outcome_cell(outcome),
            cell(outcome.map_or("", |o| o.message.as_str()))
        );
    }
}

/// The specs no agent passed, with this machine's reason where it is known, else each agent's
/// failure.
fn not_passed_table(out: &mut String, section: &Section) {
    let not_passed: Vec<(&String, &BTreeMap<String, Outcome>)> = section
        .specs
        .iter()
        .filter(|(_, by_agent)| !by_agent.values().any(Outcome::passed))
        .collect();
    let _ = writeln!(
        out,
        "\n### Passed by no agent: {}\n\nWhy, where it is known to be this machine's doing; else each agent's failure.\n",
        not_passed.len()
    );
    if not_passed.is_empty() {
        return;
    }
    let _ = writeln!(out, "| spec | why |\n|---|---|");
    for (spec, by_agent) in not_passed {
        let why = machine_reason(spec).map_or_else(
            || {
                by_agent
                    .iter()
                    .map(|(agent, o)| format!("{agent}: {} {}", o.state, o.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
            |reason| format!("this machine: {reason}"),
        );
        let _ = writeln!(out, "| {} | {} |", cell(spec), cell(&why));
    }
}

fn every_spec_table(out: &mut String, section: &Section) {
    let agents: Vec<&str> = section.runs.keys().map(String::as_str).collect();
    let _ = writeln!(out, "\n### Every spec\n");
    let _ = writeln!(
        out,
        "| spec | {} |\n|---|{}",
        agents.join(" | "),
        "---|".repeat(agents.len())
    );
    for (spec, by_agent) in &section.specs {
        let cells: Vec<String> = agents
            .iter()
            .map(|agent| outcome_cell(by_agent.get(*agent)))
            .collect();
        let _ = writeln!(out, "| {} | {} |", cell(spec), cells.join(" | "));
    }
    out.push('\n');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const REPORT: &str = r#"[{"SpecReports": [
        {"ContainerHierarchyTexts": ["[sig-node] Pods"], "LeafNodeText": "should get a host IP [NodeConformance]",
         "LeafNodeType": "It", "State": "passed", "RunTime": 12340000000},
        {"ContainerHierarchyTexts": ["[sig-node] Pods", "when x"], "LeafNodeText": "should fail",
         "LeafNodeType": "It", "State": "failed", "RunTime": 5000000000,
         "Failure": {"Message": "\n  expected 1\nto equal 2"}},
        {"ContainerHierarchyTexts": ["[sig-storage] Other"], "LeafNodeText": "not selected",
         "LeafNodeType": "It", "State": "skipped", "RunTime": 0},
        {"ContainerHierarchyTexts": ["[sig-node] Sysctls"], "LeafNodeText": "skipped at run time",
         "LeafNodeType": "It", "State": "skipped", "RunTime": 1000000,
         "Failure": {"Message": "Only supported for providers [gce]"}},
        {"ContainerHierarchyTexts": null, "LeafNodeText": "", "LeafNodeType": "SynchronizedBeforeSuite",
         "State": "passed", "RunTime": 1}
    ]}]"#;

    #[test]
    fn the_report_keeps_selected_specs_with_their_first_failure_line() {
        let outcomes = parse_ginkgo_report(REPORT).unwrap();
        let names: Vec<&str> = outcomes.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "[sig-node] Pods should get a host IP [NodeConformance]",
                "[sig-node] Pods when x should fail",
                "[sig-node] Sysctls skipped at run time",
            ]
        );
        let failed = &outcomes["[sig-node] Pods when x should fail"];
        assert_eq!(failed.state, "failed");
        assert_eq!(failed.message, "expected 1");
        assert!((failed.seconds - 5.0).abs() < f64::EPSILON);
        let passed = &outcomes["[sig-node] Pods should get a host IP [NodeConformance]"];
        assert!(passed.passed() && passed.message.is_empty());
        assert!((passed.seconds - 12.3).abs() < f64::EPSILON);
    }

    #[test]
    fn a_broken_report_is_an_error_that_says_so() {
        let err = parse_ginkgo_report("{").unwrap_err();
        assert!(format!("{err:#}").contains("ginkgo's JSON report"));
    }

    fn outcome(state: &str) -> Outcome {
        Outcome {
            state: state.to_owned(),
            message: if state == "passed" {
                String::new()
            } else {
                format!("it {state}")
            },
            seconds: 1.0,
        }
    }

    fn run() -> AgentRun {
        AgentRun {
            version: "v".to_owned(),
            started: "t".to_owned(),
            minutes: 1.0,
            procs: 6,
        }
    }

    #[test]
    fn a_section_counts_each_agent_and_shows_the_gap_both_ways() {
        let mut section = Section::default();
        let kubelet: Outcomes = [
            ("a".to_owned(), outcome("passed")),
            ("b".to_owned(), outcome("passed")),
            ("c".to_owned(), outcome("failed")),
            ("d".to_owned(), outcome("failed")),
        ]
        .into();
        let ringlet: Outcomes = [
            ("a".to_owned(), outcome("passed")),
            ("b".to_owned(), outcome("failed")),
            ("c".to_owned(), outcome("passed")),
            ("d".to_owned(), outcome("timedout")),
        ]
        .into();
        section.record("kubelet", run(), kubelet);
        section.record("ringlet", run(), ringlet);
        assert_eq!(section.totals("kubelet"), (2, 4));
        assert_eq!(section.totals("ringlet"), (2, 4));
        let gap = section.gap("ringlet", "kubelet");
        assert_eq!(gap.len(), 1);
        assert_eq!(gap[0].0, "b");
        assert_eq!(gap[0].1.unwrap().message, "it failed");
        let reverse: Vec<&str> = section
            .gap("kubelet", "ringlet")
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(reverse, ["c"]);
        let md = markdown(&Results {
            e2e_version: "v1.36.2".to_owned(),
            machine: "m".to_owned(),
            sections: [("node".to_owned(), section)].into(),
        });
        assert!(md.contains("### Passed by kubelet, not by ringlet: 1"));
        assert!(md.contains("| b | **failed** | it failed |"));
        assert!(md.contains("### Passed by ringlet, not by kubelet: 1"));
        assert!(md.contains("### Passed by no agent: 1"));
        assert!(md.contains("| kubelet | 2 | 4 |"));
    }

    #[test]
    fn recording_an_agent_again_replaces_only_its_outcomes() {
        let mut section = Section::default();
        section.record(
            "kubelet",
            run(),
            [("a".to_owned(), outcome("passed"))].into(),
        );
        section.record(
            "ringlet",
            run(),
            [
                ("a".to_owned(), outcome("failed")),
                ("z".to_owned(), outcome("failed")),
            ]
            .into(),
        );
        section.record(
            "ringlet",
            run(),
            [("a".to_owned(), outcome("passed"))].into(),
        );
        assert_eq!(section.totals("ringlet"), (1, 1));
        assert!(!section.specs.contains_key("z"), "a spec no agent ran goes");
        assert!(section.specs["a"].contains_key("kubelet"));
    }

    #[test]
    fn image_pulls_this_machine_cannot_do_have_their_reason_and_their_siblings_none() {
        let runtime = "[sig-node] Container Runtime blackbox test when running a container with \
                       a new image [Serial] ";
        for (spec, image) in [
            (
                format!("{runtime}should be able to pull image [NodeConformance]"),
                "agnhost:2.63.0",
            ),
            (
                format!(
                    "{runtime}should be able to pull from private registry with secret \
                     [NodeConformance]"
                ),
                "localhost:5000/pause:testing",
            ),
            (
                "[sig-node] ImageVolume should succeed with pod and pull policy of Always \
                 [LinuxOnly] [MinimumKubeletVersion:1.35] [Conformance]"
                    .to_owned(),
                "kitten:1.8",
            ),
        ] {
            let reason = machine_reason(&spec).unwrap_or_default();
            assert!(reason.contains(image), "{spec}: {reason:?}");
        }
        for passes in [
            "should not be able to pull image from invalid registry [NodeConformance]",
            "should not be able to pull from private registry without secret [NodeConformance]",
        ] {
            assert_eq!(
                machine_reason(&format!("{runtime}{passes}")),
                None,
                "{passes}"
            );
        }
    }

    #[test]
    fn long_messages_are_cut_and_pipes_escaped() {
        let long = "x".repeat(400);
        assert_eq!(first_line(&long).chars().count(), 301);
        assert_eq!(cell("a|b\nc"), "a\\|b c");
    }
}
