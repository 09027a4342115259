//! `rr`: the job with the fewest finished iterations runs next, so jobs take
//! turns iteration by iteration.

use super::{JobView, Policy, SortKey};

pub struct RoundRobin;

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "rr"
    }
    fn rule(&self) -> &'static str {
        "fewest finished iterations first"
    }
    fn key(&self, job: &JobView) -> SortKey {
        SortKey::new(job, job.iterations as i128, 0)
    }
}
