//! The API-server webhooks behind bearer-token authentication and authorisation (k8s.io/apiserver's
//! `plugin/pkg/authenticator/token/webhook` and `plugin/pkg/authorizer/webhook`, as the kubelet's
//! `authenticatorfactory`/`authorizerfactory` delegating configs set them up): a `TokenReview` or
//! `SubjectAccessReview` is created on the API server and its `status` is the answer.
//!
//! Definite answers are cached (tokens for `cacheTTL`; decisions for `cacheAuthorizedTTL` or
//! `cacheUnauthorizedTTL`); failures to get an answer are not, so an outage ends with the outage.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

use super::UserInfo;
use super::attributes::Attributes;
use super::cache::{self, TtlCache};
use kube::api::{Api, PostParams};

use crate::apiserver::ApiClient;

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The request failed; `message` names the action, the identity and the API server's answer.
    #[error("{message}")]
    Request { message: String },
    #[error("the API server answered a {kind} without a status")]
    NoStatus { kind: &'static str },
    #[error("the API server authenticated a token but named no user")]
    NoUsername,
    #[error("encoding the SubjectAccessReview spec as the cache key")]
    EncodeKey {
        #[source]
        source: serde_json::Error,
    },
}

/// What the API server said about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TokenOutcome {
    Authenticated(UserInfo),
    /// `status.error` when the API server gave one.
    Rejected(String),
}

pub(crate) struct TokenAuthenticator {
    client: ApiClient,
    cache: TtlCache<TokenOutcome>,
    ttl: Duration,
}

impl TokenAuthenticator {
    pub(crate) fn new(client: ApiClient, ttl: Duration) -> Self {
        Self {
            client,
            cache: TtlCache::new(),
            ttl,
        }
    }

    pub(crate) async fn authenticate(&self, token: &str) -> Result<TokenOutcome, WebhookError> {
        let key = cache::key(token.as_bytes());
        if let Some(outcome) = self.cache.get(&key) {
            return Ok(outcome);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.client())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| WebhookError::Request {
                message: self.client.describe("create a TokenReview", &err),
            })?;
        let status = answer.status.ok_or(WebhookError::NoStatus {
            kind: "TokenReview",
        })?;
        let outcome = if status.authenticated == Some(true) {
            let user = status.user.unwrap_or_default();
            let name = user.username.filter(|name| !name.is_empty());
            TokenOutcome::Authenticated(UserInfo {
                name: name.ok_or(WebhookError::NoUsername)?,
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            })
        } else {
            TokenOutcome::Rejected(status.error.unwrap_or_default())
        };
        self.cache.insert(key, outcome.clone(), self.ttl);
        Ok(outcome)
    }
}

/// What the API server decided about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Allow,
    /// Denied or no opinion (the kubelet has no other authorizer, so both refuse); the reason the
    /// API server gave, possibly empty.
    Deny(String),
}

pub(crate) struct SubjectAccessReviewer {
    client: ApiClient,
    cache: TtlCache<Decision>,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
}

impl SubjectAccessReviewer {
    pub(crate) fn new(
        client: ApiClient,
        authorized_ttl: Duration,
        unauthorized_ttl: Duration,
    ) -> Self {
        Self {
            client,
            cache: TtlCache::new(),
            authorized_ttl,
            unauthorized_ttl,
        }
    }

    pub(crate) async fn authorize(
        &self,
        user: &UserInfo,
        attributes: &Attributes,
    ) -> Result<Decision, WebhookError> {
        let spec = SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: Some(user.uid.clone()).filter(|uid| !uid.is_empty()),
            groups: Some(user.groups.clone()).filter(|groups| !groups.is_empty()),
            extra: Some(user.extra.clone()).filter(|extra| !extra.is_empty()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(attributes.verb.clone()),
                version: Some("v1".to_owned()),
                resource: Some(attributes.resource.to_owned()),
                subresource: Some(attributes.subresource.to_owned()),
                name: Some(attributes.name.clone()),
                ..ResourceAttributes::default()
            }),
            non_resource_attributes: None,
        };
        // The spec holds everything the decision depends on (extra is a BTreeMap, so the encoding is
        // stable).
        let key = cache::key(
            &serde_json::to_vec(&spec).map_err(|source| WebhookError::EncodeKey { source })?,
        );
        if let Some(decision) = self.cache.get(&key) {
            return Ok(decision);
        }
        let review = SubjectAccessReview {
            spec,
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.client())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| WebhookError::Request {
                message: self.client.describe("create a SubjectAccessReview", &err),
            })?;
        let status = answer.status.ok_or(WebhookError::NoStatus {
            kind: "SubjectAccessReview",
        })?;
        if let Some(error) = status.evaluation_error.filter(|error| !error.is_empty()) {
            tracing::warn!(user = %user.name, %error, "the authorizer reported an evaluation error");
        }
        let (decision, ttl) = if status.allowed {
            (Decision::Allow, self.authorized_ttl)
        } else {
            (
                Decision::Deny(status.reason.unwrap_or_default()),
                self.unauthorized_ttl,
            )
        };
        self.cache.insert(key, decision.clone(), ttl);
        Ok(decision)
    }
}
