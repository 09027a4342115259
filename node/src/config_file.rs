//! `--config FILE`: every flag of [`crate::config::Args`] as a TOML key of the same long
//! name (`policy = "srtf"`, `lane-hold-limit = 60`, `admins = ["ci-bot"]`).
//! A flag given on the command line or in its environment variable wins over
//! the file; the file wins over the flag's default. A key that names no flag
//! is an error naming the key, so a typo never passes silently.
//!
//! The file is merged by handing its values to clap as if they were typed
//! before the real arguments, for the flags the command line and the
//! environment left at their defaults: each value is then parsed and checked
//! exactly like the flag's. What was loaded ([`Loaded`]) travels in the
//! config, so that a reload (`salus reload`, SIGHUP) can read the same argv
//! again and tell which values changed.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::ArgAction;

/// The flag that names the file.
pub const CONFIG_FLAG: &str = "config";

/// Subcommands that never read the config file: a tenant's executor is given
/// the supervisor's merged flags on its command line ([`Loaded::child_args`]:
/// it runs as its tenant, who may not read the file, and must not see an
/// edit the supervisor has not applied), and `ctl` talks to a server, whose
/// settings it does not need. The device probe, run as the supervisor's user
/// at start, reads it like the supervisor.
const SUBCOMMANDS_WITHOUT_FILE: [&str; 2] = ["executor", "ctl"];

/// Where the flags of this process came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// `--config`, absolute; None: no file.
    pub file: Option<PathBuf>,
    /// The process's arguments (argv[0] first), read again at a reload.
    /// Empty: flags that did not come from a command line (tests).
    pub argv: Vec<OsString>,
    /// Every flag's value after the merge, as text, by long name: what a
    /// reload compares to tell what changed.
    pub values: BTreeMap<String, String>,
    /// The keys whose value came from the file.
    pub from_file: BTreeSet<String>,
    /// The arguments with the file's values inlined and `--config` left out
    /// (argv[0] not included): what children (executors) are started with, so
    /// they run with the supervisor's values without reading the file.
    pub child_args: Vec<OsString>,
}

/// Why the config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the config file {path} is not valid TOML: {why}")]
    Syntax { path: PathBuf, why: String },
    #[error(
        "the config file {path} has an unknown key `{key}`: its keys are salus-server's flags \
         without the leading dashes (e.g. policy = \"srtf\", lane-hold-limit = 60; see --help)"
    )]
    UnknownKey { path: PathBuf, key: String },
    #[error("the config file {path}: `{key}` {why}")]
    BadValue {
        path: PathBuf,
        key: String,
        why: String,
    },
}

/// `argv`'s matches of `command` (argv[0] first), with `--config`'s file
/// merged: the command line and the environment win over the file, the file
/// over the defaults; and where they came from.
pub fn matches_with_file(
    command: clap::Command,
    argv: Vec<OsString>,
) -> Result<(clap::ArgMatches, Loaded), clap::Error> {
    let as_clap_error = |err: ConfigFileError| {
        command
            .clone()
            .error(clap::error::ErrorKind::ValueValidation, err)
    };
    let matches = command.clone().try_get_matches_from(&argv)?;
    let wants_file = !matches
        .subcommand_name()
        .is_some_and(|name| SUBCOMMANDS_WITHOUT_FILE.contains(&name));
    let file = matches
        .get_one::<PathBuf>(CONFIG_FLAG)
        .filter(|_| wants_file)
        .map(|path| crate::tenant::absolute(path));
    let (matches, from_file) = match &file {
        None => (matches, BTreeSet::new()),
        Some(path) => {
            let table = read_table(path).map_err(as_clap_error)?;
            let (file_args, from_file) =
                file_arguments(&command, &matches, &table, path).map_err(as_clap_error)?;
            let mut merged = Vec::with_capacity(argv.len() + file_args.len());
            merged.extend(argv.first().cloned());
            merged.extend(file_args);
            merged.extend(argv.iter().skip(1).cloned());
            (command.clone().try_get_matches_from(&merged)?, from_file)
        }
    };
    let values = effective_values(&command, &matches);
    let loaded = Loaded {
        child_args: child_args(&command, &matches, &values, &from_file, &argv),
        file,
        argv,
        values,
        from_file,
    };
    Ok((matches, loaded))
}

fn read_table(path: &Path) -> Result<toml::Table, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|err| ConfigFileError::Syntax {
            path: path.to_path_buf(),
            why: err.message().to_string(),
        })
}

/// The flags the top-level command takes by long name (help, version and
/// `--config` itself excluded).
fn flags(command: &clap::Command) -> impl Iterator<Item = &clap::Arg> {
    command.get_arguments().filter(|arg| {
        arg.get_long().is_some_and(|long| long != CONFIG_FLAG)
            && !matches!(arg.get_action(), ArgAction::Help | ArgAction::Version)
    })
}

