//! Service account tokens for the pods' projected volumes (the kubelet's `pkg/kubelet/token`): a
//! token is requested through the API server's `TokenRequest` (`serviceaccounts/<name>/token`) for
//! the pod's service account, with the volume's audience and expiry and bound to the pod (name and
//! UID), so it dies with the pod. It is cached per request and pod, and requested again once 80 % of
//! its lifetime has passed or it is 24 h old (each with up to 10 s of jitter, so a node's tokens do
//! not all renew in the same second); while a renewal fails, the old token is served until it
//! expires. Expired entries and the entries of removed pods are dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;

use crate::apiserver::ApiClient;
use crate::container::PodUid;

/// A token is renewed at the latest when it is this old.
const MAX_TTL: Duration = Duration::from_hours(24);
/// Renewals are spread over up to this much time.
const MAX_JITTER: Duration = Duration::from_secs(10);

/// Why no token could be handed out.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("failed to fetch token: {0}")]
    Fetch(String),
    #[error("token {key} expired and refresh failed: {reason}")]
    ExpiredAndRefreshFailed { key: String, reason: String },
}

/// What a projected volume asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenSpec {
    pub namespace: String,
    pub service_account: String,
    /// Empty for the API server's own audiences.
    pub audience: String,
    pub expiration_seconds: Option<i64>,
    pub pod_name: String,
    pub pod_uid: String,
}

impl TokenSpec {
    /// A key that names the request without the token (safe to log).
    fn key(&self) -> String {
        format!(
            "{:?}/{:?}/{:?}/{:?}/{:?}/{:?}",
            self.service_account,
            self.namespace,
            self.audience,
            self.expiration_seconds.unwrap_or(0),
            self.pod_name,
            self.pod_uid
        )
    }

    fn request(&self) -> TokenRequest {
        TokenRequest {
            spec: TokenRequestSpec {
                audiences: if self.audience.is_empty() {
                    Vec::new()
                } else {
                    vec![self.audience.clone()]
                },
                expiration_seconds: self.expiration_seconds,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    name: Some(self.pod_name.clone()),
                    uid: Some(self.pod_uid.clone()),
                }),
            },
            ..TokenRequest::default()
        }
    }
}

/// Where tokens come from: the API server, or a fake in tests.
#[async_trait]
trait TokenSource: Send + Sync {
    /// `TokenRequest` for service account `name` in `namespace`; errors are one line.
    async fn request(
        &self,
        namespace: &str,
        name: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, String>;
}

struct ApiTokenSource {
    client: ApiClient,
}

#[async_trait]
impl TokenSource for ApiTokenSource {
    async fn request(
        &self,
        namespace: &str,
        name: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, String> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.client(), namespace);
        accounts
            .create_token_request(name, &PostParams::default(), request)
            .await
            .map_err(|err| {
                self.client.describe(
                    &format!("create serviceaccounts/{namespace}/{name}/token"),
                    &err,
                )
            })
    }
}

/// A token as issued.
#[derive(Clone, Debug)]
struct Issued {
    token: String,
    expires: SystemTime,
    /// The lifetime asked for (`spec.expirationSeconds` of the answer).
    expiration_seconds: Option<i64>,
    pod_uid: String,
}

type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;
type Jitter = Arc<dyn Fn() -> Duration + Send + Sync>;

struct Inner {
    source: Box<dyn TokenSource>,
    cache: Mutex<HashMap<String, Issued>>,
    clock: Clock,
    jitter: Jitter,
}

/// The node's service account tokens. Cheap to clone.
#[derive(Clone)]
pub struct TokenManager {
    inner: Arc<Inner>,
}

impl TokenManager {
    pub fn new(client: ApiClient) -> Self {
        Self::with(
            Box::new(ApiTokenSource { client }),
            Arc::new(SystemTime::now),
            Arc::new(random_jitter),
        )
    }

