#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, mpsc};

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::fake_host::{FakeHost, Gate};
use super::*;
use crate::io::spawn_connection;
use crate::io::testing::on_both_engines;

struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ServerError>>,
}

fn start(engine: IoEngine, host: Arc<FakeHost>, healthz_only: bool) -> Running {
    let listener = bind("127.0.0.1:0".parse().unwrap(), engine).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = if healthz_only {
        spawn_connection(serve_healthz(listener, host, shutdown))
    } else {
        spawn_connection(serve_read_only(listener, host, shutdown))
    };
    Running { addr, stop, task }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

async fn send(addr: SocketAddr, method: Method, path: &str) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::GET, path).await
}

/// Sends raw bytes and reads until the server closes the connection.
async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A host whose `/pods` answer is over 1 MiB, so a response takes many writes.
pub(crate) fn host_with_large_pods() -> FakeHost {
    let mut host = FakeHost::new();
    host.pods = (0..64)
        .map(|i| {
            let mut pod = super::fake_host::pod(&format!("big{i}"), "Running");
            pod.metadata.annotations = Some([("filler".to_owned(), "x".repeat(20 << 10))].into());
            pod
        })
        .collect();
    host
}

async fn stop(running: Running) -> Result<(), ServerError> {
    running.stop.send(()).unwrap();
    running.task.await.unwrap()
}

async fn pods_is_a_pod_list_of_the_hosts_pods(engine: IoEngine) {
    let host = Arc::new(FakeHost::new());
    let server = start(engine, Arc::clone(&host), false);

    let reply = get(server.addr, "/pods").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers[CONTENT_TYPE], "application/json");
    let raw: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(raw["kind"], "PodList");
    assert_eq!(raw["apiVersion"], "v1");
    assert_eq!(raw["metadata"], serde_json::json!({}));
    let list: List<Pod> = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(list.items, host.pods);
    assert_eq!(
        list.items[0].status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );

    stop(server).await.unwrap();
}

async fn a_response_over_a_mebibyte_arrives_whole(engine: IoEngine) {
    let host = Arc::new(host_with_large_pods());
    let server = start(engine, Arc::clone(&host), false);

    // Twice: the listener keeps serving after a large answer.
    for _ in 0..2 {
        let reply = get(server.addr, "/pods").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body.len() > 1 << 20, "{}", reply.body.len());
        let list: List<Pod> = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(list.items, host.pods);
    }

    stop(server).await.unwrap();
}

async fn healthz_passes_then_fails_with_verbose_output(engine: IoEngine) {
    let host = Arc::new(FakeHost::new());
    let server = start(engine, Arc::clone(&host), false);

    let reply = get(server.addr, "/healthz").await;
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "ok"));
    assert_eq!(reply.headers[CONTENT_TYPE], "text/plain; charset=utf-8");

    let reply = get(server.addr, "/healthz?verbose").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.text(),
        "[+]ping ok\n[+]syncloop ok\n[+]pleg ok\nhealthz check passed\n"
    );

    host.fail("syncloop", "sync loop took 4m to iterate");
    let reply = get(server.addr, "/healthz").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.text(),
        "[+]ping ok\n[-]syncloop failed: reason withheld\n[+]pleg ok\nhealthz check failed\n"
    );

    let reply = get(server.addr, "/healthz/syncloop").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.text(),
        "internal server error: sync loop took 4m to iterate\n"
    );

    stop(server).await.unwrap();
}

async fn metrics_are_prometheus_text_on_the_read_only_port_only(engine: IoEngine) {
    let host = Arc::new(FakeHost::new());
    host.metrics.inc_pleg_discard_events();
    let server = start(engine, Arc::clone(&host), false);
    let reply = get(server.addr, "/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers[CONTENT_TYPE], "text/plain; version=0.0.4");
    assert!(reply.text().contains("\nkubelet_pleg_discard_events 1\n"));
    assert!(reply.text().contains("# TYPE ringlet_pleg_mode gauge\n"));
    stop(server).await.unwrap();

    let server = start(engine, host, true);
    assert_eq!(
        get(server.addr, "/metrics").await.status,
        StatusCode::NOT_FOUND
    );
    stop(server).await.unwrap();
}

async fn single_checks_and_unknown_paths(engine: IoEngine) {
    let host = Arc::new(FakeHost::new());
    host.fail("pleg", "relist has not completed in 3m0s");
    let server = start(engine, host, false);

    let reply = get(server.addr, "/healthz/pleg").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.text(),
        "internal server error: relist has not completed in 3m0s\n"
    );
    let reply = get(server.addr, "/healthz/ping").await;
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "ok"));

    for path in ["/healthz/etcd", "/nope", "/", "/pods/x", "/configz"] {
        assert_eq!(
            get(server.addr, path).await.status,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }

    stop(server).await.unwrap();
}

