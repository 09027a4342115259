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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::runtime::executor::Executor;
use crate::sched::lanes::{LaneError, LaneManager, LaneStatus, MemoryNeed, Placement};
use crate::sched::{Hints, JobId, LaneId};

struct Waiter {
    hints: Hints,
    need: MemoryNeed,
    since: Instant,
    reply: Vec<oneshot::Sender<LaneReservation>>,
}

struct State {
    lanes: LaneManager,
    waiting: HashMap<JobId, Waiter>,
}

struct Shared {
    state: Mutex<State>,
    executor: Executor,
    timeout: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns `job`'s share and admits waiting jobs that now fit. Never called
    /// with the lock held: reservations dropped here call back into it.
    fn release(self: &Arc<Self>, job: JobId) {
        let admitted = {
            let mut state = self.lock();
            let admitted = state.lanes.release(job);
            admitted
                .into_iter()
                .filter_map(|(id, lane)| Some((id, lane, state.waiting.remove(&id)?)))
                .collect::<Vec<_>>()
        };
        self.executor.remove_job(job);
        for (id, lane, waiter) in admitted {
            tracing::info!(
                job = id.0,
                lane = lane.0,
                waited_s = waiter.since.elapsed().as_secs_f64(),
                "memory admitted"
            );
            self.grant(id, lane, waiter.hints, waiter.reply);
        }
    }

    /// Registers the job on its lane and hands the reservation to a waiter; if
    /// nobody waits any more, the reservation drops and the share returns.
    fn grant(
        self: &Arc<Self>,
        id: JobId,
        lane: LaneId,
        hints: Hints,
        replies: Vec<oneshot::Sender<LaneReservation>>,
    ) {
        if let Err(err) = self.executor.add_job(id, lane, hints) {
            tracing::error!(job = id.0, cause = %err, "cannot schedule an admitted job");
        }
        let mut reservation = Some(LaneReservation {
            shared: self.clone(),
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
    shared: Arc<Shared>,
    job: JobId,
    lane: LaneId,
}

impl LaneReservation {
    pub fn lane(&self) -> LaneId {
        self.lane
    }
}

impl Drop for LaneReservation {
    fn drop(&mut self) {
        self.shared.release(self.job);
    }
}

/// Where a job stands with memory, for the admin API.
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryState {
    Waiting { need: MemoryNeed, waited: Duration },
    Admitted(LaneId),
    NotRequested,
}

/// Memory admission for the whole server; cheap to clone.
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

impl Admission {
    /// Admission over `lanes` (dynamic: [`LaneManager::new`]; GPU lanes:
    /// [`LaneManager::fixed`]).
    pub fn new(lanes: LaneManager, timeout: Duration, executor: Executor) -> Admission {
        Admission {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    lanes,
                    waiting: HashMap::new(),
                }),
                executor,
                timeout,
            }),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.shared.lock().lanes.capacity()
    }

    pub fn free(&self) -> u64 {
        self.shared.lock().lanes.free()
    }

    pub fn lanes(&self) -> Vec<LaneStatus> {
        self.shared.lock().lanes.lanes()
    }

    /// With fixed (GPU) lanes, the lane a job whose graph is about to be
    /// placed should be bound to: the one with the most room now.
    pub fn lane_for_new_graph(&self) -> Option<LaneId> {
        self.shared.lock().lanes.roomiest_lane()
    }

    pub fn state_of(&self, job: JobId) -> MemoryState {
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

    /// Forgets a job's waiting request, if any (its session closed).
    pub fn withdraw(&self, job: JobId) {
        let waiting = self.shared.lock().waiting.remove(&job).is_some();
        if waiting {
            self.shared.release(job);
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
        // Ranked before taking the admission lock: the executor has its own.
        let rank = self.shared.executor.rank_new(job, &hints);
        let rx = {
            let mut state = self.shared.lock();
            if let Some(waiter) = state.waiting.get_mut(&job) {
                // Another run of the same job is already waiting: wait along.
                let (tx, rx) = oneshot::channel();
                waiter.reply.push(tx);
                rx
            } else {
                match state.lanes.request_ranked(job, need, pinned, rank) {
                    Ok(Placement::Placed(lane)) => {
                        drop(state);
                        tracing::info!(
                            job = job.0,
                            lane = lane.0,
                            need = need.limit(),
                            "memory admitted"
                        );
                        // Held before scheduling: if that fails, its drop returns the share.
                        let reservation = LaneReservation {
                            shared: self.shared.clone(),
                            job,
                            lane,
                        };
                        self.shared.executor.add_job(job, lane, hints)?;
                        return Ok(reservation);
                    }
                    Ok(Placement::Waiting) => {
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
        let executor = Executor::new(by_name("pack").unwrap(), SchedConfig::default());
        Admission::new(
            LaneManager::new(capacity),
            Duration::from_millis(timeout_ms),
            executor,
        )
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
