//! The simulation: a trace's jobs through the server's own scheduler core in
//! virtual time.
//!
//! # The device model (stated, since the results rest on it)
//! Every running iteration (or, for `mps`, every job's current iteration) is an
//! *activity* with its model's `iteration_s` of work and `utilization` u. The
//! device runs all activities at once at a common rate: with demand D = sum u
//! over k activities, each progresses at 1 / max(1, D x (1 + i)) seconds of
//! work per second when k > 1 (1 when alone), i being the interference
//! (`--interference`, default 0.1: sharing a saturated device loses 10% to
//! contention, however many share it). Activities that together need less
//! than the whole device run at full speed, so packing gains only where jobs
//! leave the device idle. Device utilization is the useful work rate,
//! D x rate, capped at 1.
//!
//! # The schedules
//! - Salus policies (`fifo`, `srtf`, `pack`, `fair`, `rr`, `priority`, `las`, `dlas`, `gittins`):
//!   the server's [`Scheduler`] decides per lane at each iteration boundary, one
//!   iteration in flight per lane; with a capacity, the server's
//!   [`LaneManager`] assigns lanes at a job's first iteration (as the server's
//!   admission does) and lanes run concurrently; without one, all jobs share
//!   one lane (as the server without `--memory-capacity`). Jobs carry hints:
//!   `iterations` from the trace, `seconds` from its `duration_s` (none at
//!   all with [`SimConfig::length_hints`] off).
//! - `exclusive`: one job at a time in arrival order, the whole device.
//! - `mps`: jobs start in arrival order (a later one may pass an earlier one
//!   that does not fit) while the sum of persistent + ephemeral memory of the
//!   running jobs fits the capacity (no capacity: all start), and run at once.
//!
//! A job arrives at its submit time, spends its `startup_s` off the device,
//! then runs its iterations back to back (its next iteration is submitted the
//! moment the previous one ends, as a training loop does).
//!
//! # Users
//! A trace's `user` column names each job's owner. The engine adds every job
//! with [`Scheduler::add_tenant_job`], one [`TenantId`] per user name (the
//! names sorted, numbered from 1; jobs without a user are
//! [`TenantId::NONE`]), so under [`Share::Tenants`] a lane shares device
//! time between users first. [`SimConfig::weights`] sets users' weights.
//! A job with a `name` is added with [`Scheduler::add_identified_job`]
//! (identity: user, name, model), asks for its lane ranked by
//! [`Scheduler::rank_new_as`], and ends with [`Scheduler::end_job`], so the
//! scheduler's history learns its run exactly as the server's would; the
//! history starts from [`SimConfig::history`] plus the trace's `past_s`.
//! Each result has every user's device time (the wall time of its
//! iterations, as the scheduler charges it) and, for a trace that names
//! users, [`SimResult::user_timeline`]: who has work when, and each user's
//! device time so far, at every change.
//!
//! # Stepping
//! Every iteration boundary is a scheduling decision. [`Stepping::EveryIteration`]
//! asks the scheduler at each one. [`Stepping::FastForward`] (the default)
//! skips the scheduler where its answer cannot differ: a job alone on its
//! lane that ends an iteration which is not its last runs its next one at
//! once, whatever the policy, so the engine starts it itself and hands the
//! scheduler the deferred iterations in one call
//! ([`Scheduler::finish_repeated`]) before anything else happens (an arrival,
//! a timer, any other boundary). Virtual time, device progress and the
//! timeline are still stepped iteration by iteration with the same
//! arithmetic, so both modes give bit-identical results; only the
//! scheduler's bookkeeping is batched.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, VecDeque};

use salus_sched::policy::population::Estimator;
use salus_sched::lanes::{LaneManager, LaneRule, MemoryNeed, Placement};
use salus_sched::{
    policy, Decision, Hints, History, JobId, JobIdentity, LaneId, Nanos, RunEnd, SchedConfig,
    Scheduler, Share, TenantId,
};

use crate::trace::TraceJob;
use crate::workload::WorkloadTable;
use crate::SimError;

/// The schedules besides the server's policies.
pub const BASELINES: &[&str] = &["exclusive", "mps"];

/// How the engine steps over iteration boundaries (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Stepping {
    /// The scheduler decides every iteration boundary.
    EveryIteration,
    /// A job alone on its lane continues without asking the scheduler.
    #[default]
    FastForward,
}

#[cfg(test)]
thread_local! {
    /// Tests run whole experiments (which build their own configs) under one
    /// stepping, to compare the two.
    static STEPPING_OVERRIDE: std::cell::Cell<Option<Stepping>> =
        const { std::cell::Cell::new(None) };
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    /// A server policy, `exclusive` or `mps`.
    pub policy: String,
    /// Device memory in bytes; None: no memory limit (one lane).
    pub capacity: Option<u64>,
    pub interference: f64,
    pub sched: SchedConfig,
    pub stepping: Stepping,
    /// How dynamic lanes are assigned when memory is short (with a capacity).
    pub lane_rule: LaneRule,
    /// Users' weights (1 to [`salus_sched::tenants::MAX_WEIGHT`]; default
    /// 1): their shares of device time against each other under
    /// [`Share::Tenants`]. Every user named must be in the trace.
    pub weights: Vec<(String, u32)>,
    /// Whether jobs tell the scheduler their length (`iterations` and
    /// `seconds` hints); off: policies must learn lengths (`learned`).
    pub length_hints: bool,
    /// Past runs the scheduler knows before the trace (a history file); the
    /// trace's `past_s` are added to it.
    pub history: Option<History>,
    /// How `learned` estimates the law of jobs without history.
    pub estimator: Estimator,
}

impl SimConfig {
    pub fn new(policy: &str) -> SimConfig {
        SimConfig {
            policy: policy.to_string(),
            capacity: None,
            interference: 0.1,
            sched: SchedConfig::default(),
            stepping: Stepping::default(),
            lane_rule: LaneRule::default(),
            weights: Vec::new(),
            length_hints: true,
            history: None,
            estimator: Estimator::default(),
        }
    }

    /// The same with lanes shared by `share`.
    pub fn with_share(mut self, share: Share) -> SimConfig {
        self.sched.share = share;
        self
    }
}

