//! Registry credentials for image pulls (the kubelet's `pkg/credentialprovider`: the docker config
//! formats, the node's config files and `BasicDockerKeyring`; and
//! `pkg/credentialprovider/secrets`: the keyring of a pod's `imagePullSecrets`). A keyring maps
//! registry locations (`host[:port][/path]`, host labels may be globs such as `*.example.com`) to
//! credentials; a lookup returns every credential whose location matches the image's repository,
//! the most specific location first, and the pull tries them in turn.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;

/// `Secret.type` of a `~/.docker/config.json` in `.dockerconfigjson`.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// `Secret.type` of a legacy `~/.dockercfg` in `.dockercfg`.
pub const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";
const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
const DOCKERCFG_KEY: &str = ".dockercfg";

/// Docker Hub's location in docker configs: the credentials for images without a registry host.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// Why credentials could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("reading key {key} of image pull secret {name:?}: {source}")]
    InvalidSecret {
        name: String,
        key: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// A pod's pull secrets as read for a pull.
#[derive(Clone, Debug, Default)]
pub struct PullSecrets {
    pub secrets: Vec<Arc<Secret>>,
    /// Names of the pod's pull secrets that could not be read (missing, or not readable yet).
    pub unavailable: Vec<String>,
}

/// A user name and password for one registry (the kubelet sends only these two fields of an
/// entry in `PullImageRequest.auth`).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawEntry")]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

/// Never prints the password.
impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// One entry of a docker config: `username`/`password`, or `auth` (base64 of `user:password`),
/// which wins when present.
#[derive(Deserialize)]
struct RawEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

impl TryFrom<RawEntry> for RegistryAuth {
    type Error = String;

    fn try_from(raw: RawEntry) -> Result<Self, String> {
        if raw.auth.is_empty() {
            return Ok(Self {
                username: raw.username,
                password: raw.password,
            });
        }
        let decoded = BASE64
            .decode(raw.auth.as_bytes())
            .map_err(|err| format!("auth field is not base64: {err}"))?;
        let decoded = String::from_utf8_lossy(&decoded);
        let (username, password) = decoded
            .split_once(':')
            .ok_or("unable to parse auth field")?;
        Ok(Self {
            username: username.to_owned(),
            password: password.to_owned(),
        })
    }
}

/// Registry location → credentials, as a docker config file lists them.
pub type DockerConfig = BTreeMap<String, RegistryAuth>;

/// The `auths` of a `config.json` (`{"auths": {"<location>": {...}}}`).
pub fn parse_docker_config_json(bytes: &[u8]) -> Result<DockerConfig, serde_json::Error> {
    #[derive(Deserialize)]
    struct ConfigJson {
        #[serde(default)]
        auths: DockerConfig,
    }
    serde_json::from_slice::<ConfigJson>(bytes).map(|c| c.auths)
}

/// A legacy `.dockercfg` (`{"<location>": {...}}`).
pub fn parse_dockercfg(bytes: &[u8]) -> Result<DockerConfig, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// Credentials by registry location. Iterating the map backwards is the kubelet's reverse-sorted
/// index: `quay.io/team` comes before `quay.io`.
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    credentials: BTreeMap<String, Vec<RegistryAuth>>,
}

impl Keyring {
    /// Adds a config's entries. A location may carry a scheme and Docker's `/v1/` or `/v2/` API
    /// prefix (`https://index.docker.io/v1/`); both go, a path that remains narrows the entry to
    /// repositories under it.
    pub fn add(&mut self, config: DockerConfig) {
        for (location, auth) in config {
            let (host, path) = split_location(strip_scheme(&location));
            let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
                &path[3..]
            } else {
                path
            };
            let key = if path.is_empty() || path == "/" {
                host.to_owned()
            } else {
                format!("{host}{path}")
            };
            self.credentials.entry(key).or_default().push(auth);
        }
    }

    /// The credentials for `repository` (normalised, without tag or digest, e.g.
    /// `docker.io/library/busybox`): those of every matching location, most specific first; when
    /// none matches, Docker Hub's for Docker Hub images.
    pub fn lookup(&self, repository: &str) -> Vec<RegistryAuth> {
        let found: Vec<RegistryAuth> = self
            .credentials
            .iter()
            .rev()
            .filter(|(location, _)| location_matches(location, repository))
            .flat_map(|(_, auths)| auths.iter().cloned())
            .collect();
        if !found.is_empty() {
            return found;
        }
        if is_docker_hub(repository) {
            return self
                .credentials
                .get(DEFAULT_REGISTRY_HOST)
                .cloned()
                .unwrap_or_default();
        }
        Vec::new()
    }
}

