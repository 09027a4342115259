//! The lane threads and the work they run: a queued main iteration ([`Work`]),
//! the local hold of a lane while a job's own thread runs its iteration
//! ([`LocalWant`], [`LocalTurn`]), an executor process's iteration
//! ([`RemoteIteration`]), and the loop each lane thread runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::runtime::run_class::RunClass;
use crate::sched::{Decision, JobId, LaneId, Nanos, SchedError};

use super::{sched_error, Executor, Inner, Shared};

/// A queued main iteration.
pub struct Work {
    deadline: Option<Instant>,
    task: Box<dyn Task>,
}

impl Work {
    fn abandoned(&self, now: Instant) -> bool {
        self.task.client_gone() || self.deadline.is_some_and(|d| now >= d)
    }
}

pub(super) trait Task: Send {
    fn client_gone(&self) -> bool;
    /// Runs the iteration; the returned closure delivers its outcome. The
    /// executor accounts the iteration before delivering, so a client that has
    /// its reply also sees the iteration in the statistics.
    fn run(self: Box<Self>) -> Box<dyn FnOnce() + Send>;
}

/// A main iteration that another thread of this process runs
/// ([`Executor::want`]): the lane thread gives the go-ahead, holds the lane
/// until the runner's turn ends, and then accounts the iteration.
pub(super) struct HoldLane {
    /// The go-ahead, with when it was given.
    go: mpsc::SyncSender<Instant>,
    /// Disconnected when the runner's turn drops.
    done: mpsc::Receiver<()>,
    /// Dropped once the iteration is accounted.
    accounted: mpsc::SyncSender<()>,
    /// The runner gave up before its go-ahead.
    gone: Arc<AtomicBool>,
}

impl Task for HoldLane {
    fn client_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }
    fn run(self: Box<Self>) -> Box<dyn FnOnce() + Send> {
        let HoldLane {
            go,
            done,
            accounted,
            ..
        } = *self;
        if go.send(Instant::now()).is_ok() {
            let _ = done.recv();
        }
        Box::new(move || drop(accounted))
    }
}

/// A main iteration queued with this process's core ([`Executor::want`]),
/// not started yet. Dropped, or given up, before its go-ahead, it is dropped
/// from the queue unrun.
pub struct LocalWant {
    core: Executor,
    go: mpsc::Receiver<Instant>,
    done: mpsc::SyncSender<()>,
    accounted: mpsc::Receiver<()>,
    gone: Arc<AtomicBool>,
}

impl LocalWant {
    /// Waits on the calling thread (blocking) for the go-ahead.
    pub fn take(self) -> Result<MainTurn> {
        match self.go.recv() {
            Ok(given) => {
                // The wake of the thread that runs it: what a switch costs
                // beyond the core's decision, as over the seam.
                self.core.record_handover(given.elapsed().as_nanos() as u64);
                Ok(MainTurn::Local(LocalTurn {
                    done: self.done,
                    accounted: self.accounted,
                }))
            }
            // Dropped before it ran (its job left, its deadline passed, the
            // executor stops, or its runner gave up).
            Err(_) => Err(dropped_before_it_ran()),
        }
    }

    /// What gives the iteration up from another thread, if it has not started.
    pub fn give_up_flag(&self) -> Arc<AtomicBool> {
        self.gone.clone()
    }
}

/// A main iteration of this process's core in progress: the lane thread
/// holds the lane until this drops.
pub struct LocalTurn {
    /// Disconnects when dropped: the lane thread's signal.
    done: mpsc::SyncSender<()>,
    accounted: mpsc::Receiver<()>,
}

impl LocalTurn {
    /// Ends the iteration and returns once the core has accounted it, so
    /// that a reply sent next is seen in the statistics (as a graph job's
    /// client expects); dropping the turn ends it without waiting.
    pub fn end_accounted(self) {
        let LocalTurn { done, accounted } = self;
        drop(done);
        let _ = accounted.recv();
    }
}

