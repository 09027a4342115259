//! One client session (= one Salus job): its TensorFlow graph and session, graph
//! version, callables and partial runs. Every method that touches TensorFlow
//! blocks; the master service calls them on executor threads.
//!
//! # Main and cheap runs
//! Every RunStep/RunCallable is classified without any client change:
//! - a run that fetches or targets a node named `salus_main_iter` (Salus's
//!   explicit marker, also under a name scope) is a **main** iteration;
//! - otherwise a run is **cheap** while its signature ([`RunKey`]: the same
//!   feeds, fetches and targets, or the same callable) has run fewer than
//!   [`WARMUP_RUNS`] times (initializers, setup), and **brief** while its
//!   measured mean time is below the `--cheap-below` threshold;
//! - every other run (a repeated, non-trivial step) is a **main** iteration.
//!
//! Main iterations go through the scheduler; cheap runs run at once and are
//! never held behind another job's long iteration; brief runs run at once
//! unless a job the policy ranks ahead has an iteration queued
//! ([`crate::runtime::executor::Executor::resolve`]).

use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use salus_proto::tensorflow::{CallableOptions, DataType, TensorProto};
use tensorflow_sys as sys;

use crate::sync::lock;
use crate::error::{Error, Result};
use crate::runtime::graph_delta::{check_delta, CheckedDelta, VariableBytes};
use crate::runtime::job_history::{HistoryFacts, ShapeHash};
use crate::runtime::job_memory::JobMemory;
use crate::runtime::main_iteration::IteratingJob;
use crate::runtime::memory_profile::{self, MemoryMeter, SampleTurn};
use crate::runtime::run_errors::{self, TfCode};
use crate::runtime::session_config::GpuLanes;
use crate::wire;
use crate::sched::{Hints, JobId, LaneId};
use crate::tenant::checkpoint_guard;
use crate::tenant::TenantRules;
use crate::tf::allocator::DeviceAllocator;
use crate::tf::{self, Graph, Operation, PartialRunHandle, Session, Tensor};

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

/// An output of an operation ("name:index"), resolved against the graph.
#[derive(Clone, Copy, Debug)]
pub struct Port {
    op: Operation,
    index: i32,
}

impl Port {
    fn tf(self) -> sys::TF_Output {
        self.op.output(self.index)
    }
}

/// A feed: a resolved port with the tensor to feed there.
pub struct Feed {
    pub name: String,
    pub port: Port,
    pub tensor: Tensor,
}

/// What a callable runs (MakeCallable), resolved once.
struct Callable {
    /// Fetch and target names, for classification.
    names: Vec<String>,
    feeds: Vec<(String, Port)>,
    fetches: Vec<Port>,
    targets: Vec<Operation>,
    run_options: Bytes,
}

/// A partial run in progress and what it has still to produce.
struct PartialRun {
    handle: PartialRunHandle,
    pending_fetches: HashSet<String>,
    pending_targets: HashSet<String>,
}

/// Identifies a repeated run of a job: the same feeds, fetches and targets
/// (RunStep), or the same callable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunKey(u64);

impl RunKey {
    pub fn of_step(feeds: &[&str], fetches: &[String], targets: &[String]) -> RunKey {
        let mut h = DefaultHasher::new();
        ("step", feeds, fetches, targets).hash(&mut h);
        RunKey(h.finish())
    }

    pub fn of_callable(handle: i64) -> RunKey {
        let mut h = DefaultHasher::new();
        ("callable", handle).hash(&mut h);
        RunKey(h.finish())
    }
}

use crate::runtime::run_class::sample_due;
pub use crate::runtime::run_class::{
    MemoryEstimate, RunClass, RunProfile, MAIN_MARKER, WARMUP_RUNS,
};

/// The node a fetch or target names ("^name", "name:1" -> "name").
fn node_name(name: &str) -> &str {
    let op = name.trim_start_matches('^');
    op.split_once(':').map_or(op, |(op, _)| op)
}

fn is_marker(name: &str) -> bool {
    let op = node_name(name);
    op == MAIN_MARKER || op.ends_with(&format!("/{MAIN_MARKER}"))
}

