//! The law of a job whose identity has no history, learned online from the
//! node's own jobs: what `learned` ranks such a job by.
//!
//! The estimator ([`Estimator::Censored`], the default) is Kaplan–Meier's:
//! the lengths of the last [`WINDOW`] jobs that finished (and the history's
//! completed runs) are events, and the work done so far by every live job is
//! a censored observation (it will be at least that long). In a backlog the
//! jobs that finish first are the short ones; without the censored jobs the
//! law would say every job is short, and a job that outlived the finished
//! ones would rank after every other (measured: 4-10 points of SRTF's gain
//! lost on recurring traces). The estimate is a step law: it keeps the shape
//! of what the node runs, so a few typical lengths (light tails: a job past one
//! typical length is promised the next, FIFO-like) and lengths over orders of
//! magnitude (heavy tails: the index falls with age, LAS-like) both come out
//! right, where one fitted log-normal (the estimator before, kept as
//! [`Estimator::LogNormalFit`]) is right only for the second.
//!
//! Beyond the last finished length the steps say nothing; the mass left
//! there is spread by a log-normal fitted to the observations' logs
//! ([`LogNormal::fit_logs`]), conditioned on exceeding that length, so a
//! job older than every finished one still ages smoothly.
//!
//! Before [`MIN_SAMPLES`] jobs have finished there is no law, and `dlas`
//! ranks (LAS-like, right for heavy tails, FIFO within a queue for light
//! ones). [`Estimator::CensoredWithPrior`] replaces that phase with a prior
//! that fades as data arrives: [`PRIOR_JOBS`] pseudo-jobs spread over the
//! quantiles of [`PRIOR_MEDIAN_NS`] and [`PRIOR_SIGMA`], each of weight
//! [`PRIOR_WEIGHT`], so n real jobs outweigh it n / [`PRIOR_TOTAL`] to one.
//! It is not the default: on the paper's training traces it cost up to 10
//! points of mean JCT against `fair` (docs/EVALUATION.md, (f)), as its
//! pseudo-jobs of hours kept the first jobs' ranks LAS-like after the node's
//! 1/5/10-minute jobs had said otherwise.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::law::LogNormal;
use crate::Nanos;

/// How many of the most recent finished jobs are events.
pub const WINDOW: usize = super::gittins::WINDOW;

/// Finished jobs needed before a law without a prior replaces `dlas`.
pub const MIN_SAMPLES: usize = super::gittins::MIN_SAMPLES;

/// The prior: a typical training job is minutes to hours long.
pub const PRIOR_MEDIAN_NS: f64 = 10.0 * 60e9;
pub const PRIOR_SIGMA: f64 = 1.5;
/// Pseudo-jobs of the prior and the weight of each: together worth
/// [`PRIOR_TOTAL`] real jobs.
pub const PRIOR_JOBS: usize = 16;
pub const PRIOR_WEIGHT: f64 = 0.25;
pub const PRIOR_TOTAL: f64 = PRIOR_JOBS as f64 * PRIOR_WEIGHT;

/// End points of the tail tried per index, beyond the last finished length.
const TAIL_POINTS: usize = 48;
/// The tail's grid reaches this many standard deviations.
const TAIL_REACH: f64 = 6.0;

/// How the population's law is estimated (the simulator's `learning`
/// experiment compares them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Estimator {
    /// One log-normal fitted to the finished jobs' lengths.
    LogNormalFit,
    /// The finished jobs' lengths as steps (no censored live jobs).
    Empirical,
    /// Kaplan–Meier over finished and live jobs, with a fitted tail.
    #[default]
    Censored,
    /// [`Estimator::Censored`] with the fading prior.
    CensoredWithPrior,
}

impl Estimator {
    pub const ALL: [Estimator; 4] = [
        Estimator::LogNormalFit,
        Estimator::Empirical,
        Estimator::Censored,
        Estimator::CensoredWithPrior,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Estimator::LogNormalFit => "lognormal-fit",
            Estimator::Empirical => "empirical",
            Estimator::Censored => "censored",
            Estimator::CensoredWithPrior => "censored+prior",
        }
    }

    fn censors_live_jobs(self) -> bool {
        matches!(self, Estimator::Censored | Estimator::CensoredWithPrior)
    }

    fn has_prior(self) -> bool {
        self == Estimator::CensoredWithPrior
    }
}

