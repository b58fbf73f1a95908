//! Component tests of the kubelet API's authentication and authorisation (`server::auth`) and of the
//! API server client (`apiserver`), against the HTTPS API-server double.
//!
//! Cache expiry is tested with short TTLs in real time: paused tokio time would jump past the
//! client's request timeout whenever the test waits on the double's sockets.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::{Method, Request, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use rcgen::{CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use ringlet::apiserver::{ApiClient, ApiClientOptions, REQUEST_TIMEOUT};
use ringlet::server::PeerCertificates;
use ringlet::server::auth::{
    AuthSettings, AuthorizationMode, DEFAULT_CACHE_AUTHORIZED_TTL, DEFAULT_CACHE_UNAUTHORIZED_TTL,
    DEFAULT_WEBHOOK_CACHE_TTL, Denial, KubeletAuth, UserInfo,
};
use rustls_pki_types::CertificateDer;
use support::apiserver::{ApiServerDouble, Failure, KubeconfigUser, TokenUser};

const NODE: &str = "node-a";

fn webhook_authorization(authorized: Duration, unauthorized: Duration) -> AuthorizationMode {
    AuthorizationMode::Webhook {
        cache_authorized_ttl: authorized,
        cache_unauthorized_ttl: unauthorized,
    }
}

fn settings(
    anonymous_enabled: bool,
    webhook_authentication: Option<Duration>,
    authorization: AuthorizationMode,
) -> AuthSettings {
    AuthSettings {
        anonymous_enabled,
        webhook_authentication,
        authorization,
        node_name: NODE.to_owned(),
    }
}

async fn client(kubeconfig: &std::path::Path, timeout: Duration) -> ApiClient {
    let options = ApiClientOptions {
        request_timeout: timeout,
        ..ApiClientOptions::default()
    };
    ApiClient::from_kubeconfig(kubeconfig, options)
        .await
        .unwrap_or_else(|e| panic!("a client from {}: {e}", kubeconfig.display()))
}

async fn auth(double: &ApiServerDouble, settings: AuthSettings) -> KubeletAuth {
    let client = client(double.kubeconfig(), REQUEST_TIMEOUT).await;
    KubeletAuth::new(settings, Some(client)).unwrap_or_else(|e| panic!("KubeletAuth::new: {e}"))
}

fn request(method: Method, path: &str) -> Request<()> {
    Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .unwrap_or_else(|e| panic!("building a request for {path}: {e}"))
}

fn with_token(mut request: Request<()>, token: &str) -> Request<()> {
    let value = format!("Bearer {token}")
        .parse()
        .unwrap_or_else(|e| panic!("token {token:?} as a header: {e}"));
    request.headers_mut().insert(AUTHORIZATION, value);
    request
}

/// A client certificate as the TLS listener hands it over: CA-signed, verified, leaf first.
fn with_certificate(
    mut request: Request<()>,
    common_name: &str,
    organizations: &[&str],
) -> Request<()> {
    let chain = client_chain(common_name, organizations)
        .unwrap_or_else(|e| panic!("creating a client certificate for {common_name}: {e}"));
    request
        .extensions_mut()
        .insert(PeerCertificates(Arc::from(chain)));
    request
}

fn client_chain(
    common_name: &str,
    organizations: &[&str],
) -> Result<Vec<CertificateDer<'static>>, rcgen::Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "client-ca");
    ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    assert!(
        organizations.len() <= 2,
        "the helper supports two organizations"
    );
    // rcgen keeps one value per attribute type; the raw organizationName OID carries a second.
    for (index, organization) in organizations.iter().enumerate() {
        let kind = if index == 0 {
            DnType::OrganizationName
        } else {
            DnType::CustomDnType(vec![2, 5, 4, 10])
        };
        params.distinguished_name.push(kind, *organization);
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf = params.signed_by(&KeyPair::generate()?, &ca)?;
    Ok(vec![leaf.der().clone(), ca.der().clone()])
}

fn user(name: &str, groups: &[&str]) -> TokenUser {
    TokenUser {
        name: name.to_owned(),
        groups: groups.iter().map(|group| (*group).to_owned()).collect(),
        ..TokenUser::default()
    }
}

