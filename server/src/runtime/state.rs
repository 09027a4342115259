//! State shared by the gRPC services of one server.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::runtime::eager_job::EagerJob;
use crate::runtime::exec;
use crate::error::Result;
use crate::runtime::graph_job::{Job, JobSettings};
use crate::runtime::jobs::{ContextTable, SessionTable};
use crate::runtime::main_iteration::Iterations;
use crate::runtime::node::Node;
use crate::runtime::session_config::SessionDefaults;
use crate::sched::RunEnd;
use crate::tenant::identity::Tenant;
use crate::tenant::TenantRules;

/// A process that runs jobs: its tables of jobs over the node (scheduler,
/// admission, devices), whose fields it derefs to.
pub struct ServerState {
    pub node: Arc<Node>,
    pub sessions: SessionTable,
    /// Remote-eager jobs (TF2 clients).
    pub contexts: ContextTable,
    pub settings: JobSettings,
    pub session_defaults: SessionDefaults,
    pub tenant: Arc<TenantRules>,
    /// The same rules unconfined, for tenants whose user is this process's.
    own_user_rules: Arc<TenantRules>,
    pub max_sessions: usize,
    /// Set at shutdown: eager jobs start no new function calls, so their
    /// clients can still fetch the results of calls in flight.
    pub draining: Arc<AtomicBool>,
    /// The one main iteration both front ends' runs take (the node's
    /// scheduler and admission, and `draining`).
    pub iterations: Iterations,
    runs_completed: AtomicU64,
    /// Jobs the server closed because their client vanished (idle or its
    /// streams ended), by kind.
    reclaimed_sessions: AtomicU64,
    reclaimed_contexts: AtomicU64,
}

impl std::ops::Deref for ServerState {
    type Target = Node;

    fn deref(&self) -> &Node {
        &self.node
    }
}

impl ServerState {
    pub fn new(
        node: Arc<Node>,
        settings: JobSettings,
        session_defaults: SessionDefaults,
        tenant: Arc<TenantRules>,
        max_sessions: usize,
    ) -> Self {
        let draining = Arc::new(AtomicBool::new(false));
        let iterations = Iterations {
            port: node.sched.clone(),
            admission: node.admission.clone(),
            draining: draining.clone(),
        };
        ServerState {
            node,
            sessions: SessionTable::new(),
            contexts: ContextTable::default(),
            settings,
            session_defaults,
            own_user_rules: Arc::new(tenant.for_own_user()),
            tenant,
            max_sessions,
            draining,
            iterations,
            runs_completed: AtomicU64::new(0),
            reclaimed_sessions: AtomicU64::new(0),
            reclaimed_contexts: AtomicU64::new(0),
        }
    }

    /// A server state with no jobs and no TensorFlow devices, scheduling
    /// with `fair` in this process (unit tests).
    #[cfg(test)]
    pub fn for_tests(max_sessions: usize) -> Arc<ServerState> {
        use crate::runtime::executor::Executor;
        use crate::sched::{policy, SchedConfig};
        let executor = Executor::new(policy::by_name("fair").unwrap(), SchedConfig::default());
        let settings = JobSettings {
            max_tensor_bytes: 1 << 20,
            inline_below: std::time::Duration::ZERO,
            cheap_below: std::time::Duration::ZERO,
            measure_memory: false,
        };
        Arc::new(ServerState::new(
            Arc::new(Node::new(
                crate::runtime::sched_port::SchedPort::Local(executor),
                None,
                Vec::new(),
                "2.21.0".into(),
            )),
            settings,
            Default::default(),
            Default::default(),
            max_sessions,
        ))
    }

    /// The rules `tenant`'s jobs are held to here: unconfined when its
    /// computation runs with its own permissions (its Unix user is this
    /// process's effective user), else the deny list and checkpoint confinement.
    pub fn rules_for(&self, tenant: &Tenant) -> Arc<TenantRules> {
        // SAFETY: geteuid cannot fail.
        if tenant.uid == Some(unsafe { libc::geteuid() }) {
            self.own_user_rules.clone()
        } else {
            self.tenant.clone()
        }
    }

    /// Shutdown has begun: no new jobs, no new eager function calls. Waits
    /// (up to `limit`) until every eager context is quiet: nothing queued or
    /// running, no result waiting for its pull, no request for a moment.
    pub async fn drain_contexts(&self, limit: std::time::Duration) {
        // A TF2 client fetches a finished call's outputs with follow-up calls
        // (_Send, RecvTensor); on a loaded machine they came more than 200 ms,
        // and once more than 1 s, later (a pull refused after SIGTERM in CI),
        // so a job counts as quiet only after 3 s without calls.
        const QUIET: std::time::Duration = std::time::Duration::from_secs(3);
        self.draining.store(true, Ordering::SeqCst);
        self.sessions.refuse_new();
        self.contexts.refuse_new();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let quiet = self
                .contexts
                .all()
                .iter()
                .all(|j| !j.is_busy() && j.pending_sends() == 0 && j.idle_for() >= QUIET);
            if quiet {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        tracing::warn!("eager contexts still active at the end of the grace period");
    }

    /// Graph sessions and eager contexts open now (`--max-sessions` counts both).
    pub fn open_jobs(&self) -> usize {
        self.sessions.len() + self.contexts.len()
    }

    /// Puts an opened graph session in its table, within `--max-sessions`
    /// (eager contexts count too).
    pub fn insert_session(&self, owner: Arc<Tenant>, job: Arc<Job>) -> Result<()> {
        self.sessions
            .insert(owner, job, self.contexts.len(), self.max_sessions)
    }

    /// Puts an opened eager context in its table, within `--max-sessions`
    /// (graph sessions count too).
    pub fn insert_context(&self, owner: Arc<Tenant>, job: Arc<EagerJob>) -> Result<()> {
        self.contexts
            .insert(owner, job, self.sessions.len(), self.max_sessions)
    }

    /// Ends an eager job: out of the table and the scheduler, then its TFE
    /// context closed off the async runtime (that waits for a running request).
    /// `end`: how its run ended, for the job history.
    pub async fn close_context(&self, job: Arc<EagerJob>, reason: &str, end: RunEnd) {
        self.contexts.remove_job(&job);
        self.sched.end_job(job.id, end);
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

    /// A graph session (`eager: false`) or eager context was reclaimed.
    pub fn count_reclaimed(&self, eager: bool) {
        let counter = if eager {
            &self.reclaimed_contexts
        } else {
            &self.reclaimed_sessions
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// (graph sessions, eager contexts) reclaimed so far.
    pub fn reclaimed(&self) -> (u64, u64) {
        (
            self.reclaimed_sessions.load(Ordering::Relaxed),
            self.reclaimed_contexts.load(Ordering::Relaxed),
        )
    }
}
