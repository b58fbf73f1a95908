//! Reports failed TLS handshakes on the kubelet API port. A client whose certificate rustls refuses
//! (unknown CA, expired, X.509 v1, ...) would otherwise just see its connection dropped, with nothing
//! on the node saying why. Go's HTTP server, which the kubelet uses, logs every failure as
//! `http: TLS handshake error from <addr>: <reason>`; here the same line is logged with the rustls
//! error, but at most once per client address and reason in [`WINDOW`] (a misconfigured client
//! retrying in a loop, or a scanner, must not flood the log), and every failure is counted in
//! `ringlet_tls_handshake_errors_total{reason}`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::{Metrics, TlsHandshakeError};

/// One line per client address and reason in this window; the ones held back are counted and
/// mentioned in the next line.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);
/// Client addresses remembered at once. Past this (many clients failing within one window), the
/// new ones share one entry per reason, so memory stays bounded while lines still come out.
const MAX_REMEMBERED: usize = 1024;

/// Why a handshake failed, as logged and counted.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: TlsHandshakeError,
    /// The rustls error (or the I/O error) as text: what the log line says.
    pub(crate) reason: String,
}

impl Failure {
    /// Classifies the error the TLS acceptor returned; tokio-rustls hands rustls's own error over
    /// inside the `io::Error`.
    pub(crate) fn of(error: &io::Error) -> Self {
        let tls = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let kind = match tls {
            Some(
                rustls::Error::InvalidCertificate(_)
                | rustls::Error::NoCertificatesPresented
                | rustls::Error::InvalidCertRevocationList(_),
            ) => TlsHandshakeError::Certificate,
            Some(rustls::Error::AlertReceived(_)) => TlsHandshakeError::Alert,
            Some(_) => TlsHandshakeError::Protocol,
            None => TlsHandshakeError::Io,
        };
        let reason = tls.map_or_else(|| error.to_string(), ToString::to_string);
        Self { kind, reason }
    }

    /// A handshake the client did not finish within `timeout`.
    pub(crate) fn timed_out(timeout: Duration) -> Self {
        Self {
            kind: TlsHandshakeError::Timeout,
            reason: format!("no complete handshake within {timeout:?}"),
        }
    }
}

/// What became of one reported failure (for tests; the caller only reports).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reported {
    /// Logged; `suppressed` earlier failures of the same client and reason were held back.
    Logged { suppressed: u64 },
    /// Held back: the same client and reason were logged less than [`WINDOW`] ago.
    Suppressed,
}

/// The rate limiter and counter of one listener's handshake failures.
#[derive(Debug)]
pub(crate) struct HandshakeErrors {
    metrics: Option<Metrics>,
    /// (client address, reason) → when it was last logged and how many were held back since.
    recent: Mutex<HashMap<(IpAddr, String), (Instant, u64)>>,
}

