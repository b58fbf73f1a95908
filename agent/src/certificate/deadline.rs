//! When a certificate is renewed: client-go's `nextRotationDeadline`, a random point between 70 % and
//! 90 % of its lifetime (`notBefore + lifetime * (0.7 + 0.2 * r)`), so nodes that joined together do
//! not all renew together, and every node renews well before its certificate expires.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::CertificateError;

/// The share of a certificate's lifetime after which renewal may start, and the spread above it.
const EARLIEST: f64 = 0.7;
const SPREAD: f64 = 0.2;

/// The validity period of a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// The period of the first certificate in `pem` (the leaf; a key may follow it).
    pub fn of_pem(pem: &[u8], what: &str) -> Result<Self, CertificateError> {
        let parse = || CertificateError::Parse {
            what: what.to_owned(),
        };
        let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|_| parse())?;
        let certificate = block.parse_x509().map_err(|_| parse())?;
        let validity = certificate.validity();
        let at = |seconds: i64| {
            u64::try_from(seconds).map_or(UNIX_EPOCH, |s| UNIX_EPOCH + Duration::from_secs(s))
        };
        Ok(Self {
            not_before: at(validity.not_before.timestamp()),
            not_after: at(validity.not_after.timestamp()),
        })
    }

    /// The renewal deadline for a draw `r` in `[0, 1)`.
    pub fn deadline(&self, r: f64) -> SystemTime {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        let share = EARLIEST + SPREAD * r.clamp(0.0, 1.0);
        self.not_before + lifetime.mul_f64(share)
    }

    /// The renewal deadline with a fresh random draw.
    pub fn jittered_deadline(&self) -> SystemTime {
        self.deadline(fastrand::f64())
    }

    /// What is left of the lifetime at `now` (zero once expired).
    pub fn remaining(&self, now: SystemTime) -> Duration {
        self.not_after.duration_since(now).unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn certificate(lifetime: Duration) -> (String, SystemTime) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        let start = UNIX_EPOCH + Duration::from_hours(500_000);
        params.not_before = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_hours(500_000);
        params.not_after = params.not_before + lifetime;
        (params.self_signed(&key).unwrap().pem(), start)
    }

    #[test]
    fn the_deadline_falls_between_70_and_90_percent_of_the_lifetime() {
        let (pem, start) = certificate(Duration::from_mins(10));
        let validity = Validity::of_pem(pem.as_bytes(), "test").unwrap();
        assert_eq!(validity.not_before, start);
        assert_eq!(validity.not_after, start + Duration::from_mins(10));
        assert_eq!(validity.deadline(0.0), start + Duration::from_mins(7));
        assert_eq!(validity.deadline(0.5), start + Duration::from_mins(8));
        assert_eq!(validity.deadline(1.0), start + Duration::from_mins(9));
        for _ in 0..100 {
            let deadline = validity.jittered_deadline();
            assert!(deadline >= start + Duration::from_mins(7), "{deadline:?}");
            assert!(deadline < start + Duration::from_mins(9), "{deadline:?}");
        }
    }

    #[test]
    fn a_key_after_the_certificate_does_not_matter_and_garbage_is_refused() {
        let (pem, start) = certificate(Duration::from_hours(1));
        let with_key =
            format!("{pem}-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n");
        let validity = Validity::of_pem(with_key.as_bytes(), "test").unwrap();
        assert_eq!(validity.remaining(start), Duration::from_hours(1));
        assert_eq!(
            validity.remaining(start + Duration::from_hours(2)),
            Duration::ZERO
        );
        let error = Validity::of_pem(b"not pem", "kubelet-client-current.pem").unwrap_err();
        assert_eq!(
            error.to_string(),
            "kubelet-client-current.pem holds no PEM certificate that can be parsed"
        );
    }
}
