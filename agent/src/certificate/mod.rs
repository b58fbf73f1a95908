//! Certificate rotation (`pkg/kubelet/certificate` with client-go's `util/certificate` manager): the
//! node's client certificate (`rotateCertificates`) and, with `serverTLSBootstrap`, its serving
//! certificate are renewed through `CertificateSigningRequest`s at a random point in 70–90 % of their
//! lifetime, written to `--cert-dir` as `kubelet-{client,server}-<time>.pem` behind a `-current.pem`
//! link, and handed to their user (the API client, the kubelet API's TLS) without a restart.

pub mod csr;
pub mod deadline;
pub mod manager;
pub mod store;

use std::path::PathBuf;
use std::time::Duration;

pub use manager::{ClientRotation, ServingRotation, start_client_rotation, start_serving_rotation};

/// The signer of kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of kubelet serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating the key or certificate request")]
    Key(#[source] rcgen::Error),
    #[error("{0}")]
    Request(String),
    #[error("certificate signing request {name} was denied: {message}")]
    Denied { name: String, message: String },
    #[error("certificate signing request {name} failed: {message}")]
    Failed { name: String, message: String },
    #[error("certificate signing request {name} was not issued within {timeout:?}")]
    Timeout { name: String, timeout: Duration },
    #[error("{what} holds no PEM certificate that can be parsed")]
    Parse { what: String },
}