    fn with(source: Box<dyn TokenSource>, clock: Clock, jitter: Jitter) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                cache: Mutex::new(HashMap::new()),
                clock,
                jitter,
            }),
        }
    }

    fn cache(&self) -> MutexGuard<'_, HashMap<String, Issued>> {
        self.inner
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The token for `spec`: the cached one while it needs no renewal, else a new one; the cached
    /// one again when renewing fails and it has not expired.
    pub async fn get(&self, spec: &TokenSpec) -> Result<String, TokenError> {
        let key = spec.key();
        let now = (self.inner.clock)();
        let cached = {
            let mut cache = self.cache();
            cache.retain(|_, issued| now <= issued.expires);
            cache.get(&key).cloned()
        };
        if let Some(issued) = &cached
            && !requires_refresh(now, issued, (self.inner.jitter)())
        {
            return Ok(issued.token.clone());
        }
        let answer = self
            .inner
            .source
            .request(&spec.namespace, &spec.service_account, &spec.request())
            .await;
        let issued = answer.and_then(|answer| {
            issued(answer, spec)
                .ok_or_else(|| "the API server's answer has no expiration timestamp".to_owned())
        });
        let issued = match issued {
            Ok(issued) => issued,
            Err(reason) => {
                return match cached {
                    None => Err(TokenError::Fetch(reason)),
                    Some(old) if (self.inner.clock)() > old.expires => {
                        Err(TokenError::ExpiredAndRefreshFailed { key, reason })
                    }
                    Some(old) => {
                        tracing::warn!(key, %reason, "couldn't update token; the current one is still valid");
                        Ok(old.token)
                    }
                };
            }
        };
        let token = issued.token.clone();
        self.cache().insert(key, issued);
        Ok(token)
    }

    /// Drops the tokens bound to a removed pod.
    pub fn forget_pod(&self, uid: &PodUid) {
        self.cache()
            .retain(|_, issued| issued.pod_uid != uid.as_str());
    }
}

fn issued(answer: TokenRequest, spec: &TokenSpec) -> Option<Issued> {
    let status = answer.status?;
    let seconds = status.expiration_timestamp.0.as_second();
    let expires = UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).ok()?);
    Some(Issued {
        token: status.token,
        expires,
        expiration_seconds: answer.spec.expiration_seconds,
        pod_uid: spec.pod_uid.clone(),
    })
}

/// Whether a token must be renewed: 24 h after it was issued, or once 80 % of its lifetime has
/// passed, each brought forward by `jitter` (the kubelet's `requiresRefresh`). A token whose
/// lifetime is unknown is kept until it expires.
fn requires_refresh(now: SystemTime, issued: &Issued, jitter: Duration) -> bool {
    let Some(seconds) = issued
        .expiration_seconds
        .and_then(|s| u64::try_from(s).ok())
    else {
        return false;
    };
    let lifetime = Duration::from_secs(seconds);
    let issued_at = issued.expires.checked_sub(lifetime).unwrap_or(UNIX_EPOCH);
    if now > issued_at + MAX_TTL.saturating_sub(jitter) {
        return true;
    }
    let remaining_at_refresh = Duration::from_secs(seconds * 20 / 100) + jitter;
    let refresh_at = issued
        .expires
        .checked_sub(remaining_at_refresh)
        .unwrap_or(UNIX_EPOCH);
    now > refresh_at
}

