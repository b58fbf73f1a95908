//! The ConfigMaps and Secrets the node's pods refer to (the kubelet's `pkg/kubelet/configmap` and
//! `pkg/kubelet/secret` managers over `pkg/kubelet/util/manager`'s watch-based cache, the kubelet's
//! default `configMapAndSecretChangeDetectionStrategy: Watch`). Every object a registered pod refers
//! to (volumes, projected sources, `env`, `envFrom`) is watched on its own, with a
//! `metadata.name=<name>` field selector (the only list/watch the Node authorizer grants a node), from
//! the first pod that refers to it until the last one is gone. A read answers from the watch's copy,
//! so a pod sync costs no API request and sees an update as soon as the watch delivers it; it waits
//! (bounded) only for the first list. [`ApiObjects`] bundles these managers with the token manager
//! and the service store: everything the agent reads from the API server on a pod's behalf.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::apiserver::ApiClient;
use crate::container::PodUid;
use crate::envvars::ServiceStore;
use crate::token::TokenManager;

/// How long a read waits for a new watch's first list (the kubelet waits 1 s; a loaded API server
/// on a small machine can take longer to answer its first list).
const FIRST_LIST_WAIT: Duration = Duration::from_secs(5);
/// How long one watch request lasts on the server (as the pod source's).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// Why an object could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The API server says it does not exist (`configmap "x" not found`, as the kubelet says it).
    #[error("{resource} {name:?} not found")]
    NotFound {
        resource: &'static str,
        name: String,
    },
    /// No pod registered it, so nothing watches it.
    #[error("object {namespace:?}/{name:?} not registered")]
    NotRegistered { namespace: String, name: String },
    /// The watch has not completed its first list (the reason when a request failed).
    #[error("failed to sync {resource} cache: {reason}")]
    NotSynced {
        resource: &'static str,
        reason: String,
    },
}

impl ObjectError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}

/// What a watch knows about its object.
#[derive(Clone, Debug)]
enum Slot<K> {
    /// Before the first complete list; the last request failure, if any.
    Syncing(Option<String>),
    Present(Arc<K>),
    Absent,
}

type ObjectKey = (String, String);

struct Watched<K> {
    pods: usize,
    state: watch::Receiver<Slot<K>>,
    task: AbortHandle,
}

struct State<K> {
    /// What each registered pod refers to.
    pods: HashMap<PodUid, BTreeSet<ObjectKey>>,
    objects: HashMap<ObjectKey, Watched<K>>,
}

struct Inner<K> {
    client: ApiClient,
    /// The resource as the kubelet names it in messages (`configmap`, `secret`).
    resource: &'static str,
    state: Mutex<State<K>>,
}

/// Watches the objects of one kind that registered pods refer to. Cheap to clone.
pub struct ObjectManager<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for ObjectManager<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// The pods' ConfigMaps.
pub type ConfigMapManager = ObjectManager<ConfigMap>;
/// The pods' Secrets.
pub type SecretManager = ObjectManager<Secret>;

