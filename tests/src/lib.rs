//! Harness for ringlet's privileged end-to-end tests: they run the real `ringlet` binary as root
//! against the lab's real containerd and runc (`cargo xtask lab up`), with a private root dir,
//! manifest dir and ports per test, and clean up the pods they started even when they fail.
//!
//! A test that cannot run here (not root, no containerd) prints SKIP with the reason; with `CI=true`
//! that is a failure instead, so CI never passes by skipping.
//!
//! Tests that need the API server share one control plane (`cargo xtask cluster up`), reached
//! through [`cluster`].

use std::fs;
use std::io::{BufRead as _, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

pub mod cluster;
pub mod cluster_node;
pub mod daemon;
pub mod kubelet_host;
pub mod node_lock;
pub mod private_containerd;
pub mod registry;
pub mod stalling_proxy;

pub use cluster::{Cluster, require_cluster};
pub use registry::require_registry;

/// Names the I/O engine (`uring`, `epoll`) every agent of the suite runs on; unset leaves `auto`.
pub const IO_ENGINE_ENV: &str = "RINGLET_E2E_IO_ENGINE";

/// The containerd socket the lab starts.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// Where `cargo xtask lab` keeps containerd's configuration, log and pid file.
pub const LAB_DIR: &str = "/var/lib/ringlet-lab";
/// Flags that turn image garbage collection off, for agents on the lab's containerd: by the
/// kubelet's measure (space available to non-root users against the size) this machine's root
/// filesystem is above the default 85 % (ext4 reserves most of its free blocks here), so
/// collection would remove every image no container uses at that moment, the busybox, pause and
/// conformance images everyone needs. The upstream kubelet runs with the same
/// (`kubelet_host.rs`).
pub const LAB_IMAGE_GC_OFF: [&str; 4] = [
    "--image-gc-high-threshold",
    "100",
    "--image-gc-low-threshold",
    "99",
];
/// The hard eviction thresholds of agents on the lab, the lab kubelet's (`kubelet_host.rs`): the
/// disk of a build machine sits near the default 10 %/15 % nodefs/imagefs thresholds, and an agent
/// under disk pressure would evict and refuse every pod it is given.
pub const LAB_EVICTION_HARD: &str =
    "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%";
/// What every agent the xtask tasks start on the lab gets: [`LAB_EVICTION_HARD`] and
/// [`LAB_IMAGE_GC_OFF`].
pub const LAB_AGENT_FLAGS: [&str; 5] = [
    LAB_EVICTION_HARD,
    LAB_IMAGE_GC_OFF[0],
    LAB_IMAGE_GC_OFF[1],
    LAB_IMAGE_GC_OFF[2],
    LAB_IMAGE_GC_OFF[3],
];

/// The lab's containerd, as `cargo xtask lab up` started it.
pub fn lab_containerd() -> daemon::Daemon {
    daemon::Daemon::new("containerd", LAB_DIR)
}

/// Starts the lab's containerd again with the command line it ran with (read before a test
/// stopped it), and waits until it answers.
pub fn restart_lab_containerd(containerd: &daemon::Daemon, command_line: &[String]) -> Result<()> {
    let (binary, args) = command_line
        .split_first()
        .context("containerd's command line is empty")?;
    containerd.start(
        Path::new(binary),
        args,
        || {
            Command::new("ctr")
                .args(["--address", CONTAINERD_SOCKET, "version"])
                .output()
                .is_ok_and(|o| o.status.success())
        },
        Duration::from_secs(30),
    )
}

/// Whether the privileged suite can run here; `None` when it can, else why not.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".to_owned());
    }
    if !Path::new(CONTAINERD_SOCKET).exists() {
        return Some(format!(
            "containerd socket {CONTAINERD_SOCKET} is missing (run `cargo xtask lab up`)"
        ));
    }
    let answers = Command::new("ctr")
        .args(["--address", CONTAINERD_SOCKET, "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !answers {
        return Some("containerd does not answer `ctr version`".to_owned());
    }
    None
}

