//! The kubelet's client TLS bootstrap (`pkg/kubelet/certificate/bootstrap`): when `--kubeconfig` does
//! not exist yet, the agent uses `--bootstrap-kubeconfig` (typically a bootstrap token) to ask the API
//! server for a client certificate of its own through a `CertificateSigningRequest`
//! (`kubernetes.io/kube-apiserver-client-kubelet`, `CN=system:node:<node>`, `O=system:nodes`), waits
//! until it is approved and issued, writes the key and certificate into `--cert-dir`
//! (`kubelet-client-<time>.pem`, linked from `kubelet-client-current.pem`) and a kubeconfig naming
//! them at the `--kubeconfig` path, and uses that from then on.
//!
//! The private key is kept in `kubelet-client.key.tmp` while the request is pending, so an agent
//! restarted during the wait asks again with the same key instead of leaving a trail of requests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;
use sha2::{Digest as _, Sha256};

use super::{ApiClient, ApiClientOptions, ApiServerError, is_already_exists};

/// The signer that issues kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The link to the current client certificate and key in the cert dir.
pub const CURRENT_CLIENT_PEM: &str = "kubelet-client-current.pem";
const PENDING_KEY: &str = "kubelet-client.key.tmp";
/// How long the agent waits for its request to be approved and issued (the kubelet's hour).
const ISSUE_TIMEOUT: Duration = Duration::from_hours(1);

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("using the bootstrap kubeconfig")]
    Client(#[source] ApiServerError),
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating the client key or certificate request")]
    Key(#[source] rcgen::Error),
    #[error("{0}")]
    Request(String),
    #[error("certificate signing request {name} was denied: {message}")]
    Denied { name: String, message: String },
    #[error("certificate signing request {name} failed: {message}")]
    Failed { name: String, message: String },
    #[error("certificate signing request {name} was not issued within {timeout:?}")]
    Timeout { name: String, timeout: Duration },
    #[error("writing the kubeconfig {path}")]
    EncodeKubeconfig {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("reading the bootstrap kubeconfig {path}")]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
}

/// What the bootstrap needs to know.
#[derive(Clone, Debug)]
pub struct BootstrapSettings {
    pub node_name: String,
    pub bootstrap_kubeconfig: PathBuf,
    pub kubeconfig: PathBuf,
    pub cert_dir: PathBuf,
}

/// Writes `settings.kubeconfig` through the TLS bootstrap unless it exists already. Returns whether
/// a bootstrap happened.
pub async fn bootstrap_if_needed(settings: &BootstrapSettings) -> Result<bool, BootstrapError> {
    if settings.kubeconfig.exists() {
        return Ok(false);
    }
    tracing::info!(
        kubeconfig = %settings.kubeconfig.display(),
        bootstrap = %settings.bootstrap_kubeconfig.display(),
        "no kubeconfig yet: requesting a client certificate with the bootstrap kubeconfig"
    );
    let client =
        ApiClient::from_kubeconfig(&settings.bootstrap_kubeconfig, ApiClientOptions::default())
            .await
            .map_err(BootstrapError::Client)?;
    create_dir(&settings.cert_dir)?;
    let key = pending_key(&settings.cert_dir)?;
    let certificate = request_certificate(&client, &settings.node_name, &key).await?;
    let current = write_client_pem(&settings.cert_dir, &certificate, &key.serialize_pem())?;
    write_kubeconfig(settings, &current)?;
    remove_file(&settings.cert_dir.join(PENDING_KEY))?;
    tracing::info!(
        kubeconfig = %settings.kubeconfig.display(),
        certificate = %current.display(),
        "TLS bootstrap done: client certificate issued"
    );
    Ok(true)
}

fn create_dir(dir: &Path) -> Result<(), BootstrapError> {
    std::fs::create_dir_all(dir).map_err(|source| BootstrapError::Io {
        path: dir.to_owned(),
        source,
    })
}

fn remove_file(path: &Path) -> Result<(), BootstrapError> {
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(BootstrapError::Io {
            path: path.to_owned(),
            source: err,
        }),
        _ => Ok(()),
    }
}

/// The key of a pending request, or a new ECDSA P-256 key saved as pending.
fn pending_key(cert_dir: &Path) -> Result<rcgen::KeyPair, BootstrapError> {
    let path = cert_dir.join(PENDING_KEY);
    if let Ok(pem) = std::fs::read_to_string(&path)
        && let Ok(key) = rcgen::KeyPair::from_pem(&pem)
    {
        return Ok(key);
    }
    let key = rcgen::KeyPair::generate().map_err(BootstrapError::Key)?;
    write_private(&path, key.serialize_pem().as_bytes())?;
    Ok(key)
}

