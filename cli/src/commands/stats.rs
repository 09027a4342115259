//! `salus stats` and `salus timeline`: the scheduler's counters, latencies and recent turns.

use salus_proto::salus::v1::*;
use serde_json::{json, Value};

use super::tokens::limits_text;

pub fn stats_json(s: &SchedulerStats) -> Value {
    let l = s.switch_latency.clone().unwrap_or_default();
    json!({
        "policy": s.policy,
        "iterations_total": s.iterations_total,
        "iterations_per_s": s.iterations_per_second,
        "queued": s.queued,
        "cheap_runs_total": s.cheap_runs_total,
        "dropped_iterations": s.dropped_iterations,
        "lane_holds_released": s.lane_holds_released,
        "switch_latency_us": {"count": l.count, "p50": l.p50_us, "p99": l.p99_us, "max": l.max_us, "buckets": l.buckets},
        "iteration_time_us": latency_json(s.iteration_time.as_ref()),
        "queue_wait_us": latency_json(s.queue_wait.as_ref()),
        "handover_latency_us": latency_json(s.handover_latency.as_ref()),
        "lanes": s.lanes.iter().map(|q| json!({"lane": q.lane, "queued": q.queued, "running": q.running})).collect::<Vec<_>>(),
        "share": s.share,
        "tenants": s.tenants.iter().map(|t| {
            let l = t.limits.unwrap_or_default();
            json!({
                "tenant": t.tenant_name, "uid": t.tenant_uid, "weight": t.weight, "device_s": t.device_seconds, "jobs": t.jobs, "queued": t.queued,
                "memory_bytes": t.memory_bytes, "refusals": t.refusals,
                "max_jobs": l.max_jobs, "max_priority": l.max_priority, "max_memory_bytes": l.memory_bytes,
            })
        }).collect::<Vec<_>>(),
    })
}

pub(super) fn latency_json(l: Option<&LatencySummary>) -> Value {
    let l = l.cloned().unwrap_or_default();
    json!({"count": l.count, "sum": l.sum_us, "p50": l.p50_us, "p99": l.p99_us, "max": l.max_us, "buckets": l.buckets})
}

/// "N samples, p50 .. us, p99 .. us, max .. us" of a latency summary.
pub(super) fn latency_line(l: Option<&LatencySummary>) -> String {
    let l = l.cloned().unwrap_or_default();
    format!(
        "{} samples, p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        l.count, l.p50_us, l.p99_us, l.max_us
    )
}

/// The server-wide event counters of `GetServerInfo` (admission, reclaimed jobs, failed runs).
pub fn counters_json(info: &ServerInfo) -> Value {
    json!({
        "admission_waits": info.admission_waits,
        "admission_refusals": info.admission_refusals,
        "admission_timeouts": info.admission_timeouts,
        "sessions_reclaimed": info.sessions_reclaimed,
        "eager_contexts_reclaimed": info.eager_contexts_reclaimed,
        "executors_started": info.executors_started,
        "executors_failed": info.executors_failed,
        "run_errors": info.run_errors.iter().map(|e| (e.code.clone(), Value::from(e.count))).collect::<serde_json::Map<_, _>>(),
    })
}

pub fn counters_text(info: &ServerInfo) -> String {
    let failed: Vec<String> = info
        .run_errors
        .iter()
        .filter(|e| e.count > 0)
        .map(|e| format!("{} {}", e.code, e.count))
        .collect();
    format!(
        "admission        {} waited, {} refused, {} timed out\nreclaimed        {} graph sessions, {} eager contexts\nexecutors        {} running, {} started, {} failed\nfailed runs      {}\n",
        info.admission_waits,
        info.admission_refusals,
        info.admission_timeouts,
        info.sessions_reclaimed,
        info.eager_contexts_reclaimed,
        info.executors_running,
        info.executors_started,
        info.executors_failed,
        if failed.is_empty() { "none".to_string() } else { failed.join(", ") }
    )
}

