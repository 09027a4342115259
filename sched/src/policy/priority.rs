//! `priority`: the highest `priority` hint runs first (e.g. inference over
//! training); equal priorities share by `fair`.

use super::{JobView, Policy, SortKey};

pub struct Priority;

impl Policy for Priority {
    fn name(&self) -> &'static str {
        "priority"
    }
    fn rule(&self) -> &'static str {
        "highest priority first, then least device time"
    }
    fn key(&self, job: &JobView) -> SortKey {
        SortKey::new(job, -(job.priority as i128), job.fair_attained as i128)
    }
}
