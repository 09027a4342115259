//! Who a job is (tenant, name, fingerprint) and what is kept by identity:
//! the job history the learned policy reads, and hints an admin saved.

use crate::error::{Error, Result};
use crate::runtime::job_history::{HistorySaver, HistoryView};
use crate::runtime::saved_hints::SavedHints;
use crate::runtime::timeline::JobKind;
use crate::sched::{History, JobId};
use crate::tenant::identity::Tenant;

use super::{apply_weights, Executor};

impl Executor {
    /// A job opens: its owner, whose share it runs in once it joins the
    /// scheduler (call this first), and its label on the timeline. Refused
    /// when the owner has its maximum of jobs open, and while the node is
    /// drained ([`Executor::set_drain`]).
    pub fn open_job(
        &self,
        job: JobId,
        name: &str,
        kind: JobKind,
        owner: Option<&Tenant>,
    ) -> Result<()> {
        self.open_job_as(job, name, kind, owner, true)
    }

    /// [`Executor::open_job`] for a job that was open before this process
    /// started (an executor's job adopted after a restart or an upgrade of the
    /// supervisor): a drain does not refuse it, since it is no new job.
    pub fn reopen_job(
        &self,
        job: JobId,
        name: &str,
        kind: JobKind,
        owner: Option<&Tenant>,
    ) -> Result<()> {
        self.open_job_as(job, name, kind, owner, false)
    }

    pub(super) fn open_job_as(
        &self,
        job: JobId,
        name: &str,
        kind: JobKind,
        owner: Option<&Tenant>,
        new_job: bool,
    ) -> Result<()> {
        {
            let mut inner = self.shared.lock();
            // Checked here, where every new job of both isolation modes opens
            // (under `--isolation tenant` the supervisor's link calls this).
            if let Some(why) = inner.drain.as_ref().filter(|_| new_job) {
                return Err(Error::Unavailable(why.clone()));
            }
            if let Some(owner) = owner {
                inner.tenants.open(job, owner)?;
                // A tenant seen for the first time gets its weight.
                apply_weights(&mut inner);
            }
            // By the tenant's key, never its display name: a token tenant
            // named like a Unix user must not share that user's history or hints.
            let tenant = owner.map_or(String::new(), |t| t.key.to_text());
            inner.identities.open(job, &tenant, name);
            if !new_job {
                inner.reopened.insert(job);
            }
        }
        self.shared
            .timeline
            .open_job(job, name, kind, owner.map(|t| t.key.clone()));
        Ok(())
    }

    /// Who job `id` is (its tenant's durable name and its name), if it opened here.
    pub fn identity(&self, id: JobId) -> Option<crate::sched::JobIdentity> {
        self.shared.lock().identities.get(id).cloned()
    }

    /// The hints saved for job identity `key` ([`hints_key`]); None forgets them.
    pub fn save_hints(&self, key: String, hints: Option<SavedHints>) {
        let mut inner = self.shared.lock();
        match hints {
            Some(hints) => inner.saved_hints.insert(key, hints),
            None => inner.saved_hints.remove(&key),
        };
    }

    /// Completes a job's identity with the fingerprint of its main iteration
    /// (known at its first one): from then on it ranks, and its run is
    /// recorded, as that identity.
    pub fn set_fingerprint(&self, id: JobId, fingerprint: &str) {
        let mut inner = self.shared.lock();
        if let Some(identity) = inner.identities.set_fingerprint(id, fingerprint) {
            // Not in the scheduler yet (waiting for memory): it joins as this identity.
            let _ = inner.sched.set_identity(id, identity);
        }
        drop(inner);
        self.shared.wake.notify_all();
    }

    /// Starts from `history` (read back from the state directory) and saves
    /// the history through `saver` after each run it records.
    pub fn keep_history(&self, history: Option<History>, saver: Option<HistorySaver>) {
        let mut inner = self.shared.lock();
        if let Some(history) = history {
            inner.sched.set_history(history);
        }
        inner.history_saver = saver;
    }

    /// The job history's identities of `tenant` (None: every tenant's), with
    /// their runs and what they say of the next one, by identity.
    /// The history of the tenants of these keys (texts, [`crate::tenant::identity::TenantKey::to_text`]); None: every tenant's.
    pub fn history(&self, tenants: Option<&[String]>) -> HistoryView {
        let inner = self.shared.lock();
        let history = inner.sched.history();
        let mut identities: Vec<_> = history
            .identities()
            .into_iter()
            .filter(|i| tenants.is_none_or(|keys| keys.contains(&i.tenant)))
            .map(|i| (i.clone(), history.runs(i).to_vec(), history.estimate(i)))
            .collect();
        identities.sort_by(|a, b| a.0.cmp(&b.0));
        HistoryView {
            identities,
            max_identities: history.max_identities(),
            max_runs: history.max_runs(),
            file: inner.history_saver.as_ref().map(|s| s.file().to_path_buf()),
        }
    }

    /// Forgets the history of the identities of the tenant whose key text is
    /// `tenant`; returns how many (saved at once).
    pub fn erase_history(&self, tenant: &str) -> usize {
        let mut inner = self.shared.lock();
        let erased = inner.sched.erase_history(tenant);
        if erased > 0 {
            if let Some(saver) = &inner.history_saver {
                saver.save(inner.sched.history());
            }
        }
        erased
    }
}
