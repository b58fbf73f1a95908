//! Go duration strings (`"20s"`, `"1m30s"`, `"1.5h"`, `"300ms"`), the format of every `metav1.Duration`
//! field in a `KubeletConfiguration` and of the kubelet's duration flags.

use std::time::Duration;

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration (expected e.g. \"20s\", \"1m30s\", \"2h\")")]
    Empty,
    #[error("invalid duration {input:?}: {reason} (expected e.g. \"20s\", \"1m30s\", \"2h\")")]
    Invalid { input: String, reason: &'static str },
    #[error("invalid duration {input:?}: unknown unit {unit:?} (valid units: ns, us, ms, s, m, h)")]
    UnknownUnit { input: String, unit: String },
    #[error("duration {input:?} must not be negative")]
    Negative { input: String },
    #[error("duration {input:?} is too large")]
    Overflow { input: String },
}

const NANOS_PER_UNIT: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Go's `time.Duration` is an `int64` of nanoseconds; values beyond it are rejected as Go would.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Parses a Go duration string: an optional sign and a sequence of decimal numbers, each with an
/// optional fraction and a unit. `"0"` needs no unit. Negative durations are rejected because no
/// duration ringlet reads may be negative.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let invalid = |reason| DurationError::Invalid {
        input: input.to_owned(),
        reason,
    };
    let (negative, rest) = match input.as_bytes().first() {
        None => return Err(DurationError::Empty),
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        Some(_) => (false, input),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid("no number"));
    }

    let mut total: u128 = 0;
    let mut rest = rest;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &after_dot[..frac_len];
            rest = &after_dot[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid("expected a number"));
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if unit.is_empty() {
            return Err(invalid("missing unit"));
        }
        let per_unit = NANOS_PER_UNIT
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, nanos)| *nanos)
            .ok_or_else(|| DurationError::UnknownUnit {
                input: input.to_owned(),
                unit: unit.to_owned(),
            })?;
        let overflow = || DurationError::Overflow {
            input: input.to_owned(),
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| overflow())?
        };
        // Digits beyond nanosecond precision cannot change the result; dropping them keeps the
        // arithmetic in range.
        let frac_digits = &frac_part[..frac_part.len().min(18)];
        let mut frac_nanos: u128 = 0;
        if !frac_digits.is_empty() {
            let numerator: u128 = frac_digits.parse().map_err(|_| overflow())?;
            let scale = 10u128.pow(u32::try_from(frac_digits.len()).map_err(|_| overflow())?);
            frac_nanos = numerator * per_unit / scale;
        }
        total = whole
            .checked_mul(per_unit)
            .and_then(|n| n.checked_add(frac_nanos))
            .and_then(|n| n.checked_add(total))
            .filter(|n| *n <= MAX_NANOS)
            .ok_or_else(overflow)?;
    }

    if negative && total > 0 {
        return Err(DurationError::Negative {
            input: input.to_owned(),
        });
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| DurationError::Overflow {
        input: input.to_owned(),
    })?;
    let nanos = u32::try_from(total % 1_000_000_000).map_err(|_| DurationError::Overflow {
        input: input.to_owned(),
    })?;
    Ok(Duration::new(secs, nanos))
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("20s", Duration::from_secs(20)),
            ("1m", Duration::from_mins(1)),
            ("1m30s", Duration::from_secs(90)),
            ("2h", Duration::from_hours(2)),
            ("1h2m3s", Duration::from_secs(3723)),
            ("1.5h", Duration::from_mins(90)),
            (".5s", Duration::from_millis(500)),
            ("300ms", Duration::from_millis(300)),
            ("10us", Duration::from_micros(10)),
            ("10\u{b5}s", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("+5s", Duration::from_secs(5)),
            ("1m0s", Duration::from_mins(1)),
            ("-0s", Duration::ZERO),
            ("1.000000001s", Duration::new(1, 1)),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_duration(input), Ok(expected), "{input}");
        }
    }

    #[test]
    fn rejects_bad_durations() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for input in ["20", "s", "1.s.", "abc", "1m30", "-", "."] {
            assert!(
                matches!(parse_duration(input), Err(DurationError::Invalid { .. })),
                "{input}: {:?}",
                parse_duration(input)
            );
        }
        assert_eq!(
            parse_duration("5d"),
            Err(DurationError::UnknownUnit {
                input: "5d".into(),
                unit: "d".into()
            })
        );
        assert_eq!(
            parse_duration("-5s"),
            Err(DurationError::Negative {
                input: "-5s".into()
            })
        );
        assert!(matches!(
            parse_duration("9999999999h"),
            Err(DurationError::Overflow { .. })
        ));
    }

    #[test]
    fn error_message_says_what_is_expected() {
        let message = parse_duration("5d").map_err(|e| e.to_string()).unwrap_err();
        assert!(message.contains("\"5d\""), "{message}");
        assert!(message.contains("valid units"), "{message}");
    }
}
