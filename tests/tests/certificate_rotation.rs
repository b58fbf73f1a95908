//! End-to-end: certificate rotation against the shared control plane (`pkg/kubelet/certificate`).
//! With `--rotate-certificates` the node's client certificate is renewed through
//! `kube-apiserver-client-kubelet` CSRs and the agent's API requests move to each new certificate
//! without a restart; with `--rotate-server-certificates` (`serverTLSBootstrap`) the kubelet API's
//! serving certificate comes from a `kubelet-serving` CSR and is renewed the same way, new TLS
//! connections getting the new one. The test does the csrsigning controller's work itself.
//!
//! The issue asks for a 10-minute lifetime; every certificate here lives 60 s instead (rotation at
//! 42–54 s), so two client rotations take about two minutes of wall time in CI. Run as root, one test
//! at a time.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail, ensure};
use ringlet::prober::http::AcceptAnyCertificate;
use ringlet_tests::cluster::{Cluster, csr_common_name, require_lab_and_cluster};
use ringlet_tests::cluster_node::{ClusterNode, ClusterNodeOptions};
use ringlet_tests::wait_for;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;

/// The lifetime of every certificate the test issues.
const LIFETIME: Duration = Duration::from_mins(1);
const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// One CSR the test signed.
#[derive(Clone, Debug)]
struct Signed {
    signer: String,
    /// No later than the issued certificate's notAfter.
    expires_by: SystemTime,
}

