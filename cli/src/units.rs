//! Durations and sizes as the CLI reads and prints them.

use std::time::Duration;

use salus_sched::units::parse_time_flag;

/// "500us", "250ms", "90s", "15m", "2h", "7d", or a bare number of seconds
/// (the older form, still accepted): the server's reading
/// ([`salus_sched::units::parse_time_flag`]). Zero and negative durations are refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let flag = parse_time_flag(text, Some(Duration::from_secs(1)))?;
    if flag.is_zero() {
        return Err(format!("{text:?}: a duration must be longer than 0"));
    }
    Ok(flag.value)
}

/// [`parse_duration`] where 0 is allowed too (`timeline --seconds 0`: all the server keeps).
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    match text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .parse::<f64>()
    {
        Ok(v) if v == 0.0 => Ok(Duration::ZERO),
        _ => parse_duration(text),
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// "512 MiB", "1.5 GiB", "12 KiB", "100 B": a size at a glance.
pub fn size_text(bytes: u64) -> String {
    let scaled = |unit: u64, name: &str| {
        let value = bytes as f64 / unit as f64;
        if bytes % unit == 0 || value >= 100.0 {
            format!("{value:.0} {name}")
        } else {
            format!("{value:.1} {name}")
        }
    };
    if bytes >= GIB {
        scaled(GIB, "GiB")
    } else if bytes >= MIB {
        scaled(MIB, "MiB")
    } else if bytes >= KIB {
        scaled(KIB, "KiB")
    } else {
        format!("{bytes} B")
    }
}

/// A size in the tenants file's words, exact: "4GiB", "512MiB", or bytes.
pub fn size_word(bytes: u64) -> String {
    if bytes > 0 && bytes % GIB == 0 {
        format!("{}GiB", bytes / GIB)
    } else if bytes > 0 && bytes % MIB == 0 {
        format!("{}MiB", bytes / MIB)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_bare_seconds() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1.5d").unwrap(), Duration::from_secs(129600));
        assert_eq!(parse_duration("0.5").unwrap(), Duration::from_millis(500));
        for bad in ["", "0", "-5s", "3w", "h", "inf", "NaN"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_duration_or_zero("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration_or_zero("0s").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_duration_or_zero("10").unwrap(),
            Duration::from_secs(10)
        );
        assert!(parse_duration_or_zero("-1").is_err());
    }

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(size_text(0), "0 B");
        assert_eq!(size_text(1000), "1000 B");
        assert_eq!(size_text(1536), "1.5 KiB");
        assert_eq!(size_text(512 * MIB), "512 MiB");
        assert_eq!(size_text(GIB + GIB / 2), "1.5 GiB");
        assert_eq!(size_text(4 * GIB), "4 GiB");
        assert_eq!(size_word(4 * GIB), "4GiB");
        assert_eq!(size_word(1536 * MIB), "1536MiB");
        assert_eq!(size_word(1000), "1000");
        for bytes in [4 * GIB, 1536 * MIB, 1000] {
            assert_eq!(
                salus_sched::units::parse_size(&size_word(bytes)).unwrap(),
                bytes
            );
        }
    }
}
