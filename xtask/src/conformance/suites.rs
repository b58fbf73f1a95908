//! Which e2e specs a conformance run selects: the `[NodeConformance]` specs that run in parallel
//! (the node suite), the rest of the node's conformance that one node of this control plane can
//! run (the `[Serial]` and `[Slow]` node specs and the `[sig-node]`/`[sig-storage]`
//! `[Conformance]` specs not already in the node suite), and the fixed subset CI runs.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use super::report;
use crate::cmd;

/// The spec sets `cargo xtask conformance --suite` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    /// `[NodeConformance]` without `[Serial]`, `[Disruptive]`, `[Flaky]`, `[Slow]` and feature
    /// specs: the 236 specs of the kubelet's own conformance run.
    Node,
    /// The `[Serial]` and `[Slow]` `[NodeConformance]` specs and the `[sig-node]` and
    /// `[sig-storage]` `[Conformance]` specs outside the node suite (no `[Disruptive]`, `[Flaky]`
    /// or feature specs).
    Broader,
    /// A fixed subset of the node suite for CI: pods, probes, hooks, volumes, init containers,
    /// security contexts.
    Ci,
}

impl Suite {
    pub fn name(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Broader => "broader",
            Self::Ci => "ci",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::Node => "Node conformance (parallel)",
            Self::Broader => {
                "The rest of the node's conformance: [Serial], [Slow], sig-node and sig-storage [Conformance]"
            }
            Self::Ci => "The CI subset",
        }
    }
}

/// What ginkgo is told to run: any `focus` matches select a spec, any `skip` match drops it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub focus: Vec<String>,
    pub skip: Vec<String>,
}

const NODE_FOCUS: &str = r"\[NodeConformance\]";
const NODE_SKIP: &str = r"\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Slow\]|\[Feature:";
/// ginkgo matches a focus against the suite's description and the spec's full name ("Kubernetes
/// e2e suite [sig-node] ..."), so a SIG's tag is not at the start of the text.
const BROADER_FOCUS: &[&str] = &[
    r"\[NodeConformance\]",
    r"\[sig-node\] .*\[Conformance\]",
    r"\[sig-storage\] .*\[Conformance\]",
];
const BROADER_SKIP: &str = r"\[Disruptive\]|\[Flaky\]|\[Feature:";

