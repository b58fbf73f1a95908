#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{NodeStatus, PodSpec, ResourceRequirements, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::mounter::fake::FakeMounter;
use super::*;

const UID: &str = "uid-1";

fn pod(volumes: Vec<Volume>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            uid: Some(UID.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn volume(json: serde_json::Value) -> Volume {
    serde_json::from_value(json).unwrap()
}

fn empty_dir(name: &str) -> Volume {
    volume(serde_json::json!({"name": name, "emptyDir": {}}))
}

fn host_path(name: &str, path: &Path, kind: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_string_lossy().into_owned(),
            type_: Some(kind.into()),
        }),
        ..Volume::default()
    }
}

fn mounting(mounts: Vec<VolumeMount>) -> Container {
    Container {
        name: "c".into(),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..VolumeMount::default()
    }
}

/// A standalone manager over a temporary pods directory with a fake mount table, on a node with
/// 1 GiB of allocatable memory.
struct Setup {
    dir: tempfile::TempDir,
    mounter: Arc<FakeMounter>,
    manager: VolumeManager,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mounter = Arc::new(FakeMounter::default());
        let node = Node {
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([(
                    "memory".to_owned(),
                    Quantity("1Gi".to_owned()),
                )])),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        let (_publish, node) = watch::channel(Some(node));
        let manager = VolumeManager::with_mounter(
            dir.path().join("pods"),
            None,
            node,
            Arc::clone(&mounter) as Arc<dyn Mounter>,
        );
        Self {
            dir,
            mounter,
            manager,
        }
    }

    fn pod_dir(&self) -> PathBuf {
        self.dir.path().join("pods").join(UID)
    }

    fn volume_path(&self, plugin: &str, name: &str) -> PathBuf {
        volume_dir(&self.pod_dir(), plugin, name)
    }

    async fn mount(&self, pod: &Pod) -> Result<(), Vec<String>> {
        self.manager
            .mount_pod(pod)
            .await
            .map_err(|failures| failures.iter().map(MountFailure::message).collect())
    }

    async fn mounted(&self, volumes: Vec<Volume>) -> PodVolumes {
        let pod = pod(volumes);
        self.mount(&pod).await.unwrap();
        self.pod_volumes(&pod)
    }

    /// The pod's volumes as the runtime sees them, subPaths bound through the fake mount table.
    fn pod_volumes(&self, pod: &Pod) -> PodVolumes {
        PodVolumes::with_mounter(
            pod,
            &self.pod_dir(),
            Arc::clone(&self.mounter) as Arc<dyn Mounter>,
        )
    }
}

#[tokio::test]
async fn empty_dir_is_created_under_the_pod_dir_and_mounted() {
    let setup = Setup::new();
    let volumes = setup.mounted(vec![empty_dir("cache")]).await;
    let expected = setup.volume_path(EMPTY_DIR_PLUGIN, "cache");
    assert!(expected.is_dir());
    let mut m = mount("cache", "/cache");
    m.read_only = Some(true);
    let mounts = volumes.mounts_for(&mounting(vec![m]), &[]).unwrap();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].host_path, expected.to_string_lossy());
    assert_eq!(mounts[0].container_path, "/cache");
    assert!(mounts[0].readonly);
    let writable = volumes
        .mounts_for(&mounting(vec![mount("cache", "/c")]), &[])
        .unwrap();
    assert!(
        !writable[0].readonly,
        "an emptyDir is writable unless asked"
    );
    let uid = PodUid::from(UID);
    setup.manager.unmount_pod(&uid).await.unwrap();
    assert!(!expected.exists());
    setup.manager.unmount_pod(&uid).await.unwrap();
}

