//! Memory admission: with `--memory-capacity`, a job gets a memory lane before
//! its first main iteration, and waits (visibly) while memory is short; waiting
//! jobs are admitted in the scheduling policy's order (shortest first under
//! SRTF, highest priority first under `priority`, arrival order otherwise).
//!
//! The lane manager ([`crate::sched::lanes`]) decides; this module holds it for
//! the server, parks waiting requests, and hands out [`LaneReservation`]s,
//! RAII guards whose drop returns the job's share and admits whoever now fits.
//! A reservation travels through the waiter's channel, so a waiter that gave up
//! (client gone, timeout) drops it and nothing leaks.
//!
//! With `--lane-rule pack` the lane manager may merge lanes; it is told which
//! lanes the executor keeps busy before each decision, and the jobs a merge
//! moved are moved in the executor under the admission lock, together with
//! scheduling the admitted jobs, so the executor's lanes never disagree with
//! the lane manager's (lock order: admission, then executor).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::runtime::executor::Executor;
use crate::sched::lanes::{LaneError, LaneManager, LaneRule, LaneStatus, MemoryNeed, Placement};
use crate::sched::{Hints, JobId, LaneId, TenantId};
use crate::seam::client::SeamClient;
use crate::seam::msg as seam_msg;

struct Waiter {
    hints: Hints,
    need: MemoryNeed,
    since: Instant,
    reply: Vec<oneshot::Sender<LaneReservation>>,
}

struct State {
    lanes: LaneManager,
    waiting: HashMap<JobId, Waiter>,
    /// Memory each job holds admitted or asks for waiting, by owner: what a
    /// tenant's `memory=` share is counted against.
    claims: HashMap<JobId, (TenantId, u64)>,
}

impl State {
    /// Bytes `tenant`'s jobs other than `except` hold or wait for.
    fn claimed_by(&self, tenant: TenantId, except: JobId) -> u64 {
        self.claims
            .iter()
            .filter(|(job, (owner, _))| *owner == tenant && **job != except)
            .map(|(_, (_, bytes))| bytes)
            .sum()
    }
}

struct Shared {
    state: Mutex<State>,
    executor: Executor,
    timeout: Duration,
    counts: Counts,
}

/// How admission requests ended up, since the server started.
#[derive(Default)]
struct Counts {
    waits: AtomicU64,
    refusals: AtomicU64,
    timeouts: AtomicU64,
}

/// Admission requests that had to wait for memory, were refused at once (a
/// job larger than the device or its lane) and timed out waiting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionCounts {
    pub waits: u64,
    pub refusals: u64,
    pub timeouts: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the lane manager which lanes run iterations (`pack` merges idle ones).
    fn report_busy_lanes(&self, state: &mut State) {
        if state.lanes.rule() == LaneRule::Pack && !state.lanes.is_fixed() {
            state.lanes.set_busy_lanes(self.executor.busy_lanes());
        }
    }

    /// Moves the jobs that lane merges moved, in the executor. Called with the
    /// lock held, so no later merge's moves can overtake these.
    fn apply_moves(&self, state: &mut State) -> Result<()> {
        for (job, lane) in state.lanes.take_moved() {
            tracing::info!(job = job.0, lane = lane.0, "lanes merged: job moved");
            self.executor.move_job(job, lane)?;
        }
        Ok(())
    }

    /// Returns `job`'s share and admits waiting jobs that now fit. Never called
    /// with the lock held: reservations dropped here call back into it.
    fn release(self: &Arc<Self>, job: JobId) {
        let admitted = {
            let mut state = self.lock();
            state.claims.remove(&job);
            self.report_busy_lanes(&mut state);
            let admitted = state.lanes.release(job);
            self.schedule_admitted(&mut state, admitted)
        };
        self.executor.remove_job(job);
        self.grant_admitted(admitted);
    }

    /// Applies the moves of merges and schedules the waiting jobs the lane
    /// manager just admitted. Under the lock: a later merge then finds them
    /// in the executor.
    fn schedule_admitted(
        &self,
        state: &mut State,
        admitted: Vec<(JobId, LaneId)>,
    ) -> Vec<(JobId, LaneId, Waiter)> {
        if let Err(err) = self.apply_moves(state) {
            tracing::error!(cause = %err, "cannot move jobs of merged lanes");
        }
        let admitted = admitted
            .into_iter()
            .filter_map(|(id, lane)| Some((id, lane, state.waiting.remove(&id)?)))
            .collect::<Vec<_>>();
        for (id, lane, waiter) in &admitted {
            if let Err(err) = self.executor.add_job(*id, *lane, waiter.hints.clone()) {
                tracing::error!(job = id.0, cause = %err, "cannot schedule an admitted job");
            }
        }
        admitted
    }

    /// Hands the admitted jobs their reservations. Never with the lock held.
    fn grant_admitted(self: &Arc<Self>, admitted: Vec<(JobId, LaneId, Waiter)>) {
        for (id, lane, waiter) in admitted {
            tracing::info!(
                job = id.0,
                lane = lane.0,
                waited_s = waiter.since.elapsed().as_secs_f64(),
                "memory admitted"
            );
            self.grant(id, lane, waiter.reply);
        }
    }

    /// Hands the reservation of a job already on its lane to a waiter; if
    /// nobody waits any more, the reservation drops and the share returns.
    fn grant(
        self: &Arc<Self>,
        id: JobId,
        lane: LaneId,
        replies: Vec<oneshot::Sender<LaneReservation>>,
    ) {
        let mut reservation = Some(LaneReservation {
            holder: Holder::Local(self.clone()),
            job: id,
            lane,
        });
        for reply in replies {
            match reply.send(reservation.take().expect("one reservation")) {
                Ok(()) => return,
                Err(back) => reservation = Some(back),
            }
        }
        drop(reservation);
    }
}

