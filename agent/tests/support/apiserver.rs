//! An API-server double for the component tests: a real HTTPS server (hyper + rustls, its own rcgen CA)
//! answering `TokenReview` (`authentication.k8s.io/v1`) and `SubjectAccessReview`
//! (`authorization.k8s.io/v1`) creates, and writing kubeconfigs that point the agent at it. It plays
//! the part of the API server behind the kubelet's delegating authenticator and authorizer.
//!
//! It answers like the real API server where ringlet depends on it: callers must authenticate (a
//! bearer token or a client certificate signed by its CA, else 401 with a `Status`); only `POST`
//! with a JSON body is accepted (405, 415 otherwise); a body that is not JSON, or whose
//! `apiVersion`/`kind` does not match the endpoint, is a 400 `BadRequest` `Status`; a `TokenReview`
//! without a token is a 400 and a `SubjectAccessReview` without user and groups or without
//! attributes is a 422 `Invalid`; an accepted review is answered `201 Created` with the object echoed
//! and its `status` filled in.
//!
//! Tests steer it: which tokens belong to which users, which (user or group, verb, subresource) are
//! allowed (with the reasons given), and [`Failure`] modes (503, connection closed, garbage answers,
//! no answer at all, or the whole server stopped). Counters tell how many reviews reached it, to assert caching.
//! Not modelled: RBAC on the caller itself (any authenticated caller may create reviews), audiences
//! beyond one default, `nonResourceAttributes` decisions (always denied), namespaces, and every
//! other API.

#![allow(
    dead_code,
    reason = "every test binary includes this module and uses a different part of it"
)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{
    SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

/// The bearer token the double's default kubeconfig gives the agent.
pub const AGENT_TOKEN: &str = "ringlet-node-token";
/// The audience a real API server puts in `TokenReview.status.audiences` when the spec names none.
pub const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const SUBJECT_ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// How the double misbehaves (the default is not at all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Failure {
    #[default]
    None,
    /// 503 with a `Status` body, as an API server without ready storage answers.
    Unavailable,
    /// The connection is closed without an answer.
    Close,
    /// 201 Created with a body that is not a review.
    Garbage,
    /// No answer at all, the connection left open.
    Hang,
}

/// Who a kubeconfig written by [`ApiServerDouble::write_kubeconfig`] says the agent is.
#[derive(Clone, Debug)]
pub enum KubeconfigUser {
    /// `token:` inline.
    Token(String),
    /// `tokenFile:` naming a file next to the kubeconfig (relative path).
    TokenFile(String),
    /// `client-certificate:`/`client-key:` files next to the kubeconfig (relative paths), signed
    /// by the double's CA for this common name.
    ClientCertificate(String),
}

/// A user a token maps to.
#[derive(Clone, Debug, Default)]
pub struct TokenUser {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Default)]
struct Rules {
    tokens: HashMap<String, TokenUser>,
    /// (user or `group:<name>`, verb, subresource).
    allowed: HashSet<(String, String, String)>,
    deny_reason: String,
    failure: Failure,
}

struct State {
    rules: Mutex<Rules>,
    token_reviews: AtomicUsize,
    subject_access_reviews: AtomicUsize,
    last_subject_access_review: Mutex<Option<SubjectAccessReviewSpec>>,
    /// Who called, per request (token or certificate CN), to assert the agent's own credentials.
    callers: Mutex<Vec<String>>,
}

