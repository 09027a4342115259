//! Executor threads: run main iterations in the order the scheduler core picks.
//!
//! Each lane has `lane_concurrency` dedicated threads. A request handler submits
//! its iteration (a closure that runs TensorFlow and sends the reply) and awaits
//! the reply; the lane's threads ask the core for the next iteration whenever a
//! slot frees, so a switch between jobs costs one decision on a thread that is
//! already awake. Queued iterations whose client has gone (reply receiver
//! dropped) or whose deadline passed are dropped without running.
//!
//! The state is behind a `std::sync::Mutex`: it is never held across an
//! `.await` or a TensorFlow call, only for a decision or a bookkeeping update.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::runtime::job_history::{HistorySaver, HistoryView, JobIdentities};
use crate::runtime::latency::{LatencyRecorder, LatencySnapshot};
use crate::runtime::run_class::RunClass;
use crate::runtime::run_stats::{RunStats, RunStatsSnapshot};
use crate::runtime::saved_hints::{hints_key, SavedHints};
use crate::runtime::tenant_ids::{Clamp, TenantIds};
use crate::runtime::timeline::{JobKind, Timeline};
use crate::sched::policy::{self, Policy};
use crate::sched::standing::Standing;
use crate::sched::tenants::DEFAULT_WEIGHT;
use crate::sched::{
    Decision, Hints, History, JobId, JobStatus, LaneId, Nanos, RunEnd, SchedConfig, SchedError,
    Scheduler, Share, SortKey, TenantId, TenantStatus,
};
use crate::tenant::identity::Tenant;
use crate::tenant::limits::{Limits, LimitsTable};

/// Window for the iterations-per-second figure.
const RATE_WINDOW_S: u64 = 60;

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

trait Task: Send {
    fn client_gone(&self) -> bool;
    /// Runs the iteration; the returned closure delivers its outcome. The
    /// executor accounts the iteration before delivering, so a client that has
    /// its reply also sees the iteration in the statistics.
    fn run(self: Box<Self>) -> Box<dyn FnOnce() + Send>;
}

/// A main iteration that another thread of this process runs
/// ([`Executor::want`]): the lane thread gives the go-ahead, holds the lane
/// until the runner's turn ends, and then accounts the iteration.
struct HoldLane {
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

struct Remote(Box<dyn RemoteIteration>);

impl Task for Remote {
    fn client_gone(&self) -> bool {
        self.0.requester_gone()
    }
    fn run(self: Box<Self>) -> Box<dyn FnOnce() + Send> {
        self.0.run();
        Box::new(|| {})
    }
}

/// Scheduler counters for the admin API.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecStats {
    /// Between whom device time is shared first.
    pub share: Share,
    pub policy: &'static str,
    pub iterations_total: u64,
    pub iterations_per_second: f64,
    pub queued: u64,
    pub switch_latency: LatencySnapshot,
    /// Go-ahead to start of iterations run by executor processes.
    pub handover_latency: LatencySnapshot,
    /// (lane, queued, running)
    pub lanes: Vec<(LaneId, u64, u64)>,
    pub cheap_runs_total: u64,
    pub dropped_iterations: u64,
    /// Main iterations that held their lane past the hold limit (tenant
    /// isolation) and ran on beside others.
    pub lane_holds_released: u64,
    /// Iteration-time and queue-wait histograms.
    pub runs: RunStatsSnapshot,
}

/// One tenant's figures in the scheduler.
#[derive(Clone, Debug)]
pub struct TenantFigures {
    pub tenant: Tenant,
    pub status: TenantStatus,
    pub limits: Limits,
    /// Its jobs and memory requests refused so far.
    pub refusals: u64,
}

