//! Observe mode's plain HTTP listener: `GET /metrics` (Prometheus text) and `GET /healthz`
//! (`?verbose` for the checks). Nothing else is served.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::ObserveError;
use super::health::Health;
use super::metrics::ObserveMetrics;

/// Binds `address` (so a taken port fails at start, naming it).
pub async fn bind(address: SocketAddr) -> Result<TcpListener, ObserveError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ObserveError::Listen { address, source })
}

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: ObserveMetrics,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection on the metrics listener");
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let answer = answer(&request, &metrics, &health);
                async move { Ok::<_, Infallible>(answer) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "a metrics connection ended with an error");
            }
        });
    }
}

fn answer(
    request: &Request<Incoming>,
    metrics: &ObserveMetrics,
    health: &Health,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".to_owned(),
        );
    }
    match request.uri().path() {
        "/metrics" => match metrics.render() {
            Ok(body) => {
                let mut response = text(StatusCode::OK, body);
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
                );
                response
            }
            Err(err) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                crate::error_chain::error_chain(&err),
            ),
        },
        "/healthz" => {
            let verbose = request.uri().query().is_some_and(|q| {
                q.split('&')
                    .any(|p| p == "verbose" || p.starts_with("verbose="))
            });
            let status = if health.is_healthy() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, health.render(verbose))
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "observe mode serves /metrics and /healthz\n".to_owned(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
