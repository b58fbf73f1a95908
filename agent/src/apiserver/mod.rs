//! The agent's API-server client: a kube-rs [`kube::Client`] built the way the kubelet builds its
//! clientset (`cmd/kubelet/app/server.go`): from `--kubeconfig` (client certificate, token, token
//! file or exec plugin, as kube supports them), or, for an agent running as a pod, from the pod's
//! service account (`--in-cluster-config`). [`bootstrap`] writes that kubeconfig first when it does
//! not exist yet (TLS bootstrap).
//!
//! `insecure-skip-tls-verify` is refused: the agent sends bearer tokens and `TokenReview` answers
//! over this connection, so it must know whom it talks to. Every error the API server returns is
//! described with the identity the agent presented, so a 401 or 403 in the log says who was refused.

pub mod bootstrap;
mod rotating;
pub mod strategic_merge;
mod watch_error;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use kube::client::ClientBuilder;
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig, KubeconfigError};
use tower::limit::RateLimitLayer;

use self::rotating::{Build, Credentials, Rotating};
use crate::error_chain::error_chain;

/// How long a request may wait for its response (client-go's kubelet clients have no overall
/// timeout, but a stuck API server must never hold a status update forever). Watches end on the
/// server's side well within it (kube's watcher asks for 290 s and reads bookmarks and events in
/// between), so a silent connection this long is a dead one.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the client behaves: its timeout and its client-side rate limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApiClientOptions {
    /// How long a request waits for its answer ([`REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// `kubeAPIQPS` and `kubeAPIBurst` (50 and 100): requests start at most `burst` at a time and
    /// `qps` per second on average; 0 QPS for no limit.
    pub qps: u32,
    pub burst: u32,
}

impl Default for ApiClientOptions {
    fn default() -> Self {
        Self {
            request_timeout: REQUEST_TIMEOUT,
            qps: 50,
            burst: 100,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("reading kubeconfig {path}")]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("kubeconfig {path}")]
    InvalidKubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error(
        "kubeconfig {path}: the token file {token_file} ends with whitespace or a newline, which \
         cannot be sent in an HTTP header; write the token without it"
    )]
    TokenFileWhitespace { path: PathBuf, token_file: String },
    #[error(
        "kubeconfig {path}: insecure-skip-tls-verify is not allowed (the agent must verify the API \
         server it sends tokens to); set certificate-authority instead"
    )]
    InsecureSkipVerify { path: PathBuf },
    #[error(
        "in-cluster configuration (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT and \
         /var/run/secrets/kubernetes.io/serviceaccount/): is the agent running in a pod with a \
         service account token?"
    )]
    InCluster {
        #[source]
        source: kube::config::InClusterError,
    },
    #[error("building the API client for {server}")]
    Client {
        server: String,
        #[source]
        source: kube::Error,
    },
}