impl<K> ObjectManager<K>
where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    fn new(client: ApiClient, resource: &'static str) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                resource,
                state: Mutex::new(State {
                    pods: HashMap::new(),
                    objects: HashMap::new(),
                }),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the objects `names` of `namespace` the ones pod `uid` refers to: watches start for new
    /// ones and stop for those no pod refers to any more. Idempotent; must run inside the agent's
    /// runtime (a new watch is a task).
    fn register(&self, uid: &PodUid, namespace: &str, names: BTreeSet<String>) {
        let wanted: BTreeSet<ObjectKey> = names
            .into_iter()
            .map(|name| (namespace.to_owned(), name))
            .collect();
        let mut state = self.lock();
        let previous = state.pods.remove(uid).unwrap_or_default();
        for key in wanted.difference(&previous) {
            if let Some(watched) = state.objects.get_mut(key) {
                watched.pods += 1;
            } else {
                let watched = self.start_watch(key);
                state.objects.insert(key.clone(), watched);
            }
        }
        for key in previous.difference(&wanted) {
            release(&mut state.objects, key);
        }
        if !wanted.is_empty() {
            state.pods.insert(uid.clone(), wanted);
        }
    }

    /// Forgets pod `uid`; the watches only it needed stop.
    fn unregister(&self, uid: &PodUid) {
        let mut state = self.lock();
        for key in state.pods.remove(uid).unwrap_or_default() {
            release(&mut state.objects, &key);
        }
    }

    fn start_watch(&self, (namespace, name): &ObjectKey) -> Watched<K> {
        let (sender, state) = watch::channel(Slot::Syncing(None));
        let api: Api<K> = Api::namespaced(self.inner.client.watch_client(), namespace);
        let task = tokio::spawn(watch_object(
            api,
            self.inner.client.clone(),
            self.inner.resource,
            format!("{namespace}/{name}"),
            name.clone(),
            sender,
        ))
        .abort_handle();
        Watched {
            pods: 1,
            state,
            task,
        }
    }

    /// The object as its watch last saw it; waits (bounded) for the watch's first list.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Arc<K>, ObjectError> {
        let key = (namespace.to_owned(), name.to_owned());
        let Some(mut state) = self.lock().objects.get(&key).map(|w| w.state.clone()) else {
            return Err(ObjectError::NotRegistered {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        };
        let synced = tokio::time::timeout(
            FIRST_LIST_WAIT,
            state.wait_for(|slot| !matches!(slot, Slot::Syncing(_))),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|slot| slot.clone());
        // Else the watch stopped (its last pod went away meanwhile) or has not listed yet.
        let slot = synced.unwrap_or_else(|| state.borrow().clone());
        match slot {
            Slot::Present(object) => Ok(object),
            Slot::Absent => Err(ObjectError::NotFound {
                resource: self.inner.resource,
                name: name.to_owned(),
            }),
            Slot::Syncing(failure) => Err(ObjectError::NotSynced {
                resource: self.inner.resource,
                reason: failure.unwrap_or_else(|| "timed out waiting for the condition".to_owned()),
            }),
        }
    }

    /// How many objects are watched (for tests and metrics).
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.lock().objects.len()
    }
}

/// One pod fewer refers to `key`; its watch stops with the last.
fn release<K>(objects: &mut HashMap<ObjectKey, Watched<K>>, key: &ObjectKey) {
    if let Some(watched) = objects.get_mut(key) {
        watched.pods -= 1;
        if watched.pods == 0 {
            watched.task.abort();
            objects.remove(key);
        }
    }
}

/// Keeps `sender` up to date with object `name` until the manager aborts the task. The watcher
/// re-lists after an expired resourceVersion and backs off while requests fail; the last known
/// state stays readable meanwhile.
async fn watch_object<K>(
    api: Api<K>,
    client: ApiClient,
    resource: &'static str,
    object: String,
    name: String,
    sender: watch::Sender<Slot<K>>,
) where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(WATCH_TIMEOUT_SECONDS);
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut listing: Option<Option<K>> = None;
    let mut last_failure: Option<String> = None;
    loop {
        match stream.try_next().await {
            Ok(Some(event)) => {
                if last_failure.take().is_some() {
                    tracing::info!(%object, "watching the {resource} again");
                }
                let slot = match event {
                    Event::Init => {
                        listing = Some(None);
                        continue;
                    }
                    Event::InitApply(found) => {
                        if found.meta().name.as_deref() == Some(name.as_str()) {
                            listing = Some(Some(found));
                        }
                        continue;
                    }
                    Event::InitDone => listing
                        .take()
                        .flatten()
                        .map_or(Slot::Absent, |found| Slot::Present(Arc::new(found))),
                    Event::Apply(found) => Slot::Present(Arc::new(found)),
                    Event::Delete(_) => Slot::Absent,
                };
                sender.send_replace(slot);
            }
            Ok(None) => return,
            Err(err) => {
                let message = client.describe_watch(&format!("watch {resource} {object}"), &err);
                if last_failure.as_deref() != Some(message.as_str()) {
                    tracing::warn!("{message}; retrying with back-off");
                }
                sender.send_if_modified(|slot| match slot {
                    Slot::Syncing(failure) => {
                        *failure = Some(message.clone());
                        true
                    }
                    _ => false,
                });
                last_failure = Some(message);
            }
        }
    }
}

fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|spec| {
        spec.init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
    })
}

/// The ConfigMaps a pod refers to: volumes, projected sources, `env` and `envFrom` (the kubelet's
/// `getConfigMapNames`).
pub fn config_map_names(pod: &Pod) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(source) = &volume.config_map {
            names.insert(source.name.clone());
        }
        for projection in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(source) = &projection.config_map {
                names.insert(source.name.clone());
            }
        }
    }
    for container in containers(pod) {
        names.extend(container_config_map_names(container));
    }
    names.retain(|name| !name.is_empty());
    names
}

/// The Secrets a pod refers to: image pull secrets, volumes, projected sources, `env` and
/// `envFrom` (the kubelet's `getSecretNames`).
pub fn secret_names(pod: &Pod) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .map(|reference| reference.name.clone())
        .collect();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            names.insert(name);
        }
        for projection in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(source) = &projection.secret {
                names.insert(source.name.clone());
            }
        }
    }
    for container in containers(pod) {
        names.extend(container_secret_names(container));
    }
    names.retain(|name| !name.is_empty());
    names
}

/// The ConfigMaps one container's environment refers to.
pub fn container_config_map_names(container: &Container) -> BTreeSet<String> {
    let from = container
        .env_from
        .iter()
        .flatten()
        .filter_map(|e| e.config_map_ref.as_ref().map(|r| r.name.clone()));
    let keys = container.env.iter().flatten().filter_map(|e| {
        e.value_from
            .as_ref()?
            .config_map_key_ref
            .as_ref()
            .map(|r| r.name.clone())
    });
    from.chain(keys).collect()
}

/// The Secrets one container's environment refers to.
pub fn container_secret_names(container: &Container) -> BTreeSet<String> {
    let from = container
        .env_from
        .iter()
        .flatten()
        .filter_map(|e| e.secret_ref.as_ref().map(|r| r.name.clone()));
    let keys = container.env.iter().flatten().filter_map(|e| {
        e.value_from
            .as_ref()?
            .secret_key_ref
            .as_ref()
            .map(|r| r.name.clone())
    });
    from.chain(keys).collect()
}

/// What a lookup of one ConfigMap or Secret for a container's environment found: its data as
/// strings (Secret bytes read as UTF-8, invalid sequences replaced), or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectLookup {
    Found(BTreeMap<String, String>),
    Failed(ObjectError),
}

/// Everything the agent reads from the API server on its pods' behalf: their ConfigMaps and
/// Secrets, their service account tokens, and the Services for service-link variables. Cheap to
/// clone.
#[derive(Clone)]
pub struct ApiObjects {
    pub config_maps: ConfigMapManager,
    pub secrets: SecretManager,
    pub tokens: TokenManager,
    pub services: ServiceStore,
}

impl ApiObjects {
    /// The managers on `client`; the Service watch starts at once. Must run inside the agent's
    /// runtime.
    pub fn start(client: &ApiClient) -> Self {
        Self {
            config_maps: ObjectManager::new(client.clone(), "configmap"),
            secrets: ObjectManager::new(client.clone(), "secret"),
            tokens: TokenManager::new(client.clone()),
            services: ServiceStore::start(client),
        }
    }

