//! `srtf` (Salus "preempt"): the job with the least remaining time runs;
//! remaining = expected total − attained, where the expected total comes from
//! the `seconds` hint, or the `iterations` hint × measured mean iteration time.
//! A shorter newcomer takes over at the next iteration boundary; a newcomer with
//! an `iterations` hint but no measured iteration yet counts as 0 remaining, so
//! it is measured at once. Jobs without any hint rank after those with one, by
//! least attained service (LAS).

use super::{JobView, Policy, SortKey};

pub struct Srtf;

impl Policy for Srtf {
    fn name(&self) -> &'static str {
        "srtf"
    }
    fn key(&self, job: &JobView) -> SortKey {
        match job.remaining {
            Some(remaining) => SortKey::new(job, 0, remaining as i128),
            None => SortKey::new(job, 1, job.attained as i128),
        }
    }
}
