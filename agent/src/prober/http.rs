//! HTTP GET for probes and lifecycle hooks (the kubelet's `pkg/probe/http`: the request of
//! `NewRequestForHTTPGetAction`, `DoHTTPProbe` and the prober's redirect policy), on hyper over
//! plain tokio sockets, one connection per request as the kubelet (`DisableKeepAlives`).
//!
//! A probe follows redirects to the same host name (at most 10), and takes a redirect to another
//! host as it is: a success with a warning. 2xx is a success, any other status a failure. At most
//! 10 KiB of the body is read, so a huge answer costs nothing more. The timeout covers the whole
//! exchange. HTTPS does not verify the server's certificate (the kubelet's `InsecureSkipVerify`).
//! Errors read like Go's (`Get "http://10.88.0.5:80/": dial tcp 10.88.0.5:80: connect: connection
//! refused`), since they end up in events users already search for.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HOST, HeaderName, HeaderValue, LOCATION};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use super::port::resolve_container_port;
use super::tcp::{dial, join_host_port};
use super::{KUBE_MINOR_VERSION, MAX_OUTPUT_BYTES, Outcome, ProbeError, Probed};

/// Redirects a request follows at most (Go's default client policy).
const MAX_REDIRECTS: usize = 10;

/// Bytes of a path that must be escaped to make a request target (what Go's `url.URL.String`
/// escapes in a path).
const PATH_ESCAPES: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'<')
    .add(b'>')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// `http` or `https`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }
}

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme.as_str(),
            join_host_port(&self.host, self.port),
            self.path
        )
    }
}

/// A GET request of a probe or hook.
#[derive(Clone, Debug)]
pub struct HttpGet {
    pub target: Target,
    /// The headers of the action, with `User-Agent` and `Accept` defaults.
    pub headers: Vec<(String, String)>,
}

/// The kubelet's `NewRequestForHTTPGetAction`: scheme (default http), host (default `pod_ip`), port
/// by number or name, path, headers; `purpose` names the user agent (`kube-probe/1.36` for
/// `probe`, `kube-lifecycle/1.36` for `lifecycle`).
pub fn request_for(
    action: &HTTPGetAction,
    container: &Container,
    pod_ip: &str,
    purpose: &str,
) -> Result<HttpGet, ProbeError> {
    let scheme = match action
        .scheme
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("https") => Scheme::Https,
        _ => Scheme::Http,
    };
    let host = action
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod_ip.to_owned());
    let port = resolve_container_port(&action.port, container)?;
    let mut headers: Vec<(String, String)> = action
        .http_headers
        .iter()
        .flatten()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    let has = |headers: &[(String, String)], name: &str| {
        headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    if !has(&headers, "user-agent") {
        headers.push((
            "User-Agent".to_owned(),
            format!("kube-{purpose}/{KUBE_MINOR_VERSION}"),
        ));
    }
    if has(&headers, "accept") {
        // An explicitly empty Accept removes the header.
        let empty = headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("accept") && v.is_empty());
        if empty {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case("accept"));
        }
    } else {
        headers.push(("Accept".to_owned(), "*/*".to_owned()));
    }
    Ok(HttpGet {
        target: Target {
            scheme,
            host,
            port,
            path: request_path(action.path.as_deref().unwrap_or_default()),
        },
        headers,
    })
}

/// The path (and query) of an action as a request target.
fn request_path(path: &str) -> String {
    let path = path.split('#').next().unwrap_or_default();
    let mut out = utf8_percent_encode(path, PATH_ESCAPES).to_string();
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    out
}

/// Which redirects a request follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redirects {
    /// The prober's: only to the same host name; elsewhere the redirect response is the answer.
    SameHost,
    /// Go's default client: any host.
    Any,
}

/// Why a request got no response, printed as Go's `url.Error` (`Get "<url>": <cause>`).
#[derive(Debug, thiserror::Error)]
#[error("Get {url:?}: {cause}")]
pub struct RequestError {
    pub url: String,
    pub cause: String,
}

/// Runs an HTTP probe: the kubelet's `DoHTTPProbe` with the prober's redirect policy, all within
/// `timeout`.
pub async fn probe(request: &HttpGet, timeout: Duration) -> Result<Probed, ProbeError> {
    let deadline = Instant::now() + timeout;
    let exchange = async {
        let (response, _) = match send(request, Redirects::SameHost).await {
            Ok(answer) => answer,
            Err(err) => return Ok(Probed::new(Outcome::Failure, err.to_string())),
        };
        let status = response.status();
        let body = read_at_most(response.into_body(), MAX_OUTPUT_BYTES)
            .await
            .map_err(|cause| {
                ProbeError::Body(
                    RequestError {
                        url: request.target.to_string(),
                        cause,
                    }
                    .to_string(),
                )
            })?;
        Ok(judge(status, &body))
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Ok(result) => result,
        Err(_) => Ok(Probed::new(
            Outcome::Failure,
            RequestError {
                url: request.target.to_string(),
                cause: "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
                    .to_owned(),
            }
            .to_string(),
        )),
    }
}

