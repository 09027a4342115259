//! One remote-eager job: a TFE context owned by a thread of its own, the
//! client's tensor handles and functions in it, and the rendezvous its `_Send`
//! ops feed. Requests are executed strictly in the order they were submitted
//! (the protocol's ops refer to earlier ops' outputs by id), one at a time.
//!
//! The front end translates the protocol into [`Item`]s; nothing here knows
//! about gRPC.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use prost::Message;
use salus_proto::tensorflow::{
    attr_value, AttrValue, DataType, FunctionDefView, NodeDef, TensorProto,
};
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::heap_meter;
use crate::runtime::eager_devices::DeviceNames;
use crate::runtime::graph_delta::{variable_bytes, VariableBytes};
use crate::runtime::job_history::{HistoryFacts, ShapeHash};
use crate::runtime::job_memory::JobMemory;
use crate::runtime::main_iteration::{IteratingJob, Iterations, RunOutcome};
use crate::runtime::memory_profile::{self, Sample, SampleTurn};
use crate::runtime::rendezvous::{Rendezvous, Sent};
use crate::runtime::run_class::{sample_due, MemoryEstimate, RunProfile, MAIN_MARKER};
use crate::sched::RunEnd;
use crate::sched::{Hints, JobId, LaneId};
use crate::sync::lock;
use crate::tenant::op_policy::checkpoint_path_inputs;
use crate::tenant::{checkpoint_guard, TenantRules};
use crate::tf::allocator::DeviceAllocator;
use crate::tf::eager::{EagerContext, OutputSlots, TensorHandle};
use crate::tf::op_registry;
use crate::tf::tensor::shape_proto;
use crate::tf::Tensor;
use crate::tf::TfError;
use salus_proto::tensorflow::error::Code as TfCode;

pub use crate::runtime::eager_functions::{map_function, FunctionRefusal, MappedFunction};

mod batching;
mod checkpoints;
mod context_thread;
mod early_sends;
mod execute;
mod functions;
mod handles;
mod sampling;
mod streams;

pub use crate::runtime::eager_items::{Item, ItemOutput, OpInput, OpRequest};
use batching::Batch;
pub use batching::{BatchBound, BatchPermit, MAX_BATCHES_IN_FLIGHT};
use early_sends::{send_ready_values, take_ready_sends};
use handles::{find_handle, read, unknown_handle, write, HandleTable};
use streams::{held_message, reports_held_failure};
pub use streams::{StalledWait, StreamState};

/// Counters for the admin API.
#[derive(Default)]
pub struct EagerStats {
    pub ops: AtomicU64,
    pub function_calls: AtomicU64,
    pub failed: AtomicU64,
    pub handles: AtomicU64,
    pub functions: AtomicU64,
}

/// What an eager job's thread needs of the scheduler and memory admission.
#[derive(Clone)]
pub struct Scheduling {
    /// The one main iteration (scheduler, memory admission, shutdown).
    pub iterations: Iterations,
    /// The server's async runtime: scheduling and admission are awaited there
    /// while the job's thread blocks.
    pub runtime: tokio::runtime::Handle,
    /// Function calls measured faster than this are cheap (`--cheap-below`).
    pub cheap_below: Duration,
    /// Trace sampled function calls to measure their memory (admission on).
    pub measure_memory: bool,
    /// GPU lanes: the lane whose virtual GPU the job's GPU ops run on.
    pub gpu_lane: Option<LaneId>,
}

/// What the job's thread shares with request handlers.
struct Shared {
    id: JobId,
    hints: Hints,
    sched: Scheduling,
    /// The variables it created, its sampled calls' memory, its memory lane.
    memory: JobMemory,
    context_id: u64,
    devices: DeviceNames,
    rendezvous: Rendezvous,
    stats: EagerStats,
    closing: AtomicBool,
    in_flight: AtomicUsize,
    /// Handles (op id, output) whose decref is queued but not yet applied: an
    /// early send of one would read a handle the client already released.
    pending_decrefs: Mutex<HashMap<(i64, i32), usize>>,
    /// The client's tensor handles: outputs by op id (send_tensor ids
    /// included); `None` once decref'd. Written only by the context's thread;
    /// read by it and by early sends (`send_ready_values`) while it
    /// runs a long call.
    handles: RwLock<HandleTable>,
    max_tensor_bytes: u64,
    tenant: Arc<TenantRules>,
    checkpoint_dir: std::path::PathBuf,
    /// What the job history learns of this job.
    history: HistoryFacts,
}

