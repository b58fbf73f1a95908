//! The control-plane harness against the real API server (`cargo xtask cluster up`): node
//! credentials are held to their own node by the Node authorizer and the `NodeRestriction`
//! admission plugin, the bootstrap token may ask for a client certificate, a CSR signed by the
//! harness authenticates as the node, prepared namespaces hold what pods need, and the API server's
//! client certificate for kubelets is authorized for the kubelet API.

use std::process::Output;
use std::time::Duration;

use anyhow::{Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rcgen::{CertificateParams, DnType, KeyPair};
use ringlet_tests::cluster::{
    Credentials, kubeconfig, output_with_input, run, run_with_input, write_private,
};
use ringlet_tests::{Cluster, require_cluster};
use serde_json::{Value, json};

fn node_object(name: &str) -> String {
    json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name } }).to_string()
}

/// Fails unless `output` is a refusal by authorization or admission.
fn assert_forbidden(what: &str, output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("forbidden"),
        "{what}: expected forbidden, got {}: {stderr}",
        output.status
    );
}

/// `kubectl auth whoami` with `kubeconfig`: (user name, groups).
fn whoami(cluster: &Cluster, kubeconfig: &std::path::Path) -> Result<(String, Vec<String>)> {
    let out = run(cluster
        .kubectl_as(kubeconfig)
        .args(["auth", "whoami", "-o", "json"]))?;
    let review: Value = serde_json::from_str(&out)?;
    let info = &review["status"]["userInfo"];
    let groups = info["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok((
        info["username"].as_str().unwrap_or_default().to_owned(),
        groups,
    ))
}

#[test]
fn a_node_may_create_only_its_own_node_object() -> Result<()> {
    let Some(cluster) = require_cluster("a_node_may_create_only_its_own_node_object") else {
        return Ok(());
    };
    let (node, other) = ("harness-node-a", "harness-node-b");
    // Nodes outlive a run in the shared control plane: start from none.
    run(cluster
        .kubectl()
        .args(["delete", "node", node, other, "--ignore-not-found"]))?;
    let kubeconfig = cluster.node_kubeconfig(node)?;

    let (user, groups) = whoami(&cluster, &kubeconfig)?;
    assert_eq!(user, format!("system:node:{node}"));
    assert!(groups.iter().any(|g| g == "system:nodes"), "{groups:?}");

    run_with_input(
        cluster.kubectl_as(&kubeconfig).args(["create", "-f", "-"]),
        &node_object(node),
    )?;
    let created = cluster.get_json(&["node", node])?;
    assert_eq!(created["metadata"]["name"], node);

    let mut create_other = cluster.kubectl_as(&kubeconfig);
    create_other.args(["create", "-f", "-"]);
    let refused = output_with_input(&mut create_other, &node_object(other))?;
    assert_forbidden("creating another node's object", &refused);
    let absent = cluster.get_json(&[
        "nodes",
        "--field-selector",
        &format!("metadata.name={other}"),
    ])?;
    assert_eq!(absent["items"], json!([]), "the other node must not exist");

    // This version's Node authorizer lets a node read its own Node object only (not the list of
    // all nodes), and none of the cluster's secrets.
    run(cluster.kubectl_as(&kubeconfig).args(["get", "node", node]))?;
    let mut all_nodes = cluster.kubectl_as(&kubeconfig);
    all_nodes.args(["get", "nodes"]);
    assert_forbidden("listing all nodes", &output_with_input(&mut all_nodes, "")?);
    let mut secrets = cluster.kubectl_as(&kubeconfig);
    secrets.args(["get", "secrets", "-n", "kube-system"]);
    assert_forbidden(
        "listing kube-system's secrets",
        &output_with_input(&mut secrets, "")?,
    );

    run(cluster.kubectl().args(["delete", "node", node]))?;
    Ok(())
}

