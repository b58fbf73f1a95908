//! The hollow runtime end to end, through its real socket: what the agents read from it (status
//! fields, errors, images), and, as root with cgroups, its containers as real processes (exit
//! codes, cgroups, CRI logs, stops with their timeout, a thousand containers in one sandbox, a
//! shutdown).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ringlet_hollow::cgroup::Hierarchies;
use ringlet_hollow::cri::v1 as cri;
use support::{
    Hollow, IMAGE, IMAGE_TAG, error_of, eventually, has_ended, parse_log_line, procs,
    require_cgroups,
};
use tonic::Code;

#[tokio::test]
async fn version_and_status_say_it_is_a_scale_harness() {
    let mut hollow = Hollow::start().await;
    let version = hollow
        .runtime
        .version(cri::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.version, "0.1.0");
    assert_eq!(version.runtime_name, "ringlet-hollow");
    assert_eq!(version.runtime_api_version, "v1");
    assert!(
        version
            .runtime_version
            .ends_with("-scale-harness-not-a-runtime"),
        "{}",
        version.runtime_version
    );
    let status = hollow
        .runtime
        .status(cri::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    let conditions: Vec<(String, bool)> = status
        .status
        .unwrap()
        .conditions
        .into_iter()
        .map(|c| (c.r#type, c.status))
        .collect();
    assert_eq!(
        conditions,
        [
            ("RuntimeReady".to_owned(), true),
            ("NetworkReady".to_owned(), true)
        ]
    );
    assert!(status.info["config"].contains("scale harness, not a container runtime"));
    let config = hollow
        .runtime
        .runtime_config(cri::RuntimeConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        config.linux.unwrap().cgroup_driver,
        cri::CgroupDriver::Cgroupfs as i32
    );
}

#[tokio::test]
async fn sandboxes_echo_their_config() {
    let mut hollow = Hollow::start().await;
    let mut sandbox = hollow.sandbox_config("web", "11111111-2222");
    sandbox.linux.as_mut().unwrap().security_context = Some(cri::LinuxSandboxSecurityContext {
        namespace_options: Some(cri::NamespaceOption {
            network: cri::NamespaceMode::Node as i32,
            pid: cri::NamespaceMode::Container as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    let sandbox_id = hollow.run_sandbox(&sandbox).await;
    assert_eq!(sandbox_id.len(), 64);
    let again = hollow
        .runtime
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await;
    assert_eq!(
        error_of(again),
        (
            Code::Unknown,
            format!(
                "failed to reserve sandbox name \"web_default_11111111-2222_0\": name \
                 \"web_default_11111111-2222_0\" is reserved for \"{sandbox_id}\""
            )
        )
    );
    let status = hollow
        .runtime
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(status.id, sandbox_id);
    assert_eq!(status.metadata, sandbox.metadata);
    assert_eq!(status.state, cri::PodSandboxState::SandboxReady as i32);
    assert!(status.created_at > 0);
    assert_eq!(status.labels, sandbox.labels);
    assert_eq!(status.annotations, sandbox.annotations);
    let options = status.linux.unwrap().namespaces.unwrap().options.unwrap();
    assert_eq!(options.network, cri::NamespaceMode::Node as i32);
    assert_eq!(options.pid, cri::NamespaceMode::Container as i32);
    assert_eq!(status.network.unwrap().ip, "");
    // A truncated id finds the sandbox, as in containerd.
    let listed = hollow
        .runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                id: sandbox_id[..12].to_owned(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sandbox_id);
    assert_eq!(listed[0].labels, sandbox.labels);
}

#[tokio::test]
async fn stopped_sandboxes_take_no_container_and_removed_ones_free_their_name() {
    let mut hollow = Hollow::start().await;
    let sandbox = hollow.sandbox_config("web", "11111111-2222");
    let sandbox_id = hollow.run_sandbox(&sandbox).await;
    hollow
        .runtime
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.clone(),
        })
        .await
        .unwrap();
    let not_ready = hollow
        .runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                state: Some(cri::PodSandboxStateValue {
                    state: cri::PodSandboxState::SandboxNotready as i32,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(not_ready.len(), 1);
    let image_id = hollow.pull(IMAGE).await;
    let config = Hollow::container_config(&sandbox, "late", &image_id, &[]);
    let refused = hollow
        .runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(config),
            sandbox_config: Some(sandbox.clone()),
        })
        .await;
    assert_eq!(error_of(refused).0, Code::NotFound);

    // Removed, it frees its name.
    hollow
        .runtime
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id,
        })
        .await
        .unwrap();
    hollow.run_sandbox(&sandbox).await;
}

#[tokio::test]
async fn pulls_record_images_without_downloading() {
    let mut hollow = Hollow::start().await;
    let sandbox = hollow.sandbox_config("app", "22222222-3333");
    let sandbox_id = hollow.run_sandbox(&sandbox).await;

    // Images: absent until pulled, then known by every spelling.
    assert_eq!(hollow.image_status(IMAGE).await, None);
    let unpulled = Hollow::container_config(&sandbox, "app", IMAGE, &["sleep", "3600"]);
    let refused = hollow
        .runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(unpulled),
            sandbox_config: Some(sandbox.clone()),
        })
        .await;
    assert_eq!(
        error_of(refused),
        (
            Code::NotFound,
            "failed to resolve image \"busybox\": not found".to_owned()
        )
    );
    let image_id = hollow.pull(IMAGE).await;
    assert!(image_id.starts_with("sha256:"), "{image_id}");
    let image = hollow.image_status("busybox:latest").await.unwrap();
    assert_eq!(image.id, image_id);
    assert_eq!(image.repo_tags, [IMAGE_TAG]);
    assert_eq!(hollow.image_status(&image_id).await, Some(image.clone()));

    let fs = hollow
        .images
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        fs.image_filesystems[0].fs_id.as_ref().unwrap().mountpoint,
        hollow.dir.path().join("root").to_string_lossy()
    );
    hollow
        .images
        .remove_image(cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: IMAGE_TAG.to_owned(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert_eq!(hollow.image_status(&image_id).await, None);
}

#[tokio::test]
async fn created_containers_report_containerd_s_fields() {
    let mut hollow = Hollow::start().await;
    let sandbox = hollow.sandbox_config("app", "22222222-3333");
    let sandbox_id = hollow.run_sandbox(&sandbox).await;
    let image_id = hollow.pull(IMAGE).await;
    let image = hollow.image_status(&image_id).await.unwrap();

    // A container as the kubelet creates it: the image by id.
    let mut config = Hollow::container_config(&sandbox, "app", &image_id, &["sleep", "3600"]);
    config.mounts = vec![cri::Mount {
        container_path: "/data".to_owned(),
        host_path: "/tmp".to_owned(),
        ..Default::default()
    }];
    let id = hollow.create(&sandbox_id, &sandbox, config.clone()).await;
    let status = hollow.status(&id).await;
    assert_eq!(status.id, id);
    assert_eq!(status.metadata, config.metadata);
    assert_eq!(status.state, cri::ContainerState::ContainerCreated as i32);
    assert!(status.created_at > 0);
    assert_eq!((status.started_at, status.finished_at), (0, 0));
    assert_eq!(status.image.unwrap().image, IMAGE_TAG);
    assert_eq!(status.image_ref, image.repo_digests[0]);
    assert_eq!(status.image_id, image_id);
    assert_eq!(status.labels, config.labels);
    assert_eq!(status.annotations, config.annotations);
    assert_eq!(status.mounts, config.mounts);
    assert_eq!(
        PathBuf::from(&status.log_path),
        Path::new(&sandbox.log_directory).join("app/0.log")
    );
    assert_eq!(status.reason, "");
    let listed = hollow
        .runtime
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: sandbox_id.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
    assert_eq!(listed[0].pod_sandbox_id, sandbox_id);
    assert_eq!(listed[0].image, config.image);
    assert_eq!(listed[0].image_ref, image_id);
    assert_eq!(
        listed[0].state,
        cri::ContainerState::ContainerCreated as i32
    );
    assert_eq!(listed[0].labels, config.labels);
    let again = hollow
        .runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox.clone()),
        })
        .await;
    let (code, message) = error_of(again);
    assert_eq!(code, Code::Unknown);
    assert!(
        message.starts_with(
            "failed to reserve container name \"app_app_default_22222222-3333_0\": name"
        ),
        "{message}"
    );

    // The removed sandbox takes its container along.
    hollow
        .runtime
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id,
        })
        .await
        .unwrap();
    let remaining = hollow
        .runtime
        .list_containers(cri::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(remaining.is_empty());
}

