//! State shared by the gRPC services of one server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::runtime::admission::Admission;
use crate::runtime::eager_job::EagerJob;
use crate::runtime::exec;
use crate::runtime::executor::Executor;
use crate::runtime::graph_job::JobSettings;
use crate::runtime::jobs::{ContextTable, SessionTable};
use crate::runtime::session_config::SessionDefaults;
use crate::tenant::TenantRules;
use crate::tf::DeviceInfo;

pub struct ServerState {
    pub sessions: SessionTable,
    /// Remote-eager jobs (TF2 clients).
    pub contexts: ContextTable,
    pub executor: Executor,
    /// Memory admission, when a capacity is configured.
    pub admission: Option<Admission>,
    pub settings: JobSettings,
    pub session_defaults: SessionDefaults,
    pub tenant: Arc<TenantRules>,
    pub max_sessions: usize,
    /// The server's devices, listed once at start-up.
    pub devices: Vec<DeviceInfo>,
    pub tensorflow_version: String,
    pub started: Instant,
    runs_completed: AtomicU64,
}

impl ServerState {
    pub fn new(
        executor: Executor,
        admission: Option<Admission>,
        settings: JobSettings,
        session_defaults: SessionDefaults,
        tenant: Arc<TenantRules>,
        max_sessions: usize,
        devices: Vec<DeviceInfo>,
        tensorflow_version: String,
    ) -> Self {
        ServerState {
            sessions: SessionTable::new(),
            contexts: ContextTable::default(),
            executor,
            admission,
            settings,
            session_defaults,
            tenant,
            max_sessions,
            devices,
            tensorflow_version,
            started: Instant::now(),
            runs_completed: AtomicU64::new(0),
        }
    }

    /// Graph sessions and eager contexts open now (`--max-sessions` counts both).
    pub fn open_jobs(&self) -> usize {
        self.sessions.len() + self.contexts.len()
    }

    /// Ends an eager job: out of the table and the scheduler, then its TFE
    /// context closed off the async runtime (that waits for a running request).
    pub async fn close_context(&self, job: Arc<EagerJob>, reason: &str) {
        self.contexts.remove_job(&job);
        self.executor.remove_job(job.id);
        if let Some(admission) = &self.admission {
            admission.withdraw(job.id);
        }
        tracing::info!(context = job.context_id, job = job.id.0, name = %job.name, reason, "closing eager context");
        let reason = reason.to_string();
        let _ = exec::blocking(move || {
            job.close(&reason);
            Ok(())
        })
        .await;
    }

    pub fn count_run(&self) {
        self.runs_completed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn runs_completed(&self) -> u64 {
        self.runs_completed.load(Ordering::Relaxed)
    }
}