/// The CI subset: specs across what a node agent does (pods, probes, hooks, init containers,
/// security contexts, volumes), all of them passed by ringlet on this machine. Each is a fragment
/// of a spec's full name.
pub const CI_SPECS: &[&str] = &[
    "[sig-node] Pods should be submitted and removed",
    "[sig-node] Pods should get a host IP",
    "[sig-node] Pods should be updated",
    "[sig-node] Pods should support remote command execution over websockets",
    "[sig-node] Pods should support retrieving logs from the container over websockets",
    "[sig-node] Pods should contain environment variables for services",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs",
    "[sig-node] Containers should be able to override the image's default command and arguments",
    "[sig-node] Container Runtime blackbox test on terminated container should report termination message from log output if TerminationMessagePolicy FallbackToLogsOnError is set",
    "[sig-node] Probing container should be restarted with a exec \"cat /tmp/health\" liveness probe",
    "[sig-node] Probing container should *not* be restarted with a /healthz http liveness probe",
    "[sig-node] Probing container with readiness probe should not be ready before initial delay and never restart",
    "[sig-node] Probing container should be restarted startup probe fails",
    "[sig-node] Lifecycle Sleep Hook [NodeConformance] when create a pod with lifecycle hook using sleep action valid prestop hook using sleep action",
    "[sig-node] Probing container should be restarted with a GRPC liveness probe",
    "[sig-node] InitContainer [NodeConformance] should invoke init containers on a RestartNever pod",
    "[sig-node] InitContainer [NodeConformance] should invoke init containers on a RestartAlways pod",
    "[sig-node] RuntimeClass should schedule a Pod requesting a RuntimeClass and initialize its Overhead",
    "[sig-node] Container Runtime blackbox test when starting a container that exits should run with the expected status",
    "[sig-node] Security Context When creating a container with runAsUser should run the container with uid 65534",
    "[sig-node] Security Context When creating a container with runAsNonRoot [NodeConformance] should run with an image specified user ID",
    "[sig-node] Security Context When creating a pod with readOnlyRootFilesystem should run the container with readonly rootfs when readOnlyRootFilesystem=true",
    "[sig-node] Sysctls [LinuxOnly] [NodeConformance] should support sysctls",
    "[sig-node] Secrets should be consumable via the environment",
    "[sig-node] Downward API should provide pod name, namespace and IP address as env vars",
    "[sig-node] Variable Expansion should allow substituting values in a container's command",
    "[sig-storage] ConfigMap updates should be reflected in volume",
    "[sig-storage] Secrets should be consumable from pods in volume with mappings and Item Mode set",
    "[sig-storage] Projected combined should project all components that make up the projection API",
    "[sig-storage] EmptyDir volumes when FSGroup is specified [LinuxOnly] [NodeConformance] volume on tmpfs should have the correct mode using FSGroup",
    "[sig-storage] EmptyDir volumes should support (non-root,0666,tmpfs)",
    "[sig-storage] HostPath should support subPath",
    "[sig-storage] Downward API volume should update labels on modification",
    "[sig-node] Pods should support pod readiness gates",
    "[sig-node] Container Runtime blackbox test on terminated container should report termination message if TerminationMessagePath is set as non-root user and at a non-default path",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart exec hook properly",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute prestop http hook properly",
    "[sig-node] InitContainer [NodeConformance] should not start app containers and fail the pod if init containers fail on a RestartNever pod",
    "Probing restartable init container should be restarted with a exec \"cat /tmp/health\" liveness probe",
    "Restartable Init Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart exec hook properly",
    "[sig-node] KubeletManagedEtcHosts should test kubelet managed /etc/hosts file",
    "[sig-node] Security Context When creating a container with runAsNonRoot [NodeConformance] should not run with an explicit root user ID",
    "[sig-storage] EmptyDir volumes when FSGroup is specified [LinuxOnly] [NodeConformance] new files should be created with FSGroup ownership when container is non-root",
];

/// Fails when a spec of [`CI_SPECS`] is not among the `selected` ones: a renamed spec must not
/// silently leave CI's subset.
pub fn check_ci_specs(selected: &[String]) -> Result<()> {
    let missing: Vec<&str> = CI_SPECS
        .iter()
        .copied()
        .filter(|fragment| !selected.iter().any(|name| name.contains(fragment)))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(
            "the CI subset names specs the suite does not have: {}",
            missing.join("; ")
        )
    }
}

/// Escapes what a Go regular expression would read as syntax.
pub fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The specs `suite` runs. The broader suite is the node's conformance specs less the node
/// suite, which ginkgo's filters cannot say (Go's regular expressions have no look-ahead): both
/// sets are listed with a dry run of `e2e.test` and the difference is selected by name.
pub fn selection(suite: Suite, ginkgo: &Path, e2e: &Path, run_dir: &Path) -> Result<Selection> {
    match suite {
        Suite::Node => Ok(Selection {
            focus: vec![NODE_FOCUS.to_owned()],
            skip: vec![NODE_SKIP.to_owned()],
        }),
        Suite::Ci => Ok(Selection {
            focus: CI_SPECS.iter().map(|s| regex_escape(s)).collect(),
            skip: vec![NODE_SKIP.to_owned()],
        }),
        Suite::Broader => {
            let wide = Selection {
                focus: BROADER_FOCUS.iter().map(|&f| f.to_owned()).collect(),
                skip: vec![BROADER_SKIP.to_owned()],
            };
            let node = selection(Suite::Node, ginkgo, e2e, run_dir)?;
            let in_node = dry_run(ginkgo, e2e, &node, &run_dir.join("dry-run-node"))?;
            let in_wide = dry_run(ginkgo, e2e, &wide, &run_dir.join("dry-run-wide"))?;
            Ok(by_name(
                in_wide.iter().filter(|name| !in_node.contains(name)),
            ))
        }
    }
}

