//! `learned`'s starvation guard, with a worst case.
//!
//! `dlas`' guard (Tiresias': promote a job that waited [`PROMOTE_KNOB`] times
//! its service back to queue 0) bounds nothing under an index policy: a
//! promoted job ranks as a new one, and a stream of jobs known to be short
//! (hints, or history) outranks a new unknown job forever; nor is a job with
//! under 72 s of service ever promoted. So `learned` promotes to the front:
//! - A job is **starved** once its iterations have waited, since its last
//!   promotion (or its start), at least max([`PROMOTE_KNOB`] x its service
//!   since then, [`STARVATION_FLOOR`]).
//! - A starved job is promoted: it ranks ahead of every job that is not
//!   promoted, promoted jobs by arrival, until it has run one iteration.
//!   Then its counts restart: it ranks by its index at its work since the
//!   promotion, as if new.
//!
//! The worst case for one job J, then: between two of J's iterations at
//! most max(KNOB x s, FLOOR) + [`REFRESH_INTERVAL`] passes before J is
//! promoted (s: J's service since its last promotion), and after it at most
//! one iteration of each job on J's lane that arrived before J (each runs
//! once and leaves the front, and cannot be promoted again within FLOOR),
//! plus the iteration running when J was promoted. The core test
//! `learned_bounds_the_wait_of_a_job_outranked_forever` drives that case.
//!
//! The knob is `dlas`' (see its tuning note); the floor is the knob's wait
//! for a job of one queue-0 threshold of service, so jobs `dlas` would not
//! promote wait no longer than those it would.

use std::collections::HashMap;
use std::sync::Mutex;

use super::dlas::{PROMOTE_KNOB, QUEUE_THRESHOLDS, REFRESH_INTERVAL};
use super::{JobView, Nanos};

/// The least wait that makes a job starved: 128 x 72 s, 2.56 hours.
pub const STARVATION_FLOOR: Nanos = PROMOTE_KNOB * QUEUE_THRESHOLDS[0];

/// The longest a job of `service_since_promotion` waits before it is
/// promoted to the front: the guard's first term of the worst case.
pub fn promotion_wait_bound(service_since_promotion: Nanos) -> Nanos {
    service_since_promotion
        .saturating_mul(PROMOTE_KNOB)
        .max(STARVATION_FLOOR)
        .saturating_add(REFRESH_INTERVAL)
}

/// Per job: its counts at its last promotion, and whether it is still at
/// the front (promoted, and has not run since).
#[derive(Default)]
pub struct Aging {
    promoted: Mutex<HashMap<u64, Promotion>>,
}

#[derive(Clone, Copy, Default)]
struct Promotion {
    attained: Nanos,
    work: Nanos,
    waited: Nanos,
    front: bool,
}

/// What the guard says of a job now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aged {
    /// Promoted and has not run since: ahead of every job that is not.
    pub front: bool,
    /// Work since its last promotion (all of it, if never promoted).
    pub work: Nanos,
}

impl Aging {
    pub fn check(&self, job: &JobView) -> Aged {
        let mut promoted = self
            .promoted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let since = promoted.get(&job.id).copied().unwrap_or_default();
        let service = job.attained.saturating_sub(since.attained);
        if since.front {
            if service == 0 {
                return Aged {
                    front: true,
                    work: 0,
                };
            }
            // It ran: back to its index, counts restarted at the promotion.
            promoted.insert(
                job.id,
                Promotion {
                    front: false,
                    ..since
                },
            );
        }
        let waited = job.waited.saturating_sub(since.waited);
        let limit = service.saturating_mul(PROMOTE_KNOB).max(STARVATION_FLOOR);
        if waited >= limit {
            promoted.insert(
                job.id,
                Promotion {
                    attained: job.attained,
                    work: job.work,
                    waited: job.waited,
                    front: true,
                },
            );
            return Aged {
                front: true,
                work: 0,
            };
        }
        Aged {
            front: false,
            work: job.work.saturating_sub(since.work),
        }
    }

    /// What [`Aging::check`] would say, without promoting: for explaining
    /// a rank, which must not change it.
    pub fn peek(&self, job: &JobView) -> Aged {
        let promoted = self
            .promoted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let since = promoted.get(&job.id).copied().unwrap_or_default();
        let front = since.front && job.attained == since.attained;
        Aged {
            front,
            work: if front {
                0
            } else {
                job.work.saturating_sub(since.work)
            },
        }
    }

    pub fn forget(&self, id: u64) {
        self.promoted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn view(attained: Nanos, waited: Nanos) -> JobView {
        JobView {
            id: 1,
            arrival: 0,
            attained,
            fair_attained: attained,
            work: attained,
            iterations: 1,
            priority: 0,
            remaining: None,
            waited,
            learned: None,
            sibling_work: 0,
        }
    }

    #[test]
    fn a_job_is_promoted_after_the_floor_or_the_knob_and_leaves_the_front_once_it_ran() {
        let aging = Aging::default();
        // Never ran: the floor applies.
        assert!(!aging.check(&view(0, STARVATION_FLOOR - 1)).front);
        let promoted = aging.check(&view(0, STARVATION_FLOOR));
        assert_eq!(
            promoted,
            Aged {
                front: true,
                work: 0
            }
        );
        // Still at the front while it waits; after one iteration, not.
        assert!(aging.check(&view(0, STARVATION_FLOOR + 10 * S)).front);
        let ran = aging.check(&view(2 * S, STARVATION_FLOOR + 10 * S));
        assert_eq!(
            ran,
            Aged {
                front: false,
                work: 2 * S
            }
        );
        // Counts restart at the promotion: 1 h of service since needs
        // 128 h of waiting since.
        let hour = 3600 * S;
        let later = view(2 * S + hour, STARVATION_FLOOR + 10 * S + 127 * hour);
        assert!(!aging.check(&later).front);
        let starved = view(2 * S + hour, STARVATION_FLOOR + 129 * hour);
        assert!(aging.check(&starved).front);
        assert_eq!(promotion_wait_bound(hour), 128 * hour + REFRESH_INTERVAL);
        aging.forget(1);
        assert!(!aging.check(&view(0, 0)).front);
    }
}
