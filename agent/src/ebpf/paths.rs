//! Which pod and container a cgroup belongs to, read from its path (the kubelet's
//! `pkg/kubelet/cm` naming, for both cgroup drivers), and the cgroup id → owner map the ring-buffer
//! reader resolves exec/exit/OOM events with (those carry only the cgroup id). The map lives on the
//! reader's own thread, so its tree walks never run on the agent's async core; entries whose rmdir
//! event was lost are pruned by [`CgroupOwners::prune`].

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::container::{ContainerId, PodUid};

/// Deep enough for `<parent>/<qos>/<pod>/<container>/<a container's own sub-cgroups>`.
const MAX_SCAN_DEPTH: usize = 6;

/// Unresolvable ids remembered so a busy non-pod cgroup does not rescan on every event; cleared
/// when full (ids are never reused, so a stale entry is only a missed rescan).
const MAX_UNKNOWN: usize = 4096;

/// The pod (and container) a cgroup below the pods' parent belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupOwner {
    pub pod: PodUid,
    /// The container (or sandbox) id, when the path goes below the pod cgroup.
    pub container: Option<ContainerId>,
    /// True when the path ends at the container's cgroup (not a sub-cgroup the container made).
    pub is_container_cgroup: bool,
}

/// Reads the owner from a cgroup path (absolute, relative to the hierarchy root, or relative to the
/// pods' parent: the first component naming a pod decides).
///
/// cgroupfs driver: `/kubepods/<qos>/pod<uid>/<64-hex id>` (Guaranteed pods directly under
/// `/kubepods`). systemd driver: `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with
/// _ for ->.slice/cri-containerd-<id>.scope` (also `crio-<id>.scope`, `docker-<id>.scope`).
pub fn parse_cgroup_path(path: &str) -> Option<CgroupOwner> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let (index, pod) = components
        .iter()
        .enumerate()
        .find_map(|(index, component)| pod_uid(component).map(|pod| (index, pod)))?;
    let container = components.get(index + 1).and_then(|c| container_id(c));
    Some(CgroupOwner {
        pod,
        is_container_cgroup: container.is_some() && components.len() == index + 2,
        container,
    })
}

fn pod_uid(component: &str) -> Option<PodUid> {
    if let Some(uid) = component.strip_prefix("pod") {
        return is_uid(uid).then(|| PodUid::new(uid));
    }
    let slice = component.strip_suffix(".slice")?;
    let (_, escaped) = slice.rsplit_once("-pod")?;
    // systemd escapes the uid's dashes as underscores in unit names.
    let uid = escaped.replace('_', "-");
    is_uid(&uid).then(|| PodUid::new(uid))
}

