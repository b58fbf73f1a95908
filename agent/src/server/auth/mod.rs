//! Authentication and authorisation of the kubelet API port (10250), as the kubelet's
//! `pkg/kubelet/server/auth.go` and `cmd/kubelet/app/auth.go` set them up from k8s.io/apiserver's
//! delegating authenticator and authorizer.
//!
//! Authentication tries, in order, the verified client certificate (`x509`), then an
//! `Authorization: Bearer` token reviewed by the API server (when `authentication.webhook.enabled`),
//! then anonymous (when `authentication.anonymous.enabled`). A certificate or token that fails is a
//! 401 even with anonymous enabled: a bad credential is never silently downgraded. Authenticated
//! users get the `system:authenticated` group.
//!
//! Authorisation is `AlwaysAllow` or a `SubjectAccessReview` for verb + `nodes/<subresource>` named
//! after this node ([`attributes`]). Unlike the kubelet, which answers 500 when the authorizer fails,
//! an unreachable or confused API server is a 403 (and a 401 for authentication): the cause goes to
//! the log, never to the client.
//!
//! Webhook answers are cached (`webhook`); unlike k8s.io/apiserver there is no retry with back-off
//! and concurrent identical reviews are not merged, so a burst of new tokens costs one review each.

pub mod attributes;
mod cache;
mod webhook;
mod x509;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::{Method, Request, StatusCode};

use crate::apiserver::ApiClient;
use crate::error_chain::error_chain;
use crate::server::PeerCertificates;
use attributes::Attributes;
use webhook::{Decision, SubjectAccessReviewer, TokenAuthenticator, TokenOutcome};

/// `authentication.webhook.cacheTTL` default.
pub const DEFAULT_WEBHOOK_CACHE_TTL: Duration = Duration::from_mins(2);
/// `authorization.webhook.cacheAuthorizedTTL` default.
pub const DEFAULT_CACHE_AUTHORIZED_TTL: Duration = Duration::from_mins(5);
/// `authorization.webhook.cacheUnauthorizedTTL` default.
pub const DEFAULT_CACHE_UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);

const ANONYMOUS_USER: &str = "system:anonymous";
const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The 403 reason when the authorizer gave no answer; the cause is logged, not sent to the client.
const UNREACHABLE_AUTHORIZER: &str =
    "the authorizer (SubjectAccessReview on the API server) could not be reached";

/// The `authentication` and `authorization` parts of the `KubeletConfiguration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthSettings {
    /// `authentication.anonymous.enabled` (ringlet's default: false).
    pub anonymous_enabled: bool,
    /// `authentication.webhook.enabled`, with its `cacheTTL` when enabled.
    pub webhook_authentication: Option<Duration>,
    /// `authorization.mode`.
    pub authorization: AuthorizationMode,
    /// The node's name: the `nodes` object every request is authorised against.
    pub node_name: String,
}

/// `authorization.mode` and, for `Webhook`, `authorization.webhook.*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    Webhook {
        cache_authorized_ttl: Duration,
        cache_unauthorized_ttl: Duration,
    },
}

/// An authenticated user (k8s.io/apiserver's `user.Info`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is refused: 401 or 403 with a plain-text body for the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub status: StatusCode,
    pub message: String,
}

impl Denial {
    fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "Unauthorized".to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{fields} needs the API server, but no API server client was given (set --kubeconfig)")]
    NoApiServer { fields: &'static str },
    #[error("authorization.mode Webhook needs the node name, which is empty")]
    NoNodeName,
}

/// The authenticator and authorizer of the kubelet API. Cheap to clone.
#[derive(Clone)]
pub struct KubeletAuth {
    inner: Arc<Inner>,
}

struct Inner {
    anonymous_enabled: bool,
    tokens: Option<TokenAuthenticator>,
    authorizer: Option<SubjectAccessReviewer>,
    node_name: String,
}

impl std::fmt::Debug for KubeletAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletAuth")
            .field("anonymous_enabled", &self.inner.anonymous_enabled)
            .field("webhook_authentication", &self.inner.tokens.is_some())
            .field("webhook_authorization", &self.inner.authorizer.is_some())
            .field("node_name", &self.inner.node_name)
            .finish()
    }
}

