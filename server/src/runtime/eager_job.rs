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

use crate::sync::lock;
use crate::error::{Error, Result};
use crate::heap_meter;
use crate::runtime::admission::{Admission, LaneReservation};
use crate::runtime::eager_devices::DeviceNames;
use crate::runtime::executor::MainTurn;
use crate::runtime::sched_port::SchedPort;
use crate::runtime::graph_delta::{variable_bytes, VariableBytes};
use crate::runtime::job_history::{HistoryFacts, ShapeHash};
use crate::runtime::memory_profile::{self, MeasuredMemory, MemoryMeter, Sample};
use crate::runtime::rendezvous::{Rendezvous, Sent};
use crate::runtime::run_class::{
    ephemeral_after_oom, MemoryEstimate, RunClass, RunProfile, MAIN_MARKER, MEMORY_SAMPLE_RUNS,
};
use crate::sched::RunEnd;
use crate::sched::{Hints, JobId, LaneId};
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
pub use crate::runtime::eager_items::{Item, ItemOutput, OpInput, OpRequest};

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
    pub port: SchedPort,
    /// Memory admission, when a capacity is configured.
    pub admission: Option<Admission>,
    /// The server's async runtime: scheduling and admission are awaited there
    /// while the job's thread blocks.
    pub runtime: tokio::runtime::Handle,
    /// Function calls measured faster than this are cheap (`--cheap-below`).
    pub cheap_below: Duration,
    /// Trace sampled function calls to measure their memory (admission on).
    pub measure_memory: bool,
    /// GPU lanes: the lane whose virtual GPU the job's GPU ops run on.
    pub gpu_lane: Option<LaneId>,
    /// Set at shutdown: no new function calls (results of earlier ones can
    /// still be fetched).
    pub draining: Arc<AtomicBool>,
}

/// What the job's thread shares with request handlers.
struct Shared {
    id: JobId,
    hints: Hints,
    sched: Scheduling,
    /// The job's memory lane, once admitted (dropping it frees the share).
    reservation: Mutex<Option<LaneReservation>>,
    /// Persistent memory the job's variables declare.
    variables: Mutex<VariableBytes>,
    /// Largest per-iteration memory measured so far, bytes, and its meter.
    ephemeral_measured: MeasuredMemory,
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

struct Batch {
    items: Vec<Item>,
    /// The stream the request came on (none for a unary Enqueue).
    stream: Option<Arc<StreamState>>,
    reply: oneshot::Sender<Result<Vec<ItemOutput>>>,
    /// Its place among the context's requests in flight, given back when
    /// the context's thread is done with it.
    _admitted: BatchPermit,
}

/// Requests (`Enqueue` calls, `StreamingEnqueue` messages) of one eager
/// context read from its clients and not yet run: a client that sends faster
/// than its context runs is not read further (its stream waits, under HTTP/2
/// flow control; a unary call waits before it is queued) until one has run.
/// TensorFlow's client pipelines its async ops; a few hundred ahead keeps it
/// busy while bounding what one client makes the server hold.
pub const MAX_BATCHES_IN_FLIGHT: usize = 256;

/// One request's place among its context's requests in flight.
pub type BatchPermit = tokio::sync::OwnedSemaphorePermit;

/// The bound on one context's requests in flight ([`MAX_BATCHES_IN_FLIGHT`]).
pub struct BatchBound {
    permits: Arc<tokio::sync::Semaphore>,
}

impl BatchBound {
    pub fn new(max: usize) -> BatchBound {
        BatchBound {
            permits: Arc::new(tokio::sync::Semaphore::new(max.max(1))),
        }
    }

    /// Waits until the context has room for one more request; None once the
    /// bound was closed (the context ended).
    pub async fn admit(&self) -> Option<BatchPermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Requests in flight now.
    pub fn in_flight(&self, max: usize) -> usize {
        max.max(1).saturating_sub(self.permits.available_permits())
    }

    /// Wakes every waiting request with None, and every later one.
    pub fn close(&self) {
        self.permits.close();
    }
}

/// What the requests of one StreamingEnqueue stream share.
#[derive(Default)]
pub struct StreamState {
    /// Numbers the server's streams, for logs.
    pub id: u64,
    /// Set once a request failed: later ones are refused, as TensorFlow's
    /// worker ends the stream at the first error.
    pub failed: AtomicBool,
    /// The failure of a request whose last op has no outputs. The stock client
    /// does not wait for such an op (it only poisons outputs), so the request
    /// is answered as done and the stream's next value read or sync fails with
    /// this instead of running, as does a later item that fails on its own:
    /// the script hears of the failure at its next wait, not at a later,
    /// unrelated symptom (a table "not initialized").
    held: Mutex<Option<TfError>>,
    /// Set once the stream's error status has been handed to the transport.
    status_sent: (Mutex<bool>, std::sync::Condvar),
    /// Why the server ends the stream ahead of its pending replies (a wait of
    /// the client's that nothing can end, `EagerJob::end_stalled_streams`).
    ended_because: Mutex<Option<String>>,
    ended: tokio::sync::Notify,
}

impl StreamState {
    pub fn new() -> StreamState {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        StreamState {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            ..Default::default()
        }
    }

    /// Ends the stream with ABORTED and `reason`, ahead of replies still pending.
    pub fn end(&self, reason: String) {
        lock(&self.ended_because).get_or_insert(reason);
        self.ended.notify_one();
    }

    /// Resolves once [`StreamState::end`] was called, with its reason.
    pub async fn ended(&self) -> String {
        loop {
            if let Some(reason) = lock(&self.ended_because).clone() {
                return reason;
            }
            self.ended.notified().await;
        }
    }

    /// The failure held for the stream's next value read or sync, once.
    fn take_held(&self) -> Option<TfError> {
        lock(&self.held).take()
    }

    /// Called by the stream's writer when it ended the stream with an error.
    pub fn mark_status_sent(&self) {
        *lock(&self.status_sent.0) = true;
        self.status_sent.1.notify_all();
    }

