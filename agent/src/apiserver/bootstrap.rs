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
use std::time::Duration;

use base64::Engine as _;
use kube::config::Kubeconfig;

use super::{ApiClient, ApiClientOptions, ApiServerError};
use crate::certificate::CertificateError;
use crate::certificate::csr::{CsrTemplate, request_certificate};
use crate::certificate::store::{self, CLIENT_PREFIX, PairStore};

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
    #[error("generating the client key")]
    Key(#[source] rcgen::Error),
    #[error("requesting the client certificate")]
    Certificate(#[source] CertificateError),
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
    store::create_dir(&settings.cert_dir).map_err(BootstrapError::Certificate)?;
    let key = pending_key(&settings.cert_dir)?;
    let template = CsrTemplate::client(&settings.node_name);
    let certificate = request_certificate(&client, &template, &key, ISSUE_TIMEOUT)
        .await
        .map_err(BootstrapError::Certificate)?;
    let current = PairStore::new(&settings.cert_dir, CLIENT_PREFIX)
        .write(&certificate, &key.serialize_pem())
        .map_err(BootstrapError::Certificate)?;
    write_kubeconfig(settings, &current)?;
    store::remove_file(&settings.cert_dir.join(PENDING_KEY))
        .map_err(BootstrapError::Certificate)?;
    tracing::info!(
        kubeconfig = %settings.kubeconfig.display(),
        certificate = %current.display(),
        "TLS bootstrap done: client certificate issued"
    );
    Ok(true)
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
    store::write_private(&path, key.serialize_pem().as_bytes())
        .map_err(BootstrapError::Certificate)?;
    Ok(key)
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
        store::create_dir(parent).map_err(BootstrapError::Certificate)?;
    }
    store::write_private(&settings.kubeconfig, yaml.as_bytes()).map_err(BootstrapError::Certificate)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_key_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = pending_key(dir.path()).unwrap();
        let again = pending_key(dir.path()).unwrap();
        assert_eq!(first.public_key_raw(), again.public_key_raw());
    }
}
