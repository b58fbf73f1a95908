//! Container lifecycle hooks (the kubelet's `pkg/kubelet/lifecycle/handlers.go`): runs a
//! `postStart` or `preStop` handler — `exec` in the container (CRI `ExecSync`), `httpGet` to the
//! pod (any answer counts, as the kubelet does not look at the status), or `sleep` — and reports a
//! failure with the kubelet's message. How long a hook may take is the caller's business (the grace
//! period for `preStop`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::container::{CommandRunner, ContainerId};
use crate::prober::{format_pod, http};

/// Why a hook failed: the kubelet's message (it goes to the container's waiting reason, never to
/// events, which only say that the hook failed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// The container a hook runs for.
#[derive(Clone, Copy, Debug)]
pub struct HookTarget<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub id: &'a ContainerId,
    /// Where an `httpGet` without a host goes: the pod IP (the node's for host-network pods).
    pub pod_ip: Option<&'a str>,
}

/// Runs `handler` for `target` to completion.
pub async fn run_handler(
    runner: &dyn CommandRunner,
    target: HookTarget<'_>,
    handler: &LifecycleHandler,
) -> Result<(), HookError> {
    let container = &target.container.name;
    let pod = format_pod(target.pod);
    if let Some(exec) = &handler.exec {
        let command = exec.command.clone().unwrap_or_default();
        let failed = |error: String, output: &[u8]| {
            HookError(format!(
                "Exec lifecycle hook ([{}]) for Container {container:?} in Pod {pod:?} failed - \
                 error: {error}, message: {:?}",
                command.join(" "),
                String::from_utf8_lossy(output)
            ))
        };
        return match runner
            .exec_sync(target.id, command.clone(), Duration::ZERO)
            .await
        {
            Ok(output) if output.exit_code == 0 => Ok(()),
            Ok(output) => {
                let mut all = output.stdout.clone();
                all.extend_from_slice(&output.stderr);
                Err(failed(
                    format!(
                        "command '{}' exited with {}: {}",
                        command.join(" "),
                        output.exit_code,
                        String::from_utf8_lossy(&output.stderr)
                    ),
                    &all,
                ))
            }
            Err(err) => Err(failed(err.to_string(), &[])),
        };
    }
    if let Some(action) = &handler.http_get {
        let path = action.path.as_deref().unwrap_or_default();
        let failed = |error: String| {
            HookError(format!(
                "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - \
                 error: {error}"
            ))
        };
        let has_host = action.host.as_deref().is_some_and(|h| !h.is_empty());
        let pod_ip = match target.pod_ip.filter(|ip| !ip.is_empty()) {
            Some(ip) => ip,
            None if has_host => "",
            None => return Err(failed("failed to find networking container".to_owned())),
        };
        let request = http::request_for(action, target.container, pod_ip, "lifecycle")
            .map_err(|err| failed(err.to_string()))?;
        return http::hook_get(&request)
            .await
            .map(drop)
            .map_err(|err| failed(err.to_string()));
    }
    if let Some(sleep) = &handler.sleep {
        let seconds = u64::try_from(sleep.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        return Ok(());
    }
    let what = if handler.tcp_socket.is_some() {
        "tcpSocket is not supported as a lifecycle handler"
    } else {
        "no action given"
    };
    Err(HookError(format!(
        "Cannot run handler: invalid handler: {what}"
    )))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, SleepAction, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::container::{ExecOutput, RuntimeError};

    struct Runner {
        answer: Mutex<Option<Result<ExecOutput, RuntimeError>>>,
        timeouts: Mutex<Vec<Duration>>,
    }

    #[async_trait]
    impl CommandRunner for Runner {
        async fn exec_sync(
            &self,
            _container: &ContainerId,
            _cmd: Vec<String>,
            timeout: Duration,
        ) -> Result<ExecOutput, RuntimeError> {
            self.timeouts.lock().unwrap().push(timeout);
            self.answer.lock().unwrap().take().unwrap()
        }
    }

    fn runner(answer: Result<ExecOutput, RuntimeError>) -> Runner {
        Runner {
            answer: Mutex::new(Some(answer)),
            timeouts: Mutex::default(),
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

    fn exec(cmd: &[&str]) -> LifecycleHandler {
        LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(cmd.iter().map(|s| (*s).to_owned()).collect()),
            }),
            ..LifecycleHandler::default()
        }
    }

    async fn run(
        runner: &Runner,
        handler: &LifecycleHandler,
        pod_ip: Option<&str>,
    ) -> Result<(), HookError> {
        let pod = pod();
        let container = Container {
            name: "main".into(),
            ..Container::default()
        };
        let id = ContainerId::from("c1");
        let target = HookTarget {
            pod: &pod,
            container: &container,
            id: &id,
            pod_ip,
        };
        run_handler(runner, target, handler).await
    }

    #[tokio::test]
    async fn exec_hooks_succeed_on_exit_zero_and_fail_with_the_kubelets_message() {
        let ok = runner(Ok(ExecOutput::default()));
        run(&ok, &exec(&["true"]), None).await.unwrap();
        assert_eq!(ok.timeouts.lock().unwrap().as_slice(), [Duration::ZERO]);

        let failing = runner(Ok(ExecOutput {
            exit_code: 2,
            stdout: b"out".to_vec(),
            stderr: b"err".to_vec(),
        }));
        let err = run(&failing, &exec(&["sh", "-c", "exit 2"]), None)
            .await
            .unwrap_err();
        assert_eq!(
            err.0,
            "Exec lifecycle hook ([sh -c exit 2]) for Container \"main\" in Pod \"web_ns(u1)\" \
             failed - error: command 'sh -c exit 2' exited with 2: err, message: \"outerr\""
        );
    }

    #[tokio::test]
    async fn http_hooks_count_any_answer_and_fail_without_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 1024];
            let n = socket.read(&mut request).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&request[..n]).into_owned()
        });
        let handler = LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some("/hook".into()),
                port: IntOrString::Int(i32::from(port)),
                ..HTTPGetAction::default()
            }),
            ..LifecycleHandler::default()
        };
        let unused = runner(Ok(ExecOutput::default()));
        run(&unused, &handler, Some("127.0.0.1")).await.unwrap();
        let request = server.await.unwrap();
        assert!(request.starts_with("GET /hook HTTP/1.1\r\n"), "{request}");
        assert!(
            request
                .to_ascii_lowercase()
                .contains("user-agent: kube-lifecycle/1.36"),
            "{request}"
        );

        // Nothing listens any more.
        let err = run(&unused, &handler, Some("127.0.0.1")).await.unwrap_err();
        assert_eq!(
            err.0,
            format!(
                "HTTP lifecycle hook (/hook) for Container \"main\" in Pod \"web_ns(u1)\" failed - \
                 error: Get \"http://127.0.0.1:{port}/hook\": dial tcp 127.0.0.1:{port}: connect: \
                 connection refused"
            )
        );
        let err = run(&unused, &handler, None).await.unwrap_err();
        assert!(
            err.0
                .ends_with("failed - error: failed to find networking container")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_hooks_sleep_and_tcp_hooks_are_refused() {
        let unused = runner(Ok(ExecOutput::default()));
        let sleep = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 5 }),
            ..LifecycleHandler::default()
        };
        let began = tokio::time::Instant::now();
        run(&unused, &sleep, None).await.unwrap();
        assert_eq!(began.elapsed(), Duration::from_secs(5));

        let tcp = LifecycleHandler {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(80),
                ..TCPSocketAction::default()
            }),
            ..LifecycleHandler::default()
        };
        assert_eq!(
            run(&unused, &tcp, None).await.unwrap_err().0,
            "Cannot run handler: invalid handler: tcpSocket is not supported as a lifecycle handler"
        );
    }
}