/// Parses a `USER=WEIGHT` argument (`--weight alice=3`).
pub fn parse_weight(text: &str) -> Result<(String, u32), String> {
    let (user, weight) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected USER=WEIGHT, e.g. alice=2"))?;
    let user = user.trim();
    if !crate::trace::valid_user(user) {
        return Err(format!("{text:?}: {user:?} is not a user name"));
    }
    let max = salus_sched::tenants::MAX_WEIGHT;
    let weight = weight
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|w| (1..=max).contains(w))
        .ok_or_else(|| format!("{text:?}: the weight must be a whole number from 1 to {max}"))?;
    Ok((user.to_string(), weight))
}

/// One job's fate.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutcome {
    pub job_id: String,
    pub model: String,
    pub arrival_s: f64,
    /// Start of its first iteration.
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub lane: Option<u32>,
    /// Why it never ran (larger than the device).
    pub refused: Option<String>,
    /// Its owner; None: no user.
    pub user: Option<String>,
}

impl JobOutcome {
    pub fn jct_s(&self) -> Option<f64> {
        self.end_s.map(|end| end - self.arrival_s)
    }
}

/// From `start_s` until the next point: device utilization, lanes open, jobs
/// holding memory or a lane.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub start_s: f64,
    pub utilization: f64,
    pub lanes: usize,
    pub running: usize,
}

/// A user's (tenant's) part of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct UserUsage {
    /// None: the jobs without a user.
    pub name: Option<String>,
    pub tenant: TenantId,
    pub weight: u32,
    /// Wall time of its jobs' iterations, seconds: device time as the
    /// scheduler charges it (on one lane, the time the lane ran them).
    pub device_s: f64,
    /// The scheduler core's own count ([`Scheduler::tenant_status`]), for
    /// the server's policies; None for the baselines.
    pub scheduler_device_s: Option<f64>,
}

/// A change in which users have work: from `t` on, `busy[u]` says whether
/// user `u` (index into [`SimResult::users`]) has work, and `device_s[u]` is
/// its device time up to `t`, iterations in flight counted up to `t`. A user
/// has work from the moment a job of its is past start-up (it asks for its
/// first iteration or its lane) until its last job's last iteration ends; a
/// training job keeps an iteration queued or running all that time.
#[derive(Clone, Debug, PartialEq)]
pub struct UserPoint {
    pub t: f64,
    pub busy: Vec<bool>,
    pub device_s: Vec<f64>,
}

#[derive(Clone, Debug)]
pub struct SimResult {
    pub policy: String,
    pub jobs: Vec<JobOutcome>,
    /// Change points of utilization, lanes and running jobs.
    pub timeline: Vec<Point>,
    /// Integral of utilization over time, device-seconds.
    pub busy_s: f64,
    /// Iterations simulated: each boundary is one scheduling decision.
    pub iterations: u64,
    /// Of those, boundaries fast-forwarded past the scheduler (see [`Stepping`]).
    pub fast_forwarded: u64,
    /// Every user of the trace, jobs without a user first (if any), then by
    /// name: the order of [`UserPoint`]'s vectors.
    pub users: Vec<UserUsage>,
    /// Only for traces that name a user (empty otherwise: nothing to compare).
    pub user_timeline: Vec<UserPoint>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);

impl Eq for Time {}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

// The heaps compare with `<=`: one order for both, the total one.
impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    /// Start-up done: the job asks for its first iteration.
    Ready(usize),
    /// A lane's anticipation window ends.
    Timer(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Salus,
    Exclusive,
    Mps,
}

struct Job {
    iteration_s: f64,
    utilization: f64,
    startup_s: f64,
    need: MemoryNeed,
    total: u64,
    done: u64,
    hints: Hints,
    /// Who it is for the scheduler's history; None: not followed.
    identity: Option<JobIdentity>,
    lane: Option<LaneId>,
    /// When its current iteration started.
    iteration_start: f64,
    running: bool,
    /// Fast-forwarded iterations the scheduler has not been told of yet, and
    /// their device time.
    deferred_iterations: u64,
    deferred_time: Nanos,
    /// The scheduler's `can_defer_boundary`, as of the slow step counted.
    deferrable: bool,
    deferrable_as_of: Option<u64>,
    /// Index into the users, and that user's tenant.
    user: usize,
    tenant: TenantId,
    /// Past start-up, not yet done (see [`UserPoint`]).
    has_work: bool,
    outcome: JobOutcome,
}

struct Sim {
    mode: Mode,
    interference: f64,
    capacity: Option<u64>,
    t: f64,
    /// Work-seconds every activity has progressed since the start.
    v: f64,
    /// Activities by the value of `v` at which they end.
    active: BinaryHeap<Reverse<(Time, usize)>>,
    demand: f64,
    events: BinaryHeap<Reverse<(Time, u64, Event)>>,
    seq: u64,
    jobs: Vec<Job>,
    sched: Scheduler<usize>,
    lanes: Option<LaneManager>,
    timers: HashMap<u32, f64>,
    /// `exclusive` and `mps`: jobs not started yet, in arrival order.
    queue: VecDeque<usize>,
    /// `mps`: memory of the started jobs; `exclusive`: whether one runs.
    used: u64,
    running_jobs: usize,
    timeline: Vec<Point>,
    busy_s: f64,
    iterations: u64,
    fast_forward: bool,
    /// Jobs with deferred iterations.
    deferred: Vec<usize>,
    fast_forwarded: u64,
    /// Steps that called the scheduler or lane manager (any but a deferred
    /// boundary): what the scheduler answered before one may differ after.
    slow_steps: u64,
    /// Per user: device time of its ended iterations, jobs with work.
    user_device_s: Vec<f64>,
    user_jobs_with_work: Vec<usize>,
    /// Whether to record [`UserPoint`]s.
    track_users: bool,
    user_timeline: Vec<UserPoint>,
}

fn ns(seconds: f64) -> Nanos {
    (seconds * 1e9).round().max(0.0) as Nanos
}

