//! `srtf` (Salus "preempt"): the job with the least remaining time runs;
//! remaining = expected total − attained, where the expected total comes from
//! the `seconds` hint, or the `iterations` hint × measured mean iteration time.
//! A shorter newcomer takes over at the next iteration boundary; a newcomer with
//! an `iterations` hint but no measured iteration yet counts as 0 remaining, so
//! it is measured at once. Jobs without any hint rank after those with one, by
//! least attained service (LAS).

use std::cmp::Ordering;

use super::{by_arrival, JobView, Policy};

pub struct Srtf;

impl Policy for Srtf {
    fn name(&self) -> &'static str {
        "srtf"
    }
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        match (a.remaining, b.remaining) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => a.attained.cmp(&b.attained),
        }
        .then_with(|| by_arrival(a, b))
    }
}
