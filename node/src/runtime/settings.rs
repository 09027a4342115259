//! What admins change at run time, kept in the state directory
//! (`settings.json`) and restored at the next start: the scheduling policy
//! (`salus policy set`), tenants' limits and weights (`salus limits`), jobs' hints
//! (`salus hints`) and the drain (`salus drain`).
//!
//! A setting changed at run time and the flags and files (`--policy`,
//! `--config`, `--tenants-file`) can disagree; the newer word wins. Each
//! run-time change is saved with what the flags and files said when it was
//! made ([`Override::configured`]). At a start or a reload it applies again
//! while they still say that; once they say something else (the operator
//! edited the config since), theirs applies and the run-time change is
//! dropped, and the log and the reload's answer say so.
//!
//! Hints are kept by job identity, the tenant and the job's name
//! ([`hints_key`]), not by job id: a job adopted after a restart or submitted
//! again under its name gets them back. Admins are not saved here: they come
//! from `--admins` (flag or config file) alone, read again at a reload.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use crate::config_file::Loaded;
use crate::runtime::executor::Executor;
pub use crate::runtime::saved_hints::{hints_key, SavedHints};
use crate::state_dir::{
    unix_seconds, Loaded as LoadedDocument, StateDir, StateDirError, StateDocument,
};
use crate::tenant::admins::Admins;
use crate::tenant::identity::Identifier;
use crate::tenant::limits::{Limits, LimitsTable};

/// Job identities whose hints are kept; the ones set longest ago go first.
pub const MAX_SAVED_HINTS: usize = 1024;

/// Of those, the most of one tenant: a tenant that sets hints on jobs under
/// ever new names forgets its own oldest, never another tenant's.
pub const MAX_SAVED_HINTS_PER_TENANT: usize = 128;

/// The file's contents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SettingsDocument {
    #[serde(default)]
    pub policy: Option<Override<String>>,
    /// By tenant name (`*`: the defaults).
    #[serde(default)]
    pub limits: BTreeMap<String, Override<LimitsRecord>>,
    /// By job identity ([`hints_key`]).
    #[serde(default)]
    pub hints: BTreeMap<String, SavedHints>,
    #[serde(default)]
    pub drain: Option<DrainRecord>,
}

impl StateDocument for SettingsDocument {
    const FILE: &'static str = "settings.json";
    const VERSION: u32 = 1;
    const WHAT: &'static str = "run-time settings";
}

/// A value set at run time, and what the flags and files said then.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Override<T> {
    pub value: T,
    pub configured: T,
}

/// [`Limits`] as saved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
}

impl From<&Limits> for LimitsRecord {
    fn from(l: &Limits) -> LimitsRecord {
        LimitsRecord {
            weight: l.weight,
            max_jobs: l.max_jobs,
            max_priority: l.max_priority,
            memory: l.memory,
        }
    }
}

impl From<&LimitsRecord> for Limits {
    fn from(r: &LimitsRecord) -> Limits {
        Limits {
            weight: r.weight,
            max_jobs: r.max_jobs,
            max_priority: r.max_priority,
            memory: r.memory,
        }
    }
}

/// A drain in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    pub since_unix_s: u64,
    /// The admin who drained the node.
    pub by: String,
    /// Ends at the next start (`salus drain --until-restart`).
    #[serde(default)]
    pub until_restart: bool,
}

impl DrainRecord {
    pub fn now(by: &str, until_restart: bool) -> DrainRecord {
        DrainRecord {
            since_unix_s: unix_seconds(SystemTime::now()),
            by: by.to_string(),
            until_restart,
        }
    }

    /// What a job refused meanwhile is told (UNAVAILABLE).
    pub fn refusal(&self) -> String {
        format!(
            "this node is draining for maintenance (salus drain, by {}, since unix time {}): \
             it admits no new job; try another node or wait for `salus undrain`",
            self.by, self.since_unix_s
        )
    }
}

/// What the flags and files said at the last start or reload.
#[derive(Clone, Debug, Default)]
pub struct Configured {
    pub loaded: Loaded,
    pub policy: String,
    /// The tenants file's limits.
    pub file_limits: LimitsTable,
}

/// What a reload did (`salus reload`, SIGHUP).
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

