//! `dlas`: discretized least attained service (Tiresias, Gu et al., NSDI'19),
//! the policy for jobs that give no length hint.
//!
//! Plain LAS (`las`) time-shares every job equally while their attained
//! service is similar, so jobs of similar length all finish late. Discretized
//! LAS keeps LAS's bias for short jobs but not its time-sharing:
//! - A job's queue is the number of [`QUEUE_THRESHOLDS`] its attained service
//!   has reached: queue 0 until 72 s of device time, queue 1 until 12
//!   minutes, queue 2 until 2 hours, queue 3 after. A lower queue runs first.
//! - Within a queue, arrival order (FIFO): the oldest job runs until it
//!   finishes or reaches the next threshold, so equals do not time-share.
//! - Starvation guard (Tiresias' rule): a job below queue 0 whose time waiting
//!   for the device since its last promotion reaches [`PROMOTE_KNOB`] times its
//!   service since then goes back to queue 0, and its counts restart there.
//!   Waiting grows while the job merely waits, so the core re-keys a lane's
//!   jobs every [`REFRESH_INTERVAL`] (see [`Policy::refresh_interval`]).
//!
//! The thresholds grow tenfold per queue, as job lengths spread over orders
//! of magnitude in production traces. They were tuned in the simulator
//! (docs/EVALUATION.md, section (a), has the sweep): the first sits just above
//! a minute, so one-minute jobs finish in queue 0 even when sharing the device
//! slows them; a threshold between it and 12 minutes would split
//! 5-minute jobs from 10-minute ones only by making them time-share, which
//! cost more than FIFO on the 1/5/10-minute trace.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{JobView, Nanos, Policy, SortKey};

const MINUTE: Nanos = 60 * SECOND;

const SECOND: Nanos = 1_000_000_000;

/// Attained device time at which a job moves down one queue.
pub const QUEUE_THRESHOLDS: [Nanos; 3] = [72 * SECOND, 12 * MINUTE, 120 * MINUTE];

/// A demoted job returns to queue 0 once its waiting time reaches this many
/// times its service since its last promotion (0: never). A guard against
/// starvation, not a share: each promotion delays the short jobs behind it,
/// and in the simulator knobs of 8 and 32 raised the mean JCT above FIFO's on
/// the 1/5/10-minute trace, while 128 fires only on waits far beyond ordinary
/// queueing (2.4 hours for a job demoted after 72 s).
pub const PROMOTE_KNOB: u64 = 128;

/// How often waiting jobs' keys are recomputed: promotions come after hours
/// of waiting, so a second's delay does not matter.
pub const REFRESH_INTERVAL: Nanos = SECOND;

pub struct Dlas {
    thresholds: Vec<Nanos>,
    promotions: Promotions,
}

impl Default for Dlas {
    fn default() -> Self {
        Dlas::new(QUEUE_THRESHOLDS.to_vec(), PROMOTE_KNOB)
    }
}

impl Dlas {
    /// `thresholds` ascending; `promote_knob` 0 disables promotion.
    pub fn new(mut thresholds: Vec<Nanos>, promote_knob: u64) -> Dlas {
        thresholds.sort_unstable();
        Dlas {
            thresholds,
            promotions: Promotions::new(promote_knob),
        }
    }

    /// The job's queue: 0 is served first.
    pub fn queue(&self, job: &JobView) -> usize {
        self.key(job).primary as usize
    }

    fn queue_of(&self, service: Nanos) -> usize {
        self.thresholds
            .iter()
            .take_while(|&&t| service >= t)
            .count()
    }
}

impl Policy for Dlas {
    fn name(&self) -> &'static str {
        "dlas"
    }
    fn rule(&self) -> &'static str {
        "least attained service, in discretized queues (FIFO within one)"
    }

    fn key(&self, job: &JobView) -> SortKey {
        let first = self.thresholds.first().copied().unwrap_or(Nanos::MAX);
        let service = self.promotions.service_since_promotion(job, first).attained;
        SortKey::new(job, self.queue_of(service) as i128, 0)
    }

    fn refresh_interval(&self) -> Option<Nanos> {
        (self.promotions.knob > 0).then_some(REFRESH_INTERVAL)
    }

    fn forget(&self, job: &JobView) {
        self.promotions.forget(job.id);
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    attained: Nanos,
    work: Nanos,
    waited: Nanos,
}

/// A job's service since its last promotion (or its start), in both measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Since {
    pub attained: Nanos,
    pub work: Nanos,
}

/// Tiresias' starvation guard, shared by `dlas` and `gittins`: per job, its
/// counts at its last promotion (absent: never promoted).
pub(super) struct Promotions {
    knob: u64,
    promoted_at: Mutex<HashMap<u64, Counts>>,
}

impl Default for Promotions {
    fn default() -> Self {
        Promotions::new(PROMOTE_KNOB)
    }
}

impl Promotions {
    pub(super) fn new(knob: u64) -> Promotions {
        Promotions {
            knob,
            promoted_at: Mutex::new(HashMap::new()),
        }
    }

    /// The job's service since its last promotion, as its rank should see
    /// it. A job with at least `eligible_from` of it that has waited `knob`
    /// times as long is promoted now: its counts restart, and it is 0.
    pub(super) fn service_since_promotion(&self, job: &JobView, eligible_from: Nanos) -> Since {
        let mut promoted_at = self
            .promoted_at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let since = promoted_at.get(&job.id).copied().unwrap_or_default();
        let service = job.attained.saturating_sub(since.attained);
        let waited = job.waited.saturating_sub(since.waited);
        if service >= eligible_from && self.knob > 0 && waited >= service.saturating_mul(self.knob)
        {
            promoted_at.insert(
                job.id,
                Counts {
                    attained: job.attained,
                    work: job.work,
                    waited: job.waited,
                },
            );
            return Since {
                attained: 0,
                work: 0,
            };
        }
        Since {
            attained: service,
            work: job.work.saturating_sub(since.work),
        }
    }

    pub(super) fn forget(&self, id: u64) {
        self.promoted_at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&id);
    }
}
