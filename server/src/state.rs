//! State shared by the gRPC services of one server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::admission::Admission;
use crate::executor::Executor;
use crate::session_config::SessionDefaults;
use crate::sessions::SessionTable;
use crate::tenant::TenantRules;
use crate::tf::DeviceInfo;

/// Settings every job gets.
#[derive(Clone, Copy, Debug)]
pub struct JobSettings {
    /// Largest tensor a feed may produce, in bytes.
    pub max_tensor_bytes: u64,
    /// Runs measured faster than this execute on the calling executor thread
    /// instead of TensorFlow's inter-op pool (saves two thread switches).
    pub inline_below: std::time::Duration,
    /// Repeated runs measured faster than this bypass the scheduler.
    pub cheap_below: std::time::Duration,
    /// Trace sample runs to measure per-iteration memory (admission on).
    pub measure_memory: bool,
}

pub struct ServerState {
    pub sessions: SessionTable,
    pub executor: Executor,
    /// Memory admission, when a capacity is configured.
    pub admission: Option<Admission>,
    pub settings: JobSettings,
    pub session_defaults: SessionDefaults,
    pub tenant: Arc<TenantRules>,
    pub max_sessions: usize,
    /// The server's devices, listed once at start-up.
    pub devices: Vec<DeviceInfo>,
    pub tensorflow_version: String,
    pub started: Instant,
    runs_completed: AtomicU64,
}

impl ServerState {
    pub fn new(
        executor: Executor,
        admission: Option<Admission>,
        settings: JobSettings,
        session_defaults: SessionDefaults,
        tenant: Arc<TenantRules>,
        max_sessions: usize,
        devices: Vec<DeviceInfo>,
        tensorflow_version: String,
    ) -> Self {
        ServerState {
            sessions: SessionTable::new(),
            executor,
            admission,
            settings,
            session_defaults,
            tenant,
            max_sessions,
            devices,
            tensorflow_version,
            started: Instant::now(),
            runs_completed: AtomicU64::new(0),
        }
    }

    pub fn count_run(&self) {
        self.runs_completed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn runs_completed(&self) -> u64 {
        self.runs_completed.load(Ordering::Relaxed)
    }
}
