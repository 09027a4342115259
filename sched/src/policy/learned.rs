//! `learned`: the Gittins index over what the history knows of each job.
//!
//! Policies without length hints can only guess from the population: on
//! heavy-tailed traces even the Gittins index over the true law gets about
//! half of SRTF's gain over FIFO. But clusters resubmit the same work, and a
//! job whose identity ran before is not a draw from the population: its
//! length is close to its earlier runs'. So a job's law is, best first:
//! 1. its hints ([`JobView::remaining`]): a known length, index 1 / remaining
//!    (explicit hints win);
//! 2. its identity's history ([`JobView::learned`], fitted by
//!    [`crate::history::History::estimate`]): a log-normal around its runs'
//!    median with the spread the store learnt, ranked by that law's Gittins
//!    index at the job's work so far ([`super::lognormal`]);
//! 3. else the population: `gittins` over the jobs that finished (and the
//!    completed runs of the history, [`Policy::observe_past_run`]).
//!
//! All three are the same index (finishes per ns of work), so a known short
//! job passes an unknown one, and an unknown one passes a job known to be
//! long; SRTF's flaw with partial hints (any hinted job ahead of every
//! unhinted one) does not arise. A job that overruns its history's law
//! loses index as it ages, as the law says surprises are long. Jobs known
//! from history keep `gittins`' starvation guard.

use std::collections::HashMap;
use std::sync::Mutex;

use super::dlas::{Promotions, QUEUE_THRESHOLDS, REFRESH_INTERVAL};
use super::gittins::index_key;
use super::{Gittins, JobView, LogNormal, Nanos, Policy, SortKey};

#[derive(Default)]
pub struct Learned {
    population: Gittins,
    promotions: Promotions,
    /// Each job's last index, by id: the core re-keys every waiting job each
    /// [`REFRESH_INTERVAL`], but a job's index changes only when it works.
    cache: Mutex<HashMap<u64, CachedIndex>>,
}

#[derive(Clone, Copy, PartialEq)]
struct CachedIndex {
    work: Nanos,
    law: LogNormal,
    index: f64,
}

impl Learned {
    fn history_index(&self, job: &JobView, law: LogNormal) -> f64 {
        let work = self
            .promotions
            .service_since_promotion(job, QUEUE_THRESHOLDS[0])
            .work;
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(hit) = cache.get(&job.id) {
            if hit.work == work && hit.law == law {
                return hit.index;
            }
        }
        let index = law.gittins_index(work as f64);
        cache.insert(job.id, CachedIndex { work, law, index });
        index
    }
}

impl Policy for Learned {
    fn name(&self) -> &'static str {
        "learned"
    }

    fn key(&self, job: &JobView) -> SortKey {
        let index = match (job.remaining, job.learned) {
            (Some(remaining), _) => 1.0 / remaining.max(1) as f64,
            (None, Some(law)) => self.history_index(job, law),
            (None, None) => return self.population.key(job),
        };
        SortKey::new(job, index_key(index), 0)
    }

    fn refresh_interval(&self) -> Option<Nanos> {
        // The population's finished jobs change unknown jobs' indexes, and
        // promotions depend on waiting.
        Some(REFRESH_INTERVAL)
    }

    fn forget(&self, job: &JobView) {
        self.population.forget(job);
        self.promotions.forget(job.id);
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&job.id);
    }

    fn observe_past_run(&self, work: Nanos) {
        self.population.observe_past_run(work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Nanos = 60_000_000_000;

    fn view(id: u64, arrival: Nanos, work: Nanos) -> JobView {
        JobView {
            id,
            arrival,
            attained: work,
            fair_attained: work,
            work,
            iterations: 1,
            priority: 0,
            remaining: None,
            waited: 0,
            learned: None,
        }
    }

    fn known(id: u64, arrival: Nanos, work: Nanos, median: Nanos) -> JobView {
        JobView {
            learned: LogNormal::new(median as f64, 0.5),
            ..view(id, arrival, work)
        }
    }

    fn order(p: &Learned, jobs: &[JobView]) -> Vec<u64> {
        let mut sorted = jobs.to_vec();
        sorted.sort_by(|a, b| p.compare(a, b));
        sorted.iter().map(|j| j.id).collect()
    }

    #[test]
    fn a_job_known_to_be_short_passes_unknown_and_long_ones() {
        let p = Learned::default();
        for k in 1..=20 {
            p.observe_past_run(k * MIN);
        }
        let long = known(1, 0, 0, 120 * MIN);
        let unknown = view(2, 1, 0);
        let short = known(3, 2, 0, 2 * MIN);
        assert_eq!(order(&p, &[long, unknown, short]), [3, 2, 1]);
    }

    #[test]
    fn hints_win_over_history_on_the_same_scale() {
        let p = Learned::default();
        // History says 2 minutes, but the hint says 100 left: the job that
        // history says is 10 minutes goes first.
        let hinted = JobView {
            remaining: Some(100 * MIN),
            ..known(1, 0, 0, 2 * MIN)
        };
        let ten = known(2, 1, 0, 10 * MIN);
        assert_eq!(order(&p, &[hinted, ten]), [2, 1]);
        let nearly_done = JobView {
            remaining: Some(MIN),
            ..view(3, 2, 0)
        };
        assert_eq!(order(&p, &[hinted, ten, nearly_done]), [3, 2, 1]);
    }

    #[test]
    fn without_history_it_ranks_as_gittins() {
        let p = Learned::default();
        let g = Gittins::default();
        for k in 1..=20 {
            p.observe_past_run(k * MIN);
            g.observe_past_run(k * MIN);
        }
        for work in [0, MIN, 7 * MIN, 100 * MIN] {
            let job = view(1, 0, work);
            assert_eq!(p.key(&job), g.key(&job), "{work}");
        }
    }

    #[test]
    fn the_cached_index_follows_work_and_is_forgotten() {
        let p = Learned::default();
        let job = known(1, 0, 0, 10 * MIN);
        let fresh = p.key(&job);
        assert_eq!(p.key(&job), fresh);
        let worked = known(1, 0, 9 * MIN, 10 * MIN);
        assert_ne!(p.key(&worked), fresh, "nearly done: a higher index");
        assert!(p.key(&worked) < fresh);
        p.forget(&worked);
        assert!(p.cache.lock().unwrap().is_empty());
    }
}
