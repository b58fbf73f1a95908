//! The request router shared by every listener (the kubelet's `Server.ServeHTTP` over its restful
//! container): authenticates and authorises requests on the API port, resolves the path with
//! [`routes`](super::routes) and answers from what the host reports. It knows nothing about sockets,
//! so the same router sits behind the TLS API port, the plain read-only port and the healthz port.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use http::header::{ALLOW, CONTENT_TYPE, HeaderValue, LOCATION, X_CONTENT_TYPE_OPTIONS};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use k8s_openapi::List;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

use super::auth::KubeletAuth;
use super::healthz::{self, RootQuery};
use super::node_logs::{self, NodeLogTarget};
use super::routes::{ContainerPath, Endpoints, PodPath, Resolved, Route, StreamKind};
use super::{HostError, PodRef, ServerHost, streaming};
use crate::container::{ExecRequest, RuntimeError, StreamOptions};
use crate::io::{IoEngine, ReadFile};
use crate::kuberuntime::logs::{self, LogOptions};
use crate::stats;

/// Every response body: whole buffers for most routes, streams for followed logs and upgrades.
pub(crate) type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// A response body holding one buffer.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";
const APPLICATION_JSON: &str = "application/json";
const TEXT_HTML: &str = "text/html; charset=utf-8";
/// How long `/run` waits for its command.
const RUN_TIMEOUT: Duration = Duration::from_mins(1);

/// Answers requests for one listener from what the host reports.
#[derive(Clone)]
pub(crate) struct Router {
    host: Arc<dyn ServerHost>,
    endpoints: Endpoints,
    /// Present on the kubelet API port: every request is authenticated and authorised first.
    auth: Option<KubeletAuth>,
    /// The engine of the listener: log files are read through it.
    engine: IoEngine,
}

impl Router {
    /// A router without authentication (the read-only and healthz ports).
    pub(crate) fn new(host: Arc<dyn ServerHost>, endpoints: Endpoints, engine: IoEngine) -> Self {
        Self {
            host,
            endpoints,
            auth: None,
            engine,
        }
    }

    /// The kubelet API's router: authenticated, authorised, debugging handlers as configured.
    pub(crate) fn api(
        host: Arc<dyn ServerHost>,
        debugging: bool,
        auth: KubeletAuth,
        engine: IoEngine,
    ) -> Self {
        Self {
            host,
            endpoints: Endpoints::Api { debugging },
            auth: Some(auth),
            engine,
        }
    }

