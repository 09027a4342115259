//! Summaries and CSV output of a simulation.

use std::fmt::Write as _;

use crate::engine::{Point, SimResult, UserUsage};

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

/// An interval in which the same users have work, and the device time each
/// got in it.
#[derive(Clone, Debug, PartialEq)]
pub struct UserInterval {
    pub start_s: f64,
    pub end_s: f64,
    /// By user, as [`SimResult::users`].
    pub busy: Vec<bool>,
    pub device_s: Vec<f64>,
}

impl UserInterval {
    /// The users with work throughout.
    pub fn busy_users(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.busy.len()).filter(|&u| self.busy[u])
    }

    /// User `u`'s share of the device time used in the interval.
    pub fn share(&self, u: usize) -> f64 {
        let total: f64 = self.device_s.iter().sum();
        if total > 0.0 {
            self.device_s[u] / total
        } else {
            0.0
        }
    }

    /// Most over least device time among the users with work throughout
    /// (infinite if one got none; None with fewer than two).
    pub fn max_min_ratio(&self) -> Option<f64> {
        let times: Vec<f64> = self.busy_users().map(|u| self.device_s[u]).collect();
        if times.len() < 2 {
            return None;
        }
        let max = times.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        Some(if min > 0.0 { max / min } else { f64::INFINITY })
    }
}

/// The run cut where the set of users with work changes: each interval's
/// users had work throughout it, so their device times compare shares, not
/// amounts of work (a user with less work in all trivially gets less device
/// time over the whole run). Intervals of no length are left out.
pub fn user_intervals(result: &SimResult) -> Vec<UserInterval> {
    let mut out: Vec<UserInterval> = Vec::new();
    for pair in result.user_timeline.windows(2) {
        let (from, to) = (&pair[0], &pair[1]);
        if to.t <= from.t || !from.busy.iter().any(|&b| b) {
            continue;
        }
        let device_s: Vec<f64> = to
            .device_s
            .iter()
            .zip(&from.device_s)
            .map(|(b, a)| b - a)
            .collect();
        match out.last_mut() {
            Some(last) if last.busy == from.busy && last.end_s == from.t => {
                last.end_s = to.t;
                for (sum, d) in last.device_s.iter_mut().zip(&device_s) {
                    *sum += d;
                }
            }
            _ => out.push(UserInterval {
                start_s: from.t,
                end_s: to.t,
                busy: from.busy.clone(),
                device_s,
            }),
        }
    }
    out
}

/// A user's name as printed: `(none)` for the jobs without a user.
pub fn user_label(user: &UserUsage) -> &str {
    user.name.as_deref().unwrap_or("(none)")
}

/// Mean JCT of each user's completed jobs, as [`SimResult::users`].
pub fn user_mean_jct(result: &SimResult) -> Vec<Option<f64>> {
    result
        .users
        .iter()
        .map(|user| {
            let jcts: Vec<f64> = result
                .jobs
                .iter()
                .filter(|j| j.user == user.name)
                .filter_map(|j| j.jct_s())
                .collect();
            (!jcts.is_empty()).then(|| mean(&jcts))
        })
        .collect()
}

/// Per user: weight, jobs, device time in all, mean JCT; then every interval
/// in which two or more users had work (at most `max_intervals` of them).
pub fn users_text(result: &SimResult, max_intervals: usize) -> String {
    let mut out = String::new();
    let total: f64 = result.users.iter().map(|u| u.device_s).sum();
    let jct = user_mean_jct(result);
    for (user, jct) in result.users.iter().zip(&jct) {
        let jobs = result.jobs.iter().filter(|j| j.user == user.name).count();
        let _ = writeln!(
            out,
            "user {:<16} weight {:>4}  jobs {:>5}  device time {:>10.1} s ({:>5.1}% of all)  mean JCT {}",
            user_label(user),
            user.weight,
            jobs,
            user.device_s,
            if total > 0.0 { 100.0 * user.device_s / total } else { 0.0 },
            jct.map_or("-".to_string(), |s| format!("{s:.1} s"))
        );
    }
    let shared: Vec<UserInterval> = user_intervals(result)
        .into_iter()
        .filter(|i| i.busy_users().count() >= 2)
        .collect();
    if !shared.is_empty() {
        let _ = writeln!(
            out,
            "device time while the same users had work (users with less work in all get less over the whole run):"
        );
    }
    for interval in shared.iter().take(max_intervals) {
        let users: Vec<String> = interval
            .busy_users()
            .map(|u| {
                format!(
                    "{} {:.1} s ({:.1}%)",
                    user_label(&result.users[u]),
                    interval.device_s[u],
                    100.0 * interval.share(u)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  {:.1}-{:.1} s: {}; max/min {:.2}",
            interval.start_s,
            interval.end_s,
            users.join(", "),
            interval.max_min_ratio().unwrap_or(1.0)
        );
    }
    if shared.len() > max_intervals {
        let _ = writeln!(out, "  ... {} more intervals", shared.len() - max_intervals);
    }
    out
}

/// [`users_text`]'s content as JSON: `users` (totals) and `intervals`
/// (every interval in which two or more users had work).
pub fn users_json(result: &SimResult) -> serde_json::Value {
    let jct = user_mean_jct(result);
    let users: Vec<serde_json::Value> = result
        .users
        .iter()
        .zip(&jct)
        .map(|(user, jct)| {
            serde_json::json!({
                "user": user.name,
                "weight": user.weight,
                "jobs": result.jobs.iter().filter(|j| j.user == user.name).count(),
                "device_s": user.device_s,
                "mean_jct_s": jct,
            })
        })
        .collect();
    let intervals: Vec<serde_json::Value> = user_intervals(result)
        .iter()
        .filter(|i| i.busy_users().count() >= 2)
        .map(|i| {
            serde_json::json!({
                "start_s": i.start_s,
                "end_s": i.end_s,
                "users": i.busy_users().map(|u| &result.users[u].name).collect::<Vec<_>>(),
                "device_s": i.busy_users().map(|u| i.device_s[u]).collect::<Vec<_>>(),
                "max_min_ratio": i.max_min_ratio(),
            })
        })
        .collect();
    serde_json::json!({ "users": users, "intervals": intervals })
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