pub struct ApiServerDouble {
    addr: SocketAddr,
    state: Arc<State>,
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: TempDir,
    kubeconfig: PathBuf,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl ApiServerDouble {
    /// Starts the double on an ephemeral port of 127.0.0.1 and writes its default kubeconfig
    /// (inline CA data, token [`AGENT_TOKEN`]).
    pub async fn start() -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).or_panic("creating the CA's parameters");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "api-server-double-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(
            ca_params,
            KeyPair::generate().or_panic("generating the CA key"),
        )
        .or_panic("self-signing the CA");

        let server_key = KeyPair::generate().or_panic("generating the server key");
        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .or_panic("creating the server certificate's parameters");
        server_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server_params
            .signed_by(&server_key, &ca)
            .or_panic("signing the server certificate");

        let mut roots = RootCertStore::empty();
        roots.add(ca.der().clone()).or_panic("trusting the CA");
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .allow_unauthenticated()
            .build()
            .or_panic("building the client certificate verifier");
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .or_panic("choosing TLS versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![server_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )
            .or_panic("setting the server certificate");

        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .or_panic("binding 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .or_panic("reading the listening address");
        let state = Arc::new(State {
            rules: Mutex::new(Rules::default()),
            token_reviews: AtomicUsize::new(0),
            subject_access_reviews: AtomicUsize::new(0),
            last_subject_access_review: Mutex::new(None),
            callers: Mutex::new(Vec::new()),
        });
        let server = tokio::spawn(serve(
            listener,
            TlsAcceptor::from(Arc::new(tls)),
            state.clone(),
        ));

        let dir = tempfile::tempdir().or_panic("creating the temporary directory");
        let mut double = Self {
            addr,
            state,
            ca,
            kubeconfig: PathBuf::new(),
            dir,
            server: Mutex::new(Some(server)),
        };
        double.kubeconfig =
            double.write_kubeconfig("kubeconfig", &KubeconfigUser::Token(AGENT_TOKEN.to_owned()));
        double
    }

    /// The default kubeconfig (token [`AGENT_TOKEN`]).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Writes a kubeconfig named `name` in the double's directory for `user`; returns its path.
    pub fn write_kubeconfig(&self, name: &str, user: &KubeconfigUser) -> PathBuf {
        let dir = self.dir.path();
        let user_yaml = match user {
            KubeconfigUser::Token(token) => format!("token: {token:?}"),
            KubeconfigUser::TokenFile(token) => {
                std::fs::write(dir.join(format!("{name}.token")), token)
                    .or_panic("writing the token file");
                format!("tokenFile: {name}.token")
            }
            KubeconfigUser::ClientCertificate(common_name) => {
                let (certificate, key) = self.client_certificate(common_name, &[]);
                std::fs::write(dir.join(format!("{name}.crt")), certificate)
                    .or_panic("writing the client certificate");
                std::fs::write(dir.join(format!("{name}.key")), key)
                    .or_panic("writing the client key");
                format!("client-certificate: {name}.crt\n    client-key: {name}.key")
            }
        };
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: agent\nclusters:\n- name: double\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: agent\n  user:\n    {user_yaml}\ncontexts:\n- name: agent\n  context:\n    cluster: double\n    user: agent\n",
            self.url(),
            STANDARD.encode(self.ca.pem()),
        );
        let path = dir.join(name);
        std::fs::write(&path, kubeconfig).or_panic("writing the kubeconfig");
        path
    }

    /// A client certificate and its key (PEM) signed by the double's CA.
    pub fn client_certificate(
        &self,
        common_name: &str,
        organizations: &[&str],
    ) -> (String, String) {
        let key = KeyPair::generate().or_panic("generating the client key");
        let mut params = CertificateParams::new(Vec::<String>::new())
            .or_panic("creating the client certificate's parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for organization in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *organization);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let certificate = params
            .signed_by(&key, &self.ca)
            .or_panic("signing the client certificate");
        (certificate.pem(), key.serialize_pem())
    }

    /// Makes `token` authenticate as `user`.
    pub fn add_token(&self, token: &str, user: TokenUser) {
        self.rules().tokens.insert(token.to_owned(), user);
    }

    /// Allows `user` to `verb` `nodes/<subresource>`.
    pub fn allow_user(&self, user: &str, verb: &str, subresource: &str) {
        self.rules()
            .allowed
            .insert((user.to_owned(), verb.to_owned(), subresource.to_owned()));
    }

    /// Allows every member of `group` to `verb` `nodes/<subresource>`.
    pub fn allow_group(&self, group: &str, verb: &str, subresource: &str) {
        self.rules().allowed.insert((
            format!("group:{group}"),
            verb.to_owned(),
            subresource.to_owned(),
        ));
    }

    /// Withdraws every permission (tokens stay).
    pub fn revoke_all(&self) {
        self.rules().allowed.clear();
    }

    /// The `status.reason` of denials (empty by default, as RBAC gives none).
    pub fn set_deny_reason(&self, reason: &str) {
        reason.clone_into(&mut self.rules().deny_reason);
    }

    pub fn set_failure(&self, failure: Failure) {
        self.rules().failure = failure;
    }

    /// Stops serving: the port refuses connections and open ones are closed.
    pub fn stop(&self) {
        if let Some(server) = lock(&self.server).take() {
            server.abort();
        }
    }

    /// `TokenReview` creates received (valid or not, failing or not).
    pub fn token_reviews(&self) -> usize {
        self.state.token_reviews.load(Ordering::SeqCst)
    }

    /// `SubjectAccessReview` creates received (valid or not, failing or not).
    pub fn subject_access_reviews(&self) -> usize {
        self.state.subject_access_reviews.load(Ordering::SeqCst)
    }

    pub fn last_subject_access_review(&self) -> Option<SubjectAccessReviewSpec> {
        lock(&self.state.last_subject_access_review).clone()
    }

    /// Who made each authenticated request: `token:<token>` or `cn:<common name>`.
    pub fn callers(&self) -> Vec<String> {
        lock(&self.state.callers).clone()
    }

    fn rules(&self) -> MutexGuard<'_, Rules> {
        lock(&self.state.rules)
    }
}