/// How the client set up the context.
pub struct EagerJobSpec {
    pub id: JobId,
    pub context_id: u64,
    pub hints: Hints,
    /// Serialized ConfigProto for the TFE context.
    pub config: Vec<u8>,
    pub devices: DeviceNames,
    pub keep_alive: Option<Duration>,
    pub context_view_id: u64,
    pub max_tensor_bytes: u64,
    pub tenant: Arc<TenantRules>,
    /// Where the job's checkpoint ops may read and write.
    pub checkpoint_dir: std::path::PathBuf,
    pub scheduling: Scheduling,
}

pub struct EagerJob {
    pub id: JobId,
    pub context_id: u64,
    /// Shown by the admin API beside graph jobs' session handles.
    pub handle: String,
    pub name: String,
    pub hints: Hints,
    pub created: Instant,
    /// The client's keep-alive (CreateContext.keep_alive_secs), if any.
    pub keep_alive: Option<Duration>,
    pub context_view_id: u64,
    shared: Arc<Shared>,
    last_access: Mutex<Instant>,
    open_streams: AtomicUsize,
    /// The streams requests came on, for `end_stalled_streams`.
    streams: Mutex<Vec<std::sync::Weak<StreamState>>>,
    queue: Mutex<Option<mpsc::Sender<Batch>>>,
    /// Bounds the requests read and not yet run (`admit`).
    admitted: BatchBound,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Why the job was closed, for requests that still name it.
    closed_because: Mutex<Option<String>>,
}

impl EagerJob {
    /// How its run ended, for the job history, when its client closed it or left.
    pub fn end_when_closed(&self) -> RunEnd {
        self.shared.history.end_when_closed()
    }

    /// Creates the TFE context on the job's own thread. Blocks.
    pub fn create(spec: EagerJobSpec) -> Result<EagerJob> {
        let shared = Arc::new(Shared {
            id: spec.id,
            hints: spec.hints.clone(),
            memory: JobMemory::new(
                "variables",
                VariableBytes::default(),
                spec.scheduling.gpu_lane,
            ),
            sched: spec.scheduling,
            context_id: spec.context_id,
            devices: spec.devices,
            rendezvous: Rendezvous::default(),
            stats: EagerStats::default(),
            closing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            pending_decrefs: Mutex::new(HashMap::new()),
            handles: RwLock::new(HashMap::new()),
            max_tensor_bytes: spec.max_tensor_bytes,
            tenant: spec.tenant,
            checkpoint_dir: spec.checkpoint_dir,
            history: HistoryFacts::default(),
        });
        let (tx, rx) = mpsc::channel::<Batch>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<()>>(1);
        let config = spec.config;
        let thread_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("salus-eager-{}", spec.id.0))
            .spawn(move || Worker::serve(&config, thread_shared, rx, ready_tx))
            .map_err(|e| Error::Internal(format!("cannot start an eager context thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                let _ = worker.join();
                return Err(err);
            }
            Err(_) => {
                return Err(Error::Internal(
                    "the eager context thread ended at start".into(),
                ))
            }
        }
        Ok(EagerJob {
            id: spec.id,
            context_id: spec.context_id,
            handle: format!("eager-{:016x}", spec.context_id),
            name: spec.hints.name.clone(),
            hints: spec.hints,
            created: Instant::now(),
            keep_alive: spec.keep_alive,
            context_view_id: spec.context_view_id,
            shared,
            last_access: Mutex::new(Instant::now()),
            open_streams: AtomicUsize::new(0),
            streams: Mutex::new(Vec::new()),
            queue: Mutex::new(Some(tx)),
            admitted: BatchBound::new(MAX_BATCHES_IN_FLIGHT),
            worker: Mutex::new(Some(worker)),
            closed_because: Mutex::new(None),
        })
    }

    pub fn devices(&self) -> &DeviceNames {
        &self.shared.devices
    }

    pub fn stats(&self) -> &EagerStats {
        &self.shared.stats
    }

