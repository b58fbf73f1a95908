#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt as _, symlink};

use super::*;
use crate::volumes::mounter::fake::FakeMounter;
use crate::volumes::mounter::{MountGuard, SystemMounter};

/// A volume in a temporary directory, with a host directory beside it that nothing may touch.
struct Setup {
    dir: tempfile::TempDir,
    mounter: FakeMounter,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("pod/volumes/data")).unwrap();
        fs::create_dir_all(dir.path().join("host")).unwrap();
        fs::write(dir.path().join("host/passwd"), "root:x:0:0").unwrap();
        Self {
            dir,
            mounter: FakeMounter::default(),
        }
    }

    fn volume(&self) -> PathBuf {
        self.dir.path().join("pod/volumes/data")
    }

    fn host(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn target(&self, index: usize) -> PathBuf {
        bind_target(&self.dir.path().join("pod"), "data", "main", index)
    }

    fn prepare(&self, sub_path: &str) -> Result<PathBuf, SubPathError> {
        prepare(&self.mounter, &self.volume(), sub_path, &self.target(0))
    }

    /// Every name under the host directory.
    fn host_listing(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.host())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn invalid(result: Result<PathBuf, SubPathError>) -> &'static str {
    match result {
        Err(SubPathError::Invalid(why)) => why,
        other => panic!("not refused as invalid: {other:?}"),
    }
}

fn refusal(result: Result<PathBuf, SubPathError>) -> String {
    match result {
        Err(err) if err.is_refusal() => err.to_string(),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn sub_paths_must_be_relative_and_stay_down() {
    let setup = Setup::new();
    assert_eq!(
        refusal(setup.prepare("/etc")),
        "error SubPath `/etc` must not be an absolute path"
    );
    assert_eq!(
        refusal(setup.prepare("../host")),
        "unable to provision SubPath `../host`: must not contain '..'"
    );
    assert_eq!(
        refusal(setup.prepare("a/../../host")),
        "unable to provision SubPath `a/../../host`: must not contain '..'"
    );
    assert_eq!(
        invalid(setup.prepare("./")),
        "must name something in the volume"
    );
    assert!(setup.mounter.bound().is_empty());
}

#[test]
fn missing_directories_are_created_with_the_roots_mode_and_bound_for_the_runtime() {
    let setup = Setup::new();
    let volume = setup.volume();
    fs::set_permissions(&volume, fs::Permissions::from_mode(0o2777)).unwrap();
    fs::create_dir(volume.join("a")).unwrap();
    let host_path = setup.prepare("a/b/./c").unwrap();

    // The runtime gets the bind target, never a path into the volume a container could swap.
    assert_eq!(host_path, setup.target(0));
    assert!(host_path.ends_with("pod/volume-subpaths/data/main/0"));
    assert_eq!(
        setup.mounter.bound(),
        BTreeMap::from([(setup.target(0), volume.join("a/b/c"))]),
        "the descriptor of the subPath is what is mounted"
    );
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&volume.join("a/b")), 0o2777, "umask or not");
    assert_eq!(mode(&volume.join("a/b/c")), 0o2777);
    assert_eq!(mode(&host_path), 0o750);

    // A file subPath gets a file to mount on.
    fs::write(volume.join("file"), "x").unwrap();
    let file_target = prepare(&setup.mounter, &volume, "file", &setup.target(1)).unwrap();
    assert!(fs::metadata(&file_target).unwrap().is_file());
    assert_eq!(setup.mounter.bound()[&file_target], volume.join("file"));
}

#[test]
fn links_inside_the_volume_are_followed() {
    let setup = Setup::new();
    let volume = setup.volume();
    fs::create_dir(volume.join("real")).unwrap();
    symlink("real", volume.join("inner")).unwrap();
    symlink("../real", volume.join("real-up")).unwrap();
    setup.prepare("inner/x").unwrap();
    assert!(volume.join("real/x").is_dir());
    assert_eq!(
        setup.mounter.bound()[&setup.target(0)],
        volume.join("real/x")
    );
    setup.prepare("inner").unwrap();
    assert_eq!(setup.mounter.bound()[&setup.target(0)], volume.join("real"));
}

/// The CVE-2021-25741 class: links a container planted that lead out of the volume are refused
/// before anything is created through them, whatever form they take.
#[test]
fn planted_links_leading_out_are_refused_and_nothing_is_created_outside() {
    let setup = Setup::new();
    let volume = setup.volume();
    let host = setup.host();
    symlink(&host, volume.join("absolute")).unwrap();
    symlink("../../../host", volume.join("relative")).unwrap();
    fs::create_dir(volume.join("d")).unwrap();
    symlink("../../../../host", volume.join("d/deeper")).unwrap();
    symlink(host.join("passwd"), volume.join("file-link")).unwrap();
    symlink(host.join("missing"), volume.join("dangling")).unwrap();
    symlink("/proc/self/root", volume.join("magic")).unwrap();
    for sub_path in [
        "absolute",
        "absolute/new",
        "absolute/new/deeper",
        "relative/new",
        "d/deeper/new",
        "file-link",
        "dangling",
        "dangling/new",
        "magic/etc",
    ] {
        assert_eq!(
            invalid(setup.prepare(sub_path)),
            "resolves outside the volume",
            "{sub_path}"
        );
    }
    assert_eq!(
        setup.host_listing(),
        ["passwd"],
        "nothing was created on the host"
    );
    assert!(setup.mounter.bound().is_empty(), "nothing was mounted");
    assert_eq!(
        fs::read_to_string(host.join("passwd")).unwrap(),
        "root:x:0:0"
    );
}