#[test]
fn a_bootstrap_csr_signed_by_the_harness_authenticates_as_the_node() -> Result<()> {
    let Some(cluster) =
        require_cluster("a_bootstrap_csr_signed_by_the_harness_authenticates_as_the_node")
    else {
        return Ok(());
    };
    let node = "harness-csr-node";
    let csr_name = "harness-csr-node-client";
    run(cluster
        .kubectl()
        .args(["delete", "csr", csr_name, "--ignore-not-found"]))?;

    let bootstrap = cluster.bootstrap_kubeconfig();
    let (user, groups) = whoami(&cluster, &bootstrap)?;
    assert!(user.starts_with("system:bootstrap:"), "{user}");
    assert!(
        groups.iter().any(|g| g == "system:bootstrappers"),
        "{groups:?}"
    );

    // What a kubelet sends on its first start: a key of its own and a CSR for its node identity.
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    let request = params.serialize_request(&key)?.pem()?;
    let csr = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": { "name": csr_name },
        "spec": {
            "request": BASE64.encode(&request),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    });
    run_with_input(
        cluster.kubectl_as(&bootstrap).args(["create", "-f", "-"]),
        &csr.to_string(),
    )?;

    let found = cluster.wait_for_node_csr(node, Duration::from_secs(30))?;
    assert_eq!(found, csr_name);
    cluster.sign_csr(csr_name)?;

    let signed = cluster.get_json(&["csr", csr_name])?;
    let approved = signed["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Approved" && c["status"] == "True")
    });
    assert!(approved, "the CSR is not approved: {signed}");
    let Some(certificate) = signed["status"]["certificate"].as_str() else {
        bail!("the signed CSR has no certificate: {signed}");
    };
    let cert_pem = String::from_utf8(BASE64.decode(certificate)?)?;

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("node.kubeconfig");
    let ca = std::fs::read_to_string(cluster.ca_file())?;
    let config = kubeconfig(
        &cluster.server,
        &ca,
        node,
        &Credentials::Certificate {
            cert_pem: &cert_pem,
            key_pem: &key.serialize_pem(),
        },
    );
    write_private(&path, config.as_bytes())?;
    let (user, groups) = whoami(&cluster, &path)?;
    assert_eq!(user, format!("system:node:{node}"));
    assert!(groups.iter().any(|g| g == "system:nodes"), "{groups:?}");

    // A signed CSR is no longer waiting for a certificate.
    let waiting = cluster.wait_for_node_csr(node, Duration::from_millis(500));
    assert!(
        waiting.is_err(),
        "a signed CSR still counts as waiting: {waiting:?}"
    );

    run(cluster.kubectl().args(["delete", "csr", csr_name]))?;
    Ok(())
}

#[test]
fn prepare_namespace_adds_what_pods_need_and_can_run_twice() -> Result<()> {
    let Some(cluster) = require_cluster("prepare_namespace_adds_what_pods_need_and_can_run_twice")
    else {
        return Ok(());
    };
    let ns = "harness-prepared";
    // Namespaces are never deleted here (without the namespace controller one would stay
    // Terminating for good), so start from a namespace without what prepare_namespace adds.
    run(cluster.kubectl().args([
        "delete",
        "-n",
        ns,
        "--ignore-not-found",
        "serviceaccount/default",
        "configmap/kube-root-ca.crt",
        "configmap/openshift-service-ca.crt",
    ]))?;
    cluster.prepare_namespace(ns)?;
    cluster.prepare_namespace(ns)?;
    let ca = std::fs::read_to_string(cluster.ca_file())?;
    cluster.get_json(&["serviceaccount", "default", "-n", ns])?;
    let root_ca = cluster.get_json(&["configmap", "kube-root-ca.crt", "-n", ns])?;
    assert_eq!(root_ca["data"]["ca.crt"], ca.as_str());
    let service_ca = cluster.get_json(&["configmap", "openshift-service-ca.crt", "-n", ns])?;
    assert_eq!(service_ca["data"]["service-ca.crt"], ca.as_str());
    Ok(())
}

#[test]
fn the_api_servers_kubelet_client_may_use_the_kubelet_api() -> Result<()> {
    let Some(cluster) = require_cluster("the_api_servers_kubelet_client_may_use_the_kubelet_api")
    else {
        return Ok(());
    };
    // What a kubelet's SubjectAccessReview asks for `kubectl logs` and `exec`, as this user.
    let can_i = |user: &str| -> Result<String> {
        let mut command = cluster.kubectl();
        command.args(["auth", "can-i", "get", "nodes/proxy", "--as", user]);
        // `can-i` exits 1 for "no": the answer is on stdout either way.
        let out = output_with_input(&mut command, "")?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    assert_eq!(can_i("kube-apiserver-kubelet-client")?, "yes");
    assert_eq!(can_i("harness-somebody-else")?, "no");
    Ok(())
}
