//! Client credentials that change under a running agent (client-go's `transport` with the kubelet's
//! certificate manager, `pkg/kubelet/certificate/transport.go`): every [`kube::Client`] the agent
//! hands out sends through a [`Rotating`] service, which keeps one inner client built from the
//! kubeconfig and builds a new one, with the new client certificate, the first time a request
//! comes after a rotation. Requests from then on open new connections with the new certificate;
//! the old client, its connection pool and its connections go away once its last request (a watch,
//! say) ends, so nothing in flight fails and every clone of every client moves over at once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;

use super::ApiServerError;
use crate::error_chain::error_chain;

/// The client certificate the clients built from one kubeconfig present, shared by all of them (the
/// heartbeat's too).
#[derive(Debug, Default)]
pub(crate) struct Credentials {
    state: RwLock<CredentialState>,
}

#[derive(Clone, Debug, Default)]
struct CredentialState {
    /// Bumped on each rotation.
    generation: u64,
    /// The certificate and key (one PEM file) replacing the kubeconfig's, once rotated.
    client_pem: Option<PathBuf>,
}

impl Credentials {
    /// From now on, new connections present the certificate and key in `pem` (re-read at each call,
    /// so pointing at `kubelet-client-current.pem` again after it was swapped works).
    pub(crate) fn use_client_pem(&self, pem: &Path) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.generation += 1;
        state.client_pem = Some(pem.to_owned());
    }

    /// The rotated certificate's file, if any.
    pub(crate) fn client_pem(&self) -> Option<PathBuf> {
        self.snapshot().client_pem
    }

    fn snapshot(&self) -> CredentialState {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// How an inner client is built from a configuration.
pub(crate) type Build =
    Arc<dyn Fn(kube::Config) -> Result<kube::Client, ApiServerError> + Send + Sync>;

/// See the module docs.
#[derive(Clone)]
pub(crate) struct Rotating {
    slot: Arc<Slot>,
}

struct Slot {
    credentials: Arc<Credentials>,
    config: kube::Config,
    build: Build,
    /// The inner client and the credential generation it was built for.
    current: RwLock<(u64, kube::Client)>,
}

impl Rotating {
    /// Builds the first inner client from `config` (with the rotated certificate if there is one
    /// already).
    pub(crate) fn new(
        config: kube::Config,
        credentials: Arc<Credentials>,
        build: Build,
    ) -> Result<Self, ApiServerError> {
        let state = credentials.snapshot();
        let client = build(with_certificate(
            config.clone(),
            state.client_pem.as_deref(),
        ))?;
        Ok(Self {
            slot: Arc::new(Slot {
                credentials,
                config,
                build,
                current: RwLock::new((state.generation, client)),
            }),
        })
    }

    /// The inner client for the next request: rebuilt when the credentials changed since.
    fn client(&self) -> kube::Client {
        let slot = &self.slot;
        let state = slot.credentials.snapshot();
        {
            let current = slot.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.0 == state.generation {
                return current.1.clone();
            }
        }
        let mut current = slot.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.0 != state.generation {
            let config = with_certificate(slot.config.clone(), state.client_pem.as_deref());
            match (slot.build)(config) {
                Ok(client) => current.1 = client,
                // Not retried before the next rotation: the old certificate keeps working until then.
                Err(error) => tracing::warn!(
                    error = %error_chain(&error),
                    "cannot use the rotated client certificate; new requests keep the previous one"
                ),
            }
            current.0 = state.generation;
        }
        current.1.clone()
    }
}

/// `config` presenting the certificate and key in `pem` instead of the kubeconfig's own.
fn with_certificate(mut config: kube::Config, pem: Option<&Path>) -> kube::Config {
    if let Some(pem) = pem {
        let path = pem.display().to_string();
        let user = &mut config.auth_info;
        user.client_certificate_data = None;
        user.client_key_data = None;
        user.client_certificate = Some(path.clone());
        user.client_key = Some(path);
    }
    config
}

impl tower::Service<Request<Body>> for Rotating {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner client buffers; readiness is its business.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client();
        Box::pin(async move { client.send(request).await })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Inner clients that answer every request with the certificate file they were built with.
    fn build_counting(builds: &Arc<AtomicUsize>) -> Build {
        let builds = Arc::clone(builds);
        Arc::new(move |config: kube::Config| {
            builds.fetch_add(1, Ordering::SeqCst);
            let presented = config
                .auth_info
                .client_certificate
                .unwrap_or_else(|| "the kubeconfig's".to_owned());
            let service = tower::service_fn(move |_: Request<Body>| {
                let presented = presented.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(Response::new(Body::from(
                        presented.into_bytes(),
                    )))
                }
            });
            Ok(kube::Client::new(service, "default"))
        })
    }

    async fn presented(client: &kube::Client) -> String {
        client
            .request_text(Request::get("/api").body(Vec::new()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn every_clone_moves_to_the_rotated_certificate_with_one_rebuild() {
        let builds = Arc::new(AtomicUsize::new(0));
        let credentials = Arc::new(Credentials::default());
        let mut config = kube::Config::new(http::Uri::from_static("https://api:6443"));
        config.auth_info.client_certificate_data = Some("aW5saW5l".to_owned());
        let rotating =
            Rotating::new(config, Arc::clone(&credentials), build_counting(&builds)).unwrap();
        let client = kube::Client::new(rotating, "default");
        let clone = client.clone();
        assert_eq!(presented(&client).await, "the kubeconfig's");
        assert_eq!(builds.load(Ordering::SeqCst), 1);

        credentials.use_client_pem(Path::new("/pki/kubelet-client-current.pem"));
        assert_eq!(presented(&clone).await, "/pki/kubelet-client-current.pem");
        assert_eq!(presented(&client).await, "/pki/kubelet-client-current.pem");
        assert_eq!(
            builds.load(Ordering::SeqCst),
            2,
            "rebuilt once per rotation"
        );

        // The same link again after it was swapped: the file is read anew.
        credentials.use_client_pem(Path::new("/pki/kubelet-client-current.pem"));
        assert_eq!(presented(&client).await, "/pki/kubelet-client-current.pem");
        assert_eq!(builds.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_client_made_after_a_rotation_starts_with_the_rotated_certificate() {
        let builds = Arc::new(AtomicUsize::new(0));
        let credentials = Arc::new(Credentials::default());
        credentials.use_client_pem(Path::new("/pki/new.pem"));
        let config = kube::Config::new(http::Uri::from_static("https://api:6443"));
        let rotating = Rotating::new(config, credentials, build_counting(&builds)).unwrap();
        let client = kube::Client::new(rotating, "default");
        assert_eq!(presented(&client).await, "/pki/new.pem");
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_rotated_pair_replaces_inline_credentials() {
        let mut config = kube::Config::new(http::Uri::from_static("https://api:6443"));
        config.auth_info.client_certificate_data = Some("Y2VydA==".to_owned());
        config.auth_info.client_key_data = Some("a2V5".to_owned().into());
        let config = with_certificate(config, Some(Path::new("/pki/current.pem")));
        let user = &config.auth_info;
        assert!(user.client_certificate_data.is_none());
        assert!(user.client_key_data.is_none());
        assert_eq!(user.client_certificate.as_deref(), Some("/pki/current.pem"));
        assert_eq!(user.client_key.as_deref(), Some("/pki/current.pem"));
    }
}