/// Where the kernel exposes its BTF, which the eBPF PLEG needs.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Returns `true` when the test may go on; prints SKIP and returns `false` when it cannot run here,
/// and panics instead under `CI=true`.
pub fn require_lab(test: &str) -> bool {
    skip_unless(test, missing_prerequisite())
}

/// [`require_lab`] plus what the eBPF PLEG needs from the kernel: BTF and a bpffs at `/sys/fs/bpf`.
pub fn require_ebpf_lab(test: &str) -> bool {
    let missing = missing_prerequisite().or_else(|| {
        if !Path::new(KERNEL_BTF).exists() {
            return Some(format!("the kernel has no BTF ({KERNEL_BTF} is missing)"));
        }
        if !Path::new("/sys/fs/bpf").is_dir() {
            return Some("/sys/fs/bpf is missing (no bpffs)".to_owned());
        }
        None
    });
    skip_unless(test, missing)
}

/// [`require_lab`] plus the agent's image: built (its layout under [`image_dir`]) and imported.
pub fn require_ringlet_image(test: &str) -> bool {
    let missing = missing_prerequisite().or_else(|| {
        let build = "run `cargo xtask image --import`";
        if !image_dir().join("oci").join("index.json").is_file() {
            return Some(format!(
                "no image layout in {}: {build}",
                image_dir().display()
            ));
        }
        let listed = k8s_ctr(&["images", "ls", "--quiet"]).ok()?;
        let imported = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .any(|name| name == RINGLET_IMAGE);
        (!imported).then(|| format!("{RINGLET_IMAGE} is not in the lab's containerd: {build}"))
    });
    skip_unless(test, missing)
}

pub(crate) fn skip_unless(test: &str, missing: Option<String>) -> bool {
    match missing {
        None => true,
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: cannot run in CI: {reason}")
        }
        Some(reason) => {
            eprintln!("SKIP {test}: {reason}");
            false
        }
    }
}

/// The variables cargo sets for the crate it runs (a test binary, `cargo run -p xtask`), not for
/// the user: `CARGO_MANIFEST_DIR`, `CARGO_PKG_*` and the like.
fn set_by_cargo_for_its_crate(name: &str) -> bool {
    const PREFIXES: [&str; 2] = ["CARGO_PKG_", "CARGO_MANIFEST_"];
    const NAMES: [&str; 6] = [
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    PREFIXES.iter().any(|prefix| name.starts_with(prefix)) || NAMES.contains(&name)
}

/// A `cargo` command (the one running us, else from `PATH`) without the variables cargo set for
/// the crate it runs. Build scripts (ring's among them) rerun when one of those changes, so a
/// build started from a test or from xtask would otherwise rebuild ring, rustls, kube and ringlet,
/// and the next build from a shell would rebuild them again.
pub fn cargo_command() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_its_crate) {
            command.env_remove(name);
        }
    }
    command
}

/// Path of the `ringlet` binary, built once per test process.
pub fn ringlet_binary() -> Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .ok_or("tests/ has no parent")?
                .to_path_buf();
            let status = cargo_command()
                .args(["build", "--quiet", "-p", "ringlet", "--bin", "ringlet"])
                .current_dir(&workspace)
                .status()
                .map_err(|e| format!("cannot run cargo build: {e}"))?;
            if !status.success() {
                return Err("cargo build -p ringlet failed".to_owned());
            }
            Ok(target_dir().join("debug").join("ringlet"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The workspace's target directory (`CARGO_TARGET_DIR` when set).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        },
        PathBuf::from,
    )
}

/// The target triple `cargo xtask image` builds the static binary for; with `--target` its output
/// has a folder of its own, apart from the normal builds.
pub fn image_target() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// The static release binary `cargo xtask image` builds and puts into the image.
pub fn image_binary() -> PathBuf {
    target_dir()
        .join(image_target())
        .join("release")
        .join("ringlet")
}

/// The agent's container image as `cargo xtask image` names it (and imports it into the lab).
pub const RINGLET_IMAGE: &str = concat!("ghcr.io/ringlet/ringlet:", env!("CARGO_PKG_VERSION"));