async fn wrong_method_is_405_with_allow_and_head_works(engine: IoEngine) {
    let server = start(engine, Arc::new(FakeHost::new()), false);

    for (method, path) in [(Method::POST, "/pods"), (Method::DELETE, "/healthz")] {
        let reply = send(server.addr, method, path).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert_eq!(reply.headers[ALLOW], "GET, HEAD");
    }

    let full = get(server.addr, "/pods").await;
    let head = send(server.addr, Method::HEAD, "/pods").await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());
    assert_eq!(
        head.headers[CONTENT_LENGTH],
        full.body.len().to_string().as_str()
    );
    let head = send(server.addr, Method::HEAD, "/healthz").await;
    assert_eq!(head.status, StatusCode::OK);

    stop(server).await.unwrap();
}

async fn healthz_listener_serves_only_healthz(engine: IoEngine) {
    let server = start(engine, Arc::new(FakeHost::new()), true);

    let reply = get(server.addr, "/healthz").await;
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "ok"));
    assert_eq!(
        get(server.addr, "/healthz/syncloop").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(server.addr, "/pods").await.status,
        StatusCode::NOT_FOUND
    );

    stop(server).await.unwrap();
}

async fn malformed_requests_get_400_and_the_server_keeps_serving(engine: IoEngine) {
    let server = start(engine, Arc::new(FakeHost::new()), false);

    let answer = raw(server.addr, b"THIS IS NOT HTTP\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400 Bad Request"), "{answer}");
    let answer = raw(server.addr, b"GET /healthz HTTP/1.1\r\nbad header\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400 Bad Request"), "{answer}");

    let reply = get(server.addr, "/healthz").await;
    assert_eq!(reply.status, StatusCode::OK);

    stop(server).await.unwrap();
}

async fn oversized_headers_are_rejected(engine: IoEngine) {
    let server = start(engine, Arc::new(FakeHost::new()), false);

    let mut request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    request.resize(request.len() + (1 << 20) + 1, b'a');
    request.extend_from_slice(b"\r\n\r\n");
    let answer = raw(server.addr, &request).await;
    assert!(
        answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large"),
        "{answer}"
    );
    assert_eq!(get(server.addr, "/healthz").await.status, StatusCode::OK);

    stop(server).await.unwrap();
}

async fn slow_client_is_cut_off_after_the_header_timeout(engine: IoEngine) {
    let server = start(engine, Arc::new(FakeHost::new()), false);

    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut answer = Vec::new();
    slow.read_to_end(&mut answer).await.unwrap();
    assert!(started.elapsed() >= listener::HEADER_READ_TIMEOUT);
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"));

    stop(server).await.unwrap();
}

async fn shutdown_finishes_an_in_flight_request(engine: IoEngine) {
    let (entered_tx, entered_rx) = oneshot::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let host = Arc::new(FakeHost {
        gate: Some(Gate {
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(release_rx),
        }),
        ..FakeHost::new()
    });
    let Running { addr, stop, task } = start(engine, host, false);

    let in_flight = tokio::spawn(get(addr, "/pods"));
    entered_rx.await.unwrap();
    stop.send(()).unwrap();

    // Once the listener is closed the server is draining; it must wait for the open request.
    let mut refused = false;
    for _ in 0..10_000 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(refused, "the listener is still accepting after shutdown");
    assert!(!task.is_finished());

    release_tx.send(()).unwrap();
    let reply = in_flight.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    let list: List<Pod> = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(list.items.len(), 2);
    task.await.unwrap().unwrap();
}

