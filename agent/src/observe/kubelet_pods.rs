//! The `kubelet-pods` source: the kubelet's own `GET /pods` (the read-only port, or the
//! authenticated one with a CA bundle and a bearer token), polled every few milliseconds while an
//! exit waits and not at all otherwise. Reads overlap, so a slow answer does not delay the next
//! read. An answer lists every pod the kubelet holds, so an exit whose pod it lacks is dropped. A
//! failed or undecodable read is logged (once per change of the problem), counted and shown on
//! `/healthz?verbose`; the loop goes on.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{AUTHORIZATION, HeaderValue};
use hyper::{Request, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::MissedTickBehavior;

use super::ObserveError;
use super::health::Health;
use super::lag::{LagTracker, Listing, PodReport};
use crate::error_chain::error_chain;
use crate::pleg::monotonic_now_ns;

/// A `/pods` answer larger than this is not a kubelet's.
const MAX_BODY_BYTES: usize = 256 << 20;
/// One read may take this long before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed read the next waits this long, so a kubelet that is down is not hammered.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);
/// Reads of `/pods` that may be under way at once.
const MAX_READS_IN_FLIGHT: usize = 4;

/// What a `/pods` read failed on.
#[derive(Debug, thiserror::Error)]
pub enum PodsReadError {
    #[error("GET {url}")]
    Request {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("GET {url} answered {status}")]
    Status { url: String, status: StatusCode },
    #[error("reading the answer of GET {url}")]
    Body {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the answer of GET {url} is not a pod list")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The body of `/pods`: a `PodList`, of which only what its items report matters.
#[derive(serde::Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<PodReport>,
}

/// Decodes a `/pods` body.
pub fn decode_pods(url: &str, body: &[u8]) -> Result<Vec<PodReport>, PodsReadError> {
    serde_json::from_slice::<PodList>(body)
        .map(|list| list.items)
        .map_err(|source| PodsReadError::Decode {
            url: url.to_owned(),
            source,
        })
}

/// One answer of `/pods`: every pod the kubelet holds, and when (`CLOCK_MONOTONIC` ns) the request
/// started and its answer was in.
pub struct PodsAnswer {
    pub pods: Vec<PodReport>,
    pub started_at_ns: u64,
    pub seen_at_ns: u64,
}

/// A client for one kubelet's `/pods`.
pub struct KubeletPods {
    url: String,
    uri: Uri,
    token: Option<HeaderValue>,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl KubeletPods {
    /// A client for `<kubelet_url>/pods`; https needs `ca_file`.
    pub fn new(
        kubelet_url: &str,
        ca_file: Option<&Path>,
        token_file: Option<&Path>,
    ) -> Result<Self, ObserveError> {
        let url = format!("{}/pods", kubelet_url.trim_end_matches('/'));
        let uri: Uri = url.parse().map_err(|source| ObserveError::KubeletUrl {
            url: kubelet_url.to_owned(),
            reason: format!("{source}"),
        })?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(ObserveError::KubeletUrl {
                    url: kubelet_url.to_owned(),
                    reason: "the scheme must be http or https".to_owned(),
                });
            }
        };
        let tls = match (https, ca_file) {
            (true, None) => {
                return Err(ObserveError::KubeletUrl {
                    url: kubelet_url.to_owned(),
                    reason: "an https kubelet URL needs --kubelet-ca-file".to_owned(),
                });
            }
            (_, Some(ca_file)) => client_tls(ca_file)?,
            (false, None) => rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|source| ObserveError::Tls {
                what: "setting up TLS".to_owned(),
                source,
            })?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let token = token_file
            .map(|path| {
                let token =
                    std::fs::read_to_string(path).map_err(|source| ObserveError::ReadFile {
                        what: "the kubelet token file",
                        path: path.to_path_buf(),
                        source,
                    })?;
                HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
                    ObserveError::KubeletUrl {
                        url: kubelet_url.to_owned(),
                        reason: format!("the token in {} is not a header value", path.display()),
                    }
                })
            })
            .transpose()?;
        Ok(Self {
            url,
            uri,
            token,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Reads `/pods` once.
    pub async fn read(&self) -> Result<PodsAnswer, PodsReadError> {
        let started_at_ns = monotonic_now_ns();
        let mut request = Request::get(self.uri.clone());
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, token.clone());
        }
        let request = request
            .body(Empty::new())
            .map_err(|source| PodsReadError::Body {
                url: self.url.clone(),
                source: source.into(),
            })?;
        let fetch =
            async {
                let response = self.client.request(request).await.map_err(|source| {
                    PodsReadError::Request {
                        url: self.url.clone(),
                        source,
                    }
                })?;
                if response.status() != StatusCode::OK {
                    return Err(PodsReadError::Status {
                        url: self.url.clone(),
                        status: response.status(),
                    });
                }
                let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
                    .collect()
                    .await
                    .map_err(|source| PodsReadError::Body {
                        url: self.url.clone(),
                        source,
                    })?
                    .to_bytes();
                Ok(body)
            };
        let body = tokio::time::timeout(REQUEST_TIMEOUT, fetch)
            .await
            .map_err(|_| PodsReadError::Timeout {
                url: self.url.clone(),
                timeout: REQUEST_TIMEOUT,
            })??;
        let seen_at_ns = monotonic_now_ns();
        Ok(PodsAnswer {
            pods: decode_pods(&self.url, &body)?,
            started_at_ns,
            seen_at_ns,
        })
    }
}