/// Where `cargo xtask image` writes the image: the OCI layout directory `oci/` and the tar
/// `ringlet-image.tar` for `ctr images import`.
pub fn image_dir() -> PathBuf {
    target_dir().join("image")
}

/// A free TCP port on loopback (bound and released; the agent binds it right after).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One HTTP/1.1 GET over a fresh connection; returns (status code, body).
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP response"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("no status code in {head:?}"))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((code, body))
}

fn dechunk(mut body: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .ok_or_else(|| anyhow!("bad chunk"))?;
        let size = usize::from_str_radix(size.trim(), 16)?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).ok_or_else(|| anyhow!("short chunk"))?);
        body = rest.get(size + 2..).ok_or_else(|| anyhow!("short chunk"))?;
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or fails after `timeout` with `what`.
/// The timeout is an upper bound on a real process's progress, not a synchronisation device.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The test client's identity for the kubelet API: a CA the agent trusts (`--client-ca-file`) and a
/// client certificate it signed for user `e2e-admin` in group `system:masters`.
pub struct ClientIdentity;

impl ClientIdentity {
    /// The CA certificate to give the agent as `--client-ca-file`.
    pub fn ca_file(dir: &Path) -> PathBuf {
        dir.join("client-ca.crt")
    }

    /// (certificate, key) of the client.
    pub fn paths(dir: &Path) -> (PathBuf, PathBuf) {
        (dir.join("client.crt"), dir.join("client.key"))
    }

    /// A rustls client that trusts the agent's serving certificate `server_cert` and presents the
    /// client certificate written into `dir`.
    pub fn tls_client_config(
        dir: &Path,
        server_cert: &Path,
    ) -> Result<std::sync::Arc<rustls::ClientConfig>> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(server_cert)
            .with_context(|| format!("reading {}", server_cert.display()))?
        {
            roots.add(cert?)?;
        }
        let (cert, key) = Self::paths(dir);
        let chain = CertificateDer::pem_file_iter(&cert)?.collect::<Result<Vec<_>, _>>()?;
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&key)?)?;
        Ok(std::sync::Arc::new(config))
    }

    /// Writes the CA and the client certificate and key into `dir`.
    pub fn write(dir: &Path) -> Result<()> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "ringlet-e2e-client-ca");
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let client_key = KeyPair::generate()?;
        let mut client_params = CertificateParams::new(Vec::<String>::new())?;
        client_params
            .distinguished_name
            .push(DnType::CommonName, "e2e-admin");
        client_params
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        let client = client_params.signed_by(&client_key, &issuer)?;
        fs::write(Self::ca_file(dir), ca.pem())?;
        let (cert, key) = Self::paths(dir);
        fs::write(cert, client.pem())?;
        fs::write(key, client_key.serialize_pem())?;
        Ok(())
    }
}

/// How often [`Agent::start`] tries fresh ports when another process took one first.
const PORT_ATTEMPTS: usize = 3;

/// How many of the agent's last log lines a failed start reports.
const LOG_TAIL_LINES: usize = 40;

/// Settings for one agent under test.
#[derive(Default)]
pub struct AgentOptions {
    pub manifest_url: Option<String>,
    /// Extra flags.
    pub args: Vec<String>,
    /// The node name instead of `e2e-<test>`.
    pub node: Option<String>,
    /// `--client-ca-file` instead of the test's own client CA (e.g. the cluster's, whose
    /// certificates the API server presents when it forwards `kubectl logs` and `exec`).
    pub client_ca_file: Option<PathBuf>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// `--root-dir` instead of `root/` in the agent's own directory (e.g. a small tmpfs).
    pub root_dir: Option<PathBuf>,
    /// The CRI socket instead of the lab's containerd's (e.g. a proxy in front of it).
    pub runtime_socket: Option<PathBuf>,
}