async fn shutdown_gives_up_on_a_stuck_connection(engine: IoEngine) {
    let server = start(engine, Arc::new(FakeHost::new()), false);
    // Half a request head keeps the connection busy until the header timeout, past the grace.
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    assert_eq!(get(server.addr, "/healthz").await.status, StatusCode::OK);

    let error = stop(server).await.unwrap_err();
    assert!(
        matches!(error, ServerError::ShutdownTimedOut { connections: 1, .. }),
        "{error}"
    );
    // The aborted connection is closed rather than left open.
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest).await;
}

async fn idle_connections_do_not_hold_up_shutdown(engine: IoEngine) {
    let server = start(engine, Arc::new(FakeHost::new()), false);
    let mut fresh = TcpStream::connect(server.addr).await.unwrap();
    let mut kept_alive = TcpStream::connect(server.addr).await.unwrap();
    kept_alive
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0; 512];
    let n = kept_alive.read(&mut answer).await.unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200 OK"));
    // The fresh connection was accepted before the second one was answered.

    stop(server).await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(fresh.read_to_end(&mut rest).await.unwrap(), 0);
    assert_eq!(kept_alive.read_to_end(&mut rest).await.unwrap(), 0);
}

async fn bind_reports_the_address_in_use(engine: IoEngine) {
    let first = bind("127.0.0.1:0".parse().unwrap(), engine).unwrap();
    let addr = first.local_addr().unwrap();
    let error = bind(addr, engine).err().unwrap();
    assert!(matches!(error, ServerError::Bind { addr: a, .. } if a == addr));
    assert_eq!(error.to_string(), format!("cannot listen on {addr}"));
    let source = std::error::Error::source(&error).unwrap().to_string();
    assert!(source.to_lowercase().contains("in use"), "{source}");
}

/// Serves the kubelet API's router (auth included) over plain HTTP, so the routes can be tested
/// without TLS; the TLS listener has its own tests.
fn start_api(engine: IoEngine, host: Arc<FakeHost>, debugging: bool, anonymous: bool) -> Running {
    let auth = auth::KubeletAuth::new(
        auth::AuthSettings {
            anonymous_enabled: anonymous,
            webhook_authentication: None,
            authorization: auth::AuthorizationMode::AlwaysAllow,
            node_name: "node1".to_owned(),
        },
        None,
    )
    .unwrap();
    let listener = bind("127.0.0.1:0".parse().unwrap(), engine).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let router = Router::api(host, debugging, auth, engine);
    let task = spawn_connection(listener::run(
        listener,
        listener::Plain,
        router,
        ServeLimits::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    Running { addr, stop, task }
}

async fn the_api_refuses_unauthenticated_requests_before_routing(engine: IoEngine) {
    let server = start_api(engine, Arc::new(FakeHost::new()), true, false);
    for path in ["/pods", "/nope", "/exec/default/web-node1/main"] {
        let reply = get(server.addr, path).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    stop(server).await.unwrap();
}

async fn api_only_routes_answer_on_the_api(engine: IoEngine) {
    let host = FakeHost::new();
    host.metrics.observe_probe(
        &crate::metrics::ProbeLabels {
            probe_type: "Readiness",
            container: "app".into(),
            pod: "web".into(),
            namespace: "default".into(),
            pod_uid: "u1".into(),
        },
        crate::metrics::ProbeOutcomeLabel::Successful,
        Some(std::time::Duration::from_millis(3)),
    );
    let server = start_api(engine, Arc::new(host), true, true);
    let configz = get(server.addr, "/configz").await;
    assert_eq!(configz.status, StatusCode::OK);
    let body: serde_json::Value = serde_json::from_slice(&configz.body).unwrap();
    assert_eq!(body["kubeletconfig"]["port"], 10250);

    let running = get(server.addr, "/runningpods/").await;
    assert_eq!(running.status, StatusCode::OK);
    let list: List<Pod> = serde_json::from_slice(&running.body).unwrap();
    assert_eq!(list.items.len(), 1);

    let probes = get(server.addr, "/metrics/probes").await;
    assert_eq!(probes.status, StatusCode::OK);
    let probes = probes.text();
    assert!(
        probes.contains("# TYPE prober_probe_total counter"),
        "{probes}"
    );
    assert!(
        probes.contains(
            "prober_probe_total{container=\"app\",namespace=\"default\",pod=\"web\",\
             pod_uid=\"u1\",probe_type=\"Readiness\",result=\"successful\"} 1"
        ),
        "{probes}"
    );
    assert!(
        probes.contains("prober_probe_duration_seconds_bucket{container=\"app\""),
        "{probes}"
    );

    let stats = get(server.addr, "/stats/summary").await;
    assert_eq!(stats.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(stats.text(), "no stats in this test\n");
    stop(server).await.unwrap();
}

async fn run_executes_the_space_separated_command_in_the_named_container(engine: IoEngine) {
    let host = Arc::new(FakeHost::with_running_container());
    let server = start_api(engine, Arc::clone(&host), true, true);

    let reply = send(
        server.addr,
        Method::POST,
        "/run/default/web-node1/main?cmd=echo%20hello%20world",
    )
    .await;
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::OK, "echo+hello+world")
    );
    assert_eq!(
        host.streaming.ran.lock().unwrap()[0].1,
        ["echo", "hello", "world"]
    );

    let reply = send(server.addr, Method::POST, "/run/default/web-node1/main").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.text().contains("cmd"), "{}", reply.text());

    let reply = send(server.addr, Method::POST, "/run/default/nope/main?cmd=ls").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);

    let reply = get(server.addr, "/run/default/web-node1/main?cmd=ls").await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(reply.headers[ALLOW], "POST");
    stop(server).await.unwrap();
}