/// The population's law as of the last finished job.
#[derive(Debug)]
pub enum PopulationLaw {
    /// The fitted law, and how many finished jobs it was fitted to.
    LogNormal(LogNormal, usize),
    Steps(StepLaw),
}

impl PopulationLaw {
    /// Jobs it was estimated from (finished, and live where they count;
    /// the prior excluded).
    pub fn jobs(&self) -> usize {
        match self {
            PopulationLaw::LogNormal(_, jobs) => *jobs,
            PopulationLaw::Steps(steps) => steps.jobs,
        }
    }
}

/// A step survival function S (Kaplan–Meier) with a log-normal tail.
#[derive(Debug)]
pub struct StepLaw {
    /// Distinct finished lengths, ascending.
    times: Vec<f64>,
    /// `survival[i]` = S(t) for t in [times[i], times[i+1]).
    survival: Vec<f64>,
    /// `integral[i]` = the integral of S from 0 to times[i]: E[min(S, times[i])].
    integral: Vec<f64>,
    /// Lengths beyond the last finished one follow this law, conditioned.
    tail: LogNormal,
    /// Points x of the tail tried as end points, with what ends and what is
    /// served between the last step and x (unconditional): the same for
    /// every job, so computed once per law.
    tail_points: Vec<TailPoint>,
    jobs: usize,
}

#[derive(Debug, Clone, Copy)]
struct TailPoint {
    ended: f64,
    served: f64,
}

/// One observation: a length (ns), its weight, and whether the job ended
/// there (false: it was still running, so it is at least that long).
#[derive(Clone, Copy)]
struct Observation {
    at: f64,
    weight: f64,
    ended: bool,
}

