//! The Grafana dashboard `deploy/grafana/ringlet.json` against the metrics ringlet exports: the JSON
//! parses, every `PromQL` query in it (panel targets and template variables) parses, and every metric
//! a query selects is one ringlet registers, a histogram's series by their `_bucket`, `_sum` and
//! `_count` names (the bare histogram name selects nothing). The exported names are read from the
//! agent's own registries (`Metrics::render` and `Metrics::render_probes`), so renaming a metric
//! without the dashboard fails here.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use ringlet::metrics::Metrics;
use ringlet::observe::{ObserveMetrics, SourceKind};
use serde_json::{Value, json};

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/grafana/ringlet.json"
);

/// The metrics the dashboard must show (issue 15 §4): PLEG latency, relists by type, hints by kind,
/// ring buffer drops, runtime lag, pods and containers running, and the observed kubelet lag.
const REQUIRED: &[&str] = &[
    "ringlet_pleg_event_latency_seconds_bucket",
    "ringlet_pod_status_latency_seconds_bucket",
    "ringlet_pleg_relists_total",
    "ringlet_pleg_hints_total",
    "ringlet_ebpf_ring_buffer_drops_total",
    "ringlet_pleg_runtime_lag_seconds_bucket",
    "kubelet_running_pods",
    "kubelet_running_containers",
    "ringlet_observed_kubelet_status_lag_seconds_bucket",
];

/// Grafana's interval variables, which `PromQL` only accepts once Grafana has replaced them by a
/// duration. Other variables (`$instance`) only appear inside label values, where they parse.
const INTERVAL_VARIABLES: &[&str] = &[
    "${__rate_interval}",
    "$__rate_interval",
    "${__interval}",
    "$__interval",
    "${__range}",
    "$__range",
];

/// The series names a query may select: every metric of the agent's registries (a histogram as
/// its `_bucket`, `_sum` and `_count` series) and of observe mode's registry.
fn exported_series() -> Result<BTreeSet<String>> {
    let metrics = Metrics::new().context("registering the agent's metrics")?;
    let observe = ObserveMetrics::new(&[SourceKind::KubeletPods, SourceKind::Apiserver])
        .context("registering observe mode's metrics")?;
    let text = metrics.render().context("rendering the agent's metrics")?
        + &metrics
            .render_probes()
            .context("rendering the probe metrics")?
        + &observe
            .render()
            .context("rendering observe mode's metrics")?;
    let families = text.lines().filter_map(|line| {
        let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
        Some((words.next()?.to_owned(), words.next()?.to_owned()))
    });
    let mut series = BTreeSet::new();
    for (name, kind) in families {
        match kind.as_str() {
            "histogram" => series.extend(
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|suffix| format!("{name}{suffix}")),
            ),
            "summary" => {
                series.extend(["_sum", "_count"].iter().map(|s| format!("{name}{s}")));
                series.insert(name);
            }
            _ => {
                series.insert(name);
            }
        }
    }
    Ok(series)
}

/// One `PromQL` query of the dashboard and where it is.
struct Query {
    place: String,
    expr: String,
}

/// Every query of the dashboard: the targets of each panel (rows' nested panels too) and the
/// template variables of type `query` (`label_values(<selector>, <label>)` contributes its selector).
fn queries(dashboard: &Value) -> Vec<Query> {
    let mut found = Vec::new();
    collect_panels(dashboard["panels"].as_array(), &mut found);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .unwrap_or_default();
        let expr = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .map_or(query, |args| args.rsplit_once(',').map_or("", |(s, _)| s));
        found.push(Query {
            place: format!("variable {}", variable["name"]),
            expr: expr.to_owned(),
        });
    }
    found
}

fn collect_panels(panels: Option<&Vec<Value>>, found: &mut Vec<Query>) {
    for panel in panels.into_iter().flatten() {
        collect_panels(panel["panels"].as_array(), found);
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                found.push(Query {
                    place: format!("panel {} target {}", panel["title"], target["refId"]),
                    expr: expr.to_owned(),
                });
            }
        }
    }
}

/// Collects the metric names a query selects; a selector without a name is an error.
#[derive(Default)]
struct Selected {
    names: Vec<String>,
}

impl ExprVisitor for Selected {
    type Error = String;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
        let selector = match expr {
            Expr::VectorSelector(selector) => selector,
            Expr::MatrixSelector(matrix) => &matrix.vs,
            _ => return Ok(true),
        };
        let name = selector.name.clone().ok_or_else(|| {
            format!("the selector {selector} names no metric (match metrics by name, not __name__)")
        })?;
        self.names.push(name);
        Ok(true)
    }
}

