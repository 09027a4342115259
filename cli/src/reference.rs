//! A clap command tree as markdown: every command, argument, default and
//! environment variable. docs/src/reference/cli.md is this of `salus`; the
//! server's flags can be rendered the same way.

use std::fmt::Write;

use clap::{Arg, ArgAction, Command};

/// The whole tree under `cmd` (hidden commands and arguments left out), one
/// `##` section per command, its path as the title.
pub fn command_markdown(cmd: &Command) -> String {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut out = String::new();
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name()).to_string();
    section(&cmd, &name, &[], &mut out);
    out
}

/// One command's section, then its subcommands'; `inherited` are the global
/// arguments of its ancestors, described where they are defined.
fn section(cmd: &Command, path: &str, inherited: &[String], out: &mut String) {
    let _ = writeln!(out, "## `{path}`\n");
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(|a| a.to_string())
        .unwrap_or_default();
    if !about.is_empty() {
        let _ = writeln!(out, "{}\n", about.trim());
    }
    let mut usage = cmd.clone().bin_name(path.to_string());
    let usage = usage.render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ").trim();
    let _ = writeln!(out, "```text\n{usage}\n```\n");
    let subcommands: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    if !subcommands.is_empty() {
        let _ = writeln!(out, "Commands:\n");
        for s in &subcommands {
            let about = s.get_about().map(|a| a.to_string()).unwrap_or_default();
            let _ = writeln!(out, "- `{}`: {}", s.get_name(), one_line(&about));
        }
        out.push('\n');
    }
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .filter(|a| !inherited.iter().any(|id| id == a.get_id().as_str()))
        .collect();
    let mut globals = inherited.to_vec();
    globals.extend(
        args.iter()
            .filter(|a| a.is_global_set())
            .map(|a| a.get_id().to_string()),
    );
    if !args.is_empty() {
        let _ = writeln!(
            out,
            "| Argument | Default | Environment | Meaning |\n|---|---|---|---|"
        );
        for a in args {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                arg_name(a),
                defaults(a),
                a.get_env()
                    .map_or("".to_string(), |e| format!("`{}`", e.to_string_lossy())),
                cell(&format!(
                    "{}{}",
                    if a.is_global_set() && cmd.has_subcommands() {
                        "(global: its subcommands take it too) "
                    } else {
                        ""
                    },
                    a.get_long_help()
                        .or(a.get_help())
                        .map(|h| h.to_string())
                        .unwrap_or_default()
                ))
            );
        }
        out.push('\n');
    }
    for s in subcommands {
        section(s, &format!("{path} {}", s.get_name()), &globals, out);
    }
}

fn arg_name(a: &Arg) -> String {
    let value = a
        .get_value_names()
        .map(|v| {
            v.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
    let takes_value = !matches!(
        a.get_action(),
        ArgAction::SetTrue
            | ArgAction::SetFalse
            | ArgAction::Count
            | ArgAction::Help
            | ArgAction::Version
    );
    let mut names = Vec::new();
    if let Some(short) = a.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = a.get_long() {
        names.push(format!("--{long}"));
    }
    for alias in a.get_visible_aliases().unwrap_or_default() {
        names.push(format!("--{alias}"));
    }
    if names.is_empty() {
        return format!(
            "`{value}`{}",
            if a.is_required_set() {
                ""
            } else {
                " (optional)"
            }
        );
    }
    let shown = names.join(", ");
    if takes_value {
        format!("`{shown} {value}`")
    } else {
        format!("`{shown}`")
    }
}

fn defaults(a: &Arg) -> String {
    if matches!(a.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        return String::new();
    }
    let values: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.is_empty() {
        String::new()
    } else {
        format!("`{}`", values.join(" "))
    }
}

/// Text for one table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// docs/src/reference/cli.md is generated: regenerate with
    /// `SALUS_BLESS=1 cargo test -p salus-cli reference`.
    #[test]
    fn reference_cli_md_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/reference/cli.md");
        let expected = format!(
            "# CLI reference\n\n<!-- Generated from cli/src by `SALUS_BLESS=1 cargo test -p salus-cli reference`: do not edit. -->\n\n\
             The `salus` command. Exit statuses: [exit codes](exit-codes.md); JSON keys: [JSON output](json.md).\n\n{}",
            command_markdown(&crate::Cli::command())
        );
        if std::env::var_os("SALUS_BLESS").is_some() {
            std::fs::write(path, &expected).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == expected,
            "docs/src/reference/cli.md is stale: regenerate it with `SALUS_BLESS=1 cargo test -p salus-cli reference`"
        );
    }

    #[test]
    fn the_markdown_names_every_command_flag_default_and_variable() {
        let md = command_markdown(&crate::Cli::command());
        for needle in [
            "## `salus token issue`",
            "## `salus policy set`",
            "`--server ADDR` | `127.0.0.1:5501` | `SALUS_SERVER`",
            "`--json`",
            "`-d, --interval, --delay DURATION` | `1s`",
        ] {
            assert!(md.contains(needle), "{needle} not in:\n{md}");
        }
        assert!(!md.contains("manpages"));
    }
}