/// The keyring of a pod's pull secrets: `kubernetes.io/dockerconfigjson` and
/// `kubernetes.io/dockercfg` secrets with their key present and non-empty; other secrets are
/// ignored, a malformed one fails the pull.
pub fn keyring_from_secrets(secrets: &[Arc<Secret>]) -> Result<Keyring, CredentialError> {
    let mut keyring = Keyring::default();
    for secret in secrets {
        let data = |key| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|bytes| bytes.0.as_slice())
                .filter(|bytes| !bytes.is_empty())
        };
        let invalid = |key, source| CredentialError::InvalidSecret {
            name: secret.metadata.name.clone().unwrap_or_default(),
            key,
            source,
        };
        let config = match secret.type_.as_deref() {
            Some(DOCKER_CONFIG_JSON_TYPE) => data(DOCKER_CONFIG_JSON_KEY).map(|bytes| {
                parse_docker_config_json(bytes).map_err(|e| invalid(DOCKER_CONFIG_JSON_KEY, e))
            }),
            Some(DOCKERCFG_TYPE) => data(DOCKERCFG_KEY)
                .map(|bytes| parse_dockercfg(bytes).map_err(|e| invalid(DOCKERCFG_KEY, e))),
            _ => None,
        };
        if let Some(config) = config {
            keyring.add(config?);
        }
    }
    Ok(keyring)
}

/// The formats of the node's docker config files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    /// `{"auths": {...}}`: `config.json`, and a secret's `.dockerconfigjson` copied to disk.
    ConfigJson,
    /// The legacy `.dockercfg`.
    Dockercfg,
}

/// Where the node's docker config is looked for, in the kubelet's order (`ReadDockerConfigFile`):
/// `config.json` in the root dir, the working directory, `$HOME/.docker` and `/.docker`; else
/// `.dockercfg`, else `.dockerconfigjson`, in the root dir, the working directory, `$HOME` and `/`.
/// The first file that parses is the node's config.
pub fn node_config_paths(
    root_dir: Option<&Path>,
    working_dir: &Path,
    home: Option<&Path>,
) -> Vec<(PathBuf, ConfigFormat)> {
    let dirs = |home_dir: Option<PathBuf>, root: &str| -> Vec<PathBuf> {
        root_dir
            .map(Path::to_path_buf)
            .into_iter()
            .chain([working_dir.to_path_buf()])
            .chain(home_dir)
            .chain([PathBuf::from(root)])
            .collect()
    };
    let json_dirs = dirs(home.map(|h| h.join(".docker")), "/.docker");
    let legacy_dirs = dirs(home.map(Path::to_path_buf), "/");
    let mut paths: Vec<(PathBuf, ConfigFormat)> = json_dirs
        .iter()
        .map(|d| (d.join("config.json"), ConfigFormat::ConfigJson))
        .collect();
    for (name, format) in [
        (DOCKERCFG_KEY, ConfigFormat::Dockercfg),
        (DOCKER_CONFIG_JSON_KEY, ConfigFormat::ConfigJson),
    ] {
        paths.extend(legacy_dirs.iter().map(|d| (d.join(name), format)));
    }
    paths
}

/// The node's keyring: the first of `paths` that exists and parses (none: an empty keyring).
/// Read on every pull, so an operator's new `config.json` counts from the next pull on.
pub async fn read_node_keyring(paths: &[(PathBuf, ConfigFormat)]) -> Keyring {
    for (path, format) in paths {
        let Ok(bytes) = tokio::fs::read(path).await else {
            continue;
        };
        let parsed = match format {
            ConfigFormat::ConfigJson => parse_docker_config_json(&bytes),
            ConfigFormat::Dockercfg => parse_dockercfg(&bytes),
        };
        match parsed {
            Ok(config) => {
                let mut keyring = Keyring::default();
                keyring.add(config);
                return keyring;
            }
            Err(err) => {
                tracing::debug!(path = %path.display(), %err, "skipping an unreadable docker config");
            }
        }
    }
    Keyring::default()
}

fn strip_scheme(location: &str) -> &str {
    location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location)
}

