#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HOST, UPGRADE};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::ring::cipher_suite as suite;
use rustls::{CipherSuite, ClientConfig, ProtocolVersion, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

use super::*;
use crate::io::testing::on_both_engines;
use crate::io::{IoEngine, spawn_connection};
use crate::metrics::Metrics;
use crate::server::fake_host::FakeHost;
use crate::server::listener::{self, Handler, Plain, ServeLimits};
use crate::server::router::{Router, full};
use crate::server::routes::Endpoints;
use crate::server::{PeerCertificates, ServerError, bind};

fn router(engine: IoEngine) -> Router {
    Router::new(Arc::new(FakeHost::new()), Endpoints::ReadOnly, engine)
}

/// Answers with the DER of the client's certificate, or 204 when it sent none; echoes upgraded
/// connections back, to show the TLS listener hands upgrades through.
fn peer_echo() -> impl Handler {
    service_fn(|mut request: Request<Incoming>| async move {
        if request.headers().contains_key(UPGRADE) {
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                let mut io = TokioIo::new(upgrade.await.unwrap());
                let mut buf = [0; 64];
                let n = io.read(&mut buf).await.unwrap();
                io.write_all(&buf[..n]).await.unwrap();
                io.shutdown().await.unwrap();
            });
            let mut response = Response::new(full(Bytes::new()));
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            response
                .headers_mut()
                .insert(UPGRADE, "echo".parse().unwrap());
            response
                .headers_mut()
                .insert(CONNECTION, "upgrade".parse().unwrap());
            return Ok::<_, Infallible>(response);
        }
        let peer = request.extensions().get::<PeerCertificates>();
        let mut response = Response::new(full(
            peer.map(|peer| peer.leaf().unwrap().to_vec())
                .unwrap_or_default(),
        ));
        if peer.is_none() {
            *response.status_mut() = StatusCode::NO_CONTENT;
        }
        Ok(response)
    })
}

// ---- certificates made by the tests ----

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca {
        issuer: Issuer::new(params, key),
        pem,
    }
}

struct Pair {
    /// Leaf then CA, as a serving certificate file.
    cert_pem: String,
    key_pem: String,
    leaf: CertificateDer<'static>,
}

impl Pair {
    fn chain(&self) -> Vec<CertificateDer<'static>> {
        vec![self.leaf.clone()]
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap()
    }

    fn write(&self, dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        fs::write(&cert, &self.cert_pem).unwrap();
        fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

fn issue(ca: &Ca, name: &str, purpose: ExtendedKeyUsagePurpose) -> Pair {
    let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![purpose];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    Pair {
        cert_pem: cert.pem() + &ca.pem,
        key_pem: key.serialize_pem(),
        leaf: cert.der().clone(),
    }
}

fn server_pair(ca: &Ca) -> Pair {
    issue(ca, "localhost", ExtendedKeyUsagePurpose::ServerAuth)
}

fn client_pair(ca: &Ca) -> Pair {
    issue(
        ca,
        "system:node:client",
        ExtendedKeyUsagePurpose::ClientAuth,
    )
}

fn settings(dir: &Path) -> TlsSettings {
    TlsSettings {
        cert_dir: dir.join("pki"),
        node_name: "node-a".to_owned(),
        addresses: vec!["10.1.2.3".parse().unwrap()],
        ..TlsSettings::default()
    }
}

fn with_files(dir: &Path, pair: &Pair) -> TlsSettings {
    let (cert, key) = pair.write(dir);
    TlsSettings {
        cert_file: Some(cert),
        private_key_file: Some(key),
        ..settings(dir)
    }
}

// ---- the client side ----

fn roots(pems: &[&str]) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for pem in pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    roots
}

struct Client {
    roots: RootCertStore,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    versions: Vec<&'static rustls::SupportedProtocolVersion>,
    suites: Vec<rustls::SupportedCipherSuite>,
}

impl Client {
    fn trusting(pems: &[&str]) -> Self {
        Self {
            roots: roots(pems),
            identity: None,
            versions: vec![&rustls::version::TLS13, &rustls::version::TLS12],
            suites: Vec::new(),
        }
    }

    fn with_identity(mut self, pair: &Pair) -> Self {
        self.identity = Some((pair.chain(), pair.key()));
        self
    }

