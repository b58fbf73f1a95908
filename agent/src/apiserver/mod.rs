//! A small HTTPS client for the Kubernetes API server, built from a kubeconfig (the part of client-go's
//! `rest.Config` + `clientcmd` the kubelet's auth webhooks need): JSON `POST`s of review objects.
//!
//! TLS is rustls with the ring provider; the server certificate must chain to the kubeconfig's
//! certificate authority (system roots are never used). Every request has a timeout.

mod kubeconfig;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use serde::de::DeserializeOwned;

use kubeconfig::Credentials;

/// How long one request may take, connection and TLS handshake included (client-go's webhook
/// default is 10 s too).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Error bodies are quoted in messages only up to this many bytes.
const MAX_QUOTED_BODY: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("reading kubeconfig {path}")]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing kubeconfig {path}")]
    ParseKubeconfig {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("kubeconfig {path}: {reason}")]
    InvalidKubeconfig { path: PathBuf, reason: String },
    #[error("kubeconfig {path}: decoding {field}-data as base64")]
    Base64 {
        path: PathBuf,
        field: &'static str,
        #[source]
        source: base64::DecodeError,
    },
    #[error("reading {field} file {path} named by the kubeconfig")]
    ReadReferencedFile {
        field: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing the PEM {what} from the kubeconfig")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("the kubeconfig's {what} contains no PEM block of the expected kind")]
    EmptyPem { what: &'static str },
    #[error("adding the kubeconfig's certificate authority to the trust store")]
    TrustStore {
        #[source]
        source: rustls::Error,
    },
    #[error("building the TLS client configuration")]
    Tls {
        #[source]
        source: rustls::Error,
    },
    #[error("reading the bearer token file {path}")]
    ReadToken {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the bearer token is not a valid HTTP header value")]
    InvalidToken,
    #[error("encoding the request body for POST {url}")]
    Encode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("building the request POST {url}")]
    BuildRequest {
        url: String,
        #[source]
        source: http::Error,
    },
    #[error("POST {url} failed")]
    Send {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("POST {url} got no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("reading the response body of POST {url}")]
    ReadBody {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("POST {url} answered {status}: {message}")]
    Status {
        url: String,
        status: StatusCode,
        message: String,
    },
    #[error("decoding the response body of POST {url} ({status})")]
    Decode {
        url: String,
        status: StatusCode,
        #[source]
        source: serde_json::Error,
    },
}

/// A cloneable client for one API server (the kubeconfig's current context).
#[derive(Clone)]
pub struct ApiServerClient {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    server: String,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    token: TokenSource,
    timeout: Duration,
}

#[derive(Clone)]
enum TokenSource {
    None,
    Fixed(HeaderValue),
    File(PathBuf),
}

impl std::fmt::Debug for ApiServerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("ApiServerClient")
            .field("server", &self.inner.server)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl ApiServerClient {
    /// Builds a client from the kubeconfig at `path` (its `current-context`).
    pub fn from_kubeconfig(path: &Path) -> Result<Self, ApiServerError> {
        let resolved = kubeconfig::load(path)?;

        let mut roots = RootCertStore::empty();
        let cas = parse_certificates(&resolved.certificate_authority, "certificate authority")?;
        for ca in cas {
            roots
                .add(ca)
                .map_err(|source| ApiServerError::TrustStore { source })?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|source| ApiServerError::Tls { source })?
        .with_root_certificates(roots);

        let (tls, token) = match resolved.credentials {
            Credentials::ClientCertificate { chain, key } => {
                let chain = parse_certificates(&chain, "client certificate")?;
                let key =
                    PrivateKeyDer::from_pem_slice(&key).map_err(|source| ApiServerError::Pem {
                        what: "client key",
                        source,
                    })?;
                let tls = builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|source| ApiServerError::Tls { source })?;
                (tls, TokenSource::None)
            }
            Credentials::Token(token) => (
                builder.with_no_client_auth(),
                bearer(&token).map(TokenSource::Fixed)?,
            ),
            Credentials::TokenFile(path) => {
                (builder.with_no_client_auth(), TokenSource::File(path))
            }
            Credentials::None => (builder.with_no_client_auth(), TokenSource::None),
        };

        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            inner: Arc::new(Inner {
                server: resolved.server,
                client,
                token,
                timeout: DEFAULT_TIMEOUT,
            }),
        })
    }

    /// The same client with another per-request timeout.
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        inner.timeout = timeout;
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The API server's base URL (no trailing slash).
    pub fn server(&self) -> &str {
        &self.inner.server
    }

    /// `POST`s `body` as JSON to `api_path` (e.g. `/apis/authentication.k8s.io/v1/tokenreviews`) and
    /// decodes the 2xx answer. Non-2xx answers become [`ApiServerError::Status`] with the message of
    /// the `Status` object the API server sends.
    pub async fn create<T: Serialize, R: DeserializeOwned>(
        &self,
        api_path: &str,
        body: &T,
    ) -> Result<R, ApiServerError> {
        let url = format!("{}{api_path}", self.inner.server);
        let timeout = self.inner.timeout;
        match tokio::time::timeout(timeout, self.post(&url, body)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(ApiServerError::Timeout { url, timeout }),
        }
    }

    async fn post<T: Serialize, R: DeserializeOwned>(
        &self,
        url: &str,
        body: &T,
    ) -> Result<R, ApiServerError> {
        let json = serde_json::to_vec(body).map_err(|source| ApiServerError::Encode {
            url: url.to_owned(),
            source,
        })?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json");
        if let Some(token) = self.token().await? {
            request = request.header(AUTHORIZATION, token);
        }
        let request = request
            .body(Full::new(Bytes::from(json)))
            .map_err(|source| ApiServerError::BuildRequest {
                url: url.to_owned(),
                source,
            })?;
        let response =
            self.inner
                .client
                .request(request)
                .await
                .map_err(|source| ApiServerError::Send {
                    url: url.to_owned(),
                    source,
                })?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|source| ApiServerError::ReadBody {
                url: url.to_owned(),
                source,
            })?
            .to_bytes();
        if !status.is_success() {
            return Err(ApiServerError::Status {
                url: url.to_owned(),
                status,
                message: status_message(&bytes),
            });
        }
        serde_json::from_slice(&bytes).map_err(|source| ApiServerError::Decode {
            url: url.to_owned(),
            status,
            source,
        })
    }

    async fn token(&self) -> Result<Option<HeaderValue>, ApiServerError> {
        match &self.inner.token {
            TokenSource::None => Ok(None),
            TokenSource::Fixed(value) => Ok(Some(value.clone())),
            TokenSource::File(path) => {
                let token = tokio::fs::read_to_string(path).await.map_err(|source| {
                    ApiServerError::ReadToken {
                        path: path.clone(),
                        source,
                    }
                })?;
                bearer(token.trim()).map(Some)
            }
        }
    }
}

fn bearer(token: &str) -> Result<HeaderValue, ApiServerError> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| ApiServerError::InvalidToken)?;
    value.set_sensitive(true);
    Ok(value)
}

fn parse_certificates(
    pem: &[u8],
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, ApiServerError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ApiServerError::Pem { what, source })?;
    if certificates.is_empty() {
        return Err(ApiServerError::EmptyPem { what });
    }
    Ok(certificates)
}

/// The `message` of a `Status` body, or the start of whatever else the server sent.
fn status_message(body: &[u8]) -> String {
    if let Ok(Status {
        message: Some(message),
        ..
    }) = serde_json::from_slice::<Status>(body)
    {
        return message;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    let mut end = text.len().min(MAX_QUOTED_BODY);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_message_prefers_the_status_object() {
        let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"tokenreviews is forbidden","code":403}"#;
        assert_eq!(status_message(body), "tokenreviews is forbidden");
        assert_eq!(status_message(b"  upstream down\n"), "upstream down");
        assert_eq!(status_message(b""), "(empty body)");
        let long = "é".repeat(MAX_QUOTED_BODY);
        assert!(status_message(long.as_bytes()).len() <= MAX_QUOTED_BODY);
    }
}
