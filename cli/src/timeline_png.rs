//! `salus timeline --png FILE`: the timeline drawn by Python's matplotlib
//! (`python -m salus._timeline`, which the Python package carries).

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::error::CliError;

/// Set by the Python `salus` launcher (salus/_cli.py) for `timeline --png`; not passed on to a command (`salus run`).
pub const ENV_LAUNCHER_PYTHON: &str = "SALUS_LAUNCHER_PYTHON";

/// `timeline --png FILE`: the timeline's JSON, piped to `python3 -m
/// salus._timeline --png FILE` (matplotlib draws; the Python package carries it).
pub fn draw_timeline_png(timeline: &Value, path: &Path) -> Result<String, CliError> {
    use std::process::{Command, Stdio};
    // $SALUS_PYTHON, else the interpreter of the Python `salus` launcher that started this binary.
    let python = std::env::var_os("SALUS_PYTHON")
        .or_else(|| std::env::var_os(ENV_LAUNCHER_PYTHON))
        .unwrap_or_else(|| "python3".into());
    let mut child = Command::new(&python)
        .args(["-m", "salus._timeline", "--png"])
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            CliError::Local(format!(
                "timeline --png runs {} -m salus._timeline, which could not start: {e} (set SALUS_PYTHON to a Python with salus-tf and matplotlib)",
                python.to_string_lossy()
            ))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A helper that exits early (no matplotlib) closes the pipe: its status says why.
        let _ = stdin.write_all(timeline.to_string().as_bytes());
    }
    let output = child
        .wait_with_output()
        .map_err(|e| CliError::Local(format!("timeline --png: {e}")))?;
    if !output.status.success() {
        return Err(CliError::Local(format!(
            "timeline --png: {} -m salus._timeline failed ({}); its error is above",
            python.to_string_lossy(),
            output.status
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
