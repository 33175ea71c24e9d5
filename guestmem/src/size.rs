//! Sizes as people type them (`512M`, `4G`, `1.5GiB`) and as they read them
//! (`512 MiB`, `1.5 GiB`).
//!
//! Every unit is a power of 1024, whether written `M`, `MB` or `MiB`: memory
//! sizes are always meant in binary units here, and accepting `MB` as 10^6
//! would silently produce sizes that are not multiples of a page.

/// Why a size could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Nothing but whitespace was given.
    #[error("empty size; give a number of bytes with an optional K, M, G or T suffix, e.g. 512M")]
    Empty,
    /// The text does not start with a number.
    #[error("'{input}' is not a size: it must start with a number, e.g. 512M or 4G")]
    NoNumber {
        /// The text as given.
        input: String,
    },
    /// The unit after the number is not one we know.
    #[error(
        "unknown unit '{suffix}' in '{input}'; use K, M, G or T (powers of 1024), \
         optionally followed by B or iB, e.g. 512M or 512MiB"
    )]
    BadSuffix {
        /// The text as given.
        input: String,
        /// The part after the number.
        suffix: String,
    },
    /// The size does not fit in 64 bits.
    #[error("'{input}' is too large: a size must be below 16 EiB")]
    Overflow {
        /// The text as given.
        input: String,
    },
    /// A fractional number did not come out as a whole number of bytes.
    #[error(
        "'{input}' is not a whole number of bytes; use a smaller unit, e.g. 1536M instead of 1.5G"
    )]
    Fractional {
        /// The text as given.
        input: String,
    },
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Fraction digits beyond this many cannot name a whole number of bytes for
/// any unit up to TiB (2^40 < 10^13), and bounding them keeps the exact
/// arithmetic within u128.
const MAX_FRACTION_DIGITS: usize = 20;

/// Parses a size such as `512M`, `4G`, `1T`, `64K`, `4096`, `512MiB`, `2 GB`
/// or `1.5G` into bytes.
///
/// Units are case-insensitive powers of 1024; `B` and `iB` after the unit
/// letter are optional. A fractional number is accepted when it denotes a
/// whole number of bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let input = s.trim();
    if input.is_empty() {
        return Err(SizeError::Empty);
    }
    let number_len = input
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(input.len());
    let (number, rest) = input.split_at(number_len);
    let suffix = rest.trim_start();

    let (int_digits, frac_digits) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    let has_point = number.contains('.');
    let malformed =
        int_digits.is_empty() || frac_digits.contains('.') || (has_point && frac_digits.is_empty());
    if malformed {
        return Err(SizeError::NoNumber {
            input: input.to_string(),
        });
    }

    let unit_bytes = unit_bytes(suffix).ok_or_else(|| SizeError::BadSuffix {
        input: input.to_string(),
        suffix: suffix.to_string(),
    })?;
    let overflow = || SizeError::Overflow {
        input: input.to_string(),
    };

    let int_value: u64 = int_digits.parse().map_err(|_| overflow())?;
    let whole_bytes = int_value.checked_mul(unit_bytes).ok_or_else(overflow)?;

    let frac_digits = frac_digits.trim_end_matches('0');
    if frac_digits.is_empty() {
        return Ok(whole_bytes);
    }
    let fractional = || SizeError::Fractional {
        input: input.to_string(),
    };
    if frac_digits.len() > MAX_FRACTION_DIGITS {
        return Err(fractional());
    }
    let numerator: u128 =
        frac_digits.parse::<u128>().map_err(|_| fractional())? * u128::from(unit_bytes);
    let denominator = 10u128.pow(frac_digits.len() as u32);
    if numerator % denominator != 0 {
        return Err(fractional());
    }
    let frac_bytes = u64::try_from(numerator / denominator).map_err(|_| overflow())?;
    whole_bytes.checked_add(frac_bytes).ok_or_else(overflow)
}

