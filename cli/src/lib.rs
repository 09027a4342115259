//! `salus`: the one command-line client of a salus-server, for users (run a
//! script on it, watch it) and admins (policy, limits, tokens, drain). It links
//! no TensorFlow: it talks to the server's admin API over gRPC.
//!
//! - [`Cli`]: the command tree (clap); [`main`] runs it and returns the exit status.
//! - [`error`]: failures, their text and the exit status table.
//! - [`commands`]: each command's calls and its text and JSON output.
//! - [`reference`]: the command tree as markdown (docs/src/reference/cli.md), reusable for other clap trees.
//! - [`manpages`]: man pages and shell completions.
//!
//! `salus-server ctl ...` forwards here ([`main_legacy_ctl`]), and so does the
//! Python package's `salus` console script (it execs this binary).

pub mod commands;
pub mod error;
pub mod manpages;
pub mod reference;
mod run;
mod timeline_png;
mod top;
pub mod units;
mod users;

use std::ffi::OsString;
use std::io::Write;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use commands::{HistoryAction, LimitArgs, TokenAction};
pub use error::{CliError, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE};

/// The name the binary is installed as; errors start with it.
pub const PROG: &str = "salus";

#[derive(Parser, Debug)]
#[command(
    name = "salus",
    version,
    about = "Run TensorFlow scripts on a shared salus-server, watch it, and administer it",
    long_about = "Run TensorFlow scripts on a shared salus-server, watch it, and administer it.\n\n\
        Every command takes --server (default $SALUS_SERVER, else 127.0.0.1:5501) and --token \
        (default $SALUS_TOKEN). Commands that print take --json for a machine-readable form \
        (docs/src/reference/json.md lists the keys).",
    after_help = error::EXIT_STATUS_HELP,
    propagate_version = true,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(flatten)]
    pub conn: Connection,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the server is and who is asking: before or after the command.
#[derive(Args, Debug, Clone)]
pub struct Connection {
    /// The salus-server: HOST:PORT or grpc://HOST:PORT.
    #[arg(
        long,
        global = true,
        env = "SALUS_SERVER",
        default_value = "127.0.0.1:5501",
        value_name = "ADDR"
    )]
    pub server: String,
    /// The token to identify with (an admin token from --admins, or a tenant's);
    /// without one the server identifies a loopback caller by its Unix user.
    #[arg(long, global = true, env = "SALUS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long to wait for the connection to the server (500ms, 5s, 1m).
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s", value_parser = units::parse_duration)]
    pub connect_timeout: Duration,
}

