//! Property tests of what the kubelet API reads from a request (issue 14 §3, "Fuzzing"): any path
//! resolves to a route or to not-found on every listener and never panics, and the read-only and
//! healthz listeners expose only routes the full API has; container paths, exec commands and
//! port-forward ports come back exactly as a client wrote them, whatever characters they hold; and
//! no `/logs/` path, however encoded, leads outside the log directory while every file inside it
//! stays reachable. A fixed number of cases, so they run in every `cargo test`.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::node_logs::{NodeLogTarget, resolve};
use super::routes::{ContainerPath, Endpoints, PodPath, Resolved, Route, StreamKind};
use super::streaming::{exec_request_from_query, ports_from_query, stream_options_from_query};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

const LISTENERS: [Endpoints; 4] = [
    Endpoints::Api { debugging: true },
    Endpoints::Api { debugging: false },
    Endpoints::ReadOnly,
    Endpoints::HealthzOnly,
];

/// Paths built from the pieces routes are made of, so generated paths often come close to real ones.
fn api_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("healthz".to_owned()),
        Just("pods".to_owned()),
        Just("containerLogs".to_owned()),
        Just("exec".to_owned()),
        Just("attach".to_owned()),
        Just("run".to_owned()),
        Just("portForward".to_owned()),
        Just("logs".to_owned()),
        Just("metrics".to_owned()),
        Just("stats".to_owned()),
        Just(String::new()),
        Just("..".to_owned()),
        "[a-z0-9%.-]{1,6}",
    ];
    prop::collection::vec(piece, 0..6).prop_map(|pieces| format!("/{}", pieces.join("/")))
}

/// A path segment as Kubernetes names and UIDs look (never empty, never a slash).
fn segment() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9.-]{0,15}"
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn any_path_resolves_or_is_not_found(path in prop_oneof![api_path(), any::<String>()]) {
        let on_api = Endpoints::Api { debugging: true }.resolve(&path);
        for listener in LISTENERS {
            if let Resolved::Route(route) = listener.resolve(&path) {
                // The smaller listeners serve a subset of the API's routes, never a route of their own.
                prop_assert_eq!(Resolved::Route(route), Endpoints::Api { debugging: true }.resolve(&path));
            }
        }
        if let Resolved::Route(Route::NodeLogs(rest)) = on_api {
            prop_assert!(path == "/logs" || path.ends_with(rest));
        }
    }

    #[test]
    fn container_paths_come_back_as_written(
        namespace in segment(),
        name in segment(),
        uid in prop::option::of(segment()),
        container in segment(),
        endpoint in prop_oneof![Just("exec"), Just("attach"), Just("run"), Just("containerLogs")],
    ) {
        let uid_part = uid.as_deref().map(|uid| format!("{uid}/")).unwrap_or_default();
        let path = format!("/{endpoint}/{namespace}/{name}/{uid_part}{container}");
        let expected_path = ContainerPath {
            pod: PodPath { namespace: &namespace, name: &name, uid: uid.as_deref() },
            container: &container,
        };
        let expected = match (endpoint, uid.is_some()) {
            // Container logs are addressed without the UID.
            ("containerLogs", true) => Resolved::NotFound,
            ("containerLogs", false) => Resolved::Route(Route::ContainerLogs(expected_path)),
            ("exec", _) => Resolved::Route(Route::Stream(StreamKind::Exec, expected_path)),
            ("attach", _) => Resolved::Route(Route::Stream(StreamKind::Attach, expected_path)),
            _ => Resolved::Route(Route::Run(expected_path)),
        };
        prop_assert_eq!(Endpoints::Api { debugging: true }.resolve(&path), expected);
    }

    #[test]
    fn any_query_parses_or_is_refused(query in prop_oneof!["[a-z=&%0-9,+ ]{0,60}", any::<String>()]) {
        let _ = stream_options_from_query(Some(&query));
        let _ = exec_request_from_query(Some(&query));
        let _ = ports_from_query(Some(&query));
    }

    #[test]
    fn an_exec_command_comes_back_as_written(
        command in prop::collection::vec(any::<String>(), 1..5),
        stdin: bool,
        stdout: bool,
        tty: bool,
    ) {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for arg in &command {
            query.append_pair("command", arg);
        }
        query.append_pair("input", if stdin { "1" } else { "0" });
        query.append_pair("output", if stdout { "1" } else { "0" });
        query.append_pair("tty", if tty { "1" } else { "0" });
        let query = query.finish();
        match exec_request_from_query(Some(&query)) {
            Ok(request) => {
                prop_assert_eq!(request.cmd, command);
                prop_assert_eq!(
                    (request.streams.stdin, request.streams.stdout, request.streams.tty),
                    (stdin, stdout, tty)
                );
            }
            // Neither stdin nor stdout asked for (stderr is not in this query): refused, rightly.
            Err(_) => prop_assert!(!stdin && !stdout),
        }
    }

    #[test]
    fn port_forward_ports_come_back_as_written(
        groups in prop::collection::vec(prop::collection::vec(1u16.., 1..4), 0..4),
    ) {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for group in &groups {
            let list: Vec<String> = group.iter().map(u16::to_string).collect();
            query.append_pair("port", &list.join(","));
        }
        let expected: Vec<i32> = groups.iter().flatten().map(|port| i32::from(*port)).collect();
        prop_assert_eq!(ports_from_query(Some(&query.finish())).expect("valid ports parse"), expected);
    }
}