    fn config(&self) -> Arc<ClientConfig> {
        let mut provider = rustls::crypto::ring::default_provider();
        if !self.suites.is_empty() {
            provider.cipher_suites.clone_from(&self.suites);
        }
        let provider = Arc::new(provider);
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::new(self.roots.clone()),
            provider.clone(),
        )
        .build()
        .unwrap();
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&self.versions)
            .unwrap()
            .with_webpki_verifier(verifier);
        let mut config = match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Bytes,
    server_leaf: CertificateDer<'static>,
    alpn: Option<Vec<u8>>,
    suite: CipherSuite,
    version: ProtocolVersion,
}

async fn tls_connect(
    addr: SocketAddr,
    client: &Client,
    name: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(client.config())
        .connect(ServerName::try_from(name.to_owned()).unwrap(), tcp)
        .await
        .map_err(|error| format!("handshake: {error}"))
}

async fn fetch(
    addr: SocketAddr,
    client: &Client,
    name: &str,
    path: &str,
) -> Result<Answer, String> {
    let stream = tls_connect(addr, client, name).await?;
    let connection = stream.get_ref().1;
    let server_leaf = connection.peer_certificates().unwrap()[0].clone();
    let alpn = connection.alpn_protocol().map(<[u8]>::to_vec);
    let suite = connection.negotiated_cipher_suite().unwrap().suite();
    let version = connection.protocol_version().unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| format!("http handshake: {error}"))?;
    tokio::spawn(connection);
    let request = Request::get(path)
        .header(HOST, name)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("request: {}", crate::error_chain::error_chain(&error)))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| format!("body: {error}"))?
        .to_bytes();
    Ok(Answer {
        status,
        body,
        server_leaf,
        alpn,
        suite,
        version,
    })
}

// ---- the server side ----

struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ServerError>>,
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

fn start_tls(
    engine: IoEngine,
    tls: ServingTls,
    handler: impl Handler,
    limits: ServeLimits,
) -> Running {
    start_tls_counted(engine, tls, handler, limits, None)
}

/// [`start_tls`] with failed handshakes counted in `metrics`.
fn start_tls_counted(
    engine: IoEngine,
    tls: ServingTls,
    handler: impl Handler,
    limits: ServeLimits,
    metrics: Option<Metrics>,
) -> Running {
    let listener = bind("127.0.0.1:0".parse().unwrap(), engine).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = spawn_connection(listener::serve_tls(
        listener,
        tls,
        handler,
        limits,
        metrics,
        async move {
            let _ = stopped.await;
        },
    ));
    Running { addr, stop, task }
}

fn start_plain(engine: IoEngine, limits: ServeLimits) -> Running {
    let listener = bind("127.0.0.1:0".parse().unwrap(), engine).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = spawn_connection(listener::run(
        listener,
        Plain,
        router(engine),
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    Running { addr, stop, task }
}

fn san_names(cert_pem: &[u8]) -> Vec<String> {
    let der = CertificateDer::pem_slice_iter(cert_pem)
        .next()
        .unwrap()
        .unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => (*dns).to_owned(),
            x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                super::pki::ip_from_bytes(bytes).unwrap().to_string()
            }
            other => format!("{other:?}"),
        })
        .collect()
}

// ---- generated certificate ----

async fn generated_certificate_is_served_and_trusted_through_its_file(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&settings(dir.path())).unwrap();
    let pki = dir.path().join("pki");
    assert_eq!(tls.cert_file(), pki.join("kubelet.crt"));
    assert_eq!(tls.key_file(), pki.join("kubelet.key"));
    let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&pki.join("kubelet.key")), 0o600);
    assert_eq!(mode(&pki), 0o700);
    let cert_pem = fs::read_to_string(tls.cert_file()).unwrap();
    let mut names = san_names(cert_pem.as_bytes());
    names.sort();
    assert_eq!(
        names,
        ["10.1.2.3", "127.0.0.1", "::1", "localhost", "node-a"]
    );

    let server = start_tls(engine, tls, router(engine), ServeLimits::default());
    let client = Client::trusting(&[&cert_pem]);
    for name in ["node-a", "localhost", "127.0.0.1"] {
        let answer = fetch(server.addr, &client, name, "/healthz").await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{name}");
        assert_eq!(answer.body, "ok");
        assert_eq!(answer.alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!(answer.version, ProtocolVersion::TLSv1_3);
    }
    // A client that does not trust the file is refused by its own verifier.
    let stranger = Client::trusting(&[&ca("other").pem]);
    assert!(
        fetch(server.addr, &stranger, "localhost", "/healthz")
            .await
            .is_err()
    );
    server.stop().await;
}

