//! The exec / attach / port-forward endpoints' plumbing (the kubelet's `pkg/kubelet/server` stream
//! handlers with `remotecommand.NewOptions` / `portforward.NewV4Options`, and the upgrade-aware
//! proxy of `k8s.io/apimachinery/pkg/util/proxy`): parsing the kubelet's query parameters, and
//! relaying the client to the session URL the runtime handed out. The runtime's streaming server
//! speaks SPDY or WebSocket after a `101 Switching Protocols`; the proxy joins the two upgraded
//! connections and copies bytes both ways without looking at them.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::router::{Body, full};
use crate::container::{ExecRequest, StreamOptions};
use crate::error_chain::error_chain;

/// The runtime's streaming server is local; anything slower than this is not answering.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Until the runtime's response headers (the session itself is not bounded here).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a stream request cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum StreamingError {
    #[error("invalid value {value:?} for query parameter {param}: expected true or false")]
    Bool { param: &'static str, value: String },
    #[error("the query parameter command is required")]
    NoCommand,
    #[error(
        "at least one of the query parameters input, output and error (stdin, stdout, stderr) must be true"
    )]
    NoStreams,
    #[error("invalid value {value:?} for query parameter port: expected a port from 1 to 65535")]
    Port { value: String },
    #[error("invalid runtime streaming URL {url:?}: {reason}")]
    RuntimeUrl { url: String, reason: String },
    #[error("connecting to the runtime's streaming server at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("the runtime's streaming server at {url} did not answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("talking to the runtime's streaming server at {url}")]
    Http {
        url: String,
        #[source]
        source: hyper::Error,
    },
}