/// A main iteration another process runs (a tenant's executor, through the
/// seam): the lane thread calls `run` when the scheduler picks it, and `run`
/// returns once the iteration ended there. Dropped without running when its
/// requester is gone, its deadline passed or its job left.
pub trait RemoteIteration: Send {
    fn requester_gone(&self) -> bool;
    fn run(self: Box<Self>);
}

pub(super) struct Remote(Box<dyn RemoteIteration>);

impl Task for Remote {
    fn client_gone(&self) -> bool {
        self.0.requester_gone()
    }
    fn run(self: Box<Self>) -> Box<dyn FnOnce() + Send> {
        self.0.run();
        Box::new(|| {})
    }
}

/// A main iteration taken (`SchedPort::wait_turn`), in progress until dropped
/// or ended with [`MainTurn::end_accounted`].
pub enum MainTurn {
    /// A lane thread of this process's core holds the lane meanwhile.
    Local(LocalTurn),
    /// The supervisor's go-ahead; dropping it reports the iteration done.
    Remote(crate::seam::client::Turn),
}

impl MainTurn {
    /// Ends the iteration once the scheduler has accounted it where that is
    /// this process (over the seam the supervisor accounts it on its own).
    pub fn end_accounted(self) {
        match self {
            MainTurn::Local(turn) => turn.end_accounted(),
            MainTurn::Remote(turn) => drop(turn),
        }
    }
}

fn dropped_before_it_ran() -> Error {
    Error::IterationDropped(
        "the iteration was dropped before it ran: its session closed, its deadline passed, or the server is stopping"
            .into(),
    )
}

pub(super) fn set_running(inner: &mut Inner, lane: LaneId, delta: isize) {
    match inner.running.iter_mut().find(|(l, _)| *l == lane) {
        Some((_, n)) => *n = n.saturating_add_signed(delta),
        None => inner.running.push((lane, delta.max(0) as usize)),
    }
}