impl StepLaw {
    /// Kaplan–Meier over `observations` (any order); None without an ending.
    fn estimate(
        mut observations: Vec<Observation>,
        tail: LogNormal,
        jobs: usize,
    ) -> Option<StepLaw> {
        // Ascending; at a tie an ending comes first: a job censored at t was
        // at risk of ending at t.
        observations.sort_by(|a, b| a.at.total_cmp(&b.at).then(b.ended.cmp(&a.ended)));
        let mut at_risk: f64 = observations.iter().map(|o| o.weight).sum();
        let (mut times, mut survival, mut integral) = (Vec::new(), Vec::new(), Vec::new());
        let (mut s, mut area, mut last_t) = (1.0f64, 0.0f64, 0.0f64);
        let mut k = 0;
        while k < observations.len() {
            let t = observations[k].at;
            let (mut ended, mut leaving) = (0.0, 0.0);
            while k < observations.len() && observations[k].at == t {
                if observations[k].ended {
                    ended += observations[k].weight;
                }
                leaving += observations[k].weight;
                k += 1;
            }
            if ended > 0.0 && at_risk > 0.0 {
                area += s * (t - last_t);
                last_t = t;
                s *= (1.0 - ended / at_risk).max(0.0);
                times.push(t);
                survival.push(s);
                integral.push(area);
            }
            at_risk -= leaving;
        }
        let (&last, &s_last) = (times.last()?, survival.last()?);
        let beyond = tail.survival(last);
        let tail_points = if s_last > 0.0 && beyond > 0.0 {
            // Mass past the last step ends as the tail law, given > last.
            let scale = s_last / beyond;
            let z0 = ((last.ln() - tail.mu) / tail.sigma).max(-TAIL_REACH);
            let step = TAIL_REACH / TAIL_POINTS as f64;
            (1..=TAIL_POINTS)
                .map(|k| {
                    let x = (tail.mu + tail.sigma * (z0 + step * k as f64)).exp();
                    TailPoint {
                        ended: scale * (beyond - tail.survival(x)),
                        served: scale * tail.served_between(last, x),
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        Some(StepLaw {
            times,
            survival,
            integral,
            tail,
            tail_points,
            jobs,
        })
    }

    /// The law of lengths past the last finished one.
    pub fn tail(&self) -> LogNormal {
        self.tail
    }

    /// S(a) and the integral of S from 0 to a, and how many steps lie at or
    /// below a.
    fn at(&self, a: f64) -> (usize, f64, f64) {
        let j = self.times.partition_point(|&t| t <= a);
        if j == 0 {
            (0, 1.0, a)
        } else {
            let s = self.survival[j - 1];
            (j, s, self.integral[j - 1] + s * (a - self.times[j - 1]))
        }
    }

    /// P(S > a).
    pub fn survival(&self, a: f64) -> f64 {
        let (j, s, _) = self.at(a);
        if j < self.times.len() {
            return s;
        }
        let last = self.times[self.times.len() - 1];
        let beyond = self.tail.survival(last);
        if beyond > 0.0 {
            s * self.tail.survival(a) / beyond
        } else {
            0.0
        }
    }

    /// The Gittins index of a job that has done `a` ns of work: the best
    /// (P(ends by x) / expected work until x), both given it reached a, over
    /// the finished lengths above a and points of the tail. None for a job
    /// older than every finished one: only the tail law speaks for it, and
    /// its index is [`StepLaw::tail`]'s (which callers tabulate).
    pub fn gittins_index(&self, a: f64) -> Option<f64> {
        let a = a.max(0.0);
        let (j, s_a, area_a) = self.at(a);
        let n = self.times.len();
        if j == n || s_a <= 0.0 {
            return None;
        }
        let mut best = 0.0f64;
        for i in j..n {
            let ended = s_a - self.survival[i];
            let served = self.integral[i] - area_a;
            if ended > 0.0 && served > 0.0 {
                best = best.max(ended / served);
            }
        }
        let (ended_to_last, served_to_last) =
            (s_a - self.survival[n - 1], self.integral[n - 1] - area_a);
        for point in &self.tail_points {
            let (ended, served) = (ended_to_last + point.ended, served_to_last + point.served);
            if ended > 0.0 && served > 0.0 {
                best = best.max(ended / served);
            }
        }
        Some(if best > 0.0 {
            best
        } else {
            self.tail.gittins_index(a)
        })
    }

    /// The median remaining work of a job that has done `a`, in ns (for
    /// explaining a rank).
    pub fn median_remaining(&self, a: f64) -> f64 {
        let s_a = self.survival(a);
        if s_a <= 0.0 {
            return 0.0;
        }
        let half = s_a / 2.0;
        let (j, _, _) = self.at(a);
        for i in j..self.times.len() {
            if self.survival[i] <= half {
                return self.times[i] - a;
            }
        }
        // In the tail: solve S(x) = half there by bisection in z.
        let (mut lo, mut hi) = (self.times[self.times.len() - 1].max(a), f64::MAX.sqrt());
        for _ in 0..200 {
            let mid = (lo * hi).sqrt();
            if self.survival(mid) > half {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi / lo < 1.0 + 1e-9 {
                break;
            }
        }
        lo - a
    }
}

/// The jobs the law is learned from, and the law as of the last change.
pub struct Population {
    estimator: Estimator,
    /// Lengths of the last [`WINDOW`] finished jobs, ns.
    finished: VecDeque<Nanos>,
    /// Work so far of each live job (by id) that has done some.
    live: HashMap<u64, Nanos>,
    law: Option<Arc<PopulationLaw>>,
    stale: bool,
    /// Bumped at each new law, so callers can cache indexes per law.
    version: u64,
}

impl Population {
    pub fn new(estimator: Estimator) -> Population {
        Population {
            estimator,
            finished: VecDeque::new(),
            live: HashMap::new(),
            law: None,
            stale: true,
            version: 0,
        }
    }

    pub fn estimator(&self) -> Estimator {
        self.estimator
    }

    /// A live job's work so far (censored: it will be at least this long).
    /// Read at the next finish, so a job's progress does not re-estimate
    /// the law at every iteration.
    pub fn observe_live(&mut self, id: u64, work: Nanos) {
        if work > 0 && self.estimator.censors_live_jobs() {
            self.live.insert(id, work);
        }
    }

    /// A job ended having done `work` (0: it never ran; not sampled).
    pub fn finished(&mut self, id: u64, work: Nanos) {
        self.live.remove(&id);
        self.push(work);
    }

    /// A completed run from the history store.
    pub fn past_run(&mut self, work: Nanos) {
        self.push(work);
    }

    fn push(&mut self, work: Nanos) {
        if work == 0 {
            return;
        }
        if self.finished.len() == WINDOW {
            self.finished.pop_front();
        }
        self.finished.push_back(work);
        self.stale = true;
    }

    /// The current law and its version; None before there is one (too few
    /// finished jobs, and no prior).
    pub fn law(&mut self) -> Option<(Arc<PopulationLaw>, u64)> {
        if self.stale {
            self.stale = false;
            self.law = self.estimate().map(Arc::new);
            self.version += 1;
        }
        self.law.clone().map(|law| (law, self.version))
    }

    fn prior() -> LogNormal {
        LogNormal::new(PRIOR_MEDIAN_NS, PRIOR_SIGMA).expect("the prior's constants are positive")
    }

    fn estimate(&self) -> Option<PopulationLaw> {
        let prior = self.estimator.has_prior();
        if self.finished.len() < MIN_SAMPLES && !prior {
            return None;
        }
        let logs = || self.finished.iter().map(|&w| (w as f64).ln());
        let fitted = LogNormal::fit_logs(logs());
        // The tail is fitted to the live jobs' work too: at least that long,
        // they keep it from being as short as the jobs that finish first.
        let tail_fit = if self.estimator.censors_live_jobs() {
            LogNormal::fit_logs(logs().chain(self.live.values().map(|&w| (w as f64).ln())))
        } else {
            fitted
        };
        if self.estimator == Estimator::LogNormalFit {
            return fitted.map(|law| PopulationLaw::LogNormal(law, self.finished.len()));
        }
        let mut observations: Vec<Observation> = self
            .finished
            .iter()
            .map(|&w| Observation {
                at: w as f64,
                weight: 1.0,
                ended: true,
            })
            .collect();
        if self.estimator.censors_live_jobs() {
            observations.extend(self.live.values().map(|&w| Observation {
                at: w as f64,
                weight: 1.0,
                ended: false,
            }));
        }
        let jobs = observations.len();
        let tail = if prior {
            let law = Self::prior();
            observations.extend((0..PRIOR_JOBS).map(|k| Observation {
                at: law.quantile((k as f64 + 0.5) / PRIOR_JOBS as f64),
                weight: PRIOR_WEIGHT,
                ended: true,
            }));
            // The tail: the finished jobs' fit once it outweighs the prior.
            match tail_fit {
                Some(fit) if self.finished.len() as f64 >= PRIOR_TOTAL => fit,
                _ => law,
            }
        } else {
            tail_fit?
        };
        StepLaw::estimate(observations, tail, jobs).map(PopulationLaw::Steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: f64 = 60e9;

    fn ended(at: f64) -> Observation {
        Observation {
            at,
            weight: 1.0,
            ended: true,
        }
    }

    fn running(at: f64) -> Observation {
        Observation {
            at,
            weight: 1.0,
            ended: false,
        }
    }

    fn tail() -> LogNormal {
        LogNormal::new(5.0 * MIN, 1.0).unwrap()
    }

    #[test]
    fn kaplan_meier_counts_censored_jobs_as_at_risk() {
        // Ends at 1, 3; censored at 2; ends at 4. S: 1 -> 3/4 at 1; at 3,
        // 2 at risk, one ends: 3/8; at 4: 0.
        let law = StepLaw::estimate(
            vec![ended(4.0), running(2.0), ended(1.0), ended(3.0)],
            tail(),
            4,
        )
        .unwrap();
        assert_eq!(law.times, [1.0, 3.0, 4.0]);
        assert_eq!(law.survival, [0.75, 0.375, 0.0]);
        // The area under S up to 3: 1 * 1 + 0.75 * 2.
        assert!((law.integral[1] - 2.5).abs() < 1e-12);
        // Without the censored job, the plain empirical law: 2/3 at 1.
        let plain = StepLaw::estimate(vec![ended(4.0), ended(1.0), ended(3.0)], tail(), 3).unwrap();
        assert!((plain.survival[0] - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn a_few_typical_lengths_promise_the_next_one() {
        // 1/5/10-minute jobs: past one minute a job is 5 or 10, and the
        // closer it gets to 5 the better its index (FIFO-like, not LAS).
        let obs = (0..30)
            .map(|k| ended([1.0, 5.0, 10.0][k % 3] * MIN))
            .collect();
        let law = StepLaw::estimate(obs, tail(), 30).unwrap();
        let fresh = law.gittins_index(0.0).unwrap();
        let at_2 = law.gittins_index(2.0 * MIN).unwrap();
        let at_4 = law.gittins_index(4.0 * MIN).unwrap();
        assert!(at_4 > at_2, "{at_4} > {at_2}");
        // A fresh job (a third end in a minute) passes one at 2 minutes
        // (half end in 3), not one at 4 (half end in 1).
        assert!(fresh > at_2 && fresh < at_4, "{at_2} < {fresh} < {at_4}");
    }

    #[test]
    fn heavy_tails_make_the_index_fall_with_age() {
        let law = LogNormal::new(10.0 * MIN, 1.6).unwrap();
        let obs = (0..200)
            .map(|k| ended(law.quantile((k as f64 + 0.5) / 200.0)))
            .collect();
        let steps = StepLaw::estimate(obs, law, 200).unwrap();
        // (A log-normal's hazard rises before it falls: from its median on.)
        let indexes: Vec<f64> = [10.0, 100.0, 1000.0]
            .iter()
            .map(|&m| {
                steps
                    .gittins_index(m * MIN)
                    .unwrap_or_else(|| law.gittins_index(m * MIN))
            })
            .collect();
        assert!(indexes.windows(2).all(|w| w[0] > w[1]), "{indexes:?}");
        // And it is near the law's own index: steps of 200 samples make it
        // jump by up to about twice where the next sample is close.
        for m in [1.0, 10.0, 60.0, 600.0] {
            let (got, want) = (
                steps.gittins_index(m * MIN).unwrap(),
                law.gittins_index(m * MIN),
            );
            assert!(
                (0.4..2.5).contains(&(got / want)),
                "at {m} min: {got} vs {want}"
            );
        }
    }

    #[test]
    fn a_job_past_every_finished_one_ranks_by_the_tail() {
        let obs = vec![ended(MIN), ended(2.0 * MIN), running(30.0 * MIN)];
        let law = StepLaw::estimate(obs, tail(), 3).unwrap();
        assert_eq!(law.gittins_index(40.0 * MIN), None);
        assert_eq!(law.tail(), tail());
        // The censored job's mass past 2 min is spread by the tail, so the
        // survival beyond is positive and falls.
        assert!(law.survival(3.0 * MIN) > law.survival(60.0 * MIN));
        assert!(law.survival(60.0 * MIN) > 0.0);
    }

    #[test]
    fn censored_live_jobs_undo_the_backlogs_bias() {
        // The finished jobs are the short ones; ten long ones still run.
        let mut with = Population::new(Estimator::Censored);
        let mut without = Population::new(Estimator::Empirical);
        for (id, minutes) in (0..20u64).map(|k| (k, 1 + k % 3)) {
            for p in [&mut with, &mut without] {
                p.observe_live(id, minutes * 60_000_000_000);
                p.finished(id, minutes * 60_000_000_000);
            }
        }
        for id in 100..110u64 {
            for p in [&mut with, &mut without] {
                p.observe_live(id, 90 * 60_000_000_000);
            }
        }
        // A finish re-reads the live jobs.
        for p in [&mut with, &mut without] {
            p.finished(999, 60_000_000_000);
        }
        let survival = |p: &mut Population| match &*p.law().unwrap().0 {
            PopulationLaw::Steps(s) => s.survival(5.0 * MIN),
            PopulationLaw::LogNormal(..) => unreachable!(),
        };
        assert!(survival(&mut with) > 0.2);
        assert!(survival(&mut without) < 0.01);
    }

    #[test]
    fn the_prior_gives_a_law_from_the_start_and_fades() {
        let mut p = Population::new(Estimator::CensoredWithPrior);
        let (first, v1) = p.law().expect("a law before any job finished");
        assert_eq!(first.jobs(), 0);
        let prior_median = match &*first {
            PopulationLaw::Steps(s) => s.median_remaining(0.0),
            PopulationLaw::LogNormal(..) => unreachable!(),
        };
        assert!(
            (prior_median / PRIOR_MEDIAN_NS - 1.0).abs() < 0.5,
            "{prior_median}"
        );
        // 100 one-minute jobs: the median is a minute, not the prior's ten.
        for id in 0..100 {
            p.finished(id, 60_000_000_000);
        }
        let (law, v2) = p.law().unwrap();
        assert!(v2 > v1);
        let median = match &*law {
            PopulationLaw::Steps(s) => s.median_remaining(0.0),
            PopulationLaw::LogNormal(..) => unreachable!(),
        };
        assert!((median / MIN - 1.0).abs() < 1e-9, "{median}");
        // Without a prior there is no law until MIN_SAMPLES jobs finished.
        let mut bare = Population::new(Estimator::Censored);
        assert!(bare.law().is_none());
    }

    #[test]
    fn quantiles_invert_the_survival() {
        let law = LogNormal::new(7.0 * MIN, 1.3).unwrap();
        for p in [0.01, 0.3, 0.5, 0.9, 0.999] {
            let x = law.quantile(p);
            assert!((1.0 - law.survival(x) - p).abs() < 1e-6);
        }
    }
}