/// Reads the flags and files again and applies them (`crate::reload`),
/// given the identifier whose tenants file it replaces; Err: why nothing
/// changed. A value here because the admin API, which calls it, sits below
/// the flags' module.
pub type Reloader = Box<
    dyn Fn(
            Option<Arc<Identifier>>,
        ) -> Pin<Box<dyn Future<Output = Result<ReloadReport, String>> + Send>>
        + Send
        + Sync,
>;

/// The run-time settings of the process that schedules: the document, where
/// it is saved, what the flags said, and the admins (read again at a reload).
#[derive(Default)]
pub struct Settings {
    /// None: kept in memory only (no state directory).
    dir: Option<Arc<StateDir>>,
    doc: Mutex<SettingsDocument>,
    /// Held while a snapshot of `doc` is written, so saves land in order.
    save_lock: Mutex<()>,
    configured: Mutex<Configured>,
    admins: RwLock<Arc<Admins>>,
    /// Set once at start where the flags came from a command line.
    reloader: OnceLock<Reloader>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("dir", &self.dir)
            .field("doc", &self.doc)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A job hints key ([`hints_key`]) of an earlier release, `NAME/JOB` by the
/// tenant's display name, by the tenant's key instead (see
/// [`crate::tenant::identity::TenantKey::text_from_legacy`]).
fn hints_key_from_legacy(key: &str) -> String {
    match key.split_once('/') {
        Some((tenant, job)) => hints_key(
            &crate::tenant::identity::TenantKey::text_from_legacy(tenant),
            job,
        ),
        None => key.to_string(),
    }
}

impl Settings {
    /// Reads the settings saved in `dir`, saying what was dropped. Blocks
    /// (file reads): call it off the async runtime.
    pub fn restore(dir: Arc<StateDir>) -> Settings {
        let mut doc = match dir.load::<SettingsDocument>() {
            LoadedDocument::Missing => SettingsDocument::default(),
            LoadedDocument::Restored(doc) => {
                tracing::info!(
                    policy = doc.policy.is_some(),
                    limits = doc.limits.len(),
                    hints = doc.hints.len(),
                    drained = doc.drain.is_some(),
                    "run-time settings restored from the state directory"
                );
                doc
            }
            LoadedDocument::Dropped(dropped) => {
                tracing::warn!(%dropped, "the run-time settings could not be read: starting without them");
                SettingsDocument::default()
            }
        };
        // Hints saved by earlier releases are keyed by the tenant's display name.
        let legacy = doc.hints.len();
        doc.hints = std::mem::take(&mut doc.hints)
            .into_iter()
            .map(|(key, hints)| (hints_key_from_legacy(&key), hints))
            .collect();
        if doc.hints.len() < legacy {
            tracing::info!(
                merged = legacy - doc.hints.len(),
                "job hints of one tenant under two names were merged"
            );
        }
        if doc.drain.as_ref().is_some_and(|d| d.until_restart) {
            tracing::info!("the drain asked until the next start (salus drain --until-restart) ends: jobs are admitted");
            doc.drain = None;
        }
        Settings {
            dir: Some(dir),
            doc: Mutex::new(doc),
            ..Settings::default()
        }
    }

    /// A copy of the document.
    pub fn document(&self) -> SettingsDocument {
        lock(&self.doc).clone()
    }

