//! A job's per-iteration memory, from TensorFlow's own accounting of a traced
//! run (`RunOptions.trace_level = FULL_TRACE`).
//!
//! Each node's allocation records (allocations positive, deallocations
//! negative, with timestamps) belong to this run only, so replaying them in time
//! order per device gives the run's own peak even when other jobs share the
//! process's allocator. `allocator_bytes_in_use`, by contrast, is the whole
//! process's allocator: its rise during the run equals the run's peak only when
//! nothing else runs at the same time, which is how the estimate is checked.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use prost::Message;
use salus_proto::tensorflow::RunMetadataView;

/// TensorFlow allows one profiling session per process: a traced run while
/// another is active fails with AlreadyExists. Traced runs of all jobs (graph
/// and eager) take turns here; the server's own memory samples skip a busy
/// turn and retry on the job's next run.
pub static TRACE_TURN: Mutex<()> = Mutex::new(());

/// A run's place in the tracing turn ([`TRACE_TURN`]): whether its memory
/// sample is taken now, or left pending for the next run. Graph and eager
/// samplers decide the same way.
pub struct SampleTurn {
    turn: Option<std::sync::MutexGuard<'static, ()>>,
    due: bool,
}

impl SampleTurn {
    /// For a run whose sample is `due`: the turn if no other job's run holds
    /// it (a sample never waits for one).
    pub fn try_take(due: bool) -> SampleTurn {
        SampleTurn {
            turn: if due { TRACE_TURN.try_lock().ok() } else { None },
            due,
        }
    }

    /// The turn, waited for: a run the client traces itself, which is not a
    /// sample (TensorFlow allows one profiling session per process).
    pub fn exclusive() -> SampleTurn {
        SampleTurn {
            turn: Some(TRACE_TURN.lock().unwrap_or_else(|e| e.into_inner())),
            due: false,
        }
    }

    /// The run is sampled: it was due and has the turn.
    pub fn sampling(&self) -> bool {
        self.due && self.turn.is_some()
    }

    /// The sample was due but another job held the turn: take it at the next run.
    pub fn left_pending(&self) -> bool {
        self.due && self.turn.is_none()
    }
}

/// Memory a traced run used, per device and in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepMemory {
    /// Peak of this run's own allocations, per device name.
    pub peak_by_device: BTreeMap<String, u64>,
    /// Rise of the (process-wide) allocator's bytes in use during the run,
    /// per device: TensorFlow's own number, meaningful when the run was alone.
    pub allocator_rise_by_device: BTreeMap<String, u64>,
}

impl StepMemory {
    /// The run's peak over all devices (the figure a single-device lane needs).
    pub fn peak(&self) -> u64 {
        self.peak_by_device.values().sum()
    }

    pub fn allocator_rise(&self) -> u64 {
        self.allocator_rise_by_device.values().sum()
    }
}

/// Parses a serialized RunMetadata and replays its allocation records.
pub fn step_memory(run_metadata: &[u8]) -> Result<StepMemory, prost::DecodeError> {
    let metadata = RunMetadataView::decode(run_metadata)?;
    let mut memory = StepMemory::default();
    for device in metadata.step_stats.map(|s| s.dev_stats).unwrap_or_default() {
        let mut records: Vec<(i64, i64)> = Vec::new();
        let (mut low, mut high) = (i64::MAX, i64::MIN);
        for used in device.node_stats.iter().flat_map(|n| &n.memory) {
            records.extend(
                used.allocation_records
                    .iter()
                    .map(|r| (r.alloc_micros, r.alloc_bytes)),
            );
            low = low.min(used.allocator_bytes_in_use);
            high = high.max(used.allocator_bytes_in_use);
        }
        // Allocations before deallocations at the same instant: the peak is an
        // upper bound, never an underestimate.
        records.sort_by_key(|&(t, bytes)| (t, std::cmp::Reverse(bytes)));
        let (mut current, mut peak) = (0i64, 0i64);
        for (_, bytes) in records {
            current = current.saturating_add(bytes);
            peak = peak.max(current);
        }
        *memory
            .peak_by_device
            .entry(device.device.clone())
            .or_default() += peak.max(0) as u64;
        if high >= low {
            *memory
                .allocator_rise_by_device
                .entry(device.device)
                .or_default() += (high - low).max(0) as u64;
        }
    }
    Ok(memory)
}

/// What a sampled iteration's meters read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// The device allocator's peak above its use at the start (None: the
    /// allocator keeps no statistics, or was not read).
    pub allocator: Option<u64>,
    /// A host meter's figure: the heap's rise (eager calls) or the run's
    /// allocation records (TF1 traced runs).
    pub host: Option<(u64, MemoryMeter)>,
    /// The device's memory is the host's (a CPU device).
    pub on_host: bool,
}

