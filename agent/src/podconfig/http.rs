//! The http source: polls `--manifest-url` every `--http-check-frequency` with the configured
//! headers. The body is one Pod, a `PodList`, or several YAML documents. A failed fetch or a bad body
//! keeps the pods known so far; a successful empty answer removes them. Plain http only for now.
//! Corresponds to the kubelet's `pkg/kubelet/config/http.go`.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::Request;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::manifest::{
    MAX_MANIFEST_BYTES, Origin, decode_pod_or_list, documents, drop_duplicates, normalize,
};
use super::report::{Problem, Reporter};
use super::{
    PodConfigError, PodSource, REASON_FAILED_TO_FETCH_MANIFEST, REASON_FAILED_TO_PARSE_MANIFEST,
    REASON_FAILED_VALIDATION, SourceSet,
};
use crate::error_chain::error_chain;
use crate::events::Recorder;

/// The kubelet gives the manifest URL 10 s per request.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// A manifest larger than this is certainly a mistake (a wrong URL serving a big file).
const MAX_BODY_BYTES: usize = MAX_MANIFEST_BYTES;

/// Parses a manifest URL and checks that its scheme is one this source can fetch.
pub(super) fn parse_url(url: &str) -> Result<Uri, PodConfigError> {
    let uri: Uri = url.parse().map_err(|source| PodConfigError::InvalidUrl {
        url: url.to_owned(),
        source,
    })?;
    match uri.scheme_str() {
        Some("http") if uri.authority().is_some() => Ok(uri),
        scheme => Err(PodConfigError::UnsupportedUrlScheme {
            url: url.to_owned(),
            scheme: scheme.unwrap_or_default().to_owned(),
        }),
    }
}

fn header_map(headers: &HashMap<String, Vec<String>>) -> Result<HeaderMap, PodConfigError> {
    let mut map = HeaderMap::new();
    for (name, values) in headers {
        let invalid = |reason: String| PodConfigError::InvalidHeader {
            name: name.clone(),
            reason,
        };
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|err| invalid(format!("not a valid header name: {err}")))?;
        for value in values {
            let value = HeaderValue::from_str(value)
                .map_err(|err| invalid(format!("not a valid header value: {err}")))?;
            map.append(header.clone(), value);
        }
    }
    Ok(map)
}

pub(super) struct HttpSource {
    url: String,
    uri: Uri,
    headers: HeaderMap,
    node_name: String,
    client: Client<HttpConnector, Empty<Bytes>>,
    reporter: Reporter,
    last_good: Option<LastGood>,
}

/// The last body that decoded, and what came of it.
struct LastGood {
    digest: [u8; 32],
    pods: Vec<Pod>,
    problems: Vec<Problem>,
}

impl HttpSource {
    pub(super) fn new(
        url: &str,
        headers: &HashMap<String, Vec<String>>,
        node_name: String,
        recorder: Recorder,
    ) -> Result<Self, PodConfigError> {
        Ok(Self {
            url: url.to_owned(),
            uri: parse_url(url)?,
            headers: header_map(headers)?,
            node_name,
            client: Client::builder(TokioExecutor::new()).build_http(),
            reporter: Reporter::new(recorder),
            last_good: None,
        })
    }