/// One executor thread of `lane`.
///
/// After an iteration ends, the thread accounts it and picks the next one in
/// one critical section, then delivers the finished reply and starts the next
/// iteration: a switch is one decision on a thread that is already awake.
pub(super) fn lane_loop(shared: &Shared, lane: LaneId) {
    // The iteration this thread just finished: (job, end); cleared whenever
    // the thread waits, so only direct switches are measured.
    let mut just_finished: Option<(JobId, Nanos)> = None;
    let mut deliver: Option<Box<dyn FnOnce() + Send>> = None;
    let mut inner = shared.lock();
    loop {
        let now_instant = Instant::now();
        let dropped = inner.sched.drain_queued(|w| !w.abandoned(now_instant));
        inner.dropped += dropped.len() as u64;
        if inner.stopping && inner.sched.queued() == 0 {
            drop(inner);
            if let Some(deliver) = deliver.take() {
                deliver();
            }
            return;
        }
        let now = shared.now();
        match inner.sched.next(lane, now) {
            Decision::Run(dispatch) => {
                set_running(&mut inner, lane, 1);
                drop(inner);
                // Dropping a Work drops its reply sender: the handler sees the drop.
                drop(dropped);
                if let Some(deliver) = deliver.take() {
                    deliver();
                }
                let started = Instant::now();
                if let Some((prev, end)) = just_finished.take() {
                    // A switch: another job's iteration was waiting when the last one ended.
                    if prev != dispatch.job && dispatch.submitted <= end {
                        let latency = shared.now().saturating_sub(end);
                        shared.lock().switch_latency.record(latency);
                    }
                }
                let reply = dispatch.work.task.run();
                let ended = Instant::now();
                let device_time = ended.duration_since(started).as_nanos() as Nanos;
                // Before the reply goes out, so a client that has it finds its iteration.
                shared
                    .timeline
                    .record(dispatch.job, Some(lane), started, ended, RunClass::Main);
                inner = shared.lock();
                let end = shared.now();
                set_running(&mut inner, lane, -1);
                let waited = now.saturating_sub(dispatch.submitted);
                inner.account_iteration(dispatch.job, lane, waited, device_time, end);
                just_finished = Some((dispatch.job, end));
                deliver = Some(reply);
                // Another lane thread may be waiting on this job's slot or anticipation.
                shared.wake.notify_all();
            }
            decision => {
                // Nothing to start now: deliver the finished reply before waiting.
                if deliver.is_some() || !dropped.is_empty() {
                    drop(inner);
                    drop(dropped);
                    if let Some(deliver) = deliver.take() {
                        deliver();
                    }
                    inner = shared.lock();
                    // The delivered client may have queued its next iteration.
                    continue;
                }
                just_finished = None;
                if !inner.sched.has_lane(lane) {
                    // The lane closed (its last job left): its threads end, and a
                    // later job on the same lane id starts new ones.
                    inner.lanes_with_threads.remove(&lane);
                    return;
                }
                let wait = match decision {
                    Decision::WaitUntil(at) => {
                        Duration::from_nanos(at.saturating_sub(now).max(1_000))
                    }
                    // Also wake periodically to drop queued iterations whose client left.
                    _ => Duration::from_millis(100),
                };
                inner = shared
                    .wake
                    .wait_timeout(inner, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

impl Executor {
    /// Starts `lane`'s threads unless it has them.
    pub(super) fn start_lane_threads(&self, inner: &mut Inner, lane: LaneId) -> Result<()> {
        if inner.lanes_with_threads.insert(lane) {
            for n in 0..self.shared.lane_concurrency {
                let shared = self.shared.clone();
                std::thread::Builder::new()
                    .name(format!("salus-lane{}-{n}", lane.0))
                    .spawn(move || lane_loop(&shared, lane))
                    .map_err(|e| {
                        Error::Internal(format!("cannot start an executor thread: {e}"))
                    })?;
            }
        }
        Ok(())
    }

    /// Queues a main iteration of `job` that the caller's thread will run:
    /// [`LocalWant::take`] waits for the scheduler's go-ahead, and a lane
    /// thread holds the lane while the caller runs it (so the iteration's time
    /// is the job's).
    pub fn want(&self, job: JobId, deadline: Option<Instant>) -> Result<LocalWant> {
        let (go_tx, go_rx) = mpsc::sync_channel(1);
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let (accounted_tx, accounted_rx) = mpsc::sync_channel(1);
        let gone = Arc::new(AtomicBool::new(false));
        let task = HoldLane {
            go: go_tx,
            done: done_rx,
            accounted: accounted_tx,
            gone: gone.clone(),
        };
        self.submit(
            job,
            Work {
                deadline,
                task: Box::new(task),
            },
        )?;
        Ok(LocalWant {
            core: self.clone(),
            go: go_rx,
            done: done_tx,
            accounted: accounted_rx,
            gone,
        })
    }

    /// Queues `work` for `job`; an unknown job or a stopping executor refuses it.
    pub(super) fn submit(&self, job: JobId, work: Work) -> Result<()> {
        {
            let now = self.shared.now();
            let mut inner = self.shared.lock();
            if inner.stopping {
                return Err(Error::ShuttingDown);
            }
            inner
                .sched
                .submit(job, work, now)
                .map_err(|err| match err {
                    SchedError::UnknownJob(_) => {
                        Error::IterationDropped("the job's session was closed".into())
                    }
                    other => sched_error(other),
                })?;
        }
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Queues a main iteration of `job` that another process runs (see
    /// [`RemoteIteration`]); an unknown job or a stopping executor refuses it.
    pub fn submit_remote(
        &self,
        job: JobId,
        deadline: Option<Instant>,
        iteration: Box<dyn RemoteIteration>,
    ) -> Result<()> {
        self.submit(
            job,
            Work {
                deadline,
                task: Box::new(Remote(iteration)),
            },
        )
    }
}
