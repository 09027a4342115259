//! The devices every job sees, listed once at start by a probe session (the
//! process's first: with GPU lanes it creates the virtual devices, so it gets
//! every job's config; salus-server's `runtime::device_list::list_here`),
//! and TensorFlow's version.
//!
//! The supervisor runs no TensorFlow (its binary does not link it): a
//! short-lived child of `salus-server` with the same flags lists them
//! (`salus-server [FLAGS] probe-devices`, which prints one JSON line and
//! exits).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::runtime::exec;
use crate::tf_types::DeviceInfo;

/// What a probe found.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceList {
    pub devices: Vec<DeviceInfo>,
    pub tensorflow_version: String,
}

/// The subcommand a probe child runs.
pub const PROBE_COMMAND: &str = "probe-devices";

/// Longest a probe child may take: TensorFlow's start on a busy machine, and
/// on a GPU node the CUDA runtime's.
const PROBE_TIMEOUT: Duration = Duration::from_secs(180);

/// Lists the devices in a child running `server_bin` (salus-server) with this
/// process's own arguments and [`PROBE_COMMAND`] (it sets up its devices from
/// the same flags).
pub async fn list_in_child(server_bin: std::path::PathBuf) -> Result<DeviceList> {
    exec::blocking(move || {
        let mut child = Command::new(&server_bin)
            .args(std::env::args_os().skip(1))
            .arg(PROBE_COMMAND)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Internal(format!("cannot start the device probe: {e}")))?;
        let pid = child.id();
        let (finished, finishing) = std::sync::mpsc::channel::<()>();
        // Kills a probe that hangs; a probe that ends drops `finished` first.
        let watchdog = std::thread::Builder::new()
            .name("salus-probe-watch".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    finishing.recv_timeout(PROBE_TIMEOUT)
                {
                    // SAFETY: signalling our own child, not reaped yet (its wait below is still blocked).
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
            });
        let (watchdog, mut pipe) = match (watchdog, child.stderr.take()) {
            (Ok(watchdog), Some(pipe)) => (watchdog, pipe),
            (watchdog, _) => {
                let _ = child.kill();
                let _ = child.wait();
                let why = watchdog
                    .err()
                    .map_or("no stderr pipe".to_string(), |e| e.to_string());
                return Err(Error::Internal(format!(
                    "cannot watch the device probe: {why}"
                )));
            }
        };
        // Read on its own thread: a probe that logs much must not block on a full pipe.
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        });
        let output = child.wait_with_output();
        drop(finished);
        let _ = watchdog.join();
        let log = reader.join().unwrap_or_default();
        let output =
            output.map_err(|e| Error::Internal(format!("the device probe failed: {e}")))?;
        if !output.status.success() {
            return Err(Error::Internal(format!(
                "the device probe (salus-server {PROBE_COMMAND}) failed ({}): {}",
                output.status,
                tail(&log)
            )));
        }
        parse(&String::from_utf8_lossy(&output.stdout)).map_err(|why| {
            Error::Internal(format!(
                "the device probe printed {why}; its log: {}",
                tail(&log)
            ))
        })
    })
    .await
}

/// The last lines of a probe's log, for an error.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(8)..].join(" | ")
}

/// The line a probe child prints.
pub fn to_line(list: &DeviceList) -> String {
    json!({
        "tensorflow_version": list.tensorflow_version,
        "devices": list.devices.iter().map(|d| json!({
            "name": d.name,
            "device_type": d.device_type,
            "memory_bytes": d.memory_bytes,
            "incarnation": d.incarnation,
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

/// A probe child's output: its last line, as [`to_line`] writes it.
fn parse(stdout: &str) -> std::result::Result<DeviceList, String> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("nothing")?;
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("{line:?}, not JSON ({e})"))?;
    let text = |v: &Value, key: &str| {
        v[key]
            .as_str()
            .map(str::to_string)
            .ok_or(format!("no {key} in {line:?}"))
    };
    let devices = value["devices"]
        .as_array()
        .ok_or(format!("no devices in {line:?}"))?
        .iter()
        .map(|d| {
            Ok(DeviceInfo {
                name: text(d, "name")?,
                device_type: text(d, "device_type")?,
                memory_bytes: d["memory_bytes"]
                    .as_i64()
                    .ok_or(format!("no memory_bytes in {line:?}"))?,
                incarnation: d["incarnation"]
                    .as_u64()
                    .ok_or(format!("no incarnation in {line:?}"))?,
            })
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    Ok(DeviceList {
        devices,
        tensorflow_version: text(&value, "tensorflow_version")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probes_line_reads_back_and_a_bad_one_is_named() {
        let list = DeviceList {
            devices: vec![DeviceInfo {
                name: "/job:localhost/replica:0/task:0/device:CPU:0".into(),
                device_type: "CPU".into(),
                memory_bytes: 268435456,
                incarnation: u64::MAX,
            }],
            tensorflow_version: "2.21.0".into(),
        };
        let printed = format!("some log line\n{}\n", to_line(&list));
        assert_eq!(parse(&printed), Ok(list));
        assert!(parse("").unwrap_err().contains("nothing"));
        assert!(parse("{\"devices\": []}")
            .unwrap_err()
            .contains("tensorflow_version"));
        assert!(parse("oops").unwrap_err().contains("not JSON"));
    }
}
