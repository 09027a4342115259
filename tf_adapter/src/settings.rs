//! The job's settings from the environment, validated and formatted exactly as the
//! Python adapter does (python/src/salus/_config.py), so a C-API program and a Python
//! script with the same SALUS_* variables reach the server as the same kind of job.
//!
//! The hints travel in ConfigProto.experimental.session_metadata.name as
//! `NAME[?priority=P&iterations=N&seconds=S]`.

use std::fmt;

pub const ENV_SERVER: &str = "SALUS_SERVER";
pub const ENV_NAME: &str = "SALUS_JOB_NAME";
pub const ENV_PRIORITY: &str = "SALUS_PRIORITY";
pub const ENV_ITERATIONS: &str = "SALUS_EXPECTED_ITERATIONS";
pub const ENV_SECONDS: &str = "SALUS_EXPECTED_SECONDS";
/// Seconds the pre-session TCP probe of the server may take (default 5, as the Python adapter).
pub const ENV_CONNECT_TIMEOUT: &str = "SALUS_CONNECT_TIMEOUT";
/// `1`: one line on stderr per redirected session or shipped SavedModel.
pub const ENV_VERBOSE: &str = "SALUS_TF_SHIM_VERBOSE";

pub const DEFAULT_CONNECT_TIMEOUT_S: f64 = 5.0;

/// A SALUS_* value the server would refuse; the message names the variable and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

/// Where redirected sessions go and which hints they carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `host:port` (IPv6 as `[::1]:5501`).
    pub server: String,
    pub name: String,
    pub priority: Option<i32>,
    pub iterations: Option<u64>,
    pub seconds: Option<f64>,
    pub connect_timeout_s: f64,
    pub verbose: bool,
}

impl Settings {
    /// `None` when SALUS_SERVER is unset or empty: the shim then forwards everything untouched.
    pub fn from_env() -> Option<Result<Settings, SettingsError>> {
        Self::from_lookup(|key| std::env::var(key).ok(), default_job_name)
    }

    /// `lookup` reads a variable; `default_name` is only called when SALUS_JOB_NAME is unset.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        default_name: impl FnOnce() -> String,
    ) -> Option<Result<Settings, SettingsError>> {
        let given = |key: &str| lookup(key).filter(|v| !v.is_empty());
        let server = given(ENV_SERVER)?;
        let parse = || -> Result<Settings, SettingsError> {
            Ok(Settings {
                server: normalize_server(&server, ENV_SERVER)?,
                name: match given(ENV_NAME) {
                    Some(name) => check_name(&name, ENV_NAME)?,
                    None => default_name(),
                },
                priority: given(ENV_PRIORITY)
                    .map(|v| check_priority(&v))
                    .transpose()?,
                iterations: given(ENV_ITERATIONS)
                    .map(|v| check_iterations(&v))
                    .transpose()?,
                seconds: given(ENV_SECONDS)
                    .map(|v| check_seconds(&v, ENV_SECONDS))
                    .transpose()?,
                connect_timeout_s: given(ENV_CONNECT_TIMEOUT)
                    .map(|v| check_seconds(&v, ENV_CONNECT_TIMEOUT))
                    .transpose()?
                    .unwrap_or(DEFAULT_CONNECT_TIMEOUT_S),
                verbose: given(ENV_VERBOSE).is_some_and(|v| !is_false(&v)),
            })
        };
        Some(parse())
    }

    /// What TF_SetTarget gets.
    pub fn target(&self) -> String {
        format!("grpc://{}", self.server)
    }

    /// The session_metadata.name the server parses.
    pub fn metadata_name(&self) -> String {
        let mut query = Vec::new();
        if let Some(p) = self.priority {
            query.push(format!("priority={p}"));
        }
        if let Some(n) = self.iterations {
            query.push(format!("iterations={n}"));
        }
        if let Some(s) = self.seconds {
            query.push(format!("seconds={}", format_seconds(s)));
        }
        if query.is_empty() {
            self.name.clone()
        } else {
            format!("{}?{}", self.name, query.join("&"))
        }
    }
}

fn is_false(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "false" | "no" | "off"
    )
}

/// `host:port` from `host:port` or `grpc://host:port`.
pub fn normalize_server(value: &str, source: &str) -> Result<String, SettingsError> {
    let invalid = || {
        SettingsError(format!(
            "{source}={value:?} is not valid: expected HOST:PORT or grpc://HOST:PORT, e.g. 127.0.0.1:5501"
        ))
    };
    let mut text = value.trim();
    if let Some(rest) = text.strip_prefix("grpc://") {
        text = rest;
    } else if text.contains("://") {
        return Err(invalid());
    }
    let text = text.trim_end_matches('/');
    let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
    let port_ok = !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..65536).contains(&p));
    if host.is_empty() || host.contains('/') || !port_ok {
        return Err(invalid());
    }
    Ok(text.to_string())
}

/// `(host, port)` for a socket address lookup; brackets of an IPv6 literal removed.
pub fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

pub fn check_name(value: &str, source: &str) -> Result<String, SettingsError> {
    if value.contains('?') {
        return Err(SettingsError(format!(
            "{source}={value:?} is not valid: a job name cannot contain '?'"
        )));
    }
    if value.chars().any(|c| (c as u32) < 32) {
        return Err(SettingsError(format!(
            "{source}={value:?} is not valid: a job name cannot contain control characters"
        )));
    }
    Ok(value.to_string())
}

