//! `salus run [OPTIONS] -- COMMAND...`: the command, with the server and its
//! job hints in its environment (what the Python adapter reads), exec'd in
//! this process so that its exit status is salus's.

use std::ffi::OsString;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::time::Duration;

use clap::Args;

use crate::error::{CliError, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND};
use crate::Connection;

pub const ENV_SERVER: &str = "SALUS_SERVER";
pub const ENV_NAME: &str = "SALUS_JOB_NAME";
pub const ENV_PRIORITY: &str = "SALUS_PRIORITY";
pub const ENV_ITERATIONS: &str = "SALUS_EXPECTED_ITERATIONS";
pub const ENV_SECONDS: &str = "SALUS_EXPECTED_SECONDS";

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Job name (default: the script's file name).
    #[arg(long)]
    name: Option<String>,
    /// Priority hint (an integer; higher runs first under the priority policy).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<String>,
    /// Expected main iterations of the job.
    #[arg(long)]
    iterations: Option<String>,
    /// Expected device seconds of the job.
    #[arg(long)]
    seconds: Option<String>,
    /// Do not check that the server is reachable first.
    #[arg(long)]
    no_check: bool,
    /// The command and its arguments, after --.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

/// The job's settings, checked as the server and the adapter check them.
#[derive(Debug, Default, PartialEq)]
struct Hints {
    name: Option<String>,
    priority: Option<i32>,
    iterations: Option<u64>,
    seconds: Option<f64>,
}

fn check_name(value: &str, source: &str) -> Result<String, String> {
    if value.contains('?') {
        return Err(format!(
            "{source}='{value}' is not valid: a job name cannot contain '?'"
        ));
    }
    if value.chars().any(|c| (c as u32) < 32) {
        return Err(format!(
            "{source}={value:?} is not valid: a job name cannot contain control characters"
        ));
    }
    Ok(value.to_string())
}

fn check_priority(value: &str, source: &str) -> Result<i32, String> {
    value.trim().parse().map_err(|_| {
        format!(
            "{source}='{value}' is not valid: expected an integer in [{}, {}]",
            i32::MIN,
            i32::MAX
        )
    })
}

fn check_iterations(value: &str, source: &str) -> Result<u64, String> {
    match value.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{source}='{value}' is not valid: expected a positive integer"
        )),
    }
}

fn check_seconds(value: &str, source: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(s),
        _ => Err(format!(
            "{source}='{value}' is not valid: expected a positive number of seconds"
        )),
    }
}

impl Hints {
    /// Hints from raw values, each error naming where the value came from.
    fn checked(raw: [(Option<String>, &str); 4]) -> Result<Hints, String> {
        let [name, priority, iterations, seconds] = raw;
        fn given(v: &Option<String>) -> Option<&str> {
            v.as_deref().filter(|v| !v.is_empty())
        }
        Ok(Hints {
            name: given(&name.0).map(|v| check_name(v, name.1)).transpose()?,
            priority: given(&priority.0)
                .map(|v| check_priority(v, priority.1))
                .transpose()?,
            iterations: given(&iterations.0)
                .map(|v| check_iterations(v, iterations.1))
                .transpose()?,
            seconds: given(&seconds.0)
                .map(|v| check_seconds(v, seconds.1))
                .transpose()?,
        })
    }

    /// `self` with the hints `over` gives replacing its own.
    fn overridden_by(self, over: Hints) -> Hints {
        Hints {
            name: over.name.or(self.name),
            priority: over.priority.or(self.priority),
            iterations: over.iterations.or(self.iterations),
            seconds: over.seconds.or(self.seconds),
        }
    }

    /// The variables that give a child these hints (as salus._config.to_env writes them).
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(name) = &self.name {
            env.push((ENV_NAME, name.clone()));
        }
        if let Some(p) = self.priority {
            env.push((ENV_PRIORITY, p.to_string()));
        }
        if let Some(n) = self.iterations {
            env.push((ENV_ITERATIONS, n.to_string()));
        }
        if let Some(s) = self.seconds {
            env.push((ENV_SECONDS, s.to_string()));
        }
        env
    }
}

/// HOST:PORT of a server address (grpc:// dropped), or why it is not one.
fn normalize_server(server: &str) -> Result<String, CliError> {
    let url = crate::commands::server_url(server)?;
    Ok(url.trim_start_matches("http://").to_string())
}