impl StreamingError {
    /// The status the router answers with: the client's mistakes are 400, the runtime's 502.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Bool { .. } | Self::NoCommand | Self::NoStreams | Self::Port { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::RuntimeUrl { .. }
            | Self::Connect { .. }
            | Self::Timeout { .. }
            | Self::Http { .. } => StatusCode::BAD_GATEWAY,
        }
    }
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Whether any of a flag's names is given as true. The API server sends `1`; `true` is accepted too,
/// and a bare name (`?tty`) means true.
fn flag(pairs: &[(String, String)], names: &[&'static str]) -> Result<bool, StreamingError> {
    let mut set = false;
    for (key, value) in pairs {
        let Some(param) = names.iter().find(|name| **name == key) else {
            continue;
        };
        set |= match value.to_ascii_lowercase().as_str() {
            "" | "1" | "t" | "true" => true,
            "0" | "f" | "false" => false,
            _ => {
                return Err(StreamingError::Bool {
                    param,
                    value: value.clone(),
                });
            }
        };
    }
    Ok(set)
}

fn streams(pairs: &[(String, String)]) -> Result<StreamOptions, StreamingError> {
    let tty = flag(pairs, &["tty"])?;
    let options = StreamOptions {
        stdin: flag(pairs, &["input", "stdin"])?,
        stdout: flag(pairs, &["output", "stdout"])?,
        // A terminal has one output stream; the kubelet drops stderr then too.
        stderr: flag(pairs, &["error", "stderr"])? && !tty,
        tty,
    };
    if !(options.stdin || options.stdout || options.stderr) {
        return Err(StreamingError::NoStreams);
    }
    Ok(options)
}

/// The streams of an `/attach/...` request.
pub fn stream_options_from_query(query: Option<&str>) -> Result<StreamOptions, StreamingError> {
    streams(&query_pairs(query))
}

/// The command (repeated `command=`) and streams of an `/exec/...` request.
pub fn exec_request_from_query(query: Option<&str>) -> Result<ExecRequest, StreamingError> {
    let pairs = query_pairs(query);
    let cmd: Vec<String> = pairs
        .iter()
        .filter(|(key, _)| key == "command")
        .map(|(_, value)| value.clone())
        .collect();
    if cmd.is_empty() {
        return Err(StreamingError::NoCommand);
    }
    Ok(ExecRequest {
        cmd,
        streams: streams(&pairs)?,
    })
}

/// The ports of a `/portForward/...` request: repeated `port=`, each possibly a comma-separated list.
/// None is fine: SPDY clients name the port on each stream instead.
pub fn ports_from_query(query: Option<&str>) -> Result<Vec<i32>, StreamingError> {
    let mut ports = Vec::new();
    for (key, value) in query_pairs(query) {
        if key != "port" {
            continue;
        }
        for part in value.split(',') {
            let port = part
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|port| *port > 0)
                .ok_or_else(|| StreamingError::Port {
                    value: part.to_owned(),
                })?;
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// Relays `request` to the runtime's session URL (plain HTTP on a local port) and answers with the
/// runtime's response. After a `101 Switching Protocols` both upgraded connections are joined in a
/// background task. A runtime that cannot be reached or answers garbage gives a 502 naming why.
pub async fn proxy_to_runtime(request: Request<Incoming>, target_url: &str) -> Response<Body> {
    match forward(request, target_url).await {
        Ok(response) => response,
        Err(error) => {
            let message = error_chain(&error);
            tracing::warn!(error = %message, "proxying a stream request to the runtime");
            let mut response = Response::new(full(format!("{message}\n")));
            *response.status_mut() = error.http_status();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            response
        }
    }
}

async fn forward(
    mut request: Request<Incoming>,
    target_url: &str,
) -> Result<Response<Body>, StreamingError> {
    let bad_url = |reason: &str| StreamingError::RuntimeUrl {
        url: target_url.to_owned(),
        reason: reason.to_owned(),
    };
    let target: Uri = target_url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad_url(&e.to_string()))?;
    if target.scheme_str() != Some("http") {
        return Err(bad_url("only http:// URLs are supported"));
    }
    let authority = target
        .authority()
        .ok_or_else(|| bad_url("no host"))?
        .clone();
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(80);
    let addr = host
        .parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, port));
    let connect = async {
        match addr {
            Ok(addr) => TcpStream::connect(addr).await,
            Err(_) => TcpStream::connect((host, port)).await,
        }
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| StreamingError::Timeout {
            url: target_url.to_owned(),
            timeout: CONNECT_TIMEOUT,
        })?
        .map_err(|source| StreamingError::Connect {
            addr: authority.to_string(),
            source,
        })?;
    let http_error = |source| StreamingError::Http {
        url: target_url.to_owned(),
        source,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http_error)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "connection to the runtime's streaming server");
        }
    });

    let client_upgrade = hyper::upgrade::on(&mut request);
    let (parts, body) = request.into_parts();
    // Like the kubelet's proxy: the runtime's path with the client's query (the WebSocket
    // port-forward reads its ports from there).
    let path = match parts.uri.query() {
        Some(query) => format!("{}?{query}", target.path()),
        None => target
            .path_and_query()
            .map_or_else(|| "/".to_owned(), ToString::to_string),
    };
    let mut outgoing = Request::new(body);
    *outgoing.method_mut() = parts.method;
    *outgoing.uri_mut() = path
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad_url(&e.to_string()))?;
    let headers = outgoing.headers_mut();
    for (name, value) in &parts.headers {
        // The client's credentials are for the agent; the session URL is the runtime's own.
        if name != header::HOST
            && name != header::AUTHORIZATION
            && name != header::PROXY_AUTHORIZATION
        {
            headers.append(name, value.clone());
        }
    }
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        headers.insert(header::HOST, host);
    }

    let mut response = tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(outgoing))
        .await
        .map_err(|_| StreamingError::Timeout {
            url: target_url.to_owned(),
            timeout: RESPONSE_TIMEOUT,
        })?
        .map_err(http_error)?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let runtime_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(join_upgraded(client_upgrade, runtime_upgrade));
        let (parts, _) = response.into_parts();
        let empty = Empty::new().map_err(|never| match never {}).boxed_unsync();
        return Ok(Response::from_parts(parts, empty));
    }
    let (mut parts, body) = response.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(
        parts,
        body.map_err(io::Error::other).boxed_unsync(),
    ))
}