#[tokio::test]
async fn a_memory_empty_dir_is_a_tmpfs_of_the_smallest_size_and_unmounted_with_the_pod() {
    let setup = Setup::new();
    let mut memory = pod(vec![
        volume(
            serde_json::json!({"name": "fast", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}),
        ),
        volume(
            serde_json::json!({"name": "big", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}),
        ),
        volume(serde_json::json!({"name": "bare", "emptyDir": {"medium": "Memory"}})),
    ]);
    setup.mount(&memory).await.unwrap();
    let sizes = setup.mounter.mounted();
    let size = |name| sizes[&setup.volume_path(EMPTY_DIR_PLUGIN, name)];
    assert_eq!(size("fast"), Some(64 << 20));
    assert_eq!(
        size("big"),
        Some(1 << 30),
        "capped at the node's allocatable"
    );
    assert_eq!(size("bare"), Some(1 << 30));

    // With a memory limit on every container, the pod's limit caps it.
    memory.spec.as_mut().unwrap().containers = vec![Container {
        name: "main".into(),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity("128Mi".to_owned()),
            )])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }];
    let uid = PodUid::from(UID);
    setup.manager.unmount_pod(&uid).await.unwrap();
    assert!(setup.mounter.mounted().is_empty(), "unmounted with the pod");
    setup.mount(&memory).await.unwrap();
    let sizes = setup.mounter.mounted();
    assert_eq!(
        sizes[&setup.volume_path(EMPTY_DIR_PLUGIN, "bare")],
        Some(128 << 20)
    );
    assert_eq!(
        sizes[&setup.volume_path(EMPTY_DIR_PLUGIN, "fast")],
        Some(64 << 20)
    );

    // A second sync does not mount again.
    setup.mount(&memory).await.unwrap();
    assert_eq!(setup.mounter.mounted().len(), 3);
    setup.manager.unmount_pod(&uid).await.unwrap();
    assert!(setup.mounter.mounted().is_empty());
    assert!(!setup.pod_dir().join(VOLUMES_DIR).exists());
}

#[tokio::test]
async fn other_media_are_refused() {
    let setup = Setup::new();
    let pod = pod(vec![volume(
        serde_json::json!({"name": "m", "emptyDir": {"medium": "HugePages-2Mi"}}),
    )]);
    let failures = setup.mount(&pod).await.unwrap_err();
    assert_eq!(
        failures,
        [
            "MountVolume.SetUp failed for volume \"m\" : volume \"m\": emptyDir medium \"HugePages-2Mi\" is not supported (only the default disk medium and Memory)"
        ]
    );
}

#[tokio::test]
async fn a_downward_api_volume_holds_the_pods_fields_and_is_updated() {
    let setup = Setup::new();
    let mut pod = pod(vec![volume(serde_json::json!({
        "name": "info",
        "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "meta/labels", "fieldRef": {"fieldPath": "metadata.labels"}, "mode": 0o600},
        ]},
    }))]);
    pod.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    setup.mount(&pod).await.unwrap();
    let dir = setup.volume_path(DOWNWARD_API_PLUGIN, "info");
    assert_eq!(fs::read_to_string(dir.join("name")).unwrap(), "web");
    assert_eq!(
        fs::read_to_string(dir.join("meta/labels")).unwrap(),
        "app=\"web\""
    );
    assert!(
        fs::symlink_metadata(dir.join(DATA_DIR))
            .unwrap()
            .is_symlink()
    );
    assert!(
        setup.mounter.mounted().is_empty(),
        "a downwardAPI volume is on disk"
    );

    pod.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".to_owned(), "front".to_owned());
    setup.mount(&pod).await.unwrap();
    assert_eq!(
        fs::read_to_string(dir.join("meta/labels")).unwrap(),
        "app=\"web\"\ntier=\"front\""
    );
    let volumes = setup.pod_volumes(&pod);
    let mounts = volumes
        .mounts_for(&mounting(vec![mount("info", "/etc/info")]), &[])
        .unwrap();
    assert!(mounts[0].readonly, "API volumes are mounted read-only");
}

#[tokio::test]
async fn a_path_leaving_the_volume_fails_it_and_writes_nothing() {
    let setup = Setup::new();
    let pod = pod(vec![
        volume(serde_json::json!({
            "name": "info",
            "downwardAPI": {"items": [
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "../../../../escaped", "fieldRef": {"fieldPath": "metadata.name"}},
            ]},
        })),
        empty_dir("fine"),
    ]);
    let failures = setup.mount(&pod).await.unwrap_err();
    assert_eq!(
        failures,
        [
            "MountVolume.SetUp failed for volume \"info\" : invalid path: must not contain '..': ../../../../escaped"
        ]
    );
    let dir = setup.volume_path(DOWNWARD_API_PLUGIN, "info");
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing in the volume"
    );
    for up in [
        dir.parent().unwrap(),
        &setup.pod_dir().join(VOLUMES_DIR),
        &setup.pod_dir(),
        setup.dir.path(),
    ] {
        assert!(!up.join("escaped").exists(), "{}", up.display());
    }
    assert!(
        setup.volume_path(EMPTY_DIR_PLUGIN, "fine").is_dir(),
        "the other volumes are still prepared"
    );
}

