//! The canonical text of a resource quantity (apimachinery's `resource.Quantity.String()`), so the
//! capacity and allocatable this agent posts read exactly as the kubelet's: `"8029064Ki"`, `"1900m"`,
//! `"110"`, `"2k"`. Parsing is `cm::parse_quantity`; values travel as billionths of the base unit.

/// How a quantity is written: powers of 1000 (`k`, `M`, `m`) or of 1024 (`Ki`, `Mi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuantityFormat {
    DecimalSi,
    BinarySi,
}

impl QuantityFormat {
    /// The format apimachinery infers when it parses `text`: a binary suffix means `BinarySI`.
    pub(crate) fn of(text: &str) -> Self {
        if text.ends_with('i') {
            Self::BinarySi
        } else {
            Self::DecimalSi
        }
    }
}

/// Billionths in one base unit.
pub(super) const NANOS: i128 = 1_000_000_000;

const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// Writes `nanos` billionths of the base unit in canonical form: no precision lost, no fraction
/// digits, the largest suffix that allows both. A binary quantity below 1024 or with a fraction is
/// written in decimal, as apimachinery does.
pub(crate) fn format_quantity(nanos: i128, format: QuantityFormat) -> String {
    if nanos == 0 {
        return "0".to_owned();
    }
    let whole = nanos % NANOS == 0;
    if format == QuantityFormat::BinarySi && whole && (nanos / NANOS).abs() >= 1024 {
        let mut units = nanos / NANOS;
        let mut power = 0;
        while units % 1024 == 0 && power < BINARY_SUFFIXES.len() - 1 {
            units /= 1024;
            power += 1;
        }
        return format!("{units}{}", BINARY_SUFFIXES[power]);
    }
    let mut mantissa = nanos;
    let mut exponent: i32 = -9;
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exponent += 1;
    }
    // Decimal suffixes step by 10^3, so the exponent comes down to a multiple of three.
    match exponent.rem_euclid(3) {
        1 => {
            mantissa *= 10;
            exponent -= 1;
        }
        2 => {
            mantissa *= 100;
            exponent -= 2;
        }
        _ => {}
    }
    let suffix = match exponent {
        -9 => "n".to_owned(),
        -6 => "u".to_owned(),
        -3 => "m".to_owned(),
        0 => String::new(),
        3 => "k".to_owned(),
        6 => "M".to_owned(),
        9 => "G".to_owned(),
        12 => "T".to_owned(),
        15 => "P".to_owned(),
        18 => "E".to_owned(),
        other => format!("e{other}"),
    };
    format!("{mantissa}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::QuantityFormat::{BinarySi, DecimalSi};
    use super::*;

    fn bytes(n: i128) -> i128 {
        n * NANOS
    }

    #[test]
    fn binary_quantities_take_the_largest_exact_suffix() {
        assert_eq!(
            format_quantity(bytes(8_029_064 * 1024), BinarySi),
            "8029064Ki"
        );
        assert_eq!(format_quantity(bytes(2 << 20), BinarySi), "2Mi");
        assert_eq!(format_quantity(bytes(1 << 30), BinarySi), "1Gi");
        assert_eq!(format_quantity(bytes(1024), BinarySi), "1Ki");
        // Not a multiple of 1024: plain bytes.
        assert_eq!(
            format_quantity(bytes(47_093_746_742), BinarySi),
            "47093746742"
        );
    }

    #[test]
    fn small_or_fractional_binary_quantities_are_written_in_decimal() {
        assert_eq!(format_quantity(bytes(512), BinarySi), "512");
        assert_eq!(format_quantity(bytes(1000), BinarySi), "1k");
        assert_eq!(format_quantity(1_500_000_000 * 1024, BinarySi), "1536");
        assert_eq!(
            format_quantity(NANOS * 2048 + 1, BinarySi),
            "2048000000001n"
        );
    }

    #[test]
    fn decimal_quantities_use_thousands() {
        assert_eq!(format_quantity(bytes(2), DecimalSi), "2");
        assert_eq!(format_quantity(1_900_000_000, DecimalSi), "1900m");
        assert_eq!(format_quantity(bytes(110), DecimalSi), "110");
        assert_eq!(format_quantity(bytes(2000), DecimalSi), "2k");
        assert_eq!(format_quantity(bytes(1_500_000), DecimalSi), "1500k");
        assert_eq!(format_quantity(0, DecimalSi), "0");
        assert_eq!(format_quantity(-100_000_000, DecimalSi), "-100m");
    }

    #[test]
    fn format_is_inferred_from_the_suffix() {
        assert_eq!(QuantityFormat::of("100Mi"), BinarySi);
        assert_eq!(QuantityFormat::of("100M"), DecimalSi);
        assert_eq!(QuantityFormat::of("4"), DecimalSi);
    }
}
