//! The book's generated reference pages (`docs/src/reference/`): every flag,
//! environment variable and subcommand of `salus-server` from its clap
//! definition, the config file's keys from the same flags, and the Prometheus
//! series from the collector that serves `/metrics`. Generated, not written by
//! hand, so that they cannot drift from the code: the test below renders them
//! and fails when the committed pages differ, printing the command that
//! writes them again ([`BLESS_COMMAND`]).
//!
//! The renderer takes any [`clap::Command`], so other binaries' pages (the
//! CLI, the simulator) can use it too.

use std::fmt::Write as _;

use clap::{Arg, ArgAction, Command};

/// The command that rewrites the committed pages from the code.
pub const BLESS_COMMAND: &str = "SALUS_BLESS=1 cargo test -p salus-server --lib reference";

/// The note at the top of every generated page.
fn generated_note() -> String {
    format!(
        "<!-- Generated from the code by server/src/reference.rs: do not edit. \
         To regenerate: {BLESS_COMMAND} -->\n\n"
    )
}

/// Markdown text made safe for a table cell: `|` escaped, and `<`, `>` too (see [`escape_html`]).
fn escape(text: &str) -> String {
    escape_html(text).replace('|', "\\|")
}

/// An argument's help as written in its doc comment (the long form where it has one).
fn help_text(arg: &Arg) -> String {
    arg.get_long_help()
        .or(arg.get_help())
        .map(|help| help.to_string())
        .unwrap_or_default()
}

