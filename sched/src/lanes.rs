//! Memory lanes: Salus's assignment of jobs to memory budgets.
//!
//! A lane is a memory budget in which jobs time-share by iteration; lanes run
//! concurrently. Each job needs `persistent` bytes for as long as it lives
//! (variables, optimizer slots) and `ephemeral` bytes during an iteration.
//! Jobs in one lane never run iterations at once, so a lane holds them when
//! sum(persistent) + max(ephemeral) fits its size.
//!
//! Assignment (Salus): for a request of limit P + E,
//! (a) if the free pool holds P + E, open a new lane of exactly that size;
//! (b) else join the first existing lane where
//!     P + max(E, max E in lane) <= lane size - sum P in lane + free pool,
//!     growing the lane from the pool to exactly sum P + max E of its jobs: the
//!     newcomer brings its persistent memory and shares the lane's ephemeral
//!     region (a lane opened at exactly P + E has no slack, so without growth
//!     no job could ever join one);
//! (c) else wait. Every waiting request is re-checked after each arrival and
//! release, in rank order (the scheduling policy's rank of the job when it
//! asked, e.g. shortest first under SRTF; arrival order when unranked), so a
//! later request that fits may pass an earlier one that does not. A job leaving a shared lane shrinks it to what the
//! remaining jobs need; the last job out returns the lane to the pool.
//!
//! Lane rules ([`LaneRule`], `--lane-rule`). `salus` is the rule above.
//! `pack` keeps (a) and (b) — Salus's concurrency while memory is plentiful —
//! and, where Salus would make the job wait, merges lanes so their budgets
//! combine:
//! (b'') take the idle lanes (see below) in order of their ephemeral budget
//!     (size - sum P, largest first, lowest id on ties), then the busy lane
//!     with the largest budget, until their combined sizes plus the pool hold
//!     sum P of their jobs + P + max(E, max E of their jobs); the merged lane
//!     keeps the id of the lane with the most jobs (fewest moves), its size is
//!     the sum of the merged sizes, grown from the pool to the new need if that
//!     is larger; the other lanes' jobs move to it ([`LaneManager::take_moved`]
//!     tells the driver, which moves them in its scheduler with
//!     [`crate::Scheduler::move_job`]);
//! (c) else wait, as Salus.
//! A merge of k lanes that all run iterations would cost k - 1 lanes of
//! concurrency to admit one more job, which only time-shares with them: no
//! more work gets done (measured: hyper-parameter tuning 1.1-1.3x instead of
//! 1.5-2.6x). So a merge takes at most one busy lane: the driver says which
//! lanes are busy ([`LaneManager::set_busy_lanes`], from
//! [`crate::Scheduler::busy_lanes`]: an iteration running or queued, or one
//! ended within the anticipation window). Jobs that are mostly idle, such as
//! inference services between requests, are packed; busy training jobs wait
//! as under Salus. With no lane busy, merging every lane holds whatever one
//! lane for all of a device's jobs would hold.
//! A merge moves no memory: lanes are budgets, and the moved jobs' iterations
//! in flight count against the merged lane until they end, so it starts its
//! next iteration only at an iteration boundary. A lane's size only shrinks
//! when a job leaves (as Salus): the merged lane keeps the ephemeral budgets it
//! absorbed, room for later jobs to join.
//!
//! Fixed lanes (GPU lanes, `--gpu-lanes`): TensorFlow splits a GPU into
//! virtual devices once per process, so there the lanes are opened at start
//! with fixed sizes, never grow, shrink or close, and a job may be pinned to
//! the lane whose device its graph was placed on. Inside a lane the sharing
//! rule is the same: sum(persistent) + max(ephemeral) <= size.
//!
//! Reservations ([`LaneManager::reserve`]): a tenant may hold device memory
//! for its jobs before they come (a cluster engine placed them here). The
//! part of a reservation its jobs do not hold yet is kept out of the pool for
//! everyone else: a job of another tenant is placed only where the pool minus
//! those unmet reservations holds it; the reserving tenant's own jobs may use
//! its unmet part. Claims count at their limit (P + E). With fixed lanes the
//! held bytes count against the device's total, not one lane.
//!
//! Plain synchronous state, no I/O and no clock: the server wraps placements in
//! RAII reservations; tests and the simulator drive it directly.

use std::collections::{BTreeMap, BTreeSet, HashMap};

mod waiting;

use super::policy::SortKey;
use super::{JobId, LaneId, Nanos, SchedError, Scheduler, TenantId};

/// How dynamic lanes are assigned when the pool does not hold a new lane (see
/// the module docs). Fixed lanes cannot grow or merge; both rules place there
/// alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LaneRule {
    /// Salus's rule: join the first lane that can grow to hold the job, else wait.
    Salus,
    /// Salus's rule while the pool holds a new lane; else join the best-fitting
    /// lane, else merge lanes so their budgets combine, else wait.
    #[default]
    Pack,
}

impl LaneRule {
    pub const ALL: [LaneRule; 2] = [LaneRule::Salus, LaneRule::Pack];

    pub fn name(self) -> &'static str {
        match self {
            LaneRule::Salus => "salus",
            LaneRule::Pack => "pack",
        }
    }
}

impl std::fmt::Display for LaneRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown lane rule {0:?}: salus or pack")]
pub struct UnknownLaneRule(pub String);

impl std::str::FromStr for LaneRule {
    type Err = UnknownLaneRule;

    fn from_str(name: &str) -> Result<LaneRule, UnknownLaneRule> {
        LaneRule::ALL
            .into_iter()
            .find(|rule| rule.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| UnknownLaneRule(name.to_string()))
    }
}

/// Memory a job needs, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    pub persistent: u64,
    pub ephemeral: u64,
}

impl MemoryNeed {
    pub fn limit(self) -> u64 {
        self.persistent.saturating_add(self.ephemeral)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaneError {
    #[error("job needs {need} bytes ({persistent} persistent + {ephemeral} ephemeral) but the device has {capacity} bytes in all")]
    LargerThanDevice {
        need: u64,
        persistent: u64,
        ephemeral: u64,
        capacity: u64,
    },
    #[error("job needs {need} bytes ({persistent} persistent + {ephemeral} ephemeral) but its lane holds {lane_size} bytes in all")]
    LargerThanLane {
        need: u64,
        persistent: u64,
        ephemeral: u64,
        lane_size: u64,
    },
    #[error("job {0:?} already holds or awaits a lane")]
    Duplicate(JobId),
    #[error("no lane {0:?}")]
    UnknownLane(LaneId),
}

/// The outcome of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Placed(LaneId),
    Waiting,
}

#[derive(Clone, Debug, Default)]
struct Lane {
    size: u64,
    jobs: Vec<(JobId, MemoryNeed)>,
}

impl Lane {
    fn persistent(&self) -> u64 {
        self.jobs.iter().map(|(_, n)| n.persistent).sum()
    }

