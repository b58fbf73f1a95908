//! End-to-end: image garbage collection by the real `ringlet` binary (the kubelet's
//! `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`, at their defaults of 85 and 80)
//! on a private containerd whose root is a small loop-mounted filesystem, never the lab's (its
//! images are everyone's). Images are used by pods one after the other, the filesystem is filled
//! over the high threshold, and the unused images go least recently used first until usage is
//! down to the low threshold, while the image of a running pod and the sandbox image stay.
//! Run as root after `cargo xtask lab up`, one test at a time.

use std::fs;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ringlet_tests::private_containerd::{PrivateContainerd, ThrowawayImage, throwaway_image};
use ringlet_tests::{
    Agent, AgentOptions, busybox_pod, container_status, phase, require_lab, wait_for,
};
use serde_json::Value;

/// The image filesystem: room for the images below and a filler, and small enough that the
/// difference between the thresholds (5 %) is less than what the test has collected.
const FS_MIB: u64 = 160;
/// Random bytes per throwaway image; each takes about twice that on disk (content and the
/// unpacked snapshot).
const JUNK_MIB: usize = 12;
const START: Duration = Duration::from_mins(1);
/// Several collection periods (1 s in this test) and the removals.
const COLLECTED: Duration = Duration::from_mins(1);
const LOW_THRESHOLD_PERCENT: u64 = 80;

/// Every kubelet default but the period: the kubelet's fixed 5 minutes would make each step that
/// waits for a detection wait minutes, holding the node lock every agent test needs.
const CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
imageGCPeriod: 1s
";

fn running(pod: &Value) -> bool {
    phase(pod) == "Running"
        && container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
}

fn sleeper(name: &str, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["sleep", "3600"]
"#
    )
}

/// Runs a pod of `image` until the agent has seen a container use it, then removes the pod and
/// waits until the runtime has no container of it left.
fn use_image(
    agent: &Agent,
    containerd: &PrivateContainerd,
    name: &str,
    reference: &str,
    image: &ThrowawayImage,
) -> Result<()> {
    agent.write_manifest(&format!("{name}.yaml"), &sleeper(name, reference))?;
    agent.wait_pod(name, "running", START, running)?;
    wait_for(
        &format!("the agent to see {reference} in use"),
        COLLECTED,
        || {
            agent
                .log()
                .lines()
                .any(|line| {
                    line.contains("image is in use by a container") && line.contains(&image.id)
                })
                .then_some(())
        },
    )
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 40)))?;
    agent.remove_manifest(&format!("{name}.yaml"))?;
    wait_for(
        &format!("the containers of {reference} to be removed"),
        START,
        || {
            let out = containerd.ctr().args(["containers", "ls"]).output().ok()?;
            (out.status.success() && !String::from_utf8_lossy(&out.stdout).contains(reference))
                .then_some(())
        },
    )?;
    Ok(())
}

/// The order in which the agent logged removing the given images.
fn removal_order(log: &str, images: &[(&str, &ThrowawayImage)]) -> Vec<String> {
    log.lines()
        .filter(|line| line.contains("removing image to free bytes"))
        .filter_map(|line| {
            images
                .iter()
                .find(|(_, image)| line.contains(&image.id))
                .map(|(name, _)| (*name).to_owned())
        })
        .collect()
}

/// Fills the image filesystem so that bringing it down to the low threshold means freeing
/// `to_free` bytes, which puts it over the high threshold.
fn fill_to_free(containerd: &PrivateContainerd, to_free: u64) -> Result<()> {
    let before = containerd.fs_usage()?;
    let target_available = before.capacity * (100 - LOW_THRESHOLD_PERCENT) / 100 - to_free;
    let filler = before
        .available
        .checked_sub(target_available)
        .with_context(|| format!("already fuller than the test wants: {before:?}"))?;
    containerd.fill("filler", filler)?;
    let after_fill = containerd.fs_usage()?;
    ensure!(
        after_fill.percent() >= 85,
        "filled to {}% only: {after_fill:?}",
        after_fill.percent()
    );
    Ok(())
}

