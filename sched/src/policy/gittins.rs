//! `gittins`: the Gittins index over the lengths of the jobs that finished
//! (Tiresias' second policy, Gu et al., NSDI'19; Gittins, 1989), for jobs
//! that give no length hint.
//!
//! A job that has done `a` of work gets the index
//!
//! ```text
//!   G(a) = max over Δ > 0 of  P(S − a ≤ Δ | S > a) / E[min(S − a, Δ) | S > a]
//! ```
//!
//! where S is a job's total work, drawn from the distribution of the
//! finished jobs' work: the best rate at which running the job for a
//! while more finishes it. The highest index runs; ties go by arrival, so
//! equals do not time-share. It is the optimal order without length
//! knowledge for a single server (mean response time), and it adapts to the
//! workload instead of relying on tuned thresholds:
//! - lengths that spread over orders of magnitude (a decreasing hazard rate):
//!   the index falls as a job ages, so it behaves like least attained service
//!   and short jobs overtake long ones;
//! - a few typical lengths (the 1/5/10-minute trace): a job past one typical
//!   length is promised the next one and keeps running, as under FIFO, while
//!   newcomers still get their first minute ahead of it.
//!
//! Work is service as if every iteration had run as fast as the job's fastest
//! one ([`JobView::work`]): the wall time of iterations that shared the device
//! with other lanes is stretched, and learnt lengths measured that way came out
//! smeared (a 1/5/10-minute trace's finished jobs spread over 1-50 minutes),
//! which made the index time-share jobs that FIFO runs to the end.
//!
//! Until [`MIN_SAMPLES`] jobs have finished there is no distribution to speak
//! of, and jobs are ranked by `dlas`; a job that outlived every finished job
//! ranks after the others, by `dlas` among its like. The sample is a window of the last
//! [`WINDOW`] finished jobs, so it follows a workload that changes. Jobs that
//! left without one main iteration carry no service and are not sampled. The
//! starvation guard is `dlas`'s: a job that waited [`super::dlas::PROMOTE_KNOB`]
//! times its service since its last promotion is ranked as if new.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::dlas::Promotions;
use super::{Dlas, JobView, Nanos, Policy, SortKey};

/// Finished jobs needed before the index replaces `dlas`.
pub const MIN_SAMPLES: usize = 10;

/// How many of the most recent finished jobs make up the distribution.
pub const WINDOW: usize = 512;

pub struct Gittins {
    lengths: Mutex<Lengths>,
    promotions: Promotions,
    before_samples: Dlas,
}

impl Default for Gittins {
    fn default() -> Self {
        Gittins {
            lengths: Mutex::new(Lengths::default()),
            promotions: Promotions::default(),
            before_samples: Dlas::default(),
        }
    }
}

impl Gittins {
    /// The index of a job that has attained `attained` ns, in finishes per ns:
    /// None before [`MIN_SAMPLES`] jobs finished, Some(None) past the longest.
    pub fn index(&self, attained: Nanos) -> Option<Option<f64>> {
        let mut lengths = self.lock();
        (lengths.recent.len() >= MIN_SAMPLES).then(|| lengths.index(attained as f64))
    }

