//! A job's row as it crosses the seam ([`msg::JobRow`]): the executor's own
//! columns of a `salus.v1.JobInfo`, taken from the row it builds for itself,
//! and that row again on the supervisor's side, where the scheduler's columns
//! and the owner are added (`runtime::report`, `frontend::admin`).

use salus_proto::salus::v1::{JobHints, JobInfo};

use crate::seam::msg;

/// The columns of `row` that the executor knows (the rest are the
/// supervisor's). An eager job the executor is serving shows as "running".
pub fn row_to_msg(row: JobInfo) -> msg::JobRow {
    msg::JobRow {
        id: row.id,
        busy: row.state == "running",
        hints: row.hints.map(|h| msg::JobHints {
            name: row.name.clone(),
            priority: h.priority,
            expected_iterations: (h.expected_iterations > 0).then_some(h.expected_iterations),
            expected_seconds: (h.expected_seconds > 0.0).then_some(h.expected_seconds),
            persistent_bytes: None,
            ephemeral_bytes: None,
        }),
        handle: row.handle,
        name: row.name,
        kind: row.kind,
        graph_version: row.graph_version,
        graph_nodes: row.graph_nodes,
        runs_completed: row.runs_completed,
        runs_failed: row.runs_failed,
        age_seconds: row.age_seconds,
        idle_seconds: row.idle_seconds,
        variable_bytes: row.variable_bytes,
        variables: row.variables,
        variables_of_unknown_size: row.variables_of_unknown_size,
        persistent_estimate_bytes: row.persistent_estimate_bytes,
        ephemeral_estimate_bytes: row.ephemeral_estimate_bytes,
        persistent_source: row.persistent_source,
        ephemeral_source: row.ephemeral_source,
        ephemeral_meter: row.ephemeral_meter,
        ephemeral_allocator_bytes: row.ephemeral_allocator_bytes,
    }
}

/// An executor's row as a `JobInfo` with only the executor's columns set
/// (`state` "running" where it is busy, "idle" otherwise).
pub fn row_from_msg(row: msg::JobRow) -> JobInfo {
    JobInfo {
        id: row.id,
        handle: row.handle,
        name: row.name,
        kind: row.kind,
        state: if row.busy { "running" } else { "idle" }.into(),
        hints: row.hints.map(|h| JobHints {
            priority: h.priority,
            expected_iterations: h.expected_iterations.unwrap_or(0),
            expected_seconds: h.expected_seconds.unwrap_or(0.0),
        }),
        graph_version: row.graph_version,
        graph_nodes: row.graph_nodes,
        runs_completed: row.runs_completed,
        runs_failed: row.runs_failed,
        age_seconds: row.age_seconds,
        idle_seconds: row.idle_seconds,
        variable_bytes: row.variable_bytes,
        variables: row.variables,
        variables_of_unknown_size: row.variables_of_unknown_size,
        persistent_estimate_bytes: row.persistent_estimate_bytes,
        ephemeral_estimate_bytes: row.ephemeral_estimate_bytes,
        persistent_source: row.persistent_source,
        ephemeral_source: row.ephemeral_source,
        ephemeral_meter: row.ephemeral_meter,
        ephemeral_allocator_bytes: row.ephemeral_allocator_bytes,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executors_columns_cross_and_the_schedulers_do_not() {
        let row = JobInfo {
            id: 7,
            handle: "h".into(),
            name: "resnet".into(),
            kind: "eager".into(),
            state: "running".into(),
            hints: Some(JobHints {
                priority: 2,
                expected_iterations: 0,
                expected_seconds: 30.0,
            }),
            graph_nodes: 3,
            runs_completed: 40,
            runs_failed: 1,
            age_seconds: 2.5,
            variable_bytes: 1 << 20,
            persistent_source: "variables".into(),
            ephemeral_meter: "allocator".into(),
            ephemeral_allocator_bytes: 4096,
            // The scheduler's and the owner's columns: the supervisor's own.
            lane: 3,
            iterations: 9,
            note: "n".into(),
            tenant: "alice".into(),
            ..Default::default()
        };
        let back = row_from_msg(row_to_msg(row.clone()));
        assert_eq!(
            back,
            JobInfo {
                lane: 0,
                iterations: 0,
                note: String::new(),
                tenant: String::new(),
                ..row.clone()
            }
        );
        let idle = row_from_msg(row_to_msg(JobInfo {
            state: "queued".into(),
            hints: None,
            ..row
        }));
        assert_eq!((idle.state.as_str(), idle.hints), ("idle", None));
    }
}