    /// Blocks (a context thread) until the stream's error status is out, or
    /// for `limit` at most.
    fn wait_until_status_sent(&self, limit: Duration) {
        let sent = lock(&self.status_sent.0);
        let _ = self
            .status_sent
            .1
            .wait_timeout_while(sent, limit, |sent| !*sent)
            .map_err(|e| e.into_inner());
    }
}

/// What `EagerJob::end_stalled_streams` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StalledWait {
    Ended,
    /// A request is queued or running: the wait may still end.
    Busy,
    /// The context was used during the wait.
    Active,
    NoOpenStream,
}

impl StalledWait {
    pub fn label(self) -> &'static str {
        match self {
            StalledWait::Ended => "ended",
            StalledWait::Busy => "busy",
            StalledWait::Active => "active",
            StalledWait::NoOpenStream => "no open stream",
        }
    }
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
            sched: spec.scheduling,
            reservation: Mutex::new(None),
            variables: Mutex::new(VariableBytes::default()),
            ephemeral_measured: MeasuredMemory::default(),
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
            .spawn(move || match EagerContext::new(&config) {
                Ok(ctx) => {
                    CONTEXT_THREADS.fetch_add(1, Ordering::SeqCst);
                    let _ = ready_tx.send(Ok(()));
                    Worker {
                        live_handles: 0,
                        functions: HashMap::new(),
                        function_shapes: HashMap::new(),
                        profiles: HashMap::new(),
                        refused: HashMap::new(),
                        failed_ops: HashMap::new(),
                        last_failure: None,
                        unsent: Vec::new(),
                        slots: Default::default(),
                        allocators: HashMap::new(),
                        pending_samples: HashSet::new(),
                        ctx,
                        shared: thread_shared,
                    }
                    .run(rx);
                    // The context's memory is free now; the heap keeps freed
                    // memory for reuse (tf_env), so hand it back to the system:
                    // always when the last context ended, else at most once a second.
                    let last = CONTEXT_THREADS.fetch_sub(1, Ordering::SeqCst) == 1;
                    heap_meter::return_free_memory(last);
                }
                Err(err) => {
                    let _ = ready_tx.send(Err(err.into()));
                }
            })
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
        self.shared.memory_estimate(hints)
    }

    /// Persistent memory the job's variables declare (optimizer slots included).
    pub fn variable_bytes(&self) -> VariableBytes {
        *lock(&self.shared.variables)
    }

    /// The job's memory lane, once admitted.
    pub fn lane(&self) -> Option<LaneId> {
        lock(&self.shared.reservation)
            .as_ref()
            .map(LaneReservation::lane)
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

    pub fn stream_opened(&self, stream: &Arc<StreamState>) {
        self.open_streams.fetch_add(1, Ordering::SeqCst);
        let mut streams = lock(&self.streams);
        streams.retain(|s| s.strong_count() > 0);
        streams.push(Arc::downgrade(stream));
    }

    /// The client's thread has waited `waited` for this context with none of
    /// its own callbacks running: if nothing was queued or running here for
    /// all that time (short of a second's slack), no reply can still come,
    /// so the context's open streams end with ABORTED naming the wait, and
    /// the client's pending ops fail with it. The context goes on.
    pub fn end_stalled_streams(&self, waited: Duration, waiting_for: &str) -> StalledWait {
        let idle = self.idle_for();
        if self.is_busy() {
            return StalledWait::Busy;
        }
        if idle + Duration::from_secs(1) < waited {
            return StalledWait::Active;
        }
        let open: Vec<Arc<StreamState>> = lock(&self.streams)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|s| !s.failed.load(Ordering::SeqCst))
            .collect();
        if open.is_empty() {
            return StalledWait::NoOpenStream;
        }
        let reason = format!(
            "the script waited {:.0} s for {waiting_for}, while the Salus server had nothing queued or running \
             for this eager context for {:.0} s and no Python callback of the script was running: the wait \
             could never end, so the server ended the context's request stream (a lost request or a server \
             fault; please report it with the server's log). The context goes on",
            waited.as_secs_f64(),
            idle.as_secs_f64()
        );
        tracing::warn!(context = self.context_id, streams = open.len(), %reason, "ending a stalled wait");
        for stream in open {
            stream.end(reason.clone());
        }
        StalledWait::Ended
    }

    /// Returns the streams still open.
    pub fn stream_closed(&self) -> usize {
        self.open_streams
            .fetch_sub(1, Ordering::SeqCst)
            .saturating_sub(1)
    }

    pub fn open_streams(&self) -> usize {
        self.open_streams.load(Ordering::SeqCst)
    }

    /// Waits for room for one more request of this context (at most
    /// [`MAX_BATCHES_IN_FLIGHT`] read and not yet run); fails once the
    /// context is closed.
    pub async fn admit(&self) -> Result<BatchPermit> {
        self.admitted.admit().await.ok_or_else(|| self.gone())
    }

    /// Queues a request admitted by [`EagerJob::admit`]; the receiver yields
    /// its outputs once it has run. `_Send` ops are announced at once so that
    /// early pulls wait for them.
    pub fn submit(
        &self,
        mut items: Vec<Item>,
        stream: Option<Arc<StreamState>>,
        admitted: BatchPermit,
    ) -> Result<oneshot::Receiver<Result<Vec<ItemOutput>>>> {
        self.touch();
        let (reply, rx) = oneshot::channel();
        let Some(reply) = crate::runtime::stall_fault::stall(&items, reply, admitted) else {
            return Ok(rx);
        };
        let (reply, admitted) = reply;
        let names: Vec<String> = items.iter().filter_map(Item::send_tensor_name).collect();
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queue.as_ref() else {
            return Err(self.gone());
        };
        self.shared
            .rendezvous
            .announce_all(&names, crate::runtime::rendezvous::MAX_UNPULLED)?;
        let early = if self.shared.in_flight.load(Ordering::SeqCst) > 0 {
            take_ready_sends(&self.shared, &mut items)
        } else {
            Vec::new()
        };
        // A failure held for the stream's next value read: an early read
        // reports it too (see `run_batch`).
        let held = match (&stream, early.is_empty()) {
            (Some(stream), false) => stream.take_held(),
            _ => None,
        };
        if !early.is_empty()
            && stream.is_none()
            && items.iter().all(|item| matches!(item, Item::SentEarly(_)))
        {
            // A unary request of nothing but such sends is answered once they
            // are delivered: its client thread waits for that before it pulls.
            let outputs = vec![ItemOutput::default(); items.len()];
            send_ready_values(Arc::clone(&self.shared), early, None, Some((reply, outputs)));
            return Ok(rx);
        }
        send_ready_values(Arc::clone(&self.shared), early, held, None);
        // Before the batch can reach the context's thread, which forgets each as it applies it.
        let decrefs: Vec<(i64, i32)> = items.iter().filter_map(Item::decref_of).collect();
        self.shared.note_pending_decrefs(&decrefs, true);
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        if queue
            .send(Batch {
                items,
                stream,
                reply,
                _admitted: admitted,
            })
            .is_err()
        {
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.shared.note_pending_decrefs(&decrefs, false);
            for name in &names {
                self.shared
                    .rendezvous
                    .deliver(name, Err(TfError::new(TfCode::FailedPrecondition as i32, "the eager context was closed")));
            }
            return Err(self.gone());
        }
        Ok(rx)
    }

    /// Queues a request and waits for its outputs.
    pub async fn run(&self, items: Vec<Item>) -> Result<Vec<ItemOutput>> {
        let admitted = self.admit().await?;
        let rx = self.submit(items, None, admitted)?;
        rx.await.unwrap_or_else(|_| Err(self.gone()))
    }

    /// Waits for the tensor a `_Send` op of this context sends as `name`.
    pub async fn recv(&self, name: &str, grace: Duration) -> Result<Sent> {
        self.touch();
        self.shared.rendezvous.recv(name, grace).await
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
        drop(lock(&self.shared.reservation).take());
    }
}

