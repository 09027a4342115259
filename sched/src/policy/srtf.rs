//! `srtf` (Salus "preempt"): the job with the least remaining time runs;
//! remaining = expected total − attained, where the expected total comes from
//! the `seconds` hint, or the `iterations` hint × measured mean iteration time.
//! A shorter newcomer takes over at the next iteration boundary; a newcomer with
//! an `iterations` hint but no measured iteration yet counts as 0 remaining, so
//! it is measured at once. Jobs without any hint rank after those with one, by
//! the `gittins` index (discretized LAS until enough jobs finished): with no
//! length known, the finished jobs' lengths are the best guess at
//! shortest-first, without plain LAS's time-sharing of equals.

use super::{Gittins, JobView, Nanos, Policy, SortKey};

#[derive(Default)]
pub struct Srtf {
    without_hints: Gittins,
}

impl Policy for Srtf {
    fn name(&self) -> &'static str {
        "srtf"
    }
    fn rule(&self) -> &'static str {
        "least remaining time first"
    }
    fn key(&self, job: &JobView) -> SortKey {
        match job.remaining {
            Some(remaining) => SortKey::new(job, 0, remaining as i128),
            None => SortKey::new(job, 1, self.without_hints.key(job).primary),
        }
    }
    fn refresh_interval(&self) -> Option<Nanos> {
        self.without_hints.refresh_interval()
    }
    fn forget(&self, job: &JobView) {
        self.without_hints.forget(job);
    }
    fn observe_past_run(&self, work: Nanos) {
        self.without_hints.observe_past_run(work);
    }
}
