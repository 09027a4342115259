//! # salus-sched
//!
//! The scheduler core: jobs, lanes and per-lane queues of pending iterations.
//!
//! A plain synchronous state machine with no I/O and no clock: every call takes
//! the current time. The server drives it with real time and real TensorFlow
//! runs, the simulator with virtual time, unit tests directly. The payload `W`
//! of an iteration is opaque here (a closure in the server, a modelled cost in
//! the simulator): an iteration is any unit of work a front end submits.
//!
//! Rules:
//! - A lane runs at most `concurrency` main iterations at once.
//! - When a slot is free, the lane's policy ranks the lane's jobs; the best job
//!   with an iteration ready runs (its oldest one). Whether the lane instead
//!   waits for a better job that is momentarily between iterations is the
//!   policy's [`policy::Hold`]; the wait lasts at most the anticipation window
//!   after that job's last iteration ended (or forever, for `fifo`).
//! - A switch happens only at an iteration boundary; nothing moves, so a
//!   switch costs one decision.
//!
//! # Layout
//! - [`policy`]: the policies, one module each.
//! - [`hints`]: job hints and their wire format.
//! - [`history`]: job identities and their past runs' lengths (`learned`).
//! - [`lanes`]: memory lanes (Salus's assignment rule).
//! - [`tenants`]: sharing between tenants before the policy orders their jobs.
//! - [`units`]: byte sizes ("512MiB").
//!
//! The server (`salus-server`) and the simulator (`salus-sim`) both drive this
//! crate; neither has a scheduler of its own.

pub mod hints;
pub mod history;
pub mod lanes;
pub mod law;
pub mod policy;
pub mod standing;
pub mod tenants;
pub mod units;

use std::collections::{BTreeSet, HashMap, VecDeque};

pub use hints::{HintError, Hints};
pub use history::{Expectation, History, JobIdentity, PastRun, RunEnd};
pub use policy::SortKey;
use policy::{Hold, JobView, LogNormal, Policy};
use tenants::Tenants;
pub use tenants::{Share, TenantId, TenantStatus};

/// Nanoseconds since an epoch chosen by the driver.
pub type Nanos = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub u32);

/// Settings of the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Main iterations in flight per lane (Salus: 1).
    pub lane_concurrency: usize,
    /// How long after a job's iteration ends it still counts as active (see
    /// [`Hold::WhileActive`]).
    pub anticipation: Nanos,
    /// Whether a lane shares between tenants first ([`tenants`]).
    pub share: Share,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            lane_concurrency: 1,
            anticipation: 2_000_000,
            share: Share::Tenants,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchedError {
    #[error("job {0:?} is not known to the scheduler")]
    UnknownJob(JobId),
    #[error("job {0:?} is already known to the scheduler")]
    DuplicateJob(JobId),
    #[error("a tenant's weight must be 1 to {max}, not {0}", max = tenants::MAX_WEIGHT)]
    BadWeight(u32),
}

struct Pending<W> {
    submitted: Nanos,
    work: W,
}

struct JobState<W> {
    lane: LaneId,
    tenant: TenantId,
    arrival: Nanos,
    hints: Hints,
    attained: Nanos,
    /// Device time of the job's runs outside the scheduler (cheap runs): part
    /// of its service for the policy, not of its iterations' mean.
    outside_service: Nanos,
    fair_offset: Nanos,
    iterations: u64,
    /// The job's fastest main iteration so far.
    fastest: Option<Nanos>,
    running: usize,
    last_end: Option<Nanos>,
    queue: VecDeque<Pending<W>>,
    total_wait: Nanos,
    /// Rank under the current policy, as stored in the lane's indexes.
    key: SortKey,
    /// Who it is, for its history; None: a job the history does not follow.
    identity: Option<JobIdentity>,
    /// Its length's law from its identity's history, as of its admission.
    law: Option<LogNormal>,
    /// It ran before it joined this scheduler (a job adopted after a restart
    /// of the server): its length here is not its run's, so the history does
    /// not record it.
    joined_midway: bool,
}