struct Inner {
    sched: Scheduler<Work>,
    tenants: TenantIds,
    lanes_with_threads: HashSet<LaneId>,
    switch_latency: LatencyRecorder,
    handover_latency: LatencyRecorder,
    iterations_total: u64,
    /// (second since epoch, iterations finished in it)
    rate: VecDeque<(u64, u64)>,
    cheap_runs_total: u64,
    dropped: u64,
    lane_holds_released: u64,
    run_stats: RunStats,
    running: Vec<(LaneId, usize)>,
    stopping: bool,
    /// Who the open jobs are, for the job history.
    identities: JobIdentities,
    /// Where the history goes after each run it records (None: not kept).
    history_saver: Option<HistorySaver>,
    /// Set while the node is drained (`salus drain`): why no new job opens.
    drain: Option<String>,
    /// Hints an admin set at run time, by job identity
    /// ([`crate::settings::hints_key`]): a job of that tenant and name gets
    /// them when it joins the scheduler (re-submitted, or adopted after a
    /// restart), over the hints its client gave.
    saved_hints: HashMap<String, SavedHints>,
    /// Jobs reopened (adopted after a restart) that have not joined the
    /// scheduler yet: they join as having run before.
    reopened: HashSet<JobId>,
}

struct Shared {
    inner: Mutex<Inner>,
    wake: Condvar,
    epoch: Instant,
    lane_concurrency: usize,
    /// Recent runs, under a lock of its own so that readers never hold `inner`.
    timeline: Arc<Timeline>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }
}

/// Cheap handle to the scheduler core of the process that schedules (the
/// `--isolation none` server, or the supervisor), with its lane threads. Jobs
/// reach it through a [`crate::runtime::sched_port::SchedPort`]: this in the
/// same process, the seam in a tenant's executor process.
#[derive(Clone)]
pub struct Executor {
    shared: Arc<Shared>,
}

impl Executor {
    pub fn new(policy: Box<dyn Policy>, config: SchedConfig) -> Executor {
        Executor::with_timeline(policy, config, Arc::new(Timeline::default()))
    }