/// A running `ringlet` with its own directories and ports. Dropping it removes its manifests, waits
/// (bounded) for its pods to be gone, and stops it.
pub struct Agent {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub node: String,
    pub read_only_port: u16,
    pub healthz_port: u16,
    /// The kubelet API (HTTPS) port.
    pub api_port: u16,
    options_args: Vec<String>,
    options_env: Vec<(String, String)>,
    wrapper: Vec<String>,
    client_ca_file: PathBuf,
    root_dir: PathBuf,
    runtime_socket: PathBuf,
    // Dropped after the agent is stopped (fields drop after `Drop::drop`).
    _node_lock: node_lock::NodeLock,
}

impl Agent {
    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    pub fn root_dir(&self) -> PathBuf {
        self.root_dir.clone()
    }

    /// The agent's event socket (`ringlet events --socket`), private to this agent.
    pub fn events_socket(&self) -> PathBuf {
        self.dir.path().join("events.sock")
    }

    /// Starts an agent named after the test (the node name, so pod names are unique per test).
    pub fn start(test: &str, options: AgentOptions) -> Result<Self> {
        Self::start_wrapped(test, options, &[])
    }

    /// [`Agent::start`] with the agent run under `wrapper` (`wrapper[0] wrapper[1..] ringlet
    /// flags...`), e.g. `unshare` to give it a namespace of its own.
    pub fn start_wrapped(test: &str, options: AgentOptions, wrapper: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("ringlet-e2e-").tempdir()?;
        fs::create_dir_all(dir.path().join("manifests"))?;
        let node = options
            .node
            .clone()
            .unwrap_or_else(|| format!("e2e-{}", test.replace('_', "-")));
        let mut args = vec![
            "--pod-manifest-path".to_owned(),
            dir.path().join("manifests").display().to_string(),
            "--file-check-frequency".to_owned(),
            "2s".to_owned(),
            "--http-check-frequency".to_owned(),
            "1s".to_owned(),
        ];
        if let Some(url) = &options.manifest_url {
            args.extend(["--manifest-url".to_owned(), url.clone()]);
        }
        // `cargo xtask test` runs the suite once per I/O engine.
        if let Ok(engine) = std::env::var(IO_ENGINE_ENV)
            && !options
                .args
                .iter()
                .any(|arg| arg.starts_with("--io-engine"))
        {
            args.extend(["--io-engine".to_owned(), engine]);
        }
        // As the lab's kubelet (`kubelet_host.rs`): the disk of a build machine sits near the
        // default 10 %/15 % nodefs/imagefs thresholds, and an agent under disk pressure would
        // evict and refuse every test's pods. A test that is about eviction sets its own.
        if !options
            .args
            .iter()
            .any(|arg| arg.starts_with("--eviction-hard"))
        {
            args.push(LAB_EVICTION_HARD.to_owned());
        }
        if !options
            .args
            .iter()
            .any(|arg| arg.starts_with("--image-gc-"))
        {
            args.extend(LAB_IMAGE_GC_OFF.map(str::to_owned));
        }
        args.extend(options.args);
        let client_ca_file = options
            .client_ca_file
            .clone()
            .unwrap_or_else(|| ClientIdentity::ca_file(dir.path()));
        let root_dir = options
            .root_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("root"));
        let mut agent = Self {
            _node_lock: node_lock::node_lock()?,
            child: None,
            client_ca_file,
            root_dir,
            runtime_socket: options
                .runtime_socket
                .unwrap_or_else(|| PathBuf::from(CONTAINERD_SOCKET)),
            dir,
            node,
            read_only_port: free_port()?,
            healthz_port: free_port()?,
            api_port: free_port()?,
            options_args: args,
            options_env: options.env,
            wrapper: wrapper.iter().map(|&w| w.to_owned()).collect(),
        };
        ClientIdentity::write(agent.dir.path())?;
        // `free_port` only finds ports free at the time: another process may take one before the
        // agent binds it. The agent then stops with "cannot listen on", and fresh ports are tried.
        for _ in 1..PORT_ATTEMPTS {
            match agent.spawn() {
                Err(err) if format!("{err:#}").contains("cannot listen on") => {
                    eprintln!("{err:#}\ntrying other ports");
                    agent.read_only_port = free_port()?;
                    agent.healthz_port = free_port()?;
                    agent.api_port = free_port()?;
                }
                other => return other.map(|()| agent),
            }
        }
        agent.spawn()?;
        Ok(agent)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("agent.log"))?;
        let binary = ringlet_binary()?;
        let mut command = match self.wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        let child = command
            .args(&self.options_args)
            .args([
                "--root-dir",
                &self.root_dir().display().to_string(),
                "--hostname-override",
                &self.node,
                "--read-only-port",
                &self.read_only_port.to_string(),
                "--healthz-port",
                &self.healthz_port.to_string(),
                "--port",
                &self.api_port.to_string(),
                "--address",
                "127.0.0.1",
                "--client-ca-file",
                &self.client_ca_file.display().to_string(),
                "--container-runtime-endpoint",
                &format!("unix://{}", self.runtime_socket.display()),
                "--events-socket",
                &self.events_socket().display().to_string(),
            ])
            .env("RINGLET_LOG", "ringlet=debug,info")
            .envs(self.options_env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start ringlet")?;
        self.child = Some(child);
        let started = wait_for("the agent's healthz port", Duration::from_secs(30), || {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Some(Err(anyhow!("the agent exited with {status}")));
            }
            http_get(self.healthz_port, "/healthz").ok().map(|_| Ok(()))
        })
        .and_then(|started| started);
        if let Err(err) = started {
            let _ = self.kill();
            bail!(
                "{err:#}; the end of its log:\n{}",
                tail(&self.log(), LOG_TAIL_LINES)
            );
        }
        Ok(())
    }

    /// One request to the kubelet API over TLS with `curl`, trusting the agent's generated serving
    /// certificate; `as_client` presents the test's client certificate (user `e2e-admin`).
    /// Returns (status code, body).
    pub fn api_request(&self, method: &str, path: &str, as_client: bool) -> Result<(u16, String)> {
        let mut command = self.curl(as_client);
        command.args(["-X", method, "-w", "\n%{http_code}"]);
        command.arg(format!("https://127.0.0.1:{}{path}", self.api_port));
        let out = command.output().context("cannot run curl")?;
        if !out.status.success() {
            bail!(
                "curl {path} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text
            .rsplit_once('\n')
            .ok_or_else(|| anyhow!("no status line from curl"))?;
        Ok((code.trim().parse()?, body.to_owned()))
    }

    /// `GET path` on the kubelet API as the test's client.
    pub fn api_get(&self, path: &str) -> Result<(u16, String)> {
        self.api_request("GET", path, true)
    }

    /// A `curl` command set up for the agent's kubelet API (`--path-as-is`, so tests can send
    /// paths curl would otherwise normalise).
    pub fn curl(&self, as_client: bool) -> Command {
        let mut command = Command::new("curl");
        command.args(["-sS", "--path-as-is", "--max-time", "30", "--cacert"]);
        command.arg(self.serving_cert());
        if as_client {
            let identity = ClientIdentity::paths(self.dir.path());
            command
                .arg("--cert")
                .arg(identity.0)
                .arg("--key")
                .arg(identity.1);
        }
        command
    }

    /// The serving certificate the agent generated (it trusts itself: self-signed).
    pub fn serving_cert(&self) -> PathBuf {
        self.root_dir().join("pki").join("kubelet.crt")
    }

    /// The running agent's process id (to signal it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The agent's log so far (for assertion messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// The agent's `/metrics` (Prometheus text) from the read-only port.
    pub fn metrics(&self) -> Result<String> {
        let (code, body) = http_get(self.read_only_port, "/metrics")?;
        if code != 200 {
            bail!("/metrics answered {code}: {body}");
        }
        Ok(body)
    }

    /// One sample of `/metrics`, e.g. `ringlet_pleg_relists_total{type="full"}`; 0 when the agent
    /// does not export it (yet).
    pub fn metric(&self, series: &str) -> Result<u64> {
        Ok(metric_value(&self.metrics()?, series).unwrap_or(0))
    }

    /// Stops the agent with SIGTERM, as an operator would, and waits (bounded) for it to exit;
    /// returns whether it exited successfully. Dropping the agent afterwards starts it again to
    /// clean up.
    pub fn stop(&mut self) -> Result<bool> {
        let Some(mut child) = self.child.take() else {
            bail!("the agent is not running");
        };
        let pid = i32::try_from(child.id())?;
        // SAFETY: `pid` is our own child, not yet reaped, so it cannot name another process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = wait_for(
            "the agent to exit after SIGTERM",
            Duration::from_secs(30),
            || child.try_wait().ok().flatten(),
        );
        match status {
            Ok(status) => Ok(status.success()),
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(error)
            }
        }
    }

    /// Stops the agent with SIGKILL, as a crash would; its containers keep running.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts the agent again with the same directories and ports.
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.spawn()
    }

    /// Writes a manifest file into the manifest directory.
    pub fn write_manifest(&self, file: &str, content: &str) -> Result<()> {
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        fs::write(&tmp, content)?;
        fs::rename(&tmp, self.manifests().join(file))?;
        Ok(())
    }

    pub fn remove_manifest(&self, file: &str) -> Result<()> {
        fs::remove_file(self.manifests().join(file))?;
        Ok(())
    }

    /// The `items` of `/pods`.
    pub fn pods(&self) -> Result<Vec<Value>> {
        let (code, body) = http_get(self.read_only_port, "/pods")?;
        if code != 200 {
            bail!("/pods answered {code}: {body}");
        }
        let list: Value = serde_json::from_str(&body)?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The static pod called `<name>-<node>` on `/pods`, if present.
    pub fn pod(&self, name: &str) -> Option<Value> {
        self.pod_named(&format!("{name}-{}", self.node))
    }

    /// The pod called exactly `name` on `/pods` (an API server pod), if present.
    pub fn pod_named(&self, name: &str) -> Option<Value> {
        self.pods()
            .ok()?
            .into_iter()
            .find(|p| p["metadata"]["name"] == name)
    }

    /// Waits until `check` accepts the static pod's `/pods` entry, and returns it.
    pub fn wait_pod(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        self.wait_pod_named(&format!("{name}-{}", self.node), what, timeout, check)
    }

    /// [`Agent::wait_pod`] for a pod called exactly `name` (an API server pod).
    pub fn wait_pod_named(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        wait_for(&format!("pod {name}: {what}"), timeout, || {
            self.pod_named(name).filter(|p| check(p))
        })
        .with_context(|| format!("agent log:\n{}", tail(&self.log(), 60)))
    }
}

