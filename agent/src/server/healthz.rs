//! Rendering of the `/healthz` endpoints, with the bodies and status codes of the
//! `k8s.io/apiserver/pkg/server/healthz` handlers the kubelet installs: clients and probes that
//! parse `[+]name ok` / `[-]name failed` lines keep working against ringlet.

use http::StatusCode;

use super::HealthCheck;

/// A rendered healthz answer: status code and `text/plain` body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Rendered {
    pub(crate) status: StatusCode,
    pub(crate) body: String,
}

/// What the query string of a `/healthz` request asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RootQuery {
    /// `?verbose` (any value, even empty) asks for every check's line on success too.
    pub(crate) verbose: bool,
    /// `?exclude=<name>` (repeatable) skips those checks.
    pub(crate) exclude: Vec<String>,
}

impl RootQuery {
    pub(crate) fn parse(query: Option<&str>) -> Self {
        let mut parsed = Self::default();
        for pair in query.unwrap_or_default().split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "verbose" => parsed.verbose = true,
                "exclude" if !value.is_empty() => parsed.exclude.push(value.to_owned()),
                _ => {}
            }
        }
        parsed
    }
}

/// `/healthz`: `ok` when every check passes; otherwise (or when verbose) one line per check, then
/// an `info: <check>: <detail>` line for each check with a detail (such as the PLEG's mode), placed
/// like the apiserver's `warn:` line so `[+]`/`[-]` parsers are unaffected. Failure reasons are
/// withheld because the endpoint is unauthenticated; they go to the log and to the per-check
/// endpoints instead.
pub(crate) fn render_root(checks: &[HealthCheck], query: &RootQuery) -> Rendered {
    let mut lines: Vec<String> = Vec::new();
    let mut failed = Vec::new();
    let mut unmatched: Vec<&str> = query.exclude.iter().map(String::as_str).collect();
    for check in checks {
        if let Some(pos) = unmatched.iter().position(|name| *name == check.name) {
            unmatched.swap_remove(pos);
            lines.push(format!("[+]{} excluded: ok\n", check.name));
            continue;
        }
        match &check.result {
            Ok(()) => lines.push(format!("[+]{} ok\n", check.name)),
            Err(reason) => {
                lines.push(format!("[-]{} failed: reason withheld\n", check.name));
                failed.push(format!("{}: {reason}", check.name));
            }
        }
    }
    for check in checks {
        if let Some(detail) = &check.detail {
            lines.push(format!("info: {}: {detail}\n", check.name));
        }
    }
    if !unmatched.is_empty() {
        unmatched.sort_unstable();
        let quoted: Vec<String> = unmatched.iter().map(|name| format!("{name:?}")).collect();
        lines.push(format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            quoted.join(",")
        ));
    }
    let lines = lines.concat();
    if !failed.is_empty() {
        tracing::debug!(failed = %failed.join("; "), "healthz check failed");
        return Rendered {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: format!("{lines}healthz check failed\n"),
        };
    }
    let body = if query.verbose {
        format!("{lines}healthz check passed\n")
    } else {
        "ok".to_owned()
    };
    Rendered {
        status: StatusCode::OK,
        body,
    }
}

/// `/healthz/<name>`: one check with its reason, `None` when no check has that name.
pub(crate) fn render_one(checks: &[HealthCheck], name: &str) -> Option<Rendered> {
    let check = checks.iter().find(|check| check.name == name)?;
    Some(match &check.result {
        Ok(()) => Rendered {
            status: StatusCode::OK,
            body: "ok".to_owned(),
        },
        Err(reason) => Rendered {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: format!("internal server error: {reason}\n"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(syncloop: Result<(), String>) -> Vec<HealthCheck> {
        vec![
            HealthCheck {
                name: "ping",
                result: Ok(()),
                detail: None,
            },
            HealthCheck {
                name: "syncloop",
                result: syncloop,
                detail: None,
            },
            HealthCheck {
                name: "pleg",
                result: Ok(()),
                detail: None,
            },
        ]
    }

    #[test]
    fn all_passing_is_a_bare_ok() {
        let rendered = render_root(&checks(Ok(())), &RootQuery::default());
        assert_eq!(rendered.status, StatusCode::OK);
        assert_eq!(rendered.body, "ok");
    }

    #[test]
    fn verbose_lists_every_check() {
        let query = RootQuery::parse(Some("verbose"));
        let rendered = render_root(&checks(Ok(())), &query);
        assert_eq!(rendered.status, StatusCode::OK);
        assert_eq!(
            rendered.body,
            "[+]ping ok\n[+]syncloop ok\n[+]pleg ok\nhealthz check passed\n"
        );
    }

    #[test]
    fn failure_is_always_verbose_and_withholds_the_reason() {
        let rendered = render_root(
            &checks(Err("sync loop stalled for 5m".to_owned())),
            &RootQuery::default(),
        );
        assert_eq!(rendered.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            rendered.body,
            "[+]ping ok\n[-]syncloop failed: reason withheld\n[+]pleg ok\nhealthz check failed\n"
        );
        assert!(!rendered.body.contains("stalled"));
    }

    #[test]
    fn excluded_failing_check_does_not_fail_and_unknown_exclusions_warn() {
        let query = RootQuery::parse(Some("exclude=syncloop&exclude=nope&verbose=1"));
        let rendered = render_root(&checks(Err("stalled".to_owned())), &query);
        assert_eq!(rendered.status, StatusCode::OK);
        assert_eq!(
            rendered.body,
            "[+]ping ok\n[+]syncloop excluded: ok\n[+]pleg ok\n\
             warn: some health checks cannot be excluded: no matches for \"nope\"\n\
             healthz check passed\n"
        );
    }

    #[test]
    fn details_are_info_lines_of_verbose_output_only() {
        let mut with_mode = checks(Ok(()));
        with_mode[2].detail = Some("mode ebpf".to_owned());
        let verbose = render_root(&with_mode, &RootQuery::parse(Some("verbose")));
        assert_eq!(
            verbose.body,
            "[+]ping ok\n[+]syncloop ok\n[+]pleg ok\ninfo: pleg: mode ebpf\nhealthz check passed\n"
        );
        assert_eq!(render_root(&with_mode, &RootQuery::default()).body, "ok");
        with_mode[1].result = Err("stalled".to_owned());
        let failed = render_root(&with_mode, &RootQuery::default());
        assert!(
            failed.body.contains("info: pleg: mode ebpf\n"),
            "{}",
            failed.body
        );
    }

    #[test]
    fn query_parsing_ignores_other_keys() {
        assert_eq!(
            RootQuery::parse(Some("timeout=5s&exclude=&verbose=false")),
            RootQuery {
                verbose: true,
                exclude: Vec::new(),
            }
        );
        assert_eq!(RootQuery::parse(None), RootQuery::default());
    }

    #[test]
    fn single_check_shows_its_reason() {
        let failing = checks(Err("stalled".to_owned()));
        let rendered = render_one(&failing, "syncloop");
        assert_eq!(
            rendered,
            Some(Rendered {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                body: "internal server error: stalled\n".to_owned(),
            })
        );
        let rendered = render_one(&failing, "pleg");
        assert_eq!(
            rendered.map(|r| (r.status, r.body)),
            Some((StatusCode::OK, "ok".to_owned()))
        );
        assert_eq!(render_one(&failing, "etcd"), None);
    }
}