    pub(crate) async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        // The kubelet filters every request through authn/authz before routing, so an unknown
        // path tells an unauthenticated client nothing.
        if let Some(auth) = &self.auth
            && let Err(denial) = auth.check(&request).await
        {
            return text(denial.status, format!("{}\n", denial.message));
        }
        let path = request.uri().path().to_owned();
        let route = match self.endpoints.resolve(&path) {
            Resolved::Route(route) => route,
            Resolved::DebuggingDisabled => {
                return text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Debug endpoints are disabled.\n".to_owned(),
                );
            }
            Resolved::NotFound => return not_found(),
        };
        if !route.allows(request.method()) {
            let mut response = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "405 method not allowed\n".to_owned(),
            );
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static(route.allowed_methods()));
            return response;
        }
        let query = request.uri().query().map(str::to_owned);
        let query = query.as_deref();
        match route {
            Route::Pods => self.pods().await,
            Route::Metrics => match self.host.metrics().render() {
                Ok(body) => prometheus_text(body),
                Err(error) => {
                    tracing::error!(%error, "rendering metrics");
                    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"))
                }
            },
            Route::MetricsResource => match self.host.stats_summary(true).await {
                Ok(summary) => prometheus_text(stats::render_resource_metrics(&summary)),
                Err(error) => host_error(&error),
            },
            Route::MetricsProbes => match self.host.metrics().render_probes() {
                Ok(body) => prometheus_text(body),
                Err(error) => {
                    tracing::error!(%error, "rendering probe metrics");
                    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"))
                }
            },
            Route::StatsSummary => match self
                .host
                .stats_summary(query_values(query, "only_cpu_and_memory").any(|v| v == "true"))
                .await
            {
                Ok(summary) => json(&summary),
                Err(error) => host_error(&error),
            },
            Route::Configz => json(&self.host.configz()),
            Route::RunningPods => match self.host.running_pods().await {
                Ok(pods) => json(&List {
                    items: pods,
                    metadata: ListMeta::default(),
                }),
                Err(error) => host_error(&error),
            },
            Route::Healthz => {
                let query = RootQuery::parse(query);
                let rendered = healthz::render_root(&self.host.health_checks(), &query);
                text(rendered.status, rendered.body)
            }
            Route::HealthzCheck(name) => {
                match healthz::render_one(&self.host.health_checks(), name) {
                    Some(rendered) => text(rendered.status, rendered.body),
                    None => not_found(),
                }
            }
            Route::ContainerLogs(target) => self.container_logs(&target, query).await,
            Route::NodeLogs(rest) => {
                node_log(self.host.node_log_dir(), &path, rest, self.engine).await
            }
            Route::Stream(kind, target) => {
                let target = OwnedContainer::from(&target);
                self.stream(kind, &target, request).await
            }
            Route::PortForward(pod) => {
                let pod = OwnedPod::from(&pod);
                self.port_forward(&pod, request).await
            }
            Route::Run(target) => self.run(&target, query).await,
        }
    }

    /// `/pods`: a `v1.PodList` of the pods the host manages. Collecting and encoding thousands of pods
    /// is CPU work, so it runs on the blocking pool to keep the executor that drives the sync loop
    /// responsive.
    async fn pods(&self) -> Response<Body> {
        let host = Arc::clone(&self.host);
        let encoded = tokio::task::spawn_blocking(move || host.pod_list_json()).await;
        match encoded {
            Ok(Ok(json)) => json_bytes(json),
            Ok(Err(error)) => {
                tracing::error!(%error, "encoding the pod list");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("encoding the pod list: {error}\n"),
                )
            }
            Err(error) => {
                tracing::error!(%error, "listing pods");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "listing pods: internal error\n".to_owned(),
                )
            }
        }
    }

    /// `/containerLogs/{ns}/{pod}/{container}`: the CRI log file of the container (or of its
    /// previous instance), optionally followed while the container runs.
    async fn container_logs(
        &self,
        target: &ContainerPath<'_>,
        query: Option<&str>,
    ) -> Response<Body> {
        let options = match LogOptions::from_query(query, jiff::Timestamp::now()) {
            Ok(options) => options,
            Err(error) => return text(StatusCode::BAD_REQUEST, format!("{error}\n")),
        };
        let found = match self
            .host
            .container(&pod_ref(&target.pod), target.container, options.previous)
            .await
        {
            Ok(found) => found,
            Err(error) => return host_error(&error),
        };
        let path = match self.host.streaming().container_log_path(&found.id).await {
            Ok(path) => path,
            Err(error) => {
                return text(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no log file for container {:?}: {error}\n",
                        target.container
                    ),
                );
            }
        };
        let host = Arc::clone(&self.host);
        let id = found.id.clone();
        let still_running = move || {
            let host = Arc::clone(&host);
            let id = id.clone();
            async move {
                host.streaming()
                    .container_running(&id)
                    .await
                    .unwrap_or(false)
            }
        };
        let stream = match logs::open_logs(path, options, self.engine, still_running).await {
            Ok(stream) => stream,
            Err(error) => {
                return text(
                    StatusCode::NOT_FOUND,
                    format!(
                        "reading the log of container {:?}: {error}\n",
                        target.container
                    ),
                );
            }
        };
        let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(
            stream.map_ok(Frame::data),
        )));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
        response
    }

    /// `/exec` and `/attach`: asks the runtime for a streaming URL and proxies the (upgrading)
    /// request to it, as the kubelet does since streaming redirects were removed.
    async fn stream(
        &self,
        kind: StreamKind,
        target: &OwnedContainer,
        request: Request<Incoming>,
    ) -> Response<Body> {
        let query = request.uri().query();
        let parsed = match kind {
            StreamKind::Exec => streaming::exec_request_from_query(query).map(StreamRequest::Exec),
            StreamKind::Attach => {
                streaming::stream_options_from_query(query).map(StreamRequest::Attach)
            }
        };
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(error) => return text(error.http_status(), format!("{error}\n")),
        };
        let found = match self
            .host
            .container(&target.pod.as_ref(), &target.container, false)
            .await
        {
            Ok(found) if found.running => found,
            Ok(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("container {:?} is not running\n", target.container),
                );
            }
            Err(error) => return host_error(&error),
        };
        let runtime = self.host.streaming();
        let url = match parsed {
            StreamRequest::Exec(exec) => runtime.get_exec(&found.id, exec).await,
            StreamRequest::Attach(streams) => runtime.get_attach(&found.id, streams).await,
        };
        match url {
            Ok(url) => streaming::proxy_to_runtime(request, &url).await,
            Err(error) => runtime_error(&error),
        }
    }

    /// `/portForward/{ns}/{pod}`: the runtime's port-forward stream for the pod's sandbox.
    async fn port_forward(&self, pod: &OwnedPod, request: Request<Incoming>) -> Response<Body> {
        let ports = match streaming::ports_from_query(request.uri().query()) {
            Ok(ports) => ports,
            Err(error) => return text(error.http_status(), format!("{error}\n")),
        };
        let sandbox = match self.host.sandbox(&pod.as_ref()).await {
            Ok(sandbox) => sandbox,
            Err(error) => return host_error(&error),
        };
        match self
            .host
            .streaming()
            .get_port_forward(&sandbox, ports)
            .await
        {
            Ok(url) => streaming::proxy_to_runtime(request, &url).await,
            Err(error) => runtime_error(&error),
        }
    }

    /// `/run/{ns}/{pod}/{container}?cmd=…`: runs the space-separated command in the container and
    /// answers with its output, as the kubelet's `handleRun` does.
    async fn run(&self, target: &ContainerPath<'_>, query: Option<&str>) -> Response<Body> {
        let command: Vec<String> = query_values(query, "cmd")
            .flat_map(|cmd| {
                cmd.split(' ')
                    .filter(|word| !word.is_empty())
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        if command.is_empty() {
            return text(
                StatusCode::BAD_REQUEST,
                "missing the command: add ?cmd=<command>\n".to_owned(),
            );
        }
        let found = match self
            .host
            .container(&pod_ref(&target.pod), target.container, false)
            .await
        {
            Ok(found) => found,
            Err(error) => return host_error(&error),
        };
        match self
            .host
            .streaming()
            .run_in_container(&found.id, command, RUN_TIMEOUT)
            .await
        {
            Ok(output) => json_bytes(output),
            Err(error) => runtime_error(&error),
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for Router {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let router = self.clone();
        Box::pin(async move { Ok(router.handle(request).await) })
    }
}

/// A parsed `/exec` or `/attach` query.
enum StreamRequest {
    Exec(ExecRequest),
    Attach(StreamOptions),
}

/// `/logs/<rest>`: a file of the node's log directory, or a listing of one of its directories.
/// Directory URLs without a trailing slash are redirected to one, because the listing's links are
/// relative.
async fn node_log(root: &Path, path: &str, rest: &str, engine: IoEngine) -> Response<Body> {
    let root = root.to_path_buf();
    let request = rest.to_owned();
    let resolved = tokio::task::spawn_blocking(move || node_logs::resolve(&root, &request)).await;
    match resolved {
        Ok(Ok(NodeLogTarget::File(file))) => match ReadFile::open(&file, engine).await {
            Ok(opened) => {
                let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(
                    node_logs::file_stream(opened).map_ok(Frame::data),
                )));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
                response
            }
            Err(error) => text(
                StatusCode::NOT_FOUND,
                format!("opening {}: {error}\n", file.display()),
            ),
        },
        Ok(Ok(NodeLogTarget::Directory { .. })) if !path.ends_with('/') => {
            let mut response = text(StatusCode::MOVED_PERMANENTLY, String::new());
            if let Ok(location) = HeaderValue::from_str(&format!("{path}/")) {
                response.headers_mut().insert(LOCATION, location);
            }
            response
        }
        Ok(Ok(NodeLogTarget::Directory { entries, .. })) => {
            let mut response = Response::new(full(node_logs::render_listing(&entries)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_HTML));
            response
        }
        Ok(Err(error)) => text(error.http_status(), format!("{error}\n")),
        Err(error) => {
            tracing::error!(%error, "resolving a node log path");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "resolving the log path: internal error\n".to_owned(),
            )
        }
    }
}

