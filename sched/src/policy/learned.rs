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
//!    index at the job's work so far ([`crate::law`]);
//! 3. else the population's law: a log-normal fitted to the work of the
//!    last [`WINDOW`] jobs that finished and the history's completed runs
//!    ([`Policy::observe_past_run`]); `dlas` until [`MIN_SAMPLES`] are in.
//!    A job of an identity with live runs ranks as at least as old as the
//!    oldest of them ([`JobView::sibling_work`]): runs of one script are
//!    alike, so a sibling that has done w without finishing says this run
//!    likely needs w too. Without it the runs of a new script that arrive
//!    together (a sweep) share the device as equals, none finishes, and all
//!    hold lane memory while shorter jobs wait outside for it.
//!
//! The population is fitted, not taken as `gittins`' empirical sample: in a
//! backlog the jobs that finished are the short ones, and the empirical
//! index ranks a job that outlived all of them after every other (measured
//! on recurring traces: 4-10 points of SRTF's gain lost); the fitted law's
//! tail decays smoothly instead.
//!
//! All three are the same index (finishes per ns of work), so a known short
//! job passes an unknown one, and an unknown one passes a job known to be
//! long; SRTF's flaw with partial hints (any hinted job ahead of every
//! unhinted one) does not arise. A job that overruns its history's law
//! loses index as it ages, as the law says surprises are long. Every job has
//! the starvation guard of [`super::aging`], which bounds its wait.

use std::collections::HashMap;
use std::sync::Mutex;

use super::aging::Aging;
use super::dlas::REFRESH_INTERVAL;
use super::gittins::index_key;
use super::population::{Estimator, Population, PopulationLaw};
use crate::law::IndexTable;
use super::{Basis, Dlas, Expected, JobView, LogNormal, Nanos, Policy, SortKey};

/// Spreads are rounded to this step to share index tables: a difference of
/// half a step in sigma moves no index by more than a fraction of a percent.
const SIGMA_STEP: f64 = 0.01;

pub struct Learned {
    /// Ranks jobs of unknown length until the population has a law.
    before_samples: Dlas,
    /// The starvation guard ([`super::aging`]).
    aging: Aging,
    /// Each job's last index, by id: the core re-keys every waiting job each
    /// [`REFRESH_INTERVAL`], but a job's index changes only when it works.
    cache: Mutex<HashMap<u64, CachedIndex>>,
    /// One index table per (rounded) spread in use.
    tables: Mutex<HashMap<u32, std::sync::Arc<IndexTable>>>,
    /// The law of jobs whose identity has no history ([`super::population`]).
    population: Mutex<Population>,
}

impl Default for Learned {
    fn default() -> Self {
        Learned::with_estimator(Estimator::default())
    }
}

#[derive(Clone, Copy, PartialEq)]
struct CachedIndex {
    work: Nanos,
    law: LawKey,
    index: f64,
}

/// Which law an index was computed under.
#[derive(Clone, Copy, PartialEq)]
enum LawKey {
    /// The job's own (from history) or a fitted population log-normal.
    LogNormal(LogNormal),
    /// The population's step law of this version.
    Population(u64),
}

impl Learned {
    /// `learned` with the population's law estimated by `estimator` (the
    /// simulator compares them; the server uses the default).
    pub fn with_estimator(estimator: Estimator) -> Learned {
        Learned {
            before_samples: Dlas::default(),
            aging: Aging::default(),
            cache: Mutex::default(),
            tables: Mutex::default(),
            population: Mutex::new(Population::new(estimator)),
        }
    }