impl Drop for ApiServerDouble {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, state: Arc<State>) {
    // Aborting this task drops the set, which aborts every connection with it.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        connections.spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let caller_cn = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(common_name);
            let service = service_fn(move |request| {
                let state = state.clone();
                let caller_cn = caller_cn.clone();
                async move { handle(&state, caller_cn, request).await }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

fn common_name(certificate: &CertificateDer<'_>) -> Option<String> {
    use x509_parser::prelude::{FromDer as _, X509Certificate};
    let (_, parsed) = X509Certificate::from_der(certificate).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_owned())
}

/// The error that makes hyper drop the connection without answering.
#[derive(Debug)]
struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("closing the connection as configured")
    }
}

impl std::error::Error for CloseConnection {}

async fn handle(
    state: &State,
    caller_cn: Option<String>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, CloseConnection> {
    let path = request.uri().path().to_owned();
    let counter = match path.as_str() {
        TOKEN_REVIEWS => Some(&state.token_reviews),
        SUBJECT_ACCESS_REVIEWS => Some(&state.subject_access_reviews),
        _ => None,
    };
    if let Some(counter) = counter {
        counter.fetch_add(1, Ordering::SeqCst);
    }
    let failure = lock(&state.rules).failure;
    match failure {
        Failure::None | Failure::Garbage => {}
        Failure::Unavailable => {
            return Ok(status_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ));
        }
        Failure::Close => return Err(CloseConnection),
        Failure::Hang => std::future::pending().await,
    }

    let bearer = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::to_owned);
    // Like the real authenticator chain: a verified client certificate wins, then the token.
    let caller = match (caller_cn, bearer) {
        (Some(cn), _) => format!("cn:{cn}"),
        (None, Some(token)) if token == AGENT_TOKEN => format!("token:{token}"),
        _ => {
            return Ok(status_response(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "Unauthorized",
            ));
        }
    };
    lock(&state.callers).push(caller);

    if counter.is_none() {
        return Ok(status_response(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    if request.method() != Method::POST {
        return Ok(status_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if !content_type.starts_with("application/json") {
        return Ok(status_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type:?})"
            ),
        ));
    }
    let Ok(body) = request.into_body().collect().await else {
        return Err(CloseConnection);
    };
    let body = body.to_bytes();

    if failure == Failure::Garbage {
        // Truncated JSON of the wrong kind.
        return Ok(json_response(
            StatusCode::CREATED,
            Bytes::from_static(b"{\"kind\":\"Pod\",\"apiVersion\":\"v1\""),
        ));
    }

    let rules = lock(&state.rules);
    let answer = if path == TOKEN_REVIEWS {
        review_token(&rules, &body)
    } else {
        let answer = review_access(&rules, &body);
        if let Ok((review, _)) = &answer {
            *lock(&state.last_subject_access_review) = Some(review.spec.clone());
        }
        answer.map(|(_, value)| value)
    };
    Ok(match answer {
        Ok(value) => json_response(StatusCode::CREATED, Bytes::from(value.to_string())),
        Err(rejection) => status_response(rejection.status, rejection.reason, &rejection.message),
    })
}

/// A refused review, answered with a `Status` body.
struct Rejection {
    status: StatusCode,
    reason: &'static str,
    message: String,
}

/// Decodes `body` as `api_version`/`kind`, as the API server's REST handler does: absent fields
/// default to the endpoint's, different ones are a 400.
fn decode<T: serde::de::DeserializeOwned>(
    body: &[u8],
    api_version: &str,
    kind: &str,
) -> Result<(T, Value), Rejection> {
    let bad_request = |message: String| Rejection {
        status: StatusCode::BAD_REQUEST,
        reason: "BadRequest",
        message,
    };
    let mut value: Value = serde_json::from_slice(body).map_err(|error| {
        bad_request(format!(
            "the body of the request could not be decoded: {error}"
        ))
    })?;
    let Some(object) = value.as_object_mut() else {
        return Err(bad_request(
            "the body of the request is not a JSON object".to_owned(),
        ));
    };
    match object.get("apiVersion").and_then(Value::as_str) {
        None => {
            object.insert("apiVersion".to_owned(), json!(api_version));
        }
        Some(found) if found == api_version => {}
        Some(found) => {
            return Err(bad_request(format!(
                "the API version in the data ({found}) does not match the expected API version ({api_version})"
            )));
        }
    }
    match object.get("kind").and_then(Value::as_str) {
        None => {
            object.insert("kind".to_owned(), json!(kind));
        }
        Some(found) if found == kind => {}
        Some(found) => {
            return Err(bad_request(format!(
                "the kind in the data ({found}) does not match the expected kind ({kind})"
            )));
        }
    }
    let typed = serde_json::from_value(value.clone())
        .map_err(|error| bad_request(format!("decoding {kind}: {error}")))?;
    Ok((typed, value))
}