/// The value of `series` (name and labels exactly as the agent prints them, e.g.
/// `ringlet_pleg_mode{mode="ebpf"}`) in Prometheus text `metrics`, parsed as `T` (`u64` for
/// counts, `f64` for sums).
pub fn metric_value<T: std::str::FromStr>(metrics: &str, series: &str) -> Option<T> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
}

/// Waits until a `ringlet events` child started with its stderr piped says it is watching: from
/// then on every event reaches it. Its stderr goes on to ours.
pub fn wait_until_watching(events: &mut Child, timeout: Duration) -> Result<()> {
    let stderr = events
        .stderr
        .take()
        .context("ringlet events has no piped stderr")?;
    let (watching, started) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("{line}");
            if line.starts_with("ringlet events: watching ") {
                let _ = watching.send(());
            }
        }
    });
    started
        .recv_timeout(timeout)
        .context("ringlet events did not say it is watching")
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.is_none() && self.spawn().is_err() {
            return;
        }
        if let Ok(entries) = fs::read_dir(self.manifests()) {
            for entry in entries.flatten() {
                let _ = fs::remove_file(entry.path());
            }
        }
        let node = self.node.clone();
        let pods_dir = self.root_dir.join("pods");
        // A pod is gone once its containers are and the agent has removed its directory, which
        // unmounts its volumes.
        let removed = wait_for(
            "the test's pods to be removed",
            Duration::from_mins(1),
            || {
                let left = containers_of_node(&node).ok()?;
                let dirs_left = fs::read_dir(&pods_dir).is_ok_and(|mut d| d.next().is_some());
                (left.is_empty() && !dirs_left).then_some(())
            },
        );
        if let Err(err) = removed {
            let dirs: Vec<_> = fs::read_dir(&pods_dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|entry| entry.file_name())
                .collect();
            eprintln!("{err:#}; pod directories left: {dirs:?}");
            // What the agent failed to remove must not outlive the test: later tests share the
            // runtime, and an upstream kubelet would find and kill pods it does not own.
            if let Err(err) = remove_sandboxes_of_node(&node) {
                eprintln!("removing the sandboxes the agent left: {err:#}");
            }
        }
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: `pid` is our own child, not yet reaped, so it cannot name another process.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let _ = child.wait();
        }
        if let Err(err) = kubelet_host::unmount_below(&self.root_dir) {
            eprintln!("unmounting what the agent left below its root dir: {err:#}");
        }
    }
}