/// Writes a file only root can read.
fn write_private(path: &Path, contents: &[u8]) -> Result<(), BootstrapError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| BootstrapError::Io {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("writing");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    file.write_all(contents).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The request's name: a digest of the key and the subject, so the same key asks under the same name
/// (the kubelet derives its `node-csr-` names the same way).
fn request_name(node_name: &str, key: &rcgen::KeyPair) -> String {
    let mut digest = Sha256::new();
    digest.update(key.public_key_raw());
    digest.update(node_name.as_bytes());
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.finalize());
    format!("node-csr-{encoded}")
}

async fn request_certificate(
    client: &ApiClient,
    node_name: &str,
    key: &rcgen::KeyPair,
) -> Result<Vec<u8>, BootstrapError> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("system:node:{node_name}"),
    );
    let csr_pem = params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(BootstrapError::Key)?;
    let name = request_name(node_name, key);
    let request = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: KUBELET_CLIENT_SIGNER.to_owned(),
            usages: Some(vec![
                "digital signature".to_owned(),
                "client auth".to_owned(),
            ]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let api = Api::<CertificateSigningRequest>::all(client.client());
    match api.create(&PostParams::default(), &request).await {
        Ok(_) => {
            tracing::info!(csr = %name, "certificate signing request created; waiting for approval");
        }
        Err(err) if is_already_exists(&err) => {
            tracing::info!(csr = %name, "waiting for the certificate signing request of an earlier start");
        }
        Err(err) => {
            return Err(BootstrapError::Request(client.describe(
                &format!("create certificatesigningrequest/{name}"),
                &err,
            )));
        }
    }
    let issued = kube::runtime::wait::await_condition(api, &name, is_decided);
    let decided = tokio::time::timeout(ISSUE_TIMEOUT, issued)
        .await
        .map_err(|_| BootstrapError::Timeout {
            name: name.clone(),
            timeout: ISSUE_TIMEOUT,
        })?
        .map_err(|err| {
            BootstrapError::Request(format!(
                "waiting for certificatesigningrequest/{name}: {}",
                crate::error_chain::error_chain(&err)
            ))
        })?;
    let status = decided.and_then(|csr| csr.status).unwrap_or_default();
    for condition in status.conditions.iter().flatten() {
        let message = condition.message.clone().unwrap_or_default();
        match condition.type_.as_str() {
            "Denied" => return Err(BootstrapError::Denied { name, message }),
            "Failed" => return Err(BootstrapError::Failed { name, message }),
            _ => {}
        }
    }
    status
        .certificate
        .map(|certificate| certificate.0)
        .filter(|certificate| !certificate.is_empty())
        .ok_or_else(|| {
            BootstrapError::Request(format!(
                "certificatesigningrequest/{name} was deleted before it was issued"
            ))
        })
}

/// Denied, failed, or issued (approved with a certificate).
fn is_decided(csr: Option<&CertificateSigningRequest>) -> bool {
    let Some(status) = csr.and_then(|csr| csr.status.as_ref()) else {
        return csr.is_none();
    };
    let final_condition = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Denied" || c.type_ == "Failed");
    final_condition || status.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
}

/// Writes `kubelet-client-<unix time>.pem` (certificate, then key) and points
/// `kubelet-client-current.pem` at it. Returns the link's path.
fn write_client_pem(
    cert_dir: &Path,
    certificate: &[u8],
    key_pem: &str,
) -> Result<PathBuf, BootstrapError> {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let file_name = format!("kubelet-client-{stamp}.pem");
    let mut contents = certificate.to_vec();
    if !contents.ends_with(b"\n") {
        contents.push(b'\n');
    }
    contents.extend_from_slice(key_pem.as_bytes());
    write_private(&cert_dir.join(&file_name), &contents)?;
    let current = cert_dir.join(CURRENT_CLIENT_PEM);
    let link_tmp = cert_dir.join(format!("{CURRENT_CLIENT_PEM}.new"));
    remove_file(&link_tmp)?;
    std::os::unix::fs::symlink(&file_name, &link_tmp).map_err(|source| BootstrapError::Io {
        path: link_tmp.clone(),
        source,
    })?;
    std::fs::rename(&link_tmp, &current).map_err(|source| BootstrapError::Io {
        path: current.clone(),
        source,
    })?;
    Ok(current)
}

