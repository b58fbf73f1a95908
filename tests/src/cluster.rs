//! The shared Kubernetes control plane of the end-to-end tests: a real etcd and kube-apiserver on
//! loopback that `cargo xtask cluster up` starts once (its files in [`CLUSTER_DIR`]), and the jobs
//! of the components it lacks that tests need done: client certificates for nodes, namespaces ready
//! for pods (kube-controller-manager's service-account and root-CA publishers) and signing CSRs (its
//! csrsigning controller). The file layout, the CA and the kubeconfig writer are shared with the
//! xtask that sets the control plane up.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DnType, DnValue, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
};
use serde_json::{Value, json};

use crate::{skip_unless, wait_for};

/// Where `cargo xtask cluster up` keeps the control plane's certificates, kubeconfigs, etcd data,
/// logs and pid files.
pub const CLUSTER_DIR: &str = "/var/lib/ringlet-cluster";
/// The API server's secure port, on 127.0.0.1 (kubeadm's default port).
pub const API_SERVER_PORT: u16 = 6443;
/// The CA that signs every certificate of the control plane: the API server's serving certificate,
/// all client certificates it accepts, and the client certificate it presents to kubelets.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
/// A kubeconfig for user `ringlet-admin` in group `system:masters`.
pub const ADMIN_KUBECONFIG: &str = "admin.kubeconfig";
/// A kubeconfig holding the bootstrap token (`system:bootstrappers`).
pub const BOOTSTRAP_KUBECONFIG: &str = "bootstrap.kubeconfig";
/// A link to the `kubectl` the control plane was started with.
pub const KUBECTL: &str = "kubectl";

/// How long a certificate issued here (a node's, a signed CSR's) is valid.
pub const CERTIFICATE_VALIDITY: Duration = Duration::from_hours(365 * 24);
/// How far back certificates are dated, so a clock step does not make a fresh one not yet valid.
const BACKDATE: Duration = Duration::from_mins(5);
/// How long one kubectl call may take before it counts as a failure.
const REQUEST_TIMEOUT: &str = "10s";

/// Returns the control plane when it runs here; prints SKIP with the reason and returns `None` when
/// it does not, and panics instead under `CI=true`.
pub fn require_cluster(test: &str) -> Option<Cluster> {
    let cluster = Cluster::local();
    skip_unless(test, cluster.missing()).then_some(cluster)
}

/// Both the lab's containerd and the control plane, for a test that joins an agent to the cluster;
/// SKIP (a failure under `CI=true`) names what is missing.
pub fn require_lab_and_cluster(test: &str) -> Option<Cluster> {
    if !crate::require_lab(test) {
        return None;
    }
    require_cluster(test)
}

/// The control plane on loopback.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// [`CLUSTER_DIR`].
    pub dir: PathBuf,
    /// The API server's URL.
    pub server: String,
    pub admin_kubeconfig: PathBuf,
}

impl Cluster {
    /// The control plane `cargo xtask cluster up` runs, without checking that it does.
    pub fn local() -> Self {
        let dir = PathBuf::from(CLUSTER_DIR);
        Self {
            admin_kubeconfig: dir.join(ADMIN_KUBECONFIG),
            server: format!("https://127.0.0.1:{API_SERVER_PORT}"),
            dir,
        }
    }