pub fn stats_text(s: &SchedulerStats) -> String {
    let mut out = format!(
        "policy           {}\niterations       {} ({:.1}/s over the last minute)\ncheap runs       {}\nqueued           {}\ndropped          {}\nlane holds cut   {}\nswitch latency   {}\niteration time   {}\nqueue wait       {}\n",
        s.policy,
        s.iterations_total,
        s.iterations_per_second,
        s.cheap_runs_total,
        s.queued,
        s.dropped_iterations,
        s.lane_holds_released,
        latency_line(s.switch_latency.as_ref()),
        latency_line(s.iteration_time.as_ref()),
        latency_line(s.queue_wait.as_ref()),
    );
    for q in &s.lanes {
        out += &format!(
            "lane {}           {} running, {} queued\n",
            q.lane, q.running, q.queued
        );
    }
    out += &format!("shared between   {}\n", s.share);
    let total: f64 = s.tenants.iter().map(|t| t.device_seconds).sum();
    for t in &s.tenants {
        let percent = if total > 0.0 {
            100.0 * t.device_seconds / total
        } else {
            0.0
        };
        out += &format!(
            "tenant {}: {:.3} s device time ({percent:.1}% of the tenants shown), weight {}, {} jobs, {} iterations queued or running, {} of memory, {} refused; limits {}\n",
            t.tenant, t.device_seconds, t.weight, t.jobs, t.queued, crate::units::size_text(t.memory_bytes), t.refusals, limits_text(t.limits.as_ref())
        );
    }
    out
}

/// The timeline with the keys of `salus timeline --json`.
pub fn timeline_json(t: &Timeline, seconds: f64) -> Value {
    json!({
        "seconds": seconds,
        "now_uptime_s": t.now_uptime_seconds,
        "now_unix_s": t.now_unix_seconds,
        "capacity": t.capacity,
        "recorded_total": t.recorded_total,
        "spans": t.spans.iter().map(|s| json!({
            "job": s.job,
            "name": s.job_name,
            "kind": s.kind,
            "lane": s.lane,
            "start_ago_s": s.start_seconds_ago,
            "end_ago_s": s.end_seconds_ago,
            "run": if s.cheap { "cheap" } else { "main" },
        })).collect::<Vec<_>>(),
    })
}

/// Per lane: how busy it was and which jobs ran on it.
pub fn timeline_text(t: &Timeline, seconds: f64) -> String {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Runs {
        name: String,
        kind: String,
        main: u64,
        main_s: f64,
        cheap: u64,
        cheap_s: f64,
    }
    // The window the shares are of: the one asked for, or back to the oldest span.
    let window = if seconds > 0.0 {
        seconds
    } else {
        t.spans
            .iter()
            .map(|s| s.start_seconds_ago)
            .fold(0.0, f64::max)
    };
    let mut lanes: BTreeMap<Option<u32>, BTreeMap<u64, Runs>> = BTreeMap::new();
    for s in &t.spans {
        let runs = lanes.entry(s.lane).or_default().entry(s.job).or_default();
        // A span recorded long after its job closed has no label: any named one names the job.
        if runs.name.is_empty() {
            runs.name.clone_from(&s.job_name);
        }
        if runs.kind.is_empty() {
            runs.kind.clone_from(&s.kind);
        }
        // Only the part inside the window counts toward busy time.
        let length = s.start_seconds_ago.min(window) - s.end_seconds_ago;
        let length = length.max(0.0);
        if s.cheap {
            runs.cheap += 1;
            runs.cheap_s += length;
        } else {
            runs.main += 1;
            runs.main_s += length;
        }
    }
    let mut out = format!(
        "timeline: {} runs in the last {:.1} s ({} recorded since start, the server keeps {})\n",
        t.spans.len(),
        window,
        t.recorded_total,
        t.capacity
    );
    for (lane, jobs) in &lanes {
        let busy: f64 = jobs.values().map(|r| r.main_s + r.cheap_s).sum();
        let share = if window > 0.0 {
            100.0 * busy / window
        } else {
            0.0
        };
        match lane {
            Some(lane) => out += &format!("lane {lane}: busy {share:.1}%\n"),
            None => out += &format!("no lane yet (before memory admission): busy {share:.1}%\n"),
        }
        for (id, r) in jobs {
            let name = if r.name.is_empty() { "?" } else { &r.name };
            out += &format!(
                "  job {id} {name} ({}): {} main ({:.3} s), {} cheap ({:.3} s)\n",
                if r.kind.is_empty() { "?" } else { &r.kind },
                r.main,
                r.main_s,
                r.cheap,
                r.cheap_s
            );
        }
    }
    out
}
