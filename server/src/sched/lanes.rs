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
//! release, in arrival order, so a later request that fits may pass an earlier
//! one that does not. A job leaving a shared lane shrinks it to what the
//! remaining jobs need; the last job out returns the lane to the pool.
//!
//! Plain synchronous state, no I/O and no clock: the server wraps placements in
//! RAII reservations; tests and the simulator drive it directly.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{JobId, LaneId};

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
    #[error("job {0:?} already holds or awaits a lane")]
    Duplicate(JobId),
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

pub struct LaneManager {
    capacity: u64,
    lanes: BTreeMap<LaneId, Lane>,
    waiting: VecDeque<(JobId, MemoryNeed)>,
    placed: HashMap<JobId, LaneId>,
    next_lane: u32,
}

impl LaneManager {
    pub fn new(capacity: u64) -> LaneManager {
        LaneManager {
            capacity,
            lanes: BTreeMap::new(),
            waiting: VecDeque::new(),
            placed: HashMap::new(),
            next_lane: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes not given to any lane.
    pub fn free(&self) -> u64 {
        self.capacity
            .saturating_sub(self.lanes.values().map(|l| l.size).sum())
    }

    fn place(&mut self, job: JobId, need: MemoryNeed) -> Option<LaneId> {
        let lane = if need.limit() <= self.free() {
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
            let free = self.free();
            // Salus's rule (b), the lane growing from the free pool if needed.
            *self
                .lanes
                .iter()
                .find(|(_, lane)| lane.size_with(need) <= lane.size.saturating_add(free))?
                .0
        };
        let lane_state = self.lanes.get_mut(&lane).expect("lane exists");
        lane_state.size = lane_state.size.max(lane_state.size_with(need));
        lane_state.jobs.push((job, need));
        self.placed.insert(job, lane);
        Some(lane)
    }

    /// Asks for a lane. A job larger than the whole device is refused at once.
    pub fn request(&mut self, job: JobId, need: MemoryNeed) -> Result<Placement, LaneError> {
        if self.placed.contains_key(&job) || self.waiting.iter().any(|(j, _)| *j == job) {
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
        // Waiting requests were checked at the last change; only this one is new.
        Ok(match self.place(job, need) {
            Some(lane) => Placement::Placed(lane),
            None => {
                self.waiting.push_back((job, need));
                Placement::Waiting
            }
        })
    }

    /// Releases a job's lane share (or withdraws its waiting request) and
    /// returns the waiting jobs that now got a lane.
    pub fn release(&mut self, job: JobId) -> Vec<(JobId, LaneId)> {
        self.waiting.retain(|(j, _)| *j != job);
        if let Some(lane_id) = self.placed.remove(&job) {
            if let Some(lane) = self.lanes.get_mut(&lane_id) {
                lane.jobs.retain(|(j, _)| *j != job);
                if lane.jobs.is_empty() {
                    self.lanes.remove(&lane_id);
                } else {
                    // Shrink to what the remaining jobs need; the rest returns to the pool.
                    lane.size = lane.persistent() + lane.max_ephemeral();
                }
            }
        }
        self.rescan()
    }

    /// Re-checks every waiting request in arrival order.
    fn rescan(&mut self) -> Vec<(JobId, LaneId)> {
        let mut admitted = Vec::new();
        let waiting = std::mem::take(&mut self.waiting);
        for (job, need) in waiting {
            match self.place(job, need) {
                Some(lane) => admitted.push((job, lane)),
                None => self.waiting.push_back((job, need)),
            }
        }
        admitted
    }

    pub fn lane_of(&self, job: JobId) -> Option<LaneId> {
        self.placed.get(&job).copied()
    }

    pub fn is_waiting(&self, job: JobId) -> bool {
        self.waiting.iter().any(|(j, _)| *j == job)
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

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    fn need(p: u64, e: u64) -> MemoryNeed {
        MemoryNeed {
            persistent: p * GB,
            ephemeral: e * GB,
        }
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
}