impl Drop for EagerJob {
    fn drop(&mut self) {
        self.close("the eager context was closed");
    }
}

/// Whether `item` reports its stream's held failure instead of running: what
/// the client waits for, a sync or a value read (the `_Send` of a tensor it
/// pulls). Not an op with outputs: the client does not wait for one, and an
/// error answered to an op whose later ops are in flight may never reach the
/// script (TensorFlow's client then dropped 2 to 8 of 100 failed checkpoint
/// writes: the next read and sync passed).
fn reports_held_failure(item: &Item) -> bool {
    match item {
        Item::Sync => true,
        Item::Execute(op) => op.send_tensor_name().is_some(),
        _ => false,
    }
}

/// The message a held failure is reported with, by a later call: it names the
/// op that failed, since the call that raises it is another.
fn held_message(item: &Item, err: &Error) -> String {
    let what = match item {
        Item::Execute(op) if op.is_function => format!("function {}", op.name),
        Item::Execute(op) => format!("op {}", op.name),
        other => other.label(),
    };
    let text = err.to_string();
    let named = if text.contains(&what) {
        text
    } else {
        format!("{what}: {text}")
    };
    format!(
        "{named} (reported by this later call: the failed {what} has no outputs, so TensorFlow's \
         client did not wait for it)"
    )
}


fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// The client's tensor handles of one context, by op id.
type HandleTable = HashMap<i64, Vec<Option<TensorHandle>>>;

/// Output `output` of op `op_id`, if it exists and is not released.
fn find_handle(table: &HandleTable, op_id: i64, output: i32) -> Option<&TensorHandle> {
    table
        .get(&op_id)?
        .get(usize::try_from(output).ok()?)?
        .as_ref()
}

fn unknown_handle(context_id: u64, op_id: i64, output: i32) -> Error {
    Error::InvalidArgument(format!(
        "unknown tensor handle {op_id}:{output} in eager context {context_id}: no op with that id produced \
         that output, or the client released it"
    ))
}

/// A `_Send` that can go before the requests queued ahead of it: its value
/// exists already.
struct ReadySend {
    name: String,
    send_id: i64,
    op_id: i64,
    output: i32,
}

/// Takes the `_Send`s of `items` whose input handle exists now, leaving
/// `Item::SentEarly` in their place. Called while the context's thread is
/// busy: a Python callback of the call it runs may be what pulls such a value
/// (a generator yielding a tensor that lives here), and queued, its send would
/// wait for that call, which waits for the callback. A value that exists is
/// the same whenever it is read, so sending it early changes nothing else.
fn take_ready_sends(shared: &Shared, items: &mut [Item]) -> Vec<ReadySend> {
    // Waiting on the table at most for an insert or a take: the context's
    // thread frees nothing and calls no TensorFlow while it writes it.
    let table = read(&shared.handles);
    let pending = lock(&shared.pending_decrefs);
    // Released by this request ahead of the send, or by an earlier one still queued: in order, it fails.
    let mut released: HashSet<(i64, i32)> = HashSet::new();
    let mut ready = Vec::new();
    for item in items.iter_mut() {
        if let Some(handle) = item.decref_of() {
            released.insert(handle);
            continue;
        }
        let Item::Execute(op) = item else { continue };
        let Some(name) = op.send_tensor_name() else {
            continue;
        };
        let [OpInput::Handle { op_id, output }] = op.inputs.as_slice() else {
            continue;
        };
        let handle = (*op_id, *output);
        let exists = find_handle(&table, *op_id, *output).is_some()
            && !released.contains(&handle)
            && !pending.contains_key(&handle);
        if exists {
            ready.push(ReadySend {
                name: name.clone(),
                send_id: op.id,
                op_id: *op_id,
                output: *output,
            });
            *item = Item::SentEarly(name);
        }
    }
    ready
}

