//! `fifo`: the earliest-admitted live job of the lane runs, alone, until it
//! finishes (its session closes). Later jobs wait even while it is between
//! iterations — once it has started its main iterations; a session that is
//! open but has not run one yet does not hold the lane.

use super::{Hold, JobView, Policy, SortKey};

pub struct Fifo;

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn rule(&self) -> &'static str {
        "earliest admitted first, one job at a time"
    }
    fn key(&self, job: &JobView) -> SortKey {
        SortKey::new(job, 0, 0)
    }
    fn key_is_fixed(&self) -> bool {
        true
    }
    fn hold(&self) -> Hold {
        Hold::Always
    }
}
