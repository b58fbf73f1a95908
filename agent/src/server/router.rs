//! The request router shared by every listener (the kubelet's `Server.ServeHTTP` over its restful
//! container): it maps a request to a response and knows nothing about sockets, so the same router
//! can sit behind the plain read-only port, the healthz port and, later, the TLS API port.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE, HeaderValue, X_CONTENT_TYPE_OPTIONS};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

use super::ServerHost;
use super::healthz::{self, RootQuery};

/// Every response body: whole buffers for most routes, streams for followed logs and upgrades.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// A response body holding one buffer.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";
const APPLICATION_JSON: &str = "application/json";
/// Every route is read-only.
const ALLOWED_METHODS: &str = "GET, HEAD";

/// Which group of routes a listener exposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoints {
    /// The read-only port (10255): the kubelet's default handlers without auth.
    ReadOnly,
    /// The healthz port (10248): `/healthz` and its per-check subpaths only.
    HealthzOnly,
}

#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Pods,
    Metrics,
    Healthz,
    HealthzCheck(&'a str),
}

impl Endpoints {
    fn route(self, path: &str) -> Option<Route<'_>> {
        match (self, path) {
            (_, "/healthz") => Some(Route::Healthz),
            (Self::ReadOnly, "/pods") => Some(Route::Pods),
            (Self::ReadOnly, "/metrics") => Some(Route::Metrics),
            (_, _) => path
                .strip_prefix("/healthz/")
                .filter(|name| !name.is_empty() && !name.contains('/'))
                .map(Route::HealthzCheck),
        }
    }
}

/// Answers requests for one listener from what the host reports.
#[derive(Clone)]
pub(crate) struct Router {
    host: Arc<dyn ServerHost>,
    endpoints: Endpoints,
}

impl Router {
    pub(crate) fn new(host: Arc<dyn ServerHost>, endpoints: Endpoints) -> Self {
        Self { host, endpoints }
    }

    pub(crate) async fn handle<B>(&self, request: Request<B>) -> Response<Body> {
        let Some(route) = self.endpoints.route(request.uri().path()) else {
            return text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned());
        };
        if !matches!(*request.method(), Method::GET | Method::HEAD) {
            let mut response = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "405 method not allowed\n".to_owned(),
            );
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
            return response;
        }
        match route {
            Route::Pods => self.pods().await,
            Route::Metrics => match self.host.metrics().render() {
                Ok(body) => {
                    let mut response = Response::new(full(body));
                    response.headers_mut().insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
                    );
                    response
                }
                Err(error) => {
                    tracing::error!(%error, "rendering metrics");
                    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"))
                }
            },
            Route::Healthz => {
                let query = RootQuery::parse(request.uri().query());
                let rendered = healthz::render_root(&self.host.health_checks(), &query);
                text(rendered.status, rendered.body)
            }
            Route::HealthzCheck(name) => {
                match healthz::render_one(&self.host.health_checks(), name) {
                    Some(rendered) => text(rendered.status, rendered.body),
                    None => text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned()),
                }
            }
        }
    }

    /// `/pods`: a `v1.PodList` of the pods the host manages. Collecting and encoding thousands of pods
    /// is CPU work, so it runs on the blocking pool to keep the executor that drives the sync loop
    /// responsive.
    async fn pods(&self) -> Response<Body> {
        let host = Arc::clone(&self.host);
        let encoded = tokio::task::spawn_blocking(move || {
            let list: List<Pod> = List {
                items: host.pods(),
                metadata: ListMeta::default(),
            };
            serde_json::to_vec(&list)
        })
        .await;
        match encoded {
            Ok(Ok(json)) => {
                let mut response = Response::new(full(json));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static(APPLICATION_JSON));
                response
            }
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
}

impl<B: Send + 'static> hyper::service::Service<Request<B>> for Router {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, request: Request<B>) -> Self::Future {
        let router = self.clone();
        Box::pin(async move { Ok(router.handle(request).await) })
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_listener_has_no_pods_route() {
        assert_eq!(Endpoints::HealthzOnly.route("/pods"), None);
        assert_eq!(Endpoints::HealthzOnly.route("/metrics"), None);
        assert_eq!(Endpoints::ReadOnly.route("/pods"), Some(Route::Pods));
        assert_eq!(Endpoints::ReadOnly.route("/metrics"), Some(Route::Metrics));
        assert_eq!(
            Endpoints::HealthzOnly.route("/healthz/pleg"),
            Some(Route::HealthzCheck("pleg"))
        );
        assert_eq!(
            Endpoints::HealthzOnly.route("/healthz"),
            Some(Route::Healthz)
        );
    }

    #[test]
    fn near_misses_are_not_routes() {
        for path in [
            "/healthz/",
            "/healthz/a/b",
            "/pods/",
            "/podsx",
            "/",
            "/healthzx",
        ] {
            assert_eq!(Endpoints::ReadOnly.route(path), None, "{path}");
        }
    }
}