/// The multiplier for a unit suffix, or `None` if the suffix is unknown.
fn unit_bytes(suffix: &str) -> Option<u64> {
    let lower = suffix.to_ascii_lowercase();
    let (letter, tail) = match lower.chars().next() {
        None => return Some(1),
        Some(c) => (c, &lower[c.len_utf8()..]),
    };
    let multiplier = match letter {
        'b' if tail.is_empty() => return Some(1),
        'k' => KIB,
        'm' => MIB,
        'g' => GIB,
        't' => TIB,
        _ => return None,
    };
    matches!(tail, "" | "b" | "ib").then_some(multiplier)
}

/// Binary units from the largest down, with their names for people and
/// their single-letter forms that [`parse_size`] accepts.
const UNITS: [(u64, &str, &str); 4] = [
    (TIB, "TiB", "T"),
    (GIB, "GiB", "G"),
    (MIB, "MiB", "M"),
    (KIB, "KiB", "K"),
];

/// Formats a byte count for people: `512 MiB`, `1.5 GiB`, `4 KiB`, `100 B`.
///
/// Values that are not whole in their unit are rounded to two decimals, so
/// the result is exact only when it has no decimals; use
/// [`format_size_arg`] where the text must parse back to the same number.
pub fn format_size(bytes: u64) -> String {
    for (index, &(unit, name, _)) in UNITS.iter().enumerate() {
        if bytes < unit {
            continue;
        }
        let hundredths = (u128::from(bytes) * 100 + u128::from(unit) / 2) / u128::from(unit);
        // Rounding can carry into the next unit (1023.999 MiB -> 1024.00 MiB);
        // the larger unit reads better then.
        if hundredths >= 1024 * 100 && index > 0 {
            let (larger, larger_name, _) = UNITS[index - 1];
            let hundredths =
                (u128::from(bytes) * 100 + u128::from(larger) / 2) / u128::from(larger);
            return format_hundredths(hundredths, larger_name);
        }
        return format_hundredths(hundredths, name);
    }
    format!("{bytes} B")
}

fn format_hundredths(hundredths: u128, unit_name: &str) -> String {
    let whole = hundredths / 100;
    let frac = hundredths % 100;
    if frac == 0 {
        format!("{whole} {unit_name}")
    } else if frac % 10 == 0 {
        format!("{whole}.{} {unit_name}", frac / 10)
    } else {
        format!("{whole}.{frac:02} {unit_name}")
    }
}