/// A job's share of a lane; dropping it releases the share.
pub struct LaneReservation {
    holder: Holder,
    job: JobId,
    lane: LaneId,
}

/// Who holds a reservation's share.
enum Holder {
    /// This process's lanes.
    Local(Arc<Shared>),
    /// The supervisor's (in an executor process).
    Seam(Arc<SeamClient>),
}

impl LaneReservation {
    /// The job's lane now (a merge may have moved it since it was admitted;
    /// in an executor process, the lane it was admitted to).
    pub fn lane(&self) -> LaneId {
        match &self.holder {
            Holder::Local(shared) => shared.lock().lanes.lane_of(self.job).unwrap_or(self.lane),
            Holder::Seam(_) => self.lane,
        }
    }
}

impl Drop for LaneReservation {
    fn drop(&mut self) {
        match &self.holder {
            Holder::Seam(seam) => {
                seam.send(seam_msg::to_supervisor::Msg::Release(seam_msg::Release {
                    job: self.job.0,
                }))
            }
            Holder::Local(shared) => shared.release(self.job),
        }
    }
}

/// Where a job stands with memory, for the admin API.
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryState {
    Waiting { need: MemoryNeed, waited: Duration },
    Admitted(LaneId),
    NotRequested,
}

/// Memory admission for the whole server; cheap to clone. One of two ports:
/// this process's lanes (the supervisor, or `--isolation none`), or, in a
/// tenant's executor process, the supervisor's admission over the seam.
#[derive(Clone)]
pub struct Admission {
    port: Port,
}

#[derive(Clone)]
enum Port {
    Local(LocalAdmission),
    Seam(Arc<SeamClient>),
}

/// Admission decided in this process.
#[derive(Clone)]
struct LocalAdmission {
    shared: Arc<Shared>,
}

impl Admission {
    /// The admission of an executor process: the supervisor's, over `seam`.
    pub fn remote(seam: Arc<SeamClient>) -> Admission {
        Admission {
            port: Port::Seam(seam),
        }
    }

    /// Admission over `lanes` (dynamic: [`LaneManager::new`]; GPU lanes:
    /// [`LaneManager::fixed`]).
    pub fn new(lanes: LaneManager, timeout: Duration, executor: Executor) -> Admission {
        Admission {
            port: Port::Local(LocalAdmission::new(lanes, timeout, executor)),
        }
    }

    /// This process's lanes, if it decides (not an executor process).
    fn local(&self) -> Option<&LocalAdmission> {
        match &self.port {
            Port::Local(local) => Some(local),
            Port::Seam(_) => None,
        }
    }

    /// The device's memory (0 in an executor process: the supervisor's figures are its own).
    pub fn capacity(&self) -> u64 {
        self.local().map_or(0, LocalAdmission::capacity)
    }

    pub fn free(&self) -> u64 {
        self.local().map_or(0, LocalAdmission::free)
    }