#[test]
fn generated_pair_is_reused_and_regenerated_only_when_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    let first = ServingTls::load(&settings).unwrap();
    let cert = fs::read(first.cert_file()).unwrap();
    let key = fs::read(first.key_file()).unwrap();

    let second = ServingTls::load(&settings).unwrap();
    assert_eq!(fs::read(second.cert_file()).unwrap(), cert);
    assert_eq!(fs::read(second.key_file()).unwrap(), key);

    // An unreadable key: a new pair.
    fs::write(first.key_file(), "garbage").unwrap();
    let third = ServingTls::load(&settings).unwrap();
    let regenerated = fs::read(third.cert_file()).unwrap();
    assert_ne!(regenerated, cert);

    // A new node address the certificate does not name: a new pair naming it.
    let moved = TlsSettings {
        addresses: vec!["10.9.9.9".parse().unwrap()],
        ..settings.clone()
    };
    let fourth = ServingTls::load(&moved).unwrap();
    let renamed = fs::read(fourth.cert_file()).unwrap();
    assert_ne!(renamed, regenerated);
    assert!(san_names(&renamed).contains(&"10.9.9.9".to_owned()));

    // An expired pair: a new one.
    let mut params = CertificateParams::new(vec!["node-a".to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    let key = KeyPair::generate().unwrap();
    let expired = params.self_signed(&key).unwrap().pem();
    fs::write(fourth.cert_file(), &expired).unwrap();
    fs::write(fourth.key_file(), key.serialize_pem()).unwrap();
    let fifth = ServingTls::load(&moved).unwrap();
    let fresh = fs::read_to_string(fifth.cert_file()).unwrap();
    assert_ne!(fresh, expired);
    assert!(fresh.starts_with("-----BEGIN CERTIFICATE-----"));
}

// ---- supplied files ----

async fn supplied_files_are_served_with_their_chain(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let authority = ca("supplied-ca");
    let pair = server_pair(&authority);
    let tls = ServingTls::load(&with_files(dir.path(), &pair)).unwrap();
    assert!(!dir.path().join("pki").exists(), "nothing is generated");
    let server = start_tls(engine, tls, router(engine), ServeLimits::default());

    let answer = fetch(
        server.addr,
        &Client::trusting(&[&authority.pem]),
        "localhost",
        "/healthz",
    )
    .await
    .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.server_leaf, pair.leaf);
    server.stop().await;
}

async fn openssl_rsa_and_ec_keys_in_every_pem_flavour_load(engine: IoEngine) {
    let Ok(version) = std::process::Command::new("openssl")
        .arg("version")
        .output()
    else {
        crate::testing::skip(
            "openssl_rsa_and_ec_keys_in_every_pem_flavour_load",
            "openssl is not installed",
        );
        return;
    };
    assert!(version.status.success());
    let dir = tempfile::tempdir().unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&["genrsa", "-traditional", "-out", "rsa1.key", "2048"]);
    openssl(&[
        "pkcs8", "-topk8", "-nocrypt", "-in", "rsa1.key", "-out", "rsa8.key",
    ]);
    openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        "ec1.key",
    ]);
    openssl(&[
        "pkcs8", "-topk8", "-nocrypt", "-in", "ec1.key", "-out", "ec8.key",
    ]);
    for (key, header) in [
        ("rsa1.key", "BEGIN RSA PRIVATE KEY"),
        ("rsa8.key", "BEGIN PRIVATE KEY"),
        ("ec1.key", "BEGIN EC PRIVATE KEY"),
        ("ec8.key", "BEGIN PRIVATE KEY"),
    ] {
        let cert = format!("{key}.crt");
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            key,
            "-out",
            &cert,
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ]);
        assert!(
            fs::read_to_string(dir.path().join(key))
                .unwrap()
                .contains(header)
        );
        let settings = TlsSettings {
            cert_file: Some(dir.path().join(&cert)),
            private_key_file: Some(dir.path().join(key)),
            ..settings(dir.path())
        };
        let tls = ServingTls::load(&settings).unwrap_or_else(|error| panic!("{key}: {error}"));
        let server = start_tls(engine, tls, router(engine), ServeLimits::default());
        let cert_pem = fs::read_to_string(dir.path().join(&cert)).unwrap();
        let answer = fetch(
            server.addr,
            &Client::trusting(&[&cert_pem]),
            "localhost",
            "/healthz",
        )
        .await
        .unwrap_or_else(|error| panic!("{key}: {error}"));
        assert_eq!(answer.status, StatusCode::OK, "{key}");
        server.stop().await;
    }
}