#[test]
fn unused_images_go_least_recently_used_first_down_to_the_low_threshold() -> Result<()> {
    if !require_lab("unused_images_go_least_recently_used_first_down_to_the_low_threshold") {
        return Ok(());
    }
    let containerd = PrivateContainerd::start(FS_MIB)?;
    containerd.import_lab_image("registry.k8s.io_pause_3.10.oci.tar")?;
    containerd.import_lab_image("docker.io_library_busybox_latest.oci.tar")?;
    let archives = tempfile::tempdir()?;
    let mut images = Vec::new();
    for name in ["never-used", "used-first", "used-last"] {
        let reference = format!("example.test/image-gc/{name}:1");
        let archive = archives.path().join(format!("{name}.tar"));
        let image = throwaway_image(&reference, JUNK_MIB, &archive)?;
        containerd.import(&archive)?;
        images.push((name, reference, image));
    }
    drop(archives);
    let before = containerd.fs_usage()?;
    ensure!(
        before.percent() < 85,
        "the images alone fill {}% of the filesystem",
        before.percent()
    );

    let config = tempfile::NamedTempFile::new()?;
    fs::write(config.path(), CONFIG)?;
    let agent = Agent::start(
        "image_gc",
        AgentOptions {
            // The kubelet's defaults, given as flags so the harness does not turn collection
            // off as it does for agents on the lab's containerd.
            args: [
                "--config",
                &config.path().display().to_string(),
                "--image-gc-high-threshold",
                "85",
                "--image-gc-low-threshold",
                &LOW_THRESHOLD_PERCENT.to_string(),
            ]
            .map(str::to_owned)
            .to_vec(),
            runtime_socket: Some(containerd.socket()),
            ..AgentOptions::default()
        },
    )?;
    agent.write_manifest("keep.yaml", &busybox_pod("keep", "Always", "sleep 3600"))?;
    agent.wait_pod("keep", "running", START, running)?;
    for (name, reference, image) in &images[1..] {
        use_image(&agent, &containerd, name, reference, image)?;
    }

    // Filled so that the collection must free more than the never-used image and less than it
    // and the image used first together: half-way between the two.
    let [(_, _, never_used), (_, _, used_first), (_, _, used_last)] = &images[..] else {
        unreachable!("three images");
    };
    fill_to_free(&containerd, never_used.size + used_first.size / 2)?;

    let gone = |reference: &str| {
        containerd
            .image_names()
            .is_ok_and(|names| !names.iter().any(|n| n == reference))
    };
    wait_for("the unused images to be collected", COLLECTED, || {
        (gone(&images[0].1) && gone(&images[1].1)).then_some(())
    })
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 60)))?;
    // One more period, so a collection that went on would have removed more by now.
    let rounds = |log: &str| log.matches("image garbage collection succeeded").count();
    let seen = rounds(&agent.log());
    wait_for("another collection", COLLECTED, || {
        (rounds(&agent.log()) > seen + 1).then_some(())
    })?;

    let log = agent.log();
    let named = [
        ("never-used", never_used),
        ("used-first", used_first),
        ("used-last", used_last),
    ];
    assert_eq!(
        removal_order(&log, &named),
        ["never-used", "used-first"],
        "least recently used first, and no more than needed"
    );
    let left = containerd.image_names()?;
    for kept in [
        images[2].1.as_str(),
        "docker.io/library/busybox:latest",
        "registry.k8s.io/pause:3.10",
    ] {
        assert!(
            left.iter().any(|n| n == kept),
            "{kept} was removed: {left:?}"
        );
    }
    let after = containerd.fs_usage()?;
    assert!(
        after.percent() <= LOW_THRESHOLD_PERCENT,
        "usage {}% is above the low threshold after the collection",
        after.percent()
    );
    assert!(
        agent.pod("keep").is_some_and(|pod| running(&pod)),
        "the running pod was disturbed"
    );
    Ok(())
}

/// What the collection reads from a real containerd 1.6 (no agent, so no node lock): the image
/// filesystem is the loop-mounted root, sizes are the content's bytes the fill above is computed
/// from, and the sandbox image counts as in use though no container runs.
#[test]
fn the_runtime_view_of_a_private_containerd() -> Result<()> {
    use ringlet::images::{CriImageGcRuntime, ImageGcRuntime};

    if !require_lab("the_runtime_view_of_a_private_containerd") {
        return Ok(());
    }
    let containerd = PrivateContainerd::start(FS_MIB)?;
    containerd.import_lab_image("registry.k8s.io_pause_3.10.oci.tar")?;
    let archives = tempfile::tempdir()?;
    let archive = archives.path().join("image.tar");
    let image = throwaway_image("example.test/image-gc/view:1", 1, &archive)?;
    containerd.import(&archive)?;

    let socket = containerd.socket().display().to_string();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (images, in_use, fs, pause) = runtime.block_on(async {
        let cri = ringlet::kuberuntime::CriClient::new(&socket, Duration::from_secs(30))?;
        let pause = cri
            .image_status("registry.k8s.io/pause:3.10")
            .await?
            .context("the pause image is missing")?;
        let view = CriImageGcRuntime::new(cri);
        anyhow::Ok((
            view.list_images().await?,
            view.images_in_use().await?,
            view.image_fs().await?,
            pause.id,
        ))
    })?;
    let listed = images
        .iter()
        .find(|listed| listed.id == image.id)
        .with_context(|| format!("{} is not listed: {images:?}", image.id))?;
    assert_eq!(
        listed.size, image.size,
        "containerd reports the content's size"
    );
    assert_eq!(
        in_use.into_iter().collect::<Vec<_>>(),
        [pause],
        "only the sandbox image is in use"
    );
    let usage = containerd.fs_usage()?;
    assert_eq!(
        fs.capacity, usage.capacity,
        "the capacity of the loop filesystem"
    );
    Ok(())
}
