//! A minimal HTTP/1.1 GET over `std::net::TcpStream`, enough to poll the agent's read-only `/pods`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};

const TIMEOUT: Duration = Duration::from_secs(5);

/// GETs `path` from `127.0.0.1:port` and returns the body of a 200 response.
pub fn get(port: u16, path: &str) -> Result<Vec<u8>> {
    let response = request(port, path)?;
    parse_response(&response).with_context(|| format!("GET {path} on port {port}"))
}

/// [`get`] waiting up to `timeout` for the answer (a dense node's `/stats/summary` takes seconds).
pub fn get_within(port: u16, path: &str, timeout: Duration) -> Result<Vec<u8>> {
    let response = request_within(port, path, timeout)?;
    parse_response(&response).with_context(|| format!("GET {path} on port {port}"))
}

/// GETs `path` from `127.0.0.1:port` and returns the response's status code, whatever it is.
pub fn status(port: u16, path: &str) -> Result<u16> {
    let response = request(port, path)?;
    let status_line = response.split(|&b| b == b'\n').next().unwrap_or_default();
    String::from_utf8_lossy(status_line)
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("GET {path} on port {port}: no status line"))
}

fn request(port: u16, path: &str) -> Result<Vec<u8>> {
    request_within(port, path, TIMEOUT)
}

fn request_within(port: u16, path: &str, timeout: Duration) -> Result<Vec<u8>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("reading the response to GET {path}"))?;
    Ok(response)
}

fn parse_response(response: &[u8]) -> Result<Vec<u8>> {
    let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("response has no end of headers");
    };
    let head = String::from_utf8_lossy(&response[..split]);
    let body = &response[split + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let code = status_line.split_whitespace().nth(1).unwrap_or_default();
    if code != "200" {
        bail!("status {status_line:?}: {}", String::from_utf8_lossy(body));
    }
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if chunked {
        dechunk(body)
    } else {
        Ok(body.to_vec())
    }
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            bail!("truncated chunk size line");
        };
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .with_context(|| format!("bad chunk size {size_hex:?}"))?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plain_body_is_returned() {
        let body = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!(body, b"{}");
    }

    #[test]
    fn chunked_body_is_joined() {
        let body = parse_response(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(body, b"{\"a\":1}");
    }

    #[test]
    fn error_status_is_an_error() {
        let err = parse_response(b"HTTP/1.1 404 Not Found\r\n\r\nno").unwrap_err();
        assert!(err.to_string().contains("404"), "{err}");
    }
}
