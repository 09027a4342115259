//! Hints an admin set for a job identity (`salus hints`), kept over restarts
//! ([`crate::runtime::settings`]) and applied by the scheduler core to a job
//! of that identity when it joins ([`crate::runtime::executor::Executor::add_job`]).

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::sched::Hints;
use crate::state_dir::unix_seconds;

/// The hints an admin set for a job identity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedHints {
    pub priority: i32,
    pub expected_iterations: Option<u64>,
    pub expected_seconds: Option<f64>,
    /// When they were set (the oldest are forgotten first).
    pub set_unix_s: u64,
}

impl SavedHints {
    /// What `salus hints` sets of `hints`.
    pub fn of(hints: &Hints) -> SavedHints {
        SavedHints {
            priority: hints.priority,
            expected_iterations: hints.expected_iterations,
            expected_seconds: hints.expected_seconds,
            set_unix_s: unix_seconds(SystemTime::now()),
        }
    }

    /// `hints` (a client's) with these in place of what `salus hints` sets.
    pub fn over(&self, hints: Hints) -> Hints {
        Hints {
            priority: self.priority,
            expected_iterations: self.expected_iterations,
            expected_seconds: self.expected_seconds,
            ..hints
        }
    }
}

/// The key of a job identity's hints: its tenant's durable name (a user, a
/// token's tenant; "" for none) and its name. Tenant names hold no `/`.
pub fn hints_key(tenant: &str, job_name: &str) -> String {
    format!("{tenant}/{job_name}")
}