/// A pod uid: an API-server UUID or the hex hash the kubelet gives static pods.
fn is_uid(uid: &str) -> bool {
    (8..=64).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn container_id(component: &str) -> Option<ContainerId> {
    let id = match component.strip_suffix(".scope") {
        Some(unit) => unit.rsplit_once('-')?.1,
        None => component,
    };
    let valid = (12..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| ContainerId::new(id))
}

/// cgroup id → owner, filled from mkdir events and from scans of the cgroup2 tree below the pods'
/// parent (a cgroup2 directory's inode number is its cgroup id).
#[derive(Debug)]
pub struct CgroupOwners {
    root: PathBuf,
    owners: HashMap<u64, CgroupOwner>,
    unknown: HashSet<u64>,
    /// Ids the last prune found no directory for; removed if the next prune does not find one
    /// either.
    missing: HashSet<u64>,
    /// Whether [`Self::prune_after_losses`] has pruned once.
    pruned: bool,
    scans: u64,
}

impl CgroupOwners {
    /// An empty map over the tree below `root` (the pods' parent cgroup directory).
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            owners: HashMap::new(),
            unknown: HashSet::new(),
            missing: HashSet::new(),
            pruned: false,
            scans: 0,
        }
    }

    pub fn insert(&mut self, id: u64, owner: CgroupOwner) {
        self.unknown.remove(&id);
        self.owners.insert(id, owner);
    }

    pub fn remove(&mut self, id: u64) -> Option<CgroupOwner> {
        self.owners.remove(&id)
    }

    /// The owner of `id`, rescanning the tree once when it is not known yet.
    pub fn resolve(&mut self, id: u64) -> Option<CgroupOwner> {
        if let Some(owner) = self.owners.get(&id) {
            return Some(owner.clone());
        }
        if self.unknown.contains(&id) {
            return None;
        }
        self.scan();
        if let Some(owner) = self.owners.get(&id) {
            return Some(owner.clone());
        }
        if self.unknown.len() >= MAX_UNKNOWN {
            self.unknown.clear();
        }
        self.unknown.insert(id);
        None
    }

    /// How many scans ran (startup included).
    pub fn scans(&self) -> u64 {
        self.scans
    }

    /// How many cgroups the map knows.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether the map knows no cgroup.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Adds every pod/container cgroup below the root. Unreadable directories are skipped: they
    /// are cgroups being removed while the scan runs.
    pub fn scan(&mut self) {
        let found = self.walk();
        self.owners.extend(found);
    }

    /// [`Self::prune`] when it can forget something: after events were lost since the last prune
    /// (`events_lost`), while cgroups the last prune found gone wait to be forgotten, and the first
    /// time (events queued before the reader ran may have lost their removals). Otherwise every
    /// removal reached the map and the walk is skipped. Returns how many it forgot.
    pub fn prune_after_losses(&mut self, events_lost: bool) -> usize {
        if !events_lost && self.missing.is_empty() && self.pruned {
            return 0;
        }
        self.pruned = true;
        self.prune()
    }

    /// Rescans the tree and forgets the cgroups that are gone: those whose rmdir event was lost
    /// (a full ring buffer) would otherwise stay for the agent's life. A cgroup missing from the
    /// tree is forgotten only when the previous prune missed it too, so events still on their way
    /// about a cgroup just removed (a container's exit comes right before its cgroup goes) resolve.
    /// Call it well apart (the reader does, at most once a minute). Returns how many it forgot.
    pub fn prune(&mut self) -> usize {
        let found = self.walk();
        let gone: HashSet<u64> = self
            .owners
            .keys()
            .filter(|id| !found.contains_key(id))
            .copied()
            .collect();
        let before = self.owners.len();
        self.owners
            .retain(|id, _| !(gone.contains(id) && self.missing.contains(id)));
        let forgotten = before - self.owners.len();
        self.missing = gone
            .into_iter()
            .filter(|id| self.owners.contains_key(id))
            .collect();
        self.owners.extend(found);
        // Ids are never reused, so what was unresolvable stays so; the set is bounded anyway.
        forgotten
    }

    /// Every pod/container cgroup below the root, by id.
    fn walk(&mut self) -> HashMap<u64, CgroupOwner> {
        self.scans += 1;
        let mut found = HashMap::new();
        let mut pending = vec![(self.root.clone(), 0_usize)];
        while let Some((dir, depth)) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let path = entry.path();
                if let (Ok(metadata), Some(owner)) = (
                    entry.metadata(),
                    relative(&self.root, &path).and_then(|p| parse_cgroup_path(&p)),
                ) {
                    found.insert(metadata.ino(), owner);
                }
                if depth + 1 < MAX_SCAN_DEPTH {
                    pending.push((path, depth + 1));
                }
            }
        }
        found
    }
}

