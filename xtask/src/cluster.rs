//! The control plane: a real etcd and kube-apiserver on loopback for the end-to-end tests, the
//! benches and the demo, set up without systemd, kubeadm or a controller manager. `up` finds the
//! binaries (envtest's `KUBEBUILDER_ASSETS`), generates the PKI, the kubeconfigs and a bootstrap
//! token once, starts etcd and the API server detached and applies the RBAC and token objects that
//! kubeadm would; every step is skipped when already done. The file layout is defined by
//! `ringlet_tests::cluster`, through which the tests reach the control plane.
//!
//! With `--controllers` (what `cargo xtask conformance` needs) `up` also starts
//! kube-controller-manager and kube-scheduler from the conformance folder
//! (`../shared/conformance/setup.sh`): namespaces then get their service account and CA config
//! maps, CSRs are signed, and pods without `spec.nodeName` are scheduled. Without it the tests'
//! harness does that work itself, and nothing evicts a test's pods from a node that went away.
//!
//! The API server writes a Metadata-level audit log ([`AUDIT_LOG`]) of what node agents do, for
//! `cargo xtask bench cluster` (server-side latency of status patches and lease renewals, requests
//! per minute). An API server of ours that runs with other flags or an older audit policy (one
//! started before the audit log existed) is restarted once so it writes it.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use ringlet_tests::cluster::{
    ADMIN_KUBECONFIG, BOOTSTRAP_KUBECONFIG, CA_CERT, CA_KEY, CERTIFICATE_VALIDITY, CLUSTER_DIR, Ca,
    Cluster, Credentials, KUBECTL, kubeconfig, run_with_input, set_validity, write_private,
};
use serde_json::json;

use crate::{cmd, http, workspace_root};
use ringlet_tests::daemon::Daemon;

/// etcd's client and peer ports on 127.0.0.1: not etcd's defaults (2379, 2380), so an etcd that
/// Debian's package or anyone else started cannot collide with ours.
const ETCD_CLIENT_PORT: u16 = 12379;
const ETCD_PEER_PORT: u16 = 12380;
const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/16";
/// The first address of the service range: the `kubernetes` Service's, so it is in the serving
/// certificate as in every cluster.
const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
const CA_VALIDITY: Duration = Duration::from_hours(10 * 365 * 24);
/// Group every token-authenticated bootstrapper gets besides `system:bootstrappers`, as kubeadm's.
const BOOTSTRAP_EXTRA_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// The user of the client certificate the API server presents to kubelets (kubeadm's name).
const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
const ETCD_START_TIMEOUT: Duration = Duration::from_secs(30);
/// `/readyz` says ok about 3 s after the start here; the margin is for a cold page cache (the
/// binary is 120 MB) and a busy CI machine.
const APISERVER_START_TIMEOUT: Duration = Duration::from_mins(2);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// The envtest convention's variable naming the folder with the binaries.
const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// Debian's `etcd-server`, which envtest's `setup.sh` links into its folder.
const DEBIAN_ETCD: &str = "/usr/bin/etcd";

