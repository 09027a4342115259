//! Per-run statistics the executor keeps beside the scheduler: how long main
//! iterations ran and waited in their lane's queue (histograms), and cheap runs
//! per job. One set of counters, read by the admin API and by `/metrics`.

use std::collections::HashMap;

use crate::runtime::latency::{LatencyRecorder, LatencySnapshot};
use crate::sched::{JobId, Nanos};

#[derive(Default)]
pub struct RunStats {
    iteration_time: LatencyRecorder,
    queue_wait: LatencyRecorder,
    /// Cheap runs of each open job (a closed job's entry is forgotten; the
    /// server-wide total lives in the executor).
    cheap_runs: HashMap<JobId, u64>,
}

/// What [`RunStats`] recorded, for the admin API and `/metrics`.
#[derive(Clone, Debug, PartialEq)]
pub struct RunStatsSnapshot {
    pub iteration_time: LatencySnapshot,
    pub queue_wait: LatencySnapshot,
}

impl RunStats {
    /// One finished main iteration: `queued` from submission to dispatch,
    /// `ran` its device time.
    pub fn record_iteration(&mut self, queued: Nanos, ran: Nanos) {
        self.queue_wait.record(queued);
        self.iteration_time.record(ran);
    }

    pub fn count_cheap_run(&mut self, job: JobId) {
        *self.cheap_runs.entry(job).or_default() += 1;
    }

    pub fn cheap_runs(&self, job: JobId) -> u64 {
        self.cheap_runs.get(&job).copied().unwrap_or(0)
    }

    pub fn forget(&mut self, job: JobId) {
        self.cheap_runs.remove(&job);
    }

    pub fn snapshot(&self) -> RunStatsSnapshot {
        RunStatsSnapshot {
            iteration_time: self.iteration_time.snapshot(),
            queue_wait: self.queue_wait.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_iterations_and_cheap_runs_per_job() {
        let mut stats = RunStats::default();
        stats.record_iteration(3_000, 2_000_000);
        stats.record_iteration(5_000, 4_000_000);
        let s = stats.snapshot();
        assert_eq!(s.iteration_time.count, 2);
        assert_eq!(s.iteration_time.sum_us, 6000.0);
        assert_eq!(s.queue_wait.sum_us, 8.0);
        stats.count_cheap_run(JobId(1));
        stats.count_cheap_run(JobId(1));
        stats.count_cheap_run(JobId(2));
        assert_eq!(
            (stats.cheap_runs(JobId(1)), stats.cheap_runs(JobId(2))),
            (2, 1)
        );
        stats.forget(JobId(1));
        assert_eq!(stats.cheap_runs(JobId(1)), 0);
    }
}
