//! `ctl reload` and SIGHUP: the flags read again from the same command line,
//! environment and config file (`--config`), and the tenants file
//! (`--tenants-file`) read again. What can change live applies at once: the
//! policy, tenants' tokens and limits (weights included), admins. Every other
//! flag whose value changed is named as needing a restart and keeps its old
//! value until then. A file that cannot be read or is invalid changes nothing.
//!
//! Run-time changes (`ctl policy`, `ctl limits`) stay over the files until the
//! files change what they overrode ([`crate::settings`]).

use std::future::Future;

use salus_proto::salus::v1::ReloadResponse;

use crate::config::{Args, Config};
use crate::frontend::admin::AdminService;
use crate::settings::Configured;

/// The flags a reload applies to the running server; every other one needs a
/// restart.
pub const LIVE_FLAGS: [&str; 3] = ["policy", "admins", "tenants-file"];

/// What a reload did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    pub config_file: Option<String>,
    pub tenants_file: Option<String>,
    /// What changed and applies now.
    pub applied: Vec<String>,
    /// Flags whose new value needs a restart.
    pub needs_restart: Vec<String>,
    /// Run-time changes kept over the files, or dropped.
    pub notes: Vec<String>,
}

/// Why nothing was reloaded.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("this server's flags did not come from a command line: there is nothing to read again")]
    NoCommandLine,
    #[error("nothing changed: {0}")]
    Flags(String),
    #[error("nothing changed: {0}")]
    Config(String),
    #[error("nothing changed: the reload could not run ({0})")]
    Task(String),
}

impl ReloadReport {
    pub fn to_proto(&self) -> ReloadResponse {
        ReloadResponse {
            config_file: self.config_file.clone().unwrap_or_default(),
            tenants_file: self.tenants_file.clone().unwrap_or_default(),
            applied: self.applied.clone(),
            needs_restart: self.needs_restart.clone(),
            notes: self.notes.clone(),
        }
    }

    /// Logs each line (the server's log tells what a SIGHUP did).
    pub fn log(&self) {
        if self.applied.is_empty() && self.needs_restart.is_empty() {
            tracing::info!(config = ?self.config_file, tenants = ?self.tenants_file, "reloaded: nothing changed");
        }
        for line in &self.applied {
            tracing::info!(change = %line, "reloaded");
        }
        for line in &self.needs_restart {
            tracing::warn!(change = %line, "reloaded, but this change needs a restart");
        }
        for line in &self.notes {
            tracing::info!(note = %line, "reloaded");
        }
    }
}

/// Reads the flags, the config file and the tenants file again and applies
/// what can change live to the server `admin` administers (its scheduler
/// core, identifier and settings).
pub async fn reload(admin: &AdminService) -> Result<ReloadReport, ReloadError> {
    let settings = admin.node().settings.clone();
    let before = settings.configured();
    if before.loaded.argv.is_empty() {
        return Err(ReloadError::NoCommandLine);
    }
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
    let mut now = Configured::of(&config);
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
        report.applied.push(format!(
            "admins: {}",
            settings.admins().describe()
        ));
    }
    if let Some(identifier) = admin.identifier() {
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
    let core = admin.core();
    let policy_before = core.policy_name();
    report.notes = settings.reconcile(core, now);
    let policy_after = core.policy_name();
    if policy_after != policy_before {
        report.applied.push(format!("policy: {policy_before} -> {policy_after}"));
    }
    settings.persist_or_warn("the settings after a reload").await;
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
                tracing::error!(cause = %err, "cannot watch SIGHUP: reload with `salus-server ctl reload`");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP received: reading the flags, the config file and the tenants file again");
            match reload(&admin).await {
                Ok(report) => report.log(),
                Err(err) => tracing::error!(cause = %err, "reload failed"),
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