/// A cloneable client for one API server, with the identity it presents (for error messages).
#[derive(Clone)]
pub struct ApiClient {
    client: kube::Client,
    /// The same connection settings without the per-request timeout, for watches: they are long
    /// requests, guarded by the watcher's own idle timeout (its watch timeout plus 5 s).
    watch_client: kube::Client,
    /// The configuration both were built from, for clients of their own (the heartbeat's).
    config: Arc<kube::Config>,
    /// The client certificate, shared with the clients of their own, swapped on rotation.
    credentials: Arc<Credentials>,
    identity: Arc<str>,
    server: Arc<str>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("server", &self.server)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// A client from the kubeconfig at `path` (its current context). Must run inside the agent's
    /// tokio runtime: the client starts its connection-pool task there.
    pub async fn from_kubeconfig(
        path: &Path,
        options: ApiClientOptions,
    ) -> Result<Self, ApiServerError> {
        let kubeconfig =
            Kubeconfig::read_from(path).map_err(|source| ApiServerError::ReadKubeconfig {
                path: path.to_owned(),
                source,
            })?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| ApiServerError::InvalidKubeconfig {
                    path: path.to_owned(),
                    source,
                })?;
        if config.accept_invalid_certs {
            return Err(ApiServerError::InsecureSkipVerify {
                path: path.to_owned(),
            });
        }
        // client-go trims a token file; kube sends it as read, so refuse what it would send wrong.
        if let Some(token_file) = &config.auth_info.token_file
            && std::fs::read_to_string(token_file).is_ok_and(|token| token.trim() != token)
        {
            return Err(ApiServerError::TokenFileWhitespace {
                path: path.to_owned(),
                token_file: token_file.clone(),
            });
        }
        let identity = describe_identity(&config.auth_info, Some(path));
        Self::from_config(config, identity, options)
    }

    /// A client from the service account of the pod the agent runs in: the API server's address
    /// from `KUBERNETES_SERVICE_HOST`/`_PORT`, its CA and the (re-read) token from
    /// `/var/run/secrets/kubernetes.io/serviceaccount/`. Must run inside the agent's tokio runtime.
    pub fn in_cluster(options: ApiClientOptions) -> Result<Self, ApiServerError> {
        let config =
            kube::Config::incluster().map_err(|source| ApiServerError::InCluster { source })?;
        let identity = describe_identity(&config.auth_info, None);
        Self::from_config(config, identity, options)
    }

    /// The client for `config` with the agent's timeouts, retries and rate limit.
    pub(crate) fn from_config(
        config: kube::Config,
        identity: String,
        options: ApiClientOptions,
    ) -> Result<Self, ApiServerError> {
        Self::with_credentials(config, identity, options, Arc::default())
    }

    fn with_credentials(
        mut config: kube::Config,
        identity: String,
        options: ApiClientOptions,
        credentials: Arc<Credentials>,
    ) -> Result<Self, ApiServerError> {
        config.connect_timeout = Some(CONNECT_TIMEOUT.min(options.request_timeout));
        config.read_timeout = Some(options.request_timeout);
        config.reset_reader_on_write = true;
        // kube retries a 429/503/504 up to 15 times with backoff up to 1000 s, which would hold a
        // token review or a status update for minutes; every caller here has its own retry period.
        config.default_retry = false;
        let server = config.cluster_url.to_string();
        let build_server = server.clone();
        let build = move |config: kube::Config| {
            let builder =
                ClientBuilder::try_from(config).map_err(|source| ApiServerError::Client {
                    server: build_server.clone(),
                    source,
                })?;
            Ok::<_, ApiServerError>(if options.qps == 0 {
                builder.build()
            } else {
                // client-go's token bucket, as a window of `burst` requests per `burst / qps`
                // seconds: the same average and the same largest burst.
                let burst = options.burst.max(1);
                let window = Duration::from_secs_f64(f64::from(burst) / f64::from(options.qps));
                builder
                    .with_layer(&RateLimitLayer::new(u64::from(burst), window))
                    .build()
            })
        };
        let build: Build = Arc::new(build);
        let rotating = |config: kube::Config| {
            let namespace = config.default_namespace.clone();
            Rotating::new(config, Arc::clone(&credentials), Arc::clone(&build))
                .map(|service| kube::Client::new(service, namespace))
        };
        let mut watch_config = config.clone();
        watch_config.read_timeout = None;
        let watch_client = rotating(watch_config)?;
        let client = rotating(config.clone())?;
        Ok(Self {
            client,
            watch_client,
            config: Arc::new(config),
            credentials,
            identity: identity.into(),
            server: server.trim_end_matches('/').into(),
        })
    }

    /// A client of its own to the same API server with the same credentials, whose requests wait
    /// at most `timeout` and are not rate-limited (the kubelet's `heartbeatClient`): the node's
    /// heartbeat must not queue behind the agent's other requests, nor wait on a slow one.
    pub fn heartbeat_client(&self, timeout: Duration) -> Result<Self, ApiServerError> {
        let options = ApiClientOptions {
            request_timeout: timeout,
            qps: 0,
            burst: 0,
        };
        Self::with_credentials(
            (*self.config).clone(),
            self.identity.to_string(),
            options,
            Arc::clone(&self.credentials),
        )
    }

    /// From now on, new connections of this client and of every client made from it present the
    /// certificate and key in `pem` (certificate rotation); requests in flight finish on theirs.
    pub fn use_client_certificate(&self, pem: &Path) {
        self.credentials.use_client_pem(pem);
    }

    /// The client certificate (PEM) new connections present: the rotated one, else the
    /// kubeconfig's; `None` for token or exec credentials.
    pub fn client_certificate_pem(&self) -> Option<Vec<u8>> {
        match self.credentials.client_pem() {
            Some(path) => std::fs::read(path).ok(),
            None => kubeconfig_certificate(&self.config.auth_info),
        }
    }

    /// A client whose requests go to `client` as it is (tests: a fake API server).
    #[cfg(test)]
    pub(crate) fn with_client(client: kube::Client) -> Self {
        Self {
            watch_client: client.clone(),
            client,
            config: Arc::new(kube::Config::new(http::Uri::from_static("http://fake"))),
            credentials: Arc::default(),
            identity: "the test's client".into(),
            server: "http://fake".into(),
        }
    }

    /// The kube client for requests (cheap to clone).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The kube client for watches.
    pub fn watch_client(&self) -> kube::Client {
        self.watch_client.clone()
    }

    /// The API server's base URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Who the agent is to the API server, as far as the credentials tell: the client certificate's
    /// subject, or where the token comes from.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One line for a failed request: what was asked (`action`, e.g. `patch node/n1 status`), and
    /// why it failed, naming the identity on a 401 or 403.
    pub fn describe(&self, action: &str, err: &kube::Error) -> String {
        describe_failure(action, &self.identity, &self.server, err)
    }
}