    fn max_ephemeral(&self) -> u64 {
        self.jobs
            .iter()
            .map(|(_, n)| n.ephemeral)
            .max()
            .unwrap_or(0)
    }

    /// Size the lane needs with `need` added: sum P + max E.
    fn size_with(&self, need: MemoryNeed) -> u64 {
        self.persistent()
            .saturating_add(need.persistent)
            .saturating_add(need.ephemeral.max(self.max_ephemeral()))
    }
}

/// A lane as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneStatus {
    pub id: LaneId,
    pub size: u64,
    pub jobs: Vec<JobId>,
    /// sum(persistent) + max(ephemeral) of its jobs.
    pub used: u64,
}

/// A waiting request; `pinned` restricts it to one lane.
#[derive(Clone, Copy, Debug)]
struct Request {
    job: JobId,
    need: MemoryNeed,
    pinned: Option<LaneId>,
    /// Whose reservation it may use ([`TenantId::NONE`]: nobody's).
    owner: TenantId,
    /// Waiting requests are re-checked in (rank, seq) order.
    rank: SortKey,
    seq: u64,
}

pub struct LaneManager {
    capacity: u64,
    lanes: BTreeMap<LaneId, Lane>,
    /// Re-checked in (rank, seq) order.
    waiting: waiting::WaitQueue,
    next_seq: u64,
    placed: HashMap<JobId, LaneId>,
    next_lane: u32,
    /// Lanes opened at start with fixed sizes (GPU virtual devices).
    fixed: bool,
    rule: LaneRule,
    /// Jobs moved to another lane by merges since the last [`Self::take_moved`].
    moved: Vec<(JobId, LaneId)>,
    /// Lanes the driver last reported busy; a merge takes at most one.
    busy: BTreeSet<LaneId>,
    /// Bytes each tenant has reserved, and the owner and limit of each
    /// placed job (what counts against its owner's reservation).
    reserved: HashMap<TenantId, u64>,
    claims: HashMap<JobId, (TenantId, u64)>,
}

impl LaneManager {
    /// Dynamic lanes under Salus's own rule.
    pub fn new(capacity: u64) -> LaneManager {
        LaneManager::with_rule(capacity, LaneRule::Salus)
    }

    /// Dynamic lanes under `rule`.
    pub fn with_rule(capacity: u64, rule: LaneRule) -> LaneManager {
        LaneManager {
            capacity,
            lanes: BTreeMap::new(),
            waiting: Default::default(),
            next_seq: 0,
            placed: HashMap::new(),
            next_lane: 0,
            fixed: false,
            rule,
            moved: Vec::new(),
            busy: BTreeSet::new(),
            reserved: HashMap::new(),
            claims: HashMap::new(),
        }
    }

    /// Which lanes run iterations now (the rest are idle), as the driver's
    /// scheduler sees it; `pack` merges at most one busy lane. A stale set only
    /// changes which lanes merge, never whether a job fits.
    pub fn set_busy_lanes(&mut self, busy: impl IntoIterator<Item = LaneId>) {
        self.busy = busy.into_iter().collect();
    }

    pub fn rule(&self) -> LaneRule {
        self.rule
    }

    /// Jobs that merges moved to another lane since the last call, in order
    /// (a job may appear more than once; its last entry is where it is). The
    /// driver moves them in its scheduler.
    pub fn take_moved(&mut self) -> Vec<(JobId, LaneId)> {
        std::mem::take(&mut self.moved)
    }