/// `--json` of the commands that print.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct Output {
    /// Print JSON instead of text (keys and units: docs/src/reference/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command with its TensorFlow work on the server.
    ///
    /// Sets SALUS_SERVER and the job hints (SALUS_JOB_NAME, SALUS_PRIORITY,
    /// SALUS_EXPECTED_ITERATIONS, SALUS_EXPECTED_SECONDS) in the environment and
    /// executes COMMAND, whose exit status is salus's. TensorFlow sessions of
    /// Python processes with salus-tf installed go to the server.
    #[command(override_usage = "salus run [OPTIONS] -- COMMAND [ARGS]...")]
    Run(run::RunArgs),
    /// List jobs (state, lane, iterations, attained time, queue wait, hints)
    /// and the device memory issued tokens reserve.
    Jobs {
        #[command(flatten)]
        out: Output,
    },
    /// A live view of lanes, jobs and queues (until Ctrl-C, or --once).
    Top(top::TopArgs),
    /// Scheduler statistics: switch latency, queues, iterations per second,
    /// device time per tenant, and the server's event counters.
    Stats {
        #[command(flatten)]
        out: Output,
    },
    /// Show the scheduling policy, or set it (jobs are kept; setting is for admins).
    Policy {
        #[command(subcommand)]
        action: Option<PolicyAction>,
        /// Print JSON instead of text (keys and units: docs/src/reference/json.md).
        #[arg(long, global = true)]
        json: bool,
    },
    /// Change a job's hints (job id, session handle or name): only the ones given change.
    Hints {
        /// The job: its id, session handle or name.
        job: String,
        /// Priority (higher runs first under the priority policy).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
        /// Expected main iterations (0: none).
        #[arg(long)]
        iterations: Option<u64>,
        /// Expected total device seconds (0: none).
        #[arg(long)]
        seconds: Option<f64>,
        #[command(flatten)]
        out: Output,
    },
    /// Change a tenant's limits (admins only): the ones given replace its
    /// earlier ones, the rest stay. TENANT: a user name, a tenants file name,
    /// anonymous, or * for every tenant without limits of its own.
    Limits {
        tenant: String,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        out: Output,
    },
    /// Device memory this server shares and how much tokens reserve: what a
    /// cluster engine's config needs (Slurm's salusmem GRES count, Ray's
    /// salus_mem_mib resource), in MiB.
    Capacity {
        #[command(flatten)]
        out: Output,
    },
    /// What the server runs on: versions, isolation, devices as TensorFlow
    /// lists them, GPU 0 as the CUDA driver reported it, and where the memory
    /// capacity comes from.
    Info {
        #[command(flatten)]
        out: Output,
    },
    /// Tokens issued at run time (admins only): issue, revoke, list.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// The job history the `learned` policy ranks by: each job identity's
    /// runs and expected length; `history erase` forgets a tenant's.
    History {
        #[command(subcommand)]
        action: Option<HistoryAction>,
        /// Whose: yours by default; an admin may name any tenant (and sees
        /// every tenant's without one): user:NAME or uid:N (a Unix user),
        /// token:NAME (a token tenant without a user), anonymous, or a bare
        /// NAME (both the user and the token tenant of that name; an erase
        /// refuses when both have a history). Kept by tenant, not by name: a
        /// token tenant named like a user never sees that user's history.
        #[arg(long, global = true)]
        tenant: Option<String>,
        /// Print JSON instead of text (keys and units: docs/src/reference/json.md).
        #[arg(long, global = true)]
        json: bool,
    },
    /// Stop admitting new jobs (admins only): each is refused with UNAVAILABLE
    /// naming the drain; open jobs run on and are listed. Kept across restarts.
    Drain {
        /// Wait until no job is open (polling once a second).
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this long (90s, 15m, 2h), listing the
        /// jobs still open, with exit status 1.
        #[arg(long, requires = "wait", value_name = "DURATION", value_parser = units::parse_duration)]
        timeout: Option<Duration>,
        /// Not kept across a restart: the next start admits jobs (a
        /// Kubernetes preStop hook, whose pod's successor must serve).
        #[arg(long)]
        until_restart: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Admit new jobs again after `salus drain` (admins only).
    Undrain {
        #[command(flatten)]
        out: Output,
    },
    /// Read the config file (--config) and the tenants file again and apply
    /// what can change live (policy, tokens, limits, weights, admins); names
    /// the changes that need a restart (admins only; SIGHUP does the same).
    Reload {
        #[command(flatten)]
        out: Output,
    },
    /// Recent main iterations and cheap runs: per lane, per job counts and
    /// busy time; or every run as JSON, or a chart (PNG).
    Timeline {
        /// Runs that ended in the last DURATION (10s, 2m; a bare number is
        /// seconds; 0: all the server keeps).
        #[arg(long, default_value = "10s", value_name = "DURATION", allow_negative_numbers = true, value_parser = units::parse_duration_or_zero)]
        seconds: Duration,
        /// Draw a Gantt chart into FILE: a row per lane, a colour per job
        /// (runs `python3 -m salus._timeline`, which needs salus-tf and matplotlib;
        /// $SALUS_PYTHON names another interpreter).
        #[arg(long, value_name = "FILE", conflicts_with = "json")]
        png: Option<std::path::PathBuf>,
        #[command(flatten)]
        out: Output,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    ///
    /// bash: `salus completions bash > /etc/bash_completion.d/salus`;
    /// zsh: into a directory on $fpath as `_salus`; fish: into
    /// ~/.config/fish/completions/salus.fish.
    Completions { shell: clap_complete::Shell },
    /// Write man pages (salus.1, salus-jobs.1, ...) into DIR.
    #[command(hide = true)]
    Manpages {
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum PolicyAction {
    /// Print the scheduling policy (the default action).
    Show,
    /// Switch to NAME (admins only); jobs and queues are kept.
    Set {
        /// fifo, srtf, pack, fair, rr, priority, las, dlas, gittins or learned.
        name: String,
    },
}

/// The `salus` binary: runs the command line, prints, and returns the exit status.
pub fn main() -> i32 {
    run_command_line(std::env::args_os().collect())
}

/// `salus-server ctl ARGS...`: the same commands under their old name, for
/// one release, after a deprecation warning.
pub fn main_legacy_ctl(args: Vec<OsString>) -> i32 {
    warn("`salus-server ctl` is deprecated and will be removed in the next release: use `salus` (same commands)");
    let mut argv = vec![OsString::from(PROG)];
    argv.extend(args);
    run_command_line(argv)
}

fn warn(message: &str) {
    let _ = writeln!(std::io::stderr(), "{PROG}: warning: {message}");
}

/// Parses `argv` (the program name first) and runs it.
pub fn run_command_line(argv: Vec<OsString>) -> i32 {
    let (argv, renamed) = legacy_spellings(argv);
    for note in renamed {
        warn(&note);
    }
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout with status 0; the rest are usage errors (2).
            let _ = e.print();
            return e.exit_code();
        }
    };
    let server = cli.conn.server.clone();
    match execute(cli) {
        Ok(()) => EXIT_OK,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "{PROG}: {}", error.render(&server));
            error.exit_code()
        }
    }
}

