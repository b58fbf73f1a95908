//! The container images the Kubernetes e2e suite's `[NodeConformance]` specs run, built in Rust and
//! imported into the lab's containerd under the names the suite uses, since no registry is
//! reachable here. Upstream builds them from `test/images/` of kubernetes/kubernetes (Alpine and
//! Debian bases) and the kubelet pulls them from registry.k8s.io; these stand-ins carry what the
//! specs rely on: the conformance folder's `agnhost` binary, Debian's static busybox for the
//! userland, and the real programs the specs call from hooks, probes and commands (curl, bash, nc,
//! ip, dig, nslookup, hostname), copied with every shared library `ldd` lists, because busybox's
//! applets of those names behave differently. `/bin/sh` is bash where scripts must reach those
//! programs, and busybox's ash, as in the real busybox image, elsewhere (see [`Shell`]). Layers
//! have fixed owners and times and the images are imported only when containerd lacks them, so a
//! second run changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;

use anyhow::{Context, Result, bail};

use crate::oci::{self, CompressedLayer, ImageSpec, Layer};
use crate::{cluster, cmd, lab};

const AGNHOST_REFS: &[&str] = &[
    "registry.k8s.io/e2e-test-images/agnhost:2.63.0",
    "registry.k8s.io/e2e-test-images/agnhost:2.55",
];
/// No nginx here: agnhost's `netexec` answers HTTP on port 80 as the specs using nginx expect.
const NGINX_REFS: &[&str] = &[
    "registry.k8s.io/e2e-test-images/nginx:1.15-4",
    "registry.k8s.io/e2e-test-images/nginx:1.27-0",
];
const BUSYBOX_REFS: &[&str] = &[
    "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
    "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
];
const NONROOT_REFS: &[&str] = &["registry.k8s.io/e2e-test-images/nonroot:1.5"];
const NONEWPRIVS_REFS: &[&str] = &["registry.k8s.io/e2e-test-images/nonewprivs:1.4"];
const GLIBC_DNS_TESTING_REFS: &[&str] =
    &["registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0"];
/// The kubelet 1.36 default sandbox image: the lab's pause image under this name too.
const PAUSE_REFS: &[&str] = &["registry.k8s.io/pause:3.10.2"];

/// Debian packages the images are made of (`gcc` and `libc6-dev` build the nonewprivs program,
/// `xz-utils` lets the conformance `setup.sh` unpack agnhost).
const PACKAGES: &[&str] = &[
    "busybox-static",
    "bash",
    "curl",
    "netcat-openbsd",
    "iproute2",
    "bind9-dnsutils",
    "hostname",
    "gcc",
    "libc6-dev",
    "xz-utils",
];
const BUSYBOX: &str = "/bin/busybox";
const NNP_SOURCE: &str = include_str!("nnp.c");
const PICK_SH_SOURCE: &str = include_str!("pick_sh.c");
/// The nonroot image's `USER` (its Dockerfile's): a uid without a passwd entry.
const NONROOT_USER: &str = "1234";
const CREATED_BY: &str = "cargo xtask conformance";

/// `/etc/passwd` and `/etc/group` of the busybox-based images: root and nobody.
const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n";
const GROUP: &str = "root:x:0:\nnobody:x:65534:\n";
/// agnhost's Dockerfile adds `user-defined-in-image` (uid 1000 with its own group 1000, as
/// Alpine's `adduser -D` does) and puts it into `group-defined-in-image` (gid 50000): the
/// `SupplementalGroups` specs expect `id -G` of uid 1000 to list 50000.
const AGNHOST_USER: &str = "user-defined-in-image";
const AGNHOST_USER_ID: u64 = 1000;
const AGNHOST_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
    nobody:x:65534:65534:nobody:/:/bin/false\n\
    user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n";
const AGNHOST_GROUP: &str = "root:x:0:root\n\
    nobody:x:65534:\n\
    user-defined-in-image:x:1000:\n\
    group-defined-in-image:x:50000:user-defined-in-image\n";
