//! One probe of a container (the kubelet's `prober.probe` and `runProbeWithRetries`): picks the
//! mechanism, tries up to three times while the probe errors, and records the kubelet's events:
//! `Unhealthy` for a failure (`Liveness probe failed: <output>`) or an error (`... probe errored and
//! resulted in unknown state: <error>`), `ProbeWarning` for a success with a warning.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use super::results::ProbeResult;
use super::{Outcome, ProbeError, ProbeType, Probed, exec, format_pod, grpc, http, tcp};
use crate::container::{CommandRunner, ContainerId};
use crate::events::{EventObject, EventType, Recorder};
use crate::prober::port::resolve_container_port;

/// Attempts of one probe while it errors (the kubelet's `maxProbeRetries`).
const MAX_ATTEMPTS: usize = 3;

/// The probe's timeout (`timeoutSeconds`, 1 s by default and at least 1 s).
pub fn probe_timeout(spec: &Probe) -> Duration {
    Duration::from_secs(
        spec.timeout_seconds
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(1),
    )
}

/// Runs probes; shared by every worker.
pub struct Prober {
    runner: Arc<dyn CommandRunner>,
    recorder: Recorder,
}

impl Prober {
    pub fn new(runner: Arc<dyn CommandRunner>, recorder: Recorder) -> Self {
        Self { runner, recorder }
    }

    /// Probes the container `id` once with `spec` and returns the verdict; an error means the
    /// probe could not run (its result is to be thrown away).
    pub async fn probe(
        &self,
        probe_type: ProbeType,
        pod: &Pod,
        container: &Container,
        spec: &Probe,
        pod_ip: &str,
        id: &ContainerId,
    ) -> Result<ProbeResult, ProbeError> {
        let mut attempt = 0;
        let probed = loop {
            attempt += 1;
            match self.run(pod, container, spec, pod_ip, id).await {
                Err(err) if attempt < MAX_ATTEMPTS => {
                    tracing::debug!(%err, attempt, "probe errored, trying again");
                }
                other => break other,
            }
        };
        let object = || EventObject::container(pod, &container.name);
        match probed {
            Err(err) => {
                self.recorder.event(
                    EventType::Warning,
                    object(),
                    "Unhealthy",
                    format!(
                        "{probe_type} probe errored and resulted in {} state: {err}",
                        err.outcome().as_str()
                    ),
                );
                Err(err)
            }
            Ok(Probed {
                outcome: Outcome::Success,
                ..
            }) => Ok(ProbeResult::Success),
            Ok(Probed {
                outcome: Outcome::Warning,
                output,
            }) => {
                self.recorder.event(
                    EventType::Warning,
                    object(),
                    "ProbeWarning",
                    format!("{probe_type} probe warning: {output}"),
                );
                Ok(ProbeResult::Success)
            }
            Ok(Probed {
                outcome: Outcome::Failure,
                output,
            }) => {
                self.recorder.event(
                    EventType::Warning,
                    object(),
                    "Unhealthy",
                    format!("{probe_type} probe failed: {output}"),
                );
                Ok(ProbeResult::Failure)
            }
            Ok(Probed {
                outcome: Outcome::Unknown,
                ..
            }) => Ok(ProbeResult::Failure),
        }
    }

