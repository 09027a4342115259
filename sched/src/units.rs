//! Byte sizes as people write them.

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
}