#[test]
fn bad_files_are_reported_with_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let authority = ca("ca");
    let pair = server_pair(&authority);
    let good = with_files(dir.path(), &pair);
    let error_text = |settings: &TlsSettings| {
        crate::error_chain::error_chain(&ServingTls::load(settings).unwrap_err())
    };

    let cert_only = TlsSettings {
        private_key_file: None,
        ..good.clone()
    };
    let text = error_text(&cert_only);
    assert!(
        text.contains("tls.crt") && text.contains("tlsPrivateKeyFile is not"),
        "{text}"
    );
    let key_only = TlsSettings {
        cert_file: None,
        ..good.clone()
    };
    assert!(error_text(&key_only).contains("tlsCertFile is not"));

    let missing = TlsSettings {
        cert_file: Some(dir.path().join("missing.crt")),
        ..good.clone()
    };
    let text = error_text(&missing);
    assert!(
        text.starts_with("reading certificate file") && text.contains("missing.crt"),
        "{text}"
    );

    let not_pem = dir.path().join("not-pem.crt");
    fs::write(&not_pem, "hello").unwrap();
    let text = error_text(&TlsSettings {
        cert_file: Some(not_pem),
        ..good.clone()
    });
    assert!(
        text.contains("not-pem.crt holds no PEM CERTIFICATE block"),
        "{text}"
    );

    let cert_as_key = TlsSettings {
        private_key_file: good.cert_file.clone(),
        ..good.clone()
    };
    let text = error_text(&cert_as_key);
    assert!(text.contains("holds no PEM private key"), "{text}");

    let other = dir.path().join("other.key");
    fs::write(&other, server_pair(&authority).key_pem).unwrap();
    let text = error_text(&TlsSettings {
        private_key_file: Some(other),
        ..good.clone()
    });
    assert!(
        text.contains("private key")
            && text.contains("other.key does not match the certificate")
            && text.contains("tls.crt"),
        "{text}"
    );

    let bad_ca = dir.path().join("ca.crt");
    fs::write(
        &bad_ca,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = error_text(&TlsSettings {
        client_ca_file: Some(bad_ca),
        ..good.clone()
    });
    assert!(
        text.contains("client CA file") && text.contains("ca.crt"),
        "{text}"
    );
    let text = error_text(&TlsSettings {
        client_ca_file: Some(dir.path().join("no-ca.crt")),
        ..good
    });
    assert!(
        text.starts_with("reading client CA file") && text.contains("no-ca.crt"),
        "{text}"
    );
}

// ---- versions and cipher suites ----

#[test]
fn min_version_names_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let load = |name: &str| {
        ServingTls::load(&TlsSettings {
            min_version: Some(name.to_owned()),
            ..settings(dir.path())
        })
    };
    for name in ["VersionTLS10", "VersionTLS11"] {
        let error = load(name).unwrap_err();
        assert!(
            matches!(error, TlsError::UnsupportedMinVersion { .. }),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("rustls implements only TLS 1.2 and 1.3")
        );
    }
    let error = load("TLS12").unwrap_err();
    assert_eq!(
        error.to_string(),
        "unknown tlsMinVersion \"TLS12\"; valid values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
    );
    load("VersionTLS12").unwrap();
    load("VersionTLS13").unwrap();
}

async fn min_version_13_refuses_a_tls12_client(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&TlsSettings {
        min_version: Some("VersionTLS13".to_owned()),
        ..settings(dir.path())
    })
    .unwrap();
    let cert_pem = fs::read_to_string(tls.cert_file()).unwrap();
    let server = start_tls(engine, tls, router(engine), ServeLimits::default());

    let mut old = Client::trusting(&[&cert_pem]);
    old.versions = vec![&rustls::version::TLS12];
    let error = fetch(server.addr, &old, "localhost", "/healthz")
        .await
        .unwrap_err();
    assert!(error.starts_with("handshake"), "{error}");
    let answer = fetch(
        server.addr,
        &Client::trusting(&[&cert_pem]),
        "localhost",
        "/healthz",
    )
    .await
    .unwrap();
    assert_eq!(answer.version, ProtocolVersion::TLSv1_3);
    server.stop().await;
}