/// The audit log and its policy, in [`CLUSTER_DIR`]; the log is rotated at 100 MB, two old files
/// kept.
pub const AUDIT_LOG: &str = "audit.log";
const AUDIT_POLICY: &str = "audit-policy.yaml";
/// Every request of a node agent (group `system:nodes`), so its requests can be counted and timed,
/// and anyone's requests on pods, nodes, leases and events, so their lifecycle can be followed.
/// Metadata only (no bodies) and no `RequestReceived` stage: one line per request (two for a
/// watch: started, completed), with `requestReceivedTimestamp` and `stageTimestamp` in µs.
const AUDIT_POLICY_YAML: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [\"system:nodes\"]
- level: Metadata
  resources:
  - group: \"\"
    resources: [pods, pods/status, nodes, nodes/status, events]
  - group: coordination.k8s.io
    resources: [leases]
  - group: events.k8s.io
    resources: [events]
- level: None
";

const ETCD: Daemon = Daemon::new("etcd", CLUSTER_DIR);
const APISERVER: Daemon = Daemon::new("kube-apiserver", CLUSTER_DIR);
const CONTROLLER_MANAGER: Daemon = Daemon::new("kube-controller-manager", CLUSTER_DIR);
const SCHEDULER: Daemon = Daemon::new("kube-scheduler", CLUSTER_DIR);
/// Their secure ports' defaults; both serve `/healthz` to anyone.
const CONTROLLER_MANAGER_PORT: u16 = 10257;
const SCHEDULER_PORT: u16 = 10259;
/// Every controller but those that need a cloud or a pod network of nodes' CIDRs.
const CONTROLLERS: &str =
    "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller";
const CONTROLLER_START_TIMEOUT: Duration = Duration::from_mins(1);
/// The variable naming the folder with the conformance binaries (`setup.sh`'s own convention).
const CONFORMANCE_ENV: &str = "CONFORMANCE_DIR";

fn cluster_path(name: &str) -> PathBuf {
    Path::new(CLUSTER_DIR).join(name)
}

/// Brings the control plane up; with `controllers`, kube-controller-manager and kube-scheduler too.
pub fn up(controllers: bool) -> Result<()> {
    cmd::ensure_root("the control plane")?;
    let binaries = Binaries::find()?;
    fs::create_dir_all(CLUSTER_DIR).with_context(|| format!("creating {CLUSTER_DIR}"))?;
    // Keys and tokens live here.
    fs::set_permissions(CLUSTER_DIR, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("restricting {CLUSTER_DIR} to root"))?;
    link_kubectl(&binaries.kubectl)?;
    let token = write_credentials()?;
    start_etcd(&binaries.etcd)?;
    start_apiserver(&binaries.kube_apiserver)?;
    apply_objects(&token)?;
    if controllers {
        start_controllers(&run_conformance_setup()?)?;
    }
    let cluster = Cluster::local();
    println!(
        "control plane is up: API server {}, admin kubeconfig {} (kubectl: {})",
        cluster.server,
        cluster.admin_kubeconfig.display(),
        cluster_path(KUBECTL).display()
    );
    Ok(())
}

pub fn down() -> Result<()> {
    cmd::ensure_root("the control plane")?;
    // The API server's clients first, then the API server: it would log etcd errors while etcd
    // is gone.
    for daemon in [&SCHEDULER, &CONTROLLER_MANAGER, &APISERVER, &ETCD] {
        match daemon.stop(STOP_TIMEOUT)? {
            Some(pid) => println!("{} {pid} stopped", daemon.program),
            None => println!("no {} started by `cluster up` is running", daemon.program),
        }
    }
    println!("etcd's data stays in {CLUSTER_DIR}/etcd; the next `cluster up` starts from it");
    Ok(())
}

pub fn status() -> Result<()> {
    let missing: Vec<&str> = [
        CA_CERT,
        CA_KEY,
        ADMIN_KUBECONFIG,
        BOOTSTRAP_KUBECONFIG,
        KUBECTL,
    ]
    .into_iter()
    .filter(|file| !cluster_path(file).exists())
    .collect();
    if missing.is_empty() {
        println!("files in {CLUSTER_DIR}: present");
    } else {
        println!("files in {CLUSTER_DIR}: MISSING {}", missing.join(", "));
    }
    for daemon in [&ETCD, &APISERVER, &CONTROLLER_MANAGER, &SCHEDULER] {
        match daemon.running_pid()? {
            Some(pid) => println!("{} started by `cluster up`: pid {pid}", daemon.program),
            None => println!("{} started by `cluster up`: none", daemon.program),
        }
    }
    let etcd = if etcd_answers() {
        "healthy"
    } else {
        "NOT answering"
    };
    println!("etcd on http://127.0.0.1:{ETCD_CLIENT_PORT}: {etcd}");
    let cluster = Cluster::local();
    match cluster.readyz() {
        Ok(()) => println!("{}/readyz: ok", cluster.server),
        Err(e) => println!("{}/readyz: NOT ready ({e:#})", cluster.server),
    }
    println!("admin kubeconfig: {}", cluster.admin_kubeconfig.display());
    match fs::metadata(cluster_path(AUDIT_LOG)) {
        Ok(meta) => println!(
            "audit log: {} ({} kB)",
            cluster_path(AUDIT_LOG).display(),
            meta.len() / 1024
        ),
        Err(_) => println!(
            "audit log: {} MISSING (`cargo xtask cluster up` restarts the API server with it)",
            cluster_path(AUDIT_LOG).display()
        ),
    }
    Ok(())
}

/// The binaries of the envtest convention.
struct Binaries {
    kube_apiserver: PathBuf,
    kubectl: PathBuf,
    etcd: PathBuf,
}

impl Binaries {
    /// From `KUBEBUILDER_ASSETS`, else from the folder envtest's `setup.sh` unpacks into. etcd may
    /// be missing from the folder when `setup.sh` ran before `etcd-server` was installed (`.ci/run`
    /// exports the folder before `lab up` installs it): Debian's etcd is what it would link.
    fn find() -> Result<Self> {
        let assets = match std::env::var_os(ASSETS_ENV).filter(|v| !v.is_empty()) {
            Some(assets) => PathBuf::from(assets),
            None => run_envtest_setup()?,
        };
        let in_assets = |name: &str| -> Result<PathBuf> {
            let path = assets.join(name);
            if !path.exists() {
                bail!(
                    "{} is missing (from {ASSETS_ENV} or envtest's setup.sh)",
                    path.display()
                );
            }
            Ok(path)
        };
        let etcd = match in_assets("etcd") {
            Ok(path) => path,
            Err(_) if Path::new(DEBIAN_ETCD).exists() => PathBuf::from(DEBIAN_ETCD),
            Err(e) => {
                return Err(e.context(format!(
                    "and {DEBIAN_ETCD} is missing too: install etcd-server (`cargo xtask lab up` does)"
                )));
            }
        };
        Ok(Self {
            kube_apiserver: in_assets("kube-apiserver")?,
            kubectl: in_assets("kubectl")?,
            etcd,
        })
    }
}

/// Runs envtest's `setup.sh` (next to the workspace, else in the shared folder of this machine)
/// and returns the folder it prints.
pub(crate) fn run_envtest_setup() -> Result<PathBuf> {
    run_shared_setup(
        "envtest",
        &format!("point {ASSETS_ENV} at a folder with kube-apiserver, kubectl and etcd"),
    )
}

/// The folder with the conformance binaries (`e2e.test`, `ginkgo`, kube-controller-manager,
/// kube-scheduler, agnhost): `$CONFORMANCE_DIR` when it holds them, else what the conformance
/// `setup.sh` unpacks.
pub(crate) fn run_conformance_setup() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(CONFORMANCE_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.join("e2e.test").exists() {
            return Ok(dir);
        }
    }
    run_shared_setup(
        "conformance",
        &format!(
            "point {CONFORMANCE_ENV} at a folder with e2e.test, ginkgo, kube-controller-manager, kube-scheduler and agnhost"
        ),
    )
}