#[test]
fn a_dangling_link_inside_is_not_created_through() {
    let setup = Setup::new();
    let volume = setup.volume();
    symlink("later", volume.join("link")).unwrap();
    let err = setup.prepare("link/x").unwrap_err();
    assert!(err.is_create(), "{err:?}");
    assert!(!volume.join("later").exists());
}

#[test]
fn binds_are_made_for_each_mount_and_cleaned_with_the_pod() {
    let setup = Setup::new();
    let pod_dir = setup.dir.path().join("pod");
    fs::create_dir(setup.volume().join("a")).unwrap();
    setup.prepare("a").unwrap();
    prepare(&setup.mounter, &setup.volume(), "a", &setup.target(3)).unwrap();
    let other = bind_target(&pod_dir, "data", "sidecar", 0);
    prepare(&setup.mounter, &setup.volume(), "a", &other).unwrap();
    assert_eq!(setup.mounter.bound().len(), 3);
    // A second start (a container restart) mounts again over the fake, which holds no file.
    setup.prepare("a").unwrap();
    assert_eq!(setup.mounter.bound().len(), 3);

    clean(&setup.mounter, &pod_dir).unwrap();
    assert!(setup.mounter.bound().is_empty(), "every bind is unmounted");
    assert!(!pod_dir.join(SUBPATHS_DIR).exists());
    assert!(setup.volume().join("a").is_dir(), "the volume is untouched");
    clean(&setup.mounter, &pod_dir).unwrap();
}

#[test]
fn cleaning_never_removes_what_a_target_holds() {
    let setup = Setup::new();
    let pod_dir = setup.dir.path().join("pod");
    // Content in a target (a mount that went away unnoticed, or a stray file): the cleanup stops
    // rather than remove it.
    let target = setup.target(0);
    fs::create_dir_all(&target).unwrap();
    fs::write(target.join("file"), "keep").unwrap();
    let err = clean(&setup.mounter, &pod_dir).unwrap_err();
    assert!(
        matches!(&err, SubPathError::Clean { path, .. } if *path == target),
        "{err:?}"
    );
    assert_eq!(fs::read_to_string(target.join("file")).unwrap(), "keep");
}

/// Needs root: a real bind mount. Once mounted, a container swapping the subPath for a link to a
/// host directory changes nothing in what the runtime mounts; the cleanup unmounts it and leaves
/// the host directory alone.
#[test]
fn a_real_bind_holds_the_opened_directory_whatever_becomes_of_its_path() {
    if !rustix::process::geteuid().is_root() {
        crate::testing::skip(
            "a_real_bind_holds_the_opened_directory_whatever_becomes_of_its_path",
            "bind mounts need root",
        );
        return;
    }
    let setup = Setup::new();
    let volume = setup.volume();
    fs::create_dir(volume.join("a")).unwrap();
    fs::write(volume.join("a/mine"), "pod data").unwrap();
    let target = prepare(&SystemMounter, &volume, "a", &setup.target(0)).unwrap();
    let _guard = MountGuard(vec![target.clone()]);
    assert!(crate::volumes::mounter::is_mount_point(&target).unwrap());
    // A restart finds the same directory mounted and mounts nothing more.
    prepare(&SystemMounter, &volume, "a", &setup.target(0)).unwrap();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let target_text = target.to_string_lossy().into_owned();
    let stacked = mountinfo
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == Some(target_text.as_str()))
        .count();
    assert_eq!(stacked, 1, "{mountinfo}");

    fs::rename(volume.join("a"), volume.join("a.old")).unwrap();
    symlink(setup.host(), volume.join("a")).unwrap();
    assert_eq!(
        fs::read_to_string(target.join("mine")).unwrap(),
        "pod data",
        "the bind holds the directory that was opened"
    );
    assert!(!target.join("passwd").exists());

    // The next start sees the link and refuses it.
    assert_eq!(
        invalid(prepare(&SystemMounter, &volume, "a", &setup.target(1))),
        "resolves outside the volume"
    );

    clean(&SystemMounter, &setup.dir.path().join("pod")).unwrap();
    assert!(!target.exists());
    assert_eq!(setup.host_listing(), ["passwd"]);
    assert_eq!(
        fs::read_to_string(volume.join("a.old/mine")).unwrap(),
        "pod data"
    );
}

fn vars<'a>(list: &[(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
    let list = list.to_vec();
    move |name| list.iter().find(|(key, _)| *key == name).map(|(_, v)| *v)
}

#[test]
fn expressions_expand_like_commands_but_every_missing_or_empty_variable_is_an_error() {
    let env = vars(&[("POD_NAME", "web-0"), ("NS", "shop"), ("EMPTY", "")]);
    assert_eq!(
        expand_expr("$(NS)/$(POD_NAME)/logs", &env).unwrap(),
        "shop/web-0/logs"
    );
    // `$$` escapes, an unclosed reference stays as written, neither asks for a value.
    assert_eq!(
        expand_expr("$$(POD_NAME)-$(NS", &env).unwrap(),
        "$(POD_NAME)-$(NS"
    );
    let err = expand_expr("$(ZED)/$(EMPTY)/$(POD_NAME)/$(ZED)", &env).unwrap_err();
    assert!(err.is_refusal());
    assert_eq!(err.to_string(), "missing value for EMPTY, ZED");
}
