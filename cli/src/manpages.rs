//! Man pages (clap_mangen) and shell completions (clap_complete) of the command tree.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::Cli;

/// `salus completions SHELL`: the completion script on `out`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), crate::PROG, out);
}

/// Writes salus.1 and one page per command (salus-jobs.1, salus-token-issue.1, ...)
/// into `dir`, creating it; returns the pages written.
pub fn write_manpages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut root = Cli::command();
    root.build();
    let mut written = Vec::new();
    write_page(&root, crate::PROG, dir, &mut written)?;
    Ok(written)
}

fn write_page(
    cmd: &clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    if cmd.is_hide_set() {
        return Ok(());
    }
    // A subcommand's page is titled by its full name, as `man salus-jobs` finds it.
    let page = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "));
    let path = dir.join(format!("{name}.1"));
    let mut file = std::fs::File::create(&path)?;
    clap_mangen::Man::new(page).render(&mut file)?;
    written.push(path);
    for sub in cmd.get_subcommands() {
        if sub.get_name() != "help" {
            write_page(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_visible_command() {
        let dir = std::env::temp_dir().join(format!("salus-man-{}", std::process::id()));
        let pages = write_manpages(&dir).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for expected in [
            "salus.1",
            "salus-jobs.1",
            "salus-token-issue.1",
            "salus-policy-set.1",
            "salus-run.1",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} not in {names:?}"
            );
        }
        assert!(!names.iter().any(|n| n.contains("manpages")), "{names:?}");
        let jobs = std::fs::read_to_string(dir.join("salus-jobs.1")).unwrap();
        assert!(jobs.contains("\\-\\-json"), "{jobs}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completions_name_the_commands() {
        let mut out = Vec::new();
        completions(clap_complete::Shell::Bash, &mut out);
        let script = String::from_utf8(out).unwrap();
        assert!(
            script.contains("drain") && script.contains("token"),
            "{}",
            &script[..200]
        );
    }
}