impl KubeletAuth {
    /// Sets up authentication and authorisation; `api_server` is required when either webhook is on.
    pub fn new(settings: AuthSettings, api_server: Option<ApiClient>) -> Result<Self, AuthError> {
        let tokens = match settings.webhook_authentication {
            None => None,
            Some(ttl) => {
                let client = api_server.clone().ok_or(AuthError::NoApiServer {
                    fields: "authentication.webhook.enabled",
                })?;
                Some(TokenAuthenticator::new(client, ttl))
            }
        };
        let authorizer = match settings.authorization {
            AuthorizationMode::AlwaysAllow => None,
            AuthorizationMode::Webhook {
                cache_authorized_ttl,
                cache_unauthorized_ttl,
            } => {
                let client = api_server.ok_or(AuthError::NoApiServer {
                    fields: "authorization.mode: Webhook",
                })?;
                if settings.node_name.is_empty() {
                    return Err(AuthError::NoNodeName);
                }
                Some(SubjectAccessReviewer::new(
                    client,
                    cache_authorized_ttl,
                    cache_unauthorized_ttl,
                ))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                anonymous_enabled: settings.anonymous_enabled,
                tokens,
                authorizer,
                node_name: settings.node_name,
            }),
        })
    }

    /// Authenticates and then authorises `request`; the user on success, the response to send
    /// otherwise. The future owns what it needs from the request (it is `Send` and `'static`
    /// whatever the body type).
    pub fn check<B>(
        &self,
        request: &Request<B>,
    ) -> impl Future<Output = Result<UserInfo, Denial>> + Send + 'static {
        let this = self.clone();
        let facts = RequestFacts::of(request);
        async move {
            let user = this.authenticate_facts(&facts).await?;
            this.authorize_facts(&user, &facts).await?;
            Ok(user)
        }
    }

    /// Who sent `request`; a 401 [`Denial`] when nobody acceptable did.
    pub fn authenticate<B>(
        &self,
        request: &Request<B>,
    ) -> impl Future<Output = Result<UserInfo, Denial>> + Send + 'static {
        let this = self.clone();
        let facts = RequestFacts::of(request);
        async move { this.authenticate_facts(&facts).await }
    }

    /// Whether `user` may make `request`; a 403 [`Denial`] naming what was refused when not.
    pub fn authorize<B>(
        &self,
        user: &UserInfo,
        request: &Request<B>,
    ) -> impl Future<Output = Result<(), Denial>> + Send + 'static {
        let this = self.clone();
        let user = user.clone();
        let facts = RequestFacts::of(request);
        async move { this.authorize_facts(&user, &facts).await }
    }

    async fn authenticate_facts(&self, facts: &RequestFacts) -> Result<UserInfo, Denial> {
        let mut failed = false;
        match x509::authenticate(facts.peer.as_ref()) {
            Ok(Some(user)) => return Ok(with_authenticated_group(user)),
            Ok(None) => {}
            Err(error) => {
                let error = error_chain(&error);
                tracing::warn!(%error, "client certificate authentication failed");
                failed = true;
            }
        }
        if let (Some(tokens), Some(token)) = (&self.inner.tokens, &facts.token) {
            match tokens.authenticate(token).await {
                Ok(TokenOutcome::Authenticated(user)) => return Ok(with_authenticated_group(user)),
                Ok(TokenOutcome::Rejected(reason)) => {
                    tracing::debug!(%reason, "the API server rejected a bearer token");
                    failed = true;
                }
                Err(error) => {
                    let error = error_chain(&error);
                    tracing::warn!(%error, "bearer token authentication failed");
                    failed = true;
                }
            }
        }
        if self.inner.anonymous_enabled && !failed {
            return Ok(UserInfo {
                name: ANONYMOUS_USER.to_owned(),
                groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
                ..UserInfo::default()
            });
        }
        Err(Denial::unauthorized())
    }

    async fn authorize_facts(&self, user: &UserInfo, facts: &RequestFacts) -> Result<(), Denial> {
        let Some(authorizer) = &self.inner.authorizer else {
            return Ok(());
        };
        let verb = attributes::verb(&facts.method);
        let mut reasons = Vec::new();
        for subresource in attributes::subresources_to_try(&facts.path) {
            let attributes = Attributes {
                verb: verb.clone(),
                resource: "nodes",
                subresource,
                name: self.inner.node_name.clone(),
            };
            match authorizer.authorize(user, &attributes).await {
                Ok(Decision::Allow) => return Ok(()),
                Ok(Decision::Deny(reason)) => {
                    if !reason.is_empty() {
                        reasons.push(reason);
                    }
                }
                Err(error) => {
                    let error = error_chain(&error);
                    tracing::warn!(user = %user.name, %verb, %subresource, %error, "authorization failed");
                    reasons.push(UNREACHABLE_AUTHORIZER.to_owned());
                }
            }
        }
        let mut message = format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource={})",
            user.name,
            attributes::subresource(&facts.path)
        );
        if !reasons.is_empty() {
            message.push_str(": ");
            message.push_str(&reasons.join("; "));
        }
        tracing::debug!(%message, "request refused");
        Err(Denial {
            status: StatusCode::FORBIDDEN,
            message,
        })
    }
}

