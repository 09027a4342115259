//! What graph and eager jobs share about their runs: how a repeated run is
//! classified (main iteration or cheap run), and a job's memory estimate.
//!
//! A run (a RunStep/RunCallable signature, or a call of one eager function) is
//! *cheap* until it has run [`WARMUP_RUNS`] times: initializers and setup run
//! at once and never wait behind another job's iteration. After that it is
//! *brief* while it takes less than `--cheap-below`: it runs at once too,
//! unless a queued iteration of a job the policy ranks ahead is waiting, and
//! then it queues like a main iteration (so a client looping over small steps
//! cannot take more than its share). Other runs are *main* iterations,
//! scheduled by the policy. A run naming [`MAIN_MARKER`] is always main; a
//! graph run of an enqueue node (a TF1 input pipeline) is always cheap
//! (`graph_delta::FEEDING_OPS`).
//! The time of runs that went at once is charged to the job's service.

use crate::runtime::memory_profile::MeasuredMemory;
use crate::sched::lanes::MemoryNeed;
use crate::sched::Hints;

/// How long runs of one signature take.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunProfile {
    pub runs: u64,
    /// Exponentially weighted mean duration, nanoseconds.
    pub mean_ns: f64,
}

impl RunProfile {
    /// Weight of the newest run in the mean.
    const WEIGHT: f64 = 0.2;

    pub fn record(&mut self, ns: f64) {
        self.mean_ns = if self.runs == 0 {
            ns
        } else {
            self.mean_ns + Self::WEIGHT * (ns - self.mean_ns)
        };
        self.runs += 1;
    }

    /// The class of the next run like these; `marked`: it names the marker.
    pub fn classify(&self, cheap_below_ns: f64, marked: bool) -> RunClass {
        if marked {
            RunClass::Main
        } else if self.runs < WARMUP_RUNS {
            RunClass::Cheap
        } else if self.mean_ns < cheap_below_ns {
            RunClass::Brief
        } else {
            RunClass::Main
        }
    }
}

/// Runs of a signature before it can count as a main iteration: initializers
/// and one-off setup runs happen once.
pub const WARMUP_RUNS: u64 = 2;

/// A node (graph jobs) or function (eager jobs: `tf.function def salus_main_iter`)
/// with this name forces a main iteration.
pub const MAIN_MARKER: &str = "salus_main_iter";

/// Which run of a signature (1-based) is traced to measure memory: the last
/// warm-up run (the first one allocates one-time state) and a few later.
pub const MEMORY_SAMPLE_RUNS: &[u64] = &[WARMUP_RUNS, 10, 100, 1000];

/// Whether the next run of a signature that has run `runs` times is sampled:
/// one of [`MEMORY_SAMPLE_RUNS`], or any run while a sample is `pending` (it
/// was due while another job held the tracing turn).
pub fn sample_due(runs: u64, pending: bool) -> bool {
    pending || MEMORY_SAMPLE_RUNS.contains(&(runs + 1))
}

/// How a run is scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunClass {
    /// Scheduled by the policy.
    Main,
    /// Runs at once: a warm-up run of its signature (initializers, setup).
    Cheap,
    /// A repeated run measured faster than `--cheap-below`: runs at once
    /// (as a cheap run) unless another job's queued iteration ranks ahead of
    /// its job, and then queues as a main iteration, so loops of small steps
    /// share the device by the policy too ([`crate::runtime::executor::Executor::resolve`]).
    Brief,
}

/// A job's memory need and where each part comes from ("graph", "variables",
/// "measured", "hint", "default").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    pub need: MemoryNeed,
    pub persistent_source: &'static str,
    pub ephemeral_source: &'static str,
    /// What measured the ephemeral need when its source is "measured"
    /// ([`MemoryMeter::as_str`]), else "".
    pub ephemeral_meter: &'static str,
    /// The largest figure the device allocator gave for an iteration (0:
    /// none), whatever the need was taken from.
    pub ephemeral_allocator_bytes: u64,
}

impl MemoryEstimate {
    /// Salus's margins (+10% persistent, +5% ephemeral) on what the job
    /// declares and what was measured; hints override. Without a measurement
    /// yet, the ephemeral need defaults to the persistent one.
    pub fn new(
        declared_persistent: u64,
        persistent_source: &'static str,
        measured: &MeasuredMemory,
        hints: &Hints,
    ) -> Self {
        let (measured_ephemeral, meter) = (measured.bytes(), measured.meter());
        let (persistent, persistent_source) = match hints.persistent_bytes {
            Some(bytes) => (bytes, "hint"),
            None => (
                declared_persistent.saturating_mul(11) / 10,
                persistent_source,
            ),
        };
        let (ephemeral, ephemeral_source) = match hints.ephemeral_bytes {
            Some(bytes) => (bytes, "hint"),
            None if measured_ephemeral > 0 => {
                (measured_ephemeral.saturating_mul(21) / 20, "measured")
            }
            None => (persistent, "default"),
        };
        MemoryEstimate {
            need: MemoryNeed {
                persistent,
                ephemeral,
            },
            persistent_source,
            ephemeral_source,
            ephemeral_meter: if ephemeral_source == "measured" {
                meter.as_str()
            } else {
                ""
            },
            ephemeral_allocator_bytes: measured.allocator_bytes(),
        }
    }
}

/// After an out-of-memory error: half again the larger of the measurement and
/// the persistent size (at least 1 MiB), the new ephemeral measurement.
pub fn ephemeral_after_oom(measured: u64, persistent: u64) -> u64 {
    measured.max(persistent).max(1 << 20).saturating_mul(3) / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::memory_profile::MemoryMeter;

    #[test]
    fn warm_up_runs_are_cheap_and_fast_ones_brief() {
        let mut p = RunProfile::default();
        assert_eq!(p.classify(1e6, false), RunClass::Cheap);
        assert_eq!(p.classify(1e6, true), RunClass::Main);
        p.record(5e6);
        p.record(5e6);
        assert_eq!(p.classify(1e6, false), RunClass::Main);
        assert_eq!(p.classify(1e7, false), RunClass::Brief);
    }

    #[test]
    fn estimates_take_margins_and_hints() {
        let none = MeasuredMemory::default();
        let e = MemoryEstimate::new(1000, "variables", &none, &Hints::default());
        assert_eq!((e.need.persistent, e.need.ephemeral), (1100, 1100));
        assert_eq!(
            (e.persistent_source, e.ephemeral_source, e.ephemeral_meter),
            ("variables", "default", "")
        );
        let measured = MeasuredMemory::default();
        measured.record(2000, MemoryMeter::Allocator);
        let e = MemoryEstimate::new(1000, "variables", &measured, &Hints::default());
        assert_eq!((e.need.ephemeral, e.ephemeral_source), (2100, "measured"));
        assert_eq!(e.ephemeral_meter, "allocator");
        let hints = Hints {
            ephemeral_bytes: Some(7),
            persistent_bytes: Some(3),
            ..Default::default()
        };
        let e = MemoryEstimate::new(1000, "variables", &measured, &hints);
        assert_eq!((e.need.persistent, e.need.ephemeral), (3, 7));
        assert_eq!((e.ephemeral_source, e.ephemeral_meter), ("hint", ""));
        assert_eq!(ephemeral_after_oom(0, 0), 3 << 19);
        assert_eq!(ephemeral_after_oom(4 << 20, 0), 6 << 20);
    }
}