/// RunOptions field `trace_level`, and FULL_TRACE (needed for memory records).
/// Callables one session may hold: MakeCallable beyond it is
/// RESOURCE_EXHAUSTED until the client releases some (a client cannot grow the
/// server by making callables it never releases).
pub const MAX_CALLABLES: usize = 10_000;

/// Partial runs one session may have set up and not finished (each holds
/// TensorFlow's executors for its steps to come).
pub const MAX_PARTIAL_RUNS: usize = 1_000;

/// RESOURCE_EXHAUSTED when a session already holds `max` of `what`.
fn has_room(held: usize, max: usize, what: &str, free: &str) -> Result<()> {
    if held < max {
        return Ok(());
    }
    Err(Error::ResourceExhausted(format!(
        "this session holds {held} {what} (at most {max}): {free} before making more"
    )))
}

const TRACE_LEVEL_FIELD: u64 = 1;
const FULL_TRACE: u64 = 3;

/// RunOptions field `inter_op_thread_pool`; -1 runs on the caller's thread.
const INTER_OP_THREAD_POOL_FIELD: u64 = 3;

/// `run_options` with `inter_op_thread_pool = -1` unless the client set a pool.
fn on_caller_thread(run_options: &[u8]) -> Result<Vec<u8>> {
    let mut options = run_options.to_vec();
    if !wire::has_field(run_options, INTER_OP_THREAD_POOL_FIELD)? {
        wire::write_varint(&mut options, INTER_OP_THREAD_POOL_FIELD << 3);
        wire::write_varint(&mut options, -1i64 as u64);
    }
    Ok(options)
}

/// Counters shown by the admin API.
#[derive(Default)]
pub struct JobStats {
    pub runs_completed: AtomicU64,
    pub runs_failed: AtomicU64,
}

pub struct Job {
    pub id: JobId,
    pub handle: String,
    /// Hints given at creation (the scheduler keeps the current ones).
    pub hints: Hints,
    /// Client-given name (ConfigProto.experimental.session_metadata.name).
    pub name: String,
    session: Session,
    /// Graph version; held while a delta is checked and imported so versions and
    /// node names stay consistent.
    graph_version: Mutex<i64>,
    callables: Mutex<HashMap<i64, Arc<Callable>>>,
    next_callable: AtomicI64,
    partial_runs: Mutex<HashMap<String, PartialRun>>,
    next_partial_run: AtomicU64,
    /// Stateful nodes and their resource container, for Reset.
    containers: Mutex<Vec<(String, String)>>,
    run_profiles: Mutex<HashMap<RunKey, RunProfile>>,
    /// The graph's nodes that feed a queue (`graph_delta::FEEDING_OPS`).
    feeding_nodes: Mutex<HashSet<String>>,
    inline_below_ns: f64,
    cheap_below_ns: f64,
    max_tensor_bytes: u64,
    pub stats: JobStats,
    /// Whether runs are traced to measure per-iteration memory (admission on).
    measure_memory: bool,
    /// Its variables, measured per-iteration memory (run peak + feeds), and
    /// memory lane once admitted; with `--gpu-lanes`, the lane whose virtual
    /// GPU the graph is placed on, chosen at CreateSession because TensorFlow
    /// places a session's nodes only once.
    memory: JobMemory,
    /// The allocator of the job's device, when it keeps statistics.
    allocator: OnceLock<Option<DeviceAllocator>>,
    /// A memory sample was due but another job was tracing: take it next run.
    sample_pending: AtomicBool,
    /// What the job's graphs may do; its checkpoint directory.
    rules: Arc<TenantRules>,
    checkpoint_dir: PathBuf,
    /// Set when a graph was imported but could not be confined: the job must
    /// not run anything any more.
    unusable: Mutex<Option<String>>,
    pub created: Instant,
    /// Milliseconds since `created` of the last request.
    last_active_ms: AtomicU64,
    /// Requests of this job being served now (a run may wait for memory or a
    /// lane for longer than the idle timeout; it is not idle).
    in_flight: AtomicU64,
    /// The graph's nodes, hashed: its fingerprint in the job history.
    shape: Mutex<ShapeHash>,
    /// What the job history learns of this job.
    pub history: HistoryFacts,
}