    fn lock_population(&self) -> std::sync::MutexGuard<'_, Population> {
        self.population
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The work `job` is ranked at: since its last promotion (the
    /// starvation guard), and, for a run whose identity has no law yet, at
    /// least its longest live sibling's (runs of one script are alike).
    fn ranked_work(job: &JobView, since_promotion: Nanos) -> Nanos {
        since_promotion.max(job.sibling_work)
    }

    /// The index of `job` under `law` (cached per job, work and law).
    fn index_under(&self, job: &JobView, work: Nanos, key: LawKey, compute: impl FnOnce(f64) -> f64) -> f64 {
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(hit) = cache.get(&job.id) {
            if hit.work == work && hit.law == key {
                return hit.index;
            }
        }
        let index = compute(work as f64);
        cache.insert(job.id, CachedIndex { work, law: key, index });
        index
    }

    fn law_index(&self, job: &JobView, work: Nanos, law: LogNormal) -> f64 {
        self.index_under(job, work, LawKey::LogNormal(law), |work| {
            self.table(law.sigma).index(law.median_ns(), work)
        })
    }

    fn table(&self, sigma: f64) -> std::sync::Arc<IndexTable> {
        let step = (sigma / SIGMA_STEP).round().max(1.0) as u32;
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(step)
            .or_insert_with(|| std::sync::Arc::new(IndexTable::new(step as f64 * SIGMA_STEP)))
            .clone()
    }
}

impl Policy for Learned {
    fn name(&self) -> &'static str {
        "learned"
    }
    fn rule(&self) -> &'static str {
        "best Gittins index of its learned length first"
    }

    fn key(&self, job: &JobView) -> SortKey {
        let aged = self.aging.check(job);
        if aged.front {
            // Starved: ahead of every job that is not, by arrival.
            return SortKey::new(job, i128::MIN, 0);
        }
        let work = Self::ranked_work(job, aged.work);
        let index = match (job.remaining, job.learned) {
            (Some(remaining), _) => 1.0 / remaining.max(1) as f64,
            (None, Some(law)) => self.law_index(job, work, law),
            (None, None) => {
                let population = {
                    let mut population = self.lock_population();
                    population.observe_live(job.id, job.work);
                    population.law()
                };
                match population {
                    Some((law, version)) => match &*law {
                        PopulationLaw::LogNormal(fit, _) => self.law_index(job, work, *fit),
                        PopulationLaw::Steps(steps) => self
                            .index_under(job, work, LawKey::Population(version), |work| {
                                steps.gittins_index(work).unwrap_or_else(|| {
                                    let tail = steps.tail();
                                    self.table(tail.sigma).index(tail.median_ns(), work)
                                })
                            }),
                    },
                    // Below index keys' range (at most 1): after known jobs.
                    None => return self.before_samples.key(job),
                }
            }
        };
        SortKey::new(job, index_key(index), 0)
    }

    fn refresh_interval(&self) -> Option<Nanos> {
        // Finished jobs change the population's law, and promotions depend
        // on waiting.
        Some(REFRESH_INTERVAL)
    }

    fn forget(&self, job: &JobView) {
        self.lock_population().finished(job.id, job.work);
        self.before_samples.forget(job);
        self.aging.forget(job.id);
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&job.id);
    }

    fn observe_past_run(&self, work: Nanos) {
        self.lock_population().past_run(work);
    }

    fn expected(&self, job: &JobView) -> Option<Expected> {
        let aged = self.aging.peek(job);
        let work = Self::ranked_work(job, aged.work) as f64;
        let (remaining_ns, basis) = match (job.remaining, job.learned) {
            (Some(remaining), _) => (remaining as f64, Basis::Hints),
            (None, Some(law)) => (law.median_remaining(work), Basis::History),
            (None, None) => {
                let (law, _) = self.lock_population().law()?;
                let remaining = match &*law {
                    PopulationLaw::LogNormal(fit, _) => fit.median_remaining(work),
                    PopulationLaw::Steps(steps) => steps.median_remaining(work),
                };
                (remaining, Basis::Population { jobs: law.jobs() })
            }
        };
        Some(Expected {
            remaining_ns,
            basis,
            promoted: aged.front,
        })
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
            sibling_work: 0,
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
    fn without_history_it_ranks_by_the_populations_law() {
        // Without the prior, too few finished jobs: dlas queues, behind
        // every job with a law.
        let p = Learned::with_estimator(Estimator::Censored);
        let dlas = Dlas::default();
        let unknown = view(1, 0, 0);
        assert_eq!(p.key(&unknown), dlas.key(&unknown));
        assert!(p.key(&known(2, 1, 0, 600 * MIN)) < p.key(&unknown));
        // With the prior there is a law from the start.
        let with_prior = Learned::with_estimator(Estimator::CensoredWithPrior);
        assert_ne!(with_prior.key(&unknown), dlas.key(&unknown));
        for p in [&p, &with_prior] {
            // A population of 1-20 minutes: a newcomer ranks by its law,
            // ahead of a job known to take 10 hours, behind one of 1 minute.
            for k in 1..=20 {
                p.observe_past_run(k * MIN);
            }
            let unknown = p.key(&unknown);
            assert!(p.key(&known(2, 1, 0, 600 * MIN)) > unknown);
            assert!(p.key(&known(3, 2, 0, MIN / 2)) < unknown);
        }
        // A job that left adds its work to the population: a job 80 minutes
        // in ranks better once jobs are seen to end at 90.
        let old = view(5, 0, 80 * MIN);
        let before = with_prior.key(&old);
        for id in 10..30 {
            with_prior.forget(&view(id, 0, 90 * MIN));
        }
        let after = with_prior.key(&old);
        assert!(after < before, "{after:?} < {before:?}");
    }

    #[test]
    fn a_job_without_a_law_ranks_as_old_as_its_longest_live_sibling() {
        let p = Learned::default();
        for k in 1..=20 {
            p.observe_past_run(k * MIN);
        }
        let fresh = view(1, 0, 0);
        let sibling = JobView {
            sibling_work: 90 * MIN,
            ..view(2, 0, 0)
        };
        assert_eq!(
            p.key(&sibling).primary,
            p.key(&view(3, 0, 90 * MIN)).primary
        );
        assert!(p.key(&fresh) < p.key(&sibling));
        // Its own work counts when it is more; a law from history wins.
        let ahead = JobView {
            sibling_work: MIN,
            ..view(4, 0, 90 * MIN)
        };
        assert_eq!(p.key(&ahead).primary, p.key(&view(3, 0, 90 * MIN)).primary);
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