/// glibc's programs look names up in `/etc/hosts` (which the runtime mounts) before DNS only when
/// told to: without this file glibc asks DNS first.
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n\
    networks: files\nprotocols: files\nservices: files\n";
/// The runtime mounts the pod's own over it; a plain container (`ctr run`) keeps this one.
const HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// A program of this machine that an image carries, in place of busybox's applet of that name
/// when there is one.
#[derive(Clone, Copy, Debug)]
struct Tool {
    /// The program's path here.
    host: &'static str,
    /// Its path in the image, without the leading `/`.
    image: &'static str,
}

impl Tool {
    /// The command name it answers to (the applet it shadows).
    fn name(self) -> &'static str {
        self.image.rsplit('/').next().unwrap_or(self.image)
    }
}

const BASH: Tool = Tool {
    host: "/usr/bin/bash",
    image: "bin/bash",
};
const CURL: Tool = Tool {
    host: "/usr/bin/curl",
    image: "usr/bin/curl",
};
/// netcat-openbsd's program (`nc` is an alternatives link to it), as the real agnhost has.
const NC: Tool = Tool {
    host: "/usr/bin/nc.openbsd",
    image: "usr/bin/nc",
};
const IP: Tool = Tool {
    host: "/usr/bin/ip",
    image: "sbin/ip",
};
const DIG: Tool = Tool {
    host: "/usr/bin/dig",
    image: "usr/bin/dig",
};
const NSLOOKUP: Tool = Tool {
    host: "/usr/bin/nslookup",
    image: "usr/bin/nslookup",
};
/// Debian's `hostname`, as the real glibc-dns-testing image (Debian) has: the hostname specs that
/// use it mean to test `hostname -f` of a glibc program.
const HOSTNAME: Tool = Tool {
    host: "/usr/bin/hostname",
    image: "bin/hostname",
};

/// What the agnhost image has besides busybox (its Dockerfile installs bind-tools, curl,
/// netcat-openbsd, iproute2 and bash).
const AGNHOST_TOOLS: &[Tool] = &[CURL, BASH, NC, IP, NSLOOKUP, DIG];
/// glibc-dns-testing is Debian with dnsutils; `hostname` comes with Debian's base.
const GLIBC_DNS_TESTING_TOOLS: &[Tool] = &[BASH, HOSTNAME, DIG, NSLOOKUP];
/// Every image has bash: `/bin/sh` is bash or turns to it (see [`Shell`]).
const BUSYBOX_TOOLS: &[Tool] = &[BASH];

/// What `/bin/sh` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shell {
    /// busybox's ash, as the real busybox image has, and whose words some specs expect ("/bin/sh:
    /// can't create /file: Read-only file system"), through `pick_sh.c`: Debian's ash leaves
    /// variables whose names are not shell names (`p-data-1`) out of the environment it passes
    /// on, which the ConfigMap and Secret "via the environment" specs print with `sh -c env`, so
    /// with such a name in the environment it runs bash instead.
    Ash,
    /// bash (as `sh`, so in POSIX mode). Debian's static busybox is built as a standalone shell:
    /// its ash runs its own applet for any command of that name whatever `PATH` holds, so scripts
    /// would get busybox's `nc`, `ip`, `nslookup` or `hostname` and never the real programs.
    Bash,
}

/// A file's mode and contents, shared between the images that carry it.
#[derive(Clone, Debug)]
struct HostFile {
    mode: u32,
    data: Rc<[u8]>,
}

/// The files read from this machine, each read once.
#[derive(Default)]
struct HostFiles {
    files: BTreeMap<PathBuf, HostFile>,
}

