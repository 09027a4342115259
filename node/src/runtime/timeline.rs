//! A bounded ring of recent runs: which job's main iteration or cheap run held
//! which lane, from when to when. The admin API's `GetTimeline` serves it, and
//! `salus timeline` draws it as a per-lane Gantt chart.
//!
//! One short mutex guards the ring: a record is one push (and at most one
//! eviction) under it, and a reader copies the spans it asked for out of it,
//! so neither holds the executor's lock.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::runtime::run_class::RunClass;
use crate::sched::{JobId, LaneId};
use crate::tenant::identity::TenantKey;

/// Spans the ring keeps unless `--timeline-capacity` says otherwise: some
/// seconds of history at a thousand runs per second, under a megabyte.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// The protocol a job came in by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// A TF1 session over the master protocol.
    Graph,
    /// A TF2 eager context over the remote-eager protocol.
    Eager,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Graph => "graph",
            JobKind::Eager => "eager",
        }
    }
}

/// What the timeline shows of a job; spans share it, so a job's name outlives
/// the job for as long as its spans stay in the ring.
#[derive(Debug, PartialEq, Eq)]
pub struct JobLabel {
    pub name: String,
    pub kind: JobKind,
    /// The tenant that owns the job: the admin API shows a tenant only its own spans.
    pub owner: Option<TenantKey>,
}

/// One finished run.
#[derive(Clone, Debug)]
pub struct Span {
    pub job: JobId,
    /// None for a job the timeline was not told about.
    pub label: Option<Arc<JobLabel>>,
    /// None: the job had no lane yet (a cheap run before memory admission).
    pub lane: Option<LaneId>,
    pub start: Instant,
    pub end: Instant,
    pub class: RunClass,
}

/// Spans copied out of the ring at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The moment of the copy: no span ends after it.
    pub now: Instant,
    /// Oldest first (in the order they were recorded).
    pub spans: Vec<Span>,
    pub capacity: usize,
    /// Spans recorded since the server started, evicted ones included.
    pub recorded_total: u64,
}

struct Ring {
    spans: VecDeque<Span>,
    recorded_total: u64,
    /// Open jobs only: a closed job's label lives on in its spans.
    labels: HashMap<JobId, Arc<JobLabel>>,
    /// The labels of the jobs closed last, newest at the back: a run that
    /// finishes just after its client left still names its job.
    recently_closed: VecDeque<(JobId, Arc<JobLabel>)>,
}

/// Closed jobs whose labels still name late spans: far more than the jobs
/// that can close during one run.
const RECENTLY_CLOSED: usize = 256;

pub struct Timeline {
    capacity: usize,
    ring: Mutex<Ring>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new(DEFAULT_CAPACITY)
    }
}

