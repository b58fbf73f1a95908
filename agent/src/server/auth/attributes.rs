//! The kubelet's mapping of an HTTP request to authorisation attributes (`pkg/kubelet/server/auth.go`,
//! `GetRequestAttributes`): every request is an action on the `nodes` resource named after this node,
//! the verb comes from the method and the subresource from the path.

use http::Method;

/// What is asked of the authorizer for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    /// Always `nodes` (API group "", version v1).
    pub resource: &'static str,
    pub subresource: &'static str,
    /// The node's name.
    pub name: String,
}

/// The verb for `method`: the usual REST verbs, anything else lowercased.
pub fn verb(method: &Method) -> String {
    match *method {
        Method::GET | Method::HEAD => "get".to_owned(),
        Method::POST => "create".to_owned(),
        Method::PUT => "update".to_owned(),
        Method::PATCH => "patch".to_owned(),
        Method::DELETE => "delete".to_owned(),
        _ => method.as_str().to_ascii_lowercase(),
    }
}

/// Subpaths with their own subresource; everything else (exec, attach, portForward, containerLogs,
/// run, runningpods, debug, …) is `proxy`, the most powerful one, so an unknown path never gets a
/// weaker check than it deserves.
const SUBRESOURCES: [(&str, &str); 7] = [
    ("/stats", "stats"),
    ("/metrics", "metrics"),
    ("/logs", "log"),
    ("/spec", "spec"),
    ("/pods", "pods"),
    ("/healthz", "healthz"),
    ("/configz", "configz"),
];

/// The subresource the kubelet checks for a request to `path` (the URL path, query excluded).
/// The path is cleaned first (`.`/`..` segments, repeated slashes), so `/stats/../exec/…` counts as
/// exec; percent-escapes are left alone, so an escaped path falls through to `proxy`.
pub fn subresource(path: &str) -> &'static str {
    let path = clean(path);
    SUBRESOURCES
        .iter()
        .find(|(prefix, _)| is_subpath(&path, prefix))
        .map_or("proxy", |(_, subresource)| subresource)
}

/// The subresources to try in order: the fine-grained ones (`pods`, `healthz`, `configz`, added by
/// KEP-2862) fall back to `proxy`, which granted them before they existed.
pub fn subresources_to_try(path: &str) -> &'static [&'static str] {
    match subresource(path) {
        "stats" => &["stats"],
        "metrics" => &["metrics"],
        "log" => &["log"],
        "spec" => &["spec"],
        "pods" => &["pods", "proxy"],
        "healthz" => &["healthz", "proxy"],
        "configz" => &["configz", "proxy"],
        _ => &["proxy"],
    }
}

fn is_subpath(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Lexical cleaning like Go's `path.Clean` for an absolute path.
fn clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    format!("/{}", segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_follow_the_method() {
        for (method, expected) in [
            (Method::GET, "get"),
            (Method::HEAD, "get"),
            (Method::POST, "create"),
            (Method::PUT, "update"),
            (Method::PATCH, "patch"),
            (Method::DELETE, "delete"),
            (Method::OPTIONS, "options"),
            (Method::from_bytes(b"PROPFIND").unwrap(), "propfind"),
        ] {
            assert_eq!(verb(&method), expected, "{method}");
        }
    }

    #[test]
    fn subresources_follow_the_path() {
        for (path, expected) in [
            ("/stats", "stats"),
            ("/stats/summary", "stats"),
            ("/statsfoo", "proxy"),
            ("/metrics", "metrics"),
            ("/metrics/cadvisor", "metrics"),
            ("/metrics/resource", "metrics"),
            ("/logs/", "log"),
            ("/logs/syslog", "log"),
            ("/spec/", "spec"),
            ("/pods", "pods"),
            ("/pods/", "pods"),
            ("/healthz", "healthz"),
            ("/healthz/syncloop", "healthz"),
            ("/configz", "configz"),
            ("/exec/default/p/c", "proxy"),
            ("/attach/default/p/c", "proxy"),
            ("/portForward/default/p", "proxy"),
            ("/containerLogs/default/p/c", "proxy"),
            ("/run/default/p/c", "proxy"),
            ("/runningpods/", "proxy"),
            ("/debug/pprof/", "proxy"),
            ("/", "proxy"),
            ("", "proxy"),
            ("/stats/../exec/default/p/c", "proxy"),
            ("//stats//summary", "stats"),
            ("/./metrics", "metrics"),
            ("/%73tats/summary", "proxy"),
        ] {
            assert_eq!(subresource(path), expected, "{path}");
        }
    }

    #[test]
    fn fine_grained_subresources_fall_back_to_proxy() {
        assert_eq!(subresources_to_try("/pods"), ["pods", "proxy"]);
        assert_eq!(subresources_to_try("/healthz/ping"), ["healthz", "proxy"]);
        assert_eq!(subresources_to_try("/configz"), ["configz", "proxy"]);
        assert_eq!(subresources_to_try("/stats/summary"), ["stats"]);
        assert_eq!(subresources_to_try("/exec/a/b/c"), ["proxy"]);
    }
}