impl HostFiles {
    fn read(&mut self, path: &Path) -> Result<HostFile> {
        if let Some(file) = self.files.get(path) {
            return Ok(file.clone());
        }
        let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let mode = fs::metadata(path)
            .with_context(|| format!("reading the mode of {}", path.display()))?
            .permissions()
            .mode()
            & 0o7777;
        let file = HostFile {
            mode,
            data: data.into(),
        };
        self.files.insert(path.to_path_buf(), file.clone());
        Ok(file)
    }
}

/// A dynamically linked program with the shared libraries (and ELF interpreter) it loads, by
/// their paths here, which are their paths in the image too.
#[derive(Clone, Debug)]
struct Program {
    tool: Tool,
    binary: HostFile,
    libraries: Vec<(String, HostFile)>,
}

impl Program {
    fn load(tool: Tool, files: &mut HostFiles) -> Result<Self> {
        let binary = files.read(Path::new(tool.host))?;
        let listing = cmd::output(Command::new("ldd").arg(tool.host))?;
        let paths = parse_ldd(&listing).with_context(|| format!("reading ldd's {}", tool.host))?;
        let mut libraries = Vec::new();
        for path in paths {
            let file = files.read(Path::new(&path))?;
            libraries.push((path, file));
        }
        Ok(Self {
            tool,
            binary,
            libraries,
        })
    }
}

/// The absolute paths of the libraries and the ELF interpreter in `ldd`'s listing (the vDSO has
/// no file); a library `ldd` did not find is an error.
fn parse_ldd(listing: &str) -> Result<Vec<String>> {
    let mut paths = Vec::new();
    let mut missing = Vec::new();
    for line in listing.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    missing.push(name.trim().to_owned());
                    continue;
                }
                target.split_whitespace().next()
            }
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            paths.push(path.to_owned());
        }
    }
    if !missing.is_empty() {
        bail!("libraries not found: {}", missing.join(", "));
    }
    paths.sort_unstable();
    paths.dedup();
    Ok(paths)
}

/// One entry of an image's file tree.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir { mode: u32, owner: u64 },
    File { mode: u32, data: Rc<[u8]> },
    Symlink(String),
}

/// An image's files by path (no leading `/`), every parent directory included: path order puts
/// a directory before what it holds, which is the order a layer wants.
#[derive(Clone, Debug, Default)]
struct Tree {
    nodes: BTreeMap<String, Node>,
}

impl Tree {
    fn parents(&mut self, path: &str) {
        let mut end = 0;
        while let Some(slash) = path[end..].find('/') {
            end += slash;
            self.nodes
                .entry(path[..end].to_owned())
                .or_insert(Node::Dir {
                    mode: 0o755,
                    owner: 0,
                });
            end += 1;
        }
    }

    fn insert(&mut self, path: &str, node: Node) {
        self.parents(path);
        self.nodes.insert(path.to_owned(), node);
    }

    fn dir(&mut self, path: &str, mode: u32) {
        self.insert(path, Node::Dir { mode, owner: 0 });
    }

    /// A directory owned by `owner` as both uid and gid (a user's home).
    fn dir_owned(&mut self, path: &str, mode: u32, owner: u64) {
        self.insert(path, Node::Dir { mode, owner });
    }

    fn file(&mut self, path: &str, mode: u32, data: impl Into<Rc<[u8]>>) {
        self.insert(
            path,
            Node::File {
                mode,
                data: data.into(),
            },
        );
    }

    fn symlink(&mut self, path: &str, target: &str) {
        self.insert(path, Node::Symlink(target.to_owned()));
    }

    #[cfg(test)]
    fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    fn layer(&self) -> Result<Layer> {
        let mut layer = Layer::new();
        for (path, node) in &self.nodes {
            match node {
                Node::Dir { mode, owner } => {
                    layer.dir_owned(&format!("{path}/"), *mode, *owner, *owner)?;
                }
                Node::File { mode, data } => layer.file(path, *mode, data)?,
                Node::Symlink(target) => layer.symlink(path, target)?,
            }
        }
        Ok(layer)
    }
}

