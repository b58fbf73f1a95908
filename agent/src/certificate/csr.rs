//! Asking the API server for a certificate (client-go's `util/certificate/csr`): a PKCS#10 request for
//! the node's identity (`CN=system:node:<node>`, `O=system:nodes`, and the node's names for a serving
//! certificate) is posted as a `CertificateSigningRequest` to the given signer, and the agent waits
//! until it is approved and issued, denied, or failed.

use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use sha2::{Digest as _, Sha256};

use super::{CertificateError, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER};
use crate::apiserver::{ApiClient, is_already_exists};

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsrTemplate {
    pub node_name: String,
    pub signer: &'static str,
    pub usages: &'static [&'static str],
    /// Subject alternative names (serving certificates only).
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl CsrTemplate {
    /// The node's client certificate, as the kubelet asks for it.
    pub fn client(node_name: &str) -> Self {
        Self {
            node_name: node_name.to_owned(),
            signer: KUBELET_CLIENT_SIGNER,
            usages: &["digital signature", "client auth"],
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }

    /// The node's serving certificate for its hostname and addresses. The key is ECDSA, so no
    /// "key encipherment" (the kubelet asks for it only for RSA keys).
    pub fn serving(node_name: &str, hostname: &str, ips: &[IpAddr]) -> Self {
        Self {
            node_name: node_name.to_owned(),
            signer: KUBELET_SERVING_SIGNER,
            usages: &["digital signature", "server auth"],
            dns_names: (!hostname.is_empty())
                .then(|| hostname.to_owned())
                .into_iter()
                .collect(),
            ips: ips.to_vec(),
        }
    }

    /// The PKCS#10 request (PEM) signed with `key`.
    pub fn request_pem(&self, key: &rcgen::KeyPair) -> Result<String, CertificateError> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("system:node:{}", self.node_name),
        );
        for name in &self.dns_names {
            let name =
                rcgen::string::Ia5String::try_from(name.as_str()).map_err(CertificateError::Key)?;
            params.subject_alt_names.push(rcgen::SanType::DnsName(name));
        }
        params
            .subject_alt_names
            .extend(self.ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
        params
            .serialize_request(key)
            .and_then(|csr| csr.pem())
            .map_err(CertificateError::Key)
    }

    /// The request's name: a digest of the key, the node and the signer, so the same key asks under
    /// the same name (the kubelet derives its bootstrap `node-csr-` names the same way).
    pub fn request_name(&self, key: &rcgen::KeyPair) -> String {
        let mut digest = Sha256::new();
        digest.update(key.public_key_raw());
        digest.update(self.node_name.as_bytes());
        if self.signer != KUBELET_CLIENT_SIGNER {
            digest.update(self.signer.as_bytes());
        }
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.finalize());
        format!("node-csr-{encoded}")
    }
}

/// Posts the request for `template` signed with `key` (or finds the one an earlier attempt with the
/// same key posted) and waits at most `timeout` for its certificate (PEM).
pub async fn request_certificate(
    client: &ApiClient,
    template: &CsrTemplate,
    key: &rcgen::KeyPair,
    timeout: Duration,
) -> Result<Vec<u8>, CertificateError> {
    let csr_pem = template.request_pem(key)?;
    let name = template.request_name(key);
    let request = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: template.signer.to_owned(),
            usages: Some(template.usages.iter().map(|&u| u.to_owned()).collect()),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let api = Api::<CertificateSigningRequest>::all(client.client());
    match api.create(&PostParams::default(), &request).await {
        Ok(_) => {
            tracing::info!(csr = %name, signer = template.signer, "certificate signing request created; waiting for approval");
        }
        Err(err) if is_already_exists(&err) => {
            tracing::info!(csr = %name, "waiting for the certificate signing request of an earlier attempt");
        }
        Err(err) => {
            return Err(CertificateError::Request(client.describe(
                &format!("create certificatesigningrequest/{name}"),
                &err,
            )));
        }
    }
    let issued = kube::runtime::wait::await_condition(
        Api::<CertificateSigningRequest>::all(client.watch_client()),
        &name,
        is_decided,
    );
    let decided = tokio::time::timeout(timeout, issued)
        .await
        .map_err(|_| CertificateError::Timeout {
            name: name.clone(),
            timeout,
        })?
        .map_err(|err| {
            CertificateError::Request(format!(
                "waiting for certificatesigningrequest/{name}: {}",
                crate::error_chain::error_chain(&err)
            ))
        })?;
    let status = decided.and_then(|csr| csr.status).unwrap_or_default();
    for condition in status.conditions.iter().flatten() {
        let message = condition.message.clone().unwrap_or_default();
        match condition.type_.as_str() {
            "Denied" => return Err(CertificateError::Denied { name, message }),
            "Failed" => return Err(CertificateError::Failed { name, message }),
            _ => {}
        }
    }
    status
        .certificate
        .map(|certificate| certificate.0)
        .filter(|certificate| !certificate.is_empty())
        .ok_or_else(|| {
            CertificateError::Request(format!(
                "certificatesigningrequest/{name} was deleted before it was issued"
            ))
        })
}

