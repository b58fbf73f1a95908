//! Reading a kubeconfig file (client-go's `tools/clientcmd`, reduced to one current context): which
//! server to call, which CA to trust, and how to present ourselves (client certificate or token).
//!
//! Relative file paths inside the kubeconfig are resolved against the kubeconfig's own directory, as
//! clientcmd does. `insecure-skip-tls-verify: true` is refused: the agent sends bearer tokens and
//! `TokenReview` answers over this connection, so it must know whom it talks to.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::ApiServerError;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    #[serde(default)]
    current_context: String,
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    // clusters carry `cluster:`, users `user:`, contexts `context:`.
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    exec: Option<serde_yaml::Value>,
    auth_provider: Option<serde_yaml::Value>,
    username: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
}

/// How the agent proves its identity to the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Credentials {
    None,
    /// PEM certificate chain and PEM private key.
    ClientCertificate {
        chain: Vec<u8>,
        key: Vec<u8>,
    },
    Token(String),
    /// Re-read on every request: service-account and bootstrap tokens rotate underneath us.
    TokenFile(PathBuf),
}

/// What one kubeconfig's current context says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub server: String,
    /// PEM bundle of the CAs that may sign the server's certificate.
    pub certificate_authority: Vec<u8>,
    pub credentials: Credentials,
}

pub(crate) fn load(path: &Path) -> Result<Resolved, ApiServerError> {
    let text = std::fs::read_to_string(path).map_err(|source| ApiServerError::ReadKubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    resolve(&text, path, base)
}

fn resolve(text: &str, path: &Path, base: &Path) -> Result<Resolved, ApiServerError> {
    let invalid = |reason: String| ApiServerError::InvalidKubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let config: Kubeconfig =
        serde_yaml::from_str(text).map_err(|source| ApiServerError::ParseKubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    if config.current_context.is_empty() {
        return Err(invalid("current-context is not set".to_owned()));
    }
    let context = find(&config.contexts, &config.current_context).ok_or_else(|| {
        invalid(format!(
            "context {:?} is not defined",
            config.current_context
        ))
    })?;
    let cluster = find(&config.clusters, &context.cluster).ok_or_else(|| {
        invalid(format!(
            "cluster {:?} of context {:?} is not defined",
            context.cluster, config.current_context
        ))
    })?;
    let certificate_authority = cluster_trust(cluster, &context.cluster, path, base)?;

    let default_user = User::default();
    let user = if context.user.is_empty() {
        &default_user
    } else {
        find(&config.users, &context.user).ok_or_else(|| {
            invalid(format!(
                "user {:?} of context {:?} is not defined",
                context.user, config.current_context
            ))
        })?
    };
    Ok(Resolved {
        server: cluster.server.trim_end_matches('/').to_owned(),
        certificate_authority,
        credentials: user_credentials(user, &context.user, path, base)?,
    })
}

/// Checks what the cluster entry asks of TLS and returns the CA bundle to trust.
fn cluster_trust(
    cluster: &Cluster,
    name: &str,
    path: &Path,
    base: &Path,
) -> Result<Vec<u8>, ApiServerError> {
    let invalid = |reason: String| ApiServerError::InvalidKubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    if cluster.insecure_skip_tls_verify {
        return Err(invalid(format!(
            "cluster {name:?} sets insecure-skip-tls-verify, which ringlet refuses; set certificate-authority or certificate-authority-data"
        )));
    }
    for (field, set) in [
        ("tls-server-name", cluster.tls_server_name.is_some()),
        ("proxy-url", cluster.proxy_url.is_some()),
    ] {
        if set {
            return Err(invalid(format!(
                "cluster {name:?} sets {field}, which ringlet does not support"
            )));
        }
    }
    if !cluster.server.starts_with("https://") {
        return Err(invalid(format!(
            "server {:?} of cluster {name:?} is not an https:// URL",
            cluster.server
        )));
    }
    file_or_data(
        base,
        path,
        "certificate-authority",
        cluster.certificate_authority.as_deref(),
        cluster.certificate_authority_data.as_deref(),
    )?
    .ok_or_else(|| {
        invalid(format!(
            "cluster {name:?} has neither certificate-authority nor certificate-authority-data (ringlet does not fall back to system roots)"
        ))
    })
}

fn user_credentials(
    user: &User,
    name: &str,
    path: &Path,
    base: &Path,
) -> Result<Credentials, ApiServerError> {
    let invalid = |reason: String| ApiServerError::InvalidKubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    for (field, set) in [
        ("exec", user.exec.is_some()),
        ("auth-provider", user.auth_provider.is_some()),
        ("username", user.username.is_some()),
    ] {
        if set {
            return Err(invalid(format!(
                "user {name:?} sets {field}, which ringlet does not support; use a client certificate, token or tokenFile"
            )));
        }
    }
    let chain = file_or_data(
        base,
        path,
        "client-certificate",
        user.client_certificate.as_deref(),
        user.client_certificate_data.as_deref(),
    )?;
    let key = file_or_data(
        base,
        path,
        "client-key",
        user.client_key.as_deref(),
        user.client_key_data.as_deref(),
    )?;
    match (chain, key, &user.token, &user.token_file) {
        (Some(chain), Some(key), None, None) => Ok(Credentials::ClientCertificate { chain, key }),
        (None, None, Some(token), None) => Ok(Credentials::Token(token.clone())),
        (None, None, None, Some(file)) => Ok(Credentials::TokenFile(base.join(file))),
        (None, None, None, None) => Ok(Credentials::None),
        (Some(_), None, _, _) | (None, Some(_), _, _) => Err(invalid(format!(
            "user {name:?} needs both client-certificate and client-key"
        ))),
        _ => Err(invalid(format!(
            "user {name:?} sets more than one of client certificate, token and tokenFile"
        ))),
    }
}

fn find<'a, T>(entries: &'a [Named<T>], name: &str) -> Option<&'a T> {
    entries
        .iter()
        .find(|entry| entry.name == name)
        .map(|entry| &entry.value)
}