/// The router awaits `check` inside connection tasks, so its future must be `Send` even for a body
/// type that is not `Sync` (hyper's `Incoming` body is not).
#[test]
fn check_futures_are_send_for_any_body() {
    fn assert_send_static<F: Send + 'static>(_: &F) {}
    /// `Send` but not `Sync`.
    struct SendOnlyBody(std::marker::PhantomData<std::cell::Cell<u8>>);
    let auth =
        KubeletAuth::new(settings(false, None, AuthorizationMode::AlwaysAllow), None).unwrap();
    let request = Request::new(SendOnlyBody(std::marker::PhantomData));
    assert_send_static(&auth.check(&request));
    assert_send_static(&auth.authenticate(&request));
    assert_send_static(&auth.authorize(&UserInfo::default(), &request));
}

#[tokio::test]
async fn client_certificate_subject_is_the_user_and_comes_before_tokens() {
    let double = ApiServerDouble::start().await;
    let auth = auth(
        &double,
        settings(
            false,
            Some(DEFAULT_WEBHOOK_CACHE_TTL),
            AuthorizationMode::AlwaysAllow,
        ),
    )
    .await;
    let request = with_certificate(
        with_token(request(Method::GET, "/pods"), "unknown-token"),
        "alice",
        &["devs", "ops"],
    );
    let user = auth.check(&request).await.unwrap();
    assert_eq!(
        user,
        UserInfo {
            name: "alice".to_owned(),
            uid: String::new(),
            groups: vec![
                "devs".to_owned(),
                "ops".to_owned(),
                "system:authenticated".to_owned()
            ],
            extra: BTreeMap::new(),
        }
    );
    assert_eq!(
        double.token_reviews(),
        0,
        "x509 answers before the token webhook"
    );
}

#[tokio::test]
async fn anonymous_only_when_enabled_and_never_for_a_bad_token() {
    let double = ApiServerDouble::start().await;
    let anonymous = auth(
        &double,
        settings(
            true,
            Some(DEFAULT_WEBHOOK_CACHE_TTL),
            AuthorizationMode::AlwaysAllow,
        ),
    )
    .await;
    let user = anonymous
        .check(&request(Method::GET, "/pods"))
        .await
        .unwrap();
    assert_eq!(user.name, "system:anonymous");
    assert_eq!(user.groups, ["system:unauthenticated"]);
    // A non-bearer scheme is no credential at all.
    let basic = {
        let mut request = request(Method::GET, "/pods");
        request
            .headers_mut()
            .insert(AUTHORIZATION, "Basic YTpi".parse().unwrap());
        request
    };
    assert_eq!(
        anonymous.check(&basic).await.unwrap().name,
        "system:anonymous"
    );

    let denial = anonymous
        .check(&with_token(request(Method::GET, "/pods"), "forged"))
        .await
        .unwrap_err();
    assert_eq!(denial.status, StatusCode::UNAUTHORIZED);

    let closed = auth(
        &double,
        settings(
            false,
            Some(DEFAULT_WEBHOOK_CACHE_TTL),
            AuthorizationMode::AlwaysAllow,
        ),
    )
    .await;
    let denial = closed
        .check(&request(Method::GET, "/pods"))
        .await
        .unwrap_err();
    assert_eq!(
        denial,
        Denial {
            status: StatusCode::UNAUTHORIZED,
            message: "Unauthorized".to_owned()
        }
    );
}

#[tokio::test]
async fn tokens_are_ignored_without_webhook_authentication() {
    let double = ApiServerDouble::start().await;
    double.add_token("good", user("bob", &[]));
    let auth = auth(
        &double,
        settings(false, None, AuthorizationMode::AlwaysAllow),
    )
    .await;
    let denial = auth
        .check(&with_token(request(Method::GET, "/pods"), "good"))
        .await
        .unwrap_err();
    assert_eq!(denial.status, StatusCode::UNAUTHORIZED);
    assert_eq!(double.token_reviews(), 0);
}