/// Delivers `ready`'s values to their pulls off the async runtime (resolving
/// a handle is a TensorFlow call), then answers `reply` if given. A `held`
/// failure goes to the first pull instead of its value.
fn send_ready_values(
    shared: Arc<Shared>,
    ready: Vec<ReadySend>,
    mut held: Option<TfError>,
    reply: Option<(oneshot::Sender<Result<Vec<ItemOutput>>>, Vec<ItemOutput>)>,
) {
    if ready.is_empty() {
        return;
    }
    let work = move || {
        let mut failure = None;
        for send in ready {
            if let Some(held) = held.take() {
                shared.rendezvous.deliver(&send.name, Err(held));
                continue;
            }
            let value = {
                let table = read(&shared.handles);
                find_handle(&table, send.op_id, send.output)
                    .ok_or_else(|| unknown_handle(shared.context_id, send.op_id, send.output))
                    .and_then(|handle| sent(send.send_id, handle))
            };
            let delivered = value.map_err(|err| {
                let failed = err.to_tf_error();
                failure.get_or_insert(err);
                failed
            });
            shared.rendezvous.deliver(&send.name, delivered);
        }
        if let Some((reply, outputs)) = reply {
            let _ = reply.send(match failure {
                Some(err) => Err(err),
                None => Ok(outputs),
            });
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(work)),
        Err(_) => work(),
    }
}

/// What a `_Send` of `handle` (op `op_id`) hands its pull.
fn sent(op_id: i64, handle: &TensorHandle) -> Result<Sent> {
    let tensor = handle
        .resolve()?
        .into_proto()
        .map_err(|e| Error::tensor(format!("_Send {op_id}"), e))?;
    let sent_micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    Ok(Sent {
        tensor,
        sent_micros,
    })
}

impl Shared {
    /// Counts decrefs queued (`queued`) or applied or given up (not `queued`).
    fn note_pending_decrefs(&self, handles: &[(i64, i32)], queued: bool) {
        if handles.is_empty() {
            return;
        }
        let mut pending = lock(&self.pending_decrefs);
        for handle in handles {
            if queued {
                *pending.entry(*handle).or_insert(0) += 1;
            } else if let Some(count) = pending.get_mut(handle) {
                *count -= 1;
                if *count == 0 {
                    pending.remove(handle);
                }
            }
        }
    }

    /// The scheduler's current hints for the job (set at run time by the admin
    /// API), else those it was created with.
    fn current_hints(&self) -> Hints {
        self.sched
            .port
            .job_status(self.id)
            .map(|s| s.hints)
            .unwrap_or_else(|| self.hints.clone())
    }

    fn memory_estimate(&self, hints: &Hints) -> MemoryEstimate {
        MemoryEstimate::new(
            lock(&self.variables).bytes,
            "variables",
            &self.ephemeral_measured,
            hints,
        )
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

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Batch>) {
        while let Ok(batch) = rx.recv() {
            let result = if self.shared.closing.load(Ordering::SeqCst) {
                Err(Error::ContextGone(closed_message(
                    self.shared.context_id,
                    "it was closed before this request ran",
                )))
            } else if batch
                .stream
                .as_ref()
                .is_some_and(|s| s.failed.load(Ordering::SeqCst))
            {
                Err(Error::ContextGone(
                    "an earlier request on this stream failed, so this one was not run".into(),
                ))
            } else {
                self.run_batch(&batch.items, batch.stream.as_deref())
            };
            if let Err(err) = &result {
                if let Some(stream) = &batch.stream {
                    stream.failed.store(true, Ordering::SeqCst);
                }
                self.remember_failure(&batch.items, err);
                tracing::debug!(context = self.shared.context_id, cause = %err, "eager request failed");
            }
            self.shared
                .stats
                .handles
                .store(self.live_handles as u64, Ordering::Relaxed);
            self.shared
                .stats
                .functions
                .store(self.functions.len() as u64, Ordering::Relaxed);
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            let _ = batch.reply.send(result);
            self.fail_unsent_pulls(batch.stream.as_deref());
        }
        // Handles before the context; freed with the table unlocked (see Decref).
        let handles = std::mem::take(&mut *write(&self.shared.handles));
        drop(handles);
        self.live_handles = 0;
    }

    /// Fails the pulls of the sends a failed request did not run. On a stream,
    /// only after the stream's error status went out: the client raises the
    /// pull's error at once and may queue its next request on the same stream,
    /// which, if it has not yet seen the stream end, fails too with the first
    /// error (the stock client then reported one failure twice).
    fn fail_unsent_pulls(&mut self, stream: Option<&StreamState>) {
        if self.unsent.is_empty() {
            return;
        }
        if let Some(stream) = stream {
            stream.wait_until_status_sent(Duration::from_secs(2));
        }
        for (name, message) in self.unsent.drain(..) {
            self.shared.rendezvous.deliver(&name, Err(message));
        }
    }

    /// Records the ops of a failed request (those not run) with the failure
    /// that stopped them.
    fn remember_failure(&mut self, items: &[Item], err: &Error) {
        const KEEP: usize = 4096;
        let cause = match err {
            // Skipped behind an earlier failure: that one is the cause.
            Error::ContextGone(_) => self.last_failure.clone(),
            other => Some(other.to_tf_error()),
        };
        let Some(cause) = cause else { return };
        if self.failed_ops.len() >= KEEP {
            self.failed_ops.clear();
        }
        for item in items {
            let id = match item {
                Item::Execute(op) => op.id,
                Item::SendTensors { op_id, .. } => *op_id,
                _ => continue,
            };
            if !read(&self.shared.handles).contains_key(&id) {
                self.failed_ops.entry(id).or_insert_with(|| cause.clone());
            }
        }
        self.last_failure = Some(cause);
    }

