//! The kubelet API's URL space (the paths `pkg/kubelet/server` registers with its restful container):
//! which path is which endpoint, which listener exposes it, and which methods it takes. Pure
//! parsing, so the table is tested without sockets.

use http::Method;

/// Which group of routes a listener exposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoints {
    /// The kubelet API (10250): everything, behind authentication and authorisation; the debugging
    /// handlers (logs, exec, attach, port-forward, run, running pods) only when `debugging`.
    Api { debugging: bool },
    /// The read-only port (10255): `/healthz`, `/pods`, `/stats/summary`, `/metrics*`, no auth.
    ReadOnly,
    /// The healthz port (10248): `/healthz` and its per-check subpaths only.
    HealthzOnly,
}

/// A pod named in a path, with the optional UID segment the kubelet accepts to pin one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodPath<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    pub(crate) uid: Option<&'a str>,
}

/// A container of a pod named in a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ContainerPath<'a> {
    pub(crate) pod: PodPath<'a>,
    pub(crate) container: &'a str,
}

/// The streaming endpoints the CRI streaming server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamKind {
    Exec,
    Attach,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route<'a> {
    Healthz,
    HealthzCheck(&'a str),
    Pods,
    RunningPods,
    Configz,
    Metrics,
    MetricsResource,
    MetricsProbes,
    StatsSummary,
    ContainerLogs(ContainerPath<'a>),
    /// `/logs/<path>`: a file or directory under the node's log directory (`""` for its root).
    NodeLogs(&'a str),
    Stream(StreamKind, ContainerPath<'a>),
    PortForward(PodPath<'a>),
    Run(ContainerPath<'a>),
}

/// What a path resolves to on one listener.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resolved<'a> {
    Route(Route<'a>),
    /// A debugging endpoint while `enableDebuggingHandlers` is off: the kubelet answers 405
    /// "Debug endpoints are disabled."
    DebuggingDisabled,
    NotFound,
}

impl Route<'_> {
    /// The methods the endpoint takes, for the `Allow` header of a 405.
    pub(crate) fn allowed_methods(&self) -> &'static str {
        match self {
            Self::Stream(..) | Self::PortForward(_) => "GET, POST",
            Self::Run(_) => "POST",
            _ => "GET, HEAD",
        }
    }

    pub(crate) fn allows(&self, method: &Method) -> bool {
        match self {
            Self::Stream(..) | Self::PortForward(_) => {
                matches!(*method, Method::GET | Method::POST)
            }
            Self::Run(_) => *method == Method::POST,
            _ => matches!(*method, Method::GET | Method::HEAD),
        }
    }

    fn is_debugging(&self) -> bool {
        matches!(
            self,
            Self::RunningPods
                | Self::ContainerLogs(_)
                | Self::NodeLogs(_)
                | Self::Stream(..)
                | Self::PortForward(_)
                | Self::Run(_)
        )
    }

    fn on_read_only_port(&self) -> bool {
        matches!(
            self,
            Self::Healthz
                | Self::HealthzCheck(_)
                | Self::Pods
                | Self::Metrics
                | Self::MetricsResource
                | Self::MetricsProbes
                | Self::StatsSummary
        )
    }
}

impl Endpoints {
    pub(crate) fn resolve(self, path: &str) -> Resolved<'_> {
        let Some(route) = parse(path) else {
            return Resolved::NotFound;
        };
        match self {
            Self::Api { debugging } if route.is_debugging() && !debugging => {
                Resolved::DebuggingDisabled
            }
            Self::Api { .. } => Resolved::Route(route),
            Self::ReadOnly if route.on_read_only_port() => Resolved::Route(route),
            Self::HealthzOnly if matches!(route, Route::Healthz | Route::HealthzCheck(_)) => {
                Resolved::Route(route)
            }
            Self::ReadOnly | Self::HealthzOnly => Resolved::NotFound,
        }
    }
}

fn parse(path: &str) -> Option<Route<'_>> {
    let fixed = match path {
        "/healthz" => Some(Route::Healthz),
        "/pods" | "/pods/" => Some(Route::Pods),
        "/runningpods" | "/runningpods/" => Some(Route::RunningPods),
        "/configz" => Some(Route::Configz),
        "/metrics" => Some(Route::Metrics),
        "/metrics/resource" => Some(Route::MetricsResource),
        "/metrics/probes" => Some(Route::MetricsProbes),
        "/stats/summary" | "/stats/summary/" => Some(Route::StatsSummary),
        "/logs" => Some(Route::NodeLogs("")),
        _ => None,
    };
    if fixed.is_some() {
        return fixed;
    }
    if let Some(rest) = path.strip_prefix("/logs/") {
        return Some(Route::NodeLogs(rest));
    }
    let (prefix, rest) = path.strip_prefix('/')?.split_once('/')?;
    let segments: Vec<&str> = rest.split('/').collect();
    if segments.iter().any(|segment| segment.is_empty()) {
        return None;
    }
    match prefix {
        "healthz" => match segments[..] {
            [name] => Some(Route::HealthzCheck(name)),
            _ => None,
        },
        "containerLogs" => match segments[..] {
            [namespace, name, container] => Some(Route::ContainerLogs(ContainerPath {
                pod: PodPath {
                    namespace,
                    name,
                    uid: None,
                },
                container,
            })),
            _ => None,
        },
        "exec" => container_path(&segments).map(|c| Route::Stream(StreamKind::Exec, c)),
        "attach" => container_path(&segments).map(|c| Route::Stream(StreamKind::Attach, c)),
        "run" => container_path(&segments).map(Route::Run),
        "portForward" => match segments[..] {
            [namespace, name] => Some(Route::PortForward(PodPath {
                namespace,
                name,
                uid: None,
            })),
            [namespace, name, uid] => Some(Route::PortForward(PodPath {
                namespace,
                name,
                uid: Some(uid),
            })),
            _ => None,
        },
        _ => None,
    }
}

/// `{namespace}/{pod}/{container}` or `{namespace}/{pod}/{uid}/{container}`.
fn container_path<'a>(segments: &[&'a str]) -> Option<ContainerPath<'a>> {
    match *segments {
        [namespace, name, container] => Some(ContainerPath {
            pod: PodPath {
                namespace,
                name,
                uid: None,
            },
            container,
        }),
        [namespace, name, uid, container] => Some(ContainerPath {
            pod: PodPath {
                namespace,
                name,
                uid: Some(uid),
            },
            container,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: Endpoints = Endpoints::Api { debugging: true };

    fn route(endpoints: Endpoints, path: &str) -> Option<Route<'_>> {
        match endpoints.resolve(path) {
            Resolved::Route(route) => Some(route),
            _ => None,
        }
    }

    #[test]
    fn container_paths_with_and_without_uid() {
        let with_uid = route(API, "/exec/ns/web/1234/app").unwrap();
        assert_eq!(
            with_uid,
            Route::Stream(
                StreamKind::Exec,
                ContainerPath {
                    pod: PodPath {
                        namespace: "ns",
                        name: "web",
                        uid: Some("1234")
                    },
                    container: "app"
                }
            )
        );
        assert!(matches!(
            route(API, "/attach/ns/web/app"),
            Some(Route::Stream(
                StreamKind::Attach,
                ContainerPath {
                    container: "app",
                    ..
                }
            ))
        ));
        assert!(matches!(route(API, "/run/ns/web/app"), Some(Route::Run(_))));
        assert!(matches!(
            route(API, "/portForward/ns/web"),
            Some(Route::PortForward(PodPath { uid: None, .. }))
        ));
        assert!(matches!(
            route(API, "/containerLogs/ns/web/app"),
            Some(Route::ContainerLogs(_))
        ));
    }

    #[test]
    fn malformed_paths_are_not_found() {
        for path in [
            "/exec/ns/web",
            "/exec/ns/web/uid/app/extra",
            "/exec/ns//app",
            "/containerLogs/ns/web",
            "/containerLogs/ns/web/uid/app",
            "/portForward/ns",
            "/healthz/",
            "/healthz/a/b",
            "/podsx",
            "/",
            "/metrics/cadvisorx",
            "/stats",
        ] {
            assert_eq!(API.resolve(path), Resolved::NotFound, "{path}");
        }
    }

    #[test]
    fn node_logs_keep_the_rest_of_the_path() {
        assert_eq!(route(API, "/logs/"), Some(Route::NodeLogs("")));
        assert_eq!(route(API, "/logs"), Some(Route::NodeLogs("")));
        assert_eq!(
            route(API, "/logs/containers/a.log"),
            Some(Route::NodeLogs("containers/a.log"))
        );
    }

    #[test]
    fn debugging_routes_are_disabled_not_missing() {
        let off = Endpoints::Api { debugging: false };
        for path in [
            "/exec/ns/web/app",
            "/attach/ns/web/app",
            "/portForward/ns/web",
            "/run/ns/web/app",
            "/containerLogs/ns/web/app",
            "/logs/",
            "/runningpods/",
        ] {
            assert_eq!(off.resolve(path), Resolved::DebuggingDisabled, "{path}");
        }
        assert_eq!(route(off, "/pods"), Some(Route::Pods));
        assert_eq!(route(off, "/configz"), Some(Route::Configz));
    }

    #[test]
    fn listeners_expose_their_own_routes() {
        for path in [
            "/pods",
            "/metrics",
            "/metrics/resource",
            "/stats/summary",
            "/healthz",
        ] {
            assert!(route(Endpoints::ReadOnly, path).is_some(), "{path}");
        }
        for path in ["/configz", "/runningpods/", "/exec/ns/web/app", "/logs/"] {
            assert_eq!(
                Endpoints::ReadOnly.resolve(path),
                Resolved::NotFound,
                "{path}"
            );
        }
        assert_eq!(
            route(Endpoints::HealthzOnly, "/healthz/pleg"),
            Some(Route::HealthzCheck("pleg"))
        );
        for path in ["/pods", "/metrics", "/stats/summary"] {
            assert_eq!(
                Endpoints::HealthzOnly.resolve(path),
                Resolved::NotFound,
                "{path}"
            );
        }
    }

    #[test]
    fn methods_per_route() {
        let run = route(API, "/run/ns/web/app").unwrap();
        assert!(run.allows(&Method::POST));
        assert!(!run.allows(&Method::GET));
        let exec = route(API, "/exec/ns/web/app").unwrap();
        assert!(exec.allows(&Method::GET) && exec.allows(&Method::POST));
        assert!(!exec.allows(&Method::DELETE));
        let pods = route(API, "/pods").unwrap();
        assert!(pods.allows(&Method::HEAD) && !pods.allows(&Method::POST));
        assert_eq!(pods.allowed_methods(), "GET, HEAD");
    }
}