#[tokio::test]
async fn created_containers_refuse_exec_and_log_reopening() {
    let mut hollow = Hollow::start().await;
    let sandbox = hollow.sandbox_config("app", "23232323-4545");
    let sandbox_id = hollow.run_sandbox(&sandbox).await;
    let image_id = hollow.pull(IMAGE).await;
    let config = Hollow::container_config(&sandbox, "app", &image_id, &["sleep", "3600"]);
    let id = hollow.create(&sandbox_id, &sandbox, config).await;

    // What a created container refuses or ignores.
    let exec = hollow
        .runtime
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["true".to_owned()],
            timeout: 1,
        })
        .await;
    let (code, message) = error_of(exec);
    assert_eq!(code, Code::Unimplemented);
    assert!(
        message.contains("not supported by the hollow runtime"),
        "{message}"
    );
    let reopen = hollow
        .runtime
        .reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await;
    assert_eq!(
        error_of(reopen),
        (Code::Unknown, "container is not running".to_owned())
    );
    hollow
        .runtime
        .stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        hollow.status(&id).await.state,
        cri::ContainerState::ContainerCreated as i32
    );
}

#[tokio::test]
async fn unknown_ids_are_not_found() {
    let hollow = Hollow::start().await;
    let unknown = || "0123456789ab".to_owned();
    let mut runtime = hollow.runtime.clone();
    let errors = [
        error_of(
            runtime
                .container_status(cri::ContainerStatusRequest {
                    container_id: unknown(),
                    verbose: false,
                })
                .await,
        ),
        error_of(
            runtime
                .start_container(cri::StartContainerRequest {
                    container_id: unknown(),
                })
                .await,
        ),
        error_of(
            runtime
                .stop_container(cri::StopContainerRequest {
                    container_id: unknown(),
                    timeout: 0,
                })
                .await,
        ),
        error_of(
            runtime
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: unknown(),
                    verbose: false,
                })
                .await,
        ),
        error_of(
            runtime
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: unknown(),
                })
                .await,
        ),
        error_of(
            runtime
                .container_stats(cri::ContainerStatsRequest {
                    container_id: unknown(),
                })
                .await,
        ),
        error_of(
            runtime
                .exec_sync(cri::ExecSyncRequest {
                    container_id: unknown(),
                    ..Default::default()
                })
                .await,
        ),
    ];
    for (code, message) in &errors {
        assert_eq!(*code, Code::NotFound, "{message}");
    }
    assert_eq!(
        errors[0].1,
        "an error occurred when try to find container \"0123456789ab\": not found"
    );
    assert_eq!(
        errors[3].1,
        "an error occurred when try to find sandbox: not found"
    );
    // Removals are idempotent.
    runtime
        .remove_container(cri::RemoveContainerRequest {
            container_id: unknown(),
        })
        .await
        .unwrap();
    runtime
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: unknown(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn exit_codes_reach_the_container_status() {
    if !require_cgroups("exit_codes_reach_the_container_status") {
        return;
    }
    let mut hollow = Hollow::start().await;
    let pod = hollow.pod("exits", "33333333-4444").await;
    let three = hollow.run(&pod, "three", &["sleep:20", "exit:3"]).await;
    let zero = hollow.run(&pod, "zero", &["exit:0"]).await;
    let killed = hollow.run(&pod, "killed", &["sleep", "3600"]).await;

    let status = hollow.wait_exited(&three).await;
    assert_eq!((status.exit_code, status.reason.as_str()), (3, "Error"));
    assert!(status.created_at > 0);
    assert!(status.started_at >= status.created_at, "{status:?}");
    // The process slept 20 ms before its exit.
    assert!(
        status.finished_at - status.started_at >= 20_000_000,
        "{status:?}"
    );
    let status = hollow.wait_exited(&zero).await;
    assert_eq!((status.exit_code, status.reason.as_str()), (0, "Completed"));
    // An exited container's cgroup is gone, as containerd deletes the task.
    for controller in ["cpu", "memory", "pids"] {
        let dir = hollow.container_cgroup(&pod.uid, &three, controller);
        assert!(!dir.exists(), "{}", dir.display());
    }
    let restart = hollow
        .runtime
        .start_container(cri::StartContainerRequest {
            container_id: zero.clone(),
        })
        .await;
    assert_eq!(
        error_of(restart),
        (
            Code::Unknown,
            "container is in CONTAINER_EXITED state".to_owned()
        )
    );

    // A process killed from outside is a container exit with the signal's code.
    let pid = hollow.pid(&killed).await;
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let status = hollow.wait_exited(&killed).await;
    assert_eq!((status.exit_code, status.reason.as_str()), (137, "Error"));
    assert!(status.finished_at >= status.started_at);
}

#[tokio::test]
async fn running_containers_are_processes_in_their_cgroups() {
    if !require_cgroups("running_containers_are_processes_in_their_cgroups") {
        return;
    }
    let mut hollow = Hollow::start().await;
    let pod = hollow.pod("cgroups", "44444444-5555").await;
    let mut config = Hollow::container_config(&pod.config, "runner", &pod.image_id, &["sleep"]);
    config.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            cpu_shares: 256,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let runner = hollow.create(&pod.id, &pod.config, config).await;
    hollow.start_container(&runner).await;
    let status = hollow.status(&runner).await;
    assert_eq!(status.state, cri::ContainerState::ContainerRunning as i32);
    assert!(status.started_at > 0);
    assert_eq!(status.finished_at, 0);

    // In its own cgroup in every hierarchy, with its limits.
    let pid = hollow.pid(&runner).await;
    assert!(pid > 0);
    for hierarchy in Hierarchies::discover().unwrap().all() {
        let dir = hierarchy
            .mount
            .join(hollow.cgroup_parent(&pod.uid).trim_start_matches('/'))
            .join(&runner);
        assert_eq!(procs(&dir), [pid], "{}", dir.display());
    }
    let memory = hollow.container_cgroup(&pod.uid, &runner, "memory");
    if memory.join("memory.limit_in_bytes").exists() {
        let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (64 << 20).to_string());
        let cpu = hollow.container_cgroup(&pod.uid, &runner, "cpu");
        let shares = std::fs::read_to_string(cpu.join("cpu.shares")).unwrap();
        assert_eq!(shares.trim(), "256");
    }

    // Its stats, and its pod's, come from those cgroups.
    let usage = hollow
        .runtime
        .container_stats(cri::ContainerStatsRequest {
            container_id: runner.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    assert!(usage.cpu.unwrap().usage_core_nano_seconds.unwrap().value > 0);
    assert!(usage.memory.unwrap().usage_bytes.unwrap().value > 0);
    let pods = hollow
        .runtime
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(pods.len(), 1);
    let linux = pods[0].linux.as_ref().unwrap();
    assert_eq!(linux.process.unwrap().process_count.unwrap().value, 1);
    assert_eq!(linux.containers.len(), 1);

    hollow
        .runtime
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(
        kill(Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    );
    for controller in ["cpu", "memory", "pids"] {
        let dir = hollow.container_cgroup(&pod.uid, &runner, controller);
        assert!(!dir.exists(), "{}", dir.display());
    }
}

#[tokio::test]
async fn logs_land_at_the_cri_log_path() {
    if !require_cgroups("logs_land_at_the_cri_log_path") {
        return;
    }
    let mut hollow = Hollow::start().await;
    let pod = hollow.pod("logs", "55555555-6666").await;
    let words = ["out:hello world", "err:oops", "nginx", "out:bye", "exit:0"];
    let id = hollow.run(&pod, "talker", &words).await;
    let status = hollow.wait_exited(&id).await;
    let log = Path::new(&pod.config.log_directory).join("talker/0.log");
    assert_eq!(PathBuf::from(&status.log_path), log);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<_> = text.lines().map(parse_log_line).collect();
    let rest: Vec<(&str, &str, &str)> = lines
        .iter()
        .map(|(_, stream, tag, text)| (stream.as_str(), tag.as_str(), text.as_str()))
        .collect();
    assert_eq!(
        rest,
        [
            ("stdout", "F", "hello world"),
            ("stderr", "F", "oops"),
            ("stdout", "F", "bye")
        ]
    );
    let times: Vec<_> = lines.iter().map(|(time, ..)| *time).collect();
    assert!(times.is_sorted(), "{times:?}");
    // Not against started_at: like containerd, the runtime records that once the process runs,
    // which may be after its first line.
    let created = jiff::Timestamp::from_nanosecond(i128::from(status.created_at)).unwrap();
    assert!(times[0] >= created, "{times:?} {created}");

    // Rotation: the agent renames the file away and asks for a new one.
    let id = hollow
        .run(&pod, "rotated", &["out:before", "sleep:600000"])
        .await;
    let log = Path::new(&pod.config.log_directory).join("rotated/0.log");
    eventually("the first line", || {
        let log = log.clone();
        async move {
            std::fs::read_to_string(&log)
                .is_ok_and(|t| t.ends_with(" stdout F before\n"))
                .then_some(())
        }
    })
    .await;
    std::fs::rename(&log, log.with_extension("log.1")).unwrap();
    hollow
        .runtime
        .reopen_container_log(cri::ReopenContainerLogRequest { container_id: id })
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "");
}

#[tokio::test]
async fn stop_kills_after_the_timeout() {
    if !require_cgroups("stop_kills_after_the_timeout") {
        return;
    }
    let mut hollow = Hollow::start().await;
    let pod = hollow.pod("stops", "77777777-8888").await;
    let polite = hollow.run(&pod, "polite", &["sleep", "3600"]).await;
    // The log line says SIGTERM is blocked: a stop before it would end the process at once.
    let stubborn = hollow
        .run(&pod, "stubborn", &["ignore-sigterm", "out:ready"])
        .await;
    let log = Path::new(&pod.config.log_directory).join("stubborn/0.log");
    eventually("the stubborn container to block SIGTERM", || {
        let log = log.clone();
        async move {
            std::fs::read_to_string(&log)
                .is_ok_and(|t| t.contains(" F ready"))
                .then_some(())
        }
    })
    .await;

    // SIGTERM ends the polite one well before its 30 s.
    let asked = Instant::now();
    hollow
        .runtime
        .stop_container(cri::StopContainerRequest {
            container_id: polite.clone(),
            timeout: 30,
        })
        .await
        .unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    let status = hollow.status(&polite).await;
    assert_eq!(status.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!((status.exit_code, status.reason.as_str()), (143, "Error"));

    // The stubborn one outlives SIGTERM for the whole timeout, then SIGKILL ends it.
    let asked = Instant::now();
    hollow
        .runtime
        .stop_container(cri::StopContainerRequest {
            container_id: stubborn.clone(),
            timeout: 2,
        })
        .await
        .unwrap();
    let took = asked.elapsed();
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    let status = hollow.status(&stubborn).await;
    assert_eq!(status.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(status.exit_code, 137);
    // Stopping again is a no-op.
    hollow
        .runtime
        .stop_container(cri::StopContainerRequest {
            container_id: stubborn,
            timeout: 2,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_thousand_containers_list() {
    const COUNT: usize = 1000;
    if !require_cgroups("a_thousand_containers_list") {
        return;
    }
    let mut hollow = Hollow::start().await;
    let pod = hollow.pod("many", "99999999-0000").await;
    for n in 0..COUNT {
        let name = format!("c{n}");
        let mut config =
            Hollow::container_config(&pod.config, &name, &pod.image_id, &["sleep", "3600"]);
        config.log_path = String::new();
        let id = hollow.create(&pod.id, &pod.config, config).await;
        hollow.start_container(&id).await;
    }
    let listed = hollow
        .runtime
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: pod.id.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(listed.len(), COUNT);
    assert!(
        listed
            .iter()
            .all(|c| c.state == cri::ContainerState::ContainerRunning as i32)
    );
    let stats = hollow
        .runtime
        .list_container_stats(cri::ListContainerStatsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(stats.len(), COUNT);
    assert!(stats.iter().all(|s| s.cpu.is_some() && s.memory.is_some()));
    let pids = hollow.pod_cgroup(&pod.uid, "pids");
    let current = std::fs::read_to_string(pids.join("pids.current")).unwrap();
    assert_eq!(current.trim(), COUNT.to_string());

    hollow
        .runtime
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    let listed = hollow
        .runtime
        .list_containers(cri::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(listed.is_empty());
    let leftovers = std::fs::read_dir(&pids)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .count();
    assert_eq!(leftovers, 0, "container cgroups left in {}", pids.display());
}

#[tokio::test]
async fn a_stopped_runtime_takes_its_containers_along() {
    if !require_cgroups("a_stopped_runtime_takes_its_containers_along") {
        return;
    }
    let mut hollow = Hollow::start().await;
    let pod = hollow.pod("shutdown", "12121212-3434").await;
    let id = hollow.run(&pod, "runner", &["sleep", "3600"]).await;
    let pid = hollow.pid(&id).await;
    let dir = hollow.container_cgroup(&pod.uid, &id, "memory");
    assert_eq!(procs(&dir), [pid]);

    let status = hollow.terminate().await;
    assert!(status.success(), "{status}");
    // Killed and reaped by the runtime (no zombie left), its cgroup removed.
    assert_eq!(
        kill(Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    );
    assert!(!dir.exists(), "{}", dir.display());
}

#[tokio::test]
async fn a_killed_runtime_takes_its_containers_along() {
    if !require_cgroups("a_killed_runtime_takes_its_containers_along") {
        return;
    }
    let mut hollow = Hollow::start().await;
    let pod = hollow.pod("killed", "56565656-7878").await;
    let id = hollow.run(&pod, "runner", &["sleep", "3600"]).await;
    let pid = hollow.pid(&id).await;
    assert!(!has_ended(pid));
    hollow.kill_runtime();
    // The death signal the runtime asked for when it forked the process.
    eventually(
        "the container's process to die with the runtime",
        || async move { has_ended(pid).then_some(()) },
    )
    .await;
}