/// The specs of `suite` that the caller's `focus` also selects and `skip` does not drop. ginkgo
/// ORs its focus filters and Go's regular expressions cannot say "and", so both selections are
/// listed with dry runs and their common specs are selected by name.
pub fn narrow(
    suite: &Selection,
    focus: Option<&str>,
    skip: Option<&str>,
    ginkgo: &Path,
    e2e: &Path,
    run_dir: &Path,
) -> Result<Selection> {
    let in_suite = dry_run(ginkgo, e2e, suite, &run_dir.join("dry-run-suite"))?;
    let callers = Selection {
        focus: focus.map_or_else(|| suite.focus.clone(), |f| vec![f.to_owned()]),
        skip: suite
            .skip
            .iter()
            .cloned()
            .chain(skip.map(str::to_owned))
            .collect(),
    };
    let in_callers = dry_run(ginkgo, e2e, &callers, &run_dir.join("dry-run-narrowed"))?;
    Ok(by_name(
        in_suite.iter().filter(|name| in_callers.contains(name)),
    ))
}

/// A selection of exactly the specs named. ginkgo matches a focus against the suite's
/// description ("Kubernetes e2e suite") and the spec's full name joined by a space, so a name is
/// anchored at its end and at the space before it.
fn by_name<'a>(names: impl Iterator<Item = &'a String>) -> Selection {
    Selection {
        focus: names.map(|name| exact_name(name)).collect(),
        skip: Vec::new(),
    }
}

fn exact_name(name: &str) -> String {
    format!(" {}$", regex_escape(name))
}

/// Adds the selection's `--focus` and `--skip` flags to a ginkgo command.
pub fn add_filters(command: &mut Command, selection: &Selection) {
    for focus in &selection.focus {
        command.arg(format!("--focus={focus}"));
    }
    for skip in &selection.skip {
        command.arg(format!("--skip={skip}"));
    }
}

/// The full names of the specs `selection` selects, from a dry run (nothing runs).
pub fn dry_run(
    ginkgo: &Path,
    e2e: &Path,
    selection: &Selection,
    dir: &Path,
) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut command = Command::new(ginkgo);
    command.args(["--dry-run", "--no-color", "--json-report=report.json"]);
    command.arg(format!("--output-dir={}", dir.display()));
    add_filters(&mut command, selection);
    command.arg(e2e).args(["--", "--provider=local"]);
    cmd::output(&mut command).context("listing the selected specs with a dry run")?;
    let json = std::fs::read_to_string(dir.join("report.json"))
        .with_context(|| format!("reading the dry run's report in {}", dir.display()))?;
    // In a dry run every selected spec "passes" and the others are skipped without a reason.
    Ok(report::parse_ginkgo_report(&json)?
        .into_iter()
        .filter(|(_, outcome)| outcome.passed())
        .map(|(name, _)| name)
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_ci_spec_missing_from_the_selection_is_named() {
        let all: Vec<String> = CI_SPECS
            .iter()
            .map(|s| format!("{s} [NodeConformance]"))
            .collect();
        assert!(check_ci_specs(&all).is_ok());
        let err = check_ci_specs(&all[1..]).unwrap_err();
        assert!(format!("{err}").contains(CI_SPECS[0]));
    }

    #[test]
    fn escaped_names_keep_their_text_and_lose_their_syntax() {
        assert_eq!(
            regex_escape(r#"with a exec "cat /tmp/health" probe [NodeConformance] (root,0644)"#),
            r#"with a exec "cat /tmp/health" probe \[NodeConformance\] \(root,0644\)"#
        );
        assert_eq!(regex_escape("*not* a.b"), r"\*not\* a\.b");
        assert_eq!(exact_name("[sig-node] a (b)"), r" \[sig-node\] a \(b\)$");
    }
}