/// Stops and removes, through CRI, every sandbox of a static pod of `node` (its containers go
/// with it), as a test's last resort when the agent it ran did not. Runs on a thread of its own,
/// so it may be called from async tests too.
pub fn remove_sandboxes_of_node(node: &str) -> Result<()> {
    with_sandboxes_of_node(node, |client, sandboxes| async move {
        for (id, name) in sandboxes {
            eprintln!("removing sandbox {id} of {name}, left by the agent");
            client.stop_pod_sandbox(&id).await?;
            client.remove_pod_sandbox(&id).await?;
        }
        Ok(())
    })
}

/// How many sandboxes of static pods of `node` the lab's containerd has.
pub fn count_sandboxes_of_node(node: &str) -> Result<usize> {
    with_sandboxes_of_node(node, |_, sandboxes| async move { Ok(sandboxes.len()) })
}

/// Runs `action` on the ids and names of the sandboxes of `node`'s static pods (named
/// `<pod>-<node>`), with a CRI client, on a thread and runtime of its own.
fn with_sandboxes_of_node<T, F, Fut>(node: &str, action: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(ringlet::kuberuntime::CriClient, Vec<(String, String)>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>>,
{
    let suffix = format!("-{node}");
    let run = move || -> Result<T> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let client =
                ringlet::kuberuntime::CriClient::new(CONTAINERD_SOCKET, Duration::from_mins(1))?;
            let sandboxes = client
                .list_pod_sandbox(None)
                .await?
                .into_iter()
                .filter_map(|sandbox| {
                    let name = sandbox.metadata.map(|m| m.name).unwrap_or_default();
                    name.ends_with(&suffix).then_some((sandbox.id, name))
                })
                .collect();
            action(client, sandboxes).await
        })
    };
    std::thread::spawn(run)
        .join()
        .map_err(|_| anyhow!("listing the sandboxes panicked"))?
}