/// `--long <VALUE>` / `-s, --long` / `<NAME>`: how the argument is written.
fn spelling(arg: &Arg) -> String {
    let value = || {
        arg.get_value_names()
            .map(|names| {
                names
                    .iter()
                    .map(|n| format!("<{n}>"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()))
    };
    if arg.is_positional() {
        return value();
    }
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    let mut text = names.join(", ");
    if arg.get_action().takes_values() {
        text.push(' ');
        text.push_str(&value());
    }
    text
}

/// What a reader needs beside the help: environment variable, default,
/// accepted values, repetition.
fn facts(arg: &Arg) -> Vec<String> {
    let mut facts = Vec::new();
    if arg.is_required_set() {
        facts.push("required".to_string());
    }
    if let Some(env) = arg.get_env() {
        facts.push(format!("env `{}`", env.to_string_lossy()));
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && arg.get_action().takes_values() {
        facts.push(format!("default `{}`", defaults.join(",")));
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !possible.is_empty() && arg.get_action().takes_values() {
        facts.push(format!("one of {}", possible.join(", ")));
    }
    match arg.get_action() {
        ArgAction::Append => facts.push("repeatable".to_string()),
        ArgAction::Count => facts.push("counts (repeat it)".to_string()),
        _ => {}
    }
    if let Some(delimiter) = arg.get_value_delimiter() {
        facts.push(format!("values separated by `{delimiter}`"));
    }
    facts
}

/// The arguments a page documents: not hidden, not clap's own help and version.
fn documented_args(command: &Command) -> impl Iterator<Item = &Arg> {
    command.get_arguments().filter(|arg| {
        !arg.is_hide_set() && !matches!(arg.get_action(), ArgAction::Help | ArgAction::Version)
    })
}

/// One command and, below it, each visible subcommand: usage, help, every
/// argument with its environment variable, default and help. `path` is the
/// command line that reaches it (`salus-server ctl`), `depth` its heading level.
fn render_command(out: &mut String, command: &mut Command, path: &str, depth: usize) {
    let hashes = "#".repeat(depth);
    let _ = writeln!(out, "{hashes} `{path}`\n");
    let about = command
        .get_long_about()
        .or(command.get_about())
        .map(|a| a.to_string());
    if let Some(about) = about {
        let _ = writeln!(out, "{about}\n");
    }
    let aliases: Vec<String> = command
        .get_visible_aliases()
        .map(|a| format!("`{a}`"))
        .collect();
    if !aliases.is_empty() {
        let _ = writeln!(out, "Also spelt {}.\n", aliases.join(", "));
    }
    // A built command's usage names the whole path (`salus-server ctl jobs [OPTIONS]`).
    let usage = command.render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ").trim();
    let _ = writeln!(out, "```text\n{usage}\n```\n");
    let args: Vec<&Arg> = documented_args(command).collect();
    if !args.is_empty() {
        for arg in args {
            let facts = facts(arg);
            let facts = if facts.is_empty() {
                String::new()
            } else {
                format!(" ({})", facts.join("; "))
            };
            let help = help_text(arg).replace('\n', "\n  ");
            if help.is_empty() {
                let _ = writeln!(out, "- **`{}`**{facts}", spelling(arg));
            } else {
                let _ = writeln!(
                    out,
                    "- **`{}`**{facts}  \n  {}",
                    spelling(arg),
                    escape_html(&help)
                );
            }
        }
        out.push('\n');
    }
    let names: Vec<String> = command
        .get_subcommands()
        // clap's generated `help` subcommand repeats the pages above.
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        let sub = command
            .find_subcommand_mut(&name)
            .expect("a subcommand listed by get_subcommands");
        render_command(out, sub, &format!("{path} {name}"), depth + 1);
    }
}

/// Help text made safe where mdBook would read `<NAME>` as an HTML tag:
/// `<` and `>` outside code spans become entities (inside one they show as written).
fn escape_html(text: &str) -> String {
    text.split('`')
        .enumerate()
        .map(|(n, part)| {
            if n % 2 == 0 {
                part.replace('<', "&lt;").replace('>', "&gt;")
            } else {
                part.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// The reference page of `command` and all its visible subcommands.
pub fn command_markdown(command: &Command, title: &str, intro: &str) -> String {
    let mut command = command.clone();
    command.build();
    let mut out = format!("# {title}\n\n{}{intro}\n\n", generated_note());
    let name = command.get_name().to_string();
    render_command(&mut out, &mut command, &name, 2);
    out.trim_end().to_string() + "\n"
}

/// How a flag is written as a key of `--config`'s TOML file (see
/// `config_file::file_arguments`, which reads them so).
fn toml_kind(arg: &Arg) -> &'static str {
    match arg.get_action() {
        ArgAction::Count => "integer 0-255 (times the flag is given)",
        ArgAction::SetTrue | ArgAction::SetFalse => "true or false",
        ArgAction::Append => "array (or one value)",
        _ => "string or number",
    }
}

/// The config file's keys: the top-level command's flags by long name.
pub fn config_file_markdown(command: &Command) -> String {
    let mut command = command.clone();
    command.build();
    let mut out = format!("# Config file keys\n\n{}", generated_note());
    out.push_str(
        "`salus-server --config FILE` (or `SALUS_CONFIG`) reads a TOML file whose keys are the \
         server's flags without the leading dashes; each value is parsed and checked exactly \
         like the flag's. The command line and the environment win over the file, the file wins \
         over the defaults, and a key that is no flag is an error naming it. `salus-server ctl \
         reload` and SIGHUP read it again (see [Drain, reload and settings that \
         persist](../operator/drain-reload.md)). Details of each key: [server \
         flags](server-flags.md).\n\n",
    );
    out.push_str("```toml\npolicy = \"srtf\"\nmemory-capacity = \"12GiB\"\nlane-hold-limit = 60\nadmins = [\"ops\"]\n```\n\n");
    out.push_str("| key | TOML value | default | env |\n|---|---|---|---|\n");
    for arg in documented_args(&command) {
        let Some(long) = arg.get_long() else { continue };
        if long == crate::config_file::CONFIG_FLAG {
            continue;
        }
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if default.is_empty() || !arg.get_action().takes_values() {
            "-".to_string()
        } else {
            format!("`{}`", escape(&default.join(",")))
        };
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "| [`{long}`](server-flags.md) | {} | {default} | {env} |",
            toml_kind(arg)
        );
    }
    out
}

/// One metric family as `/metrics` describes it.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: String,
    labels: std::collections::BTreeSet<String>,
}

/// The Prometheus series of `/metrics`, read from a scrape the collector
/// encodes with every optional part present (memory capacity, lanes,
/// tenants, jobs): name, type, labels and help, as the endpoint serves them.
pub fn metrics_markdown() -> String {
    use crate::frontend::metrics::collector::{encode, Scrape};
    use salus_proto::salus::v1::{
        ErrorCount, JobInfo, LaneQueue, LatencySummary, MemoryLane, SchedulerStats, ServerInfo,
        TenantShare,
    };
    let latency = || {
        Some(LatencySummary {
            count: 1,
            sum_us: 1.0,
            buckets: vec![1],
            ..Default::default()
        })
    };
    let text = encode(Scrape {
        info: ServerInfo {
            version: "V".into(),
            memory_capacity_bytes: 1,
            memory_lanes: vec![MemoryLane {
                lane: 1,
                ..Default::default()
            }],
            run_errors: vec![ErrorCount {
                code: "INTERNAL".into(),
                count: 1,
            }],
            ..Default::default()
        },
        jobs: vec![JobInfo {
            id: 1,
            name: "job".into(),
            kind: "graph".into(),
            state: "running".into(),
            ..Default::default()
        }],
        stats: SchedulerStats {
            lanes: vec![LaneQueue {
                lane: 1,
                ..Default::default()
            }],
            switch_latency: latency(),
            iteration_time: latency(),
            queue_wait: latency(),
            tenants: vec![TenantShare {
                tenant: "t".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    })
    .expect("encoding a scrape into a String cannot fail");

    let mut families: Vec<(String, Family)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push((
                name.to_string(),
                Family {
                    help: help.to_string(),
                    ..Default::default()
                },
            ));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some((_, family)) = families.iter_mut().find(|(n, _)| n == name) {
                family.kind = kind.to_string();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split([' ', '{']).next().unwrap_or_default();
            // A sample belongs to the family whose name is the longest prefix of its own
            // (counters add `_total`, histograms `_bucket`, `_sum`, `_count`).
            let Some((_, family)) = families
                .iter_mut()
                .filter(|(n, _)| series.starts_with(n.as_str()))
                .max_by_key(|(n, _)| n.len())
            else {
                continue;
            };
            if let Some((_, labels)) = line.split_once('{') {
                for pair in labels.split("\",") {
                    if let Some((key, _)) = pair.split_once('=') {
                        if key != "le" {
                            family.labels.insert(key.trim().to_string());
                        }
                    }
                }
            }
        }
    }

    let mut out = format!("# Metrics\n\n{}", generated_note());
    out.push_str(
        "`salus-server --metrics-listen ADDR` serves these series in Prometheus' text format \
         (0.0.4) at `http://ADDR/metrics` (see [Monitoring](../operator/monitoring.md)). Histograms \
         are served as `_bucket` (label `le`, power-of-two \
         buckets from 1 us to 2^26 us, in seconds), `_sum` and `_count`. Per-job series exist for \
         open jobs only, the 100 oldest with their own labels and the rest summed into \
         `job_id=\"other\"`; the memory series only with `--memory-capacity`.\n\n",
    );
    out.push_str("| series | type | labels | help |\n|---|---|---|---|\n");
    for (name, family) in &families {
        // The descriptor carries the served name (counters with their `_total`).
        let served = name;
        let labels = if family.labels.is_empty() {
            "-".to_string()
        } else {
            family
                .labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "| `{served}` | {} | {labels} | {} |",
            family.kind,
            escape(&family.help)
        );
    }
    out
}

/// Every generated page: its path under `docs/src/reference/` and its text.
pub fn pages() -> Vec<(&'static str, String)> {
    use clap::CommandFactory;
    let server = crate::config::Args::command();
    vec![
        (
            "server-flags.md",
            command_markdown(
                &server,
                "salus-server flags and subcommands",
                "Every flag of `salus-server` is also an environment variable (named beside it) \
                 and a key of the [config file](config-file.md); the command line wins over the \
                 environment, the environment over the file. Sizes take `KiB`, `MiB`, `GiB` (or \
                 a bare number of bytes). `salus-server --help` prints the same text.",
            ),
        ),
        ("config-file.md", config_file_markdown(&server)),
        ("metrics.md", metrics_markdown()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn reference_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference")
    }

    /// The committed pages are what the code renders now; `SALUS_BLESS=1`
    /// writes them instead.
    #[test]
    fn reference_pages_are_current() {
        let dir = reference_dir();
        let bless = std::env::var_os("SALUS_BLESS").is_some_and(|v| v == "1");
        let mut stale = Vec::new();
        for (name, text) in pages() {
            let path = dir.join(name);
            if bless {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != text {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "the generated reference is stale: {} differ from the code; regenerate with\n    {BLESS_COMMAND}\n(from the repository root) and commit the result",
            stale.join(", ")
        );
    }

    #[test]
    fn every_flag_and_env_var_is_on_the_flags_page() {
        use clap::CommandFactory;
        let page = &pages()[0].1;
        let command = crate::config::Args::command();
        for arg in documented_args(&command) {
            if let Some(long) = arg.get_long() {
                assert!(
                    page.lines()
                        .any(|l| l.starts_with("- **`") && l.contains(&format!("--{long}"))),
                    "--{long} missing"
                );
            }
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(page.contains(&format!("env `{env}`")), "{env} missing");
            }
        }
        // The flag the hand-written table lost.
        assert!(page.contains("`--admins"));
        assert!(page.contains("## `salus-server ctl`"));
    }

    #[test]
    fn every_metric_is_on_the_metrics_page() {
        let page = metrics_markdown();
        // Every series name the collector writes, also one it writes only under a condition the
        // sample scrape might miss.
        let source = include_str!("../../node/src/frontend/metrics/collector.rs");
        let source = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        let mut named = 0;
        for (at, _) in source.match_indices("\"salus_") {
            let rest = &source[at + 1..];
            let piece = &rest[..rest.find('"').unwrap_or(0)];
            if piece.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                named += 1;
                assert!(
                    page.contains(&format!("| `{piece}")),
                    "{piece} is written by the collector but not on the metrics page: \
                     give the sample scrape in metrics_markdown() what makes it appear"
                );
            }
        }
        assert!(
            named > 30,
            "found only {named} series names in collector.rs"
        );
        for series in [
            "salus_server_info",
            "salus_iterations_total",
            "salus_executors_total",
            "salus_lane_capacity_bytes",
            "salus_tenant_weight",
            "salus_job_iterations_total",
            "salus_switch_latency_seconds",
        ] {
            assert!(page.contains(&format!("`{series}`")), "{series} missing");
        }
        assert!(page.contains("| `salus_jobs` | gauge | `kind`, `state` |"));
    }
}