async fn debugging_endpoints_check_their_input_and_can_be_disabled(engine: IoEngine) {
    let host = Arc::new(FakeHost::with_running_container());
    let server = start_api(engine, Arc::clone(&host), true, true);
    let bad_query = get(
        server.addr,
        "/containerLogs/default/web-node1/main?tailLines=-3",
    )
    .await;
    assert_eq!(bad_query.status, StatusCode::BAD_REQUEST);
    assert!(
        bad_query.text().contains("tailLines"),
        "{}",
        bad_query.text()
    );
    let unknown = get(server.addr, "/containerLogs/default/nope/main").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let no_command = get(server.addr, "/exec/default/web-node1/main?stdout=1").await;
    assert_eq!(no_command.status, StatusCode::BAD_REQUEST);
    let runtime_refuses = get(
        server.addr,
        "/exec/default/web-node1/main?command=ls&stdout=1",
    )
    .await;
    assert_eq!(runtime_refuses.status, StatusCode::BAD_GATEWAY);
    let traversal = get(server.addr, "/logs/%2e%2e/etc/passwd").await;
    assert_eq!(traversal.status, StatusCode::BAD_REQUEST);
    stop(server).await.unwrap();

    let server = start_api(engine, host, false, true);
    let disabled = get(server.addr, "/exec/default/web-node1/main?command=ls").await;
    assert_eq!(
        (disabled.status, disabled.text()),
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "Debug endpoints are disabled.\n"
        )
    );
    assert_eq!(get(server.addr, "/pods").await.status, StatusCode::OK);
    stop(server).await.unwrap();
}

on_both_engines! {
    Paused: [
        pods_is_a_pod_list_of_the_hosts_pods,
        a_response_over_a_mebibyte_arrives_whole,
        healthz_passes_then_fails_with_verbose_output,
        metrics_are_prometheus_text_on_the_read_only_port_only,
        single_checks_and_unknown_paths,
        wrong_method_is_405_with_allow_and_head_works,
        healthz_listener_serves_only_healthz,
        malformed_requests_get_400_and_the_server_keeps_serving,
        oversized_headers_are_rejected,
        slow_client_is_cut_off_after_the_header_timeout,
        shutdown_finishes_an_in_flight_request,
        shutdown_gives_up_on_a_stuck_connection,
        idle_connections_do_not_hold_up_shutdown,
        the_api_refuses_unauthenticated_requests_before_routing,
        api_only_routes_answer_on_the_api,
        run_executes_the_space_separated_command_in_the_named_container,
        debugging_endpoints_check_their_input_and_can_be_disabled,
    ],
    Real: [bind_reports_the_address_in_use],
}