    /// Fixed lanes of the given sizes, numbered from 0, that never change.
    pub fn fixed(sizes: &[u64]) -> LaneManager {
        let lanes = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let lane = Lane {
                    size,
                    jobs: Vec::new(),
                };
                (LaneId(i as u32), lane)
            })
            .collect();
        LaneManager {
            capacity: sizes.iter().sum(),
            lanes,
            waiting: Default::default(),
            next_seq: 0,
            placed: HashMap::new(),
            next_lane: sizes.len() as u32,
            fixed: true,
            rule: LaneRule::Salus,
            moved: Vec::new(),
            busy: BTreeSet::new(),
            reserved: HashMap::new(),
            claims: HashMap::new(),
        }
    }

    pub fn is_fixed(&self) -> bool {
        self.fixed
    }

    /// The fixed lane with the most room for `persistent` more bytes: where a
    /// job whose graph is about to be placed should go. None with dynamic lanes.
    pub fn roomiest_lane(&self) -> Option<LaneId> {
        if !self.fixed {
            return None;
        }
        self.lanes
            .iter()
            .max_by_key(|(id, lane)| {
                let used = lane.persistent() + lane.max_ephemeral();
                (lane.size.saturating_sub(used), std::cmp::Reverse(**id))
            })
            .map(|(id, _)| *id)
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes not given to any lane; with fixed lanes, bytes no job uses.
    pub fn free(&self) -> u64 {
        let taken: u64 = if self.fixed {
            self.lanes
                .values()
                .map(|l| l.persistent() + l.max_ephemeral())
                .sum()
        } else {
            self.lanes.values().map(|l| l.size).sum()
        };
        self.capacity.saturating_sub(taken)
    }

    /// Holds `bytes` of device memory for `tenant`'s jobs (0: none); replaces
    /// its earlier reservation. Returns the waiting jobs that now got a lane
    /// (a reservation that shrank gives memory back).
    pub fn reserve(&mut self, tenant: TenantId, bytes: u64) -> Vec<(JobId, LaneId)> {
        if bytes == 0 || tenant == TenantId::NONE {
            self.reserved.remove(&tenant);
        } else {
            self.reserved.insert(tenant, bytes);
        }
        self.rescan()
    }

    /// Bytes `tenant` has reserved (0: none).
    pub fn reserved_by(&self, tenant: TenantId) -> u64 {
        self.reserved.get(&tenant).copied().unwrap_or(0)
    }

    /// Bytes reserved by every tenant together.
    pub fn reserved_total(&self) -> u64 {
        self.reserved.values().fold(0, |a, b| a.saturating_add(*b))
    }

    /// The part of `tenant`'s reservation its placed jobs do not hold.
    fn unmet(&self, tenant: TenantId) -> u64 {
        let Some(&reserved) = self.reserved.get(&tenant) else {
            return 0;
        };
        let held: u64 = self
            .claims
            .values()
            .filter(|(owner, _)| *owner == tenant)
            .map(|(_, bytes)| bytes)
            .sum();
        reserved.saturating_sub(held)
    }

    /// Bytes held back from the pool for reservations not yet used.
    pub fn held_back(&self) -> u64 {
        self.reserved.keys().map(|t| self.unmet(*t)).sum()
    }

    /// The pool a job of `owner` needing `limit` bytes may draw from: the
    /// free pool less the reservations others (and `owner`, beyond this job)
    /// still hold back.
    fn pool_for(&self, owner: TenantId, limit: u64) -> u64 {
        let own = self.unmet(owner).min(limit);
        self.free()
            .saturating_sub(self.held_back())
            .saturating_add(own)
            .min(self.free())
    }

    fn place(&mut self, request: Request) -> Option<LaneId> {
        let Request {
            job,
            need,
            pinned,
            owner,
            ..
        } = request;
        let pool = self.pool_for(owner, need.limit());
        let lane = if self.fixed {
            // Fixed lanes do not grow: the reservations count against the whole device.
            if need.limit() > pool {
                return None;
            }
            *self
                .lanes
                .iter()
                .filter(|(id, _)| pinned.is_none_or(|p| p == **id))
                .find(|(_, lane)| lane.size_with(need) <= lane.size)?
                .0
        } else if need.limit() <= pool {
            let id = LaneId(self.next_lane);
            self.next_lane += 1;
            self.lanes.insert(
                id,
                Lane {
                    size: need.limit(),
                    jobs: Vec::new(),
                },
            );
            id
        } else {
            let free = pool;
            let fits = |lane: &Lane| lane.size_with(need) <= lane.size.saturating_add(free);
            match self.rule {
                // Salus's rule (b), the lane growing from the free pool if needed.
                LaneRule::Salus => *self.lanes.iter().find(|(_, lane)| fits(lane))?.0,
                // (b) as Salus; (b'') else merge.
                LaneRule::Pack => match self.lanes.iter().find(|(_, lane)| fits(lane)) {
                    Some((id, _)) => *id,
                    None => self.merge_for(need, free)?,
                },
            }
        };
        let lane_state = self.lanes.get_mut(&lane).expect("lane exists");
        lane_state.size = lane_state.size.max(lane_state.size_with(need));
        lane_state.jobs.push((job, need));
        self.placed.insert(job, lane);
        self.claims.insert(job, (owner, need.limit()));
        // The admitted job is about to run its first iteration.
        self.busy.insert(lane);
        Some(lane)
    }

    /// Rule (b''): merges the fewest lanes, idle ones by ephemeral budget and
    /// then at most one busy one, whose combined budget plus the pool holds
    /// their jobs and `need`; returns the merged lane (not yet holding `need`),
    /// or None if no such set exists.
    fn merge_for(&mut self, need: MemoryNeed, free: u64) -> Option<LaneId> {
        let budget = |lane: &Lane| lane.size.saturating_sub(lane.persistent());
        let by_budget = |(id, lane): (&LaneId, &Lane)| (std::cmp::Reverse(budget(lane)), *id);
        let mut order: Vec<(std::cmp::Reverse<u64>, LaneId)> = self
            .lanes
            .iter()
            .filter(|(id, _)| !self.busy.contains(id))
            .map(by_budget)
            .collect();
        order.sort();
        order.extend(
            self.lanes
                .iter()
                .filter(|(id, _)| self.busy.contains(id))
                .map(by_budget)
                .min(),
        );
        let order = order.into_iter().map(|(budget, id)| (id, budget));
        let (mut size, mut persistent, mut ephemeral) = (0u64, need.persistent, need.ephemeral);
        let mut chosen = Vec::new();
        for (id, _) in order {
            let lane = &self.lanes[&id];
            size = size.saturating_add(lane.size);
            persistent = persistent.saturating_add(lane.persistent());
            ephemeral = ephemeral.max(lane.max_ephemeral());
            chosen.push(id);
            if chosen.len() >= 2
                && persistent.saturating_add(ephemeral) <= size.saturating_add(free)
            {
                break;
            }
        }
        if chosen.len() < 2 || persistent.saturating_add(ephemeral) > size.saturating_add(free) {
            return None;
        }
        let target = *chosen
            .iter()
            .max_by_key(|id| (self.lanes[id].jobs.len(), std::cmp::Reverse(**id)))?;
        for id in chosen.into_iter().filter(|id| *id != target) {
            let Some(lane) = self.lanes.remove(&id) else {
                continue;
            };
            let merged = self.lanes.get_mut(&target)?;
            merged.size = merged.size.saturating_add(lane.size);
            for (job, job_need) in lane.jobs {
                merged.jobs.push((job, job_need));
                self.placed.insert(job, target);
                self.moved.push((job, target));
            }
        }
        Some(target)
    }

    /// Asks for a lane. A job larger than the whole device is refused at once.
    pub fn request(&mut self, job: JobId, need: MemoryNeed) -> Result<Placement, LaneError> {
        self.request_in(job, need, None)
    }

    /// [`Self::request_ranked`] for a job of `owner`, which may use the memory
    /// its tenant reserved ([`Self::reserve`]).
    pub fn request_for(
        &mut self,
        owner: TenantId,
        job: JobId,
        need: MemoryNeed,
        pinned: Option<LaneId>,
        rank: SortKey,
    ) -> Result<Placement, LaneError> {
        self.request_owned(job, need, pinned, rank, owner)
    }

    /// [`Self::request_in`] unranked: waits in arrival order.
    pub fn request_in(
        &mut self,
        job: JobId,
        need: MemoryNeed,
        pinned: Option<LaneId>,
    ) -> Result<Placement, LaneError> {
        self.request_ranked(job, need, pinned, SortKey::default())
    }

    /// Asks for a lane, only `pinned` if given (fixed lanes: the lane whose
    /// device holds the job's graph); if it must wait, it is re-checked before
    /// every waiting request of a larger `rank`. A job larger than the device,
    /// or than every lane it may use, is refused at once.
    pub fn request_ranked(
        &mut self,
        job: JobId,
        need: MemoryNeed,
        pinned: Option<LaneId>,
        rank: SortKey,
    ) -> Result<Placement, LaneError> {
        self.request_owned(job, need, pinned, rank, TenantId::NONE)
    }

    fn request_owned(
        &mut self,
        job: JobId,
        need: MemoryNeed,
        pinned: Option<LaneId>,
        rank: SortKey,
        owner: TenantId,
    ) -> Result<Placement, LaneError> {
        if self.placed.contains_key(&job) || self.waiting.contains(job) {
            return Err(LaneError::Duplicate(job));
        }
        if need.limit() > self.capacity {
            return Err(LaneError::LargerThanDevice {
                need: need.limit(),
                persistent: need.persistent,
                ephemeral: need.ephemeral,
                capacity: self.capacity,
            });
        }
        if let Some(lane) = pinned {
            if !self.fixed || !self.lanes.contains_key(&lane) {
                return Err(LaneError::UnknownLane(lane));
            }
        }
        if self.fixed {
            let largest = self
                .lanes
                .iter()
                .filter(|(id, _)| pinned.is_none_or(|p| p == **id))
                .map(|(_, lane)| lane.size)
                .max()
                .unwrap_or(0);
            if need.limit() > largest {
                return Err(LaneError::LargerThanLane {
                    need: need.limit(),
                    persistent: need.persistent,
                    ephemeral: need.ephemeral,
                    lane_size: largest,
                });
            }
        }
        self.next_seq += 1;
        let request = Request {
            job,
            need,
            pinned,
            owner,
            rank,
            seq: self.next_seq,
        };
        // Waiting requests were checked at the last change; only this one is new.
        Ok(match self.place(request) {
            Some(lane) => Placement::Placed(lane),
            None => {
                self.waiting.insert(request);
                Placement::Waiting
            }
        })
    }

    /// Releases a job's lane share (or withdraws its waiting request) and
    /// returns the waiting jobs that now got a lane.
    pub fn release(&mut self, job: JobId) -> Vec<(JobId, LaneId)> {
        self.waiting.remove(job);
        self.claims.remove(&job);
        if let Some(lane_id) = self.placed.remove(&job) {
            if let Some(lane) = self.lanes.get_mut(&lane_id) {
                lane.jobs.retain(|(j, _)| *j != job);
                if self.fixed {
                    // Fixed lanes keep their size: it is a device's memory limit.
                } else if lane.jobs.is_empty() {
                    self.lanes.remove(&lane_id);
                } else {
                    // Shrink to what the remaining jobs need; the rest returns to the pool.
                    lane.size = lane.persistent() + lane.max_ephemeral();
                }
            }
        }
        self.rescan()
    }

    /// Re-checks every waiting request in rank order.
    fn rescan(&mut self) -> Vec<(JobId, LaneId)> {
        // Exactly a scan of every request in order, skipping those that
        // cannot fit (see `waiting`).
        let mut waiting = std::mem::take(&mut self.waiting);
        let mut admitted = waiting.place_in_order(|request| self.place(*request));
        self.waiting = waiting;
        // A merge later in the scan may have moved a job admitted earlier in
        // it: report where it ends up, and no move for a job the driver has
        // not scheduled yet.
        for (job, lane) in &mut admitted {
            *lane = self.placed.get(job).copied().unwrap_or(*lane);
        }
        if !self.moved.is_empty() {
            self.moved
                .retain(|(job, _)| !admitted.iter().any(|(admitted, _)| admitted == job));
        }
        admitted
    }

    pub fn lane_of(&self, job: JobId) -> Option<LaneId> {
        self.placed.get(&job).copied()
    }

    pub fn is_waiting(&self, job: JobId) -> bool {
        self.waiting.contains(job)
    }

    /// Lanes open now.
    pub fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    pub fn lanes(&self) -> Vec<LaneStatus> {
        self.lanes
            .iter()
            .map(|(&id, lane)| LaneStatus {
                id,
                size: lane.size,
                jobs: lane.jobs.iter().map(|(j, _)| *j).collect(),
                used: lane.persistent() + lane.max_ephemeral(),
            })
            .collect()
    }
}