/// A request in progress; see [`Job::busy`].
pub struct Busy<'a>(&'a Job);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Locks a std mutex; a poisoned lock (a panic elsewhere) still yields the data,
/// since every critical section here leaves it consistent.
/// Reroutes the path inputs of a delta's checkpoint ops (just imported, never
/// run) through guards confining them to `dir`.
fn confine_checkpoints(graph: &Graph, delta: &CheckedDelta, dir: &std::path::Path) -> Result<()> {
    for (name, op) in &delta.checkpoint_nodes {
        let node = graph
            .operation(name)
            .ok_or_else(|| Error::Internal(format!("imported node {name:?} is missing")))?;
        checkpoint_guard::confine(graph, node, name, op, dir)?;
    }
    Ok(())
}


impl Job {
    /// Builds the graph from `graph_def` (may be empty) and opens a TF session
    /// with `config` (a serialized ConfigProto). With `gpu_lane`, nodes the
    /// client left unplaced go to that lane's virtual GPU.
    pub fn create(
        id: JobId,
        handle: String,
        hints: Hints,
        graph_def: &[u8],
        config: &[u8],
        settings: JobSettings,
        gpu_lane: Option<LaneId>,
        rules: Arc<TenantRules>,
    ) -> Result<Job> {
        let graph = Arc::new(Graph::new());
        let mut containers = Vec::new();
        let mut feeding_nodes = HashSet::new();
        let mut variables = VariableBytes::default();
        let mut shape = ShapeHash::default();
        let device = gpu_lane.map(|lane| GpuLanes::device(lane.0));
        let checkpoint_dir = rules.checkpoints.dir_for(&hints.name, id);
        if !graph_def.is_empty() {
            let delta = check_delta(graph_def, &graph)?;
            rules.check_graph(graph_def.len(), &delta.ops, &delta.library_ops)?;
            graph.import(graph_def, &delta.mappings, device.as_deref())?;
            if rules.confined {
                confine_checkpoints(&graph, &delta, &checkpoint_dir)?;
            }
            containers = delta.containers;
            feeding_nodes.extend(delta.feeding_nodes);
            variables = delta.variables;
            shape = delta.shape;
        }
        let session = Session::new(graph, config)?;
        Ok(Job {
            id,
            handle,
            name: hints.name.clone(),
            hints,
            session,
            graph_version: Mutex::new(0),
            callables: Mutex::new(HashMap::new()),
            next_callable: AtomicI64::new(0),
            partial_runs: Mutex::new(HashMap::new()),
            next_partial_run: AtomicU64::new(0),
            containers: Mutex::new(containers),
            run_profiles: Mutex::new(HashMap::new()),
            feeding_nodes: Mutex::new(feeding_nodes),
            inline_below_ns: settings.inline_below.as_nanos() as f64,
            cheap_below_ns: settings.cheap_below.as_nanos() as f64,
            max_tensor_bytes: settings.max_tensor_bytes,
            stats: JobStats::default(),
            measure_memory: settings.measure_memory,
            memory: JobMemory::new("graph", variables, gpu_lane),
            allocator: OnceLock::new(),
            sample_pending: AtomicBool::new(false),
            rules,
            checkpoint_dir,
            unusable: Mutex::new(None),
            created: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            shape: Mutex::new(shape),
            history: HistoryFacts::default(),
        })
    }

    pub fn touch(&self) {
        self.last_active_ms
            .store(self.created.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Marks a request in progress until the guard drops.
    pub fn busy(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self)
    }

    /// Whether any request of the job is being served.
    pub fn is_busy(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) > 0
    }

    pub fn idle_seconds(&self) -> f64 {
        let last = self.last_active_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        (self.created.elapsed().as_secs_f64() - last).max(0.0)
    }

    /// The job's memory need with Salus's margins (+10% persistent, +5%
    /// ephemeral), and where each figure comes from. Hints override; without a
    /// measurement yet, the ephemeral need defaults to the persistent one.
    pub fn memory_estimate(&self, hints: &Hints) -> MemoryEstimate {
        self.memory.estimate(hints)
    }

