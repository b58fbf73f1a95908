//! The one reader of the mount table (`/proc/self/mountinfo`, proc(5)): which cgroup hierarchies are
//! mounted where, for the pod cgroups (`cm`), the stats (`stats`) and the eBPF loader (`ebpf`). The
//! kubelet gets the same facts from `k8s.io/mount-utils` and runc's `cgroups` package.

use std::path::PathBuf;

/// Where the kernel publishes the calling process's mount table.
pub const PATH: &str = "/proc/self/mountinfo";

/// One line of the mount table, the fields the agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the filesystem that is mounted (for a cgroup mount, the cgroup it shows).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// `cgroup`, `cgroup2`, `tmpfs`, ...
    pub fstype: String,
    /// The filesystem's options (for a v1 cgroup mount, the controllers it carries).
    pub super_options: String,
}

impl Mount {
    /// Whether this is a v1 cgroup hierarchy carrying `controller`.
    pub fn is_cgroup_v1_with(&self, controller: &str) -> bool {
        self.fstype == "cgroup" && self.super_options.split(',').any(|o| o == controller)
    }

    /// Whether this is a cgroup2 mount.
    pub fn is_cgroup2(&self) -> bool {
        self.fstype == "cgroup2"
    }
}

/// The mounts a mount table lists, in its order; lines that do not parse are left out. Fields:
/// id, parent, major:minor, root, mount point, options, optional fields..., `-`, fstype, source,
/// super options. Paths have space, tab, newline and backslash escaped as `\ooo`.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (mount, filesystem) = line.split_once(" - ")?;
    let mut mount = mount.split(' ').skip(3);
    let root = unescape(mount.next()?);
    let mount_point = unescape(mount.next()?);
    let mut filesystem = filesystem.split(' ');
    let fstype = filesystem.next()?.to_owned();
    let super_options = filesystem.nth(1).unwrap_or_default().to_owned();
    Some(Mount {
        root,
        mount_point,
        fstype,
        super_options,
    })
}

fn unescape(raw: &str) -> PathBuf {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(byte) = octal_escape(&bytes[i..]) {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// The byte a leading `\ooo` stands for.
fn octal_escape(bytes: &[u8]) -> Option<u8> {
    let [b'\\', digits @ ..] = bytes.get(..4)? else {
        return None;
    };
    digits.iter().try_fold(0u8, |value, digit| {
        let digit = digit.checked_sub(b'0').filter(|d| *d < 8)?;
        value.checked_mul(8)?.checked_add(digit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
33 25 0:29 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
34 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw shared:11 master:3 - cgroup cgroup rw,cpu,cpuacct
40 30 0:31 /kubepods/pod1 /mnt/with\\040space rw - cgroup2 cgroup2 rw
not a mount line
";

    #[test]
    fn fields_are_read_past_the_optional_ones() {
        let mounts = parse(TABLE);
        assert_eq!(mounts.len(), 4);
        assert_eq!(
            mounts[2],
            Mount {
                root: PathBuf::from("/"),
                mount_point: PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                fstype: "cgroup".to_owned(),
                super_options: "rw,cpu,cpuacct".to_owned(),
            }
        );
        assert!(mounts[2].is_cgroup_v1_with("cpuacct"));
        assert!(!mounts[2].is_cgroup_v1_with("memory"));
        assert!(mounts[1].is_cgroup2());
        assert!(!mounts[0].is_cgroup2());
    }

    #[test]
    fn escaped_paths_are_unescaped() {
        let mounts = parse(TABLE);
        assert_eq!(mounts[3].root, PathBuf::from("/kubepods/pod1"));
        assert_eq!(mounts[3].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(unescape(r"a\134b\011c"), PathBuf::from("a\\b\tc"));
        // Not an escape: kept as it is.
        assert_eq!(unescape(r"a\9xy\1"), PathBuf::from(r"a\9xy\1"));
    }
}