/// A pod path's parts, owned, for handlers that outlive the request's path.
#[derive(Clone, Debug)]
struct OwnedPod {
    namespace: String,
    name: String,
    uid: Option<String>,
}

impl OwnedPod {
    fn as_ref(&self) -> PodRef<'_> {
        PodRef {
            namespace: &self.namespace,
            name: &self.name,
            uid: self.uid.as_deref(),
        }
    }
}

impl From<&PodPath<'_>> for OwnedPod {
    fn from(pod: &PodPath<'_>) -> Self {
        Self {
            namespace: pod.namespace.to_owned(),
            name: pod.name.to_owned(),
            uid: pod.uid.map(str::to_owned),
        }
    }
}

struct OwnedContainer {
    pod: OwnedPod,
    container: String,
}

impl From<&ContainerPath<'_>> for OwnedContainer {
    fn from(target: &ContainerPath<'_>) -> Self {
        Self {
            pod: OwnedPod::from(&target.pod),
            container: target.container.to_owned(),
        }
    }
}

fn pod_ref<'a>(pod: &PodPath<'a>) -> PodRef<'a> {
    PodRef {
        namespace: pod.namespace,
        name: pod.name,
        uid: pod.uid,
    }
}

/// Every value of `key` in a query string, percent-decoded.
fn query_values<'a>(query: Option<&'a str>, key: &'a str) -> impl Iterator<Item = String> + 'a {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .filter(move |(name, _)| name == key)
        .map(|(_, value)| value.into_owned())
}

fn not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned())
}

fn host_error(error: &HostError) -> Response<Body> {
    match error {
        HostError::NotFound(message) => text(StatusCode::NOT_FOUND, format!("{message}\n")),
        HostError::Unavailable(message) => {
            text(StatusCode::SERVICE_UNAVAILABLE, format!("{message}\n"))
        }
    }
}

fn runtime_error(error: &RuntimeError) -> Response<Body> {
    tracing::warn!(%error, "container runtime call for a debugging endpoint failed");
    text(
        StatusCode::BAD_GATEWAY,
        format!("container runtime: {error}\n"),
    )
}

fn json(value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(body) => json_bytes(body),
        Err(error) => {
            tracing::error!(%error, "encoding a response");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the response: {error}\n"),
            )
        }
    }
}

fn json_bytes(body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(full(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(APPLICATION_JSON));
    response
}

fn prometheus_text(body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    response
}

pub(crate) fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}
