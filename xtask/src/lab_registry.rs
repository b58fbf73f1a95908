//! `cargo xtask lab up --registry`: a private image registry for the lab, so pulls go through a
//! real registry as on a production node. Debian's `docker-registry` (the CNCF distribution
//! registry) serves `127.0.0.1:5443` with TLS from a CA the lab generates and htpasswd (bcrypt)
//! basic auth for one fixed lab user; the lab's containerd trusts the CA through the registry's
//! `hosts.toml` in its `config_path`; and the lab's busybox is pushed there as a private image with
//! `ctr images push`. Every step is skipped when already done; `lab down` stops the registry.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use ringlet_tests::cluster::{set_validity, write_private};
use ringlet_tests::registry::{
    PRIVATE_IMAGE, PRIVATE_IMAGE_SOURCE, REGISTRY_DIR, REGISTRY_HOST, REGISTRY_PASSWORD,
    REGISTRY_USER, ca_path, hosts_dir, private_image_manifest_path, registry_answers,
    registry_daemon, registry_status,
};

use crate::cmd;
use crate::lab::{self, write_if_changed};

/// The registry itself, and `htpasswd` to hash the lab user's password with bcrypt (the only hash
/// the registry's htpasswd auth accepts).
const PACKAGES: &[&str] = &["docker-registry", "apache2-utils"];
const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// The lab's CA and serving certificate outlive any lab.
const CERTIFICATE_VALIDITY: Duration = Duration::from_hours(10 * 365 * 24);

fn registry_path(name: &str) -> PathBuf {
    Path::new(REGISTRY_DIR).join(name)
}

/// Sets the registry up and starts it (the lab's containerd must run: the image is pushed from
/// it). A changed configuration, certificate or password file restarts a running registry.
pub fn up() -> Result<()> {
    cmd::ensure_root("the lab registry")?;
    lab::ensure_packages(PACKAGES)?;
    let data = registry_path("data");
    fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
    let mut changed = write_certificates()?;
    changed |= write_htpasswd()?;
    let config = registry_path("config.yml");
    changed |= write_if_changed(&config, registry_config().as_bytes())?;
    write_hosts_toml()?;
    let daemon = registry_daemon();
    if changed && let Some(pid) = daemon.stop(STOP_TIMEOUT)? {
        println!("docker-registry {pid} stopped to read its new configuration");
    }
    daemon.start(
        Path::new(REGISTRY_BINARY),
        &["serve".to_owned(), config.display().to_string()],
        registry_answers,
        START_TIMEOUT,
    )?;
    push_private_image()?;
    println!(
        "registry is up: https://{REGISTRY_HOST} (user {REGISTRY_USER}), holding {PRIVATE_IMAGE}"
    );
    Ok(())
}

/// Stops the registry `up` started.
pub fn down() -> Result<()> {
    match registry_daemon().stop(STOP_TIMEOUT)? {
        Some(pid) => println!("docker-registry {pid} stopped"),
        None => println!("no docker-registry started by `lab up --registry` is running"),
    }
    Ok(())
}

pub fn status() {
    if !registry_answers() {
        println!("registry on {REGISTRY_HOST}: NOT answering (`cargo xtask lab up --registry`)");
        return;
    }
    let held = match registry_status(&private_image_manifest_path(), true) {
        Some(200) => "holds",
        _ => "does NOT hold",
    };
    println!("registry on {REGISTRY_HOST}: answering, {held} {PRIVATE_IMAGE}");
}

/// Generates the lab CA and the registry's serving certificate (for `127.0.0.1` and `localhost`)
/// unless all four files are there; says whether it wrote them.
fn write_certificates() -> Result<bool> {
    let files = [
        ca_path(),
        registry_path("ca.key"),
        registry_path("server.crt"),
        registry_path("server.key"),
    ];
    if files.iter().all(|f| f.exists()) {
        return Ok(false);
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ringlet-lab-registry-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut ca_params, CERTIFICATE_VALIDITY);
    let ca_pem = ca_params.self_signed(&ca_key)?.pem();
    write_private(&registry_path("ca.key"), ca_key.serialize_pem().as_bytes())?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate()?;
    // rcgen makes the address among the names an IP SAN.
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "ringlet-lab-registry");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    set_validity(&mut params, CERTIFICATE_VALIDITY);
    let cert_pem = params.signed_by(&key, &issuer)?.pem();
    write_private(&registry_path("server.key"), key.serialize_pem().as_bytes())?;
    // Certificates are public: containerd, ctr and curl read the CA.
    write_if_changed(&registry_path("server.crt"), cert_pem.as_bytes())?;
    write_if_changed(&ca_path(), ca_pem.as_bytes())?;
    println!("wrote the registry's CA and certificate in {REGISTRY_DIR}");
    Ok(true)
}