/// The directories below the v1 memory hierarchy's `kubepods` (three levels: `QoS`, pod, container)
/// whose name contains `uid`.
pub fn pod_cgroups_of(uid: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![(Path::new("/sys/fs/cgroup/memory/kubepods").to_path_buf(), 0)];
    while let Some((dir, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten().filter(|e| e.path().is_dir()) {
            if entry.file_name().to_string_lossy().contains(uid) {
                found.push(entry.path().display().to_string());
            } else if depth < 2 {
                pending.push((entry.path(), depth + 1));
            }
        }
    }
    found
}

/// The pod state of one container on a `/pods` entry: `running`, `waiting` or `terminated`.
pub fn container_status<'a>(pod: &'a Value, container: &str) -> Option<&'a Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == container)
}

pub fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

/// Ids of the containerd containers (sandboxes included) whose pod name ends with `-<node>`.
pub fn containers_of_node(node: &str) -> Result<Vec<String>> {
    let suffix = format!("-{node}");
    containers_labelled(|labels| {
        labels["io.kubernetes.pod.name"]
            .as_str()
            .is_some_and(|name| name.ends_with(&suffix))
    })
}

/// Ids of the containerd containers (sandboxes included) of pods in namespace `namespace`.
pub fn containers_of_namespace(namespace: &str) -> Result<Vec<String>> {
    containers_labelled(|labels| labels["io.kubernetes.pod.namespace"] == namespace)
}

