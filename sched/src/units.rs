//! Byte sizes and durations as people write them.

use std::time::Duration;

/// Parses "123", "64KiB", "512MiB", "2GiB", "1GB" (decimal units too).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 512MiB or 2GiB"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?}; use B, KiB, MiB, GiB, KB, MB or GB"
            ))
        }
    };
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// The units a duration may carry, and their length in seconds.
const DURATION_UNITS: [(&str, f64); 10] = [
    ("ns", 1e-9),
    ("us", 1e-6),
    ("µs", 1e-6),
    ("ms", 1e-3),
    ("s", 1.0),
    ("sec", 1.0),
    ("m", 60.0),
    ("min", 60.0),
    ("h", 3600.0),
    ("d", 86_400.0),
];

/// A time flag's value as written: with a unit, or a bare number read in the
/// flag's former unit (still accepted, with a warning; `0` needs no unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TimeFlag {
    pub value: Duration,
    /// Written as a bare number other than 0.
    pub bare: bool,
}

impl TimeFlag {
    pub fn is_zero(&self) -> bool {
        self.value.is_zero()
    }

    /// None for 0 (the flags' "off").
    pub fn nonzero(&self) -> Option<Duration> {
        (!self.value.is_zero()).then_some(self.value)
    }
}

/// Parses a duration as written: "500us", "1.5ms", "30s", "2m", "12h", "7d";
/// a bare number counts in `bare_unit` (None: a unit is required, except
/// for 0). The server's time flags and the `salus` CLI read durations here.
pub fn parse_time_flag(text: &str, bare_unit: Option<Duration>) -> Result<TimeFlag, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let bad = || format!("{text:?} is not a duration like 500us, 30s, 15m or 12h");
    let number: f64 = number.parse().map_err(|_| bad())?;
    let unit = unit.trim();
    let (scale, bare) = if unit.is_empty() {
        match bare_unit {
            _ if number == 0.0 => (1.0, false),
            Some(unit) => (unit.as_secs_f64(), true),
            None => {
                return Err(format!(
                    "{text:?} has no unit: write it like 500us, 30s, 15m or 12h"
                ))
            }
        }
    } else {
        let scale = DURATION_UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|&(_, scale)| scale)
            .ok_or_else(|| {
                format!("unknown unit {unit:?} in {text:?}: use ns, us, ms, s, m, h or d")
            })?;
        (scale, false)
    };
    let value = Duration::try_from_secs_f64(number * scale).map_err(|_| bad())?;
    Ok(TimeFlag { value, bare })
}

/// A duration in the largest unit that writes it exactly (else in ms or us):
/// "2ms", "30s", "1h", "1500us".
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    for (unit, scale) in [
        ("d", 86_400_000_000_000u128),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if nanos % scale == 0 {
            return format!("{}{unit}", nanos / scale);
        }
    }
    format!("{nanos}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        for (text, expected) in [
            ("0", 0),
            ("1000", 1000),
            ("64KiB", 65536),
            ("512MiB", 512 << 20),
            ("2GiB", 2 << 30),
            ("1GB", 1_000_000_000),
            (" 3 mib ", 3 << 20),
        ] {
            assert_eq!(parse_size(text), Ok(expected), "{text}");
        }
        for bad in ["", "GiB", "12XB", "-1", "99999999999999999999GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    /// A duration that must carry its unit.
    fn with_unit(text: &str) -> Result<Duration, String> {
        parse_time_flag(text, None).map(|flag| flag.value)
    }

    #[test]
    fn parses_durations_with_units() {
        for (text, expected) in [
            ("500us", Duration::from_micros(500)),
            ("1.5ms", Duration::from_micros(1500)),
            ("30s", Duration::from_secs(30)),
            ("2m", Duration::from_secs(120)),
            ("12h", Duration::from_secs(12 * 3600)),
            ("7d", Duration::from_secs(7 * 86_400)),
            (" 90 s ", Duration::from_secs(90)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(with_unit(text), Ok(expected), "{text}");
        }
        for bad in [
            "",
            "30",
            "s",
            "1.2.3s",
            "5 weeks",
            "-3s",
            "NaNs",
            "99999999999999999999999d",
        ] {
            assert!(with_unit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bare_number_counts_in_the_flags_former_unit_and_is_marked() {
        let micros = Some(Duration::from_micros(1));
        assert_eq!(
            parse_time_flag("2000", micros),
            Ok(TimeFlag {
                value: Duration::from_millis(2),
                bare: true
            })
        );
        assert_eq!(
            parse_time_flag("2ms", micros),
            Ok(TimeFlag {
                value: Duration::from_millis(2),
                bare: false
            })
        );
        assert_eq!(parse_time_flag("0", micros), Ok(TimeFlag::default()));
        assert_eq!(
            parse_time_flag("1.5", Some(Duration::from_secs(1))).map(|t| t.value),
            Ok(Duration::from_millis(1500))
        );
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(200), "200us"),
            (Duration::from_millis(2), "2ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(90), "90s"),
        ] {
            assert_eq!(format_duration(d), text);
            assert_eq!(with_unit(text).unwrap(), d);
        }
    }
}