    fn run_batch(
        &mut self,
        items: &[Item],
        stream: Option<&StreamState>,
    ) -> Result<Vec<ItemOutput>> {
        let mut outputs = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let held = stream
                .filter(|_| reports_held_failure(item))
                .and_then(StreamState::take_held);
            let result = match (held, item.send_tensor_name()) {
                // A value read reports it through its pull: the client raises
                // the pull's error (with its code) at the read, and the stream
                // goes on.
                (Some(held), Some(name)) => {
                    self.shared.rendezvous.deliver(&name, Err(held));
                    Ok(ItemOutput::default())
                }
                (Some(held), None) => Err(Error::Tensorflow(held)),
                (None, _) => {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_item(item)))
                        .unwrap_or_else(|_| {
                            Err(Error::Internal("an eager queue item panicked".into()))
                        })
                }
            };
            match result {
                Ok(output) => outputs.push(output),
                Err(err) => {
                    let err = self.in_client_names(err);
                    self.shared.stats.failed.fetch_add(1, Ordering::Relaxed);
                    crate::runtime::run_errors::record(err.code());
                    if let Some(stream) = stream.filter(|_| self.failure_is_silent(items, index)) {
                        tracing::debug!(context = self.shared.context_id, cause = %err,
                                        "an op without outputs failed; its stream's next read or sync reports it");
                        lock(&stream.held).get_or_insert_with(|| {
                            TfError::new(err.code() as i32, held_message(item, &err))
                        });
                        outputs.push(ItemOutput::default());
                        continue;
                    }
                    // A held failure came first: the script hears of it, not
                    // of a later symptom (a table "not initialized").
                    let err = match stream.and_then(StreamState::take_held) {
                        Some(held) => Error::Tensorflow(held),
                        None => err,
                    };
                    // Pulls waiting for sends that will not run now get the
                    // error, once the request's own answer is out (see run).
                    let code = err.code() as i32;
                    for later in &items[index + 1..] {
                        if let Some(name) = later.send_tensor_name() {
                            let why = format!("an earlier item of its request failed: {err}");
                            self.unsent.push((name, TfError::new(code, why)));
                        }
                    }
                    return Err(err);
                }
            }
        }
        Ok(outputs)
    }

    /// Whether item `index`, failed, is the request's last and an op (or
    /// function call) without outputs: nothing after it went unrun, and the
    /// client has no output that could carry its error.
    fn failure_is_silent(&self, items: &[Item], index: usize) -> bool {
        if index + 1 != items.len() {
            return false;
        }
        match &items[index] {
            Item::Execute(op) if op.send_tensor_name().is_none() => {
                if op.is_function {
                    self.functions.get(&op.name).copied().unwrap_or(false)
                } else {
                    op_registry::has_no_outputs(&op.name)
                }
            }
            _ => false,
        }
    }

    fn run_item(&mut self, item: &Item) -> Result<ItemOutput> {
        match item {
            Item::Execute(op) => match op.send_tensor_name() {
                Some(name) => self.send(op, &name).map(|()| ItemOutput::default()),
                None => self.execute(op),
            },
            Item::RegisterFunction {
                function_def,
                library,
            } => {
                // A function refused by the tenant's rules is answered as
                // registered: the stock client registers every function it
                // traces with the server, also those it runs itself (a
                // pipeline that calls Python), and only logs a failed
                // registration. Running it, or an op naming it, is refused
                // with the reason (see `refusal`).
                let mut refused_dependency = None;
                for def in library.iter().chain(std::iter::once(function_def)) {
                    match self.register_function(def) {
                        Ok(()) => {}
                        Err(Error::PermissionDenied(why)) => {
                            refused_dependency.get_or_insert(why);
                        }
                        Err(other) => return Err(other),
                    }
                }
                if let Some(why) = refused_dependency {
                    if let Some(name) = FunctionDefView::decode(function_def.as_ref())
                        .ok()
                        .and_then(|v| v.signature.map(|s| s.name))
                    {
                        self.remember_refused(name, why);
                    }
                }
                Ok(ItemOutput::default())
            }
            Item::SendTensors {
                op_id,
                tensors,
                device,
            } => {
                self.check_new_id(*op_id)?;
                let device = self.local_device(device)?;
                let mut handles = Vec::with_capacity(tensors.len());
                for (i, proto) in tensors.iter().enumerate() {
                    let tensor = Tensor::from_proto(proto, self.shared.max_tensor_bytes)
                        .map_err(|e| Error::tensor(format!("send_tensor {op_id}:{i}"), e))?;
                    handles.push(self.place(TensorHandle::from_tensor(&tensor)?, &device)?);
                }
                self.store(*op_id, handles)?;
                Ok(ItemOutput::default())
            }
            Item::Decref { op_id, output } => {
                // Lenient like a destructor: the outputs of a failed op never existed.
                let released = {
                    let mut handles = write(&self.shared.handles);
                    self.shared.note_pending_decrefs(&[(*op_id, *output)], false);
                    let mut released = None;
                    if let Some(outputs) = handles.get_mut(op_id) {
                        released = usize::try_from(*output)
                            .ok()
                            .and_then(|i| outputs.get_mut(i))
                            .and_then(Option::take);
                        if outputs.iter().all(Option::is_none) {
                            handles.remove(op_id);
                        }
                    }
                    released
                };
                if released.is_some() {
                    self.live_handles -= 1;
                }
                // Freed with the table unlocked: the last handle of a dataset
                // iterator waits for its prefetch thread, whose Python callback
                // may be reading a tensor of this context (an early send, which
                // needs the table).
                drop(released);
                Ok(ItemOutput::default())
            }
            Item::RemoveFunction(name) => {
                self.function_shapes.remove(name);
                if self.functions.remove(name).is_some() && self.ctx.has_function(name) {
                    self.ctx.remove_function(name)?;
                }
                Ok(ItemOutput::default())
            }
            Item::CleanupFunction | Item::Sync | Item::SentEarly(_) => Ok(ItemOutput::default()),
        }
    }

    /// TensorFlow's messages name the context's devices (`/job:localhost/...`);
    /// the client knows them by its own names for the server.
    fn in_client_names(&self, err: Error) -> Error {
        match err {
            Error::Tensorflow(mut e) => {
                e.message = e.message.replace(
                    "/job:localhost/replica:0/task:0",
                    &self.shared.devices.client_prefix(),
                );
                Error::Tensorflow(e)
            }
            other => other,
        }
    }

    fn local_device(&self, device: &str) -> Result<String> {
        self.shared
            .devices
            .to_local(device)
            .map_err(|e| Error::InvalidArgument(e.to_string()))
    }

    /// Host tensors placed on a GPU device when the client asked for one.
    fn place(&self, handle: TensorHandle, device: &str) -> Result<TensorHandle> {
        if device.is_empty() || device.to_ascii_uppercase().contains("CPU") {
            return Ok(handle);
        }
        Ok(handle.copy_to_device(&self.ctx, device)?)
    }

    /// A checkpoint op's path inputs, confined to the job's checkpoint
    /// directory: relative paths are placed in it, a path outside fails the op
    /// with INVALID_ARGUMENT (the rule graph jobs' guards enforce).
    fn confine_checkpoint_paths(&self, op: &OpRequest) -> Result<HashMap<usize, TensorHandle>> {
        let Some(indices) =
            checkpoint_path_inputs(&op.name).filter(|_| self.shared.tenant.confined)
        else {
            return Ok(HashMap::new());
        };
        let dir = self.shared.checkpoint_dir.to_str().ok_or_else(|| {
            Error::Internal(format!(
                "checkpoint directory {:?} is not UTF-8",
                self.shared.checkpoint_dir
            ))
        })?;
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::Internal(format!("cannot create checkpoint directory {dir}: {e}"))
        })?;
        let writes = matches!(
            op.name.as_str(),
            "SaveV2" | "Save" | "SaveSlices" | "MergeV2Checkpoints"
        );
        let mut confined = HashMap::new();
        for &index in indices {
            let index = index as usize;
            let tensor = match op.inputs.get(index) {
                Some(OpInput::Handle { op_id, output }) => {
                    let table = read(&self.shared.handles);
                    self.handle(&table, *op_id, *output)?.resolve()?
                }
                Some(OpInput::Tensor(proto)) => {
                    Tensor::from_proto(proto, self.shared.max_tensor_bytes).map_err(|e| {
                        Error::tensor(format!("path input {index} of {}", op.name), e)
                    })?
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "{} needs a path as input {index}",
                        op.name
                    )));
                }
            };
            if tensor.dtype_raw() != DataType::DtString as i32 {
                return Err(Error::InvalidArgument(format!(
                    "input {index} of {} must be a string path",
                    op.name
                )));
            }
            let paths = tensor
                .strings()
                .iter()
                .map(|raw| {
                    let path = String::from_utf8_lossy(raw);
                    let confined = checkpoint_guard::confined_path(dir, &path).ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "checkpoint path {path:?} is outside this job's checkpoint directory {dir} \
                             (relative paths are placed in it)"
                        ))
                    })?;
                    if writes {
                        // The client would have made the prefix's directory on its
                        // own machine; here it is made inside the job's directory.
                        if let Some(parent) = std::path::Path::new(&confined).parent() {
                            std::fs::create_dir_all(parent).map_err(|e| {
                                Error::Internal(format!("cannot create checkpoint directory {parent:?}: {e}"))
                            })?;
                        }
                    }
                    Ok(Bytes::from(confined))
                })
                .collect::<Result<Vec<_>>>()?;
            let proto = TensorProto {
                dtype: DataType::DtString as i32,
                tensor_shape: Some(shape_proto(tensor.dims())),
                string_val: paths,
                ..Default::default()
            };
            let tensor = Tensor::from_proto(&proto, self.shared.max_tensor_bytes.max(1 << 20))
                .map_err(|e| Error::tensor(format!("path input {index} of {}", op.name), e))?;
            confined.insert(index, TensorHandle::from_tensor(&tensor)?);
        }
        Ok(confined)
    }

    /// Keeps an op's outputs as the client's handles `op_id:0..n`, within the
    /// per-context limit (`--max-context-handles`).
    fn store(&mut self, op_id: i64, outputs: Vec<TensorHandle>) -> Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        let max = self.shared.tenant.max_context_handles;
        if self.live_handles + outputs.len() > max {
            return Err(Error::ResourceExhausted(format!(
                "eager context {} already holds {} tensor handles; this server allows {max} per context \
                 (--max-context-handles)",
                self.shared.context_id, self.live_handles
            )));
        }
        self.live_handles += outputs.len();
        self.failed_ops.remove(&op_id);
        write(&self.shared.handles).insert(op_id, outputs.into_iter().map(Some).collect());
        Ok(())
    }

    fn check_new_id(&self, op_id: i64) -> Result<()> {
        if read(&self.shared.handles).contains_key(&op_id) {
            return Err(Error::InvalidArgument(format!(
                "operation id {op_id} is already in use in eager context {}: every op and send_tensor needs a new id",
                self.shared.context_id
            )));
        }
        Ok(())
    }

    /// Handle `op_id:output` of `table` (a read guard of `Shared::handles`).
    fn handle<'t>(
        &self,
        table: &'t HandleTable,
        op_id: i64,
        output: i32,
    ) -> Result<&'t TensorHandle> {
        if let Some(cause) = self.failed_ops.get(&op_id) {
            return Err(Error::Tensorflow(TfError::new(
                cause.code,
                format!(
                    "{} (tensor handle {op_id}:{output} was not produced because of it)",
                    cause.message
                ),
            )));
        }
        find_handle(table, op_id, output)
            .ok_or_else(|| unknown_handle(self.shared.context_id, op_id, output))
    }

    fn execute(&mut self, op: &OpRequest) -> Result<ItemOutput> {
        if matches!(op.name.as_str(), "_Recv" | "_HostRecv") {
            return Err(Error::Unimplemented(format!(
                "{} ops pull tensors from the client's devices, which the Salus server cannot reach; \
                 the client sends tensors with send_tensor instead",
                op.name
            )));
        }
        // Also for function calls: TensorFlow resolves a name to a primitive op
        // before a function, so a function named like a refused op is that op.
        self.shared.tenant.check_eager_op(&op.name)?;
        if let Some(refusal) = self.refusal(op) {
            return Err(refusal);
        }
        self.check_new_id(op.id)?;
        let device = self.local_device(&op.device)?;
        let mut inline = Vec::new();
        for input in &op.inputs {
            if let OpInput::Tensor(proto) = input {
                let tensor =
                    Tensor::from_proto(proto, self.shared.max_tensor_bytes).map_err(|e| {
                        Error::tensor(format!("input of op {} ({})", op.id, op.name), e)
                    })?;
                inline.push(self.place(TensorHandle::from_tensor(&tensor)?, &device)?);
            }
        }
        let confined = self.confine_checkpoint_paths(op)?;
        let mut inline_iter = inline.iter();
        // Held while the op runs (its inputs borrow the table); early sends
        // read it meanwhile, and nothing writes it until the op is done.
        let shared = Arc::clone(&self.shared);
        let table = read(&shared.handles);
        let mut inputs = Vec::with_capacity(op.inputs.len());
        for (index, input) in op.inputs.iter().enumerate() {
            if let Some(path) = confined.get(&index) {
                if matches!(input, OpInput::Tensor(_)) {
                    inline_iter.next(); // the client's path, replaced
                }
                inputs.push(path);
                continue;
            }
            match input {
                OpInput::Handle { op_id, output } => {
                    inputs.push(self.handle(&table, *op_id, *output)?)
                }
                OpInput::Tensor(_) => inputs.extend(inline_iter.next()),
            }
        }
        let attrs: Vec<(&str, &[u8])> = op
            .attrs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_ref()))
            .collect();
        let is_call = op.is_function || self.functions.contains_key(&op.name);
        let profile = if is_call {
            self.profiles.get(&op.name).copied().unwrap_or_default()
        } else {
            RunProfile::default()
        };
        if is_call && self.shared.sched.draining.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let class = if is_call {
            let class = profile.classify(
                self.shared.sched.cheap_below.as_nanos() as f64,
                op.name.contains(MAIN_MARKER),
            );
            self.shared.sched.port.resolve(self.shared.id, class)
        } else {
            RunClass::Cheap
        };
        // A main iteration waits for memory (first time) and for its turn on
        // the lane; the turn ends when this call has run.
        let _turn = match class {
            RunClass::Cheap | RunClass::Brief => None,
            RunClass::Main => {
                if self.shared.history.first_main() {
                    let shape = self.function_shapes.get(&op.name).copied();
                    self.shared.sched.port.set_fingerprint(
                        self.shared.id,
                        &shape.unwrap_or_default().fingerprint('f'),
                    );
                }
                self.admit()?;
                Some(self.wait_for_turn()?)
            }
        };
        let sample = is_call
            && self.shared.sched.measure_memory
            && (MEMORY_SAMPLE_RUNS.contains(&(profile.runs + 1))
                || self.pending_samples.contains(&op.name));
        let trace_turn = if sample {
            memory_profile::TRACE_TURN.try_lock().ok()
        } else {
            None
        };
        // A sample that another job's held the turn from is taken at the
        // function's next call (as graph jobs do), not dropped.
        if sample && trace_turn.is_none() {
            self.pending_samples.insert(op.name.clone());
        } else if trace_turn.is_some() {
            self.pending_samples.remove(&op.name);
        }
        // A sample reads the device allocator's peak where it keeps one (a GPU,
        // TensorFlow's CPU allocator), else the heap's rise.
        let allocator = if trace_turn.is_some() {
            self.device_allocator(&device)
        } else {
            None
        };
        let started = Instant::now();
        let run = || {
            self.ctx.execute(
                &op.name,
                &device,
                &inputs,
                &attrs,
                &mut self.slots.borrow_mut(),
            )
        };
        let (executed, sample) = if trace_turn.is_some() {
            // The heap counts too where the device's memory is the host's.
            let heap = allocator.is_none_or(|a| a.on_host());
            let (executed, sample) = memory_profile::measure(allocator, heap, run);
            (executed, Some(sample))
        } else {
            (run(), None)
        };
        let ended = Instant::now();
        let elapsed = ended.duration_since(started);
        // Single ops are not runs (nor counted like them: they would take the
        // executor's lock on every op); a function call that went at once is
        // (`resolve` turned a brief one into Cheap or Main).
        if is_call && class == RunClass::Cheap {
            self.shared
                .sched
                .port
                .record_cheap_run(self.shared.id, started, ended);
        }
        drop(inputs);
        drop(table);
        drop(_turn);
        drop(trace_turn);
        if let (Some(sample), true) = (sample, executed.is_ok()) {
            self.record_memory_sample(&op.name, &sample);
        }
        if is_call {
            self.profiles
                .entry(op.name.clone())
                .or_default()
                .record(elapsed.as_nanos() as f64);
        }
        if class == RunClass::Main {
            let failed = executed.as_ref().err().map(|e| {
                salus_proto::tensorflow::error::Code::try_from(e.code)
                    .unwrap_or(salus_proto::tensorflow::error::Code::Unknown)
            });
            self.shared.history.main_ended(failed);
        }
        let outputs = match executed {
            Ok(outputs) => outputs,
            Err(err) => {
                if is_call
                    && err.code == salus_proto::tensorflow::error::Code::ResourceExhausted as i32
                {
                    let raised = ephemeral_after_oom(
                        self.shared.ephemeral_measured.bytes(),
                        lock(&self.shared.variables).bytes,
                    );
                    self.shared
                        .ephemeral_measured
                        .record(raised, MemoryMeter::OutOfMemory);
                    tracing::warn!(
                        job = self.shared.id.0,
                        ephemeral = raised,
                        "function call ran out of memory; estimate raised"
                    );
                }
                return Err(err.into());
            }
        };
        if op.name == "VarHandleOp" {
            self.record_variable(op);
        }
        let mut result = ItemOutput::default();
        for output in &outputs {
            result.shapes.push(output.dims()?);
            if op.is_function {
                result
                    .devices
                    .push(self.shared.devices.to_client(&output.device_name()?));
            }
        }
        self.store(op.id, outputs)?;
        self.shared.stats.ops.fetch_add(1, Ordering::Relaxed);
        if op.is_function {
            self.shared
                .stats
                .function_calls
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(result)
    }

    /// Gives the job a memory lane before its first main iteration (memory
    /// admission on); waits while memory is short, up to the admission timeout.
    fn admit(&self) -> Result<()> {
        let Some(admission) = &self.shared.sched.admission else {
            return Ok(());
        };
        if lock(&self.shared.reservation).is_some() {
            return Ok(());
        }
        let hints = self.shared.current_hints();
        let need = self.shared.memory_estimate(&hints).need;
        let reservation = self.shared.sched.runtime.block_on(admission.admit(
            self.shared.id,
            need,
            self.shared.sched.gpu_lane,
            hints,
        ))?;
        *lock(&self.shared.reservation) = Some(reservation);
        Ok(())
    }

    /// Queues a main iteration with the scheduler and waits, on this job's
    /// thread, until it is this job's turn; the call runs here while the
    /// returned turn is held (see [`SchedPort::wait_turn`]).
    fn wait_for_turn(&self) -> Result<MainTurn> {
        self.shared.sched.port.wait_turn(self.shared.id, None)
    }

    /// What the sampled call just run took at its peak (its outputs
    /// included), as the job's ephemeral need: the device allocator's rise,
    /// and on the host the heap's if larger (TensorFlow 2.21 keeps no memory
    /// records for eager calls; see `memory_profile::Sample`).
    fn record_memory_sample(&self, function: &str, sample: &Sample) {
        tracing::debug!(
            job = self.shared.id.0,
            function,
            allocator = ?sample.allocator,
            host = ?sample.host,
            "sampled a function call's memory"
        );
        self.shared.ephemeral_measured.record_sample(sample, 0);
    }

    /// The allocator of `device` (the call's; empty: the context's default),
    /// when it keeps statistics; looked up once per device.
    fn device_allocator(&mut self, device: &str) -> Option<DeviceAllocator> {
        if let Some(found) = self.allocators.get(device) {
            return *found;
        }
        let found = DeviceAllocator::of_eager(&self.ctx, device).filter(|a| a.stats().is_some());
        self.allocators.insert(device.to_string(), found);
        found
    }

    /// A variable the client created: its declared size is persistent memory.
    fn record_variable(&self, op: &OpRequest) {
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
        let size = variable_bytes(&node);
        let mut variables = lock(&self.shared.variables);
        variables.variables += 1;
        match size.flatten() {
            Some(bytes) => variables.bytes = variables.bytes.saturating_add(bytes),
            None => variables.unknown += 1,
        }
    }

    /// A `_Send` op: its input's value goes to the pull waiting for `name`.
    fn send(&self, op: &OpRequest, name: &str) -> Result<()> {
        let value = self.sent_value(op);
        let delivered = match &value {
            Ok(sent) => Ok(sent.clone()),
            Err(err) => Err(err.to_tf_error()),
        };
        self.shared.rendezvous.deliver(name, delivered);
        value.map(|_| ())
    }

    fn sent_value(&self, op: &OpRequest) -> Result<Sent> {
        let table = read(&self.shared.handles);
        let handle = match op.inputs.as_slice() {
            [OpInput::Handle { op_id, output }] => self.handle(&table, *op_id, *output)?,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "_Send op {} needs exactly one input, a tensor handle of this context",
                    op.id
                )))
            }
        };
        sent(op.id, handle)
    }

    fn remember_refused(&mut self, function: String, why: String) {
        // Bounded: a client that keeps registering refused functions only
        // loses the better message.
        if self.refused.len() < 1024 {
            self.refused.entry(function).or_insert(why);
        }
    }

    /// Why `op` may not run: it calls a function refused at registration, or
    /// names one in an attribute (a dataset op's `f`).
    fn refusal(&self, op: &OpRequest) -> Option<Error> {
        if self.refused.is_empty() {
            return None;
        }
        if let Some(why) = self.refused.get(&op.name) {
            return Some(Error::PermissionDenied(format!(
                "function {:?} was refused when registered: {why}",
                op.name
            )));
        }
        op.attrs.iter().find_map(|(attr, value)| {
            let functions = match AttrValue::decode(value.as_ref()).ok()?.value? {
                attr_value::Value::Func(f) => vec![f.name],
                attr_value::Value::List(list) => list.func.into_iter().map(|f| f.name).collect(),
                _ => return None,
            };
            functions.into_iter().find_map(|name| {
                let why = self.refused.get(&name)?;
                Some(Error::PermissionDenied(format!(
                    "op {} names function {name:?} (attribute {attr}), which was refused when \
                     registered: {why}",
                    op.name
                )))
            })
        })
    }

    /// Registers a FunctionDef with its nodes' devices mapped to this context.
    fn register_function(&mut self, def: &[u8]) -> Result<()> {
        let function = match map_function(def, &self.shared.devices, &self.shared.tenant) {
            Ok(function) => function,
            Err(FunctionRefusal::Refused { name, error }) => {
                self.remember_refused(name, error.to_string());
                return Err(error);
            }
            Err(FunctionRefusal::Malformed(error)) => return Err(error),
        };
        let max = self.shared.tenant.max_context_functions;
        if !self.functions.contains_key(&function.name) && self.functions.len() >= max {
            return Err(Error::ResourceExhausted(format!(
                "eager context {} already has {max} functions registered, the most this server allows per \
                 context (--max-context-functions)",
                self.shared.context_id
            )));
        }
        self.ctx.add_function(&function.mapped).map_err(|e| {
            Error::InvalidArgument(format!(
                "function {:?} was refused: {}",
                function.name, e.message
            ))
        })?;
        self.function_shapes
            .insert(function.name.clone(), function.shape);
        self.functions
            .insert(function.name, function.without_outputs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_context_admits_a_bounded_number_of_requests_until_one_has_run() {
        let bound = BatchBound::new(3);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(bound.admit().await.expect("room"));
        }
        assert_eq!(bound.in_flight(3), 3);
        // The fourth waits: its stream is not read further.
        let fourth = tokio::time::timeout(Duration::from_millis(50), bound.admit()).await;
        assert!(fourth.is_err(), "a request beyond the bound waits");
        // One has run: the next is admitted.
        held.pop();
        let fourth = tokio::time::timeout(Duration::from_secs(5), bound.admit()).await;
        assert!(fourth.expect("admitted once one ran").is_some());
    }

    #[tokio::test]
    async fn closing_the_context_wakes_requests_waiting_for_room() {
        let bound = Arc::new(BatchBound::new(1));
        let _held = bound.admit().await.expect("room");
        let waiting = tokio::spawn({
            let bound = bound.clone();
            async move { bound.admit().await.is_none() }
        });
        tokio::task::yield_now().await;
        bound.close();
        assert!(waiting.await.unwrap(), "a closed context admits nothing");
        assert!(bound.admit().await.is_none());
    }
}