/// The csrsigning controller's job for one node: signs its client CSRs at once, and its serving
/// CSRs once `serving` is set, each valid for [`LIFETIME`].
struct Signer {
    stop: Arc<AtomicBool>,
    serving: Arc<AtomicBool>,
    signed: Arc<Mutex<Vec<Signed>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Signer {
    fn start(cluster: &Cluster, node: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Arc::new(AtomicBool::new(false));
        let signed = Arc::new(Mutex::new(Vec::new()));
        let (cluster, user) = (cluster.clone(), format!("system:node:{node}"));
        let (thread_stop, thread_serving, thread_signed) =
            (Arc::clone(&stop), Arc::clone(&serving), Arc::clone(&signed));
        let thread = std::thread::spawn(move || {
            while !thread_stop.load(Ordering::Relaxed) {
                for (name, signer) in pending_csrs(&cluster, &user) {
                    if signer == SERVING_SIGNER && !thread_serving.load(Ordering::Relaxed) {
                        continue;
                    }
                    let expires_by = SystemTime::now() + LIFETIME;
                    if cluster.sign_csr_valid_for(&name, Some(LIFETIME)).is_ok() {
                        thread_signed
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(Signed { signer, expires_by });
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Self {
            stop,
            serving,
            signed,
            thread: Some(thread),
        }
    }

    fn signed(&self, signer: &str) -> Vec<Signed> {
        self.signed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|s| s.signer == signer)
            .cloned()
            .collect()
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// (name, signer) of the CSRs for `user` that nobody decided yet.
fn pending_csrs(cluster: &Cluster, user: &str) -> Vec<(String, String)> {
    let Ok(list) = cluster.get_json(&["csr"]) else {
        return Vec::new();
    };
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|csr| is_pending(csr) && csr_common_name(csr).is_ok_and(|cn| cn == user))
        .filter_map(|csr| {
            Some((
                csr["metadata"]["name"].as_str()?.to_owned(),
                csr["spec"]["signerName"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

fn is_pending(csr: &Value) -> bool {
    csr["status"]["certificate"].is_null()
        && csr["status"]["conditions"]
            .as_array()
            .is_none_or(Vec::is_empty)
}

/// The leaf certificate a new TLS connection to the kubelet API is shown.
fn served_certificate(port: u16) -> Result<CertificateDer<'static>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .dangerous()
        // Any certificate: the test compares the one it is shown with the files itself.
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    let mut connection =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("127.0.0.1")?)?;
    let mut socket = TcpStream::connect(("127.0.0.1", port))?;
    socket.set_read_timeout(Some(Duration::from_secs(5)))?;
    while connection.is_handshaking() {
        connection.complete_io(&mut socket)?;
    }
    connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.clone().into_owned())
        .ok_or_else(|| anyhow!("no server certificate"))
}

/// The first certificate in a `*-current.pem` file.
fn current_certificate(path: &Path) -> Result<CertificateDer<'static>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    CertificateDer::pem_slice_iter(&pem)
        .next()
        .ok_or_else(|| anyhow!("{} holds no certificate", path.display()))?
        .context("parsing the certificate")
}

/// The `kubelet-client-<time>.pem` files (not the link).
fn client_pairs(cert_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(cert_dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| {
            name.starts_with("kubelet-client-2")
                && Path::new(name).extension().is_some_and(|ext| ext == "pem")
        })
        .collect()
}

/// No request refused for its certificate, and two client and two serving rotations logged.
fn check_log(agent_log: &str, tail: &str) -> Result<()> {
    for refused in ["401 Unauthorized", "did not accept the credentials"] {
        if agent_log.contains(refused) {
            bail!("the API server refused the agent's certificate ({refused}):\n{tail}");
        }
    }
    ensure!(
        agent_log.matches("certificate rotated").count() >= 4,
        "expected two client and two serving rotations in the log:\n{tail}"
    );
    Ok(())
}

/// The node Lease's `renewTime`.
fn lease_renewed(cluster: &Cluster, node: &str) -> Result<SystemTime> {
    let lease = cluster.get_json(&["lease", node, "-n", "kube-node-lease"])?;
    let text = lease["spec"]["renewTime"]
        .as_str()
        .ok_or_else(|| anyhow!("the lease has no renewTime: {lease}"))?;
    let at: k8s_openapi::jiff::Timestamp = text.parse().context("parsing renewTime")?;
    let seconds = u64::try_from(at.as_second()).context("renewTime before 1970")?;
    Ok(UNIX_EPOCH + Duration::from_secs(seconds))
}

#[test]
fn client_and_serving_certificates_rotate_without_a_restart() -> Result<()> {
    let test = "client_and_serving_certificates_rotate_without_a_restart";
    let Some(cluster) = require_lab_and_cluster(test) else {
        return Ok(());
    };
    let cert_dir = tempfile::tempdir()?;
    let cert_dir_path: PathBuf = cert_dir.path().join("pki");
    let node = ClusterNode::start(
        test,
        &cluster,
        ClusterNodeOptions {
            args: vec![
                "--rotate-certificates".to_owned(),
                "--rotate-server-certificates".to_owned(),
                "--cert-dir".to_owned(),
                cert_dir_path.display().to_string(),
            ],
            client_certificate_validity: Some(LIFETIME),
            ..ClusterNodeOptions::default()
        },
    )?;
    let signer = Signer::start(&cluster, node.node());
    let log = || ringlet_tests::tail(&node.agent().log(), 60);
    let port = node.agent().api_port;

    // Serving: no certificate, so no handshake, until the kubelet-serving CSR is signed.
    let user = format!("system:node:{}", node.node());
    cluster
        .wait_for_csr("a kubelet-serving CSR", Duration::from_mins(1), |csr| {
            is_pending(csr)
                && csr["spec"]["signerName"] == SERVING_SIGNER
                && csr_common_name(csr).is_ok_and(|cn| cn == user)
        })
        .with_context(log)?;
    ensure!(
        served_certificate(port).is_err(),
        "a TLS handshake succeeded before the serving certificate was issued"
    );
    signer.serving.store(true, Ordering::Relaxed);
    let serving_current = cert_dir_path.join("kubelet-server-current.pem");
    let first_serving = wait_for(
        "the issued serving certificate",
        Duration::from_mins(1),
        || {
            let served = served_certificate(port).ok()?;
            (current_certificate(&serving_current).ok()? == served).then_some(served)
        },
    )
    .with_context(log)?;

    // Two client rotations: the kubeconfig's certificate, then the first issued one, replaced.
    let client_rotations = wait_for(
        "two client certificate rotations",
        Duration::from_mins(4),
        || {
            let issued = signer.signed(CLIENT_SIGNER);
            (issued.len() >= 2 && client_pairs(&cert_dir_path).len() >= 2).then_some(issued)
        },
    )
    .with_context(log)?;

    // The serving certificate was renewed too, and new connections get the new one.
    let renewed_serving = wait_for(
        "a renewed serving certificate",
        Duration::from_mins(1),
        || {
            let served = served_certificate(port).ok()?;
            (served != first_serving && current_certificate(&serving_current).ok()? == served)
                .then_some(())
        },
    );
    renewed_serving.with_context(log)?;
    ensure!(
        signer.signed(SERVING_SIGNER).len() >= 2,
        "serving CSRs: {:?}",
        signer.signed(SERVING_SIGNER)
    );

    // Both earlier client certificates have expired by now or soon: the agent's requests keep
    // working only if they present the second rotated one. The Lease renews every 10 s.
    let first_rotated_expiry = client_rotations[0].expires_by;
    let after_expiry = wait_for(
        "a Lease renewal after the first rotated client certificate expired",
        Duration::from_mins(2),
        || {
            let renewed = lease_renewed(&cluster, node.node()).ok()?;
            (renewed > first_rotated_expiry).then_some(renewed)
        },
    )
    .with_context(log)?;
    check_log(&node.agent().log(), &log())?;
    println!(
        "client CSRs signed: {}, serving CSRs signed: {}, lease renewed at {after_expiry:?}",
        signer.signed(CLIENT_SIGNER).len(),
        signer.signed(SERVING_SIGNER).len()
    );
    drop(signer);
    drop(node);
    Ok(())
}
