//! The rotation loop (client-go's `certificate.Manager` as `pkg/kubelet/certificate` sets it up for
//! the client and the serving certificate): sleep until the current certificate's jittered deadline,
//! ask for a new one with a fresh key, write it to the store and hand it to its user. A failed attempt
//! is retried with exponential back-off, the old certificate in use until a new one is issued; with no
//! certificate at all the first request goes out at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;

use super::CertificateError;
use super::csr::{CsrTemplate, request_certificate};
use super::deadline::Validity;
use super::store::{CLIENT_PREFIX, PairStore, SERVER_PREFIX};
use crate::apiserver::ApiClient;
use crate::error_chain::error_chain;
use crate::server::ServingTls;

/// How long one request may wait to be approved and issued (client-go's `certificateWaitTimeout`).
const ISSUE_TIMEOUT: Duration = Duration::from_mins(15);
/// The back-off between failed attempts: doubling from the first, up to the last.
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_mins(5);

/// Who uses the certificate.
#[derive(Clone, Debug)]
enum Target {
    /// The API client: new connections present the new certificate.
    Client(Box<ApiClient>),
    /// The kubelet API's TLS: new handshakes get the new certificate.
    Serving(ServingTls),
}

impl Target {
    fn what(&self) -> &'static str {
        match self {
            Self::Client(_) => "client certificate",
            Self::Serving(_) => "serving certificate",
        }
    }

    fn apply(&self, current: &Path) -> Result<(), String> {
        match self {
            Self::Client(api) => {
                api.use_client_certificate(current);
                Ok(())
            }
            Self::Serving(tls) => tls
                .reload_certificate()
                .map_err(|error| error_chain(&error)),
        }
    }
}

/// One certificate's rotation.
struct Rotation {
    api: ApiClient,
    template: CsrTemplate,
    store: PairStore,
    target: Target,
}

impl Rotation {
    /// The certificate in use: the store's, else (client) the kubeconfig's.
    fn current(&self) -> Option<Validity> {
        let pem = match self.store.current() {
            Ok(Some(pem)) => Some(pem),
            Ok(None) => match &self.target {
                Target::Client(api) => api.client_certificate_pem(),
                Target::Serving(_) => None,
            },
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "reading the current {}", self.target.what());
                None
            }
        };
        pem.and_then(|pem| Validity::of_pem(&pem, self.target.what()).ok())
    }

    async fn run(self) {
        let mut key = None;
        loop {
            if let Some(validity) = self.current() {
                let deadline = validity.jittered_deadline();
                let wait = deadline
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tracing::info!(
                    certificate = self.target.what(),
                    expires_in = ?validity.remaining(SystemTime::now()),
                    rotation_in = ?wait,
                    "waiting for the certificate's rotation deadline"
                );
                tokio::time::sleep(wait).await;
            } else {
                tracing::info!(
                    certificate = self.target.what(),
                    "no certificate yet: requesting one"
                );
            }
            let mut backoff = FIRST_BACKOFF;
            loop {
                match self.rotate(&mut key).await {
                    Ok(current) => {
                        tracing::info!(certificate = self.target.what(), path = %current.display(), "certificate rotated");
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(
                            certificate = self.target.what(),
                            error = %error,
                            retry_in = ?backoff,
                            "certificate rotation failed; the current certificate stays in use"
                        );
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
    }

    /// One attempt. The key is kept across failed attempts, so a retry after a wait that timed out
    /// finds the same request instead of posting another.
    async fn rotate(&self, key: &mut Option<rcgen::KeyPair>) -> Result<PathBuf, String> {
        let describe = |error: CertificateError| error_chain(&error);
        let pair = match key.take() {
            Some(pair) => pair,
            None => rcgen::KeyPair::generate()
                .map_err(|error| describe(CertificateError::Key(error)))?,
        };
        let issued = request_certificate(&self.api, &self.template, &pair, ISSUE_TIMEOUT).await;
        let certificate = match issued {
            Ok(certificate) => certificate,
            Err(error @ (CertificateError::Denied { .. } | CertificateError::Failed { .. })) => {
                // A decided request stays decided: the next attempt needs a new key and name.
                return Err(describe(error));
            }
            Err(error) => {
                *key = Some(pair);
                return Err(describe(error));
            }
        };
        Validity::of_pem(&certificate, "the issued certificate").map_err(describe)?;
        let current = self
            .store
            .write(&certificate, &pair.serialize_pem())
            .map_err(describe)?;
        self.target.apply(&current)?;
        Ok(current)
    }
}

/// The client certificate's rotation; stops when dropped.
#[derive(Debug)]
pub struct ClientRotation {
    task: JoinHandle<()>,
}

impl Drop for ClientRotation {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The serving certificate's rotation; stops when dropped.
#[derive(Debug)]
pub struct ServingRotation {
    task: JoinHandle<()>,
}

impl Drop for ServingRotation {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `rotateCertificates`: renews the node's client certificate, and makes `api` and every client made
/// from it use each new one. A still valid certificate already in `cert_dir` (from an earlier run) is
/// used at once, as the kubelet does.
pub fn start_client_rotation(api: &ApiClient, node_name: &str, cert_dir: &Path) -> ClientRotation {
    let store = PairStore::new(cert_dir, CLIENT_PREFIX);
    if let Ok(Some(pem)) = store.current()
        && Validity::of_pem(&pem, "client certificate")
            .is_ok_and(|v| v.remaining(SystemTime::now()) > Duration::ZERO)
    {
        api.use_client_certificate(&store.current_path());
    }
    let rotation = Rotation {
        api: api.clone(),
        template: CsrTemplate::client(node_name),
        store,
        target: Target::Client(Box::new(api.clone())),
    };
    ClientRotation {
        task: tokio::spawn(rotation.run()),
    }
}

/// `serverTLSBootstrap`: obtains the serving certificate through a `kubernetes.io/kubelet-serving`
/// request for `template`'s names and renews it, `tls` serving each new one to new connections.
pub fn start_serving_rotation(
    api: &ApiClient,
    tls: &ServingTls,
    template: CsrTemplate,
    cert_dir: &Path,
) -> ServingRotation {
    let rotation = Rotation {
        api: api.clone(),
        template,
        store: PairStore::new(cert_dir, SERVER_PREFIX),
        target: Target::Serving(tls.clone()),
    };
    ServingRotation {
        task: tokio::spawn(rotation.run()),
    }
}