/// What every image's userland starts from: Debian's static busybox, the applets it has, and the
/// `/bin/sh` of [`Shell::Ash`] (`pick_sh.c`).
struct Busybox {
    binary: Rc<[u8]>,
    applets: Vec<String>,
    sh: Rc<[u8]>,
}

impl Busybox {
    fn load() -> Result<Self> {
        let binary =
            fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX} (busybox-static)"))?;
        let list = cmd::output(Command::new(BUSYBOX).arg("--list"))?;
        Ok(Self {
            binary: binary.into(),
            applets: list.lines().map(str::to_owned).collect(),
            sh: lab::static_binary("pick-sh", PICK_SH_SOURCE)?.into(),
        })
    }
}

/// A busybox userland with `programs` in place of the applets of their names (real tools come
/// first whatever `PATH` says, and scripts naming `/bin/…` get them too) and `/bin/sh` as `shell`
/// says. bash must be among `programs`: either shell may run it.
fn userland(busybox: &Busybox, programs: &[&Program], shell: Shell) -> Result<Tree> {
    let mut tree = Tree::default();
    for (dir, mode) in [
        ("bin", 0o755),
        ("etc", 0o755),
        ("home", 0o755),
        ("root", 0o700),
        ("sbin", 0o755),
        ("tmp", 0o1777),
        ("usr/bin", 0o755),
        ("usr/local/bin", 0o755),
        ("usr/sbin", 0o755),
        ("var", 0o755),
    ] {
        tree.dir(dir, mode);
    }
    tree.file("bin/busybox", 0o755, busybox.binary.clone());
    if !programs.iter().any(|p| p.tool.image == BASH.image) {
        bail!("an image's /bin/sh needs bash at /{}", BASH.image);
    }
    match shell {
        Shell::Ash => tree.file("bin/sh", 0o755, busybox.sh.clone()),
        Shell::Bash => tree.symlink("bin/sh", "bash"),
    }
    let mut shadowed: BTreeSet<&str> = programs.iter().map(|p| p.tool.name()).collect();
    shadowed.insert("sh");
    for applet in busybox.applets.iter().map(|a| a.trim()) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        if !shadowed.contains(applet) {
            tree.symlink(&format!("bin/{applet}"), "busybox");
        }
    }
    for program in programs {
        tree.file(
            program.tool.image,
            program.binary.mode,
            program.binary.data.clone(),
        );
        for (path, library) in &program.libraries {
            let path = path.trim_start_matches('/');
            tree.file(path, library.mode, library.data.clone());
        }
    }
    tree.file("etc/nsswitch.conf", 0o644, NSSWITCH.as_bytes());
    tree.file("etc/hosts", 0o644, HOSTS.as_bytes());
    tree.file("etc/passwd", 0o644, PASSWD.as_bytes());
    tree.file("etc/group", 0o644, GROUP.as_bytes());
    Ok(tree)
}

/// The agnhost image's files: `agnhost` (and `agnhost-2`, a link the entrypoint specs run in its
/// place), `/uploads` for `netexec`, the certificate pair for `netexec`'s TLS (the HTTPS hook
/// specs point it at `/localhost.crt` and `/localhost.key`) and the image's own user and group;
/// bash as `/bin/sh`, so the specs' scripts reach the real `nc`, `ip` and `nslookup`.
fn agnhost_tree(
    busybox: &Busybox,
    programs: &[&Program],
    agnhost: Vec<u8>,
    (certificate, key): (Vec<u8>, Vec<u8>),
) -> Result<Tree> {
    let mut tree = userland(busybox, programs, Shell::Bash)?;
    tree.file("agnhost", 0o755, agnhost);
    tree.symlink("agnhost-2", "agnhost");
    tree.dir("uploads", 0o755);
    tree.file("localhost.crt", 0o644, certificate);
    tree.file("localhost.key", 0o644, key);
    tree.file("etc/passwd", 0o644, AGNHOST_PASSWD.as_bytes());
    tree.file("etc/group", 0o644, AGNHOST_GROUP.as_bytes());
    tree.dir_owned(&format!("home/{AGNHOST_USER}"), 0o755, AGNHOST_USER_ID);
    Ok(tree)
}