impl Timeline {
    /// A ring of `capacity` spans; 0 records nothing.
    pub fn new(capacity: usize) -> Timeline {
        Timeline {
            capacity,
            ring: Mutex::new(Ring {
                // Grown as spans come, so an idle server does not hold the full ring.
                spans: VecDeque::new(),
                recorded_total: 0,
                labels: HashMap::new(),
                recently_closed: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Names a new job for its spans.
    pub fn open_job(&self, job: JobId, name: &str, kind: JobKind, owner: Option<TenantKey>) {
        let label = Arc::new(JobLabel {
            name: name.to_string(),
            kind,
            owner,
        });
        self.lock().labels.insert(job, label);
    }

    /// The job left: its recorded spans keep its label, and so do the runs that
    /// finish soon after (up to RECENTLY_CLOSED jobs back).
    pub fn close_job(&self, job: JobId) {
        let mut ring = self.lock();
        if let Some(label) = ring.labels.remove(&job) {
            if ring.recently_closed.len() >= RECENTLY_CLOSED {
                ring.recently_closed.pop_front();
            }
            ring.recently_closed.push_back((job, label));
        }
    }

    /// Records a finished run, evicting the oldest span when the ring is full.
    pub fn record(
        &self,
        job: JobId,
        lane: Option<LaneId>,
        start: Instant,
        end: Instant,
        class: RunClass,
    ) {
        if self.capacity == 0 {
            return;
        }
        let mut ring = self.lock();
        let label = ring.labels.get(&job).cloned().or_else(|| {
            ring.recently_closed
                .iter()
                .rev()
                .find(|(closed, _)| *closed == job)
                .map(|(_, label)| label.clone())
        });
        if ring.spans.len() >= self.capacity {
            ring.spans.pop_front();
        }
        ring.spans.push_back(Span {
            job,
            label,
            lane,
            start,
            // A clock read before `start` (the caller's) cannot make a negative span.
            end: end.max(start),
            class,
        });
        ring.recorded_total += 1;
    }

    /// The spans that ended within `window` before now (all of them for None).
    pub fn snapshot(&self, window: Option<std::time::Duration>) -> Snapshot {
        let ring = self.lock();
        let now = Instant::now();
        let since = window.and_then(|w| now.checked_sub(w));
        // Spans are recorded in end order (up to the microseconds between a run's
        // end and its record), so the window is a suffix, found from the back: a
        // short window copies only its part while lane threads wait on the lock.
        let first = ring
            .spans
            .iter()
            .rposition(|s| since.is_some_and(|since| s.end < since))
            .map_or(0, |i| i + 1);
        let mut spans = Vec::with_capacity(ring.spans.len() - first);
        spans.extend(
            ring.spans
                .range(first..)
                .filter(|s| since.is_none_or(|since| s.end >= since))
                .cloned(),
        );
        Snapshot {
            now,
            spans,
            capacity: self.capacity,
            recorded_total: ring.recorded_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn keeps_the_newest_spans_up_to_its_capacity() {
        let t = Timeline::new(3);
        let base = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
        for i in 0..5u64 {
            t.record(
                JobId(i),
                Some(LaneId(0)),
                at(base, i),
                at(base, i + 1),
                RunClass::Main,
            );
        }
        let snap = t.snapshot(None);
        assert_eq!(snap.capacity, 3);
        assert_eq!(snap.recorded_total, 5);
        let jobs: Vec<u64> = snap.spans.iter().map(|s| s.job.0).collect();
        assert_eq!(jobs, vec![2, 3, 4]);
        assert!(snap.spans.iter().all(|s| s.end <= snap.now));
    }

    #[test]
    fn zero_capacity_records_nothing() {
        let t = Timeline::new(0);
        let now = Instant::now();
        t.record(JobId(1), None, now, now, RunClass::Cheap);
        let snap = t.snapshot(None);
        assert!(snap.spans.is_empty());
        assert_eq!(snap.recorded_total, 0);
    }

    #[test]
    fn labels_name_spans_and_outlive_their_job() {
        let t = Timeline::new(10);
        let now = Instant::now();
        t.open_job(JobId(7), "resnet", JobKind::Eager, None);
        t.record(JobId(7), Some(LaneId(1)), now, now, RunClass::Cheap);
        t.close_job(JobId(7));
        // Recorded after the job closed (a run finishing as its client leaves): still named.
        t.record(JobId(7), Some(LaneId(1)), now, now, RunClass::Main);
        t.record(JobId(8), None, now, now, RunClass::Main);
        let snap = t.snapshot(None);
        for span in &snap.spans[..2] {
            let label = span.label.as_deref().unwrap();
            assert_eq!(
                (label.name.as_str(), label.kind),
                ("resnet", JobKind::Eager)
            );
        }
        assert_eq!(snap.spans[0].class, RunClass::Cheap);
        assert!(snap.spans[2].label.is_none() && snap.spans[2].lane.is_none());
        assert!(t.lock().labels.is_empty());
    }

    #[test]
    fn only_the_last_closed_jobs_name_late_spans() {
        let t = Timeline::new(10);
        let now = Instant::now();
        for job in 0..=RECENTLY_CLOSED as u64 {
            t.open_job(JobId(job), &format!("j{job}"), JobKind::Graph, None);
            t.close_job(JobId(job));
        }
        t.record(JobId(0), None, now, now, RunClass::Main);
        t.record(JobId(1), None, now, now, RunClass::Main);
        let snap = t.snapshot(None);
        assert!(
            snap.spans[0].label.is_none(),
            "job 0 fell out of the closed labels"
        );
        assert_eq!(snap.spans[1].label.as_deref().unwrap().name, "j1");
        assert_eq!(t.lock().recently_closed.len(), RECENTLY_CLOSED);
    }

    #[test]
    fn a_window_keeps_only_spans_that_ended_within_it() {
        let t = Timeline::new(10);
        let now = Instant::now();
        let old = now.checked_sub(Duration::from_secs(30)).unwrap();
        t.record(
            JobId(1),
            Some(LaneId(0)),
            old,
            old + Duration::from_millis(5),
            RunClass::Main,
        );
        // Started long ago, ended just now: inside a 1 s window.
        t.record(JobId(2), Some(LaneId(0)), old, now, RunClass::Main);
        let snap = t.snapshot(Some(Duration::from_secs(1)));
        let jobs: Vec<u64> = snap.spans.iter().map(|s| s.job.0).collect();
        assert_eq!(jobs, vec![2]);
        assert_eq!(t.snapshot(Some(Duration::from_secs(3600))).spans.len(), 2);
    }

    #[test]
    fn an_end_before_the_start_is_clamped() {
        let t = Timeline::new(1);
        let now = Instant::now();
        t.record(JobId(1), None, at(now, 5), now, RunClass::Main);
        let span = &t.snapshot(None).spans[0];
        assert_eq!(span.end, span.start);
    }
}