    /// Watches what `pod` refers to (the kubelet registers a pod with its managers when the pod
    /// manager learns of it); repeated on every sync, so a changed pod is followed.
    pub fn register_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
            return;
        };
        let uid = PodUid::from(uid);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.config_maps
            .register(&uid, namespace, config_map_names(pod));
        self.secrets.register(&uid, namespace, secret_names(pod));
    }

    /// Forgets a removed pod: its watches (when no other pod needs them) and its tokens.
    pub fn unregister_pod(&self, uid: &PodUid) {
        self.config_maps.unregister(uid);
        self.secrets.unregister(uid);
        self.tokens.forget_pod(uid);
    }

    /// The ConfigMaps and Secrets `container`'s environment refers to, by name.
    pub async fn env_objects(
        &self,
        namespace: &str,
        container: &Container,
    ) -> (
        BTreeMap<String, ObjectLookup>,
        BTreeMap<String, ObjectLookup>,
    ) {
        let mut config_maps = BTreeMap::new();
        for name in container_config_map_names(container) {
            let lookup = match self.config_maps.get(namespace, &name).await {
                Ok(object) => ObjectLookup::Found(object.data.clone().unwrap_or_default()),
                Err(err) => ObjectLookup::Failed(err),
            };
            config_maps.insert(name, lookup);
        }
        let mut secrets = BTreeMap::new();
        for name in container_secret_names(container) {
            let lookup = match self.secrets.get(namespace, &name).await {
                Ok(object) => ObjectLookup::Found(
                    object
                        .data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
                        .collect(),
                ),
                Err(err) => ObjectLookup::Failed(err),
            };
            secrets.insert(name, lookup);
        }
        (config_maps, secrets)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn every_reference_of_a_pod_is_found() {
        let pod = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "imagePullSecrets": [{"name": "s-pull"}, {"name": ""}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-vol"}},
                    {"name": "b", "secret": {"secretName": "s-vol"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "cm-proj"}},
                        {"secret": {"name": "s-proj"}},
                        {"serviceAccountToken": {"path": "token"}},
                    ]}},
                ],
                "initContainers": [{
                    "name": "init",
                    "envFrom": [{"configMapRef": {"name": "cm-init"}}],
                }],
                "containers": [{
                    "name": "main",
                    "envFrom": [{"secretRef": {"name": "s-from"}, "prefix": "P_"}],
                    "env": [
                        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s-key", "key": "k"}}},
                        {"name": "C", "value": "plain"},
                    ],
                }],
            },
        }));
        assert_eq!(
            config_map_names(&pod).into_iter().collect::<Vec<_>>(),
            ["cm-init", "cm-key", "cm-proj", "cm-vol"]
        );
        assert_eq!(
            secret_names(&pod).into_iter().collect::<Vec<_>>(),
            ["s-from", "s-key", "s-proj", "s-pull", "s-vol"]
        );
    }

    #[test]
    fn not_found_reads_like_the_kubelet() {
        let err = ObjectError::NotFound {
            resource: "configmap",
            name: "nope".to_owned(),
        };
        assert_eq!(err.to_string(), "configmap \"nope\" not found");
        assert!(err.is_not_found());
    }

    /// Watches follow registrations: shared objects are watched once, and stop with their last pod.
    #[tokio::test]
    async fn watches_follow_the_pods_that_refer_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let client = unreachable_client(dir.path()).await;
        let manager: ConfigMapManager = ObjectManager::new(client, "configmap");
        let (a, b) = (PodUid::from("a"), PodUid::from("b"));
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
        manager.register(&a, "ns", names(&["ca", "shared"]));
        manager.register(&b, "ns", names(&["shared"]));
        assert_eq!(manager.watched(), 2);
        manager.register(&a, "ns", names(&["shared"]));
        assert_eq!(manager.watched(), 1, "ca is no longer referred to");
        manager.unregister(&a);
        assert_eq!(manager.watched(), 1, "b still refers to shared");
        manager.unregister(&b);
        assert_eq!(manager.watched(), 0);
        let err = manager.get("ns", "shared").await.unwrap_err();
        assert!(matches!(err, ObjectError::NotRegistered { .. }), "{err}");
    }

    /// A watch that cannot list says why, as the kubelet's "failed to sync" does.
    #[tokio::test(start_paused = true)]
    async fn a_read_before_the_first_list_fails_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let client = unreachable_client(dir.path()).await;
        let manager: SecretManager = ObjectManager::new(client, "secret");
        let uid = PodUid::from("a");
        manager.register(&uid, "ns", BTreeSet::from(["s".to_owned()]));
        let err = manager.get("ns", "s").await.unwrap_err();
        assert!(
            err.to_string().starts_with("failed to sync secret cache: "),
            "{err}"
        );
    }

    /// A client for an API server that is not there (a closed loopback port).
    async fn unreachable_client(dir: &std::path::Path) -> ApiClient {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
            ),
        )
        .unwrap();
        ApiClient::from_kubeconfig(&kubeconfig, crate::apiserver::ApiClientOptions::default())
            .await
            .unwrap()
    }
}
