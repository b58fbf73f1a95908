//! What the TLS listener learned about the client during the handshake, handed to the request
//! handlers as a request extension (the kubelet reads the same from `http.Request.TLS`).

use std::sync::Arc;

use rustls_pki_types::CertificateDer;

/// The certificate chain the client presented, leaf first, already verified against
/// `authentication.x509.clientCAFile` by the TLS layer. Absent when the client sent none.
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<[CertificateDer<'static>]>);

impl PeerCertificates {
    /// The client's own certificate.
    pub fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.0.first()
    }
}
