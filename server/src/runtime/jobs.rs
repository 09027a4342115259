//! The tables of open jobs: graph sessions keyed by handle, eager contexts
//! keyed by the client's context id. Both share one id space and one limit.
//!
//! Every job has an owner, the tenant that created it, and a lookup names the
//! tenant asking: another tenant's handle or context id is not found, exactly
//! like one that never existed, and each tenant has its own context-id space
//! (context ids are chosen by clients).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::runtime::eager_job::EagerJob;
use crate::runtime::graph_job::Job;
use crate::sched::JobId;
use crate::tenant::identity::{Tenant, TenantKey};

/// How this executor's predecessor (of the same tenant) died, when it failed:
/// a handle or context id not found here most likely belonged to it, and its
/// client, whose connection closed with it, should hear why.
static PREDECESSOR_DEATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub fn note_predecessor_death(note: String) {
    let _ = PREDECESSOR_DEATH.set(note);
}

/// Refuses one more job where `open` jobs already reach `max`: the one
/// `--max-sessions` check, which counts graph sessions and eager contexts
/// together (before a job is built, and again under a table's lock when it
/// is inserted, so concurrent creations cannot overshoot).
pub fn check_room(open: usize, max: usize) -> Result<()> {
    if open >= max {
        return Err(Error::ResourceExhausted(format!(
            "the server already holds its maximum of {max} sessions and eager contexts (--max-sessions); \
             close those you no longer use"
        )));
    }
    Ok(())
}

fn session_not_found(handle: &str) -> Error {
    match PREDECESSOR_DEATH.get() {
        Some(note) => Error::LostWithExecutor(format!("session {handle:?} is gone: {note}")),
        None => Error::SessionNotFound(handle.to_string()),
    }
}

fn context_not_found(context_id: u64) -> Error {
    match PREDECESSOR_DEATH.get() {
        Some(note) => {
            Error::LostWithExecutor(format!("eager context {context_id} is gone: {note}"))
        }
        None => Error::ContextNotFound(context_id),
    }
}

/// A job and the tenant that owns it.
struct Owned<J> {
    owner: Arc<Tenant>,
    job: Arc<J>,
}

/// Jobs with their owners, sorted by creation.
fn oldest_first<'a, J: 'a>(
    entries: impl Iterator<Item = &'a Owned<J>>,
    created: impl Fn(&J) -> std::time::Instant,
) -> Vec<(Arc<Tenant>, Arc<J>)> {
    let mut jobs: Vec<_> = entries.map(|e| (e.owner.clone(), e.job.clone())).collect();
    jobs.sort_by_key(|(_, j)| created(j));
    jobs
}

/// Open jobs. The std mutex is never held across an `.await` or a TF call:
/// lookups clone the `Arc<Job>` and release it at once.
#[derive(Default)]
pub struct SessionTable {
    jobs: Mutex<HashMap<String, Owned<Job>>>,
    created: AtomicU64,
    /// The first job id: executor processes of one server get disjoint ranges.
    id_base: u64,
    closing: AtomicBool,
    /// Random per process, so a handle from an earlier server process never
    /// names a session of this one.
    salt: u64,
}