/// The kubeconfig the agent uses from now on: the bootstrap kubeconfig's cluster, the issued
/// certificate and key as the user.
fn write_kubeconfig(settings: &BootstrapSettings, client_pem: &Path) -> Result<(), BootstrapError> {
    let bootstrap = Kubeconfig::read_from(&settings.bootstrap_kubeconfig).map_err(|source| {
        BootstrapError::ReadKubeconfig {
            path: settings.bootstrap_kubeconfig.clone(),
            source,
        }
    })?;
    let current_cluster = bootstrap
        .contexts
        .iter()
        .find(|c| Some(&c.name) == bootstrap.current_context.as_ref())
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone());
    let cluster = bootstrap
        .clusters
        .into_iter()
        .find(|c| Some(&c.name) == current_cluster.as_ref())
        .and_then(|c| c.cluster)
        .unwrap_or_default();
    let mut cluster = cluster;
    // Inline the CA so the new kubeconfig does not depend on the bootstrap file's directory.
    if let Some(path) = cluster.certificate_authority.take() {
        let ca = std::fs::read(&path).map_err(|source| BootstrapError::Io {
            path: PathBuf::from(&path),
            source,
        })?;
        cluster.certificate_authority_data =
            Some(base64::engine::general_purpose::STANDARD.encode(ca));
    }
    let pem = client_pem.display().to_string();
    let kubeconfig = Kubeconfig {
        clusters: vec![kube::config::NamedCluster {
            name: "default-cluster".to_owned(),
            cluster: Some(cluster),
            other: BTreeMap::new(),
        }],
        auth_infos: vec![kube::config::NamedAuthInfo {
            name: "default-auth".to_owned(),
            auth_info: Some(kube::config::AuthInfo {
                client_certificate: Some(pem.clone()),
                client_key: Some(pem),
                ..kube::config::AuthInfo::default()
            }),
            other: BTreeMap::new(),
        }],
        contexts: vec![kube::config::NamedContext {
            name: "default-context".to_owned(),
            context: Some(kube::config::Context {
                cluster: "default-cluster".to_owned(),
                user: Some("default-auth".to_owned()),
                namespace: Some("default".to_owned()),
                ..kube::config::Context::default()
            }),
            other: BTreeMap::new(),
        }],
        current_context: Some("default-context".to_owned()),
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        ..Kubeconfig::default()
    };
    let yaml = serde_yaml_ng::to_string(&kubeconfig).map_err(|source| {
        BootstrapError::EncodeKubeconfig {
            path: settings.kubeconfig.clone(),
            source,
        }
    })?;
    if let Some(parent) = settings.kubeconfig.parent() {
        create_dir(parent)?;
    }
    write_private(&settings.kubeconfig, yaml.as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };
    use std::os::unix::fs::PermissionsExt as _;

    fn csr(conditions: &[&str], certificate: &[u8]) -> CertificateSigningRequest {
        CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|t| CertificateSigningRequestCondition {
                            type_: (*t).to_owned(),
                            status: "True".to_owned(),
                            ..CertificateSigningRequestCondition::default()
                        })
                        .collect(),
                ),
                certificate: Some(ByteString(certificate.to_vec())),
            }),
            ..CertificateSigningRequest::default()
        }
    }

    #[test]
    fn a_request_is_decided_when_issued_denied_or_failed() {
        assert!(!is_decided(Some(&csr(&[], b""))));
        assert!(!is_decided(Some(&csr(&["Approved"], b""))));
        assert!(is_decided(Some(&csr(&["Approved"], b"cert"))));
        assert!(is_decided(Some(&csr(&["Denied"], b""))));
        assert!(is_decided(Some(&csr(&["Failed"], b""))));
        assert!(is_decided(None), "a deleted request ends the wait");
    }

    #[test]
    fn the_same_key_asks_under_the_same_name() {
        let key = rcgen::KeyPair::generate().unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        assert_eq!(request_name("n1", &key), request_name("n1", &key));
        assert_ne!(request_name("n1", &key), request_name("n1", &other));
        assert_ne!(request_name("n1", &key), request_name("n2", &key));
        assert!(request_name("n1", &key).starts_with("node-csr-"));
    }

    #[test]
    fn a_pending_key_is_reused_and_the_client_pem_is_linked() {
        let dir = tempfile::tempdir().unwrap();
        let first = pending_key(dir.path()).unwrap();
        let again = pending_key(dir.path()).unwrap();
        assert_eq!(first.public_key_raw(), again.public_key_raw());
        let current = write_client_pem(dir.path(), b"CERT", "KEY\n").unwrap();
        assert_eq!(std::fs::read_to_string(&current).unwrap(), "CERT\nKEY\n");
        let target = std::fs::read_link(&current).unwrap();
        assert!(target.to_string_lossy().starts_with("kubelet-client-"));
        let mode = std::fs::metadata(&current).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