#[tokio::test]
async fn token_review_accepts_refuses_and_caches() {
    let double = ApiServerDouble::start().await;
    double.add_token(
        "good",
        TokenUser {
            name: "system:serviceaccount:monitoring:prometheus".to_owned(),
            uid: "6a0c".to_owned(),
            groups: vec!["system:serviceaccounts".to_owned()],
            extra: BTreeMap::from([(
                "authentication.kubernetes.io/pod-name".to_owned(),
                vec!["prometheus-0".to_owned()],
            )]),
        },
    );
    let auth = auth(
        &double,
        settings(
            false,
            Some(DEFAULT_WEBHOOK_CACHE_TTL),
            AuthorizationMode::AlwaysAllow,
        ),
    )
    .await;

    let user = auth
        .check(&with_token(request(Method::GET, "/metrics"), "good"))
        .await
        .unwrap();
    assert_eq!(user.name, "system:serviceaccount:monitoring:prometheus");
    assert_eq!(user.uid, "6a0c");
    assert_eq!(
        user.groups,
        ["system:serviceaccounts", "system:authenticated"]
    );
    assert_eq!(
        user.extra["authentication.kubernetes.io/pod-name"],
        ["prometheus-0"]
    );
    assert_eq!(double.token_reviews(), 1);
    assert_eq!(double.callers(), ["token:ringlet-node-token"]);

    let again = auth
        .check(&with_token(request(Method::GET, "/metrics"), "good"))
        .await
        .unwrap();
    assert_eq!(again, user);
    assert_eq!(
        double.token_reviews(),
        1,
        "the second request is answered from the cache"
    );

    for _ in 0..2 {
        let denial = auth
            .check(&with_token(request(Method::GET, "/metrics"), "bad"))
            .await
            .unwrap_err();
        assert_eq!(denial.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(double.token_reviews(), 2, "a refusal is cached too");
}

#[tokio::test]
async fn token_cache_expires_after_its_ttl() {
    let double = ApiServerDouble::start().await;
    double.add_token("good", user("bob", &[]));
    let auth = auth(
        &double,
        settings(
            false,
            Some(Duration::from_secs(1)),
            AuthorizationMode::AlwaysAllow,
        ),
    )
    .await;
    let request = with_token(request(Method::GET, "/pods"), "good");
    auth.check(&request).await.unwrap();
    auth.check(&request).await.unwrap();
    assert_eq!(double.token_reviews(), 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    auth.check(&request).await.unwrap();
    assert_eq!(double.token_reviews(), 2);
}

#[tokio::test]
async fn subject_access_review_allows_and_denies_with_the_reason() {
    let double = ApiServerDouble::start().await;
    double.add_token(
        "good",
        TokenUser {
            name: "bob".to_owned(),
            uid: "b0b".to_owned(),
            groups: vec!["viewers".to_owned()],
            extra: BTreeMap::from([("scopes".to_owned(), vec!["read".to_owned()])]),
        },
    );
    double.allow_group("viewers", "get", "stats");
    double.set_deny_reason("no RBAC policy matched");
    let auth = auth(
        &double,
        settings(
            false,
            Some(DEFAULT_WEBHOOK_CACHE_TTL),
            webhook_authorization(DEFAULT_CACHE_AUTHORIZED_TTL, DEFAULT_CACHE_UNAUTHORIZED_TTL),
        ),
    )
    .await;

    auth.check(&with_token(request(Method::GET, "/stats/summary"), "good"))
        .await
        .unwrap();
    let spec = double.last_subject_access_review().unwrap();
    assert_eq!(spec.user.as_deref(), Some("bob"));
    assert_eq!(spec.uid.as_deref(), Some("b0b"));
    assert_eq!(spec.groups.unwrap(), ["viewers", "system:authenticated"]);
    assert_eq!(spec.extra.unwrap()["scopes"], ["read"]);
    let attributes = spec.resource_attributes.unwrap();
    assert_eq!(attributes.verb.as_deref(), Some("get"));
    assert_eq!(attributes.resource.as_deref(), Some("nodes"));
    assert_eq!(attributes.subresource.as_deref(), Some("stats"));
    assert_eq!(attributes.name.as_deref(), Some(NODE));
    assert_eq!(attributes.version.as_deref(), Some("v1"));
    assert_eq!(attributes.namespace, None);

    let denial = auth
        .check(&with_token(
            request(Method::POST, "/exec/default/web/app?command=sh"),
            "good",
        ))
        .await
        .unwrap_err();
    assert_eq!(denial.status, StatusCode::FORBIDDEN);
    assert_eq!(
        denial.message,
        "Forbidden (user=bob, verb=create, resource=nodes, subresource=proxy): no RBAC policy matched"
    );
}

#[tokio::test]
async fn fine_grained_subresources_fall_back_to_proxy() {
    let double = ApiServerDouble::start().await;
    let auth = auth(
        &double,
        settings(
            false,
            None,
            webhook_authorization(DEFAULT_CACHE_AUTHORIZED_TTL, DEFAULT_CACHE_UNAUTHORIZED_TTL),
        ),
    )
    .await;
    let pods = with_certificate(request(Method::GET, "/pods"), "carol", &[]);

    double.allow_user("carol", "get", "proxy");
    auth.check(&pods).await.unwrap();
    assert_eq!(
        double.subject_access_reviews(),
        2,
        "pods denied, then proxy allowed"
    );

    let healthz = with_certificate(request(Method::GET, "/healthz"), "dave", &[]);
    double.allow_user("dave", "get", "healthz");
    auth.check(&healthz).await.unwrap();
    assert_eq!(
        double.subject_access_reviews(),
        3,
        "healthz allowed at once"
    );

    let configz = with_certificate(request(Method::GET, "/configz"), "erin", &[]);
    let denial = auth.check(&configz).await.unwrap_err();
    assert_eq!(
        denial.message,
        "Forbidden (user=erin, verb=get, resource=nodes, subresource=configz)"
    );
}

#[tokio::test]
async fn denials_are_cached_for_the_unauthorized_ttl_then_asked_again() {
    let double = ApiServerDouble::start().await;
    let auth = auth(
        &double,
        settings(
            false,
            None,
            webhook_authorization(DEFAULT_CACHE_AUTHORIZED_TTL, Duration::from_secs(1)),
        ),
    )
    .await;
    let request = with_certificate(request(Method::GET, "/stats/summary"), "frank", &[]);

    assert_eq!(
        auth.check(&request).await.unwrap_err().status,
        StatusCode::FORBIDDEN
    );
    double.allow_user("frank", "get", "stats");
    assert_eq!(
        auth.check(&request).await.unwrap_err().status,
        StatusCode::FORBIDDEN,
        "the denial is still cached"
    );
    assert_eq!(double.subject_access_reviews(), 1);

    tokio::time::sleep(Duration::from_millis(1200)).await;
    auth.check(&request).await.unwrap();
    assert_eq!(double.subject_access_reviews(), 2);

    double.revoke_all();
    auth.check(&request).await.unwrap();
    assert_eq!(
        double.subject_access_reviews(),
        2,
        "the approval is cached for the authorized TTL"
    );
}

#[tokio::test]
async fn api_server_trouble_is_401_or_403_never_500_and_is_not_cached() {
    let double = ApiServerDouble::start().await;
    double.add_token("good", user("bob", &[]));
    double.allow_user("bob", "get", "stats");
    double.allow_user("alice", "get", "stats");
    let client = client(double.kubeconfig(), Duration::from_secs(2)).await;
    let auth = KubeletAuth::new(
        settings(
            false,
            Some(DEFAULT_WEBHOOK_CACHE_TTL),
            webhook_authorization(DEFAULT_CACHE_AUTHORIZED_TTL, DEFAULT_CACHE_UNAUTHORIZED_TTL),
        ),
        Some(client),
    )
    .unwrap();
    let by_token = with_token(request(Method::GET, "/stats/summary"), "good");
    let by_certificate = with_certificate(request(Method::GET, "/stats/summary"), "alice", &[]);

    for failure in [Failure::Unavailable, Failure::Close, Failure::Garbage] {
        double.set_failure(failure);
        let denial = auth.check(&by_token).await.unwrap_err();
        assert_eq!(denial.status, StatusCode::UNAUTHORIZED, "{failure:?}");
        let denial = auth.check(&by_certificate).await.unwrap_err();
        assert_eq!(denial.status, StatusCode::FORBIDDEN, "{failure:?}");
        assert!(
            denial.message.starts_with(
                "Forbidden (user=alice, verb=get, resource=nodes, subresource=stats): "
            ) && denial.message.contains("could not be reached"),
            "{failure:?}: {}",
            denial.message
        );
    }

    double.set_failure(Failure::None);
    auth.check(&by_token).await.unwrap();
    auth.check(&by_certificate).await.unwrap();

    let fresh = with_token(request(Method::GET, "/stats/summary"), "other");
    double.stop();
    assert_eq!(
        auth.check(&fresh).await.unwrap_err().status,
        StatusCode::UNAUTHORIZED
    );
    let stranger = with_certificate(request(Method::GET, "/stats/summary"), "zed", &[]);
    assert_eq!(
        auth.check(&stranger).await.unwrap_err().status,
        StatusCode::FORBIDDEN
    );
    // What was decided before the outage still holds from the caches.
    auth.check(&by_token).await.unwrap();
}

#[tokio::test]
async fn an_api_server_that_never_answers_times_out() {
    let double = ApiServerDouble::start().await;
    double.add_token("good", user("bob", &[]));
    double.set_failure(Failure::Hang);
    let client = client(double.kubeconfig(), Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let error = Api::<TokenReview>::all(client.client())
        .create(&PostParams::default(), &token_review("good"))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the request timeout did not end the request: {error}"
    );
    let text = client.describe("create a TokenReview", &error);
    assert!(
        text.contains("cannot reach the API server") && text.contains(&double.url()),
        "{text}"
    );

    let auth = KubeletAuth::new(
        settings(
            false,
            Some(DEFAULT_WEBHOOK_CACHE_TTL),
            AuthorizationMode::AlwaysAllow,
        ),
        Some(client),
    )
    .unwrap();
    let denial = auth
        .check(&with_token(request(Method::GET, "/pods"), "good"))
        .await
        .unwrap_err();
    assert_eq!(denial.status, StatusCode::UNAUTHORIZED);
}

fn token_review(token: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: None,
        },
        ..TokenReview::default()
    }
}

#[tokio::test]
async fn request_mapping_reaches_the_authorizer() {
    let double = ApiServerDouble::start().await;
    let auth = auth(
        &double,
        settings(
            false,
            None,
            webhook_authorization(DEFAULT_CACHE_AUTHORIZED_TTL, DEFAULT_CACHE_UNAUTHORIZED_TTL),
        ),
    )
    .await;
    let table = [
        (Method::GET, "/stats/summary", "get", "stats"),
        (Method::POST, "/stats/container", "create", "stats"),
        (Method::GET, "/metrics", "get", "metrics"),
        (Method::GET, "/metrics/cadvisor", "get", "metrics"),
        (Method::GET, "/metrics/probes", "get", "metrics"),
        (Method::GET, "/logs/", "get", "log"),
        (Method::GET, "/logs/messages", "get", "log"),
        (Method::GET, "/spec/", "get", "spec"),
        (Method::GET, "/pods", "get", "pods"),
        (Method::GET, "/healthz", "get", "healthz"),
        (Method::HEAD, "/healthz/syncloop", "get", "healthz"),
        (Method::GET, "/configz", "get", "configz"),
        (Method::GET, "/exec/ns/pod/c?command=ls", "get", "proxy"),
        (Method::POST, "/exec/ns/pod/c?command=ls", "create", "proxy"),
        (Method::POST, "/attach/ns/pod/c", "create", "proxy"),
        (Method::POST, "/portForward/ns/pod", "create", "proxy"),
        (Method::GET, "/containerLogs/ns/pod/c", "get", "proxy"),
        (Method::POST, "/run/ns/pod/c", "create", "proxy"),
        (Method::GET, "/runningpods/", "get", "proxy"),
        (Method::GET, "/debug/pprof/profile", "get", "proxy"),
        (Method::PUT, "/anything", "update", "proxy"),
        (Method::PATCH, "/anything", "patch", "proxy"),
        (Method::DELETE, "/anything", "delete", "proxy"),
        (Method::OPTIONS, "/anything", "options", "proxy"),
        (Method::GET, "/stats/../exec/ns/pod/c", "get", "proxy"),
    ];
    let table_len = table.len();
    // A user per row, so no decision comes from the cache.
    for (row, (method, path, verb, subresource)) in table.into_iter().enumerate() {
        let user = format!("mapper-{row}");
        double.allow_user(&user, verb, subresource);
        let request = with_certificate(request(method.clone(), path), &user, &[]);
        auth.check(&request)
            .await
            .unwrap_or_else(|denial| panic!("{method} {path}: {denial:?}"));
        let attributes = double
            .last_subject_access_review()
            .unwrap()
            .resource_attributes
            .unwrap();
        assert_eq!(
            (
                attributes.verb.as_deref(),
                attributes.subresource.as_deref()
            ),
            (Some(verb), Some(subresource)),
            "{method} {path}"
        );
    }
    assert_eq!(double.subject_access_reviews(), table_len);
}

#[tokio::test]
async fn api_server_client_from_every_kind_of_kubeconfig() {
    let double = ApiServerDouble::start().await;
    double.add_token("good", user("bob", &[]));

    let certificate = double.write_kubeconfig(
        "cert",
        &KubeconfigUser::ClientCertificate("system:node:node-a".to_owned()),
    );
    let token_file = double.write_kubeconfig(
        "file",
        &KubeconfigUser::TokenFile(support::apiserver::AGENT_TOKEN.to_owned()),
    );
    for kubeconfig in [&certificate, &token_file] {
        let client = client(kubeconfig, REQUEST_TIMEOUT).await;
        let answer = Api::<TokenReview>::all(client.client())
            .create(&PostParams::default(), &token_review("good"))
            .await
            .unwrap();
        let status = answer.status.unwrap();
        assert_eq!(status.authenticated, Some(true));
        assert_eq!(status.user.unwrap().username.as_deref(), Some("bob"));
    }
    assert_eq!(
        double.callers(),
        ["cn:system:node:node-a", "token:ringlet-node-token"]
    );
    assert_eq!(
        client(&certificate, REQUEST_TIMEOUT).await.identity(),
        "the client certificate of user \"system:node:node-a\""
    );

    let wrong = double.write_kubeconfig("wrong", &KubeconfigUser::Token("nope".to_owned()));
    let client = client(&wrong, REQUEST_TIMEOUT).await;
    let error = Api::<TokenReview>::all(client.client())
        .create(&PostParams::default(), &token_review("good"))
        .await
        .unwrap_err();
    let text = client.describe("create a TokenReview", &error);
    assert!(
        text.contains(&double.url())
            && text.contains("401")
            && text.contains(&format!("the bearer token of {}", wrong.display())),
        "{text}"
    );
}

#[tokio::test]
async fn api_server_client_reports_the_status_of_a_refused_create() {
    let double = ApiServerDouble::start().await;
    let client = client(double.kubeconfig(), REQUEST_TIMEOUT).await;
    let reviews = Api::<TokenReview>::all(client.client());

    let error = reviews
        .create(&PostParams::default(), &TokenReview::default())
        .await
        .unwrap_err();
    let text = client.describe("create a TokenReview", &error);
    assert_eq!(
        text,
        "create a TokenReview: the API server answered 400 BadRequest: token is required for TokenReview in authentication",
    );

    double.set_failure(Failure::Garbage);
    let error = reviews
        .create(&PostParams::default(), &token_review("x"))
        .await
        .unwrap_err();
    assert!(matches!(error, kube::Error::SerdeError(_)), "{error:?}");
}

#[tokio::test]
async fn kubeconfig_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent");
    let error = ApiClient::from_kubeconfig(&missing, ApiClientOptions::default())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("absent"), "{error}");

    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        "current-context: c\ncontexts:\n- name: c\n  context: {cluster: x, user: u}\nclusters:\n- name: x\n  cluster: {server: 'https://127.0.0.1:1', certificate-authority: ca.pem}\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    let error = ApiClient::from_kubeconfig(&path, ApiClientOptions::default())
        .await
        .unwrap_err();
    let text = ringlet::error_chain::error_chain(&error);
    assert!(text.contains("ca.pem"), "{text}");

    std::fs::write(
        &path,
        "current-context: c\ncontexts:\n- name: c\n  context: {cluster: x, user: u}\nclusters:\n- name: x\n  cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    let error = ApiClient::from_kubeconfig(&path, ApiClientOptions::default())
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("insecure-skip-tls-verify is not allowed"),
        "{error}"
    );

    std::fs::write(dir.path().join("token"), "t\n").unwrap();
    std::fs::write(
        &path,
        "current-context: c\ncontexts:\n- name: c\n  context: {cluster: x, user: u}\nclusters:\n- name: x\n  cluster: {server: 'https://127.0.0.1:1'}\nusers:\n- name: u\n  user: {tokenFile: token}\n",
    )
    .unwrap();
    let error = ApiClient::from_kubeconfig(&path, ApiClientOptions::default())
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("ends with whitespace or a newline"),
        "{error}"
    );
}