    /// Why tests cannot use the control plane; `None` when they can.
    pub fn missing(&self) -> Option<String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not running as root (the CA key is root's)".to_owned());
        }
        for file in [
            CA_CERT,
            CA_KEY,
            ADMIN_KUBECONFIG,
            BOOTSTRAP_KUBECONFIG,
            KUBECTL,
        ] {
            let path = self.dir.join(file);
            if !path.exists() {
                return Some(format!(
                    "{} is missing (run `cargo xtask cluster up`)",
                    path.display()
                ));
            }
        }
        self.readyz().err().map(|e| {
            format!(
                "the API server at {} is not ready (run `cargo xtask cluster up`): {e:#}",
                self.server
            )
        })
    }

    /// Succeeds when the API server's `/readyz` answers `ok`.
    pub fn readyz(&self) -> Result<()> {
        let body = run(self.kubectl().args(["get", "--raw", "/readyz"]))?;
        if body.trim() != "ok" {
            bail!("/readyz answered {body:?}");
        }
        Ok(())
    }

    /// `kubectl` as the cluster admin (`system:masters`).
    pub fn kubectl(&self) -> Command {
        self.kubectl_as(&self.admin_kubeconfig)
    }

    /// `kubectl` with the identity and server of `kubeconfig`.
    pub fn kubectl_as(&self, kubeconfig: &Path) -> Command {
        let mut command = Command::new(self.dir.join(KUBECTL));
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--request-timeout={REQUEST_TIMEOUT}"));
        command
    }

    /// The CA certificate: it signs the API server's client certificate for kubelets (ringlet's
    /// `--client-ca-file`) and the API server's serving certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(CA_CERT)
    }

    /// The kubeconfig with the bootstrap token: authenticates as `system:bootstrap:<token id>` in
    /// group `system:bootstrappers`, which may create CSRs.
    pub fn bootstrap_kubeconfig(&self) -> PathBuf {
        self.dir.join(BOOTSTRAP_KUBECONFIG)
    }

    /// Writes a kubeconfig for `node` (user `system:node:<node>` in `system:nodes`, so the Node
    /// authorizer and `NodeRestriction` apply) with a fresh key and certificate, and returns its path
    /// (`nodes/<node>.kubeconfig` in the cluster directory, replaced on every call).
    pub fn node_kubeconfig(&self, node: &str) -> Result<PathBuf> {
        self.node_kubeconfig_valid_for(node, None)
    }

    /// [`Self::node_kubeconfig`] with a certificate valid from now for `validity` (not back-dated)
    /// instead of a year: certificate rotation tests.
    pub fn node_kubeconfig_valid_for(
        &self,
        node: &str,
        validity: Option<Duration>,
    ) -> Result<PathBuf> {
        let ca = Ca::load(&self.dir)?;
        let (cert_pem, key_pem) = ca.client_certificate_valid_for(
            &format!("system:node:{node}"),
            Some("system:nodes"),
            validity,
        )?;
        let user = format!("system:node:{node}");
        let config = kubeconfig(
            &self.server,
            ca.pem(),
            &user,
            &Credentials::Certificate {
                cert_pem: &cert_pem,
                key_pem: &key_pem,
            },
        );
        let path = self.dir.join("nodes").join(format!("{node}.kubeconfig"));
        write_private(&path, config.as_bytes())?;
        Ok(path)
    }

    /// Makes namespace `ns` ready for pods, as kube-controller-manager would and as this API
    /// server's tree (openshift/kubernetes) expects: the namespace, its `default` service account,
    /// and the config maps `kube-root-ca.crt` and `openshift-service-ca.crt` that every
    /// `kube-api-access-*` volume projects. Idempotent.
    pub fn prepare_namespace(&self, ns: &str) -> Result<()> {
        let ca = fs::read_to_string(self.ca_file())
            .with_context(|| format!("reading {}", self.ca_file().display()))?;
        let config_map = |name: &str, key: &str| {
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": name, "namespace": ns },
                "data": { key: ca },
            })
        };
        let objects = json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                { "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } },
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": { "name": "default", "namespace": ns },
                },
                config_map("kube-root-ca.crt", "ca.crt"),
                config_map("openshift-service-ca.crt", "service-ca.crt"),
            ],
        });
        run_with_input(
            self.kubectl().args(["apply", "-f", "-"]),
            &objects.to_string(),
        )?;
        Ok(())
    }

    /// Does for CSR `name` what the missing csrsigning controller would: approves it and writes a
    /// certificate for the CSR's public key, subject and names (its usages as asked, valid one
    /// year, signed by the CA) into its status.
    pub fn sign_csr(&self, name: &str) -> Result<()> {
        self.sign_csr_valid_for(name, None)
    }

    /// [`Self::sign_csr`], the certificate valid from now for `validity` (not back-dated) when
    /// given: certificate rotation tests.
    pub fn sign_csr_valid_for(&self, name: &str, validity: Option<Duration>) -> Result<()> {
        let csr = self.get_json(&["csr", name])?;
        let mut request = parse_csr(&csr).with_context(|| format!("CSR {name}"))?;
        let usages = csr["spec"]["usages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        set_usages(&mut request.params, &usages).with_context(|| format!("CSR {name}"))?;
        request.params.is_ca = IsCa::NoCa;
        set_validity_or_short(&mut request.params, validity);
        let ca = Ca::load(&self.dir)?;
        let certificate = ca.sign(&request.params, &request.public_key)?;

        run(self.kubectl().args(["certificate", "approve", name]))?;
        // Re-read: the status update must carry the Approved condition and its resourceVersion.
        let mut approved = self.get_json(&["csr", name])?;
        approved["status"]["certificate"] = Value::String(BASE64.encode(certificate));
        let path = format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/status");
        run_with_input(
            self.kubectl().args(["replace", "--raw", &path, "-f", "-"]),
            &approved.to_string(),
        )
        .with_context(|| format!("writing the certificate into CSR {name}"))?;
        Ok(())
    }

    /// Waits until a CSR accepted by `predicate` exists, and returns it.
    pub fn wait_for_csr(
        &self,
        what: &str,
        timeout: Duration,
        predicate: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        wait_for(what, timeout, || {
            let list = self.get_json(&["csr"]).ok()?;
            list["items"]
                .as_array()?
                .iter()
                .find(|c| predicate(c))
                .cloned()
        })
    }

    /// Waits until a CSR for `node`'s client certificate (common name `system:node:<node>`) that has
    /// no certificate yet exists, and returns its name.
    pub fn wait_for_node_csr(&self, node: &str, timeout: Duration) -> Result<String> {
        let user = format!("system:node:{node}");
        let csr = self.wait_for_csr(&format!("a CSR for {user}"), timeout, |csr| {
            csr["status"]["certificate"].is_null()
                && csr_common_name(csr).is_ok_and(|cn| cn == user)
        })?;
        csr["metadata"]["name"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("a CSR without a name: {csr}"))
    }

    /// `kubectl get <args> -o json` as the admin.
    pub fn get_json(&self, args: &[&str]) -> Result<Value> {
        let out = run(self.kubectl().arg("get").args(args).args(["-o", "json"]))?;
        serde_json::from_str(&out).with_context(|| format!("parsing `kubectl get {args:?}`"))
    }
}