    /// An executor that records its runs in `timeline`.
    pub fn with_timeline(
        policy: Box<dyn Policy>,
        config: SchedConfig,
        timeline: Arc<Timeline>,
    ) -> Executor {
        Executor {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    sched: Scheduler::new(policy, config),
                    tenants: TenantIds::default(),
                    lanes_with_threads: HashSet::new(),
                    switch_latency: LatencyRecorder::default(),
                    handover_latency: LatencyRecorder::default(),
                    iterations_total: 0,
                    rate: VecDeque::new(),
                    cheap_runs_total: 0,
                    dropped: 0,
                    lane_holds_released: 0,
                    run_stats: RunStats::default(),
                    running: Vec::new(),
                    stopping: false,
                    identities: JobIdentities::default(),
                    history_saver: None,
                    drain: None,
                    saved_hints: HashMap::new(),
                    reopened: HashSet::new(),
                }),
                wake: Condvar::new(),
                epoch: Instant::now(),
                lane_concurrency: config.lane_concurrency.max(1),
                timeline,
            }),
        }
    }

    pub fn add_job(&self, id: JobId, lane: LaneId, hints: Hints) -> Result<()> {
        let now = self.shared.now();
        let mut inner = self.shared.lock();
        // The owner was recorded when the job opened (`open_job`).
        let tenant = inner.tenants.owner(id);
        let identity = inner.identities.get(id).cloned();
        let hints = match identity
            .as_ref()
            .and_then(|who| inner.saved_hints.get(&hints_key(&who.tenant, &who.name)))
        {
            Some(saved) => saved.over(hints),
            None => hints,
        };
        let hints = inner.tenants.clamp(id, hints);
        let added = match identity {
            Some(identity) => inner
                .sched
                .add_identified_job(id, lane, tenant, identity, hints, now),
            None => inner.sched.add_tenant_job(id, lane, tenant, hints, now),
        };
        added.map_err(sched_error)?;
        if inner.reopened.remove(&id) {
            let _ = inner.sched.joined_midway(id);
        }
        self.start_lane_threads(&mut inner, lane)
    }

    /// Starts `lane`'s threads unless it has them.
    fn start_lane_threads(&self, inner: &mut Inner, lane: LaneId) -> Result<()> {
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

    /// Moves a job to another lane (a lane merge); the lane runs nothing new
    /// until the job's iteration in flight, if any, ends. An unknown job (it
    /// left meanwhile) is ignored.
    pub fn move_job(&self, id: JobId, lane: LaneId) -> Result<()> {
        {
            let mut inner = self.shared.lock();
            if inner.sched.move_job(id, lane).is_err() {
                return Ok(());
            }
            self.start_lane_threads(&mut inner, lane)?;
        }
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Lanes running or about to run iterations (memory admission merges only idle ones).
    pub fn busy_lanes(&self) -> Vec<LaneId> {
        let now = self.shared.now();
        self.shared.lock().sched.busy_lanes(now)
    }

    /// Forgets a job that did not run to its end (it could not open, or is
    /// cancelled); [`Self::end_job`].
    pub fn remove_job(&self, id: JobId) {
        self.end_job(id, RunEnd::Cancelled);
    }

    /// Forgets a job that ended as `end`; its queued iterations are dropped
    /// (their clients get an error). A job known by its identity that ran a
    /// main iteration adds its run to the job history (saved to the state
    /// directory). A job already forgotten is ignored.
    pub fn end_job(&self, id: JobId, end: RunEnd) {
        let dropped = {
            let mut inner = self.shared.lock();
            let recorded = inner
                .sched
                .status(id)
                .is_some_and(|s| s.identity.is_some() && s.iterations > 0);
            let dropped = inner.sched.end_job(id, end).unwrap_or_default();
            if recorded {
                if let Some(saver) = &inner.history_saver {
                    saver.save(inner.sched.history());
                }
            }
            inner.identities.forget(id);
            inner.reopened.remove(&id);
            inner.tenants.forget_job(id);
            inner.dropped += dropped.len() as u64;
            inner.run_stats.forget(id);
            dropped
        };
        self.shared.timeline.close_job(id);
        self.shared.wake.notify_all();
        drop(dropped);
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
    fn submit(&self, job: JobId, work: Work) -> Result<()> {
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

    /// Counts a main iteration whose lane stopped waiting for it (the hold limit).
    pub fn count_released_hold(&self) {
        self.shared.lock().lane_holds_released += 1;
    }

    /// Records how long the thread that runs an iteration took from its
    /// go-ahead to starting it: here, or in an executor process (reported
    /// with its Done).
    pub fn record_handover(&self, ns: u64) {
        self.shared.lock().handover_latency.record(ns);
    }

    /// Whether a run goes at once (`Cheap`) or through the scheduler (`Main`):
    /// a [`RunClass::Brief`] run queues when another job's queued iteration
    /// ranks ahead of `job`.
    pub fn resolve(&self, job: JobId, class: RunClass) -> RunClass {
        match class {
            RunClass::Brief if self.shared.lock().sched.outranked(job) => RunClass::Main,
            RunClass::Brief => RunClass::Cheap,
            other => other,
        }
    }

    /// Counts a run that bypassed the scheduler, charges its time to the job's
    /// service (which policies that share by service then see), and puts it on
    /// the timeline, on the job's lane (none before the job joined the scheduler).
    pub fn record_cheap_run(&self, job: JobId, started: Instant, ended: Instant) {
        let elapsed = ended.saturating_duration_since(started);
        let lane = {
            let mut inner = self.shared.lock();
            inner.cheap_runs_total += 1;
            inner
                .sched
                .charge_outside_run(job, elapsed.as_nanos().min(u64::MAX as u128) as u64);
            inner.run_stats.count_cheap_run(job);
            inner.sched.job_lane(job)
        };
        self.shared
            .timeline
            .record(job, lane, started, ended, RunClass::Cheap);
    }

    /// Cheap runs of an open job so far.
    pub fn cheap_runs(&self, job: JobId) -> u64 {
        self.shared.lock().run_stats.cheap_runs(job)
    }

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

    fn open_job_as(
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

    /// Drains the node (`Some(why)`: no new job opens, each is refused with
    /// UNAVAILABLE saying `why`; open jobs run on) or admits jobs again (None).
    pub fn set_drain(&self, why: Option<String>) {
        self.shared.lock().drain = why;
    }

    /// Why the node is drained, if it is.
    pub fn drain(&self) -> Option<String> {
        self.shared.lock().drain.clone()
    }

    /// The hints saved for job identity `key` ([`hints_key`]); None forgets them.
    pub fn save_hints(&self, key: String, hints: Option<SavedHints>) {
        let mut inner = self.shared.lock();
        match hints {
            Some(hints) => inner.saved_hints.insert(key, hints),
            None => inner.saved_hints.remove(&key),
        };
    }

    /// Replaces the limits the tenants file gives (a reload), keeping those
    /// issued tokens grant; limits changed with `salus limits` are re-applied
    /// by the caller.
    pub fn replace_file_limits(&self, limits: LimitsTable) {
        let mut inner = self.shared.lock();
        inner.tenants.replace_file_limits(limits);
        apply_weights(&mut inner);
        drop(inner);
        self.shared.wake.notify_all();
    }

    /// The tenants' limits (the tenants file's, at start).
    pub fn set_limits_table(&self, limits: LimitsTable) {
        let mut inner = self.shared.lock();
        inner.tenants.set_limits_table(limits);
        apply_weights(&mut inner);
    }

    /// Changes the limits of the tenant named `name` (`*`: the defaults); the
    /// fields set replace its earlier ones. Weights apply at once, max-jobs to
    /// the next job opened, max-priority to the next hints set.
    /// Returns the limits that now apply to `name`.
    pub fn set_limits(&self, name: &str, limits: &Limits) -> Limits {
        let mut inner = self.shared.lock();
        inner.tenants.set_limits(name, limits);
        apply_weights(&mut inner);
        let now = inner.tenants.limits_named(name);
        drop(inner);
        self.shared.wake.notify_all();
        now
    }

    /// The limits valid issued tokens give tenant `name` (None: none now).
    pub fn set_granted_limits(&self, name: &str, granted: Option<Limits>) {
        let mut inner = self.shared.lock();
        inner.tenants.set_granted(name, granted);
        apply_weights(&mut inner);
        drop(inner);
        self.shared.wake.notify_all();
    }

    /// The owner of `job`, its memory share (`memory=` limit) if it has one,
    /// and its name (for admission).
    pub fn memory_share(&self, job: JobId) -> (TenantId, Option<u64>, String) {
        let inner = self.shared.lock();
        let owner = inner.tenants.owner(job);
        let name = inner
            .tenants
            .tenant(owner)
            .map_or_else(|| "anonymous".to_string(), |t| t.to_string());
        (owner, inner.tenants.limits_of(owner).memory, name)
    }

    /// The scheduler core's number for `tenant` (numbered on first sight).
    /// `tenant`'s executor runs again after a stop: the device time it gave
    /// up meanwhile is not credit against the tenants that went on.
    pub fn forfeit_credit(&self, tenant: &Tenant) {
        let now = self.shared.now();
        let mut inner = self.shared.lock();
        let id = inner.tenants.id_of(tenant);
        inner.sched.forfeit_credit(id, now);
    }

    pub fn tenant_id(&self, tenant: &Tenant) -> TenantId {
        self.shared.lock().tenants.id_of(tenant)
    }

    /// Jobs `tenant` has opened since start, closed ones included.
    pub fn jobs_opened(&self, tenant: TenantId) -> u64 {
        self.shared.lock().tenants.jobs_opened(tenant)
    }

    /// Counts a refusal (memory admission) against `job`'s owner.
    pub fn count_refusal(&self, job: JobId) {
        self.shared.lock().tenants.refused(job);
    }

    /// Whether `job`'s priority hint was lowered to its tenant's limit.
    pub fn priority_clamp(&self, job: JobId) -> Option<Clamp> {
        self.shared.lock().tenants.clamp_of(job)
    }

    /// Every tenant that has had a job here, with its share of device time.
    pub fn tenant_figures(&self) -> Vec<TenantFigures> {
        let inner = self.shared.lock();
        inner
            .sched
            .tenant_status()
            .into_iter()
            .filter_map(|status| {
                let tenant = inner.tenants.tenant(status.id)?.clone();
                let limits = inner.tenants.limits_of(status.id);
                let refusals = inner.tenants.refusals_of(status.id);
                Some(TenantFigures {
                    tenant,
                    status,
                    limits,
                    refusals,
                })
            })
            .collect()
    }

    /// The ring of recent runs (the admin API's timeline).
    pub fn timeline(&self) -> &Arc<Timeline> {
        &self.shared.timeline
    }

    pub fn set_policy(&self, name: &str) -> Result<(&'static str, &'static str)> {
        let policy = policy::by_name(name).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let new = policy.name();
        let previous = {
            let mut inner = self.shared.lock();
            let previous = inner.sched.policy_name();
            inner.sched.set_policy(policy);
            previous
        };
        self.shared.wake.notify_all();
        Ok((previous, new))
    }

    pub fn policy_name(&self) -> &'static str {
        self.shared.lock().sched.policy_name()
    }

    pub fn set_hints(&self, id: JobId, hints: Hints) -> Result<()> {
        {
            let mut inner = self.shared.lock();
            let hints = inner.tenants.clamp(id, hints);
            inner.sched.set_hints(id, hints).map_err(sched_error)?;
        }
        self.shared.wake.notify_all();
        Ok(())
    }

    /// The rank a job arriving now with `hints` has under the current policy
    /// (memory admission re-checks waiting jobs in this order). The hints are
    /// capped by the job's owner's limits here, whoever passed them: over the
    /// seam they are what a tenant's executor says.
    pub fn rank_new(&self, id: JobId, hints: &Hints) -> SortKey {
        let inner = self.shared.lock();
        let now = self.shared.now();
        let identity = inner.identities.get(id);
        let hints = inner.tenants.capped(id, hints.clone());
        inner.sched.rank_new_as(id, identity, &hints, now)
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

    pub fn job_status(&self, id: JobId) -> Option<JobStatus> {
        self.shared.lock().sched.status(id)
    }

    /// A job's status and, if it waits, where it stands, under one lock (an
    /// admin row's state and note agree).
    pub fn job_status_with_standing(&self, id: JobId) -> Option<(JobStatus, Option<Standing>)> {
        self.shared.lock().sched.status_with_standing(id)
    }

    pub fn stats(&self) -> ExecStats {
        let inner = self.shared.lock();
        let now_s = self.shared.epoch.elapsed().as_secs();
        let recent: u64 = inner
            .rate
            .iter()
            .filter(|(s, _)| now_s.saturating_sub(*s) < RATE_WINDOW_S)
            .map(|(_, n)| n)
            .sum();
        let window = now_s.clamp(1, RATE_WINDOW_S) as f64;
        let lanes = inner
            .sched
            .lanes()
            .into_iter()
            .map(|lane| {
                let queued = inner
                    .sched
                    .job_ids()
                    .into_iter()
                    .filter_map(|j| inner.sched.status(j))
                    .filter(|s| s.lane == lane)
                    .map(|s| s.queued as u64)
                    .sum();
                let running = inner
                    .running
                    .iter()
                    .find(|(l, _)| *l == lane)
                    .map_or(0, |(_, n)| *n as u64);
                (lane, queued, running)
            })
            .collect();
        ExecStats {
            policy: inner.sched.policy_name(),
            share: inner.sched.config().share,
            iterations_total: inner.iterations_total,
            iterations_per_second: recent as f64 / window,
            queued: inner.sched.queued() as u64,
            switch_latency: inner.switch_latency.snapshot(),
            handover_latency: inner.handover_latency.snapshot(),
            lanes,
            cheap_runs_total: inner.cheap_runs_total,
            dropped_iterations: inner.dropped,
            lane_holds_released: inner.lane_holds_released,
            runs: inner.run_stats.snapshot(),
        }
    }

    /// Refuses new iterations and stops the executor threads once idle.
    pub fn stop(&self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
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

pub(crate) fn dropped_before_it_ran() -> Error {
    Error::IterationDropped(
        "the iteration was dropped before it ran: its session closed, its deadline passed, or the server is stopping"
            .into(),
    )
}

/// Every known tenant's weight from its limits, into the scheduler core.
fn apply_weights(inner: &mut Inner) {
    let weights: Vec<(TenantId, u32)> = inner
        .tenants
        .known()
        .map(|(id, _)| {
            let weight = inner.tenants.limits_of(id).weight;
            (id, weight.unwrap_or(DEFAULT_WEIGHT))
        })
        .collect();
    for (id, weight) in weights {
        let _ = inner.sched.set_tenant_weight(id, weight);
    }
}

fn sched_error(err: SchedError) -> Error {
    match err {
        SchedError::BadWeight(_) => Error::InvalidArgument(err.to_string()),
        _ => Error::Internal(err.to_string()),
    }
}

fn set_running(inner: &mut Inner, lane: LaneId, delta: isize) {
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
fn lane_loop(shared: &Shared, lane: LaneId) {
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
                // A lane merge may have moved the job meanwhile: its iteration
                // counts against the lane it is in now.
                let job_lane = inner.sched.job_lane(dispatch.job).unwrap_or(lane);
                inner
                    .sched
                    .finish(dispatch.job, job_lane, Some(device_time), end);
                inner.iterations_total += 1;
                inner
                    .run_stats
                    .record_iteration(now.saturating_sub(dispatch.submitted), device_time);
                let second = end / 1_000_000_000;
                match inner.rate.back_mut() {
                    Some((s, n)) if *s == second => *n += 1,
                    _ => inner.rate.push_back((second, 1)),
                }
                while inner
                    .rate
                    .front()
                    .is_some_and(|(s, _)| second.saturating_sub(*s) >= RATE_WINDOW_S)
                {
                    inner.rate.pop_front();
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A main iteration through this core's port, as the front ends run one.
    async fn run_main<T, F>(
        core: &Executor,
        job: JobId,
        deadline: Option<Instant>,
        f: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        crate::runtime::sched_port::SchedPort::Local(core.clone())
            .run_main(job, deadline, f)
            .await
    }
    use crate::sched::policy::by_name;

    fn executor(policy: &str) -> Executor {
        Executor::new(
            by_name(policy).unwrap(),
            SchedConfig {
                lane_concurrency: 1,
                anticipation: 0,
                ..SchedConfig::default()
            },
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_iterations_and_reports_results_and_stats() {
        let ex = executor("pack");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        let v = run_main(&ex, JobId(1), None, || Ok(41 + 1)).await.unwrap();
        assert_eq!(v, 42);
        let err = run_main::<(), _>(&ex, JobId(1), None, || {
            Err(Error::InvalidArgument("bad".into()))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        let panicked = run_main::<(), _>(&ex, JobId(1), None, || panic!("boom"))
            .await
            .unwrap_err();
        assert!(matches!(panicked, Error::Internal(_)));
        let status = ex.job_status(JobId(1)).unwrap();
        assert_eq!(status.iterations, 3);
        assert_eq!(ex.stats().iterations_total, 3);
        let unknown = run_main(&ex, JobId(9), None, || Ok(())).await.unwrap_err();
        assert!(matches!(unknown, Error::IterationDropped(_)));
    }

    /// A drained core refuses a job opening with UNAVAILABLE naming the
    /// drain, while a job open before runs on; undrained, jobs open again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drained_core_refuses_new_jobs_and_runs_open_ones() {
        let ex = executor("fair");
        let alice = Tenant::named("alice");
        ex.open_job(JobId(1), "before", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.set_drain(Some(
            "this node is draining for maintenance (salus drain)".into(),
        ));
        let refused = ex
            .open_job(JobId(2), "after", JobKind::Graph, Some(&alice))
            .unwrap_err();
        assert!(matches!(refused, Error::Unavailable(_)), "{refused:?}");
        assert_eq!(
            refused.code(),
            salus_proto::tensorflow::error::Code::Unavailable
        );
        assert!(refused.to_string().contains("salus drain"), "{refused}");
        // The refused job was never counted as its tenant's.
        assert_eq!(ex.jobs_opened(ex.tenant_id(&alice)), 1);
        assert_eq!(run_main(&ex, JobId(1), None, || Ok(7)).await.unwrap(), 7);
        // A job that was open before a restart (adopted) is no new job.
        ex.reopen_job(JobId(3), "adopted", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.set_drain(None);
        ex.open_job(JobId(2), "after", JobKind::Graph, Some(&alice))
            .unwrap();
    }

    /// Hints saved for a job identity apply to a job of that tenant and
    /// name when it joins (adopted or submitted again), over its client's.
    #[test]
    fn saved_hints_apply_to_a_job_of_that_identity() {
        let ex = executor("priority");
        let alice = Tenant::named("alice");
        // Kept by the tenant's key: the token tenant alice's, not user alice's.
        ex.save_hints(
            hints_key("name:alice", "resnet"),
            Some(SavedHints {
                priority: 5,
                expected_iterations: Some(100),
                expected_seconds: None,
                set_unix_s: 1,
            }),
        );
        ex.open_job(JobId(1), "resnet", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.add_job(
            JobId(1),
            LaneId(0),
            Hints {
                name: "resnet".into(),
                priority: 1,
                ..Hints::default()
            },
        )
        .unwrap();
        let hints = ex.job_status(JobId(1)).unwrap().hints;
        assert_eq!((hints.priority, hints.expected_iterations), (5, Some(100)));
        ex.open_job(JobId(2), "other", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.add_job(
            JobId(2),
            LaneId(0),
            Hints {
                name: "other".into(),
                priority: 1,
                ..Hints::default()
            },
        )
        .unwrap();
        assert_eq!(ex.job_status(JobId(2)).unwrap().hints.priority, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expired_and_removed_iterations_are_dropped_not_run() {
        let ex = executor("fifo");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.add_job(JobId(2), LaneId(0), Hints::default()).unwrap();
        run_main(&ex, JobId(1), None, || Ok(())).await.unwrap();
        // FIFO: job 2 waits behind job 1 (alive, started, idle) forever...
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let past = Instant::now();
        let expired = run_main(&ex, JobId(2), Some(past), move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        assert!(matches!(expired.await, Err(Error::IterationDropped(_))));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        // ...until job 1 is removed; a job's own queue is dropped when it is removed.
        let ex2 = ex.clone();
        let waiting = tokio::spawn(async move { run_main(&ex2, JobId(2), None, || Ok(7)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        ex.remove_job(JobId(1));
        assert_eq!(waiting.await.unwrap().unwrap(), 7);
        assert!(ex.stats().dropped_iterations >= 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_iteration_whose_caller_left_before_its_turn_is_dropped_unrun() {
        let ex = executor("fifo");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.add_job(JobId(2), LaneId(0), Hints::default()).unwrap();
        run_main(&ex, JobId(1), None, || Ok(())).await.unwrap();
        // FIFO: job 2 waits behind job 1 until job 1 leaves.
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let ex2 = ex.clone();
        let waiting = tokio::spawn(async move {
            run_main(&ex2, JobId(2), None, move || {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        waiting.abort(); // its client left
        let _ = waiting.await;
        let dropped_before = ex.stats().dropped_iterations;
        ex.remove_job(JobId(1));
        // Job 2 can run now; its given-up iteration is dropped, and a new one runs.
        assert_eq!(run_main(&ex, JobId(2), None, || Ok(3)).await.unwrap(), 3);
        assert!(!ran.load(Ordering::SeqCst));
        assert_eq!(ex.stats().dropped_iterations, dropped_before + 1);
        assert_eq!(ex.job_status(JobId(2)).unwrap().iterations, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn main_iterations_and_cheap_runs_go_on_the_timeline() {
        use crate::runtime::timeline::JobKind;
        let ex = executor("rr");
        ex.timeline().open_job(JobId(1), "a", JobKind::Graph, None);
        ex.add_job(JobId(1), LaneId(3), Hints::default()).unwrap();
        let before = Instant::now();
        run_main(&ex, JobId(1), None, || {
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        })
        .await
        .unwrap();
        let t = Instant::now();
        ex.record_cheap_run(JobId(1), t, t);
        // A job the scheduler does not know yet (waiting for memory): no lane.
        ex.record_cheap_run(JobId(2), t, t);
        let snap = ex.timeline().snapshot(None);
        assert_eq!(snap.spans.len(), 3);
        let main = &snap.spans[0];
        assert_eq!(
            (main.job, main.lane, main.class),
            (JobId(1), Some(LaneId(3)), RunClass::Main)
        );
        assert!(
            main.start >= before && main.end.duration_since(main.start) >= Duration::from_millis(2)
        );
        assert_eq!(main.label.as_ref().unwrap().name, "a");
        assert_eq!(
            (snap.spans[1].lane, snap.spans[1].class),
            (Some(LaneId(3)), RunClass::Cheap)
        );
        assert_eq!(snap.spans[2].lane, None);
        assert_eq!(ex.stats().cheap_runs_total, 2);
        // A run that ends just after its job was removed still names it.
        ex.remove_job(JobId(1));
        ex.record_cheap_run(JobId(1), t, t);
        let snap = ex.timeline().snapshot(None);
        assert_eq!(snap.spans[3].label.as_ref().unwrap().name, "a");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn switching_between_jobs_is_measured_and_policy_changes_apply() {
        let ex = executor("rr");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.add_job(JobId(2), LaneId(0), Hints::default()).unwrap();
        let mut handles = Vec::new();
        for job in [1, 2] {
            let ex = ex.clone();
            handles.push(tokio::spawn(async move {
                for _ in 0..20 {
                    run_main(&ex, JobId(job), None, || {
                        std::thread::sleep(Duration::from_micros(200));
                        Ok(())
                    })
                    .await
                    .unwrap();
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let stats = ex.stats();
        assert_eq!(stats.iterations_total, 40);
        assert_eq!(stats.runs.iteration_time.count, 40);
        assert!(
            stats.runs.iteration_time.sum_us >= 40.0 * 200.0,
            "{stats:?}"
        );
        assert_eq!(stats.runs.queue_wait.count, 40);
        // Each go-ahead's wake of the thread that ran the iteration.
        assert_eq!(stats.handover_latency.count, 40);
        assert!(stats.switch_latency.count > 0, "{stats:?}");
        assert_eq!(ex.set_policy("srtf").unwrap(), ("rr", "srtf"));
        // Lane threads end with their lane and come back with a new job.
        ex.remove_job(JobId(1));
        ex.remove_job(JobId(2));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ex.shared.lock().lanes_with_threads.is_empty());
        ex.add_job(JobId(3), LaneId(0), Hints::default()).unwrap();
        assert_eq!(run_main(&ex, JobId(3), None, || Ok(5)).await.unwrap(), 5);
        assert!(ex.set_policy("bogus").is_err());
        assert_eq!(ex.policy_name(), "srtf");
    }
}
