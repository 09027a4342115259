//! `fair`: least attained device time first, which equalises service among the
//! jobs present. A newcomer's count starts at the lane's minimum at its
//! admission (start-time fair queueing), so it shares equally instead of
//! monopolising the lane until it catches up (that is `las`).

use std::cmp::Ordering;

use super::{by_arrival, JobView, Policy};

pub struct Fair;

impl Policy for Fair {
    fn name(&self) -> &'static str {
        "fair"
    }
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        a.fair_attained
            .cmp(&b.fair_attained)
            .then_with(|| by_arrival(a, b))
    }
}