/// The common name of the subject a `CertificateSigningRequest` object asks for.
pub fn csr_common_name(csr: &Value) -> Result<String> {
    let request = parse_csr(csr)?;
    match request.params.distinguished_name.get(&DnType::CommonName) {
        Some(DnValue::Utf8String(name)) => Ok(name.clone()),
        Some(DnValue::PrintableString(name)) => Ok(name.as_str().to_owned()),
        Some(DnValue::Ia5String(name)) => Ok(name.as_str().to_owned()),
        other => bail!("the CSR's common name is {other:?}"),
    }
}

/// The PKCS#10 request in a `CertificateSigningRequest` object (`spec.request`: base64 of PEM),
/// signature checked.
fn parse_csr(csr: &Value) -> Result<CertificateSigningRequestParams> {
    let encoded = csr["spec"]["request"]
        .as_str()
        .ok_or_else(|| anyhow!("the CSR has no spec.request"))?;
    let pem = String::from_utf8(BASE64.decode(encoded).context("decoding spec.request")?)
        .context("spec.request is not PEM")?;
    CertificateSigningRequestParams::from_pem(&pem).context("parsing spec.request")
}

/// Sets the key usages and extended key usages to the CSR's `spec.usages`, as the signer does.
fn set_usages(params: &mut CertificateParams, usages: &[Value]) -> Result<()> {
    params.key_usages.clear();
    params.extended_key_usages.clear();
    for usage in usages {
        match usage.as_str().unwrap_or_default() {
            "digital signature" => params.key_usages.push(KeyUsagePurpose::DigitalSignature),
            "key encipherment" => params.key_usages.push(KeyUsagePurpose::KeyEncipherment),
            "client auth" => params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth),
            "server auth" => params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth),
            other => bail!("usage {other:?} is not one sign_csr issues"),
        }
    }
    Ok(())
}

/// Makes `params` valid from a few minutes ago for `validity`.
pub fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + since_epoch.saturating_sub(BACKDATE);
    params.not_after = epoch + since_epoch + validity;
}