/// Denied, failed, or issued (approved with a certificate).
fn is_decided(csr: Option<&CertificateSigningRequest>) -> bool {
    let Some(status) = csr.and_then(|csr| csr.status.as_ref()) else {
        return csr.is_none();
    };
    let final_condition = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Denied" || c.type_ == "Failed");
    final_condition || status.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };
    use x509_parser::prelude::FromDer as _;

    fn csr(conditions: &[&str], certificate: &[u8]) -> CertificateSigningRequest {
        CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|t| CertificateSigningRequestCondition {
                            type_: (*t).to_owned(),
                            status: "True".to_owned(),
                            ..CertificateSigningRequestCondition::default()
                        })
                        .collect(),
                ),
                certificate: Some(ByteString(certificate.to_vec())),
            }),
            ..CertificateSigningRequest::default()
        }
    }

    #[test]
    fn a_request_is_decided_when_issued_denied_or_failed() {
        assert!(!is_decided(Some(&csr(&[], b""))));
        assert!(!is_decided(Some(&csr(&["Approved"], b""))));
        assert!(is_decided(Some(&csr(&["Approved"], b"cert"))));
        assert!(is_decided(Some(&csr(&["Denied"], b""))));
        assert!(is_decided(Some(&csr(&["Failed"], b""))));
        assert!(is_decided(None), "a deleted request ends the wait");
    }

    #[test]
    fn the_same_key_asks_under_the_same_name() {
        let key = rcgen::KeyPair::generate().unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        let n1 = CsrTemplate::client("n1");
        assert_eq!(n1.request_name(&key), n1.request_name(&key));
        assert_ne!(n1.request_name(&key), n1.request_name(&other));
        assert_ne!(
            n1.request_name(&key),
            CsrTemplate::client("n2").request_name(&key)
        );
        let serving = CsrTemplate::serving("n1", "n1", &[]);
        assert_ne!(n1.request_name(&key), serving.request_name(&key));
        assert!(n1.request_name(&key).starts_with("node-csr-"));
    }

    #[test]
    fn a_serving_request_names_the_node_and_its_addresses() {
        let key = rcgen::KeyPair::generate().unwrap();
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let template = CsrTemplate::serving("n1", "n1.example", &[ip]);
        let pem = template.request_pem(&key).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let (_, request) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
                .unwrap();
        let subject = &request.certification_request_info.subject;
        let common_names: Vec<_> = subject
            .iter_common_name()
            .map(|cn| cn.as_str().unwrap())
            .collect();
        let organizations: Vec<_> = subject
            .iter_organization()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(common_names, ["system:node:n1"]);
        assert_eq!(organizations, ["system:nodes"]);
        let mut names = Vec::new();
        for extension in request.requested_extensions().into_iter().flatten() {
            if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = extension
            {
                for name in &san.general_names {
                    names.push(match name {
                        x509_parser::extensions::GeneralName::DNSName(dns) => (*dns).to_owned(),
                        x509_parser::extensions::GeneralName::IPAddress(ip) => {
                            let octets: [u8; 4] = (*ip).try_into().unwrap();
                            IpAddr::from(octets).to_string()
                        }
                        other => format!("{other:?}"),
                    });
                }
            }
        }
        assert_eq!(names, ["n1.example", "10.0.0.7"]);
        assert_eq!(template.signer, "kubernetes.io/kubelet-serving");
        assert!(CsrTemplate::client("n1").usages.contains(&"client auth"));
    }
}
