//! A job's per-iteration memory: what salus-node's
//! `runtime::memory_profile` keeps and reads (re-exported here), and the
//! measuring of one run, under TensorFlow's device allocator.

pub use salus_node::runtime::memory_profile::*;

use crate::heap_meter;
use crate::tf::allocator::DeviceAllocator;

/// Runs `run` under the allocator's meter (when given) and, with `heap`, the
/// heap's.
pub fn measure<R>(
    allocator: Option<DeviceAllocator>,
    heap: bool,
    run: impl FnOnce() -> R,
) -> (R, Sample) {
    let on_host = allocator.is_none_or(|a| a.on_host());
    let metered = || match allocator {
        Some(allocator) => allocator.measure(run),
        None => (run(), None),
    };
    let ((result, allocator), heap_rise) = if heap {
        heap_meter::measure(metered)
    } else {
        (metered(), None)
    };
    let sample = Sample {
        allocator,
        host: heap_rise.map(|bytes| (bytes, MemoryMeter::Heap)),
        on_host,
    };
    (result, sample)
}