fn judge(status: StatusCode, body: &[u8]) -> Probed {
    let body = String::from_utf8_lossy(body);
    let code = status.as_u16();
    if (200..400).contains(&code) {
        if code >= 300 {
            return Probed::new(
                Outcome::Warning,
                format!("Probe terminated redirects, Response body: {body}"),
            );
        }
        return Probed::new(Outcome::Success, body);
    }
    // As the kubelet: the body stays out of the failure text, which ends up in events.
    Probed::new(
        Outcome::Failure,
        format!("HTTP probe failed with statuscode: {code}"),
    )
}

/// Sends the GET of a lifecycle hook (following redirects anywhere, as the kubelet's default
/// client) and reads and drops at most 10 KiB of the answer. Any response is a success: the
/// kubelet does not look at the status of a hook's answer.
pub async fn hook_get(request: &HttpGet) -> Result<StatusCode, RequestError> {
    let (response, _) = send(request, Redirects::Any).await?;
    let status = response.status();
    // What remains of the body does not matter; a broken one neither.
    let _ = read_at_most(response.into_body(), MAX_OUTPUT_BYTES).await;
    Ok(status)
}

/// Sends the request and follows redirects per `policy`; returns the final response and target.
pub async fn send(
    request: &HttpGet,
    policy: Redirects,
) -> Result<(Response<Incoming>, Target), RequestError> {
    let mut target = request.target.clone();
    let first_host = target.host.clone();
    let mut followed = 0;
    loop {
        let response = send_once(&target, &request.headers)
            .await
            .map_err(|cause| RequestError {
                url: target.to_string(),
                cause,
            })?;
        if !is_redirect(response.status()) {
            return Ok((response, target));
        }
        let Some(location) = response.headers().get(LOCATION) else {
            return Ok((response, target));
        };
        let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
        let next = resolve_location(&target, &location).ok_or_else(|| RequestError {
            url: target.to_string(),
            cause: format!("failed to parse Location header {location:?}"),
        })?;
        if policy == Redirects::SameHost && next.host != first_host {
            return Ok((response, target));
        }
        followed += 1;
        if followed > MAX_REDIRECTS {
            return Err(RequestError {
                url: next.to_string(),
                cause: format!("stopped after {MAX_REDIRECTS} redirects"),
            });
        }
        target = next;
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// The target a `Location` header names, relative to `base`.
fn resolve_location(base: &Target, location: &str) -> Option<Target> {
    let location = location.split('#').next().unwrap_or_default();
    if let Some(rest) = location.strip_prefix("//") {
        return resolve_location(base, &format!("{}://{rest}", base.scheme.as_str()));
    }
    if location.contains("://") {
        let uri: Uri = location.parse().ok()?;
        let scheme = match uri.scheme_str()? {
            s if s.eq_ignore_ascii_case("http") => Scheme::Http,
            s if s.eq_ignore_ascii_case("https") => Scheme::Https,
            _ => return None,
        };
        let authority = uri.authority()?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = authority.port_u16().unwrap_or(match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        });
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        return Some(Target {
            scheme,
            host,
            port,
            path: request_path(&path),
        });
    }
    let path = if location.starts_with('/') {
        location.to_owned()
    } else {
        let base_path = base.path.split('?').next().unwrap_or("/");
        let dir = &base_path[..=base_path.rfind('/').unwrap_or(0)];
        format!("{dir}{location}")
    };
    Some(Target {
        path: request_path(&path),
        ..base.clone()
    })
}

/// One request on a fresh connection.
async fn send_once(
    target: &Target,
    headers: &[(String, String)],
) -> Result<Response<Incoming>, String> {
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(target.path.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|err| err.to_string())?;
    let map = request.headers_mut();
    add_headers(map, headers)?;
    if !map.contains_key(HOST) {
        let host = join_host_port(&target.host, target.port);
        map.insert(
            HOST,
            HeaderValue::from_str(&host).map_err(|err| err.to_string())?,
        );
    }
    let stream = dial(&target.host, target.port, Duration::MAX)
        .await
        .map_err(|err| err.to_string())?;
    match target.scheme {
        Scheme::Http => exchange(stream, request).await,
        Scheme::Https => {
            let name =
                ServerName::try_from(target.host.clone()).map_err(|err| format!("tls: {err}"))?;
            let tls = TlsConnector::from(insecure_tls())
                .connect(name, stream)
                .await
                .map_err(|err| format!("tls: {err}"))?;
            exchange(tls, request).await
        }
    }
}

fn add_headers(map: &mut HeaderMap, headers: &[(String, String)]) -> Result<(), String> {
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("net/http: invalid header field name {name:?}"))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("net/http: invalid header field value for {name:?}"))?;
        map.append(header, value);
    }
    Ok(())
}