/// The metrics `expr` selects, after Grafana's interval variables are replaced.
fn selected_metrics(expr: &str) -> Result<Vec<String>, String> {
    let expr = INTERVAL_VARIABLES
        .iter()
        .fold(expr.to_owned(), |expr, variable| {
            expr.replace(variable, "5m")
        });
    let ast = parser::parse(&expr).map_err(|e| format!("does not parse: {e}"))?;
    let mut selected = Selected::default();
    walk_expr(&mut selected, &ast)?;
    Ok(selected.names)
}

/// What is wrong with the dashboard's queries: each that does not parse or selects a metric not in
/// `exported`, and a dashboard without queries.
fn query_problems(dashboard: &Value, exported: &BTreeSet<String>) -> Vec<String> {
    let queries = queries(dashboard);
    if queries.is_empty() {
        return vec!["the dashboard has no queries".to_owned()];
    }
    let mut problems = Vec::new();
    for Query { place, expr } in queries {
        match selected_metrics(&expr) {
            Err(error) => problems.push(format!("{place}: `{expr}` {error}")),
            Ok(names) => problems.extend(
                names
                    .into_iter()
                    .filter(|name| !exported.contains(name))
                    .map(|name| {
                        format!("{place}: `{expr}` names {name}, which ringlet does not export")
                    }),
            ),
        }
    }
    problems
}

fn dashboard() -> Result<Value> {
    let text = std::fs::read_to_string(DASHBOARD)
        .with_context(|| format!("reading the dashboard {DASHBOARD}"))?;
    serde_json::from_str(&text).with_context(|| format!("the dashboard {DASHBOARD} is not JSON"))
}

#[test]
fn every_dashboard_query_names_only_metrics_ringlet_exports() -> Result<()> {
    let problems = query_problems(&dashboard()?, &exported_series()?);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn the_dashboard_shows_every_metric_the_issue_asks_for() -> Result<()> {
    let shown: BTreeSet<String> = queries(&dashboard()?)
        .iter()
        .flat_map(|query| selected_metrics(&query.expr).unwrap_or_default())
        .collect();
    let missing: Vec<_> = REQUIRED
        .iter()
        .filter(|name| !shown.contains(**name))
        .collect();
    assert!(missing.is_empty(), "no panel shows {missing:?}");
    Ok(())
}

#[test]
fn every_panel_queries_the_datasource_variable() -> Result<()> {
    let dashboard = dashboard()?;
    let variables = dashboard["templating"]["list"]
        .as_array()
        .context("the dashboard has no templating.list")?;
    assert!(
        variables.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no `datasource` variable of type prometheus: {variables:#?}"
    );
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .context("the dashboard has no panels")?
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"],
            json!({"type": "prometheus", "uid": "${datasource}"}),
            "panel {}",
            panel["title"]
        );
    }
    Ok(())
}

#[test]
fn unknown_metrics_bare_histograms_and_bad_queries_are_reported() -> Result<()> {
    let target = |expr: &str| json!({"refId": "A", "expr": expr});
    let dashboard = json!({
        "panels": [
            {"title": "fine", "targets": [target(
                "histogram_quantile(0.99, sum by (le) (rate(ringlet_pleg_event_latency_seconds_bucket{instance=~\"$instance\"}[$__rate_interval])))"
            )]},
            {"type": "row", "title": "a row", "panels": [
                {"title": "unknown", "targets": [target("rate(ringlet_no_such_metric_total[5m])")]},
            ]},
            {"title": "bare histogram", "targets": [target("ringlet_pleg_event_latency_seconds")]},
            {"title": "no name", "targets": [target("{__name__=~\"ringlet_.*\"}")]},
            {"title": "broken", "targets": [target("sum(kubelet_running_pods")]},
        ],
        "templating": {"list": [
            {"name": "instance", "type": "query", "query": "label_values(ringlet_nope, instance)"},
        ]},
    });
    let exported = exported_series()?;
    let problems = query_problems(&dashboard, &exported);
    let reported = |place: &str, what: &str| {
        problems
            .iter()
            .any(|problem| problem.starts_with(place) && problem.contains(what))
    };
    assert!(
        !problems.iter().any(|p| p.contains("\"fine\"")),
        "{problems:#?}"
    );
    assert!(
        reported("panel \"unknown\"", "names ringlet_no_such_metric_total"),
        "{problems:#?}"
    );
    assert!(
        reported(
            "panel \"bare histogram\"",
            "names ringlet_pleg_event_latency_seconds,"
        ),
        "{problems:#?}"
    );
    assert!(
        reported("panel \"no name\"", "names no metric"),
        "{problems:#?}"
    );
    assert!(
        reported("panel \"broken\"", "does not parse"),
        "{problems:#?}"
    );
    assert!(
        reported("variable \"instance\"", "names ringlet_nope"),
        "{problems:#?}"
    );
    assert_eq!(problems.len(), 5, "{problems:#?}");
    assert_eq!(
        query_problems(&json!({"panels": []}), &exported),
        ["the dashboard has no queries"]
    );
    Ok(())
}
