//! `las`: least attained service first (Tiresias-style). With no knowledge of
//! durations it approximates SRTF: short jobs finish while long ones have
//! accumulated service.

use super::{JobView, Policy, SortKey};

pub struct Las;

impl Policy for Las {
    fn name(&self) -> &'static str {
        "las"
    }
    fn rule(&self) -> &'static str {
        "least attained service first"
    }
    fn key(&self, job: &JobView) -> SortKey {
        SortKey::new(job, job.attained as i128, 0)
    }
}