fn check_priority(value: &str) -> Result<i32, SettingsError> {
    let n: i64 = value.trim().parse().map_err(|_| {
        SettingsError(format!(
            "{ENV_PRIORITY}={value:?} is not valid: expected an integer"
        ))
    })?;
    i32::try_from(n).map_err(|_| {
        SettingsError(format!(
            "{ENV_PRIORITY}={value:?} is not valid: expected an integer in [{}, {}]",
            i32::MIN,
            i32::MAX
        ))
    })
}

fn check_iterations(value: &str) -> Result<u64, SettingsError> {
    match value.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(SettingsError(format!(
            "{ENV_ITERATIONS}={value:?} is not valid: expected a positive integer"
        ))),
    }
}

fn check_seconds(value: &str, source: &str) -> Result<f64, SettingsError> {
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(s),
        _ => Err(SettingsError(format!(
            "{source}={value:?} is not valid: expected a positive number of seconds"
        ))),
    }
}

/// Python's repr of a float without a trailing `.0` (1.5 -> "1.5", 9.0 -> "9").
fn format_seconds(s: f64) -> String {
    let text = format!("{s:?}");
    text.strip_suffix(".0").map(str::to_string).unwrap_or(text)
}

/// The program's file name (`/usr/bin/java` -> `java`), as the Python adapter names a script by its file.
pub fn default_job_name() -> String {
    let argv0 = std::fs::read("/proc/self/cmdline")
        .ok()
        .and_then(|raw| {
            raw.split(|&b| b == 0)
                .next()
                .map(|a| String::from_utf8_lossy(a).into_owned())
        })
        .unwrap_or_default();
    job_name_from_argv0(&argv0)
}

fn job_name_from_argv0(argv0: &str) -> String {
    let base = argv0.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    let name: String = base
        .chars()
        .map(|c| if c == '?' || (c as u32) < 32 { '_' } else { c })
        .collect();
    if name.is_empty() {
        "tf-c-api".to_string()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Option<Result<Settings, SettingsError>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned(), || "prog".to_string())
    }

    #[test]
    fn no_server_means_no_redirect() {
        assert!(settings(&[]).is_none());
        assert!(settings(&[(ENV_SERVER, ""), (ENV_PRIORITY, "bad")]).is_none());
    }

    #[test]
    fn hints_are_formatted_like_the_python_adapter() {
        let s = settings(&[
            (ENV_SERVER, "grpc://127.0.0.1:5501/"),
            (ENV_NAME, "train-c"),
            (ENV_PRIORITY, "-2"),
            (ENV_ITERATIONS, "50"),
            (ENV_SECONDS, "1.5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.server, "127.0.0.1:5501");
        assert_eq!(s.target(), "grpc://127.0.0.1:5501");
        assert_eq!(
            s.metadata_name(),
            "train-c?priority=-2&iterations=50&seconds=1.5"
        );
        let whole = settings(&[(ENV_SERVER, "h:1"), (ENV_SECONDS, "9")])
            .unwrap()
            .unwrap();
        assert_eq!(whole.metadata_name(), "prog?seconds=9");
        let plain = settings(&[(ENV_SERVER, "[::1]:5501")]).unwrap().unwrap();
        assert_eq!(plain.metadata_name(), "prog");
        assert_eq!(plain.connect_timeout_s, DEFAULT_CONNECT_TIMEOUT_S);
        assert!(!plain.verbose);
    }

    #[test]
    fn invalid_values_name_the_variable() {
        for (key, value, needle) in [
            (ENV_SERVER, "localhost", "SALUS_SERVER=\"localhost\""),
            (ENV_SERVER, "http://h:1", "SALUS_SERVER"),
            (ENV_SERVER, "h:70000", "SALUS_SERVER"),
            (ENV_SERVER, "h:+5", "SALUS_SERVER"),
            (ENV_NAME, "a?b", "cannot contain '?'"),
            (ENV_NAME, "a\nb", "control characters"),
            (ENV_PRIORITY, "high", "SALUS_PRIORITY=\"high\" is not valid"),
            (ENV_PRIORITY, "2147483648", "[-2147483648, 2147483647]"),
            (ENV_ITERATIONS, "0", "positive integer"),
            (ENV_ITERATIONS, "1.5", "positive integer"),
            (ENV_SECONDS, "-1", "positive number of seconds"),
            (ENV_SECONDS, "inf", "positive number of seconds"),
            (ENV_CONNECT_TIMEOUT, "nan", "SALUS_CONNECT_TIMEOUT"),
        ] {
            let mut vars = vec![(ENV_SERVER, "127.0.0.1:1")];
            vars.retain(|(k, _)| *k != key);
            vars.push((key, value));
            let err = settings(&vars).unwrap().unwrap_err();
            assert!(err.0.contains(needle), "{key}={value}: {err}");
        }
    }

    #[test]
    fn split_host_port_handles_ipv6() {
        assert_eq!(split_host_port("[::1]:5501"), Some(("::1", 5501)));
        assert_eq!(split_host_port("127.0.0.1:80"), Some(("127.0.0.1", 80)));
        assert_eq!(split_host_port("nohost"), None);
    }

    #[test]
    fn job_name_is_the_program_file() {
        assert_eq!(job_name_from_argv0("/usr/lib/jvm/bin/java"), "java");
        assert_eq!(job_name_from_argv0("./train?x"), "train_x");
        assert_eq!(job_name_from_argv0(""), "tf-c-api");
    }

    #[test]
    fn verbose_flag() {
        let on = settings(&[(ENV_SERVER, "h:1"), (ENV_VERBOSE, "1")])
            .unwrap()
            .unwrap();
        assert!(on.verbose);
        let off = settings(&[(ENV_SERVER, "h:1"), (ENV_VERBOSE, "off")])
            .unwrap()
            .unwrap();
        assert!(!off.verbose);
    }
}