    pub fn lanes(&self) -> Vec<LaneStatus> {
        self.local().map_or_else(Vec::new, LocalAdmission::lanes)
    }

    /// Holds `bytes` of device memory for `tenant`'s jobs (0: none), replacing
    /// its earlier reservation, and admits waiting jobs a smaller one frees
    /// room for. Refused (RESOURCE_EXHAUSTED) when the reservations together
    /// would exceed the device.
    pub fn reserve(&self, tenant: TenantId, bytes: u64) -> Result<()> {
        match self.local() {
            Some(local) => local.reserve(tenant, bytes),
            None => Err(Error::Internal(
                "reservations are made in the supervisor".into(),
            )),
        }
    }

    /// Bytes reserved by each tenant that has a reservation.
    pub fn reserved_by_tenant(
        &self,
        tenants: impl IntoIterator<Item = TenantId>,
    ) -> HashMap<TenantId, u64> {
        self.local()
            .map_or_else(HashMap::new, |local| local.reserved_by_tenant(tenants))
    }

    /// Bytes reserved in all, and the part of it no job holds yet (kept out
    /// of the pool for other tenants).
    pub fn reserved(&self) -> (u64, u64) {
        self.local().map_or((0, 0), LocalAdmission::reserved)
    }

    /// Device memory each tenant's jobs hold admitted or wait for.
    pub fn claimed_by_tenant(&self) -> HashMap<TenantId, u64> {
        self.local()
            .map_or_else(HashMap::new, LocalAdmission::claimed_by_tenant)
    }

    pub fn counts(&self) -> AdmissionCounts {
        self.local()
            .map_or_else(AdmissionCounts::default, LocalAdmission::counts)
    }

    /// With fixed (GPU) lanes, the lane a job whose graph is about to be
    /// placed should be bound to: the one with the most room now.
    pub fn lane_for_new_graph(&self) -> Option<LaneId> {
        match &self.port {
            Port::Local(local) => local.lane_for_new_graph(),
            Port::Seam(seam) => seam.lane_for_new_graph(),
        }
    }

    /// Where `job` stands (in an executor process the supervisor knows:
    /// `NotRequested` here).
    pub fn state_of(&self, job: JobId) -> MemoryState {
        self.local()
            .map_or(MemoryState::NotRequested, |local| local.state_of(job))
    }

    /// Forgets a job's waiting request, if any (its session closed).
    pub fn withdraw(&self, job: JobId) {
        match &self.port {
            Port::Local(local) => local.withdraw(job),
            Port::Seam(seam) => {
                seam.send(seam_msg::to_supervisor::Msg::Withdraw(seam_msg::Withdraw {
                    job: job.0,
                }))
            }
        }
    }

    /// Asks for a lane for `job` (only `pinned`, if given: the GPU lane its
    /// graph was placed on) and waits until it has one, up to the admission
    /// timeout. A job larger than the whole device or lane is refused at once.
    pub async fn admit(
        &self,
        job: JobId,
        need: MemoryNeed,
        pinned: Option<LaneId>,
        hints: Hints,
    ) -> Result<LaneReservation> {
        match &self.port {
            Port::Local(local) => local.admit(job, need, pinned, hints).await,
            Port::Seam(seam) => {
                let lane = seam.admit(job, need, pinned, &hints).await?;
                Ok(LaneReservation {
                    holder: Holder::Seam(seam.clone()),
                    job,
                    lane,
                })
            }
        }
    }
}