impl<W> JobState<W> {
    fn new(
        id: JobId,
        lane: LaneId,
        tenant: TenantId,
        hints: Hints,
        now: Nanos,
        fair_offset: Nanos,
    ) -> Self {
        JobState {
            lane,
            tenant,
            arrival: now,
            hints,
            attained: 0,
            outside_service: 0,
            fair_offset,
            iterations: 0,
            fastest: None,
            running: 0,
            last_end: None,
            queue: VecDeque::new(),
            total_wait: 0,
            key: SortKey {
                primary: 0,
                secondary: 0,
                arrival: now,
                id: id.0,
            },
            identity: None,
            law: None,
            joined_midway: false,
        }
    }

    /// Device time used, in main iterations and outside the scheduler.
    fn service(&self) -> Nanos {
        self.attained.saturating_add(self.outside_service)
    }

    /// Service without contention's stretching: every iteration at the
    /// fastest one's time.
    fn work(&self) -> Nanos {
        let fastest = self.fastest.unwrap_or(0);
        let main = fastest.saturating_mul(self.iterations).min(self.attained);
        main.saturating_add(self.outside_service)
    }

    fn record_iterations(&mut self, device_time: Nanos, count: u64, now: Nanos) {
        let each = device_time / count.max(1);
        self.fastest = Some(self.fastest.map_or(each, |f| f.min(each)));
        self.attained += device_time;
        self.iterations += count;
        self.last_end = Some(now);
    }

    fn mean_iteration(&self) -> Option<Nanos> {
        (self.iterations > 0).then(|| self.attained / self.iterations)
    }

    /// Expected remaining device time, from hints and measurements. A job
    /// with an iterations hint but no measured iteration yet counts as 0, so it
    /// runs one iteration at the next boundary and gets a real estimate.
    fn remaining(&self) -> Option<Nanos> {
        let total = match (self.hints.expected_seconds, self.hints.expected_iterations) {
            (Some(s), _) => (s * 1e9) as Nanos,
            (None, Some(n)) => n.saturating_mul(self.mean_iteration().unwrap_or(0)),
            (None, None) => return None,
        };
        Some(total.saturating_sub(self.attained))
    }

    fn view(&self, id: JobId) -> JobView {
        JobView {
            id: id.0,
            arrival: self.arrival,
            attained: self.service(),
            fair_attained: self.service() + self.fair_offset,
            work: self.work(),
            iterations: self.iterations,
            priority: self.hints.priority,
            remaining: self.remaining(),
            waited: self.total_wait,
            learned: self.law,
            sibling_work: 0,
        }
    }
}

/// A lane's jobs, ordered by the policy's key. Keys change only when their
/// job changes, so a decision is an ordered walk, not a scan of every job.
#[derive(Default)]
struct LaneState {
    /// Every live job of the lane.
    all: BTreeSet<(SortKey, JobId)>,
    /// Jobs with at least one queued iteration.
    ready: BTreeSet<(SortKey, JobId)>,
    /// Live jobs of each tenant on the lane.
    tenant_jobs: HashMap<TenantId, usize>,
    running: usize,
    /// When keys were last recomputed for [`Policy::refresh_interval`].
    refreshed: Nanos,
}

/// An iteration handed out to run.
#[derive(Debug)]
pub struct Dispatch<W> {
    pub job: JobId,
    pub lane: LaneId,
    pub work: W,
    pub submitted: Nanos,
}

/// What a lane should do now.
#[derive(Debug)]
pub enum Decision<W> {
    Run(Dispatch<W>),
    /// Nothing to run before this time (re-ask then, or on the next event).
    WaitUntil(Nanos),
    /// Nothing to run until the next submit/finish/removal.
    Idle,
}

/// A read-only summary of a job, for status APIs.
#[derive(Clone, Debug, PartialEq)]
pub struct JobStatus {
    pub id: JobId,
    pub lane: LaneId,
    pub tenant: TenantId,
    pub hints: Hints,
    pub arrival: Nanos,
    /// Device time of main iterations.
    pub attained: Nanos,
    /// Device time of main iterations and of runs outside the scheduler
    /// (cheap runs): what share-by-service policies compare.
    pub service: Nanos,
    pub iterations: u64,
    pub mean_iteration: Option<Nanos>,
    pub remaining: Option<Nanos>,
    pub queued: usize,
    pub running: usize,
    /// Total time iterations of this job waited in the queue.
    pub total_wait: Nanos,
    /// Who it is, if the history follows it.
    pub identity: Option<JobIdentity>,
    /// What its identity's earlier runs say of its length ("expected 12 min
    /// from 7 earlier runs"); it ranks by the law as of its admission.
    pub expected: Option<Expectation>,
}

