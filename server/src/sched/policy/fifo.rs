//! `fifo`: the earliest-admitted live job of the lane runs, alone, until it
//! finishes (its session closes). Later jobs wait even while it is between
//! iterations.

use std::cmp::Ordering;

use super::{by_arrival, Hold, JobView, Policy};

pub struct Fifo;

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        by_arrival(a, b)
    }
    fn hold(&self) -> Hold {
        Hold::Always
    }
}