#[test]
fn unsupported_cipher_suites_are_all_named() {
    let dir = tempfile::tempdir().unwrap();
    let error = ServingTls::load(&TlsSettings {
        cipher_suites: vec![
            "TLS_RSA_WITH_AES_128_CBC_SHA".to_owned(),
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_owned(),
            "TLS_AES_128_GCM_SHA256".to_owned(),
            "NOT_A_SUITE".to_owned(),
        ],
        ..settings(dir.path())
    })
    .unwrap_err();
    let TlsError::UnsupportedCipherSuites { names } = &error else {
        panic!("{error}");
    };
    assert_eq!(names, &["TLS_RSA_WITH_AES_128_CBC_SHA", "NOT_A_SUITE"]);
    let text = error.to_string();
    assert!(
        text.starts_with("unsupported tlsCipherSuites: TLS_RSA_WITH_AES_128_CBC_SHA, NOT_A_SUITE; supported: TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
        "{text}"
    );
}

async fn cipher_suites_restrict_tls12_and_leave_tls13_on(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&TlsSettings {
        // The generated key is ECDSA, so only the ECDSA suites can be negotiated.
        cipher_suites: vec![
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".to_owned(),
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_owned(),
        ],
        ..settings(dir.path())
    })
    .unwrap();
    let cert_pem = fs::read_to_string(tls.cert_file()).unwrap();
    let server = start_tls(engine, tls, router(engine), ServeLimits::default());

    let mut listed = Client::trusting(&[&cert_pem]);
    listed.versions = vec![&rustls::version::TLS12];
    listed.suites = vec![suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256];
    let answer = fetch(server.addr, &listed, "localhost", "/healthz")
        .await
        .unwrap();
    assert_eq!(
        answer.suite,
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    );

    let mut unlisted = Client::trusting(&[&cert_pem]);
    unlisted.versions = vec![&rustls::version::TLS12];
    unlisted.suites = vec![suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384];
    let error = fetch(server.addr, &unlisted, "localhost", "/healthz")
        .await
        .unwrap_err();
    assert!(error.starts_with("handshake"), "{error}");

    let mut modern = Client::trusting(&[&cert_pem]);
    modern.suites = vec![suite::TLS13_CHACHA20_POLY1305_SHA256];
    let answer = fetch(server.addr, &modern, "localhost", "/healthz")
        .await
        .unwrap();
    assert_eq!(answer.suite, CipherSuite::TLS13_CHACHA20_POLY1305_SHA256);
    server.stop().await;
}

// ---- client certificates ----

async fn client_certificates_are_verified_and_handed_to_requests(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("server-ca");
    let clients = ca("client-ca");
    let ca_file = dir.path().join("client-ca.crt");
    fs::write(&ca_file, &clients.pem).unwrap();
    let tls = ServingTls::load(&TlsSettings {
        client_ca_file: Some(ca_file),
        ..with_files(dir.path(), &server_pair(&server_ca))
    })
    .unwrap();
    let server = start_tls(engine, tls, peer_echo(), ServeLimits::default());

    let member = client_pair(&clients);
    let trusted = Client::trusting(&[&server_ca.pem]).with_identity(&member);
    let answer = fetch(server.addr, &trusted, "localhost", "/")
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, member.leaf.as_ref());

    let anonymous = Client::trusting(&[&server_ca.pem]);
    let answer = fetch(server.addr, &anonymous, "localhost", "/")
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::NO_CONTENT);

    let outsider = Client::trusting(&[&server_ca.pem]).with_identity(&client_pair(&ca("rogue-ca")));
    let error = fetch(server.addr, &outsider, "localhost", "/")
        .await
        .unwrap_err();
    // With TLS 1.3 the client learns of the rejection on its first read, not in its handshake.
    assert!(
        error.contains("UnknownCA") || error.contains("BadCertificate"),
        "{error}"
    );
    server.stop().await;
}

/// Collects what the `tracing` subscriber writes, to assert on log lines.
#[derive(Clone, Default)]
struct LogBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

