use std::process::{Child, Command};

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

const UID: &str = "0d3f4c2a-1b2c-4d5e-8f90-123456789abc";

fn manager(root: &str, driver: CgroupDriver, cgroups_per_qos: bool) -> PodContainerManager {
    PodContainerManager {
        root: CgroupName::parse(root, driver),
        driver,
        cgroups_per_qos,
        pod_pids_limit: None,
        hierarchies: Hierarchies {
            v2: false,
            roots: Vec::new(),
            unified: None,
        },
    }
}

fn pod(uid: &str, guaranteed: bool) -> Pod {
    let limits = guaranteed.then(|| {
        [("cpu", "100m"), ("memory", "32Mi")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
            .collect()
    });
    Pod {
        metadata: ObjectMeta {
            name: Some("web".to_owned()),
            namespace: Some("default".to_owned()),
            uid: (!uid.is_empty()).then(|| uid.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".to_owned(),
                resources: Some(ResourceRequirements {
                    limits,
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[test]
fn cgroupfs_pod_cgroup_names() {
    let m = manager("/", CgroupDriver::Cgroupfs, true);
    let uid = PodUid::new(UID);
    assert_eq!(
        m.cgroup_parent_for(&uid, QosClass::BestEffort),
        format!("/kubepods/besteffort/pod{UID}")
    );
    assert_eq!(
        m.cgroup_parent_for(&uid, QosClass::Burstable),
        format!("/kubepods/burstable/pod{UID}")
    );
    assert_eq!(
        m.cgroup_parent_for(&uid, QosClass::Guaranteed),
        format!("/kubepods/pod{UID}")
    );
    let nested = manager("/ringlet/nodes", CgroupDriver::Cgroupfs, true);
    assert_eq!(
        nested
            .cgroup_parent_for_runtime(&pod(UID, true))
            .expect("uid"),
        format!("/ringlet/nodes/kubepods/pod{UID}")
    );
}

#[test]
fn systemd_pod_cgroup_names() {
    let m = manager("/", CgroupDriver::Systemd, true);
    let escaped = UID.replace('-', "_");
    assert_eq!(
        m.cgroup_parent_for_runtime(&pod(UID, false)).expect("uid"),
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{escaped}.slice")
    );
    assert_eq!(
        m.cgroup_parent_for_runtime(&pod(UID, true)).expect("uid"),
        format!("/kubepods.slice/kubepods-pod{escaped}.slice")
    );
}

#[test]
fn without_cgroups_per_qos_pods_share_the_root() {
    let m = manager("/ringlet", CgroupDriver::Cgroupfs, false);
    assert_eq!(
        m.cgroup_parent_for_runtime(&pod(UID, false)).expect("uid"),
        "/ringlet"
    );
    assert!(m.exists(&PodUid::new(UID), QosClass::BestEffort));
    m.ensure_exists(&pod(UID, false)).expect("no-op");
    m.destroy(&PodUid::new(UID), QosClass::BestEffort)
        .expect("no-op");
    assert!(m.list_pod_cgroups().expect("no-op").is_empty());
}

#[test]
fn unusable_uids_are_rejected() {
    let m = manager("/", CgroupDriver::Cgroupfs, true);
    assert!(matches!(
        m.cgroup_parent_for_runtime(&pod("", false)),
        Err(CmError::MissingUid { pod }) if pod == "default/web"
    ));
    for bad in ["../../etc", "a/b", "a b", "a_b"] {
        assert!(
            matches!(
                m.ensure_exists(&pod(bad, false)),
                Err(CmError::InvalidUid { .. })
            ),
            "{bad:?} accepted"
        );
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Removes the test's cgroup tree from every hierarchy and kills the helper process, even when an
/// assertion fails half-way.
struct Cleanup {
    relative_root: String,
    roots: Vec<PathBuf>,
    child: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        for root in &self.roots {
            remove_tree(&root.join(&self.relative_root));
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Needs root: creates real cgroups under a unique root, `/ringlet-test-<pid>`. One scenario on one
/// real cgroup tree, so it is long.
#[test]
#[allow(clippy::too_many_lines)]
fn creates_lists_and_destroys_real_pod_cgroups() {
    if !is_root() {
        crate::testing::skip(
            "creates_lists_and_destroys_real_pod_cgroups",
            "creating cgroups needs root",
        );
        return;
    }
    let test_root = format!("ringlet-test-{}", std::process::id());
    let m = PodContainerManager::new(&format!("/{test_root}"), CgroupDriver::Cgroupfs, true)
        .expect("cgroup hierarchies");
    let mut cleanup = Cleanup {
        relative_root: test_root.clone(),
        roots: m.hierarchies.roots.clone(),
        child: None,
    };

    let best_effort = pod(UID, false);
    let guaranteed_uid = "11111111-2222-3333-4444-555555555555";
    let guaranteed = pod(guaranteed_uid, true);
    m.ensure_exists(&best_effort)
        .expect("create best-effort pod cgroup");
    m.ensure_exists(&guaranteed)
        .expect("create guaranteed pod cgroup");
    m.ensure_exists(&best_effort)
        .expect("creating again is a no-op");

    let best_effort_dir = format!("{test_root}/kubepods/besteffort/pod{UID}");
    let guaranteed_dir = format!("{test_root}/kubepods/pod{guaranteed_uid}");
    // The hierarchies to look at: cpu and memory (and the hybrid cgroup2 tree) on v1, the one tree on v2.
    let (controllers, memory_hierarchy) = if m.hierarchies.v2 {
        let unified = PathBuf::from(UNIFIED_MOUNTPOINT);
        (vec![unified.clone()], unified)
    } else {
        let v1 = hierarchies::V1::new();
        let mount = |c| v1.get_mount_point(c).expect("cpu and memory are mounted").0;
        let memory = mount(cgroups_rs::fs::Controllers::Mem);
        let mut controllers = vec![mount(cgroups_rs::fs::Controllers::Cpu), memory.clone()];
        let hybrid = Path::new("/sys/fs/cgroup/unified");
        if hybrid.join("cgroup.procs").exists() {
            assert_eq!(
                m.hierarchies.unified.as_deref(),
                Some(hybrid),
                "hybrid tree not found"
            );
        }
        controllers.extend(m.hierarchies.unified.clone());
        (controllers, memory)
    };
    for hierarchy in &controllers {
        for dir in [&best_effort_dir, &guaranteed_dir] {
            assert!(
                hierarchy.join(dir).is_dir(),
                "{} missing",
                hierarchy.join(dir).display()
            );
        }
    }
    let uid = PodUid::new(UID);
    assert!(m.exists(&uid, QosClass::BestEffort));
    assert!(!m.exists(&uid, QosClass::Burstable));
    assert_eq!(
        m.cgroup_parent_for_runtime(&best_effort).expect("uid"),
        format!("/{best_effort_dir}")
    );

    let listed = m.list_pod_cgroups().expect("list");
    assert_eq!(
        listed,
        vec![
            PodCgroup {
                uid: PodUid::new(guaranteed_uid),
                qos: QosClass::Guaranteed,
                path: format!("/{guaranteed_dir}"),
            },
            PodCgroup {
                uid: uid.clone(),
                qos: QosClass::BestEffort,
                path: format!("/{best_effort_dir}"),
            },
        ]
    );

    // A leftover container cgroup with a live process blocks removal and is named.
    let container_dir = format!("{best_effort_dir}/leftover");
    for root in &m.hierarchies.roots {
        std::fs::create_dir_all(root.join(&container_dir)).expect("container cgroup");
    }
    let child = Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("spawn sleep");
    let pid = child.id();
    cleanup.child = Some(child);
    std::fs::write(
        memory_hierarchy.join(&container_dir).join("cgroup.procs"),
        pid.to_string(),
    )
    .expect("move process into the container cgroup");
    match m.destroy(&uid, QosClass::BestEffort) {
        Err(CmError::HasProcesses { path, pids }) => {
            assert_eq!(path, format!("/{container_dir}"));
            assert_eq!(pids, vec![u64::from(pid)]);
        }
        other => panic!("expected HasProcesses, got {other:?}"),
    }
    assert!(
        m.exists(&uid, QosClass::BestEffort),
        "nothing removed on error"
    );
    // The last resort kills what is left, and names it.
    assert_eq!(
        m.kill_processes(&uid, QosClass::BestEffort)
            .expect("kill the leftover"),
        vec![u64::from(pid)]
    );
    if let Some(mut child) = cleanup.child.take() {
        let status = child.wait().expect("reap sleep");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "the leftover was killed"
        );
    }

    m.destroy(&uid, QosClass::BestEffort)
        .expect("destroy best-effort");
    m.destroy(&PodUid::new(guaranteed_uid), QosClass::Guaranteed)
        .expect("destroy guaranteed");
    for hierarchy in &controllers {
        for dir in [&best_effort_dir, &guaranteed_dir] {
            assert!(
                !hierarchy.join(dir).exists(),
                "{} left",
                hierarchy.join(dir).display()
            );
        }
        // QoS parents stay, as in the kubelet.
        assert!(
            hierarchy
                .join(format!("{test_root}/kubepods/besteffort"))
                .is_dir()
        );
    }
    assert!(!m.exists(&uid, QosClass::BestEffort));
    assert!(m.list_pod_cgroups().expect("list").is_empty());
    m.destroy(&uid, QosClass::BestEffort)
        .expect("destroying a missing cgroup is a no-op");
    drop(cleanup);
    for root in &m.hierarchies.roots {
        assert!(
            !root.join(&test_root).exists(),
            "cleanup left {}",
            root.display()
        );
    }
}

/// Needs root: the pod cgroup gets `podPidsLimit`, the pods' top cgroup the node allocatable
/// settings, and a reserved cgroup that does not exist is named, on real cgroups under
/// `/ringlet-limits-test-<pid>`. One scenario on one real cgroup tree, so it is long.
#[test]
#[allow(clippy::too_many_lines)]
fn limits_reach_real_cgroups() {
    if !is_root() {
        crate::testing::skip("limits_reach_real_cgroups", "creating cgroups needs root");
        return;
    }
    let test_root = format!("ringlet-limits-test-{}", std::process::id());
    let m = PodContainerManager::new(&format!("/{test_root}"), CgroupDriver::Cgroupfs, true)
        .expect("cgroup hierarchies")
        .with_pod_pids_limit(77);
    let _cleanup = Cleanup {
        relative_root: test_root.clone(),
        roots: m.hierarchies.roots.clone(),
        child: None,
    };
    let file = |controller: &str, v1_file: &str, v2_file: &str, dir: &str| -> String {
        let path = if m.hierarchies.v2 {
            Path::new(UNIFIED_MOUNTPOINT).join(dir).join(v2_file)
        } else {
            Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(dir)
                .join(v1_file)
        };
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .trim()
            .to_owned()
    };

    m.ensure_exists(&pod(UID, false))
        .expect("create pod cgroup");
    let pod_dir = format!("{test_root}/kubepods/besteffort/pod{UID}");
    assert_eq!(file("pids", "pids.max", "pids.max", &pod_dir), "77");
    // The QoS parent is not limited.
    assert_eq!(
        file(
            "pids",
            "pids.max",
            "pids.max",
            &format!("{test_root}/kubepods/besteffort")
        ),
        "max"
    );
    // No limit, no write: the default.
    let unlimited =
        PodContainerManager::new(&format!("/{test_root}"), CgroupDriver::Cgroupfs, true)
            .expect("cgroup hierarchies")
            .with_pod_pids_limit(-1);
    let other = "22222222-3333-4444-5555-666666666666";
    unlimited
        .ensure_exists(&pod(other, false))
        .expect("create pod cgroup");
    assert_eq!(
        file(
            "pids",
            "pids.max",
            "pids.max",
            &format!("{test_root}/kubepods/besteffort/pod{other}")
        ),
        "max"
    );

    m.enforce_pods_cgroup(&ResourceConfig {
        cpu_shares: Some(1536),
        memory_bytes: Some(3 << 30),
        pids_max: Some(5000),
    })
    .expect("enforce on kubepods");
    let kubepods = format!("{test_root}/kubepods");
    assert_eq!(file("pids", "pids.max", "pids.max", &kubepods), "5000");
    assert_eq!(
        file("memory", "memory.limit_in_bytes", "memory.max", &kubepods),
        (3u64 << 30).to_string()
    );
    let expected_cpu = if m.hierarchies.v2 { "59" } else { "1536" };
    assert_eq!(
        file("cpu", "cpu.shares", "cpu.weight", &kubepods),
        expected_cpu
    );

    match m.enforce_existing(&format!("/{test_root}/missing"), &ResourceConfig::default()) {
        Err(err @ CmError::CgroupMissing { .. }) => assert_eq!(
            err.to_string(),
            format!("\"/{test_root}/missing\" cgroup does not exist")
        ),
        other => panic!("expected CgroupMissing, got {other:?}"),
    }
    m.enforce_existing(
        &format!("/{test_root}/kubepods/burstable"),
        &ResourceConfig {
            cpu_shares: Some(300),
            ..ResourceConfig::default()
        },
    )
    .expect_err("burstable was never created");
    m.enforce_existing(
        &format!("/{test_root}/kubepods/besteffort"),
        &ResourceConfig {
            cpu_shares: Some(300),
            ..ResourceConfig::default()
        },
    )
    .expect("an existing cgroup takes its reservation");
    let expected_cpu = if m.hierarchies.v2 { "12" } else { "300" };
    assert_eq!(
        file(
            "cpu",
            "cpu.shares",
            "cpu.weight",
            &format!("{test_root}/kubepods/besteffort")
        ),
        expected_cpu
    );
}