/// The file's values as arguments (`--key=value`), for the flags that the
/// command line and the environment did not set; and the keys they are.
fn file_arguments(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    table: &toml::Table,
    path: &Path,
) -> Result<(Vec<OsString>, BTreeSet<String>), ConfigFileError> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for (key, value) in table {
        let bad = |why: String| ConfigFileError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
            why,
        };
        if key == CONFIG_FLAG {
            return Err(bad(
                "cannot be set in a config file (it names the file itself)".into(),
            ));
        }
        // A flag's old name (an alias, e.g. anticipation-us) names it too.
        let Some(arg) = flags(command).find(|arg| {
            arg.get_long() == Some(key.as_str())
                || arg
                    .get_all_aliases()
                    .is_some_and(|aliases| aliases.contains(&key.as_str()))
        }) else {
            return Err(ConfigFileError::UnknownKey {
                path: path.to_path_buf(),
                key: key.clone(),
            });
        };
        let id = arg.get_id().as_str();
        if matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            // The command line and the environment win over the file.
            continue;
        }
        let flag = format!("--{key}");
        match arg.get_action() {
            ArgAction::Count => {
                let times = value
                    .as_integer()
                    .filter(|n| (0..=u8::MAX as i64).contains(n))
                    .ok_or_else(|| bad("is a count: an integer from 0 to 255".into()))?;
                out.extend((0..times).map(|_| OsString::from(&flag)));
            }
            ArgAction::SetTrue | ArgAction::SetFalse => {
                let on = value
                    .as_bool()
                    .ok_or_else(|| bad("is true or false".into()))?;
                if on == matches!(arg.get_action(), ArgAction::SetTrue) {
                    out.push(flag.into());
                }
            }
            ArgAction::Append => {
                let items = match value {
                    toml::Value::Array(items) => items.iter().collect(),
                    single => vec![single],
                };
                for item in items {
                    let text = scalar_text(item).map_err(&bad)?;
                    out.push(format!("{flag}={text}").into());
                }
            }
            _ => {
                let text = scalar_text(value).map_err(&bad)?;
                out.push(format!("{flag}={text}").into());
            }
        }
        used.insert(key.clone());
    }
    Ok((out, used))
}

/// A TOML scalar as the text a flag takes.
fn scalar_text(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Float(x) => Ok(x.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(_) => Err("takes one value, not a list".into()),
        toml::Value::Table(_) => Err("takes a value, not a table".into()),
        toml::Value::Datetime(_) => Err("takes a value, not a date".into()),
    }
}