#[tokio::test]
async fn duplicate_and_unusable_volume_names_are_refused() {
    let setup = Setup::new();
    let pod = pod(vec![
        empty_dir("data"),
        empty_dir("data"),
        empty_dir(".."),
        empty_dir("a/b"),
    ]);
    let failures = setup.mount(&pod).await.unwrap_err();
    assert_eq!(
        failures,
        [
            "MountVolume.SetUp failed for volume \"data\" : volume name \"data\" is used by more than one volume of the pod",
            "MountVolume.SetUp failed for volume \"..\" : volume name \"..\" is not a valid directory name",
            "MountVolume.SetUp failed for volume \"a/b\" : volume name \"a/b\" is not a valid directory name",
        ]
    );
    assert!(!setup.pod_dir().join("volumes").join("a").exists());
}

#[tokio::test]
async fn api_volumes_without_an_api_server_say_so() {
    let setup = Setup::new();
    let pod = pod(vec![
        volume(serde_json::json!({"name": "cfg", "configMap": {"name": "settings"}})),
        volume(serde_json::json!({"name": "creds", "secret": {"secretName": "db"}})),
        volume(
            serde_json::json!({"name": "token", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}},
            ]}}),
        ),
    ]);
    let failures = setup.mount(&pod).await.unwrap_err();
    assert_eq!(
        failures,
        [
            "MountVolume.SetUp failed for volume \"cfg\" : couldn't get configMap shop/settings: no API server (the agent runs standalone)",
            "MountVolume.SetUp failed for volume \"creds\" : couldn't get secret shop/db: no API server (the agent runs standalone)",
            "MountVolume.SetUp failed for volume \"token\" : cannot setup projected volume token because kube client is not configured",
        ]
    );
    assert!(
        setup.mounter.mounted().is_empty(),
        "nothing is mounted for a volume that fails before its data is known"
    );
}

#[tokio::test]
async fn unsupported_sources_are_named() {
    let setup = Setup::new();
    let pvc =
        volume(serde_json::json!({"name": "pvc", "persistentVolumeClaim": {"claimName": "c"}}));
    let none = Volume {
        name: "n".into(),
        ..Volume::default()
    };
    let failures = setup.mount(&pod(vec![pvc, none])).await.unwrap_err();
    assert_eq!(
        failures,
        [
            "MountVolume.SetUp failed for volume \"pvc\" : volume \"pvc\": persistentVolumeClaim volumes are not supported by this agent",
            "MountVolume.SetUp failed for volume \"n\" : volume \"n\" has no source",
        ]
    );
}

#[tokio::test]
async fn host_path_types_are_checked_and_created() {
    let setup = Setup::new();
    let dir = setup.dir.path();
    let new_dir = dir.join("made");
    let new_file = dir.join("file");
    setup
        .mount(&pod(vec![
            host_path("a", &new_dir, "DirectoryOrCreate"),
            host_path("b", &new_file, "FileOrCreate"),
        ]))
        .await
        .unwrap();
    assert!(new_dir.is_dir());
    assert!(new_file.is_file());
    let volumes = setup
        .mounted(vec![
            host_path("a", &new_dir, "Directory"),
            host_path("b", &new_file, "File"),
            host_path("c", &dir.join("anything"), ""),
        ])
        .await;
    let mounts = volumes
        .mounts_for(&mounting(vec![mount("a", "/a")]), &[])
        .unwrap();
    assert_eq!(Path::new(&mounts[0].host_path), new_dir);
    for (path, kind) in [
        (&new_file, "Directory"),
        (&new_dir, "File"),
        (&new_dir, "Socket"),
        (&dir.join("missing"), "Directory"),
    ] {
        let failures = setup
            .manager
            .mount_pod(&pod(vec![host_path("x", path, kind)]))
            .await
            .unwrap_err();
        assert!(
            matches!(failures[0].error, VolumeError::HostPathTypeMismatch { .. }),
            "{kind}: {}",
            failures[0].error
        );
    }
    let failures = setup
        .manager
        .mount_pod(&pod(vec![host_path("x", &new_dir, "Dir")]))
        .await
        .unwrap_err();
    assert!(matches!(
        failures[0].error,
        VolumeError::InvalidHostPathType { .. }
    ));
}