/// `host[:port]` and the path (with its leading `/`, empty when there is none) of a location or
/// repository without a scheme; a query or fragment is not part of the path.
fn split_location(location: &str) -> (&str, &str) {
    let location = location
        .split_once(['?', '#'])
        .map_or(location, |(before, _)| before);
    match location.find('/') {
        Some(slash) => location.split_at(slash),
        None => (location, ""),
    }
}

/// The host's labels and the port (empty when there is none).
fn host_and_port(host: &str) -> (Vec<&str>, &str) {
    let (name, port) = if let Some(bracketed) = host.strip_prefix('[') {
        match bracketed.split_once("]:") {
            Some((name, port)) => (name, port),
            None => (bracketed.trim_end_matches(']'), ""),
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if !name.contains(':') => (name, port),
            _ => (host, ""),
        }
    };
    (name.split('.').collect(), port)
}

/// Whether keyring location `location` covers `repository` (the kubelet's `URLsMatch`): same port,
/// same number of host labels each matching its glob, and the location's path a prefix of the
/// repository's.
fn location_matches(location: &str, repository: &str) -> bool {
    let (glob_host, glob_path) = split_location(location);
    let (host, path) = split_location(repository);
    let (glob_labels, glob_port) = host_and_port(glob_host);
    let (labels, port) = host_and_port(host);
    glob_port == port
        && glob_labels.len() == labels.len()
        && path.starts_with(glob_path)
        && glob_labels
            .iter()
            .zip(&labels)
            .all(|(glob, label)| glob_match(glob.as_bytes(), label.as_bytes()))
}

/// Whether `repository` comes from Docker Hub: no registry host before its first `/`.
fn is_docker_hub(repository: &str) -> bool {
    match repository.split_once('/') {
        None => !repository.is_empty(),
        Some(("", _)) => false,
        Some(("docker.io" | "index.docker.io", _)) => true,
        Some((first, _)) => !first.contains(['.', ':']),
    }
}

/// Shell-style matching of one host label (Go's `filepath.Match` within a label): `*` any run,
/// `?` one character, `[a-z]`/`[^a-z]` a class, `\` escapes; a malformed class never matches.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob_match(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob_match(rest, &text[1..]),
        Some((b'[', rest)) => {
            let Some((&c, text_rest)) = text.split_first() else {
                return false;
            };
            match class_match(rest, c) {
                Some((true, after)) => glob_match(after, text_rest),
                _ => false,
            }
        }
        Some((b'\\', rest)) => match (rest.split_first(), text.split_first()) {
            (Some((p, rest)), Some((c, text_rest))) => p == c && glob_match(rest, text_rest),
            _ => false,
        },
        Some((p, rest)) => text.first() == Some(p) && glob_match(rest, &text[1..]),
    }
}

