//! What a job (graph or eager) knows of its memory: the persistent bytes its
//! variables declare, the largest per-iteration memory measured, and its
//! memory lane once admitted. Graph and eager jobs each hold one; the main
//! iteration ([`crate::runtime::main_iteration`]) admits through it, and both
//! samplers record into it.

use std::sync::Mutex;

use crate::runtime::admission::LaneReservation;
use crate::runtime::graph_delta::VariableBytes;
use crate::runtime::memory_profile::{MeasuredMemory, MemoryMeter, Sample};
use crate::runtime::run_class::{ephemeral_after_oom, MemoryEstimate};
use crate::sched::{Hints, JobId, LaneId};
use crate::sync::lock;

/// One job's memory figures and lane; see the module's text.
pub struct JobMemory {
    /// Where the persistent figure comes from, for the job's row ("graph",
    /// "variables").
    persistent_source: &'static str,
    /// Persistent memory the job's variables declare (optimizer slots included).
    variables: Mutex<VariableBytes>,
    /// Largest per-iteration memory measured so far, bytes, and its meter.
    ephemeral: MeasuredMemory,
    /// The job's memory lane, once admitted (dropping it frees the share).
    reservation: Mutex<Option<LaneReservation>>,
    /// GPU lanes: the lane whose virtual GPU the job runs on, chosen when it
    /// opened (admission waits for that lane).
    gpu_lane: Option<LaneId>,
    /// Serialises the admission of a job's concurrent runs (a graph job's
    /// clients may run steps from several threads).
    pub(crate) admission_lock: tokio::sync::Mutex<()>,
}

impl JobMemory {
    pub fn new(
        persistent_source: &'static str,
        variables: VariableBytes,
        gpu_lane: Option<LaneId>,
    ) -> JobMemory {
        JobMemory {
            persistent_source,
            variables: Mutex::new(variables),
            ephemeral: MeasuredMemory::default(),
            reservation: Mutex::new(None),
            gpu_lane,
            admission_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The job's memory need with Salus's margins (+10% persistent, +5%
    /// ephemeral), and where each figure comes from. Hints override; without a
    /// measurement yet, the ephemeral need defaults to the persistent one.
    pub fn estimate(&self, hints: &Hints) -> MemoryEstimate {
        MemoryEstimate::new(
            self.variables().bytes,
            self.persistent_source,
            &self.ephemeral,
            hints,
        )
    }

    /// Persistent memory the job's variables declare.
    pub fn variables(&self) -> VariableBytes {
        *lock(&self.variables)
    }

    /// More variables declared (a graph extended, an eager variable created).
    pub fn add_variables(&self, more: VariableBytes) {
        *lock(&self.variables) += more;
    }

    /// The job's memory lane, once admitted.
    pub fn lane(&self) -> Option<LaneId> {
        lock(&self.reservation).as_ref().map(LaneReservation::lane)
    }

    pub fn gpu_lane(&self) -> Option<LaneId> {
        self.gpu_lane
    }

    pub(crate) fn set_reservation(&self, reservation: LaneReservation) {
        *lock(&self.reservation) = Some(reservation);
    }

    /// Gives the job's memory share back to the pool (its context is gone).
    pub fn release(&self) {
        drop(lock(&self.reservation).take());
    }

    /// Keeps a sample's need, plus `extra` bytes outside every meter.
    pub fn record_sample(&self, sample: &Sample, extra: u64) {
        self.ephemeral.record_sample(sample, extra);
    }

    /// After an out-of-memory error of `what` (an iteration, a function
    /// call): the estimate for the next admission raised to half again the
    /// current measurement. Returns the raised figure.
    pub fn raise_after_out_of_memory(&self, job: JobId, what: &str) -> u64 {
        let raised = ephemeral_after_oom(self.ephemeral.bytes(), self.variables().bytes);
        self.ephemeral.record(raised, MemoryMeter::OutOfMemory);
        tracing::warn!(
            job = job.0,
            ephemeral = raised,
            "{what} ran out of memory; estimate raised"
        );
        raised
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_memory_error_raises_the_estimate_by_half_again() {
        let memory = JobMemory::new(
            "graph",
            VariableBytes {
                bytes: 4 << 20,
                variables: 1,
                unknown: 0,
            },
            None,
        );
        let before = memory.estimate(&Hints::default());
        assert_eq!(before.ephemeral_source, "default");
        let raised = memory.raise_after_out_of_memory(JobId(1), "iteration");
        assert_eq!(raised, 6 << 20);
        let after = memory.estimate(&Hints::default());
        assert_eq!(after.ephemeral_source, "measured");
        assert_eq!(after.ephemeral_meter, MemoryMeter::OutOfMemory.as_str());
        assert_eq!(after.need.ephemeral, (6u64 << 20) * 21 / 20);
        // Again: half again the raised figure.
        assert_eq!(
            memory.raise_after_out_of_memory(JobId(1), "iteration"),
            9 << 20
        );
    }

    #[test]
    fn variables_add_up_and_count_as_persistent() {
        let memory = JobMemory::new("variables", VariableBytes::default(), None);
        for _ in 0..2 {
            memory.add_variables(VariableBytes {
                bytes: 1000,
                variables: 1,
                unknown: 0,
            });
        }
        memory.add_variables(VariableBytes {
            bytes: 0,
            variables: 1,
            unknown: 1,
        });
        let variables = memory.variables();
        assert_eq!(
            (variables.bytes, variables.variables, variables.unknown),
            (2000, 3, 1)
        );
        let estimate = memory.estimate(&Hints::default());
        assert_eq!(estimate.persistent_source, "variables");
        assert_eq!(estimate.need.persistent, 2200);
        assert!(memory.lane().is_none());
    }
}
