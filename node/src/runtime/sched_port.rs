//! How a process's jobs reach the one scheduler core: in memory, when this
//! process schedules (`--isolation none`), or over the seam, from a tenant's
//! executor process to its supervisor (`--isolation tenant`). The front ends
//! and the job runtime open, join, resolve, take turns and leave through
//! this port only, the same calls in both modes; the core's own figures
//! (stats, tenants, history, policy) are the scheduling process's
//! ([`SchedPort::core`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::runtime::executor::{Executor, LocalWant, MainTurn};
use crate::runtime::run_class::RunClass;
use crate::runtime::tenant_ids::Clamp;
use crate::runtime::timeline::JobKind;
use crate::sched::standing::Standing;
use crate::sched::{Hints, JobId, JobStatus, LaneId, RunEnd};
use crate::seam::client::{SeamClient, WantedTurn};
use crate::seam::{hints_to_msg, msg as seam_msg};
use crate::tenant::identity::Tenant;

/// Cheap to clone.
#[derive(Clone)]
pub enum SchedPort {
    /// The core is in this process.
    Local(Executor),
    /// The core is the supervisor's; every call is a seam message.
    Seam(Arc<SeamClient>),
}

impl SchedPort {
    /// The scheduler core, where this process schedules.
    pub fn core(&self) -> Option<&Executor> {
        match self {
            SchedPort::Local(core) => Some(core),
            SchedPort::Seam(_) => None,
        }
    }

    /// The seam, in an executor process.
    pub fn seam(&self) -> Option<&Arc<SeamClient>> {
        match self {
            SchedPort::Local(_) => None,
            SchedPort::Seam(seam) => Some(seam),
        }
    }

    /// A job opens (call this first): its owner, whose share it runs in once
    /// it joins, and its label on the timeline. Refused when the owner has its
    /// maximum of jobs open; over the seam the supervisor decides, for the
    /// executor's tenant.
    pub async fn open_job(
        &self,
        job: JobId,
        name: &str,
        kind: JobKind,
        owner: Option<&Tenant>,
    ) -> Result<()> {
        match self {
            SchedPort::Local(core) => core.open_job(job, name, kind, owner),
            SchedPort::Seam(seam) => seam.open_job(job, name, kind == JobKind::Eager).await,
        }
    }

    /// The job joins the scheduler on `lane`.
    pub fn add_job(&self, id: JobId, lane: LaneId, hints: Hints) -> Result<()> {
        match self {
            SchedPort::Local(core) => core.add_job(id, lane, hints),
            SchedPort::Seam(seam) => {
                seam.send(seam_msg::to_supervisor::Msg::AddJob(seam_msg::AddJob {
                    job: id.0,
                    lane: lane.0,
                    hints: Some(hints_to_msg(&hints)),
                }));
                Ok(())
            }
        }
    }

    /// The job ended as `end` (see [`Executor::end_job`]).
    pub fn end_job(&self, id: JobId, end: RunEnd) {
        match self {
            SchedPort::Local(core) => core.end_job(id, end),
            SchedPort::Seam(seam) => seam.send(seam_msg::to_supervisor::Msg::RemoveJob(
                seam_msg::RemoveJob {
                    job: id.0,
                    end: end.name().into(),
                },
            )),
        }
    }

    /// The job leaves without running to its end (it could not open, or is cancelled).
    pub fn remove_job(&self, id: JobId) {
        self.end_job(id, RunEnd::Cancelled);
    }

    /// Queues a main iteration of `job` that the caller will run itself.
    fn want(&self, job: JobId, deadline: Option<Instant>) -> Result<Wanted> {
        Ok(match self {
            SchedPort::Local(core) => Wanted::Local(core.want(job, deadline)?),
            SchedPort::Seam(seam) => Wanted::Seam(seam.clone(), seam.want(job, deadline)?),
        })
    }

    /// Runs `f` as a main iteration of `job` when the scheduler picks it, on
    /// a blocking thread that waits for the go-ahead (from a lane thread of
    /// this process's core, or from the supervisor), runs `f`, and ends the
    /// turn: the same path in both modes. Dropped before the go-ahead (its
    /// client left), the iteration is given up unrun.
    pub async fn run_main<T, F>(&self, job: JobId, deadline: Option<Instant>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let wanted = self.want(job, deadline)?;
        let give_up = wanted.give_up_on_drop();
        let result = crate::runtime::exec::blocking(move || {
            let turn = wanted.take()?;
            let result = match catch_unwind(AssertUnwindSafe(f)) {
                Ok(result) => result,
                Err(_panic) => Err(Error::Internal("the iteration panicked".into())),
            };
            // The client that has the reply sees the iteration counted.
            turn.end_accounted();
            result
        })
        .await;
        give_up.disarm();
        result
    }

