//! `salus jobs`: job rows and the memory issued tokens reserve, as a table and as JSON.

use salus_proto::salus::v1::{JobInfo, ListJobsResponse, Reservation};
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{history, opt, table};
use crate::units::size_text;

/// `salus jobs --json`: an object, so that what the text form shows besides
/// the jobs (the reservations) has a place, and later additions break no reader.
pub fn jobs_json(listed: &ListJobsResponse) -> Value {
    json!({
        "jobs": listed.jobs.iter().map(job_json).collect::<Vec<_>>(),
        "reservations": listed.reservations.iter().map(reservation_json).collect::<Vec<_>>(),
    })
}

pub fn job_json(j: &JobInfo) -> Value {
    let hints = j.hints.clone().unwrap_or_default();
    json!({
        "id": j.id,
        "handle": j.handle,
        "name": j.name,
        // The bare name and the uid apart (as in `salus token list --json`), not
        // the display label "alice (uid 1001)" of the text form.
        "tenant": j.tenant_name,
        "uid": j.tenant_uid,
        "kind": j.kind,
        "state": j.state,
        // A job waiting for (or not yet asking for) memory has no lane: null.
        "lane": lane_of(j),
        "policy": j.policy,
        "iterations": j.iterations,
        "attained_s": j.attained_seconds,
        "service_s": j.service_seconds,
        "mean_iteration_ms": j.mean_iteration_ms,
        "queue_wait_s": j.queue_wait_seconds,
        "queued": j.queued,
        "priority": hints.priority,
        "expected_iterations": opt(hints.expected_iterations),
        "expected_seconds": opt(hints.expected_seconds),
        "note": j.note,
        "graph_version": j.graph_version,
        "graph_nodes": j.graph_nodes,
        "runs_completed": j.runs_completed,
        "runs_failed": j.runs_failed,
        "cheap_runs": j.cheap_runs,
        "age_s": j.age_seconds,
        "idle_s": j.idle_seconds,
        "variable_bytes": j.variable_bytes,
        "variables": j.variables,
        "variables_of_unknown_size": j.variables_of_unknown_size,
        "memory_state": j.memory_state,
        "persistent_estimate_bytes": j.persistent_estimate_bytes,
        "ephemeral_estimate_bytes": j.ephemeral_estimate_bytes,
        "persistent_source": j.persistent_source,
        "ephemeral_source": j.ephemeral_source,
        "ephemeral_meter": j.ephemeral_meter,
        "ephemeral_allocator_bytes": j.ephemeral_allocator_bytes,
        "identity": opt(j.identity.clone()),
        "history_expected_s": (j.history_runs > 0).then_some(j.history_expected_seconds),
        "history_runs": j.history_runs,
    })
}

/// The job's lane; none while it waits for (or has not yet asked for) memory.
pub fn lane_of(j: &JobInfo) -> Option<u32> {
    (!matches!(
        j.memory_state.as_str(),
        "waiting for memory" | "not admitted yet"
    ))
    .then_some(j.lane)
}

/// The LANE column: the lane, or "-" for none.
pub fn lane_text(j: &JobInfo) -> String {
    lane_of(j).map_or_else(|| "-".to_string(), |lane| lane.to_string())
}

pub fn jobs_table(jobs: &[JobInfo]) -> String {
    if jobs.is_empty() {
        return "no jobs\n".into();
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let h = j.hints.clone().unwrap_or_default();
            let expected = match (h.expected_iterations, h.expected_seconds) {
                (0, s) if s == 0.0 => "-".to_string(),
                (0, s) => format!("{s}s"),
                (n, s) if s == 0.0 => format!("{n} it"),
                (n, s) => format!("{n} it/{s}s"),
            };
            vec![
                j.id.to_string(),
                j.kind.clone(),
                super::or_dash(&j.name),
                super::or_dash(&j.tenant),
                j.state.clone(),
                lane_text(j),
                j.iterations.to_string(),
                format!("{:.3}", j.attained_seconds),
                format!("{:.2}", j.mean_iteration_ms),
                format!("{:.3}", j.queue_wait_seconds),
                j.queued.to_string(),
                h.priority.to_string(),
                expected,
                [history::job_history_note(j), Some(j.note.clone())]
                    .into_iter()
                    .flatten()
                    .filter(|n| !n.is_empty())
                    .collect::<Vec<_>>()
                    .join("; "),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "KIND",
            "NAME",
            "TENANT",
            "STATE",
            "LANE",
            "ITERS",
            "ATTAINED_S",
            "MEAN_MS",
            "WAIT_S",
            "QUEUED",
            "PRIO",
            "EXPECTED",
            "NOTE",
        ],
        &rows,
    )
}

/// A reservation with the keys of the other `--json` outputs (expiry: null for never).
pub fn reservation_json(r: &Reservation) -> Value {
    json!({
        "tenant": r.tenant_name,
        "uid": r.tenant_uid,
        "reserved_bytes": r.reserved_bytes,
        "claimed_bytes": r.claimed_bytes,
        "token_ids": r.token_ids,
        "expires_unix_s": (r.expires_unix_seconds > 0.0).then_some(r.expires_unix_seconds),
        "jobs_started": r.jobs_started,
    })
}

/// Lines on the memory issued tokens reserve (none without reservations).
pub fn reservations_text(reservations: &[Reservation]) -> String {
    let mut out = String::new();
    for r in reservations {
        let expires = if r.expires_unix_seconds > 0.0 {
            let left = r.expires_unix_seconds
                - SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
            format!(", expires in {:.0} s", left.max(0.0))
        } else {
            String::new()
        };
        out += &format!(
            "reserved for {}: {} ({} claimed by its jobs; token {}{expires})\n",
            r.tenant,
            size_text(r.reserved_bytes),
            size_text(r.claimed_bytes),
            r.token_ids.join(", ")
        );
    }
    out
}