fn relative(root: &Path, path: &Path) -> Option<String> {
    path.strip_prefix(root).ok()?.to_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b5c5e0e-8e1f-4d5c-9a3e-2f4b6c7d8e9f";
    const ID: &str = "4f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    #[expect(
        clippy::unnecessary_wraps,
        reason = "compared with what parse_cgroup_path returns"
    )]
    fn owner(container: Option<&str>, leaf: bool) -> Option<CgroupOwner> {
        Some(CgroupOwner {
            pod: PodUid::new(UID),
            container: container.map(ContainerId::new),
            is_container_cgroup: leaf,
        })
    }

    #[test]
    fn cgroupfs_paths_name_the_pod_and_the_container() {
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/besteffort/pod{UID}/{ID}")),
            owner(Some(ID), true)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}/{ID}")),
            owner(Some(ID), true)
        );
        // Guaranteed pods sit directly under the parent.
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/pod{UID}/{ID}")),
            owner(Some(ID), true)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/pod{UID}")),
            owner(None, false)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/pod{UID}/{ID}/init.scope")),
            owner(Some(ID), false)
        );
        // Static pods' uids are the kubelet's 32-hex hash.
        let hash = "6a1b2c3d4e5f60718293a4b5c6d7e8f9";
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/pod{hash}/{ID}"))
                .unwrap()
                .pod,
            PodUid::new(hash)
        );
    }

    #[test]
    fn systemd_paths_name_the_pod_and_the_container() {
        let escaped = UID.replace('-', "_");
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(parse_cgroup_path(&path), owner(Some(ID), true));
        let guaranteed = format!("/kubepods.slice/kubepods-pod{escaped}.slice/crio-{ID}.scope");
        assert_eq!(parse_cgroup_path(&guaranteed), owner(Some(ID), true));
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods.slice/kubepods-pod{escaped}.slice")),
            owner(None, false)
        );
    }

    #[test]
    fn paths_without_a_pod_name_nothing() {
        for path in [
            "/kubepods",
            "/kubepods/besteffort",
            "/kubepods.slice/kubepods-besteffort.slice",
            "/system.slice/containerd.service",
            "/kubepods/podnot-a-uid!/x",
            "",
        ] {
            assert_eq!(parse_cgroup_path(path), None, "{path}");
        }
        // A pod cgroup with something that is not a container id below it.
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/pod{UID}/not-hex")),
            owner(None, false)
        );
    }

    #[test]
    fn scans_map_directory_inodes_to_owners_and_remember_misses() {
        let root = tempfile::tempdir().unwrap();
        let container = root
            .path()
            .join("besteffort")
            .join(format!("pod{UID}"))
            .join(ID);
        std::fs::create_dir_all(&container).unwrap();
        let ino = std::fs::metadata(&container).unwrap().ino();
        let mut owners = CgroupOwners::new(root.path().to_path_buf());
        assert_eq!(owners.resolve(ino), owner(Some(ID), true));
        assert_eq!(owners.scans(), 1);
        assert_eq!(owners.resolve(ino), owner(Some(ID), true));
        assert_eq!(owners.scans(), 1, "a known id needs no scan");
        assert_eq!(owners.resolve(1), None);
        assert_eq!(owners.resolve(1), None);
        assert_eq!(owners.scans(), 2, "an unknown id is scanned for once");
        owners.insert(1, owner(None, false).unwrap());
        assert_eq!(owners.resolve(1), owner(None, false));
        assert_eq!(owners.remove(ino), owner(Some(ID), true));
    }

    /// Issue 14 §1.7: an entry whose rmdir event was lost used to stay for the agent's life.
    #[test]
    fn prunes_forget_cgroups_gone_for_two_prunes_in_a_row() {
        let root = tempfile::tempdir().unwrap();
        let pod = root.path().join("besteffort").join(format!("pod{UID}"));
        let kept = pod.join(ID);
        let other = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
        let removed = pod.join(other);
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::create_dir_all(&removed).unwrap();
        let kept_ino = std::fs::metadata(&kept).unwrap().ino();
        let removed_ino = std::fs::metadata(&removed).unwrap().ino();
        let mut owners = CgroupOwners::new(root.path().to_path_buf());
        owners.scan();
        assert_eq!(owners.len(), 3, "the pod and its two containers");
        // The rmdir event never came (the ring buffer was full).
        std::fs::remove_dir(&removed).unwrap();
        // A mkdir event's entry for a cgroup that is already gone again.
        owners.insert(7, owner(Some(other), true).unwrap());

        assert_eq!(owners.prune(), 0, "the first prune only marks what is gone");
        assert_eq!(
            owners.resolve(removed_ino),
            owner(Some(other), true),
            "an event still on its way about the removed cgroup resolves"
        );
        assert_eq!(owners.prune(), 2);
        assert_eq!(owners.len(), 2);
        assert_eq!(owners.resolve(kept_ino), owner(Some(ID), true));
        assert_eq!(owners.resolve(removed_ino), None);
        assert_eq!(owners.resolve(7), None);
    }

    #[test]
    fn without_lost_events_only_the_first_prune_walks_the_tree() {
        let root = tempfile::tempdir().unwrap();
        let container = root.path().join(format!("pod{UID}")).join(ID);
        std::fs::create_dir_all(&container).unwrap();
        let mut owners = CgroupOwners::new(root.path().to_path_buf());
        owners.scan();
        // An entry whose rmdir event was lost before the reader ran.
        owners.insert(9, owner(Some(ID), true).unwrap());

        assert_eq!(
            owners.prune_after_losses(false),
            0,
            "the first prune marks id 9"
        );
        assert_eq!(owners.scans(), 2);
        assert_eq!(
            owners.prune_after_losses(false),
            1,
            "a marked entry is worth another walk"
        );
        assert_eq!(owners.scans(), 3);
        assert_eq!(owners.prune_after_losses(false), 0);
        assert_eq!(owners.scans(), 3, "nothing lost, nothing marked: no walk");

        std::fs::remove_dir(&container).unwrap();
        assert_eq!(
            owners.prune_after_losses(true),
            0,
            "lost events: a walk marks"
        );
        assert_eq!(owners.scans(), 4);
        assert_eq!(owners.prune_after_losses(false), 1);
        assert_eq!(owners.len(), 1, "the pod's cgroup stays");
    }

    #[test]
    fn an_entry_never_in_the_tree_goes_at_the_second_prune_and_new_cgroups_come() {
        let root = tempfile::tempdir().unwrap();
        let container = root.path().join(format!("pod{UID}")).join(ID);
        let mut owners = CgroupOwners::new(root.path().to_path_buf());
        owners.insert(9, owner(Some(ID), true).unwrap());
        assert_eq!(owners.prune(), 0);
        std::fs::create_dir_all(&container).unwrap();
        let ino = std::fs::metadata(&container).unwrap().ino();
        assert_eq!(
            owners.prune(),
            1,
            "id 9 was gone twice; the new cgroup is another id"
        );
        assert_eq!(owners.prune(), 0);
        assert_eq!(owners.resolve(ino), owner(Some(ID), true));
    }
}