/// What authentication and authorisation read from a request, taken before the first await so the
/// futures do not borrow the request.
struct RequestFacts {
    method: Method,
    path: String,
    token: Option<String>,
    peer: Option<PeerCertificates>,
}

impl RequestFacts {
    fn of<B>(request: &Request<B>) -> Self {
        Self {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            token: bearer_token(request).map(str::to_owned),
            peer: request.extensions().get::<PeerCertificates>().cloned(),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header, read the way the kubelet's bearer-token
/// authenticator reads it; any other scheme means "no token".
fn bearer_token<B>(request: &Request<B>) -> Option<&str> {
    let header = request.headers().get(AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = header.split(' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    let marked = user
        .groups
        .iter()
        .any(|group| group == AUTHENTICATED_GROUP || group == UNAUTHENTICATED_GROUP);
    if user.name != ANONYMOUS_USER && !marked {
        user.groups.push(AUTHENTICATED_GROUP.to_owned());
    }
    user
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(authorization: &str) -> Request<()> {
        Request::builder()
            .header(AUTHORIZATION, authorization)
            .body(())
            .unwrap()
    }

    #[test]
    fn bearer_tokens_are_read_like_the_kubelet() {
        assert_eq!(bearer_token(&request("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&request("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&request("  Bearer abc extra ")), Some("abc"));
        assert_eq!(bearer_token(&request("Basic abc")), None);
        assert_eq!(bearer_token(&request("Bearer")), None);
        assert_eq!(bearer_token(&request("Bearer  abc")), None);
        assert_eq!(bearer_token(&Request::new(())), None);
    }

    #[test]
    fn authenticated_group_is_added_once() {
        let user = with_authenticated_group(UserInfo {
            name: "alice".to_owned(),
            groups: vec!["devs".to_owned()],
            ..UserInfo::default()
        });
        assert_eq!(user.groups, ["devs", AUTHENTICATED_GROUP]);
        assert_eq!(with_authenticated_group(user.clone()), user);
    }

    #[test]
    fn webhooks_need_an_api_server() {
        let settings = AuthSettings {
            anonymous_enabled: false,
            webhook_authentication: Some(DEFAULT_WEBHOOK_CACHE_TTL),
            authorization: AuthorizationMode::AlwaysAllow,
            node_name: "node-a".to_owned(),
        };
        let error = KubeletAuth::new(settings.clone(), None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("authentication.webhook.enabled"), "{error}");

        let settings = AuthSettings {
            webhook_authentication: None,
            authorization: AuthorizationMode::Webhook {
                cache_authorized_ttl: DEFAULT_CACHE_AUTHORIZED_TTL,
                cache_unauthorized_ttl: DEFAULT_CACHE_UNAUTHORIZED_TTL,
            },
            ..settings
        };
        let error = KubeletAuth::new(settings, None).unwrap_err().to_string();
        assert!(error.contains("authorization.mode"), "{error}");
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled() {
        let settings = AuthSettings {
            anonymous_enabled: true,
            webhook_authentication: None,
            authorization: AuthorizationMode::AlwaysAllow,
            node_name: "node-a".to_owned(),
        };
        let auth = KubeletAuth::new(settings.clone(), None).unwrap();
        let user = auth.check(&Request::new(())).await.unwrap();
        assert_eq!(user.name, ANONYMOUS_USER);
        assert_eq!(user.groups, [UNAUTHENTICATED_GROUP]);

        let auth = KubeletAuth::new(
            AuthSettings {
                anonymous_enabled: false,
                ..settings
            },
            None,
        )
        .unwrap();
        let denial = auth.check(&Request::new(())).await.unwrap_err();
        assert_eq!(denial.status, StatusCode::UNAUTHORIZED);
        assert_eq!(denial.message, "Unauthorized");
    }
}