#[tokio::test]
async fn socket_host_path_is_accepted() {
    let setup = Setup::new();
    let sock = setup.dir.path().join("s.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    setup
        .mount(&pod(vec![host_path("s", &sock, "Socket")]))
        .await
        .unwrap();
}

#[tokio::test]
async fn mount_errors_name_the_container_and_volume() {
    let setup = Setup::new();
    let volumes = setup.mounted(vec![empty_dir("data")]).await;
    let err = volumes
        .mounts_for(&mounting(vec![mount("nope", "/x")]), &[])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "container \"c\" mounts volume \"nope\", which the pod does not define"
    );
    assert!(matches!(
        volumes.mounts_for(&mounting(vec![mount("data", "rel")]), &[]),
        Err(VolumeError::RelativeMountPath { .. })
    ));
}

fn env(vars: &[(&str, &str)]) -> Vec<KeyValue> {
    vars.iter()
        .map(|(key, value)| KeyValue {
            key: (*key).into(),
            value: (*value).into(),
        })
        .collect()
}

#[tokio::test]
async fn sub_path_exprs_are_expanded_with_the_containers_environment() {
    let setup = Setup::new();
    let volumes = setup.mounted(vec![empty_dir("data")]).await;
    let root = setup.volume_path(EMPTY_DIR_PLUGIN, "data");
    let mut expr = mount("data", "/logs");
    expr.sub_path_expr = Some("$(ANNOTATION)/$(POD_NAME)".into());
    let container = mounting(vec![mount("data", "/all"), expr]);

    let vars = env(&[("POD_NAME", "web-0"), ("ANNOTATION", "mypath")]);
    let mounts = volumes.mounts_for(&container, &vars).unwrap();
    let target = setup.pod_dir().join("volume-subpaths/data/c/1");
    assert_eq!(PathBuf::from(&mounts[1].host_path), target);
    assert_eq!(
        setup.mounter.bound(),
        BTreeMap::from([(target.clone(), root.join("mypath/web-0"))])
    );
    assert!(root.join("mypath/web-0").is_dir());

    // A new value (the annotation changed) is a new directory, bound in place of the old one.
    let vars = env(&[("POD_NAME", "web-0"), ("ANNOTATION", "mynewpath")]);
    volumes.mounts_for(&container, &vars).unwrap();
    assert_eq!(
        setup.mounter.bound(),
        BTreeMap::from([(target, root.join("mynewpath/web-0"))])
    );
}

#[tokio::test]
async fn sub_path_exprs_the_kubelet_refuses_fail_with_its_messages_and_touch_nothing() {
    let setup = Setup::new();
    let volumes = setup.mounted(vec![empty_dir("data")]).await;
    let root = setup.volume_path(EMPTY_DIR_PLUGIN, "data");
    let mut expr = mount("data", "/logs");
    expr.sub_path_expr = Some("$(ANNOTATION)/$(POD_NAME)/$(NOWHERE)".into());
    let container = mounting(vec![expr]);
    let refused = |vars: &[(&str, &str)]| {
        let err = volumes.mounts_for(&container, &env(vars)).unwrap_err();
        assert!(matches!(err, VolumeError::SubPathRefused(_)), "{err:?}");
        err.to_string()
    };
    // Empty counts as missing, and every missing name is listed, sorted.
    assert_eq!(
        refused(&[("POD_NAME", "web-0"), ("ANNOTATION", "")]),
        "missing value for ANNOTATION, NOWHERE"
    );
    let mut single = mount("data", "/logs");
    single.sub_path_expr = Some("$(POD_NAME)".into());
    let container = mounting(vec![single]);
    let refused = |value: &str| {
        volumes
            .mounts_for(&container, &env(&[("POD_NAME", value)]))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        refused("/tmp"),
        "error SubPath `/tmp` must not be an absolute path"
    );
    assert_eq!(
        refused(".."),
        "unable to provision SubPath `..`: must not contain '..'"
    );
    assert_eq!(
        refused("a/../../b"),
        "unable to provision SubPath `a/../../b`: must not contain '..'"
    );
    assert!(setup.mounter.bound().is_empty());
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0, "nothing created");
    assert!(!setup.pod_dir().join("volume-subpaths").exists());
}