// Kept here, beside the merges that need it, rather than in the scheduler's
// own module: a lane merge is the only reason a job changes lanes.
impl<W> Scheduler<W> {
    /// Moves a job to lane `to` (a lane merge): its queued iterations go with
    /// it, and its iterations in flight count against `to` from now on, so `to`
    /// starts nothing new until they end — the merge takes effect at an
    /// iteration boundary. Drivers call [`Scheduler::finish`] with the job's
    /// lane at the time the iteration ends ([`Self::job_lane`]).
    pub fn move_job(&mut self, id: JobId, to: LaneId) -> Result<(), SchedError> {
        let job = self.jobs.get_mut(&id).ok_or(SchedError::UnknownJob(id))?;
        let from = std::mem::replace(&mut job.lane, to);
        if from == to {
            return Ok(());
        }
        let (key, ready, running) = (job.key, !job.queue.is_empty(), job.running);
        let tenant = job.tenant;
        if let Some(lane) = self.lanes.get_mut(&from) {
            lane.all.remove(&(key, id));
            lane.ready.remove(&(key, id));
            lane.remove_tenant_job(tenant);
            lane.running = lane.running.saturating_sub(running);
            if lane.all.is_empty() && lane.running == 0 {
                self.lanes.remove(&from);
            }
        }
        let lane = self.lanes.entry(to).or_default();
        lane.all.insert((key, id));
        lane.add_tenant_job(tenant);
        if ready {
            lane.ready.insert((key, id));
        }
        lane.running += running;
        Ok(())
    }

    /// The lane a job is in now.
    pub fn job_lane(&self, id: JobId) -> Option<LaneId> {
        self.jobs.get(&id).map(|job| job.lane)
    }