    /// The job's lane, once admitted.
    /// The fingerprint of the job's graph as it is now.
    pub fn fingerprint(&self) -> String {
        lock(&self.shape).fingerprint('g')
    }

    pub fn lane(&self) -> Option<LaneId> {
        self.memory.lane()
    }

    /// What the main iteration needs of the job.
    pub fn iterating(&self) -> IteratingJob<'_> {
        IteratingJob::new(self.id, &self.hints, &self.memory, &self.history)
    }

    /// Fails when an earlier graph could not be confined (see `unusable`).
    fn usable(&self) -> Result<()> {
        match &*lock(&self.unusable) {
            None => Ok(()),
            Some(why) => Err(Error::FailedPrecondition(format!(
                "this session can no longer run: its checkpoint ops could not be confined ({why}); \
                 close it and create a new one"
            ))),
        }
    }

    /// Where the job's checkpoint ops write.
    pub fn checkpoint_dir(&self) -> &std::path::Path {
        &self.checkpoint_dir
    }

    /// GPU lanes: the lane the job's graph is placed on (admission waits for it).
    pub fn gpu_lane(&self) -> Option<LaneId> {
        self.memory.gpu_lane()
    }


    /// The allocator of the device the job's graph runs on (its GPU lane's,
    /// else the session's default: the first GPU, else the CPU), when it keeps
    /// statistics; looked up once.
    fn device_allocator(&self) -> Option<DeviceAllocator> {
        *self.allocator.get_or_init(|| {
            let device = self
                .gpu_lane()
                .map(|lane| GpuLanes::device(lane.0))
                .unwrap_or_default();
            DeviceAllocator::of_session(&self.session, &device).filter(|a| a.stats().is_some())
        })
    }

    /// Persistent memory the job's variables declare (optimizer slots included).
    pub fn variable_bytes(&self) -> VariableBytes {
        self.memory.variables()
    }

    pub fn graph_version(&self) -> i64 {
        *lock(&self.graph_version)
    }

    pub fn graph_nodes(&self) -> usize {
        self.session.graph().num_operations()
    }

    /// ExtendSession: imports a delta whose nodes may reference existing ones.
    pub fn extend(&self, graph_def: &[u8], current_version: i64) -> Result<i64> {
        let mut version = lock(&self.graph_version);
        if *version != current_version {
            return Err(Error::GraphVersion {
                handle: self.handle.clone(),
                current: *version,
                requested: current_version,
            });
        }
        let graph = self.session.graph();
        let delta = check_delta(graph_def, graph)?;
        self.rules.check_graph(graph_def.len(), &delta.ops, &delta.library_ops)?;
        let device = self.gpu_lane().map(|lane| GpuLanes::device(lane.0));
        graph.import(graph_def, &delta.mappings, device.as_deref())?;
        let confined = if self.rules.confined {
            confine_checkpoints(graph, &delta, &self.checkpoint_dir)
        } else {
            Ok(())
        };
        if let Err(err) = confined {
            *lock(&self.unusable) = Some(err.to_string());
            return Err(err);
        }
        lock(&self.containers).extend(delta.containers);
        lock(&self.feeding_nodes).extend(delta.feeding_nodes);
        self.memory.add_variables(delta.variables);
        lock(&self.shape).merge(delta.shape);
        *version += 1;
        Ok(*version)
    }

    /// Destroys the resources (resource variables, tables, queues, iterators, ...)
    /// this job keeps in `containers` (an empty list: the default container, as
    /// TensorFlow's Reset). The session stays open; reading a destroyed variable
    /// afterwards fails as uninitialised. Returns the nodes whose state could not
    /// be destroyed: reference-typed state (VariableV2) has no destroy op.
    pub fn reset_containers(&self, containers: &[String]) -> Result<Vec<String>> {
        let wanted = |c: &str| {
            if containers.is_empty() {
                c.is_empty()
            } else {
                containers.iter().any(|w| w == c)
            }
        };
        let graph = self.session.graph();
        let mut destroy = Vec::new();
        let mut kept = Vec::new();
        for (node, _) in lock(&self.containers).iter().filter(|(_, c)| wanted(c)) {
            let Some(op) = graph.operation(node) else {
                continue;
            };
            if op.num_outputs() > 0 && op.output_type_raw(0) == DataType::DtResource as i32 {
                destroy.push(graph.destroy_resource_op(&format!("salus_reset/{node}"), op)?);
            } else {
                kept.push(node.clone());
            }
        }
        if !destroy.is_empty() {
            self.session.run(&[], false, &[], &[], &destroy)?;
        }
        Ok(kept)
    }

    /// Resolves "name" or "name:index" to an operation output.
    pub fn port(&self, name: &str, role: &str) -> Result<Port> {
        let (op_name, index) = match name.rsplit_once(':') {
            Some((op, idx)) => match idx.parse::<i32>() {
                Ok(i) => (op, i),
                Err(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "{role} {name:?} is not of the form name:index"
                    )))
                }
            },
            None => (name, 0),
        };
        let op = self.session.graph().operation(op_name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{role} {name:?} names no operation in the session's graph"
            ))
        })?;
        if index < 0 || index >= op.num_outputs() {
            return Err(Error::InvalidArgument(format!(
                "{role} {name:?}: operation {op_name:?} has {} outputs",
                op.num_outputs()
            )));
        }
        Ok(Port { op, index })
    }

    /// Resolves a target operation name ("name", or "name:0" as some clients send).
    pub fn target(&self, name: &str) -> Result<Operation> {
        let op_name = name.strip_prefix('^').unwrap_or(name);
        let op_name = op_name.split_once(':').map_or(op_name, |(op, _)| op);
        self.session.graph().operation(op_name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "target {name:?} names no operation in the session's graph"
            ))
        })
    }

    /// Converts wire feeds into tensors at resolved ports.
    pub fn feeds<'a>(
        &self,
        feeds: impl IntoIterator<Item = (&'a str, Option<&'a TensorProto>)>,
    ) -> Result<Vec<Feed>> {
        feeds
            .into_iter()
            .map(|(name, proto)| {
                let port = self.port(name, "feed")?;
                let proto = proto.ok_or_else(|| {
                    Error::InvalidArgument(format!("feed {name:?} carries no tensor"))
                })?;
                let tensor = Tensor::from_proto(proto, self.max_tensor_bytes)
                    .map_err(|e| Error::tensor(name, e))?;
                Ok(Feed {
                    name: name.to_string(),
                    port,
                    tensor,
                })
            })
            .collect()
    }

    /// Main iteration or cheap run (see the module doc); `names` are the run's
    /// fetches and targets. A run that feeds a queue (a fetch or target is an
    /// enqueue node) is always cheap: it is a TF1 script's input pipeline.
    pub fn classify<'a>(&self, key: RunKey, names: impl Iterator<Item = &'a str> + Clone) -> RunClass {
        let marked = names.clone().any(is_marker);
        if !marked && self.feeds_a_queue(names) {
            return RunClass::Cheap;
        }
        self.profile(key).classify(self.cheap_below_ns, marked)
    }

    fn feeds_a_queue<'a>(&self, mut names: impl Iterator<Item = &'a str>) -> bool {
        let feeding = lock(&self.feeding_nodes);
        !feeding.is_empty() && names.any(|name| feeding.contains(node_name(name)))
    }

    /// Classifies a RunCallable.
    pub fn classify_callable(&self, handle: i64) -> RunClass {
        let names: Vec<String> = match lock(&self.callables).get(&handle) {
            Some(c) => c.names.clone(),
            None => return RunClass::Cheap,
        };
        self.classify(
            RunKey::of_callable(handle),
            names.iter().map(String::as_str),
        )
    }

    /// The measured profile of runs like `key`.
    pub fn profile(&self, key: RunKey) -> RunProfile {
        lock(&self.run_profiles)
            .get(&key)
            .copied()
            .unwrap_or_default()
    }

    /// One full run (RunStep / RunCallable body). Runs of a key measured faster
    /// than the inline threshold execute on this thread, not TF's inter-op pool.
    pub fn run(
        &self,
        key: RunKey,
        run_options: &[u8],
        feeds: &[Feed],
        fetches: &[Port],
        targets: &[Operation],
    ) -> Result<tf::RunOutput> {
        self.usable()?;
        let profile = self.profile(key);
        let inline = profile.runs > 0 && profile.mean_ns < self.inline_below_ns;
        // Trace a few runs of each signature to measure their memory: the last
        // warm-up run (the first one allocates one-time state) and a few later.
        let client_traces = wire::has_field(run_options, TRACE_LEVEL_FIELD)?;
        let trace_turn = if client_traces {
            SampleTurn::exclusive()
        } else {
            SampleTurn::try_take(
                self.measure_memory
                    && sample_due(profile.runs, self.sample_pending.load(Ordering::Relaxed)),
            )
        };
        self.sample_pending
            .store(trace_turn.left_pending(), Ordering::Relaxed);
        // A sample reads the device allocator's peak where it keeps one (a GPU,
        // TensorFlow's CPU allocator), else the run's allocation records.
        let sampling = trace_turn.sampling();
        let allocator = if sampling { self.device_allocator() } else { None };
        // On the host the run's records count too (see memory_profile::Sample).
        let trace = sampling && allocator.is_none_or(|a| a.on_host());
        let mut options = if inline {
            Cow::Owned(on_caller_thread(run_options)?)
        } else {
            Cow::Borrowed(run_options)
        };
        if trace {
            let mut traced = options.into_owned();
            wire::write_varint(&mut traced, TRACE_LEVEL_FIELD << 3);
            wire::write_varint(&mut traced, FULL_TRACE);
            options = Cow::Owned(traced);
        }
        let inputs: Vec<_> = feeds.iter().map(|f| (f.port.tf(), &f.tensor)).collect();
        let outputs: Vec<_> = fetches.iter().map(|p| p.tf()).collect();
        let started = Instant::now();
        let run = || {
            self.session.run(
                &options,
                trace || !run_options.is_empty(),
                &inputs,
                &outputs,
                targets,
            )
        };
        let (mut result, sample) = memory_profile::measure(allocator, false, run);
        let elapsed = started.elapsed().as_nanos() as f64;
        self.learn_memory(&mut result, sample, trace, sampling, run_options, feeds);
        lock(&self.run_profiles)
            .entry(key)
            .or_default()
            .record(elapsed);
        self.count(&result);
        Ok(result?)
    }

    /// What a run teaches of the job's memory: a sampled run's need (a traced
    /// run's records read, and dropped when the client asked for no
    /// metadata), or after an out-of-memory error a raised estimate.
    fn learn_memory(
        &self,
        result: &mut std::result::Result<tf::RunOutput, tf::TfError>,
        mut sample: memory_profile::Sample,
        trace: bool,
        sampling: bool,
        run_options: &[u8],
        feeds: &[Feed],
    ) {
        if let Ok(out) = result {
            if trace {
                match memory_profile::step_memory(&out.metadata) {
                    Ok(memory) => sample.host = Some((memory.peak(), MemoryMeter::Trace)),
                    Err(err) => {
                        tracing::warn!(job = self.id.0, cause = %err, "unreadable step stats")
                    }
                }
                if run_options.is_empty() {
                    // The client did not ask for metadata.
                    out.metadata.clear();
                }
            }
        }
        if sampling && result.is_ok() {
            // The fed tensors are the server's, outside every meter, on the
            // host; a GPU's allocator holds their copies already.
            let fed = if sample.on_host {
                feeds.iter().map(|f| f.tensor.byte_size()).sum()
            } else {
                0
            };
            self.memory.record_sample(&sample, fed);
        }
        if let Err(err) = &*result {
            if err.code == salus_proto::tensorflow::error::Code::ResourceExhausted as i32 {
                // Out of memory: raise the estimate for the next admission.
                self.memory.raise_after_out_of_memory(self.id, "iteration");
            }
        }
    }

    /// Counts a finished run: per job, and a failure by its code server-wide.
    fn count<T>(&self, result: &std::result::Result<T, tf::TfError>) {
        match result {
            Ok(_) => self.stats.runs_completed.fetch_add(1, Ordering::Relaxed),
            Err(err) => {
                run_errors::record(TfCode::try_from(err.code).unwrap_or(TfCode::Unknown));
                self.stats.runs_failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// MakeCallable: resolves the callable's names now so RunCallable is cheap.
    pub fn make_callable(&self, options: &CallableOptions) -> Result<i64> {
        self.usable()?;
        if !options.tensor_connection.is_empty() {
            return Err(Error::Unimplemented(
                "CallableOptions.tensor_connection is not supported by Salus; feed the tensor instead".into(),
            ));
        }
        let callable = Callable {
            names: options
                .fetch
                .iter()
                .chain(&options.target)
                .cloned()
                .collect(),
            feeds: options
                .feed
                .iter()
                .map(|n| Ok((n.clone(), self.port(n, "feed")?)))
                .collect::<Result<_>>()?,
            fetches: options
                .fetch
                .iter()
                .map(|n| self.port(n, "fetch"))
                .collect::<Result<_>>()?,
            targets: options
                .target
                .iter()
                .map(|n| self.target(n))
                .collect::<Result<_>>()?,
            run_options: options.run_options.clone(),
        };
        let mut callables = lock(&self.callables);
        has_room(callables.len(), MAX_CALLABLES, "callables", "release some (ReleaseCallable)")?;
        let handle = self.next_callable.fetch_add(1, Ordering::Relaxed);
        callables.insert(handle, Arc::new(callable));
        Ok(handle)
    }

    /// RunCallable: feeds are positional, in the callable's feed order.
    pub fn run_callable(&self, handle: i64, feeds: &[TensorProto]) -> Result<tf::RunOutput> {
        self.usable()?;
        let callable =
            lock(&self.callables)
                .get(&handle)
                .cloned()
                .ok_or_else(|| Error::CallableNotFound {
                    session: self.handle.clone(),
                    handle,
                })?;
        if feeds.len() != callable.feeds.len() {
            return Err(Error::InvalidArgument(format!(
                "callable {handle} expects {} feeds, the request carries {}",
                callable.feeds.len(),
                feeds.len()
            )));
        }
        let feeds = callable
            .feeds
            .iter()
            .zip(feeds)
            .map(|((name, port), proto)| {
                let tensor = Tensor::from_proto(proto, self.max_tensor_bytes)
                    .map_err(|e| Error::tensor(name, e))?;
                Ok(Feed {
                    name: name.clone(),
                    port: *port,
                    tensor,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.run(
            RunKey::of_callable(handle),
            &callable.run_options,
            &feeds,
            &callable.fetches,
            &callable.targets,
        )
    }

    pub fn release_callable(&self, handle: i64) -> Result<()> {
        lock(&self.callables)
            .remove(&handle)
            .map(drop)
            .ok_or_else(|| Error::CallableNotFound {
                session: self.handle.clone(),
                handle,
            })
    }

    /// PartialRunSetup: returns the handle later RunSteps name.
    pub fn partial_run_setup(
        &self,
        feeds: &[String],
        fetches: &[String],
        targets: &[String],
    ) -> Result<String> {
        self.usable()?;
        let inputs: Vec<_> = feeds
            .iter()
            .map(|n| Ok(self.port(n, "feed")?.tf()))
            .collect::<Result<_>>()?;
        let outputs: Vec<_> = fetches
            .iter()
            .map(|n| Ok(self.port(n, "fetch")?.tf()))
            .collect::<Result<_>>()?;
        let target_ops: Vec<_> = targets
            .iter()
            .map(|n| self.target(n))
            .collect::<Result<_>>()?;
        let unfinished = "partial runs set up and not finished";
        let finish = "finish some (fetch every output they declared)";
        has_room(lock(&self.partial_runs).len(), MAX_PARTIAL_RUNS, unfinished, finish)?;
        let handle = self
            .session
            .partial_run_setup(&inputs, &outputs, &target_ops)?;
        let ours = format!(
            "{}-prun-{}",
            self.handle,
            self.next_partial_run.fetch_add(1, Ordering::Relaxed)
        );
        let run = PartialRun {
            handle,
            pending_fetches: fetches.iter().cloned().collect(),
            pending_targets: targets.iter().cloned().collect(),
        };
        let mut runs = lock(&self.partial_runs);
        has_room(runs.len(), MAX_PARTIAL_RUNS, unfinished, finish)?;
        runs.insert(ours.clone(), run);
        Ok(ours)
    }

    /// One step of a partial run. The run is forgotten once it has produced every
    /// declared fetch and target, or failed.
    pub fn partial_run(
        &self,
        handle: &str,
        feeds: &[Feed],
        fetch_names: &[String],
        target_names: &[String],
    ) -> Result<Vec<Tensor>> {
        self.usable()?;
        let fetches: Vec<_> = fetch_names
            .iter()
            .map(|n| Ok(self.port(n, "fetch")?.tf()))
            .collect::<Result<_>>()?;
        let targets: Vec<_> = target_names
            .iter()
            .map(|n| self.target(n))
            .collect::<Result<_>>()?;
        let inputs: Vec<_> = feeds.iter().map(|f| (f.port.tf(), &f.tensor)).collect();
        // The map lock is held through the step: steps of one partial run are
        // sequential by definition, and TF rejects concurrent ones anyway.
        let mut runs = lock(&self.partial_runs);
        let run = runs
            .get_mut(handle)
            .ok_or_else(|| Error::PartialRunNotFound(handle.to_string()))?;
        let result = self
            .session
            .partial_run(&run.handle, &inputs, &fetches, &targets);
        self.count(&result);
        match &result {
            Ok(_) => {
                for name in fetch_names {
                    run.pending_fetches.remove(name);
                }
                for name in target_names {
                    run.pending_targets.remove(name);
                }
                if run.pending_fetches.is_empty() && run.pending_targets.is_empty() {
                    runs.remove(handle);
                }
            }
            Err(_) => drop(runs.remove(handle)),
        }
        Ok(result?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_thread_option_is_added_unless_the_client_chose_a_pool() {
        let added = on_caller_thread(&[]).unwrap();
        assert_eq!(
            added,
            [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        // trace_level = FULL_TRACE (field 1) is kept, the pool appended.
        assert_eq!(on_caller_thread(&[0x08, 0x03]).unwrap()[..2], [0x08, 0x03]);
        assert!(wire::has_field(&on_caller_thread(&[0x08, 0x03]).unwrap(), 3).unwrap());
        // A client's own pool choice wins.
        assert_eq!(on_caller_thread(&[0x18, 0x01]).unwrap(), [0x18, 0x01]);
        assert!(on_caller_thread(&[0x18]).is_err());
    }

    #[test]
    fn a_session_holds_a_bounded_number_of_callables_and_partial_runs() {
        assert!(has_room(MAX_CALLABLES - 1, MAX_CALLABLES, "callables", "release some").is_ok());
        let err = has_room(MAX_CALLABLES, MAX_CALLABLES, "callables", "release some").unwrap_err();
        assert!(
            matches!(&err, Error::ResourceExhausted(m) if m.contains("10000 callables (at most 10000)")),
            "{err:?}"
        );
        assert_eq!(tonic::Status::from(err).code(), tonic::Code::ResourceExhausted);
        assert!(has_room(MAX_PARTIAL_RUNS, MAX_PARTIAL_RUNS, "partial runs", "finish some").is_err());
    }

    #[test]
    fn run_profiles_track_a_weighted_mean() {
        let mut p = RunProfile::default();
        p.record(100.0);
        assert_eq!((p.runs, p.mean_ns), (1, 100.0));
        p.record(200.0);
        assert_eq!((p.runs, p.mean_ns), (2, 120.0));
        let a = RunKey::of_step(&["x:0"], &["y:0".into()], &[]);
        assert_eq!(a, RunKey::of_step(&["x:0"], &["y:0".into()], &[]));
        assert_ne!(a, RunKey::of_step(&[], &["x:0".into(), "y:0".into()], &[]));
        assert_ne!(RunKey::of_callable(0), RunKey::of_callable(1));
    }

    #[test]
    fn recognises_the_main_iteration_marker() {
        for name in [
            "salus_main_iter",
            "salus_main_iter:0",
            "^salus_main_iter",
            "train/salus_main_iter:0",
        ] {
            assert!(is_marker(name), "{name}");
        }
        for name in ["salus_main_iteration", "x:0", "my_salus_main_iter", ""] {
            assert!(!is_marker(name), "{name}");
        }
    }
}
