//! `fair`: least attained device time first, which equalises service among the
//! jobs present. A newcomer's count starts at the lane's minimum at its
//! admission (start-time fair queueing), so it shares equally instead of
//! monopolising the lane until it catches up (that is `las`).

use super::{JobView, Policy, SortKey};

pub struct Fair;

impl Policy for Fair {
    fn name(&self) -> &'static str {
        "fair"
    }
    fn rule(&self) -> &'static str {
        "least attained device time first"
    }
    fn key(&self, job: &JobView) -> SortKey {
        SortKey::new(job, job.fair_attained as i128, 0)
    }
}