    pub fn admins(&self) -> Arc<Admins> {
        self.admins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_admins(&self, admins: Admins) {
        *self.admins.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(admins);
    }

    /// Installs the reload (once; later calls are ignored).
    pub fn set_reloader(&self, reloader: Reloader) {
        let _ = self.reloader.set(reloader);
    }

    /// Reloads the flags and files (see [`Reloader`]).
    pub async fn reload(
        &self,
        identifier: Option<Arc<Identifier>>,
    ) -> Result<ReloadReport, String> {
        match self.reloader.get() {
            Some(reload) => reload(identifier).await,
            None => Err(
                "this server reads no flags again (it was not started from a command line)".into(),
            ),
        }
    }

    pub fn configured(&self) -> Configured {
        lock(&self.configured).clone()
    }

    /// Applies what was saved over what `now` (the flags and files at a
    /// start or reload) says, to `core`: policy, limits, hints, drain. A
    /// run-time change whose flag or file value changed since is dropped.
    /// Returns a line for each run-time change kept or dropped; the caller
    /// saves the document ([`Settings::persist`]).
    pub fn reconcile(&self, core: &Executor, now: Configured) -> Vec<String> {
        let mut notes = Vec::new();
        let mut doc = lock(&self.doc);
        let mut policy = now.policy.clone();
        if let Some(set) = doc.policy.take() {
            if set.configured == now.policy {
                notes.push(format!(
                    "policy {} set with `salus policy set` applies (over {} from the flags)",
                    set.value, now.policy
                ));
                policy = set.value.clone();
                doc.policy = Some(set);
            } else {
                notes.push(format!(
                    "policy {} set with `salus policy set` is dropped: the flags changed from {} to {} since",
                    set.value, set.configured, now.policy
                ));
            }
        }
        if core.policy_name() != policy {
            if let Err(err) = core.set_policy(&policy) {
                // A saved name this build does not know: the flags' applies.
                notes.push(format!(
                    "policy {policy} cannot apply ({err}); {} does",
                    now.policy
                ));
                doc.policy = None;
                let _ = core.set_policy(&now.policy);
            }
        }
        core.replace_file_limits(now.file_limits.clone());
        doc.limits.retain(|name, set| {
            let file = LimitsRecord::from(&now.file_limits.own(name));
            if file == set.configured {
                core.set_limits(name, &Limits::from(&set.value));
                notes.push(format!(
                    "limits of {name} set with `salus limits` apply: {}",
                    Limits::from(&set.value)
                ));
                true
            } else {
                notes.push(format!(
                    "limits of {name} set with `salus limits` are dropped: the tenants file changed them since"
                ));
                false
            }
        });
        for (key, hints) in &doc.hints {
            core.save_hints(key.clone(), Some(hints.clone()));
        }
        core.set_drain(doc.drain.as_ref().map(DrainRecord::refusal));
        drop(doc);
        *lock(&self.configured) = now;
        notes
    }

    /// Records a policy set at run time.
    pub fn record_policy(&self, name: &str) {
        let configured = lock(&self.configured).policy.clone();
        lock(&self.doc).policy = (name != configured).then(|| Override {
            value: name.to_string(),
            configured,
        });
    }

    /// Records limits set at run time for `name` (the fields set in `set`).
    pub fn record_limits(&self, name: &str, set: &Limits) {
        let file = LimitsRecord::from(&lock(&self.configured).file_limits.own(name));
        let mut doc = lock(&self.doc);
        let entry = doc
            .limits
            .entry(name.to_string())
            .or_insert_with(|| Override {
                value: LimitsRecord::default(),
                configured: file.clone(),
            });
        let mut value = Limits::from(&entry.value);
        value.update(set);
        entry.value = LimitsRecord::from(&value);
        entry.configured = file;
    }

    /// Records the hints an admin set for job identity `key`; the oldest
    /// beyond [`MAX_SAVED_HINTS`] are forgotten (and returned, for the core).
    pub fn record_hints(&self, key: String, hints: SavedHints) -> Vec<String> {
        let mut doc = lock(&self.doc);
        // The key's tenant part (tenant names hold no '/'), with its '/'.
        let tenant = key
            .find('/')
            .map_or(String::new(), |i| key[..=i].to_string());
        doc.hints.insert(key.clone(), hints);
        let mut forgotten = Vec::new();
        loop {
            let of_tenant = doc.hints.keys().filter(|k| k.starts_with(&tenant)).count();
            let own = of_tenant > MAX_SAVED_HINTS_PER_TENANT;
            if !own && doc.hints.len() <= MAX_SAVED_HINTS {
                break;
            }
            let Some(oldest) = doc
                .hints
                .iter()
                .filter(|(k, _)| !own || (k.starts_with(&tenant) && **k != key))
                .min_by_key(|(_, h)| h.set_unix_s)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            doc.hints.remove(&oldest);
            forgotten.push(oldest);
        }
        forgotten
    }

    /// Records a drain (Some) or its end (None); returns the drain in force
    /// after it (a second drain keeps the first one's time and admin).
    pub fn record_drain(&self, drain: Option<DrainRecord>) -> Option<DrainRecord> {
        let mut doc = lock(&self.doc);
        match drain {
            Some(new) => Some(doc.drain.get_or_insert(new).clone()),
            None => {
                doc.drain = None;
                None
            }
        }
    }

    pub fn drain(&self) -> Option<DrainRecord> {
        lock(&self.doc).drain.clone()
    }

    /// Saves the document, off the async runtime (a fsync); nothing without
    /// a state directory.
    pub async fn persist(self: &Arc<Self>) -> Result<(), StateDirError> {
        if self.dir.is_none() {
            return Ok(());
        }
        let this = self.clone();
        match tokio::task::spawn_blocking(move || this.save_now()).await {
            Ok(saved) => saved,
            Err(err) => {
                tracing::error!(cause = %err, "saving the run-time settings failed");
                Ok(())
            }
        }
    }

    /// Saves the document now (blocks).
    pub fn save_now(&self) -> Result<(), StateDirError> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let _saving = lock(&self.save_lock);
        // The snapshot is taken under the save lock: a later save never
        // writes an older document.
        let doc = self.document();
        dir.save(&doc)
    }

