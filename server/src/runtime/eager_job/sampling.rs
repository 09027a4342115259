//! What an eager job learns of its memory: sampled function calls and the
//! variables it creates.

use super::*;

impl Worker {
    /// What the sampled call just run took at its peak (its outputs
    /// included), as the job's ephemeral need: the device allocator's rise,
    /// and on the host the heap's if larger (TensorFlow 2.21 keeps no memory
    /// records for eager calls; see `memory_profile::Sample`).
    pub(super) fn record_memory_sample(&self, function: &str, sample: &Sample) {
        tracing::debug!(
            job = self.shared.id.0,
            function,
            allocator = ?sample.allocator,
            host = ?sample.host,
            "sampled a function call's memory"
        );
        self.shared.memory.record_sample(sample, 0);
    }

    /// The allocator of `device` (the call's; empty: the context's default),
    /// when it keeps statistics; looked up once per device.
    pub(super) fn device_allocator(&mut self, device: &str) -> Option<DeviceAllocator> {
        if let Some(found) = self.allocators.get(device) {
            return *found;
        }
        let found = DeviceAllocator::of_eager(&self.ctx, device).filter(|a| a.stats().is_some());
        self.allocators.insert(device.to_string(), found);
        found
    }

    /// A variable the client created: its declared size is persistent memory.
    pub(super) fn record_variable(&self, op: &OpRequest) {
        let node = NodeDef {
            op: op.name.clone(),
            attr: op
                .attrs
                .iter()
                .filter(|(k, _)| k == "dtype" || k == "shape")
                .filter_map(|(k, v)| Some((k.clone(), AttrValue::decode(v.as_ref()).ok()?)))
                .collect(),
            ..Default::default()
        };
        let size = variable_bytes(&node).flatten();
        self.shared.memory.add_variables(VariableBytes {
            bytes: size.unwrap_or(0),
            variables: 1,
            unknown: u64::from(size.is_none()),
        });
    }
}