#[tokio::test]
async fn sub_paths_reach_the_runtime_as_binds_under_the_pod_and_escapes_are_refused() {
    let setup = Setup::new();
    let volumes = setup.mounted(vec![empty_dir("data")]).await;
    let root = setup.volume_path(EMPTY_DIR_PLUGIN, "data");
    let with_sub = |sub: &str| {
        let mut plain = mount("data", "/plain");
        plain.read_only = Some(true);
        let mut m = mount("data", "/x");
        m.sub_path = Some(sub.into());
        volumes.mounts_for(&mounting(vec![plain, m]), &[])
    };
    let mounts = with_sub("a/b").unwrap();
    // The second mount of container "c": its index names the bind target.
    let target = setup.pod_dir().join("volume-subpaths/data/c/1");
    assert_eq!(PathBuf::from(&mounts[1].host_path), target);
    assert_eq!(
        setup.mounter.bound(),
        BTreeMap::from([(target.clone(), root.join("a/b"))])
    );
    assert!(root.join("a/b").is_dir());
    assert!(!mounts[1].readonly);
    // A plain subPath is refused as the kubelet refuses an expanded one.
    assert_eq!(
        with_sub("../up").unwrap_err().to_string(),
        "unable to provision SubPath `../up`: must not contain '..'"
    );
    assert_eq!(
        with_sub("/abs").unwrap_err().to_string(),
        "error SubPath `/abs` must not be an absolute path"
    );
    let outside = setup.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let err = with_sub("link/new").unwrap_err();
    assert_eq!(
        err.to_string(),
        "container \"c\" mounts volume \"data\" with subPath \"link/new\": resolves outside the volume"
    );
    assert!(
        !outside.join("new").exists(),
        "nothing is created through the link"
    );

    // The binds go with the pod's volumes.
    setup.manager.unmount_pod(&PodUid::from(UID)).await.unwrap();
    assert!(setup.mounter.bound().is_empty());
    assert!(!setup.pod_dir().join("volume-subpaths").exists());
}

#[tokio::test]
async fn the_directories_of_pods_that_are_gone_are_removed_with_their_mounts() {
    let setup = Setup::new();
    let memory = pod(vec![volume(
        serde_json::json!({"name": "fast", "emptyDir": {"medium": "Memory"}}),
    )]);
    setup.mount(&memory).await.unwrap();
    fs::create_dir_all(setup.pod_dir().join("containers/main")).unwrap();
    assert_eq!(setup.manager.pod_dirs().await, [PodUid::from(UID)]);
    setup.manager.remove_pod_dirs(vec![PodUid::from(UID)]).await;
    assert!(!setup.pod_dir().exists());
    assert!(setup.mounter.mounted().is_empty());
    assert!(setup.manager.pod_dirs().await.is_empty());
}