/// Reads `<field>` (a file path) or `<field>-data` (base64 of the content); both set is an error, as
/// in clientcmd's validation.
fn file_or_data(
    base: &Path,
    kubeconfig: &Path,
    field: &'static str,
    file: Option<&Path>,
    data: Option<&str>,
) -> Result<Option<Vec<u8>>, ApiServerError> {
    match (file, data) {
        (Some(_), Some(_)) => Err(ApiServerError::InvalidKubeconfig {
            path: kubeconfig.to_path_buf(),
            reason: format!("both {field} and {field}-data are set"),
        }),
        (Some(file), None) => {
            let file = base.join(file);
            std::fs::read(&file)
                .map(Some)
                .map_err(|source| ApiServerError::ReadReferencedFile {
                    field,
                    path: file,
                    source,
                })
        }
        (None, Some(data)) => {
            STANDARD
                .decode(data.trim())
                .map(Some)
                .map_err(|source| ApiServerError::Base64 {
                    path: kubeconfig.to_path_buf(),
                    field,
                    source,
                })
        }
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve_str(text: &str) -> Result<Resolved, ApiServerError> {
        resolve(
            text,
            Path::new("/etc/ringlet/kubeconfig"),
            Path::new("/etc/ringlet"),
        )
    }

    const HEADER: &str = "apiVersion: v1\nkind: Config\ncurrent-context: main\ncontexts:\n- name: main\n  context: {cluster: c, user: u}\n";

    #[test]
    fn token_user_and_inline_ca() {
        let text = format!(
            "{HEADER}clusters:\n- name: c\n  cluster: {{server: 'https://10.0.0.1:6443/', certificate-authority-data: {}}}\nusers:\n- name: u\n  user: {{token: abc}}\n",
            STANDARD.encode("PEM")
        );
        let resolved = resolve_str(&text).unwrap();
        assert_eq!(resolved.server, "https://10.0.0.1:6443");
        assert_eq!(resolved.certificate_authority, b"PEM");
        assert_eq!(resolved.credentials, Credentials::Token("abc".to_owned()));
    }

    #[test]
    fn relative_paths_resolve_against_the_kubeconfig_directory() {
        let text = format!(
            "{HEADER}clusters:\n- name: c\n  cluster: {{server: 'https://a', certificate-authority-data: {}}}\nusers:\n- name: u\n  user: {{tokenFile: token}}\n",
            STANDARD.encode("PEM")
        );
        assert_eq!(
            resolve_str(&text).unwrap().credentials,
            Credentials::TokenFile(PathBuf::from("/etc/ringlet/token"))
        );
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        let ca = STANDARD.encode("PEM");
        for (cluster, user, field) in [
            ("tls-server-name: api", "token: t", "tls-server-name"),
            ("proxy-url: 'http://p'", "token: t", "proxy-url"),
            ("{}", "exec: {command: aws}", "exec"),
            ("{}", "auth-provider: {name: gcp}", "auth-provider"),
            ("{}", "username: u, password: p", "username"),
        ] {
            let cluster = if cluster == "{}" {
                String::new()
            } else {
                format!(", {cluster}")
            };
            let text = format!(
                "{HEADER}clusters:\n- name: c\n  cluster: {{server: 'https://a', certificate-authority-data: {ca}{cluster}}}\nusers:\n- name: u\n  user: {{{user}}}\n"
            );
            let error = resolve_str(&text).unwrap_err().to_string();
            assert!(error.contains(field), "{field}: {error}");
        }
    }

    #[test]
    fn refuses_insecure_skip_tls_verify() {
        let text = format!(
            "{HEADER}clusters:\n- name: c\n  cluster: {{server: 'https://a', insecure-skip-tls-verify: true}}\nusers:\n- name: u\n  user: {{token: abc}}\n"
        );
        let error = resolve_str(&text).unwrap_err().to_string();
        assert!(error.contains("insecure-skip-tls-verify"), "{error}");
    }

    #[test]
    fn names_what_is_missing() {
        let text = format!("{HEADER}clusters: []\n");
        let error = format!("{:?}", resolve_str(&text).unwrap_err());
        assert!(error.contains("cluster \\\"c\\\""), "{error}");

        let text = "clusters: []\n";
        let error = format!("{:?}", resolve_str(text).unwrap_err());
        assert!(error.contains("current-context"), "{error}");
    }

    #[test]
    fn refuses_certificate_without_key_and_bad_base64() {
        let text = format!(
            "{HEADER}clusters:\n- name: c\n  cluster: {{server: 'https://a', certificate-authority-data: {}}}\nusers:\n- name: u\n  user: {{client-certificate-data: {}}}\n",
            STANDARD.encode("PEM"),
            STANDARD.encode("CERT")
        );
        let error = format!("{:?}", resolve_str(&text).unwrap_err());
        assert!(error.contains("client-key"), "{error}");

        let text = format!(
            "{HEADER}clusters:\n- name: c\n  cluster: {{server: 'https://a', certificate-authority-data: '!!'}}\n"
        );
        let error = resolve_str(&text).unwrap_err().to_string();
        assert!(error.contains("certificate-authority-data"), "{error}");
    }
}
