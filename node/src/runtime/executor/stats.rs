//! What the core counts for the admin API and `/metrics`: iterations and
//! their rate, switch and handover latencies, cheap runs, dropped
//! iterations, released holds, per-lane queues, and each job's status.

use std::sync::Arc;
use std::time::Instant;

use crate::runtime::latency::LatencySnapshot;
use crate::runtime::run_class::RunClass;
use crate::runtime::run_stats::RunStatsSnapshot;
use crate::runtime::timeline::Timeline;
use crate::sched::standing::Standing;
use crate::sched::{JobId, JobStatus, LaneId, Nanos, Share};

use super::{Executor, Inner};

/// Window for the iterations-per-second figure.
const RATE_WINDOW_S: u64 = 60;

/// Scheduler counters for the admin API.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecStats {
    /// Between whom device time is shared first.
    pub share: Share,
    pub policy: &'static str,
    pub iterations_total: u64,
    pub iterations_per_second: f64,
    pub queued: u64,
    pub switch_latency: LatencySnapshot,
    /// Go-ahead to start of iterations run by executor processes.
    pub handover_latency: LatencySnapshot,
    /// (lane, queued, running)
    pub lanes: Vec<(LaneId, u64, u64)>,
    pub cheap_runs_total: u64,
    pub dropped_iterations: u64,
    /// Main iterations that held their lane past the hold limit (tenant
    /// isolation) and ran on beside others.
    pub lane_holds_released: u64,
    /// Iteration-time and queue-wait histograms.
    pub runs: RunStatsSnapshot,
}

impl Executor {
    /// Counts a main iteration whose lane stopped waiting for it (the hold limit).
    pub fn count_released_hold(&self) {
        self.shared.lock().lane_holds_released += 1;
    }

    /// Records how long the thread that runs an iteration took from its
    /// go-ahead to starting it: here, or in an executor process (reported
    /// with its Done).
    pub fn record_handover(&self, ns: u64) {
        self.shared.lock().handover_latency.record(ns);
    }

    /// Counts a run that bypassed the scheduler, charges its time to the job's
    /// service (which policies that share by service then see), and puts it on
    /// the timeline, on the job's lane (none before the job joined the scheduler).
    pub fn record_cheap_run(&self, job: JobId, started: Instant, ended: Instant) {
        let elapsed = ended.saturating_duration_since(started);
        let lane = {
            let mut inner = self.shared.lock();
            inner.cheap_runs_total += 1;
            inner
                .sched
                .charge_outside_run(job, elapsed.as_nanos().min(u64::MAX as u128) as u64);
            inner.run_stats.count_cheap_run(job);
            inner.sched.job_lane(job)
        };
        self.shared
            .timeline
            .record(job, lane, started, ended, RunClass::Cheap);
    }

    /// Cheap runs of an open job so far.
    pub fn cheap_runs(&self, job: JobId) -> u64 {
        self.shared.lock().run_stats.cheap_runs(job)
    }

    /// The ring of recent runs (the admin API's timeline).
    pub fn timeline(&self) -> &Arc<Timeline> {
        &self.shared.timeline
    }

    pub fn stats(&self) -> ExecStats {
        let inner = self.shared.lock();
        let now_s = self.shared.epoch.elapsed().as_secs();
        let recent: u64 = inner
            .rate
            .iter()
            .filter(|(s, _)| now_s.saturating_sub(*s) < RATE_WINDOW_S)
            .map(|(_, n)| n)
            .sum();
        let window = now_s.clamp(1, RATE_WINDOW_S) as f64;
        let lanes = inner
            .sched
            .lanes()
            .into_iter()
            .map(|lane| {
                let queued = inner
                    .sched
                    .job_ids()
                    .into_iter()
                    .filter_map(|j| inner.sched.status(j))
                    .filter(|s| s.lane == lane)
                    .map(|s| s.queued as u64)
                    .sum();
                let running = inner
                    .running
                    .iter()
                    .find(|(l, _)| *l == lane)
                    .map_or(0, |(_, n)| *n as u64);
                (lane, queued, running)
            })
            .collect();
        ExecStats {
            policy: inner.sched.policy_name(),
            share: inner.sched.config().share,
            iterations_total: inner.iterations_total,
            iterations_per_second: recent as f64 / window,
            queued: inner.sched.queued() as u64,
            switch_latency: inner.switch_latency.snapshot(),
            handover_latency: inner.handover_latency.snapshot(),
            lanes,
            cheap_runs_total: inner.cheap_runs_total,
            dropped_iterations: inner.dropped,
            lane_holds_released: inner.lane_holds_released,
            runs: inner.run_stats.snapshot(),
        }
    }

    pub fn job_status(&self, id: JobId) -> Option<JobStatus> {
        self.shared.lock().sched.status(id)
    }

    /// A job's status and, if it waits, where it stands, under one lock (an
    /// admin row's state and note agree).
    pub fn job_status_with_standing(&self, id: JobId) -> Option<(JobStatus, Option<Standing>)> {
        self.shared.lock().sched.status_with_standing(id)
    }
}

impl Inner {
    /// Accounts an iteration that ran `device_time` on `lane` after waiting
    /// `waited` in its queue, ending at `end`: in the scheduler (a lane merge
    /// may have moved the job meanwhile: its iteration counts against the lane
    /// it is in now), the totals, the histograms and the rate.
    pub(super) fn account_iteration(
        &mut self,
        job: JobId,
        lane: LaneId,
        waited: Nanos,
        device_time: Nanos,
        end: Nanos,
    ) {
        let job_lane = self.sched.job_lane(job).unwrap_or(lane);
        self.sched.finish(job, job_lane, Some(device_time), end);
        self.iterations_total += 1;
        self.run_stats.record_iteration(waited, device_time);
        let second = end / 1_000_000_000;
        match self.rate.back_mut() {
            Some((s, n)) if *s == second => *n += 1,
            _ => self.rate.push_back((second, 1)),
        }
        while self
            .rate
            .front()
            .is_some_and(|(s, _)| second.saturating_sub(*s) >= RATE_WINDOW_S)
        {
            self.rate.pop_front();
        }
    }
}
