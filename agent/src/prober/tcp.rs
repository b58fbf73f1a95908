//! The TCP mechanism (the kubelet's `pkg/probe/tcp`): a connection opened within the timeout is a
//! success (and closed at once); anything else fails with Go's dial error text. Also the dialer the
//! HTTP and gRPC mechanisms share.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

use super::{Outcome, Probed};

/// Opens a TCP connection to `host:port`.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> Probed {
    match dial(host, port, timeout).await {
        Ok(_) => Probed::new(Outcome::Success, ""),
        Err(err) => Probed::new(Outcome::Failure, err.to_string()),
    }
}

/// Why a dial failed, printed as Go's `net.OpError` (`dial tcp 10.88.0.5:80: connect: connection
/// refused`, `dial tcp 10.88.0.5:80: i/o timeout`).
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("dial tcp {addr}: i/o timeout")]
    Timeout { addr: String },
    #[error("dial tcp {addr}: connect: {}", os_text(.source))]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("dial tcp: lookup {host}: {}", os_text(.source))]
    Lookup {
        host: String,
        #[source]
        source: io::Error,
    },
}

/// `host:port` as Go's `net.JoinHostPort` writes it (IPv6 in brackets).
pub fn join_host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    }
}

/// The error text Go prints for an errno (lower case, no `(os error N)`).
fn os_text(err: &io::Error) -> String {
    let Some(code) = err.raw_os_error() else {
        return err.to_string();
    };
    let desc = nix::errno::Errno::from_raw(code).desc();
    let mut chars = desc.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => err.to_string(),
    }
}

/// Connects to `host:port` (a name is resolved first) within `timeout`.
pub async fn dial(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, DialError> {
    let addr = join_host_port(host, port);
    let connect = async {
        let targets: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|source| DialError::Lookup {
                    host: host.to_owned(),
                    source,
                })?
                .collect(),
        };
        let mut last = None;
        for target in targets {
            match TcpStream::connect(target).await {
                Ok(stream) => {
                    // Probes are one request each: no delay for small writes.
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(source) => last = Some(source),
            }
        }
        Err(DialError::Connect {
            addr: addr.clone(),
            source: last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable)),
        })
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(result) => result,
        Err(_) => Err(DialError::Timeout { addr }),
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    #[tokio::test]
    async fn an_open_port_succeeds_and_a_closed_one_fails_like_go() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(
            probe("127.0.0.1", port, Duration::from_secs(1)).await,
            Probed::new(Outcome::Success, "")
        );
        drop(listener);
        let refused = probe("127.0.0.1", port, Duration::from_secs(1)).await;
        assert_eq!(refused.outcome, Outcome::Failure);
        assert_eq!(
            refused.output,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );
    }

    #[test]
    fn a_dial_timeout_prints_like_go() {
        let err = DialError::Timeout {
            addr: join_host_port("10.255.255.1", 80),
        };
        assert_eq!(err.to_string(), "dial tcp 10.255.255.1:80: i/o timeout");
    }

    #[test]
    fn hosts_join_like_go() {
        assert_eq!(join_host_port("10.88.0.5", 80), "10.88.0.5:80");
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("example.com", 443), "example.com:443");
    }
}