/// A log directory with a file, a subdirectory with a file, and symlinks that lead out of it
/// (to a sibling directory with a secret file, and to `/`); the sibling is in the same temp dir.
fn log_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path().join("log");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("sub")).expect("the log tree is created");
    std::fs::create_dir_all(&outside).expect("the outside dir is created");
    std::fs::write(root.join("syslog"), "inside\n").expect("a log file");
    std::fs::write(root.join("sub").join("app.log"), "inside\n").expect("a log file");
    std::fs::write(outside.join("secret"), "outside\n").expect("a secret file");
    std::os::unix::fs::symlink(&outside, root.join("escape")).expect("a symlink out");
    std::os::unix::fs::symlink("/", root.join("sub").join("slash")).expect("a symlink to /");
    dir
}

/// Segments of a `/logs/` request path: names in the tree, ways up and out, and their encodings.
fn log_segment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "syslog",
        "sub",
        "app.log",
        "escape",
        "slash",
        "secret",
        "outside",
        "log",
        "etc",
        "..",
        ".",
        "",
        "%2e%2e",
        "%2E.",
        ".%2e",
        "%2f",
        "%2F..%2F",
        "%00",
        "%ff",
        "..%2f..",
        "%252e%252e",
    ])
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn no_log_path_leads_outside_the_log_directory(
        segments in prop::collection::vec(log_segment(), 0..6),
    ) {
        let tree = log_tree();
        let root = tree.path().join("log");
        let canonical_root = root.canonicalize().expect("the root exists");
        let request = segments.join("/");
        match resolve(&root, &request) {
            Ok(NodeLogTarget::File(path) | NodeLogTarget::Directory { path, .. }) => {
                prop_assert!(path.starts_with(&canonical_root), "{} served for {:?}", path.display(), request);
            }
            Err(_) => {}
        }
    }
}

#[test]
fn every_file_in_the_log_directory_is_reachable() {
    let tree = log_tree();
    let root = tree.path().join("log");
    for request in [
        "syslog",
        "sub/app.log",
        "/sub//app.log",
        "./syslog",
        "sub/./app.log",
    ] {
        let resolved = resolve(&root, request).unwrap_or_else(|e| panic!("{request}: {e}"));
        let NodeLogTarget::File(path) = resolved else {
            panic!("{request} is not a file");
        };
        assert!(path.starts_with(root.canonicalize().expect("the root exists")));
        assert_eq!(
            Path::new(&path).file_name(),
            Path::new(request).file_name(),
            "{request}"
        );
    }
}