/// A year back-dated a few minutes, or exactly `short` from now.
fn set_validity_or_short(params: &mut CertificateParams, short: Option<Duration>) {
    match short {
        None => set_validity(params, CERTIFICATE_VALIDITY),
        Some(validity) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let epoch = rcgen::date_time_ymd(1970, 1, 1);
            params.not_before = epoch + Duration::from_secs(now.as_secs());
            params.not_after = params.not_before + validity;
        }
    }
}

/// The control plane's CA, loaded from `ca.crt` and `ca.key`.
pub struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn load(dir: &Path) -> Result<Self> {
        let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
        let pem = fs::read_to_string(&cert_path)
            .with_context(|| format!("reading {}", cert_path.display()))?;
        let key = fs::read_to_string(&key_path)
            .with_context(|| format!("reading {}", key_path.display()))?;
        let key = KeyPair::from_pem(&key).with_context(|| format!("{}", key_path.display()))?;
        let issuer = Issuer::from_ca_cert_pem(&pem, key)
            .with_context(|| format!("{}", cert_path.display()))?;
        Ok(Self { pem, issuer })
    }

    /// The CA certificate (PEM).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A certificate (PEM) for `public_key` as `params` describe it, signed by the CA.
    pub fn sign(
        &self,
        params: &CertificateParams,
        public_key: &impl PublicKeyData,
    ) -> Result<String> {
        Ok(params.signed_by(public_key, &self.issuer)?.pem())
    }

    /// A fresh key and a client certificate (PEM certificate, PEM key) for `user` in `group`, valid
    /// for [`CERTIFICATE_VALIDITY`].
    pub fn client_certificate(&self, user: &str, group: Option<&str>) -> Result<(String, String)> {
        self.client_certificate_valid_for(user, group, None)
    }

    /// [`Self::client_certificate`], valid from now for `validity` when given.
    pub fn client_certificate_valid_for(
        &self,
        user: &str,
        group: Option<&str>,
        validity: Option<Duration>,
    ) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        set_validity_or_short(&mut params, validity);
        Ok((self.sign(&params, &key)?, key.serialize_pem()))
    }
}

/// How a kubeconfig's user authenticates.
pub enum Credentials<'a> {
    /// A client certificate and its key (PEM).
    Certificate { cert_pem: &'a str, key_pem: &'a str },
    /// A bearer token.
    Token(&'a str),
}

/// A self-contained kubeconfig (JSON, which kubeconfig loaders read as YAML) for `user` on `server`,
/// trusting the CA `ca_pem`.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, credentials: &Credentials) -> String {
    let auth = match credentials {
        Credentials::Certificate { cert_pem, key_pem } => json!({
            "client-certificate-data": BASE64.encode(cert_pem),
            "client-key-data": BASE64.encode(key_pem),
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "ringlet",
            "cluster": { "server": server, "certificate-authority-data": BASE64.encode(ca_pem) },
        }],
        "users": [{ "name": user, "user": auth }],
        "contexts": [{ "name": "ringlet", "context": { "cluster": "ringlet", "user": user } }],
        "current-context": "ringlet",
    });
    format!("{config:#}\n")
}

/// Replaces `path` with `contents`, readable by root only (keys, kubeconfigs with keys or tokens),
/// through a rename so a reader never sees half a file.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no directory", path.display()))?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut file| file.write_all(contents))
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {} into place", tmp.display()))
}

/// Runs `command` and returns its stdout; fails with its stderr unless it exits 0.
pub fn run(command: &mut Command) -> Result<String> {
    run_with_input(command, "")
}

/// [`run`] with `input` on the command's stdin.
pub fn run_with_input(command: &mut Command, input: &str) -> Result<String> {
    let out = output_with_input(command, input)?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{command:?} printed non-UTF-8 output"))
}

/// Runs `command` with `input` on its stdin and returns its exit status and output, whatever the
/// status (for tests that expect a refusal).
pub fn output_with_input(command: &mut Command, input: &str) -> Result<Output> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    // The input is small (a few objects), so writing it all before reading cannot fill the pipes.
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("writing to {command:?}"))?;
    }
    child
        .wait_with_output()
        .with_context(|| format!("waiting for {command:?}"))
}
