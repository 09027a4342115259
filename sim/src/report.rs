//! Summaries and CSV output of a simulation.

use std::fmt::Write as _;

use crate::engine::{Point, SimResult};

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub policy: String,
    pub jobs: usize,
    pub completed: usize,
    pub refused: usize,
    /// First arrival to last end.
    pub makespan_s: f64,
    pub mean_jct_s: f64,
    pub p95_jct_s: f64,
    /// Busy device-seconds / makespan.
    pub mean_utilization: f64,
    pub max_lanes: usize,
    pub iterations: u64,
}

impl Summary {
    pub fn of(result: &SimResult) -> Summary {
        let mut jcts: Vec<f64> = result.jobs.iter().filter_map(|j| j.jct_s()).collect();
        jcts.sort_by(f64::total_cmp);
        let first = result
            .jobs
            .iter()
            .map(|j| j.arrival_s)
            .fold(f64::INFINITY, f64::min);
        let last = result
            .jobs
            .iter()
            .filter_map(|j| j.end_s)
            .fold(f64::NEG_INFINITY, f64::max);
        let makespan_s = if last.is_finite() { last - first } else { 0.0 };
        Summary {
            policy: result.policy.clone(),
            jobs: result.jobs.len(),
            completed: jcts.len(),
            refused: result.jobs.iter().filter(|j| j.refused.is_some()).count(),
            makespan_s,
            mean_jct_s: mean(&jcts),
            p95_jct_s: percentile(&jcts, 0.95),
            mean_utilization: if makespan_s > 0.0 {
                result.busy_s / makespan_s
            } else {
                0.0
            },
            max_lanes: result.timeline.iter().map(|p| p.lanes).max().unwrap_or(0),
            iterations: result.iterations,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "policy": self.policy,
            "jobs": self.jobs,
            "completed": self.completed,
            "refused": self.refused,
            "makespan_s": self.makespan_s,
            "mean_jct_s": self.mean_jct_s,
            "p95_jct_s": self.p95_jct_s,
            "mean_utilization": self.mean_utilization,
            "max_lanes": self.max_lanes,
            "iterations": self.iterations,
        })
    }
}

pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The per-job CSV: `job_id,model,arrival_s,start_s,end_s,jct_s,lane`.
pub fn jobs_csv(result: &SimResult) -> String {
    let mut out = String::from("job_id,model,arrival_s,start_s,end_s,jct_s,lane\n");
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.6}")).unwrap_or_default();
    for j in &result.jobs {
        let lane = j.lane.map(|l| l.to_string()).unwrap_or_default();
        let _ = writeln!(
            out,
            "{},{},{:.6},{},{},{},{}",
            j.job_id,
            j.model,
            j.arrival_s,
            opt(j.start_s),
            opt(j.end_s),
            opt(j.jct_s()),
            lane
        );
    }
    out
}

/// The timeline resampled into at most `buckets` equal steps:
/// `time_s,utilization,lanes,running` (utilization time-weighted, lanes and
/// running jobs the most seen in the step).
pub fn timeline_csv(timeline: &[Point], buckets: usize) -> String {
    let mut out = String::from("time_s,utilization,lanes,running\n");
    let (Some(first), Some(last)) = (timeline.first(), timeline.last()) else {
        return out;
    };
    let span = last.start_s - first.start_s;
    let buckets = buckets.max(1);
    let step = if span > 0.0 {
        span / buckets as f64
    } else {
        1.0
    };
    let mut i = 0;
    for b in 0..buckets {
        let (lo, hi) = (
            first.start_s + b as f64 * step,
            first.start_s + (b + 1) as f64 * step,
        );
        let (mut busy, mut lanes, mut running) = (0.0, 0, 0);
        while i + 1 < timeline.len() && timeline[i + 1].start_s <= lo {
            i += 1;
        }
        let mut k = i;
        while k < timeline.len() && timeline[k].start_s < hi {
            let seg_start = timeline[k].start_s.max(lo);
            let seg_end = timeline.get(k + 1).map_or(hi, |p| p.start_s.min(hi));
            busy += timeline[k].utilization * (seg_end - seg_start).max(0.0);
            lanes = lanes.max(timeline[k].lanes);
            running = running.max(timeline[k].running);
            k += 1;
        }
        let _ = writeln!(out, "{lo:.3},{:.4},{lanes},{running}", busy / step);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.95), 19.0);
        assert_eq!(percentile(&v, 0.5), 10.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
    }

    #[test]
    fn timeline_buckets_weight_utilization_by_time() {
        let p = |start_s, utilization, lanes| Point {
            start_s,
            utilization,
            lanes,
            running: lanes,
        };
        // Busy at 1.0 for 1 s, then 0.5 for 1 s, then idle at t = 2.
        let csv = timeline_csv(&[p(0.0, 1.0, 1), p(1.0, 0.5, 2), p(2.0, 0.0, 0)], 2);
        assert_eq!(
            csv,
            "time_s,utilization,lanes,running\n0.000,1.0000,1,1\n1.000,0.5000,2,2\n"
        );
        let csv = timeline_csv(&[p(0.0, 1.0, 1), p(1.0, 0.5, 2), p(2.0, 0.0, 0)], 1);
        assert!(csv.ends_with("0.000,0.7500,2,2\n"), "{csv}");
    }
}