/// Drives one HTTP/1.1 exchange on `stream`; the connection lives as long as the response body.
async fn exchange<S>(
    stream: S,
    request: Request<Empty<Bytes>>,
) -> Result<Response<Incoming>, String>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| hyper_error(&err))?;
    // The connection ends when the response body is done or dropped (hyper closes a connection
    // whose body the caller abandoned), or when the server hangs up.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|err| hyper_error(&err))
}

/// hyper's errors in Go's words where they differ (`EOF` for a connection closed early).
fn hyper_error(err: &hyper::Error) -> String {
    if err.is_incomplete_message() {
        "EOF".to_owned()
    } else {
        err.to_string()
    }
}

/// Reads at most `limit` bytes of the body (the kubelet's `ReadAtMost`: a longer body is cut, not
/// an error).
async fn read_at_most(mut body: Incoming, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|err| hyper_error(&err))?;
        if let Ok(data) = frame.into_data() {
            let room = limit - out.len();
            out.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok(out)
}

/// TLS that accepts any server certificate, as the kubelet's probes (`InsecureSkipVerify`).
fn insecure_tls() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(AcceptAnyCertificate(Arc::clone(&provider)));
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|_| ClientConfig::builder())
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }))
}

/// Accepts any server certificate, as the kubelet's HTTPS probes do (they do not verify the
/// container's certificate); the provider names the signature schemes offered.
#[derive(Debug)]
pub struct AcceptAnyCertificate(pub Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Reads one request head from `socket`.
    async fn read_head<S: AsyncRead + Unpin>(socket: &mut S) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                break;
            }
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    /// A server answering each request with what `answer` makes of its head; returns its port and
    /// the heads it saw.
    async fn serve(
        answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    ) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = Arc::clone(&seen);
                let answer = Arc::clone(&answer);
                tokio::spawn(async move {
                    let head = read_head(&mut socket).await;
                    seen.lock().unwrap().push(head.clone());
                    // A client that hangs up early makes the write fail: that is fine.
                    let _ = socket.write_all(&answer(&head)).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        (port, heads)
    }

    fn response(status: &str, headers: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    fn get(port: u16, path: &str) -> HttpGet {
        let action = HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        };
        request_for(&action, &Container::default(), "127.0.0.1", "probe").unwrap()
    }

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[test]
    fn requests_are_built_like_the_kubelets() {
        let container = Container {
            ports: Some(vec![ContainerPort {
                name: Some("web".into()),
                container_port: 8443,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        };
        let action = HTTPGetAction {
            scheme: Some("HTTPS".into()),
            path: Some("healthz?full=1#frag".into()),
            port: IntOrString::String("web".into()),
            http_headers: Some(vec![
                HTTPHeader {
                    name: "X-Probe".into(),
                    value: "yes".into(),
                },
                HTTPHeader {
                    name: "Accept".into(),
                    value: String::new(),
                },
            ]),
            ..HTTPGetAction::default()
        };
        let request = request_for(&action, &container, "10.88.0.5", "probe").unwrap();
        assert_eq!(
            request.target.to_string(),
            "https://10.88.0.5:8443/healthz?full=1"
        );
        assert_eq!(
            request.headers,
            [
                ("X-Probe".to_owned(), "yes".to_owned()),
                ("User-Agent".to_owned(), "kube-probe/1.36".to_owned()),
            ]
        );
        let defaults = request_for(
            &HTTPGetAction {
                host: Some("example.com".into()),
                port: IntOrString::Int(80),
                ..HTTPGetAction::default()
            },
            &container,
            "10.88.0.5",
            "lifecycle",
        )
        .unwrap();
        assert_eq!(defaults.target.to_string(), "http://example.com:80/");
        assert_eq!(
            defaults.headers,
            [
                ("User-Agent".to_owned(), "kube-lifecycle/1.36".to_owned()),
                ("Accept".to_owned(), "*/*".to_owned()),
            ]
        );
        assert!(matches!(
            request_for(
                &HTTPGetAction {
                    port: IntOrString::String("nope".into()),
                    ..HTTPGetAction::default()
                },
                &container,
                "10.88.0.5",
                "probe"
            ),
            Err(ProbeError::Port(_))
        ));
    }

    #[tokio::test]
    async fn status_codes_decide_and_the_request_carries_the_headers() {
        let (port, heads) = serve(|head| {
            if head.starts_with("GET /ok ") {
                response("200 OK", "", "fine")
            } else {
                response("500 Internal Server Error", "", "secret detail")
            }
        })
        .await;
        assert_eq!(
            probe(&get(port, "/ok"), TIMEOUT).await.unwrap(),
            Probed::new(Outcome::Success, "fine")
        );
        let head = heads.lock().unwrap()[0].to_ascii_lowercase();
        assert!(head.contains("user-agent: kube-probe/1.36\r\n"), "{head}");
        assert!(head.contains("accept: */*\r\n"), "{head}");
        assert!(
            head.contains(&format!("host: 127.0.0.1:{port}\r\n")),
            "{head}"
        );
        assert_eq!(
            probe(&get(port, "/broken"), TIMEOUT).await.unwrap(),
            Probed::new(Outcome::Failure, "HTTP probe failed with statuscode: 500")
        );
    }

    #[tokio::test]
    async fn same_host_redirects_are_followed_and_others_are_a_warning() {
        let (other, _) = serve(|_| response("200 OK", "", "elsewhere")).await;
        let (port, heads) = serve(move |head| {
            if head.starts_with("GET /start ") {
                response("302 Found", "location: /ok\r\n", "")
            } else if head.starts_with("GET /away ") {
                let to = format!("location: http://127.0.0.2:{other}/\r\n");
                response("301 Moved Permanently", &to, "moved")
            } else if head.starts_with("GET /loop") {
                response("307 Temporary Redirect", "location: /loop\r\n", "")
            } else {
                response("200 OK", "", "arrived")
            }
        })
        .await;
        assert_eq!(
            probe(&get(port, "/start"), TIMEOUT).await.unwrap(),
            Probed::new(Outcome::Success, "arrived")
        );
        assert_eq!(
            probe(&get(port, "/away"), TIMEOUT).await.unwrap(),
            Probed::new(
                Outcome::Warning,
                "Probe terminated redirects, Response body: moved"
            )
        );
        heads.lock().unwrap().clear();
        let looped = probe(&get(port, "/loop"), TIMEOUT).await.unwrap();
        assert_eq!(
            looped,
            Probed::new(
                Outcome::Failure,
                format!("Get \"http://127.0.0.1:{port}/loop\": stopped after 10 redirects")
            )
        );
        assert_eq!(
            heads.lock().unwrap().len(),
            11,
            "the first request and 10 redirects"
        );
    }

    #[tokio::test]
    async fn a_ten_megabyte_answer_is_cut_at_ten_kib() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_head(&mut socket).await;
            let size = 10 * 1024 * 1024;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n");
            socket.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b'x'; 64 * 1024];
            let mut sent = 0;
            while sent < size {
                // The prober hangs up after 10 KiB: the rest cannot be delivered.
                if socket.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            sent
        });
        let probed = probe(&get(port, "/big"), TIMEOUT).await.unwrap();
        assert_eq!(probed.outcome, Outcome::Success);
        assert_eq!(probed.output.len(), MAX_OUTPUT_BYTES);
        let sent = server.await.unwrap();
        assert!(sent < 10 * 1024 * 1024, "the prober read the whole answer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _held = tokio::spawn(async move {
            let mut open: Vec<TcpStream> = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let probed = probe(&get(port, "/hang"), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(
            probed,
            Probed::new(
                Outcome::Failure,
                format!(
                    "Get \"http://127.0.0.1:{port}/hang\": context deadline exceeded \
                     (Client.Timeout exceeded while awaiting headers)"
                )
            )
        );
    }

    #[tokio::test]
    async fn https_probes_accept_any_certificate() {
        use rustls::ServerConfig;
        use tokio_rustls::TlsAcceptor;

        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["not-this-host".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(socket).await.unwrap();
            read_head(&mut tls).await;
            tls.write_all(&response("200 OK", "", "secure"))
                .await
                .unwrap();
            let _ = tls.shutdown().await;
        });
        let mut request = get(port, "/");
        request.target.scheme = Scheme::Https;
        assert_eq!(
            probe(&request, TIMEOUT).await.unwrap(),
            Probed::new(Outcome::Success, "secure")
        );
    }
}
