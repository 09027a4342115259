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
use std::sync::Mutex;

use prost::Message;
use salus_proto::tensorflow::RunMetadataView;

/// TensorFlow allows one profiling session per process: a traced run while
/// another is active fails with AlreadyExists. Traced runs of all jobs (graph
/// and eager) take turns here; the server's own memory samples skip a busy
/// turn and retry on the job's next run.
pub static TRACE_TURN: Mutex<()> = Mutex::new(());

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

#[cfg(test)]
mod tests {
    use super::*;
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
}
