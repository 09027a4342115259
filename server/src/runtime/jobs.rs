//! The tables of open jobs: graph sessions keyed by handle, eager contexts
//! keyed by the client's context id. Both share one id space and one limit.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::runtime::eager_job::EagerJob;
use crate::runtime::graph_job::Job;
use crate::sched::JobId;

/// Open jobs. The std mutex is never held across an `.await` or a TF call:
/// lookups clone the `Arc<Job>` and release it at once.
#[derive(Default)]
pub struct SessionTable {
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    created: AtomicU64,
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

    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new job id and its unique session handle.
    pub fn next_job(&self) -> (JobId, String) {
        let n = self.created.fetch_add(1, Ordering::Relaxed);
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
        if let Some(job) = jobs.get(key) {
            return Ok(job.clone());
        }
        let id = key.parse::<u64>().ok();
        jobs.values()
            .find(|j| Some(j.id.0) == id || j.name == key)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("no job has id, handle or name {key:?}")))
    }

    /// Adds a job unless the table already holds `max` (checked under the
    /// table's lock, so concurrent creations cannot overshoot).
    pub fn insert(&self, job: Arc<Job>, max: usize) -> Result<()> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let mut jobs = self.jobs();
        if jobs.len() >= max {
            return Err(Error::ResourceExhausted(format!(
                "the server already holds its maximum of {max} sessions (--max-sessions); \
                 close sessions you no longer use"
            )));
        }
        jobs.insert(job.handle.clone(), job);
        Ok(())
    }

    pub fn get(&self, handle: &str) -> Result<Arc<Job>> {
        let job = self
            .jobs()
            .get(handle)
            .cloned()
            .ok_or_else(|| Error::SessionNotFound(handle.to_string()))?;
        job.touch();
        Ok(job)
    }

    pub fn remove(&self, handle: &str) -> Result<Arc<Job>> {
        self.jobs()
            .remove(handle)
            .ok_or_else(|| Error::SessionNotFound(handle.to_string()))
    }

    pub fn all(&self) -> Vec<Arc<Job>> {
        let mut jobs: Vec<_> = self.jobs().values().cloned().collect();
        jobs.sort_by_key(|j| j.created);
        jobs
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
        self.jobs().drain().map(|(_, job)| job).collect()
    }
}

/// Open eager contexts (remote-eager jobs), keyed by context id.
#[derive(Default)]
pub struct ContextTable {
    jobs: Mutex<HashMap<u64, Arc<EagerJob>>>,
    closing: AtomicBool,
}

impl ContextTable {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<EagerJob>>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a context unless its id is taken or `open_elsewhere` plus the
    /// contexts already open reach `max` (checked under the table's lock).
    pub fn insert(&self, job: Arc<EagerJob>, open_elsewhere: usize, max: usize) -> Result<()> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let mut jobs = self.jobs();
        if jobs.contains_key(&job.context_id) {
            return Err(Error::InvalidArgument(format!(
                "EagerService:CreateContext failed: context id <{}> already exists",
                job.context_id
            )));
        }
        if jobs.len() + open_elsewhere >= max {
            return Err(Error::ResourceExhausted(format!(
                "the server already holds its maximum of {max} sessions and eager contexts (--max-sessions)"
            )));
        }
        jobs.insert(job.context_id, job);
        Ok(())
    }

    pub fn contains(&self, context_id: u64) -> bool {
        self.jobs().contains_key(&context_id)
    }

    /// The context, marked as used now.
    pub fn get(&self, context_id: u64) -> Result<Arc<EagerJob>> {
        let job = self
            .jobs()
            .get(&context_id)
            .cloned()
            .ok_or(Error::ContextNotFound(context_id))?;
        job.touch();
        Ok(job)
    }

    /// Finds a context by job id (decimal), handle or name.
    pub fn find(&self, key: &str) -> Option<Arc<EagerJob>> {
        let id = key.parse::<u64>().ok();
        self.jobs()
            .values()
            .find(|j| Some(j.id.0) == id || j.handle == key || j.name == key)
            .cloned()
    }

    pub fn remove(&self, context_id: u64) -> Option<Arc<EagerJob>> {
        self.jobs().remove(&context_id)
    }

    /// Removes `job` if it is still the table's entry for its id.
    pub fn remove_job(&self, job: &Arc<EagerJob>) -> bool {
        let mut jobs = self.jobs();
        if jobs
            .get(&job.context_id)
            .is_some_and(|j| Arc::ptr_eq(j, job))
        {
            jobs.remove(&job.context_id);
            true
        } else {
            false
        }
    }

    pub fn all(&self) -> Vec<Arc<EagerJob>> {
        let mut jobs: Vec<_> = self.jobs().values().cloned().collect();
        jobs.sort_by_key(|j| j.created);
        jobs
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
        self.jobs().drain().map(|(_, job)| job).collect()
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
        assert!(matches!(table.get("nope"), Err(Error::SessionNotFound(h)) if h == "nope"));
        assert!(matches!(
            table.remove("nope"),
            Err(Error::SessionNotFound(_))
        ));
    }
}