impl HandshakeErrors {
    pub(crate) fn new(metrics: Option<Metrics>) -> Self {
        Self {
            metrics,
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Counts the failure and logs it unless the same client and reason were logged within
    /// [`WINDOW`]. Keyed by the client's address without the port: every retry has a new port.
    pub(crate) fn report(&self, peer: SocketAddr, failure: &Failure) -> Reported {
        if let Some(metrics) = &self.metrics {
            metrics.inc_tls_handshake_error(failure.kind);
        }
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let mut key = (peer.ip(), failure.reason.clone());
        if !recent.contains_key(&key) && recent.len() >= MAX_REMEMBERED {
            recent.retain(|_, (logged, _)| now.duration_since(*logged) < WINDOW);
            if recent.len() >= MAX_REMEMBERED {
                key.0 = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
            }
        }
        let suppressed = match recent.get_mut(&key) {
            Some((logged, held_back)) if now.duration_since(*logged) < WINDOW => {
                *held_back += 1;
                return Reported::Suppressed;
            }
            Some((_, held_back)) => std::mem::take(held_back),
            None => 0,
        };
        recent.insert(key, (now, 0));
        drop(recent);
        let reason = &failure.reason;
        match failure.kind {
            // A refused certificate or a refusing client is a configuration problem to fix.
            TlsHandshakeError::Certificate | TlsHandshakeError::Alert => tracing::warn!(
                kind = failure.kind.label(),
                suppressed,
                "TLS handshake error from {peer}: {reason}"
            ),
            // Port scans and TCP health checks connect and close; worth a line, not a warning.
            TlsHandshakeError::Protocol | TlsHandshakeError::Io | TlsHandshakeError::Timeout => {
                tracing::info!(
                    kind = failure.kind.label(),
                    suppressed,
                    "TLS handshake error from {peer}: {reason}"
                );
            }
        }
        Reported::Logged { suppressed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate_failure() -> Failure {
        let error = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        Failure::of(&error)
    }

    #[test]
    fn the_rustls_error_is_the_reason_and_decides_the_kind() {
        let failure = certificate_failure();
        assert_eq!(failure.kind, TlsHandshakeError::Certificate);
        assert!(
            failure.reason.contains("UnknownIssuer"),
            "{}",
            failure.reason
        );

        let alert = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate),
        );
        assert_eq!(Failure::of(&alert).kind, TlsHandshakeError::Alert);

        let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof");
        let failure = Failure::of(&eof);
        assert_eq!(failure.kind, TlsHandshakeError::Io);
        assert_eq!(failure.reason, "tls handshake eof");
    }

    #[tokio::test(start_paused = true)]
    async fn one_line_per_client_and_reason_per_window_and_every_failure_counted() {
        let metrics = Metrics::new().unwrap();
        let errors = HandshakeErrors::new(Some(metrics.clone()));
        let client: SocketAddr = "10.0.0.7:40000".parse().unwrap();
        let retry: SocketAddr = "10.0.0.7:40001".parse().unwrap();
        let other: SocketAddr = "10.0.0.8:40000".parse().unwrap();
        let failure = certificate_failure();

        assert_eq!(
            errors.report(client, &failure),
            Reported::Logged { suppressed: 0 }
        );
        assert_eq!(errors.report(retry, &failure), Reported::Suppressed);
        assert_eq!(errors.report(client, &failure), Reported::Suppressed);
        assert_eq!(
            errors.report(other, &failure),
            Reported::Logged { suppressed: 0 },
            "another client is another line"
        );
        let timeout = Failure::timed_out(Duration::from_secs(10));
        assert_eq!(
            errors.report(client, &timeout),
            Reported::Logged { suppressed: 0 },
            "another reason is another line"
        );

        tokio::time::advance(WINDOW).await;
        assert_eq!(
            errors.report(client, &failure),
            Reported::Logged { suppressed: 2 },
            "the next line says how many were held back"
        );

        let rendered = metrics.render().unwrap();
        assert!(
            rendered.contains("ringlet_tls_handshake_errors_total{reason=\"certificate\"} 5"),
            "{rendered}"
        );
        assert!(rendered.contains("ringlet_tls_handshake_errors_total{reason=\"timeout\"} 1"));
    }

    #[tokio::test(start_paused = true)]
    async fn many_failing_clients_share_one_entry_past_the_bound() {
        let errors = HandshakeErrors::new(None);
        let failure = certificate_failure();
        let mut logged = 0;
        for i in 0..u32::try_from(MAX_REMEMBERED + 100).unwrap() {
            let peer = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)), 1);
            if matches!(errors.report(peer, &failure), Reported::Logged { .. }) {
                logged += 1;
            }
        }
        // Each remembered client once, then one line for all the rest of the window.
        assert_eq!(logged, MAX_REMEMBERED + 1);
        let remembered = errors.recent.lock().unwrap().len();
        assert_eq!(remembered, MAX_REMEMBERED + 1);
    }
}
