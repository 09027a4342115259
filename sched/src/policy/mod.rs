//! Scheduling policies. Each ranks the jobs of a lane; the scheduler core runs
//! the best-ranked job that has an iteration ready (see [`Hold`] for when it
//! waits for the best job instead).
//!
//! | name | rule |
//! |---|---|
//! | `fifo` | earliest-admitted job first, and no other job runs while it lives |
//! | `srtf` | least remaining time (hints + measured iteration time); `gittins` without hints |
//! | `pack` | arrival order, work-conserving (Salus's default) |
//! | `fair` | least attained device time, newcomers start at the lane's minimum |
//! | `rr` | fewest finished iterations |
//! | `priority` | highest priority hint, ties by `fair` |
//! | `las` | least attained service, favours short jobs but time-shares equals |
//! | `dlas` | discretized LAS (Tiresias): queues by attained service, FIFO within one, starvation guard |
//! | `gittins` | Gittins index over finished jobs' lengths (Tiresias): `dlas` until 10 have finished |
//! | `learned` | Gittins index over the job's own law: its hints, else its identity's history, else `gittins` |

pub mod aging;
mod dlas;
mod fair;
mod fifo;
mod gittins;
mod las;
mod learned;
mod pack;
pub mod population;
mod priority;
mod rr;
mod srtf;

use std::cmp::Ordering;

use super::Nanos;

pub use dlas::Dlas;
pub use fair::Fair;
pub use fifo::Fifo;
pub use gittins::Gittins;
pub use las::Las;
pub use learned::Learned;
pub use crate::law::LogNormal;
pub use pack::Pack;
pub use priority::Priority;
pub use rr::RoundRobin;
pub use srtf::Srtf;

/// What a policy sees of a job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct JobView {
    pub id: u64,
    /// Admission time.
    pub arrival: Nanos,
    /// Device time used by main iterations.
    pub attained: Nanos,
    /// `attained` plus the lane's minimum at admission: equalises service
    /// among the jobs present without crediting newcomers with a head start.
    pub fair_attained: Nanos,
    /// `attained` as if every iteration had run as fast as the job's fastest
    /// one (plus its cheap runs): its service without the stretching that
    /// sharing the device with other lanes adds, for policies that learn
    /// lengths from finished jobs.
    pub work: Nanos,
    pub iterations: u64,
    pub priority: i32,
    /// Expected remaining device time, when hints allow an estimate.
    pub remaining: Option<Nanos>,
    /// Time its iterations spent queued for the device; as of the key's
    /// computation for policies with a [`Policy::refresh_interval`].
    pub waited: Nanos,
    /// The law of its length learnt from its identity's earlier runs
    /// ([`crate::history`]), as of its admission; None: no identity, or
    /// none of its runs completed.
    pub learned: Option<LogNormal>,
    /// Without a learnt law: the most work any other live run of its
    /// identity has done without finishing (0: none, or no identity). A
    /// lower bound on what its own run is likely to need.
    pub sibling_work: Nanos,
}

/// Whether the lane waits for the best job when it has no iteration ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Run the best job that has an iteration ready (work-conserving).
    Never,
    /// Wait for the best job while it is between iterations (its last one
    /// ended within the scheduler's anticipation window), so a client's
    /// think time between steps does not hand the device to a worse job.
    WhileActive,
    /// Wait for the best job as long as it lives (strict FIFO).
    Always,
}

/// A job's rank under a policy: smaller runs first. Keys change only when the
/// job itself changes (an iteration ends, hints change), which lets the core
/// keep jobs in ordered indexes instead of scanning them per decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SortKey {
    pub primary: i128,
    pub secondary: i128,
    /// Every policy breaks ties by arrival, then job id.
    pub arrival: Nanos,
    pub id: u64,
}

impl SortKey {
    pub fn new(job: &JobView, primary: i128, secondary: i128) -> SortKey {
        SortKey {
            primary,
            secondary,
            arrival: job.arrival,
            id: job.id,
        }
    }
}

/// A policy's expectation of a job's remaining work, and what it rests on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expected {
    /// Median remaining device time, ns.
    pub remaining_ns: f64,
    pub basis: Basis,
    /// Promoted by the starvation guard: ahead of jobs that are not.
    pub promoted: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// The job's own hints.
    Hints,
    /// Its identity's earlier runs.
    History,
    /// No history: the node's law of jobs, estimated from this many jobs
    /// (finished and running; 0: the prior alone).
    Population { jobs: usize },
}

pub trait Policy: Send + Sync {
    fn name(&self) -> &'static str;
    /// Its ranking rule in a few words, for "why is my job waiting" notes.
    fn rule(&self) -> &'static str;
    fn key(&self, job: &JobView) -> SortKey;
    fn hold(&self) -> Hold {
        Hold::WhileActive
    }
    /// For policies whose keys also change while a job waits: how often the
    /// core must recompute the keys of a lane's jobs. None: keys change only
    /// when their job changes.
    fn refresh_interval(&self) -> Option<Nanos> {
        None
    }
    /// The job left the scheduler (finished or closed; `job` is its last
    /// view): drop whatever the policy kept about it.
    fn forget(&self, _job: &JobView) {}
    /// A completed run of `work` ns from before this scheduler started (its
    /// history): policies that learn lengths from finished jobs count it as
    /// one.
    fn observe_past_run(&self, _work: Nanos) {}
    /// What the policy expects of `job`'s remaining work, for explaining a
    /// rank; None for policies that rank without lengths.
    fn expected(&self, _job: &JobView) -> Option<Expected> {
        None
    }
    /// True when a job's key depends on nothing its iterations change (only
    /// arrival, id, hints): the core may then skip boundaries whose winner it
    /// already knows ([`crate::Scheduler::can_defer_boundary`]).
    fn key_is_fixed(&self) -> bool {
        false
    }
    /// `Less` when `a` should run before `b`.
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        self.key(a).cmp(&self.key(b))
    }
}

pub const NAMES: &[&str] = &[
    "fifo", "srtf", "pack", "fair", "rr", "priority", "las", "dlas", "gittins", "learned",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown scheduling policy {0:?}; choose one of: fifo, srtf, pack, fair, rr, priority, las, dlas, gittins, learned"
)]
pub struct UnknownPolicy(pub String);

pub fn by_name(name: &str) -> Result<Box<dyn Policy>, UnknownPolicy> {
    Ok(match name {
        "fifo" => Box::new(Fifo),
        "srtf" => Box::new(Srtf::default()),
        "pack" => Box::new(Pack),
        "fair" => Box::new(Fair),
        "rr" => Box::new(RoundRobin),
        "priority" => Box::new(Priority),
        "las" => Box::new(Las),
        "dlas" => Box::new(Dlas::default()),
        "gittins" => Box::new(Gittins::default()),
        "learned" => Box::new(Learned::default()),
        other => return Err(UnknownPolicy(other.to_string())),
    })
}

#[cfg(test)]
mod tests;
