//! Where the admin API's jobs and job counters come from: this process's
//! tables (`--isolation none`, and an executor's report to its supervisor),
//! or the tenants' executor processes (the supervisor, which holds no job).
//! The admin service depends on this trait, not on either.

use std::sync::Arc;

use salus_proto::salus::v1::{ErrorCount, JobInfo};

use crate::runtime::node::Node;
use crate::seam::msg as seam_msg;
use crate::tenant::identity::{Tenant, TenantKey};

pub trait JobSource: Send + Sync {
    /// One look at the jobs: their counters and, with `rows_for`, the rows of
    /// the jobs that viewer sees, each with its owner. Blocks (it walks
    /// graphs, or waits for the executors' reports): call it off the async
    /// runtime.
    fn gather(&self, node: &Node, rows_for: Option<&Viewer>) -> Gathered;
    /// Ends `tenant`'s open connections and jobs, which it may no longer have
    /// (`why`: its token was revoked or expired).
    fn stop_tenant(&self, tenant: &TenantKey, why: &str);
}

/// Whose jobs a caller of the admin API sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Viewer {
    Admin,
    Tenant(TenantKey),
}

impl Viewer {
    pub fn sees(&self, owner: &TenantKey) -> bool {
        match self {
            Viewer::Admin => true,
            Viewer::Tenant(key) => key == owner,
        }
    }

    /// "no job has ..." / "no job of yours has ...".
    pub fn whose(&self) -> &'static str {
        match self {
            Viewer::Admin => "no job",
            Viewer::Tenant(_) => "no job of yours",
        }
    }
}

/// What [`JobSource::gather`] saw.
#[derive(Debug, Default)]
pub struct Gathered {
    pub counters: JobCounters,
    /// Unordered.
    pub rows: Vec<JobInfo>,
}

/// The server-wide job counters of `GetServerInfo`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobCounters {
    /// "none" (jobs run in this process) or "tenant" (in executors).
    pub isolation: &'static str,
    /// Executor processes (all zero under `--isolation none`).
    pub executors: ExecutorProcessCounts,
    /// The executors running now (none under `--isolation none`).
    pub executor_list: Vec<salus_proto::salus::v1::ExecutorProcess>,
    pub open_sessions: u64,
    pub open_eager_contexts: u64,
    pub sessions_created: u64,
    pub runs_completed: u64,
    pub heap_in_use_bytes: u64,
    pub sessions_reclaimed: u64,
    pub eager_contexts_reclaimed: u64,
    pub run_errors: Vec<ErrorCount>,
}

impl JobCounters {
    /// An executor's report's counters added in.
    pub fn add_report(&mut self, report: &seam_msg::Report) {
        self.open_sessions += report.open_sessions;
        self.open_eager_contexts += report.open_eager_contexts;
        self.sessions_created += report.sessions_created;
        self.runs_completed += report.runs_completed;
        self.heap_in_use_bytes += report.heap_in_use_bytes;
        self.sessions_reclaimed += report.sessions_reclaimed;
        self.eager_contexts_reclaimed += report.eager_contexts_reclaimed;
        for count in &report.run_errors {
            match self.run_errors.iter_mut().find(|c| c.code == count.code) {
                Some(c) => c.count += count.count,
                None => self.run_errors.push(ErrorCount {
                    code: count.code.clone(),
                    count: count.count,
                }),
            }
        }
    }
}

/// Executors running now, started and failed since the server started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutorProcessCounts {
    pub running: u64,
    pub started: u64,
    pub failed: u64,
}

/// `row` with its owner: the display label and, apart, the bare name and uid
/// (clients that show tenants as data must not parse the label).
pub fn owned_by(owner: &Tenant, row: JobInfo) -> JobInfo {
    JobInfo {
        tenant: owner.to_string(),
        tenant_name: owner.name.clone(),
        tenant_uid: owner.uid,
        ..row
    }
}

/// The rows of the jobs `viewer` sees, each with its owner.
pub fn owned_rows<J>(
    owned: Vec<(Arc<Tenant>, Arc<J>)>,
    viewer: &Viewer,
    info: impl Fn(&J) -> JobInfo,
) -> Vec<JobInfo> {
    owned
        .into_iter()
        .filter(|(owner, _)| viewer.sees(&owner.key))
        .map(|(owner, job)| owned_by(&owner, info(&job)))
        .collect()
}