async fn a_refused_client_certificate_is_logged_with_its_reason_and_counted(engine: IoEngine) {
    let log = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .finish();
    // The connections are local tasks on this thread, so a thread-local subscriber sees them.
    let _logging = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("server-ca");
    let ca_file = dir.path().join("client-ca.crt");
    fs::write(&ca_file, &ca("client-ca").pem).unwrap();
    let tls = ServingTls::load(&TlsSettings {
        client_ca_file: Some(ca_file),
        ..with_files(dir.path(), &server_pair(&server_ca))
    })
    .unwrap();
    let metrics = Metrics::new().unwrap();
    let server = start_tls_counted(
        engine,
        tls,
        peer_echo(),
        ServeLimits::default(),
        Some(metrics.clone()),
    );
    let outsider = Client::trusting(&[&server_ca.pem]).with_identity(&client_pair(&ca("rogue-ca")));
    for _ in 0..3 {
        fetch(server.addr, &outsider, "localhost", "/")
            .await
            .unwrap_err();
    }
    // Stopping waits for every connection task, so their failures have been reported by then.
    server.stop().await;

    let rendered = metrics.render().unwrap();
    assert!(
        rendered.contains("ringlet_tls_handshake_errors_total{reason=\"certificate\"} 3"),
        "{rendered}"
    );
    let log = log.text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("TLS handshake error from 127.0.0.1:"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per client and reason: {log}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(
        lines[0].contains("invalid peer certificate: UnknownIssuer"),
        "the line gives rustls's reason: {}",
        lines[0]
    );
}

async fn without_a_client_ca_client_certificates_are_not_requested(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("server-ca");
    let tls = ServingTls::load(&with_files(dir.path(), &server_pair(&server_ca))).unwrap();
    let server = start_tls(engine, tls, peer_echo(), ServeLimits::default());
    let client = Client::trusting(&[&server_ca.pem]).with_identity(&client_pair(&ca("any")));
    let answer = fetch(server.addr, &client, "localhost", "/").await.unwrap();
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    server.stop().await;
}

async fn upgraded_connections_pass_through_tls(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("server-ca");
    let tls = ServingTls::load(&with_files(dir.path(), &server_pair(&server_ca))).unwrap();
    let server = start_tls(engine, tls, peer_echo(), ServeLimits::default());

    let stream = tls_connect(
        server.addr,
        &Client::trusting(&[&server_ca.pem]),
        "localhost",
    )
    .await
    .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection.with_upgrades());
    let request = Request::post("/exec/ns/pod/c")
        .header(HOST, "localhost")
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, "echo")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let mut upgraded = TokioIo::new(hyper::upgrade::on(response).await.unwrap());
    upgraded.write_all(b"ping").await.unwrap();
    let mut echoed = Vec::new();
    upgraded.read_to_end(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"ping");
    server.stop().await;
}

async fn a_response_over_a_mebibyte_arrives_whole_over_tls(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&settings(dir.path())).unwrap();
    let cert_pem = fs::read_to_string(tls.cert_file()).unwrap();
    let host = Arc::new(crate::server::tests::host_with_large_pods());
    let router = Router::new(Arc::clone(&host) as _, Endpoints::ReadOnly, engine);
    let server = start_tls(engine, tls, router, ServeLimits::default());

    let answer = fetch(
        server.addr,
        &Client::trusting(&[&cert_pem]),
        "localhost",
        "/pods",
    )
    .await
    .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.body.len() > 1 << 20, "{}", answer.body.len());
    let list: k8s_openapi::List<k8s_openapi::api::core::v1::Pod> =
        serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(list.items, host.pods);
    server.stop().await;
}

// ---- rotation ----

