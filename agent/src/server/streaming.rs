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
        let empty = Empty::new().map_err(|never| match never {}).boxed();
        return Ok(Response::from_parts(parts, empty));
    }
    let (mut parts, body) = response.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(
        parts,
        body.map_err(io::Error::other).boxed(),
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