/// A self-signed certificate for `localhost` and its key, made once and kept in the lab so the
/// agnhost layer stays the same from run to run.
fn localhost_certificate() -> Result<(Vec<u8>, Vec<u8>)> {
    let dir = lab::lab_path("conformance");
    let certificate = dir.join("localhost.crt");
    let key = dir.join("localhost.key");
    if !(certificate.exists() && key.exists()) {
        let made = rcgen::generate_simple_self_signed(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
        ])
        .context("making a certificate for localhost")?;
        lab::write_if_changed(&key, made.signing_key.serialize_pem().as_bytes())?;
        lab::write_if_changed(&certificate, made.cert.pem().as_bytes())?;
    }
    let read = |path: &Path| fs::read(path).with_context(|| format!("reading {}", path.display()));
    Ok((read(&certificate)?, read(&key)?))
}

/// Builds the images the e2e suite's node specs use and imports those containerd lacks.
/// Needs root and the lab's containerd running (`cargo xtask lab up`).
pub fn build_and_import() -> Result<()> {
    cmd::ensure_root("the conformance images")?;
    lab::ensure_packages(PACKAGES)?;
    let agnhost_path = cluster::run_conformance_setup()?.join("agnhost");
    let agnhost =
        fs::read(&agnhost_path).with_context(|| format!("reading {}", agnhost_path.display()))?;

    let busybox = Busybox::load()?;
    let mut files = HostFiles::default();
    let mut programs: BTreeMap<&str, Program> = BTreeMap::new();
    for tool in AGNHOST_TOOLS
        .iter()
        .chain(GLIBC_DNS_TESTING_TOOLS)
        .chain(BUSYBOX_TOOLS)
    {
        if !programs.contains_key(tool.host) {
            programs.insert(tool.host, Program::load(*tool, &mut files)?);
        }
    }
    let pick = |tools: &[Tool]| -> Vec<&Program> {
        tools.iter().filter_map(|t| programs.get(t.host)).collect()
    };

    let layer = agnhost_tree(
        &busybox,
        &pick(AGNHOST_TOOLS),
        agnhost,
        localhost_certificate()?,
    )?
    .layer()?
    .compress()?;
    import(&layer, AGNHOST_REFS, Some(&["/agnhost"]), &["pause"], None)?;
    import(
        &layer,
        NGINX_REFS,
        Some(&["/agnhost"]),
        &["netexec", "--http-port=80"],
        None,
    )?;
    drop(layer);

    let layer = userland(&busybox, &pick(BUSYBOX_TOOLS), Shell::Ash)?
        .layer()?
        .compress()?;
    import(&layer, BUSYBOX_REFS, None, &["sh"], None)?;
    import(&layer, NONROOT_REFS, None, &["sh"], Some(NONROOT_USER))?;

    let mut tree = userland(&busybox, &pick(BUSYBOX_TOOLS), Shell::Ash)?;
    tree.file(
        "usr/local/bin/nnp",
        0o4755,
        lab::static_binary("nnp", NNP_SOURCE)?,
    );
    import(
        &tree.layer()?.compress()?,
        NONEWPRIVS_REFS,
        None,
        &["nnp"],
        None,
    )?;

    let tree = userland(&busybox, &pick(GLIBC_DNS_TESTING_TOOLS), Shell::Bash)?;
    import(
        &tree.layer()?.compress()?,
        GLIBC_DNS_TESTING_REFS,
        None,
        &["bash"],
        None,
    )?;

    lab::import_image(PAUSE_REFS, &lab::pause_image(PAUSE_REFS)?)
}