/// Matches `c` against the class that starts after `[`; returns whether it matched and the
/// pattern after `]`, or `None` for a class without its `]`.
fn class_match(class: &[u8], c: u8) -> Option<(bool, &[u8])> {
    let (negated, mut rest) = match class.split_first() {
        Some((b'^', rest)) => (true, rest),
        _ => (false, class),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        let (&lo, after) = rest.split_first()?;
        if lo == b']' && !first {
            return Some((matched != negated, after));
        }
        first = false;
        let (lo, after) = if lo == b'\\' {
            let (&escaped, after) = after.split_first()?;
            (escaped, after)
        } else {
            (lo, after)
        };
        let (hi, after) = match after {
            [b'-', hi, after @ ..] if *hi != b']' => (*hi, after),
            _ => (lo, after),
        };
        matched |= (lo..=hi).contains(&c);
        rest = after;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn auth(user: &str) -> RegistryAuth {
        RegistryAuth {
            username: user.to_owned(),
            password: format!("{user}-password"),
        }
    }

    fn keyring(entries: &[(&str, &str)]) -> Keyring {
        let mut keyring = Keyring::default();
        keyring.add(
            entries
                .iter()
                .map(|(loc, user)| ((*loc).to_owned(), auth(user)))
                .collect(),
        );
        keyring
    }

    fn users(found: &[RegistryAuth]) -> Vec<&str> {
        found.iter().map(|a| a.username.as_str()).collect()
    }

    #[test]
    fn a_host_entry_covers_every_repository_on_that_host_and_port() {
        let keyring = keyring(&[("127.0.0.1:5443", "lab")]);
        assert_eq!(
            users(&keyring.lookup("127.0.0.1:5443/lab/busybox")),
            ["lab"]
        );
        assert!(keyring.lookup("127.0.0.1:5000/lab/busybox").is_empty());
        assert!(keyring.lookup("127.0.0.1/lab/busybox").is_empty());
        assert!(keyring.lookup("docker.io/library/busybox").is_empty());
    }

    #[test]
    fn schemes_and_registry_api_prefixes_are_ignored() {
        let keyring = keyring(&[
            ("https://reg.example.com/v2/", "v2"),
            ("http://other.example.com/v1/", "v1"),
            ("https://team.example.com/v2/team", "team"),
        ]);
        assert_eq!(users(&keyring.lookup("reg.example.com/app")), ["v2"]);
        assert_eq!(users(&keyring.lookup("other.example.com/app")), ["v1"]);
        assert_eq!(
            users(&keyring.lookup("team.example.com/team/app")),
            ["team"]
        );
        assert!(keyring.lookup("team.example.com/other/app").is_empty());
    }

    #[test]
    fn every_matching_location_counts_the_most_specific_first() {
        let keyring = keyring(&[
            ("quay.io", "host"),
            ("quay.io/coreos", "team"),
            ("quay.io/coreos/etcd", "repo"),
        ]);
        assert_eq!(
            users(&keyring.lookup("quay.io/coreos/etcd")),
            ["repo", "team", "host"]
        );
        assert_eq!(
            users(&keyring.lookup("quay.io/coreos/dns")),
            ["team", "host"]
        );
        assert_eq!(users(&keyring.lookup("quay.io/other/app")), ["host"]);
    }

    #[test]
    fn host_labels_match_globs_one_label_each() {
        let keyring = keyring(&[("*.example.com", "glob"), ("reg-[0-9].io", "class")]);
        assert_eq!(users(&keyring.lookup("a.example.com/app")), ["glob"]);
        assert!(keyring.lookup("a.b.example.com/app").is_empty());
        assert!(keyring.lookup("example.com/app").is_empty());
        assert_eq!(users(&keyring.lookup("reg-7.io/app")), ["class"]);
        assert!(keyring.lookup("reg-x.io/app").is_empty());
    }

    #[test]
    fn docker_hub_credentials_cover_images_without_a_registry() {
        let keyring = keyring(&[("https://index.docker.io/v1/", "hub")]);
        assert_eq!(users(&keyring.lookup("docker.io/library/busybox")), ["hub"]);
        assert_eq!(users(&keyring.lookup("me/app")), ["hub"]);
        assert!(keyring.lookup("quay.io/app").is_empty());
        assert!(keyring.lookup("localhost:5000/app").is_empty());
    }

    #[test]
    fn glob_classes_ranges_negation_and_escapes() {
        assert!(glob_match(b"a?c", b"abc"));
        assert!(!glob_match(b"a?c", b"ac"));
        assert!(glob_match(b"[^x]b", b"ab"));
        assert!(!glob_match(b"[^x]b", b"xb"));
        assert!(glob_match(b"\\*", b"*"));
        assert!(!glob_match(b"\\*", b"a"));
        assert!(!glob_match(b"[a-", b"a"), "a malformed class never matches");
        assert!(glob_match(b"*", b""));
    }

    #[test]
    fn config_entries_take_user_and_password_or_the_auth_field() {
        let config = parse_docker_config_json(
            br#"{"auths": {
                "a.io": {"username": "u", "password": "p:with:colons", "email": "x@y"},
                "b.io": {"auth": "bGFiOnNlY3JldDpwYXJ0"}
            }, "credsStore": "ignored"}"#,
        )
        .unwrap();
        assert_eq!(
            config["a.io"],
            RegistryAuth {
                username: "u".to_owned(),
                password: "p:with:colons".to_owned()
            }
        );
        assert_eq!(
            config["b.io"],
            RegistryAuth {
                username: "lab".to_owned(),
                password: "secret:part".to_owned()
            }
        );
        let legacy = parse_dockercfg(br#"{"c.io": {"auth": "dTpw", "email": "e"}}"#).unwrap();
        assert_eq!(legacy["c.io"].username, "u");
        assert!(parse_dockercfg(br#"{"c.io": {"auth": "no-colon-here"}}"#).is_err());
        assert!(parse_docker_config_json(b"not json").is_err());
    }

    #[test]
    fn the_debug_form_hides_the_password() {
        let text = format!("{:?}", auth("lab"));
        assert!(text.contains("\"lab\""), "{text}");
        assert!(!text.contains("lab-password"), "{text}");
    }

    fn secret(name: &str, type_: &str, key: &str, value: &str) -> Arc<Secret> {
        Arc::new(Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            type_: Some(type_.to_owned()),
            data: Some(BTreeMap::from([(
                key.to_owned(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Default::default()
        })
    }

    #[test]
    fn pull_secrets_of_both_docker_types_make_one_keyring_in_secret_order() {
        let secrets = [
            secret(
                "json",
                DOCKER_CONFIG_JSON_TYPE,
                ".dockerconfigjson",
                r#"{"auths": {"reg.io": {"username": "first", "password": "p"}}}"#,
            ),
            secret(
                "legacy",
                DOCKERCFG_TYPE,
                ".dockercfg",
                r#"{"reg.io": {"username": "second", "password": "p"}}"#,
            ),
            // Not a docker config type, or its key missing: ignored.
            secret("opaque", "Opaque", ".dockerconfigjson", "not json"),
            secret(
                "wrong-key",
                DOCKER_CONFIG_JSON_TYPE,
                ".dockercfg",
                "not json",
            ),
        ];
        let keyring = keyring_from_secrets(&secrets).unwrap();
        assert_eq!(users(&keyring.lookup("reg.io/app")), ["first", "second"]);
    }

    #[test]
    fn a_malformed_pull_secret_is_an_error_naming_it() {
        let secrets = [secret(
            "broken",
            DOCKER_CONFIG_JSON_TYPE,
            ".dockerconfigjson",
            "{",
        )];
        let err = keyring_from_secrets(&secrets).unwrap_err().to_string();
        assert!(
            err.contains("\"broken\"") && err.contains(".dockerconfigjson"),
            "{err}"
        );
    }

    #[test]
    fn node_config_paths_follow_the_kubelets_search_order() {
        let paths = node_config_paths(
            Some(Path::new("/var/lib/kubelet")),
            Path::new("/work"),
            Some(Path::new("/root")),
        );
        let shown: Vec<String> = paths
            .iter()
            .map(|(p, f)| format!("{} {f:?}", p.display()))
            .collect();
        assert_eq!(
            shown,
            [
                "/var/lib/kubelet/config.json ConfigJson",
                "/work/config.json ConfigJson",
                "/root/.docker/config.json ConfigJson",
                "/.docker/config.json ConfigJson",
                "/var/lib/kubelet/.dockercfg Dockercfg",
                "/work/.dockercfg Dockercfg",
                "/root/.dockercfg Dockercfg",
                "/.dockercfg Dockercfg",
                "/var/lib/kubelet/.dockerconfigjson ConfigJson",
                "/work/.dockerconfigjson ConfigJson",
                "/root/.dockerconfigjson ConfigJson",
                "/.dockerconfigjson ConfigJson",
            ]
        );
    }

    #[tokio::test]
    async fn the_first_node_config_that_parses_is_the_nodes_keyring() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(root.join("config.json"), "garbage").unwrap();
        std::fs::write(
            work.join("config.json"),
            r#"{"auths": {"reg.io": {"username": "work", "password": "p"}}}"#,
        )
        .unwrap();
        std::fs::write(
            work.join(".dockercfg"),
            r#"{"reg.io": {"username": "legacy", "password": "p"}}"#,
        )
        .unwrap();
        // Only the test's own files: the machine's `/.docker` is none of its business.
        let paths: Vec<(PathBuf, ConfigFormat)> = node_config_paths(Some(&root), &work, None)
            .into_iter()
            .filter(|(p, _)| p.starts_with(dir.path()))
            .collect();
        let keyring = read_node_keyring(&paths).await;
        assert_eq!(users(&keyring.lookup("reg.io/app")), ["work"]);

        std::fs::remove_file(work.join("config.json")).unwrap();
        let keyring = read_node_keyring(&paths).await;
        assert_eq!(users(&keyring.lookup("reg.io/app")), ["legacy"]);

        std::fs::remove_file(work.join(".dockercfg")).unwrap();
        let keyring = read_node_keyring(&paths).await;
        assert!(keyring.lookup("reg.io/app").is_empty());
    }
}