/// Rewrites the spellings of the older CLIs into this one's, saying each: `policy NAME` -> `policy set NAME`.
pub fn legacy_spellings(mut argv: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let mut notes = Vec::new();
    if let Some(at) = first_positional(&argv) {
        let word = |i: usize| argv.get(i).and_then(|a| a.to_str()).map(str::to_owned);
        if word(at).as_deref() == Some("policy") {
            if let Some(name) = word(at + 1) {
                if !name.starts_with('-') && !matches!(name.as_str(), "show" | "set" | "help") {
                    notes.push(format!(
                        "`policy {name}` is deprecated: use `salus policy set {name}`"
                    ));
                    argv.insert(at + 1, OsString::from("set"));
                }
            }
        }
    }
    (argv, notes)
}

/// The index of the command word: the first argument after the program name
/// that is neither a global option nor its value.
fn first_positional(argv: &[OsString]) -> Option<usize> {
    let mut i = 1;
    while i < argv.len() {
        let arg = argv[i].to_str()?;
        if matches!(arg, "--server" | "--token" | "--connect-timeout") {
            i += 2;
        } else if arg.starts_with('-') {
            i += 1;
        } else {
            return Some(i);
        }
    }
    None
}

/// Runs a parsed command line.
pub fn execute(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run(args) => run::run(&cli.conn, args),
        Command::Completions { shell } => {
            manpages::completions(shell, &mut std::io::stdout());
            Ok(())
        }
        Command::Manpages { out } => manpages::write_manpages(&out).map(|_| ()).map_err(|e| {
            CliError::Local(format!(
                "cannot write man pages into {}: {e}",
                out.display()
            ))
        }),
        Command::Top(args) => top::top(&cli.conn, args),
        command => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| CliError::Local(format!("cannot start the async runtime: {e}")))?;
            let text = runtime.block_on(commands::run(&cli.conn, command))?;
            print_out(&text);
            Ok(())
        }
    }
}

