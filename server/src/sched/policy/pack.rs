//! `pack` (Salus's default): arrival order within a lane, work-conserving — the
//! earliest job with an iteration ready runs. Packing itself comes from several
//! lanes running at once.

use std::cmp::Ordering;

use super::{by_arrival, Hold, JobView, Policy};

pub struct Pack;

impl Policy for Pack {
    fn name(&self) -> &'static str {
        "pack"
    }
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        by_arrival(a, b)
    }
    fn hold(&self) -> Hold {
        Hold::Never
    }
}
