//! Job hints and their wire format.
//!
//! A stock TensorFlow client can send hints without any Salus code, in
//! `ConfigProto.experimental.session_metadata.name`:
//!
//! ```text
//! NAME[?key=value[&key=value...]]      e.g.  resnet50?priority=10&iterations=2000&seconds=600
//! ```
//!
//! Keys: `priority` (integer, higher runs first under `priority`),
//! `iterations` (expected main iterations), `seconds` (expected total device
//! seconds), `persistent` and `ephemeral` (memory, e.g. `512MiB`; they override
//! the server's own estimates). Unknown keys and malformed values are errors,
//! so typos surface.

/// Optional facts a job may declare about itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hints {
    pub name: String,
    pub priority: i32,
    pub expected_iterations: Option<u64>,
    pub expected_seconds: Option<f64>,
    /// Persistent memory (variables) in bytes, overriding the estimate.
    pub persistent_bytes: Option<u64>,
    /// Per-iteration memory in bytes, overriding the measurement.
    pub ephemeral_bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HintError {
    #[error(
        "unknown job hint {0:?}; known hints: priority, iterations, seconds, persistent, ephemeral"
    )]
    UnknownKey(String),
    #[error("job hint {key}={value:?} is not valid: {why}")]
    BadValue {
        key: String,
        value: String,
        why: &'static str,
    },
}

impl Hints {
    /// Parses the session-metadata name format described in the module doc.
    pub fn parse(text: &str) -> Result<Hints, HintError> {
        let (name, query) = text.split_once('?').unwrap_or((text, ""));
        let mut hints = Hints {
            name: name.to_string(),
            ..Default::default()
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            hints.set(key, value)?;
        }
        Ok(hints)
    }

    /// Sets one hint from text (`priority`, `iterations`, `seconds`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), HintError> {
        let bad = |why| HintError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            why,
        };
        match key {
            "priority" => self.priority = value.parse().map_err(|_| bad("expected an integer"))?,
            "iterations" => {
                let n: u64 = value
                    .parse()
                    .map_err(|_| bad("expected a positive integer"))?;
                if n == 0 {
                    return Err(bad("expected a positive integer"));
                }
                self.expected_iterations = Some(n);
            }
            "seconds" => {
                let s: f64 = value
                    .parse()
                    .map_err(|_| bad("expected a positive number"))?;
                if !(s.is_finite() && s > 0.0) {
                    return Err(bad("expected a positive number"));
                }
                self.expected_seconds = Some(s);
            }
            "persistent" => {
                self.persistent_bytes = Some(
                    crate::units::parse_size(value)
                        .map_err(|_| bad("expected a size like 512MiB"))?,
                )
            }
            "ephemeral" => {
                self.ephemeral_bytes = Some(
                    crate::units::parse_size(value)
                        .map_err(|_| bad("expected a size like 512MiB"))?,
                )
            }
            other => return Err(HintError::UnknownKey(other.to_string())),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_metadata_format() {
        assert_eq!(Hints::parse("").unwrap(), Hints::default());
        assert_eq!(Hints::parse("plain").unwrap().name, "plain");
        let h = Hints::parse("resnet?priority=10&iterations=2000&seconds=600.5").unwrap();
        assert_eq!(
            h,
            Hints {
                name: "resnet".into(),
                priority: 10,
                expected_iterations: Some(2000),
                expected_seconds: Some(600.5),
                ..Default::default()
            }
        );
        assert_eq!(Hints::parse("?priority=-3").unwrap().priority, -3);
        let m = Hints::parse("m?persistent=2GiB&ephemeral=512MiB").unwrap();
        assert_eq!(
            (m.persistent_bytes, m.ephemeral_bytes),
            (Some(2 << 30), Some(512 << 20))
        );
        assert!(matches!(
            Hints::parse("m?ephemeral=lots"),
            Err(HintError::BadValue { .. })
        ));
    }

    #[test]
    fn rejects_typos_and_bad_values() {
        assert_eq!(
            Hints::parse("a?prio=1"),
            Err(HintError::UnknownKey("prio".into()))
        );
        for bad in [
            "a?priority=x",
            "a?iterations=0",
            "a?iterations=-1",
            "a?seconds=nan",
            "a?seconds=0",
            "a?seconds",
        ] {
            assert!(
                matches!(Hints::parse(bad), Err(HintError::BadValue { .. })),
                "{bad}"
            );
        }
    }
}
