//! `rr`: the job with the fewest finished iterations runs next, so jobs take
//! turns iteration by iteration.

use std::cmp::Ordering;

use super::{by_arrival, JobView, Policy};

pub struct RoundRobin;

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "rr"
    }
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        a.iterations
            .cmp(&b.iterations)
            .then_with(|| by_arrival(a, b))
    }
}