async fn rotated_files_are_served_to_new_connections(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let first_ca = ca("first-ca");
    let second_ca = ca("second-ca");
    let first = server_pair(&first_ca);
    let second = server_pair(&second_ca);
    let tls = ServingTls::load(&with_files(dir.path(), &first)).unwrap();
    let server = start_tls(engine, tls, router(engine), ServeLimits::default());
    let client = Client::trusting(&[&first_ca.pem, &second_ca.pem]);
    let leaf_served = || async {
        fetch(server.addr, &client, "localhost", "/healthz")
            .await
            .unwrap()
            .server_leaf
    };
    assert_eq!(leaf_served().await, first.leaf);

    // Two plain writes, so the watcher may see a new certificate with the old key for a moment.
    second.write(dir.path());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while leaf_served().await != second.leaf {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

/// `serverTLSBootstrap`: no certificate (no handshake) until the manager writes one to the store,
/// then each pair it writes is served to new connections as soon as it says so, without the file
/// watch (which is never started here).
async fn bootstrapped_certificates_are_served_once_issued(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let authority = ca("cluster-ca");
    let (first, second) = (server_pair(&authority), server_pair(&authority));
    let tls = ServingTls::load(&TlsSettings {
        server_tls_bootstrap: true,
        // Ignored with serverTLSBootstrap, as in the kubelet.
        ..with_files(dir.path(), &server_pair(&ca("other-ca")))
    })
    .unwrap();
    let store = crate::certificate::store::PairStore::new(
        &dir.path().join("pki"),
        crate::certificate::store::SERVER_PREFIX,
    );
    assert_eq!(tls.cert_file(), store.current_path());
    let server = start_tls(engine, tls.clone(), router(engine), ServeLimits::default());
    let client = Client::trusting(&[&authority.pem]);
    let refused = fetch(server.addr, &client, "localhost", "/healthz").await;
    assert!(
        refused.is_err(),
        "served without a certificate: {refused:?}"
    );

    for pair in [&first, &second] {
        store
            .write(pair.cert_pem.as_bytes(), &pair.key_pem)
            .unwrap();
        tls.reload_certificate().unwrap();
        let answer = fetch(server.addr, &client, "localhost", "/healthz")
            .await
            .unwrap();
        assert_eq!(answer.server_leaf, pair.leaf);
    }
    server.stop().await;
}

#[test]
fn a_broken_new_pair_keeps_the_previous_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let authority = ca("ca");
    let first = server_pair(&authority);
    let second = server_pair(&authority);
    let tls = ServingTls::load(&with_files(dir.path(), &first)).unwrap();
    let current = || tls.shared.cert.get().unwrap().cert[0].clone();
    let mut seen = reload::Seen::of(&tls.shared.files);

    fs::write(tls.key_file(), "garbage").unwrap();
    seen = reload::check(&tls, seen);
    assert_eq!(current(), first.leaf);

    fs::write(tls.key_file(), &second.key_pem).unwrap();
    seen = reload::check(&tls, seen);
    assert_eq!(
        current(),
        first.leaf,
        "a key without its certificate is not taken"
    );

    fs::write(tls.cert_file(), &second.cert_pem).unwrap();
    let settled = reload::check(&tls, seen);
    assert_eq!(current(), second.leaf);
    assert_eq!(reload::check(&tls, settled), settled);
}

async fn client_ca_changes_apply_to_new_handshakes(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("server-ca");
    let old_clients = ca("old-clients");
    let new_clients = ca("new-clients");
    let ca_file = dir.path().join("client-ca.crt");
    fs::write(&ca_file, &old_clients.pem).unwrap();
    let tls = ServingTls::load(&TlsSettings {
        client_ca_file: Some(ca_file.clone()),
        ..with_files(dir.path(), &server_pair(&server_ca))
    })
    .unwrap();
    let seen = reload::Seen::of(&tls.shared.files);
    let server = start_tls(engine, tls.clone(), peer_echo(), ServeLimits::default());
    let newcomer = client_pair(&new_clients);
    let client = Client::trusting(&[&server_ca.pem]).with_identity(&newcomer);
    assert!(fetch(server.addr, &client, "localhost", "/").await.is_err());

    // A broken CA file keeps the old one.
    fs::write(&ca_file, "not a certificate").unwrap();
    let seen = reload::check(&tls, seen);
    let veteran = Client::trusting(&[&server_ca.pem]).with_identity(&client_pair(&old_clients));
    assert_eq!(
        fetch(server.addr, &veteran, "localhost", "/")
            .await
            .unwrap()
            .status,
        StatusCode::OK
    );

    fs::write(&ca_file, &new_clients.pem).unwrap();
    reload::check(&tls, seen);
    let answer = fetch(server.addr, &client, "localhost", "/").await.unwrap();
    assert_eq!(answer.body, newcomer.leaf.as_ref());
    server.stop().await;
}

// ---- limits ----

async fn plain_get(addr: SocketAddr) -> StatusCode {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::get("/healthz")
        .header(HOST, "x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    sender.send_request(request).await.unwrap().status()
}

async fn ask(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0; 512];
    let n = stream.read(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

async fn a_full_listener_leaves_new_connections_waiting_until_one_closes(engine: IoEngine) {
    let limits = ServeLimits {
        max_connections: 2,
        ..ServeLimits::default()
    };
    let server = start_plain(engine, limits);
    let other = start_plain(engine, ServeLimits::default());

    let mut first = TcpStream::connect(server.addr).await.unwrap();
    let second = TcpStream::connect(server.addr).await.unwrap();
    assert!(ask(&mut first).await.starts_with("HTTP/1.1 200 OK"));

    let mut third = TcpStream::connect(server.addr).await.unwrap();
    let waiting = tokio::spawn(async move {
        let answer = ask(&mut third).await;
        (answer, third)
    });
    // Well within the header timeout, so the idle connections still hold their slots.
    tokio::time::sleep(limits.header_read_timeout / 2).await;
    assert!(!waiting.is_finished(), "a third connection was served");
    assert_eq!(plain_get(other.addr).await, StatusCode::OK);
    assert!(
        ask(&mut first).await.starts_with("HTTP/1.1 200 OK"),
        "held connections keep working"
    );

    drop(second);
    let (answer, _third) = waiting.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    drop(first);
    server.stop().await;
    other.stop().await;
}

async fn stalled_tls_clients_are_dropped_after_their_timeouts(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&settings(dir.path())).unwrap();
    let cert_pem = fs::read_to_string(tls.cert_file()).unwrap();
    let limits = ServeLimits {
        tls_handshake_timeout: Duration::from_secs(3),
        header_read_timeout: Duration::from_secs(7),
        ..ServeLimits::default()
    };
    let server = start_tls(engine, tls, router(engine), limits);

    // Silent after connecting, and half a ClientHello record: cut off at the handshake deadline.
    for opening in [&b""[..], &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]] {
        let mut stalled = TcpStream::connect(server.addr).await.unwrap();
        stalled.write_all(opening).await.unwrap();
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        let _ = stalled.read_to_end(&mut rest).await;
        let waited = started.elapsed();
        assert!(
            waited >= limits.tls_handshake_timeout && waited < limits.header_read_timeout,
            "{waited:?}"
        );
    }

    // Half a request head after a good handshake: cut off at the header deadline.
    let mut slow = tls_connect(server.addr, &Client::trusting(&[&cert_pem]), "localhost")
        .await
        .unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    slow.flush().await.unwrap();
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest).await;
    assert!(started.elapsed() >= limits.header_read_timeout);
    assert!(!String::from_utf8_lossy(&rest).contains("200 OK"));

    // The listener is still serving.
    let answer = fetch(
        server.addr,
        &Client::trusting(&[&cert_pem]),
        "localhost",
        "/healthz",
    )
    .await
    .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    server.stop().await;
}