/// Every flag's value as text (lists joined with commas; unset: empty).
fn effective_values(
    command: &clap::Command,
    matches: &clap::ArgMatches,
) -> BTreeMap<String, String> {
    flags(command)
        .filter_map(|arg| {
            let id = arg.get_id().as_str();
            let text = match arg.get_action() {
                ArgAction::Count => matches.get_count(id).to_string(),
                ArgAction::SetTrue | ArgAction::SetFalse => matches.get_flag(id).to_string(),
                _ => matches
                    .get_raw(id)
                    .map(|raw| {
                        raw.map(|v| v.to_string_lossy().into_owned())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default(),
            };
            Some((arg.get_long()?.to_string(), text))
        })
        .collect()
}

/// The arguments a child process gets: the file's values inlined as flags,
/// then the original arguments without `--config` (flags whose value came
/// from the environment stay there: children inherit it).
fn child_args(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    values: &BTreeMap<String, String>,
    from_file: &BTreeSet<String>,
    argv: &[OsString],
) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    for arg in flags(command) {
        let Some(long) = arg.get_long() else { continue };
        if !from_file.contains(long) {
            continue;
        }
        let id = arg.get_id().as_str();
        match arg.get_action() {
            ArgAction::Count => {
                out.extend((0..matches.get_count(id)).map(|_| OsString::from(format!("--{long}"))))
            }
            ArgAction::SetTrue | ArgAction::SetFalse => {
                if matches.get_flag(id) == matches!(arg.get_action(), ArgAction::SetTrue) {
                    out.push(format!("--{long}").into());
                }
            }
            ArgAction::Append => {
                if let Some(raw) = matches.get_raw(id) {
                    for value in raw {
                        let mut flag = OsString::from(format!("--{long}="));
                        flag.push(value);
                        out.push(flag);
                    }
                }
            }
            _ => {
                if let Some(value) = values.get(long) {
                    out.push(format!("--{long}={value}").into());
                }
            }
        }
    }
    let config_long = format!("--{CONFIG_FLAG}");
    let config_eq = format!("--{CONFIG_FLAG}=");
    let mut rest = argv.iter().skip(1);
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy();
        if text == "--" {
            out.push(arg.clone());
            out.extend(rest.cloned());
            break;
        }
        if text == config_long {
            rest.next();
            continue;
        }
        if text.starts_with(&config_eq) {
            continue;
        }
        out.push(arg.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Args, Config};
    use clap::Parser;

    fn write(label: &str, text: &str) -> PathBuf {
        let dir = crate::state_dir::temp_dir(label);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("salus.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn argv(args: &[&str]) -> Vec<OsString> {
        std::iter::once("salus-server")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from_with_config_file(argv(args))
    }

    #[test]
    fn the_file_sets_flags_under_their_long_names_and_the_command_line_wins() {
        let path = write(
            "merge",
            "policy = \"srtf\"\nlane-hold-limit = 7\nadmins = [\"ci-bot\", \"ops\"]\n\
             memory-capacity = \"2GiB\"\nverbose = 1\nlisten = \"127.0.0.1:0\"\n",
        );
        let file = path.to_str().unwrap();
        let args = parse(&["--config", file, "--policy", "fifo"]).unwrap();
        assert_eq!(args.policy, "fifo", "the command line wins over the file");
        assert_eq!(
            args.lane_hold_limit.value,
            std::time::Duration::from_secs(7)
        );
        assert!(
            args.lane_hold_limit.bare,
            "a bare number: seconds, with a warning"
        );
        assert_eq!(args.admins, ["ci-bot", "ops"]);
        assert_eq!(args.memory_capacity, Some(2 << 30));
        assert_eq!(args.verbose, 1);
        let loaded = &args.loaded;
        assert_eq!(loaded.file.as_deref(), Some(path.as_path()));
        assert_eq!(loaded.values["policy"], "fifo");
        assert_eq!(loaded.values["lane-hold-limit"], "7");
        assert_eq!(loaded.values["admins"], "ci-bot,ops");
        assert!(!loaded.from_file.contains("policy"));
        assert!(loaded.from_file.contains("lane-hold-limit"));
        // Children get the merged values and never the file.
        let child: Vec<String> = loaded
            .child_args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(
            child.contains(&"--lane-hold-limit=7".to_string()),
            "{child:?}"
        );
        assert!(child.contains(&"--admins=ops".to_string()), "{child:?}");
        assert!(
            !child.iter().any(|a| a.contains("config") || a == file),
            "{child:?}"
        );
        let reparsed =
            Args::try_parse_from(argv(&[]).into_iter().chain(loaded.child_args.clone())).unwrap();
        assert_eq!(
            reparsed.lane_hold_limit.value,
            std::time::Duration::from_secs(7)
        );
        assert_eq!(reparsed.policy, "fifo");
        let config = Config::try_from(args).unwrap();
        assert_eq!(
            config.lane_hold_limit,
            Some(std::time::Duration::from_secs(7))
        );
        assert_eq!(config.loaded.values["policy"], "fifo");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        // The only test that sets this variable, or reads the flag.
        // The key is the flag's old name (an alias), its value a bare number in the old unit.
        let path = write(
            "env",
            "inter-op-threads = 5\nanticipation-us = 9\nidle-timeout = \"90s\"\n",
        );
        std::env::set_var("SALUS_INTER_OP_THREADS", "6");
        let parsed = parse(&["--config", path.to_str().unwrap()]);
        std::env::remove_var("SALUS_INTER_OP_THREADS");
        let args = parsed.unwrap();
        assert_eq!(args.inter_op_threads, 6);
        assert_eq!(args.anticipation.value, std::time::Duration::from_micros(9));
        assert_eq!(args.idle_timeout.value, std::time::Duration::from_secs(90));
        assert!(args.anticipation.bare && !args.idle_timeout.bare);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn unknown_keys_bad_values_and_bad_files_are_errors_naming_them() {
        let path = write("unknown", "policy = \"srtf\"\nlane_hold_limit = 60\n");
        let err = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown key `lane_hold_limit`"), "{err}");
        let path = write("bad-value", "timeline-capacity = \"many\"\n");
        let err = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("timeline-capacity") && err.contains("many"),
            "{err}"
        );
        let path = write("list", "policy = [\"a\", \"b\"]\n");
        let err = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`policy` takes one value"), "{err}");
        let path = write("syntax", "policy = \n");
        let err = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not valid TOML"), "{err}");
        let path = write("itself", "config = \"/x\"\n");
        let err = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`config` cannot be set"), "{err}");
        let err = parse(&["--config", "/nonexistent/salus.toml"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot read the config file /nonexistent/salus.toml"),
            "{err}"
        );
        // An executor never reads the file (its supervisor inlined it).
        assert!(parse(&["--config", "/nonexistent/salus.toml", "executor"]).is_ok());
    }

    #[test]
    fn without_a_file_the_values_are_the_flags() {
        let args = parse(&["--policy", "las"]).unwrap();
        assert_eq!(args.loaded.file, None);
        assert_eq!(args.loaded.values["policy"], "las");
        assert_eq!(args.loaded.values["listen"], "127.0.0.1:5501");
        assert_eq!(args.loaded.values["metrics-listen"], "");
        assert_eq!(args.loaded.child_args, argv(&["--policy", "las"])[1..]);
    }
}