/// `ctr` on the lab's containerd in the CRI plugin's namespace (`k8s.io`), run to completion.
pub fn k8s_ctr(args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("ctr")
        .args(["--address", CONTAINERD_SOCKET, "-n", "k8s.io"])
        .args(args)
        .output()
}

/// Containerd's task (the container's process) of container `id`: its pid and status
/// (`RUNNING`, `STOPPED`, …), or `None` when it has none.
pub fn task(id: &str) -> Result<Option<(u32, String)>> {
    let out = k8s_ctr(&["tasks", "ls"])?;
    if !out.status.success() {
        bail!("ctr tasks ls failed");
    }
    // TASK PID STATUS
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields[..] {
                [task, pid, status] if task == id => Some((pid.parse().ok()?, status.to_owned())),
                _ => None,
            }
        }))
}

/// Whether containerd runs a task for container `id`.
pub fn task_running(id: &str) -> Result<bool> {
    Ok(task(id)?.is_some_and(|(_, status)| status == "RUNNING"))
}

/// The labels containerd keeps on container `id` (`io.kubernetes.pod.uid`, `…pod.name`, …).
pub fn container_labels(id: &str) -> Result<Value> {
    let info = k8s_ctr(&["containers", "info", id])?;
    let info: Value = serde_json::from_slice(&info.stdout)
        .with_context(|| format!("`ctr containers info {id}` printed no JSON"))?;
    Ok(info["Labels"].clone())
}

/// Ids of the containerd containers whose labels `wanted` accepts.
fn containers_labelled(wanted: impl Fn(&Value) -> bool) -> Result<Vec<String>> {
    let out = k8s_ctr(&["containers", "ls", "--quiet"])?;
    if !out.status.success() {
        bail!("ctr containers ls failed");
    }
    let mut ids = Vec::new();
    for id in String::from_utf8_lossy(&out.stdout).lines() {
        if container_labels(id).is_ok_and(|labels| wanted(&labels)) {
            ids.push(id.to_owned());
        }
    }
    Ok(ids)
}

/// A manifest of a one-container busybox pod running `command` under `restart_policy`.
pub fn busybox_pod(name: &str, restart_policy: &str, command: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  restartPolicy: {restart_policy}
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {command:?}]
"#
    )
}

/// Runs `ringlet --runonce` on the given manifests as node `node`; returns (exit success, stdout).
pub fn run_once(node: &str, manifests: &[(&str, String)]) -> Result<(bool, String)> {
    let dir = tempfile::Builder::new()
        .prefix("ringlet-runonce-")
        .tempdir()?;
    let manifest_dir = dir.path().join("manifests");
    fs::create_dir_all(&manifest_dir)?;
    for (file, content) in manifests {
        fs::write(manifest_dir.join(file), content)?;
    }
    let output = Command::new(ringlet_binary()?)
        .args([
            "--runonce",
            "--pod-manifest-path",
            &manifest_dir.display().to_string(),
            "--root-dir",
            &dir.path().join("root").display().to_string(),
            "--hostname-override",
            node,
            "--container-runtime-endpoint",
            &format!("unix://{CONTAINERD_SOCKET}"),
        ])
        .output()
        .context("cannot run ringlet --runonce")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        eprintln!(
            "runonce stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok((output.status.success(), stdout))
}

/// A manifest of a pod whose container allocates 200 MB under a 32 MiB memory limit, so the kernel
/// OOM-kills it (restartPolicy Never: one kill, then the pod is Failed).
pub fn memory_hog_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "a=$(head -c 200000000 /dev/zero | tr '\\0' x); echo ${{#a}}"]
    resources:
      limits: {{memory: 32Mi}}
"#
    )
}