impl Sample {
    /// The iteration's need. On a GPU, the allocator's figure: device memory
    /// is what it hands out. On the host, kernels also malloc scratch the
    /// allocator never sees: the heap's rise is added to the allocator's (a
    /// CPU allocator with statistics is TensorFlow's BFC, which reuses its
    /// pool without malloc, so the two are apart, or overlap only where its
    /// pool grew: an upper bound); allocation records are the allocator's own
    /// allocations, so the larger of the two.
    pub fn need(&self) -> Option<(u64, MemoryMeter)> {
        match (self.allocator, self.host) {
            (Some(0), host @ Some(_)) if self.on_host => host,
            (Some(a), Some((h, MemoryMeter::Heap))) if self.on_host => {
                Some((a.saturating_add(h), MemoryMeter::AllocatorAndHeap))
            }
            (Some(a), Some(h)) if self.on_host && h.0 > a => Some(h),
            (Some(a), _) => Some((a, MemoryMeter::Allocator)),
            (None, host) => host,
        }
    }
}

/// What measured a job's per-iteration memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum MemoryMeter {
    /// Nothing yet.
    #[default]
    None = 0,
    /// The device allocator's peak during the run (`tf::allocator`).
    Allocator = 1,
    /// The server's heap rise during the run (`heap_meter`), where the
    /// device's allocator keeps no statistics.
    Heap = 2,
    /// The run's own allocation records (a TF1 traced run), likewise.
    Trace = 3,
    /// Raised after the job ran out of memory.
    OutOfMemory = 4,
    /// A host device's allocator and the heap's rise beside it.
    AllocatorAndHeap = 5,
}

impl MemoryMeter {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryMeter::None => "",
            MemoryMeter::Allocator => "allocator",
            MemoryMeter::Heap => "heap",
            MemoryMeter::Trace => "trace",
            MemoryMeter::OutOfMemory => "out_of_memory",
            MemoryMeter::AllocatorAndHeap => "allocator+heap",
        }
    }

    fn from_u8(value: u8) -> MemoryMeter {
        match value {
            1 => MemoryMeter::Allocator,
            2 => MemoryMeter::Heap,
            3 => MemoryMeter::Trace,
            4 => MemoryMeter::OutOfMemory,
            5 => MemoryMeter::AllocatorAndHeap,
            _ => MemoryMeter::None,
        }
    }
}

/// The largest per-iteration memory measured for a job, and what measured it.
#[derive(Debug, Default)]
pub struct MeasuredMemory {
    /// Bytes and meter in one word (meter in the top byte), so both change
    /// together.
    packed: AtomicU64,
    /// The largest device allocator figure of a sample, bytes (0: none).
    allocator: AtomicU64,
}

const METER_SHIFT: u32 = 56;
const BYTES_MASK: u64 = (1 << METER_SHIFT) - 1;

