//! The node: the one scheduler core, memory admission and what start-up
//! learnt of the devices. TensorFlow-free (the supervisor holds just this);
//! a process that runs jobs holds it inside its `ServerState`.

use std::sync::Arc;
use std::time::Instant;

use crate::gpu_probe::{CapacitySource, GpuProbe};
use crate::runtime::admission::Admission;
use crate::runtime::grants::RuntimeGrants;
use crate::runtime::sched_port::SchedPort;
use crate::runtime::settings::Settings;
use crate::tf_types::DeviceInfo;

pub struct Node {
    /// The scheduler: its core here, or the supervisor's over the seam.
    pub sched: SchedPort,
    /// Memory admission, when a capacity is configured.
    pub admission: Option<Admission>,
    /// The devices jobs get, listed once at start-up.
    pub devices: Vec<DeviceInfo>,
    pub tensorflow_version: String,
    /// GPU 0 as the CUDA driver reported it at start, and where the memory
    /// capacity came from (`salus info`).
    pub gpu: GpuProbe,
    pub capacity_source: CapacitySource,
    pub started: Instant,
    /// What admins changed at run time, saved in the state directory (the
    /// process that schedules; an executor's stays empty).
    pub settings: Arc<Settings>,
}

impl Node {
    pub fn new(
        sched: SchedPort,
        admission: Option<Admission>,
        devices: Vec<DeviceInfo>,
        tensorflow_version: String,
    ) -> Node {
        Node {
            sched,
            admission,
            devices,
            tensorflow_version,
            gpu: GpuProbe::default(),
            capacity_source: CapacitySource::default(),
            started: Instant::now(),
            settings: Arc::new(Settings::default()),
        }
    }

    /// The scheduler and memory admission as the holder of tenants' grants,
    /// where this process schedules (a tenant's executor holds none).
    pub fn grant_holder(&self) -> Option<RuntimeGrants> {
        Some(RuntimeGrants {
            executor: self.sched.core()?.clone(),
            admission: self.admission.clone(),
        })
    }
}
