//! Opening a job: the one sequence TF1 sessions (`CreateSession`) and TF2
//! eager contexts (`CreateContext`) share.
//!
//! [`ServerState::begin_job`] checks the server's `--max-sessions`, takes a job
//! id and opens the job for its owner (refused beyond the tenant's max-jobs
//! before anything is built; in an executor process the supervisor decides),
//! and picks the GPU lane a new graph goes to. The front end then builds its
//! job, and [`JobOpening::open`] adds it to the scheduler (with memory lanes it
//! joins at its admission instead), then puts it in its table. Until then,
//! dropping the opening takes the job back out of the scheduler, so no failure
//! on the way leaves a half-open job behind.
//!
//! The order, scheduler first and table last, is the safe one: a job in a
//! table is visible (to its client's next call, the admin API, the reclaimer
//! of idle jobs), and one the scheduler refused would be closed there through
//! the scheduler that never had it. Out of the tables, nothing but the opening
//! knows the job, and undoing it is taking it out of the scheduler.

use std::sync::Arc;

use crate::error::Result;
use crate::runtime::exec;
use crate::runtime::jobs::check_room;
use crate::runtime::sched_port::SchedPort;
use crate::runtime::state::ServerState;
use crate::runtime::timeline::JobKind;
use crate::sched::{Hints, JobId, LaneId};
use crate::tenant::identity::Tenant;

/// A job between its id and its first turn; see the module's text.
#[must_use = "dropping a JobOpening takes its job back out of the scheduler"]
pub struct JobOpening {
    sched: SchedPort,
    id: JobId,
    /// The session handle of a graph job (eager jobs are known by their
    /// context id instead).
    pub handle: String,
    /// The GPU lane (virtual GPU) the job's graph goes to, with `--gpu-lanes`.
    pub gpu_lane: Option<LaneId>,
    /// Whether it joins the scheduler now (no memory lanes) or at admission.
    joins_now: bool,
    armed: bool,
}

impl ServerState {
    /// The first steps of opening a job of `kind` named `name` for `owner`.
    pub async fn begin_job(&self, kind: JobKind, owner: &Tenant, name: &str) -> Result<JobOpening> {
        check_room(self.open_jobs(), self.max_sessions)?;
        let (id, handle) = self.sessions.next_job();
        self.sched.open_job(id, name, kind, Some(owner)).await?;
        // From here on a failure must take the job back out: the guard does.
        Ok(JobOpening {
            sched: self.sched.clone(),
            id,
            handle,
            gpu_lane: self.admission.as_ref().and_then(|a| a.lane_for_new_graph()),
            joins_now: self.admission.is_none(),
            armed: true,
        })
    }
}

impl JobOpening {
    pub fn id(&self) -> JobId {
        self.id
    }

    /// Adds the job to the scheduler on lane 0, unless memory lanes add it
    /// when they admit it.
    pub fn join_scheduler(&self, hints: Hints) -> Result<()> {
        if self.joins_now {
            self.sched.add_job(self.id, LaneId(0), hints)?;
        }
        Ok(())
    }

    /// The job is open: from now on its table entry's close ends it.
    pub fn keep(mut self) {
        self.armed = false;
    }

    /// Opens the built `job`: joins the scheduler, then puts the job in its
    /// table with `insert` (which repeats the `--max-sessions` check under the
    /// table's lock); see the module's text for why in this order. On a
    /// failure the job is taken back out of the scheduler and dropped off the
    /// async runtime (its last reference closes its TensorFlow session or
    /// context).
    pub async fn open<J: Send + Sync + 'static>(
        self,
        job: Arc<J>,
        hints: Hints,
        insert: impl FnOnce(Arc<J>) -> Result<()>,
    ) -> Result<()> {
        match self.join_scheduler(hints).and_then(|()| insert(job.clone())) {
            Ok(()) => {
                self.keep();
                Ok(())
            }
            Err(err) => {
                drop(self);
                let _ = exec::drop_off_runtime(job).await;
                Err(err)
            }
        }
    }
}

impl Drop for JobOpening {
    fn drop(&mut self) {
        if self.armed {
            self.sched.remove_job(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_opening_dropped_on_the_way_takes_its_job_back_out() {
        let state = ServerState::for_tests(8);
        let owner = Tenant::from_uid(0);
        let opening = state.begin_job(JobKind::Graph, &owner, "a").await.unwrap();
        let id = opening.id();
        opening.join_scheduler(Hints::default()).unwrap();
        assert!(state.sched.job_status(id).is_some());
        drop(opening); // as a failed insert or build returns early
        assert!(state.sched.job_status(id).is_none());

        let kept = state.begin_job(JobKind::Eager, &owner, "b").await.unwrap();
        let id = kept.id();
        kept.join_scheduler(Hints::default()).unwrap();
        kept.keep();
        assert!(state.sched.job_status(id).is_some());
        state.sched.remove_job(id);
    }

    #[tokio::test]
    async fn beyond_max_sessions_nothing_is_opened() {
        let state = ServerState::for_tests(0);
        let err = state
            .begin_job(JobKind::Graph, &Tenant::from_uid(0), "a")
            .await
            .err()
            .expect("refused");
        assert!(err.to_string().contains("--max-sessions"), "{err}");
    }
}
