//! `pack` (Salus's default): arrival order within a lane, work-conserving — the
//! earliest job with an iteration ready runs. Packing itself comes from several
//! lanes running at once.

use super::{Hold, JobView, Policy, SortKey};

pub struct Pack;

impl Policy for Pack {
    fn name(&self) -> &'static str {
        "pack"
    }
    fn rule(&self) -> &'static str {
        "arrival order"
    }
    fn key(&self, job: &JobView) -> SortKey {
        SortKey::new(job, 0, 0)
    }
    fn key_is_fixed(&self) -> bool {
        true
    }
    fn hold(&self) -> Hold {
        Hold::Never
    }
}
