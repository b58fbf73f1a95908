//! TLS for the kubelet API port (10250): the serving certificate (supplied files, or a self-signed pair
//! generated into the certificate directory like the kubelet's `--cert-dir`), `tlsMinVersion`,
//! `tlsCipherSuites`, client certificates checked against `authentication.x509.clientCAFile`, and
//! rotation of those files without a restart. It corresponds to the TLS half of the kubelet's
//! `cmd/kubelet/app.InitializeTLS` plus the serving-certificate handling of `pkg/kubelet/certificate`:
//! with `serverTLSBootstrap` the certificate is `<cert-dir>/kubelet-server-current.pem`, issued
//! through a `kubelet-serving` request ([`crate::certificate`]), and handshakes fail until there is one.

pub(crate) mod handshake;
mod pki;
mod reload;

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::crypto::ring::{cipher_suite, default_provider};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use tokio_rustls::TlsAcceptor;

pub(crate) use reload::Watching;

/// What the API listener's TLS is built from: the kubelet's `tlsCertFile`, `tlsPrivateKeyFile`,
/// `--cert-dir`, `tlsMinVersion`, `tlsCipherSuites` and `authentication.x509.clientCAFile`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `tlsCertFile`: PEM certificate, leaf first, intermediates may follow.
    pub cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile`: PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC) of `cert_file`.
    pub private_key_file: Option<PathBuf>,
    /// `--cert-dir` (`<root-dir>/pki`): where the self-signed pair is kept when no files are given.
    pub cert_dir: PathBuf,
    /// The node name, put into the self-signed certificate.
    pub node_name: String,
    /// The node's addresses, put into the self-signed certificate next to the loopback addresses.
    pub addresses: Vec<IpAddr>,
    /// `tlsMinVersion`: `VersionTLS12` or `VersionTLS13`; `None` allows TLS 1.2 and 1.3.
    pub min_version: Option<String>,
    /// `tlsCipherSuites`: Go/IANA names of the TLS 1.2 suites to allow; empty allows rustls's defaults.
    /// TLS 1.3 suites are always on, as in Go, and their names are accepted and ignored.
    pub cipher_suites: Vec<String>,
    /// `authentication.x509.clientCAFile`: CA bundle that client certificates are verified against.
    pub client_ca_file: Option<PathBuf>,
    /// `serverTLSBootstrap`: serve the certificate the certificate manager obtains for the node
    /// instead of `cert_file` or a self-signed one.
    pub server_tls_bootstrap: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tlsCertFile {cert_file} is set but tlsPrivateKeyFile is not; set both or neither")]
    CertWithoutKey { cert_file: PathBuf },
    #[error("tlsPrivateKeyFile {key_file} is set but tlsCertFile is not; set both or neither")]
    KeyWithoutCert { key_file: PathBuf },
    #[error("reading {what} {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} {path} is not valid PEM")]
    Pem {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{what} {path} holds no PEM CERTIFICATE block")]
    NoCertificates { what: &'static str, path: PathBuf },
    #[error(
        "private key file {path} holds no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
    )]
    NoPrivateKey { path: PathBuf },
    #[error("{what} {path} holds a certificate that cannot be used")]
    InvalidCertificate {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("private key in {path} cannot be used")]
    UnusableKey {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("private key {key_file} does not match the certificate {cert_file}")]
    KeyMismatch {
        cert_file: PathBuf,
        key_file: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("client CA file {path} cannot be used to verify client certificates")]
    ClientCa {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    #[error("generating a self-signed serving certificate for {node_name}")]
    Generate {
        node_name: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "tlsMinVersion {name} is not supported: rustls implements only TLS 1.2 and 1.3 (use VersionTLS12 or VersionTLS13)"
    )]
    UnsupportedMinVersion { name: String },
    #[error(
        "unknown tlsMinVersion {name:?}; valid values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
    )]
    UnknownMinVersion { name: String },
    #[error("unsupported tlsCipherSuites: {}; supported: {}", names.join(", "), supported_suite_names())]
    UnsupportedCipherSuites { names: Vec<String> },
    #[error("building the TLS server configuration")]
    Config {
        #[source]
        source: rustls::Error,
    },
}

/// Go's names for the TLS 1.2 suites the ring provider implements (both spellings Go accepts for the
/// `ChaCha20` suites), mapped to rustls's suites.
static TLS12_SUITES: [(&str, &SupportedCipherSuite); 8] = [
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        &cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        &cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        &cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        &cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        &cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        &cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        &cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        &cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// The TLS 1.3 suites (Go's names), which are always enabled.
static TLS13_SUITES: [(&str, &SupportedCipherSuite); 3] = [
    (
        "TLS_AES_128_GCM_SHA256",
        &cipher_suite::TLS13_AES_128_GCM_SHA256,
    ),
    (
        "TLS_AES_256_GCM_SHA384",
        &cipher_suite::TLS13_AES_256_GCM_SHA384,
    ),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        &cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
];

fn supported_suite_names() -> String {
    TLS12_SUITES
        .iter()
        .chain(&TLS13_SUITES)
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The protocol versions allowed by a `tlsMinVersion` value.
fn protocol_versions(
    min_version: Option<&str>,
) -> Result<&'static [&'static SupportedProtocolVersion], TlsError> {
    static TLS12_AND_13: &[&SupportedProtocolVersion] =
        &[&rustls::version::TLS13, &rustls::version::TLS12];
    static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
    match min_version {
        None | Some("" | "VersionTLS12") => Ok(TLS12_AND_13),
        Some("VersionTLS13") => Ok(TLS13_ONLY),
        Some(name @ ("VersionTLS10" | "VersionTLS11")) => Err(TlsError::UnsupportedMinVersion {
            name: name.to_owned(),
        }),
        Some(name) => Err(TlsError::UnknownMinVersion {
            name: name.to_owned(),
        }),
    }
}

/// The ring provider restricted to the named TLS 1.2 suites (all TLS 1.3 suites stay on).
fn crypto_provider(names: &[String]) -> Result<CryptoProvider, TlsError> {
    let mut provider = default_provider();
    if names.is_empty() {
        return Ok(provider);
    }
    let mut tls12 = Vec::new();
    let mut unsupported = Vec::new();
    for name in names {
        let name = name.trim();
        if TLS13_SUITES.iter().any(|(known, _)| *known == name) {
            continue;
        }
        match TLS12_SUITES.iter().find(|(known, _)| *known == name) {
            Some((_, suite)) => {
                if !tls12
                    .iter()
                    .any(|chosen: &SupportedCipherSuite| chosen.suite() == suite.suite())
                {
                    tls12.push(**suite);
                }
            }
            None => unsupported.push(name.to_owned()),
        }
    }
    if !unsupported.is_empty() {
        return Err(TlsError::UnsupportedCipherSuites { names: unsupported });
    }
    provider.cipher_suites = TLS13_SUITES
        .iter()
        .map(|(_, suite)| **suite)
        .chain(tls12)
        .collect();
    Ok(provider)
}

/// The serving certificate new handshakes get; swapped when the files on disk change. `None` only
/// while a bootstrapped serving certificate has not been issued yet.
struct CurrentCert(RwLock<Option<Arc<CertifiedKey>>>);

impl CurrentCert {
    fn get(&self) -> Option<Arc<CertifiedKey>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(key);
    }
}

impl fmt::Debug for CurrentCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CurrentCert").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.get();
        if current.is_none() {
            tracing::debug!("no serving certificate available for the kubelet yet");
        }
        current
    }
}

/// The files the serving TLS is read from, watched for rotation.
#[derive(Clone, Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

struct Shared {
    files: Files,
    provider: Arc<CryptoProvider>,
    versions: &'static [&'static SupportedProtocolVersion],
    cert: Arc<CurrentCert>,
    /// Rebuilt only when the client CA changes; certificate changes go through `cert`.
    config: RwLock<Arc<ServerConfig>>,
    /// The files as they were when first loaded, the rotation watcher's starting point.
    initial: reload::Seen,
}

/// The API listener's TLS state: the current server configuration and the files it came from.
/// Cheap to clone; clones share the state, so a reload is seen by every listener holding one.
#[derive(Clone)]
pub struct ServingTls {
    shared: Arc<Shared>,
}

impl fmt::Debug for ServingTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingTls")
            .field("files", &self.shared.files)
            .field("versions", &self.shared.versions)
            .finish_non_exhaustive()
    }
}

impl ServingTls {
    /// Validates the settings and loads (or generates) the serving certificate and the client CA.
    /// Blocking file I/O; meant for startup.
    pub fn load(settings: &TlsSettings) -> Result<Self, TlsError> {
        let versions = protocol_versions(settings.min_version.as_deref())?;
        let provider = Arc::new(crypto_provider(&settings.cipher_suites)?);
        let (cert_file, key_file) = match (&settings.cert_file, &settings.private_key_file) {
            _ if settings.server_tls_bootstrap => {
                let current = crate::certificate::store::PairStore::new(
                    &settings.cert_dir,
                    crate::certificate::store::SERVER_PREFIX,
                )
                .current_path();
                (current.clone(), current)
            }
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (Some(cert), None) => {
                return Err(TlsError::CertWithoutKey {
                    cert_file: cert.clone(),
                });
            }
            (None, Some(key)) => {
                return Err(TlsError::KeyWithoutCert {
                    key_file: key.clone(),
                });
            }
            (None, None) => pki::ensure_self_signed(
                &settings.cert_dir,
                &settings.node_name,
                &settings.addresses,
                &provider,
            )?,
        };
        let files = Files {
            cert: cert_file,
            key: key_file,
            client_ca: settings.client_ca_file.clone(),
        };
        let initial = reload::Seen::of(&files);
        let certified = match pki::load_pair(&files.cert, &files.key, &provider) {
            Ok(certified) => {
                tracing::info!(cert = %files.cert.display(), key = %files.key.display(), "loaded the serving certificate");
                Some(Arc::new(certified))
            }
            // The bootstrapped certificate may not be there yet, or have gone bad: a new one is
            // requested, and served when it comes.
            Err(error) if settings.server_tls_bootstrap => {
                tracing::info!(
                    cert = %files.cert.display(),
                    reason = %crate::error_chain::error_chain(&error),
                    "no serving certificate yet: TLS handshakes fail until one is issued (serverTLSBootstrap)"
                );
                None
            }
            Err(error) => return Err(error),
        };
        let cert = Arc::new(CurrentCert(RwLock::new(certified)));
        let config = build_config(&files, &provider, versions, &cert)?;
        Ok(Self {
            shared: Arc::new(Shared {
                files,
                provider,
                versions,
                cert,
                config: RwLock::new(Arc::new(config)),
                initial,
            }),
        })
    }

    /// The certificate file being served (the supplied one or `<cert-dir>/kubelet.crt`).
    pub fn cert_file(&self) -> &Path {
        &self.shared.files.cert
    }

    /// The private key file being served.
    pub fn key_file(&self) -> &Path {
        &self.shared.files.key
    }

    /// An acceptor for one new connection, with the configuration current at this moment.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(
            &self
                .shared
                .config
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        ))
    }

    /// Starts following the files for changes; stops when the returned guard is dropped.
    pub(crate) fn watch(&self) -> Watching {
        reload::watch(self.clone())
    }

    /// Serves the pair now in the certificate files to new connections (the certificate manager
    /// calls this after writing a new one; the file watch would see it too, a little later).
    pub(crate) fn reload_certificate(&self) -> Result<(), TlsError> {
        self.reload_pair()
    }

    fn reload_pair(&self) -> Result<(), TlsError> {
        let files = &self.shared.files;
        let certified = pki::load_pair(&files.cert, &files.key, &self.shared.provider)?;
        self.shared.cert.set(Arc::new(certified));
        Ok(())
    }

    fn reload_client_ca(&self) -> Result<(), TlsError> {
        let shared = &self.shared;
        let config = build_config(
            &shared.files,
            &shared.provider,
            shared.versions,
            &shared.cert,
        )?;
        *shared
            .config
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
        Ok(())
    }
}

fn build_config(
    files: &Files,
    provider: &Arc<CryptoProvider>,
    versions: &'static [&'static SupportedProtocolVersion],
    cert: &Arc<CurrentCert>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_protocol_versions(versions)
        .map_err(|source| TlsError::Config { source })?;
    let verifier = match &files.client_ca {
        None => WebPkiClientVerifier::no_client_auth(),
        Some(path) => {
            let roots = pki::load_client_ca(path)?;
            // A client without a certificate still gets through the handshake: bearer tokens and
            // anonymous requests are decided by the authentication layer, as in the kubelet.
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
                .allow_unauthenticated()
                .build()
                .map_err(|source| TlsError::ClientCa {
                    path: path.clone(),
                    source,
                })?
        }
    };
    let mut config = builder
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::clone(cert) as Arc<dyn ResolvesServerCert>);
    // HTTP/1.1 only: exec/attach/port-forward need the HTTP/1.1 upgrade.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests;
