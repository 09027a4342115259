//! # salus-sim
//!
//! Salus in virtual time: a trace of jobs and a workload table go through the
//! *server's own* scheduler core and lane manager (crate `salus-sched`), with a
//! stated device model, so policies and memory rules can be studied at the
//! original paper's scale on any machine.
//!
//! # Layout
//! - [`trace`]: trace CSV, seedable generator (Poisson arrivals).
//! - [`recurring`]: traces that rerun scripts, with pre-trace history.
//! - [`workload`]: workload table CSV, derivation from Salus's measurements.
//! - [`engine`]: the discrete-event simulation and its device model.
//! - [`report`]: summaries (makespan, JCT, utilization) and CSV output.
//! - [`experiments`]: the paper's three experiments, and `users` (sharing
//!   between users, by tenant or by job).
//! - `csv`, `rng`: small helpers.

mod csv;
pub mod engine;
pub mod experiments;
pub mod recurring;
pub mod report;
mod rng;
pub mod trace;
pub mod workload;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("line {line}: {why}")]
    Csv { line: usize, why: String },
    #[error("model {0:?} is not in the workload table")]
    UnknownModel(String),
    #[error("{0}")]
    Invalid(String),
}