/// Runs `<folder>/setup.sh` of the shared folder (next to the workspace, else this machine's)
/// and returns the folder it prints; `otherwise` says what to do without one.
fn run_shared_setup(folder: &str, otherwise: &str) -> Result<PathBuf> {
    let candidates = [
        workspace_root().join(format!("../shared/{folder}/setup.sh")),
        PathBuf::from(format!("/work/shared/{folder}/setup.sh")),
    ];
    let Some(setup) = candidates.iter().find(|c| c.exists()) else {
        bail!(
            "{folder}'s setup.sh is in neither {} nor {}: {otherwise}",
            candidates[0].display(),
            candidates[1].display()
        );
    };
    let out = cmd::output(&mut std::process::Command::new(setup))?;
    let Some(folder) = out.lines().rev().find(|l| !l.trim().is_empty()) else {
        bail!("{} printed no folder", setup.display());
    };
    println!("binaries: {} (from {})", folder.trim(), setup.display());
    Ok(PathBuf::from(folder.trim()))
}

/// Points `kubectl` in the cluster directory at the binaries' kubectl: the tests use that one.
fn link_kubectl(kubectl: &Path) -> Result<()> {
    let link = cluster_path(KUBECTL);
    if fs::read_link(&link).is_ok_and(|target| target == kubectl) {
        return Ok(());
    }
    if fs::symlink_metadata(&link).is_ok() {
        fs::remove_file(&link).with_context(|| format!("removing {}", link.display()))?;
    }
    std::os::unix::fs::symlink(kubectl, &link)
        .with_context(|| format!("linking {} to {}", link.display(), kubectl.display()))
}

/// A bootstrap token (`<id>.<secret>`, kubeadm's format).
struct BootstrapToken {
    id: String,
    secret: String,
}