pub struct Scheduler<W> {
    config: SchedConfig,
    policy: Box<dyn Policy>,
    jobs: HashMap<JobId, JobState<W>>,
    lanes: HashMap<LaneId, LaneState>,
    tenants: Tenants,
    /// Past runs by identity: what `learned` ranks by.
    history: History,
    /// Live jobs per identity: a job's siblings are looked for only where
    /// its identity has others ([`JobView::sibling_work`]).
    live_identities: HashMap<JobIdentity, usize>,
}

/// How a tenant's best job that decides leaves its tenant's turn.
enum TenantTurn {
    Run(JobId),
    /// Between iterations and held for: until then for every tenant, or
    /// (None) beyond the anticipation window, for its own tenant's jobs only.
    Hold(Option<Nanos>),
}

impl LaneState {
    fn add_tenant_job(&mut self, tenant: TenantId) {
        *self.tenant_jobs.entry(tenant).or_default() += 1;
    }

    fn remove_tenant_job(&mut self, tenant: TenantId) {
        if let Some(count) = self.tenant_jobs.get_mut(&tenant) {
            *count -= 1;
            if *count == 0 {
                self.tenant_jobs.remove(&tenant);
            }
        }
    }
}

impl<W> Scheduler<W> {
    pub fn new(policy: Box<dyn Policy>, config: SchedConfig) -> Self {
        Scheduler {
            config,
            policy,
            jobs: HashMap::new(),
            lanes: HashMap::new(),
            tenants: Tenants::default(),
            history: History::default(),
            live_identities: HashMap::new(),
        }
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Swaps the policy; queued iterations and job history are kept, and
    /// the new policy learns the history's completed runs.
    pub fn set_policy(&mut self, policy: Box<dyn Policy>) {
        self.policy = policy;
        self.teach_policy_history();
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in ids {
            self.rekey(id);
        }
    }

    pub fn config(&self) -> SchedConfig {
        self.config
    }

    /// Adds a job of no particular tenant ([`TenantId::NONE`]).
    pub fn add_job(
        &mut self,
        id: JobId,
        lane: LaneId,
        hints: Hints,
        now: Nanos,
    ) -> Result<(), SchedError> {
        self.add_tenant_job(id, lane, TenantId::NONE, hints, now)
    }

    /// Adds a job of `tenant` that the history does not follow.
    pub fn add_tenant_job(
        &mut self,
        id: JobId,
        lane: LaneId,
        tenant: TenantId,
        hints: Hints,
        now: Nanos,
    ) -> Result<(), SchedError> {
        self.add_job_as(id, lane, tenant, None, hints, now)
    }

    /// Adds a job of `tenant` known as `identity`: ranked by what its
    /// identity's earlier runs say of its length (under `learned`), and its
    /// own run is recorded when it ends ([`Self::end_job`]).
    pub fn add_identified_job(
        &mut self,
        id: JobId,
        lane: LaneId,
        tenant: TenantId,
        identity: JobIdentity,
        hints: Hints,
        now: Nanos,
    ) -> Result<(), SchedError> {
        self.add_job_as(id, lane, tenant, Some(identity), hints, now)
    }

    /// Tells who a job already added is, once that is known (a server learns
    /// a job's fingerprint at its first main iteration): it is re-ranked by
    /// its identity's history and its run is recorded under it.
    /// Job `id` ran before it joined this scheduler (adopted after a restart
    /// of the server): its end records no run in the history, whose lengths
    /// would be short by what it did before.
    pub fn joined_midway(&mut self, id: JobId) -> Result<(), SchedError> {
        self.jobs.get_mut(&id).ok_or(SchedError::UnknownJob(id))?.joined_midway = true;
        Ok(())
    }

    pub fn set_identity(&mut self, id: JobId, identity: JobIdentity) -> Result<(), SchedError> {
        let law = self.law_of(Some(&identity));
        let job = self.jobs.get_mut(&id).ok_or(SchedError::UnknownJob(id))?;
        job.law = law;
        job.identity = Some(identity);
        self.rekey(id);
        Ok(())
    }

    fn add_job_as(
        &mut self,
        id: JobId,
        lane: LaneId,
        tenant: TenantId,
        identity: Option<JobIdentity>,
        hints: Hints,
        now: Nanos,
    ) -> Result<(), SchedError> {
        if self.jobs.contains_key(&id) {
            return Err(SchedError::DuplicateJob(id));
        }
        let by_tenant = self.config.share == Share::Tenants;
        let law = self.law_of(identity.as_ref());
        // Fair share starts at the current minimum of the jobs it is compared
        // with: the lane's, or its tenant's on the lane.
        let fair_offset = self
            .lanes
            .get(&lane)
            .into_iter()
            .flat_map(|lane_state| lane_state.all.iter())
            .filter_map(|(_, j)| self.jobs.get(j))
            .filter(|j| !by_tenant || j.tenant == tenant)
            .map(|j| j.service() + j.fair_offset)
            .min()
            .unwrap_or(0);
        let mut job = JobState::new(id, lane, tenant, hints, now, fair_offset);
        job.law = law;
        job.identity = identity;
        job.key = self.policy.key(&self.view_of(id, &job));
        if let Some(identity) = &job.identity {
            *self.live_identities.entry(identity.clone()).or_default() += 1;
        }
        let lane_state = self.lanes.entry(lane).or_default();
        lane_state.all.insert((job.key, id));
        lane_state.add_tenant_job(tenant);
        self.jobs.insert(id, job);
        self.tenants.joined(tenant, now);
        Ok(())
    }

    /// `tenant` comes back from a spell it did not run by its own doing (its
    /// executor was stopped): like a tenant back from a long idle spell, it
    /// starts at the least virtual time of the busy tenants, so the time it
    /// gave up is not credit to take from them afterwards.
    pub fn forfeit_credit(&mut self, tenant: TenantId, now: Nanos) {
        self.tenants.catch_up(tenant, now);
    }

    /// A tenant's weight (1 to [`tenants::MAX_WEIGHT`], default 1): its share
    /// of device time against the others' under [`Share::Tenants`].
    pub fn set_tenant_weight(&mut self, tenant: TenantId, weight: u32) -> Result<(), SchedError> {
        if !(1..=tenants::MAX_WEIGHT).contains(&weight) {
            return Err(SchedError::BadWeight(weight));
        }
        self.tenants.set_weight(tenant, weight);
        Ok(())
    }

    /// Every tenant seen so far, with its device time.
    pub fn tenant_status(&self) -> Vec<TenantStatus> {
        self.tenants.status()
    }

    /// The rank `id` would have under the current policy if it arrived now
    /// with `hints`: how memory admission orders jobs not yet scheduled.
    pub fn rank_new(&self, id: JobId, hints: &Hints, now: Nanos) -> SortKey {
        self.rank_new_as(id, None, hints, now)
    }

    /// [`Self::rank_new`] for a job known as `identity`: what the policy
    /// makes of its history too, so memory admission lets a job known to be
    /// short pass waiting ones known to be long.
    pub fn rank_new_as(
        &self,
        id: JobId,
        identity: Option<&JobIdentity>,
        hints: &Hints,
        now: Nanos,
    ) -> SortKey {
        let mut job = JobState::<W>::new(id, LaneId(0), TenantId::NONE, hints.clone(), now, 0);
        job.law = self.law_of(identity);
        job.identity = identity.cloned();
        self.policy.key(&self.view_of(id, &job))
    }

    fn law_of(&self, identity: Option<&JobIdentity>) -> Option<LogNormal> {
        self.history.estimate(identity?)?.law()
    }

    /// The store of past runs.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Replaces the store of past runs (one read back from disk, or a
    /// simulation's pre-trace history); the policy learns its completed
    /// runs. Jobs already admitted keep the law they were admitted with.
    pub fn set_history(&mut self, history: History) {
        self.history = history;
        self.teach_policy_history();
    }

    /// What `identity`'s earlier runs say of its next run's length.
    pub fn expectation(&self, identity: &JobIdentity) -> Option<Expectation> {
        self.history.estimate(identity)
    }

    /// Forgets the history of every identity of `tenant` (its durable
    /// name); returns how many identities. Jobs already admitted keep their
    /// law until they end, and their runs are then recorded afresh.
    pub fn erase_history(&mut self, tenant: &str) -> usize {
        self.history.erase_tenant(tenant)
    }

    fn teach_policy_history(&mut self) {
        for work in self.history.completed_work() {
            self.policy.observe_past_run(work);
        }
    }

    /// The most work another live run of `identity` has done (see
    /// [`JobView::sibling_work`]); 0 when `law` is known or no identity.
    fn sibling_work(&self, id: JobId, identity: Option<&JobIdentity>, law: bool) -> Nanos {
        let Some(identity) = identity.filter(|_| !law) else {
            return 0;
        };
        // The job itself counts when it is live (not when ranked before
        // admission): look only where there is another.
        let own = usize::from(self.jobs.contains_key(&id));
        if self.live_identities.get(identity).copied().unwrap_or(0) <= own {
            return 0;
        }
        self.jobs
            .iter()
            .filter(|(other, job)| **other != id && job.identity.as_ref() == Some(identity))
            .map(|(_, job)| job.work())
            .max()
            .unwrap_or(0)
    }

    /// What the policy sees of `id` now.
    fn view_of(&self, id: JobId, job: &JobState<W>) -> JobView {
        JobView {
            sibling_work: self.sibling_work(id, job.identity.as_ref(), job.law.is_some()),
            ..job.view(id)
        }
    }

    /// Recomputes a job's key after it changed, keeping the indexes in step.
    fn rekey(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let view = self.view_of(id, job);
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let new = self.policy.key(&view);
        if new == job.key {
            return;
        }
        let old = std::mem::replace(&mut job.key, new);
        if let Some(lane) = self.lanes.get_mut(&job.lane) {
            lane.all.remove(&(old, id));
            lane.all.insert((new, id));
            if lane.ready.remove(&(old, id)) {
                lane.ready.insert((new, id));
            }
        }
    }

    /// Recomputes the keys of `lane`'s jobs, at most once per `every`, for a
    /// policy whose keys depend on waiting: a queued iteration's wait so far
    /// counts in the job's `waited`.
    fn refresh_keys(&mut self, lane: LaneId, now: Nanos, every: Nanos) {
        let Some(lane_state) = self.lanes.get_mut(&lane) else {
            return;
        };
        if now < lane_state.refreshed.saturating_add(every) {
            return;
        }
        lane_state.refreshed = now;
        let ids: Vec<JobId> = lane_state.all.iter().map(|&(_, id)| id).collect();
        for id in ids {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let mut view = self.view_of(id, job);
            if let (0, Some(oldest)) = (job.running, job.queue.front()) {
                view.waited += now.saturating_sub(oldest.submitted);
            }
            let new = self.policy.key(&view);
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            if new == job.key {
                continue;
            }
            let Some(lane_state) = self.lanes.get_mut(&lane) else {
                return;
            };
            let old = std::mem::replace(&mut job.key, new);
            lane_state.all.remove(&(old, id));
            lane_state.all.insert((new, id));
            if lane_state.ready.remove(&(old, id)) {
                lane_state.ready.insert((new, id));
            }
        }
    }

    /// Charges `device_time` of a run that did not go through the scheduler
    /// (a cheap run) to `job`'s service, so policies that share the device by
    /// service see it. Unknown jobs (not admitted yet) are ignored.
    pub fn charge_outside_run(&mut self, job: JobId, device_time: Nanos) {
        if let Some(state) = self.jobs.get_mut(&job) {
            state.outside_service = state.outside_service.saturating_add(device_time);
            self.tenants.charge(state.tenant, device_time);
            self.rekey(job);
        }
    }

    /// Whether a run of `job` that could skip the queue would overtake
    /// another job's queued iteration that the policy ranks ahead of it: then
    /// it should queue too. A job not admitted yet (no lane) is outranked by
    /// any queued iteration, since it will join some lane's order.
    pub fn outranked(&self, job: JobId) -> bool {
        let Some(state) = self.jobs.get(&job) else {
            return self.lanes.values().any(|lane| !lane.ready.is_empty());
        };
        self.lanes.get(&state.lane).is_some_and(|lane| {
            if self.shares_between_tenants(lane) {
                let own = self.tenants.vtime(state.tenant);
                return lane.ready.iter().any(|&(key, id)| {
                    id != job
                        && self.jobs.get(&id).is_some_and(|other| {
                            if other.tenant == state.tenant {
                                key < state.key
                            } else {
                                self.tenants.vtime(other.tenant) < own
                            }
                        })
                });
            }
            lane.ready
                .iter()
                .find(|&&(_, id)| id != job)
                .is_some_and(|&(key, _)| key < state.key)
        })
    }

    /// Forgets a job that completed; its queued iterations are returned, not
    /// run. [`Self::end_job`] with [`RunEnd::Completed`].
    pub fn remove_job(&mut self, id: JobId) -> Result<Vec<W>, SchedError> {
        self.end_job(id, RunEnd::Completed)
    }

    /// Forgets a job that ended as `end`; its queued iterations are
    /// returned, not run. A job with an identity that ran a main iteration
    /// adds its run (work and iterations) to the history.
    pub fn end_job(&mut self, id: JobId, end: RunEnd) -> Result<Vec<W>, SchedError> {
        let job = self.jobs.remove(&id).ok_or(SchedError::UnknownJob(id))?;
        if let Some(identity) = &job.identity {
            if let Some(live) = self.live_identities.get_mut(identity) {
                *live -= 1;
                if *live == 0 {
                    self.live_identities.remove(identity);
                }
            }
        }
        if let Some(identity) = job
            .identity
            .as_ref()
            .filter(|_| job.iterations > 0 && !job.joined_midway)
        {
            let run = history::PastRun {
                device_s: job.work() as f64 / 1e9,
                iterations: job.iterations,
                end,
            };
            self.history.record(identity, run);
        }
        self.policy.forget(&job.view(id));
        self.tenants.left(job.tenant, job.queue.len() + job.running);
        // A running iteration keeps its lane slot until `finish`.
        if let Some(lane) = self.lanes.get_mut(&job.lane) {
            lane.all.remove(&(job.key, id));
            lane.ready.remove(&(job.key, id));
            lane.remove_tenant_job(job.tenant);
            if lane.all.is_empty() && lane.running == 0 {
                self.lanes.remove(&job.lane);
            }
        }
        Ok(job.queue.into_iter().map(|p| p.work).collect())
    }

    pub fn set_hints(&mut self, id: JobId, hints: Hints) -> Result<(), SchedError> {
        self.jobs
            .get_mut(&id)
            .ok_or(SchedError::UnknownJob(id))?
            .hints = hints;
        self.rekey(id);
        Ok(())
    }

    /// Queues a main iteration of `job`.
    pub fn submit(&mut self, job: JobId, work: W, now: Nanos) -> Result<LaneId, SchedError> {
        let state = self.jobs.get_mut(&job).ok_or(SchedError::UnknownJob(job))?;
        state.queue.push_back(Pending {
            submitted: now,
            work,
        });
        self.tenants.submitted(state.tenant, now);
        if state.queue.len() == 1 {
            if let Some(lane) = self.lanes.get_mut(&state.lane) {
                lane.ready.insert((state.key, job));
            }
        }
        Ok(state.lane)
    }

    /// Drops queued iterations for which `keep` is false (client gone, deadline
    /// passed) and returns them.
    pub fn drain_queued(&mut self, mut keep: impl FnMut(&W) -> bool) -> Vec<W> {
        let mut dropped = Vec::new();
        for (&id, job) in self.jobs.iter_mut() {
            if job.queue.is_empty() {
                continue;
            }
            let before = dropped.len();
            let mut kept = VecDeque::with_capacity(job.queue.len());
            for pending in job.queue.drain(..) {
                if keep(&pending.work) {
                    kept.push_back(pending);
                } else {
                    dropped.push(pending.work);
                }
            }
            job.queue = kept;
            self.tenants.dropped(job.tenant, dropped.len() - before);
            if dropped.len() > before && job.queue.is_empty() {
                if let Some(lane) = self.lanes.get_mut(&job.lane) {
                    lane.ready.remove(&(job.key, id));
                }
            }
        }
        dropped
    }

    /// The next thing `lane` should do.
    pub fn next(&mut self, lane: LaneId, now: Nanos) -> Decision<W> {
        if let Some(every) = self.policy.refresh_interval() {
            self.refresh_keys(lane, now, every);
        }
        let Some(lane_state) = self.lanes.get(&lane) else {
            return Decision::Idle;
        };
        if lane_state.running >= self.config.lane_concurrency {
            return Decision::Idle;
        }
        let anticipation = self.config.anticipation;
        // Walk jobs best-first: run the first with work ready, unless the policy
        // holds the lane for a better job that is between iterations.
        let chosen: Option<Result<JobId, Option<Nanos>>> = match self.policy.hold() {
            _ if self.shares_between_tenants(lane_state) => {
                self.choose_between_tenants(lane_state, now)
            }
            Hold::Never => lane_state.ready.first().map(|&(_, id)| Ok(id)),
            hold => lane_state.all.iter().find_map(|&(_, id)| {
                let job = self.jobs.get(&id)?;
                if !job.queue.is_empty() {
                    return Some(Ok(id));
                }
                if job.running > 0 {
                    return None;
                }
                match hold {
                    // A job that has not started its main iterations yet (a
                    // session opened and left idle) does not hold the lane.
                    Hold::Always if job.iterations > 0 => Some(Err(None)),
                    Hold::Always => None,
                    _ => job
                        .last_end
                        .map(|end| end.saturating_add(anticipation))
                        .filter(|&until| now < until)
                        .map(|until| Err(Some(until))),
                }
            }),
        };
        match chosen {
            Some(Ok(id)) => {
                let job = self.jobs.get_mut(&id).expect("indexed job exists");
                let pending = job.queue.pop_front().expect("ready job has work");
                job.running += 1;
                job.total_wait += now.saturating_sub(pending.submitted);
                let lane_state = self.lanes.get_mut(&lane).expect("lane exists");
                lane_state.running += 1;
                if job.queue.is_empty() {
                    lane_state.ready.remove(&(job.key, id));
                }
                Decision::Run(Dispatch {
                    job: id,
                    lane,
                    work: pending.work,
                    submitted: pending.submitted,
                })
            }
            Some(Err(Some(until))) => Decision::WaitUntil(until),
            Some(Err(None)) | None => Decision::Idle,
        }
    }

    /// Whether `lane` holds jobs of more than one tenant and shares between them.
    fn shares_between_tenants(&self, lane: &LaneState) -> bool {
        self.config.share == Share::Tenants && lane.tenant_jobs.len() > 1
    }

    /// The lane's choice when tenants share it: each tenant's turn is what the
    /// policy's walk over that tenant's jobs alone would decide; the tenant
    /// with the least virtual time whose turn is to run or to wait gets it.
    /// A `fifo` hold beyond the anticipation window keeps its own tenant's
    /// other jobs waiting, not other tenants'.
    fn choose_between_tenants(
        &self,
        lane: &LaneState,
        now: Nanos,
    ) -> Option<Result<JobId, Option<Nanos>>> {
        let hold = self.policy.hold();
        let anticipation = self.config.anticipation;
        let mut turns: Vec<(TenantId, TenantTurn)> = Vec::with_capacity(lane.tenant_jobs.len());
        for &(_, id) in &lane.all {
            if turns.len() == lane.tenant_jobs.len() {
                break;
            }
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            if turns.iter().any(|(tenant, _)| *tenant == job.tenant) {
                continue;
            }
            let turn = if !job.queue.is_empty() {
                TenantTurn::Run(id)
            } else if job.running > 0 {
                continue;
            } else {
                let active_until = job
                    .last_end
                    .map(|end| end.saturating_add(anticipation))
                    .filter(|&until| now < until);
                match hold {
                    Hold::Always if job.iterations > 0 => TenantTurn::Hold(active_until),
                    Hold::WhileActive if active_until.is_some() => TenantTurn::Hold(active_until),
                    _ => continue,
                }
            };
            turns.push((job.tenant, turn));
        }
        turns.sort_by_key(|(tenant, _)| (self.tenants.vtime(*tenant), *tenant));
        turns.into_iter().find_map(|(_, turn)| match turn {
            TenantTurn::Run(id) => Some(Ok(id)),
            TenantTurn::Hold(Some(until)) => Some(Err(Some(until))),
            TenantTurn::Hold(None) => None,
        })
    }

    /// Records that an iteration of `job` dispatched by [`Self::next`] ended;
    /// `device_time` is charged to the job (`None`: it never ran).
    pub fn finish(&mut self, job: JobId, lane: LaneId, device_time: Option<Nanos>, now: Nanos) {
        if let Some(state) = self.jobs.get_mut(&job) {
            self.tenants.finished(state.tenant, device_time, now);
            state.running = state.running.saturating_sub(1);
            if let Some(t) = device_time {
                state.record_iterations(t, 1, now);
            }
            self.rekey(job);
        }
        if let Some(lane_state) = self.lanes.get_mut(&lane) {
            lane_state.running = lane_state.running.saturating_sub(1);
            if lane_state.all.is_empty() && lane_state.running == 0 {
                self.lanes.remove(&lane);
            }
        }
    }

    /// Records `count` iterations of `job` that ran back to back, `device_time`
    /// in all, the last ending at `now`, each followed at once by the job's next
    /// iteration, which is running now. This leaves the state that `count`
    /// rounds of [`Self::finish`], [`Self::submit`] and a [`Self::next`]
    /// dispatching `job` again leave, provided [`Self::can_defer_boundary`]
    /// held before the first of them and nothing else was called meanwhile.
    /// The simulator uses it to step over stretches where no decision can
    /// differ.
    pub fn finish_repeated(&mut self, job: JobId, device_time: Nanos, count: u64, now: Nanos) {
        let Some(state) = self.jobs.get_mut(&job) else {
            return;
        };
        if count == 0 {
            return;
        }
        state.record_iterations(device_time, count, now);
        self.tenants.charge(state.tenant, device_time);
        self.rekey(job);
    }

    /// Whether the iteration of `id` that is running now may end without a
    /// decision, left to [`Self::finish_repeated`]: whatever `finish`,
    /// `submit` and `next` would do then is known to be "run `id` again".
    /// That holds when its iteration is the only one in flight on its lane,
    /// the policy re-keys a job only when the job changes (no
    /// [`Policy::refresh_interval`]), and either `id` is alone on its lane or
    /// its key cannot change ([`Policy::key_is_fixed`]) and ranks ahead of
    /// every job `next` would consider. A driver that keeps calling nothing
    /// else meanwhile may rely on the answer until its next other call.
    pub fn can_defer_boundary(&self, id: JobId) -> bool {
        if self.policy.refresh_interval().is_some() {
            return false;
        }
        let Some(job) = self.jobs.get(&id) else {
            return false;
        };
        let Some(lane) = self.lanes.get(&job.lane) else {
            return false;
        };
        if job.running != 1 || lane.running != 1 {
            return false;
        }
        if lane.all.len() == 1 {
            return true;
        }
        if !self.policy.key_is_fixed()
            || self.shares_between_tenants(lane)
            || self.config.lane_concurrency != 1
        {
            return false;
        }
        let rivals = match self.policy.hold() {
            Hold::Never => &lane.ready,
            Hold::WhileActive | Hold::Always => &lane.all,
        };
        rivals
            .iter()
            .find(|&&(_, other)| other != id)
            .is_none_or(|&(key, _)| job.key < key)
    }

    /// Whether the lane exists (has jobs or a running iteration).
    pub fn has_lane(&self, lane: LaneId) -> bool {
        self.lanes.contains_key(&lane)
    }

    pub fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    pub fn lanes(&self) -> Vec<LaneId> {
        let mut lanes: Vec<_> = self.lanes.keys().copied().collect();
        lanes.sort();
        lanes
    }

    pub fn queued(&self) -> usize {
        self.jobs.values().map(|j| j.queue.len()).sum()
    }

    pub fn status(&self, id: JobId) -> Option<JobStatus> {
        let j = self.jobs.get(&id)?;
        Some(JobStatus {
            id,
            lane: j.lane,
            tenant: j.tenant,
            hints: j.hints.clone(),
            arrival: j.arrival,
            attained: j.attained,
            service: j.service(),
            iterations: j.iterations,
            mean_iteration: j.mean_iteration(),
            remaining: j.remaining(),
            queued: j.queue.len(),
            running: j.running,
            total_wait: j.total_wait,
            identity: j.identity.clone(),
            expected: j.identity.as_ref().and_then(|i| self.history.estimate(i)),
        })
    }

    pub fn job_ids(&self) -> Vec<JobId> {
        let mut ids: Vec<_> = self.jobs.keys().copied().collect();
        ids.sort();
        ids
    }
}

#[cfg(test)]
mod history_tests;
#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tests;
