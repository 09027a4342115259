//! A job's row (`salus.v1.JobInfo`) as the admin API, `/metrics` and an
//! executor's report show it: built here only, from the job's own figures and
//! this process's scheduler and memory admission (a TensorFlow job's own
//! figures are read in salus-server's `runtime::local_jobs`).

use std::fmt::Write as _;

use salus_proto::salus::v1::{JobHints, JobInfo};

use crate::runtime::admission::MemoryState;
use crate::runtime::node::Node;
use crate::runtime::run_class::MemoryEstimate;
use crate::sched::policy::Basis;
use crate::sched::standing::Standing;
use crate::sched::{Hints, JobId, JobStatus};

/// Rows of jobs, with the node's scheduler and memory admission's columns.
pub struct Rows<'a>(pub &'a Node);

impl Rows<'_> {
    /// An executor's row with this process's view of the scheduler and memory.
    pub fn with_scheduler_view(&self, mut row: JobInfo) -> JobInfo {
        let id = JobId(row.id);
        let policy = self.0.sched.policy_name();
        let (status, standing) = self.0.sched.job_status_with_standing(id);
        let s = status.as_ref();
        let memory = self.memory_state(id);
        // The executor's own view: an eager job busy there is running.
        let busy_there = row.state == "running";
        row.state = state_label(memory.waiting, s, busy_there).into();
        if let Some(s) = s {
            row.hints = Some(hints_to_proto(&s.hints));
        }
        row.note = self.row_note(id, memory.note, policy, s, standing.as_ref());
        if self.0.admission.is_some() {
            row.memory_state = memory.label;
        }
        self.scheduler_fields(id, s, policy, row)
    }

    /// Where a job stands with memory admission, for its row.
    pub fn memory_state(&self, job: JobId) -> MemoryRow {
        let Some(admission) = &self.0.admission else {
            return MemoryRow::default();
        };
        match admission.state_of(job) {
            MemoryState::Waiting { need, waited } => MemoryRow {
                label: "waiting for memory".into(),
                waiting: true,
                note: Some(format!(
                    "waiting for memory {:.1} s: needs {} bytes ({} persistent + {} ephemeral), {} of {} free",
                    waited.as_secs_f64(),
                    need.limit(),
                    need.persistent,
                    need.ephemeral,
                    admission.free(),
                    admission.capacity()
                )),
            },
            MemoryState::Admitted(_) => MemoryRow {
                label: "admitted".into(),
                ..Default::default()
            },
            MemoryState::NotRequested => MemoryRow {
                label: "not admitted yet".into(),
                ..Default::default()
            },
        }
    }

    /// What a job's row notes: waiting for memory, or how the policy treats
    /// it; and a priority hint lowered to its tenant's limit.
    pub fn row_note(
        &self,
        job: JobId,
        memory_note: Option<String>,
        policy: &str,
        s: Option<&JobStatus>,
        standing: Option<&Standing>,
    ) -> String {
        let note =
            memory_note.unwrap_or_else(|| s.map(|s| note(policy, s, standing)).unwrap_or_default());
        let Some(clamp) = self.0.sched.priority_clamp(job) else {
            return note;
        };
        let lowered = format!(
            "priority {} asked, lowered to {} (its tenant's max-priority)",
            clamp.asked, clamp.max
        );
        if note.is_empty() {
            lowered
        } else {
            format!("{note}; {lowered}")
        }
    }

    /// The scheduler's columns of a job's row, graph or eager, over `rest`
    /// (zero for a job the scheduler does not know yet).
    pub fn scheduler_fields(
        &self,
        job: JobId,
        s: Option<&JobStatus>,
        policy: &str,
        rest: JobInfo,
    ) -> JobInfo {
        JobInfo {
            lane: s.map_or(0, |s| s.lane.0),
            policy: policy.into(),
            iterations: s.map_or(0, |s| s.iterations),
            attained_seconds: s.map_or(0.0, |s| s.attained as f64 / 1e9),
            service_seconds: s.map_or(0.0, |s| s.service as f64 / 1e9),
            mean_iteration_ms: s
                .and_then(|s| s.mean_iteration)
                .map_or(0.0, |m| m as f64 / 1e6),
            queue_wait_seconds: s.map_or(0.0, |s| s.total_wait as f64 / 1e9),
            queued: s.map_or(0, |s| s.queued as u64),
            cheap_runs: self.0.sched.cheap_runs(job),
            identity: s
                .and_then(|s| s.identity.as_ref())
                .map(ToString::to_string)
                .unwrap_or_default(),
            history_expected_seconds: s.and_then(|s| s.expected).map_or(0.0, |e| e.median_s),
            history_runs: s.and_then(|s| s.expected).map_or(0, |e| e.runs as u32),
            ..rest
        }
    }
}