/// Generates what is missing of the PKI, the service-account keys, the bootstrap token and the
/// kubeconfigs. A new CA re-issues everything it signs.
fn write_credentials() -> Result<BootstrapToken> {
    let mut wrote = Vec::new();
    let fresh_ca = !(cluster_path(CA_CERT).exists() && cluster_path(CA_KEY).exists());
    if fresh_ca {
        write_ca()?;
        wrote.push(CA_CERT);
    }
    let ca = Ca::load(Path::new(CLUSTER_DIR))?;
    let needed = |files: &[&str]| fresh_ca || files.iter().any(|f| !cluster_path(f).exists());

    if needed(&["apiserver.crt", "apiserver.key"]) {
        let key = KeyPair::generate()?;
        let names = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            KUBERNETES_SERVICE_IP,
        ];
        // rcgen makes the addresses among the names IP SANs.
        let mut params = CertificateParams::new(names.map(str::to_owned).to_vec())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        set_validity(&mut params, CERTIFICATE_VALIDITY);
        write_private(
            &cluster_path("apiserver.key"),
            key.serialize_pem().as_bytes(),
        )?;
        write_private(
            &cluster_path("apiserver.crt"),
            ca.sign(&params, &key)?.as_bytes(),
        )?;
        wrote.push("apiserver.crt");
    }
    if needed(&[
        "apiserver-kubelet-client.crt",
        "apiserver-kubelet-client.key",
    ]) {
        let (cert, key) = ca.client_certificate(KUBELET_CLIENT_USER, None)?;
        write_private(
            &cluster_path("apiserver-kubelet-client.key"),
            key.as_bytes(),
        )?;
        write_private(
            &cluster_path("apiserver-kubelet-client.crt"),
            cert.as_bytes(),
        )?;
        wrote.push("apiserver-kubelet-client.crt");
    }
    // Service-account tokens are signed by this pair, not by the CA.
    if ["sa.key", "sa.pub"]
        .iter()
        .any(|f| !cluster_path(f).exists())
    {
        let key = KeyPair::generate()?;
        write_private(&cluster_path("sa.key"), key.serialize_pem().as_bytes())?;
        write_private(&cluster_path("sa.pub"), key.public_key_pem().as_bytes())?;
        wrote.push("sa.key");
    }
    let server = Cluster::local().server;
    if needed(&[ADMIN_KUBECONFIG]) {
        let user = "ringlet-admin";
        let (cert, key) = ca.client_certificate(user, Some("system:masters"))?;
        let credentials = Credentials::Certificate {
            cert_pem: &cert,
            key_pem: &key,
        };
        let config = kubeconfig(&server, ca.pem(), user, &credentials);
        write_private(&cluster_path(ADMIN_KUBECONFIG), config.as_bytes())?;
        wrote.push(ADMIN_KUBECONFIG);
    }
    let token = bootstrap_token()?;
    let bootstrap = kubeconfig(
        &server,
        ca.pem(),
        "kubelet-bootstrap",
        &Credentials::Token(&format!("{}.{}", token.id, token.secret)),
    );
    if fs::read_to_string(cluster_path(BOOTSTRAP_KUBECONFIG)).ok() != Some(bootstrap.clone()) {
        write_private(&cluster_path(BOOTSTRAP_KUBECONFIG), bootstrap.as_bytes())?;
        wrote.push(BOOTSTRAP_KUBECONFIG);
    }
    if wrote.is_empty() {
        println!("credentials: all present in {CLUSTER_DIR}");
    } else {
        println!("credentials: wrote {} in {CLUSTER_DIR}", wrote.join(", "));
    }
    Ok(token)
}

fn write_ca() -> Result<()> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "ringlet-cluster-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, CA_VALIDITY);
    let cert = params.self_signed(&key)?;
    write_private(&cluster_path(CA_KEY), key.serialize_pem().as_bytes())?;
    write_private(&cluster_path(CA_CERT), cert.pem().as_bytes())
}

/// The token in `bootstrap-token`, generated on first use.
fn bootstrap_token() -> Result<BootstrapToken> {
    let path = cluster_path("bootstrap-token");
    let text = if let Ok(text) = fs::read_to_string(&path) {
        text
    } else {
        let text = format!("{}.{}\n", random_token_chars(6)?, random_token_chars(16)?);
        write_private(&path, text.as_bytes())?;
        text
    };
    let Some((id, secret)) = text.trim().split_once('.') else {
        bail!(
            "{} does not hold a token <id>.<secret>: {text:?}",
            path.display()
        );
    };
    Ok(BootstrapToken {
        id: id.to_owned(),
        secret: secret.to_owned(),
    })
}

