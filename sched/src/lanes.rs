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
//! Fixed lanes (GPU lanes, `--gpu-lanes`): TensorFlow splits a GPU into
//! virtual devices once per process, so there the lanes are opened at start
//! with fixed sizes, never grow, shrink or close, and a job may be pinned to
//! the lane whose device its graph was placed on. Inside a lane the sharing
//! rule is the same: sum(persistent) + max(ephemeral) <= size.
//!
//! Plain synchronous state, no I/O and no clock: the server wraps placements in
//! RAII reservations; tests and the simulator drive it directly.

use std::collections::{BTreeMap, HashMap};

use super::policy::SortKey;
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
    /// Waiting requests are re-checked in (rank, seq) order.
    rank: SortKey,
    seq: u64,
}

pub struct LaneManager {
    capacity: u64,
    lanes: BTreeMap<LaneId, Lane>,
    /// Sorted by (rank, seq).
    waiting: Vec<Request>,
    next_seq: u64,
    placed: HashMap<JobId, LaneId>,
    next_lane: u32,
    /// Lanes opened at start with fixed sizes (GPU virtual devices).
    fixed: bool,
}

impl LaneManager {
    pub fn new(capacity: u64) -> LaneManager {
        LaneManager {
            capacity,
            lanes: BTreeMap::new(),
            waiting: Vec::new(),
            next_seq: 0,
            placed: HashMap::new(),
            next_lane: 0,
            fixed: false,
        }
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
            waiting: Vec::new(),
            next_seq: 0,
            placed: HashMap::new(),
            next_lane: sizes.len() as u32,
            fixed: true,
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

    fn place(&mut self, request: Request) -> Option<LaneId> {
        let Request {
            job, need, pinned, ..
        } = request;
        let lane = if self.fixed {
            *self
                .lanes
                .iter()
                .filter(|(id, _)| pinned.is_none_or(|p| p == **id))
                .find(|(_, lane)| lane.size_with(need) <= lane.size)?
                .0
        } else if need.limit() <= self.free() {
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
        self.request_in(job, need, None)
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
        if self.placed.contains_key(&job) || self.waiting.iter().any(|r| r.job == job) {
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
            rank,
            seq: self.next_seq,
        };
        // Waiting requests were checked at the last change; only this one is new.
        Ok(match self.place(request) {
            Some(lane) => Placement::Placed(lane),
            None => {
                let at = self
                    .waiting
                    .partition_point(|r| (r.rank, r.seq) < (rank, request.seq));
                self.waiting.insert(at, request);
                Placement::Waiting
            }
        })
    }

    /// Releases a job's lane share (or withdraws its waiting request) and
    /// returns the waiting jobs that now got a lane.
    pub fn release(&mut self, job: JobId) -> Vec<(JobId, LaneId)> {
        self.waiting.retain(|r| r.job != job);
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
        let mut admitted = Vec::new();
        let waiting = std::mem::take(&mut self.waiting);
        for request in waiting {
            match self.place(request) {
                Some(lane) => admitted.push((request.job, lane)),
                None => self.waiting.push(request),
            }
        }
        admitted
    }

    pub fn lane_of(&self, job: JobId) -> Option<LaneId> {
        self.placed.get(&job).copied()
    }

    pub fn is_waiting(&self, job: JobId) -> bool {
        self.waiting.iter().any(|r| r.job == job)
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
}