/// Runs `trace` with `table` under `config`.
pub fn simulate(
    trace: &[TraceJob],
    table: &WorkloadTable,
    config: &SimConfig,
) -> Result<SimResult, SimError> {
    let (mode, policy) = match config.policy.as_str() {
        "exclusive" => (Mode::Exclusive, policy::by_name("fifo")),
        "mps" => (Mode::Mps, policy::by_name("fifo")),
        "learned" => (
            Mode::Salus,
            Ok(Box::new(policy::Learned::with_estimator(config.estimator)) as Box<dyn policy::Policy>),
        ),
        name => (Mode::Salus, policy::by_name(name)),
    };
    let policy = policy
        .map_err(|e| SimError::Invalid(format!("{e}, or a baseline: {}", BASELINES.join(", "))))?;
    if !(config.interference >= 0.0 && config.interference.is_finite()) {
        return Err(SimError::Invalid(
            "interference must be a number >= 0".into(),
        ));
    }
    #[cfg(test)]
    let stepping = STEPPING_OVERRIDE
        .with(|forced| forced.get())
        .unwrap_or(config.stepping);
    #[cfg(not(test))]
    let stepping = config.stepping;
    // Users: jobs without one (TenantId::NONE) first, then by name, numbered from 1.
    let names = crate::trace::users(trace);
    let anonymous = trace.iter().any(|t| t.user.is_none());
    let mut users: Vec<UserUsage> = Vec::with_capacity(names.len() + 1);
    if anonymous {
        users.push(UserUsage {
            name: None,
            tenant: TenantId::NONE,
            weight: salus_sched::tenants::DEFAULT_WEIGHT,
            device_s: 0.0,
            scheduler_device_s: None,
        });
    }
    for (i, name) in names.iter().enumerate() {
        users.push(UserUsage {
            name: Some(name.clone()),
            tenant: TenantId(i as u64 + 1),
            weight: salus_sched::tenants::DEFAULT_WEIGHT,
            device_s: 0.0,
            scheduler_device_s: None,
        });
    }
    let mut sched = Scheduler::new(policy, config.sched);
    let mut history = config.history.clone().unwrap_or_default();
    crate::trace::seed_history(trace, &mut history);
    sched.set_history(history);
    for (k, (name, weight)) in config.weights.iter().enumerate() {
        if config.weights[..k].iter().any(|(other, _)| other == name) {
            return Err(SimError::Invalid(format!(
                "user {name:?} is given a weight twice"
            )));
        }
        let Some(user) = users
            .iter_mut()
            .find(|u| u.name.as_deref() == Some(name.as_str()))
        else {
            return Err(SimError::Invalid(format!(
                "a weight for user {name:?}, who has no job in the trace (users: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )));
        };
        sched
            .set_tenant_weight(user.tenant, *weight)
            .map_err(|e| SimError::Invalid(format!("user {name:?}: {e}")))?;
        user.weight = *weight;
    }
    let mut jobs = Vec::with_capacity(trace.len());
    for t in trace {
        let w = table.get(&t.model)?;
        let user = users
            .iter()
            .position(|u| u.name == t.user)
            .expect("every user of the trace is listed");
        jobs.push(Job {
            iteration_s: w.iteration_s,
            utilization: w.utilization,
            startup_s: w.startup_s,
            need: MemoryNeed {
                persistent: w.persistent_bytes,
                ephemeral: w.ephemeral_bytes,
            },
            total: t.iterations,
            done: 0,
            hints: Hints {
                name: t.model.clone(),
                expected_iterations: Some(t.iterations).filter(|_| config.length_hints),
                expected_seconds: t.duration_s.filter(|_| config.length_hints),
                ..Hints::default()
            },
            identity: t.identity(),
            lane: None,
            iteration_start: 0.0,
            running: false,
            deferred_iterations: 0,
            deferred_time: 0,
            deferrable: false,
            deferrable_as_of: None,
            user,
            tenant: users[user].tenant,
            has_work: false,
            outcome: JobOutcome {
                job_id: t.job_id.clone(),
                model: t.model.clone(),
                arrival_s: t.submit_s,
                start_s: None,
                end_s: None,
                lane: None,
                refused: None,
                user: t.user.clone(),
            },
        });
    }
    let mut sim = Sim {
        mode,
        interference: config.interference,
        capacity: config.capacity,
        t: 0.0,
        v: 0.0,
        active: BinaryHeap::new(),
        demand: 0.0,
        events: BinaryHeap::new(),
        seq: 0,
        jobs,
        sched,
        lanes: (mode == Mode::Salus)
            .then_some(config.capacity)
            .flatten()
            .map(|capacity| LaneManager::with_rule(capacity, config.lane_rule)),
        timers: HashMap::new(),
        queue: VecDeque::new(),
        used: 0,
        running_jobs: 0,
        timeline: Vec::new(),
        busy_s: 0.0,
        iterations: 0,
        fast_forward: mode == Mode::Salus && stepping == Stepping::FastForward,
        deferred: Vec::new(),
        fast_forwarded: 0,
        slow_steps: 0,
        user_device_s: vec![0.0; users.len()],
        user_jobs_with_work: vec![0; users.len()],
        track_users: !names.is_empty(),
        user_timeline: Vec::new(),
    };
    for (i, job) in trace.iter().enumerate() {
        sim.at(job.submit_s, Event::Arrive(i));
    }
    sim.run();
    sim.tell_deferred();
    let charged = sim.sched.tenant_status();
    for (user, device_s) in users.iter_mut().zip(&sim.user_device_s) {
        user.device_s = *device_s;
        if mode == Mode::Salus {
            let service = charged
                .iter()
                .find(|t| t.id == user.tenant)
                .map_or(0, |t| t.service);
            user.scheduler_device_s = Some(service as f64 / 1e9);
        }
    }
    Ok(SimResult {
        policy: config.policy.clone(),
        jobs: sim.jobs.into_iter().map(|j| j.outcome).collect(),
        timeline: sim.timeline,
        busy_s: sim.busy_s,
        iterations: sim.iterations,
        fast_forwarded: sim.fast_forwarded,
        users,
        user_timeline: sim.user_timeline,
    })
}

impl Sim {
    fn at(&mut self, time: f64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((Time(time), self.seq, event)));
    }

    fn now(&self) -> Nanos {
        ns(self.t)
    }

    /// Work-seconds per second every activity gets now.
    fn rate(&self) -> f64 {
        let k = self.active.len();
        if k <= 1 {
            return 1.0;
        }
        let load = self.demand * (1.0 + self.interference);
        1.0 / load.max(1.0)
    }

    fn advance(&mut self, to: f64) {
        let dt = (to - self.t).max(0.0);
        let rate = self.rate();
        self.busy_s += (self.demand * rate).min(1.0) * dt;
        self.v += rate * dt;
        self.t = to.max(self.t);
    }

    fn run(&mut self) {
        loop {
            let next_event = self.events.peek().map(|Reverse((t, _, _))| t.0);
            let next_done = self
                .active
                .peek()
                .map(|Reverse((end_v, _))| self.t + (end_v.0 - self.v).max(0.0) / self.rate());
            let done_first = match (next_done, next_event) {
                (Some(done), Some(event)) => done <= event,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            match (next_done, next_event) {
                (Some(done), _) if done_first => {
                    self.advance(done);
                    let Reverse((_, job)) = self.active.pop().expect("peeked");
                    self.demand -= self.jobs[job].utilization;
                    if self.active.is_empty() {
                        self.demand = 0.0;
                    }
                    if self.boundary_is_foregone(job) {
                        self.continue_deferred(job);
                    } else {
                        self.tell_deferred();
                        self.iteration_done(job);
                    }
                }
                (_, Some(event)) => {
                    self.tell_deferred();
                    self.advance(event);
                    let Reverse((_, _, event)) = self.events.pop().expect("peeked");
                    match event {
                        Event::Arrive(job) => self.arrive(job),
                        Event::Ready(job) => self.ready(job),
                        Event::Timer(lane) => {
                            self.timers.remove(&lane);
                            self.poll(LaneId(lane));
                        }
                    }
                }
                _ => break,
            }
            self.record();
        }
    }

    fn record(&mut self) {
        let k = self.active.len();
        let point = Point {
            start_s: self.t,
            utilization: (self.demand * self.rate()).min(1.0) * (k > 0) as u8 as f64,
            lanes: match (&self.lanes, self.mode) {
                (Some(lanes), _) => lanes.lane_count(),
                (None, Mode::Salus) => self.sched.lane_count(),
                (None, _) => 0,
            },
            running: self.running_jobs,
        };
        match self.timeline.last_mut() {
            Some(last)
                if (last.utilization, last.lanes, last.running)
                    == (point.utilization, point.lanes, point.running) => {}
            Some(last) if last.start_s == point.start_s => *last = point,
            _ => self.timeline.push(point),
        }
    }

    fn start_iteration(&mut self, job: usize) {
        let j = &mut self.jobs[job];
        j.iteration_start = self.t;
        j.outcome.start_s.get_or_insert(self.t);
        self.demand += j.utilization;
        let end_v = self.v + j.iteration_s;
        self.active.push(Reverse((Time(end_v), job)));
    }

    fn arrive(&mut self, job: usize) {
        match self.mode {
            Mode::Salus if self.lanes.is_none() => {
                // Without memory lanes the server schedules a job from its session's creation.
                self.add_to_scheduler(job, LaneId(0));
                self.jobs[job].lane = Some(LaneId(0));
                self.admitted(job);
            }
            Mode::Salus => self.at(self.t + self.jobs[job].startup_s, Event::Ready(job)),
            Mode::Exclusive | Mode::Mps => {
                self.queue.push_back(job);
                self.start_queued();
            }
        }
    }

    /// The job holds its lane or memory: start-up, then its first iteration.
    fn admitted(&mut self, job: usize) {
        self.running_jobs += 1;
        self.jobs[job].running = true;
        if self.mode == Mode::Salus && self.lanes.is_some() {
            // Admission happens at the first iteration, after start-up.
            self.submit(job);
        } else {
            self.at(self.t + self.jobs[job].startup_s, Event::Ready(job));
        }
    }

    fn ready(&mut self, job: usize) {
        self.work_starts(job);
        self.report_busy_lanes();
        match self.mode {
            Mode::Salus => match &mut self.lanes {
                None => self.submit(job),
                Some(lanes) => match lanes.request_ranked(
                    JobId(job as u64),
                    self.jobs[job].need,
                    None,
                    self.sched.rank_new_as(
                        JobId(job as u64),
                        self.jobs[job].identity.as_ref(),
                        &self.jobs[job].hints,
                        ns(self.t),
                    ),
                ) {
                    Ok(Placement::Placed(lane)) => {
                        self.apply_moves();
                        self.place(job, lane)
                    }
                    Ok(Placement::Waiting) => {}
                    Err(err) => {
                        self.jobs[job].outcome.refused = Some(err.to_string());
                        self.work_ends(job);
                    }
                },
            },
            Mode::Exclusive | Mode::Mps => self.start_iteration(job),
        }
    }

    /// Tells the lane manager which lanes run iterations (`pack` merges idle ones).
    fn report_busy_lanes(&mut self) {
        let now = self.now();
        if let Some(lanes) = self.lanes.as_mut().filter(|l| l.rule() == LaneRule::Pack) {
            lanes.set_busy_lanes(self.sched.busy_lanes(now));
        }
    }

    /// Jobs a lane merge moved: they time-share their new lane from their next
    /// iteration on (the lane runs nothing new until their running ones end).
    fn apply_moves(&mut self) {
        let moved = self
            .lanes
            .as_mut()
            .map(|l| l.take_moved())
            .unwrap_or_default();
        let mut targets = Vec::new();
        for (id, lane) in moved {
            if self.sched.move_job(id, lane).is_ok() {
                let j = &mut self.jobs[id.0 as usize];
                j.lane = Some(lane);
                j.outcome.lane = Some(lane.0);
                targets.push(lane);
            }
        }
        targets.dedup();
        for lane in targets {
            self.poll(lane);
        }
    }

    /// Salus with lanes: the lane manager placed the job.
    fn place(&mut self, job: usize, lane: LaneId) {
        self.add_to_scheduler(job, lane);
        self.jobs[job].lane = Some(lane);
        self.jobs[job].outcome.lane = Some(lane.0);
        self.admitted(job);
    }

    /// Adds `job` to the scheduler on `lane`, with its identity if it has one.
    fn add_to_scheduler(&mut self, job: usize, lane: LaneId) {
        let j = &self.jobs[job];
        let (id, hints, now, tenant) = (JobId(job as u64), j.hints.clone(), self.now(), j.tenant);
        let _ = match j.identity.clone() {
            Some(identity) => self
                .sched
                .add_identified_job(id, lane, tenant, identity, hints, now),
            None => self.sched.add_tenant_job(id, lane, tenant, hints, now),
        };
    }

    fn submit(&mut self, job: usize) {
        let now = self.now();
        if let Ok(lane) = self.sched.submit(JobId(job as u64), job, now) {
            self.poll(lane);
        }
    }

    /// Lets a lane run what its policy picks.
    fn poll(&mut self, lane: LaneId) {
        loop {
            match self.sched.next(lane, self.now()) {
                Decision::Run(dispatch) => self.start_iteration(dispatch.work),
                Decision::WaitUntil(until) => {
                    let until = until as f64 / 1e9;
                    let earlier = self.timers.get(&lane.0).is_none_or(|&t| until < t);
                    if earlier {
                        self.timers.insert(lane.0, until);
                        self.at(until, Event::Timer(lane.0));
                    }
                    return;
                }
                Decision::Idle => return,
            }
        }
    }

    /// Fast-forward: whether `job`, whose iteration just ended, runs its next
    /// one at once with nothing for the scheduler to decide: it has more to
    /// run and the scheduler says its next boundary is a foregone decision.
    /// The answer holds until the scheduler is next called, so it is asked
    /// once per job between two slow steps.
    fn boundary_is_foregone(&mut self, job: usize) -> bool {
        if !self.fast_forward {
            return false;
        }
        let j = &self.jobs[job];
        if j.done + 1 >= j.total {
            return false;
        }
        if j.deferrable_as_of != Some(self.slow_steps) {
            let deferrable = self.sched.can_defer_boundary(JobId(job as u64));
            let j = &mut self.jobs[job];
            j.deferrable = deferrable;
            j.deferrable_as_of = Some(self.slow_steps);
        }
        self.jobs[job].deferrable
    }

    /// [`Self::iteration_done`] for a job that [`Self::boundary_is_foregone`], the
    /// scheduler's part deferred to [`Self::tell_deferred`].
    fn continue_deferred(&mut self, job: usize) {
        self.iterations += 1;
        self.fast_forwarded += 1;
        let j = &mut self.jobs[job];
        j.done += 1;
        self.user_device_s[j.user] += self.t - j.iteration_start;
        // Rounded per iteration, as each `finish` would be charged.
        j.deferred_time += ns(self.t - j.iteration_start);
        if j.deferred_iterations == 0 {
            self.deferred.push(job);
        }
        j.deferred_iterations += 1;
        self.start_iteration(job);
    }

    /// Hands the scheduler every deferred iteration: it then holds exactly
    /// what deciding each boundary would have left.
    fn tell_deferred(&mut self) {
        self.slow_steps += 1;
        for job in std::mem::take(&mut self.deferred) {
            let j = &mut self.jobs[job];
            let count = std::mem::take(&mut j.deferred_iterations);
            let time = std::mem::take(&mut j.deferred_time);
            // The last deferred boundary is when the running iteration started.
            let last_end = ns(j.iteration_start);
            self.sched
                .finish_repeated(JobId(job as u64), time, count, last_end);
        }
    }

    fn iteration_done(&mut self, job: usize) {
        self.iterations += 1;
        let now = self.now();
        let j = &mut self.jobs[job];
        j.done += 1;
        let finished = j.done >= j.total;
        let elapsed = ns(self.t - j.iteration_start);
        self.user_device_s[j.user] += self.t - j.iteration_start;
        if finished {
            j.outcome.end_s = Some(self.t);
            j.running = false;
            self.running_jobs -= 1;
            self.work_ends(job);
        }
        let j = &self.jobs[job];
        match self.mode {
            Mode::Salus => {
                let lane = j.lane.expect("a running job has a lane");
                self.sched
                    .finish(JobId(job as u64), lane, Some(elapsed), now);
                if !finished {
                    self.submit(job);
                    return;
                }
                let _ = self.sched.end_job(JobId(job as u64), RunEnd::Completed);
                self.report_busy_lanes();
                let admitted = self
                    .lanes
                    .as_mut()
                    .map(|l| l.release(JobId(job as u64)))
                    .unwrap_or_default();
                self.apply_moves();
                for (id, lane) in admitted {
                    self.place(id.0 as usize, lane);
                }
                self.poll(lane);
            }
            Mode::Exclusive | Mode::Mps if !finished => self.start_iteration(job),
            Mode::Exclusive | Mode::Mps => {
                self.used -= self.memory_of(job);
                self.start_queued();
            }
        }
    }

    /// `job` is past start-up: its user has work (see [`UserPoint`]).
    fn work_starts(&mut self, job: usize) {
        let j = &mut self.jobs[job];
        if j.has_work {
            return;
        }
        j.has_work = true;
        let user = j.user;
        self.user_jobs_with_work[user] += 1;
        if self.user_jobs_with_work[user] == 1 {
            self.record_users();
        }
    }

    /// `job` ended or was refused.
    fn work_ends(&mut self, job: usize) {
        let j = &mut self.jobs[job];
        if !j.has_work {
            return;
        }
        j.has_work = false;
        let user = j.user;
        self.user_jobs_with_work[user] -= 1;
        if self.user_jobs_with_work[user] == 0 {
            self.record_users();
        }
    }

    /// A [`UserPoint`] now, iterations in flight counted up to now.
    fn record_users(&mut self) {
        if !self.track_users {
            return;
        }
        let mut device_s = self.user_device_s.clone();
        for Reverse((_, job)) in self.active.iter() {
            let j = &self.jobs[*job];
            device_s[j.user] += self.t - j.iteration_start;
        }
        self.user_timeline.push(UserPoint {
            t: self.t,
            busy: self.user_jobs_with_work.iter().map(|&n| n > 0).collect(),
            device_s,
        });
    }

    fn memory_of(&self, job: usize) -> u64 {
        match self.mode {
            Mode::Exclusive => 1,
            _ => self.jobs[job].need.limit(),
        }
    }

    /// `exclusive` and `mps`: starts queued jobs that fit, in arrival order.
    fn start_queued(&mut self) {
        let mut still_waiting = VecDeque::new();
        while let Some(job) = self.queue.pop_front() {
            let need = self.memory_of(job);
            let capacity = match self.mode {
                Mode::Exclusive => 1,
                _ => self.capacity.unwrap_or(u64::MAX),
            };
            if need > capacity {
                self.jobs[job].outcome.refused =
                    Some(format!("needs {need} bytes, the device has {capacity}"));
            } else if self.used + need <= capacity
                && (self.mode == Mode::Mps || still_waiting.is_empty())
            {
                self.used += need;
                self.admitted(job);
            } else {
                still_waiting.push_back(job);
            }
        }
        self.queue = still_waiting;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceJob;

    const TABLE: &str = "model,iteration_s,persistent_mb,ephemeral_mb,utilization,startup_s\n\
        a,1,1,1,1,0\nhalf,1,1,1,0.5,0\nslow_start,1,1,1,1,2\n";

    fn job(id: &str, model: &str, iterations: u64, submit_s: f64) -> TraceJob {
        TraceJob {
            job_id: id.into(),
            model: model.into(),
            iterations,
            submit_s,
            duration_s: Some(iterations as f64),
            user: None,
            name: None,
            past_s: Vec::new(),
        }
    }

    fn owned(id: &str, user: &str, iterations: u64, submit_s: f64) -> TraceJob {
        TraceJob {
            user: Some(user.into()),
            ..job(id, "a", iterations, submit_s)
        }
    }

    fn run(trace: &[TraceJob], policy: &str, capacity_mib: Option<u64>) -> SimResult {
        let config = SimConfig {
            capacity: capacity_mib.map(|m| m << 20),
            interference: 0.0,
            ..SimConfig::new(policy)
        };
        simulate(trace, &WorkloadTable::parse(TABLE).unwrap(), &config).unwrap()
    }

    fn ends(result: &SimResult) -> Vec<f64> {
        result.jobs.iter().map(|j| j.end_s.unwrap()).collect()
    }

    fn close(actual: &[f64], expected: &[f64]) {
        assert_eq!(actual.len(), expected.len());
        for (a, e) in actual.iter().zip(expected) {
            assert!((a - e).abs() < 1e-6, "{actual:?} != {expected:?}");
        }
    }

    #[test]
    fn one_lane_fifo_runs_jobs_in_turn_and_srtf_lets_the_short_one_pass() {
        let trace = [job("x", "a", 3, 0.0), job("y", "a", 1, 0.5)];
        // FIFO: x 0-3, y 3-4.
        let fifo = run(&trace, "fifo", None);
        close(&ends(&fifo), &[3.0, 4.0]);
        assert_eq!(fifo.jobs[1].start_s, Some(3.0));
        // SRTF: at x's first boundary (t = 1) y has 1 s left against x's 2: y 1-2, x 2-4.
        close(&ends(&run(&trace, "srtf", None)), &[4.0, 2.0]);
        // Exclusive is FIFO without sharing here.
        close(&ends(&run(&trace, "exclusive", None)), &[3.0, 4.0]);
        let summary = crate::report::Summary::of(&fifo);
        assert_eq!((summary.makespan_s, summary.mean_jct_s), (4.0, 3.25));
        assert!((summary.mean_utilization - 1.0).abs() < 1e-9);
        assert_eq!(fifo.iterations, 4);
    }

    #[test]
    fn mps_shares_the_device_by_processor_sharing() {
        // x alone 0-0.5; both at half speed until y's 1 s of work is done at 2.5;
        // x then has 1.5 s of work done and finishes alone at 4.
        let trace = [job("x", "a", 3, 0.0), job("y", "a", 1, 0.5)];
        close(&ends(&run(&trace, "mps", None)), &[4.0, 2.5]);
        // Jobs that each use half the device run at full speed together.
        let halves = [job("x", "half", 2, 0.0), job("y", "half", 2, 0.0)];
        let result = run(&halves, "mps", None);
        close(&ends(&result), &[2.0, 2.0]);
        assert!((result.busy_s - 2.0).abs() < 1e-9, "{}", result.busy_s);
        // Interference slows a saturated device: 2 activities of u = 1 with 10%: rate 1 / 2.2.
        let config = SimConfig {
            interference: 0.1,
            ..SimConfig::new("mps")
        };
        let table = WorkloadTable::parse(TABLE).unwrap();
        let both = [job("x", "a", 1, 0.0), job("y", "a", 1, 0.0)];
        close(
            &ends(&simulate(&both, &table, &config).unwrap()),
            &[2.2, 2.2],
        );
        // MPS with memory: 2 MiB each, 3 MiB: the second waits for the first.
        close(&ends(&run(&both, "mps", Some(3))), &[1.0, 2.0]);
    }

    #[test]
    fn memory_lanes_share_by_the_rule_and_separate_lanes_run_at_once() {
        let both = [job("x", "a", 2, 0.0), job("y", "a", 2, 0.0)];
        // 3 MiB: y joins x's lane (1 + 1 + max(1, 1) = 3): they time-share, fifo.
        let shared = run(&both, "fifo", Some(3));
        close(&ends(&shared), &[2.0, 4.0]);
        assert_eq!(
            shared.jobs.iter().map(|j| j.lane).collect::<Vec<_>>(),
            [Some(0), Some(0)]
        );
        // 4 MiB: two lanes that run at once, each at half speed.
        let apart = run(&both, "fifo", Some(4));
        close(&ends(&apart), &[4.0, 4.0]);
        assert_eq!(crate::report::Summary::of(&apart).max_lanes, 2);
        // Half-utilization jobs in two lanes: full speed each.
        let halves = [job("x", "half", 2, 0.0), job("y", "half", 2, 0.0)];
        close(&ends(&run(&halves, "pack", Some(4))), &[2.0, 2.0]);
        // Larger than the device: refused, not run.
        let refused = run(&[job("x", "a", 1, 0.0)], "fifo", Some(1));
        assert!(refused.jobs[0]
            .refused
            .as_deref()
            .unwrap()
            .contains("device has"));
        assert_eq!(refused.jobs[0].end_s, None);
    }

    #[test]
    fn startup_happens_off_the_device() {
        // slow_start: 2 s off the device, then 1 s iterations; x runs meanwhile.
        let trace = [job("s", "slow_start", 1, 0.0), job("x", "a", 2, 0.0)];
        let result = run(&trace, "fifo", None);
        close(&ends(&result), &[3.0, 2.0]);
        assert_eq!(result.jobs[0].start_s, Some(2.0));
        let exclusive = run(&trace, "exclusive", None);
        close(&ends(&exclusive), &[3.0, 5.0]);
    }

    const EVAL_TABLE: &str = include_str!("../../eval/workloads.csv");

    /// Runs `f` with every simulation in it stepped by `stepping`.
    fn stepped<T>(stepping: Stepping, f: impl FnOnce() -> T) -> T {
        STEPPING_OVERRIDE.with(|forced| forced.set(Some(stepping)));
        let out = f();
        STEPPING_OVERRIDE.with(|forced| forced.set(None));
        out
    }

    /// Everything a run yields, floats by their exact bits (`{:?}` prints
    /// the shortest text that reads back to the same f64).
    fn fingerprint(result: &SimResult) -> String {
        format!(
            "{:?} {:?} {:?} {:?} {} {:?} {:?}",
            result.policy,
            result.jobs,
            result.timeline,
            result.busy_s,
            result.iterations,
            result.users,
            result.user_timeline
        )
    }

    /// Fast-forwarded runs equal per-iteration runs job by job, bit for bit,
    /// for every policy, baseline, lane rule and memory pressure; returns the
    /// boundaries fast-forwarded, so callers can check the comparison meant
    /// something.
    fn assert_same_both_ways(trace: &[TraceJob], table: &WorkloadTable, config: &SimConfig) -> u64 {
        let every = SimConfig {
            stepping: Stepping::EveryIteration,
            ..config.clone()
        };
        let fast = SimConfig {
            stepping: Stepping::FastForward,
            ..config.clone()
        };
        let slow = simulate(trace, table, &every).unwrap();
        let quick = simulate(trace, table, &fast).unwrap();
        assert_eq!(slow.fast_forwarded, 0);
        assert_eq!(
            fingerprint(&slow),
            fingerprint(&quick),
            "{config:?}: fast-forward differs from stepping every iteration"
        );
        quick.fast_forwarded
    }

    #[test]
    fn fast_forward_gives_exactly_the_per_iteration_results() {
        let table = WorkloadTable::parse(EVAL_TABLE).unwrap();
        let mut fast_forwarded = 0;
        let mut runs = 0;
        for (seed, mean_interarrival_s) in [(1, 0.0), (2, 4.0), (3, 20.0)] {
            let spec = crate::trace::TraceSpec {
                jobs: 16,
                seed,
                mean_interarrival_s,
                models: vec![],
                minutes: vec![0.02, 0.1, 0.3],
            };
            let trace = crate::trace::generate(&spec, &table).unwrap();
            let policies = policy::NAMES.iter().chain(BASELINES);
            for name in policies {
                for capacity in [None, Some(16u64 << 30), Some(5u64 << 30)] {
                    for lane_rule in LaneRule::ALL {
                        for lane_concurrency in [1, 2] {
                            let config = SimConfig {
                                capacity,
                                lane_rule,
                                sched: SchedConfig {
                                    lane_concurrency,
                                    ..SchedConfig::default()
                                },
                                ..SimConfig::new(name)
                            };
                            fast_forwarded += assert_same_both_ways(&trace, &table, &config);
                            runs += 1;
                        }
                    }
                }
            }
        }
        assert!(runs > 0 && fast_forwarded > 0);
        // The unit tests' own traces too.
        let small = WorkloadTable::parse(TABLE).unwrap();
        let traces = [
            vec![job("x", "a", 3, 0.0), job("y", "a", 1, 0.5)],
            vec![job("x", "half", 2, 0.0), job("y", "half", 2, 0.0)],
            vec![job("s", "slow_start", 1, 0.0), job("x", "a", 2, 0.0)],
            vec![
                job("x", "a", 5, 0.0),
                job("y", "half", 4, 0.2),
                job("z", "a", 2, 3.0),
            ],
        ];
        for trace in &traces {
            for name in policy::NAMES.iter().chain(BASELINES) {
                for capacity in [None, Some(3u64 << 20), Some(4u64 << 20)] {
                    let config = SimConfig {
                        capacity,
                        interference: 0.0,
                        ..SimConfig::new(name)
                    };
                    assert_same_both_ways(trace, &small, &config);
                }
            }
        }
    }

    #[test]
    fn fast_forward_is_exact_where_keys_change_while_jobs_wait() {
        // dlas re-keys waiting jobs and keeps promotion state: lengths across
        // its 2 and 20 minute thresholds, arrivals that make jobs wait.
        let table = WorkloadTable::parse(EVAL_TABLE).unwrap();
        for (seed, mean_interarrival_s) in [(4, 0.0), (5, 30.0)] {
            let spec = crate::trace::TraceSpec {
                jobs: 10,
                seed,
                mean_interarrival_s,
                models: vec!["resnet50_25".into(), "vgg11_25".into()],
                minutes: vec![1.0, 3.0, 22.0],
            };
            let trace = crate::trace::generate(&spec, &table).unwrap();
            for capacity in [None, Some(16u64 << 30)] {
                let config = SimConfig {
                    capacity,
                    ..SimConfig::new("dlas")
                };
                assert_same_both_ways(&trace, &table, &config);
            }
        }
    }

    #[test]
    fn experiments_give_the_same_reports_fast_forwarded() {
        let table = WorkloadTable::parse(EVAL_TABLE).unwrap();
        for which in [
            crate::experiments::Experiment::Training,
            crate::experiments::Experiment::Hyperparam,
            crate::experiments::Experiment::Inference,
            crate::experiments::Experiment::Users,
        ] {
            let report = |stepping| {
                stepped(stepping, || {
                    crate::experiments::run(which, &table, 1, 16 << 30, LaneRule::default())
                        .unwrap()
                })
            };
            let slow = report(Stepping::EveryIteration);
            let quick = report(Stepping::FastForward);
            assert_eq!(slow.text, quick.text, "{which:?}");
            assert_eq!(slow.files, quick.files, "{which:?}");
        }
    }

    /// Device time of each user (by name) in the first interval in which
    /// exactly the users of `names` had work.
    fn interval_device(result: &SimResult, names: &[&str]) -> Vec<f64> {
        let index = |n: &str| {
            result
                .users
                .iter()
                .position(|u| u.name.as_deref() == Some(n))
                .unwrap()
        };
        let interval = crate::report::user_intervals(result)
            .into_iter()
            .find(|i| {
                i.busy_users().count() == names.len() && names.iter().all(|n| i.busy[index(n)])
            })
            .expect("an interval with exactly these users busy");
        names.iter().map(|n| interval.device_s[index(n)]).collect()
    }

    #[test]
    fn users_share_a_lane_by_tenant_or_by_job() {
        // u1: one job of 20 iterations; u2: four of 20; all at t = 0, 1 s each.
        let mut trace = vec![owned("x", "u1", 20, 0.0)];
        for i in 0..4 {
            trace.push(owned(&format!("y{i}"), "u2", 20, 0.0));
        }
        let table = WorkloadTable::parse(TABLE).unwrap();
        let run = |share: Share, weights: Vec<(String, u32)>| {
            let config = SimConfig {
                interference: 0.0,
                weights,
                ..SimConfig::new("fair").with_share(share)
            };
            simulate(&trace, &table, &config).unwrap()
        };
        // By tenant: turns, u1 first (ties go to the lower tenant): u1's
        // 20th iteration ends at 39 s, after 19 of u2's.
        let tenants = run(Share::Tenants, vec![]);
        assert_eq!(interval_device(&tenants, &["u1", "u2"]), [20.0, 19.0]);
        assert_eq!(tenants.jobs[0].end_s, Some(39.0));
        // By job: rounds of five, x first: its 20th iteration ends at
        // 19 x 5 + 1 = 96 s, after 76 of u2's.
        let jobs = run(Share::Jobs, vec![]);
        assert_eq!(interval_device(&jobs, &["u1", "u2"]), [20.0, 76.0]);
        assert_eq!(jobs.jobs[0].end_s, Some(96.0));
        // Weight 3 to u1: three quarters while both have work.
        let weighted = run(Share::Tenants, vec![("u1".into(), 3)]);
        let [u1, u2] = interval_device(&weighted, &["u1", "u2"])[..] else {
            panic!()
        };
        assert!((u1 / (u1 + u2) - 0.75).abs() < 0.05, "{u1} {u2}");
        assert_eq!(weighted.users[0].weight, 3);
        for result in [&tenants, &jobs, &weighted] {
            // Users by name, numbered from 1; every job's device time counted
            // once, as the scheduler core charged it.
            let names: Vec<_> = result.users.iter().map(|u| u.name.as_deref()).collect();
            assert_eq!(names, [Some("u1"), Some("u2")]);
            assert_eq!(result.users[1].tenant, TenantId(2));
            for user in &result.users {
                let charged = user.scheduler_device_s.unwrap();
                assert!((user.device_s - charged).abs() < 1e-6, "{user:?}");
            }
            assert_eq!(result.users[0].device_s, 20.0);
            assert_eq!(result.users[1].device_s, 80.0);
        }
    }

    #[test]
    fn traces_without_users_run_as_one_tenant_under_either_share() {
        let table = WorkloadTable::parse(EVAL_TABLE).unwrap();
        let spec = crate::trace::TraceSpec {
            jobs: 12,
            seed: 6,
            mean_interarrival_s: 5.0,
            models: vec![],
            minutes: vec![0.05, 0.2],
        };
        let trace = crate::trace::generate(&spec, &table).unwrap();
        for name in policy::NAMES {
            for capacity in [None, Some(16u64 << 30)] {
                let config = SimConfig {
                    capacity,
                    ..SimConfig::new(name)
                };
                let by_tenant = simulate(&trace, &table, &config.clone()).unwrap();
                let by_job = simulate(&trace, &table, &config.with_share(Share::Jobs)).unwrap();
                assert_eq!(fingerprint(&by_tenant), fingerprint(&by_job), "{name}");
                assert!(by_tenant.user_timeline.is_empty());
                assert_eq!(by_tenant.users.len(), 1);
                assert_eq!(by_tenant.users[0].tenant, TenantId::NONE);
            }
        }
    }

    #[test]
    fn fast_forward_is_exact_with_users() {
        let table = WorkloadTable::parse(TABLE).unwrap();
        let trace = [
            owned("x", "u1", 6, 0.0),
            owned("y", "u2", 3, 0.0),
            owned("z", "u2", 4, 1.5),
            job("w", "half", 3, 2.0),
        ];
        for name in policy::NAMES {
            for share in [Share::Tenants, Share::Jobs] {
                for capacity in [None, Some(4u64 << 20)] {
                    let config = SimConfig {
                        capacity,
                        interference: 0.0,
                        ..SimConfig::new(name).with_share(share)
                    };
                    assert_same_both_ways(&trace, &table, &config);
                }
            }
        }
    }

    #[test]
    fn weights_must_name_users_of_the_trace_once() {
        let table = WorkloadTable::parse(TABLE).unwrap();
        let trace = [owned("x", "u1", 1, 0.0), job("y", "a", 1, 0.0)];
        let with = |weights: Vec<(String, u32)>| {
            let config = SimConfig {
                weights,
                ..SimConfig::new("fair")
            };
            simulate(&trace, &table, &config)
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let err = with(vec![("bob".into(), 2)]);
        assert!(
            err.contains("\"bob\"") && err.contains("users: u1"),
            "{err}"
        );
        let err = with(vec![("u1".into(), 2), ("u1".into(), 3)]);
        assert!(err.contains("twice"), "{err}");
        let err = with(vec![("u1".into(), 0)]);
        assert!(err.contains("u1") && err.contains("1 to 1000"), "{err}");
        assert_eq!(parse_weight("alice=3"), Ok(("alice".into(), 3)));
        for bad in ["alice", "alice=0", "alice=1001", "alice=x", "a b=2", "=2"] {
            let err = parse_weight(bad).unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_policies_and_models_are_errors() {
        let table = WorkloadTable::parse(TABLE).unwrap();
        let err = simulate(&[], &table, &SimConfig::new("bogus")).unwrap_err();
        assert!(err.to_string().contains("exclusive, mps"), "{err}");
        let err =
            simulate(&[job("x", "nope", 1, 0.0)], &table, &SimConfig::new("fifo")).unwrap_err();
        assert!(matches!(err, SimError::UnknownModel(_)));
    }
}
