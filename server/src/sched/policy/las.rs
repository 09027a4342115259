//! `las`: least attained service first (Tiresias-style). With no knowledge of
//! durations it approximates SRTF: short jobs finish while long ones have
//! accumulated service.

use std::cmp::Ordering;

use super::{by_arrival, JobView, Policy};

pub struct Las;

impl Policy for Las {
    fn name(&self) -> &'static str {
        "las"
    }
    fn compare(&self, a: &JobView, b: &JobView) -> Ordering {
        a.attained.cmp(&b.attained).then_with(|| by_arrival(a, b))
    }
}