#[test]
fn paths_of_volumes_follow_the_kubelets_layout() {
    let pod = pod(vec![
        volume(serde_json::json!({"name": "a", "configMap": {"name": "x"}})),
        volume(serde_json::json!({"name": "b", "secret": {"secretName": "x"}})),
        volume(serde_json::json!({"name": "c", "projected": {"sources": []}})),
        volume(serde_json::json!({"name": "d", "downwardAPI": {}})),
        empty_dir("e"),
        volume(serde_json::json!({"name": "f", "nfs": {"server": "s", "path": "/"}})),
    ]);
    let volumes = PodVolumes::with_mounter(
        &pod,
        Path::new("/root/pods/u"),
        Arc::new(FakeMounter::default()),
    );
    let path = |name: &str| volumes.volumes.get(name).map(|v| v.path.clone());
    assert_eq!(
        path("a"),
        Some("/root/pods/u/volumes/kubernetes.io~configmap/a".into())
    );
    assert_eq!(
        path("b"),
        Some("/root/pods/u/volumes/kubernetes.io~secret/b".into())
    );
    assert_eq!(
        path("c"),
        Some("/root/pods/u/volumes/kubernetes.io~projected/c".into())
    );
    assert_eq!(
        path("d"),
        Some("/root/pods/u/volumes/kubernetes.io~downward-api/d".into())
    );
    assert_eq!(
        path("e"),
        Some("/root/pods/u/volumes/kubernetes.io~empty-dir/e".into())
    );
    assert_eq!(path("f"), None);
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Needs root (a chown to any group). The kubelet's modes with an `fsGroup`: an emptyDir is
/// writable by the group and setgid; an API volume's files get group read on top of their modes
/// (`-rw-r--r--` stays, `-r--------` becomes `-r--r-----`). Once set up, a volume is not walked
/// again: what the containers do with their modes stays.
#[tokio::test]
async fn an_fs_group_owns_the_volumes_once_they_are_set_up() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    if !is_root() {
        crate::testing::skip(
            "an_fs_group_owns_the_volumes_once_they_are_set_up",
            "chown to another group needs root",
        );
        return;
    }
    let setup = Setup::new();
    let mut pod = pod(vec![
        empty_dir("scratch"),
        volume(serde_json::json!({"name": "fast", "emptyDir": {"medium": "Memory"}})),
        volume(serde_json::json!({
            "name": "info",
            "downwardAPI": {"items": [
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "sub/private", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o400},
            ]},
        })),
    ]);
    pod.spec.as_mut().unwrap().security_context = Some(
        serde_json::from_value(serde_json::json!({"fsGroup": 1234, "runAsUser": 1001})).unwrap(),
    );
    setup.mount(&pod).await.unwrap();
    let owned = |path: &Path| {
        let meta = fs::metadata(path).unwrap();
        (meta.gid(), meta.permissions().mode() & 0o7777)
    };
    let scratch = setup.volume_path(EMPTY_DIR_PLUGIN, "scratch");
    let info = setup.volume_path(DOWNWARD_API_PLUGIN, "info");
    assert_eq!(owned(&scratch), (1234, 0o2777));
    // The fake mount table leaves the directory where a tmpfs would be: only its group counts.
    let (fast_gid, fast_mode) = owned(&setup.volume_path(EMPTY_DIR_PLUGIN, "fast"));
    assert_eq!((fast_gid, fast_mode & 0o2070), (1234, 0o2070));
    assert_eq!(owned(&info), (1234, 0o2777));
    assert_eq!(owned(&info.join("name")), (1234, 0o644));
    assert_eq!(owned(&info.join("sub/private")), (1234, 0o440));
    assert_eq!(owned(&info.join("sub")), (1234, 0o2755));
    assert_eq!(owned(&info.join(DATA_DIR)), (1234, 0o2755));
    let ready = setup.pod_dir().join("plugins/kubernetes.io~empty-dir");
    for name in ["scratch", "fast", "info"] {
        assert!(ready.join(name).join("ready").is_file(), "{name}");
    }

    // A container makes a file of its own and closes the volume to the group.
    let own = scratch.join("own");
    fs::write(&own, "x").unwrap();
    fs::set_permissions(&own, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&own, None, Some(0)).unwrap();
    fs::set_permissions(&scratch, fs::Permissions::from_mode(0o700)).unwrap();
    setup.mount(&pod).await.unwrap();
    assert_eq!(
        owned(&scratch),
        (1234, 0o700),
        "a later sync does not walk again"
    );
    assert_eq!(owned(&own), (0, 0o600));
    assert!(
        fs::read_dir(&info)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("..2")
            })
            .count()
            == 1,
        "the unchanged files are not written again"
    );

    setup.manager.unmount_pod(&PodUid::from(UID)).await.unwrap();
    assert!(!ready.exists(), "the ready markers go with the volumes");
}

/// Needs root: a tmpfs mounted below a pod's emptyDir (as a container with bidirectional
/// propagation could leave one) stops the teardown with an error naming it, and nothing in it is
/// removed; once it is gone, the teardown completes. The same holds for the pod's directory.
#[tokio::test]
async fn a_teardown_never_empties_a_mount_below_the_pod() {
    if !is_root() {
        crate::testing::skip(
            "a_teardown_never_empties_a_mount_below_the_pod",
            "mounting a tmpfs needs root",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_publish, node) = watch::channel(None);
    let manager =
        VolumeManager::with_mounter(dir.path().join("pods"), None, node, Arc::new(SystemMounter));
    manager
        .mount_pod(&pod(vec![empty_dir("data")]))
        .await
        .unwrap();
    let pod_dir = dir.path().join("pods").join(UID);
    let below = volume_dir(&pod_dir, EMPTY_DIR_PLUGIN, "data").join("mnt");
    fs::create_dir(&below).unwrap();
    SystemMounter.mount_tmpfs(&below, None).unwrap();
    let guard = mounter::MountGuard(vec![below.clone()]);
    fs::write(below.join("precious"), "keep").unwrap();

    let err = manager.unmount_pod(&PodUid::from(UID)).await.unwrap_err();
    let chain = crate::error_chain::error_chain(&err);
    assert!(
        chain.contains(&format!(
            "cannot delete directory {}: it is a mount point",
            below.display()
        )),
        "{chain}"
    );
    assert_eq!(fs::read_to_string(below.join("precious")).unwrap(), "keep");
    manager.remove_pod_dirs(vec![PodUid::from(UID)]).await;
    assert_eq!(fs::read_to_string(below.join("precious")).unwrap(), "keep");

    drop(guard);
    manager.unmount_pod(&PodUid::from(UID)).await.unwrap();
    assert!(!pod_dir.join(VOLUMES_DIR).exists());
    manager.remove_pod_dirs(vec![PodUid::from(UID)]).await;
    assert!(!pod_dir.exists());
}