    /// Saves, logging a failure (the change applies in memory either way).
    pub async fn persist_or_warn(self: &Arc<Self>, what: &str) {
        if let Err(err) = self.persist().await {
            tracing::warn!(cause = %err, what, "a run-time setting could not be saved: it applies until the server stops");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{policy, Hints, SchedConfig};

    fn core() -> Executor {
        Executor::new(policy::by_name("fair").unwrap(), SchedConfig::default())
    }

    fn configured(policy: &str, file: &str) -> Configured {
        Configured {
            loaded: Loaded::default(),
            policy: policy.into(),
            file_limits: crate::tenant::identity::TenantsFile::parse(file)
                .unwrap()
                .limits()
                .clone(),
        }
    }

    #[test]
    fn hints_saved_by_a_tenant_name_are_read_by_its_key() {
        assert_eq!(hints_key_from_legacy("root/train.py"), "uid:0/train.py");
        assert_eq!(hints_key_from_legacy("ci-bot/a/b"), "name:ci-bot/a/b");
        assert_eq!(hints_key_from_legacy("name:root/x"), "name:root/x");
        assert_eq!(hints_key_from_legacy("/job"), "/job");
        assert_eq!(hints_key_from_legacy("anonymous/job"), "anonymous/job");
    }

    #[test]
    fn the_document_round_trips_through_the_state_dir() {
        let path = crate::state_dir::temp_dir("settings");
        let dir = Arc::new(StateDir::open(&path).unwrap());
        let settings = Settings::restore(dir.clone());
        settings.reconcile(&core(), configured("fair", ""));
        settings.record_policy("srtf");
        settings.record_limits("alice", &Limits::parse(["weight=3"]).unwrap());
        settings.record_limits("alice", &Limits::parse(["max-jobs=2"]).unwrap());
        let hints = Hints {
            priority: 4,
            expected_seconds: Some(2.5),
            ..Hints::default()
        };
        settings.record_hints(hints_key("name:alice", "resnet"), SavedHints::of(&hints));
        settings.record_drain(Some(DrainRecord::now("root", false)));
        settings.save_now().unwrap();
        let saved = settings.document();
        drop(settings);
        let again = Settings::restore(dir);
        assert_eq!(again.document(), saved);
        assert_eq!(saved.policy.as_ref().unwrap().value, "srtf");
        assert_eq!(
            Limits::from(&saved.limits["alice"].value).to_string(),
            "weight=3 max-jobs=2"
        );
        assert_eq!(saved.hints["name:alice/resnet"].priority, 4);
        assert_eq!(saved.drain.as_ref().unwrap().by, "root");
        // A drain until the next start is not restored.
        again.record_drain(None);
        again.record_drain(Some(DrainRecord::now("kubelet", true)));
        again.save_now().unwrap();
        drop(again);
        let restarted = Settings::restore(Arc::new(StateDir::open(&path).unwrap()));
        assert_eq!(restarted.drain(), None);
        assert_eq!(restarted.document().policy, saved.policy);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn a_run_time_change_applies_until_the_flags_it_overrode_change() {
        let settings = Settings::default();
        let file = "alice - - weight=2\n";
        let core = core();
        settings.reconcile(&core, configured("fair", file));
        settings.record_policy("srtf");
        settings.record_limits("alice", &Limits::parse(["weight=5"]).unwrap());
        settings.record_limits("*", &Limits::parse(["max-jobs=9"]).unwrap());
        // A restart (a new core) with the same flags: the changes apply.
        let restarted = super::tests::core();
        let notes = settings.reconcile(&restarted, configured("fair", file));
        assert_eq!(restarted.policy_name(), "srtf", "{notes:?}");
        assert_eq!(
            restarted.set_limits("alice", &Limits::default()).weight,
            Some(5)
        );
        assert_eq!(
            restarted.set_limits("*", &Limits::default()).max_jobs,
            Some(9)
        );
        // The config now says las and the file gives alice weight 3: theirs apply.
        let notes = settings.reconcile(&restarted, configured("las", "alice - - weight=3\n"));
        assert_eq!(restarted.policy_name(), "las");
        assert_eq!(
            restarted.set_limits("alice", &Limits::default()).weight,
            Some(3)
        );
        assert!(
            notes
                .iter()
                .any(|n| n.contains("policy srtf set with `salus policy set` is dropped")),
            "{notes:?}"
        );
        assert!(
            notes
                .iter()
                .any(|n| n.contains("limits of alice set with `salus limits` are dropped")),
            "{notes:?}"
        );
        // The defaults' change still applies: the file's `*` did not change.
        assert_eq!(
            restarted.set_limits("*", &Limits::default()).max_jobs,
            Some(9)
        );
        let doc = settings.document();
        assert_eq!(doc.policy, None);
        assert!(!doc.limits.contains_key("alice") && doc.limits.contains_key("*"));
        // Setting the configured policy again leaves no override.
        settings.record_policy("las");
        assert_eq!(settings.document().policy, None);
    }

    #[test]
    fn drain_and_hints_reach_the_core_and_the_drain_keeps_its_first_record() {
        let settings = Settings::default();
        let first = settings
            .record_drain(Some(DrainRecord::now("root", false)))
            .unwrap();
        let second = settings
            .record_drain(Some(DrainRecord {
                since_unix_s: first.since_unix_s + 100,
                by: "ops".into(),
                until_restart: true,
            }))
            .unwrap();
        assert_eq!(second, first);
        settings.record_hints(
            hints_key("", "job"),
            SavedHints::of(&Hints {
                priority: 7,
                ..Hints::default()
            }),
        );
        let core = core();
        settings.reconcile(&core, configured("fair", ""));
        assert!(core.drain().unwrap().contains("salus undrain"));
        assert_eq!(settings.record_drain(None), None);
        settings.reconcile(&core, configured("fair", ""));
        assert_eq!(core.drain(), None);
    }

    #[test]
    fn hints_beyond_the_cap_forget_the_oldest() {
        let settings = Settings::default();
        for n in 0..=MAX_SAVED_HINTS as u64 {
            let hints = SavedHints {
                priority: 0,
                expected_iterations: None,
                expected_seconds: None,
                set_unix_s: 1000 + n,
            };
            let tenant = format!("t{}", n % 16);
            let forgotten = settings.record_hints(hints_key(&tenant, &format!("job{n}")), hints);
            if n == MAX_SAVED_HINTS as u64 {
                assert_eq!(forgotten, ["t0/job0"]);
            } else {
                assert!(forgotten.is_empty());
            }
        }
        assert_eq!(settings.document().hints.len(), MAX_SAVED_HINTS);
    }

    #[test]
    fn a_tenant_beyond_its_share_of_hints_forgets_its_own_oldest() {
        let settings = Settings::default();
        let at = |s: u64| SavedHints {
            priority: 0,
            expected_iterations: None,
            expected_seconds: None,
            set_unix_s: s,
        };
        settings.record_hints(hints_key("alice", "resnet"), at(1));
        for n in 0..500u64 {
            let forgotten =
                settings.record_hints(hints_key("mallory", &format!("job{n}")), at(2 + n));
            assert!(
                forgotten.iter().all(|k| k.starts_with("mallory/")),
                "{forgotten:?}"
            );
        }
        let doc = settings.document();
        assert!(
            doc.hints.contains_key("alice/resnet"),
            "another tenant's hints stay"
        );
        let mallory = doc
            .hints
            .keys()
            .filter(|k| k.starts_with("mallory/"))
            .count();
        assert_eq!(mallory, MAX_SAVED_HINTS_PER_TENANT);
        assert!(
            doc.hints.contains_key("mallory/job499") && !doc.hints.contains_key("mallory/job0")
        );
        // The tenant "" (no tenant) is a tenant of its own, not a prefix of every key.
        settings.record_hints(hints_key("", "anon"), at(9999));
        assert!(settings.document().hints.contains_key("/anon"));
    }
}