    /// The job's memory need (persistent from its variables, ephemeral from
    /// sampled function calls; hints override).
    pub fn memory_estimate(&self, hints: &Hints) -> MemoryEstimate {
        self.shared.memory.estimate(hints)
    }

    /// Persistent memory the job's variables declare (optimizer slots included).
    pub fn variable_bytes(&self) -> VariableBytes {
        self.shared.memory.variables()
    }

    /// The job's memory lane, once admitted.
    pub fn lane(&self) -> Option<LaneId> {
        self.shared.memory.lane()
    }

    pub fn touch(&self) {
        *self.last_access.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    pub fn idle_for(&self) -> Duration {
        self.last_access
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// Requests queued or running.
    pub fn is_busy(&self) -> bool {
        self.shared.in_flight.load(Ordering::SeqCst) > 0
    }

    /// Results of `_Send` ops that no pull has taken yet.
    pub fn pending_sends(&self) -> usize {
        self.shared.rendezvous.pending()
    }

    fn gone(&self) -> Error {
        let reason = self
            .closed_because
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "it ended".into());
        Error::ContextGone(closed_message(self.context_id, &reason))
    }

    /// Ends the job: refuses new requests, fails queued ones and pending pulls,
    /// and frees every handle, function and variable with the TFE context.
    /// Blocks until the context's thread has finished (its running request, if
    /// any, completes first).
    pub fn close(&self, reason: &str) {
        self.closed_because
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| reason.to_string());
        self.shared.closing.store(true, Ordering::SeqCst);
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.admitted.close();
        self.shared
            .rendezvous
            .close(&closed_message(self.context_id, reason));
        if let Some(worker) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if worker.join().is_err() {
                tracing::error!(context = self.context_id, "eager context thread panicked");
            }
        }
        // The TFE context is gone: its memory share goes back to the pool.
        self.shared.memory.release();
    }
}

impl Drop for EagerJob {
    fn drop(&mut self) {
        self.close("the eager context was closed");
    }
}

impl Shared {
    /// What the main iteration needs of the job.
    fn iterating(&self) -> IteratingJob<'_> {
        IteratingJob::new(self.id, &self.hints, &self.memory, &self.history)
    }
}

/// Context threads whose TFE context is live.
static CONTEXT_THREADS: AtomicUsize = AtomicUsize::new(0);

/// What a request naming a closed context is told.
fn closed_message(context_id: u64, reason: &str) -> String {
    format!(
        "eager context {context_id} not found: it was closed because {reason}; its tensors and variables are gone. \
         Restart the script (or reconnect) to get a new context"
    )
}

/// The job's thread: owns the TFE context and every handle in it.
struct Worker {
    /// Handles in `Shared::handles` that are not released.
    live_handles: usize,
    /// Registered functions, each with whether its signature declares no
    /// outputs (its failure is then reported by the stream's next sync).
    functions: HashMap<String, bool>,
    /// Each registered function's nodes, hashed: the main one's is the job's
    /// fingerprint in the job history.
    function_shapes: HashMap<String, ShapeHash>,
    /// How long calls of each function take (classification and sampling).
    profiles: HashMap<String, RunProfile>,
    /// Functions whose registration was refused, and why: a later call names
    /// the refusal rather than an unknown function.
    refused: HashMap<String, String>,
    /// Ops (and pushed tensors) that failed or were skipped after a failure, with
    /// that failure: a later use of their outputs reports it, not just an
    /// unknown handle (the client may see that error first).
    failed_ops: HashMap<i64, TfError>,
    /// The context's latest failure, for requests skipped because of it.
    last_failure: Option<TfError>,
    /// Sends of the failed request just run that will not run: (tensor name,
    /// error) for their pulls.
    unsent: Vec<(String, TfError)>,
    /// Borrowed while the op's inputs borrow `handles`.
    slots: std::cell::RefCell<OutputSlots>,
    /// Device allocators by the device names calls gave (None: no statistics).
    allocators: HashMap<String, Option<DeviceAllocator>>,
    /// Functions whose memory sample was due while another job held the
    /// sampling turn: sampled at their next call.
    pending_samples: HashSet<String>,
    ctx: EagerContext,
    shared: Arc<Shared>,
}

#[cfg(test)]
mod tests;