impl LocalAdmission {
    fn new(lanes: LaneManager, timeout: Duration, executor: Executor) -> LocalAdmission {
        LocalAdmission {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    lanes,
                    waiting: HashMap::new(),
                    claims: HashMap::new(),
                }),
                executor,
                timeout,
                counts: Counts::default(),
            }),
        }
    }

    fn capacity(&self) -> u64 {
        self.shared.lock().lanes.capacity()
    }

    fn free(&self) -> u64 {
        self.shared.lock().lanes.free()
    }

    fn lanes(&self) -> Vec<LaneStatus> {
        self.shared.lock().lanes.lanes()
    }

    fn reserve(&self, tenant: TenantId, bytes: u64) -> Result<()> {
        let admitted = {
            let mut state = self.shared.lock();
            let others = state
                .lanes
                .reserved_total()
                .saturating_sub(state.lanes.reserved_by(tenant));
            let capacity = state.lanes.capacity();
            if bytes > 0 && others.saturating_add(bytes) > capacity {
                return Err(Error::ResourceExhausted(format!(
                    "cannot reserve {bytes} bytes: the device has {capacity} and other tenants reserve {others}"
                )));
            }
            self.shared.report_busy_lanes(&mut state);
            let admitted = state.lanes.reserve(tenant, bytes);
            self.shared.schedule_admitted(&mut state, admitted)
        };
        self.shared.grant_admitted(admitted);
        Ok(())
    }

    fn reserved_by_tenant(
        &self,
        tenants: impl IntoIterator<Item = TenantId>,
    ) -> HashMap<TenantId, u64> {
        let state = self.shared.lock();
        tenants
            .into_iter()
            .map(|t| (t, state.lanes.reserved_by(t)))
            .filter(|(_, bytes)| *bytes > 0)
            .collect()
    }

    fn reserved(&self) -> (u64, u64) {
        let state = self.shared.lock();
        (state.lanes.reserved_total(), state.lanes.held_back())
    }

    fn claimed_by_tenant(&self) -> HashMap<TenantId, u64> {
        let mut by_tenant = HashMap::new();
        for (owner, bytes) in self.shared.lock().claims.values() {
            *by_tenant.entry(*owner).or_default() += bytes;
        }
        by_tenant
    }

    fn counts(&self) -> AdmissionCounts {
        let c = &self.shared.counts;
        AdmissionCounts {
            waits: c.waits.load(Ordering::Relaxed),
            refusals: c.refusals.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
        }
    }

    fn lane_for_new_graph(&self) -> Option<LaneId> {
        self.shared.lock().lanes.roomiest_lane()
    }

    fn state_of(&self, job: JobId) -> MemoryState {
        let state = self.shared.lock();
        if let Some(w) = state.waiting.get(&job) {
            return MemoryState::Waiting {
                need: w.need,
                waited: w.since.elapsed(),
            };
        }
        state
            .lanes
            .lane_of(job)
            .map_or(MemoryState::NotRequested, MemoryState::Admitted)
    }

    fn withdraw(&self, job: JobId) {
        let waiting = self.shared.lock().waiting.remove(&job).is_some();
        if waiting {
            self.shared.release(job);
        }
    }

    async fn admit(
        &self,
        job: JobId,
        need: MemoryNeed,
        pinned: Option<LaneId>,
        hints: Hints,
    ) -> Result<LaneReservation> {
        // Ranked before taking the admission lock: the executor has its own.
        let rank = self.shared.executor.rank_new(job, &hints);
        let (owner, share, owner_name) = self.shared.executor.memory_share(job);
        let rx = {
            let mut state = self.shared.lock();
            if let Some(waiter) = state.waiting.get_mut(&job) {
                // Another run of the same job is already waiting: wait along.
                let (tx, rx) = oneshot::channel();
                waiter.reply.push(tx);
                rx
            } else {
                if let Some(share) = share {
                    let claimed = state.claimed_by(owner, job);
                    if claimed.saturating_add(need.limit()) > share {
                        self.shared.counts.refusals.fetch_add(1, Ordering::Relaxed);
                        self.shared.executor.count_refusal(job);
                        return Err(Error::ResourceExhausted(format!(
                            "job needs {} bytes of device memory but tenant {owner_name}'s share is {share} bytes \
                             (memory= in the tenants file or `salus limits`) and its other jobs hold \
                             or wait for {claimed}: close one of them, or ask an admin for a larger share",
                            need.limit()
                        )));
                    }
                }
                self.shared.report_busy_lanes(&mut state);
                let placed = state.lanes.request_for(owner, job, need, pinned, rank);
                if matches!(placed, Ok(Placement::Placed(_) | Placement::Waiting)) {
                    state.claims.insert(job, (owner, need.limit()));
                }
                match placed {
                    Ok(Placement::Placed(lane)) => {
                        // Moves and scheduling under the lock (see the module docs).
                        let scheduled = self
                            .shared
                            .apply_moves(&mut state)
                            .and_then(|()| self.shared.executor.add_job(job, lane, hints));
                        drop(state);
                        tracing::info!(
                            job = job.0,
                            lane = lane.0,
                            need = need.limit(),
                            "memory admitted"
                        );
                        // If scheduling failed, its drop returns the share.
                        let reservation = LaneReservation {
                            holder: Holder::Local(self.shared.clone()),
                            job,
                            lane,
                        };
                        scheduled?;
                        return Ok(reservation);
                    }
                    Ok(Placement::Waiting) => {
                        self.shared.counts.waits.fetch_add(1, Ordering::Relaxed);
                        let (tx, rx) = oneshot::channel();
                        let free = state.lanes.free();
                        state.waiting.insert(
                            job,
                            Waiter {
                                hints,
                                need,
                                since: Instant::now(),
                                reply: vec![tx],
                            },
                        );
                        tracing::info!(
                            job = job.0,
                            need = need.limit(),
                            free,
                            "waiting for memory"
                        );
                        rx
                    }
                    Err(
                        err @ (LaneError::LargerThanDevice { .. }
                        | LaneError::LargerThanLane { .. }),
                    ) => {
                        self.shared.counts.refusals.fetch_add(1, Ordering::Relaxed);
                        self.shared.executor.count_refusal(job);
                        return Err(Error::ResourceExhausted(err.to_string()));
                    }
                    Err(err @ LaneError::UnknownLane(_)) => {
                        return Err(Error::Internal(err.to_string()));
                    }
                    Err(LaneError::Duplicate(_)) => {
                        return Err(Error::Internal(format!(
                            "job {} already holds a lane",
                            job.0
                        )));
                    }
                }
            }
        };
        match tokio::time::timeout(self.shared.timeout, rx).await {
            Ok(Ok(reservation)) => Ok(reservation),
            Ok(Err(_)) => Err(Error::IterationDropped(
                "the job's memory request was withdrawn".into(),
            )),
            Err(_) => {
                self.shared.counts.timeouts.fetch_add(1, Ordering::Relaxed);
                self.shared.executor.count_refusal(job);
                let (free, capacity) = {
                    let mut state = self.shared.lock();
                    state.waiting.remove(&job);
                    (state.lanes.free(), state.lanes.capacity())
                };
                // Withdraw the request (and admit others that a rescan may now fit).
                self.shared.release(job);
                Err(Error::ResourceExhausted(format!(
                    "job needs {} bytes ({} persistent + {} ephemeral) but only {free} of {capacity} bytes were free \
                     for {} s (--admission-timeout)",
                    need.limit(),
                    need.persistent,
                    need.ephemeral,
                    self.shared.timeout.as_secs()
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sched::policy::by_name;
    use crate::sched::SchedConfig;

    fn admission(capacity: u64, timeout_ms: u64) -> Admission {
        admission_with(LaneManager::new(capacity), timeout_ms)
    }

    fn admission_with(lanes: LaneManager, timeout_ms: u64) -> Admission {
        let executor = Executor::new(by_name("pack").unwrap(), SchedConfig::default());
        Admission::new(lanes, Duration::from_millis(timeout_ms), executor)
    }

    #[tokio::test]
    async fn pack_merges_idle_lanes_and_moves_their_jobs_in_the_executor() {
        for rule in LaneRule::ALL {
            let a = admission_with(LaneManager::with_rule(100, rule), 50);
            let first = a
                .admit(JobId(1), need(20, 30), None, Hints::default())
                .await
                .unwrap();
            let second = a
                .admit(JobId(2), need(20, 30), None, Hints::default())
                .await
                .unwrap();
            assert_ne!(first.lane(), second.lane());
            // The pool is empty and neither lane can grow; both lanes are idle.
            let third = a
                .admit(JobId(3), need(10, 30), None, Hints::default())
                .await;
            match rule {
                LaneRule::Salus => assert!(third.is_err(), "salus waits, then times out"),
                LaneRule::Pack => {
                    let third = third.unwrap();
                    assert_eq!(a.lanes().len(), 1);
                    assert_eq!((first.lane(), second.lane()), (third.lane(), third.lane()));
                    let executor = &a.local().unwrap().shared.executor;
                    for job in [1, 2, 3] {
                        assert_eq!(
                            executor.job_status(JobId(job)).map(|s| s.lane),
                            Some(third.lane())
                        );
                    }
                    // The moved job runs in the merged lane.
                    let out = crate::runtime::sched_port::SchedPort::Local(executor.clone())
                        .run_main(JobId(2), None, || Ok(7))
                        .await
                        .unwrap();
                    assert_eq!(out, 7);
                    drop(third);
                }
            }
            drop(first);
            drop(second);
            assert_eq!(a.free(), 100);
            assert!(a.lanes().is_empty());
        }
    }

    fn need(p: u64, e: u64) -> MemoryNeed {
        MemoryNeed {
            persistent: p,
            ephemeral: e,
        }
    }

    #[tokio::test]
    async fn waits_until_a_release_then_runs_and_drops_return_memory() {
        let a = admission(100, 5_000);
        let first = a
            .admit(JobId(1), need(40, 20), None, Hints::default())
            .await
            .unwrap();
        let second = a
            .admit(JobId(2), need(20, 10), None, Hints::default())
            .await
            .unwrap();
        assert_ne!(first.lane(), second.lane());
        let waiting = {
            let a = a.clone();
            tokio::spawn(async move {
                a.admit(JobId(3), need(30, 30), None, Hints::default())
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(matches!(a.state_of(JobId(3)), MemoryState::Waiting { .. }));
        drop(first);
        let third = waiting.await.unwrap().unwrap();
        assert_eq!(a.state_of(JobId(3)), MemoryState::Admitted(third.lane()));
        drop(second);
        drop(third);
        assert_eq!(a.free(), 100);
        assert!(a.lanes().is_empty());
    }

    #[tokio::test]
    async fn too_large_is_refused_at_once_and_waiting_times_out() {
        let a = admission(100, 50);
        let err = a
            .admit(JobId(1), need(90, 20), None, Hints::default())
            .await
            .err()
            .unwrap();
        assert!(matches!(err, Error::ResourceExhausted(_)));
        assert!(err.to_string().contains("device has 100 bytes"), "{err}");
        let _held = a
            .admit(JobId(2), need(50, 30), None, Hints::default())
            .await
            .unwrap();
        let err = a
            .admit(JobId(3), need(30, 30), None, Hints::default())
            .await
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("only 20 of 100 bytes were free"),
            "{err}"
        );
        assert_eq!(a.state_of(JobId(3)), MemoryState::NotRequested);
        assert_eq!(
            a.counts(),
            AdmissionCounts {
                waits: 1,
                refusals: 1,
                timeouts: 1
            }
        );
    }

    #[tokio::test]
    async fn a_tenants_memory_share_counts_its_admitted_and_waiting_jobs() {
        use crate::runtime::timeline::JobKind;
        use crate::tenant::identity::Tenant;
        use crate::tenant::limits::{Limits, LimitsTable};
        let a = admission(1000, 5_000);
        let executor = a.local().unwrap().shared.executor.clone();
        let mut table = LimitsTable::default();
        table.set("root", &Limits::parse(["memory=100"]).unwrap());
        executor.set_limits_table(table);
        let (capped, free) = (Tenant::from_uid(0), Tenant::anonymous());
        for (job, owner) in [(1, &capped), (2, &capped), (3, &capped), (4, &free)] {
            executor
                .open_job(JobId(job), "j", JobKind::Graph, Some(owner))
                .unwrap();
        }
        let first = a
            .admit(JobId(1), need(40, 20), None, Hints::default())
            .await
            .unwrap();
        // 60 held + 50 asked > 100: refused at once, naming the share.
        let err = a
            .admit(JobId(2), need(30, 20), None, Hints::default())
            .await
            .err()
            .unwrap();
        assert!(matches!(err, Error::ResourceExhausted(_)));
        assert!(
            err.to_string().contains("share is 100 bytes")
                && err.to_string().contains("hold or wait for 60"),
            "{err}"
        );
        assert_eq!(a.state_of(JobId(2)), MemoryState::NotRequested);
        // Another tenant is not counted against it.
        let other = a
            .admit(JobId(4), need(500, 100), None, Hints::default())
            .await
            .unwrap();
        // Within the share, and again once the first job's memory is back.
        let second = a
            .admit(JobId(2), need(30, 10), None, Hints::default())
            .await
            .unwrap();
        drop(first);
        let third = a
            .admit(JobId(3), need(50, 10), None, Hints::default())
            .await
            .unwrap();
        drop((second, third, other));
        assert_eq!(a.free(), 1000);
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_returns_its_grant() {
        let a = admission(100, 5_000);
        let first = a
            .admit(JobId(1), need(60, 30), None, Hints::default())
            .await
            .unwrap();
        let gone = {
            let a = a.clone();
            tokio::spawn(async move {
                a.admit(JobId(2), need(50, 40), None, Hints::default())
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        gone.abort();
        let _ = gone.await;
        drop(first);
        // Job 2 was granted a lane nobody took: it went straight back.
        assert_eq!(a.free(), 100);
    }
}