    /// Polls on every tick (the first one at once) and sends each successful answer's set.
    pub(super) async fn run(mut self, period: Duration, sets: mpsc::Sender<SourceSet>) {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(pods) = self.poll().await else {
                continue;
            };
            let set = SourceSet {
                source: PodSource::Http,
                pods,
            };
            if sets.send(set).await.is_err() {
                return;
            }
        }
    }

    fn object(&self) -> String {
        format!("http/{}", self.url)
    }

    /// The pods the URL serves now, or `None` when it could not be fetched or decoded (then the
    /// previous set stays).
    pub(super) async fn poll(&mut self) -> Option<Vec<Pod>> {
        let mut problems = Vec::new();
        let pods = match self.fetch().await {
            Ok(body) => self.decode_cached(body, &mut problems).await,
            Err(err) => {
                problems.push(Problem {
                    object: self.object(),
                    reason: REASON_FAILED_TO_FETCH_MANIFEST,
                    message: error_chain(&err),
                    identity: String::new(),
                });
                None
            }
        };
        self.reporter.finish_scan(problems);
        pods
    }

    async fn fetch(&self) -> Result<Bytes, PodConfigError> {
        let mut request = Request::get(self.uri.clone())
            .body(Empty::new())
            .map_err(|source| PodConfigError::BuildRequest {
                url: self.url.clone(),
                source,
            })?;
        request.headers_mut().extend(self.headers.clone());
        let exchange = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|source| PodConfigError::Fetch {
                        url: self.url.clone(),
                        source,
                    })?;
            if response.status() != StatusCode::OK {
                return Err(PodConfigError::HttpStatus {
                    url: self.url.clone(),
                    status: response.status(),
                });
            }
            let body = Limited::new(response.into_body(), MAX_BODY_BYTES);
            let collected = body
                .collect()
                .await
                .map_err(|source| PodConfigError::ReadBody {
                    url: self.url.clone(),
                    source,
                })?;
            Ok(collected.to_bytes())
        };
        tokio::time::timeout(FETCH_TIMEOUT, exchange)
            .await
            .map_err(|_| PodConfigError::FetchTimeout {
                url: self.url.clone(),
                timeout: FETCH_TIMEOUT,
            })?
    }

    /// Decodes a body unless it is the same as the last good one: a big list polled every few
    /// seconds is usually unchanged, and decoding it is the expensive part of a poll. Hashing and
    /// decoding run on a blocking thread: a large or hostile body must not stall the agent's core.
    async fn decode_cached(
        &mut self,
        body: Bytes,
        problems: &mut Vec<Problem>,
    ) -> Option<Vec<Pod>> {
        let decoder = Decoder {
            url: self.url.clone(),
            node_name: self.node_name.clone(),
        };
        let last_good = self.last_good.take();
        let outcome =
            tokio::task::spawn_blocking(move || decoder.decode_cached(last_good, &body)).await;
        match outcome {
            Ok((last_good, pods, found)) => {
                self.last_good = last_good;
                problems.extend(found);
                pods
            }
            Err(err) => {
                tracing::error!(url = %self.url, %err, "decoding the manifest url's body failed");
                None
            }
        }
    }
}

/// What decoding a body needs, apart from the source's state.
struct Decoder {
    url: String,
    node_name: String,
}

impl Decoder {
    fn object(&self) -> String {
        format!("http/{}", self.url)
    }

    /// The pods of `body` and its problems, from `last_good` when the body is unchanged, with the
    /// last good body to remember from now on.
    fn decode_cached(
        &self,
        last_good: Option<LastGood>,
        body: &[u8],
    ) -> (Option<LastGood>, Option<Vec<Pod>>, Vec<Problem>) {
        let digest: [u8; 32] = Sha256::digest(body).into();
        if let Some(last) = &last_good
            && last.digest == digest
        {
            let (pods, problems) = (last.pods.clone(), last.problems.clone());
            return (last_good, Some(pods), problems);
        }
        let mut fresh = Vec::new();
        let Some(pods) = self.decode(body, &mut fresh) else {
            return (last_good, None, fresh);
        };
        let remembered = LastGood {
            digest,
            pods: pods.clone(),
            problems: fresh.clone(),
        };
        (Some(remembered), Some(pods), fresh)
    }