/// TensorFlow's gRPC client waits forever for an unreachable master: fail
/// fast, with the reason, before starting the command.
fn check_reachable(address: &str, timeout: Duration) -> Result<(), String> {
    let addrs: Vec<_> = address
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .collect();
    let mut last = "no address found".to_string();
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

pub fn run(conn: &Connection, args: RunArgs) -> Result<(), CliError> {
    let env = |key: &str| std::env::var(key).ok();
    let base = Hints::checked([
        (env(ENV_NAME), ENV_NAME),
        (env(ENV_PRIORITY), ENV_PRIORITY),
        (env(ENV_ITERATIONS), ENV_ITERATIONS),
        (env(ENV_SECONDS), ENV_SECONDS),
    ])
    .map_err(CliError::Usage)?;
    let given = Hints::checked([
        (args.name, "--name"),
        (args.priority, "--priority"),
        (args.iterations, "--iterations"),
        (args.seconds, "--seconds"),
    ])
    .map_err(CliError::Usage)?;
    let hints = base.overridden_by(given);
    let server = normalize_server(&conn.server)?;
    if !args.no_check {
        check_reachable(&server, conn.connect_timeout).map_err(|reason| {
            CliError::Unreachable {
                addr: server.clone(),
                source: format!(
                    "{reason}. Start it with `salus-server --listen {server}`, point SALUS_SERVER at a \
                     running server, or unset SALUS_SERVER to run TensorFlow locally \
                     (use --no-check to start the command anyway)"
                )
                .into(),
            }
        })?;
    }
    let mut command = args.command.into_iter();
    let program = command
        .next()
        .ok_or_else(|| CliError::Usage("usage: salus run [OPTIONS] -- COMMAND [ARGS]...".into()))?;
    let mut child = std::process::Command::new(&program);
    child
        .args(command)
        .env(ENV_SERVER, &server)
        .env_remove(crate::timeline_png::ENV_LAUNCHER_PYTHON);
    for (key, value) in hints.env() {
        child.env(key, value);
    }
    // Returns only if the exec failed.
    let error = child.exec();
    let shown = program.to_string_lossy();
    Err(match error.kind() {
        std::io::ErrorKind::NotFound => CliError::Exec {
            message: format!("command not found: {shown}"),
            status: EXIT_NOT_FOUND,
        },
        std::io::ErrorKind::PermissionDenied => CliError::Exec {
            message: format!("permission denied: {shown}"),
            status: EXIT_CANNOT_EXECUTE,
        },
        _ => CliError::Exec {
            message: format!("cannot run {shown}: {error}"),
            status: EXIT_CANNOT_EXECUTE,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(values: [Option<&str>; 4]) -> [(Option<String>, &'static str); 4] {
        let [a, b, c, d] = values.map(|v| v.map(str::to_string));
        [
            (a, "--name"),
            (b, "--priority"),
            (c, "--iterations"),
            (d, "--seconds"),
        ]
    }

    #[test]
    fn hints_are_checked_and_options_override_the_environment() {
        let base = Hints::checked(raw([Some("env-name"), Some("3"), None, Some("2.5")])).unwrap();
        let given = Hints::checked(raw([None, Some("-1"), Some("100"), None])).unwrap();
        let merged = base.overridden_by(given);
        assert_eq!(
            merged.env(),
            vec![
                (ENV_NAME, "env-name".to_string()),
                (ENV_PRIORITY, "-1".to_string()),
                (ENV_ITERATIONS, "100".to_string()),
                (ENV_SECONDS, "2.5".to_string()),
            ]
        );
        for (bad, needle) in [
            ([Some("a?b"), None, None, None], "cannot contain '?'"),
            ([None, Some("x"), None, None], "--priority='x' is not valid"),
            ([None, None, Some("0"), None], "expected a positive integer"),
            (
                [None, None, None, Some("inf")],
                "positive number of seconds",
            ),
        ] {
            let err = Hints::checked(raw(bad)).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
        // An empty variable is as good as none.
        assert_eq!(
            Hints::checked(raw([Some(""), None, None, None])).unwrap(),
            Hints::default()
        );
    }

    #[test]
    fn server_addresses_are_normalized() {
        assert_eq!(
            normalize_server("grpc://127.0.0.1:5501").unwrap(),
            "127.0.0.1:5501"
        );
        assert_eq!(normalize_server("[::1]:5501").unwrap(), "[::1]:5501");
        for bad in [
            "nohost",
            "h:0",
            "h:99999",
            "https://h:1",
            "http://x:1",
            ":5501",
            "a/b:1",
        ] {
            assert!(normalize_server(bad).is_err(), "{bad}");
        }
    }
}