/// `len` random characters of `[a-z0-9]`, the alphabet of bootstrap tokens.
fn random_token_chars(len: usize) -> Result<String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut urandom = fs::File::open("/dev/urandom").context("opening /dev/urandom")?;
    let mut out = String::with_capacity(len);
    let mut byte = [0u8; 1];
    while out.len() < len {
        urandom
            .read_exact(&mut byte)
            .context("reading /dev/urandom")?;
        // Bytes past the last whole multiple of the alphabet would favour its first letters.
        if usize::from(byte[0]) < 256 - 256 % ALPHABET.len() {
            out.push(char::from(ALPHABET[usize::from(byte[0]) % ALPHABET.len()]));
        }
    }
    Ok(out)
}

fn etcd_answers() -> bool {
    http::get(ETCD_CLIENT_PORT, "/health")
        .is_ok_and(|body| String::from_utf8_lossy(&body).contains(r#""health":"true""#))
}

fn start_etcd(etcd: &Path) -> Result<()> {
    let client = format!("http://127.0.0.1:{ETCD_CLIENT_PORT}");
    let peer = format!("http://127.0.0.1:{ETCD_PEER_PORT}");
    let args = [
        "--name=ringlet".to_owned(),
        format!("--data-dir={}", cluster_path("etcd").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=ringlet={peer}"),
    ];
    ETCD.start(etcd, &args, etcd_answers, ETCD_START_TIMEOUT)
}

fn start_apiserver(kube_apiserver: &Path) -> Result<()> {
    let policy_changed = write_audit_policy()?;
    let args = apiserver_args();
    // Our API server, started by an older `up` with other flags (before the audit log) or an
    // older policy, is restarted once; one started by anyone else is not ours to stop.
    if let Some(running) = APISERVER.command_line()? {
        let wanted: Vec<String> = std::iter::once(kube_apiserver.display().to_string())
            .chain(args.iter().cloned())
            .collect();
        if running != wanted || policy_changed {
            let why = if running == wanted {
                "the audit policy changed"
            } else {
                "it runs with other flags or another binary"
            };
            println!("kube-apiserver: restarting it: {why}");
            APISERVER.stop(STOP_TIMEOUT)?;
        }
    }
    let cluster = Cluster::local();
    APISERVER.start(
        kube_apiserver,
        &args,
        || cluster.readyz().is_ok(),
        APISERVER_START_TIMEOUT,
    )
}

/// Writes the audit policy when it differs from [`AUDIT_POLICY_YAML`]; whether it did.
fn write_audit_policy() -> Result<bool> {
    let path = cluster_path(AUDIT_POLICY);
    if fs::read_to_string(&path).is_ok_and(|text| text == AUDIT_POLICY_YAML) {
        return Ok(false);
    }
    fs::write(&path, AUDIT_POLICY_YAML).with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

fn apiserver_args() -> Vec<String> {
    let file = |name: &str| cluster_path(name).display().to_string();
    vec![
        format!("--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}"),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={}", ringlet_tests::cluster::API_SERVER_PORT),
        "--advertise-address=127.0.0.1".to_owned(),
        // The `kubernetes` Service's Endpoints may not hold a loopback address (validation says
        // so every 10 s); nothing here routes service IPs anyway, so no endpoints are kept.
        "--endpoint-reconciler-type=none".to_owned(),
        format!("--tls-cert-file={}", file("apiserver.crt")),
        format!("--tls-private-key-file={}", file("apiserver.key")),
        format!("--client-ca-file={}", file(CA_CERT)),
        "--authorization-mode=Node,RBAC".to_owned(),
        "--enable-admission-plugins=NodeRestriction".to_owned(),
        "--enable-bootstrap-token-auth".to_owned(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
        format!("--service-account-key-file={}", file("sa.pub")),
        format!("--service-account-signing-key-file={}", file("sa.key")),
        format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
        format!(
            "--kubelet-client-certificate={}",
            file("apiserver-kubelet-client.crt")
        ),
        format!(
            "--kubelet-client-key={}",
            file("apiserver-kubelet-client.key")
        ),
        // Test nodes are named `localhost` to be reached on loopback (see envtest's README).
        "--kubelet-preferred-address-types=Hostname,InternalIP".to_owned(),
        "--allow-privileged=true".to_owned(),
        format!("--audit-policy-file={}", file(AUDIT_POLICY)),
        format!("--audit-log-path={}", file(AUDIT_LOG)),
        "--audit-log-maxsize=100".to_owned(),
        "--audit-log-maxbackup=2".to_owned(),
    ]
}

/// The bootstrap token's Secret and kubeadm's bindings: bootstrappers may create CSRs, nodes may
/// renew their own client certificates, and the API server's kubelet client may use every kubelet
/// API (what the kubelets' `SubjectAccessReview` asks).
fn apply_objects(token: &BootstrapToken) -> Result<()> {
    let binding = |name: &str, role: &str, kind: &str, subject: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": name },
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject }],
        })
    };
    let objects = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": format!("bootstrap-token-{}", token.id),
                    "namespace": "kube-system",
                },
                "type": "bootstrap.kubernetes.io/token",
                // `data`, not `stringData`: apply compares what it sends with what is stored,
                // and stringData is never stored, so it would rewrite the Secret every time.
                "data": secret_data(&[
                    ("description", "ringlet's control plane: kubelets join with this token"),
                    ("token-id", &token.id),
                    ("token-secret", &token.secret),
                    ("usage-bootstrap-authentication", "true"),
                    ("usage-bootstrap-signing", "true"),
                    ("auth-extra-groups", BOOTSTRAP_EXTRA_GROUP),
                ]),
            },
            binding(
                "ringlet:kubelet-bootstrap",
                "system:node-bootstrapper",
                "Group",
                "system:bootstrappers",
            ),
            binding(
                "ringlet:node-client-certificate-renewal",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                "Group",
                "system:nodes",
            ),
            binding(
                "ringlet:apiserver-kubelet-client",
                "system:kubelet-api-admin",
                "User",
                KUBELET_CLIENT_USER,
            ),
        ],
    });
    let out = run_with_input(
        Cluster::local().kubectl().args(["apply", "-f", "-"]),
        &objects.to_string(),
    )?;
    for line in out.lines() {
        println!("objects: {line}");
    }
    Ok(())
}