async fn shutdown_finishes_tls_connections_and_stops(engine: IoEngine) {
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&settings(dir.path())).unwrap();
    let cert_pem = fs::read_to_string(tls.cert_file()).unwrap();
    let server = start_tls(engine, tls, router(engine), ServeLimits::default());
    let mut idle = tls_connect(server.addr, &Client::trusting(&[&cert_pem]), "localhost")
        .await
        .unwrap();
    let addr = server.addr;
    server.stop().await;
    let mut rest = Vec::new();
    let _ = idle.read_to_end(&mut rest).await;
    assert!(TcpStream::connect(addr).await.is_err());
}

// ---- curl ----

async fn curl_trusts_the_generated_certificate(engine: IoEngine) {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        crate::testing::skip(
            "curl_trusts_the_generated_certificate",
            "curl is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&settings(dir.path())).unwrap();
    let cert_file = tls.cert_file().to_owned();
    let server = start_tls(engine, tls, router(engine), ServeLimits::default());
    let port = server.addr.port();
    let output = tokio::process::Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--cacert"])
        .arg(&cert_file)
        .arg("--resolve")
        .arg(format!("node-a:{port}:127.0.0.1"))
        .arg(format!("https://node-a:{port}/healthz"))
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.stdout, b"ok");
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let output = tokio::process::Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--fail",
            "--http1.1",
            "--cacert",
        ])
        .arg(&cert_file)
        .arg(format!("https://{ip}:{port}/healthz"))
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.stop().await;
}

#[test]
fn an_empty_node_name_is_left_out_of_the_generated_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let tls = ServingTls::load(&TlsSettings {
        node_name: String::new(),
        addresses: Vec::new(),
        ..settings(dir.path())
    })
    .unwrap();
    let mut names = san_names(&fs::read(tls.cert_file()).unwrap());
    names.sort();
    assert_eq!(names, ["127.0.0.1", "::1", "localhost"]);
}

on_both_engines! {
    Paused: [
        a_full_listener_leaves_new_connections_waiting_until_one_closes,
        stalled_tls_clients_are_dropped_after_their_timeouts,
        shutdown_finishes_tls_connections_and_stops,
    ],
    Real: [
        generated_certificate_is_served_and_trusted_through_its_file,
        supplied_files_are_served_with_their_chain,
        openssl_rsa_and_ec_keys_in_every_pem_flavour_load,
        min_version_13_refuses_a_tls12_client,
        cipher_suites_restrict_tls12_and_leave_tls13_on,
        client_certificates_are_verified_and_handed_to_requests,
        a_refused_client_certificate_is_logged_with_its_reason_and_counted,
        without_a_client_ca_client_certificates_are_not_requested,
        upgraded_connections_pass_through_tls,
        a_response_over_a_mebibyte_arrives_whole_over_tls,
        rotated_files_are_served_to_new_connections,
        bootstrapped_certificates_are_served_once_issued,
        client_ca_changes_apply_to_new_handshakes,
        curl_trusts_the_generated_certificate,
    ],
}
