//! What a command's failure prints, and the exit status it maps to.
//!
//! | status | meaning |
//! |---|---|
//! | 0 | ok |
//! | 1 | refused: the server answered with an error, or `drain --wait --timeout` ran out |
//! | 2 | usage: bad flags or arguments (clap's own status), or a bad address, token or setting |
//! | 3 | unreachable: no answer (connect failed, DNS, timeout, connection lost) |
//!
//! `salus run` passes its command's status through, and uses 126/127 when it cannot start it.

use std::error::Error as StdError;

use tonic::{Code, Status};

pub const EXIT_OK: i32 = 0;
pub const EXIT_REFUSED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_UNREACHABLE: i32 = 3;
/// `salus run`: the command was found but could not be executed (as a shell says).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// `salus run`: no such command.
pub const EXIT_NOT_FOUND: i32 = 127;

/// The exit status table, as `salus --help` ends with it.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0    ok
  1    refused: the server answered with an error (e.g. PERMISSION_DENIED, NOT_FOUND,
       INVALID_ARGUMENT), or `drain --wait --timeout` gave up with jobs still open
  2    usage: bad flags or arguments, or a bad address, token or hint value
  3    unreachable: the server did not answer (connection refused, DNS, timeout)
  `salus run` exits with its command's status (126: cannot execute, 127: not found).";

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Connecting failed: the address, and the whole chain of causes.
    #[error("cannot reach salus-server at {addr}: {}", cause_chain(source.as_ref()))]
    Unreachable {
        addr: String,
        source: Box<dyn StdError + Send + Sync>,
    },
    /// A call's status: a refusal the server sent, or one tonic made from a
    /// lost connection (rendered by [`CliError::render`], which knows the address).
    #[error("{}", status_text(.0))]
    Rpc(#[from] Status),
    #[error("{0}")]
    Usage(String),
    /// `drain --wait --timeout` ran out with jobs still open.
    #[error("{0}")]
    StillRunning(String),
    #[error("this server shares no device memory: start it with --memory-capacity SIZE (or, built with --features cuda, on a GPU)")]
    NoCapacity,
    /// `salus run`: the command could not be started (exit 126 or 127).
    #[error("{message}")]
    Exec { message: String, status: i32 },
    /// A local step failed (a file, a helper process).
    #[error("{0}")]
    Local(String),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Unreachable { .. } => EXIT_UNREACHABLE,
            CliError::Rpc(status) if is_transport(status) => EXIT_UNREACHABLE,
            CliError::Rpc(_) | CliError::StillRunning(_) | CliError::NoCapacity => EXIT_REFUSED,
            CliError::Local(_) => EXIT_REFUSED,
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Exec { status, .. } => *status,
        }
    }

    /// The line printed after `salus: ` (and the lines after it, for
    /// `StillRunning`): `server` names where an unanswered call went.
    pub fn render(&self, server: &str) -> String {
        match self {
            CliError::Rpc(status) if is_transport(status) => {
                format!(
                    "cannot reach salus-server at {server}: {}",
                    status_text(status)
                )
            }
            CliError::Rpc(status) => format!(
                "refused ({}): {}",
                code_name(status.code()),
                status.message()
            ),
            other => other.to_string(),
        }
    }
}

/// A status tonic made on this side from a failed connection (it keeps the
/// transport error as its source); one the server sent has none.
pub fn is_transport(status: &Status) -> bool {
    status.source().is_some() || (status.code() == Code::Unavailable && status.message().is_empty())
}

/// `CODE: message: cause: cause`, each cause not already said.
fn status_text(status: &Status) -> String {
    let mut text = code_name(status.code()).to_string();
    if !status.message().is_empty() {
        text += ": ";
        text += status.message();
    }
    if let Some(source) = status.source() {
        append_causes(&mut text, source);
    }
    text
}

/// `error: cause: cause ...`, walking [`std::error::Error::source`]: hyper
/// and tonic say "transport error" at the top and "Connection refused" at the bottom.
pub fn cause_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    if let Some(source) = error.source() {
        append_causes(&mut text, source);
    }
    text
}

fn append_causes(text: &mut String, first: &(dyn StdError + 'static)) {
    let mut next = Some(first);
    while let Some(cause) = next {
        let said = cause.to_string();
        // Several layers repeat their cause's text inside their own.
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
}

/// The gRPC name of a status code, as the server's logs and docs spell it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layers(texts: &[&'static str]) -> Layer {
        let mut error: Option<Box<Layer>> = None;
        for text in texts.iter().rev() {
            error = Some(Box::new(Layer {
                text,
                source: error,
            }));
        }
        *error.unwrap()
    }

    #[test]
    fn the_cause_chain_keeps_every_layer_once() {
        let e = layers(&[
            "transport error",
            "tcp connect error",
            "Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(
            cause_chain(&e),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
        let unreachable = CliError::Unreachable {
            addr: "127.0.0.1:5599".into(),
            source: Box::new(e),
        };
        assert_eq!(unreachable.exit_code(), EXIT_UNREACHABLE);
        assert_eq!(
            unreachable.render("127.0.0.1:5599"),
            "cannot reach salus-server at 127.0.0.1:5599: transport error: tcp connect error: Connection refused (os error 111)"
        );
    }

    #[test]
    fn a_refusal_names_its_code_and_keeps_the_servers_message() {
        let e = CliError::from(Status::permission_denied("only admins may drain"));
        assert_eq!(e.exit_code(), EXIT_REFUSED);
        assert_eq!(
            e.render("h:1"),
            "refused (PERMISSION_DENIED): only admins may drain"
        );
        let e = CliError::from(Status::failed_precondition("no such tenant"));
        assert_eq!(e.exit_code(), EXIT_REFUSED);
    }

    #[test]
    fn a_status_made_from_a_lost_connection_is_unreachable() {
        let lost = Status::from_error(Box::new(layers(&["connection reset", "broken pipe"])));
        assert_eq!(CliError::from(lost.clone()).exit_code(), EXIT_UNREACHABLE);
        let text = CliError::from(lost).render("10.0.0.1:5501");
        assert!(
            text.starts_with("cannot reach salus-server at 10.0.0.1:5501: "),
            "{text}"
        );
        assert!(text.contains("broken pipe"), "{text}");
    }

    #[test]
    fn exit_codes_follow_the_table() {
        assert_eq!(CliError::Usage("x".into()).exit_code(), EXIT_USAGE);
        assert_eq!(CliError::StillRunning("x".into()).exit_code(), EXIT_REFUSED);
        assert_eq!(CliError::NoCapacity.exit_code(), EXIT_REFUSED);
        let exec = CliError::Exec {
            message: "command not found: nope".into(),
            status: EXIT_NOT_FOUND,
        };
        assert_eq!(exec.exit_code(), 127);
    }
}
