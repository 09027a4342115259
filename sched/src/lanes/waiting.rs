//! The waiting requests of a [`super::LaneManager`], indexed so that re-checking
//! them costs per kind of request, not per request.
//!
//! Whether a request can be placed depends only on its need and pin and on
//! the manager's state, and that state changes only when a request is placed.
//! So once a request fails, every later request of the same need and pin fails
//! too, until the next placement: a rescan skips them all at once. The result
//! is exactly a one-by-one scan in (rank, seq) order; with few distinct needs
//! (the simulator's models) a rescan no longer grows with the queue.

use std::cmp::Reverse;
use std::collections::{btree_map, BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::ops::Bound;

use super::Request;
use crate::policy::SortKey;
use crate::{JobId, LaneId, TenantId};

/// Where a request stands in the rescan order.
type Position = (SortKey, u64);

/// What placement decides on: persistent and ephemeral bytes, pin, owner
/// (the memory its tenant has reserved).
type Shape = (u64, u64, Option<LaneId>, TenantId);

fn shape_of(request: &Request) -> Shape {
    (
        request.need.persistent,
        request.need.ephemeral,
        request.pinned,
        request.owner,
    )
}

fn position_of(request: &Request) -> Position {
    (request.rank, request.seq)
}

#[derive(Default)]
pub(super) struct WaitQueue {
    /// Every waiting request, in rescan order.
    order: BTreeMap<Position, Request>,
    by_job: HashMap<JobId, Position>,
    /// Positions of the requests of each shape.
    by_shape: HashMap<Shape, BTreeSet<Position>>,
}

impl WaitQueue {
    pub(super) fn contains(&self, job: JobId) -> bool {
        self.by_job.contains_key(&job)
    }

    pub(super) fn insert(&mut self, request: Request) {
        let position = position_of(&request);
        if let Some(old) = self.by_job.insert(request.job, position) {
            self.forget(old);
        }
        self.by_shape
            .entry(shape_of(&request))
            .or_default()
            .insert(position);
        self.order.insert(position, request);
    }

    /// Withdraws `job`'s request, if it waits.
    pub(super) fn remove(&mut self, job: JobId) {
        if let Some(position) = self.by_job.remove(&job) {
            self.forget(position);
        }
    }

    fn forget(&mut self, position: Position) {
        let Some(request) = self.order.remove(&position) else {
            return;
        };
        let shape = shape_of(&request);
        if let Some(positions) = self.by_shape.get_mut(&shape) {
            positions.remove(&position);
            if positions.is_empty() {
                self.by_shape.remove(&shape);
            }
        }
    }

    /// The first request of `shape` after `after` (from the start if None).
    fn next_of(&self, shape: Shape, after: Option<Position>) -> Option<Position> {
        let positions = self.by_shape.get(&shape)?;
        match after {
            None => positions.first().copied(),
            Some(after) => positions
                .range((Bound::Excluded(after), Bound::Unbounded))
                .next()
                .copied(),
        }
    }

    /// Offers the requests to `place` in rescan order, as a scan of every one
    /// would, and removes those it places; returns them with their lanes.
    /// `place` must decide by shape and the state it changes only on success.
    pub(super) fn place_in_order(
        &mut self,
        mut place: impl FnMut(&Request) -> Option<LaneId>,
    ) -> Vec<(JobId, LaneId)> {
        let mut admitted = Vec::new();
        // The next request of each shape still worth trying, earliest first.
        let mut candidates: BinaryHeap<Reverse<(Position, Shape)>> = self
            .by_shape
            .iter()
            .filter_map(|(&shape, positions)| Some(Reverse((*positions.first()?, shape))))
            .collect();
        // Shapes that failed since the last placement: they fail until the next.
        let mut failed: Vec<Shape> = Vec::new();
        while let Some(Reverse((position, shape))) = candidates.pop() {
            let Some(request) = self.order.get(&position).copied() else {
                continue;
            };
            match place(&request) {
                None => failed.push(shape),
                Some(lane) => {
                    admitted.push((request.job, lane));
                    self.remove(request.job);
                    // The state changed: every shape may fit again after here.
                    failed.push(shape);
                    for shape in failed.drain(..) {
                        if let Some(next) = self.next_of(shape, Some(position)) {
                            candidates.push(Reverse((next, shape)));
                        }
                    }
                }
            }
        }
        admitted
    }
}

impl<'a> IntoIterator for &'a WaitQueue {
    type Item = &'a Request;
    type IntoIter = btree_map::Values<'a, Position, Request>;

    /// The waiting requests in rescan order.
    fn into_iter(self) -> Self::IntoIter {
        self.order.values()
    }
}
