//! This process's jobs as the admin API and an executor's report show them:
//! the [`JobSource`] of `--isolation none` and of a tenant's executor, and a
//! TensorFlow job's row (its own figures, read under TensorFlow's lock, with
//! the scheduler's and memory admission's columns from [`Rows`]).

use std::sync::atomic::Ordering;

use salus_proto::salus::v1::{ErrorCount, JobInfo};

use crate::runtime::eager_job::EagerJob;
use crate::runtime::graph_job::Job;
use crate::runtime::job_source::{
    owned_rows, ExecutorProcessCounts, Gathered, JobCounters, JobSource, Viewer,
};
use crate::runtime::node::Node;
use crate::runtime::report::{hints_to_proto, memory_fields, state_label, Rows};
use crate::runtime::state::ServerState;
use crate::seam::msg as seam_msg;
use crate::tenant::identity::TenantKey;

/// A TensorFlow job's row: [`Rows`] gives the node's columns, this the job's own.
pub trait JobRows {
    /// Everything known about one graph job. Walks its graph (under TF's
    /// lock), so callers run it off the runtime.
    fn graph(&self, job: &Job) -> JobInfo;
    /// An eager job's row: scheduler fields as for graph jobs; no graph, so
    /// `graph_nodes` counts its registered functions.
    fn eager(&self, job: &EagerJob) -> JobInfo;
}

impl JobRows for Rows<'_> {
    /// Everything known about one job. Walks its graph (under TF's lock), so
    /// callers run it off the runtime.
    fn graph(&self, job: &Job) -> JobInfo {
        let policy = self.0.sched.policy_name();
        let (status, standing) = self.0.sched.job_status_with_standing(job.id);
        let s = status.as_ref();
        let variables = job.variable_bytes();
        let estimate = job.memory_estimate(
            &s.map(|s| s.hints.clone())
                .unwrap_or_else(|| job.hints.clone()),
        );
        let memory = self.memory_state(job.id);
        let memory_state = memory.label.clone();
        JobInfo {
            id: job.id.0,
            handle: job.handle.clone(),
            name: job.name.clone(),
            state: state_label(memory.waiting, s, false).into(),
            hints: s.map(|s| hints_to_proto(&s.hints)),
            note: self.row_note(job.id, memory.note, policy, s, standing.as_ref()),
            graph_version: job.graph_version(),
            graph_nodes: job.graph_nodes() as u64,
            runs_completed: job.stats.runs_completed.load(Ordering::Relaxed),
            runs_failed: job.stats.runs_failed.load(Ordering::Relaxed),
            age_seconds: job.created.elapsed().as_secs_f64(),
            idle_seconds: job.idle_seconds(),
            kind: "graph".into(),
            ..self.scheduler_fields(
                job.id,
                s,
                policy,
                memory_fields(variables, &estimate, memory_state),
            )
        }
    }

    /// An eager job's row: scheduler fields as for graph jobs; no graph, so
    /// `graph_nodes` counts its registered functions.
    fn eager(&self, job: &EagerJob) -> JobInfo {
        let policy = self.0.sched.policy_name();
        let (status, standing) = self.0.sched.job_status_with_standing(job.id);
        let s = status.as_ref();
        let stats = job.stats();
        let variables = job.variable_bytes();
        let estimate =
            job.memory_estimate(&s.map_or_else(|| job.hints.clone(), |s| s.hints.clone()));
        let memory = self.memory_state(job.id);
        let memory_state = memory.label.clone();
        JobInfo {
            id: job.id.0,
            handle: job.handle.clone(),
            name: job.name.clone(),
            state: state_label(memory.waiting, s, job.is_busy()).into(),
            hints: Some(hints_to_proto(
                &s.map_or_else(|| job.hints.clone(), |s| s.hints.clone()),
            )),
            note: self.row_note(job.id, memory.note, policy, s, standing.as_ref()),
            graph_nodes: stats.functions.load(Ordering::Relaxed),
            runs_completed: stats.ops.load(Ordering::Relaxed),
            runs_failed: stats.failed.load(Ordering::Relaxed),
            age_seconds: job.created.elapsed().as_secs_f64(),
            idle_seconds: job.idle_for().as_secs_f64(),
            kind: "eager".into(),
            ..self.scheduler_fields(
                job.id,
                s,
                policy,
                memory_fields(variables, &estimate, memory_state),
            )
        }
    }
}

/// This process's own jobs.
impl JobSource for ServerState {
    fn gather(&self, node: &Node, rows_for: Option<&Viewer>) -> Gathered {
        let (sessions_reclaimed, eager_contexts_reclaimed) = self.reclaimed();
        let counters = JobCounters {
            isolation: "none",
            executors: ExecutorProcessCounts::default(),
            executor_list: Vec::new(),
            open_sessions: self.sessions.len() as u64,
            open_eager_contexts: self.contexts.len() as u64,
            sessions_created: self.sessions.sessions_created(),
            runs_completed: self.runs_completed(),
            heap_in_use_bytes: crate::heap_meter::heap_in_use(),
            sessions_reclaimed,
            eager_contexts_reclaimed,
            run_errors: crate::runtime::run_errors::snapshot()
                .into_iter()
                .map(|(code, count)| ErrorCount {
                    code: code.as_str_name().into(),
                    count,
                })
                .collect(),
        };
        let rows = match rows_for {
            Some(viewer) => {
                let mut rows =
                    owned_rows(self.sessions.all_owned(), viewer, |j| Rows(node).graph(j));
                rows.extend(owned_rows(self.contexts.all_owned(), viewer, |j| {
                    Rows(node).eager(j)
                }));
                rows
            }
            None => Vec::new(),
        };
        Gathered { counters, rows }
    }

    /// Every request is identified anew here: the tenant's next one is
    /// refused, and there is nothing to end.
    fn stop_tenant(&self, _: &TenantKey, _: &str) {}
}

impl ServerState {
    /// This process's jobs and counters, as an executor reports them to its
    /// supervisor (rows without owners: the supervisor knows whose they are).
    pub fn executor_report(&self) -> seam_msg::Report {
        let Gathered { counters, mut rows } = self.gather(&self.node, Some(&Viewer::Admin));
        rows.sort_by_key(|j| j.id);
        seam_msg::Report {
            id: 0,
            jobs: rows
                .into_iter()
                .map(crate::seam::rows::row_to_msg)
                .collect(),
            open_sessions: counters.open_sessions,
            open_eager_contexts: counters.open_eager_contexts,
            sessions_created: counters.sessions_created,
            runs_completed: counters.runs_completed,
            heap_in_use_bytes: counters.heap_in_use_bytes,
            sessions_reclaimed: counters.sessions_reclaimed,
            eager_contexts_reclaimed: counters.eager_contexts_reclaimed,
            run_errors: counters
                .run_errors
                .into_iter()
                .map(|e| seam_msg::RunErrors {
                    code: e.code,
                    count: e.count,
                })
                .collect(),
        }
    }
}
