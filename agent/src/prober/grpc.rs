//! The gRPC mechanism (the kubelet's `pkg/probe/grpc`): `grpc.health.v1.Health/Check` over plain
//! HTTP/2 (no TLS, as the kubelet) to the pod IP, connection and call within the timeout. `SERVING`
//! is a success; another status, an error status or no connection is a failure with the kubelet's
//! text. One difference: the kubelet's blocking dial retries a refused connection until the
//! timeout; here a refused connection fails at once (same outcome, sooner).

use std::time::Duration;

use ringlet_proto::grpc::health::v1::HealthCheckRequest;
use ringlet_proto::grpc::health::v1::health_check_response::ServingStatus;
use ringlet_proto::grpc::health::v1::health_client::HealthClient;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Endpoint;

use super::tcp::join_host_port;
use super::{KUBE_MINOR_VERSION, Outcome, Probed, go_duration};

/// Asks the health service at `host:port` about `service` (empty: the whole server).
pub async fn probe(host: &str, port: u16, service: &str, timeout: Duration) -> Probed {
    let addr = join_host_port(host, port);
    let deadline = Instant::now() + timeout;
    let failure = |text: String| Probed::new(Outcome::Failure, text);
    let connect_timeout = || {
        failure(format!(
            "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
            go_duration(timeout)
        ))
    };
    let endpoint = match Endpoint::from_shared(format!("http://{addr}")) {
        Ok(endpoint) => endpoint,
        Err(err) => {
            return failure(format!(
                "error: failed to connect service at {addr:?}: {err}"
            ));
        }
    };
    let endpoint = match endpoint.user_agent(format!("kube-probe/{KUBE_MINOR_VERSION}")) {
        Ok(endpoint) => endpoint.connect_timeout(timeout),
        Err(err) => {
            return failure(format!(
                "error: failed to connect service at {addr:?}: {err}"
            ));
        }
    };
    let channel = match tokio::time::timeout_at(deadline, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(err)) if is_timeout(&err) => return connect_timeout(),
        Ok(Err(err)) => {
            return failure(format!(
                "error: failed to connect service at {addr:?}: {}",
                crate::error_chain::error_chain(&err)
            ));
        }
        Err(_) => return connect_timeout(),
    };
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    let mut client = HealthClient::new(channel);
    let response = match tokio::time::timeout_at(deadline, client.check(request)).await {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return failure(status_text(&status, timeout)),
        Err(_) => {
            return failure(format!(
                "timeout: health rpc did not complete within {}",
                go_duration(timeout)
            ));
        }
    };
    match response.status() {
        ServingStatus::Serving => Probed::new(Outcome::Success, "service healthy"),
        other => failure(format!(
            "service unhealthy (responded with {:?})",
            other.as_str_name()
        )),
    }
}

/// The kubelet's text for a failed `Check`.
fn status_text(status: &tonic::Status, timeout: Duration) -> String {
    match status.code() {
        Code::Unimplemented => format!(
            "error: this server does not implement the grpc health protocol \
             (grpc.health.v1.Health): {}",
            status.message()
        ),
        Code::DeadlineExceeded => format!(
            "timeout: health rpc did not complete within {}",
            go_duration(timeout)
        ),
        code => format!(
            "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
            status.message()
        ),
    }
}

fn is_timeout(err: &tonic::transport::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = source {
        if current
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            || current.to_string().contains("timed out")
        {
            return true;
        }
        source = current.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use ringlet_proto::grpc::health::v1::HealthCheckResponse;
    use ringlet_proto::grpc::health::v1::health_server::{Health, HealthServer};
    use tokio::net::TcpListener;
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::{Request, Response, Status};

    use super::*;

    /// A health service whose answer the test sets; it remembers the services asked about.
    #[derive(Clone, Default)]
    struct FakeHealth {
        answer: Arc<Mutex<Option<Result<ServingStatus, Code>>>>,
        asked: Arc<Mutex<Vec<String>>>,
        delay: Duration,
    }

    #[tonic::async_trait]
    impl Health for FakeHealth {
        async fn check(
            &self,
            request: Request<HealthCheckRequest>,
        ) -> Result<Response<HealthCheckResponse>, Status> {
            self.asked
                .lock()
                .unwrap()
                .push(request.into_inner().service);
            tokio::time::sleep(self.delay).await;
            match self
                .answer
                .lock()
                .unwrap()
                .unwrap_or(Ok(ServingStatus::Serving))
            {
                Ok(status) => Ok(Response::new(HealthCheckResponse {
                    status: status.into(),
                })),
                Err(code) => Err(Status::new(code, "nope")),
            }
        }
    }

    async fn serve(health: FakeHealth) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .serve_with_incoming(HealthServer::new(health), TcpListenerStream::new(listener)),
        );
        port
    }

    const TIMEOUT: Duration = Duration::from_secs(2);

    #[tokio::test]
    async fn serving_is_healthy_and_other_statuses_fail() {
        let health = FakeHealth::default();
        let port = serve(health.clone()).await;
        assert_eq!(
            probe("127.0.0.1", port, "db", TIMEOUT).await,
            Probed::new(Outcome::Success, "service healthy")
        );
        assert_eq!(health.asked.lock().unwrap().as_slice(), ["db"]);
        *health.answer.lock().unwrap() = Some(Ok(ServingStatus::NotServing));
        assert_eq!(
            probe("127.0.0.1", port, "", TIMEOUT).await,
            Probed::new(
                Outcome::Failure,
                "service unhealthy (responded with \"NOT_SERVING\")"
            )
        );
        *health.answer.lock().unwrap() = Some(Err(Code::Unimplemented));
        assert_eq!(
            probe("127.0.0.1", port, "", TIMEOUT).await.output,
            "error: this server does not implement the grpc health protocol \
             (grpc.health.v1.Health): nope"
        );
        *health.answer.lock().unwrap() = Some(Err(Code::NotFound));
        assert_eq!(
            probe("127.0.0.1", port, "x", TIMEOUT).await.output,
            "error: health rpc probe failed: rpc error: code = NotFound desc = nope"
        );
    }

    #[tokio::test]
    async fn a_slow_server_times_out_and_a_closed_port_fails() {
        let slow = FakeHealth {
            delay: Duration::from_secs(30),
            ..FakeHealth::default()
        };
        let port = serve(slow).await;
        let probed = probe("127.0.0.1", port, "", Duration::from_secs(1)).await;
        assert_eq!(
            probed,
            Probed::new(
                Outcome::Failure,
                "timeout: health rpc did not complete within 1s"
            )
        );

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = listener.local_addr().unwrap().port();
        drop(listener);
        let refused = probe("127.0.0.1", closed, "", TIMEOUT).await;
        assert_eq!(refused.outcome, Outcome::Failure);
        assert!(
            refused.output.starts_with(&format!(
                "error: failed to connect service at \"127.0.0.1:{closed}\""
            )),
            "{}",
            refused.output
        );
    }
}