    /// Lanes in use now: an iteration running or queued, or a job whose last
    /// iteration ended within the anticipation window (a training loop between
    /// two steps). The others are idle, and `pack` may merge them.
    pub fn busy_lanes(&self, now: Nanos) -> Vec<LaneId> {
        let anticipation = self.config.anticipation;
        let mut busy: Vec<LaneId> = self
            .lanes
            .iter()
            .filter(|(_, lane)| {
                lane.running > 0
                    || !lane.ready.is_empty()
                    || lane.all.iter().any(|(_, id)| {
                        self.jobs.get(id).is_some_and(|job| {
                            job.last_end
                                .is_some_and(|end| now < end.saturating_add(anticipation))
                        })
                    })
            })
            .map(|(id, _)| *id)
            .collect();
        busy.sort();
        busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Decision;

    const GB: u64 = 1 << 30;

    fn need(p: u64, e: u64) -> MemoryNeed {
        MemoryNeed {
            persistent: p * GB,
            ephemeral: e * GB,
        }
    }

    fn place_for(
        lanes: &mut LaneManager,
        owner: u64,
        job: u64,
        gb: u64,
    ) -> Result<Placement, LaneError> {
        lanes.request_for(
            TenantId(owner),
            JobId(job),
            need(gb, 0),
            None,
            SortKey::default(),
        )
    }

    #[test]
    fn a_reservation_is_held_back_from_other_tenants_and_used_by_its_own() {
        let mut lanes = LaneManager::new(10 * GB);
        assert!(lanes.reserve(TenantId(1), 6 * GB).is_empty());
        assert_eq!(lanes.held_back(), 6 * GB);
        // Tenant 2 finds 4 GB; 5 waits though 10 are free.
        assert_eq!(place_for(&mut lanes, 2, 1, 5), Ok(Placement::Waiting));
        assert!(matches!(
            place_for(&mut lanes, 2, 2, 4),
            Ok(Placement::Placed(_))
        ));
        // Tenant 1 uses its reservation in two jobs; the rest stays held.
        assert!(matches!(
            place_for(&mut lanes, 1, 3, 2),
            Ok(Placement::Placed(_))
        ));
        assert_eq!(lanes.held_back(), 4 * GB);
        assert!(matches!(
            place_for(&mut lanes, 1, 4, 4),
            Ok(Placement::Placed(_))
        ));
        assert_eq!((lanes.held_back(), lanes.free()), (0, 0));
        // Its jobs end: the memory is held for it again, not given to job 1.
        assert!(lanes.release(JobId(3)).is_empty());
        assert!(lanes.release(JobId(4)).is_empty());
        assert!(lanes.release(JobId(2)).is_empty());
        assert_eq!(lanes.free(), 10 * GB);
        // The reservation ends (the job's token revoked): job 1 gets its lane.
        let admitted = lanes.reserve(TenantId(1), 0);
        assert_eq!(admitted.len(), 1);
        assert_eq!(admitted[0].0, JobId(1));
        assert_eq!(lanes.reserved_total(), 0);
    }

    #[test]
    fn a_job_of_the_reserving_tenant_larger_than_its_reservation_draws_on_the_rest() {
        let mut lanes = LaneManager::new(10 * GB);
        lanes.reserve(TenantId(1), 3 * GB);
        lanes.reserve(TenantId(2), 4 * GB);
        // Tenant 1: its 3 plus the 3 nobody reserved.
        assert_eq!(place_for(&mut lanes, 1, 1, 7), Ok(Placement::Waiting));
        assert!(matches!(
            place_for(&mut lanes, 1, 2, 6),
            Ok(Placement::Placed(_))
        ));
        // Tenant 2's 4 are still there for it, not for a job without a tenant.
        assert_eq!(lanes.request(JobId(4), need(1, 0)), Ok(Placement::Waiting));
        assert!(matches!(
            place_for(&mut lanes, 2, 3, 4),
            Ok(Placement::Placed(_))
        ));
    }

    #[test]
    fn fixed_lanes_count_reservations_against_the_device() {
        let mut lanes = LaneManager::fixed(&[5 * GB, 5 * GB]);
        lanes.reserve(TenantId(1), 5 * GB);
        assert!(matches!(
            place_for(&mut lanes, 2, 1, 3),
            Ok(Placement::Placed(_))
        ));
        assert_eq!(place_for(&mut lanes, 2, 2, 3), Ok(Placement::Waiting));
        assert!(matches!(
            place_for(&mut lanes, 1, 3, 5),
            Ok(Placement::Placed(_))
        ));
    }

    #[test]
    fn new_lane_of_exactly_the_limit_when_the_pool_holds_it() {
        let mut m = LaneManager::new(16 * GB);
        assert_eq!(
            m.request(JobId(1), need(2, 4)),
            Ok(Placement::Placed(LaneId(0)))
        );
        assert_eq!(
            m.request(JobId(2), need(3, 3)),
            Ok(Placement::Placed(LaneId(1)))
        );
        assert_eq!(m.free(), 4 * GB);
        assert_eq!(
            m.lanes().iter().map(|l| l.size).collect::<Vec<_>>(),
            [6 * GB, 6 * GB]
        );
    }

    #[test]
    fn jobs_share_a_lane_by_sum_persistent_plus_max_ephemeral() {
        let mut m = LaneManager::new(10 * GB);
        // Lane 0: size 8 (2 + 6). Pool left: 2.
        assert_eq!(
            m.request(JobId(1), need(2, 6)),
            Ok(Placement::Placed(LaneId(0)))
        );
        // 3 + 2 = 5 > 2 free; lane 0 would need 2 + 3 + max(2, 6) = 11 > 8 + 2: waits.
        assert_eq!(m.request(JobId(2), need(3, 2)), Ok(Placement::Waiting));
        // 1 + 4 = 5 > 2 free, but lane 0 grows to 2 + 1 + 6 = 9 <= 8 + 2: joins.
        assert_eq!(
            m.request(JobId(3), need(1, 4)),
            Ok(Placement::Placed(LaneId(0)))
        );
        assert_eq!(
            (m.lanes()[0].size, m.lanes()[0].used, m.free()),
            (9 * GB, 9 * GB, GB)
        );
        // 0 + 3: lane 0 holds it without growing (max E stays 6).
        assert_eq!(
            m.request(JobId(4), need(0, 3)),
            Ok(Placement::Placed(LaneId(0)))
        );
        assert_eq!(m.lanes()[0].size, 9 * GB);
        // MPS-style sharing would need 2+6 + 1+4 + 0+3 = 16 for these three jobs; Salus fits them in 9.
        // A job leaving a shared lane shrinks it (2 + 0 + 6 = 8); the freed GB goes back to the pool.
        assert_eq!(m.release(JobId(3)), vec![]);
        assert_eq!((m.lanes()[0].size, m.free()), (8 * GB, 2 * GB));
    }

    #[test]
    fn a_later_request_that_fits_passes_an_earlier_one() {
        let mut m = LaneManager::new(10 * GB);
        assert_eq!(
            m.request(JobId(1), need(4, 4)),
            Ok(Placement::Placed(LaneId(0)))
        );
        assert_eq!(m.request(JobId(2), need(3, 4)), Ok(Placement::Waiting));
        assert_eq!(
            m.request(JobId(3), need(1, 1)),
            Ok(Placement::Placed(LaneId(1)))
        );
        assert!(m.is_waiting(JobId(2)));
    }

    #[test]
    fn release_rescans_and_the_last_job_out_returns_the_lane() {
        let mut m = LaneManager::new(10 * GB);
        m.request(JobId(1), need(4, 4)).unwrap();
        m.request(JobId(2), need(1, 1)).unwrap();
        // Lanes 8 + 2, pool 0: neither fits a lane (4 + 3 + 4 = 11 > 8; 1 + 3 + 4 > 2).
        assert_eq!(m.request(JobId(3), need(3, 4)), Ok(Placement::Waiting));
        assert_eq!(m.request(JobId(4), need(2, 5)), Ok(Placement::Waiting));
        // Job 2 leaves: its lane closes, 2 GB free: nobody fits yet.
        assert_eq!(m.release(JobId(2)), vec![]);
        assert_eq!(m.lanes().len(), 1);
        // Job 1 leaves: 10 GB free; job 3 (7) opens a lane; job 4 (7) no longer fits the pool
        // (3 left) but joins job 3's lane, which grows to 3 + 2 + max(4, 5) = 10.
        assert_eq!(
            m.release(JobId(1)),
            vec![(JobId(3), LaneId(2)), (JobId(4), LaneId(2))]
        );
        assert_eq!((m.lanes().len(), m.free()), (1, 0));
        // Job 3 leaves the shared lane: it shrinks to job 4's 7.
        assert_eq!(m.release(JobId(3)), vec![]);
        assert_eq!(m.free(), 3 * GB);
        assert_eq!(m.release(JobId(4)), vec![]);
        assert_eq!(m.free(), 10 * GB);
        assert!(m.lanes().is_empty());
    }

    #[test]
    fn too_large_jobs_are_refused_at_once_and_duplicates_rejected() {
        let mut m = LaneManager::new(8 * GB);
        assert!(matches!(
            m.request(JobId(1), need(5, 4)),
            Err(LaneError::LargerThanDevice { .. })
        ));
        let msg = m.request(JobId(1), need(5, 4)).unwrap_err().to_string();
        assert!(msg.contains("device has 8589934592 bytes"), "{msg}");
        m.request(JobId(2), need(1, 1)).unwrap();
        assert_eq!(
            m.request(JobId(2), need(1, 1)),
            Err(LaneError::Duplicate(JobId(2)))
        );
        // Withdrawing a waiting request is a release too.
        m.request(JobId(3), need(4, 3)).unwrap();
        assert_eq!(m.request(JobId(4), need(4, 3)), Ok(Placement::Waiting));
        assert_eq!(m.release(JobId(4)), vec![]);
        assert!(!m.is_waiting(JobId(4)));
    }

    #[test]
    fn fixed_lanes_share_by_the_rule_and_never_grow_or_close() {
        let mut m = LaneManager::fixed(&[8 * GB, 8 * GB]);
        assert!(m.is_fixed());
        assert_eq!(
            (m.capacity(), m.free(), m.roomiest_lane()),
            (16 * GB, 16 * GB, Some(LaneId(0)))
        );
        assert_eq!(
            m.request(JobId(1), need(2, 4)),
            Ok(Placement::Placed(LaneId(0)))
        );
        // Lane 0 now has 2 GB of room, lane 1 all 8.
        assert_eq!(m.roomiest_lane(), Some(LaneId(1)));
        // Pinned to lane 0: 2 + 1 + max(4, 2) = 7 <= 8, shares it.
        assert_eq!(
            m.request_in(JobId(2), need(1, 2), Some(LaneId(0))),
            Ok(Placement::Placed(LaneId(0)))
        );
        // Pinned to lane 0, 2 + 1 + 3 + 4 = 10 > 8: waits though lane 1 is empty.
        assert_eq!(
            m.request_in(JobId(3), need(3, 1), Some(LaneId(0))),
            Ok(Placement::Waiting)
        );
        // Unpinned: the first lane that holds it.
        assert_eq!(
            m.request(JobId(4), need(3, 1)),
            Ok(Placement::Placed(LaneId(1)))
        );
        assert_eq!(
            m.lanes()
                .iter()
                .map(|l| (l.size, l.used))
                .collect::<Vec<_>>(),
            [(8 * GB, 7 * GB), (8 * GB, 4 * GB)]
        );
        // Job 1 leaves: lane 0 keeps its size, job 3 now fits (1 + 3 + 2 = 6).
        assert_eq!(m.release(JobId(1)), [(JobId(3), LaneId(0))]);
        for job in [2, 3, 4] {
            m.release(JobId(job));
        }
        assert_eq!(
            m.lanes()
                .iter()
                .map(|l| (l.size, l.jobs.len()))
                .collect::<Vec<_>>(),
            [(8 * GB, 0), (8 * GB, 0)]
        );
        assert_eq!(m.free(), 16 * GB);
    }

    #[test]
    fn fixed_lanes_refuse_jobs_larger_than_their_lane_and_unknown_lanes() {
        let mut m = LaneManager::fixed(&[4 * GB, 6 * GB]);
        assert_eq!(
            m.request_in(JobId(1), need(4, 1), Some(LaneId(0))),
            Err(LaneError::LargerThanLane {
                need: 5 * GB,
                persistent: 4 * GB,
                ephemeral: GB,
                lane_size: 4 * GB
            })
        );
        // Unpinned, the larger lane holds it.
        assert_eq!(
            m.request(JobId(1), need(4, 1)),
            Ok(Placement::Placed(LaneId(1)))
        );
        assert!(matches!(
            m.request(JobId(2), need(6, 1)),
            Err(LaneError::LargerThanLane { .. })
        ));
        assert_eq!(
            m.request_in(JobId(3), need(1, 1), Some(LaneId(7))),
            Err(LaneError::UnknownLane(LaneId(7)))
        );
        // Dynamic lanes cannot be pinned, nor have a roomiest lane.
        let mut dynamic = LaneManager::new(8 * GB);
        assert_eq!(dynamic.roomiest_lane(), None);
        assert_eq!(
            dynamic.request_in(JobId(1), need(1, 1), Some(LaneId(0))),
            Err(LaneError::UnknownLane(LaneId(0)))
        );
    }

    #[test]
    fn waiting_requests_are_rechecked_in_rank_order() {
        let rank = |primary| SortKey {
            primary,
            ..SortKey::default()
        };
        let mut m = LaneManager::new(4 * GB);
        assert_eq!(
            m.request(JobId(1), need(2, 2)),
            Ok(Placement::Placed(LaneId(0)))
        );
        // Both wait; job 3 asked later but ranks first (e.g. shorter under SRTF).
        let waits =
            |m: &mut LaneManager, job, r| m.request_ranked(JobId(job), need(2, 2), None, rank(r));
        assert_eq!(waits(&mut m, 2, 10), Ok(Placement::Waiting));
        assert_eq!(waits(&mut m, 3, 5), Ok(Placement::Waiting));
        // Room for one: the better-ranked job gets it.
        assert_eq!(m.release(JobId(1)), [(JobId(3), LaneId(1))]);
        assert_eq!(m.release(JobId(3)), [(JobId(2), LaneId(2))]);
    }

    /// Checks what must hold after every operation, whatever the rule.
    fn check_invariants(m: &LaneManager) {
        let lanes = m.lanes();
        let sizes: u64 = lanes.iter().map(|l| l.size).sum();
        assert!(
            sizes <= m.capacity(),
            "lanes {sizes} > capacity {}",
            m.capacity()
        );
        for lane in &lanes {
            assert!(
                lane.used <= lane.size,
                "lane {:?} holds {} in {}",
                lane.id,
                lane.used,
                lane.size
            );
            assert!(!lane.jobs.is_empty(), "an empty dynamic lane stayed open");
            for job in &lane.jobs {
                assert_eq!(m.lane_of(*job), Some(lane.id));
                assert!(!m.is_waiting(*job));
            }
        }
        let placed: usize = lanes.iter().map(|l| l.jobs.len()).sum();
        assert_eq!(placed, m.placed.len());
    }

    #[test]
    fn lane_rules_parse_by_name() {
        assert_eq!("pack".parse(), Ok(LaneRule::Pack));
        assert_eq!(" Salus".parse(), Ok(LaneRule::Salus));
        let err = "best".parse::<LaneRule>().unwrap_err().to_string();
        assert!(err.contains("salus or pack"), "{err}");
        assert_eq!(LaneRule::default().to_string(), "pack");
    }

    #[test]
    fn pack_keeps_salus_concurrency_while_the_pool_holds_new_lanes() {
        for rule in LaneRule::ALL {
            let mut m = LaneManager::with_rule(16 * GB, rule);
            assert_eq!(
                m.request(JobId(1), need(2, 4)),
                Ok(Placement::Placed(LaneId(0)))
            );
            assert_eq!(
                m.request(JobId(2), need(3, 3)),
                Ok(Placement::Placed(LaneId(1)))
            );
            // Short of a new lane (4 free < 1 + 5), lane 0 grows to 2 + 1 + 5 = 8 <= 6 + 4: joins, as Salus.
            assert_eq!(
                m.request(JobId(3), need(1, 5)),
                Ok(Placement::Placed(LaneId(0)))
            );
            assert_eq!((m.lane_count(), m.free()), (2, 2 * GB), "{rule}");
            assert!(m.take_moved().is_empty());
        }
    }

    /// Two lanes of (2 + 3) fill 10 GB; a (1 + 3) job fits neither lane's growth.
    fn two_full_lanes(rule: LaneRule) -> LaneManager {
        let mut m = LaneManager::with_rule(10 * GB, rule);
        m.request(JobId(1), need(2, 3)).unwrap();
        m.request(JobId(2), need(2, 3)).unwrap();
        assert_eq!(m.free(), 0);
        m
    }

    #[test]
    fn pack_merges_idle_lanes_when_short_where_salus_waits() {
        let mut salus = two_full_lanes(LaneRule::Salus);
        assert_eq!(salus.request(JobId(3), need(1, 3)), Ok(Placement::Waiting));

        let mut m = two_full_lanes(LaneRule::Pack);
        m.set_busy_lanes([]);
        // Merged: 5 + 5 = 10 holds 2 + 2 + 1 + max(3, 3, 3) = 8.
        assert_eq!(
            m.request(JobId(3), need(1, 3)),
            Ok(Placement::Placed(LaneId(0)))
        );
        assert_eq!(m.take_moved(), [(JobId(2), LaneId(0))]);
        assert!(m.take_moved().is_empty());
        assert_eq!(m.lane_of(JobId(2)), Some(LaneId(0)));
        let lanes = m.lanes();
        assert_eq!(lanes.len(), 1);
        assert_eq!((lanes[0].size, lanes[0].used), (10 * GB, 8 * GB));
        // The merged lane keeps the absorbed budget: a (1 + 2) job joins without growth.
        assert_eq!(
            m.request(JobId(4), need(1, 2)),
            Ok(Placement::Placed(LaneId(0)))
        );
        // Nothing fits beyond one budget for all: 2 + 2 + 1 + 1 + 1 + 6 = 13 > 10.
        assert_eq!(m.request(JobId(5), need(1, 6)), Ok(Placement::Waiting));
        check_invariants(&m);
    }

    #[test]
    fn pack_merges_at_most_one_busy_lane() {
        let mut m = two_full_lanes(LaneRule::Pack);
        // Both lanes run iterations: merging would cost concurrency, so it waits as Salus.
        m.set_busy_lanes([LaneId(0), LaneId(1)]);
        assert_eq!(m.request(JobId(3), need(1, 3)), Ok(Placement::Waiting));
        assert!(m.take_moved().is_empty());
        // Lane 0 goes idle; a release re-checks waiting jobs: lane 0 merges into busy lane 1.
        m.set_busy_lanes([LaneId(1)]);
        // Releasing a job that holds nothing only re-checks the waiting.
        assert_eq!(m.release(JobId(99)), [(JobId(3), LaneId(0))]);
        assert_eq!(m.lane_count(), 1);
        assert_eq!(m.take_moved(), [(JobId(2), LaneId(0))]);
        check_invariants(&m);
    }

    #[test]
    fn release_from_a_merged_lane_returns_its_memory() {
        let mut m = two_full_lanes(LaneRule::Pack);
        m.set_busy_lanes([]);
        m.request(JobId(3), need(1, 3)).unwrap();
        // Job 3 leaves: the lane shrinks to 2 + 2 + 3 = 7.
        assert_eq!(m.release(JobId(3)), []);
        assert_eq!((m.lanes()[0].size, m.free()), (7 * GB, 3 * GB));
        assert_eq!(m.release(JobId(1)), []);
        assert_eq!(m.free(), 5 * GB);
        assert_eq!(m.release(JobId(2)), []);
        assert_eq!((m.free(), m.lane_count()), (10 * GB, 0));
    }

    #[test]
    fn fixed_lanes_never_merge_under_pack() {
        let mut m = LaneManager::fixed(&[5 * GB, 5 * GB]);
        assert_eq!(m.rule(), LaneRule::Salus);
        m.request(JobId(1), need(2, 3)).unwrap();
        m.request(JobId(2), need(2, 3)).unwrap();
        assert_eq!(m.request(JobId(3), need(1, 3)), Ok(Placement::Waiting));
        assert!(m.take_moved().is_empty());
    }

    /// A small deterministic generator, so the test needs no dependency.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    #[test]
    fn random_requests_and_releases_never_overfill_and_pack_waits_only_when_nothing_holds_the_job()
    {
        for seed in 1..=40 {
            for rule in LaneRule::ALL {
                let mut rng = Lcg(seed);
                let capacity = 32 * GB;
                let mut m = LaneManager::with_rule(capacity, rule);
                let mut live: Vec<JobId> = Vec::new();
                let mut needs: HashMap<JobId, MemoryNeed> = HashMap::new();
                for step in 0..300u64 {
                    let busy: Vec<LaneId> = m
                        .lanes()
                        .iter()
                        .map(|l| l.id)
                        .filter(|_| rng.below(3) == 0)
                        .collect();
                    m.set_busy_lanes(busy.iter().copied());
                    if live.is_empty() || rng.below(3) > 0 {
                        let job = JobId(step);
                        let n = MemoryNeed {
                            persistent: (rng.below(40) + 1) * GB / 8,
                            ephemeral: rng.below(64) * GB / 8,
                        };
                        match m.request(job, n) {
                            Ok(_) => {
                                live.push(job);
                                needs.insert(job, n);
                            }
                            Err(LaneError::LargerThanDevice { .. }) => {}
                            Err(other) => panic!("{other}"),
                        }
                    } else {
                        let job = live.swap_remove(rng.below(live.len() as u64) as usize);
                        for (admitted, lane) in m.release(job) {
                            assert_eq!(m.lane_of(admitted), Some(lane));
                        }
                    }
                    for (job, lane) in m.take_moved() {
                        assert!(m.lane_of(job).is_some(), "moved job {job:?} has no lane");
                        let _ = lane;
                    }
                    check_invariants(&m);
                    if rule == LaneRule::Pack && rng.below(4) == 0 {
                        // Once every lane is idle, nothing waits that one lane for
                        // every job would hold (jobs admitted meanwhile make their
                        // lanes busy, so re-check until nothing changes).
                        loop {
                            m.set_busy_lanes([]);
                            if m.release(JobId(u64::MAX)).is_empty() {
                                break;
                            }
                        }
                        m.take_moved();
                        check_invariants(&m);
                        let placed = live.iter().filter(|j| m.lane_of(**j).is_some());
                        let p: u64 = placed.clone().map(|j| needs[j].persistent).sum();
                        let e = placed.map(|j| needs[j].ephemeral).max().unwrap_or(0);
                        for job in live.iter().filter(|j| m.is_waiting(**j)) {
                            let w = needs[job];
                            assert!(
                                p + w.persistent + e.max(w.ephemeral) > capacity,
                                "seed {seed} step {step}: {job:?} waits but fits one lane"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_moved_job_runs_again_only_after_the_merged_lane_ends_its_iterations() {
        let mut sched: Scheduler<u32> = Scheduler::new(
            crate::policy::by_name("pack").unwrap(),
            crate::SchedConfig::default(),
        );
        sched
            .add_job(JobId(1), LaneId(0), Default::default(), 0)
            .unwrap();
        sched
            .add_job(JobId(2), LaneId(1), Default::default(), 0)
            .unwrap();
        sched.submit(JobId(1), 10, 0).unwrap();
        sched.submit(JobId(2), 20, 0).unwrap();
        assert!(matches!(sched.next(LaneId(0), 1), Decision::Run(_)));
        assert!(matches!(sched.next(LaneId(1), 1), Decision::Run(_)));
        assert_eq!(sched.busy_lanes(1), [LaneId(0), LaneId(1)]);
        // Lanes 1 merges into lane 0 while both run an iteration.
        sched.move_job(JobId(2), LaneId(0)).unwrap();
        assert_eq!(sched.job_lane(JobId(2)), Some(LaneId(0)));
        assert!(!sched.has_lane(LaneId(1)));
        sched.submit(JobId(2), 21, 2).unwrap();
        sched.finish(JobId(1), LaneId(0), Some(5), 5);
        // Job 2's iteration still runs in the merged lane: nothing new starts.
        assert!(matches!(sched.next(LaneId(0), 5), Decision::Idle));
        sched.finish(JobId(2), sched.job_lane(JobId(2)).unwrap(), Some(6), 6);
        match sched.next(LaneId(0), 6) {
            Decision::Run(d) => assert_eq!((d.job, d.work), (JobId(2), 21)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            sched.move_job(JobId(7), LaneId(0)),
            Err(SchedError::UnknownJob(JobId(7)))
        );
        // Long after the last iteration ended and with nothing queued, a lane is idle.
        sched.finish(JobId(2), LaneId(0), Some(1), 7);
        assert!(sched.busy_lanes(7 + 1_000_000_000).is_empty());
    }
}
