//! Client-certificate authentication (k8s.io/apiserver's `pkg/authentication/request/x509` with
//! `CommonNameUserConversion`): the TLS listener has already verified the chain against
//! `authentication.x509.clientCAFile`; here the leaf's subject becomes the user: CN is the name,
//! every O is a group.

use x509_parser::error::X509Error;
use x509_parser::prelude::{FromDer as _, X509Certificate};

use super::UserInfo;
use crate::server::PeerCertificates;

#[derive(Debug, thiserror::Error)]
pub enum X509AuthError {
    #[error("parsing the client certificate")]
    Parse {
        #[source]
        source: x509_parser::nom::Err<X509Error>,
    },
    #[error("reading the {attribute} of the client certificate's subject as a string")]
    Attribute {
        attribute: &'static str,
        #[source]
        source: X509Error,
    },
}

/// The user the client certificate names, or `None` when there is no certificate or its subject has
/// no common name (the kubelet then tries the next authenticator).
pub(crate) fn authenticate(
    peer: Option<&PeerCertificates>,
) -> Result<Option<UserInfo>, X509AuthError> {
    let Some(leaf) = peer.and_then(PeerCertificates::leaf) else {
        return Ok(None);
    };
    let (_, certificate) =
        X509Certificate::from_der(leaf).map_err(|source| X509AuthError::Parse { source })?;
    let subject = certificate.subject();
    // Go's `pkix.Name.CommonName`, which the kubelet reads, keeps the last CN of the subject.
    let Some(common_name) = subject.iter_common_name().last() else {
        return Ok(None);
    };
    let name = common_name
        .as_str()
        .map_err(|source| X509AuthError::Attribute {
            attribute: "common name",
            source,
        })?;
    if name.is_empty() {
        return Ok(None);
    }
    let groups = subject
        .iter_organization()
        .map(|organization| {
            organization
                .as_str()
                .map(str::to_owned)
                .map_err(|source| X509AuthError::Attribute {
                    attribute: "organization",
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(UserInfo {
        name: name.to_owned(),
        groups,
        ..UserInfo::default()
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rcgen::{CertificateParams, DnType, KeyPair};

    use super::*;

    fn peer(params: &CertificateParams) -> PeerCertificates {
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        PeerCertificates(Arc::from(vec![certificate.der().clone()]))
    }

    #[test]
    fn subject_becomes_the_user() {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "alice");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "devs");
        // rcgen keeps one value per attribute type; the raw organizationName OID adds a second O.
        params
            .distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 10]), "ops");
        let user = authenticate(Some(&peer(&params))).unwrap().unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["devs", "ops"]);
        assert_eq!(user.uid, "");
    }

    #[test]
    fn no_certificate_or_no_common_name_is_not_a_user() {
        assert_eq!(authenticate(None).unwrap(), None);
        let empty = PeerCertificates(Arc::from(Vec::new()));
        assert_eq!(authenticate(Some(&empty)).unwrap(), None);
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "devs");
        assert_eq!(authenticate(Some(&peer(&params))).unwrap(), None);
    }

    #[test]
    fn garbage_is_an_error() {
        let garbage = PeerCertificates(Arc::from(vec![rustls_pki_types::CertificateDer::from(
            vec![1_u8, 2, 3],
        )]));
        assert!(authenticate(Some(&garbage)).is_err());
    }
}