/// A random delay below [`MAX_JITTER`], from the standard library's randomly seeded hasher.
fn random_jitter() -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    let max = u64::try_from(MAX_JITTER.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(hasher.finish() % max)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use k8s_openapi::api::authentication::v1::TokenRequestStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    const START: u64 = 1_800_000_000;

    /// Issues `token-<n>` valid for the requested seconds from the clock's time; fails while
    /// `failing` is set.
    struct FakeSource {
        now: Arc<Mutex<SystemTime>>,
        issued: AtomicU32,
        failing: Arc<Mutex<bool>>,
        requests: Arc<Mutex<Vec<TokenRequest>>>,
    }

    #[async_trait]
    impl TokenSource for FakeSource {
        async fn request(
            &self,
            _namespace: &str,
            _name: &str,
            request: &TokenRequest,
        ) -> Result<TokenRequest, String> {
            self.requests.lock().unwrap().push(request.clone());
            if *self.failing.lock().unwrap() {
                return Err("the API server is away".to_owned());
            }
            let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
            let seconds = request.spec.expiration_seconds.unwrap_or(3600);
            let now = *self.now.lock().unwrap();
            let expires = now + Duration::from_secs(u64::try_from(seconds).unwrap());
            let at = jiff::Timestamp::from_second(
                i64::try_from(expires.duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap(),
            )
            .unwrap();
            Ok(TokenRequest {
                spec: request.spec.clone(),
                status: Some(TokenRequestStatus {
                    token: format!("token-{n}"),
                    expiration_timestamp: Time(at),
                }),
                ..TokenRequest::default()
            })
        }
    }

    struct Setup {
        manager: TokenManager,
        now: Arc<Mutex<SystemTime>>,
        failing: Arc<Mutex<bool>>,
        requests: Arc<Mutex<Vec<TokenRequest>>>,
    }

    impl Setup {
        fn new() -> Self {
            let now = Arc::new(Mutex::new(UNIX_EPOCH + Duration::from_secs(START)));
            let failing = Arc::new(Mutex::new(false));
            let requests = Arc::new(Mutex::new(Vec::new()));
            let clock_now = Arc::clone(&now);
            let manager = TokenManager::with(
                Box::new(FakeSource {
                    now: Arc::clone(&now),
                    issued: AtomicU32::new(0),
                    failing: Arc::clone(&failing),
                    requests: Arc::clone(&requests),
                }),
                Arc::new(move || *clock_now.lock().unwrap()),
                Arc::new(|| Duration::ZERO),
            );
            Self {
                manager,
                now,
                failing,
                requests,
            }
        }

        fn advance(&self, by: Duration) {
            *self.now.lock().unwrap() += by;
        }
    }

    fn spec(expiration_seconds: i64) -> TokenSpec {
        TokenSpec {
            namespace: "ns".to_owned(),
            service_account: "default".to_owned(),
            audience: "vault".to_owned(),
            expiration_seconds: Some(expiration_seconds),
            pod_name: "web".to_owned(),
            pod_uid: "uid-1".to_owned(),
        }
    }

    #[tokio::test]
    async fn the_request_names_the_audience_expiry_and_pod() {
        let setup = Setup::new();
        assert_eq!(setup.manager.get(&spec(600)).await.unwrap(), "token-1");
        let requests = setup.requests.lock().unwrap();
        let request = &requests[0].spec;
        assert_eq!(request.audiences, ["vault"]);
        assert_eq!(request.expiration_seconds, Some(600));
        let bound = request.bound_object_ref.as_ref().unwrap();
        assert_eq!(bound.kind.as_deref(), Some("Pod"));
        assert_eq!(bound.api_version.as_deref(), Some("v1"));
        assert_eq!(bound.name.as_deref(), Some("web"));
        assert_eq!(bound.uid.as_deref(), Some("uid-1"));
    }

    #[tokio::test]
    async fn a_token_is_renewed_once_80_percent_of_its_lifetime_has_passed() {
        let setup = Setup::new();
        let spec = spec(600);
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-1");
        setup.advance(Duration::from_secs(479));
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-1");
        setup.advance(Duration::from_secs(2));
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-2");
        assert_eq!(setup.requests.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_long_lived_token_is_renewed_after_24_hours() {
        let setup = Setup::new();
        let spec = spec(7 * 24 * 3600);
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-1");
        setup.advance(Duration::from_hours(23));
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-1");
        setup.advance(Duration::from_hours(1) + Duration::from_secs(1));
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-2");
    }

    #[test]
    fn jitter_brings_the_renewal_forward() {
        let issued = Issued {
            token: String::new(),
            expires: UNIX_EPOCH + Duration::from_secs(START + 600),
            expiration_seconds: Some(600),
            pod_uid: String::new(),
        };
        let at = |secs| UNIX_EPOCH + Duration::from_secs(START + secs);
        assert!(!requires_refresh(at(475), &issued, Duration::ZERO));
        assert!(requires_refresh(at(475), &issued, MAX_JITTER));
        let unknown = Issued {
            expiration_seconds: None,
            ..issued
        };
        assert!(!requires_refresh(at(599), &unknown, MAX_JITTER));
        for _ in 0..100 {
            assert!(random_jitter() < MAX_JITTER);
        }
    }

    #[tokio::test]
    async fn a_failed_renewal_serves_the_old_token_until_it_expires() {
        let setup = Setup::new();
        let spec = spec(600);
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-1");
        *setup.failing.lock().unwrap() = true;
        setup.advance(Duration::from_secs(500));
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-1");
        setup.advance(Duration::from_secs(101));
        let err = setup.manager.get(&spec).await.unwrap_err();
        assert_eq!(
            err,
            TokenError::Fetch("the API server is away".to_owned()),
            "an expired token is dropped from the cache"
        );
        *setup.failing.lock().unwrap() = false;
        assert_eq!(setup.manager.get(&spec).await.unwrap(), "token-2");
    }

    #[tokio::test]
    async fn tokens_are_per_pod_and_forgotten_with_it() {
        let setup = Setup::new();
        let first = spec(600);
        let other_pod = TokenSpec {
            pod_uid: "uid-2".to_owned(),
            ..first.clone()
        };
        assert_eq!(setup.manager.get(&first).await.unwrap(), "token-1");
        assert_eq!(setup.manager.get(&other_pod).await.unwrap(), "token-2");
        setup.manager.forget_pod(&PodUid::from("uid-1"));
        assert_eq!(setup.manager.get(&first).await.unwrap(), "token-3");
        assert_eq!(setup.manager.get(&other_pod).await.unwrap(), "token-2");
        assert!(!first.key().contains("token"), "keys never carry tokens");
    }
}