impl SessionTable {
    pub fn new() -> SessionTable {
        SessionTable {
            salt: RandomState::new().build_hasher().finish(),
            ..Default::default()
        }
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owned<Job>>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Job ids start at `base` (before the table is shared).
    pub fn set_id_base(&mut self, base: u64) {
        self.id_base = base;
    }

    /// A new job id and its unique session handle.
    pub fn next_job(&self) -> (JobId, String) {
        let n = self.id_base + self.created.fetch_add(1, Ordering::Relaxed);
        let mut h = RandomState::new().build_hasher();
        h.write_u64(n ^ self.salt);
        (
            JobId(n),
            format!("salus-{n}-{:016x}", h.finish() ^ self.salt),
        )
    }

    /// Finds a job by id (decimal), handle, or name.
    pub fn find(&self, key: &str) -> Result<Arc<Job>> {
        let jobs = self.jobs();
        if let Some(entry) = jobs.get(key) {
            return Ok(entry.job.clone());
        }
        let id = key.parse::<u64>().ok();
        jobs.values()
            .map(|e| &e.job)
            .find(|j| Some(j.id.0) == id || j.name == key)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("no job has id, handle or name {key:?}")))
    }

    /// Adds a job unless `open_elsewhere` (eager contexts) plus the sessions
    /// already open reach `max` ([`check_room`], under the table's lock).
    pub fn insert(
        &self,
        owner: Arc<Tenant>,
        job: Arc<Job>,
        open_elsewhere: usize,
        max: usize,
    ) -> Result<()> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let mut jobs = self.jobs();
        check_room(jobs.len() + open_elsewhere, max)?;
        jobs.insert(job.handle.clone(), Owned { owner, job });
        Ok(())
    }

    /// `tenant`'s session `handle`, marked as used now.
    pub fn get(&self, handle: &str, tenant: &TenantKey) -> Result<Arc<Job>> {
        let job = self
            .jobs()
            .get(handle)
            .filter(|e| e.owner.key == *tenant)
            .map(|e| e.job.clone())
            .ok_or_else(|| session_not_found(handle))?;
        job.touch();
        Ok(job)
    }

    /// Removes `tenant`'s session `handle`.
    pub fn remove(&self, handle: &str, tenant: &TenantKey) -> Result<Arc<Job>> {
        let mut jobs = self.jobs();
        match jobs.get(handle) {
            Some(e) if e.owner.key == *tenant => Ok(jobs.remove(handle).map(|e| e.job).unwrap()),
            _ => Err(session_not_found(handle)),
        }
    }

    /// Removes a session whoever owns it (the server's own reclaiming).
    pub fn remove_any(&self, handle: &str) -> Option<Arc<Job>> {
        self.jobs().remove(handle).map(|e| e.job)
    }

    pub fn all(&self) -> Vec<Arc<Job>> {
        self.all_owned().into_iter().map(|(_, job)| job).collect()
    }

    /// Every session with its owner, oldest first.
    pub fn all_owned(&self) -> Vec<(Arc<Tenant>, Arc<Job>)> {
        oldest_first(self.jobs().values(), |j| j.created)
    }

    /// `tenant`'s sessions.
    pub fn of_tenant(&self, tenant: &TenantKey) -> Vec<Arc<Job>> {
        self.all_owned()
            .into_iter()
            .filter(|(owner, _)| owner.key == *tenant)
            .map(|(_, job)| job)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.jobs().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn sessions_created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// Refuses new sessions from now on (shutdown has begun).
    pub fn refuse_new(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Refuses new sessions and hands back every open one, for shutdown.
    pub fn drain(&self) -> Vec<Arc<Job>> {
        self.refuse_new();
        self.jobs().drain().map(|(_, e)| e.job).collect()
    }
}

/// Open eager contexts (remote-eager jobs), keyed by owner and context id.
#[derive(Default)]
pub struct ContextTable {
    jobs: Mutex<HashMap<(TenantKey, u64), Owned<EagerJob>>>,
    closing: AtomicBool,
}

impl ContextTable {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<(TenantKey, u64), Owned<EagerJob>>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a context unless its id is taken or `open_elsewhere` (graph
    /// sessions) plus the contexts already open reach `max` ([`check_room`],
    /// under the table's lock).
    pub fn insert(
        &self,
        owner: Arc<Tenant>,
        job: Arc<EagerJob>,
        open_elsewhere: usize,
        max: usize,
    ) -> Result<()> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let mut jobs = self.jobs();
        let key = (owner.key.clone(), job.context_id);
        if jobs.contains_key(&key) {
            return Err(Error::InvalidArgument(format!(
                "EagerService:CreateContext failed: context id <{}> already exists",
                job.context_id
            )));
        }
        check_room(jobs.len() + open_elsewhere, max)?;
        jobs.insert(key, Owned { owner, job });
        Ok(())
    }

    pub fn contains(&self, tenant: &TenantKey, context_id: u64) -> bool {
        self.jobs().contains_key(&(tenant.clone(), context_id))
    }

    /// `tenant`'s context, marked as used now.
    pub fn get(&self, tenant: &TenantKey, context_id: u64) -> Result<Arc<EagerJob>> {
        let job = self.peek(tenant, context_id)?;
        job.touch();
        Ok(job)
    }

    /// [`get`](Self::get) without counting as the context's use (a question
    /// about its idleness must not reset it).
    pub fn peek(&self, tenant: &TenantKey, context_id: u64) -> Result<Arc<EagerJob>> {
        self.jobs()
            .get(&(tenant.clone(), context_id))
            .map(|e| e.job.clone())
            .ok_or_else(|| context_not_found(context_id))
    }

    /// Finds a context by job id (decimal), handle or name.
    pub fn find(&self, key: &str) -> Option<Arc<EagerJob>> {
        let id = key.parse::<u64>().ok();
        self.jobs()
            .values()
            .map(|e| &e.job)
            .find(|j| Some(j.id.0) == id || j.handle == key || j.name == key)
            .cloned()
    }

    pub fn remove(&self, tenant: &TenantKey, context_id: u64) -> Option<Arc<EagerJob>> {
        self.jobs()
            .remove(&(tenant.clone(), context_id))
            .map(|e| e.job)
    }

    /// Whether `job` is still in the table.
    pub fn holds(&self, job: &Arc<EagerJob>) -> bool {
        self.jobs().values().any(|e| Arc::ptr_eq(&e.job, job))
    }

    /// Removes `job` if it is still in the table.
    pub fn remove_job(&self, job: &Arc<EagerJob>) -> bool {
        let mut jobs = self.jobs();
        let before = jobs.len();
        jobs.retain(|_, e| !Arc::ptr_eq(&e.job, job));
        jobs.len() != before
    }

    pub fn all(&self) -> Vec<Arc<EagerJob>> {
        self.all_owned().into_iter().map(|(_, job)| job).collect()
    }

    /// Every context with its owner, oldest first.
    pub fn all_owned(&self) -> Vec<(Arc<Tenant>, Arc<EagerJob>)> {
        oldest_first(self.jobs().values(), |j| j.created)
    }

    pub fn len(&self) -> usize {
        self.jobs().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses new contexts from now on (shutdown has begun).
    pub fn refuse_new(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Refuses new contexts and hands back every open one, for shutdown.
    pub fn drain(&self) -> Vec<Arc<EagerJob>> {
        self.refuse_new();
        self.jobs().drain().map(|(_, e)| e.job).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_unique() {
        let table = SessionTable::new();
        let other = SessionTable::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            assert!(seen.insert(table.next_job().1));
            assert!(seen.insert(other.next_job().1));
        }
    }

    #[test]
    fn unknown_handles_are_not_found() {
        let table = SessionTable::new();
        let anyone = TenantKey::Anonymous;
        assert!(
            matches!(table.get("nope", &anyone), Err(Error::SessionNotFound(h)) if h == "nope")
        );
        assert!(matches!(
            table.remove("nope", &anyone),
            Err(Error::SessionNotFound(_))
        ));
    }
}