/// A Secret's `data`: every value base64-encoded.
fn secret_data(entries: &[(&str, &str)]) -> serde_json::Value {
    entries
        .iter()
        .map(|(key, value)| ((*key).to_owned(), BASE64.encode(value).into()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Starts kube-controller-manager and kube-scheduler from `folder` (unless they answer already),
/// both as the admin, neither electing a leader.
fn start_controllers(folder: &Path) -> Result<()> {
    let file = |name: &str| cluster_path(name).display().to_string();
    let controller_manager = [
        format!("--kubeconfig={}", file(ADMIN_KUBECONFIG)),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={CONTROLLER_MANAGER_PORT}"),
        "--leader-elect=false".to_owned(),
        format!("--controllers={CONTROLLERS}"),
        format!("--root-ca-file={}", file(CA_CERT)),
        format!("--service-account-private-key-file={}", file("sa.key")),
        "--use-service-account-credentials=true".to_owned(),
        format!("--cluster-signing-cert-file={}", file(CA_CERT)),
        format!("--cluster-signing-key-file={}", file(CA_KEY)),
    ];
    CONTROLLER_MANAGER.start(
        &folder.join("kube-controller-manager"),
        &controller_manager,
        || healthz_answers(CONTROLLER_MANAGER_PORT),
        CONTROLLER_START_TIMEOUT,
    )?;
    let scheduler = [
        format!("--kubeconfig={}", file(ADMIN_KUBECONFIG)),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={SCHEDULER_PORT}"),
        "--leader-elect=false".to_owned(),
    ];
    SCHEDULER.start(
        &folder.join("kube-scheduler"),
        &scheduler,
        || healthz_answers(SCHEDULER_PORT),
        CONTROLLER_START_TIMEOUT,
    )
}

/// Stops kube-controller-manager and kube-scheduler when `up --controllers` started them; the API
/// server and etcd stay.
pub fn stop_controllers() -> Result<()> {
    for daemon in [&SCHEDULER, &CONTROLLER_MANAGER] {
        if let Some(pid) = daemon.stop(STOP_TIMEOUT)? {
            println!("{} {pid} stopped", daemon.program);
        }
    }
    Ok(())
}

/// Whether a control-plane component answers `ok` on `/healthz` of its secure port on loopback
/// (its certificate is self-signed: it is not checked).
fn healthz_answers(port: u16) -> bool {
    cmd::output(std::process::Command::new("curl").args([
        "--silent",
        "--insecure",
        "--max-time",
        "2",
        &format!("https://127.0.0.1:{port}/healthz"),
    ]))
    .is_ok_and(|body| body.trim() == "ok")
}