/// Prints a command's output; a closed pipe (`salus jobs | head`) is not an error.
fn print_out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush());
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let argv: Vec<OsString> = std::iter::once("salus")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        Cli::try_parse_from(legacy_spellings(argv).0)
    }

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_go_before_or_after_the_command() {
        let before = parse(&["--server", "h:1", "jobs", "--json"]).unwrap();
        let after = parse(&["jobs", "--server", "h:1", "--json"]).unwrap();
        for cli in [before, after] {
            assert_eq!(cli.conn.server, "h:1");
            assert!(matches!(
                cli.command,
                Command::Jobs {
                    out: Output { json: true }
                }
            ));
        }
    }

    #[test]
    fn policy_name_alone_is_the_old_spelling_of_policy_set() {
        let (argv, notes) = legacy_spellings(
            ["salus", "--server", "h:1", "policy", "srtf"]
                .map(OsString::from)
                .to_vec(),
        );
        assert_eq!(
            argv,
            ["salus", "--server", "h:1", "policy", "set", "srtf"]
                .map(OsString::from)
                .to_vec()
        );
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("salus policy set srtf"));
        let cli = parse(&["policy", "srtf"]).unwrap();
        assert!(
            matches!(cli.command, Command::Policy { action: Some(PolicyAction::Set { ref name }), .. } if name == "srtf")
        );
        for current in [
            &["policy"][..],
            &["policy", "show"],
            &["policy", "--json"],
            &["policy", "set", "fifo"],
        ] {
            let argv: Vec<OsString> = std::iter::once("salus")
                .chain(current.iter().copied())
                .map(OsString::from)
                .collect();
            assert!(legacy_spellings(argv).1.is_empty(), "{current:?}");
        }
    }

    #[test]
    fn hints_keep_what_is_not_given_and_accept_negative_priorities() {
        let cli = parse(&["hints", "job1", "--iterations", "500"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Hints {
                priority: None,
                iterations: Some(500),
                seconds: None,
                ..
            }
        ));
        let cli = parse(&["hints", "job1", "--priority", "-2"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Hints {
                priority: Some(-2),
                ..
            }
        ));
    }

    #[test]
    fn usage_errors_exit_2_and_help_exits_0() {
        assert_eq!(
            parse(&["jobs", "--no-such-flag"]).unwrap_err().exit_code(),
            EXIT_USAGE
        );
        assert_eq!(
            parse(&["no-such-command"]).unwrap_err().exit_code(),
            EXIT_USAGE
        );
        assert_eq!(
            parse(&["drain", "--timeout", "5s"])
                .unwrap_err()
                .exit_code(),
            EXIT_USAGE
        );
        assert_eq!(
            parse(&["drain", "--wait", "--timeout", "soon"])
                .unwrap_err()
                .exit_code(),
            EXIT_USAGE
        );
        assert_eq!(parse(&["--help"]).unwrap_err().exit_code(), EXIT_OK);
        assert_eq!(
            run_command_line(vec!["salus".into(), "jobs".into(), "--bogus".into()]),
            EXIT_USAGE
        );
    }

    #[test]
    fn every_printing_command_has_json() {
        let mut root = Cli::command();
        root.build();
        let mut missing = Vec::new();
        fn walk(cmd: &clap::Command, path: String, missing: &mut Vec<String>) {
            let leaf =
                !cmd.has_subcommands() || cmd.get_name() == "policy" || cmd.get_name() == "history";
            let exempt = ["run", "completions", "manpages", "help"];
            if leaf
                && !exempt.contains(&cmd.get_name())
                && !cmd.get_arguments().any(|a| a.get_long() == Some("json"))
            {
                missing.push(path.clone());
            }
            for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                walk(sub, format!("{path} {}", sub.get_name()), missing);
            }
        }
        for sub in root.get_subcommands().filter(|s| s.get_name() != "help") {
            walk(sub, sub.get_name().to_string(), &mut missing);
        }
        assert!(missing.is_empty(), "without --json: {missing:?}");
    }

    #[test]
    fn the_help_ends_with_the_exit_status_table() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("3    unreachable"), "{help}");
    }
}