/// Headers that describe one connection, not the message: hyper sets its own on the client side.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHENTICATE,
];

/// Copies bytes between the client's and the runtime's upgraded connections until both ends close.
async fn join_upgraded(client: OnUpgrade, runtime: OnUpgrade) {
    let (client, runtime) = match tokio::try_join!(client, runtime) {
        Ok(upgraded) => upgraded,
        Err(error) => {
            tracing::debug!(%error, "upgrading a stream connection");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut runtime = TokioIo::new(runtime);
    match tokio::io::copy_bidirectional(&mut client, &mut runtime).await {
        Ok((to_runtime, to_client)) => {
            tracing::debug!(to_runtime, to_client, "stream session ended");
        }
        Err(error) => tracing::debug!(%error, "stream session ended"),
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use hyper::service::service_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn exec_queries_parse_like_the_kubelet() {
        let request = exec_request_from_query(Some(
            "command=sh&command=-c&command=echo%20hi+there&input=1&output=1&error=1",
        ))
        .unwrap();
        assert_eq!(request.cmd, ["sh", "-c", "echo hi there"]);
        assert_eq!(
            request.streams,
            StreamOptions {
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false
            }
        );
        let request =
            exec_request_from_query(Some("command=ls&stdout=true&stderr=true&tty=1")).unwrap();
        assert_eq!(
            request.streams,
            StreamOptions {
                stdin: false,
                stdout: true,
                stderr: false,
                tty: true
            },
            "a terminal has no separate stderr"
        );
        let streams = stream_options_from_query(Some("input=1&tty")).unwrap();
        assert!(streams.stdin && streams.tty && !streams.stdout);
    }

    #[test]
    fn bad_exec_queries_name_the_problem() {
        let cases = [
            ("output=1", "the query parameter command is required"),
            (
                "command=ls&output=0",
                "at least one of the query parameters input, output and error (stdin, stdout, stderr) must be true",
            ),
            (
                "command=ls&output=yes",
                "invalid value \"yes\" for query parameter output: expected true or false",
            ),
            (
                "command=ls&stdin=2",
                "invalid value \"2\" for query parameter stdin: expected true or false",
            ),
        ];
        for (query, message) in cases {
            let err = exec_request_from_query(Some(query)).unwrap_err();
            assert_eq!(err.to_string(), message, "{query}");
            assert_eq!(err.http_status(), StatusCode::BAD_REQUEST);
        }
        assert!(matches!(
            stream_options_from_query(None),
            Err(StreamingError::NoStreams)
        ));
    }

    #[test]
    fn ports_parse_from_repeated_and_listed_values() {
        assert_eq!(
            ports_from_query(Some("port=80&port=8080,9090&other=1")).unwrap(),
            [80, 8080, 9090]
        );
        assert_eq!(ports_from_query(None).unwrap(), Vec::<i32>::new());
        for bad in ["0", "65536", "-1", "http", ""] {
            let err = ports_from_query(Some(&format!("port={bad}"))).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid value {bad:?} for query parameter port: expected a port from 1 to 65535"
                )
            );
        }
    }

    /// Stands in for the runtime's streaming server: upgrades requests that ask for it and echoes
    /// what arrives; answers others with what it received.
    async fn runtime_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let service = service_fn(|mut request: Request<Incoming>| async move {
                    if !request.headers().contains_key(header::UPGRADE) {
                        let seen = format!(
                            "{} {} authorization={}",
                            request.method(),
                            request.uri(),
                            request.headers().contains_key(header::AUTHORIZATION)
                        );
                        return Ok::<_, Infallible>(Response::new(seen));
                    }
                    let upgrade = hyper::upgrade::on(&mut request);
                    tokio::spawn(async move {
                        let mut io = TokioIo::new(upgrade.await.unwrap());
                        let mut buf = [0u8; 1024];
                        loop {
                            let n = io.read(&mut buf).await.unwrap();
                            if n == 0 {
                                break;
                            }
                            io.write_all(&buf[..n]).await.unwrap();
                        }
                    });
                    let mut response = Response::builder()
                        .status(StatusCode::SWITCHING_PROTOCOLS)
                        .header(header::CONNECTION, "Upgrade")
                        .header(header::UPGRADE, "SPDY/3.1");
                    if let Some(version) = request.headers().get("x-stream-protocol-version") {
                        response = response.header("X-Stream-Protocol-Version", version);
                    }
                    Ok(response.body(String::new()).unwrap())
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades(),
                );
            }
        });
        addr
    }

    /// The agent's side: every request is proxied to `target`.
    async fn proxy_server(target: String) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let target = target.clone();
                let service = service_fn(move |request| {
                    let target = target.clone();
                    async move { Ok::<_, Infallible>(proxy_to_runtime(request, &target).await) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades(),
                );
            }
        });
        addr
    }

    async fn send(addr: SocketAddr, request: Request<Empty<Bytes>>) -> Response<Incoming> {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection.with_upgrades());
        sender.send_request(request).await.unwrap()
    }

    async fn body_text(response: Response<Incoming>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn upgraded_sessions_carry_bytes_both_ways() {
        let runtime = runtime_server().await;
        let proxy = proxy_server(format!("http://{runtime}/exec/token123")).await;
        let request = Request::builder()
            .uri("/exec/default/pod/app?command=sh&input=1&output=1")
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "SPDY/3.1")
            .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
            .body(Empty::new())
            .unwrap();
        let mut response = send(proxy, request).await;
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(
            response.headers()["x-stream-protocol-version"],
            "v4.channel.k8s.io"
        );
        let mut io = TokioIo::new(hyper::upgrade::on(&mut response).await.unwrap());
        for message in [&b"ping"[..], b"a longer second message"] {
            io.write_all(message).await.unwrap();
            let mut echoed = vec![0u8; message.len()];
            io.read_exact(&mut echoed).await.unwrap();
            assert_eq!(echoed, message);
        }
        io.shutdown().await.unwrap();
        let mut rest = Vec::new();
        io.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the runtime's close reaches the client");
    }

    #[tokio::test]
    async fn plain_requests_get_the_runtimes_answer_without_the_clients_credentials() {
        let runtime = runtime_server().await;
        let proxy = proxy_server(format!("http://{runtime}/portforward/tok")).await;
        let request = Request::builder()
            .uri("/portForward/default/pod?port=8080")
            .header(header::AUTHORIZATION, "Bearer secret")
            .body(Empty::new())
            .unwrap();
        let response = send(proxy, request).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            body_text(response).await,
            "GET /portforward/tok?port=8080 authorization=false"
        );
    }

    #[tokio::test]
    async fn a_runtime_that_refuses_is_a_bad_gateway() {
        let closed = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        for (target, reason) in [
            (
                format!("http://{closed}/exec/x"),
                format!("connecting to the runtime's streaming server at {closed}: "),
            ),
            (
                "https://127.0.0.1:1/exec/x".to_owned(),
                "only http:// URLs are supported".to_owned(),
            ),
            (
                "not a url at all".to_owned(),
                "invalid runtime streaming URL".to_owned(),
            ),
        ] {
            let proxy = proxy_server(target.clone()).await;
            let request = Request::builder()
                .uri("/exec/a/b/c")
                .body(Empty::new())
                .unwrap();
            let response = send(proxy, request).await;
            assert_eq!(response.status(), StatusCode::BAD_GATEWAY, "{target}");
            let body = body_text(response).await;
            assert!(body.contains(&reason), "{target}: {body}");
        }
    }
}