    /// One attempt with the probe's mechanism.
    async fn run(
        &self,
        pod: &Pod,
        container: &Container,
        spec: &Probe,
        pod_ip: &str,
        id: &ContainerId,
    ) -> Result<Probed, ProbeError> {
        let timeout = probe_timeout(spec);
        if let Some(action) = &spec.exec {
            let command =
                exec::expand_command(action.command.as_deref().unwrap_or_default(), container);
            return exec::probe(self.runner.as_ref(), id, command, timeout).await;
        }
        if let Some(action) = &spec.http_get {
            let request = http::request_for(action, container, pod_ip, "probe")?;
            return http::probe(&request, timeout).await;
        }
        if let Some(action) = &spec.tcp_socket {
            let port = resolve_container_port(&action.port, container)?;
            let host = action
                .host
                .as_deref()
                .filter(|h| !h.is_empty())
                .unwrap_or(pod_ip);
            return Ok(tcp::probe(host, port, timeout).await);
        }
        if let Some(action) = &spec.grpc {
            let port = u16::try_from(action.port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or(super::PortError::Invalid(i64::from(action.port)))?;
            let service = action.service.as_deref().unwrap_or_default();
            return Ok(grpc::probe(pod_ip, port, service, timeout).await);
        }
        Err(ProbeError::MissingHandler {
            pod: format_pod(pod),
            container: container.name.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use crate::container::{ExecOutput, RuntimeError};

    struct ExitCodes(Mutex<Vec<i32>>);

    #[async_trait]
    impl CommandRunner for ExitCodes {
        async fn exec_sync(
            &self,
            _container: &ContainerId,
            _cmd: Vec<String>,
            _timeout: Duration,
        ) -> Result<ExecOutput, RuntimeError> {
            let code = self.0.lock().unwrap().remove(0);
            Ok(ExecOutput {
                exit_code: code,
                stdout: format!("exit {code}").into_bytes(),
                stderr: Vec::new(),
            })
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn container() -> Container {
        Container {
            name: "app".into(),
            ..Container::default()
        }
    }

    fn prober(codes: &[i32]) -> (Prober, Recorder) {
        let recorder = Recorder::new(None);
        (
            Prober::new(
                Arc::new(ExitCodes(Mutex::new(codes.to_vec()))),
                recorder.clone(),
            ),
            recorder,
        )
    }

    fn exec_probe() -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            ..Probe::default()
        }
    }

    fn messages(recorder: &Recorder) -> Vec<(String, String)> {
        recorder
            .recent()
            .into_iter()
            .map(|e| (e.reason, e.message))
            .collect()
    }

    #[tokio::test]
    async fn failures_are_unhealthy_events_with_the_output() {
        let (prober, recorder) = prober(&[0, 3]);
        let id = ContainerId::from("c1");
        let spec = exec_probe();
        let result = prober
            .probe(ProbeType::Liveness, &pod(), &container(), &spec, "", &id)
            .await;
        assert_eq!(result.unwrap(), ProbeResult::Success);
        let result = prober
            .probe(ProbeType::Liveness, &pod(), &container(), &spec, "", &id)
            .await;
        assert_eq!(result.unwrap(), ProbeResult::Failure);
        assert_eq!(
            messages(&recorder),
            [(
                "Unhealthy".to_owned(),
                "Liveness probe failed: exit 3".to_owned()
            )]
        );
    }

    #[tokio::test]
    async fn a_port_name_that_does_not_exist_errors_three_times_and_says_so_once() {
        let (prober, recorder) = prober(&[]);
        let spec = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                ..TCPSocketAction::default()
            }),
            ..Probe::default()
        };
        let result = prober
            .probe(
                ProbeType::Readiness,
                &pod(),
                &container(),
                &spec,
                "10.88.0.9",
                &ContainerId::from("c1"),
            )
            .await;
        assert!(matches!(result, Err(ProbeError::Port(_))));
        assert_eq!(
            messages(&recorder),
            [(
                "Unhealthy".to_owned(),
                "Readiness probe errored and resulted in unknown state: strconv.Atoi: parsing \
                 \"nope\": invalid syntax"
                    .to_owned()
            )]
        );
    }

    #[tokio::test]
    async fn a_probe_without_a_handler_errors() {
        let (prober, _) = prober(&[]);
        let err = prober
            .probe(
                ProbeType::Startup,
                &pod(),
                &container(),
                &Probe::default(),
                "",
                &ContainerId::from("c1"),
            )
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "missing probe handler for web_ns(u1):app");
    }

    #[tokio::test]
    async fn an_http_probe_to_a_closed_port_fails_with_gos_text() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let (prober, recorder) = prober(&[]);
        let spec = Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(i32::from(port)),
                ..HTTPGetAction::default()
            }),
            ..Probe::default()
        };
        let result = prober
            .probe(
                ProbeType::Readiness,
                &pod(),
                &container(),
                &spec,
                "127.0.0.1",
                &ContainerId::from("c1"),
            )
            .await;
        assert_eq!(result.unwrap(), ProbeResult::Failure);
        assert_eq!(
            messages(&recorder)[0].1,
            format!(
                "Readiness probe failed: Get \"http://127.0.0.1:{port}/healthz\": dial tcp \
                 127.0.0.1:{port}: connect: connection refused"
            )
        );
    }
}