    /// A body that cannot be decoded as a whole keeps the previous set: half of a served list must not
    /// make the other half's pods stop. Single invalid pods are dropped and reported.
    fn decode(&self, body: &[u8], problems: &mut Vec<Problem>) -> Option<Vec<Pod>> {
        let digest = format!("{:x}", Sha256::digest(body));
        let parse_problem = |err: &PodConfigError| Problem {
            object: self.object(),
            reason: REASON_FAILED_TO_PARSE_MANIFEST,
            message: format!("{}: {}", self.url, error_chain(err)),
            identity: digest.clone(),
        };
        let values = match std::str::from_utf8(body)
            .map_err(PodConfigError::NotUtf8)
            .and_then(documents)
        {
            Ok(values) => values,
            Err(err) => {
                problems.push(parse_problem(&err));
                return None;
            }
        };
        let mut decoded = Vec::new();
        for (index, value) in values {
            match decode_pod_or_list(index, value) {
                Ok(pods) => decoded.extend(pods),
                Err(err) => {
                    problems.push(parse_problem(&err));
                    return None;
                }
            }
        }
        let mut pods = Vec::with_capacity(decoded.len());
        for pod in decoded {
            match normalize(pod, Origin::Http(&self.url), &self.node_name) {
                Ok(pod) => pods.push((self.object(), pod)),
                Err(err) => problems.push(Problem {
                    object: self.object(),
                    reason: REASON_FAILED_VALIDATION,
                    message: format!("{}: {}", self.url, error_chain(&err)),
                    identity: digest.clone(),
                }),
            }
        }
        Some(drop_duplicates(pods, problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podconfig::storage::PodStorage;
    use crate::podconfig::{PodOperation, PodUpdate};
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::{Response, StatusCode};
    use hyper_util::rt::TokioIo;
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use tokio::net::TcpListener;

    struct Served {
        status: StatusCode,
        body: String,
        requests: Vec<HeaderMap>,
    }

    type Shared = Arc<Mutex<Served>>;

    /// A manifest server on 127.0.0.1 that answers every request with the current status and body
    /// and remembers the request headers.
    async fn serve(body: &str) -> (SocketAddr, Shared) {
        let shared = Arc::new(Mutex::new(Served {
            status: StatusCode::OK,
            body: body.to_owned(),
            requests: Vec::new(),
        }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = shared.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let state = state.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let mut served = state.lock().unwrap();
                    served.requests.push(request.headers().clone());
                    let response = Response::builder()
                        .status(served.status)
                        .body(Full::new(Bytes::from(served.body.clone())))
                        .unwrap();
                    async move { Ok::<_, Infallible>(response) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (addr, shared)
    }

    fn pod_json(name: &str, uid: &str, labels: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"{name}","uid":"{uid}","labels":{{{labels}}}}},"spec":{{"containers":[{{"name":"c","image":"i:1"}}]}}}}"#
        )
    }

    fn pod_list(items: &[String]) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"PodList","items":[{}]}}"#,
            items.join(",")
        )
    }

    fn source(addr: SocketAddr, headers: &HashMap<String, Vec<String>>) -> (HttpSource, Recorder) {
        let recorder = Recorder::new(None);
        let url = format!("http://{addr}/pods");
        let source = HttpSource::new(&url, headers, "node1".to_owned(), recorder.clone()).unwrap();
        (source, recorder)
    }

    fn ops(updates: &[PodUpdate]) -> Vec<(PodOperation, usize)> {
        updates.iter().map(|u| (u.op, u.pods.len())).collect()
    }

    #[tokio::test]
    async fn served_pods_are_added_and_a_changed_body_updates_them() {
        let body = pod_list(&[pod_json("a", "uid-a", ""), pod_json("b", "uid-b", "")]);
        let (addr, served) = serve(&body).await;
        let (mut source, recorder) = source(addr, &HashMap::new());
        let mut storage = PodStorage::default();

        let pods = source.poll().await.unwrap();
        assert_eq!(pods[0].metadata.name.as_deref(), Some("a-node1"));
        assert_eq!(
            pods[0].metadata.annotations.as_ref().unwrap()
                [crate::podconfig::CONFIG_SOURCE_ANNOTATION],
            "http"
        );
        assert_eq!(
            ops(&storage.merge(PodSource::Http, pods)),
            [(PodOperation::Add, 2)]
        );

        served.lock().unwrap().body = pod_list(&[
            pod_json("a", "uid-a", r#""tier":"web""#),
            pod_json("b", "uid-b", ""),
        ]);
        let updates = storage.merge(PodSource::Http, source.poll().await.unwrap());
        assert_eq!(ops(&updates), [(PodOperation::Update, 1)]);
        assert_eq!(updates[0].pods[0].metadata.uid.as_deref(), Some("uid-a"));
        assert!(recorder.recent().is_empty());
    }

    #[tokio::test]
    async fn a_failed_fetch_keeps_the_pods_and_an_empty_answer_removes_them() {
        let (addr, served) = serve(&pod_json("a", "uid-a", "").replace(
            r#"{"metadata""#,
            r#"{"apiVersion":"v1","kind":"Pod","metadata""#,
        ))
        .await;
        let (mut source, recorder) = source(addr, &HashMap::new());
        let mut storage = PodStorage::default();
        assert_eq!(
            ops(&storage.merge(PodSource::Http, source.poll().await.unwrap())),
            [(PodOperation::Add, 1)]
        );

        served.lock().unwrap().status = StatusCode::INTERNAL_SERVER_ERROR;
        assert!(
            source.poll().await.is_none(),
            "a failed fetch keeps the previous set"
        );
        assert!(source.poll().await.is_none());
        let events = recorder.recent();
        assert_eq!(events.len(), 1, "the same failure is reported once");
        assert_eq!(events[0].reason, REASON_FAILED_TO_FETCH_MANIFEST);
        assert_eq!(events[0].object, format!("http/http://{addr}/pods"));
        assert!(events[0].message.contains("500"), "{}", events[0].message);

        {
            let mut served = served.lock().unwrap();
            served.status = StatusCode::OK;
            served.body = "not: [valid".to_owned();
        }
        assert!(
            source.poll().await.is_none(),
            "a bad body keeps the previous set"
        );
        assert_eq!(recorder.recent()[1].reason, REASON_FAILED_TO_PARSE_MANIFEST);

        served.lock().unwrap().body = String::new();
        let updates = storage.merge(PodSource::Http, source.poll().await.unwrap());
        assert_eq!(ops(&updates), [(PodOperation::Remove, 1)]);
    }

    #[tokio::test]
    async fn an_unreachable_url_is_a_fetch_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (mut source, recorder) = source(addr, &HashMap::new());
        assert!(source.poll().await.is_none());
        assert_eq!(recorder.recent()[0].reason, REASON_FAILED_TO_FETCH_MANIFEST);
    }

    #[tokio::test]
    async fn configured_headers_are_sent() {
        let (addr, served) = serve("").await;
        let headers = HashMap::from([
            ("X-Token".to_owned(), vec!["secret".to_owned()]),
            (
                "X-Multi".to_owned(),
                vec!["one".to_owned(), "two".to_owned()],
            ),
        ]);
        let (mut source, _) = source(addr, &headers);
        assert_eq!(source.poll().await, Some(Vec::new()));
        let served = served.lock().unwrap();
        let request = &served.requests[0];
        assert_eq!(request["x-token"], "secret");
        let multi: Vec<_> = request.get_all("x-multi").iter().collect();
        assert_eq!(multi, ["one", "two"]);
    }

    #[tokio::test]
    async fn yaml_documents_and_invalid_pods_in_a_body() {
        let body = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\nspec:\n  containers:\n  - name: c\n    image: i\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: b\nspec:\n  containers: []\n";
        let (addr, _) = serve(body).await;
        let (mut source, recorder) = source(addr, &HashMap::new());
        let pods = source.poll().await.unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(recorder.recent()[0].reason, REASON_FAILED_VALIDATION);
        // The unchanged body comes from the cache: same pods, no repeated event.
        assert_eq!(source.poll().await.unwrap(), pods);
        assert_eq!(recorder.recent().len(), 1);
    }

    #[tokio::test]
    async fn a_deeply_nested_body_is_refused_and_the_previous_pods_stay() {
        let (addr, served) = serve(&pod_list(&[pod_json("a", "uid-a", "")])).await;
        let (mut source, recorder) = source(addr, &HashMap::new());
        assert_eq!(source.poll().await.unwrap().len(), 1);

        let depth = 100_000;
        served.lock().unwrap().body = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        assert!(
            source.poll().await.is_none(),
            "a refused body keeps the previous set"
        );
        let events = recorder.recent();
        assert_eq!(events[0].reason, REASON_FAILED_TO_PARSE_MANIFEST);
        assert_eq!(
            events[0].message,
            format!(
                "http://{addr}/pods: manifest nests deeper than 128 levels (at line 1, column 129); no pod nests that deep"
            )
        );
    }

    #[tokio::test]
    async fn run_sends_the_first_answer_at_once() {
        let (addr, _) = serve(&pod_list(&[pod_json("a", "uid-a", "")])).await;
        let (source, _) = source(addr, &HashMap::new());
        let (tx, mut rx) = mpsc::channel(1);
        tokio::spawn(source.run(Duration::from_hours(1), tx));
        let set = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(set.source, PodSource::Http);
        assert_eq!(set.pods.len(), 1);
    }

    #[test]
    fn bad_urls_and_headers_are_rejected() {
        let recorder = Recorder::new(None);
        let https = HttpSource::new(
            "https://h/p",
            &HashMap::new(),
            "n".to_owned(),
            recorder.clone(),
        );
        assert!(matches!(
            https,
            Err(PodConfigError::UnsupportedUrlScheme { .. })
        ));
        let headers = HashMap::from([("bad header".to_owned(), vec!["v".to_owned()])]);
        let bad = HttpSource::new("http://h/p", &headers, "n".to_owned(), recorder);
        assert!(matches!(bad, Err(PodConfigError::InvalidHeader { .. })));
    }
}
