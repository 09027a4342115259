//! Lines this process relays into its log (an executor's, TensorFlow's own)
//! under `--log-format json`: each stays one JSON object per line, marked
//! with where it came from.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};

/// Whether this process logs JSON lines.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Set once logging starts (`--log-format`).
pub fn set_enabled(json: bool) {
    ENABLED.store(json, Ordering::Relaxed);
}

/// Whether this process logs JSON lines: the lines it relays are JSON too.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// `line` as one JSON object carrying `key: source`: a line that already is
/// a JSON object (an executor logging JSON) gets the key added; any other
/// line becomes `{"level": "INFO", key: source, "message": line}`.
pub fn relayed(line: &str, key: &str, source: &str) -> String {
    let mut object = match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(object)) => object,
        _ => {
            let mut object = Map::new();
            object.insert("level".into(), Value::from("INFO"));
            object.insert("message".into(), Value::from(line));
            object
        }
    };
    object.insert(key.into(), Value::from(source));
    Value::Object(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_keeps_its_fields_and_gains_its_source() {
        let line = r#"{"timestamp":"t","level":"WARN","message":"slow","n":3}"#;
        let out: Value = serde_json::from_str(&relayed(line, "executor", "alice:42")).unwrap();
        assert_eq!(out["level"], "WARN");
        assert_eq!(out["n"], 3);
        assert_eq!(out["executor"], "alice:42");
    }

    #[test]
    fn a_text_line_becomes_a_message() {
        for line in ["2026-12-07 E tensorflow: \"quoted\" \\ tab\t", "[1, 2]", ""] {
            let out: Value = serde_json::from_str(&relayed(line, "source", "tensorflow")).unwrap();
            assert_eq!(out["message"], line);
            assert_eq!(out["source"], "tensorflow");
            assert_eq!(out["level"], "INFO");
        }
    }
}