fn review_token(rules: &Rules, body: &[u8]) -> Result<Value, Rejection> {
    let (review, mut echoed): (TokenReview, Value) =
        decode(body, "authentication.k8s.io/v1", "TokenReview")?;
    let token = review.spec.token.unwrap_or_default();
    if token.is_empty() {
        return Err(Rejection {
            status: StatusCode::BAD_REQUEST,
            reason: "BadRequest",
            message: "token is required for TokenReview in authentication".to_owned(),
        });
    }
    let audiences = review
        .spec
        .audiences
        .filter(|audiences| !audiences.is_empty())
        .unwrap_or_else(|| vec![DEFAULT_AUDIENCE.to_owned()]);
    let status = match rules.tokens.get(&token) {
        Some(user) => TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(audiences),
            user: Some(UserInfo {
                username: Some(user.name.clone()),
                uid: Some(user.uid.clone()).filter(|uid| !uid.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|extra| !extra.is_empty()),
            }),
            error: None,
        },
        None => TokenReviewStatus {
            user: Some(UserInfo::default()),
            error: Some("[invalid bearer token, token lookup failed]".to_owned()),
            ..TokenReviewStatus::default()
        },
    };
    fill(&mut echoed, &status);
    Ok(echoed)
}

fn review_access(rules: &Rules, body: &[u8]) -> Result<(SubjectAccessReview, Value), Rejection> {
    let (review, mut echoed): (SubjectAccessReview, Value) =
        decode(body, "authorization.k8s.io/v1", "SubjectAccessReview")?;
    let spec = &review.spec;
    let invalid = |field: &str, message: &str| Rejection {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        reason: "Invalid",
        message: format!(
            "SubjectAccessReview.authorization.k8s.io \"\" is invalid: {field}: Invalid value: \"null\": {message}"
        ),
    };
    let user = spec.user.clone().unwrap_or_default();
    let groups = spec.groups.clone().unwrap_or_default();
    if user.is_empty() && groups.is_empty() {
        return Err(invalid(
            "spec.user",
            "at least one of user or group must be specified",
        ));
    }
    let attributes = match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(attributes), None) => Some(attributes),
        (None, Some(_)) => None,
        _ => {
            return Err(invalid(
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    };
    let allowed = attributes.is_some_and(|attributes| {
        let verb = attributes.verb.clone().unwrap_or_default();
        let subresource = attributes.subresource.clone().unwrap_or_default();
        attributes.resource.as_deref() == Some("nodes")
            && std::iter::once(user.clone())
                .chain(groups.iter().map(|group| format!("group:{group}")))
                .any(|subject| {
                    rules
                        .allowed
                        .contains(&(subject, verb.clone(), subresource.clone()))
                })
    });
    let status = if allowed {
        SubjectAccessReviewStatus {
            allowed: true,
            reason: Some(format!("RBAC: allowed for {user:?}")),
            ..SubjectAccessReviewStatus::default()
        }
    } else {
        SubjectAccessReviewStatus {
            allowed: false,
            reason: Some(rules.deny_reason.clone()).filter(|reason| !reason.is_empty()),
            ..SubjectAccessReviewStatus::default()
        }
    };
    fill(&mut echoed, &status);
    Ok((review, echoed))
}

/// Sets the echoed object's `status` and the `metadata` a real create returns.
fn fill<S: serde::Serialize>(echoed: &mut Value, status: &S) {
    if let Some(object) = echoed.as_object_mut() {
        object.insert("metadata".to_owned(), json!({"creationTimestamp": null}));
        object.insert(
            "status".to_owned(),
            serde_json::to_value(status).or_panic("encoding the review status"),
        );
    }
}

fn status_response(status: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status.as_u16(),
    });
    json_response(status, Bytes::from(body.to_string()))
}

fn json_response(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Set-up failures of the double fail the test that uses it, saying what was being done.
trait OrPanic<T> {
    fn or_panic(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrPanic<T> for Result<T, E> {
    fn or_panic(self, what: &str) -> T {
        self.unwrap_or_else(|error| panic!("API-server double: {what}: {error}"))
    }
}