impl MeasuredMemory {
    /// Keeps `bytes` (from `meter`) when it is the largest so far.
    pub fn record(&self, bytes: u64, meter: MemoryMeter) {
        let packed = bytes.min(BYTES_MASK) | (u64::from(meter as u8) << METER_SHIFT);
        let _ = self
            .packed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (bytes.min(BYTES_MASK) > now & BYTES_MASK).then_some(packed)
            });
    }

    /// Keeps a sample's need, plus `extra` bytes outside every meter (a TF1
    /// run's fed tensors on the host), and its allocator figure as it was.
    pub fn record_sample(&self, sample: &Sample, extra: u64) {
        if let Some(bytes) = sample.allocator {
            self.allocator.fetch_max(bytes, Ordering::Relaxed);
        }
        if let Some((bytes, meter)) = sample.need() {
            self.record(bytes.saturating_add(extra), meter);
        }
    }

    /// The largest figure the device allocator gave (0: none).
    pub fn allocator_bytes(&self) -> u64 {
        self.allocator.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.packed.load(Ordering::Relaxed) & BYTES_MASK
    }

    pub fn meter(&self) -> MemoryMeter {
        MemoryMeter::from_u8((self.packed.load(Ordering::Relaxed) >> METER_SHIFT) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_due_while_another_run_traces_is_left_pending() {
        let held = SampleTurn::exclusive();
        assert!(!held.sampling() && !held.left_pending());
        let busy = SampleTurn::try_take(true);
        assert!(!busy.sampling());
        assert!(busy.left_pending(), "retried at the next run");
        drop(held);
        let not_due = SampleTurn::try_take(false);
        assert!(!not_due.sampling() && !not_due.left_pending());
    }
    use salus_proto::tensorflow::{
        AllocationRecord, AllocatorMemoryUsed, DeviceStepStats, NodeExecStats, StepStats,
    };

    fn node(records: &[(i64, i64)], in_use: i64) -> NodeExecStats {
        NodeExecStats {
            node_name: "n".into(),
            memory: vec![AllocatorMemoryUsed {
                allocator_name: "mklcpu".into(),
                allocator_bytes_in_use: in_use,
                allocation_records: records
                    .iter()
                    .map(|&(alloc_micros, alloc_bytes)| AllocationRecord {
                        alloc_micros,
                        alloc_bytes,
                    })
                    .collect(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn replays_allocations_in_time_order() {
        let metadata = RunMetadataView {
            step_stats: Some(StepStats {
                dev_stats: vec![DeviceStepStats {
                    device: "/device:CPU:0".into(),
                    // Two nodes whose records interleave in time.
                    node_stats: vec![
                        node(&[(1, 100), (5, -100)], 1100),
                        node(&[(2, 300), (3, -300), (4, 50)], 1400),
                    ],
                }],
            }),
        };
        let memory = step_memory(&metadata.encode_to_vec()).unwrap();
        // 100 + 300 live at t=2..3.
        assert_eq!(memory.peak(), 400);
        assert_eq!(memory.allocator_rise(), 300);
        assert_eq!(step_memory(&[]).unwrap(), StepMemory::default());
        assert!(step_memory(&[0x0a, 0x05]).is_err());
    }

    #[test]
    fn same_instant_allocations_count_before_frees() {
        let metadata = RunMetadataView {
            step_stats: Some(StepStats {
                dev_stats: vec![DeviceStepStats {
                    device: "d".into(),
                    node_stats: vec![node(&[(1, 10), (2, -10), (2, 20)], 0)],
                }],
            }),
        };
        assert_eq!(step_memory(&metadata.encode_to_vec()).unwrap().peak(), 30);
    }

    #[test]
    fn the_largest_measurement_keeps_its_meter() {
        let measured = MeasuredMemory::default();
        assert_eq!((measured.bytes(), measured.meter()), (0, MemoryMeter::None));
        measured.record(300, MemoryMeter::Allocator);
        measured.record(200, MemoryMeter::Heap);
        assert_eq!(
            (measured.bytes(), measured.meter()),
            (300, MemoryMeter::Allocator)
        );
        measured.record(450, MemoryMeter::OutOfMemory);
        assert_eq!(
            (measured.bytes(), measured.meter()),
            (450, MemoryMeter::OutOfMemory)
        );
        assert_eq!(MemoryMeter::Trace.as_str(), "trace");
    }

    #[test]
    fn a_gpu_sample_is_its_allocator_and_a_host_sample_adds_the_heap() {
        let gpu = Sample {
            allocator: Some(100),
            host: Some((900, MemoryMeter::Heap)),
            on_host: false,
        };
        assert_eq!(gpu.need(), Some((100, MemoryMeter::Allocator)));
        // A CPU allocator (BFC) and the kernels' malloc'ed scratch beside it.
        let host = Sample {
            on_host: true,
            ..gpu
        };
        assert_eq!(host.need(), Some((1000, MemoryMeter::AllocatorAndHeap)));
        // TensorFlow's default CPU allocator mallocs: its statistics stay 0.
        let system = Sample {
            allocator: Some(0),
            ..host
        };
        assert_eq!(system.need(), Some((900, MemoryMeter::Heap)));
        // Allocation records are the allocator's own allocations.
        let traced = Sample {
            allocator: Some(1000),
            host: Some((900, MemoryMeter::Trace)),
            on_host: true,
        };
        assert_eq!(traced.need(), Some((1000, MemoryMeter::Allocator)));
        let traced = Sample {
            allocator: Some(800),
            ..traced
        };
        assert_eq!(traced.need(), Some((900, MemoryMeter::Trace)));
        let no_stats = Sample {
            allocator: None,
            host: Some((5, MemoryMeter::Heap)),
            on_host: true,
        };
        assert_eq!(no_stats.need(), Some((5, MemoryMeter::Heap)));
        assert_eq!(Sample::default().need(), None);
        let measured = MeasuredMemory::default();
        measured.record_sample(&traced, 24);
        measured.record_sample(&no_stats, 0);
        assert_eq!((measured.bytes(), measured.allocator_bytes()), (924, 800));
        assert_eq!(measured.meter(), MemoryMeter::Trace);
    }
}
