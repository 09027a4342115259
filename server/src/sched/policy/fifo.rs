//! `fifo`: the earliest-admitted live job of the lane runs, alone, until it
//! finishes (its session closes). Later jobs wait even while it is between
//! iterations.

use super::{Hold, JobView, Policy, SortKey};

pub struct Fifo;

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn key(&self, job: &JobView) -> SortKey {
        SortKey::new(job, 0, 0)
    }
    fn hold(&self) -> Hold {
        Hold::Always
    }
}