    /// Waits on the calling thread (blocking: call it off the async runtime)
    /// until the scheduler gives `job` a main iteration; the caller runs the
    /// iteration itself while it holds the returned turn, and dropping the
    /// turn ends it. The way an eager job's thread takes its turns.
    pub fn wait_turn(&self, job: JobId, deadline: Option<Instant>) -> Result<MainTurn> {
        self.want(job, deadline)?.take()
    }

    /// Whether a run goes at once (`Cheap`) or through the scheduler
    /// (`Main`): a [`RunClass::Brief`] run queues when another job's queued
    /// iteration ranks ahead of `job` (over the seam: as the supervisor last
    /// said).
    pub fn resolve(&self, job: JobId, class: RunClass) -> RunClass {
        match (self, class) {
            (SchedPort::Local(core), _) => core.resolve(job, class),
            (SchedPort::Seam(seam), RunClass::Brief) if seam.outranked(job) => RunClass::Main,
            (SchedPort::Seam(_), RunClass::Brief) => RunClass::Cheap,
            (SchedPort::Seam(_), other) => other,
        }
    }

    /// A run that bypassed the scheduler (see [`Executor::record_cheap_run`]).
    pub fn record_cheap_run(&self, job: JobId, started: Instant, ended: Instant) {
        match self {
            SchedPort::Local(core) => core.record_cheap_run(job, started, ended),
            SchedPort::Seam(seam) => {
                let now = Instant::now();
                seam.send(seam_msg::to_supervisor::Msg::CheapRun(seam_msg::CheapRun {
                    job: job.0,
                    started_ago_ns: now.saturating_duration_since(started).as_nanos() as u64,
                    ended_ago_ns: now.saturating_duration_since(ended).as_nanos() as u64,
                }));
            }
        }
    }

    /// The fingerprint of the job's main iteration (see [`Executor::set_fingerprint`]).
    pub fn set_fingerprint(&self, id: JobId, fingerprint: &str) {
        match self {
            SchedPort::Local(core) => core.set_fingerprint(id, fingerprint),
            SchedPort::Seam(seam) => seam.send(seam_msg::to_supervisor::Msg::SetFingerprint(
                seam_msg::SetFingerprint {
                    job: id.0,
                    fingerprint: fingerprint.into(),
                },
            )),
        }
    }

    /// The scheduler's view of a job, where this process schedules (over the
    /// seam none: the supervisor adds its view to the executor's rows).
    pub fn job_status(&self, id: JobId) -> Option<JobStatus> {
        self.core().and_then(|core| core.job_status(id))
    }

    /// [`Self::job_status`] and, if the job waits, where it stands on its lane,
    /// as of one moment: an admin row's state and its "waiting: ..." note.
    pub fn job_status_with_standing(&self, id: JobId) -> (Option<JobStatus>, Option<Standing>) {
        match self
            .core()
            .and_then(|core| core.job_status_with_standing(id))
        {
            Some((status, standing)) => (Some(status), standing),
            None => (None, None),
        }
    }

    /// The policy's name; empty over the seam.
    pub fn policy_name(&self) -> &'static str {
        self.core().map_or("", Executor::policy_name)
    }

    /// Cheap runs of an open job counted here (none over the seam).
    pub fn cheap_runs(&self, job: JobId) -> u64 {
        self.core().map_or(0, |core| core.cheap_runs(job))
    }

    /// A priority hint lowered to its tenant's limit, where this process schedules.
    pub fn priority_clamp(&self, job: JobId) -> Option<Clamp> {
        self.core().and_then(|core| core.priority_clamp(job))
    }
}

/// A main iteration queued, not started yet.
enum Wanted {
    Local(LocalWant),
    Seam(Arc<SeamClient>, WantedTurn),
}

impl Wanted {
    /// Waits (blocking) for the go-ahead.
    fn take(self) -> Result<MainTurn> {
        match self {
            Wanted::Local(want) => want.take(),
            Wanted::Seam(seam, wanted) => seam.take_turn(wanted).map(MainTurn::Remote),
        }
    }

    fn give_up_on_drop(&self) -> GiveUp {
        GiveUp(Some(match self {
            Wanted::Local(want) => GiveUpHow::Local(want.give_up_flag()),
            Wanted::Seam(seam, wanted) => GiveUpHow::Seam(seam.clone(), wanted.turn),
        }))
    }
}

/// Gives a wanted iteration up when dropped (the future that wanted it was
/// dropped: its client left), unless disarmed: queued here, the lane thread
/// drops it unrun; over the seam, the supervisor does.
struct GiveUp(Option<GiveUpHow>);

enum GiveUpHow {
    Local(Arc<AtomicBool>),
    Seam(Arc<SeamClient>, u64),
}

impl GiveUp {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GiveUp {
    fn drop(&mut self) {
        match self.0.take() {
            Some(GiveUpHow::Local(gone)) => gone.store(true, Ordering::SeqCst),
            Some(GiveUpHow::Seam(seam, turn)) => seam.cancel(turn),
            None => {}
        }
    }
}
