//! The exec mechanism (the kubelet's `pkg/probe/exec` over the runtime's `ExecSync`): exit code 0 is
//! a success, any other a failure with the command's output (stdout then stderr, at most 10 KiB); a
//! command still running at the timeout is killed by the runtime and fails with `command "..." timed
//! out`; a runtime error is an errored probe.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use super::{MAX_OUTPUT_BYTES, Outcome, ProbeError, Probed};
use crate::container::{CommandRunner, ContainerId, ExecOutput, RuntimeError};
use crate::kuberuntime::container::expand;

/// Runs `cmd` in the container and judges its exit.
pub async fn probe(
    runner: &dyn CommandRunner,
    container: &ContainerId,
    cmd: Vec<String>,
    timeout: Duration,
) -> Result<Probed, ProbeError> {
    let joined = cmd.join(" ");
    match runner.exec_sync(container, cmd, timeout).await {
        Ok(output) => Ok(judge(&output)),
        Err(RuntimeError::Timeout { .. }) => Ok(Probed::new(
            Outcome::Failure,
            format!("command {joined:?} timed out"),
        )),
        Err(err) => Err(ProbeError::Exec(err.to_string())),
    }
}

fn judge(output: &ExecOutput) -> Probed {
    let mut data = output.stdout.clone();
    data.extend_from_slice(&output.stderr);
    data.truncate(MAX_OUTPUT_BYTES);
    let text = String::from_utf8_lossy(&data).into_owned();
    if output.exit_code == 0 {
        Probed::new(Outcome::Success, text)
    } else {
        Probed::new(Outcome::Failure, text)
    }
}

/// The probe's command with `$(VAR)` references to the container's literal `env` values expanded
/// (the kubelet's `ExpandContainerCommandOnlyStatic`): exec probes see no downward API or secrets.
pub fn expand_command(command: &[String], container: &Container) -> Vec<String> {
    let vars: HashMap<String, String> = container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    let lookup = |name: &str| vars.get(name).map(String::as_str);
    command.iter().map(|arg| expand(arg, lookup)).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::EnvVar;

    use super::*;

    /// Answers every exec with a fixed result and remembers the calls.
    struct FixedRunner {
        answer: Mutex<Option<Result<ExecOutput, RuntimeError>>>,
        calls: Mutex<Vec<(Vec<String>, Duration)>>,
    }

    impl FixedRunner {
        fn new(answer: Result<ExecOutput, RuntimeError>) -> Self {
            Self {
                answer: Mutex::new(Some(answer)),
                calls: Mutex::default(),
            }
        }
    }

    #[async_trait]
    impl CommandRunner for FixedRunner {
        async fn exec_sync(
            &self,
            _container: &ContainerId,
            cmd: Vec<String>,
            timeout: Duration,
        ) -> Result<ExecOutput, RuntimeError> {
            self.calls.lock().unwrap().push((cmd, timeout));
            self.answer.lock().unwrap().take().unwrap()
        }
    }

    fn exited(code: i32, stdout: &[u8], stderr: &[u8]) -> ExecOutput {
        ExecOutput {
            exit_code: code,
            stdout: stdout.to_vec(),
            stderr: stderr.to_vec(),
        }
    }

    async fn run(
        answer: Result<ExecOutput, RuntimeError>,
    ) -> (Result<Probed, ProbeError>, Duration) {
        let runner = FixedRunner::new(answer);
        let cmd = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "test -f /ready".to_owned(),
        ];
        let result = probe(
            &runner,
            &ContainerId::from("c1"),
            cmd,
            Duration::from_secs(3),
        )
        .await;
        let timeout = runner.calls.lock().unwrap()[0].1;
        (result, timeout)
    }

    #[tokio::test]
    async fn exit_codes_decide_and_output_is_kept() {
        let (ok, timeout) = run(Ok(exited(0, b"fine\n", b""))).await;
        assert_eq!(ok.unwrap(), Probed::new(Outcome::Success, "fine\n"));
        assert_eq!(timeout, Duration::from_secs(3));
        let (failed, _) = run(Ok(exited(1, b"out ", b"err"))).await;
        assert_eq!(failed.unwrap(), Probed::new(Outcome::Failure, "out err"));
    }

    #[tokio::test]
    async fn output_is_cut_at_ten_kib() {
        let (probed, _) = run(Ok(exited(1, &vec![b'x'; 3 * MAX_OUTPUT_BYTES], b""))).await;
        assert_eq!(probed.unwrap().output.len(), MAX_OUTPUT_BYTES);
    }

    #[tokio::test]
    async fn a_timeout_fails_and_other_runtime_errors_are_errors() {
        let (timed_out, _) = run(Err(RuntimeError::Timeout {
            call: "ExecSync",
            timeout_ms: 3000,
        }))
        .await;
        assert_eq!(
            timed_out.unwrap(),
            Probed::new(
                Outcome::Failure,
                "command \"sh -c test -f /ready\" timed out"
            )
        );
        let (errored, _) = run(Err(RuntimeError::NotFound {
            what: "container",
            id: "c1".into(),
        }))
        .await;
        let err = errored.unwrap_err();
        assert_eq!(err.outcome(), Outcome::Unknown);
        assert_eq!(err.to_string(), "container c1 not found in the runtime");
    }

    #[test]
    fn commands_expand_only_literal_env_values() {
        let container = Container {
            name: "app".into(),
            env: Some(vec![
                EnvVar {
                    name: "FILE".into(),
                    value: Some("/tmp/healthy".into()),
                    ..EnvVar::default()
                },
                EnvVar {
                    name: "SECRET".into(),
                    value: None,
                    ..EnvVar::default()
                },
            ]),
            ..Container::default()
        };
        let cmd = ["cat", "$(FILE)", "$(SECRET)", "$(NOPE)", "$$(FILE)"].map(str::to_owned);
        assert_eq!(
            expand_command(&cmd, &container),
            ["cat", "/tmp/healthy", "", "$(NOPE)", "$(FILE)"]
        );
    }
}