/// Writes the htpasswd file unless it already accepts the lab user's password (bcrypt salts, so a
/// new hash would differ every time); says whether it wrote.
fn write_htpasswd() -> Result<bool> {
    let file = registry_path("htpasswd");
    let accepted = file.exists()
        && cmd::succeeds(
            Command::new("htpasswd")
                .arg("-vb")
                .arg(&file)
                .args([REGISTRY_USER, REGISTRY_PASSWORD]),
        );
    if accepted {
        return Ok(false);
    }
    let line =
        cmd::output(Command::new("htpasswd").args(["-Bbn", REGISTRY_USER, REGISTRY_PASSWORD]))?;
    write_private(&file, format!("{}\n", line.trim_end()).as_bytes())?;
    println!("wrote {}", file.display());
    Ok(true)
}

fn registry_config() -> String {
    let dir = REGISTRY_DIR;
    format!(
        "# Written by `cargo xtask lab up --registry`.
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {dir}/data
  delete:
    enabled: true
http:
  addr: {REGISTRY_HOST}
  secret: ringlet-lab
  tls:
    certificate: {dir}/server.crt
    key: {dir}/server.key
auth:
  htpasswd:
    realm: ringlet-lab
    path: {dir}/htpasswd
"
    )
}

/// containerd's host configuration for the registry (read at every pull, no restart needed):
/// HTTPS with the lab's CA. No `server` line: containerd would try it too, without the CA.
fn hosts_toml() -> String {
    format!(
        "# Written by `cargo xtask lab up --registry`: trust the lab registry's CA.
[host.\"https://{REGISTRY_HOST}\"]
  capabilities = [\"pull\", \"resolve\", \"push\"]
  ca = \"{}\"
",
        ca_path().display()
    )
}

fn write_hosts_toml() -> Result<()> {
    let path = hosts_dir().join(REGISTRY_HOST).join("hosts.toml");
    if write_if_changed(&path, hosts_toml().as_bytes())? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Pushes the lab's busybox as [`PRIVATE_IMAGE`] unless the registry already serves that manifest.
fn push_private_image() -> Result<()> {
    let local = lab::image_digests()?
        .remove(PRIVATE_IMAGE_SOURCE)
        .with_context(|| format!("{PRIVATE_IMAGE_SOURCE} is not in the lab's containerd"))?;
    if remote_digest()?.as_deref() == Some(local.as_str()) {
        println!("registry: {PRIVATE_IMAGE} already pushed");
        return Ok(());
    }
    cmd::run(
        lab::ctr()
            .args(["images", "push", "--hosts-dir"])
            .arg(hosts_dir())
            .args([
                "--user",
                &format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"),
                PRIVATE_IMAGE,
                PRIVATE_IMAGE_SOURCE,
            ]),
    )?;
    println!("registry: pushed {PRIVATE_IMAGE_SOURCE} as {PRIVATE_IMAGE}");
    Ok(())
}

/// The digest the registry serves for [`PRIVATE_IMAGE`], if any.
fn remote_digest() -> Result<Option<String>> {
    let headers = cmd::output(
        Command::new("curl")
            .args(["--silent", "--head", "--max-time", "10", "--cacert"])
            .arg(ca_path())
            .args([
                "--user",
                &format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"),
                "--header",
                "Accept: application/vnd.oci.image.manifest.v1+json",
            ])
            .arg(format!(
                "https://{REGISTRY_HOST}/v2/{}",
                private_image_manifest_path()
            )),
    )?;
    Ok(digest_header(&headers))
}

/// The `Docker-Content-Digest` of a `200` response's headers.
fn digest_header(headers: &str) -> Option<String> {
    let ok = headers
        .lines()
        .next()
        .is_some_and(|status| status.split_whitespace().nth(1) == Some("200"));
    ok.then(|| {
        headers.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("docker-content-digest")
                .then(|| value.trim().to_owned())
        })
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_read_from_a_found_manifest_only() {
        let found = "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                     Docker-Content-Digest: sha256:abc\r\n\r\n";
        assert_eq!(digest_header(found).as_deref(), Some("sha256:abc"));
        let missing = "HTTP/1.1 404 Not Found\r\nDocker-Content-Digest: sha256:abc\r\n\r\n";
        assert_eq!(digest_header(missing), None);
        assert_eq!(digest_header(""), None);
    }

    #[test]
    fn the_registry_listens_on_loopback_with_tls_and_htpasswd() {
        let config = registry_config();
        assert!(config.contains("addr: 127.0.0.1:5443\n"), "{config}");
        assert!(config.contains("  tls:\n    certificate: "), "{config}");
        assert!(config.contains("  htpasswd:\n"), "{config}");
        let hosts = hosts_toml();
        assert!(
            hosts.contains("[host.\"https://127.0.0.1:5443\"]\n"),
            "{hosts}"
        );
        assert!(hosts.contains("ca = \"/var/lib/ringlet-lab/registry/ca.crt\""));
    }
}
