//! How an executor died, as the supervisor tells its tenant: the exit status or
//! signal, and the fatal lines the executor printed last.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::tenant::identity::Tenant;

use crate::sync::lock;

/// What the supervisor knows of a finished executor.
#[derive(Default)]
pub struct DeathNote {
    message: OnceLock<String>,
    notify: tokio::sync::Notify,
}

impl DeathNote {
    pub(super) fn record(&self, message: String) {
        if self.message.set(message).is_ok() {
            self.notify.notify_waiters();
        }
    }

    pub fn get(&self) -> Option<&str> {
        self.message.get().map(String::as_str)
    }

    /// The message, waiting up to `limit` for it (a closed socket is seen a
    /// moment before the process is reaped).
    pub async fn wait(&self, limit: Duration) -> Option<String> {
        let notified = self.notify.notified();
        if let Some(m) = self.get() {
            return Some(m.to_string());
        }
        let _ = tokio::time::timeout(limit, notified).await;
        self.get().map(str::to_string)
    }
}

/// "killed by signal 11 (SIGSEGV)" and what the executor said last that
/// explains it (TensorFlow's fatal log lines, an uncaught C++ exception).
pub(super) fn death_message(
    tenant: &Tenant,
    pid: u32,
    status: std::io::Result<std::process::ExitStatus>,
    last_lines: &Mutex<VecDeque<String>>,
) -> String {
    let how = match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(signal)) => format!(
                "was killed by signal {signal} ({}){}",
                signal_name(signal),
                if signal == libc::SIGKILL {
                    ": the server's memory limit for executors (--executor-memory), the kernel's OOM killer, or an operator"
                } else {
                    ""
                }
            ),
            _ => "ended".to_string(),
        },
        Err(err) => format!("could not be waited for ({err})"),
    };
    let last = lock(last_lines);
    let telling: Vec<&str> = last
        .iter()
        .map(String::as_str)
        .filter(|l| is_fatal_line(l))
        .map(explained)
        .collect();
    let said = match telling.as_slice() {
        [] => String::new(),
        lines => format!(
            "; it said: {}",
            lines[lines.len().saturating_sub(3)..].join(" | ")
        ),
    };
    format!(
        "the executor process of tenant {tenant} (pid {pid}) {how}{said}. Its sessions and eager contexts \
         are lost; other tenants are not affected, and this tenant's next request starts a new executor"
    )
}

/// Rust's abort when a C++ exception unwinds into the executor's own frames
/// (TensorFlow ran the op on the calling thread) names no exception.
const FOREIGN_EXCEPTION: &str = "Rust cannot catch foreign exceptions";

/// A fatal line as the tenant should read it.
fn explained(line: &str) -> &str {
    if line.contains(FOREIGN_EXCEPTION) {
        "TensorFlow threw a C++ exception (most often std::bad_alloc: an absurd size) \
         on the executor's own thread, which cannot catch it"
    } else {
        line
    }
}

fn is_fatal_line(line: &str) -> bool {
    let mut chars = line.chars();
    let absl_fatal = chars.next() == Some('F') && chars.next().is_some_and(|c| c.is_ascii_digit());
    absl_fatal
        || line.contains("Check failed")
        || line.contains("terminate called")
        || line.contains("what():")
        || line.contains("panicked")
        || line.contains("Fatal")
        || line.contains("double free")
        || line.contains("corrupted")
        || line.contains("memory allocation")
        || line.starts_with("salus-server")
        || line.starts_with("fatal runtime error")
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGKILL => "SIGKILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatal_lines_are_recognised() {
        assert!(is_fatal_line(
            "F0000 00:00:1796189037.291926 14062 tensor_shape.cc:1 Check failed: x"
        ));
        assert!(is_fatal_line(
            "terminate called after throwing an instance of 'std::bad_alloc'"
        ));
        assert!(is_fatal_line("  what():  std::bad_alloc"));
        assert!(!is_fatal_line(
            "I0000 00:00:1 port.cc:153] oneDNN custom operations are on"
        ));
        assert!(!is_fatal_line("Found 3 files"));
    }

    #[test]
    fn deaths_say_how_and_why() {
        let tenant = Tenant::from_uid(0);
        let lines = Mutex::new(VecDeque::from(vec![
            "I0000 something".to_string(),
            "F0000 00:00:1.0 1 op.cc:9] Check failed: dims >= 0".to_string(),
        ]));
        let status = std::process::ExitStatus::from_raw(libc::SIGABRT);
        let message = death_message(&tenant, 42, Ok(status), &lines);
        assert!(
            message.contains("pid 42) was killed by signal 6 (SIGABRT)"),
            "{message}"
        );
        assert!(message.contains("Check failed: dims >= 0"), "{message}");
        assert!(!message.contains("I0000"), "{message}");
        let killed = death_message(
            &tenant,
            7,
            Ok(std::process::ExitStatus::from_raw(libc::SIGKILL)),
            &Mutex::new(VecDeque::new()),
        );
        assert!(killed.contains("--executor-memory"), "{killed}");
        let foreign = Mutex::new(VecDeque::from(vec![
            "fatal runtime error: Rust cannot catch foreign exceptions, aborting".to_string(),
        ]));
        let thrown = death_message(&tenant, 9, Ok(status), &foreign);
        assert!(
            thrown.contains("it said: TensorFlow threw a C++ exception"),
            "{thrown}"
        );
    }
}
