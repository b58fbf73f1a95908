//! Reading PEM certificate/key files and the self-signed serving pair the kubelet generates into its
//! certificate directory when no `tlsCertFile` is given (client-go's `cert.GenerateSelfSignedCertKey`
//! as used by `cmd/kubelet/app.InitializeTLS`).

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{InconsistentKeys, RootCertStore};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;

/// File names inside the certificate directory, as the kubelet names them.
const CERT_NAME: &str = "kubelet.crt";
const KEY_NAME: &str = "kubelet.key";
/// The generated pair's lifetime, as the kubelet's.
const VALIDITY: Duration = Duration::from_hours(365 * 24);
/// Back-dating of the generated pair, so a node whose clock is slightly behind still accepts it.
const BACKDATE: Duration = Duration::from_hours(1);

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            what,
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificates {
            what,
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

/// Loads a certificate chain and its private key, checking that they belong together.
pub(super) fn load_pair(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = certificates("certificate file", cert_file)?;
    let key_pem = read("private key file", key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| match source {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: key_file.to_owned(),
        },
        source => TlsError::Pem {
            what: "private key file",
            path: key_file.to_owned(),
            source,
        },
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::UnusableKey {
            path: key_file.to_owned(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
        Err(source @ rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            source,
        }),
        Err(source) => Err(TlsError::InvalidCertificate {
            what: "certificate file",
            path: cert_file.to_owned(),
            source,
        }),
    }
}

/// Loads the CA bundle client certificates are verified against.
pub(super) fn load_client_ca(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates("client CA file", path)? {
        roots
            .add(cert)
            .map_err(|source| TlsError::InvalidCertificate {
                what: "client CA file",
                path: path.to_owned(),
                source,
            })?;
    }
    Ok(roots)
}

/// The names the generated certificate must carry: the node name, `localhost`, the node's addresses
/// and both loopback addresses.
fn subject_alt_names(node_name: &str, addresses: &[IpAddr]) -> Vec<SanName> {
    let mut names = Vec::new();
    let mut add = |name: SanName| {
        if !names.contains(&name) {
            names.push(name);
        }
    };
    if !node_name.is_empty() {
        add(match node_name.parse::<IpAddr>() {
            Ok(ip) => SanName::Ip(ip),
            Err(_) => SanName::Dns(node_name.to_ascii_lowercase()),
        });
    }
    add(SanName::Dns("localhost".to_owned()));
    for ip in addresses {
        add(SanName::Ip(*ip));
    }
    add(SanName::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    add(SanName::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    names
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum SanName {
    Dns(String),
    Ip(IpAddr),
}

/// Returns the paths of a self-signed serving pair in `dir`: the existing one when it still loads,
/// is valid now and names this node, otherwise a freshly generated one.
pub(super) fn ensure_self_signed(
    dir: &Path,
    node_name: &str,
    addresses: &[IpAddr],
    provider: &CryptoProvider,
) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert_file = dir.join(CERT_NAME);
    let key_file = dir.join(KEY_NAME);
    let names = subject_alt_names(node_name, addresses);
    if cert_file.exists() || key_file.exists() {
        match reusable(&cert_file, &key_file, provider, &names) {
            Ok(()) => {
                tracing::info!(cert = %cert_file.display(), "reusing the self-signed serving certificate");
                return Ok((cert_file, key_file));
            }
            Err(reason) => tracing::warn!(
                cert = %cert_file.display(),
                %reason,
                "regenerating the self-signed serving certificate"
            ),
        }
    }
    let (cert_pem, key_pem) = generate(node_name, &names).map_err(|source| TlsError::Generate {
        node_name: node_name.to_owned(),
        source,
    })?;
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| TlsError::Write {
            path: dir.to_owned(),
            source,
        })?;
    write_atomically(&key_file, key_pem.as_bytes(), 0o600)?;
    write_atomically(&cert_file, cert_pem.as_bytes(), 0o644)?;
    tracing::info!(cert = %cert_file.display(), key = %key_file.display(), "generated a self-signed serving certificate");
    Ok((cert_file, key_file))
}

/// Why an existing generated pair cannot be used again, if it cannot.
fn reusable(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
    names: &[SanName],
) -> Result<(), String> {
    let certified = load_pair(cert_file, key_file, provider)
        .map_err(|error| crate::error_chain::error_chain(&error))?;
    let leaf = certified
        .end_entity_cert()
        .map_err(|error| error.to_string())?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf).map_err(|error| error.to_string())?;
    if !parsed.validity().is_valid() {
        return Err("the certificate has expired or is not valid yet".to_owned());
    }
    let present: Vec<SanName> = parsed
        .subject_alternative_name()
        .map_err(|error| error.to_string())?
        .map(|extension| {
            extension
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::DNSName(dns) => {
                        Some(SanName::Dns(dns.to_ascii_lowercase()))
                    }
                    x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                        ip_from_bytes(bytes).map(SanName::Ip)
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    match names.iter().find(|name| !present.contains(name)) {
        Some(SanName::Dns(dns)) => Err(format!("the certificate does not name {dns}")),
        Some(SanName::Ip(ip)) => Err(format!("the certificate does not name {ip}")),
        None => Ok(()),
    }
}

pub(super) fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// A throwaway CA and a serving certificate it signs, like the kubelet's: the certificate file holds
/// the serving certificate followed by the CA, so a client can trust the file as a whole.
fn generate(node_name: &str, names: &[SanName]) -> Result<(String, String), rcgen::Error> {
    let now = SystemTime::now();
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let not_before = epoch + since_epoch.saturating_sub(BACKDATE);
    let not_after = epoch + since_epoch + VALIDITY;
    let stamp = since_epoch.as_secs();

    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = common_name(&format!("{node_name}-ca@{stamp}"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(&format!("{node_name}@{stamp}"));
    params.subject_alt_names = names
        .iter()
        .map(|name| match name {
            SanName::Dns(dns) => dns.clone().try_into().map(SanType::DnsName),
            SanName::Ip(ip) => Ok(SanType::IpAddress(*ip)),
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem() + &ca_cert.pem(), key.serialize_pem()))
}

fn common_name(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

/// Writes through a temporary file and a rename, so a reader (or the rotation watcher) never sees a
/// half-written file and the key is never readable by others, not even briefly.
fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let write = || -> io::Result<()> {
        let _ = fs::remove_file(&temporary);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&temporary, path)
    };
    write().map_err(|source| TlsError::Write {
        path: path.to_owned(),
        source,
    })
}