fn client_tls(ca_file: &Path) -> Result<rustls::ClientConfig, ObserveError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|source| ObserveError::CaFile {
            path: ca_file.to_path_buf(),
            reason: source.to_string(),
        })?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(ObserveError::CaFile {
            path: ca_file.to_path_buf(),
            reason: "it holds no usable certificate".to_owned(),
        });
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|source| ObserveError::Tls {
        what: format!("setting up TLS with {}", ca_file.display()),
        source,
    })?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// Polls `/pods` every `interval` while `tracker` has exits waiting; forever. A read starts every
/// `interval` whether or not the ones before have answered (up to [`MAX_READS_IN_FLIGHT`]), so how
/// soon a report is seen does not grow with how long the kubelet takes to answer.
pub async fn run(
    pods: KubeletPods,
    tracker: Arc<LagTracker>,
    interval: Duration,
    health: Arc<Health>,
) {
    let source = tracker.source();
    // Read once at start so an unreachable kubelet shows at once, not at the first exit.
    let mut last_problem = settle_read(&pods, &tracker, &health, None, pods.read().await);
    loop {
        tracker.wait_for_exits().await;
        let mut reads = FuturesUnordered::new();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
        while !tracker.is_idle() {
            tokio::select! {
                biased;
                Some(result) = reads.next(), if !reads.is_empty() => {
                    last_problem = settle_read(&pods, &tracker, &health, last_problem.as_deref(), result);
                    if last_problem.is_some() {
                        ticks.reset_after(RETRY_AFTER_ERROR);
                    }
                }
                _ = ticks.tick(), if reads.len() < MAX_READS_IN_FLIGHT => reads.push(pods.read()),
            }
        }
        tracing::debug!(source = source.label(), "no exits waiting; polling stops");
    }
}

/// Settles one read against the tracker; returns the problem it had, logging it when it differs
/// from the one before (and the recovery when there is none any more).
fn settle_read(
    pods: &KubeletPods,
    tracker: &LagTracker,
    health: &Health,
    last_problem: Option<&str>,
    read: Result<PodsAnswer, PodsReadError>,
) -> Option<String> {
    let source = tracker.source();
    match read {
        Ok(answer) => {
            tracker.settle(
                &answer.pods,
                Listing::Complete {
                    started_at_ns: answer.started_at_ns,
                },
                answer.seen_at_ns,
            );
            if last_problem.is_some() {
                tracing::info!(
                    source = source.label(),
                    url = pods.url(),
                    "the kubelet answers again"
                );
            }
            health.source_ok(source);
            None
        }
        Err(err) => {
            let problem = error_chain(&err);
            tracker.count_error();
            if last_problem != Some(problem.as_str()) {
                tracing::warn!(
                    source = source.label(),
                    "reading the kubelet's pods (retrying): {problem}"
                );
            }
            // Exits that can never be reported are still given up on while the kubelet is down.
            tracker.settle([], Listing::Partial, monotonic_now_ns());
            health.source_failed(source, problem.clone());
            Some(problem)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_list_decodes_and_bad_json_says_what_it_was() {
        let pods = decode_pods(
            "http://k/pods",
            br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"a","uid":"u"}},{"spec":{}}]}"#,
        )
        .unwrap();
        assert_eq!(pods.len(), 2);
        let err = decode_pods("http://k/pods", b"<html>nope</html>").unwrap_err();
        assert!(
            error_chain(&err).starts_with("the answer of GET http://k/pods is not a pod list: "),
            "{}",
            error_chain(&err)
        );
    }

    #[test]
    fn https_needs_a_ca_and_other_schemes_are_refused() {
        let err = KubeletPods::new("https://127.0.0.1:10250", None, None)
            .err()
            .unwrap();
        assert!(err.to_string().contains("--kubelet-ca-file"), "{err}");
        let err = KubeletPods::new("ftp://x", None, None).err().unwrap();
        assert!(err.to_string().contains("http or https"), "{err}");
        assert_eq!(
            KubeletPods::new("http://127.0.0.1:10255/", None, None)
                .unwrap()
                .url(),
            "http://127.0.0.1:10255/pods"
        );
    }

    /// A bad answer is counted and reported, and the next read goes on.
    #[tokio::test]
    async fn a_bad_answer_does_not_stop_the_loop() {
        use crate::event_stream::EventBroadcaster;
        use crate::observe::args::SourceKind;
        use crate::observe::metrics::ObserveMetrics;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for body in ["not json", r#"{"items":[]}"#] {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).await.unwrap();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let metrics = ObserveMetrics::new(&[SourceKind::KubeletPods]).unwrap();
        let tracker = LagTracker::new(
            SourceKind::KubeletPods,
            Duration::from_mins(5),
            metrics.clone(),
            EventBroadcaster::default(),
        );
        let health = Health::default();
        let pods = KubeletPods::new(&format!("http://127.0.0.1:{port}"), None, None).unwrap();
        let problem = settle_read(&pods, &tracker, &health, None, pods.read().await).unwrap();
        assert!(problem.contains("is not a pod list"), "{problem}");
        assert!(health.render(true).contains("kubelet_pods"));
        assert_eq!(
            settle_read(&pods, &tracker, &health, Some(&problem), pods.read().await),
            None
        );
        assert!(
            metrics
                .render()
                .unwrap()
                .contains("ringlet_observed_source_errors_total{source=\"kubelet_pods\"} 1")
        );
    }
}
