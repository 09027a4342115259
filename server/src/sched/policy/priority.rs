//! `priority`: the highest `priority` hint runs first (e.g. inference over
//! training); equal priorities share by `fair`.

use std::cmp::Ordering;

use super::{Fair, JobView, Policy};

pub struct Priority;

impl Policy for Priority {
    fn name(&self) -> &'static str {
        "priority"
    }
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        b.priority.cmp(&a.priority).then_with(|| Fair.compare(a, b))
    }
}
