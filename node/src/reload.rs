//! `salus reload` and SIGHUP: the flags read again from the same command line,
//! environment and config file (`--config`), and the tenants file
//! (`--tenants-file`) read again. What can change live applies at once: the
//! policy, tenants' tokens and limits (weights included), admins. Every other
//! flag whose value changed is named as needing a restart and keeps its old
//! value until then. A file that cannot be read or is invalid changes nothing.
//!
//! Run-time changes (`salus policy set`, `salus limits`) stay over the files until the
//! files change what they overrode ([`crate::settings`]).

use std::future::Future;
use std::sync::{Arc, Weak};

use crate::config::{Args, Config};
use crate::frontend::admin::AdminService;
use crate::runtime::executor::Executor;
use crate::runtime::settings::{Configured, ReloadReport, Reloader, Settings};
use crate::tenant::identity::Identifier;

/// The flags a reload applies to the running server; every other one needs a
/// restart.
pub const LIVE_FLAGS: [&str; 3] = ["policy", "admins", "tenants-file"];

/// Why nothing was reloaded.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("nothing changed: {0}")]
    Flags(String),
    #[error("nothing changed: {0}")]
    Config(String),
    #[error("nothing changed: the reload could not run ({0})")]
    Task(String),
    #[error("the server is stopping")]
    Stopping,
}

/// What the flags and files say, as the run-time settings compare it.
pub fn configured(config: &Config) -> Configured {
    Configured {
        loaded: config.loaded.clone(),
        policy: config.policy.clone(),
        file_limits: config.tenants.limits().clone(),
    }
}

/// The reload of the server whose scheduler core is `core` and whose
/// run-time settings are `settings` (held weakly: the settings hold this).
pub fn reloader(core: Executor, settings: Weak<Settings>) -> Reloader {
    Box::new(move |identifier| {
        let core = core.clone();
        let settings = settings.clone();
        Box::pin(async move {
            let settings = settings
                .upgrade()
                .ok_or(ReloadError::Stopping.to_string())?;
            let report = reload(&core, &settings, identifier.as_deref())
                .await
                .map_err(|e| e.to_string())?;
            report_log(&report);
            Ok(report)
        })
    })
}

/// Logs each line of a reload's report (the server's log tells what a
/// reload did).
pub fn report_log(report: &ReloadReport) {
    if report.applied.is_empty() && report.needs_restart.is_empty() {
        tracing::info!(config = ?report.config_file, tenants = ?report.tenants_file, "reloaded: nothing changed");
    }
    for line in &report.applied {
        tracing::info!(change = %line, "reloaded");
    }
    for line in &report.needs_restart {
        tracing::warn!(change = %line, "reloaded, but this change needs a restart");
    }
    for line in &report.notes {
        tracing::info!(note = %line, "reloaded");
    }
}

/// Reads the flags, the config file and the tenants file again and applies
/// what can change live: to `core`, `settings` and `identifier` (whose
/// tenants file it replaces).
pub async fn reload(
    core: &Executor,
    settings: &Arc<Settings>,
    identifier: Option<&Identifier>,
) -> Result<ReloadReport, ReloadError> {
    let before = settings.configured();
    let argv = before.loaded.argv.clone();
    // Off the runtime: file reads and user lookups (the tenants file's users).
    let config = tokio::task::spawn_blocking(move || {
        let args = Args::try_parse_from_with_config_file(argv)
            .map_err(|err| ReloadError::Flags(clap_message(&err)))?;
        Config::try_from(args).map_err(ReloadError::Config)
    })
    .await
    .map_err(|err| ReloadError::Task(err.to_string()))??;
    let mut report = ReloadReport {
        config_file: config.loaded.file.as_ref().map(|f| f.display().to_string()),
        tenants_file: config
            .loaded
            .values
            .get("tenants-file")
            .filter(|f| !f.is_empty())
            .cloned(),
        ..ReloadReport::default()
    };
    let mut now = configured(&config);
    for (key, new) in &config.loaded.values {
        let old = before.loaded.values.get(key).cloned().unwrap_or_default();
        if *new == old || LIVE_FLAGS.contains(&key.as_str()) {
            continue;
        }
        report.needs_restart.push(format!(
            "{key}: {} -> {} (needs a restart)",
            shown(&old),
            shown(new)
        ));
        // Still the running value: the next reload names it again.
        now.loaded.values.insert(key.clone(), old);
    }
    let admins = settings.admins();
    if *admins != config.admins {
        settings.set_admins(config.admins.clone());
        report
            .applied
            .push(format!("admins: {}", settings.admins().describe()));
    }
    if let Some(identifier) = identifier {
        if *identifier.tenants() != config.tenants {
            identifier.replace_tenants(config.tenants.clone());
            report.applied.push(format!(
                "tenants file: {} tenants with tokens (new connections are identified by it; open ones stay as they were)",
                config.tenants.len()
            ));
        }
    }
    if before.file_limits != *config.tenants.limits() {
        report
            .applied
            .push("tenants' limits and weights: the tenants file's now apply".into());
    }
    let policy_before = core.policy_name();
    report.notes = settings.reconcile(core, now);
    let policy_after = core.policy_name();
    if policy_after != policy_before {
        report
            .applied
            .push(format!("policy: {policy_before} -> {policy_after}"));
    }
    settings
        .persist_or_warn("the settings after a reload")
        .await;
    Ok(report)
}

/// Reloads on every SIGHUP, logging what each did, for as long as the
/// returned future runs (spawn it). The handler is installed before this
/// returns, so a SIGHUP that comes after no longer ends the process. Call it
/// within the async runtime.
pub fn on_sighup(admin: AdminService) -> impl Future<Output = ()> + Send + 'static {
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move {
        let mut hangups = match hangups {
            Ok(hangups) => hangups,
            Err(err) => {
                tracing::error!(cause = %err, "cannot watch SIGHUP: reload with `salus reload`");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            tracing::info!(
                "SIGHUP received: reading the flags, the config file and the tenants file again"
            );
            // The same reload as `salus reload`'s (it logs what it did).
            let settings = admin.node().settings.clone();
            if let Err(err) = settings.reload(admin.identifier().cloned()).await {
                tracing::error!(cause = %err, "reload failed");
            }
        }
    }
}

/// A clap error's message without its usage lines.
fn clap_message(err: &clap::Error) -> String {
    let text = err.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_string()
}

fn shown(value: &str) -> &str {
    if value.is_empty() {
        "(unset)"
    } else {
        value
    }
}