/// Formats a byte count exactly, in the shortest form that [`parse_size`]
/// reads back to the same value: `4G`, `998M`, `64K`, `12345`. Suitable for
/// suggesting command-line values.
pub fn format_size_arg(bytes: u64) -> String {
    for &(unit, _, letter) in &UNITS {
        if bytes != 0 && bytes % unit == 0 {
            return format!("{}{letter}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_case_insensitively() {
        assert_eq!(parse_size("512M"), Ok(512 * MIB));
        assert_eq!(parse_size("512m"), Ok(512 * MIB));
        assert_eq!(parse_size("4G"), Ok(4 * GIB));
        assert_eq!(parse_size("1T"), Ok(TIB));
        assert_eq!(parse_size("64K"), Ok(64 * KIB));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("4096b"), Ok(4096));
    }

    #[test]
    fn parses_b_and_ib_suffixes_as_binary() {
        assert_eq!(parse_size("512MiB"), Ok(512 * MIB));
        assert_eq!(parse_size("512mib"), Ok(512 * MIB));
        assert_eq!(parse_size("512MB"), Ok(512 * MIB));
        assert_eq!(parse_size("2GiB"), Ok(2 * GIB));
        assert_eq!(parse_size("1kb"), Ok(KIB));
    }

    #[test]
    fn accepts_whitespace_and_reads_format_size_output() {
        assert_eq!(parse_size("  2 GiB "), Ok(2 * GIB));
        assert_eq!(parse_size(&format_size(512 * MIB)), Ok(512 * MIB));
        assert_eq!(parse_size(&format_size(3 * GIB / 2)), Ok(3 * GIB / 2));
    }

    #[test]
    fn parses_exact_fractions() {
        assert_eq!(parse_size("1.5G"), Ok(1536 * MIB));
        assert_eq!(parse_size("0.5K"), Ok(512));
        assert_eq!(parse_size("1.250M"), Ok(1280 * KIB));
        assert_eq!(parse_size("2.0"), Ok(2));
        assert!(matches!(
            parse_size("1.3K"),
            Err(SizeError::Fractional { .. })
        ));
        assert!(matches!(
            parse_size("0.5"),
            Err(SizeError::Fractional { .. })
        ));
    }

    #[test]
    fn rejects_empty_and_garbage() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        assert!(matches!(parse_size("M"), Err(SizeError::NoNumber { .. })));
        assert!(matches!(parse_size("abc"), Err(SizeError::NoNumber { .. })));
        assert!(matches!(parse_size("-4G"), Err(SizeError::NoNumber { .. })));
        assert!(matches!(parse_size(".5G"), Err(SizeError::NoNumber { .. })));
        assert!(matches!(parse_size("5.G"), Err(SizeError::NoNumber { .. })));
        assert!(matches!(
            parse_size("1.2.3G"),
            Err(SizeError::NoNumber { .. })
        ));
        assert!(matches!(parse_size("4X"), Err(SizeError::BadSuffix { .. })));
        assert!(matches!(
            parse_size("4GG"),
            Err(SizeError::BadSuffix { .. })
        ));
        assert!(matches!(
            parse_size("4Mi"),
            Err(SizeError::BadSuffix { .. })
        ));
        assert!(matches!(
            parse_size("4Bi"),
            Err(SizeError::BadSuffix { .. })
        ));
        assert!(matches!(
            parse_size("4G extra"),
            Err(SizeError::BadSuffix { .. })
        ));
    }

    #[test]
    fn rejects_overflow() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert!(matches!(
            parse_size("18446744073709551616"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("16777216T"),
            Err(SizeError::Overflow { .. })
        ));
        assert_eq!(parse_size("16777215.5T"), Ok(u64::MAX - (1 << 39) + 1));
        assert!(matches!(
            parse_size("99999999999999999999999999G"),
            Err(SizeError::Overflow { .. })
        ));
    }

    #[test]
    fn error_messages_say_what_to_do() {
        let message = parse_size("4X").unwrap_err().to_string();
        assert!(
            message.contains("'X'") && message.contains("512M"),
            "{message}"
        );
        let message = parse_size("").unwrap_err().to_string();
        assert!(message.contains("512M"), "{message}");
        let message = parse_size("1.3K").unwrap_err().to_string();
        assert!(message.contains("smaller unit"), "{message}");
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1000), "1000 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(512 * MIB), "512 MiB");
        assert_eq!(format_size(3 * GIB / 2), "1.5 GiB");
        assert_eq!(format_size(GIB + GIB / 4), "1.25 GiB");
        assert_eq!(format_size(3 * TIB), "3 TiB");
        assert_eq!(format_size(GIB - 1), "1 GiB");
        assert_eq!(format_size(u64::MAX), "16777216 TiB");
    }

    #[test]
    fn formats_exact_arguments() {
        assert_eq!(format_size_arg(0), "0");
        assert_eq!(format_size_arg(4 * GIB), "4G");
        assert_eq!(format_size_arg(998 * MIB), "998M");
        assert_eq!(format_size_arg(3 * GIB / 2), "1536M");
        assert_eq!(format_size_arg(64 * KIB), "64K");
        assert_eq!(format_size_arg(12345), "12345");
        for bytes in [1, 4096, 998 * MIB, 3 * GIB, TIB + KIB] {
            assert_eq!(parse_size(&format_size_arg(bytes)), Ok(bytes));
        }
    }
}