fn describe_failure(action: &str, identity: &str, server: &str, err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if status.code == 401 => format!(
            "{action}: the API server {server} did not accept the credentials of {identity} \
             (401 Unauthorized)"
        ),
        kube::Error::Api(status) if status.code == 403 => {
            format!("{action}: forbidden for {identity}: {}", status.message)
        }
        kube::Error::Api(status) => format!(
            "{action}: the API server answered {} {}: {}",
            status.code, status.reason, status.message
        ),
        other => format!(
            "{action}: cannot reach the API server {server}: {}",
            error_chain(other)
        ),
    }
}

/// Whether the request failed because the API server said the object does not exist.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// Whether the request failed because the object already exists.
pub fn is_already_exists(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

/// Whether the request failed on a precondition or a stale resourceVersion (409 Conflict).
pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409 && status.reason != "AlreadyExists")
}

/// The identity a kubeconfig user presents: the client certificate's subject when there is one,
/// else where its token comes from.
fn describe_identity(user: &AuthInfo, kubeconfig: Option<&Path>) -> String {
    let origin = kubeconfig.map_or_else(String::new, |p| format!(" of {}", p.display()));
    if let Some(subject) = certificate_subject(user) {
        return subject;
    }
    if user.token.is_some() {
        return format!("the bearer token{origin}");
    }
    if let Some(file) = &user.token_file {
        return format!("the bearer token in {file}");
    }
    if let Some(exec) = &user.exec {
        return format!(
            "the credentials of exec plugin {}",
            exec.command.as_deref().unwrap_or("(no command)")
        );
    }
    format!("the anonymous user (no credentials{origin})")
}

/// The user's client certificate (PEM), inline or from its file.
fn kubeconfig_certificate(user: &AuthInfo) -> Option<Vec<u8>> {
    match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok(),
        (None, Some(path)) => std::fs::read(path).ok(),
        (None, None) => None,
    }
}

/// `CN=<user>, O=<group>...` of the user's client certificate, as the API server reads it.
fn certificate_subject(user: &AuthInfo) -> Option<String> {
    let pem = kubeconfig_certificate(user)?;
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let certificate = block.parse_x509().ok()?;
    let subject = certificate.subject();
    let names: Vec<String> = subject
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .map(|cn| format!("user {cn:?}"))
        .chain(
            subject
                .iter_organization()
                .filter_map(|o| o.as_str().ok())
                .map(|o| format!("group {o:?}")),
        )
        .collect();
    (!names.is_empty()).then(|| format!("the client certificate of {}", names.join(", ")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.to_owned(),
            message: message.to_owned(),
            ..kube::core::Status::default()
        }))
    }

    #[test]
    fn refusals_name_the_identity_and_the_action() {
        let unauthorized = describe_failure(
            "get node/n1",
            "the client certificate of user \"system:node:n1\"",
            "https://127.0.0.1:6443",
            &api_error(401, "Unauthorized", "Unauthorized"),
        );
        assert_eq!(
            unauthorized,
            "get node/n1: the API server https://127.0.0.1:6443 did not accept the credentials of \
             the client certificate of user \"system:node:n1\" (401 Unauthorized)"
        );
        let forbidden = describe_failure(
            "patch pod/default/web status",
            "the bearer token",
            "https://x",
            &api_error(
                403,
                "Forbidden",
                "pods \"web\" is forbidden: User \"a\" cannot patch",
            ),
        );
        assert!(
            forbidden.starts_with(
                "patch pod/default/web status: forbidden for the bearer token: pods \"web\""
            ),
            "{forbidden}"
        );
        let invalid = describe_failure(
            "create pod",
            "x",
            "https://x",
            &api_error(422, "Invalid", "spec.x: bad"),
        );
        assert_eq!(
            invalid,
            "create pod: the API server answered 422 Invalid: spec.x: bad"
        );
    }

    #[test]
    fn error_kinds_are_told_apart() {
        assert!(is_not_found(&api_error(404, "NotFound", "")));
        assert!(is_already_exists(&api_error(409, "AlreadyExists", "")));
        assert!(!is_conflict(&api_error(409, "AlreadyExists", "")));
        assert!(is_conflict(&api_error(409, "Conflict", "")));
        assert!(!is_not_found(&api_error(403, "Forbidden", "")));
    }

    #[test]
    fn identity_comes_from_the_certificate_subject() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let certificate = params.self_signed(&key).unwrap();
        let user = AuthInfo {
            client_certificate_data: Some(
                base64::engine::general_purpose::STANDARD.encode(certificate.pem()),
            ),
            ..AuthInfo::default()
        };
        assert_eq!(
            describe_identity(&user, None),
            "the client certificate of user \"system:node:n1\", group \"system:nodes\""
        );
        let token_file = AuthInfo {
            token_file: Some("/var/run/token".to_owned()),
            ..AuthInfo::default()
        };
        assert_eq!(
            describe_identity(&token_file, None),
            "the bearer token in /var/run/token"
        );
        assert_eq!(
            describe_identity(&AuthInfo::default(), Some(Path::new("/k"))),
            "the anonymous user (no credentials of /k)"
        );
    }
}