    /// Records a finished job's total service.
    pub fn record(&self, service: Nanos) {
        if service > 0 {
            self.lock().push(service);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lengths> {
        self.lengths
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Policy for Gittins {
    fn name(&self) -> &'static str {
        "gittins"
    }
    fn rule(&self) -> &'static str {
        "best Gittins index over finished jobs' lengths first"
    }

    fn key(&self, job: &JobView) -> SortKey {
        // Work, not wall time: the finished jobs' lengths and this job's
        // progress in the same unstretched measure (see `JobView::work`).
        let service = self
            .promotions
            .service_since_promotion(job, super::dlas::QUEUE_THRESHOLDS[0])
            .work;
        match self.index(service) {
            Some(Some(index)) => SortKey::new(job, index_key(index), 0),
            // Older than every finished job: the data says nothing about its
            // length, so it ranks after the jobs it does (whose keys are at
            // most 1), by dlas queue (FIFO within a queue, not LAS's
            // time-sharing of equals). One level, so `srtf` can nest the key.
            Some(None) => SortKey::new(job, 2 + self.before_samples.key(job).primary, 0),
            None => self.before_samples.key(job),
        }
    }

    fn refresh_interval(&self) -> Option<Nanos> {
        // Finished jobs change every waiting job's index, and promotions
        // depend on waiting: recompute the keys as dlas does.
        Some(super::dlas::REFRESH_INTERVAL)
    }

    fn forget(&self, job: &JobView) {
        self.record(job.work);
        self.promotions.forget(job.id);
        self.before_samples.forget(job);
    }

    fn observe_past_run(&self, work: Nanos) {
        self.record(work);
    }
}

/// An index (finishes per ns) as a key's primary: higher index first, at
/// most 1; the scale keeps indexes of jobs with hours of service (~1e-13 per
/// ns) distinct in an integer key. `learned` ranks on the same scale.
pub(super) fn index_key(index: f64) -> i128 {
    1 - (index * 1e27) as i128
}

/// The finished jobs' services: the window in arrival order, and the same
/// values sorted with prefix sums, rebuilt when a query follows a change.
#[derive(Default)]
struct Lengths {
    recent: VecDeque<Nanos>,
    sorted: Vec<f64>,
    /// `prefix[k]` = sum of `sorted[..k]`.
    prefix: Vec<f64>,
    stale: bool,
}

impl Lengths {
    fn push(&mut self, service: Nanos) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(service);
        self.stale = true;
    }

    fn refresh(&mut self) {
        if !self.stale && self.sorted.len() == self.recent.len() {
            return;
        }
        self.sorted = self.recent.iter().map(|&s| s as f64).collect();
        self.sorted.sort_by(f64::total_cmp);
        self.prefix = std::iter::once(0.0)
            .chain(self.sorted.iter().scan(0.0, |sum, &s| {
                *sum += s;
                Some(*sum)
            }))
            .collect();
        self.stale = false;
    }

    /// G(a) over the empirical distribution. The maximum over Δ is reached at
    /// a sample (between samples the numerator is flat and the denominator
    /// grows), so it is a scan of the samples above `a`.
    fn index(&mut self, a: f64) -> Option<f64> {
        self.refresh();
        let n = self.sorted.len();
        let first_above = self.sorted.partition_point(|&s| s <= a);
        let alive = (n - first_above) as f64;
        if alive == 0.0 {
            return None;
        }
        let mut best = 0.0f64;
        for j in first_above..n {
            if j + 1 < n && self.sorted[j + 1] == self.sorted[j] {
                continue; // the last of equal samples counts them all
            }
            let done = (j + 1 - first_above) as f64;
            let quantum = self.sorted[j] - a;
            let served_by_done = self.prefix[j + 1] - self.prefix[first_above] - done * a;
            let served_by_rest = (n - 1 - j) as f64 * quantum;
            let expected = (served_by_done + served_by_rest) / alive;
            if expected > 0.0 {
                best = best.max((done / alive) / expected);
            }
        }
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Nanos = 60_000_000_000;

    fn with_lengths(lengths: &[Nanos]) -> Gittins {
        let p = Gittins::default();
        for &l in lengths {
            p.record(l);
        }
        p
    }

    fn view(id: u64, arrival: Nanos, attained: Nanos) -> JobView {
        JobView {
            id,
            arrival,
            attained,
            fair_attained: attained,
            work: attained,
            iterations: 1,
            priority: 0,
            remaining: None,
            waited: 0,
            learned: None,
            sibling_work: 0,
        }
    }

    #[test]
    fn index_matches_a_hand_computation() {
        // Lengths 1, 5, 10 minutes in equal shares.
        let p = with_lengths(&[MIN, 5 * MIN, 10 * MIN].repeat(4));
        let per_min = |a| p.index(a).unwrap().unwrap() * MIN as f64;
        // New job: the best quantum is one minute, finishing a third of jobs.
        assert!((per_min(0) - 1.0 / 3.0).abs() < 1e-9);
        // Past a minute: running to 10 (rate 1/6.5) beats stopping at 5 (1/8).
        assert!((per_min(MIN) - 1.0 / 6.5).abs() < 1e-9);
        // Past five minutes only 10-minute jobs are left: 1 per 5 minutes.
        assert!((per_min(5 * MIN) - 0.2).abs() < 1e-9);
    }

    #[test]
    fn few_typical_lengths_keep_the_leader_running() {
        let p = with_lengths(&[MIN, 5 * MIN, 10 * MIN].repeat(4));
        let jobs = [view(1, 0, 3 * MIN), view(2, 1, 2 * MIN), view(3, 2, 0)];
        let mut order = jobs.to_vec();
        order.sort_by(|a, b| p.compare(a, b));
        // The newcomer gets its first minute; then the job closest to its
        // next typical length, not the least served one (no time-sharing).
        assert_eq!(order.iter().map(|j| j.id).collect::<Vec<_>>(), [3, 1, 2]);
    }

    #[test]
    fn heavy_tailed_lengths_favour_the_least_served() {
        // Pareto quantiles (shape 1): a decreasing hazard rate, 1 to 200 minutes.
        let lengths: Vec<Nanos> = (0..200).map(|k| MIN * 200 / (200 - k)).collect();
        let p = with_lengths(&lengths);
        let jobs = [
            view(1, 0, 50 * MIN),
            view(2, 1, 5 * MIN),
            view(3, 2, 2 * MIN),
        ];
        let mut order = jobs.to_vec();
        order.sort_by(|a, b| p.compare(a, b));
        assert_eq!(order.iter().map(|j| j.id).collect::<Vec<_>>(), [3, 2, 1]);
    }

    #[test]
    fn dlas_ranks_until_enough_jobs_finished_and_empty_jobs_do_not_count() {
        let p = with_lengths(&[MIN; MIN_SAMPLES - 1]);
        p.record(0);
        let young = view(1, 5, 0);
        let old = view(2, 0, 30 * MIN);
        assert_eq!(p.key(&young).primary, 0, "dlas queue 0");
        assert_eq!(p.key(&old).primary, 2, "dlas queue 2");
        p.forget(&view(9, 0, 2 * MIN));
        assert!(p.key(&young).primary < 0, "ranked by index now");
    }

    #[test]
    fn a_job_older_than_every_sample_ranks_after_the_others_by_dlas() {
        let p = with_lengths(&[MIN; MIN_SAMPLES]);
        assert_eq!(p.index(3 * MIN), Some(None));
        let survivor = view(1, 0, 3 * MIN);
        let veteran = view(2, 1, 30 * MIN);
        let newcomer = view(3, 2, 0);
        let mut order = [veteran, survivor, newcomer];
        order.sort_by(|a, b| p.compare(a, b));
        // Past the data: dlas queues (1 before 2), after the indexed newcomer.
        assert_eq!(order.map(|j| j.id), [3, 1, 2]);
    }

    #[test]
    fn the_window_follows_a_changing_workload() {
        let p = with_lengths(&[10 * MIN; WINDOW]);
        let before = p.index(0).unwrap().unwrap();
        for _ in 0..WINDOW {
            p.record(MIN);
        }
        let after = p.index(0).unwrap().unwrap();
        assert!((after * MIN as f64 - 1.0).abs() < 1e-9);
        assert!(before < after);
    }

    #[test]
    fn lengths_and_progress_are_unstretched_work() {
        let p = with_lengths(&[MIN, 5 * MIN, 10 * MIN].repeat(3));
        // A 1-minute job that contention stretched to 4 minutes of wall time
        // is learnt as 1 minute.
        p.forget(&JobView {
            work: MIN,
            ..view(9, 0, 4 * MIN)
        });
        assert_eq!(p.lock().recent.back(), Some(&MIN));
        // A job with 2 minutes of work ranks by it, not by its 6 stretched
        // minutes (past every 5-minute job, only 10-minute ones remain).
        let stretched = JobView {
            work: 2 * MIN,
            ..view(1, 0, 6 * MIN)
        };
        let by_work = p.key(&stretched);
        let by_wall = p.key(&view(1, 0, 6 * MIN));
        assert_ne!(by_work, by_wall);
        assert_eq!(by_work, p.key(&view(1, 0, 2 * MIN)));
    }
}