/// Bytes of the variables a graph declares: the persistent memory of a job
/// (optimizer slots are variables too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VariableBytes {
    pub bytes: u64,
    pub variables: u64,
    /// Variables whose shape or dtype size is not static (not counted in `bytes`).
    pub unknown: u64,
}

impl std::ops::AddAssign for VariableBytes {
    fn add_assign(&mut self, other: VariableBytes) {
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.variables += other.variables;
        self.unknown += other.unknown;
    }
}

/// The memory columns of a job's row (the rest default).
pub fn memory_fields(
    variables: VariableBytes,
    estimate: &MemoryEstimate,
    memory_state: String,
) -> JobInfo {
    JobInfo {
        variable_bytes: variables.bytes,
        variables: variables.variables,
        variables_of_unknown_size: variables.unknown,
        memory_state,
        persistent_estimate_bytes: estimate.need.persistent,
        ephemeral_estimate_bytes: estimate.need.ephemeral,
        persistent_source: estimate.persistent_source.into(),
        ephemeral_source: estimate.ephemeral_source.into(),
        ephemeral_meter: estimate.ephemeral_meter.into(),
        ephemeral_allocator_bytes: estimate.ephemeral_allocator_bytes,
        ..Default::default()
    }
}

/// A job's memory admission as the admin API shows it.
#[derive(Default)]
pub struct MemoryRow {
    /// "", "waiting for memory", "admitted" or "not admitted yet".
    pub label: String,
    pub waiting: bool,
    pub note: Option<String>,
}

/// A job row's state: waiting for memory, running, queued (in the scheduler),
/// running (`busy`: a request of the job is being served outside it), or idle.
pub fn state_label(waiting_for_memory: bool, s: Option<&JobStatus>, busy: bool) -> &'static str {
    match s {
        _ if waiting_for_memory => "waiting for memory",
        Some(s) if s.running > 0 => "running",
        Some(s) if s.queued > 0 => "queued",
        _ if busy => "running",
        _ => "idle",
    }
}

/// How the current policy treats a job, where that is not obvious, and why it
/// waits when it does: under every policy.
fn note(policy: &str, s: &JobStatus, standing: Option<&Standing>) -> String {
    let treatment = match policy {
        "srtf" if s.remaining.is_none() && s.hints.expected_seconds.is_none() && s.hints.expected_iterations.is_none() => {
            "srtf: no iterations/seconds hint, so ranked by least attained service (LAS) after jobs with estimates"
        }
        "srtf" if s.mean_iteration.is_none() && s.hints.expected_seconds.is_none() => {
            "srtf: runs one iteration first to measure its iteration time"
        }
        _ => "",
    };
    let waiting = standing.map(|standing| waiting_because(policy, s, standing));
    match (treatment, waiting) {
        ("", Some(waiting)) => waiting,
        (treatment, Some(waiting)) => format!("{waiting}; {treatment}"),
        (treatment, None) => treatment.into(),
    }
}

/// "waiting: behind job 3 (fair: least attained device time first); rank 2 of 3 on lane 1".
fn waiting_because(policy: &str, s: &JobStatus, st: &Standing) -> String {
    let lane = st.lane.0;
    let reason = if st.tenants_first > 0 {
        let others = plural(st.tenants_first, "other tenant", "other tenants");
        format!("its tenant has used more device time than {others} with work on lane {lane} (tenants share first)")
    } else if !st.ahead.is_empty() {
        let named: Vec<String> = st
            .ahead
            .iter()
            .map(|job| format!("job {}", job.0))
            .collect();
        let more = st.rank - 1 - st.ahead.len();
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("behind {}{more} ({policy}: {})", named.join(", "), st.rule)
    } else if st.lane_full && !st.running.is_empty() {
        let named: Vec<String> = st
            .running
            .iter()
            .map(|job| format!("job {}", job.0))
            .collect();
        format!(
            "lane {lane} is running {}'s iteration; it goes next",
            named.join(", ")
        )
    } else {
        format!("next on lane {lane}")
    };
    let expected = expectation_text(s, st);
    format!("waiting: {reason}; rank {} of {} on lane {lane}{expected}", st.rank, st.contenders)
}