fn import(
    layer: &CompressedLayer,
    refs: &[&str],
    entrypoint: Option<&[&str]>,
    command: &[&str],
    user: Option<&str>,
) -> Result<()> {
    let spec = ImageSpec {
        refs,
        entrypoint,
        cmd: Some(command),
        env: &[lab::PATH_ENV],
        created_by: CREATED_BY,
    };
    lab::import_image(refs, &oci::build_shared(layer, &spec, user)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CURL_LDD: &str = "\tlinux-vdso.so.1 (0x00007ffd4e9f2000)
\tlibcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x00007f4cef045000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f4ceee44000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f4cef14c000)
\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f4cef026000)
";

    #[test]
    fn ldd_listing_gives_every_library_and_the_interpreter_but_not_the_vdso() {
        assert_eq!(
            parse_ldd(CURL_LDD).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib/x86_64-linux-gnu/libcurl.so.4",
                "/lib/x86_64-linux-gnu/libz.so.1",
                "/lib64/ld-linux-x86-64.so.2",
            ]
        );
    }

    #[test]
    fn a_library_ldd_did_not_find_is_an_error_naming_it() {
        let listing =
            "\tlibfoo.so.1 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n";
        let err = parse_ldd(listing).unwrap_err().to_string();
        assert!(err.contains("libfoo.so.1"), "{err}");
    }

    #[test]
    fn a_static_program_has_no_libraries() {
        assert!(
            parse_ldd("\tnot a dynamic executable\n")
                .unwrap()
                .is_empty()
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
    }

    fn fake_busybox() -> Busybox {
        Busybox {
            binary: Rc::from(&b"busybox"[..]),
            applets: [
                "[", "ash", "cat", "hostname", "ip", "nc", "nslookup", "sh", "wget",
            ]
            .map(str::to_owned)
            .to_vec(),
            sh: Rc::from(&b"pick-sh"[..]),
        }
    }

    fn fake_program(tool: Tool) -> Program {
        let file = |data: &[u8], mode| HostFile {
            mode,
            data: data.into(),
        };
        Program {
            tool,
            binary: file(tool.host.as_bytes(), 0o755),
            libraries: vec![
                (
                    "/lib/x86_64-linux-gnu/libc.so.6".to_owned(),
                    file(b"libc", 0o644),
                ),
                (
                    "/lib64/ld-linux-x86-64.so.2".to_owned(),
                    file(b"ld.so", 0o755),
                ),
            ],
        }
    }

    fn symlink_to_busybox(tree: &Tree, path: &str) -> bool {
        tree.get(path) == Some(&Node::Symlink("busybox".to_owned()))
    }

    #[test]
    fn real_tools_replace_the_applets_of_their_names() {
        let programs: Vec<Program> = AGNHOST_TOOLS.iter().map(|t| fake_program(*t)).collect();
        let refs: Vec<&Program> = programs.iter().collect();
        let tree = userland(&fake_busybox(), &refs, Shell::Bash).unwrap();

        for shadowed in ["bin/nc", "bin/ip", "bin/nslookup"] {
            assert_eq!(tree.get(shadowed), None, "{shadowed}");
        }
        assert_eq!(tree.get("bin/sh"), Some(&Node::Symlink("bash".to_owned())));
        for applet in ["bin/cat", "bin/wget", "bin/hostname", "bin/ash", "bin/["] {
            assert!(symlink_to_busybox(&tree, applet), "{applet}");
        }
        for tool in AGNHOST_TOOLS {
            assert!(
                matches!(tree.get(tool.image), Some(Node::File { mode: 0o755, data }) if **data == *tool.host.as_bytes()),
                "{}",
                tool.image
            );
        }
        assert!(matches!(
            tree.get("lib64/ld-linux-x86-64.so.2"),
            Some(Node::File { mode: 0o755, .. })
        ));
        assert!(matches!(
            tree.get("lib/x86_64-linux-gnu/libc.so.6"),
            Some(Node::File { mode: 0o644, .. })
        ));
        assert!(matches!(
            tree.get("lib/x86_64-linux-gnu"),
            Some(Node::Dir { mode: 0o755, .. })
        ));
    }

    #[test]
    fn sh_is_the_shell_picker_and_ash_stays_an_applet() {
        let bash = fake_program(BASH);
        let tree = userland(&fake_busybox(), &[&bash], Shell::Ash).unwrap();
        assert!(
            matches!(tree.get("bin/sh"), Some(Node::File { mode: 0o755, data }) if **data == *b"pick-sh")
        );
        assert!(matches!(tree.get("bin/bash"), Some(Node::File { .. })));
        for applet in ["bin/ash", "bin/cat", "bin/nc", "bin/ip", "bin/hostname"] {
            assert!(symlink_to_busybox(&tree, applet), "{applet}");
        }
    }

    #[test]
    fn a_userland_without_bash_is_refused() {
        let curl = fake_program(CURL);
        for shell in [Shell::Ash, Shell::Bash] {
            assert!(userland(&fake_busybox(), &[&curl], shell).is_err());
        }
    }

    #[test]
    fn every_parent_directory_comes_before_its_entries() {
        let programs: Vec<Program> = AGNHOST_TOOLS.iter().map(|t| fake_program(*t)).collect();
        let refs: Vec<&Program> = programs.iter().collect();
        let tree = agnhost_tree(
            &fake_busybox(),
            &refs,
            b"agnhost".to_vec(),
            (vec![], vec![]),
        )
        .unwrap();
        let mut seen = BTreeSet::new();
        for (path, node) in &tree.nodes {
            if let Some((parent, _)) = path.rsplit_once('/') {
                assert!(seen.contains(parent), "{path} before {parent}");
            }
            if matches!(node, Node::Dir { .. }) {
                seen.insert(path.as_str());
            }
        }
        assert_eq!(
            tree.get("tmp"),
            Some(&Node::Dir {
                mode: 0o1777,
                owner: 0
            })
        );
        assert_eq!(
            tree.get("home/user-defined-in-image"),
            Some(&Node::Dir {
                mode: 0o755,
                owner: 1000
            })
        );
        assert_eq!(
            tree.get("agnhost-2"),
            Some(&Node::Symlink("agnhost".to_owned()))
        );
        assert!(matches!(tree.get("uploads"), Some(Node::Dir { .. })));
    }

    /// The fields of the line of `name` in a passwd or group file.
    fn entry<'a>(file: &'a str, name: &str) -> Vec<&'a str> {
        file.lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|fields| fields[0] == name)
            .unwrap()
    }

    #[test]
    fn agnhost_user_is_1000_and_member_of_group_50000() {
        assert!(AGNHOST_PASSWD.lines().all(|l| l.split(':').count() == 7));
        assert!(AGNHOST_GROUP.lines().all(|l| l.split(':').count() == 4));
        let user = entry(AGNHOST_PASSWD, AGNHOST_USER);
        assert_eq!((user[2], user[3]), ("1000", "1000"));
        assert_eq!(user[5], "/home/user-defined-in-image");
        let own = entry(AGNHOST_GROUP, AGNHOST_USER);
        assert_eq!(own[2], "1000");
        let group = entry(AGNHOST_GROUP, "group-defined-in-image");
        assert_eq!(group[2], "50000");
        assert_eq!(group[3].split(',').collect::<Vec<_>>(), [AGNHOST_USER]);
        let nobody = entry(AGNHOST_PASSWD, "nobody");
        assert_eq!((nobody[2], nobody[3]), ("65534", "65534"));
    }

    #[test]
    fn glibc_resolves_hosts_from_the_file_first() {
        let hosts = NSSWITCH
            .lines()
            .find_map(|l| l.strip_prefix("hosts:"))
            .unwrap();
        assert_eq!(
            hosts.split_whitespace().collect::<Vec<_>>(),
            ["files", "dns"]
        );
    }
}