/// "; expected 12 min more (7 earlier runs); 2 ahead expected shorter": what
/// a policy that ranks by length (`learned`) expects, and on what.
fn expectation_text(s: &JobStatus, st: &Standing) -> String {
    let Some(e) = st.expected else {
        return String::new();
    };
    let basis = match e.basis {
        Basis::Hints => "its hints".to_string(),
        Basis::History => match s.expected {
            Some(history) => plural(history.runs, "earlier run", "earlier runs"),
            None => "its earlier runs".to_string(),
        },
        Basis::Population { jobs: 0 } => "no history: the prior's law".to_string(),
        Basis::Population { jobs } => {
            format!("no history: the node's law of {}", plural(jobs, "job", "jobs"))
        }
    };
    let mut text = format!("; expected {} more ({basis})", seconds_text(e.remaining_ns / 1e9));
    if st.ahead_shorter > 0 {
        let _ = write!(text, "; {} ahead expected shorter", st.ahead_shorter);
    }
    if e.promoted {
        text.push_str("; promoted ahead by the starvation guard");
    }
    text
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Device seconds for a note: "850 ms", "42 s", "12 min", "3.5 h".
fn seconds_text(s: f64) -> String {
    match s {
        s if s < 1.0 => format!("{:.0} ms", s * 1e3),
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

pub fn hints_to_proto(h: &Hints) -> JobHints {
    JobHints {
        priority: h.priority,
        expected_iterations: h.expected_iterations.unwrap_or(0),
        expected_seconds: h.expected_seconds.unwrap_or(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::history::Expectation;
    use crate::sched::policy::Expected;
    use crate::sched::tenants::TenantId;
    use crate::sched::LaneId;

    fn waiting() -> JobStatus {
        JobStatus {
            id: JobId(4),
            lane: LaneId(1),
            tenant: TenantId(0),
            hints: Hints {
                expected_seconds: Some(10.0),
                ..Hints::default()
            },
            arrival: 0,
            attained: 0,
            service: 0,
            iterations: 3,
            mean_iteration: Some(1_000_000),
            remaining: Some(1),
            queued: 1,
            running: 0,
            total_wait: 0,
            identity: None,
            expected: None,
        }
    }

    fn standing() -> Standing {
        Standing {
            lane: LaneId(1),
            rank: 3,
            contenders: 3,
            ahead: vec![JobId(2), JobId(7)],
            running: vec![JobId(2)],
            tenants_first: 0,
            lane_full: true,
            rule: "least attained device time first",
            expected: None,
            ahead_shorter: 0,
        }
    }

    #[test]
    fn every_policy_says_why_a_job_waits() {
        for policy in ["fair", "fifo", "pack", "priority", "learned", "srtf"] {
            let text = note(policy, &waiting(), Some(&standing()));
            assert!(
                text.starts_with("waiting: behind job 2, job 7 ("),
                "{policy}: {text}"
            );
            assert!(text.ends_with("rank 3 of 3 on lane 1"), "{policy}: {text}");
        }
    }

    #[test]
    fn the_reason_follows_the_standing() {
        let tenants = Standing {
            tenants_first: 2,
            ..standing()
        };
        assert!(note("fair", &waiting(), Some(&tenants))
            .contains("more device time than 2 other tenants"));
        let next = Standing {
            rank: 1,
            ahead: vec![],
            ..standing()
        };
        assert!(note("fair", &waiting(), Some(&next))
            .starts_with("waiting: lane 1 is running job 2's iteration; it goes next"));
        let free = Standing {
            rank: 1,
            ahead: vec![],
            running: vec![],
            lane_full: false,
            ..standing()
        };
        assert!(note("fair", &waiting(), Some(&free)).starts_with("waiting: next on lane 1"));
        let many = Standing {
            rank: 6,
            contenders: 6,
            ..standing()
        };
        assert!(note("fair", &waiting(), Some(&many)).contains("behind job 2, job 7 and 3 more"));
    }

    #[test]
    fn learned_says_what_it_expects_and_srtf_keeps_its_own_note() {
        let mut status = waiting();
        status.expected = Some(Expectation { median_s: 720.0, sigma: 0.3, runs: 7 });
        let expects = |basis, ahead_shorter, promoted| Standing {
            expected: Some(Expected { remaining_ns: 720e9, basis, promoted }),
            ahead_shorter,
            ..standing()
        };
        let history = note("learned", &status, Some(&expects(Basis::History, 2, false)));
        assert!(history.ends_with("; expected 12 min more (7 earlier runs); 2 ahead expected shorter"), "{history}");
        let population = note("learned", &status, Some(&expects(Basis::Population { jobs: 57 }, 0, true)));
        assert!(
            population.ends_with("; expected 12 min more (no history: the node's law of 57 jobs); promoted ahead by the starvation guard"),
            "{population}"
        );
        assert!(note("learned", &status, Some(&expects(Basis::Hints, 0, false))).ends_with("(its hints)"));
        // A policy that ranks without lengths expects nothing.
        assert!(!note("fair", &status, Some(&standing())).contains("expected"));
        status.hints.expected_seconds = None;
        status.remaining = None;
        let srtf = note("srtf", &status, Some(&standing()));
        assert!(
            srtf.starts_with("waiting: ")
                && srtf
                    .ends_with("ranked by least attained service (LAS) after jobs with estimates"),
            "{srtf}"
        );
        assert!(note("fair", &status, None).is_empty());
    }
}
